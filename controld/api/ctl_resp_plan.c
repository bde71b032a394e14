/*
 * ctl_resp_plan: a Responses request as the shared generation request
 * (ctl_resp_plan.h). The conversation is rendered from the record-form
 * items (the previous history and this request's input, as the stored
 * record keeps them), so a follow-up renders its history exactly as the
 * turn before saw it.
 */
#define WK_LOG_MODULE "responses"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_app.h"
#include "ctl_openai.h"
#include "ctl_resp_plan.h"
#include "ctl_session.h"
#include "ctl_toolgram.h"
#include "wk_chat.h"
#include "wk_chat_tpl.h"
#include "wk_tok.h"

/* One plan in progress: the inputs, the request it fills and what the prompt took. */
typedef struct resp_plan {
    ctl_app *app;            /* limits, tokenizer, template */
    const ctl_resp_req *q;   /* the parsed body */
    const ctl_resp_conv *cv; /* the conversation around it */
    ctl_openai_req *r;       /* filled */
    ctl_openai_perr *pe;     /* the refusal */
    bool aligned;            /* the prompt starts with the previous state's exact tokens */
    size_t n_prev;           /* how many */
} resp_plan;

/*
 * The previous response's state tokens (the record's "tokens") as a malloc'd
 * array the caller frees. False when absent, malformed or out of the vocab.
 */
static bool
resp_prev_tokens(resp_plan *c, int32_t **out, size_t *n)
{
    const json_t *t = json_object_get(c->cv->prev, "tokens");
    if (!json_is_array(t) || json_array_size(t) == 0)
        return false;
    size_t m = json_array_size(t);
    int32_t *ids = malloc(m * sizeof(*ids));
    if (ids == NULL)
        return false;
    uint32_t vocab = wk_tok_vocab_size(c->app->tok);
    for (size_t i = 0; i < m; i++) {
        json_t *e = json_array_get(t, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) >= (json_int_t)vocab) {
            free(ids);
            return false;
        }
        ids[i] = (int32_t)json_integer_value(e);
    }
    *out = ids;
    *n = m;
    return true;
}

/* True when two optional strings (NULL = none) are equal. */
static bool
resp_same_text(const json_t *a, const char *b, size_t bl)
{
    if (!json_is_string(a))
        return b == NULL;
    return b != NULL && json_string_length(a) == bl && memcmp(json_string_value(a), b, bl) == 0;
}

/* True when a record entry is a reasoning item, not a message. */
static bool
resp_is_reasoning(const json_t *m)
{
    const char *t = json_string_value(json_object_get(m, "type"));
    return t != NULL && strcmp(t, "reasoning") == 0;
}

/* True when the request may take the previous state's tokens as they are. */
static bool
resp_exact_candidate(resp_plan *c)
{
    return c->cv->prev != NULL && c->cv->fingerprint != NULL &&
           json_is_string(json_object_get(c->cv->prev, "fp")) &&
           strcmp(json_string_value(json_object_get(c->cv->prev, "fp")), c->cv->fingerprint) == 0 &&
           resp_same_text(json_object_get(c->cv->prev, "instructions"), c->q->instructions,
                          c->q->instructions_len);
}

/*
 * Tokenizes c->r->wire.prompt_text into c->r->plan.prompt: prev_ids (n_prev, owned and
 * freed here; NULL: none) followed by the text from byte off encoded as their
 * continuation, else the whole text. Fills c->pe and returns false.
 */
