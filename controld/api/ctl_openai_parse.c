/*
 * ctl_openai_parse: what a client sent to the generation routes, parsed
 * into a ctl_openai_req without a connection. Every refusal is a value (a
 * ctl_openai_perr: the wk_err code, OpenAI's "param" and the message) that
 * the route sends (ctl_openai_send_perr), so the whole parse runs in a unit
 * test or a fuzz harness. Reads the app's model id, limits, tokenizer, chat
 * template and (for a chat's reply records) the checkpoint index; writes
 * only the request. Same thread as the request's other uses.
 */
#define WK_LOG_MODULE "openai"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl_app.h"
#include "ctl_ckpt.h"
#include "ctl_openai.h"
#include "ctl_session.h"
#include "wk_chat.h"
#include "wk_json.h"
#include "wk_sha256.h"

#define CTL_OPENAI_MAX_MESSAGES 4096
#define CTL_OPENAI_MAX_TEXT (8u << 20)
#define CTL_OPENAI_MAX_STOP_LEN 256
/*
 * The chat prompt's tokens. When the history's last assistant message (or
 * one of the three before it) is a reply wkvm produced for this owner (a
 * reply record), the tokens are that reply's exact retained tokens plus the
 * rest of the rendered text encoded as their continuation: the state
 * consumed what the model generated, whatever its bytes were, and only what
 * follows is new. Otherwise the rendered text encoded whole. Also the token
 * positions where messages end (checkpoint boundaries). sp: the spans of the
 * rendered messages.
 */
static wk_err
ctl_openai_chat_tokens(ctl_app *app, ctl_openai_req *r, const wk_chat_span *sp, wk_diag *d)
{
    int32_t *ret = NULL, *rest = NULL;
    size_t n_ret = 0, n_rest = 0, off = 0;
    ctl_worker_view v;
    if (app->ckpt != NULL && r->wire.cache && ctl_ckpt_get_config(app->ckpt).enabled &&
        ctl_pool_model_view(app->pool, &v) == WK_OK) {
        unsigned tries = 0;
        for (size_t k = r->wire.n_msgs; k-- > 0 && tries < 4;) {
            if (strcmp(r->wire.msgs[k].role, "assistant") != 0)
                continue;
            tries++;
            char key[WK_SHA256_HEX_LEN];
            ctl_ckpt_reply_key(v.fingerprint, r->plan.owner, r->wire.prompt_text, sp[k].end, key);
            if (ctl_ckpt_reply_tokens(app->ckpt, key, &ret, &n_ret)) {
                off = ctl_session_align_at(app->tok, ret, n_ret, &sp[k]);
                break;
            }
        }
    }
    wk_err err = ret != NULL ? wk_tok_encode_continue(app->tok, r->wire.prompt_text,
                                                      r->wire.prompt_len, off, &rest, &n_rest, d)
                             : wk_tok_encode(app->tok, r->wire.prompt_text, r->wire.prompt_len,
                                             &rest, &n_rest, d);
    if (err == WK_OK &&
        (r->plan.prompt = malloc((n_ret + n_rest + 1) * sizeof(*r->plan.prompt))) == NULL)
        err = WK_ENOMEM;
    if (err != WK_OK) {
        free(ret);
        free(rest);
        return err;
    }
    if (n_ret)
        memcpy(r->plan.prompt, ret, n_ret * sizeof(*ret));
    if (n_rest)
        memcpy(r->plan.prompt + n_ret, rest, n_rest * sizeof(*rest));
    r->plan.n_prompt = n_ret + n_rest;
    r->plan.aligned_tokens = n_ret;
    free(r->wire.msg_ends);
    r->wire.msg_ends = malloc((r->wire.n_msgs ? r->wire.n_msgs : 1) * sizeof(*r->wire.msg_ends));
    if (r->wire.msg_ends == NULL) {
        free(ret);
        free(rest);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < r->wire.n_msgs; i++)
        r->wire.msg_ends[i] = sp[i].end;
    r->plan.n_bounds = 0;
    ctl_openai_chat_bounds(app->tok, r, off, rest, n_rest, n_ret);
    free(ret);
    free(rest);
    return WK_OK;
}

static wk_err ctl_openai_perr_set(ctl_openai_perr *pe, wk_err err, const char *param,
                                  const char *fmt, ...) WK_PRINTF(4, 5);

/* Records a parse error in pe (what the route sends, ctl_openai_send_perr()). Returns err. */
static wk_err
ctl_openai_perr_set(ctl_openai_perr *pe, wk_err err, const char *param, const char *fmt, ...)
{
    pe->err = err;
    pe->status = 0;
    pe->code[0] = '\0';
    snprintf(pe->param, sizeof(pe->param), "%s", param != NULL ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pe->msg, sizeof(pe->msg), fmt, ap);
    va_end(ap);
    return err;
}

/*
 * The body fields each endpoint knows (docs/OPENAI_COMPAT.md tables them):
 * OpenAI's, then wkvm's extensions. A field outside its endpoint's list is
 * refused with a 400 naming it, never ignored; fields in the list that wkvm
 * cannot honour with a given value are refused below by their own checks.
 */
static const char *const ctl_openai_chat_fields[] = {
    "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "n", "stop", "presence_penalty", "frequency_penalty", "logit_bias",
    "logprobs", "top_logprobs", "seed", "user", "tools", "tool_choice", "functions",
    "function_call", "parallel_tool_calls", "response_format", "audio", "modalities",
    "prediction", "web_search_options", "store", "metadata", "service_tier", "reasoning_effort",
    /* wkvm extensions */
    "top_k", "min_p", "ignore_eos", "return_token_ids", "cache", "cache_prompt",
    "chat_template_kwargs",
};
static const char *const ctl_openai_completion_fields[] = {
    "model", "prompt", "stream", "stream_options", "max_tokens", "temperature", "top_p", "n",
    "best_of", "stop", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "seed",
    "user", "echo", "suffix",
    /* wkvm extensions */
    "max_completion_tokens", "top_k", "min_p", "ignore_eos", "return_token_ids", "cache",
    "cache_prompt",
};

/* Refuses (400 naming it) the first body field not in known[]: fills *pe, false. */
static bool
ctl_openai_check_fields(ctl_openai_perr *pe, json_t *body, const char *const *known, size_t n)
{
    const char *key;
    json_t *val;
    json_object_foreach(body, key, val) {
        size_t i = 0;
        while (i < n && strcmp(key, known[i]) != 0)
            i++;
        if (i == n) {
            char param[72];
            snprintf(param, sizeof(param), "%.64s", key);
            ctl_openai_perr_set(pe, WK_EINVAL, param,
                            "unknown parameter '%.64s': wkvm refuses what it does not honour "
                            "(docs/OPENAI_COMPAT.md lists the supported ones)",
                            key);
            return false;
        }
    }
    return true;
}

