/*
 * test_be_cpu: the CPU backend. Kernels against a double-precision
 * reference, and the properties the worker relies on: a row's logits and
 * state are bit-identical whatever else is in the step (batch invariance),
 * whatever the thread count, and whether a prompt is prefilled at once, in
 * chunks or token by token; slot copy/read/write/reset round trips; a
 * reset inside a step (be_row.reset) is applied only when the step is
 * accepted; and every bad request is refused without touching any slot. Each property is
 * checked on every kernel path the CPU has (scalar, AVX2, AVX-512).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "be.h"
#include "be_cpu_bf16.h"
#include "be_cpu_common.h"
#include "be_cpu_kernels.h"
#include "isa_hw.h"
#include "rwkv7_synth.h"
#include "wrk_model.h"

static char g_dir[256];
static wrk_model *g_model;
static uint32_t g_V;
static uint64_t g_slot_bytes;

static const char *const g_isas[] = {"scalar", "avx2", "avx512"};

/* Whether the CPU runs ISA i (index into g_isas); a comparison that needs a
 * missing one is skipped by name, never run on a lowered path. */
static bool
isa_available(int i)
{
    static bool said[3];
    if (i < 0 || i > 2)
        return false;
    if (i <= isa_hw_best())
        return true;
    if (!said[i]) {
        said[i] = true;
        printf("%s comparison skipped: CPU has no %s\n", g_isas[i],
               i == 2 ? "AVX-512" : "AVX2 + FMA");
    }
    return false;
}

static void
isa_set(int i)
{
    setenv("WKVM_CPU_ISA", g_isas[i], 1);
}

static int
group_setup(void **state)
{
    (void)state;
    synth_cfg c = synth_default();
    c.L = 3;
    c.C = 64;
    c.N = 16; /* 4 heads */
    c.V = 300; /* partial head panel */
    synth_tmpdir(g_dir, sizeof(g_dir), "becpu");
    if (g_dir[0] == '\0' || synth_write(g_dir, &c) != 0)
        return -1;
    wk_diag d = {{0}};
    if (wrk_model_load(g_dir, NULL, &g_model, &d) != WK_OK) {
        fprintf(stderr, "load: %s\n", d.msg);
        return -1;
    }
    g_V = wrk_model_info_get(g_model)->vocab_size;
    g_slot_bytes = wrk_model_info_get(g_model)->state_bytes;
    return 0;
}

static int
group_teardown(void **state)
{
    (void)state;
    wrk_model_free(g_model);
    synth_rmdir(g_dir);
    unsetenv("WKVM_CPU_ISA");
    return 0;
}

static be_ctx *
ctx_open(uint32_t n_slots, uint32_t threads, uint32_t max_rows, uint32_t max_tokens)
{
    be_config bc = {.n_slots = n_slots, .n_threads = threads, .max_step_rows = max_rows,
                    .max_step_tokens = max_tokens};
    be_ctx *ctx = NULL;
    wk_diag d = {{0}};
    wk_err e = be_cpu_ops.open(&bc, g_model, &ctx, &d);
    if (e != WK_OK)
        fail_msg("open: %s", d.msg);
    assert_int_equal(be_cpu_ops.slot_bytes(ctx), g_slot_bytes);
    assert_int_equal(be_cpu_ops.n_slots(ctx), n_slots);
    return ctx;
}

static void
step_ok(be_ctx *ctx, be_row *rows, size_t n)
{
    wk_diag d = {{0}};
    wk_err e = be_cpu_ops.step(ctx, rows, n, &d);
    if (e != WK_OK)
        fail_msg("step: %s: %s", wk_err_name(e), d.msg);
}

static uint8_t *
slot_dump(be_ctx *ctx, uint32_t slot)
{
    uint8_t *b = malloc(g_slot_bytes);
    assert_int_equal(be_cpu_ops.slot_read(ctx, slot, 0, b, g_slot_bytes), WK_OK);
    return b;
}

static int32_t
tok_at(uint32_t seed, uint32_t i)
{
    return (int32_t)((seed * 7919u + i * 104729u + 3u) % g_V);
}

/* ------------------------------------------------------------------------ */
/* kernels                                                                   */
/* ------------------------------------------------------------------------ */

static uint64_t g_rng = 12345;

static float
frand(void)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_rng >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

/* A stored matrix in dtype dt, [n_in, n_out] when in_major, else [n_out, n_in]. */
typedef struct test_mat {
    wk_tensor t;
    wrk_mat m;
    float *ref; /* ref[k * n + c]: exact values */
} test_mat;

static void
test_mat_make(test_mat *tm, wk_dtype dt, uint32_t k, uint32_t n, bool in_major)
{
    size_t cnt = (size_t)k * n, es = wk_dtype_size(dt);
    uint8_t *data = malloc(cnt * es);
    tm->ref = malloc(cnt * sizeof(float));
    for (uint32_t i = 0; i < k; i++) {
        for (uint32_t c = 0; c < n; c++) {
            float v = frand();
            size_t idx = in_major ? (size_t)i * n + c : (size_t)c * k + i;
            if (dt == WK_DTYPE_F32) {
                memcpy(data + idx * 4, &v, 4);
            } else {
                uint16_t h = dt == WK_DTYPE_BF16 ? wk_f32_to_bf16(v) : wk_f32_to_f16(v);
                memcpy(data + idx * 2, &h, 2);
                v = dt == WK_DTYPE_BF16 ? wk_bf16_to_f32(h) : wk_f16_to_f32(h);
            }
            tm->ref[(size_t)i * n + c] = v;
        }
    }
    memset(&tm->t, 0, sizeof(tm->t));
    tm->t.name = "test";
    tm->t.dtype = dt;
    tm->t.ndim = 2;
    tm->t.shape[0] = in_major ? k : n;
    tm->t.shape[1] = in_major ? n : k;
    tm->t.data = data;
    tm->t.nbytes = cnt * es;
    tm->m = (wrk_mat){&tm->t, k, n, in_major};
}

static void
test_mat_free(test_mat *tm)
{
    free((void *)tm->t.data);
    free(tm->ref);
}

