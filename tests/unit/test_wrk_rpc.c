/*
 * test_wrk_rpc: the worker's side of the protocol, driven as the controller
 * drives it: a pair1 listener in this process plays the controller, a real
 * wrk_worker (CPU backend, a tiny synthetic RWKV-7 model from rwkv7_synth.h)
 * serves it from a thread. Hello on connect; LOAD_MODEL answers ModelInfo
 * whose slot layout tiles state_bytes; STATS; STEP (deterministic per slot,
 * the reset row); SLOT_READ / SLOT_WRITE / SLOT_COPY / SLOT_RESET move the
 * exact bytes; the warm tier (HOST_PUT / HOST_GET / HOST_DROP and
 * SLOT_READ of a host key); STEP rows with snaps (warm copies byte-equal to
 * the prefixes fed in steps of their own, the rows ending as unsplit runs,
 * a full host cache, refused snaps, a hybrid model's growing images); each
 * refusal's status (bad slot, unknown host key, no NCCL, an unknown request
 * kind); SHUTDOWN ends serving with WK_OK, and a refused Hello ends it with
 * the controller's code.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <nng/nng.h>
#include <nng/protocol/pair1/pair.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include "rwkv7_synth.h"
#include "qwen35_synth.h"
#include "tset_synth.h"
#include "wk_nng.h"
#include "wk_proto.h"
#include "wk_time.h"
#include "wrk_rpc.h"

typedef struct fx {
    char dir[256];   /* temporary: the model and the socket */
    char model[300]; /* model directory */
    char url[320];
    nng_socket ctl; /* the controller's end */
    wrk_worker *w;
    pthread_t th;
    volatile sig_atomic_t stop;
    wk_err served; /* what wrk_worker_serve returned */
    wk_diag sd;
    uint64_t next_id;
    bool joined; /* the serving thread was joined */
} fx;

static void *
serve_main(void *arg)
{
    fx *f = arg;
    f->served = wrk_worker_serve(f->w, &f->stop, &f->sd);
    return NULL;
}

static void
fx_open_cfg(fx *f, uint32_t link_silence_ms, uint64_t host_cache_bytes)
{
    memset(f, 0, sizeof(*f));
    synth_tmpdir(f->dir, sizeof(f->dir), "rpc");
    assert_true(f->dir[0] != '\0');
    snprintf(f->model, sizeof(f->model), "%s/model", f->dir);
    synth_cfg c = synth_default();
    c.C = 32;
    c.N = 16;
    c.F = 64;
    assert_int_equal(synth_write(f->model, &c), 0);
    snprintf(f->url, sizeof(f->url), "ipc://%s/c.ipc", f->dir);
    assert_int_equal(nng_pair1_open(&f->ctl), 0);
    nng_socket_set_size(f->ctl, NNG_OPT_RECVMAXSZ, WK_PROTO_MSG_MAX);
    nng_socket_set_ms(f->ctl, NNG_OPT_RECVTIMEO, 10000);
    assert_int_equal(nng_listen(f->ctl, f->url, NULL, 0), 0);
    wrk_rpc_config cfg = {.controller_url = f->url,
                          .worker_id = "w9",
                          .backend = &be_cpu_ops,
                          .threads = 1,
                          .host_cache_bytes = host_cache_bytes,
                          .link_silence_ms = link_silence_ms};
    wk_diag d = {{0}};
    if (wrk_worker_new(&cfg, &f->w, &d) != WK_OK)
        fail_msg("worker: %s", d.msg);
    f->next_id = 1;
    assert_int_equal(pthread_create(&f->th, NULL, serve_main, f), 0);
}

static void
fx_open_silence(fx *f, uint32_t link_silence_ms)
{
    fx_open_cfg(f, link_silence_ms, 1 << 20);
}

static void
fx_open(fx *f)
{
    fx_open_silence(f, 0);
}

static void
fx_close(fx *f)
{
    if (!f->joined) {
        f->stop = 1;
        pthread_join(f->th, NULL);
    }
    wrk_worker_free(f->w);
    (void)wk_nng_close(f->ctl, 2000);
    char p[400];
    snprintf(p, sizeof(p), "%s/c.ipc", f->dir);
    unlink(p);
    synth_rmdir(f->model);
    synth_rmdir(f->dir);
}

static void
send_msg(fx *f, wk_msg *m)
{
    m->id = f->next_id++;
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(wk_proto_encode(m, &buf, &len), WK_OK);
    assert_int_equal(nng_send(f->ctl, buf, len, 0), 0);
    free(buf);
}

/* The next message with id (progress reports, id 0, are skipped); caller frees. */
static wk_msg *
recv_reply(fx *f, uint64_t id)
{
    for (;;) {
        void *buf = NULL;
        size_t len = 0;
        int rv = nng_recv(f->ctl, &buf, &len, NNG_FLAG_ALLOC);
        if (rv != 0)
            fail_msg("no reply: %s", nng_strerror(rv));
        wk_msg *m = NULL;
        assert_int_equal(wk_proto_decode(buf, len, &m, NULL), WK_OK);
        nng_free(buf, len);
        if (m->id == id)
            return m;
        wk_proto_free(m);
    }
}

/* Sends m and returns the reply. */
static wk_msg *
call(fx *f, wk_msg *m)
{
    send_msg(f, m);
    return recv_reply(f, m->id);
}

