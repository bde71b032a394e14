/*
 * ctl_pool: the worker registry and the only NNG user in the controller.
 *
 * Workers dial the controller's listen URL (pair1, polyamorous here) and say
 * Hello on every connect. The pool keeps one record per worker id, learns
 * when a worker's pipe closes (it leaves the registry), loads the configured
 * model into each new worker, polls Stats as a heartbeat, and offers a
 * blocking request/reply call to the rest of the controller.
 *
 * Threading: all functions are thread-safe. ctl_pool_call() blocks the
 * calling thread until the reply or the timeout; it must not be called from
 * the pool's own threads.
 */
#ifndef CTL_POOL_H
#define CTL_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "wk_err.h"
#include "wk_proto.h"

typedef struct ctl_pool ctl_pool;

typedef enum ctl_worker_state {
    CTL_WORKER_STATE_LOADING = 0, /* connected, model being loaded */
    CTL_WORKER_STATE_READY,       /* model loaded (or none configured), serving */
    CTL_WORKER_STATE_FAILED,      /* model load failed; see detail */
    CTL_WORKER_STATE_UNHEALTHY,   /* heartbeat missed */
} ctl_worker_state;

/* A copy of one worker's record, for readers outside the pool. */
typedef struct ctl_worker_view {
    char id[65];              /* worker id */
    char backend[16];         /* "cpu", "cuda" */
    char device[128];         /* device name */
    char hostname[128];       /* host */
    uint32_t pid;             /* worker pid */
    uint64_t device_mem;      /* bytes */
    ctl_worker_state state;   /* lifecycle */
    char detail[256];         /* last error, "" when none */
    uint32_t slots_total;     /* usable slots (arena minus slot 0) */
    uint32_t slots_used;      /* slots the controller has bound */
    bool model_loaded;        /* the worker has a model */
    char model_name[128];     /* model dir base name */
    char fingerprint[65];     /* model fingerprint */
    char family[16];          /* model family ("rwkv7", "mamba2", "gdn") */
    uint64_t state_bytes;     /* bytes per slot (hybrid: the fixed recurrent part) */
    uint64_t kv_token_bytes;  /* hybrid models: KV bytes per token, 0 = none */
    uint32_t kv_page_tokens;  /* hybrid models: tokens per KV page */
    uint32_t kv_pages;        /* hybrid models: pages in the worker's KV pool */
    uint32_t kv_pages_free;   /* hybrid models: pages no slot holds (last Stats) */
    uint32_t kv_pages_reserved; /* hybrid models: pages the scheduler has handed out (admin only) */
    uint32_t n_layer;         /* model layers */
    uint32_t n_embd;          /* model width C */
    uint32_t n_head;          /* heads H */
    uint32_t head_size;       /* head size N */
    char vocab_digest[65];    /* tokenizer digest */
    uint32_t load_permille;   /* model load progress while loading, 0..1000 */
    char load_phase[32];      /* what the load is doing */
    uint64_t steps;           /* steps run (last Stats) */
    uint64_t tokens;          /* tokens processed (last Stats) */
    uint64_t connected_ms;    /* ms since epoch when this connection started */
    uint64_t host_cache_bytes; /* warm-tier capacity (Hello, Stats), 0 = unknown */
    uint32_t device_index;    /* CUDA ordinal (0 for cpu) */
    char device_uuid[65];     /* "GPU-<uuid>", "" when unknown (cpu, older worker) */
    char pci_bus_id[65];      /* "0000:3b:00.0", "" when unknown */
    bool nccl;                /* the worker can move slots with NCCL (Hello.nccl) */
} ctl_worker_view;

typedef struct ctl_pool_config {
    const char *listen_url;  /* "ipc:///path", "tcp://127.0.0.1:7070", "tls+tcp://0.0.0.0:7443" */
    const char *tls_ca;      /* tls+tcp: CA file (PEM) a worker's certificate must chain to */
    const char *tls_cert;    /* tls+tcp: the controller's certificate file (PEM) */
    const char *tls_key;     /* tls+tcp: the controller's private key file (PEM) */
    const char *model_dir;   /* model every worker should run, NULL = none */
    uint32_t slots;          /* arena slots per worker (usable), when loading a model */
    uint32_t heartbeat_ms;   /* Stats poll period */
    uint32_t load_timeout_ms; /* LoadModel deadline */
} ctl_pool_config;

/*
 * Starts listening and the pool threads. cfg strings are copied.
 * Caller frees with ctl_pool_free(). WK_EIO (cannot listen; diag says why).
 */
