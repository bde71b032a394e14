/*
 * be_cpu_rwkv7: the CPU backend's RWKV-7 family (be_cpu_rwkv7_family, the
 * table it plugs into be_cpu.c's core with), and the numeric reference the other
 * backends are checked against.
 *
 * The context starts with a be_cpu_base (be_cpu_common.h), which owns the
 * threads, the slot arena (layout in be.h), the step's validation, the
 * split of a step into passes of at most b.cap tokens and the parallel GEMM
 * regions; this file supplies the pass (cpu_pass_run). At open it packs
 * every weight matrix into column panels in its stored dtype
 * (be_cpu_kernels.h), one block for all of them, and converts the small
 * vectors to fp32. Each pass runs the whole network over all its tokens at
 * once: one batched GEMM per projection for all tokens of all rows, the
 * LayerNorm/mix math per token, and per (row, head) one task that runs the
 * head's columns of the LoRA up-projections, the decay/ICLR/gate math and
 * the WKV recurrence in token order. A row longer than what is left of a
 * pass continues in the next pass from its slot state, which is exactly
 * where a token-by-token run would be.
 *
 * Batch invariance: every per-token computation reads only that token's
 * (and its row's earlier tokens') data, reductions have a fixed order, and
 * the GEMM kernels compute each element as one FMA chain in k order. So a
 * row's bits do not depend on the other rows, on how its prefill is split,
 * or on the number of threads.
 *
 * Tuning knobs from the environment, read at open (tests use them):
 * WKVM_CPU_ISA=scalar|avx2|avx512 caps the kernel path, and
 * WKVM_CPU_PASS_TOKENS=1..4096 sets the tokens per pass (default 256).
 *
 * Must never: log, abort on bad input, or change any slot when a step is
 * refused.
 */
#include "be_cpu_common.h"
#include "wrk_rwkv7.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BE_CPU_DECAY_SCALE 0.6065306597126334f /* exp(-0.5) */

/* Indices of the token-shift mixes. */
enum { MIX_R = 0, MIX_W, MIX_K, MIX_V, MIX_A, MIX_G, MIX_N };

typedef struct cpu_layer {
    const float *ln1_w, *ln1_b; /* attention LayerNorm */
    const float *ln2_w, *ln2_b; /* channel-mix LayerNorm */
    const float *mix[MIX_N];    /* x_r, x_w, x_k, x_v, x_a, x_g */
    const float *w0, *a0, *v0;  /* LoRA biases (v0 NULL on layer 0) */
    const float *k_k, *k_a;     /* key normalisation / ICLR mix */
    const float *r_k;           /* bonus [H * N] */
    const float *lnx_w, *lnx_b; /* GroupNorm */
    const float *ffn_x_k;       /* channel-mix shift mix */
    be_cpu_mat wr, wk, wv, wo;  /* C -> C projections */
    be_cpu_mat w1, w2, a1, a2;  /* decay and ICLR LoRAs */
    be_cpu_mat v1, v2, g1, g2;  /* value-residual (not on layer 0) and gate LoRAs */
    be_cpu_mat fk, fv;          /* channel mix C -> F -> C */
} cpu_layer;

struct be_ctx {
    be_cpu_base b;          /* first: cpu_pass_run gets &ctx->b */
    const wrk_rwkv7 *rw;    /* the model's RWKV-7 view */
    uint32_t L, C, H, N, F;         /* dimensions (vocab: b.V) */
    uint32_t Dw, Da, Dv, Dg;        /* LoRA ranks */
    uint32_t head_panels;   /* panels per head when N % BE_CPU_NR == 0, else 0 */
    float *vecs;            /* every small fp32 vector, one block, owned */
    const float *ln0_w, *ln0_b;     /* into vecs */
    const float *lnout_w, *lnout_b; /* into vecs */
    cpu_layer *layers;      /* L entries, owned */
    be_cpu_mat head;        /* C -> V */
    void *weights;          /* one block holding every packed matrix, owned */
    uint64_t weight_bytes;  /* packed bytes */
    size_t layer_floats;    /* 2C + H N N (a slot holds L of them) */