static wk_msg *
hello(fx *f)
{
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(nng_recv(f->ctl, &buf, &len, NNG_FLAG_ALLOC), 0);
    wk_msg *m = NULL;
    assert_int_equal(wk_proto_decode(buf, len, &m, NULL), WK_OK);
    nng_free(buf, len);
    assert_int_equal(m->kind, WKVM__KIND__HELLO);
    return m;
}

static wk_msg *
slot_op(fx *f, Wkvm__Kind kind, uint32_t slot)
{
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = kind;
    Wkvm__SlotReset r = WKVM__SLOT_RESET__INIT;
    Wkvm__SlotFree fr = WKVM__SLOT_FREE__INIT;
    if (kind == WKVM__KIND__SLOT_RESET) {
        r.slot = slot;
        m.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_RESET;
        m.slot_reset = &r;
    } else {
        fr.slot = slot;
        m.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_FREE;
        m.slot_free = &fr;
    }
    return call(f, &m);
}

/* One row (slot, tokens, reset, greedy sample); the reply. */
static wk_msg *
step(fx *f, uint32_t slot, const int32_t *toks, size_t n, bool reset)
{
    Wkvm__SampleParams sp = WKVM__SAMPLE_PARAMS__INIT;
    Wkvm__StepRow row = WKVM__STEP_ROW__INIT;
    row.slot = slot;
    row.tokens = (int32_t *)toks;
    row.n_tokens = n;
    row.sample = true;
    row.params = &sp;
    row.reset = reset;
    Wkvm__StepRow *rows[1] = {&row};
    Wkvm__Step st = WKVM__STEP__INIT;
    st.n_rows = 1;
    st.rows = rows;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__STEP;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_STEP;
    m.step = &st;
    return call(f, &m);
}

/* The bytes of slot (or of host entry key when key is set); *len; caller frees. */
static uint8_t *
read_slot(fx *f, uint32_t slot, const char *key, size_t *len, wk_err *status)
{
    Wkvm__SlotRead rd = WKVM__SLOT_READ__INIT;
    rd.slot = slot;
    rd.length = 4u << 20;
    rd.host_key = (char *)(key ? key : "");
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__SLOT_READ;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_READ;
    m.slot_read = &rd;
    wk_msg *r = call(f, &m);
    *status = (wk_err)r->status;
    uint8_t *out = NULL;
    *len = 0;
    if (r->status == 0) {
        assert_int_equal(r->kind, WKVM__KIND__SLOT_DATA);
        assert_int_equal(r->slot_data->total_bytes, r->slot_data->data.len);
        *len = r->slot_data->data.len;
        out = malloc(*len);
        memcpy(out, r->slot_data->data.data, *len);
    }
    wk_proto_free(r);
    return out;
}

static wk_err
host_op(fx *f, Wkvm__Kind kind, const char *key, uint32_t slot)
{
    Wkvm__HostRef h = WKVM__HOST_REF__INIT;
    h.key = (char *)key;
    h.slot = slot;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = kind;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_HOST_REF;
    m.host_ref = &h;
    wk_msg *r = call(f, &m);
    wk_err e = (wk_err)r->status;
    wk_proto_free(r);
    return e;
}

