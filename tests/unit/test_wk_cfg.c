/* Unit tests for wk_cfg: precedence, validation, help and sample output. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wk_cfg.h"

static const wk_cfg_opt table[] = {
    {"port", WK_CFG_U64, "8000", 1, 65535, "HTTP port"},
    {"host", WK_CFG_STR, "127.0.0.1", 0, 0, "bind address"},
    {"verbose", WK_CFG_BOOL, "false", 0, 0, "more logs"},
    {"data-dir", WK_CFG_STR, NULL, 0, 0, "data directory"},
};
#define N (sizeof(table) / sizeof(table[0]))

static void
test_defaults(void **state)
{
    (void)state;
    char *argv[] = {"prog", NULL};
    wk_cfg *c = NULL;
    assert_int_equal(wk_cfg_parse(table, N, NULL, 1, argv, &c, NULL), WK_OK);
    assert_int_equal(wk_cfg_get_u64(c, "port"), 8000);
    assert_string_equal(wk_cfg_get_str(c, "host"), "127.0.0.1");
    assert_false(wk_cfg_get_bool(c, "verbose"));
    assert_null(wk_cfg_get_str(c, "data-dir"));
    assert_false(wk_cfg_is_set(c, "port"));
    wk_cfg_free(c);
}

static void
test_precedence(void **state)
{
    (void)state;
    char path[] = "/tmp/wk_cfg_XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    fputs("# comment\nport = 9000\nhost=0.0.0.0\n\nverbose = yes\n", f);
    fclose(f);
    setenv("WKTEST_HOST", "10.0.0.1", 1);
    char *argv[] = {"prog", "--config", path, "--port=9100", "pos1", "--data-dir", "/x", NULL};
    wk_cfg *c = NULL;
    wk_diag d = {{0}};
    assert_int_equal(wk_cfg_parse(table, N, "WKTEST", 7, argv, &c, &d), WK_OK);
    assert_int_equal(wk_cfg_get_u64(c, "port"), 9100);          /* flag beats file */
    assert_string_equal(wk_cfg_get_str(c, "host"), "10.0.0.1"); /* env beats file */
    assert_true(wk_cfg_get_bool(c, "verbose"));                 /* file beats default */
    assert_string_equal(wk_cfg_get_str(c, "data-dir"), "/x");
    assert_int_equal(wk_cfg_npos(c), 1);
    assert_string_equal(wk_cfg_pos(c, 0), "pos1");
    assert_true(wk_cfg_is_set(c, "port"));
    wk_cfg_free(c);
    unsetenv("WKTEST_HOST");
    unlink(path);
}

static void
test_errors(void **state)
{
    (void)state;
    wk_cfg *c = NULL;
    wk_diag d = {{0}};
    char *a1[] = {"prog", "--port", "0", NULL};
    assert_int_equal(wk_cfg_parse(table, N, NULL, 3, a1, &c, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "port"));
    assert_non_null(strstr(d.msg, "out of range"));
    char *a2[] = {"prog", "--port", "12x", NULL};
    assert_int_equal(wk_cfg_parse(table, N, NULL, 3, a2, &c, &d), WK_EINVAL);
    char *a3[] = {"prog", "--nope", NULL};
    assert_int_equal(wk_cfg_parse(table, N, NULL, 2, a3, &c, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "--nope"));
    char *a4[] = {"prog", "--host", NULL};
    assert_int_equal(wk_cfg_parse(table, N, NULL, 2, a4, &c, &d), WK_EINVAL);
    char *a5[] = {"prog", "--port", "-5", NULL};
    assert_int_equal(wk_cfg_parse(table, N, NULL, 3, a5, &c, &d), WK_EINVAL);
    char *a6[] = {"prog", "--config", "/nonexistent/x.conf", NULL};
    assert_int_equal(wk_cfg_parse(table, N, NULL, 3, a6, &c, &d), WK_ENOENT);
    setenv("WKTEST_PORT", "abc", 1);
    char *a7[] = {"prog", NULL};
    assert_int_equal(wk_cfg_parse(table, N, "WKTEST", 1, a7, &c, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "WKTEST_PORT"));
    unsetenv("WKTEST_PORT");
    char path[] = "/tmp/wk_cfg_XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    fputs("port = 1\nbogus line\n", f);
    fclose(f);
    char *a8[] = {"prog", "--config", path, NULL};
    assert_int_equal(wk_cfg_parse(table, N, NULL, 3, a8, &c, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "line 2"));
    unlink(path);
    char *a9[] = {"prog", "--verbose", "maybe", NULL};
    /* "maybe" is not a bool word, so --verbose alone is true and "maybe" is positional. */
    assert_int_equal(wk_cfg_parse(table, N, NULL, 3, a9, &c, &d), WK_OK);
    assert_true(wk_cfg_get_bool(c, "verbose"));
    assert_int_equal(wk_cfg_npos(c), 1);
    wk_cfg_free(c);
    char *a10[] = {"prog", "--verbose=maybe", NULL};
    assert_int_equal(wk_cfg_parse(table, N, NULL, 2, a10, &c, &d), WK_EINVAL);
}

