/*
 * k_gdn: the CUDA kernels of the Gated DeltaNet step (be_cuda_gdn.c drives
 * them; the math and stage order are be_cpu_gdn.c's, the slot layout
 * wrk_gdn.h's): the short convolutions + SiLU over the slot's histories,
 * the q / k L2 norms, decay and beta, the gated delta rule over the slot's
 * S [HV][K][Vd], and the per-head output RMSNorm with the SiLU gate.
 *
 * The delta rule treats each column of S on its own (S *= decay; kv = S^T k;
 * u = beta (v - kv); S += k u^T; o = S^T q: column i reads only column i,
 * k, q and v_i), so a block takes 32 columns of one value head and a
 * thread one column, summing over the key index in order as the CPU does.
 * Recurrences run per segment with tokens in order; segments of one launch
 * must name distinct slots. Must never allocate or synchronise: launchers
 * only enqueue and return their own launch error (k_launch.cuh).
 */
#include "k_dev.cuh"
#include "k_launch.cuh"

#define K_GDN_CONV_THREADS 128u /* channels per conv block */
#define K_GDN_CONV_MAX_W 64u    /* longest conv (the CPU's limit) */
#define K_GDN_COLS 32u          /* value columns per delta-rule block (one warp) */
#define K_GDN_SMEM_MAX 49152u   /* dynamic shared memory without an opt-in */
#define K_GDN_L2_EPS 1e-6       /* fla's in-kernel q / k L2 normalisation */

/* grid (ceil(D / 128), n_segs): one thread per (segment, channel) */
static __global__ void
k_gdn_conv_kernel(const float *raw, uint32_t D, uint32_t W, const float *taps,
                  const uint32_t *seg_t0, const uint32_t *seg_n, const uint32_t *seg_slot,
                  float *arena, size_t slot_floats, size_t hist_off, float *out)
{
    const uint32_t s = blockIdx.y;
    const uint32_t d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D)
        return;
    const uint32_t wm = W - 1;
    float *hist = arena + (size_t)seg_slot[s] * slot_floats + hist_off + d; /* [W-1][D] */
    const float *tp = taps + (size_t)d * W;
    float win[K_GDN_CONV_MAX_W];
    for (uint32_t j = 0; j < wm; j++)
        win[j] = hist[(size_t)j * D];
    const uint32_t t0 = seg_t0[s], t1 = t0 + seg_n[s];
    for (uint32_t t = t0; t < t1; t++) {
        win[wm] = raw[(size_t)t * D + d];
        float acc = 0.0f;
        for (uint32_t j = 0; j < W; j++)
            acc += tp[j] * win[j];
        out[(size_t)t * D + d] = kd_silu(acc);
        for (uint32_t j = 0; j < wm; j++)
            win[j] = win[j + 1];
    }
    for (uint32_t j = 0; j < wm; j++)
        hist[(size_t)j * D] = win[j];
}

extern "C" int
k_gdn_conv(const float *raw, uint32_t D, uint32_t W, const float *taps, uint32_t n_segs,
           const uint32_t *seg_t0, const uint32_t *seg_n, const uint32_t *seg_slot, float *arena,
           size_t slot_floats, size_t hist_off, float *out, void *stream)
{
    k_launch_begin();
    if (n_segs == 0 || D == 0)
        return (int)cudaSuccess;
    if (W < 2 || W > K_GDN_CONV_MAX_W || n_segs > 65535u)
        return (int)cudaErrorInvalidValue;
    dim3 grid((D + K_GDN_CONV_THREADS - 1) / K_GDN_CONV_THREADS, n_segs);
    k_gdn_conv_kernel<<<grid, K_GDN_CONV_THREADS, 0, (cudaStream_t)stream>>>(
        raw, D, W, taps, seg_t0, seg_n, seg_slot, arena, slot_floats, hist_off, out);
    return k_launch_end();
}

/* one block per (token, head) */
static __global__ void
k_gdn_l2norm_kernel(float *x, uint32_t K, float scale)
{
    __shared__ double sh[32];
    float *v = x + (size_t)blockIdx.x * K;
    double s = 0.0;
    for (uint32_t i = threadIdx.x; i < K; i += blockDim.x)
        s += (double)v[i] * v[i];
    s = kd_block_sum_d(s, sh);
    const float inv = (float)(1.0 / sqrt(s + K_GDN_L2_EPS)) * scale;
    for (uint32_t i = threadIdx.x; i < K; i += blockDim.x)
        v[i] *= inv;
}