static void
test_serve(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f);
    wk_msg *h = hello(&f);
    assert_string_equal(h->hello->worker_id, "w9");
    assert_int_equal(h->hello->protocol_version, WK_PROTO_VERSION);
    assert_int_equal(h->hello->host_cache_bytes, 1 << 20); /* (the controller sizes copies by it) */
    assert_false(h->hello->model_loaded);
    wk_proto_free(h);
    wk_msg ack = WKVM__ENVELOPE__INIT;
    ack.kind = WKVM__KIND__HELLO_ACK;
    send_msg(&f, &ack);

    /* a step before any model is refused */
    static const int32_t toks[4] = {5, 17, 96, 42};
    wk_msg *r = step(&f, 1, toks, 4, true);
    assert_int_not_equal(r->status, 0);
    wk_proto_free(r);

    /* LOAD_MODEL: ModelInfo, its layout tiling state_bytes */
    Wkvm__LoadModel lm = WKVM__LOAD_MODEL__INIT;
    lm.model_dir = f.model;
    lm.n_slots = 3;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__LOAD_MODEL;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_LOAD_MODEL;
    m.load_model = &lm;
    r = call(&f, &m);
    if (r->status != 0)
        fail_msg("load: %s", r->detail);
    assert_int_equal(r->kind, WKVM__KIND__MODEL_INFO);
    const Wkvm__ModelInfo *mi = r->model_info;
    assert_string_equal(mi->family, "rwkv7");
    assert_int_equal(mi->n_slots, 3);
    assert_int_equal(mi->n_embd, 32);
    assert_int_equal(strlen(mi->fingerprint), 64);
    uint64_t state_bytes = mi->state_bytes, sum = 0;
    assert_true(state_bytes > 0);
    assert_true(mi->n_state_tensors > 0);
    for (size_t i = 0; i < mi->n_state_tensors; i++) {
        uint64_t e = 4;
        for (size_t k = 0; k < mi->state_tensors[i]->n_shape; k++)
            e *= mi->state_tensors[i]->shape[k];
        sum += e;
    }
    assert_int_equal(sum, state_bytes);
    wk_proto_free(r);

    m = (wk_msg)WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__STATS;
    r = call(&f, &m);
    assert_int_equal(r->kind, WKVM__KIND__STATS_REPLY);
    assert_int_equal(r->stats_reply->slots_total, 2);
    assert_int_equal(r->stats_reply->host_cache_bytes, 1 << 20);
    assert_true(r->stats_reply->model_loaded);
    wk_proto_free(r);

    /* the same tokens on two fresh slots: the same token, the same bytes */
    r = step(&f, 1, toks, 4, true);
    assert_int_equal(r->status, 0);
    assert_int_equal(r->step_result->n_rows, 1);
    assert_true(r->step_result->rows[0]->sampled);
    int32_t t1 = r->step_result->rows[0]->token;
    assert_true(t1 >= 0 && t1 < 300);
    wk_proto_free(r);
    r = step(&f, 2, toks, 4, true);
    assert_int_equal(r->step_result->rows[0]->token, t1);
    wk_proto_free(r);
    size_t n1 = 0, n2 = 0;
    wk_err st;
    uint8_t *b1 = read_slot(&f, 1, NULL, &n1, &st);
    assert_int_equal(st, WK_OK);
    uint8_t *b2 = read_slot(&f, 2, NULL, &n2, &st);
    assert_int_equal(n1, state_bytes);
    assert_memory_equal(b1, b2, n1);
    free(b2);

    /* SLOT_RESET zeroes; SLOT_WRITE puts the bytes back exactly */
    r = slot_op(&f, WKVM__KIND__SLOT_RESET, 2);
    assert_int_equal(r->status, 0);
    wk_proto_free(r);
    b2 = read_slot(&f, 2, NULL, &n2, &st);
    uint8_t *zero = calloc(1, n2);
    assert_memory_equal(b2, zero, n2);
    free(b2);
    Wkvm__SlotWrite wr = WKVM__SLOT_WRITE__INIT;
    wr.slot = 2;
    wr.data.data = b1;
    wr.data.len = n1;
    m = (wk_msg)WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__SLOT_WRITE;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_WRITE;
    m.slot_write = &wr;
    r = call(&f, &m);
    assert_int_equal(r->status, 0);
    wk_proto_free(r);
    b2 = read_slot(&f, 2, NULL, &n2, &st);
    assert_memory_equal(b1, b2, n1);
    free(b2);
    /* continuing either slot gives the same next token */
    static const int32_t more[1] = {7};
    r = step(&f, 1, more, 1, false);
    int32_t t2 = r->step_result->rows[0]->token;
    wk_proto_free(r);
    r = step(&f, 2, more, 1, false);
    assert_int_equal(r->step_result->rows[0]->token, t2);
    wk_proto_free(r);

    /* the warm tier */
    free(b1);
    b1 = read_slot(&f, 1, NULL, &n1, &st);
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_PUT, "k1", 1), WK_OK);
    b2 = read_slot(&f, 0, "k1", &n2, &st);
    assert_int_equal(st, WK_OK);
    assert_int_equal(n2, n1);
    assert_memory_equal(b1, b2, n1);
    free(b2);
    r = slot_op(&f, WKVM__KIND__SLOT_RESET, 2);
    wk_proto_free(r);
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_GET, "k1", 2), WK_OK);
    b2 = read_slot(&f, 2, NULL, &n2, &st);
    assert_memory_equal(b1, b2, n1);
    free(b2);
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_DROP, "k1", 0), WK_OK);
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_GET, "k1", 2), WK_ENOENT);
    (void)read_slot(&f, 0, "k1", &n2, &st);
    assert_int_equal(st, WK_ENOENT);
    free(b1);
    free(zero);

    /* refusals */
    r = step(&f, 3, toks, 4, true); /* slot 3 of 3: slot 0 is reserved, 1..2 usable */
    assert_int_not_equal(r->status, 0);
    wk_proto_free(r);
    r = slot_op(&f, WKVM__KIND__SLOT_RESET, 9);
    assert_int_equal(r->status, WK_EINVAL);
    wk_proto_free(r);
    (void)read_slot(&f, 9, NULL, &n2, &st);
    assert_int_equal(st, WK_EINVAL);
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_PUT, "k2", 9), WK_EINVAL);
    Wkvm__MigrateNcclId nid = WKVM__MIGRATE_NCCL_ID__INIT;
    nid.migration_id = "m1";
    m = (wk_msg)WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__MIGRATE_NCCL_ID;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_MIGRATE_NCCL_ID;
    m.migrate_nccl_id = &nid;
    r = call(&f, &m);
    assert_int_equal(r->status, WK_ENOTSUP); /* a CPU worker has no NCCL */
    wk_proto_free(r);
    Wkvm__Hello hh = WKVM__HELLO__INIT;
    hh.worker_id = "x";
    m = (wk_msg)WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__HELLO; /* not a request a worker serves */
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_HELLO;
    m.hello = &hh;
    r = call(&f, &m);
    assert_int_equal(r->status, WK_ENOTSUP);
    assert_non_null(strstr(r->detail, "not supported by this worker"));
    wk_proto_free(r);

    /* SHUTDOWN: acknowledged, and serving ends with WK_OK */
    m = (wk_msg)WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__SHUTDOWN;
    r = call(&f, &m);
    assert_int_equal(r->status, 0);
    wk_proto_free(r);
    pthread_join(f.th, NULL);
    f.joined = true;
    assert_int_equal(f.served, WK_OK);
    fx_close(&f);
}

