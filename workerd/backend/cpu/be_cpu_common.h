/*
 * be_cpu_common: what every family's CPU backend shares.
 *
 * be_cpu_ops (be_cpu.c) is the generic core; a pass plugs into it as a
 * be_cpu_family table chosen at open by the model's view: today one,
 * be_cpu_gdn_family (the layer list, every view: be_cpu_gdn.c over the
 * layer kinds of be_cpu_rwkv7.h, be_cpu_mamba2.h and its own). A family
 * context starts with a be_cpu_base, which owns the thread pool, the slot
 * arena (one fp32 block per slot, in the family's wrk_model_state_layout),
 * the step (the row checks and the split into passes of at most `cap`
 * tokens are be_rows.h's, shared with the CUDA backend), and the parallel
 * GEMM regions. The family supplies one function
 * that runs the whole network over the tokens of the current pass.
 *
 * The same rules hold for every layer kind: a row's bits never
 * depend on the other rows, on how its prefill is split or on the thread
 * count; a refused step changes no slot. Never logs, never aborts.
 */
#ifndef BE_CPU_COMMON_H
#define BE_CPU_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "be.h"
#include "be_cpu_kernels.h"
#include "be_rows.h"

#define BE_CPU_MAX_JOBS 8 /* GEMMs in one parallel region */

/* One contiguous run of a row's tokens inside a pass (be_rows.h). */
typedef be_rows_seg be_cpu_seg;

typedef struct be_cpu_job {
    const be_cpu_mat *w; /* weights */
    const float *x;      /* input rows, w->k floats apart unless ldx */
    size_t ldx;          /* floats between input rows */
    uint32_t m;          /* rows */
    float *y;            /* output rows, ldy floats apart */
    size_t ldy;          /* floats between output rows */
    float *const *yrows; /* per-row outputs or NULL */
    be_cpu_epi epi;      /* epilogue */
} be_cpu_job;

typedef struct be_cpu_task {
    uint32_t job;    /* index into jobs */
    uint32_t p0, p1; /* panel range */
} be_cpu_task;

typedef struct be_cpu_base be_cpu_base;

/*
 * Optional: called by be_cpu_base_step after every row is validated and
 * before any pass, with the same rows; a refusal (its wk_err, diag naming
 * the row) refuses the whole step, so it must change nothing when it fails
 * (hybrid models take their KV pages here, giving back a reset row's pages
 * first: be_kv_reserve). The slots' fixed parts are still untouched
 * when it runs; be_cpu_base_step zeroes the reset rows' after it succeeds.
 */
typedef wk_err (*be_cpu_pre_step_fn)(be_cpu_base *b, const be_row *rows, size_t n, wk_diag *d);

struct be_cpu_base {
    const wrk_model *model; /* borrowed for the context's life */
    be_cpu_isa isa;         /* kernel path */
    be_cpu_matmul matmul;   /* BF16-weight products: fp32 FMA chains or AMX (--cpu-matmul) */
    be_cpu_pool *pool;      /* threads */
    uint32_t n_threads;     /* pool size */
    uint32_t V;             /* vocab (token ids and logits width) */
    uint32_t max_rows, max_tokens; /* step limits */

    uint32_t n_slots;       /* arena slots incl. 0 */
    size_t slot_floats;     /* floats per slot */
    float *arena;           /* n_slots * slot_floats, owned */
    uint32_t *slot_mark;    /* duplicate detection */
    uint32_t mark_gen;      /* current mark value */

    /* the current pass */
    uint32_t cap;           /* tokens per pass */
    uint32_t T;             /* tokens in the pass */
    int32_t *tok;           /* token ids [cap] */
    uint32_t *tseg;         /* segment of each token [cap] */
    be_cpu_seg *segs;       /* [cap] */
    uint32_t n_segs;        /* segments in the pass */
    float **lrows;          /* logits destinations [cap] */
    uint32_t *lpos;         /* pass token index of each logits row [cap] */
    uint32_t n_logits;      /* logits rows in the pass */

    /* the current GEMM region */
    be_cpu_job jobs[BE_CPU_MAX_JOBS];
    uint32_t n_jobs;
    be_cpu_task *tasks;
    uint32_t tasks_cap;
    uint32_t n_tasks;
    uint32_t tok_tasks;     /* tasks of the current token-parallel region */

    be_cpu_pre_step_fn pre_step; /* optional, set by the family after open */
    struct be_kv *kv; /* hybrid models: the family's paged KV pool, set at open; else NULL */
};

/* Runs the network over b->T tokens of the pass (segments, logits rows set). */
typedef void (*be_cpu_pass_fn)(be_cpu_base *b);

