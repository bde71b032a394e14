/*
 * Unit tests for ctl_statefile: a round trip (and a byte-identical rewrite),
 * the RWKV-7 tensor table, the writer's refusals, and the reader's refusal
 * of every corruption: truncation at every prefix length, a flip of every
 * byte, trailing bytes, bad magic, format version 2, and, with the checksum
 * recomputed so that the semantic checks are reached, each header field and
 * tensor table entry made wrong, a bad token digest and non-zero padding.
 * The header offsets below restate docs/STATE_FORMAT.md and pin the format.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ctl_statefile.h"
#include "wk_sha256.h"

#define OFF_VERSION 8
#define OFF_FLAGS 12
#define OFF_FILE_BYTES 16
#define OFF_DATA_OFFSET 24
#define OFF_STATE_BYTES 32
#define OFF_TOKEN_COUNT 40
#define OFF_TENSOR_COUNT 48
#define OFF_RESERVED 52
#define OFF_FAMILY 56
#define OFF_FINGERPRINT 72
#define OFF_TOKENIZER 104
#define OFF_TOKEN_DIGEST 136
#define OFF_TOKENS 168

static const char FP[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
static const char TZ[] = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

/* A small valid file: RWKV-7 layout L=2, C=4, H=2, N=2, four tokens. */
typedef struct sample {
    uint8_t *buf;               /* the encoded file, heap */
    size_t len;                 /* its length */
    float state[64];            /* the state bytes it carries (2 * (8 + 8) floats = 128 bytes) */
    int32_t tokens[4];          /* its tokens */
    ctl_statefile_tensor *tens; /* its tensor table, heap */
    uint32_t n_tens;            /* entries in tens */
    uint64_t state_bytes;       /* bytes of state */
} sample;

static void
sample_hdr(sample *s, ctl_statefile_hdr *h)
{
    memset(h, 0, sizeof(*h));
    snprintf(h->family, sizeof(h->family), "rwkv7");
    memcpy(h->fingerprint, FP, sizeof(FP));
    memcpy(h->tokenizer_digest, TZ, sizeof(TZ));
    h->tokens = s->tokens;
    h->n_tokens = 4;
    h->tensors = s->tens;
    h->n_tensors = s->n_tens;
}

static void
sample_make(sample *s)
{
    ctl_statefile_hdr h;
    memset(s, 0, sizeof(*s));
    for (int i = 0; i < 32; i++)
        s->state[i] = (float)i * 0.5f - 3.0f;
    s->tokens[0] = 1;
    s->tokens[1] = 2;
    s->tokens[2] = 65529;
    s->tokens[3] = 0;
    assert_int_equal(ctl_statefile_layout_rwkv7(2, 4, 2, 2, &s->tens, &s->n_tens,
                                                &s->state_bytes, NULL),
                     WK_OK);
    assert_int_equal(s->state_bytes, 128);
    sample_hdr(s, &h);
    void *out;
    assert_int_equal(ctl_statefile_write(&h, s->state, 128, &out, &s->len, NULL), WK_OK);
    s->buf = out;
}

static void
sample_free(sample *s)
{
    free(s->buf);
    free(s->tens);
}

static void
put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void
put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t
get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Recomputes the checksum trailer so that the checks behind it are reached. */
static void
reseal(uint8_t *b, size_t len)
{
    wk_sha256_buf(b, len - 32, b + len - 32);
}

/* Reads b and expects err with a message containing want (when not NULL). */
static void
expect_read(const uint8_t *b, size_t len, wk_err err, const char *want)
{
    ctl_statefile_hdr h;
    const void *st = NULL;
    size_t sl = 0;
    wk_diag d = {""};
    wk_err e = ctl_statefile_read(b, len, &h, &st, &sl, &d);
    if (e == WK_OK)
        ctl_statefile_hdr_fini(&h);
    if (e != err || (want != NULL && strstr(d.msg, want) == NULL))
        fail_msg("read: got %s '%s', want %s '%s'", wk_err_name(e), d.msg, wk_err_name(err),
                 want ? want : "");
}

/* Offset of the tensor table in the sample (after 4 tokens). */
#define TABLE_OFF (OFF_TOKENS + 4 * 4)

