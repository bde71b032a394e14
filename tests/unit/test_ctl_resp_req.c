/*
 * Unit tests for ctl_resp_req, the POST /v1/responses body parser: the
 * accepted shapes (string input, message items with string or text-part
 * content, developer as system, every parameter the SDK may send), the
 * refusals (each naming its parameter and code), the limits, and ids.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* (cmocka needs the four above first) */
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "ctl_resp_req.h"

/* Parses text; returns the error (and fills *r / *e). */
static wk_err
parse(const char *text, const ctl_resp_limits *lim, json_t **body, ctl_resp_req *r, ctl_resp_err *e)
{
    json_error_t je;
    *body = json_loads(text, 0, &je);
    assert_non_null(*body);
    return ctl_resp_req_parse(*body, lim, r, e);
}

/* Asserts text is refused with param (and code when not NULL). */
static void
refused(const char *text, const char *param, const char *code)
{
    json_t *b = NULL;
    ctl_resp_req r;
    ctl_resp_err e;
    wk_err err = parse(text, NULL, &b, &r, &e);
    if (err == WK_OK)
        fail_msg("accepted: %s", text);
    assert_int_equal(err, e.err);
    assert_string_equal(e.param, param);
    if (code != NULL)
        assert_string_equal(e.code, code);
    assert_true(strlen(e.msg) > 0);
    assert_null(r.items); /* zeroed on failure */
    json_decref(b);
}

static void
test_string_input(void **state)
{
    (void)state;
    json_t *b = NULL;
    ctl_resp_req r;
    ctl_resp_err e;
    assert_int_equal(parse("{\"model\":\"m\",\"input\":\"hello\"}", NULL, &b, &r, &e), WK_OK);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.n_items, 1);
    assert_string_equal(r.items[0].role, "user");
    assert_string_equal(r.items[0].text, "hello");
    assert_int_equal(r.items[0].len, 5);
    assert_true(r.store); /* the default */
    assert_false(r.stream);
    assert_null(r.previous_response_id);
    assert_null(r.instructions);
    assert_int_equal(r.max_output_tokens, 0);
    assert_false(r.has_temperature);
    ctl_resp_req_fini(&r);
    ctl_resp_req_fini(&r); /* idempotent */
    json_decref(b);
}

static void
test_items_and_parameters(void **state)
{
    (void)state;
    json_t *b = NULL;
    ctl_resp_req r;
    ctl_resp_err e;
    const char *text =
        "{\"model\":\"m\",\"instructions\":\"Be brief.\",\"previous_response_id\":\"resp_ab\","
        "\"store\":false,\"stream\":true,\"max_output_tokens\":16,\"temperature\":0,"
        "\"top_p\":0.5,\"text\":{\"format\":{\"type\":\"text\"},\"verbosity\":\"low\"},"
        "\"metadata\":{\"k\":\"v\"},\"user\":\"u\",\"tools\":[{\"type\":\"function\","
        "\"name\":\"f\",\"parameters\":{}}],\"tool_choice\":\"auto\","
        "\"parallel_tool_calls\":true,\"truncation\":\"disabled\",\"include\":[],"
        "\"background\":false,\"service_tier\":\"auto\",\"prompt_cache_key\":\"p\","
        "\"safety_identifier\":\"s\",\"stream_options\":{},\"seed\":7,"
        "\"return_token_ids\":true,\"input\":["
        "{\"role\":\"developer\",\"content\":\"sys\"},"
        "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\","
        "\"text\":\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]},"
        "{\"type\":\"message\",\"id\":\"msg_1\",\"status\":\"completed\",\"role\":\"assistant\","
        "\"content\":[{\"type\":\"output_text\",\"text\":\"reply\",\"annotations\":[]}]}]}";
    json_error_t je;
    b = json_loads(text, 0, &je);
    assert_non_null(b);
    wk_err err = ctl_resp_req_parse(b, NULL, &r, &e);
    if (err != WK_OK)
        fail_msg("%s: %s", e.param, e.msg);
    assert_int_equal(r.n_items, 3);
    assert_string_equal(r.items[0].role, "system");
    assert_string_equal(r.items[0].text, "sys");
    assert_string_equal(r.items[1].text, "ab");
    assert_string_equal(r.items[2].role, "assistant");
    assert_string_equal(r.items[2].text, "reply");
    assert_string_equal(r.instructions, "Be brief.");
    assert_int_equal(r.instructions_len, 9);
    assert_string_equal(r.previous_response_id, "resp_ab");
    assert_false(r.store);
    assert_true(r.stream);
    assert_int_equal(r.max_output_tokens, 16);
    assert_true(r.has_temperature);
    assert_true(r.temperature == 0.0);
    assert_true(r.has_top_p && r.top_p == 0.5);
    assert_true(r.has_seed && r.seed == 7);
    assert_true(r.return_token_ids);
    assert_non_null(r.metadata);
    assert_string_equal(r.user, "u");
    ctl_resp_req_fini(&r);
    json_decref(b);
}

