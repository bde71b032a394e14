/*
 * be_cuda_rwkv7: the RWKV-7 step on a CUDA device, host side. The math and
 * the stage order are the CPU reference's (be_cpu_rwkv7.c); the kernels are in
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

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k.h"


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

typedef be_cuda_mat cu_mat;

typedef struct cu_layer {
    cu_mat wr, wk, wv, wo; /* C -> C projections */
    cu_mat w1, w2, a1, a2; /* decay and ICLR LoRAs */
    cu_mat v1, v2, g1, g2; /* value residual (absent on layer 0) and gate LoRAs */
    cu_mat fk, fv;         /* channel mix C -> F -> C */
} cu_layer;

struct be_cuda_rwkv7 {
    be_cuda_core core;         /* stream, cuBLAS, weights, GEMM scratch, passes */
    uint32_t L, C, H, N, F, V; /* dimensions */
    float ln_eps;              /* LayerNorm epsilon (the model's: BlinkDL 1e-5, HF norm_eps) */
    float gn_eps;              /* per-head GroupNorm epsilon (BlinkDL 64e-5, HF N * norm_eps) */
    uint32_t Dw, Da, Dv, Dg;   /* LoRA ranks */
    wk_dtype dtype;            /* the model's weight dtype (describe) */
    size_t layer_floats;       /* 2C + H N N */
    size_t slot_floats;        /* L * layer_floats */
    float *arena;              /* device, borrowed from be_cuda */

    cu_mat emb;       /* [V][C] as stored (gathered, never multiplied) */
    float *vecs;      /* device fp32 vectors (G_N + V_PER_LAYER * L) * C */
    cu_layer *layers; /* host array of L, owned */
    cu_mat head;      /* C -> V */

    /* device scratch (fp32), cap tokens unless noted */
    float *x;                 /* residual [cap][C] */
    float *xln;               /* LayerNorm output [cap][C] */
    float *mx;                /* MIX_N buffers [MIX_N][cap][C] */
    float *r, *k, *v, *vf;    /* [cap][C] */
    float *lw, *la, *lv, *lg; /* LoRA hidden [cap][D*] */
    float *hf;                /* channel-mix hidden [cap][F] */
    float *xo;                /* ln_out rows [lcap][C] */
};

static inline float *
cu_mixbuf(const be_cuda_rwkv7 *c, int j)
{
    return c->mx + (size_t)j * c->core.cap * c->C;
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

/* ------------------------------------------------------------------------ */
/* GEMM                                                                      */
/* ------------------------------------------------------------------------ */

/* dst[t * ldd + j] (epi) = sum_i x[t * K + i] W[i][j] for t < T (be_cuda_gemm). */
static wk_err
cu_gemm(be_cuda_rwkv7 *c, const cu_mat *w, const float *x, uint32_t T, float *dst, size_t ldd,
        int epi, wk_diag *d)
{
    return be_cuda_gemm(&c->core, w, x, T, dst, ldd, epi, d);
}

/* ------------------------------------------------------------------------ */
/* a pass                                                                    */
/* ------------------------------------------------------------------------ */

#define CU_TRY(expr) BE_CUDA_TRY(expr)

/* The time mix of layer l: x += W_o(...) */
static wk_err
cu_time_mix(be_cuda_rwkv7 *c, uint32_t l, wk_diag *d)
{
    const cu_layer *ly = &c->layers[l];
    const uint32_t T = c->core.T, C = c->C;
    const size_t cap = c->core.cap;
    const uint32_t *dm = c->core.dmeta;
    const size_t lay_off = (size_t)l * c->layer_floats;
    float *mx0 = cu_mixbuf(c, 0), *mx1 = cu_mixbuf(c, 1), *mx2 = cu_mixbuf(c, 2);
    float *mx3 = cu_mixbuf(c, 3), *mx4 = cu_mixbuf(c, 4), *mx5 = cu_mixbuf(c, 5);

    WK_CUDA_CHECK(k_layernorm_rows(c->x, NULL, T, C, cu_lvec(c, l, V_LN1_W), cu_lvec(c, l, V_LN1_B),
                                   c->ln_eps, c->xln, c->core.stream),
                  d);
    WK_CUDA_CHECK(k_rwkv7_shift_mix(c->xln, T, C, dm + BE_CUDA_M_TSEG * cap,
                                    dm + BE_CUDA_M_SEG_T0 * cap, dm + BE_CUDA_M_SEG_SLOT * cap,
                                    c->arena, c->slot_floats, lay_off, cu_lvec(c, l, V_MIX), MIX_N,
                                    c->mx, cap * C, c->core.stream),
                  d);
    WK_CUDA_CHECK(k_rwkv7_save_shift(c->xln, C, c->core.n_segs, dm + BE_CUDA_M_SEG_T0 * cap,
                                     dm + BE_CUDA_M_SEG_N * cap, dm + BE_CUDA_M_SEG_SLOT * cap,
                                     c->arena, c->slot_floats, lay_off, c->core.stream),
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
                              mx1, mx2, mx4, c->k, c->v, c->vf, c->core.stream),
                  d);
    WK_CUDA_CHECK(k_rwkv7_wkv(c->arena, c->slot_floats, lay_off + 2 * (size_t)C, c->core.n_segs,
                              dm + BE_CUDA_M_SEG_T0 * cap, dm + BE_CUDA_M_SEG_N * cap,
                              dm + BE_CUDA_M_SEG_SLOT * cap, c->H, c->N, C, c->r, mx0, c->k, c->v,
                              mx4, mx1, mx3, cu_lvec(c, l, V_R_K), cu_lvec(c, l, V_LNX_W),
                              cu_lvec(c, l, V_LNX_B), c->gn_eps, mx5,
                              c->core.stream),
                  d);
    CU_TRY(cu_gemm(c, &ly->wo, mx5, T, c->x, C, K_EPI_ADD, d));
    return WK_OK;
}

