/*
 * wk_pth: reads torch.save() zip archives without Python.
 *
 * Two layers. The zip layer parses the end-of-central-directory record (and
 * its zip64 form), the central directory and, per entry used, the local file
 * header; only stored (method 0), unencrypted, single-disk entries are
 * accepted. The pickle layer is a small stack machine for the protocol 2
 * opcodes a state_dict uses (plus a few protocol 4 ones that cost nothing).
 * Its values live in a per-run pool freed all at once; REDUCE, BUILD and
 * BINPERSID only accept a fixed table of torch globals, so nothing is ever
 * executed or imported. Every stack, memo, container, string and object
 * count is bounded (WK_PTH_MAX_* in wk_pth.h). Tensor errors are reported
 * once the tensor's name is known (when the top dict is walked), so that the
 * diagnostic names it. This file must never read outside the archive buffer
 * and never log.
 */
#include "wk_pth.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- zip ---- */

#define PTH_ZIP_LOCAL 0x04034b50u   /* local file header signature */
#define PTH_ZIP_CENTRAL 0x02014b50u /* central directory header signature */
#define PTH_ZIP_EOCD 0x06054b50u    /* end of central directory signature */
#define PTH_ZIP_EOCD64 0x06064b50u  /* zip64 end of central directory signature */
#define PTH_ZIP_LOC64 0x07064b50u   /* zip64 end of central directory locator */
#define PTH_NAME_SHOWN 200          /* most bytes of an entry name put in a diag */

typedef struct pth_entry {
    const char *name; /* entry name in the archive, not NUL-terminated */
    size_t name_len;  /* bytes of name */
    uint64_t csize;   /* compressed size */
    uint64_t usize;   /* uncompressed size */
    uint64_t lho;     /* offset of the local file header */
    uint16_t method;  /* compression method (0 = stored) */
    uint16_t flags;   /* general purpose bit flags */
} pth_entry;

typedef struct pth_zip {
    const uint8_t *buf; /* the archive */
    size_t len;         /* bytes of buf */
    uint64_t cd_off;    /* start of the central directory; entry data ends before it */
    pth_entry *e;       /* entries sorted by name */
    size_t n;           /* entries in e */
    const char *prefix; /* archive folder ("<prefix>/data.pkl"), borrowed from buf */
    size_t prefix_len;  /* bytes of prefix */
} pth_zip;

static uint16_t
pth_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t
pth_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t
pth_le64(const uint8_t *p)
{
    return (uint64_t)pth_le32(p) | (uint64_t)pth_le32(p + 4) << 32;
}

static int
pth_name_shown(size_t len)
{
    return (int)(len < PTH_NAME_SHOWN ? len : PTH_NAME_SHOWN);
}

static int
pth_entry_cmp(const void *a, const void *b)
{
    const pth_entry *x = a, *y = b;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = n ? memcmp(x->name, y->name, n) : 0;
    if (c != 0)
        return c;
    return x->name_len < y->name_len ? -1 : x->name_len > y->name_len;
}

static const pth_entry *
pth_zip_find(const pth_zip *z, const char *name, size_t name_len)
{
    pth_entry key = {.name = name, .name_len = name_len};
    return bsearch(&key, z->e, z->n, sizeof(*z->e), pth_entry_cmp);
}

/* Reads the zip64 extended information extra field for the saturated fields of e. */
static wk_err
pth_zip64_extra(const uint8_t *x, size_t xlen, pth_entry *e, uint32_t *disk, wk_diag *d)
{
    int need_u = e->usize == 0xffffffffu, need_c = e->csize == 0xffffffffu;
    int need_o = e->lho == 0xffffffffu, need_d = *disk == 0xffffu;
    if (!need_u && !need_c && !need_o && !need_d)
        return WK_OK;
    size_t i = 0;
    while (xlen - i >= 4) {
        uint16_t id = pth_le16(x + i), sz = pth_le16(x + i + 2);
        if (sz > xlen - i - 4)
            break;
        if (id == 0x0001) {
            const uint8_t *f = x + i + 4;
            size_t left = sz;
            if (need_u) {
                if (left < 8)
                    goto bad;
                e->usize = pth_le64(f);
                f += 8;
                left -= 8;
            }
            if (need_c) {
                if (left < 8)
                    goto bad;
                e->csize = pth_le64(f);
                f += 8;
                left -= 8;
            }
            if (need_o) {
                if (left < 8)
                    goto bad;
                e->lho = pth_le64(f);
                f += 8;
                left -= 8;
            }
            if (need_d) {
                if (left < 4)
                    goto bad;
                *disk = pth_le32(f);
            }
            return WK_OK;
        }
        i += 4 + (size_t)sz;
    }
bad:
    return wk_diag_set(d, WK_EINVAL, "zip entry '%.*s': zip64 extra field missing or short",
                       pth_name_shown(e->name_len), e->name);
}

