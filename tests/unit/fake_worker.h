/*
 * fake_worker: test helper, a worker that speaks the real controller <->
 * worker protocol (wk_proto over NNG pair1) from a thread of the test
 * process, so that the controller's modules above ctl_pool (ctl_sched,
 * ctl_vm, ctl_ckpt) run unchanged on a real link without a model.
 *
 * Its "model" is a toy: a slot's state is (hash, count) of the tokens fed
 * since the slot was zeroed, kept as the first 16 bytes of a state_bytes
 * image (the rest zero), and a sampled token is a function of the state. So
 * a state loaded from a checkpoint and the same prefix computed again give
 * the same bytes and the same tokens, which is what the reuse tests check.
 * It logs every STEP row (slot, tokens, sample, reset), can hold steps (the
 * step blocks until released, so a test can queue jobs behind it) and
 * HOST_DROPs (a test looks at a warm copy while it is being dropped), keeps a
 * warm tier (HOST_PUT / HOST_GET / HOST_DROP, SLOT_READ of a host key, and a
 * STEP row's snaps: the state after tokens[0..at) under host_key, as HOST_PUT
 * would store it) and counts every request kind and the snaps saved.
 * Header-only; test code only (the one place outside pool/, wrk_rpc.c and
 * the bench stub that opens NNG).
 */
#ifndef FAKE_WORKER_H
#define FAKE_WORKER_H

#include <nng/nng.h>
#include <nng/protocol/pair1/pair.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "wk_nng.h"
#include "wk_proto.h"

#define FW_MAX_SLOTS 16   /* usable slots 1..n */
#define FW_MAX_LOG 4096   /* logged step rows */
#define FW_MAX_HOST 64    /* warm-tier entries */
#define FW_STATE_BYTES 64 /* bytes of one slot image */
/* the warm-tier capacity it reports (Hello, Stats): its whole table (host_cap aside) */
#define FW_HOST_CACHE_BYTES ((uint64_t)FW_MAX_HOST * FW_STATE_BYTES)
#define FW_FP "00000000000000000000000000000000000000000000000000000000000fa4e0"

typedef struct fw_state {
    uint64_t hash;  /* over the tokens fed since zeroed */
    uint64_t count; /* tokens fed since zeroed */
} fw_state;

typedef struct fw_row {
    uint32_t step;      /* step number (1-based) */
    uint32_t slot;      /* arena slot */
    uint32_t n_tokens;  /* tokens fed */
    int32_t first;      /* the first of them (0 when none) */
    bool sample;        /* sampled after them */
    bool reset;         /* zeroed first */
    uint32_t n_penalty; /* penalty history sent with it */
} fw_row;

typedef struct fake_worker {
    char id[32];
    char url[512];
    uint32_t n_slots; /* usable */
    uint32_t kv_pages; /* a hybrid model's KV pool (fw_start_kv), 0 = recurrent only */
    pthread_t th;
    atomic_bool stop;
    nng_socket sock;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    bool hold;              /* steps block until false */
    uint32_t held;          /* steps blocked now */
    bool hold_drop;         /* HOST_DROPs block until false (the whole worker waits) */
    uint32_t host_cap;      /* warm-tier entries it takes, 0 = FW_MAX_HOST */
    uint32_t drops_held;    /* HOST_DROPs blocked now */
    uint32_t steps;         /* steps answered */
    fw_row log[FW_MAX_LOG]; /* every step row */
    size_t n_log;
    fw_state st[FW_MAX_SLOTS + 1];
    struct {
        char key[129];
        fw_state st;
        bool used;
    } host[FW_MAX_HOST];
    uint32_t n_kind[64]; /* requests seen, by Wkvm__Kind */
    uint32_t n_snaps;    /* STEP rows' snaps saved (bits set in snaps_saved) */
} fake_worker;

static inline void
fw_feed(fw_state *s, int32_t tok)
{
    s->hash = (s->hash ^ (uint64_t)(uint32_t)tok) * 0x100000001b3ull + 1;
    s->count++;
}

