/*
 * kernels: CUDA C with C-ABI launchers. Host code includes only this header
 * and never sees <<< >>>. Each launcher enqueues on the given stream
 * (a cudaStream_t passed as void *, NULL = default stream) and returns the
 * launch's cudaError_t as an int (0 = success); the caller's WK_CUDA_CHECK
 * funnel translates it. The result covers the launcher's own launches only:
 * an error an earlier runtime call left behind is not reported (k_launch.cuh).
 */
#ifndef K_H
#define K_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* RWKV-7 step (k_rwkv7.cu). Every pointer is device memory unless it says  */
/* otherwise; rows of C (or K, N) floats are stored tight, row t at t * C.  */
/* ------------------------------------------------------------------------ */

/* Element types of device tensors (the numeric values of wk_dtype). */
enum { K_DT_F32 = 0, K_DT_F16 = 1, K_DT_BF16 = 2 };

/* GEMM epilogues (the same meaning as be_cpu_epi). */
enum {
    K_EPI_STORE = 0,   /* dst = acc */
    K_EPI_ADD = 1,     /* dst += acc (residual) */
    K_EPI_RELU2 = 2,   /* dst = max(acc, 0)^2 */
    K_EPI_TANH = 3,    /* dst = tanh(acc) */
    K_EPI_SIGMOID = 4, /* dst = 1 / (1 + exp(-acc)) */
};

/*
 * x[t] = LayerNorm(emb[tok[t]]) with weight w, bias b (C floats each) and
 * epsilon eps, for t < T. emb is [V][C] of dtype K_DT_*; the tokens must
 * already be checked against V (no bounds check here).
 */
int k_rwkv7_embed(const void *emb, int dtype, const uint32_t *tok, uint32_t T, uint32_t C,
                  const float *w, const float *b, float eps, float *x, void *stream);

/*
 * y[i] = LayerNorm(x[idx ? idx[i] : i]) for i < n rows of C floats (idx is a
 * device array of row indices or NULL). y must not alias x.
 */
int k_layernorm_rows(const float *x, const uint32_t *idx, uint32_t n, uint32_t C,
                     const float *w, const float *b, float eps, float *y, void *stream);

/*
 * Token shift for a pass of T tokens laid out as segments (a segment is a
 * contiguous run of one slot's tokens): prev(t) is xln[t - 1] inside a
 * segment and, for its first token, the C floats at
 * arena + seg_slot[s] * slot_floats + shift_off. For j < n_mix:
 * out[j * out_stride + t * C + i] = x + (prev - x) * mix[j * C + i].
 * tseg[t] is t's segment, seg_t0[s] its first token.
 */
int k_rwkv7_shift_mix(const float *xln, uint32_t T, uint32_t C, const uint32_t *tseg,
                      const uint32_t *seg_t0, const uint32_t *seg_slot, const float *arena,
                      size_t slot_floats, size_t shift_off, const float *mix, uint32_t n_mix,
                      float *out, size_t out_stride, void *stream);

/*
 * Stores each segment's last xln row into its slot's shift state
 * (arena + seg_slot[s] * slot_floats + shift_off). Segments must name
 * distinct slots. Enqueue after every reader of the old shift state.
 */
int k_rwkv7_save_shift(const float *xln, uint32_t C, uint32_t n_segs, const uint32_t *seg_t0,
                       const uint32_t *seg_n, const uint32_t *seg_slot, float *arena,
                       size_t slot_floats, size_t shift_off, void *stream);

/*
 * GEMM input split for 16-bit weights (dtype K_DT_BF16 or K_DT_F16): for
 * each of T rows of K floats, a power-of-two scale s (so the row's largest
 * magnitude lands in [2^13, 2^14): binary16 cannot overflow) and
 * out[t] = hi = round16(x * s), out[T + t] = lo = round16(x * s - hi)
 * (out is [2T][K] 16-bit), inv_scale[t] = 1 / s. hi + lo carries about 16
 * significant bits of x (22 for F16), so a GEMM over both halves with fp32
 * accumulation loses almost nothing against fp32 activations.
 */
int k_split16(const float *x, uint32_t T, uint32_t K, int dtype, uint16_t *out,
              float *inv_scale, void *stream);

/*
 * GEMM epilogue: y is the GEMM output column-major N x T (split: N x 2T,
 * hi columns then lo columns); acc = (y[t] (+ y[T + t])) (* inv_scale[t]
 * when inv_scale is not NULL); dst[t * ldd + n] gets epi (K_EPI_*) of acc.
 */
