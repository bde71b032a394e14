/*
 * ctl_openai: the OpenAI-compatible routes: GET /v1/models,
 * POST /v1/chat/completions and POST /v1/completions, blocking and
 * streaming (SSE). Has the request parsed (ctl_openai_parse.c: validated,
 * the chat template rendered, tokenized) and sends its refusal (an OpenAI
 * error naming the field), runs the generation through ctl_gen and shapes
 * the response. Never talks to workers directly.
 */
#define WK_LOG_MODULE "openai"
#include <stdarg.h>
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


void
ctl_openai_req_fini(ctl_openai_req *r)
{
    for (size_t i = 0; r->wire.msg_texts != NULL && i < r->wire.n_msgs; i++)
        free(r->wire.msg_texts[i]);
    free(r->wire.msg_texts);
    free(r->wire.msgs);
    free(r->wire.prompt_text);
    free(r->plan.prompt);
    free(r->wire.msg_ends);
    json_decref(r->wire.tools);
    json_decref(r->wire.tpl_msgs);
    json_decref(r->wire.tpl_kw);
    json_decref(r->wire.call_tools);
    free(r->wire.tool_force_name);
    ctl_toolgram_free(r->wire.toolgram);
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

void
ctl_openai_chat_bounds(const wk_tok *tok, ctl_openai_req *r, size_t off, const int32_t *rest,
                       size_t n_rest, size_t pos0)
{
    /*
     * Message ends after off, as token positions: the last token boundary at
     * or before each end (a token across it belongs to what follows).
     */
    if (r->wire.msg_ends == NULL)
        return;
    size_t acc = off, pos = pos0, mi = 0;
    while (mi < r->wire.n_msgs && r->wire.msg_ends[mi] <= off)
        mi++;
    for (size_t i = 0; i <= n_rest && mi < r->wire.n_msgs && r->plan.n_bounds < CTL_CKPT_MAX_BOUNDS;
         i++) {
        size_t pl = 0;
        if (i < n_rest) {
            const uint8_t *pc = wk_tok_piece(tok, rest[i], &pl);
            if (i == 0 && pc != NULL && pl > 0 && pc[0] == ' ' && off < r->wire.prompt_len &&
                r->wire.prompt_text[off] != ' ')
                pl--; /* (an hf-spm "\u2581" put in front is no text) */
        }
        while (mi < r->wire.n_msgs && (i == n_rest || acc + pl > r->wire.msg_ends[mi])) {
            if (pos > 0 && (r->plan.n_bounds == 0 || r->plan.bounds[r->plan.n_bounds - 1] < pos) &&
                r->plan.n_bounds < CTL_CKPT_MAX_BOUNDS)
                r->plan.bounds[r->plan.n_bounds++] = pos;
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

void
ctl_openai_send_perr(ctl_http_req *req, const ctl_openai_perr *pe)
{
    ctl_http_send_error_code(req, pe->status ? pe->status : ctl_err_http_status(pe->err), pe->err,
                             pe->msg, pe->param[0] ? pe->param : NULL,
                             pe->code[0] ? pe->code : NULL);
}

wk_err
ctl_openai_perr_setf(ctl_openai_perr *pe, int status, wk_err err, const char *param,
                     const char *code, const char *fmt, ...)
{
    pe->err = err;
    pe->status = status;
    snprintf(pe->param, sizeof(pe->param), "%s", param != NULL ? param : "");
    snprintf(pe->code, sizeof(pe->code), "%s", code != NULL ? code : "");
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
 * Checkpoint boundaries of a templated prompt: where a turn ends, after each
 * occurrence of the template's eos token text (<|im_end|>) in r->wire.prompt_text,
 * and where the history ends before the generation prompt (r->plan.hist_end), as
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
    size_t hist = r->plan.hist_end < r->wire.prompt_len ? r->plan.hist_end : 0;
    r->plan.n_bounds = 0;
    const char *p = r->wire.prompt_text, *end = r->wire.prompt_text + r->wire.prompt_len;
    /* next: the byte offset after the next eos occurrence (0: none left) */
    const char *hit = el > 0 ? memmem(p, r->wire.prompt_len, eos, el) : NULL;
    next = hit != NULL ? (size_t)(hit - p) + el : 0;
    for (size_t i = 0; i <= r->plan.n_prompt && (next != 0 || hist != 0); i++) {
        size_t pl = 0;
        if (i < r->plan.n_prompt)
            (void)wk_tok_piece(app->tok, r->plan.prompt[i], &pl);
        for (;;) {
            /* the nearest target: an eos end or the history's end */
            size_t target = next == 0 ? hist : hist == 0 ? next : next < hist ? next : hist;
            if (target == 0 || (i < r->plan.n_prompt && acc + pl <= target))
                break;
            if (i > 0 && (r->plan.n_bounds == 0 || r->plan.bounds[r->plan.n_bounds - 1] < i)) {
                if (r->plan.n_bounds == CTL_CKPT_MAX_BOUNDS) { /* keep the last ones */
                    memmove(r->plan.bounds, r->plan.bounds + 1,
                            (CTL_CKPT_MAX_BOUNDS - 1) * sizeof(size_t));
                    r->plan.n_bounds--;
                }
                r->plan.bounds[r->plan.n_bounds++] = i;
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
        json_array_append(sub, json_array_get(r->wire.tpl_msgs, i));
    wk_diag d = {{0}};
    wk_err err = wk_chat_tpl_render_json(app->chat_tpl, sub, r->wire.tools, false, r->wire.tpl_kw,
                                         NULL, out, len, &d);
    json_decref(sub);
    return err;
}

bool
ctl_openai_tpl_align(ctl_app *app, const ctl_openai_req *r, const int32_t *retained, size_t n,
                     size_t k, size_t *off)
{
    const char *eos = wk_chat_tpl_special(app->chat_tpl, "eos_token");
    size_t el = eos != NULL ? strlen(eos) : 0,
           na = r->wire.tpl_msgs ? json_array_size(r->wire.tpl_msgs) : 0;
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
    size_t bl = 0, cl = 0, lim = r->wire.prompt_len;
    bool ok = false;
    if (ctl_openai_tpl_render_upto(app, r, k, &b, &bl) == WK_OK && bl <= r->wire.prompt_len &&
        memcmp(b, r->wire.prompt_text, bl) == 0) {
        if (ctl_openai_tpl_render_upto(app, r, k + 2, &c, &cl) == WK_OK && cl > bl &&
            cl <= r->wire.prompt_len && memcmp(c, r->wire.prompt_text, cl) == 0)
            lim = cl;
        const char *e = memmem(r->wire.prompt_text + bl, lim - bl, eos, el);
        json_t *content = json_object_get(json_array_get(r->wire.tpl_msgs, k), "content");
        const char *cs = json_is_string(content) ? json_string_value(content) : "";
        size_t cn = json_is_string(content) ? json_string_length(content) : 0;
        while (cn > 0 && (cs[0] == ' ' || cs[0] == '\n' || cs[0] == '\t' || cs[0] == '\r')) {
            cs++;
            cn--;
        }
        while (cn > 0 && (cs[cn - 1] == ' ' || cs[cn - 1] == '\n' || cs[cn - 1] == '\t' ||
                          cs[cn - 1] == '\r'))
            cn--;
        if (e != NULL && (cn == 0 || memmem(r->wire.prompt_text + bl,
                                            (size_t)(e - r->wire.prompt_text) - bl, cs, cn))) {
            bool ate_eos = n > 0 && retained[n - 1] == wk_tok_eos(app->tok);
            *off = (size_t)(e - r->wire.prompt_text) + (ate_eos ? el : 0);
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
    if (!r->wire.templated || r->wire.tpl_msgs == NULL)
        return false;
    json_array_foreach(r->wire.tpl_msgs, i, m) {
        json_t *tc = json_object_get(m, "tool_calls");
        const char *role = json_string_value(json_object_get(m, "role"));
        if ((json_is_array(tc) && json_array_size(tc) > 0) ||
            (role != NULL && strcmp(role, "tool") == 0))
            return false;
    }
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
ctl_openai_usage_json(const ctl_openai_req *r)
{
    const ctl_openai_result *o = &r->out;
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)o->prompt_tokens,
                     "completion_tokens", (json_int_t)o->completion_tokens, "total_tokens",
                     (json_int_t)(o->prompt_tokens + o->completion_tokens),
                     "prompt_tokens_details", "cached_tokens", (json_int_t)o->cached_tokens);
}

void
ctl_openai_result_set(ctl_openai_req *r, const ctl_gen_result *res, const char *finish)
{
    size_t np = r->plan.n_prompt_report ? r->plan.n_prompt_report : r->plan.n_prompt;
    r->out.prompt_tokens = np;
    r->out.completion_tokens = res->n_tokens;
    r->out.cached_tokens = np > res->computed ? np - res->computed : 0;
    r->out.finish_reason = finish;
}

/*
 * The reply's tool-call parse (r->wire.tool_fmt; docs/OPENAI_COMPAT.md): one per
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
    if (!r->wire.chat || r->wire.tool_fmt == WK_TOOLCALL_FMT_NONE)
        return WK_OK;
    return wk_toolcall_parser_new(r->wire.tool_fmt, r->wire.tools, &tc->p);
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
    const char *hex = strchr(tc->r->out.id, '-');
    for (size_t i = 0; i < o.n_calls; i++) {
        if (tc->r->wire.tool_serial && tc->n_calls > 0)
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
    if (r->wire.think) {
        wk_chat_think th;
        wk_chat_think_init(&th, WK_CHAT_TPL_THINK_OPEN, WK_CHAT_TPL_THINK_CLOSE,
                           r->wire.think_open);
        if (wk_chat_think_feed(&th, text, len, true, &rs, &rl, &cs, &cl) != WK_OK)
            return WK_ENOMEM;
        free(rs);
    } else {
        if ((cs = malloc(len + 1)) == NULL)
            return WK_ENOMEM;
        memcpy(cs, text, len);
        cs[len] = '\0';
    }
    if (r->wire.tool_fmt == WK_TOOLCALL_FMT_NONE) {
        *out = cs;
        *out_len = cl;
        return WK_OK;
    }
    wk_toolcall_parser *p = NULL;
    wk_toolcall_out o;
    wk_err err = wk_toolcall_parser_new(r->wire.tool_fmt, r->wire.tools, &p);
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
    wk_chat_think think;    /* r->wire.think: the reasoning split of the text streamed so far */
    ctl_openai_tc tc;       /* the tool-call parse of the content streamed so far */
    ctl_ssefmt fmt;         /* the token chunk's template (ctl_openai_stream_fast) */
    int fast;               /* 0: not tried yet, 1: fmt is set, -1: jansson for every chunk */
} ctl_openai_stream;

/*
 * The chat delta or message body of text (len bytes) split by the think
 * splitter t (r->wire.think; NULL: all content) and then by the tool-call parse
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
    return json_pack("{s:s, s:s, s:I, s:s}", "id", r->out.id, "object",
                     r->wire.chat ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)r->out.created, "model", r->wire.model);
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
 * arguments, then one with its arguments (r->wire.legacy_fn: delta.function_call
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
                 json_object_get(choice, "token_ids") == NULL && !r->wire.logprobs;
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
        if (r->wire.legacy_fn) { /* delta.function_call: the name, then the arguments */
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
    json_t *lp =
        !r->wire.logprobs ? json_null()
        : r->wire.chat
            ? json_pack("{s:o}", "content",
                        ctl_openai_logprobs_json(st->app, toks, n_toks, r->wire.top_logprobs))
            : ctl_openai_completion_logprobs_json(st->app, toks, n_toks, r->wire.top_logprobs,
                                                  &st->text_off);
    json_object_set_new(choice, "logprobs", lp);
    *calls = st->tc.p != NULL ? json_array() : NULL;
    if (r->wire.chat)
        json_object_set_new(choice, "delta",
                            ctl_openai_think_json(r->wire.think ? &st->think : NULL, &st->tc, *calls,
                                                  NULL, text, len, false));
    else
        json_object_set_new(choice, "text", json_stringn(text, len));
    if (r->wire.return_token_ids) { /* (extension: the ids this chunk's text came from) */
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
        if (!r->wire.logprobs && !r->wire.return_token_ids && st->tc.p == NULL && !(r->wire.chat && r->wire.think)) {
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
    if (len == 0 && !(r->wire.logprobs && n_toks > 0) && !(r->wire.return_token_ids && n_toks > 0))
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
    return r->wire.chat ? "/v1/chat/completions" : "/v1/completions";
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
    r->plan.ckpt = NULL;
    ctl_worker_view v;
    if (!r->plan.reuse || !r->wire.cache || app->ckpt == NULL || r->plan.n_prompt == 0 ||
        ctl_pool_model_view(app->pool, &v) != WK_OK)
        return;
    bool held = r->plan.gen.slot != NULL;
    if (held && r->plan.plan_prefix == NULL)
        return; /* (a held slot of unknown content: nothing to key checkpoints by) */
    wk_diag d = {{0}};
    if (ctl_ckpt_plan_begin(app->ckpt, plan, r->plan.owner, v.fingerprint, r->plan.plan_prefix,
                            held ? r->plan.n_plan_prefix : 0, r->plan.prompt, r->plan.n_prompt,
                            r->plan.bounds, r->plan.n_bounds, !held, &d) != WK_OK ||
        plan->c == NULL) {
        ctl_ckpt_plan_end(plan);
        return;
    }
    r->plan.ckpt = plan;
    r->plan.gen.reuse = &plan->reuse;
    r->plan.gen.worker = plan->worker[0] ? plan->worker : NULL;
    if (!r->plan.gen.keep_slot) {
        r->plan.gen.keep_slot = true;
        *free_slot = true;
    }
    if (r->wire.chat)
        r->plan.gen.feed_stop = true; /* the reply's state holds every token the client sees */
}

/*
 * After a generation: counts the reuse and leaves the end-of-reply
 * checkpoint (a chat's with its reply record), then frees the slot when
 * only the checkpoint wanted it.
 */
void
ctl_openai_reuse_done(ctl_app *app, ctl_openai_req *r, const ctl_gen_result *res, bool free_slot)
{
    ctl_ckpt_plan *p = r->plan.ckpt;
    if (p == NULL)
        return;
    if (p->loaded) {
        r->out.reused = true;
        r->out.reused_tokens = p->hit_len;
        r->out.reuse_kind = p->hit_len + 1 == p->n_all ? CTL_CKPT_HIT_REGENERATE
                        : r->plan.aligned_tokens > 0 && p->hit_len >= r->plan.aligned_tokens
                            ? CTL_CKPT_HIT_CHECKPOINT
                            : CTL_CKPT_HIT_PREFIX;
        ctl_ckpt_count_hit(app->ckpt, r->out.reuse_kind, p->hit_len);
    }
    size_t n_gen = res->fed > r->plan.n_prompt ? res->fed - r->plan.n_prompt : 0;
    if (n_gen > res->n_tokens)
        n_gen = res->n_tokens;
    int32_t *gen = malloc((n_gen ? n_gen : 1) * sizeof(*gen));
    char key[WK_SHA256_HEX_LEN] = "";
    if (gen != NULL) {
        for (size_t i = 0; i < n_gen; i++)
            gen[i] = res->tokens[i].id;
        if (r->wire.chat && r->wire.msgs != NULL && !r->wire.templated) {
            /* The reply record: the history as the client will send it back. */
            wk_chat_msg *hm = malloc((r->wire.n_msgs + 1) * sizeof(*hm));
            char *text = NULL;
            size_t tl = 0;
            if (hm != NULL) {
                memcpy(hm, r->wire.msgs, r->wire.n_msgs * sizeof(*hm));
                hm[r->wire.n_msgs] = (wk_chat_msg){.role = "assistant", .content = res->text,
                                              .content_len = res->text_len};
                if (res->text_len == 0)
                    hm[r->wire.n_msgs].content = "";
                if (wk_chat_render(hm, r->wire.n_msgs + 1, false, &text, &tl, NULL) == WK_OK)
                    ctl_ckpt_reply_key(p->fp, p->owner, text, tl, key);
            }
            free(text);
            free(hm);
        }
        ctl_ckpt_plan_reply(p, &res->slot, gen, n_gen, key[0] ? key : NULL);
    }
    free(gen);
    if (free_slot)
        (void)ctl_resid_slot_free(app->resid, &res->slot);
}

/*
 * Extension (with return_token_ids): every token the request's state holds
 * before its reply, a continued session's retained tokens included.
 */
static json_t *
ctl_openai_prompt_ids_json(const ctl_openai_req *r)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < r->plan.n_plan_prefix && r->plan.plan_prefix != NULL; i++)
        json_array_append_new(a, json_integer(r->plan.plan_prefix[i]));
    for (size_t i = 0; a != NULL && i < r->plan.n_prompt; i++)
        json_array_append_new(a, json_integer(r->plan.prompt[i]));
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
    r->plan.ckpt = NULL;
}

/* Names the response: r->out.created now, r->out.id "chatcmpl-"/"cmpl-" and 24 random hex
 * digits. */
static void
ctl_openai_id_make(ctl_openai_req *r)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->out.created = ts.tv_sec;
    uint8_t rnd[12];
    uint64_t seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)(uintptr_t)r;
    for (int i = 0; i < 12; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        rnd[i] = (uint8_t)(seed >> 56);
    }
    char hex[25];
    for (int i = 0; i < 12; i++)
        snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
    snprintf(r->out.id, sizeof(r->out.id), "%s-%s", r->wire.chat ? "chatcmpl" : "cmpl", hex);
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
        err = ctl_gen_run(app->sched, app->tok, r->plan.prompt, r->plan.n_prompt, &r->plan.gen,
                          NULL, NULL, &res, &d);
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
    const char *finish = res.finish_reason;
    size_t text_off = 0;
    json_t *lp = !r->wire.logprobs ? json_null()
                 : r->wire.chat ? json_pack("{s:o}", "content",
                                       ctl_openai_logprobs_json(app, res.tokens, res.n_tokens,
                                                                r->wire.top_logprobs))
                           : ctl_openai_completion_logprobs_json(app, res.tokens, res.n_tokens,
                                                                 r->wire.top_logprobs, &text_off);
    json_object_set_new(choice, "logprobs", lp);
    if (r->wire.chat) {
        /* (the text split at the think markers as a stream splits it: the same parts) */
        wk_chat_think th;
        wk_chat_think_init(&th, WK_CHAT_TPL_THINK_OPEN, WK_CHAT_TPL_THINK_CLOSE,
                           r->wire.think_open);
        json_t *calls = tc.p != NULL ? json_array() : NULL;
        json_t *msg = ctl_openai_think_json(r->wire.think ? &th : NULL, &tc, calls,
                                            json_pack("{s:s}", "role", "assistant"), res.text,
                                            res.text_len, true);
        if (json_array_size(calls) > 0) {
            /* (OpenAI's shape: content null when the reply is calls only) */
            if (json_string_length(json_object_get(msg, "content")) == 0)
                json_object_set_new(msg, "content", json_null());
            if (r->wire.legacy_fn) /* (the legacy API's one call, without an id) */
                json_object_set(msg, "function_call",
                                json_object_get(json_array_get(calls, 0), "function"));
            else
                json_object_set(msg, "tool_calls", calls);
            if (strcmp(res.finish_reason, "stop") == 0) {
                finish = r->wire.legacy_fn ? "function_call" : "tool_calls";
                json_object_set_new(choice, "finish_reason", json_string(finish));
            }
        }
        json_decref(calls);
        json_object_set_new(choice, "message", msg);
    } else {
        json_object_set_new(choice, "text", json_stringn(res.text, res.text_len));
    }
    if (r->wire.return_token_ids) {
        json_t *ids = json_array();
        for (size_t i = 0; i < res.n_tokens; i++)
            json_array_append_new(ids, json_integer(res.tokens[i].id));
        json_object_set_new(choice, "token_ids", ids);
    }
    ctl_openai_result_set(r, &res, finish);
    json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", r->out.id, "object",
                             r->wire.chat ? "chat.completion" : "text_completion", "created",
                             (json_int_t)r->out.created, "model", r->wire.model, "choices", choice,
                             "usage", ctl_openai_usage_json(r));
    if (r->wire.return_token_ids)
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
    wk_chat_think_init(&st.think, WK_CHAT_TPL_THINK_OPEN, WK_CHAT_TPL_THINK_CLOSE,
                       r->wire.think_open);
    ctl_job *job = NULL;
    wk_err err = ctl_openai_tc_init(&st.tc, r);
    if (err != WK_OK)
        (void)wk_diag_set(&d, err, "out of memory");
    else
        err = ctl_gen_submit(app->sched, r->plan.prompt, r->plan.n_prompt, &r->plan.gen, &job, &d);
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
    if (r->wire.chat) {
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
        err = ctl_stream_gen_run(req, job, app->tok, &r->plan.gen, ctl_openai_stream_sink,
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
                wk_log_info("the error event did not reach the client id=%s", r->out.id);
        } else {
            wk_log_info("client went away id=%s", r->out.id);
        }
        wk_toolcall_parser_free(st.tc.p);
        ctl_ssefmt_fini(&st.fmt);
        return;
    }
    ctl_metrics_add(app->metrics, "wkvm_generation_tokens_total", NULL, (double)res.n_tokens);
    if (r->wire.chat && ((r->wire.think && st.think.n_held > 0) || st.tc.p != NULL)) {
        /* bytes held for a marker that never came: text of the part they were in;
           and what the tool-call parse held (a call the reply ended in) */
        json_t *calls = st.tc.p != NULL ? json_array() : NULL;
        json_t *hc = ctl_openai_chunk_base(r);
        json_object_set_new(hc, "choices",
                            json_pack("[{s:i, s:o, s:n, s:n}]", "index", 0, "delta",
                                      ctl_openai_think_json(r->wire.think ? &st.think : NULL,
                                                            &st.tc, calls, NULL, "", 0, true),
                                      "logprobs", "finish_reason"));
        (void)ctl_openai_send_delta(&st, hc, calls);
    }
    const char *finish = st.tc.n_calls == 0 || strcmp(res.finish_reason, "stop") != 0
                             ? res.finish_reason
                         : r->wire.legacy_fn ? "function_call"
                                        : "tool_calls";
    ctl_openai_result_set(r, &res, finish);
    json_t *chunk = ctl_openai_chunk_base(r);
    json_t *choice = json_pack("{s:i, s:s, s:n}", "index", 0, "finish_reason", finish,
                               "logprobs");
    if (r->wire.chat)
        json_object_set_new(choice, "delta", json_object());
    else
        json_object_set_new(choice, "text", json_string(""));
    json_object_set_new(chunk, "choices", json_pack("[o]", choice));
    if (r->wire.return_token_ids)
        json_object_set_new(chunk, "prompt_token_ids", ctl_openai_prompt_ids_json(r));
    ctl_openai_reuse_done(app, r, &res, free_slot);
    if (r->on_done != NULL)
        r->on_done(r, &res, chunk);
    (void)ctl_openai_send_chunk(&st, chunk);
    if (r->wire.include_usage) {
        chunk = ctl_openai_chunk_base(r);
        json_object_set_new(chunk, "choices", json_array());
        json_object_set_new(chunk, "usage", ctl_openai_usage_json(r));
        (void)ctl_openai_send_chunk(&st, chunk);
    }
    if (!st.broken && ctl_http_sse_data(req, "[DONE]") != WK_OK)
        wk_log_info("client went away before [DONE] id=%s", r->out.id);
    ctl_openai_count(app, route, st.broken ? "cancelled" : "ok");
    ctl_gen_result_fini(&res);
    wk_toolcall_parser_free(st.tc.p);
    ctl_ssefmt_fini(&st.fmt);
}

static void
ctl_openai_generate_run(ctl_http_req *req, ctl_app *app, ctl_openai_req *r, bool free_slot)
{
    ctl_openai_id_make(r);
    if (r->plan.n_prompt > app->max_prompt_tokens) {
        ctl_openai_fail(req, WK_ETOOBIG, r->wire.chat ? "messages" : "prompt",
                        "the prompt has %zu tokens, more than the limit of %u", r->plan.n_prompt,
                        app->max_prompt_tokens);
        return;
    }
    if (r->wire.chat && !r->wire.ignore_eos && r->plan.gen.n_stops < CTL_GEN_MAX_STOPS &&
        r->wire.toolgram == NULL) {
        /*
         * The turn's end: "\n\n" in the World template; a model's own template
         * ends a turn with its eos token (its id already stops the generation,
         * its text stops it too when the model spells it out). Not for a forced
         * call: its grammar ends it, and an argument may spell that text.
         */
        const char *eos =
            r->wire.templated ? wk_chat_tpl_special(app->chat_tpl, "eos_token") : "\n\n";
        if (eos != NULL && eos[0] != '\0')
            r->plan.gen.stops[r->plan.gen.n_stops++] = eos;
    }
    if (r->on_error_before != NULL && r->on_error_before(r, req))
        return;
    if (r->wire.toolgram != NULL)
        ctl_toolgram_apply(r->wire.toolgram, &r->plan.gen);
    r->plan.gen.sample.logprobs = r->wire.logprobs;
    r->plan.gen.sample.top_logprobs = r->wire.top_logprobs;
    struct timespec mono;
    clock_gettime(CLOCK_MONOTONIC, &mono);
    r->plan.gen.deadline_ms = (uint64_t)mono.tv_sec * 1000u + (uint64_t)mono.tv_nsec / 1000000u +
                         app->request_timeout_ms;
    ctl_metrics_add(app->metrics, "wkvm_prompt_tokens_total", NULL, (double)r->plan.n_prompt);
    if (!r->wire.stream)
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
    ctl_openai_perr pe = {.err = WK_OK};
    if (!ctl_openai_parse_body(buf, len, &body, &pe)) {
        ctl_openai_send_perr(req, &pe);
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
    ctl_openai_req r = {.wire.chat = true, .plan.reuse = true, .wire.cache = true};
    ctl_openai_perr pe = {.err = WK_OK};
    ctl_chat_turn *turn = NULL;
    ctl_openai_owner(req, r.plan.owner);
    if (!ctl_openai_parse_chat(app, body, &r, &pe)) {
        ctl_openai_send_perr(req, &pe);
    } else if (ctl_chat_begin(req, app, &r, &turn)) {
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
    ctl_openai_req r = {.wire.chat = false, .plan.reuse = true, .wire.cache = true};
    ctl_openai_perr pe = {.err = WK_OK};
    ctl_openai_owner(req, r.plan.owner);
    if (ctl_openai_parse_completion(app, body, &r, &pe))
        ctl_openai_generate(req, app, &r);
    else
        ctl_openai_send_perr(req, &pe);
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
