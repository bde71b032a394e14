/*
 * test_ctl_openai_parse: what a client sends to the generation routes,
 * parsed without a connection (ctl_openai_parse.c). The common fields
 * (ctl_openai_parse_common_value): defaults for chat and completions, every
 * sampling field and its range, stop strings, max_completion_tokens over
 * max_tokens, logit_bias against the tokenizer's vocab, stream options, the
 * cache switches. The whole routes (ctl_openai_parse_body, _chat,
 * _completion): unknown and platform fields, logprobs, the messages (roles,
 * content parts, limits, tool parts) rendered with the World template and
 * with a model's own template (reasoning, tools and tool_choice, forced
 * calls), the completions prompt forms. Each refusal with the code, "param"
 * and message the route answers (the first error in the route's order).
 * And the request's result part (ctl_openai_result_set: usage, finish).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <unistd.h>

#include "ctl_app.h"
#include "ctl_err.h"
#include "ctl_openai.h"
#include "wk_chat_tpl.h"
#include "wk_json.h"
#include "wk_tok.h"

#include "parse_fixture.h"

static ctl_app app;  /* the World template */
static ctl_app tapp; /* a model with its own chat template (hermes tool calls, think markers) */
static char tdir[64];

/*
 * A ChatML template: tools listed in a system turn, the messages, a
 * generation prompt that opens a think block; raise_exception on a message
 * "boom"; names reasoning_effort and the hermes call format.
 */
static const char tpl_src[] =
    "{%- if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }}\n{% endfor %}"
    "<tool_call>{\"name\": \"...\"}</tool_call>{% if reasoning_effort is defined %}"
    "effort={{ reasoning_effort }}{% endif %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}{% if m.content == 'boom' %}{{ raise_exception('no boom') }}"
    "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
    "{%- if false %}</think>{% endif %}";

static int
setup(void **state)
{
    (void)state;
    pf_app_init(&app);
    /* the same vocab with a chat template loaded from a temporary model directory */
    tapp = app;
    tapp.max_messages = 0;
    tapp.max_message_bytes = 0;
    tapp.max_prompt_tokens = 4096;
    pf_tpl_load(tdir, "wkvm-openai-parse", tpl_src, "<|im_end|>", &tapp.chat_tpl);
    return 0;
}

static int
teardown(void **state)
{
    (void)state;
    wk_tok_free(app.tok);
    wk_chat_tpl_free(tapp.chat_tpl);
    pf_tpl_dir_remove(tdir);
    return 0;
}

/* Parses body (JSON text) into *r (chat or completions); true on success, *pe on failure. */
static bool
parse(const char *body, bool chat, ctl_openai_req *r, ctl_openai_perr *pe, json_t **keep)
{
    /* (NULs allowed: the route's body reader lets them through to the field checks) */
    json_t *b = json_loads(body, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, NULL);
    if (b == NULL)
        fail_msg("bad test JSON: %s", body);
    memset(r, 0, sizeof(*r));
    memset(pe, 0, sizeof(*pe));
    r->wire.chat = chat;
    bool ok = ctl_openai_parse_common_value(&app, b, r, pe);
    *keep = b; /* r borrows strings from it */
    return ok;
}

/* Expects body to be refused with err, param (NULL: none) and a message holding want. */
static void
refused(const char *body, wk_err err, const char *param, const char *want)
{
    ctl_openai_req r;
    ctl_openai_perr pe;
    json_t *b = NULL;
    if (parse(body, true, &r, &pe, &b))
        fail_msg("accepted: %s", body);
    if (pe.err != err || strcmp(pe.param, param ? param : "") != 0 || !strstr(pe.msg, want))
        fail_msg("%s: got %s param '%s' '%s', expected %s param '%s' '%s'", body,
                 wk_err_name(pe.err), pe.param, pe.msg, wk_err_name(err), param ? param : "", want);
    json_decref(b);
}

/* The legacy functions API is rewritten into the tools API before anything reads the body. */
static void
test_legacy_functions(void **state)
{
    (void)state;
    ctl_openai_req r;
    ctl_openai_perr pe;
    json_t *b = NULL;
    assert_true(parse("{\"model\":\"m\",\"functions\":[{\"name\":\"f\"}],\"function_call\":\"auto\","
                      "\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
                      "{\"role\":\"assistant\",\"content\":null,"
                      "\"function_call\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
                      "{\"role\":\"function\",\"name\":\"f\",\"content\":\"r\"}]}",
                      true, &r, &pe, &b));
    assert_true(r.wire.legacy_fn);
    assert_true(r.wire.tool_serial);
    json_t *want = json_loads(
        "{\"model\":\"m\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
        "\"tool_choice\":\"auto\",\"parallel_tool_calls\":false,"
        "\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_legacy_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"name\":\"f\",\"content\":\"r\",\"tool_call_id\":\"call_legacy_1\"}]}",
        0, NULL);
    assert_non_null(want);
    assert_true(json_equal(b, want));
    json_decref(want);
    json_decref(b);
    ctl_openai_req_fini(&r);
    /* without the legacy fields: tool_calls as before */
    assert_true(parse("{\"model\":\"m\",\"tools\":[{\"type\":\"function\",\"function\":"
                      "{\"name\":\"f\"}}]}", true, &r, &pe, &b));
    assert_false(r.wire.legacy_fn);
    json_decref(b);
    ctl_openai_req_fini(&r);
}

