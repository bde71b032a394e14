/*
 * libFuzzer harness for what a client sends to the generation routes: the
 * real request handlers of controld/api/ctl_openai.c (/v1/chat/completions and
 * /v1/completions, reached through ctl_openai_routes()) run on the input as
 * an HTTP request, with everything below them stubbed: ctl_http (the request
 * and the response are plain memory here, no civetweb), the generation
 * (ctl_gen: a deterministic fake result derived from the prompt, streamed
 * through the real sink when the request streams), metrics and the session
 * glue (ctl_chat_begin runs the real parent-token-v1 header parser,
 * ctl_session_headers_parse_pairs, on the input's headers).
 *
 * The body also goes straight through the pure parser the route calls
 * (ctl_openai_parse_body + ctl_openai_parse_chat / _completion, no
 * connection): a refusal there is a 4xx wk_err with a message, and the route
 * answers exactly that refusal (status, message and param).
 *
 * And the body as a Responses request: ctl_resp_req_parse, then the plan
 * into the shared generation request (ctl_resp_plan: render, tokens, tools,
 * forced calls, parameters) with the items as this request's input (byte 0
 * bit 2: as the history before it). A refusal there is a 400 (a 500 only
 * for ENOMEM) with a message; a plan has a prompt within the limit of ids
 * in the vocab.
 *
 * Input: byte 0 picks the route (bit 0: chat or completions) and the model
 * (bit 1: one with its own chat template, hermes tool calls and think
 * markers, else the World template); when byte 1 is
 * '@', "Name: value" lines follow up to a blank line and become the request
 * headers; the rest is the request body. Invariants: the handler answers
 * exactly once; a JSON answer parses; an error answer is an OpenAI error
 * object with a 4xx status (nothing a client sends may cause a 5xx: the fake
 * generation never fails); a success has one choice and coherent usage; a
 * stream ends with [DONE]; every per-user unit is given back.
 */
/* fuzz-sources: common/util/wk_err.c common/util/wk_log.c common/util/wk_json.c common/util/wk_sha256.c common/text/wk_tok.c common/text/wk_tok_gguf.c common/ckpt/wk_gguf.c common/ckpt/wk_tensor.c common/text/wk_bpe.c common/text/wk_pretok.c common/text/wk_chat.c common/text/wk_chat_tpl.c common/text/wk_toolcall.c common/util/wk_file.c common/text/wk_jinja_parse.c common/text/wk_jinja_value.c common/text/wk_jinja_eval.c common/text/wk_jinja_builtin.c controld/ctl_app.c controld/api/ctl_err.c controld/api/ctl_openai.c controld/api/ctl_ssefmt.c controld/api/ctl_openai_parse.c controld/api/ctl_toolgram.c common/text/wk_grammar.c controld/api/ctl_limits.c controld/session/ctl_session.c controld/api/ctl_resp_req.c controld/api/ctl_resp_plan.c gen/wkvm.pb-c.c */
/* fuzz-protoc: proto/wkvm.proto */
/* fuzz-libs: -lprotobuf-c */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "ctl_app.h"
#include "ctl_chat.h"
#include "ctl_err.h"
#include "ctl_openai.h"
#include "ctl_resp_plan.h"
#include "ctl_resp_req.h"
#include "ctl_session.h"
#include "ctl_stream.h"
#include "wk_chat_tpl.h"
#include "wk_json.h"
#include "wk_log.h"
#include "wk_tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
fuzz_check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_chat_body: invariant failed: %s\n", what);
        abort();
    }
}

/* ---- ctl_http stub: the request and the response as memory ---- */

#define FUZZ_MAX_HDRS 16

