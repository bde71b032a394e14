/*
 * wkvm-workerd: one process per GPU (or a CPU worker). Holds the model
 * weights and the state arena, dials the controller and executes what it is
 * told. Keeps no session logic. SIGTERM/SIGINT stop it cleanly.
 */
#define WK_LOG_MODULE "workerd"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/be.h"
#include "backend/cpu/be_cpu_kernels.h"
#include "wk_cfg.h"
#include "wk_log.h"
#include "wk_net.h"
#include "wrk_rpc.h"

static const wk_cfg_opt wrk_opts[] = {
    /* The controller <-> worker link: the same --link-* names on both daemons. */
    {"link-url", WK_CFG_STR, NULL, 0, 0,
     "the link's URL: the controller's, which this worker dials (default "
     "ipc://DATA/controller.ipc; across hosts tls+tcp://HOST:PORT with --link-tls-*)"},
    {"link-tls-ca", WK_CFG_STR, NULL, 0, 0,
     "tls+tcp:// link: CA certificate file (PEM) the controller's certificate must chain to"},
    {"link-tls-cert", WK_CFG_STR, NULL, 0, 0, "tls+tcp:// link: this worker's certificate (PEM)"},
    {"link-tls-key", WK_CFG_STR, NULL, 0, 0, "tls+tcp:// link: this worker's private key (PEM)"},
    {"link-tls-server-name", WK_CFG_STR, NULL, 0, 0,
     "tls+tcp:// link: the name the controller's certificate must carry (default: the URL's "
     "host)"},
    {"link-silence-s", WK_CFG_U64, "0", 0, 86400,
     "a connected controller link that brings nothing for this many seconds makes this "
     "worker exit non-zero, for its supervisor to restart it (a link libnng < 1.8 wedged "
     "stays silent for good); set it above the longest model load times the workers "
     "loading at once (the controller beats no worker while it loads one); 0 = never"},
    {"link-allow-plain-tcp", WK_CFG_BOOL, "false", 0, 0,
     "force a plain tcp:// --link-url on a non-loopback address (no encryption, no "
     "authentication: prompts and states in clear; use tls+tcp:// instead)"},
    {"controller", WK_CFG_ALIAS, "link-url", 0, 0, "older name"},
    {"tls-ca", WK_CFG_ALIAS, "link-tls-ca", 0, 0, "older name"},
    {"tls-cert", WK_CFG_ALIAS, "link-tls-cert", 0, 0, "older name"},
    {"tls-key", WK_CFG_ALIAS, "link-tls-key", 0, 0, "older name"},
    {"tls-server-name", WK_CFG_ALIAS, "link-tls-server-name", 0, 0, "older name"},
    {"allow-plain-tcp", WK_CFG_ALIAS, "link-allow-plain-tcp", 0, 0, "older name"},
    {"data-dir", WK_CFG_STR, NULL, 0, 0, "data directory (default ~/.local/share/wkvm)"},
    {"id", WK_CFG_STR, NULL, 0, 0, "worker id, unique per controller (default w<pid>)"},
    {"model", WK_CFG_STR, NULL, 0, 0,
     "model directory or checkpoint file to load at start (else the controller's)"},
    {"slots", WK_CFG_U64, "16", 1, 65535, "usable state slots when --model is given"},
    {"backend", WK_CFG_STR, "auto", 0, 0,
     "cpu, cuda or auto (auto = cpu until the CUDA backend has passed its gpu suite on a "
     "device; cuda selects it)"},
    {"device", WK_CFG_U64, "0", 0, 255, "CUDA device ordinal"},
    {"threads", WK_CFG_U64, "0", 0, 1024, "CPU threads for the CPU backend (0 = all cores)"},
    {"fp32", WK_CFG_BOOL, "false", 0, 0, "convert weights to fp32 at load"},
    {"quantize", WK_CFG_STR, "none", 0, 0,
     "none or q8_0: quantize the checkpoint's matrices to Q8_0 at load (CPU backend; "
     "states made under Q8_0 only load into Q8_0 workers: the fingerprint differs)"},
    {"cpu-matmul", WK_CFG_STR, "fp32", 0, 0,
     "fp32 or bf16: BF16-weight products with fp32 activations (FMA chains, the same bits on "
     "every CPU) or with activations rounded to bf16 on AMX tiles, else AVX512-BF16 dot "
     "products (CPU backend, BF16 weights, a CPU with AMX-BF16 or AVX512_BF16; states only "
     "load into workers of the same mode and engine)"},
    {"vocab", WK_CFG_STR, NULL, 0, 0, "vocab file (default: the model directory's)"},
    {"host-cache-bytes", WK_CFG_U64, "12884901888", 0, 1099511627776ull,
     "warm tier: host memory for copies of evicted states and checkpoints, a hard limit; "
     "unset: 3/8 of RAM, at least 1 GiB, capped at the default (the log says which); "
     "0 = none"},
    {"kv-pages", WK_CFG_U64, "0", 0, 16777216,
     "hybrid models: pages in the KV pool (0 = the backend's default; a worker-local choice)"},
    {"log-level", WK_CFG_STR, "info", 0, 0, "error, warn, info or debug"},
};
#define WRK_NOPTS (sizeof(wrk_opts) / sizeof(wrk_opts[0]))

