/*
 * ctl_openai: the OpenAI-compatible routes: GET /v1/models,
 * POST /v1/chat/completions and POST /v1/completions, blocking and
 * streaming (SSE). Parses and validates the request (every refusal is an
 * OpenAI error naming the field), renders the chat template, tokenizes,
 * runs the generation through ctl_gen and shapes the response. Never talks
 * to workers directly.
 */
#define WK_LOG_MODULE "openai"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl_app.h"
#include "ctl_err.h"
#include "ctl_chat.h"
#include "ctl_ckpt.h"
#include "ctl_gen.h"
#include "ctl_ssefmt.h"
#include "ctl_stream.h"
#include "ctl_openai.h"
#include "ctl_session.h"
#include "wk_chat.h"
#include "wk_json.h"
#include "wk_log.h"
#include "wk_sha256.h"

#define CTL_OPENAI_MAX_MESSAGES 4096
#define CTL_OPENAI_MAX_TEXT (8u << 20)
#define CTL_OPENAI_MAX_STOP_LEN 256

void
ctl_openai_req_fini(ctl_openai_req *r)
{
    for (size_t i = 0; r->msg_texts != NULL && i < r->n_msgs; i++)
        free(r->msg_texts[i]);
    free(r->msg_texts);
    free(r->msgs);
    free(r->prompt_text);
    free(r->prompt);
    free(r->msg_ends);
    json_decref(r->tools);
    json_decref(r->tpl_msgs);
    json_decref(r->tpl_kw);
    json_decref(r->call_tools);
    free(r->tool_force_name);
    ctl_toolgram_free(r->toolgram);
}

void
ctl_openai_owner(ctl_http_req *req, char out[CTL_STORE_OWNER_MAX + 1])
{
    const char *user = ctl_http_req_user(req);
    const char *ow = ctl_http_req_header(req, CTL_SESSION_HDR_USER_ID);
    if (user == NULL || user[0] == '\0')
        user = "local";
    while (ow != NULL && (*ow == ' ' || *ow == '\t'))
        ow++;
    size_t n = ow != NULL ? strlen(ow) : 0;
    while (n > 0 && (ow[n - 1] == ' ' || ow[n - 1] == '\t'))
        n--;
    if (n == 0) {
        snprintf(out, CTL_STORE_OWNER_MAX + 1, "%.128s", user);
        return;
    }
    /* Open WebUI's user within the API user: printable ids as they are, others hashed. */
    bool plain = n <= 64;
    for (size_t i = 0; plain && i < n; i++)
        plain = (unsigned char)ow[i] > 0x20 && (unsigned char)ow[i] < 0x7f;
    char hex[WK_SHA256_HEX_LEN];
    if (!plain)
        wk_sha256_hex(ow, n, hex);
    snprintf(out, CTL_STORE_OWNER_MAX + 1, "%.56s/owui:%.*s", user, plain ? (int)n : 32,
             plain ? ow : hex);
}

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
    if (app->ckpt != NULL && r->cache && ctl_ckpt_get_config(app->ckpt).enabled &&
        ctl_pool_model_view(app->pool, &v) == WK_OK) {
        unsigned tries = 0;
        for (size_t k = r->n_msgs; k-- > 0 && tries < 4;) {
            if (strcmp(r->msgs[k].role, "assistant") != 0)
                continue;
            tries++;
            char key[WK_SHA256_HEX_LEN];
            ctl_ckpt_reply_key(v.fingerprint, r->owner, r->prompt_text, sp[k].end, key);
            if (ctl_ckpt_reply_tokens(app->ckpt, key, &ret, &n_ret)) {
                off = ctl_session_align_at(app->tok, ret, n_ret, &sp[k]);
                break;
            }
        }
    }
    wk_err err = ret != NULL ? wk_tok_encode_continue(app->tok, r->prompt_text, r->prompt_len,
                                                      off, &rest, &n_rest, d)
                             : wk_tok_encode(app->tok, r->prompt_text, r->prompt_len, &rest,
                                             &n_rest, d);
    if (err == WK_OK && (r->prompt = malloc((n_ret + n_rest + 1) * sizeof(*r->prompt))) == NULL)
        err = WK_ENOMEM;
    if (err != WK_OK) {
        free(ret);
        free(rest);
        return err;
    }
    if (n_ret)
        memcpy(r->prompt, ret, n_ret * sizeof(*ret));
    if (n_rest)
        memcpy(r->prompt + n_ret, rest, n_rest * sizeof(*rest));
    r->n_prompt = n_ret + n_rest;
    r->aligned_tokens = n_ret;
    free(r->msg_ends);
    r->msg_ends = malloc((r->n_msgs ? r->n_msgs : 1) * sizeof(*r->msg_ends));
    if (r->msg_ends == NULL) {
        free(ret);
        free(rest);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < r->n_msgs; i++)
        r->msg_ends[i] = sp[i].end;
    r->n_bounds = 0;
    ctl_openai_chat_bounds(app->tok, r, off, rest, n_rest, n_ret);
    free(ret);
    free(rest);
    return WK_OK;
}

void
ctl_openai_chat_bounds(const wk_tok *tok, ctl_openai_req *r, size_t off, const int32_t *rest,
                       size_t n_rest, size_t pos0)
{
    /*
     * Message ends after off, as token positions: the last token boundary at
     * or before each end (a token across it belongs to what follows).
     */
    if (r->msg_ends == NULL)
        return;
    size_t acc = off, pos = pos0, mi = 0;
    while (mi < r->n_msgs && r->msg_ends[mi] <= off)
        mi++;
    for (size_t i = 0; i <= n_rest && mi < r->n_msgs && r->n_bounds < CTL_CKPT_MAX_BOUNDS; i++) {
        size_t pl = 0;
        if (i < n_rest) {
            const uint8_t *pc = wk_tok_piece(tok, rest[i], &pl);
            if (i == 0 && pc != NULL && pl > 0 && pc[0] == ' ' && off < r->prompt_len &&
                r->prompt_text[off] != ' ')
                pl--; /* (an hf-spm "\u2581" put in front is no text) */
        }
        while (mi < r->n_msgs && (i == n_rest || acc + pl > r->msg_ends[mi])) {
            if (pos > 0 && (r->n_bounds == 0 || r->bounds[r->n_bounds - 1] < pos) &&
                r->n_bounds < CTL_CKPT_MAX_BOUNDS)
                r->bounds[r->n_bounds++] = pos;
            mi++;
        }
        acc += pl;
        pos++;
    }
}

static void
ctl_openai_fail(ctl_http_req *req, wk_err err, const char *param, const char *fmt, ...)
    WK_PRINTF(4, 5);

static void
ctl_openai_fail(ctl_http_req *req, wk_err err, const char *param, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ctl_http_send_error(req, err, msg, param);
}

static wk_err ctl_openai_perr_set(ctl_openai_perr *pe, wk_err err, const char *param,
                                  const char *fmt, ...) WK_PRINTF(4, 5);

/* Records a parse error in pe (the message as ctl_openai_fail() would send it). Returns err. */
static wk_err
ctl_openai_perr_set(ctl_openai_perr *pe, wk_err err, const char *param, const char *fmt, ...)
{
    pe->err = err;
    snprintf(pe->param, sizeof(pe->param), "%s", param != NULL ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pe->msg, sizeof(pe->msg), fmt, ap);
    va_end(ap);
    return err;
}

/*
 * An admission or generation error. WK_ETOOBIG from the scheduler is a
 * request whose context (input + max_tokens, plus a session's or state's
 * tokens) can never fit a hybrid model's KV pool: a 400
 * context_length_exceeded, as OpenAI answers an over-long prompt.
 */
static void
ctl_openai_send_gen_error(ctl_http_req *req, wk_err err, const char *msg)
{
    if (err == WK_ETOOBIG)
        ctl_http_send_error_code(req, 400, err, msg, "max_tokens", "context_length_exceeded");
    else
        ctl_http_send_error(req, err, msg, NULL);
}

/* The model object of app's model (OpenAI's fields, then wkvm's extensions). */
static json_t *
ctl_openai_model_json(ctl_app *app)
{
    json_t *m = json_pack("{s:s, s:s, s:I, s:s}", "id", app->model_id, "object", "model",
                          "created", (json_int_t)(app->start_ms / 1000), "owned_by", "wkvm");
    /* wkvm extensions: what one state slot of this model is (null until a worker is ready) */
    ctl_worker_view v;
    if (m != NULL && ctl_pool_model_view(app->pool, &v) == WK_OK) {
        json_object_set_new(m, "family", json_string(v.family[0] ? v.family : "rwkv7"));
        json_object_set_new(m, "state_bytes_per_slot", json_integer((json_int_t)v.state_bytes));
        json_object_set_new(m, "n_layer", json_integer(v.n_layer));
        /*
         * hybrid models: a slot also holds this many KV bytes per token of
         * context (absent for recurrent-only families: nothing grows)
         */
        if (v.kv_token_bytes > 0) {
            json_object_set_new(m, "kv_bytes_per_token",
                                json_integer((json_int_t)v.kv_token_bytes));
            json_object_set_new(m, "kv_page_tokens", json_integer(v.kv_page_tokens));
        }
    } else if (m != NULL) {
        json_object_set_new(m, "family", json_null());
        json_object_set_new(m, "state_bytes_per_slot", json_null());
    }
    return m;
}