static bool
resp_encode(resp_plan *c, int32_t *prev_ids, size_t n_prev, size_t off, int32_t **rest,
            size_t *n_rest)
{
    ctl_openai_req *r = c->r;
    wk_diag d = {{0}};
    wk_err err =
        prev_ids != NULL
            ? wk_tok_encode_continue(c->app->tok, r->wire.prompt_text, r->wire.prompt_len, off,
                                     rest, n_rest, &d)
            : wk_tok_encode(c->app->tok, r->wire.prompt_text, r->wire.prompt_len, rest, n_rest, &d);
    if (err == WK_OK && (r->plan.prompt = malloc((n_prev + *n_rest + 1) * sizeof(int32_t))) == NULL)
        err = WK_ENOMEM;
    if (err != WK_OK) {
        free(prev_ids);
        free(*rest);
        *rest = NULL;
        ctl_openai_perr_setf(c->pe, 400, err, "input", NULL, "%s",
                             d.msg[0] ? d.msg : "out of memory");
        return false;
    }
    if (n_prev)
        memcpy(r->plan.prompt, prev_ids, n_prev * sizeof(int32_t));
    if (*n_rest)
        memcpy(r->plan.prompt + n_prev, *rest, *n_rest * sizeof(int32_t));
    r->plan.n_prompt = n_prev + *n_rest;
    r->plan.aligned_tokens = n_prev;
    c->aligned = prev_ids != NULL;
    c->n_prev = n_prev;
    free(prev_ids);
    return true;
}

/* The prompt's token count against --max-prompt-tokens; fills c->pe. */
static bool
resp_prompt_fits(resp_plan *c)
{
    if (c->r->plan.n_prompt == 0 || c->r->plan.n_prompt > c->app->max_prompt_tokens) {
        ctl_openai_perr_setf(c->pe, 400, WK_ETOOBIG, "input", "context_length_exceeded",
                             "the conversation has %zu tokens, more than the limit of %u",
                             c->r->plan.n_prompt, c->app->max_prompt_tokens);
        return false;
    }
    return true;
}

/*
 * The chat-form tools (chat, [{"type": "function", "function": {"name",
 * ...}}]) that allowed_tools (the request's tool_choice) lists, as a new
 * array of references; NULL on ENOMEM.
 */
static json_t *
resp_allowed_subset(const json_t *chat, const json_t *allowed)
{
    json_t *out = json_array();
    size_t i, k;
    json_t *t, *a;
    json_array_foreach(chat, i, t)
    {
        const json_t *name = json_object_get(json_object_get(t, "function"), "name");
        bool listed = false;
        json_array_foreach(json_object_get(allowed, "tools"), k, a)
        {
            listed = listed || json_equal(json_object_get(a, "name"), name);
        }
        if (listed && out != NULL && json_array_append(out, t) != 0) {
            json_decref(out);
            out = NULL;
        }
    }
    return out;
}

/*
 * tool_choice "required" or a named function: the chat route's constrained
 * decoding (ctl_toolgram, docs/OPENAI_COMPAT.md "Constrained tool calls"),
 * compiled once the prompt is rendered (free reasoning first when it leaves
 * the reply inside a think block). The reply then goes through the same
 * tool-call parse as any reply. Fills c->pe and returns false.
 */
static bool
resp_tool_forced(resp_plan *c)
{
    ctl_openai_req *r = c->r;
    if (r->wire.tool_fmt == WK_TOOLCALL_FMT_NONE) {
        ctl_openai_perr_setf(
            c->pe, 400, WK_EINVAL, "tool_choice", "invalid_value",
            "'tool_choice' cannot require a call: this model's chat template has no "
            "tool-call format wkvm knows (use \"auto\" or \"none\")");
        return false;
    }
    r->wire.tool_forced = true;
    if (c->q->tool_name != NULL && (r->wire.tool_force_name = strdup(c->q->tool_name)) == NULL) {
        ctl_openai_perr_setf(c->pe, 500, WK_ENOMEM, NULL, NULL, "out of memory");
        return false;
    }
    wk_diag d = {{0}};
    wk_err err = ctl_toolgram_new(c->app->tok, r->wire.tool_fmt,
                                  r->wire.call_tools != NULL ? r->wire.call_tools : r->wire.tools,
                                  r->wire.tool_force_name, !r->wire.tool_serial, r->wire.think_open,
                                  WK_CHAT_TPL_THINK_CLOSE, &r->wire.toolgram, &d);
    if (err != WK_OK) {
        ctl_openai_perr_setf(
            c->pe, err == WK_EINVAL ? 400 : 500, err, err == WK_EINVAL ? "tools" : NULL, NULL,
            "tool_choice cannot be enforced: %s",
            err == WK_EINVAL ? d.msg : err == WK_ENOMEM ? "out of memory" : wk_strerror(err));
        return false;
    }
    return true;
}

