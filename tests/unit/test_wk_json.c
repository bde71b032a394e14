/* Unit tests for wk_json: typed access, canonical form (Python-compatible), UTF-8 scrub. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "wk_json.h"

static json_t *
parse(const char *s)
{
    json_t *v = NULL;
    assert_int_equal(wk_json_parse(s, strlen(s), &v, NULL), WK_OK);
    return v;
}

static void
test_parse_errors(void **state)
{
    (void)state;
    json_t *v = NULL;
    wk_diag d = {{0}};
    assert_int_equal(wk_json_parse("{\"a\":", 5, &v, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "line 1"));
    assert_int_equal(wk_json_parse("{\"a\":1,\"a\":2}", 13, &v, &d), WK_EINVAL);
    assert_null(v);
    /* Strings with NUL are refused at parse time (jansson without JSON_ALLOW_NUL). */
    const char *nul = "{\"z\":\"a\\u0000b\"}";
    assert_int_equal(wk_json_parse(nul, strlen(nul), &v, &d), WK_EINVAL);
    /* wk_json_parse_text keeps them (read by length); wk_json_get_str still refuses them. */
    assert_int_equal(wk_json_parse_text(nul, strlen(nul), &v, &d), WK_OK);
    assert_int_equal(json_string_length(json_object_get(v, "z")), 3);
    assert_memory_equal(json_string_value(json_object_get(v, "z")), "a\0b", 3);
    const char *s = NULL;
    assert_int_equal(wk_json_get_str(v, "z", true, NULL, 10, &s, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "NUL"));
    json_decref(v);
    v = NULL;
    assert_int_equal(wk_json_parse_text("{\"a\":1,\"a\":2}", 13, &v, &d), WK_EINVAL);
    assert_null(v);
}

static void
test_getters(void **state)
{
    (void)state;
    json_t *o = parse("{\"s\":\"hi\",\"i\":5,\"f\":0.5,\"b\":true,\"n\":null}");
    const char *s = NULL;
    int64_t i = 0;
    double f = 0;
    bool b = false;
    wk_diag d = {{0}};
    assert_int_equal(wk_json_get_str(o, "s", true, NULL, 10, &s, &d), WK_OK);
    assert_string_equal(s, "hi");
    assert_int_equal(wk_json_get_str(o, "s", true, NULL, 1, &s, &d), WK_ETOOBIG);
    assert_int_equal(wk_json_get_str(o, "i", true, NULL, 10, &s, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "'i'"));
    assert_int_equal(wk_json_get_str(o, "missing", true, NULL, 10, &s, &d), WK_ENOENT);
    assert_int_equal(wk_json_get_str(o, "n", false, "dflt", 10, &s, &d), WK_OK);
    assert_string_equal(s, "dflt");
    assert_int_equal(wk_json_get_i64(o, "i", true, 0, 0, 10, &i, &d), WK_OK);
    assert_int_equal(i, 5);
    assert_int_equal(wk_json_get_i64(o, "i", true, 0, 6, 10, &i, &d), WK_EINVAL);
    assert_int_equal(wk_json_get_i64(o, "f", true, 0, 0, 10, &i, &d), WK_EINVAL);
    assert_int_equal(wk_json_get_num(o, "f", true, 0, 0, 1, &f, &d), WK_OK);
    assert_true(f == 0.5);
    assert_int_equal(wk_json_get_num(o, "i", true, 0, 0, 10, &f, &d), WK_OK);
    assert_true(f == 5.0);
    assert_int_equal(wk_json_get_num(o, "i", true, 0, 0, 1, &f, &d), WK_EINVAL);
    assert_int_equal(wk_json_get_bool(o, "b", false, &b, &d), WK_OK);
    assert_true(b);
    assert_int_equal(wk_json_get_bool(o, "i", false, &b, &d), WK_EINVAL);
    assert_int_equal(wk_json_get_bool(o, "missing", true, &b, &d), WK_OK);
    assert_true(b);
    json_decref(o);
}

static void
test_canonical(void **state)
{
    (void)state;
    /* Expected strings are what Python writes with
     * json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False). */
    json_t *v = parse("{\"b\":\"x\\u001b\\u007f/\\u00e9\\u2028\\n\\t\\\"\\\\\",\"a\":[1,2.5,"
                      "true,null,{\"z\":1,\"y\":2}],\"c\":1.0,\"d\":1e-05}");
    char *s = wk_json_dump_canonical(v);
    assert_string_equal(s, "{\"a\":[1,2.5,true,null,{\"y\":2,\"z\":1}],\"b\":\"x\\u001b\x7f/"
                           "\xc3\xa9\xe2\x80\xa8\\n\\t\\\"\\\\\",\"c\":1.0,\"d\":1e-05}");
    free(s);
    json_decref(v);
}

static void
test_utf8_scrub(void **state)
{
    (void)state;
    /* Bad bytes become '?', good characters (1 to 4 bytes) stay. */
    char *s = wk_json_utf8_scrub("a\xc3\xa9\xc3 \xff\xed\xa0\x80 \xf0\x9f\x98\x80");
    assert_non_null(s);
    assert_string_equal(s, "a\xc3\xa9? ???? \xf0\x9f\x98\x80");
    free(s);
    s = wk_json_utf8_scrub("");
    assert_string_equal(s, "");
    free(s);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_canonical),
        cmocka_unit_test(test_utf8_scrub),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
