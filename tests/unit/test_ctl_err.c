/*
 * Unit tests for ctl_err: every wk_err has an HTTP status and an OpenAI type
 * and code, and the OpenAI error body is well-formed JSON whatever bytes the
 * message quotes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ctl_err.h"
#include "wk_json.h"

static json_t *
parse(const char *s)
{
    json_t *v = NULL;
    assert_non_null(s);
    assert_int_equal(wk_json_parse(s, strlen(s), &v, NULL), WK_OK);
    return v;
}

static void
test_every_code_mapped(void **state)
{
    (void)state;
    for (int e = 0; e < WK_ERR__COUNT; e++) {
        int h = ctl_err_http_status((wk_err)e);
        assert_true(h >= 200 && h < 600);
        if (e != WK_OK) {
            assert_true(h >= 400);
            assert_true(strlen(ctl_err_openai_type((wk_err)e)) > 0);
            assert_true(strlen(ctl_err_openai_code((wk_err)e)) > 0);
        }
    }
    assert_int_equal(ctl_err_http_status(WK_OK), 200);
}

static void
test_http_mapping(void **state)
{
    (void)state;
    assert_int_equal(ctl_err_http_status(WK_EINVAL), 400);
    assert_int_equal(ctl_err_http_status(WK_ENOTSUP), 400);
    assert_int_equal(ctl_err_http_status(WK_EAUTH), 401);
    assert_int_equal(ctl_err_http_status(WK_EPERM), 403);
    assert_int_equal(ctl_err_http_status(WK_ENOENT), 404);
    assert_int_equal(ctl_err_http_status(WK_EBUSY), 409);
    assert_int_equal(ctl_err_http_status(WK_ESTATE), 409);
    assert_int_equal(ctl_err_http_status(WK_ETOOBIG), 413);
    assert_int_equal(ctl_err_http_status(WK_EQUEUEFULL), 429);
    assert_int_equal(ctl_err_http_status(WK_EQUOTA), 429);
    assert_int_equal(ctl_err_http_status(WK_EPROTO), 502);
    assert_int_equal(ctl_err_http_status(WK_EUNAVAIL), 503);
    assert_int_equal(ctl_err_http_status(WK_ENOSPC), 503);
    assert_int_equal(ctl_err_http_status(WK_ETIMEDOUT), 504);
    assert_int_equal(ctl_err_http_status(WK_ECORRUPT), 500);
    assert_string_equal(ctl_err_openai_type(WK_EINVAL), "invalid_request_error");
    assert_string_equal(ctl_err_openai_type(WK_EAUTH), "authentication_error");
    assert_string_equal(ctl_err_openai_type(WK_EPERM), "permission_error");
    assert_string_equal(ctl_err_openai_type(WK_EQUOTA), "rate_limit_error");
    assert_string_equal(ctl_err_openai_code(WK_EQUEUEFULL), "queue_full");
    assert_string_equal(ctl_err_openai_code(WK_EQUOTA), "quota_exceeded");
    assert_string_equal(ctl_err_openai_code(WK_EAUTH), "invalid_api_key");
    /* Out of range values never crash. */
    assert_int_equal(ctl_err_http_status((wk_err)9999), 500);
    assert_int_equal(ctl_err_http_status((wk_err)-1), 500);
    assert_string_equal(ctl_err_openai_type((wk_err)9999), "server_error");
    assert_string_equal(ctl_err_openai_code((wk_err)9999), "internal_error");
}

static void
test_error_body(void **state)
{
    (void)state;
    char *s = ctl_err_body(WK_EINVAL, "bad \"tools\"", "tools");
    json_t *v = parse(s);
    json_t *e = json_object_get(v, "error");
    assert_string_equal(json_string_value(json_object_get(e, "message")), "bad \"tools\"");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(e, "param")), "tools");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "invalid_request");
    json_decref(v);
    free(s);
    s = ctl_err_body(WK_EUNAVAIL, "no worker", NULL);
    v = parse(s);
    assert_true(json_is_null(json_object_get(json_object_get(v, "error"), "param")));
    json_decref(v);
    free(s);
    /*
     * A message quoting client input cut inside a character (vsnprintf at 512
     * bytes) used to give NULL, answered as 500 "{}"; found by fuzz_chat_body.
     * Bad bytes become '?', good characters stay.
     */
    s = ctl_err_body(WK_EINVAL, "role '\xc3\xa9\xc3' \xff\xed\xa0\x80 \xf0\x9f\x98\x80", "p\xc3");
    assert_non_null(s);
    v = parse(s);
    e = json_object_get(v, "error");
    assert_string_equal(json_string_value(json_object_get(e, "message")),
                        "role '\xc3\xa9?' ???? \xf0\x9f\x98\x80");
    assert_string_equal(json_string_value(json_object_get(e, "param")), "p?");
    json_decref(v);
    free(s);
}

static void
test_error_body_code(void **state)
{
    (void)state;
    char *s = ctl_err_body_code(WK_EINVAL, "too long", "messages", "context_length_exceeded");
    json_t *v = parse(s);
    json_t *e = json_object_get(v, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "context_length_exceeded");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    json_decref(v);
    free(s);
    s = ctl_err_body_code(WK_EQUOTA, NULL, NULL, NULL);
    v = parse(s);
    e = json_object_get(v, "error");
    assert_string_equal(json_string_value(json_object_get(e, "message")), "");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "quota_exceeded");
    json_decref(v);
    free(s);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_code_mapped),
        cmocka_unit_test(test_http_mapping),
        cmocka_unit_test(test_error_body),
        cmocka_unit_test(test_error_body_code),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
