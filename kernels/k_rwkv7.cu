/*
 * k_rwkv7: the CUDA kernels of the RWKV-7 kinds (be_cuda_gdn.c drives
 * them; the math and stage order are be_cpu_rwkv7.c's): embedding + ln0,
 * LayerNorm, token-shift mixes and the shift-state store, the 16-bit GEMM
 * input split and the GEMM epilogues around cuBLAS, the attention prologue
 * (decay, ICLR, key normalisation, value residual) and the WKV recurrence
 * with GroupNorm, bonus and gate.
 *
 * Every reduction runs in a fixed order that depends only on the row's own
 * length and the (fixed) block size, never on how many rows a launch has,
 * so these kernels give a row the same bits whatever else is in the pass.
 * Must never allocate or synchronise: launchers only enqueue and return
 * their own launch error (k_launch.cuh).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "k.h"
#include "k_launch.cuh"

#define K_ROW_THREADS 256u /* threads of a per-row block (a multiple of 32) */
#define K_DECAY_SCALE 0.6065306597126334f /* exp(-0.5) */

static __device__ __forceinline__ float
k_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static __device__ __forceinline__ float
k_load_elem(const void *p, int dtype, size_t i)
{
    if (dtype == K_DT_BF16)
        return __uint_as_float((unsigned)((const uint16_t *)p)[i] << 16);
    if (dtype == K_DT_F16)
        return __half2float(__ushort_as_half(((const uint16_t *)p)[i]));
    return ((const float *)p)[i];
}

/*
 * Sum over the block (blockDim.x a multiple of 32, at most 1024) in a fixed
 * order; every thread gets the result. sh holds 32 floats; the leading
 * barrier lets a caller reuse sh across calls.
 */
static __device__ float
k_block_sum(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    const unsigned lane = threadIdx.x & 31u, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    float s = 0.0f;
    const unsigned nw = (blockDim.x + 31u) >> 5;
    for (unsigned i = 0; i < nw; i++)
        s += sh[i];
    return s;
}

static __device__ float
k_block_max(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const unsigned lane = threadIdx.x & 31u, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    float m = 0.0f;
    const unsigned nw = (blockDim.x + 31u) >> 5;
    for (unsigned i = 0; i < nw; i++)
        m = fmaxf(m, sh[i]);
    return m;
}

/*
 * LayerNorm of one row by the whole block. Each thread touches only the
 * elements i = threadIdx.x + j * blockDim.x, so in may equal out.
 */
static __device__ void
k_ln_row(const float *in, float *out, uint32_t C, const float *w, const float *b, float eps,
         float *sh)
{
    float s = 0.0f;
    for (uint32_t i = threadIdx.x; i < C; i += blockDim.x)
        s += in[i];
    const float mean = k_block_sum(s, sh) / (float)C;
    float q = 0.0f;
    for (uint32_t i = threadIdx.x; i < C; i += blockDim.x) {
        const float dd = in[i] - mean;
        q += dd * dd;
    }
    const float var = k_block_sum(q, sh) / (float)C;
    const float inv = 1.0f / sqrtf(var + eps);
    for (uint32_t i = threadIdx.x; i < C; i += blockDim.x)
        out[i] = (in[i] - mean) * inv * w[i] + b[i];
}

/* ------------------------------------------------------------------------ */
/* embedding, LayerNorm, token shift                                         */
/* ------------------------------------------------------------------------ */

static __global__ void
k_rwkv7_embed_kernel(const void *emb, int dtype, const uint32_t *tok, uint32_t C, const float *w,
                     const float *b, float eps, float *x)
{
    __shared__ float sh[32];
    const size_t t = blockIdx.x;
    float *row = x + t * C;
    const size_t base = (size_t)tok[t] * C;
    for (uint32_t i = threadIdx.x; i < C; i += blockDim.x)
        row[i] = k_load_elem(emb, dtype, base + i);
    k_ln_row(row, row, C, w, b, eps, sh);
}

extern "C" int
k_rwkv7_embed(const void *emb, int dtype, const uint32_t *tok, uint32_t T, uint32_t C,
              const float *w, const float *b, float eps, float *x, void *stream)
{
    k_launch_begin();
    if (T == 0)
        return (int)cudaSuccess;
    k_rwkv7_embed_kernel<<<T, K_ROW_THREADS, 0, (cudaStream_t)stream>>>(emb, dtype, tok, C, w, b,
                                                                       eps, x);
    return k_launch_end();
}

