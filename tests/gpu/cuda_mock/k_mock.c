/*
 * k_mock: the kernels/k.h launchers emulated in C on host memory (with
 * cuda_mock.c), each a loop over what the CUDA kernel's threads compute,
 * with the launchers' own argument checks. What this checks is the host
 * side of the CUDA backend (sizes, offsets, strides, the order of the
 * launches) against the CPU backend; the CUDA kernel bodies themselves are
 * not run.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "k.h"

enum { OK = 0, BAD = 1 }; /* cudaSuccess, cudaErrorInvalidValue */

static float
m_silu(float x)
{
    return x / (1.0f + expf(-x));
}

static float
m_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static float
m_softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

static float
m_load(const void *p, int dtype, size_t i)
{
    if (dtype == K_DT_BF16) {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    if (dtype == K_DT_F16) {
        _Float16 h;
        memcpy(&h, (const uint16_t *)p + i, 2);
        return (float)h;
    }
    return ((const float *)p)[i];
}

/* round to nearest even bf16 / f16 bits */
static uint16_t
m_to16(float v, int dtype, float *back)
{
    if (dtype == K_DT_BF16) {
        uint32_t u;
        memcpy(&u, &v, 4);
        u += 0x7fffu + ((u >> 16) & 1u);
        uint16_t h = (uint16_t)(u >> 16);
        uint32_t b = (uint32_t)h << 16;
        memcpy(back, &b, 4);
        return h;
    }
    _Float16 h = (_Float16)v;
    uint16_t bits;
    memcpy(&bits, &h, 2);
    *back = (float)h;
    return bits;
}

/* ------------------------------------------------------------------------ */
/* GEMM helpers (k_rwkv7.cu)                                                 */
/* ------------------------------------------------------------------------ */

int
k_split16(const float *x, uint32_t T, uint32_t K, int dtype, uint16_t *out, float *inv_scale,
          void *stream)
{
    (void)stream;
    if (dtype != K_DT_BF16 && dtype != K_DT_F16)
        return BAD;
    for (size_t t = 0; t < T; t++) {
        const float *row = x + t * K;
        float m = 0.0f;
        for (uint32_t i = 0; i < K; i++)
            m = fmaxf(m, fabsf(row[i]));
        int sh = 0;
        if (m > 0.0f && isfinite(m)) {
            int e;
            (void)frexpf(m, &e);
            sh = 14 - e;
            sh = sh > 100 ? 100 : sh < -100 ? -100 : sh;
        }
        const float s = ldexpf(1.0f, sh);
        uint16_t *hi = out + t * K, *lo = out + ((size_t)T + t) * K;
        for (uint32_t i = 0; i < K; i++) {
            const float v = row[i] * s;
            float hb, lb;
            hi[i] = m_to16(v, dtype, &hb);
            lo[i] = m_to16(v - hb, dtype, &lb);
        }
        inv_scale[t] = ldexpf(1.0f, -sh);
    }
    return OK;
}

int
k_gemm_epi(const float *y, uint32_t T, uint32_t N, int split, const float *inv_scale, int epi,
           float *dst, size_t ldd, void *stream)
{
    (void)stream;
    for (size_t t = 0; t < T; t++)
        for (size_t n = 0; n < N; n++) {
            float acc = y[t * N + n];
            if (split)
                acc += y[((size_t)T + t) * N + n];
            if (inv_scale != NULL)
                acc *= inv_scale[t];
            float *o = dst + t * ldd + n;
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
                *o = m_sigmoid(acc);
                break;
            default:
                *o = acc;
                break;
            }
        }
    return OK;
}

/* ------------------------------------------------------------------------ */
/* RWKV-7 (k_rwkv7.cu)                                                       */
/* ------------------------------------------------------------------------ */

#define M_DECAY_SCALE 0.6065306597126334f /* exp(-0.5), the kernel's */

/* LayerNorm of one row of C (k_ln_row); out may alias in. */
static void
m_ln_row(const float *in, float *out, uint32_t C, const float *w, const float *b, float eps)
{
    float s = 0.0f;
    for (uint32_t i = 0; i < C; i++)
        s += in[i];
    const float mean = s / (float)C;
    float q = 0.0f;
    for (uint32_t i = 0; i < C; i++) {
        const float dd = in[i] - mean;
        q += dd * dd;
    }
    const float inv = 1.0f / sqrtf(q / (float)C + eps);
    for (uint32_t i = 0; i < C; i++)
        out[i] = (in[i] - mean) * inv * w[i] + b[i];
}

