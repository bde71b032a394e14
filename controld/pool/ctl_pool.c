/*
 * ctl_pool: worker registry over NNG pair1 (polyamorous). The only file in
 * the controller that includes NNG headers. It never interprets step data;
 * it moves envelopes and keeps worker records.
 *
 * Locking: one mutex (p->mu) guards the worker table, the pending-call list
 * and the counters; p->cv is broadcast whenever a pending call completes.
 * NNG callbacks (pipe events) take the same mutex and never block on I/O.
 */
#define WK_LOG_MODULE "pool"
#include "ctl_pool.h"

#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/pair1/pair.h>
#include <nng/supplemental/tls/tls.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wk_file.h"
#include "wk_log.h"
#include "wk_nng.h"
#include "wk_time.h"

#define CTL_POOL_MAX_WORKERS 256
/*
 * Requests outstanding to one worker at a time. NNG's polyamorous pair1
 * drops (silently) a message sent while the pipe's send queue is full, and
 * a worker busy with a long step reads nothing; bounding what is in flight
 * keeps the queue from ever filling. Callers beyond it wait their turn.
 */
#define CTL_POOL_INFLIGHT_MAX 2

typedef struct ctl_worker {
    ctl_worker_view v;    /* the public record */
    nng_pipe pipe;        /* current connection */
    bool need_load;       /* model must be loaded into it */
    bool busy;            /* the manager is talking to it */
    uint64_t last_beat;   /* monotonic ms of the last good Stats */
    uint32_t missed;      /* consecutive failed heartbeats */
    uint64_t last_rx;     /* monotonic ms of the last reply of any kind */
    uint32_t inflight;    /* requests sent and not yet answered or given up */
    ctl_state_tensor *layout; /* the model's slot layout (ModelInfo), owned; NULL: none */
    uint32_t n_layout;    /* entries in layout */
} ctl_worker;

static void
ctl_worker_free(ctl_worker *w)
{
    if (w != NULL)
        free(w->layout);
    free(w);
}

typedef struct ctl_pending {
    uint64_t id;              /* request id */
    uint32_t pipe_id;         /* pipe the request went to */
    wk_msg *reply;            /* set by the receiver, owned by the waiter */
    bool done;                /* reply arrived or the pipe closed */
    struct ctl_pending *next; /* list link */
} ctl_pending;

struct ctl_pool {
    nng_socket sock;                            /* pair1 poly */
    nng_listener lst;                           /* the listener */
    char *model_dir;                            /* owned, NULL = none */
    uint32_t slots;                             /* usable slots per worker */
    uint32_t heartbeat_ms;                      /* Stats period */
    uint32_t load_timeout_ms;                   /* LoadModel deadline */
    pthread_mutex_t mu;                         /* guards everything below */
    pthread_cond_t cv;                          /* pending completion */
    ctl_worker *workers[CTL_POOL_MAX_WORKERS];  /* registry, NULL holes */
    ctl_pending *pending;                       /* calls in flight */
    ctl_pool_stats stats;                       /* counters */
    atomic_uint_fast64_t next_id;               /* request ids */
    atomic_bool stop;                           /* threads exit */
    atomic_bool mgr_stop;                       /* the manager exits (ctl_pool_stop) */
    pthread_t recv_thr;                         /* receive loop */
    pthread_t mgr_thr;                          /* loads and heartbeats */
    bool recv_started;                          /* recv_thr joinable */
    bool mgr_started;                           /* mgr_thr joinable */
};

static uint64_t
ctl_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

const char *
ctl_worker_state_name(ctl_worker_state s)
{
    switch (s) {
    case CTL_WORKER_STATE_LOADING:
        return "loading";
    case CTL_WORKER_STATE_READY:
        return "ready";
    case CTL_WORKER_STATE_FAILED:
        return "failed";
    case CTL_WORKER_STATE_UNHEALTHY:
        return "unhealthy";
    }
    return "unknown";
}

static wk_err
ctl_nng_err(int rv)
{
    switch (rv) {
    case 0:
        return WK_OK;
    case NNG_ENOMEM:
        return WK_ENOMEM;
    case NNG_ETIMEDOUT:
        return WK_ETIMEDOUT;
    case NNG_ECLOSED:
    case NNG_ECONNREFUSED:
    case NNG_ECONNRESET:
        return WK_EUNAVAIL;
    case NNG_EINVAL:
    case NNG_EADDRINVAL:
        return WK_EINVAL;
    case NNG_EADDRINUSE:
        return WK_EEXIST;
    default:
        return WK_EIO;
    }
}

