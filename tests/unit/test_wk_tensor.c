/*
 * Unit tests for wk_tensor: dtype helpers, the bf16/f16 <-> f32 conversions
 * (exhaustive over 16-bit patterns, against an independent nearest-even
 * oracle for f32 inputs, NaN/inf/subnormals/ties), wk_tensor_read_f32 range
 * checks, and wk_tensor_set_open's dispatch, sorting, lookup and file errors.
 * Container formats themselves are tested in test_wk_safetensors.c and
 * test_wk_pth.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wk_tensor.h"
#include "wk_tensor_priv.h"

static uint32_t
f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float
u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A temp dir with files written by the tests; removed by tdir_free(). */
typedef struct tdir {
    char path[256];   /* the directory */
    char files[16][64]; /* names written in it */
    int n;            /* entries in files */
} tdir;

static void
tdir_init(tdir *t)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(t->path, sizeof(t->path), "%s/wk_tensor_test.XXXXXX", base);
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
        chmod(full, 0600);
        unlink(full);
    }
    assert_int_equal(rmdir(t->path), 0);
}

/* Builds a safetensors image: 8-byte length, json, data. Caller frees. */
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

/* ---- dtype helpers ---- */

static void
test_dtype_helpers(void **state)
{
    (void)state;
    assert_int_equal(wk_dtype_size(WK_DTYPE_F32), 4);
    assert_int_equal(wk_dtype_size(WK_DTYPE_F16), 2);
    assert_int_equal(wk_dtype_size(WK_DTYPE_BF16), 2);
    assert_string_equal(wk_dtype_name(WK_DTYPE_F32), "F32");
    assert_string_equal(wk_dtype_name(WK_DTYPE_F16), "F16");
    assert_string_equal(wk_dtype_name(WK_DTYPE_BF16), "BF16");
    assert_string_equal(wk_dtype_name((wk_dtype)42), "?");
    wk_dtype dt = WK_DTYPE_F32;
    assert_int_equal(wk_dtype_parse("BF16", &dt), WK_OK);
    assert_int_equal(dt, WK_DTYPE_BF16);
    assert_int_equal(wk_dtype_parse("F16", &dt), WK_OK);
    assert_int_equal(dt, WK_DTYPE_F16);
    assert_int_equal(wk_dtype_parse("F32", &dt), WK_OK);
    assert_int_equal(dt, WK_DTYPE_F32);
    assert_int_equal(wk_dtype_parse("f32", &dt), WK_ENOTSUP);
    assert_int_equal(wk_dtype_parse("F64", &dt), WK_ENOTSUP);
    assert_int_equal(wk_dtype_parse(NULL, &dt), WK_EINVAL);
    assert_int_equal(wk_dtype_parse("F32", NULL), WK_EINVAL);

    wk_tensor t = {.ndim = 0};
    assert_int_equal(wk_tensor_numel(&t), 1);
    t.ndim = 3;
    t.shape[0] = 2;
    t.shape[1] = 3;
    t.shape[2] = 4;
    assert_int_equal(wk_tensor_numel(&t), 24);
    t.shape[1] = 0;
    assert_int_equal(wk_tensor_numel(&t), 0);
}

