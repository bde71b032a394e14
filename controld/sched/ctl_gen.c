/*
 * ctl_gen: the token loop. Keeps the not-yet-emitted tail of the text (at
 * most the longest stop string minus one byte, plus an incomplete UTF-8
 * character inside the token stream), so that what is emitted never has to
 * be taken back. The per-token work is the job's token hook
 * (ctl_gen_on_token, run by the step loop); the caller's thread only
 * delivers what the hook published (ctl_gen_deliver).
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

/* Tokens published and not yet taken by the consumer at which the job is throttled. */
#define CTL_GEN_BACKLOG_MAX 64

/* One sink call: the text and tokens published up to these ends. */
typedef struct ctl_gen_mark {
    size_t text_end;          /* end of its text in out */
    size_t tok_end;           /* end of its tokens in tokens */
} ctl_gen_mark;

/*
 * A generation's state. The producer part is used by one thread at a time:
 * the step loop through the job's token hook, or the consumer for a TOKEN
 * event that came before the hook was set. The published part is under the
 * job's lock (ctl_job_lock): the producer appends, the consumer copies out.
 */
typedef struct ctl_gen_state {
    /* producer */
    const ctl_gen_params *p;  /* parameters (the consumer's, alive while the job is) */
    wk_tok_stream ts;         /* detokenizer */
    const wk_tok *tok;        /* its tokenizer: token pieces for a constrained row's matcher */
    int32_t eos;              /* end-of-text id, < 0: none */
    ctl_gen_buf tail;         /* decoded, not yet emitted */
    size_t tok_emitted;       /* tokens already covered by a mark */
    bool finished;            /* the last token was decided */
    /* published (job lock) */
    ctl_gen_buf out;          /* emitted text */
    ctl_gen_token *tokens;    /* sampled tokens */
    size_t n_tokens;          /* entries */
    size_t tok_cap;           /* allocated */
    const char *finish_reason; /* "length" or "stop" */
    ctl_gen_mark *marks;      /* sink calls not yet taken */
    size_t n_marks;           /* entries */
    size_t marks_cap;         /* allocated */
    size_t tok_taken;         /* tokens the consumer took */
    wk_err err;               /* the producer failed (out of memory, tokenizer) */
    char errmsg[sizeof(((wk_diag *)0)->msg)]; /* its message */
    /* consumer */
    ctl_gen_sink_fn sink;     /* sink, may be NULL */
    ctl_gen_flush_fn flush;   /* flush after a batch of sink calls, may be NULL */
    void *sink_arg;           /* their argument */
    size_t text_sent;         /* text handed to the sink */
    size_t tok_sent;          /* tokens handed to the sink */
    ctl_gen_buf ctext;        /* copy of the text taken */
    ctl_gen_token *ctoks;     /* copy of the tokens taken */
    size_t ctoks_cap;         /* allocated */
    ctl_gen_mark *cmarks;     /* copy of the marks taken */
    size_t cmarks_cap;        /* allocated */
} ctl_gen_state;

/* Grows *arr (elements of size es) to hold need entries. */
static wk_err
ctl_gen_grow(void **arr, size_t *cap, size_t need, size_t es)
{
    if (need <= *cap)
        return WK_OK;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need)
        ncap *= 2;
    void *np = realloc(*arr, ncap * es);
    if (np == NULL)
        return WK_ENOMEM;
    *arr = np;
    *cap = ncap;
    return WK_OK;
}

/*
 * Publishes token t and the first n bytes of the tail as one sink call (the
 * tokens since the last one ride along). Caller holds the job's lock.
 */