static void
test_refused_hello(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f);
    wk_msg *h = hello(&f);
    wk_proto_free(h);
    wk_msg ack = WKVM__ENVELOPE__INIT;
    ack.kind = WKVM__KIND__HELLO_ACK;
    ack.status = WK_EEXIST;
    ack.detail = "worker id w9 is already connected";
    send_msg(&f, &ack);
    pthread_join(f.th, NULL);
    f.joined = true;
    assert_int_equal(f.served, WK_EEXIST);
    assert_non_null(strstr(f.sd.msg, "controller refused this worker"));
    assert_non_null(strstr(f.sd.msg, "already connected"));
    fx_close(&f);
}

/*
 * A link that stays up but brings nothing (what a link libnng < 1.8 wedged
 * looks like from the worker) ends serving with WK_ETIMEDOUT and a line
 * that says so, for the supervisor to restart the worker; one that keeps
 * talking does not.
 */
static void
test_link_silence(void **state)
{
    (void)state;
    static fx f;
    fx_open_silence(&f, 700);
    wk_msg *h = hello(&f);
    wk_proto_free(h);
    wk_msg ack = WKVM__ENVELOPE__INIT;
    ack.kind = WKVM__KIND__HELLO_ACK;
    send_msg(&f, &ack);
    /* talking (a STATS every 200 ms for 1.4 s): still serving */
    for (int i = 0; i < 7; i++) {
        usleep(200 * 1000);
        wk_msg st = WKVM__ENVELOPE__INIT;
        st.kind = WKVM__KIND__STATS;
        wk_msg *r = call(&f, &st);
        assert_int_equal(r->kind, WKVM__KIND__STATS_REPLY);
        wk_proto_free(r);
    }
    /* then silence: serving ends within a few hundred ms of the bound */
    uint64_t t0 = wk_mono_ms();
    pthread_join(f.th, NULL);
    f.joined = true;
    uint64_t took = wk_mono_ms() - t0;
    assert_int_equal(f.served, WK_ETIMEDOUT);
    assert_non_null(strstr(f.sd.msg, "brought nothing"));
    assert_true(took >= 400 && took < 5000);
    fx_close(&f);
}

/* Hello, its ack and LOAD_MODEL of n_slots (slot 0 reserved); the model's state_bytes. */
static uint64_t
hello_load(fx *f, uint32_t n_slots)
{
    wk_proto_free(hello(f));
    wk_msg ack = WKVM__ENVELOPE__INIT;
    ack.kind = WKVM__KIND__HELLO_ACK;
    send_msg(f, &ack);
    Wkvm__LoadModel lm = WKVM__LOAD_MODEL__INIT;
    lm.model_dir = f->model;
    lm.n_slots = n_slots;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__LOAD_MODEL;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_LOAD_MODEL;
    m.load_model = &lm;
    wk_msg *r = call(f, &m);
    if (r->status != 0)
        fail_msg("load: %s", r->detail);
    uint64_t sb = r->model_info->state_bytes;
    wk_proto_free(r);
    return sb;
}

/* The worker's STATS reply; caller frees. */
static wk_msg *
stats(fx *f)
{
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__STATS;
    wk_msg *r = call(f, &m);
    assert_int_equal(r->kind, WKVM__KIND__STATS_REPLY);
    return r;
}

/* step() that must succeed; the sampled token. */
static int32_t
step_tok(fx *f, uint32_t slot, const int32_t *toks, size_t n, bool reset)
{
    wk_msg *r = step(f, slot, toks, n, reset);
    if (r->status != 0)
        fail_msg("step slot %u: %s", slot, r->detail);
    int32_t t = r->step_result->rows[0]->token;
    wk_proto_free(r);
    return t;
}

/* Slot a (or host entry ka) and slot b (or entry kb) hold the same want_len bytes. */
static void
same_image(fx *f, uint32_t a, const char *ka, uint32_t b, const char *kb, size_t want_len)
{
    size_t na = 0, nb = 0;
    wk_err sa, sb;
    uint8_t *ba = read_slot(f, a, ka, &na, &sa);
    uint8_t *bb = read_slot(f, b, kb, &nb, &sb);
    if (sa != WK_OK || sb != WK_OK)
        fail_msg("read %u/%s: %d, %u/%s: %d", a, ka ? ka : "-", sa, b, kb ? kb : "-", sb);
    assert_int_equal(na, want_len);
    assert_int_equal(nb, want_len);
    assert_memory_equal(ba, bb, na);
    free(ba);
    free(bb);
}

/* The host entry key does not exist. */
static void
no_entry(fx *f, const char *key)
{
    size_t n = 0;
    wk_err st;
    uint8_t *b = read_slot(f, 0, key, &n, &st);
    assert_int_equal(st, WK_ENOENT);
    free(b);
}

/* One row of a STEP as these tests send it (greedy sampling when sample). */
typedef struct srow {
    uint32_t slot;
    const int32_t *toks;
    size_t n;
    bool reset;
    bool sample;
    size_t n_snaps;
    uint32_t at[WK_PROTO_ROW_SNAPS_MAX];
    const char *key[WK_PROTO_ROW_SNAPS_MAX];
} srow;

