/*
 * wkvm-controld: the GPU-free control daemon. Parses its config table,
 * starts the worker pool (NNG) and the HTTP server (civetweb), then waits
 * for SIGTERM/SIGINT and shuts down in reverse order. It never links CUDA.
 */
#define WK_LOG_MODULE "controld"
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctl_app.h"
#include "ctl_auth.h"
#include "ctl_openai.h"
#include <libgen.h>
#include "ctl_ckpt.h"
#include "wk_cfg.h"
#include "wk_log.h"
#include "wk_net.h"

static const wk_cfg_opt ctl_opts[] = {
    {"host", WK_CFG_STR, "127.0.0.1", 0, 0,
     "HTTP bind address; anything but loopback needs --api-keys"},
    {"port", WK_CFG_U64, "8000", 1, 65535, "HTTP port"},
    {"data-dir", WK_CFG_STR, NULL, 0, 0, "data directory (default ~/.local/share/wkvm)"},
    {"worker-url", WK_CFG_STR, NULL, 0, 0,
     "NNG URL workers dial (default ipc://DATA/controller.ipc; across hosts "
     "tls+tcp://HOST:PORT with --worker-tls-*)"},
    {"worker-tls-ca", WK_CFG_STR, NULL, 0, 0,
     "tls+tcp:// worker link: CA certificate file (PEM); only workers whose certificate "
     "chains to it are accepted"},
    {"worker-tls-cert", WK_CFG_STR, NULL, 0, 0,
     "tls+tcp:// worker link: the controller's certificate file (PEM)"},
    {"worker-tls-key", WK_CFG_STR, NULL, 0, 0,
     "tls+tcp:// worker link: the controller's private key file (PEM)"},
    {"allow-remote-workers", WK_CFG_BOOL, "false", 0, 0,
     "force a plain tcp:// --worker-url on a non-loopback address (no encryption, no "
     "authentication: prompts and states in clear; use tls+tcp:// instead)"},
    {"model", WK_CFG_STR, NULL, 0, 0, "model directory every worker loads (none: empty workers)"},
    {"slots", WK_CFG_U64, "16", 1, 65535, "state slots per worker (slot 0 is reserved extra)"},
    {"workers", WK_CFG_U64, "1", 0, 1024, "workers that must be ready before /ready says 200"},
    {"api-keys", WK_CFG_STR, NULL, 0, 0, "file of 'KEY USER [admin]' lines"},
    {"http-threads", WK_CFG_U64, "32", 2, 1024, "HTTP request threads"},
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
    {"max-concurrent-per-user", WK_CFG_U64, "64", 0, 1000000,
     "generation requests one API user may run at once (0: no limit; over: 429 "
     "quota_exceeded; without --api-keys only when set explicitly)"},
    {"served-model-name", WK_CFG_STR, NULL, 0, 0, "model id in the API (default: model dir name)"},
    {"vocab", WK_CFG_STR, NULL, 0, 0,
     "tokenizer: a .json is HF tokenizer.json, else World vocab (default MODEL/tokenizer.json, "
     "else MODEL/rwkv_vocab_v20230424.txt)"},
    {"step-tokens", WK_CFG_U64, "512", 1, 65536, "token budget of one step per worker"},
    {"prefill-chunk", WK_CFG_U64, "256", 1, 16384, "most prefill tokens of one request per step"},
    {"max-rows", WK_CFG_U64, "256", 1, 1024, "most rows in one step"},
    {"queue-max", WK_CFG_U64, "1024", 0, 1000000, "requests waiting for a slot before 429"},
    {"slot-io-timeout-ms", WK_CFG_U64, "60000", 100, 3600000,
     "deadline of one slot transfer request (migration, spill, resume); past it the "
     "operation aborts and the source stays as it was"},
    {"nccl-net", WK_CFG_BOOL, "false", 0, 0,
     "migrate between GPU workers on different hosts with NCCL (its network transport must "
     "reach between them); otherwise such migrations relay bytes over NNG"},
    {"step-timeout-ms", WK_CFG_U64, "120000", 100, 3600000,
     "deadline of one step on a worker; past it the step's requests fail"},
    {"request-timeout-ms", WK_CFG_U64, "600000", 100, 86400000, "deadline of one request"},
    {"max-tokens-default", WK_CFG_U64, "1024", 1, 1048576, "chat max_tokens when absent"},
    {"max-tokens-limit", WK_CFG_U64, "65536", 1, 1048576, "largest max_tokens accepted"},
    {"max-prompt-tokens", WK_CFG_U64, "262144", 1, 16777216, "largest prompt in tokens"},
    {"session-idle-ms", WK_CFG_U64, "600000", 0, 604800000,
     "spill a parked chat session to disk after this idle time (0 = only under pressure)"},
    {"max-hot-sessions", WK_CFG_U64, "0", 0, 1000000,
     "most parked chat sessions kept in slots; more are spilled to disk (0 = no cap)"},
    {"prefix-cache", WK_CFG_BOOL, "true", 0, 0,
     "automatic reuse: every request leaves state checkpoints and resumes the longest one "
     "of its owner that prefixes its prompt"},
    {"state-cache-bytes", WK_CFG_U64, "8589934592", 0, UINT64_MAX,
     "warm checkpoint budget per worker, bytes of its host memory (unset: 25% of this host's "
     "RAM, at most 8 GiB; 0 = no warm tier)"},
    {"state-cache-disk-bytes", WK_CFG_U64, "8589934592", 0, UINT64_MAX,
     "disk checkpoint budget, bytes in the data dir (0 = no disk tier)"},
    {"checkpoint-interval", WK_CFG_U64, "0", 0, 16777216,
     "also checkpoint long prefills every this many tokens (0 = off)"},
    {"checkpoint-write-through", WK_CFG_BOOL, "false", 0, 0,
     "also write every reply's end-of-reply checkpoint to disk (in the background), so "
     "chat sessions resume after their worker dies (costs a state image of disk writes "
     "per turn)"},
    {"heartbeat-ms", WK_CFG_U64, "1000", 50, 60000, "worker Stats poll period"},
    {"load-timeout-ms", WK_CFG_U64, "600000", 1000, 86400000, "model load deadline"},
    {"log-level", WK_CFG_STR, "info", 0, 0, "error, warn, info or debug"},
};
#define CTL_NOPTS (sizeof(ctl_opts) / sizeof(ctl_opts[0]))