/* Parses the end records and the central directory of [buf, buf + len). */
static wk_err
pth_zip_open(const uint8_t *buf, size_t len, pth_zip *z, wk_diag *d)
{
    memset(z, 0, sizeof(*z));
    z->buf = buf;
    z->len = len;
    if (len < 22)
        return wk_diag_set(d, WK_EINVAL, "not a zip archive: %zu bytes", len);
    size_t lo = len - 22 > 65535 ? len - 22 - 65535 : 0;
    size_t pos = len - 22;
    for (;;) {
        if (pth_le32(buf + pos) == PTH_ZIP_EOCD && pos + 22 + pth_le16(buf + pos + 20) == len)
            break;
        if (pos == lo)
            return wk_diag_set(d, WK_EINVAL, "not a zip archive: no end of central directory");
        pos--;
    }
    const uint8_t *eo = buf + pos;
    uint64_t disk = pth_le16(eo + 4), cd_disk = pth_le16(eo + 6);
    uint64_t n_disk = pth_le16(eo + 8), n_total = pth_le16(eo + 10);
    uint64_t cd_size = pth_le32(eo + 12), cd_off = pth_le32(eo + 16);
    uint64_t cd_limit = pos;
    if (pos >= 20 && pth_le32(buf + pos - 20) == PTH_ZIP_LOC64) {
        const uint8_t *lc = buf + pos - 20;
        uint64_t off = pth_le64(lc + 8);
        if (pth_le32(lc + 4) != 0 || pth_le32(lc + 16) > 1)
            return wk_diag_set(d, WK_ENOTSUP, "multi-disk zip archives are not supported");
        if (off > pos - 20 || pos - 20 - off < 56 || pth_le32(buf + off) != PTH_ZIP_EOCD64)
            return wk_diag_set(d, WK_EINVAL, "zip64 end of central directory out of bounds or "
                               "missing");
        const uint8_t *e64 = buf + off;
        disk = pth_le32(e64 + 16);
        cd_disk = pth_le32(e64 + 20);
        n_disk = pth_le64(e64 + 24);
        n_total = pth_le64(e64 + 32);
        cd_size = pth_le64(e64 + 40);
        cd_off = pth_le64(e64 + 48);
        cd_limit = off;
    } else if (n_total == 0xffffu || cd_size == 0xffffffffu || cd_off == 0xffffffffu) {
        return wk_diag_set(d, WK_EINVAL, "zip end record has zip64 markers but no zip64 locator");
    }
    if (disk != 0 || cd_disk != 0 || n_disk != n_total)
        return wk_diag_set(d, WK_ENOTSUP, "multi-disk zip archives are not supported");
    if (n_total > WK_PTH_MAX_ENTRIES)
        return wk_diag_set(d, WK_ETOOBIG, "zip archive has %llu entries, over the limit of %zu",
                           (unsigned long long)n_total, WK_PTH_MAX_ENTRIES);
    if (cd_off > cd_limit || cd_size > cd_limit - cd_off)
        return wk_diag_set(d, WK_EINVAL, "zip central directory [%llu, +%llu) out of bounds",
                           (unsigned long long)cd_off, (unsigned long long)cd_size);
    z->cd_off = cd_off;
    z->e = calloc(n_total ? n_total : 1, sizeof(*z->e));
    if (z->e == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    const uint8_t *p = buf + cd_off, *cd_end = buf + cd_off + cd_size;
    wk_err err = WK_OK;
    for (uint64_t i = 0; i < n_total; i++) {
        if (cd_end - p < 46 || pth_le32(p) != PTH_ZIP_CENTRAL) {
            err = wk_diag_set(d, WK_EINVAL, "zip central directory truncated at entry %llu",
                              (unsigned long long)i);
            goto fail;
        }
        pth_entry *e = &z->e[z->n];
        e->flags = pth_le16(p + 8);
        e->method = pth_le16(p + 10);
        e->csize = pth_le32(p + 20);
        e->usize = pth_le32(p + 24);
        size_t nlen = pth_le16(p + 28), xlen = pth_le16(p + 30), clen = pth_le16(p + 32);
        uint32_t disk_start = pth_le16(p + 34);
        e->lho = pth_le32(p + 42);
        if ((size_t)(cd_end - p) - 46 < nlen + xlen + clen) {
            err = wk_diag_set(d, WK_EINVAL, "zip central directory truncated at entry %llu",
                              (unsigned long long)i);
            goto fail;
        }
        e->name = (const char *)p + 46;
        e->name_len = nlen;
        err = pth_zip64_extra(p + 46 + nlen, xlen, e, &disk_start, d);
        if (err != WK_OK)
            goto fail;
        if (disk_start != 0) {
            err = wk_diag_set(d, WK_ENOTSUP, "zip entry '%.*s' starts on disk %u",
                              pth_name_shown(nlen), e->name, disk_start);
            goto fail;
        }
        z->n++;
        p += 46 + nlen + xlen + clen;
    }
    if (z->n > 1)
        qsort(z->e, z->n, sizeof(*z->e), pth_entry_cmp);
    for (size_t i = 1; i < z->n; i++) {
        if (pth_entry_cmp(&z->e[i - 1], &z->e[i]) == 0) {
            err = wk_diag_set(d, WK_EINVAL, "zip entry '%.*s' appears twice",
                              pth_name_shown(z->e[i].name_len), z->e[i].name);
            goto fail;
        }
    }
    return WK_OK;
fail:
    free(z->e);
    z->e = NULL;
    z->n = 0;
    return err;
}

/* Checks e's local header and returns where its stored bytes are. */
static wk_err
pth_zip_data(const pth_zip *z, const pth_entry *e, const uint8_t **data, size_t *size, wk_diag *d)
{
    int nl = pth_name_shown(e->name_len);
    if (e->flags & 0x0041u)
        return wk_diag_set(d, WK_ENOTSUP, "zip entry '%.*s' is encrypted", nl, e->name);
    if (e->method != 0)
        return wk_diag_set(d, WK_ENOTSUP, "zip entry '%.*s' is compressed (method %u); only "
                           "stored entries (as torch.save writes them) are supported", nl, e->name,
                           e->method);
    if (e->csize != e->usize)
        return wk_diag_set(d, WK_EINVAL, "zip entry '%.*s' is stored but its sizes differ "
                           "(%llu, %llu)", nl, e->name, (unsigned long long)e->csize,
                           (unsigned long long)e->usize);
    if (e->lho > z->cd_off || z->cd_off - e->lho < 30 || pth_le32(z->buf + e->lho) != PTH_ZIP_LOCAL)
        return wk_diag_set(d, WK_EINVAL, "zip entry '%.*s': local header at %llu missing or out "
                           "of bounds", nl, e->name, (unsigned long long)e->lho);
    const uint8_t *h = z->buf + e->lho;
    uint64_t room = z->cd_off - e->lho - 30;
    size_t lnl = pth_le16(h + 26), lxl = pth_le16(h + 28);
    if (lnl + lxl > room)
        return wk_diag_set(d, WK_EINVAL, "zip entry '%.*s': local header runs into the central "
                           "directory", nl, e->name);
    if (lnl != e->name_len || memcmp(h + 30, e->name, lnl) != 0)
        return wk_diag_set(d, WK_EINVAL, "zip entry '%.*s': local header names another entry",
                           nl, e->name);
    if (pth_le16(h + 8) != 0 || (pth_le16(h + 6) & 0x0041u))
        return wk_diag_set(d, WK_ENOTSUP, "zip entry '%.*s': local header says compressed or "
                           "encrypted", nl, e->name);
    if (e->usize > room - lnl - lxl)
        return wk_diag_set(d, WK_EINVAL, "zip entry '%.*s': %llu bytes of data run past the end "
                           "of the entries", nl, e->name, (unsigned long long)e->usize);
    *data = h + 30 + lnl + lxl;
    *size = (size_t)e->usize;
    return WK_OK;
}

/* Finds "<prefix>/<rest>" and returns its stored bytes; WK_ENOENT (d untouched) when absent. */
static wk_err
pth_zip_get(const pth_zip *z, const char *rest, const uint8_t **data, size_t *size, wk_diag *d)
{
    size_t rl = strlen(rest);
    char *name = malloc(z->prefix_len + 1 + rl + 1);
    if (name == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    memcpy(name, z->prefix, z->prefix_len);
    name[z->prefix_len] = '/';
    memcpy(name + z->prefix_len + 1, rest, rl + 1);
    const pth_entry *e = pth_zip_find(z, name, z->prefix_len + 1 + rl);
    wk_err err = e ? pth_zip_data(z, e, data, size, d) : WK_ENOENT;
    free(name);
    return err;
}

/* wk_pth_storage_fn over an archive: storage key k lives in "<prefix>/data/<k>". */
static wk_err
pth_zip_storage(void *ctx, const char *key, const void **data, size_t *len, wk_diag *d)
{
    const pth_zip *z = ctx;
    char rest[64];
    if (strlen(key) > sizeof(rest) - 6)
        return wk_diag_set(d, WK_ENOENT, "storage key '%.40s...' too long", key);
    snprintf(rest, sizeof(rest), "data/%s", key);
    const uint8_t *p;
    wk_err err = pth_zip_get(z, rest, &p, len, d);
    if (err == WK_ENOENT)
        return wk_diag_set(d, WK_ENOENT, "no zip entry '%.*s/%s'", pth_name_shown(z->prefix_len),
                           z->prefix, rest);
    if (err == WK_OK)
        *data = p;
    return err;
}

wk_err
wk_pth_parse(const void *buf, size_t len, wk_tensor_list *out, wk_diag *d)
{
    pth_zip z;
    wk_err err = pth_zip_open(buf, len, &z, d);
    if (err != WK_OK)
        return err;
    const pth_entry *pkl = NULL;
    for (size_t i = 0; i < z.n; i++) {
        const pth_entry *e = &z.e[i];
        if (e->name_len > 9 && memcmp(e->name + e->name_len - 9, "/data.pkl", 9) == 0 &&
            memchr(e->name, '/', e->name_len - 9) == NULL) {
            if (pkl != NULL) {
                err = wk_diag_set(d, WK_EINVAL, "zip archive has two data.pkl entries ('%.*s', "
                                  "'%.*s')", pth_name_shown(pkl->name_len), pkl->name,
                                  pth_name_shown(e->name_len), e->name);
                goto done;
            }
            pkl = e;
        }
    }
    if (pkl == NULL) {
        err = wk_diag_set(d, WK_EINVAL, "zip archive has no '<name>/data.pkl' entry: not a "
                          "torch.save() checkpoint");
        goto done;
    }
    z.prefix = pkl->name;
    z.prefix_len = pkl->name_len - 9;
    const uint8_t *bo;
    size_t bo_len;
    err = pth_zip_get(&z, "byteorder", &bo, &bo_len, d);
    if (err == WK_OK) {
        if (bo_len == 3 && memcmp(bo, "big", 3) == 0) {
            err = wk_diag_set(d, WK_ENOTSUP, "checkpoint was saved big-endian (byteorder 'big')");
            goto done;
        }
        if (bo_len != 6 || memcmp(bo, "little", 6) != 0) {
            err = wk_diag_set(d, WK_EINVAL, "zip entry '%.*s/byteorder' is neither 'little' nor "
                              "'big'", pth_name_shown(z.prefix_len), z.prefix);
            goto done;
        }
    } else if (err != WK_ENOENT) {
        goto done;
    }
    const uint8_t *pk;
    size_t pk_len;
    err = pth_zip_data(&z, pkl, &pk, &pk_len, d);
    if (err != WK_OK)
        goto done;
    if (pk_len > WK_PTH_MAX_PICKLE) {
        err = wk_diag_set(d, WK_ETOOBIG, "data.pkl is %zu bytes, over the limit of %zu", pk_len,
                          WK_PTH_MAX_PICKLE);
        goto done;
    }
    err = wk_pth_pickle_load(pk, pk_len, pth_zip_storage, &z, out, d);
done:
    free(z.e);
    return err;
}

/* ------------------------------------------------------------- pickle ---- */

typedef enum pth_kind {
    PTH_NONE,    /* None */
    PTH_BOOL,    /* True/False in u.i */
    PTH_INT,     /* int in u.i */
    PTH_FLOAT,   /* float in u.f */
    PTH_STR,     /* str in u.str */
    PTH_TUPLE,   /* tuple in u.seq */
    PTH_LIST,    /* list in u.seq */
    PTH_DICT,    /* dict or OrderedDict in u.seq, as key, value, key, value... */
    PTH_GLOBAL,  /* one of pth_globals in u.g */
    PTH_STORAGE, /* a persistent storage reference in u.st */
    PTH_TENSOR,  /* a _rebuild_tensor_v2 result in u.t */
} pth_kind;

static const char *const pth_kind_names[] = {
    "None", "bool", "int", "float", "str", "tuple", "list", "dict", "global", "storage", "tensor",
};

typedef enum pth_gkind {
    PTH_G_ORDEREDDICT,     /* collections.OrderedDict */
    PTH_G_REBUILD_TENSOR,  /* torch._utils._rebuild_tensor_v2 */
    PTH_G_REBUILD_PARAM,   /* torch._utils._rebuild_parameter */
    PTH_G_STORAGE,         /* torch.<T>Storage */
} pth_gkind;

typedef struct pth_global {
    const char *module; /* module part of the GLOBAL */
    const char *name;   /* name part of the GLOBAL */
    pth_gkind kind;     /* what REDUCE / BINPERSID do with it */
    int supported;      /* storage: 1 when dtype is one wk_tensor carries */
    wk_dtype dtype;     /* storage: element type when supported */
    size_t esize;       /* storage: bytes per element */
} pth_global;

/* The only globals a checkpoint may name. Unsupported storages fail per tensor, by name. */
static const pth_global pth_globals[] = {
    {"collections", "OrderedDict", PTH_G_ORDEREDDICT, 0, WK_DTYPE_F32, 0},
    {"torch._utils", "_rebuild_tensor_v2", PTH_G_REBUILD_TENSOR, 0, WK_DTYPE_F32, 0},
    {"torch._utils", "_rebuild_parameter", PTH_G_REBUILD_PARAM, 0, WK_DTYPE_F32, 0},
    {"torch", "FloatStorage", PTH_G_STORAGE, 1, WK_DTYPE_F32, 4},
    {"torch", "HalfStorage", PTH_G_STORAGE, 1, WK_DTYPE_F16, 2},
    {"torch", "BFloat16Storage", PTH_G_STORAGE, 1, WK_DTYPE_BF16, 2},
    {"torch", "DoubleStorage", PTH_G_STORAGE, 0, WK_DTYPE_F32, 8},
    {"torch", "LongStorage", PTH_G_STORAGE, 0, WK_DTYPE_F32, 8},
    {"torch", "IntStorage", PTH_G_STORAGE, 0, WK_DTYPE_F32, 4},
    {"torch", "ShortStorage", PTH_G_STORAGE, 0, WK_DTYPE_F32, 2},
    {"torch", "CharStorage", PTH_G_STORAGE, 0, WK_DTYPE_F32, 1},
    {"torch", "ByteStorage", PTH_G_STORAGE, 0, WK_DTYPE_F32, 1},
    {"torch", "BoolStorage", PTH_G_STORAGE, 0, WK_DTYPE_F32, 1},
    {"torch", "ComplexFloatStorage", PTH_G_STORAGE, 0, WK_DTYPE_F32, 8},
    {"torch", "ComplexDoubleStorage", PTH_G_STORAGE, 0, WK_DTYPE_F32, 16},
};

typedef struct pth_val pth_val;
struct pth_val {
    pth_kind kind; /* which member of u is live */
    union {
        int64_t i; /* PTH_BOOL, PTH_INT */
        double f;  /* PTH_FLOAT */
        struct {
            char *s;    /* NUL-terminated copy (may hold inner NULs) */
            size_t len; /* bytes of s without the final NUL */
        } str;
        struct {
            pth_val **items; /* elements (dict: key, value pairs) */
            size_t n;        /* used slots */
            size_t cap;      /* allocated slots */
        } seq;
        const pth_global *g; /* PTH_GLOBAL */
        struct {
            const pth_global *type; /* storage class */
            const pth_val *key;     /* PTH_STR key of the storage record */
            int64_t numel;          /* elements the persistent id announces */
        } st;
        struct pth_tensor *t; /* PTH_TENSOR, heap */
    } u;
};

/* A _rebuild_tensor_v2 result, kept out of line so that pth_val stays 32 bytes. */
typedef struct pth_tensor {
    const pth_val *storage;             /* PTH_STORAGE */
    int64_t offset;                     /* storage offset in elements */
    size_t ndim;                        /* dims as pickled (may exceed the max) */
    int64_t shape[WK_TENSOR_MAX_DIMS];  /* first dims of the size tuple */
    int64_t stride[WK_TENSOR_MAX_DIMS]; /* first dims of the stride tuple */
} pth_tensor;

#define PTH_CHUNK ((size_t)4096) /* values per pool chunk */

typedef struct pth_vm {
    const uint8_t *start; /* first pickle byte */
    const uint8_t *p;     /* next byte to read */
    const uint8_t *end;   /* one past the last pickle byte */
    size_t op_off;        /* offset of the opcode being run (for diags) */
    pth_val **stack;      /* value stack */
    size_t sp;            /* values on the stack */
    size_t stack_cap;     /* allocated stack slots */
    size_t marks[WK_PTH_MAX_MARKS]; /* stack heights at each open MARK */
    size_t n_marks;       /* open MARKs */
    pth_val **memo;       /* memo slots, NULL when unset */
    size_t memo_cap;      /* allocated memo slots */
    size_t memo_count;    /* set memo slots (MEMOIZE's next index) */
    pth_val **chunks;     /* value pool: chunks of PTH_CHUNK values, freed at the end */
    size_t chunks_cap;    /* allocated chunks slots */
    size_t n_objs;        /* values created (chunk n_objs / PTH_CHUNK is the last) */
    size_t items;         /* container slots used, all containers together */
    wk_diag *d;           /* caller's diag */
} pth_vm;

static wk_err pth_fail(pth_vm *vm, wk_err err, const char *fmt, ...) WK_PRINTF(3, 4);

static wk_err
pth_fail(pth_vm *vm, wk_err err, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return wk_diag_set(vm->d, err, "pickle offset %zu: %s", vm->op_off, msg);
}

static wk_err
pth_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return WK_OK;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *a = realloc(*arr, c * elem);
    if (a == NULL)
        return WK_ENOMEM;
    *arr = a;
    *cap = c;
    return WK_OK;
}

static wk_err
pth_new(pth_vm *vm, pth_kind kind, pth_val **out)
{
    if (vm->n_objs >= WK_PTH_MAX_OBJECTS)
        return pth_fail(vm, WK_ETOOBIG, "more than %zu values", WK_PTH_MAX_OBJECTS);
    size_t c = vm->n_objs / PTH_CHUNK;
    if (vm->n_objs % PTH_CHUNK == 0) {
        if (pth_grow((void **)&vm->chunks, &vm->chunks_cap, c + 1, sizeof(*vm->chunks)) != WK_OK)
            return pth_fail(vm, WK_ENOMEM, "out of memory");
        vm->chunks[c] = calloc(PTH_CHUNK, sizeof(pth_val));
        if (vm->chunks[c] == NULL)
            return pth_fail(vm, WK_ENOMEM, "out of memory");
    }
    pth_val *v = &vm->chunks[c][vm->n_objs % PTH_CHUNK];
    v->kind = kind;
    vm->n_objs++;
    *out = v;
    return WK_OK;
}

/* Frees what v owns (not v itself: it lives in a pool chunk). */
static void
pth_val_fini(pth_val *v)
{
    if (v->kind == PTH_STR)
        free(v->u.str.s);
    else if (v->kind == PTH_TUPLE || v->kind == PTH_LIST || v->kind == PTH_DICT)
        free(v->u.seq.items);
    else if (v->kind == PTH_TENSOR)
        free(v->u.t);
}

static size_t
pth_floor(const pth_vm *vm)
{
    return vm->n_marks ? vm->marks[vm->n_marks - 1] : 0;
}

static wk_err
pth_push(pth_vm *vm, pth_val *v)
{
    if (vm->sp >= WK_PTH_MAX_STACK)
        return pth_fail(vm, WK_ETOOBIG, "stack deeper than %zu", WK_PTH_MAX_STACK);
    if (pth_grow((void **)&vm->stack, &vm->stack_cap, vm->sp + 1, sizeof(*vm->stack)) != WK_OK)
        return pth_fail(vm, WK_ENOMEM, "out of memory");
    vm->stack[vm->sp++] = v;
    return WK_OK;
}

static wk_err
pth_pop(pth_vm *vm, pth_val **out)
{
    if (vm->sp <= pth_floor(vm))
        return pth_fail(vm, WK_EINVAL, "stack underflow");
    *out = vm->stack[--vm->sp];
    return WK_OK;
}

static wk_err
pth_peek(pth_vm *vm, pth_val **out)
{
    if (vm->sp <= pth_floor(vm))
        return pth_fail(vm, WK_EINVAL, "stack underflow");
    *out = vm->stack[vm->sp - 1];
    return WK_OK;
}

static wk_err
pth_pop_mark(pth_vm *vm, size_t *base)
{
    if (vm->n_marks == 0)
        return pth_fail(vm, WK_EINVAL, "no MARK to pop");
    *base = vm->marks[--vm->n_marks];
    return WK_OK;
}

static wk_err
pth_seq_add(pth_vm *vm, pth_val *seq, pth_val *v)
{
    if (vm->items >= WK_PTH_MAX_ITEMS)
        return pth_fail(vm, WK_ETOOBIG, "more than %zu container items", WK_PTH_MAX_ITEMS);
    if (pth_grow((void **)&seq->u.seq.items, &seq->u.seq.cap, seq->u.seq.n + 1,
                 sizeof(*seq->u.seq.items)) != WK_OK)
        return pth_fail(vm, WK_ENOMEM, "out of memory");
    seq->u.seq.items[seq->u.seq.n++] = v;
    vm->items++;
    return WK_OK;
}

static wk_err
pth_need(pth_vm *vm, size_t n)
{
    if ((size_t)(vm->end - vm->p) < n)
        return pth_fail(vm, WK_EINVAL, "truncated pickle (opcode needs %zu more bytes)", n);
    return WK_OK;
}

static wk_err
pth_push_int(pth_vm *vm, pth_kind kind, int64_t i)
{
    pth_val *v;
    wk_err err = pth_new(vm, kind, &v);
    if (err != WK_OK)
        return err;
    v->u.i = i;
    return pth_push(vm, v);
}

static wk_err
pth_push_str(pth_vm *vm, uint64_t len)
{
    if (len > WK_PTH_MAX_STR)
        return pth_fail(vm, WK_ETOOBIG, "string of %llu bytes, over the limit of %zu",
                        (unsigned long long)len, WK_PTH_MAX_STR);
    wk_err err = pth_need(vm, (size_t)len);
    if (err != WK_OK)
        return err;
    pth_val *v;
    err = pth_new(vm, PTH_STR, &v);
    if (err != WK_OK)
        return err;
    v->u.str.s = malloc((size_t)len + 1);
    if (v->u.str.s == NULL)
        return pth_fail(vm, WK_ENOMEM, "out of memory");
    memcpy(v->u.str.s, vm->p, (size_t)len);
    v->u.str.s[len] = '\0';
    v->u.str.len = (size_t)len;
    vm->p += len;
    return pth_push(vm, v);
}

/* Pushes a tuple of the top n values (n == SIZE_MAX: everything above the last MARK). */
static wk_err
pth_tuple(pth_vm *vm, size_t n)
{
    size_t base = 0;
    wk_err err;
    if (n == SIZE_MAX) {
        err = pth_pop_mark(vm, &base);
        if (err != WK_OK)
            return err;
        if (base > vm->sp)
            return pth_fail(vm, WK_EINVAL, "MARK above the stack");
    } else {
        if (vm->sp - pth_floor(vm) < n)
            return pth_fail(vm, WK_EINVAL, "stack underflow");
        base = vm->sp - n;
    }
    pth_val *t;
    err = pth_new(vm, PTH_TUPLE, &t);
    if (err != WK_OK)
        return err;
    for (size_t i = base; i < vm->sp; i++) {
        err = pth_seq_add(vm, t, vm->stack[i]);
        if (err != WK_OK)
            return err;
    }
    vm->sp = base;
    return pth_push(vm, t);
}

static wk_err
pth_memo_put(pth_vm *vm, uint64_t idx)
{
    pth_val *top = NULL;
    wk_err err = pth_peek(vm, &top);
    if (err != WK_OK)
        return err;
    if (idx >= WK_PTH_MAX_MEMO)
        return pth_fail(vm, WK_ETOOBIG, "memo index %llu over the limit of %zu",
                        (unsigned long long)idx, WK_PTH_MAX_MEMO);
    if (idx >= vm->memo_cap) {
        size_t old = vm->memo_cap;
        if (pth_grow((void **)&vm->memo, &vm->memo_cap, (size_t)idx + 1, sizeof(*vm->memo)) !=
            WK_OK)
            return pth_fail(vm, WK_ENOMEM, "out of memory");
        memset(vm->memo + old, 0, (vm->memo_cap - old) * sizeof(*vm->memo));
    }
    if (vm->memo[idx] == NULL)
        vm->memo_count++;
    vm->memo[idx] = top;
    return WK_OK;
}

static wk_err
pth_memo_get(pth_vm *vm, uint64_t idx)
{
    if (idx >= vm->memo_cap || vm->memo[idx] == NULL)
        return pth_fail(vm, WK_EINVAL, "memo index %llu not set", (unsigned long long)idx);
    return pth_push(vm, vm->memo[idx]);
}

static wk_err
pth_global_push(pth_vm *vm, const char *mod, size_t mod_len, const char *name, size_t name_len)
{
    for (size_t i = 0; i < sizeof(pth_globals) / sizeof(pth_globals[0]); i++) {
        const pth_global *g = &pth_globals[i];
        if (strlen(g->module) == mod_len && memcmp(g->module, mod, mod_len) == 0 &&
            strlen(g->name) == name_len && memcmp(g->name, name, name_len) == 0) {
            pth_val *v;
            wk_err err = pth_new(vm, PTH_GLOBAL, &v);
            if (err != WK_OK)
                return err;
            v->u.g = g;
            return pth_push(vm, v);
        }
    }
    return pth_fail(vm, WK_ENOTSUP, "global '%.*s.%.*s' is not allowed in a checkpoint",
                    (int)(mod_len < 100 ? mod_len : 100), mod,
                    (int)(name_len < 100 ? name_len : 100), name);
}

/* GLOBAL: "module\nname\n". */
static wk_err
pth_op_global(pth_vm *vm)
{
    const char *part[2];
    size_t plen[2];
    for (int k = 0; k < 2; k++) {
        size_t room = (size_t)(vm->end - vm->p);
        if (room > 257)
            room = 257;
        const uint8_t *nl = memchr(vm->p, '\n', room);
        if (nl == NULL)
            return pth_fail(vm, WK_EINVAL, "GLOBAL name unterminated or over 256 bytes");
        part[k] = (const char *)vm->p;
        plen[k] = (size_t)(nl - vm->p);
        vm->p = nl + 1;
    }
    return pth_global_push(vm, part[0], plen[0], part[1], plen[1]);
}

static wk_err
pth_op_stack_global(pth_vm *vm)
{
    pth_val *name = NULL, *mod = NULL;
    wk_err err = pth_pop(vm, &name);
    if (err == WK_OK)
        err = pth_pop(vm, &mod);
    if (err != WK_OK)
        return err;
    if (name->kind != PTH_STR || mod->kind != PTH_STR)
        return pth_fail(vm, WK_EINVAL, "STACK_GLOBAL needs two strings");
    return pth_global_push(vm, mod->u.str.s, mod->u.str.len, name->u.str.s, name->u.str.len);
}

/* BINPERSID: ('storage', <torch.*Storage>, key, location, numel) -> storage reference. */
static wk_err
pth_op_persid(pth_vm *vm)
{
    pth_val *pid = NULL;
    wk_err err = pth_pop(vm, &pid);
    if (err != WK_OK)
        return err;
    if (pid->kind != PTH_TUPLE || pid->u.seq.n != 5)
        return pth_fail(vm, WK_EINVAL, "persistent id is not a 5-tuple");
    pth_val **a = pid->u.seq.items;
    if (a[0]->kind != PTH_STR || strcmp(a[0]->u.str.s, "storage") != 0)
        return pth_fail(vm, WK_EINVAL, "persistent id is not a 'storage' record");
    if (a[1]->kind != PTH_GLOBAL || a[1]->u.g->kind != PTH_G_STORAGE)
        return pth_fail(vm, WK_EINVAL, "persistent id names no torch storage class");
    if (a[2]->kind != PTH_STR || a[2]->u.str.len == 0 || strlen(a[2]->u.str.s) != a[2]->u.str.len)
        return pth_fail(vm, WK_EINVAL, "persistent id has a bad storage key");
    if (a[3]->kind != PTH_STR)
        return pth_fail(vm, WK_EINVAL, "persistent id has a bad location");
    if (a[4]->kind != PTH_INT || a[4]->u.i < 0)
        return pth_fail(vm, WK_EINVAL, "persistent id has a bad element count");
    pth_val *s;
    err = pth_new(vm, PTH_STORAGE, &s);
    if (err != WK_OK)
        return err;
    s->u.st.type = a[1]->u.g;
    s->u.st.key = a[2];
    s->u.st.numel = a[4]->u.i;
    return pth_push(vm, s);
}

/* Copies a tuple of ints into dims (first WK_TENSOR_MAX_DIMS of them). */
static int
pth_int_tuple(const pth_val *v, int64_t *dims)
{
    if (v->kind != PTH_TUPLE)
        return 0;
    for (size_t i = 0; i < v->u.seq.n; i++) {
        if (v->u.seq.items[i]->kind != PTH_INT)
            return 0;
        if (i < WK_TENSOR_MAX_DIMS)
            dims[i] = v->u.seq.items[i]->u.i;
    }
    return 1;
}

static int
pth_empty_dict(const pth_val *v)
{
    return v->kind == PTH_DICT && v->u.seq.n == 0;
}

static wk_err
pth_op_reduce(pth_vm *vm)
{
    pth_val *args = NULL, *fn = NULL, *r = NULL;
    wk_err err = pth_pop(vm, &args);
    if (err == WK_OK)
        err = pth_pop(vm, &fn);
    if (err != WK_OK)
        return err;
    if (fn->kind != PTH_GLOBAL)
        return pth_fail(vm, WK_EINVAL, "REDUCE on a %s, not a global", pth_kind_names[fn->kind]);
    if (args->kind != PTH_TUPLE)
        return pth_fail(vm, WK_EINVAL, "REDUCE arguments are a %s, not a tuple",
                        pth_kind_names[args->kind]);
    pth_val **a = args->u.seq.items;
    size_t n = args->u.seq.n;
    switch (fn->u.g->kind) {
    case PTH_G_ORDEREDDICT:
        if (n != 0)
            return pth_fail(vm, WK_EINVAL, "OrderedDict called with %zu arguments", n);
        err = pth_new(vm, PTH_DICT, &r);
        if (err != WK_OK)
            return err;
        return pth_push(vm, r);
    case PTH_G_REBUILD_TENSOR:
        if (n != 6 && n != 7)
            return pth_fail(vm, WK_EINVAL, "_rebuild_tensor_v2 called with %zu arguments", n);
        err = pth_new(vm, PTH_TENSOR, &r);
        if (err != WK_OK)
            return err;
        r->u.t = calloc(1, sizeof(*r->u.t));
        if (r->u.t == NULL)
            return pth_fail(vm, WK_ENOMEM, "out of memory");
        if (a[0]->kind != PTH_STORAGE || a[1]->kind != PTH_INT ||
            !pth_int_tuple(a[2], r->u.t->shape) || !pth_int_tuple(a[3], r->u.t->stride) ||
            a[2]->u.seq.n != a[3]->u.seq.n || a[4]->kind != PTH_BOOL || !pth_empty_dict(a[5]) ||
            (n == 7 && a[6]->kind != PTH_DICT && a[6]->kind != PTH_NONE))
            return pth_fail(vm, WK_EINVAL, "_rebuild_tensor_v2 arguments are not (storage, "
                            "offset, size, stride, requires_grad, {}[, metadata])");
        r->u.t->storage = a[0];
        r->u.t->offset = a[1]->u.i;
        r->u.t->ndim = a[2]->u.seq.n;
        return pth_push(vm, r);
    case PTH_G_REBUILD_PARAM:
        if (n != 3 || a[0]->kind != PTH_TENSOR || a[1]->kind != PTH_BOOL || !pth_empty_dict(a[2]))
            return pth_fail(vm, WK_EINVAL, "_rebuild_parameter arguments are not (tensor, "
                            "requires_grad, {})");
        return pth_push(vm, a[0]);
    case PTH_G_STORAGE:
        break;
    }
    return pth_fail(vm, WK_EINVAL, "storage class torch.%s called directly", fn->u.g->name);
}

static wk_err
pth_op_setitems(pth_vm *vm, int many)
{
    size_t base = 0;
    wk_err err;
    if (many) {
        err = pth_pop_mark(vm, &base);
        if (err != WK_OK)
            return err;
        if (base > vm->sp || base <= pth_floor(vm) || (vm->sp - base) % 2 != 0)
            return pth_fail(vm, WK_EINVAL, "SETITEMS without a dict or with an odd item count");
    } else {
        if (vm->sp - pth_floor(vm) < 3)
            return pth_fail(vm, WK_EINVAL, "stack underflow");
        base = vm->sp - 2;
    }
    pth_val *dict = vm->stack[base - 1];
    if (dict->kind != PTH_DICT)
        return pth_fail(vm, WK_EINVAL, "SETITEM on a %s", pth_kind_names[dict->kind]);
    for (size_t i = base; i < vm->sp; i++) {
        err = pth_seq_add(vm, dict, vm->stack[i]);
        if (err != WK_OK)
            return err;
    }
    vm->sp = base;
    return WK_OK;
}

static wk_err
pth_op_appends(pth_vm *vm, int many)
{
    size_t base = 0;
    wk_err err;
    if (many) {
        err = pth_pop_mark(vm, &base);
        if (err != WK_OK)
            return err;
        if (base > vm->sp || base <= pth_floor(vm))
            return pth_fail(vm, WK_EINVAL, "APPENDS without a list");
    } else {
        if (vm->sp - pth_floor(vm) < 2)
            return pth_fail(vm, WK_EINVAL, "stack underflow");
        base = vm->sp - 1;
    }
    pth_val *list = vm->stack[base - 1];
    if (list->kind != PTH_LIST)
        return pth_fail(vm, WK_EINVAL, "APPEND on a %s", pth_kind_names[list->kind]);
    for (size_t i = base; i < vm->sp; i++) {
        err = pth_seq_add(vm, list, vm->stack[i]);
        if (err != WK_OK)
            return err;
    }
    vm->sp = base;
    return WK_OK;
}

/* BUILD: only an OrderedDict's attribute state (state_dict()._metadata); ignored. */
static wk_err
pth_op_build(pth_vm *vm)
{
    pth_val *state = NULL, *obj = NULL;
    wk_err err = pth_pop(vm, &state);
    if (err == WK_OK)
        err = pth_peek(vm, &obj);
    if (err != WK_OK)
        return err;
    if (obj->kind != PTH_DICT)
        return pth_fail(vm, WK_EINVAL, "BUILD on a %s", pth_kind_names[obj->kind]);
    return WK_OK;
}

/* Runs the pickle to STOP; *result is its top value. */
/* Opcodes that push one scalar: None, bools, ints, floats, strings. */
static wk_err
pth_op_scalar(pth_vm *vm, uint8_t op)
{
    wk_err err;
    pth_val *v;
    switch (op) {
    case 'N': /* NONE */
        err = pth_new(vm, PTH_NONE, &v);
        if (err == WK_OK)
            err = pth_push(vm, v);
        break;
    case 0x88: /* NEWTRUE */
    case 0x89: /* NEWFALSE */
        err = pth_push_int(vm, PTH_BOOL, op == 0x88);
        break;
    case 'K': /* BININT1 */
        if ((err = pth_need(vm, 1)) != WK_OK)
            return err;
        err = pth_push_int(vm, PTH_INT, *vm->p);
        vm->p += 1;
        break;
    case 'M': /* BININT2 */
        if ((err = pth_need(vm, 2)) != WK_OK)
            return err;
        err = pth_push_int(vm, PTH_INT, pth_le16(vm->p));
        vm->p += 2;
        break;
    case 'J': /* BININT */
        if ((err = pth_need(vm, 4)) != WK_OK)
            return err;
        err = pth_push_int(vm, PTH_INT, (int32_t)pth_le32(vm->p));
        vm->p += 4;
        break;
    case 0x8a: { /* LONG1 */
        if ((err = pth_need(vm, 1)) != WK_OK)
            return err;
        size_t n = *vm->p++;
        if (n > 8)
            return pth_fail(vm, WK_ENOTSUP, "integer of %zu bytes", n);
        if ((err = pth_need(vm, n)) != WK_OK)
            return err;
        uint64_t u = 0;
        for (size_t i = 0; i < n; i++)
            u |= (uint64_t)vm->p[i] << (8 * i);
        if (n > 0 && n < 8 && (vm->p[n - 1] & 0x80))
            u |= ~(uint64_t)0 << (8 * n);
        vm->p += n;
        int64_t s;
        memcpy(&s, &u, sizeof(s));
        err = pth_push_int(vm, PTH_INT, s);
        break;
    }
    case 'G': { /* BINFLOAT, big-endian */
        if ((err = pth_need(vm, 8)) != WK_OK)
            return err;
        uint64_t u = 0;
        for (int i = 0; i < 8; i++)
            u = u << 8 | vm->p[i];
        vm->p += 8;
        err = pth_new(vm, PTH_FLOAT, &v);
        if (err == WK_OK) {
            memcpy(&v->u.f, &u, sizeof(v->u.f));
            err = pth_push(vm, v);
        }
        break;
    }
    case 'X': /* BINUNICODE */
        if ((err = pth_need(vm, 4)) != WK_OK)
            return err;
        vm->p += 4;
        err = pth_push_str(vm, pth_le32(vm->p - 4));
        break;
    case 0x8c: /* SHORT_BINUNICODE */
        if ((err = pth_need(vm, 1)) != WK_OK)
            return err;
        vm->p += 1;
        err = pth_push_str(vm, vm->p[-1]);
        break;
    case 0x8d: /* BINUNICODE8 */
        if ((err = pth_need(vm, 8)) != WK_OK)
            return err;
        vm->p += 8;
        err = pth_push_str(vm, pth_le64(vm->p - 8));
        break;
    default:
        return pth_fail(vm, WK_ENOTSUP, "unsupported pickle opcode 0x%02x", op);
    }
    return err;
}

/* The memo: BINPUT, LONG_BINPUT, MEMOIZE, BINGET, LONG_BINGET. */
static wk_err
pth_op_memo(pth_vm *vm, uint8_t op)
{
    wk_err err;
    switch (op) {
    case 'q': /* BINPUT */
        if ((err = pth_need(vm, 1)) != WK_OK)
            return err;
        err = pth_memo_put(vm, *vm->p++);
        break;
    case 'r': /* LONG_BINPUT */
        if ((err = pth_need(vm, 4)) != WK_OK)
            return err;
        vm->p += 4;
        err = pth_memo_put(vm, pth_le32(vm->p - 4));
        break;
    case 0x94: /* MEMOIZE */
        err = pth_memo_put(vm, vm->memo_count);
        break;
    case 'h': /* BINGET */
        if ((err = pth_need(vm, 1)) != WK_OK)
            return err;
        err = pth_memo_get(vm, *vm->p++);
        break;
    default: /* 'j': LONG_BINGET */
        if ((err = pth_need(vm, 4)) != WK_OK)
            return err;
        vm->p += 4;
        return pth_memo_get(vm, pth_le32(vm->p - 4));
    }
    return err;
}

static wk_err
pth_run(pth_vm *vm, pth_val **result)
{
    wk_err err = WK_OK;
    pth_val *v;
    for (;;) {
        if (vm->p >= vm->end) {
            vm->op_off = (size_t)(vm->p - vm->start);
            return pth_fail(vm, WK_EINVAL, "truncated pickle (no STOP)");
        }
        vm->op_off = (size_t)(vm->p - vm->start);
        uint8_t op = *vm->p++;
        switch (op) {
        case 0x80: /* PROTO */
            if ((err = pth_need(vm, 1)) != WK_OK)
                return err;
            if (*vm->p > 5)
                return pth_fail(vm, WK_ENOTSUP, "pickle protocol %u", *vm->p);
            vm->p++;
            break;
        case 0x95: /* FRAME: a length hint only */
            if ((err = pth_need(vm, 8)) != WK_OK)
                return err;
            vm->p += 8;
            break;
        case '.': /* STOP */
            return pth_pop(vm, result);
        case '}': /* EMPTY_DICT */
        case ']': /* EMPTY_LIST */
        case ')': /* EMPTY_TUPLE */
            err = pth_new(vm, op == '}' ? PTH_DICT : op == ']' ? PTH_LIST : PTH_TUPLE, &v);
            if (err == WK_OK)
                err = pth_push(vm, v);
            break;
        case '(': /* MARK */
            if (vm->n_marks >= WK_PTH_MAX_MARKS)
                return pth_fail(vm, WK_ETOOBIG, "more than %zu nested MARKs", WK_PTH_MAX_MARKS);
            vm->marks[vm->n_marks++] = vm->sp;
            break;
        case 'q': /* BINPUT */
        case 'r': /* LONG_BINPUT */
        case 0x94: /* MEMOIZE */
        case 'h': /* BINGET */
        case 'j': /* LONG_BINGET */
            err = pth_op_memo(vm, op);
            break;
        case 'c': /* GLOBAL */
            err = pth_op_global(vm);
            break;
        case 0x93: /* STACK_GLOBAL */
            err = pth_op_stack_global(vm);
            break;
        case 't': /* TUPLE */
            err = pth_tuple(vm, SIZE_MAX);
            break;
        case 0x85: /* TUPLE1 */
        case 0x86: /* TUPLE2 */
        case 0x87: /* TUPLE3 */
            err = pth_tuple(vm, (size_t)(op - 0x84));
            break;
        case 'Q': /* BINPERSID */
            err = pth_op_persid(vm);
            break;
        case 'R': /* REDUCE */
            err = pth_op_reduce(vm);
            break;
        case 's': /* SETITEM */
        case 'u': /* SETITEMS */
            err = pth_op_setitems(vm, op == 'u');
            break;
        case 'a': /* APPEND */
        case 'e': /* APPENDS */
            err = pth_op_appends(vm, op == 'e');
            break;
        case 'b': /* BUILD */
            err = pth_op_build(vm);
            break;
        default:
            err = pth_op_scalar(vm, op);
            break;
        }
        if (err != WK_OK)
            return err;
    }
}

/* ------------------------------------------------------ tensor walk ---- */

static int
pth_utf8_ok(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        unsigned min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 1;
            min = 0x80;
            c &= 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            k = 2;
            min = 0x800;
            c &= 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            k = 3;
            min = 0x10000;
            c &= 0x07;
        } else {
            return 0;
        }
        if (n - i - 1 < k)
            return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return 0;
            c = c << 6 | (s[i + j] & 0x3f);
        }
        if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
            return 0;
        i += k + 1;
    }
    return 1;
}