/*
 * A pass's part of the CPU backend, what be_cpu.c cannot write once (one
 * today: the layer list of be_cpu_gdn.c, for every view).
 * open() builds the pass's context for the model (its first member the
 * be_cpu_base, set up with be_cpu_base_open; a hybrid's KV pool in
 * be_cpu_base.kv and its page reservation in pre_step) and returns that
 * base in *out; m is borrowed for the context's life. close() frees it
 * (NULL-safe). pass runs the network over a pass (be_cpu_base_step).
 * describe() writes the NUL-terminated "cpu key=value ..." line (len > 0).
 * be_cpu.c does the rest: slots, their images and the KV pages, the step.
 */
typedef struct be_cpu_family {
    const char *const *views; /* wrk_model_view_kind()s it serves, NULL-ended */
    wk_err (*open)(const be_config *cfg, const wrk_model *m, be_cpu_base **out, wk_diag *d);
    void (*close)(be_cpu_base *b);
    be_cpu_pass_fn pass;
    void (*describe)(const be_cpu_base *b, char *buf, size_t len);
} be_cpu_family;

extern const be_cpu_family be_cpu_gdn_family; /* be_cpu_gdn.c: "gdn", "mamba2", "rwkv7" */

/*
 * Sets b up: pool, arena of cfg->n_slots zeroed slots of slot_floats floats,
 * pass buffers (WKVM_CPU_PASS_TOKENS or 256 tokens). Returns WK_EINVAL
 * (fewer than 2 slots), WK_ENOMEM, WK_EDEVICE (threads); b is then ready for
 * be_cpu_base_close either way.
 */
WK_MUST_CHECK wk_err be_cpu_base_open(be_cpu_base *b, const be_config *cfg, const wrk_model *m,
                                      size_t slot_floats, wk_diag *d);
void be_cpu_base_close(be_cpu_base *b);

/* Slot pointer (slot < n_slots, unchecked). */
float *be_cpu_base_slot(const be_cpu_base *b, uint32_t slot);

/* The be_ops slot operations over b (same contracts as be.h). */
wk_err be_cpu_base_slot_reset(be_cpu_base *b, uint32_t slot);
wk_err be_cpu_base_slot_copy(be_cpu_base *b, uint32_t dst, uint32_t src);
wk_err be_cpu_base_slot_read(be_cpu_base *b, uint32_t slot, uint64_t off, void *buf, size_t len);
wk_err be_cpu_base_slot_write(be_cpu_base *b, uint32_t slot, uint64_t off, const void *buf,
                              size_t len);

/*
 * The be_ops step: validates every row (be.h), runs pre_step, zeroes the
 * slots of reset rows (be_row.reset; only once nothing can refuse the
 * step any more), then cuts the rows into passes and calls pass for each.
 * Padding rows get zero logits (a reset on one is ignored).
 */
WK_MUST_CHECK wk_err be_cpu_base_step(be_cpu_base *b, be_row *rows, size_t n, be_cpu_pass_fn pass,
                                      wk_diag *d);

/* The previous token of pass token t within its row, or -1 when t starts its segment. */
static inline int64_t
be_cpu_prev_tok(const be_cpu_base *b, uint32_t t)
{
    return t > b->segs[b->tseg[t]].t0 ? (int64_t)t - 1 : -1;
}

/* Queues y (op)= x W for m rows (ldx = w->k, ldy = w->n unless yrows). */
void be_cpu_job_add(be_cpu_base *b, const be_cpu_mat *w, const float *x, uint32_t m, float *y,
                    float *const *yrows, be_cpu_epi epi);
/* Same with explicit row strides. */
void be_cpu_job_add_ld(be_cpu_base *b, const be_cpu_mat *w, const float *x, size_t ldx,
                       uint32_t m, float *y, size_t ldy, be_cpu_epi epi);
/* Runs the queued GEMMs as one parallel region. */
void be_cpu_jobs_run(be_cpu_base *b);

/* Runs fn over the pass's tokens split in ranges (be_cpu_tok_range gives a task's range). */
void be_cpu_tok_run(be_cpu_base *b, be_cpu_pool_fn fn, void *arg);
void be_cpu_tok_range(const be_cpu_base *b, uint32_t task, uint32_t *t0, uint32_t *t1);

/*
 * The end of a pass that asked for logits: norm (task bodies that take
 * their rows from be_cpu_logits_range) writes the final-normed row of each
 * logits position i (token b->lpos[i]) to xn + i * head->k, then the head
 * GEMM writes each row to b->lrows[i]. No-op without logits rows.
 */
void be_cpu_logits_run(be_cpu_base *b, be_cpu_pool_fn norm, void *arg, const be_cpu_mat *head,
                       const float *xn);