struct ctl_http_req {
    const char *body;                    /* request body (NUL-terminated copy) */
    size_t body_len;                     /* bytes */
    ctl_session_hdr hdrs[FUZZ_MAX_HDRS]; /* request headers */
    size_t n_hdrs;                       /* entries */
    int status;                          /* response status, 0 = none yet */
    int n_responses;                     /* ctl_http_send* calls that answered */
    char *resp;                          /* response body (JSON), owned */
    bool sse;                            /* the response is an event stream */
    size_t n_events;                     /* SSE events */
    bool done;                           /* [DONE] was sent */
    bool after_done;                     /* an event came after [DONE] */
};

static void
fuzz_answer(ctl_http_req *req, int status, const char *body, size_t len)
{
    req->n_responses++;
    if (req->status != 0)
        return;
    req->status = status;
    req->resp = strndup(body, len);
}

const char *
ctl_http_req_user(const ctl_http_req *req)
{
    (void)req;
    return "fuzz";
}

const char *
ctl_http_req_header(const ctl_http_req *req, const char *name)
{
    for (size_t i = 0; i < req->n_hdrs; i++)
        if (strcasecmp(req->hdrs[i].name, name) == 0)
            return req->hdrs[i].value;
    return NULL;
}

const char *
ctl_http_req_path(const ctl_http_req *req)
{
    (void)req;
    return "/v1/chat/completions"; /* (the fuzzer drives the body routes only) */
}

wk_err
ctl_http_req_body(ctl_http_req *req, const char **buf, size_t *len)
{
    *buf = req->body;
    *len = req->body_len;
    return WK_OK;
}

void
ctl_http_send(ctl_http_req *req, int status, const char *content_type, const char *body,
              size_t len)
{
    (void)content_type;
    fuzz_answer(req, status, body, len);
}

void
ctl_http_send_json(ctl_http_req *req, int status, json_t *v)
{
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    fuzz_check(s != NULL, "send_json got a value");
    fuzz_answer(req, status, s, strlen(s));
    free(s);
}

void
ctl_http_send_error_status(ctl_http_req *req, int status, wk_err err, const char *message,
                           const char *param)
{
    char *s = ctl_err_body(err, message, param);
    fuzz_check(s != NULL, "error body");
    fuzz_answer(req, status, s, strlen(s));
    free(s);
}

void
ctl_http_send_error_code(ctl_http_req *req, int status, wk_err err, const char *message,
                         const char *param, const char *code)
{
    char *s = ctl_err_body_code(err, message, param, code);
    fuzz_check(s != NULL, "error body");
    fuzz_answer(req, status, s, strlen(s));
    free(s);
}

void
ctl_http_send_error(ctl_http_req *req, wk_err err, const char *message, const char *param)
{
    ctl_http_send_error_status(req, ctl_err_http_status(err), err, message, param);
}

void
ctl_http_sse_begin(ctl_http_req *req)
{
    fuzz_check(req->status == 0, "stream begins before any answer");
    req->status = 200;
    req->n_responses++;
    req->sse = true;
}

void
ctl_http_cork(ctl_http_req *req, bool on)
{
    fuzz_check(req->sse, "cork without a stream");
    (void)on;
}

wk_err
ctl_http_flush(ctl_http_req *req)
{
    fuzz_check(req->sse, "flush without a stream");
    return WK_OK;
}

wk_err
ctl_http_sse_data(ctl_http_req *req, const char *payload)
{
    fuzz_check(req->sse, "event without a stream");
    if (req->done)
        req->after_done = true;
    if (strcmp(payload, "[DONE]") == 0) {
        req->done = true;
    } else {
        json_error_t je;
        json_t *v = json_loads(payload, JSON_ALLOW_NUL, &je); /* text may hold U+0000 */
        fuzz_check(json_is_object(v), "every event is a JSON object");
        json_decref(v);
    }
    req->n_events++;
    return WK_OK;
}

/* ---- metrics, pool, sessions, generation: stubs ---- */

wk_err
ctl_pool_model_view(ctl_pool *p, ctl_worker_view *out)
{
    (void)p, (void)out;
    return WK_EUNAVAIL;
}