    /* pass scratch, b.cap tokens each */
    float *x;               /* residual [cap][C] */
    float *xln;             /* LayerNorm output [cap][C] */
    float *mx[MIX_N];       /* mixes, then reused [cap][C] */
    float *r, *k, *v, *vf;  /* [cap][C] */
    float *lw, *la, *lv, *lg; /* LoRA hidden [cap][D*] */
    float *hf;              /* channel-mix hidden [cap][F] */
    uint32_t layer;         /* layer being run (for task bodies) */
};

/* ------------------------------------------------------------------------ */
/* small math                                                                */
/* ------------------------------------------------------------------------ */

static inline float
cpu_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/*
 * LayerNorm over n values. Statistics in double with 8 partial sums in a
 * fixed order (the result depends only on x, never on the batch). y may be x.
 */
static void
cpu_layernorm(const float *x, const float *w, const float *b, uint32_t n, double eps, float *y)
{
    double ps[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            ps[j] += x[i + j];
    double s = ((ps[0] + ps[1]) + (ps[2] + ps[3])) + ((ps[4] + ps[5]) + (ps[6] + ps[7]));
    for (; i < n; i++)
        s += x[i];
    const double mean = s / n;
    for (int j = 0; j < 8; j++)
        ps[j] = 0.0;
    for (i = 0; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            double dd = x[i + j] - mean;
            ps[j] += dd * dd;
        }
    double v = ((ps[0] + ps[1]) + (ps[2] + ps[3])) + ((ps[4] + ps[5]) + (ps[6] + ps[7]));
    for (; i < n; i++) {
        double dd = x[i] - mean;
        v += dd * dd;
    }
    const float inv = (float)(1.0 / sqrt(v / n + eps));
    const float mf = (float)mean;
    for (i = 0; i < n; i++)
        y[i] = (x[i] - mf) * inv * w[i] + b[i];
}

static inline float *
cpu_slot_layer(const be_ctx *c, uint32_t slot, uint32_t layer)
{
    return be_cpu_base_slot(&c->b, slot) + (size_t)layer * c->layer_floats;
}

/* ------------------------------------------------------------------------ */
/* token-parallel stages                                                     */
/* ------------------------------------------------------------------------ */

/* x = ln0(emb[tok]) */
static void
cpu_stage_embed(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        float *x = c->x + (size_t)t * c->C;
        /* the row exists: validated against the vocab before the pass */
        if (wk_tensor_read_f32(c->rw->emb, (size_t)c->b.tok[t] * c->C, c->C, x) != WK_OK)
            memset(x, 0, sizeof(float) * c->C);
        cpu_layernorm(x, c->ln0_w, c->ln0_b, c->C, c->rw->ln_eps, x);
    }
}

static void
cpu_stage_ln1(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const cpu_layer *ly = &c->layers[c->layer];
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++)
        cpu_layernorm(c->x + (size_t)t * c->C, ly->ln1_w, ly->ln1_b, c->C, c->rw->ln_eps,
                      c->xln + (size_t)t * c->C);
}

static void
cpu_stage_ln2(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const cpu_layer *ly = &c->layers[c->layer];
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++)
        cpu_layernorm(c->x + (size_t)t * c->C, ly->ln2_w, ly->ln2_b, c->C, c->rw->ln_eps,
                      c->xln + (size_t)t * c->C);
}

/* The previous token's normalised input: in the pass, or the slot's shift. */
static const float *
cpu_prev(const be_ctx *c, uint32_t t, size_t shift_off)
{
    const be_cpu_seg *s = &c->b.segs[c->b.tseg[t]];
    if (t > s->t0)
        return c->xln + (size_t)(t - 1) * c->C;
    return cpu_slot_layer(c, s->slot, c->layer) + shift_off;
}

/* The six attention mixes x + (prev - x) * x_* */
static void
cpu_stage_mix(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const cpu_layer *ly = &c->layers[c->layer];
    const uint32_t C = c->C;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        const float *x = c->xln + (size_t)t * C;
        const float *prev = cpu_prev(c, t, 0);
        for (int j = 0; j < MIX_N; j++) {
            float *o = c->mx[j] + (size_t)t * C;
            const float *m = ly->mix[j];
            for (uint32_t i = 0; i < C; i++)
                o[i] = x[i] + (prev[i] - x[i]) * m[i];
        }
    }
}