int k_gemm_epi(const float *y, uint32_t T, uint32_t N, int split, const float *inv_scale,
               int epi, float *dst, size_t ldd, void *stream);

/*
 * The RWKV-7 per-token attention prologue after the LoRAs, for T tokens of
 * C = H * N channels (the CPU's cpu_stage_att). In: dw (w2 out), da (a2
 * out), dv (v2 out; unused on layer 0), k, v, vf (layer > 0).
 * Out: dw = decay exp(-e^-0.5 sigmoid(w0 + dw)), da = b = kk * iclr,
 * kk = a = -kk with kk = normalize(k * k_k) per head, k *= 1 + (iclr - 1) * k_a,
 * and layer 0: vf = v; else v += (vf - v) * sigmoid(v0 + dv).
 */
int k_rwkv7_att(uint32_t T, uint32_t C, uint32_t H, uint32_t N, int layer0, const float *w0,
                const float *a0, const float *v0, const float *k_k, const float *k_a, float *dw,
                float *da, const float *dv, float *kk, float *k, float *v, float *vf,
                void *stream);

/*
 * The WKV recurrence per (segment, head), tokens in order, on the slot's
 * fp32 state S[H][N][N] at arena + seg_slot[s] * slot_floats + state_off
 * (S[i][j]: i value, j key; S = S diag(w) + (S a) b^T + v k^T, y = S r),
 * then GroupNorm per head (lnx_w, lnx_b, gn_eps), the bonus
 * sum(r * k * r_k) * v and the gate: y[t] = (GN(y) + bonus * v) * g.
 * One block per (segment, head); N <= 1024 (N in {16, 32, 64, 128} keeps
 * the state in registers). Segments must name distinct slots; the state
 * must be 16-byte aligned when N is a multiple of 4.
 */
int k_rwkv7_wkv(float *arena, size_t slot_floats, size_t state_off, uint32_t n_segs,
                const uint32_t *seg_t0, const uint32_t *seg_n, const uint32_t *seg_slot,
                uint32_t H, uint32_t N, uint32_t C, const float *r, const float *w,
                const float *k, const float *v, const float *a, const float *b, const float *g,
                const float *r_k, const float *lnx_w, const float *lnx_b, float gn_eps, float *y,
                void *stream);

/* ------------------------------------------------------------------------ */
/* Shared by the Mamba2 and Gated DeltaNet steps (k_common.cu).             */
/* ------------------------------------------------------------------------ */

/*
 * x[t] = (float)emb[tok[t]] for t < T rows of C; emb is [V][C] of dtype
 * K_DT_*; the tokens must already be checked against V.
 */
int k_embed_rows(const void *emb, int dtype, const uint32_t *tok, uint32_t T, uint32_t C,
                 float *x, void *stream);

/*
 * y[i] = RMSNorm(x[idx ? idx[i] : i]) * w for i < n rows of D floats:
 * y = x * (float)(1 / sqrt(sum(x^2) / D + eps)) * w, the sum of squares in
 * double in a fixed order (the CPU's be_cpu_rmsnorm up to the summation
 * order). w NULL: no weight. y may equal x only when idx is NULL.
 */
int k_rmsnorm_rows(const float *x, const uint32_t *idx, uint32_t n, uint32_t D, const float *w,
                   double eps, float *y, void *stream);

/* g[i] = silu(g[i]) * u[i] for i < n (the gated MLP). */
int k_swiglu(float *g, const float *u, size_t n, void *stream);

/* ------------------------------------------------------------------------ */
/* Mamba2 step (k_mamba2.cu); layout, math: workerd/family/wrk_mamba2.h.    */
/* Segments as in k_rwkv7_shift_mix; segments must name distinct slots.     */
/* ------------------------------------------------------------------------ */

/*
 * Causal depthwise conv + SiLU per (segment, channel), tokens in order:
 * out[t][ch] = silu(b[ch] + sum_k w[ch][k] in_{t-K+1+k}) with in_t =
 * xbc[t * ldx + ch] and, before the segment, the slot's conv state
 * [CD][K-1] at arena + seg_slot[s] * slot_floats + conv_off (oldest
 * first), which then gets the segment's last K-1 inputs. K in 2..64.
 * out is [T][CD].
 */
int k_mamba2_conv(const float *xbc, size_t ldx, uint32_t CD, uint32_t K, const float *w,
                  const float *b, uint32_t n_segs, const uint32_t *seg_t0, const uint32_t *seg_n,
                  const uint32_t *seg_slot, float *arena, size_t slot_floats, size_t conv_off,
                  float *out, void *stream);