#define SROWS_MAX 4

/* Sends the n rows r as one STEP; the request id. */
static uint64_t
step_send(fx *f, const srow *r, size_t n)
{
    Wkvm__SampleParams sp = WKVM__SAMPLE_PARAMS__INIT;
    Wkvm__StepRow row[SROWS_MAX];
    Wkvm__StepRow *rowp[SROWS_MAX];
    Wkvm__RowSnap sn[SROWS_MAX][WK_PROTO_ROW_SNAPS_MAX];
    Wkvm__RowSnap *snp[SROWS_MAX][WK_PROTO_ROW_SNAPS_MAX];
    assert_true(n <= SROWS_MAX);
    for (size_t i = 0; i < n; i++) {
        wkvm__step_row__init(&row[i]);
        row[i].slot = r[i].slot;
        row[i].tokens = (int32_t *)r[i].toks;
        row[i].n_tokens = r[i].n;
        row[i].sample = r[i].sample;
        row[i].params = r[i].sample ? &sp : NULL;
        row[i].reset = r[i].reset;
        for (size_t k = 0; k < r[i].n_snaps; k++) {
            wkvm__row_snap__init(&sn[i][k]);
            sn[i][k].at = r[i].at[k];
            sn[i][k].host_key = (char *)r[i].key[k];
            snp[i][k] = &sn[i][k];
        }
        row[i].snaps = snp[i];
        row[i].n_snaps = r[i].n_snaps;
        rowp[i] = &row[i];
    }
    Wkvm__Step st = WKVM__STEP__INIT;
    st.n_rows = n;
    st.rows = rowp;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__STEP;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_STEP;
    m.step = &st;
    send_msg(f, &m);
    return m.id;
}

/* The reply to a STEP of the n rows r; caller frees. */
static wk_msg *
step_rows(fx *f, const srow *r, size_t n)
{
    return recv_reply(f, step_send(f, r, n));
}

/*
 * Sends the rows as a STEP that wk_proto refuses: the worker drops it
 * unanswered, so the next message it sends is the reply to a STATS sent
 * behind it.
 */
static void
step_dropped(fx *f, const srow *r, size_t n)
{
    (void)step_send(f, r, n);
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__STATS;
    send_msg(f, &m);
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(nng_recv(f->ctl, &buf, &len, NNG_FLAG_ALLOC), 0);
    wk_msg *rep = NULL;
    assert_int_equal(wk_proto_decode(buf, len, &rep, NULL), WK_OK);
    nng_free(buf, len);
    assert_int_equal(rep->id, m.id);
    assert_int_equal(rep->kind, WKVM__KIND__STATS_REPLY);
    wk_proto_free(rep);
}

/*
 * STEP rows with snaps: a row of 7 tokens (a reset) with snaps at 2, 5 and
 * 7 and a row of 4 (no reset, no sampling) with snaps at 1 and 3 leave warm
 * entries byte-equal to the same prefixes fed in steps of their own, and the
 * rows end exactly as unsplit runs, with the same sampled token; a row
 * without snaps in the same step is unaffected; the step counts once. A
 * snap's key replaces an entry of that key. Duplicate keys (across rows or
 * in one) are refused with nothing changed, and wk_proto's refusals (at 0,
 * past the row, not increasing) reach no handler.
 */
