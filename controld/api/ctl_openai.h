/*
 * ctl_openai: the generation request shared by the OpenAI routes, the
 * Durable State API's generate route, the chat-session glue and the
 * Responses API, its parsing (ctl_openai_parse.c, without a connection:
 * a refusal is a ctl_openai_perr the route sends) and the answer's shaping.
 * A ctl_openai_req is three parts: the wire request (what the client asked),
 * the plan (the tokens fed, the generation's parameters, the reuse plan) and
 * the result (id, reuse, usage, finish); ctl_openai_generate() runs it and
 * answers (blocking JSON or SSE), calling on_done so a caller can add fields
 * (the saved state) to the final object.
 */
#ifndef CTL_OPENAI_H
#define CTL_OPENAI_H

#include <stdbool.h>
#include <time.h>

#include "ctl_app.h"
#include "ctl_ckpt.h"
#include "ctl_gen.h"
#include "ctl_toolgram.h"
#include "wk_chat.h"
#include "wk_toolcall.h"

typedef struct ctl_openai_req ctl_openai_req;

/*
 * What the client asked, as the parsers (ctl_openai_parse.c) read it: the
 * wire parameters, the messages and the prompt they render to, the tools and
 * the tool-call constraint. Written by the parse only; read by the session
 * glue (ctl_chat), the answer and the Responses API.
 */
typedef struct ctl_openai_wire {
    bool chat;                    /* chat.completions vs completions */
    bool model_optional;          /* "model" may be absent (state routes) */
    const char *model;            /* borrowed from the JSON */
    bool stream;                  /* SSE */
    bool include_usage;           /* stream_options.include_usage */
    bool return_token_ids;        /* extension */
    bool logprobs;                /* logprobs requested */
    uint32_t top_logprobs;        /* 0..20 */
    bool ignore_eos;              /* extension: exactly max_tokens */
    bool cache;                   /* the request's "cache" / "cache_prompt" (default true) */
    wk_chat_msg *msgs;            /* chat: the messages (roles/contents borrowed or owned) */
    char **msg_texts;             /* chat: owned contents */
    size_t n_msgs;                /* chat: entries */
    char *prompt_text;            /* chat: the rendered prompt, owned */
    size_t prompt_len;            /* chat: bytes */
    size_t *msg_ends;             /* chat: where each message ends in prompt_text, owned */
    bool templated;               /* chat: rendered with the model's own template (app chat_tpl) */
    bool think;                   /* chat: split the reply at the think markers (reasoning) */
    bool think_open;              /* chat: the prompt leaves the reply inside the markers */
    json_t *tools;                /* chat, templated: the request's tools (a reference), or NULL */
    json_t *tpl_msgs;             /* chat, templated: the messages as rendered (owned) */
    json_t *tpl_kw;               /* chat, templated: the request's template variables, or NULL */
    json_t *call_tools;           /* responses: the tools a call may name (allowed_tools), a
                                     reference; NULL: any of tools */
    wk_toolcall_fmt tool_fmt;     /* chat: parse the reply for calls in this format (NONE: not) */
    bool tool_serial;             /* chat: parallel_tool_calls false: at most one call returned */
    bool tool_forced;             /* chat: tool_choice "required" or named: constrained decoding */
    bool legacy_fn;               /* chat: the legacy `functions` API: message.function_call */
    char *tool_force_name;        /* chat: the named function, owned; NULL = any offered one */
    ctl_toolgram *toolgram;       /* chat, tool_forced: the constraint, owned */
} ctl_openai_wire;

/*
 * What runs: the tokens fed, the generation's parameters and the reuse plan
 * (checkpoint boundaries, the owner, a continued session's prefix). The
 * parse writes a first one (the prompt's tokens and boundaries, gen's
 * sampling, limits and stops from the wire); the session glue (ctl_chat,
 * ctl_states, ctl_responses) narrows it to a held slot and a delta, and
 * ctl_openai_reuse_begin() adds the checkpoint plan.
 */
