/*
 * be_cpu_common: the slot arena, the step (row checks and pass split are
 * be_rows.c's) and GEMM regions shared by the family CPU backends (see
 * be_cpu_common.h).
 */
#include "be_cpu_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BE_CPU_PASS_TOKENS 256u  /* tokens per pass */

float *
be_cpu_alloc_f(size_t n)
{
    return aligned_alloc(64, ((n ? n : 1) * sizeof(float) + 63) & ~(size_t)63);
}

wk_err
be_cpu_base_open(be_cpu_base *b, const be_config *cfg, const wrk_model *m, size_t slot_floats,
                 wk_diag *d)
{
    memset(b, 0, sizeof(*b));
    if (cfg == NULL || m == NULL)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: missing config or model");
    if (cfg->n_slots < 2)
        return wk_diag_set(d, WK_EINVAL,
                           "cpu backend: n_slots %u, need at least 2 (slot 0 is reserved)",
                           cfg->n_slots);
    b->model = m;
    b->isa = be_cpu_isa_detect();
    if (wrk_model_info_get(m)->matmul_bf16) {
        /* the engine the model's fingerprint names, never the other */
        const bool dp = wrk_model_info_get(m)->matmul_dp;
        if (dp ? !be_cpu_dp_enable() : !be_cpu_amx_enable())
            return wk_diag_set(d, WK_ENOTSUP,
                               "cpu backend: the model was loaded for --cpu-matmul bf16 on %s, "
                               "which this CPU, kernel or build does not offer; use --cpu-matmul "
                               "fp32",
                               dp ? "AVX512-BF16 dot products" : "AMX-BF16 tiles");
        b->matmul = dp ? BE_CPU_MATMUL_BF16_DP : BE_CPU_MATMUL_BF16;
    }
    b->V = wrk_model_info_get(m)->vocab_size;
    b->max_rows = cfg->max_step_rows ? cfg->max_step_rows : BE_ROWS_DEF_ROWS;
    b->max_tokens = cfg->max_step_tokens ? cfg->max_step_tokens : BE_ROWS_DEF_TOKENS;
    b->cap = BE_CPU_PASS_TOKENS;
    const char *pt = getenv("WKVM_CPU_PASS_TOKENS");
    if (pt != NULL) {
        long v = strtol(pt, NULL, 10);
        if (v >= 1 && v <= 4096)
            b->cap = (uint32_t)v;
    }
    wk_err e = be_cpu_pool_new(cfg->n_threads, &b->pool);
    if (e != WK_OK)
        return wk_diag_set(d, e, "cpu backend: cannot start threads");
    b->n_threads = be_cpu_pool_size(b->pool);

    b->n_slots = cfg->n_slots;
    b->slot_floats = slot_floats;
    if (slot_floats > SIZE_MAX / sizeof(float) / b->n_slots)
        return wk_diag_set(d, WK_ENOMEM, "cpu backend: arena of %u slots does not fit",
                           b->n_slots);
    size_t arena_bytes = (size_t)b->n_slots * slot_floats * sizeof(float);
    b->arena = be_cpu_big_alloc(arena_bytes);
    b->slot_mark = calloc(b->n_slots, sizeof(uint32_t));
    b->tok = calloc(b->cap, sizeof(int32_t));
    b->tseg = calloc(b->cap, sizeof(uint32_t));
    b->segs = calloc(b->cap, sizeof(be_cpu_seg));
    b->lrows = calloc(b->cap, sizeof(float *));
    b->lpos = calloc(b->cap, sizeof(uint32_t));
    b->tasks_cap = 64 * b->n_threads + BE_CPU_MAX_JOBS;
    b->tasks = calloc(b->tasks_cap, sizeof(be_cpu_task));
    if (b->arena == NULL || b->slot_mark == NULL || b->tok == NULL || b->tseg == NULL ||
        b->segs == NULL || b->lrows == NULL || b->lpos == NULL || b->tasks == NULL)
        return wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory (arena %zu bytes)",
                           arena_bytes);
    memset(b->arena, 0, arena_bytes);
    return WK_OK;
}

