/* Unit tests for wk_proto: round trips, every documented limit, malformed input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_proto.h"

static wk_msg *
roundtrip(const wk_msg *m, wk_err want)
{
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(wk_proto_encode(m, &buf, &len), WK_OK);
    wk_msg *out = NULL;
    wk_diag d = {{0}};
    wk_err err = wk_proto_decode(buf, len, &out, &d);
    free(buf);
    assert_int_equal(err, want);
    if (want != WK_OK)
        assert_true(strlen(d.msg) > 0);
    return out;
}

static void
test_hello_roundtrip(void **state)
{
    (void)state;
    Wkvm__Hello h = WKVM__HELLO__INIT;
    h.worker_id = "w0";
    h.backend = "cpu";
    h.device = "x86";
    h.protocol_version = WK_PROTO_VERSION;
    h.device_mem_bytes = 1ull << 34;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.id = 42;
    m.kind = WKVM__KIND__HELLO;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_HELLO;
    m.hello = &h;
    wk_msg *o = roundtrip(&m, WK_OK);
    assert_int_equal(o->id, 42);
    assert_string_equal(o->hello->worker_id, "w0");
    assert_int_equal(o->hello->device_mem_bytes, 1ull << 34);
    wk_proto_free(o);
    /* Empty worker id is refused. */
    h.worker_id = "";
    roundtrip(&m, WK_EPROTO);
}

static void
test_kind_payload_mismatch(void **state)
{
    (void)state;
    Wkvm__SlotReset r = WKVM__SLOT_RESET__INIT;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__STEP;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_RESET;
    m.slot_reset = &r;
    roundtrip(&m, WK_EPROTO);
    /* An error reply may omit the payload. */
    wk_msg e = WKVM__ENVELOPE__INIT;
    e.kind = WKVM__KIND__MODEL_INFO;
    e.status = WK_EINVAL;
    e.detail = "bad model";
    wk_msg *o = roundtrip(&e, WK_OK);
    assert_string_equal(o->detail, "bad model");
    wk_proto_free(o);
    /* A request or Hello never may: handlers dereference it (a 6-byte HELLO with
     * status 1 and no payload crashed the controller; found by fuzz_proto). */
    static const int requests[] = {WKVM__KIND__HELLO, WKVM__KIND__LOAD_MODEL,
                                   WKVM__KIND__SLOT_RESET, WKVM__KIND__SLOT_COPY,
                                   WKVM__KIND__SLOT_FREE, WKVM__KIND__STEP,
                                   WKVM__KIND__SLOT_READ, WKVM__KIND__SLOT_WRITE,
                                   WKVM__KIND__MIGRATE_PREPARE, WKVM__KIND__MIGRATE_SEND,
                                   WKVM__KIND__MIGRATE_RECV, WKVM__KIND__MIGRATE_COMMIT};
    for (size_t i = 0; i < sizeof(requests) / sizeof(requests[0]); i++) {
        wk_msg q = WKVM__ENVELOPE__INIT;
        q.kind = requests[i];
        q.status = WK_EINVAL;
        roundtrip(&q, WK_EPROTO);
    }
    /* Unknown and unspecified kinds. */
    wk_msg u = WKVM__ENVELOPE__INIT;
    roundtrip(&u, WK_EPROTO);
    u.kind = 999;
    roundtrip(&u, WK_EPROTO);
    u.kind = WKVM__KIND__STATS;
    o = roundtrip(&u, WK_OK);
    wk_proto_free(o);
}