static void
test_help(void **state)
{
    (void)state;
    char *argv[] = {"prog", "--help", NULL};
    wk_cfg *c = NULL;
    assert_int_equal(wk_cfg_parse(table, N, NULL, 2, argv, &c, NULL), WK_OK);
    assert_true(wk_cfg_help_requested(c));
    assert_false(wk_cfg_version_requested(c));
    wk_cfg_free(c);
    char *vargv[] = {"prog", "--version", NULL};
    assert_int_equal(wk_cfg_parse(table, N, NULL, 2, vargv, &c, NULL), WK_OK);
    assert_true(wk_cfg_version_requested(c) && !wk_cfg_help_requested(c));
    wk_cfg_free(c);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    wk_cfg_print_help(table, N, "prog", "does things", "WKTEST", f);
    fclose(f);
    assert_non_null(strstr(buf, "--port N"));
    assert_non_null(strstr(buf, "(default: 8000) [1..65535]"));
    assert_non_null(strstr(buf, "WKTEST_<NAME>"));
    free(buf);
    f = open_memstream(&buf, &len);
    wk_cfg_print_sample(table, N, f);
    fclose(f);
    assert_non_null(strstr(buf, "# port = 8000"));
    free(buf);
}

/* An older name (WK_CFG_ALIAS) sets its option from a flag, the env and a file; the
 * current name wins; --help lists it beside its option, the sample config does not. */
static void
test_alias(void **state)
{
    (void)state;
    static const wk_cfg_opt t[] = {
        {"link-url", WK_CFG_STR, NULL, 0, 0, "the link"},
        {"link-allow-plain-tcp", WK_CFG_BOOL, "false", 0, 0, "force plain tcp"},
        {"worker-url", WK_CFG_ALIAS, "link-url", 0, 0, "older name"},
        {"allow-remote-workers", WK_CFG_ALIAS, "link-allow-plain-tcp", 0, 0, "older name"},
    };
    wk_cfg *c = NULL;
    char *a1[] = {"prog", "--worker-url", "tcp://x:1", "--allow-remote-workers", NULL};
    assert_int_equal(wk_cfg_parse(t, 4, NULL, 4, a1, &c, NULL), WK_OK);
    assert_string_equal(wk_cfg_get_str(c, "link-url"), "tcp://x:1");
    assert_string_equal(wk_cfg_get_str(c, "worker-url"), "tcp://x:1");
    assert_true(wk_cfg_get_bool(c, "link-allow-plain-tcp") && wk_cfg_is_set(c, "link-url"));
    wk_cfg_free(c);
    setenv("WKALIAS_WORKER_URL", "tcp://old:1", 1);
    setenv("WKALIAS_LINK_URL", "tcp://new:1", 1);
    char *a2[] = {"prog", NULL};
    assert_int_equal(wk_cfg_parse(t, 4, "WKALIAS", 1, a2, &c, NULL), WK_OK);
    assert_string_equal(wk_cfg_get_str(c, "link-url"), "tcp://new:1");
    wk_cfg_free(c);
    unsetenv("WKALIAS_LINK_URL");
    assert_int_equal(wk_cfg_parse(t, 4, "WKALIAS", 1, a2, &c, NULL), WK_OK);
    assert_string_equal(wk_cfg_get_str(c, "link-url"), "tcp://old:1");
    wk_cfg_free(c);
    unsetenv("WKALIAS_WORKER_URL");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    wk_cfg_print_help(t, 4, "prog", "x", NULL, f);
    fclose(f);
    assert_non_null(strstr(buf, "--link-url STR"));
    assert_non_null(strstr(buf, "(also --worker-url)"));
    assert_null(strstr(buf, "--worker-url STR"));
    free(buf);
    f = open_memstream(&buf, &len);
    wk_cfg_print_sample(t, 4, f);
    fclose(f);
    assert_null(strstr(buf, "worker-url"));
    free(buf);
}