void
be_cpu_base_close(be_cpu_base *b)
{
    if (b == NULL)
        return;
    be_cpu_pool_free(b->pool);
    free(b->arena);
    free(b->slot_mark);
    free(b->tok);
    free(b->tseg);
    free(b->segs);
    free(b->lrows);
    free(b->lpos);
    free(b->tasks);
    memset(b, 0, sizeof(*b));
}

float *
be_cpu_base_slot(const be_cpu_base *b, uint32_t slot)
{
    return b->arena + (size_t)slot * b->slot_floats;
}

wk_err
be_cpu_base_slot_reset(be_cpu_base *b, uint32_t slot)
{
    if (b == NULL || slot >= b->n_slots)
        return WK_EINVAL;
    memset(be_cpu_base_slot(b, slot), 0, b->slot_floats * sizeof(float));
    return WK_OK;
}

wk_err
be_cpu_base_slot_copy(be_cpu_base *b, uint32_t dst, uint32_t src)
{
    if (b == NULL || dst == 0 || src == 0 || dst >= b->n_slots || src >= b->n_slots)
        return WK_EINVAL;
    if (dst != src)
        memcpy(be_cpu_base_slot(b, dst), be_cpu_base_slot(b, src),
               b->slot_floats * sizeof(float));
    return WK_OK;
}

static bool
be_cpu_range_ok(const be_cpu_base *b, uint32_t slot, uint64_t off, size_t len)
{
    uint64_t total = (uint64_t)b->slot_floats * sizeof(float);
    return slot != 0 && slot < b->n_slots && off <= total && len <= total - off;
}

wk_err
be_cpu_base_slot_read(be_cpu_base *b, uint32_t slot, uint64_t off, void *buf, size_t len)
{
    if (b == NULL || (buf == NULL && len > 0) || !be_cpu_range_ok(b, slot, off, len))
        return WK_EINVAL;
    if (len > 0)
        memcpy(buf, (const uint8_t *)be_cpu_base_slot(b, slot) + off, len);
    return WK_OK;
}

wk_err
be_cpu_base_slot_write(be_cpu_base *b, uint32_t slot, uint64_t off, const void *buf, size_t len)
{
    if (b == NULL || (buf == NULL && len > 0) || !be_cpu_range_ok(b, slot, off, len))
        return WK_EINVAL;
    if (len > 0)
        memcpy((uint8_t *)be_cpu_base_slot(b, slot) + off, buf, len);
    return WK_OK;
}

/* What the be_rows_pass_ops of be_cpu_base_step get as arg. */
typedef struct be_cpu_pass_arg {
    be_cpu_base *b;      /* the context */
    be_cpu_pass_fn pass; /* the family's network */
} be_cpu_pass_arg;

/* be_rows_pass_ops.seg: segment s and its tokens into the pass buffers. */
static void
be_cpu_pass_seg(void *arg, uint32_t s, const be_rows_seg *sg, const int32_t *tokens)
{
    be_cpu_base *b = ((be_cpu_pass_arg *)arg)->b;
    b->segs[s] = *sg;
    for (uint32_t j = 0; j < sg->n; j++) {
        b->tok[sg->t0 + j] = tokens[j];
        b->tseg[sg->t0 + j] = s;
    }
}

/* be_rows_pass_ops.logits: logits row i of the pass. */
static void
be_cpu_pass_logits(void *arg, uint32_t i, uint32_t pos, float *dst)
{
    be_cpu_base *b = ((be_cpu_pass_arg *)arg)->b;
    b->lpos[i] = pos;
    b->lrows[i] = dst;
}

