/*
 * be_cpu_attn: blocks of queries over a paged KV pool. Every available ISA
 * path gives the same bits; a query's output has the same bits alone and in
 * any block; positions past a query's own (non-finite K / V of the block's
 * later tokens included) never reach it; and the result is softmax attention
 * (a float64 reference).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be_cpu_attn.h"
#include "isa_hw.h"

#define PT 16u     /* tokens per page */
#define NPAGES 64u /* pool pages (1,024 positions: several V-sum spans of 256) */
#define HKV 2u     /* KV heads in a token row */

typedef struct pool {
    be_kv kv;
    be_kv_slot slots[2];
    uint32_t pages[NPAGES];
    uint32_t Da;
} pool;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static float
frand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* A pool of NPAGES pages of random K / V; slot 1 holds n tokens on pages in a shuffled order. */
static void
pool_init(pool *p, uint32_t Da, uint32_t n)
{
    memset(p, 0, sizeof(*p));
    p->Da = Da;
    p->kv.tok_floats = (size_t)HKV * 2 * Da;
    p->kv.page_tokens = PT;
    p->kv.pages_total = NPAGES;
    p->kv.n_slots = 2;
    p->kv.slots = p->slots;
    const size_t floats = (size_t)NPAGES * PT * p->kv.tok_floats;
    p->kv.pool = malloc(sizeof(float) * floats);
    assert_non_null(p->kv.pool);
    for (size_t i = 0; i < floats; i++)
        p->kv.pool[i] = NAN; /* every byte the slot does not hold: a read of it shows */
    for (uint32_t i = 0; i < NPAGES; i++)
        p->pages[i] = (i * 7 + 3) % NPAGES; /* 7 is prime to 64: a permutation */
    assert_true(n <= NPAGES * PT);
    for (uint32_t pos = 0; pos < n; pos++) {
        float *row = p->kv.pool + ((size_t)p->pages[pos / PT] * PT + pos % PT) * p->kv.tok_floats;
        for (size_t i = 0; i < p->kv.tok_floats; i++)
            row[i] = frand();
    }
    p->slots[1].n_ctx = n;
    p->slots[1].n_pages = (n + PT - 1) / PT;
    p->slots[1].cap = NPAGES;
    p->slots[1].pages = p->pages;
}

static float *
pool_tok(pool *p, uint32_t pos)
{
    return p->kv.pool + ((size_t)p->pages[pos / PT] * PT + pos % PT) * p->kv.tok_floats;
}

/*
 * A block of nt tokens at positions pos0.. times nh query heads of KV head
 * g (query i: token i / nh, head i % nh), queries from qs (nt * nh * Da).
 */
static void
blk_fill(be_cpu_attn_blk *b, pool *p, uint32_t g, uint32_t pos0, uint32_t nt, uint32_t nh,
         const float *qs, float *os)
{
    memset(b, 0, sizeof(*b));
    b->kv = &p->kv;
    b->slot = 1;
    b->koff = (size_t)g * 2 * p->Da;
    b->voff = b->koff + p->Da;
    b->Da = p->Da;
    b->scale = 1.0f / sqrtf((float)p->Da);
    b->nq = nt * nh;
    for (uint32_t i = 0; i < b->nq; i++) {
        b->q[i] = qs + (size_t)i * p->Da;
        b->o[i] = os + (size_t)i * p->Da;
        b->nn[i] = pos0 + i / nh + 1;
    }
}

static float *
scratch(uint32_t n_keys, uint32_t Da)
{
    const size_t n = be_cpu_attn_scr_floats(n_keys, Da);
    float *s = aligned_alloc(64, (sizeof(float) * n + 63) / 64 * 64);
    assert_non_null(s);
    for (size_t i = 0; i < n; i++)
        s[i] = NAN; /* nothing may read scratch it did not write */
    return s;
}

static float *
qrand(size_t n)
{
    float *q = malloc(sizeof(float) * n);
    assert_non_null(q);
    for (size_t i = 0; i < n; i++)
        q[i] = frand() * 3.0f;
    return q;
}

