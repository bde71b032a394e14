/*
 * be_cpu: the CPU backend's RWKV-7 family (be_cpu_rwkv7_ops; be_cpu_ops in
 * be_cpu_family.c dispatches to it), and the numeric reference the other
 * backends are checked against.
 *
 * At open it packs every weight matrix into column panels in its stored
 * dtype (be_cpu_kernels.h), converts the small vectors to fp32, and
 * allocates the slot arena (layout in be.h). A step flattens its rows into
 * passes of at most ctx->cap tokens; each pass runs the whole network over
 * all its tokens at once: one batched GEMM per projection for all tokens of
 * all rows, the WKV recurrence per (row, head) in token order, and the
 * LayerNorm/mix/gate math per token. A row longer than what is left of a
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
#include "be.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "be_cpu_kernels.h"

#define BE_CPU_PASS_TOKENS 256u   /* tokens per pass (work buffer rows) */
#define BE_CPU_DEF_ROWS 1024u     /* max_step_rows when the config says 0 */
#define BE_CPU_DEF_TOKENS 65536u  /* max_step_tokens when the config says 0 */
#define BE_CPU_MAX_JOBS 8         /* GEMMs in one parallel region */
#define BE_CPU_LN_EPS 1e-5        /* LayerNorm epsilon */
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

/* One contiguous run of a row's tokens inside a pass. */
typedef struct cpu_seg {
    uint32_t row;  /* index into the step's rows */
    uint32_t slot; /* arena slot */
    uint32_t t0;   /* first token's index in the pass buffers */
    uint32_t n;    /* tokens */
    uint32_t off;  /* index of the first token within the row */
} cpu_seg;

typedef struct cpu_job {
    const be_cpu_mat *w; /* weights */
    const float *x;      /* input rows */
    uint32_t m;          /* rows */
    float *y;            /* output rows, ldy = w->n unless yrows */
    float *const *yrows; /* per-row outputs or NULL */
    be_cpu_epi epi;      /* epilogue */
} cpu_job;

typedef struct cpu_task {
    uint32_t job;    /* index into jobs */
    uint32_t p0, p1; /* panel range */
} cpu_task;

struct be_ctx {
    const wrk_model *model; /* borrowed for the context's life */
    const wrk_rwkv7 *rw;    /* the model's RWKV-7 view */
    be_cpu_isa isa;         /* kernel path */
    be_cpu_pool *pool;      /* threads */
    uint32_t n_threads;     /* pool size */
    uint32_t L, C, H, N, F, V;      /* dimensions */
    uint32_t Dw, Da, Dv, Dg;        /* LoRA ranks */
    uint32_t max_rows, max_tokens;  /* step limits */
    float *vecs;            /* every small fp32 vector, one block, owned */
    const float *ln0_w, *ln0_b;     /* into vecs */
    const float *lnout_w, *lnout_b; /* into vecs */
    cpu_layer *layers;      /* L entries, owned */
    be_cpu_mat head;        /* C -> V */
    void *weights;          /* one block holding every packed matrix, owned */
    uint64_t weight_bytes;  /* packed bytes */

    uint32_t n_slots;       /* arena slots incl. 0 */
    size_t layer_floats;    /* 2C + H N N */
    size_t slot_floats;     /* L * layer_floats */
    float *arena;           /* n_slots * slot_floats, owned */
    uint32_t *slot_mark;    /* duplicate detection, n_slots entries */
    uint32_t mark_gen;      /* current mark value */

    /* pass scratch, cap tokens each */
    uint32_t cap;           /* tokens per pass */
    float *x;               /* residual [cap][C] */
    float *xln;             /* LayerNorm output [cap][C] */
    float *mx[MIX_N];       /* mixes, then reused [cap][C] */
    float *r, *k, *v, *vf;  /* [cap][C] */
    float *lw, *la, *lv, *lg; /* LoRA hidden [cap][D*] */
    float *hf;              /* channel-mix hidden [cap][F] */
    int32_t *tok;           /* token ids [cap] */
    uint32_t *tseg;         /* segment of each token [cap] */
    cpu_seg *segs;          /* [cap] */
    uint32_t n_segs;        /* segments in the current pass */
    uint32_t T;             /* tokens in the current pass */
    float **lrows;          /* logits row pointers [cap] */
    uint32_t *lpos;         /* token index of each logits row [cap] */
    uint32_t n_logits;      /* logits rows in the current pass */
    uint32_t layer;         /* layer being run (for task bodies) */

