/*
 * ctl_app: the controller's top-level object, shared by the HTTP handler
 * modules. Each module reads what it needs; main.c owns and frees it.
 */
#ifndef CTL_APP_H
#define CTL_APP_H

#include <stdint.h>

#include "ctl_http.h"
#include "ctl_limits.h"
#include "ctl_metrics.h"
#include "ctl_pool.h"
#include "ctl_sched.h"
#include "ctl_store.h"
#include "ctl_transport.h"
#include "ctl_vm.h"
#include "wk_chat_tpl.h"
#include "wk_tok.h"

/* Chat sessions with a turn in progress (ctl_chat.h). */
typedef struct ctl_chat_active ctl_chat_active;
/* Progress of worker drains (ctl_migrate.c). */
typedef struct ctl_migrate_drains ctl_migrate_drains;

typedef struct ctl_app {
    ctl_pool *pool;            /* worker registry */
    ctl_metrics *metrics;      /* Prometheus registry */
    ctl_http *http;            /* HTTP server */
    ctl_resid_dir *resid;      /* slot residence: every worker's slot table */
    ctl_sched *sched;          /* admission and batching */
    ctl_store *store;          /* LMDB records and blobs */
    ctl_vm *vm;                /* hot cache of state bytes in slots */
    struct ctl_ckpt *ckpt;     /* checkpoints and the prefix index, NULL = off */
    wk_tok *tok;               /* the model's tokenizer, NULL without a model */
    wk_chat_tpl *chat_tpl;     /* the model's own chat template, NULL: the World template */
    const char *model_id;      /* served model name, NULL without a model */
    uint32_t default_max_tokens; /* chat default when max_tokens is absent */
    uint32_t max_tokens_limit; /* largest max_tokens accepted */
    uint32_t max_prompt_tokens; /* largest prompt accepted, in tokens */
    uint64_t request_timeout_ms; /* per-request deadline */
    uint32_t expected_workers; /* /ready needs this many ready workers */
    const char *model_dir;     /* model served, NULL = none (borrowed from config) */
    const char *data_dir;      /* data directory (borrowed from config) */
    uint64_t start_ms;         /* wall-clock start, ms */
    ctl_limits *limits;        /* per-user concurrent generation requests */
    uint32_t max_messages;     /* most chat messages in one request */
    uint64_t max_message_bytes; /* most content bytes in one chat message */
    uint32_t max_stop_bytes;   /* longest stop string, bytes */
    uint64_t max_states_per_user; /* most state versions one user may store, 0 = no limit */
    uint64_t responses_ttl_s;  /* --responses-ttl: seconds a stored response lives, 0 = forever */
    uint64_t max_responses_per_user; /* --max-responses-per-user, 0 = no limit */
    ctl_transport_opts migrate; /* migration transport: NCCL between hosts, deadlines */
    ctl_chat_active *chat_active; /* sessions with a turn running (ctl_chat_active_new) */
    ctl_migrate_drains *drains;   /* worker drains, running and finished (ctl_migrate_drains_new) */
    const ctl_http_route *routes; /* every route served (GET /admin lists them), main.c's */
    size_t n_routes;              /* entries in routes */
} ctl_app;

/*
 * Takes one unit of the request user's concurrent-request budget (ctl_limits);
 * on refusal sends 429 quota_exceeded and returns false. After true, the
 * caller must call ctl_app_user_leave() once it has answered.
 */
bool ctl_app_user_enter(ctl_http_req *req, ctl_app *app);

/* Gives back the unit taken by ctl_app_user_enter(). */
void ctl_app_user_leave(ctl_http_req *req, ctl_app *app);

/* Routes of the ops/admin module (health, ready, metrics, admin/workers). */
size_t ctl_admin_routes(ctl_app *app, ctl_http_route *out, size_t cap);

/* Declares the metric families the controller exports. */
WK_MUST_CHECK wk_err ctl_admin_metrics_declare(ctl_metrics *m);

/* Routes of the OpenAI module (/v1/models, /v1/chat/completions, /v1/completions). */
size_t ctl_openai_routes(ctl_app *app, ctl_http_route *out, size_t cap);

/* Routes of the Responses API (/v1/responses...) and /admin/responses: ctl_responses.h. */

/* Routes of the Durable State API (/v1/states...) and /admin/states. */
size_t ctl_states_routes(ctl_app *app, ctl_http_route *out, size_t cap);

/*
 * The drain records of one controller (POST /admin/workers/{id}/drain and its
 * GET): created before the HTTP server starts, freed after it stopped.
 * Thread-safe. ctl_migrate_drains_new() returns WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_migrate_drains_new(ctl_migrate_drains **out);
void ctl_migrate_drains_free(ctl_migrate_drains *dr); /* NULL-safe */

/* Routes of live migration and the slot admin API. */
size_t ctl_migrate_routes(ctl_app *app, ctl_http_route *out, size_t cap);
WK_MUST_CHECK wk_err ctl_migrate_metrics_declare(ctl_metrics *m);

/* Declares the OpenAI module's metric families. */
WK_MUST_CHECK wk_err ctl_openai_metrics_declare(ctl_metrics *m);

/* HTTP observer that counts requests and latency per route. */
void ctl_admin_http_observe(const char *route, const char *method, int status, double seconds,
                            void *arg);

#endif /* CTL_APP_H */