static wk_err
ctl_gen_publish_locked(ctl_gen_state *g, const ctl_gen_token *t, size_t n, bool emit)
{
    if (t != NULL) {
        if (ctl_gen_grow((void **)&g->tokens, &g->tok_cap, g->n_tokens + 1,
                         sizeof(*g->tokens)) != WK_OK)
            return WK_ENOMEM;
        g->tokens[g->n_tokens++] = *t;
    }
    if (!emit || (n == 0 && g->n_tokens == g->tok_emitted))
        return WK_OK;
    if (ctl_gen_grow((void **)&g->marks, &g->marks_cap, g->n_marks + 1, sizeof(*g->marks)) !=
            WK_OK ||
        ctl_gen_buf_put(&g->out, g->tail.p ? g->tail.p : "", n) != WK_OK)
        return WK_ENOMEM;
    g->marks[g->n_marks++] = (ctl_gen_mark){.text_end = g->out.len, .tok_end = g->n_tokens};
    g->tok_emitted = g->n_tokens;
    if (n > 0) {
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

/*
 * The token hook: records the token, detokenizes it, scans for stop strings
 * and decides (max_tokens, end of text, a stop string: stop). Publishes the
 * text that can no longer be taken back for the consumer's sink.
 */
static ctl_job_decision
ctl_gen_on_token(void *arg, ctl_job *job, const ctl_job_event *ev)
{
    ctl_gen_state *g = arg;
    const ctl_gen_params *p = g->p;
    if (g->finished || g->err != WK_OK)
        return CTL_JOB_STOP;
    ctl_gen_token t = {.id = ev->token, .logprob = ev->logprob, .n_top = ev->n_top};
    memcpy(t.top_id, ev->top_token, sizeof(t.top_id));
    memcpy(t.top_logprob, ev->top_logprob, sizeof(t.top_logprob));
    size_t n_after = g->n_tokens + 1; /* (only this thread appends) */
    bool stop = false;
    wk_err err = WK_OK;
    wk_diag d = {{0}};
    const char *reason = NULL;
    bool grammar_done = false;
    uint8_t *mask = NULL;
    size_t n_mask = 0;
    if (p->match != NULL && !(ev->token == g->eos && g->eos >= 0)) {
        /* The worker sampled from the mask, so the matcher takes it; if not, stop here. */
        size_t pl = 0;
        const uint8_t *pb = wk_tok_piece(g->tok, ev->token, &pl);
        grammar_done = pb == NULL || !wk_gmatch_advance(p->match, pb, pl) ||
                       wk_gmatch_done(p->match);
        /* the next sample's allowed tokens; none (a vocab without the bytes it needs): stop */
        if (!grammar_done && (err = ctl_gen_mask(p, &mask, &n_mask)) == WK_OK && n_mask == 0)
            grammar_done = true;
    }
    if (ev->token == g->eos && g->eos >= 0 && (p->stop_on_eot || p->match != NULL)) {
        reason = "stop";
        stop = true;
    } else if (err == WK_OK) {
        char piece[WK_TOK_STREAM_OUT_MAX];
        size_t plen = 0;
        err = wk_tok_stream_push(&g->ts, ev->token, piece, sizeof(piece), &plen, &d);
        if (err == WK_OK)
            err = ctl_gen_buf_put(&g->tail, piece, plen);
    }
    if (grammar_done && !stop) {
        reason = "stop";
        stop = true;
    }
    bool at_max = n_after >= p->max_tokens;
    if (err == WK_OK && (stop || at_max)) {
        /* The last token: flush the held character, then scan once more. */
        char fl[WK_TOK_STREAM_FLUSH_MAX];
        size_t fn = wk_tok_stream_flush(&g->ts, fl);
        err = ctl_gen_buf_put(&g->tail, fl, fn);
    }
    size_t emit_len = 0;
    if (err == WK_OK) {
        wk_chat_stop r = {.safe_len = g->tail.len};
        if (!stop && p->n_stops > 0 && g->tail.len > 0)
            wk_chat_stop_scan(g->tail.p, g->tail.len, p->stops, p->n_stops, &r);
        if (r.found) {
            reason = "stop";
            stop = true;
            emit_len = r.match_pos;
        } else {
            emit_len = stop || at_max ? g->tail.len : r.safe_len;
        }
    }
    ctl_job_lock(job);
    if (err == WK_OK)
        err = ctl_gen_publish_locked(g, &t, emit_len, true);
    else
        (void)ctl_gen_publish_locked(g, &t, 0, false); /* (the token as the old loop kept it) */
    if (err != WK_OK) {
        g->err = err;
        snprintf(g->errmsg, sizeof(g->errmsg), "%s",
                 d.msg[0] ? d.msg : err == WK_ENOMEM ? "out of memory" : wk_strerror(err));
    }
    if (reason != NULL)
        g->finish_reason = reason;
    bool last = stop || at_max || err != WK_OK;
    /* Without a sink the consumer only wants the end (DONE): no wake-ups, no throttling. */
    bool streaming = g->sink != NULL;
    if (streaming && !last && g->n_tokens - g->tok_taken >= CTL_GEN_BACKLOG_MAX)
        ctl_job_throttle(job, true); /* a slow client: wait until it took them */
    ctl_job_unlock(job, streaming);
    if (err == WK_OK && !last && mask != NULL) /* (the job is the hook's until it returns) */
        err = ctl_job_set_allowed(job, mask, n_mask);
    free(mask);
    if (err != WK_OK) {
        if (g->err == WK_OK) {
            g->err = err;
            snprintf(g->errmsg, sizeof(g->errmsg), "out of memory");
        }
        return CTL_JOB_STOP;
    }
    if (last) {
        g->finished = true;
        return p->feed_stop ? CTL_JOB_STOP_FEED : CTL_JOB_STOP;
    }
    return CTL_JOB_CONTINUE;
}

/*
 * Takes what the hook published (one short hold of the job's lock), hands
 * it to the sink in the calls it was published as, then flushes once.
 */
static wk_err
ctl_gen_deliver(ctl_gen_state *g, ctl_job *job)
{
    ctl_job_lock(job);
    size_t nm = g->n_marks;
    size_t text0 = g->text_sent, tok0 = g->tok_sent;
    size_t text1 = nm ? g->marks[nm - 1].text_end : text0;
    size_t tok1 = nm ? g->marks[nm - 1].tok_end : tok0;
    wk_err err = WK_OK;
    if (nm > 0 && g->sink != NULL) {
        g->ctext.len = 0;
        err = ctl_gen_buf_put(&g->ctext, g->out.p + text0, text1 - text0);
        if (err == WK_OK)
            err = ctl_gen_grow((void **)&g->ctoks, &g->ctoks_cap, tok1 - tok0 + 1,
                               sizeof(*g->ctoks));
        if (err == WK_OK)
            err = ctl_gen_grow((void **)&g->cmarks, &g->cmarks_cap, nm, sizeof(*g->cmarks));
        if (err == WK_OK) {
            memcpy(g->ctoks, g->tokens + tok0, (tok1 - tok0) * sizeof(*g->ctoks));
            memcpy(g->cmarks, g->marks, nm * sizeof(*g->cmarks));
        }
    }
    if (err == WK_OK) {
        g->n_marks = 0;
        g->tok_taken = g->n_tokens;
    }
    ctl_job_unlock(job, false);
    if (err != WK_OK)
        return err;
    ctl_job_throttle(job, false);
    if (nm == 0)
        return WK_OK;
    g->text_sent = text1;
    g->tok_sent = tok1;
    if (g->sink == NULL)
        return WK_OK;
    size_t at_text = text0, at_tok = tok0;
    for (size_t i = 0; i < nm && err == WK_OK; i++) {
        const ctl_gen_mark *m = &g->cmarks[i];
        err = g->sink(g->sink_arg, g->ctext.p + (at_text - text0), m->text_end - at_text,
                      g->ctoks + (at_tok - tok0), m->tok_end - at_tok);
        at_text = m->text_end;
        at_tok = m->tok_end;
    }
    if (err == WK_OK && g->flush != NULL)
        err = g->flush(g->sink_arg);
    return err;
}

static void
ctl_gen_state_fini(ctl_gen_state *g)
{
    free(g->tail.p);
    free(g->marks);
    free(g->ctext.p);
    free(g->ctoks);
    free(g->cmarks);
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
    return ctl_gen_run_job(job, tok, p, sink, NULL, sink_arg, res, d);
}

/* A generation whose consumer is driven from outside (ctl_gen_stream_*). */
struct ctl_gen_stream {
    ctl_job *job;             /* the job, owned */
    ctl_gen_state *g;         /* its state, owned */
    const ctl_gen_params *p;  /* parameters, borrowed */
    wk_diag d;                /* what the pump failed with */
};

/* Starts consuming job: g's hook decides its tokens from here on. Consumes job. */
static wk_err
ctl_gen_state_new(ctl_job *job, const wk_tok *tok, const ctl_gen_params *p,
                  ctl_gen_sink_fn sink, ctl_gen_flush_fn flush, void *sink_arg,
                  ctl_gen_state **out)
{
    ctl_gen_state *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        ctl_job_free(job);
        return WK_ENOMEM;
    }
    g->p = p;
    g->sink = sink;
    g->flush = flush;
    g->sink_arg = sink_arg;
    g->finish_reason = "length";
    g->err = WK_OK;
    wk_tok_stream_init(&g->ts, tok);
    g->tok = tok;
    /* The tokenizer's end-of-text id; < 0: none, never stop on it. */
    g->eos = tok != NULL ? wk_tok_eos(tok) : WK_TOK_EOT;
    /* From here the step loop decides this job's tokens (ctl_gen_on_token). */
    ctl_job_set_on_token(job, ctl_gen_on_token, g);
    *out = g;
    return WK_OK;
}

/* Handles one event of job; *done when it was the last (DONE, ERROR). */
static wk_err
ctl_gen_handle(ctl_gen_state *g, ctl_job *job, const ctl_job_event *ev, bool *done, wk_diag *d)
{
    *done = false;
    if (ev->type == CTL_JOB_EV_DATA)
        return ctl_gen_deliver(g, job);
    if (ev->type == CTL_JOB_EV_TOKEN) {
        /* A token sampled before the hook was set: decide it here, as the hook would. */
        ctl_job_decision dec = ctl_gen_on_token(g, job, ev);
        if (dec == CTL_JOB_CONTINUE)
            ctl_job_continue(job);
        else
            ctl_job_stop(job, dec == CTL_JOB_STOP_FEED);
        return WK_OK;
    }
    /* DONE or ERROR: what was published before it goes out first. */
    *done = true;
    wk_err err = ctl_gen_deliver(g, job);
    if (err == WK_OK && ev->type == CTL_JOB_EV_ERROR)
        err = wk_diag_set(d, ev->err, "%s", ev->message);
    return err;
}

/* Ends the generation after its consumer loop (err: how it ended); fills res. Frees g and job. */
static wk_err
ctl_gen_state_end(ctl_gen_state *g, ctl_job *job, wk_err err, ctl_gen_result *res, wk_diag *d)
{
    const ctl_gen_params *p = g->p;
    /* (a hook never runs after a DONE; after an error, ctl_job_free() waits for it) */
    if (err == WK_OK && g->err != WK_OK)
        err = wk_diag_set(d, g->err, "%s", g->errmsg);
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
    res->tokens = g->tokens;
    res->n_tokens = g->n_tokens;
    res->finish_reason = g->finish_reason;
    g->tokens = NULL;
    if (err == WK_OK && g->out.p == NULL && ctl_gen_buf_put(&g->out, "", 0) != WK_OK)
        err = WK_ENOMEM;
    res->text = g->out.p;
    res->text_len = g->out.len;
    ctl_gen_state_fini(g);
    free(g);
    if (err != WK_OK) {
        ctl_gen_result_fini(res);
        return err;
    }
    return WK_OK;
}

wk_err
ctl_gen_run_job(ctl_job *job, const wk_tok *tok, const ctl_gen_params *p, ctl_gen_sink_fn sink,
                ctl_gen_flush_fn flush, void *sink_arg, ctl_gen_result *res, wk_diag *d)
{
    memset(res, 0, sizeof(*res));
    ctl_gen_state *g = NULL;
    wk_err err = ctl_gen_state_new(job, tok, p, sink, flush, sink_arg, &g);
    if (err != WK_OK)
        return err;
    bool done = false;
    while (err == WK_OK && !done) {
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
        err = ctl_gen_handle(g, job, &ev, &done, d);
    }
    return ctl_gen_state_end(g, job, err, res, d);
}

wk_err
ctl_gen_stream_new(ctl_job *job, const wk_tok *tok, const ctl_gen_params *p,
                   ctl_gen_sink_fn sink, ctl_gen_flush_fn flush, void *sink_arg,
                   ctl_job_waker_fn waker, void *waker_arg, ctl_gen_stream **out)
{
    ctl_gen_stream *gs = calloc(1, sizeof(*gs));
    if (gs == NULL) {
        ctl_job_free(job);
        return WK_ENOMEM;
    }
    /* (before the first poll arms it) */
    ctl_job_set_waker(job, waker, waker_arg);
    wk_err err = ctl_gen_state_new(job, tok, p, sink, flush, sink_arg, &gs->g);
    if (err != WK_OK) {
        free(gs);
        return err;
    }
    gs->job = job;
    gs->p = p;
    *out = gs;
    return WK_OK;
}

wk_err
ctl_gen_stream_pump(ctl_gen_stream *gs, bool *done)
{
    *done = false;
    for (;;) {
        ctl_job_event ev;
        if (ctl_job_poll(gs->job, &ev) != WK_OK)
            return WK_OK; /* nothing more: armed, the waker calls back */
        wk_err err = ctl_gen_handle(gs->g, gs->job, &ev, done, &gs->d);
        if (err != WK_OK || *done)
            return err;
    }
}

wk_err
ctl_gen_stream_end(ctl_gen_stream *gs, wk_err err, ctl_gen_result *res, wk_diag *d)
{
    memset(res, 0, sizeof(*res));
    if (err == WK_ETIMEDOUT && gs->d.msg[0] == '\0')
        err = wk_diag_set(d, WK_ETIMEDOUT, "request timed out");
    else if (err != WK_OK && gs->d.msg[0] != '\0')
        err = wk_diag_set(d, err, "%s", gs->d.msg);
    err = ctl_gen_state_end(gs->g, gs->job, err, res, d);
    free(gs);
    return err;
}
