/*
 * wrk_rpc: the worker's request loop over NNG pair1. Requests are handled
 * one at a time in arrival order on the calling thread, which is also the
 * only thread that touches the backend. Replies echo the request id.
 * Every incoming message is decoded and validated by wk_proto_decode()
 * before a handler sees it; handlers check slot indices against the arena.
 *
 * NCCL migration (MIGRATE_NCCL_ID / PREPARE / SEND / RECV / COMMIT) keeps at
 * most one migration per worker in w->mig; its blocking waits (communicator
 * setup, the transfer) carry the controller's deadline, and a migration
 * left half-done (controller gone) is aborted by the next PREPARE once it
 * is stale. Without NCCL (CPU backend, CPU-only build) these answer
 * WK_ENOTSUP and Hello says nccl = false.
 */
#define WK_LOG_MODULE "rpc"
#include "wrk_rpc.h"

#include <limits.h>
#include <nng/nng.h>
#include <nng/protocol/pair1/pair.h>
#include <nng/supplemental/tls/tls.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#include "be_nccl.h"
#include "wk_file.h"
#include "wk_log.h"
#include "wk_net.h"
#include "wk_nng.h"
#include "wk_proto.h"
#include "wk_sha256.h"
#include "wrk_host.h"
#include "wrk_sample.h"

#define WRK_MIG_STALE_MS 60000u /* a prepared migration older than its deadline plus this is dropped */

/* The NCCL migration this worker takes part in, if any. */
typedef struct wrk_mig {
    char id[129];          /* migration id, "" = none */
    bool send;             /* role: source (rank 0) or destination (rank 1) */
    uint32_t slot;         /* arena slot */
    uint64_t state_bytes;  /* bytes to move */
    uint32_t chunk;        /* bytes per ncclSend/ncclRecv, 0 = default */
    uint32_t timeout_ms;   /* deadline of each blocking wait, 0 = default */
    uint64_t since_ms;     /* monotonic ms when prepared */
    be_nccl *comm;         /* the pair's communicator, owned */
} wrk_mig;


struct wrk_worker {
    wrk_rpc_config cfg;        /* copied; strings below owned */
    char *controller_url;      /* owned */
    char *worker_id;           /* owned */
    char *vocab_path;          /* owned, may be NULL */
    wrk_model *model;          /* loaded model, NULL = none */
    be_ctx *be;                /* backend context for model */
    char *model_dir;           /* dir of model, owned */
    char device_name[128];     /* from probe */
    uint64_t device_mem;       /* from probe */
    nng_socket sock;           /* pair1 */
    nng_dialer dialer;         /* the controller link's dialer (replaced by a redial) */
    atomic_bool need_hello;    /* a pipe was added */
    atomic_int pipes;          /* controller connections up now */
    uint64_t steps;            /* steps run */
    uint64_t step_us;          /* microseconds in steps */
    uint64_t tokens;           /* tokens processed */
    uint64_t start_ms;         /* monotonic start */
    float *logits;             /* scratch, rows_cap * vocab */
    uint32_t load_permille;    /* last model-load progress reported */
    const char *load_phase;    /* its phase (a string literal), NULL before the first */
    wrk_host *host;            /* the warm tier (wrk_host.h), owned */
    bool connected;            /* the socket is set up (progress may be sent) */
    size_t logits_cap;         /* floats in logits */
    uint8_t *io;               /* scratch for slot reads (WK_PROTO_CHUNK_MAX), kept: a
                                  fresh 4 MiB buffer per chunk was page faults each time */
    Wkvm__StateTensor *st;     /* the model's slot layout for ModelInfo, owned */
    Wkvm__StateTensor **st_ptrs; /* pointers into st */
    wrk_state_tensor *st_src;  /* names and shapes st points into, owned */
    uint64_t *st_shapes;       /* shapes st points into, owned */
    size_t n_st;               /* entries */
    bool nccl;                 /* NCCL migration possible (cuda backend, NCCL, device) */
    char device_uuid[65];      /* "GPU-<uuid>" for Hello, "" when unknown */
    char pci_bus_id[65];       /* PCI bus id for Hello, "" when unknown */
    wrk_mig mig;               /* the NCCL migration in progress */
    atomic_uint_fast64_t busy_since_ms; /* when the message in hand began (monotonic), 0: idle */
    atomic_bool beat_stop;     /* the busy-beat thread ends */
};

/* Drops the ModelInfo copy of the slot layout. */
static void
wrk_layout_free(wrk_worker *w)
{
    free(w->st);
    free(w->st_ptrs);
    free(w->st_src);
    free(w->st_shapes);
    w->st = NULL;
    w->st_ptrs = NULL;
    w->st_src = NULL;
    w->st_shapes = NULL;
    w->n_st = 0;
}

/* Builds the ModelInfo copy of m's slot layout. */
static wk_err
wrk_layout_build(wrk_worker *w, const wrk_model *m)
{
    size_t n = wrk_model_state_layout(m, NULL, 0);
    wrk_layout_free(w);
    if (n == 0)
        return WK_OK;
    w->st_src = calloc(n, sizeof(*w->st_src));
    w->st = calloc(n, sizeof(*w->st));
    w->st_ptrs = calloc(n, sizeof(*w->st_ptrs));
    w->st_shapes = calloc(n * WRK_STATE_MAX_DIMS, sizeof(uint64_t));
    if (w->st_src == NULL || w->st == NULL || w->st_ptrs == NULL || w->st_shapes == NULL) {
        wrk_layout_free(w);
        return WK_ENOMEM;
    }
    (void)wrk_model_state_layout(m, w->st_src, n);
    for (size_t i = 0; i < n; i++) {
        wkvm__state_tensor__init(&w->st[i]);
        w->st[i].name = w->st_src[i].name;
        w->st[i].n_shape = w->st_src[i].ndim;
        w->st[i].shape = w->st_shapes + i * WRK_STATE_MAX_DIMS;
        for (uint32_t k = 0; k < w->st_src[i].ndim; k++)
            w->st[i].shape[k] = w->st_src[i].shape[k];
        w->st_ptrs[i] = &w->st[i];
    }
    w->n_st = n;
    return WK_OK;
}

static uint64_t
wrk_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

wk_err
wrk_worker_new(const wrk_rpc_config *cfg, wrk_worker **out, wk_diag *d)
{
    wrk_worker *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return WK_ENOMEM;
    w->cfg = *cfg;
    w->controller_url = strdup(cfg->controller_url);
    w->worker_id = strdup(cfg->worker_id);
    w->vocab_path = cfg->vocab_path ? strdup(cfg->vocab_path) : NULL;
    atomic_init(&w->need_hello, false);
    atomic_init(&w->pipes, 0);
    w->start_ms = wrk_now_us() / 1000u;
    w->host = wrk_host_new(cfg->host_cache_bytes, 0);
    if (w->host == NULL || w->controller_url == NULL || w->worker_id == NULL ||
        (cfg->vocab_path && w->vocab_path == NULL)) {
        wrk_worker_free(w);
        return WK_ENOMEM;
    }
    wk_err err = cfg->backend->probe(cfg->device, w->device_name, sizeof(w->device_name),
                                     &w->device_mem);
    if (err != WK_OK) {
        wrk_worker_free(w);
        wk_diag cd = {{0}};
        if (strcmp(cfg->backend->name, "cuda") == 0 &&
            be_cuda_device_check(cfg->device, &cd) != WK_OK)
            return wk_diag_set(d, err, "backend cuda: %s", cd.msg); /* the runtime's reason */
        return wk_diag_set(d, err, "backend %s: no device %d", cfg->backend->name,
                           cfg->device);
    }
    if (strcmp(cfg->backend->name, "cuda") == 0) {
        /* Unknown ids stay "": the controller then compares host and ordinal. */
        if (be_nccl_device_ids(cfg->device, w->device_uuid, sizeof(w->device_uuid),
                               w->pci_bus_id, sizeof(w->pci_bus_id)) != WK_OK)
            w->device_uuid[0] = w->pci_bus_id[0] = '\0';
        w->nccl = be_nccl_available(cfg->device);
    }
    *out = w;
    return WK_OK;
}

/* Ends the NCCL migration in progress (aborting its communicator when abort). */
static void
wrk_mig_end(wrk_worker *w, bool abort)
{
    be_nccl_close(w->mig.comm, abort);
    memset(&w->mig, 0, sizeof(w->mig));
}

static void wrk_kv_info(const wrk_worker *w, be_kv_info *out);

/* The backend's slot_read / slot_write as wrk_host's callbacks (arg: the worker). */
static wk_err
wrk_host_rd(void *arg, uint32_t slot, uint64_t off, void *buf, size_t len)
{
    wrk_worker *w = arg;
    return w->cfg.backend->slot_read(w->be, slot, off, buf, len);
}

static wk_err
wrk_host_wr(void *arg, uint32_t slot, uint64_t off, const void *buf, size_t len)
{
    wrk_worker *w = arg;
    return w->cfg.backend->slot_write(w->be, slot, off, buf, len);
}

void
wrk_worker_free(wrk_worker *w)
{
    if (w == NULL)
        return;
    wrk_mig_end(w, true);
    if (w->be != NULL)
        w->cfg.backend->close(w->be);
    wrk_model_free(w->model);
    wrk_layout_free(w);
    free(w->model_dir);
    free(w->controller_url);
    free(w->worker_id);
    free(w->vocab_path);
    free(w->logits);
    free(w->io);
    wrk_host_free(w->host);
    free(w);
}

static void wrk_send(wrk_worker *w, const wk_msg *m);

/*
 * Model-load progress: logged every 10% and at each new phase, and sent to
 * the controller (id 0). Never goes backwards. Phases: reading weights
 * (0..90%), packing weights (95%), loaded (100%).
 */