static void
test_defaults(void **state)
{
    (void)state;
    ctl_openai_req r;
    ctl_openai_perr pe;
    json_t *b = NULL;
    assert_true(parse("{\"model\":\"m\",\"messages\":[]}", true, &r, &pe, &b));
    assert_string_equal(r.wire.model, "m");
    assert_int_equal(r.plan.gen.max_tokens, 64); /* chat: the server's default */
    assert_true(r.plan.gen.sample.temperature == 1.0f);
    assert_true(r.plan.gen.sample.top_p == 1.0f);
    assert_true(r.plan.gen.sample.min_p == 0.0f);
    assert_int_equal(r.plan.gen.sample.top_k, 0);
    assert_int_equal(r.plan.gen.n_stops, 0);
    assert_int_equal(r.plan.gen.sample.n_bias, 0);
    assert_false(r.wire.stream);
    assert_false(r.wire.include_usage);
    assert_true(r.wire.cache);
    assert_true(r.plan.gen.stop_on_eot);
    json_decref(b);
    /* completions: OpenAI's 16 */
    assert_true(parse("{\"model\":\"m\",\"prompt\":\"x\"}", false, &r, &pe, &b));
    assert_int_equal(r.plan.gen.max_tokens, 16);
    json_decref(b);
    /* model may be absent where the route allows it (the state routes) */
    json_t *o = json_object();
    memset(&r, 0, sizeof(r));
    r.wire.model_optional = true;
    assert_true(ctl_openai_parse_common_value(&app, o, &r, &pe));
    assert_string_equal(r.wire.model, "m");
    json_decref(o);
}

static void
test_fields(void **state)
{
    (void)state;
    ctl_openai_req r;
    ctl_openai_perr pe;
    json_t *b = NULL;
    assert_true(parse("{\"model\":\"m\",\"temperature\":0,\"top_p\":0.5,\"min_p\":0.1,"
                      "\"top_k\":-1,\"presence_penalty\":1.5,\"frequency_penalty\":-2,"
                      "\"seed\":42,\"max_tokens\":7,\"max_completion_tokens\":9,"
                      "\"stop\":[\"a\",\"bc\"],\"stream\":true,"
                      "\"stream_options\":{\"include_usage\":true},\"ignore_eos\":true,"
                      "\"return_token_ids\":true,\"cache_prompt\":false,"
                      "\"logit_bias\":{\"5\":10,\"256\":-100},\"n\":1,"
                      "\"response_format\":{\"type\":\"text\"},\"tools\":[{}],"
                      "\"tool_choice\":\"auto\",\"audio\":null,\"modalities\":[]}",
                      true, &r, &pe, &b));
    const ctl_sample_spec *sp = &r.plan.gen.sample;
    assert_true(sp->temperature == 0.0f);
    assert_true(sp->top_p == 0.5f);
    assert_true(sp->min_p == 0.1f);
    assert_int_equal(sp->top_k, 0); /* -1: off */
    assert_true(sp->presence_penalty == 1.5f);
    assert_true(sp->frequency_penalty == -2.0f);
    assert_int_equal(sp->seed, 42);
    assert_int_equal(r.plan.gen.max_tokens, 9); /* max_completion_tokens wins */
    assert_int_equal(r.plan.gen.n_stops, 2);
    assert_string_equal(r.plan.gen.stops[1], "bc");
    assert_true(r.wire.stream);
    assert_true(r.wire.include_usage);
    assert_true(r.wire.ignore_eos);
    assert_false(r.plan.gen.stop_on_eot);
    assert_true(r.wire.return_token_ids);
    assert_false(r.wire.cache);
    assert_int_equal(sp->n_bias, 2);
    assert_int_equal(sp->bias[0].token, 5);
    assert_true(sp->bias[0].bias == 10.0f);
    assert_int_equal(sp->bias[1].token, 256);
    json_decref(b);
    /* one stop string; cache false wins over cache_prompt */
    assert_true(parse("{\"model\":\"m\",\"stop\":\"\\n\",\"cache\":false,\"cache_prompt\":true}",
                      true, &r, &pe, &b));
    assert_int_equal(r.plan.gen.n_stops, 1);
    assert_string_equal(r.plan.gen.stops[0], "\n");
    assert_false(r.wire.cache);
    json_decref(b);
}