/*
 * The SSM scan per (segment, head), tokens in order, over the slot's state
 * S [H][P][N] at arena + seg_slot[s] * slot_floats + ssm_off:
 * dt = softplus(dt_raw[t * ld_dt + h] + dt_bias[h]) (x when over 20),
 * S_h = S_h * exp(dt A_h) + (x_h dt) B_g^T, y_h = S_h C_g + D_h x_h, with
 * x_h = xbc[t][h P ..], B_g = xbc[t][DI + g N ..], C_g = xbc[t][DI + G N +
 * g N ..], g = h / (H / G); xbc rows CD floats apart, y rows DI.
 */
int k_mamba2_scan(float *arena, size_t slot_floats, size_t ssm_off, uint32_t n_segs,
                  const uint32_t *seg_t0, const uint32_t *seg_n, const uint32_t *seg_slot,
                  uint32_t H, uint32_t P, uint32_t N, uint32_t G, const float *xbc, uint32_t CD,
                  const float *dt_raw, size_t ld_dt, const float *dt_bias, const float *A,
                  const float *D, float *y, void *stream);

/*
 * In place for T rows of DI = G groups: y = RMSNorm_group(y * silu(z)) * w
 * (w [DI], z rows ldz floats apart), eps as k_rmsnorm_rows.
 */
int k_mamba2_gate_norm(float *y, const float *z, size_t ldz, uint32_t T, uint32_t DI, uint32_t G,
                       const float *w, double eps, void *stream);

/* ------------------------------------------------------------------------ */
/* Gated DeltaNet step (k_gdn.cu); layout, math: workerd/family/wrk_gdn.h.  */
/* ------------------------------------------------------------------------ */

/*
 * SiLU(causal depthwise conv) per (segment, channel), tokens in order, no
 * bias: out[t][d] = silu(sum_{j<W} taps[d][j] in_{t-W+1+j}[d]) with in_t =
 * raw[t * D + d] and, before the segment, the slot's history [W-1][D] at
 * arena + seg_slot[s] * slot_floats + hist_off (oldest first), which then
 * gets the segment's last W-1 inputs. W in 2..64; taps [D][W].
 */
int k_gdn_conv(const float *raw, uint32_t D, uint32_t W, const float *taps, uint32_t n_segs,
               const uint32_t *seg_t0, const uint32_t *seg_n, const uint32_t *seg_slot,
               float *arena, size_t slot_floats, size_t hist_off, float *out, void *stream);

/*
 * In place, T rows of H heads of K: x_h *= (float)(1 / sqrt(sum(x_h^2) +
 * 1e-6)) * scale (sum of squares in double).
 */
int k_gdn_l2norm(float *x, uint32_t T, uint32_t H, uint32_t K, float scale, void *stream);

/*
 * In place for n = T * HV values (j = i % HV): a = exp(neg_A[j] *
 * softplus(a + dt_bias[j])) (the decay), b = sigmoid(b) * beta_scale.
 */
int k_gdn_gates(float *a, float *b, size_t n, uint32_t HV, const float *neg_A,
                const float *dt_bias, float beta_scale, void *stream);

/*
 * The gated delta rule per (segment, value head j, 32-column tile), tokens
 * in order, over S_j [K][Vd] at arena + seg_slot[s] * slot_floats + S_off +
 * j K Vd (key head kh = j / (HV / H)); per column i (independent):
 * S *= decay; kv = sum_r S[r][i] k[r]; u = beta (v_i - kv);
 * S[r][i] += u k[r]; o_i = sum_r S[r][i] q[r] (sums in r order).
 * q, k rows H K floats; v, o rows HV Vd; decay, beta rows HV.
 */
int k_gdn_delta(float *arena, size_t slot_floats, size_t S_off, uint32_t n_segs,
                const uint32_t *seg_t0, const uint32_t *seg_n, const uint32_t *seg_slot,
                uint32_t H, uint32_t HV, uint32_t K, uint32_t Vd, const float *q, const float *k,
                const float *v, const float *decay, const float *beta, float *o, void *stream);

/*
 * In place for T rows of HV heads of Vd: o_j = RMSNorm(o_j) * w (w [Vd]),
 * then (g not NULL) * silu(g), eps as k_rmsnorm_rows.
 */
int k_gdn_onorm(float *o, const float *g, uint32_t T, uint32_t HV, uint32_t Vd, const float *w,
                double eps, void *stream);