static void
test_gemm_kernels(void **state)
{
    (void)state;
    static const uint32_t ks[] = {1, 7, 64, 100};
    static const uint32_t ns[] = {1, 31, 33, 97, 200};
    static const wk_dtype dts[] = {WK_DTYPE_F32, WK_DTYPE_F16, WK_DTYPE_BF16};
    const uint32_t M = 27;
    float *first_isa = NULL; /* vector ISAs must agree bit for bit */

    for (size_t di = 0; di < 3; di++)
        for (size_t ki = 0; ki < 4; ki++)
            for (size_t ni = 0; ni < 5; ni++) {
                const uint32_t K = ks[ki], N = ns[ni];
                test_mat tm;
                test_mat_make(&tm, dts[di], K, N, (ki + ni) % 2 == 0);
                be_cpu_mat pm;
                assert_int_equal(be_cpu_mat_alloc(&pm, &tm.m), WK_OK);
                be_cpu_mat_pack_panels(&pm, &tm.m, 0, pm.n_panels);
                float *x = malloc(sizeof(float) * M * K);
                for (size_t i = 0; i < (size_t)M * K; i++)
                    x[i] = frand();
                float *y = malloc(sizeof(float) * M * N);
                float *y1 = malloc(sizeof(float) * N);
                free(first_isa);
                first_isa = NULL;
                for (int is = 0; is < 3; is++) {
                    if (!isa_available(is))
                        continue;
                    be_cpu_isa isa = (be_cpu_isa)is;
                    for (uint32_t m = 1; m <= M; m += (m < 14 ? 1 : 6)) {
                        memset(y, 0xff, sizeof(float) * M * N);
                        /* in two panel ranges, as two threads would */
                        uint32_t split = pm.n_panels / 2;
                        be_cpu_gemm(isa, &pm, x, K, m, y, N, NULL, 0, split, BE_CPU_EPI_STORE);
                        be_cpu_gemm(isa, &pm, x, K, m, y, N, NULL, split, pm.n_panels,
                                    BE_CPU_EPI_STORE);
                        for (uint32_t i = 0; i < m; i++) {
                            /* the row alone: bit-identical */
                            be_cpu_gemm(isa, &pm, x + (size_t)i * K, K, 1, y1, N, NULL, 0,
                                        pm.n_panels, BE_CPU_EPI_STORE);
                            assert_memory_equal(y1, y + (size_t)i * N, sizeof(float) * N);
                            for (uint32_t c = 0; c < N; c++) {
                                double s = 0;
                                for (uint32_t k = 0; k < K; k++)
                                    s += (double)x[(size_t)i * K + k] * tm.ref[(size_t)k * N + c];
                                assert_float_equal(y[(size_t)i * N + c], s, 1e-4 * (1 + K));
                            }
                        }
                    }
                    if (isa != BE_CPU_ISA_SCALAR) {
                        be_cpu_gemm(isa, &pm, x, K, M, y, N, NULL, 0, pm.n_panels,
                                    BE_CPU_EPI_STORE);
                        if (first_isa == NULL) {
                            first_isa = malloc(sizeof(float) * M * N);
                            memcpy(first_isa, y, sizeof(float) * M * N);
                        } else {
                            assert_memory_equal(first_isa, y, sizeof(float) * M * N);
                        }
                    }
                    /* epilogues */
                    float *ya = malloc(sizeof(float) * 3 * N);
                    float *rows[3] = {ya + 2 * N, ya, ya + N}; /* scattered output rows */
                    be_cpu_gemm(isa, &pm, x, K, 3, y, N, NULL, 0, pm.n_panels, BE_CPU_EPI_STORE);
                    static const be_cpu_epi epis[] = {BE_CPU_EPI_ADD, BE_CPU_EPI_RELU2,
                                                      BE_CPU_EPI_TANH, BE_CPU_EPI_SIGMOID};
                    for (int e = 0; e < 4; e++) {
                        for (uint32_t i = 0; i < 3 * N; i++)
                            ya[i] = 0.5f;
                        be_cpu_gemm(isa, &pm, x, K, 3, NULL, 0, rows, 0, pm.n_panels, epis[e]);
                        for (uint32_t i = 0; i < 3; i++)
                            for (uint32_t c = 0; c < N; c++) {
                                float a = y[(size_t)i * N + c], got = rows[i][c], want;
                                switch (epis[e]) {
                                case BE_CPU_EPI_ADD: want = 0.5f + a; break;
                                case BE_CPU_EPI_RELU2: want = a > 0 ? a * a : 0; break;
                                case BE_CPU_EPI_TANH: want = tanhf(a); break;
                                default: want = 1.0f / (1.0f + expf(-a)); break;
                                }
                                assert_float_equal(got, want, 1e-6);
                            }
                    }
                    free(ya);
                }
                free(x);
                free(y);
                free(y1);
                be_cpu_mat_free(&pm);
                test_mat_free(&tm);
            }
    free(first_isa);
}

/* The bf16 the AMX mode feeds the tiles for activation v: RNE, denormals flushed (DAZ). */
static double
amx_act(float v)
{
    float r = wk_bf16_to_f32(wk_f32_to_bf16(v));
    return fabsf(r) < 1.17549435e-38f ? 0.0 : (double)r;
}

/*
 * A --cpu-matmul bf16 engine (mode): against a float64 product of the
 * bf16-rounded activations and the BF16 weights, within the fp32
 * accumulation's error (1e-5 of sum |a w|; a missing or wrong activation
 * rounding is ~2e-3 and fails); for the dot products, bitwise against
 * be_cpu_dp_ref's chain (k pairs from +0, odd product first, denormals
 * flushed); and, bitwise, a row alone == the row in any batch of 1..40 rows,
 * any panel split == one call, any ISA argument, the stack-slab fallback
 * == the buffered path, the ADD epilogue == y + the STORE result.
 */
static void
gemm_bf16_mode(be_cpu_matmul mode)
{
    /* K = 4096: column chunks of 2 panels (the L2 blocking), so N = 200 spans several */
    static const uint32_t ks[] = {1, 33, 100, 1000, 4096};
    static const uint32_t ns[] = {1, 17, 97, 200};
    const uint32_t M = 40;
    for (size_t ki = 0; ki < 5; ki++)
        for (size_t ni = 0; ni < 4; ni++) {
            const uint32_t K = ks[ki], N = ns[ni];
            if (K == 4096 && N != 200)
                continue;
            test_mat tm;
            test_mat_make(&tm, WK_DTYPE_BF16, K, N, (ki + ni) % 2 == 1);
            be_cpu_mat pm;
            assert_int_equal(be_cpu_mat_alloc_as(&pm, &tm.m, mode), WK_OK);
            assert_true(pm.kpair);
            assert_true(pm.dp == (mode == BE_CPU_MATMUL_BF16_DP));
            be_cpu_mat_pack_panels(&pm, &tm.m, 0, pm.n_panels);
            float *x = malloc(sizeof(float) * M * K);
            for (size_t i = 0; i < (size_t)M * K; i++)
                x[i] = frand() * (i % 5 == 0 ? 1e3f : 1.0f);
            if (K > 1)
                x[1] = 1e-39f; /* a denormal activation: flushed */
            float *y = malloc(sizeof(float) * M * N), *yb = malloc(sizeof(float) * M * N);
            be_cpu_gemm(BE_CPU_ISA_AVX512, &pm, x, K, M, y, N, NULL, 0, pm.n_panels,
                        BE_CPU_EPI_STORE);
            for (uint32_t i = 0; i < M; i++)
                for (uint32_t c = 0; c < N; c++) {
                    double sum = 0, mag = 0;
                    for (uint32_t k = 0; k < K; k++) {
                        double t = amx_act(x[(size_t)i * K + k]) * tm.ref[(size_t)k * N + c];
                        sum += t;
                        mag += fabs(t);
                    }
                    assert_float_equal(y[(size_t)i * N + c], sum, 1e-5 * mag + 1e-30);
                    if (mode != BE_CPU_MATMUL_BF16_DP)
                        continue;
                    float acc = 0.0f;
                    uint16_t h[4];
                    for (uint32_t k = 0; k < be_cpu_kpair_kp(K); k += 2) {
                        for (uint32_t u = 0; u < 2; u++) {
                            const bool in = k + u < K;
                            h[u] = in ? be_cpu_bf16_round(x[(size_t)i * K + k + u]) : 0;
                            h[2 + u] = in ? wk_f32_to_bf16((float)tm.ref[(size_t)(k + u) * N + c])
                                          : 0;
                        }
                        acc = be_cpu_dp_ref(acc, h[0], h[1], h[2], h[3]);
                    }
                    assert_memory_equal(&acc, &y[(size_t)i * N + c], sizeof(float));
                }
            /* any row count (AMX: row blocks of 16; dot products: balanced blocks of <= 6, the
             * first of each column chunk read in memory order): the same bits per row */
            for (uint32_t m = 1; m <= M; m += (m < 18 ? 1 : 7)) {
                const uint32_t r0 = (M - m) / 2;
                memset(yb, 0xff, sizeof(float) * M * N);
                be_cpu_gemm(BE_CPU_ISA_SCALAR, &pm, x + (size_t)r0 * K, K, m, yb, N, NULL, 0,
                            pm.n_panels, BE_CPU_EPI_STORE);
                assert_memory_equal(yb, y + (size_t)r0 * N, sizeof(float) * m * N);
            }
            /* panel splits, as threads take them */
            for (uint32_t split = 1; split < pm.n_panels; split += 2) {
                memset(yb, 0xff, sizeof(float) * M * N);
                be_cpu_gemm(BE_CPU_ISA_AVX2, &pm, x, K, M, yb, N, NULL, 0, split,
                            BE_CPU_EPI_STORE);
                be_cpu_gemm(BE_CPU_ISA_AVX2, &pm, x, K, M, yb, N, NULL, split, pm.n_panels,
                            BE_CPU_EPI_STORE);
                assert_memory_equal(yb, y, sizeof(float) * M * N);
            }
            /* the stack-slab path (taken when the activation buffer cannot grow): same bits */
            be_cpu_bf16_set_slab_only(true);
            memset(yb, 0xff, sizeof(float) * M * N);
            be_cpu_gemm(BE_CPU_ISA_AVX512, &pm, x, K, M, yb, N, NULL, 0, pm.n_panels,
                        BE_CPU_EPI_STORE);
            be_cpu_bf16_set_slab_only(false);
            assert_memory_equal(yb, y, sizeof(float) * M * N);
            /* rows of x and y farther apart than K and N (ldx, ldy honoured) */
            {
                const size_t lx = (size_t)K + 5, ly = (size_t)N + 3;
                float *xs = malloc(sizeof(float) * M * lx), *ys = malloc(sizeof(float) * M * ly);
                for (uint32_t i = 0; i < M; i++)
                    memcpy(xs + i * lx, x + (size_t)i * K, sizeof(float) * K);
                be_cpu_gemm(BE_CPU_ISA_AVX512, &pm, xs, lx, M, ys, ly, NULL, 0, pm.n_panels,
                            BE_CPU_EPI_STORE);
                for (uint32_t i = 0; i < M; i++)
                    assert_memory_equal(ys + i * ly, y + (size_t)i * N, sizeof(float) * N);
                free(xs);
                free(ys);
            }
            /* the ADD epilogue into scattered rows */
            float *rows[3] = {yb + 2 * N, yb, yb + N};
            for (uint32_t i = 0; i < 3 * N; i++)
                yb[i] = 0.5f;
            be_cpu_gemm(BE_CPU_ISA_AVX512, &pm, x, K, 3, NULL, 0, rows, 0, pm.n_panels,
                        BE_CPU_EPI_ADD);
            for (uint32_t i = 0; i < 3; i++)
                for (uint32_t c = 0; c < N; c++)
                    assert_true(rows[i][c] == 0.5f + y[(size_t)i * N + c]);
            free(x);
            free(y);
            free(yb);
            be_cpu_mat_free(&pm);
            test_mat_free(&tm);
        }
    /* other dtypes keep the fp32 kernels (and their packing) in bf16 mode */
    test_mat tf;
    test_mat_make(&tf, WK_DTYPE_F32, 33, 17, false);
    assert_int_equal(be_cpu_mat_bytes_as(&tf.m, mode), be_cpu_mat_bytes(&tf.m));
    be_cpu_mat pf;
    assert_int_equal(be_cpu_mat_alloc_as(&pf, &tf.m, mode), WK_OK);
    assert_false(pf.kpair);
    be_cpu_mat_free(&pf);
    test_mat_free(&tf);
}

