/*
 * wrk_sample: penalties, logit bias, temperature, top-k, top-p and a counter-based RNG
 * (splitmix64 of seed and index), so that sampling is a pure function of
 * the logits and the request's (seed, index).
 */
#include "wrk_sample.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

static int
wrk_id_cmp(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
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
    /* (ids only: any sort gives the same runs; an insertion sort was quadratic in the window) */
    qsort(h, p->n_history, sizeof(*h), wrk_id_cmp);
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

/*
 * The largest logit's index, the first one on a tie, NaN never; 0 when no
 * logit is above -inf. The same index as a scalar "x[i] > max" scan, found
 * in two vector passes: 16 independent running maxima (a select per lane,
 * maxps(x, m) being exactly "x > m ? x : m", so no reassociation), then the
 * first index that equals the maximum (-0 == +0, and the scan too keeps the
 * first of those). Greedy decoding runs this over the whole vocabulary
 * every token (248,320 logits on Qwen3.5).
 */
uint32_t
wrk_sample_argmax(const float *x, uint32_t n)
{
    uint32_t i = 0;
    float mx = -INFINITY;
#if defined(__SSE2__)
    __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    for (; n - i >= 16; i += 16) {
        m0 = _mm_max_ps(_mm_loadu_ps(x + i), m0);
        m1 = _mm_max_ps(_mm_loadu_ps(x + i + 4), m1);
        m2 = _mm_max_ps(_mm_loadu_ps(x + i + 8), m2);
        m3 = _mm_max_ps(_mm_loadu_ps(x + i + 12), m3);
    }
    float lane[16];
    _mm_storeu_ps(lane, m0);
    _mm_storeu_ps(lane + 4, m1);
    _mm_storeu_ps(lane + 8, m2);
    _mm_storeu_ps(lane + 12, m3);
    for (int j = 0; j < 16; j++)
        mx = lane[j] > mx ? lane[j] : mx;
#endif
    for (; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    if (!(mx > -INFINITY))
        return 0;
    i = 0;
#if defined(__SSE2__)
    const __m128 v = _mm_set1_ps(mx);
    for (; n - i >= 16; i += 16) {
        __m128 e0 = _mm_cmpeq_ps(_mm_loadu_ps(x + i), v);
        __m128 e1 = _mm_cmpeq_ps(_mm_loadu_ps(x + i + 4), v);
        __m128 e2 = _mm_cmpeq_ps(_mm_loadu_ps(x + i + 8), v);
        __m128 e3 = _mm_cmpeq_ps(_mm_loadu_ps(x + i + 12), v);
        if (_mm_movemask_ps(_mm_or_ps(_mm_or_ps(e0, e1), _mm_or_ps(e2, e3))) != 0)
            break; /* the first equal one is in these 16 */
    }
#endif
    while (x[i] != mx) /* (mx is one of x: this ends) */
        i++;
    return i;
}

/*
 * Candidates: tokens within 30 (in units of the temperature-scaled logit)
 * of the maximum. Everything below weighs less than e^-30 of the top token
 * each, so dropping it changes no practical outcome and keeps the result a
 * pure function of the logits.
 */
#define WRK_SAMPLE_CUT 30.0f

/* wrk_cand_cmp(a, b) < 0: a sorts first (a larger logit, on a tie the lower id). */
static inline bool
wrk_cand_heavier(const wrk_cand *a, const wrk_cand *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

/* top_k up to this is taken in one pass over the logits (wrk_top_k_small) */
#define WRK_TOP_K_SMALL 64

/*
 * top_k <= WRK_TOP_K_SMALL straight from the logits: the k heaviest of the
 * candidates (logit >= cut; all of them when fewer), one pass with a small
 * sorted array (most logits fail its first test), returned in id order:
 * the same set and order as collecting every candidate and then
 * wrk_keep_top_k(), without the vocab-sized buffers.
 */
static uint32_t
wrk_top_k_small(const float *logits, uint32_t vocab, float cut, uint32_t k,
                wrk_cand top[WRK_TOP_K_SMALL])
{
    uint32_t nt = 0;
    for (uint32_t i = 0; i < vocab; i++) {
        if (!(logits[i] >= cut))
            continue;
        wrk_cand x = {logits[i], (int32_t)i};
        if (nt == k && !wrk_cand_heavier(&x, &top[k - 1]))
            continue;
        uint32_t j = nt < k ? nt++ : k - 1;
        for (; j > 0 && wrk_cand_heavier(&x, &top[j - 1]); j--)
            top[j] = top[j - 1];
        top[j] = x;
    }
    for (uint32_t i = 1; i < nt; i++) { /* into id order */
        wrk_cand x = top[i];
        uint32_t j = i;
        for (; j > 0 && top[j - 1].id > x.id; j--)
            top[j] = top[j - 1];
        top[j] = x;
    }
    return nt;
}

static void
wrk_cand_swap(wrk_cand *a, wrk_cand *b)
{
    wrk_cand t = *a;
    *a = *b;
    *b = t;
}

/*
 * Reorders c[0..n) so that c[pos] is the candidate a full sort by
 * wrk_cand_cmp puts there (quickselect; the order is total, ids being
 * unique, so that candidate is unique too). Median-of-three pivots; after
 * too many rounds (an unlucky input) the remaining range is sorted instead.
 */
static void
wrk_cand_select(wrk_cand *c, uint32_t n, uint32_t pos)
{
    uint32_t lo = 0, hi = n; /* pos is in [lo, hi) */
    int rounds = 64;
    while (hi - lo > 16) {
        if (rounds-- == 0) {
            qsort(c + lo, hi - lo, sizeof(*c), wrk_cand_cmp);
            return;
        }
        uint32_t mid = lo + (hi - lo) / 2, last = hi - 1;
        if (wrk_cand_cmp(&c[mid], &c[lo]) < 0)
            wrk_cand_swap(&c[mid], &c[lo]);
        if (wrk_cand_cmp(&c[last], &c[lo]) < 0)
            wrk_cand_swap(&c[last], &c[lo]);
        if (wrk_cand_cmp(&c[mid], &c[last]) < 0)
            wrk_cand_swap(&c[mid], &c[last]); /* the median now at last: the pivot */
        uint32_t store = lo;
        for (uint32_t i = lo; i < last; i++) {
            if (wrk_cand_cmp(&c[i], &c[last]) < 0)
                wrk_cand_swap(&c[i], &c[store++]);
        }
        wrk_cand_swap(&c[store], &c[last]); /* the pivot in its sorted place */
        if (pos == store)
            return;
        if (pos < store)
            hi = store;
        else
            lo = store + 1;
    }
    for (uint32_t i = lo + 1; i < hi; i++) { /* a short range: insertion sort */
        for (uint32_t j = i; j > lo && wrk_cand_cmp(&c[j], &c[j - 1]) < 0; j--)
            wrk_cand_swap(&c[j], &c[j - 1]);
    }
}

/*
 * Keeps the k heaviest candidates (ties: lower id first), in id order. The
 * k-th heaviest is found by selection, not a sort of every candidate (at
 * T=1 on a 248,320 vocab nearly all are candidates: the qsort was ~25 ms a
 * token); the same one either way, the order being total.
 */
static uint32_t
wrk_keep_top_k(wrk_cand *c, uint32_t n, uint32_t k)
{
    if (k == 0 || k >= n)
        return n;
    wrk_cand *tmp = malloc((size_t)n * sizeof(*tmp));
    if (tmp == NULL)
        return n; /* no memory: do not filter (still a valid distribution) */
    memcpy(tmp, c, (size_t)n * sizeof(*tmp));
    wrk_cand_select(tmp, n, k - 1);
    float kth = tmp[k - 1].logit;
    int32_t kth_id = tmp[k - 1].id;
    free(tmp);
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (c[i].logit > kth || (c[i].logit == kth && c[i].id <= kth_id))
            c[m++] = c[i];
    }
    return m;
}

wk_err
wrk_sample(float *logits, uint32_t vocab, const wrk_sample_params *p, wrk_sample_result *out)
{
    if (vocab == 0 || !(p->temperature >= 0.0f) || p->top_logprobs > WRK_SAMPLE_TOP_MAX)
        return WK_EINVAL;
    for (size_t i = 0; i < p->n_bias; i++) {
        if (p->bias[i].token < 0 || (uint32_t)p->bias[i].token >= vocab ||
            !isfinite(p->bias[i].bias))
            return WK_EINVAL;
    }
    if (p->allowed != NULL) {
        bool any = false;
        size_t nb = p->n_allowed < ((size_t)vocab + 7) / 8 ? p->n_allowed : ((size_t)vocab + 7) / 8;
        for (size_t i = 0; i < nb && !any; i++) {
            uint8_t b = p->allowed[i];
            if (i == ((size_t)vocab - 1) / 8 && vocab % 8 != 0)
                b &= (uint8_t)((1u << (vocab % 8)) - 1);
            any = b != 0;
        }
        if (!any)
            return WK_EINVAL;
    }
    wrk_apply_penalties(logits, vocab, p);
    for (size_t i = 0; i < p->n_bias; i++)
        logits[p->bias[i].token] += p->bias[i].bias;
    if (p->allowed != NULL) {
        for (uint32_t i = 0; i < vocab; i++) {
            if ((size_t)(i / 8) >= p->n_allowed || !((p->allowed[i / 8] >> (i % 8)) & 1))
                logits[i] = -INFINITY;
        }
    }

    uint32_t best = wrk_sample_argmax(logits, vocab);
    float mx = logits[best] > -INFINITY ? logits[best] : -INFINITY; /* (NaN at 0: -inf) */
    memset(out, 0, sizeof(*out));
    bool want_lp = p->want_logprob || p->top_logprobs > 0;
    float lse = 0.0f;
    if (want_lp) {
        /* Log-softmax normaliser at T=1 for the reported logprobs (fixed order). */
        float z = 0.0f;
        for (uint32_t i = 0; i < vocab; i++)
            z += expf(logits[i] - mx);
        lse = mx + logf(z);
    }
    if (p->top_logprobs > 0) {
        /* Partial selection of the top entries (k <= 20). */
        uint32_t k = p->top_logprobs < vocab ? p->top_logprobs : vocab;
        for (uint32_t i = 0; i < vocab; i++) {
            float v = logits[i];
            uint32_t n = out->n_top;
            if (p->allowed != NULL && v == -INFINITY)
                continue; /* a disallowed token (constrained rows only: biases are finite) */
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
        float inv_t = 1.0f / p->temperature;
        float cut = mx - WRK_SAMPLE_CUT * p->temperature;
        uint32_t nc = 0;
        wrk_cand small_c[WRK_TOP_K_SMALL], *c = small_c, *c_heap = NULL;
        float small_wt[WRK_TOP_K_SMALL], *wt = small_wt, *wt_heap = NULL;
        if (p->top_k > 0 && p->top_k <= WRK_TOP_K_SMALL) {
            nc = wrk_top_k_small(logits, vocab, cut, p->top_k, small_c);
        } else {
            for (uint32_t i = 0; i < vocab; i++)
                nc += logits[i] >= cut;
            c = c_heap = malloc((size_t)nc * sizeof(*c));
            wt = wt_heap = malloc((size_t)nc * sizeof(*wt));
            if (c == NULL || wt == NULL) {
                free(c_heap);
                free(wt_heap);
                return WK_ENOMEM;
            }
            nc = 0;
            for (uint32_t i = 0; i < vocab; i++) {
                if (logits[i] >= cut) {
                    c[nc].logit = logits[i];
                    c[nc].id = (int32_t)i;
                    nc++;
                }
            }
            nc = wrk_keep_top_k(c, nc, p->top_k);
        }
        /* Weights relative to the top token (which is always kept, weight 1). */
        for (uint32_t i = 0; i < nc; i++)
            wt[i] = expf((c[i].logit - mx) * inv_t);
        float floor_w = 0.0f;
        if (p->min_p > 0.0f)
            floor_w = p->min_p;
        if (p->top_p > 0.0f && p->top_p < 1.0f) {
            /*
             * The nucleus is the heaviest candidates whose mass reaches top_p:
             * every candidate at or above the weight w* of the one that
             * crosses it (ties kept). Found with a histogram over the scaled
             * logit distance to the top (bins are exact in logit space, so
             * no log per token), then a sort of the one boundary bin.
             */
            enum { NB = 4096 };
            double *mass = calloc(NB, sizeof(*mass));
            if (mass == NULL) {
                free(c_heap);
                free(wt_heap);
                return WK_ENOMEM;
            }
            double total = 0.0;
            for (uint32_t i = 0; i < nc; i++) {
                if (wt[i] < floor_w)
                    continue;
                int bin = (int)((mx - c[i].logit) * inv_t * (NB / WRK_SAMPLE_CUT));
                bin = bin < 0 ? 0 : bin >= NB ? NB - 1 : bin;
                mass[bin] += wt[i];
                total += wt[i];
            }
            double target = (double)p->top_p * total, cum = 0.0;
            int edge = 0;
            while (edge < NB - 1 && cum + mass[edge] < target)
                cum += mass[edge++];
            free(mass);
            uint32_t ne = 0;
            for (uint32_t i = 0; i < nc; i++) {
                int bin = (int)((mx - c[i].logit) * inv_t * (NB / WRK_SAMPLE_CUT));
                bin = bin < 0 ? 0 : bin >= NB ? NB - 1 : bin;
                if (bin == edge && wt[i] >= floor_w)
                    ne++;
            }
            wrk_cand *e = malloc((size_t)(ne ? ne : 1) * sizeof(*e));
            if (e == NULL) {
                free(c_heap);
                free(wt_heap);
                return WK_ENOMEM;
            }
            ne = 0;
            for (uint32_t i = 0; i < nc; i++) {
                int bin = (int)((mx - c[i].logit) * inv_t * (NB / WRK_SAMPLE_CUT));
                bin = bin < 0 ? 0 : bin >= NB ? NB - 1 : bin;
                if (bin == edge && wt[i] >= floor_w)
                    e[ne++] = c[i];
            }
            qsort(e, ne, sizeof(*e), wrk_cand_cmp);
            for (uint32_t i = 0; i < ne; i++) {
                cum += expf((e[i].logit - mx) * inv_t);
                if (cum >= target || i + 1 == ne) {
                    floor_w = expf((e[i].logit - mx) * inv_t);
                    break;
                }
            }
            free(e);
        }
        double sum = 0.0;
        for (uint32_t i = 0; i < nc; i++)
            sum += wt[i] >= floor_w ? wt[i] : 0.0f;
        double u = wrk_sample_uniform(p->seed, p->sample_index) * sum, acc = 0.0;
        for (uint32_t i = 0; i < nc; i++) {
            if (wt[i] < floor_w)
                continue;
            chosen = c[i].id;
            acc += wt[i];
            if (u < acc)
                break;
        }
        free(c_heap);
        free(wt_heap);
    }
    out->token = chosen;
    out->logprob = want_lp ? logits[chosen] - lse : 0.0f;
    return WK_OK;
}
