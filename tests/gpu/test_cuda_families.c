/*
 * GPU suite: the CUDA layer-list step (RWKV-7, Mamba2, Gated DeltaNet,
 * Qwen3.5, Nemotron-H, Granite-4.0-H) against the CPU reference backend, on
 * the model directories given as arguments (written by
 * run_cuda_families.py with tests/reference/gen_mamba2.py, gen_gdn.py,
 * gen_qwen35.py, gen_nemotron_h.py, gen_granite_h.py and gen_model.py; any family with a
 * CUDA step works). For each model:
 *   - one mixed step (a prefill with every position's logits, a one-token
 *     row, a padding row, a long prefill) gives the CPU's logits and slot
 *     states within max|diff|/std < 1e-3; padding logits are zeros;
 *   - the same step twice on fresh slots gives identical bits;
 *   - the long prompt prefilled in chunks of 7 and token by token ends at
 *     the CPU's logits and state (to GEMM rounding: see be_cuda_gdn.c);
 *   - batched decode steps follow the CPU;
 *   - a CPU slot image written into a CUDA slot continues like the CPU
 *     (hibernate on one backend, resume on the other);
 *   - refused steps (duplicate slot, token outside the vocab, missing
 *     logits buffer, too many rows or tokens) change no slot;
 *   - small passes (WKVM_CUDA_PASS_TOKENS=5: rows cut across passes) give
 *     the CPU's results.
 * Hybrid models (attention layers, kv_token_bytes > 0) run the same checks
 * on whole slot images (the fixed part, then the KV through the page
 * table; both backends must report the same sizes and pool geometry), the
 * resumed image is resized and written in odd-sized chunks (starting mid
 * token) and read back the same way, a device slot copy is bit-identical,
 * and a context with a 4-page pool refuses a step, a copy and a resize it
 * cannot hold with WK_EQUOTA, changing nothing.
 * An argument `refuse:DIR` instead requires the CUDA backend to refuse
 * opening DIR's model with WK_ENOTSUP.
 * `test_cuda_families --probe` exits 0 when a CUDA backend and device
 * answer and 77 (meson's skip) otherwise; so does a run without one.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "gpu_gate.h"
#include "wrk_model.h"

#define TOL 1e-3  /* max|diff| / std(reference), as the parity test */
#define N_SLOTS 8 /* arena slots incl. 0 */
#define LONG 40   /* tokens of the long prompt */

static int g_fail;
static int g_checks;

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