/* The AMX engine; skipped where AMX is absent. */
static void
test_gemm_amx(void **state)
{
    (void)state;
    if (!be_cpu_amx_enable()) {
        printf("AMX comparison skipped: no AMX-BF16 here\n");
        skip();
    }
    gemm_bf16_mode(BE_CPU_MATMUL_BF16);
}

/* The AVX512-BF16 engine; skipped where the CPU has no AVX512_BF16. */
static void
test_gemm_dp(void **state)
{
    (void)state;
    if (!be_cpu_dp_enable()) {
        printf("AVX512-BF16 comparison skipped: no AVX512_BF16 here\n");
        skip();
    }
    gemm_bf16_mode(BE_CPU_MATMUL_BF16_DP);
}

/*
 * be_cpu_dp_ref (the dot products' documented sum) against the instruction
 * itself on edge values and random bits: the odd product first
 * (cancellation tells the orders apart), denormal activations, weights,
 * accumulators and results flushed to zero of their sign, products past
 * fp32's range (unrounded until added), NaN and infinities.
 */
static void
test_dp_ref(void **state)
{
    (void)state;
    /* the order: 1 + 2^24 (odd) - 2^24 (even) ... in fp32: (1 + 2^24) rounds to 2^24 */
    const uint16_t one = 0x3f80, two24 = 0x4b80, mtwo24 = 0xcb80;
    float r = be_cpu_dp_ref(1.0f, one, one, mtwo24, two24);
    /* odd first: (1 + 2^24) = 2^24 (ties to even), - 2^24 = 0 */
    assert_true(r == 0.0f);
    /* a denormal accumulator and a denormal product are flushed */
    assert_true(be_cpu_dp_ref(1e-39f, 0, 0, 0, 0) == 0.0f);
    assert_true(signbit(be_cpu_dp_ref(-1e-39f, 0x8000, 0x8000, 0, 0)));
    assert_true(be_cpu_dp_ref(0.0f, 0x0001, 0, one, 0) == 0.0f); /* bf16 denormal input */
    assert_true(be_cpu_dp_ref(0.0f, 0x1f80, 0, 0x2000, 0) == 0.0f); /* product 2^-127: flushed */
    assert_true(be_cpu_dp_ref(0.0f, 0x2000, 0, 0x2000, 0) == 0x1p-126f); /* the least normal */
    assert_true(isnan(be_cpu_dp_ref(0.0f, 0x7fc0, 0, one, 0)));
    assert_true(isinf(be_cpu_dp_ref(0.0f, 0x7f80, 0, one, 0)));
    /* the odd product 2^127 * 2 overflows when added (+Inf); the even one, -2^128, is a finite
     * addend, so +Inf stays (products rounded alone first would give +Inf - Inf = NaN) */
    assert_true(isinf(be_cpu_dp_ref(0.0f, 0x7f00, 0x7f00, 0xc000, 0x4000)));
    assert_true(be_cpu_dp_ref(0x1p-126f, 0x2000, 0, 0x1f80, 0) == 0x1.8p-126f); /* unflushed */
    /* tiny after rounding at 24 bits: 2^-126 - 2^-150 (the odd pair 2^-126, the even
     * -2^-150) is 0, not the 2^-126 an IEEE fma rounds it to; -2^-151 less rounds up to it */
    float tiny = be_cpu_dp_ref(0.0f, 0x9a00, 0x2000, 0x1a00, 0x2000);
    assert_true(tiny == 0.0f && !signbit(tiny));
    tiny = be_cpu_dp_ref(0.0f, 0x1a00, 0xa000, 0x1a00, 0x2000);
    assert_true(tiny == 0.0f && signbit(tiny));
    assert_true(be_cpu_dp_ref(0.0f, 0x9a00, 0x2000, 0x1980, 0x2000) == 0x1p-126f);
    if (!be_cpu_dp_enable()) {
        printf("instruction comparison skipped: no AVX512_BF16 here\n");
        return;
    }
    /* the instruction through a 1 x 1 x 16 GEMM for each edge pair, and random ones */
    static const uint16_t edge[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x0080, 0x3f80, 0xbf80,
                                    0x4b80, 0xcb80, 0x7f7f, 0xff7f, 0x7f80, 0x2000, 0x1f80};
    const size_t ne = sizeof(edge) / sizeof(edge[0]);
    uint16_t wv[2 * 32];
    wrk_mat wm = {0};
    wk_tensor wt = {0};
    for (size_t t = 0; t < 8000; t++) {
        uint16_t a[2], b[2];
        for (int u = 0; u < 2; u++) {
            a[u] = t < ne * ne ? edge[(t / ne + u) % ne] : (uint16_t)(rand() & 0xffff);
            b[u] = t < ne * ne ? edge[(t % ne + 3 * u) % ne] : (uint16_t)(rand() & 0xffff);
            if (t >= 4000) {
                /* exponents whose products land near 2^-126, signs mixed: sums that cancel
                 * to just under or over the least normal */
                a[u] = (uint16_t)((a[u] & 0x807f) | (uint16_t)((0x3f + rand() % 4) << 7));
                b[u] = (uint16_t)((b[u] & 0x807f) | (uint16_t)((0x3f + rand() % 4) << 7));
            }
        }
        if ((a[0] & 0x7f80) == 0x7f80 || (a[1] & 0x7f80) == 0x7f80)
            continue; /* activations come from fp32 via be_cpu_bf16_round: tested above */
        float x[2];
        for (int u = 0; u < 2; u++) {
            const uint32_t bits = (uint32_t)a[u] << 16;
            memcpy(&x[u], &bits, 4);
        }
        memset(wv, 0, sizeof(wv));
        wv[0] = b[0]; /* in_major [k][n], n = 32: (k, 0) */
        wv[32] = b[1];
        wt.dtype = WK_DTYPE_BF16;
        wt.data = wv;
        wt.nbytes = sizeof(wv);
        wm.t = &wt;
        wm.n_in = 2;
        wm.n_out = 32;
        wm.in_major = true;
        be_cpu_mat pm;
        assert_int_equal(be_cpu_mat_alloc_as(&pm, &wm, BE_CPU_MATMUL_BF16_DP), WK_OK);
        be_cpu_mat_pack_panels(&pm, &wm, 0, pm.n_panels);
        float y[32];
        be_cpu_gemm(BE_CPU_ISA_AVX512, &pm, x, 2, 1, y, 32, NULL, 0, pm.n_panels,
                    BE_CPU_EPI_STORE);
        /* the padded pairs (k 2..31) add +0 * +0: an exact -0 becomes +0 */
        float ref = be_cpu_dp_ref(0.0f, a[0], a[1], b[0], b[1]);
        for (int j = 1; j < 16; j++)
            ref = be_cpu_dp_ref(ref, 0, 0, 0, 0);
        if (isnan(ref))
            assert_true(isnan(y[0]));
        else
            assert_memory_equal(&ref, &y[0], sizeof(float));
        be_cpu_mat_free(&pm);
    }
}

