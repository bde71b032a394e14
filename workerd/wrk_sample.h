/*
 * wrk_sample: per-row token sampling from a logits vector, deterministic
 * from (seed, sample_index) so that a row's choice never depends on the
 * batch it ran in, a restart, or a migration. Penalties follow OpenAI's
 * definition: logit[t] -= presence * (count[t] > 0) + frequency * count[t];
 * then OpenAI's logit_bias is added: logit[t] += bias[t].
 * Never logs; never allocates more than O(vocab) scratch per call.
 */
#ifndef WRK_SAMPLE_H
#define WRK_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"

#define WRK_SAMPLE_TOP_MAX 20

/* One logit_bias entry. */
typedef struct wrk_logit_bias {
    int32_t token; /* token id, < vocab */
    float bias;    /* added to its logit (-100..100) */
} wrk_logit_bias;

typedef struct wrk_sample_params {
    float temperature;       /* 0 = greedy (argmax, lowest id on ties) */
    float top_p;             /* nucleus mass in (0, 1]; 0 or 1 = off */
    uint32_t top_k;          /* keep the k most likely; 0 = off */
    float min_p;             /* keep tokens with p >= min_p * p_max; 0 = off */
    uint64_t seed;           /* request seed */
    uint64_t sample_index;   /* index of this token within the request */
    float presence_penalty;  /* -2..2 */
    float frequency_penalty; /* -2..2 */
    const int32_t *history;  /* generated tokens so far (penalties), borrowed */
    size_t n_history;        /* entries in history */
    const wrk_logit_bias *bias; /* added to the logits after the penalties, borrowed */
    size_t n_bias;           /* entries in bias */
    /*
     * Constrained decoding: NULL = every token; else a bitset of n_allowed
     * bytes (token i is bit i % 8 of byte i / 8; ids past it are not allowed).
     * Disallowed tokens get logit -inf after the bias and are never chosen
     * or reported; WK_EINVAL when no token of the vocab is allowed.
     */
    const uint8_t *allowed;
    size_t n_allowed;        /* bytes in allowed */
    uint32_t top_logprobs;   /* alternatives to report, <= WRK_SAMPLE_TOP_MAX */
    bool want_logprob;       /* compute the chosen token's logprob (else reported as 0) */
} wrk_sample_params;

typedef struct wrk_sample_result {
    int32_t token;                          /* chosen token */
    float logprob;                          /* its log-probability (after penalties, T=1),
                                               0 unless want_logprob or top_logprobs */
    uint32_t n_top;                         /* entries in top */
    int32_t top_token[WRK_SAMPLE_TOP_MAX];  /* most likely tokens, descending */
    float top_logprob[WRK_SAMPLE_TOP_MAX];  /* their log-probabilities */
} wrk_sample_result;

/*
 * Samples from logits[0..vocab). logits is used as scratch and modified.
 * WK_EINVAL for bad parameters (vocab 0, NaN temperature, a bias token id
 * outside [0, vocab) or a non-finite bias; history ids out of range are
 * ignored), WK_ENOMEM. logits is unchanged on WK_EINVAL.
 */
WK_MUST_CHECK wk_err wrk_sample(float *logits, uint32_t vocab, const wrk_sample_params *p,
                                wrk_sample_result *out);

/*
 * The index of the largest of x[0..n): the first one on a tie, NaN never
 * chosen, 0 when none is above -inf (what a scalar "x[i] > max" scan
 * picks). Exposed for tests.
 */
uint32_t wrk_sample_argmax(const float *x, uint32_t n);

/* The deterministic uniform in [0, 1) used for (seed, index); exposed for tests. */
double wrk_sample_uniform(uint64_t seed, uint64_t index);

#endif /* WRK_SAMPLE_H */