static void
ctl_openai_models(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    json_t *data = json_array();
    if (app->model_id != NULL)
        json_array_append_new(data, ctl_openai_model_json(app));
    ctl_http_send_json(req, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

/* GET /v1/models/{id}: the model object, or OpenAI's 404 model_not_found. */
static void
ctl_openai_model_get(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    const char *id = ctl_http_req_path(req) + strlen("/v1/models/");
    if (app->model_id == NULL || strcmp(id, app->model_id) != 0) {
        ctl_http_send_error_code(req, 404, WK_ENOENT,
                                 "The model does not exist or you do not have access to it.",
                                 "model", "model_not_found");
        return;
    }
    ctl_http_send_json(req, 200, ctl_openai_model_json(app));
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

/* Refuses (400 naming it) the first body field not in known[]. Sends the error, returns false. */
static bool
ctl_openai_check_fields(ctl_http_req *req, json_t *body, const char *const *known, size_t n)
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
            ctl_openai_fail(req, WK_EINVAL, param,
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
 * OpenAI refuses it for models that do not reason). Sends the error and
 * returns false.
 */
static bool
ctl_openai_parse_platform(ctl_http_req *req, ctl_app *app, json_t *body)
{
    json_t *v = json_object_get(body, "store");
    if (v != NULL && !json_is_null(v) && !json_is_false(v)) {
        ctl_openai_fail(req, WK_EINVAL, "store",
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
            ctl_openai_fail(req, WK_EINVAL, "metadata",
                            "'metadata' must be an object of at most 16 string values");
            return false;
        }
    }
    v = json_object_get(body, "service_tier");
    const char *t = json_is_string(v) ? json_string_value(v) : NULL;
    if (v != NULL && !json_is_null(v) &&
        (t == NULL || (strcmp(t, "auto") != 0 && strcmp(t, "default") != 0))) {
        ctl_openai_fail(req, WK_EINVAL, "service_tier",
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
            ctl_openai_fail(req, WK_EINVAL, "reasoning_effort",
                            "'reasoning_effort' must be \"none\", \"minimal\", \"low\", "
                            "\"medium\" or \"high\"");
            return false;
        }
        if (!wk_chat_tpl_knows(app->chat_tpl, "reasoning_effort")) {
            ctl_openai_fail(req, WK_EINVAL, "reasoning_effort",
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
 * names. Sends the error and returns false.
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
            ctl_openai_perr_set(pe, WK_EINVAL, param,
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
 * r->tools and r->tool_fmt are set. Sends the error and returns false.
 */
static bool
ctl_openai_tool_choice_forced(ctl_openai_perr *pe, ctl_app *app, ctl_openai_req *r,
                              const char *param, const char *name)
{
    wk_diag d = {{0}};
    r->tool_forced = true;
    if (name != NULL && (r->tool_force_name = strdup(name)) == NULL) {
        ctl_openai_perr_set(pe, WK_ENOMEM, param, "out of memory");
        return false;
    }
    wk_err err = ctl_toolgram_new(app->tok, r->tool_fmt, r->tools, name, !r->tool_serial, false,
                                  NULL, &r->toolgram, &d);
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
 * marker. Sends the error and returns false.
 */
static bool
ctl_openai_toolgram_reasoning(ctl_http_req *req, ctl_app *app, ctl_openai_req *r)
{
    if (!r->tool_forced || !r->think_open)
        return true;
    wk_diag d = {{0}};
    ctl_toolgram *t = NULL;
    wk_err err = ctl_toolgram_new(app->tok, r->tool_fmt, r->tools, r->tool_force_name,
                                  !r->tool_serial, true, WK_CHAT_TPL_THINK_CLOSE, &t, &d);
    if (err != WK_OK) {
        ctl_openai_fail(req, err, "tool_choice", "tool_choice cannot be enforced: %s", d.msg);
        return false;
    }
    ctl_toolgram_free(r->toolgram);
    r->toolgram = t;
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
 * finish_reason "function_call" (r->legacy_fn; docs/OPENAI_COMPAT.md). In
 * the history an assistant's `function_call` {"name", "arguments"} becomes
 * its `tool_calls` [{"id": "call_legacy_I", ...}] and a `role: "function"`
 * message {"name", "content"} a `role: "tool"` result answering the last
 * such call (tool_call_id), so the template renders it as a tool result.
 * Sends the error and returns false.
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
            ctl_openai_perr_set(pe, WK_EINVAL, "functions", "'functions' must be an array of objects");
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
            r->legacy_fn = true;
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
            continue; /* (refused by ctl_openai_parse_messages) */
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
 * For a model with its own chat template it is passed to the template, and unless tool_choice is "none" the reply is
 * parsed for calls in the template's format (wk_toolcall); a model without
 * one (the World template) answers in plain text, as OpenAI allows with
 * "auto". tool_choice "none" keeps the tools in the prompt and parses no
 * calls (vLLM's default). "required" or a named function needs constrained
 * decoding (ctl_openai_tool_choice_forced). The legacy `functions` /
 * `function_call` become tools first (ctl_openai_legacy_functions).
 * parallel_tool_calls false returns the first call only. Sends the error and
 * returns false.
 */
static bool
ctl_openai_parse_tools(ctl_openai_perr *pe, ctl_app *app, json_t *body, ctl_openai_req *r)
{
    if (r->chat && !ctl_openai_legacy_functions(pe, body, r))
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
    r->tool_serial = json_is_false(p);
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
        r->tools = json_incref(tools);
        r->tool_fmt = wk_chat_tpl_toolcall_fmt(app->chat_tpl);
        return ctl_openai_tool_choice_forced(pe, app, r, "tool_choice",
                                             named ? json_string_value(name) : NULL);
    }
    if (app->chat_tpl != NULL && n_tools > 0) {
        r->tools = json_incref(tools);
        r->tool_fmt = none ? WK_TOOLCALL_FMT_NONE : wk_chat_tpl_toolcall_fmt(app->chat_tpl);
    }
    return true;
}

/*
 * logit_bias: an object of token id (a decimal string) -> bias in
 * [-100, 100], at most CTL_SAMPLE_BIAS_MAX entries, ids in the tokenizer's
 * vocab; the worker adds each bias to its token's logit before greedy or
 * sampling. Sends the error and returns false on failure.
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
    wk_err err = wk_json_get_str(body, "model", !r->model_optional, app->model_id, 256, &model,
                                 &d);
    if (err != WK_OK) {
        ctl_openai_perr_set(pe, WK_EINVAL, "model", "%s", d.msg);
        return false;
    }
    if (app->model_id == NULL || model == NULL || strcmp(model, app->model_id) != 0) {
        ctl_openai_perr_set(pe, WK_ENOENT, "model", "The model '%s' does not exist", model);
        return false;
    }
    r->model = model;
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
    GETB("cache", r->cache, true);
    if (r->cache)
        GETB("cache_prompt", r->cache, true); /* (llama.cpp's name for the same switch) */
    GETB("stream", r->stream, false);
    GETB("ignore_eos", r->ignore_eos, false);
    GETB("return_token_ids", r->return_token_ids, false);
#undef GETB
    json_t *so = json_object_get(body, "stream_options");
    if (so != NULL && !json_is_null(so)) {
        if (!json_is_object(so) || wk_json_get_bool(so, "include_usage", false, &b, &d) != WK_OK) {
            ctl_openai_perr_set(pe, WK_EINVAL, "stream_options",
                                "stream_options.include_usage must be a boolean");
            return false;
        }
        r->include_usage = b;
    }
    double x = 0;
    ctl_sample_spec *sp = &r->gen.sample;
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
    int64_t def_max = r->chat ? (int64_t)app->default_max_tokens : 16;
    if (wk_json_get_i64(body, mk, false, def_max, 1, app->max_tokens_limit, &v, &d) != WK_OK) {
        ctl_openai_perr_set(pe, WK_EINVAL, mk, "%s", d.msg);
        return false;
    }
    r->gen.max_tokens = (uint32_t)v;
    /* Stop strings. */
    json_t *st = json_object_get(body, "stop");
    if (st != NULL && !json_is_null(st)) {
        if (json_is_string(st)) {
            r->gen.stops[r->gen.n_stops++] = json_string_value(st);
        } else if (json_is_array(st) && json_array_size(st) <= 4) {
            size_t i;
            json_t *e;
            json_array_foreach(st, i, e) {
                if (!json_is_string(e)) {
                    ctl_openai_perr_set(pe, WK_EINVAL, "stop", "'stop' entries must be strings");
                    return false;
                }
                r->gen.stops[r->gen.n_stops++] = json_string_value(e);
            }
        } else {
            ctl_openai_perr_set(pe, WK_EINVAL, "stop",
                                "'stop' must be a string or up to 4 strings");
            return false;
        }
        uint32_t max_stop = app->max_stop_bytes ? app->max_stop_bytes : CTL_OPENAI_MAX_STOP_LEN;
        for (size_t i = 0; i < r->gen.n_stops; i++) {
            json_t *sv = json_is_string(st) ? st : json_array_get(st, i);
            if (strlen(r->gen.stops[i]) != json_string_length(sv)) {
                ctl_openai_perr_set(pe, WK_EINVAL, "stop", "stop strings cannot contain NUL");
                return false;
            }
            if (strlen(r->gen.stops[i]) > max_stop) {
                ctl_openai_perr_set(pe, WK_EINVAL, "stop", "stop strings are limited to %u bytes",
                                    max_stop);
                return false;
            }
        }
    }
    r->gen.stop_on_eot = !r->ignore_eos;
    return ctl_openai_parse_logit_bias(pe, app, body, sp);
}

/* Parses the common sampling fields. Sends the error and returns false on failure. */
bool
ctl_openai_parse_common(ctl_http_req *req, ctl_app *app, json_t *body, ctl_openai_req *r)
{
    ctl_openai_perr pe = {WK_OK, "", ""};
    ctl_openai_owner(req, r->owner);
    if (ctl_openai_parse_common_value(app, body, r, &pe))
        return true;
    ctl_http_send_error(req, pe.err, pe.msg, pe.param[0] ? pe.param : NULL);
    return false;
}

/*
 * Reads the text of a message's content (string or text parts) into *out
 * (caller frees), *len bytes (NULs included) plus a terminating NUL.
 */
static bool
ctl_openai_content(ctl_http_req *req, json_t *content, size_t idx, char **out, size_t *len)
{
    *len = 0;
    char param[64];
    snprintf(param, sizeof(param), "messages[%zu].content", idx);
    if (content == NULL || json_is_null(content)) {
        *out = strdup("");
        return *out != NULL;
    }
    if (json_is_string(content)) {
        /* (a NUL is content: the chat renderer drops it, as for the model's own replies) */
        size_t n = json_string_length(content);
        *out = malloc(n + 1);
        if (*out == NULL)
            return false;
        memcpy(*out, json_string_value(content), n);
        (*out)[n] = '\0';
        *len = n;
        return true;
    }
    if (!json_is_array(content)) {
        ctl_openai_fail(req, WK_EINVAL, param, "content must be a string or an array of parts");
        return false;
    }
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(content, i, part) {
        json_t *type = json_object_get(part, "type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0) {
            ctl_openai_fail(req, WK_EINVAL, param, "only text content parts are supported (got %s)",
                            json_is_string(type) ? json_string_value(type) : "no type");
            return false;
        }
        json_t *t = json_object_get(part, "text");
        if (!json_is_string(t)) {
            ctl_openai_fail(req, WK_EINVAL, param, "a text part needs a string 'text'");
            return false;
        }
        total += json_string_length(t);
    }
    char *s = malloc(total + 1);
    if (s == NULL)
        return false;
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
 * template has no way to write them). Sends the error and returns false.
 */
static bool
ctl_openai_check_tool_msg(ctl_http_req *req, ctl_app *app, json_t *m, size_t i, const char *role)
{
    char param[96];
    json_t *tc = json_object_get(m, "tool_calls");
    bool has_calls = tc != NULL && !json_is_null(tc) &&
                     !(json_is_array(tc) && json_array_size(tc) == 0);
    bool tool_role = strcmp(role, "tool") == 0;
    if ((has_calls || tool_role) && app->chat_tpl == NULL) {
        snprintf(param, sizeof(param), has_calls ? "messages[%zu].tool_calls" : "messages[%zu].role",
                 i);
        ctl_openai_fail(req, WK_EINVAL, param,
                        "tool calls are not supported by this model: it has no chat template of "
                        "its own (the plain User:/Assistant: template cannot write them)");
        return false;
    }
    if (tool_role) {
        json_t *id = json_object_get(m, "tool_call_id");
        if (!json_is_string(id)) {
            snprintf(param, sizeof(param), "messages[%zu].tool_call_id", i);
            ctl_openai_fail(req, WK_EINVAL, param, "a tool message needs a string 'tool_call_id'");
            return false;
        }
    }
    if (!has_calls)
        return true;
    snprintf(param, sizeof(param), "messages[%zu].tool_calls", i);
    if (strcmp(role, "assistant") != 0 || !json_is_array(tc)) {
        ctl_openai_fail(req, WK_EINVAL, param,
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
            ctl_openai_fail(req, WK_EINVAL, param,
                            "a tool call must be {\"id\": string, \"type\": \"function\", "
                            "\"function\": {\"name\": string, \"arguments\": string}}");
            return false;
        }
    }
    return true;
}

/*
 * Checkpoint boundaries of a templated prompt: where a turn ends, after each
 * occurrence of the template's eos token text (<|im_end|>) in r->prompt_text,
 * and where the history ends before the generation prompt (r->hist_end), as
 * token positions (the last token boundary at or before it); the last
 * CTL_CKPT_MAX_BOUNDS of them. A follow-up re-renders the history (Qwen3
 * drops the reasoning and the generation prompt's <think>), so the turn ends
 * before it are what the next prompt shares: the index resumes there.
 */
void
ctl_openai_templated_bounds(ctl_app *app, ctl_openai_req *r)
{
    const char *eos = wk_chat_tpl_special(app->chat_tpl, "eos_token");
    size_t el = eos != NULL ? strlen(eos) : 0, acc = 0, next = 0;
    size_t hist = r->hist_end < r->prompt_len ? r->hist_end : 0;
    r->n_bounds = 0;
    const char *p = r->prompt_text, *end = r->prompt_text + r->prompt_len;
    /* next: the byte offset after the next eos occurrence (0: none left) */
    const char *hit = el > 0 ? memmem(p, r->prompt_len, eos, el) : NULL;
    next = hit != NULL ? (size_t)(hit - p) + el : 0;
    for (size_t i = 0; i <= r->n_prompt && (next != 0 || hist != 0); i++) {
        size_t pl = 0;
        if (i < r->n_prompt)
            (void)wk_tok_piece(app->tok, r->prompt[i], &pl);
        for (;;) {
            /* the nearest target: an eos end or the history's end */
            size_t target = next == 0 ? hist : hist == 0 ? next : next < hist ? next : hist;
            if (target == 0 || (i < r->n_prompt && acc + pl <= target))
                break;
            if (i > 0 && (r->n_bounds == 0 || r->bounds[r->n_bounds - 1] < i)) {
                if (r->n_bounds == CTL_CKPT_MAX_BOUNDS) { /* keep the last ones */
                    memmove(r->bounds, r->bounds + 1, (CTL_CKPT_MAX_BOUNDS - 1) * sizeof(size_t));
                    r->n_bounds--;
                }
                r->bounds[r->n_bounds++] = i;
            }
            if (hist == target)
                hist = 0;
            if (next == target) {
                hit = memmem(p + next, (size_t)(end - (p + next)), eos, el);
                next = hit != NULL ? (size_t)(hit - p) + el : 0;
            }
        }
        acc += pl;
    }
}

size_t
ctl_openai_hist_end(ctl_app *app, const json_t *msgs, const json_t *tools, const json_t *kwargs,
                    const char *prompt, size_t plen)
{
    char *h = NULL;
    size_t hl = 0;
    wk_diag d = {{0}};
    if (wk_chat_tpl_render_json(app->chat_tpl, msgs, tools, false, kwargs, NULL, &h, &hl, &d) !=
        WK_OK)
        return 0; /* (a template may refuse to end on a user turn: no boundary then) */
    size_t n = hl < plen && memcmp(h, prompt, hl) == 0 ? hl : 0;
    free(h);
    return n;
}

/* Renders messages 0..k-1 of r (add_generation_prompt false); WK_OK or the render's error. */
static wk_err
ctl_openai_tpl_render_upto(ctl_app *app, const ctl_openai_req *r, size_t k, char **out,
                           size_t *len)
{
    json_t *sub = json_array();
    if (sub == NULL)
        return WK_ENOMEM;
    for (size_t i = 0; i < k; i++)
        json_array_append(sub, json_array_get(r->tpl_msgs, i));
    wk_diag d = {{0}};
    wk_err err = wk_chat_tpl_render_json(app->chat_tpl, sub, r->tools, false, r->tpl_kw, NULL,
                                         out, len, &d);
    json_decref(sub);
    return err;
}

bool
ctl_openai_tpl_align(ctl_app *app, const ctl_openai_req *r, const int32_t *retained, size_t n,
                     size_t k, size_t *off)
{
    const char *eos = wk_chat_tpl_special(app->chat_tpl, "eos_token");
    size_t el = eos != NULL ? strlen(eos) : 0, na = r->tpl_msgs ? json_array_size(r->tpl_msgs) : 0;
    if (k == 0 || k + 1 >= na || el == 0)
        return false;
    /*
     * The history before the reply, rendered alone, must be where the prompt
     * starts (templates render a last message their own way, e.g. Qwen3.5's
     * reasoning in the last assistant turn, so the reply itself is not
     * rendered alone); the reply's turn then ends at the first eos text
     * after it, before the end of the next message's rendering when that
     * lines up too, and holds the reply's content.
     */
    char *b = NULL, *c = NULL;
    size_t bl = 0, cl = 0, lim = r->prompt_len;
    bool ok = false;
    if (ctl_openai_tpl_render_upto(app, r, k, &b, &bl) == WK_OK && bl <= r->prompt_len &&
        memcmp(b, r->prompt_text, bl) == 0) {
        if (ctl_openai_tpl_render_upto(app, r, k + 2, &c, &cl) == WK_OK && cl > bl &&
            cl <= r->prompt_len && memcmp(c, r->prompt_text, cl) == 0)
            lim = cl;
        const char *e = memmem(r->prompt_text + bl, lim - bl, eos, el);
        json_t *content = json_object_get(json_array_get(r->tpl_msgs, k), "content");
        const char *cs = json_is_string(content) ? json_string_value(content) : "";
        size_t cn = json_is_string(content) ? json_string_length(content) : 0;
        while (cn > 0 && (cs[0] == ' ' || cs[0] == '\n' || cs[0] == '\t' || cs[0] == '\r')) {
            cs++;
            cn--;
        }
        while (cn > 0 && (cs[cn - 1] == ' ' || cs[cn - 1] == '\n' || cs[cn - 1] == '\t' ||
                          cs[cn - 1] == '\r'))
            cn--;
        if (e != NULL &&
            (cn == 0 || memmem(r->prompt_text + bl, (size_t)(e - r->prompt_text) - bl, cs, cn))) {
            bool ate_eos = n > 0 && retained[n - 1] == wk_tok_eos(app->tok);
            *off = (size_t)(e - r->prompt_text) + (ate_eos ? el : 0);
            ok = true;
        }
    }
    free(b);
    free(c);
    return ok;
}

bool
ctl_openai_tpl_plain(const ctl_openai_req *r)
{
    size_t i;
    json_t *m;
    if (!r->templated || r->tpl_msgs == NULL)
        return false;
    json_array_foreach(r->tpl_msgs, i, m) {
        json_t *tc = json_object_get(m, "tool_calls");
        const char *role = json_string_value(json_object_get(m, "role"));
        if ((json_is_array(tc) && json_array_size(tc) > 0) ||
            (role != NULL && strcmp(role, "tool") == 0))
            return false;
    }
    return true;
}

/*
 * The chat prompt of a model with its own template (app->chat_tpl): the
 * request's messages as sent ("developer" read as "system", tool call
 * arguments as objects for templates that iterate them), its tools (r->tools)
 * and its chat_template_kwargs rendered with a generation prompt, then encoded whole (added tokens such
 * as <|im_start|> become their ids). No message spans, reply alignment or
 * checkpoint boundaries: the template decides where messages lie, so reuse
 * is the prefix index's longest checkpoint that is a prefix of the tokens.
 * The messages were validated by the caller.
 */
static bool
ctl_openai_parse_templated(ctl_http_req *req, ctl_app *app, json_t *body, ctl_openai_req *r)
{
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (kw != NULL && !json_is_null(kw) && !json_is_object(kw)) {
        ctl_openai_fail(req, WK_EINVAL, "chat_template_kwargs",
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
            ctl_openai_fail(req, WK_ENOMEM, NULL, "out of memory");
            return false;
        }
        kw = kw_own;
    }
    json_t *msgs = json_deep_copy(json_object_get(body, "messages"));
    wk_diag d = {{0}};
    size_t bad_msg = 0, bad_call = 0;
    wk_err pe = msgs != NULL ? wk_chat_tpl_prepare(app->chat_tpl, msgs, &bad_msg, &bad_call, &d)
                             : WK_OK;
    if (pe != WK_OK) {
        char param[96];
        snprintf(param, sizeof(param), "messages[%zu].tool_calls[%zu].function.arguments",
                 bad_msg, bad_call);
        ctl_openai_fail(req, pe, pe == WK_EINVAL ? param : NULL, "%s", d.msg);
        json_decref(msgs);
        json_decref(kw_own);
        return false;
    }
    char *prompt = NULL;
    size_t plen = 0;
    wk_err err = msgs == NULL ? WK_ENOMEM
                              : wk_chat_tpl_render_json(app->chat_tpl, msgs, r->tools, true,
                                                        json_is_object(kw) ? kw : NULL, NULL,
                                                        &prompt, &plen, &d);
    if (err == WK_OK)
        r->hist_end = ctl_openai_hist_end(app, msgs, r->tools, json_is_object(kw) ? kw : NULL,
                                          prompt, plen);
    /* (kept for parent-token-v1's alignment, ctl_openai_tpl_align) */
    r->tpl_msgs = msgs;
    r->tpl_kw = json_is_object(kw) ? json_incref(kw) : NULL;
    json_decref(kw_own);
    if (err != WK_OK) {
        bool kw_bad = strncmp(d.msg, "chat_template_kwargs", 20) == 0;
        ctl_openai_fail(req, err == WK_ENOMEM ? WK_ENOMEM : WK_EINVAL,
                        err == WK_ENOMEM ? NULL
                        : kw_bad         ? "chat_template_kwargs"
                                         : "messages",
                        "chat template: %s", err == WK_ENOMEM ? "out of memory" : d.msg);
        free(prompt);
        return false;
    }
    r->prompt_text = prompt;
    r->prompt_len = plen;
    r->templated = true;
    if (plen > CTL_OPENAI_MAX_TEXT) {
        ctl_openai_fail(req, WK_ETOOBIG, "messages", "the prompt is longer than %u bytes",
                        CTL_OPENAI_MAX_TEXT);
        return false;
    }
    if (wk_chat_tpl_thinks(app->chat_tpl)) {
        r->think = true;
        r->think_open = wk_chat_think_open_at_end(prompt, plen, WK_CHAT_TPL_THINK_OPEN,
                                                  WK_CHAT_TPL_THINK_CLOSE);
    }
    if (!ctl_openai_toolgram_reasoning(req, app, r))
        return false;
    if (wk_tok_encode(app->tok, prompt, plen, &r->prompt, &r->n_prompt, &d) != WK_OK) {
        ctl_openai_fail(req, WK_EINVAL, "messages", "%s", d.msg);
        return false;
    }
    r->aligned_tokens = 0;
    ctl_openai_templated_bounds(app, r);
    return true;
}

/* Renders and tokenizes the chat messages into r->prompt. */
bool
ctl_openai_parse_messages(ctl_http_req *req, ctl_app *app, json_t *body, ctl_openai_req *r)
{
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        ctl_openai_fail(req, WK_EINVAL, "messages", "'messages' must be a non-empty array");
        return false;
    }
    size_t n = json_array_size(msgs);
    uint32_t max_msgs = app->max_messages ? app->max_messages : CTL_OPENAI_MAX_MESSAGES;
    if (n > max_msgs) {
        ctl_openai_fail(req, WK_ETOOBIG, "messages", "at most %u messages", max_msgs);
        return false;
    }
    wk_chat_msg *cm = calloc(n, sizeof(*cm));
    char **texts = calloc(n, sizeof(*texts));
    bool ok = cm != NULL && texts != NULL;
    /* The messages stay with the request (sessions validate against them). */
    r->msgs = cm;
    r->msg_texts = texts;
    r->n_msgs = texts != NULL ? n : 0;
    for (size_t i = 0; ok && i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        json_t *role = json_object_get(m, "role");
        char param[48];
        snprintf(param, sizeof(param), "messages[%zu].role", i);
        if (!json_is_string(role) || strlen(json_string_value(role)) != json_string_length(role)) {
            ctl_openai_fail(req, WK_EINVAL, param, "each message needs a string 'role'");
            ok = false;
            break;
        }
        const char *rs = json_string_value(role);
        if (strcmp(rs, "developer") == 0)
            rs = "system";
        bool tool_role = strcmp(rs, "tool") == 0;
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && !tool_role) {
            ctl_openai_fail(req, WK_EINVAL, param, "role '%s' is not supported (%s)",
                            json_string_value(role),
                            app->chat_tpl != NULL ? "system, developer, user, assistant, tool"
                                                  : "system, developer, user, assistant");
            ok = false;
            break;
        }
        if (!ctl_openai_check_tool_msg(req, app, m, i, rs)) {
            ok = false;
            break;
        }
        size_t clen = 0;
        ok = ctl_openai_content(req, json_object_get(m, "content"), i, &texts[i], &clen);
        if (ok && app->max_message_bytes && clen > app->max_message_bytes) {
            snprintf(param, sizeof(param), "messages[%zu].content", i);
            ctl_openai_fail(req, WK_ETOOBIG, param, "a message's content is limited to %llu bytes",
                            (unsigned long long)app->max_message_bytes);
            ok = false;
        }
        cm[i].role = rs;
        cm[i].content = texts[i];
        cm[i].content_len = clen;
    }
    if (ok && app->chat_tpl != NULL)
        return ctl_openai_parse_templated(req, app, body, r);
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (ok && kw != NULL && !json_is_null(kw)) { /* (honoured or refused, never ignored) */
        ctl_openai_fail(req, WK_EINVAL, "chat_template_kwargs",
                        "'chat_template_kwargs' needs a model with its own chat template "
                        "(this one uses the plain User:/Assistant: template)");
        ok = false;
    }
    char *prompt = NULL;
    size_t plen = 0;
    wk_diag d = {{0}};
    wk_chat_span *sp = ok ? calloc(n ? n : 1, sizeof(*sp)) : NULL;
    if (ok && sp == NULL) {
        ctl_openai_fail(req, WK_ENOMEM, NULL, "out of memory");
        ok = false;
    }
    if (ok && wk_chat_render_spans(cm, n, true, &prompt, &plen, sp, &d) != WK_OK) {
        ctl_openai_fail(req, WK_EINVAL, "messages", "%s", d.msg);
        ok = false;
    }
    if (ok && plen > CTL_OPENAI_MAX_TEXT) {
        ctl_openai_fail(req, WK_ETOOBIG, "messages", "the prompt is longer than %u bytes",
                        CTL_OPENAI_MAX_TEXT);
        ok = false;
    }
    r->prompt_text = prompt;
    r->prompt_len = plen;
    if (ok && ctl_openai_chat_tokens(app, r, sp, &d) != WK_OK) {
        ctl_openai_fail(req, WK_EINVAL, "messages", "%s", d.msg);
        ok = false;
    }
    free(sp);
    return ok;
}

bool
ctl_openai_parse_prompt(ctl_http_req *req, ctl_app *app, json_t *body, ctl_openai_req *r)
{
    json_t *p = json_object_get(body, "prompt");
    wk_diag d = {{0}};
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0); /* (a batch of one) */
    if (json_is_string(p)) {
        if (json_string_length(p) > CTL_OPENAI_MAX_TEXT) {
            ctl_openai_fail(req, WK_ETOOBIG, "prompt", "the prompt is longer than %u bytes",
                            CTL_OPENAI_MAX_TEXT);
            return false;
        }
        if (wk_tok_encode(app->tok, json_string_value(p), json_string_length(p), &r->prompt,
                          &r->n_prompt, &d) != WK_OK) {
            ctl_openai_fail(req, WK_EINVAL, "prompt", "%s", d.msg);
            return false;
        }
    } else if (json_is_array(p) && json_array_size(p) > 0 &&
               (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)))) {
        /* A batch ([string, ...] or [[ids], ...]): one request per prompt instead. */
        ctl_openai_fail(req, WK_EINVAL, "prompt",
                        "a batch of %zu prompts is not supported: send one request per prompt "
                        "('prompt' is a string, one-string array or array of token ids)",
                        json_array_size(p));
        return false;
    } else if (json_is_array(p) && json_array_size(p) > 0) {
        size_t n = json_array_size(p);
        uint32_t vocab = wk_tok_vocab_size(app->tok);
        if (n > app->max_prompt_tokens) {
            ctl_openai_fail(req, WK_ETOOBIG, "prompt", "at most %u prompt tokens",
                            app->max_prompt_tokens);
            return false;
        }
        r->prompt = malloc(n * sizeof(*r->prompt));
        if (r->prompt == NULL)
            return false;
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(p, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) >= (json_int_t)vocab) {
                ctl_openai_fail(req, WK_EINVAL, "prompt",
                                "prompt[%zu] is not a token id in [0, %u)", i, vocab);
                return false;
            }
            r->prompt[i] = (int32_t)json_integer_value(e);
        }
        r->n_prompt = n;
    } else {
        ctl_openai_fail(req, WK_EINVAL, "prompt",
                        "'prompt' must be a non-empty string or a non-empty array of token ids");
        return false;
    }
    if (r->n_prompt == 0) {
        ctl_openai_fail(req, WK_EINVAL, "prompt", "the prompt encodes to no tokens");
        return false;
    }
    int64_t best_of = 1;
    if (wk_json_get_i64(body, "best_of", false, 1, 1, 128, &best_of, &d) != WK_OK ||
        best_of != 1) {
        ctl_openai_fail(req, WK_EINVAL, "best_of", "only best_of=1 is supported");
        return false;
    }
    json_t *echo = json_object_get(body, "echo");
    if (json_is_true(echo)) {
        ctl_openai_fail(req, WK_EINVAL, "echo", "'echo' is not supported");
        return false;
    }
    json_t *suffix = json_object_get(body, "suffix");
    if (suffix != NULL && !json_is_null(suffix)) {
        ctl_openai_fail(req, WK_EINVAL, "suffix", "'suffix' is not supported");
        return false;
    }
    /* Legacy logprobs: an integer count of alternatives. */
    int64_t lp = 0;
    if (wk_json_get_i64(body, "logprobs", false, 0, 0, 20, &lp, &d) != WK_OK) {
        ctl_openai_fail(req, WK_EINVAL, "logprobs", "%s", d.msg);
        return false;
    }
    if (json_object_get(body, "logprobs") != NULL && !json_is_null(json_object_get(body, "logprobs"))) {
        r->logprobs = true;
        r->top_logprobs = (uint32_t)lp;
    }
    return true;
}

/* Parses the chat-only logprobs fields. */
static bool
ctl_openai_parse_chat_logprobs(ctl_http_req *req, json_t *body, ctl_openai_req *r)
{
    wk_diag d = {{0}};
    bool b = false;
    int64_t v = 0;
    if (wk_json_get_bool(body, "logprobs", false, &b, &d) != WK_OK) {
        ctl_openai_fail(req, WK_EINVAL, "logprobs", "%s", d.msg);
        return false;
    }
    if (wk_json_get_i64(body, "top_logprobs", false, 0, 0, 20, &v, &d) != WK_OK) {
        ctl_openai_fail(req, WK_EINVAL, "top_logprobs", "%s", d.msg);
        return false;
    }
    if (v > 0 && !b) {
        ctl_openai_fail(req, WK_EINVAL, "top_logprobs", "top_logprobs needs logprobs: true");
        return false;
    }
    r->logprobs = b;
    r->top_logprobs = (uint32_t)v;
    return true;
}

static json_t *
ctl_openai_bytes_json(const uint8_t *p, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(p[i]));
    return a;
}

/* Text of a single token for logprobs: its bytes, invalid UTF-8 replaced. */
static json_t *
ctl_openai_piece_json(const wk_tok *tok, int32_t id)
{
    size_t n = 0;
    const uint8_t *p = wk_tok_piece(tok, id, &n);
    if (p == NULL || n == 0)
        return json_string("");
    wk_tok_stream s;
    wk_tok_stream_init(&s, NULL);
    char *out = malloc(3 * (n + 3) + WK_TOK_STREAM_FLUSH_MAX);
    if (out == NULL)
        return json_string("");
    size_t len = 0;
    if (wk_tok_stream_push_bytes(&s, p, n, out, 3 * (n + 3), &len) != WK_OK)
        len = 0;
    len += wk_tok_stream_flush(&s, out + len);
    json_t *j = json_stringn(out, len);
    free(out);
    return j ? j : json_string("");
}

/* The chat "logprobs.content" entries for toks. */
static json_t *
ctl_openai_logprobs_json(ctl_app *app, const ctl_gen_token *toks, size_t n, uint32_t top)
{
    json_t *content = json_array();
    for (size_t i = 0; i < n; i++) {
        size_t bl = 0;
        const uint8_t *bp = wk_tok_piece(app->tok, toks[i].id, &bl);
        json_t *tops = json_array();
        for (uint32_t k = 0; k < toks[i].n_top && k < top; k++) {
            size_t tl = 0;
            const uint8_t *tp = wk_tok_piece(app->tok, toks[i].top_id[k], &tl);
            json_array_append_new(tops,
                                  json_pack("{s:o, s:f, s:o}", "token",
                                            ctl_openai_piece_json(app->tok, toks[i].top_id[k]),
                                            "logprob", (double)toks[i].top_logprob[k], "bytes",
                                            ctl_openai_bytes_json(tp, tp ? tl : 0)));
        }
        json_array_append_new(content, json_pack("{s:o, s:f, s:o, s:o}", "token",
                                                 ctl_openai_piece_json(app->tok, toks[i].id),
                                                 "logprob", (double)toks[i].logprob, "bytes",
                                                 ctl_openai_bytes_json(bp, bp ? bl : 0),
                                                 "top_logprobs", tops));
    }
    return content;
}

/* Unicode code points in a UTF-8 string (its length in Python's str, as OpenAI counts). */
static size_t
ctl_openai_utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xc0) != 0x80;
    return c;
}