static void
test_refusals(void **state)
{
    (void)state;
    refused("{\"model\":\"x\"}", WK_ENOENT, "model", "The model 'x' does not exist");
    refused("{\"messages\":[]}", WK_EINVAL, "model", "model");
    refused("{\"model\":7}", WK_EINVAL, "model", "model");
    refused("{\"model\":\"m\",\"audio\":{}}", WK_EINVAL, "audio",
            "'audio' is not supported by wkvm");
    refused("{\"model\":\"m\",\"modalities\":[\"text\"]}", WK_EINVAL, "modalities",
            "'modalities' is not supported by wkvm");
    refused("{\"model\":\"m\",\"tools\":{}}", WK_EINVAL, "tools",
            "'tools' must be an array of objects");
    refused("{\"model\":\"m\",\"tool_choice\":\"required\"}", WK_EINVAL, "tool_choice",
            "cannot require one");
    refused("{\"model\":\"m\",\"function_call\":7}", WK_EINVAL, "function_call",
            "'function_call' must be \"auto\", \"none\" or {\"name\": ...}");
    refused("{\"model\":\"m\",\"function_call\":\"required\",\"functions\":[{}]}", WK_EINVAL,
            "function_call", "'function_call' must be");
    refused("{\"model\":\"m\",\"functions\":[{}],\"tools\":[]}", WK_EINVAL, "functions",
            "not both");
    refused("{\"model\":\"m\",\"functions\":{}}", WK_EINVAL, "functions",
            "'functions' must be an array of objects");
    refused("{\"model\":\"m\",\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}",
            WK_EINVAL, "messages[0].name", "needs the string 'name'");
    refused("{\"model\":\"m\",\"parallel_tool_calls\":1}", WK_EINVAL, "parallel_tool_calls",
            "must be a boolean");
    refused("{\"model\":\"m\",\"n\":2}", WK_EINVAL, "n", "only n=1 is supported");
    refused("{\"model\":\"m\",\"response_format\":{\"type\":\"json_object\"}}", WK_EINVAL,
            "response_format", "only response_format {\"type\":\"text\"} is supported");
    refused("{\"model\":\"m\",\"stream\":\"yes\"}", WK_EINVAL, "stream", "stream");
    refused("{\"model\":\"m\",\"stream_options\":{\"include_usage\":1}}", WK_EINVAL,
            "stream_options", "stream_options.include_usage must be a boolean");
    refused("{\"model\":\"m\",\"temperature\":2.5}", WK_EINVAL, "temperature", "temperature");
    refused("{\"model\":\"m\",\"top_p\":-0.1}", WK_EINVAL, "top_p", "top_p");
    refused("{\"model\":\"m\",\"top_k\":-2}", WK_EINVAL, "top_k", "top_k");
    refused("{\"model\":\"m\",\"seed\":\"1\"}", WK_EINVAL, "seed", "seed");
    refused("{\"model\":\"m\",\"max_tokens\":0}", WK_EINVAL, "max_tokens", "max_tokens");
    refused("{\"model\":\"m\",\"max_tokens\":5000}", WK_EINVAL, "max_tokens", "max_tokens");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"max_completion_tokens\":0}", WK_EINVAL,
            "max_completion_tokens", "max_completion_tokens");
    refused("{\"model\":\"m\",\"stop\":[\"a\",1]}", WK_EINVAL, "stop",
            "'stop' entries must be strings");
    refused("{\"model\":\"m\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", WK_EINVAL, "stop",
            "'stop' must be a string or up to 4 strings");
    refused("{\"model\":\"m\",\"stop\":\"123456789\"}", WK_EINVAL, "stop",
            "stop strings are limited to 8 bytes");
    refused("{\"model\":\"m\",\"stop\":\"a\\u0000b\"}", WK_EINVAL, "stop",
            "stop strings cannot contain NUL");
    refused("{\"model\":\"m\",\"logit_bias\":[]}", WK_EINVAL, "logit_bias",
            "'logit_bias' must be an object of token id -> bias");
    refused("{\"model\":\"m\",\"logit_bias\":{\"x1\":1}}", WK_EINVAL, "logit_bias",
            "logit_bias key 'x1' is not a token id in [0, 257)");
    refused("{\"model\":\"m\",\"logit_bias\":{\"257\":1}}", WK_EINVAL, "logit_bias",
            "logit_bias key '257' is not a token id in [0, 257)");
    refused("{\"model\":\"m\",\"logit_bias\":{\"3\":101}}", WK_EINVAL, "logit_bias",
            "logit_bias[3] must be a number in [-100, 100]");
    /* the first error in the route's order: the model before anything else */
    refused("{\"model\":\"x\",\"n\":2,\"audio\":{}}", WK_ENOENT, "model", "does not exist");
    refused("{\"model\":\"m\",\"n\":2,\"audio\":{}}", WK_EINVAL, "audio", "not supported");
    /* what the route answers for them */
    assert_int_equal(ctl_err_http_status(WK_ENOENT), 404);
    assert_int_equal(ctl_err_http_status(WK_EINVAL), 400);
}