/* The token the toy model samples in state s. */
static inline int32_t
fw_token_of(const fw_state *s)
{
    return 3 + (int32_t)((s->hash >> 7) % 50u);
}

/* The state after feeding n tokens into a zeroed slot (what a test expects). */
static inline fw_state
fw_state_of(const int32_t *toks, size_t n)
{
    fw_state s = {0, 0};
    for (size_t i = 0; i < n; i++)
        fw_feed(&s, toks[i]);
    return s;
}

static inline void
fw_image(const fw_state *s, uint8_t out[FW_STATE_BYTES])
{
    memset(out, 0, FW_STATE_BYTES);
    memcpy(out, &s->hash, 8);
    memcpy(out + 8, &s->count, 8);
}

static inline int
fw_send(fake_worker *w, const wk_msg *m)
{
    void *buf = NULL;
    size_t len = 0;
    if (wk_proto_encode(m, &buf, &len) != WK_OK)
        return -1;
    int rv = nng_send(w->sock, buf, len, 0);
    free(buf);
    return rv;
}

static inline void
fw_ack(fake_worker *w, const wk_msg *req, Wkvm__Kind kind, wk_err err)
{
    wk_msg r = WKVM__ENVELOPE__INIT;
    r.id = req->id;
    r.kind = kind;
    r.status = (int32_t)err;
    r.detail = err == WK_OK ? "" : "fake worker";
    (void)fw_send(w, &r);
}

static inline int
fw_host_find(fake_worker *w, const char *key)
{
    for (int i = 0; i < FW_MAX_HOST; i++)
        if (w->host[i].used && strcmp(w->host[i].key, key) == 0)
            return i;
    return -1;
}

/*
 * Stores st under key (mu held): replaces the entry of that key, else takes
 * a free one; WK_ENOSPC when the table is full. HOST_PUT and snaps.
 */
static inline wk_err
fw_host_put_locked(fake_worker *w, const char *key, const fw_state *st)
{
    int i = fw_host_find(w, key);
    int used = 0;
    for (int k = 0; k < FW_MAX_HOST; k++)
        used += w->host[k].used;
    for (int k = 0; i < 0 && k < FW_MAX_HOST && (!w->host_cap || (uint32_t)used < w->host_cap); k++)
        if (!w->host[k].used)
            i = k;
    if (i < 0)
        return WK_ENOSPC;
    snprintf(w->host[i].key, sizeof(w->host[i].key), "%s", key);
    w->host[i].st = *st;
    w->host[i].used = true;
    return WK_OK;
}

/* Whether two snaps of the step name the same host key (the real worker refuses it). */
static inline bool
fw_snap_keys_repeat(const Wkvm__Step *s)
{
    for (size_t i = 0; i < s->n_rows; i++)
        for (size_t k = 0; k < s->rows[i]->n_snaps; k++)
            for (size_t j = i; j < s->n_rows; j++)
                for (size_t l = j == i ? k + 1 : 0; l < s->rows[j]->n_snaps; l++)
                    if (strcmp(s->rows[i]->snaps[k]->host_key, s->rows[j]->snaps[l]->host_key) == 0)
                        return true;
    return false;
}

static inline void
fw_model_info(const fake_worker *w, Wkvm__ModelInfo *mi)
{
    wkvm__model_info__init(mi);
    mi->family = "rwkv7";
    mi->name = "fake";
    mi->n_layer = 1;
    mi->n_embd = 4;
    mi->n_head = 1;
    mi->head_size = 4;
    mi->ffn_dim = 16;
    mi->vocab_size = 64;
    mi->dtype = "F32";
    mi->state_bytes = FW_STATE_BYTES;
    mi->weights_digest = "fake";
    mi->vocab_digest = "fake";
    mi->fingerprint = FW_FP;
    mi->n_slots = w->n_slots + 1;
    if (w->kv_pages > 0) { /* a hybrid: 16-token pages of 8 bytes a token */
        mi->kv_token_bytes = 8;
        mi->kv_page_tokens = 16;
        mi->kv_pages = w->kv_pages;
    }
}

