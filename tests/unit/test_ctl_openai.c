/*
 * test_ctl_openai: the common fields of a generation request parsed without
 * a connection (ctl_openai_parse_common_value(), which the routes'
 * ctl_openai_parse_common() wraps): defaults for chat and completions, every
 * sampling field, stop strings, max_completion_tokens over max_tokens,
 * logit_bias against the tokenizer's vocab, stream options, the cache
 * switches, and each refusal with the code, "param" and message the route
 * answers (the first error in the route's order).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ctl_app.h"
#include "ctl_err.h"
#include "ctl_openai.h"
#include "wk_json.h"
#include "wk_tok.h"

static ctl_app app;

static int
setup(void **state)
{
    (void)state;
    /* a World vocab of the 256 single bytes: ids 1..256 */
    char *v = malloc(256 * 24);
    size_t n = 0;
    for (int i = 0; i < 256; i++)
        n += (size_t)snprintf(v + n, 24, "%d b'\\x%02x' 1\n", i + 1, i);
    wk_diag d = {{0}};
    memset(&app, 0, sizeof(app));
    if (wk_tok_load_mem(v, n, &app.tok, &d) != WK_OK)
        fail_msg("vocab: %s", d.msg);
    free(v);
    app.model_id = "m";
    app.default_max_tokens = 64;
    app.max_tokens_limit = 4096;
    app.max_stop_bytes = 8;
    return 0;
}

static int
teardown(void **state)
{
    (void)state;
    wk_tok_free(app.tok);
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
    r->chat = chat;
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
    assert_true(r.legacy_fn);
    assert_true(r.tool_serial);
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
    assert_false(r.legacy_fn);
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
    assert_string_equal(r.model, "m");
    assert_int_equal(r.gen.max_tokens, 64); /* chat: the server's default */
    assert_true(r.gen.sample.temperature == 1.0f);
    assert_true(r.gen.sample.top_p == 1.0f);
    assert_true(r.gen.sample.min_p == 0.0f);
    assert_int_equal(r.gen.sample.top_k, 0);
    assert_int_equal(r.gen.n_stops, 0);
    assert_int_equal(r.gen.sample.n_bias, 0);
    assert_false(r.stream);
    assert_false(r.include_usage);
    assert_true(r.cache);
    assert_true(r.gen.stop_on_eot);
    json_decref(b);
    /* completions: OpenAI's 16 */
    assert_true(parse("{\"model\":\"m\",\"prompt\":\"x\"}", false, &r, &pe, &b));
    assert_int_equal(r.gen.max_tokens, 16);
    json_decref(b);
    /* model may be absent where the route allows it (the state routes) */
    json_t *o = json_object();
    memset(&r, 0, sizeof(r));
    r.model_optional = true;
    assert_true(ctl_openai_parse_common_value(&app, o, &r, &pe));
    assert_string_equal(r.model, "m");
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
    const ctl_sample_spec *sp = &r.gen.sample;
    assert_true(sp->temperature == 0.0f);
    assert_true(sp->top_p == 0.5f);
    assert_true(sp->min_p == 0.1f);
    assert_int_equal(sp->top_k, 0); /* -1: off */
    assert_true(sp->presence_penalty == 1.5f);
    assert_true(sp->frequency_penalty == -2.0f);
    assert_int_equal(sp->seed, 42);
    assert_int_equal(r.gen.max_tokens, 9); /* max_completion_tokens wins */
    assert_int_equal(r.gen.n_stops, 2);
    assert_string_equal(r.gen.stops[1], "bc");
    assert_true(r.stream);
    assert_true(r.include_usage);
    assert_true(r.ignore_eos);
    assert_false(r.gen.stop_on_eot);
    assert_true(r.return_token_ids);
    assert_false(r.cache);
    assert_int_equal(sp->n_bias, 2);
    assert_int_equal(sp->bias[0].token, 5);
    assert_true(sp->bias[0].bias == 10.0f);
    assert_int_equal(sp->bias[1].token, 256);
    json_decref(b);
    /* one stop string; cache false wins over cache_prompt */
    assert_true(parse("{\"model\":\"m\",\"stop\":\"\\n\",\"cache\":false,\"cache_prompt\":true}",
                      true, &r, &pe, &b));
    assert_int_equal(r.gen.n_stops, 1);
    assert_string_equal(r.gen.stops[0], "\n");
    assert_false(r.cache);
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

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_legacy_functions),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