static void
wrk_load_progress(void *arg, const char *phase, double frac)
{
    wrk_worker *w = arg;
    uint32_t permille = frac >= 1.0 ? 1000u : frac <= 0.0 ? 0u : (uint32_t)(frac * 1000.0);
    bool new_phase = w->load_phase == NULL || strcmp(phase, w->load_phase) != 0;
    if (permille < w->load_permille)
        permille = w->load_permille;
    if (!new_phase && permille / 100 == w->load_permille / 100 && permille != 1000 &&
        w->load_permille != 0)
        return;
    if (!new_phase && permille == w->load_permille)
        return;
    w->load_permille = permille;
    w->load_phase = phase;
    wk_log_info("model load progress=%u%% phase=\"%s\"", permille / 10, phase);
    if (!w->connected)
        return;
    Wkvm__StatsReply s = WKVM__STATS_REPLY__INIT;
    s.load_permille = permille;
    s.load_phase = (char *)phase;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.id = 0;
    m.kind = WKVM__KIND__STATS_REPLY;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_STATS_REPLY;
    m.stats_reply = &s;
    wrk_send(w, &m);
}

/* Reading the checkpoint is the first 90% of a load. */
static void
wrk_load_read_progress(void *arg, const char *phase, double frac)
{
    wrk_load_progress(arg, phase, frac * 0.9);
}

wk_err
wrk_worker_load(wrk_worker *w, const char *model_dir, uint32_t n_slots, wk_diag *d)
{
    if (n_slots < 2)
        return wk_diag_set(d, WK_EINVAL, "n_slots %u: need at least 2 (slot 0 is reserved)",
                           n_slots);
    if (w->model != NULL && strcmp(w->model_dir, model_dir) == 0 &&
        w->cfg.backend->n_slots(w->be) == n_slots)
        return WK_OK;
    wrk_model_opts mo = {.fp32 = w->cfg.fp32, .quantize_q8_0 = w->cfg.quantize_q8_0,
                         .matmul_bf16 = w->cfg.matmul_bf16,
                         .matmul_dp = w->cfg.matmul_dp,
                         .vocab_path = w->vocab_path,
                         .progress = wrk_load_read_progress, .progress_arg = w};
    w->load_permille = 0;
    w->load_phase = NULL;
    wrk_model *m = NULL;
    wk_err err = wrk_model_load(model_dir, &mo, &m, d);
    if (err != WK_OK)
        return err;
    be_config bc = {
        .n_slots = n_slots,
        .n_threads = w->cfg.threads,
        .device = w->cfg.device,
        .max_step_rows = WK_PROTO_ROWS_MAX,
        .max_step_tokens = WK_PROTO_STEP_TOKENS_MAX,
        .kv_pages = w->cfg.kv_pages,
    };
    be_ctx *be = NULL;
    wrk_load_progress(w, "packing weights", 0.95);
    err = w->cfg.backend->open(&bc, m, &be, d);
    if (err != WK_OK) {
        wrk_model_free(m);
        return err;
    }
    char *dir = strdup(model_dir);
    if (dir == NULL) {
        w->cfg.backend->close(be);
        wrk_model_free(m);
        return WK_ENOMEM;
    }
    if (wrk_layout_build(w, m) != WK_OK) { /* (the old model's layout is gone too) */
        w->cfg.backend->close(be);
        wrk_model_free(m);
        free(dir);
        return WK_ENOMEM;
    }
    wrk_mig_end(w, true); /* its slot pointers belong to the old arena */
    if (w->be != NULL)
        w->cfg.backend->close(w->be);
    wrk_model_free(w->model);
    free(w->model_dir);
    w->model = m;
    w->be = be;
    w->model_dir = dir;
    /* warm copies belong to the old model; the new one's image geometry (KV rows shared) */
    be_kv_info kv;
    wrk_kv_info(w, &kv);
    if (wrk_host_reset(w->host, w->cfg.backend->slot_bytes(be), kv.kv_token_bytes,
                       w->cfg.backend->n_slots(be)) != WK_OK)
        wk_log_warn("warm tier: no memory for the slots' lineages");
    wrk_load_progress(w, "loaded", 1.0);
    return WK_OK;
}

static void
wrk_fill_model_info(const wrk_worker *w, Wkvm__ModelInfo *mi)
{
    const wrk_model_info *info = wrk_model_info_get(w->model);
    wkvm__model_info__init(mi);
    mi->family = (char *)info->family;
    mi->name = (char *)info->name;
    mi->n_layer = info->n_layer;
    mi->n_embd = info->n_embd;
    mi->n_head = info->n_head;
    mi->head_size = info->head_size;
    mi->ffn_dim = info->ffn_dim;
    mi->vocab_size = info->vocab_size;
    mi->dtype = (char *)wk_dtype_name(info->dtype);
    mi->n_params = info->n_params;
    mi->weight_bytes = info->weight_bytes;
    mi->state_bytes = info->state_bytes;
    mi->weights_digest = (char *)info->weights_digest;
    mi->vocab_digest = (char *)info->vocab_digest;
    mi->fingerprint = (char *)info->fingerprint;
    mi->n_slots = w->cfg.backend->n_slots(w->be);
    mi->n_state_tensors = w->n_st;
    mi->state_tensors = w->st_ptrs;
    if (w->cfg.backend->kv_info != NULL) {
        be_kv_info kv = {0};
        w->cfg.backend->kv_info(w->be, &kv);
        mi->kv_token_bytes = kv.kv_token_bytes;
        mi->kv_page_tokens = kv.page_tokens;
        mi->kv_pages = kv.pages_total;
    }
}

/*
 * Packs m straight into an NNG message and sends it (NNG takes the message):
 * one allocation and one copy of the payload, where encoding to a buffer and
 * nng_send() made two of each (a SLOT_DATA chunk is 4 MiB).
 */
static void
wrk_send(wrk_worker *w, const wk_msg *m)
{
    size_t len = 0;
    nng_msg *msg = NULL;
    if (wk_proto_encoded_size(m, &len) != WK_OK || nng_msg_alloc(&msg, len) != 0) {
        wk_log_error("cannot encode reply kind=%s", wk_proto_kind_name(m->kind));
        return;
    }
    size_t wrote = wk_proto_encode_into(m, nng_msg_body(msg));
    if (wrote != len) { /* (protobuf-c packs exactly its packed size) */
        nng_msg_free(msg);
        wk_log_error("cannot encode reply kind=%s", wk_proto_kind_name(m->kind));
        return;
    }
    int rv = nng_sendmsg(w->sock, msg, 0);
    if (rv != 0) {
        nng_msg_free(msg); /* (not taken on failure) */
        wk_log_warn("send failed kind=%s: %s", wk_proto_kind_name(m->kind), nng_strerror(rv));
    }
}

static void
wrk_reply_status(wrk_worker *w, const wk_msg *req, int kind, wk_err err, const char *detail)
{
    wk_msg r = WKVM__ENVELOPE__INIT;
    r.id = req->id;
    r.kind = kind;
    r.status = (int32_t)err;
    r.detail = (char *)(detail ? detail : "");
    wrk_send(w, &r);
}

static void
wrk_send_hello(wrk_worker *w)
{
    char host[128] = "";
    gethostname(host, sizeof(host) - 1);
    Wkvm__Hello h = WKVM__HELLO__INIT;
    Wkvm__ModelInfo mi;
    h.worker_id = w->worker_id;
    h.backend = (char *)w->cfg.backend->name;
    h.device = w->device_name;
    h.device_mem_bytes = w->device_mem;
    h.protocol_version = WK_PROTO_VERSION;
    h.pid = (uint32_t)getpid();
    h.hostname = host;
    h.device_index = (uint32_t)(w->cfg.device < 0 ? 0 : w->cfg.device);
    h.device_uuid = w->device_uuid;
    h.pci_bus_id = w->pci_bus_id;
    h.nccl = w->nccl;
    h.host_cache_bytes = w->cfg.host_cache_bytes;
    if (w->model != NULL) {
        h.model_dir = w->model_dir;
        h.model_loaded = true;
        wrk_fill_model_info(w, &mi);
        h.model = &mi;
    }
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__HELLO;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_HELLO;
    m.hello = &h;
    wrk_send(w, &m);
    wk_log_info("hello sent worker=%s backend=%s nccl=%s model=%s", w->worker_id, h.backend,
                w->nccl ? "yes" : "no", w->model_dir ? w->model_dir : "-");
}

static bool
wrk_slot_ok(const wrk_worker *w, uint32_t slot)
{
    return w->be != NULL && slot > 0 && slot < w->cfg.backend->n_slots(w->be);
}

/* The bytes of slot's image now: slot_size, or slot_bytes for fixed-size families. */
static uint64_t
wrk_slot_size(const wrk_worker *w, uint32_t slot)
{
    const be_ops *ops = w->cfg.backend;
    return ops->slot_size ? ops->slot_size(w->be, slot) : ops->slot_bytes(w->be);
}

/* The KV pool's geometry and occupancy (all zero without KV or without a model). */
static void
wrk_kv_info(const wrk_worker *w, be_kv_info *out)
{
    memset(out, 0, sizeof(*out));
    if (w->be != NULL && w->cfg.backend->kv_info != NULL)
        w->cfg.backend->kv_info(w->be, out);
}

/*
 * Sets slot's image size to bytes before a whole image is written (SlotWrite
 * at offset 0 with total_bytes, HOST_GET). Without slot_resize only the
 * fixed size is accepted. WK_EQUOTA (the KV pool can't hold it) and
 * WK_EINVAL carry a detail for the controller.
 */