/* ---- the whole routes: ctl_openai_parse_body + _chat / _completion ---- */

/*
 * Parses body (JSON text) as the route does on a (app or tapp), into *r:
 * true on success, *pe on failure. The body is kept in *keep (r borrows).
 */
static bool
route(ctl_app *a, const char *body, bool chat, ctl_openai_req *r, ctl_openai_perr *pe,
      json_t **keep)
{
    memset(r, 0, sizeof(*r));
    memset(pe, 0, sizeof(*pe));
    *keep = NULL;
    r->wire.chat = chat;
    r->plan.reuse = r->wire.cache = true;
    snprintf(r->plan.owner, sizeof(r->plan.owner), "u");
    if (!ctl_openai_parse_body(body, strlen(body), keep, pe))
        return false;
    return chat ? ctl_openai_parse_chat(a, *keep, r, pe)
                : ctl_openai_parse_completion(a, *keep, r, pe);
}

/* Expects the route on a to refuse body with err, param (NULL: null) and a message holding want. */
static void
route_refused(ctl_app *a, const char *body, bool chat, wk_err err, const char *param,
              const char *want)
{
    ctl_openai_req r;
    ctl_openai_perr pe;
    json_t *b = NULL;
    if (route(a, body, chat, &r, &pe, &b))
        fail_msg("accepted: %s", body);
    if (pe.err != err || strcmp(pe.param, param ? param : "") != 0 || !strstr(pe.msg, want))
        fail_msg("%s: got %s param '%s' '%s', expected %s param '%s' '%s'", body,
                 wk_err_name(pe.err), pe.param, pe.msg, wk_err_name(err), param ? param : "", want);
    ctl_openai_req_fini(&r);
    json_decref(b);
}

/* Expects the route on a to accept body; the caller checks *r, then calls done(). */
static void
route_ok(ctl_app *a, const char *body, bool chat, ctl_openai_req *r, json_t **b)
{
    ctl_openai_perr pe;
    if (!route(a, body, chat, r, &pe, b))
        fail_msg("%s: refused: %s param '%s' '%s'", body, wk_err_name(pe.err), pe.param, pe.msg);
}

static void
done(ctl_openai_req *r, json_t *b)
{
    ctl_openai_req_fini(r);
    json_decref(b);
}

#define M "\"model\":\"m\","
#define USER "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void
test_body(void **state)
{
    (void)state;
    json_t *b = NULL;
    ctl_openai_perr pe = {.err = WK_OK};
    assert_false(ctl_openai_parse_body("{\"a\":", 5, &b, &pe));
    assert_int_equal(pe.err, WK_EINVAL);
    assert_string_equal(pe.param, "");
    assert_true(pe.msg[0] != '\0');
    assert_null(b);
    assert_false(ctl_openai_parse_body("[1]", 3, &b, &pe));
    assert_string_equal(pe.msg, "the request body must be a JSON object");
    assert_null(b);
    assert_true(ctl_openai_parse_body("{\"a\":1}", 7, &b, &pe));
    assert_true(json_is_object(b));
    json_decref(b);
    /* what the route answers for a refusal (ctl_openai_send_perr: the code's status) */
    assert_int_equal(ctl_err_http_status(WK_ETOOBIG), 413);
}

static void
test_chat_plain(void **state)
{
    (void)state;
    ctl_openai_req r;
    json_t *b;
    route_ok(&app,
             "{" M "\"messages\":[{\"role\":\"developer\",\"content\":\"be\"},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
             "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null},"
             "{\"role\":\"user\",\"content\":\"q\"}],\"logprobs\":true,\"top_logprobs\":5,"
             "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"store\":false,"
             "\"metadata\":{\"k\":\"v\"},\"service_tier\":\"auto\",\"user\":\"x\"}",
             true, &r, &b);
    assert_int_equal(r.wire.n_msgs, 4);
    assert_string_equal(r.wire.msgs[0].role, "system"); /* developer is system */
    assert_string_equal(r.wire.msgs[1].content, "ab"); /* text parts joined */
    assert_int_equal(r.wire.msgs[2].content_len, 0);
    assert_true(r.wire.logprobs);
    assert_int_equal(r.wire.top_logprobs, 5);
    assert_true(r.wire.stream && r.wire.include_usage);
    assert_false(r.wire.templated);
    assert_non_null(r.wire.prompt_text);
    assert_non_null(strstr(r.wire.prompt_text, "User: q"));
    /* a World vocab of single bytes: one token per byte of the rendered prompt */
    assert_int_equal(r.plan.n_prompt, r.wire.prompt_len);
    /* a checkpoint boundary where each earlier message ends, none at 0 */
    assert_true(r.plan.n_bounds >= 2);
    for (size_t i = 0; i < r.plan.n_bounds; i++)
        assert_true(r.plan.bounds[i] > 0 && r.plan.bounds[i] <= r.plan.n_prompt);
    assert_int_equal(r.plan.aligned_tokens, 0);
    done(&r, b);
}

