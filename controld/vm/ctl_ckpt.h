/*
 * ctl_ckpt: automatic state checkpoints and the per-owner prefix index
 * (docs/OPERATIONS.md, "Reuse"). Every request leaves exact checkpoints (the state
 * just before its prompt's last token, at chat message boundaries, every
 * --checkpoint-interval prefill tokens, and at the end of its reply); a new
 * request resumes the longest checkpoint whose tokens are a prefix of its
 * prompt and prefills only the rest, which is bit-identical to computing the
 * whole prompt because chunked prefill is exact.
 *
 * A checkpoint is a state: token ids, owner, model fingerprint, bytes. It is
 * keyed by SHA-256 over (fingerprint, owner, ids), so owners never share one
 * and a checkpoint never loads into another model. Where it lives:
 *   warm  a copy in a worker's host memory (HOST_PUT from the running slot,
 *         a memcpy between two steps), bounded per worker by warm_bytes;
 *   disk  a state record of the reserved owner "__ckpt" (content-addressed
 *         blob + LMDB), bounded by disk_bytes, so a controller restart keeps it.
 *         On a hybrid (an image is a fixed part plus KV per token), a
 *         checkpoint left by a request that loaded one already on disk is
 *         written as a KV tail of that record (the fixed part and the KV past
 *         it): the loaded checkpoint's rows are its bytes, so the chain
 *         (at most 16 records) reads back the very image; a record that
 *         tails take rows from is not evicted while they do.
 * A checkpoint never occupies a slot: slots are for running requests and
 * parked sessions, so checkpoints never compete with admission. Over its
 * budget the warm tier moves its least recently used entries to disk (a
 * background thread: no disk I/O on a step loop), and the disk tier deletes
 * its least recently used ones; an entry in use (pinned by a lookup) goes
 * last. Every removal by a budget is counted
 * (wkvm_state_cache_evictions_total{tier}); nothing else removes an entry
 * but a clear or a changed model.
 *
 * Reply records: the end-of-reply checkpoint of a chat turn also carries a
 * reply key, SHA-256 of (fingerprint, owner, the chat rendered up to and
 * including that reply as the client shows it). A follow-up that renders the
 * same history finds the exact tokens the state consumed (whatever their
 * bytes were) and continues after them (ctl_ckpt_reply_tokens()).
 *
 * Threading: all functions are thread-safe; one mutex guards the index and
 * is never held across an RPC or disk I/O. The load and checkpoint hooks of
 * a plan run on a scheduler step loop (ctl_sched_reuse).
 */
#ifndef CTL_CKPT_H
#define CTL_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctl_metrics.h"
#include "ctl_pool.h"
#include "ctl_sched.h"
#include "ctl_store.h"
#include "ctl_vm.h"
#include "wk_err.h"
#include "wk_sha256.h"

#define CTL_CKPT_OWNER "__ckpt"          /* store owner of disk-tier checkpoints */
#define CTL_CKPT_MAX_ENTRIES_DEFAULT 65536u /* entries in the index, all tiers */
#define CTL_CKPT_MAX_BOUNDS 64u           /* message-boundary checkpoints of one request */

typedef struct ctl_ckpt ctl_ckpt;

typedef struct ctl_ckpt_config {
    bool enabled;          /* --prefix-cache on: look up and leave checkpoints */
    uint64_t warm_bytes;   /* --state-cache-bytes: warm budget per worker, 0 = no warm tier */
    uint64_t disk_bytes;   /* --state-cache-disk-bytes: disk budget, 0 = no disk tier */
    uint32_t interval;     /* --checkpoint-interval: prefill checkpoints every K tokens, 0 = off */
    uint32_t max_entries;  /* entries in the index (0 = CTL_CKPT_MAX_ENTRIES_DEFAULT) */
    bool write_through;    /* --checkpoint-write-through: every end-of-reply checkpoint
                              also goes to disk (in the background), so a session
                              outlives its worker's memory */
    uint32_t flush_ms;     /* --checkpoint-flush-ms: the shutdown's budget for writing warm
                              checkpoints to disk, 0 = write none */
    bool step_cuts;        /* --checkpoint-step-cuts: prefill checkpoints end their step's
                              chunk and are copied between steps (HOST_PUT), not by the
                              worker inside the step (StepRow.snaps) */
} ctl_ckpt_config;

typedef enum ctl_ckpt_kind {
    CTL_CKPT_KIND_PROMPT = 0, /* a prompt but its last token */
    CTL_CKPT_KIND_BOUNDARY,   /* a chat message boundary */
    CTL_CKPT_KIND_INTERVAL,   /* every --checkpoint-interval prefill tokens */
    CTL_CKPT_KIND_REPLY,      /* the end of a reply */
    CTL_CKPT_KIND__COUNT
} ctl_ckpt_kind;

