/*
 * be_cuda_gdn: the Gated DeltaNet step on a CUDA device, host side (the
 * family be_cuda.c reaches through be_cuda_gdn_family). The math, the
 * stage order and the slot layout are the CPU reference's (be_cpu_gdn.c,
 * wrk_gdn.h); the kernels are kernels/k_gdn.cu and k_common.cu behind
 * kernels/k.h.
 *
 * At creation every projection, the head and the embedding (the same
 * device bytes when tied) are copied to the device as stored; the vectors
 * (norm weights, -exp(A_log), dt_bias, conv taps as stored [D][W]) are
 * widened to fp32. A pass (be_cuda_core: at most `cap` tokens, rows cut as
 * the CPU cuts them) runs per layer: attn_norm, the q / k / v / a / b (/ g)
 * GEMMs for every token, the three short convs + SiLU per (segment,
 * channel) in token order over the slot's histories, the q / k L2 norms
 * (q scaled by K^-0.5), decay and beta, the delta rule per (segment, value
 * head, 32-column tile) in token order over the slot's S, the gated
 * per-head RMSNorm, o_proj added into the residual, then mlp_norm, the
 * gate / up GEMMs, SiLU(gate) * up and down added into the residual; the
 * final norm and the head for the logits rows only.
 *
 * Hybrid models (attention layers, wrk_gdn.h): the slot layout lists only
 * the Gated DeltaNet layers (layer l's state at its delta index), and the
 * attention layers' K / V live in a paged device pool (be_kv.h, be_cuda_kv.h) of
 * be_config.kv_pages pages of GDN_KV_PAGE_TOKENS tokens (default, as the
 * CPU: every slot can hold GDN_KV_DEF_CTX tokens at once; unlike the CPU
 * the device memory is allocated at open), handed to be_cuda.c through
 * be_cuda_gdn_family.kv for the slot operations. A step takes its rows'
 * pages after the row checks and before any device call (gdn_pre_step:
 * refused whole with WK_EQUOTA naming the row), which fixes each row's
 * first position (its slot's n_ctx before the step, 0 for a reset row). Each pass uploads,
 * per segment, the segment's first position and its slot's page table
 * (the pass's slots are distinct, so the tables fit in pages_total
 * entries). An attention layer runs: the q / k / v GEMMs, the biases, the
 * per-head q / k RMSNorm, RoPE at each token's absolute position and the
 * append of every pass token's K / V to its slot's pages (k_attn_rope_store),
 * then per (token, query head) softmax attention over positions 0..pos
 * through the page table (k_attn), then o_proj added into the residual.
 *
 * Numerics and batch invariance are the RWKV-7 step's (be_cuda_rwkv7.c):
 * cuBLAS GEMMs with fp32 compute (16-bit weights against the hi + lo halves
 * of the activations), every other reduction in a fixed order per row; a
 * row's bits are repeatable for one pass composition and agree with the CPU
 * (and across chunkings) to GEMM rounding.
 *
 * Must never: log, abort on bad input, or change any slot when a step is
 * refused (be_cuda_core_step checks every row first).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be_cuda_common.h"
#include "be_cuda_kv.h"
#include "k.h"
#include "wrk_gdn.h"

#define GDN_MAX_CONV 64u       /* conv taps limit (the CPU's and the kernel's) */
#define GDN_KV_PAGE_TOKENS 16u /* tokens per KV page (the CPU's, be_cpu_gdn.c) */
#define GDN_KV_DEF_CTX 2048u   /* default pool: this many tokens for every slot (the CPU's) */
#define GDN_ATT_MAX_DIM 1024u  /* attention head dim (k_attn's limit, the CPU's) */

/* Offsets of a layer's vectors in the device vector block (floats). */
enum {
    GV_ATTN_NORM = 0,
    GV_MLP_NORM,
    GV_O_NORM,
    GV_NEG_A,
    GV_DT_BIAS,
    GV_CQ,
    GV_CK,
    GV_CV,
    GV_BQ, /* attention layers: qkv biases (qkv_bias), q / k norm weights (qk_norm) */
    GV_BK,
    GV_BV,
    GV_NQ,
    GV_NK,
    GV_N
};

typedef struct gdn_layer {
    bool is_attn;                      /* softmax attention layer (hybrid models) */
    uint32_t idx;                      /* index among the delta (or attention) layers */
    const float *bq, *bk, *bv;         /* attention: biases [QD], [KVD], [KVD]; NULL without */
    const float *nq, *nk;              /* attention: q / k norm weights [Da]; NULL without */
    const float *attn_norm, *mlp_norm; /* [C], device */
    const float *o_norm;               /* [Vd], device */
    const float *neg_A, *dt_bias;      /* [HV], device */
    const float *cq, *ck, *cv;         /* conv taps [KD][W], [KD][W], [VD][W], device */
    be_cuda_mat wq, wk, wv, wa, wb;    /* input projections (attention: q, k, v only) */
    be_cuda_mat wg;                    /* output gate (use_gate only) */
    be_cuda_mat wo;                    /* VD -> C (attention: QD -> C) */
    be_cuda_mat gate, up, down;        /* MLP */
} gdn_layer;

