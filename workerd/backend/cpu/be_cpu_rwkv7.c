/*
 * be_cpu_rwkv7: the CPU backend's RWKV-7 layer kinds (be_cpu_rwkv7.h): the
 * time mix and the channel mix the layer-list pass (be_cpu_gdn.c) runs for
 * every layer of an RWKV-7 model, and the numeric reference the other
 * backends are checked against.
 *
 * The time mix over all the pass's tokens at once: the token-shift mixes
 * per token (the previous token's normed input from the pass, or the
 * slot's shift at a segment's start), one GEMM region for every
 * projection and LoRA down-projection of every token, then per (segment,
 * head) one task that runs the head's columns of the LoRA up-projections,
 * the decay / ICLR / gate math and the WKV recurrence in token order. The
 * channel mix: its shift mix per token and key GEMM with the squared ReLU
 * in the epilogue. A row longer than what is left of a pass continues in
 * the next pass from its slot state, which is exactly where a
 * token-by-token run would be.
 *
 * Batch invariance: every per-token computation reads only that token's
 * (and its row's earlier tokens') data, reductions have a fixed order, and
 * the GEMM kernels compute each element as one FMA chain in k order. So a
 * row's bits do not depend on the other rows, on how its prefill is split,
 * or on the number of threads.
 *
 * Must never: log, abort on bad input.
 */
#include "be_cpu_rwkv7.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define RW7_DECAY_SCALE 0.6065306597126334f /* exp(-0.5) */

enum { MIX_R = BE_CPU_RW7_MIX_R, MIX_W, MIX_K, MIX_V, MIX_A, MIX_G, MIX_N };

static inline float
rw7_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static inline float *
rw7_slot(const be_cpu_rw7 *k, uint32_t slot)
{
    return be_cpu_base_slot(k->b, slot) + k->soff;
}

/* The previous token's normalised input: in the pass, or the slot's shift. */
static const float *
rw7_prev(const be_cpu_rw7 *k, uint32_t t, size_t shift_off)
{
    const be_cpu_seg *s = &k->b->segs[k->b->tseg[t]];
    if (t > s->t0)
        return k->xn + (size_t)(t - 1) * k->C;
    return rw7_slot(k, s->slot) + shift_off;
}

/* The six attention mixes x + (prev - x) * x_* */
static void
rw7_stage_mix(void *arg, uint32_t task)
{
    be_cpu_rw7 *k = arg;
    const be_cpu_rw7_layer *ly = k->ly;
    const uint32_t C = k->C;
    uint32_t t0, t1;
    be_cpu_tok_range(k->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        const float *x = k->xn + (size_t)t * C;
        const float *prev = rw7_prev(k, t, 0);
        for (int j = 0; j < MIX_N; j++) {
            float *o = k->mx[j] + (size_t)t * C;
            const float *m = ly->mix[j];
            for (uint32_t i = 0; i < C; i++)
                o[i] = x[i] + (prev[i] - x[i]) * m[i];
        }
    }
}

