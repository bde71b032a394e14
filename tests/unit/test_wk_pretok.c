/*
 * Unit tests for wk_pretok: the five Split behaviors and invert on the
 * `tokenizers` documentation's example, String patterns (metacharacters are
 * literal), empty matches (Oniguruma's find_iter), ^ and $ at line ends,
 * Oniguruma's \s (NEL yes, U+180E no), Digits (runs, individual, a Unicode 15
 * numeral), the Qwen2 and GPT-2 splits, invalid UTF-8 (each byte a word of
 * its own), the match limit, every refusal with its diag, and the
 * pre-tokenizer behind a tokenizer.json (wk_tok). tests/reference/
 * check_pretok.py compares against `tokenizers` and llama.cpp's pairs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wk_pretok.h"
#include "wk_tok.h"

/* The words of one split, joined with '|' (words never hold '|' here). */
typedef struct words {
    char s[4096]; /* joined words */
    size_t len;   /* bytes used */
    int n;        /* words */
} words;

static bool
words_add(void *ctx, const uint8_t *w, size_t n)
{
    words *ws = ctx;
    assert_true(n > 0);
    assert_true(ws->len + n + 2 < sizeof(ws->s));
    if (ws->n++ > 0)
        ws->s[ws->len++] = '|';
    memcpy(ws->s + ws->len, w, n);
    ws->len += n;
    ws->s[ws->len] = '\0';
    return true;
}

static wk_pretok *
load(const char *json)
{
    wk_pretok *p = NULL;
    wk_diag d = {""};
    wk_err err = wk_pretok_new(json, strlen(json), "pre_tokenizer", &p, &d);
    if (err != WK_OK)
        fail_msg("load %s: %s", json, d.msg);
    return p;
}

/* Splits text (n bytes) with the pre-tokenizer json and checks the joined words. */
static void
check_n(const char *json, const char *text, size_t n, const char *want)
{
    wk_pretok *p = load(json);
    words ws = {.len = 0};
    wk_diag d = {""};
    assert_int_equal(wk_pretok_split(p, (const uint8_t *)text, n, words_add, &ws, &d), WK_OK);
    if (strcmp(ws.s, want) != 0)
        fail_msg("%s on \"%s\": got \"%s\", want \"%s\"", json, text, ws.s, want);
    wk_pretok_free(p);
}

static void
check(const char *json, const char *text, const char *want)
{
    check_n(json, text, strlen(text), want);
}

#define SPLIT(pat, beh, inv)                                                                       \
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": " \
    "\"" pat "\"}, \"behavior\": \"" beh "\", \"invert\": " inv "}, {\"type\": \"ByteLevel\", "    \
    "\"add_prefix_space\": false, \"use_regex\": false}]}"

static void
test_behaviors(void **state)
{
    (void)state;
    const char *t = "the-final--countdown";
    check(SPLIT("-", "Removed", "false"), t, "the|final|countdown");
    check(SPLIT("-", "Isolated", "false"), t, "the|-|final|-|-|countdown");
    check(SPLIT("-", "MergedWithPrevious", "false"), t, "the-|final-|-|countdown");
    check(SPLIT("-", "MergedWithNext", "false"), t, "the|-final|-|-countdown");
    check(SPLIT("-", "Contiguous", "false"), t, "the|-|final|--|countdown");
    /* invert: the pieces between matches are the matches */
    check(SPLIT("-", "Removed", "true"), t, "-|-|-");
    check(SPLIT("-", "MergedWithPrevious", "true"), t, "the|-final|-|-countdown");
    check(SPLIT("-", "MergedWithNext", "true"), t, "the-|final-|-|countdown");
    check(SPLIT("-", "Contiguous", "true"), t, "the|-|final|--|countdown");
    /* a lone Split is a pre-tokenizer too (wk_bpe asks for ByteLevel last) */
    check("{\"type\": \"Split\", \"pattern\": {\"Regex\": \"-\"}, \"behavior\": \"Removed\"}", t,
          "the|final|countdown");
}

static void
test_patterns(void **state)
{
    (void)state;
    /* String: metacharacters are literal */
    check("{\"type\": \"Split\", \"pattern\": {\"String\": \"a.b\"}, \"behavior\": \"Isolated\"}",
          "a.bxaxba.b", "a.b|xaxb|a.b");
    /* empty matches: one at each position, none kept as a word */
    check(SPLIT("x*", "Isolated", "false"), "abxxc", "a|b|xx|c");
    /* ^ and $ at every line, as in Oniguruma */
    check(SPLIT("^ |$", "Removed", "false"), " a\n b", "a|\n|b");
    check(SPLIT("\\\\s+$", "Isolated", "false"), "a  \nb  ", "a|  |\nb|  ");
    /* (?i:...) and \s: NEL is a space in Oniguruma, U+180E is not (PCRE2 says it is) */
    check(SPLIT("(?i:'s)", "Isolated", "false"), "it'S", "it|'S");
    check(SPLIT("\\\\s+", "Isolated", "false"),
          "a\xc2\x85"
          "b",
          "a|\xc2\x85|b");
    check(SPLIT("\\\\s+", "Isolated", "false"),
          "a\xe1\xa0\x8e"
          "b",
          "a\xe1\xa0\x8e"
          "b");
    check(SPLIT("[^\\\\s]+", "Isolated", "false"),
          "a\xe1\xa0\x8e"
          "b c",
          "a\xe1\xa0\x8e"
          "b| |c");
    check(SPLIT("\\\\S+", "Isolated", "false"),
          "ab\xc2\xa0"
          "c",
          "ab|\xc2\xa0|c");
}