/* be_rows_pass_ops.run: the family's network over the pass (cannot fail). */
static wk_err
be_cpu_pass_run(void *arg, uint32_t T, uint32_t n_segs, uint32_t n_logits, wk_diag *d)
{
    (void)d;
    be_cpu_pass_arg *pa = arg;
    be_cpu_base *b = pa->b;
    b->T = T;
    b->n_segs = n_segs;
    b->n_logits = n_logits;
    pa->pass(b);
    b->T = 0;
    b->n_segs = 0;
    b->n_logits = 0;
    return WK_OK;
}

static const be_rows_pass_ops be_cpu_pass_ops = {
    .seg = be_cpu_pass_seg,
    .logits = be_cpu_pass_logits,
    .run = be_cpu_pass_run,
};

wk_err
be_cpu_base_step(be_cpu_base *b, be_row *rows, size_t n, be_cpu_pass_fn pass, wk_diag *d)
{
    const be_rows_limits lim = {
        .n_slots = b->n_slots, .vocab = b->V, .max_rows = b->max_rows, .max_tokens = b->max_tokens};
    wk_err e = be_rows_check(rows, n, &lim, b->slot_mark, &b->mark_gen, d);
    if (e != WK_OK)
        return e;
    if (b->pre_step != NULL && (e = b->pre_step(b, rows, n, d)) != WK_OK)
        return e;
    /* the step is accepted: reset rows start from a zeroed slot (their KV went in pre_step) */
    for (size_t i = 0; i < n; i++)
        if (rows[i].reset && rows[i].slot != 0)
            memset(be_cpu_base_slot(b, rows[i].slot), 0, b->slot_floats * sizeof(float));
    b->T = 0;
    b->n_segs = 0;
    b->n_logits = 0;
    be_cpu_pass_arg pa = {b, pass};
    return be_rows_split(rows, n, b->cap, b->V, &be_cpu_pass_ops, &pa, d);
}

/* ------------------------------------------------------------------------ */
/* parallel regions                                                          */
/* ------------------------------------------------------------------------ */

void
be_cpu_job_add_ld(be_cpu_base *b, const be_cpu_mat *w, const float *x, size_t ldx, uint32_t m,
                  float *y, size_t ldy, be_cpu_epi epi)
{
    if (b->n_jobs == BE_CPU_MAX_JOBS)
        be_cpu_jobs_run(b);
    be_cpu_job *j = &b->jobs[b->n_jobs++];
    j->w = w;
    j->x = x;
    j->ldx = ldx;
    j->m = m;
    j->y = y;
    j->ldy = ldy;
    j->yrows = NULL;
    j->epi = epi;
}

void
be_cpu_job_add(be_cpu_base *b, const be_cpu_mat *w, const float *x, uint32_t m, float *y,
               float *const *yrows, be_cpu_epi epi)
{
    be_cpu_job_add_ld(b, w, x, w->k, m, y, w->n, epi);
    b->jobs[b->n_jobs - 1].yrows = yrows;
}

static void
be_cpu_gemm_task(void *arg, uint32_t t)
{
    be_cpu_base *b = arg;
    const be_cpu_task *tk = &b->tasks[t];
    const be_cpu_job *j = &b->jobs[tk->job];
    be_cpu_gemm(b->isa, j->w, j->x, j->ldx, j->m, j->y, j->ldy, j->yrows, tk->p0, tk->p1, j->epi);
}

