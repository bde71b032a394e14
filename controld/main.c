/*
 * wkvm-controld: the GPU-free control daemon. Parses its config table,
 * starts the worker pool (NNG) and the HTTP server (civetweb), then waits
 * for SIGTERM/SIGINT and shuts down in reverse order. It never links CUDA.
 */
#define WK_LOG_MODULE "controld"
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctl_app.h"
#include "ctl_auth.h"
#include "ctl_chat.h"
#include "ctl_ckpt.h"
#include "ctl_openai.h"
#include "ctl_responses.h"
#include "wk_cfg.h"
#include "wk_file.h"
#include "wk_log.h"
#include "wk_net.h"

static const wk_cfg_opt ctl_opts[] = {
    {"host", WK_CFG_STR, "127.0.0.1", 0, 0,
     "HTTP bind address; anything but loopback needs --api-keys"},
    {"port", WK_CFG_U64, "8000", 1, 65535, "HTTP port"},
    {"data-dir", WK_CFG_STR, NULL, 0, 0, "data directory (default ~/.local/share/wkvm)"},
    /* The controller <-> worker link: the same --link-* names on both daemons. */
    {"link-url", WK_CFG_STR, NULL, 0, 0,
     "the link's NNG URL, which workers dial (default ipc://DATA/controller.ipc; across "
     "hosts tls+tcp://HOST:PORT with --link-tls-*)"},
    {"link-tls-ca", WK_CFG_STR, NULL, 0, 0,
     "tls+tcp:// link: CA certificate file (PEM); only workers whose certificate "
     "chains to it are accepted"},
    {"link-tls-cert", WK_CFG_STR, NULL, 0, 0,
     "tls+tcp:// link: the controller's certificate file (PEM)"},
    {"link-tls-key", WK_CFG_STR, NULL, 0, 0,
     "tls+tcp:// link: the controller's private key file (PEM)"},
    {"link-allow-plain-tcp", WK_CFG_BOOL, "false", 0, 0,
     "force a plain tcp:// --link-url on a non-loopback address (no encryption, no "
     "authentication: prompts and states in clear; use tls+tcp:// instead)"},
    {"worker-url", WK_CFG_ALIAS, "link-url", 0, 0, "older name"},
    {"worker-tls-ca", WK_CFG_ALIAS, "link-tls-ca", 0, 0, "older name"},
    {"worker-tls-cert", WK_CFG_ALIAS, "link-tls-cert", 0, 0, "older name"},
    {"worker-tls-key", WK_CFG_ALIAS, "link-tls-key", 0, 0, "older name"},
    {"allow-remote-workers", WK_CFG_ALIAS, "link-allow-plain-tcp", 0, 0, "older name"},
    {"model", WK_CFG_STR, NULL, 0, 0,
     "model directory or checkpoint file (.gguf, .pth, .safetensors) every worker loads "
     "(none: empty workers)"},
    {"slots", WK_CFG_U64, "16", 1, 65535, "state slots per worker (slot 0 is reserved extra)"},
    {"workers", WK_CFG_U64, "1", 0, 1024, "workers that must be ready before /ready says 200"},
    {"api-keys", WK_CFG_STR, NULL, 0, 0, "file of 'KEY USER [admin]' lines"},
    {"http-threads", WK_CFG_U64, "32", 2, 1024, "HTTP request threads"},
    {"sse-loops", WK_CFG_U64, "0", 0, 256,
     "event-loop threads that write streamed replies (0: one per core available)"},
    {"sse-flush-ms", WK_CFG_U64, "2", 0, 1000,
     "a streamed reply's events are held up to this long to go out in one write (its first "
     "token and its end at once; 0: every step's events at once)"},
    {"max-body", WK_CFG_U64, "16777216", 1024, 1073741824, "largest request body in bytes"},
    {"max-header-bytes", WK_CFG_U64, "16384", 1024, 1048576,
     "largest request line + headers in bytes (larger: a 4xx JSON error, connection closed)"},
    {"http-timeout-ms", WK_CFG_U64, "60000", 1000, 86400000,
     "HTTP socket timeout: reading a request's headers, one body read or response write"},
    {"max-messages", WK_CFG_U64, "4096", 1, 1000000, "most chat messages in one request"},
    {"max-message-bytes", WK_CFG_U64, "4194304", 1, 1073741824,
     "most content bytes in one chat message"},
    {"max-stop-bytes", WK_CFG_U64, "256", 1, 65536, "longest stop string in bytes"},
    {"max-states-per-user", WK_CFG_U64, "10000", 0, 1000000000,
     "most state versions one user may store (0: no limit; over: 429 quota_exceeded)"},
    {"responses-ttl", WK_CFG_U64, "2592000", 0, 3153600000,
     "seconds a stored response (POST /v1/responses, store: true) and its state are kept "
     "(0 = until deleted); expired ones answer 404 and are counted as evictions"},
    {"max-responses-per-user", WK_CFG_U64, "10000", 0, 1000000000,
     "most stored responses one user may keep (0: no limit; over: 429 quota_exceeded)"},
    {"max-concurrent-per-user", WK_CFG_U64, "64", 0, 1000000,
     "generation requests one API user may run at once (0: no limit; over: 429 "
     "quota_exceeded; without --api-keys only when set explicitly)"},
    {"served-model-name", WK_CFG_STR, NULL, 0, 0, "model id in the API (default: model dir name)"},
    {"vocab", WK_CFG_STR, NULL, 0, 0,
     "tokenizer: a .json is HF tokenizer.json, else World vocab (default MODEL/tokenizer.json, "
     "else MODEL/rwkv_vocab_v20230424.txt)"},
    {"chat-template", WK_CFG_STR, NULL, 0, 0,
     "chat template file (Jinja) used instead of the model's own (default: MODEL's "
     "chat_template.jinja, tokenizer_config.json chat_template or GGUF template; none: the "
     "plain User:/Assistant: template)"},
    {"step-tokens", WK_CFG_U64, "512", 1, 65536, "token budget of one step per worker"},
    {"prefill-chunk", WK_CFG_U64, "256", 1, 16384,
     "most prefill tokens of one request per step (one whose input left fits the step is fed "
     "whole)"},
    {"max-rows", WK_CFG_U64, "256", 1, 1024, "most rows in one step"},
    {"queue-max", WK_CFG_U64, "1024", 0, 1000000, "requests waiting for a slot before 429"},
    {"slot-wait-ms", WK_CFG_U64, "30000", 0, 3600000,
     "how long a state operation (create, generate, resume) or a spilled session's resume "
     "waits for a slot while every slot runs a request (at most --request-timeout-ms); past "
     "it 503 no_capacity"},
    {"slot-io-timeout-ms", WK_CFG_U64, "60000", 100, 3600000,
     "deadline of one slot transfer request (migration, spill, resume); past it the "
     "operation aborts and the source stays as it was"},
    {"nccl-net", WK_CFG_BOOL, "false", 0, 0,
     "migrate between GPU workers on different hosts with NCCL (its network transport must "
     "reach between them); otherwise such migrations relay bytes over NNG"},
    {"drain-wait-ms", WK_CFG_U64, "2000", 0, 600000,
     "how long a new request that only draining workers could run waits (room for an "
     "undrain) before 503 unavailable (0 = at once)"},
    {"step-timeout-ms", WK_CFG_U64, "120000", 100, 3600000,
     "deadline of one step on a worker; past it the step's requests fail"},
    {"request-timeout-ms", WK_CFG_U64, "600000", 100, 86400000, "deadline of one request"},
    {"max-tokens-default", WK_CFG_U64, "1024", 1, 1048576, "chat max_tokens when absent"},
    {"max-tokens-limit", WK_CFG_U64, "65536", 1, 1048576, "largest max_tokens accepted"},
    {"max-prompt-tokens", WK_CFG_U64, "262144", 1, 16777216, "largest prompt in tokens"},
    {"session-idle-ms", WK_CFG_U64, "600000", 0, 604800000,
     "spill a parked chat session to disk after this idle time (0 = only under pressure)"},
    {"max-hot-sessions", WK_CFG_U64, "0", 0, 1000000,
     "most parked chat sessions kept in slots not spilled; more are spilled to disk, keeping "
     "their slots until one is needed (0 = no cap)"},
    {"prefix-cache", WK_CFG_BOOL, "true", 0, 0,
     "automatic reuse: every request leaves state checkpoints and resumes the longest one "
     "of its owner that prefixes its prompt"},
    {"state-cache-bytes", WK_CFG_U64, "8589934592", 0, UINT64_MAX,
     "warm checkpoint budget per worker, bytes of its host memory; unset: 25% of this host's "
     "RAM capped at the default (the log's prefix cache line says which); 0 = no warm "
     "tier"},
    {"state-cache-disk-bytes", WK_CFG_U64, "8589934592", 0, UINT64_MAX,
     "disk checkpoint budget, bytes in the data dir (0 = no disk tier)"},
    {"checkpoint-interval", WK_CFG_U64, "0", 0, 16777216,
     "also checkpoint long prefills every this many tokens (0 = off)"},
    {"checkpoint-write-through", WK_CFG_BOOL, "false", 0, 0,
     "also write every reply's end-of-reply checkpoint to disk (in the background), so "
     "chat sessions resume after their worker dies (costs a state image of disk writes "
     "per turn)"},
    {"checkpoint-step-cuts", WK_CFG_BOOL, "false", 0, 0,
     "copy prefill checkpoints between steps, each ending its step's chunk (the way before "
     "workers copied them inside a step; for comparison)"},
    {"checkpoint-flush-ms", WK_CFG_U64, "60000", 0, 3600000,
     "at shutdown, write warm checkpoints to disk for at most this long (progress is logged; "
     "what is not written is counted in the log); 0 = write none"},
    {"heartbeat-ms", WK_CFG_U64, "1000", 50, 60000, "worker Stats poll period"},
    {"load-timeout-ms", WK_CFG_U64, "600000", 1000, 86400000, "model load deadline"},
    {"log-level", WK_CFG_STR, "info", 0, 0, "error, warn, info or debug"},
};
#define CTL_NOPTS (sizeof(ctl_opts) / sizeof(ctl_opts[0]))