static void
test_reasoning_and_background(void **state)
{
    (void)state;
    json_t *b = NULL;
    ctl_resp_req r;
    ctl_resp_err e;
    const char *text =
        "{\"model\":\"m\",\"background\":true,\"logit_bias\":{\"511\":2.5},"
        "\"presence_penalty\":1.5,\"reasoning\":{\"effort\":\"high\","
        "\"summary\":\"auto\"},\"input\":[{\"role\":\"user\",\"content\":\"q\"},"
        "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],\"content\":[{\"type\":"
        "\"reasoning_text\",\"text\":\"th\"},{\"type\":\"reasoning_text\",\"text\":\"ink\"}]},"
        "{\"role\":\"assistant\",\"content\":\"a\"},{\"type\":\"reasoning\",\"summary\":[]},"
        "{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"call_1\",\"name\":\"f\","
        "\"arguments\":\"{\\\"a\\\": 1}\",\"status\":\"completed\"},{\"type\":"
        "\"function_call_output\",\"call_id\":\"call_1\",\"output\":[{\"type\":\"input_text\","
        "\"text\":\"o\"},{\"type\":\"input_text\",\"text\":\"k\"}]}],\"tools\":[{\"type\":"
        "\"function\",\"name\":\"f\",\"parameters\":{},\"strict\":true}],\"tool_choice\":\"none\","
        "\"parallel_tool_calls\":false}";
    json_error_t je;
    b = json_loads(text, 0, &je);
    assert_non_null(b);
    wk_err err = ctl_resp_req_parse(b, NULL, &r, &e);
    if (err != WK_OK)
        fail_msg("%s: %s", e.param, e.msg);
    assert_true(r.background);
    assert_true(r.store);
    assert_non_null(r.logit_bias);
    assert_true(r.has_presence_penalty && r.presence_penalty == 1.5);
    assert_string_equal(r.reasoning_effort, "high");
    assert_false(r.items[0].reasoning);
    assert_true(r.items[1].reasoning);
    assert_string_equal(r.items[1].role, "assistant");
    assert_string_equal(r.items[1].text, "think");
    assert_false(r.items[2].reasoning);
    assert_true(r.items[3].reasoning);
    assert_int_equal(r.items[3].len, 0);
    assert_int_equal(r.n_items, 6);
    assert_int_equal(r.items[4].kind, CTL_RESP_FUNCTION_CALL);
    assert_string_equal(r.items[4].role, "assistant");
    assert_string_equal(r.items[4].call_id, "call_1");
    assert_string_equal(r.items[4].name, "f");
    assert_string_equal(r.items[4].text, "{\"a\": 1}");
    assert_int_equal(r.items[5].kind, CTL_RESP_FUNCTION_CALL_OUTPUT);
    assert_string_equal(r.items[5].role, "tool");
    assert_string_equal(r.items[5].text, "ok");
    assert_non_null(r.tools);
    assert_true(r.tool_choice_none);
    assert_true(r.parallel_tool_calls_off);
    ctl_resp_req_fini(&r);
    json_decref(b);
}