void
be_cpu_jobs_run(be_cpu_base *b)
{
    uint32_t total = 0, m = 0;
    for (uint32_t i = 0; i < b->n_jobs; i++) {
        total += b->jobs[i].w->n_panels;
        if (b->jobs[i].m > m)
            m = b->jobs[i].m;
    }
    const uint32_t grain = be_cpu_gemm_panel_grain(b->isa, m);
    uint32_t chunk = (total + 4 * b->n_threads - 1) / (4 * b->n_threads);
    chunk = (chunk + grain - 1) / grain * grain;
    if (chunk == 0)
        chunk = grain;
    if (b->n_threads == 1)
        chunk = UINT32_MAX / 2;
    b->n_tasks = 0;
    for (uint32_t i = 0; i < b->n_jobs; i++) {
        const uint32_t np = b->jobs[i].w->n_panels;
        for (uint32_t p = 0; p < np; p += chunk) {
            if (b->n_tasks == b->tasks_cap) {
                /* cannot happen: 4 * threads chunks per region plus one per job */
                be_cpu_task *last = &b->tasks[b->n_tasks - 1];
                last->p1 = np;
                break;
            }
            be_cpu_task *tk = &b->tasks[b->n_tasks++];
            tk->job = i;
            tk->p0 = p;
            tk->p1 = p + chunk < np ? p + chunk : np;
        }
    }
    be_cpu_pool_run(b->pool, be_cpu_gemm_task, b, b->n_tasks);
    b->n_jobs = 0;
}

void
be_cpu_logits_range(const be_cpu_base *b, uint32_t task, uint32_t *i0, uint32_t *i1)
{
    uint32_t n = b->tok_tasks;
    *i0 = (uint32_t)((uint64_t)b->n_logits * task / n);
    *i1 = (uint32_t)((uint64_t)b->n_logits * (task + 1) / n);
}

void
be_cpu_logits_run(be_cpu_base *b, be_cpu_pool_fn norm, void *arg, const be_cpu_mat *head,
                  const float *xn)
{
    if (b->n_logits == 0)
        return;
    uint32_t n = b->n_logits < 8 ? 1 : b->n_threads * 2;
    if (n > b->n_logits)
        n = b->n_logits;
    b->tok_tasks = n;
    be_cpu_pool_run(b->pool, norm, arg, n);
    be_cpu_job_add(b, head, xn, b->n_logits, NULL, b->lrows, BE_CPU_EPI_STORE);
    be_cpu_jobs_run(b);
}

void
be_cpu_tok_range(const be_cpu_base *b, uint32_t task, uint32_t *t0, uint32_t *t1)
{
    uint32_t n = b->tok_tasks;
    *t0 = (uint32_t)((uint64_t)b->T * task / n);
    *t1 = (uint32_t)((uint64_t)b->T * (task + 1) / n);
}

void
be_cpu_tok_run(be_cpu_base *b, be_cpu_pool_fn fn, void *arg)
{
    uint32_t n = b->T < 8 ? 1 : b->n_threads * 2;
    if (n > b->T)
        n = b->T;
    if (n == 0)
        return;
    b->tok_tasks = n;
    be_cpu_pool_run(b->pool, fn, arg, n);
}

/* ------------------------------------------------------------------------ */
/* packing                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct be_cpu_pack_job {
    be_cpu_mat *const *dst;
    const wrk_mat *const *src;
    be_cpu_task *tasks;
} be_cpu_pack_job;

static void
be_cpu_pack_task(void *arg, uint32_t t)
{
    be_cpu_pack_job *j = arg;
    const be_cpu_task *tk = &j->tasks[t];
    be_cpu_mat_pack_panels(j->dst[tk->job], j->src[tk->job], tk->p0, tk->p1);
}

wk_err
be_cpu_pack_mats(be_cpu_base *b, be_cpu_mat *const *dst, const wrk_mat *const *src, size_t n,
                 wk_diag *d)
{
    for (size_t i = 0; i < n; i++) {
        size_t bytes = be_cpu_mat_bytes_as(src[i], b->matmul);
        if (bytes == 0)
            return wk_diag_set(d, WK_EINVAL, "cpu backend: matrix %zu (%s) unusable", i,
                               src[i]->t != NULL ? src[i]->t->name : "absent");
        void *mem = be_cpu_big_alloc(bytes);
        if (mem == NULL)
            return wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory packing %s",
                               src[i]->t->name);
        if (be_cpu_mat_init_as(dst[i], src[i], mem, b->matmul) != WK_OK) {
            free(mem);
            return wk_diag_set(d, WK_EINVAL, "cpu backend: cannot pack %s", src[i]->t->name);
        }
        dst[i]->owned = true;
    }
    return be_cpu_pack_run(b, dst, src, n, d);
}

wk_err
be_cpu_pack_run(be_cpu_base *b, be_cpu_mat *const *dst, const wrk_mat *const *src, size_t n,
                wk_diag *d)
{
    size_t n_tasks = 0;
    for (size_t i = 0; i < n; i++)
        n_tasks += (dst[i]->n_panels + 15) / 16;
    be_cpu_task *tasks = calloc(n_tasks ? n_tasks : 1, sizeof(*tasks));
    if (tasks == NULL)
        return wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (uint32_t p = 0; p < dst[i]->n_panels; p += 16) {
            tasks[k].job = (uint32_t)i;
            tasks[k].p0 = p;
            tasks[k].p1 = p + 16 < dst[i]->n_panels ? p + 16 : dst[i]->n_panels;
            k++;
        }
    be_cpu_pack_job j = {dst, src, tasks};
    be_cpu_pool_run(b->pool, be_cpu_pack_task, &j, (uint32_t)k);
    free(tasks);
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* math                                                                      */
typedef be_cpu_v8 be_v8;
typedef be_cpu_i8 be_i8;

