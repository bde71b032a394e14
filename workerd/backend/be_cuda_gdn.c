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
 * Hybrid models (attention layers, kv_token_bytes > 0) are not served here:
 * be_cuda.c refuses them at open (no device KV pool yet), and create()
 * refuses them again with WK_ENOTSUP.
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
#include "k.h"
#include "wrk_gdn.h"

#define GDN_MAX_CONV 64u /* conv taps limit (the CPU's and the kernel's) */

/* Offsets of a layer's vectors in the device vector block (floats). */
enum { GV_ATTN_NORM = 0, GV_MLP_NORM, GV_O_NORM, GV_NEG_A, GV_DT_BIAS, GV_CQ, GV_CK, GV_CV, GV_N };

typedef struct gdn_layer {
    const float *attn_norm, *mlp_norm; /* [C], device */
    const float *o_norm;               /* [Vd], device */
    const float *neg_A, *dt_bias;      /* [HV], device */
    const float *cq, *ck, *cv;         /* conv taps [KD][W], [KD][W], [VD][W], device */
    be_cuda_mat wq, wk, wv, wa, wb;    /* input projections */
    be_cuda_mat wg;                    /* output gate (use_gate only) */
    be_cuda_mat wo;                    /* VD -> C */
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
    size_t slot_floats;                        /* L * layer_floats */
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
    const size_t lay_off = (size_t)l * c->layer_floats;
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

static wk_err
gdn_layer_run(be_cuda_gdn *c, uint32_t l, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    const gdn_layer *ly = &c->layers[l];
    const uint32_t T = co->T;
    WK_CUDA_CHECK(k_rmsnorm_rows(c->x, NULL, T, c->C, ly->attn_norm, c->eps, c->xn, co->stream), d);
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
    void *dev[] = {c->vecs, c->x,  c->xn, c->qr, c->kr, c->vr, c->q,  c->k,
                   c->v,    c->ar, c->br, c->gr, c->o,  c->hg, c->hu, c->xo};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        if (dev[i] != NULL)
            (void)cudaFree(dev[i]);
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

static wk_err
gdn_upload_vecs(be_cuda_gdn *c, const wrk_gdn *g, wk_diag *d)
{
    const size_t C = c->C, HV = c->HV, KD = c->KD, VD = c->VD, W = c->W;
    const size_t per_layer = 2 * C + c->Vd + 2 * HV + W * (2 * KD + VD);
    const size_t total = C + per_layer * c->L;
    float *h = calloc(total ? total : 1, sizeof(float));
    size_t *offs = calloc(1 + GV_N * (size_t)c->L, sizeof(size_t));
    if (h == NULL || offs == NULL) {
        free(h);
        free(offs);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    size_t off = 0;
    wk_err e = gdn_vec(g->norm, C, h, &off, &offs[0], d);
    for (uint32_t l = 0; l < c->L && e == WK_OK; l++) {
        const wrk_gdn_layer *s = &g->layers[l];
        size_t *o = offs + 1 + GV_N * (size_t)l;
        const struct {
            const wk_tensor *t;
            size_t n;
        } vs[GV_N] = {[GV_ATTN_NORM] = {s->attn_norm, C}, [GV_MLP_NORM] = {s->mlp_norm, C},
                      [GV_O_NORM] = {s->o_norm, c->Vd},   [GV_NEG_A] = {s->A_log, HV},
                      [GV_DT_BIAS] = {s->dt_bias, HV},    [GV_CQ] = {s->q_conv, KD * W},
                      [GV_CK] = {s->k_conv, KD * W},      [GV_CV] = {s->v_conv, VD * W}};
        for (int i = 0; i < GV_N && e == WK_OK; i++)
            e = gdn_vec(vs[i].t, vs[i].n, h, &off, &o[i], d);
        if (e == WK_OK) {
            float *na = h + o[GV_NEG_A];
            for (size_t j = 0; j < HV; j++)
                na[j] = -expf(na[j]);
        }
    }
    if (e == WK_OK)
        e = be_cuda_upload_f32(h, total, &c->vecs, "vectors", d);
    if (e == WK_OK) {
        c->norm = c->vecs + offs[0];
        for (uint32_t l = 0; l < c->L; l++) {
            const size_t *o = offs + 1 + GV_N * (size_t)l;
            gdn_layer *ly = &c->layers[l];
            ly->attn_norm = c->vecs + o[GV_ATTN_NORM];
            ly->mlp_norm = c->vecs + o[GV_MLP_NORM];
            ly->o_norm = c->vecs + o[GV_O_NORM];
            ly->neg_A = c->vecs + o[GV_NEG_A];
            ly->dt_bias = c->vecs + o[GV_DT_BIAS];
            ly->cq = c->vecs + o[GV_CQ];
            ly->ck = c->vecs + o[GV_CK];
            ly->cv = c->vecs + o[GV_CV];
        }
    }
    free(h);
    free(offs);
    return e;
}

/* The expected (k, n) of each of a layer's matrices, in gdn_upload_mats' order. */
static void
gdn_mat_shapes(const be_cuda_gdn *c, uint32_t k[10], uint32_t n[10])
{
    const uint32_t kk[10] = {c->C, c->C, c->C, c->C, c->C, c->C, c->VD, c->C, c->C, c->F};
    const uint32_t nn[10] = {c->KD, c->KD, c->VD, c->HV, c->HV, c->VD, c->C, c->F, c->F, c->C};
    memcpy(k, kk, sizeof(kk));
    memcpy(n, nn, sizeof(nn));
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
    uint32_t ek[10], en[10];
    gdn_mat_shapes(c, ek, en);
    for (uint32_t l = 0; l < c->L && e == WK_OK; l++) {
        const wrk_gdn_layer *s = &g->layers[l];
        gdn_layer *ly = &c->layers[l];
        const wrk_mat *sm[10] = {&s->q_proj, &s->k_proj, &s->v_proj,    &s->a_proj,  &s->b_proj,
                                 &s->g_proj, &s->o_proj, &s->gate_proj, &s->up_proj, &s->down_proj};
        be_cuda_mat *dm[10] = {&ly->wq, &ly->wk, &ly->wv,   &ly->wa, &ly->wb,
                               &ly->wg, &ly->wo, &ly->gate, &ly->up, &ly->down};
        for (size_t i = 0; i < 10; i++) {
            if (i == 5 && !c->use_gate)
                continue; /* no g_proj */
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
    const uint32_t ks[] = {c->VD, c->F}, ns[] = {c->KD, c->VD, c->HV, c->F};
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
    if (g->n_attn > 0 || wrk_model_info_get(m)->kv_token_bytes > 0)
        return wk_diag_set(d, WK_ENOTSUP,
                           "cuda backend: hybrid gdn models (%u attention layers) need a device "
                           "KV pool, not written yet; run this worker with --backend cpu",
                           g->n_attn);
    if (g->conv < 2 || g->conv > GDN_MAX_CONV)
        return wk_diag_set(d, WK_ENOTSUP, "cuda backend: conv_size %u outside 2..%u", g->conv,
                           GDN_MAX_CONV);
    if (g->n_head == 0 || g->head_k == 0 || g->head_v == 0 || g->n_v_head % g->n_head != 0)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: inconsistent gdn heads");
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
    c->layer_floats =
        (size_t)(c->W - 1) * (2 * (size_t)c->KD + c->VD) + (size_t)c->HV * c->K * c->Vd;
    c->slot_floats = (size_t)c->L * c->layer_floats;
    if (c->slot_floats * sizeof(float) != slot_bytes) {
        e = wk_diag_set(d, WK_EINVAL,
                        "cuda backend: slot of %llu bytes, the Gated DeltaNet layout needs %zu",
                        (unsigned long long)slot_bytes, c->slot_floats * sizeof(float));
        goto fail;
    }
    c->layers = calloc(c->L ? c->L : 1, sizeof(*c->layers));
    if (c->layers == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto fail;
    }
    if ((e = be_cuda_core_init(&c->core, cfg, c->V, n_slots, d)) != WK_OK ||
        (e = gdn_upload_mats(c, g, d)) != WK_OK || (e = gdn_upload_vecs(c, g, d)) != WK_OK ||
        (e = gdn_alloc_scratch(c, d)) != WK_OK)
        goto fail;
    /* uploads and the arena's memset ran on the legacy stream; the step's stream does not wait */
    cudaError_t ce = cudaDeviceSynchronize();
    if (ce != cudaSuccess) {
        e = wk_diag_set(d, WK_EDEVICE, "cuda backend: open: %s", cudaGetErrorString(ce));
        goto fail;
    }
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
    snprintf(buf, len,
             "pass_tokens=%u weights=%s weight_bytes=%llu tied=%s gate=%s gemm=cublas-split16",
             c->core.cap, wk_dtype_name(c->dtype), (unsigned long long)c->core.weight_bytes,
             c->tied ? "yes" : "no", c->use_gate ? "yes" : "no");
}

const be_cuda_family be_cuda_gdn_family = {
    .name = "gdn",
    .create = gdn_create,
    .destroy = gdn_destroy,
    .step = gdn_step,
    .describe = gdn_describe,
};
