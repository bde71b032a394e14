/*
 * Unit tests for wk_gguf: a good v3 file (every metadata scalar type, a
 * string, string and integer arrays, F32/F16/BF16 tensors of 1 and 2 dims
 * with their shapes reversed to row-major) and a v2 file; then malformed
 * images, each with its error code and a diagnostic naming the tensor or
 * key: every truncation of the good file, bad magic, versions 1 and 4, huge
 * tensor / key / array counts and string lengths, offsets past the end,
 * misaligned and overlapping data, a bad general.alignment, quantized types
 * (named in the error), too many dims, size overflow, duplicate keys and
 * tensor names, nested arrays. Also wk_tensor_set_open() on a .gguf file and
 * wk_tensor_set_new() views. Files are built in memory (a temp file for the
 * set). With WK_GGUF_SEED_DIR set, the good and a few bad images are written
 * there (how tests/fuzz/corpus/gguf/ was made).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <fcntl.h>
#include <unistd.h>

#include "wk_gguf.h"
#include "wk_tensor.h"

/* A growable byte buffer for building images. */
typedef struct gbuf {
    uint8_t *p;  /* bytes */
    size_t n;    /* used */
    size_t cap;  /* allocated */
} gbuf;

static void
gb_put(gbuf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        b->p = realloc(b->p, cap);
        assert_non_null(b->p);
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void
gb_u8(gbuf *b, uint8_t v)
{
    gb_put(b, &v, 1);
}

static void
gb_u16(gbuf *b, uint16_t v)
{
    uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    gb_put(b, x, 2);
}

static void
gb_u32(gbuf *b, uint32_t v)
{
    uint8_t x[4];
    for (int i = 0; i < 4; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    gb_put(b, x, 4);
}

static void
gb_u64(gbuf *b, uint64_t v)
{
    uint8_t x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    gb_put(b, x, 8);
}

static void
gb_str(gbuf *b, const char *s)
{
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}

static void
gb_header(gbuf *b, uint32_t version, uint64_t n_t, uint64_t n_kv)
{
    gb_put(b, "GGUF", 4);
    gb_u32(b, version);
    gb_u64(b, n_t);
    gb_u64(b, n_kv);
}

static void
gb_pad(gbuf *b, size_t align)
{
    while (b->n % align)
        gb_u8(b, 0);
}

/* A tensor info: dims given fastest-first, as GGUF stores them. */
static void
gb_tinfo(gbuf *b, const char *name, uint32_t nd, const uint64_t *dims, uint32_t type,
         uint64_t off)
{
    gb_str(b, name);
    gb_u32(b, nd);
    for (uint32_t i = 0; i < nd; i++)
        gb_u64(b, dims[i]);
    gb_u32(b, type);
    gb_u64(b, off);
}

static float
f32_at(const wk_tensor *t, size_t i)
{
    float f;
    assert_int_equal(wk_tensor_read_f32(t, i, 1, &f), WK_OK);
    return f;
}

/*
 * The good image: 11 keys, tensors "a" F32 dims {3,2} (shape [2,3]) at 0,
 * "b" F16 {4} at 32, "c" BF16 {2,2} at 64 (last, ending the file).
 */
static void
good_image(gbuf *b, uint32_t version)
{
    gb_header(b, version, 3, 11);
    gb_str(b, "general.architecture");
    gb_u32(b, WK_GGUF_TYPE_STRING);
    gb_str(b, "rwkv7");
    gb_str(b, "general.alignment");
    gb_u32(b, WK_GGUF_TYPE_UINT32);
    gb_u32(b, 32);
    gb_str(b, "u8");
    gb_u32(b, WK_GGUF_TYPE_UINT8);
    gb_u8(b, 200);
    gb_str(b, "i8");
    gb_u32(b, WK_GGUF_TYPE_INT8);
    gb_u8(b, 0xfe); /* -2 */
    gb_str(b, "u16");
    gb_u32(b, WK_GGUF_TYPE_UINT16);
    gb_u16(b, 65535);
    gb_str(b, "i64");
    gb_u32(b, WK_GGUF_TYPE_INT64);
    gb_u64(b, (uint64_t)1 << 40);
    gb_str(b, "f32");
    gb_u32(b, WK_GGUF_TYPE_FLOAT32);
    float eps = 1e-5f;
    uint32_t eb;
    memcpy(&eb, &eps, 4);
    gb_u32(b, eb);
    gb_str(b, "f64");
    gb_u32(b, WK_GGUF_TYPE_FLOAT64);
    double h = 0.5;
    uint64_t hb;
    memcpy(&hb, &h, 8);
    gb_u64(b, hb);
    gb_str(b, "flag");
    gb_u32(b, WK_GGUF_TYPE_BOOL);
    gb_u8(b, 1);
    gb_str(b, "tokenizer.ggml.tokens");
    gb_u32(b, WK_GGUF_TYPE_ARRAY);
    gb_u32(b, WK_GGUF_TYPE_STRING);
    gb_u64(b, 3);
    gb_str(b, "<s>");
    gb_str(b, "");
    gb_str(b, "\\n\\n");
    gb_str(b, "ints");
    gb_u32(b, WK_GGUF_TYPE_ARRAY);
    gb_u32(b, WK_GGUF_TYPE_INT32);
    gb_u64(b, 2);
    gb_u32(b, 7);
    gb_u32(b, 0xffffffffu);

    uint64_t da[2] = {3, 2}, db[1] = {4}, dc[2] = {2, 2};
    gb_tinfo(b, "a", 2, da, 0, 0);
    gb_tinfo(b, "b", 1, db, 1, 32);
    gb_tinfo(b, "c", 2, dc, 30, 64);
    gb_pad(b, 32);
    for (int i = 0; i < 6; i++) {
        float f = (float)i + 0.25f;
        uint32_t u;
        memcpy(&u, &f, 4);
        gb_u32(b, u);
    }
    gb_pad(b, 32);
    for (int i = 0; i < 4; i++)
        gb_u16(b, wk_f32_to_f16((float)(i + 1)));
    gb_pad(b, 32);
    for (int i = 0; i < 4; i++)
        gb_u16(b, wk_f32_to_bf16((float)(-i)));
}

static void
seed_write(const char *name, const gbuf *b)
{
    const char *dir = getenv("WK_GGUF_SEED_DIR");
    if (dir == NULL)
        return;
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b->p, 1, b->n, f), b->n);
    assert_int_equal(fclose(f), 0);
}

