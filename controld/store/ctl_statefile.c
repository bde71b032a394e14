/*
 * ctl_statefile: encodes and decodes the portable state file (format
 * version 1, docs/STATE_FORMAT.md). Pure functions over memory.
 *
 * The decoder is the boundary for hostile input: it checks every length
 * against the buffer with overflow-safe arithmetic before touching the bytes
 * it describes, refuses anything non-canonical (so that a file that reads
 * back also writes back byte for byte), and gives each refusal its own
 * message. It must never read outside the buffer, never trust a derived
 * size from the file, and never log.
 */
#include "ctl_statefile.h"
#include "wk_bytes.h"
#include "wk_hex.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Offsets of the fixed header fields (docs/STATE_FORMAT.md). */
enum {
    SF_OFF_MAGIC = 0,        /* 8 bytes "WKVMSTAT" */
    SF_OFF_VERSION = 8,      /* u32 format version */
    SF_OFF_FLAGS = 12,       /* u32 reserved flags, 0 */
    SF_OFF_FILE_BYTES = 16,  /* u64 total file length */
    SF_OFF_DATA_OFFSET = 24, /* u64 offset of the state bytes */
    SF_OFF_STATE_BYTES = 32, /* u64 bytes of state */
    SF_OFF_TOKEN_COUNT = 40, /* u64 token ids */
    SF_OFF_TENSOR_COUNT = 48, /* u32 tensor table entries */
    SF_OFF_RESERVED = 52,    /* u32 reserved, 0 */
    SF_OFF_FAMILY = 56,      /* 16 bytes NUL-padded family */
    SF_OFF_FINGERPRINT = 72, /* 32 bytes model fingerprint */
    SF_OFF_TOKENIZER = 104,  /* 32 bytes tokenizer digest */
    SF_OFF_TOKEN_DIGEST = 136, /* 32 bytes token digest */
};

#define SF_FAMILY_FIELD 16u /* bytes of the family field */

/* Rounds v up to a multiple of CTL_STATEFILE_ALIGN; v is far below overflow. */
static uint64_t
sf_align(uint64_t v)
{
    return (v + CTL_STATEFILE_ALIGN - 1) / CTL_STATEFILE_ALIGN * CTL_STATEFILE_ALIGN;
}

static bool
sf_family_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static bool
sf_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-' || c == '.';
}

/* Parses exactly 64 lowercase hex digits into 32 bytes. */
static wk_err
sf_hex_decode(const char *hex, const char *what, uint8_t out[WK_SHA256_LEN], wk_diag *d)
{
    size_t n = strnlen(hex, WK_SHA256_HEX_LEN);
    if (n != 2 * WK_SHA256_LEN)
        return wk_diag_set(d, WK_EINVAL, "%s must be 64 lowercase hex digits (got %zu chars)", what,
                           n);
    if (!wk_hex_decode_lower(hex, WK_SHA256_LEN, out))
        return wk_diag_set(d, WK_EINVAL, "%s must be 64 lowercase hex digits", what);
    return WK_OK;
}

/* Checks a family string: 1..FAMILY_MAX chars of [a-z0-9_-]. */
static wk_err
sf_family_check(const char *fam, size_t n, wk_diag *d)
{
    if (n == 0)
        return wk_diag_set(d, WK_EINVAL, "family is empty");
    if (n > CTL_STATEFILE_FAMILY_MAX)
        return wk_diag_set(d, WK_EINVAL, "family is longer than %u bytes",
                           CTL_STATEFILE_FAMILY_MAX);
    for (size_t i = 0; i < n; i++)
        if (!sf_family_char(fam[i]))
            return wk_diag_set(d, WK_EINVAL, "family has a byte outside [a-z0-9_-] at %zu", i);
    return WK_OK;
}

