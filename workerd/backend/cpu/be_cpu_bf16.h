/*
 * be_cpu_bf16: the `--cpu-matmul bf16` numeric mode for BF16 weight
 * matrices, internal to the CPU backend's kernels (be_cpu_kernels.c calls
 * it for matrices packed with mode BE_CPU_MATMUL_BF16 or _BF16_DP). Two
 * engines, each its own numeric mode (a state made under one never loads
 * into a worker of another: the model fingerprint names the engine):
 *
 * Both round each activation row to bf16 (round to nearest even; NaN stays
 * a quiet NaN) and multiply it with the bf16 weights; a product of two
 * bf16 values is exact in fp32. A row's result depends only on that row
 * and W: not on the batch, the row blocking, the k slabs or the thread
 * split (test_be_cpu checks these bitwise), decode included.
 *
 * AMX tiles (BE_CPU_MATMUL_BF16, CPUs with AMX-BF16): TDPBF16PS; per
 * output, successive chunks of 32 k accumulate into one fp32 tile element,
 * chunk 0 first, from +0. Inputs and results that are denormal are flushed
 * (AMX's DAZ/FTZ). Within a chunk the hardware's summation order and
 * rounding are its own: AMX is NOT bit-identical to the fp32 FMA chain of
 * the default mode (measured on Sapphire Rapids: 7% of outputs differ at
 * K = 32, most at K = 4096, by an ulp or a few).
 *
 * AVX512-BF16 dot products (BE_CPU_MATMUL_BF16_DP, CPUs with AVX512_BF16
 * but no AMX, e.g. AMD Zen 4/5, Cooper Lake): VDPBF16PS, whose result the
 * SDM specifies exactly: per output, one fp32 sum from +0 over k = 0..Kp-1
 * (the zero padding included: an exact -0 ends +0) in the order 1, 0, 3,
 * 2, 5, 4, ... (each pair's odd product first), each product exact and
 * added with one rounding to nearest even (a product beyond fp32's range
 * does not overflow before its addition), denormal inputs read as zero and
 * a result tiny after rounding (under 2^-126 at 24 bits, exponent
 * unbounded) flushed to zero of its sign; NaN payloads excepted.
 * be_cpu_dp_ref() computes that in portable C, the tests' bitwise
 * reference (test_dp_ref compares it with the instruction on edge values,
 * random bits and sums aimed at the underflow boundary; measured on AMD
 * EPYC: the SDM's rule, so Intel's parts should give the same bits).
 *
 * Packed layout (both engines; per panel of BE_CPU_NR = 32 columns, k
 * padded with zeros to Kp = a multiple of 32): for each chunk of 32 k, two
 * 16-column tiles of 16 rows x 64 bytes, row r holding k = 2r, 2r + 1 of
 * each column interleaved: element (k, c) at
 *     ((k / 32 * 2 + c / 16) * 16 + k % 32 / 2) * 32 + c % 16 * 2 + k % 2
 * so each B tile is 1 KiB contiguous, and each of its rows is the 16-column
 * operand of one VDPBF16PS for a k pair.
 */
#ifndef BE_CPU_BF16_H
#define BE_CPU_BF16_H

#include "be_cpu_kernels.h"

#define BE_CPU_KPAIR_KC 32 /* k per tile chunk */

/* Kp: k rounded up to whole chunks. */
static inline uint32_t
be_cpu_kpair_kp(uint32_t k)
{
    return (k + BE_CPU_KPAIR_KC - 1) / BE_CPU_KPAIR_KC * BE_CPU_KPAIR_KC;
}

/* Fills panels [p0, p1) of dst (dst->kpair, BF16) from src (BF16). */
void be_cpu_kpair_pack_panels(be_cpu_mat *dst, const wrk_mat *src, uint32_t p0, uint32_t p1);

/* be_cpu_gemm for a matrix packed for AMX (w->kpair, !w->dp); be_cpu_amx_enable() said yes. */
void be_cpu_amx_gemm(const be_cpu_mat *w, const float *x, size_t ldx, uint32_t m, float *y,
                     size_t ldy, float *const *yrows, uint32_t p0, uint32_t p1, be_cpu_epi epi);

/* be_cpu_gemm for a matrix packed for the dot products (w->kpair, w->dp); be_cpu_dp_enable() said
 * yes. */
void be_cpu_dp_gemm(const be_cpu_mat *w, const float *x, size_t ldx, uint32_t m, float *y,
                    size_t ldy, float *const *yrows, uint32_t p0, uint32_t p1, be_cpu_epi epi);

/* The activation rounding of both engines: f to bf16, nearest even, NaN quiet. */
uint16_t be_cpu_bf16_round(float f);

/* The BE_CPU_MATMUL_BF16_DP sum in portable C: acc after the k pair (a0, a1) x (b0, b1), all
 * bf16 bits (the tests' reference). */
float be_cpu_dp_ref(float acc, uint16_t a0, uint16_t a1, uint16_t b0, uint16_t b1);

/* Tests: true makes every later call take the stack-slab path of either engine (the one an
 * allocation failure takes), which must give the same bits. */
void be_cpu_bf16_set_slab_only(bool on);

/* be_cpu_kernels.c's epilogue: mr rows of tile (stride tw) into y's columns [col0, +nvalid). */
void be_cpu_tile_out(const float *tile, uint32_t mr, uint32_t tw, uint32_t col0, uint32_t nvalid,
                     float *y, size_t ldy, float *const *yrows, uint32_t m0, be_cpu_epi epi);

#endif /* BE_CPU_BF16_H */
