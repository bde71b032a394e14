/*
 * wk_gguf: parses GGUF (v2, v3) images: metadata key/values and tensor infos,
 * and exposes F32/F16/BF16 tensors as wk_tensor views into the image.
 *
 * The parser walks the image with a bounded cursor: every read checks the
 * bytes left first, every count is checked against what the remaining bytes
 * could possibly hold before anything is allocated for it, and every sum of
 * offsets and sizes is checked for overflow. Tensor data must be aligned to
 * general.alignment, lie inside the data section and not overlap. It must
 * never read outside the image, never copy tensor bytes and never log.
 */
#include "wk_gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_tensor_priv.h"

/* One metadata key/value. Scalars are decoded; strings and arrays point into the image. */
typedef struct wk_gguf_kv {
    char *key;              /* NUL-terminated copy of the key, owned */
    wk_gguf_type type;      /* value type */
    union {
        uint64_t u;         /* unsigned integers and bool */
        int64_t i;          /* signed integers */
        double f;           /* floats */
    } v;                    /* scalar value */
    const char *str;        /* STRING: the bytes, borrowed from the image */
    size_t str_len;         /* STRING: bytes at str */
    wk_gguf_type elem;      /* ARRAY: element type */
    uint64_t n;             /* ARRAY: element count */
    const uint8_t **strs;   /* ARRAY of STRING: n pointers at each u64 length prefix, owned */
    const uint8_t *arr;     /* ARRAY of a scalar type: the elements, borrowed from the image */
} wk_gguf_kv;

struct wk_gguf {
    uint32_t version;    /* 2 or 3 */
    wk_map map;          /* the mapped file (wk_gguf_open), zeroed for wk_gguf_parse */
    wk_gguf_kv *kv;      /* key/values in file order */
    size_t n_kv;         /* entries in kv */
    wk_tensor_list t;    /* tensors in file order; names owned by the list */
};

/* A bounded read cursor over the image. */
typedef struct wk_gguf_cur {
    const uint8_t *p;    /* image start */
    size_t len;          /* image bytes */
    size_t off;          /* next byte to read */
} wk_gguf_cur;

static const char *const wk_gguf_ggml_names[] = {
    "F32",     "F16",     "Q4_0",    "Q4_1",  "Q4_2", "Q4_3", "Q5_0",  "Q5_1",
    "Q8_0",    "Q8_1",    "Q2_K",    "Q3_K",  "Q4_K", "Q5_K", "Q6_K",  "Q8_K",
    "IQ2_XXS", "IQ2_XS",  "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
    "I8",      "I16",     "I32",     "I64",   "F64",  "IQ1_M", "BF16",  "Q4_0_4_4",
    "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0",
};

const char *
wk_gguf_ggml_type_name(uint32_t type)
{
    if (type < sizeof(wk_gguf_ggml_names) / sizeof(wk_gguf_ggml_names[0]))
        return wk_gguf_ggml_names[type];
    return "unknown";
}

/* GGML type numbers of the element types read as such. */
enum { WK_GGML_F32 = 0, WK_GGML_F16 = 1, WK_GGML_Q8_0 = 8, WK_GGML_BF16 = 30 };

static size_t
wk_gguf_left(const wk_gguf_cur *c)
{
    return c->len - c->off;
}

static int
wk_gguf_rd(wk_gguf_cur *c, void *dst, size_t n)
{
    if (wk_gguf_left(c) < n)
        return 0;
    memcpy(dst, c->p + c->off, n);
    c->off += n;
    return 1;
}

static int
wk_gguf_u32(wk_gguf_cur *c, uint32_t *v)
{
    uint8_t b[4];
    if (!wk_gguf_rd(c, b, 4))
        return 0;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return 1;
}

static int
wk_gguf_u64(wk_gguf_cur *c, uint64_t *v)
{
    uint8_t b[8];
    if (!wk_gguf_rd(c, b, 8))
        return 0;
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = x << 8 | b[i];
    *v = x;
    return 1;
}

