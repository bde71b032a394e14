/*
 * ctl_resp_plan: a parsed Responses request (ctl_resp_req) as the shared
 * generation request (ctl_openai_req's wire and plan parts), without a
 * connection: the conversation rendered with the model's template (its
 * own, or the World template) and tokenized, the tools and the tool-call
 * constraint, and the generation's parameters. Every refusal is a
 * ctl_openai_perr (with the Responses API's status and code) the route
 * sends. Reads app's limits, tokenizer and chat template; the previous
 * response's record and the served model's fingerprint come from the route
 * (ctl_responses), which looked them up. Same thread as the request.
 */
#ifndef CTL_RESP_PLAN_H
#define CTL_RESP_PLAN_H

#include <stdbool.h>

#include "ctl_openai.h"
#include "ctl_resp_req.h"

/* What the route knows of the conversation besides the body. */
typedef struct ctl_resp_conv {
    const json_t *prev;      /* the previous response's record, NULL: none */
    const char *fingerprint; /* the served model's (a ready worker's), NULL: none ready */
    const json_t *history;   /* the items before this request, in the record's form */
    const json_t *input;     /* this request's items, in the record's form */
} ctl_resp_conv;

/*
 * Fills r (zeroed but for r->plan.owner, r->plan.reuse and r->wire.cache,
 * the caller's) from q and cv: r->wire (model, stream, the messages or the
 * templated render, tools, call format, forced-call grammar, reasoning),
 * r->plan's prompt (the previous state's exact tokens and the rest as their
 * continuation when the history renders as that state saw it: *exact then,
 * else the whole text), checkpoint boundaries, and r->plan.gen (max tokens,
 * the turn-end stop, sampling, logit_bias checked against the vocab, the
 * seed when q has one: the caller draws one otherwise, and sets the
 * deadline). False with *pe on the first refusal, in the order the route
 * reports them; r may then hold allocations (ctl_openai_req_fini).
 */
WK_MUST_CHECK bool ctl_resp_plan(ctl_app *app, const ctl_resp_req *q, const ctl_resp_conv *cv,
                                 ctl_openai_req *r, bool *exact, ctl_openai_perr *pe);

#endif /* CTL_RESP_PLAN_H */
