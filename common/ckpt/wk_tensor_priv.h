/*
 * wk_tensor_priv: internals shared by the checkpoint readers (wk_tensor.c,
 * wk_safetensors.c, wk_pth.c), their unit tests and their fuzz harnesses.
 *
 * A wk_tensor_list is a growable array of wk_tensor whose names are owned by
 * the list (each one a separate heap string); the data pointers stay borrowed
 * from whatever mapping the parser was given. A wk_map is a read-only mmap of
 * a whole file. Nothing here is for use outside common/ and tests/.
 */
#ifndef WK_TENSOR_PRIV_H
#define WK_TENSOR_PRIV_H

#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"
#include "wk_tensor.h"

typedef struct wk_tensor_list {
    wk_tensor *v; /* tensors; v[i].name is owned by the list */
    size_t n;     /* number of tensors in v */
    size_t cap;   /* allocated slots in v */
} wk_tensor_list;

typedef struct wk_map {
    const uint8_t *data; /* mapped bytes, NULL when len == 0 */
    size_t len;          /* file size in bytes */
} wk_map;

/* Initialises an empty list in place. */
void wk_tensor_list_init(wk_tensor_list *l);

/* Frees every name and the array; leaves l empty. NULL-safe. */
void wk_tensor_list_fini(wk_tensor_list *l);

/*
 * Appends a copy of t whose name is the name_len bytes at name (copied, NUL
 * added; t->name is ignored). Returns WK_OK or WK_ENOMEM (l unchanged).
 */
WK_MUST_CHECK wk_err wk_tensor_list_push(wk_tensor_list *l, const wk_tensor *t, const char *name,
                                         size_t name_len);

/*
 * Moves every entry of src to the end of dst (names change owner); src is
 * left empty but initialised. Returns WK_OK or WK_ENOMEM (both unchanged).
 */
WK_MUST_CHECK wk_err wk_tensor_list_take(wk_tensor_list *dst, wk_tensor_list *src);

/*
 * Computes numel * dtype size for ndim dims of shape (ndim 0..WK_TENSOR_MAX_DIMS).
 * Writes *numel and *nbytes (either may be NULL) on success. Returns WK_EINVAL
 * when a dimension is negative or the product overflows int64_t or size_t.
 */
WK_MUST_CHECK wk_err wk_tensor_size(wk_dtype dtype, int ndim, const int64_t *shape,
                                    int64_t *numel, size_t *nbytes);

/*
 * Maps the regular file at path read-only. At most max_len bytes are accepted
 * (WK_ETOOBIG beyond; 0 means no limit). Returns WK_ENOENT (missing), WK_EPERM
 * (access denied), WK_EINVAL (not a regular file), WK_EIO, WK_ETOOBIG; the
 * diagnostic starts with path. The file must not be truncated while mapped.
 * Unmap with wk_map_close().
 */
WK_MUST_CHECK wk_err wk_map_open(const char *path, size_t max_len, wk_map *m, wk_diag *d);

/* Unmaps m and zeroes it. NULL-safe and safe on a zeroed wk_map. */
void wk_map_close(wk_map *m);

#endif /* WK_TENSOR_PRIV_H */
