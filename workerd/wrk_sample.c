/*
 * wrk_sample: penalties, temperature, top-k, top-p and a counter-based RNG
 * (splitmix64 of seed and index), so that sampling is a pure function of
 * the logits and the request's (seed, index).
 */
#include "wrk_sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t
wrk_splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

double
wrk_sample_uniform(uint64_t seed, uint64_t index)
{
    uint64_t r = wrk_splitmix64(wrk_splitmix64(seed) ^ (index * 0xd1b54a32d192ed03ull));
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct wrk_cand {
    float logit; /* processed logit */
    int32_t id;  /* token id */
} wrk_cand;

static int
wrk_cand_cmp(const void *a, const void *b)
{
    const wrk_cand *x = a, *y = b;
    if (x->logit > y->logit)
        return -1;
    if (x->logit < y->logit)
        return 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static void
wrk_apply_penalties(float *logits, uint32_t vocab, const wrk_sample_params *p)
{
    if ((p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) || p->n_history == 0)
        return;
    /* Sort a copy of the history to count occurrences without a vocab-sized table. */
    int32_t *h = malloc(p->n_history * sizeof(*h));
    if (h == NULL)
        return;
    memcpy(h, p->history, p->n_history * sizeof(*h));
    for (size_t i = 1; i < p->n_history; i++) {
        int32_t v = h[i];
        size_t j = i;
        while (j > 0 && h[j - 1] > v) {
            h[j] = h[j - 1];
            j--;
        }
        h[j] = v;
    }
    for (size_t i = 0; i < p->n_history;) {
        size_t j = i;
        while (j < p->n_history && h[j] == h[i])
            j++;
        int32_t t = h[i];
        if (t >= 0 && (uint32_t)t < vocab)
            logits[t] -= p->presence_penalty + p->frequency_penalty * (float)(j - i);
        i = j;
    }
    free(h);
}

wk_err
wrk_sample(float *logits, uint32_t vocab, const wrk_sample_params *p, wrk_sample_result *out)
{
    if (vocab == 0 || !(p->temperature >= 0.0f) || p->top_logprobs > WRK_SAMPLE_TOP_MAX)
        return WK_EINVAL;
    wrk_apply_penalties(logits, vocab, p);

    /* Log-softmax at T=1 for the reported logprobs. */
    float mx = -INFINITY;
    uint32_t best = 0;
    for (uint32_t i = 0; i < vocab; i++) {
        if (logits[i] > mx) {
            mx = logits[i];
            best = i;
        }
    }
    double z = 0.0;
    for (uint32_t i = 0; i < vocab; i++)
        z += exp((double)(logits[i] - mx));
    float lse = mx + (float)log(z);

    memset(out, 0, sizeof(*out));
    if (p->top_logprobs > 0) {
        /* Partial selection of the top entries (k <= 20). */
        uint32_t k = p->top_logprobs < vocab ? p->top_logprobs : vocab;
        for (uint32_t i = 0; i < vocab; i++) {
            float v = logits[i];
            uint32_t n = out->n_top;
            if (n == k && !(v > out->top_logprob[n - 1]))
                continue;
            uint32_t pos = n < k ? n : k - 1;
            while (pos > 0 && v > out->top_logprob[pos - 1]) {
                out->top_logprob[pos] = out->top_logprob[pos - 1];
                out->top_token[pos] = out->top_token[pos - 1];
                pos--;
            }
            out->top_logprob[pos] = v;
            out->top_token[pos] = (int32_t)i;
            if (n < k)
                out->n_top++;
        }
        for (uint32_t i = 0; i < out->n_top; i++)
            out->top_logprob[i] -= lse;
    }

    int32_t chosen = (int32_t)best;
    if (p->temperature > 0.0f) {
        uint32_t keep = vocab;
        if (p->top_k > 0 && p->top_k < keep)
            keep = p->top_k;
        wrk_cand *c = malloc((size_t)vocab * sizeof(*c));
        if (c == NULL)
            return WK_ENOMEM;
        for (uint32_t i = 0; i < vocab; i++) {
            c[i].logit = logits[i] / p->temperature;
            c[i].id = (int32_t)i;
        }
        qsort(c, vocab, sizeof(*c), wrk_cand_cmp);
        double cmax = c[0].logit, sum = 0.0;
        for (uint32_t i = 0; i < keep; i++)
            sum += exp((double)c[i].logit - cmax);
        if (p->min_p > 0.0f) {
            /* c is sorted, so p_max is c[0]: keep while p_i / p_max >= min_p. */
            double lim = log((double)p->min_p);
            uint32_t i = 1;
            while (i < keep && (double)c[i].logit - cmax >= lim)
                i++;
            keep = i;
            sum = 0.0;
            for (uint32_t k = 0; k < keep; k++)
                sum += exp((double)c[k].logit - cmax);
        }
        if (p->top_p > 0.0f && p->top_p < 1.0f) {
            double acc = 0.0;
            uint32_t i = 0;
            for (; i < keep; i++) {
                acc += exp((double)c[i].logit - cmax) / sum;
                if (acc >= (double)p->top_p) {
                    i++;
                    break;
                }
            }
            keep = i > 0 ? i : 1;
            sum = 0.0;
            for (uint32_t j = 0; j < keep; j++)
                sum += exp((double)c[j].logit - cmax);
        }
        double u = wrk_sample_uniform(p->seed, p->sample_index) * sum, acc = 0.0;
        chosen = c[keep - 1].id;
        for (uint32_t i = 0; i < keep; i++) {
            acc += exp((double)c[i].logit - cmax);
            if (u < acc) {
                chosen = c[i].id;
                break;
            }
        }
        free(c);
    }
    out->token = chosen;
    out->logprob = logits[chosen] - lse;
    return WK_OK;
}