/* *v = lanes of *a where m is all ones, of *b where it is 0 (pointers: no 32-byte vectors by value). */
static inline __attribute__((always_inline)) void
be_sel8(be_v8 *v, const be_i8 *m, const be_v8 *a, const be_v8 *b)
{
    be_i8 ai, bi;
    memcpy(&ai, a, sizeof(ai));
    memcpy(&bi, b, sizeof(bi));
    ai = (ai & *m) | (bi & ~*m);
    memcpy(v, &ai, sizeof(ai));
}

/*
 * *v = exp(*v) for 8 floats (be_cpu_exp_core8 on the clamped values): over
 * 88.72283 +INFINITY, under -87.33654 (where expf turns subnormal) +0, a
 * NaN stays a NaN.
 */
static inline __attribute__((always_inline)) void
be_exp8(be_v8 *v)
{
    const be_v8 x = *v, zero = {0}, hi = zero + 88.72283f, lo_c = zero - 87.33654f;
    const be_v8 inf = zero + INFINITY;
    const be_i8 big = x > 88.72283f, small = x < -87.33654f, nan = x != x, low = small | nan;
    be_v8 lo, y;
    be_sel8(&lo, &big, &hi, &x);
    be_sel8(&lo, &low, &lo_c, &lo);
    be_cpu_exp_core8(&y, &lo);
    be_sel8(&y, &big, &inf, &y);
    be_sel8(&y, &small, &zero, &y);
    be_sel8(v, &nan, &x, &y);
}

enum { BE_GATE_SILU, BE_GATE_SILU_MUL, BE_GATE_MUL_SILU, BE_GATE_MUL_SIGMOID };

/*
 * out[0..8) = the gate of a (and b): silu(a), silu(a) * b, b * silu(a) or
 * b * sigmoid(a) by kind, silu(a) = a / (1 + exp(-a)), sigmoid(a) = 1 / (1
 * + exp(-a)).
 */
static inline __attribute__((always_inline)) void
be_gate8(const float *a, const float *b, float *out, const int kind)
{
    be_v8 x, y, e, one = {0};
    one = one + 1.0f;
    memcpy(&x, a, sizeof(x));
    memcpy(&y, b, sizeof(y));
    e = -x;
    be_exp8(&e);
    e = one + e;
    if (kind == BE_GATE_SILU)
        x = x / e;
    else if (kind == BE_GATE_SILU_MUL)
        x = x / e * y;
    else if (kind == BE_GATE_MUL_SILU)
        x = y * (x / e);
    else
        x = y * (one / e);
    memcpy(out, &x, sizeof(x));
}

/*
 * out[i] = the gate of a[i], b[i] for n values: 8 at a time, the last ones
 * through a padded vector (so a value's bits never depend on where it
 * sits). b may be NULL for BE_GATE_SILU.
 */