/* How a request reused a state, for wkvm_reuse_hits_total{kind}. */
typedef enum ctl_ckpt_hit {
    CTL_CKPT_HIT_PARENT_BOUND = 0, /* parent-token-v1 continued its parked session */
    CTL_CKPT_HIT_PREFIX,           /* the index found a checkpoint that prefixes the prompt */
    CTL_CKPT_HIT_CHECKPOINT,       /* the prompt continues a reply's exact tokens (reply record) */
    CTL_CKPT_HIT_REGENERATE,       /* an exact repeat: all but the prompt's last token reused */
    CTL_CKPT_HIT__COUNT
} ctl_ckpt_hit;

/*
 * Starts the index (and its tier thread) over the borrowed modules, and reads
 * the disk tier's records back from store. metrics may be NULL. On success
 * *out is freed with ctl_ckpt_free(). WK_ENOMEM, WK_EIO.
 */
WK_MUST_CHECK wk_err ctl_ckpt_new(const ctl_ckpt_config *cfg, ctl_pool *pool, ctl_sched *sched,
                                  ctl_vm *vm, ctl_store *store, ctl_metrics *metrics,
                                  ctl_ckpt **out, wk_diag *d);

/* Stops the tier thread and frees the index (warm copies stay with workers). NULL-safe. */
void ctl_ckpt_free(ctl_ckpt *c);

/*
 * Shutdown: moves warm entries to disk, most recently used first, as far as
 * the disk budget and cfg.flush_ms allow, so a restarted controller finds
 * them. Logs its progress about every 5 s and, at the end, how many were
 * written and how many were not (and why: the time budget, the disk budget
 * or an error). Caller: main, after the HTTP server stopped.
 */
void ctl_ckpt_flush(ctl_ckpt *c);

/* Declares the metric families of this module. */
WK_MUST_CHECK wk_err ctl_ckpt_metrics_declare(ctl_metrics *m);

/* The configuration in force (copied at new). NULL c: a disabled one. */
ctl_ckpt_config ctl_ckpt_get_config(const ctl_ckpt *c);

/* Counts one reuse of kind and the tokens it saved. */
void ctl_ckpt_count_hit(ctl_ckpt *c, ctl_ckpt_hit kind, size_t tokens);

/*
 * The reply key of a chat history: SHA-256 (hex) of the domain tag, fp,
 * owner and the len bytes of rendered (the messages rendered with the chat
 * template, no generation prompt, the last one being the reply).
 */
void ctl_ckpt_reply_key(const char *fp, const char *owner, const char *rendered, size_t len,
                        char out[WK_SHA256_HEX_LEN]);

/*
 * The tokens a reply's end-of-reply checkpoint covers (prompt + the reply's
 * tokens as the state consumed them), for reply key: *ids is a malloc'd copy
 * of *n ids (caller frees). False when no such reply is known.
 */
bool ctl_ckpt_reply_tokens(ctl_ckpt *c, const char *reply_key, int32_t **ids, size_t *n);

/*
 * One request's reuse plan. Fill it with ctl_ckpt_plan_begin(), pass
 * &plan->reuse in the job spec (and plan->worker as its preferred worker),
 * then ctl_ckpt_plan_reply() after the generation and always
 * ctl_ckpt_plan_end(). The plan must stay where it is until the job is freed.
 */
typedef struct ctl_ckpt_plan {
    ctl_ckpt *c;                      /* owner module, NULL: an empty plan */
    char owner[CTL_STORE_OWNER_MAX + 1]; /* whose checkpoints */
    char fp[WK_SHA256_HEX_LEN];       /* model fingerprint */
    int32_t *all;                     /* prefix + input, owned */
    size_t n_all;                     /* entries */
    size_t base;                      /* tokens of all already in the held slot (prefix) */
    size_t hit_len;                   /* tokens of all the resumed checkpoint covers, 0 = none */
    char hit_key[WK_SHA256_HEX_LEN];  /* its key (pinned until end), "" = none */
    uint64_t hit_id;                  /* the entry the load hook loaded (its index id), 0 =
                                         none: what the plan's checkpoints share KV rows with */
    char worker[65];                  /* where it is warm, "" = anywhere */
    size_t pos[CTL_SCHED_CKPT_MAX];   /* checkpoint positions, job-relative */
    uint8_t kind[CTL_SCHED_CKPT_MAX]; /* their kinds */
    size_t n_pos;                     /* entries */
    ctl_sched_reuse reuse;            /* the job's hooks (arg = this plan) */
    bool loaded;                      /* the load hook succeeded */
    char reply_ckpt[WK_SHA256_HEX_LEN]; /* key of the end-of-reply checkpoint (set by
                                         ctl_ckpt_plan_reply(), live or not: ctl_ckpt_live()) */
    bool durable;                     /* set by the caller before ctl_ckpt_plan_reply(): the
                                         end-of-reply checkpoint is written through to disk
                                         whatever --checkpoint-write-through says (a stored
                                         response's state) */
} ctl_ckpt_plan;