int
k_rwkv7_embed(const void *emb, int dtype, const uint32_t *tok, uint32_t T, uint32_t C,
              const float *w, const float *b, float eps, float *x, void *stream)
{
    (void)stream;
    for (size_t t = 0; t < T; t++) {
        float *row = x + t * C;
        for (size_t i = 0; i < C; i++)
            row[i] = m_load(emb, dtype, (size_t)tok[t] * C + i);
        m_ln_row(row, row, C, w, b, eps);
    }
    return OK;
}

int
k_layernorm_rows(const float *x, const uint32_t *idx, uint32_t n, uint32_t C, const float *w,
                 const float *b, float eps, float *y, void *stream)
{
    (void)stream;
    if (y == x)
        return BAD; /* y must not alias x */
    for (size_t r = 0; r < n; r++)
        m_ln_row(x + (size_t)(idx != NULL ? idx[r] : r) * C, y + r * C, C, w, b, eps);
    return OK;
}

int
k_rwkv7_shift_mix(const float *xln, uint32_t T, uint32_t C, const uint32_t *tseg,
                  const uint32_t *seg_t0, const uint32_t *seg_slot, const float *arena,
                  size_t slot_floats, size_t shift_off, const float *mix, uint32_t n_mix,
                  float *out, size_t out_stride, void *stream)
{
    (void)stream;
    if (T > 65535u)
        return BAD;
    for (uint32_t t = 0; t < T; t++) {
        const uint32_t s = tseg[t];
        for (uint32_t i = 0; i < C; i++) {
            const float x = xln[(size_t)t * C + i];
            const float prev = t > seg_t0[s]
                                   ? xln[(size_t)(t - 1) * C + i]
                                   : arena[(size_t)seg_slot[s] * slot_floats + shift_off + i];
            for (uint32_t j = 0; j < n_mix; j++)
                out[j * out_stride + (size_t)t * C + i] = x + (prev - x) * mix[(size_t)j * C + i];
        }
    }
    return OK;
}

int
k_rwkv7_save_shift(const float *xln, uint32_t C, uint32_t n_segs, const uint32_t *seg_t0,
                   const uint32_t *seg_n, const uint32_t *seg_slot, float *arena,
                   size_t slot_floats, size_t shift_off, void *stream)
{
    (void)stream;
    if (n_segs > 65535u)
        return BAD;
    for (uint32_t s = 0; s < n_segs; s++) {
        const size_t last = (size_t)seg_t0[s] + seg_n[s] - 1;
        memcpy(arena + (size_t)seg_slot[s] * slot_floats + shift_off, xln + last * C,
               sizeof(float) * C);
    }
    return OK;
}

int
k_rwkv7_att(uint32_t T, uint32_t C, uint32_t H, uint32_t N, int layer0, const float *w0,
            const float *a0, const float *v0, const float *k_k, const float *k_a, float *dw,
            float *da, const float *dv, float *kk, float *k, float *v, float *vf, void *stream)
{
    (void)stream;
    if (T > 65535u || (size_t)H * N != C)
        return BAD;
    for (size_t t = 0; t < T; t++)
        for (size_t h = 0; h < H; h++) {
            const size_t hc = h * N, base = t * C + hc;
            float ss = 0.0f;
            for (size_t j = 0; j < N; j++) {
                const float q = k[base + j] * k_k[hc + j];
                ss += q * q;
            }
            const float nrm = fmaxf(sqrtf(ss), 1e-12f);
            for (size_t j = 0; j < N; j++) {
                const size_t i = hc + j, o = base + j;
                const float ic = m_sigmoid(a0[i] + da[o]);
                const float kv = k[o];
                const float kn = kv * k_k[i] / nrm;
                dw[o] = expf(-M_DECAY_SCALE * m_sigmoid(w0[i] + dw[o]));
                k[o] = kv * (1.0f + (ic - 1.0f) * k_a[i]);
                da[o] = kn * ic;
                kk[o] = -kn;
                if (layer0)
                    vf[o] = v[o];
                else
                    v[o] = v[o] + (vf[o] - v[o]) * m_sigmoid(v0[i] + dv[o]);
            }
        }
    return OK;
}

