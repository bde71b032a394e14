/*
 * Unit tests for wk_toolcall: format detection from template sources, the
 * parse of each format (exact content and calls, arguments typed by the
 * schema in the XML format), malformed calls coming back as content byte for
 * byte, the whitespace separator rule, and the same result for every cut of
 * a reply into two feeds and for byte-by-byte feeding.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wk_toolcall.h"

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\":"
    " {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"},"
    " \"days\": {\"type\": \"integer\"}, \"metric\": {\"type\": \"boolean\"},"
    " \"scale\": {\"type\": [\"number\", \"null\"]}, \"opts\": {\"type\": \"object\"},"
    " \"tags\": {\"type\": \"array\"}, \"code\": {\"type\": \"string\"}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"now\"}}]";

/* Result of a parse: the content, then per call "[name](arguments)". */
typedef struct tc_res {
    char content[4096];
    size_t content_len;
    char calls[4096];
    char deltas[4096]; /* an eager parser's deltas, spelled as calls are */
    bool open;         /* deltas: a call is open */
    bool aborted;      /* an eager feed said aborted */
} tc_res;

static bool eager; /* parse() makes eager parsers */

static void
res_add(tc_res *r, wk_toolcall_out *o)
{
    assert_true(r->content_len + o->content_len < sizeof(r->content));
    assert_int_equal(strlen(o->content) <= o->content_len, 1);
    memcpy(r->content + r->content_len, o->content, o->content_len);
    r->content_len += o->content_len;
    r->content[r->content_len] = '\0';
    for (size_t i = 0; i < o->n_calls; i++) {
        size_t l = strlen(r->calls);
        snprintf(r->calls + l, sizeof(r->calls) - l, "[%s](%s)", o->calls[i].name,
                 o->calls[i].arguments);
    }
    for (size_t i = 0; i < o->n_deltas; i++) {
        size_t l = strlen(r->deltas);
        if (o->deltas[i].name != NULL)
            snprintf(r->deltas + l, sizeof(r->deltas) - l, "%s[%s](", r->open ? ")" : "",
                     o->deltas[i].name);
        else
            assert_true(r->open);
        r->open = true;
        l = strlen(r->deltas);
        snprintf(r->deltas + l, sizeof(r->deltas) - l, "%s", o->deltas[i].arguments);
    }
    r->aborted |= o->aborted;
    wk_toolcall_out_fini(o);
}

/* Parses text fed as cuts: pieces of `step` bytes (0: whole), or cut at `cut` (when step is 1 << 30). */
static void
parse(wk_toolcall_fmt fmt, const char *tools, const char *text, size_t len, size_t step,
      size_t cut, tc_res *r)
{
    memset(r, 0, sizeof(*r));
    json_error_t je;
    json_t *t = tools != NULL ? json_loads(tools, 0, &je) : NULL;
    assert_true(tools == NULL || t != NULL);
    wk_toolcall_parser *p = NULL;
    assert_int_equal(eager ? wk_toolcall_parser_new_eager(fmt, t, &p)
                           : wk_toolcall_parser_new(fmt, t, &p),
                     WK_OK);
    wk_toolcall_out o;
    if (step == 0) {
        assert_int_equal(wk_toolcall_feed(p, text, len, true, &o), WK_OK);
        res_add(r, &o);
    } else if (step == ((size_t)1 << 30)) {
        assert_int_equal(wk_toolcall_feed(p, text, cut, false, &o), WK_OK);
        res_add(r, &o);
        assert_int_equal(wk_toolcall_feed(p, text + cut, len - cut, true, &o), WK_OK);
        res_add(r, &o);
    } else {
        for (size_t i = 0; i < len; i += step) {
            size_t n = len - i < step ? len - i : step;
            assert_int_equal(wk_toolcall_feed(p, text + i, n, false, &o), WK_OK);
            res_add(r, &o);
        }
        assert_int_equal(wk_toolcall_feed(p, "", 0, true, &o), WK_OK);
        res_add(r, &o);
    }
    wk_toolcall_parser_free(p);
    json_decref(t);
    if (r->open) {
        size_t l = strlen(r->deltas);
        snprintf(r->deltas + l, sizeof(r->deltas) - l, ")");
    }
    /* an eager parser's deltas spell its calls, unless one was aborted */
    if (eager && !r->aborted)
        assert_string_equal(r->deltas, r->calls);
}