typedef struct be_cuda_gdn {
    be_cuda_core core;                         /* stream, cuBLAS, weights, scratch, passes */
    uint32_t L, C, H, K, HV, Vd, KD, VD, W, F; /* dimensions (wrk_gdn.h) */
    uint32_t V;                                /* vocab */
    double eps;                                /* every RMSNorm's epsilon */
    bool use_gate;                             /* o_norm gated by SiLU(g_proj x) */
    bool tied;                                 /* the head is the embedding */
    float beta_scale;                          /* 1 or 2 (allow_neg_eigval) */
    float q_scale;                             /* K^-0.5 */
    wk_dtype dtype;                            /* the weights' dtype (describe) */
    size_t layer_floats;                       /* floats per layer in a slot */
    size_t slot_floats;                        /* (L - n_attn) * layer_floats */
    float *arena;                              /* device, borrowed from be_cuda */

    float *vecs;       /* device block of every fp32 vector, owned */
    const float *norm; /* final norm [C], into vecs */
    gdn_layer *layers; /* host array of L, owned */
    be_cuda_mat emb;   /* [V][C] as stored */
    be_cuda_mat head;  /* C -> V (tied: the embedding's bytes) */

    /* device scratch (fp32), cap tokens unless noted */
    float *x;            /* residual [cap][C] */
    float *xn;           /* normed input [cap][C] */
    float *qr, *kr, *vr; /* projections before the conv [cap][KD|KD|VD] */
    float *q, *k, *v;    /* after conv + SiLU (+ L2 norm) */
    float *ar, *br;      /* a / b projections [cap][HV]; then decay / beta */
    float *gr;           /* g_proj [cap][VD] */
    float *o;            /* recurrence output [cap][VD] */
    float *hg, *hu;      /* MLP hidden [cap][F] */
    float *xo;           /* final-norm rows [lcap][C] */

    /* hybrid attention layers (n_attn 0: none of this is allocated) */
    uint32_t n_attn;      /* attention layers */
    uint32_t Hq, Hkv, Da; /* query heads, KV heads, head dim */
    uint32_t QD, KVD;     /* Hq * Da, Hkv * Da */
    double attn_eps;      /* q / k norm epsilon */
    double rope_theta;    /* RoPE base */
    float att_scale;      /* Da^-0.5 */
    double *inv_freq;     /* RoPE inverse frequencies [Da / 2], device */
    be_kv kv;             /* the KV page pool */
    uint32_t *pos_next;   /* next position of each slot in the running step [n_slots], host */
    uint32_t *hkv;        /* pinned pass KV metadata: seg_pos [cap], seg_pg [cap], pages */
    uint32_t *dkv;        /* its device copy [2 cap + pages_total] */
    float *aq, *ak, *av;  /* attention q [cap][QD], k / v [cap][KVD] */
    float *ao;            /* attention output [cap][QD] */
} be_cuda_gdn;

/* Offsets of a layer's state tensors (floats, wrk_gdn.h). */
static size_t
gdn_off_kconv(const be_cuda_gdn *c)
{
    return (size_t)(c->W - 1) * c->KD;
}

static size_t
gdn_off_vconv(const be_cuda_gdn *c)
{
    return 2 * (size_t)(c->W - 1) * c->KD;
}

static size_t
gdn_off_S(const be_cuda_gdn *c)
{
    return (size_t)(c->W - 1) * (2 * (size_t)c->KD + c->VD);
}

/* ------------------------------------------------------------------------ */
/* a pass                                                                    */
/* ------------------------------------------------------------------------ */

/* The Gated DeltaNet mixer of layer l over the pass (xn holds attn_norm's output), into x. */
static wk_err
gdn_mixer(be_cuda_gdn *c, uint32_t l, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    const gdn_layer *ly = &c->layers[l];
    const uint32_t T = co->T, ns = co->n_segs;
    const size_t lay_off = (size_t)ly->idx * c->layer_floats;
    const uint32_t *seg_t0 = be_cuda_meta(co, BE_CUDA_M_SEG_T0);
    const uint32_t *seg_n = be_cuda_meta(co, BE_CUDA_M_SEG_N);
    const uint32_t *seg_slot = be_cuda_meta(co, BE_CUDA_M_SEG_SLOT);

    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wq, c->xn, T, c->qr, c->KD, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wk, c->xn, T, c->kr, c->KD, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wv, c->xn, T, c->vr, c->VD, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wa, c->xn, T, c->ar, c->HV, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wb, c->xn, T, c->br, c->HV, K_EPI_STORE, d));
    if (c->use_gate)
        BE_CUDA_TRY(be_cuda_gemm(co, &ly->wg, c->xn, T, c->gr, c->VD, K_EPI_STORE, d));

    /* each (segment, channel) thread reads its history, then writes it back */
    WK_CUDA_CHECK(k_gdn_conv(c->qr, c->KD, c->W, ly->cq, ns, seg_t0, seg_n, seg_slot, c->arena,
                             c->slot_floats, lay_off, c->q, co->stream),
                  d);
    WK_CUDA_CHECK(k_gdn_conv(c->kr, c->KD, c->W, ly->ck, ns, seg_t0, seg_n, seg_slot, c->arena,
                             c->slot_floats, lay_off + gdn_off_kconv(c), c->k, co->stream),
                  d);
    WK_CUDA_CHECK(k_gdn_conv(c->vr, c->VD, c->W, ly->cv, ns, seg_t0, seg_n, seg_slot, c->arena,
                             c->slot_floats, lay_off + gdn_off_vconv(c), c->v, co->stream),
                  d);
    WK_CUDA_CHECK(k_gdn_l2norm(c->q, T, c->H, c->K, c->q_scale, co->stream), d);
    WK_CUDA_CHECK(k_gdn_l2norm(c->k, T, c->H, c->K, 1.0f, co->stream), d);
    WK_CUDA_CHECK(k_gdn_gates(c->ar, c->br, (size_t)T * c->HV, c->HV, ly->neg_A, ly->dt_bias,
                              c->beta_scale, co->stream),
                  d);
    WK_CUDA_CHECK(k_gdn_delta(c->arena, c->slot_floats, lay_off + gdn_off_S(c), ns, seg_t0, seg_n,
                              seg_slot, c->H, c->HV, c->K, c->Vd, c->q, c->k, c->v, c->ar, c->br,
                              c->o, co->stream),
                  d);
    WK_CUDA_CHECK(k_gdn_onorm(c->o, c->use_gate ? c->gr : NULL, T, c->HV, c->Vd, ly->o_norm, c->eps,
                              co->stream),
                  d);
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wo, c->o, T, c->x, c->C, K_EPI_ADD, d));
    return WK_OK;
}

