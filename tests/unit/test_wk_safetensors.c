/*
 * Unit tests for wk_safetensors: good single files (every dtype, scalars,
 * empty tensors, metadata, padding), every malformed header (truncated,
 * header length past the end or over the limit, bad JSON or UTF-8, wrong
 * dtype, bad shape, bad or overlapping or out-of-range offsets, size
 * mismatch, duplicate names), each with its error code and a diagnostic that
 * names the tensor; and sharded checkpoints through an index file, including
 * shard names that try to leave the directory and inconsistent weight maps.
 * Files are built in memory and written to a temp dir.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <sys/stat.h>
#include <unistd.h>

#include "wk_safetensors.h"
#include "wk_tensor.h"

/* A temp dir with files written by the tests; removed by tdir_free(). */
typedef struct tdir {
    char path[256];     /* the directory */
    char files[16][64]; /* names written in it */
    int n;              /* entries in files */
} tdir;

static void
tdir_init(tdir *t)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(t->path, sizeof(t->path), "%s/wk_st_test.XXXXXX", base);
    assert_non_null(mkdtemp(t->path));
    t->n = 0;
}

static const char *
tdir_write(tdir *t, const char *name, const void *data, size_t len)
{
    static char full[512];
    snprintf(full, sizeof(full), "%s/%s", t->path, name);
    FILE *f = fopen(full, "wb");
    assert_non_null(f);
    if (len > 0)
        assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->files[i], name) == 0)
            return full;
    assert_true(t->n < 16);
    snprintf(t->files[t->n++], sizeof(t->files[0]), "%s", name);
    return full;
}

static void
tdir_free(tdir *t)
{
    char full[512];
    for (int i = 0; i < t->n; i++) {
        snprintf(full, sizeof(full), "%s/%s", t->path, t->files[i]);
        unlink(full);
    }
    assert_int_equal(rmdir(t->path), 0);
}

/* Builds a safetensors image: 8-byte length, the header, data. Caller frees. */
static uint8_t *
st_image(const char *json, const void *data, size_t data_len, size_t *len)
{
    size_t hl = strlen(json);
    uint8_t *p = malloc(8 + hl + data_len + 1);
    assert_non_null(p);
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(p + 8, json, hl);
    if (data_len)
        memcpy(p + 8 + hl, data, data_len);
    *len = 8 + hl + data_len;
    return p;
}

static const char *
st_write(tdir *t, const char *name, const char *json, const void *data, size_t data_len)
{
    size_t len;
    uint8_t *img = st_image(json, data, data_len, &len);
    const char *p = tdir_write(t, name, img, len);
    free(img);
    return p;
}

/*
 * Parses json + data_len zero bytes of data and expects err with a diag
 * containing each of the NULL-terminated substrings. The list must stay empty.
 */
static void
expect_fail(const char *json, size_t data_len, wk_err err, ...)
{
    uint8_t *zeros = calloc(1, data_len + 1);
    assert_non_null(zeros);
    size_t len;
    uint8_t *img = st_image(json, zeros, data_len, &len);
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    wk_diag d = {""};
    wk_err got = wk_st_parse(img, len, &l, &d);
    if (got != err)
        fail_msg("json %s: got %s (%s), want %s", json, wk_err_name(got), d.msg,
                 wk_err_name(err));
    assert_int_equal(l.n, 0);
    va_list ap;
    va_start(ap, err);
    for (const char *s = va_arg(ap, const char *); s != NULL; s = va_arg(ap, const char *))
        if (strstr(d.msg, s) == NULL)
            fail_msg("diag '%s' lacks '%s'", d.msg, s);
    va_end(ap);
    free(img);
    free(zeros);
}

static const wk_tensor *
list_find(const wk_tensor_list *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->v[i].name, name) == 0)
            return &l->v[i];
    return NULL;
}

