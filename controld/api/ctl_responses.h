/*
 * ctl_responses: OpenAI's Responses API on durable states
 * (docs/RESPONSES.md). POST /v1/responses generates from input items;
 * with store (the default) the response is kept: its item list as a record
 * in the store's key-value table ("resp:" keys, scoped by owner), its end
 * state (the exact tokens: prompt + the reply as the state consumed it) as
 * the end-of-reply checkpoint of ctl_ckpt, written through to disk. A request
 * naming previous_response_id renders the previous history plus the new
 * items, takes the previous state's exact tokens for the history and
 * prefills only what follows (cached_tokens = everything the previous state
 * held); when the rendering of history differs (other instructions) it
 * falls back to the longest prefix checkpoint, never to a wrong state.
 * GET/DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items, and
 * GET/DELETE /admin/responses for wkvmctl.
 *
 * Never parses chat bodies, never talks to workers: generation goes through
 * ctl_gen and the reuse halves of ctl_openai.
 */
#ifndef CTL_RESPONSES_H
#define CTL_RESPONSES_H

#include <stddef.h>

#include "ctl_app.h"
#include "wk_err.h"

/* Routes of this module (at most 4 entries written). */
size_t ctl_responses_routes(ctl_app *app, ctl_http_route *out, size_t cap);

/*
 * Stops the background responses still running (each stored as failed: the
 * controller shut down) and waits until their threads are gone. Called after
 * the HTTP server stopped, before the scheduler and the store are freed.
 */
void ctl_responses_shutdown(ctl_app *app);

/* Declares this module's metric families. */
WK_MUST_CHECK wk_err ctl_responses_metrics_declare(ctl_metrics *m);

#endif /* CTL_RESPONSES_H */