static wk_err
wrk_slot_resize(wrk_worker *w, uint32_t slot, uint64_t bytes, char *detail, size_t dlen)
{
    const be_ops *ops = w->cfg.backend;
    if (ops->slot_resize == NULL) {
        if (bytes == ops->slot_bytes(w->be))
            return WK_OK;
        snprintf(detail, dlen, "slot %u: image of %llu bytes, this model's slots hold %llu", slot,
                 (unsigned long long)bytes, (unsigned long long)ops->slot_bytes(w->be));
        return WK_EINVAL;
    }
    wk_err err = ops->slot_resize(w->be, slot, bytes);
    if (err == WK_EQUOTA) {
        be_kv_info kv;
        wrk_kv_info(w, &kv);
        snprintf(detail, dlen, "KV pool full: slot %u needs %llu bytes, %u of %u pages free",
                 slot, (unsigned long long)bytes, kv.pages_free, kv.pages_total);
    } else if (err != WK_OK) {
        snprintf(detail, dlen, "slot %u: cannot size the image to %llu bytes (%s)", slot,
                 (unsigned long long)bytes, wk_strerror(err));
    }
    return err;
}

static void
wrk_handle_load(wrk_worker *w, const wk_msg *req)
{
    wk_diag d = {{0}};
    /* (usable slots, as the controller counts them: the arena's slot 0 is reserved) */
    wk_log_info("load model=%s slots=%u", req->load_model->model_dir,
                req->load_model->n_slots ? req->load_model->n_slots - 1 : 0);
    if (req->load_model->vocab_path[0] != '\0') {
        free(w->vocab_path);
        w->vocab_path = strdup(req->load_model->vocab_path);
    }
    wk_err err = wrk_worker_load(w, req->load_model->model_dir, req->load_model->n_slots, &d);
    if (err != WK_OK) {
        wk_log_error("model load failed: %s", d.msg);
        wrk_reply_status(w, req, WKVM__KIND__MODEL_INFO, err, d.msg);
        return;
    }
    const wrk_model_info *li = wrk_model_info_get(w->model);
    if (li->n_skipped > 0) /* a vision tower, MTP layers: present, not served */
        wk_log_info("model family=%s skipped=%u tensors (not served: vision tower, MTP layers)",
                    li->family, li->n_skipped);
    if (w->cfg.backend->describe != NULL) { /* what runs (the CPU path really chosen) */
        char desc[256] = "";
        w->cfg.backend->describe(w->be, desc, sizeof(desc));
        wk_log_info("backend worker=%s %s", w->worker_id, desc);
    }
    Wkvm__ModelInfo mi;
    wrk_fill_model_info(w, &mi);
    wk_msg r = WKVM__ENVELOPE__INIT;
    r.id = req->id;
    r.kind = WKVM__KIND__MODEL_INFO;
    r.payload_case = WKVM__ENVELOPE__PAYLOAD_MODEL_INFO;
    r.model_info = &mi;
    wrk_send(w, &r);
}

static void
wrk_handle_stats(wrk_worker *w, const wk_msg *req)
{
    Wkvm__StatsReply s = WKVM__STATS_REPLY__INIT;
    s.slots_total = w->be ? w->cfg.backend->n_slots(w->be) - 1 : 0;
    s.steps = w->steps;
    s.step_us_total = w->step_us;
    s.tokens = w->tokens;
    s.model_loaded = w->model != NULL;
    s.model_fingerprint = w->model ? (char *)wrk_model_info_get(w->model)->fingerprint : "";
    s.uptime_ms = wrk_now_us() / 1000u - w->start_ms;
    s.host_cache_bytes = w->cfg.host_cache_bytes;
    if (w->model != NULL) {
        const wrk_model_info *mi = wrk_model_info_get(w->model);
        s.host_mem_used = mi->weight_bytes + mi->state_bytes * (uint64_t)(s.slots_total + 1) +
                          wrk_host_bytes(w->host);
        be_kv_info kv;
        wrk_kv_info(w, &kv);
        s.kv_pages_free = kv.pages_free;
    }
    wk_msg r = WKVM__ENVELOPE__INIT;
    r.id = req->id;
    r.kind = WKVM__KIND__STATS_REPLY;
    r.payload_case = WKVM__ENVELOPE__PAYLOAD_STATS_REPLY;
    r.stats_reply = &s;
    wrk_send(w, &r);
}

static void
wrk_handle_slot_op(wrk_worker *w, const wk_msg *req)
{
    wk_err err = WK_OK;
    char detail[128] = "";
    const be_ops *ops = w->cfg.backend;
    if (w->be == NULL) {
        wrk_reply_status(w, req, WKVM__KIND__ACK, WK_ESTATE, "no model loaded");
        return;
    }
    switch (req->kind) {
    case WKVM__KIND__SLOT_RESET:
    case WKVM__KIND__SLOT_FREE: {
        uint32_t s = req->kind == WKVM__KIND__SLOT_RESET ? req->slot_reset->slot
                                                         : req->slot_free->slot;
        if (!wrk_slot_ok(w, s))
            err = WK_EINVAL;
        else
            err = ops->slot_reset(w->be, s);
        snprintf(detail, sizeof(detail), "slot %u", s);
        break;
    }
    case WKVM__KIND__SLOT_COPY:
        if (!wrk_slot_ok(w, req->slot_copy->src) || !wrk_slot_ok(w, req->slot_copy->dst) ||
            req->slot_copy->src == req->slot_copy->dst)
            err = WK_EINVAL;
        else
            err = ops->slot_copy(w->be, req->slot_copy->dst, req->slot_copy->src);
        if (err == WK_EQUOTA)
            snprintf(detail, sizeof(detail), "KV pool full: copy %u -> %u", req->slot_copy->src,
                     req->slot_copy->dst);
        else
            snprintf(detail, sizeof(detail), "copy %u -> %u", req->slot_copy->src,
                     req->slot_copy->dst);
        break;
    case WKVM__KIND__SLOT_WRITE: {
        const Wkvm__SlotWrite *sw = req->slot_write;
        snprintf(detail, sizeof(detail), "slot %u write at %llu", sw->slot,
                 (unsigned long long)sw->offset);
        if (!wrk_slot_ok(w, sw->slot)) {
            err = WK_EINVAL;
            break;
        }
        /* The first chunk of a whole image sizes the slot (hybrid: its KV pages). */
        if (sw->offset == 0 && sw->total_bytes != 0 &&
            (err = wrk_slot_resize(w, sw->slot, sw->total_bytes, detail, sizeof(detail))) != WK_OK)
            break;
        uint64_t total = wrk_slot_size(w, sw->slot);
        if (sw->offset > total || sw->data.len > total - sw->offset)
            err = WK_EINVAL;
        else
            err = ops->slot_write(w->be, sw->slot, sw->offset, sw->data.data, sw->data.len);
        break;
    }
    default:
        err = WK_EPROTO;
    }
    wrk_reply_status(w, req, WKVM__KIND__ACK, err, err == WK_OK ? "" : detail);
}

/* The worker's slot-read scratch of WK_PROTO_CHUNK_MAX bytes (made once), NULL without memory. */
static uint8_t *
wrk_io_buf(wrk_worker *w)
{
    if (w->io == NULL)
        w->io = malloc(WK_PROTO_CHUNK_MAX);
    return w->io;
}

static void
wrk_handle_slot_read(wrk_worker *w, const wk_msg *req)
{
    const Wkvm__SlotRead *sr = req->slot_read;
    const bool host = w->be != NULL && sr->host_key[0] != '\0';
    uint64_t total = 0;
    if (host) {
        /* A warm-tier entry (the controller spills it to disk before dropping it). */
        if (!wrk_host_len(w->host, sr->host_key, &total)) {
            wrk_reply_status(w, req, WKVM__KIND__SLOT_DATA, WK_ENOENT, "no such host entry");
            return;
        }
    } else if (w->be == NULL || !wrk_slot_ok(w, sr->slot)) {
        wrk_reply_status(w, req, WKVM__KIND__SLOT_DATA, WK_EINVAL, "bad slot");
        return;
    } else {
        total = wrk_slot_size(w, sr->slot);
    }
    if (sr->offset > total) {
        wrk_reply_status(w, req, WKVM__KIND__SLOT_DATA, WK_EINVAL, "offset past the state");
        return;
    }
    size_t len = sr->length;
    if (len > total - sr->offset)
        len = (size_t)(total - sr->offset);
    /* A host entry's bytes go out as they are when one piece holds them (packed once,
       into the reply), else gathered in the scratch buffer. */
    uint8_t *buf = wrk_io_buf(w);
    const uint8_t *out = buf;
    if (buf == NULL) {
        wrk_reply_status(w, req, WKVM__KIND__SLOT_DATA, WK_ENOMEM, "out of memory");
        return;
    }
    wk_err err = WK_OK;
    if (host)
        err = wrk_host_read(w->host, sr->host_key, sr->offset, len, buf, &out);
    else if (len)
        err = w->cfg.backend->slot_read(w->be, sr->slot, sr->offset, buf, len);
    if (err != WK_OK) {
        wrk_reply_status(w, req, WKVM__KIND__SLOT_DATA, err, "slot read failed");
        return;
    }
    Wkvm__SlotData sd = WKVM__SLOT_DATA__INIT;
    sd.slot = sr->slot;
    sd.offset = sr->offset;
    sd.data.data = (uint8_t *)out;
    sd.data.len = len;
    sd.total_bytes = total;
    wk_msg r = WKVM__ENVELOPE__INIT;
    r.id = req->id;
    r.kind = WKVM__KIND__SLOT_DATA;
    r.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_DATA;
    r.slot_data = &sd;
    wrk_send(w, &r);
}