/* ------------------------------------------------------------------------ */
/* Softmax attention over a paged KV pool (k_attn.cu; hybrid models).       */
/* Pass token t of segment s = tseg[t] is at position seg_pos[s] + t -      */
/* seg_t0[s] of its slot; its slot's pages for the pass are pages[seg_pg[s] */
/* ..]; position j lives at pool + (pages[seg_pg[s] + j / PT] * PT + j % PT)*/
/* * tok_floats, its K [Hkv][D] then V [Hkv][D] kv_off floats in.           */
/* Segments must name distinct slots.                                       */
/* ------------------------------------------------------------------------ */

/* x[t * N + i] += b[i] for T rows of N floats. */
int k_add_rows(float *x, const float *b, uint32_t T, uint32_t N, void *stream);

/*
 * In place, per token: GPT-NeoX rotate-half RoPE over the first R dims of
 * each head (pairs (i, i + R/2); the other D - R dims pass through; R 0:
 * no rotation) of q [T][Hq][D] and k [T][Hkv][D] at the token's position
 * (angle pos * inv_freq[i] in double, inv_freq [R/2] doubles), then the
 * token's K (rotated) and V [T][Hkv][D] stored into its page row. D, R
 * even, R <= D. Enqueue after every reader of the rows it overwrites.
 */
int k_attn_rope_store(float *q, float *k, const float *v, uint32_t T, uint32_t Hq, uint32_t Hkv,
                      uint32_t D, uint32_t R, const double *inv_freq, const uint32_t *tseg,
                      const uint32_t *seg_t0, const uint32_t *seg_pos, const uint32_t *seg_pg,
                      const uint32_t *pages, float *pool, uint32_t PT, size_t tok_floats,
                      size_t kv_off, void *stream);

/*
 * o [T][Hq][D] = causal softmax(q k^T * scale) V per (token, query head h)
 * over positions 0..pos of the token's slot (K / V head h / (Hq / Hkv)),
 * fp32 with an online max. D <= 1024, Hq a multiple of Hkv, T <= 65535.
 * Every position's K / V must be stored (k_attn_rope_store) first.
 */
int k_attn(const float *q, uint32_t T, uint32_t Hq, uint32_t Hkv, uint32_t D, float scale,
           const uint32_t *tseg, const uint32_t *seg_t0, const uint32_t *seg_pos,
           const uint32_t *seg_pg, const uint32_t *pages, const float *pool, uint32_t PT,
           size_t tok_floats, size_t kv_off, float *o, void *stream);

/* ------------------------------------------------------------------------ */
/* Hybrid conventions and the mixture of experts (k_hybrid.cu; the layer    */
/* list of be_cuda_gdn.c, math be_cpu_gdn.c's). Products and sums rounded   */
/* one by one (no FMA contraction), as the CPU's.                           */
/* ------------------------------------------------------------------------ */

/* x[i] = x[i] * s (divide 0) or x[i] / s (divide 1) for i < n. */
int k_scale(float *x, size_t n, float s, int divide, void *stream);

/* x[i] = x[i] + y[i] * s for i < n (the product rounded, then the sum). */
int k_add_scaled(float *x, const float *y, size_t n, float s, void *stream);

/*
 * Qwen3.5's q_proj output qg [T][Hq][2 D] (per head its query, then its
 * output gate) into q [T][Hq][D] and g [T][Hq][D].
 */
int k_attn_gate_split(const float *qg, uint32_t T, uint32_t Hq, uint32_t D, float *q, float *g,
                      void *stream);

/* o[i] = o[i] * sigmoid(g[i]) for i < n. */
int k_mul_sigmoid(float *o, const float *g, size_t n, void *stream);

/* y[r] = x[idx[r]] for r < n rows of C floats (y must not alias x). */
int k_gather_rows(const float *x, const uint32_t *idx, uint32_t n, uint32_t C, float *y,
                  void *stream);

/*
 * The mixture of experts' sum into the residual, per token t < T and
 * channel i < C: acc = 0; acc += oe[trow[t k + j]][i] * w[t k + j] for j <
 * k in order (the token's experts, ascending); with a shared expert (os
 * not NULL) acc += sg * os[t][i], sg = sgv[t] (NULL: 1); then x[t][i] +=
 * acc (res_mul 0) or acc * res_mul. oe rows C floats, T <= 65535.
 */
int k_moe_combine(float *x, const float *oe, const uint32_t *trow, const float *w, uint32_t k,
                  const float *os, const float *sgv, uint32_t T, uint32_t C, float res_mul,
                  void *stream);

#ifdef __cplusplus
}
#endif

#endif /* K_H */