static void
test_good(void **state)
{
    (void)state;
    gbuf b = {0};
    good_image(&b, 3);
    seed_write("good_v3.gguf", &b);
    wk_gguf *g = NULL;
    wk_diag d = {""};
    assert_int_equal(wk_gguf_parse(b.p, b.n, &g, &d), WK_OK);
    assert_string_equal(d.msg, "");
    assert_int_equal(wk_gguf_version(g), 3);
    assert_int_equal(wk_gguf_tensor_count(g), 3);
    assert_int_equal(wk_gguf_kv_count(g), 11);
    wk_gguf_type ty;
    assert_string_equal(wk_gguf_kv_key(g, 9, &ty), "tokenizer.ggml.tokens");
    assert_int_equal(ty, WK_GGUF_TYPE_ARRAY);
    assert_null(wk_gguf_kv_key(g, 11, &ty));

    const wk_tensor *a = wk_gguf_tensor_find(g, "a");
    assert_non_null(a);
    assert_ptr_equal(a, wk_gguf_tensor_at(g, 0));
    assert_int_equal(a->dtype, WK_DTYPE_F32);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[0], 2); /* GGUF {3, 2} is row-major [2, 3] */
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->nbytes, 24);
    assert_true(f32_at(a, 5) == 5.25f);
    const wk_tensor *bt = wk_gguf_tensor_find(g, "b");
    assert_int_equal(bt->dtype, WK_DTYPE_F16);
    assert_int_equal(bt->ndim, 1);
    assert_int_equal(bt->shape[0], 4);
    assert_true(f32_at(bt, 3) == 4.0f);
    const wk_tensor *c = wk_gguf_tensor_find(g, "c");
    assert_int_equal(c->dtype, WK_DTYPE_BF16);
    assert_true(f32_at(c, 3) == -3.0f);
    assert_ptr_equal((const uint8_t *)c->data + c->nbytes, b.p + b.n);
    assert_null(wk_gguf_tensor_find(g, "d"));
    assert_null(wk_gguf_tensor_at(g, 3));

    const char *s;
    size_t len;
    assert_int_equal(wk_gguf_get_str(g, "general.architecture", &s, &len, &d), WK_OK);
    assert_int_equal(len, 5);
    assert_memory_equal(s, "rwkv7", 5);
    uint64_t u;
    assert_int_equal(wk_gguf_get_u64(g, "general.alignment", &u, &d), WK_OK);
    assert_int_equal(u, 32);
    assert_int_equal(wk_gguf_get_u64(g, "u8", &u, &d), WK_OK);
    assert_int_equal(u, 200);
    assert_int_equal(wk_gguf_get_u64(g, "u16", &u, &d), WK_OK);
    assert_int_equal(u, 65535);
    assert_int_equal(wk_gguf_get_u64(g, "i64", &u, &d), WK_OK);
    assert_int_equal(u, (uint64_t)1 << 40);
    assert_int_equal(wk_gguf_get_u64(g, "flag", &u, &d), WK_OK);
    assert_int_equal(u, 1);
    assert_int_equal(wk_gguf_get_u64(g, "i8", &u, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "i8"));
    assert_int_equal(wk_gguf_get_u64(g, "f32", &u, NULL), WK_EINVAL);
    assert_int_equal(wk_gguf_get_u64(g, "nope", &u, NULL), WK_ENOENT);
    double f;
    assert_int_equal(wk_gguf_get_f64(g, "f32", &f, NULL), WK_OK);
    assert_true(f == (double)1e-5f);
    assert_int_equal(wk_gguf_get_f64(g, "f64", &f, NULL), WK_OK);
    assert_true(f == 0.5);
    assert_int_equal(wk_gguf_get_f64(g, "u8", &f, NULL), WK_EINVAL);
    assert_int_equal(wk_gguf_get_str(g, "u8", &s, &len, NULL), WK_EINVAL);
    wk_gguf_type el;
    uint64_t n;
    assert_int_equal(wk_gguf_get_arr(g, "tokenizer.ggml.tokens", &el, &n, NULL), WK_OK);
    assert_int_equal(el, WK_GGUF_TYPE_STRING);
    assert_int_equal(n, 3);
    assert_int_equal(wk_gguf_arr_str(g, "tokenizer.ggml.tokens", 0, &s, &len, NULL), WK_OK);
    assert_int_equal(len, 3);
    assert_memory_equal(s, "<s>", 3);
    assert_int_equal(wk_gguf_arr_str(g, "tokenizer.ggml.tokens", 1, &s, &len, NULL), WK_OK);
    assert_int_equal(len, 0);
    assert_int_equal(wk_gguf_arr_str(g, "tokenizer.ggml.tokens", 2, &s, &len, NULL), WK_OK);
    assert_int_equal(len, 4);
    assert_memory_equal(s, "\\n\\n", 4);
    assert_int_equal(wk_gguf_arr_str(g, "tokenizer.ggml.tokens", 3, &s, &len, NULL), WK_EINVAL);
    assert_int_equal(wk_gguf_get_arr(g, "ints", &el, &n, NULL), WK_OK);
    assert_int_equal(el, WK_GGUF_TYPE_INT32);
    assert_int_equal(n, 2);
    assert_int_equal(wk_gguf_arr_str(g, "ints", 0, &s, &len, NULL), WK_EINVAL);
    assert_int_equal(wk_gguf_get_arr(g, "u8", &el, &n, NULL), WK_EINVAL);
    wk_gguf_free(g);
    wk_gguf_free(NULL);

    /* v2 has the same layout */
    gbuf b2 = {0};
    good_image(&b2, 2);
    assert_int_equal(wk_gguf_parse(b2.p, b2.n, &g, &d), WK_OK);
    assert_int_equal(wk_gguf_version(g), 2);
    wk_gguf_free(g);
    free(b2.p);
    free(b.p);
}

