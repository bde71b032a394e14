/*
 * be_cpu_gdn: the CPU backend's Gated DeltaNet family (be_cpu_gdn_ops;
 * be_cpu_ops in be_cpu_family.c dispatches to it), over the shared
 * be_cpu_base (arena, step validation, passes, GEMM regions).
 *
 * At open it packs every projection and the head in their stored dtype
 * (a tied head is packed from the embedding), and converts the vectors
 * (norm weights, A_log, dt_bias, conv taps as [W][D]) to fp32. A pass runs
 * the whole network over all its tokens: one GEMM region for the q, k, v,
 * a, b, g projections of every token, the short convolutions per token
 * (the inputs before the segment come from the slot's conv state), the
 * delta-rule recurrence per (segment, value head, column block) in token
 * order, the gated per-head RMSNorm per token, then o_proj (added into the
 * residual), the gated MLP and, for the logits positions, the final norm
 * and the head.
 *
 * Slot layout: wrk_gdn.h (conv histories, then S [HV, K, Vd] per layer).
 *
 * Batch invariance: per-token stages read only that token's (and its row's
 * earlier tokens') data; every reduction has a fixed order (RMSNorm and the
 * L2 norms sum in double in a fixed order; the recurrence works column by
 * column of S, each column a fixed sequence over the key index); the GEMM
 * kernels give each element one FMA chain in k order. The column blocks
 * are a fixed width, so a row's bits never depend on the other rows, on
 * how its prefill is split or on the thread count.
 *
 * Must never: log, abort on bad input, or change a slot when a step is
 * refused (be_cpu_base_step validates before any pass).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be_cpu_common.h"
#include "wrk_gdn.h"

#define GDN_L2_EPS 1e-6 /* fla's in-kernel q / k L2 normalisation */
#define GDN_COLS 64u    /* value columns per recurrence task */

/* One token's recurrence over a full column block (gdn_delta_block). */
typedef void (*gdn_delta_fn)(float *S, size_t ld, uint32_t K, const float *q, const float *k,
                             const float *v, float decay, float beta, float *o);

typedef struct gdn_layer {
    const float *attn_norm, *mlp_norm; /* [C] */
    const float *o_norm;               /* [Vd] */
    const float *neg_A;                /* -exp(A_log) [HV] */
    const float *dt_bias;              /* [HV] */
    const float *cq, *ck, *cv;         /* conv taps [W][KD], [W][KD], [W][VD] */
    be_cpu_mat wq, wk, wv, wa, wb, wg; /* input projections (wg: use_gate only) */
    be_cpu_mat wo;                     /* VD -> C */
    be_cpu_mat gate, up, down;         /* MLP */
} gdn_layer;

struct be_ctx {
    be_cpu_base b;                             /* must be first: the pass gets &ctx->b */
    const wrk_gdn *g;                          /* the model's view, borrowed */
    uint32_t L, C, H, K, HV, Vd, KD, VD, W, F; /* dimensions (wrk_gdn.h) */
    uint32_t ncb;                              /* column blocks per value head */
    float beta_scale;                          /* 1 or 2 (allow_neg_eigval) */
    float q_scale;                             /* K^-0.5 */
    size_t layer_floats;                       /* floats per layer in a slot */
    float *vecs;                               /* every fp32 vector, one block, owned */
    const float *norm;                         /* final norm [C], into vecs */
    gdn_layer *layers;                         /* L entries, owned */
    be_cpu_mat head;                           /* C -> V */
    uint64_t packed_bytes;                     /* bytes of packed weights */
    uint32_t layer;                            /* the layer a stage runs */
    gdn_delta_fn delta;                        /* full-block recurrence for the ISA */

    /* pass scratch, cap tokens each */
    float *x;            /* residual [cap][C] */
    float *xn;           /* normed input [cap][C]; logits rows at the end */
    float *qr, *kr, *vr; /* projections before the conv [cap][KD|KD|VD] */
    float *q, *k, *v;    /* after conv + SiLU (+ L2 norm) */
    float *ar, *br;      /* a / b projections [cap][HV]; then decay / beta */
    float *gr;           /* g_proj [cap][VD] */
    float *o;            /* recurrence output [cap][VD] */
    float *hg, *hu;      /* MLP hidden [cap][F] */
};