static void
test_digits_bytelevel(void **state)
{
    (void)state;
    static const char runs[] =
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
        "\"individual_digits\": false}, {\"type\": \"ByteLevel\", "
        "\"add_prefix_space\": false, \"use_regex\": false}]}";
    static const char one[] = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
                              "\"individual_digits\": true}, {\"type\": \"ByteLevel\", "
                              "\"add_prefix_space\": false, \"use_regex\": true}]}";
    check(runs, "ab123c\xd9\xa1\xd9\xa2", "ab|123|c|\xd9\xa1\xd9\xa2");
    /* U+1D2C0, a Kaktovik numeral (Unicode 15): numeric for Rust */
    check(runs,
          "a\xf0\x9d\x8b\x80"
          "1",
          "a|\xf0\x9d\x8b\x80"
          "1");
    /* individual digits, then the GPT-2 split on what is left */
    check(one, "I'm 42 ok  ", "I|'m| |4|2| ok|  ");
    static const char qwen2[] =
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
        "{\"Regex\": \"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|"
        "\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|"
        "\\\\s+\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", "
        "\"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false}]}";
    check(qwen2, "Hello WORLD'LL 2024!!\n\n  x", "Hello| WORLD|'LL| |2|0|2|4|!!\n\n| | x");
    /* invalid UTF-8: each such byte alone, each valid run split as a text of its own */
    check_n(qwen2,
            "ab\xff"
            "cd \xc3",
            7, "ab|\xff|cd| |\xc3");
    check_n(qwen2, "", 0, "");
}

static void
test_refused(void **state)
{
    (void)state;
    static const struct {
        const char *json; /* the pre_tokenizer */
        wk_err want;      /* the code */
        const char *diag; /* in the diag */
    } cases[] = {
        {SPLIT("\\\\w+", "Isolated", "false"), WK_ENOTSUP,
         "pretokenizers[0].pattern: pattern offset 0: an escape"},
        {SPLIT("\\\\bx", "Isolated", "false"), WK_ENOTSUP, "an escape whose meaning differs"},
        {SPLIT("(?m:a.)", "Isolated", "false"), WK_ENOTSUP, "(?m) as dotall"},
        {SPLIT("[[:alpha:]]", "Isolated", "false"), WK_ENOTSUP, "nested character class"},
        {SPLIT("[a&&b]", "Isolated", "false"), WK_ENOTSUP, "&& in a character class"},
        {SPLIT("[\\\\S]", "Isolated", "false"), WK_ENOTSUP, "\\S inside a character class"},
        {SPLIT("(a", "Isolated", "false"), WK_EINVAL,
         "pattern offset 2: missing closing parenthesis"},
        {SPLIT("a", "Sideways", "false"), WK_EINVAL, "behavior \"Sideways\""},
        {SPLIT("a", "Isolated", "1"), WK_EINVAL, "invert is not a boolean"},
        {"{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Whitespace\"}, "
         "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}]}",
         WK_ENOTSUP, "pretokenizers[0].type \"Whitespace\" is not supported"},
        {"{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}]}", WK_ENOTSUP,
         "must end in ByteLevel"},
        {"{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, "
         "{\"type\": \"ByteLevel\"}]}",
         WK_ENOTSUP, "ByteLevel is supported only as the last member"},
        {"{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}, "
         "{\"type\": \"ByteLevel\", \"add_prefix_space\": true}]}",
         WK_ENOTSUP, "add_prefix_space true is not supported"},
        {"{\"type\": \"Split\", \"pattern\": {\"Regex\": 1}, \"behavior\": \"Isolated\"}",
         WK_EINVAL, "pattern value is not a string"},
        {"{\"type\": \"Split\", \"pattern\": {}, \"behavior\": \"Isolated\"}", WK_EINVAL,
         "pattern is not"},
        {"[1]", WK_ENOTSUP, "only Split or a Sequence"},
        {"{", WK_EINVAL, "pre_tokenizer: "},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        wk_pretok *p = NULL;
        wk_diag d = {""};
        wk_err err = wk_pretok_new(cases[i].json, strlen(cases[i].json), "pre_tokenizer", &p, &d);
        if (err != cases[i].want || strstr(d.msg, cases[i].diag) == NULL)
            fail_msg("case %zu: %s, diag \"%s\" (want %s with \"%s\")", i, wk_err_name(err), d.msg,
                     wk_err_name(cases[i].want), cases[i].diag);
        assert_null(p);
    }
    /* too many members */
    char big[4096];
    size_t o = (size_t)snprintf(big, sizeof(big), "{\"type\": \"Sequence\", \"pretokenizers\": [");
    for (int i = 0; i < WK_PRETOK_MAX_STAGES + 1; i++)
        o += (size_t)snprintf(big + o, sizeof(big) - o, "{\"type\": \"Digits\"}, ");
    snprintf(big + o, sizeof(big) - o, "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}]}");
    wk_pretok *p = NULL;
    wk_diag d = {""};
    assert_int_equal(wk_pretok_new(big, strlen(big), "pre_tokenizer", &p, &d), WK_ETOOBIG);
}

