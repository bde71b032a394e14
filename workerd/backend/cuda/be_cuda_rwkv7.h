/*
 * be_cuda_rwkv7: the RWKV-7 step on a CUDA device (be_cuda_rwkv7.c), which
 * be_cuda.c reaches through be_cuda_rwkv7_family (be_cuda_common.h); these
 * functions are the same step for tests and tools that want it directly.
 * Never logs.
 */
#ifndef BE_CUDA_RWKV7_H
#define BE_CUDA_RWKV7_H

#include <stddef.h>
#include <stdint.h>

#include "be.h"
#include "be_cuda_common.h"
#include "wk_err.h"
#include "wrk_model.h"
#include "wrk_rwkv7.h"

typedef struct be_cuda_rwkv7 be_cuda_rwkv7;

/*
 * Uploads rw's weights to the current device (cudaSetDevice(device) done by
 * the caller) and allocates the step scratch. arena (device memory,
 * n_slots slots of slot_bytes, the be.h layout) is borrowed for the
 * object's life. On success *out is owned by the caller (free with
 * be_cuda_rwkv7_free). Returns WK_EINVAL (config or shapes), WK_ENOTSUP
 * (head size over 1024), WK_ENOMEM (host), WK_EDEVICE (device memory or
 * a CUDA/cuBLAS error); the diag says which.
 */
WK_MUST_CHECK wk_err be_cuda_rwkv7_new(const be_config *cfg, const wrk_rwkv7 *rw, float *arena,
                                       uint32_t n_slots, uint64_t slot_bytes, be_cuda_rwkv7 **out,
                                       wk_diag *d);

/* Frees everything new() made; NULL-safe and safe on a half-built object. */
void be_cuda_rwkv7_free(be_cuda_rwkv7 *c);

/*
 * One step (be.h's step contract): every row is checked first, with the
 * CPU backend's errors and messages, and nothing changes on refusal.
 * Returns when every state write and logits row is complete.
 * WK_EDEVICE on a device error (slot states of the step's rows are then
 * unspecified).
 */
WK_MUST_CHECK wk_err be_cuda_rwkv7_step(be_cuda_rwkv7 *c, be_row *rows, size_t n, wk_diag *d);

/* Writes "pass_tokens=... weights=... weight_bytes=..." into buf (NUL-terminated). */
void be_cuda_rwkv7_describe(const be_cuda_rwkv7 *c, char *buf, size_t len);

#endif /* BE_CUDA_RWKV7_H */