/* ------------------------------------------------------------------------ */
/* small math                                                                */
/* ------------------------------------------------------------------------ */

static inline float
gdn_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static inline float
gdn_silu(float x)
{
    return x / (1.0f + expf(-x));
}

static inline float
gdn_softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

/* x /= sqrt(sum(x^2) + eps), then *= scale; sum in double, fixed order. */
static void
gdn_l2norm(float *x, uint32_t n, float scale)
{
    double ps[4] = {0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            ps[j] += (double)x[i + j] * x[i + j];
    double s = (ps[0] + ps[1]) + (ps[2] + ps[3]);
    for (; i < n; i++)
        s += (double)x[i] * x[i];
    const float inv = (float)(1.0 / sqrt(s + GDN_L2_EPS)) * scale;
    for (i = 0; i < n; i++)
        x[i] *= inv;
}

static inline float *
gdn_slot_layer(const be_ctx *c, uint32_t slot, uint32_t layer)
{
    return be_cpu_base_slot(&c->b, slot) + (size_t)layer * c->layer_floats;
}

/* Offsets of a layer's state tensors (floats). */
static inline size_t
gdn_off_kconv(const be_ctx *c)
{
    return (size_t)(c->W - 1) * c->KD;
}
static inline size_t
gdn_off_vconv(const be_ctx *c)
{
    return 2 * (size_t)(c->W - 1) * c->KD;
}
static inline size_t
gdn_off_S(const be_ctx *c)
{
    return (size_t)(c->W - 1) * (2 * (size_t)c->KD + c->VD);
}

/* ------------------------------------------------------------------------ */
/* token-parallel stages                                                     */
/* ------------------------------------------------------------------------ */

static void
gdn_stage_embed(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        float *x = c->x + (size_t)t * c->C;
        /* the id was validated against the vocab before the pass */
        if (wk_tensor_read_f32(c->g->emb, (size_t)c->b.tok[t] * c->C, c->C, x) != WK_OK)
            memset(x, 0, sizeof(float) * c->C);
    }
}

static void
gdn_stage_attn_norm(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const gdn_layer *ly = &c->layers[c->layer];
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++)
        be_cpu_rmsnorm(c->x + (size_t)t * c->C, ly->attn_norm, c->C, c->g->norm_eps,
                       c->xn + (size_t)t * c->C);
}

static void
gdn_stage_mlp_norm(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const gdn_layer *ly = &c->layers[c->layer];
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++)
        be_cpu_rmsnorm(c->x + (size_t)t * c->C, ly->mlp_norm, c->C, c->g->norm_eps,
                       c->xn + (size_t)t * c->C);
}

/*
 * SiLU(causal depthwise conv) of one token's D channels: taps [W][D] (tap
 * W-1 on the current input), raw [T][D] the pass's projections, hist the
 * slot's [W-1][D] history (oldest first) for the positions before the
 * segment start t0. The sum runs over the taps oldest first.
 */
static void
gdn_conv_token(const be_ctx *c, const float *taps, const float *raw, const float *hist, uint32_t D,
               uint32_t t, uint32_t t0, float *out)
{
    const uint32_t W = c->W;
    const float *src[GDN_COLS]; /* W <= 64 (checked at map) */
    for (uint32_t j = 0; j < W; j++) {
        int64_t p = (int64_t)t - (W - 1) + j;
        src[j] = p >= (int64_t)t0 ? raw + (size_t)p * D
                                  : hist + (size_t)((int64_t)(W - 1) - ((int64_t)t0 - p)) * D;
    }
    for (uint32_t d = 0; d < D; d++)
        out[d] = 0.0f;
    for (uint32_t j = 0; j < W; j++) {
        const float *s = src[j], *w = taps + (size_t)j * D;
        for (uint32_t d = 0; d < D; d++)
            out[d] += w[d] * s[d];
    }
    for (uint32_t d = 0; d < D; d++)
        out[d] = gdn_silu(out[d]);
}

/*
 * Per token: the three convolutions, the q / k L2 norms (q also scaled by
 * K^-0.5), beta = sigmoid(b) (x2 with allow_neg_eigval) into br and the
 * decay factor exp(-exp(A_log) softplus(a + dt_bias)) into ar.
 */