/*
 * An attention layer over the pass (xn holds attn_norm's output), added
 * into x. Every pass token's K / V is stored before any token attends.
 */
static wk_err
gdn_attention(be_cuda_gdn *c, const gdn_layer *ly, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    const uint32_t T = co->T;
    const uint32_t *tseg = be_cuda_meta(co, BE_CUDA_M_TSEG);
    const uint32_t *seg_t0 = be_cuda_meta(co, BE_CUDA_M_SEG_T0);
    const uint32_t *seg_pos = c->dkv, *seg_pg = c->dkv + co->cap, *pages = c->dkv + 2 * co->cap;
    const size_t kv_off = (size_t)ly->idx * 2 * c->KVD;

    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wq, c->xn, T, c->aq, c->QD, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wk, c->xn, T, c->ak, c->KVD, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wv, c->xn, T, c->av, c->KVD, K_EPI_STORE, d));
    if (ly->bq != NULL) {
        WK_CUDA_CHECK(k_add_rows(c->aq, ly->bq, T, c->QD, co->stream), d);
        WK_CUDA_CHECK(k_add_rows(c->ak, ly->bk, T, c->KVD, co->stream), d);
        WK_CUDA_CHECK(k_add_rows(c->av, ly->bv, T, c->KVD, co->stream), d);
    }
    if (ly->nq != NULL) {
        /* per head: rows of Da, in place */
        WK_CUDA_CHECK(
            k_rmsnorm_rows(c->aq, NULL, T * c->Hq, c->Da, ly->nq, c->attn_eps, c->aq, co->stream),
            d);
        WK_CUDA_CHECK(
            k_rmsnorm_rows(c->ak, NULL, T * c->Hkv, c->Da, ly->nk, c->attn_eps, c->ak, co->stream),
            d);
    }
    WK_CUDA_CHECK(k_attn_rope_store(c->aq, c->ak, c->av, T, c->Hq, c->Hkv, c->Da, c->inv_freq, tseg,
                                    seg_t0, seg_pos, seg_pg, pages, c->kv.pool, c->kv.page_tokens,
                                    c->kv.tok_floats, kv_off, co->stream),
                  d);
    WK_CUDA_CHECK(k_attn(c->aq, T, c->Hq, c->Hkv, c->Da, c->att_scale, tseg, seg_t0, seg_pos,
                         seg_pg, pages, c->kv.pool, c->kv.page_tokens, c->kv.tok_floats, kv_off,
                         c->ao, co->stream),
                  d);
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wo, c->ao, T, c->x, c->C, K_EPI_ADD, d));
    return WK_OK;
}

/*
 * The pass's KV metadata (hybrid models): per segment its first position
 * (the slot's running position, advanced here: passes run in order) and
 * its slot's pages up to its last token, uploaded on the step's stream.
 * The pinned buffer is free: the previous pass has completed.
 */
static wk_err
gdn_kv_meta(be_cuda_gdn *c, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    const size_t cap = co->cap;
    const uint32_t *seg_n = co->hmeta + BE_CUDA_M_SEG_N * cap;
    const uint32_t *seg_slot = co->hmeta + BE_CUDA_M_SEG_SLOT * cap;
    uint32_t *seg_pos = c->hkv, *seg_pg = c->hkv + cap, *pages = c->hkv + 2 * cap;
    size_t np = 0;
    for (uint32_t s = 0; s < co->n_segs; s++) {
        const uint32_t slot = seg_slot[s];
        const be_kv_slot *ks = &c->kv.slots[slot];
        const uint32_t pos = c->pos_next[slot], end = pos + seg_n[s];
        const uint32_t need = be_kv_pages_for(&c->kv, end);
        if (end > ks->n_ctx || np + need > c->kv.pages_total)
            return wk_diag_set(d, WK_ESTATE,
                               "cuda backend: segment %u: slot %u tokens %u..%u past its %u KV "
                               "tokens",
                               s, slot, pos, end, ks->n_ctx);
        seg_pos[s] = pos;
        seg_pg[s] = (uint32_t)np;
        memcpy(pages + np, ks->pages, sizeof(uint32_t) * need);
        np += need;
        c->pos_next[slot] = end;
    }
    WK_CUDA_CHECK(cudaMemcpyAsync(c->dkv, c->hkv, sizeof(uint32_t) * (2 * cap + np),
                                  cudaMemcpyHostToDevice, co->stream),
                  d);
    return WK_OK;
}

