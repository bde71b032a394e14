/* Unit tests for wk_file: whole small files, with a size limit and named errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wk_file.h"

static void
write_file(const char *path, const char *s, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(s, 1, n, f), n);
    fclose(f);
}

static void
test_read(void **state)
{
    (void)state;
    char path[] = "/tmp/wk_file_test_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(path, "ab\0cd", 5);
    char *buf = NULL;
    size_t n = 0;
    wk_diag d = {{0}};
    assert_int_equal(wk_file_read(path, 5, &buf, &n, &d), WK_OK);
    assert_int_equal(n, 5);
    assert_memory_equal(buf, "ab\0cd", 5);
    assert_int_equal(buf[5], '\0');
    free(buf);
    /* one byte over the limit: refused, outputs untouched */
    buf = (char *)"untouched";
    assert_int_equal(wk_file_read(path, 4, &buf, &n, &d), WK_ETOOBIG);
    assert_string_equal(buf, "untouched");
    assert_non_null(strstr(d.msg, path));
    /* larger than the first buffer */
    char *big = malloc(20000);
    memset(big, 'x', 20000);
    write_file(path, big, 20000);
    assert_int_equal(wk_file_read(path, 20000, &buf, &n, &d), WK_OK);
    assert_int_equal(n, 20000);
    assert_memory_equal(buf, big, 20000);
    free(buf);
    assert_int_equal(wk_file_read(path, 19999, &buf, &n, &d), WK_ETOOBIG);
    free(big);
    /* empty */
    write_file(path, "", 0);
    assert_int_equal(wk_file_read(path, 10, &buf, &n, &d), WK_OK);
    assert_int_equal(n, 0);
    free(buf);
    unlink(path);
    assert_int_equal(wk_file_read(path, 10, &buf, &n, &d), WK_ENOENT);
    assert_non_null(strstr(d.msg, path));
}

/* What a --model path names: a directory, or a checkpoint file and the directory beside it. */
static void
test_model_path(void **state)
{
    (void)state;
    char tmpl[] = "/tmp/wk_file_model_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char file[128], dir[128], name[64];
    snprintf(file, sizeof(file), "%s/m7.gguf", tmpl);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    bool is_file = true;
    assert_int_equal(wk_file_model_path(tmpl, dir, sizeof(dir), name, sizeof(name), &is_file),
                     WK_OK);
    assert_false(is_file);
    assert_string_equal(dir, tmpl);
    assert_string_equal(name, strrchr(tmpl, '/') + 1);
    assert_int_equal(wk_file_model_path(file, dir, sizeof(dir), name, sizeof(name), &is_file),
                     WK_OK);
    assert_true(is_file);
    assert_string_equal(dir, tmpl);
    assert_string_equal(name, "m7");
    assert_int_equal(wk_file_model_path(file, dir, 8, NULL, 0, &is_file), WK_ETOOBIG);
    assert_int_equal(wk_file_model_path(file, dir, sizeof(dir), name, 2, &is_file), WK_ETOOBIG);
    unlink(file);
    rmdir(tmpl);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read),
        cmocka_unit_test(test_model_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
