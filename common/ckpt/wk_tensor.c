/*
 * wk_tensor: dtype helpers, element conversion, and what the container
 * readers (wk_safetensors.c, wk_pth.c, wk_gguf.c) build on: the tensor list,
 * file mappings and size checks of wk_tensor_priv.h. The wk_tensor_set that
 * fronts the readers is wk_tensor_set.c, one level up. Never logs.
 */
#include "wk_tensor.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wk_tensor_priv.h"

size_t
wk_dtype_size(wk_dtype dtype)
{
    switch (dtype) {
    case WK_DTYPE_F32:
        return 4;
    case WK_DTYPE_F16:
    case WK_DTYPE_BF16:
        return 2;
    case WK_DTYPE_Q8_0:
        return 0;
    }
    return 0;
}

size_t
wk_dtype_block_len(wk_dtype dtype)
{
    return dtype == WK_DTYPE_Q8_0 ? WK_Q8_0_BLOCK : 1;
}

size_t
wk_dtype_block_bytes(wk_dtype dtype)
{
    return dtype == WK_DTYPE_Q8_0 ? WK_Q8_0_BYTES : wk_dtype_size(dtype);
}

const char *
wk_dtype_name(wk_dtype dtype)
{
    switch (dtype) {
    case WK_DTYPE_F32:
        return "F32";
    case WK_DTYPE_F16:
        return "F16";
    case WK_DTYPE_BF16:
        return "BF16";
    case WK_DTYPE_Q8_0:
        return "Q8_0";
    }
    return "?";
}

wk_err
wk_dtype_parse(const char *name, wk_dtype *out)
{
    if (name == NULL || out == NULL)
        return WK_EINVAL;
    if (strcmp(name, "F32") == 0)
        *out = WK_DTYPE_F32;
    else if (strcmp(name, "F16") == 0)
        *out = WK_DTYPE_F16;
    else if (strcmp(name, "BF16") == 0)
        *out = WK_DTYPE_BF16;
    else
        return WK_ENOTSUP;
    return WK_OK;
}

int64_t
wk_tensor_numel(const wk_tensor *t)
{
    /* a zero dim first: the product of the others may not fit (a shape
       wk_tensor_size() accepts, [0, 2^42, 2^56], found by fuzz_gguf) */
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0)
            return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        if (__builtin_mul_overflow(n, t->shape[i], &n))
            return INT64_MAX;
    return n;
}

static uint32_t
wk_f32_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof(u));
    return u;
}

static float
wk_bits_f32(uint32_t u)
{
    float v;
    memcpy(&v, &u, sizeof(v));
    return v;
}

float
wk_bf16_to_f32(uint16_t v)
{
    return wk_bits_f32((uint32_t)v << 16);
}

