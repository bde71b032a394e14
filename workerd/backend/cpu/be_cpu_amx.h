/*
 * be_cpu_amx: BF16 matrix products on AMX tiles (the `--cpu-matmul bf16`
 * numeric mode), internal to the CPU backend's kernels (be_cpu_kernels.c
 * calls it for matrices packed with mode BE_CPU_MATMUL_BF16).
 *
 * The mode: for a BF16 weight matrix, each activation row is rounded to
 * bf16 (round to nearest even; NaN stays NaN) and the product runs on
 * TDPBF16PS: per output, successive chunks of 32 k accumulate into one fp32
 * tile element, chunk 0 first, from +0. Inputs and results that are
 * denormal are flushed (AMX's DAZ/FTZ). Within a chunk the hardware's
 * summation order and rounding are its own: AMX is NOT bit-identical to the
 * fp32 FMA chain of the default mode (measured on Sapphire Rapids: 7% of
 * outputs differ at K = 32, most at K = 4096, by an ulp or a few), so this
 * mode uses AMX for every number of rows, decode included. A row's result
 * still depends only on that row and W: not on the batch, the row blocking
 * or the thread split (test_be_cpu checks these bitwise).
 *
 * Packed layout (per panel of BE_CPU_NR = 32 columns, k padded with zeros
 * to Kp = a multiple of 32): for each chunk of 32 k, two 16-column tiles of
 * 16 rows x 64 bytes, row r holding k = 2r, 2r + 1 of each column
 * interleaved: element (k, c) at
 *     ((k / 32 * 2 + c / 16) * 16 + k % 32 / 2) * 32 + c % 16 * 2 + k % 2
 * so each B tile is 1 KiB contiguous.
 */
#ifndef BE_CPU_AMX_H
#define BE_CPU_AMX_H

#include "be_cpu_kernels.h"

#define BE_CPU_AMX_KC 32 /* k per tile chunk */

/* Kp: k rounded up to whole chunks. */
static inline uint32_t
be_cpu_amx_kp(uint32_t k)
{
    return (k + BE_CPU_AMX_KC - 1) / BE_CPU_AMX_KC * BE_CPU_AMX_KC;
}

/* Fills panels [p0, p1) of dst (dst->amx, BF16) from src (BF16). */
void be_cpu_amx_pack_panels(be_cpu_mat *dst, const wrk_mat *src, uint32_t p0, uint32_t p1);

/* be_cpu_gemm for a matrix packed for AMX (w->amx); be_cpu_amx_enable() said yes. */
void be_cpu_amx_gemm(const be_cpu_mat *w, const float *x, size_t ldx, uint32_t m, float *y,
                     size_t ldy, float *const *yrows, uint32_t p0, uint32_t p1, be_cpu_epi epi);

/* Tests: true makes every later call take the stack-slab path (the one an allocation failure
 * takes), which must give the same bits. */
void be_cpu_amx_set_slab_only(bool on);

/* be_cpu_kernels.c's epilogue: mr rows of tile (stride tw) into y's columns [col0, +nvalid). */
void be_cpu_tile_out(const float *tile, uint32_t mr, uint32_t tw, uint32_t col0, uint32_t nvalid,
                     float *y, size_t ldy, float *const *yrows, uint32_t m0, be_cpu_epi epi);

#endif /* BE_CPU_AMX_H */