/* Caller holds mu. */
static ctl_worker *
ctl_pool_find_locked(ctl_pool *p, const char *id)
{
    for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
        if (p->workers[i] != NULL && strcmp(p->workers[i]->v.id, id) == 0)
            return p->workers[i];
    }
    return NULL;
}

static void
ctl_pool_pipe_removed(nng_pipe pipe, nng_pipe_ev ev, void *arg)
{
    (void)ev;
    ctl_pool *p = arg;
    uint32_t pid = (uint32_t)nng_pipe_id(pipe);
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
        ctl_worker *w = p->workers[i];
        if (w != NULL && (uint32_t)nng_pipe_id(w->pipe) == pid) {
            wk_log_info("worker left worker=%s pid=%u", w->v.id, w->v.pid);
            p->stats.departures++;
            if (w->busy) {
                /* The manager still references it; it frees the record. */
                w->pipe = (nng_pipe)NNG_PIPE_INITIALIZER;
                w->v.state = CTL_WORKER_STATE_UNHEALTHY;
                snprintf(w->v.detail, sizeof(w->v.detail), "connection closed");
            } else {
                ctl_worker_free(w);
                p->workers[i] = NULL;
            }
        }
    }
    for (ctl_pending *c = p->pending; c != NULL; c = c->next) {
        if (c->pipe_id == pid && !c->done)
            c->done = true;
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static wk_err
ctl_pool_send(ctl_pool *p, nng_pipe pipe, const wk_msg *m)
{
    void *buf = NULL;
    size_t len = 0;
    wk_err err = wk_proto_encode(m, &buf, &len);
    if (err != WK_OK)
        return err;
    nng_msg *nm = NULL;
    int rv = nng_msg_alloc(&nm, 0);
    if (rv == 0)
        rv = nng_msg_append(nm, buf, len);
    free(buf);
    if (rv != 0) {
        nng_msg_free(nm);
        return ctl_nng_err(rv);
    }
    nng_msg_set_pipe(nm, pipe);
    rv = nng_sendmsg(p->sock, nm, 0);
    if (rv != 0) {
        nng_msg_free(nm);
        return ctl_nng_err(rv);
    }
    return WK_OK;
}

static void
ctl_pool_copy_model(ctl_worker *w, const Wkvm__ModelInfo *mi)
{
    ctl_worker_view *v = &w->v;
    v->model_loaded = mi != NULL;
    free(w->layout);
    w->layout = NULL;
    w->n_layout = 0;
    if (mi == NULL)
        return;
    snprintf(v->family, sizeof(v->family), "%s", mi->family);
    if (mi->n_state_tensors > 0) {
        /* validated by wk_proto_decode: count, names, dims */
        w->layout = calloc(mi->n_state_tensors, sizeof(*w->layout));
        if (w->layout != NULL) {
            for (size_t i = 0; i < mi->n_state_tensors; i++) {
                const Wkvm__StateTensor *t = mi->state_tensors[i];
                snprintf(w->layout[i].name, sizeof(w->layout[i].name), "%s", t->name);
                w->layout[i].ndim = (uint32_t)t->n_shape;
                for (size_t k = 0; k < t->n_shape && k < 4; k++)
                    w->layout[i].shape[k] = t->shape[k];
            }
            w->n_layout = (uint32_t)mi->n_state_tensors;
        }
    }
    snprintf(v->model_name, sizeof(v->model_name), "%s", mi->name);
    snprintf(v->fingerprint, sizeof(v->fingerprint), "%s", mi->fingerprint);
    v->state_bytes = mi->state_bytes;
    v->kv_token_bytes = mi->kv_token_bytes;
    v->kv_page_tokens = mi->kv_page_tokens;
    v->kv_pages = mi->kv_pages;
    v->kv_pages_free = mi->kv_pages;
    v->n_layer = mi->n_layer;
    v->n_embd = mi->n_embd;
    v->n_head = mi->n_head;
    v->head_size = mi->head_size;
    snprintf(v->vocab_digest, sizeof(v->vocab_digest), "%s", mi->vocab_digest);
    v->slots_total = mi->n_slots > 0 ? mi->n_slots - 1 : 0;
}

/*
 * Another ready worker whose model fingerprint differs from w's (another
 * model, or the same weights under another --quantize, --fp32 or
 * --cpu-matmul): its id, else NULL. States, checkpoints and migrations move
 * between workers on the fingerprint the first ready one reports, so such
 * a worker must not serve beside it. Caller holds mu.
 */
static const char *
ctl_pool_fp_clash_locked(const ctl_pool *p, const ctl_worker *w)
{
    if (!w->v.model_loaded)
        return NULL;
    for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
        const ctl_worker *o = p->workers[i];
        if (o != NULL && o != w && nng_pipe_id(o->pipe) > 0 && o->v.model_loaded &&
            o->v.state == CTL_WORKER_STATE_READY && strcmp(o->v.fingerprint, w->v.fingerprint) != 0)
            return o->v.id;
    }
    return NULL;
}

