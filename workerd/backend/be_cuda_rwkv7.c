/*
 * be_cuda_rwkv7: the RWKV-7 step on a CUDA device, host side. The math and
 * the stage order are the CPU reference's (be_cpu.c); the kernels are in
 * kernels/k_rwkv7.cu behind the C launchers of kernels/k.h.
 *
 * At creation every weight matrix is copied to the device as stored (BF16,
 * F16 or F32, in its stored orientation: cuBLAS transposes), the embedding
 * too (gathered on the device), and every small vector is widened to fp32.
 * The step flattens its rows into passes of at most `cap` tokens exactly as
 * the CPU does (a row longer than the room left continues in the next pass
 * from its slot state); a pass runs the whole network over its tokens: one
 * cuBLAS GEMM per projection for all tokens of all rows, the WKV recurrence
 * as one block per (segment, head) in token order over the slot's fp32
 * state, LayerNorm / mixes / gates as small kernels, and the head GEMM for
 * the logits rows only, copied back through pinned memory.
 *
 * GEMMs: cublasGemmEx with CUBLAS_COMPUTE_32F (fp32 accumulation, no TF32).
 * 16-bit weights stay 16-bit; the fp32 activations are split per token row
 * into hi + lo 16-bit halves (k_split16, with a power-of-two row scale so
 * binary16 cannot overflow) and multiplied in one GEMM over 2T columns, so
 * the weights stream once and the product keeps ~16 significant bits of
 * the activations: the result matches the CPU (fp32 activations times the
 * exactly widened weights) to ~1e-6 relative, far inside the parity
 * tolerance. F32 weights multiply the fp32 activations directly.
 *
 * Batch invariance (be.h asks for bit-identical rows whatever the batch):
 * every kernel here reduces in a fixed order per row, so a row's bits
 * depend only on its own data EXCEPT through cuBLAS, which picks its
 * algorithm (tiling, split-K) from the GEMM shape, i.e. from the number of
 * tokens in the pass. So on this backend a row's results are deterministic
 * for a given pass composition (same shapes, same device, one stream and a
 * fixed cuBLAS workspace) but NOT bit-exact across batch sizes or prefill
 * chunkings: they agree to GEMM rounding (~1e-6 relative), which is what
 * the CUDA parity tests check. Pinning one cublasLt algorithm for every
 * shape would be the way to make it exact; not done yet.
 *
 * Must never: log, abort on bad input, or change any slot when a step is
 * refused (all checks run before the first device call).
 */
#include "be_cuda_rwkv7.h"

#include <cublas_v2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k.h"

#define CU_PASS_TOKENS 512u      /* tokens per pass by default */
#define CU_PASS_TOKENS_MAX 4096u /* WKVM_CUDA_PASS_TOKENS upper bound */
#define CU_LOGIT_ROWS 64u        /* logits rows per head GEMM (bounds the staging) */
#define CU_DEF_ROWS 1024u        /* max_step_rows when the config says 0 */
#define CU_DEF_TOKENS 65536u     /* max_step_tokens when the config says 0 */
#define CU_WORKSPACE (32u << 20) /* cuBLAS workspace bytes (fixed: deterministic) */
#define CU_LN_EPS 1e-5f          /* LayerNorm epsilon */
#define CU_ALIGN 256u            /* device offset alignment of each matrix */

/* cuBLAS status funnel, as WK_CUDA_CHECK. */
#define WK_CUBLAS_CHECK(expr, d)                                                                   \
    do {                                                                                           \
        cublasStatus_t bs_ = (expr);                                                               \
        if (bs_ != CUBLAS_STATUS_SUCCESS)                                                          \
            return wk_diag_set((d), WK_EDEVICE, "%s failed: %s (%s at %s:%d)", #expr,              \
                               cublasGetStatusString(bs_), __func__, __FILE__, __LINE__);          \
    } while (0)

/* Indices of the token-shift mixes (the order of their vectors on the device). */
enum { MIX_R = 0, MIX_W, MIX_K, MIX_V, MIX_A, MIX_G, MIX_N };

/* fp32 vectors of C floats: 4 global ones, then V_PER_LAYER per layer. */
enum { G_LN0_W = 0, G_LN0_B, G_LNOUT_W, G_LNOUT_B, G_N };
enum {
    V_LN1_W = 0,
    V_LN1_B,
    V_LN2_W,
    V_LN2_B,
    V_MIX, /* MIX_N consecutive vectors */
    V_W0 = V_MIX + MIX_N,
    V_A0,
    V_V0,
    V_K_K,
    V_K_A,
    V_R_K,
    V_LNX_W,
    V_LNX_B,
    V_FFN_X_K,
    V_PER_LAYER
};

/* Offsets into the pinned / device per-pass metadata, in units of cap uint32. */
enum { M_TOK = 0, M_TSEG, M_SEG_T0, M_SEG_N, M_SEG_SLOT, M_LPOS, M_N };

/* A weight matrix on the device, as stored. */
typedef struct cu_mat {
    const void *w; /* device bytes, NULL: absent */
    int dtype;     /* K_DT_* */
    uint32_t k, n; /* input / output features */
    bool in_major; /* stored [k][n] (x @ W); else [n][k] (nn.Linear) */
} cu_mat;

