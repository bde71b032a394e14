/*
 * k_hybrid: the small kernels of the hybrid layer-list step's conventions
 * (be_cuda_gdn.c; the math is be_cpu_gdn.c's): Granite's scalars (the
 * embedding times emb_mul, a block's output times res_mul into the
 * residual, the logits divided by logit_div), Qwen3.5's attention output
 * gate packed in q_proj, and the mixture-of-experts gather and combine.
 *
 * Every element is computed by one thread from its own inputs, in the CPU
 * backend's order of operations with the products and sums rounded one by
 * one (__fmul_rn / __fadd_rn: no FMA contraction, as the CPU's C code and
 * torch do), so a row's bits depend only on that row. Must never allocate
 * or synchronise: launchers only enqueue and return their own launch error
 * (k_launch.cuh).
 */
#include "k_dev.cuh"
#include "k_launch.cuh"

/* Blocks for a grid-stride loop over n elements (capped as k_swiglu does). */
static unsigned
kh_blocks(size_t n)
{
    size_t b = (n + K_THREADS - 1) / K_THREADS;
    return (unsigned)(b > 65535u * 16u ? 65535u * 16u : b);
}

static __global__ void
k_scale_kernel(float *x, size_t n, float s, int divide)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride)
        x[i] = divide ? __fdiv_rn(x[i], s) : __fmul_rn(x[i], s);
}

extern "C" int
k_scale(float *x, size_t n, float s, int divide, void *stream)
{
    k_launch_begin();
    if (n == 0)
        return (int)cudaSuccess;
    k_scale_kernel<<<kh_blocks(n), K_THREADS, 0, (cudaStream_t)stream>>>(x, n, s, divide);
    return k_launch_end();
}

static __global__ void
k_add_scaled_kernel(float *x, const float *y, size_t n, float s)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride)
        x[i] = __fadd_rn(x[i], __fmul_rn(y[i], s));
}

extern "C" int
k_add_scaled(float *x, const float *y, size_t n, float s, void *stream)
{
    k_launch_begin();
    if (n == 0)
        return (int)cudaSuccess;
    k_add_scaled_kernel<<<kh_blocks(n), K_THREADS, 0, (cudaStream_t)stream>>>(x, y, n, s);
    return k_launch_end();
}

/* element i of q / g [T][Hq][D]: token-head row r = i / D, dim j = i % D */
static __global__ void
k_attn_gate_split_kernel(const float *qg, size_t n, uint32_t D, float *q, float *g)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        const size_t r = i / D, j = i % D;
        q[i] = qg[r * 2 * D + j];
        g[i] = qg[r * 2 * D + D + j];
    }
}

extern "C" int
k_attn_gate_split(const float *qg, uint32_t T, uint32_t Hq, uint32_t D, float *q, float *g,
                  void *stream)
{
    k_launch_begin();
    const size_t n = (size_t)T * Hq * D;
    if (n == 0)
        return (int)cudaSuccess;
    k_attn_gate_split_kernel<<<kh_blocks(n), K_THREADS, 0, (cudaStream_t)stream>>>(qg, n, D, q, g);
    return k_launch_end();
}

static __global__ void
k_mul_sigmoid_kernel(float *o, const float *g, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride)
        o[i] = __fmul_rn(o[i], kd_sigmoid(g[i]));
}

extern "C" int
k_mul_sigmoid(float *o, const float *g, size_t n, void *stream)
{
    k_launch_begin();
    if (n == 0)
        return (int)cudaSuccess;
    k_mul_sigmoid_kernel<<<kh_blocks(n), K_THREADS, 0, (cudaStream_t)stream>>>(o, g, n);
    return k_launch_end();
}

/* grid (ceil(C / 256), min(n, 65535)): row r of y is row idx[r] of x */
static __global__ void
k_gather_rows_kernel(const float *x, const uint32_t *idx, uint32_t n, uint32_t C, float *y)
{
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C)
        return;
    for (uint32_t r = blockIdx.y; r < n; r += gridDim.y)
        y[(size_t)r * C + i] = x[(size_t)idx[r] * C + i];
}

extern "C" int
k_gather_rows(const float *x, const uint32_t *idx, uint32_t n, uint32_t C, float *y, void *stream)
{
    k_launch_begin();
    if (n == 0 || C == 0)
        return (int)cudaSuccess;
    dim3 grid((C + K_THREADS - 1) / K_THREADS, n < 65535u ? n : 65535u);
    k_gather_rows_kernel<<<grid, K_THREADS, 0, (cudaStream_t)stream>>>(x, idx, n, C, y);
    return k_launch_end();
}

/* grid (ceil(C / 256), T): one thread per (token, channel), the CPU's gdn_stage_combine */
static __global__ void
k_moe_combine_kernel(float *x, const float *oe, const uint32_t *trow, const float *w, uint32_t k,
                     const float *os, const float *sgv, uint32_t C, float res_mul)
{
    const uint32_t t = blockIdx.y;
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C)
        return;
    float acc = 0.0f;
    for (uint32_t j = 0; j < k; j++) {
        const size_t tj = (size_t)t * k + j;
        acc = __fadd_rn(acc, __fmul_rn(oe[(size_t)trow[tj] * C + i], w[tj]));
    }
    if (os != NULL) {
        const float sg = sgv != NULL ? sgv[t] : 1.0f;
        acc = __fadd_rn(acc, __fmul_rn(sg, os[(size_t)t * C + i]));
    }
    float *xp = x + (size_t)t * C + i;
    *xp = __fadd_rn(*xp, res_mul != 0.0f ? __fmul_rn(acc, res_mul) : acc);
}

extern "C" int
k_moe_combine(float *x, const float *oe, const uint32_t *trow, const float *w, uint32_t k,
              const float *os, const float *sgv, uint32_t T, uint32_t C, float res_mul,
              void *stream)
{
    k_launch_begin();
    if (T == 0 || C == 0)
        return (int)cudaSuccess;
    if (T > 65535u)
        return (int)cudaErrorInvalidValue;
    dim3 grid((C + K_THREADS - 1) / K_THREADS, T);
    k_moe_combine_kernel<<<grid, K_THREADS, 0, (cudaStream_t)stream>>>(x, oe, trow, w, k, os, sgv,
                                                                       C, res_mul);
    return k_launch_end();
}