static inline void
fw_step(fake_worker *w, const wk_msg *req)
{
    pthread_mutex_lock(&w->mu);
    while (w->hold && !atomic_load(&w->stop)) {
        w->held++;
        pthread_cond_broadcast(&w->cv);
        pthread_cond_wait(&w->cv, &w->mu);
        w->held--;
    }
    if (atomic_load(&w->stop)) { /* stopped while held: the step is never answered */
        pthread_mutex_unlock(&w->mu);
        return;
    }
    const Wkvm__Step *s = req->step;
    Wkvm__RowResult *rr = calloc(s->n_rows ? s->n_rows : 1, sizeof(*rr));
    Wkvm__RowResult **rp = calloc(s->n_rows ? s->n_rows : 1, sizeof(*rp));
    w->steps++;
    wk_err err = WK_OK;
    for (size_t i = 0; i < s->n_rows && err == WK_OK; i++)
        if (s->rows[i]->slot < 1 || s->rows[i]->slot > w->n_slots)
            err = WK_EINVAL;
    if (err == WK_OK && fw_snap_keys_repeat(s))
        err = WK_EINVAL;
    for (size_t i = 0; i < s->n_rows && err == WK_OK; i++) {
        const Wkvm__StepRow *row = s->rows[i];
        fw_state *st = &w->st[row->slot];
        if (row->reset)
            *st = (fw_state){0, 0};
        uint32_t saved = 0;
        size_t next = 0; /* the row's next snap (wk_proto: `at` increasing, within the row) */
        for (size_t k = 0; k < row->n_tokens; k++) {
            fw_feed(st, row->tokens[k]);
            if (next < row->n_snaps && row->snaps[next]->at == k + 1) {
                /* a full table leaves the bit clear, never fails the step */
                if (fw_host_put_locked(w, row->snaps[next]->host_key, st) == WK_OK) {
                    saved |= 1u << next;
                    w->n_snaps++;
                }
                next++;
            }
        }
        if (w->n_log < FW_MAX_LOG)
            w->log[w->n_log++] = (fw_row){.step = w->steps,
                                          .slot = row->slot,
                                          .n_tokens = (uint32_t)row->n_tokens,
                                          .first = row->n_tokens ? row->tokens[0] : 0,
                                          .sample = row->sample,
                                          .reset = row->reset,
                                          .n_penalty = (uint32_t)row->n_penalty_tokens};
        wkvm__row_result__init(&rr[i]);
        rr[i].slot = row->slot;
        rr[i].sampled = row->sample;
        rr[i].token = row->sample ? fw_token_of(st) : 0;
        rr[i].logprob = -0.5f;
        rr[i].snaps_saved = saved;
        rp[i] = &rr[i];
    }
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    Wkvm__StepResult sr = WKVM__STEP_RESULT__INIT;
    sr.n_rows = err == WK_OK ? s->n_rows : 0;
    sr.rows = rp;
    sr.step_us = 1;
    wk_msg r = WKVM__ENVELOPE__INIT;
    r.id = req->id;
    r.kind = WKVM__KIND__STEP_RESULT;
    r.status = (int32_t)err;
    if (err == WK_OK) {
        r.payload_case = WKVM__ENVELOPE__PAYLOAD_STEP_RESULT;
        r.step_result = &sr;
    }
    (void)fw_send(w, &r);
    free(rr);
    free(rp);
}