static void
gdn_stage_conv(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const gdn_layer *ly = &c->layers[c->layer];
    const uint32_t KD = c->KD, VD = c->VD, HV = c->HV, K = c->K;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        const be_cpu_seg *sg = &c->b.segs[c->b.tseg[t]];
        const float *st = gdn_slot_layer(c, sg->slot, c->layer);
        float *q = c->q + (size_t)t * KD, *k = c->k + (size_t)t * KD;
        gdn_conv_token(c, ly->cq, c->qr, st, KD, t, sg->t0, q);
        gdn_conv_token(c, ly->ck, c->kr, st + gdn_off_kconv(c), KD, t, sg->t0, k);
        gdn_conv_token(c, ly->cv, c->vr, st + gdn_off_vconv(c), VD, t, sg->t0,
                       c->v + (size_t)t * VD);
        for (uint32_t h = 0; h < c->H; h++) {
            gdn_l2norm(q + (size_t)h * K, K, c->q_scale);
            gdn_l2norm(k + (size_t)h * K, K, 1.0f);
        }
        float *a = c->ar + (size_t)t * HV, *bt = c->br + (size_t)t * HV;
        for (uint32_t j = 0; j < HV; j++) {
            a[j] = expf(ly->neg_A[j] * gdn_softplus(a[j] + ly->dt_bias[j]));
            bt[j] = gdn_sigmoid(bt[j]) * c->beta_scale;
        }
    }
}

/* The new conv histories: the last W-1 inputs of each segment. */
static void
gdn_save_conv(be_ctx *c)
{
    const uint32_t W = c->W;
    for (uint32_t s = 0; s < c->b.n_segs; s++) {
        const be_cpu_seg *sg = &c->b.segs[s];
        float *st = gdn_slot_layer(c, sg->slot, c->layer);
        struct {
            float *hist;
            const float *raw;
            uint32_t D;
        } parts[3] = {{st, c->qr, c->KD},
                      {st + gdn_off_kconv(c), c->kr, c->KD},
                      {st + gdn_off_vconv(c), c->vr, c->VD}};
        for (int p = 0; p < 3; p++) {
            const uint32_t D = parts[p].D;
            /* new[j] = old[j + n] while that is history, else raw[t0 + j + n - (W-1)] */
            for (uint32_t j = 0; j + 1 < W; j++) {
                size_t src = (size_t)j + sg->n;
                float *dst = parts[p].hist + (size_t)j * D;
                if (src + 1 < W)
                    memmove(dst, parts[p].hist + src * D, sizeof(float) * D);
                else
                    memcpy(dst, parts[p].raw + (size_t)(sg->t0 + src - (W - 1)) * D,
                           sizeof(float) * D);
            }
        }
    }
}

/*
 * The recurrence over one full block of GDN_COLS value columns of one head
 * for one token. S points at the block's column 0 of key row 0 (rows ld
 * floats apart). Written with GCC vector extensions; compiled for three
 * targets below. Every element sees the same operations in the same order
 * as the scalar loop in gdn_stage_delta (a rounded product, then a rounded
 * sum: ISO C mode keeps -ffp-contract=off), so every path gives the same
 * bits.
 */
typedef float gdn_v16 __attribute__((vector_size(64)));
#define GDN_NV ((int)(GDN_COLS / 16))

/* Unaligned 16-float load / store (the slot's rows need not be 64-byte aligned). */
#define GDN_LD(v, p) memcpy(&(v), (p), sizeof(gdn_v16))
#define GDN_ST(p, v) memcpy((p), &(v), sizeof(gdn_v16))

