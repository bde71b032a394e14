/*
 * k_attn: causal softmax attention over a paged KV pool (hybrid models:
 * the attention layers of a Gated DeltaNet model; workerd/wrk_gdn.h,
 * workerd/backend/be_cuda_kv.h). Launchers in k.h.
 *
 * Positions and pages: pass token t of segment s = tseg[t] sits at
 * absolute position pos = seg_pos[s] + (t - seg_t0[s]) of its slot; the
 * slot's page table for this pass is pages[seg_pg[s] ...], and position j
 * lives at pool + (pages[seg_pg[s] + j / PT] * PT + j % PT) * tok_floats.
 * A token's K and V (Hkv * D floats each, K first) start kv_off floats
 * into it. Segments name distinct slots (distinct pages), so no two
 * blocks write the same bytes.
 *
 * RoPE rotates the first R dims of each head (partial rotary, Qwen3.5; R
 * 0 for Nemotron-H's and Granite-4.0-H's position-free attention).
 *
 * Numerics: RoPE angles pos * inv_freq[i] in double with double cos / sin
 * rounded to fp32 (the CPU's gdn_rope), the rotation without FMA
 * contraction; scores and weighted sums in fp32 with an online
 * (flash-style) numerically stable softmax over tiles of 128 positions in
 * ascending order: the CPU's two-pass softmax up to fp32 rounding (it sums
 * the exponentials in double). Everything a block computes depends only
 * on its own (token, head), never on the rest of the pass.
 */
#include <math.h>

#include "k_dev.cuh"
#include "k_launch.cuh"

#define KA_THREADS 128u                    /* threads of an attention block (4 warps) */
#define KA_MAX_D 1024u                     /* head dim limit (k.h) */
#define KA_ND (KA_MAX_D / KA_THREADS)      /* output dims per thread */

static __device__ __forceinline__ uint32_t
ka_pos(uint32_t t, const uint32_t *tseg, const uint32_t *seg_t0, const uint32_t *seg_pos,
       uint32_t *seg)
{
    const uint32_t s = tseg[t];
    *seg = s;
    return seg_pos[s] + (t - seg_t0[s]);
}

static __device__ __forceinline__ size_t
ka_tok(const uint32_t *pg, uint32_t j, uint32_t PT, size_t tok_floats)
{
    return ((size_t)pg[j / PT] * PT + j % PT) * tok_floats;
}

static __global__ void
k_add_rows_kernel(float *x, const float *b, size_t n, uint32_t N)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride)
        x[i] += b[i % N];
}

extern "C" int
k_add_rows(float *x, const float *b, uint32_t T, uint32_t N, void *stream)
{
    k_launch_begin();
    const size_t n = (size_t)T * N;
    if (n == 0)
        return (int)cudaSuccess;
    size_t blocks = (n + K_THREADS - 1) / K_THREADS;
    if (blocks > 65535u * 16u)
        blocks = 65535u * 16u;
    k_add_rows_kernel<<<(unsigned)blocks, K_THREADS, 0, (cudaStream_t)stream>>>(x, b, n, N);
    return k_launch_end();
}

/*
 * One block per token: RoPE on the first R dims of its q and k heads (pairs
 * (i, i + R/2), i < R/2; dims R..D-1 pass through; R 0: none), then K / V
 * into its page row.
 */
static __global__ void
k_attn_rope_store_kernel(float *q, float *k, const float *v, uint32_t Hq, uint32_t Hkv, uint32_t D,
                         uint32_t R, const double *inv_freq, const uint32_t *tseg,
                         const uint32_t *seg_t0, const uint32_t *seg_pos, const uint32_t *seg_pg,
                         const uint32_t *pages, float *pool, uint32_t PT, size_t tok_floats,
                         size_t kv_off)
{
    const uint32_t t = blockIdx.x, half = R / 2;
    uint32_t s;
    const uint32_t pos = ka_pos(t, tseg, seg_t0, seg_pos, &s);
    const uint32_t nh = Hq + Hkv;
    for (uint32_t idx = threadIdx.x; idx < nh * half; idx += blockDim.x) {
        const uint32_t hh = idx / half, i = idx % half;
        const double ang = (double)pos * inv_freq[i];
        const float cs = (float)cos(ang), sn = (float)sin(ang);
        float *p = hh < Hq ? q + ((size_t)t * Hq + hh) * D : k + ((size_t)t * Hkv + (hh - Hq)) * D;
        const float x1 = p[i], x2 = p[i + half];
        p[i] = __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn));
        p[i + half] = __fadd_rn(__fmul_rn(x1, sn), __fmul_rn(x2, cs));
    }
    __syncthreads(); /* the rotated k of every thread before the copy */
    const size_t KVD = (size_t)Hkv * D;
    float *dst = pool + ka_tok(pages + seg_pg[s], pos, PT, tok_floats) + kv_off;
    const float *ks = k + (size_t)t * KVD, *vs = v + (size_t)t * KVD;
    for (size_t i = threadIdx.x; i < KVD; i += blockDim.x) {
        dst[i] = ks[i];
        dst[KVD + i] = vs[i];
    }
}