/* Answers one request (mu not held). */
static inline void
fw_handle(fake_worker *w, const wk_msg *req)
{
    pthread_mutex_lock(&w->mu);
    if ((unsigned)req->kind < 64)
        w->n_kind[req->kind]++;
    pthread_mutex_unlock(&w->mu);
    switch (req->kind) {
    case WKVM__KIND__HELLO_ACK:
        break;
    case WKVM__KIND__STATS: {
        Wkvm__StatsReply s = WKVM__STATS_REPLY__INIT;
        s.slots_total = w->n_slots;
        s.host_cache_bytes = FW_HOST_CACHE_BYTES;
        s.model_loaded = true;
        s.model_fingerprint = FW_FP;
        s.load_permille = 1000;
        wk_msg r = WKVM__ENVELOPE__INIT;
        r.id = req->id;
        r.kind = WKVM__KIND__STATS_REPLY;
        r.payload_case = WKVM__ENVELOPE__PAYLOAD_STATS_REPLY;
        r.stats_reply = &s;
        (void)fw_send(w, &r);
        break;
    }
    case WKVM__KIND__STEP:
        fw_step(w, req);
        break;
    case WKVM__KIND__SLOT_RESET:
    case WKVM__KIND__SLOT_FREE: {
        uint32_t slot =
            req->kind == WKVM__KIND__SLOT_RESET ? req->slot_reset->slot : req->slot_free->slot;
        if (slot < 1 || slot > w->n_slots) {
            fw_ack(w, req, WKVM__KIND__ACK, WK_EINVAL);
            break;
        }
        pthread_mutex_lock(&w->mu);
        w->st[slot] = (fw_state){0, 0};
        pthread_mutex_unlock(&w->mu);
        fw_ack(w, req, WKVM__KIND__ACK, WK_OK);
        break;
    }
    case WKVM__KIND__SLOT_COPY: {
        uint32_t a = req->slot_copy->src, b = req->slot_copy->dst;
        if (a < 1 || a > w->n_slots || b < 1 || b > w->n_slots) {
            fw_ack(w, req, WKVM__KIND__ACK, WK_EINVAL);
            break;
        }
        pthread_mutex_lock(&w->mu);
        w->st[b] = w->st[a];
        pthread_mutex_unlock(&w->mu);
        fw_ack(w, req, WKVM__KIND__ACK, WK_OK);
        break;
    }
    case WKVM__KIND__HOST_PUT:
    case WKVM__KIND__HOST_GET:
    case WKVM__KIND__HOST_DROP: {
        const Wkvm__HostRef *h = req->host_ref;
        wk_err err = WK_OK;
        pthread_mutex_lock(&w->mu);
        while (req->kind == WKVM__KIND__HOST_DROP && w->hold_drop && !atomic_load(&w->stop)) {
            w->drops_held++;
            pthread_cond_broadcast(&w->cv);
            pthread_cond_wait(&w->cv, &w->mu);
            w->drops_held--;
        }
        int i = fw_host_find(w, h->key);
        if (req->kind == WKVM__KIND__HOST_PUT) {
            if (h->slot < 1 || h->slot > w->n_slots)
                err = WK_EINVAL;
            else
                err = fw_host_put_locked(w, h->key, &w->st[h->slot]);
        } else if (i < 0) {
            err = WK_ENOENT;
        } else if (req->kind == WKVM__KIND__HOST_GET) {
            if (h->slot < 1 || h->slot > w->n_slots)
                err = WK_EINVAL;
            else
                w->st[h->slot] = w->host[i].st;
        } else {
            w->host[i].used = false;
        }
        pthread_mutex_unlock(&w->mu);
        fw_ack(w, req, WKVM__KIND__ACK, err);
        break;
    }
    case WKVM__KIND__SLOT_READ: {
        const Wkvm__SlotRead *rd = req->slot_read;
        uint8_t img[FW_STATE_BYTES];
        wk_err err = WK_OK;
        pthread_mutex_lock(&w->mu);
        if (rd->host_key != NULL && rd->host_key[0] != '\0') {
            int i = fw_host_find(w, rd->host_key);
            if (i < 0)
                err = WK_ENOENT;
            else
                fw_image(&w->host[i].st, img);
        } else if (rd->slot < 1 || rd->slot > w->n_slots) {
            err = WK_EINVAL;
        } else {
            fw_image(&w->st[rd->slot], img);
        }
        pthread_mutex_unlock(&w->mu);
        if (err == WK_OK && rd->offset > FW_STATE_BYTES)
            err = WK_EINVAL;
        if (err != WK_OK) {
            fw_ack(w, req, WKVM__KIND__SLOT_DATA, err);
            break;
        }
        size_t n = FW_STATE_BYTES - (size_t)rd->offset;
        if (rd->length < n)
            n = rd->length;
        Wkvm__SlotData sd = WKVM__SLOT_DATA__INIT;
        sd.slot = rd->slot;
        sd.offset = rd->offset;
        sd.data.data = img + rd->offset;
        sd.data.len = n;
        sd.total_bytes = FW_STATE_BYTES;
        wk_msg r = WKVM__ENVELOPE__INIT;
        r.id = req->id;
        r.kind = WKVM__KIND__SLOT_DATA;
        r.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_DATA;
        r.slot_data = &sd;
        (void)fw_send(w, &r);
        break;
    }
    case WKVM__KIND__SLOT_WRITE: {
        const Wkvm__SlotWrite *wr = req->slot_write;
        wk_err err = WK_OK;
        if (wr->slot < 1 || wr->slot > w->n_slots || wr->offset + wr->data.len > FW_STATE_BYTES)
            err = WK_EINVAL;
        pthread_mutex_lock(&w->mu);
        if (err == WK_OK) {
            uint8_t img[FW_STATE_BYTES];
            fw_image(&w->st[wr->slot], img);
            memcpy(img + wr->offset, wr->data.data, wr->data.len);
            memcpy(&w->st[wr->slot].hash, img, 8);
            memcpy(&w->st[wr->slot].count, img + 8, 8);
        }
        pthread_mutex_unlock(&w->mu);
        fw_ack(w, req, WKVM__KIND__ACK, err);
        break;
    }
    default:
        fw_ack(w, req, WKVM__KIND__ACK, WK_ENOTSUP);
        break;
    }
}