static __global__ void
k_layernorm_rows_kernel(const float *x, const uint32_t *idx, uint32_t C, const float *w,
                        const float *b, float eps, float *y)
{
    __shared__ float sh[32];
    const size_t r = blockIdx.x;
    const size_t src = idx != NULL ? idx[r] : r;
    k_ln_row(x + src * C, y + r * C, C, w, b, eps, sh);
}

extern "C" int
k_layernorm_rows(const float *x, const uint32_t *idx, uint32_t n, uint32_t C, const float *w,
                 const float *b, float eps, float *y, void *stream)
{
    k_launch_begin();
    if (n == 0)
        return (int)cudaSuccess;
    k_layernorm_rows_kernel<<<n, K_ROW_THREADS, 0, (cudaStream_t)stream>>>(x, idx, C, w, b, eps,
                                                                          y);
    return k_launch_end();
}

/* grid (ceil(C / 256), T) */
static __global__ void
k_rwkv7_shift_mix_kernel(const float *xln, uint32_t C, const uint32_t *tseg,
                         const uint32_t *seg_t0, const uint32_t *seg_slot, const float *arena,
                         size_t slot_floats, size_t shift_off, const float *mix, uint32_t n_mix,
                         float *out, size_t out_stride)
{
    const uint32_t t = blockIdx.y;
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C)
        return;
    const uint32_t s = tseg[t];
    const float x = xln[(size_t)t * C + i];
    const float prev = t > seg_t0[s] ? xln[(size_t)(t - 1) * C + i]
                                     : arena[(size_t)seg_slot[s] * slot_floats + shift_off + i];
    for (uint32_t j = 0; j < n_mix; j++)
        out[j * out_stride + (size_t)t * C + i] = x + (prev - x) * mix[(size_t)j * C + i];
}

extern "C" int
k_rwkv7_shift_mix(const float *xln, uint32_t T, uint32_t C, const uint32_t *tseg,
                  const uint32_t *seg_t0, const uint32_t *seg_slot, const float *arena,
                  size_t slot_floats, size_t shift_off, const float *mix, uint32_t n_mix,
                  float *out, size_t out_stride, void *stream)
{
    k_launch_begin();
    if (T == 0 || C == 0)
        return (int)cudaSuccess;
    if (T > 65535u)
        return (int)cudaErrorInvalidValue;
    dim3 grid((C + K_ROW_THREADS - 1) / K_ROW_THREADS, T);
    k_rwkv7_shift_mix_kernel<<<grid, K_ROW_THREADS, 0, (cudaStream_t)stream>>>(
        xln, C, tseg, seg_t0, seg_slot, arena, slot_floats, shift_off, mix, n_mix, out,
        out_stride);
    return k_launch_end();
}

/* grid (ceil(C / 256), n_segs) */
static __global__ void
k_rwkv7_save_shift_kernel(const float *xln, uint32_t C, const uint32_t *seg_t0,
                          const uint32_t *seg_n, const uint32_t *seg_slot, float *arena,
                          size_t slot_floats, size_t shift_off)
{
    const uint32_t s = blockIdx.y;
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C)
        return;
    const size_t last = (size_t)seg_t0[s] + seg_n[s] - 1;
    arena[(size_t)seg_slot[s] * slot_floats + shift_off + i] = xln[last * C + i];
}

extern "C" int
k_rwkv7_save_shift(const float *xln, uint32_t C, uint32_t n_segs, const uint32_t *seg_t0,
                   const uint32_t *seg_n, const uint32_t *seg_slot, float *arena,
                   size_t slot_floats, size_t shift_off, void *stream)
{
    k_launch_begin();
    if (n_segs == 0 || C == 0)
        return (int)cudaSuccess;
    if (n_segs > 65535u)
        return (int)cudaErrorInvalidValue;
    dim3 grid((C + K_ROW_THREADS - 1) / K_ROW_THREADS, n_segs);
    k_rwkv7_save_shift_kernel<<<grid, K_ROW_THREADS, 0, (cudaStream_t)stream>>>(
        xln, C, seg_t0, seg_n, seg_slot, arena, slot_floats, shift_off);
    return k_launch_end();
}

/* ------------------------------------------------------------------------ */
/* GEMM input split and epilogue                                             */
/* ------------------------------------------------------------------------ */