/*
 * OpenAI's chat fields about its platform rather than the generation:
 * store (only false: wkvm keeps no completions to list), metadata (tags for
 * stored completions: validated, nothing to tag), service_tier ("auto" or
 * "default": there is one tier) and reasoning_effort (one of OpenAI's
 * levels, for a model whose chat template reads a reasoning_effort variable:
 * ctl_openai_parse_templated passes it on; refused for any other model, as
 * OpenAI refuses it for models that do not reason). Fills *pe and returns false on
 * failure.
 */
static bool
ctl_openai_parse_platform(ctl_openai_perr *pe, ctl_app *app, json_t *body)
{
    json_t *v = json_object_get(body, "store");
    if (v != NULL && !json_is_null(v) && !json_is_false(v)) {
        ctl_openai_perr_set(pe, WK_EINVAL, "store",
                        "'store' must be false: wkvm does not store completions");
        return false;
    }
    v = json_object_get(body, "metadata");
    if (v != NULL && !json_is_null(v)) {
        bool ok = json_is_object(v) && json_object_size(v) <= 16;
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) ok = ok && json_is_string(x) && strlen(k) <= 64 &&
                                          json_string_length(x) <= 512;
        if (!ok) {
            ctl_openai_perr_set(pe, WK_EINVAL, "metadata",
                            "'metadata' must be an object of at most 16 string values");
            return false;
        }
    }
    v = json_object_get(body, "service_tier");
    const char *t = json_is_string(v) ? json_string_value(v) : NULL;
    if (v != NULL && !json_is_null(v) &&
        (t == NULL || (strcmp(t, "auto") != 0 && strcmp(t, "default") != 0))) {
        ctl_openai_perr_set(pe, WK_EINVAL, "service_tier",
                        "'service_tier' must be \"auto\" or \"default\": wkvm has one tier");
        return false;
    }
    v = json_object_get(body, "reasoning_effort");
    if (v != NULL && !json_is_null(v)) {
        static const char *const levels[] = {"none", "minimal", "low", "medium", "high"};
        bool known = false;
        for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]) && json_is_string(v); i++)
            known = known || strcmp(json_string_value(v), levels[i]) == 0;
        if (!known) {
            ctl_openai_perr_set(pe, WK_EINVAL, "reasoning_effort",
                            "'reasoning_effort' must be \"none\", \"minimal\", \"low\", "
                            "\"medium\" or \"high\"");
            return false;
        }
        if (!wk_chat_tpl_knows(app->chat_tpl, "reasoning_effort")) {
            ctl_openai_perr_set(pe, WK_EINVAL, "reasoning_effort",
                            "'reasoning_effort' is not supported by this model: its chat "
                            "template has no reasoning_effort (a template's own switch, e.g. "
                            "enable_thinking, goes in chat_template_kwargs)");
            return false;
        }
    }
    return true;
}

/* Fields we refuse rather than silently ignore. */
static const char *const ctl_openai_unsupported[] = {
    "audio", "modalities", "prediction", "web_search_options",
};

/* At most this many tools per request (OpenAI's limit). */
#define CTL_OPENAI_MAX_TOOLS 128

/*
 * A tool's function name: 1..64 bytes of letters, digits, '_', '-', '.', ':'
 * (OpenAI's pattern plus the separators of MCP-style names): nothing a
 * template's markup ("<function=NAME>") or a JSON string could confuse.
 */
static bool
ctl_openai_tool_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.' || c == ':'))
            return false;
    }
    return true;
}

/*
 * Validates tools (not NULL): an array of objects; for a model with its own
 * template (full: the tools reach it) function tools with unique, well-formed
 * names. Fills *pe and returns false on failure.
 */
static bool
ctl_openai_check_tools(ctl_openai_perr *pe, json_t *tools, bool full)
{
    if (!json_is_array(tools)) {
        ctl_openai_perr_set(pe, WK_EINVAL, "tools", "'tools' must be an array of objects");
        return false;
    }
    if (json_array_size(tools) > CTL_OPENAI_MAX_TOOLS) {
        ctl_openai_perr_set(pe, WK_EINVAL, "tools", "'tools' has %zu entries, at most %u",
                        json_array_size(tools), CTL_OPENAI_MAX_TOOLS);
        return false;
    }
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (!json_is_object(t)) {
            ctl_openai_perr_set(pe, WK_EINVAL, "tools", "'tools' must be an array of objects");
            return false;
        }
    }
    json_array_foreach(tools, i, t) {
        if (!full)
            break;
        char param[48];
        snprintf(param, sizeof(param), "tools[%zu]", i);
        json_t *type = json_object_get(t, "type");
        json_t *fn = json_object_get(t, "function");
        if (!json_is_object(t) || !json_is_string(type) ||
            strcmp(json_string_value(type), "function") != 0 || !json_is_object(fn)) {
            ctl_openai_perr_set(pe, WK_EINVAL, param,
                            "a tool must be {\"type\": \"function\", \"function\": {...}}");
            return false;
        }
        json_t *name = json_object_get(fn, "name");
        json_t *desc = json_object_get(fn, "description");
        json_t *par = json_object_get(fn, "parameters");
        json_t *strict = json_object_get(fn, "strict");
        if (!json_is_string(name) ||
            !ctl_openai_tool_name_ok(json_string_value(name), json_string_length(name))) {
            snprintf(param, sizeof(param), "tools[%zu].function.name", i);
            ctl_openai_perr_set(
                pe, WK_EINVAL, param,
                "a function name must be 1 to 64 letters, digits, '_', '-', '.' or ':'");
            return false;
        }
        if ((desc != NULL && !json_is_null(desc) && !json_is_string(desc)) ||
            (par != NULL && !json_is_null(par) && !json_is_object(par)) ||
            (strict != NULL && !json_is_null(strict) && !json_is_boolean(strict))) {
            snprintf(param, sizeof(param), "tools[%zu].function", i);
            ctl_openai_perr_set(pe, WK_EINVAL, param,
                            "'description' must be a string, 'parameters' a JSON schema object "
                            "and 'strict' a boolean");
            return false;
        }
        for (size_t k = 0; k < i; k++) {
            json_t *other = json_object_get(json_object_get(json_array_get(tools, k), "function"),
                                            "name");
            if (json_equal(other, name)) {
                ctl_openai_perr_set(pe, WK_EINVAL, "tools", "two tools are named '%s'",
                                json_string_value(name));
                return false;
            }
        }
    }
    return true;
}

/*
 * tool_choice "required" (name NULL) or a named function: the model may only
 * emit a call (to that function) with arguments of its schema's types
 * (ctl_toolgram: constrained decoding, docs/OPENAI_COMPAT.md). The grammar
 * is compiled here, so a schema it cannot enforce is a 400 before anything
 * runs; it is compiled again once the prompt is rendered when the prompt
 * leaves the reply inside a think block (ctl_openai_toolgram_reasoning).
 * r->wire.tools and r->wire.tool_fmt are set. Fills *pe and returns false on failure.
 */
