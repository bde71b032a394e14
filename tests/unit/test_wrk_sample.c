/* Unit tests for wrk_sample: greedy, determinism, filters, penalties, logprobs, distribution. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "wrk_sample.h"

#define V 64

static void
fill(float *l, uint32_t seed)
{
    for (int i = 0; i < V; i++) {
        seed = seed * 1664525u + 1013904223u;
        l[i] = (float)(seed >> 8) / (float)(1u << 24) * 6.0f - 3.0f;
    }
}

static wrk_sample_result
run(const float *l0, wrk_sample_params p)
{
    float l[V];
    memcpy(l, l0, sizeof(l));
    wrk_sample_result r;
    assert_int_equal(wrk_sample(l, V, &p, &r), WK_OK);
    return r;
}

static void
test_greedy(void **state)
{
    (void)state;
    float l[V];
    fill(l, 1);
    int best = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[best])
            best = i;
    wrk_sample_params p = {.want_logprob = true};
    wrk_sample_result r = run(l, p);
    assert_int_equal(r.token, best);
    /* logprob equals the log-softmax computed directly. */
    double z = 0;
    for (int i = 0; i < V; i++)
        z += exp((double)l[i]);
    assert_true(fabs(r.logprob - (l[best] - log(z))) < 1e-4);
}

/* The scalar scan wrk_sample_argmax must agree with: first strict maximum, NaN never. */
static uint32_t
ref_argmax(const float *x, uint32_t n)
{
    float mx = -INFINITY;
    uint32_t best = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (x[i] > mx) {
            mx = x[i];
            best = i;
        }
    }
    return best;
}

/*
 * Arrays from a small set of values (ties everywhere), with NaN, -inf, +inf,
 * -0 and +0, of every length 0..80 and a Qwen3.5-sized vocabulary, the
 * maximum placed before, inside and after the 16-wide blocks.
 */
static void
test_argmax_matches_scan(void **state)
{
    (void)state;
    const float pool[] = {NAN, -INFINITY, -0.0f, 0.0f, -1.5f, 2.25f, 2.25f, INFINITY, 7.0f};
    enum { BIG = 248320 };
    float *x = malloc(BIG * sizeof(*x));
    assert_non_null(x);
    uint32_t seed = 7;
    for (uint32_t round = 0; round < 400; round++) {
        uint32_t n = round < 81 ? round : round < 300 ? 17 + round % 64 : BIG - round % 16;
        /* a sub-pool per round: some rounds lack the larger values (all NaN, all -inf...) */
        uint32_t lo = round % 5, hi = lo + 1 + (round / 5) % (9 - lo);
        for (uint32_t i = 0; i < n; i++) {
            seed = seed * 1664525u + 1013904223u;
            x[i] = pool[lo + (seed >> 8) % (hi - lo)];
        }
        uint32_t got = wrk_sample_argmax(x, n), want = ref_argmax(x, n);
        if (got != want)
            fail_msg("n=%u round=%u: argmax %u, scan %u", n, round, got, want);
    }
    /* -0 before +0 and the reverse: the first zero wins either way */
    float z[40];
    for (int i = 0; i < 40; i++)
        z[i] = -1.0f;
    z[21] = -0.0f;
    z[37] = 0.0f;
    assert_int_equal(wrk_sample_argmax(z, 40), 21);
    z[21] = 0.0f;
    z[37] = -0.0f;
    assert_int_equal(wrk_sample_argmax(z, 40), 21);
    free(x);
}

/*
 * Greedy over a large vocabulary with logprobs: token and logprob bits equal
 * those of the scalar computation wrk_sample did before (first strict
 * maximum, then the sequential softmax normaliser).
 */
static void
test_greedy_big_vocab_bits(void **state)
{
    (void)state;
    enum { BIG = 248320 };
    float *l = malloc(BIG * sizeof(*l));
    float *w = malloc(BIG * sizeof(*w));
    assert_non_null(l);
    assert_non_null(w);
    uint32_t seed = 11;
    for (int round = 0; round < 3; round++) {
        for (uint32_t i = 0; i < BIG; i++) {
            seed = seed * 1664525u + 1013904223u;
            l[i] = (float)(seed >> 8) / (float)(1u << 24) * 20.0f - 10.0f;
        }
        l[BIG - 1 - round * 1000] = 10.5f; /* one clear winner, late */
        l[BIG - 2 - round * 1000] = 10.5f; /* and a tie after it */
        uint32_t best = ref_argmax(l, BIG);
        float mx = l[best], z = 0.0f;
        for (uint32_t i = 0; i < BIG; i++)
            z += expf(l[i] - mx);
        float want = l[best] - (mx + logf(z));
        memcpy(w, l, BIG * sizeof(*l));
        wrk_sample_params p = {.want_logprob = true};
        wrk_sample_result r;
        assert_int_equal(wrk_sample(w, BIG, &p, &r), WK_OK);
        assert_int_equal(r.token, (int32_t)best);
        assert_memory_equal(&r.logprob, &want, sizeof(want));
    }
    free(l);
    free(w);
}

