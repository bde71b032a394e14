/*
 * be_cuda_mamba2: the Mamba2 step on a CUDA device, host side (the family
 * be_cuda.c reaches through be_cuda_mamba2_family). The math, the stage
 * order and the slot layout are the CPU reference's (be_cpu_mamba2.c,
 * wrk_mamba2.h); the kernels are kernels/k_mamba2.cu and k_common.cu
 * behind kernels/k.h.
 *
 * At creation in_proj, out_proj, the head and the embedding (the same
 * device bytes when the head is tied: the embedding [V][C] is an nn.Linear
 * C -> V) are copied to the device as stored, and the small vectors are
 * widened to fp32 (A = -exp(A_log) once, a missing conv bias as zeros).
 * A pass (be_cuda_core: at most `cap` tokens, rows cut as the CPU cuts
 * them) runs per layer: RMSNorm per token, one in_proj GEMM for every
 * token, the causal conv + SiLU per (segment, channel) in token order over
 * the slot's conv state, the scan per (segment, head) in token order over
 * the slot's [H][P][N] state, the gate and grouped RMSNorm, out_proj added
 * into the residual; then norm_f and the head for the logits rows only.
 *
 * Numerics and batch invariance are the RWKV-7 step's (be_cuda_rwkv7.c):
 * the GEMMs run on cuBLAS with fp32 compute (16-bit weights against the
 * hi + lo halves of the activations), every other reduction in a fixed
 * order per row; a row's bits are repeatable for one pass composition and
 * agree with the CPU (and across chunkings) to GEMM rounding.
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
#include "wrk_mamba2.h"

#define M2_MAX_CONV 64u /* conv kernel limit (the CPU's and the kernel's) */

typedef struct m2_layer {
    const float *norm;    /* pre-mixer RMSNorm weight [C], device */
    const float *conv_w;  /* [CD][K], device */
    const float *conv_b;  /* [CD] (zeros without a conv bias), device */
    const float *dt_bias; /* [H], device */
    const float *A;       /* -exp(A_log) [H], device */
    const float *D;       /* [H], device */
    const float *gnorm;   /* gated RMSNorm weight [DI], device */
    be_cuda_mat in_proj;  /* C -> DIP */
    be_cuda_mat out_proj; /* DI -> C */
} m2_layer;

typedef struct be_cuda_mamba2 {
    be_cuda_core core;                /* stream, cuBLAS, weights, GEMM scratch, passes */
    uint32_t L, C, DI, H, P, G, N, K; /* dimensions (wrk_mamba2.h) */
    uint32_t CD, DIP, V;              /* conv_dim, d_in_proj, vocab */
    double eps;                       /* RMSNorm epsilon */
    wk_dtype dtype;                   /* the weights' dtype (describe) */
    bool tied;                        /* the head is the embedding */
    size_t conv_floats;               /* CD * (K-1): a layer's conv state */
    size_t layer_floats;              /* conv_floats + H P N */
    size_t slot_floats;               /* L * layer_floats */
    float *arena;                     /* device, borrowed from be_cuda */

    float *vecs;        /* device block of every fp32 vector, owned */
    const float *normf; /* into vecs [C] */
    m2_layer *layers;   /* host array of L, owned */
    be_cuda_mat emb;    /* [V][C] as stored */
    be_cuda_mat head;   /* C -> V (tied: the embedding's bytes) */

    /* device scratch (fp32), cap tokens unless noted */
    float *x;    /* residual [cap][C] */
    float *xn;   /* normalised input [cap][C] */
    float *proj; /* in_proj output [cap][DIP]: z | xBC | dt */
    float *xbc;  /* conv + SiLU output [cap][CD] */
    float *y;    /* scan output, then gated + normalised [cap][DI] */
    float *xo;   /* norm_f rows [lcap][C] */
} be_cuda_mamba2;

/* ------------------------------------------------------------------------ */
/* a pass                                                                    */
/* ------------------------------------------------------------------------ */