typedef struct pair {
    const be_ops *cpu, *cu; /* backends */
    be_ctx *a, *b;          /* CPU and CUDA contexts */
    uint32_t V;             /* vocab */
    uint64_t sb;            /* slot bytes (the fixed part) */
    bool hybrid;            /* attention layers: slot images carry KV */
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

/* The bytes of slot's image now (slot_size, or slot_bytes for fixed-size families). */
static uint64_t
img_size(const be_ops *ops, be_ctx *ctx, uint32_t slot)
{
    return ops->slot_size != NULL ? ops->slot_size(ctx, slot) : ops->slot_bytes(ctx);
}

/* The whole image of slot (its size in *n when n is not NULL); caller frees. */
static float *
slot_get_n(const be_ops *ops, be_ctx *ctx, uint32_t slot, uint64_t *n)
{
    const uint64_t len = img_size(ops, ctx, slot);
    float *s = malloc(len ? len : 1);
    if (s != NULL && ops->slot_read(ctx, slot, 0, s, len) != WK_OK) {
        free(s);
        return NULL;
    }
    if (n != NULL)
        *n = len;
    return s;
}

/* Slot states of the two backends agree (relative to the CPU state's spread). */
static void
check_states(pair *p, uint32_t slot_a, uint32_t slot_b, const char *what)
{
    uint64_t na = 0, nb = 0;
    float *sa = slot_get_n(p->cpu, p->a, slot_a, &na);
    float *sb = slot_get_n(p->cu, p->b, slot_b, &nb);
    CHECK(sa != NULL && sb != NULL, "%s: slot read", what);
    CHECK(na == nb, "%s: image sizes cpu slot %u %llu vs cuda slot %u %llu", what, slot_a,
          (unsigned long long)na, slot_b, (unsigned long long)nb);
    if (sa != NULL && sb != NULL && na == nb) {
        double r = rel_diff(sa, sb, na / 4);
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
                    .device = 0,
                    .max_step_rows = max_rows,
                    .max_step_tokens = max_tokens};
    be_ctx *ctx = NULL;
    wk_diag d = {{0}};
    wk_err e = ops->open(&bc, m, &ctx, &d);
    CHECK(e == WK_OK, "%s open: %s: %s", ops->name, wk_err_name(e), d.msg);
    return e == WK_OK ? ctx : NULL;
}

/*
 * Hybrid models: a 4-page pool (64 tokens). Slot 1 takes 3 pages; a step
 * whose rows need 2 more is refused whole with WK_EQUOTA naming row 1, and
 * so are a copy of slot 1 and a resize past the pool; nothing changes.
 */
static void
pool_full(const be_ops *cu, const wrk_model *m, const char *name)
{
    be_config bc = {.n_slots = N_SLOTS,
                    .n_threads = 2,
                    .device = 0,
                    .max_step_rows = 8,
                    .max_step_tokens = 512,
                    .kv_pages = 4};
    be_ctx *c = NULL;
    wk_diag d = {{0}};
    wk_err e = cu->open(&bc, m, &c, &d);
    CHECK(e == WK_OK, "%s: pool-full open: %s: %s", name, wk_err_name(e), d.msg);
    if (e != WK_OK)
        return;
    const uint32_t V = wrk_model_info_get(m)->vocab_size;
    be_kv_info ki = {0};
    cu->kv_info(c, &ki);
    CHECK(ki.pages_total == 4 && ki.page_tokens == 16, "%s: pool of %u pages of %u", name,
          ki.pages_total, ki.page_tokens);
    int32_t t[40];
    for (uint32_t i = 0; i < 40; i++)
        t[i] = tok_at(V, 5, i);
    be_row r1 = {.slot = 1, .tokens = t, .n_tokens = 40};
    step(cu, c, &r1, 1, "pool fill");
    cu->kv_info(c, &ki);
    CHECK(ki.pages_free == 1, "%s: %u pages free after 40 tokens, want 1", name, ki.pages_free);
    uint64_t n1 = 0, n1b = 0;
    float *before = slot_get_n(cu, c, 1, &n1);
    be_row rows[2] = {{.slot = 2, .tokens = t, .n_tokens = 10},
                      {.slot = 3, .tokens = t, .n_tokens = 5}};
    d.msg[0] = '\0';
    e = cu->step(c, rows, 2, &d);
    CHECK(e == WK_EQUOTA && strstr(d.msg, "row 1") != NULL, "%s: full pool step gave %s (%s)", name,
          wk_err_name(e), d.msg);
    const uint64_t sb = cu->slot_bytes(c);
    CHECK(cu->slot_size(c, 2) == sb && cu->slot_size(c, 3) == sb, "%s: refused step grew a slot",
          name);
    CHECK(cu->slot_copy(c, 2, 1) == WK_EQUOTA, "%s: copy into a full pool", name);
    CHECK(cu->slot_size(c, 2) == sb, "%s: refused copy grew slot 2", name);
    const uint64_t tb = ki.kv_token_bytes;
    CHECK(cu->slot_resize(c, 2, sb + 17 * tb) == WK_EQUOTA, "%s: resize past the pool", name);
    CHECK(cu->slot_resize(c, 2, sb + 65 * tb) == WK_EINVAL, "%s: resize past the whole pool", name);
    CHECK(cu->slot_resize(c, 2, sb + 3) == WK_EINVAL, "%s: resize to a partial token", name);
    cu->kv_info(c, &ki);
    CHECK(ki.pages_free == 1, "%s: refusals took pages (%u free)", name, ki.pages_free);
    float *after = slot_get_n(cu, c, 1, &n1b);
    CHECK(before != NULL && after != NULL && n1 == n1b && memcmp(before, after, n1) == 0,
          "%s: refusals changed slot 1", name);
    /* what fits still runs, and a reset gives every page back */
    be_row ok = {.slot = 2, .tokens = t, .n_tokens = 16};
    step(cu, c, &ok, 1, "pool last page");
    CHECK(cu->slot_reset(c, 1) == WK_OK && cu->slot_reset(c, 2) == WK_OK, "%s: resets", name);
    cu->kv_info(c, &ki);
    CHECK(ki.pages_free == 4, "%s: %u pages free after resets, want 4", name, ki.pages_free);
    free(before);
    free(after);
    cu->close(c);
}

static void
run_model(const be_ops *cu, const char *dir)
{
    const char *name = dir; /* label */
    wrk_model *m = NULL;
    wk_diag d = {{0}};
    wrk_model_opts mo = {0};
    wk_err e = wrk_model_load(dir, &mo, &m, &d);
    CHECK(e == WK_OK, "%s: load: %s", name, d.msg);
    if (e != WK_OK)
        return;
    pair p = {.cpu = &be_cpu_ops,
              .cu = cu,
              .V = wrk_model_info_get(m)->vocab_size,
              .sb = wrk_model_info_get(m)->state_bytes,
              .hybrid = wrk_model_info_get(m)->kv_token_bytes > 0};
    const uint32_t V = p.V;
    unsetenv("WKVM_CUDA_PASS_TOKENS");
    p.a = open_ctx(&be_cpu_ops, m, 8, 512);
    p.b = open_ctx(cu, m, 8, 512);
    if (p.a == NULL || p.b == NULL)
        goto done;
    char desc[256] = "";
    if (cu->describe != NULL)
        cu->describe(p.b, desc, sizeof(desc));
    printf("%s: %s\n", name, desc);
    if (p.hybrid) {
        be_kv_info ka = {0}, kb = {0};
        CHECK(cu->slot_size != NULL && cu->slot_resize != NULL && cu->kv_info != NULL,
              "%s: cuda hybrid ops missing", name);
        if (cu->kv_info != NULL)
            cu->kv_info(p.b, &kb);
        be_cpu_ops.kv_info(p.a, &ka);
        CHECK(kb.kv_token_bytes == wrk_model_info_get(m)->kv_token_bytes &&
                  kb.page_tokens == ka.page_tokens && kb.pages_total == ka.pages_total &&
                  kb.pages_free == kb.pages_total,
              "%s: kv_info cuda %llu/%u/%u/%u vs cpu %llu/%u/%u", name,
              (unsigned long long)kb.kv_token_bytes, kb.page_tokens, kb.pages_total, kb.pages_free,
              (unsigned long long)ka.kv_token_bytes, ka.page_tokens, ka.pages_total);
    }

    float *cpu_out[4] = {0}, *cu_out[4] = {0}, *cu_again[4] = {0};

    /* 1. the mixed step */
    reset_all(&p, p.b);
    mixed_step(&p, p.b, cu_out, cpu_out, true, "mixed");
    CHECK(rel_diff(cpu_out[0], cu_out[0], (size_t)13 * V) < TOL, "%s: ALL logits %.3e", name,
          rel_diff(cpu_out[0], cu_out[0], (size_t)13 * V));
    CHECK(rel_diff(cpu_out[1], cu_out[1], V) < TOL, "%s: one-token logits %.3e", name,
          rel_diff(cpu_out[1], cu_out[1], V));
    CHECK(rel_diff(cpu_out[3], cu_out[3], V) < TOL, "%s: long-prefill logits %.3e", name,
          rel_diff(cpu_out[3], cu_out[3], V));
    bool zeros = true;
    for (size_t j = 0; j < (size_t)2 * V; j++)
        zeros = zeros && cu_out[2][j] == 0.0f;
    CHECK(zeros, "%s: padding logits are zeros", name);
    for (uint32_t s = 1; s <= 3; s++)
        check_states(&p, s, s, name);

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
              "%s: repeat run output %d not bit-identical", name, i);

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
        CHECK(rel_diff(cpu_out[3], l7, V) < TOL, "%s: chunks of 7 vs CPU %.3e", name,
              rel_diff(cpu_out[3], l7, V));
        CHECK(rel_diff(cpu_out[3], l1, V) < TOL, "%s: token by token vs CPU %.3e", name,
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
                CHECK(rel_diff(la[i], lb[i], V) < TOL, "%s: decode %u row %d: %.3e", name, it, i,
                      rel_diff(la[i], lb[i], V));
        }
        for (uint32_t s = 1; s <= 3; s++)
            check_states(&p, s, s, "after decode");

        /* 6. a CPU slot image resumed on the device continues like the CPU */
        uint64_t in = 0;
        float *img = slot_get_n(&be_cpu_ops, p.a, 2, &in);
        CHECK(img != NULL, "cpu image read");
        if (img != NULL && cu->slot_resize != NULL)
            CHECK(cu->slot_resize(p.b, 6, in) == WK_OK, "resize slot 6 to %llu",
                  (unsigned long long)in);
        CHECK(img_size(cu, p.b, 6) == in, "slot 6 size %llu, want %llu",
              (unsigned long long)img_size(cu, p.b, 6), (unsigned long long)in);
        if (img != NULL && p.hybrid) {
            /* odd chunks: every write after the first starts inside a token */
            const uint8_t *b = (const uint8_t *)img;
            for (uint64_t off = 0; off < in; off += 997) {
                size_t n = in - off < 997 ? (size_t)(in - off) : 997;
                CHECK(cu->slot_write(p.b, 6, off, b + off, n) == WK_OK, "chunk write at %llu",
                      (unsigned long long)off);
            }
            uint8_t *back = malloc(in);
            for (uint64_t off = 0; back != NULL && off < in; off += 333) {
                size_t n = in - off < 333 ? (size_t)(in - off) : 333;
                CHECK(cu->slot_read(p.b, 6, off, back + off, n) == WK_OK, "chunk read at %llu",
                      (unsigned long long)off);
            }
            CHECK(back != NULL && memcmp(back, img, in) == 0, "%s: chunked image round trip", name);
            free(back);
            uint8_t one;
            CHECK(cu->slot_read(p.b, 6, in, &one, 1) == WK_EINVAL, "read past the image");
        } else if (img != NULL) {
            CHECK(cu->slot_write(p.b, 6, 0, img, in) == WK_OK, "image write");
        }
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
        CHECK(rel_diff(la[0], lb[0], V) < TOL, "%s: resumed image %.3e", name,
              rel_diff(la[0], lb[0], V));
        check_states(&p, 2, 6, "resumed");

        /* a device fork is the same image, bit for bit */
        CHECK(cu->slot_copy(p.b, 7, 6) == WK_OK, "slot copy 6 -> 7");
        uint64_t n6 = 0, n7 = 0;
        float *i6 = slot_get_n(cu, p.b, 6, &n6), *i7 = slot_get_n(cu, p.b, 7, &n7);
        CHECK(i6 != NULL && i7 != NULL && n6 == n7 && memcmp(i6, i7, n6) == 0,
              "%s: slot copy differs", name);
        free(i6);
        free(i7);
        free(img);
        for (int i = 0; i < 3; i++) {
            free(la[i]);
            free(lb[i]);
        }
    }

    /* 7. refusals change nothing */
    {
        uint64_t nbefore = 0, nafter = 0;
        float *before = slot_get_n(cu, p.b, 1, &nbefore), *after = NULL;
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
        after = slot_get_n(cu, p.b, 1, &nafter);
        CHECK(before != NULL && after != NULL && nbefore == nafter &&
                  memcmp(before, after, nbefore) == 0,
              "%s: refused steps changed slot 1", name);
        free(before);
        free(after);
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
                  "%s: small passes ALL logits %.3e", name,
                  rel_diff(cpu_out[0], sm_out[0], (size_t)13 * V));
            CHECK(rel_diff(cpu_out[3], sm_out[3], V) < TOL, "%s: small passes long %.3e", name,
                  rel_diff(cpu_out[3], sm_out[3], V));
            for (uint32_t s = 1; s <= 3; s++) {
                uint64_t na = 0, nb = 0;
                float *sa = slot_get_n(&be_cpu_ops, p.a, s, &na);
                float *sb = slot_get_n(cu, small, s, &nb);
                CHECK(sa != NULL && sb != NULL && na == nb && rel_diff(sa, sb, na / 4) < TOL,
                      "%s: small passes state slot %u", name, s);
                free(sa);
                free(sb);
            }
            for (int i = 0; i < 4; i++)
                free(sm_out[i]);
            cu->close(small);
        }
    }

    if (p.hybrid)
        pool_full(cu, m, name);

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
}

