/*
 * ctl_stream: a generation streamed as server-sent events, written by an
 * event loop (ctl_http_sse_detach) when the connection can be handed over,
 * else by the handler's own thread (ctl_gen_run_job). The sink and flush
 * see the same calls either way, so the bytes on the wire are the same.
 */
#ifndef CTL_STREAM_H
#define CTL_STREAM_H

#include "ctl_gen.h"
#include "ctl_http.h"

/*
 * ctl_gen_run_job() for a streamed reply: req has begun its events
 * (ctl_http_sse_begin) and is corked; sink and flush write to req with
 * ctl_http_sse_data/event and ctl_http_flush. They run on an event loop's
 * thread while the calling thread waits, or on the calling thread. Always
 * consumes job. Returns like ctl_gen_run_job(); WK_EIO when the client went
 * away (req is broken then).
 */
WK_MUST_CHECK wk_err ctl_stream_gen_run(ctl_http_req *req, ctl_job *job, const wk_tok *tok,
                                        const ctl_gen_params *p, ctl_gen_sink_fn sink,
                                        ctl_gen_flush_fn flush, void *sink_arg, ctl_gen_result *res,
                                        wk_diag *d);

#endif /* CTL_STREAM_H */