/*
 * The completions (legacy) logprobs object for toks: tokens, token_logprobs,
 * top_logprobs (per token an object of token text -> logprob holding the
 * top alternatives and the chosen token: up to top + 1 entries) and
 * text_offset (characters before each token in the returned text, from
 * *offset, which is advanced: a stream continues it across chunks).
 */
static json_t *
ctl_openai_completion_logprobs_json(ctl_app *app, const ctl_gen_token *toks, size_t n,
                                    uint32_t top, size_t *offset)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array();
    json_t *offs = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *t = ctl_openai_piece_json(app->tok, toks[i].id);
        json_array_append_new(offs, json_integer((json_int_t)*offset));
        *offset += ctl_openai_utf8_chars(json_string_value(t), json_string_length(t));
        json_t *alt = json_object();
        for (uint32_t k = 0; k < toks[i].n_top && k < top; k++) {
            json_t *at = ctl_openai_piece_json(app->tok, toks[i].top_id[k]);
            /* (two tokens of the same text: the first, more likely one is kept) */
            if (json_object_get(alt, json_string_value(at)) == NULL)
                json_object_set_new(alt, json_string_value(at),
                                    json_real((double)toks[i].top_logprob[k]));
            json_decref(at);
        }
        if (json_object_get(alt, json_string_value(t)) == NULL)
            json_object_set_new(alt, json_string_value(t), json_real((double)toks[i].logprob));
        json_array_append_new(tops, alt);
        json_array_append_new(lps, json_real((double)toks[i].logprob));
        json_array_append_new(tokens, t);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