static wk_err
gdn_layer_run(be_cuda_gdn *c, uint32_t l, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    const gdn_layer *ly = &c->layers[l];
    const uint32_t T = co->T;
    WK_CUDA_CHECK(k_rmsnorm_rows(c->x, NULL, T, c->C, ly->attn_norm, c->eps, c->xn, co->stream), d);
    if (ly->is_attn)
        BE_CUDA_TRY(gdn_attention(c, ly, d));
    else
        BE_CUDA_TRY(gdn_mixer(c, l, d));
    WK_CUDA_CHECK(k_rmsnorm_rows(c->x, NULL, T, c->C, ly->mlp_norm, c->eps, c->xn, co->stream), d);
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->gate, c->xn, T, c->hg, c->F, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->up, c->xn, T, c->hu, c->F, K_EPI_STORE, d));
    WK_CUDA_CHECK(k_swiglu(c->hg, c->hu, (size_t)T * c->F, co->stream), d);
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->down, c->hg, T, c->x, c->C, K_EPI_ADD, d));
    return WK_OK;
}

/* The final norm of the logits rows lpos[0..n-1] into out (be_cuda_norm_fn). */
static wk_err
gdn_norm_final(void *arg, const uint32_t *lpos, uint32_t n, float *out, wk_diag *d)
{
    be_cuda_gdn *c = arg;
    WK_CUDA_CHECK(k_rmsnorm_rows(c->x, lpos, n, c->C, c->norm, c->eps, out, c->core.stream), d);
    return WK_OK;
}