/* Checks text parses to content and calls, whole, at every cut, and byte by byte. */
static void
check(wk_toolcall_fmt fmt, const char *tools, const char *text, const char *content,
      const char *calls)
{
    size_t len = strlen(text);
    tc_res r;
    parse(fmt, tools, text, len, 0, 0, &r);
    if (strcmp(r.content, content) != 0 || strcmp(r.calls, calls) != 0)
        fail_msg("text %s\ncontent got  [%s]\n        want [%s]\ncalls got  %s\n      want %s",
                 text, r.content, content, r.calls, calls);
    for (size_t cut = 0; cut <= len; cut++) {
        parse(fmt, tools, text, len, (size_t)1 << 30, cut, &r);
        if (strcmp(r.content, content) != 0 || strcmp(r.calls, calls) != 0)
            fail_msg("cut at %zu of %s: content [%s] calls %s", cut, text, r.content, r.calls);
    }
    for (size_t step = 1; step <= 3; step++) {
        parse(fmt, tools, text, len, step, 0, &r);
        assert_string_equal(r.content, content);
        assert_string_equal(r.calls, calls);
    }
    if (!eager) { /* the same with an eager parser: same content and calls, deltas spelling them */
        eager = true;
        check(fmt, tools, text, content, calls);
        eager = false;
    }
}

static void
test_detect(void **state)
{
    (void)state;
    /* (the distinguishing lines of llama.cpp's models/templates/ sources) */
    assert_int_equal(wk_toolcall_fmt_detect("{{- '<tool_call>\\n<function=' + tool_call.name + "
                                            "'>\\n' }}{{- '<parameter=' + args_name }}"),
                     WK_TOOLCALL_FMT_XML);
    assert_int_equal(wk_toolcall_fmt_detect("{{- '<tool_call>\\n{\"name\": \"' }}<|im_start|>"),
                     WK_TOOLCALL_FMT_HERMES);
    assert_int_equal(wk_toolcall_fmt_detect("'<|start_of_role|>' {{- '<tool_call>\\n{\"name\": \"' }}"),
                     WK_TOOLCALL_FMT_GRANITE);
    assert_int_equal(wk_toolcall_fmt_detect("{{- '<TOOLCALL>[' -}}<tool_call>"),
                     WK_TOOLCALL_FMT_NEMOTRON);
    assert_int_equal(wk_toolcall_fmt_detect("{{ messages }}"), WK_TOOLCALL_FMT_NONE);
    /* GLM-style <tool_call>NAME<arg_key>: another format, not parsed */
    assert_int_equal(wk_toolcall_fmt_detect("{{- '<tool_call>' + tc.name }}<arg_key>"),
                     WK_TOOLCALL_FMT_NONE);
    assert_int_equal(wk_toolcall_fmt_detect("'<tool_call>\\n{\\\"name\\\": \\\"x'"),
                     WK_TOOLCALL_FMT_HERMES);
    assert_int_equal(wk_toolcall_fmt_detect(NULL), WK_TOOLCALL_FMT_NONE);
    assert_string_equal(wk_toolcall_fmt_name(WK_TOOLCALL_FMT_XML), "xml");
    assert_string_equal(wk_toolcall_fmt_name(WK_TOOLCALL_FMT_NEMOTRON), "nemotron");
    assert_true(wk_toolcall_tpl_object_args("{% for k, v in tool_call.arguments|items %}"));
    assert_false(wk_toolcall_tpl_object_args("{% if tool_call.arguments is string %}"));
    wk_toolcall_parser *p = NULL;
    assert_int_equal(wk_toolcall_parser_new(WK_TOOLCALL_FMT_NONE, NULL, &p), WK_EINVAL);
    assert_null(p);
}

