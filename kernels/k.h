/*
 * kernels: CUDA C with C-ABI launchers. Host code includes only this header
 * and never sees <<< >>>. Each launcher enqueues on the given stream
 * (a cudaStream_t passed as void *, NULL = default stream) and returns the
 * launch's cudaError_t as an int (0 = success); the caller's WK_CUDA_CHECK
 * funnel translates it.
 */
#ifndef K_H
#define K_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = (float)in[i] for n bfloat16 values. */
int k_bf16_to_f32(const uint16_t *in, float *out, size_t n, void *stream);

/* out[i] = (float)in[i] for n IEEE half values. */
int k_f16_to_f32(const uint16_t *in, float *out, size_t n, void *stream);

/*
 * Per-slot checksum for migration confirmation: a 64-bit FNV-1a over 8-byte
 * little-endian words folded in a fixed tree order, written to *out (device
 * pointer). Bytes must be a multiple of 8. The CPU reference is
 * k_state_checksum_host() so both sides agree on any backend.
 */
int k_state_checksum(const void *state, size_t bytes, uint64_t *out, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* K_H */