static inline __attribute__((always_inline)) void
gdn_delta_block(float *S, size_t ld, uint32_t K, const float *q, const float *k, const float *v,
                float decay, float beta, float *o)
{
    gdn_v16 kv[GDN_NV], u[GDN_NV], acc[GDN_NV];
    for (int b = 0; b < GDN_NV; b++)
        kv[b] = (gdn_v16){0};
    for (uint32_t r = 0; r < K; r++) {
        float *row = S + (size_t)r * ld;
        const float kr = k[r];
        for (int b = 0; b < GDN_NV; b++) {
            gdn_v16 x;
            GDN_LD(x, row + 16 * b);
            x = x * decay;
            GDN_ST(row + 16 * b, x);
            kv[b] = kv[b] + x * kr;
        }
    }
    for (int b = 0; b < GDN_NV; b++) {
        gdn_v16 x;
        GDN_LD(x, v + 16 * b);
        u[b] = (x - kv[b]) * beta;
        acc[b] = (gdn_v16){0};
    }
    for (uint32_t r = 0; r < K; r++) {
        float *row = S + (size_t)r * ld;
        const float kr = k[r], qr = q[r];
        for (int b = 0; b < GDN_NV; b++) {
            gdn_v16 x;
            GDN_LD(x, row + 16 * b);
            x = x + u[b] * kr;
            GDN_ST(row + 16 * b, x);
            acc[b] = acc[b] + x * qr;
        }
    }
    for (int b = 0; b < GDN_NV; b++)
        GDN_ST(o + 16 * b, acc[b]);
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f"))) static void
gdn_delta_avx512(float *S, size_t ld, uint32_t K, const float *q, const float *k, const float *v,
                 float decay, float beta, float *o)
{
    gdn_delta_block(S, ld, K, q, k, v, decay, beta, o);
}

__attribute__((target("avx2,fma"))) static void
gdn_delta_avx2(float *S, size_t ld, uint32_t K, const float *q, const float *k, const float *v,
               float decay, float beta, float *o)
{
    gdn_delta_block(S, ld, K, q, k, v, decay, beta, o);
}
#endif

static void
gdn_delta_generic(float *S, size_t ld, uint32_t K, const float *q, const float *k, const float *v,
                  float decay, float beta, float *o)
{
    gdn_delta_block(S, ld, K, q, k, v, decay, beta, o);
}

static gdn_delta_fn
gdn_delta_pick(be_cpu_isa isa)
{
#if defined(__x86_64__) || defined(__i386__)
    if (isa == BE_CPU_ISA_AVX512)
        return gdn_delta_avx512;
    if (isa == BE_CPU_ISA_AVX2)
        return gdn_delta_avx2;
#endif
    (void)isa;
    return gdn_delta_generic;
}

/*
 * The recurrence for one (segment, value head, column block), tokens in
 * order. S [K][Vd] row-major for the head; the block's columns are
 * independent of each other:
 *   S *= exp(g);  kv = S^T k;  u = beta (v - kv);  S += k u^T;  o = S^T q
 * A full block goes through c->delta; a narrower last block runs the same
 * per-element operations here.
 */
static void
gdn_stage_delta(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const uint32_t K = c->K, Vd = c->Vd, HV = c->HV;
    const uint32_t per_seg = HV * c->ncb;
    const be_cpu_seg *sg = &c->b.segs[task / per_seg];
    const uint32_t j = (task % per_seg) / c->ncb;
    const uint32_t c0 = (task % c->ncb) * GDN_COLS;
    const uint32_t nc = Vd - c0 < GDN_COLS ? Vd - c0 : GDN_COLS;
    const uint32_t kh = j / (HV / c->H);
    float *S = gdn_slot_layer(c, sg->slot, c->layer) + gdn_off_S(c) + (size_t)j * K * Vd + c0;
    float kv[GDN_COLS], u[GDN_COLS], o[GDN_COLS];

    for (uint32_t t = sg->t0; t < sg->t0 + sg->n; t++) {
        const float *q = c->q + (size_t)t * c->KD + (size_t)kh * K;
        const float *k = c->k + (size_t)t * c->KD + (size_t)kh * K;
        const float *v = c->v + (size_t)t * c->VD + (size_t)j * Vd + c0;
        const float decay = c->ar[(size_t)t * HV + j];
        const float beta = c->br[(size_t)t * HV + j];
        float *out = c->o + (size_t)t * c->VD + (size_t)j * Vd + c0;
        if (nc == GDN_COLS) {
            c->delta(S, Vd, K, q, k, v, decay, beta, out);
            continue;
        }
        for (uint32_t i = 0; i < nc; i++)
            kv[i] = 0.0f;
        for (uint32_t r = 0; r < K; r++) {
            float *row = S + (size_t)r * Vd;
            const float kr = k[r];
            for (uint32_t i = 0; i < nc; i++) {
                row[i] = row[i] * decay;
                kv[i] = kv[i] + row[i] * kr;
            }
        }
        for (uint32_t i = 0; i < nc; i++) {
            u[i] = (v[i] - kv[i]) * beta;
            o[i] = 0.0f;
        }
        for (uint32_t r = 0; r < K; r++) {
            float *row = S + (size_t)r * Vd;
            const float kr = k[r], qr = q[r];
            for (uint32_t i = 0; i < nc; i++) {
                row[i] = row[i] + u[i] * kr;
                o[i] = o[i] + row[i] * qr;
            }
        }
        memcpy(out, o, sizeof(float) * nc);
    }
}

/* Per token and value head: RMSNorm * o_norm, times SiLU(g) with use_gate. */
static void
gdn_stage_onorm(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const gdn_layer *ly = &c->layers[c->layer];
    const uint32_t Vd = c->Vd, VD = c->VD;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        float *o = c->o + (size_t)t * VD;
        for (uint32_t j = 0; j < c->HV; j++)
            be_cpu_rmsnorm(o + (size_t)j * Vd, ly->o_norm, Vd, c->g->norm_eps, o + (size_t)j * Vd);
        if (c->g->use_gate) {
            const float *g = c->gr + (size_t)t * VD;
            for (uint32_t i = 0; i < VD; i++)
                o[i] *= gdn_silu(g[i]);
        }
    }
}