/*
 * Q8_0 weights: rows quantized with wk_q8_0_quantize_row. Every ISA path
 * (scalar included) gives the same bits, equal to the documented chain
 * computed here (per block an fmaf chain from +0, then fmaf(d, part, acc)),
 * for any row count, row alone or in a batch, and any panel split; close to
 * the float64 product with the dequantized weights.
 */
static void
test_gemm_q8_0(void **state)
{
    (void)state;
    static const uint32_t ks[] = {32, 64, 160};
    static const uint32_t ns[] = {1, 31, 33, 97, 200};
    const uint32_t M = 27;
    for (size_t ki = 0; ki < 3; ki++)
        for (size_t ni = 0; ni < 5; ni++) {
            const uint32_t K = ks[ki], N = ns[ni], nb = K / 32;
            uint8_t *q = malloc((size_t)N * nb * 34);
            float *row = malloc(sizeof(float) * K), *deq = malloc(sizeof(float) * K * N);
            for (uint32_t c = 0; c < N; c++) {
                for (uint32_t k = 0; k < K; k++)
                    row[k] = frand() * (c % 3 == 0 ? 3.0f : 0.01f);
                if (c == 5)
                    memset(row, 0, sizeof(float) * 32); /* an all-zero block: d = 0 */
                assert_int_equal(wk_q8_0_quantize_row(row, K, q + (size_t)c * nb * 34), WK_OK);
            }
            wk_tensor t = {.name = "q", .dtype = WK_DTYPE_Q8_0, .ndim = 2, .shape = {N, K},
                           .data = q, .nbytes = (size_t)N * nb * 34};
            assert_int_equal(wk_tensor_read_f32(&t, 0, (size_t)K * N, deq), WK_OK);
            wrk_mat wm = {&t, K, N, false};
            be_cpu_mat pm;
            assert_int_equal(be_cpu_mat_alloc(&pm, &wm), WK_OK);
            be_cpu_mat_pack_panels(&pm, &wm, 0, pm.n_panels);
            float *x = malloc(sizeof(float) * M * K);
            for (size_t i = 0; i < (size_t)M * K; i++)
                x[i] = frand();
            /* the documented chain */
            float *want = malloc(sizeof(float) * M * N);
            for (uint32_t i = 0; i < M; i++)
                for (uint32_t c = 0; c < N; c++) {
                    const uint8_t *qr = q + (size_t)c * nb * 34;
                    float acc = 0.0f;
                    for (uint32_t b = 0; b < nb; b++) {
                        float part = 0.0f;
                        for (uint32_t j = 0; j < 32; j++)
                            part = fmaf(x[(size_t)i * K + b * 32 + j],
                                        (float)(int8_t)qr[b * 34 + 2 + j], part);
                        float dv = wk_f16_to_f32((uint16_t)(qr[b * 34] | qr[b * 34 + 1] << 8));
                        acc = fmaf(dv, part, acc);
                    }
                    want[(size_t)i * N + c] = acc;
                    double s = 0;
                    for (uint32_t k = 0; k < K; k++)
                        s += (double)x[(size_t)i * K + k] * deq[(size_t)c * K + k];
                    assert_float_equal(acc, s, 1e-4 * (1 + fabs(s)) * nb);
                }
            float *y = malloc(sizeof(float) * M * N), *y1 = malloc(sizeof(float) * N);
            for (int is = 0; is < 3; is++) {
                if (!isa_available(is))
                    continue;
                be_cpu_isa isa = (be_cpu_isa)is;
                for (uint32_t m = 1; m <= M; m += (m < 14 ? 1 : 6)) {
                    memset(y, 0xff, sizeof(float) * M * N);
                    uint32_t split = pm.n_panels / 2;
                    be_cpu_gemm(isa, &pm, x, K, m, y, N, NULL, 0, split, BE_CPU_EPI_STORE);
                    be_cpu_gemm(isa, &pm, x, K, m, y, N, NULL, split, pm.n_panels,
                                BE_CPU_EPI_STORE);
                    if (memcmp(y, want, sizeof(float) * m * N) != 0)
                        fail_msg("Q8_0 K=%u N=%u m=%u isa=%s: not the documented chain", K, N,
                                 m, g_isas[is]);
                    be_cpu_gemm(isa, &pm, x + (size_t)(m - 1) * K, K, 1, y1, N, NULL, 0,
                                pm.n_panels, BE_CPU_EPI_STORE);
                    assert_memory_equal(y1, want + (size_t)(m - 1) * N, sizeof(float) * N);
                }
                /* an epilogue through the tile path (scattered rows) */
                float *ya = malloc(sizeof(float) * 2 * N);
                float *rows[2] = {ya + N, ya};
                for (uint32_t i = 0; i < 2 * N; i++)
                    ya[i] = 0.5f;
                be_cpu_gemm(isa, &pm, x, K, 2, NULL, 0, rows, 0, pm.n_panels, BE_CPU_EPI_ADD);
                for (uint32_t i = 0; i < 2; i++)
                    for (uint32_t c = 0; c < N; c++)
                        assert_true(rows[i][c] == 0.5f + want[(size_t)i * N + c]);
                free(ya);
            }
            /* blocks must run along k */
            wrk_mat bad = {&t, K, N, true};
            assert_int_equal(be_cpu_mat_bytes(&bad), 0);
            free(y);
            free(y1);
            free(want);
            free(x);
            be_cpu_mat_free(&pm);
            free(q);
            free(row);
            free(deq);
        }
}