static void
test_round_trip(void **state)
{
    (void)state;
    sample s;
    sample_make(&s);
    /* fixed 168 + 16 tokens + table, aligned to 64, + 128 state + 32 checksum */
    assert_int_equal(s.len % 32, 0);
    assert_memory_equal(s.buf, "WKVMSTAT", 8);
    ctl_statefile_hdr h;
    const void *st;
    size_t sl;
    assert_int_equal(ctl_statefile_read(s.buf, s.len, &h, &st, &sl, NULL), WK_OK);
    assert_int_equal(h.version, 1);
    assert_string_equal(h.family, "rwkv7");
    assert_string_equal(h.fingerprint, FP);
    assert_string_equal(h.tokenizer_digest, TZ);
    char td[WK_SHA256_HEX_LEN];
    assert_int_equal(wk_sha256_token_ids_hex(s.tokens, 4, td), WK_OK);
    assert_string_equal(h.token_digest, td);
    assert_int_equal(h.n_tokens, 4);
    assert_memory_equal(h.tokens, s.tokens, sizeof(s.tokens));
    assert_int_equal(h.state_bytes, 128);
    assert_int_equal(sl, 128);
    assert_true((const uint8_t *)st > s.buf && (const uint8_t *)st + sl <= s.buf + s.len);
    assert_int_equal(((const uint8_t *)st - s.buf) % 64, 0);
    assert_memory_equal(st, s.state, 128);
    assert_int_equal(h.n_tensors, 6);
    for (uint32_t i = 0; i < 6; i++) {
        assert_string_equal(h.tensors[i].name, s.tens[i].name);
        assert_int_equal(h.tensors[i].offset, s.tens[i].offset);
        assert_int_equal(h.tensors[i].nbytes, s.tens[i].nbytes);
        assert_int_equal(h.tensors[i].ndim, s.tens[i].ndim);
        assert_int_equal(h.tensors[i].dtype, CTL_STATEFILE_DTYPE_F32);
    }
    assert_string_equal(h.tensors[5].name, "layers.1.wkv");
    /* canonical: writing what was read gives the same bytes */
    void *again;
    size_t alen;
    assert_int_equal(ctl_statefile_write(&h, st, sl, &again, &alen, NULL), WK_OK);
    assert_int_equal(alen, s.len);
    assert_memory_equal(again, s.buf, s.len);
    free(again);
    ctl_statefile_hdr_fini(&h);
    ctl_statefile_hdr_fini(&h);
    ctl_statefile_hdr_fini(NULL);
    sample_free(&s);
}