/* Checks a tensor name: 1..NAME_MAX chars of [A-Za-z0-9._-]. */
static wk_err
sf_name_check(const char *name, size_t n, uint32_t idx, wk_diag *d)
{
    if (n == 0)
        return wk_diag_set(d, WK_EINVAL, "tensor %u: empty name", idx);
    if (n > CTL_STATEFILE_NAME_MAX)
        return wk_diag_set(d, WK_EINVAL, "tensor %u: name longer than %u bytes", idx,
                           CTL_STATEFILE_NAME_MAX);
    for (size_t i = 0; i < n; i++)
        if (!sf_name_char(name[i]))
            return wk_diag_set(d, WK_EINVAL,
                               "tensor %u: name has a byte outside [A-Za-z0-9._-] at %zu", idx, i);
    return WK_OK;
}

/* Element bytes of a dtype, 0 when unknown. */
static uint64_t
sf_dtype_size(uint32_t dt)
{
    return dt == CTL_STATEFILE_DTYPE_F32 ? 4 : 0;
}

const char *
ctl_statefile_dtype_name(ctl_statefile_dtype dt)
{
    return dt == CTL_STATEFILE_DTYPE_F32 ? "F32" : "?";
}

/*
 * Checks dtype and shape of tensor idx against the running offset and the
 * state size and returns its byte count in *nbytes. Shared by the writer and
 * the reader so that both refuse the same tables.
 */
static wk_err
sf_tensor_check(uint32_t idx, uint32_t dtype, uint32_t ndim, const uint64_t *shape,
                uint64_t offset, uint64_t expect_offset, uint64_t state_bytes, uint64_t *nbytes,
                wk_diag *d)
{
    uint64_t esz = sf_dtype_size(dtype);
    if (esz == 0)
        return wk_diag_set(d, WK_EINVAL, "tensor %u: unknown dtype code %u", idx, dtype);
    if (ndim == 0 || ndim > CTL_STATEFILE_MAX_DIMS)
        return wk_diag_set(d, WK_EINVAL, "tensor %u: %u dimensions (1..%u allowed)", idx, ndim,
                           CTL_STATEFILE_MAX_DIMS);
    uint64_t n = esz;
    for (uint32_t i = 0; i < ndim; i++) {
        if (shape[i] == 0)
            return wk_diag_set(d, WK_EINVAL, "tensor %u: dimension %u is zero", idx, i);
        if (n > CTL_STATEFILE_MAX_STATE_BYTES / shape[i])
            return wk_diag_set(d, WK_EINVAL, "tensor %u: shape is larger than the state limit",
                               idx);
        n *= shape[i];
    }
    if (offset != expect_offset)
        return wk_diag_set(d, WK_EINVAL,
                           "tensor %u: offset %llu, expected %llu (tensors must tile the state "
                           "in order)",
                           idx, (unsigned long long)offset, (unsigned long long)expect_offset);
    if (n > state_bytes - offset)
        return wk_diag_set(d, WK_EINVAL,
                           "tensor %u: bytes [%llu, +%llu) run past the %llu state bytes", idx,
                           (unsigned long long)offset, (unsigned long long)n,
                           (unsigned long long)state_bytes);
    *nbytes = n;
    return WK_OK;
}