/*
 * MIGRATE_RECV: the destination's verification of a migrated slot. Replies
 * ACK with the hex SHA-256 of the slot's bytes in detail (the controller
 * compares it with the source's before it commits).
 */
/* The hex SHA-256 of slot's bytes (read back in chunks) into hex. */
static wk_err
wrk_slot_sha256(wrk_worker *w, uint32_t slot, char hex[WK_SHA256_HEX_LEN])
{
    uint64_t total = wrk_slot_size(w, slot);
    wk_sha256 h;
    if (wk_sha256_init(&h) != WK_OK)
        return WK_ENOMEM;
    uint8_t *buf = wrk_io_buf(w);
    wk_err err = buf ? WK_OK : WK_ENOMEM;
    for (uint64_t off = 0; err == WK_OK && off < total; off += WK_PROTO_CHUNK_MAX) {
        size_t n = total - off < WK_PROTO_CHUNK_MAX ? (size_t)(total - off) : WK_PROTO_CHUNK_MAX;
        err = w->cfg.backend->slot_read(w->be, slot, off, buf, n);
        if (err == WK_OK)
            wk_sha256_update(&h, buf, n);
    }
    if (err != WK_OK) {
        wk_sha256_fini(&h);
        return err;
    }
    uint8_t dg[WK_SHA256_LEN];
    wk_sha256_final(&h, dg);
    wk_sha256_to_hex(dg, hex);
    return WK_OK;
}

/* The device address of slot for an NCCL transfer. */
static wk_err
wrk_slot_device_ptr(wrk_worker *w, uint32_t slot, void **ptr)
{
    if (w->cfg.backend->slot_device_ptr == NULL)
        return WK_ENOTSUP;
    return w->cfg.backend->slot_device_ptr(w->be, slot, ptr);
}

/*
 * MIGRATE_RECV: the destination's side of a migration. With the id of a
 * prepared NCCL "recv", first receives the slot's bytes from the source
 * (ncclRecv into the arena). Then (and on the NNG path, id "", only)
 * replies ACK with the hex SHA-256 of the slot's bytes in detail (the
 * controller compares it with the source's before it commits).
 */
static void
wrk_handle_migrate_recv(wrk_worker *w, const wk_msg *req)
{
    const Wkvm__MigrateRecv *mr = req->migrate_recv;
    uint32_t slot = mr->slot;
    if (w->be == NULL || !wrk_slot_ok(w, slot)) {
        wrk_reply_status(w, req, WKVM__KIND__ACK, WK_EINVAL, "bad slot");
        return;
    }
    if (mr->migration_id[0] != '\0') {
        wk_diag d = {{0}};
        void *dev = NULL;
        wk_err err = WK_OK;
        if (strcmp(w->mig.id, mr->migration_id) != 0 || w->mig.send || w->mig.slot != slot ||
            w->mig.comm == NULL)
            err = wk_diag_set(&d, WK_ENOENT, "no NCCL receive prepared for migration %.128s "
                              "slot %u", mr->migration_id, slot);
        if (err == WK_OK && (err = wrk_slot_device_ptr(w, slot, &dev)) != WK_OK)
            wk_diag_set(&d, err, "slot %u has no device address", slot);
        if (err == WK_OK)
            err = be_nccl_recv(w->mig.comm, dev, w->mig.state_bytes, w->mig.chunk,
                               w->mig.timeout_ms, &d);
        if (err != WK_OK) {
            if (w->mig.id[0] != '\0' && strcmp(w->mig.id, mr->migration_id) == 0)
                wrk_mig_end(w, true);
            wk_log_warn("nccl receive failed migration=%s slot=%u: %s", mr->migration_id, slot,
                        d.msg);
            wrk_reply_status(w, req, WKVM__KIND__ACK, err, d.msg);
            return;
        }
    }
    char hex[WK_SHA256_HEX_LEN];
    wk_err err = wrk_slot_sha256(w, slot, hex);
    if (err != WK_OK) {
        wrk_reply_status(w, req, WKVM__KIND__ACK, err,
                         err == WK_ENOMEM ? "out of memory" : "slot read failed");
        return;
    }
    wrk_reply_status(w, req, WKVM__KIND__ACK, WK_OK, hex);
}

/* MIGRATE_NCCL_ID: a fresh ncclUniqueId for a migration this worker will send. */
static void
wrk_handle_migrate_nccl_id(wrk_worker *w, const wk_msg *req)
{
    wk_diag d = {{0}};
    uint8_t id[BE_NCCL_ID_LEN];
    wk_err err = w->nccl ? be_nccl_unique_id(id, &d)
                         : wk_diag_set(&d, WK_ENOTSUP, "this worker cannot use NCCL");
    if (err != WK_OK) {
        wrk_reply_status(w, req, WKVM__KIND__MIGRATE_NCCL_ID_REPLY, err, d.msg);
        return;
    }
    Wkvm__MigrateNcclId ni = WKVM__MIGRATE_NCCL_ID__INIT;
    ni.migration_id = req->migrate_nccl_id->migration_id;
    ni.unique_id.data = id;
    ni.unique_id.len = BE_NCCL_ID_LEN;
    wk_msg r = WKVM__ENVELOPE__INIT;
    r.id = req->id;
    r.kind = WKVM__KIND__MIGRATE_NCCL_ID_REPLY;
    r.payload_case = WKVM__ENVELOPE__PAYLOAD_MIGRATE_NCCL_ID;
    r.migrate_nccl_id = &ni;
    wrk_send(w, &r);
}

/*
 * MIGRATE_PREPARE: joins the pair's communicator (blocks until the peer
 * joins or the deadline). One migration at a time; a stale one is aborted.
 */
static void
wrk_handle_migrate_prepare(wrk_worker *w, const wk_msg *req)
{
    const Wkvm__MigratePrepare *mp = req->migrate_prepare;
    wk_diag d = {{0}};
    wk_err err = WK_OK;
    bool send = strcmp(mp->role, "send") == 0;
    if (!w->nccl)
        err = wk_diag_set(&d, WK_ENOTSUP, "this worker cannot use NCCL");
    else if (w->be == NULL)
        err = wk_diag_set(&d, WK_ESTATE, "no model loaded");
    else if (!wrk_slot_ok(w, mp->slot))
        err = wk_diag_set(&d, WK_EINVAL, "bad slot %u", mp->slot);
    else if (mp->nccl_unique_id.len != BE_NCCL_ID_LEN)
        err = wk_diag_set(&d, WK_EINVAL, "an NCCL prepare needs the 128-byte ncclUniqueId");
    else if (w->cfg.backend->slot_size != NULL &&
             w->cfg.backend->slot_size(w->be, mp->slot) != w->cfg.backend->slot_bytes(w->be))
        err = wk_diag_set(&d, WK_ENOTSUP, "hybrid state (KV pages) moves over NNG");
    else if (mp->state_bytes != w->cfg.backend->slot_bytes(w->be))
        err = wk_diag_set(&d, WK_EINVAL, "state_bytes %llu, this worker's slots hold %llu",
                          (unsigned long long)mp->state_bytes,
                          (unsigned long long)w->cfg.backend->slot_bytes(w->be));
    else if (mp->migration_id[0] == '\0' || strlen(mp->migration_id) >= sizeof(w->mig.id))
        err = wk_diag_set(&d, WK_EINVAL, "migration_id must be 1..128 bytes");
    if (err == WK_OK && w->mig.id[0] != '\0') {
        uint64_t age = wrk_now_us() / 1000u - w->mig.since_ms;
        uint64_t limit = (uint64_t)(w->mig.timeout_ms ? w->mig.timeout_ms
                                                       : BE_NCCL_TIMEOUT_DEFAULT_MS) +
                         WRK_MIG_STALE_MS;
        if (age < limit) {
            err = wk_diag_set(&d, WK_EBUSY, "migration %.128s is in progress on this worker",
                              w->mig.id);
        } else {
            wk_log_warn("stale nccl migration aborted migration=%s age_ms=%llu", w->mig.id,
                        (unsigned long long)age);
            wrk_mig_end(w, true);
        }
    }
    int device = w->cfg.backend->device_index ? w->cfg.backend->device_index(w->be)
                                              : w->cfg.device;
    be_nccl *comm = NULL;
    uint64_t t0 = wrk_now_us();
    if (err == WK_OK)
        err = be_nccl_open(mp->nccl_unique_id.data, send ? 0 : 1, device, mp->timeout_ms, &comm,
                           &d);
    if (err != WK_OK) {
        wk_log_warn("nccl prepare failed migration=%s role=%s slot=%u peer=%s: %s",
                    mp->migration_id, mp->role, mp->slot, mp->peer_worker, d.msg);
        wrk_reply_status(w, req, WKVM__KIND__ACK, err, d.msg);
        return;
    }
    snprintf(w->mig.id, sizeof(w->mig.id), "%s", mp->migration_id);
    w->mig.send = send;
    w->mig.slot = mp->slot;
    w->mig.state_bytes = mp->state_bytes;
    w->mig.chunk = mp->chunk_bytes;
    w->mig.timeout_ms = mp->timeout_ms;
    w->mig.since_ms = wrk_now_us() / 1000u;
    w->mig.comm = comm;
    wk_log_info("nccl communicator ready migration=%s role=%s slot=%u peer=%s device=%d ms=%.1f",
                mp->migration_id, mp->role, mp->slot, mp->peer_worker, device,
                (double)(wrk_now_us() - t0) / 1000.0);
    wrk_reply_status(w, req, WKVM__KIND__ACK, WK_OK, "");
}

/*
 * MIGRATE_SEND: the source's side: hashes the slot, then ncclSend of its
 * bytes to the destination. Replies ACK with the hex SHA-256 in detail.
 * Never writes the slot.
 */
