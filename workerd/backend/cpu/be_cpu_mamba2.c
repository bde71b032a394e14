/*
 * be_cpu_mamba2: the CPU backend's Mamba2 family (be_cpu_mamba2_family, the
 * table it plugs into be_cpu.c's core with). Math and slot layout: wrk_mamba2.h. The
 * Mamba2 layer kind's kernels (conv, scan, gated norm: be_cpu_mamba2.h) live
 * here and are also what the hybrid pass (be_cpu_gdn.c) runs for a Mamba2
 * mixer.
 *
 * At open it packs in_proj, out_proj and the head (the embedding when tied)
 * into column panels in their stored dtype, converts the small tensors to
 * fp32 (A = -exp(A_log) once), and sets up the shared base (arena, passes,
 * pool). A pass runs the network over all its tokens at once: per layer,
 * RMSNorm per token, one in_proj GEMM for every token of every row, the
 * causal conv + SiLU per (segment, channel block) in token order reading
 * the row's earlier tokens in the pass or the slot's conv state, the scan per
 * (segment, head) in token order, the gate and grouped RMSNorm per token,
 * and out_proj added into the residual. The final RMSNorm and the head run
 * only for the positions whose logits were asked for.
 *
 * Batch invariance: every value of a token is computed by the same code
 * from that token's (and its row's earlier tokens') data with a fixed
 * reduction order: the conv sums k = 0..K-1 from the bias, the scan's
 * y = S C uses 16 partial sums combined in a fixed tree (the same bits on
 * every ISA path: nothing is fused), the RMSNorms are
 * be_cpu_rmsnorm, the GEMMs one FMA chain per element. So a row's bits do
 * not depend on the other rows, on how its prefill is split into chunks or
 * passes, or on the thread count.
 *
 * Must never: log, abort on bad input, or change any slot when a step is
 * refused (be_cpu_base_step checks every row first).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be_cpu_common.h"
#include "be_cpu_mamba2.h"
#include "wrk_mamba2.h"

#define M2_CONV_BLOCK 64u     /* channels per conv task */
#define M2_SOFTPLUS_MAX 20.0f /* softplus(x) = x above this (torch's threshold) */

typedef struct m2_layer {
    const float *norm;   /* pre-mixer RMSNorm weight [C] */
    be_cpu_m2_vecs v;    /* the mixer's vectors */
    be_cpu_mat in_proj;  /* C -> d_in_proj */
    be_cpu_mat out_proj; /* d_inner -> C */
} m2_layer;

struct be_ctx {
    be_cpu_base b;                    /* first: pass functions get &ctx->b */
    const wrk_mamba2 *v;              /* the model's view, borrowed */
    uint32_t L, C, DI, H, P, G, N, K; /* dimensions (wrk_mamba2.h) */
    uint32_t CD, DIP, V;              /* conv_dim, d_in_proj, vocab */
    double eps;                       /* RMSNorm epsilon */
    float *vecs;                      /* every small fp32 vector, one block, owned */
    const float *norm_f;              /* into vecs [C] */
    m2_layer *layers;                 /* L entries, owned */
    be_cpu_mat head;                  /* C -> V */
    uint64_t weight_bytes;            /* packed bytes */
    size_t conv_floats;               /* conv_dim * (K-1): the conv state per layer */
    size_t layer_floats;              /* conv_floats + H * P * N */

    /* pass scratch, cap tokens each */
    float *x;                    /* residual [cap][C] */
    float *xn;                   /* normalised input [cap][C] */
    float *proj;                 /* in_proj output [cap][DIP]: z | xBC | dt */
    float *xbc;                  /* conv + SiLU output [cap][CD] */
    float *y;                    /* scan output, then gated + normalised [cap][DI] */
    uint32_t layer;              /* layer being run (for task bodies) */
    uint32_t conv_blocks;        /* channel blocks per segment */
    be_cpu_m2_dims dims;         /* the layer kind's dimensions */
    be_cpu_m2_scan_fn scan_token; /* the scan kernel for b.isa */
};