static bool
ctl_openai_tool_choice_forced(ctl_openai_perr *pe, ctl_app *app, ctl_openai_req *r,
                              const char *param, const char *name)
{
    wk_diag d = {{0}};
    r->wire.tool_forced = true;
    if (name != NULL && (r->wire.tool_force_name = strdup(name)) == NULL) {
        ctl_openai_perr_set(pe, WK_ENOMEM, param, "out of memory");
        return false;
    }
    wk_err err = ctl_toolgram_new(app->tok, r->wire.tool_fmt, r->wire.tools, name,
                                  !r->wire.tool_serial, false, NULL, &r->wire.toolgram, &d);
    if (err != WK_OK) {
        ctl_openai_perr_set(pe, err, err == WK_EINVAL ? "tools" : param,
                        "%s cannot be enforced: %s", param, d.msg);
        return false;
    }
    return true;
}

/*
 * After rendering: a forced call whose prompt leaves the reply inside a think
 * block gets a grammar that first lets the model reason up to the closing
 * marker. Fills *pe and returns false on failure.
 */
static bool
ctl_openai_toolgram_reasoning(ctl_openai_perr *pe, ctl_app *app, ctl_openai_req *r)
{
    if (!r->wire.tool_forced || !r->wire.think_open)
        return true;
    wk_diag d = {{0}};
    ctl_toolgram *t = NULL;
    wk_err err =
        ctl_toolgram_new(app->tok, r->wire.tool_fmt, r->wire.tools, r->wire.tool_force_name,
                         !r->wire.tool_serial, true, WK_CHAT_TPL_THINK_CLOSE, &t, &d);
    if (err != WK_OK) {
        ctl_openai_perr_set(pe, err, "tool_choice", "tool_choice cannot be enforced: %s", d.msg);
        return false;
    }
    ctl_toolgram_free(r->wire.toolgram);
    r->wire.toolgram = t;
    return true;
}

/*
 * The legacy functions API (OpenAI's `functions` / `function_call`,
 * deprecated for `tools` / `tool_choice` and still sent by its SDK): the
 * body is rewritten into the tools API before anything else reads it.
 * `functions` [F, ...] becomes `tools` [{"type": "function", "function":
 * F}, ...] (both given: a 400), `function_call` "auto" / "none" / {"name":
 * N} becomes `tool_choice` "auto" / "none" / {"type": "function",
 * "function": {"name": N}}, and the reply holds at most one call
 * (parallel_tool_calls false), answered as `message.function_call` with
 * finish_reason "function_call" (r->wire.legacy_fn; docs/OPENAI_COMPAT.md). In
 * the history an assistant's `function_call` {"name", "arguments"} becomes
 * its `tool_calls` [{"id": "call_legacy_I", ...}] and a `role: "function"`
 * message {"name", "content"} a `role: "tool"` result answering the last
 * such call (tool_call_id), so the template renders it as a tool result.
 * Fills *pe and returns false on failure.
 */
static bool
ctl_openai_legacy_functions(ctl_openai_perr *pe, json_t *body, ctl_openai_req *r)
{
    json_t *fl = json_object_get(body, "functions");
    json_t *fc = json_object_get(body, "function_call");
    bool has_fl = fl != NULL && !json_is_null(fl), has_fc = fc != NULL && !json_is_null(fc);
    if (has_fl || has_fc) {
        json_t *tools = json_object_get(body, "tools");
        json_t *tc = json_object_get(body, "tool_choice");
        if ((has_fl && tools != NULL && !json_is_null(tools)) ||
            (has_fc && tc != NULL && !json_is_null(tc))) {
            ctl_openai_perr_set(pe, WK_EINVAL, has_fl ? "functions" : "function_call",
                            "use either 'tools' / 'tool_choice' or the legacy 'functions' / "
                            "'function_call', not both");
            return false;
        }
        bool ok = !has_fl || json_is_array(fl);
        size_t k;
        json_t *f;
        if (has_fl)
            json_array_foreach(fl, k, f) ok = ok && json_is_object(f);
        if (!ok) {
            ctl_openai_perr_set(pe, WK_EINVAL, "functions",
                                "'functions' must be an array of objects");
            return false;
        }
        const char *fcs = json_is_string(fc) ? json_string_value(fc) : NULL;
        json_t *fname = json_object_get(fc, "name");
        if (has_fc && !(fcs != NULL && (strcmp(fcs, "auto") == 0 || strcmp(fcs, "none") == 0)) &&
            !(json_is_object(fc) && json_is_string(fname))) {
            ctl_openai_perr_set(pe, WK_EINVAL, "function_call",
                            "'function_call' must be \"auto\", \"none\" or {\"name\": ...}");
            return false;
        }
        /* a named function_call names one of `functions` (the error names the
         * legacy field the client sent, not the tool_choice it maps to) */
        bool listed = fname == NULL || !json_is_string(fname);
        if (has_fl)
            json_array_foreach(fl, k, f) listed = listed ||
                json_equal(json_object_get(f, "name"), fname);
        if (has_fc && !listed) {
            ctl_openai_perr_set(pe, WK_EINVAL, "function_call",
                            "'function_call' names function '%s', which is not among the "
                            "'functions'", json_string_value(fname));
            return false;
        }
        if (has_fl) {
            json_t *tools_new = json_array();
            json_array_foreach(fl, k, f)
                json_array_append_new(tools_new,
                                      json_pack("{s:s, s:O}", "type", "function", "function", f));
            json_object_set_new(body, "tools", tools_new);
            r->wire.legacy_fn = true;
            json_t *p = json_object_get(body, "parallel_tool_calls");
            if (p == NULL || json_is_null(p))
                json_object_set_new(body, "parallel_tool_calls", json_false());
        }
        if (has_fc)
            json_object_set_new(body, "tool_choice",
                                fcs != NULL ? json_string(fcs)
                                            : json_pack("{s:s, s:{s:O}}", "type", "function",
                                                        "function", "name", fname));
        json_object_del(body, "functions");
        json_object_del(body, "function_call");
    }
    json_t *msgs = json_object_get(body, "messages");
    char last_id[40] = "";
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        json_t *role = json_object_get(m, "role");
        json_t *call = json_object_get(m, "function_call");
        if (!json_is_object(m) || !json_is_string(role))
            continue; /* (refused by ctl_openai_parse_messages_value) */
        char param[64];
        if (strcmp(json_string_value(role), "assistant") == 0 && call != NULL &&
            !json_is_null(call)) {
            json_t *tcs = json_object_get(m, "tool_calls");
            if (!json_is_object(call) || (tcs != NULL && !json_is_null(tcs))) {
                snprintf(param, sizeof(param), "messages[%zu].function_call", i);
                ctl_openai_perr_set(pe, WK_EINVAL, param,
                                "'function_call' must be {\"name\", \"arguments\"}, without "
                                "'tool_calls' on the same message");
                return false;
            }
            snprintf(last_id, sizeof(last_id), "call_legacy_%zu", i);
            json_object_set_new(m, "tool_calls",
                                json_pack("[{s:s, s:s, s:O}]", "id", last_id, "type", "function",
                                          "function", call));
            json_object_del(m, "function_call");
        } else if (strcmp(json_string_value(role), "function") == 0) {
            if (!json_is_string(json_object_get(m, "name"))) {
                snprintf(param, sizeof(param), "messages[%zu].name", i);
                ctl_openai_perr_set(pe, WK_EINVAL, param,
                                "a function message needs the string 'name' of its function");
                return false;
            }
            json_object_set_new(m, "role", json_string("tool"));
            if (json_object_get(m, "tool_call_id") == NULL) {
                char id[40];
                if (last_id[0] == '\0')
                    snprintf(id, sizeof(id), "call_legacy_%zu", i);
                json_object_set_new(m, "tool_call_id", json_string(last_id[0] ? last_id : id));
            }
        }
    }
    return true;
}