static json_t *
ctl_openai_usage_json(const ctl_openai_req *r, const ctl_gen_result *res)
{
    size_t np = r->n_prompt_report ? r->n_prompt_report : r->n_prompt;
    size_t cached = np > res->computed ? np - res->computed : 0;
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)np,
                     "completion_tokens", (json_int_t)res->n_tokens, "total_tokens",
                     (json_int_t)(np + res->n_tokens), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)cached);
}

/*
 * The reply's tool-call parse (r->tool_fmt; docs/OPENAI_COMPAT.md): one per
 * answer, fed the content after the reasoning split, blocking or streamed
 * alike, so a stream reassembles to the blocking message.
 */
typedef struct ctl_openai_tc {
    wk_toolcall_parser *p;   /* NULL: the reply is content only */
    const ctl_openai_req *r; /* the request (its id names the calls) */
    size_t n_calls;          /* calls returned so far: the next one's index */
} ctl_openai_tc;

/* Starts tc for r: a parser when r asks for calls. WK_OK or WK_ENOMEM. */
static wk_err
ctl_openai_tc_init(ctl_openai_tc *tc, const ctl_openai_req *r)
{
    *tc = (ctl_openai_tc){.r = r};
    if (!r->chat || r->tool_fmt == WK_TOOLCALL_FMT_NONE)
        return WK_OK;
    return wk_toolcall_parser_new(r->tool_fmt, r->tools, &tc->p);
}