/* The channel mix of layer l: x += W_v relu(W_k mix)^2 */
static wk_err
cu_channel_mix(be_cuda_rwkv7 *c, uint32_t l, wk_diag *d)
{
    const cu_layer *ly = &c->layers[l];
    const uint32_t T = c->core.T, C = c->C;
    const size_t cap = c->core.cap;
    const uint32_t *dm = c->core.dmeta;
    const size_t shift_off = (size_t)l * c->layer_floats + C;

    WK_CUDA_CHECK(k_layernorm_rows(c->x, NULL, T, C, cu_lvec(c, l, V_LN2_W), cu_lvec(c, l, V_LN2_B),
                                   c->ln_eps, c->xln, c->core.stream),
                  d);
    WK_CUDA_CHECK(k_rwkv7_shift_mix(c->xln, T, C, dm + BE_CUDA_M_TSEG * cap,
                                    dm + BE_CUDA_M_SEG_T0 * cap, dm + BE_CUDA_M_SEG_SLOT * cap,
                                    c->arena, c->slot_floats, shift_off, cu_lvec(c, l, V_FFN_X_K),
                                    1, c->mx, cap * C, c->core.stream),
                  d);
    WK_CUDA_CHECK(k_rwkv7_save_shift(c->xln, C, c->core.n_segs, dm + BE_CUDA_M_SEG_T0 * cap,
                                     dm + BE_CUDA_M_SEG_N * cap, dm + BE_CUDA_M_SEG_SLOT * cap,
                                     c->arena, c->slot_floats, shift_off, c->core.stream),
                  d);
    CU_TRY(cu_gemm(c, &ly->fk, cu_mixbuf(c, 0), T, c->hf, c->F, K_EPI_RELU2, d));
    CU_TRY(cu_gemm(c, &ly->fv, c->hf, T, c->x, C, K_EPI_ADD, d));
    return WK_OK;
}

/* ln_out of the logits rows lpos[0..n-1] into out (be_cuda_norm_fn). */
static wk_err
cu_norm_out(void *arg, const uint32_t *lpos, uint32_t n, float *out, wk_diag *d)
{
    be_cuda_rwkv7 *c = arg;
    WK_CUDA_CHECK(k_layernorm_rows(c->x, lpos, n, c->C, cu_gvec(c, G_LNOUT_W),
                                   cu_gvec(c, G_LNOUT_B), c->ln_eps, out, c->core.stream),
                  d);
    return WK_OK;
}