/* tool_choice "required" or a named function: a call is to be enforced. */
static void
test_tool_choice_forced(void **state)
{
    (void)state;
    json_t *b = NULL;
    ctl_resp_req r;
    ctl_resp_err e;
    const char *tools = "\"tools\":[{\"type\":\"function\",\"name\":\"f\"},"
                        "{\"type\":\"function\",\"name\":\"g\"}]";
    char text[512];
    snprintf(text, sizeof(text),
             "{\"model\":\"m\",\"input\":\"x\",%s,\"tool_choice\":\"required\"}", tools);
    assert_int_equal(parse(text, NULL, &b, &r, &e), WK_OK);
    assert_true(r.tool_required);
    assert_null(r.tool_name);
    assert_false(r.tool_choice_none);
    ctl_resp_req_fini(&r);
    json_decref(b);
    snprintf(text, sizeof(text),
             "{\"model\":\"m\",\"input\":\"x\",%s,\"tool_choice\":{\"type\":\"function\","
             "\"name\":\"g\"},\"parallel_tool_calls\":false}",
             tools);
    assert_int_equal(parse(text, NULL, &b, &r, &e), WK_OK);
    assert_true(r.tool_required);
    assert_string_equal(r.tool_name, "g");
    assert_true(r.parallel_tool_calls_off);
    ctl_resp_req_fini(&r);
    json_decref(b);
    snprintf(text, sizeof(text), "{\"model\":\"m\",\"input\":\"x\",%s,\"tool_choice\":\"auto\"}",
             tools);
    assert_int_equal(parse(text, NULL, &b, &r, &e), WK_OK);
    assert_false(r.tool_required);
    assert_null(r.allowed_tools);
    ctl_resp_req_fini(&r);
    json_decref(b);
    /* allowed_tools: required enforces a call (to the listed ones), auto does not */
    for (int req = 0; req < 2; req++) {
        snprintf(text, sizeof(text),
                 "{\"model\":\"m\",\"input\":\"x\",%s,\"tool_choice\":{\"type\":"
                 "\"allowed_tools\",\"mode\":\"%s\",\"tools\":[{\"type\":\"function\","
                 "\"name\":\"g\"}]},\"reasoning\":{\"summary\":\"detailed\"}}",
                 tools, req ? "required" : "auto");
        assert_int_equal(parse(text, NULL, &b, &r, &e), WK_OK);
        assert_int_equal(r.tool_required, req);
        assert_int_equal(r.allowed_required, req);
        assert_null(r.tool_name);
        assert_non_null(r.allowed_tools);
        assert_int_equal(json_array_size(json_object_get(r.allowed_tools, "tools")), 1);
        assert_string_equal(r.reasoning_summary, "detailed");
        ctl_resp_req_fini(&r);
        json_decref(b);
    }
    /* background with stream: accepted (the events are logged for readers) */
    assert_int_equal(parse("{\"model\":\"m\",\"input\":\"x\",\"background\":true,"
                           "\"stream\":true}",
                           NULL, &b, &r, &e),
                     WK_OK);
    assert_true(r.background && r.stream);
    ctl_resp_req_fini(&r);
    json_decref(b);
}

static void
test_nulls_are_absent(void **state)
{
    (void)state;
    json_t *b = NULL;
    ctl_resp_req r;
    ctl_resp_err e;
    assert_int_equal(parse("{\"model\":\"m\",\"input\":\"x\",\"instructions\":null,"
                           "\"previous_response_id\":null,\"store\":null,\"temperature\":null,"
                           "\"metadata\":null,\"tools\":null,\"reasoning\":{\"effort\":null,"
                           "\"summary\":null}}",
                           NULL, &b, &r, &e),
                     WK_OK);
    assert_null(r.instructions);
    assert_null(r.previous_response_id);
    assert_true(r.store);
    assert_false(r.has_temperature);
    ctl_resp_req_fini(&r);
    json_decref(b);
}