static void
gdn_stage_swiglu(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        float *hg = c->hg + (size_t)t * c->F;
        const float *hu = c->hu + (size_t)t * c->F;
        for (uint32_t i = 0; i < c->F; i++)
            hg[i] = gdn_silu(hg[i]) * hu[i];
    }
}

/* Final RMSNorm of the logits positions into xn rows 0..n_logits-1. */
static void
gdn_stage_final_norm(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const uint32_t n = c->b.tok_tasks;
    const uint32_t i0 = (uint32_t)((uint64_t)c->b.n_logits * task / n);
    const uint32_t i1 = (uint32_t)((uint64_t)c->b.n_logits * (task + 1) / n);
    for (uint32_t i = i0; i < i1; i++)
        be_cpu_rmsnorm(c->x + (size_t)c->b.lpos[i] * c->C, c->norm, c->C, c->g->norm_eps,
                       c->xn + (size_t)i * c->C);
}

/* ------------------------------------------------------------------------ */
/* a pass                                                                    */
/* ------------------------------------------------------------------------ */

static void
gdn_pass(be_cpu_base *base)
{
    be_ctx *c = (be_ctx *)base;
    be_cpu_base *b = &c->b;
    const uint32_t T = b->T;

    be_cpu_tok_run(b, gdn_stage_embed, c);
    for (uint32_t l = 0; l < c->L; l++) {
        const gdn_layer *ly = &c->layers[l];
        c->layer = l;

        be_cpu_tok_run(b, gdn_stage_attn_norm, c);
        be_cpu_job_add(b, &ly->wq, c->xn, T, c->qr, NULL, BE_CPU_EPI_STORE);
        be_cpu_job_add(b, &ly->wk, c->xn, T, c->kr, NULL, BE_CPU_EPI_STORE);
        be_cpu_job_add(b, &ly->wv, c->xn, T, c->vr, NULL, BE_CPU_EPI_STORE);
        be_cpu_job_add(b, &ly->wa, c->xn, T, c->ar, NULL, BE_CPU_EPI_STORE);
        be_cpu_job_add(b, &ly->wb, c->xn, T, c->br, NULL, BE_CPU_EPI_STORE);
        if (c->g->use_gate)
            be_cpu_job_add(b, &ly->wg, c->xn, T, c->gr, NULL, BE_CPU_EPI_STORE);
        be_cpu_jobs_run(b);

        be_cpu_tok_run(b, gdn_stage_conv, c);
        gdn_save_conv(c); /* after every token read the old history */
        be_cpu_pool_run(b->pool, gdn_stage_delta, c, b->n_segs * c->HV * c->ncb);
        be_cpu_tok_run(b, gdn_stage_onorm, c);
        be_cpu_job_add(b, &ly->wo, c->o, T, c->x, NULL, BE_CPU_EPI_ADD);
        be_cpu_jobs_run(b);

        be_cpu_tok_run(b, gdn_stage_mlp_norm, c);
        be_cpu_job_add(b, &ly->gate, c->xn, T, c->hg, NULL, BE_CPU_EPI_STORE);
        be_cpu_job_add(b, &ly->up, c->xn, T, c->hu, NULL, BE_CPU_EPI_STORE);
        be_cpu_jobs_run(b);
        be_cpu_tok_run(b, gdn_stage_swiglu, c);
        be_cpu_job_add(b, &ly->down, c->hg, T, c->x, NULL, BE_CPU_EPI_ADD);
        be_cpu_jobs_run(b);
    }

    if (b->n_logits > 0) {
        uint32_t n = b->n_logits < 8 ? 1 : b->n_threads * 2;
        if (n > b->n_logits)
            n = b->n_logits;
        b->tok_tasks = n;
        be_cpu_pool_run(b->pool, gdn_stage_final_norm, c, n);
        be_cpu_job_add(b, &c->head, c->xn, b->n_logits, NULL, b->lrows, BE_CPU_EPI_STORE);
        be_cpu_jobs_run(b);
    }
}

