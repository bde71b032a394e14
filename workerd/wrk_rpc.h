/*
 * wrk_rpc: the worker's side of the controller protocol and the only NNG
 * user in the worker. It dials the controller (reconnecting forever), says
 * Hello on every connect, and executes requests one at a time against the
 * worker's model and backend. It keeps no session logic.
 */
#ifndef WRK_RPC_H
#define WRK_RPC_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/be.h"
#include "wk_err.h"
#include "wrk_model.h"

typedef struct wrk_rpc_config {
    const char *controller_url; /* ipc://, tcp:// or tls+tcp:// */
    const char *tls_ca;         /* tls+tcp: CA file (PEM) the controller's certificate must
                                   chain to; borrowed for the worker's life, as the next three */
    const char *tls_cert;       /* tls+tcp: this worker's certificate file (PEM) */
    const char *tls_key;        /* tls+tcp: this worker's private key file (PEM) */
    const char *tls_server_name; /* tls+tcp: the name the controller's certificate must carry,
                                    NULL = the URL's host */
    const char *worker_id;      /* stable id ("w0") */
    const be_ops *backend;      /* backend used for models */
    int device;                 /* CUDA ordinal */
    uint32_t threads;           /* CPU threads, 0 = all */
    bool fp32;                  /* keep weights in fp32 */
    bool quantize_q8_0;         /* quantize the matrices to Q8_0 at load */
    bool matmul_bf16;           /* --cpu-matmul bf16 (BF16 weights on AMX or AVX512-BF16) */
    bool matmul_dp;             /* ... on AVX512-BF16 dot products (no AMX here) */
    const char *vocab_path;     /* vocab override, NULL = model dir */
    uint64_t host_cache_bytes;  /* warm tier budget in host memory, 0 = none */
    uint32_t kv_pages;          /* hybrid models: KV pool pages, 0 = the backend's default */
    uint32_t link_silence_ms;   /* a connected link that brings nothing for this long ends
                                   wrk_worker_serve() with WK_ETIMEDOUT (the controller beats
                                   every second; a link libnng < 1.8 wedged stays silent for
                                   good), 0 = never */
} wrk_rpc_config;

typedef struct wrk_worker wrk_worker;

/* Creates the worker state (no model yet). Caller frees with wrk_worker_free(). */
WK_MUST_CHECK wk_err wrk_worker_new(const wrk_rpc_config *cfg, wrk_worker **out, wk_diag *d);
void wrk_worker_free(wrk_worker *w);

/*
 * Loads model_dir with n_slots arena slots (including slot 0), replacing any
 * model loaded before only on success. WK_EINVAL/WK_ENOENT/... with a diag.
 */
WK_MUST_CHECK wk_err wrk_worker_load(wrk_worker *w, const char *model_dir, uint32_t n_slots,
                                     wk_diag *d);

/*
 * Dials the controller and serves until *stop becomes non-zero. Returns
 * WK_OK on a requested stop (SIGTERM or a SHUTDOWN message), WK_EIO when the
 * socket cannot be set up, the controller's error when it refused the Hello.
 */
WK_MUST_CHECK wk_err wrk_worker_serve(wrk_worker *w, volatile sig_atomic_t *stop, wk_diag *d);

#endif /* WRK_RPC_H */