/*
 * The conversation rendered with the model's own template (app->chat_tpl):
 * instructions as a system message, each message as {role, content}, a
 * reasoning item as the reasoning_content of the assistant message after it
 * (the template decides whether to render it), reasoning.effort as the
 * variable reasoning_effort where the template reads it (and "none" as
 * enable_thinking false where it reads that). The exact path: when the
 * rendered text starts with the bytes of the previous state's tokens (the
 * template rendered the previous turn as the model produced it), the prompt
 * is those tokens and the rest encoded as their continuation; else the
 * whole text, and the prefix index finds the longest checkpoint.
 */
static bool
resp_build_templated(resp_plan *c, const json_t *history, const json_t *input)
{
    ctl_app *app = c->app;
    const ctl_resp_req *q = c->q;
    ctl_openai_req *r = c->r;
    json_t *msgs = json_array(), *kw = json_object();
    if (q->instructions != NULL)
        json_array_append_new(msgs, json_pack("{s:s, s:s%}", "role", "system", "content",
                                              q->instructions, q->instructions_len));
    const json_t *pending = NULL; /* a reasoning item's text awaiting its message */
    const json_t *lists[2] = {history, input};
    for (size_t l = 0; l < 2; l++) {
        size_t i;
        json_t *m;
        json_array_foreach(lists[l], i, m)
        {
            if (resp_is_reasoning(m)) {
                pending = json_object_get(m, "text");
                continue;
            }
            const char *type = json_string_value(json_object_get(m, "type"));
            if (type != NULL && strcmp(type, "function_call_output") == 0) {
                json_array_append_new(msgs, json_pack("{s:s, s:O, s:O}", "role", "tool",
                                                      "tool_call_id", json_object_get(m, "call_id"),
                                                      "content", json_object_get(m, "output")));
                pending = NULL;
                continue;
            }
            if (type != NULL && strcmp(type, "function_call") == 0) {
                /* a call joins the assistant message just before it, or makes one */
                json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
                const char *lr = json_string_value(json_object_get(last, "role"));
                if (last == NULL || lr == NULL || strcmp(lr, "assistant") != 0) {
                    last = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
                    if (last != NULL && pending != NULL && json_string_length(pending) > 0)
                        json_object_set(last, "reasoning_content", (json_t *)pending);
                    pending = NULL;
                    json_array_append_new(msgs, last);
                }
                json_t *tcs = json_object_get(last, "tool_calls");
                if (tcs == NULL && last != NULL) {
                    tcs = json_array();
                    json_object_set_new(last, "tool_calls", tcs);
                }
                json_array_append_new(tcs,
                                      json_pack("{s:O, s:s, s:{s:O, s:O}}", "id",
                                                json_object_get(m, "call_id"), "type", "function",
                                                "function", "name", json_object_get(m, "name"),
                                                "arguments", json_object_get(m, "arguments")));
                continue;
            }
            const char *role = json_string_value(json_object_get(m, "role"));
            json_t *t = json_object_get(m, "text");
            json_t *o = json_pack("{s:s, s:o}", "role", role != NULL ? role : "user", "content",
                                  json_is_string(t) ? json_incref(t) : json_string(""));
            if (o != NULL && role != NULL && strcmp(role, "assistant") == 0 && pending != NULL &&
                json_string_length(pending) > 0)
                json_object_set(o, "reasoning_content", (json_t *)pending);
            pending = NULL;
            json_array_append_new(msgs, o);
        }
    }
    uint32_t max_msgs = app->max_messages ? app->max_messages : 4096;
    if (json_array_size(msgs) > max_msgs) {
        ctl_openai_perr_setf(c->pe, 400, WK_ETOOBIG, "input", "context_length_exceeded",
                             "the conversation has %zu messages, more than the limit of %u",
                             json_array_size(msgs), max_msgs);
        json_decref(msgs);
        json_decref(kw);
        return false;
    }
    if (q->reasoning_effort != NULL) {
        if (wk_chat_tpl_knows(app->chat_tpl, "reasoning_effort"))
            json_object_set_new(kw, "reasoning_effort", json_string(q->reasoning_effort));
        if (strcmp(q->reasoning_effort, "none") == 0 &&
            wk_chat_tpl_knows(app->chat_tpl, "enable_thinking"))
            json_object_set_new(kw, "enable_thinking", json_false());
    }
    /* Function tools in the chat form the template reads; the reply is parsed for calls. */
    if (q->tools != NULL) {
        json_t *tools = json_array();
        size_t i;
        json_t *t;
        json_array_foreach(q->tools, i, t)
        {
            json_t *fn = json_pack("{s:O}", "name", json_object_get(t, "name"));
            if (json_is_string(json_object_get(t, "description")))
                json_object_set(fn, "description", json_object_get(t, "description"));
            if (json_is_object(json_object_get(t, "parameters")))
                json_object_set(fn, "parameters", json_object_get(t, "parameters"));
            json_array_append_new(tools,
                                  json_pack("{s:s, s:o}", "type", "function", "function", fn));
        }
        r->wire.tools = tools;
        r->wire.tool_fmt =
            q->tool_choice_none ? WK_TOOLCALL_FMT_NONE : wk_chat_tpl_toolcall_fmt(app->chat_tpl);
        /*
         * allowed_tools: the template still gets every tool (the prompt does
         * not change with the choice); the parse and the constraint only the
         * listed ones, so a call to another function stays text.
         */
        if (q->allowed_tools != NULL && tools != NULL &&
            (r->wire.call_tools = resp_allowed_subset(tools, q->allowed_tools)) == NULL) {
            json_decref(msgs);
            json_decref(kw);
            ctl_openai_perr_setf(c->pe, 500, WK_ENOMEM, NULL, NULL, "out of memory");
            return false;
        }
        r->wire.tool_serial = q->parallel_tool_calls_off;
    }
    /* (the chat route's preparation: arguments as objects for templates that iterate them) */
    wk_diag d = {{0}};
    size_t bad_msg = 0, bad_call = 0;
    wk_err err = msgs == NULL || kw == NULL
                     ? WK_ENOMEM
                     : wk_chat_tpl_prepare(app->chat_tpl, msgs, &bad_msg, &bad_call, &d);
    if (err == WK_OK)
        err = wk_chat_tpl_render_json(app->chat_tpl, msgs, r->wire.tools, true, kw, NULL,
                                      &r->wire.prompt_text, &r->wire.prompt_len, &d);
    if (err == WK_OK)
        r->plan.hist_end = ctl_openai_hist_end(app, msgs, r->wire.tools, kw, r->wire.prompt_text,
                                               r->wire.prompt_len);
    json_decref(msgs);
    json_decref(kw);
    if (err != WK_OK) {
        ctl_openai_perr_setf(c->pe, err == WK_ENOMEM ? 500 : 400, err, "input", NULL,
                             "chat template: %s", err == WK_ENOMEM ? "out of memory" : d.msg);
        return false;
    }
    r->wire.templated = true;
    if (wk_chat_tpl_thinks(app->chat_tpl)) {
        r->wire.think = true;
        r->wire.think_open =
            wk_chat_think_open_at_end(r->wire.prompt_text, r->wire.prompt_len,
                                      WK_CHAT_TPL_THINK_OPEN, WK_CHAT_TPL_THINK_CLOSE);
    }
    if (q->tool_required && !resp_tool_forced(c))
        return false;
    int32_t *prev_ids = NULL, *rest = NULL;
    size_t n_prev = 0, n_rest = 0, off = 0;
    if (resp_exact_candidate(c) && resp_prev_tokens(c, &prev_ids, &n_prev) &&
        !wk_tok_text_prefix(app->tok, prev_ids, n_prev, -1, r->wire.prompt_text, r->wire.prompt_len,
                            &off)) {
        free(prev_ids);
        prev_ids = NULL;
        n_prev = 0;
        off = 0;
    }
    if (!resp_encode(c, prev_ids, n_prev, off, &rest, &n_rest))
        return false;
    free(rest);
    ctl_openai_templated_bounds(app, r);
    return resp_prompt_fits(c);
}