/*
 * Everything the options fill in: the structs main() hands to the modules
 * and the values it uses itself. ctl_binds names fields by offset in here.
 */
typedef struct ctl_main_conf {
    ctl_app app;                  /* the controller; main() owns it */
    ctl_pool_config pool;         /* for ctl_pool_new() */
    ctl_sched_config sched;       /* for ctl_sched_new() */
    ctl_ckpt_config ckpt;         /* for ctl_ckpt_new() */
    ctl_http_config http;         /* for ctl_http_new() */
    const char *data_dir;         /* --data-dir, NULL: ~/.local/share/wkvm */
    const char *worker_url;       /* --link-url, NULL: ipc://DATA/controller.ipc */
    bool allow_remote_workers;    /* --link-allow-plain-tcp */
    const char *api_keys;         /* --api-keys, NULL: none */
    const char *vocab;            /* --vocab, NULL: the model dir's */
    const char *chat_template;    /* --chat-template, NULL: the model dir's */
    const char *served_model_name; /* --served-model-name, NULL: the model dir's name */
    const char *log_level;        /* --log-level */
    uint32_t max_concurrent_per_user; /* --max-concurrent-per-user */
    uint64_t slot_io_timeout_ms;  /* --slot-io-timeout-ms */
    uint64_t slot_wait_ms;        /* --slot-wait-ms */
    uint64_t session_idle_ms;     /* --session-idle-ms */
    uint32_t max_hot_sessions;    /* --max-hot-sessions */
} ctl_main_conf;