static void
test_chat_refusals(void **state)
{
    (void)state;
    /* the fields first, then the platform fields, then the common ones */
    route_refused(&app, "{\"model\":\"x\",\"foo\":1}", true, WK_EINVAL, "foo",
                  "unknown parameter 'foo': wkvm refuses what it does not honour "
                  "(docs/OPENAI_COMPAT.md lists the supported ones)");
    route_refused(&app, "{\"model\":\"x\",\"store\":true}", true, WK_EINVAL, "store",
                  "'store' must be false: wkvm does not store completions");
    route_refused(&app, "{" M "\"metadata\":{\"k\":1}}", true, WK_EINVAL, "metadata",
                  "'metadata' must be an object of at most 16 string values");
    route_refused(&app, "{" M "\"service_tier\":\"flex\"}", true, WK_EINVAL, "service_tier",
                  "'service_tier' must be \"auto\" or \"default\": wkvm has one tier");
    route_refused(&app, "{" M "\"reasoning_effort\":\"max\"}", true, WK_EINVAL,
                  "reasoning_effort", "'reasoning_effort' must be \"none\", \"minimal\"");
    route_refused(&app, "{" M "\"reasoning_effort\":\"low\"}", true, WK_EINVAL,
                  "reasoning_effort", "'reasoning_effort' is not supported by this model");
    route_refused(&app, "{\"model\":\"x\"," USER "}", true, WK_ENOENT, "model",
                  "The model 'x' does not exist");
    /* logprobs */
    route_refused(&app, "{" M "\"logprobs\":1}", true, WK_EINVAL, "logprobs", "logprobs");
    route_refused(&app, "{" M "\"logprobs\":true,\"top_logprobs\":21}", true, WK_EINVAL,
                  "top_logprobs", "top_logprobs");
    route_refused(&app, "{" M "\"top_logprobs\":2}", true, WK_EINVAL, "top_logprobs",
                  "top_logprobs needs logprobs: true");
    /* the messages */
    route_refused(&app, "{" M "\"n\":1}", true, WK_EINVAL, "messages",
                  "'messages' must be a non-empty array");
    route_refused(&app, "{" M "\"messages\":[]}", true, WK_EINVAL, "messages",
                  "'messages' must be a non-empty array");
    route_refused(&app,
                  "{" M "\"messages\":[{\"role\":\"user\"},{\"role\":\"user\"},{\"role\":\"user\"},"
                  "{\"role\":\"user\"},{\"role\":\"user\"}]}",
                  true, WK_ETOOBIG, "messages", "at most 4 messages");
    route_refused(&app, "{" M "\"messages\":[{\"role\":7}]}", true, WK_EINVAL, "messages[0].role",
                  "each message needs a string 'role'");
    route_refused(&app, "{" M "\"messages\":[{\"role\":\"user\"},{\"role\":\"bot\"}]}", true,
                  WK_EINVAL, "messages[1].role",
                  "role 'bot' is not supported (system, developer, user, assistant)");
    route_refused(&app, "{" M "\"messages\":[{\"role\":\"tool\",\"tool_call_id\":\"c\"}]}", true,
                  WK_EINVAL, "messages[0].role", "tool calls are not supported by this model");
    route_refused(&app,
                  "{" M "\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\"}]}]}",
                  true, WK_EINVAL, "messages[0].tool_calls",
                  "tool calls are not supported by this model");
    route_refused(&app, "{" M "\"messages\":[{\"role\":\"user\",\"content\":5}]}", true, WK_EINVAL,
                  "messages[0].content", "content must be a string or an array of parts");
    route_refused(&app,
                  "{" M "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
                  true, WK_EINVAL, "messages[0].content",
                  "only text content parts are supported (got image_url)");
    route_refused(&app, "{" M "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
                  true, WK_EINVAL, "messages[0].content", "a text part needs a string 'text'");
    route_refused(&app,
                  "{" M "\"messages\":[{\"role\":\"user\",\"content\":\"0123456789abcdefg\"}]}",
                  true, WK_ETOOBIG, "messages[0].content",
                  "a message's content is limited to 16 bytes");
    route_refused(&app, "{" M USER ",\"chat_template_kwargs\":{}}", true, WK_EINVAL,
                  "chat_template_kwargs",
                  "'chat_template_kwargs' needs a model with its own chat template");
    /* a completions field on the chat route */
    route_refused(&app, "{" M USER ",\"prompt\":\"x\"}", true, WK_EINVAL, "prompt",
                  "unknown parameter 'prompt'");
}