/*
 * Feeds content (len bytes) to tc: *out is the content that stays (caller
 * frees), *n_out its bytes, and the calls it completed are appended to calls
 * as OpenAI's message tool_calls ({"id": "call_...", "type": "function",
 * "function": {"name", "arguments"}}); with parallel_tool_calls false only
 * the reply's first call is kept. Returns WK_OK or WK_ENOMEM.
 */
static wk_err
ctl_openai_tc_feed(ctl_openai_tc *tc, const char *text, size_t len, bool final, json_t *calls,
                   char **out, size_t *n_out)
{
    wk_toolcall_out o;
    wk_err err = wk_toolcall_feed(tc->p, text, len, final, &o);
    if (err != WK_OK)
        return err;
    const char *hex = strchr(tc->r->id, '-');
    for (size_t i = 0; i < o.n_calls; i++) {
        if (tc->r->tool_serial && tc->n_calls > 0)
            break;
        char id[48];
        snprintf(id, sizeof(id), "call_%.16s%08zx", hex != NULL ? hex + 1 : "", tc->n_calls++);
        json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type",
                                               "function", "function", "name", o.calls[i].name,
                                               "arguments", o.calls[i].arguments));
    }
    *out = o.content;
    *n_out = o.content_len;
    o.content = NULL;
    wk_toolcall_out_fini(&o);
    return WK_OK;
}

wk_err
ctl_openai_tpl_visible(const ctl_openai_req *r, const char *text, size_t len, char **out,
                       size_t *out_len, size_t *n_calls)
{
    *out = NULL;
    *out_len = 0;
    *n_calls = 0;
    char *rs = NULL, *cs = NULL;
    size_t rl = 0, cl = len;
    if (r->think) {
        wk_chat_think th;
        wk_chat_think_init(&th, WK_CHAT_TPL_THINK_OPEN, WK_CHAT_TPL_THINK_CLOSE, r->think_open);
        if (wk_chat_think_feed(&th, text, len, true, &rs, &rl, &cs, &cl) != WK_OK)
            return WK_ENOMEM;
        free(rs);
    } else {
        if ((cs = malloc(len + 1)) == NULL)
            return WK_ENOMEM;
        memcpy(cs, text, len);
        cs[len] = '\0';
    }
    if (r->tool_fmt == WK_TOOLCALL_FMT_NONE) {
        *out = cs;
        *out_len = cl;
        return WK_OK;
    }
    wk_toolcall_parser *p = NULL;
    wk_toolcall_out o;
    wk_err err = wk_toolcall_parser_new(r->tool_fmt, r->tools, &p);
    if (err == WK_OK)
        err = wk_toolcall_feed(p, cs, cl, true, &o);
    wk_toolcall_parser_free(p);
    free(cs);
    if (err != WK_OK)
        return err;
    *n_calls = o.n_calls;
    *out = o.content;
    *out_len = o.content_len;
    o.content = NULL;
    wk_toolcall_out_fini(&o);
    return WK_OK;
}

/* Streaming state for the sink. */
typedef struct ctl_openai_stream {
    ctl_http_req *req;      /* the HTTP request */
    ctl_app *app;           /* app */
    ctl_openai_req *r;      /* parsed request */
    bool broken;            /* the client went away */
    size_t text_off;        /* completions logprobs: characters of token text sent so far */
    wk_chat_think think;    /* r->think: the reasoning split of the text streamed so far */
    ctl_openai_tc tc;       /* the tool-call parse of the content streamed so far */
    ctl_ssefmt fmt;         /* the token chunk's template (ctl_openai_stream_fast) */
    int fast;               /* 0: not tried yet, 1: fmt is set, -1: jansson for every chunk */
} ctl_openai_stream;

/*
 * The chat delta or message body of text (len bytes) split by the think
 * splitter t (r->think; NULL: all content) and then by the tool-call parse
 * tc (NULL or without a parser: no calls): {"content": ...} plus
 * "reasoning_content" when the text had any, the extra members of base
 * (role) first; the calls completed are appended to calls (NULL when tc
 * has no parser). final settles bytes held for a possible marker. Returns
 * NULL when out of memory.
 */