wk_err
ctl_metrics_declare(ctl_metrics *m, const char *name, ctl_metric_type type, const char *help,
                    const double *buckets, size_t n_buckets)
{
    (void)m, (void)name, (void)type, (void)help, (void)buckets, (void)n_buckets;
    return WK_OK;
}

void
ctl_metrics_add(ctl_metrics *m, const char *name, const char *labels, double delta)
{
    (void)m, (void)name, (void)labels, (void)delta;
}

/* The checkpoint module is off here (app.ckpt is NULL): a disabled one's answers. */
ctl_ckpt_config
ctl_ckpt_get_config(const ctl_ckpt *c)
{
    (void)c;
    ctl_ckpt_config none = {0};
    return none;
}

void
ctl_ckpt_reply_key(const char *fp, const char *owner, const char *rendered, size_t len,
                   char out[WK_SHA256_HEX_LEN])
{
    (void)fp, (void)owner, (void)rendered, (void)len;
    out[0] = '\0';
}

bool
ctl_ckpt_reply_tokens(ctl_ckpt *c, const char *reply_key, int32_t **ids, size_t *n)
{
    (void)c, (void)reply_key, (void)ids, (void)n;
    return false;
}

wk_err
ctl_ckpt_plan_begin(ctl_ckpt *c, ctl_ckpt_plan *p, const char *owner, const char *fp,
                    const int32_t *prefix, size_t n_prefix, const int32_t *input, size_t n_input,
                    const size_t *bounds, size_t n_bounds, bool lookup, wk_diag *d)
{
    (void)c, (void)owner, (void)fp, (void)prefix, (void)n_prefix, (void)input, (void)n_input;
    (void)bounds, (void)n_bounds, (void)lookup, (void)d;
    memset(p, 0, sizeof(*p));
    return WK_OK;
}

void
ctl_ckpt_plan_reply(ctl_ckpt_plan *p, const ctl_slot_ref *slot, const int32_t *gen, size_t n_gen,
                    const char *reply_key)
{
    (void)p, (void)slot, (void)gen, (void)n_gen, (void)reply_key;
    fuzz_check(0, "no plan exists without a checkpoint module");
}

void
ctl_ckpt_plan_end(ctl_ckpt_plan *p)
{
    if (p != NULL)
        memset(p, 0, sizeof(*p));
}

void
ctl_ckpt_count_hit(ctl_ckpt *c, ctl_ckpt_hit kind, size_t tokens)
{
    (void)c, (void)kind, (void)tokens;
}

wk_err
ctl_resid_slot_free(ctl_resid_dir *dir, const ctl_slot_ref *ref)
{
    (void)dir, (void)ref;
    fuzz_check(0, "no slot is kept without a checkpoint plan");
    return WK_OK;
}

bool
ctl_chat_begin(ctl_http_req *req, ctl_app *app, ctl_openai_req *r, ctl_chat_turn **turn)
{
    (void)app, (void)r;
    *turn = NULL;
    ctl_session_hdrs h;
    wk_diag d = {{0}};
    wk_err err = ctl_session_headers_parse_pairs(req->hdrs, req->n_hdrs, &h, &d);
    fuzz_check(err == WK_OK || err == WK_EINVAL, "header parse error code");
    if (err != WK_OK) {
        fuzz_check(d.msg[0] != '\0', "header parse says why");
        ctl_http_send_error(req, err, d.msg, NULL);
        return false;
    }
    ctl_session_mode mode = ctl_session_hdrs_mode(&h);
    fuzz_check(mode != CTL_SESSION_MODE_PARENT_TOKEN || h.contract, "contract mode");
    fuzz_check(strlen(h.chat_id) <= CTL_SESSION_HDR_MAX, "chat id bounded");
    return true;
}

void
ctl_chat_end(ctl_chat_turn *turn)
{
    fuzz_check(turn == NULL, "no turn from the stub");
}

static int fuzz_job_token; /* the address is the fake job handle */
/* The fake generation's input: the prompt of the last submit. */
static const int32_t *fuzz_input;
static size_t fuzz_n_input;