static void
test_good(void **state)
{
    (void)state;
    uint8_t data[4 + 8 + 4 + 2 + 4];
    float f[3] = {0.5f, -1.0f, 7.0f};
    memcpy(data, f, 12);                       /* a: F32 [3] at [0,12) */
    memcpy(data + 12, "\x00\x3c\x00\xc4", 4);  /* b: F16 [2] = 1, -4 at [12,16) */
    memcpy(data + 16, "\x80\xbf", 2);          /* c: BF16 scalar -1 at [16,18) */
    memcpy(data + 18, "\x40\x40\x00\x00", 4);  /* trailing bytes nobody indexes */
    const char *json = "{\"__metadata__\":{\"format\":\"pt\",\"x\":\"y\"},"
                       "\"c\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[16,18]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12],"
                       "\"extra\":1},"
                       "\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4]},"
                       "\"b\":{\"dtype\":\"F16\",\"shape\":[1,2],\"data_offsets\":[12,16]}}    ";
    size_t len;
    uint8_t *img = st_image(json, data, sizeof(data), &len);
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    wk_diag d = {""};
    assert_int_equal(wk_st_parse(img, len, &l, &d), WK_OK);
    assert_string_equal(d.msg, "");
    assert_int_equal(l.n, 4);
    float out[3];
    const wk_tensor *t = list_find(&l, "a");
    assert_non_null(t);
    assert_int_equal(t->dtype, WK_DTYPE_F32);
    assert_int_equal(t->ndim, 1);
    assert_int_equal(t->shape[0], 3);
    assert_int_equal(t->nbytes, 12);
    assert_ptr_equal(t->data, img + 8 + strlen(json));
    assert_int_equal(wk_tensor_read_f32(t, 0, 3, out), WK_OK);
    assert_true(out[0] == 0.5f && out[1] == -1.0f && out[2] == 7.0f);
    t = list_find(&l, "b");
    assert_int_equal(t->dtype, WK_DTYPE_F16);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(wk_tensor_read_f32(t, 0, 2, out), WK_OK);
    assert_true(out[0] == 1.0f && out[1] == -4.0f);
    t = list_find(&l, "c");
    assert_int_equal(t->dtype, WK_DTYPE_BF16);
    assert_int_equal(t->ndim, 0);
    assert_int_equal(t->nbytes, 2);
    assert_int_equal(wk_tensor_read_f32(t, 0, 1, out), WK_OK);
    assert_true(out[0] == -1.0f);
    t = list_find(&l, "e");
    assert_int_equal(t->nbytes, 0);
    assert_int_equal(t->shape[1], 5);
    assert_null(list_find(&l, "__metadata__"));
    /* a second parse appends */
    assert_int_equal(wk_st_parse(img, len, &l, &d), WK_OK);
    assert_int_equal(l.n, 8);
    wk_tensor_list_fini(&l);
    free(img);

    /* the data section may be empty; a header alone is a valid file */
    img = st_image("{}", NULL, 0, &len);
    assert_int_equal(wk_st_parse(img, len, &l, &d), WK_OK);
    assert_int_equal(l.n, 0);
    free(img);
    /* 8 dims, the maximum */
    img = st_image("{\"m\":{\"dtype\":\"F16\",\"shape\":[1,1,1,1,1,1,1,2],"
                   "\"data_offsets\":[0,4]}}", "abcd", 4, &len);
    assert_int_equal(wk_st_parse(img, len, &l, &d), WK_OK);
    assert_int_equal(l.v[0].ndim, 8);
    wk_tensor_list_fini(&l);
    free(img);
}