/*
 * Tools. `tools` is validated (an array of objects; for a model with its
 * own chat template function tools with unique names, docs/OPENAI_COMPAT.md).
 * For a model with its own chat template it is passed to the template, and unless tool_choice is
 * "none" the reply is parsed for calls in the template's format (wk_toolcall); a model without one
 * (the World template) answers in plain text, as OpenAI allows with "auto". tool_choice "none"
 * keeps the tools in the prompt and parses no calls (vLLM's default). "required" or a named
 * function needs constrained decoding (ctl_openai_tool_choice_forced). The legacy `functions` /
 * `function_call` become tools first (ctl_openai_legacy_functions).
 * parallel_tool_calls false returns the first call only. Fills *pe and returns false on
 * failure.
 */
static bool
ctl_openai_parse_tools(ctl_openai_perr *pe, ctl_app *app, json_t *body, ctl_openai_req *r)
{
    if (r->wire.chat && !ctl_openai_legacy_functions(pe, body, r))
        return false;
    json_t *tools = json_object_get(body, "tools");
    if (tools != NULL && json_is_null(tools))
        tools = NULL;
    if (tools != NULL && !ctl_openai_check_tools(pe, tools, app->chat_tpl != NULL))
        return false;
    size_t n_tools = tools != NULL ? json_array_size(tools) : 0;
    json_t *p = json_object_get(body, "parallel_tool_calls");
    if (p != NULL && !json_is_null(p) && !json_is_boolean(p)) {
        ctl_openai_perr_set(pe, WK_EINVAL, "parallel_tool_calls",
                            "'parallel_tool_calls' must be a boolean");
        return false;
    }
    r->wire.tool_serial = json_is_false(p);
    json_t *tc = json_object_get(body, "tool_choice");
    const char *c = json_is_string(tc) ? json_string_value(tc) : NULL;
    bool none = c != NULL && strcmp(c, "none") == 0;
    if (tc != NULL && !json_is_null(tc) && !(c != NULL && strcmp(c, "auto") == 0) && !none) {
        json_t *fn = json_object_get(tc, "function");
        json_t *name = json_object_get(fn, "name");
        json_t *type = json_object_get(tc, "type");
        bool named = json_is_object(tc) && json_is_string(type) &&
                     strcmp(json_string_value(type), "function") == 0 && json_is_string(name);
        if (!(c != NULL && strcmp(c, "required") == 0) && !named) {
            ctl_openai_perr_set(pe, WK_EINVAL, "tool_choice",
                            "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                            "{\"type\": \"function\", \"function\": {\"name\": ...}}");
            return false;
        }
        if (n_tools == 0) {
            ctl_openai_perr_set(pe, WK_EINVAL, "tool_choice",
                            "'tool_choice' cannot require one: the request offers no 'tools'");
            return false;
        }
        size_t k;
        json_t *t;
        bool found = !named;
        json_array_foreach(tools, k, t) found = found ||
            json_equal(json_object_get(json_object_get(t, "function"), "name"), name);
        if (!found) {
            ctl_openai_perr_set(pe, WK_EINVAL, "tool_choice",
                            "'tool_choice' names function '%s', which is not among the 'tools'",
                            json_string_value(name));
            return false;
        }
        if (app->chat_tpl == NULL ||
            wk_chat_tpl_toolcall_fmt(app->chat_tpl) == WK_TOOLCALL_FMT_NONE) {
            ctl_openai_perr_set(pe, WK_EINVAL, "tool_choice",
                            "'tool_choice' cannot require one: this model's chat template has "
                            "no tool-call format wkvm knows (use \"auto\" or \"none\")");
            return false;
        }
        r->wire.tools = json_incref(tools);
        r->wire.tool_fmt = wk_chat_tpl_toolcall_fmt(app->chat_tpl);
        return ctl_openai_tool_choice_forced(pe, app, r, "tool_choice",
                                             named ? json_string_value(name) : NULL);
    }
    if (app->chat_tpl != NULL && n_tools > 0) {
        r->wire.tools = json_incref(tools);
        r->wire.tool_fmt = none ? WK_TOOLCALL_FMT_NONE : wk_chat_tpl_toolcall_fmt(app->chat_tpl);
    }
    return true;
}

/*
 * logit_bias: an object of token id (a decimal string) -> bias in
 * [-100, 100], at most CTL_SAMPLE_BIAS_MAX entries, ids in the tokenizer's
 * vocab; the worker adds each bias to its token's logit before greedy or
 * sampling. Fills *pe and returns false on failure.
 */
static bool
ctl_openai_parse_logit_bias(ctl_openai_perr *pe, ctl_app *app, json_t *body, ctl_sample_spec *sp)
{
    json_t *lb = json_object_get(body, "logit_bias");
    sp->n_bias = 0;
    if (lb == NULL || json_is_null(lb))
        return true;
    if (!json_is_object(lb)) {
        ctl_openai_perr_set(pe, WK_EINVAL, "logit_bias",
                            "'logit_bias' must be an object of token id -> bias");
        return false;
    }
    if (json_object_size(lb) > CTL_SAMPLE_BIAS_MAX) {
        ctl_openai_perr_set(pe, WK_EINVAL, "logit_bias", "'logit_bias' has %zu entries, at most %u",
                            json_object_size(lb), CTL_SAMPLE_BIAS_MAX);
        return false;
    }
    uint32_t vocab = wk_tok_vocab_size(app->tok);
    const char *key;
    json_t *val;
    json_object_foreach(lb, key, val) {
        char *end = NULL;
        long long id = strtoll(key, &end, 10);
        if (key[0] < '0' || key[0] > '9' || end == NULL || *end != '\0' || id < 0 ||
            id >= (long long)vocab) {
            ctl_openai_perr_set(pe, WK_EINVAL, "logit_bias",
                                "logit_bias key '%.40s' is not a token id in [0, %u)", key, vocab);
            return false;
        }
        double b = json_is_number(val) ? json_number_value(val) : 0.0;
        if (!json_is_number(val) || !(b >= -100.0 && b <= 100.0)) {
            ctl_openai_perr_set(pe, WK_EINVAL, "logit_bias",
                                "logit_bias[%lld] must be a number in [-100, 100]", id);
            return false;
        }
        sp->bias[sp->n_bias++] = (ctl_logit_bias){.token = (int32_t)id, .bias = (float)b};
    }
    return true;
}

bool
ctl_openai_parse_common_value(ctl_app *app, json_t *body, ctl_openai_req *r, ctl_openai_perr *pe)
{
    wk_diag d = {{0}};
    const char *model = NULL;
    wk_err err = wk_json_get_str(body, "model", !r->wire.model_optional, app->model_id, 256, &model,
                                 &d);
    if (err != WK_OK) {
        ctl_openai_perr_set(pe, WK_EINVAL, "model", "%s", d.msg);
        return false;
    }
    if (app->model_id == NULL || model == NULL || strcmp(model, app->model_id) != 0) {
        ctl_openai_perr_set(pe, WK_ENOENT, "model", "The model '%s' does not exist", model);
        return false;
    }
    r->wire.model = model;
    for (size_t i = 0; i < sizeof(ctl_openai_unsupported) / sizeof(ctl_openai_unsupported[0]);
         i++) {
        json_t *v = json_object_get(body, ctl_openai_unsupported[i]);
        if (v != NULL && !json_is_null(v) &&
            !(json_is_array(v) && json_array_size(v) == 0)) {
            ctl_openai_perr_set(pe, WK_EINVAL, ctl_openai_unsupported[i],
                                "'%s' is not supported by wkvm", ctl_openai_unsupported[i]);
            return false;
        }
    }
    if (!ctl_openai_parse_tools(pe, app, body, r))
        return false;
    int64_t n = 1;
    if ((err = wk_json_get_i64(body, "n", false, 1, 1, 128, &n, &d)) != WK_OK || n != 1) {
        ctl_openai_perr_set(pe, WK_EINVAL, "n", "only n=1 is supported");
        return false;
    }
    json_t *rf = json_object_get(body, "response_format");
    if (rf != NULL && !json_is_null(rf)) {
        json_t *t = json_object_get(rf, "type");
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0) {
            ctl_openai_perr_set(pe, WK_EINVAL, "response_format",
                                "only response_format {\"type\":\"text\"} is supported");
            return false;
        }
    }
    bool b = false;
#define GETB(key, dst, def)                                                                        \
    do {                                                                                           \
        if (wk_json_get_bool(body, key, def, &b, &d) != WK_OK) {                                   \
            ctl_openai_perr_set(pe, WK_EINVAL, key, "%s", d.msg);                                  \
            return false;                                                                          \
        }                                                                                          \
        dst = b;                                                                                   \
    } while (0)
    GETB("cache", r->wire.cache, true);
    if (r->wire.cache)
        GETB("cache_prompt", r->wire.cache, true); /* (llama.cpp's name for the same switch) */
    GETB("stream", r->wire.stream, false);
    GETB("ignore_eos", r->wire.ignore_eos, false);
    GETB("return_token_ids", r->wire.return_token_ids, false);
#undef GETB
    json_t *so = json_object_get(body, "stream_options");
    if (so != NULL && !json_is_null(so)) {
        if (!json_is_object(so) || wk_json_get_bool(so, "include_usage", false, &b, &d) != WK_OK) {
            ctl_openai_perr_set(pe, WK_EINVAL, "stream_options",
                                "stream_options.include_usage must be a boolean");
            return false;
        }
        r->wire.include_usage = b;
    }
    double x = 0;
    ctl_sample_spec *sp = &r->plan.gen.sample;
#define GETN(key, dst, def, lo, hi)                                                                \
    do {                                                                                           \
        if (wk_json_get_num(body, key, false, def, lo, hi, &x, &d) != WK_OK) {                     \
            ctl_openai_perr_set(pe, WK_EINVAL, key, "%s", d.msg);                                  \
            return false;                                                                          \
        }                                                                                          \
        dst = (float)x;                                                                            \
    } while (0)
    GETN("temperature", sp->temperature, 1.0, 0.0, 2.0);
    GETN("top_p", sp->top_p, 1.0, 0.0, 1.0);
    GETN("min_p", sp->min_p, 0.0, 0.0, 1.0);
    GETN("presence_penalty", sp->presence_penalty, 0.0, -2.0, 2.0);
    GETN("frequency_penalty", sp->frequency_penalty, 0.0, -2.0, 2.0);
#undef GETN
    int64_t v = 0;
    if (wk_json_get_i64(body, "top_k", false, 0, -1, 1 << 20, &v, &d) != WK_OK) {
        ctl_openai_perr_set(pe, WK_EINVAL, "top_k", "%s", d.msg);
        return false;
    }
    sp->top_k = v < 0 ? 0 : (uint32_t)v;
    if (wk_json_get_i64(body, "seed", false, 0, INT64_MIN, INT64_MAX, &v, &d) != WK_OK) {
        ctl_openai_perr_set(pe, WK_EINVAL, "seed", "%s", d.msg);
        return false;
    }
    if (json_object_get(body, "seed") != NULL && !json_is_null(json_object_get(body, "seed"))) {
        sp->seed = (uint64_t)v;
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        sp->seed = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
    }
    /* max_completion_tokens wins over max_tokens when both are present. */
    const char *mk = json_object_get(body, "max_completion_tokens") ? "max_completion_tokens"
                                                                      : "max_tokens";
    int64_t def_max = r->wire.chat ? (int64_t)app->default_max_tokens : 16;
    if (wk_json_get_i64(body, mk, false, def_max, 1, app->max_tokens_limit, &v, &d) != WK_OK) {
        ctl_openai_perr_set(pe, WK_EINVAL, mk, "%s", d.msg);
        return false;
    }
    r->plan.gen.max_tokens = (uint32_t)v;
    /* Stop strings. */
    json_t *st = json_object_get(body, "stop");
    if (st != NULL && !json_is_null(st)) {
        if (json_is_string(st)) {
            r->plan.gen.stops[r->plan.gen.n_stops++] = json_string_value(st);
        } else if (json_is_array(st) && json_array_size(st) <= 4) {
            size_t i;
            json_t *e;
            json_array_foreach(st, i, e) {
                if (!json_is_string(e)) {
                    ctl_openai_perr_set(pe, WK_EINVAL, "stop", "'stop' entries must be strings");
                    return false;
                }
                r->plan.gen.stops[r->plan.gen.n_stops++] = json_string_value(e);
            }
        } else {
            ctl_openai_perr_set(pe, WK_EINVAL, "stop",
                                "'stop' must be a string or up to 4 strings");
            return false;
        }
        uint32_t max_stop = app->max_stop_bytes ? app->max_stop_bytes : CTL_OPENAI_MAX_STOP_LEN;
        for (size_t i = 0; i < r->plan.gen.n_stops; i++) {
            json_t *sv = json_is_string(st) ? st : json_array_get(st, i);
            if (strlen(r->plan.gen.stops[i]) != json_string_length(sv)) {
                ctl_openai_perr_set(pe, WK_EINVAL, "stop", "stop strings cannot contain NUL");
                return false;
            }
            if (strlen(r->plan.gen.stops[i]) > max_stop) {
                ctl_openai_perr_set(pe, WK_EINVAL, "stop", "stop strings are limited to %u bytes",
                                    max_stop);
                return false;
            }
        }
    }
    r->plan.gen.stop_on_eot = !r->wire.ignore_eos;
    return ctl_openai_parse_logit_bias(pe, app, body, sp);
}