wk_err
ctl_gen_submit(ctl_sched *sched, const int32_t *input, size_t n, const ctl_gen_params *p,
               ctl_job **job, wk_diag *d)
{
    (void)sched, (void)d;
    fuzz_check(n > 0 && p->max_tokens > 0 && p->n_stops <= CTL_GEN_MAX_STOPS, "gen params");
    fuzz_input = input;
    fuzz_n_input = n;
    *job = (ctl_job *)&fuzz_job_token;
    return WK_OK;
}

void
ctl_job_free(ctl_job *j)
{
    fuzz_check(j == (ctl_job *)&fuzz_job_token, "job handle");
}

void
ctl_gen_result_fini(ctl_gen_result *res)
{
    free(res->text);
    free(res->tokens);
    memset(res, 0, sizeof(*res));
}

/* A fake generation: up to 4 tokens derived from the prompt, decoded as ctl_gen would. */
wk_err
ctl_gen_run_job(ctl_job *job, const wk_tok *tok, const ctl_gen_params *p, ctl_gen_sink_fn sink,
                ctl_gen_flush_fn flush, void *sink_arg, ctl_gen_result *res, wk_diag *d)
{
    (void)d;
    ctl_job_free(job);
    memset(res, 0, sizeof(*res));
    size_t n = p->max_tokens < 4 ? p->max_tokens : 4;
    res->tokens = calloc(n ? n : 1, sizeof(*res->tokens));
    res->text = calloc(1, n * WK_TOK_STREAM_OUT_MAX + WK_TOK_STREAM_FLUSH_MAX + 1);
    fuzz_check(res->tokens != NULL && res->text != NULL, "alloc");
    uint32_t vocab = wk_tok_vocab_size(tok);
    wk_tok_stream ts; /* as ctl_gen does: the text is always valid UTF-8 */
    wk_tok_stream_init(&ts, tok);
    for (size_t i = 0; i < n; i++) {
        ctl_gen_token *t = &res->tokens[i];
        t->id = (int32_t)((uint32_t)fuzz_input[i % fuzz_n_input] % vocab);
        t->logprob = -0.5f * (float)i;
        t->n_top = p->sample.top_logprobs;
        for (uint32_t k = 0; k < t->n_top && k < 20; k++) {
            t->top_id[k] = (int32_t)((uint32_t)(t->id + (int32_t)k) % vocab);
            t->top_logprob[k] = -(float)k;
        }
        size_t pl = 0;
        fuzz_check(wk_tok_stream_push(&ts, t->id, res->text + res->text_len,
                                      WK_TOK_STREAM_OUT_MAX, &pl, NULL) == WK_OK,
                   "stream push");
        res->text_len += pl;
    }
    res->text_len += wk_tok_stream_flush(&ts, res->text + res->text_len);
    res->n_tokens = n;
    res->finish_reason = n == p->max_tokens ? "length" : "stop";
    res->computed = fuzz_n_input;
    res->fed = fuzz_n_input + n;
    if (sink != NULL) {
        wk_err err = sink(sink_arg, res->text, res->text_len, res->tokens, res->n_tokens);
        if (err == WK_OK && flush != NULL)
            err = flush(sink_arg);
        if (err != WK_OK) {
            ctl_gen_result_fini(res);
            return err;
        }
    }
    return WK_OK;
}

/* A streamed reply: the same fake generation on this thread (no event loop here). */
wk_err
ctl_stream_gen_run(ctl_http_req *req, ctl_job *job, const wk_tok *tok, const ctl_gen_params *p,
                   ctl_gen_sink_fn sink, ctl_gen_flush_fn flush, void *sink_arg,
                   ctl_gen_result *res, wk_diag *d)
{
    fuzz_check(req->sse, "a stream runs after its events began");
    return ctl_gen_run_job(job, tok, p, sink, flush, sink_arg, res, d);
}

bool
ctl_http_req_broken(const ctl_http_req *req)
{
    (void)req;
    return false;
}

