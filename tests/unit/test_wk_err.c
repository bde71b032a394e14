/* Unit tests for wk_err: every code has a name, a string and an HTTP mapping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "wk_err.h"

static void
test_every_code_mapped(void **state)
{
    (void)state;
    for (int e = 0; e < WK_ERR__COUNT; e++) {
        assert_non_null(wk_strerror((wk_err)e));
        assert_string_not_equal(wk_err_name((wk_err)e), "WK_E?");
        int h = wk_err_http_status((wk_err)e);
        assert_true(h >= 200 && h < 600);
        if (e != WK_OK) {
            assert_true(h >= 400);
            assert_true(strlen(wk_err_openai_type((wk_err)e)) > 0);
            assert_true(strlen(wk_err_openai_code((wk_err)e)) > 0);
        }
    }
}

static void
test_http_mapping(void **state)
{
    (void)state;
    assert_int_equal(wk_err_http_status(WK_EINVAL), 400);
    assert_int_equal(wk_err_http_status(WK_EAUTH), 401);
    assert_int_equal(wk_err_http_status(WK_EPERM), 403);
    assert_int_equal(wk_err_http_status(WK_ENOENT), 404);
    assert_int_equal(wk_err_http_status(WK_EBUSY), 409);
    assert_int_equal(wk_err_http_status(WK_ETOOBIG), 413);
    assert_int_equal(wk_err_http_status(WK_EQUEUEFULL), 429);
    assert_int_equal(wk_err_http_status(WK_EUNAVAIL), 503);
    assert_int_equal(wk_err_http_status(WK_ETIMEDOUT), 504);
    assert_string_equal(wk_err_openai_type(WK_EINVAL), "invalid_request_error");
    assert_string_equal(wk_err_openai_type(WK_EAUTH), "authentication_error");
    /* Out of range values never crash. */
    assert_int_equal(wk_err_http_status((wk_err)9999), 500);
    assert_string_equal(wk_strerror((wk_err)-1), "unknown error");
}

static void
test_diag(void **state)
{
    (void)state;
    wk_diag d = {{0}};
    assert_int_equal(wk_diag_set(&d, WK_EINVAL, "tensor %s bad", "x"), WK_EINVAL);
    assert_string_equal(d.msg, "tensor x bad");
    wk_diag_prefix(&d, "file %d", 3);
    assert_string_equal(d.msg, "file 3: tensor x bad");
    /* NULL diag is fine. */
    assert_int_equal(wk_diag_set(NULL, WK_EIO, "x"), WK_EIO);
    wk_diag_prefix(NULL, "x");
    /* Long messages are truncated, NUL-terminated. */
    char big[2000];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    wk_diag_set(&d, WK_EINVAL, "%s", big);
    assert_int_equal(strlen(d.msg), sizeof(d.msg) - 1);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_code_mapped),
        cmocka_unit_test(test_http_mapping),
        cmocka_unit_test(test_diag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
