/*
 * GPU suite: the CUDA RWKV-7 step against the CPU reference backend on small
 * synthetic models (tests/unit/rwkv7_synth.h): BF16, F16 and F32 weights,
 * both checkpoint conventions, head sizes on the register WKV kernel (16,
 * 32, 64, 128) and on the generic one (24). For each model:
 *   - one mixed step (a prefill with every position's logits, a one-token
 *     row, a padding row, a long prefill) gives the CPU's logits and slot
 *     states within max|diff|/std < 1e-3; padding logits are zeros;
 *   - the long prompt prefilled in chunks of 7 and token by token ends at
 *     the same logits and state (not bit-exact on this backend: cuBLAS picks
 *     algorithms by shape; see be_cuda_gdn.c);
 *   - batched decode steps follow the CPU;
 *   - small passes (WKVM_CUDA_PASS_TOKENS=5) give the same results;
 *   - the same step twice on fresh slots gives identical bits;
 *   - a CPU slot image written into a CUDA slot continues identically
 *     (the layout is shared: hibernate on one backend, resume on another);
 *   - refused steps (duplicate slot, token outside the vocab, too many rows
 *     or tokens) change no slot;
 *   - a reset row (be_row.reset) on a used slot runs as on a fresh one, and
 *     a refused step resets nothing;
 *   - a CUDA error the backend handled (out of device memory) does not
 *     fail the next step.
 * Then one model on the last device when there are several (ordinals other
 * than 0). Exits 77 (meson's skip) only without a CUDA device
 * (tests/gpu/gpu_gate.h); a device that does not answer is a failure.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../unit/rwkv7_synth.h"
#include "be.h"
#include "gpu_gate.h"
#include "wrk_model.h"

#define TOL 1e-3  /* max|diff| / std(reference), as the parity test */
#define N_SLOTS 8 /* arena slots incl. 0 */
#define LONG 40   /* tokens of the long prompt */