uint16_t
wk_f32_to_bf16(float v)
{
    uint32_t u = wk_f32_bits(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and payload top, force quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* round to nearest even; a carry into the exponent gives the right result up to inf */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float
wk_f16_to_f32(uint16_t v)
{
    uint32_t sign = (uint32_t)(v & 0x8000u) << 16;
    uint32_t exp = (v >> 10) & 0x1fu;
    uint32_t man = v & 0x3ffu;
    if (exp == 0x1f) /* inf or NaN, payload kept */
        return wk_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp != 0)
        return wk_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
    if (man == 0)
        return wk_bits_f32(sign);
    /* subnormal: man * 2^-24, renormalised */
    int e = 113;
    while ((man & 0x400u) == 0) {
        man <<= 1;
        e--;
    }
    return wk_bits_f32(sign | ((uint32_t)e << 23) | ((man & 0x3ffu) << 13));
}

uint16_t
wk_f32_to_f16(float v)
{
    uint32_t u = wk_f32_bits(v);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t x = u & 0x7fffffffu;
    if (x > 0x7f800000u) /* NaN: quiet, top payload bits kept */
        return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    if (x >= 0x477ff000u) /* >= 65520 rounds to inf (and inf itself) */
        return (uint16_t)(sign | 0x7c00u);
    if (x >= 0x38800000u) { /* normal half: exponent >= -14 */
        uint32_t h = ((x >> 23) - 112) << 10 | ((x >> 13) & 0x3ffu);
        uint32_t rem = x & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    if (x <= 0x33000000u) /* <= 2^-25: rounds to (signed) zero */
        return sign;
    /* subnormal half: value = m * 2^(e-150); result k = m >> (126 - e), rounded */
    uint32_t e = x >> 23;
    uint32_t m = (x & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 for e in 102..112 */
    uint32_t k = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (k & 1u)))
        k++;
    return (uint16_t)(sign | k);
}

wk_err
wk_tensor_read_f32(const wk_tensor *t, size_t first, size_t n, float *out)
{
    if (t == NULL || (n > 0 && out == NULL))
        return WK_EINVAL;
    int64_t numel = wk_tensor_numel(t);
    if (numel < 0 || first > (uint64_t)numel || n > (uint64_t)numel - first)
        return WK_EINVAL;
    const uint8_t *p = t->data;
    size_t bl = wk_dtype_block_len(t->dtype), bb = wk_dtype_block_bytes(t->dtype);
    if (bb == 0 || (n > 0 && (p == NULL || first + n > t->nbytes / bb * bl)))
        return WK_EINVAL;
    if (t->dtype == WK_DTYPE_Q8_0) {
        for (size_t i = 0; i < n; i++) {
            const uint8_t *blk = p + (first + i) / WK_Q8_0_BLOCK * WK_Q8_0_BYTES;
            float dv = wk_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
            out[i] = dv * (float)(int8_t)blk[2 + (first + i) % WK_Q8_0_BLOCK];
        }
        return WK_OK;
    }
    p += first * bb;
    switch (t->dtype) {
    case WK_DTYPE_F32:
        for (size_t i = 0; i < n; i++, p += 4)
            out[i] = wk_bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                 (uint32_t)p[3] << 24);
        break;
    case WK_DTYPE_F16:
        for (size_t i = 0; i < n; i++, p += 2)
            out[i] = wk_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
        break;
    case WK_DTYPE_BF16:
        for (size_t i = 0; i < n; i++, p += 2)
            out[i] = wk_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
        break;
    default:
        return WK_EINVAL;
    }
    return WK_OK;
}

/* ---- wk_tensor_list (wk_tensor_priv.h) ---- */

void
wk_tensor_list_init(wk_tensor_list *l)
{
    l->v = NULL;
    l->n = 0;
    l->cap = 0;
}

void
wk_tensor_list_fini(wk_tensor_list *l)
{
    if (l == NULL)
        return;
    for (size_t i = 0; i < l->n; i++)
        free((char *)l->v[i].name);
    free(l->v);
    wk_tensor_list_init(l);
}

static wk_err
wk_tensor_list_reserve(wk_tensor_list *l, size_t extra)
{
    if (extra <= l->cap - l->n)
        return WK_OK;
    if (extra > SIZE_MAX / sizeof(wk_tensor) - l->n)
        return WK_ENOMEM;
    size_t cap = l->cap <= SIZE_MAX / sizeof(wk_tensor) / 2 ? l->cap * 2 : l->n + extra;
    if (cap < 16)
        cap = 16;
    if (cap < l->n + extra)
        cap = l->n + extra;
    wk_tensor *v = realloc(l->v, cap * sizeof(*v));
    if (v == NULL)
        return WK_ENOMEM;
    l->v = v;
    l->cap = cap;
    return WK_OK;
}

wk_err
wk_tensor_list_push(wk_tensor_list *l, const wk_tensor *t, const char *name, size_t name_len)
{
    if (name_len == SIZE_MAX || wk_tensor_list_reserve(l, 1) != WK_OK)
        return WK_ENOMEM;
    char *copy = malloc(name_len + 1);
    if (copy == NULL)
        return WK_ENOMEM;
    memcpy(copy, name, name_len);
    copy[name_len] = '\0';
    l->v[l->n] = *t;
    l->v[l->n].name = copy;
    l->n++;
    return WK_OK;
}

wk_err
wk_tensor_list_take(wk_tensor_list *dst, wk_tensor_list *src)
{
    if (src->n == 0)
        return WK_OK;
    if (wk_tensor_list_reserve(dst, src->n) != WK_OK)
        return WK_ENOMEM;
    memcpy(dst->v + dst->n, src->v, src->n * sizeof(*src->v));
    dst->n += src->n;
    free(src->v);
    wk_tensor_list_init(src);
    return WK_OK;
}