static int
sf_name_cmp(const void *a, const void *b)
{
    const ctl_statefile_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Refuses duplicate names in a table of n (>= 1) tensors with valid names. */
static wk_err
sf_unique_names(const ctl_statefile_tensor *t, uint32_t n, wk_diag *d)
{
    const ctl_statefile_tensor **v = malloc(n * sizeof(*v));
    if (v == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory checking tensor names");
    for (uint32_t i = 0; i < n; i++)
        v[i] = &t[i];
    qsort(v, n, sizeof(*v), sf_name_cmp);
    for (uint32_t i = 1; i < n; i++) {
        if (strcmp(v[i - 1]->name, v[i]->name) == 0) {
            wk_err e = wk_diag_set(d, WK_EINVAL, "tensor name '%s' appears twice", v[i]->name);
            free(v);
            return e;
        }
    }
    free(v);
    return WK_OK;
}

/* Bytes of one encoded tensor table entry. */
static uint64_t
sf_entry_bytes(size_t name_len, uint32_t ndim)
{
    return 1 + name_len + 1 + 1 + 8 * (uint64_t)ndim + 8;
}

wk_err
ctl_statefile_write(const ctl_statefile_hdr *h, const void *state, size_t state_len, void **out,
                    size_t *out_len, wk_diag *d)
{
    uint8_t fp[WK_SHA256_LEN], tz[WK_SHA256_LEN], td[WK_SHA256_LEN];
    char td_hex[WK_SHA256_HEX_LEN];
    wk_err e;

    if (h == NULL || out == NULL || out_len == NULL || (state == NULL && state_len > 0))
        return wk_diag_set(d, WK_EINVAL, "statefile write: NULL argument");
    size_t fam_len = strnlen(h->family, sizeof(h->family));
    if ((e = sf_family_check(h->family, fam_len, d)) != WK_OK)
        return e;
    if ((e = sf_hex_decode(h->fingerprint, "model fingerprint", fp, d)) != WK_OK ||
        (e = sf_hex_decode(h->tokenizer_digest, "tokenizer digest", tz, d)) != WK_OK)
        return e;
    if (h->n_tokens > CTL_STATEFILE_MAX_TOKENS)
        return wk_diag_set(d, WK_ETOOBIG, "%llu tokens is over the limit of %llu",
                           (unsigned long long)h->n_tokens,
                           (unsigned long long)CTL_STATEFILE_MAX_TOKENS);
    if (h->n_tokens > 0 && h->tokens == NULL)
        return wk_diag_set(d, WK_EINVAL, "statefile write: %llu tokens but no token array",
                           (unsigned long long)h->n_tokens);
    for (uint64_t i = 0; i < h->n_tokens; i++)
        if (h->tokens[i] < 0)
            return wk_diag_set(d, WK_EINVAL, "token %llu is negative (%d)", (unsigned long long)i,
                               (int)h->tokens[i]);
    if (wk_sha256_token_ids_hex(h->tokens, (size_t)h->n_tokens, td_hex) != WK_OK)
        return wk_diag_set(d, WK_ENOMEM, "out of memory hashing token ids");
    if (h->token_digest[0] != '\0' && strcmp(h->token_digest, td_hex) != 0)
        return wk_diag_set(d, WK_EINVAL, "token digest %.64s does not match the tokens (%s)",
                           h->token_digest, td_hex);
    if ((e = sf_hex_decode(td_hex, "token digest", td, d)) != WK_OK)
        return e;
    if (state_len > CTL_STATEFILE_MAX_STATE_BYTES)
        return wk_diag_set(d, WK_ETOOBIG, "%zu state bytes is over the limit of %llu", state_len,
                           (unsigned long long)CTL_STATEFILE_MAX_STATE_BYTES);
    if (h->state_bytes != 0 && h->state_bytes != state_len)
        return wk_diag_set(d, WK_EINVAL, "header says %llu state bytes, %zu given",
                           (unsigned long long)h->state_bytes, state_len);
    if (h->n_tensors == 0 || h->tensors == NULL)
        return wk_diag_set(d, WK_EINVAL, "the tensor table is empty");
    if (h->n_tensors > CTL_STATEFILE_MAX_TENSORS)
        return wk_diag_set(d, WK_ETOOBIG, "%u tensors is over the limit of %u", h->n_tensors,
                           CTL_STATEFILE_MAX_TENSORS);

    uint64_t table = 0, running = 0;
    for (uint32_t i = 0; i < h->n_tensors; i++) {
        const ctl_statefile_tensor *t = &h->tensors[i];
        size_t nl = strnlen(t->name, sizeof(t->name));
        uint64_t nb;
        if ((e = sf_name_check(t->name, nl, i, d)) != WK_OK)
            return e;
        if ((e = sf_tensor_check(i, (uint32_t)t->dtype, t->ndim, t->shape, t->offset, running,
                                 state_len, &nb, d)) != WK_OK)
            return e;
        running += nb;
        table += sf_entry_bytes(nl, t->ndim);
    }
    if (running != state_len)
        return wk_diag_set(d, WK_EINVAL, "the tensors cover %llu of %zu state bytes",
                           (unsigned long long)running, state_len);
    if ((e = sf_unique_names(h->tensors, h->n_tensors, d)) != WK_OK)
        return e;

    uint64_t tok_off = CTL_STATEFILE_FIXED_BYTES;
    uint64_t tab_off = tok_off + 4 * h->n_tokens;
    uint64_t data_off = sf_align(tab_off + table);
    uint64_t total = data_off + state_len + CTL_STATEFILE_CHECKSUM_BYTES;
    if (total > SIZE_MAX)
        return wk_diag_set(d, WK_ETOOBIG, "state file of %llu bytes does not fit in memory",
                           (unsigned long long)total);
    uint8_t *b = calloc(1, (size_t)total);
    if (b == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory for a %llu-byte state file",
                           (unsigned long long)total);

    memcpy(b + SF_OFF_MAGIC, CTL_STATEFILE_MAGIC, 8);
    wk_le32_put(b + SF_OFF_VERSION, CTL_STATEFILE_VERSION);
    wk_le32_put(b + SF_OFF_FLAGS, 0);
    wk_le64_put(b + SF_OFF_FILE_BYTES, total);
    wk_le64_put(b + SF_OFF_DATA_OFFSET, data_off);
    wk_le64_put(b + SF_OFF_STATE_BYTES, state_len);
    wk_le64_put(b + SF_OFF_TOKEN_COUNT, h->n_tokens);
    wk_le32_put(b + SF_OFF_TENSOR_COUNT, h->n_tensors);
    wk_le32_put(b + SF_OFF_RESERVED, 0);
    memcpy(b + SF_OFF_FAMILY, h->family, fam_len);
    memcpy(b + SF_OFF_FINGERPRINT, fp, WK_SHA256_LEN);
    memcpy(b + SF_OFF_TOKENIZER, tz, WK_SHA256_LEN);
    memcpy(b + SF_OFF_TOKEN_DIGEST, td, WK_SHA256_LEN);
    for (uint64_t i = 0; i < h->n_tokens; i++)
        wk_le32_put(b + tok_off + 4 * i, (uint32_t)h->tokens[i]);
    uint8_t *p = b + tab_off;
    for (uint32_t i = 0; i < h->n_tensors; i++) {
        const ctl_statefile_tensor *t = &h->tensors[i];
        size_t nl = strlen(t->name);
        *p++ = (uint8_t)nl;
        memcpy(p, t->name, nl);
        p += nl;
        *p++ = (uint8_t)t->dtype;
        *p++ = (uint8_t)t->ndim;
        for (uint32_t k = 0; k < t->ndim; k++, p += 8)
            wk_le64_put(p, t->shape[k]);
        wk_le64_put(p, t->offset);
        p += 8;
    }
    if (state_len > 0)
        memcpy(b + data_off, state, state_len);
    wk_sha256_buf(b, (size_t)(total - CTL_STATEFILE_CHECKSUM_BYTES),
                  b + total - CTL_STATEFILE_CHECKSUM_BYTES);
    *out = b;
    *out_len = (size_t)total;
    return WK_OK;
}

/* The fixed-header fields the reader checks before the checksum. */
typedef struct sf_fixed {
    uint64_t file_bytes;   /* total length */
    uint64_t data_off;     /* offset of the state bytes */
    uint64_t state_bytes;  /* bytes of state */
    uint64_t n_tokens;     /* token ids */
    uint32_t n_tensors;    /* tensor table entries */
} sf_fixed;

/* Checks magic, version, reserved fields and the lengths against len. */
static wk_err
sf_read_fixed(const uint8_t *b, size_t len, sf_fixed *f, wk_diag *d)
{
    const uint64_t min = CTL_STATEFILE_FIXED_BYTES + CTL_STATEFILE_CHECKSUM_BYTES;
    if (len >= 8 && memcmp(b, CTL_STATEFILE_MAGIC, 8) != 0)
        return wk_diag_set(d, WK_EINVAL, "bad magic: not a wkvm state file");
    if (len < min)
        return wk_diag_set(d, WK_EINVAL, "truncated: %zu bytes, a state file has at least %llu",
                           len, (unsigned long long)min);
    uint32_t ver = wk_le32_get(b + SF_OFF_VERSION);
    if (ver != CTL_STATEFILE_VERSION)
        return wk_diag_set(d, WK_EINVAL,
                           "unsupported state file format version %u (this build reads %u)", ver,
                           CTL_STATEFILE_VERSION);
    uint32_t flags = wk_le32_get(b + SF_OFF_FLAGS);
    if (flags != 0)
        return wk_diag_set(d, WK_EINVAL, "reserved flags 0x%08x are set", flags);
    if (wk_le32_get(b + SF_OFF_RESERVED) != 0)
        return wk_diag_set(d, WK_EINVAL, "reserved header field is not zero");
    f->file_bytes = wk_le64_get(b + SF_OFF_FILE_BYTES);
    if (f->file_bytes > len)
        return wk_diag_set(d, WK_EINVAL, "truncated: header says %llu bytes, %zu present",
                           (unsigned long long)f->file_bytes, len);
    if (f->file_bytes < len)
        return wk_diag_set(d, WK_EINVAL, "%llu trailing bytes after the %llu-byte state file",
                           (unsigned long long)(len - f->file_bytes),
                           (unsigned long long)f->file_bytes);
    f->n_tokens = wk_le64_get(b + SF_OFF_TOKEN_COUNT);
    if (f->n_tokens > CTL_STATEFILE_MAX_TOKENS)
        return wk_diag_set(d, WK_EINVAL, "token count %llu is over the limit of %llu",
                           (unsigned long long)f->n_tokens,
                           (unsigned long long)CTL_STATEFILE_MAX_TOKENS);
    f->n_tensors = wk_le32_get(b + SF_OFF_TENSOR_COUNT);
    if (f->n_tensors == 0 || f->n_tensors > CTL_STATEFILE_MAX_TENSORS)
        return wk_diag_set(d, WK_EINVAL, "tensor count %u is outside 1..%u", f->n_tensors,
                           CTL_STATEFILE_MAX_TENSORS);
    f->state_bytes = wk_le64_get(b + SF_OFF_STATE_BYTES);
    if (f->state_bytes > CTL_STATEFILE_MAX_STATE_BYTES)
        return wk_diag_set(d, WK_EINVAL, "state byte count %llu is over the limit of %llu",
                           (unsigned long long)f->state_bytes,
                           (unsigned long long)CTL_STATEFILE_MAX_STATE_BYTES);
    f->data_off = wk_le64_get(b + SF_OFF_DATA_OFFSET);
    if (f->data_off % CTL_STATEFILE_ALIGN != 0)
        return wk_diag_set(d, WK_EINVAL, "data offset %llu is not a multiple of %u",
                           (unsigned long long)f->data_off, CTL_STATEFILE_ALIGN);
    uint64_t tab_min = CTL_STATEFILE_FIXED_BYTES + 4 * f->n_tokens;
    if (f->data_off < tab_min)
        return wk_diag_set(d, WK_EINVAL, "data offset %llu is inside the token ids (end %llu)",
                           (unsigned long long)f->data_off, (unsigned long long)tab_min);
    if (f->data_off > f->file_bytes ||
        f->file_bytes - f->data_off < CTL_STATEFILE_CHECKSUM_BYTES ||
        f->file_bytes - f->data_off - CTL_STATEFILE_CHECKSUM_BYTES != f->state_bytes)
        return wk_diag_set(d, WK_EINVAL,
                           "lengths disagree: data offset %llu + %llu state bytes + %u checksum "
                           "bytes != file length %llu",
                           (unsigned long long)f->data_off, (unsigned long long)f->state_bytes,
                           CTL_STATEFILE_CHECKSUM_BYTES, (unsigned long long)f->file_bytes);
    return WK_OK;
}

/* Bounded cursor over [p, end) of the tensor table. */
typedef struct sf_cur {
    const uint8_t *p;   /* next byte */
    const uint8_t *end; /* one past the table's last possible byte (the data offset) */
} sf_cur;

static bool
sf_cur_take(sf_cur *c, size_t n, const uint8_t **out)
{
    if ((size_t)(c->end - c->p) < n)
        return false;
    *out = c->p;
    c->p += n;
    return true;
}

/* Decodes tensor idx from the table into *t. */
static wk_err
sf_read_tensor(sf_cur *c, uint32_t idx, uint64_t running, uint64_t state_bytes,
               ctl_statefile_tensor *t, wk_diag *d)
{
    const uint8_t *q;
    if (!sf_cur_take(c, 1, &q))
        return wk_diag_set(d, WK_EINVAL, "tensor %u: table runs into the state bytes", idx);
    size_t nl = q[0];
    if (!sf_cur_take(c, nl, &q))
        return wk_diag_set(d, WK_EINVAL, "tensor %u: name runs into the state bytes", idx);
    wk_err e = sf_name_check((const char *)q, nl, idx, d);
    if (e != WK_OK)
        return e;
    memcpy(t->name, q, nl);
    t->name[nl] = '\0';
    if (!sf_cur_take(c, 2, &q))
        return wk_diag_set(d, WK_EINVAL, "tensor %u: dtype runs into the state bytes", idx);
    uint32_t dtype = q[0], ndim = q[1];
    if (ndim == 0 || ndim > CTL_STATEFILE_MAX_DIMS)
        return wk_diag_set(d, WK_EINVAL, "tensor %u: %u dimensions (1..%u allowed)", idx, ndim,
                           CTL_STATEFILE_MAX_DIMS);
    if (!sf_cur_take(c, 8 * (size_t)ndim + 8, &q))
        return wk_diag_set(d, WK_EINVAL, "tensor %u: shape runs into the state bytes", idx);
    uint64_t shape[CTL_STATEFILE_MAX_DIMS] = {0};
    for (uint32_t k = 0; k < ndim; k++)
        shape[k] = wk_le64_get(q + 8 * k);
    uint64_t off = wk_le64_get(q + 8 * ndim), nb;
    if ((e = sf_tensor_check(idx, dtype, ndim, shape, off, running, state_bytes, &nb, d)) != WK_OK)
        return e;
    t->dtype = (ctl_statefile_dtype)dtype;
    t->ndim = ndim;
    memcpy(t->shape, shape, sizeof(t->shape));
    t->offset = off;
    t->nbytes = nb;
    return WK_OK;
}

wk_err
ctl_statefile_read(const void *buf, size_t len, ctl_statefile_hdr *h_out, const void **state_out,
                   size_t *state_len, wk_diag *d)
{
    const uint8_t *b = buf;
    sf_fixed f = {0, 0, 0, 0, 0};
    wk_err e;
    ctl_statefile_hdr h;
    uint8_t sum[WK_SHA256_LEN];

    if ((b == NULL && len > 0) || h_out == NULL || state_out == NULL || state_len == NULL)
        return wk_diag_set(d, WK_EINVAL, "statefile read: NULL argument");
    if ((e = sf_read_fixed(b, len, &f, d)) != WK_OK)
        return e;
    wk_sha256_buf(b, len - CTL_STATEFILE_CHECKSUM_BYTES, sum);
    if (memcmp(sum, b + len - CTL_STATEFILE_CHECKSUM_BYTES, WK_SHA256_LEN) != 0)
        return wk_diag_set(d, WK_ECORRUPT, "checksum mismatch: the state file is damaged");

    memset(&h, 0, sizeof(h));
    h.version = CTL_STATEFILE_VERSION;
    const char *fam = (const char *)b + SF_OFF_FAMILY;
    size_t fl = strnlen(fam, SF_FAMILY_FIELD);
    if (fl == SF_FAMILY_FIELD)
        return wk_diag_set(d, WK_EINVAL, "family field is not NUL-terminated");
    if ((e = sf_family_check(fam, fl, d)) != WK_OK)
        return e;
    for (size_t i = fl; i < SF_FAMILY_FIELD; i++)
        if (fam[i] != '\0')
            return wk_diag_set(d, WK_EINVAL, "family field has bytes after its terminator");
    memcpy(h.family, fam, fl);
    wk_sha256_to_hex(b + SF_OFF_FINGERPRINT, h.fingerprint);
    wk_sha256_to_hex(b + SF_OFF_TOKENIZER, h.tokenizer_digest);
    wk_sha256_to_hex(b + SF_OFF_TOKEN_DIGEST, h.token_digest);
    h.n_tokens = f.n_tokens;
    h.state_bytes = f.state_bytes;
    h.n_tensors = f.n_tensors;

    if (f.n_tokens > 0) {
        h.tokens = malloc((size_t)f.n_tokens * sizeof(int32_t));
        if (h.tokens == NULL)
            return wk_diag_set(d, WK_ENOMEM, "out of memory for %llu token ids",
                               (unsigned long long)f.n_tokens);
        for (uint64_t i = 0; i < f.n_tokens; i++) {
            uint32_t v = wk_le32_get(b + CTL_STATEFILE_FIXED_BYTES + 4 * i);
            if (v > INT32_MAX) {
                e = wk_diag_set(d, WK_EINVAL, "token %llu is negative (%d)",
                                (unsigned long long)i, (int)(int32_t)v);
                goto fail;
            }
            h.tokens[i] = (int32_t)v;
        }
    }
    char td[WK_SHA256_HEX_LEN];
    if (wk_sha256_token_ids_hex(h.tokens, (size_t)h.n_tokens, td) != WK_OK) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory hashing token ids");
        goto fail;
    }
    if (strcmp(td, h.token_digest) != 0) {
        e = wk_diag_set(d, WK_EINVAL, "token digest mismatch: header %s, token ids hash to %s",
                        h.token_digest, td);
        goto fail;
    }

    h.tensors = calloc(f.n_tensors, sizeof(*h.tensors));
    if (h.tensors == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory for %u tensors", f.n_tensors);
        goto fail;
    }
    sf_cur c = {b + CTL_STATEFILE_FIXED_BYTES + 4 * f.n_tokens, b + f.data_off};
    uint64_t running = 0;
    for (uint32_t i = 0; i < f.n_tensors; i++) {
        if ((e = sf_read_tensor(&c, i, running, f.state_bytes, &h.tensors[i], d)) != WK_OK)
            goto fail;
        running += h.tensors[i].nbytes;
    }
    if (running != f.state_bytes) {
        e = wk_diag_set(d, WK_EINVAL, "the tensors cover %llu of %llu state bytes",
                        (unsigned long long)running, (unsigned long long)f.state_bytes);
        goto fail;
    }
    uint64_t table_end = (uint64_t)(c.p - b);
    if (sf_align(table_end) != f.data_off) {
        e = wk_diag_set(d, WK_EINVAL,
                        "data offset %llu is not the first %u-byte boundary after the tensor "
                        "table (%llu)",
                        (unsigned long long)f.data_off, CTL_STATEFILE_ALIGN,
                        (unsigned long long)sf_align(table_end));
        goto fail;
    }
    for (const uint8_t *q = c.p; q < b + f.data_off; q++) {
        if (*q != 0) {
            e = wk_diag_set(d, WK_EINVAL, "padding byte at offset %llu is not zero",
                            (unsigned long long)(q - b));
            goto fail;
        }
    }
    if ((e = sf_unique_names(h.tensors, h.n_tensors, d)) != WK_OK)
        goto fail;

    *h_out = h;
    *state_out = b + f.data_off;
    *state_len = (size_t)f.state_bytes;
    return WK_OK;
fail:
    ctl_statefile_hdr_fini(&h);
    return e;
}

void
ctl_statefile_hdr_fini(ctl_statefile_hdr *h)
{
    if (h == NULL)
        return;
    free(h->tokens);
    free(h->tensors);
    h->tokens = NULL;
    h->tensors = NULL;
    h->n_tokens = 0;
    h->n_tensors = 0;
}

wk_err
ctl_statefile_layout_rwkv7(uint32_t n_layer, uint32_t C, uint32_t H, uint32_t N,
                           ctl_statefile_tensor **out, uint32_t *n_out, uint64_t *state_bytes,
                           wk_diag *d)
{
    if (out == NULL || n_out == NULL || state_bytes == NULL)
        return wk_diag_set(d, WK_EINVAL, "rwkv7 layout: NULL argument");
    if (n_layer == 0 || C == 0 || H == 0 || N == 0)
        return wk_diag_set(d, WK_EINVAL,
                           "rwkv7 layout: layers %u, C %u, H %u, N %u must all be >= 1", n_layer,
                           C, H, N);
    if ((uint64_t)n_layer * 3 > CTL_STATEFILE_MAX_TENSORS)
        return wk_diag_set(d, WK_ETOOBIG, "rwkv7 layout: %u layers need more than %u tensors",
                           n_layer, CTL_STATEFILE_MAX_TENSORS);
    /* every factor is < 2^32, so H*N*N < 2^96 needs care; bound step by step */
    uint64_t hn = (uint64_t)H * N;
    if (hn > CTL_STATEFILE_MAX_STATE_BYTES / N)
        return wk_diag_set(d, WK_ETOOBIG, "rwkv7 layout: H*N*N is over the state limit");
    uint64_t per_layer = (2 * (uint64_t)C + hn * N) * 4;
    if (per_layer > CTL_STATEFILE_MAX_STATE_BYTES / n_layer)
        return wk_diag_set(d, WK_ETOOBIG, "rwkv7 layout: the state is over the %llu-byte limit",
                           (unsigned long long)CTL_STATEFILE_MAX_STATE_BYTES);
    ctl_statefile_tensor *t = calloc((size_t)n_layer * 3, sizeof(*t));
    if (t == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory for %u tensors", n_layer * 3);
    uint64_t off = 0;
    for (uint32_t l = 0; l < n_layer; l++) {
        ctl_statefile_tensor *a = &t[3 * l], *f = a + 1, *w = a + 2;
        snprintf(a->name, sizeof(a->name), "layers.%u.att_shift", l);
        snprintf(f->name, sizeof(f->name), "layers.%u.ffn_shift", l);
        snprintf(w->name, sizeof(w->name), "layers.%u.wkv", l);
        a->dtype = f->dtype = w->dtype = CTL_STATEFILE_DTYPE_F32;
        a->ndim = f->ndim = 1;
        a->shape[0] = f->shape[0] = C;
        a->nbytes = f->nbytes = 4 * (uint64_t)C;
        w->ndim = 3;
        w->shape[0] = H;
        w->shape[1] = N;
        w->shape[2] = N;
        w->nbytes = hn * N * 4;
        a->offset = off;
        f->offset = off + a->nbytes;
        w->offset = f->offset + f->nbytes;
        off = w->offset + w->nbytes;
    }
    *out = t;
    *n_out = n_layer * 3;
    *state_bytes = off;
    return WK_OK;
}