/* ------------------------------------------------------------------------ */
/* small math                                                                */
/* ------------------------------------------------------------------------ */

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

static inline float *
m2_slot_layer(const be_ctx *c, uint32_t slot, uint32_t layer)
{
    return be_cpu_base_slot(&c->b, slot) + (size_t)layer * c->layer_floats;
}

/* ------------------------------------------------------------------------ */
/* stages                                                                    */
/* ------------------------------------------------------------------------ */

static void
m2_stage_embed(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        float *x = c->x + (size_t)t * c->C;
        /* the row exists: tokens were checked against the vocab */
        if (wk_tensor_read_f32(c->v->emb, (size_t)c->b.tok[t] * c->C, c->C, x) != WK_OK)
            memset(x, 0, sizeof(float) * c->C);
    }
}

static void
m2_stage_norm(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const m2_layer *ly = &c->layers[c->layer];
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++)
        be_cpu_rmsnorm(c->x + (size_t)t * c->C, ly->norm, c->C, c->eps, c->xn + (size_t)t * c->C);
}

/* Causal depthwise conv + SiLU for one (segment, channel block) (be_cpu_m2_conv). */
static void
m2_stage_conv(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const m2_layer *ly = &c->layers[c->layer];
    const be_cpu_seg *sg = &c->b.segs[task / c->conv_blocks];
    const uint32_t c0 = (task % c->conv_blocks) * M2_CONV_BLOCK;
    const uint32_t c1 = c0 + M2_CONV_BLOCK < c->CD ? c0 + M2_CONV_BLOCK : c->CD;
    be_cpu_m2_conv(&c->dims, &ly->v, c->proj, c->xbc, sg->t0, sg->n,
                   m2_slot_layer(c, sg->slot, c->layer), c0, c1);
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

/* The scan for one (segment, head), tokens in order. */
static void
m2_stage_scan(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const be_cpu_seg *sg = &c->b.segs[task / c->H];
    be_cpu_m2_scan(&c->dims, &c->layers[c->layer].v, c->scan_token, c->proj, c->xbc, c->y, sg->t0,
                   sg->n, m2_slot_layer(c, sg->slot, c->layer) + c->conv_floats, task % c->H);
}

/* y = rmsnorm_per_group(y * silu(z)) * gnorm */
static void
m2_stage_gate(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++)
        be_cpu_m2_gate(&c->dims, &c->layers[c->layer].v, c->proj, c->y, t);
}

/* Final RMSNorm of the logits positions into xn rows 0..n_logits-1. */
static void
m2_stage_norm_f(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    uint32_t i0, i1;
    be_cpu_logits_range(&c->b, task, &i0, &i1);
    for (uint32_t i = i0; i < i1; i++)
        be_cpu_rmsnorm(c->x + (size_t)c->b.lpos[i] * c->C, c->norm_f, c->C, c->eps,
                       c->xn + (size_t)i * c->C);
}

/* ------------------------------------------------------------------------ */
/* a pass                                                                    */
/* ------------------------------------------------------------------------ */

static void
m2_pass(be_cpu_base *b)
{
    be_ctx *c = (be_ctx *)b; /* b is the context's first member */
    const uint32_t T = b->T;

    be_cpu_tok_run(b, m2_stage_embed, c);
    for (uint32_t l = 0; l < c->L; l++) {
        m2_layer *ly = &c->layers[l];
        c->layer = l;
        be_cpu_tok_run(b, m2_stage_norm, c);
        be_cpu_job_add(b, &ly->in_proj, c->xn, T, c->proj, NULL, BE_CPU_EPI_STORE);
        be_cpu_jobs_run(b);
        be_cpu_pool_run(b->pool, m2_stage_conv, c, b->n_segs * c->conv_blocks);
        be_cpu_pool_run(b->pool, m2_stage_scan, c, b->n_segs * c->H);
        be_cpu_tok_run(b, m2_stage_gate, c);
        be_cpu_job_add(b, &ly->out_proj, c->y, T, c->x, NULL, BE_CPU_EPI_ADD);
        be_cpu_jobs_run(b);
    }
    be_cpu_logits_run(b, m2_stage_norm_f, c, &c->head, c->xn);
}