    cpu_job jobs[BE_CPU_MAX_JOBS]; /* current GEMM region */
    uint32_t n_jobs;        /* jobs in it */
    cpu_task *tasks;        /* task list */
    uint32_t tasks_cap;     /* entries in tasks */
    uint32_t n_tasks;       /* tasks in the current region */
    uint32_t tok_tasks;     /* tasks for a token-parallel region */
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
    return c->arena + (size_t)slot * c->slot_floats + (size_t)layer * c->layer_floats;
}

/* ------------------------------------------------------------------------ */
/* parallel regions                                                          */
/* ------------------------------------------------------------------------ */

static void
cpu_gemm_task(void *arg, uint32_t t)
{
    be_ctx *c = arg;
    const cpu_task *tk = &c->tasks[t];
    const cpu_job *j = &c->jobs[tk->job];
    be_cpu_gemm(c->isa, j->w, j->x, j->w->k, j->m, j->y, j->w->n, j->yrows, tk->p0, tk->p1,
                j->epi);
}

static void
cpu_job_add(be_ctx *c, const be_cpu_mat *w, const float *x, uint32_t m, float *y,
            float *const *yrows, be_cpu_epi epi)
{
    cpu_job *j = &c->jobs[c->n_jobs++];
    j->w = w;
    j->x = x;
    j->m = m;
    j->y = y;
    j->yrows = yrows;
    j->epi = epi;
}

/* Runs the queued GEMM jobs as one parallel region. */
static void
cpu_jobs_run(be_ctx *c)
{
    uint32_t total = 0, m = 0;
    for (uint32_t i = 0; i < c->n_jobs; i++) {
        total += c->jobs[i].w->n_panels;
        if (c->jobs[i].m > m)
            m = c->jobs[i].m;
    }
    const uint32_t grain = be_cpu_gemm_panel_grain(c->isa, m);
    uint32_t chunk = (total + 4 * c->n_threads - 1) / (4 * c->n_threads);
    chunk = (chunk + grain - 1) / grain * grain;
    if (chunk == 0)
        chunk = grain;
    if (c->n_threads == 1)
        chunk = UINT32_MAX / 2;
    c->n_tasks = 0;
    for (uint32_t i = 0; i < c->n_jobs; i++) {
        const uint32_t np = c->jobs[i].w->n_panels;
        for (uint32_t p = 0; p < np; p += chunk) {
            if (c->n_tasks == c->tasks_cap)
                break; /* cannot happen: tasks_cap bounds total/chunk + jobs */
            cpu_task *tk = &c->tasks[c->n_tasks++];
            tk->job = i;
            tk->p0 = p;
            tk->p1 = p + chunk < np ? p + chunk : np;
        }
    }
    be_cpu_pool_run(c->pool, cpu_gemm_task, c, c->n_tasks);
    c->n_jobs = 0;
}

/* Token range of task t of a token-parallel region. */
static void
cpu_tok_range(const be_ctx *c, uint32_t t, uint32_t *t0, uint32_t *t1)
{
    uint32_t n = c->tok_tasks;
    *t0 = (uint32_t)((uint64_t)c->T * t / n);
    *t1 = (uint32_t)((uint64_t)c->T * (t + 1) / n);
}

static void
cpu_tok_run(be_ctx *c, be_cpu_pool_fn fn)
{
    uint32_t n = c->T < 8 ? 1 : c->n_threads * 2;
    if (n > c->T)
        n = c->T;
    c->tok_tasks = n;
    be_cpu_pool_run(c->pool, fn, c, n);
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
    cpu_tok_range(c, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        float *x = c->x + (size_t)t * c->C;
        /* the row exists: validated against the vocab before the pass */
        if (wk_tensor_read_f32(c->rw->emb, (size_t)c->tok[t] * c->C, c->C, x) != WK_OK)
            memset(x, 0, sizeof(float) * c->C);
        cpu_layernorm(x, c->ln0_w, c->ln0_b, c->C, BE_CPU_LN_EPS, x);
    }
}