typedef struct cu_layer {
    cu_mat wr, wk, wv, wo; /* C -> C projections */
    cu_mat w1, w2, a1, a2; /* decay and ICLR LoRAs */
    cu_mat v1, v2, g1, g2; /* value residual (absent on layer 0) and gate LoRAs */
    cu_mat fk, fv;         /* channel mix C -> F -> C */
} cu_layer;

struct be_cuda_rwkv7 {
    int device;                    /* CUDA ordinal */
    uint32_t L, C, H, N, F, V;     /* dimensions */
    uint32_t Dw, Da, Dv, Dg;       /* LoRA ranks */
    uint32_t max_rows, max_tokens; /* step limits */
    wk_dtype dtype;                /* the model's weight dtype (describe) */
    uint32_t n_slots;              /* arena slots incl. 0 */
    size_t layer_floats;           /* 2C + H N N */
    size_t slot_floats;            /* L * layer_floats */
    float *arena;                  /* device, borrowed from be_cuda */

    cudaStream_t stream;   /* every enqueue of a step, NULL until created */
    cublasHandle_t blas;   /* bound to stream, NULL until created */
    void *blas_ws;         /* cuBLAS workspace, device */
    uint8_t *weights;      /* device block: every matrix and the embedding */
    uint64_t weight_bytes; /* bytes in weights */
    const void *emb;       /* into weights: [V][C] as stored */
    int emb_dtype;         /* K_DT_* */
    float *vecs;           /* device fp32 vectors (G_N + V_PER_LAYER * L) * C */
    cu_layer *layers;      /* host array of L, owned */
    cu_mat head;           /* C -> V */

    uint32_t cap;  /* tokens per pass */
    uint32_t lcap; /* logits rows per head GEMM */
    /* device scratch (fp32 unless noted) */
    float *x;                 /* residual [cap][C] */
    float *xln;               /* LayerNorm output [cap][C] */
    float *mx;                /* MIX_N buffers [MIX_N][cap][C] */
    float *r, *k, *v, *vf;    /* [cap][C] */
    float *lw, *la, *lv, *lg; /* LoRA hidden [cap][D*] */
    float *hf;                /* channel-mix hidden [cap][F] */
    float *y2;                /* raw GEMM output, column-major N x (2T) */
    uint16_t *act;            /* 16-bit GEMM input halves [2T][K] */
    float *rscale;            /* per-row inverse input scale [cap] */
    float *xo;                /* ln_out rows [lcap][C] */
    float *dlog;              /* logits [lcap][V] */
    uint32_t *dmeta;          /* per-pass metadata [M_N][cap] */
    /* host */
    uint32_t *hmeta;              /* pinned [M_N][cap] */
    float *hlog;                  /* pinned [lcap][V] */
    float **lrows;                /* destination of each logits row of the pass [cap] */
    uint32_t *slot_mark;          /* duplicate detection [n_slots] */
    uint32_t mark_gen;            /* current mark value */
    uint32_t T, n_segs, n_logits; /* the pass being built */
};

static inline float *
cu_mixbuf(const be_cuda_rwkv7 *c, int j)
{
    return c->mx + (size_t)j * c->cap * c->C;
}

static inline const float *
cu_gvec(const be_cuda_rwkv7 *c, int idx)
{
    return c->vecs + (size_t)idx * c->C;
}

static inline const float *
cu_lvec(const be_cuda_rwkv7 *c, uint32_t l, int idx)
{
    return c->vecs + ((size_t)G_N + (size_t)l * V_PER_LAYER + (size_t)idx) * c->C;
}

static int
cu_dtype(wk_dtype dt)
{
    return dt == WK_DTYPE_BF16 ? K_DT_BF16 : dt == WK_DTYPE_F16 ? K_DT_F16 : K_DT_F32;
}