typedef struct ctl_openai_plan {
    ctl_gen_params gen;           /* generation parameters */
    int32_t *prompt;              /* tokens to feed, owned */
    size_t n_prompt;              /* entries */
    size_t n_prompt_report;       /* prompt tokens reported in usage (0: n_prompt) */
    /* Reuse (ctl_ckpt): set by the chat and completions routes only. */
    bool reuse;                   /* plan checkpoints and look them up for this request */
    char owner[CTL_STORE_OWNER_MAX + 1]; /* whose checkpoints (never shared) */
    size_t bounds[CTL_CKPT_MAX_BOUNDS]; /* chat: token positions in prompt where a message ends */
    size_t n_bounds;              /* entries */
    size_t hist_end;              /* templated chat: prompt_text bytes before the generation
                                     prompt (0: unknown), a checkpoint boundary */
    size_t aligned_tokens;        /* chat: leading prompt tokens that are a reply's exact tokens */
    const int32_t *plan_prefix;   /* tokens already in gen.slot (a continued session), borrowed */
    size_t n_plan_prefix;         /* entries */
    ctl_ckpt_plan *ckpt;          /* during ctl_openai_generate(), NULL otherwise */
} ctl_openai_plan;

/*
 * What came of it: the answer's id, what the reuse covered, and after a
 * successful generation what the answer reports (ctl_openai_result_set():
 * usage and finish_reason; the sampled tokens and text stay in the
 * ctl_gen_result the hooks get).
 */
typedef struct ctl_openai_result {
    char id[48];                  /* response id */
    time_t created;               /* unix time */
    bool reused;                  /* a checkpoint was resumed */
    ctl_ckpt_hit reuse_kind;      /* how, when reused */
    size_t reused_tokens;         /* tokens it covered */
    size_t prompt_tokens;         /* usage: the prompt (plan.n_prompt_report, else n_prompt) */
    size_t completion_tokens;     /* usage: tokens sampled */
    size_t cached_tokens;         /* usage: prompt tokens not computed (reused or held) */
    const char *finish_reason;    /* "stop", "length", "tool_calls", "function_call" (static);
                                     NULL before the answer */
} ctl_openai_result;

/* One generation request: the three parts and the caller's hooks. */
struct ctl_openai_req {
    ctl_openai_wire wire;         /* what the client asked */
    ctl_openai_plan plan;         /* what runs */
    ctl_openai_result out;        /* what came of it */
    const char *route;            /* route label for wkvm_requests_total, as the HTTP metrics
                                     name it; NULL: /v1/chat/completions or /v1/completions */
    void *user;                   /* caller context for the hooks */
    /* After a successful generation: may add fields to the final JSON object. */
    void (*on_done)(ctl_openai_req *r, const ctl_gen_result *res, json_t *final_obj);
    /* After a failed or cancelled generation (kept slot cleanup). */
    void (*on_fail)(ctl_openai_req *r);
    /* Before generating: return true after sending an error to stop. */
    bool (*on_error_before)(ctl_openai_req *r, ctl_http_req *req);
};

/* The owner of a request's checkpoints (the API user, narrowed by Open WebUI's user id). */
void ctl_openai_owner(ctl_http_req *req, char out[CTL_STORE_OWNER_MAX + 1]);

/* Frees what r owns (tokens, messages, the rendered prompt), not r itself. */
void ctl_openai_req_fini(ctl_openai_req *r);

/*
 * Appends to r->plan.bounds the checkpoint boundaries of a chat prompt: the
 * token positions where r's messages end after byte offset off of
 * r->wire.prompt_text, for the tokens rest (n_rest) that encode the text from
 * off (the last token boundary at or before each end; a token across it
 * belongs to what follows), counted from pos0. The chat route calls it for
 * the whole prompt, the session glue for the delta a continued session
 * feeds (pos0 0), so a turn continued from a parked state still leaves a
 * checkpoint where its new user message ends. Reads r->wire.msg_ends,
 * r->wire.prompt_text and r->wire.n_msgs (nothing without msg_ends), writes only
 * r->plan.bounds and r->plan.n_bounds; tok and rest are borrowed for the call. Same
 * thread as the request's other uses.
 */