/* A long penalty window: the logits end up exactly as counting each id directly gives. */
static void
test_penalties_long_history(void **state)
{
    (void)state;
    enum { N = 6000 };
    static int32_t hist[N];
    static uint32_t count[V];
    float l[V], want[V];
    fill(l, 5);
    memcpy(want, l, sizeof(l));
    uint32_t seed = 3;
    for (int i = 0; i < N; i++) {
        seed = seed * 1664525u + 1013904223u;
        hist[i] = (int32_t)((seed >> 8) % (V + 8)) - 4; /* some out of range: ignored */
        if (hist[i] >= 0 && hist[i] < V)
            count[hist[i]]++;
    }
    for (int t = 0; t < V; t++)
        if (count[t] > 0)
            want[t] -= 0.25f + 0.01f * (float)count[t];
    wrk_sample_params p = {.presence_penalty = 0.25f, .frequency_penalty = 0.01f,
                           .history = hist, .n_history = N};
    wrk_sample_result r;
    assert_int_equal(wrk_sample(l, V, &p, &r), WK_OK); /* (greedy: l is only penalised) */
    assert_memory_equal(l, want, sizeof(l));
    assert_int_equal(r.token, (int32_t)ref_argmax(want, V));
}

typedef struct ref_cand {
    float logit;
    int32_t id;
} ref_cand;

