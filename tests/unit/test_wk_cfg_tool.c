/*
 * Unit tests for wk_cfg_tool: a tool's command line filled into its options
 * struct, --help / --version / --sample-config answered with status 0, usage
 * errors with one "PROG: ..." line and status 2.
 */
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

#include "wk_cfg_tool.h"

typedef struct t_args {
    const char *name;
    uint32_t count;
    uint64_t seed;
    bool force;
} t_args;

static const wk_cfg_opt t_table[] = {
    {"name", WK_CFG_STR, NULL, 0, 0, "a name"},
    {"count", WK_CFG_U64, "4", 1, 64, "how many"},
    {"seed", WK_CFG_U64, "1", 0, UINT64_MAX, "PRNG seed"},
    {"force", WK_CFG_BOOL, NULL, 0, 0, "overwrite"},
};

static const wk_cfg_bind t_binds[] = {
    WK_CFG_BIND(t_args, "name", STR, name),
    WK_CFG_BIND(t_args, "count", U32, count),
    WK_CFG_BIND(t_args, "seed", U64, seed),
    WK_CFG_BIND(t_args, "force", BOOL, force),
};

static const wk_cfg_tool t_tool = {
    .prog = "wkvm-t",
    .about = "Does a test thing.",
    .opts = t_table,
    .n_opts = 4,
    .binds = t_binds,
    .n_binds = 4,
};

/* Runs wk_cfg_tool_parse with fd (1 or 2) captured into out (NUL-terminated). */
static int
t_parse(int argc, char **argv, t_args *a, wk_cfg **cfg, int fd, char *out, size_t cap)
{
    char path[] = "/tmp/wkvm-test-cfg-tool.XXXXXX";
    int tmp = mkstemp(path);
    assert_true(tmp >= 0);
    unlink(path);
    fflush(stdout);
    fflush(stderr);
    int saved = dup(fd);
    assert_true(saved >= 0);
    assert_true(dup2(tmp, fd) >= 0);
    int rc = wk_cfg_tool_parse(&t_tool, argc, argv, a, cfg);
    fflush(stdout);
    fflush(stderr);
    assert_true(dup2(saved, fd) >= 0);
    close(saved);
    ssize_t n = pread(tmp, out, cap - 1, 0);
    close(tmp);
    out[n > 0 ? (size_t)n : 0] = '\0';
    return rc;
}

static void
test_run(void **state)
{
    (void)state;
    char *argv[] = {"wkvm-t", "--name", "x", "--count=9", "--force",
                    "--seed", "18446744073709551615", NULL};
    t_args a = {0};
    wk_cfg *cfg = NULL;
    char out[4096];
    assert_int_equal(t_parse(7, argv, &a, &cfg, 2, out, sizeof(out)), WK_CFG_TOOL_RUN);
    assert_non_null(cfg);
    assert_string_equal(out, "");
    assert_string_equal(a.name, "x");
    assert_int_equal(a.count, 9);
    assert_true(a.seed == UINT64_MAX);
    assert_true(a.force);
    assert_true(wk_cfg_is_set(cfg, "count"));
    wk_cfg_free(cfg);

    char *argv2[] = {"wkvm-t", NULL};
    t_args b = {.count = 77, .force = true};
    assert_int_equal(t_parse(1, argv2, &b, &cfg, 2, out, sizeof(out)), WK_CFG_TOOL_RUN);
    assert_null(b.name);
    assert_int_equal(b.count, 4); /* the table's default */
    assert_int_equal(b.seed, 1);
    assert_false(b.force);
    assert_false(wk_cfg_is_set(cfg, "count"));
    wk_cfg_free(cfg);
}

static void
test_answers(void **state)
{
    (void)state;
    t_args a = {0};
    wk_cfg *cfg = (wk_cfg *)&a;
    char out[4096];
    char *v[] = {"wkvm-t", "--count", "3", "--version", NULL};
    assert_int_equal(t_parse(4, v, &a, &cfg, 1, out, sizeof(out)), 0);
    assert_null(cfg);
    assert_string_equal(out, "wkvm-t " WK_VERSION "\n");

    char *h[] = {"wkvm-t", "--help", NULL};
    assert_int_equal(t_parse(2, h, &a, &cfg, 1, out, sizeof(out)), 0);
    assert_null(cfg);
    assert_non_null(strstr(out, "Usage: wkvm-t [OPTIONS]\nDoes a test thing.\n"));
    assert_non_null(strstr(out, "--count N"));
    assert_non_null(strstr(out, "how many (default: 4) [1..64]"));
    assert_null(strstr(out, "environment")); /* a tool reads no environment */

    char *s[] = {"wkvm-t", "--sample-config", NULL};
    assert_int_equal(t_parse(2, s, &a, &cfg, 1, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "count"));
    assert_null(a.name); /* nothing filled */
}