/* Runs the pass the core describes (be_cuda_pass_fn). */
static wk_err
cu_pass(void *arg, wk_diag *d)
{
    be_cuda_rwkv7 *c = arg;
    WK_CUDA_CHECK(k_rwkv7_embed(c->emb.w, c->emb.dtype, be_cuda_meta(&c->core, BE_CUDA_M_TOK),
                                c->core.T, c->C, cu_gvec(c, G_LN0_W), cu_gvec(c, G_LN0_B),
                                c->ln_eps, c->x, c->core.stream),
                  d);
    for (uint32_t l = 0; l < c->L; l++) {
        CU_TRY(cu_time_mix(c, l, d));
        CU_TRY(cu_channel_mix(c, l, d));
    }
    if (c->core.n_logits > 0)
        CU_TRY(be_cuda_core_logits(&c->core, &c->head, c->xo, cu_norm_out, c, d));
    return WK_OK;
}

wk_err
be_cuda_rwkv7_step(be_cuda_rwkv7 *c, be_row *rows, size_t n, wk_diag *d)
{
    return be_cuda_core_step(&c->core, rows, n, cu_pass, c, d);
}

/* ------------------------------------------------------------------------ */
/* create / free                                                             */
/* ------------------------------------------------------------------------ */

void
be_cuda_rwkv7_free(be_cuda_rwkv7 *c)
{
    if (c == NULL)
        return;
    be_cuda_core_fini(&c->core); /* waits for the stream first */
    void *dev[] = {c->vecs, c->x,  c->xln, c->mx, c->r,  c->k,  c->v,
                   c->vf,   c->lw, c->la,  c->lv, c->lg, c->hf, c->xo};
    be_cuda_free_all(dev, sizeof(dev) / sizeof(dev[0]));
    free(c->layers);
    free(c);
}