/* Every proper prefix of the good image is refused without a crash. */
static void
test_truncated(void **state)
{
    (void)state;
    gbuf b = {0};
    good_image(&b, 3);
    for (size_t len = 0; len < b.n; len++) {
        uint8_t *copy = malloc(len ? len : 1); /* exact size: ASan sees any overread */
        assert_non_null(copy);
        memcpy(copy, b.p, len);
        wk_gguf *g = NULL;
        wk_diag d = {""};
        wk_err e = wk_gguf_parse(copy, len, &g, &d);
        assert_int_equal(e, WK_EINVAL);
        assert_null(g);
        assert_true(d.msg[0] != '\0');
        free(copy);
    }
    gbuf t = {0};
    good_image(&t, 3);
    t.n -= 1;
    seed_write("regress_truncated.gguf", &t);
    free(t.p);
    free(b.p);
}

/* Parses b and expects err with a diagnostic holding want. */
static void
expect_bad(const gbuf *b, wk_err err, const char *want)
{
    wk_gguf *g = NULL;
    wk_diag d = {""};
    wk_err e = wk_gguf_parse(b->p, b->n, &g, &d);
    if (e != err || strstr(d.msg, want) == NULL)
        fail_msg("expected %s '%s', got %s '%s'", wk_err_name(err), want, wk_err_name(e), d.msg);
    assert_null(g);
}