static void
wrk_handle_migrate_send(wrk_worker *w, const wk_msg *req)
{
    const Wkvm__MigrateSend *ms = req->migrate_send;
    wk_diag d = {{0}};
    wk_err err = WK_OK;
    char hex[WK_SHA256_HEX_LEN] = "";
    void *dev = NULL;
    if (!w->nccl)
        err = wk_diag_set(&d, WK_ENOTSUP, "this worker cannot use NCCL");
    else if (w->be == NULL || ms->migration_id[0] == '\0' ||
             strcmp(w->mig.id, ms->migration_id) != 0 || !w->mig.send ||
             w->mig.slot != ms->slot || w->mig.comm == NULL)
        err = wk_diag_set(&d, WK_ENOENT, "no NCCL send prepared for migration %.128s slot %u",
                          ms->migration_id, ms->slot);
    if (err == WK_OK && (err = wrk_slot_sha256(w, ms->slot, hex)) != WK_OK)
        wk_diag_set(&d, err, "slot %u read failed", ms->slot);
    if (err == WK_OK && (err = wrk_slot_device_ptr(w, ms->slot, &dev)) != WK_OK)
        wk_diag_set(&d, err, "slot %u has no device address", ms->slot);
    uint64_t t0 = wrk_now_us();
    if (err == WK_OK)
        err = be_nccl_send(w->mig.comm, dev, w->mig.state_bytes, w->mig.chunk,
                           w->mig.timeout_ms, &d);
    if (err != WK_OK) {
        if (w->mig.id[0] != '\0' && strcmp(w->mig.id, ms->migration_id) == 0)
            wrk_mig_end(w, true);
        wk_log_warn("nccl send failed migration=%s slot=%u: %s", ms->migration_id, ms->slot,
                    d.msg);
        wrk_reply_status(w, req, WKVM__KIND__ACK, err, d.msg);
        return;
    }
    double secs = (double)(wrk_now_us() - t0) / 1e6;
    wk_log_info("nccl send done migration=%s slot=%u bytes=%llu ms=%.2f GB/s=%.2f",
                ms->migration_id, ms->slot, (unsigned long long)w->mig.state_bytes, secs * 1e3,
                secs > 0 ? (double)w->mig.state_bytes / secs / 1e9 : 0.0);
    wrk_reply_status(w, req, WKVM__KIND__ACK, WK_OK, hex);
}

/*
 * MIGRATE_COMMIT: ends this worker's part of NCCL migration id: the
 * communicator is destroyed (commit) or aborted (abort). An abort of a
 * migration this worker does not hold is a no-op (it never got that far,
 * or already aborted itself).
 */
static void
wrk_handle_migrate_commit(wrk_worker *w, const wk_msg *req)
{
    const Wkvm__MigrateCommit *mc = req->migrate_commit;
    bool mine = w->mig.id[0] != '\0' && strcmp(w->mig.id, mc->migration_id) == 0;
    if (!mine) {
        if (mc->abort)
            wrk_reply_status(w, req, WKVM__KIND__ACK, WK_OK, "");
        else
            wrk_reply_status(w, req, WKVM__KIND__ACK, w->nccl ? WK_ENOENT : WK_ENOTSUP,
                             w->nccl ? "no such migration" : "this worker cannot use NCCL");
        return;
    }
    wk_log_info("nccl migration %s migration=%s role=%s slot=%u",
                mc->abort ? "aborted" : "committed", w->mig.id, w->mig.send ? "send" : "recv",
                w->mig.slot);
    wrk_mig_end(w, mc->abort);
    wrk_reply_status(w, req, WKVM__KIND__ACK, WK_OK, "");
}

/*
 * Copies slot's image (its size read now: a hybrid slot grows with its
 * context) into the warm tier under key (borrowed, 1..128 bytes): wrk_host,
 * which references the KV rows the slot shares with the entry it was last
 * loaded from or copied to and copies the rest. The slot must be valid
 * (wrk_slot_ok). WK_ENOSPC past host_cache_bytes, WK_ENOMEM, or the
 * backend's slot_read error. Used by HOST_PUT and by a STEP row's snaps.
 *
 * With tail (a snap), only the slot's fixed part is read now and *tail is
 * the new entry, whose KV part wrk_host_fill() reads before the worker
 * takes its next message: a hybrid image is its fixed part then its KV
 * token by token, and the tokens before the snap's stay as they are while
 * the step goes on, so the entry's bytes are the same, and the bulk of the
 * copy waits until the step's result is sent.
 */
static wk_err
wrk_host_copy(wrk_worker *w, uint32_t slot, const char *key, wrk_host_entry **tail)
{
    return wrk_host_put(w->host, slot, wrk_slot_size(w, slot), key, wrk_host_rd, w, tail);
}

/* HOST_PUT / HOST_GET / HOST_DROP: the warm tier in this process's memory. */
static void
wrk_handle_host(wrk_worker *w, const wk_msg *req)
{
    const Wkvm__HostRef *h = req->host_ref;
    if (w->be == NULL) {
        wrk_reply_status(w, req, WKVM__KIND__ACK, WK_ESTATE, "no model loaded");
        return;
    }
    if (req->kind == WKVM__KIND__HOST_DROP) {
        bool had = wrk_host_drop(w->host, h->key);
        wrk_reply_status(w, req, WKVM__KIND__ACK, had ? WK_OK : WK_ENOENT,
                         had ? "" : "no such key");
        return;
    }
    if (!wrk_slot_ok(w, h->slot)) {
        wrk_reply_status(w, req, WKVM__KIND__ACK, WK_EINVAL, "bad slot");
        return;
    }
    if (req->kind == WKVM__KIND__HOST_GET) {
        char detail[160] = "";
        uint64_t len = 0;
        wrk_host_slot_changed(w->host, h->slot);
        /* Entries keep their own size (hybrid images differ per entry). */
        wk_err err = !wrk_host_len(w->host, h->key, &len)
                         ? WK_ENOENT
                         : wrk_slot_resize(w, h->slot, len, detail, sizeof(detail));
        if (err == WK_OK) /* (the slot's lineage: this entry's KV) */
            err = wrk_host_load(w->host, h->key, h->slot, wrk_host_wr, w);
        wrk_reply_status(w, req, WKVM__KIND__ACK, err,
                         err == WK_OK ? "" : detail[0] ? detail : wk_strerror(err));
        return;
    }
    /* HOST_PUT: replace any entry of that key; refuse past the budget. */
    wk_err err = wrk_host_copy(w, h->slot, h->key, NULL);
    wrk_reply_status(w, req, WKVM__KIND__ACK, err,
                     err == WK_OK       ? ""
                     : err == WK_ENOSPC ? "host cache full"
                                        : wk_strerror(err));
}

/* A STEP row's way through its snaps (RowSnap). */
typedef struct wrk_row_prog {
    uint32_t done;  /* the row's tokens fed so far */
    uint32_t snap;  /* index of its next snap */
    uint32_t saved; /* RowResult.snaps_saved: bit k, snaps[k] copied */
    wrk_host_entry *tail[WK_PROTO_ROW_SNAPS_MAX]; /* entries whose KV is read after the reply */
} wrk_row_prog;

static int
wrk_key_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/*
 * The step's snaps in *n_snaps, WK_EINVAL (detail set) when two of them,
 * in one row or two, name the same host key: the copies would overwrite
 * each other. wk_proto bounded each row's snaps; sorting keeps a hostile
 * step (1024 rows of 8) from costing a pairwise comparison.
 */
static wk_err
wrk_step_snaps_check(const Wkvm__Step *st, size_t *n_snaps, char *detail, size_t dlen)
{
    size_t total = 0;
    for (size_t i = 0; i < st->n_rows; i++)
        total += st->rows[i]->n_snaps;
    *n_snaps = total;
    if (total < 2)
        return WK_OK;
    const char **keys = malloc(total * sizeof(*keys));
    if (keys == NULL)
        return WK_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < st->n_rows; i++)
        for (size_t j = 0; j < st->rows[i]->n_snaps; j++)
            keys[k++] = st->rows[i]->snaps[j]->host_key;
    qsort(keys, total, sizeof(*keys), wrk_key_cmp);
    wk_err err = WK_OK;
    for (k = 1; k < total && err == WK_OK; k++) {
        if (strcmp(keys[k - 1], keys[k]) == 0) {
            err = WK_EINVAL;
            snprintf(detail, dlen, "snap host_key %.128s appears twice in one step", keys[k]);
        }
    }
    free(keys);
    return err;
}

/*
 * Copies row sr's slot for its next snap (pg->snap, then advanced) into the
 * warm tier. A copy that fails (the host cache full, memory short) only
 * leaves the snap's bit clear: one checkpoint lost, never the batch's step.
 */
static void
wrk_step_snap(wrk_worker *w, const Wkvm__StepRow *sr, wrk_row_prog *pg)
{
    uint32_t k = pg->snap++;
    wk_err err = wrk_host_copy(w, sr->slot, sr->snaps[k]->host_key, &pg->tail[k]);
    if (err == WK_OK)
        pg->saved |= 1u << k;
    else if (err != WK_ENOSPC)
        wk_log_warn("slot %u: snap at %u not copied: %s", sr->slot, sr->snaps[k]->at,
                    wk_strerror(err));
}

/*
 * The pieces of a step with snaps, before its final backend step: round
 * after round, every row with a snap before its last token feeds its tokens
 * up to that snap (no logits; its reset, if any, with its first piece) in
 * one backend step, then each of those rows' slots is copied. Rows without
 * such a snap wait for the final step. Then rows[] is narrowed to what is
 * left of each row (a reset only where no piece ran): the final step. Adds
 * the backend's time to *us. A failed piece fails the STEP (detail set)
 * with the state of the rows as far as the pieces took it; the controller
 * fails those rows' jobs. (A failed copy only clears its bit.)
 */
