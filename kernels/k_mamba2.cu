/*
 * k_mamba2: the CUDA kernels of the Mamba2 step (be_cuda_mamba2.c drives
 * them; the math and stage order are be_cpu_mamba2.c's, the slot layout
 * wrk_mamba2.h's): the causal depthwise conv + SiLU over the slot's conv
 * state, the SSM scan over the slot's [H][P][N] state, and the gated
 * grouped RMSNorm.
 *
 * Recurrences run per (segment, channel) or (segment, head) with tokens in
 * order, each reduction in a fixed order, so a row's bits depend only on its
 * own tokens and state. Segments of one launch must name distinct slots
 * (the step's row checks guarantee it). Must never allocate or
 * synchronise: launchers only enqueue and return their own launch error (k_launch.cuh).
 */
#include "k_dev.cuh"
#include "k_launch.cuh"

#define K_M2_CONV_THREADS 128u /* channels per conv block */
#define K_M2_CONV_MAX_K 64u    /* longest conv kernel (family/wrk_mamba2.c, the CPU: 64) */
#define K_M2_SMEM_MAX 49152u   /* dynamic shared memory without an opt-in */

/* grid (ceil(CD / 128), n_segs): one thread per (segment, channel) */
static __global__ void
k_m2_conv_kernel(const float *xbc, size_t ldx, uint32_t CD, uint32_t K, const float *w,
                 const float *b, const uint32_t *seg_t0, const uint32_t *seg_n,
                 const uint32_t *seg_slot, float *arena, size_t slot_floats, size_t conv_off,
                 float *out)
{
    const uint32_t s = blockIdx.y;
    const uint32_t ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= CD)
        return;
    const uint32_t km = K - 1;
    float *hist = arena + (size_t)seg_slot[s] * slot_floats + conv_off + (size_t)ch * km;
    const float *wc = w + (size_t)ch * K;
    float win[K_M2_CONV_MAX_K];
    for (uint32_t j = 0; j < km; j++)
        win[j] = hist[j];
    const uint32_t t0 = seg_t0[s], t1 = t0 + seg_n[s];
    for (uint32_t t = t0; t < t1; t++) {
        win[km] = xbc[(size_t)t * ldx + ch];
        float acc = b[ch];
        for (uint32_t k = 0; k < K; k++)
            acc += wc[k] * win[k];
        out[(size_t)t * CD + ch] = kd_silu(acc);
        for (uint32_t j = 0; j < km; j++)
            win[j] = win[j + 1];
    }
    for (uint32_t j = 0; j < km; j++)
        hist[j] = win[j];
}

extern "C" int
k_mamba2_conv(const float *xbc, size_t ldx, uint32_t CD, uint32_t K, const float *w,
              const float *b, uint32_t n_segs, const uint32_t *seg_t0, const uint32_t *seg_n,
              const uint32_t *seg_slot, float *arena, size_t slot_floats, size_t conv_off,
              float *out, void *stream)
{
    k_launch_begin();
    if (n_segs == 0 || CD == 0)
        return (int)cudaSuccess;
    if (K < 2 || K > K_M2_CONV_MAX_K || n_segs > 65535u)
        return (int)cudaErrorInvalidValue;
    dim3 grid((CD + K_M2_CONV_THREADS - 1) / K_M2_CONV_THREADS, n_segs);
    k_m2_conv_kernel<<<grid, K_M2_CONV_THREADS, 0, (cudaStream_t)stream>>>(
        xbc, ldx, CD, K, w, b, seg_t0, seg_n, seg_slot, arena, slot_floats, conv_off, out);
    return k_launch_end();
}

/*
 * One block per (segment, head), K_THREADS threads: warp w owns the rows
 * p = w, w + n_warps, ..., lane l the columns n = l, l + 32, ... of S, so
 * the update is elementwise and y[p] is each lane's partial sum (n in
 * order) folded by a fixed xor butterfly. SM: the head's state lives in
 * shared memory for the segment (loaded once, stored once); else it is
 * updated in place in global memory. Dynamic shared memory: x [P], B [N],
 * C [N], then (SM) S [P][N].
 */