static void
test_wkv_kernel(void **state)
{
    (void)state;
    static const uint32_t nsz[] = {8, 12, 16, 32, 64};
    for (size_t ni = 0; ni < 5; ni++) {
        const uint32_t n = nsz[ni];
        float *s0 = malloc(sizeof(float) * n * n), *s = malloc(sizeof(float) * n * n);
        float vec[6][64], y[64], yr[64];
        double sd[64 * 64];
        for (uint32_t i = 0; i < n * n; i++)
            s0[i] = frand();
        for (int j = 0; j < 6; j++)
            for (uint32_t i = 0; i < n; i++)
                vec[j][i] = frand();
        for (uint32_t i = 0; i < n; i++)
            vec[1][i] = 0.5f + 0.4f * vec[1][i]; /* decay in (0.1, 0.9) */
        /* double reference */
        for (uint32_t i = 0; i < n; i++) {
            double sa = 0;
            for (uint32_t j = 0; j < n; j++)
                sa += (double)s0[i * n + j] * vec[4][j];
            double yy = 0;
            for (uint32_t j = 0; j < n; j++) {
                sd[i * n + j] = s0[i * n + j] * (double)vec[1][j] + sa * vec[5][j] +
                                (double)vec[3][i] * vec[2][j];
                yy += sd[i * n + j] * vec[0][j];
            }
            yr[i] = (float)yy;
        }
        for (int is = 0; is < 3; is++) {
            if (!isa_available(is))
                continue;
            memcpy(s, s0, sizeof(float) * n * n);
            be_cpu_wkv_head((be_cpu_isa)is, n, s, vec[0], vec[1], vec[2], vec[3], vec[4], vec[5],
                            y);
            for (uint32_t i = 0; i < n; i++)
                assert_float_equal(y[i], yr[i], 1e-4);
            for (uint32_t i = 0; i < n * n; i++)
                assert_float_equal(s[i], sd[i], 1e-5);
        }
        free(s0);
        free(s);
    }
}

/* ------------------------------------------------------------------------ */
/* batch invariance                                                          */
/* ------------------------------------------------------------------------ */

#define A_PROMPT 21
#define A_DECODE 3

/*
 * Runs row A (slot a_slot: a prompt then A_DECODE decode steps) with
 * `others` other rows in every step (decode rows, prefill chunks, padding),
 * A placed at position a_pos. Returns A's logits of each step (concatenated)
 * and its final state.
 */
static void
run_a(be_ctx *ctx, uint32_t others, uint32_t a_slot, uint32_t a_pos, float **logits_out,
      uint8_t **state_out)
{
    const uint32_t n = others + 1;
    be_row *rows = calloc(n, sizeof(*rows));
    float *other_logits = malloc(sizeof(float) * g_V * 8 * (others + 1));
    float *al = malloc(sizeof(float) * g_V * (1 + A_DECODE));
    int32_t a_toks[A_PROMPT];
    int32_t *otoks = malloc(sizeof(int32_t) * 16 * (others + 1));
    for (uint32_t i = 0; i < A_PROMPT; i++)
        a_toks[i] = tok_at(1, i);
    for (uint32_t s = 0; s < be_cpu_ops.n_slots(ctx); s++)
        assert_int_equal(be_cpu_ops.slot_reset(ctx, s), WK_OK);

    int32_t a_next = 0;
    for (uint32_t st = 0; st <= A_DECODE; st++) {
        uint32_t o = 0;
        for (uint32_t r = 0; r < n; r++) {
            be_row *row = &rows[r];
            if (r == a_pos) {
                row->slot = a_slot;
                row->tokens = st == 0 ? a_toks : &a_next;
                row->n_tokens = st == 0 ? A_PROMPT : 1;
                row->logits_mode = BE_LOGITS_LAST;
                row->logits = al + (size_t)st * g_V;
                continue;
            }
            /* other row o: slots after A's; a mix of kinds */
            int32_t *t = otoks + (size_t)o * 16;
            uint32_t kind = (o + st) % 4;
            uint32_t nt = kind == 0 ? 1 : kind == 1 ? 9 : kind == 2 ? 1 : 3;
            for (uint32_t i = 0; i < nt; i++)
                t[i] = tok_at(100 + o, st * 16 + i);
            row->slot = kind == 3 ? 0 : a_slot + 1 + o; /* kind 3: padding row */
            row->tokens = t;
            row->n_tokens = nt;
            row->logits_mode = kind == 1 ? BE_LOGITS_ALL : kind == 2 ? BE_LOGITS_NONE
                                                                      : BE_LOGITS_LAST;
            row->logits = row->logits_mode == BE_LOGITS_NONE
                              ? NULL
                              : other_logits + (size_t)o * g_V * 9;
            o++;
        }
        step_ok(ctx, rows, n);
        /* greedy next token for A */
        const float *l = al + (size_t)st * g_V;
        uint32_t best = 0;
        for (uint32_t i = 1; i < g_V; i++)
            if (l[i] > l[best])
                best = i;
        a_next = (int32_t)best;
    }
    *logits_out = al;
    *state_out = slot_dump(ctx, a_slot);
    free(otoks);
    free(other_logits);
    free(rows);
}

static void
test_batch_invariance(void **state)
{
    (void)state;
    for (int is = 0; is < 3; is++) {
        if (!isa_available(is))
            continue;
        isa_set(is);
        be_ctx *ctx = ctx_open(12, 2, 0, 0);
        float *l0;
        uint8_t *s0;
        run_a(ctx, 0, 1, 0, &l0, &s0);
        static const uint32_t others[] = {1, 3, 7};
        for (int k = 0; k < 3; k++) {
            for (uint32_t pos = 0; pos <= others[k]; pos += others[k]) {
                float *l;
                uint8_t *s;
                run_a(ctx, others[k], 2, pos, &l, &s);
                assert_memory_equal(l0, l, sizeof(float) * g_V * (1 + A_DECODE));
                assert_memory_equal(s0, s, g_slot_bytes);
                free(l);
                free(s);
            }
        }
        be_cpu_ops.close(ctx);

        /* other thread counts: same bits */
        static const uint32_t thr[] = {1, 3};
        for (int t = 0; t < 2; t++) {
            ctx = ctx_open(12, thr[t], 0, 0);
            float *l;
            uint8_t *s;
            run_a(ctx, 3, 1, 1, &l, &s);
            assert_memory_equal(l0, l, sizeof(float) * g_V * (1 + A_DECODE));
            assert_memory_equal(s0, s, g_slot_bytes);
            free(l);
            free(s);
            be_cpu_ops.close(ctx);
        }
        /* tiny internal passes: rows split across passes mid-prompt */
        static const char *const caps[] = {"1", "5", "23"};
        for (int t = 0; t < 3; t++) {
            setenv("WKVM_CPU_PASS_TOKENS", caps[t], 1);
            ctx = ctx_open(12, 2, 0, 0);
            unsetenv("WKVM_CPU_PASS_TOKENS");
            float *l;
            uint8_t *s;
            run_a(ctx, 7, 1, 3, &l, &s);
            assert_memory_equal(l0, l, sizeof(float) * g_V * (1 + A_DECODE));
            assert_memory_equal(s0, s, g_slot_bytes);
            free(l);
            free(s);
            be_cpu_ops.close(ctx);
        }
        free(l0);
        free(s0);
    }
    unsetenv("WKVM_CPU_ISA");
}