typedef struct pth_walk {
    wk_pth_storage_fn resolve; /* storage key -> bytes */
    void *ctx;                 /* resolve's context */
    wk_tensor_list *out;       /* tensors found so far */
    wk_diag *d;                /* caller's diag */
} pth_walk;

/* Validates one named tensor and appends it. */
static wk_err
pth_emit(pth_walk *w, const pth_val *key, const pth_val *tv)
{
    if (key->kind != PTH_STR)
        return wk_diag_set(w->d, WK_EINVAL, "a tensor is keyed by a %s, not a name",
                           pth_kind_names[key->kind]);
    const char *name = key->u.str.s;
    if (strlen(name) != key->u.str.len)
        return wk_diag_set(w->d, WK_EINVAL, "tensor '%s': name contains a NUL byte", name);
    if (!pth_utf8_ok((const unsigned char *)name, key->u.str.len))
        return wk_diag_set(w->d, WK_EINVAL, "tensor '%s': name is not valid UTF-8", name);
    if (w->out->n >= WK_PTH_MAX_TENSORS)
        return wk_diag_set(w->d, WK_ETOOBIG, "tensor '%s': more than %zu tensors", name,
                           WK_PTH_MAX_TENSORS);
    const pth_val *sv = tv->u.t->storage;
    const pth_global *type = sv->u.st.type;
    if (!type->supported)
        return wk_diag_set(w->d, WK_ENOTSUP, "tensor '%s': storage torch.%s not supported (F32, "
                           "F16, BF16)", name, type->name);
    if (tv->u.t->ndim > WK_TENSOR_MAX_DIMS)
        return wk_diag_set(w->d, WK_ENOTSUP, "tensor '%s': %zu dimensions, at most %d supported",
                           name, tv->u.t->ndim, WK_TENSOR_MAX_DIMS);
    wk_tensor t;
    memset(&t, 0, sizeof(t));
    t.dtype = type->dtype;
    t.ndim = (int)tv->u.t->ndim;
    memcpy(t.shape, tv->u.t->shape, sizeof(t.shape));
    int64_t numel;
    if (wk_tensor_size(t.dtype, t.ndim, t.shape, &numel, &t.nbytes) != WK_OK)
        return wk_diag_set(w->d, WK_EINVAL, "tensor '%s': negative or overflowing size", name);
    if (numel > 0) {
        int64_t expect = 1;
        for (int i = t.ndim - 1; i >= 0; i--) {
            if (t.shape[i] == 1)
                continue;
            if (tv->u.t->stride[i] != expect)
                return wk_diag_set(w->d, WK_EINVAL, "tensor '%s': not contiguous (dim %d has "
                                   "stride %lld, row-major needs %lld); save it with "
                                   ".contiguous()", name, i, (long long)tv->u.t->stride[i],
                                   (long long)expect);
            expect *= t.shape[i];
        }
    }
    int64_t off = tv->u.t->offset, snumel = sv->u.st.numel;
    if (off < 0 || off > snumel || numel > snumel - off)
        return wk_diag_set(w->d, WK_EINVAL, "tensor '%s': elements [%lld, +%lld) outside storage "
                           "'%s' of %lld elements", name, (long long)off, (long long)numel,
                           sv->u.st.key->u.str.s, (long long)snumel);
    if ((uint64_t)snumel > SIZE_MAX / type->esize)
        return wk_diag_set(w->d, WK_EINVAL, "tensor '%s': storage '%s' size overflows", name,
                           sv->u.st.key->u.str.s);
    const void *data;
    size_t len;
    wk_err err = w->resolve(w->ctx, sv->u.st.key->u.str.s, &data, &len, w->d);
    if (err != WK_OK) {
        wk_diag_prefix(w->d, "tensor '%s'", name);
        return err == WK_ENOENT ? WK_EINVAL : err;
    }
    if (len != (size_t)snumel * type->esize)
        return wk_diag_set(w->d, WK_EINVAL, "tensor '%s': storage '%s' holds %zu bytes, its "
                           "persistent id says %lld elements of %zu bytes", name,
                           sv->u.st.key->u.str.s, len, (long long)snumel, type->esize);
    size_t skip = (size_t)off * type->esize;
    t.data = skip ? (const uint8_t *)data + skip : data;
    if (wk_tensor_list_push(w->out, &t, name, key->u.str.len) != WK_OK)
        return wk_diag_set(w->d, WK_ENOMEM, "out of memory");
    return WK_OK;
}