static void
test_step_snaps(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f);
    uint64_t sb = hello_load(&f, 8); /* slots 1..7 */
    static const int32_t A[7] = {5, 17, 96, 42, 3, 250, 11};
    static const int32_t B[3] = {8, 9, 10};
    static const int32_t C[4] = {20, 21, 22, 23};
    static const int32_t G[3] = {9, 9, 9}, P[3] = {4, 8, 15}, Q[2] = {1, 2};
    /* slot 1 holds another sequence (row A's reset drops it), 2 and 6 hold P, 3 and 7 hold Q */
    (void)step_tok(&f, 1, G, 3, true);
    (void)step_tok(&f, 2, P, 3, true);
    (void)step_tok(&f, 6, P, 3, true);
    (void)step_tok(&f, 3, Q, 2, true);
    (void)step_tok(&f, 7, Q, 2, true);
    /* an entry "a5" already there: the snap replaces it */
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_PUT, "a5", 2), WK_OK);
    wk_msg *s0 = stats(&f);

    srow rows[3] = {
        {.slot = 1,
         .toks = A,
         .n = 7,
         .reset = true,
         .sample = true,
         .n_snaps = 3,
         .at = {2, 5, 7},
         .key = {"a2", "a5", "a7"}},
        {.slot = 2, .toks = B, .n = 3, .sample = true},
        {.slot = 3, .toks = C, .n = 4, .n_snaps = 2, .at = {1, 3}, .key = {"c1", "c3"}},
    };
    wk_msg *r = step_rows(&f, rows, 3);
    if (r->status != 0)
        fail_msg("snap step: %s", r->detail);
    assert_int_equal(r->step_result->n_rows, 3);
    const Wkvm__RowResult *ra = r->step_result->rows[0], *rb = r->step_result->rows[1],
                          *rc = r->step_result->rows[2];
    assert_int_equal(ra->slot, 1);
    assert_true(ra->sampled);
    assert_int_equal(ra->snaps_saved, 0x7);
    assert_true(rb->sampled);
    assert_int_equal(rb->snaps_saved, 0);
    assert_false(rc->sampled);
    assert_int_equal(rc->snaps_saved, 0x3);
    int32_t ta = ra->token, tb = rb->token;
    wk_proto_free(r);
    wk_msg *s1 = stats(&f);
    assert_int_equal(s1->stats_reply->steps, s0->stats_reply->steps + 1); /* one STEP */
    assert_int_equal(s1->stats_reply->tokens, s0->stats_reply->tokens + 7 + 3 + 4);
    wk_proto_free(s0);
    wk_proto_free(s1);

    /* row A: the prefixes in steps of their own on slot 4, the unsplit row on slot 5 */
    (void)step_tok(&f, 4, A, 2, true);
    same_image(&f, 4, NULL, 0, "a2", sb);
    (void)step_tok(&f, 4, A + 2, 3, false);
    same_image(&f, 4, NULL, 0, "a5", sb);
    assert_int_equal(step_tok(&f, 4, A + 5, 2, false), ta);
    same_image(&f, 4, NULL, 0, "a7", sb);
    same_image(&f, 4, NULL, 1, NULL, sb);
    assert_int_equal(step_tok(&f, 5, A, 7, true), ta);
    same_image(&f, 5, NULL, 1, NULL, sb);
    /* row B, without snaps: as if alone */
    assert_int_equal(step_tok(&f, 6, B, 3, false), tb);
    same_image(&f, 6, NULL, 2, NULL, sb);
    /* row C continued Q: its prefixes on slot 7 */
    (void)step_tok(&f, 7, C, 1, false);
    same_image(&f, 7, NULL, 0, "c1", sb);
    (void)step_tok(&f, 7, C + 1, 2, false);
    same_image(&f, 7, NULL, 0, "c3", sb);
    (void)step_tok(&f, 7, C + 3, 1, false);
    same_image(&f, 7, NULL, 3, NULL, sb);
    /* an entry a snap made loads like any other */
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_GET, "a5", 4), WK_OK);
    same_image(&f, 4, NULL, 0, "a5", sb);

    /* refusals change nothing: slots 1..3, the entries, the counters */
    size_t n1 = 0, n2 = 0, n3 = 0;
    wk_err st;
    uint8_t *b1 = read_slot(&f, 1, NULL, &n1, &st);
    uint8_t *b2 = read_slot(&f, 2, NULL, &n2, &st);
    uint8_t *b3 = read_slot(&f, 3, NULL, &n3, &st);
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_PUT, "dup", 2), WK_OK);
    s0 = stats(&f);
    srow dup[2] = {
        {.slot = 1,
         .toks = A,
         .n = 7,
         .reset = true,
         .sample = true,
         .n_snaps = 2,
         .at = {2, 4},
         .key = {"new", "dup"}},
        {.slot = 3, .toks = C, .n = 4, .n_snaps = 1, .at = {2}, .key = {"dup"}},
    };
    r = step_rows(&f, dup, 2); /* the same key in two rows */
    assert_int_equal(r->status, WK_EINVAL);
    assert_non_null(strstr(r->detail, "twice"));
    wk_proto_free(r);
    dup[0].key[0] = "dup"; /* ... and in one row */
    r = step_rows(&f, dup, 1);
    assert_int_equal(r->status, WK_EINVAL);
    wk_proto_free(r);
    srow bad = {.slot = 1,
                .toks = A,
                .n = 7,
                .reset = true,
                .sample = true,
                .n_snaps = 2,
                .at = {0, 3},
                .key = {"bad0", "bad1"}};
    step_dropped(&f, &bad, 1); /* at 0 */
    bad.at[0] = 3;             /* not increasing */
    step_dropped(&f, &bad, 1);
    bad.at[0] = 4; /* decreasing */
    step_dropped(&f, &bad, 1);
    bad.at[0] = 2;
    bad.at[1] = 8; /* past the row's 7 tokens */
    step_dropped(&f, &bad, 1);
    s1 = stats(&f);
    assert_int_equal(s1->stats_reply->steps, s0->stats_reply->steps);
    assert_int_equal(s1->stats_reply->tokens, s0->stats_reply->tokens);
    wk_proto_free(s0);
    wk_proto_free(s1);
    size_t m1 = 0;
    uint8_t *c1 = read_slot(&f, 1, NULL, &m1, &st);
    assert_int_equal(m1, n1);
    assert_memory_equal(c1, b1, n1);
    free(c1);
    c1 = read_slot(&f, 3, NULL, &m1, &st);
    assert_int_equal(m1, n3);
    assert_memory_equal(c1, b3, n3);
    free(c1);
    c1 = read_slot(&f, 0, "dup", &m1, &st); /* the entry of the refused key is intact */
    assert_int_equal(st, WK_OK);
    assert_int_equal(m1, n2);
    assert_memory_equal(c1, b2, n2);
    free(c1);
    no_entry(&f, "new");
    no_entry(&f, "bad0");
    no_entry(&f, "bad1");
    free(b1);
    free(b2);
    free(b3);
    fx_close(&f);
}

/*
 * A host cache that holds one slot image: the first snap is copied, the
 * ones after it find the cache full and leave their bits clear, and the
 * step still succeeds with the row's state and token those of the unsplit
 * run. Once the entry is dropped the same snap fits again.
 */