static inline __attribute__((always_inline)) void
be_gate_body(float *out, const float *a, const float *b, size_t n, const int kind)
{
    static const float zeros[8];
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        be_gate8(a + i, b != NULL ? b + i : zeros, out + i, kind);
    if (i < n) {
        float ta[8] = {0}, tb[8] = {0};
        memcpy(ta, a + i, (n - i) * sizeof(float));
        if (b != NULL)
            memcpy(tb, b + i, (n - i) * sizeof(float));
        be_gate8(ta, tb, ta, kind);
        memcpy(out + i, ta, (n - i) * sizeof(float));
    }
}

/* be_gate_body with kind a constant in each branch (each gate its own loop). */
static inline __attribute__((always_inline)) void
be_gate_kinds(float *out, const float *a, const float *b, size_t n, int kind)
{
    switch (kind) {
    case BE_GATE_SILU:
        be_gate_body(out, a, b, n, BE_GATE_SILU);
        break;
    case BE_GATE_SILU_MUL:
        be_gate_body(out, a, b, n, BE_GATE_SILU_MUL);
        break;
    case BE_GATE_MUL_SILU:
        be_gate_body(out, a, b, n, BE_GATE_MUL_SILU);
        break;
    default:
        be_gate_body(out, a, b, n, BE_GATE_MUL_SIGMOID);
        break;
    }
}

#if defined(__x86_64__) || defined(__i386__)
/* The same operations on 8-lane AVX registers (AVX-512 CPUs run this too: the bits are the same). */
static __attribute__((target("avx2"))) void
be_gate_avx2(float *out, const float *a, const float *b, size_t n, int kind)
{
    be_gate_kinds(out, a, b, n, kind);
}
#endif

static void
be_gate_any(float *out, const float *a, const float *b, size_t n, int kind)
{
    be_gate_kinds(out, a, b, n, kind);
}

static void
be_gate_run(be_cpu_isa isa, float *out, const float *a, const float *b, size_t n, int kind)
{
#if defined(__x86_64__) || defined(__i386__)
    if (isa != BE_CPU_ISA_SCALAR) {
        be_gate_avx2(out, a, b, n, kind);
        return;
    }
#endif
    (void)isa;
    be_gate_any(out, a, b, n, kind);
}

void
be_cpu_silu(be_cpu_isa isa, float *x, size_t n)
{
    be_gate_run(isa, x, x, NULL, n, BE_GATE_SILU);
}

void
be_cpu_silu_mul(be_cpu_isa isa, float *h, const float *u, size_t n)
{
    be_gate_run(isa, h, h, u, n, BE_GATE_SILU_MUL);
}

void
be_cpu_mul_silu(be_cpu_isa isa, float *o, const float *g, size_t n)
{
    be_gate_run(isa, o, g, o, n, BE_GATE_MUL_SILU);
}

void
be_cpu_mul_sigmoid(be_cpu_isa isa, float *o, const float *g, size_t n)
{
    be_gate_run(isa, o, g, o, n, BE_GATE_MUL_SIGMOID);
}

/* ------------------------------------------------------------------------ */

void
be_cpu_rmsnorm(const float *x, const float *w, uint32_t n, double eps, float *y)
{
    double ps[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            ps[j] += (double)x[i + j] * x[i + j];
    double s = ((ps[0] + ps[1]) + (ps[2] + ps[3])) + ((ps[4] + ps[5]) + (ps[6] + ps[7]));
    for (; i < n; i++)
        s += (double)x[i] * x[i];
    const float inv = (float)(1.0 / sqrt(s / n + eps));
    for (i = 0; i < n; i++)
        y[i] = w != NULL ? x[i] * inv * w[i] : x[i] * inv;
}

void
be_cpu_layernorm(const float *x, const float *w, const float *b, uint32_t n, double eps, float *y)
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