static int
pth_dict_has_tensor(const pth_val *dict)
{
    for (size_t i = 1; i < dict->u.seq.n; i += 2)
        if (dict->u.seq.items[i]->kind == PTH_TENSOR)
            return 1;
    return 0;
}

/* Collects the tensors of dict, or descends into its state_dict/model/module dict. */
static wk_err
pth_collect(pth_walk *w, const pth_val *dict, int depth)
{
    size_t n = dict->u.seq.n;
    pth_val **it = dict->u.seq.items;
    if (!pth_dict_has_tensor(dict)) {
        static const char *const nest[] = {"state_dict", "model", "module"};
        if (depth >= WK_PTH_MAX_NEST)
            return WK_OK;
        for (size_t k = 0; k < sizeof(nest) / sizeof(nest[0]); k++) {
            for (size_t i = 0; i + 1 < n; i += 2) {
                if (it[i]->kind == PTH_STR && strcmp(it[i]->u.str.s, nest[k]) == 0 &&
                    it[i]->u.str.len == strlen(nest[k]) && it[i + 1]->kind == PTH_DICT)
                    return pth_collect(w, it[i + 1], depth + 1);
            }
        }
        return WK_OK;
    }
    for (size_t i = 0; i + 1 < n; i += 2) {
        if (it[i + 1]->kind == PTH_TENSOR) {
            wk_err err = pth_emit(w, it[i], it[i + 1]);
            if (err != WK_OK)
                return err;
        } else if (it[i + 1]->kind == PTH_DICT && pth_dict_has_tensor(it[i + 1])) {
            return wk_diag_set(w->d, WK_ENOTSUP, "entry '%.200s' is a nested dict of tensors "
                               "beside top-level tensors", it[i]->kind == PTH_STR ?
                               it[i]->u.str.s : "?");
        }
    }
    return WK_OK;
}