static wk_err
wrk_step_pieces(wrk_worker *w, const Wkvm__Step *st, be_row *rows, wrk_row_prog *pg, uint64_t *us,
                char *detail, size_t dlen)
{
    size_t n = st->n_rows;
    be_row *sub = calloc(n, sizeof(*sub));
    size_t *of = calloc(n, sizeof(*of)); /* sub[j] is a piece of row of[j] */
    wk_err err = sub && of ? WK_OK : WK_ENOMEM;
    while (err == WK_OK) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            const Wkvm__StepRow *sr = st->rows[i];
            /* (a snap at the row's last token is taken after the final step) */
            if (pg[i].snap >= sr->n_snaps || sr->snaps[pg[i].snap]->at >= sr->n_tokens)
                continue;
            uint32_t at = sr->snaps[pg[i].snap]->at; /* > done: wk_proto, increasing */
            sub[m] = (be_row){.slot = sr->slot,
                              .tokens = sr->tokens + pg[i].done,
                              .n_tokens = at - pg[i].done,
                              .logits_mode = BE_LOGITS_NONE,
                              .reset = sr->reset && pg[i].done == 0};
            of[m++] = i;
        }
        if (m == 0)
            break;
        wk_diag d = {{0}};
        uint64_t t0 = wrk_now_us();
        err = w->cfg.backend->step(w->be, sub, m, &d);
        *us += wrk_now_us() - t0;
        if (err != WK_OK) {
            snprintf(detail, dlen, "step failed (a piece before a snap): %.180s", d.msg);
            break;
        }
        for (size_t j = 0; j < m; j++) {
            size_t i = of[j];
            pg[i].done += sub[j].n_tokens;
            wrk_step_snap(w, st->rows[i], &pg[i]);
        }
    }
    for (size_t i = 0; i < n && err == WK_OK; i++) {
        rows[i].tokens = st->rows[i]->tokens + pg[i].done;
        rows[i].n_tokens = (uint32_t)st->rows[i]->n_tokens - pg[i].done; /* >= 1 */
        rows[i].reset = st->rows[i]->reset && pg[i].done == 0;
    }
    free(sub);
    free(of);
    return err;
}

/*
 * Drops the warm entries a failed STEP copied for its snaps: the controller
 * is told of none of them, so none may hold host_cache_bytes.
 */
static void
wrk_step_snaps_undo(wrk_worker *w, const Wkvm__Step *st, const wrk_row_prog *pg)
{
    bool any = false;
    for (size_t i = 0; i < st->n_rows; i++)
        for (size_t k = 0; k < st->rows[i]->n_snaps; k++)
            if (pg[i].saved & (1u << k)) {
                (void)wrk_host_drop(w->host, st->rows[i]->snaps[k]->host_key);
                any = true;
            }
    if (any) /* (the slots' lineages may hold KV those copies never read) */
        wrk_host_slot_changed(w->host, UINT32_MAX);
}

/*
 * STEP. Every row is checked before any state changes (a refused step
 * changes nothing, duplicate snap keys included). A step whose rows carry
 * snaps runs as pieces first (wrk_step_pieces), then the final backend step
 * over every row's remaining tokens, with logits where a row samples; snaps
 * at a row's last token are copied right after it (a failed copy clears
 * its bit only). A failure once a piece ran (a later piece, the final step,
 * a sampling refusal) leaves the rows the pieces
 * fed advanced (the controller fails those jobs) and drops the warm entries
 * the step had copied. StepResult.step_us is the time in the backend's
 * step() calls, pieces included, the copies not (they show only in the
 * controller's round trip); w->steps counts the STEP once.
 */
static void
wrk_handle_step(wrk_worker *w, const wk_msg *req)
{
    const Wkvm__Step *st = req->step;
    char detail[256] = "";
    if (w->be == NULL) {
        wrk_reply_status(w, req, WKVM__KIND__STEP_RESULT, WK_ESTATE, "no model loaded");
        return;
    }
    uint32_t vocab = wrk_model_info_get(w->model)->vocab_size;
    size_t n = st->n_rows;
    be_row *rows = calloc(n ? n : 1, sizeof(*rows));
    Wkvm__RowResult *res = calloc(n ? n : 1, sizeof(*res));
    Wkvm__RowResult **resp = calloc(n ? n : 1, sizeof(*resp));
    Wkvm__TopLogprob *tops = calloc((n ? n : 1) * WRK_SAMPLE_TOP_MAX, sizeof(*tops));
    Wkvm__TopLogprob **topp = calloc((n ? n : 1) * WRK_SAMPLE_TOP_MAX, sizeof(*topp));
    wrk_row_prog *pg = calloc(n ? n : 1, sizeof(*pg));
    size_t need = 0;
    for (size_t i = 0; i < n; i++)
        need += st->rows[i]->sample ? vocab : 0;
    wk_err err = WK_OK;
    if (rows == NULL || res == NULL || resp == NULL || tops == NULL || topp == NULL || pg == NULL) {
        err = WK_ENOMEM;
        goto done;
    }
    if (need > w->logits_cap) {
        float *nl = realloc(w->logits, need * sizeof(float));
        if (nl == NULL) {
            err = WK_ENOMEM;
            goto done;
        }
        w->logits = nl;
        w->logits_cap = need;
    }
    size_t off = 0, ntok = 0;
    for (size_t i = 0; i < n; i++) {
        const Wkvm__StepRow *sr = st->rows[i];
        if (!wrk_slot_ok(w, sr->slot)) {
            err = WK_EINVAL;
            snprintf(detail, sizeof(detail), "row %zu: bad slot %u", i, sr->slot);
            goto done;
        }
        for (size_t j = 0; j < i; j++) {
            if (st->rows[j]->slot == sr->slot) {
                err = WK_EINVAL;
                snprintf(detail, sizeof(detail), "slot %u appears twice in one step", sr->slot);
                goto done;
            }
        }
        for (size_t t = 0; t < sr->n_tokens; t++) {
            if (sr->tokens[t] < 0 || (uint32_t)sr->tokens[t] >= vocab) {
                err = WK_EINVAL;
                snprintf(detail, sizeof(detail), "row %zu: token %d outside vocab %u", i,
                         sr->tokens[t], vocab);
                goto done;
            }
        }
        for (size_t k = 0; sr->sample && sr->params != NULL && k < sr->params->n_logit_bias;
             k++) {
            int32_t t = sr->params->logit_bias[k]->token;
            if (t < 0 || (uint32_t)t >= vocab) {
                err = WK_EINVAL; /* refused before the step: no state changes */
                snprintf(detail, sizeof(detail), "row %zu: logit_bias token %d outside vocab %u",
                         i, t, vocab);
                goto done;
            }
        }
        if (sr->sample && sr->params != NULL && sr->params->allowed_tokens.len > 0 &&
            sr->params->allowed_tokens.len > ((size_t)vocab + 7) / 8) {
            err = WK_EINVAL;
            snprintf(detail, sizeof(detail), "row %zu: allowed_tokens has %zu bytes, vocab %u has %zu",
                     i, sr->params->allowed_tokens.len, vocab, ((size_t)vocab + 7) / 8);
            goto done;
        }
        rows[i].slot = sr->slot;
        rows[i].tokens = sr->tokens;
        rows[i].n_tokens = (uint32_t)sr->n_tokens;
        rows[i].logits_mode = sr->sample ? BE_LOGITS_LAST : BE_LOGITS_NONE;
        rows[i].logits = sr->sample ? w->logits + off : NULL;
        rows[i].reset = sr->reset; /* part of the step: a refused step resets nothing */
        if (sr->reset) /* (its KV starts over: the rows its lineage shares are gone) */
            wrk_host_slot_changed(w->host, sr->slot);
        off += sr->sample ? vocab : 0;
        ntok += sr->n_tokens;
    }
    size_t n_snaps = 0;
    err = wrk_step_snaps_check(st, &n_snaps, detail, sizeof(detail));
    if (err != WK_OK)
        goto done;
    uint64_t dt = 0; /* in the backend's step(), pieces included */
    if (n_snaps > 0 &&
        (err = wrk_step_pieces(w, st, rows, pg, &dt, detail, sizeof(detail))) != WK_OK)
        goto done;
    uint64_t t0 = wrk_now_us();
    wk_diag d = {{0}};
    err = w->cfg.backend->step(w->be, rows, n, &d);
    dt += wrk_now_us() - t0;
    if (err != WK_OK) {
        snprintf(detail, sizeof(detail), "step failed: %.200s", d.msg);
        goto done;
    }
    /* Snaps at a row's last token: sampling below reads only the logits, not the slot. */
    for (size_t i = 0; i < n && n_snaps > 0; i++) {
        if (pg[i].snap < st->rows[i]->n_snaps)
            wrk_step_snap(w, st->rows[i], &pg[i]);
    }
    w->steps++;
    w->step_us += dt;
    w->tokens += ntok;
    for (size_t i = 0; i < n; i++) {
        const Wkvm__StepRow *sr = st->rows[i];
        wkvm__row_result__init(&res[i]);
        resp[i] = &res[i];
        res[i].slot = sr->slot;
        res[i].snaps_saved = pg[i].saved;
        if (!sr->sample)
            continue;
        const Wkvm__SampleParams *pp = sr->params;
        wrk_sample_params sp = {0};
        wrk_logit_bias bias[WK_PROTO_LOGIT_BIAS_MAX];
        if (pp != NULL) {
            sp.temperature = pp->temperature;
            sp.top_p = pp->top_p;
            sp.top_k = pp->top_k;
            sp.min_p = pp->min_p;
            sp.seed = pp->seed;
            sp.presence_penalty = pp->presence_penalty;
            sp.frequency_penalty = pp->frequency_penalty;
            sp.top_logprobs = pp->top_logprobs;
            sp.want_logprob = pp->want_logprobs;
            /* (wk_proto bounded the count and the values; the ids are checked against the vocab) */
            for (size_t k = 0; k < pp->n_logit_bias && k < WK_PROTO_LOGIT_BIAS_MAX; k++)
                bias[k] = (wrk_logit_bias){.token = pp->logit_bias[k]->token,
                                           .bias = pp->logit_bias[k]->bias};
            sp.bias = bias;
            sp.n_bias = pp->n_logit_bias;
            if (pp->allowed_tokens.len > 0) {
                sp.allowed = pp->allowed_tokens.data;
                sp.n_allowed = pp->allowed_tokens.len;
            }
        }
        sp.sample_index = sr->sample_index;
        sp.history = sr->penalty_tokens;
        sp.n_history = sr->n_penalty_tokens;
        wrk_sample_result out;
        err = wrk_sample(rows[i].logits, vocab, &sp, &out);
        if (err != WK_OK) {
            snprintf(detail, sizeof(detail), "row %zu: bad sampling parameters%s", i,
                     sp.allowed != NULL ? " (or allowed_tokens allows no token)" : "");
            goto done;
        }
        res[i].sampled = true;
        res[i].token = out.token;
        res[i].logprob = out.logprob;
        res[i].n_top = out.n_top;
        res[i].top = &topp[i * WRK_SAMPLE_TOP_MAX];
        for (uint32_t k = 0; k < out.n_top; k++) {
            Wkvm__TopLogprob *tl = &tops[i * WRK_SAMPLE_TOP_MAX + k];
            wkvm__top_logprob__init(tl);
            tl->token = out.top_token[k];
            tl->logprob = out.top_logprob[k];
            topp[i * WRK_SAMPLE_TOP_MAX + k] = tl;
        }
    }
    Wkvm__StepResult sres = WKVM__STEP_RESULT__INIT;
    sres.rows = resp;
    sres.n_rows = n;
    sres.step_us = dt;
    wk_msg r = WKVM__ENVELOPE__INIT;
    r.id = req->id;
    r.kind = WKVM__KIND__STEP_RESULT;
    r.payload_case = WKVM__ENVELOPE__PAYLOAD_STEP_RESULT;
    r.step_result = &sres;
    wrk_send(w, &r);
    /*
     * The snaps' KV parts, now that the result is on its way (before any next
     * message). A failed read drops every copy still unread (the controller then
     * finds no warm copy: a recompute, never a wrong state).
     */
    for (size_t i = 0, stop = 0; i < n && n_snaps > 0 && !stop; i++)
        for (size_t k = 0; k < st->rows[i]->n_snaps && !stop; k++) {
            if (pg[i].tail[k] == NULL)
                continue;
            wk_err fe = wrk_host_fill(w->host, pg[i].tail[k], st->rows[i]->slot, wrk_host_rd, w);
            if (fe != WK_OK) {
                wk_log_warn("slot %u: snaps not copied: %s", st->rows[i]->slot,
                            wk_strerror(fe));
                stop = 1;
            }
        }
done:
    if (err != WK_OK) {
        if (pg != NULL)
            wrk_step_snaps_undo(w, st, pg);
        wrk_reply_status(w, req, WKVM__KIND__STEP_RESULT, err,
                         detail[0] ? detail : wk_strerror(err));
    }
    free(rows);
    free(res);
    free(resp);
    free(tops);
    free(topp);
    free(pg);
}