static wk_err
ctl_auth_cb(const char *authorization, const char *api_key, const char **user, bool *admin,
            void *arg)
{
    return ctl_auth_check(arg, authorization, api_key, user, admin);
}

static wk_err
ctl_main_evict(void *arg, const char *worker, uint32_t pages)
{
    return ctl_vm_evict_pages(arg, worker, pages);
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
 * resolved) it needs --allow-remote-workers. tls+tcp:// needs the CA, the
 * certificate and the key; the TLS files make no sense on another scheme.
 */
static int
ctl_main_check_worker_url(const wk_cfg *cfg, const char *url)
{
    wk_net_scheme sc;
    char host[256];
    wk_diag d = {{0}};
    if (wk_net_url_parse(url, &sc, host, sizeof(host), &d) != WK_OK) {
        fprintf(stderr, "wkvm-controld: --worker-url %s\n", d.msg);
        return 2;
    }
    const char *tls[3] = {wk_cfg_get_str(cfg, "worker-tls-ca"),
                          wk_cfg_get_str(cfg, "worker-tls-cert"),
                          wk_cfg_get_str(cfg, "worker-tls-key")};
    const bool any_tls = tls[0] != NULL || tls[1] != NULL || tls[2] != NULL;
    if (sc == WK_NET_SCHEME_TLS && (tls[0] == NULL || tls[1] == NULL || tls[2] == NULL)) {
        fprintf(stderr, "wkvm-controld: --worker-url %s needs --worker-tls-ca, --worker-tls-cert "
                        "and --worker-tls-key (docs/OPERATIONS.md, \"Workers on other hosts\")\n",
                url);
        return 2;
    }
    if (sc != WK_NET_SCHEME_TLS && any_tls) {
        fprintf(stderr, "wkvm-controld: --worker-tls-* need a tls+tcp:// --worker-url (got %s)\n",
                url);
        return 2;
    }
    if (sc == WK_NET_SCHEME_TCP && !wk_net_host_is_loopback(host) &&
        !wk_cfg_get_bool(cfg, "allow-remote-workers")) {
        fprintf(stderr,
                "wkvm-controld: refusing to listen for workers on %s: plain tcp:// on a "
                "non-loopback address carries prompts and state bytes in clear without "
                "authentication; use tls+tcp:// with --worker-tls-ca/-cert/-key, or force it "
                "with --allow-remote-workers (docs/OPERATIONS.md)\n",
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
    if (wk_cfg_parse(ctl_opts, CTL_NOPTS, "WKVM", argc, argv, &cfg, &d) != WK_OK) {
        fprintf(stderr, "wkvm-controld: %s\n", d.msg);
        return 2;
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
    if (wk_log_set_level_name(wk_cfg_get_str(cfg, "log-level")) != WK_OK) {
        fprintf(stderr, "wkvm-controld: unknown log level '%s'\n",
                wk_cfg_get_str(cfg, "log-level"));
        wk_cfg_free(cfg);
        return 2;
    }
    char data_dir[2048];
    if (wk_cfg_get_str(cfg, "data-dir") != NULL) {
        snprintf(data_dir, sizeof(data_dir), "%s", wk_cfg_get_str(cfg, "data-dir"));
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
    if (wk_cfg_get_str(cfg, "worker-url") != NULL)
        snprintf(worker_url, sizeof(worker_url), "%s", wk_cfg_get_str(cfg, "worker-url"));
    else
        snprintf(worker_url, sizeof(worker_url), "ipc://%s/controller.ipc", data_dir);

    if (ctl_main_check_worker_url(cfg, worker_url) != 0) {
        wk_cfg_free(cfg);
        return 2;
    }
    const char *host = wk_cfg_get_str(cfg, "host");
    ctl_auth *auth = NULL;
    if (ctl_auth_load(wk_cfg_get_str(cfg, "api-keys"), &auth, &d) != WK_OK) {
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
    ctl_app app = {0};
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    app.start_ms = (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
    app.expected_workers = (uint32_t)wk_cfg_get_u64(cfg, "workers");
    app.model_dir = wk_cfg_get_str(cfg, "model");
    app.data_dir = data_dir;
    app.metrics = ctl_metrics_new();
    app.default_max_tokens = (uint32_t)wk_cfg_get_u64(cfg, "max-tokens-default");
    app.max_tokens_limit = (uint32_t)wk_cfg_get_u64(cfg, "max-tokens-limit");
    app.max_prompt_tokens = (uint32_t)wk_cfg_get_u64(cfg, "max-prompt-tokens");
    app.request_timeout_ms = wk_cfg_get_u64(cfg, "request-timeout-ms");
    app.max_messages = (uint32_t)wk_cfg_get_u64(cfg, "max-messages");
    app.max_message_bytes = wk_cfg_get_u64(cfg, "max-message-bytes");
    app.max_stop_bytes = (uint32_t)wk_cfg_get_u64(cfg, "max-stop-bytes");
    app.max_states_per_user = wk_cfg_get_u64(cfg, "max-states-per-user");
    app.migrate.nccl_net = wk_cfg_get_bool(cfg, "nccl-net");
    app.migrate.transfer_timeout_ms = (uint32_t)(wk_cfg_get_u64(cfg, "slot-io-timeout-ms") >
                                                         WK_PROTO_NCCL_TIMEOUT_MAX
                                                     ? WK_PROTO_NCCL_TIMEOUT_MAX
                                                     : wk_cfg_get_u64(cfg, "slot-io-timeout-ms"));
    /*
     * Without keys every client is the one user "local": a per-user cap would
     * be a server-wide cap on top of --queue-max, so it applies only when set
     * explicitly there.
     */
    uint32_t per_user = (uint32_t)wk_cfg_get_u64(cfg, "max-concurrent-per-user");
    if (!ctl_auth_enabled(auth) && !wk_cfg_is_set(cfg, "max-concurrent-per-user"))
        per_user = 0;
    if (ctl_limits_new(per_user, &app.limits) !=
        WK_OK) {
        fprintf(stderr, "wkvm-controld: out of memory\n");
        goto out;
    }
    char model_name[256] = "";
    if (app.model_dir != NULL) {
        /* --vocab: a .json is a tokenizer.json, else a World vocab; without it, the dir's. */
        if (wk_tok_load_dir(app.model_dir, wk_cfg_get_str(cfg, "vocab"), &app.tok, &d) != WK_OK) {
            fprintf(stderr, "wkvm-controld: tokenizer: %s\n", d.msg);
            goto out;
        }
        if (wk_cfg_get_str(cfg, "served-model-name") != NULL) {
            snprintf(model_name, sizeof(model_name), "%s", wk_cfg_get_str(cfg, "served-model-name"));
        } else {
            char tmp[4096];
            snprintf(tmp, sizeof(tmp), "%s", app.model_dir);
            size_t tl = strlen(tmp);
            while (tl > 1 && tmp[tl - 1] == '/')
                tmp[--tl] = '\0';
            snprintf(model_name, sizeof(model_name), "%s", basename(tmp));
        }
        app.model_id = model_name;
    }
    if (ctl_chat_active_new(&app.chat_active) != WK_OK ||
        ctl_mig_drains_new(&app.drains) != WK_OK) {
        fprintf(stderr, "wkvm-controld: out of memory\n");
        goto out;
    }
    if (app.metrics == NULL || ctl_admin_metrics_declare(app.metrics) != WK_OK ||
        ctl_openai_metrics_declare(app.metrics) != WK_OK ||
        ctl_chat_metrics_declare(app.metrics) != WK_OK ||
        ctl_migrate_metrics_declare(app.metrics) != WK_OK ||
        ctl_ckpt_metrics_declare(app.metrics) != WK_OK) {
        fprintf(stderr, "wkvm-controld: out of memory\n");
        goto out;
    }
    ctl_pool_config pc = {
        .listen_url = worker_url,
        .tls_ca = wk_cfg_get_str(cfg, "worker-tls-ca"),
        .tls_cert = wk_cfg_get_str(cfg, "worker-tls-cert"),
        .tls_key = wk_cfg_get_str(cfg, "worker-tls-key"),
        .model_dir = app.model_dir,
        .slots = (uint32_t)wk_cfg_get_u64(cfg, "slots"),
        .heartbeat_ms = (uint32_t)wk_cfg_get_u64(cfg, "heartbeat-ms"),
        .load_timeout_ms = (uint32_t)wk_cfg_get_u64(cfg, "load-timeout-ms"),
    };
    if (ctl_pool_new(&pc, &app.pool, &d) != WK_OK) {
        wk_log_error("%s", d.msg);
        goto out;
    }
    ctl_sched_config sc = {
        .step_tokens = (uint32_t)wk_cfg_get_u64(cfg, "step-tokens"),
        .job_chunk = (uint32_t)wk_cfg_get_u64(cfg, "prefill-chunk"),
        .max_rows = (uint32_t)wk_cfg_get_u64(cfg, "max-rows"),
        .queue_max = (uint32_t)wk_cfg_get_u64(cfg, "queue-max"),
        .step_timeout_ms = (uint32_t)wk_cfg_get_u64(cfg, "step-timeout-ms"),
    };
    if (ctl_sched_new(&sc, app.pool, app.metrics, &app.sched, &d) != WK_OK) {
        wk_log_error("%s", d.msg);
        goto out;
    }
    ctl_store_open_stats sst;
    if (ctl_store_open(data_dir, NULL, &app.store, &sst, &d) != WK_OK) {
        wk_log_error("store: %s", d.msg);
        goto out;
    }
    wk_log_info("store opened states=%llu blobs=%llu orphans_removed=%llu temps_removed=%llu "
                "blobs_missing=%llu",
                (unsigned long long)sst.states, (unsigned long long)sst.blobs,
                (unsigned long long)sst.orphans_removed, (unsigned long long)sst.temps_removed,
                (unsigned long long)sst.blobs_missing);
    if (ctl_vm_new(app.pool, app.sched, app.store, &app.vm, &d) != WK_OK) {
        wk_log_error("%s", d.msg);
        goto out;
    }
    ctl_sched_set_evictor(app.sched, ctl_main_evict, app.vm);
    ctl_vm_set_spill(app.vm, ctl_chat_spill, &app);
    ctl_vm_set_rpc_timeout(app.vm, (uint32_t)wk_cfg_get_u64(cfg, "slot-io-timeout-ms"));
    if (ctl_vm_set_idle_spill(app.vm, wk_cfg_get_u64(cfg, "session-idle-ms"),
                              (uint32_t)wk_cfg_get_u64(cfg, "max-hot-sessions")) != WK_OK) {
        wk_log_error("cannot start the session spiller");
        goto out;
    }
    ctl_ckpt_config kc = {
        .enabled = wk_cfg_get_bool(cfg, "prefix-cache"),
        .warm_bytes = wk_cfg_get_u64(cfg, "state-cache-bytes"),
        .disk_bytes = wk_cfg_get_u64(cfg, "state-cache-disk-bytes"),
        .interval = (uint32_t)wk_cfg_get_u64(cfg, "checkpoint-interval"),
        .write_through = wk_cfg_get_bool(cfg, "checkpoint-write-through"),
    };
    if (!wk_cfg_is_set(cfg, "state-cache-bytes")) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        uint64_t quarter = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 4 : 0;
        if (quarter > 0 && quarter < kc.warm_bytes)
            kc.warm_bytes = quarter;
    }
    if (ctl_ckpt_new(&kc, app.pool, app.sched, app.vm, app.store, app.metrics, &app.ckpt, &d) !=
        WK_OK) {
        wk_log_error("%s", d.msg);
        goto out;
    }
    wk_log_info("prefix cache %s warm_bytes_per_worker=%llu disk_bytes=%llu interval=%u",
                kc.enabled ? "on" : "off", (unsigned long long)kc.warm_bytes,
                (unsigned long long)kc.disk_bytes, kc.interval);
    ctl_http_route routes[64];
    size_t nr = ctl_admin_routes(&app, routes, 64);
    if (app.tok != NULL) {
        nr += ctl_openai_routes(&app, routes + nr, 64 - nr);
        nr += ctl_states_routes(&app, routes + nr, 64 - nr);
        nr += ctl_migrate_routes(&app, routes + nr, 64 - nr);
    }
    ctl_http_config hc = {
        .host = host,
        .port = (unsigned)wk_cfg_get_u64(cfg, "port"),
        .threads = (unsigned)wk_cfg_get_u64(cfg, "http-threads"),
        .max_body = (size_t)wk_cfg_get_u64(cfg, "max-body"),
        .timeout_ms = (unsigned)wk_cfg_get_u64(cfg, "http-timeout-ms"),
        .max_header = (size_t)wk_cfg_get_u64(cfg, "max-header-bytes"),
        .auth = ctl_auth_enabled(auth) ? ctl_auth_cb : NULL,
        .auth_arg = auth,
    };
    if (ctl_http_new(&hc, routes, nr, ctl_admin_http_observe, &app, &app.http, &d) != WK_OK) {
        wk_log_error("%s", d.msg);
        goto out;
    }
    wk_log_info("listening http=%s:%u workers=%s model=%s data=%s keys=%s", host, hc.port,
                worker_url, app.model_dir ? app.model_dir : "-", data_dir,
                ctl_auth_enabled(auth) ? "on" : "off");
    int sig = 0;
    sigwait(&sigs, &sig);
    wk_log_info("shutting down signal=%d", sig);
    rc = 0;
out:
    ctl_http_free(app.http);
    ctl_ckpt_flush(app.ckpt);
    if (app.vm != NULL)
        ctl_vm_flush(app.vm);
    ctl_ckpt_free(app.ckpt);
    if (app.sched != NULL)
        ctl_sched_set_evictor(app.sched, NULL, NULL);
    ctl_sched_free(app.sched);
    ctl_vm_free(app.vm);
    ctl_store_close(app.store);
    ctl_pool_free(app.pool);
    wk_tok_free(app.tok);
    ctl_metrics_free(app.metrics);
    ctl_limits_free(app.limits);
    ctl_mig_drains_free(app.drains);
    ctl_chat_active_free(app.chat_active);
    ctl_auth_free(auth);
    wk_cfg_free(cfg);
    return rc;
}