static void
cpu_stage_fmix(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const cpu_layer *ly = &c->layers[c->layer];
    const uint32_t C = c->C;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        const float *x = c->xln + (size_t)t * C;
        const float *prev = cpu_prev(c, t, C);
        float *o = c->mx[0] + (size_t)t * C;
        for (uint32_t i = 0; i < C; i++)
            o[i] = x[i] + (prev[i] - x[i]) * ly->ffn_x_k[i];
    }
}

/*
 * After the LoRAs, token t, the channels of head h: decay, ICLR, kk, the
 * key update, the value residual. Every value is per channel except kk's
 * norm, which is per head, so a head's channels need nothing from the
 * others. In: mx0 = w2 out, mx1 = a2 out, mx2 = v2 out, k, v.
 * Out: mx0 = decay w, mx1 = b = kk * iclr, mx4 = a = -kk, k updated, v
 * mixed (layer 0: vf = v).
 */
static void
cpu_att_head(be_ctx *c, const cpu_layer *ly, uint32_t t, uint32_t h)
{
    const uint32_t N = c->N;
    const size_t o = (size_t)t * c->C + (size_t)h * N;
    float *dw = c->mx[0] + o, *da = c->mx[1] + o, *dv = c->mx[2] + o, *kk = c->mx[4] + o;
    float *k = c->k + o, *v = c->v + o, *vf = c->vf + o;
    const size_t ch = (size_t)h * N; /* into the per-channel vectors */
    for (uint32_t i = 0; i < N; i++) {
        dw[i] = expf(-BE_CPU_DECAY_SCALE * cpu_sigmoid(ly->w0[ch + i] + dw[i]));
        da[i] = cpu_sigmoid(ly->a0[ch + i] + da[i]);
        kk[i] = k[i] * ly->k_k[ch + i];
    }
    float ss = 0.0f;
    for (uint32_t j = 0; j < N; j++)
        ss += kk[j] * kk[j];
    float nrm = sqrtf(ss);
    if (nrm < 1e-12f)
        nrm = 1e-12f;
    for (uint32_t j = 0; j < N; j++)
        kk[j] = kk[j] / nrm;
    for (uint32_t i = 0; i < N; i++) {
        const float ic = da[i], kv = kk[i];
        k[i] = k[i] * (1.0f + (ic - 1.0f) * ly->k_a[ch + i]);
        da[i] = kv * ic;
        kk[i] = -kv;
    }
    if (c->layer == 0) {
        memcpy(vf, v, sizeof(float) * N);
    } else {
        for (uint32_t i = 0; i < N; i++)
            v[i] = v[i] + (vf[i] - v[i]) * cpu_sigmoid(ly->v0[ch + i] + dv[i]);
    }
}

/*
 * The LoRA up-projections (w2, a2, v2, g2) of rows [t0, t0 + n), the
 * columns of panels [p0, p1) (a head's channels, in cpu_stage_head). The
 * kernels compute each element alone, so these are the bits a GEMM over all
 * columns and rows gives.
 */
static void
cpu_lora_up(be_ctx *c, const cpu_layer *ly, uint32_t t0, uint32_t n, uint32_t p0, uint32_t p1)
{
    const be_cpu_isa isa = c->b.isa;
    const size_t C = c->C;
    be_cpu_gemm(isa, &ly->w2, c->lw + (size_t)t0 * c->Dw, c->Dw, n, c->mx[0] + t0 * C, C, NULL,
                p0, p1, BE_CPU_EPI_STORE);
    be_cpu_gemm(isa, &ly->a2, c->la + (size_t)t0 * c->Da, c->Da, n, c->mx[1] + t0 * C, C, NULL,
                p0, p1, BE_CPU_EPI_STORE);
    if (c->layer > 0)
        be_cpu_gemm(isa, &ly->v2, c->lv + (size_t)t0 * c->Dv, c->Dv, n, c->mx[2] + t0 * C, C,
                    NULL, p0, p1, BE_CPU_EPI_STORE);
    be_cpu_gemm(isa, &ly->g2, c->lg + (size_t)t0 * c->Dg, c->Dg, n, c->mx[3] + t0 * C, C, NULL,
                p0, p1, BE_CPU_EPI_STORE);
}

