/*
 * ctl_stream: glue between ctl_gen's outside-driven consumer and ctl_http's
 * hand-over. The job's waker is the loop stream's wake-up; the loop's pump
 * is ctl_gen_stream_pump().
 */
#include "ctl_stream.h"

#include <string.h>

/* The pump's argument: the generation, set before the stream starts. */
typedef struct ctl_stream_ctx {
    ctl_gen_stream *gs; /* the generation */
} ctl_stream_ctx;

static wk_err
ctl_stream_pump(void *arg, ctl_ssestream *st, bool *done)
{
    (void)st;
    ctl_stream_ctx *c = arg;
    return ctl_gen_stream_pump(c->gs, done);
}

wk_err
ctl_stream_gen_run(ctl_http_req *req, ctl_job *job, const wk_tok *tok, const ctl_gen_params *p,
                   ctl_gen_sink_fn sink, ctl_gen_flush_fn flush, void *sink_arg,
                   ctl_gen_result *res, wk_diag *d)
{
    ctl_stream_ctx c = {0};
    ctl_ssestream *st = NULL;
    if (ctl_http_sse_detach(req, ctl_stream_pump, &c, &st) != WK_OK)
        return ctl_gen_run_job(job, tok, p, sink, flush, sink_arg, res, d);
    memset(res, 0, sizeof(*res));
    wk_err err =
        ctl_gen_stream_new(job, tok, p, sink, flush, sink_arg, ctl_ssestream_wake, st, &c.gs);
    if (err != WK_OK)
        return err; /* (the stream never ran; req frees it) */
    err = ctl_http_sse_run(req, p->deadline_ms);
    return ctl_gen_stream_end(c.gs, err, res, d);
}