/* ------------------------------------------------------------------------ */
/* chunked prefill                                                           */
/* ------------------------------------------------------------------------ */

#define LONG_PROMPT 300 /* longer than one internal pass (256 tokens) */

static void
test_chunked_prefill(void **state)
{
    (void)state;
    int32_t toks[LONG_PROMPT];
    for (uint32_t i = 0; i < LONG_PROMPT; i++)
        toks[i] = tok_at(7, i);
    for (int is = 0; is < 3; is++) {
        if (!isa_available(is))
            continue;
        isa_set(is);
        be_ctx *ctx = ctx_open(4, 2, 0, 0);

        /* at once, with every position's logits */
        float *all = malloc(sizeof(float) * g_V * LONG_PROMPT);
        be_row row = {.slot = 1, .tokens = toks, .n_tokens = LONG_PROMPT,
                      .logits_mode = BE_LOGITS_ALL, .logits = all};
        step_ok(ctx, &row, 1);
        uint8_t *s_all = slot_dump(ctx, 1);

        /* chunks of 7, last logits only */
        float *last = malloc(sizeof(float) * g_V);
        for (uint32_t off = 0; off < LONG_PROMPT; off += 7) {
            uint32_t n = LONG_PROMPT - off < 7 ? LONG_PROMPT - off : 7;
            row = (be_row){.slot = 2, .tokens = toks + off, .n_tokens = n,
                           .logits_mode = off + n == LONG_PROMPT ? BE_LOGITS_LAST
                                                                 : BE_LOGITS_NONE,
                           .logits = off + n == LONG_PROMPT ? last : NULL};
            step_ok(ctx, &row, 1);
        }
        uint8_t *s_chunk = slot_dump(ctx, 2);
        assert_memory_equal(s_all, s_chunk, g_slot_bytes);
        assert_memory_equal(last, all + (size_t)(LONG_PROMPT - 1) * g_V, sizeof(float) * g_V);

        /* token by token: each position's logits equal the ALL row */
        for (uint32_t i = 0; i < LONG_PROMPT; i++) {
            row = (be_row){.slot = 3, .tokens = toks + i, .n_tokens = 1,
                           .logits_mode = BE_LOGITS_LAST, .logits = last};
            step_ok(ctx, &row, 1);
            assert_memory_equal(last, all + (size_t)i * g_V, sizeof(float) * g_V);
        }
        uint8_t *s_tok = slot_dump(ctx, 3);
        assert_memory_equal(s_all, s_tok, g_slot_bytes);

        /* the state is not trivially zero and holds finite values */
        const float *f = (const float *)s_all;
        bool nonzero = false;
        for (size_t i = 0; i < g_slot_bytes / 4; i++) {
            assert_true(isfinite(f[i]));
            nonzero = nonzero || f[i] != 0.0f;
        }
        assert_true(nonzero);
        free(s_tok);
        free(s_chunk);
        free(s_all);
        free(last);
        free(all);
        be_cpu_ops.close(ctx);
    }
    unsetenv("WKVM_CPU_ISA");
}

/* ------------------------------------------------------------------------ */
/* slots                                                                     */
/* ------------------------------------------------------------------------ */

static void
decode_one(be_ctx *ctx, uint32_t slot, int32_t tok, float *logits)
{
    be_row row = {.slot = slot, .tokens = &tok, .n_tokens = 1, .logits_mode = BE_LOGITS_LAST,
                  .logits = logits};
    step_ok(ctx, &row, 1);
}

static void
test_slot_ops(void **state)
{
    (void)state;
    be_ctx *ctx = ctx_open(5, 2, 0, 0);
    int32_t toks[10];
    for (uint32_t i = 0; i < 10; i++)
        toks[i] = tok_at(3, i);
    be_row row = {.slot = 1, .tokens = toks, .n_tokens = 10};
    step_ok(ctx, &row, 1);

    /* copy */
    assert_int_equal(be_cpu_ops.slot_copy(ctx, 2, 1), WK_OK);
    uint8_t *a = slot_dump(ctx, 1), *b = slot_dump(ctx, 2);
    assert_memory_equal(a, b, g_slot_bytes);
    float *l1 = malloc(sizeof(float) * g_V), *l2 = malloc(sizeof(float) * g_V);
    decode_one(ctx, 1, 5, l1);
    decode_one(ctx, 2, 5, l2);
    assert_memory_equal(l1, l2, sizeof(float) * g_V);

    /* write slot 1's bytes into slot 3 in odd-sized pieces, read back */
    free(a);
    a = slot_dump(ctx, 1);
    for (uint64_t off = 0; off < g_slot_bytes;) {
        size_t n = g_slot_bytes - off < 777 ? (size_t)(g_slot_bytes - off) : 777;
        assert_int_equal(be_cpu_ops.slot_write(ctx, 3, off, a + off, n), WK_OK);
        off += n;
    }
    uint8_t *c = malloc(g_slot_bytes);
    for (uint64_t off = 0; off < g_slot_bytes;) {
        size_t n = g_slot_bytes - off < 1000 ? (size_t)(g_slot_bytes - off) : 1000;
        assert_int_equal(be_cpu_ops.slot_read(ctx, 3, off, c + off, n), WK_OK);
        off += n;
    }
    assert_memory_equal(a, c, g_slot_bytes);
    decode_one(ctx, 1, 9, l1);
    decode_one(ctx, 3, 9, l2);
    assert_memory_equal(l1, l2, sizeof(float) * g_V);

    /* layout: layer 0 att_shift is the first C floats, then ffn_shift */
    const wrk_model_info *in = wrk_model_info_get(g_model);
    assert_int_equal(g_slot_bytes,
                     (uint64_t)in->n_layer *
                         (2 * in->n_embd + in->n_head * in->head_size * in->head_size) * 4);

    /* reset: zeros, and a reset slot behaves like a fresh one */
    assert_int_equal(be_cpu_ops.slot_reset(ctx, 1), WK_OK);
    free(c);
    c = slot_dump(ctx, 1);
    for (uint64_t i = 0; i < g_slot_bytes; i++)
        assert_int_equal(c[i], 0);
    decode_one(ctx, 1, 4, l1);
    decode_one(ctx, 4, 4, l2); /* slot 4 never used */
    assert_memory_equal(l1, l2, sizeof(float) * g_V);

    /* copy onto itself is a no-op */
    free(a);
    a = slot_dump(ctx, 2);
    assert_int_equal(be_cpu_ops.slot_copy(ctx, 2, 2), WK_OK);
    free(b);
    b = slot_dump(ctx, 2);
    assert_memory_equal(a, b, g_slot_bytes);

    /* bad slots and ranges */
    uint8_t buf[16];
    assert_int_equal(be_cpu_ops.slot_reset(ctx, 5), WK_EINVAL);
    assert_int_equal(be_cpu_ops.slot_reset(ctx, 0), WK_OK);
    assert_int_equal(be_cpu_ops.slot_copy(ctx, 5, 1), WK_EINVAL);
    assert_int_equal(be_cpu_ops.slot_copy(ctx, 1, 5), WK_EINVAL);
    assert_int_equal(be_cpu_ops.slot_copy(ctx, 0, 1), WK_EINVAL);
    assert_int_equal(be_cpu_ops.slot_copy(ctx, 1, 0), WK_EINVAL);
    assert_int_equal(be_cpu_ops.slot_read(ctx, 0, 0, buf, 4), WK_EINVAL);
    assert_int_equal(be_cpu_ops.slot_read(ctx, 5, 0, buf, 4), WK_EINVAL);
    assert_int_equal(be_cpu_ops.slot_read(ctx, 1, g_slot_bytes - 3, buf, 4), WK_EINVAL);
    assert_int_equal(be_cpu_ops.slot_read(ctx, 1, g_slot_bytes + 1, buf, 0), WK_EINVAL);
    assert_int_equal(be_cpu_ops.slot_read(ctx, 1, g_slot_bytes, buf, 0), WK_OK);
    assert_int_equal(be_cpu_ops.slot_read(ctx, 1, UINT64_MAX, buf, 4), WK_EINVAL);
    assert_int_equal(be_cpu_ops.slot_write(ctx, 1, g_slot_bytes - 2, buf, 4), WK_EINVAL);
    assert_int_equal(be_cpu_ops.slot_write(ctx, 1, 8, buf, SIZE_MAX), WK_EINVAL);
    assert_int_equal(be_cpu_ops.slot_write(ctx, 1, 0, NULL, 4), WK_EINVAL);
    assert_int_equal(be_cpu_ops.slot_write(ctx, 0, 0, buf, 4), WK_EINVAL);

    free(a);
    free(b);
    free(c);
    free(l1);
    free(l2);
    be_cpu_ops.close(ctx);
}