static cudaDataType_t
cu_blas_type(int dt)
{
    return dt == K_DT_BF16 ? CUDA_R_16BF : dt == K_DT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* ------------------------------------------------------------------------ */
/* GEMM                                                                      */
/* ------------------------------------------------------------------------ */

/*
 * dst[t * ldd + j] (epi) = sum_i x[t * K + i] W[i][j] for t < T, j < N.
 * In cuBLAS's column-major terms: Y (N x cols) = op(A) (N x K) * X (K x cols)
 * where X is the row-major activations seen as K x cols (ld K) and A the
 * stored matrix: [k][n] row-major is N x K column-major (op N, ld N);
 * [n][k] row-major is K x N column-major (op T, ld K).
 */
static wk_err
cu_gemm(be_cuda_rwkv7 *c, const cu_mat *w, const float *x, uint32_t T, float *dst, size_t ldd,
        int epi, wk_diag *d)
{
    if (T == 0)
        return WK_OK;
    const bool split = w->dtype != K_DT_F32;
    const void *B = x;
    int cols = (int)T;
    if (split) {
        WK_CUDA_CHECK(k_split16(x, T, w->k, w->dtype, c->act, c->rscale, c->stream), d);
        B = c->act;
        cols = 2 * (int)T;
    }
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t at = cu_blas_type(w->dtype);
    WK_CUBLAS_CHECK(cublasGemmEx(c->blas, w->in_major ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N,
                                 (int)w->n, cols, (int)w->k, &one, w->w, at,
                                 w->in_major ? (int)w->n : (int)w->k, B, at, (int)w->k, &zero,
                                 c->y2, CUDA_R_32F, (int)w->n, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT),
                    d);
    WK_CUDA_CHECK(
        k_gemm_epi(c->y2, T, w->n, split, split ? c->rscale : NULL, epi, dst, ldd, c->stream), d);
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* a pass                                                                    */
/* ------------------------------------------------------------------------ */

#define CU_TRY(expr)                                                                               \
    do {                                                                                           \
        wk_err te_ = (expr);                                                                       \
        if (te_ != WK_OK)                                                                          \
            return te_;                                                                            \
    } while (0)

/* The time mix of layer l: x += W_o(...) */
static wk_err
cu_time_mix(be_cuda_rwkv7 *c, uint32_t l, wk_diag *d)
{
    const cu_layer *ly = &c->layers[l];
    const uint32_t T = c->T, C = c->C;
    const size_t cap = c->cap;
    const uint32_t *dm = c->dmeta;
    const size_t lay_off = (size_t)l * c->layer_floats;
    float *mx0 = cu_mixbuf(c, 0), *mx1 = cu_mixbuf(c, 1), *mx2 = cu_mixbuf(c, 2);
    float *mx3 = cu_mixbuf(c, 3), *mx4 = cu_mixbuf(c, 4), *mx5 = cu_mixbuf(c, 5);

    WK_CUDA_CHECK(k_layernorm_rows(c->x, NULL, T, C, cu_lvec(c, l, V_LN1_W), cu_lvec(c, l, V_LN1_B),
                                   CU_LN_EPS, c->xln, c->stream),
                  d);
    WK_CUDA_CHECK(k_rwkv7_shift_mix(c->xln, T, C, dm + M_TSEG * cap, dm + M_SEG_T0 * cap,
                                    dm + M_SEG_SLOT * cap, c->arena, c->slot_floats, lay_off,
                                    cu_lvec(c, l, V_MIX), MIX_N, c->mx, cap * C, c->stream),
                  d);
    WK_CUDA_CHECK(k_rwkv7_save_shift(c->xln, C, c->n_segs, dm + M_SEG_T0 * cap, dm + M_SEG_N * cap,
                                     dm + M_SEG_SLOT * cap, c->arena, c->slot_floats, lay_off,
                                     c->stream),
                  d);

    CU_TRY(cu_gemm(c, &ly->wr, cu_mixbuf(c, MIX_R), T, c->r, C, K_EPI_STORE, d));
    CU_TRY(cu_gemm(c, &ly->wk, cu_mixbuf(c, MIX_K), T, c->k, C, K_EPI_STORE, d));
    CU_TRY(cu_gemm(c, &ly->wv, cu_mixbuf(c, MIX_V), T, c->v, C, K_EPI_STORE, d));
    CU_TRY(cu_gemm(c, &ly->w1, cu_mixbuf(c, MIX_W), T, c->lw, c->Dw, K_EPI_TANH, d));
    CU_TRY(cu_gemm(c, &ly->a1, cu_mixbuf(c, MIX_A), T, c->la, c->Da, K_EPI_STORE, d));
    if (l > 0)
        CU_TRY(cu_gemm(c, &ly->v1, cu_mixbuf(c, MIX_V), T, c->lv, c->Dv, K_EPI_STORE, d));
    CU_TRY(cu_gemm(c, &ly->g1, cu_mixbuf(c, MIX_G), T, c->lg, c->Dg, K_EPI_SIGMOID, d));
    /* the mixes are consumed: mx0..mx3 now take the LoRA outputs */
    CU_TRY(cu_gemm(c, &ly->w2, c->lw, T, mx0, C, K_EPI_STORE, d));
    CU_TRY(cu_gemm(c, &ly->a2, c->la, T, mx1, C, K_EPI_STORE, d));
    if (l > 0)
        CU_TRY(cu_gemm(c, &ly->v2, c->lv, T, mx2, C, K_EPI_STORE, d));
    CU_TRY(cu_gemm(c, &ly->g2, c->lg, T, mx3, C, K_EPI_STORE, d));

    /* mx0 = decay, mx1 = b, mx4 = a, k and v updated (layer 0: vf = v) */
    WK_CUDA_CHECK(k_rwkv7_att(T, C, c->H, c->N, l == 0, cu_lvec(c, l, V_W0), cu_lvec(c, l, V_A0),
                              cu_lvec(c, l, V_V0), cu_lvec(c, l, V_K_K), cu_lvec(c, l, V_K_A), mx0,
                              mx1, mx2, mx4, c->k, c->v, c->vf, c->stream),
                  d);
    WK_CUDA_CHECK(k_rwkv7_wkv(c->arena, c->slot_floats, lay_off + 2 * (size_t)C, c->n_segs,
                              dm + M_SEG_T0 * cap, dm + M_SEG_N * cap, dm + M_SEG_SLOT * cap, c->H,
                              c->N, C, c->r, mx0, c->k, c->v, mx4, mx1, mx3, cu_lvec(c, l, V_R_K),
                              cu_lvec(c, l, V_LNX_W), cu_lvec(c, l, V_LNX_B),
                              (float)((double)c->N * 1e-5), mx5, c->stream),
                  d);
    CU_TRY(cu_gemm(c, &ly->wo, mx5, T, c->x, C, K_EPI_ADD, d));
    return WK_OK;
}

/* The channel mix of layer l: x += W_v relu(W_k mix)^2 */
static wk_err
cu_channel_mix(be_cuda_rwkv7 *c, uint32_t l, wk_diag *d)
{
    const cu_layer *ly = &c->layers[l];
    const uint32_t T = c->T, C = c->C;
    const size_t cap = c->cap;
    const uint32_t *dm = c->dmeta;
    const size_t shift_off = (size_t)l * c->layer_floats + C;

    WK_CUDA_CHECK(k_layernorm_rows(c->x, NULL, T, C, cu_lvec(c, l, V_LN2_W), cu_lvec(c, l, V_LN2_B),
                                   CU_LN_EPS, c->xln, c->stream),
                  d);
    WK_CUDA_CHECK(k_rwkv7_shift_mix(c->xln, T, C, dm + M_TSEG * cap, dm + M_SEG_T0 * cap,
                                    dm + M_SEG_SLOT * cap, c->arena, c->slot_floats, shift_off,
                                    cu_lvec(c, l, V_FFN_X_K), 1, c->mx, cap * C, c->stream),
                  d);
    WK_CUDA_CHECK(k_rwkv7_save_shift(c->xln, C, c->n_segs, dm + M_SEG_T0 * cap, dm + M_SEG_N * cap,
                                     dm + M_SEG_SLOT * cap, c->arena, c->slot_floats, shift_off,
                                     c->stream),
                  d);
    CU_TRY(cu_gemm(c, &ly->fk, cu_mixbuf(c, 0), T, c->hf, c->F, K_EPI_RELU2, d));
    CU_TRY(cu_gemm(c, &ly->fv, c->hf, T, c->x, C, K_EPI_ADD, d));
    return WK_OK;
}

/* ln_out and the head for the pass's logits rows, copied to the callers' buffers. */
static wk_err
cu_logits(be_cuda_rwkv7 *c, wk_diag *d)
{
    const size_t V = c->V;
    for (uint32_t i0 = 0; i0 < c->n_logits; i0 += c->lcap) {
        const uint32_t nl = c->n_logits - i0 < c->lcap ? c->n_logits - i0 : c->lcap;
        WK_CUDA_CHECK(k_layernorm_rows(c->x, c->dmeta + (size_t)M_LPOS * c->cap + i0, nl, c->C,
                                       cu_gvec(c, G_LNOUT_W), cu_gvec(c, G_LNOUT_B), CU_LN_EPS,
                                       c->xo, c->stream),
                      d);
        CU_TRY(cu_gemm(c, &c->head, c->xo, nl, c->dlog, V, K_EPI_STORE, d));
        WK_CUDA_CHECK(cudaMemcpyAsync(c->hlog, c->dlog, sizeof(float) * V * nl,
                                      cudaMemcpyDeviceToHost, c->stream),
                      d);
        WK_CUDA_CHECK(cudaStreamSynchronize(c->stream), d);
        for (uint32_t i = 0; i < nl; i++)
            memcpy(c->lrows[i0 + i], c->hlog + V * i, sizeof(float) * V);
    }
    return WK_OK;
}

/* Runs the pass described by hmeta (T tokens, n_segs segments, n_logits rows). */
static wk_err
cu_pass_run(be_cuda_rwkv7 *c, wk_diag *d)
{
    const size_t cap = c->cap;
    WK_CUDA_CHECK(cudaMemcpyAsync(c->dmeta, c->hmeta, sizeof(uint32_t) * M_N * cap,
                                  cudaMemcpyHostToDevice, c->stream),
                  d);
    WK_CUDA_CHECK(k_rwkv7_embed(c->emb, c->emb_dtype, c->dmeta + M_TOK * cap, c->T, c->C,
                                cu_gvec(c, G_LN0_W), cu_gvec(c, G_LN0_B), CU_LN_EPS, c->x,
                                c->stream),
                  d);
    for (uint32_t l = 0; l < c->L; l++) {
        CU_TRY(cu_time_mix(c, l, d));
        CU_TRY(cu_channel_mix(c, l, d));
    }
    if (c->n_logits > 0)
        CU_TRY(cu_logits(c, d));
    /* the pass is complete (and hmeta free for the next one) only after this */
    WK_CUDA_CHECK(cudaStreamSynchronize(c->stream), d);
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* step                                                                      */
/* ------------------------------------------------------------------------ */

/* The CPU backend's cpu_step_check: same order, same errors, same messages. */
static wk_err
cu_step_check(be_cuda_rwkv7 *c, const be_row *rows, size_t n, wk_diag *d)
{
    uint64_t total = 0;
    if (n > c->max_rows)
        return wk_diag_set(d, WK_ETOOBIG, "step has %zu rows, at most %u", n, c->max_rows);
    if (n > 0 && rows == NULL)
        return wk_diag_set(d, WK_EINVAL, "step rows missing");
    if (++c->mark_gen == 0) {
        memset(c->slot_mark, 0, sizeof(uint32_t) * c->n_slots);
        c->mark_gen = 1;
    }
    for (size_t i = 0; i < n; i++) {
        const be_row *r = &rows[i];
        if (r->slot >= c->n_slots)
            return wk_diag_set(d, WK_EINVAL, "row %zu: slot %u outside the arena (%u slots)", i,
                               r->slot, c->n_slots);
        if (r->slot != 0) {
            if (c->slot_mark[r->slot] == c->mark_gen)
                return wk_diag_set(d, WK_EINVAL, "row %zu: slot %u appears twice in one step", i,
                                   r->slot);
            c->slot_mark[r->slot] = c->mark_gen;
        }
        if (r->n_tokens == 0 || r->tokens == NULL)
            return wk_diag_set(d, WK_EINVAL, "row %zu: no tokens", i);
        if (r->logits_mode > BE_LOGITS_ALL)
            return wk_diag_set(d, WK_EINVAL, "row %zu: bad logits_mode %u", i, r->logits_mode);
        if (r->logits_mode != BE_LOGITS_NONE && r->logits == NULL)
            return wk_diag_set(d, WK_EINVAL, "row %zu: logits requested without a buffer", i);
        for (uint32_t t = 0; t < r->n_tokens; t++)
            if (r->tokens[t] < 0 || (uint32_t)r->tokens[t] >= c->V)
                return wk_diag_set(d, WK_EINVAL, "row %zu: token %d at %u outside vocab %u", i,
                                   r->tokens[t], t, c->V);
        total += r->n_tokens;
    }
    if (total > c->max_tokens)
        return wk_diag_set(d, WK_ETOOBIG, "step has %llu tokens, at most %u",
                           (unsigned long long)total, c->max_tokens);
    return WK_OK;
}

static wk_err
cu_step_rows(be_cuda_rwkv7 *c, be_row *rows, size_t n, wk_diag *d)
{
    const size_t cap = c->cap;
    uint32_t *tok = c->hmeta + M_TOK * cap, *tseg = c->hmeta + M_TSEG * cap;
    uint32_t *seg_t0 = c->hmeta + M_SEG_T0 * cap, *seg_n = c->hmeta + M_SEG_N * cap;
    uint32_t *seg_slot = c->hmeta + M_SEG_SLOT * cap, *lpos = c->hmeta + M_LPOS * cap;
    c->T = 0;
    c->n_segs = 0;
    c->n_logits = 0;
    for (size_t i = 0; i < n; i++) {
        be_row *r = &rows[i];
        if (r->slot == 0) {
            /* padding: skipped; its logits are zeros */
            if (r->logits_mode == BE_LOGITS_LAST)
                memset(r->logits, 0, sizeof(float) * c->V);
            else if (r->logits_mode == BE_LOGITS_ALL)
                memset(r->logits, 0, sizeof(float) * c->V * r->n_tokens);
            continue;
        }
        uint32_t off = 0;
        while (off < r->n_tokens) {
            const uint32_t room = c->cap - c->T;
            const uint32_t take = r->n_tokens - off < room ? r->n_tokens - off : room;
            seg_t0[c->n_segs] = c->T;
            seg_n[c->n_segs] = take;
            seg_slot[c->n_segs] = r->slot;
            for (uint32_t j = 0; j < take; j++) {
                tok[c->T + j] = (uint32_t)r->tokens[off + j];
                tseg[c->T + j] = c->n_segs;
                if (r->logits_mode == BE_LOGITS_ALL ||
                    (r->logits_mode == BE_LOGITS_LAST && off + j == r->n_tokens - 1)) {
                    lpos[c->n_logits] = c->T + j;
                    c->lrows[c->n_logits] =
                        r->logits +
                        (r->logits_mode == BE_LOGITS_ALL ? (size_t)(off + j) * c->V : 0);
                    c->n_logits++;
                }
            }
            c->n_segs++;
            c->T += take;
            off += take;
            if (c->T == c->cap) {
                CU_TRY(cu_pass_run(c, d));
                c->T = 0;
                c->n_segs = 0;
                c->n_logits = 0;
            }
        }
    }
    if (c->T > 0)
        CU_TRY(cu_pass_run(c, d));
    return WK_OK;
}

wk_err
be_cuda_rwkv7_step(be_cuda_rwkv7 *c, be_row *rows, size_t n, wk_diag *d)
{
    wk_err e = cu_step_check(c, rows, n, d);
    if (e != WK_OK)
        return e;
    WK_CUDA_CHECK(cudaSetDevice(c->device), d);
    e = cu_step_rows(c, rows, n, d);
    if (e != WK_OK)
        (void)cudaStreamSynchronize(c->stream); /* drain what was enqueued; the error stands */
    c->T = 0;
    c->n_segs = 0;
    c->n_logits = 0;
    return e;
}

/* ------------------------------------------------------------------------ */
/* create / free                                                             */
/* ------------------------------------------------------------------------ */

void
be_cuda_rwkv7_free(be_cuda_rwkv7 *c)
{
    if (c == NULL)
        return;
    if (c->stream != NULL)
        (void)cudaStreamSynchronize(c->stream);
    if (c->blas != NULL)
        (void)cublasDestroy(c->blas);
    if (c->stream != NULL)
        (void)cudaStreamDestroy(c->stream);
    void *dev[] = {c->blas_ws, c->weights, c->vecs, c->x,      c->xln, c->mx,   c->r,
                   c->k,       c->v,       c->vf,   c->lw,     c->la,  c->lv,   c->lg,
                   c->hf,      c->y2,      c->act,  c->rscale, c->xo,  c->dlog, c->dmeta};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        if (dev[i] != NULL)
            (void)cudaFree(dev[i]);
    if (c->hmeta != NULL)
        (void)cudaFreeHost(c->hmeta);
    if (c->hlog != NULL)
        (void)cudaFreeHost(c->hlog);
    free(c->layers);
    free(c->lrows);
    free(c->slot_mark);
    free(c);
}

/* Bytes of a stored matrix, 0 when its tensor does not hold exactly k * n elements. */
static size_t
cu_mat_bytes(const wrk_mat *m)
{
    if (m->t == NULL)
        return 0;
    const size_t b = (size_t)m->n_in * m->n_out * wk_dtype_size(m->t->dtype);
    return b == m->t->nbytes ? b : 0;
}

static size_t
cu_align(size_t n)
{
    return (n + CU_ALIGN - 1) / CU_ALIGN * CU_ALIGN;
}

/* Device memory for n bytes (at least 1), WK_EDEVICE when it cannot be had. */
static wk_err
cu_dalloc(void **p, size_t n, const char *what, wk_diag *d)
{
    cudaError_t ce = cudaMalloc(p, n ? n : 1);
    if (ce != cudaSuccess) {
        *p = NULL;
        return wk_diag_set(d, WK_EDEVICE, "cuda backend: cannot allocate %zu bytes for %s: %s", n,
                           what, cudaGetErrorString(ce));
    }
    return WK_OK;
}

/* The matrices to upload: (source, destination) pairs. */
typedef struct cu_upload {
    const wrk_mat *src; /* stored */
    cu_mat *dst;        /* device view */
} cu_upload;

static wk_err
cu_upload_weights(be_cuda_rwkv7 *c, const wrk_rwkv7 *rw, wk_diag *d)
{
    const size_t max_up = (size_t)c->L * 14 + 1;
    cu_upload *ups = calloc(max_up, sizeof(*ups));
    if (ups == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    size_t nu = 0;
    for (uint32_t l = 0; l < c->L; l++) {
        const wrk_rwkv7_layer *s = &rw->layers[l];
        cu_layer *ly = &c->layers[l];
        const wrk_mat *src[] = {&s->wr, &s->wk, &s->wv, &s->wo, &s->w1, &s->w2,      &s->a1,
                                &s->a2, &s->v1, &s->v2, &s->g1, &s->g2, &s->ffn_key, &s->ffn_value};
        cu_mat *dst[] = {&ly->wr, &ly->wk, &ly->wv, &ly->wo, &ly->w1, &ly->w2, &ly->a1,
                         &ly->a2, &ly->v1, &ly->v2, &ly->g1, &ly->g2, &ly->fk, &ly->fv};
        for (size_t i = 0; i < 14; i++) {
            const bool vlora = i == 8 || i == 9;
            if (vlora && l == 0)
                continue; /* layer 0 keeps v_first = v: its value LoRA (if any) is unused */
            if (src[i]->t == NULL) {
                free(ups);
                return wk_diag_set(d, WK_EINVAL,
                                   "cuda backend: layer %u: a weight matrix "
                                   "(#%zu) is missing",
                                   l, i);
            }
            ups[nu].src = src[i];
            ups[nu].dst = dst[i];
            nu++;
        }
    }
    ups[nu].src = &rw->head;
    ups[nu].dst = &c->head;
    nu++;

    const size_t emb_bytes = (size_t)c->V * c->C * wk_dtype_size(rw->emb->dtype);
    if (rw->emb->nbytes != emb_bytes) {
        free(ups);
        return wk_diag_set(d, WK_EINVAL, "cuda backend: %s: %zu bytes, expected %zu", rw->emb->name,
                           rw->emb->nbytes, emb_bytes);
    }
    size_t total = cu_align(emb_bytes);
    for (size_t i = 0; i < nu; i++) {
        const size_t b = cu_mat_bytes(ups[i].src);
        if (b == 0) {
            wk_err e = wk_diag_set(d, WK_EINVAL, "cuda backend: %s: size does not match %u x %u",
                                   ups[i].src->t->name, ups[i].src->n_in, ups[i].src->n_out);
            free(ups);
            return e;
        }
        total += cu_align(b);
    }
    wk_err e = cu_dalloc((void **)&c->weights, total, "weights", d);
    if (e != WK_OK) {
        free(ups);
        return e;
    }
    c->weight_bytes = total;
    uint8_t *wp = c->weights;
    cudaError_t ce = cudaMemcpy(wp, rw->emb->data, emb_bytes, cudaMemcpyHostToDevice);
    c->emb = wp;
    c->emb_dtype = cu_dtype(rw->emb->dtype);
    wp += cu_align(emb_bytes);
    for (size_t i = 0; i < nu && ce == cudaSuccess; i++) {
        const wrk_mat *s = ups[i].src;
        const size_t b = cu_mat_bytes(s);
        ce = cudaMemcpy(wp, s->t->data, b, cudaMemcpyHostToDevice);
        *ups[i].dst = (cu_mat){.w = wp,
                               .dtype = cu_dtype(s->t->dtype),
                               .k = s->n_in,
                               .n = s->n_out,
                               .in_major = s->in_major};
        wp += cu_align(b);
    }
    free(ups);
    if (ce != cudaSuccess)
        return wk_diag_set(d, WK_EDEVICE, "cuda backend: weight upload: %s",
                           cudaGetErrorString(ce));
    return WK_OK;
}

/* Reads one [C] vector tensor into dst (fp32). */
static wk_err
cu_vec(const wk_tensor *t, uint32_t C, float *dst, wk_diag *d)
{
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: a vector tensor is missing");
    wk_err e = wk_tensor_read_f32(t, 0, C, dst);
    if (e != WK_OK)
        return wk_diag_set(d, e, "cuda backend: cannot read %s as %u values", t->name, C);
    return WK_OK;
}

static wk_err
cu_upload_vecs(be_cuda_rwkv7 *c, const wrk_rwkv7 *rw, wk_diag *d)
{
    const uint32_t C = c->C;
    const size_t nvec = G_N + (size_t)V_PER_LAYER * c->L;
    float *h = calloc(nvec * C, sizeof(float));
    if (h == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wk_err e = WK_OK;
#define HV(idx) (h + (size_t)(idx)*C)
#define LV(l, idx) (h + ((size_t)G_N + (size_t)(l)*V_PER_LAYER + (size_t)(idx)) * C)
    const wk_tensor *gsrc[G_N] = {rw->ln0_w, rw->ln0_b, rw->lnout_w, rw->lnout_b};
    for (int i = 0; i < G_N && e == WK_OK; i++)
        e = cu_vec(gsrc[i], C, HV(i), d);
    for (uint32_t l = 0; l < c->L && e == WK_OK; l++) {
        const wrk_rwkv7_layer *s = &rw->layers[l];
        const wk_tensor *src[V_PER_LAYER] = {[V_LN1_W] = s->ln1_w,
                                             [V_LN1_B] = s->ln1_b,
                                             [V_LN2_W] = s->ln2_w,
                                             [V_LN2_B] = s->ln2_b,
                                             [V_MIX + MIX_R] = s->x_r,
                                             [V_MIX + MIX_W] = s->x_w,
                                             [V_MIX + MIX_K] = s->x_k,
                                             [V_MIX + MIX_V] = s->x_v,
                                             [V_MIX + MIX_A] = s->x_a,
                                             [V_MIX + MIX_G] = s->x_g,
                                             [V_W0] = s->w0,
                                             [V_A0] = s->a0,
                                             [V_V0] = l > 0 ? s->v0 : NULL,
                                             [V_K_K] = s->k_k,
                                             [V_K_A] = s->k_a,
                                             [V_R_K] = s->r_k,
                                             [V_LNX_W] = s->lnx_w,
                                             [V_LNX_B] = s->lnx_b,
                                             [V_FFN_X_K] = s->ffn_x_k};
        for (int i = 0; i < V_PER_LAYER && e == WK_OK; i++) {
            if (i == V_V0 && l == 0)
                continue; /* unused on layer 0: stays zero */
            e = cu_vec(src[i], C, LV(l, i), d);
        }
    }
#undef HV
#undef LV
    if (e == WK_OK)
        e = cu_dalloc((void **)&c->vecs, nvec * C * sizeof(float), "vectors", d);
    if (e == WK_OK) {
        cudaError_t ce = cudaMemcpy(c->vecs, h, nvec * C * sizeof(float), cudaMemcpyHostToDevice);
        if (ce != cudaSuccess)
            e = wk_diag_set(d, WK_EDEVICE, "cuda backend: vector upload: %s",
                            cudaGetErrorString(ce));
    }
    free(h);
    return e;
}

static uint32_t
cu_max3(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t m = a > b ? a : b;
    return m > c ? m : c;
}

static wk_err
cu_alloc_scratch(be_cuda_rwkv7 *c, wk_diag *d)
{
    const size_t cap = c->cap, C = c->C, lcap = c->lcap;
    const uint32_t maxD = cu_max3(c->Dw, c->Da, cu_max3(c->Dv, c->Dg, 1));
    /* widest GEMM input and output of a layer: C, F or a LoRA rank */
    const size_t maxK = cu_max3(c->C, c->F, maxD), maxN = maxK;
    size_t y2 = 2 * cap * maxN, act = 2 * cap * maxK;
    if (y2 < 2 * lcap * c->V)
        y2 = 2 * lcap * c->V;
    if (act < 2 * lcap * C)
        act = 2 * lcap * C;
    struct {
        void **p;
        size_t bytes;
        const char *what;
    } a[] = {
        {(void **)&c->x, cap * C * 4, "x"},
        {(void **)&c->xln, cap * C * 4, "xln"},
        {(void **)&c->mx, MIX_N * cap * C * 4, "mixes"},
        {(void **)&c->r, cap * C * 4, "r"},
        {(void **)&c->k, cap * C * 4, "k"},
        {(void **)&c->v, cap * C * 4, "v"},
        {(void **)&c->vf, cap * C * 4, "v_first"},
        {(void **)&c->lw, cap * c->Dw * 4, "lora w"},
        {(void **)&c->la, cap * c->Da * 4, "lora a"},
        {(void **)&c->lv, cap * c->Dv * 4, "lora v"},
        {(void **)&c->lg, cap * c->Dg * 4, "lora g"},
        {(void **)&c->hf, cap * c->F * 4, "ffn hidden"},
        {(void **)&c->y2, y2 * 4, "gemm out"},
        {(void **)&c->act, act * 2, "gemm in"},
        {(void **)&c->rscale, cap * 4, "row scales"},
        {(void **)&c->xo, lcap * C * 4, "ln_out"},
        {(void **)&c->dlog, lcap * c->V * 4, "logits"},
        {(void **)&c->dmeta, M_N * cap * 4, "pass metadata"},
    };
    for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++)
        CU_TRY(cu_dalloc(a[i].p, a[i].bytes, a[i].what, d));
    /* v_first is read on layer 1+ for every token: keep it defined */
    WK_CUDA_CHECK(cudaMemset(c->vf, 0, cap * C * 4), d);
    void *hm = NULL, *hl = NULL; /* assigned only on success: free() must see NULL otherwise */
    WK_CUDA_CHECK(cudaHostAlloc(&hm, M_N * cap * 4, cudaHostAllocDefault), d);
    c->hmeta = hm;
    WK_CUDA_CHECK(cudaHostAlloc(&hl, lcap * c->V * 4, cudaHostAllocDefault), d);
    c->hlog = hl;
    memset(c->hmeta, 0, M_N * cap * 4);
    c->lrows = calloc(cap, sizeof(float *));
    c->slot_mark = calloc(c->n_slots, sizeof(uint32_t));
    if (c->lrows == NULL || c->slot_mark == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    return WK_OK;
}

wk_err
be_cuda_rwkv7_new(const be_config *cfg, const wrk_rwkv7 *rw, float *arena, uint32_t n_slots,
                  uint64_t slot_bytes, be_cuda_rwkv7 **out, wk_diag *d)
{
    if (cfg == NULL || rw == NULL || arena == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: missing config, model or arena");
    if (rw->n_head == 0 || rw->head_size == 0 || rw->n_head * rw->head_size != rw->n_embd)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: %u heads of %u do not make n_embd %u",
                           rw->n_head, rw->head_size, rw->n_embd);
    if (rw->head_size > 1024)
        return wk_diag_set(d, WK_ENOTSUP, "cuda backend: head size %u over 1024", rw->head_size);
    be_cuda_rwkv7 *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wk_err e = WK_OK;
    c->device = cfg->device;
    c->L = rw->n_layer;
    c->C = rw->n_embd;
    c->H = rw->n_head;
    c->N = rw->head_size;
    c->F = rw->ffn_dim;
    c->V = rw->vocab_size;
    c->Dw = rw->lora_w;
    c->Da = rw->lora_a;
    c->Dv = rw->lora_v;
    c->Dg = rw->lora_g;
    c->dtype = rw->head.t != NULL ? rw->head.t->dtype : WK_DTYPE_F32;
    c->max_rows = cfg->max_step_rows ? cfg->max_step_rows : CU_DEF_ROWS;
    c->max_tokens = cfg->max_step_tokens ? cfg->max_step_tokens : CU_DEF_TOKENS;
    c->n_slots = n_slots;
    c->arena = arena;
    c->layer_floats = 2 * (size_t)c->C + (size_t)c->H * c->N * c->N;
    c->slot_floats = (size_t)c->L * c->layer_floats;
    if (c->slot_floats * sizeof(float) != slot_bytes) {
        e = wk_diag_set(d, WK_EINVAL,
                        "cuda backend: slot of %llu bytes, the RWKV-7 layout "
                        "needs %zu",
                        (unsigned long long)slot_bytes, c->slot_floats * sizeof(float));
        goto fail;
    }
    c->cap = CU_PASS_TOKENS;
    const char *pt = getenv("WKVM_CUDA_PASS_TOKENS"); /* tuning and tests: 1..4096 */
    if (pt != NULL && atoi(pt) >= 1 && atoi(pt) <= (int)CU_PASS_TOKENS_MAX)
        c->cap = (uint32_t)atoi(pt);
    if (c->cap > c->max_tokens)
        c->cap = c->max_tokens;
    c->lcap = c->cap < CU_LOGIT_ROWS ? c->cap : CU_LOGIT_ROWS;

    c->layers = calloc(c->L ? c->L : 1, sizeof(*c->layers));
    if (c->layers == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto fail;
    }
    cudaError_t ce = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        c->stream = NULL;
        e = wk_diag_set(d, WK_EDEVICE, "cuda backend: stream: %s", cudaGetErrorString(ce));
        goto fail;
    }
    cublasStatus_t bs = cublasCreate(&c->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        e = wk_diag_set(d, WK_EDEVICE, "cuda backend: cublasCreate: %s", cublasGetStatusString(bs));
        goto fail;
    }
    if ((e = cu_dalloc(&c->blas_ws, CU_WORKSPACE, "the cuBLAS workspace", d)) != WK_OK)
        goto fail;
    bs = cublasSetStream(c->blas, c->stream);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetWorkspace(c->blas, c->blas_ws, CU_WORKSPACE);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH); /* no TF32 */
    if (bs != CUBLAS_STATUS_SUCCESS) {
        e = wk_diag_set(d, WK_EDEVICE, "cuda backend: cuBLAS setup: %s", cublasGetStatusString(bs));
        goto fail;
    }
    if ((e = cu_upload_weights(c, rw, d)) != WK_OK)
        goto fail;
    if ((e = cu_upload_vecs(c, rw, d)) != WK_OK)
        goto fail;
    if ((e = cu_alloc_scratch(c, d)) != WK_OK)
        goto fail;
    /* the arena and scratch memsets ran on the legacy stream; the step's stream does not wait */
    ce = cudaDeviceSynchronize();
    if (ce != cudaSuccess) {
        e = wk_diag_set(d, WK_EDEVICE, "cuda backend: open: %s", cudaGetErrorString(ce));
        goto fail;
    }
    *out = c;
    return WK_OK;

fail:
    be_cuda_rwkv7_free(c);
    return e;
}

void
be_cuda_rwkv7_describe(const be_cuda_rwkv7 *c, char *buf, size_t len)
{
    if (buf == NULL || len == 0)
        return;
    snprintf(buf, len, "pass_tokens=%u weights=%s weight_bytes=%llu gemm=cublas-split16", c->cap,
             wk_dtype_name(c->dtype), (unsigned long long)c->weight_bytes);
}