static const char *
ctl_pool_fp_of_locked(const ctl_pool *p, const char *id)
{
    for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++)
        if (p->workers[i] != NULL && strcmp(p->workers[i]->v.id, id) == 0)
            return p->workers[i]->v.fingerprint;
    return "?";
}

/* w is about to be ready: failed instead when its fingerprint clashes. Caller holds mu. */
static void
ctl_pool_ready_locked(ctl_pool *p, ctl_worker *w)
{
    const char *other = ctl_pool_fp_clash_locked(p, w);
    if (other == NULL) {
        w->v.state = CTL_WORKER_STATE_READY;
        w->v.detail[0] = '\0';
        return;
    }
    w->v.state = CTL_WORKER_STATE_FAILED;
    snprintf(w->v.detail, sizeof(w->v.detail),
             "model fingerprint %.16s differs from worker %.64s's %.16s (another model, "
             "--quantize, --fp32, --cpu-matmul, or bf16 engine: AMX / AVX512-BF16): states "
             "would not be portable",
             w->v.fingerprint, other, ctl_pool_fp_of_locked(p, other));
    wk_log_error("worker refused worker=%s: %s", w->v.id, w->v.detail);
}

static void
ctl_pool_on_hello(ctl_pool *p, nng_pipe pipe, const wk_msg *m)
{
    const Wkvm__Hello *h = m->hello;
    Wkvm__HelloAck ack = WKVM__HELLO_ACK__INIT;
    ack.controller_id = "wkvm-controld";
    ack.protocol_version = WK_PROTO_VERSION;
    wk_msg r = WKVM__ENVELOPE__INIT;
    r.id = m->id;
    r.kind = WKVM__KIND__HELLO_ACK;
    r.payload_case = WKVM__ENVELOPE__PAYLOAD_HELLO_ACK;
    r.hello_ack = &ack;

    if (h->protocol_version != WK_PROTO_VERSION) {
        r.status = WK_EPROTO;
        r.detail = "protocol version mismatch";
        wk_log_warn("worker refused worker=%s protocol=%u want=%u", h->worker_id,
                    h->protocol_version, WK_PROTO_VERSION);
        (void)ctl_pool_send(p, pipe, &r);
        return;
    }
    pthread_mutex_lock(&p->mu);
    ctl_worker *w = ctl_pool_find_locked(p, h->worker_id);
    if (w != NULL && nng_pipe_id(w->pipe) > 0 && nng_pipe_id(w->pipe) != nng_pipe_id(pipe)) {
        pthread_mutex_unlock(&p->mu);
        r.status = WK_EEXIST;
        r.detail = "a worker with this id is already connected";
        wk_log_warn("duplicate worker id refused worker=%s", h->worker_id);
        (void)ctl_pool_send(p, pipe, &r);
        return;
    }
    bool fresh = w == NULL;
    if (fresh) {
        size_t slot = CTL_POOL_MAX_WORKERS;
        for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
            if (p->workers[i] == NULL) {
                slot = i;
                break;
            }
        }
        w = slot < CTL_POOL_MAX_WORKERS ? calloc(1, sizeof(*w)) : NULL;
        if (w == NULL) {
            pthread_mutex_unlock(&p->mu);
            r.status = WK_ENOSPC;
            r.detail = "worker registry full";
            (void)ctl_pool_send(p, pipe, &r);
            return;
        }
        p->workers[slot] = w;
    }
    ctl_worker_view *v = &w->v;
    snprintf(v->id, sizeof(v->id), "%s", h->worker_id);
    snprintf(v->backend, sizeof(v->backend), "%s", h->backend);
    snprintf(v->device, sizeof(v->device), "%s", h->device);
    snprintf(v->hostname, sizeof(v->hostname), "%s", h->hostname);
    v->pid = h->pid;
    v->device_mem = h->device_mem_bytes;
    v->device_index = h->device_index;
    snprintf(v->device_uuid, sizeof(v->device_uuid), "%s", h->device_uuid);
    snprintf(v->pci_bus_id, sizeof(v->pci_bus_id), "%s", h->pci_bus_id);
    v->nccl = h->nccl;
    v->host_cache_bytes = h->host_cache_bytes;
    v->connected_ms = ctl_wall_ms();
    v->detail[0] = '\0';
    ctl_pool_copy_model(w, h->model_loaded ? h->model : NULL);
    w->pipe = pipe;
    w->last_beat = wk_mono_ms();
    w->missed = 0;
    bool model_ok = p->model_dir == NULL ||
                    (h->model_loaded && strcmp(h->model_dir, p->model_dir) == 0 &&
                     v->slots_total >= p->slots);
    w->need_load = !model_ok;
    v->state = CTL_WORKER_STATE_LOADING;
    if (model_ok)
        ctl_pool_ready_locked(p, w);
    p->stats.registrations++;
    pthread_mutex_unlock(&p->mu);
    wk_log_info("worker registered worker=%s backend=%s device=\"%s\" pid=%u nccl=%s model=%s",
                h->worker_id, h->backend, h->device, h->pid, h->nccl ? "yes" : "no",
                h->model_loaded ? h->model_dir : "-");
    (void)ctl_pool_send(p, pipe, &r);
}