int
k_rwkv7_wkv(float *arena, size_t slot_floats, size_t state_off, uint32_t n_segs,
            const uint32_t *seg_t0, const uint32_t *seg_n, const uint32_t *seg_slot, uint32_t H,
            uint32_t N, uint32_t C, const float *r, const float *w, const float *k, const float *v,
            const float *a, const float *b, const float *g, const float *r_k, const float *lnx_w,
            const float *lnx_b, float gn_eps, float *y, void *stream)
{
    (void)stream;
    if (N == 0 || N > 1024 || (size_t)H * N != C)
        return BAD;
    float yh[1024];
    for (uint32_t seg = 0; seg < n_segs; seg++)
        for (size_t h = 0; h < H; h++) {
            const size_t hc = h * N;
            float *S = arena + (size_t)seg_slot[seg] * slot_floats + state_off + hc * N;
            for (size_t t = seg_t0[seg]; t < (size_t)seg_t0[seg] + seg_n[seg]; t++) {
                const size_t o = t * C + hc;
                for (size_t i = 0; i < N; i++) { /* value index i: row i of S */
                    float *Si = S + i * N;
                    float sav = 0.0f;
                    for (size_t j = 0; j < N; j++)
                        sav += Si[j] * a[o + j];
                    float yi = 0.0f;
                    for (size_t j = 0; j < N; j++) {
                        const float nv = Si[j] * w[o + j] + (sav * b[o + j] + v[o + i] * k[o + j]);
                        Si[j] = nv;
                        yi += nv * r[o + j];
                    }
                    yh[i] = yi;
                }
                float mean = 0.0f, var = 0.0f, bonus = 0.0f;
                for (size_t j = 0; j < N; j++)
                    mean += yh[j];
                mean /= (float)N;
                for (size_t j = 0; j < N; j++)
                    var += (yh[j] - mean) * (yh[j] - mean);
                var /= (float)N;
                for (size_t j = 0; j < N; j++)
                    bonus += r[o + j] * k[o + j] * r_k[hc + j];
                for (size_t i = 0; i < N; i++) {
                    const float yn = (yh[i] - mean) * (1.0f / sqrtf(var + gn_eps)) * lnx_w[hc + i] +
                                     lnx_b[hc + i];
                    y[o + i] = (yn + bonus * v[o + i]) * g[o + i];
                }
            }
        }
    return OK;
}

/* ------------------------------------------------------------------------ */
/* k_common.cu                                                               */
/* ------------------------------------------------------------------------ */

int
k_embed_rows(const void *emb, int dtype, const uint32_t *tok, uint32_t T, uint32_t C, float *x,
             void *stream)
{
    (void)stream;
    if (T > 65535u)
        return BAD;
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < C; i++)
            x[t * C + i] = m_load(emb, dtype, (size_t)tok[t] * C + i);
    return OK;
}

int
k_rmsnorm_rows(const float *x, const uint32_t *idx, uint32_t n, uint32_t D, const float *w,
               double eps, float *y, void *stream)
{
    (void)stream;
    for (size_t r = 0; r < n; r++) {
        const float *in = x + (idx != NULL ? (size_t)idx[r] : r) * D;
        float *out = y + r * D;
        double s = 0.0;
        for (uint32_t i = 0; i < D; i++)
            s += (double)in[i] * in[i];
        const float inv = (float)(1.0 / sqrt(s / D + eps));
        for (uint32_t i = 0; i < D; i++)
            out[i] = w != NULL ? in[i] * inv * w[i] : in[i] * inv;
    }
    return OK;
}

int
k_swiglu(float *g, const float *u, size_t n, void *stream)
{
    (void)stream;
    for (size_t i = 0; i < n; i++)
        g[i] = m_silu(g[i]) * u[i];
    return OK;
}

/* ------------------------------------------------------------------------ */
/* k_mamba2.cu                                                               */
/* ------------------------------------------------------------------------ */

