/*
 * test_wrk_rpc: the worker's side of the protocol, driven as the controller
 * drives it: a pair1 listener in this process plays the controller, a real
 * wrk_worker (CPU backend, a tiny synthetic RWKV-7 model from rwkv7_synth.h)
 * serves it from a thread. Hello on connect; LOAD_MODEL answers ModelInfo
 * whose slot layout tiles state_bytes; STATS; STEP (deterministic per slot,
 * the reset row); SLOT_READ / SLOT_WRITE / SLOT_COPY / SLOT_RESET move the
 * exact bytes; the warm tier (HOST_PUT / HOST_GET / HOST_DROP and
 * SLOT_READ of a host key); each refusal's status (bad slot, unknown host
 * key, no NCCL, an unknown request kind); SHUTDOWN ends serving with WK_OK,
 * and a refused Hello ends it with the controller's code.
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

#include "rwkv7_synth.h"
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
fx_open_silence(fx *f, uint32_t link_silence_ms)
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
                          .host_cache_bytes = 1 << 20,
                          .link_silence_ms = link_silence_ms};
    wk_diag d = {{0}};
    if (wrk_worker_new(&cfg, &f->w, &d) != WK_OK)
        fail_msg("worker: %s", d.msg);
    f->next_id = 1;
    assert_int_equal(pthread_create(&f->th, NULL, serve_main, f), 0);
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

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_serve),
        cmocka_unit_test(test_refused_hello),
        cmocka_unit_test(test_link_silence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
