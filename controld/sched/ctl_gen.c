/*
 * ctl_gen: the token loop. Keeps the not-yet-emitted tail of the text (at
 * most the longest stop string minus one byte, plus an incomplete UTF-8
 * character inside the token stream), so that what is emitted never has to
 * be taken back.
 */
#include "ctl_gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wk_chat.h"

static uint64_t
ctl_gen_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

typedef struct ctl_gen_buf {
    char *p;      /* bytes */
    size_t len;   /* used */
    size_t cap;   /* allocated */
} ctl_gen_buf;

static wk_err
ctl_gen_buf_put(ctl_gen_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (np == NULL)
            return WK_ENOMEM;
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return WK_OK;
}

void
ctl_gen_result_fini(ctl_gen_result *res)
{
    if (res == NULL)
        return;
    free(res->text);
    free(res->tokens);
    memset(res, 0, sizeof(*res));
}

typedef struct ctl_gen_state {
    ctl_gen_buf out;          /* emitted text */
    ctl_gen_buf tail;         /* decoded, not yet emitted */
    size_t tok_emitted;       /* tokens already handed to the sink */
    ctl_gen_result *res;      /* result being built */
    ctl_gen_sink_fn sink;     /* sink */
    void *sink_arg;           /* sink argument */
} ctl_gen_state;

/* Hands the first n bytes of the tail to the sink and the output. */
static wk_err
ctl_gen_emit(ctl_gen_state *g, size_t n)
{
    size_t nt = g->res->n_tokens - g->tok_emitted;
    if (n == 0 && nt == 0)
        return WK_OK;
    wk_err err = WK_OK;
    if (g->sink != NULL)
        err = g->sink(g->sink_arg, g->tail.p ? g->tail.p : "", n,
                      g->res->tokens + g->tok_emitted, nt);
    if (err != WK_OK)
        return err;
    g->tok_emitted = g->res->n_tokens;
    if (n > 0) {
        err = ctl_gen_buf_put(&g->out, g->tail.p, n);
        if (err != WK_OK)
            return err;
        memmove(g->tail.p, g->tail.p + n, g->tail.len - n);
        g->tail.len -= n;
        g->tail.p[g->tail.len] = '\0';
    }
    return WK_OK;
}

/*
 * The allowed-token bitset of p's matcher as the wire carries it (bit i % 8
 * of byte i / 8, trailing zero bytes dropped). *n = 0 when no token is
 * allowed. Caller frees *out.
 */
static wk_err
ctl_gen_mask(const ctl_gen_params *p, uint8_t **out, size_t *n)
{
    uint32_t v = wk_gvocab_size(p->gvocab);
    size_t words = ((size_t)v + 63) / 64, nb = ((size_t)v + 7) / 8;
    uint64_t *w = malloc((words ? words : 1) * sizeof(*w));
    uint8_t *b = malloc(nb ? nb : 1);
    if (w == NULL || b == NULL) {
        free(w);
        free(b);
        return WK_ENOMEM;
    }
    (void)wk_gmatch_allowed(p->match, p->gvocab, w);
    size_t last = 0;
    for (size_t i = 0; i < nb; i++) {
        b[i] = (uint8_t)(w[i / 8] >> (8 * (i % 8)));
        if (b[i] != 0)
            last = i + 1;
    }
    free(w);
    *out = b;
    *n = last;
    return WK_OK;
}

wk_err
ctl_gen_submit(ctl_sched *sched, const int32_t *input, size_t n, const ctl_gen_params *p,
               ctl_job **job, wk_diag *d)
{
    if (p->max_tokens == 0 || p->n_stops > CTL_GEN_MAX_STOPS ||
        (p->match != NULL) != (p->gvocab != NULL))
        return wk_diag_set(d, WK_EINVAL, "bad generation parameters");
    uint8_t *mask = NULL;
    size_t n_mask = 0;
    if (p->match != NULL) {
        wk_err err = ctl_gen_mask(p, &mask, &n_mask);
        if (err != WK_OK)
            return err;
        if (n_mask == 0) {
            free(mask);
            return wk_diag_set(d, WK_EINVAL, "the tool-call grammar allows no token of this vocab");
        }
    }
    ctl_job_spec spec = {
        .tokens = input,
        .n_tokens = n,
        .sample = true,
        .params = p->sample,
        .sample_index = p->sample_index,
        .slot = p->slot,
        .fresh = p->fresh,
        .deadline_ms = p->deadline_ms,
        .max_new = (uint64_t)p->max_tokens + 1, /* (the last sampled token may be fed too) */
        .reuse = p->reuse,
        .prefer = p->slot == NULL ? p->worker : NULL,
        .allowed = mask,
        .n_allowed = n_mask,
    };
    wk_err err = ctl_sched_submit(sched, &spec, job, d);
    free(mask);
    return err;
}

