/*
 * k_dev: device helpers shared by the Mamba2 and Gated DeltaNet kernels
 * (k_common.cu, k_mamba2.cu, k_gdn.cu): element loads, activations and
 * fixed-order block reductions. Header-only, internal to kernels/.
 *
 * Every reduction here runs in an order that depends only on the block
 * size and the reduced length, never on the launch's other blocks, so a
 * row's bits do not depend on what else is in the pass.
 */
#ifndef K_DEV_CUH
#define K_DEV_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "k.h"

#define K_THREADS 256u /* threads of a per-row block (a multiple of 32, at most 1024) */

static __device__ __forceinline__ float
kd_load(const void *p, int dtype, size_t i)
{
    if (dtype == K_DT_BF16)
        return __uint_as_float((unsigned)((const uint16_t *)p)[i] << 16);
    if (dtype == K_DT_F16)
        return __half2float(__ushort_as_half(((const uint16_t *)p)[i]));
    return ((const float *)p)[i];
}

static __device__ __forceinline__ float
kd_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static __device__ __forceinline__ float
kd_silu(float x)
{
    return x / (1.0f + expf(-x));
}

/* softplus as the CPU backends: x above 20 (torch's threshold) */
static __device__ __forceinline__ float
kd_softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

/* Sum over a warp (xor butterfly: every lane gets the same bits). */
static __device__ __forceinline__ float
kd_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/*
 * Sum over the block in double (blockDim.x a multiple of 32, at most 1024)
 * in a fixed order; every thread gets the result. sh holds 32 doubles; the
 * leading barrier lets a caller reuse sh across calls.
 */
static __device__ double
kd_block_sum_d(double v, double *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    const unsigned lane = threadIdx.x & 31u, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    double s = 0.0;
    const unsigned nw = (blockDim.x + 31u) >> 5;
    for (unsigned i = 0; i < nw; i++)
        s += sh[i];
    return s;
}

#endif /* K_DEV_CUH */
