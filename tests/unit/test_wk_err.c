/*
 * Unit tests for wk_err: every code has a name and a string. The HTTP
 * mapping is the controller's (tests/unit/test_ctl_err.c).
 */
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
        assert_true(strlen(wk_strerror((wk_err)e)) > 0);
    }
}

static void
test_out_of_range(void **state)
{
    (void)state;
    /* Out of range values never crash. */
    assert_string_equal(wk_strerror((wk_err)-1), "unknown error");
    assert_string_equal(wk_strerror((wk_err)9999), "unknown error");
    assert_string_equal(wk_err_name((wk_err)WK_ERR__COUNT), "WK_E?");
    assert_string_equal(wk_err_name(WK_EINVAL), "WK_EINVAL");
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
        cmocka_unit_test(test_out_of_range),
        cmocka_unit_test(test_diag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