/* Reads a gguf_string (u64 length, bytes) of at most max bytes; *s points into the image. */
static wk_err
wk_gguf_str(wk_gguf_cur *c, uint64_t max, const char **s, size_t *len, const char *what,
            wk_diag *d)
{
    uint64_t n;
    if (!wk_gguf_u64(c, &n))
        return wk_diag_set(d, WK_EINVAL, "%s: truncated string length", what);
    if (n > max)
        return wk_diag_set(d, WK_ETOOBIG, "%s: string of %llu bytes (limit %llu)", what,
                           (unsigned long long)n, (unsigned long long)max);
    if (n > wk_gguf_left(c))
        return wk_diag_set(d, WK_EINVAL, "%s: string of %llu bytes past the end of the file",
                           what, (unsigned long long)n);
    *s = (const char *)c->p + c->off;
    *len = (size_t)n;
    c->off += (size_t)n;
    return WK_OK;
}

/* Bytes of one scalar of type t; 0 for STRING, ARRAY and unknown types. */
static size_t
wk_gguf_scalar_size(uint32_t t)
{
    switch (t) {
    case WK_GGUF_TYPE_UINT8:
    case WK_GGUF_TYPE_INT8:
    case WK_GGUF_TYPE_BOOL:
        return 1;
    case WK_GGUF_TYPE_UINT16:
    case WK_GGUF_TYPE_INT16:
        return 2;
    case WK_GGUF_TYPE_UINT32:
    case WK_GGUF_TYPE_INT32:
    case WK_GGUF_TYPE_FLOAT32:
        return 4;
    case WK_GGUF_TYPE_UINT64:
    case WK_GGUF_TYPE_INT64:
    case WK_GGUF_TYPE_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

/* Decodes one scalar of type t (size checked by the caller) at p into kv->v. */
static void
wk_gguf_scalar(uint32_t t, const uint8_t *p, wk_gguf_kv *kv)
{
    uint64_t x = 0;
    size_t n = wk_gguf_scalar_size(t);
    for (size_t i = n; i > 0; i--)
        x = x << 8 | p[i - 1];
    switch (t) {
    case WK_GGUF_TYPE_INT8:
        kv->v.i = (int8_t)x;
        break;
    case WK_GGUF_TYPE_INT16:
        kv->v.i = (int16_t)x;
        break;
    case WK_GGUF_TYPE_INT32:
        kv->v.i = (int32_t)x;
        break;
    case WK_GGUF_TYPE_INT64:
        kv->v.i = (int64_t)x;
        break;
    case WK_GGUF_TYPE_FLOAT32: {
        uint32_t u = (uint32_t)x;
        float f;
        memcpy(&f, &u, 4);
        kv->v.f = f;
        break;
    }
    case WK_GGUF_TYPE_FLOAT64:
        memcpy(&kv->v.f, &x, 8);
        break;
    case WK_GGUF_TYPE_BOOL:
        kv->v.u = x != 0;
        break;
    default:
        kv->v.u = x;
        break;
    }
}

/* Reads the value of kv (type already read) at the cursor. */
static wk_err
wk_gguf_value(wk_gguf_cur *c, wk_gguf_kv *kv, wk_diag *d)
{
    size_t sz = wk_gguf_scalar_size(kv->type);
    if (sz > 0) {
        if (wk_gguf_left(c) < sz)
            return wk_diag_set(d, WK_EINVAL, "key '%s': truncated value", kv->key);
        wk_gguf_scalar(kv->type, c->p + c->off, kv);
        c->off += sz;
        return WK_OK;
    }
    if (kv->type == WK_GGUF_TYPE_STRING)
        return wk_gguf_str(c, WK_GGUF_MAX_STRING, &kv->str, &kv->str_len, kv->key, d);
    if (kv->type != WK_GGUF_TYPE_ARRAY)
        return wk_diag_set(d, WK_EINVAL, "key '%s': unknown value type %u", kv->key,
                           (unsigned)kv->type);

    uint32_t et;
    uint64_t n;
    if (!wk_gguf_u32(c, &et) || !wk_gguf_u64(c, &n))
        return wk_diag_set(d, WK_EINVAL, "key '%s': truncated array header", kv->key);
    kv->elem = (wk_gguf_type)et;
    kv->n = n;
    if (et == WK_GGUF_TYPE_ARRAY)
        return wk_diag_set(d, WK_ENOTSUP, "key '%s': nested arrays are not supported", kv->key);
    size_t esz = wk_gguf_scalar_size(et);
    if (esz > 0) {
        if (n > wk_gguf_left(c) / esz)
            return wk_diag_set(d, WK_EINVAL, "key '%s': array of %llu elements past the end "
                                             "of the file",
                               kv->key, (unsigned long long)n);
        kv->arr = c->p + c->off;
        c->off += (size_t)n * esz;
        return WK_OK;
    }
    if (et != WK_GGUF_TYPE_STRING)
        return wk_diag_set(d, WK_EINVAL, "key '%s': unknown array element type %u", kv->key,
                           (unsigned)et);
    /* each string takes at least its 8-byte length: bounds n before allocating */
    if (n > wk_gguf_left(c) / 8)
        return wk_diag_set(d, WK_EINVAL, "key '%s': array of %llu strings past the end of "
                                         "the file",
                           kv->key, (unsigned long long)n);
    kv->strs = malloc((n ? (size_t)n : 1) * sizeof(*kv->strs));
    if (kv->strs == NULL)
        return wk_diag_set(d, WK_ENOMEM, "key '%s': out of memory (%llu strings)", kv->key,
                           (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t sl;
        kv->strs[i] = c->p + c->off;
        wk_err e = wk_gguf_str(c, WK_GGUF_MAX_STRING, &s, &sl, kv->key, d);
        if (e != WK_OK)
            return e;
    }
    return WK_OK;
}

static const wk_gguf_kv *
wk_gguf_kv_find(const wk_gguf *g, const char *key)
{
    if (g == NULL || key == NULL)
        return NULL;
    for (size_t i = 0; i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0)
            return &g->kv[i];
    return NULL;
}

/* Reads the key/values. */
static wk_err
wk_gguf_read_kv(wk_gguf_cur *c, wk_gguf *g, uint64_t n_kv, wk_diag *d)
{
    /* each key/value takes at least 8 (key length) + 4 (type) + 1 bytes */
    if (n_kv > WK_GGUF_MAX_KV)
        return wk_diag_set(d, WK_ETOOBIG, "%llu metadata keys (limit %llu)",
                           (unsigned long long)n_kv, (unsigned long long)WK_GGUF_MAX_KV);
    if (n_kv > wk_gguf_left(c) / 13)
        return wk_diag_set(d, WK_EINVAL, "%llu metadata keys past the end of the file",
                           (unsigned long long)n_kv);
    g->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof(*g->kv));
    if (g->kv == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory (%llu keys)", (unsigned long long)n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        const char *k;
        size_t kl;
        char what[32];
        snprintf(what, sizeof(what), "metadata key %llu", (unsigned long long)i);
        wk_err e = wk_gguf_str(c, WK_GGUF_MAX_KEY, &k, &kl, what, d);
        if (e != WK_OK)
            return e;
        if (kl == 0 || memchr(k, '\0', kl) != NULL)
            return wk_diag_set(d, WK_EINVAL, "%s: empty key or key holding a NUL", what);
        wk_gguf_kv *kv = &g->kv[g->n_kv];
        kv->key = malloc(kl + 1);
        if (kv->key == NULL)
            return wk_diag_set(d, WK_ENOMEM, "out of memory");
        memcpy(kv->key, k, kl);
        kv->key[kl] = '\0';
        g->n_kv++;
        for (size_t j = 0; j + 1 < g->n_kv; j++)
            if (strcmp(g->kv[j].key, kv->key) == 0)
                return wk_diag_set(d, WK_EINVAL, "key '%s': duplicate", kv->key);
        uint32_t t;
        if (!wk_gguf_u32(c, &t))
            return wk_diag_set(d, WK_EINVAL, "key '%s': truncated type", kv->key);
        kv->type = (wk_gguf_type)t;
        if ((e = wk_gguf_value(c, kv, d)) != WK_OK)
            return e;
    }
    return WK_OK;
}

/* A tensor info while it is being validated. */
typedef struct wk_gguf_ti {
    uint64_t off;  /* offset in the data section */
    size_t nbytes; /* bytes */
    size_t idx;    /* index in the tensor list */
} wk_gguf_ti;

static int
wk_gguf_ti_cmp(const void *a, const void *b)
{
    const wk_gguf_ti *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static int
wk_gguf_name_cmp(const void *a, const void *b)
{
    const wk_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Reads the tensor infos, then places them in the data section. */
static wk_err
wk_gguf_read_tensors(wk_gguf_cur *c, wk_gguf *g, uint64_t n_t, wk_diag *d)
{
    wk_err e = WK_OK;
    if (n_t > WK_GGUF_MAX_TENSORS)
        return wk_diag_set(d, WK_ETOOBIG, "%llu tensors (limit %llu)", (unsigned long long)n_t,
                           (unsigned long long)WK_GGUF_MAX_TENSORS);
    /* each info takes at least 8 (name length) + 4 + 4 + 8 bytes */
    if (n_t > wk_gguf_left(c) / 24)
        return wk_diag_set(d, WK_EINVAL, "%llu tensors past the end of the file",
                           (unsigned long long)n_t);
    wk_gguf_ti *ti = calloc(n_t ? (size_t)n_t : 1, sizeof(*ti));
    const wk_tensor **byname = calloc(n_t ? (size_t)n_t : 1, sizeof(*byname));
    if (ti == NULL || byname == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory (%llu tensors)", (unsigned long long)n_t);
        goto out;
    }
    for (uint64_t i = 0; i < n_t; i++) {
        const char *nm;
        size_t nl;
        char what[32];
        snprintf(what, sizeof(what), "tensor info %llu", (unsigned long long)i);
        if ((e = wk_gguf_str(c, WK_GGUF_MAX_NAME, &nm, &nl, what, d)) != WK_OK)
            goto out;
        if (nl == 0 || memchr(nm, '\0', nl) != NULL) {
            e = wk_diag_set(d, WK_EINVAL, "%s: empty name or name holding a NUL", what);
            goto out;
        }
        uint32_t nd, type;
        uint64_t dims[WK_TENSOR_MAX_DIMS];
        if (!wk_gguf_u32(c, &nd)) {
            e = wk_diag_set(d, WK_EINVAL, "tensor '%.*s': truncated", (int)nl, nm);
            goto out;
        }
        if (nd > WK_TENSOR_MAX_DIMS) {
            e = wk_diag_set(d, WK_ENOTSUP, "tensor '%.*s': %u dims (limit %d)", (int)nl, nm,
                            (unsigned)nd, WK_TENSOR_MAX_DIMS);
            goto out;
        }
        for (uint32_t k = 0; k < nd; k++) {
            if (!wk_gguf_u64(c, &dims[k])) {
                e = wk_diag_set(d, WK_EINVAL, "tensor '%.*s': truncated", (int)nl, nm);
                goto out;
            }
            if (dims[k] > (uint64_t)INT64_MAX) {
                e = wk_diag_set(d, WK_EINVAL, "tensor '%.*s': dim %u too large", (int)nl, nm,
                                (unsigned)k);
                goto out;
            }
        }
        if (!wk_gguf_u32(c, &type) || !wk_gguf_u64(c, &ti[i].off)) {
            e = wk_diag_set(d, WK_EINVAL, "tensor '%.*s': truncated", (int)nl, nm);
            goto out;
        }
        wk_tensor t;
        memset(&t, 0, sizeof(t));
        if (type == WK_GGML_F32) {
            t.dtype = WK_DTYPE_F32;
        } else if (type == WK_GGML_F16) {
            t.dtype = WK_DTYPE_F16;
        } else if (type == WK_GGML_BF16) {
            t.dtype = WK_DTYPE_BF16;
        } else if (type == WK_GGML_Q8_0) {
            t.dtype = WK_DTYPE_Q8_0;
            if (nd == 0 || dims[0] % WK_Q8_0_BLOCK != 0) {
                e = wk_diag_set(d, WK_EINVAL,
                                "tensor '%.*s': Q8_0 rows of %llu elements are not whole "
                                "blocks of %d",
                                (int)nl, nm, nd > 0 ? (unsigned long long)dims[0] : 0ull,
                                WK_Q8_0_BLOCK);
                goto out;
            }
        } else {
            e = wk_diag_set(d, WK_ENOTSUP,
                            "tensor '%.*s': GGML type %s (%u) is not supported (F32, F16, "
                            "BF16 and Q8_0 only; convert with --outtype f32, f16, bf16 or q8_0)",
                            (int)nl, nm, wk_gguf_ggml_type_name(type), (unsigned)type);
            goto out;
        }
        t.ndim = (int)nd;
        for (uint32_t k = 0; k < nd; k++)
            t.shape[k] = (int64_t)dims[nd - 1 - k]; /* GGUF is fastest-first */
        if (wk_tensor_size(t.dtype, t.ndim, t.shape, NULL, &t.nbytes) != WK_OK) {
            e = wk_diag_set(d, WK_EINVAL, "tensor '%.*s': size overflows", (int)nl, nm);
            goto out;
        }
        ti[i].nbytes = t.nbytes;
        ti[i].idx = (size_t)i;
        if ((e = wk_tensor_list_push(&g->t, &t, nm, nl)) != WK_OK) {
            e = wk_diag_set(d, e, "out of memory");
            goto out;
        }
    }
    for (size_t i = 0; i < g->t.n; i++)
        byname[i] = &g->t.v[i];
    if (g->t.n > 1)
        qsort(byname, g->t.n, sizeof(*byname), wk_gguf_name_cmp);
    for (size_t i = 1; i < g->t.n; i++)
        if (strcmp(byname[i - 1]->name, byname[i]->name) == 0) {
            e = wk_diag_set(d, WK_EINVAL, "tensor '%s': duplicate name", byname[i]->name);
            goto out;
        }

    /* alignment and the data section */
    uint64_t align = WK_GGUF_DEFAULT_ALIGN;
    const wk_gguf_kv *ak = wk_gguf_kv_find(g, "general.alignment");
    if (ak != NULL) {
        if (ak->type != WK_GGUF_TYPE_UINT32 || ak->v.u == 0 || ak->v.u > WK_GGUF_MAX_ALIGN ||
            (ak->v.u & (ak->v.u - 1)) != 0) {
            e = wk_diag_set(d, WK_EINVAL,
                            "key 'general.alignment': not a UINT32 power of two <= %u",
                            WK_GGUF_MAX_ALIGN);
            goto out;
        }
        align = ak->v.u;
    }
    size_t start = c->off;
    if (start % align != 0) {
        size_t pad = (size_t)(align - start % align);
        if (pad > wk_gguf_left(c)) {
            if (g->t.n > 0) {
                e = wk_diag_set(d, WK_EINVAL, "data section past the end of the file");
                goto out;
            }
            pad = wk_gguf_left(c); /* no tensors: the padding may be cut */
        }
        start += pad;
    }
    size_t data_len = c->len - start;
    for (size_t i = 0; i < g->t.n; i++) {
        wk_tensor *t = &g->t.v[i];
        if (ti[i].off % align != 0) {
            e = wk_diag_set(d, WK_EINVAL, "tensor '%s': offset %llu not a multiple of the "
                                          "alignment %llu",
                            t->name, (unsigned long long)ti[i].off, (unsigned long long)align);
            goto out;
        }
        if (ti[i].off > data_len || t->nbytes > data_len - ti[i].off) {
            e = wk_diag_set(d, WK_EINVAL, "tensor '%s': bytes [%llu, +%zu) past the end of "
                                          "the data section (%zu bytes)",
                            t->name, (unsigned long long)ti[i].off, t->nbytes, data_len);
            goto out;
        }
        t->data = c->p + start + (size_t)ti[i].off;
    }
    if (g->t.n > 1)
        qsort(ti, g->t.n, sizeof(*ti), wk_gguf_ti_cmp);
    for (size_t i = 1; i < g->t.n; i++)
        if (ti[i - 1].off + ti[i - 1].nbytes > ti[i].off && ti[i - 1].nbytes > 0 &&
            ti[i].nbytes > 0) {
            e = wk_diag_set(d, WK_EINVAL, "tensor '%s': overlaps tensor '%s'",
                            g->t.v[ti[i].idx].name, g->t.v[ti[i - 1].idx].name);
            goto out;
        }
out:
    free(ti);
    free(byname);
    return e;
}

wk_err
wk_gguf_parse(const void *buf, size_t len, wk_gguf **out, wk_diag *d)
{
    if ((buf == NULL && len > 0) || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "wk_gguf_parse: NULL argument");
    wk_gguf_cur c = {buf, len, 0};
    uint8_t magic[4];
    uint32_t version;
    uint64_t n_t, n_kv;
    if (!wk_gguf_rd(&c, magic, 4) || memcmp(magic, "GGUF", 4) != 0)
        return wk_diag_set(d, WK_EINVAL, "not a GGUF file (bad magic)");
    if (!wk_gguf_u32(&c, &version))
        return wk_diag_set(d, WK_EINVAL, "truncated GGUF header");
    if (version != 2 && version != 3)
        return wk_diag_set(d, WK_ENOTSUP, "GGUF version %u is not supported (2 and 3 are)",
                           (unsigned)version);
    if (!wk_gguf_u64(&c, &n_t) || !wk_gguf_u64(&c, &n_kv))
        return wk_diag_set(d, WK_EINVAL, "truncated GGUF header");
    wk_gguf *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    g->version = version;
    wk_tensor_list_init(&g->t);
    wk_err e = wk_gguf_read_kv(&c, g, n_kv, d);
    if (e == WK_OK)
        e = wk_gguf_read_tensors(&c, g, n_t, d);
    if (e != WK_OK) {
        wk_gguf_free(g);
        return e;
    }
    *out = g;
    return WK_OK;
}

wk_err
wk_gguf_open(const char *path, wk_gguf **out, wk_diag *d)
{
    if (path == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "wk_gguf_open: NULL argument");
    wk_map m;
    memset(&m, 0, sizeof(m));
    wk_err e = wk_map_open(path, 0, &m, d);
    if (e != WK_OK)
        return e;
    wk_gguf *g = NULL;
    if ((e = wk_gguf_parse(m.data, m.len, &g, d)) != WK_OK) {
        wk_diag_prefix(d, "%s", path);
        wk_map_close(&m);
        return e;
    }
    g->map = m;
    *out = g;
    return WK_OK;
}

void
wk_gguf_free(wk_gguf *g)
{
    if (g == NULL)
        return;
    for (size_t i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].strs);
    }
    free(g->kv);
    wk_tensor_list_fini(&g->t);
    wk_map_close(&g->map);
    free(g);
}

uint32_t
wk_gguf_version(const wk_gguf *g)
{
    return g ? g->version : 0;
}

size_t
wk_gguf_tensor_count(const wk_gguf *g)
{
    return g ? g->t.n : 0;
}

const wk_tensor *
wk_gguf_tensor_at(const wk_gguf *g, size_t i)
{
    if (g == NULL || i >= g->t.n)
        return NULL;
    return &g->t.v[i];
}

const wk_tensor *
wk_gguf_tensor_find(const wk_gguf *g, const char *name)
{
    if (g == NULL || name == NULL)
        return NULL;
    for (size_t i = 0; i < g->t.n; i++)
        if (strcmp(g->t.v[i].name, name) == 0)
            return &g->t.v[i];
    return NULL;
}

size_t
wk_gguf_kv_count(const wk_gguf *g)
{
    return g ? g->n_kv : 0;
}

const char *
wk_gguf_kv_key(const wk_gguf *g, size_t i, wk_gguf_type *type)
{
    if (g == NULL || i >= g->n_kv)
        return NULL;
    if (type != NULL)
        *type = g->kv[i].type;
    return g->kv[i].key;
}

wk_err
wk_gguf_get_u64(const wk_gguf *g, const char *key, uint64_t *out, wk_diag *d)
{
    const wk_gguf_kv *kv = wk_gguf_kv_find(g, key);
    if (kv == NULL)
        return wk_diag_set(d, WK_ENOENT, "key '%s': absent", key ? key : "(null)");
    switch (kv->type) {
    case WK_GGUF_TYPE_UINT8:
    case WK_GGUF_TYPE_UINT16:
    case WK_GGUF_TYPE_UINT32:
    case WK_GGUF_TYPE_UINT64:
    case WK_GGUF_TYPE_BOOL:
        *out = kv->v.u;
        return WK_OK;
    case WK_GGUF_TYPE_INT8:
    case WK_GGUF_TYPE_INT16:
    case WK_GGUF_TYPE_INT32:
    case WK_GGUF_TYPE_INT64:
        if (kv->v.i < 0)
            return wk_diag_set(d, WK_EINVAL, "key '%s': negative", key);
        *out = (uint64_t)kv->v.i;
        return WK_OK;
    default:
        return wk_diag_set(d, WK_EINVAL, "key '%s': not an integer", key);
    }
}

wk_err
wk_gguf_get_f64(const wk_gguf *g, const char *key, double *out, wk_diag *d)
{
    const wk_gguf_kv *kv = wk_gguf_kv_find(g, key);
    if (kv == NULL)
        return wk_diag_set(d, WK_ENOENT, "key '%s': absent", key ? key : "(null)");
    if (kv->type != WK_GGUF_TYPE_FLOAT32 && kv->type != WK_GGUF_TYPE_FLOAT64)
        return wk_diag_set(d, WK_EINVAL, "key '%s': not a float", key);
    *out = kv->v.f;
    return WK_OK;
}

wk_err
wk_gguf_get_str(const wk_gguf *g, const char *key, const char **s, size_t *len, wk_diag *d)
{
    const wk_gguf_kv *kv = wk_gguf_kv_find(g, key);
    if (kv == NULL)
        return wk_diag_set(d, WK_ENOENT, "key '%s': absent", key ? key : "(null)");
    if (kv->type != WK_GGUF_TYPE_STRING)
        return wk_diag_set(d, WK_EINVAL, "key '%s': not a string", key);
    *s = kv->str;
    *len = kv->str_len;
    return WK_OK;
}

wk_err
wk_gguf_get_arr(const wk_gguf *g, const char *key, wk_gguf_type *elem, uint64_t *n, wk_diag *d)
{
    const wk_gguf_kv *kv = wk_gguf_kv_find(g, key);
    if (kv == NULL)
        return wk_diag_set(d, WK_ENOENT, "key '%s': absent", key ? key : "(null)");
    if (kv->type != WK_GGUF_TYPE_ARRAY)
        return wk_diag_set(d, WK_EINVAL, "key '%s': not an array", key);
    *elem = kv->elem;
    *n = kv->n;
    return WK_OK;
}

wk_err
wk_gguf_arr_str(const wk_gguf *g, const char *key, uint64_t i, const char **s, size_t *len,
                wk_diag *d)
{
    const wk_gguf_kv *kv = wk_gguf_kv_find(g, key);
    if (kv == NULL)
        return wk_diag_set(d, WK_ENOENT, "key '%s': absent", key ? key : "(null)");
    if (kv->type != WK_GGUF_TYPE_ARRAY || kv->elem != WK_GGUF_TYPE_STRING)
        return wk_diag_set(d, WK_EINVAL, "key '%s': not a string array", key);
    if (i >= kv->n)
        return wk_diag_set(d, WK_EINVAL, "key '%s': index %llu out of range (%llu)", key,
                           (unsigned long long)i, (unsigned long long)kv->n);
    const uint8_t *p = kv->strs[i];
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--)
        n = n << 8 | p[k];
    *s = (const char *)p + 8;
    *len = (size_t)n; /* checked against the image when parsed */
    return WK_OK;
}

wk_err
wk_gguf_arr_int(const wk_gguf *g, const char *key, uint64_t i, int64_t *out, wk_diag *d)
{
    const wk_gguf_kv *kv = wk_gguf_kv_find(g, key);
    if (kv == NULL)
        return wk_diag_set(d, WK_ENOENT, "key '%s': absent", key ? key : "(null)");
    if (kv->type != WK_GGUF_TYPE_ARRAY || kv->arr == NULL || kv->elem == WK_GGUF_TYPE_FLOAT32 ||
        kv->elem == WK_GGUF_TYPE_FLOAT64)
        return wk_diag_set(d, WK_EINVAL, "key '%s': not an integer array", key);
    if (i >= kv->n)
        return wk_diag_set(d, WK_EINVAL, "key '%s': index %llu out of range (%llu)", key,
                           (unsigned long long)i, (unsigned long long)kv->n);
    wk_gguf_kv one = {.type = kv->elem};
    wk_gguf_scalar(kv->elem, kv->arr + (size_t)i * wk_gguf_scalar_size(kv->elem), &one);
    if (kv->elem == WK_GGUF_TYPE_UINT64 && one.v.u > INT64_MAX)
        return wk_diag_set(d, WK_EINVAL, "key '%s': element %llu over INT64_MAX", key,
                           (unsigned long long)i);
    switch (kv->elem) {
    case WK_GGUF_TYPE_INT8:
    case WK_GGUF_TYPE_INT16:
    case WK_GGUF_TYPE_INT32:
    case WK_GGUF_TYPE_INT64:
        *out = one.v.i;
        break;
    default:
        *out = (int64_t)one.v.u;
    }
    return WK_OK;
}