static void
test_completion(void **state)
{
    (void)state;
    ctl_openai_req r;
    json_t *b;
    route_ok(&app, "{" M "\"prompt\":\"abc\",\"logprobs\":3,\"best_of\":1,\"echo\":false}", false,
             &r, &b);
    assert_int_equal(r.plan.n_prompt, 3);
    assert_int_equal(r.plan.prompt[0], 'a' + 1); /* byte b is id b + 1 */
    assert_true(r.wire.logprobs);
    assert_int_equal(r.wire.top_logprobs, 3);
    assert_int_equal(r.plan.gen.max_tokens, 16);
    done(&r, b);
    route_ok(&app, "{" M "\"prompt\":[5,6,256]}", false, &r, &b);
    assert_int_equal(r.plan.n_prompt, 3);
    assert_int_equal(r.plan.prompt[2], 256);
    assert_false(r.wire.logprobs);
    done(&r, b);
    /* a batch of one, text or ids */
    route_ok(&app, "{" M "\"prompt\":[\"xy\"]}", false, &r, &b);
    assert_int_equal(r.plan.n_prompt, 2);
    done(&r, b);
    route_ok(&app, "{" M "\"prompt\":[[7]]}", false, &r, &b);
    assert_int_equal(r.plan.n_prompt, 1);
    assert_int_equal(r.plan.prompt[0], 7);
    done(&r, b);
    route_refused(&app, "{" M "\"prompt\":[\"a\",\"b\"]}", false, WK_EINVAL, "prompt",
                  "a batch of 2 prompts is not supported");
    route_refused(&app, "{" M "\"prompt\":[1,257]}", false, WK_EINVAL, "prompt",
                  "prompt[1] is not a token id in [0, 257)");
    route_refused(&app, "{" M "\"prompt\":[1,-1]}", false, WK_EINVAL, "prompt",
                  "prompt[1] is not a token id");
    route_refused(&app, "{" M "\"prompt\":[1,2,3,4,5,6,7,8,9]}", false, WK_ETOOBIG, "prompt",
                  "at most 8 prompt tokens");
    route_refused(&app, "{" M "\"prompt\":5}", false, WK_EINVAL, "prompt",
                  "'prompt' must be a non-empty string or a non-empty array of token ids");
    route_refused(&app, "{" M "\"prompt\":[]}", false, WK_EINVAL, "prompt",
                  "'prompt' must be a non-empty string");
    route_refused(&app, "{" M "\"prompt\":\"\"}", false, WK_EINVAL, "prompt",
                  "the prompt encodes to no tokens");
    route_refused(&app, "{" M "\"prompt\":\"a\",\"best_of\":2}", false, WK_EINVAL, "best_of",
                  "only best_of=1 is supported");
    route_refused(&app, "{" M "\"prompt\":\"a\",\"echo\":true}", false, WK_EINVAL, "echo",
                  "'echo' is not supported");
    route_refused(&app, "{" M "\"prompt\":\"a\",\"suffix\":\"z\"}", false, WK_EINVAL, "suffix",
                  "'suffix' is not supported");
    route_refused(&app, "{" M "\"prompt\":\"a\",\"logprobs\":21}", false, WK_EINVAL, "logprobs",
                  "logprobs");
    route_refused(&app, "{" M "\"prompt\":\"a\",\"logprobs\":true}", false, WK_EINVAL,
                  "logprobs", "logprobs");
    /* chat fields on the completions route; the common fields before the prompt */
    route_refused(&app, "{" M USER "}", false, WK_EINVAL, "messages",
                  "unknown parameter 'messages'");
    route_refused(&app, "{" M "\"prompt\":5,\"temperature\":3}", false, WK_EINVAL, "temperature",
                  "temperature");
}