/* ------------------------------------------------------------------------ */
/* open / close                                                              */
/* ------------------------------------------------------------------------ */

static void
gdn_close(be_ctx *c)
{
    if (c == NULL)
        return;
    be_cpu_base_close(&c->b);
    if (c->layers != NULL) {
        for (uint32_t l = 0; l < c->L; l++) {
            gdn_layer *ly = &c->layers[l];
            be_cpu_mat *mats[] = {&ly->wq, &ly->wk, &ly->wv,   &ly->wa, &ly->wb,
                                  &ly->wg, &ly->wo, &ly->gate, &ly->up, &ly->down};
            for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++)
                be_cpu_mat_free(mats[i]);
        }
    }
    be_cpu_mat_free(&c->head);
    free(c->layers);
    free(c->vecs);
    float *bufs[] = {c->x, c->xn, c->qr, c->kr, c->vr, c->q,  c->k,
                     c->v, c->ar, c->br, c->gr, c->o,  c->hg, c->hu};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
    free(c);
}

/* Reads n values of t as fp32 into *vp, advancing it; field points there. */
static wk_err
gdn_vec(const wk_tensor *t, size_t n, float **vp, const float **field)
{
    wk_err e = wk_tensor_read_f32(t, 0, n, *vp);
    if (e != WK_OK)
        return e;
    *field = *vp;
    *vp += n;
    return WK_OK;
}

/* Conv taps stored [D, 1, W] -> fp32 [W][D] at *vp. */
static wk_err
gdn_taps(const wk_tensor *t, uint32_t D, uint32_t W, float *tmp, float **vp, const float **field)
{
    wk_err e = wk_tensor_read_f32(t, 0, (size_t)D * W, tmp);
    if (e != WK_OK)
        return e;
    float *dst = *vp;
    for (uint32_t d = 0; d < D; d++)
        for (uint32_t j = 0; j < W; j++)
            dst[(size_t)j * D + d] = tmp[(size_t)d * W + j];
    *field = dst;
    *vp += (size_t)D * W;
    return WK_OK;
}