static void
rw7_stage_fmix(void *arg, uint32_t task)
{
    be_cpu_rw7 *k = arg;
    const be_cpu_rw7_layer *ly = k->ly;
    const uint32_t C = k->C;
    uint32_t t0, t1;
    be_cpu_tok_range(k->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        const float *x = k->xn + (size_t)t * C;
        const float *prev = rw7_prev(k, t, C);
        float *o = k->mx[0] + (size_t)t * C;
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
 * mixed (first layer: vf = v).
 */
static void
rw7_att_head(be_cpu_rw7 *c, const be_cpu_rw7_layer *ly, uint32_t t, uint32_t h)
{
    const uint32_t N = c->N;
    const size_t o = (size_t)t * c->C + (size_t)h * N;
    float *dw = c->mx[0] + o, *da = c->mx[1] + o, *dv = c->mx[2] + o, *kk = c->mx[4] + o;
    float *k = c->k + o, *v = c->v + o, *vf = c->vf + o;
    const size_t ch = (size_t)h * N; /* into the per-channel vectors */
    for (uint32_t i = 0; i < N; i++) {
        dw[i] = expf(-RW7_DECAY_SCALE * rw7_sigmoid(ly->w0[ch + i] + dw[i]));
        da[i] = rw7_sigmoid(ly->a0[ch + i] + da[i]);
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
    if (ly->first) {
        memcpy(vf, v, sizeof(float) * N);
    } else {
        for (uint32_t i = 0; i < N; i++)
            v[i] = v[i] + (vf[i] - v[i]) * rw7_sigmoid(ly->v0[ch + i] + dv[i]);
    }
}

/*
 * The LoRA up-projections (w2, a2, v2, g2) of rows [t0, t0 + n), the
 * columns of panels [p0, p1) (a head's channels, in rw7_stage_head). The
 * kernels compute each element alone, so these are the bits a GEMM over all
 * columns and rows gives.
 */
static void
rw7_lora_up(be_cpu_rw7 *c, const be_cpu_rw7_layer *ly, uint32_t t0, uint32_t n, uint32_t p0,
            uint32_t p1)
{
    const be_cpu_isa isa = c->b->isa;
    const size_t C = c->C;
    be_cpu_gemm(isa, &ly->w2, c->lw + (size_t)t0 * c->Dw, c->Dw, n, c->mx[0] + t0 * C, C, NULL, p0,
                p1, BE_CPU_EPI_STORE);
    be_cpu_gemm(isa, &ly->a2, c->la + (size_t)t0 * c->Da, c->Da, n, c->mx[1] + t0 * C, C, NULL, p0,
                p1, BE_CPU_EPI_STORE);
    if (!ly->first)
        be_cpu_gemm(isa, &ly->v2, c->lv + (size_t)t0 * c->Dv, c->Dv, n, c->mx[2] + t0 * C, C, NULL,
                    p0, p1, BE_CPU_EPI_STORE);
    be_cpu_gemm(isa, &ly->g2, c->lg + (size_t)t0 * c->Dg, c->Dg, n, c->mx[3] + t0 * C, C, NULL, p0,
                p1, BE_CPU_EPI_STORE);
}

/*
 * One (segment, head) task: when a head's channels are whole panels
 * (head_panels), the LoRA up-projections of those channels for the
 * segment's tokens first; then per token in order rw7_att_head, the WKV
 * step, GroupNorm, the bonus and the gate for that head. Out: mx5 =
 * (GN(y) + bonus) * g, with g in mx3. Folding the per-head work into one
 * region spares a decode step two fork-joins per layer and runs the
 * per-channel exp/sigmoid math on every thread.
 */
static void
rw7_stage_head(void *arg, uint32_t task)
{
    be_cpu_rw7 *c = arg;
    const be_cpu_rw7_layer *ly = c->ly;
    const uint32_t C = c->C, N = c->N;
    const be_cpu_seg *sg = &c->b->segs[task / c->H];
    const uint32_t h = task % c->H;
    float *S = rw7_slot(c, sg->slot) + 2 * (size_t)C + (size_t)h * N * N;
    const double gn_eps = c->gn_eps; /* BlinkDL 64e-5, HF head_dim * norm_eps */
    const size_t ho = (size_t)h * N;

    if (c->head_panels != 0)
        rw7_lora_up(c, ly, sg->t0, sg->n, h * c->head_panels, (h + 1) * c->head_panels);
    for (uint32_t t = sg->t0; t < sg->t0 + sg->n; t++) {
        const size_t o = (size_t)t * C + ho;
        const float *r = c->r + o, *k = c->k + o, *v = c->v + o;
        float *y = c->mx[5] + o;
        rw7_att_head(c, ly, t, h);
        be_cpu_wkv_head(c->b->isa, N, S, r, c->mx[0] + o, k, v, c->mx[4] + o, c->mx[1] + o, y);
        be_cpu_layernorm(y, ly->lnx_w + ho, ly->lnx_b + ho, N, gn_eps, y);
        float bonus = 0.0f;
        for (uint32_t j = 0; j < N; j++)
            bonus += r[j] * k[j] * ly->r_k[ho + j];
        const float *g = c->mx[3] + o;
        for (uint32_t j = 0; j < N; j++)
            y[j] = (y[j] + bonus * v[j]) * g[j];
    }
}

/* Each segment's last normed input into its slot's shift at shift_off. */
static void
rw7_save_shift(be_cpu_rw7 *k, size_t shift_off)
{
    for (uint32_t s = 0; s < k->b->n_segs; s++) {
        const be_cpu_seg *sg = &k->b->segs[s];
        memcpy(rw7_slot(k, sg->slot) + shift_off, k->xn + (size_t)(sg->t0 + sg->n - 1) * k->C,
               sizeof(float) * k->C);
    }
}

const float *
be_cpu_rw7_tmix(be_cpu_rw7 *c, const be_cpu_rw7_layer *ly, const float *xn, size_t soff)
{
    be_cpu_base *b = c->b;
    const uint32_t T = b->T;
    c->ly = ly;
    c->xn = xn;
    c->soff = soff;

    be_cpu_tok_run(b, rw7_stage_mix, c);
    rw7_save_shift(c, 0);

    be_cpu_job_add(b, &ly->wr, c->mx[MIX_R], T, c->r, NULL, BE_CPU_EPI_STORE);
    be_cpu_job_add(b, &ly->wk, c->mx[MIX_K], T, c->k, NULL, BE_CPU_EPI_STORE);
    be_cpu_job_add(b, &ly->wv, c->mx[MIX_V], T, c->v, NULL, BE_CPU_EPI_STORE);
    be_cpu_job_add(b, &ly->w1, c->mx[MIX_W], T, c->lw, NULL, BE_CPU_EPI_TANH);
    be_cpu_job_add(b, &ly->a1, c->mx[MIX_A], T, c->la, NULL, BE_CPU_EPI_STORE);
    if (!ly->first)
        be_cpu_job_add(b, &ly->v1, c->mx[MIX_V], T, c->lv, NULL, BE_CPU_EPI_STORE);
    be_cpu_job_add(b, &ly->g1, c->mx[MIX_G], T, c->lg, NULL, BE_CPU_EPI_SIGMOID);
    be_cpu_jobs_run(b);

    if (c->head_panels == 0) {
        be_cpu_job_add(b, &ly->w2, c->lw, T, c->mx[0], NULL, BE_CPU_EPI_STORE);
        be_cpu_job_add(b, &ly->a2, c->la, T, c->mx[1], NULL, BE_CPU_EPI_STORE);
        if (!ly->first)
            be_cpu_job_add(b, &ly->v2, c->lv, T, c->mx[2], NULL, BE_CPU_EPI_STORE);
        be_cpu_job_add(b, &ly->g2, c->lg, T, c->mx[3], NULL, BE_CPU_EPI_STORE);
        be_cpu_jobs_run(b);
    }
    be_cpu_pool_run(b->pool, rw7_stage_head, c, b->n_segs * c->H);
    return c->mx[5];
}

const float *
be_cpu_rw7_cmix(be_cpu_rw7 *c, const be_cpu_rw7_layer *ly, const float *xn, size_t soff)
{
    be_cpu_base *b = c->b;
    c->ly = ly;
    c->xn = xn;
    c->soff = soff;
    be_cpu_tok_run(b, rw7_stage_fmix, c);
    rw7_save_shift(c, c->C);
    be_cpu_job_add(b, &ly->fk, c->mx[0], b->T, c->hf, NULL, BE_CPU_EPI_RELU2);
    be_cpu_jobs_run(b);
    return c->hf;
}

/* ------------------------------------------------------------------------ */
/* open / close                                                              */
/* ------------------------------------------------------------------------ */

wk_err
be_cpu_rw7_open(be_cpu_rw7 *c, be_cpu_base *b, const wrk_rwkv7 *v, wk_diag *d)
{
    memset(c, 0, sizeof(*c));
    c->b = b;
    c->C = v->n_embd;
    c->H = v->n_head;
    c->N = v->head_size;
    c->F = v->ffn_dim;
    c->Dw = v->lora_w;
    c->Da = v->lora_a;
    c->Dv = v->lora_v;
    c->Dg = v->lora_g;
    c->gn_eps = v->gn_eps;
    c->head_panels = c->N % BE_CPU_NR == 0 ? c->N / BE_CPU_NR : 0;
    const size_t cap = b->cap, C = c->C;
    bool ok = true;
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
    if (!ok)
        return wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory for step buffers");
    return WK_OK;
}

void
be_cpu_rw7_close(be_cpu_rw7 *c)
{
    for (int j = 0; j < MIX_N; j++)
        free(c->mx[j]);
    float *bufs[] = {c->r, c->k, c->v, c->vf, c->lw, c->la, c->lv, c->lg, c->hf};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
    memset(c, 0, sizeof(*c));
}

size_t
be_cpu_rw7_vec_floats(uint32_t C)
{
    return 15 * (size_t)C; /* six mixes, w0, a0, v0, k_k, k_a, r_k, lnx_w, lnx_b, ffn_x_k */
}

wk_err
be_cpu_rw7_load(const wrk_rwkv7_layer *s, bool first, uint32_t C, float **vp, be_cpu_rw7_layer *ly)
{
    struct {
        const wk_tensor *t;
        const float **field;
    } vs[] = {
        {s->x_r, &ly->mix[MIX_R]}, {s->x_w, &ly->mix[MIX_W]}, {s->x_k, &ly->mix[MIX_K]},
        {s->x_v, &ly->mix[MIX_V]}, {s->x_a, &ly->mix[MIX_A]}, {s->x_g, &ly->mix[MIX_G]},
        {s->w0, &ly->w0},          {s->a0, &ly->a0},          {first ? NULL : s->v0, &ly->v0},
        {s->k_k, &ly->k_k},        {s->k_a, &ly->k_a},        {s->r_k, &ly->r_k}, /* H N == C */
        {s->lnx_w, &ly->lnx_w},    {s->lnx_b, &ly->lnx_b},    {s->ffn_x_k, &ly->ffn_x_k},
    };
    ly->first = first;
    for (size_t i = 0; i < sizeof(vs) / sizeof(vs[0]); i++) {
        if (vs[i].t == NULL)
            continue; /* the first layer's v0 */
        wk_err e = wk_tensor_read_f32(vs[i].t, 0, C, *vp);
        if (e != WK_OK)
            return e;
        *vs[i].field = *vp;
        *vp += C;
    }
    return WK_OK;
}

size_t
be_cpu_rw7_mats(const wrk_rwkv7_layer *s, be_cpu_rw7_layer *ly, const wrk_mat **src,
                be_cpu_mat **dst)
{
    const wrk_mat *ls[] = {&s->wr, &s->wk, &s->wv, &s->wo, &s->w1, &s->w2,      &s->a1,
                           &s->a2, &s->v1, &s->v2, &s->g1, &s->g2, &s->ffn_key, &s->ffn_value};
    be_cpu_mat *ld[] = {&ly->wr, &ly->wk, &ly->wv, &ly->wo, &ly->w1, &ly->w2, &ly->a1,
                        &ly->a2, &ly->v1, &ly->v2, &ly->g1, &ly->g2, &ly->fk, &ly->fv};
    size_t n = 0;
    for (size_t i = 0; i < sizeof(ls) / sizeof(ls[0]); i++) {
        if (ls[i]->t == NULL || (ly->first && (ld[i] == &ly->v1 || ld[i] == &ly->v2)))
            continue; /* the first layer's value LoRA */
        src[n] = ls[i];
        dst[n] = ld[i];
        n++;
    }
    return n;
}

void
be_cpu_rw7_mats_free(be_cpu_rw7_layer *ly)
{
    be_cpu_mat *mats[] = {&ly->wr, &ly->wk, &ly->wv, &ly->wo, &ly->w1, &ly->w2, &ly->a1,
                          &ly->a2, &ly->v1, &ly->v2, &ly->g1, &ly->g2, &ly->fk, &ly->fv};
    for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++)
        be_cpu_mat_free(mats[i]);
}
