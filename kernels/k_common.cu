/*
 * k_common: kernels the Mamba2 and Gated DeltaNet steps share (embedding
 * gather, RMSNorm of rows, the gated MLP's SiLU product). The math is the
 * CPU backend's (be_cpu_common.c, be_cpu_gdn.c). Must never allocate or
 * synchronise: launchers only enqueue and return their own launch error (k_launch.cuh).
 */
#include "k_dev.cuh"
#include "k_launch.cuh"

/* grid (ceil(C / 256), T) */
static __global__ void
k_embed_rows_kernel(const void *emb, int dtype, const uint32_t *tok, uint32_t C, float *x)
{
    const uint32_t t = blockIdx.y;
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C)
        return;
    x[(size_t)t * C + i] = kd_load(emb, dtype, (size_t)tok[t] * C + i);
}

extern "C" int
k_embed_rows(const void *emb, int dtype, const uint32_t *tok, uint32_t T, uint32_t C, float *x,
             void *stream)
{
    k_launch_begin();
    if (T == 0 || C == 0)
        return (int)cudaSuccess;
    if (T > 65535u)
        return (int)cudaErrorInvalidValue;
    dim3 grid((C + K_THREADS - 1) / K_THREADS, T);
    k_embed_rows_kernel<<<grid, K_THREADS, 0, (cudaStream_t)stream>>>(emb, dtype, tok, C, x);
    return k_launch_end();
}

/* one block per row; each thread touches only i = threadIdx.x + j * blockDim.x */
static __global__ void
k_rmsnorm_rows_kernel(const float *x, const uint32_t *idx, uint32_t D, const float *w, double eps,
                      float *y)
{
    __shared__ double sh[32];
    const size_t r = blockIdx.x;
    const float *in = x + (idx != NULL ? (size_t)idx[r] : r) * D;
    float *out = y + r * D;
    double s = 0.0;
    for (uint32_t i = threadIdx.x; i < D; i += blockDim.x)
        s += (double)in[i] * in[i];
    s = kd_block_sum_d(s, sh);
    const float inv = (float)(1.0 / sqrt(s / D + eps));
    for (uint32_t i = threadIdx.x; i < D; i += blockDim.x)
        out[i] = w != NULL ? in[i] * inv * w[i] : in[i] * inv;
}

extern "C" int
k_rmsnorm_rows(const float *x, const uint32_t *idx, uint32_t n, uint32_t D, const float *w,
               double eps, float *y, void *stream)
{
    k_launch_begin();
    if (n == 0 || D == 0)
        return (int)cudaSuccess;
    k_rmsnorm_rows_kernel<<<n, K_THREADS, 0, (cudaStream_t)stream>>>(x, idx, D, w, eps, y);
    return k_launch_end();
}

static __global__ void
k_swiglu_kernel(float *g, const float *u, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride)
        g[i] = kd_silu(g[i]) * u[i];
}

extern "C" int
k_swiglu(float *g, const float *u, size_t n, void *stream)
{
    k_launch_begin();
    if (n == 0)
        return (int)cudaSuccess;
    size_t blocks = (n + K_THREADS - 1) / K_THREADS;
    if (blocks > 65535u * 16u)
        blocks = 65535u * 16u;
    k_swiglu_kernel<<<(unsigned)blocks, K_THREADS, 0, (cudaStream_t)stream>>>(g, u, n);
    return k_launch_end();
}