wk_err
wk_tensor_size(wk_dtype dtype, int ndim, const int64_t *shape, int64_t *numel, size_t *nbytes)
{
    if (ndim < 0 || ndim > WK_TENSOR_MAX_DIMS)
        return WK_EINVAL;
    uint64_t n = 1;
    int zero = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return WK_EINVAL;
        if (shape[i] == 0)
            zero = 1;
    }
    if (!zero) {
        for (int i = 0; i < ndim; i++) {
            if ((uint64_t)shape[i] > (uint64_t)INT64_MAX / n)
                return WK_EINVAL;
            n *= (uint64_t)shape[i];
        }
    } else {
        n = 0;
    }
    size_t bl = wk_dtype_block_len(dtype), bb = wk_dtype_block_bytes(dtype);
    if (bb == 0)
        return WK_EINVAL;
    if (bl > 1) {
        /* blocks run along the last dim: it must hold whole blocks */
        if (ndim < 1 || shape[ndim - 1] % (int64_t)bl != 0)
            return WK_EINVAL;
    }
    uint64_t nb = n / bl;
    if (nb > SIZE_MAX / bb || nb > (uint64_t)INT64_MAX / bb)
        return WK_EINVAL;
    if (numel)
        *numel = (int64_t)n;
    if (nbytes)
        *nbytes = (size_t)nb * bb;
    return WK_OK;
}

wk_err
wk_q8_0_quantize_row(const float *x, size_t n, uint8_t *out)
{
    if (n % WK_Q8_0_BLOCK != 0 || (n > 0 && (x == NULL || out == NULL)))
        return WK_EINVAL;
    for (size_t b = 0; b < n / WK_Q8_0_BLOCK; b++) {
        const float *xb = x + b * WK_Q8_0_BLOCK;
        uint8_t *ob = out + b * WK_Q8_0_BYTES;
        float amax = 0.0f;
        for (int j = 0; j < WK_Q8_0_BLOCK; j++) {
            float v = fabsf(xb[j]);
            amax = amax > v ? amax : v; /* ggml's MAX(amax, fabsf(v)): NaN never wins */
        }
        const float dv = amax / 127.0f;
        const float id = dv != 0.0f ? 1.0f / dv : 0.0f;
        uint16_t dh = wk_f32_to_f16(dv);
        ob[0] = (uint8_t)(dh & 0xff);
        ob[1] = (uint8_t)(dh >> 8);
        for (int j = 0; j < WK_Q8_0_BLOCK; j++) {
            float q = roundf(xb[j] * id); /* |q| <= 127: |x| <= amax, x * id rounds to <= 127 */
            ob[2 + j] = (uint8_t)(int8_t)q;
        }
    }
    return WK_OK;
}

/* ---- wk_map (wk_tensor_priv.h) ---- */

wk_err
wk_map_open(const char *path, size_t max_len, wk_map *m, wk_diag *d)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR)
            return wk_diag_set(d, WK_ENOENT, "%s: no such file", path);
        if (e == EACCES || e == EPERM)
            return wk_diag_set(d, WK_EPERM, "%s: permission denied", path);
        return wk_diag_set(d, WK_EIO, "%s: open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return wk_diag_set(d, WK_EIO, "%s: fstat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return wk_diag_set(d, WK_EINVAL, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX || (max_len && (uint64_t)st.st_size > max_len)) {
        close(fd);
        return wk_diag_set(d, WK_ETOOBIG, "%s: %lld bytes, over the limit of %zu", path,
                           (long long)st.st_size, max_len);
    }
    wk_map r = {NULL, (size_t)st.st_size};
    if (r.len > 0) {
        void *p = mmap(NULL, r.len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return wk_diag_set(d, e == ENOMEM ? WK_ENOMEM : WK_EIO, "%s: mmap: %s", path,
                               strerror(e));
        }
        r.data = p;
    }
    close(fd);
    *m = r;
    return WK_OK;
}

void
wk_map_close(wk_map *m)
{
    if (m == NULL)
        return;
    if (m->data != NULL)
        munmap((void *)m->data, m->len);
    m->data = NULL;
    m->len = 0;
}
