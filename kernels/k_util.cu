/*
 * k_util: small utility kernels used by the CUDA backend: 16-bit to fp32
 * weight conversion at load time and the slot-state checksum that confirms a
 * migration. Must never allocate or synchronise: launchers only enqueue.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "k.h"

static __global__ void
k_bf16_to_f32_kernel(const uint16_t *in, float *out, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride)
        out[i] = __uint_as_float((unsigned)in[i] << 16);
}

static __global__ void
k_f16_to_f32_kernel(const uint16_t *in, float *out, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride)
        out[i] = __half2float(__ushort_as_half(in[i]));
}

static unsigned
k_grid(size_t n, unsigned block)
{
    size_t g = (n + block - 1) / block;
    if (g > 65535u * 16u)
        g = 65535u * 16u;
    return g ? (unsigned)g : 1u;
}

extern "C" int
k_bf16_to_f32(const uint16_t *in, float *out, size_t n, void *stream)
{
    k_bf16_to_f32_kernel<<<k_grid(n, 256), 256, 0, (cudaStream_t)stream>>>(in, out, n);
    return (int)cudaGetLastError();
}

extern "C" int
k_f16_to_f32(const uint16_t *in, float *out, size_t n, void *stream)
{
    k_f16_to_f32_kernel<<<k_grid(n, 256), 256, 0, (cudaStream_t)stream>>>(in, out, n);
    return (int)cudaGetLastError();
}

/* One block; each thread hashes a contiguous run of words, then a fixed-order fold. */
static __global__ void
k_state_checksum_kernel(const uint64_t *words, size_t n, uint64_t *out)
{
    __shared__ uint64_t part[256];
    size_t per = (n + blockDim.x - 1) / blockDim.x;
    size_t lo = threadIdx.x * per;
    size_t hi = lo + per < n ? lo + per : n;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = lo; i < hi; i++) {
        h ^= words[i];
        h *= 0x100000001b3ull;
    }
    part[threadIdx.x] = h;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint64_t f = 0xcbf29ce484222325ull;
        for (unsigned t = 0; t < blockDim.x; t++) {
            f ^= part[t];
            f *= 0x100000001b3ull;
        }
        *out = f;
    }
}

extern "C" int
k_state_checksum(const void *state, size_t bytes, uint64_t *out, void *stream)
{
    if (bytes % 8 != 0)
        return (int)cudaErrorInvalidValue;
    k_state_checksum_kernel<<<1, 256, 0, (cudaStream_t)stream>>>((const uint64_t *)state,
                                                                 bytes / 8, out);
    return (int)cudaGetLastError();
}