extern "C" int
k_gdn_l2norm(float *x, uint32_t T, uint32_t H, uint32_t K, float scale, void *stream)
{
    k_launch_begin();
    if (T == 0 || H == 0 || K == 0)
        return (int)cudaSuccess;
    if ((size_t)T * H > 0x7fffffffu)
        return (int)cudaErrorInvalidValue;
    k_gdn_l2norm_kernel<<<T * H, 128, 0, (cudaStream_t)stream>>>(x, K, scale);
    return k_launch_end();
}

static __global__ void
k_gdn_gates_kernel(float *a, float *b, size_t n, uint32_t HV, const float *neg_A,
                   const float *dt_bias, float beta_scale)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        const uint32_t j = (uint32_t)(i % HV);
        a[i] = expf(neg_A[j] * kd_softplus(a[i] + dt_bias[j]));
        b[i] = kd_sigmoid(b[i]) * beta_scale;
    }
}

extern "C" int
k_gdn_gates(float *a, float *b, size_t n, uint32_t HV, const float *neg_A, const float *dt_bias,
            float beta_scale, void *stream)
{
    k_launch_begin();
    if (n == 0)
        return (int)cudaSuccess;
    if (HV == 0)
        return (int)cudaErrorInvalidValue;
    size_t blocks = (n + K_THREADS - 1) / K_THREADS;
    if (blocks > 65535u * 16u)
        blocks = 65535u * 16u;
    k_gdn_gates_kernel<<<(unsigned)blocks, K_THREADS, 0, (cudaStream_t)stream>>>(
        a, b, n, HV, neg_A, dt_bias, beta_scale);
    return k_launch_end();
}

/*
 * One block (one warp) per (segment, value head j, tile of 32 columns).
 * Dynamic shared memory: q [K], k [K], then (SM) the tile of S [K][32].
 * Thread i owns column c0 + i (idle past Vd, but present at every barrier).
 */
template <bool SM>
static __global__ void
k_gdn_delta_kernel(float *arena, size_t slot_floats, size_t S_off, const uint32_t *seg_t0,
                   const uint32_t *seg_n, const uint32_t *seg_slot, uint32_t H, uint32_t HV,
                   uint32_t K, uint32_t Vd, const float *q, const float *k, const float *v,
                   const float *decay, const float *beta, float *o)
{
    extern __shared__ float sh[];
    float *sq = sh, *sk = sh + K, *sS = sh + 2 * K;
    const uint32_t n_tiles = (Vd + K_GDN_COLS - 1) / K_GDN_COLS;
    const uint32_t per_seg = HV * n_tiles;
    const uint32_t seg = blockIdx.x / per_seg, rem = blockIdx.x % per_seg;
    const uint32_t j = rem / n_tiles, c0 = (rem % n_tiles) * K_GDN_COLS;
    const uint32_t i = threadIdx.x, col = c0 + i, kh = j / (HV / H);
    const bool active = col < Vd;
    const size_t KD = (size_t)H * K, VD = (size_t)HV * Vd;
    float *Sg = arena + (size_t)seg_slot[seg] * slot_floats + S_off + (size_t)j * K * Vd + col;
    /* S(r) = this thread's column, key row r */
    float *Sc = SM ? sS + i : Sg;
    const size_t ld = SM ? K_GDN_COLS : Vd;
    if (SM && active)
        for (uint32_t r = 0; r < K; r++)
            Sc[r * ld] = Sg[(size_t)r * Vd];
    const uint32_t t0 = seg_t0[seg], t1 = t0 + seg_n[seg];
    for (uint32_t t = t0; t < t1; t++) {
        for (uint32_t r = i; r < K; r += blockDim.x) {
            sq[r] = q[(size_t)t * KD + (size_t)kh * K + r];
            sk[r] = k[(size_t)t * KD + (size_t)kh * K + r];
        }
        __syncthreads(); /* q, k visible */
        if (active) {
            const float dec = decay[(size_t)t * HV + j], bt = beta[(size_t)t * HV + j];
            const float vi = v[(size_t)t * VD + (size_t)j * Vd + col];
            float kv = 0.0f;
            for (uint32_t r = 0; r < K; r++) {
                const float s = Sc[r * ld] * dec;
                Sc[r * ld] = s;
                kv = kv + s * sk[r];
            }
            const float u = (vi - kv) * bt;
            float acc = 0.0f;
            for (uint32_t r = 0; r < K; r++) {
                const float s = Sc[r * ld] + u * sk[r];
                Sc[r * ld] = s;
                acc = acc + s * sq[r];
            }
            o[(size_t)t * VD + (size_t)j * Vd + col] = acc;
        }
        __syncthreads(); /* done reading q, k before the next token overwrites them */
    }
    if (SM && active)
        for (uint32_t r = 0; r < K; r++)
            Sg[(size_t)r * Vd] = Sc[r * ld];
}