/* ------------------------------------------------------------------------ */
/* open / close                                                              */
/* ------------------------------------------------------------------------ */

static void
m2_close(be_cpu_base *b)
{
    be_ctx *c = (be_ctx *)b; /* b is the context's first member */
    if (c == NULL)
        return;
    be_cpu_base_close(&c->b);
    if (c->layers != NULL)
        for (uint32_t l = 0; l < c->L; l++) {
            be_cpu_mat_free(&c->layers[l].in_proj);
            be_cpu_mat_free(&c->layers[l].out_proj);
        }
    be_cpu_mat_free(&c->head);
    free(c->layers);
    free(c->vecs);
    free(c->x);
    free(c->xn);
    free(c->proj);
    free(c->xbc);
    free(c->y);
    free(c);
}

/* n fp32 values of t (NULL t: zeros) at *vp; advances *vp. */
static wk_err
m2_vec(const wk_tensor *t, size_t n, float **vp, const float **field)
{
    if (t == NULL)
        memset(*vp, 0, sizeof(float) * n);
    else if (wk_tensor_read_f32(t, 0, n, *vp) != WK_OK)
        return WK_EINVAL;
    *field = *vp;
    *vp += n;
    return WK_OK;
}

static wk_err
m2_open_vecs(be_ctx *c, wk_diag *d)
{
    const wrk_mamba2 *v = c->v;
    const size_t per_layer = (size_t)c->C + (size_t)c->CD * c->K + c->CD + 3u * c->H + c->DI;
    c->vecs = be_cpu_alloc_f(c->C + per_layer * c->L);
    c->layers = calloc(c->L, sizeof(*c->layers));
    if (c->vecs == NULL || c->layers == NULL)
        return wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory");
    float *vp = c->vecs;
    if (m2_vec(v->norm_f, c->C, &vp, &c->norm_f) != WK_OK)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: cannot read %s", v->norm_f->name);
    for (uint32_t l = 0; l < c->L; l++) {
        const wrk_mamba2_layer *s = &v->layers[l];
        m2_layer *ly = &c->layers[l];
        struct {
            const wk_tensor *t;
            size_t n;
            const float **field;
        } vs[] = {
            {s->norm, c->C, &ly->norm},        {s->conv_w, (size_t)c->CD * c->K, &ly->v.conv_w},
            {s->conv_b, c->CD, &ly->v.conv_b}, {s->dt_bias, c->H, &ly->v.dt_bias},
            {s->A_log, c->H, &ly->v.A},        {s->D, c->H, &ly->v.D},
            {s->gnorm, c->DI, &ly->v.gnorm},
        };
        for (size_t i = 0; i < sizeof(vs) / sizeof(vs[0]); i++)
            if (m2_vec(vs[i].t, vs[i].n, &vp, vs[i].field) != WK_OK)
                return wk_diag_set(d, WK_EINVAL, "cpu backend: cannot read %s", vs[i].t->name);
        float *A = (float *)ly->v.A;
        for (uint32_t h = 0; h < c->H; h++)
            A[h] = -expf(A[h]);
    }
    return WK_OK;
}