/*
 * One (segment, head) task: when a head's channels are whole panels
 * (c->head_panels), the LoRA up-projections of those channels for the
 * segment's tokens first; then per token in order cpu_att_head, the WKV
 * step, GroupNorm, the bonus and the gate for that head. Out: mx5 =
 * (GN(y) + bonus) * g, with g in mx3. Folding the per-head work into one
 * region spares a decode step two fork-joins per layer and runs the
 * per-channel exp/sigmoid math on every thread (it ran on the caller alone).
 */
static void
cpu_stage_head(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const uint32_t l = c->layer;
    const cpu_layer *ly = &c->layers[l];
    const uint32_t C = c->C, N = c->N;
    const be_cpu_seg *sg = &c->b.segs[task / c->H];
    const uint32_t h = task % c->H;
    float *S = cpu_slot_layer(c, sg->slot, l) + 2 * (size_t)C + (size_t)h * N * N;
    const double gn_eps = c->rw->gn_eps; /* BlinkDL 64e-5, HF head_dim * norm_eps */
    const size_t ho = (size_t)h * N;

    if (c->head_panels != 0)
        cpu_lora_up(c, ly, sg->t0, sg->n, h * c->head_panels, (h + 1) * c->head_panels);
    for (uint32_t t = sg->t0; t < sg->t0 + sg->n; t++) {
        const size_t o = (size_t)t * C + ho;
        const float *r = c->r + o, *k = c->k + o, *v = c->v + o;
        float *y = c->mx[5] + o;
        cpu_att_head(c, ly, t, h);
        be_cpu_wkv_head(c->b.isa, N, S, r, c->mx[0] + o, k, v, c->mx[4] + o, c->mx[1] + o, y);
        cpu_layernorm(y, ly->lnx_w + ho, ly->lnx_b + ho, N, gn_eps, y);
        float bonus = 0.0f;
        for (uint32_t j = 0; j < N; j++)
            bonus += r[j] * k[j] * ly->r_k[ho + j];
        const float *g = c->mx[3] + o;
        for (uint32_t j = 0; j < N; j++)
            y[j] = (y[j] + bonus * v[j]) * g[j];
    }
}

/* Final LayerNorm of the logits positions into xln rows 0..n_logits-1. */
static void
cpu_stage_lnout(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    uint32_t i0, i1;
    be_cpu_logits_range(&c->b, task, &i0, &i1);
    for (uint32_t i = i0; i < i1; i++)
        cpu_layernorm(c->x + (size_t)c->b.lpos[i] * c->C, c->lnout_w, c->lnout_b, c->C,
                      c->rw->ln_eps, c->xln + (size_t)i * c->C);
}

/* ------------------------------------------------------------------------ */
/* a pass                                                                    */
/* ------------------------------------------------------------------------ */

static void
cpu_save_shift(be_ctx *c, size_t shift_off)
{
    for (uint32_t s = 0; s < c->b.n_segs; s++) {
        const be_cpu_seg *sg = &c->b.segs[s];
        memcpy(cpu_slot_layer(c, sg->slot, c->layer) + shift_off,
               c->xln + (size_t)(sg->t0 + sg->n - 1) * c->C, sizeof(float) * c->C);
    }
}