static wk_err
gdn_load_vectors(be_ctx *c, wk_diag *d)
{
    const wrk_gdn *g = c->g;
    const size_t C = c->C, HV = c->HV, KD = c->KD, VD = c->VD, W = c->W;
    const size_t per_layer = 2 * C + c->Vd + 2 * HV + W * (2 * KD + VD);
    c->vecs = be_cpu_alloc_f(C + per_layer * c->L);
    float *tmp = be_cpu_alloc_f(W * (KD > VD ? KD : VD));
    c->layers = calloc(c->L, sizeof(*c->layers));
    if (c->vecs == NULL || tmp == NULL || c->layers == NULL) {
        free(tmp);
        return wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory");
    }
    float *vp = c->vecs;
    wk_err e = gdn_vec(g->norm, C, &vp, &c->norm);
    for (uint32_t l = 0; l < c->L && e == WK_OK; l++) {
        const wrk_gdn_layer *s = &g->layers[l];
        gdn_layer *ly = &c->layers[l];
        if ((e = gdn_vec(s->attn_norm, C, &vp, &ly->attn_norm)) != WK_OK ||
            (e = gdn_vec(s->mlp_norm, C, &vp, &ly->mlp_norm)) != WK_OK ||
            (e = gdn_vec(s->o_norm, c->Vd, &vp, &ly->o_norm)) != WK_OK ||
            (e = gdn_vec(s->A_log, HV, &vp, &ly->neg_A)) != WK_OK ||
            (e = gdn_vec(s->dt_bias, HV, &vp, &ly->dt_bias)) != WK_OK ||
            (e = gdn_taps(s->q_conv, c->KD, c->W, tmp, &vp, &ly->cq)) != WK_OK ||
            (e = gdn_taps(s->k_conv, c->KD, c->W, tmp, &vp, &ly->ck)) != WK_OK ||
            (e = gdn_taps(s->v_conv, c->VD, c->W, tmp, &vp, &ly->cv)) != WK_OK)
            break;
        float *na = (float *)ly->neg_A;
        for (size_t j = 0; j < HV; j++)
            na[j] = -expf(na[j]);
    }
    free(tmp);
    if (e != WK_OK)
        return wk_diag_set(d, e, "cpu backend: cannot read a gdn vector tensor");
    return WK_OK;
}

static wk_err
gdn_pack(be_ctx *c, wk_diag *d)
{
    const wrk_gdn *g = c->g;
    const size_t max = (size_t)c->L * 10 + 1;
    be_cpu_mat **dst = calloc(max, sizeof(*dst));
    const wrk_mat **src = calloc(max, sizeof(*src));
    wrk_mat head = g->head;
    size_t n = 0;
    if (dst == NULL || src == NULL) {
        free(dst);
        free(src);
        return wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory");
    }
    for (uint32_t l = 0; l < c->L; l++) {
        const wrk_gdn_layer *s = &g->layers[l];
        gdn_layer *ly = &c->layers[l];
        const wrk_mat *sm[] = {&s->q_proj, &s->k_proj, &s->v_proj,    &s->a_proj,  &s->b_proj,
                               &s->g_proj, &s->o_proj, &s->gate_proj, &s->up_proj, &s->down_proj};
        be_cpu_mat *dm[] = {&ly->wq, &ly->wk, &ly->wv,   &ly->wa, &ly->wb,
                            &ly->wg, &ly->wo, &ly->gate, &ly->up, &ly->down};
        for (size_t i = 0; i < 10; i++) {
            if (sm[i]->t == NULL)
                continue; /* g_proj without use_gate */
            src[n] = sm[i];
            dst[n] = dm[i];
            n++;
        }
    }
    if (g->tied) /* after --fp32 the embedding field holds the converted copy */
        head = (wrk_mat){g->emb, c->C, g->vocab_size, false};
    src[n] = &head;
    dst[n] = &c->head;
    n++;
    wk_err e = be_cpu_pack_mats(&c->b, dst, src, n, d);
    for (size_t i = 0; i < n && e == WK_OK; i++)
        c->packed_bytes += dst[i]->bytes;
    free(dst);
    free(src);
    return e;
}