/* one block per row */
static __global__ void
k_split16_kernel(const float *x, uint32_t T, uint32_t K, int dtype, uint16_t *out,
                 float *inv_scale)
{
    __shared__ float sh[32];
    const size_t t = blockIdx.x;
    const float *row = x + t * K;
    float m = 0.0f;
    for (uint32_t i = threadIdx.x; i < K; i += blockDim.x)
        m = fmaxf(m, fabsf(row[i])); /* fmaxf drops NaN; inf stays inf */
    m = k_block_max(m, sh);
    int sh_exp = 0;
    if (m > 0.0f && isfinite(m)) {
        int e;
        (void)frexpf(m, &e); /* m = f * 2^e, f in [0.5, 1) */
        sh_exp = 14 - e;     /* m * 2^sh_exp in [2^13, 2^14) */
        sh_exp = sh_exp > 100 ? 100 : sh_exp < -100 ? -100 : sh_exp;
    }
    const float s = ldexpf(1.0f, sh_exp);
    uint16_t *hi = out + t * K, *lo = out + ((size_t)T + t) * K;
    for (uint32_t i = threadIdx.x; i < K; i += blockDim.x) {
        const float v = row[i] * s; /* exact: a power of two */
        if (dtype == K_DT_BF16) {
            const __nv_bfloat16 h = __float2bfloat16_rn(v);
            hi[i] = __bfloat16_as_ushort(h);
            lo[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v - __bfloat162float(h)));
        } else {
            const __half h = __float2half_rn(v);
            hi[i] = __half_as_ushort(h);
            lo[i] = __half_as_ushort(__float2half_rn(v - __half2float(h)));
        }
    }
    if (threadIdx.x == 0)
        inv_scale[t] = ldexpf(1.0f, -sh_exp);
}

extern "C" int
k_split16(const float *x, uint32_t T, uint32_t K, int dtype, uint16_t *out, float *inv_scale,
          void *stream)
{
    k_launch_begin();
    if (dtype != K_DT_BF16 && dtype != K_DT_F16)
        return (int)cudaErrorInvalidValue;
    if (T == 0)
        return (int)cudaSuccess;
    k_split16_kernel<<<T, K_ROW_THREADS, 0, (cudaStream_t)stream>>>(x, T, K, dtype, out,
                                                                   inv_scale);
    return k_launch_end();
}

/* grid (ceil(N / 256), T) */
static __global__ void
k_gemm_epi_kernel(const float *y, uint32_t T, uint32_t N, int split, const float *inv_scale,
                  int epi, float *dst, size_t ldd)
{
    const uint32_t t = blockIdx.y;
    const uint32_t n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N)
        return;
    float acc = y[(size_t)t * N + n];
    if (split)
        acc += y[((size_t)T + t) * N + n];
    if (inv_scale != NULL)
        acc *= inv_scale[t];
    float *o = dst + (size_t)t * ldd + n;
    switch (epi) {
    case K_EPI_ADD:
        *o += acc;
        break;
    case K_EPI_RELU2: {
        const float r = acc > 0.0f ? acc : 0.0f;
        *o = r * r;
        break;
    }
    case K_EPI_TANH:
        *o = tanhf(acc);
        break;
    case K_EPI_SIGMOID:
        *o = k_sigmoid(acc);
        break;
    default:
        *o = acc;
        break;
    }
}

extern "C" int
k_gemm_epi(const float *y, uint32_t T, uint32_t N, int split, const float *inv_scale, int epi,
           float *dst, size_t ldd, void *stream)
{
    k_launch_begin();
    if (T == 0 || N == 0)
        return (int)cudaSuccess;
    if (T > 65535u)
        return (int)cudaErrorInvalidValue;
    dim3 grid((N + K_ROW_THREADS - 1) / K_ROW_THREADS, T);
    k_gemm_epi_kernel<<<grid, K_ROW_THREADS, 0, (cudaStream_t)stream>>>(y, T, N, split,
                                                                       inv_scale, epi, dst, ldd);
    return k_launch_end();
}

/* ------------------------------------------------------------------------ */
/* attention prologue                                                        */
/* ------------------------------------------------------------------------ */

/* grid (H, T), one warp per (token, head) */
static __global__ void
k_rwkv7_att_kernel(uint32_t C, uint32_t N, int layer0, const float *w0, const float *a0,
                   const float *v0, const float *k_k, const float *k_a, float *dw, float *da,
                   const float *dv, float *kk, float *k, float *v, float *vf)
{
    const uint32_t h = blockIdx.x, t = blockIdx.y, lane = threadIdx.x;
    const size_t hc = (size_t)h * N, base = (size_t)t * C + hc;
    float ss = 0.0f;
    for (uint32_t j = lane; j < N; j += 32) {
        const float q = k[base + j] * k_k[hc + j];
        ss += q * q;
    }
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float nrm = fmaxf(sqrtf(ss), 1e-12f);
    for (uint32_t j = lane; j < N; j += 32) {
        const size_t i = hc + j, o = base + j;
        const float ic = k_sigmoid(a0[i] + da[o]);
        const float kv = k[o];
        const float kn = kv * k_k[i] / nrm;
        dw[o] = expf(-K_DECAY_SCALE * k_sigmoid(w0[i] + dw[o]));
        k[o] = kv * (1.0f + (ic - 1.0f) * k_a[i]);
        da[o] = kn * ic;
        kk[o] = -kn;
        if (layer0) {
            vf[o] = v[o];
        } else {
            const float vv = v[o];
            v[o] = vv + (vf[o] - vv) * k_sigmoid(v0[i] + dv[o]);
        }
    }
}

