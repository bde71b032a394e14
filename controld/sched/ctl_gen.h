/*
 * ctl_gen: one generation, from input tokens to finished text, on top of
 * the scheduler: incremental UTF-8-safe detokenization, stop strings
 * (checked on text; the stop string is never emitted), end of text,
 * max_tokens, and per-token logprobs. Text is handed to a sink as soon as it
 * can no longer be part of a stop string, so streaming and blocking callers
 * see exactly the same bytes. Used by the OpenAI routes and the state API.
 *
 * Threading: the caller (an HTTP thread) blocks until done. Each token is
 * detokenized, checked and decided by a token hook that the worker's step
 * loop runs (ctl_job_set_on_token); the caller only wakes to hand what was
 * published to the sink (one call per token, as published) and flushes once
 * per wake-up. The sink and flush run on the calling thread.
 */
#ifndef CTL_GEN_H
#define CTL_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctl_sched.h"
#include "wk_err.h"
#include "wk_grammar.h"
#include "wk_tok.h"

#define CTL_GEN_MAX_STOPS 8

/* One generated token as reported to sinks and results. */
typedef struct ctl_gen_token {
    int32_t id;                /* token id */
    float logprob;             /* its logprob */
    uint32_t n_top;            /* alternatives */
    int32_t top_id[20];        /* alternative ids, descending */
    float top_logprob[20];     /* their logprobs */
} ctl_gen_token;

typedef struct ctl_gen_params {
    uint32_t max_tokens;        /* most tokens to sample (>= 1) */
    bool stop_on_eot;           /* the tokenizer's end-of-text id ends the generation */
    const char *stops[CTL_GEN_MAX_STOPS]; /* stop strings, borrowed */
    size_t n_stops;             /* entries in stops */
    ctl_sample_spec sample;     /* sampling */
    uint64_t sample_index;      /* RNG position of the first sampled token */
    uint64_t deadline_ms;       /* monotonic deadline, 0 = none */
    const ctl_slot_ref *slot;   /* run on a held slot (NULL: a fresh one) */
    bool fresh;                 /* with slot: zero it first */
    bool keep_slot;             /* keep the slot at the end (result.slot) */
    bool feed_stop;             /* feed the final sampled token into the state too */
    const ctl_sched_reuse *reuse; /* checkpoint hooks (ctl_ckpt_plan), NULL = none */
    const char *worker;         /* without slot: preferred worker while it has a free slot
                                 * (a warm checkpoint's), NULL = none */
    /*
     * Constrained decoding (a forced tool call), NULL = none: every sample
     * may only take a token of gvocab that match can advance by (end of text
     * only once it accepts); each sampled token advances it, and the
     * generation stops (finish_reason "stop") once it is done or the model
     * ends the text. Borrowed; match starts where the output starts and is
     * used by this generation only.
     */
    wk_gmatch *match;
    const wk_gvocab *gvocab;    /* the tokenizer's vocab trie, with match */
} ctl_gen_params;

/*
 * Receives text as it becomes final. toks are the tokens sampled since the
 * previous call (their text may straddle calls). Return WK_EIO to cancel
 * (client went away); other errors abort too.
 */
typedef wk_err (*ctl_gen_sink_fn)(void *arg, const char *text, size_t len,
                                  const ctl_gen_token *toks, size_t n_toks);

/* Called after a batch of sink calls (all a wake-up found): write it out. May be NULL. */
typedef wk_err (*ctl_gen_flush_fn)(void *arg);

typedef struct ctl_gen_result {
    char *text;                 /* all emitted text, NUL-terminated, caller frees */
    size_t text_len;            /* bytes */
    ctl_gen_token *tokens;      /* sampled tokens (incl. a stopping one), caller frees */
    size_t n_tokens;            /* entries */
    const char *finish_reason;  /* "stop" or "length" (static) */
    size_t computed;            /* input tokens computed (at most the input's length) */
    size_t fed;                 /* tokens fed into the slot (input + accepted) */
    ctl_slot_ref slot;          /* the kept slot, when keep_slot */
} ctl_gen_result;

