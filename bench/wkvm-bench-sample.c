/*
 * wkvm-bench-sample: the per-token cost of wrk_sample() on a large vocab
 * (Qwen3.5's 248,320 by default), next to the plain scalar "x[i] > max"
 * scan that greedy decoding used before wrk_sample_argmax().
 *
 *   wkvm-bench-sample [--vocab N] [--iterations N]
 *
 * Prints one line per case: the median and minimum microseconds per call.
 * The logits are random (uniform in [-10, 10)), refreshed before each call
 * from a saved copy (wrk_sample uses them as scratch), outside the timing.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_clock.h"
#include "wrk_sample.h"



/* The scan greedy decoding ran before (kept here as the baseline). */
static uint32_t
scalar_argmax(const float *x, uint32_t n)
{
    float mx = -1.0f / 0.0f;
    uint32_t best = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (x[i] > mx) {
            mx = x[i];
            best = i;
        }
    }
    return best;
}

enum { CASE_SCAN, CASE_GREEDY, CASE_GREEDY_LP, CASE_T1_TOPK40, CASE_T1_TOPK1000, CASE_T1_TOPP,
       CASE__N };
static const char *const case_names[CASE__N] = {
    "scalar scan (before)", "wrk_sample greedy", "wrk_sample greedy + logprob",
    "wrk_sample T=1 top_k=40 top_p=0.9", "wrk_sample T=1 top_k=1000", "wrk_sample T=1 top_p=0.9"};

int
main(int argc, char **argv)
{
    uint32_t vocab = 248320, iters = 200;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--vocab") == 0 && i + 1 < argc)
            vocab = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--iterations") == 0 && i + 1 < argc)
            iters = (uint32_t)strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: wkvm-bench-sample [--vocab N] [--iterations N]\n");
            return 2;
        }
    }
    if (vocab == 0 || iters == 0)
        return 2;
    float *src = malloc((size_t)vocab * sizeof(*src));
    float *l = malloc((size_t)vocab * sizeof(*l));
    double *t = malloc(iters * sizeof(*t));
    if (src == NULL || l == NULL || t == NULL)
        return 1;
    uint32_t seed = 1;
    for (uint32_t i = 0; i < vocab; i++) {
        seed = seed * 1664525u + 1013904223u;
        src[i] = (float)(seed >> 8) / (float)(1u << 24) * 20.0f - 10.0f;
    }
    volatile uint32_t sink = 0;
    printf("vocab %u, %u iterations\n", vocab, iters);
    for (int c = 0; c < CASE__N; c++) {
        for (uint32_t k = 0; k < iters; k++) {
            memcpy(l, src, (size_t)vocab * sizeof(*l));
            wrk_sample_params p = {0};
            if (c == CASE_GREEDY_LP)
                p.want_logprob = true;
            if (c >= CASE_T1_TOPK40) {
                p.temperature = 1.0f;
                p.top_k = c == CASE_T1_TOPK40 ? 40 : c == CASE_T1_TOPK1000 ? 1000 : 0;
                p.top_p = c == CASE_T1_TOPK1000 ? 0.0f : 0.9f;
                p.sample_index = k;
            }
            wrk_sample_result r;
            double t0 = bench_now_us();
            if (c == CASE_SCAN) {
                sink += scalar_argmax(l, vocab);
            } else if (wrk_sample(l, vocab, &p, &r) == WK_OK) {
                sink += (uint32_t)r.token;
            } else {
                fprintf(stderr, "wrk_sample failed\n");
                return 1;
            }
            t[k] = bench_now_us() - t0;
        }
        qsort(t, iters, sizeof(*t), bench_cmp_double);
        printf("%-36s median %8.1f us  min %8.1f us\n", case_names[c], t[iters / 2], t[0]);
    }
    free(src);
    free(l);
    free(t);
    return sink == 0xffffffffu; /* (keeps the results live) */
}