static void
wrk_pipe_added(nng_pipe pipe, nng_pipe_ev ev, void *arg)
{
    (void)pipe;
    (void)ev;
    wrk_worker *w = arg;
    atomic_fetch_add(&w->pipes, 1);
    atomic_store(&w->need_hello, true);
}

static void
wrk_pipe_removed(nng_pipe pipe, nng_pipe_ev ev, void *arg)
{
    (void)pipe;
    (void)ev;
    wrk_worker *w = arg;
    atomic_fetch_sub(&w->pipes, 1);
    wk_log_warn("controller connection lost; reconnecting");
}

#define WRK_PEM_MAX (1u << 20) /* largest certificate or key file */

/*
 * Dials w's tls+tcp:// controller URL with mutual TLS: this worker's
 * certificate and key, and the controller's certificate must chain to the
 * CA and carry the expected name (the URL's host or tls_server_name).
 * Non-blocking: the dialer keeps retrying as nng_dial does.
 */
static wk_err
wrk_dial_tls(wrk_worker *w, wk_diag *d)
{
    char *cert = NULL, *key = NULL, host[256];
    size_t n = 0;
    nng_tls_config *tc = NULL;
    nng_dialer dl;
    wk_net_scheme sc;
    wk_err err = wk_net_url_parse(w->controller_url, &sc, host, sizeof(host), d);
    if (err == WK_OK)
        err = wk_file_read(w->cfg.tls_cert, WRK_PEM_MAX, &cert, &n, d);
    if (err == WK_OK)
        err = wk_file_read(w->cfg.tls_key, WRK_PEM_MAX, &key, &n, d);
    if (err != WK_OK)
        goto out;
    const char *name = w->cfg.tls_server_name ? w->cfg.tls_server_name : host;
    const char *what = "dialer";
    int rv = nng_dialer_create(&dl, w->sock, w->controller_url);
    if (rv == 0 && (rv = nng_tls_config_alloc(&tc, NNG_TLS_MODE_CLIENT)) != 0)
        what = "tls config";
    if (rv == 0 && (rv = nng_tls_config_auth_mode(tc, NNG_TLS_AUTH_MODE_REQUIRED)) != 0)
        what = "tls auth mode";
    if (rv == 0 && (rv = nng_tls_config_ca_file(tc, w->cfg.tls_ca)) != 0)
        what = w->cfg.tls_ca;
    if (rv == 0 && (rv = nng_tls_config_own_cert(tc, cert, key, NULL)) != 0)
        what = w->cfg.tls_cert;
    if (rv == 0 && (rv = nng_tls_config_server_name(tc, name)) != 0)
        what = "server name";
    if (rv == 0 && (rv = nng_dialer_set_ptr(dl, NNG_OPT_TLS_CONFIG, tc)) != 0)
        what = "tls dialer";
    if (rv == 0) {
        nng_dialer_set_size(dl, NNG_OPT_RECVMAXSZ, WK_PROTO_MSG_MAX);
        if ((rv = nng_dialer_start(dl, NNG_FLAG_NONBLOCK)) != 0)
            what = "dial";
        else
            w->dialer = dl;
    }
    if (rv != 0)
        err = wk_diag_set(d, WK_EIO, "cannot dial %s: %s: %s", w->controller_url, what,
                          nng_strerror(rv));
out:
    if (tc != NULL)
        nng_tls_config_free(tc); /* the dialer holds its own reference */
    free(cert);
    if (key != NULL) {
        memset(key, 0, n);
        free(key);
    }
    return err;
}

/* Starts w->dialer towards the controller (mutual TLS for tls+tcp:// URLs). */
static wk_err
wrk_dial(wrk_worker *w, wk_diag *d)
{
    if (strncmp(w->controller_url, "tls+", 4) == 0)
        return wrk_dial_tls(w, d);
    int rv = nng_dial(w->sock, w->controller_url, &w->dialer, NNG_FLAG_NONBLOCK);
    if (rv != 0)
        return wk_diag_set(d, WK_EIO, "cannot dial %s: %s", w->controller_url, nng_strerror(rv));
    return WK_OK;
}

/*
 * Busy beats. The serve loop handles one message at a time, so a long step
 * (a big prefill on a slow or loaded CPU) holds the controller's Stats
 * heartbeat until it ends, and three such misses would mark a busy worker
 * unhealthy. While a message has been in hand for WRK_BUSY_BEAT_MS, this
 * thread sends an unsolicited StatsReply (id 0, model_loaded set, which
 * tells it from model-load progress) every WRK_BUSY_BEAT_MS: the controller
 * counts any reply as proof of life. A stopped or hung process sends none.
 */
#define WRK_BUSY_BEAT_MS 1000u

static void *
wrk_busy_beat_main(void *arg)
{
    wrk_worker *w = arg;
    pthread_setname_np(pthread_self(), "wkw-beat");
    uint64_t last_sent = 0;
    while (!atomic_load(&w->beat_stop)) {
        struct timespec ts = {0, 250 * 1000000L};
        nanosleep(&ts, NULL);
        const uint64_t since = atomic_load(&w->busy_since_ms), now = wrk_now_us() / 1000u;
        if (since == 0 || now - since < WRK_BUSY_BEAT_MS || now - last_sent < WRK_BUSY_BEAT_MS ||
            atomic_load(&w->pipes) == 0)
            continue;
        Wkvm__StatsReply s = WKVM__STATS_REPLY__INIT;
        s.model_loaded = true;
        s.load_permille = 1000;
        s.load_phase = "busy";
        wk_msg m = WKVM__ENVELOPE__INIT;
        m.kind = WKVM__KIND__STATS_REPLY;
        m.payload_case = WKVM__ENVELOPE__PAYLOAD_STATS_REPLY;
        m.stats_reply = &s;
        wrk_send(w, &m); /* nng sockets are thread-safe */
        last_sent = now;
    }
    return NULL;
}

/*
 * libnng 1.5.2 (Debian 12's) has a dialer that stops retrying when the
 * controller dies while a connection is being negotiated (a controller
 * restarted right after this worker dialed): no pipe ever comes back. A
 * link down this long gets a new dialer.
 */
#define WRK_REDIAL_MS 3000