/*
 * Reads the text of a message's content (string or text parts) into *out
 * (caller frees), *len bytes (NULs included) plus a terminating NUL.
 */
static bool
ctl_openai_content(ctl_openai_perr *pe, json_t *content, size_t idx, char **out, size_t *len)
{
    *len = 0;
    char param[64];
    snprintf(param, sizeof(param), "messages[%zu].content", idx);
    if (content == NULL || json_is_null(content)) {
        *out = strdup("");
        if (*out == NULL)
            ctl_openai_perr_set(pe, WK_ENOMEM, NULL, "out of memory");
        return *out != NULL;
    }
    if (json_is_string(content)) {
        /* (a NUL is content: the chat renderer drops it, as for the model's own replies) */
        size_t n = json_string_length(content);
        *out = malloc(n + 1);
        if (*out == NULL) {
            ctl_openai_perr_set(pe, WK_ENOMEM, NULL, "out of memory");
            return false;
        }
        memcpy(*out, json_string_value(content), n);
        (*out)[n] = '\0';
        *len = n;
        return true;
    }
    if (!json_is_array(content)) {
        ctl_openai_perr_set(pe, WK_EINVAL, param, "content must be a string or an array of parts");
        return false;
    }
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(content, i, part) {
        json_t *type = json_object_get(part, "type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0) {
            ctl_openai_perr_set(pe, WK_EINVAL, param,
                                "only text content parts are supported (got %s)",
                                json_is_string(type) ? json_string_value(type) : "no type");
            return false;
        }
        json_t *t = json_object_get(part, "text");
        if (!json_is_string(t)) {
            ctl_openai_perr_set(pe, WK_EINVAL, param, "a text part needs a string 'text'");
            return false;
        }
        total += json_string_length(t);
    }
    char *s = malloc(total + 1);
    if (s == NULL) {
        ctl_openai_perr_set(pe, WK_ENOMEM, NULL, "out of memory");
        return false;
    }
    size_t off = 0;
    json_array_foreach(content, i, part) {
        json_t *t = json_object_get(part, "text");
        memcpy(s + off, json_string_value(t), json_string_length(t));
        off += json_string_length(t);
    }
    s[off] = '\0';
    *out = s;
    *len = off;
    return true;
}