/* float64 softmax attention of query q over positions 0..nn-1 of KV head g. */
static void
ref_query(pool *p, uint32_t g, const float *q, uint32_t nn, float scale, double *out)
{
    const uint32_t Da = p->Da;
    double *s = malloc(sizeof(double) * nn), mx = -INFINITY, sum = 0.0;
    assert_non_null(s);
    for (uint32_t j = 0; j < nn; j++) {
        const float *k = pool_tok(p, j) + (size_t)g * 2 * Da;
        double a = 0.0;
        for (uint32_t d = 0; d < Da; d++)
            a += (double)q[d] * k[d];
        s[j] = a * scale;
        mx = s[j] > mx ? s[j] : mx;
    }
    for (uint32_t d = 0; d < Da; d++)
        out[d] = 0.0;
    for (uint32_t j = 0; j < nn; j++) {
        const double e = exp(s[j] - mx);
        const float *v = pool_tok(p, j) + (size_t)g * 2 * Da + Da;
        sum += e;
        for (uint32_t d = 0; d < Da; d++)
            out[d] += e * v[d];
    }
    for (uint32_t d = 0; d < Da; d++)
        out[d] /= sum;
    free(s);
}

/*
 * The shapes: head dims with and without vector tails (not a multiple of 4,
 * of 16, past one register tile of dims), blocks of 1..64 queries (up to 4:
 * the decode kernels; a query alone there, in a block the lanes-over-queries
 * ones, with lane groups of one vector and of two), contexts of one page to
 * 1,024 positions.
 */
static const struct {
    uint32_t Da, pos0, nt, nh;
} g_cases[] = {
    {64, 0, 1, 1},    {64, 0, 16, 2},   {64, 37, 32, 2},  {40, 5, 3, 1},   {40, 100, 17, 3},
    {128, 200, 8, 8}, {128, 300, 1, 2}, {24, 150, 64, 1}, {128, 64, 16, 4}, {8, 0, 21, 3},
    {18, 33, 2, 2},   {130, 70, 5, 4},  {6, 10, 4, 1},   {130, 90, 1, 4}, {258, 3, 9, 2},
    {64, 20, 1, 8},   {40, 9, 5, 2},    {72, 3, 20, 2},  {33, 7, 5, 1},   {96, 40, 40, 1},
    /* long contexts: several spans of the V sums, a block across a span's end, the lane
       groups' last positions on both sides of it, a partial last span */
    {64, 700, 20, 2}, {40, 500, 33, 1}, {128, 250, 12, 2}, {24, 1000, 24, 1}, {130, 767, 2, 16},
};

static void
test_reference(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof(g_cases) / sizeof(g_cases[0]); c++) {
        pool p;
        const uint32_t Da = g_cases[c].Da, nt = g_cases[c].nt, nh = g_cases[c].nh;
        pool_init(&p, Da, g_cases[c].pos0 + nt);
        float *qs = qrand((size_t)nt * nh * Da), *os = malloc(sizeof(float) * nt * nh * Da);
        double *ref = malloc(sizeof(double) * Da);
        float *scr = scratch(g_cases[c].pos0 + nt, Da);
        assert_true(os != NULL && ref != NULL);
        be_cpu_attn_blk b;
        blk_fill(&b, &p, 1, g_cases[c].pos0, nt, nh, qs, os);
        be_cpu_attn_pick((be_cpu_isa)isa_hw_best())(&b, scr);
        for (uint32_t i = 0; i < b.nq; i++) {
            ref_query(&p, 1, b.q[i], b.nn[i], b.scale, ref);
            for (uint32_t d = 0; d < Da; d++)
                if (fabs(b.o[i][d] - ref[d]) > 2e-6 * (1.0 + fabs(ref[d])))
                    fail_msg("case %zu query %u dim %u: %.9g, float64 %.9g", c, i, d,
                             (double)b.o[i][d], ref[d]);
        }
        free(scr);
        free(ref);
        free(os);
        free(qs);
        free(p.kv.pool);
    }
}