extern "C" int
k_rwkv7_att(uint32_t T, uint32_t C, uint32_t H, uint32_t N, int layer0, const float *w0,
            const float *a0, const float *v0, const float *k_k, const float *k_a, float *dw,
            float *da, const float *dv, float *kk, float *k, float *v, float *vf, void *stream)
{
    k_launch_begin();
    if (T == 0 || H == 0)
        return (int)cudaSuccess;
    if (T > 65535u || (size_t)H * N != C)
        return (int)cudaErrorInvalidValue;
    dim3 grid(H, T);
    k_rwkv7_att_kernel<<<grid, 32, 0, (cudaStream_t)stream>>>(C, N, layer0, w0, a0, v0, k_k, k_a,
                                                             dw, da, dv, kk, k, v, vf);
    return k_launch_end();
}

/* ------------------------------------------------------------------------ */
/* WKV                                                                       */
/* ------------------------------------------------------------------------ */

/*
 * Shared per-token tail: GroupNorm over the head's y (in sy), the bonus
 * and the gate, for value index i. Every thread computes the statistics
 * itself from shared memory in index order (no second reduction pass).
 */
static __device__ __forceinline__ float
k_wkv_tail(uint32_t N, float yi, float vi, float gi, const float *sy,
           const float *sr, const float *sk, const float *srk, float lw, float lb, float gn_eps)
{
    float mean = 0.0f;
    for (uint32_t j = 0; j < N; j++)
        mean += sy[j];
    mean /= (float)N;
    float var = 0.0f;
    for (uint32_t j = 0; j < N; j++) {
        const float dd = sy[j] - mean;
        var += dd * dd;
    }
    var /= (float)N;
    float bonus = 0.0f;
    for (uint32_t j = 0; j < N; j++)
        bonus += sr[j] * sk[j] * srk[j];
    const float yn = (yi - mean) * (1.0f / sqrtf(var + gn_eps)) * lw + lb;
    return (yn + bonus * vi) * gi;
}

/*
 * State in registers: thread i owns row i of S (value index i), N floats.
 * blockDim.x == NT; grid n_segs * H.
 */
template <int NT>
static __global__ void __launch_bounds__(NT)
k_wkv_reg_kernel(float *arena, size_t slot_floats, size_t state_off, const uint32_t *seg_t0,
                 const uint32_t *seg_n, const uint32_t *seg_slot, uint32_t H, uint32_t C,
                 const float *r, const float *w, const float *k, const float *v, const float *a,
                 const float *b, const float *g, const float *r_k, const float *lnx_w,
                 const float *lnx_b, float gn_eps, float *y)
{
    __shared__ float sr[NT], sw[NT], sk[NT], sa[NT], sb[NT], sy[NT], srk[NT];
    const uint32_t seg = blockIdx.x / H, h = blockIdx.x % H, i = threadIdx.x;
    const size_t hc = (size_t)h * NT;
    float *S = arena + (size_t)seg_slot[seg] * slot_floats + state_off + hc * NT + (size_t)i * NT;
    float s[NT];
#pragma unroll
    for (int j = 0; j < NT; j += 4) {
        const float4 q = *reinterpret_cast<const float4 *>(S + j);
        s[j] = q.x;
        s[j + 1] = q.y;
        s[j + 2] = q.z;
        s[j + 3] = q.w;
    }
    srk[i] = r_k[hc + i];
    const float lw = lnx_w[hc + i], lb = lnx_b[hc + i];
    const uint32_t t0 = seg_t0[seg], t1 = t0 + seg_n[seg];
    for (uint32_t t = t0; t < t1; t++) {
        const size_t o = (size_t)t * C + hc;
        sr[i] = r[o + i];
        sw[i] = w[o + i];
        sk[i] = k[o + i];
        sa[i] = a[o + i];
        sb[i] = b[o + i];
        const float vi = v[o + i], gi = g[o + i];
        __syncthreads(); /* inputs (and srk) visible */
        float sav = 0.0f;
#pragma unroll
        for (int j = 0; j < NT; j++)
            sav += s[j] * sa[j];
        float yi = 0.0f;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const float nv = s[j] * sw[j] + (sav * sb[j] + vi * sk[j]);
            s[j] = nv;
            yi += nv * sr[j];
        }
        sy[i] = yi;
        __syncthreads(); /* every y visible */
        y[o + i] = k_wkv_tail(NT, yi, vi, gi, sy, sr, sk, srk, lw, lb, gn_eps);
        __syncthreads(); /* done reading shared before the next token overwrites it */
    }