static void
cpu_stage_ln1(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const cpu_layer *ly = &c->layers[c->layer];
    uint32_t t0, t1;
    cpu_tok_range(c, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++)
        cpu_layernorm(c->x + (size_t)t * c->C, ly->ln1_w, ly->ln1_b, c->C, BE_CPU_LN_EPS,
                      c->xln + (size_t)t * c->C);
}

static void
cpu_stage_ln2(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const cpu_layer *ly = &c->layers[c->layer];
    uint32_t t0, t1;
    cpu_tok_range(c, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++)
        cpu_layernorm(c->x + (size_t)t * c->C, ly->ln2_w, ly->ln2_b, c->C, BE_CPU_LN_EPS,
                      c->xln + (size_t)t * c->C);
}

/* The previous token's normalised input: in the pass, or the slot's shift. */
static const float *
cpu_prev(const be_ctx *c, uint32_t t, size_t shift_off)
{
    const cpu_seg *s = &c->segs[c->tseg[t]];
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
    cpu_tok_range(c, task, &t0, &t1);
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
    cpu_tok_range(c, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        const float *x = c->xln + (size_t)t * C;
        const float *prev = cpu_prev(c, t, C);
        float *o = c->mx[0] + (size_t)t * C;
        for (uint32_t i = 0; i < C; i++)
            o[i] = x[i] + (prev[i] - x[i]) * ly->ffn_x_k[i];
    }
}

/*
 * After the LoRAs: decay, ICLR, kk, the key update, the value residual.
 * In: mx0 = w2 out, mx1 = a2 out, mx2 = v2 out, k, v.
 * Out: mx0 = decay w, mx1 = b = kk * iclr, mx4 = a = -kk, k updated, v
 * mixed (layer 0: vf = v).
 */
static void
cpu_stage_att(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const uint32_t l = c->layer;
    const cpu_layer *ly = &c->layers[l];
    const uint32_t C = c->C, H = c->H, N = c->N;
    uint32_t t0, t1;
    cpu_tok_range(c, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        const size_t o = (size_t)t * C;
        float *dw = c->mx[0] + o, *da = c->mx[1] + o, *dv = c->mx[2] + o, *kk = c->mx[4] + o;
        float *k = c->k + o, *v = c->v + o, *vf = c->vf + o;
        for (uint32_t i = 0; i < C; i++) {
            dw[i] = expf(-BE_CPU_DECAY_SCALE * cpu_sigmoid(ly->w0[i] + dw[i]));
            da[i] = cpu_sigmoid(ly->a0[i] + da[i]);
            kk[i] = k[i] * ly->k_k[i];
        }
        for (uint32_t h = 0; h < H; h++) {
            float *q = kk + (size_t)h * N;
            float ss = 0.0f;
            for (uint32_t j = 0; j < N; j++)
                ss += q[j] * q[j];
            float nrm = sqrtf(ss);
            if (nrm < 1e-12f)
                nrm = 1e-12f;
            for (uint32_t j = 0; j < N; j++)
                q[j] = q[j] / nrm;
        }
        for (uint32_t i = 0; i < C; i++) {
            const float ic = da[i], kv = kk[i];
            k[i] = k[i] * (1.0f + (ic - 1.0f) * ly->k_a[i]);
            da[i] = kv * ic;
            kk[i] = -kv;
        }
        if (l == 0) {
            memcpy(vf, v, sizeof(float) * C);
        } else {
            for (uint32_t i = 0; i < C; i++)
                v[i] = v[i] + (vf[i] - v[i]) * cpu_sigmoid(ly->v0[i] + dv[i]);
        }
    }
}

/*
 * WKV per (segment, head), tokens in order; then GroupNorm, the bonus and
 * the gate for that head. Out: mx5 = (GN(y) + bonus) * g, with g in mx3.
 */