static void
ctl_pool_on_reply(ctl_pool *p, nng_pipe pipe, wk_msg *m)
{
    pthread_mutex_lock(&p->mu);
    if (m->id == 0 && m->kind == WKVM__KIND__STATS_REPLY && m->stats_reply != NULL) {
        /* Unsolicited: model-load progress, or a busy beat (model_loaded: a long step) */
        for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
            ctl_worker *w = p->workers[i];
            if (w != NULL && nng_pipe_id(w->pipe) == nng_pipe_id(pipe)) {
                w->last_rx = wk_mono_ms();
                if (m->stats_reply->model_loaded)
                    continue;
                w->v.load_permille = m->stats_reply->load_permille;
                snprintf(w->v.load_phase, sizeof(w->v.load_phase), "%s",
                         m->stats_reply->load_phase);
            }
        }
        pthread_mutex_unlock(&p->mu);
        wk_proto_free(m);
        return;
    }
    for (ctl_pending *c = p->pending; c != NULL; c = c->next) {
        if (c->id == m->id && c->pipe_id == (uint32_t)nng_pipe_id(pipe) && !c->done) {
            for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
                ctl_worker *w = p->workers[i];
                if (w != NULL && (uint32_t)nng_pipe_id(w->pipe) == c->pipe_id) {
                    w->last_rx = wk_mono_ms();
                    break;
                }
            }
            c->reply = m;
            c->done = true;
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
            return;
        }
    }
    pthread_mutex_unlock(&p->mu);
    wk_log_debug("late or unknown reply id=%llu kind=%s", (unsigned long long)m->id,
                 wk_proto_kind_name(m->kind));
    wk_proto_free(m);
}

static void *
ctl_pool_recv_main(void *arg)
{
    ctl_pool *p = arg;
    pthread_setname_np(pthread_self(), "wkc-pool-recv"); /* for the CPU metric */
    while (!atomic_load(&p->stop)) {
        nng_msg *nm = NULL;
        int rv = nng_recvmsg(p->sock, &nm, 0);
        if (rv == NNG_ETIMEDOUT)
            continue;
        if (rv != 0) {
            if (rv == NNG_ECLOSED)
                break;
            wk_log_warn("receive failed: %s", nng_strerror(rv));
            continue;
        }
        nng_pipe pipe = nng_msg_get_pipe(nm);
        wk_msg *m = NULL;
        wk_diag d = {{0}};
        wk_err err = wk_proto_decode(nng_msg_body(nm), nng_msg_len(nm), &m, &d);
        nng_msg_free(nm);
        if (err != WK_OK) {
            pthread_mutex_lock(&p->mu);
            p->stats.bad_messages++;
            pthread_mutex_unlock(&p->mu);
            wk_log_warn("bad message from pipe=%d: %s", nng_pipe_id(pipe), d.msg);
            continue;
        }
        if (m->kind == WKVM__KIND__HELLO) {
            ctl_pool_on_hello(p, pipe, m);
            wk_proto_free(m);
        } else {
            ctl_pool_on_reply(p, pipe, m);
        }
    }
    return NULL;
}