static wk_err
gdn_pass(void *arg, wk_diag *d)
{
    be_cuda_gdn *c = arg;
    be_cuda_core *co = &c->core;
    WK_CUDA_CHECK(k_embed_rows(c->emb.w, c->emb.dtype, be_cuda_meta(co, BE_CUDA_M_TOK), co->T, c->C,
                               c->x, co->stream),
                  d);
    if (c->n_attn > 0)
        BE_CUDA_TRY(gdn_kv_meta(c, d));
    for (uint32_t l = 0; l < c->L; l++)
        BE_CUDA_TRY(gdn_layer_run(c, l, d));
    if (co->n_logits > 0)
        BE_CUDA_TRY(be_cuda_core_logits(co, &c->head, c->xo, gdn_norm_final, c, d));
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* create / destroy                                                          */
/* ------------------------------------------------------------------------ */

static void
gdn_destroy(void *impl)
{
    be_cuda_gdn *c = impl;
    if (c == NULL)
        return;
    be_cuda_core_fini(&c->core); /* waits for the stream first */
    void *dev[] = {c->vecs, c->x,  c->xn, c->qr, c->kr,  c->vr,      c->q,  c->k,
                   c->v,    c->ar, c->br, c->gr, c->o,   c->hg,      c->hu, c->xo,
                   c->aq,   c->ak, c->av, c->ao, c->dkv, c->inv_freq};
    be_cuda_free_all(dev, sizeof(dev) / sizeof(dev[0]));
    if (c->hkv != NULL)
        (void)cudaFreeHost(c->hkv);
    be_cuda_kv_fini(&c->kv);
    free(c->pos_next);
    free(c->layers);
    free(c);
}

/* n values of t as fp32 at h + *off; records the offset in *field, advances *off. */
static wk_err
gdn_vec(const wk_tensor *t, size_t n, float *h, size_t *off, size_t *field, wk_diag *d)
{
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: a gdn vector tensor is missing");
    if (wk_tensor_read_f32(t, 0, n, h + *off) != WK_OK)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: cannot read %s as %zu values", t->name, n);
    *field = *off;
    *off += n;
    return WK_OK;
}

/* Device pointer of a vector recorded at offset o (SIZE_MAX: absent). */
static const float *
gdn_vec_at(const be_cuda_gdn *c, size_t o)
{
    return o == SIZE_MAX ? NULL : c->vecs + o;
}

static wk_err
gdn_upload_vecs(be_cuda_gdn *c, const wrk_gdn *g, wk_diag *d)
{
    const size_t C = c->C, HV = c->HV, KD = c->KD, VD = c->VD, W = c->W;
    /* an upper bound per layer: the larger of a delta and an attention layer */
    const size_t per_layer =
        2 * C + c->Vd + 2 * HV + W * (2 * KD + VD) + c->QD + 2 * (size_t)c->KVD + 2 * c->Da;
    const size_t total = C + per_layer * c->L;
    float *h = calloc(total ? total : 1, sizeof(float));
    size_t *offs = malloc((1 + GV_N * (size_t)c->L) * sizeof(size_t));
    if (h == NULL || offs == NULL) {
        free(h);
        free(offs);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < 1 + GV_N * (size_t)c->L; i++)
        offs[i] = SIZE_MAX;
    size_t off = 0;
    wk_err e = gdn_vec(g->norm, C, h, &off, &offs[0], d);
    for (uint32_t l = 0; l < c->L && e == WK_OK; l++) {
        const wrk_gdn_layer *s = &g->layers[l];
        size_t *o = offs + 1 + GV_N * (size_t)l;
        const bool at = s->mixer == WRK_MIXER_ATTN, bias = at && g->qkv_bias,
                   qkn = at && g->qk_norm;
        /* n 0: the layer has no such vector */
        const struct {
            const wk_tensor *t;
            size_t n;
        } vs[GV_N] = {
            [GV_ATTN_NORM] = {s->attn_norm, C},        [GV_MLP_NORM] = {s->mlp_norm, C},
            [GV_O_NORM] = {s->o_norm, at ? 0 : c->Vd}, [GV_NEG_A] = {s->A_log, at ? 0 : HV},
            [GV_DT_BIAS] = {s->dt_bias, at ? 0 : HV},  [GV_CQ] = {s->q_conv, at ? 0 : KD * W},
            [GV_CK] = {s->k_conv, at ? 0 : KD * W},    [GV_CV] = {s->v_conv, at ? 0 : VD * W},
            [GV_BQ] = {s->q_bias, bias ? c->QD : 0},   [GV_BK] = {s->k_bias, bias ? c->KVD : 0},
            [GV_BV] = {s->v_bias, bias ? c->KVD : 0},  [GV_NQ] = {s->q_norm, qkn ? c->Da : 0},
            [GV_NK] = {s->k_norm, qkn ? c->Da : 0}};
        for (int i = 0; i < GV_N && e == WK_OK; i++)
            if (vs[i].n > 0)
                e = gdn_vec(vs[i].t, vs[i].n, h, &off, &o[i], d);
        if (e == WK_OK && !at) {
            float *na = h + o[GV_NEG_A];
            for (size_t j = 0; j < HV; j++)
                na[j] = -expf(na[j]);
        }
    }
    if (e == WK_OK)
        e = be_cuda_upload_f32(h, off, &c->vecs, "vectors", d);
    if (e == WK_OK) {
        c->norm = gdn_vec_at(c, offs[0]);
        for (uint32_t l = 0; l < c->L; l++) {
            const size_t *o = offs + 1 + GV_N * (size_t)l;
            gdn_layer *ly = &c->layers[l];
            ly->attn_norm = gdn_vec_at(c, o[GV_ATTN_NORM]);
            ly->mlp_norm = gdn_vec_at(c, o[GV_MLP_NORM]);
            ly->o_norm = gdn_vec_at(c, o[GV_O_NORM]);
            ly->neg_A = gdn_vec_at(c, o[GV_NEG_A]);
            ly->dt_bias = gdn_vec_at(c, o[GV_DT_BIAS]);
            ly->cq = gdn_vec_at(c, o[GV_CQ]);
            ly->ck = gdn_vec_at(c, o[GV_CK]);
            ly->cv = gdn_vec_at(c, o[GV_CV]);
            ly->bq = gdn_vec_at(c, o[GV_BQ]);
            ly->bk = gdn_vec_at(c, o[GV_BK]);
            ly->bv = gdn_vec_at(c, o[GV_BV]);
            ly->nq = gdn_vec_at(c, o[GV_NQ]);
            ly->nk = gdn_vec_at(c, o[GV_NK]);
        }
    }
    free(h);
    free(offs);
    return e;
}

/*
 * The expected (k, n) of each of a layer's matrices, in gdn_upload_mats'
 * order; n 0: the layer has no such matrix (attention layers: a, b, g).
 */
static void
gdn_mat_shapes(const be_cuda_gdn *c, bool is_attn, uint32_t k[10], uint32_t n[10])
{
    const uint32_t kd[10] = {c->C, c->C, c->C, c->C, c->C, c->C, c->VD, c->C, c->C, c->F};
    const uint32_t nd[10] = {c->KD, c->KD, c->VD, c->HV, c->HV, c->use_gate ? c->VD : 0,
                             c->C,  c->F,  c->F,  c->C};
    const uint32_t ka[10] = {c->C, c->C, c->C, c->C, c->C, c->C, c->QD, c->C, c->C, c->F};
    const uint32_t na[10] = {c->QD, c->KVD, c->KVD, 0, 0, 0, c->C, c->F, c->F, c->C};
    memcpy(k, is_attn ? ka : kd, sizeof(kd));
    memcpy(n, is_attn ? na : nd, sizeof(nd));
}

static wk_err
gdn_upload_mats(be_cuda_gdn *c, const wrk_gdn *g, wk_diag *d)
{
    const size_t max = (size_t)c->L * 10 + 2;
    const wrk_mat **src = calloc(max, sizeof(*src));
    be_cuda_mat **dst = calloc(max, sizeof(*dst));
    if (src == NULL || dst == NULL) {
        free(src);
        free(dst);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    const wrk_mat emb = {g->emb, c->C, c->V, false}; /* [V][C]: an nn.Linear C -> V */
    size_t nu = 0;
    wk_err e =
        g->emb != NULL ? WK_OK : wk_diag_set(d, WK_EINVAL, "cuda backend: gdn embedding missing");
    src[nu] = &emb;
    dst[nu++] = &c->emb;
    for (uint32_t l = 0; l < c->L && e == WK_OK; l++) {
        const wrk_gdn_layer *s = &g->layers[l];
        gdn_layer *ly = &c->layers[l];
        uint32_t ek[10], en[10];
        gdn_mat_shapes(c, s->mixer == WRK_MIXER_ATTN, ek, en);
        const wrk_mat *sm[10] = {&s->q_proj, &s->k_proj, &s->v_proj,    &s->a_proj,  &s->b_proj,
                                 &s->g_proj, &s->o_proj, &s->gate_proj, &s->up_proj, &s->down_proj};
        be_cuda_mat *dm[10] = {&ly->wq, &ly->wk, &ly->wv,   &ly->wa, &ly->wb,
                               &ly->wg, &ly->wo, &ly->gate, &ly->up, &ly->down};
        for (size_t i = 0; i < 10; i++) {
            if (en[i] == 0)
                continue; /* g_proj without use_gate; a / b / g on attention layers */
            if (sm[i]->t == NULL || sm[i]->n_in != ek[i] || sm[i]->n_out != en[i]) {
                e = wk_diag_set(d, WK_EINVAL,
                                "cuda backend: gdn layer %u: weight matrix #%zu missing or not "
                                "%u -> %u",
                                l, i, ek[i], en[i]);
                break;
            }
            src[nu] = sm[i];
            dst[nu++] = dm[i];
        }
    }
    if (e == WK_OK && !c->tied) {
        if (g->head.t == NULL || g->head.n_in != c->C || g->head.n_out != c->V)
            e = wk_diag_set(d, WK_EINVAL, "cuda backend: gdn head missing or not %u -> %u", c->C,
                            c->V);
        src[nu] = &g->head;
        dst[nu++] = &c->head;
    }
    if (e == WK_OK)
        e = be_cuda_core_upload(&c->core, src, dst, nu, d);
    if (e == WK_OK && c->tied)
        c->head = c->emb;
    free(src);
    free(dst);
    return e;
}

static wk_err
gdn_alloc_scratch(be_cuda_gdn *c, wk_diag *d)
{
    const size_t cap = c->core.cap, lcap = c->core.lcap;
    uint32_t max_k = c->C, max_n = c->C;
    const uint32_t ks[] = {c->VD, c->F, c->QD}, ns[] = {c->KD, c->VD, c->HV, c->F, c->QD, c->KVD};
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++)
        max_k = ks[i] > max_k ? ks[i] : max_k;
    for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++)
        max_n = ns[i] > max_n ? ns[i] : max_n;
    BE_CUDA_TRY(be_cuda_core_scratch(&c->core, max_k, max_n, c->C, d));
    struct {
        float **p;
        size_t n;
        const char *what;
    } a[] = {
        {&c->x, cap * c->C, "x"},      {&c->xn, cap * c->C, "xn"},    {&c->qr, cap * c->KD, "q"},
        {&c->kr, cap * c->KD, "k"},    {&c->vr, cap * c->VD, "v"},    {&c->q, cap * c->KD, "q"},
        {&c->k, cap * c->KD, "k"},     {&c->v, cap * c->VD, "v"},     {&c->ar, cap * c->HV, "a"},
        {&c->br, cap * c->HV, "b"},    {&c->gr, cap * c->VD, "g"},    {&c->o, cap * c->VD, "o"},
        {&c->hg, cap * c->F, "mlp g"}, {&c->hu, cap * c->F, "mlp u"}, {&c->xo, lcap * c->C, "norm"},
    };
    for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++)
        BE_CUDA_TRY(be_cuda_dalloc((void **)a[i].p, a[i].n * sizeof(float), a[i].what, d));
    if (c->n_attn > 0) {
        BE_CUDA_TRY(be_cuda_dalloc((void **)&c->aq, cap * c->QD * sizeof(float), "attn q", d));
        BE_CUDA_TRY(be_cuda_dalloc((void **)&c->ak, cap * c->KVD * sizeof(float), "attn k", d));
        BE_CUDA_TRY(be_cuda_dalloc((void **)&c->av, cap * c->KVD * sizeof(float), "attn v", d));
        BE_CUDA_TRY(be_cuda_dalloc((void **)&c->ao, cap * c->QD * sizeof(float), "attn o", d));
    }
    return WK_OK;
}