static void
cpu_pass_run(be_cpu_base *b)
{
    be_ctx *c = (be_ctx *)b; /* b is the context's first member */
    const uint32_t T = b->T;

    be_cpu_tok_run(b, cpu_stage_embed, c);
    for (uint32_t l = 0; l < c->L; l++) {
        const cpu_layer *ly = &c->layers[l];
        c->layer = l;

        /* time mix */
        be_cpu_tok_run(b, cpu_stage_ln1, c);
        be_cpu_tok_run(b, cpu_stage_mix, c);
        cpu_save_shift(c, 0);

        be_cpu_job_add(b, &ly->wr, c->mx[MIX_R], T, c->r, NULL, BE_CPU_EPI_STORE);
        be_cpu_job_add(b, &ly->wk, c->mx[MIX_K], T, c->k, NULL, BE_CPU_EPI_STORE);
        be_cpu_job_add(b, &ly->wv, c->mx[MIX_V], T, c->v, NULL, BE_CPU_EPI_STORE);
        be_cpu_job_add(b, &ly->w1, c->mx[MIX_W], T, c->lw, NULL, BE_CPU_EPI_TANH);
        be_cpu_job_add(b, &ly->a1, c->mx[MIX_A], T, c->la, NULL, BE_CPU_EPI_STORE);
        if (l > 0)
            be_cpu_job_add(b, &ly->v1, c->mx[MIX_V], T, c->lv, NULL, BE_CPU_EPI_STORE);
        be_cpu_job_add(b, &ly->g1, c->mx[MIX_G], T, c->lg, NULL, BE_CPU_EPI_SIGMOID);
        be_cpu_jobs_run(b);

        if (c->head_panels == 0) {
            be_cpu_job_add(b, &ly->w2, c->lw, T, c->mx[0], NULL, BE_CPU_EPI_STORE);
            be_cpu_job_add(b, &ly->a2, c->la, T, c->mx[1], NULL, BE_CPU_EPI_STORE);
            if (l > 0)
                be_cpu_job_add(b, &ly->v2, c->lv, T, c->mx[2], NULL, BE_CPU_EPI_STORE);
            be_cpu_job_add(b, &ly->g2, c->lg, T, c->mx[3], NULL, BE_CPU_EPI_STORE);
            be_cpu_jobs_run(b);
        }
        be_cpu_pool_run(b->pool, cpu_stage_head, c, b->n_segs * c->H);

        be_cpu_job_add(b, &ly->wo, c->mx[5], T, c->x, NULL, BE_CPU_EPI_ADD);
        be_cpu_jobs_run(b);

        /* channel mix */
        be_cpu_tok_run(b, cpu_stage_ln2, c);
        be_cpu_tok_run(b, cpu_stage_fmix, c);
        cpu_save_shift(c, c->C);
        be_cpu_job_add(b, &ly->fk, c->mx[0], T, c->hf, NULL, BE_CPU_EPI_RELU2);
        be_cpu_jobs_run(b);
        be_cpu_job_add(b, &ly->fv, c->hf, T, c->x, NULL, BE_CPU_EPI_ADD);
        be_cpu_jobs_run(b);
    }

    be_cpu_logits_run(b, cpu_stage_lnout, c, &c->head, c->xln);
}

/* ------------------------------------------------------------------------ */
/* open / close                                                              */
/* ------------------------------------------------------------------------ */

static void
cpu_close(be_cpu_base *b)
{
    be_ctx *c = (be_ctx *)b; /* b is the context's first member */
    if (c == NULL)
        return;
    be_cpu_base_close(&c->b);
    if (c->layers != NULL) {
        for (uint32_t l = 0; l < c->L; l++) {
            cpu_layer *ly = &c->layers[l];
            be_cpu_mat *mats[] = {&ly->wr, &ly->wk, &ly->wv, &ly->wo, &ly->w1, &ly->w2, &ly->a1,
                                  &ly->a2, &ly->v1, &ly->v2, &ly->g1, &ly->g2, &ly->fk, &ly->fv};
            for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++)
                be_cpu_mat_free(mats[i]);
        }
    }
    free(c->layers);
    be_cpu_mat_free(&c->head);
    free(c->weights);
    free(c->vecs);
    free(c->x);
    free(c->xln);
    for (int j = 0; j < MIX_N; j++)
        free(c->mx[j]);
    free(c->r);
    free(c->k);
    free(c->v);
    free(c->vf);
    free(c->lw);
    free(c->la);
    free(c->lv);
    free(c->lg);
    free(c->hf);
    free(c);
}

/* Converts a vector tensor of n values to fp32 at dst. */
static wk_err
cpu_vec(const wk_tensor *t, size_t n, float *dst, const float **field)
{
    wk_err e = wk_tensor_read_f32(t, 0, n, dst);
    if (e == WK_OK)
        *field = dst;
    return e;
}

/*
 * Packs every matrix into one block (huge pages: decode streams all of it),
 * set up here, filled in parallel by be_cpu_pack_run.
 */