void ctl_openai_chat_bounds(const wk_tok *tok, ctl_openai_req *r, size_t off, const int32_t *rest,
                            size_t n_rest, size_t pos0);

/*
 * The checkpoint boundaries of a prompt rendered with the model's own
 * template (app->chat_tpl): after each eos token text in r->wire.prompt_text and
 * at r->plan.hist_end, as token positions of r->plan.prompt (the last
 * CTL_CKPT_MAX_BOUNDS). Writes only r->plan.bounds and r->plan.n_bounds.
 */
void ctl_openai_templated_bounds(ctl_app *app, ctl_openai_req *r);

/*
 * Where the history ends in a templated prompt (prompt, plen bytes, rendered
 * from msgs, tools and kwargs with the generation prompt): the length of the
 * same render without it when that is a prefix of prompt, else 0. A
 * template that re-renders the reply differently (Nemotron Nano v2 drops the
 * generation prompt's <think>) still shares this much with the follow-up.
 */
size_t ctl_openai_hist_end(ctl_app *app, const json_t *msgs, const json_t *tools,
                           const json_t *kwargs, const char *prompt, size_t plen);

/*
 * parent-token-v1 on a templated chat (ctl_chat): where the text after
 * message k of r (the parked reply) starts in r->wire.prompt_text, for a state
 * that consumed the retained ids (n) of that reply's turn. The template
 * renders messages 0..k-1 without a generation prompt; that text must be a
 * prefix of the prompt, and the reply's turn ends at the first eos token
 * text after it (before the end of message k+1's rendering when messages
 * 0..k+1 rendered alone are a prefix too), the reply's content (outer
 * whitespace aside) inside: the delta starts after the eos text when the
 * retained ids end with the eos id (the state consumed it), else at it.
 * False when the rendering does not line up (template_prefix_mismatch).
 */
bool ctl_openai_tpl_align(ctl_app *app, const ctl_openai_req *r, const int32_t *retained, size_t n,
                          size_t k, size_t *off);

/*
 * True when r is a templated chat without tool parts (no assistant
 * tool_calls, no tool results): the messages' texts are its whole history,
 * as parent-token-v1's visible-history checks need.
 */
bool ctl_openai_tpl_plain(const ctl_openai_req *r);

/*
 * The visible content of a templated reply (text, len bytes): the text
 * after the reasoning split, without tool calls. *out is malloc'd
 * (NUL-terminated), *n_calls the calls parsed. WK_OK or WK_ENOMEM.
 */
wk_err ctl_openai_tpl_visible(const ctl_openai_req *r, const char *text, size_t len, char **out,
                              size_t *out_len, size_t *n_calls);

/* Reads the body as a JSON object; sends the error and returns NULL on failure. */
json_t *ctl_openai_body(ctl_http_req *req);

/*
 * A parse error as a value: what the route answers (ctl_openai_send_perr:
 * the code's HTTP status, ctl_err_http_status, unless status says another,
 * and the code's OpenAI error "code" unless code names one, as the
 * Responses API's refusals do).
 */
typedef struct ctl_openai_perr {
    wk_err err;     /* the code */
    char param[96]; /* the OpenAI error's "param", "" = null */
    char msg[512];  /* the message */
    int status;     /* the HTTP status; 0: ctl_err_http_status(err) */
    char code[48];  /* the OpenAI error's "code"; "": the err code's (ctl_err_body) */
} ctl_openai_perr;

/* Sends *pe as the request's OpenAI error answer. */
void ctl_openai_send_perr(ctl_http_req *req, const ctl_openai_perr *pe);

/*
 * Fills *pe (status 0: the code's; param and code NULL or "": none) with
 * the formatted message. Returns err.
 */