static void
test_refusals(void **state)
{
    (void)state;
    refused("[]", "", NULL);
    refused("{\"input\":\"x\"}", "model", "missing_required_parameter");
    refused("{\"model\":\"m\"}", "input", "missing_required_parameter");
    refused("{\"model\":\"m\",\"input\":[]}", "input", NULL);
    refused("{\"model\":\"m\",\"input\":7}", "input", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"frob\":1}", "frob", "unknown_parameter");
    refused("{\"model\":\"m\",\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\"}]}",
            "input[0]", "missing_required_parameter");
    refused("{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}",
            "input[0].call_id", "missing_required_parameter");
    refused("{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\","
            "\"name\":\"f\",\"arguments\":\"[1]\"}]}",
            "input[0].arguments", NULL);
    refused("{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\","
            "\"name\":\"f\",\"arguments\":\"{}\",\"x\":1}]}",
            "input[0].x", "unknown_parameter");
    refused("{\"model\":\"m\",\"input\":[{\"type\":\"custom_tool_call\"}]}", "input[0].type", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}",
            "tools[0].type", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}",
            "tools[0].name", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\","
            "\"parameters\":1}]}",
            "tools[0]", NULL);
    refused("{\"model\":\"m\",\"input\":[{\"type\":\"reasoning\",\"encrypted_content\":\"e\"}]}",
            "input[0].encrypted_content", NULL);
    refused("{\"model\":\"m\",\"input\":[{\"type\":\"reasoning\",\"content\":[{\"type\":"
            "\"input_text\",\"text\":\"t\"}]}]}",
            "input[0].content[0].type", NULL);
    refused("{\"model\":\"m\",\"input\":[{\"type\":\"reasoning\",\"x\":1}]}", "input[0].x",
            "unknown_parameter");
    refused("{\"model\":\"m\",\"input\":[{\"type\":\"item_reference\",\"id\":\"i\"}]}",
            "input[0].type", NULL);
    refused("{\"model\":\"m\",\"input\":[{\"type\":\"zzz\"}]}", "input[0].type", NULL);
    refused("{\"model\":\"m\",\"input\":[\"x\"]}", "input[0]", NULL);
    refused("{\"model\":\"m\",\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "input[0].role",
            NULL);
    refused("{\"model\":\"m\",\"input\":[{\"role\":\"user\"}]}", "input[0]",
            "missing_required_parameter");
    refused("{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":\"x\",\"extra\":1}]}",
            "input[0].extra", "unknown_parameter");
    refused("{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
            "\"input_image\",\"image_url\":\"u\"}]}]}",
            "input[0].content[0].type", NULL);
    refused("{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
            "\"input_text\"}]}]}",
            "input[0].content[0].text", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\"}}}",
            "text.format", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"text\":{\"bogus\":1}}", "text.bogus",
            "unknown_parameter");
    refused("{\"model\":\"m\",\"input\":\"x\",\"tools\":[7]}", "tools[0].type", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"tools\":{}}", "tools", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
            "\"tool_choice\":{\"type\":\"function\",\"name\":\"g\"}}",
            "tool_choice", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
            "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\",\"strict\":true}}",
            "tool_choice", "unknown_parameter");
    refused("{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
            "\"tool_choice\":{\"type\":\"function\",\"name\":7}}",
            "tool_choice.name", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
            "\"tool_choice\":{\"type\":\"allowed_tools\",\"mode\":\"required\",\"tools\":[]}}",
            "tool_choice.tools", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
            "\"tool_choice\":{\"type\":\"allowed_tools\",\"mode\":\"any\",\"tools\":"
            "[{\"type\":\"function\",\"name\":\"f\"}]}}",
            "tool_choice.mode", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
            "\"tool_choice\":{\"type\":\"allowed_tools\",\"mode\":\"auto\",\"tools\":"
            "[{\"type\":\"function\",\"name\":\"g\"}]}}",
            "tool_choice.tools[0]", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
            "\"tool_choice\":{\"type\":\"allowed_tools\",\"mode\":\"auto\",\"tools\":"
            "[{\"type\":\"function\",\"name\":\"f\",\"x\":1}]}}",
            "tool_choice.tools[0]", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
            "\"tool_choice\":{\"type\":\"allowed_tools\",\"mode\":\"auto\",\"tools\":"
            "[{\"type\":\"function\",\"name\":\"f\"}],\"strict\":1}}",
            "tool_choice.strict", "unknown_parameter");
    refused("{\"model\":\"m\",\"input\":\"x\",\"reasoning\":{\"summary\":\"brief\"}}",
            "reasoning.summary", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"tool_choice\":\"required\"}", "tool_choice", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"tool_choice\":\"always\"}", "tool_choice", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"reasoning\":{\"effort\":\"huge\"}}",
            "reasoning.effort", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"reasoning\":{\"summary\":1}}", "reasoning.summary",
            NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"reasoning\":{\"depth\":1}}", "reasoning.depth",
            "unknown_parameter");
    refused("{\"model\":\"m\",\"input\":\"x\",\"reasoning\":\"high\"}", "reasoning", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"background\":true,\"store\":false}", "background",
            NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"background\":1}", "background", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"logit_bias\":{\"a\":1}}", "logit_bias", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"logit_bias\":{\"5\":101}}", "logit_bias", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"logit_bias\":[1]}", "logit_bias", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"frequency_penalty\":3}", "frequency_penalty", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"include\":[\"x\"]}", "include", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"conversation\":\"c\"}", "conversation", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"temperature\":2.5}", "temperature", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"top_p\":\"1\"}", "top_p", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":1.5}", "max_output_tokens",
            NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"store\":1}", "store", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"previous_response_id\":5}", "previous_response_id",
            NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"metadata\":{\"k\":1}}", "metadata", NULL);
    refused("{\"model\":\"m\",\"input\":\"x\",\"stream_options\":{}}", "stream_options", NULL);
}