static wk_err
gdn_open(const be_config *cfg, const wrk_model *m, be_ctx **out, wk_diag *d)
{
    if (cfg == NULL || m == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: missing config or model");
    const wrk_gdn *g = wrk_model_view(m, "gdn");
    if (g == NULL)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: not a gdn model");
    if (g->conv > GDN_COLS)
        return wk_diag_set(d, WK_ENOTSUP, "cpu backend: conv_size %u over %u", g->conv, GDN_COLS);
    be_ctx *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    c->g = g;
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
    c->ncb = (c->Vd + GDN_COLS - 1) / GDN_COLS;
    c->beta_scale = g->allow_neg_eigval ? 2.0f : 1.0f;
    c->q_scale = (float)(1.0 / sqrt((double)c->K));
    c->layer_floats =
        (size_t)(c->W - 1) * (2 * (size_t)c->KD + c->VD) + (size_t)c->HV * c->K * c->Vd;

    const uint64_t sb = wrk_model_info_get(m)->state_bytes;
    wk_err e;
    if (sb != (uint64_t)c->L * c->layer_floats * sizeof(float)) {
        e = wk_diag_set(d, WK_EINVAL, "cpu backend: gdn state size mismatch");
        goto fail;
    }
    if ((e = be_cpu_base_open(&c->b, cfg, m, (size_t)c->L * c->layer_floats, d)) != WK_OK)
        goto fail;
    c->delta = gdn_delta_pick(c->b.isa);
    if ((e = gdn_load_vectors(c, d)) != WK_OK)
        goto fail;
    if ((e = gdn_pack(c, d)) != WK_OK)
        goto fail;

    const size_t cap = c->b.cap;
    struct {
        float **p;
        size_t n;
    } bufs[] = {
        {&c->x, c->C},   {&c->xn, c->C}, {&c->qr, c->KD}, {&c->kr, c->KD}, {&c->vr, c->VD},
        {&c->q, c->KD},  {&c->k, c->KD}, {&c->v, c->VD},  {&c->ar, c->HV}, {&c->br, c->HV},
        {&c->gr, c->VD}, {&c->o, c->VD}, {&c->hg, c->F},  {&c->hu, c->F},
    };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if ((*bufs[i].p = be_cpu_alloc_f(cap * bufs[i].n)) == NULL) {
            e = wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory for step buffers");
            goto fail;
        }
    *out = c;
    return WK_OK;

fail:
    gdn_close(c);
    return e;
}

/* ------------------------------------------------------------------------ */
/* the rest of the ops                                                       */
/* ------------------------------------------------------------------------ */

static uint32_t
gdn_n_slots(const be_ctx *c)
{
    return c->b.n_slots;
}

static uint64_t
gdn_slot_bytes(const be_ctx *c)
{
    return (uint64_t)c->b.slot_floats * sizeof(float);
}

static wk_err
gdn_slot_reset(be_ctx *c, uint32_t slot)
{
    return c == NULL ? WK_EINVAL : be_cpu_base_slot_reset(&c->b, slot);
}

static wk_err
gdn_slot_copy(be_ctx *c, uint32_t dst, uint32_t src)
{
    return c == NULL ? WK_EINVAL : be_cpu_base_slot_copy(&c->b, dst, src);
}

static wk_err
gdn_slot_read(be_ctx *c, uint32_t slot, uint64_t off, void *buf, size_t len)
{
    return c == NULL ? WK_EINVAL : be_cpu_base_slot_read(&c->b, slot, off, buf, len);
}

static wk_err
gdn_slot_write(be_ctx *c, uint32_t slot, uint64_t off, const void *buf, size_t len)
{
    return c == NULL ? WK_EINVAL : be_cpu_base_slot_write(&c->b, slot, off, buf, len);
}

static wk_err
gdn_step(be_ctx *c, be_row *rows, size_t n, wk_diag *d)
{
    if (c == NULL)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: no context");
    return be_cpu_base_step(&c->b, rows, n, gdn_pass, d);
}

static void
gdn_describe(const be_ctx *c, char *buf, size_t len)
{
    if (buf == NULL || len == 0)
        return;
    snprintf(
        buf, len, "cpu family=gdn isa=%s threads=%u pass_tokens=%u weights=%s packed_bytes=%llu",
        be_cpu_isa_name(c->b.isa), c->b.n_threads, c->b.cap,
        wk_dtype_name(wrk_model_info_get(c->b.model)->dtype), (unsigned long long)c->packed_bytes);
}

const be_ops be_cpu_gdn_ops = {
    .name = "cpu",
    .open = gdn_open,
    .close = gdn_close,
    .n_slots = gdn_n_slots,
    .slot_bytes = gdn_slot_bytes,
    .slot_reset = gdn_slot_reset,
    .slot_copy = gdn_slot_copy,
    .slot_read = gdn_slot_read,
    .slot_write = gdn_slot_write,
    .step = gdn_step,
    .describe = gdn_describe,
};