static void
test_header(void **state)
{
    (void)state;
    gbuf b = {0};
    gb_put(&b, "GGUG", 4);
    gb_u32(&b, 3);
    gb_u64(&b, 0);
    gb_u64(&b, 0);
    expect_bad(&b, WK_EINVAL, "magic");
    b.n = 0;
    gb_header(&b, 1, 0, 0);
    expect_bad(&b, WK_ENOTSUP, "version 1");
    b.n = 0;
    gb_header(&b, 4, 0, 0);
    expect_bad(&b, WK_ENOTSUP, "version 4");
    b.n = 0;
    gb_header(&b, 3, 0, 0); /* empty file: valid */
    wk_gguf *g = NULL;
    assert_int_equal(wk_gguf_parse(b.p, b.n, &g, NULL), WK_OK);
    assert_int_equal(wk_gguf_tensor_count(g), 0);
    wk_gguf_free(g);
    free(b.p);
}

static void
test_huge_counts(void **state)
{
    (void)state;
    gbuf b = {0};
    gb_header(&b, 3, UINT64_MAX, 0);
    expect_bad(&b, WK_ETOOBIG, "tensors");
    seed_write("regress_huge_tensors.gguf", &b);
    b.n = 0;
    gb_header(&b, 3, 1000, 0); /* under the limit, past the end */
    expect_bad(&b, WK_EINVAL, "past the end");
    b.n = 0;
    gb_header(&b, 3, 0, (uint64_t)1 << 62);
    expect_bad(&b, WK_ETOOBIG, "metadata keys");
    b.n = 0;
    gb_header(&b, 3, 0, 100);
    expect_bad(&b, WK_EINVAL, "past the end");
    /* a string array claiming 2^40 entries */
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "tokenizer.ggml.tokens");
    gb_u32(&b, WK_GGUF_TYPE_ARRAY);
    gb_u32(&b, WK_GGUF_TYPE_STRING);
    gb_u64(&b, (uint64_t)1 << 40);
    gb_str(&b, "x");
    expect_bad(&b, WK_EINVAL, "tokenizer.ggml.tokens");
    seed_write("regress_huge_array.gguf", &b);
    /* an int array past the end */
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "ints");
    gb_u32(&b, WK_GGUF_TYPE_ARRAY);
    gb_u32(&b, WK_GGUF_TYPE_UINT64);
    gb_u64(&b, UINT64_MAX / 4);
    expect_bad(&b, WK_EINVAL, "ints");
    /* a key and a string value too long */
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_u64(&b, UINT64_MAX);
    gb_u64(&b, 0);
    expect_bad(&b, WK_ETOOBIG, "metadata key 0");
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "s");
    gb_u32(&b, WK_GGUF_TYPE_STRING);
    gb_u64(&b, 1000);
    gb_put(&b, "abc", 3);
    expect_bad(&b, WK_EINVAL, "past the end");
    /* nested arrays, unknown types, duplicate keys */
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "nest");
    gb_u32(&b, WK_GGUF_TYPE_ARRAY);
    gb_u32(&b, WK_GGUF_TYPE_ARRAY);
    gb_u64(&b, 0);
    expect_bad(&b, WK_ENOTSUP, "nest");
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "odd");
    gb_u32(&b, 13);
    gb_u64(&b, 0);
    expect_bad(&b, WK_EINVAL, "odd");
    b.n = 0;
    gb_header(&b, 3, 0, 2);
    gb_str(&b, "k");
    gb_u32(&b, WK_GGUF_TYPE_UINT8);
    gb_u8(&b, 1);
    gb_str(&b, "k");
    gb_u32(&b, WK_GGUF_TYPE_UINT8);
    gb_u8(&b, 2);
    expect_bad(&b, WK_EINVAL, "duplicate");
    free(b.p);
}

/* One tensor "t" F32 of dims {n} at off, in a file with align (0: no key) and data_len bytes. */
static void
one_tensor(gbuf *b, uint32_t align, uint32_t type, uint64_t n, uint64_t off, size_t data_len)
{
    b->n = 0;
    gb_header(b, 3, 1, align ? 1 : 0);
    if (align) {
        gb_str(b, "general.alignment");
        gb_u32(b, WK_GGUF_TYPE_UINT32);
        gb_u32(b, align);
    }
    uint64_t dims[1] = {n};
    gb_tinfo(b, "blk.0.t", 1, dims, type, off);
    gb_pad(b, align ? align : 32);
    for (size_t i = 0; i < data_len; i++)
        gb_u8(b, 0);
}

