/*
 * Unit tests for wk_grammar: both call formats x the schema types, accepted
 * and refused bytes, schema constructs refused at compile time, and the
 * allowed-token set on toy vocabs (multi-byte tokens straddling structure)
 * checked against a brute-force advance of every token, along random walks
 * that must always end in a complete, schema-valid call.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_grammar.h"
#include "wk_toolcall.h"

static const char *const TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\",\"description\":\"c\"},"
    "\"days\":{\"type\":\"integer\"},"
    "\"unit\":{\"enum\":[\"c\",\"f\"]},"
    "\"temp\":{\"type\":\"number\"},"
    "\"level\":{\"enum\":[1,10,100]},"
    "\"ok\":{\"type\":\"boolean\"},"
    "\"none\":{\"type\":\"null\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
    "\"opt\":{\"type\":[\"string\",\"null\"]},"
    "\"pos\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},"
    "\"y\":{\"type\":\"number\"}},\"required\":[\"x\"]}},"
    "\"required\":[\"city\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"ping\"}}]";

static wk_grammar *
compile(wk_toolcall_fmt fmt, const char *tools, const char *fn, bool parallel)
{
    wk_grammar_spec sp = {.format = fmt, .tools = tools, .tools_len = strlen(tools),
                          .function = fn, .parallel = parallel};
    wk_grammar *g = NULL;
    wk_diag d = {{0}};
    wk_err err = wk_grammar_compile(&sp, &g, &d);
    if (err != WK_OK)
        fail_msg("compile: %s", d.msg);
    return g;
}

/* 1: the whole text is taken and accepted; 0: taken, not accepting; -1: refused. */
static int
run(const wk_grammar *g, const char *text)
{
    wk_gmatch *m = wk_gmatch_new(g);
    assert_non_null(m);
    int r = -1;
    if (wk_gmatch_advance(m, (const uint8_t *)text, strlen(text)))
        r = wk_gmatch_accepting(m) ? 1 : 0;
    wk_gmatch_free(m);
    return r;
}