static void
test_xml(void **state)
{
    (void)state;
    /* the bytes Qwen3.5's template renders for content and one call */
    check(WK_TOOLCALL_FMT_XML, TOOLS,
          "Let me look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
          "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
          "Let me look.", "[get_weather]({\"city\": \"Paris\", \"days\": 3})");
    /* typed by the schema: strings stay strings, Python literals read as JSON */
    check(WK_TOOLCALL_FMT_XML, TOOLS,
          "<tool_call>\n<function=get_weather>\n<parameter=code>\n42\n</parameter>\n"
          "<parameter=metric>\nTrue\n</parameter>\n<parameter=scale>\nNone\n</parameter>\n"
          "<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=tags>\n[\"x\"]\n"
          "</parameter>\n</function>\n</tool_call>",
          "",
          "[get_weather]({\"code\": \"42\", \"metric\": true, \"scale\": null, \"opts\": {\"a\": "
          "[1, 2]}, \"tags\": [\"x\"]})");
    /* a value that is not its type stays a string; an untyped key stays a string */
    check(WK_TOOLCALL_FMT_XML, TOOLS,
          "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n"
          "<parameter=extra>\n7\n</parameter>\n<parameter=scale>\n1.50\n</parameter>\n"
          "</function>\n</tool_call>",
          "", "[get_weather]({\"days\": \"three\", \"extra\": \"7\", \"scale\": 1.50})");
    /* multi-line values keep their inner lines; quotes and tabs escaped */
    check(WK_TOOLCALL_FMT_XML, TOOLS,
          "<tool_call>\n<function=get_weather>\n<parameter=city>\nline \"1\"\n\tline 2\n\n"
          "</parameter>\n</function>\n</tool_call>",
          "", "[get_weather]({\"city\": \"line \\\"1\\\"\\n\\tline 2\\n\"})");
    /* two calls joined with "\n", no arguments, content after */
    check(WK_TOOLCALL_FMT_XML, TOOLS,
          "<tool_call>\n<function=now>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n"
          "</function>\n</tool_call>\n",
          "", "[now]({})[now]({})");
    /* without tools: any name, every value a string */
    check(WK_TOOLCALL_FMT_XML, NULL,
          "<tool_call><function=f><parameter=x>1</parameter></function></tool_call>", "",
          "[f]({\"x\": \"1\"})");
    /* complete but never closed when the reply ends: a call */
    check(WK_TOOLCALL_FMT_XML, TOOLS, "ok <tool_call>\n<function=now>\n</function>\n", "ok",
          "[now]({})");
}

static void
test_malformed(void **state)
{
    (void)state;
    static const char *const bad[] = {
        /* not offered, no function, a key twice, an unclosed parameter, text after */
        "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>",
        "<tool_call>\nhello\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\na\n</parameter>\n"
        "<parameter=city>\nb\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\na\n</function>\n</tool_call>",
        "<tool_call>\n<function=now>\n</function>\nthen\n</tool_call>",
        "<tool_call>\n<function=now>\n<parameter=x>\n\xff\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_",
        "<tool_call>",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[512];
        snprintf(text, sizeof(text), "A %s Z", bad[i]);
        /* (an unclosed one ends the reply: " Z" is inside it) */
        check(WK_TOOLCALL_FMT_XML, TOOLS, text, text, "");
    }
    check(WK_TOOLCALL_FMT_HERMES, TOOLS, "<tool_call>\n{\"name\": \"now\", \"arguments\": 3}\n</tool_call>",
          "<tool_call>\n{\"name\": \"now\", \"arguments\": 3}\n</tool_call>", "");
    check(WK_TOOLCALL_FMT_HERMES, TOOLS, "<tool_call>{\"name\": \"now\"</tool_call>x",
          "<tool_call>{\"name\": \"now\"</tool_call>x", "");
    check(WK_TOOLCALL_FMT_NEMOTRON, TOOLS, "<TOOLCALL>[]</TOOLCALL>", "<TOOLCALL>[]</TOOLCALL>", "");
    /* a bad call among good ones: the block is content, the good call before it stays */
    check(WK_TOOLCALL_FMT_NEMOTRON, TOOLS,
          "<TOOLCALL>[{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"x\"}]</TOOLCALL>",
          "<TOOLCALL>[{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"x\"}]</TOOLCALL>", "");
}

