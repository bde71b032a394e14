/*
 * wk_tensor: a read-only view of the tensors in a checkpoint, whatever its
 * container (.safetensors, a sharded safetensors index, or a torch .pth zip).
 *
 * A wk_tensor_set owns its file mappings; every wk_tensor it hands out
 * (name, data) is borrowed until wk_tensor_set_free(). Input files are hostile:
 * every header is validated against the file size, offsets, overlaps and
 * dtypes before any tensor is exposed. Never logs.
 */
#ifndef WK_TENSOR_H
#define WK_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"

typedef enum wk_dtype {
    WK_DTYPE_F32 = 0, /* IEEE binary32 */
    WK_DTYPE_F16,     /* IEEE binary16 */
    WK_DTYPE_BF16,    /* bfloat16 */
    WK_DTYPE_Q8_0,    /* GGML Q8_0: blocks of 32 along the last dim, fp16 scale d then
                         32 int8 q (34 bytes), value = d * q */
} wk_dtype;

#define WK_DTYPE_COUNT 4     /* number of wk_dtype values */
#define WK_Q8_0_BLOCK 32     /* elements per Q8_0 block */
#define WK_Q8_0_BYTES 34     /* bytes per Q8_0 block (fp16 d + 32 int8) */

#define WK_TENSOR_MAX_DIMS 8

typedef struct wk_tensor {
    const char *name;                  /* tensor name, borrowed */
    wk_dtype dtype;                    /* element type */
    int ndim;                          /* number of dimensions, 0..WK_TENSOR_MAX_DIMS */
    int64_t shape[WK_TENSOR_MAX_DIMS]; /* row-major shape */
    const void *data;                  /* contiguous little-endian elements, borrowed */
    size_t nbytes;                     /* bytes at data == numel * dtype size (Q8_0: numel /
                                          32 * 34, the last dim a multiple of 32) */
} wk_tensor;

typedef struct wk_tensor_set wk_tensor_set;

/*
 * Size in bytes of one element of dtype (4 or 2); 0 for the block type Q8_0,
 * whose size is only defined per block (wk_dtype_block_len/bytes).
 */
size_t wk_dtype_size(wk_dtype dtype);

/* Elements per storage block: 1, or WK_Q8_0_BLOCK for Q8_0. */
size_t wk_dtype_block_len(wk_dtype dtype);

/* Bytes per storage block: 4, 2, or WK_Q8_0_BYTES for Q8_0. */
size_t wk_dtype_block_bytes(wk_dtype dtype);

/* "F32", "F16", "BF16", "Q8_0". */
const char *wk_dtype_name(wk_dtype dtype);

/*
 * Parses a dtype name as wk_dtype_name() spells it ("F32", "F16", "BF16";
 * exact, case-sensitive; "Q8_0" is not a safetensors dtype and is refused
 * here). Writes *out on success. Returns WK_ENOTSUP for any other name,
 * WK_EINVAL for NULL arguments.
 */
WK_MUST_CHECK wk_err wk_dtype_parse(const char *name, wk_dtype *out);

/*
 * Number of elements of t (product of its shape; 1 for a scalar; 0 when a
 * dim is 0, whatever the others). INT64_MAX when the product does not fit,
 * which wk_tensor_size() refuses for every tensor a reader exposes.
 */
int64_t wk_tensor_numel(const wk_tensor *t);

/* Element conversions. */
float wk_bf16_to_f32(uint16_t v);
uint16_t wk_f32_to_bf16(float v); /* round to nearest even, NaN kept */
float wk_f16_to_f32(uint16_t v);
uint16_t wk_f32_to_f16(float v); /* round to nearest even */

/*
 * Converts n elements of t starting at element `first` to fp32 into out
 * (Q8_0: dequantized, fp32(d) * q, any range). Returns WK_EINVAL when the
 * range is outside the tensor.
 */
WK_MUST_CHECK wk_err wk_tensor_read_f32(const wk_tensor *t, size_t first, size_t n, float *out);

/*
 * Quantizes one row of n floats (n a multiple of 32) to n / 32 Q8_0 blocks
 * at out (n / 32 * 34 bytes), exactly as ggml's quantize_row_q8_0_ref: per
 * block d = amax / 127, id = 1 / d (0 when d is 0), q = roundf(x * id),
 * d stored as fp16 (round to nearest even). The same f32 input gives the
 * same bytes as llama.cpp's convert/quantize. Returns WK_EINVAL when n is
 * not a multiple of 32.
 */
WK_MUST_CHECK wk_err wk_q8_0_quantize_row(const float *x, size_t n, uint8_t *out);

/*
 * Opens a checkpoint. path may be:
 *   - a .safetensors file,
 *   - a model.safetensors.index.json (all shards it names are opened),
 *   - a torch .pth / .pt zip archive (the pickle is interpreted, never executed),
 *   - a GGUF file (F32/F16/BF16/Q8_0 tensors under their GGUF names, shapes row-major;
 *     wk_gguf.h reads its metadata too).
 * On success *out owns the mappings; free with wk_tensor_set_free().
 * Returns WK_ENOENT, WK_EIO, WK_EINVAL (malformed: the diag names the tensor
 * or the offending field), WK_ENOTSUP (valid file, unsupported dtype/feature),
 * WK_ENOMEM, WK_EPERM (file not readable), WK_ETOOBIG (over a documented limit
 * of wk_safetensors.h / wk_pth.h). The files must not be truncated while the
 * set is open. Tensor data may be unaligned; read it with memcpy or
 * wk_tensor_read_f32().
 */
WK_MUST_CHECK wk_err wk_tensor_set_open(const char *path, wk_tensor_set **out, wk_diag *d);

/*
 * Builds a set of n views (name, dtype, shape, data, nbytes) that another
 * reader produced, e.g. tensors of a wk_gguf renamed or split by a model
 * loader. Names are copied; data stays borrowed from owner, which the set
 * takes over on success only (owner_free(owner) runs in wk_tensor_set_free();
 * owner_free may be NULL). Returns WK_EINVAL (NULL name, nbytes not matching
 * the shape, duplicate name), WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_tensor_set_new(const wk_tensor *v, size_t n, void *owner,
                                       void (*owner_free)(void *), wk_tensor_set **out,
                                       wk_diag *d);

/* Frees the set, its owner (wk_tensor_set_new) and unmaps its files. NULL-safe. */
void wk_tensor_set_free(wk_tensor_set *set);

/* Number of tensors in the set. */
size_t wk_tensor_set_count(const wk_tensor_set *set);

/* The i-th tensor (sorted by name), borrowed; NULL when i is out of range. */
const wk_tensor *wk_tensor_set_at(const wk_tensor_set *set, size_t i);

/* The tensor called name, borrowed; NULL when absent. */
const wk_tensor *wk_tensor_set_find(const wk_tensor_set *set, const char *name);

#endif /* WK_TENSOR_H */