static wk_err
cpu_open_mats(be_ctx *c, wk_diag *d)
{
    const wrk_rwkv7 *rw = c->rw;
    const size_t max_packs = (size_t)c->L * 14 + 1;
    be_cpu_mat **dst = calloc(max_packs, sizeof(*dst));
    const wrk_mat **src = calloc(max_packs, sizeof(*src));
    size_t np = 0;
    wk_err e = WK_OK;
    if (dst == NULL || src == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto out;
    }
    for (uint32_t l = 0; l < c->L; l++) {
        const wrk_rwkv7_layer *s = &rw->layers[l];
        cpu_layer *ly = &c->layers[l];
        const wrk_mat *ls[] = {&s->wr, &s->wk, &s->wv, &s->wo, &s->w1, &s->w2, &s->a1,
                               &s->a2, &s->v1, &s->v2, &s->g1, &s->g2, &s->ffn_key,
                               &s->ffn_value};
        be_cpu_mat *ld[] = {&ly->wr, &ly->wk, &ly->wv, &ly->wo, &ly->w1, &ly->w2, &ly->a1,
                            &ly->a2, &ly->v1, &ly->v2, &ly->g1, &ly->g2, &ly->fk, &ly->fv};
        for (size_t i = 0; i < 14; i++) {
            if (ls[i]->t == NULL)
                continue; /* layer 0 value LoRA */
            src[np] = ls[i];
            dst[np] = ld[i];
            np++;
        }
    }
    src[np] = &rw->head;
    dst[np] = &c->head;
    np++;
    size_t total = 0;
    for (size_t i = 0; i < np; i++) {
        size_t bytes = be_cpu_mat_bytes(src[i]);
        if (bytes == 0) {
            e = wk_diag_set(d, WK_EINVAL, "cpu backend: %s: cannot pack (dtype %s)",
                            src[i]->t->name, wk_dtype_name(src[i]->t->dtype));
            goto out;
        }
        total += bytes;
    }
    c->weights = be_cpu_big_alloc(total);
    if (c->weights == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "cpu backend: cannot allocate %zu bytes of packed weights",
                        total);
        goto out;
    }
    uint8_t *wp = c->weights;
    for (size_t i = 0; i < np; i++) {
        if ((e = be_cpu_mat_init(dst[i], src[i], wp)) != WK_OK) {
            wk_diag_set(d, e, "cpu backend: cannot pack %s", src[i]->t->name);
            goto out;
        }
        wp += dst[i]->bytes;
        c->weight_bytes += dst[i]->bytes;
    }
    e = be_cpu_pack_run(&c->b, dst, src, np, d);
out:
    free(dst);
    free(src);
    return e;
}

