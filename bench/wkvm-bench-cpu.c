/*
 * wkvm-bench-cpu: throughput of the CPU backend next to this machine's
 * roofs, all measured in the same run:
 *   - memory bandwidth: a multi-threaded streaming read (sum) and a STREAM
 *     triad over buffers far larger than the caches;
 *   - sgemm peak: OpenBLAS cblas_sgemm on large square fp32 matrices;
 *   - decode tok/s at each --batches size (one token per row per step) and
 *     prefill tok/s for one --prefill-token prompt;
 *   - with --ctx N1,N2,... (hybrid models: the attention over a long KV
 *     cache) instead of all the above: per context N, the time of a
 *     --prefill-token prefill into a slot already holding N tokens, and of
 *     one decode step after it (bench_ctx).
 * Each model figure is printed as a fraction of its roof:
 *   decode batch 1: BW_read / (streamed weight bytes + 2 * state bytes)
 *   batched decode, prefill: sgemm peak / (matmul FLOP per token)
 * Every figure, the roofs included, is the best of --rounds rounds, so that
 * other work on a shared machine (which only slows a measurement) drops out.
 * Output is a Markdown table (docs/PERFORMANCE.md takes it as is).
 *
 * A benchmark, not a test: it assumes a quiet machine and says so when the
 * load average says otherwise.
 */
#include <cblas.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "be.h"
#include "be_cpu_kernels.h"
#include "wrk_model.h"
#include "wk_cfg_tool.h"
#include "wrk_rwkv7.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

void openblas_set_num_threads(int n);

#define BENCH_MAX_BATCHES 16

/* --cpu-matmul: how the kernel roof and the model pack BF16 matrices */
static be_cpu_matmul bench_matmul = BE_CPU_MATMUL_FP32;

static double
bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void
bench_die(const char *msg, const char *detail)
{
    fprintf(stderr, "wkvm-bench-cpu: %s%s%s\n", msg, detail ? ": " : "", detail ? detail : "");
    exit(1);
}

/* ------------------------------------------------------------------------ */
/* memory bandwidth                                                          */
/* ------------------------------------------------------------------------ */

typedef struct bw_arg {
    float *a, *b, *c; /* arrays */
    size_t n;         /* elements of this thread's part */
    int triad;        /* 0: read (sum), 1: a = b + s * c */
    int streams;      /* read: interleaved streams per thread */
    double sum;       /* result, keeps the read alive */
    pthread_barrier_t *bar; /* start line */
    double t0, t1;    /* this thread's run */
} bw_arg;

/*
 * The read kernel walks its part as `streams` interleaved sequential streams
 * (1 or 8): a GEMV over several weight panels reads several streams at once,
 * and on some cores one stream leaves the prefetchers underused. The roof is
 * the better of the two.
 */
#define BW_STREAMS_MAX 8

#if defined(__x86_64__)
__attribute__((target("avx2"))) static double
bw_read_avx2(const float *p, size_t n, int streams)
{
    const size_t part = n / (size_t)streams / 16 * 16;
    __m256 acc[BW_STREAMS_MAX];
    for (int s = 0; s < BW_STREAMS_MAX; s++)
        acc[s] = _mm256_setzero_ps();
    for (size_t i = 0; i < part; i += 16)
        for (int s = 0; s < streams; s++) {
            const float *q = p + (size_t)s * part + i;
            acc[s] = _mm256_add_ps(acc[s], _mm256_add_ps(_mm256_load_ps(q), _mm256_load_ps(q + 8)));
        }
    float t[8];
    __m256 a = acc[0];
    for (int s = 1; s < BW_STREAMS_MAX; s++)
        a = _mm256_add_ps(a, acc[s]);
    _mm256_storeu_ps(t, a);
    double sum = 0;
    for (int j = 0; j < 8; j++)
        sum += t[j];
    for (size_t i = part * (size_t)streams; i < n; i++)
        sum += p[i];
    return sum;
}
#endif