wk_err
ctl_pool_call(ctl_pool *p, const char *worker_id, wk_msg *req, uint32_t timeout_ms,
              wk_msg **reply, wk_diag *d)
{
    ctl_pending c = {0};
    struct timespec until;
    wk_deadline_after_ms(&until, timeout_ms);
    pthread_mutex_lock(&p->mu);
    ctl_worker *w = ctl_pool_find_locked(p, worker_id);
    while (w != NULL && nng_pipe_id(w->pipe) > 0 && w->inflight >= CTL_POOL_INFLIGHT_MAX) {
        if (pthread_cond_timedwait(&p->cv, &p->mu, &until) == ETIMEDOUT) {
            p->stats.rpc_errors++;
            pthread_mutex_unlock(&p->mu);
            return wk_diag_set(d, WK_ETIMEDOUT, "worker %s: %s timed out waiting to be sent",
                               worker_id, wk_proto_kind_name(req->kind));
        }
        w = ctl_pool_find_locked(p, worker_id);
    }
    if (w == NULL || nng_pipe_id(w->pipe) <= 0) {
        /* gone (died, restarting): a transient 503 for the request, never a 404 */
        pthread_mutex_unlock(&p->mu);
        return wk_diag_set(d, WK_EUNAVAIL, "worker '%s' is not connected", worker_id);
    }
    w->inflight++;
    nng_pipe pipe = w->pipe;
    c.id = atomic_fetch_add(&p->next_id, 1);
    c.pipe_id = (uint32_t)nng_pipe_id(pipe);
    c.next = p->pending;
    p->pending = &c;
    p->stats.rpc_calls++;
    pthread_mutex_unlock(&p->mu);

    req->id = c.id;
    wk_err err = ctl_pool_send(p, pipe, req);
    pthread_mutex_lock(&p->mu);
    while (err == WK_OK && !c.done) {
        if (pthread_cond_timedwait(&p->cv, &p->mu, &until) == ETIMEDOUT)
            break;
    }
    for (ctl_pending **pp = &p->pending; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == &c) {
            *pp = c.next;
            break;
        }
    }
    if (err == WK_OK && c.reply == NULL)
        err = c.done ? WK_EUNAVAIL : WK_ETIMEDOUT;
    /* Give the in-flight place back (the record may have been replaced or freed). */
    for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
        ctl_worker *x = p->workers[i];
        if (x != NULL && (uint32_t)nng_pipe_id(x->pipe) == c.pipe_id && x->inflight > 0) {
            x->inflight--;
            break;
        }
    }
    pthread_cond_broadcast(&p->cv);
    if (err != WK_OK)
        p->stats.rpc_errors++;
    pthread_mutex_unlock(&p->mu);

    if (err != WK_OK) {
        wk_proto_free(c.reply);
        return wk_diag_set(d, err, "worker %s: %s %s", worker_id,
                           wk_proto_kind_name(req->kind),
                           err == WK_ETIMEDOUT ? "timed out" : wk_strerror(err));
    }
    if (c.reply->status != 0) {
        wk_err werr = (c.reply->status > 0 && c.reply->status < WK_ERR__COUNT)
                          ? (wk_err)c.reply->status
                          : WK_EPROTO;
        wk_diag_set(d, werr, "worker %s: %s", worker_id, c.reply->detail);
        wk_proto_free(c.reply);
        return werr;
    }
    *reply = c.reply;
    return WK_OK;
}

/*
 * One warm-tier request: a worker RPC like any other, so the pool's (ctl_vm's
 * warm index and ctl_ckpt's checkpoints both send them, neither through the
 * other).
 */
wk_err
ctl_pool_host_call(ctl_pool *p, int kind, const char *worker_id, const char *key, uint32_t slot,
                   uint32_t timeout_ms, wk_diag *d)
{
    Wkvm__HostRef h = WKVM__HOST_REF__INIT;
    h.key = (char *)key;
    h.slot = slot;
    wk_msg req = WKVM__ENVELOPE__INIT;
    req.kind = kind;
    req.payload_case = WKVM__ENVELOPE__PAYLOAD_HOST_REF;
    req.host_ref = &h;
    wk_msg *rep = NULL;
    wk_err err = ctl_pool_call(p, worker_id, &req, timeout_ms, &rep, d);
    wk_proto_free(rep);
    return err;
}