/*
 * The hybrid parts: the KV pool (cfg->kv_pages, else the CPU's default:
 * GDN_KV_DEF_CTX tokens for every slot), the per-pass KV metadata, the
 * RoPE frequencies (computed in double as the CPU does).
 */
static wk_err
gdn_open_attention(be_cuda_gdn *c, const be_config *cfg, uint32_t n_slots, wk_diag *d)
{
    const uint64_t def =
        ((uint64_t)(n_slots - 1) * GDN_KV_DEF_CTX + GDN_KV_PAGE_TOKENS - 1) / GDN_KV_PAGE_TOKENS;
    const uint64_t pages = cfg->kv_pages ? cfg->kv_pages : def;
    if (pages > UINT32_MAX / GDN_KV_PAGE_TOKENS)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: kv_pages %llu over %u",
                           (unsigned long long)pages, UINT32_MAX / GDN_KV_PAGE_TOKENS);
    BE_CUDA_TRY(be_cuda_kv_init(&c->kv, n_slots, (size_t)c->n_attn * 2 * c->KVD, GDN_KV_PAGE_TOKENS,
                                (uint32_t)pages, d));
    c->att_scale = (float)(1.0 / sqrt((double)c->Da));
    c->pos_next = calloc(n_slots, sizeof(uint32_t));
    double *fr = malloc(sizeof(double) * (c->Da / 2));
    if (c->pos_next == NULL || fr == NULL) {
        free(fr);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < c->Da / 2; i++)
        fr[i] = pow(c->rope_theta, -(double)(2 * i) / (double)c->Da);
    wk_err e = be_cuda_dalloc((void **)&c->inv_freq, sizeof(double) * (c->Da / 2), "rope", d);
    if (e == WK_OK) {
        cudaError_t ce =
            cudaMemcpy(c->inv_freq, fr, sizeof(double) * (c->Da / 2), cudaMemcpyHostToDevice);
        if (ce != cudaSuccess)
            e = wk_diag_set(d, WK_EDEVICE, "cuda backend: rope upload: %s", be_cuda_handled(ce));
    }
    free(fr);
    if (e != WK_OK)
        return e;
    const size_t meta = 2 * (size_t)c->core.cap + c->kv.pages_total;
    BE_CUDA_TRY(be_cuda_dalloc((void **)&c->dkv, sizeof(uint32_t) * meta, "kv meta", d));
    cudaError_t ce = cudaMallocHost((void **)&c->hkv, sizeof(uint32_t) * meta);
    if (ce != cudaSuccess) {
        c->hkv = NULL;
        return wk_diag_set(d, WK_EDEVICE, "cuda backend: pinned KV metadata (%zu entries): %s",
                           meta, be_cuda_handled(ce));
    }
    return WK_OK;
}