static void
test_truncated(void **state)
{
    (void)state;
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    wk_diag d = {""};
    assert_int_equal(wk_st_parse("", 0, &l, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "truncated"));
    assert_int_equal(wk_st_parse("\x02\0\0\0\0\0\0", 7, &l, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "truncated"));
    /* header length one past the end */
    assert_int_equal(wk_st_parse("\x03\0\0\0\0\0\0\0{}", 10, &l, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "past the end"));
    /* a huge length: over the limit before being compared with the file */
    assert_int_equal(wk_st_parse("\xff\xff\xff\xff\xff\xff\xff\xff{}", 10, &l, &d), WK_ETOOBIG);
    assert_non_null(strstr(d.msg, "limit"));
    uint8_t h[10] = {0, 0, 0x40, 0x06, 0, 0, 0, 0, '{', '}'}; /* 100 MiB + 1 */
    h[0] = 1;
    assert_int_equal(wk_st_parse(h, sizeof(h), &l, &d), WK_ETOOBIG);
    h[0] = 0; /* exactly 100 MiB: allowed by the limit, so past the end */
    assert_int_equal(wk_st_parse(h, sizeof(h), &l, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "past the end"));
    /* a good file cut inside its data section */
    size_t len;
    uint8_t *img = st_image("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                            "12345678", 8, &len);
    assert_int_equal(wk_st_parse(img, len - 1, &l, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "'w'"));
    assert_int_equal(wk_st_parse(img, len, &l, &d), WK_OK);
    assert_int_equal(l.n, 1);
    wk_tensor_list_fini(&l);
    free(img);
    assert_int_equal(l.n, 0);
}

static void
test_bad_json(void **state)
{
    (void)state;
    expect_fail("", 0, WK_EINVAL, "bad JSON", NULL);
    expect_fail("{\"w\":", 0, WK_EINVAL, "bad JSON", NULL);
    expect_fail("{} x", 0, WK_EINVAL, "bad JSON", NULL);
    expect_fail("[1,2]", 0, WK_EINVAL, "not a JSON object", NULL);
    expect_fail("\"str\"", 0, WK_EINVAL, "bad JSON", NULL);
    expect_fail("{\"w\xff\":{}}", 0, WK_EINVAL, "bad JSON", NULL); /* not UTF-8 */
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                8, WK_EINVAL, "duplicate", "a", NULL);
    expect_fail("{\"dup_name\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"dup_name\":{}}", 4, WK_EINVAL, "duplicate", "dup_name", NULL);
    expect_fail("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                WK_EINVAL, "bad JSON", "NUL", NULL);
    expect_fail("{\"__metadata__\":[1]}", 0, WK_EINVAL, "__metadata__", NULL);
    expect_fail("{\"__metadata__\":{\"k\":1}}", 0, WK_EINVAL, "__metadata__", "'k'", NULL);
    expect_fail("{\"w\":[1]}", 0, WK_EINVAL, "'w'", "not a JSON object", NULL);
}

static void
test_bad_dtype_shape(void **state)
{
    (void)state;
    expect_fail("{\"wte\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, WK_ENOTSUP,
                "'wte'", "I64", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, WK_ENOTSUP,
                "'w'", "F64", NULL);
    expect_fail("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, WK_ENOTSUP,
                "'w'", "f32", NULL);
    expect_fail("{\"w\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, WK_EINVAL, "'w'",
                "dtype", NULL);
    expect_fail("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, WK_EINVAL, "'w'", "dtype",
                NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, WK_EINVAL, "'w'", "shape",
                NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", 4, WK_EINVAL,
                "'w'", "shape", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, WK_EINVAL,
                "'w'", "shape[0]", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,1.0],\"data_offsets\":[0,8]}}", 8,
                WK_EINVAL, "'w'", "shape[1]", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
                WK_EINVAL, "'w'", "shape[0]", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                "\"data_offsets\":[0,4]}}", 4, WK_ENOTSUP, "'w'", "9 dimensions", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],"
                "\"data_offsets\":[0,4]}}", 4, WK_EINVAL, "'w'", "overflow", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[2305843009213693952],"
                "\"data_offsets\":[0,4]}}", 4, WK_EINVAL, "'w'", "overflow", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],"
                "\"data_offsets\":[0,4]}}", 4, WK_EINVAL, "bad JSON", NULL);
}

static void
test_bad_offsets(void **state)
{
    (void)state;
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, WK_EINVAL, "'w'", "data_offsets",
                NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, WK_EINVAL,
                "'w'", "data_offsets", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
                WK_EINVAL, "'w'", "data_offsets", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, WK_EINVAL,
                "'w'", "data_offsets", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{\"a\":1}}}", 4,
                WK_EINVAL, "'w'", "data_offsets", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", 4,
                WK_EINVAL, "'w'", "data_offsets", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, WK_EINVAL,
                "'w'", "begin", NULL);
    /* out of range: end past the data section, by one and by a lot */
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7, WK_EINVAL,
                "'w'", "past the data section", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],"
                "\"data_offsets\":[18446744073709551612,9223372036854775807]}}",
                4, WK_EINVAL, NULL);
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],"
                "\"data_offsets\":[9223372036854775803,9223372036854775807]}}",
                4, WK_EINVAL, "'w'", "past the data section", NULL);
    /* size mismatch, both ways */
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, WK_EINVAL,
                "'w'", "need 8", NULL);
    expect_fail("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, WK_EINVAL,
                "'w'", "need 4", NULL);
    expect_fail("{\"w\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[0,0]}}", 8, WK_EINVAL,
                "'w'", "need 2", NULL);
}

static void
test_overlap(void **state)
{
    (void)state;
    /* partial overlap */
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                12, WK_EINVAL, "overlap", "'a'", "'b'", NULL);
    /* identical ranges */
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}",
                8, WK_EINVAL, "overlap", NULL);
    /* contained in an earlier, longer tensor that is not the previous one by offset */
    expect_fail("{\"big\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},"
                "\"s1\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                "\"s2\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[20,24]}}",
                32, WK_EINVAL, "overlap", "'s1'", "'big'", NULL);
    /* adjacent, out of order, with an empty tensor inside another: fine */
    uint8_t zeros[16] = {0};
    size_t len;
    uint8_t *img = st_image("{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                            "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                            "\"e2\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                            "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                            zeros, sizeof(zeros), &len);
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    wk_diag d = {""};
    assert_int_equal(wk_st_parse(img, len, &l, &d), WK_OK);
    assert_int_equal(l.n, 4);
    wk_tensor_list_fini(&l);
    free(img);
}

