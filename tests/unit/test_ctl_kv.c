/*
 * Unit tests for ctl_kv: page counts (ceil), a job's pages at its end,
 * the fit rule used at admission (a slot growing from what it holds), image
 * sizes and their token counts, and recurrent-only models needing nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ctl_kv.h"

static const ctl_kv_geom hyb = {.state_bytes = 1000, .kv_token_bytes = 64, .page_tokens = 16,
                                .pages_total = 10};
static const ctl_kv_geom rec = {.state_bytes = 1000};

static void
test_pages(void **state)
{
    (void)state;
    assert_true(ctl_kv_hybrid(&hyb));
    assert_false(ctl_kv_hybrid(&rec));
    assert_false(ctl_kv_hybrid(NULL));
    assert_int_equal(ctl_kv_pages(&hyb, 0), 0);
    assert_int_equal(ctl_kv_pages(&hyb, 1), 1);
    assert_int_equal(ctl_kv_pages(&hyb, 16), 1);
    assert_int_equal(ctl_kv_pages(&hyb, 17), 2);
    assert_int_equal(ctl_kv_pages(&hyb, 160), 10);
    assert_int_equal(ctl_kv_pages(&rec, 1000000), 0);
    /* ctx + input + max_new, saturating. */
    assert_int_equal(ctl_kv_job_pages(&hyb, 10, 5, 1), 1);
    assert_int_equal(ctl_kv_job_pages(&hyb, 10, 5, 2), 2);
    assert_int_equal(ctl_kv_job_pages(&hyb, UINT64_MAX, 5, 2), UINT32_MAX);
    assert_int_equal(ctl_kv_job_pages(&rec, 10, 5, 2), 0);
}

static void
test_fits(void **state)
{
    (void)state;
    /* An empty pool takes a job up to its size, not beyond. */
    assert_true(ctl_kv_fits(&hyb, 0, 0, 10));
    assert_false(ctl_kv_fits(&hyb, 0, 0, 11));
    /* Others hold 6: 4 left. */
    assert_true(ctl_kv_fits(&hyb, 6, 0, 4));
    assert_false(ctl_kv_fits(&hyb, 6, 0, 5));
    /* A slot holding 3 (counted in used) grows to 7 when 4 more are free. */
    assert_true(ctl_kv_fits(&hyb, 6, 3, 7));
    assert_false(ctl_kv_fits(&hyb, 6, 3, 8));
    /* Never shrinking needs nothing, even in a full pool. */
    assert_true(ctl_kv_fits(&hyb, 10, 3, 2));
    assert_true(ctl_kv_fits(&hyb, 10, 3, 3));
    /* Recurrent-only: always. */
    assert_true(ctl_kv_fits(&rec, 0, 0, 0));
    assert_true(ctl_kv_fits(&rec, 99, 0, 99));
}

static void
test_snap_fits(void **state)
{
    (void)state;
    /* A chat turn on a slot of 40 tokens (3 pages): its snapshot holds 3 more. */
    assert_true(ctl_kv_snap_fits(&hyb, 40, 10, 62));  /* 3 + ceil(112/16)=7 = 10 */
    assert_false(ctl_kv_snap_fits(&hyb, 40, 10, 63)); /* 3 + 8 = 11: would wait forever */
    assert_true(ctl_kv_snap_fits(&hyb, 0, 10, 150));  /* an empty state: no pages */
    assert_false(ctl_kv_snap_fits(&hyb, 100, 0, UINT64_MAX));
    assert_true(ctl_kv_snap_fits(&rec, 1000000, 10, 1000000));
}

static void
test_images(void **state)
{
    (void)state;
    uint64_t n = 99;
    assert_int_equal(ctl_kv_image_bytes(&hyb, 0), 1000);
    assert_int_equal(ctl_kv_image_bytes(&hyb, 3), 1192);
    assert_int_equal(ctl_kv_image_ctx(&hyb, 1192, &n), WK_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ctl_kv_image_ctx(&hyb, 1000, &n), WK_OK);
    assert_int_equal(n, 0);
    n = 99;
    assert_int_equal(ctl_kv_image_ctx(&hyb, 1191, &n), WK_EINVAL);
    assert_int_equal(ctl_kv_image_ctx(&hyb, 999, &n), WK_EINVAL);
    assert_int_equal(n, 99); /* outputs only on success */
    assert_int_equal(ctl_kv_image_ctx(&rec, 1000, &n), WK_OK);
    assert_int_equal(n, 0);
    assert_int_equal(ctl_kv_image_ctx(&rec, 1064, &n), WK_EINVAL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pages),
        cmocka_unit_test(test_fits),
        cmocka_unit_test(test_snap_fits),
        cmocka_unit_test(test_images),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