static wk_err
cpu_open(const be_config *cfg, const wrk_model *m, be_cpu_base **out, wk_diag *d)
{
    if (cfg == NULL || m == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: missing config or model");
    const wrk_rwkv7 *rw = wrk_model_rwkv7(m);
    if (rw == NULL)
        return wk_diag_set(d, WK_ENOTSUP, "cpu backend: model family %s not supported",
                           wrk_model_info_get(m)->family);

    be_ctx *c = calloc(1, sizeof(*c));
    wk_err e = WK_ENOMEM;
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    c->rw = rw;
    c->L = rw->n_layer;
    c->C = rw->n_embd;
    c->H = rw->n_head;
    c->N = rw->head_size;
    c->F = rw->ffn_dim;
    c->Dw = rw->lora_w;
    c->Da = rw->lora_a;
    c->Dv = rw->lora_v;
    c->Dg = rw->lora_g;
    c->head_panels = c->N % BE_CPU_NR == 0 ? c->N / BE_CPU_NR : 0;
    const uint32_t C = c->C, L = c->L;
    c->layer_floats = 2 * (size_t)C + (size_t)c->H * c->N * c->N;

    /* threads, arena of L * layer_floats per slot, pass buffers */
    if ((e = be_cpu_base_open(&c->b, cfg, m, (size_t)L * c->layer_floats, d)) != WK_OK)
        goto fail;
    if (c->b.cap > c->b.max_tokens)
        c->b.cap = c->b.max_tokens; /* no pass is longer than a step */

    /* small vectors: 4 global + per layer 19 of C (mixes, biases, ...) */
    const size_t per_layer = 19;
    c->vecs = be_cpu_alloc_f((4 + per_layer * L) * (size_t)C);
    c->layers = calloc(L, sizeof(*c->layers));
    if (c->vecs == NULL || c->layers == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto fail;
    }
    float *vp = c->vecs;
#define VEC(t, field)                                                          \
    do {                                                                       \
        if ((e = cpu_vec((t), C, vp, &(field))) != WK_OK)                      \
            goto vec_fail;                                                     \
        vp += C;                                                               \
    } while (0)
    VEC(rw->ln0_w, c->ln0_w);
    VEC(rw->ln0_b, c->ln0_b);
    VEC(rw->lnout_w, c->lnout_w);
    VEC(rw->lnout_b, c->lnout_b);
    for (uint32_t l = 0; l < L; l++) {
        const wrk_rwkv7_layer *s = &rw->layers[l];
        cpu_layer *ly = &c->layers[l];
        VEC(s->ln1_w, ly->ln1_w);
        VEC(s->ln1_b, ly->ln1_b);
        VEC(s->ln2_w, ly->ln2_w);
        VEC(s->ln2_b, ly->ln2_b);
        VEC(s->x_r, ly->mix[MIX_R]);
        VEC(s->x_w, ly->mix[MIX_W]);
        VEC(s->x_k, ly->mix[MIX_K]);
        VEC(s->x_v, ly->mix[MIX_V]);
        VEC(s->x_a, ly->mix[MIX_A]);
        VEC(s->x_g, ly->mix[MIX_G]);
        VEC(s->w0, ly->w0);
        VEC(s->a0, ly->a0);
        if (l > 0)
            VEC(s->v0, ly->v0);
        VEC(s->k_k, ly->k_k);
        VEC(s->k_a, ly->k_a);
        VEC(s->r_k, ly->r_k); /* H * N == C values */
        VEC(s->lnx_w, ly->lnx_w);
        VEC(s->lnx_b, ly->lnx_b);
        VEC(s->ffn_x_k, ly->ffn_x_k);
    }
#undef VEC

    if ((e = cpu_open_mats(c, d)) != WK_OK)
        goto fail;

    /* pass scratch */
    const size_t cap = c->b.cap;
    c->x = be_cpu_alloc_f(cap * C);
    c->xln = be_cpu_alloc_f(cap * C);
    bool ok = c->x != NULL && c->xln != NULL;
    for (int j = 0; j < MIX_N; j++)
        ok = ok && (c->mx[j] = be_cpu_alloc_f(cap * C)) != NULL;
    ok = ok && (c->r = be_cpu_alloc_f(cap * C)) != NULL;
    ok = ok && (c->k = be_cpu_alloc_f(cap * C)) != NULL;
    ok = ok && (c->v = be_cpu_alloc_f(cap * C)) != NULL;
    ok = ok && (c->vf = be_cpu_alloc_f(cap * C)) != NULL;
    ok = ok && (c->lw = be_cpu_alloc_f(cap * c->Dw)) != NULL;
    ok = ok && (c->la = be_cpu_alloc_f(cap * c->Da)) != NULL;
    ok = ok && (c->lv = be_cpu_alloc_f(cap * c->Dv)) != NULL;
    ok = ok && (c->lg = be_cpu_alloc_f(cap * c->Dg)) != NULL;
    ok = ok && (c->hf = be_cpu_alloc_f(cap * c->F)) != NULL;
    if (!ok) {
        e = wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory for step buffers");
        goto fail;
    }
    *out = &c->b;
    return WK_OK;

vec_fail:
    wk_diag_set(d, e, "cpu backend: cannot read a vector tensor");
fail:
    cpu_close(&c->b);
    return e;
}

/* ------------------------------------------------------------------------ */
/* the family                                                                */
/* ------------------------------------------------------------------------ */

static void
cpu_describe(const be_cpu_base *b, char *buf, size_t len)
{
    const be_ctx *c = (const be_ctx *)b;
    snprintf(buf, len, "cpu isa=%s threads=%u pass_tokens=%u weights=%s packed_bytes=%llu",
             be_cpu_isa_name(c->b.isa), c->b.n_threads, c->b.cap,
             wk_dtype_name(wrk_model_info_get(c->b.model)->dtype),
             (unsigned long long)c->weight_bytes);
}

static const char *const cpu_views[] = {"rwkv7", NULL};

const be_cpu_family be_cpu_rwkv7_family = {
    .views = cpu_views,
    .open = cpu_open,
    .close = cpu_close,
    .pass = cpu_pass_run,
    .describe = cpu_describe,
};