static void
test_too_many_tensors(void **state)
{
    (void)state;
    /* WK_ST_MAX_TENSORS + 1 entries of the smallest form: checked before any is parsed */
    size_t n = WK_ST_MAX_TENSORS + 2, cap = n * 12 + 16;
    char *json = malloc(cap);
    assert_non_null(json);
    size_t off = 0;
    json[off++] = '{';
    for (size_t i = 0; i < n; i++)
        off += (size_t)snprintf(json + off, cap - off, "%s\"%zx\":0", i ? "," : "", i);
    json[off++] = '}';
    json[off] = '\0';
    expect_fail(json, 0, WK_ETOOBIG, "limit", NULL);
    free(json);
}

/* ---- sharded ---- */

static const char *shard1_json =
    "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}}";
static const char *shard2_json =
    "{\"c\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]}}";

static void
write_shards(tdir *td)
{
    st_write(td, "m-1.safetensors", shard1_json, "\x00\x00\x80\x3f\x80\x3f\x00\x40", 8);
    st_write(td, "m-2.safetensors", shard2_json, "\x00\x3c", 2);
}

/* Writes index json to td and expects err from wk_tensor_set_open with the substrings. */
static void
index_fail(tdir *td, const char *json, wk_err err, ...)
{
    const char *p = tdir_write(td, "model.safetensors.index.json", json, strlen(json));
    wk_tensor_set *set = NULL;
    wk_diag d = {""};
    wk_err got = wk_tensor_set_open(p, &set, &d);
    if (got != err)
        fail_msg("index %s: got %s (%s), want %s", json, wk_err_name(got), d.msg,
                 wk_err_name(err));
    assert_null(set);
    va_list ap;
    va_start(ap, err);
    for (const char *s = va_arg(ap, const char *); s != NULL; s = va_arg(ap, const char *))
        if (strstr(d.msg, s) == NULL)
            fail_msg("diag '%s' lacks '%s'", d.msg, s);
    va_end(ap);
}

static void
test_sharded_good(void **state)
{
    (void)state;
    tdir td;
    tdir_init(&td);
    write_shards(&td);
    const char *json = "{\"metadata\":{\"total_size\":10},\"weight_map\":{"
                       "\"c\":\"m-2.safetensors\",\"a\":\"m-1.safetensors\","
                       "\"b\":\"m-1.safetensors\"}}";
    const char *p = tdir_write(&td, "model.safetensors.index.json", json, strlen(json));
    wk_tensor_set *set = NULL;
    wk_diag d = {""};
    assert_int_equal(wk_tensor_set_open(p, &set, &d), WK_OK);
    assert_int_equal(wk_tensor_set_count(set), 3);
    float out[2];
    assert_int_equal(wk_tensor_read_f32(wk_tensor_set_find(set, "a"), 0, 1, out), WK_OK);
    assert_true(out[0] == 1.0f);
    assert_int_equal(wk_tensor_read_f32(wk_tensor_set_find(set, "b"), 0, 2, out), WK_OK);
    assert_true(out[0] == 1.0f && out[1] == 2.0f);
    assert_int_equal(wk_tensor_read_f32(wk_tensor_set_find(set, "c"), 0, 1, out), WK_OK);
    assert_true(out[0] == 1.0f);
    assert_string_equal(wk_tensor_set_at(set, 2)->name, "c");
    wk_tensor_set_free(set);

    /* a relative path without a directory part resolves shards in the cwd */
    char cwd[512];
    assert_non_null(getcwd(cwd, sizeof(cwd)));
    assert_int_equal(chdir(td.path), 0);
    assert_int_equal(wk_tensor_set_open("model.safetensors.index.json", &set, &d), WK_OK);
    assert_int_equal(wk_tensor_set_count(set), 3);
    wk_tensor_set_free(set);
    assert_int_equal(chdir(cwd), 0);

    /* an empty weight map is an empty set */
    p = tdir_write(&td, "model.safetensors.index.json", "{\"weight_map\":{}}", 17);
    assert_int_equal(wk_tensor_set_open(p, &set, &d), WK_OK);
    assert_int_equal(wk_tensor_set_count(set), 0);
    wk_tensor_set_free(set);

    size_t nt = 0, ns = 0;
    assert_int_equal(wk_st_index_check(json, strlen(json), &nt, &ns, &d), WK_OK);
    assert_int_equal(nt, 3);
    assert_int_equal(ns, 2);
    assert_int_equal(wk_st_index_check("[]", 2, &nt, &ns, &d), WK_EINVAL);
    assert_int_equal(wk_st_index_check("{\"weight_map\":{}}", 17, NULL, NULL, &d), WK_OK);
    tdir_free(&td);
}

