/*
 * ctl_route_parse: the request bodies of the Durable State API (create,
 * generate, fork) and of the slot-migrate and drain admin routes as plain
 * values, without a connection. Each parser reads a parsed JSON body (and
 * for the token fields the app's model id, limits and tokenizer) and returns
 * false with a ctl_openai_perr on the first refusal, in the order the route
 * reports them; the route sends it (ctl_openai_send_perr). Nothing here
 * looks a state, slot or worker up: the routes do that around the parse.
 */
#ifndef CTL_ROUTE_PARSE_H
#define CTL_ROUTE_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctl_openai.h"

#define CTL_STATES_FORK_MAX 64 /* versions one fork makes at most */

/* POST /v1/states: a new state's name and tokens. */
typedef struct ctl_states_create_body {
    const char *name; /* borrowed from the body */
    int32_t *ids;     /* the prompt's tokens (>= 1), owned */
    size_t n_ids;     /* entries */
} ctl_states_create_body;

/* POST /v1/states/{id}/generate: the name to save under and the new prompt. */
typedef struct ctl_states_gen_body {
    const char *save_as; /* borrowed; NULL: not saved */
    int32_t *q;          /* the tokens fed after the state's, owned; NULL: none */
    size_t n_q;          /* entries */
} ctl_states_gen_body;

/* POST /v1/states/{id}/fork. */
typedef struct ctl_states_fork_body {
    const char *name; /* borrowed */
    int64_t count;    /* 1..CTL_STATES_FORK_MAX (default 1) */
} ctl_states_fork_body;

/*
 * The tokens of a create or generate body: one of "prompt" (text or token
 * ids), "prompt_ids" or "messages" (rendered with app's chat template, as
 * the chat route does). None given: *ids NULL and true unless required.
 * *ids is malloc'd.
 */
WK_MUST_CHECK bool ctl_states_parse_tokens(ctl_app *app, json_t *body, bool required, int32_t **ids,
                                           size_t *n, ctl_openai_perr *pe);

/* The create body: "name", "model" (app's when absent; another is a 404), the tokens. */
WK_MUST_CHECK bool ctl_states_parse_create(ctl_app *app, json_t *body, ctl_states_create_body *out,
                                           ctl_openai_perr *pe);

/*
 * The generate body: "save_as", the tokens (optional), then the common
 * generation fields into r (ctl_openai_parse_common_value, "prompt" taken
 * out of body first: it was the tokens). r->wire.chat, r->wire.model_optional
 * and r->plan.owner are the caller's; on failure r and out may hold
 * allocations (ctl_openai_req_fini, ctl_states_gen_body_fini).
 */
WK_MUST_CHECK bool ctl_states_parse_generate(ctl_app *app, json_t *body, ctl_states_gen_body *out,
                                             ctl_openai_req *r, ctl_openai_perr *pe);

/*
 * The same in two parts, for the route, which checks the owner's state quota
 * between them when "save_as" is given (the order of refusals: save_as, the
 * quota, the rest). _save_as clears out first; _rest keeps out->save_as.
 */
WK_MUST_CHECK bool ctl_states_parse_generate_save_as(const json_t *body, ctl_states_gen_body *out,
                                                     ctl_openai_perr *pe);
WK_MUST_CHECK bool ctl_states_parse_generate_rest(ctl_app *app, json_t *body,
                                                  ctl_states_gen_body *out, ctl_openai_req *r,
                                                  ctl_openai_perr *pe);

/* The fork body (NULL: none was sent): "name" (required) and "count". */
WK_MUST_CHECK bool ctl_states_parse_fork(const json_t *body, ctl_states_fork_body *out,
                                         ctl_openai_perr *pe);

/* Frees what the bodies own. */
void ctl_states_create_body_fini(ctl_states_create_body *b);
void ctl_states_gen_body_fini(ctl_states_gen_body *b);

/* POST /admin/slots/{id}/migrate: "to", the destination worker (borrowed). */
WK_MUST_CHECK bool ctl_migrate_parse_to(const json_t *body, const char **to, ctl_openai_perr *pe);

/* POST /admin/workers/{id}/drain: "undrain" (default false; NULL body: none sent). */
WK_MUST_CHECK bool ctl_migrate_parse_drain(const json_t *body, bool *undrain, ctl_openai_perr *pe);

#endif /* CTL_ROUTE_PARSE_H */