static void
test_json_formats(void **state)
{
    (void)state;
    /* Hermes / Qwen2.5 / Qwen3: the model's bytes of the arguments kept */
    check(WK_TOOLCALL_FMT_HERMES, TOOLS,
          "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\","
          "\"scale\":0.10}}\n</tool_call>",
          "Sure.", "[get_weather]({\"city\": \"Paris\",\"scale\":0.10})");
    /* arguments as a JSON string, or absent */
    check(WK_TOOLCALL_FMT_GRANITE, TOOLS,
          "<tool_call>\n{\"arguments\": \"{\\\"days\\\": 2}\", \"name\": \"get_weather\"}\n"
          "</tool_call>\n<tool_call>\n{\"name\": \"now\"}\n</tool_call>",
          "", "[get_weather]({\"days\": 2})[now]({})");
    /* Nemotron Nano v2: all calls in one block */
    check(WK_TOOLCALL_FMT_NEMOTRON, TOOLS,
          "<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, "
          "{\"name\": \"now\", \"arguments\": {}}]</TOOLCALL>",
          "", "[get_weather]({\"city\": \"Rome\"})[now]({})");
    /* the other format's markers are content */
    check(WK_TOOLCALL_FMT_NEMOTRON, TOOLS, "<tool_call>{\"name\": \"now\"}</tool_call>",
          "<tool_call>{\"name\": \"now\"}</tool_call>", "");
}

static void
test_plain(void **state)
{
    (void)state;
    /* without calls the reply is content byte for byte, whitespace and all */
    check(WK_TOOLCALL_FMT_XML, TOOLS, "  Hello,\n world <tool_ \n\n", "  Hello,\n world <tool_ \n\n",
          "");
    check(WK_TOOLCALL_FMT_XML, TOOLS, "<tool_cal", "<tool_cal", "");
    check(WK_TOOLCALL_FMT_XML, TOOLS, "", "", "");
    check(WK_TOOLCALL_FMT_XML, TOOLS, " \n", " \n", "");
    /* whitespace around calls separates; content between calls is kept */
    check(WK_TOOLCALL_FMT_XML, TOOLS,
          "a \n<tool_call><function=now></function></tool_call>\n b \n"
          "<tool_call><function=now></function></tool_call>\n\n",
          "ab", "[now]({})[now]({})");
    /* a NUL in content passes */
    tc_res r;
    parse(WK_TOOLCALL_FMT_XML, TOOLS, "a\0b", 3, 0, 0, &r);
    assert_int_equal(r.content_len, 3);
    assert_memory_equal(r.content, "a\0b", 3);
}

static void
test_json_str(void **state)
{
    (void)state;
    char *b = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(wk_toolcall_json_str(&b, &n, &cap, "a\"\\\n\r\t\b\f\x01\x7f\xc3\xa9", 12),
                     WK_OK);
    assert_string_equal(b, "\"a\\\"\\\\\\n\\r\\t\\b\\f\\u0001\x7f\xc3\xa9\"");
    assert_int_equal(n, strlen(b));
    assert_int_equal(wk_toolcall_json_str(&b, &n, &cap, "\xc3", 1), WK_EINVAL);
    free(b);
}