/* Sampling ranges: both ends accepted, just past them refused. */
static void
test_sampling_ranges(void **state)
{
    (void)state;
    static const struct {
        const char *key, *lo, *hi, *below, *above;
    } f[] = {
        {"temperature", "0", "2", "-0.01", "2.01"},
        {"top_p", "0", "1", "-0.01", "1.01"},
        {"min_p", "0", "1", "-0.01", "1.01"},
        {"presence_penalty", "-2", "2", "-2.01", "2.01"},
        {"frequency_penalty", "-2", "2", "-2.01", "2.01"},
        {"top_k", "-1", "1048576", "-2", "1048577"},
        {"max_tokens", "1", "4096", "0", "4097"},
        {"max_completion_tokens", "1", "4096", "0", "4097"},
    };
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        char body[160];
        const char *v[4] = {f[i].lo, f[i].hi, f[i].below, f[i].above};
        for (int k = 0; k < 4; k++) {
            snprintf(body, sizeof(body), "{" M "\"%s\":%s," USER "}", f[i].key, v[k]);
            if (k < 2) {
                ctl_openai_req r;
                json_t *b;
                route_ok(&app, body, true, &r, &b);
                done(&r, b);
            } else {
                route_refused(&app, body, true, WK_EINVAL, f[i].key, f[i].key);
            }
        }
    }
}

#define TOOL(name) "{\"type\":\"function\",\"function\":{\"name\":\"" name "\"}}"

static void
test_templated(void **state)
{
    (void)state;
    ctl_openai_req r;
    json_t *b;
    route_ok(&tapp,
             "{" M "\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
             "{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"a\"},"
             "{\"role\":\"user\",\"content\":\"q2\"}],\"reasoning_effort\":\"low\"}",
             true, &r, &b);
    assert_true(r.wire.templated);
    assert_true(r.wire.think);
    assert_true(r.wire.think_open); /* the generation prompt opens <think> */
    assert_non_null(r.wire.tpl_msgs);
    assert_non_null(r.wire.tpl_kw); /* reasoning_effort became a template variable */
    assert_string_equal(json_string_value(json_object_get(r.wire.tpl_kw, "reasoning_effort")),
                        "low");
    assert_null(r.wire.tools);
    assert_int_equal(r.wire.tool_fmt, WK_TOOLCALL_FMT_NONE);
    const char *tail = "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\n";
    assert_true(r.wire.prompt_len > strlen(tail));
    assert_memory_equal(r.wire.prompt_text + r.wire.prompt_len - strlen(tail), tail, strlen(tail));
    /* the history ends before the generation prompt; a boundary after each <|im_end|> */
    assert_int_equal(r.plan.hist_end,
                     r.wire.prompt_len - strlen("<|im_start|>assistant\n<think>\n"));
    assert_int_equal(r.plan.n_bounds, 5); /* four turn ends and the history's end */
    assert_int_equal(r.plan.bounds[r.plan.n_bounds - 1], r.plan.hist_end); /* one token per byte */
    assert_true(ctl_openai_tpl_plain(&r));
    done(&r, b);
    /* tools reach the template and the reply is parsed for calls */
    route_ok(&tapp, "{" M USER ",\"tools\":[" TOOL("get_w") "," TOOL("ns:f.x-1") "]}", true, &r,
             &b);
    assert_non_null(r.wire.tools);
    assert_int_equal(r.wire.tool_fmt, WK_TOOLCALL_FMT_HERMES);
    assert_false(r.wire.tool_forced);
    assert_false(r.wire.tool_serial);
    assert_non_null(strstr(r.wire.prompt_text, "get_w\nns:f.x-1\n"));
    done(&r, b);
    /* tool_choice none: the tools in the prompt, no call parsing */
    route_ok(&tapp, "{" M USER ",\"tools\":[" TOOL("f") "],\"tool_choice\":\"none\","
             "\"parallel_tool_calls\":false}", true, &r, &b);
    assert_non_null(r.wire.tools);
    assert_int_equal(r.wire.tool_fmt, WK_TOOLCALL_FMT_NONE);
    assert_true(r.wire.tool_serial);
    done(&r, b);
    /* required / named: constrained decoding, compiled at parse time */
    route_ok(&tapp, "{" M USER ",\"tools\":[" TOOL("f") "," TOOL("g") "],"
             "\"tool_choice\":\"required\"}", true, &r, &b);
    assert_true(r.wire.tool_forced);
    assert_null(r.wire.tool_force_name);
    assert_non_null(r.wire.toolgram);
    done(&r, b);
    route_ok(&tapp, "{" M USER ",\"tools\":[" TOOL("f") "," TOOL("g") "],"
             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}", true, &r,
             &b);
    assert_true(r.wire.tool_forced);
    assert_string_equal(r.wire.tool_force_name, "g");
    assert_non_null(r.wire.toolgram);
    done(&r, b);
    /* a tool round: the assistant's call and the tool's result */
    route_ok(&tapp,
             "{" M "\"tools\":[" TOOL("f") "],\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
             "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
             "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r\"}]}",
             true, &r, &b);
    assert_true(r.wire.templated);
    assert_false(ctl_openai_tpl_plain(&r));
    done(&r, b);
}