wk_err
ctl_gen_run(ctl_sched *sched, const wk_tok *tok, const int32_t *input, size_t n,
            const ctl_gen_params *p, ctl_gen_sink_fn sink, void *sink_arg, ctl_gen_result *res,
            wk_diag *d)
{
    ctl_job *job = NULL;
    wk_err err = ctl_gen_submit(sched, input, n, p, &job, d);
    if (err != WK_OK)
        return err;
    return ctl_gen_run_job(job, tok, p, sink, NULL, sink_arg, res, d);
}

/* ---- the harness ---- */

static ctl_app fuzz_app;               /* the World template */
static ctl_http_route fuzz_routes[8];
static ctl_app fuzz_tapp;              /* the same with a chat template of its own */
static ctl_http_route fuzz_troutes[8];

/*
 * A ChatML template with hermes tool calls and think markers (tools listed
 * in a system turn, reasoning_effort and enable_thinking as variables), so
 * the templated parse, the forced-call grammar and the reply's reasoning and
 * tool-call splits run too.
 */
static const char fuzz_tpl[] =
    "{%- if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function | tojson }}\n"
    "{% endfor %}<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"
    "{% if reasoning_effort is defined %} effort={{ reasoning_effort }}{% endif %}"
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}"
    "{{ m.content }}{% endif %}{% for c in m.tool_calls or [] %}<tool_call>\n"
    "{{ c.function | tojson }}\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}";

/* Loads fuzz_tpl as a model directory's chat template (a temporary one, removed again). */
static wk_chat_tpl *
fuzz_load_tpl(void)
{
    char dir[] = "/tmp/fuzz-chat-body-XXXXXX", path[64];
    fuzz_check(mkdtemp(dir) != NULL, "mkdtemp");
    static const char *const files[][2] = {
        {"chat_template.jinja", fuzz_tpl},
        {"tokenizer_config.json", "{\"eos_token\": \"<|im_end|>\"}"},
    };
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i][0]);
        FILE *f = fopen(path, "wb");
        fuzz_check(f != NULL && fputs(files[i][1], f) >= 0 && fclose(f) == 0, "template file");
    }
    wk_diag d = {{0}};
    wk_chat_tpl *t = NULL;
    if (wk_chat_tpl_load(dir, NULL, &t, &d) != WK_OK) {
        fprintf(stderr, "fuzz_chat_body: template: %s\n", d.msg);
        abort();
    }
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i][0]);
        unlink(path);
    }
    rmdir(dir);
    return t;
}