/*
 * Submits the generation's job without waiting for it, so that admission
 * errors (queue full, no worker) can be answered before a stream starts.
 * On success *job is passed to ctl_gen_run() (which consumes it).
 */
WK_MUST_CHECK wk_err ctl_gen_submit(ctl_sched *sched, const int32_t *input, size_t n,
                                    const ctl_gen_params *p, ctl_job **job, wk_diag *d);

/*
 * Runs one generation of input (n tokens, borrowed) through sched with
 * tokenizer tok. On success fills *res (caller frees with
 * ctl_gen_result_fini). Errors: the scheduler's (WK_EQUEUEFULL, WK_EUNAVAIL,
 * WK_ETIMEDOUT, ...), WK_EIO when the sink cancelled; diag says why.
 */
WK_MUST_CHECK wk_err ctl_gen_run(ctl_sched *sched, const wk_tok *tok, const int32_t *input,
                                 size_t n, const ctl_gen_params *p, ctl_gen_sink_fn sink,
                                 void *sink_arg, ctl_gen_result *res, wk_diag *d);

/*
 * Like ctl_gen_run() for a job from ctl_gen_submit(); always consumes job.
 * flush (may be NULL) is called with sink_arg after the sink calls of one
 * wake-up; an error from it cancels like the sink's.
 */
WK_MUST_CHECK wk_err ctl_gen_run_job(ctl_job *job, const wk_tok *tok, const ctl_gen_params *p,
                                     ctl_gen_sink_fn sink, ctl_gen_flush_fn flush,
                                     void *sink_arg, ctl_gen_result *res, wk_diag *d);

/*
 * The same generation with its consumer driven from outside (an event loop)
 * instead of a blocked thread: ctl_gen_stream_new() sets job's waker
 * (called when there is something for the consumer, see ctl_job_set_waker),
 * ctl_gen_stream_pump() hands what is there to the sink without waiting,
 * ctl_gen_stream_end() finishes like ctl_gen_run_job() returns.
 */
typedef struct ctl_gen_stream ctl_gen_stream;

/*
 * Starts consuming job (always consumed) with sink and flush as in
 * ctl_gen_run_job(); waker(waker_arg) is called, from the step loop or
 * another scheduler thread, whenever pump has something to do after it
 * found nothing. *out is freed by ctl_gen_stream_end(). WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_gen_stream_new(ctl_job *job, const wk_tok *tok,
                                        const ctl_gen_params *p, ctl_gen_sink_fn sink,
                                        ctl_gen_flush_fn flush, void *sink_arg,
                                        ctl_job_waker_fn waker, void *waker_arg,
                                        ctl_gen_stream **out);

/*
 * Hands everything published so far to the sink (then flush) and decides
 * tokens that came before the hook was set; never waits. *done when the
 * generation ended (then call ctl_gen_stream_end()); otherwise the waker
 * will be called. An error (the sink's, the job's) ends it too: pass it to
 * ctl_gen_stream_end(), which reports its message. One call at a time.
 */
WK_MUST_CHECK wk_err ctl_gen_stream_pump(ctl_gen_stream *gs, bool *done);

/*
 * Ends the generation: err is how the pumping ended (WK_OK after done, or
 * an error, WK_ETIMEDOUT for a deadline the caller saw pass). Fills *res
 * and returns like ctl_gen_run_job(); frees gs and the job (after which no
 * waker call comes).
 */
WK_MUST_CHECK wk_err ctl_gen_stream_end(ctl_gen_stream *gs, wk_err err, ctl_gen_result *res,
                                        wk_diag *d);

/* Frees what a result owns. NULL-safe. */
void ctl_gen_result_fini(ctl_gen_result *res);

#endif /* CTL_GEN_H */