static inline void *
fw_main(void *arg)
{
    fake_worker *w = arg;
    Wkvm__ModelInfo mi;
    fw_model_info(w, &mi);
    Wkvm__Hello h = WKVM__HELLO__INIT;
    h.worker_id = w->id;
    h.backend = "cpu";
    h.device = "fake";
    h.device_mem_bytes = 1ull << 30;
    h.protocol_version = WK_PROTO_VERSION;
    h.host_cache_bytes = FW_HOST_CACHE_BYTES;
    h.pid = (uint32_t)getpid();
    h.hostname = "fake";
    h.model_dir = "/fake";
    h.model_loaded = true;
    h.model = &mi;
    wk_msg hello = WKVM__ENVELOPE__INIT;
    hello.kind = WKVM__KIND__HELLO;
    hello.payload_case = WKVM__ENVELOPE__PAYLOAD_HELLO;
    hello.hello = &h;
    while (!atomic_load(&w->stop) && fw_send(w, &hello) != 0)
        usleep(5 * 1000); /* until the dialer is connected */
    while (!atomic_load(&w->stop)) {
        void *buf = NULL;
        size_t len = 0;
        int rv = nng_recv(w->sock, &buf, &len, NNG_FLAG_ALLOC);
        if (rv == NNG_ETIMEDOUT)
            continue;
        if (rv != 0)
            break;
        wk_msg *req = NULL;
        wk_err err = wk_proto_decode(buf, len, &req, NULL);
        nng_free(buf, len);
        if (err != WK_OK)
            continue;
        fw_handle(w, req);
        wk_proto_free(req);
    }
    return NULL;
}

/*
 * Starts a fake worker id with n_slots usable slots, dialing url (with
 * kv_pages > 0 it reports a hybrid model's KV pool of that many pages). 0 on
 * success.
 */
static inline int
fw_start_kv(fake_worker *w, const char *url, const char *id, uint32_t n_slots, uint32_t kv_pages)
{
    memset(w, 0, sizeof(*w));
    w->kv_pages = kv_pages;
    snprintf(w->id, sizeof(w->id), "%s", id);
    snprintf(w->url, sizeof(w->url), "%s", url);
    w->n_slots = n_slots > FW_MAX_SLOTS ? FW_MAX_SLOTS : n_slots;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (nng_pair1_open(&w->sock) != 0)
        return -1;
    nng_socket_set_size(w->sock, NNG_OPT_RECVMAXSZ, WK_PROTO_MSG_MAX);
    nng_socket_set_ms(w->sock, NNG_OPT_RECVTIMEO, 50);
    nng_socket_set_ms(w->sock, NNG_OPT_RECONNMINT, 10);
    nng_socket_set_ms(w->sock, NNG_OPT_RECONNMAXT, 100);
    if (nng_dial(w->sock, url, NULL, NNG_FLAG_NONBLOCK) != 0)
        return -1;
    return pthread_create(&w->th, NULL, fw_main, w) == 0 ? 0 : -1;
}