/* Loads the configured model into worker id. Runs on the manager thread. */
static void
ctl_pool_load(ctl_pool *p, const char *id)
{
    Wkvm__LoadModel lm = WKVM__LOAD_MODEL__INIT;
    lm.model_dir = p->model_dir;
    lm.n_slots = p->slots + 1;
    wk_msg req = WKVM__ENVELOPE__INIT;
    req.kind = WKVM__KIND__LOAD_MODEL;
    req.payload_case = WKVM__ENVELOPE__PAYLOAD_LOAD_MODEL;
    req.load_model = &lm;
    wk_msg *rep = NULL;
    wk_diag d = {{0}};
    wk_log_info("loading model worker=%s model=%s slots=%u", id, p->model_dir, p->slots);
    wk_err err = ctl_pool_call(p, id, &req, p->load_timeout_ms, &rep, &d);
    pthread_mutex_lock(&p->mu);
    ctl_worker *w = ctl_pool_find_locked(p, id);
    if (w != NULL) {
        w->need_load = false;
        if (err == WK_OK && rep->payload_case == WKVM__ENVELOPE__PAYLOAD_MODEL_INFO) {
            ctl_pool_copy_model(w, rep->model_info);
            ctl_pool_ready_locked(p, w);
        } else {
            w->v.state = CTL_WORKER_STATE_FAILED;
            snprintf(w->v.detail, sizeof(w->v.detail), "%.250s",
                     err == WK_OK ? "bad model info" : d.msg);
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (err == WK_OK)
        wk_log_info("model loaded worker=%s model=%s fingerprint=%.16s", id,
                    rep->model_info->name, rep->model_info->fingerprint);
    else
        wk_log_error("model load failed worker=%s: %s", id, d.msg);
    wk_proto_free(rep);
}

/* One Stats round trip to worker id. Runs on the manager thread. */
static void
ctl_pool_beat(ctl_pool *p, const char *id)
{
    wk_msg req = WKVM__ENVELOPE__INIT;
    req.kind = WKVM__KIND__STATS;
    wk_msg *rep = NULL;
    wk_diag d = {{0}};
    const uint32_t timeout_ms = p->heartbeat_ms * 3 + 1000;
    wk_err err = ctl_pool_call(p, id, &req, timeout_ms, &rep, &d);
    pthread_mutex_lock(&p->mu);
    ctl_worker *w = ctl_pool_find_locked(p, id);
    /*
     * A worker reads one message at a time: in a long step (a big prefill on
     * a slow or loaded CPU) its Stats waits behind the step, while its busy
     * beats (wrk_rpc.c) keep coming. That is busy, not unhealthy: any reply
     * within the heartbeat timeout is proof of life. A stopped or hung
     * worker sends nothing and misses its beats.
     */
    if (w != NULL && err != WK_OK && wk_mono_ms() - w->last_rx < timeout_ms) {
        wk_log_debug("heartbeat deferred worker=%s: busy", id);
    } else if (w != NULL) {
        if (err == WK_OK && rep->payload_case == WKVM__ENVELOPE__PAYLOAD_STATS_REPLY) {
            w->last_beat = wk_mono_ms();
            w->missed = 0;
            w->v.steps = rep->stats_reply->steps;
            w->v.tokens = rep->stats_reply->tokens;
            w->v.kv_pages_free = rep->stats_reply->kv_pages_free;
            w->v.host_cache_bytes = rep->stats_reply->host_cache_bytes;
            if (w->v.state == CTL_WORKER_STATE_UNHEALTHY)
                w->v.state = w->v.model_loaded || p->model_dir == NULL
                                 ? CTL_WORKER_STATE_READY
                                 : CTL_WORKER_STATE_LOADING;
        } else if (++w->missed >= 3 && w->v.state == CTL_WORKER_STATE_READY) {
            w->v.state = CTL_WORKER_STATE_UNHEALTHY;
            snprintf(w->v.detail, sizeof(w->v.detail), "heartbeat: %.200s", d.msg);
            wk_log_warn("worker unhealthy worker=%s: %s", id, d.msg);
        }
    }
    pthread_mutex_unlock(&p->mu);
    wk_proto_free(rep);
}

/* Picks the next worker needing attention; marks it busy. Caller holds mu. */
static ctl_worker *
ctl_pool_next_job_locked(ctl_pool *p, uint64_t now, bool *load)
{
    for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
        ctl_worker *w = p->workers[i];
        if (w == NULL || w->busy || nng_pipe_id(w->pipe) <= 0)
            continue;
        if (w->need_load) {
            *load = true;
            return w;
        }
        if (now - w->last_beat >= p->heartbeat_ms) {
            *load = false;
            return w;
        }
    }
    return NULL;
}

/* Frees records whose pipe closed while busy. Caller holds mu. */
static void
ctl_pool_reap_locked(ctl_pool *p)
{
    for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
        ctl_worker *w = p->workers[i];
        if (w != NULL && !w->busy && nng_pipe_id(w->pipe) <= 0) {
            ctl_worker_free(w);
            p->workers[i] = NULL;
        }
    }
}

static void *
ctl_pool_mgr_main(void *arg)
{
    ctl_pool *p = arg;
    pthread_setname_np(pthread_self(), "wkc-pool-mgr");
    while (!atomic_load(&p->stop) && !atomic_load(&p->mgr_stop)) {
        bool load = false;
        char id[65];
        pthread_mutex_lock(&p->mu);
        ctl_pool_reap_locked(p);
        ctl_worker *w = ctl_pool_next_job_locked(p, wk_mono_ms(), &load);
        if (w != NULL) {
            w->busy = true;
            if (!load)
                w->last_beat = wk_mono_ms(); /* do not re-pick while in flight */
            snprintf(id, sizeof(id), "%s", w->v.id);
        }
        pthread_mutex_unlock(&p->mu);
        if (w == NULL) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        if (load)
            ctl_pool_load(p, id);
        else
            ctl_pool_beat(p, id);
        pthread_mutex_lock(&p->mu);
        /* w may have been replaced; clear busy on whatever record has the id. */
        for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
            if (p->workers[i] != NULL && strcmp(p->workers[i]->v.id, id) == 0)
                p->workers[i]->busy = false;
        }
        pthread_mutex_unlock(&p->mu);
    }
    return NULL;
}