/* Where each option goes (wk_cfg_bind; an option may go to several fields). */
#define CTL_BIND(opt, type, field) WK_CFG_BIND(ctl_main_conf, opt, type, field)
static const wk_cfg_bind ctl_binds[] = {
    CTL_BIND("host", STR, http.host),
    CTL_BIND("port", UINT, http.port),
    CTL_BIND("data-dir", STR, data_dir),
    CTL_BIND("link-url", STR, worker_url),
    CTL_BIND("link-tls-ca", STR, pool.tls_ca),
    CTL_BIND("link-tls-cert", STR, pool.tls_cert),
    CTL_BIND("link-tls-key", STR, pool.tls_key),
    CTL_BIND("link-allow-plain-tcp", BOOL, allow_remote_workers),
    CTL_BIND("model", STR, app.model_dir),
    CTL_BIND("model", STR, pool.model_dir),
    CTL_BIND("slots", U32, pool.slots),
    CTL_BIND("workers", U32, app.expected_workers),
    CTL_BIND("api-keys", STR, api_keys),
    CTL_BIND("http-threads", UINT, http.threads),
    CTL_BIND("sse-loops", UINT, http.sse_loops),
    CTL_BIND("sse-flush-ms", UINT, http.sse_flush_ms),
    CTL_BIND("max-body", SIZE, http.max_body),
    CTL_BIND("max-header-bytes", SIZE, http.max_header),
    CTL_BIND("http-timeout-ms", UINT, http.timeout_ms),
    CTL_BIND("max-messages", U32, app.max_messages),
    CTL_BIND("max-message-bytes", U64, app.max_message_bytes),
    CTL_BIND("max-stop-bytes", U32, app.max_stop_bytes),
    CTL_BIND("max-states-per-user", U64, app.max_states_per_user),
    CTL_BIND("responses-ttl", U64, app.responses_ttl_s),
    CTL_BIND("max-responses-per-user", U64, app.max_responses_per_user),
    CTL_BIND("max-concurrent-per-user", U32, max_concurrent_per_user),
    CTL_BIND("served-model-name", STR, served_model_name),
    CTL_BIND("vocab", STR, vocab),
    CTL_BIND("chat-template", STR, chat_template),
    CTL_BIND("step-tokens", U32, sched.step_tokens),
    CTL_BIND("prefill-chunk", U32, sched.job_chunk),
    CTL_BIND("max-rows", U32, sched.max_rows),
    CTL_BIND("queue-max", U32, sched.queue_max),
    CTL_BIND("slot-io-timeout-ms", U64, slot_io_timeout_ms),
    CTL_BIND("slot-wait-ms", U64, slot_wait_ms),
    CTL_BIND("nccl-net", BOOL, app.migrate.nccl_net),
    CTL_BIND("drain-wait-ms", U32, sched.drain_wait_ms),
    CTL_BIND("step-timeout-ms", U32, sched.step_timeout_ms),
    CTL_BIND("request-timeout-ms", U64, app.request_timeout_ms),
    CTL_BIND("max-tokens-default", U32, app.default_max_tokens),
    CTL_BIND("max-tokens-limit", U32, app.max_tokens_limit),
    CTL_BIND("max-prompt-tokens", U32, app.max_prompt_tokens),
    CTL_BIND("session-idle-ms", U64, session_idle_ms),
    CTL_BIND("max-hot-sessions", U32, max_hot_sessions),
    CTL_BIND("prefix-cache", BOOL, ckpt.enabled),
    CTL_BIND("state-cache-bytes", U64, ckpt.warm_bytes),
    CTL_BIND("state-cache-disk-bytes", U64, ckpt.disk_bytes),
    CTL_BIND("checkpoint-interval", U32, ckpt.interval),
    CTL_BIND("checkpoint-write-through", BOOL, ckpt.write_through),
    CTL_BIND("checkpoint-step-cuts", BOOL, ckpt.step_cuts),
    CTL_BIND("checkpoint-flush-ms", U32, ckpt.flush_ms),
    CTL_BIND("heartbeat-ms", U32, pool.heartbeat_ms),
    CTL_BIND("load-timeout-ms", U32, pool.load_timeout_ms),
    CTL_BIND("log-level", STR, log_level),
};
#undef CTL_BIND
#define CTL_NBINDS (sizeof(ctl_binds) / sizeof(ctl_binds[0]))

