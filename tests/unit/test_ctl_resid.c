/*
 * test_ctl_resid: the slot residence table on its own (no scheduler, no
 * worker): allocation generations (a handle is live only at its own
 * generation, so a reused slot never answers to a stale one), the free-slot
 * search, KV page accounting of hybrid models (a freed slot holding pages
 * turns stale and keeps them counted until the worker freed them; set_ctx
 * refuses growth past the pool with WK_EQUOTA and past the pool's size with
 * WK_ETOOBIG, changing nothing), a running job's reservation that only grows,
 * and recurrent models, which account no pages.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ctl_resid.h"

static void
test_generations(void **state)
{
    (void)state;
    ctl_resid t;
    ctl_kv_geom g = {.state_bytes = 64};
    assert_int_equal(ctl_resid_init(&t, 3, &g), WK_OK);
    assert_int_equal(ctl_resid_free_slot(&t), 1);
    assert_int_equal(ctl_resid_used(&t), 0);
    ctl_resid_take(&t, 1, 7);
    ctl_resid_take(&t, 2, 8);
    assert_int_equal(ctl_resid_free_slot(&t), 3);
    assert_int_equal(ctl_resid_used(&t), 2);
    assert_true(ctl_resid_live(&t, 1, 7));
    assert_false(ctl_resid_live(&t, 1, 8));   /* another generation */
    assert_false(ctl_resid_live(&t, 0, 7));   /* no slot 0 */
    assert_false(ctl_resid_live(&t, 4, 7));   /* past the table */
    assert_false(ctl_resid_live(&t, 3, 0));   /* a free slot answers to nothing */
    /* recurrent: a slot with context frees at once, no stale pages */
    assert_int_equal(ctl_resid_set_ctx(&t, 1, 1000, "w0", NULL), WK_OK);
    assert_int_equal(t.ctx[1], 1000);
    assert_int_equal(t.pages[1], 0);
    assert_int_equal(ctl_resid_pages_used(&t), 0);
    ctl_resid_clear(&t, 1);
    assert_false(t.stale[1]);
    assert_false(ctl_resid_live(&t, 1, 7));
    assert_int_equal(ctl_resid_free_slot(&t), 1);
    ctl_resid_take(&t, 1, 9); /* reused at a new generation: the old handle stays dead */
    assert_false(ctl_resid_live(&t, 1, 7));
    assert_true(ctl_resid_live(&t, 1, 9));
    assert_int_equal(t.ctx[1], 0);
    ctl_resid_fini(&t);
    ctl_resid_fini(&t); /* idempotent */
}

static void
test_kv_pages(void **state)
{
    (void)state;
    ctl_resid t;
    /* 10 pages of 16 tokens */
    ctl_kv_geom g = {.state_bytes = 64, .kv_token_bytes = 8, .page_tokens = 16, .pages_total = 10};
    assert_int_equal(ctl_resid_init(&t, 2, &g), WK_OK);
    ctl_resid_take(&t, 1, 1);
    ctl_resid_take(&t, 2, 2);
    wk_diag d = {{0}};
    assert_int_equal(ctl_resid_set_ctx(&t, 1, 100, "w0", &d), WK_OK); /* 7 pages */
    assert_int_equal(t.pages[1], 7);
    assert_int_equal(ctl_resid_pages_used(&t), 7);
    /* 4 more pages do not fit next to 7: nothing changes */
    assert_int_equal(ctl_resid_set_ctx(&t, 2, 64, "w0", &d), WK_EQUOTA);
    assert_non_null(strstr(d.msg, "KV pool full on worker w0"));
    assert_int_equal(t.pages[2], 0);
    assert_int_equal(t.ctx[2], 0);
    /* more than the whole pool: nothing can help */
    assert_int_equal(ctl_resid_set_ctx(&t, 2, 161, "w0", &d), WK_ETOOBIG);
    assert_non_null(strstr(d.msg, "more than the pool of worker w0"));
    /* shrinking slot 1 makes room */
    assert_int_equal(ctl_resid_set_ctx(&t, 1, 16, "w0", &d), WK_OK);
    assert_int_equal(t.pages[1], 1);
    assert_int_equal(ctl_resid_set_ctx(&t, 2, 64, "w0", &d), WK_OK);
    assert_int_equal(ctl_resid_pages_used(&t), 5);
    /* a running job's reservation only grows */
    static int job;
    t.busy[2] = (struct ctl_job *)&job;
    assert_int_equal(ctl_resid_set_ctx(&t, 2, 16, "w0", &d), WK_OK);
    assert_int_equal(t.pages[2], 4);
    assert_int_equal(t.ctx[2], 16);
    t.busy[2] = NULL;
    /* freed with pages: stale, not allocatable, its pages still counted */
    ctl_resid_clear(&t, 2);
    assert_true(t.stale[2]);
    assert_int_equal(ctl_resid_used(&t), 1);
    assert_int_equal(ctl_resid_free_slot(&t), 0);
    assert_int_equal(ctl_resid_pages_used(&t), 5);
    ctl_resid_unstale(&t, 2); /* the worker freed them */
    assert_int_equal(ctl_resid_free_slot(&t), 2);
    assert_int_equal(ctl_resid_pages_used(&t), 1);
    /* a freed slot that held nothing is free at once */
    ctl_resid_take(&t, 2, 3);
    ctl_resid_clear(&t, 2);
    assert_false(t.stale[2]);
    assert_int_equal(ctl_resid_free_slot(&t), 2);
    ctl_resid_fini(&t);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generations),
        cmocka_unit_test(test_kv_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