/*
 * Closes the link to the controller, waiting at most 2 s (wk_nng.h: libnng
 * before 1.8 can hang in nng_close when a heartbeat arrives as the link
 * closes; the worker then exits anyway). The notifications are switched off
 * first: they point at w, and a close left hanging should not call into it
 * later (short of a callback libnng had already begun).
 */
static void
wrk_close_link(wrk_worker *w)
{
    nng_pipe_notify(w->sock, NNG_PIPE_EV_ADD_POST, NULL, NULL);
    nng_pipe_notify(w->sock, NNG_PIPE_EV_REM_POST, NULL, NULL);
    if (!wk_nng_close(w->sock, 2000))
        wk_log_warn("closing the controller link did not finish in 2000 ms (libnng < 1.8 "
                    "hangs when a message is in flight as a link closes); leaving it");
}

wk_err
wrk_worker_serve(wrk_worker *w, volatile sig_atomic_t *stop, wk_diag *d)
{
    int rv = nng_pair1_open(&w->sock);
    if (rv != 0)
        return wk_diag_set(d, WK_EIO, "nng socket: %s", nng_strerror(rv));
    nng_socket_set_size(w->sock, NNG_OPT_RECVMAXSZ, WK_PROTO_MSG_MAX);
    nng_socket_set_ms(w->sock, NNG_OPT_RECVTIMEO, 200);
    nng_socket_set_ms(w->sock, NNG_OPT_SENDTIMEO, 10000);
    nng_socket_set_ms(w->sock, NNG_OPT_RECONNMINT, 100);
    nng_socket_set_ms(w->sock, NNG_OPT_RECONNMAXT, 1000);
    nng_pipe_notify(w->sock, NNG_PIPE_EV_ADD_POST, wrk_pipe_added, w);
    nng_pipe_notify(w->sock, NNG_PIPE_EV_REM_POST, wrk_pipe_removed, w);
    wk_err de = wrk_dial(w, d);
    if (de != WK_OK) {
        wrk_close_link(w);
        return de;
    }
    wk_log_info("dialing controller=%s worker=%s", w->controller_url, w->worker_id);
    w->connected = true;
    pthread_t beat;
    atomic_store(&w->beat_stop, false);
    atomic_store(&w->busy_since_ms, 0);
    const bool beating = pthread_create(&beat, NULL, wrk_busy_beat_main, w) == 0;
    /* tests only: every step takes at least this long (a slow device, on a tiny model) */
    const char *delay_env = getenv("WKVM_TEST_STEP_DELAY_MS");
    const long step_delay_ms = delay_env != NULL ? strtol(delay_env, NULL, 10) : 0;
    if (!beating)
        wk_log_warn("no busy-beat thread: a step longer than the controller's heartbeat "
                    "timeout will mark this worker unhealthy");
    wk_err result = WK_OK;
    uint64_t unlinked_since = wrk_now_us() / 1000u, warned_at = 0, dialed_at = unlinked_since;
    uint64_t heard_at = unlinked_since; /* the last message handled, or the link's absence */
    while (!*stop) {
        if (atomic_exchange(&w->need_hello, false))
            wrk_send_hello(w);
        /*
         * A link that never comes up says so: NNG retries quietly, and a TLS
         * handshake the controller refused (a certificate from another CA, a
         * wrong server name) looks like a controller that is not there.
         */
        const uint64_t now_ms = wrk_now_us() / 1000u;
        if (atomic_load(&w->pipes) == 0)
            heard_at = now_ms;
        if (atomic_load(&w->pipes) > 0) {
            unlinked_since = now_ms;
        } else if (now_ms - unlinked_since >= WRK_REDIAL_MS &&
                   now_ms - dialed_at >= WRK_REDIAL_MS) {
            wk_diag rd = {{0}};
            dialed_at = now_ms;
            nng_dialer_close(w->dialer);
            if (wrk_dial(w, &rd) != WK_OK)
                wk_log_warn("redial failed: %s", rd.msg);
            else
                wk_log_debug("no controller link for %llu ms: redialing",
                             (unsigned long long)(now_ms - unlinked_since));
        }
        if (atomic_load(&w->pipes) == 0 && now_ms - unlinked_since >= 10000 &&
            now_ms - warned_at >= 30000) {
            warned_at = now_ms;
            wk_log_warn("no controller connection for %llu s controller=%s%s",
                        (unsigned long long)((now_ms - unlinked_since) / 1000u),
                        w->controller_url,
                        strncmp(w->controller_url, "tls+", 4) == 0
                            ? " (TLS: check --link-tls-ca, this worker's certificate and "
                              "--link-tls-server-name against the controller's)"
                            : "");
        }
        void *buf = NULL;
        size_t len = 0;
        rv = nng_recv(w->sock, &buf, &len, NNG_FLAG_ALLOC);
        const uint64_t after_ms = wrk_now_us() / 1000u;
        if (rv == NNG_ETIMEDOUT && atomic_load(&w->pipes) > 0 && w->cfg.link_silence_ms > 0 &&
            after_ms - heard_at >= w->cfg.link_silence_ms) {
            /*
             * Connected, yet nothing for many heartbeats (checked only when a
             * receive found nothing: a worker held stopped reads its queue
             * first): a link libnng < 1.8 left wedged (wk_nng.h), which no
             * redial mends in this process. The supervisor restarts a worker
             * that exits non-zero.
             */
            result = wk_diag_set(d, WK_ETIMEDOUT,
                                 "the controller link has brought nothing for %.1f s while "
                                 "connected (controller=%s); exiting to be restarted",
                                 (double)(after_ms - heard_at) / 1000.0, w->controller_url);
            wk_log_error("%s", d->msg);
            break;
        }
        if (rv == NNG_ETIMEDOUT)
            continue;
        if (rv != 0) {
            if (rv == NNG_ECLOSED)
                break;
            wk_log_warn("receive failed: %s", nng_strerror(rv));
            continue;
        }
        wk_msg *m = NULL;
        wk_diag pd = {{0}};
        wk_err err = wk_proto_decode(buf, len, &m, &pd);
        nng_free(buf, len);
        if (err != WK_OK) {
            wk_log_warn("bad message refused: %s", pd.msg);
            continue;
        }
        const uint64_t began = wrk_now_us() / 1000u;
        atomic_store(&w->busy_since_ms, began ? began : 1);
        switch (m->kind) { /* (deny by default: a slot's lineage only outlives what is known) */
        case WKVM__KIND__HELLO_ACK:
        case WKVM__KIND__STATS:
        case WKVM__KIND__STEP:      /* appends, but for reset rows (wrk_handle_step) */
        case WKVM__KIND__SLOT_READ: /* reads */
        case WKVM__KIND__HOST_PUT:  /* reads its slot */
        case WKVM__KIND__HOST_GET:  /* sets its slot's (wrk_handle_host) */
        case WKVM__KIND__HOST_DROP:
            break;
        default: /* resets, copies, writes, migrations, a model load: every slot's ends */
            wrk_host_slot_changed(w->host, UINT32_MAX);
        }
        switch (m->kind) {
        case WKVM__KIND__HELLO_ACK:
            if (m->status != 0) {
                result = wk_diag_set(d, (m->status > 0 && m->status < WK_ERR__COUNT)
                                            ? (wk_err)m->status
                                            : WK_EPROTO,
                                     "controller refused this worker: %s", m->detail);
                *stop = 1;
            }
            break;
        case WKVM__KIND__LOAD_MODEL:
            wrk_handle_load(w, m);
            break;
        case WKVM__KIND__STATS:
            wrk_handle_stats(w, m);
            break;
        case WKVM__KIND__SLOT_RESET:
        case WKVM__KIND__SLOT_FREE:
        case WKVM__KIND__SLOT_COPY:
        case WKVM__KIND__SLOT_WRITE:
            wrk_handle_slot_op(w, m);
            break;
        case WKVM__KIND__SLOT_READ:
            wrk_handle_slot_read(w, m);
            break;
        case WKVM__KIND__STEP:
            if (step_delay_ms > 0 && step_delay_ms < 600000) {
                struct timespec ts = {step_delay_ms / 1000, (step_delay_ms % 1000) * 1000000L};
                nanosleep(&ts, NULL);
            }
            wrk_handle_step(w, m);
            break;
        case WKVM__KIND__MIGRATE_RECV:
            wrk_handle_migrate_recv(w, m);
            break;
        case WKVM__KIND__MIGRATE_NCCL_ID:
            wrk_handle_migrate_nccl_id(w, m);
            break;
        case WKVM__KIND__MIGRATE_PREPARE:
            wrk_handle_migrate_prepare(w, m);
            break;
        case WKVM__KIND__MIGRATE_SEND:
            wrk_handle_migrate_send(w, m);
            break;
        case WKVM__KIND__MIGRATE_COMMIT:
            wrk_handle_migrate_commit(w, m);
            break;
        case WKVM__KIND__HOST_PUT:
        case WKVM__KIND__HOST_GET:
        case WKVM__KIND__HOST_DROP:
            wrk_handle_host(w, m);
            break;
        case WKVM__KIND__SHUTDOWN:
            wrk_reply_status(w, m, WKVM__KIND__ACK, WK_OK, "");
            *stop = 1;
            break;
        default:
            wrk_reply_status(w, m, WKVM__KIND__ACK, WK_ENOTSUP,
                             "request kind not supported by this worker");
        }
        atomic_store(&w->busy_since_ms, 0);
        wk_proto_free(m);
        heard_at = wrk_now_us() / 1000u; /* (after it: a long step is not silence) */
    }
    if (beating) {
        atomic_store(&w->beat_stop, true);
        pthread_join(beat, NULL);
    }
    w->connected = false;
    wrk_close_link(w);
    return result;
}