static void
test_templated_refusals(void **state)
{
    (void)state;
    route_refused(&tapp, "{" M USER ",\"tools\":[{\"type\":\"code\"}]}", true, WK_EINVAL,
                  "tools[0]", "a tool must be {\"type\": \"function\", \"function\": {...}}");
    route_refused(&tapp, "{" M USER ",\"tools\":[" TOOL("a b") "]}", true, WK_EINVAL,
                  "tools[0].function.name", "a function name must be 1 to 64 letters");
    route_refused(&tapp,
                  "{" M USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                  "\"parameters\":[]}}]}",
                  true, WK_EINVAL, "tools[0].function", "'parameters' a JSON schema object");
    route_refused(&tapp, "{" M USER ",\"tools\":[" TOOL("f") "," TOOL("f") "]}", true, WK_EINVAL,
                  "tools", "two tools are named 'f'");
    route_refused(&tapp, "{" M USER ",\"tools\":[" TOOL("f") "],\"tool_choice\":\"any\"}", true,
                  WK_EINVAL, "tool_choice", "'tool_choice' must be \"auto\", \"none\"");
    route_refused(&tapp,
                  "{" M USER ",\"tools\":[" TOOL("f") "],\"tool_choice\":{\"type\":\"function\","
                  "\"function\":{\"name\":\"g\"}}}",
                  true, WK_EINVAL, "tool_choice",
                  "'tool_choice' names function 'g', which is not among the 'tools'");
    route_refused(&tapp, "{" M USER ",\"chat_template_kwargs\":[1]}", true, WK_EINVAL,
                  "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    route_refused(&tapp, "{" M "\"messages\":[{\"role\":\"tool\",\"content\":\"r\"}]}", true,
                  WK_EINVAL, "messages[0].tool_call_id",
                  "a tool message needs a string 'tool_call_id'");
    route_refused(&tapp,
                  "{" M "\"messages\":[{\"role\":\"user\",\"tool_calls\":[{\"id\":\"c\"}]}]}", true,
                  WK_EINVAL, "messages[0].tool_calls",
                  "'tool_calls' must be an array, on an assistant message");
    route_refused(&tapp,
                  "{" M "\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                  "\"function\":{\"name\":\"f\",\"arguments\":5}}]}]}",
                  true, WK_EINVAL, "messages[0].tool_calls[0]", "a tool call must be");
    route_refused(&tapp, "{" M "\"messages\":[{\"role\":\"user\",\"content\":\"boom\"}]}", true,
                  WK_EINVAL, "messages", "chat template: ");
    route_refused(&tapp, "{" M "\"messages\":[{\"role\":\"user\",\"content\":\"boom\"}]}", true,
                  WK_EINVAL, "messages", "no boom");
    /* the plain template's tool_choice refusal: no call format there */
    route_refused(&app, "{" M USER ",\"tools\":[" TOOL("f") "],\"tool_choice\":\"required\"}",
                  true, WK_EINVAL, "tool_choice",
                  "this model's chat template has no tool-call format wkvm knows");
}

/* The result part: what the answer reports of a generation (usage, finish). */
static void
test_result(void **state)
{
    (void)state;
    ctl_openai_req r;
    memset(&r, 0, sizeof(r));
    ctl_gen_result res;
    memset(&res, 0, sizeof(res));
    r.plan.n_prompt = 10;
    res.n_tokens = 3;
    res.computed = 4; /* 6 prompt tokens came from a checkpoint */
    ctl_openai_result_set(&r, &res, "length");
    assert_int_equal(r.out.prompt_tokens, 10);
    assert_int_equal(r.out.completion_tokens, 3);
    assert_int_equal(r.out.cached_tokens, 6);
    assert_string_equal(r.out.finish_reason, "length");
    /* a state's generate reports the state's tokens too (n_prompt_report) */
    r.plan.n_prompt_report = 25;
    ctl_openai_result_set(&r, &res, "tool_calls");
    assert_int_equal(r.out.prompt_tokens, 25);
    assert_int_equal(r.out.cached_tokens, 21);
    assert_string_equal(r.out.finish_reason, "tool_calls");
    /* computed past the prompt (input + accepted): nothing cached */
    r.plan.n_prompt_report = 0;
    res.computed = 12;
    ctl_openai_result_set(&r, &res, "stop");
    assert_int_equal(r.out.cached_tokens, 0);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_legacy_functions),
        cmocka_unit_test(test_body),
        cmocka_unit_test(test_chat_plain),
        cmocka_unit_test(test_chat_refusals),
        cmocka_unit_test(test_completion),
        cmocka_unit_test(test_sampling_ranges),
        cmocka_unit_test(test_templated),
        cmocka_unit_test(test_templated_refusals),
        cmocka_unit_test(test_result),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