static void
test_sharded_bad(void **state)
{
    (void)state;
    tdir td;
    tdir_init(&td);
    write_shards(&td);
    index_fail(&td, "{\"weight_map\":", WK_EINVAL, "bad JSON", NULL);
    index_fail(&td, "[]", WK_EINVAL, "not a JSON object", NULL);
    index_fail(&td, "{}", WK_EINVAL, "weight_map", NULL);
    index_fail(&td, "{\"weight_map\":[]}", WK_EINVAL, "weight_map", NULL);
    index_fail(&td, "{\"weight_map\":{\"a\":1}}", WK_EINVAL, "'a'", "not a string", NULL);
    index_fail(&td, "{\"weight_map\":{\"a\":\"m-1.safetensors\",\"a\":\"m-1.safetensors\"}}",
               WK_EINVAL, "duplicate", NULL);
    index_fail(&td, "{\"weight_map\":{\"a\\u0000\":\"m-1.safetensors\"}}", WK_EINVAL,
               "bad JSON", "NUL", NULL);
    /* shard names escaping the directory */
    index_fail(&td, "{\"weight_map\":{\"a\":\"../m-1.safetensors\"}}", WK_EINVAL, "'a'",
               "plain file name", NULL);
    index_fail(&td, "{\"weight_map\":{\"a\":\"/etc/passwd\"}}", WK_EINVAL, "'a'",
               "plain file name", NULL);
    index_fail(&td, "{\"weight_map\":{\"a\":\"sub/m-1.safetensors\"}}", WK_EINVAL, "'a'",
               "plain file name", NULL);
    index_fail(&td, "{\"weight_map\":{\"a\":\"..\"}}", WK_EINVAL, "'a'", NULL);
    index_fail(&td, "{\"weight_map\":{\"a\":\".\"}}", WK_EINVAL, "'a'", NULL);
    index_fail(&td, "{\"weight_map\":{\"a\":\"\"}}", WK_EINVAL, "'a'", NULL);
    index_fail(&td, "{\"weight_map\":{\"a\":\"m-1\\u0000x\"}}", WK_EINVAL, "bad JSON",
               "NUL", NULL);
    /* missing shard file */
    index_fail(&td, "{\"weight_map\":{\"a\":\"nope.safetensors\"}}", WK_ENOENT,
               "nope.safetensors", NULL);
    /* tensor listed but absent from its shard */
    index_fail(&td, "{\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-1.safetensors\","
               "\"c\":\"m-2.safetensors\",\"zz\":\"m-2.safetensors\"}}",
               WK_EINVAL, "'zz'", "missing", "m-2.safetensors", NULL);
    /* tensor present in a shard but not listed */
    index_fail(&td, "{\"weight_map\":{\"a\":\"m-1.safetensors\",\"c\":\"m-2.safetensors\"}}",
               WK_EINVAL, "'b'", "not in weight_map", NULL);
    /* tensor listed under the wrong shard */
    index_fail(&td, "{\"weight_map\":{\"a\":\"m-2.safetensors\",\"b\":\"m-1.safetensors\","
               "\"c\":\"m-2.safetensors\"}}", WK_EINVAL, "'a'", "weight_map names", NULL);
    /* the same tensor in two shards */
    st_write(&td, "m-3.safetensors", shard2_json, "\x00\x3c", 2);
    index_fail(&td, "{\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-1.safetensors\","
               "\"c\":\"m-2.safetensors\",\"x\":\"m-3.safetensors\"}}",
               WK_EINVAL, "'c'", "two shards", "m-2.safetensors", "m-3.safetensors", NULL);
    /* a malformed shard: its error names the shard and the tensor */
    st_write(&td, "m-4.safetensors",
             "{\"q\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", "abcd", 4);
    index_fail(&td, "{\"weight_map\":{\"q\":\"m-4.safetensors\"}}", WK_EINVAL,
               "shard 'm-4.safetensors'", "'q'", NULL);
    /* the index itself is a directory entry that is not a file */
    char p[512];
    snprintf(p, sizeof(p), "%s/nothere.json", td.path);
    wk_tensor_set *set = NULL;
    wk_diag d = {""};
    assert_int_equal(wk_tensor_set_open(p, &set, &d), WK_ENOENT);
    tdir_free(&td);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_bad_dtype_shape),
        cmocka_unit_test(test_bad_offsets),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_too_many_tensors),
        cmocka_unit_test(test_sharded_good),
        cmocka_unit_test(test_sharded_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