static json_t *
ctl_openai_think_json(wk_chat_think *t, ctl_openai_tc *tc, json_t *calls, json_t *base,
                      const char *text, size_t len, bool final)
{
    json_t *o = base != NULL ? base : json_object();
    if (o == NULL)
        return NULL;
    char *rs = NULL, *cs = NULL;
    size_t rl = 0, cl = 0;
    if (t != NULL && wk_chat_think_feed(t, text, len, final, &rs, &rl, &cs, &cl) != WK_OK) {
        json_decref(o);
        return NULL;
    }
    const char *c = t != NULL ? cs : text;
    size_t n = t != NULL ? cl : len;
    char *tcs = NULL;
    if (tc != NULL && tc->p != NULL) {
        if (ctl_openai_tc_feed(tc, c, n, final, calls, &tcs, &n) != WK_OK) {
            free(rs);
            free(cs);
            json_decref(o);
            return NULL;
        }
        c = tcs;
    }
    json_object_set_new(o, "content", json_stringn(c, n));
    if (rl > 0)
        json_object_set_new(o, "reasoning_content", json_stringn(rs, rl));
    free(rs);
    free(cs);
    free(tcs);
    return o;
}

static json_t *
ctl_openai_chunk_base(const ctl_openai_req *r)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "id", r->id, "object",
                     r->chat ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)r->created, "model", r->model);
}

static wk_err
ctl_openai_send_chunk(ctl_openai_stream *st, json_t *chunk)
{
    char *s = wk_json_dump_compact(chunk);
    json_decref(chunk);
    if (s == NULL)
        return WK_ENOMEM;
    wk_err err = ctl_http_sse_data(st->req, s);
    free(s);
    if (err != WK_OK)
        st->broken = true;
    return err;
}

/*
 * Sends a chat chunk, then the calls the same text completed as OpenAI
 * streams them: per call a delta with its index, id, type, name and empty
 * arguments, then one with its arguments (r->legacy_fn: delta.function_call
 * with the name, then with the arguments). With a tool parse, a chunk whose
 * delta is empty (the bytes went into a call or are held) and that carries
 * no logprobs or token ids is not sent. Consumes chunk and calls (NULL: none).
 */
static wk_err
ctl_openai_send_delta(ctl_openai_stream *st, json_t *chunk, json_t *calls)
{
    ctl_openai_req *r = st->r;
    wk_err err = WK_OK;
    json_t *choice = json_array_get(json_object_get(chunk, "choices"), 0);
    json_t *delta = json_object_get(choice, "delta");
    bool empty = calls != NULL && delta != NULL && json_string_length(json_object_get(delta, "content")) == 0 &&
                 json_object_get(delta, "reasoning_content") == NULL &&
                 json_object_get(choice, "token_ids") == NULL && !r->logprobs;
    if (empty)
        json_decref(chunk);
    else
        err = ctl_openai_send_chunk(st, chunk);
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        if (err != WK_OK)
            break;
        size_t index = st->tc.n_calls - json_array_size(calls) + i;
        json_t *fn = json_object_get(call, "function");
        if (r->legacy_fn) { /* delta.function_call: the name, then the arguments */
            json_t *c1 = ctl_openai_chunk_base(r);
            json_object_set_new(c1, "choices",
                                json_pack("[{s:i, s:{s:{s:O, s:s}}, s:n, s:n}]", "index", 0,
                                          "delta", "function_call", "name",
                                          json_object_get(fn, "name"), "arguments", "",
                                          "logprobs", "finish_reason"));
            err = ctl_openai_send_chunk(st, c1);
            json_t *c2 = ctl_openai_chunk_base(r);
            json_object_set_new(c2, "choices",
                                json_pack("[{s:i, s:{s:{s:O}}, s:n, s:n}]", "index", 0, "delta",
                                          "function_call", "arguments",
                                          json_object_get(fn, "arguments"), "logprobs",
                                          "finish_reason"));
            if (err == WK_OK)
                err = ctl_openai_send_chunk(st, c2);
            else
                json_decref(c2);
            continue;
        }
        json_t *c1 = ctl_openai_chunk_base(r);
        json_object_set_new(
            c1, "choices",
            json_pack("[{s:i, s:{s:[{s:I, s:O, s:s, s:{s:O, s:s}}]}, s:n, s:n}]", "index", 0,
                      "delta", "tool_calls", "index", (json_int_t)index, "id",
                      json_object_get(call, "id"), "type", "function", "function", "name",
                      json_object_get(fn, "name"), "arguments", "", "logprobs", "finish_reason"));
        err = ctl_openai_send_chunk(st, c1);
        if (err != WK_OK)
            break;
        json_t *c2 = ctl_openai_chunk_base(r);
        json_object_set_new(c2, "choices",
                            json_pack("[{s:i, s:{s:[{s:I, s:{s:O}}]}, s:n, s:n}]", "index", 0,
                                      "delta", "tool_calls", "index", (json_int_t)index,
                                      "function", "arguments", json_object_get(fn, "arguments"),
                                      "logprobs", "finish_reason"));
        err = ctl_openai_send_chunk(st, c2);
    }
    json_decref(calls);
    return err;
}

/*
 * A token's chunk as a JSON tree: the text's choice (chat: the delta of
 * the think and tool-call splits), with logprobs and token ids when asked;
 * *calls gets the calls the text completed (NULL without a tool parse).
 */
static json_t *
ctl_openai_token_chunk(ctl_openai_stream *st, const char *text, size_t len,
                       const ctl_gen_token *toks, size_t n_toks, json_t **calls)
{
    ctl_openai_req *r = st->r;
    json_t *chunk = ctl_openai_chunk_base(r);
    json_t *choice = json_pack("{s:i, s:n}", "index", 0, "finish_reason");
    json_t *lp = !r->logprobs ? json_null()
                 : r->chat ? json_pack("{s:o}", "content",
                                       ctl_openai_logprobs_json(st->app, toks, n_toks,
                                                                r->top_logprobs))
                           : ctl_openai_completion_logprobs_json(st->app, toks, n_toks,
                                                                 r->top_logprobs, &st->text_off);
    json_object_set_new(choice, "logprobs", lp);
    *calls = st->tc.p != NULL ? json_array() : NULL;
    if (r->chat)
        json_object_set_new(choice, "delta",
                            ctl_openai_think_json(r->think ? &st->think : NULL, &st->tc, *calls,
                                                  NULL, text, len, false));
    else
        json_object_set_new(choice, "text", json_stringn(text, len));
    if (r->return_token_ids) { /* (extension: the ids this chunk's text came from) */
        json_t *ids = json_array();
        for (size_t i = 0; i < n_toks; i++)
            json_array_append_new(ids, json_integer(toks[i].id));
        json_object_set_new(choice, "token_ids", ids);
    }
    json_object_set_new(chunk, "choices", json_pack("[o]", choice));
    return chunk;
}

/*
 * Whether a token's chunk is the same but for its text (ctl_ssefmt): no
 * logprobs, no token ids, no think or tool-call split; then st->fmt takes
 * its template from the chunk of an empty text, once.
 */
static bool
ctl_openai_stream_fast(ctl_openai_stream *st)
{
    const ctl_openai_req *r = st->r;
    if (st->fast == 0) {
        st->fast = -1;
        if (!r->logprobs && !r->return_token_ids && st->tc.p == NULL && !(r->chat && r->think)) {
            json_t *calls = NULL;
            json_t *chunk = ctl_openai_token_chunk(st, "", 0, NULL, 0, &calls);
            char *dump = chunk != NULL ? wk_json_dump_compact(chunk) : NULL;
            json_decref(chunk);
            json_decref(calls);
            if (dump != NULL && ctl_ssefmt_init(&st->fmt, dump))
                st->fast = 1;
            free(dump);
        }
    }
    return st->fast == 1;
}

static wk_err
ctl_openai_stream_sink(void *arg, const char *text, size_t len, const ctl_gen_token *toks,
                       size_t n_toks)
{
    ctl_openai_stream *st = arg;
    ctl_openai_req *r = st->r;
    if (len == 0 && !(r->logprobs && n_toks > 0) && !(r->return_token_ids && n_toks > 0))
        return WK_OK;
    if (ctl_openai_stream_fast(st)) {
        const char *s = NULL;
        wk_err err = ctl_ssefmt_chunk(&st->fmt, text, len, &s);
        if (err == WK_OK) {
            err = ctl_http_sse_data(st->req, s);
            if (err != WK_OK)
                st->broken = true;
            return err;
        }
        if (err != WK_EINVAL)
            return err;
        /* (not UTF-8: as jansson has it) */
    }
    json_t *calls = NULL;
    json_t *chunk = ctl_openai_token_chunk(st, text, len, toks, n_toks, &calls);
    return ctl_openai_send_delta(st, chunk, calls);
}

/* ctl_gen's flush: writes the chunks of one wake-up. */
static wk_err
ctl_openai_stream_flush(void *arg)
{
    ctl_openai_stream *st = arg;
    wk_err err = ctl_http_flush(st->req);
    if (err != WK_OK)
        st->broken = true;
    return err;
}

/* The request's route label: the HTTP route it came by ("/v1/chat/completions"). */
static const char *
ctl_openai_route(const ctl_openai_req *r)
{
    if (r->route != NULL)
        return r->route;
    return r->chat ? "/v1/chat/completions" : "/v1/completions";
}

static void
ctl_openai_count(ctl_app *app, const char *route, const char *status)
{
    char lb[128];
    snprintf(lb, sizeof(lb), "route=\"%s\",status=\"%s\"", route, status);
    ctl_metrics_add(app->metrics, "wkvm_requests_total", lb, 1);
}

/*
 * Plans the request's checkpoints and the lookup (ctl_ckpt): the job resumes
 * the longest checkpoint of the owner that prefixes its prompt, leaves new
 * ones, and keeps its slot so that the end-of-reply checkpoint can be taken.
 */
void
ctl_openai_reuse_begin(ctl_app *app, ctl_openai_req *r, ctl_ckpt_plan *plan, bool *free_slot)
{
    *free_slot = false;
    r->plan = NULL;
    ctl_worker_view v;
    if (!r->reuse || !r->cache || app->ckpt == NULL || r->n_prompt == 0 ||
        ctl_pool_model_view(app->pool, &v) != WK_OK)
        return;
    bool held = r->gen.slot != NULL;
    if (held && r->plan_prefix == NULL)
        return; /* (a held slot of unknown content: nothing to key checkpoints by) */
    wk_diag d = {{0}};
    if (ctl_ckpt_plan_begin(app->ckpt, plan, r->owner, v.fingerprint, r->plan_prefix,
                            held ? r->n_plan_prefix : 0, r->prompt, r->n_prompt, r->bounds,
                            r->n_bounds, !held, &d) != WK_OK || plan->c == NULL) {
        ctl_ckpt_plan_end(plan);
        return;
    }
    r->plan = plan;
    r->gen.reuse = &plan->reuse;
    r->gen.worker = plan->worker[0] ? plan->worker : NULL;
    if (!r->gen.keep_slot) {
        r->gen.keep_slot = true;
        *free_slot = true;
    }
    if (r->chat)
        r->gen.feed_stop = true; /* the reply's state holds every token the client sees */
}