static void
test_step_limits(void **state)
{
    (void)state;
    size_t nrows = WK_PROTO_ROWS_MAX + 1;
    Wkvm__StepRow *rows = calloc(nrows, sizeof(*rows));
    Wkvm__StepRow **rowp = calloc(nrows, sizeof(*rowp));
    int32_t *toks = calloc(WK_PROTO_ROW_TOKENS_MAX + 1, sizeof(int32_t));
    for (size_t i = 0; i < nrows; i++) {
        wkvm__step_row__init(&rows[i]);
        rows[i].slot = (uint32_t)i;
        rows[i].n_tokens = 1;
        rows[i].tokens = toks;
        rowp[i] = &rows[i];
    }
    Wkvm__Step s = WKVM__STEP__INIT;
    s.rows = rowp;
    s.n_rows = 2;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__STEP;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_STEP;
    m.step = &s;
    wk_msg *o = roundtrip(&m, WK_OK);
    assert_int_equal(o->step->n_rows, 2);
    wk_proto_free(o);
    s.n_rows = nrows; /* one row too many */
    roundtrip(&m, WK_EPROTO);
    s.n_rows = 1;
    rows[0].n_tokens = WK_PROTO_ROW_TOKENS_MAX + 1; /* row too long */
    roundtrip(&m, WK_EPROTO);
    rows[0].n_tokens = 0; /* empty row */
    roundtrip(&m, WK_EPROTO);
    /* Five rows at the row maximum exceed the step maximum. */
    for (size_t i = 0; i < 5; i++)
        rows[i].n_tokens = WK_PROTO_ROW_TOKENS_MAX;
    s.n_rows = 4;
    o = roundtrip(&m, WK_OK);
    wk_proto_free(o);
    s.n_rows = 5;
    roundtrip(&m, WK_EPROTO);
    /* Sample params are range-checked. */
    s.n_rows = 1;
    rows[0].n_tokens = 1;
    Wkvm__SampleParams p = WKVM__SAMPLE_PARAMS__INIT;
    p.top_logprobs = WK_PROTO_TOP_MAX + 1;
    rows[0].params = &p;
    roundtrip(&m, WK_EPROTO);
    p.top_logprobs = 5;
    p.top_p = 1.5f;
    roundtrip(&m, WK_EPROTO);
    /* logit_bias: at most WK_PROTO_LOGIT_BIAS_MAX entries, ids >= 0, |bias| <= 100. */
    p.top_p = 1.0f;
    size_t nb = WK_PROTO_LOGIT_BIAS_MAX + 1;
    Wkvm__LogitBias *lb = calloc(nb, sizeof(*lb));
    Wkvm__LogitBias **lbp = calloc(nb, sizeof(*lbp));
    for (size_t i = 0; i < nb; i++) {
        wkvm__logit_bias__init(&lb[i]);
        lb[i].token = (int32_t)i;
        lb[i].bias = 100.0f;
        lbp[i] = &lb[i];
    }
    p.logit_bias = lbp;
    p.n_logit_bias = WK_PROTO_LOGIT_BIAS_MAX;
    o = roundtrip(&m, WK_OK);
    assert_int_equal(o->step->rows[0]->params->n_logit_bias, WK_PROTO_LOGIT_BIAS_MAX);
    assert_true(o->step->rows[0]->params->logit_bias[7]->token == 7);
    wk_proto_free(o);
    p.n_logit_bias = nb; /* one entry too many */
    roundtrip(&m, WK_EPROTO);
    p.n_logit_bias = 1;
    lb[0].bias = 100.5f;
    roundtrip(&m, WK_EPROTO);
    lb[0].bias = -1.0f;
    lb[0].token = -1;
    roundtrip(&m, WK_EPROTO);
    lb[0].token = 0;
    /* allowed_tokens: a bitset of at most WK_PROTO_ALLOWED_MAX bytes, carried byte-exact. */
    uint8_t *mask = calloc(WK_PROTO_ALLOWED_MAX + 1, 1);
    mask[3] = 0x81;
    p.allowed_tokens.data = mask;
    p.allowed_tokens.len = WK_PROTO_ALLOWED_MAX;
    o = roundtrip(&m, WK_OK);
    assert_int_equal(o->step->rows[0]->params->allowed_tokens.len, WK_PROTO_ALLOWED_MAX);
    assert_memory_equal(o->step->rows[0]->params->allowed_tokens.data, mask, WK_PROTO_ALLOWED_MAX);
    wk_proto_free(o);
    p.allowed_tokens.len = WK_PROTO_ALLOWED_MAX + 1;
    roundtrip(&m, WK_EPROTO);
    p.allowed_tokens.len = 0;
    free(mask);
    free(lb);
    free(lbp);
    free(rows);
    free(rowp);
    free(toks);
}