/*
 * Plans a request for owner under model fp (both borrowed for the call).
 * prefix (n_prefix): tokens already in the slot the job runs on (a held,
 * parked state), else 0 and the job runs on a fresh slot. input (n_input >=
 * 1): the job's input. bounds: positions in input (n_bounds, any order;
 * ones out of range are ignored) where a chat message ends. lookup: resume
 * the longest checkpoint (only without prefix). Checkpoints are planned at
 * the bounds, every interval tokens, and before the input's last token,
 * where none exists yet. With the module disabled or c NULL, the plan is
 * empty (no hooks). WK_OK; WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_ckpt_plan_begin(ctl_ckpt *c, ctl_ckpt_plan *p, const char *owner,
                                         const char *fp, const int32_t *prefix, size_t n_prefix,
                                         const int32_t *input, size_t n_input,
                                         const size_t *bounds, size_t n_bounds, bool lookup,
                                         wk_diag *d);

/*
 * After the generation: leaves the end-of-reply checkpoint from slot (held
 * by the caller, which still frees or parks it), covering all + gen (the n_gen
 * sampled ids the state consumed). reply_key (or NULL) makes it a reply
 * record. No-op for an empty plan.
 */
void ctl_ckpt_plan_reply(ctl_ckpt_plan *p, const ctl_slot_ref *slot, const int32_t *gen,
                         size_t n_gen, const char *reply_key);

/*
 * True when checkpoint key exists and can be loaded (a live warm copy or a
 * disk record). A parked session backed by its end-of-reply checkpoint
 * (ctl_vm_put_backed) gives its slot up without a spill while this holds:
 * ctl_ckpt_new() registers it with ctl_vm (ctl_vm_set_backing).
 */
bool ctl_ckpt_live(ctl_ckpt *c, const char *key);

/* Releases what the plan holds. NULL-safe, idempotent. */
void ctl_ckpt_plan_end(ctl_ckpt_plan *p);

/* One owner's checkpoints in a ctl_ckpt_stats. */
typedef struct ctl_ckpt_owner_stats {
    char owner[CTL_STORE_OWNER_MAX + 1]; /* the owner */
    uint64_t entries;                    /* checkpoints */
    uint64_t warm;                       /* of them with a warm copy */
    uint64_t disk;                       /* of them on disk */
    uint64_t bytes;                      /* their state bytes */
    uint64_t tokens;                     /* tokens they cover */
} ctl_ckpt_owner_stats;

/* What GET /admin/cache reports. */
typedef struct ctl_ckpt_stats {
    ctl_ckpt_config config;        /* the configuration */
    uint64_t entries;              /* checkpoints counted (the owner's, or all) */
    uint64_t warm_bytes;           /* bytes with a warm copy */
    uint64_t warm_entries;         /* entries with a warm copy */
    uint64_t warm_evictions;       /* removals by the warm budget (all owners) */
    uint64_t disk_bytes;           /* bytes on disk */
    uint64_t disk_entries;         /* entries on disk */
    uint64_t disk_evictions;       /* removals by the disk budget (all owners) */
    uint64_t lookups;              /* prefix lookups (all owners) */
    uint64_t hits;                 /* of them that found a checkpoint */
    ctl_ckpt_owner_stats *owners;  /* per owner, in index order; owned, ctl_ckpt_stats_fini() */
    size_t n_owners;               /* entries in owners */
} ctl_ckpt_stats;

/*
 * The cache for GET /admin/cache: budgets, bytes and entries per tier,
 * per-owner entries, lookups and hits. owner NULL: all owners; c NULL: the
 * zero configuration and no entries. Entries being saved or cleared are not
 * counted. *out is written on WK_OK only; the caller releases it with
 * ctl_ckpt_stats_fini(). Returns WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_ckpt_stats_get(ctl_ckpt *c, const char *owner, ctl_ckpt_stats *out);

/* Frees what s owns; NULL-safe, and safe on a zeroed s. */
void ctl_ckpt_stats_fini(ctl_ckpt_stats *s);

/*
 * Drops every checkpoint of owner (NULL: all) from every tier. *n (optional)
 * receives how many. Entries in use are dropped when released.
 */
void ctl_ckpt_clear(ctl_ckpt *c, const char *owner, size_t *n);

/* Runs one pass of the tier thread now (tests, shutdown). */
void ctl_ckpt_maintain(ctl_ckpt *c);

#endif /* CTL_CKPT_H */