static void
test_match_limit(void **state)
{
    (void)state;
    wk_pretok *p = load(SPLIT("(a|aa)+$", "Isolated", "false"));
    char text[64];
    memset(text, 'a', 60);
    text[60] = 'b';
    words ws = {.len = 0};
    wk_diag d = {""};
    assert_int_equal(wk_pretok_split(p, (const uint8_t *)text, 61, words_add, &ws, &d), WK_ETOOBIG);
    assert_non_null(strstr(d.msg, "match limit"));
    wk_pretok_free(p);
    wk_pretok_free(NULL);
}

/* Through wk_tok: a byte-level tokenizer.json whose Sequence removes the digits. */
static void
test_tokenizer_json(void **state)
{
    (void)state;
    static char json[16384];
    size_t o = (size_t)snprintf(json, sizeof(json), "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
    for (unsigned c = 0; c < 256; c++) {
        unsigned cp = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174 ? c
                      : c <= 32                                                   ? 256 + c
                      : c <= 160 ? 256 + 33 + (c - 127)
                                 : 256 + 67;
        o +=
            (size_t)snprintf(json + o, sizeof(json) - o, "%s\"\\u%04x\": %u", c ? ", " : "", cp, c);
    }
    o += (size_t)snprintf(
        json + o, sizeof(json) - o,
        ", \"ab\": 256}, \"merges\": [\"a b\"]}, \"decoder\": {\"type\": "
        "\"ByteLevel\"}, \"added_tokens\": [{\"id\": 257, \"content\": \"<a>\", \"lstrip\": "
        "true, \"special\": true}, {\"id\": 258, \"content\": \"<b>\", \"rstrip\": true, "
        "\"special\": true}], \"pre_tokenizer\": " SPLIT("\\\\p{N}+", "Removed", "false") "}");
    wk_tok *t = NULL;
    wk_diag d = {""};
    if (wk_tok_load_hf_mem(json, o, NULL, 0, &t, &d) != WK_OK)
        fail_msg("load: %s", d.msg);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(wk_tok_encode(t, "a1b ab", 6, &ids, &n, &d), WK_OK);
    assert_int_equal(n, 4); /* "a" and "b ab": the digit is removed, a and b stay apart */
    assert_int_equal(ids[0], 'a');
    assert_int_equal(ids[1], 'b');
    assert_int_equal(ids[2], ' ');
    assert_int_equal(ids[3], 256);
    free(ids);
    /* lstrip takes the spaces before <a>, rstrip those after <b> (NBSP too) */
    static const char text[] = "x  <a>  y <b> \xc2\xa0z";
    assert_int_equal(wk_tok_encode(t, text, sizeof(text) - 1, &ids, &n, &d), WK_OK);
    const int32_t want[] = {'x', 257, ' ', ' ', 'y', ' ', 258, 'z'};
    assert_int_equal(n, sizeof(want) / sizeof(want[0]));
    assert_memory_equal(ids, want, sizeof(want));
    free(ids);
    wk_tok_free(t);
    /* single_word <b>: no token where a word character touches it */
    static char json2[16384];
    const char *sw = strstr(json, "\"rstrip\": true");
    assert_non_null(sw);
    int n2 = snprintf(json2, sizeof(json2), "%.*s\"single_word\": true%s", (int)(sw - json), json,
                      sw + strlen("\"rstrip\": true"));
    t = NULL;
    if (wk_tok_load_hf_mem(json2, (size_t)n2, NULL, 0, &t, &d) != WK_OK)
        fail_msg("load: %s", d.msg);
    static const char text2[] = "a<b> <b>\xc3\xa9 <b>";
    assert_int_equal(wk_tok_encode(t, text2, sizeof(text2) - 1, &ids, &n, &d), WK_OK);
    const int32_t want2[] = {'a', '<', 'b', '>', ' ', '<', 'b', '>', 0xc3, 0xa9, ' ', 258};
    assert_int_equal(n, sizeof(want2) / sizeof(want2[0]));
    assert_memory_equal(ids, want2, sizeof(want2));
    free(ids);
    wk_tok_free(t);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_behaviors),        cmocka_unit_test(test_patterns),
        cmocka_unit_test(test_digits_bytelevel), cmocka_unit_test(test_refused),
        cmocka_unit_test(test_match_limit),      cmocka_unit_test(test_tokenizer_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