#define CTL_POOL_PEM_MAX (1u << 20) /* largest certificate or key file */

/*
 * Gives the listener lst mutual TLS: the controller's certificate and key,
 * and a worker is accepted only when its certificate chains to the CA
 * (NNG_TLS_AUTH_MODE_REQUIRED: the handshake fails otherwise, and the worker
 * never gets a pipe). WK_EINVAL / file errors with a diag naming the file.
 */
static wk_err
ctl_pool_tls(nng_listener lst, const ctl_pool_config *cfg, wk_diag *d)
{
    char *cert = NULL, *key = NULL;
    size_t n = 0;
    nng_tls_config *tc = NULL;
    wk_err err = wk_file_read(cfg->tls_cert, CTL_POOL_PEM_MAX, &cert, &n, d);
    if (err == WK_OK)
        err = wk_file_read(cfg->tls_key, CTL_POOL_PEM_MAX, &key, &n, d);
    if (err != WK_OK)
        goto out;
    int rv = nng_tls_config_alloc(&tc, NNG_TLS_MODE_SERVER);
    const char *what = "tls config";
    if (rv == 0 && (rv = nng_tls_config_auth_mode(tc, NNG_TLS_AUTH_MODE_REQUIRED)) != 0)
        what = "tls auth mode";
    if (rv == 0 && (rv = nng_tls_config_ca_file(tc, cfg->tls_ca)) != 0)
        what = cfg->tls_ca;
    if (rv == 0 && (rv = nng_tls_config_own_cert(tc, cert, key, NULL)) != 0)
        what = cfg->tls_cert;
    if (rv == 0 && (rv = nng_listener_set_ptr(lst, NNG_OPT_TLS_CONFIG, tc)) != 0)
        what = "tls listener";
    if (rv != 0)
        err = wk_diag_set(d, WK_EINVAL, "worker link TLS: %s: %s", what, nng_strerror(rv));
out:
    if (tc != NULL)
        nng_tls_config_free(tc); /* the listener holds its own reference */
    free(cert);
    if (key != NULL) {
        memset(key, 0, n);
        free(key);
    }
    return err;
}

wk_err
ctl_pool_new(const ctl_pool_config *cfg, ctl_pool **out, wk_diag *d)
{
    ctl_pool *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return WK_ENOMEM;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->next_id, 1);
    atomic_init(&p->stop, false);
    atomic_init(&p->mgr_stop, false);
    p->slots = cfg->slots;
    p->heartbeat_ms = cfg->heartbeat_ms ? cfg->heartbeat_ms : 1000;
    p->load_timeout_ms = cfg->load_timeout_ms ? cfg->load_timeout_ms : 600000;
    wk_err err = WK_ENOMEM;
    if (cfg->model_dir != NULL && (p->model_dir = strdup(cfg->model_dir)) == NULL)
        goto fail;
    int rv = nng_pair1_open_poly(&p->sock);
    if (rv != 0) {
        err = wk_diag_set(d, ctl_nng_err(rv), "nng socket: %s", nng_strerror(rv));
        goto fail;
    }
    nng_socket_set_size(p->sock, NNG_OPT_RECVMAXSZ, WK_PROTO_MSG_MAX);
    nng_socket_set_ms(p->sock, NNG_OPT_RECVTIMEO, 200);
    nng_socket_set_ms(p->sock, NNG_OPT_SENDTIMEO, 5000);
    nng_pipe_notify(p->sock, NNG_PIPE_EV_REM_POST, ctl_pool_pipe_removed, p);
    rv = nng_listener_create(&p->lst, p->sock, cfg->listen_url);
    if (rv == 0 && strncmp(cfg->listen_url, "tls+", 4) == 0) {
        if ((err = ctl_pool_tls(p->lst, cfg, d)) != WK_OK)
            goto fail;
    }
    if (rv == 0) {
        nng_listener_set_size(p->lst, NNG_OPT_RECVMAXSZ, WK_PROTO_MSG_MAX);
        rv = nng_listener_start(p->lst, 0);
    }
    if (rv != 0) {
        err = wk_diag_set(d, ctl_nng_err(rv), "cannot listen on %s: %s", cfg->listen_url,
                          nng_strerror(rv));
        goto fail;
    }
    if (pthread_create(&p->recv_thr, NULL, ctl_pool_recv_main, p) != 0)
        goto fail;
    p->recv_started = true;
    if (pthread_create(&p->mgr_thr, NULL, ctl_pool_mgr_main, p) != 0)
        goto fail;
    p->mgr_started = true;
    *out = p;
    return WK_OK;
