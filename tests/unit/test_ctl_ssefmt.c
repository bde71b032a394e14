/*
 * ctl_ssefmt against jansson: random byte strings (mostly well-formed
 * UTF-8 built from code points that need every kind of escape, some with
 * random bytes mixed in) give the same JSON string as json_stringn + a
 * compact dump, and are refused exactly where jansson refuses them; a
 * chunk made from a template equals jansson's dump of the same tree.
 * (cmocka needs its four headers first.)
 */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_ssefmt.h"
#include "wk_json.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t
rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* Appends code point cp as UTF-8 (surrogates too: jansson must refuse them as well). */
static size_t
put_cp(unsigned char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A random string of at most 64 code points or bytes; raw: mix in random bytes. */
static size_t
make(unsigned char *o, bool raw)
{
    static const uint32_t odd[] = {0,      '"',    '\\',   '/',     '\b',     '\f',   '\n',
                                   '\r',   '\t',   0x1F,   0x7F,    0x80,     0xFF,   0x2028,
                                   0x2029, 0xFFFD, 0xFFFF, 0x10000, 0x10FFFF, 0xD800, 0xDFFF};
    size_t n = 0, k = rnd() % 65;
    for (size_t i = 0; i < k; i++) {
        uint32_t pick = rnd() % 8;
        if (raw && pick == 0)
            o[n++] = (unsigned char)rnd();
        else if (pick <= 2)
            n += put_cp(o + n, odd[rnd() % (sizeof(odd) / sizeof(odd[0]))]);
        else if (pick <= 4)
            n += put_cp(o + n, 0x20 + rnd() % 0x5F);
        else if (pick == 5)
            n += put_cp(o + n, rnd() % 0x20);
        else
            n += put_cp(o + n, rnd() % 0x110000);
    }
    return n;
}

static void
test_escape_vs_jansson(void **state)
{
    (void)state;
    unsigned char in[64 * 4];
    char out[64 * 4 * 6 + 1];
    int valid = 0, refused = 0;
    for (int it = 0; it < 20000; it++) {
        size_t n = make(in, it % 2 == 1);
        json_t *s = json_stringn((const char *)in, n);
        size_t e = ctl_ssefmt_escape((const char *)in, n, out);
        if (s == NULL) {
            assert_true(e == (size_t)-1);
            refused++;
            continue;
        }
        assert_true(e != (size_t)-1);
        char *dump = wk_json_dump_compact(s);
        json_decref(s);
        assert_non_null(dump);
        size_t dl = strlen(dump);
        assert_int_equal(dl, e + 2);
        assert_memory_equal(dump + 1, out, e);
        free(dump);
        valid++;
    }
    /* both kinds came up often */
    assert_true(valid > 5000);
    assert_true(refused > 2000);
}

static void
test_chunk_template(void **state)
{
    (void)state;
    json_t *tpl =
        json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:n, s:n, s:s}]}", "id", "cmpl-\"x\"\\", "object",
                  "text_completion", "created", (json_int_t)1700000000, "model", "m\xc3\xa9",
                  "choices", "index", 0, "finish_reason", "logprobs", "text", "");
    char *dump = wk_json_dump_compact(tpl);
    json_decref(tpl);
    ctl_ssefmt f;
    assert_true(ctl_ssefmt_init(&f, dump));
    free(dump);
    unsigned char in[64 * 4];
    for (int it = 0; it < 2000; it++) {
        size_t n = make(in, it % 4 == 3);
        json_t *t = json_stringn((const char *)in, n);
        const char *got = NULL;
        wk_err err = ctl_ssefmt_chunk(&f, (const char *)in, n, &got);
        if (t == NULL) {
            assert_int_equal(err, WK_EINVAL);
            continue;
        }
        assert_int_equal(err, WK_OK);
        json_t *c =
            json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:n, s:n, s:o}]}", "id", "cmpl-\"x\"\\",
                      "object", "text_completion", "created", (json_int_t)1700000000, "model",
                      "m\xc3\xa9", "choices", "index", 0, "finish_reason", "logprobs", "text", t);
        char *want = wk_json_dump_compact(c);
        json_decref(c);
        assert_string_equal(got, want);
        free(want);
    }
    ctl_ssefmt_fini(&f);
    /* a dump that does not end in an empty string: no template */
    assert_false(ctl_ssefmt_init(&f, "{\"a\":\"b\"}"));
    assert_false(ctl_ssefmt_init(&f, "{\"a\":1}"));
    assert_false(ctl_ssefmt_init(&f, "\"\""));
    assert_true(ctl_ssefmt_init(&f, "{\"d\":{\"content\":\"\"}}"));
    const char *got = NULL;
    assert_int_equal(ctl_ssefmt_chunk(&f, "a\nb", 3, &got), WK_OK);
    assert_string_equal(got, "{\"d\":{\"content\":\"a\\nb\"}}");
    ctl_ssefmt_fini(&f);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape_vs_jansson),
        cmocka_unit_test(test_chunk_template),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