wk_err
ctl_gen_run(ctl_sched *sched, const wk_tok *tok, const int32_t *input, size_t n,
            const ctl_gen_params *p, ctl_gen_sink_fn sink, void *sink_arg, ctl_gen_result *res,
            wk_diag *d)
{
    memset(res, 0, sizeof(*res));
    ctl_job *job = NULL;
    wk_err err = ctl_gen_submit(sched, input, n, p, &job, d);
    if (err != WK_OK)
        return err;
    return ctl_gen_run_job(job, tok, p, sink, sink_arg, res, d);
}

wk_err
ctl_gen_run_job(ctl_job *job, const wk_tok *tok, const ctl_gen_params *p, ctl_gen_sink_fn sink,
                void *sink_arg, ctl_gen_result *res, wk_diag *d)
{
    memset(res, 0, sizeof(*res));
    wk_err err = WK_OK;
    ctl_gen_state g = {.res = res, .sink = sink, .sink_arg = sink_arg};
    /* Grown as tokens come: max_tokens is the client's, up to 11 MiB of records at 65536. */
    size_t tok_cap = p->max_tokens < 64 ? p->max_tokens : 64;
    res->tokens = calloc(tok_cap ? tok_cap : 1, sizeof(*res->tokens));
    if (res->tokens == NULL) {
        ctl_job_free(job);
        return WK_ENOMEM;
    }
    wk_tok_stream ts;
    wk_tok_stream_init(&ts, tok);
    /* The tokenizer's end-of-text id; < 0: none, never stop on it. */
    const int32_t eos = tok != NULL ? wk_tok_eos(tok) : WK_TOK_EOT;
    char piece[WK_TOK_STREAM_OUT_MAX];
    bool finished = false;
    res->finish_reason = "length";
    while (err == WK_OK) {
        ctl_job_event ev;
        /*
         * The deadline is also checked here, not only by the scheduler: a
         * worker that stops answering (SIGSTOP, a hung device) leaves the
         * step RPC pending and the scheduler silent until the step timeout.
         * Freeing the job cancels it; its slot comes back when the step ends.
         */
        uint32_t wait_ms = 1000;
        uint64_t now = ctl_gen_mono_ms();
        if (p->deadline_ms && now >= p->deadline_ms)
            wait_ms = 1;
        else if (p->deadline_ms && p->deadline_ms - now < wait_ms)
            wait_ms = (uint32_t)(p->deadline_ms - now) + 1;
        if (ctl_job_next(job, wait_ms, &ev) == WK_ETIMEDOUT) {
            if (p->deadline_ms && ctl_gen_mono_ms() > p->deadline_ms)
                err = wk_diag_set(d, WK_ETIMEDOUT, "request timed out");
            continue;
        }
        if (ev.type == CTL_JOB_EV_ERROR) {
            err = wk_diag_set(d, ev.err, "%s", ev.message);
            break;
        }
        if (ev.type == CTL_JOB_EV_DONE)
            break;
        /* A sampled token. */
        if (finished) {
            ctl_job_stop(job, false);
            continue;
        }
        if (res->n_tokens == tok_cap) {
            size_t ncap = tok_cap * 2 < p->max_tokens ? tok_cap * 2 : p->max_tokens;
            ctl_gen_token *nt = realloc(res->tokens, ncap * sizeof(*nt));
            if (nt == NULL) {
                err = wk_diag_set(d, WK_ENOMEM, "out of memory");
                break;
            }
            res->tokens = nt;
            tok_cap = ncap;
        }
        ctl_gen_token *t = &res->tokens[res->n_tokens++];
        t->id = ev.token;
        t->logprob = ev.logprob;
        t->n_top = ev.n_top;
        memcpy(t->top_id, ev.top_token, sizeof(t->top_id));
        memcpy(t->top_logprob, ev.top_logprob, sizeof(t->top_logprob));
        bool stop = false;
        bool grammar_done = false;
        if (p->match != NULL && !(ev.token == eos && eos >= 0)) {
            /* The worker sampled from the mask, so the matcher takes it; if not, stop here. */
            size_t plen = 0;
            const uint8_t *pb = wk_tok_piece(tok, ev.token, &plen);
            if (pb == NULL || !wk_gmatch_advance(p->match, pb, plen))
                grammar_done = true;
            else
                grammar_done = wk_gmatch_done(p->match);
        }
        if (ev.token == eos && eos >= 0 && (p->stop_on_eot || p->match != NULL)) {
            res->finish_reason = "stop";
            stop = true;
        } else {
            size_t plen = 0;
            err = wk_tok_stream_push(&ts, ev.token, piece, sizeof(piece), &plen, d);
            if (err == WK_OK)
                err = ctl_gen_buf_put(&g.tail, piece, plen);
            if (err != WK_OK)
                break;
        }
        if (grammar_done && !stop) {
            res->finish_reason = "stop";
            stop = true;
        }
        bool at_max = res->n_tokens >= p->max_tokens;
        if (stop || at_max) {
            /* The last token: flush the held character, then scan once more. */
            char fl[WK_TOK_STREAM_FLUSH_MAX];
            size_t fn = wk_tok_stream_flush(&ts, fl);
            if ((err = ctl_gen_buf_put(&g.tail, fl, fn)) != WK_OK)
                break;
        }
        wk_chat_stop r = {.safe_len = g.tail.len};
        if (!stop && p->n_stops > 0 && g.tail.len > 0)
            wk_chat_stop_scan(g.tail.p, g.tail.len, p->stops, p->n_stops, &r);
        if (r.found) {
            res->finish_reason = "stop";
            stop = true;
            err = ctl_gen_emit(&g, r.match_pos);
        } else if (stop || at_max) {
            err = ctl_gen_emit(&g, g.tail.len);
        } else {
            err = ctl_gen_emit(&g, r.safe_len);
        }
        if (err != WK_OK)
            break;
        if (!(stop || at_max) && p->match != NULL) {
            uint8_t *mask = NULL;
            size_t n_mask = 0;
            err = ctl_gen_mask(p, &mask, &n_mask);
            if (err == WK_OK && n_mask == 0) {
                /* Nothing can follow (a vocab without the bytes the grammar needs): stop. */
                res->finish_reason = "stop";
                stop = true;
            } else if (err == WK_OK) {
                err = ctl_job_set_allowed(job, mask, n_mask);
            }
            free(mask);
            if (err != WK_OK) {
                wk_diag_set(d, err, "out of memory");
                break;
            }
        }
        if (stop || at_max) {
            finished = true;
            ctl_job_stop(job, p->feed_stop);
        } else {
            ctl_job_continue(job);
        }
    }
    if (err == WK_OK && p->keep_slot) {
        err = ctl_job_keep_slot(job, &res->slot);
        if (err != WK_OK)
            wk_diag_set(d, err, "the slot could not be kept");
    }
    /* Input tokens computed: what the job computed less the samples it fed. */
    res->fed = ctl_job_fed(job);
    size_t n_in = ctl_job_n_input(job), own = ctl_job_computed(job);
    size_t gen_fed = res->fed > n_in ? res->fed - n_in : 0;
    res->computed = own > gen_fed ? own - gen_fed : 0;
    if (res->computed > n_in)
        res->computed = n_in;
    ctl_job_free(job);
    if (err != WK_OK) {
        free(g.out.p);
        free(g.tail.p);
        ctl_gen_result_fini(res);
        return err;
    }
    free(g.tail.p);
    if (g.out.p == NULL && ctl_gen_buf_put(&g.out, "", 0) != WK_OK) {
        ctl_gen_result_fini(res);
        return WK_ENOMEM;
    }
    res->text = g.out.p;
    res->text_len = g.out.len;
    return WK_OK;
}