static void
test_zero_tokens(void **state)
{
    (void)state;
    sample s;
    sample_make(&s);
    ctl_statefile_hdr h, r;
    sample_hdr(&s, &h);
    h.tokens = NULL;
    h.n_tokens = 0;
    void *out;
    size_t len;
    const void *st;
    size_t sl;
    assert_int_equal(ctl_statefile_write(&h, s.state, 128, &out, &len, NULL), WK_OK);
    assert_int_equal(ctl_statefile_read(out, len, &r, &st, &sl, NULL), WK_OK);
    assert_int_equal(r.n_tokens, 0);
    assert_null(r.tokens);
    assert_string_equal(r.token_digest,
                        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    ctl_statefile_hdr_fini(&r);
    free(out);
    sample_free(&s);
}

static void
test_layout_rwkv7(void **state)
{
    (void)state;
    ctl_statefile_tensor *t;
    uint32_t n;
    uint64_t sb;
    wk_diag d = {""};
    assert_int_equal(ctl_statefile_layout_rwkv7(3, 8, 2, 4, &t, &n, &sb, NULL), WK_OK);
    assert_int_equal(n, 9);
    assert_int_equal(sb, 3 * (2 * 8 + 2 * 4 * 4) * 4);
    assert_string_equal(t[0].name, "layers.0.att_shift");
    assert_string_equal(t[1].name, "layers.0.ffn_shift");
    assert_string_equal(t[2].name, "layers.0.wkv");
    assert_string_equal(t[7].name, "layers.2.ffn_shift");
    assert_int_equal(t[2].ndim, 3);
    assert_int_equal(t[2].shape[0], 2);
    assert_int_equal(t[2].shape[1], 4);
    assert_int_equal(t[2].shape[2], 4);
    assert_int_equal(t[3].offset, (2 * 8 + 2 * 4 * 4) * 4);
    assert_int_equal(t[4].offset, t[3].offset + 32);
    assert_string_equal(ctl_statefile_dtype_name(t[0].dtype), "F32");
    assert_string_equal(ctl_statefile_dtype_name((ctl_statefile_dtype)9), "?");
    free(t);
    assert_int_equal(ctl_statefile_layout_rwkv7(0, 8, 2, 4, &t, &n, &sb, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "layers 0"));
    assert_int_equal(ctl_statefile_layout_rwkv7(2000, 8, 2, 4, &t, &n, &sb, NULL), WK_ETOOBIG);
    assert_int_equal(ctl_statefile_layout_rwkv7(1, 8, 65536, 65536, &t, &n, &sb, NULL),
                     WK_ETOOBIG);
}

static void
test_truncation(void **state)
{
    (void)state;
    sample s;
    sample_make(&s);
    for (size_t n = 0; n < s.len; n++)
        expect_read(s.buf, n, WK_EINVAL, n < 200 ? NULL : "truncated");
    expect_read(s.buf, 100, WK_EINVAL, "truncated");
    expect_read(NULL, 0, WK_EINVAL, "truncated");
    /* one trailing byte */
    uint8_t *b = malloc(s.len + 1);
    memcpy(b, s.buf, s.len);
    b[s.len] = 0;
    expect_read(b, s.len + 1, WK_EINVAL, "trailing");
    free(b);
    sample_free(&s);
}

static void
test_every_byte_flipped(void **state)
{
    (void)state;
    sample s;
    sample_make(&s);
    static uint8_t b[1024];
    assert_true(s.len <= sizeof(b));
    uint64_t data_off = get_u64(s.buf + OFF_DATA_OFFSET);
    for (size_t i = 0; i < s.len; i++) {
        memcpy(b, s.buf, s.len);
        b[i] ^= 0x41;
        ctl_statefile_hdr h;
        const void *st;
        size_t sl;
        wk_diag d = {""};
        wk_err e = ctl_statefile_read(b, s.len, &h, &st, &sl, &d);
        if (e == WK_OK)
            fail_msg("flip at %zu accepted", i);
        if (i >= OFF_FAMILY || i < 8)
            /* past the lengths (or the magic): only the checksum can notice */
            assert_int_equal(e, i < 8 ? WK_EINVAL : WK_ECORRUPT);
        else
            assert_true(e == WK_EINVAL || e == WK_ECORRUPT);
        if (i >= data_off)
            assert_int_equal(e, WK_ECORRUPT);
    }
    sample_free(&s);
}

static void
test_fixed_fields(void **state)
{
    (void)state;
    sample s;
    sample_make(&s);
    static uint8_t b[1024];
    assert_true(s.len <= sizeof(b));
#define FRESH() memcpy(b, s.buf, s.len)
    FRESH();
    memcpy(b, "WKVMSTAX", 8);
    expect_read(b, s.len, WK_EINVAL, "bad magic");
    FRESH();
    put_u32(b + OFF_VERSION, 2);
    expect_read(b, s.len, WK_EINVAL, "format version 2");
    reseal(b, s.len);
    expect_read(b, s.len, WK_EINVAL, "format version 2");
    FRESH();
    put_u32(b + OFF_FLAGS, 1);
    expect_read(b, s.len, WK_EINVAL, "reserved flags");
    FRESH();
    put_u32(b + OFF_RESERVED, 7);
    expect_read(b, s.len, WK_EINVAL, "reserved header field");
    FRESH();
    put_u64(b + OFF_FILE_BYTES, s.len + 64);
    expect_read(b, s.len, WK_EINVAL, "truncated");
    FRESH();
    put_u64(b + OFF_FILE_BYTES, s.len - 64);
    expect_read(b, s.len, WK_EINVAL, "trailing");
    FRESH();
    put_u64(b + OFF_TOKEN_COUNT, ((uint64_t)1 << 20) + 1);
    expect_read(b, s.len, WK_EINVAL, "token count");
    FRESH();
    put_u32(b + OFF_TENSOR_COUNT, 0);
    expect_read(b, s.len, WK_EINVAL, "tensor count 0");
    FRESH();
    put_u32(b + OFF_TENSOR_COUNT, 5000);
    expect_read(b, s.len, WK_EINVAL, "tensor count 5000");
    FRESH();
    put_u64(b + OFF_STATE_BYTES, (uint64_t)1 << 40);
    expect_read(b, s.len, WK_EINVAL, "state byte count");
    FRESH();
    put_u64(b + OFF_STATE_BYTES, 64);
    expect_read(b, s.len, WK_EINVAL, "lengths disagree");
    FRESH();
    put_u64(b + OFF_DATA_OFFSET, get_u64(s.buf + OFF_DATA_OFFSET) + 1);
    expect_read(b, s.len, WK_EINVAL, "not a multiple of 64");
    FRESH();
    put_u64(b + OFF_DATA_OFFSET, 128);
    expect_read(b, s.len, WK_EINVAL, "inside the token ids");
    FRESH();
    put_u64(b + OFF_DATA_OFFSET, UINT64_MAX - 63);
    expect_read(b, s.len, WK_EINVAL, "lengths disagree");
    /* a token count that pushes the tokens past the data offset */
    FRESH();
    put_u64(b + OFF_TOKEN_COUNT, 1000);
    expect_read(b, s.len, WK_EINVAL, "inside the token ids");
    /* consistent lengths, damaged content: the checksum answers */
    FRESH();
    b[s.len - 1] ^= 1;
    expect_read(b, s.len, WK_ECORRUPT, "checksum");
    FRESH();
    b[get_u64(s.buf + OFF_DATA_OFFSET) + 5] ^= 1;
    expect_read(b, s.len, WK_ECORRUPT, "checksum");
#undef FRESH
    sample_free(&s);
}

static void
test_resealed_fields(void **state)
{
    (void)state;
    sample s;
    sample_make(&s);
    static uint8_t b[1024];
    assert_true(s.len <= sizeof(b));
#define FRESH() memcpy(b, s.buf, s.len)
#define EXPECT(msg)                                                                            \
    do {                                                                                       \
        reseal(b, s.len);                                                                      \
        expect_read(b, s.len, WK_EINVAL, msg);                                                 \
    } while (0)
    FRESH();
    b[OFF_FAMILY] = 'R';
    EXPECT("family has a byte");
    FRESH();
    memset(b + OFF_FAMILY, 0, 16);
    EXPECT("family is empty");
    FRESH();
    memset(b + OFF_FAMILY, 'a', 16);
    EXPECT("not NUL-terminated");
    FRESH();
    b[OFF_FAMILY + 10] = 'x';
    EXPECT("after its terminator");
    FRESH();
    b[OFF_TOKEN_DIGEST] ^= 1;
    EXPECT("token digest mismatch");
    FRESH();
    b[OFF_TOKENS + 4] ^= 1; /* token 1 changed, digest not */
    EXPECT("token digest mismatch");
    FRESH();
    put_u32(b + OFF_TOKENS + 8, 0x80000000u);
    EXPECT("token 2 is negative");
    /* tensor 0: name_len 18 "layers.0.att_shift", dtype, ndim 1, shape[1], offset */
    size_t t0 = TABLE_OFF;
    assert_int_equal(s.buf[t0], 18);
    size_t t0_dtype = t0 + 1 + 18, t0_ndim = t0_dtype + 1, t0_shape = t0_ndim + 1;
    size_t t0_off = t0_shape + 8, t1 = t0_off + 8;
    FRESH();
    b[t0 + 1 + 6] = '/';
    EXPECT("tensor 0: name has a byte outside");
    FRESH();
    b[t0] = 0;
    EXPECT("tensor 0: empty name");
    FRESH();
    b[t0] = 200;
    EXPECT("tensor 0: name longer");
    FRESH();
    b[t0_dtype] = 2;
    EXPECT("tensor 0: unknown dtype code 2");
    FRESH();
    b[t0_ndim] = 0;
    EXPECT("tensor 0: 0 dimensions");
    FRESH();
    b[t0_ndim] = 5;
    EXPECT("tensor 0: 5 dimensions");
    FRESH();
    put_u64(b + t0_shape, 0);
    EXPECT("tensor 0: dimension 0 is zero");
    FRESH();
    put_u64(b + t0_shape, (uint64_t)1 << 40);
    EXPECT("tensor 0: shape is larger");
    FRESH();
    put_u64(b + t0_shape, 5); /* 20 bytes: tensor 1 no longer starts where 0 ends */
    EXPECT("tensor 1: offset 16, expected 20");
    FRESH();
    put_u64(b + t0_shape, 40); /* runs past the 128 bytes */
    EXPECT("tensor 0: bytes [0, +160) run past");
    FRESH();
    put_u64(b + t0_off, 4);
    EXPECT("tensor 0: offset 4, expected 0");
    FRESH();
    memcpy(b + t1 + 1, "layers.0.att_shift", 18); /* tensor 1 renamed to tensor 0's name */
    EXPECT("appears twice");
    FRESH();
    put_u32(b + OFF_TENSOR_COUNT, 5); /* five tensors cover 96 of 128 bytes */
    EXPECT("the tensors cover 96 of 128 state bytes");
    FRESH();
    put_u32(b + OFF_TENSOR_COUNT, 7); /* a seventh entry would start in the padding */
    reseal(b, s.len);
    ctl_statefile_hdr h;
    const void *st;
    size_t sl;
    assert_int_equal(ctl_statefile_read(b, s.len, &h, &st, &sl, NULL), WK_EINVAL);
    /* non-zero padding between the table and the data */
    uint64_t data_off = get_u64(s.buf + OFF_DATA_OFFSET);
    FRESH();
    b[data_off - 1] = 1;
    EXPECT("padding byte");
    /* a data offset one 64-byte step further than needed (lengths kept consistent) */
    {
        size_t len2 = s.len + 64;
        uint8_t *c = calloc(1, len2);
        memcpy(c, s.buf, data_off);
        memcpy(c + data_off + 64, s.buf + data_off, s.len - data_off);
        put_u64(c + OFF_DATA_OFFSET, data_off + 64);
        put_u64(c + OFF_FILE_BYTES, len2);
        reseal(c, len2);
        expect_read(c, len2, WK_EINVAL, "not the first 64-byte boundary");
        free(c);
    }
#undef EXPECT
#undef FRESH
    sample_free(&s);
}

static void
test_write_refusals(void **state)
{
    (void)state;
    sample s;
    sample_make(&s);
    ctl_statefile_hdr h;
    void *out = NULL;
    size_t len;
    wk_diag d = {""};
#define REFUSE(code, want)                                                                     \
    do {                                                                                       \
        d.msg[0] = '\0';                                                                       \
        assert_int_equal(ctl_statefile_write(&h, s.state, 128, &out, &len, &d), code);         \
        if (strstr(d.msg, want) == NULL)                                                       \
            fail_msg("message '%s' lacks '%s'", d.msg, want);                                  \
    } while (0)
    sample_hdr(&s, &h);
    h.fingerprint[3] = 'A';
    REFUSE(WK_EINVAL, "model fingerprint");
    sample_hdr(&s, &h);
    h.fingerprint[63] = '\0';
    REFUSE(WK_EINVAL, "model fingerprint");
    sample_hdr(&s, &h);
    h.tokenizer_digest[0] = 'g';
    REFUSE(WK_EINVAL, "tokenizer digest");
    sample_hdr(&s, &h);
    h.family[0] = '\0';
    REFUSE(WK_EINVAL, "family is empty");
    sample_hdr(&s, &h);
    memset(h.family, 'a', sizeof(h.family));
    REFUSE(WK_EINVAL, "family is longer");
    sample_hdr(&s, &h);
    memcpy(h.token_digest, FP, sizeof(FP));
    REFUSE(WK_EINVAL, "does not match the tokens");
    sample_hdr(&s, &h);
    h.state_bytes = 64;
    REFUSE(WK_EINVAL, "header says 64 state bytes");
    sample_hdr(&s, &h);
    h.n_tokens = ((uint64_t)1 << 20) + 1;
    REFUSE(WK_ETOOBIG, "tokens is over the limit");
    sample_hdr(&s, &h);
    s.tokens[1] = -5;
    REFUSE(WK_EINVAL, "token 1 is negative");
    s.tokens[1] = 2;
    sample_hdr(&s, &h);
    h.n_tensors = 5;
    REFUSE(WK_EINVAL, "cover 96 of 128");
    sample_hdr(&s, &h);
    h.n_tensors = 0;
    REFUSE(WK_EINVAL, "tensor table is empty");
    sample_hdr(&s, &h);
    snprintf(s.tens[4].name, sizeof(s.tens[4].name), "layers.0.wkv");
    REFUSE(WK_EINVAL, "appears twice");
    snprintf(s.tens[4].name, sizeof(s.tens[4].name), "layers.1.ffn_shift");
    s.tens[2].offset += 4;
    REFUSE(WK_EINVAL, "tensor 2: offset");
    s.tens[2].offset -= 4;
    s.tens[1].dtype = (ctl_statefile_dtype)3;
    REFUSE(WK_EINVAL, "unknown dtype");
    s.tens[1].dtype = CTL_STATEFILE_DTYPE_F32;
    s.tens[0].name[3] = ' ';
    REFUSE(WK_EINVAL, "tensor 0: name");
    s.tens[0].name[3] = 'e';
    assert_int_equal(ctl_statefile_write(&h, s.state, 128, &out, &len, NULL), WK_OK);
    free(out);
    assert_int_equal(ctl_statefile_write(NULL, s.state, 128, &out, &len, NULL), WK_EINVAL);
#undef REFUSE
    sample_free(&s);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),     cmocka_unit_test(test_zero_tokens),
        cmocka_unit_test(test_layout_rwkv7),   cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_every_byte_flipped), cmocka_unit_test(test_fixed_fields),
        cmocka_unit_test(test_resealed_fields), cmocka_unit_test(test_write_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