static double
bw_read(const float *p, size_t n, int streams)
{
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2"))
        return bw_read_avx2(p, n, streams);
#endif
    (void)streams;
    float s[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            s[j] += p[i + j];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static void *
bw_thread(void *vp)
{
    bw_arg *a = vp;
    pthread_barrier_wait(a->bar);
    a->t0 = bench_now();
    if (a->triad) {
        const float s = 3.0f;
        for (size_t i = 0; i < a->n; i++)
            a->a[i] = a->b[i] + s * a->c[i];
    } else {
        a->sum = bw_read(a->a, a->n, a->streams);
    }
    a->t1 = bench_now();
    return NULL;
}

/*
 * Best of reps: bytes moved / wall time, GB/s (1e9). Buffers come from
 * be_cpu_big_alloc, like the backend's packed weights (huge pages).
 */
static double
bench_bw(int threads, int triad, int streams, size_t bytes_per_array, int reps)
{
    size_t n = bytes_per_array / sizeof(float);
    n -= n % ((size_t)threads * 64);
    float *a = be_cpu_big_alloc(n * sizeof(float));
    float *b = triad ? be_cpu_big_alloc(n * sizeof(float)) : NULL;
    float *c = triad ? be_cpu_big_alloc(n * sizeof(float)) : NULL;
    if (a == NULL || (triad && (b == NULL || c == NULL)))
        bench_die("out of memory for the bandwidth buffers", NULL);
    for (size_t i = 0; i < n; i++) {
        a[i] = 1.0f;
        if (triad) {
            b[i] = 2.0f;
            c[i] = 0.5f;
        }
    }
    double best = 0;
    pthread_t th[256];
    bw_arg args[256];
    pthread_barrier_t bar;
    for (int r = 0; r < reps; r++) {
        pthread_barrier_init(&bar, NULL, (unsigned)threads);
        size_t part = n / (size_t)threads;
        for (int t = 0; t < threads; t++) {
            args[t] = (bw_arg){a + part * t, b ? b + part * t : NULL, c ? c + part * t : NULL,
                               part, triad, streams, 0, &bar, 0, 0};
            if (pthread_create(&th[t], NULL, bw_thread, &args[t]) != 0)
                bench_die("pthread_create failed", NULL);
        }
        double t0 = 1e300, t1 = 0;
        for (int t = 0; t < threads; t++) {
            pthread_join(th[t], NULL);
            if (args[t].t0 < t0)
                t0 = args[t].t0;
            if (args[t].t1 > t1)
                t1 = args[t].t1;
        }
        pthread_barrier_destroy(&bar);
        double moved = (double)n * sizeof(float) * (triad ? 3.0 : 1.0);
        double gbs = moved / (t1 - t0) / 1e9;
        if (gbs > best)
            best = gbs;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

/* ------------------------------------------------------------------------ */
/* sgemm peak                                                                */
/* ------------------------------------------------------------------------ */

static double
bench_sgemm(int threads, int n, int reps)
{
    openblas_set_num_threads(threads);
    float *a = aligned_alloc(64, (size_t)n * n * sizeof(float));
    float *b = aligned_alloc(64, (size_t)n * n * sizeof(float));
    float *c = aligned_alloc(64, (size_t)n * n * sizeof(float));
    if (a == NULL || b == NULL || c == NULL)
        bench_die("out of memory for sgemm", NULL);
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
        c[i] = 0;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                n); /* warm-up */
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f,
                    c, n);
        double g = 2.0 * n * (double)n * n / (bench_now() - t0) / 1e9;
        if (g > best)
            best = g;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

/* ------------------------------------------------------------------------ */
/* the backend's own GEMM kernel alone                                       */
/* ------------------------------------------------------------------------ */

typedef struct kern_job {
    be_cpu_isa isa;       /* kernel path */
    const be_cpu_mat *w;  /* packed weights */
    const float *x;       /* input rows */
    float *y;             /* output rows */
    uint32_t m;           /* rows */
    uint32_t per;         /* panels per task */
} kern_job;

static void
kern_task(void *arg, uint32_t t)
{
    kern_job *j = arg;
    uint32_t p0 = t * j->per, p1 = p0 + j->per;
    be_cpu_gemm(j->isa, j->w, j->x, j->w->k, j->m, j->y, j->w->n, NULL, p0, p1,
                BE_CPU_EPI_STORE);
}

/* GFLOP/s of be_cpu_gemm on bf16 weights [K -> N] for M rows, threads as the backend. */
static double
bench_kernel(int threads, uint32_t M, uint32_t K, uint32_t N)
{
    uint16_t *wd = malloc((size_t)K * N * 2);
    float *x = malloc((size_t)M * K * sizeof(float));
    float *y = malloc((size_t)M * N * sizeof(float));
    if (wd == NULL || x == NULL || y == NULL)
        bench_die("out of memory", NULL);
    for (size_t i = 0; i < (size_t)K * N; i++)
        wd[i] = wk_f32_to_bf16((float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f);
    for (size_t i = 0; i < (size_t)M * K; i++)
        x[i] = (float)(i % 13) * 0.01f;
    wk_tensor t = {.name = "w", .dtype = WK_DTYPE_BF16, .ndim = 2, .shape = {N, K},
                   .data = wd, .nbytes = (size_t)K * N * 2};
    wrk_mat wm = {&t, K, N, false};
    be_cpu_mat pm;
    be_cpu_pool *pool = NULL;
    if (be_cpu_mat_alloc_as(&pm, &wm, bench_matmul) != WK_OK || be_cpu_pool_new((uint32_t)threads, &pool) != WK_OK)
        bench_die("kernel bench setup failed", NULL);
    be_cpu_mat_pack_panels(&pm, &wm, 0, pm.n_panels);
    kern_job j = {be_cpu_isa_detect(), &pm, x, y, M, 0};
    uint32_t ntask = 4 * (uint32_t)threads;
    j.per = (pm.n_panels + ntask - 1) / ntask;
    ntask = (pm.n_panels + j.per - 1) / j.per;
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = bench_now();
        int reps = 0;
        do {
            be_cpu_pool_run(pool, kern_task, &j, ntask);
            reps++;
        } while (bench_now() - t0 < 0.2);
        double g = 2.0 * M * (double)K * N * reps / (bench_now() - t0) / 1e9;
        if (g > best)
            best = g;
    }
    be_cpu_pool_free(pool);
    be_cpu_mat_free(&pm);
    free(wd);
    free(x);
    free(y);
    return best;
}

/* ------------------------------------------------------------------------ */
/* model                                                                     */
/* ------------------------------------------------------------------------ */

static uint64_t
mat_elems(const wrk_mat *m)
{
    return m->t != NULL ? (uint64_t)m->n_in * m->n_out : 0;
}

static uint64_t
mat_bytes(const wrk_mat *m)
{
    return m->t != NULL ? m->t->nbytes : 0;
}

typedef struct model_cost {
    uint64_t layer_params; /* matmul weights in the layers */
    uint64_t head_params;  /* head */
    uint64_t stream_bytes; /* weight bytes a decode step reads (layers + head) */
} model_cost;

static model_cost
bench_cost(const wrk_rwkv7 *rw)
{
    model_cost mc = {0, 0, 0};
    for (uint32_t l = 0; l < rw->n_layer; l++) {
        const wrk_rwkv7_layer *s = &rw->layers[l];
        const wrk_mat *ms[] = {&s->wr, &s->wk, &s->wv, &s->wo, &s->w1, &s->w2, &s->a1,
                               &s->a2, &s->v1, &s->v2, &s->g1, &s->g2, &s->ffn_key,
                               &s->ffn_value};
        for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++) {
            mc.layer_params += mat_elems(ms[i]);
            mc.stream_bytes += mat_bytes(ms[i]);
        }
    }
    mc.head_params = mat_elems(&rw->head);
    mc.stream_bytes += mat_bytes(&rw->head);
    return mc;
}

static void
bench_step(const be_ops *ops, be_ctx *ctx, be_row *rows, size_t n)
{
    wk_diag d = {{0}};
    wk_err e = ops->step(ctx, rows, n, &d);
    if (e != WK_OK)
        bench_die("step failed", d.msg);
}

/*
 * Decode tok/s at batch B: after 2 warm-up steps, 6 windows of at least 3
 * steps and total_s / 6 seconds each; the best window counts (a shared
 * machine only ever makes a window slower).
 */
static double
bench_decode(const be_ops *ops, be_ctx *ctx, uint32_t B, uint32_t V, double total_s)
{
    be_row *rows = calloc(B, sizeof(*rows));
    int32_t *tok = calloc(B, sizeof(*tok));
    float *logits = malloc((size_t)B * V * sizeof(float));
    if (rows == NULL || tok == NULL || logits == NULL)
        bench_die("out of memory", NULL);
    for (uint32_t b = 0; b < B; b++) {
        if (ops->slot_reset(ctx, b + 1) != WK_OK)
            bench_die("slot reset failed", NULL);
        tok[b] = (int32_t)((b * 104729u + 11u) % V);
    }
    double best = 0;
    for (int w = -1; w < 6; w++) { /* window -1: warm-up */
        double t = 0;
        long steps = 0;
        while (w < 0 ? steps < 2 : (steps < 3 || t < total_s / 6)) {
            for (uint32_t b = 0; b < B; b++)
                rows[b] = (be_row){.slot = b + 1, .tokens = &tok[b], .n_tokens = 1,
                                   .logits_mode = BE_LOGITS_LAST,
                                   .logits = logits + (size_t)b * V};
            double t0 = bench_now();
            bench_step(ops, ctx, rows, B);
            t += bench_now() - t0;
            steps++;
            for (uint32_t b = 0; b < B; b++) /* next token: cheap, not argmax */
                tok[b] = (int32_t)(((uint32_t)tok[b] * 31u + 7u + b) % V);
        }
        double v = (double)B * (double)steps / t;
        if (w >= 0 && v > best)
            best = v;
    }
    free(rows);
    free(tok);
    free(logits);
    return best;
}

/*
 * Q8_0 against the same model's stored weights, in one process: both
 * models open side by side (two backend contexts, each its own threads, one
 * running at a time), then `pairs` pairs of decode batch 1 windows of
 * `window_s` seconds, the order alternating (ABBA) so that a drift in the
 * machine's speed (other tenants) falls on both sides alike. Each pair gives
 * one ratio; the median of the ratios is the figure, printed with the range
 * and each side's median tok/s.
 */
static int
bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double
bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void
bench_pair(const char *model, int threads, int pairs, double window_s, int fp32)
{
    wk_diag d = {{0}};
    wrk_model *m[2] = {NULL, NULL};
    be_ctx *ctx[2] = {NULL, NULL};
    const be_ops *ops = &be_cpu_ops;
    char desc[2][256] = {"", ""};
    for (int i = 0; i < 2; i++) {
        wrk_model_opts mo = {.fp32 = fp32 != 0, .quantize_q8_0 = i == 1};
        if (wrk_model_load(model, &mo, &m[i], &d) != WK_OK)
            bench_die("load failed", d.msg);
        be_config bc = {.n_slots = 2, .n_threads = (uint32_t)threads, .max_step_rows = 1,
                        .max_step_tokens = 0};
        if (ops->open(&bc, m[i], &ctx[i], &d) != WK_OK)
            bench_die("open failed", d.msg);
        ops->describe(ctx[i], desc[i], sizeof(desc[i]));
    }
    const wrk_model_info *in = wrk_model_info_get(m[0]);
    double *tps[2], *ratio;
    tps[0] = calloc((size_t)pairs, sizeof(double));
    tps[1] = calloc((size_t)pairs, sizeof(double));
    ratio = calloc((size_t)pairs, sizeof(double));
    if (tps[0] == NULL || tps[1] == NULL || ratio == NULL)
        bench_die("out of memory", NULL);
    for (int i = 0; i < 2; i++) /* warm-up: page in, caches, pools */
        (void)bench_decode(ops, ctx[i], 1, in->vocab_size, window_s);
    for (int p = 0; p < pairs; p++) {
        for (int s = 0; s < 2; s++) {
            const int i = (p % 2) ^ s; /* ABBA */
            /* bench_decode's best of 6 sub-windows of window_s / 6 */
            tps[i][p] = bench_decode(ops, ctx[i], 1, in->vocab_size, window_s);
        }
        ratio[p] = tps[1][p] / tps[0][p];
        fprintf(stderr, "wkvm-bench-cpu: pair %d/%d: %s %.1f, Q8_0 %.1f tok/s, %.3fx\n", p + 1,
                pairs, wk_dtype_name(in->dtype), tps[0][p], tps[1][p], ratio[p]);
    }
    printf("model: %s, L%u C%u H%u N%u F%u V%u, %s\n", in->name, in->n_layer, in->n_embd,
           in->n_head, in->head_size, in->ffn_dim, in->vocab_size, wk_dtype_name(in->dtype));
    printf("backends: %s | %s\n", desc[0], desc[1]);
    printf("%d pairs of decode batch 1 windows (%.2f s each, order alternating), one process\n\n",
           pairs, window_s);
    const double rmed = bench_median(ratio, pairs), rmin = ratio[0], rmax = ratio[pairs - 1];
    printf("| decode batch 1 | %s tok/s (median) | Q8_0 tok/s (median) | Q8_0 / %s per pair: "
           "median | min | max |\n",
           wk_dtype_name(in->dtype), wk_dtype_name(in->dtype));
    printf("|---|---:|---:|---:|---:|---:|\n");
    const double m0 = bench_median(tps[0], pairs), m1 = bench_median(tps[1], pairs);
    printf("| %d threads | %.1f | %.1f | %.3fx | %.3fx | %.3fx |\n", threads, m0, m1, rmed, rmin,
           rmax);
    free(tps[0]);
    free(tps[1]);
    free(ratio);
    for (int i = 0; i < 2; i++) {
        ops->close(ctx[i]);
        wrk_model_free(m[i]);
    }
}

static double
bench_prefill(const be_ops *ops, be_ctx *ctx, uint32_t T, uint32_t V, int reps)
{
    int32_t *tok = malloc(T * sizeof(*tok));
    float *logits = malloc((size_t)V * sizeof(float));
    if (tok == NULL || logits == NULL)
        bench_die("out of memory", NULL);
    for (uint32_t i = 0; i < T; i++)
        tok[i] = (int32_t)((i * 7919u + 13u) % V);
    double best = 0;
    for (int r = 0; r < reps + 1; r++) {
        if (ops->slot_reset(ctx, 1) != WK_OK)
            bench_die("slot reset failed", NULL);
        be_row row = {.slot = 1, .tokens = tok, .n_tokens = T, .logits_mode = BE_LOGITS_LAST,
                      .logits = logits};
        double t0 = bench_now();
        bench_step(ops, ctx, &row, 1);
        double v = T / (bench_now() - t0);
        if (r > 0 && v > best) /* the first run warms up */
            best = v;
    }
    free(tok);
    free(logits);
    return best;
}

/*
 * Prefill and decode against a long context: per N, per round, slot 1 is
 * reset and filled with N tokens (untimed, 256-token steps), then a T-token
 * step is timed, then 4 one-token decode steps; the best round of each
 * counts. Prints a Markdown table.
 */
static void
bench_ctx(const be_ops *ops, be_ctx *ctx, const uint32_t *ns, int n_ns, uint32_t T, uint32_t V,
          int rounds)
{
    uint32_t maxn = T;
    for (int i = 0; i < n_ns; i++)
        maxn = ns[i] > maxn ? ns[i] : maxn;
    int32_t *tok = malloc((size_t)maxn * sizeof(*tok));
    float *logits = malloc((size_t)V * sizeof(float));
    if (tok == NULL || logits == NULL)
        bench_die("out of memory", NULL);
    for (uint32_t i = 0; i < maxn; i++)
        tok[i] = (int32_t)((i * 7919u + 13u) % V);
    printf("| context N | prefill %u tokens at N: ms | tok/s | decode at N + %u: ms/token |\n", T,
           T);
    printf("|---:|---:|---:|---:|\n");
    for (int i = 0; i < n_ns; i++) {
        double best_p = 1e30, best_d = 1e30;
        for (int r = 0; r < rounds; r++) {
            if (ops->slot_reset(ctx, 1) != WK_OK)
                bench_die("slot reset failed", NULL);
            for (uint32_t off = 0; off < ns[i]; off += 256) {
                uint32_t n = ns[i] - off < 256 ? ns[i] - off : 256;
                be_row row = {.slot = 1, .tokens = tok + off, .n_tokens = n,
                              .logits_mode = BE_LOGITS_NONE};
                bench_step(ops, ctx, &row, 1);
            }
            be_row row = {.slot = 1, .tokens = tok, .n_tokens = T,
                          .logits_mode = BE_LOGITS_LAST, .logits = logits};
            double t0 = bench_now();
            bench_step(ops, ctx, &row, 1);
            double v = bench_now() - t0;
            best_p = v < best_p ? v : best_p;
            t0 = bench_now();
            for (int s = 0; s < 4; s++) {
                row = (be_row){.slot = 1, .tokens = tok + s, .n_tokens = 1,
                               .logits_mode = BE_LOGITS_LAST, .logits = logits};
                bench_step(ops, ctx, &row, 1);
            }
            v = (bench_now() - t0) / 4;
            best_d = v < best_d ? v : best_d;
        }
        printf("| %u | %.1f | %.1f | %.2f |\n", ns[i], best_p * 1e3, T / best_p, best_d * 1e3);
        fflush(stdout);
    }
    free(tok);
    free(logits);
}

/* The command line as wk_cfg fills it. */
typedef struct bench_args {
    const char *model, *batches, *seconds, *quantize, *pair, *ctx, *cpu_matmul;
    uint32_t threads, prefill, bw_mib, sgemm_n, rounds, pairs;
    bool fp32;
} bench_args;

/* The option table: --help prints it (wk_cfg_tool). */
static const wk_cfg_opt bench_table[] = {
    {"model", WK_CFG_STR, NULL, 0, 0, "model directory or checkpoint file; required"},
    {"threads", WK_CFG_U64, "0", 0, 4096, "CPU threads, 0 = all cores"},
    {"batches", WK_CFG_STR, "1,8,32,64", 0, 0, "decode batch sizes, comma separated (1..1024)"},
    {"prefill", WK_CFG_U64, "512", 1, 1u << 20, "prompt tokens T"},
    {"seconds", WK_CFG_STR, NULL, 0, 0,
     "S: decode time per batch size per round (default 1.5); with --pair the window length "
     "(default 0.6)"},
    {"bw-mib", WK_CFG_U64, "1024", 16, 1u << 20, "MiB streamed by the memory-bandwidth roof"},
    {"sgemm-n", WK_CFG_U64, "3072", 256, 65536, "size of the OpenBLAS sgemm roof"},
    {"rounds", WK_CFG_U64, "3", 1, 100, "every figure is the best of R rounds"},
    {"fp32", WK_CFG_BOOL, NULL, 0, 0, "convert the weights to fp32 at load"},
    {"quantize", WK_CFG_STR, "none", 0, 0, "none or q8_0: quantize the matrices at load"},
    {"cpu-matmul", WK_CFG_STR, "fp32", 0, 0,
     "fp32 or bf16: BF16-weight products with fp32 activations (FMA chains) or with "
     "activations rounded to bf16 on AMX tiles, else AVX512-BF16 dot products (a CPU with "
     "AMX-BF16 or AVX512_BF16; the backend line says which: matmul=)"},
    {"pair", WK_CFG_STR, NULL, 0, 0,
     "q8_0: decode batch 1 of the stored weights and of Q8_0 in one process, --pairs pairs of "
     "alternating --seconds windows, the median of the per-pair ratios"},
    {"pairs", WK_CFG_U64, "20", 1, 1000, "with --pair: pairs P"},
    {"ctx", WK_CFG_STR, NULL, 0, 0,
     "N1,N2,... (hybrid models): a T-token prefill into a slot already holding N tokens, and a "
     "decode step after it, per N (best of R rounds)"},
};

#define BENCH_BIND(opt, type, field) WK_CFG_BIND(bench_args, opt, type, field)
static const wk_cfg_bind bench_binds[] = {
    BENCH_BIND("model", STR, model),     BENCH_BIND("threads", U32, threads),
    BENCH_BIND("batches", STR, batches), BENCH_BIND("prefill", U32, prefill),
    BENCH_BIND("seconds", STR, seconds), BENCH_BIND("bw-mib", U32, bw_mib),
    BENCH_BIND("sgemm-n", U32, sgemm_n), BENCH_BIND("rounds", U32, rounds),
    BENCH_BIND("fp32", BOOL, fp32),      BENCH_BIND("quantize", STR, quantize),
    BENCH_BIND("pair", STR, pair),       BENCH_BIND("pairs", U32, pairs),
    BENCH_BIND("ctx", STR, ctx),         BENCH_BIND("cpu-matmul", STR, cpu_matmul),
};

static const wk_cfg_tool bench_tool = {
    .prog = "wkvm-bench-cpu",
    .about = "CPU backend decode and prefill against the machine's roofs (memory bandwidth,\n"
             "OpenBLAS sgemm). Three modes: the batch table (default), --ctx, --pair q8_0.",
    .opts = bench_table,
    .n_opts = sizeof(bench_table) / sizeof(bench_table[0]),
    .binds = bench_binds,
    .n_binds = sizeof(bench_binds) / sizeof(bench_binds[0]),
};

/* Parses "N1,N2,..." (each lo..hi) into v (at most BENCH_MAX_BATCHES); the count. */
static int
bench_list(const char *flag, const char *s, int lo, int hi, uint32_t *v)
{
    int n = 0;
    char *save = NULL, *dup = strdup(s);
    if (dup == NULL)
        bench_die("out of memory", NULL);
    for (char *p = strtok_r(dup, ",", &save); p && n < BENCH_MAX_BATCHES;
         p = strtok_r(NULL, ",", &save)) {
        int x = atoi(p);
        if (x < lo || x > hi) {
            fprintf(stderr, "wkvm-bench-cpu: %s: each value must be %d..%d (%s)\n", flag, lo,
                    hi, p);
            exit(2);
        }
        v[n++] = (uint32_t)x;
    }
    free(dup);
    return n;
}

int
main(int argc, char **argv)
{
    bench_args a = {0};
    wk_cfg *cfg = NULL;
    int prc = wk_cfg_tool_parse(&bench_tool, argc, argv, &a, &cfg);
    if (prc != WK_CFG_TOOL_RUN)
        return prc;
    const char *model = a.model;
    int threads = (int)a.threads, prefill = (int)a.prefill, bw_mib = (int)a.bw_mib;
    int sgemm_n = (int)a.sgemm_n, fp32 = a.fp32, q8_0 = 0;
    int rounds = (int)a.rounds, pair = 0, pairs = (int)a.pairs;
    double seconds = 1.5, pair_s = 0.6;
    if (a.seconds != NULL) {
        char *end = NULL;
        seconds = pair_s = strtod(a.seconds, &end);
        if (end == a.seconds || *end != '\0' || !(seconds > 0) || seconds > 3600) {
            fprintf(stderr, "wkvm-bench-cpu: --seconds: '%s' is not a number in (0, 3600]\n",
                    a.seconds);
            return 2;
        }
    }
    if (strcmp(a.quantize, "q8_0") != 0 && strcmp(a.quantize, "none") != 0) {
        fprintf(stderr, "wkvm-bench-cpu: --quantize %s: none or q8_0\n", a.quantize);
        return 2;
    }
    q8_0 = strcmp(a.quantize, "q8_0") == 0;
    if (strcmp(a.cpu_matmul, "fp32") != 0 && strcmp(a.cpu_matmul, "bf16") != 0) {
        fprintf(stderr, "wkvm-bench-cpu: --cpu-matmul %s: fp32 or bf16\n", a.cpu_matmul);
        return 2;
    }
    bench_matmul = strcmp(a.cpu_matmul, "bf16") == 0 ? be_cpu_bf16_engine() : BE_CPU_MATMUL_FP32;
    if (strcmp(a.cpu_matmul, "bf16") == 0 && bench_matmul == BE_CPU_MATMUL_FP32) {
        fprintf(stderr, "wkvm-bench-cpu: --cpu-matmul bf16 needs AMX-BF16 or AVX512_BF16, "
                        "neither here\n");
        return 2;
    }
    if (a.pair != NULL) {
        if (strcmp(a.pair, "q8_0") != 0) {
            fprintf(stderr, "wkvm-bench-cpu: --pair %s: only q8_0\n", a.pair);
            return 2;
        }
        pair = 1;
    }
    uint32_t batches[BENCH_MAX_BATCHES];
    int n_batches = bench_list("--batches", a.batches, 1, 1024, batches);
    uint32_t ctxs[BENCH_MAX_BATCHES];
    int n_ctxs = a.ctx != NULL ? bench_list("--ctx", a.ctx, 1, 1 << 20, ctxs) : 0;
    if (model == NULL || n_batches == 0) {
        fprintf(stderr, "wkvm-bench-cpu: %s (see --help)\n",
                model == NULL ? "--model DIR is required" : "--batches: no batch size");
        return 2;
    }
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    double load = 0;
    if (getloadavg(&load, 1) == 1 && load > 0.5)
        printf("> note: load average %.2f at start; figures are lower on a busy machine\n\n",
               load);
    if (pair) {
        bench_pair(model, threads, pairs, pair_s, fp32);
        wk_cfg_free(cfg);
        return 0;
    }

    /* model */
    wk_diag d = {{0}};
    wrk_model_opts mo = {.fp32 = fp32 != 0, .quantize_q8_0 = q8_0 != 0,
                         .matmul_bf16 = bench_matmul != BE_CPU_MATMUL_FP32,
                         .matmul_dp = bench_matmul == BE_CPU_MATMUL_BF16_DP};
    wrk_model *m = NULL;
    if (wrk_model_load(model, &mo, &m, &d) != WK_OK)
        bench_die("load failed", d.msg);
    const wrk_model_info *in = wrk_model_info_get(m);
    const wrk_rwkv7 *rw = wrk_model_rwkv7(m);
    model_cost mc;
    if (rw != NULL) {
        mc = bench_cost(rw);
    } else {
        /*
         * Other families: every weight byte is streamed per decode step and
         * the head is the V x C matrix (exact for a tied head, as the bench
         * models of bench/bench_families.sh have; an untied model's
         * embedding table is counted as if streamed too).
         */
        mc.head_params = (uint64_t)in->vocab_size * in->n_embd;
        mc.layer_params = in->n_params > mc.head_params ? in->n_params - mc.head_params : 0;
        mc.stream_bytes = in->weight_bytes;
    }
    uint32_t maxb = 1;
    for (int i = 0; i < n_batches; i++)
        if (batches[i] > maxb)
            maxb = batches[i];
    be_config bc = {.n_slots = maxb + 1, .n_threads = (uint32_t)threads,
                    .max_step_rows = maxb, .max_step_tokens = 0};
    if (n_ctxs > 0) { /* slot 1 holds the longest context plus the timed steps */
        uint32_t maxc = 0;
        for (int i = 0; i < n_ctxs; i++)
            maxc = ctxs[i] > maxc ? ctxs[i] : maxc;
        bc.kv_pages = (uint32_t)(((uint64_t)maxc + (uint64_t)prefill + 64) / 16 + 1 + 128 * maxb);
    }
    const be_ops *ops = &be_cpu_ops;
    be_ctx *ctx = NULL;
    if (ops->open(&bc, m, &ctx, &d) != WK_OK)
        bench_die("open failed", d.msg);
    char desc[256] = "";
    ops->describe(ctx, desc, sizeof(desc));
    if (n_ctxs > 0) {
        printf("model: %s, L%u C%u, %s; backend: %s; %d threads\n\n", in->name, in->n_layer,
               in->n_embd, wk_dtype_name(in->dtype), desc, threads);
        bench_ctx(ops, ctx, ctxs, n_ctxs, (uint32_t)prefill, in->vocab_size, rounds);
        ops->close(ctx);
        wrk_model_free(m);
        wk_cfg_free(cfg);
        return 0;
    }

    /*
     * Rounds: every figure (roofs included) is measured once per round and
     * the best round counts, so that other work on a shared machine, which
     * only ever slows a measurement, drops out.
     */
    double bw_read = 0, bw_triad = 0, peak = 0, kern = 0, pv = 0;
    double dec[BENCH_MAX_BATCHES] = {0};
    for (int r = 0; r < rounds; r++) {
        double v;
        if ((v = bench_bw(threads, 0, 1, (size_t)bw_mib << 20, 4)) > bw_read)
            bw_read = v;
        if ((v = bench_bw(threads, 0, BW_STREAMS_MAX, (size_t)bw_mib << 20, 4)) > bw_read)
            bw_read = v;
        if ((v = bench_bw(threads, 1, 1, ((size_t)bw_mib << 20) / 2, 4)) > bw_triad)
            bw_triad = v;
        if ((v = bench_sgemm(threads, sgemm_n, 3)) > peak)
            peak = v;
        if ((v = bench_kernel(threads, 256, 768, 3072)) > kern)
            kern = v;
        for (int i = 0; i < n_batches; i++)
            if ((v = bench_decode(ops, ctx, batches[i], in->vocab_size, seconds)) > dec[i])
                dec[i] = v;
        if ((v = bench_prefill(ops, ctx, (uint32_t)prefill, in->vocab_size, 2)) > pv)
            pv = v;
        fprintf(stderr, "wkvm-bench-cpu: round %d/%d done\n", r + 1, rounds);
    }

    printf("model: %s, L%u C%u H%u N%u F%u V%u, %s, %.1f M params (%.1f M in layer "
           "matmuls, %.1f M head)\n",
           in->name, in->n_layer, in->n_embd, in->n_head, in->head_size, in->ffn_dim,
           in->vocab_size, wk_dtype_name(in->dtype), in->n_params / 1e6, mc.layer_params / 1e6,
           mc.head_params / 1e6);
    printf("backend: %s\n", desc);
    printf("best of %d rounds\n", rounds);
    printf("roofs: read bandwidth %.1f GB/s, triad %.1f GB/s, OpenBLAS sgemm %.1f GFLOP/s "
           "(n=%d, %d threads)\n",
           bw_read, bw_triad, peak, sgemm_n, threads);
    const double dec_bytes = (double)mc.stream_bytes + 2.0 * (double)in->state_bytes;
    printf("own bf16 GEMM kernel alone (%s, M=256, K=768, N=3072, %d threads): %.1f GFLOP/s = "
           "%.0f%% of sgemm peak\n",
           be_cpu_matmul_name(bench_matmul),
           threads, kern, 100.0 * kern / peak);
    printf("decode step streams %.1f MB of weights + 2 x %.2f MB state; matmul FLOP per "
           "token: decode %.1f M, prefill %.1f M\n\n",
           mc.stream_bytes / 1e6, in->state_bytes / 1e6,
           2.0 * (mc.layer_params + mc.head_params) / 1e6, 2.0 * mc.layer_params / 1e6);

    printf("| workload | tok/s | roof tok/s | fraction of roof | roof |\n");
    printf("|---|---:|---:|---:|---|\n");
    for (int i = 0; i < n_batches; i++) {
        uint32_t B = batches[i];
        double v = dec[i];
        double flop = 2.0 * (double)(mc.layer_params + mc.head_params);
        /* weights once per step, every row's state read and written */
        double step_bytes = (double)mc.stream_bytes + 2.0 * B * (double)in->state_bytes;
        double roof_bw = bw_read * 1e9 / step_bytes * B;
        double roof_fl = peak * 1e9 / flop;
        if (B == 1)
            printf("| decode batch 1 | %.1f | %.1f | %.0f%% | bandwidth: %.1f GB/s / %.1f MB "
                   "per step |\n",
                   v, roof_bw, 100.0 * v / roof_bw, bw_read, dec_bytes / 1e6);
        else {
            double roof = roof_bw < roof_fl ? roof_bw : roof_fl;
            printf("| decode batch %u | %.1f | %.1f | %.0f%% | %s (sgemm %.0f%%; bandwidth over "
                   "%.1f MB per step %.0f%%) |\n",
                   B, v, roof, 100.0 * v / roof, roof_bw < roof_fl ? "bandwidth" : "sgemm peak",
                   100.0 * v / roof_fl, step_bytes / 1e6, 100.0 * v / roof_bw);
        }
    }
    double proof = peak * 1e9 / (2.0 * (double)mc.layer_params);
    printf("| prefill %d tokens | %.1f | %.1f | %.0f%% | sgemm peak |\n", prefill, pv, proof,
           100.0 * pv / proof);
    ops->close(ctx);
    wrk_model_free(m);
    wk_cfg_free(cfg);
    return 0;
}