/* A small World-format vocab: the 256 bytes and a few words. */
static void
fuzz_init(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    fuzz_check(wk_log_set_level_name("error") == WK_OK, "log level");
    static const char *const words[] = {"User", "Assistant", "System", ": ", "\\n\\n", "the",
                                        " the", "hello", " world", "\\u00e9t\\u00e9"};
    size_t cap = 256 * 24 + 1024, len = 0;
    char *v = malloc(cap);
    fuzz_check(v != NULL, "alloc");
    for (int b = 0; b < 256; b++)
        len += (size_t)snprintf(v + len, cap - len, "%d b'\\x%02x' 1\n", b + 1, b);
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        /* The byte length as the file states it: escapes count as one byte each. */
        size_t bl = 0;
        for (const char *p = words[i]; *p; p++) {
            if (p[0] == '\\' && p[1] == 'n') {
                p++;
            } else if (p[0] == '\\' && p[1] == 'u') {
                p += 5;
                bl++; /* two-byte UTF-8 (U+00E9) */
            }
            bl++;
        }
        len += (size_t)snprintf(v + len, cap - len, "%zu '%s' %zu\n", 257 + i, words[i], bl);
    }
    wk_diag d = {{0}};
    wk_tok *tok = NULL;
    if (wk_tok_load_mem(v, len, &tok, &d) != WK_OK) {
        fprintf(stderr, "fuzz_chat_body: vocab: %s\n", d.msg);
        abort();
    }
    free(v);
    fuzz_app.tok = tok;
    fuzz_app.model_id = "tiny";
    fuzz_app.default_max_tokens = 16;
    fuzz_app.max_tokens_limit = 64;
    fuzz_app.max_prompt_tokens = 2048;
    fuzz_app.request_timeout_ms = 1000;
    fuzz_app.max_messages = 32;
    fuzz_app.max_message_bytes = 4096;
    fuzz_app.max_stop_bytes = 16;
    fuzz_check(ctl_limits_new(1, &fuzz_app.limits) == WK_OK, "limits");
    size_t n = ctl_openai_routes(&fuzz_app, fuzz_routes, 8);
    fuzz_check(n == 4, "four OpenAI routes"); /* (1, 2: chat, completions) */
    fuzz_tapp = fuzz_app; /* (the same limits: one per-user count for both) */
    fuzz_tapp.chat_tpl = fuzz_load_tpl();
    fuzz_check(wk_chat_tpl_toolcall_fmt(fuzz_tapp.chat_tpl) == WK_TOOLCALL_FMT_HERMES &&
                   wk_chat_tpl_thinks(fuzz_tapp.chat_tpl),
               "template: hermes calls, think markers");
    fuzz_check(ctl_openai_routes(&fuzz_tapp, fuzz_troutes, 8) == 4, "four OpenAI routes");
}

/* Splits "Name: value" lines (up to a blank line) into req->hdrs; returns bytes used. */
static size_t
fuzz_headers(const char *p, size_t n, ctl_http_req *req, char *store, size_t cap)
{
    size_t used = 0, off = 0;
    while (used < n) {
        const char *nl = memchr(p + used, '\n', n - used);
        size_t ll = nl ? (size_t)(nl - (p + used)) : n - used;
        if (ll == 0) {
            used++;
            break;
        }
        const char *line = p + used;
        used += ll + (nl != NULL);
        const char *colon = memchr(line, ':', ll);
        if (colon == NULL || req->n_hdrs == FUZZ_MAX_HDRS || off + ll + 2 > cap)
            continue;
        size_t nl_len = (size_t)(colon - line), vl = ll - nl_len - 1;
        char *name = store + off;
        memcpy(name, line, nl_len);
        name[nl_len] = '\0';
        off += nl_len + 1;
        char *value = store + off;
        memcpy(value, colon + 1, vl);
        value[vl] = '\0';
        off += vl + 1;
        if (strlen(name) != nl_len || strlen(value) != vl)
            continue; /* NUL inside: not expressible as an HTTP header */
        req->hdrs[req->n_hdrs].name = name;
        req->hdrs[req->n_hdrs].value = value;
        req->n_hdrs++;
    }
    return used;
}

static void
fuzz_check_answer(ctl_http_req *req)
{
    fuzz_check(req->n_responses == 1, "exactly one answer");
    if (req->sse) {
        fuzz_check(req->done && !req->after_done, "a stream ends with [DONE], once");
        return;
    }
    json_error_t je;
    json_t *v = json_loads(req->resp, JSON_ALLOW_NUL, &je);
    fuzz_check(json_is_object(v), "the answer is a JSON object");
    if (req->status != 200) {
        fuzz_check(req->status >= 400 && req->status < 500, "refusals are 4xx");
        json_t *e = json_object_get(v, "error");
        fuzz_check(json_is_object(e) && json_object_size(e) == 4, "OpenAI error shape");
        fuzz_check(json_is_string(json_object_get(e, "message")) &&
                       json_string_length(json_object_get(e, "message")) > 0,
                   "an error says why");
    } else {
        json_t *ch = json_object_get(v, "choices");
        fuzz_check(json_is_array(ch) && json_array_size(ch) == 1, "one choice");
        json_t *u = json_object_get(v, "usage");
        json_int_t pt = json_integer_value(json_object_get(u, "prompt_tokens"));
        json_int_t ct = json_integer_value(json_object_get(u, "completion_tokens"));
        json_int_t tt = json_integer_value(json_object_get(u, "total_tokens"));
        fuzz_check(pt >= 1 && ct >= 1 && tt == pt + ct, "usage adds up");
        fuzz_check(pt <= (json_int_t)fuzz_app.max_prompt_tokens, "prompt limit held");
    }
    json_decref(v);
}