static void
cpu_stage_wkv(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const uint32_t l = c->layer;
    const cpu_layer *ly = &c->layers[l];
    const uint32_t C = c->C, N = c->N;
    const cpu_seg *sg = &c->segs[task / c->H];
    const uint32_t h = task % c->H;
    float *S = cpu_slot_layer(c, sg->slot, l) + 2 * (size_t)C + (size_t)h * N * N;
    const double gn_eps = (double)N * 1e-5;
    const size_t ho = (size_t)h * N;

    for (uint32_t t = sg->t0; t < sg->t0 + sg->n; t++) {
        const size_t o = (size_t)t * C + ho;
        const float *r = c->r + o, *k = c->k + o, *v = c->v + o;
        float *y = c->mx[5] + o;
        be_cpu_wkv_head(c->isa, N, S, r, c->mx[0] + o, k, v, c->mx[4] + o, c->mx[1] + o, y);
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
    uint32_t n = c->tok_tasks;
    uint32_t i0 = (uint32_t)((uint64_t)c->n_logits * task / n);
    uint32_t i1 = (uint32_t)((uint64_t)c->n_logits * (task + 1) / n);
    for (uint32_t i = i0; i < i1; i++)
        cpu_layernorm(c->x + (size_t)c->lpos[i] * c->C, c->lnout_w, c->lnout_b, c->C,
                      BE_CPU_LN_EPS, c->xln + (size_t)i * c->C);
}

/* ------------------------------------------------------------------------ */
/* a pass                                                                    */
/* ------------------------------------------------------------------------ */

static void
cpu_save_shift(be_ctx *c, size_t shift_off)
{
    for (uint32_t s = 0; s < c->n_segs; s++) {
        const cpu_seg *sg = &c->segs[s];
        memcpy(cpu_slot_layer(c, sg->slot, c->layer) + shift_off,
               c->xln + (size_t)(sg->t0 + sg->n - 1) * c->C, sizeof(float) * c->C);
    }
}

static void
cpu_pass_run(be_ctx *c)
{
    const uint32_t T = c->T;

    cpu_tok_run(c, cpu_stage_embed);
    for (uint32_t l = 0; l < c->L; l++) {
        const cpu_layer *ly = &c->layers[l];
        c->layer = l;

        /* time mix */
        cpu_tok_run(c, cpu_stage_ln1);
        cpu_tok_run(c, cpu_stage_mix);
        cpu_save_shift(c, 0);

        cpu_job_add(c, &ly->wr, c->mx[MIX_R], T, c->r, NULL, BE_CPU_EPI_STORE);
        cpu_job_add(c, &ly->wk, c->mx[MIX_K], T, c->k, NULL, BE_CPU_EPI_STORE);
        cpu_job_add(c, &ly->wv, c->mx[MIX_V], T, c->v, NULL, BE_CPU_EPI_STORE);
        cpu_job_add(c, &ly->w1, c->mx[MIX_W], T, c->lw, NULL, BE_CPU_EPI_TANH);
        cpu_job_add(c, &ly->a1, c->mx[MIX_A], T, c->la, NULL, BE_CPU_EPI_STORE);
        if (l > 0)
            cpu_job_add(c, &ly->v1, c->mx[MIX_V], T, c->lv, NULL, BE_CPU_EPI_STORE);
        cpu_job_add(c, &ly->g1, c->mx[MIX_G], T, c->lg, NULL, BE_CPU_EPI_SIGMOID);
        cpu_jobs_run(c);

        cpu_job_add(c, &ly->w2, c->lw, T, c->mx[0], NULL, BE_CPU_EPI_STORE);
        cpu_job_add(c, &ly->a2, c->la, T, c->mx[1], NULL, BE_CPU_EPI_STORE);
        if (l > 0)
            cpu_job_add(c, &ly->v2, c->lv, T, c->mx[2], NULL, BE_CPU_EPI_STORE);
        cpu_job_add(c, &ly->g2, c->lg, T, c->mx[3], NULL, BE_CPU_EPI_STORE);
        cpu_jobs_run(c);

        cpu_tok_run(c, cpu_stage_att);
        be_cpu_pool_run(c->pool, cpu_stage_wkv, c, c->n_segs * c->H);

        cpu_job_add(c, &ly->wo, c->mx[5], T, c->x, NULL, BE_CPU_EPI_ADD);
        cpu_jobs_run(c);

        /* channel mix */
        cpu_tok_run(c, cpu_stage_ln2);
        cpu_tok_run(c, cpu_stage_fmix);
        cpu_save_shift(c, c->C);
        cpu_job_add(c, &ly->fk, c->mx[0], T, c->hf, NULL, BE_CPU_EPI_RELU2);
        cpu_jobs_run(c);
        cpu_job_add(c, &ly->fv, c->hf, T, c->x, NULL, BE_CPU_EPI_ADD);
        cpu_jobs_run(c);
    }

    if (c->n_logits > 0) {
        uint32_t n = c->n_logits < 8 ? 1 : c->n_threads * 2;
        if (n > c->n_logits)
            n = c->n_logits;
        c->tok_tasks = n;
        be_cpu_pool_run(c->pool, cpu_stage_lnout, c, n);
        cpu_job_add(c, &c->head, c->xln, c->n_logits, NULL, c->lrows, BE_CPU_EPI_STORE);
        cpu_jobs_run(c);
    }
}

/* ------------------------------------------------------------------------ */
/* step                                                                      */
/* ------------------------------------------------------------------------ */

static wk_err
cpu_step_check(be_ctx *c, const be_row *rows, size_t n, wk_diag *d)
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
                return wk_diag_set(d, WK_EINVAL, "row %zu: slot %u appears twice in one step",
                                   i, r->slot);
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
cpu_step(be_ctx *c, be_row *rows, size_t n, wk_diag *d)
{
    wk_err e = cpu_step_check(c, rows, n, d);
    if (e != WK_OK)
        return e;
    /* the step is accepted: reset rows start from a zeroed slot */
    for (size_t i = 0; i < n; i++)
        if (rows[i].reset && rows[i].slot != 0)
            memset(cpu_slot_layer(c, rows[i].slot, 0), 0, c->slot_floats * sizeof(float));

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
            uint32_t room = c->cap - c->T;
            uint32_t take = r->n_tokens - off < room ? r->n_tokens - off : room;
            cpu_seg *sg = &c->segs[c->n_segs];
            sg->row = (uint32_t)i;
            sg->slot = r->slot;
            sg->t0 = c->T;
            sg->n = take;
            sg->off = off;
            for (uint32_t j = 0; j < take; j++) {
                c->tok[c->T + j] = r->tokens[off + j];
                c->tseg[c->T + j] = c->n_segs;
                if (r->logits_mode == BE_LOGITS_ALL ||
                    (r->logits_mode == BE_LOGITS_LAST && off + j == r->n_tokens - 1)) {
                    c->lpos[c->n_logits] = c->T + j;
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
                cpu_pass_run(c);
                c->T = 0;
                c->n_segs = 0;
                c->n_logits = 0;
            }
        }
    }
    if (c->T > 0)
        cpu_pass_run(c);
    c->T = 0;
    c->n_segs = 0;
    c->n_logits = 0;
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* open / close                                                              */
/* ------------------------------------------------------------------------ */

static void
cpu_close(be_ctx *c)
{
    if (c == NULL)
        return;
    be_cpu_pool_free(c->pool);
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
    free(c->arena);
    free(c->slot_mark);
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
    free(c->tok);
    free(c->tseg);
    free(c->segs);
    free(c->lrows);
    free(c->lpos);
    free(c->tasks);
    free(c);
}

/* Packing work: one entry per matrix. */
typedef struct cpu_pack {
    be_cpu_mat *dst;      /* packed */
    const wrk_mat *src;   /* stored */
} cpu_pack;

typedef struct cpu_pack_job {
    cpu_pack *packs;  /* matrices */
    cpu_task *tasks;  /* (matrix, panel range) */
} cpu_pack_job;

static void
cpu_pack_task(void *arg, uint32_t t)
{
    cpu_pack_job *j = arg;
    const cpu_task *tk = &j->tasks[t];
    be_cpu_mat_pack_panels(j->packs[tk->job].dst, j->packs[tk->job].src, tk->p0, tk->p1);
}

static float *
cpu_alloc_f(size_t n)
{
    void *p = aligned_alloc(64, ((n ? n : 1) * sizeof(float) + 63) & ~(size_t)63);
    return p;
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

static wk_err
cpu_open(const be_config *cfg, const wrk_model *m, be_ctx **out, wk_diag *d)
{
    if (cfg == NULL || m == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: missing config or model");
    const wrk_rwkv7 *rw = wrk_model_rwkv7(m);
    if (rw == NULL)
        return wk_diag_set(d, WK_ENOTSUP, "cpu backend: model family %s not supported",
                           wrk_model_info_get(m)->family);
    if (cfg->n_slots < 2)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: n_slots %u, need at least 2 (slot 0 is "
                                         "reserved)", cfg->n_slots);

    be_ctx *c = calloc(1, sizeof(*c));
    wk_err e = WK_ENOMEM;
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    c->model = m;
    c->rw = rw;
    c->isa = be_cpu_isa_detect();
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
    c->max_rows = cfg->max_step_rows ? cfg->max_step_rows : BE_CPU_DEF_ROWS;
    c->max_tokens = cfg->max_step_tokens ? cfg->max_step_tokens : BE_CPU_DEF_TOKENS;
    const uint32_t C = c->C, L = c->L;

    if ((e = be_cpu_pool_new(cfg->n_threads, &c->pool)) != WK_OK) {
        wk_diag_set(d, e, "cpu backend: cannot start threads");
        goto fail;
    }
    c->n_threads = be_cpu_pool_size(c->pool);

    /* small vectors: 4 global + per layer 19 of C (mixes, biases, ...) */
    const size_t per_layer = 19;
    c->vecs = cpu_alloc_f((4 + per_layer * L) * (size_t)C);
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

    /* matrices: allocate, then pack in parallel */
    {
        const size_t max_packs = (size_t)L * 14 + 1;
        cpu_pack *packs = calloc(max_packs, sizeof(*packs));
        size_t np = 0, ntask = 0;
        if (packs == NULL) {
            e = wk_diag_set(d, WK_ENOMEM, "out of memory");
            goto fail;
        }
        for (uint32_t l = 0; l < L; l++) {
            const wrk_rwkv7_layer *s = &rw->layers[l];
            cpu_layer *ly = &c->layers[l];
            const wrk_mat *src[] = {&s->wr, &s->wk, &s->wv, &s->wo, &s->w1, &s->w2, &s->a1,
                                    &s->a2, &s->v1, &s->v2, &s->g1, &s->g2, &s->ffn_key,
                                    &s->ffn_value};
            be_cpu_mat *dst[] = {&ly->wr, &ly->wk, &ly->wv, &ly->wo, &ly->w1, &ly->w2, &ly->a1,
                                 &ly->a2, &ly->v1, &ly->v2, &ly->g1, &ly->g2, &ly->fk, &ly->fv};
            for (size_t i = 0; i < 14; i++) {
                if (src[i]->t == NULL)
                    continue; /* layer 0 value LoRA */
                packs[np].src = src[i];
                packs[np].dst = dst[i];
                np++;
            }
        }
        packs[np].src = &rw->head;
        packs[np].dst = &c->head;
        np++;
        /* one block for all packed weights (huge pages: decode streams all of it) */
        size_t total = 0;
        for (size_t i = 0; i < np; i++) {
            size_t b = be_cpu_mat_bytes(packs[i].src);
            if (b == 0) {
                e = wk_diag_set(d, WK_EINVAL, "cpu backend: %s: cannot pack (dtype %s)",
                                packs[i].src->t->name, wk_dtype_name(packs[i].src->t->dtype));
                free(packs);
                goto fail;
            }
            total += b;
        }
        c->weights = be_cpu_big_alloc(total);
        if (c->weights == NULL) {
            e = wk_diag_set(d, WK_ENOMEM, "cpu backend: cannot allocate %zu bytes of packed "
                                          "weights", total);
            free(packs);
            goto fail;
        }
        uint8_t *wp = c->weights;
        for (size_t i = 0; i < np; i++) {
            if ((e = be_cpu_mat_init(packs[i].dst, packs[i].src, wp)) != WK_OK) {
                wk_diag_set(d, e, "cpu backend: cannot pack %s", packs[i].src->t->name);
                free(packs);
                goto fail;
            }
            wp += packs[i].dst->bytes;
            c->weight_bytes += packs[i].dst->bytes;
            ntask += (packs[i].dst->n_panels + 15) / 16;
        }
        cpu_task *tasks = calloc(ntask, sizeof(*tasks));
        if (tasks == NULL) {
            free(packs);
            e = wk_diag_set(d, WK_ENOMEM, "out of memory");
            goto fail;
        }
        size_t nt = 0;
        for (size_t i = 0; i < np; i++)
            for (uint32_t p = 0; p < packs[i].dst->n_panels; p += 16)
                tasks[nt++] = (cpu_task){(uint32_t)i, p,
                                         p + 16 < packs[i].dst->n_panels ? p + 16
                                                                         : packs[i].dst->n_panels};
        cpu_pack_job pj = {packs, tasks};
        be_cpu_pool_run(c->pool, cpu_pack_task, &pj, (uint32_t)nt);
        free(tasks);
        free(packs);
    }

    /* arena */
    c->n_slots = cfg->n_slots;
    c->layer_floats = 2 * (size_t)C + (size_t)c->H * c->N * c->N;
    c->slot_floats = (size_t)L * c->layer_floats;
    if (c->slot_floats > SIZE_MAX / sizeof(float) / c->n_slots) {
        e = wk_diag_set(d, WK_ENOMEM, "cpu backend: arena of %u slots too large", c->n_slots);
        goto fail;
    }
    c->arena = be_cpu_big_alloc(c->slot_floats * c->n_slots * sizeof(float));
    c->slot_mark = calloc(c->n_slots, sizeof(uint32_t));
    if (c->arena == NULL || c->slot_mark == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "cpu backend: cannot allocate %u slots of %zu bytes",
                        c->n_slots, c->slot_floats * sizeof(float));
        goto fail;
    }
    memset(c->arena, 0, c->slot_floats * c->n_slots * sizeof(float));

    /* pass scratch */
    c->cap = BE_CPU_PASS_TOKENS;
    const char *pt = getenv("WKVM_CPU_PASS_TOKENS"); /* tuning and tests: 1..4096 */
    if (pt != NULL && atoi(pt) >= 1 && atoi(pt) <= 4096)
        c->cap = (uint32_t)atoi(pt);
    if (c->cap > c->max_tokens)
        c->cap = c->max_tokens;
    const size_t cap = c->cap;
    c->x = cpu_alloc_f(cap * C);
    c->xln = cpu_alloc_f(cap * C);
    bool ok = c->x != NULL && c->xln != NULL;
    for (int j = 0; j < MIX_N; j++)
        ok = ok && (c->mx[j] = cpu_alloc_f(cap * C)) != NULL;
    ok = ok && (c->r = cpu_alloc_f(cap * C)) != NULL;
    ok = ok && (c->k = cpu_alloc_f(cap * C)) != NULL;
    ok = ok && (c->v = cpu_alloc_f(cap * C)) != NULL;
    ok = ok && (c->vf = cpu_alloc_f(cap * C)) != NULL;
    ok = ok && (c->lw = cpu_alloc_f(cap * c->Dw)) != NULL;
    ok = ok && (c->la = cpu_alloc_f(cap * c->Da)) != NULL;
    ok = ok && (c->lv = cpu_alloc_f(cap * c->Dv)) != NULL;
    ok = ok && (c->lg = cpu_alloc_f(cap * c->Dg)) != NULL;
    ok = ok && (c->hf = cpu_alloc_f(cap * c->F)) != NULL;
    ok = ok && (c->tok = calloc(cap, sizeof(int32_t))) != NULL;
    ok = ok && (c->tseg = calloc(cap, sizeof(uint32_t))) != NULL;
    ok = ok && (c->segs = calloc(cap, sizeof(cpu_seg))) != NULL;
    ok = ok && (c->lrows = calloc(cap, sizeof(float *))) != NULL;
    ok = ok && (c->lpos = calloc(cap, sizeof(uint32_t))) != NULL;
    c->tasks_cap = 4 * c->n_threads + 2 * BE_CPU_MAX_JOBS + 1;
    ok = ok && (c->tasks = calloc(c->tasks_cap, sizeof(cpu_task))) != NULL;
    if (!ok) {
        e = wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory for step buffers");
        goto fail;
    }
    *out = c;
    return WK_OK;

vec_fail:
    wk_diag_set(d, e, "cpu backend: cannot read a vector tensor");
fail:
    cpu_close(c);
    return e;
}

/* ------------------------------------------------------------------------ */
/* slots                                                                     */
/* ------------------------------------------------------------------------ */

static uint32_t
cpu_n_slots(const be_ctx *c)
{
    return c->n_slots;
}

static uint64_t
cpu_slot_bytes(const be_ctx *c)
{
    return (uint64_t)c->slot_floats * sizeof(float);
}

static wk_err
cpu_slot_reset(be_ctx *c, uint32_t slot)
{
    if (c == NULL || slot >= c->n_slots)
        return WK_EINVAL;
    memset(cpu_slot_layer(c, slot, 0), 0, c->slot_floats * sizeof(float));
    return WK_OK;
}

static wk_err
cpu_slot_copy(be_ctx *c, uint32_t dst, uint32_t src)
{
    if (c == NULL || dst == 0 || src == 0 || dst >= c->n_slots || src >= c->n_slots)
        return WK_EINVAL;
    if (dst != src)
        memcpy(cpu_slot_layer(c, dst, 0), cpu_slot_layer(c, src, 0),
               c->slot_floats * sizeof(float));
    return WK_OK;
}

static wk_err
cpu_slot_range(const be_ctx *c, uint32_t slot, uint64_t off, size_t len)
{
    uint64_t total = cpu_slot_bytes(c);
    if (slot == 0 || slot >= c->n_slots || off > total || len > total - off)
        return WK_EINVAL;
    return WK_OK;
}

static wk_err
cpu_slot_read(be_ctx *c, uint32_t slot, uint64_t off, void *buf, size_t len)
{
    if (c == NULL || (buf == NULL && len > 0) || cpu_slot_range(c, slot, off, len) != WK_OK)
        return WK_EINVAL;
    if (len > 0)
        memcpy(buf, (const uint8_t *)cpu_slot_layer(c, slot, 0) + off, len);
    return WK_OK;
}

static wk_err
cpu_slot_write(be_ctx *c, uint32_t slot, uint64_t off, const void *buf, size_t len)
{
    if (c == NULL || (buf == NULL && len > 0) || cpu_slot_range(c, slot, off, len) != WK_OK)
        return WK_EINVAL;
    if (len > 0)
        memcpy((uint8_t *)cpu_slot_layer(c, slot, 0) + off, buf, len);
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* probe / describe                                                          */
/* ------------------------------------------------------------------------ */

static wk_err
cpu_probe(int device, char *name, size_t name_len, uint64_t *mem_bytes)
{
    (void)device;
    if (name != NULL && name_len > 0) {
        snprintf(name, name_len, "cpu");
        FILE *f = fopen("/proc/cpuinfo", "r");
        if (f != NULL) {
            char line[512];
            while (fgets(line, sizeof(line), f) != NULL) {
                if (strncmp(line, "model name", 10) == 0) {
                    char *p = strchr(line, ':');
                    if (p != NULL) {
                        p++;
                        while (*p == ' ' || *p == '\t')
                            p++;
                        p[strcspn(p, "\n")] = '\0';
                        snprintf(name, name_len, "%s", p);
                    }
                    break;
                }
            }
            fclose(f);
        }
    }
    if (mem_bytes != NULL) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        *mem_bytes = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    }
    return WK_OK;
}

static void
cpu_describe(const be_ctx *c, char *buf, size_t len)
{
    if (buf == NULL || len == 0)
        return;
    snprintf(buf, len, "cpu isa=%s threads=%u pass_tokens=%u weights=%s packed_bytes=%llu",
             be_cpu_isa_name(c->isa), c->n_threads, c->cap,
             wk_dtype_name(wrk_model_info_get(c->model)->dtype),
             (unsigned long long)c->weight_bytes);
}

extern const be_ops be_cpu_rwkv7_ops; /* be_cpu_common.h; not included (names overlap) */
const be_ops be_cpu_rwkv7_ops = {
    .name = "cpu",
    .probe = cpu_probe,
    .open = cpu_open,
    .close = cpu_close,
    .n_slots = cpu_n_slots,
    .slot_bytes = cpu_slot_bytes,
    .slot_reset = cpu_slot_reset,
    .slot_copy = cpu_slot_copy,
    .slot_read = cpu_slot_read,
    .slot_write = cpu_slot_write,
    .step = cpu_step,
    .describe = cpu_describe,
};