/* A stream's feeds: each call is reported once, when complete, never before. */
static void
test_stream_order(void **state)
{
    (void)state;
    json_error_t je;
    json_t *t = json_loads(TOOLS, 0, &je);
    wk_toolcall_parser *p = NULL;
    assert_int_equal(wk_toolcall_parser_new(WK_TOOLCALL_FMT_XML, t, &p), WK_OK);
    wk_toolcall_out o;
    assert_int_equal(wk_toolcall_feed(p, "Hi <tool_call>\n<function=now>\n", 30, false, &o), WK_OK);
    assert_string_equal(o.content, "Hi");
    assert_int_equal(o.n_calls, 0);
    wk_toolcall_out_fini(&o);
    assert_int_equal(wk_toolcall_feed(p, "</function>\n</tool", 18, false, &o), WK_OK);
    assert_int_equal(o.n_calls, 0);
    wk_toolcall_out_fini(&o);
    assert_int_equal(wk_toolcall_feed(p, "_call>", 6, false, &o), WK_OK);
    assert_int_equal(o.n_calls, 1);
    assert_string_equal(o.calls[0].name, "now");
    assert_string_equal(o.content, "");
    wk_toolcall_out_fini(&o);
    assert_int_equal(wk_toolcall_count(p), 1);
    assert_int_equal(wk_toolcall_feed(p, "", 0, true, &o), WK_OK);
    assert_int_equal(o.n_calls, 0);
    wk_toolcall_out_fini(&o);
    wk_toolcall_parser_free(p);
    json_decref(t);
}

/* An eager parser reports the name, then each argument as it completes. */
static void
test_eager(void **state)
{
    (void)state;
    json_error_t je;
    json_t *t = json_loads(TOOLS, 0, &je);
    wk_toolcall_parser *p = NULL;
    assert_int_equal(wk_toolcall_parser_new_eager(WK_TOOLCALL_FMT_XML, t, &p), WK_OK);
    static const struct {
        const char *in, *name, *args; /* one feed; the one delta it reports (NULL: none) */
    } steps[] = {
        {"Hi\n\n<tool_call>\n<function=get_wea", NULL, NULL},
        {"ther>\n<parameter=city>\nPar", "get_weather", ""},
        {"is\n</parameter>\n", NULL, "{\"city\": \"Paris\""},
        {"<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", NULL, NULL},
    };
    for (size_t i = 0; i < 4; i++) {
        wk_toolcall_out o;
        assert_int_equal(wk_toolcall_feed(p, steps[i].in, strlen(steps[i].in), false, &o), WK_OK);
        if (i < 3) {
            assert_int_equal(o.n_deltas, steps[i].args != NULL ? 1 : 0);
            if (steps[i].args != NULL) {
                assert_int_equal(o.deltas[0].index, 0);
                if (steps[i].name != NULL)
                    assert_string_equal(o.deltas[0].name, steps[i].name);
                else
                    assert_null(o.deltas[0].name);
                assert_string_equal(o.deltas[0].arguments, steps[i].args);
            }
        } else { /* the last argument, the close, and the completed call */
            assert_int_equal(o.n_deltas, 2);
            assert_string_equal(o.deltas[0].arguments, ", \"days\": 3");
            assert_string_equal(o.deltas[1].arguments, "}");
            assert_int_equal(o.n_calls, 1);
            assert_string_equal(o.calls[0].arguments, "{\"city\": \"Paris\", \"days\": 3}");
        }
        assert_false(o.aborted);
        wk_toolcall_out_fini(&o);
    }
    /* malformed after its name was reported: content, and the feed says aborted */
    wk_toolcall_out o;
    static const char bad[] = "<tool_call>\n<function=now>\ntext\n</tool_call>";
    assert_int_equal(wk_toolcall_feed(p, bad, strlen(bad), true, &o), WK_OK);
    assert_true(o.aborted);
    assert_string_equal(o.content, bad);
    assert_int_equal(o.n_calls, 0);
    assert_int_equal(o.n_deltas, 1);
    assert_int_equal(o.deltas[0].index, 1);
    assert_string_equal(o.deltas[0].name, "now");
    wk_toolcall_out_fini(&o);
    wk_toolcall_parser_free(p);
    json_decref(t);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect),      cmocka_unit_test(test_xml),
        cmocka_unit_test(test_malformed),   cmocka_unit_test(test_json_formats),
        cmocka_unit_test(test_plain),       cmocka_unit_test(test_json_str),
        cmocka_unit_test(test_stream_order), cmocka_unit_test(test_eager),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