/* Logits rows [*i0, *i1) of task `task` of be_cpu_logits_run's norm region. */
void be_cpu_logits_range(const be_cpu_base *b, uint32_t task, uint32_t *i0, uint32_t *i1);

/*
 * Packs n matrices (src[i] -> dst[i], each its own allocation) on the pool.
 * Returns WK_EINVAL naming the index of a bad source, WK_ENOMEM.
 */
WK_MUST_CHECK wk_err be_cpu_pack_mats(be_cpu_base *b, be_cpu_mat *const *dst,
                                      const wrk_mat *const *src, size_t n, wk_diag *d);
/*
 * The packing half of be_cpu_pack_mats, for matrices the caller already set
 * up with be_cpu_mat_init (dst[i] over src[i], memory the caller's): fills
 * their panels on the pool, 16 panels a task. Returns WK_ENOMEM (nothing
 * packed).
 */
WK_MUST_CHECK wk_err be_cpu_pack_run(be_cpu_base *b, be_cpu_mat *const *dst,
                                     const wrk_mat *const *src, size_t n, wk_diag *d);

/* 64-byte aligned float buffer (n >= 0), free with free(). */
float *be_cpu_alloc_f(size_t n);

/*
 * The gates of the MLPs and mixers, 8 values at a time with one
 * vectorised exp (be_cpu_common.c: within about 1 ulp of expf; the same
 * bits for a value wherever it sits in the array, for every isa):
 *   be_cpu_silu(x, n):          x = x / (1 + exp(-x))
 *   be_cpu_silu_mul(h, u, n):   h = silu(h) * u
 *   be_cpu_mul_silu(o, g, n):   o = o * silu(g)
 *   be_cpu_mul_sigmoid(o, g, n): o = o * (1 / (1 + exp(-g)))
 */
void be_cpu_silu(be_cpu_isa isa, float *x, size_t n);
void be_cpu_silu_mul(be_cpu_isa isa, float *h, const float *u, size_t n);
void be_cpu_mul_silu(be_cpu_isa isa, float *o, const float *g, size_t n);
void be_cpu_mul_sigmoid(be_cpu_isa isa, float *o, const float *g, size_t n);

typedef float be_cpu_v8 __attribute__((vector_size(32)));
typedef int32_t be_cpu_i8 __attribute__((vector_size(32)));

/*
 * *y = exp(*lo) for 8 floats already clamped to [-87.33654, 88.72283] (no
 * NaN): Cody-Waite reduction lo = n ln2 + r (n by the round-to-nearest of
 * adding 1.5 * 2^23), a degree-6 polynomial for exp(r) (Cephes' expf
 * coefficients), times 2^n in two exact halves (n / 2 and the rest, each a
 * normal power of two for n in [-126, 128]): within 1 ulp of expf. In C's
 * vector extensions (multiplies and adds; no contraction, meson.build), so
 * every lane runs the same IEEE operations on every ISA path: the shared
 * core of the gates' exp and the attention's. Callers clamp and fix up the
 * out-of-range lanes themselves.
 */
static inline __attribute__((always_inline)) void
be_cpu_exp_core8(be_cpu_v8 *y, const be_cpu_v8 *lo)
{
    const be_cpu_v8 x = *lo;
    const be_cpu_v8 t = x * 1.44269504088896341f + 12582912.0f;
    const be_cpu_v8 n = t - 12582912.0f;
    be_cpu_v8 r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    be_cpu_v8 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const be_cpu_i8 ni = __builtin_convertvector(n, be_cpu_i8), na = ni >> 1, nb = ni - na;
    const be_cpu_i8 ea = (na + 127) << 23, eb = (nb + 127) << 23;
    be_cpu_v8 fa, fb;
    __builtin_memcpy(&fa, &ea, sizeof(fa));
    __builtin_memcpy(&fb, &eb, sizeof(fb));
    *y = (p * fa) * fb;
}

/*
 * RMSNorm over n values: y = x / sqrt(mean(x^2) + eps) * w (w NULL: no
 * weight). Sum of squares in double, 8 partial sums in a fixed order. y may be x.
 */
void be_cpu_rmsnorm(const float *x, const float *w, uint32_t n, double eps, float *y);

/*
 * LayerNorm over n values: y = (x - mean) / sqrt(var + eps) * w + b.
 * Statistics in double with 8 partial sums in a fixed order (the result
 * depends only on x, never on the batch). y may be x.
 */
void be_cpu_layernorm(const float *x, const float *w, const float *b, uint32_t n, double eps,
                      float *y);

#endif /* BE_CPU_COMMON_H */