extern "C" int
k_gdn_delta(float *arena, size_t slot_floats, size_t S_off, uint32_t n_segs,
            const uint32_t *seg_t0, const uint32_t *seg_n, const uint32_t *seg_slot, uint32_t H,
            uint32_t HV, uint32_t K, uint32_t Vd, const float *q, const float *k, const float *v,
            const float *decay, const float *beta, float *o, void *stream)
{
    k_launch_begin();
    if (n_segs == 0 || HV == 0)
        return (int)cudaSuccess;
    if (H == 0 || K == 0 || Vd == 0 || HV % H != 0)
        return (int)cudaErrorInvalidValue;
    const size_t n_tiles = (Vd + K_GDN_COLS - 1) / K_GDN_COLS;
    const size_t blocks = (size_t)n_segs * HV * n_tiles;
    if (blocks > 0x7fffffffu)
        return (int)cudaErrorInvalidValue;
    cudaStream_t st = (cudaStream_t)stream;
    const size_t io = 2 * (size_t)K * sizeof(float);
    const size_t full = io + (size_t)K * K_GDN_COLS * sizeof(float);
    if (full <= K_GDN_SMEM_MAX)
        k_gdn_delta_kernel<true><<<(unsigned)blocks, K_GDN_COLS, full, st>>>(
            arena, slot_floats, S_off, seg_t0, seg_n, seg_slot, H, HV, K, Vd, q, k, v, decay, beta,
            o);
    else if (io <= K_GDN_SMEM_MAX)
        k_gdn_delta_kernel<false><<<(unsigned)blocks, K_GDN_COLS, io, st>>>(
            arena, slot_floats, S_off, seg_t0, seg_n, seg_slot, H, HV, K, Vd, q, k, v, decay, beta,
            o);
    else
        return (int)cudaErrorInvalidValue;
    return k_launch_end();
}

/* one block per (token, value head); each thread touches only its own elements */
static __global__ void
k_gdn_onorm_kernel(float *o, const float *g, uint32_t Vd, const float *w, double eps)
{
    __shared__ double sh[32];
    const size_t base = (size_t)blockIdx.x * Vd; /* rows are HV * Vd: (t, j) is row t*HV + j */
    float *x = o + base;
    double s = 0.0;
    for (uint32_t i = threadIdx.x; i < Vd; i += blockDim.x)
        s += (double)x[i] * x[i];
    s = kd_block_sum_d(s, sh);
    const float inv = (float)(1.0 / sqrt(s / Vd + eps));
    for (uint32_t i = threadIdx.x; i < Vd; i += blockDim.x) {
        float y = x[i] * inv * w[i];
        if (g != NULL)
            y *= kd_silu(g[base + i]);
        x[i] = y;
    }
}

extern "C" int
k_gdn_onorm(float *o, const float *g, uint32_t T, uint32_t HV, uint32_t Vd, const float *w,
            double eps, void *stream)
{
    k_launch_begin();
    if (T == 0 || HV == 0 || Vd == 0)
        return (int)cudaSuccess;
    if ((size_t)T * HV > 0x7fffffffu)
        return (int)cudaErrorInvalidValue;
    k_gdn_onorm_kernel<<<T * HV, 128, 0, (cudaStream_t)stream>>>(o, g, Vd, w, eps);
    return k_launch_end();
}