/* Every path the CPU has, the same bits; each query alone, the same bits as in the block. */
static void
test_paths_and_blocks_agree(void **state)
{
    (void)state;
    const be_cpu_isa isas[] = {BE_CPU_ISA_SCALAR, BE_CPU_ISA_AVX2, BE_CPU_ISA_AVX512};
    const int best = isa_hw_best();
    if (best < 2)
        printf("ISA comparison limited to the paths this CPU has (best: %d)\n", best);
    for (size_t c = 0; c < sizeof(g_cases) / sizeof(g_cases[0]); c++) {
        pool p;
        const uint32_t Da = g_cases[c].Da, nt = g_cases[c].nt, nh = g_cases[c].nh;
        const uint32_t nq = nt * nh;
        pool_init(&p, Da, g_cases[c].pos0 + nt);
        float *qs = qrand((size_t)nq * Da);
        float *want = malloc(sizeof(float) * nq * Da), *got = malloc(sizeof(float) * nq * Da);
        float *scr = scratch(g_cases[c].pos0 + nt, Da);
        assert_true(want != NULL && got != NULL);
        be_cpu_attn_blk b;
        blk_fill(&b, &p, 0, g_cases[c].pos0, nt, nh, qs, want);
        be_cpu_attn_pick(BE_CPU_ISA_SCALAR)(&b, scr);
        for (int is = 1; is <= best; is++) {
            memset(got, 0xff, sizeof(float) * nq * Da);
            blk_fill(&b, &p, 0, g_cases[c].pos0, nt, nh, qs, got);
            be_cpu_attn_pick(isas[is])(&b, scr);
            if (memcmp(want, got, sizeof(float) * nq * Da) != 0)
                fail_msg("case %zu: ISA path %d differs from the portable one", c, is);
        }
        for (int is = 0; is <= best; is++)
            for (uint32_t i = 0; i < nq; i++) { /* alone: one query, its own nn */
                be_cpu_attn_blk one;
                blk_fill(&one, &p, 0, g_cases[c].pos0 + i / nh, 1, 1, qs + (size_t)i * Da,
                         got + (size_t)i * Da);
                memset(got + (size_t)i * Da, 0xff, sizeof(float) * Da);
                be_cpu_attn_pick(isas[is])(&one, scr);
                if (memcmp(want + (size_t)i * Da, got + (size_t)i * Da, sizeof(float) * Da) != 0)
                    fail_msg("case %zu ISA %d: query %u alone differs from it in the block", c,
                             is, i);
            }
        free(scr);
        free(got);
        free(want);
        free(qs);
        free(p.kv.pool);
    }
}

/* NaN / Inf in the K and V of the block's last token reach no earlier query. */
static void
later_masked(uint32_t nt, uint32_t nh)
{
    const uint32_t Da = 48, pos0 = 40, nq = nt * nh;
    const int best = isa_hw_best();
    const be_cpu_isa isas[] = {BE_CPU_ISA_SCALAR, BE_CPU_ISA_AVX2, BE_CPU_ISA_AVX512};
    pool p;
    pool_init(&p, Da, pos0 + nt);
    float *qs = qrand((size_t)nq * Da);
    float *clean = malloc(sizeof(float) * nq * Da), *dirty = malloc(sizeof(float) * nq * Da);
    float *first = malloc(sizeof(float) * nq * Da);
    float *scr = scratch(pos0 + nt, Da);
    assert_true(clean != NULL && dirty != NULL && first != NULL);
    for (int is = 0; is <= best; is++) {
        be_cpu_attn_blk b;
        blk_fill(&b, &p, 0, pos0, nt, nh, qs, clean);
        be_cpu_attn_pick(isas[is])(&b, scr);
        float *last = pool_tok(&p, pos0 + nt - 1), saved[2 * 48];
        memcpy(saved, last, sizeof(saved));
        for (uint32_t d = 0; d < Da; d++) {
            last[d] = d % 2 ? NAN : INFINITY;
            last[Da + d] = d % 3 ? -INFINITY : NAN;
        }
        blk_fill(&b, &p, 0, pos0, nt, nh, qs, dirty);
        be_cpu_attn_pick(isas[is])(&b, scr);
        memcpy(last, saved, sizeof(saved));
        const size_t before = (size_t)(nt - 1) * nh * Da; /* every query of the earlier tokens */
        if (memcmp(clean, dirty, sizeof(float) * before) != 0)
            fail_msg("ISA %d: a later position's NaN / Inf changed an earlier query", is);
        for (size_t i = before; i < (size_t)nq * Da; i++)
            if (!isnan(dirty[i]))
                fail_msg("ISA %d: the last token's own output %zu is %g, not NaN", is, i,
                         (double)dirty[i]);
        if (is == 0)
            memcpy(first, dirty, sizeof(float) * nq * Da);
        else if (memcmp(first, dirty, sizeof(float) * nq * Da) != 0) /* the NaNs too */
            fail_msg("ISA %d: the outputs with NaN / Inf inputs differ from the portable path", is);
    }
    free(first);
    free(scr);
    free(dirty);
    free(clean);
    free(qs);
    free(p.kv.pool);
}

static void
test_later_positions_masked(void **state)
{
    (void)state;
    later_masked(20, 2); /* 40 queries: lanes over queries */
    later_masked(2, 2);  /* 4: the decode kernels */
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_paths_and_blocks_agree),
        cmocka_unit_test(test_later_positions_masked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