static void
test_tensor_size(void **state)
{
    (void)state;
    int64_t shape[WK_TENSOR_MAX_DIMS + 1] = {2, 3, 4};
    int64_t numel = -1;
    size_t nb = 0;
    assert_int_equal(wk_tensor_size(WK_DTYPE_BF16, 3, shape, &numel, &nb), WK_OK);
    assert_int_equal(numel, 24);
    assert_int_equal(nb, 48);
    assert_int_equal(wk_tensor_size(WK_DTYPE_F32, 0, shape, &numel, &nb), WK_OK);
    assert_int_equal(numel, 1);
    assert_int_equal(nb, 4);
    assert_int_equal(wk_tensor_size(WK_DTYPE_F32, 3, shape, NULL, NULL), WK_OK);
    assert_int_equal(wk_tensor_size(WK_DTYPE_F32, -1, shape, NULL, NULL), WK_EINVAL);
    assert_int_equal(wk_tensor_size(WK_DTYPE_F32, 9, shape, NULL, NULL), WK_EINVAL);
    shape[1] = -3;
    assert_int_equal(wk_tensor_size(WK_DTYPE_F32, 3, shape, NULL, NULL), WK_EINVAL);
    int64_t big[2] = {INT64_C(1) << 32, INT64_C(1) << 31};
    assert_int_equal(wk_tensor_size(WK_DTYPE_F32, 2, big, NULL, NULL), WK_EINVAL);
    int64_t bigger[2] = {INT64_C(1) << 40, INT64_C(1) << 40};
    assert_int_equal(wk_tensor_size(WK_DTYPE_F32, 2, bigger, NULL, NULL), WK_EINVAL);
    /* a zero dimension makes the product 0 even when the others would overflow */
    int64_t zero[3] = {INT64_C(1) << 62, 0, INT64_C(1) << 62};
    assert_int_equal(wk_tensor_size(WK_DTYPE_F32, 3, zero, &numel, &nb), WK_OK);
    assert_int_equal(numel, 0);
    assert_int_equal(nb, 0);
}

/* ---- conversions ---- */

static double
f16_ref(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

static void
test_f16_to_f32_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = wk_f16_to_f32((uint16_t)h);
        int e = (h >> 10) & 31;
        if (e == 31) {
            if ((h & 1023) == 0) {
                assert_true(isinf(f));
                assert_int_equal(signbit(f) != 0, (h & 0x8000) != 0);
            } else {
                assert_true(isnan(f));
                /* payload kept, and the trip back is the same (quieted) NaN */
                assert_int_equal(wk_f32_to_f16(f), h | 0x200);
            }
            continue;
        }
        assert_true((double)f == f16_ref((uint16_t)h));
        assert_int_equal(signbit(f) != 0, (h & 0x8000) != 0);
        assert_int_equal(wk_f32_to_f16(f), h); /* exact values round-trip */
    }
}

static void
test_bf16_exhaustive(void **state)
{
    (void)state;
    for (uint32_t b = 0; b < 65536; b++) {
        float f = wk_bf16_to_f32((uint16_t)b);
        assert_int_equal(f2u(f), b << 16);
        if (isnan(f))
            assert_int_equal(wk_f32_to_bf16(f), b | 0x40); /* quieted, payload kept */
        else
            assert_int_equal(wk_f32_to_bf16(f), b);
    }
}

/* Nearest-even oracle for f32 -> bf16 on a finite input, in double arithmetic. */
static uint16_t
bf16_oracle(float x)
{
    uint32_t u = f2u(x), sign = u & 0x80000000u, mag = u & 0x7fffffffu;
    uint16_t lo = (uint16_t)(mag >> 16), hi = (uint16_t)(lo + 1);
    double v = fabs((double)x), vlo = fabs((double)wk_bf16_to_f32(lo));
    double vhi = (hi & 0x7f80) == 0x7f80 ? ldexp(1.0, 128) : fabs((double)wk_bf16_to_f32(hi));
    uint16_t r;
    if (v - vlo < vhi - v)
        r = lo;
    else if (v - vlo > vhi - v)
        r = hi;
    else
        r = (lo & 1) ? hi : lo;
    return (uint16_t)(r | sign >> 16);
}

/* Nearest-even oracle for f32 -> f16 on a finite input: search the sorted patterns. */
static uint16_t
f16_oracle(float x)
{
    double v = fabs((double)x);
    uint16_t sign = (f2u(x) & 0x80000000u) ? 0x8000 : 0;
    uint32_t lo = 0, hi = 0x7c00; /* largest pattern with value <= v, in [0, 0x7bff] */
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (f16_ref((uint16_t)mid) <= v)
            lo = mid;
        else
            hi = mid;
    }
    double vlo = f16_ref((uint16_t)lo);
    double vhi = lo + 1 == 0x7c00 ? 65536.0 : f16_ref((uint16_t)(lo + 1));
    uint32_t r;
    if (v - vlo < vhi - v)
        r = lo;
    else if (v - vlo > vhi - v)
        r = lo + 1;
    else
        r = (lo & 1) ? lo + 1 : lo;
    return (uint16_t)(r | sign);
}