/*
 * A message's tool parts: an assistant's tool_calls ([{"id", "type":
 * "function", "function": {"name", "arguments"}}], arguments a string of a
 * JSON object as OpenAI sends it, or the object itself) and a tool result's
 * tool_call_id. Both need a model with its own chat template (the World
 * template has no way to write them). Fills *pe and returns false on failure.
 */
static bool
ctl_openai_check_tool_msg(ctl_openai_perr *pe, ctl_app *app, json_t *m, size_t i, const char *role)
{
    char param[96];
    json_t *tc = json_object_get(m, "tool_calls");
    bool has_calls = tc != NULL && !json_is_null(tc) &&
                     !(json_is_array(tc) && json_array_size(tc) == 0);
    bool tool_role = strcmp(role, "tool") == 0;
    if ((has_calls || tool_role) && app->chat_tpl == NULL) {
        snprintf(param, sizeof(param),
                 has_calls ? "messages[%zu].tool_calls" : "messages[%zu].role", i);
        ctl_openai_perr_set(pe, WK_EINVAL, param,
                        "tool calls are not supported by this model: it has no chat template of "
                        "its own (the plain User:/Assistant: template cannot write them)");
        return false;
    }
    if (tool_role) {
        json_t *id = json_object_get(m, "tool_call_id");
        if (!json_is_string(id)) {
            snprintf(param, sizeof(param), "messages[%zu].tool_call_id", i);
            ctl_openai_perr_set(pe, WK_EINVAL, param,
                                "a tool message needs a string 'tool_call_id'");
            return false;
        }
    }
    if (!has_calls)
        return true;
    snprintf(param, sizeof(param), "messages[%zu].tool_calls", i);
    if (strcmp(role, "assistant") != 0 || !json_is_array(tc)) {
        ctl_openai_perr_set(pe, WK_EINVAL, param,
                        "'tool_calls' must be an array, on an assistant message");
        return false;
    }
    size_t k;
    json_t *call;
    json_array_foreach(tc, k, call) {
        json_t *fn = json_object_get(call, "function");
        json_t *type = json_object_get(call, "type");
        json_t *name = json_object_get(fn, "name");
        json_t *args = json_object_get(fn, "arguments");
        bool ok = json_is_object(call) && json_is_string(json_object_get(call, "id")) &&
                  (type == NULL || (json_is_string(type) &&
                                    strcmp(json_string_value(type), "function") == 0)) &&
                  json_is_string(name) && json_string_length(name) > 0 &&
                  (json_is_string(args) || json_is_object(args));
        if (!ok) {
            snprintf(param, sizeof(param), "messages[%zu].tool_calls[%zu]", i, k);
            ctl_openai_perr_set(pe, WK_EINVAL, param,
                            "a tool call must be {\"id\": string, \"type\": \"function\", "
                            "\"function\": {\"name\": string, \"arguments\": string}}");
            return false;
        }
    }
    return true;
}

/*
 * The chat prompt of a model with its own template (app->chat_tpl): the
 * request's messages as sent ("developer" read as "system", tool call
 * arguments as objects for templates that iterate them), its tools (r->wire.tools)
 * and its chat_template_kwargs rendered with a generation prompt, then encoded whole (added tokens
 * such as <|im_start|> become their ids). No message spans, reply alignment or checkpoint
 * boundaries: the template decides where messages lie, so reuse is the prefix index's longest
 * checkpoint that is a prefix of the tokens. The messages were validated by the caller.
 */