/*
 * The step's KV pages (be_cuda_core.pre_step: after the row checks, before
 * any device call): refused whole with WK_EQUOTA naming the row; then each
 * row's slot starts at its old n_ctx (0 for a reset row, whose pages went
 * back first).
 */
static wk_err
gdn_pre_step(void *arg, const be_row *rows, size_t n, wk_diag *d)
{
    be_cuda_gdn *c = arg;
    BE_CUDA_TRY(be_kv_reserve(&c->kv, rows, n, d));
    for (size_t i = 0; i < n; i++)
        if (rows[i].slot != 0)
            c->pos_next[rows[i].slot] = c->kv.slots[rows[i].slot].pos0;
    return WK_OK;
}

static wk_err
gdn_create(const be_config *cfg, const wrk_model *m, float *arena, uint32_t n_slots,
           uint64_t slot_bytes, void **out, wk_diag *d)
{
    if (cfg == NULL || m == NULL || arena == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: missing config, model or arena");
    const wrk_gdn *g = wrk_model_view(m, "gdn");
    if (g == NULL)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: not a gdn model");
    /*
     * Only Gated DeltaNet / attention mixers each followed by a SwiGLU MLP run
     * here: Mamba2 mixers, mixer-only or MLP-only layers and squared-ReLU MLPs
     * (Nemotron-H) are refused by name, as are Qwen3.5's and Granite-4.0-H's
     * conventions and experts; never run as fla's (before the geometry checks:
     * a model without Gated DeltaNet layers has no conv_size).
     */
    for (uint32_t l = 0; l < g->n_layer; l++) {
        const wrk_gdn_layer *ly = &g->layers[l];
        if ((ly->mixer != WRK_MIXER_GDN && ly->mixer != WRK_MIXER_ATTN) ||
            (ly->mlp != WRK_MLP_SWIGLU && ly->mlp != WRK_MLP_MOE))
            return wk_diag_set(d, WK_ENOTSUP,
                               "cuda backend: %s (layer %u: %s mixer, %s MLP) runs on the cpu "
                               "backend only",
                               wrk_model_info_get(m)->family, l,
                               ly->mixer == WRK_MIXER_MAMBA2 ? "mamba2"
                               : ly->mixer == WRK_MIXER_NONE ? "no"
                                                             : "gdn/attention",
                               ly->mlp == WRK_MLP_RELU2  ? "squared-relu"
                               : ly->mlp == WRK_MLP_NONE ? "no"
                                                         : "swiglu/moe");
    }
    bool experts = false;
    for (uint32_t l = 0; l < g->n_layer; l++)
        experts = experts || g->layers[l].moe != NULL;
    const bool granite = g->emb_mul != 0.0f || g->res_mul != 0.0f || g->attn_scale != 0.0f ||
                         g->logit_div != 0.0f;
    if (experts || granite || g->attn_gate || g->norm_offset != 0.0f ||
        (g->n_attn > 0 && g->rope_dim != g->attn_head_dim))
        return wk_diag_set(d, WK_ENOTSUP,
                           "cuda backend: %s (gated attention, partial rotary or no rotary, "
                           "(1 + weight) norms, experts, Granite's multipliers) runs on the cpu "
                           "backend only",
                           wrk_model_info_get(m)->family);
    if (g->conv < 2 || g->conv > GDN_MAX_CONV)
        return wk_diag_set(d, WK_ENOTSUP, "cuda backend: conv_size %u outside 2..%u", g->conv,
                           GDN_MAX_CONV);
    if (g->n_attn < g->n_layer &&
        (g->n_head == 0 || g->head_k == 0 || g->head_v == 0 || g->n_v_head % g->n_head != 0))
        return wk_diag_set(d, WK_EINVAL, "cuda backend: inconsistent gdn heads");
    if (g->n_attn > 0 &&
        (g->n_attn > g->n_layer || g->attn_head_dim == 0 || g->attn_head_dim % 2 != 0 ||
         g->attn_head_dim > GDN_ATT_MAX_DIM || g->attn_kv_heads == 0 || g->attn_heads == 0 ||
         g->attn_heads % g->attn_kv_heads != 0))
        return wk_diag_set(d, WK_EINVAL,
                           "cuda backend: bad gdn attention geometry (%u heads, %u KV heads, "
                           "head dim %u: even, at most %u)",
                           g->attn_heads, g->attn_kv_heads, g->attn_head_dim, GDN_ATT_MAX_DIM);
    be_cuda_gdn *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wk_err e = WK_OK;
    c->L = g->n_layer;
    c->C = g->n_embd;
    c->H = g->n_head;
    c->K = g->head_k;
    c->HV = g->n_v_head;
    c->Vd = g->head_v;
    c->KD = c->H * c->K;
    c->VD = c->HV * c->Vd;
    c->W = g->conv;
    c->F = g->ffn_dim;
    c->V = g->vocab_size;
    c->eps = g->norm_eps;
    c->use_gate = g->use_gate;
    c->tied = g->tied;
    c->beta_scale = g->allow_neg_eigval ? 2.0f : 1.0f;
    c->q_scale = (float)(1.0 / sqrt((double)c->K));
    c->dtype = wrk_model_info_get(m)->dtype;
    c->arena = arena;
    c->n_attn = g->n_attn;
    c->Hq = g->attn_heads;
    c->Hkv = g->attn_kv_heads;
    c->Da = g->attn_head_dim;
    c->QD = c->Hq * c->Da;
    c->KVD = c->Hkv * c->Da;
    c->attn_eps = g->attn_norm_eps;
    c->rope_theta = g->rope_theta;
    c->layer_floats =
        (size_t)(c->W - 1) * (2 * (size_t)c->KD + c->VD) + (size_t)c->HV * c->K * c->Vd;
    c->slot_floats = (size_t)(c->L - c->n_attn) * c->layer_floats;
    if (c->slot_floats * sizeof(float) != slot_bytes ||
        wrk_model_info_get(m)->kv_token_bytes != (uint64_t)c->n_attn * 2 * c->KVD * sizeof(float)) {
        e = wk_diag_set(d, WK_EINVAL,
                        "cuda backend: slot of %llu bytes, the Gated DeltaNet layout needs %zu "
                        "(or KV bytes a token mismatch)",
                        (unsigned long long)slot_bytes, c->slot_floats * sizeof(float));
        goto fail;
    }
    c->layers = calloc(c->L ? c->L : 1, sizeof(*c->layers));
    if (c->layers == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto fail;
    }
    uint32_t n_delta = 0, n_att = 0;
    for (uint32_t l = 0; l < c->L; l++) {
        c->layers[l].is_attn = g->layers[l].mixer == WRK_MIXER_ATTN;
        c->layers[l].idx = c->layers[l].is_attn ? n_att++ : n_delta++;
    }
    if (n_att != c->n_attn) {
        e = wk_diag_set(d, WK_EINVAL, "cuda backend: %u attention layers flagged, config says %u",
                        n_att, c->n_attn);
        goto fail;
    }
    if ((e = be_cuda_core_init(&c->core, cfg, c->V, c->arena, n_slots, slot_bytes, d)) != WK_OK ||
        (e = gdn_upload_mats(c, g, d)) != WK_OK || (e = gdn_upload_vecs(c, g, d)) != WK_OK ||
        (e = gdn_alloc_scratch(c, d)) != WK_OK)
        goto fail;
    if (c->n_attn > 0) {
        if ((e = gdn_open_attention(c, cfg, n_slots, d)) != WK_OK)
            goto fail;
        c->core.pre_step = gdn_pre_step;
    }
    if ((e = be_cuda_open_sync(d)) != WK_OK)
        goto fail;
    *out = c;
    return WK_OK;

fail:
    gdn_destroy(c);
    return e;
}

static wk_err
gdn_step(void *impl, be_row *rows, size_t n, wk_diag *d)
{
    be_cuda_gdn *c = impl;
    return be_cuda_core_step(&c->core, rows, n, gdn_pass, c, d);
}

static void
gdn_describe(const void *impl, char *buf, size_t len)
{
    const be_cuda_gdn *c = impl;
    if (buf == NULL || len == 0)
        return;
    int n = snprintf(
        buf, len, "pass_tokens=%u weights=%s weight_bytes=%llu tied=%s gate=%s gemm=cublas-split16",
        c->core.cap, wk_dtype_name(c->dtype), (unsigned long long)c->core.weight_bytes,
        c->tied ? "yes" : "no", c->use_gate ? "yes" : "no");
    if (c->n_attn > 0 && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n,
                 " attn_layers=%u kv_token_bytes=%llu kv_pages=%u page_tokens=%u", c->n_attn,
                 (unsigned long long)be_kv_token_bytes(&c->kv), c->kv.pages_total,
                 c->kv.page_tokens);
}

/* The KV pool of a hybrid model (be_cuda_family.kv), NULL without attention layers. */
static be_kv *
gdn_kv(void *impl)
{
    be_cuda_gdn *c = impl;
    return c != NULL && c->n_attn > 0 ? &c->kv : NULL;
}

const be_cuda_family be_cuda_gdn_family = {
    .name = "gdn",
    .create = gdn_create,
    .destroy = gdn_destroy,
    .step = gdn_step,
    .describe = gdn_describe,
    .kv = gdn_kv,
};