static wk_err
ctl_auth_cb(const char *authorization, const char *api_key, const char **user, bool *admin,
            void *arg)
{
    return ctl_auth_check(arg, authorization, api_key, user, admin);
}

static int
ctl_mkdir_p(const char *path)
{
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0700) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    if (mkdir(buf, 0700) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

/*
 * The worker link's address rules (0: fine; else a one-line message has been
 * printed). Plain tcp:// carries prompts and state bytes in clear without
 * authentication: on a non-loopback address (checked by parsing it, names
 * resolved) it needs --link-allow-plain-tcp. tls+tcp:// needs the CA, the
 * certificate and the key; the TLS files make no sense on another scheme.
 */
static int
ctl_main_check_worker_url(const ctl_main_conf *c, const char *url)
{
    wk_net_scheme sc;
    char host[256];
    wk_diag d = {{0}};
    if (wk_net_url_parse(url, &sc, host, sizeof(host), &d) != WK_OK) {
        fprintf(stderr, "wkvm-controld: --link-url %s\n", d.msg);
        return 2;
    }
    const char *tls[3] = {c->pool.tls_ca, c->pool.tls_cert, c->pool.tls_key};
    const bool any_tls = tls[0] != NULL || tls[1] != NULL || tls[2] != NULL;
    if (sc == WK_NET_SCHEME_TLS && (tls[0] == NULL || tls[1] == NULL || tls[2] == NULL)) {
        fprintf(stderr, "wkvm-controld: --link-url %s needs --link-tls-ca, --link-tls-cert "
                        "and --link-tls-key (docs/OPERATIONS.md, \"Workers on other hosts\")\n",
                url);
        return 2;
    }
    if (sc != WK_NET_SCHEME_TLS && any_tls) {
        fprintf(stderr, "wkvm-controld: --link-tls-* need a tls+tcp:// --link-url (got %s)\n",
                url);
        return 2;
    }
    if (sc == WK_NET_SCHEME_TCP && !wk_net_host_is_loopback(host) && !c->allow_remote_workers) {
        fprintf(stderr,
                "wkvm-controld: refusing to listen for workers on %s: plain tcp:// on a "
                "non-loopback address carries prompts and state bytes in clear without "
                "authentication; use tls+tcp:// with --link-tls-ca/-cert/-key, or force it "
                "with --link-allow-plain-tcp (docs/OPERATIONS.md)\n",
                url);
        return 2;
    }
    return 0;
}

int
main(int argc, char **argv)
{
    wk_cfg *cfg = NULL;
    wk_diag d = {{0}};
    /* a programming error: the two tables disagree */
    if (!wk_cfg_binds_valid(ctl_opts, CTL_NOPTS, ctl_binds, CTL_NBINDS)) {
        fprintf(stderr, "wkvm-controld: ctl_binds does not match ctl_opts\n");
        abort();
    }
    if (wk_cfg_parse(ctl_opts, CTL_NOPTS, "WKVM", argc, argv, &cfg, &d) != WK_OK) {
        fprintf(stderr, "wkvm-controld: %s\n", d.msg);
        return 2;
    }
    if (wk_cfg_version_requested(cfg)) {
        printf("%s %s\n", "wkvm-controld", WK_VERSION);
        wk_cfg_free(cfg);
        return 0;
    }
    if (wk_cfg_help_requested(cfg)) {
        wk_cfg_print_help(ctl_opts, CTL_NOPTS, "wkvm-controld",
                          "The wkvm control daemon: HTTP API, sessions, scheduling, storage.",
                          "WKVM", stdout);
        wk_cfg_free(cfg);
        return 0;
    }
    if (wk_cfg_sample_requested(cfg)) {
        wk_cfg_print_sample(ctl_opts, CTL_NOPTS, stdout);
        wk_cfg_free(cfg);
        return 0;
    }
    if (wk_cfg_npos(cfg) > 0) {
        fprintf(stderr, "wkvm-controld: unexpected argument '%s'\n", wk_cfg_pos(cfg, 0));
        wk_cfg_free(cfg);
        return 2;
    }
    ctl_main_conf c = {0};
    ctl_app *app = &c.app;
    wk_cfg_fill(cfg, ctl_binds, CTL_NBINDS, &c);
    if (wk_log_set_level_name(c.log_level) != WK_OK) {
        fprintf(stderr, "wkvm-controld: unknown log level '%s'\n", c.log_level);
        wk_cfg_free(cfg);
        return 2;
    }
    char data_dir[2048];
    if (c.data_dir != NULL) {
        snprintf(data_dir, sizeof(data_dir), "%s", c.data_dir);
    } else {
        const char *home = getenv("HOME");
        snprintf(data_dir, sizeof(data_dir), "%s/.local/share/wkvm", home ? home : ".");
    }
    if (ctl_mkdir_p(data_dir) != 0) {
        fprintf(stderr, "wkvm-controld: cannot create data dir %s: %s\n", data_dir,
                strerror(errno));
        wk_cfg_free(cfg);
        return 1;
    }
    char worker_url[2200];
    if (c.worker_url != NULL)
        snprintf(worker_url, sizeof(worker_url), "%s", c.worker_url);
    else
        snprintf(worker_url, sizeof(worker_url), "ipc://%s/controller.ipc", data_dir);

    if (ctl_main_check_worker_url(&c, worker_url) != 0) {
        wk_cfg_free(cfg);
        return 2;
    }
    const char *host = c.http.host;
    ctl_auth *auth = NULL;
    if (ctl_auth_load(c.api_keys, &auth, &d) != WK_OK) {
        fprintf(stderr, "wkvm-controld: %s\n", d.msg);
        wk_cfg_free(cfg);
        return 2;
    }
    if (!ctl_http_host_is_loopback(host) && !ctl_auth_enabled(auth)) {
        fprintf(stderr,
                "wkvm-controld: refusing to bind %s without --api-keys (only loopback may run "
                "without keys)\n",
                host);
        ctl_auth_free(auth);
        wk_cfg_free(cfg);
        return 2;
    }

    /* Signals are taken by sigwait() in this thread only. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    app->start_ms = (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
    app->data_dir = data_dir;
    app->metrics = ctl_metrics_new();
    app->migrate.transfer_timeout_ms =
        (uint32_t)(c.slot_io_timeout_ms > WK_PROTO_NCCL_TIMEOUT_MAX ? WK_PROTO_NCCL_TIMEOUT_MAX
                                                                    : c.slot_io_timeout_ms);
    /*
     * Without keys every client is the one user "local": a per-user cap would
     * be a server-wide cap on top of --queue-max, so it applies only when set
     * explicitly there.
     */
    uint32_t per_user = c.max_concurrent_per_user;
    if (!ctl_auth_enabled(auth) && !wk_cfg_is_set(cfg, "max-concurrent-per-user"))
        per_user = 0;
    if (ctl_limits_new(per_user, &app->limits) != WK_OK) {
        fprintf(stderr, "wkvm-controld: out of memory\n");
        goto out;
    }
    char model_name[256] = "";
    if (app->model_dir != NULL) {
        /* --vocab: a .json is a tokenizer.json, else a World vocab; without it, the dir's. */
        if (wk_tok_load_dir(app->model_dir, c.vocab, &app->tok, &d) != WK_OK) {
            fprintf(stderr, "wkvm-controld: tokenizer: %s\n", d.msg);
            goto out;
        }
        /* The checkpoint's own chat template; none (WK_ENOENT): the World template. */
        wk_err te = wk_chat_tpl_load(app->model_dir, c.chat_template, &app->chat_tpl, &d);
        if (te != WK_OK && (te != WK_ENOENT || c.chat_template != NULL)) {
            fprintf(stderr, "wkvm-controld: chat template: %s\n", d.msg);
            goto out;
        }
        if (te == WK_OK)
            wk_log_info("chat template from %s thinks=%s tool_calls=%s",
                        wk_chat_tpl_source(app->chat_tpl),
                        wk_chat_tpl_thinks(app->chat_tpl) ? "yes" : "no",
                        wk_toolcall_fmt_name(wk_chat_tpl_toolcall_fmt(app->chat_tpl)));
        if (c.served_model_name != NULL) {
            snprintf(model_name, sizeof(model_name), "%s", c.served_model_name);
        } else {
            /* the directory's name, or a checkpoint file's without its extension */
            char tmp[4096];
            bool is_file = false;
            if (wk_file_model_path(app->model_dir, tmp, sizeof(tmp), model_name,
                                   sizeof(model_name), &is_file) != WK_OK) {
                fprintf(stderr, "wkvm-controld: --model %s: path too long\n", app->model_dir);
                goto out;
            }
        }
        app->model_id = model_name;
    }
    if (ctl_chat_active_new(&app->chat_active) != WK_OK ||
        ctl_migrate_drains_new(&app->drains) != WK_OK) {
        fprintf(stderr, "wkvm-controld: out of memory\n");
        goto out;
    }
    if (app->metrics == NULL || ctl_admin_metrics_declare(app->metrics) != WK_OK ||
        ctl_openai_metrics_declare(app->metrics) != WK_OK ||
        ctl_chat_metrics_declare(app->metrics) != WK_OK ||
        ctl_migrate_metrics_declare(app->metrics) != WK_OK ||
        ctl_ckpt_metrics_declare(app->metrics) != WK_OK ||
        ctl_responses_metrics_declare(app->metrics) != WK_OK) {
        fprintf(stderr, "wkvm-controld: out of memory\n");
        goto out;
    }
    c.pool.listen_url = worker_url;
    if (ctl_pool_new(&c.pool, &app->pool, &d) != WK_OK) {
        wk_log_error("%s", d.msg);
        goto out;
    }
    if (ctl_resid_dir_new(&app->resid) != WK_OK) {
        fprintf(stderr, "wkvm-controld: out of memory\n");
        goto out;
    }
    if (ctl_sched_new(&c.sched, app->pool, app->resid, app->metrics, &app->sched, &d) != WK_OK) {
        wk_log_error("%s", d.msg);
        goto out;
    }
    ctl_store_open_stats sst;
    if (ctl_store_open(data_dir, NULL, &app->store, &sst, &d) != WK_OK) {
        wk_log_error("store: %s", d.msg);
        goto out;
    }
    wk_log_info("store opened states=%llu blobs=%llu orphans_removed=%llu temps_removed=%llu "
                "blobs_missing=%llu",
                (unsigned long long)sst.states, (unsigned long long)sst.blobs,
                (unsigned long long)sst.orphans_removed, (unsigned long long)sst.temps_removed,
                (unsigned long long)sst.blobs_missing);
    if (ctl_vm_new(app->pool, app->resid, app->store, &app->vm, &d) != WK_OK) {
        wk_log_error("%s", d.msg);
        goto out;
    }
    ctl_vm_set_spill(app->vm, ctl_chat_spill, app);
    ctl_vm_set_rpc_timeout(app->vm, (uint32_t)c.slot_io_timeout_ms);
    /* a state operation's wait for a slot is part of its request's time */
    ctl_vm_set_slot_wait(app->vm, c.slot_wait_ms < app->request_timeout_ms
                                      ? c.slot_wait_ms
                                      : app->request_timeout_ms);
    if (ctl_vm_set_idle_spill(app->vm, c.session_idle_ms, c.max_hot_sessions) != WK_OK) {
        wk_log_error("cannot start the session spiller");
        goto out;
    }
    ctl_ckpt_config *kc = &c.ckpt;
    if (!wk_cfg_is_set(cfg, "state-cache-bytes")) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        uint64_t quarter = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 4 : 0;
        if (quarter > 0 && quarter < kc->warm_bytes)
            kc->warm_bytes = quarter;
    }
    if (ctl_ckpt_new(kc, app->pool, app->sched, app->vm, app->store, app->metrics, &app->ckpt,
                     &d) != WK_OK) {
        wk_log_error("%s", d.msg);
        goto out;
    }
    wk_log_info("prefix cache %s warm_bytes_per_worker=%llu disk_bytes=%llu interval=%u",
                kc->enabled ? "on" : "off", (unsigned long long)kc->warm_bytes,
                (unsigned long long)kc->disk_bytes, kc->interval);
    ctl_http_route routes[64];
    size_t nr = ctl_admin_routes(app, routes, 64);
    if (app->tok != NULL) {
        nr += ctl_openai_routes(app, routes + nr, 64 - nr);
        nr += ctl_states_routes(app, routes + nr, 64 - nr);
        nr += ctl_responses_routes(app, routes + nr, 64 - nr);
        nr += ctl_migrate_routes(app, routes + nr, 64 - nr);
    }
    app->routes = routes; /* (lives until main returns, after the HTTP server) */
    app->n_routes = nr;
    c.http.auth = ctl_auth_enabled(auth) ? ctl_auth_cb : NULL;
    c.http.auth_arg = auth;
    if (c.http.sse_loops == 0) { /* one event loop per core available */
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        c.http.sse_loops = ncpu < 1 ? 1 : ncpu > 64 ? 64 : (unsigned)ncpu;
    }
    if (ctl_http_new(&c.http, routes, nr, ctl_admin_http_observe, app, &app->http, &d) != WK_OK) {
        wk_log_error("%s", d.msg);
        goto out;
    }
    wk_log_info("listening http=%s:%u workers=%s model=%s data=%s keys=%s", host, c.http.port,
                worker_url, app->model_dir ? app->model_dir : "-", data_dir,
                ctl_auth_enabled(auth) ? "on" : "off");
    int sig = 0;
    sigwait(&sigs, &sig);
    wk_log_info("shutting down signal=%d", sig);
    rc = 0;
out:
    if (app->vm != NULL)
        ctl_vm_end_waits(app->vm); /* a state operation waiting for a slot answers now */
    /* background responses stop first (stored as failed, threads gone): stopping the HTTP
     * server waits for its connections, and a background generation must not run on meanwhile */
    ctl_responses_shutdown(app);
    ctl_http_free(app->http);
    ctl_ckpt_flush(app->ckpt);
    if (app->vm != NULL)
        ctl_vm_flush(app->vm);
    /* the step loops first: a step in flight ends in ctl_ckpt's in-step checkpoint hook */
    ctl_sched_free(app->sched);
    ctl_ckpt_free(app->ckpt);
    ctl_vm_free(app->vm);
    ctl_resid_dir_free(app->resid);
    ctl_store_close(app->store);
    ctl_pool_free(app->pool);
    wk_tok_free(app->tok);
    wk_chat_tpl_free(app->chat_tpl);
    ctl_metrics_free(app->metrics);
    ctl_limits_free(app->limits);
    ctl_migrate_drains_free(app->drains);
    ctl_chat_active_free(app->chat_active);
    ctl_auth_free(auth);
    wk_cfg_free(cfg);
    return rc;
}