/* The options as main() reads them (filled by wk_cfg_fill; strings borrowed from the wk_cfg). */
typedef struct wrk_main_conf {
    const char *link_url, *tls_ca, *tls_cert, *tls_key, *tls_server_name; /* --link-* */
    bool allow_plain_tcp;   /* --link-allow-plain-tcp */
    uint32_t link_silence_s; /* --link-silence-s */
    const char *data_dir;   /* --data-dir */
    const char *id;         /* --id */
    const char *model;      /* --model */
    uint32_t slots;         /* --slots */
    const char *backend;    /* --backend */
    uint32_t device;        /* --device */
    uint32_t threads;       /* --threads */
    bool fp32;              /* --fp32 */
    const char *quantize;   /* --quantize */
    const char *cpu_matmul; /* --cpu-matmul */
    const char *vocab;      /* --vocab */
    uint64_t host_cache;    /* --host-cache-bytes */
    uint32_t kv_pages;      /* --kv-pages */
    const char *log_level;  /* --log-level */
} wrk_main_conf;

/* Where each option goes (wk_cfg_bind). */
#define WRK_BIND(opt, type, field) WK_CFG_BIND(wrk_main_conf, opt, type, field)
static const wk_cfg_bind wrk_binds[] = {
    WRK_BIND("link-url", STR, link_url),
    WRK_BIND("link-tls-ca", STR, tls_ca),
    WRK_BIND("link-tls-cert", STR, tls_cert),
    WRK_BIND("link-tls-key", STR, tls_key),
    WRK_BIND("link-tls-server-name", STR, tls_server_name),
    WRK_BIND("link-allow-plain-tcp", BOOL, allow_plain_tcp),
    WRK_BIND("link-silence-s", U32, link_silence_s),
    WRK_BIND("data-dir", STR, data_dir),
    WRK_BIND("id", STR, id),
    WRK_BIND("model", STR, model),
    WRK_BIND("slots", U32, slots),
    WRK_BIND("backend", STR, backend),
    WRK_BIND("device", U32, device),
    WRK_BIND("threads", U32, threads),
    WRK_BIND("fp32", BOOL, fp32),
    WRK_BIND("quantize", STR, quantize),
    WRK_BIND("cpu-matmul", STR, cpu_matmul),
    WRK_BIND("vocab", STR, vocab),
    WRK_BIND("host-cache-bytes", U64, host_cache),
    WRK_BIND("kv-pages", U32, kv_pages),
    WRK_BIND("log-level", STR, log_level),
};
#undef WRK_BIND
#define WRK_NBINDS (sizeof(wrk_binds) / sizeof(wrk_binds[0]))

static volatile sig_atomic_t wrk_stop;

static void
wrk_on_signal(int sig)
{
    (void)sig;
    wrk_stop = 1;
}

/*
 * The controller link's address rules (0: fine; else a one-line message has
 * been printed): plain tcp:// to a non-loopback address (parsed, names
 * resolved) needs --allow-plain-tcp; tls+tcp:// needs --tls-ca, --tls-cert
 * and --tls-key, which make no sense on another scheme.
 */