/*
 * After a generation: counts the reuse and leaves the end-of-reply
 * checkpoint (a chat's with its reply record), then frees the slot when
 * only the checkpoint wanted it.
 */
void
ctl_openai_reuse_done(ctl_app *app, ctl_openai_req *r, const ctl_gen_result *res, bool free_slot)
{
    ctl_ckpt_plan *p = r->plan;
    if (p == NULL)
        return;
    if (p->loaded) {
        r->reused = true;
        r->reused_tokens = p->hit_len;
        r->reuse_kind = p->hit_len + 1 == p->n_all ? CTL_CKPT_HIT_REGENERATE
                        : r->aligned_tokens > 0 && p->hit_len >= r->aligned_tokens
                            ? CTL_CKPT_HIT_CHECKPOINT
                            : CTL_CKPT_HIT_PREFIX;
        ctl_ckpt_count_hit(app->ckpt, r->reuse_kind, p->hit_len);
    }
    size_t n_gen = res->fed > r->n_prompt ? res->fed - r->n_prompt : 0;
    if (n_gen > res->n_tokens)
        n_gen = res->n_tokens;
    int32_t *gen = malloc((n_gen ? n_gen : 1) * sizeof(*gen));
    char key[WK_SHA256_HEX_LEN] = "";
    if (gen != NULL) {
        for (size_t i = 0; i < n_gen; i++)
            gen[i] = res->tokens[i].id;
        if (r->chat && r->msgs != NULL && !r->templated) {
            /* The reply record: the history as the client will send it back. */
            wk_chat_msg *hm = malloc((r->n_msgs + 1) * sizeof(*hm));
            char *text = NULL;
            size_t tl = 0;
            if (hm != NULL) {
                memcpy(hm, r->msgs, r->n_msgs * sizeof(*hm));
                hm[r->n_msgs] = (wk_chat_msg){.role = "assistant", .content = res->text,
                                              .content_len = res->text_len};
                if (res->text_len == 0)
                    hm[r->n_msgs].content = "";
                if (wk_chat_render(hm, r->n_msgs + 1, false, &text, &tl, NULL) == WK_OK)
                    ctl_ckpt_reply_key(p->fp, p->owner, text, tl, key);
            }
            free(text);
            free(hm);
        }
        ctl_ckpt_plan_reply(p, &res->slot, gen, n_gen, key[0] ? key : NULL);
    }
    free(gen);
    if (free_slot)
        (void)ctl_sched_slot_free(app->sched, &res->slot);
}

/*
 * Extension (with return_token_ids): every token the request's state holds
 * before its reply, a continued session's retained tokens included.
 */
static json_t *
ctl_openai_prompt_ids_json(const ctl_openai_req *r)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < r->n_plan_prefix && r->plan_prefix != NULL; i++)
        json_array_append_new(a, json_integer(r->plan_prefix[i]));
    for (size_t i = 0; a != NULL && i < r->n_prompt; i++)
        json_array_append_new(a, json_integer(r->prompt[i]));
    return a;
}

static void ctl_openai_generate_run(ctl_http_req *req, ctl_app *app, ctl_openai_req *r,
                                    bool free_slot);

void
ctl_openai_generate(ctl_http_req *req, ctl_app *app, ctl_openai_req *r)
{
    ctl_ckpt_plan *plan = calloc(1, sizeof(*plan));
    bool free_slot = false;
    if (plan != NULL)
        ctl_openai_reuse_begin(app, r, plan, &free_slot);
    ctl_openai_generate_run(req, app, r, free_slot);
    ctl_ckpt_plan_end(plan);
    free(plan);
    r->plan = NULL;
}

/* Names the response: r->created now, r->id "chatcmpl-"/"cmpl-" and 24 random hex digits. */
static void
ctl_openai_id_make(ctl_openai_req *r)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->created = ts.tv_sec;
    uint8_t rnd[12];
    uint64_t seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)(uintptr_t)r;
    for (int i = 0; i < 12; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        rnd[i] = (uint8_t)(seed >> 56);
    }
    char hex[25];
    for (int i = 0; i < 12; i++)
        snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
    snprintf(r->id, sizeof(r->id), "%s-%s", r->chat ? "chatcmpl" : "cmpl", hex);
}

/* Generates and answers r as one JSON body (no streaming). */
static void
ctl_openai_answer_whole(ctl_http_req *req, ctl_app *app, ctl_openai_req *r, bool free_slot)
{
    const char *route = ctl_openai_route(r);
    ctl_gen_result res;
    wk_diag d = {{0}};
    ctl_openai_tc tc;
    wk_err err = ctl_openai_tc_init(&tc, r);
    if (err != WK_OK)
        (void)wk_diag_set(&d, err, "out of memory");
    else
        err = ctl_gen_run(app->sched, app->tok, r->prompt, r->n_prompt, &r->gen, NULL, NULL,
                          &res, &d);
    if (err != WK_OK) {
        ctl_openai_count(app, route, "error");
        if (r->on_fail != NULL)
            r->on_fail(r);
        ctl_openai_send_gen_error(req, err, d.msg);
        wk_toolcall_parser_free(tc.p);
        return;
    }
    ctl_metrics_add(app->metrics, "wkvm_generation_tokens_total", NULL, (double)res.n_tokens);
    json_t *choice = json_pack("{s:i, s:s}", "index", 0, "finish_reason", res.finish_reason);
    size_t text_off = 0;
    json_t *lp = !r->logprobs ? json_null()
                 : r->chat ? json_pack("{s:o}", "content",
                                       ctl_openai_logprobs_json(app, res.tokens, res.n_tokens,
                                                                r->top_logprobs))
                           : ctl_openai_completion_logprobs_json(app, res.tokens, res.n_tokens,
                                                                 r->top_logprobs, &text_off);
    json_object_set_new(choice, "logprobs", lp);
    if (r->chat) {
        /* (the text split at the think markers as a stream splits it: the same parts) */
        wk_chat_think th;
        wk_chat_think_init(&th, WK_CHAT_TPL_THINK_OPEN, WK_CHAT_TPL_THINK_CLOSE, r->think_open);
        json_t *calls = tc.p != NULL ? json_array() : NULL;
        json_t *msg = ctl_openai_think_json(r->think ? &th : NULL, &tc, calls,
                                            json_pack("{s:s}", "role", "assistant"), res.text,
                                            res.text_len, true);
        if (json_array_size(calls) > 0) {
            /* (OpenAI's shape: content null when the reply is calls only) */
            if (json_string_length(json_object_get(msg, "content")) == 0)
                json_object_set_new(msg, "content", json_null());
            if (r->legacy_fn) /* (the legacy API's one call, without an id) */
                json_object_set(msg, "function_call",
                                json_object_get(json_array_get(calls, 0), "function"));
            else
                json_object_set(msg, "tool_calls", calls);
            if (strcmp(res.finish_reason, "stop") == 0)
                json_object_set_new(choice, "finish_reason",
                                    json_string(r->legacy_fn ? "function_call" : "tool_calls"));
        }
        json_decref(calls);
        json_object_set_new(choice, "message", msg);
    } else {
        json_object_set_new(choice, "text", json_stringn(res.text, res.text_len));
    }
    if (r->return_token_ids) {
        json_t *ids = json_array();
        for (size_t i = 0; i < res.n_tokens; i++)
            json_array_append_new(ids, json_integer(res.tokens[i].id));
        json_object_set_new(choice, "token_ids", ids);
    }
    json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", r->id, "object",
                             r->chat ? "chat.completion" : "text_completion", "created",
                             (json_int_t)r->created, "model", r->model, "choices", choice, "usage",
                             ctl_openai_usage_json(r, &res));
    if (r->return_token_ids)
        json_object_set_new(body, "prompt_token_ids", ctl_openai_prompt_ids_json(r));
    ctl_openai_reuse_done(app, r, &res, free_slot);
    if (r->on_done != NULL)
        r->on_done(r, &res, body);
    ctl_openai_count(app, route, "ok");
    ctl_http_send_json(req, 200, body);
    ctl_gen_result_fini(&res);
    wk_toolcall_parser_free(tc.p);
}