#pragma unroll
    for (int j = 0; j < NT; j += 4)
        *reinterpret_cast<float4 *>(S + j) = make_float4(s[j], s[j + 1], s[j + 2], s[j + 3]);
}

/* Any N <= 1024: the state stays in global memory (row i per thread). */
static __global__ void
k_wkv_gen_kernel(float *arena, size_t slot_floats, size_t state_off, const uint32_t *seg_t0,
                 const uint32_t *seg_n, const uint32_t *seg_slot, uint32_t H, uint32_t N,
                 uint32_t C, const float *r, const float *w, const float *k, const float *v,
                 const float *a, const float *b, const float *g, const float *r_k,
                 const float *lnx_w, const float *lnx_b, float gn_eps, float *y)
{
    extern __shared__ float shm[];
    float *sr = shm, *sw = shm + N, *sk = shm + 2 * N, *sa = shm + 3 * N, *sb = shm + 4 * N;
    float *sy = shm + 5 * N, *srk = shm + 6 * N;
    const uint32_t seg = blockIdx.x / H, h = blockIdx.x % H, i = threadIdx.x;
    const size_t hc = (size_t)h * N;
    float *S = arena + (size_t)seg_slot[seg] * slot_floats + state_off + hc * N + (size_t)i * N;
    srk[i] = r_k[hc + i];
    const float lw = lnx_w[hc + i], lb = lnx_b[hc + i];
    const uint32_t t0 = seg_t0[seg], t1 = t0 + seg_n[seg];
    for (uint32_t t = t0; t < t1; t++) {
        const size_t o = (size_t)t * C + hc;
        sr[i] = r[o + i];
        sw[i] = w[o + i];
        sk[i] = k[o + i];
        sa[i] = a[o + i];
        sb[i] = b[o + i];
        const float vi = v[o + i], gi = g[o + i];
        __syncthreads();
        float sav = 0.0f;
        for (uint32_t j = 0; j < N; j++)
            sav += S[j] * sa[j];
        float yi = 0.0f;
        for (uint32_t j = 0; j < N; j++) {
            const float nv = S[j] * sw[j] + (sav * sb[j] + vi * sk[j]);
            S[j] = nv;
            yi += nv * sr[j];
        }
        sy[i] = yi;
        __syncthreads();
        y[o + i] = k_wkv_tail(N, yi, vi, gi, sy, sr, sk, srk, lw, lb, gn_eps);
        __syncthreads();
    }
}

extern "C" int
k_rwkv7_wkv(float *arena, size_t slot_floats, size_t state_off, uint32_t n_segs,
            const uint32_t *seg_t0, const uint32_t *seg_n, const uint32_t *seg_slot, uint32_t H,
            uint32_t N, uint32_t C, const float *r, const float *w, const float *k,
            const float *v, const float *a, const float *b, const float *g, const float *r_k,
            const float *lnx_w, const float *lnx_b, float gn_eps, float *y, void *stream)
{
    k_launch_begin();
    if (n_segs == 0 || H == 0)
        return (int)cudaSuccess;
    if (N == 0 || N > 1024 || (size_t)H * N != C || (size_t)n_segs * H > 0x7fffffffu)
        return (int)cudaErrorInvalidValue;
    cudaStream_t st = (cudaStream_t)stream;
    const unsigned blocks = n_segs * H;
#define K_WKV_REG(NT)                                                                              \
    case NT:                                                                                       \
        k_wkv_reg_kernel<NT><<<blocks, NT, 0, st>>>(arena, slot_floats, state_off, seg_t0, seg_n,  \
                                                    seg_slot, H, C, r, w, k, v, a, b, g, r_k,      \
                                                    lnx_w, lnx_b, gn_eps, y);                      \
        break;
    switch (N) {
        K_WKV_REG(16)
        K_WKV_REG(32)
        K_WKV_REG(64)
        K_WKV_REG(128)
    default:
        k_wkv_gen_kernel<<<blocks, N, 7 * N * sizeof(float), st>>>(
            arena, slot_floats, state_off, seg_t0, seg_n, seg_slot, H, N, C, r, w, k, v, a, b, g,
            r_k, lnx_w, lnx_b, gn_eps, y);
        break;
    }
#undef K_WKV_REG
    return k_launch_end();
}