static bool
ctl_openai_parse_templated(ctl_openai_perr *pe, ctl_app *app, json_t *body, ctl_openai_req *r)
{
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (kw != NULL && !json_is_null(kw) && !json_is_object(kw)) {
        ctl_openai_perr_set(pe, WK_EINVAL, "chat_template_kwargs",
                        "'chat_template_kwargs' must be an object");
        return false;
    }
    /* reasoning_effort (checked by ctl_openai_parse_platform) is a template variable too */
    json_t *effort = json_object_get(body, "reasoning_effort");
    json_t *kw_own = NULL;
    if (json_is_string(effort) &&
        (!json_is_object(kw) || json_object_get(kw, "reasoning_effort") == NULL)) {
        kw_own = json_is_object(kw) ? json_copy(kw) : json_object();
        if (kw_own == NULL ||
            json_object_set(kw_own, "reasoning_effort", effort) != 0) {
            json_decref(kw_own);
            ctl_openai_perr_set(pe, WK_ENOMEM, NULL, "out of memory");
            return false;
        }
        kw = kw_own;
    }
    json_t *msgs = json_deep_copy(json_object_get(body, "messages"));
    wk_diag d = {{0}};
    size_t bad_msg = 0, bad_call = 0;
    wk_err perr = msgs != NULL ? wk_chat_tpl_prepare(app->chat_tpl, msgs, &bad_msg, &bad_call, &d)
                               : WK_OK;
    if (perr != WK_OK) {
        char param[96];
        snprintf(param, sizeof(param), "messages[%zu].tool_calls[%zu].function.arguments",
                 bad_msg, bad_call);
        ctl_openai_perr_set(pe, perr, perr == WK_EINVAL ? param : NULL, "%s", d.msg);
        json_decref(msgs);
        json_decref(kw_own);
        return false;
    }
    char *prompt = NULL;
    size_t plen = 0;
    wk_err err = msgs == NULL ? WK_ENOMEM
                              : wk_chat_tpl_render_json(app->chat_tpl, msgs, r->wire.tools, true,
                                                        json_is_object(kw) ? kw : NULL, NULL,
                                                        &prompt, &plen, &d);
    if (err == WK_OK)
        r->plan.hist_end = ctl_openai_hist_end(app, msgs, r->wire.tools,
                                               json_is_object(kw) ? kw : NULL, prompt, plen);
    /* (kept for parent-token-v1's alignment, ctl_openai_tpl_align) */
    r->wire.tpl_msgs = msgs;
    r->wire.tpl_kw = json_is_object(kw) ? json_incref(kw) : NULL;
    json_decref(kw_own);
    if (err != WK_OK) {
        bool kw_bad = strncmp(d.msg, "chat_template_kwargs", 20) == 0;
        ctl_openai_perr_set(pe, err == WK_ENOMEM ? WK_ENOMEM : WK_EINVAL,
                        err == WK_ENOMEM ? NULL
                        : kw_bad         ? "chat_template_kwargs"
                                         : "messages",
                        "chat template: %s", err == WK_ENOMEM ? "out of memory" : d.msg);
        free(prompt);
        return false;
    }
    r->wire.prompt_text = prompt;
    r->wire.prompt_len = plen;
    r->wire.templated = true;
    if (plen > CTL_OPENAI_MAX_TEXT) {
        ctl_openai_perr_set(pe, WK_ETOOBIG, "messages", "the prompt is longer than %u bytes",
                        CTL_OPENAI_MAX_TEXT);
        return false;
    }
    if (wk_chat_tpl_thinks(app->chat_tpl)) {
        r->wire.think = true;
        r->wire.think_open = wk_chat_think_open_at_end(prompt, plen, WK_CHAT_TPL_THINK_OPEN,
                                                  WK_CHAT_TPL_THINK_CLOSE);
    }
    if (!ctl_openai_toolgram_reasoning(pe, app, r))
        return false;
    if (wk_tok_encode(app->tok, prompt, plen, &r->plan.prompt, &r->plan.n_prompt, &d) != WK_OK) {
        ctl_openai_perr_set(pe, WK_EINVAL, "messages", "%s", d.msg);
        return false;
    }
    r->plan.aligned_tokens = 0;
    ctl_openai_templated_bounds(app, r);
    return true;
}

/* Renders and tokenizes the chat messages into r->plan.prompt. */
bool
ctl_openai_parse_messages_value(ctl_app *app, json_t *body, ctl_openai_req *r, ctl_openai_perr *pe)
{
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        ctl_openai_perr_set(pe, WK_EINVAL, "messages", "'messages' must be a non-empty array");
        return false;
    }
    size_t n = json_array_size(msgs);
    uint32_t max_msgs = app->max_messages ? app->max_messages : CTL_OPENAI_MAX_MESSAGES;
    if (n > max_msgs) {
        ctl_openai_perr_set(pe, WK_ETOOBIG, "messages", "at most %u messages", max_msgs);
        return false;
    }
    wk_chat_msg *cm = calloc(n, sizeof(*cm));
    char **texts = calloc(n, sizeof(*texts));
    bool ok = cm != NULL && texts != NULL;
    if (!ok)
        ctl_openai_perr_set(pe, WK_ENOMEM, NULL, "out of memory");
    /* The messages stay with the request (sessions validate against them). */
    r->wire.msgs = cm;
    r->wire.msg_texts = texts;
    r->wire.n_msgs = texts != NULL ? n : 0;
    for (size_t i = 0; ok && i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        json_t *role = json_object_get(m, "role");
        char param[48];
        snprintf(param, sizeof(param), "messages[%zu].role", i);
        if (!json_is_string(role) || strlen(json_string_value(role)) != json_string_length(role)) {
            ctl_openai_perr_set(pe, WK_EINVAL, param, "each message needs a string 'role'");
            ok = false;
            break;
        }
        const char *rs = json_string_value(role);
        if (strcmp(rs, "developer") == 0)
            rs = "system";
        bool tool_role = strcmp(rs, "tool") == 0;
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && !tool_role) {
            ctl_openai_perr_set(pe, WK_EINVAL, param, "role '%s' is not supported (%s)",
                            json_string_value(role),
                            app->chat_tpl != NULL ? "system, developer, user, assistant, tool"
                                                  : "system, developer, user, assistant");
            ok = false;
            break;
        }
        if (!ctl_openai_check_tool_msg(pe, app, m, i, rs)) {
            ok = false;
            break;
        }
        size_t clen = 0;
        ok = ctl_openai_content(pe, json_object_get(m, "content"), i, &texts[i], &clen);
        if (ok && app->max_message_bytes && clen > app->max_message_bytes) {
            snprintf(param, sizeof(param), "messages[%zu].content", i);
            ctl_openai_perr_set(pe, WK_ETOOBIG, param,
                                "a message's content is limited to %llu bytes",
                                (unsigned long long)app->max_message_bytes);
            ok = false;
        }
        cm[i].role = rs;
        cm[i].content = texts[i];
        cm[i].content_len = clen;
    }
    if (ok && app->chat_tpl != NULL)
        return ctl_openai_parse_templated(pe, app, body, r);
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (ok && kw != NULL && !json_is_null(kw)) { /* (honoured or refused, never ignored) */
        ctl_openai_perr_set(pe, WK_EINVAL, "chat_template_kwargs",
                        "'chat_template_kwargs' needs a model with its own chat template "
                        "(this one uses the plain User:/Assistant: template)");
        ok = false;
    }
    char *prompt = NULL;
    size_t plen = 0;
    wk_diag d = {{0}};
    wk_chat_span *sp = ok ? calloc(n ? n : 1, sizeof(*sp)) : NULL;
    if (ok && sp == NULL) {
        ctl_openai_perr_set(pe, WK_ENOMEM, NULL, "out of memory");
        ok = false;
    }
    if (ok && wk_chat_render_spans(cm, n, true, &prompt, &plen, sp, &d) != WK_OK) {
        ctl_openai_perr_set(pe, WK_EINVAL, "messages", "%s", d.msg);
        ok = false;
    }
    if (ok && plen > CTL_OPENAI_MAX_TEXT) {
        ctl_openai_perr_set(pe, WK_ETOOBIG, "messages", "the prompt is longer than %u bytes",
                        CTL_OPENAI_MAX_TEXT);
        ok = false;
    }
    r->wire.prompt_text = prompt;
    r->wire.prompt_len = plen;
    if (ok && ctl_openai_chat_tokens(app, r, sp, &d) != WK_OK) {
        ctl_openai_perr_set(pe, WK_EINVAL, "messages", "%s", d.msg);
        ok = false;
    }
    free(sp);
    return ok;
}