fail:
    ctl_pool_free(p);
    return err;
}

void
ctl_pool_stop(ctl_pool *p)
{
    if (p == NULL || atomic_exchange(&p->mgr_stop, true))
        return;
    if (p->mgr_started)
        pthread_join(p->mgr_thr, NULL);
}

void
ctl_pool_free(ctl_pool *p)
{
    if (p == NULL)
        return;
    ctl_pool_stop(p); /* its last request's reply is in before the link closes */
    atomic_store(&p->stop, true);
    bool closed = wk_nng_close(p->sock, CTL_POOL_CLOSE_MS);
    if (p->recv_started)
        pthread_join(p->recv_thr, NULL); /* it sees stop within its 200 ms receive timeout */
    if (!closed) {
        /* libnng may still call ctl_pool_pipe_removed(p): the record stays */
        wk_log_warn("closing the worker link did not finish in %u ms (libnng < 1.8 hangs when a "
                    "message is in flight as a link closes); leaving it",
                    (unsigned)CTL_POOL_CLOSE_MS);
        return;
    }
    for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++)
        ctl_worker_free(p->workers[i]);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->model_dir);
    free(p);
}

static int
ctl_view_cmp(const void *a, const void *b)
{
    return strcmp(((const ctl_worker_view *)a)->id, ((const ctl_worker_view *)b)->id);
}

size_t
ctl_pool_list(ctl_pool *p, ctl_worker_view *out, size_t cap)
{
    size_t n = 0;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
        ctl_worker *w = p->workers[i];
        if (w == NULL || nng_pipe_id(w->pipe) <= 0)
            continue;
        if (n < cap)
            out[n] = w->v;
        n++;
    }
    pthread_mutex_unlock(&p->mu);
    qsort(out, n < cap ? n : cap, sizeof(*out), ctl_view_cmp);
    return n;
}

uint64_t
ctl_pool_worker_epoch(ctl_pool *p, const char *id)
{
    uint64_t epoch = 0;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
        ctl_worker *w = p->workers[i];
        if (w != NULL && nng_pipe_id(w->pipe) > 0 && strcmp(w->v.id, id) == 0) {
            epoch = w->v.connected_ms;
            break;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return epoch;
}

uint64_t
ctl_pool_worker_host_cache(ctl_pool *p, const char *id)
{
    uint64_t cap = 0;
    pthread_mutex_lock(&p->mu);
    ctl_worker *w = ctl_pool_find_locked(p, id);
    if (w != NULL)
        cap = w->v.host_cache_bytes;
    pthread_mutex_unlock(&p->mu);
    return cap;
}

wk_err
ctl_pool_model_view(ctl_pool *p, ctl_worker_view *out)
{
    wk_err err = WK_EUNAVAIL;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
        ctl_worker *w = p->workers[i];
        if (w != NULL && nng_pipe_id(w->pipe) > 0 && w->v.model_loaded &&
            w->v.state == CTL_WORKER_STATE_READY) {
            *out = w->v;
            err = WK_OK;
            break;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return err;
}

wk_err
ctl_pool_model_layout(ctl_pool *p, ctl_state_tensor **out, uint32_t *n)
{
    wk_err err = WK_EUNAVAIL;
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
        ctl_worker *w = p->workers[i];
        if (w != NULL && nng_pipe_id(w->pipe) > 0 && w->v.model_loaded &&
            w->v.state == CTL_WORKER_STATE_READY) {
            err = WK_ENOENT;
            if (w->n_layout > 0) {
                *out = malloc(w->n_layout * sizeof(**out));
                err = *out == NULL ? WK_ENOMEM : WK_OK;
                if (err == WK_OK) {
                    memcpy(*out, w->layout, w->n_layout * sizeof(**out));
                    *n = w->n_layout;
                }
            }
            break;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return err;
}

size_t
ctl_pool_ready_count(ctl_pool *p)
{
    size_t n = 0;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < CTL_POOL_MAX_WORKERS; i++) {
        ctl_worker *w = p->workers[i];
        if (w != NULL && nng_pipe_id(w->pipe) > 0 && w->v.state == CTL_WORKER_STATE_READY)
            n++;
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

void
ctl_pool_stats_get(ctl_pool *p, ctl_pool_stats *out)
{
    pthread_mutex_lock(&p->mu);
    *out = p->stats;
    pthread_mutex_unlock(&p->mu);
}