static wk_err
m2_open_mats(be_ctx *c, wk_diag *d)
{
    const wrk_mamba2 *v = c->v;
    const size_t n = 2 * (size_t)c->L + 1;
    be_cpu_mat **dst = calloc(n, sizeof(*dst));
    const wrk_mat **src = calloc(n, sizeof(*src));
    const wrk_mat tied = {v->emb, c->C, c->V, false}; /* the embedding, stored [V, C] */
    if (dst == NULL || src == NULL) {
        free(dst);
        free(src);
        return wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory");
    }
    for (uint32_t l = 0; l < c->L; l++) {
        dst[2 * l] = &c->layers[l].in_proj;
        src[2 * l] = &v->layers[l].in_proj;
        dst[2 * l + 1] = &c->layers[l].out_proj;
        src[2 * l + 1] = &v->layers[l].out_proj;
    }
    dst[n - 1] = &c->head;
    src[n - 1] = v->lm_head.t != NULL   ? &v->lm_head
                 : v->head_q8.t != NULL ? &v->head_q8 /* tied, quantized at load */
                                        : &tied;
    wk_err e = be_cpu_pack_mats(&c->b, dst, src, n, d);
    for (size_t i = 0; e == WK_OK && i < n; i++)
        c->weight_bytes += dst[i]->bytes;
    free(dst);
    free(src);
    return e;
}

static wk_err
m2_open(const be_config *cfg, const wrk_model *m, be_cpu_base **out, wk_diag *d)
{
    if (cfg == NULL || m == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: missing config or model");
    const wrk_mamba2 *v = wrk_model_view(m, "mamba2");
    if (v == NULL)
        return wk_diag_set(d, WK_ENOTSUP, "cpu backend: model family %s is not mamba2",
                           wrk_model_info_get(m)->family);
    be_ctx *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    c->v = v;
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
    c->conv_floats = (size_t)c->CD * (c->K - 1);
    c->layer_floats = c->conv_floats + (size_t)c->H * c->P * c->N;
    c->conv_blocks = (c->CD + M2_CONV_BLOCK - 1) / M2_CONV_BLOCK;
    c->dims = (be_cpu_m2_dims){c->DI, c->H, c->P, c->G, c->N, c->K, c->CD, c->DIP, c->eps};

    wk_err e;
    if (c->K > 64) {
        e = wk_diag_set(d, WK_EINVAL, "cpu backend: conv kernel %u over 64", c->K);
        goto fail;
    }
    if ((uint64_t)c->layer_floats * c->L * sizeof(float) != wrk_model_info_get(m)->state_bytes) {
        e = wk_diag_set(d, WK_EINVAL, "cpu backend: slot layout does not match state_bytes");
        goto fail;
    }
    if ((e = be_cpu_base_open(&c->b, cfg, m, c->layer_floats * c->L, d)) != WK_OK)
        goto fail;
    c->scan_token = be_cpu_m2_scan_pick(c->b.isa);
    if ((e = m2_open_vecs(c, d)) != WK_OK || (e = m2_open_mats(c, d)) != WK_OK)
        goto fail;
    const size_t cap = c->b.cap;
    c->x = be_cpu_alloc_f(cap * c->C);
    c->xn = be_cpu_alloc_f(cap * c->C);
    c->proj = be_cpu_alloc_f(cap * c->DIP);
    c->xbc = be_cpu_alloc_f(cap * c->CD);
    c->y = be_cpu_alloc_f(cap * c->DI);
    if (c->x == NULL || c->xn == NULL || c->proj == NULL || c->xbc == NULL || c->y == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory for step buffers");
        goto fail;
    }
    *out = &c->b;
    return WK_OK;

fail:
    m2_close(&c->b);
    return e;
}

/* ------------------------------------------------------------------------ */
/* the family                                                                */
/* ------------------------------------------------------------------------ */

static void
m2_describe(const be_cpu_base *b, char *buf, size_t len)
{
    const be_ctx *c = (const be_ctx *)b;
    snprintf(
        buf, len, "cpu isa=%s threads=%u pass_tokens=%u family=mamba2 weights=%s packed_bytes=%llu",
        be_cpu_isa_name(c->b.isa), c->b.n_threads, c->b.cap,
        wk_dtype_name(wrk_model_info_get(c->b.model)->dtype), (unsigned long long)c->weight_bytes);
}

const be_cpu_family be_cpu_mamba2_family = {
    .view = "mamba2",
    .open = m2_open,
    .close = m2_close,
    .pass = m2_pass,
    .describe = m2_describe,
};