/*
 * The pure parse of what the route reads (body, n bytes): true when it
 * accepts, else *pe is the refusal, checked to be a 4xx with a message.
 */
static bool
fuzz_parse(ctl_app *app, const char *body, size_t n, bool chat, ctl_openai_perr *pe)
{
    json_t *b = NULL;
    bool ok = ctl_openai_parse_body(body, n, &b, pe);
    if (ok) {
        ctl_openai_req r = {.wire.chat = chat, .plan.reuse = true, .wire.cache = true};
        snprintf(r.plan.owner, sizeof(r.plan.owner), "fuzz");
        ok = chat ? ctl_openai_parse_chat(app, b, &r, pe)
                  : ctl_openai_parse_completion(app, b, &r, pe);
        fuzz_check(!ok || r.plan.n_prompt > 0, "an accepted request has a prompt");
        ctl_openai_req_fini(&r);
    }
    json_decref(b);
    if (!ok) {
        int st = ctl_err_http_status(pe->err);
        fuzz_check(pe->err != WK_OK && st >= 400 && st < 500, "a parse refusal is a 4xx");
        fuzz_check(pe->msg[0] != '\0', "a parse refusal says why");
    }
    return ok;
}

/*
 * The body (n bytes) as a Responses request, planned on app with its items
 * in the record's form as the input (as_history: as the history before it).
 */
static void
fuzz_resp(ctl_app *app, const char *body, size_t n, bool as_history)
{
    json_t *b = NULL;
    if (wk_json_parse(body, n, &b, NULL) != WK_OK)
        return;
    ctl_resp_limits lim = {.max_items = 16, .max_item_bytes = 1024, .max_tokens = 64};
    ctl_resp_req q;
    ctl_resp_err e;
    if (ctl_resp_req_parse(b, &lim, &q, &e) != WK_OK) {
        json_decref(b);
        return;
    }
    json_t *items = json_array(), *none = json_array();
    fuzz_check(items != NULL && none != NULL, "alloc");
    for (size_t i = 0; i < q.n_items; i++) {
        const ctl_resp_msg *m = &q.items[i];
        json_t *o = m->kind == CTL_RESP_REASONING
                        ? json_pack("{s:s, s:s%}", "type", "reasoning", "text", m->text, m->len)
                    : m->kind == CTL_RESP_FUNCTION_CALL
                        ? json_pack("{s:s, s:s, s:s, s:s%}", "type", "function_call", "call_id",
                                    m->call_id, "name", m->name, "arguments", m->text, m->len)
                    : m->kind == CTL_RESP_FUNCTION_CALL_OUTPUT
                        ? json_pack("{s:s, s:s, s:s%}", "type", "function_call_output", "call_id",
                                    m->call_id, "output", m->text, m->len)
                        : json_pack("{s:s, s:s%}", "role", m->role, "text", m->text, m->len);
        fuzz_check(o != NULL && json_array_append_new(items, o) == 0, "record item");
    }
    ctl_resp_conv cv = {.history = as_history ? items : none, .input = as_history ? none : items};
    ctl_openai_req r = {.wire.chat = true, .plan.reuse = true, .wire.cache = true};
    ctl_openai_perr pe = {.err = WK_OK};
    bool exact = true;
    if (ctl_resp_plan(app, &q, &cv, &r, &exact, &pe)) {
        fuzz_check(!exact && r.plan.aligned_tokens == 0, "no previous state: not exact");
        fuzz_check(r.plan.n_prompt >= 1 && r.plan.n_prompt <= app->max_prompt_tokens,
                   "a plan's prompt within the limit");
        uint32_t vocab = wk_tok_vocab_size(app->tok);
        for (size_t i = 0; i < r.plan.n_prompt; i++)
            fuzz_check(r.plan.prompt[i] >= 0 && (uint32_t)r.plan.prompt[i] < vocab,
                       "prompt ids in the vocab");
        fuzz_check(r.wire.prompt_text != NULL && r.wire.model == q.model, "wire filled");
        fuzz_check(!r.wire.tool_forced || r.wire.toolgram != NULL, "a forced call's grammar");
        fuzz_check(r.plan.gen.max_tokens >= 1, "max tokens");
    } else {
        fuzz_check(pe.err != WK_OK && pe.msg[0] != '\0', "a plan refusal says why");
        fuzz_check(pe.status == 400 || (pe.status == 500 && pe.err == WK_ENOMEM),
                   "a plan refusal is a 400 (500: out of memory)");
    }
    ctl_openai_req_fini(&r);
    json_decref(items);
    json_decref(none);
    ctl_resp_req_fini(&q);
    json_decref(b);
}

