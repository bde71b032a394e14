/* Unit tests for wk_log: level filtering, line format, no formatting below threshold. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define WK_LOG_MODULE "testmod"
#include "wk_log.h"

static int calls;

static const char *
counted(void)
{
    calls++;
    return "x";
}

static void
read_pipe(int fd, char *buf, size_t cap)
{
    ssize_t n = read(fd, buf, cap - 1);
    buf[n > 0 ? n : 0] = '\0';
}

static void
test_levels_and_format(void **state)
{
    (void)state;
    int p[2];
    assert_int_equal(pipe(p), 0);
    wk_log_set_fd(p[1]);
    assert_int_equal(wk_log_set_level_name("info"), WK_OK);
    calls = 0;
    wk_log_debug("hidden %s", counted());
    assert_int_equal(calls, 0); /* not even the arguments are evaluated */
    wk_log_info("worker registered worker=%s", "w0");
    char buf[4096];
    read_pipe(p[0], buf, sizeof(buf));
    assert_non_null(strstr(buf, " info  testmod: worker registered worker=w0\n"));
    assert_true(buf[4] == '-' && buf[10] == 'T');
    assert_int_equal(wk_log_set_level_name("nope"), WK_EINVAL);
    assert_int_equal(wk_log_set_level_name("DEBUG"), WK_OK);
    wk_log_debug("now %s", counted());
    assert_int_equal(calls, 1);
    read_pipe(p[0], buf, sizeof(buf));
    assert_non_null(strstr(buf, "debug testmod: now x"));
    /* An over-long line is cut and still ends with one newline. */
    char big[5000];
    memset(big, 'b', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    wk_log_error("%s", big);
    read_pipe(p[0], buf, sizeof(buf));
    size_t len = strlen(buf);
    assert_true(len < 2100);
    assert_int_equal(buf[len - 1], '\n');
    assert_null(strchr(buf, '\n') + 1 < buf + len ? strchr(strchr(buf, '\n') + 1, '\n') : NULL);
    close(p[0]);
    close(p[1]);
    wk_log_set_fd(2);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels_and_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