int
k_mamba2_conv(const float *xbc, size_t ldx, uint32_t CD, uint32_t K, const float *w, const float *b,
              uint32_t n_segs, const uint32_t *seg_t0, const uint32_t *seg_n,
              const uint32_t *seg_slot, float *arena, size_t slot_floats, size_t conv_off,
              float *out, void *stream)
{
    (void)stream;
    if (K < 2 || K > 64 || n_segs > 65535u)
        return BAD;
    const uint32_t km = K - 1;
    for (uint32_t s = 0; s < n_segs; s++)
        for (uint32_t ch = 0; ch < CD; ch++) {
            float *hist = arena + (size_t)seg_slot[s] * slot_floats + conv_off + (size_t)ch * km;
            const float *wc = w + (size_t)ch * K;
            float win[64];
            for (uint32_t j = 0; j < km; j++)
                win[j] = hist[j];
            for (uint32_t t = seg_t0[s]; t < seg_t0[s] + seg_n[s]; t++) {
                win[km] = xbc[(size_t)t * ldx + ch];
                float acc = b[ch];
                for (uint32_t k = 0; k < K; k++)
                    acc += wc[k] * win[k];
                out[(size_t)t * CD + ch] = m_silu(acc);
                for (uint32_t j = 0; j < km; j++)
                    win[j] = win[j + 1];
            }
            for (uint32_t j = 0; j < km; j++)
                hist[j] = win[j];
        }
    return OK;
}

int
k_mamba2_scan(float *arena, size_t slot_floats, size_t ssm_off, uint32_t n_segs,
              const uint32_t *seg_t0, const uint32_t *seg_n, const uint32_t *seg_slot, uint32_t H,
              uint32_t P, uint32_t N, uint32_t G, const float *xbc, uint32_t CD,
              const float *dt_raw, size_t ld_dt, const float *dt_bias, const float *A,
              const float *D, float *y, void *stream)
{
    (void)stream;
    if (n_segs == 0 || H == 0)
        return OK;
    if (P == 0 || N == 0 || G == 0 || H % G != 0 || (size_t)H * P + 2 * (size_t)G * N > CD ||
        ((size_t)P + 2 * (size_t)N) * 4 > 49152u)
        return BAD;
    const uint32_t DI = H * P;
    for (uint32_t seg = 0; seg < n_segs; seg++)
        for (uint32_t h = 0; h < H; h++) {
            const uint32_t g = h / (H / G);
            float *S = arena + (size_t)seg_slot[seg] * slot_floats + ssm_off + (size_t)h * P * N;
            for (uint32_t t = seg_t0[seg]; t < seg_t0[seg] + seg_n[seg]; t++) {
                const float *row = xbc + (size_t)t * CD;
                const float *x = row + (size_t)h * P, *B = row + DI + (size_t)g * N;
                const float *Cv = row + DI + (size_t)G * N + (size_t)g * N;
                const float dt = m_softplus(dt_raw[(size_t)t * ld_dt + h] + dt_bias[h]);
                const float dA = expf(dt * A[h]);
                for (uint32_t p = 0; p < P; p++) {
                    float *s = S + (size_t)p * N;
                    const float xd = x[p] * dt;
                    float acc = 0.0f;
                    for (uint32_t n = 0; n < N; n++) {
                        const float v = s[n] * dA + xd * B[n];
                        s[n] = v;
                        acc += v * Cv[n];
                    }
                    y[(size_t)t * DI + (size_t)h * P + p] = acc + D[h] * x[p];
                }
            }
        }
    return OK;
}

int
k_mamba2_gate_norm(float *y, const float *z, size_t ldz, uint32_t T, uint32_t DI, uint32_t G,
                   const float *w, double eps, void *stream)
{
    (void)stream;
    if (T == 0 || DI == 0)
        return OK;
    if (G == 0 || DI % G != 0)
        return BAD;
    const uint32_t gs = DI / G;
    for (size_t t = 0; t < T; t++)
        for (uint32_t g = 0; g < G; g++) {
            float *yr = y + t * DI + (size_t)g * gs;
            const float *zr = z + t * ldz + (size_t)g * gs;
            double s = 0.0;
            for (uint32_t i = 0; i < gs; i++) {
                yr[i] = yr[i] * m_silu(zr[i]);
                s += (double)yr[i] * yr[i];
            }
            const float inv = (float)(1.0 / sqrt(s / gs + eps));
            for (uint32_t i = 0; i < gs; i++)
                yr[i] = yr[i] * inv * w[(size_t)g * gs + i];
        }
    return OK;
}