static void
test_step_snaps_full(void **state)
{
    (void)state;
    static fx f;
    /* the fixture's model: L 2, C 32, N 16 (2 heads): 2 * (2 * 32 + 2 * 16 * 16) * 4 bytes */
    const uint64_t want_sb = 2u * (2u * 32u + 2u * 16u * 16u) * 4u;
    fx_open_cfg(&f, 0, want_sb + want_sb / 2);
    uint64_t sb = hello_load(&f, 4);
    assert_int_equal(sb, want_sb);
    static const int32_t A[7] = {5, 17, 96, 42, 3, 250, 11};
    srow row = {.slot = 1,
                .toks = A,
                .n = 7,
                .reset = true,
                .sample = true,
                .n_snaps = 3,
                .at = {1, 3, 7},
                .key = {"f1", "f3", "f7"}};
    wk_msg *r = step_rows(&f, &row, 1);
    if (r->status != 0)
        fail_msg("snap step: %s", r->detail);
    assert_int_equal(r->step_result->rows[0]->snaps_saved, 0x1);
    int32_t ta = r->step_result->rows[0]->token;
    wk_proto_free(r);
    no_entry(&f, "f3");
    no_entry(&f, "f7");
    assert_int_equal(step_tok(&f, 2, A, 1, true), step_tok(&f, 3, A, 1, true));
    same_image(&f, 2, NULL, 0, "f1", sb);
    assert_int_equal(step_tok(&f, 2, A + 1, 6, false), ta);
    same_image(&f, 2, NULL, 1, NULL, sb);
    /* room again: the snap at the row's end is copied */
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_DROP, "f1", 0), WK_OK);
    row.n_snaps = 1;
    row.at[0] = 7;
    row.key[0] = "f7";
    r = step_rows(&f, &row, 1);
    assert_int_equal(r->status, 0);
    assert_int_equal(r->step_result->rows[0]->snaps_saved, 0x1);
    assert_int_equal(r->step_result->rows[0]->token, ta);
    wk_proto_free(r);
    same_image(&f, 2, NULL, 0, "f7", sb);
    fx_close(&f);
}

/* qwen35_synth.h's tiny Qwen3.5, written as dir/model.safetensors and dir/config.json. */
static void
hybrid_write(const char *dir)
{
    static tset s;
    qwen35_synth_build(&s, "model.", true, false);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(tset_write_st(&s, dir), 0);
    char path[512];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(qwen35_synth_cfg, f);
    assert_int_equal(fclose(f), 0);
}

/*
 * The fixture with the tiny Qwen3.5 loaded in 4 slots (Hello answered);
 * *sb, *tb: its slot_bytes and kv_token_bytes.
 */
static void
hybrid_open(fx *f, uint64_t *sb, uint64_t *tb)
{
    fx_open(f);
    synth_rmdir(f->model); /* the fixture's RWKV-7 model: not this test's */
    snprintf(f->model, sizeof(f->model), "%s/hybrid", f->dir); /* (fx_close removes it) */
    hybrid_write(f->model);
    wk_proto_free(hello(f));
    wk_msg ack = WKVM__ENVELOPE__INIT;
    ack.kind = WKVM__KIND__HELLO_ACK;
    send_msg(f, &ack);
    Wkvm__LoadModel lm = WKVM__LOAD_MODEL__INIT;
    lm.model_dir = f->model;
    lm.n_slots = 4;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__LOAD_MODEL;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_LOAD_MODEL;
    m.load_model = &lm;
    wk_msg *r = call(f, &m);
    if (r->status != 0)
        fail_msg("load: %s", r->detail);
    *sb = r->model_info->state_bytes;
    *tb = r->model_info->kv_token_bytes;
    assert_true(*tb > 0);
    wk_proto_free(r);
}

/*
 * Snaps on a hybrid model, whose slot image grows with its context: each
 * entry has the size of the image at its `at` (slot_bytes + at *
 * kv_token_bytes) and the bytes of the prefix fed alone; one loaded back
 * (HOST_GET sizes the slot to it) and continued gives the row's token.
 */
static void
test_step_snaps_hybrid(void **state)
{
    (void)state;
    static fx f;
    uint64_t sb = 0, tb = 0;
    hybrid_open(&f, &sb, &tb);
    wk_msg *r = NULL;
    static const int32_t A[7] = {5, 17, 36, 12, 3, 25, 11};
    srow row = {.slot = 1,
                .toks = A,
                .n = 7,
                .reset = true,
                .sample = true,
                .n_snaps = 3,
                .at = {2, 5, 7},
                .key = {"h2", "h5", "h7"}};
    r = step_rows(&f, &row, 1);
    if (r->status != 0)
        fail_msg("snap step: %s", r->detail);
    assert_int_equal(r->step_result->rows[0]->snaps_saved, 0x7);
    int32_t ta = r->step_result->rows[0]->token;
    wk_proto_free(r);
    (void)step_tok(&f, 2, A, 2, true);
    same_image(&f, 2, NULL, 0, "h2", sb + 2 * tb);
    (void)step_tok(&f, 2, A + 2, 3, false);
    same_image(&f, 2, NULL, 0, "h5", sb + 5 * tb);
    assert_int_equal(step_tok(&f, 2, A + 5, 2, false), ta);
    same_image(&f, 2, NULL, 0, "h7", sb + 7 * tb);
    same_image(&f, 2, NULL, 1, NULL, sb + 7 * tb);
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_GET, "h2", 3), WK_OK);
    same_image(&f, 3, NULL, 0, "h2", sb + 2 * tb);
    assert_int_equal(step_tok(&f, 3, A + 2, 5, false), ta);
    same_image(&f, 3, NULL, 1, NULL, sb + 7 * tb);
    fx_close(&f);
}