static wk_err
m2_layer_run(be_cuda_mamba2 *c, uint32_t l, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    const m2_layer *ly = &c->layers[l];
    const uint32_t T = co->T;
    const size_t lay_off = (size_t)l * c->layer_floats;
    const uint32_t *seg_t0 = be_cuda_meta(co, BE_CUDA_M_SEG_T0);
    const uint32_t *seg_n = be_cuda_meta(co, BE_CUDA_M_SEG_N);
    const uint32_t *seg_slot = be_cuda_meta(co, BE_CUDA_M_SEG_SLOT);

    WK_CUDA_CHECK(k_rmsnorm_rows(c->x, NULL, T, c->C, ly->norm, c->eps, c->xn, co->stream), d);
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->in_proj, c->xn, T, c->proj, c->DIP, K_EPI_STORE, d));
    WK_CUDA_CHECK(k_mamba2_conv(c->proj + c->DI, c->DIP, c->CD, c->K, ly->conv_w, ly->conv_b,
                                co->n_segs, seg_t0, seg_n, seg_slot, c->arena, c->slot_floats,
                                lay_off, c->xbc, co->stream),
                  d);
    WK_CUDA_CHECK(k_mamba2_scan(c->arena, c->slot_floats, lay_off + c->conv_floats, co->n_segs,
                                seg_t0, seg_n, seg_slot, c->H, c->P, c->N, c->G, c->xbc, c->CD,
                                c->proj + c->DI + c->CD, c->DIP, ly->dt_bias, ly->A, ly->D, c->y,
                                co->stream),
                  d);
    WK_CUDA_CHECK(
        k_mamba2_gate_norm(c->y, c->proj, c->DIP, T, c->DI, c->G, ly->gnorm, c->eps, co->stream),
        d);
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->out_proj, c->y, T, c->x, c->C, K_EPI_ADD, d));
    return WK_OK;
}

/* norm_f of the logits rows lpos[0..n-1] into out (be_cuda_norm_fn). */
static wk_err
m2_norm_f(void *arg, const uint32_t *lpos, uint32_t n, float *out, wk_diag *d)
{
    be_cuda_mamba2 *c = arg;
    WK_CUDA_CHECK(k_rmsnorm_rows(c->x, lpos, n, c->C, c->normf, c->eps, out, c->core.stream), d);
    return WK_OK;
}