wk_err
wk_pth_pickle_load(const void *pkl, size_t len, wk_pth_storage_fn resolve, void *ctx,
                   wk_tensor_list *out, wk_diag *d)
{
    if (len > WK_PTH_MAX_PICKLE)
        return wk_diag_set(d, WK_ETOOBIG, "pickle of %zu bytes, over the limit of %zu", len,
                           WK_PTH_MAX_PICKLE);
    pth_vm *vm = calloc(1, sizeof(*vm));
    if (vm == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    vm->start = vm->p = pkl;
    vm->end = vm->start + len;
    vm->d = d;
    wk_tensor_list tmp;
    wk_tensor_list_init(&tmp);
    pth_val *top = NULL;
    wk_err err = len ? pth_run(vm, &top) : wk_diag_set(d, WK_EINVAL, "empty pickle");
    if (err == WK_OK && top->kind != PTH_DICT)
        err = wk_diag_set(d, WK_EINVAL, "pickle top is a %s, not a dict of tensors",
                          pth_kind_names[top->kind]);
    if (err == WK_OK) {
        pth_walk w = {resolve, ctx, &tmp, d};
        err = pth_collect(&w, top, 0);
    }
    if (err == WK_OK && wk_tensor_list_take(out, &tmp) != WK_OK)
        err = wk_diag_set(d, WK_ENOMEM, "out of memory");
    wk_tensor_list_fini(&tmp);
    for (size_t i = 0; i < vm->n_objs; i++)
        pth_val_fini(&vm->chunks[i / PTH_CHUNK][i % PTH_CHUNK]);
    for (size_t c = 0; c * PTH_CHUNK < vm->n_objs; c++)
        free(vm->chunks[c]);
    free(vm->chunks);
    free(vm->stack);
    free(vm->memo);
    free(vm);
    return err;
}