/* ------------------------------------------------------------------------ */
/* errors                                                                    */
/* ------------------------------------------------------------------------ */

static void
expect_step_err(be_ctx *ctx, be_row *rows, size_t n, wk_err err, const char *needle)
{
    uint8_t *before = slot_dump(ctx, 1);
    wk_diag d = {{0}};
    wk_err e = be_cpu_ops.step(ctx, rows, n, &d);
    if (e != err || (needle != NULL && strstr(d.msg, needle) == NULL))
        fail_msg("expected %s '%s', got %s: %s", wk_err_name(err), needle ? needle : "",
                 wk_err_name(e), d.msg);
    uint8_t *after = slot_dump(ctx, 1);
    assert_memory_equal(before, after, g_slot_bytes); /* nothing ran */
    free(before);
    free(after);
}

static void
test_step_errors(void **state)
{
    (void)state;
    be_ctx *ctx = ctx_open(4, 2, 3, 20);
    int32_t toks[30];
    for (int i = 0; i < 30; i++)
        toks[i] = i;
    float *lg = malloc(sizeof(float) * g_V * 30);
    be_row good = {.slot = 1, .tokens = toks, .n_tokens = 2, .logits_mode = BE_LOGITS_LAST,
                   .logits = lg};
    step_ok(ctx, &good, 1); /* slot 1 now has a non-zero state */

    be_row rows[4];
    rows[0] = good;
    rows[1] = good;
    rows[1].slot = 4;
    expect_step_err(ctx, rows, 2, WK_EINVAL, "row 1: slot 4");
    rows[1].slot = 1;
    expect_step_err(ctx, rows, 2, WK_EINVAL, "twice");
    rows[1].slot = 2;
    rows[1].n_tokens = 0;
    expect_step_err(ctx, rows, 2, WK_EINVAL, "row 1: no tokens");
    rows[1].n_tokens = 1;
    rows[1].tokens = NULL;
    expect_step_err(ctx, rows, 2, WK_EINVAL, "no tokens");
    int32_t bad = (int32_t)g_V;
    rows[1].tokens = &bad;
    expect_step_err(ctx, rows, 2, WK_EINVAL, "outside vocab");
    bad = -1;
    expect_step_err(ctx, rows, 2, WK_EINVAL, "outside vocab");
    rows[1].tokens = toks;
    rows[1].logits = NULL;
    expect_step_err(ctx, rows, 2, WK_EINVAL, "without a buffer");
    rows[1].logits = lg;
    rows[1].logits_mode = 7;
    expect_step_err(ctx, rows, 2, WK_EINVAL, "logits_mode");
    rows[1].logits_mode = BE_LOGITS_NONE;
    rows[1].logits = NULL; /* fine without logits */
    rows[2] = rows[1];
    rows[2].slot = 3;
    rows[3] = rows[1];
    rows[3].slot = 0;
    expect_step_err(ctx, rows, 4, WK_ETOOBIG, "rows");
    rows[1].n_tokens = 19; /* 2 + 19 > 20 */
    expect_step_err(ctx, rows, 2, WK_ETOOBIG, "tokens");
    expect_step_err(ctx, NULL, 1, WK_EINVAL, NULL);
    /* an empty step is fine */
    step_ok(ctx, rows, 0);

    /* padding rows: any number, zero logits, no effect on the others */
    rows[0] = (be_row){.slot = 0, .tokens = toks, .n_tokens = 3, .logits_mode = BE_LOGITS_ALL,
                       .logits = lg};
    rows[1] = (be_row){.slot = 0, .tokens = toks, .n_tokens = 1, .logits_mode = BE_LOGITS_LAST,
                       .logits = lg + 3 * g_V};
    for (size_t i = 0; i < 4 * g_V; i++)
        lg[i] = 1.0f;
    step_ok(ctx, rows, 2);
    for (size_t i = 0; i < 4 * g_V; i++)
        assert_true(lg[i] == 0.0f);
    be_cpu_ops.close(ctx);
    free(lg);

    /* open errors */
    be_config bc = {.n_slots = 1};
    be_ctx *c2 = NULL;
    wk_diag d = {{0}};
    assert_int_equal(be_cpu_ops.open(&bc, g_model, &c2, &d), WK_EINVAL);
    assert_null(c2);
    assert_int_equal(be_cpu_ops.open(NULL, g_model, &c2, &d), WK_EINVAL);
    be_cpu_ops.close(NULL);
}

/*
 * be_row.reset is part of the step: a step with a reset row and a refused
 * row changes no byte of the reset row's slot; accepted, the reset row runs
 * exactly as on a fresh slot (logits and state), next to other rows too.
 */
static void
test_step_reset(void **state)
{
    (void)state;
    be_ctx *ctx = ctx_open(5, 2, 3, 20);
    int32_t toks[16];
    for (uint32_t i = 0; i < 16; i++)
        toks[i] = tok_at(11, i);
    float *lg = malloc(sizeof(float) * g_V), *lf = malloc(sizeof(float) * g_V);
    be_row fill = {.slot = 1, .tokens = toks, .n_tokens = 8};
    step_ok(ctx, &fill, 1); /* slot 1 now has a non-zero state */
    fill.slot = 2;
    step_ok(ctx, &fill, 1);

    int32_t bad = (int32_t)g_V;
    be_row rows[3] = {
        {.slot = 1, .tokens = toks, .n_tokens = 3, .logits_mode = BE_LOGITS_LAST, .logits = lg,
         .reset = true},
        {.slot = 2, .tokens = &bad, .n_tokens = 1},
        {.slot = 3, .tokens = toks, .n_tokens = 1},
    };
    expect_step_err(ctx, rows, 2, WK_EINVAL, "row 1: token"); /* slot 1 unchanged */
    rows[1] = (be_row){.slot = 2, .tokens = toks, .n_tokens = 8, .reset = true};
    rows[2].n_tokens = 10; /* 3 + 8 + 10 > 20 */
    expect_step_err(ctx, rows, 3, WK_ETOOBIG, "tokens");
    rows[2].slot = 1; /* a duplicate after the reset row */
    rows[2].n_tokens = 1;
    expect_step_err(ctx, rows, 3, WK_EINVAL, "twice");

    /* accepted: slot 1 runs as fresh slot 4 does, next to a reset and a plain row */
    rows[1] = (be_row){.slot = 2, .tokens = toks + 3, .n_tokens = 2, .reset = true};
    rows[2] = (be_row){.slot = 0, .tokens = toks, .n_tokens = 1, .reset = true}; /* padding */
    step_ok(ctx, rows, 3);
    be_row fresh = rows[0];
    fresh.slot = 4;
    fresh.reset = false;
    fresh.logits = lf;
    step_ok(ctx, &fresh, 1);
    assert_memory_equal(lg, lf, sizeof(float) * g_V);
    uint8_t *a = slot_dump(ctx, 1), *b = slot_dump(ctx, 4);
    assert_memory_equal(a, b, g_slot_bytes);
    free(a);
    free(b);
    /* slot 2: reset then 2 tokens, as slot 3 (never used) fed the same */
    be_row r3 = {.slot = 3, .tokens = toks + 3, .n_tokens = 2};
    step_ok(ctx, &r3, 1);
    a = slot_dump(ctx, 2);
    b = slot_dump(ctx, 3);
    assert_memory_equal(a, b, g_slot_bytes);
    free(a);
    free(b);

    free(lg);
    free(lf);
    be_cpu_ops.close(ctx);
}