/*
 * Renders the conversation (instructions, the previous history, the new
 * items) and tokenizes it into c->r: the previous state's exact tokens plus
 * the rest as their continuation when the history renders as the previous
 * state saw it, else the whole text (the checkpoint index then finds the
 * longest prefix). Fills c->pe and returns false on failure.
 */
static bool
resp_build_prompt(resp_plan *c, const json_t *history, const json_t *input)
{
    ctl_app *app = c->app;
    const ctl_resp_req *q = c->q;
    ctl_openai_req *r = c->r;
    if (app->chat_tpl != NULL)
        return resp_build_templated(c, history, input);
    if (q->tool_required) {
        ctl_openai_perr_setf(c->pe, 400, WK_EINVAL, "tool_choice", "invalid_value",
                             "'tool_choice' cannot require a call: this model uses the plain "
                             "User:/Assistant: template, which has no tool calls (use \"auto\")");
        return false;
    }
    /* The World template: reasoning items have no place in it, function calls none either. */
    size_t n_sys = q->instructions != NULL ? 1 : 0, n = n_sys;
    const json_t *lists[2] = {history, input};
    for (size_t l = 0; l < 2; l++) {
        size_t i;
        json_t *m;
        json_array_foreach(lists[l], i, m)
        {
            const char *type = json_string_value(json_object_get(m, "type"));
            if (type != NULL && strncmp(type, "function_call", 13) == 0) {
                char param[48];
                snprintf(param, sizeof(param), "input[%zu].type", l == 1 ? i : 0);
                ctl_openai_perr_setf(
                    c->pe, 400, WK_EINVAL, l == 1 ? param : "previous_response_id", "invalid_value",
                    "'%s' items need a model whose chat template calls tools (this "
                    "one uses the plain User:/Assistant: template)",
                    type);
                return false;
            }
            n += resp_is_reasoning(m) ? 0 : 1;
        }
    }
    uint32_t max_msgs = app->max_messages ? app->max_messages : 4096;
    if (n > max_msgs) {
        ctl_openai_perr_setf(c->pe, 400, WK_ETOOBIG, "input", "context_length_exceeded",
                             "the conversation has %zu messages, more than the limit of %u", n,
                             max_msgs);
        return false;
    }
    wk_chat_msg *cm = calloc(n ? n : 1, sizeof(*cm));
    wk_chat_span *sp = calloc(n ? n : 1, sizeof(*sp));
    if (cm == NULL || sp == NULL) {
        free(cm);
        free(sp);
        ctl_openai_perr_setf(c->pe, 500, WK_ENOMEM, NULL, NULL, "out of memory");
        return false;
    }
    size_t k = 0, n_hist = 0;
    if (n_sys) {
        cm[k].role = "system";
        cm[k].content = q->instructions;
        cm[k++].content_len = q->instructions_len;
    }
    for (size_t l = 0; l < 2; l++) {
        size_t i;
        json_t *m;
        json_array_foreach(lists[l], i, m)
        {
            if (resp_is_reasoning(m))
                continue;
            const char *role = json_string_value(json_object_get(m, "role"));
            json_t *t = json_object_get(m, "text");
            if (role == NULL)
                role = "user";
            cm[k].role = strcmp(role, "assistant") == 0 ? "assistant"
                         : strcmp(role, "system") == 0  ? "system"
                                                        : "user";
            cm[k].content = json_is_string(t) ? json_string_value(t) : "";
            cm[k++].content_len = json_is_string(t) ? json_string_length(t) : 0;
        }
        if (l == 0)
            n_hist = k - n_sys;
    }
    /* (content_len 0 means NUL-terminated: an empty text is "" either way) */
    r->wire.msgs = cm;
    r->wire.n_msgs = n;
    wk_diag d = {{0}};
    if (wk_chat_render_spans(cm, n, true, &r->wire.prompt_text, &r->wire.prompt_len, sp, &d) !=
        WK_OK) {
        free(sp);
        ctl_openai_perr_setf(c->pe, 400, WK_EINVAL, "input", NULL, "%s", d.msg);
        return false;
    }
    int32_t *prev_ids = NULL, *rest = NULL;
    size_t n_prev = 0, n_rest = 0, off = 0;
    /*
     * The exact path: the same model, the same instructions (so the history
     * renders as the previous request saw it), and the previous state's
     * tokens. The previous reply is the last message of the history.
     */
    if (resp_exact_candidate(c) && n_hist > 0 && resp_prev_tokens(c, &prev_ids, &n_prev)) {
        size_t kr = n_sys + n_hist - 1;
        off = ctl_session_align_at(app->tok, prev_ids, n_prev, &sp[kr]);
        if (off > r->wire.prompt_len) {
            free(prev_ids);
            prev_ids = NULL;
            n_prev = 0;
            off = 0;
        }
    }
    if ((r->wire.msg_ends = malloc(n * sizeof(size_t))) == NULL) {
        free(prev_ids);
        free(sp);
        ctl_openai_perr_setf(c->pe, 500, WK_ENOMEM, NULL, NULL, "out of memory");
        return false;
    }
    if (!resp_encode(c, prev_ids, n_prev, off, &rest, &n_rest)) {
        free(sp);
        return false;
    }
    for (size_t i = 0; i < n; i++)
        r->wire.msg_ends[i] = sp[i].end;
    r->plan.n_bounds = 0;
    ctl_openai_chat_bounds(app->tok, r, off, rest, n_rest, c->n_prev);
    free(rest);
    free(sp);
    return resp_prompt_fits(c);
}