/* RowSnap: at most 8 a row, at in 1..n_tokens strictly increasing, keys of 1..128 bytes. */
static void
test_step_snaps(void **state)
{
    (void)state;
    int32_t toks[6] = {1, 2, 3, 4, 5, 6};
    Wkvm__RowSnap sn[WK_PROTO_ROW_SNAPS_MAX + 1];
    Wkvm__RowSnap *snp[WK_PROTO_ROW_SNAPS_MAX + 1];
    char keys[WK_PROTO_ROW_SNAPS_MAX + 1][8];
    for (size_t k = 0; k <= WK_PROTO_ROW_SNAPS_MAX; k++) {
        wkvm__row_snap__init(&sn[k]);
        snprintf(keys[k], sizeof(keys[k]), "k%zu", k);
        sn[k].host_key = keys[k];
        snp[k] = &sn[k];
    }
    Wkvm__StepRow row = WKVM__STEP_ROW__INIT;
    row.slot = 1;
    row.tokens = toks;
    row.n_tokens = 6;
    row.snaps = snp;
    Wkvm__StepRow *rowp[1] = {&row};
    Wkvm__Step s = WKVM__STEP__INIT;
    s.rows = rowp;
    s.n_rows = 1;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__STEP;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_STEP;
    m.step = &s;
    /* at 2, 5 and the row's end: carried as sent */
    sn[0].at = 2;
    sn[1].at = 5;
    sn[2].at = 6;
    row.n_snaps = 3;
    wk_msg *o = roundtrip(&m, WK_OK);
    assert_int_equal(o->step->rows[0]->n_snaps, 3);
    assert_int_equal(o->step->rows[0]->snaps[1]->at, 5);
    assert_string_equal(o->step->rows[0]->snaps[2]->host_key, "k2");
    wk_proto_free(o);
    sn[2].at = 7; /* past the row's tokens */
    roundtrip(&m, WK_EPROTO);
    sn[2].at = 5; /* not strictly increasing */
    roundtrip(&m, WK_EPROTO);
    sn[2].at = 4; /* decreasing */
    roundtrip(&m, WK_EPROTO);
    sn[2].at = 6;
    sn[0].at = 0; /* before any token */
    roundtrip(&m, WK_EPROTO);
    sn[0].at = 1;
    sn[1].host_key = ""; /* keys are 1..128 bytes */
    roundtrip(&m, WK_EPROTO);
    char big[WK_PROTO_HOST_KEY_MAX + 2];
    memset(big, 'k', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    sn[1].host_key = big;
    roundtrip(&m, WK_EPROTO);
    big[WK_PROTO_HOST_KEY_MAX] = '\0'; /* exactly 128 */
    o = roundtrip(&m, WK_OK);
    assert_int_equal(strlen(o->step->rows[0]->snaps[1]->host_key), WK_PROTO_HOST_KEY_MAX);
    wk_proto_free(o);
    sn[1].host_key = keys[1];
    /* at most WK_PROTO_ROW_SNAPS_MAX a row */
    int32_t many[WK_PROTO_ROW_SNAPS_MAX + 1];
    for (size_t k = 0; k <= WK_PROTO_ROW_SNAPS_MAX; k++) {
        many[k] = (int32_t)k;
        sn[k].at = (uint32_t)k + 1;
    }
    row.tokens = many;
    row.n_tokens = WK_PROTO_ROW_SNAPS_MAX + 1;
    row.n_snaps = WK_PROTO_ROW_SNAPS_MAX;
    o = roundtrip(&m, WK_OK);
    assert_int_equal(o->step->rows[0]->n_snaps, WK_PROTO_ROW_SNAPS_MAX);
    wk_proto_free(o);
    row.n_snaps = WK_PROTO_ROW_SNAPS_MAX + 1;
    roundtrip(&m, WK_EPROTO);
    /* a NULL entry (never from the wire: wk_proto_validate on a message built here) */
    row.n_snaps = 2;
    snp[1] = NULL;
    wk_diag d = {{0}};
    assert_int_equal(wk_proto_validate(&m, &d), WK_EPROTO);
    assert_non_null(strstr(d.msg, "snap 1 missing"));
    snp[1] = &sn[1];
    assert_int_equal(wk_proto_validate(&m, NULL), WK_OK);
    /* snaps_saved is a plain bitmask in the result */
    Wkvm__RowResult rr = WKVM__ROW_RESULT__INIT;
    rr.slot = 1;
    rr.snaps_saved = 0x85u;
    Wkvm__RowResult *rrp[1] = {&rr};
    Wkvm__StepResult sr = WKVM__STEP_RESULT__INIT;
    sr.rows = rrp;
    sr.n_rows = 1;
    wk_msg mr = WKVM__ENVELOPE__INIT;
    mr.kind = WKVM__KIND__STEP_RESULT;
    mr.payload_case = WKVM__ENVELOPE__PAYLOAD_STEP_RESULT;
    mr.step_result = &sr;
    o = roundtrip(&mr, WK_OK);
    assert_int_equal(o->step_result->rows[0]->snaps_saved, 0x85u);
    wk_proto_free(o);
}

static void
test_chunk_limits(void **state)
{
    (void)state;
    uint8_t *big = calloc(WK_PROTO_CHUNK_MAX + 1, 1);
    Wkvm__SlotWrite w = WKVM__SLOT_WRITE__INIT;
    w.data.data = big;
    w.data.len = WK_PROTO_CHUNK_MAX;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__SLOT_WRITE;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_WRITE;
    m.slot_write = &w;
    wk_msg *o = roundtrip(&m, WK_OK);
    assert_int_equal(o->slot_write->data.len, WK_PROTO_CHUNK_MAX);
    wk_proto_free(o);
    w.data.len = WK_PROTO_CHUNK_MAX + 1;
    roundtrip(&m, WK_EPROTO);
    Wkvm__SlotRead r = WKVM__SLOT_READ__INIT;
    r.length = WK_PROTO_CHUNK_MAX + 1;
    wk_msg mr = WKVM__ENVELOPE__INIT;
    mr.kind = WKVM__KIND__SLOT_READ;
    mr.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_READ;
    mr.slot_read = &r;
    roundtrip(&mr, WK_EPROTO);
    Wkvm__MigratePrepare mp = WKVM__MIGRATE_PREPARE__INIT;
    mp.role = "send";
    mp.nccl_unique_id.data = big;
    mp.nccl_unique_id.len = 127;
    wk_msg mm = WKVM__ENVELOPE__INIT;
    mm.kind = WKVM__KIND__MIGRATE_PREPARE;
    mm.payload_case = WKVM__ENVELOPE__PAYLOAD_MIGRATE_PREPARE;
    mm.migrate_prepare = &mp;
    roundtrip(&mm, WK_EPROTO);
    mp.nccl_unique_id.len = WK_PROTO_NCCL_ID_LEN;
    o = roundtrip(&mm, WK_OK);
    wk_proto_free(o);
    mp.role = "steal";
    roundtrip(&mm, WK_EPROTO);
    free(big);
}

static void
test_long_string(void **state)
{
    (void)state;
    char *s = malloc(WK_PROTO_STR_MAX + 2);
    memset(s, 'a', WK_PROTO_STR_MAX + 1);
    s[WK_PROTO_STR_MAX + 1] = '\0';
    Wkvm__LoadModel lm = WKVM__LOAD_MODEL__INIT;
    lm.model_dir = s;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__LOAD_MODEL;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_LOAD_MODEL;
    m.load_model = &lm;
    roundtrip(&m, WK_EPROTO);
    s[WK_PROTO_STR_MAX] = '\0';
    wk_msg *o = roundtrip(&m, WK_OK);
    wk_proto_free(o);
    free(s);
}

static void
test_state_layout(void **state)
{
    (void)state;
    uint64_t shp[5] = {4, 16, 16, 1, 1};
    Wkvm__StateTensor t0 = WKVM__STATE_TENSOR__INIT, t1 = WKVM__STATE_TENSOR__INIT;
    t0.name = "layers.0.conv";
    t0.n_shape = 2;
    t0.shape = shp;
    t1.name = "layers.0.ssm";
    t1.n_shape = 3;
    t1.shape = shp;
    Wkvm__StateTensor *ts[2] = {&t0, &t1};
    Wkvm__ModelInfo mi = WKVM__MODEL_INFO__INIT;
    mi.family = "mamba2";
    mi.n_state_tensors = 2;
    mi.state_tensors = ts;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__MODEL_INFO;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_MODEL_INFO;
    m.model_info = &mi;
    wk_msg *o = roundtrip(&m, WK_OK);
    assert_int_equal(o->model_info->n_state_tensors, 2);
    assert_string_equal(o->model_info->state_tensors[1]->name, "layers.0.ssm");
    assert_int_equal(o->model_info->state_tensors[1]->shape[2], 16);
    wk_proto_free(o);
    /* five dimensions, a zero extent, an empty name: each refused */
    t1.n_shape = 5;
    roundtrip(&m, WK_EPROTO);
    t1.n_shape = 3;
    shp[1] = 0;
    roundtrip(&m, WK_EPROTO);
    shp[1] = 16;
    t0.name = "";
    roundtrip(&m, WK_EPROTO);
}

static void
test_host_ref(void **state)
{
    (void)state;
    Wkvm__HostRef h = WKVM__HOST_REF__INIT;
    h.key = "abc";
    h.slot = 3;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__HOST_PUT;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_HOST_REF;
    m.host_ref = &h;
    wk_msg *o = roundtrip(&m, WK_OK);
    assert_string_equal(o->host_ref->key, "abc");
    wk_proto_free(o);
    h.key = ""; /* keys are 1..128 bytes */
    roundtrip(&m, WK_EPROTO);
    char big[200];
    memset(big, 'k', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    h.key = big;
    roundtrip(&m, WK_EPROTO);
    m.kind = WKVM__KIND__HOST_GET; /* same payload for get and drop */
    h.key = "x";
    o = roundtrip(&m, WK_OK);
    wk_proto_free(o);
}

static void
test_garbage(void **state)
{
    (void)state;
    wk_msg *o = NULL;
    uint8_t junk[64];
    uint32_t x = 12345;
    for (int round = 0; round < 2000; round++) {
        size_t n = (size_t)(x % sizeof(junk));
        for (size_t i = 0; i < n; i++) {
            x = x * 1664525u + 1013904223u;
            junk[i] = (uint8_t)(x >> 24);
        }
        wk_err err = wk_proto_decode(junk, n, &o, NULL);
        if (err == WK_OK)
            wk_proto_free(o);
        else
            assert_true(err == WK_EPROTO);
    }
    /* A length-delimited field that runs past the end. */
    uint8_t trunc[] = {0x22, 0x7f, 'a'};
    assert_int_equal(wk_proto_decode(trunc, sizeof(trunc), &o, NULL), WK_EPROTO);
    assert_int_equal(wk_proto_decode(junk, (size_t)WK_PROTO_MSG_MAX + 1, &o, NULL), WK_ETOOBIG);
    assert_string_equal(wk_proto_kind_name(WKVM__KIND__STEP), "STEP");
    assert_string_equal(wk_proto_kind_name(-3), "UNKNOWN");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello_roundtrip),
        cmocka_unit_test(test_kind_payload_mismatch),
        cmocka_unit_test(test_step_limits),
        cmocka_unit_test(test_step_snaps),
        cmocka_unit_test(test_chunk_limits),
        cmocka_unit_test(test_long_string),
        cmocka_unit_test(test_state_layout),
        cmocka_unit_test(test_host_ref),
        cmocka_unit_test(test_garbage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