bool
ctl_openai_parse_prompt_value(ctl_app *app, json_t *body, ctl_openai_req *r, ctl_openai_perr *pe)
{
    json_t *p = json_object_get(body, "prompt");
    wk_diag d = {{0}};
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0); /* (a batch of one) */
    if (json_is_string(p)) {
        if (json_string_length(p) > CTL_OPENAI_MAX_TEXT) {
            ctl_openai_perr_set(pe, WK_ETOOBIG, "prompt", "the prompt is longer than %u bytes",
                            CTL_OPENAI_MAX_TEXT);
            return false;
        }
        if (wk_tok_encode(app->tok, json_string_value(p), json_string_length(p), &r->plan.prompt,
                          &r->plan.n_prompt, &d) != WK_OK) {
            ctl_openai_perr_set(pe, WK_EINVAL, "prompt", "%s", d.msg);
            return false;
        }
    } else if (json_is_array(p) && json_array_size(p) > 0 &&
               (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)))) {
        /* A batch ([string, ...] or [[ids], ...]): one request per prompt instead. */
        ctl_openai_perr_set(pe, WK_EINVAL, "prompt",
                        "a batch of %zu prompts is not supported: send one request per prompt "
                        "('prompt' is a string, one-string array or array of token ids)",
                        json_array_size(p));
        return false;
    } else if (json_is_array(p) && json_array_size(p) > 0) {
        size_t n = json_array_size(p);
        uint32_t vocab = wk_tok_vocab_size(app->tok);
        if (n > app->max_prompt_tokens) {
            ctl_openai_perr_set(pe, WK_ETOOBIG, "prompt", "at most %u prompt tokens",
                            app->max_prompt_tokens);
            return false;
        }
        r->plan.prompt = malloc(n * sizeof(*r->plan.prompt));
        if (r->plan.prompt == NULL) {
            ctl_openai_perr_set(pe, WK_ENOMEM, NULL, "out of memory");
            return false;
        }
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(p, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) >= (json_int_t)vocab) {
                ctl_openai_perr_set(pe, WK_EINVAL, "prompt",
                                "prompt[%zu] is not a token id in [0, %u)", i, vocab);
                return false;
            }
            r->plan.prompt[i] = (int32_t)json_integer_value(e);
        }
        r->plan.n_prompt = n;
    } else {
        ctl_openai_perr_set(pe, WK_EINVAL, "prompt",
                        "'prompt' must be a non-empty string or a non-empty array of token ids");
        return false;
    }
    if (r->plan.n_prompt == 0) {
        ctl_openai_perr_set(pe, WK_EINVAL, "prompt", "the prompt encodes to no tokens");
        return false;
    }
    int64_t best_of = 1;
    if (wk_json_get_i64(body, "best_of", false, 1, 1, 128, &best_of, &d) != WK_OK ||
        best_of != 1) {
        ctl_openai_perr_set(pe, WK_EINVAL, "best_of", "only best_of=1 is supported");
        return false;
    }
    json_t *echo = json_object_get(body, "echo");
    if (json_is_true(echo)) {
        ctl_openai_perr_set(pe, WK_EINVAL, "echo", "'echo' is not supported");
        return false;
    }
    json_t *suffix = json_object_get(body, "suffix");
    if (suffix != NULL && !json_is_null(suffix)) {
        ctl_openai_perr_set(pe, WK_EINVAL, "suffix", "'suffix' is not supported");
        return false;
    }
    /* Legacy logprobs: an integer count of alternatives. */
    int64_t lp = 0;
    if (wk_json_get_i64(body, "logprobs", false, 0, 0, 20, &lp, &d) != WK_OK) {
        ctl_openai_perr_set(pe, WK_EINVAL, "logprobs", "%s", d.msg);
        return false;
    }
    if (json_object_get(body, "logprobs") != NULL &&
        !json_is_null(json_object_get(body, "logprobs"))) {
        r->wire.logprobs = true;
        r->wire.top_logprobs = (uint32_t)lp;
    }
    return true;
}

/* Parses the chat-only logprobs fields. */
static bool
ctl_openai_parse_chat_logprobs(ctl_openai_perr *pe, json_t *body, ctl_openai_req *r)
{
    wk_diag d = {{0}};
    bool b = false;
    int64_t v = 0;
    if (wk_json_get_bool(body, "logprobs", false, &b, &d) != WK_OK) {
        ctl_openai_perr_set(pe, WK_EINVAL, "logprobs", "%s", d.msg);
        return false;
    }
    if (wk_json_get_i64(body, "top_logprobs", false, 0, 0, 20, &v, &d) != WK_OK) {
        ctl_openai_perr_set(pe, WK_EINVAL, "top_logprobs", "%s", d.msg);
        return false;
    }
    if (v > 0 && !b) {
        ctl_openai_perr_set(pe, WK_EINVAL, "top_logprobs", "top_logprobs needs logprobs: true");
        return false;
    }
    r->wire.logprobs = b;
    r->wire.top_logprobs = (uint32_t)v;
    return true;
}


bool
ctl_openai_parse_body(const char *buf, size_t len, json_t **out, ctl_openai_perr *pe)
{
    json_t *body = NULL;
    wk_diag d = {{0}};
    *out = NULL;
    if (wk_json_parse_text(buf, len, &body, &d) != WK_OK) { /* (NUL only in texts, below) */
        ctl_openai_perr_set(pe, WK_EINVAL, NULL, "%s", d.msg);
        return false;
    }
    if (!json_is_object(body)) {
        json_decref(body);
        ctl_openai_perr_set(pe, WK_EINVAL, NULL, "the request body must be a JSON object");
        return false;
    }
    *out = body;
    return true;
}

bool
ctl_openai_parse_chat(ctl_app *app, json_t *body, ctl_openai_req *r, ctl_openai_perr *pe)
{
    return ctl_openai_check_fields(pe, body, ctl_openai_chat_fields,
                                   sizeof(ctl_openai_chat_fields) /
                                       sizeof(ctl_openai_chat_fields[0])) &&
           ctl_openai_parse_platform(pe, app, body) &&
           ctl_openai_parse_common_value(app, body, r, pe) &&
           ctl_openai_parse_chat_logprobs(pe, body, r) &&
           ctl_openai_parse_messages_value(app, body, r, pe);
}

bool
ctl_openai_parse_completion(ctl_app *app, json_t *body, ctl_openai_req *r, ctl_openai_perr *pe)
{
    return ctl_openai_check_fields(pe, body, ctl_openai_completion_fields,
                                   sizeof(ctl_openai_completion_fields) /
                                       sizeof(ctl_openai_completion_fields[0])) &&
           ctl_openai_parse_common_value(app, body, r, pe) &&
           ctl_openai_parse_prompt_value(app, body, r, pe);
}