/* The worker's warm-tier bytes held now (STATS host_mem_used less the rest, which is constant). */
static uint64_t
host_held(fx *f)
{
    wk_msg *r = stats(f);
    uint64_t v = r->stats_reply->host_mem_used;
    wk_proto_free(r);
    return v;
}

/*
 * The warm tier's shared KV on a hybrid: a copy of a slot loaded from an
 * entry, or copied before, holds only its fixed part and the rows past that
 * entry's (host_mem_used grows by that), and still reads back the slot's
 * image; after SLOT_RESET, a reset STEP row or SLOT_WRITE on that slot (its
 * rows rewritten, longer than the entry it was loaded from), a copy is whole
 * and again the slot's image, never the old entry's rows.
 */
static void
test_host_shared_kv(void **state)
{
    (void)state;
    static fx f;
    uint64_t sb = 0, tb = 0;
    hybrid_open(&f, &sb, &tb);
    wk_msg *r = NULL;
    static const int32_t A[7] = {5, 17, 36, 12, 3, 25, 11}, B[9] = {9, 8, 7, 6, 5, 4, 3, 2, 1};
    (void)step_tok(&f, 1, A, 4, true);
    uint64_t h0 = host_held(&f);
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_PUT, "p4", 1), WK_OK);
    assert_int_equal(host_held(&f) - h0, sb + 4 * tb);
    (void)step_tok(&f, 1, A + 4, 3, false);
    h0 = host_held(&f);
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_PUT, "p7", 1), WK_OK);
    assert_int_equal(host_held(&f) - h0, sb + 3 * tb); /* (rows 0..3 are p4's) */
    same_image(&f, 1, NULL, 0, "p7", sb + 7 * tb);
    /* loaded into slot 2 and continued: the copy holds the 2 new rows */
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_GET, "p7", 2), WK_OK);
    (void)step_tok(&f, 2, B, 2, false);
    h0 = host_held(&f);
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_PUT, "q9", 2), WK_OK);
    assert_int_equal(host_held(&f) - h0, sb + 2 * tb);
    same_image(&f, 2, NULL, 0, "q9", sb + 9 * tb);
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_DROP, "p4", 0), WK_OK);
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_DROP, "p7", 0), WK_OK);
    assert_int_equal(host_op(&f, WKVM__KIND__HOST_GET, "q9", 3), WK_OK); /* (still whole) */
    same_image(&f, 3, NULL, 2, NULL, sb + 9 * tb);
    assert_int_equal(step_tok(&f, 3, B + 2, 1, false), step_tok(&f, 2, B + 2, 1, false));
    /* the slot rewritten three ways, longer than q9: every copy is the slot's own image */
    for (int way = 0; way < 3; way++) {
        assert_int_equal(host_op(&f, WKVM__KIND__HOST_GET, "q9", 3), WK_OK);
        if (way == 0) {
            r = slot_op(&f, WKVM__KIND__SLOT_RESET, 3);
            assert_int_equal(r->status, 0);
            wk_proto_free(r);
            (void)step_tok(&f, 3, B, 9, false);
            (void)step_tok(&f, 3, A, 2, false);
        } else if (way == 1) {
            (void)step_tok(&f, 3, B + 2, 7, true);
            (void)step_tok(&f, 3, A, 4, false);
        } else { /* another history's image (11 tokens) written over slot 3 */
            (void)step_tok(&f, 1, B, 9, true);
            (void)step_tok(&f, 1, A + 3, 2, false);
            size_t n = 0;
            wk_err st;
            uint8_t *img = read_slot(&f, 1, NULL, &n, &st);
            assert_int_equal(st, WK_OK);
            Wkvm__SlotWrite sw = WKVM__SLOT_WRITE__INIT;
            sw.slot = 3;
            sw.offset = 0;
            sw.data.data = img;
            sw.data.len = n;
            sw.total_bytes = n;
            wk_msg w = WKVM__ENVELOPE__INIT;
            w.kind = WKVM__KIND__SLOT_WRITE;
            w.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_WRITE;
            w.slot_write = &sw;
            r = call(&f, &w);
            assert_int_equal(r->status, 0);
            wk_proto_free(r);
            free(img);
        }
        h0 = host_held(&f);
        assert_int_equal(host_op(&f, WKVM__KIND__HOST_PUT, "w", 3), WK_OK);
        assert_int_equal(host_held(&f) - h0, sb + 11 * tb); /* whole */
        same_image(&f, 3, NULL, 0, "w", sb + 11 * tb);
        assert_int_equal(host_op(&f, WKVM__KIND__HOST_DROP, "w", 0), WK_OK);
    }
    fx_close(&f);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_serve),           cmocka_unit_test(test_refused_hello),
        cmocka_unit_test(test_link_silence),    cmocka_unit_test(test_step_snaps),
        cmocka_unit_test(test_step_snaps_full), cmocka_unit_test(test_step_snaps_hybrid),
        cmocka_unit_test(test_host_shared_kv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