template <bool SM>
static __global__ void
k_m2_scan_kernel(float *arena, size_t slot_floats, size_t ssm_off, const uint32_t *seg_t0,
                 const uint32_t *seg_n, const uint32_t *seg_slot, uint32_t H, uint32_t P,
                 uint32_t N, uint32_t G, const float *xbc, uint32_t CD, const float *dt_raw,
                 size_t ld_dt, const float *dt_bias, const float *A, const float *D, float *y)
{
    extern __shared__ float sh[];
    float *sx = sh, *sB = sh + P, *sC = sh + P + N;
    const uint32_t seg = blockIdx.x / H, h = blockIdx.x % H, g = h / (H / G);
    const uint32_t DI = H * P, PN = P * N;
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    float *Sg = arena + (size_t)seg_slot[seg] * slot_floats + ssm_off + (size_t)h * PN;
    float *S = SM ? sh + P + 2 * N : Sg;
    if (SM)
        for (uint32_t i = threadIdx.x; i < PN; i += blockDim.x)
            S[i] = Sg[i];
    const float Ah = A[h], Dh = D[h], dtb = dt_bias[h];
    const uint32_t t0 = seg_t0[seg], t1 = t0 + seg_n[seg];
    for (uint32_t t = t0; t < t1; t++) {
        const float *row = xbc + (size_t)t * CD;
        for (uint32_t i = threadIdx.x; i < P; i += blockDim.x)
            sx[i] = row[(size_t)h * P + i];
        for (uint32_t i = threadIdx.x; i < N; i += blockDim.x) {
            sB[i] = row[DI + (size_t)g * N + i];
            sC[i] = row[DI + (size_t)G * N + (size_t)g * N + i];
        }
        __syncthreads(); /* inputs (and the loaded state) visible */
        const float dt = kd_softplus(dt_raw[(size_t)t * ld_dt + h] + dtb);
        const float dA = expf(dt * Ah);
        for (uint32_t p = warp; p < P; p += n_warps) {
            float *s = S + (size_t)p * N;
            const float xd = sx[p] * dt;
            float acc = 0.0f;
            for (uint32_t n = lane; n < N; n += 32) {
                const float v = s[n] * dA + xd * sB[n];
                s[n] = v;
                acc += v * sC[n];
            }
            acc = kd_warp_sum(acc);
            if (lane == 0)
                y[(size_t)t * DI + (size_t)h * P + p] = acc + Dh * sx[p];
        }
        __syncthreads(); /* done with the inputs (and S rows) before the next token */
    }
    if (SM)
        for (uint32_t i = threadIdx.x; i < PN; i += blockDim.x)
            Sg[i] = S[i];
}

extern "C" int
k_mamba2_scan(float *arena, size_t slot_floats, size_t ssm_off, uint32_t n_segs,
              const uint32_t *seg_t0, const uint32_t *seg_n, const uint32_t *seg_slot, uint32_t H,
              uint32_t P, uint32_t N, uint32_t G, const float *xbc, uint32_t CD,
              const float *dt_raw, size_t ld_dt, const float *dt_bias, const float *A,
              const float *D, float *y, void *stream)
{
    k_launch_begin();
    if (n_segs == 0 || H == 0)
        return (int)cudaSuccess;
    if (P == 0 || N == 0 || G == 0 || H % G != 0 || (size_t)n_segs * H > 0x7fffffffu ||
        (size_t)H * P + 2 * (size_t)G * N > CD)
        return (int)cudaErrorInvalidValue;
    cudaStream_t st = (cudaStream_t)stream;
    const size_t io = ((size_t)P + 2 * (size_t)N) * sizeof(float);
    const size_t full = io + (size_t)P * N * sizeof(float);
    const unsigned blocks = n_segs * H;
    if (full <= K_M2_SMEM_MAX)
        k_m2_scan_kernel<true><<<blocks, K_THREADS, full, st>>>(
            arena, slot_floats, ssm_off, seg_t0, seg_n, seg_slot, H, P, N, G, xbc, CD, dt_raw,
            ld_dt, dt_bias, A, D, y);
    else if (io <= K_M2_SMEM_MAX)
        k_m2_scan_kernel<false><<<blocks, K_THREADS, io, st>>>(
            arena, slot_floats, ssm_off, seg_t0, seg_n, seg_slot, H, P, N, G, xbc, CD, dt_raw,
            ld_dt, dt_bias, A, D, y);
    else
        return (int)cudaErrorInvalidValue;
    return k_launch_end();
}

/* one block per (token, group); each thread touches only its own elements */
static __global__ void
k_m2_gate_norm_kernel(float *y, const float *z, size_t ldz, uint32_t DI, uint32_t G,
                      const float *w, double eps)
{
    __shared__ double sh[32];
    const uint32_t t = blockIdx.x / G, g = blockIdx.x % G, gs = DI / G;
    float *yr = y + (size_t)t * DI + (size_t)g * gs;
    const float *zr = z + (size_t)t * ldz + (size_t)g * gs;
    const float *wg = w + (size_t)g * gs;
    double s = 0.0;
    for (uint32_t i = threadIdx.x; i < gs; i += blockDim.x) {
        const float v = yr[i] * kd_silu(zr[i]);
        yr[i] = v;
        s += (double)v * v;
    }
    s = kd_block_sum_d(s, sh);
    const float inv = (float)(1.0 / sqrt(s / gs + eps));
    for (uint32_t i = threadIdx.x; i < gs; i += blockDim.x)
        yr[i] = yr[i] * inv * wg[i];
}

extern "C" int
k_mamba2_gate_norm(float *y, const float *z, size_t ldz, uint32_t T, uint32_t DI, uint32_t G,
                   const float *w, double eps, void *stream)
{
    k_launch_begin();
    if (T == 0 || DI == 0)
        return (int)cudaSuccess;
    if (G == 0 || DI % G != 0 || (size_t)T * G > 0x7fffffffu)
        return (int)cudaErrorInvalidValue;
    k_m2_gate_norm_kernel<<<T * G, K_THREADS, 0, (cudaStream_t)stream>>>(y, z, ldz, DI, G, w,
                                                                        eps);
    return k_launch_end();
}