static void
check_f32(uint32_t u)
{
    float x = u2f(u);
    if (isnan(x)) {
        assert_true(isnan(wk_bf16_to_f32(wk_f32_to_bf16(x))));
        assert_true(isnan(wk_f16_to_f32(wk_f32_to_f16(x))));
        return;
    }
    if (isinf(x)) {
        assert_int_equal(wk_f32_to_bf16(x), (u >> 16));
        assert_int_equal(wk_f32_to_f16(x), ((u >> 16) & 0x8000) | 0x7c00);
        return;
    }
    assert_int_equal(wk_f32_to_bf16(x), bf16_oracle(x));
    assert_int_equal(wk_f32_to_f16(x), f16_oracle(x));
#ifdef __FLT16_MAX__
    _Float16 h = (_Float16)x;
    uint16_t hb;
    memcpy(&hb, &h, 2);
    assert_int_equal(wk_f32_to_f16(x), hb);
#endif
}

static void
test_f32_rounding(void **state)
{
    (void)state;
    /* a stride through every exponent and mantissa region, both signs */
    for (uint64_t u = 0; u <= 0xffffffffu; u += 2039)
        check_f32((uint32_t)u);
    /* every f16 and bf16 boundary: each pattern, its midpoints and their neighbours */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        float a = wk_f16_to_f32((uint16_t)h);
        float b = h + 1 < 0x7c00 ? wk_f16_to_f32((uint16_t)(h + 1)) : 65536.0f;
        float mid = (float)(((double)a + (double)b) / 2);
        for (int s = 0; s < 2; s++) {
            float m = s ? -mid : mid;
            check_f32(f2u(m));
            check_f32(f2u(m) + 1);
            check_f32(f2u(m) - 1);
        }
    }
    for (uint32_t b = 0; b < 0x7f80; b += 7) {
        uint32_t mid = b << 16 | 0x8000;
        check_f32(mid);
        check_f32(mid + 1);
        check_f32(mid - 1);
        check_f32(mid | 0x80000000u);
    }
    /* named cases */
    assert_int_equal(wk_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(wk_f32_to_f16(65519.996f), 0x7bff);
    assert_int_equal(wk_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(wk_f32_to_f16(1e10f), 0x7c00);
    assert_int_equal(wk_f32_to_f16(-1e10f), 0xfc00);
    assert_int_equal(wk_f32_to_f16(ldexpf(1, -24)), 0x0001);
    assert_int_equal(wk_f32_to_f16(ldexpf(1, -25)), 0x0000); /* tie to even: 0 */
    assert_int_equal(wk_f32_to_f16(ldexpf(3, -26)), 0x0001);
    assert_int_equal(wk_f32_to_f16(ldexpf(3, -25)), 0x0002); /* 1.5 ulp: tie to even 2 */
    assert_int_equal(wk_f32_to_f16(ldexpf(1, -14)), 0x0400);
    assert_int_equal(wk_f32_to_f16(ldexpf(1023.5f, -24)), 0x0400); /* rounds up to normal */
    assert_int_equal(wk_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(wk_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00);     /* tie, even */
    assert_int_equal(wk_f32_to_f16(1.0f + ldexpf(3, -11)), 0x3c02);     /* tie, to even up */
    assert_int_equal(wk_f32_to_f16(u2f(0x7fc00001)) & 0x7e00, 0x7e00); /* NaN stays NaN */
    assert_int_equal(wk_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(wk_f32_to_bf16(u2f(0x3f808000)), 0x3f80); /* tie, even */
    assert_int_equal(wk_f32_to_bf16(u2f(0x3f818000)), 0x3f82); /* tie, up to even */
    assert_int_equal(wk_f32_to_bf16(u2f(0x3f808001)), 0x3f81);
    assert_int_equal(wk_f32_to_bf16(u2f(0x7f7fffff)), 0x7f80); /* FLT_MAX rounds to inf */
    assert_int_equal(wk_f32_to_bf16(u2f(0x00000001)), 0x0000); /* tiny subnormal */
    assert_int_equal(wk_f32_to_bf16(u2f(0x00018000)), 0x0002);
    assert_int_equal(wk_f32_to_bf16(u2f(0x7f800001)), 0x7fc0); /* sNaN with low payload */
    assert_int_equal(wk_f32_to_bf16(u2f(0xffc00000)), 0xffc0);
}

/* ---- wk_tensor_read_f32 ---- */

static void
test_read_f32(void **state)
{
    (void)state;
    /* F32 at an odd address */
    uint8_t raw[1 + 12];
    float vals[3] = {1.5f, -2.0f, 3.25f};
    memcpy(raw + 1, vals, 12);
    wk_tensor t = {.name = "x", .dtype = WK_DTYPE_F32, .ndim = 1, .shape = {3},
                   .data = raw + 1, .nbytes = 12};
    float out[3] = {0};
    assert_int_equal(wk_tensor_read_f32(&t, 0, 3, out), WK_OK);
    assert_true(out[0] == 1.5f && out[1] == -2.0f && out[2] == 3.25f);
    assert_int_equal(wk_tensor_read_f32(&t, 2, 1, out), WK_OK);
    assert_true(out[0] == 3.25f);
    assert_int_equal(wk_tensor_read_f32(&t, 3, 0, NULL), WK_OK);
    assert_int_equal(wk_tensor_read_f32(&t, 2, 2, out), WK_EINVAL);
    assert_int_equal(wk_tensor_read_f32(&t, 4, 0, out), WK_EINVAL);
    assert_int_equal(wk_tensor_read_f32(&t, SIZE_MAX, 2, out), WK_EINVAL);
    assert_int_equal(wk_tensor_read_f32(&t, 1, SIZE_MAX, out), WK_EINVAL);
    assert_int_equal(wk_tensor_read_f32(&t, 0, 1, NULL), WK_EINVAL);
    assert_int_equal(wk_tensor_read_f32(NULL, 0, 1, out), WK_EINVAL);
    /* nbytes smaller than the shape says: refused, not overread */
    t.nbytes = 8;
    assert_int_equal(wk_tensor_read_f32(&t, 0, 3, out), WK_EINVAL);
    t.data = NULL;
    assert_int_equal(wk_tensor_read_f32(&t, 0, 1, out), WK_EINVAL);

    /* F16 and BF16, little-endian bytes */
    uint8_t h[4] = {0x00, 0x3c, 0x00, 0xc0}; /* 1.0, -2.0 */
    wk_tensor th = {.name = "h", .dtype = WK_DTYPE_F16, .ndim = 2, .shape = {1, 2},
                    .data = h, .nbytes = 4};
    assert_int_equal(wk_tensor_read_f32(&th, 0, 2, out), WK_OK);
    assert_true(out[0] == 1.0f && out[1] == -2.0f);
    uint8_t b[4] = {0x80, 0x3f, 0x40, 0xc0}; /* 1.0, -3.0 */
    wk_tensor tb = {.name = "b", .dtype = WK_DTYPE_BF16, .ndim = 1, .shape = {2},
                    .data = b, .nbytes = 4};
    assert_int_equal(wk_tensor_read_f32(&tb, 0, 2, out), WK_OK);
    assert_true(out[0] == 1.0f && out[1] == -3.0f);
    tb.dtype = (wk_dtype)9;
    assert_int_equal(wk_tensor_read_f32(&tb, 0, 2, out), WK_EINVAL);
    /* scalar */
    wk_tensor ts = {.name = "s", .dtype = WK_DTYPE_F32, .ndim = 0, .data = raw + 1, .nbytes = 4};
    assert_int_equal(wk_tensor_read_f32(&ts, 0, 1, out), WK_OK);
    assert_true(out[0] == 1.5f);
    assert_int_equal(wk_tensor_read_f32(&ts, 0, 2, out), WK_EINVAL);
}

/* ---- wk_tensor_list ---- */

static void
test_tensor_list(void **state)
{
    (void)state;
    wk_tensor_list a, b;
    wk_tensor_list_init(&a);
    wk_tensor_list_init(&b);
    wk_tensor t = {.dtype = WK_DTYPE_F32};
    char name[32];
    for (int i = 0; i < 40; i++) {
        snprintf(name, sizeof(name), "n%02dXX", i);
        assert_int_equal(wk_tensor_list_push(i < 25 ? &a : &b, &t, name, 3), WK_OK);
    }
    assert_int_equal(a.n, 25);
    assert_string_equal(a.v[24].name, "n24");
    assert_int_equal(wk_tensor_list_take(&a, &b), WK_OK);
    assert_int_equal(a.n, 40);
    assert_int_equal(b.n, 0);
    assert_null(b.v);
    assert_string_equal(a.v[39].name, "n39");
    assert_int_equal(wk_tensor_list_take(&a, &b), WK_OK); /* empty source */
    assert_int_equal(a.n, 40);
    wk_tensor_list_fini(&a);
    assert_int_equal(a.n, 0);
    wk_tensor_list_fini(&a);
    wk_tensor_list_fini(NULL);
}

/* ---- wk_tensor_set ---- */

static void
test_set_open_sorted(void **state)
{
    (void)state;
    tdir td;
    tdir_init(&td);
    float data[4] = {1, 2, 3, 4};
    size_t len;
    uint8_t *img = st_image("{\"zeta\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"alpha\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[8,12]},"
                            "\"mid\":{\"dtype\":\"BF16\",\"shape\":[1,1],"
                            "\"data_offsets\":[12,14]}}",
                            data, sizeof(data), &len);
    const char *path = tdir_write(&td, "m.safetensors", img, len);
    free(img);
    wk_tensor_set *set = NULL;
    wk_diag d = {""};
    assert_int_equal(wk_tensor_set_open(path, &set, &d), WK_OK);
    assert_string_equal(d.msg, "");
    assert_int_equal(wk_tensor_set_count(set), 3);
    assert_string_equal(wk_tensor_set_at(set, 0)->name, "alpha");
    assert_string_equal(wk_tensor_set_at(set, 1)->name, "mid");
    assert_string_equal(wk_tensor_set_at(set, 2)->name, "zeta");
    assert_null(wk_tensor_set_at(set, 3));
    const wk_tensor *t = wk_tensor_set_find(set, "zeta");
    assert_non_null(t);
    float out[2];
    assert_int_equal(wk_tensor_read_f32(t, 0, 2, out), WK_OK);
    assert_true(out[0] == 1 && out[1] == 2);
    t = wk_tensor_set_find(set, "alpha");
    assert_non_null(t);
    assert_int_equal(t->ndim, 0);
    assert_int_equal(wk_tensor_read_f32(t, 0, 1, out), WK_OK);
    assert_true(out[0] == 3);
    assert_non_null(wk_tensor_set_find(set, "mid"));
    assert_null(wk_tensor_set_find(set, "beta"));
    assert_null(wk_tensor_set_find(set, "zzz"));
    assert_null(wk_tensor_set_find(set, ""));
    assert_null(wk_tensor_set_find(set, NULL));
    wk_tensor_set_free(set);

    /* lookups on many names */
    char json[8192] = "{";
    size_t off = 1;
    for (int i = 0; i < 100; i++)
        off += (size_t)snprintf(json + off, sizeof(json) - off,
                                "%s\"t%03d\":{\"dtype\":\"F16\",\"shape\":[1],"
                                "\"data_offsets\":[%d,%d]}", i ? "," : "", (i * 37) % 100,
                                2 * i, 2 * i + 2);
    snprintf(json + off, sizeof(json) - off, "}");
    uint8_t zeros[200] = {0};
    img = st_image(json, zeros, sizeof(zeros), &len);
    path = tdir_write(&td, "many.safetensors", img, len);
    free(img);
    assert_int_equal(wk_tensor_set_open(path, &set, &d), WK_OK);
    assert_int_equal(wk_tensor_set_count(set), 100);
    for (int i = 0; i < 100; i++) {
        char name[16];
        snprintf(name, sizeof(name), "t%03d", i);
        t = wk_tensor_set_find(set, name);
        assert_non_null(t);
        assert_string_equal(t->name, name);
        assert_ptr_equal(t, wk_tensor_set_at(set, (size_t)i));
    }
    wk_tensor_set_free(set);

    /* an empty header is a valid, empty set */
    img = st_image("{}", NULL, 0, &len);
    path = tdir_write(&td, "empty.safetensors", img, len);
    free(img);
    assert_int_equal(wk_tensor_set_open(path, &set, &d), WK_OK);
    assert_int_equal(wk_tensor_set_count(set), 0);
    assert_null(wk_tensor_set_at(set, 0));
    assert_null(wk_tensor_set_find(set, "x"));
    wk_tensor_set_free(set);
    tdir_free(&td);
}

static void
test_set_open_errors(void **state)
{
    (void)state;
    tdir td;
    tdir_init(&td);
    wk_tensor_set *set = (wk_tensor_set *)&td; /* must stay untouched on failure */
    wk_diag d = {""};
    char path[512];

    snprintf(path, sizeof(path), "%s/missing.safetensors", td.path);
    assert_int_equal(wk_tensor_set_open(path, &set, &d), WK_ENOENT);
    assert_non_null(strstr(d.msg, "missing.safetensors"));
    assert_ptr_equal(set, (wk_tensor_set *)&td);

    snprintf(path, sizeof(path), "%s/nodir/x.safetensors", td.path);
    assert_int_equal(wk_tensor_set_open(path, &set, &d), WK_ENOENT);

    assert_int_equal(wk_tensor_set_open(td.path, &set, &d), WK_EINVAL); /* a directory */
    assert_non_null(strstr(d.msg, "not a regular file"));

    assert_int_equal(wk_tensor_set_open(NULL, &set, &d), WK_EINVAL);
    assert_int_equal(wk_tensor_set_open(td.path, NULL, NULL), WK_EINVAL);

    const char *p = tdir_write(&td, "empty.bin", NULL, 0);
    assert_int_equal(wk_tensor_set_open(p, &set, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "truncated"));
    assert_non_null(strstr(d.msg, "empty.bin"));

    /* zip magic goes to the .pth reader */
    p = tdir_write(&td, "junk.pth", "PK\x03\x04garbage", 11);
    assert_int_equal(wk_tensor_set_open(p, &set, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "zip"));

    /* legacy torch pickle magic */
    p = tdir_write(&td, "old.pth", "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8", 12);
    assert_int_equal(wk_tensor_set_open(p, &set, &d), WK_ENOTSUP);
    assert_non_null(strstr(d.msg, "legacy"));

    /* anything else is read as safetensors */
    size_t len;
    uint8_t *img = st_image("{\"w\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
                            "\0\0\0\0\0\0\0\0", 8, &len);
    p = tdir_write(&td, "w.bin", img, len);
    free(img);
    assert_int_equal(wk_tensor_set_open(p, &set, &d), WK_ENOTSUP);
    assert_non_null(strstr(d.msg, "'w'"));
    assert_non_null(strstr(d.msg, "I64"));

    /* .json goes to the index reader */
    p = tdir_write(&td, "model.safetensors.index.json", "{\"weight_map\": 3}", 17);
    assert_int_equal(wk_tensor_set_open(p, &set, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "weight_map"));
    assert_non_null(strstr(d.msg, "index.json"));

    /* unreadable file (root reads anything, so only checked as a user) */
    img = st_image("{}", NULL, 0, &len);
    p = tdir_write(&td, "noperm.safetensors", img, len);
    free(img);
    if (geteuid() != 0) {
        assert_int_equal(chmod(p, 0), 0);
        assert_int_equal(wk_tensor_set_open(p, &set, &d), WK_EPERM);
    }
    assert_ptr_equal(set, (wk_tensor_set *)&td);
    wk_tensor_set_free(NULL);
    assert_int_equal(wk_tensor_set_count(NULL), 0);
    assert_null(wk_tensor_set_at(NULL, 0));
    assert_null(wk_tensor_set_find(NULL, "x"));
    tdir_free(&td);
}

static void
test_map(void **state)
{
    (void)state;
    tdir td;
    tdir_init(&td);
    const char *p = tdir_write(&td, "f", "hello", 5);
    wk_map m;
    wk_diag d = {""};
    assert_int_equal(wk_map_open(p, 0, &m, &d), WK_OK);
    assert_int_equal(m.len, 5);
    assert_memory_equal(m.data, "hello", 5);
    wk_map_close(&m);
    assert_null(m.data);
    wk_map_close(&m);
    wk_map_close(NULL);
    assert_int_equal(wk_map_open(p, 4, &m, &d), WK_ETOOBIG);
    assert_int_equal(wk_map_open(p, 5, &m, &d), WK_OK);
    wk_map_close(&m);
    p = tdir_write(&td, "e", NULL, 0);
    assert_int_equal(wk_map_open(p, 0, &m, &d), WK_OK);
    assert_int_equal(m.len, 0);
    assert_null(m.data);
    wk_map_close(&m);
    tdir_free(&td);
}

/*
 * wk_q8_0_quantize_row: ggml's quantize_row_q8_0_ref by hand. Block 0 has
 * amax 127 (d = 1, q = roundf(x), halves away from zero), block 1 is all
 * zero (d = 0, q = 0), block 2 has amax 1 (d = 1/127 stored as fp16 0x2008,
 * q = roundf(x * 127) with id computed from the fp32 d, not the fp16 one).
 */
static void
test_q8_0_quantize(void **state)
{
    (void)state;
    float x[96] = {0};
    x[0] = 127.0f;
    x[1] = -63.5f;
    x[2] = 0.5f;
    x[3] = -0.49f;
    x[4] = 2.5f;
    x[64] = 1.0f;
    x[65] = -0.5f;
    x[66] = 0.25f;
    uint8_t q[3 * 34];
    assert_int_equal(wk_q8_0_quantize_row(x, 96, q), WK_OK);
    assert_int_equal(q[0] | q[1] << 8, 0x3c00); /* d = 1.0 */
    assert_int_equal((int8_t)q[2], 127);
    assert_int_equal((int8_t)q[3], -64);
    assert_int_equal((int8_t)q[4], 1);
    assert_int_equal((int8_t)q[5], 0);
    assert_int_equal((int8_t)q[6], 3);
    for (int j = 0; j < 34; j++)
        assert_int_equal(q[34 + j], 0);
    float dv = 1.0f / 127.0f, id = 1.0f / dv;
    assert_int_equal(q[68] | q[69] << 8, wk_f32_to_f16(dv));
    assert_int_equal(wk_f32_to_f16(dv), 0x2008);
    assert_int_equal((int8_t)q[70], 127);
    assert_int_equal((int8_t)q[71], (int)roundf(-0.5f * id));
    assert_int_equal((int8_t)q[72], (int)roundf(0.25f * id));
    assert_int_equal(wk_q8_0_quantize_row(x, 33, q), WK_EINVAL);
    /* read back: d(fp16) * q */
    wk_tensor t = {.name = "q", .dtype = WK_DTYPE_Q8_0, .ndim = 1, .shape = {96},
                   .data = q, .nbytes = 3 * 34};
    float r[96];
    assert_int_equal(wk_tensor_read_f32(&t, 0, 96, r), WK_OK);
    assert_true(r[1] == -64.0f && r[64] == 127.0f * wk_f16_to_f32(0x2008));
    size_t nb = 0;
    int64_t shp[2] = {3, 64}, odd[2] = {3, 48};
    assert_int_equal(wk_tensor_size(WK_DTYPE_Q8_0, 2, shp, NULL, &nb), WK_OK);
    assert_int_equal(nb, 3 * 2 * 34);
    assert_int_equal(wk_tensor_size(WK_DTYPE_Q8_0, 2, odd, NULL, &nb), WK_EINVAL);
    assert_string_equal(wk_dtype_name(WK_DTYPE_Q8_0), "Q8_0");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_helpers),
        cmocka_unit_test(test_q8_0_quantize),
        cmocka_unit_test(test_tensor_size),
        cmocka_unit_test(test_f16_to_f32_exhaustive),
        cmocka_unit_test(test_bf16_exhaustive),
        cmocka_unit_test(test_f32_rounding),
        cmocka_unit_test(test_read_f32),
        cmocka_unit_test(test_tensor_list),
        cmocka_unit_test(test_set_open_sorted),
        cmocka_unit_test(test_set_open_errors),
        cmocka_unit_test(test_map),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