WK_MUST_CHECK wk_err ctl_pool_new(const ctl_pool_config *cfg, ctl_pool **out, wk_diag *d);

/*
 * Stops the manager (no heartbeat or load request is sent after it returns;
 * replies still arrive). The first half of ctl_pool_free(), for a caller that
 * quiets the link before its peer goes: a link torn down with no message in
 * flight avoids libnng's close hang (wk_nng.h). NULL-safe, idempotent.
 */
void ctl_pool_stop(ctl_pool *p);

#define CTL_POOL_CLOSE_MS 2000u

/*
 * Stops threads, closes the socket (waiting at most CTL_POOL_CLOSE_MS; a close
 * that hangs leaves the pool's record to libnng, logged), frees. NULL-safe.
 */
void ctl_pool_free(ctl_pool *p);

/*
 * Copies up to cap worker records into out (sorted by id); returns the count
 * of workers (may exceed cap).
 */
size_t ctl_pool_list(ctl_pool *p, ctl_worker_view *out, size_t cap);

/*
 * The connection epoch of worker id (its connected_ms: a restarted worker
 * process gets a new one, and what lived in its memory, slots and warm
 * copies, is gone), 0 when it is not connected.
 */
uint64_t ctl_pool_worker_epoch(ctl_pool *p, const char *id);

/* Worker id's warm-tier capacity (--host-cache-bytes), 0 = unknown or no such worker. */
uint64_t ctl_pool_worker_host_cache(ctl_pool *p, const char *id);

/*
 * The served model as a worker reports it: a copy of the first ready worker
 * with a model loaded. WK_EUNAVAIL when there is none.
 */
WK_MUST_CHECK wk_err ctl_pool_model_view(ctl_pool *p, ctl_worker_view *out);

/* Number of workers in CTL_WORKER_STATE_READY. */
size_t ctl_pool_ready_count(ctl_pool *p);

/* One fp32 tensor of the served model's slot layout (ModelInfo.state_tensors). */
typedef struct ctl_state_tensor {
    char name[128];     /* "layers.3.ssm" */
    uint32_t ndim;      /* 1..4 */
    uint64_t shape[4];  /* elements per dimension */
} ctl_state_tensor;

/*
 * A malloc'd copy of the slot layout of a ready worker with the model (*n
 * entries; caller frees *out). WK_EUNAVAIL: no such worker; WK_ENOENT: it
 * sent no layout (an older worker: RWKV-7); WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_pool_model_layout(ctl_pool *p, ctl_state_tensor **out, uint32_t *n);

/*
 * Sends req (borrowed; its id is assigned here) to worker_id and waits up to
 * timeout_ms for the reply. On success *reply is owned by the caller
 * (wk_proto_free) and carries status 0; a worker error comes back as that
 * error code with the worker's detail in the diag. WK_ENOENT (no such
 * worker), WK_ETIMEDOUT, WK_EUNAVAIL (worker left meanwhile), WK_EPROTO.
 */
WK_MUST_CHECK wk_err ctl_pool_call(ctl_pool *p, const char *worker_id, wk_msg *req,
                                   uint32_t timeout_ms, wk_msg **reply, wk_diag *d);

/*
 * One warm-tier request to worker_id, waiting up to timeout_ms: kind
 * WKVM__KIND__HOST_PUT (slot -> entry key), HOST_GET (entry -> slot) or
 * HOST_DROP (slot ignored). Keys are 1..128 bytes; each caller uses its own
 * prefix. Returns the worker's status (WK_ENOSPC: its host cache is full;
 * WK_ENOENT: no entry) or ctl_pool_call()'s errors.
 */
WK_MUST_CHECK wk_err ctl_pool_host_call(ctl_pool *p, int kind, const char *worker_id,
                                        const char *key, uint32_t slot, uint32_t timeout_ms,
                                        wk_diag *d);

/* Counters for /metrics. */
typedef struct ctl_pool_stats {
    uint64_t registrations; /* Hello messages accepted */
    uint64_t departures;    /* worker connections that closed */
    uint64_t rpc_calls;     /* ctl_pool_call requests sent */
    uint64_t rpc_errors;    /* calls that failed or timed out */
    uint64_t bad_messages;  /* messages refused by wk_proto_decode */
} ctl_pool_stats;

void ctl_pool_stats_get(ctl_pool *p, ctl_pool_stats *out);

const char *ctl_worker_state_name(ctl_worker_state s);

#endif /* CTL_POOL_H */