static int
ref_cand_cmp(const void *a, const void *b)
{
    const ref_cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* top_k sampling done the plain way (every candidate sorted): the token wrk_sample must pick. */
static int32_t
ref_sample_top_k(const float *l, uint32_t n, float temp, uint32_t k, uint64_t seed, uint64_t idx)
{
    float mx = l[ref_argmax(l, n)], inv_t = 1.0f / temp, cut = mx - 30.0f * temp;
    ref_cand *c = malloc(n * sizeof(*c)), *s = malloc(n * sizeof(*s));
    assert_non_null(c);
    assert_non_null(s);
    uint32_t nc = 0;
    for (uint32_t i = 0; i < n; i++)
        if (l[i] >= cut)
            c[nc++] = (ref_cand){l[i], (int32_t)i};
    memcpy(s, c, nc * sizeof(*c));
    qsort(s, nc, sizeof(*s), ref_cand_cmp);
    uint32_t m = nc;
    if (k > 0 && k < nc) {
        m = 0;
        for (uint32_t i = 0; i < nc; i++)
            if (ref_cand_cmp(&c[i], &s[k - 1]) <= 0)
                c[m++] = c[i];
    }
    double sum = 0.0;
    for (uint32_t i = 0; i < m; i++)
        sum += expf((c[i].logit - mx) * inv_t);
    double u = wrk_sample_uniform(seed, idx) * sum, acc = 0.0;
    int32_t chosen = c[0].id;
    for (uint32_t i = 0; i < m; i++) {
        chosen = c[i].id;
        acc += expf((c[i].logit - mx) * inv_t);
        if (u < acc)
            break;
    }
    free(c);
    free(s);
    return chosen;
}

/*
 * top_k by one-pass selection (k <= 64) and by quickselect (larger k) keeps
 * exactly the candidates a full sort keeps: on logits with ties everywhere
 * (few distinct values) and on spread ones, k around both paths' edges.
 */
static void
test_top_k_selection_matches_sort(void **state)
{
    (void)state;
    enum { N = 3000 };
    static float src[N], l[N];
    const uint32_t ks[] = {1, 2, 7, 40, 63, 64, 65, 100, 999, 2999};
    const float temps[] = {0.5f, 1.0f, 3.0f};
    uint32_t seed = 17;
    for (int tie = 0; tie < 2; tie++) {
        for (uint32_t i = 0; i < N; i++) {
            seed = seed * 1664525u + 1013904223u;
            src[i] = tie ? (float)((seed >> 8) % 13) * 0.25f
                         : (float)(seed >> 8) / (float)(1u << 24) * 12.0f - 6.0f;
        }
        for (size_t a = 0; a < sizeof(ks) / sizeof(ks[0]); a++) {
            for (size_t b = 0; b < sizeof(temps) / sizeof(temps[0]); b++) {
                for (uint64_t idx = 0; idx < 12; idx++) {
                    memcpy(l, src, sizeof(l));
                    wrk_sample_params p = {.temperature = temps[b], .top_k = ks[a], .seed = 5,
                                           .sample_index = idx};
                    wrk_sample_result r;
                    assert_int_equal(wrk_sample(l, N, &p, &r), WK_OK);
                    int32_t want = ref_sample_top_k(src, N, temps[b], ks[a], 5, idx);
                    if (r.token != want)
                        fail_msg("ties=%d k=%u T=%g index=%llu: token %d, the sort gives %d", tie,
                                 ks[a], (double)temps[b], (unsigned long long)idx, r.token, want);
                }
            }
        }
    }
}

/* Ties go to the lowest id: greedy, top_k = 1 and the top_logprobs order. */
static void
test_ties(void **state)
{
    (void)state;
    float l[V];
    fill(l, 1);
    int best = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[best])
            best = i;
    assert_true(best > 0 && best < V - 1); /* room for a tie on either side */
    wrk_sample_params g = {0};
    float t[V];
    /* a higher id tying the maximum leaves the choice alone */
    memcpy(t, l, sizeof(t));
    t[V - 1] = t[best];
    assert_int_equal(run(t, g).token, best);
    /* a lower id tying the maximum wins */
    memcpy(t, l, sizeof(t));
    t[best / 2] = t[best];
    assert_int_equal(run(t, g).token, best / 2);
    memcpy(t, l, sizeof(t));
    t[0] = t[best];
    assert_int_equal(run(t, g).token, 0);
    /* three tied maxima, the rest flat */
    float u[V] = {0};
    u[9] = 1.0f;
    u[40] = 1.0f;
    u[5] = 1.0f;
    assert_int_equal(run(u, g).token, 5);
    /* top_k = 1 keeps the lowest id of a tie, so sampling is greedy */
    for (uint64_t i = 0; i < 50; i++) {
        wrk_sample_params k1 = {.temperature = 1.0f, .top_k = 1, .seed = 3, .sample_index = i};
        assert_int_equal(run(u, k1).token, 5);
    }
    /* top_logprobs lists tied entries by increasing id, with equal logprobs */
    wrk_sample_params tl = {.top_logprobs = 3};
    wrk_sample_result r = run(u, tl);
    assert_int_equal(r.n_top, 3);
    assert_int_equal(r.top_token[0], 5);
    assert_int_equal(r.top_token[1], 9);
    assert_int_equal(r.top_token[2], 40);
    assert_true(r.top_logprob[0] == r.top_logprob[1] && r.top_logprob[1] == r.top_logprob[2]);
    assert_int_equal(r.token, 5);
}