static void
test_json_format(void **state)
{
    (void)state;
    wk_grammar *g = compile(WK_TOOLCALL_FMT_HERMES, TOOLS, NULL, false);
    const char *pre = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ";
    char buf[1024];
#define ARGS(a) (snprintf(buf, sizeof(buf), "%s%s}\n</tool_call>", pre, a), buf)
    assert_int_equal(run(g, ARGS("{\"city\": \"Paris\"}")), 1);
    assert_int_equal(run(g, ARGS("{ \"city\" :\"P\\u00e9\\n\\\"x\" , \"days\":-3}")), 1);
    assert_int_equal(run(g, ARGS("{\"days\":3,\"city\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}")), 1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"temp\":-0.5e+3,\"ok\":true,\"none\":null}")), 1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"level\":10,\"unit\":\"f\"}")), 1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"level\":1}")), 1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"tags\":[\"x\", \"y\"],\"opt\":null}")), 1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"tags\":[],\"pos\":{\"y\":1,\"x\":2.25}}")), 1);
    /* Refused: a missing required property, an unknown or repeated one, bad numbers. */
    assert_int_equal(run(g, ARGS("{}")), -1);
    assert_int_equal(run(g, ARGS("{\"days\":1}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"zzz\":1}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"city\":\"b\"}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"days\":01}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"days\":1.5}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"temp\":1.}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"temp\":+1}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"level\":5}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"unit\":\"k\"}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":1}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"ok\":True}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"pos\":{\"y\":1}}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a\",\"tags\":[1]}")), -1);
    /* Strings: no raw control bytes, no surrogate or NUL escapes, valid UTF-8 only. */
    assert_int_equal(run(g, ARGS("{\"city\":\"a\nb\"}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"\\ud800\"}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"\\u0000\"}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"\\u0001\\uFFFF\\uD7ff\"}")), 1);
    assert_int_equal(run(g, ARGS("{\"city\":\"\xc0\xaf\"}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"\xed\xa0\x80\"}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"\xe2\x82\"}")), -1);
    /* The close marker ends a call for the parser: inside a string only escaped. */
    assert_int_equal(run(g, ARGS("{\"city\":\"a</tool_call>\"}")), -1);
    assert_int_equal(run(g, ARGS("{\"city\":\"a<\\/tool_call></tool_cal <</tool\"}")), 1);
    /* Whitespace is free up to WK_GRAMMAR_WS_MAX bytes in a row. */
    assert_int_equal(run(g, ARGS("{        \"city\":\"a\"}")), 1);
    assert_int_equal(run(g, ARGS("{         \"city\":\"a\"}")), -1);
    /* Other functions; a function without parameters takes {}. */
    assert_int_equal(run(g, "<tool_call>\n{\"name\": \"get\", \"arguments\": {}}\n</tool_call>"), 1);
    assert_int_equal(run(g, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"), 1);
    assert_int_equal(run(g, "<tool_call>\n{\"name\": \"pong\", \"arguments\": {}}\n</tool_call>"), -1);
    /* Prefixes are taken but not accepted; one call only without parallel. */
    assert_int_equal(run(g, "<tool_call>\n{\"name\": \"ge"), 0);
    const char *one = "<tool_call>\n{\"name\": \"get\", \"arguments\": {}}\n</tool_call>";
    snprintf(buf, sizeof(buf), "%s\n%s", one, one);
    assert_int_equal(run(g, buf), -1);
    wk_gmatch *m = wk_gmatch_new(g);
    assert_true(wk_gmatch_advance(m, (const uint8_t *)one, strlen(one)));
    assert_true(wk_gmatch_done(m));
    /* A refused advance leaves the matcher unchanged. */
    assert_false(wk_gmatch_advance(m, (const uint8_t *)"\n", 1));
    assert_true(wk_gmatch_accepting(m));
    wk_gmatch_free(m);
    wk_grammar_free(g);
    /* Parallel: several calls separated by "\n"; not done after one. */
    g = compile(WK_TOOLCALL_FMT_HERMES, TOOLS, NULL, true);
    assert_int_equal(run(g, buf), 1);
    m = wk_gmatch_new(g);
    assert_true(wk_gmatch_advance(m, (const uint8_t *)one, strlen(one)));
    assert_true(wk_gmatch_accepting(m));
    assert_false(wk_gmatch_done(m));
    wk_gmatch_free(m);
    wk_grammar_free(g);
    /* Nemotron: every call in one JSON array block, joined by ", ". */
    g = compile(WK_TOOLCALL_FMT_NEMOTRON, TOOLS, NULL, true);
    assert_int_equal(run(g, "<TOOLCALL>[{\"name\": \"get\", \"arguments\": {}}]</TOOLCALL>"), 1);
    assert_int_equal(run(g, "<TOOLCALL>[{\"name\": \"get\", \"arguments\": {}}, {\"name\": "
                            "\"get_weather\", \"arguments\": {\"city\": \"x\"}}]</TOOLCALL>"), 1);
    assert_int_equal(run(g, "<TOOLCALL>[]</TOOLCALL>"), -1);
    assert_int_equal(run(g, "<TOOLCALL>[{\"name\": \"get\", \"arguments\": {}}]"), 0);
    wk_grammar_free(g);
    g = compile(WK_TOOLCALL_FMT_NEMOTRON, TOOLS, NULL, false);
    assert_int_equal(run(g, "<TOOLCALL>[{\"name\": \"get\", \"arguments\": {}}, {\"name\": "
                            "\"get\", \"arguments\": {}}]</TOOLCALL>"), -1);
    wk_grammar_free(g);
    /* A named function: only that one. */
    g = compile(WK_TOOLCALL_FMT_HERMES, TOOLS, "get", false);
    assert_int_equal(run(g, one), 1);
    assert_int_equal(run(g, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"), -1);
    wk_grammar_free(g);
#undef ARGS
}

static void
test_xml_format(void **state)
{
    (void)state;
    wk_grammar *g = compile(WK_TOOLCALL_FMT_XML, TOOLS, NULL, false);
    assert_int_equal(run(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                            "</parameter>\n</function>\n</tool_call>"), 1);
    /* Raw strings span lines and may hold "<" and "</param"; never "</parameter>" inside. */
    assert_int_equal(run(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\na "
                            "</parameter>"), -1);
    assert_int_equal(run(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                            "</parameter>"), -1);
    assert_int_equal(run(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\n\n"
                            "</parameter>\n</function>\n</tool_call>"), 1);
    assert_int_equal(run(g, "<tool_call>\n<function=get_weather>\n<parameter=days>\n12\n"
                            "</parameter>\n<parameter=city>\na\nb </param <x>\n<\n\n"
                            "</parameter>\n<parameter=unit>\nf\n</parameter>\n"
                            "<parameter=level>\n10\n</parameter>\n<parameter=tags>\n[\"a\"]\n"
                            "</parameter>\n<parameter=ok>\nfalse\n</parameter>\n"
                            "</function>\n</tool_call>"), 1);
    /* Nor the call's closing tags, where the reply parser would end the call; other tags may. */
    assert_int_equal(run(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\nx"
                            "</tool_call>"), -1);
    assert_int_equal(run(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n"
                            "</function>"), -1);
    assert_int_equal(run(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                            "</div></func</tool_cal <</function\n"
                            "</parameter>\n</function>\n</tool_call>"), 1);
    /* The required parameter is missing: "</function>" is refused. */
    assert_int_equal(run(g, "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"), -1);
    assert_int_equal(run(g, "<tool_call>\n<function=get_weather>\n<parameter=days>\nx\n"
                            "</parameter>\n"), -1);
    assert_int_equal(run(g, "<tool_call>\n<function=get_weather>\n<parameter=bad>\n"), -1);
    assert_int_equal(run(g, "<tool_call>\n<function=get_weather>\n<parameter=unit>\nk\n"), -1);
    assert_int_equal(run(g, "<tool_call>\n<function=get>\n</function>\n</tool_call>"), 1);
    assert_int_equal(run(g, "<tool_call>\n<function=gets>\n"), -1);
    /* After "\n</parameter>" the value is over: the next byte must be "\n". */
    assert_int_equal(run(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\na\n"
                            "</parameter>x"), -1);
    wk_grammar_free(g);
    /* A reasoning block first. */
    wk_grammar_spec sp = {.format = WK_TOOLCALL_FMT_XML, .tools = TOOLS, .tools_len = strlen(TOOLS),
                          .prefix_until = "</think>"};
    wk_diag d = {{0}};
    assert_int_equal(wk_grammar_compile(&sp, &g, &d), WK_OK);
    assert_int_equal(run(g, "hmm <b>x</b>\n</think>\n\n<tool_call>\n<function=ping>\n"
                            "</function>\n</tool_call>"), 1);
    assert_int_equal(run(g, "<tool_call>"), 0); /* still reasoning */
    wk_grammar_free(g);
}

static void
expect_refused(const char *tools, const char *fn, const char *needle)
{
    wk_grammar_spec sp = {.format = WK_TOOLCALL_FMT_HERMES, .tools = tools, .tools_len = strlen(tools),
                          .function = fn};
    wk_grammar *g = NULL;
    wk_diag d = {{0}};
    assert_int_equal(wk_grammar_compile(&sp, &g, &d), WK_EINVAL);
    assert_null(g);
    if (strstr(d.msg, needle) == NULL)
        fail_msg("'%s' lacks '%s'", d.msg, needle);
}

static void
test_compile_errors(void **state)
{
    (void)state;
    expect_refused("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                   "{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[]}}}}}]",
                   NULL, "'anyOf'");
    expect_refused("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                   "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\","
                   "\"pattern\":\"x\"}}}}}]",
                   NULL, "tools[0].function.parameters.properties.a: schema keyword 'pattern'");
    expect_refused("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                   "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\"}}}}}]",
                   NULL, "needs 'items'");
    expect_refused("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                   "{\"type\":\"object\",\"required\":[\"b\"]}}}]",
                   NULL, "'b'");
    expect_refused("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                   "{\"$ref\":\"#/x\"}}}]", NULL, "'$ref'");
    expect_refused("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                   "{\"type\":\"string\"}}}]", NULL, "must be of type object");
    expect_refused("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", "g", "'g'");
    expect_refused("[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]", NULL, "'a b'");
    expect_refused("[]", NULL, "tools");
    expect_refused("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                   "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", NULL, "duplicate");
    expect_refused("{", NULL, "tools");
    wk_grammar_spec sp = {.format = WK_TOOLCALL_FMT_NONE, .tools = "[]", .tools_len = 2};
    wk_grammar *g = NULL;
    wk_diag d = {{0}};
    assert_int_equal(wk_grammar_compile(&sp, &g, &d), WK_EINVAL);
}

/* const: an enum of its one value, in both formats (Open WebUI 0.12.4's create_skill has
 * {"const": "base64", "type": "string"} in an array of objects); refused with enum. */
static void
test_const(void **state)
{
    (void)state;
    const char *tools =
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"enc\":{\"const\":\"base64\",\"type\":\"string\"},"
        "\"n\":{\"const\":3},\"files\":{\"type\":\"array\",\"items\":{\"type\":\"object\","
        "\"properties\":{\"e\":{\"const\":\"x\"}},\"additionalProperties\":false}}}}}}]";
    wk_grammar *g = compile(WK_TOOLCALL_FMT_HERMES, tools, "f", false);
    const char *pre = "<tool_call>\n{\"name\": \"f\", \"arguments\": ";
    char buf[256];
    snprintf(buf, sizeof(buf), "%s{\"enc\": \"base64\", \"n\": 3, \"files\": [{\"e\": \"x\"}]}}"
             "\n</tool_call>", pre);
    assert_int_equal(run(g, buf), 1);
    snprintf(buf, sizeof(buf), "%s{\"enc\": \"base65\"", pre);
    assert_int_equal(run(g, buf), -1);
    snprintf(buf, sizeof(buf), "%s{\"n\": 4", pre);
    assert_int_equal(run(g, buf), -1);
    snprintf(buf, sizeof(buf), "%s{\"files\": [{\"e\": \"y\"", pre);
    assert_int_equal(run(g, buf), -1);
    wk_grammar_free(g);
    g = compile(WK_TOOLCALL_FMT_XML, tools, "f", false);
    assert_int_equal(run(g, "<tool_call>\n<function=f>\n<parameter=enc>\nbase64\n</parameter>\n"
                            "<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>"), 1);
    assert_int_equal(run(g, "<tool_call>\n<function=f>\n<parameter=enc>\nbase6\n"), -1);
    assert_int_equal(run(g, "<tool_call>\n<function=f>\n<parameter=n>\n4"), -1);
    wk_grammar_free(g);
    expect_refused("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                   "{\"type\":\"object\",\"properties\":{\"a\":{\"const\":\"x\","
                   "\"enum\":[\"x\"]}}}}}]",
                   NULL, "'const' together with 'enum'");
    expect_refused("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                   "{\"type\":\"object\",\"properties\":{\"a\":{\"const\":[1]}}}}}]",
                   NULL, "'const' must be");
}

/* ---- allowed tokens on toy vocabs ---- */

typedef struct toy {
    const uint8_t **p;
    size_t *len;
    uint32_t n;
    int32_t eos;
} toy;

static void
toy_add(toy *t, const char *s, size_t n)
{
    t->p = realloc(t->p, (t->n + 1) * sizeof(*t->p));
    t->len = realloc(t->len, (t->n + 1) * sizeof(*t->len));
    uint8_t *c = malloc(n ? n : 1);
    memcpy(c, s, n);
    t->p[t->n] = c;
    t->len[t->n] = n;
    t->n++;
}

/* Every single byte, the eos id, then structure-straddling multi-byte tokens. */
static toy
toy_make(void)
{
    toy t = {0};
    for (int b = 0; b < 256; b++) {
        char ch = (char)b;
        toy_add(&t, &ch, 1);
    }
    t.eos = (int32_t)t.n;
    toy_add(&t, "<|im_end|>", 10);
    static const char *const multi[] = {
        "<tool_call>", "<tool_call>\n", "<tool_call>\n<function=", ">\n", ">\n<", "\">\n",
        "\n</parameter>\n", "\n</parameter>", "</parameter>", "\n</function>", "</function>\n",
        "get", "get_", "_weather>\n<parameter=city>\n", "city", "\"city\":", "\"city\": \"",
        "\", \"", "\"}", "}}", "}\n</tool_call>", "\", \"arguments\": {", "{\"", "\":", "\": ",
        "true", "null", "1", "10", "100", "1.", ".5", "e+", "-0", "\\u", "\\u00", "d800", "D7",
        "00e9", "\xc3", "\xa9", "\xc3\xa9", "\xe2\x82", "\xac", "  ", "\n\n", "Paris", "days",
        "\"days\":", "[\"", "\"]", "],", "ping>\n</function>\n</tool_call>", "\n<tool_call>", "]</TOOLCALL>", "}]</TOOLCALL>",
        "<TOOLCALL>[{\"name\": \"", "ping\", \"arguments\": {}}",
    };
    for (size_t i = 0; i < sizeof(multi) / sizeof(multi[0]); i++)
        toy_add(&t, multi[i], strlen(multi[i]));
    return t;
}

static void
toy_free(toy *t)
{
    for (uint32_t i = 0; i < t->n; i++)
        free((void *)t->p[i]);
    free(t->p);
    free(t->len);
}

/* The brute-force set: every token advanced on a fresh matcher fed the prefix. */
static size_t
brute_allowed(const wk_grammar *g, const toy *t, const uint8_t *pre, size_t npre, uint64_t *mask)
{
    memset(mask, 0, ((t->n + 63) / 64) * sizeof(*mask));
    size_t c = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        wk_gmatch *m = wk_gmatch_new(g);
        assert_true(wk_gmatch_advance(m, pre, npre));
        bool ok = (int32_t)i == t->eos ? wk_gmatch_accepting(m)
                                       : wk_gmatch_advance(m, t->p[i], t->len[i]);
        if (ok) {
            mask[i / 64] |= 1ull << (i % 64);
            c++;
        }
        wk_gmatch_free(m);
    }
    return c;
}

static bool
walk(wk_toolcall_fmt fmt, const char *fn, bool parallel, unsigned seed)
{
    wk_grammar *g = compile(fmt, TOOLS, fn, parallel);
    toy t = toy_make();
    wk_gvocab *v = NULL;
    assert_int_equal(wk_gvocab_new(t.p, t.len, t.n, t.eos, NULL, &v), WK_OK);
    assert_int_equal(wk_gvocab_size(v), t.n);
    size_t words = (t.n + 63) / 64;
    uint64_t *mask = calloc(words, sizeof(*mask)), *ref = calloc(words, sizeof(*ref));
    wk_gmatch *m = wk_gmatch_new(g);
    uint8_t out[8192];
    size_t n_out = 0;
    unsigned r = seed;
    bool ended = false, done_ok = false;
    for (int step = 0; step < 160 && !ended; step++) {
        size_t c = wk_gmatch_allowed(m, v, mask);
        size_t cb = brute_allowed(g, &t, out, n_out, ref);
        assert_int_equal(c, cb);
        assert_memory_equal(mask, ref, words * sizeof(*mask));
        assert_true(c > 0); /* never a dead end */
        /* Prefer multi-byte tokens and ending, so walks are short and straddle structure. */
        uint32_t pick = UINT32_MAX;
        for (int tries = 0; tries < 64 && pick == UINT32_MAX; tries++) {
            r = r * 1103515245u + 12345u;
            uint32_t cand = (step > 60 || (r >> 16) % 3 == 0) ? 256 + (r >> 8) % (t.n - 256)
                                                                : (r >> 8) % t.n;
            if (mask[cand / 64] >> (cand % 64) & 1)
                pick = cand;
        }
        if (pick == UINT32_MAX || (step > 80 && (mask[t.eos / 64] >> (t.eos % 64) & 1)))
            for (uint32_t i = 0; i < t.n && pick == UINT32_MAX; i++)
                if (mask[i / 64] >> (i % 64) & 1)
                    pick = i;
        if (step > 80 && (mask[t.eos / 64] >> (t.eos % 64) & 1))
            pick = (uint32_t)t.eos;
        if ((int32_t)pick == t.eos) {
            assert_true(wk_gmatch_accepting(m));
            ended = true;
            break;
        }
        assert_true(wk_gmatch_advance(m, t.p[pick], t.len[pick]));
        assert_true(n_out + t.len[pick] < sizeof(out));
        memcpy(out + n_out, t.p[pick], t.len[pick]);
        n_out += t.len[pick];
        if (wk_gmatch_done(m))
            ended = true;
    }
    if (!ended) {
        /* Long walks (big strings) are cut; the matcher must still be mid-way, not stuck. */
        wk_gmatch_free(m);
        goto out;
    }
    done_ok = true;
    out[n_out] = 0;
    /*
     * wk_toolcall's parser reads it as calls to offered functions, with JSON
     * object arguments, and no content.
     */
    json_t *tools = json_loads(TOOLS, 0, NULL);
    wk_toolcall_parser *tp = NULL;
    assert_int_equal(wk_toolcall_parser_new(fmt, tools, &tp), WK_OK);
    wk_toolcall_out o = {0};
    assert_int_equal(wk_toolcall_feed(tp, (const char *)out, n_out, true, &o), WK_OK);
    if (o.n_calls == 0 || o.content_len != 0)
        fail_msg("not parsed as calls (%zu calls, content '%s'): %s", o.n_calls,
                 o.content ? o.content : "", (const char *)out);
    for (size_t k = 0; k < o.n_calls; k++) {
        assert_true(fn == NULL || strcmp(o.calls[k].name, fn) == 0);
        json_t *fdef = NULL;
        for (size_t q = 0; q < json_array_size(tools); q++) {
            json_t *f = json_object_get(json_array_get(tools, q), "function");
            if (strcmp(json_string_value(json_object_get(f, "name")), o.calls[k].name) == 0)
                fdef = f;
        }
        assert_non_null(fdef);
        json_t *args = json_loads(o.calls[k].arguments, 0, NULL);
        assert_true(json_is_object(args));
        /* Every key declared; the required ones present. */
        json_t *props = json_object_get(json_object_get(fdef, "parameters"), "properties");
        const char *key;
        json_t *val;
        json_object_foreach(args, key, val)
            assert_non_null(json_object_get(props, key));
        json_t *req = json_object_get(json_object_get(fdef, "parameters"), "required");
        size_t q;
        json_array_foreach(req, q, val)
            assert_non_null(json_object_get(args, json_string_value(val)));
        json_decref(args);
    }
    wk_toolcall_out_fini(&o);
    wk_toolcall_parser_free(tp);
    json_decref(tools);
    wk_gmatch_free(m);
out:
    free(mask);
    free(ref);
    wk_gvocab_free(v);
    toy_free(&t);
    wk_grammar_free(g);
    return done_ok;
}

static void
test_allowed_json(void **state)
{
    (void)state;
    int ended = 0;
    for (unsigned s = 1; s <= 6; s++)
        ended += walk(WK_TOOLCALL_FMT_HERMES, NULL, s % 2 == 0, s);
    ended += walk(WK_TOOLCALL_FMT_HERMES, "get_weather", false, 7);
    for (unsigned s = 1; s <= 3; s++)
        ended += walk(WK_TOOLCALL_FMT_NEMOTRON, NULL, true, s * 13);
    print_message("%d of 10 walks ended in a complete call\n", ended);
    assert_true(ended >= 6);
}

static void
test_allowed_xml(void **state)
{
    (void)state;
    int ended = 0;
    for (unsigned s = 1; s <= 6; s++)
        ended += walk(WK_TOOLCALL_FMT_XML, NULL, s % 2 == 0, s * 7);
    ended += walk(WK_TOOLCALL_FMT_XML, "get_weather", false, 99);
    print_message("%d of 7 walks ended in a complete call\n", ended);
    assert_true(ended >= 4);
}

/* Allowed bit of token id after the matcher took prefix. */
static bool
allowed_after(const wk_grammar *g, const wk_gvocab *v, const char *prefix, uint32_t id)
{
    wk_gmatch *m = wk_gmatch_new(g);
    assert_true(wk_gmatch_advance(m, (const uint8_t *)prefix, strlen(prefix)));
    uint64_t mask[8] = {0};
    (void)wk_gmatch_allowed(m, v, mask);
    wk_gmatch_free(m);
    return (mask[id / 64] >> (id % 64)) & 1;
}

static void
test_control_tokens(void **state)
{
    (void)state;
    /*
     * Bytes 0..255, end-of-text 256, then control tokens (a tokenizer's
     * added tokens): each only where the grammar has its text fixed.
     */
    static const char *const ctl[] = {"<tool_call>", "</think>", "<X>", "\n</parameter>\n",
                                      "<|im_start|>", "\"", "\"city\""};
    enum { NCTL = sizeof(ctl) / sizeof(ctl[0]), BASE = 257 };
    static uint8_t bytes[256];
    const uint8_t *p[BASE + NCTL];
    size_t len[BASE + NCTL];
    uint8_t lit[BASE + NCTL] = {0};
    for (int b = 0; b < 256; b++) {
        bytes[b] = (uint8_t)b;
        p[b] = &bytes[b];
        len[b] = 1;
    }
    p[256] = NULL;
    len[256] = 0;
    for (int k = 0; k < NCTL; k++) {
        p[BASE + k] = (const uint8_t *)ctl[k];
        len[BASE + k] = strlen(ctl[k]);
        lit[BASE + k] = 1;
    }
    wk_gvocab *v = NULL, *plain = NULL;
    assert_int_equal(wk_gvocab_new(p, len, BASE + NCTL, 256, lit, &v), WK_OK);
    assert_int_equal(wk_gvocab_new(p, len, BASE + NCTL, 256, NULL, &plain), WK_OK);
    enum { CALL = BASE, THINK_END, X, END_PARAM, IM_START, QUOTE, CITY };

    /* Hermes after reasoning: free reasoning, then "</think>", then the call. */
    wk_grammar_spec sp = {.format = WK_TOOLCALL_FMT_HERMES, .tools = TOOLS,
                          .tools_len = strlen(TOOLS), .function = "get_weather",
                          .prefix_until = "</think>"};
    wk_grammar *g = NULL;
    wk_diag d = {{0}};
    assert_int_equal(wk_grammar_compile(&sp, &g, &d), WK_OK);
    /* in the reasoning: the end marker yes, other control tokens no (free text) */
    assert_true(allowed_after(g, v, "", THINK_END));
    assert_false(allowed_after(g, v, "", X));
    assert_false(allowed_after(g, v, "", CALL));
    assert_false(allowed_after(g, v, "hmm ", IM_START));
    assert_true(allowed_after(g, plain, "", CALL)); /* (as text, without the flags) */
    assert_true(allowed_after(g, v, "", '<'));
    /* the call's marker, its property name and the string's quotes are fixed text */
    assert_true(allowed_after(g, v, "ok</think>\n", CALL));
    const char *args = "ok</think><tool_call>\n{\"name\": \"get_weather\", \"arguments\": {";
    assert_true(allowed_after(g, v, args, CITY));
    char buf[256];
    snprintf(buf, sizeof(buf), "%s\"city\": ", args);
    assert_true(allowed_after(g, v, buf, QUOTE));
    /* inside the string: no control token, not even the one whose text is a quote */
    snprintf(buf, sizeof(buf), "%s\"city\": \"Pa", args);
    assert_false(allowed_after(g, v, buf, X));
    assert_false(allowed_after(g, v, buf, IM_START));
    assert_false(allowed_after(g, v, buf, THINK_END));
    assert_true(allowed_after(g, plain, buf, X)); /* (the same bytes as text: allowed) */
    assert_true(allowed_after(g, v, buf, '<'));   /* and spelled byte by byte */
    /* the text "<X>" spelled by bytes stays a valid argument */
    snprintf(buf, sizeof(buf), "%s\"city\": \"Pa<X>\"}}\n</tool_call>", args);
    wk_gmatch *m = wk_gmatch_new(g);
    assert_true(wk_gmatch_advance(m, (const uint8_t *)buf, strlen(buf)));
    assert_true(wk_gmatch_accepting(m));
    wk_gmatch_free(m);
    wk_grammar_free(g);

    /* XML: the value's end marker as one control token yes, a marker inside the value no */
    g = compile(WK_TOOLCALL_FMT_XML, TOOLS, "get_weather", false);
    const char *val = "<tool_call>\n<function=get_weather>\n<parameter=city>\nRo";
    assert_true(allowed_after(g, v, val, END_PARAM));
    assert_false(allowed_after(g, v, val, X));
    assert_false(allowed_after(g, v, val, IM_START));
    assert_true(allowed_after(g, v, "", CALL));
    wk_grammar_free(g);
    wk_gvocab_free(v);
    wk_gvocab_free(plain);
}

static void
test_allowed_start(void **state)
{
    (void)state;
    /* At the start exactly the prefixes of "<tool_call>\n<function=" are allowed, eos not. */
    wk_grammar *g = compile(WK_TOOLCALL_FMT_XML, TOOLS, "ping", false);
    toy t = toy_make();
    wk_gvocab *v = NULL;
    assert_int_equal(wk_gvocab_new(t.p, t.len, t.n, t.eos, NULL, &v), WK_OK);
    uint64_t mask[8];
    wk_gmatch *m = wk_gmatch_new(g);
    size_t c = wk_gmatch_allowed(m, v, mask);
    size_t want = 0;
    for (uint32_t i = 0; i < t.n; i++) {
        bool pre = (int32_t)i != t.eos &&
                   strncmp("<tool_call>\n<function=ping>\n</function>\n</tool_call>",
                           (const char *)t.p[i], t.len[i]) == 0;
        assert_int_equal((mask[i / 64] >> (i % 64)) & 1, pre);
        want += pre;
    }
    assert_int_equal(c, want);
    assert_int_equal(c, 4); /* "<", "<tool_call>", "<tool_call>\n", "<tool_call>\n<function=" */
    const char *s = "<tool_call>\n<function=";
    assert_true(wk_gmatch_advance(m, (const uint8_t *)s, strlen(s)));
    c = wk_gmatch_allowed(m, v, mask);
    /* "p" and the token that finishes the whole call. */
    assert_int_equal(c, 2);
    wk_gmatch_free(m);
    wk_gvocab_free(v);
    toy_free(&t);
    wk_grammar_free(g);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_format),   cmocka_unit_test(test_xml_format),
        cmocka_unit_test(test_compile_errors), cmocka_unit_test(test_allowed_start),
        cmocka_unit_test(test_control_tokens),
        cmocka_unit_test(test_allowed_json),  cmocka_unit_test(test_allowed_xml),
        cmocka_unit_test(test_const),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