/* ------------------------------------------------------------------------ */
/* k_gdn.cu                                                                  */
/* ------------------------------------------------------------------------ */

int
k_gdn_conv(const float *raw, uint32_t D, uint32_t W, const float *taps, uint32_t n_segs,
           const uint32_t *seg_t0, const uint32_t *seg_n, const uint32_t *seg_slot, float *arena,
           size_t slot_floats, size_t hist_off, float *out, void *stream)
{
    (void)stream;
    if (n_segs == 0 || D == 0)
        return OK;
    if (W < 2 || W > 64 || n_segs > 65535u)
        return BAD;
    const uint32_t wm = W - 1;
    for (uint32_t s = 0; s < n_segs; s++)
        for (uint32_t d = 0; d < D; d++) {
            float *hist = arena + (size_t)seg_slot[s] * slot_floats + hist_off + d;
            const float *tp = taps + (size_t)d * W;
            float win[64];
            for (uint32_t j = 0; j < wm; j++)
                win[j] = hist[(size_t)j * D];
            for (uint32_t t = seg_t0[s]; t < seg_t0[s] + seg_n[s]; t++) {
                win[wm] = raw[(size_t)t * D + d];
                float acc = 0.0f;
                for (uint32_t j = 0; j < W; j++)
                    acc += tp[j] * win[j];
                out[(size_t)t * D + d] = m_silu(acc);
                for (uint32_t j = 0; j < wm; j++)
                    win[j] = win[j + 1];
            }
            for (uint32_t j = 0; j < wm; j++)
                hist[(size_t)j * D] = win[j];
        }
    return OK;
}

int
k_gdn_l2norm(float *x, uint32_t T, uint32_t H, uint32_t K, float scale, void *stream)
{
    (void)stream;
    for (size_t r = 0; r < (size_t)T * H; r++) {
        float *v = x + r * K;
        double s = 0.0;
        for (uint32_t i = 0; i < K; i++)
            s += (double)v[i] * v[i];
        const float inv = (float)(1.0 / sqrt(s + 1e-6)) * scale;
        for (uint32_t i = 0; i < K; i++)
            v[i] *= inv;
    }
    return OK;
}

int
k_gdn_gates(float *a, float *b, size_t n, uint32_t HV, const float *neg_A, const float *dt_bias,
            float beta_scale, void *stream)
{
    (void)stream;
    if (n > 0 && HV == 0)
        return BAD;
    for (size_t i = 0; i < n; i++) {
        const uint32_t j = (uint32_t)(i % HV);
        a[i] = expf(neg_A[j] * m_softplus(a[i] + dt_bias[j]));
        b[i] = m_sigmoid(b[i]) * beta_scale;
    }
    return OK;
}

int
k_gdn_delta(float *arena, size_t slot_floats, size_t S_off, uint32_t n_segs, const uint32_t *seg_t0,
            const uint32_t *seg_n, const uint32_t *seg_slot, uint32_t H, uint32_t HV, uint32_t K,
            uint32_t Vd, const float *q, const float *k, const float *v, const float *decay,
            const float *beta, float *o, void *stream)
{
    (void)stream;
    if (n_segs == 0 || HV == 0)
        return OK;
    if (H == 0 || K == 0 || Vd == 0 || HV % H != 0 || 2 * (size_t)K * 4 > 49152u)
        return BAD;
    const size_t KD = (size_t)H * K, VD = (size_t)HV * Vd;
    for (uint32_t seg = 0; seg < n_segs; seg++)
        for (uint32_t j = 0; j < HV; j++)
            for (uint32_t col = 0; col < Vd; col++) {
                const uint32_t kh = j / (HV / H);
                float *Sc =
                    arena + (size_t)seg_slot[seg] * slot_floats + S_off + (size_t)j * K * Vd + col;
                for (uint32_t t = seg_t0[seg]; t < seg_t0[seg] + seg_n[seg]; t++) {
                    const float *sq = q + (size_t)t * KD + (size_t)kh * K;
                    const float *sk = k + (size_t)t * KD + (size_t)kh * K;
                    const float dec = decay[(size_t)t * HV + j], bt = beta[(size_t)t * HV + j];
                    const float vi = v[(size_t)t * VD + (size_t)j * Vd + col];
                    float kv = 0.0f;
                    for (uint32_t r = 0; r < K; r++) {
                        const float s = Sc[(size_t)r * Vd] * dec;
                        Sc[(size_t)r * Vd] = s;
                        kv = kv + s * sk[r];
                    }
                    const float u = (vi - kv) * bt;
                    float acc = 0.0f;
                    for (uint32_t r = 0; r < K; r++) {
                        const float s = Sc[(size_t)r * Vd] + u * sk[r];
                        Sc[(size_t)r * Vd] = s;
                        acc = acc + s * sq[r];
                    }
                    o[(size_t)t * VD + (size_t)j * Vd + col] = acc;
                }
            }
    return OK;
}

