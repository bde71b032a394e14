/*
 * be_cpu_mamba2: the CPU backend's Mamba2 layer kind (be_cpu_mamba2.h): the
 * causal conv, the scan and the gated norm that the layer-list pass
 * (be_cpu_gdn.c) runs for every MAMBA2 mixer, the pure Mamba2 family's
 * layers included (wrk_mamba2_layer_list). Math and slot layout:
 * wrk_mamba2.h.
 *
 * Batch invariance: every value of a token is computed by the same code
 * from that token's (and its row's earlier tokens') data with a fixed
 * reduction order: the conv sums k = 0..K-1 from the bias, the scan's
 * y = S C uses 16 partial sums combined in a fixed tree (the same bits on
 * every ISA path: nothing is fused). So a row's bits do not depend on the
 * other rows, on how its prefill is split into chunks or passes, or on the
 * thread count.
 *
 * Must never: log, abort.
 */
#include <math.h>
#include <string.h>

#include "be_cpu_mamba2.h"

#define M2_SOFTPLUS_MAX 20.0f /* softplus(x) = x above this (torch's threshold) */

static inline float
m2_silu(float x)
{
    return x / (1.0f + expf(-x));
}

static inline float
m2_softplus(float x)
{
    return x > M2_SOFTPLUS_MAX ? x : log1pf(expf(x));
}

/*
 * One token of one head's scan: for p < P, n < N
 *   S[p][n] = S[p][n] * dA + (x[p] * dt) * B[n],  y[p] = sum_n S[p][n] C[n] + Dh x[p].
 * The sum uses 16 partial sums (n mod 16) combined in a fixed tree, then the
 * tail n >= N & ~15 in order; no operation is fused (ISO C contracts
 * nothing), so the vector width the compiler picks for each ISA clone below
 * never changes a bit.
 */
static inline __attribute__((always_inline)) void
m2_scan_token(uint32_t P, uint32_t N, float *restrict S, const float *restrict x,
              const float *restrict B, const float *restrict Cv, float dt, float dA, float Dh,
              float *restrict y)
{
    const uint32_t n16 = N & ~15u;
    for (uint32_t p = 0; p < P; p++) {
        float *s = S + (size_t)p * N;
        const float xd = x[p] * dt;
        float acc[16] = {0};
        for (uint32_t n = 0; n < n16; n += 16)
            for (uint32_t j = 0; j < 16; j++) {
                const float v = s[n + j] * dA + xd * B[n + j];
                s[n + j] = v;
                acc[j] += v * Cv[n + j];
            }
        float tail = 0.0f;
        for (uint32_t n = n16; n < N; n++) {
            const float v = s[n] * dA + xd * B[n];
            s[n] = v;
            tail += v * Cv[n];
        }
        for (uint32_t j = 0; j < 8; j++)
            acc[j] += acc[j + 8];
        const float dot =
            ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
        y[p] = (dot + tail) + Dh * x[p];
    }
}

static void
m2_scan_token_base(uint32_t P, uint32_t N, float *S, const float *x, const float *B,
                   const float *Cv, float dt, float dA, float Dh, float *y)
{
    m2_scan_token(P, N, S, x, B, Cv, dt, dA, Dh, y);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static void
m2_scan_token_avx2(uint32_t P, uint32_t N, float *S, const float *x, const float *B,
                   const float *Cv, float dt, float dA, float Dh, float *y)
{
    m2_scan_token(P, N, S, x, B, Cv, dt, dA, Dh, y);
}

__attribute__((target("avx512f"))) static void
m2_scan_token_avx512(uint32_t P, uint32_t N, float *S, const float *x, const float *B,
                     const float *Cv, float dt, float dA, float Dh, float *y)
{
    m2_scan_token(P, N, S, x, B, Cv, dt, dA, Dh, y);
}
#endif

be_cpu_m2_scan_fn
be_cpu_m2_scan_pick(be_cpu_isa isa)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (isa == BE_CPU_ISA_AVX512)
        return m2_scan_token_avx512;
    if (isa == BE_CPU_ISA_AVX2)
        return m2_scan_token_avx2;
#endif
    (void)isa;
    return m2_scan_token_base;
}

void
be_cpu_m2_conv(const be_cpu_m2_dims *m, const be_cpu_m2_vecs *v, const float *proj, float *xbc,
               uint32_t t0, uint32_t n, float *state, uint32_t c0, uint32_t c1)
{
    const uint32_t K = m->K, km = m->K - 1;
    float win[64]; /* K <= 64 (checked at open) */

    for (uint32_t ch = c0; ch < c1; ch++) {
        const float *w = v->conv_w + (size_t)ch * K;
        float *hist = state + (size_t)ch * km;
        memcpy(win, hist, sizeof(float) * km);
        for (uint32_t t = t0; t < t0 + n; t++) {
            win[km] = proj[(size_t)t * m->DIP + m->DI + ch];
            float acc = v->conv_b[ch];
            for (uint32_t k = 0; k < K; k++)
                acc += w[k] * win[k];
            xbc[(size_t)t * m->CD + ch] = m2_silu(acc);
            for (uint32_t k = 0; k < km; k++) /* a few floats: no memmove call */
                win[k] = win[k + 1];
        }
        memcpy(hist, win, sizeof(float) * km);
    }
}

void
be_cpu_m2_scan(const be_cpu_m2_dims *m, const be_cpu_m2_vecs *v, be_cpu_m2_scan_fn scan,
               const float *proj, const float *xbc, float *y, uint32_t t0, uint32_t n, float *ssm,
               uint32_t h)
{
    const uint32_t P = m->P, N = m->N;
    const uint32_t g = h / (m->H / m->G);
    float *S = ssm + (size_t)h * P * N;
    const float A = v->A[h], Dh = v->D[h], dtb = v->dt_bias[h];

    for (uint32_t t = t0; t < t0 + n; t++) {
        const float *xt = xbc + (size_t)t * m->CD;
        const float *x = xt + (size_t)h * P;
        const float *B = xt + m->DI + (size_t)g * N;
        const float *Cv = xt + m->DI + (size_t)m->G * N + (size_t)g * N;
        const float dt = m2_softplus(proj[(size_t)t * m->DIP + m->DI + m->CD + h] + dtb);
        const float dA = expf(dt * A);
        scan(P, N, S, x, B, Cv, dt, dA, Dh, y + (size_t)t * m->DI + (size_t)h * P);
    }
}

void
be_cpu_m2_gate(const be_cpu_m2_dims *m, const be_cpu_m2_vecs *v, const float *proj, float *y,
               uint32_t t)
{
    const uint32_t gs = m->DI / m->G;
    float *yt = y + (size_t)t * m->DI;
    const float *z = proj + (size_t)t * m->DIP;
    for (uint32_t i = 0; i < m->DI; i++)
        yt[i] *= m2_silu(z[i]);
    for (uint32_t g = 0; g < m->G; g++)
        be_cpu_rmsnorm(yt + (size_t)g * gs, v->gnorm + (size_t)g * gs, gs, m->eps,
                       yt + (size_t)g * gs);
}