static int
wrk_main_check_url(const wrk_main_conf *c, const char *url)
{
    wk_net_scheme sc;
    char host[256];
    wk_diag d = {{0}};
    if (wk_net_url_parse(url, &sc, host, sizeof(host), &d) != WK_OK) {
        fprintf(stderr, "wkvm-workerd: --link-url %s\n", d.msg);
        return 2;
    }
    const char *tls[3] = {c->tls_ca, c->tls_cert, c->tls_key};
    const bool any_tls =
        tls[0] != NULL || tls[1] != NULL || tls[2] != NULL || c->tls_server_name != NULL;
    if (sc == WK_NET_SCHEME_TLS && (tls[0] == NULL || tls[1] == NULL || tls[2] == NULL)) {
        fprintf(stderr, "wkvm-workerd: --link-url %s needs --link-tls-ca, --link-tls-cert and "
                        "--link-tls-key (docs/OPERATIONS.md, \"Workers on other hosts\")\n",
                url);
        return 2;
    }
    if (sc != WK_NET_SCHEME_TLS && any_tls) {
        fprintf(stderr, "wkvm-workerd: --link-tls-* need a tls+tcp:// --link-url (got %s)\n", url);
        return 2;
    }
    if (sc == WK_NET_SCHEME_TCP && !wk_net_host_is_loopback(host) &&
        !c->allow_plain_tcp) {
        fprintf(stderr,
                "wkvm-workerd: refusing to dial %s: plain tcp:// to a non-loopback address "
                "carries prompts and state bytes in clear without authentication; use "
                "tls+tcp:// with --link-tls-ca/-cert/-key, or force it with "
                "--link-allow-plain-tcp\n",
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
    if (!wk_cfg_binds_valid(wrk_opts, WRK_NOPTS, wrk_binds, WRK_NBINDS)) {
        fprintf(stderr, "wkvm-workerd: wrk_binds does not match wrk_opts\n");
        abort();
    }
    if (wk_cfg_parse(wrk_opts, WRK_NOPTS, "WKVM_WORKER", argc, argv, &cfg, &d) != WK_OK) {
        fprintf(stderr, "wkvm-workerd: %s\n", d.msg);
        return 2;
    }
    if (wk_cfg_version_requested(cfg)) {
        printf("%s %s\n", "wkvm-workerd", WK_VERSION);
        wk_cfg_free(cfg);
        return 0;
    }
    if (wk_cfg_help_requested(cfg)) {
        wk_cfg_print_help(wrk_opts, WRK_NOPTS, "wkvm-workerd",
                          "A wkvm worker: model weights, state arena, step execution.",
                          "WKVM_WORKER", stdout);
        wk_cfg_free(cfg);
        return 0;
    }
    if (wk_cfg_sample_requested(cfg)) {
        wk_cfg_print_sample(wrk_opts, WRK_NOPTS, stdout);
        wk_cfg_free(cfg);
        return 0;
    }
    int rc = 2;
    wrk_worker *w = NULL;
    wrk_main_conf c;
    memset(&c, 0, sizeof(c));
    wk_cfg_fill(cfg, wrk_binds, WRK_NBINDS, &c);
    if (wk_cfg_npos(cfg) > 0) {
        fprintf(stderr, "wkvm-workerd: unexpected argument '%s'\n", wk_cfg_pos(cfg, 0));
        goto out;
    }
    const char *quant = c.quantize;
    if (quant == NULL || (strcmp(quant, "none") != 0 && strcmp(quant, "q8_0") != 0)) {
        fprintf(stderr, "wkvm-workerd: --quantize %s: none or q8_0\n", quant ? quant : "");
        goto out;
    }
    const char *mm = c.cpu_matmul;
    if (mm == NULL || (strcmp(mm, "fp32") != 0 && strcmp(mm, "bf16") != 0)) {
        fprintf(stderr, "wkvm-workerd: --cpu-matmul %s: fp32 or bf16\n", mm ? mm : "");
        goto out;
    }
    const bool mm_bf16 = strcmp(mm, "bf16") == 0;
    if (wk_log_set_level_name(c.log_level) != WK_OK) {
        fprintf(stderr, "wkvm-workerd: unknown log level '%s'\n", c.log_level);
        goto out;
    }
    const be_ops *ops = be_ops_find(c.backend);
    if (ops == NULL) {
        fprintf(stderr, "wkvm-workerd: backend '%s' is not available (built: cpu%s)\n",
                c.backend, be_cuda_ops_get() ? ", cuda" : "");
        goto out;
    }
    const be_cpu_matmul engine = mm_bf16 ? be_cpu_bf16_engine() : BE_CPU_MATMUL_FP32;
    if (mm_bf16 && (strcmp(ops->name, "cpu") != 0 || engine == BE_CPU_MATMUL_FP32)) {
        fprintf(stderr, "wkvm-workerd: --cpu-matmul bf16 needs the cpu backend on a CPU with "
                        "AMX-BF16 tiles or AVX512_BF16 (%s); use --cpu-matmul fp32\n",
                strcmp(ops->name, "cpu") != 0 ? "backend is not cpu"
                                               : "neither in this CPU, kernel and build");
        goto out;
    }
    char data_dir[2048], url[2200], id[64];
    const char *home = getenv("HOME");
    if (c.data_dir != NULL)
        snprintf(data_dir, sizeof(data_dir), "%s", c.data_dir);
    else
        snprintf(data_dir, sizeof(data_dir), "%s/.local/share/wkvm", home ? home : ".");
    if (c.link_url != NULL)
        snprintf(url, sizeof(url), "%s", c.link_url);
    else
        snprintf(url, sizeof(url), "ipc://%s/controller.ipc", data_dir);
    if (wrk_main_check_url(&c, url) != 0)
        goto out;
    if (c.id != NULL) {
        const char *s = c.id;
        if (strlen(s) == 0 || strlen(s) >= sizeof(id) || strspn(s,
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") != strlen(s)) {
            fprintf(stderr, "wkvm-workerd: --id must be 1..63 of [A-Za-z0-9._-]\n");
            goto out;
        }
        snprintf(id, sizeof(id), "%s", s);
    } else {
        snprintf(id, sizeof(id), "w%d", (int)getpid());
    }
    uint64_t host_cache = c.host_cache;
    if (!wk_cfg_is_set(cfg, "host-cache-bytes")) {
        /* Above the controller's default checkpoint budget (25%): room for hibernated states. */
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        uint64_t part = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 8 * 3 : 0;
        if (part < (1ull << 30))
            part = 1ull << 30;
        if (part < host_cache)
            host_cache = part;
    }
    wrk_rpc_config rc_cfg = {
        .controller_url = url,
        .tls_ca = c.tls_ca,
        .tls_cert = c.tls_cert,
        .tls_key = c.tls_key,
        .tls_server_name = c.tls_server_name,
        .worker_id = id,
        .backend = ops,
        .device = (int)c.device,
        .threads = c.threads,
        .fp32 = c.fp32,
        .quantize_q8_0 = strcmp(quant, "q8_0") == 0,
        .matmul_bf16 = mm_bf16,
        .matmul_dp = engine == BE_CPU_MATMUL_BF16_DP,
        .vocab_path = c.vocab,
        .host_cache_bytes = host_cache,
        .kv_pages = c.kv_pages,
        .link_silence_ms = c.link_silence_s * 1000u,
    };
    rc = 1;
    if (wrk_worker_new(&rc_cfg, &w, &d) != WK_OK) {
        fprintf(stderr, "wkvm-workerd: %s\n", d.msg);
        goto out;
    }
    if (c.model != NULL) {
        uint32_t slots = c.slots + 1;
        if (wrk_worker_load(w, c.model, slots, &d) != WK_OK) {
            fprintf(stderr, "wkvm-workerd: %s\n", d.msg);
            goto out;
        }
        wk_log_info("model loaded model=%s slots=%u", c.model, slots - 1);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = wrk_on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (wrk_worker_serve(w, &wrk_stop, &d) != WK_OK) {
        fprintf(stderr, "wkvm-workerd: %s\n", d.msg);
        goto out;
    }
    wk_log_info("stopped worker=%s", id);
    rc = 0;
out:
    wrk_worker_free(w);
    wk_cfg_free(cfg);
    return rc;
}