/* The struct binding: fill copies every bound option; valid catches every kind of mismatch. */
typedef struct bind_conf {
    unsigned port;
    uint32_t port32;
    const char *host;
    bool verbose;
    const char *data_dir;
} bind_conf;

static void
test_bind(void **state)
{
    (void)state;
    const wk_cfg_bind good[] = {
        WK_CFG_BIND(bind_conf, "port", UINT, port),
        WK_CFG_BIND(bind_conf, "port", U32, port32),
        WK_CFG_BIND(bind_conf, "host", STR, host),
        WK_CFG_BIND(bind_conf, "verbose", BOOL, verbose),
        WK_CFG_BIND(bind_conf, "data-dir", STR, data_dir),
    };
    assert_true(wk_cfg_binds_valid(table, N, good, 5));
    char *argv[] = {"prog", "--port", "81", "--verbose", NULL};
    wk_cfg *c = NULL;
    assert_int_equal(wk_cfg_parse(table, N, NULL, 4, argv, &c, NULL), WK_OK);
    bind_conf bc;
    memset(&bc, 0xff, sizeof(bc));
    wk_cfg_fill(c, good, 5, &bc);
    assert_int_equal(bc.port, 81);
    assert_int_equal(bc.port32, 81);
    assert_string_equal(bc.host, "127.0.0.1");
    assert_true(bc.verbose);
    assert_null(bc.data_dir);
    wk_cfg_free(c);

    /* an option left unbound, a bound name not in the table, a type that does not match */
    assert_false(wk_cfg_binds_valid(table, N, good, 4)); /* data-dir unbound */
    const wk_cfg_bind unknown[] = {WK_CFG_BIND(bind_conf, "nope", STR, host)};
    assert_false(wk_cfg_binds_valid(table, N, unknown, 1));
    const wk_cfg_bind wrong[] = {
        WK_CFG_BIND(bind_conf, "port", STR, host),
        WK_CFG_BIND(bind_conf, "host", STR, host),
        WK_CFG_BIND(bind_conf, "verbose", BOOL, verbose),
        WK_CFG_BIND(bind_conf, "data-dir", STR, data_dir),
    };
    assert_false(wk_cfg_binds_valid(table, N, wrong, 4));
    /* a u64 whose largest value does not fit a 32-bit field */
    const wk_cfg_opt big[] = {{"bytes", WK_CFG_U64, "0", 0, UINT64_MAX, "x"}};
    const wk_cfg_bind narrow[] = {WK_CFG_BIND(bind_conf, "bytes", U32, port32)};
    assert_false(wk_cfg_binds_valid(big, 1, narrow, 1));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_alias),
        cmocka_unit_test(test_bind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