static inline int
fw_start(fake_worker *w, const char *url, const char *id, uint32_t n_slots)
{
    return fw_start_kv(w, url, id, n_slots, 0);
}

/* Stops the worker's thread and closes its link (the pool sees it leave). */
static inline void
fw_stop(fake_worker *w)
{
    atomic_store(&w->stop, true);
    pthread_mutex_lock(&w->mu);
    w->hold = false;
    w->hold_drop = false;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    /* bounded (wk_nng.h); quiet the pool first (ctl_pool_stop) for a clean teardown */
    (void)wk_nng_close(w->sock, 2000);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

/* Holds (true) or releases (false) steps. */
static inline void
fw_hold(fake_worker *w, bool hold)
{
    pthread_mutex_lock(&w->mu);
    w->hold = hold;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/*
 * Holds (true) or releases (false) HOST_DROPs: the worker answers nothing
 * while one is held, so only hold when no step or slot I/O is due.
 */
static inline void
fw_hold_drop(fake_worker *w, bool hold)
{
    pthread_mutex_lock(&w->mu);
    w->hold_drop = hold;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static inline uint64_t
fw_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Waits up to ms for *count (under w->mu) to be non-zero; true when it is. */
static inline bool
fw_wait_nonzero(fake_worker *w, const uint32_t *count, uint32_t ms)
{
    uint64_t until = fw_now_ms() + ms;
    pthread_mutex_lock(&w->mu);
    while (*count == 0 && fw_now_ms() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 5 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    bool ok = *count > 0;
    pthread_mutex_unlock(&w->mu);
    return ok;
}

/* Waits up to ms for a step to block on the hold; true when one does. */
static inline bool
fw_wait_held(fake_worker *w, uint32_t ms)
{
    return fw_wait_nonzero(w, &w->held, ms);
}

/* Waits up to ms for a HOST_DROP to block on its hold; true when one does. */
static inline bool
fw_wait_drop_held(fake_worker *w, uint32_t ms)
{
    return fw_wait_nonzero(w, &w->drops_held, ms);
}

/* A copy of slot's state. */
static inline fw_state
fw_slot_state(fake_worker *w, uint32_t slot)
{
    pthread_mutex_lock(&w->mu);
    fw_state s = slot <= FW_MAX_SLOTS ? w->st[slot] : (fw_state){0, 0};
    pthread_mutex_unlock(&w->mu);
    return s;
}

/* Requests of kind seen so far. */
static inline uint32_t
fw_count(fake_worker *w, Wkvm__Kind kind)
{
    pthread_mutex_lock(&w->mu);
    uint32_t n = (unsigned)kind < 64 ? w->n_kind[kind] : 0;
    pthread_mutex_unlock(&w->mu);
    return n;
}

/* STEP rows' snaps saved so far. */
static inline uint32_t
fw_snaps(fake_worker *w)
{
    pthread_mutex_lock(&w->mu);
    uint32_t n = w->n_snaps;
    pthread_mutex_unlock(&w->mu);
    return n;
}

/* Copies the step log (up to cap rows) into out; returns the rows logged. */
static inline size_t
fw_log(fake_worker *w, fw_row *out, size_t cap)
{
    pthread_mutex_lock(&w->mu);
    size_t n = w->n_log;
    memcpy(out, w->log, (n < cap ? n : cap) * sizeof(*out));
    pthread_mutex_unlock(&w->mu);
    return n;
}

/* Empties the step log. */
static inline void
fw_log_clear(fake_worker *w)
{
    pthread_mutex_lock(&w->mu);
    w->n_log = 0;
    pthread_mutex_unlock(&w->mu);
}

#endif /* FAKE_WORKER_H */