static void
test_determinism_and_filters(void **state)
{
    (void)state;
    float l[V];
    fill(l, 7);
    wrk_sample_params p = {.temperature = 0.9f, .top_p = 0.95f, .seed = 42, .sample_index = 3};
    int32_t a = run(l, p).token;
    for (int k = 0; k < 5; k++)
        assert_int_equal(run(l, p).token, a);
    /* top_k = 1 and a tiny top_p are greedy. */
    wrk_sample_params g = {0};
    int32_t greedy = run(l, g).token;
    for (uint64_t i = 0; i < 50; i++) {
        wrk_sample_params k1 = {.temperature = 1.0f, .top_k = 1, .seed = 9, .sample_index = i};
        assert_int_equal(run(l, k1).token, greedy);
        wrk_sample_params p0 = {.temperature = 1.0f, .top_p = 1e-6f, .seed = 9, .sample_index = i};
        assert_int_equal(run(l, p0).token, greedy);
        wrk_sample_params m1 = {.temperature = 1.0f, .min_p = 0.9999f, .seed = 9, .sample_index = i};
        assert_int_equal(run(l, m1).token, greedy);
    }
    /* top_k = 3 only ever picks one of the three best. */
    int order[V];
    for (int i = 0; i < V; i++)
        order[i] = i;
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (l[order[j]] > l[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    for (uint64_t i = 0; i < 200; i++) {
        wrk_sample_params k3 = {.temperature = 2.0f, .top_k = 3, .seed = 5, .sample_index = i};
        int32_t t = run(l, k3).token;
        assert_true(t == order[0] || t == order[1] || t == order[2]);
    }
    /* Bad parameters. */
    float x[V];
    memcpy(x, l, sizeof(x));
    wrk_sample_result r;
    wrk_sample_params bad = {.temperature = NAN};
    assert_int_equal(wrk_sample(x, V, &bad, &r), WK_EINVAL);
    wrk_sample_params bad2 = {.top_logprobs = 21};
    assert_int_equal(wrk_sample(x, V, &bad2, &r), WK_EINVAL);
    assert_int_equal(wrk_sample(x, 0, &g, &r), WK_EINVAL);
}

static void
test_distribution(void **state)
{
    (void)state;
    /* Three tokens with probabilities 0.5, 0.3, 0.2 (others -inf-ish). */
    float l[V];
    for (int i = 0; i < V; i++)
        l[i] = -1000.0f;
    l[10] = logf(0.5f);
    l[20] = logf(0.3f);
    l[30] = logf(0.2f);
    int count[3] = {0};
    int n = 20000;
    for (int i = 0; i < n; i++) {
        wrk_sample_params p = {.temperature = 1.0f, .seed = 77, .sample_index = (uint64_t)i};
        int32_t t = run(l, p).token;
        count[t == 10 ? 0 : t == 20 ? 1 : 2]++;
        assert_true(t == 10 || t == 20 || t == 30);
    }
    assert_true(fabs(count[0] / (double)n - 0.5) < 0.02);
    assert_true(fabs(count[1] / (double)n - 0.3) < 0.02);
    assert_true(fabs(count[2] / (double)n - 0.2) < 0.02);
    /* top_p 0.7 keeps exactly the first two (0.5 + 0.3 reaches 0.7). */
    int seen30 = 0;
    for (int i = 0; i < 2000; i++) {
        wrk_sample_params p = {.temperature = 1.0f, .top_p = 0.7f, .seed = 1,
                               .sample_index = (uint64_t)i};
        seen30 += run(l, p).token == 30;
    }
    assert_int_equal(seen30, 0);
    /* The uniform is in [0, 1) and differs across indices. */
    assert_true(wrk_sample_uniform(1, 1) != wrk_sample_uniform(1, 2));
    for (int i = 0; i < 1000; i++) {
        double u = wrk_sample_uniform(3, (uint64_t)i);
        assert_true(u >= 0.0 && u < 1.0);
    }
}

static void
test_penalties_and_top_logprobs(void **state)
{
    (void)state;
    float l[V] = {0};
    l[4] = 2.0f;
    l[8] = 1.9f;
    int32_t hist[] = {4, 4};
    wrk_sample_params p = {.presence_penalty = 0.5f, .history = hist, .n_history = 2};
    assert_int_equal(run(l, p).token, 8); /* 2.0 - 0.5 < 1.9 */
    wrk_sample_params f = {.frequency_penalty = 0.06f, .history = hist, .n_history = 2};
    assert_int_equal(run(l, f).token, 8); /* 2.0 - 0.12 < 1.9 */
    wrk_sample_params f2 = {.frequency_penalty = 0.06f, .history = hist, .n_history = 1};
    assert_int_equal(run(l, f2).token, 4); /* 2.0 - 0.06 > 1.9 */
    wrk_sample_params t = {.top_logprobs = 2};
    wrk_sample_result r = run(l, t);
    assert_int_equal(r.n_top, 2);
    assert_int_equal(r.top_token[0], 4);
    assert_int_equal(r.top_token[1], 8);
    assert_true(r.top_logprob[0] > r.top_logprob[1] && r.top_logprob[0] < 0.0f);
    assert_true(fabs(r.logprob - r.top_logprob[0]) < 1e-6);
}

/* logit_bias: +100 forces a token at T=0 and T=1, -100 bans the best one, bad ids refused. */
static void
test_logit_bias(void **state)
{
    (void)state;
    float l[V];
    fill(l, 3);
    int best = 0, worst = 0;
    for (int i = 1; i < V; i++) {
        if (l[i] > l[best])
            best = i;
        if (l[i] < l[worst])
            worst = i;
    }
    wrk_logit_bias force = {.token = worst, .bias = 100.0f};
    wrk_sample_params p = {.bias = &force, .n_bias = 1, .want_logprob = true};
    wrk_sample_result r = run(l, p);
    assert_int_equal(r.token, worst);
    assert_true(r.logprob > -1e-3f); /* the reported logprob includes the bias */
    for (int i = 0; i < 200; i++) {
        wrk_sample_params t = {.temperature = 1.0f, .seed = 5, .sample_index = (uint64_t)i,
                               .bias = &force, .n_bias = 1};
        assert_int_equal(run(l, t).token, worst);
    }
    wrk_logit_bias ban = {.token = best, .bias = -100.0f};
    wrk_sample_params b = {.bias = &ban, .n_bias = 1};
    assert_true(run(l, b).token != best);
    for (int i = 0; i < 500; i++) {
        wrk_sample_params t = {.temperature = 1.0f, .seed = 9, .sample_index = (uint64_t)i,
                               .bias = &ban, .n_bias = 1};
        assert_true(run(l, t).token != best);
    }
    /* An id outside the vocab or a NaN bias: WK_EINVAL, logits untouched. */
    float x[V];
    memcpy(x, l, sizeof(x));
    wrk_logit_bias bad = {.token = V, .bias = 1.0f};
    wrk_sample_params pb = {.bias = &bad, .n_bias = 1};
    wrk_sample_result out;
    assert_int_equal(wrk_sample(x, V, &pb, &out), WK_EINVAL);
    bad.token = -1;
    assert_int_equal(wrk_sample(x, V, &pb, &out), WK_EINVAL);
    bad.token = 0;
    bad.bias = NAN;
    assert_int_equal(wrk_sample(x, V, &pb, &out), WK_EINVAL);
    assert_memory_equal(x, l, sizeof(x));
}

/* An allowed-token mask: only its tokens, greedy and sampled, top_logprobs among them; no mask = unchanged. */
static void
test_allowed_mask(void **state)
{
    (void)state;
    float l[V];
    fill(l, 4);
    uint8_t mask[V / 8] = {0};
    int allowed[] = {3, 17, 40, 63};
    for (int k = 0; k < 4; k++)
        mask[allowed[k] / 8] |= (uint8_t)(1u << (allowed[k] % 8));
    int best = 3;
    for (int k = 0; k < 4; k++)
        if (l[allowed[k]] > l[best])
            best = allowed[k];
    wrk_sample_params g = {.allowed = mask, .n_allowed = sizeof(mask), .top_logprobs = 5,
                           .want_logprob = true};
    wrk_sample_result r = run(l, g);
    assert_int_equal(r.token, best);
    assert_int_equal(r.n_top, 4); /* only the allowed ones are reported */
    double z = 0;
    for (int k = 0; k < 4; k++)
        z += exp((double)l[allowed[k]]);
    assert_true(fabs(r.logprob - (l[best] - log(z))) < 1e-4);
    int seen[V] = {0};
    for (int i = 0; i < 400; i++) {
        wrk_sample_params t = {.temperature = 1.5f, .top_p = 0.9f, .seed = 11,
                               .sample_index = (uint64_t)i, .allowed = mask,
                               .n_allowed = sizeof(mask)};
        int tok = run(l, t).token;
        assert_true((mask[tok / 8] >> (tok % 8)) & 1);
        seen[tok]++;
    }
    int distinct = 0;
    for (int i = 0; i < V; i++)
        distinct += seen[i] > 0;
    assert_true(distinct >= 2);
    /* A mask allowing every token changes nothing: same token, logprob and alternatives. */
    uint8_t all[V / 8];
    memset(all, 0xFF, sizeof(all));
    for (int i = 0; i < 50; i++) {
        wrk_sample_params a = {.temperature = 0.8f, .top_p = 0.95f, .seed = 2,
                               .sample_index = (uint64_t)i, .top_logprobs = 3,
                               .want_logprob = true};
        wrk_sample_params b = a;
        b.allowed = all;
        b.n_allowed = sizeof(all);
        wrk_sample_result x = run(l, a), y = run(l, b);
        assert_memory_equal(&x, &y, sizeof(x));
    }
    /* A mask allowing nothing: WK_EINVAL, logits untouched. */
    uint8_t none[V / 8] = {0};
    float x[V];
    memcpy(x, l, sizeof(x));
    wrk_sample_params pn = {.allowed = none, .n_allowed = sizeof(none)};
    wrk_sample_result out;
    assert_int_equal(wrk_sample(x, V, &pn, &out), WK_EINVAL);
    assert_memory_equal(x, l, sizeof(x));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_ties),
        cmocka_unit_test(test_determinism_and_filters),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_penalties_and_top_logprobs),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_allowed_mask),
        cmocka_unit_test(test_argmax_matches_scan),
        cmocka_unit_test(test_greedy_big_vocab_bits),
        cmocka_unit_test(test_penalties_long_history),
        cmocka_unit_test(test_top_k_selection_matches_sort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