static void
test_usage_errors(void **state)
{
    (void)state;
    t_args a = {0};
    wk_cfg *cfg = NULL;
    char out[4096];
    char *u[] = {"wkvm-t", "--bogus", NULL};
    assert_int_equal(t_parse(2, u, &a, &cfg, 2, out, sizeof(out)), 2);
    assert_null(cfg);
    assert_string_equal(out, "wkvm-t: unknown option --bogus (see --help)\n");

    char *r[] = {"wkvm-t", "--count", "65", NULL};
    assert_int_equal(t_parse(3, r, &a, &cfg, 2, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "wkvm-t: "));
    assert_non_null(strstr(out, "out of range [1, 64]"));

    char *p[] = {"wkvm-t", "--name", "x", "extra", NULL};
    assert_int_equal(t_parse(4, p, &a, &cfg, 2, out, sizeof(out)), 2);
    assert_null(cfg);
    assert_string_equal(out, "wkvm-t: unexpected argument 'extra' (see --help)\n");

    char *m[] = {"wkvm-t", "--name", NULL};
    assert_int_equal(t_parse(2, m, &a, &cfg, 2, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "needs a value"));

    setenv("WKVM_COUNT", "5", 1); /* no environment, whatever the prefix */
    char *e[] = {"wkvm-t", NULL};
    assert_int_equal(t_parse(1, e, &a, &cfg, 2, out, sizeof(out)), WK_CFG_TOOL_RUN);
    assert_int_equal(a.count, 4);
    wk_cfg_free(cfg);
    unsetenv("WKVM_COUNT");
}

/* A tool with positional arguments and its own usage status. */
static void
test_positionals(void **state)
{
    (void)state;
    wk_cfg_tool pt = t_tool;
    pt.args = "FILE [MORE]";
    pt.max_pos = 2;
    pt.usage_status = 3;
    t_args a = {0};
    wk_cfg *cfg = NULL;
    char *ok[] = {"wkvm-t", "one", "--count", "2", "-", NULL};
    assert_int_equal(wk_cfg_tool_parse(&pt, 5, ok, &a, &cfg), WK_CFG_TOOL_RUN);
    assert_int_equal(wk_cfg_npos(cfg), 2);
    assert_string_equal(wk_cfg_pos(cfg, 0), "one");
    assert_string_equal(wk_cfg_pos(cfg, 1), "-");
    assert_int_equal(a.count, 2);
    wk_cfg_free(cfg);

    char out[4096];
    char path[] = "/tmp/wkvm-test-cfg-tool.XXXXXX";
    int tmp = mkstemp(path);
    assert_true(tmp >= 0);
    unlink(path);
    fflush(stderr);
    int fd2 = dup(2);
    assert_true(dup2(tmp, 2) >= 0);
    char *three[] = {"wkvm-t", "a", "b", "c", NULL};
    int rc1 = wk_cfg_tool_parse(&pt, 4, three, &a, &cfg);
    char *bad[] = {"wkvm-t", "--nope", NULL};
    int rc2 = wk_cfg_tool_parse(&pt, 2, bad, &a, &cfg);
    fflush(stderr);
    assert_true(dup2(fd2, 2) >= 0);
    close(fd2);
    ssize_t n = pread(tmp, out, sizeof(out) - 1, 0);
    close(tmp);
    out[n > 0 ? (size_t)n : 0] = '\0';
    assert_int_equal(rc1, 3);
    assert_int_equal(rc2, 3);
    assert_string_equal(out, "wkvm-t: unexpected argument 'c' (see --help)\n"
                             "wkvm-t: unknown option --nope (see --help)\n");
}

/* A string option's own length limit (a long --tokens list): longer than
 * WK_CFG_STR_MAX is taken when the option allows it, refused past its limit. */
static void
test_long_string(void **state)
{
    (void)state;
    static const wk_cfg_opt lt[] = {
        {"name", WK_CFG_STR, NULL, 0, 0, "a name"},
        {"list", WK_CFG_STR, NULL, 0, 3 * WK_CFG_STR_MAX, "a long list"},
    };
    typedef struct l_args {
        const char *name;
        const char *list;
    } l_args;
    static const wk_cfg_bind lb[] = {
        WK_CFG_BIND(l_args, "name", STR, name),
        WK_CFG_BIND(l_args, "list", STR, list),
    };
    wk_cfg_tool tl = {.prog = "wkvm-t", .about = "x", .opts = lt, .n_opts = 2, .binds = lb,
                      .n_binds = 2};
    size_t n = 2 * WK_CFG_STR_MAX;
    char *v = malloc(n + 1);
    assert_non_null(v);
    memset(v, '7', n);
    v[n] = '\0';
    l_args a = {0};
    wk_cfg *cfg = NULL;
    char *ok[] = {"wkvm-t", "--list", v, NULL};
    assert_int_equal(wk_cfg_tool_parse(&tl, 3, ok, &a, &cfg), WK_CFG_TOOL_RUN);
    assert_int_equal(strlen(a.list), n);
    wk_cfg_free(cfg);

    FILE *saved = stderr;
    stderr = fopen("/dev/null", "w");
    assert_non_null(stderr);
    char *bad[] = {"wkvm-t", "--name", v, NULL};
    int rc = wk_cfg_tool_parse(&tl, 3, bad, &a, &cfg);
    fclose(stderr);
    stderr = saved;
    assert_int_equal(rc, 2);
    free(v);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run),
        cmocka_unit_test(test_answers),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_positionals),
        cmocka_unit_test(test_long_string),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