/* The CUDA backend must refuse to open dir's model with WK_ENOTSUP and a message. */
static void
run_refusal(const be_ops *cu, const char *dir)
{
    wrk_model *m = NULL;
    wk_diag d = {{0}};
    wrk_model_opts mo = {0};
    wk_err e = wrk_model_load(dir, &mo, &m, &d);
    CHECK(e == WK_OK, "%s: load: %s", dir, d.msg);
    if (e != WK_OK)
        return;
    be_config bc = {.n_slots = N_SLOTS, .n_threads = 2, .device = 0};
    be_ctx *ctx = NULL;
    wk_diag od = {{0}};
    e = cu->open(&bc, m, &ctx, &od);
    CHECK(e == WK_ENOTSUP && ctx == NULL && od.msg[0] != '\0',
          "%s: cuda open gave %s (%s), want WK_ENOTSUP", dir, wk_err_name(e), od.msg);
    printf("%s: refused: %s\n", dir, od.msg);
    if (e == WK_OK)
        cu->close(ctx);
    wrk_model_free(m);
}

int
main(int argc, char **argv)
{
    const be_ops *cu = be_cuda_ops_get();
    char dev[128];
    uint64_t mem = 0;
    const int gate = gpu_gate_probe(cu, dev, sizeof(dev), &mem);
    if (gate >= 0)
        return gate;
    if (argc > 1 && strcmp(argv[1], "--probe") == 0) {
        printf("device: %s, %llu MiB\n", dev, (unsigned long long)(mem >> 20));
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: %s --probe | MODEL_DIR...\n", argv[0]);
        return 2;
    }
    printf("device: %s, %llu MiB\n", dev, (unsigned long long)(mem >> 20));
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "refuse:", 7) == 0)
            run_refusal(cu, argv[i] + 7);
        else
            run_model(cu, argv[i]);
    }
    printf("%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