static wk_err
m2_pass(void *arg, wk_diag *d)
{
    be_cuda_mamba2 *c = arg;
    be_cuda_core *co = &c->core;
    WK_CUDA_CHECK(k_embed_rows(c->emb.w, c->emb.dtype, be_cuda_meta(co, BE_CUDA_M_TOK), co->T, c->C,
                               c->x, co->stream),
                  d);
    for (uint32_t l = 0; l < c->L; l++)
        BE_CUDA_TRY(m2_layer_run(c, l, d));
    if (co->n_logits > 0)
        BE_CUDA_TRY(be_cuda_core_logits(co, &c->head, c->xo, m2_norm_f, c, d));
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* create / destroy                                                          */
/* ------------------------------------------------------------------------ */

static void
m2_destroy(void *impl)
{
    be_cuda_mamba2 *c = impl;
    if (c == NULL)
        return;
    be_cuda_core_fini(&c->core); /* waits for the stream first */
    void *dev[] = {c->vecs, c->x, c->xn, c->proj, c->xbc, c->y, c->xo};
    be_cuda_free_all(dev, sizeof(dev) / sizeof(dev[0]));
    free(c->layers);
    free(c);
}

/* n fp32 values of t (NULL t: zeros) at *vp (host); advances *vp. */
static wk_err
m2_vec(const wk_tensor *t, size_t n, float **vp, size_t *off, size_t *field, wk_diag *d)
{
    if (t == NULL)
        memset(*vp, 0, sizeof(float) * n);
    else if (wk_tensor_read_f32(t, 0, n, *vp) != WK_OK)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: cannot read %s as %zu values", t->name, n);
    *field = *off;
    *vp += n;
    *off += n;
    return WK_OK;
}

static wk_err
m2_upload_vecs(be_cuda_mamba2 *c, const wrk_mamba2 *v, wk_diag *d)
{
    const size_t per_layer = (size_t)c->C + (size_t)c->CD * c->K + c->CD + 3u * c->H + c->DI;
    const size_t total = c->C + per_layer * c->L;
    float *h = calloc(total ? total : 1, sizeof(float));
    size_t *offs = calloc(1 + 7 * (size_t)c->L, sizeof(size_t)); /* each vector's offset */
    if (h == NULL || offs == NULL) {
        free(h);
        free(offs);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    float *vp = h;
    size_t off = 0;
    wk_err e = m2_vec(v->norm_f, c->C, &vp, &off, &offs[0], d);
    for (uint32_t l = 0; l < c->L && e == WK_OK; l++) {
        const wrk_mamba2_layer *s = &v->layers[l];
        size_t *o = offs + 1 + 7 * (size_t)l;
        const struct {
            const wk_tensor *t;
            size_t n;
        } vs[7] = {{s->norm, c->C},    {s->conv_w, (size_t)c->CD * c->K},
                   {s->conv_b, c->CD}, {s->dt_bias, c->H},
                   {s->A_log, c->H},   {s->D, c->H},
                   {s->gnorm, c->DI}};
        for (size_t i = 0; i < 7 && e == WK_OK; i++)
            e = m2_vec(vs[i].t, vs[i].n, &vp, &off, &o[i], d);
        if (e == WK_OK) {
            float *A = h + o[4];
            for (uint32_t j = 0; j < c->H; j++)
                A[j] = -expf(A[j]);
        }
    }
    if (e == WK_OK)
        e = be_cuda_upload_f32(h, total, &c->vecs, "vectors", d);
    if (e == WK_OK) {
        c->normf = c->vecs + offs[0];
        for (uint32_t l = 0; l < c->L; l++) {
            const size_t *o = offs + 1 + 7 * (size_t)l;
            m2_layer *ly = &c->layers[l];
            ly->norm = c->vecs + o[0];
            ly->conv_w = c->vecs + o[1];
            ly->conv_b = c->vecs + o[2];
            ly->dt_bias = c->vecs + o[3];
            ly->A = c->vecs + o[4];
            ly->D = c->vecs + o[5];
            ly->gnorm = c->vecs + o[6];
        }
    }
    free(h);
    free(offs);
    return e;
}

static wk_err
m2_upload_mats(be_cuda_mamba2 *c, const wrk_mamba2 *v, wk_diag *d)
{
    const size_t n = 2 * (size_t)c->L + 2;
    const wrk_mat **src = calloc(n, sizeof(*src));
    be_cuda_mat **dst = calloc(n, sizeof(*dst));
    if (src == NULL || dst == NULL) {
        free(src);
        free(dst);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    const wrk_mat emb = {v->emb, c->C, c->V, false}; /* [V][C]: an nn.Linear C -> V */
    size_t nu = 0;
    src[nu] = &emb;
    dst[nu++] = &c->emb;
    for (uint32_t l = 0; l < c->L; l++) {
        src[nu] = &v->layers[l].in_proj;
        dst[nu++] = &c->layers[l].in_proj;
        src[nu] = &v->layers[l].out_proj;
        dst[nu++] = &c->layers[l].out_proj;
    }
    if (!c->tied) {
        src[nu] = &v->lm_head;
        dst[nu++] = &c->head;
    }
    wk_err e = WK_OK;
    for (size_t i = 0; i < nu && e == WK_OK; i++)
        if (src[i]->t == NULL)
            e = wk_diag_set(d, WK_EINVAL, "cuda backend: mamba2 weight matrix #%zu is missing", i);
    if (e == WK_OK)
        e = be_cuda_core_upload(&c->core, src, dst, nu, d);
    if (e == WK_OK && c->tied)
        c->head = c->emb;
    if (e == WK_OK) {
        for (uint32_t l = 0; l < c->L && e == WK_OK; l++)
            if (c->layers[l].in_proj.k != c->C || c->layers[l].in_proj.n != c->DIP ||
                c->layers[l].out_proj.k != c->DI || c->layers[l].out_proj.n != c->C)
                e = wk_diag_set(d, WK_EINVAL, "cuda backend: mamba2 layer %u: projection shapes",
                                l);
        if (e == WK_OK && (c->head.k != c->C || c->head.n != c->V))
            e = wk_diag_set(d, WK_EINVAL, "cuda backend: mamba2 head is not %u -> %u", c->C, c->V);
    }
    free(src);
    free(dst);
    return e;
}

static wk_err
m2_alloc_scratch(be_cuda_mamba2 *c, wk_diag *d)
{
    const size_t cap = c->core.cap, lcap = c->core.lcap;
    const uint32_t max_k = c->C > c->DI ? c->C : c->DI;
    const uint32_t max_n = c->DIP > c->C ? c->DIP : c->C;
    BE_CUDA_TRY(be_cuda_core_scratch(&c->core, max_k, max_n, c->C, d));
    struct {
        float **p;
        size_t n;
        const char *what;
    } a[] = {
        {&c->x, cap * c->C, "x"},         {&c->xn, cap * c->C, "xn"},
        {&c->proj, cap * c->DIP, "proj"}, {&c->xbc, cap * c->CD, "xbc"},
        {&c->y, cap * c->DI, "y"},        {&c->xo, lcap * c->C, "norm_f rows"},
    };
    for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++)
        BE_CUDA_TRY(be_cuda_dalloc((void **)a[i].p, a[i].n * sizeof(float), a[i].what, d));
    return WK_OK;
}

static wk_err
m2_create(const be_config *cfg, const wrk_model *m, float *arena, uint32_t n_slots,
          uint64_t slot_bytes, void **out, wk_diag *d)
{
    if (cfg == NULL || m == NULL || arena == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: missing config, model or arena");
    const wrk_mamba2 *v = wrk_model_view(m, "mamba2");
    if (v == NULL)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: not a mamba2 model");
    if (v->d_conv < 2 || v->d_conv > M2_MAX_CONV)
        return wk_diag_set(d, WK_ENOTSUP, "cuda backend: conv kernel %u outside 2..%u", v->d_conv,
                           M2_MAX_CONV);
    if (v->n_groups == 0 || v->n_head % v->n_groups != 0 || v->d_inner % v->n_groups != 0 ||
        v->n_head * v->head_dim != v->d_inner ||
        v->conv_dim != v->d_inner + 2 * v->n_groups * v->d_state ||
        v->d_in_proj != v->d_inner + v->conv_dim + v->n_head)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: inconsistent mamba2 dimensions");
    be_cuda_mamba2 *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wk_err e = WK_OK;
    c->L = v->n_layer;
    c->C = v->d_model;
    c->DI = v->d_inner;
    c->H = v->n_head;
    c->P = v->head_dim;
    c->G = v->n_groups;
    c->N = v->d_state;
    c->K = v->d_conv;
    c->CD = v->conv_dim;
    c->DIP = v->d_in_proj;
    c->V = v->vocab_size;
    c->eps = v->eps;
    c->tied = v->lm_head.t == NULL;
    c->dtype = wrk_model_info_get(m)->dtype;
    c->arena = arena;
    c->conv_floats = (size_t)c->CD * (c->K - 1);
    c->layer_floats = c->conv_floats + (size_t)c->H * c->P * c->N;
    c->slot_floats = (size_t)c->L * c->layer_floats;
    if (c->slot_floats * sizeof(float) != slot_bytes) {
        e = wk_diag_set(d, WK_EINVAL,
                        "cuda backend: slot of %llu bytes, the Mamba2 layout needs %zu",
                        (unsigned long long)slot_bytes, c->slot_floats * sizeof(float));
        goto fail;
    }
    c->layers = calloc(c->L ? c->L : 1, sizeof(*c->layers));
    if (c->layers == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto fail;
    }
    if ((e = be_cuda_core_init(&c->core, cfg, c->V, c->arena, n_slots, slot_bytes, d)) != WK_OK ||
        (e = m2_upload_mats(c, v, d)) != WK_OK || (e = m2_upload_vecs(c, v, d)) != WK_OK ||
        (e = m2_alloc_scratch(c, d)) != WK_OK)
        goto fail;
    if ((e = be_cuda_open_sync(d)) != WK_OK)
        goto fail;
    *out = c;
    return WK_OK;

fail:
    m2_destroy(c);
    return e;
}

static wk_err
m2_step(void *impl, be_row *rows, size_t n, wk_diag *d)
{
    be_cuda_mamba2 *c = impl;
    return be_cuda_core_step(&c->core, rows, n, m2_pass, c, d);
}

static void
m2_describe(const void *impl, char *buf, size_t len)
{
    const be_cuda_mamba2 *c = impl;
    if (buf == NULL || len == 0)
        return;
    snprintf(buf, len, "pass_tokens=%u weights=%s weight_bytes=%llu tied=%s gemm=cublas-split16",
             c->core.cap, wk_dtype_name(c->dtype), (unsigned long long)c->core.weight_bytes,
             c->tied ? "yes" : "no");
}

const be_cuda_family be_cuda_mamba2_family = {
    .name = "mamba2",
    .create = m2_create,
    .destroy = m2_destroy,
    .step = m2_step,
    .describe = m2_describe,
};