/* WKVM_CPU_ISA caps the path; what runs is what describe reports: the
 * request, or the CPU's best when it asks for more (never the request). */
static void
test_isa_reported(void **state)
{
    (void)state;
    for (int is = 0; is < 3; is++) {
        isa_set(is);
        int want = is < isa_hw_best() ? is : isa_hw_best();
        assert_int_equal((int)be_cpu_isa_detect(), want);
        be_ctx *ctx = ctx_open(2, 1, 0, 0);
        char desc[256] = "", tag[32];
        be_cpu_ops.describe(ctx, desc, sizeof(desc));
        snprintf(tag, sizeof(tag), "isa=%s ", g_isas[want]);
        if (strstr(desc, tag) == NULL)
            fail_msg("WKVM_CPU_ISA=%s: describe says '%s', want %s", g_isas[is], desc, tag);
        be_cpu_ops.close(ctx);
    }
    unsetenv("WKVM_CPU_ISA");
}

static void
test_ops_lookup(void **state)
{
    (void)state;
    assert_ptr_equal(be_ops_find("cpu"), &be_cpu_ops);
    assert_null(be_ops_find("tpu"));
    assert_null(be_ops_find(NULL));
    assert_non_null(be_ops_find("auto"));
    assert_ptr_equal(be_ops_find("cuda"), be_cuda_ops_get());
    char name[128];
    uint64_t mem = 0;
    assert_int_equal(be_cpu_ops.probe(0, name, sizeof(name), &mem), WK_OK);
    assert_true(mem > 0);
    assert_true(name[0] != '\0');
    be_ctx *ctx = ctx_open(2, 1, 0, 0);
    char desc[256] = "";
    be_cpu_ops.describe(ctx, desc, sizeof(desc));
    assert_non_null(strstr(desc, "isa="));
    be_cpu_ops.close(ctx);
}

/*
 * The vectorised gates (be_cpu_silu and friends): within a few ulp of the
 * float64 values over the whole range (big and tiny, +-0, +-Inf, NaN kept),
 * a value's result the same bits wherever it sits (every offset of an
 * array whose length is not a multiple of 8) and on every ISA path.
 */
static double
gate_ref(int kind, double a, double b)
{
    const double s = 1.0 / (1.0 + exp(-a));
    switch (kind) {
    case 0:
        return a * s;
    case 1:
        return a * s * b;
    case 2:
        return b * (a * s);
    default:
        return b * s;
    }
}

static void
gate_apply(be_cpu_isa isa, int kind, float *a, float *b, size_t n)
{
    switch (kind) {
    case 0:
        be_cpu_silu(isa, a, n);
        break;
    case 1:
        be_cpu_silu_mul(isa, a, b, n);
        break;
    case 2:
        be_cpu_mul_silu(isa, b, a, n); /* b = b * silu(a): the result in b */
        break;
    default:
        be_cpu_mul_sigmoid(isa, b, a, n);
        break;
    }
}

static void
test_gates(void **state)
{
    (void)state;
    enum { N = 4099 };
    float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    float *a0 = malloc(sizeof(float) * N), *b0 = malloc(sizeof(float) * N);
    assert_true(a != NULL && b != NULL && a0 != NULL && b0 != NULL);
    uint64_t r = 12345;
    for (size_t i = 0; i < N; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const double u = (double)(r >> 11) / 9007199254740992.0;
        a0[i] = (float)((u * 2.0 - 1.0) * (i % 7 == 0 ? 120.0 : 12.0));
        b0[i] = (float)(1.5 - u * 3.0);
    }
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, 88.7f, 88.73f, -87.3f, -87.4f,
                             -104.0f, 1e-30f, -1e-30f, 20.0f};
    memcpy(a0, special, sizeof(special));
    const be_cpu_isa isa = BE_CPU_ISA_SCALAR, best = (be_cpu_isa)isa_hw_best();
    for (int kind = 0; kind < 4; kind++) {
        memcpy(a, a0, sizeof(float) * N);
        memcpy(b, b0, sizeof(float) * N);
        gate_apply(isa, kind, a, b, N);
        const float *got = kind < 2 ? a : b;
        if (best != BE_CPU_ISA_SCALAR) { /* the vector path: the same bits */
            float *va = malloc(sizeof(float) * N), *vb = malloc(sizeof(float) * N);
            assert_true(va != NULL && vb != NULL);
            memcpy(va, a0, sizeof(float) * N);
            memcpy(vb, b0, sizeof(float) * N);
            gate_apply(best, kind, va, vb, N);
            if (memcmp(kind < 2 ? va : vb, got, sizeof(float) * N) != 0)
                fail_msg("gate %d: ISA %d differs from the portable path", kind, (int)best);
            free(va);
            free(vb);
        }
        for (size_t i = 0; i < N; i++) {
            const double want = gate_ref(kind, a0[i], b0[i]);
            if (isnan(want) || isinf(want)) {
                if (!(isnan(want) ? isnan(got[i]) : got[i] == (float)want))
                    fail_msg("gate %d of %g: %g, want %g", kind, (double)a0[i], (double)got[i],
                             want);
                continue;
            }
            if (fabs(got[i] - want) > 4e-7 * fabs(want) + 1e-35) /* expf overflows past 88.72 too */
                fail_msg("gate %d of %g (x %g): %.9g, float64 %.9g", kind, (double)a0[i],
                         (double)b0[i], (double)got[i], want);
        }
        for (size_t off = 1; off < 17; off++) { /* the same values shifted: the same bits */
            float *sa = malloc(sizeof(float) * (N + off)), *sb = malloc(sizeof(float) * (N + off));
            assert_true(sa != NULL && sb != NULL);
            memset(sa, 0, sizeof(float) * off);
            memset(sb, 0, sizeof(float) * off);
            memcpy(sa + off, a0, sizeof(float) * N);
            memcpy(sb + off, b0, sizeof(float) * N);
            gate_apply(best, kind, sa, sb, N + off);
            if (memcmp((kind < 2 ? sa : sb) + off, got, sizeof(float) * N) != 0)
                fail_msg("gate %d: the bits depend on the offset (%zu)", kind, off);
            free(sa);
            free(sb);
        }
    }
    float nan1 = NAN;
    be_cpu_silu(BE_CPU_ISA_SCALAR, &nan1, 1);
    assert_true(isnan(nan1));
    free(a);
    free(b);
    free(a0);
    free(b0);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gates),
        cmocka_unit_test(test_gemm_kernels),
        cmocka_unit_test(test_gemm_q8_0),
        cmocka_unit_test(test_gemm_amx),
        cmocka_unit_test(test_gemm_dp),
        cmocka_unit_test(test_dp_ref),
        cmocka_unit_test(test_wkv_kernel),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_slot_ops),
        cmocka_unit_test(test_step_errors),
        cmocka_unit_test(test_step_reset),
        cmocka_unit_test(test_isa_reported),
        cmocka_unit_test(test_ops_lookup),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
