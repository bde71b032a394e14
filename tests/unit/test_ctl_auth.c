/*
 * Unit tests for ctl_auth: the key file (format, refusal of a file that
 * group or others may read), Bearer and x-api-key lookups, admin rights.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctl_auth.h"

/* Writes text to a fresh temp file (name into path) with mode. */
static void
write_keys(char *path, size_t cap, const char *text, mode_t mode)
{
    snprintf(path, cap, "/tmp/wkvm-auth-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(chmod(path, mode), 0);
}

static const char keys_text[] =
    "# key user [admin]\n"
    "sk-user-0123456789 alice\n"
    "\n"
    "sk-admin-0123456789 ops admin  # comment\n";

static void
test_mode_refused(void **state)
{
    (void)state;
    static const mode_t bad[] = {0644, 0640, 0604, 0660, 0610, 0601};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char path[64];
        write_keys(path, sizeof(path), keys_text, bad[i]);
        ctl_auth *a = NULL;
        wk_diag d = {{0}};
        assert_int_equal(ctl_auth_load(path, &a, &d), WK_EPERM);
        assert_null(a);
        assert_non_null(strstr(d.msg, "chmod 600"));
        assert_non_null(strstr(d.msg, path));
        unlink(path);
    }
    static const mode_t good[] = {0600, 0400};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        char path[64];
        write_keys(path, sizeof(path), keys_text, good[i]);
        ctl_auth *a = NULL;
        wk_diag d = {{0}};
        assert_int_equal(ctl_auth_load(path, &a, &d), WK_OK);
        assert_true(ctl_auth_enabled(a));
        ctl_auth_free(a);
        unlink(path);
    }
}

static void
test_lookups(void **state)
{
    (void)state;
    char path[64];
    write_keys(path, sizeof(path), keys_text, 0600);
    ctl_auth *a = NULL;
    wk_diag d = {{0}};
    assert_int_equal(ctl_auth_load(path, &a, &d), WK_OK);
    unlink(path);
    const char *user = NULL;
    bool admin = true;
    assert_int_equal(ctl_auth_check(a, "Bearer sk-user-0123456789", NULL, &user, &admin), WK_OK);
    assert_string_equal(user, "alice");
    assert_false(admin);
    assert_int_equal(ctl_auth_check(a, "bearer  sk-admin-0123456789 ", NULL, &user, &admin),
                     WK_OK);
    assert_string_equal(user, "ops");
    assert_true(admin);
    /* x-api-key alone. */
    assert_int_equal(ctl_auth_check(a, NULL, "sk-user-0123456789", &user, &admin), WK_OK);
    assert_string_equal(user, "alice");
    assert_false(admin);
    /* A non-Bearer Authorization (or an unknown bearer key) falls back to x-api-key. */
    assert_int_equal(ctl_auth_check(a, "Basic Zm9vOmJhcg==", "sk-admin-0123456789", &user,
                                    &admin), WK_OK);
    assert_string_equal(user, "ops");
    assert_int_equal(ctl_auth_check(a, "Bearer wrong-key-000", "sk-user-0123456789", &user,
                                    &admin), WK_OK);
    assert_string_equal(user, "alice");
    /* Refusals. */
    assert_int_equal(ctl_auth_check(a, NULL, NULL, &user, &admin), WK_EAUTH);
    assert_int_equal(ctl_auth_check(a, "Bearer ", NULL, &user, &admin), WK_EAUTH);
    assert_int_equal(ctl_auth_check(a, "Bearer sk-user-012345678", NULL, &user, &admin),
                     WK_EAUTH);
    assert_int_equal(ctl_auth_check(a, "Bearer sk-user-01234567890", NULL, &user, &admin),
                     WK_EAUTH);
    assert_int_equal(ctl_auth_check(a, "sk-user-0123456789", NULL, &user, &admin), WK_EAUTH);
    assert_int_equal(ctl_auth_check(a, NULL, "", &user, &admin), WK_EAUTH);
    assert_int_equal(ctl_auth_check(a, NULL, "wrong-key-000", &user, &admin), WK_EAUTH);
    ctl_auth_free(a);
}

static void
test_no_keys_and_bad_files(void **state)
{
    (void)state;
    ctl_auth *a = NULL;
    wk_diag d = {{0}};
    assert_int_equal(ctl_auth_load(NULL, &a, &d), WK_OK);
    assert_false(ctl_auth_enabled(a));
    const char *user = NULL;
    bool admin = false;
    assert_int_equal(ctl_auth_check(a, NULL, NULL, &user, &admin), WK_OK);
    assert_string_equal(user, "local");
    assert_true(admin);
    ctl_auth_free(a);
    assert_int_equal(ctl_auth_load("/nonexistent/wkvm-keys", &a, &d), WK_ENOENT);
    static const char *const bad[] = {
        "short alice\n", "sk-0123456789\n", "sk-0123456789 alice root\n",
        "sk-0123456789 __system\n", "# only comments\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char path[64];
        write_keys(path, sizeof(path), bad[i], 0600);
        a = NULL;
        assert_int_equal(ctl_auth_load(path, &a, &d), WK_EINVAL);
        assert_null(a);
        unlink(path);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mode_refused),
        cmocka_unit_test(test_lookups),
        cmocka_unit_test(test_no_keys_and_bad_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