/* Generates r and streams it as server-sent events (chunks, then [DONE]). */
static void
ctl_openai_answer_stream(ctl_http_req *req, ctl_app *app, ctl_openai_req *r, bool free_slot)
{
    const char *route = ctl_openai_route(r);
    ctl_gen_result res;
    wk_diag d = {{0}};
    /* Admission errors come before the first byte, as plain JSON errors. */
    ctl_openai_stream st = {.req = req, .app = app, .r = r};
    wk_chat_think_init(&st.think, WK_CHAT_TPL_THINK_OPEN, WK_CHAT_TPL_THINK_CLOSE, r->think_open);
    ctl_job *job = NULL;
    wk_err err = ctl_openai_tc_init(&st.tc, r);
    if (err != WK_OK)
        (void)wk_diag_set(&d, err, "out of memory");
    else
        err = ctl_gen_submit(app->sched, r->prompt, r->n_prompt, &r->gen, &job, &d);
    if (err != WK_OK) {
        wk_toolcall_parser_free(st.tc.p);
        ctl_ssefmt_fini(&st.fmt);
        ctl_openai_count(app, route, "error");
        if (r->on_fail != NULL)
            r->on_fail(r);
        ctl_openai_send_gen_error(req, err, d.msg);
        return;
    }
    ctl_http_sse_begin(req);
    if (r->chat) {
        json_t *chunk = ctl_openai_chunk_base(r);
        json_object_set_new(chunk, "choices",
                            json_pack("[{s:i, s:{s:s, s:s}, s:n, s:n}]", "index", 0, "delta",
                                      "role", "assistant", "content", "", "logprobs",
                                      "finish_reason"));
        (void)ctl_openai_send_chunk(&st, chunk);
    }
    if (st.broken) {
        ctl_job_free(job);
        err = WK_EIO;
    } else {
        /* What one wake-up finds (a slow client: several chunks) goes out in one write. */
        ctl_http_cork(req, true);
        err = ctl_stream_gen_run(req, job, app->tok, &r->gen, ctl_openai_stream_sink,
                                 ctl_openai_stream_flush, &st, &res, &d);
        if (ctl_http_req_broken(req))
            st.broken = true; /* (an event loop saw the client go away) */
        ctl_http_cork(req, false);
    }
    if (err != WK_OK) {
        ctl_openai_count(app, route, st.broken ? "cancelled" : "error");
        if (r->on_fail != NULL)
            r->on_fail(r);
        if (!st.broken) {
            char *eb = ctl_err_body(err, d.msg, NULL);
            bool sent = eb != NULL && ctl_http_sse_data(req, eb) == WK_OK &&
                        ctl_http_sse_data(req, "[DONE]") == WK_OK;
            free(eb);
            if (!sent)
                wk_log_info("the error event did not reach the client id=%s", r->id);
        } else {
            wk_log_info("client went away id=%s", r->id);
        }
        wk_toolcall_parser_free(st.tc.p);
        ctl_ssefmt_fini(&st.fmt);
        return;
    }
    ctl_metrics_add(app->metrics, "wkvm_generation_tokens_total", NULL, (double)res.n_tokens);
    if (r->chat && ((r->think && st.think.n_held > 0) || st.tc.p != NULL)) {
        /* bytes held for a marker that never came: text of the part they were in;
           and what the tool-call parse held (a call the reply ended in) */
        json_t *calls = st.tc.p != NULL ? json_array() : NULL;
        json_t *hc = ctl_openai_chunk_base(r);
        json_object_set_new(hc, "choices",
                            json_pack("[{s:i, s:o, s:n, s:n}]", "index", 0, "delta",
                                      ctl_openai_think_json(r->think ? &st.think : NULL, &st.tc,
                                                            calls, NULL, "", 0, true),
                                      "logprobs", "finish_reason"));
        (void)ctl_openai_send_delta(&st, hc, calls);
    }
    const char *finish = st.tc.n_calls == 0 || strcmp(res.finish_reason, "stop") != 0
                             ? res.finish_reason
                         : r->legacy_fn ? "function_call"
                                        : "tool_calls";
    json_t *chunk = ctl_openai_chunk_base(r);
    json_t *choice = json_pack("{s:i, s:s, s:n}", "index", 0, "finish_reason", finish,
                               "logprobs");
    if (r->chat)
        json_object_set_new(choice, "delta", json_object());
    else
        json_object_set_new(choice, "text", json_string(""));
    json_object_set_new(chunk, "choices", json_pack("[o]", choice));
    if (r->return_token_ids)
        json_object_set_new(chunk, "prompt_token_ids", ctl_openai_prompt_ids_json(r));
    ctl_openai_reuse_done(app, r, &res, free_slot);
    if (r->on_done != NULL)
        r->on_done(r, &res, chunk);
    (void)ctl_openai_send_chunk(&st, chunk);
    if (r->include_usage) {
        chunk = ctl_openai_chunk_base(r);
        json_object_set_new(chunk, "choices", json_array());
        json_object_set_new(chunk, "usage", ctl_openai_usage_json(r, &res));
        (void)ctl_openai_send_chunk(&st, chunk);
    }
    if (!st.broken && ctl_http_sse_data(req, "[DONE]") != WK_OK)
        wk_log_info("client went away before [DONE] id=%s", r->id);
    ctl_openai_count(app, route, st.broken ? "cancelled" : "ok");
    ctl_gen_result_fini(&res);
    wk_toolcall_parser_free(st.tc.p);
    ctl_ssefmt_fini(&st.fmt);
}

static void
ctl_openai_generate_run(ctl_http_req *req, ctl_app *app, ctl_openai_req *r, bool free_slot)
{
    ctl_openai_id_make(r);
    if (r->n_prompt > app->max_prompt_tokens) {
        ctl_openai_fail(req, WK_ETOOBIG, r->chat ? "messages" : "prompt",
                        "the prompt has %zu tokens, more than the limit of %u", r->n_prompt,
                        app->max_prompt_tokens);
        return;
    }
    if (r->chat && !r->ignore_eos && r->gen.n_stops < CTL_GEN_MAX_STOPS &&
        r->toolgram == NULL) {
        /*
         * The turn's end: "\n\n" in the World template; a model's own template
         * ends a turn with its eos token (its id already stops the generation,
         * its text stops it too when the model spells it out). Not for a forced
         * call: its grammar ends it, and an argument may spell that text.
         */
        const char *eos = r->templated ? wk_chat_tpl_special(app->chat_tpl, "eos_token") : "\n\n";
        if (eos != NULL && eos[0] != '\0')
            r->gen.stops[r->gen.n_stops++] = eos;
    }
    if (r->on_error_before != NULL && r->on_error_before(r, req))
        return;
    if (r->toolgram != NULL)
        ctl_toolgram_apply(r->toolgram, &r->gen);
    r->gen.sample.logprobs = r->logprobs;
    r->gen.sample.top_logprobs = r->top_logprobs;
    struct timespec mono;
    clock_gettime(CLOCK_MONOTONIC, &mono);
    r->gen.deadline_ms = (uint64_t)mono.tv_sec * 1000u + (uint64_t)mono.tv_nsec / 1000000u +
                         app->request_timeout_ms;
    ctl_metrics_add(app->metrics, "wkvm_prompt_tokens_total", NULL, (double)r->n_prompt);
    if (!r->stream)
        ctl_openai_answer_whole(req, app, r, free_slot);
    else
        ctl_openai_answer_stream(req, app, r, free_slot);
}

/* Reads and parses the body; sends the error and returns NULL on failure. */
json_t *
ctl_openai_body(ctl_http_req *req)
{
    const char *buf = NULL;
    size_t len = 0;
    wk_err err = ctl_http_req_body(req, &buf, &len);
    if (err == WK_ETOOBIG) {
        ctl_openai_fail(req, WK_ETOOBIG, NULL, "request body too large");
        return NULL;
    }
    if (err != WK_OK) {
        ctl_openai_fail(req, err, NULL, "cannot read the request body");
        return NULL;
    }
    json_t *body = NULL;
    wk_diag d = {{0}};
    if (wk_json_parse_text(buf, len, &body, &d) != WK_OK) { /* (NUL only in texts, below) */
        ctl_openai_fail(req, WK_EINVAL, NULL, "%s", d.msg);
        return NULL;
    }
    if (!json_is_object(body)) {
        json_decref(body);
        ctl_openai_fail(req, WK_EINVAL, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return body;
}

static void
ctl_openai_chat(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    if (!ctl_app_user_enter(req, app))
        return;
    json_t *body = ctl_openai_body(req);
    if (body == NULL) {
        ctl_app_user_leave(req, app);
        return;
    }
    ctl_openai_req r = {.chat = true, .reuse = true, .cache = true};
    ctl_chat_turn *turn = NULL;
    if (ctl_openai_check_fields(req, body, ctl_openai_chat_fields,
                                sizeof(ctl_openai_chat_fields) /
                                    sizeof(ctl_openai_chat_fields[0])) &&
        ctl_openai_parse_platform(req, app, body) && ctl_openai_parse_common(req, app, body, &r) &&
        ctl_openai_parse_chat_logprobs(req, body, &r) &&
        ctl_openai_parse_messages(req, app, body, &r) && ctl_chat_begin(req, app, &r, &turn)) {
        ctl_openai_generate(req, app, &r);
        ctl_chat_end(turn);
    }
    ctl_openai_req_fini(&r);
    json_decref(body);
    ctl_app_user_leave(req, app);
}

static void
ctl_openai_completions(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    if (!ctl_app_user_enter(req, app))
        return;
    json_t *body = ctl_openai_body(req);
    if (body == NULL) {
        ctl_app_user_leave(req, app);
        return;
    }
    ctl_openai_req r = {.chat = false, .reuse = true, .cache = true};
    if (ctl_openai_check_fields(req, body, ctl_openai_completion_fields,
                                sizeof(ctl_openai_completion_fields) /
                                    sizeof(ctl_openai_completion_fields[0])) &&
        ctl_openai_parse_common(req, app, body, &r) && ctl_openai_parse_prompt(req, app, body, &r))
        ctl_openai_generate(req, app, &r);
    ctl_openai_req_fini(&r);
    json_decref(body);
    ctl_app_user_leave(req, app);
}

wk_err
ctl_openai_metrics_declare(ctl_metrics *m)
{
    static const struct {
        const char *name;
        ctl_metric_type type;
        const char *help;
    } fams[] = {
        {"wkvm_requests_total", CTL_METRIC_COUNTER, "Generation requests by route and outcome."},
        {"wkvm_prompt_tokens_total", CTL_METRIC_COUNTER, "Prompt tokens received."},
        {"wkvm_generation_tokens_total", CTL_METRIC_COUNTER, "Tokens generated."},
        {"wkvm_queue_depth", CTL_METRIC_GAUGE, "Requests waiting for a slot."},
        {"wkvm_running_requests", CTL_METRIC_GAUGE, "Requests holding a slot and running."},
        {"wkvm_quota_refusals_total", CTL_METRIC_COUNTER,
         "Requests refused by a per-user limit (429 quota_exceeded), by limit."},
    };
    for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++) {
        wk_err err = ctl_metrics_declare(m, fams[i].name, fams[i].type, fams[i].help, NULL, 0);
        if (err != WK_OK)
            return err;
    }
    /* Every documented label shows from the start, at 0 (a query never sees "no data"). */
    ctl_metrics_add(m, "wkvm_quota_refusals_total", "limit=\"concurrent\"", 0);
    ctl_metrics_add(m, "wkvm_quota_refusals_total", "limit=\"states\"", 0);
    return WK_OK;
}

size_t
ctl_openai_routes(ctl_app *app, ctl_http_route *out, size_t cap)
{
    const ctl_http_route routes[] = {
        {"GET", "/v1/models", false, ctl_openai_models, app, "/v1/models", CTL_HTTP_ACCESS_USER},
        {"POST", "/v1/chat/completions", false, ctl_openai_chat, app, "/v1/chat/completions",
         CTL_HTTP_ACCESS_USER},
        {"POST", "/v1/completions", false, ctl_openai_completions, app, "/v1/completions",
         CTL_HTTP_ACCESS_USER},
        {"GET", "/v1/models/", true, ctl_openai_model_get, app, "/v1/models/{id}",
         CTL_HTTP_ACCESS_USER},
    };
    size_t n = sizeof(routes) / sizeof(routes[0]);
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = routes[i];
    return n;
}