static wk_err
cu_upload_weights(be_cuda_rwkv7 *c, const wrk_rwkv7 *rw, wk_diag *d)
{
    const size_t max_up = (size_t)c->L * 14 + 2;
    const wrk_mat **src = calloc(max_up, sizeof(*src));
    cu_mat **dst = calloc(max_up, sizeof(*dst));
    if (src == NULL || dst == NULL) {
        free(src);
        free(dst);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    /* the embedding [V][C], stored like an nn.Linear C -> V: gathered by row on the device */
    const wrk_mat emb = {rw->emb, c->C, c->V, false};
    size_t nu = 0;
    wk_err e = WK_OK;
    src[nu] = &emb;
    dst[nu++] = &c->emb;
    for (uint32_t l = 0; l < c->L && e == WK_OK; l++) {
        const wrk_rwkv7_layer *s = &rw->layers[l];
        cu_layer *ly = &c->layers[l];
        const wrk_mat *ls[] = {&s->wr, &s->wk, &s->wv, &s->wo, &s->w1, &s->w2,      &s->a1,
                               &s->a2, &s->v1, &s->v2, &s->g1, &s->g2, &s->ffn_key, &s->ffn_value};
        cu_mat *ld[] = {&ly->wr, &ly->wk, &ly->wv, &ly->wo, &ly->w1, &ly->w2, &ly->a1,
                        &ly->a2, &ly->v1, &ly->v2, &ly->g1, &ly->g2, &ly->fk, &ly->fv};
        for (size_t i = 0; i < 14; i++) {
            const bool vlora = i == 8 || i == 9;
            if (vlora && l == 0)
                continue; /* layer 0 keeps v_first = v: its value LoRA (if any) is unused */
            if (ls[i]->t == NULL) {
                e = wk_diag_set(d, WK_EINVAL,
                                "cuda backend: layer %u: a weight matrix "
                                "(#%zu) is missing",
                                l, i);
                break;
            }
            src[nu] = ls[i];
            dst[nu++] = ld[i];
        }
    }
    if (e == WK_OK && (rw->emb == NULL || rw->head.t == NULL))
        e = wk_diag_set(d, WK_EINVAL, "cuda backend: the embedding or the head is missing");
    if (e == WK_OK) {
        src[nu] = &rw->head;
        dst[nu++] = &c->head;
        e = be_cuda_core_upload(&c->core, src, dst, nu, d);
    }
    free(src);
    free(dst);
    return e;
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
        e = be_cuda_upload_f32(h, nvec * C, &c->vecs, "vectors", d);
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
    const size_t cap = c->core.cap, C = c->C, lcap = c->core.lcap;
    const uint32_t maxD = cu_max3(c->Dw, c->Da, cu_max3(c->Dv, c->Dg, 1));
    /* widest GEMM input and output of a layer: C, F or a LoRA rank */
    const uint32_t maxK = cu_max3(c->C, c->F, maxD);
    CU_TRY(be_cuda_core_scratch(&c->core, maxK, maxK, c->C, d));
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
        {(void **)&c->xo, lcap * C * 4, "ln_out"},
    };
    for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++)
        CU_TRY(be_cuda_dalloc(a[i].p, a[i].bytes, a[i].what, d));
    /* v_first is read on layer 1+ for every token: keep it defined */
    WK_CUDA_CHECK(cudaMemset(c->vf, 0, cap * C * 4), d);
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
    c->L = rw->n_layer;
    c->C = rw->n_embd;
    c->H = rw->n_head;
    c->N = rw->head_size;
    c->ln_eps = (float)rw->ln_eps;
    c->gn_eps = (float)rw->gn_eps;
    c->F = rw->ffn_dim;
    c->V = rw->vocab_size;
    c->Dw = rw->lora_w;
    c->Da = rw->lora_a;
    c->Dv = rw->lora_v;
    c->Dg = rw->lora_g;
    c->dtype = rw->head.t != NULL ? rw->head.t->dtype : WK_DTYPE_F32;
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
    c->layers = calloc(c->L ? c->L : 1, sizeof(*c->layers));
    if (c->layers == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto fail;
    }
    if ((e = be_cuda_core_init(&c->core, cfg, c->V, c->arena, n_slots, slot_bytes, d)) != WK_OK)
        goto fail;
    if ((e = cu_upload_weights(c, rw, d)) != WK_OK)
        goto fail;
    if ((e = cu_upload_vecs(c, rw, d)) != WK_OK)
        goto fail;
    if ((e = cu_alloc_scratch(c, d)) != WK_OK)
        goto fail;
    if ((e = be_cuda_open_sync(d)) != WK_OK)
        goto fail;
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
    snprintf(buf, len, "pass_tokens=%u weights=%s weight_bytes=%llu gemm=cublas-split16",
             c->core.cap, wk_dtype_name(c->dtype), (unsigned long long)c->core.weight_bytes);
}

/* ------------------------------------------------------------------------ */
/* the family seam                                                           */
/* ------------------------------------------------------------------------ */

static wk_err
cu_fam_create(const be_config *cfg, const wrk_model *m, float *arena, uint32_t n_slots,
              uint64_t slot_bytes, void **out, wk_diag *d)
{
    const wrk_rwkv7 *rw = wrk_model_rwkv7(m);
    if (rw == NULL)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: not an rwkv7 model");
    be_cuda_rwkv7 *c = NULL;
    CU_TRY(be_cuda_rwkv7_new(cfg, rw, arena, n_slots, slot_bytes, &c, d));
    *out = c;
    return WK_OK;
}

static void
cu_fam_destroy(void *impl)
{
    be_cuda_rwkv7_free(impl);
}

static wk_err
cu_fam_step(void *impl, be_row *rows, size_t n, wk_diag *d)
{
    return be_cuda_rwkv7_step(impl, rows, n, d);
}

static void
cu_fam_describe(const void *impl, char *buf, size_t len)
{
    be_cuda_rwkv7_describe(impl, buf, len);
}

const be_cuda_family be_cuda_rwkv7_family = {
    .views = (const char *const[]){"rwkv7", NULL},
    .create = cu_fam_create,
    .destroy = cu_fam_destroy,
    .step = cu_fam_step,
    .describe = cu_fam_describe,
};