static void
test_limits(void **state)
{
    (void)state;
    ctl_resp_limits lim = {.max_items = 2, .max_item_bytes = 4, .max_tokens = 10};
    json_t *b = NULL;
    ctl_resp_req r;
    ctl_resp_err e;
    assert_int_equal(parse("{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":\"a\"},"
                           "{\"role\":\"user\",\"content\":\"b\"},{\"role\":\"user\","
                           "\"content\":\"c\"}]}",
                           &lim, &b, &r, &e),
                     WK_ETOOBIG);
    assert_string_equal(e.param, "input");
    json_decref(b);
    assert_int_equal(parse("{\"model\":\"m\",\"input\":\"abcde\"}", &lim, &b, &r, &e), WK_ETOOBIG);
    json_decref(b);
    assert_int_equal(parse("{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
                           "\"input_text\",\"text\":\"abc\"},{\"type\":\"input_text\","
                           "\"text\":\"de\"}]}]}",
                           &lim, &b, &r, &e),
                     WK_ETOOBIG);
    json_decref(b);
    assert_int_equal(
        parse("{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":11}", &lim, &b, &r, &e),
        WK_EINVAL);
    assert_string_equal(e.param, "max_output_tokens");
    json_decref(b);
    assert_int_equal(
        parse("{\"model\":\"m\",\"input\":\"abcd\",\"max_output_tokens\":10}", &lim, &b, &r, &e),
        WK_OK);
    ctl_resp_req_fini(&r);
    json_decref(b);
}

static void
test_ids(void **state)
{
    (void)state;
    assert_true(ctl_resp_id_valid("resp_0123abcdef"));
    assert_false(ctl_resp_id_valid("resp_"));
    assert_false(ctl_resp_id_valid("resp_ABC"));
    assert_false(ctl_resp_id_valid("resp_../x"));
    assert_false(ctl_resp_id_valid("msg_abc"));
    assert_false(ctl_resp_id_valid(NULL));
    char longid[CTL_RESP_ID_MAX + 8];
    memcpy(longid, "resp_", 5);
    memset(longid + 5, 'a', sizeof(longid) - 6);
    longid[sizeof(longid) - 1] = '\0';
    assert_false(ctl_resp_id_valid(longid));
    longid[CTL_RESP_ID_MAX] = '\0';
    assert_true(ctl_resp_id_valid(longid));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_string_input),
        cmocka_unit_test(test_items_and_parameters),
        cmocka_unit_test(test_tool_choice_forced),
        cmocka_unit_test(test_nulls_are_absent),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_ids),
        cmocka_unit_test(test_reasoning_and_background),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