static int g_fail;
static int g_checks;
static int g_device; /* the CUDA ordinal the contexts open on */

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        g_checks++;                                                                                \
        if (!(cond)) {                                                                             \
            g_fail++;                                                                              \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

typedef struct model_case {
    const char *name; /* label */
    synth_cfg cfg;    /* synthetic model */
} model_case;

typedef struct pair {
    const be_ops *cpu, *cu; /* backends */
    be_ctx *a, *b;          /* CPU and CUDA contexts */
    uint32_t V;             /* vocab */
    uint64_t sb;            /* slot bytes */
} pair;

/* max|got - ref| / std(ref) over n values. */
static double
rel_diff(const float *ref, const float *got, size_t n)
{
    double mean = 0.0, var = 0.0, mx = 0.0;
    for (size_t i = 0; i < n; i++)
        mean += ref[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; i++)
        var += (ref[i] - mean) * (ref[i] - mean);
    const double sd = sqrt(var / (double)n);
    for (size_t i = 0; i < n; i++) {
        const double dd = fabs((double)got[i] - (double)ref[i]);
        if (!(dd <= mx)) /* NaN counts as a failure */
            mx = isnan(dd) ? INFINITY : dd;
    }
    return sd > 0.0 ? mx / sd : mx;
}

static int32_t
tok_at(uint32_t V, uint32_t seed, uint32_t i)
{
    return (int32_t)((seed * 7919u + i * 104729u + 3u) % V);
}

static wk_err
step(const be_ops *ops, be_ctx *ctx, be_row *rows, size_t n, const char *what)
{
    wk_diag d = {{0}};
    wk_err e = ops->step(ctx, rows, n, &d);
    CHECK(e == WK_OK, "%s: %s step: %s: %s", what, ops->name, wk_err_name(e), d.msg);
    return e;
}

static float *
slot_get(const be_ops *ops, be_ctx *ctx, uint32_t slot, uint64_t sb)
{
    float *s = malloc(sb);
    if (s != NULL && ops->slot_read(ctx, slot, 0, s, sb) != WK_OK) {
        free(s);
        return NULL;
    }
    return s;
}

/* Slot states of the two backends agree (relative to the CPU state's spread). */
static void
check_states(pair *p, uint32_t slot_a, uint32_t slot_b, const char *what)
{
    float *sa = slot_get(p->cpu, p->a, slot_a, p->sb);
    float *sb = slot_get(p->cu, p->b, slot_b, p->sb);
    CHECK(sa != NULL && sb != NULL, "%s: slot read", what);
    if (sa != NULL && sb != NULL) {
        double r = rel_diff(sa, sb, p->sb / 4);
        CHECK(r < TOL, "%s: state cpu slot %u vs cuda slot %u: max|d|/std %.3e", what, slot_a,
              slot_b, r);
    }
    free(sa);
    free(sb);
}

/* The mixed step on both backends: slots 1..3 plus a padding row. */
static void
mixed_step(pair *p, be_ctx *cu_ctx, float *out_cu[4], float *out_cpu[4], bool run_cpu,
           const char *what)
{
    const uint32_t V = p->V;
    static int32_t t1[13], t2[1], t0[2], t3[LONG];
    for (uint32_t i = 0; i < 13; i++)
        t1[i] = tok_at(V, 1, i);
    t2[0] = tok_at(V, 2, 0);
    t0[0] = 1;
    t0[1] = 2;
    for (uint32_t i = 0; i < LONG; i++)
        t3[i] = tok_at(V, 3, i);
    const size_t sizes[4] = {13, 1, 2, 1}; /* logits rows per output */
    for (int pass = run_cpu ? 0 : 1; pass < 2; pass++) {
        float **out = pass == 0 ? out_cpu : out_cu;
        for (int i = 0; i < 4; i++) {
            free(out[i]);
            out[i] = malloc(sizeof(float) * V * sizes[i]);
            for (size_t j = 0; j < V * sizes[i]; j++)
                out[i][j] = 12345.0f; /* must be overwritten */
        }
        be_row rows[4] = {
            {.slot = 1,
             .tokens = t1,
             .n_tokens = 13,
             .logits_mode = BE_LOGITS_ALL,
             .logits = out[0]},
            {.slot = 2,
             .tokens = t2,
             .n_tokens = 1,
             .logits_mode = BE_LOGITS_LAST,
             .logits = out[1]},
            {.slot = 0,
             .tokens = t0,
             .n_tokens = 2,
             .logits_mode = BE_LOGITS_ALL,
             .logits = out[2]},
            {.slot = 3,
             .tokens = t3,
             .n_tokens = LONG,
             .logits_mode = BE_LOGITS_LAST,
             .logits = out[3]},
        };
        if (pass == 0)
            step(p->cpu, p->a, rows, 4, what);
        else
            step(p->cu, cu_ctx, rows, 4, what);
    }
}

static void
reset_all(pair *p, be_ctx *cu_ctx)
{
    for (uint32_t s = 0; s < N_SLOTS; s++) {
        CHECK(p->cpu->slot_reset(p->a, s) == WK_OK, "cpu reset %u", s);
        CHECK(p->cu->slot_reset(cu_ctx, s) == WK_OK, "cuda reset %u", s);
    }
}

static be_ctx *
open_ctx(const be_ops *ops, const wrk_model *m, uint32_t max_rows, uint32_t max_tokens)
{
    be_config bc = {.n_slots = N_SLOTS,
                    .n_threads = 2,
                    .device = g_device,
                    .max_step_rows = max_rows,
                    .max_step_tokens = max_tokens};
    be_ctx *ctx = NULL;
    wk_diag d = {{0}};
    wk_err e = ops->open(&bc, m, &ctx, &d);
    CHECK(e == WK_OK, "%s open: %s: %s", ops->name, wk_err_name(e), d.msg);
    return e == WK_OK ? ctx : NULL;
}

static void
run_model(const be_ops *cu, const model_case *mc)
{
    char dir[256];
    synth_tmpdir(dir, sizeof(dir), "custep");
    CHECK(dir[0] != '\0' && synth_write(dir, &mc->cfg) == 0, "%s: synth model", mc->name);
    wrk_model *m = NULL;
    wk_diag d = {{0}};
    wrk_model_opts mo = {0};
    wk_err e = wrk_model_load(dir, &mo, &m, &d);
    CHECK(e == WK_OK, "%s: load: %s", mc->name, d.msg);
    if (e != WK_OK) {
        synth_rmdir(dir);
        return;
    }
    pair p = {.cpu = &be_cpu_ops,
              .cu = cu,
              .V = wrk_model_info_get(m)->vocab_size,
              .sb = wrk_model_info_get(m)->state_bytes};
    const uint32_t V = p.V;
    unsetenv("WKVM_CUDA_PASS_TOKENS");
    p.a = open_ctx(&be_cpu_ops, m, 8, 512);
    p.b = open_ctx(cu, m, 8, 512);
    if (p.a == NULL || p.b == NULL)
        goto done;
    char desc[256] = "";
    if (cu->describe != NULL)
        cu->describe(p.b, desc, sizeof(desc));
    printf("%s: %s\n", mc->name, desc);

    float *cpu_out[4] = {0}, *cu_out[4] = {0}, *cu_again[4] = {0};

    /* 1. the mixed step */
    reset_all(&p, p.b);
    mixed_step(&p, p.b, cu_out, cpu_out, true, "mixed");
    CHECK(rel_diff(cpu_out[0], cu_out[0], (size_t)13 * V) < TOL, "%s: ALL logits %.3e", mc->name,
          rel_diff(cpu_out[0], cu_out[0], (size_t)13 * V));
    CHECK(rel_diff(cpu_out[1], cu_out[1], V) < TOL, "%s: one-token logits %.3e", mc->name,
          rel_diff(cpu_out[1], cu_out[1], V));
    CHECK(rel_diff(cpu_out[3], cu_out[3], V) < TOL, "%s: long-prefill logits %.3e", mc->name,
          rel_diff(cpu_out[3], cu_out[3], V));
    bool zeros = true;
    for (size_t j = 0; j < (size_t)2 * V; j++)
        zeros = zeros && cu_out[2][j] == 0.0f;
    CHECK(zeros, "%s: padding logits are zeros", mc->name);
    for (uint32_t s = 1; s <= 3; s++)
        check_states(&p, s, s, mc->name);

    /* 2. the same step again on fresh slots: identical bits */
    for (uint32_t s = 0; s < N_SLOTS; s++)
        CHECK(cu->slot_reset(p.b, s) == WK_OK, "reset");
    mixed_step(&p, p.b, cu_again, NULL, false, "repeat");
    for (int i = 0; i < 4; i++)
        CHECK(memcmp(cu_out[i], cu_again[i],
                     sizeof(float) * V *
                         (i == 0   ? 13
                          : i == 2 ? 2
                                   : 1)) == 0,
              "%s: repeat run output %d not bit-identical", mc->name, i);

    /* 3. the long prompt in chunks of 7 (slot 4) and token by token (slot 5) */
    {
        int32_t t3[LONG];
        for (uint32_t i = 0; i < LONG; i++)
            t3[i] = tok_at(V, 3, i);
        float *l7 = calloc(V, sizeof(float)), *l1 = calloc(V, sizeof(float));
        for (uint32_t off = 0; off < LONG; off += 7) {
            uint32_t n = LONG - off < 7 ? LONG - off : 7;
            be_row r = {.slot = 4,
                        .tokens = t3 + off,
                        .n_tokens = n,
                        .logits_mode = off + n == LONG ? BE_LOGITS_LAST : BE_LOGITS_NONE,
                        .logits = off + n == LONG ? l7 : NULL};
            step(cu, p.b, &r, 1, "chunk 7");
        }
        for (uint32_t off = 0; off < LONG; off++) {
            be_row r = {.slot = 5,
                        .tokens = t3 + off,
                        .n_tokens = 1,
                        .logits_mode = off + 1 == LONG ? BE_LOGITS_LAST : BE_LOGITS_NONE,
                        .logits = off + 1 == LONG ? l1 : NULL};
            step(cu, p.b, &r, 1, "token by token");
        }
        CHECK(rel_diff(cpu_out[3], l7, V) < TOL, "%s: chunks of 7 vs CPU %.3e", mc->name,
              rel_diff(cpu_out[3], l7, V));
        CHECK(rel_diff(cpu_out[3], l1, V) < TOL, "%s: token by token vs CPU %.3e", mc->name,
              rel_diff(cpu_out[3], l1, V));
        check_states(&p, 3, 4, "chunks of 7");
        check_states(&p, 3, 5, "token by token");
        free(l7);
        free(l1);
    }

    /* 4. batched decode on slots 1..3 (cuda state from step 2 == step 1's) */
    {
        float *la[3], *lb[3];
        for (int i = 0; i < 3; i++) {
            la[i] = calloc(V, sizeof(float));
            lb[i] = calloc(V, sizeof(float));
        }
        for (uint32_t it = 0; it < 6; it++) {
            int32_t tk[3] = {tok_at(V, 10 + it, 0), tok_at(V, 20 + it, 1), tok_at(V, 30 + it, 2)};
            be_row ra[3], rb[3];
            for (int i = 0; i < 3; i++) {
                ra[i] = (be_row){.slot = (uint32_t)i + 1,
                                 .tokens = &tk[i],
                                 .n_tokens = 1,
                                 .logits_mode = BE_LOGITS_LAST,
                                 .logits = la[i]};
                rb[i] = ra[i];
                rb[i].logits = lb[i];
            }
            step(&be_cpu_ops, p.a, ra, 3, "decode");
            step(cu, p.b, rb, 3, "decode");
            for (int i = 0; i < 3; i++)
                CHECK(rel_diff(la[i], lb[i], V) < TOL, "%s: decode %u row %d: %.3e", mc->name, it,
                      i, rel_diff(la[i], lb[i], V));
        }
        for (uint32_t s = 1; s <= 3; s++)
            check_states(&p, s, s, "after decode");

        /* 6. a CPU slot image resumed on the device continues like the CPU */
        float *img = slot_get(&be_cpu_ops, p.a, 2, p.sb);
        CHECK(img != NULL && cu->slot_write(p.b, 6, 0, img, p.sb) == WK_OK, "image write");
        int32_t tk = tok_at(V, 99, 0);
        be_row ra = {.slot = 2,
                     .tokens = &tk,
                     .n_tokens = 1,
                     .logits_mode = BE_LOGITS_LAST,
                     .logits = la[0]};
        be_row rb = {.slot = 6,
                     .tokens = &tk,
                     .n_tokens = 1,
                     .logits_mode = BE_LOGITS_LAST,
                     .logits = lb[0]};
        step(&be_cpu_ops, p.a, &ra, 1, "resume");
        step(cu, p.b, &rb, 1, "resume");
        CHECK(rel_diff(la[0], lb[0], V) < TOL, "%s: resumed image %.3e", mc->name,
              rel_diff(la[0], lb[0], V));
        free(img);
        for (int i = 0; i < 3; i++) {
            free(la[i]);
            free(lb[i]);
        }
    }

    /* 7. refusals change nothing */
    {
        float *before = slot_get(cu, p.b, 1, p.sb), *after = NULL;
        int32_t good = 5, bad = (int32_t)V;
        float *lg = calloc(V, sizeof(float));
        be_row dup[2] = {{.slot = 1,
                          .tokens = &good,
                          .n_tokens = 1,
                          .logits_mode = BE_LOGITS_LAST,
                          .logits = lg},
                         {.slot = 1, .tokens = &good, .n_tokens = 1}};
        CHECK(cu->step(p.b, dup, 2, &d) == WK_EINVAL, "duplicate slot refused");
        be_row oov[2] = {{.slot = 1, .tokens = &good, .n_tokens = 1},
                         {.slot = 2, .tokens = &bad, .n_tokens = 1}};
        CHECK(cu->step(p.b, oov, 2, &d) == WK_EINVAL, "token outside the vocab refused");
        be_row nolog = {.slot = 1,
                        .tokens = &good,
                        .n_tokens = 1,
                        .logits_mode = BE_LOGITS_LAST,
                        .logits = NULL};
        CHECK(cu->step(p.b, &nolog, 1, &d) == WK_EINVAL, "missing logits buffer refused");
        be_row many[9];
        for (int i = 0; i < 9; i++)
            many[i] = (be_row){.slot = 0, .tokens = &good, .n_tokens = 1};
        many[0].slot = 1;
        CHECK(cu->step(p.b, many, 9, &d) == WK_ETOOBIG, "too many rows refused");
        int32_t *lots = calloc(513, sizeof(int32_t));
        be_row big = {.slot = 1, .tokens = lots, .n_tokens = 513};
        CHECK(cu->step(p.b, &big, 1, &d) == WK_ETOOBIG, "too many tokens refused");
        free(lots);
        after = slot_get(cu, p.b, 1, p.sb);
        CHECK(before != NULL && after != NULL && memcmp(before, after, p.sb) == 0,
              "%s: refused steps changed slot 1", mc->name);
        free(before);
        free(after);
        free(lg);
    }

    /* 8. a reset row starts from a zeroed slot, inside the step (be_row.reset) */
    {
        int32_t t1[13];
        for (uint32_t i = 0; i < 13; i++)
            t1[i] = tok_at(V, 1, i);
        float *lr = calloc((size_t)13 * V, sizeof(float));
        int32_t good = 5;
        /* slot 1 holds a used state; a refused step with a reset row changes nothing */
        float *before = slot_get(cu, p.b, 1, p.sb), *after = NULL;
        be_row refused[2] = {{.slot = 1, .tokens = t1, .n_tokens = 13, .reset = true},
                             {.slot = 1, .tokens = &good, .n_tokens = 1}};
        CHECK(cu->step(p.b, refused, 2, &d) == WK_EINVAL, "duplicate slot with a reset refused");
        after = slot_get(cu, p.b, 1, p.sb);
        CHECK(before != NULL && after != NULL && memcmp(before, after, p.sb) == 0,
              "%s: a refused step reset slot 1", mc->name);
        be_row rr = {.slot = 1,
                     .tokens = t1,
                     .n_tokens = 13,
                     .logits_mode = BE_LOGITS_ALL,
                     .logits = lr,
                     .reset = true};
        step(cu, p.b, &rr, 1, "reset row");
        CHECK(rel_diff(cpu_out[0], lr, (size_t)13 * V) < TOL,
              "%s: a reset row on a used slot vs a fresh CPU slot %.3e", mc->name,
              rel_diff(cpu_out[0], lr, (size_t)13 * V));
        free(before);
        free(after);
        free(lr);
    }

    /* 9. a handled CUDA error (out of device memory) does not fail the next step */
    {
        void *huge = NULL;
        cudaError_t ce = cudaMalloc(&huge, (size_t)1 << 62);
        CHECK(ce != cudaSuccess, "a 4 EiB cudaMalloc succeeded");
        if (ce == cudaSuccess)
            cudaFree(huge);
        be_config hb = {.n_slots = 1u << 30, .n_threads = 1, .device = g_device};
        be_ctx *none = NULL;
        wk_diag hd = {{0}};
        wk_err he = cu->open(&hb, m, &none, &hd);
        CHECK(he != WK_OK && none == NULL, "%s: a 2^30-slot arena opened", mc->name);
        if (he == WK_OK)
            cu->close(none);
        int32_t tk = tok_at(V, 77, 0);
        float *lg = calloc(V, sizeof(float));
        be_row r = {.slot = 2,
                    .tokens = &tk,
                    .n_tokens = 1,
                    .logits_mode = BE_LOGITS_LAST,
                    .logits = lg};
        step(cu, p.b, &r, 1, "step after a handled error");
        free(lg);
    }

    /* 5. small passes: rows split across passes of 5 tokens */
    {
        setenv("WKVM_CUDA_PASS_TOKENS", "5", 1);
        be_ctx *small = open_ctx(cu, m, 8, 512);
        unsetenv("WKVM_CUDA_PASS_TOKENS");
        if (small != NULL) {
            float *sm_out[4] = {0};
            reset_all(&p, small);
            mixed_step(&p, small, sm_out, cpu_out, true, "small passes");
            CHECK(rel_diff(cpu_out[0], sm_out[0], (size_t)13 * V) < TOL,
                  "%s: small passes ALL logits %.3e", mc->name,
                  rel_diff(cpu_out[0], sm_out[0], (size_t)13 * V));
            CHECK(rel_diff(cpu_out[3], sm_out[3], V) < TOL, "%s: small passes long %.3e", mc->name,
                  rel_diff(cpu_out[3], sm_out[3], V));
            for (uint32_t s = 1; s <= 3; s++) {
                float *sa = slot_get(&be_cpu_ops, p.a, s, p.sb), *sb = slot_get(cu, small, s, p.sb);
                CHECK(sa != NULL && sb != NULL && rel_diff(sa, sb, p.sb / 4) < TOL,
                      "%s: small passes state slot %u", mc->name, s);
                free(sa);
                free(sb);
            }
            for (int i = 0; i < 4; i++)
                free(sm_out[i]);
            cu->close(small);
        }
    }

    for (int i = 0; i < 4; i++) {
        free(cpu_out[i]);
        free(cu_out[i]);
        free(cu_again[i]);
    }
done:
    be_cpu_ops.close(p.a);
    if (p.b != NULL)
        cu->close(p.b);
    wrk_model_free(m);
    synth_rmdir(dir);
}

int
main(void)
{
    const be_ops *cu = be_cuda_ops_get();
    char dev[128];
    uint64_t mem = 0;
    const int gate = gpu_gate_probe(cu, dev, sizeof(dev), &mem);
    if (gate >= 0)
        return gate;
    printf("device: %s, %llu MiB\n", dev, (unsigned long long)(mem >> 20));

    model_case cases[6];
    size_t nc = 0;
    synth_cfg c = synth_default(); /* BF16, HF names, L2 C64 N16 */
    c.L = 3;
    cases[nc++] = (model_case){"bf16-hf-L3C64N16", c};
    c = synth_default();
    c.dtype = WK_DTYPE_F16;
    c.hf = false;
    c.C = 128;
    c.N = 64;
    c.F = 256;
    c.V = 500;
    c.seed = 2;
    cases[nc++] = (model_case){"f16-blink-C128N64", c};
    c = synth_default();
    c.dtype = WK_DTYPE_F32;
    c.C = 64;
    c.N = 32;
    c.layer0_v = true;
    c.seed = 3;
    cases[nc++] = (model_case){"f32-hf-N32-l0v", c};
    c = synth_default();
    c.C = 72;
    c.N = 24; /* the generic (global-memory state) WKV kernel */
    c.F = 160;
    c.seed = 4;
    cases[nc++] = (model_case){"bf16-hf-C72N24", c};
    c = synth_default();
    c.L = 1; /* no value LoRA at all */
    c.dtype = WK_DTYPE_F32;
    c.hf = false;
    c.seed = 5;
    cases[nc++] = (model_case){"f32-blink-L1", c};
    c = synth_default();
    c.C = 256;
    c.N = 128; /* the register WKV kernel's largest head */
    c.F = 512;
    c.seed = 6;
    cases[nc++] = (model_case){"bf16-hf-C256N128", c};

    for (size_t i = 0; i < nc; i++)
        run_model(cu, &cases[i]);

    /* an ordinal other than 0: the first model again on the last device */
    int last = 0;
    while (last < 63 && be_cuda_device_check(last + 1, NULL) == WK_OK)
        last++;
    if (last > 0) {
        g_device = last;
        printf("device %d:\n", last);
        run_model(cu, &cases[0]);
        g_device = 0;
    } else {
        printf("one CUDA device: ordinals other than 0 not tested (needs two)\n");
    }
    printf("%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