/* The route's answer is the pure parser's refusal, byte for byte in its fields. */
static void
fuzz_check_refusal(ctl_http_req *req, const ctl_openai_perr *pe)
{
    fuzz_check(req->status == ctl_err_http_status(pe->err), "route status = parse refusal");
    json_t *v = json_loads(req->resp, JSON_ALLOW_NUL, NULL);
    json_t *e = json_object_get(v, "error");
    json_t *msg = json_object_get(e, "message"), *param = json_object_get(e, "param");
    /* (the answer's texts are scrubbed to UTF-8, as ctl_err_body writes them) */
    char *want_msg = wk_json_utf8_scrub(pe->msg), *want_param = wk_json_utf8_scrub(pe->param);
    fuzz_check(want_msg != NULL && want_param != NULL, "alloc");
    fuzz_check(json_is_string(msg) && strcmp(json_string_value(msg), want_msg) == 0,
               "route message = parse refusal");
    fuzz_check(pe->param[0] ? json_is_string(param) &&
                                  strcmp(json_string_value(param), want_param) == 0
                            : json_is_null(param),
               "route param = parse refusal");
    free(want_msg);
    free(want_param);
    json_decref(v);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_init();
    if (size < 1)
        return 0;
    ctl_http_req req;
    memset(&req, 0, sizeof(req));
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    char *hstore = NULL;
    if (n > 0 && p[0] == '@') {
        hstore = malloc(n + 2 * FUZZ_MAX_HDRS + 1);
        fuzz_check(hstore != NULL, "alloc");
        size_t used = 1 + fuzz_headers(p + 1, n - 1, &req, hstore, n + 2 * FUZZ_MAX_HDRS);
        p += used;
        n -= used;
    }
    char *body = malloc(n + 1);
    fuzz_check(body != NULL, "alloc");
    memcpy(body, p, n);
    body[n] = '\0';
    req.body = body;
    req.body_len = n;
    bool chat = (data[0] & 1) != 0, templated = (data[0] & 2) != 0;
    const ctl_http_route *r = &(templated ? fuzz_troutes : fuzz_routes)[chat ? 1 : 2];
    ctl_openai_perr pe = {.err = WK_OK};
    bool parsed = fuzz_parse(templated ? &fuzz_tapp : &fuzz_app, body, n, chat, &pe);
    fuzz_resp(templated ? &fuzz_tapp : &fuzz_app, body, n, (data[0] & 4) != 0);
    fuzz_input = NULL;
    fuzz_n_input = 0;
    r->fn(&req, r->arg);
    fuzz_check_answer(&req);
    if (!parsed)
        fuzz_check_refusal(&req, &pe);
    fuzz_check(ctl_limits_active_users(fuzz_app.limits) == 0, "per-user unit given back");
    free(req.resp);
    free(body);
    free(hstore);
    return 0;
}