static void
test_offsets(void **state)
{
    (void)state;
    gbuf b = {0};
    wk_gguf *g = NULL;
    one_tensor(&b, 0, 0, 8, 0, 32);
    assert_int_equal(wk_gguf_parse(b.p, b.n, &g, NULL), WK_OK);
    wk_gguf_free(g);
    one_tensor(&b, 0, 0, 8, 32, 32);
    expect_bad(&b, WK_EINVAL, "blk.0.t");
    seed_write("regress_offset_past_end.gguf", &b);
    one_tensor(&b, 0, 0, 8, UINT64_MAX - 31, 32);
    expect_bad(&b, WK_EINVAL, "past the end");
    one_tensor(&b, 0, 0, 9, 0, 32); /* one element too many */
    expect_bad(&b, WK_EINVAL, "blk.0.t");
    one_tensor(&b, 0, 0, 2, 4, 32);
    expect_bad(&b, WK_EINVAL, "not a multiple of the alignment");
    seed_write("regress_misaligned.gguf", &b);
    one_tensor(&b, 16, 0, 2, 16, 32); /* alignment 16 allows it */
    assert_int_equal(wk_gguf_parse(b.p, b.n, &g, NULL), WK_OK);
    wk_gguf_free(g);
    one_tensor(&b, 24, 0, 2, 0, 48);
    expect_bad(&b, WK_EINVAL, "general.alignment");
    /* Q8_0: one block of 32 (34 bytes) is exposed, dequantized by wk_tensor_read_f32 */
    b.n = 0;
    gb_header(&b, 3, 1, 0);
    uint64_t qd[2] = {32, 2};
    gb_tinfo(&b, "blk.0.q", 2, qd, 8 /* Q8_0 */, 0);
    gb_pad(&b, 32);
    for (int r = 0; r < 2; r++) {
        gb_u16(&b, wk_f32_to_f16(r == 0 ? 0.5f : -0.25f));
        for (int j = 0; j < 32; j++)
            gb_u8(&b, (uint8_t)(int8_t)(j - 16));
    }
    assert_int_equal(wk_gguf_parse(b.p, b.n, &g, NULL), WK_OK);
    {
        const wk_tensor *q = wk_gguf_tensor_find(g, "blk.0.q");
        assert_non_null(q);
        assert_int_equal(q->dtype, WK_DTYPE_Q8_0);
        assert_int_equal(q->ndim, 2);
        assert_int_equal(q->shape[0], 2);
        assert_int_equal(q->shape[1], 32);
        assert_int_equal(q->nbytes, 68);
        float f[64];
        assert_int_equal(wk_tensor_read_f32(q, 0, 64, f), WK_OK);
        for (int j = 0; j < 32; j++) {
            assert_true(f[j] == 0.5f * (float)(j - 16));
            assert_true(f[32 + j] == -0.25f * (float)(j - 16));
        }
        assert_int_equal(wk_tensor_read_f32(q, 40, 3, f), WK_OK); /* inside a block */
        assert_true(f[0] == -0.25f * (float)(8 - 16));
        assert_int_equal(wk_tensor_read_f32(q, 60, 5, f), WK_EINVAL);
    }
    wk_gguf_free(g);
    seed_write("good_q8_0.gguf", &b);
    one_tensor(&b, 8, 8 /* Q8_0 */, 33, 0, 64); /* 33 elements: not whole blocks */
    expect_bad(&b, WK_EINVAL, "tensor 'blk.0.t': Q8_0 rows of 33 elements");
    seed_write("regress_q8_0_partial_block.gguf", &b);
    one_tensor(&b, 8, 8 /* Q8_0 */, 64, 0, 64); /* 2 blocks need 68 bytes */
    expect_bad(&b, WK_EINVAL, "blk.0.t");
    one_tensor(&b, 0, 12 /* Q4_K */, 256, 0, 256);
    expect_bad(&b, WK_ENOTSUP, "Q4_K");
    one_tensor(&b, 0, 99, 4, 0, 32);
    expect_bad(&b, WK_ENOTSUP, "unknown (99)");

    /* too many dims, size overflow, dim over INT64_MAX */
    b.n = 0;
    gb_header(&b, 3, 1, 0);
    uint64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    gb_tinfo(&b, "deep", 9, nine, 0, 0);
    expect_bad(&b, WK_ENOTSUP, "deep");
    b.n = 0;
    gb_header(&b, 3, 1, 0);
    uint64_t big[2] = {(uint64_t)1 << 40, (uint64_t)1 << 40};
    gb_tinfo(&b, "big", 2, big, 0, 0);
    gb_pad(&b, 32);
    expect_bad(&b, WK_EINVAL, "big");
    seed_write("regress_size_overflow.gguf", &b);
    b.n = 0;
    gb_header(&b, 3, 1, 0);
    uint64_t neg[1] = {UINT64_MAX};
    gb_tinfo(&b, "neg", 1, neg, 0, 0);
    expect_bad(&b, WK_EINVAL, "neg");

    /* overlap and duplicate names */
    uint64_t d8[1] = {8};
    b.n = 0;
    gb_header(&b, 3, 2, 0);
    gb_tinfo(&b, "x", 1, d8, 0, 0);
    gb_tinfo(&b, "y", 1, d8, 0, 0);
    gb_pad(&b, 32);
    for (int i = 0; i < 32; i++)
        gb_u8(&b, 0);
    expect_bad(&b, WK_EINVAL, "overlaps");
    seed_write("regress_overlap.gguf", &b);
    b.n = 0;
    gb_header(&b, 3, 2, 0);
    gb_tinfo(&b, "x", 1, d8, 0, 0);
    gb_tinfo(&b, "x", 1, d8, 0, 32);
    gb_pad(&b, 32);
    for (int i = 0; i < 64; i++)
        gb_u8(&b, 0);
    expect_bad(&b, WK_EINVAL, "duplicate");
    free(b.p);
}