int
k_gdn_onorm(float *o, const float *g, uint32_t T, uint32_t HV, uint32_t Vd, const float *w,
            double eps, void *stream)
{
    (void)stream;
    for (size_t r = 0; r < (size_t)T * HV; r++) {
        float *x = o + r * Vd;
        double s = 0.0;
        for (uint32_t i = 0; i < Vd; i++)
            s += (double)x[i] * x[i];
        const float inv = (float)(1.0 / sqrt(s / Vd + eps));
        for (uint32_t i = 0; i < Vd; i++) {
            float y = x[i] * inv * w[i];
            if (g != NULL)
                y *= m_silu(g[r * Vd + i]);
            x[i] = y;
        }
    }
    return OK;
}

/* ------------------------------------------------------------------------ */
/* k_attn.cu                                                                 */
/* ------------------------------------------------------------------------ */

static size_t
m_tok(const uint32_t *pg, uint32_t j, uint32_t PT, size_t tok_floats)
{
    return ((size_t)pg[j / PT] * PT + j % PT) * tok_floats;
}

int
k_add_rows(float *x, const float *b, uint32_t T, uint32_t N, void *stream)
{
    (void)stream;
    for (size_t i = 0; i < (size_t)T * N; i++)
        x[i] += b[i % N];
    return OK;
}

int
k_attn_rope_store(float *q, float *k, const float *v, uint32_t T, uint32_t Hq, uint32_t Hkv,
                  uint32_t D, uint32_t R, const double *inv_freq, const uint32_t *tseg,
                  const uint32_t *seg_t0, const uint32_t *seg_pos, const uint32_t *seg_pg,
                  const uint32_t *pages, float *pool, uint32_t PT, size_t tok_floats, size_t kv_off,
                  void *stream)
{
    (void)stream;
    if (T == 0)
        return OK;
    if (D == 0 || D % 2 != 0 || R % 2 != 0 || R > D || Hkv == 0 || PT == 0)
        return BAD;
    const uint32_t half = R / 2;
    for (uint32_t t = 0; t < T; t++) {
        const uint32_t s = tseg[t], pos = seg_pos[s] + (t - seg_t0[s]);
        for (uint32_t hh = 0; hh < Hq + Hkv; hh++)
            for (uint32_t i = 0; i < half; i++) {
                const double ang = (double)pos * inv_freq[i];
                const float cs = (float)cos(ang), sn = (float)sin(ang);
                float *p =
                    hh < Hq ? q + ((size_t)t * Hq + hh) * D : k + ((size_t)t * Hkv + (hh - Hq)) * D;
                const float x1 = p[i], x2 = p[i + half];
                p[i] = x1 * cs - x2 * sn;
                p[i + half] = x1 * sn + x2 * cs;
            }
        const size_t KVD = (size_t)Hkv * D;
        float *dst = pool + m_tok(pages + seg_pg[s], pos, PT, tok_floats) + kv_off;
        for (size_t i = 0; i < KVD; i++) {
            dst[i] = k[(size_t)t * KVD + i];
            dst[KVD + i] = v[(size_t)t * KVD + i];
        }
    }
    return OK;
}