extern "C" int
k_attn_rope_store(float *q, float *k, const float *v, uint32_t T, uint32_t Hq, uint32_t Hkv,
                  uint32_t D, uint32_t R, const double *inv_freq, const uint32_t *tseg,
                  const uint32_t *seg_t0, const uint32_t *seg_pos, const uint32_t *seg_pg,
                  const uint32_t *pages, float *pool, uint32_t PT, size_t tok_floats,
                  size_t kv_off, void *stream)
{
    k_launch_begin();
    if (T == 0)
        return (int)cudaSuccess;
    if (D == 0 || D % 2 != 0 || R % 2 != 0 || R > D || Hkv == 0 || PT == 0)
        return (int)cudaErrorInvalidValue;
    k_attn_rope_store_kernel<<<T, K_THREADS, 0, (cudaStream_t)stream>>>(
        q, k, v, Hq, Hkv, D, R, inv_freq, tseg, seg_t0, seg_pos, seg_pg, pages, pool, PT,
        tok_floats, kv_off);
    return k_launch_end();
}

/*
 * One block per (query head h = blockIdx.x, token t = blockIdx.y): tiles of
 * KA_THREADS positions; each warp scores whole positions (lanes split the
 * head dim, a butterfly sum), then every thread rescales its output dims
 * (tid + i * KA_THREADS) by exp(m_old - m_new) and adds the tile's
 * weighted V rows in position order.
 */
static __global__ void __launch_bounds__(KA_THREADS)
k_attn_kernel(const float *q, uint32_t Hq, uint32_t Hkv, uint32_t D, float scale,
              const uint32_t *tseg, const uint32_t *seg_t0, const uint32_t *seg_pos,
              const uint32_t *seg_pg, const uint32_t *pages, const float *pool, uint32_t PT,
              size_t tok_floats, size_t kv_off, float *o)
{
    __shared__ float qs[KA_MAX_D];
    __shared__ float ps[KA_THREADS];
    const uint32_t h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
    const uint32_t lane = tid & 31u, wid = tid >> 5, nw = KA_THREADS / 32u;
    uint32_t s;
    const uint32_t n = ka_pos(t, tseg, seg_t0, seg_pos, &s) + 1;
    const uint32_t *pg = pages + seg_pg[s];
    const size_t koff = kv_off + (size_t)(h / (Hq / Hkv)) * D;
    const size_t voff = koff + (size_t)Hkv * D;
    const float *qh = q + ((size_t)t * Hq + h) * D;
    for (uint32_t i = tid; i < D; i += KA_THREADS)
        qs[i] = qh[i];
    float acc[KA_ND];
#pragma unroll
    for (uint32_t c = 0; c < KA_ND; c++)
        acc[c] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    __syncthreads();
    for (uint32_t j0 = 0; j0 < n; j0 += KA_THREADS) {
        const uint32_t cnt = n - j0 < KA_THREADS ? n - j0 : KA_THREADS;
        for (uint32_t r = wid; r < cnt; r += nw) {
            const float *kr = pool + ka_tok(pg, j0 + r, PT, tok_floats) + koff;
            float part = 0.0f;
            for (uint32_t i = lane; i < D; i += 32u)
                part += qs[i] * kr[i];
            part = kd_warp_sum(part);
            if (lane == 0)
                ps[r] = part * scale;
        }
        __syncthreads(); /* the tile's scores */
        float tm = -INFINITY;
        for (uint32_t r = 0; r < cnt; r++)
            tm = fmaxf(tm, ps[r]);
        const float nm = fmaxf(m, tm);
        const float corr = expf(m - nm); /* 0 on the first tile (m = -inf) */
        __syncthreads();                 /* every thread has the max before ps changes */
        if (tid < cnt)
            ps[tid] = expf(ps[tid] - nm);
        __syncthreads(); /* the tile's weights */
        float ts = 0.0f;
        for (uint32_t r = 0; r < cnt; r++)
            ts += ps[r];
        l = l * corr + ts;
#pragma unroll
        for (uint32_t c = 0; c < KA_ND; c++)
            acc[c] *= corr;
        for (uint32_t r = 0; r < cnt; r++) {
            const float *vr = pool + ka_tok(pg, j0 + r, PT, tok_floats) + voff;
            const float w = ps[r];
#pragma unroll
            for (uint32_t c = 0; c < KA_ND; c++) {
                const uint32_t dd = tid + c * KA_THREADS;
                if (dd < D)
                    acc[c] += w * vr[dd];
            }
        }
        m = nm;
        __syncthreads(); /* everyone is done with ps before the next tile */
    }
    float *oh = o + ((size_t)t * Hq + h) * D;
    const float inv = 1.0f / l;
#pragma unroll
    for (uint32_t c = 0; c < KA_ND; c++) {
        const uint32_t dd = tid + c * KA_THREADS;
        if (dd < D)
            oh[dd] = acc[c] * inv;
    }
}

extern "C" int
k_attn(const float *q, uint32_t T, uint32_t Hq, uint32_t Hkv, uint32_t D, float scale,
       const uint32_t *tseg, const uint32_t *seg_t0, const uint32_t *seg_pos,
       const uint32_t *seg_pg, const uint32_t *pages, const float *pool, uint32_t PT,
       size_t tok_floats, size_t kv_off, float *o, void *stream)
{
    k_launch_begin();
    if (T == 0 || Hq == 0)
        return (int)cudaSuccess;
    if (D == 0 || D > KA_MAX_D || Hkv == 0 || Hq % Hkv != 0 || PT == 0 || T > 65535u)
        return (int)cudaErrorInvalidValue;
    k_attn_kernel<<<dim3(Hq, T), KA_THREADS, 0, (cudaStream_t)stream>>>(
        q, Hq, Hkv, D, scale, tseg, seg_t0, seg_pos, seg_pg, pages, pool, PT, tok_floats, kv_off,
        o);
    return k_launch_end();
}