wk_err ctl_openai_perr_setf(ctl_openai_perr *pe, int status, wk_err err, const char *param,
                            const char *code, const char *fmt, ...) WK_PRINTF(6, 7);

/*
 * The parsers (ctl_openai_parse.c): each reads a request without a
 * connection and returns false with *pe filled on the first error, in the
 * order the route reports them; the caller sends it. On failure r may hold
 * allocations (ctl_openai_req_fini() frees them). r->wire.chat, r->wire.model_optional
 * and r->plan.owner (ctl_openai_owner()) are the caller's. They read app's model
 * id, limits, tokenizer and chat template.
 *
 * ctl_openai_parse_body: buf (len bytes) as a JSON object, *out owned by the
 * caller. ctl_openai_parse_chat: the whole /v1/chat/completions body (known
 * fields, platform fields, the common fields, logprobs, the messages rendered
 * and tokenized). ctl_openai_parse_completion: the whole /v1/completions body.
 * ctl_openai_parse_common_value: the common fields (model, sampling, stream,
 * stop, max_tokens, logit_bias, n, response_format, tools, the refused ones).
 * ctl_openai_parse_messages_value: "messages" into r->wire.msgs, the rendered
 * r->wire.prompt_text and r->plan.prompt (reply records and checkpoint boundaries
 * from app->ckpt). ctl_openai_parse_prompt_value: the completions "prompt"
 * (text or token ids), best_of, echo, suffix and the legacy logprobs.
 */
WK_MUST_CHECK bool ctl_openai_parse_body(const char *buf, size_t len, json_t **out,
                                         ctl_openai_perr *pe);
WK_MUST_CHECK bool ctl_openai_parse_chat(ctl_app *app, json_t *body, ctl_openai_req *r,
                                         ctl_openai_perr *pe);
WK_MUST_CHECK bool ctl_openai_parse_completion(ctl_app *app, json_t *body, ctl_openai_req *r,
                                               ctl_openai_perr *pe);
WK_MUST_CHECK bool ctl_openai_parse_common_value(ctl_app *app, json_t *body, ctl_openai_req *r,
                                                 ctl_openai_perr *pe);
WK_MUST_CHECK bool ctl_openai_parse_messages_value(ctl_app *app, json_t *body,
                                                   ctl_openai_req *r, ctl_openai_perr *pe);
WK_MUST_CHECK bool ctl_openai_parse_prompt_value(ctl_app *app, json_t *body, ctl_openai_req *r,
                                                 ctl_openai_perr *pe);

/*
 * The reuse halves of ctl_openai_generate(), for routes that shape their own
 * answer (ctl_responses): ctl_openai_reuse_begin() plans r's checkpoints and
 * lookup into plan (caller memory that outlives the job; r->plan.ckpt points at
 * it) and sets *free_slot when the slot is kept only for the end-of-reply
 * checkpoint; after a successful generation ctl_openai_reuse_done() counts
 * the reuse, leaves that checkpoint and frees the slot when *free_slot said
 * so. The caller ends the plan with ctl_ckpt_plan_end(). Same thread as the
 * request.
 */
void ctl_openai_reuse_begin(ctl_app *app, ctl_openai_req *r, ctl_ckpt_plan *plan,
                            bool *free_slot);
void ctl_openai_reuse_done(ctl_app *app, ctl_openai_req *r, const ctl_gen_result *res,
                           bool free_slot);

/*
 * Records in r->out what the answer reports of res (a successful
 * generation of r): the usage counts and finish (static, the answer's
 * finish_reason: res's, or "tool_calls" / "function_call" when the reply
 * was calls).
 */
void ctl_openai_result_set(ctl_openai_req *r, const ctl_gen_result *res, const char *finish);

/* Runs the generation and answers the request. */
void ctl_openai_generate(ctl_http_req *req, ctl_app *app, ctl_openai_req *r);

#endif /* CTL_OPENAI_H */