static void
owner_free(void *p)
{
    (*(int *)p)++;
}

/* wk_tensor_set_open() reads a .gguf file; wk_tensor_set_new() builds views with an owner. */
static void
test_tensor_set(void **state)
{
    (void)state;
    gbuf b = {0};
    good_image(&b, 3);
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char path[512];
    snprintf(path, sizeof(path), "%s/wk_gguf_test.XXXXXX", base);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
    close(fd);
    wk_tensor_set *set = NULL;
    wk_diag d = {""};
    assert_int_equal(wk_tensor_set_open(path, &set, &d), WK_OK);
    assert_int_equal(wk_tensor_set_count(set), 3);
    const wk_tensor *a = wk_tensor_set_find(set, "a");
    assert_non_null(a);
    assert_int_equal(a->shape[0], 2);
    assert_true(f32_at(a, 1) == 1.25f);
    wk_tensor_set_free(set);

    wk_gguf *g = NULL;
    assert_int_equal(wk_gguf_open(path, &g, &d), WK_OK);
    wk_tensor v[2];
    v[0] = *wk_gguf_tensor_find(g, "a");
    v[0].name = "renamed";
    v[1] = v[0];
    v[1].name = "row1"; /* a view of row 1 of a */
    v[1].ndim = 1;
    v[1].shape[0] = 3;
    v[1].data = (const float *)v[0].data + 3;
    v[1].nbytes = 12;
    int freed = 0;
    assert_int_equal(wk_tensor_set_new(v, 2, &freed, owner_free, &set, &d), WK_OK);
    assert_true(f32_at(wk_tensor_set_find(set, "row1"), 0) == 3.25f);
    assert_non_null(wk_tensor_set_find(set, "renamed"));
    wk_tensor_set_free(set);
    assert_int_equal(freed, 1);
    v[1].nbytes = 8; /* inconsistent view */
    assert_int_equal(wk_tensor_set_new(v, 2, &freed, owner_free, &set, &d), WK_EINVAL);
    assert_int_equal(freed, 1); /* not taken on failure */
    v[1] = v[0];
    assert_int_equal(wk_tensor_set_new(v, 2, NULL, NULL, &set, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "duplicate"));
    wk_gguf_free(g);

    /* a corrupt file through the set: the diag names the path */
    b.n -= 2;
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
    close(fd);
    d.msg[0] = '\0';
    assert_int_equal(wk_tensor_set_open(path, &set, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, path));
    assert_non_null(strstr(d.msg, "'c'"));
    assert_int_equal(wk_gguf_open(path, &g, &d), WK_EINVAL);
    unlink(path);
    free(b.p);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_header),
        cmocka_unit_test(test_huge_counts),
        cmocka_unit_test(test_offsets),
        cmocka_unit_test(test_tensor_set),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
