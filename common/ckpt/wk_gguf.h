/*
 * wk_gguf: a reader for GGUF files (llama.cpp's container, versions 2 and 3):
 * the metadata key/values and the tensors, exposed as wk_tensor views.
 *
 * A file is: "GGUF", u32 version, u64 tensor count, u64 key/value count, the
 * key/values, the tensor infos (name, dims fastest-first, GGML type, offset),
 * padding to general.alignment (default 32), then the data section that the
 * offsets index. Everything in it is hostile: every count, length and offset
 * is checked against the buffer and the limits below before it is used, and
 * the diagnostic names the tensor or key at fault. Tensor shapes are reported
 * row-major (torch order: GGUF dims reversed). F32, F16, BF16 and Q8_0
 * tensors are exposed (Q8_0: blocks along the last row-major dim, which must
 * be a multiple of 32); any other GGML type (Q4_K, ...) is refused with
 * WK_ENOTSUP naming the tensor and type. It never copies tensor bytes and never logs.
 */
#ifndef WK_GGUF_H
#define WK_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"
#include "wk_tensor.h"

#define WK_GGUF_MAX_TENSORS ((uint64_t)1 << 20) /* max tensor infos in one file */
#define WK_GGUF_MAX_KV ((uint64_t)1 << 16)      /* max metadata key/values */
#define WK_GGUF_MAX_KEY 1024u                   /* max bytes of a key */
#define WK_GGUF_MAX_NAME 1024u                  /* max bytes of a tensor name */
#define WK_GGUF_MAX_STRING ((uint64_t)1 << 24)  /* max bytes of one string value */
#define WK_GGUF_MAX_ALIGN 65536u                /* max general.alignment */
#define WK_GGUF_DEFAULT_ALIGN 32u               /* general.alignment when absent */

/* GGUF metadata value types, as the file numbers them. */
typedef enum wk_gguf_type {
    WK_GGUF_TYPE_UINT8 = 0,
    WK_GGUF_TYPE_INT8 = 1,
    WK_GGUF_TYPE_UINT16 = 2,
    WK_GGUF_TYPE_INT16 = 3,
    WK_GGUF_TYPE_UINT32 = 4,
    WK_GGUF_TYPE_INT32 = 5,
    WK_GGUF_TYPE_FLOAT32 = 6,
    WK_GGUF_TYPE_BOOL = 7,
    WK_GGUF_TYPE_STRING = 8,
    WK_GGUF_TYPE_ARRAY = 9,
    WK_GGUF_TYPE_UINT64 = 10,
    WK_GGUF_TYPE_INT64 = 11,
    WK_GGUF_TYPE_FLOAT64 = 12,
} wk_gguf_type;

typedef struct wk_gguf wk_gguf;

/*
 * Parses the GGUF image [buf, buf + len) held in memory (a mapped file or a
 * fuzzer input). buf is borrowed: it must outlive *out, whose tensor data and
 * string values point into it. On success *out is freed with wk_gguf_free().
 * Returns WK_EINVAL (malformed: bad magic, truncated, bad offsets or
 * alignment, overlap, duplicate key or tensor name, a name holding a NUL),
 * WK_ENOTSUP (version other than 2 or 3, a tensor type other than
 * F32/F16/BF16, more than WK_TENSOR_MAX_DIMS dims, nested arrays), WK_ETOOBIG
 * (over a WK_GGUF_MAX_* limit), WK_ENOMEM. Thread-safe (no shared state).
 */
WK_MUST_CHECK wk_err wk_gguf_parse(const void *buf, size_t len, wk_gguf **out, wk_diag *d);

/*
 * Maps the file at path read-only and parses it as wk_gguf_parse() does; the
 * returned object owns the mapping. The diagnostic starts with path. Returns
 * the codes of wk_gguf_parse() and WK_ENOENT, WK_EPERM, WK_EIO.
 */
WK_MUST_CHECK wk_err wk_gguf_open(const char *path, wk_gguf **out, wk_diag *d);

/* Frees g (and unmaps its file when it was opened with wk_gguf_open()). NULL-safe. */
void wk_gguf_free(wk_gguf *g);

/* GGUF version (2 or 3). */
uint32_t wk_gguf_version(const wk_gguf *g);

/* Number of tensors, in file order. */
size_t wk_gguf_tensor_count(const wk_gguf *g);

/* The i-th tensor in file order, borrowed until wk_gguf_free(); NULL when out of range. */
const wk_tensor *wk_gguf_tensor_at(const wk_gguf *g, size_t i);

/* The tensor called name, borrowed until wk_gguf_free(); NULL when absent. */
const wk_tensor *wk_gguf_tensor_find(const wk_gguf *g, const char *name);

/* Number of metadata key/values. */
size_t wk_gguf_kv_count(const wk_gguf *g);

/* The i-th key (NUL-terminated, borrowed) and its type; NULL when out of range. */
const char *wk_gguf_kv_key(const wk_gguf *g, size_t i, wk_gguf_type *type);

/*
 * Reads an integer key of any integer type (or bool) that fits a uint64_t
 * (negative values do not). Returns WK_OK, WK_ENOENT (absent), WK_EINVAL
 * (wrong type or negative; the diag names the key).
 */
WK_MUST_CHECK wk_err wk_gguf_get_u64(const wk_gguf *g, const char *key, uint64_t *out,
                                     wk_diag *d);

/* Reads a FLOAT32 or FLOAT64 key. Returns WK_OK, WK_ENOENT, WK_EINVAL (wrong type). */
WK_MUST_CHECK wk_err wk_gguf_get_f64(const wk_gguf *g, const char *key, double *out, wk_diag *d);

/*
 * Reads a STRING key: *s points at *len bytes (not NUL-terminated, may hold
 * NULs), borrowed until wk_gguf_free(). Returns WK_OK, WK_ENOENT, WK_EINVAL.
 */
WK_MUST_CHECK wk_err wk_gguf_get_str(const wk_gguf *g, const char *key, const char **s,
                                     size_t *len, wk_diag *d);

/*
 * Describes an ARRAY key: element type and count. Returns WK_OK, WK_ENOENT,
 * WK_EINVAL (not an array).
 */
WK_MUST_CHECK wk_err wk_gguf_get_arr(const wk_gguf *g, const char *key, wk_gguf_type *elem,
                                     uint64_t *n, wk_diag *d);

/*
 * The i-th string of a STRING array key (O(1)): *s / *len as wk_gguf_get_str().
 * Returns WK_OK, WK_ENOENT, WK_EINVAL (not a string array, i out of range).
 */
WK_MUST_CHECK wk_err wk_gguf_arr_str(const wk_gguf *g, const char *key, uint64_t i,
                                     const char **s, size_t *len, wk_diag *d);

/*
 * The i-th element of an integer (or bool) ARRAY key, as an int64_t (O(1)).
 * Returns WK_OK, WK_ENOENT, WK_EINVAL (not an integer array, i out of
 * range, a UINT64 over INT64_MAX).
 */
WK_MUST_CHECK wk_err wk_gguf_arr_int(const wk_gguf *g, const char *key, uint64_t i,
                                     int64_t *out, wk_diag *d);

/* Name of a GGML tensor type number ("F32", "Q8_0", ...); "unknown" when not known. */
const char *wk_gguf_ggml_type_name(uint32_t type);

#endif /* WK_GGUF_H */