int
k_attn(const float *q, uint32_t T, uint32_t Hq, uint32_t Hkv, uint32_t D, float scale,
       const uint32_t *tseg, const uint32_t *seg_t0, const uint32_t *seg_pos,
       const uint32_t *seg_pg, const uint32_t *pages, const float *pool, uint32_t PT,
       size_t tok_floats, size_t kv_off, float *o, void *stream)
{
    (void)stream;
    if (T == 0 || Hq == 0)
        return OK;
    if (D == 0 || D > 1024 || Hkv == 0 || Hq % Hkv != 0 || PT == 0 || T > 65535u)
        return BAD;
    static float sc[1 << 16];
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < Hq; h++) {
            const uint32_t s = tseg[t], n = seg_pos[s] + (t - seg_t0[s]) + 1;
            const uint32_t *pg = pages + seg_pg[s];
            const size_t koff = kv_off + (size_t)(h / (Hq / Hkv)) * D,
                         voff = koff + (size_t)Hkv * D;
            const float *qh = q + ((size_t)t * Hq + h) * D;
            float m = -INFINITY;
            for (uint32_t j = 0; j < n && j < (1u << 16); j++) {
                const float *kr = pool + m_tok(pg, j, PT, tok_floats) + koff;
                float a = 0.0f;
                for (uint32_t i = 0; i < D; i++)
                    a += qh[i] * kr[i];
                sc[j] = a * scale;
                m = fmaxf(m, sc[j]);
            }
            double l = 0.0;
            for (uint32_t j = 0; j < n; j++) {
                sc[j] = expf(sc[j] - m);
                l += sc[j];
            }
            float *oh = o + ((size_t)t * Hq + h) * D;
            for (uint32_t i = 0; i < D; i++) {
                float acc = 0.0f;
                for (uint32_t j = 0; j < n; j++)
                    acc += sc[j] * pool[m_tok(pg, j, PT, tok_floats) + voff + i];
                oh[i] = acc / (float)l;
            }
        }
    return OK;
}

/* ------------------------------------------------------------------------ */
/* k_hybrid.cu                                                               */
/* ------------------------------------------------------------------------ */

int
k_scale(float *x, size_t n, float s, int divide, void *stream)
{
    (void)stream;
    for (size_t i = 0; i < n; i++)
        x[i] = divide ? x[i] / s : x[i] * s;
    return OK;
}

int
k_add_scaled(float *x, const float *y, size_t n, float s, void *stream)
{
    (void)stream;
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] + y[i] * s;
    return OK;
}

int
k_attn_gate_split(const float *qg, uint32_t T, uint32_t Hq, uint32_t D, float *q, float *g,
                  void *stream)
{
    (void)stream;
    for (size_t r = 0; r < (size_t)T * Hq; r++)
        for (size_t j = 0; j < D; j++) {
            q[r * D + j] = qg[r * 2 * D + j];
            g[r * D + j] = qg[r * 2 * D + D + j];
        }
    return OK;
}

int
k_mul_sigmoid(float *o, const float *g, size_t n, void *stream)
{
    (void)stream;
    for (size_t i = 0; i < n; i++)
        o[i] = o[i] * m_sigmoid(g[i]);
    return OK;
}

int
k_gather_rows(const float *x, const uint32_t *idx, uint32_t n, uint32_t C, float *y, void *stream)
{
    (void)stream;
    for (size_t r = 0; r < n; r++)
        memcpy(y + r * C, x + (size_t)idx[r] * C, sizeof(float) * C);
    return OK;
}

int
k_moe_combine(float *x, const float *oe, const uint32_t *trow, const float *w, uint32_t k,
              const float *os, const float *sgv, uint32_t T, uint32_t C, float res_mul,
              void *stream)
{
    (void)stream;
    if (T > 65535u)
        return BAD;
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < C; i++) {
            float acc = 0.0f;
            for (uint32_t j = 0; j < k; j++)
                acc = acc + oe[(size_t)trow[t * k + j] * C + i] * w[t * k + j];
            if (os != NULL)
                acc = acc + (sgv != NULL ? sgv[t] : 1.0f) * os[t * C + i];
            x[t * C + i] = x[t * C + i] + (res_mul != 0.0f ? acc * res_mul : acc);
        }
    return OK;
}