/* The generation's parameters from q (after the prompt: the stop depends on its template). */
static bool
resp_plan_gen(resp_plan *c)
{
    ctl_app *app = c->app;
    const ctl_resp_req *q = c->q;
    ctl_openai_req *r = c->r;
    r->wire.model = q->model;
    r->wire.stream = q->stream;
    ctl_gen_params *g = &r->plan.gen;
    g->max_tokens = q->max_output_tokens ? q->max_output_tokens : app->default_max_tokens;
    g->stop_on_eot = true;
    /* The template's turn end: "\n\n" in the World template, else its eos token's text. */
    const char *eos = r->wire.templated ? wk_chat_tpl_special(app->chat_tpl, "eos_token") : NULL;
    g->stops[g->n_stops++] =
        r->wire.templated ? (eos != NULL && eos[0] ? eos : NULL) : WK_CHAT_STOP_DEFAULT;
    /* (not for a forced call: its grammar ends it, and an argument may spell that text) */
    if (g->stops[g->n_stops - 1] == NULL || r->wire.toolgram != NULL)
        g->n_stops--;
    if (r->wire.toolgram != NULL)
        ctl_toolgram_apply(r->wire.toolgram, g);
    g->sample.temperature = (float)q->temperature;
    g->sample.top_p = (float)q->top_p;
    g->sample.frequency_penalty = (float)q->frequency_penalty;
    g->sample.presence_penalty = (float)q->presence_penalty;
    if (q->logit_bias != NULL) {
        const char *k;
        json_t *x;
        uint32_t vocab = wk_tok_vocab_size(app->tok);
        json_object_foreach((json_t *)q->logit_bias, k, x)
        {
            unsigned long tid = strtoul(k, NULL, 10);
            if (tid >= vocab) {
                ctl_openai_perr_setf(c->pe, 400, WK_EINVAL, "logit_bias", "invalid_value",
                                     "logit_bias key '%.40s' is not a token id in [0, %u)", k,
                                     vocab);
                return false;
            }
            g->sample.bias[g->sample.n_bias].token = (int32_t)tid;
            g->sample.bias[g->sample.n_bias++].bias = (float)json_number_value(x);
        }
    }
    if (q->has_seed)
        g->sample.seed = (uint64_t)q->seed;
    return true;
}

bool
ctl_resp_plan(ctl_app *app, const ctl_resp_req *q, const ctl_resp_conv *cv, ctl_openai_req *r,
              bool *exact, ctl_openai_perr *pe)
{
    resp_plan c = {.app = app, .q = q, .cv = cv, .r = r, .pe = pe};
    ctl_openai_perr_setf(pe, 500, WK_ENOMEM, NULL, NULL, "out of memory");
    bool ok = resp_build_prompt(&c, cv->history, cv->input) && resp_plan_gen(&c);
    *exact = c.aligned;
    return ok;
}
