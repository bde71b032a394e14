/*
 * test_ctl_resid: the slot residence table on its own (no scheduler, no
 * worker): allocation generations (a handle is live only at its own
 * generation, so a reused slot never answers to a stale one), the free-slot
 * search, KV page accounting of hybrid models (a freed slot holding pages
 * turns stale and keeps them counted until the worker freed them; set_ctx
 * refuses growth past the pool with WK_EQUOTA and past the pool's size with
 * WK_ETOOBIG, changing nothing), a running job's reservation that only grows,
 * and recurrent models, which account no pages. Then the directory, as
 * ctl_vm and the API use it without a scheduler: attached tables found by
 * worker, slot handles (alloc on one worker or any not draining, global
 * generations, free refusing a busy or stale handle), a detached worker's
 * handles dead, the slot epoch and its wait (woken by a release from another
 * thread, ended at once by a stop), and KV accounting through handles
 * (set_ctx, set_bytes from an image's size, note_ctx for recurrent slots).
 * And the warm tier's index: one copy per key (a put on another worker hands
 * back the old worker to drop), use on the right worker only, where with
 * its epoch, the least recently used copy of a worker popped first. And the
 * hot index with its eviction choice: the victim is the least recently used
 * entry no one holds (taken and spilling entries skipped), on one worker or
 * anywhere; a clean victim is removed at once, a dirty one stays visible,
 * taken and spilling, until its spill ends (lookups wait for it); under page
 * pressure only entries holding KV pages count, and none is chosen when
 * they cannot make up the shortfall together. Puts replace an idle entry of
 * the key and keep a pinned one; the idle spiller's pick (idle, over the cap).
 * A put's own clean verdict never ends a cleaner's or an evictor's pick; a
 * stale hybrid slot left by an eviction counts as coming back (the
 * scheduler waits for it instead of evicting another).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ctl_resid.h"
#include "wk_time.h"

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

/* A directory with w0 (2 slots) and w1 (1 slot) attached, of geometry g. */
static void
dir_two(ctl_resid_dir **dir, ctl_resid *t0, ctl_resid *t1, const ctl_kv_geom *g)
{
    assert_int_equal(ctl_resid_dir_new(dir), WK_OK);
    assert_int_equal(ctl_resid_init(t0, 2, g), WK_OK);
    assert_int_equal(ctl_resid_init(t1, 1, g), WK_OK);
    pthread_mutex_lock(ctl_resid_dir_mutex(*dir));
    assert_int_equal(ctl_resid_dir_attach_locked(*dir, t0, "w0"), WK_OK);
    assert_int_equal(ctl_resid_dir_attach_locked(*dir, t1, "w1"), WK_OK);
    assert_ptr_equal(ctl_resid_dir_find_locked(*dir, "w1"), t1);
    assert_null(ctl_resid_dir_find_locked(*dir, "w2"));
    pthread_mutex_unlock(ctl_resid_dir_mutex(*dir));
}

static void
dir_close(ctl_resid_dir *dir, ctl_resid *t0, ctl_resid *t1)
{
    pthread_mutex_lock(ctl_resid_dir_mutex(dir));
    ctl_resid_dir_detach_locked(dir, t0);
    ctl_resid_dir_detach_locked(dir, t1);
    pthread_mutex_unlock(ctl_resid_dir_mutex(dir));
    ctl_resid_fini(t0);
    ctl_resid_fini(t1);
    ctl_resid_dir_free(dir);
}

static void
test_dir_handles(void **state)
{
    (void)state;
    ctl_resid_dir *dir;
    ctl_resid t0, t1;
    ctl_kv_geom g = {.state_bytes = 64};
    dir_two(&dir, &t0, &t1, &g);
    assert_true(ctl_resid_known(dir, "w0"));
    assert_false(ctl_resid_known(dir, "w2"));
    uint32_t used, total;
    ctl_resid_counts(dir, "w0", &used, &total);
    assert_int_equal(used, 0);
    assert_int_equal(total, 2);
    ctl_resid_counts(dir, "w2", &used, &total);
    assert_int_equal(total, 0);

    /* w0 draining: allocation without a worker goes to w1, naming w0 still works */
    t0.draining = true;
    ctl_slot_ref a, b, c, x;
    wk_diag d = {{0}};
    assert_int_equal(ctl_resid_slot_alloc(dir, NULL, &a, &d), WK_OK);
    assert_string_equal(a.worker, "w1");
    assert_int_equal(a.slot, 1);
    assert_int_equal(ctl_resid_slot_alloc(dir, NULL, &x, &d), WK_ENOSPC);
    assert_int_equal(ctl_resid_slot_alloc(dir, "w0", &b, &d), WK_OK);
    assert_int_equal(ctl_resid_slot_alloc(dir, "w0", &c, &d), WK_OK);
    assert_int_equal(ctl_resid_slot_alloc(dir, "w0", &x, &d), WK_ENOSPC);
    assert_int_equal(ctl_resid_slot_alloc(dir, "w2", &x, &d), WK_ENOSPC);
    assert_string_equal(b.worker, "w0");
    assert_int_not_equal(b.slot, c.slot);
    /* generations are global: no two handles share one */
    assert_true(a.gen != 0 && a.gen < b.gen && b.gen < c.gen);
    ctl_resid_counts(dir, "w0", &used, &total);
    assert_int_equal(used, 2);
    assert_true(ctl_resid_slot_valid(dir, &b));
    ctl_slot_ref old = b;
    old.gen = a.gen;
    assert_false(ctl_resid_slot_valid(dir, &old)); /* another generation */

    /* free: a job on the slot keeps it; a release moves the epoch; a stale handle is refused */
    static int job;
    t0.busy[b.slot] = (struct ctl_job *)&job;
    assert_int_equal(ctl_resid_slot_free(dir, &b), WK_ESTATE);
    t0.busy[b.slot] = NULL;
    uint64_t e = ctl_resid_slot_epoch(dir);
    assert_false(ctl_resid_slot_wait(dir, e, wk_mono_ms() + 20)); /* nothing released */
    assert_int_equal(ctl_resid_slot_free(dir, &b), WK_OK);
    assert_true(ctl_resid_slot_wait(dir, e, wk_mono_ms() + 1000));
    assert_int_not_equal(ctl_resid_slot_epoch(dir), e);
    assert_false(ctl_resid_slot_valid(dir, &b));
    assert_int_equal(ctl_resid_slot_free(dir, &b), WK_ESTATE);
    /* the slot comes back at a new generation: the old handle stays dead */
    assert_int_equal(ctl_resid_slot_alloc(dir, "w0", &x, &d), WK_OK);
    assert_int_equal(x.slot, b.slot);
    assert_true(x.gen > c.gen);
    assert_false(ctl_resid_slot_valid(dir, &b));

    /* recurrent: note_ctx records an idle slot's context, set_bytes accounts nothing */
    ctl_resid_slot_note_ctx(dir, &x, 42);
    assert_int_equal(ctl_resid_slot_ctx(dir, &x), 42);
    assert_int_equal(ctl_resid_slot_set_bytes(dir, &x, 12345, &d), WK_OK);
    assert_int_equal(ctl_resid_slot_pages(dir, &x), 0);
    ctl_kv_geom kg;
    assert_false(ctl_resid_kv_geom(dir, "w0", &kg));
    assert_int_equal(kg.pages_total, 0);

    /* a worker that left: its handles are dead, its context unknown */
    pthread_mutex_lock(ctl_resid_dir_mutex(dir));
    ctl_resid_dir_detach_locked(dir, &t0);
    pthread_mutex_unlock(ctl_resid_dir_mutex(dir));
    assert_false(ctl_resid_known(dir, "w0"));
    assert_false(ctl_resid_slot_valid(dir, &x));
    assert_int_equal(ctl_resid_slot_ctx(dir, &x), 0);
    assert_int_equal(ctl_resid_slot_set_ctx(dir, &x, 1, &d), WK_EUNAVAIL);
    assert_int_equal(ctl_resid_slot_set_bytes(dir, &x, 64, &d), WK_EUNAVAIL);
    assert_int_equal(ctl_resid_slot_free(dir, &x), WK_ESTATE);
    assert_true(ctl_resid_slot_valid(dir, &a)); /* w1's stay */
    dir_close(dir, &t0, &t1);
}

static void
test_dir_kv(void **state)
{
    (void)state;
    ctl_resid_dir *dir;
    ctl_resid t0, t1;
    /* 10 pages of 16 tokens per worker; an image is 64 + 8 bytes per token */
    ctl_kv_geom g = {.state_bytes = 64, .kv_token_bytes = 8, .page_tokens = 16, .pages_total = 10};
    dir_two(&dir, &t0, &t1, &g);
    ctl_kv_geom kg;
    assert_true(ctl_resid_kv_geom(dir, "w0", &kg));
    assert_int_equal(kg.pages_total, 10);
    ctl_slot_ref a, b;
    wk_diag d = {{0}};
    assert_int_equal(ctl_resid_slot_alloc(dir, "w0", &a, &d), WK_OK);
    assert_int_equal(ctl_resid_slot_alloc(dir, "w0", &b, &d), WK_OK);
    /* an image of 100 tokens: 7 pages */
    assert_int_equal(ctl_resid_slot_set_bytes(dir, &a, 64 + 8 * 100, &d), WK_OK);
    assert_int_equal(ctl_resid_slot_ctx(dir, &a), 100);
    assert_int_equal(ctl_resid_slot_pages(dir, &a), 7);
    uint32_t used, total;
    ctl_resid_kv_counts(dir, "w0", &used, &total);
    assert_int_equal(used, 7);
    assert_int_equal(total, 10);
    ctl_resid_kv_counts(dir, "w1", &used, &total);
    assert_int_equal(used, 0); /* each worker its own pool */
    /* not an image of this model */
    assert_int_equal(ctl_resid_slot_set_bytes(dir, &b, 64 + 3, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "not an image"));
    /* no room next to the 7: nothing changes */
    assert_int_equal(ctl_resid_slot_set_ctx(dir, &b, 64, &d), WK_EQUOTA);
    assert_int_equal(ctl_resid_slot_pages(dir, &b), 0);
    /* a hybrid slot's context goes through set_ctx: note_ctx leaves it */
    ctl_resid_slot_note_ctx(dir, &b, 5);
    assert_int_equal(ctl_resid_slot_ctx(dir, &b), 0);
    /* freed with pages: stale, still counted, the slot not allocatable */
    assert_int_equal(ctl_resid_slot_free(dir, &a), WK_OK);
    ctl_resid_kv_counts(dir, "w0", &used, &total);
    assert_int_equal(used, 7);
    ctl_slot_ref x;
    assert_int_equal(ctl_resid_slot_alloc(dir, "w0", &x, &d), WK_ENOSPC);
    /* a stale handle */
    assert_int_equal(ctl_resid_slot_set_ctx(dir, &a, 1, &d), WK_ESTATE);
    assert_int_equal(ctl_resid_slot_pages(dir, &a), 0);
    dir_close(dir, &t0, &t1);
}

typedef struct waiter {
    ctl_resid_dir *dir;
    uint64_t epoch;
    uint64_t ms; /* how long the wait took */
    bool moved;  /* its answer */
} waiter;

static void *
waiter_main(void *arg)
{
    waiter *w = arg;
    uint64_t t = wk_mono_ms();
    w->moved = ctl_resid_slot_wait(w->dir, w->epoch, t + 5000);
    w->ms = wk_mono_ms() - t;
    return NULL;
}

static void
test_dir_wait(void **state)
{
    (void)state;
    ctl_resid_dir *dir;
    ctl_resid t0, t1;
    ctl_kv_geom g = {.state_bytes = 64};
    dir_two(&dir, &t0, &t1, &g);
    ctl_slot_ref a;
    assert_int_equal(ctl_resid_slot_alloc(dir, "w1", &a, NULL), WK_OK);
    /* a release on another thread wakes a waiter at once */
    waiter w = {.dir = dir, .epoch = ctl_resid_slot_epoch(dir)};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
    usleep(20000);
    assert_int_equal(ctl_resid_slot_free(dir, &a), WK_OK);
    pthread_join(th, NULL);
    assert_true(w.moved);
    assert_true(w.ms < 2000);
    /* a stop ends waits at once (unmoved), now and later */
    w = (waiter){.dir = dir, .epoch = ctl_resid_slot_epoch(dir)};
    assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
    usleep(20000);
    ctl_resid_dir_stop(dir);
    pthread_join(th, NULL);
    assert_false(w.moved);
    assert_true(w.ms < 2000);
    uint64_t t = wk_mono_ms();
    assert_false(ctl_resid_slot_wait(dir, ctl_resid_slot_epoch(dir), t + 5000));
    assert_true(wk_mono_ms() - t < 2000);
    dir_close(dir, &t0, &t1);
}

static void
test_dir_warm(void **state)
{
    (void)state;
    ctl_resid_dir *dir;
    assert_int_equal(ctl_resid_dir_new(&dir), WK_OK);
    char prev[65], w[65], key[CTL_RESID_KEY_MAX];
    uint64_t ctx = 0, epoch = 0;
    assert_false(ctl_resid_warm_where(dir, "a", w, sizeof(w), &epoch));
    assert_false(ctl_resid_warm_pop_oldest(dir, "w0", key));
    assert_int_equal(ctl_resid_warm_put(dir, "a", "w0", 10, 7, prev, sizeof(prev)), WK_OK);
    assert_string_equal(prev, "");
    assert_int_equal(ctl_resid_warm_put(dir, "b", "w0", 20, 7, prev, sizeof(prev)), WK_OK);
    assert_int_equal(ctl_resid_warm_put(dir, "c", "w1", 30, 9, prev, sizeof(prev)), WK_OK);
    assert_int_equal(ctl_resid_warm_count(dir), 3);
    assert_true(ctl_resid_warm_where(dir, "c", w, sizeof(w), &epoch));
    assert_string_equal(w, "w1");
    assert_int_equal(epoch, 9);
    /* use: only on the worker holding it; it becomes the most recently used */
    assert_false(ctl_resid_warm_use(dir, "a", "w1", &ctx));
    assert_true(ctl_resid_warm_use(dir, "a", "w0", &ctx));
    assert_int_equal(ctx, 10);
    /* w0's least recently used is now b */
    assert_true(ctl_resid_warm_pop_oldest(dir, "w0", key));
    assert_string_equal(key, "b");
    assert_false(ctl_resid_warm_where(dir, "b", w, sizeof(w), &epoch));
    /* a put of a on w1 replaces the w0 copy, which the caller drops */
    assert_int_equal(ctl_resid_warm_put(dir, "a", "w1", 11, 9, prev, sizeof(prev)), WK_OK);
    assert_string_equal(prev, "w0");
    assert_int_equal(ctl_resid_warm_count(dir), 2);
    assert_false(ctl_resid_warm_pop_oldest(dir, "w0", key));
    /* the same worker again: nothing to drop */
    assert_int_equal(ctl_resid_warm_put(dir, "a", "w1", 12, 9, prev, sizeof(prev)), WK_OK);
    assert_string_equal(prev, "");
    assert_true(ctl_resid_warm_use(dir, "a", "w1", &ctx));
    assert_int_equal(ctx, 12);
    ctl_resid_warm_forget(dir, "a");
    ctl_resid_warm_forget(dir, "nosuch");
    assert_int_equal(ctl_resid_warm_count(dir), 1);
    /* a key that does not fit is refused */
    char big[CTL_RESID_KEY_MAX + 1];
    memset(big, 'k', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(ctl_resid_warm_put(dir, big, "w0", 1, 1, prev, sizeof(prev)), WK_EINVAL);
    ctl_resid_dir_free(dir); /* frees the copies still indexed */
}

static ctl_slot_ref
ref_of(const char *worker, uint32_t slot, uint64_t gen)
{
    ctl_slot_ref r = {.slot = slot, .gen = gen};
    snprintf(r.worker, sizeof(r.worker), "%s", worker);
    return r;
}

/* Slots a and b on w0, c on w1 (dir_two's workers). */
static void
three_slots(ctl_resid_dir *dir, ctl_slot_ref *a, ctl_slot_ref *b, ctl_slot_ref *c)
{
    assert_int_equal(ctl_resid_slot_alloc(dir, "w0", a, NULL), WK_OK);
    assert_int_equal(ctl_resid_slot_alloc(dir, "w0", b, NULL), WK_OK);
    assert_int_equal(ctl_resid_slot_alloc(dir, "w1", c, NULL), WK_OK);
}

/*
 * Puts key in slot: a cached state (stored) or a session (backing), clean
 * when clean (the copy to resume from exists). Returns its id.
 */
static uint64_t
hot_put(ctl_resid_dir *dir, const char *key, const ctl_slot_ref *slot, bool stored,
        const char *backing, bool clean)
{
    ctl_resid_hot old, e;
    assert_int_equal(ctl_resid_hot_put(dir, key, slot, stored, backing, &old, &e), WK_OK);
    assert_true(e.dirty);
    if (clean)
        assert_true(ctl_resid_hot_mark_clean(dir, e.id, e.lost));
    return e.id;
}

static void
test_hot_victim(void **state)
{
    (void)state;
    ctl_resid_dir *dir;
    ctl_resid t0, t1;
    ctl_kv_geom g = {.state_bytes = 64};
    dir_two(&dir, &t0, &t1, &g);
    ctl_slot_ref a, b, c;
    three_slots(dir, &a, &b, &c);
    ctl_resid_hot old, v;
    /* oldest first: a (a clean cached state), b (a dirty session), c (dirty, backed) */
    assert_int_equal(ctl_resid_hot_put(dir, "ka", &a, true, NULL, &old, NULL), WK_OK);
    assert_int_equal(old.id, 0);
    ctl_resid_hot_describe(dir, &a, &v, &(uint64_t){0});
    assert_true(ctl_resid_hot_cleaned(dir, v.id, v.lost, false));
    hot_put(dir, "kb", &b, false, NULL, false);
    hot_put(dir, "kc", &c, false, "ck1", false);
    uint32_t clean, dirty;
    ctl_resid_hot_counts(dir, &clean, &dirty);
    assert_int_equal(clean, 1);
    assert_int_equal(dirty, 2);
    /* a use of ka makes kb the least recently used; pinned, ka is skipped anyway */
    ctl_resid_hot pin;
    assert_int_equal(ctl_resid_hot_pin_key(dir, "ka", &pin), WK_OK);
    assert_int_equal(ctl_resid_hot_pin_key(dir, "ka", &v), WK_EBUSY);
    /* the victim anywhere: kb, dirty, so it stays listed, taken and spilling */
    assert_int_equal(ctl_resid_hot_victim(dir, NULL, 0, &v), WK_OK);
    assert_string_equal(v.key, "kb");
    assert_true(v.dirty && v.taken && v.spilling);
    assert_int_equal(ctl_resid_hot_slots_on(dir, "w0", NULL, 0), 2);
    ctl_slot_ref where;
    assert_int_equal(ctl_resid_hot_remove_key(dir, "kb", false, false, &old), WK_EBUSY);
    /* the next: kb is spilling and ka pinned, so kc (its backing kept) */
    ctl_resid_hot v2;
    assert_int_equal(ctl_resid_hot_victim(dir, NULL, 0, &v2), WK_OK);
    assert_string_equal(v2.key, "kc");
    assert_string_equal(v2.backing, "ck1");
    /* on w0 only, nothing is left to choose: ka pinned, kb spilling */
    assert_int_equal(ctl_resid_hot_victim(dir, "w0", 0, &old), WK_ENOENT);
    /* the spills end: the entries are gone */
    ctl_resid_hot_remove_id(dir, v.id);
    ctl_resid_hot_remove_id(dir, v2.id);
    assert_false(ctl_resid_hot_find(dir, "kb", &where));
    assert_false(ctl_resid_hot_find(dir, "kc", &where));
    /* unpinned, the clean ka is chosen and removed at once (no spill to wait for) */
    ctl_resid_hot_unpin(dir, pin.id, NULL);
    assert_int_equal(ctl_resid_hot_victim(dir, "w0", 0, &v), WK_OK);
    assert_string_equal(v.key, "ka");
    assert_false(v.dirty);
    assert_false(ctl_resid_hot_find(dir, "ka", &where));
    ctl_resid_hot_counts(dir, &clean, &dirty);
    assert_int_equal(clean + dirty, 0);
    assert_int_equal(ctl_resid_hot_victim(dir, NULL, 0, &v), WK_ENOENT);
    dir_close(dir, &t0, &t1);
}

static void
test_hot_victim_pages(void **state)
{
    (void)state;
    ctl_resid_dir *dir;
    ctl_resid t0, t1;
    ctl_kv_geom g = {.state_bytes = 64, .kv_token_bytes = 8, .page_tokens = 16, .pages_total = 10};
    dir_two(&dir, &t0, &t1, &g);
    ctl_slot_ref a, b, c;
    wk_diag d = {{0}};
    three_slots(dir, &a, &b, &c);
    assert_int_equal(ctl_resid_slot_set_ctx(dir, &b, 48, &d), WK_OK); /* 3 pages */
    assert_int_equal(ctl_resid_slot_set_ctx(dir, &c, 160, &d), WK_OK); /* 10, on w1 */
    ctl_resid_hot v;
    hot_put(dir, "ka", &a, true, NULL, true); /* no pages */
    hot_put(dir, "kb", &b, true, NULL, true);
    hot_put(dir, "kc", &c, true, NULL, true);
    /* 4 pages lacking on w0: its entries hold 3, so evicting cannot help */
    assert_int_equal(ctl_resid_hot_victim(dir, "w0", 4, &v), WK_ENOENT);
    /* 2 lacking: kb, though ka is older (ka frees no page) */
    assert_int_equal(ctl_resid_hot_victim(dir, "w0", 2, &v), WK_OK);
    assert_string_equal(v.key, "kb");
    assert_true(ctl_resid_hot_find(dir, "ka", &v.slot));
    dir_close(dir, &t0, &t1);
}

typedef struct finder {
    ctl_resid_dir *dir;
    bool found;  /* its answer */
    uint64_t ms; /* how long it waited */
} finder;

static void *
finder_main(void *arg)
{
    finder *f = arg;
    uint64_t t = wk_mono_ms();
    ctl_slot_ref r;
    f->found = ctl_resid_hot_find(f->dir, "kd", &r);
    f->ms = wk_mono_ms() - t;
    return NULL;
}

static void
test_hot_index(void **state)
{
    (void)state;
    ctl_resid_dir *dir;
    ctl_resid t0, t1;
    ctl_kv_geom g = {.state_bytes = 64};
    dir_two(&dir, &t0, &t1, &g);
    ctl_slot_ref a = ref_of("w0", 1, 0), b = ref_of("w0", 2, 0), c = ref_of("w1", 1, 0);
    three_slots(dir, &a, &b, &c);
    ctl_resid_hot old, e, pin;
    /* a put replaces an idle entry of the key: the old one is the caller's to retire */
    assert_int_equal(ctl_resid_hot_put(dir, "k", &a, false, "ck", &old, NULL), WK_OK);
    assert_int_equal(ctl_resid_hot_put(dir, "k", &b, false, NULL, &old, NULL), WK_OK);
    assert_true(old.id != 0);
    assert_int_equal(old.slot.slot, a.slot);
    assert_string_equal(old.backing, "ck");
    /* ... but keeps a pinned one: the newest answers by key */
    assert_int_equal(ctl_resid_hot_pin_slot(dir, &b, &pin), WK_OK);
    assert_int_equal(ctl_resid_hot_put(dir, "k", &a, true, NULL, &old, NULL), WK_OK);
    assert_int_equal(old.id, 0);
    ctl_slot_ref where;
    assert_true(ctl_resid_hot_find(dir, "k", &where));
    assert_int_equal(where.slot, a.slot);
    /* a pin that moved the bytes */
    ctl_resid_hot_unpin(dir, pin.id, &c);
    uint64_t age = 0;
    assert_true(ctl_resid_hot_describe(dir, &c, &e, &age));
    assert_true(e.dirty);
    assert_int_equal(age, 1); /* one put since */
    assert_false(ctl_resid_hot_describe(dir, &b, &e, &age));
    /* only_stored leaves a session; by slot */
    assert_int_equal(ctl_resid_hot_remove_key(dir, "k", false, true, &e), WK_OK); /* a: stored */
    assert_int_equal(ctl_resid_hot_remove_key(dir, "k", false, true, &e), WK_ESTATE);
    assert_int_equal(ctl_resid_hot_remove_slot(dir, &c, &e), WK_OK);
    assert_int_equal(ctl_resid_hot_remove_key(dir, "k", false, false, &e), WK_ENOENT);
    /* too long a key */
    char big[CTL_RESID_KEY_MAX + 1];
    memset(big, 'k', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(ctl_resid_hot_put(dir, big, &a, false, NULL, &old, NULL), WK_EINVAL);
    /* the idle cleaner: neither idle nor over the cap, then idle, then over the cap */
    hot_put(dir, "kd", &a, false, NULL, false);
    hot_put(dir, "ke", &b, false, "ck", true); /* backed: clean, but not in the store */
    bool for_room = true;
    assert_false(ctl_resid_hot_next_clean(dir, 60000, 2, 0, NULL, &e, &for_room));
    usleep(3000);
    assert_true(ctl_resid_hot_next_clean(dir, 1, 0, 0, NULL, &e, &for_room));
    assert_string_equal(e.key, "kd");
    assert_true(e.spilling);
    assert_false(for_room); /* idle: to be spilled */
    /* a lookup of kd waits for its spill to end, then finds it still in its slot */
    finder f = {.dir = dir};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, finder_main, &f), 0);
    usleep(50000);
    assert_true(ctl_resid_hot_cleaned(dir, e.id, e.lost, true));
    pthread_join(th, NULL);
    assert_true(f.found);
    assert_true(f.ms >= 30);
    /* kd is in the store now: ke, clean by its backing but not spilled, is the one left */
    assert_false(ctl_resid_hot_next_clean(dir, 0, 1, 0, NULL, &e, &for_room)); /* 1, cap 1 */
    assert_true(ctl_resid_hot_next_clean(dir, 0, 0, 0, NULL, &e, &for_room) == false);
    /* flush pops the sessions not in the store that no one holds */
    assert_true(ctl_resid_hot_pop_unspilled(dir, &e));
    assert_string_equal(e.key, "ke");
    assert_false(ctl_resid_hot_pop_unspilled(dir, &e));
    assert_int_equal(ctl_resid_hot_put(dir, "kf", &c, true, NULL, &old, NULL), WK_OK);
    dir_close(dir, &t0, &t1); /* frees the entries still indexed */
}

/* Evicts under the lock as the scheduler does. */
static wk_err
evict_clean(ctl_resid_dir *dir, const char *worker, uint32_t pages, ctl_resid_hot *out)
{
    pthread_mutex_lock(ctl_resid_dir_mutex(dir));
    wk_err err = ctl_resid_hot_evict_clean_locked(dir, worker, pages, out);
    if (err == WK_EBUSY)
        ctl_resid_hot_want_clean_locked(dir, worker, pages);
    pthread_mutex_unlock(ctl_resid_dir_mutex(dir));
    return err;
}

/*
 * Clean means a copy to resume from exists: a clean victim is freed with no
 * I/O and its warm copy stays; losing the copy (warm copy dropped, backing
 * checkpoint losing a tier) turns an entry dirty; a dirty victim goes to
 * the cleaner and is freed once clean.
 */
static void
test_hot_clean(void **state)
{
    (void)state;
    ctl_resid_dir *dir;
    ctl_resid t0, t1;
    ctl_kv_geom g = {.state_bytes = 64};
    dir_two(&dir, &t0, &t1, &g);
    ctl_slot_ref a, b, c;
    three_slots(dir, &a, &b, &c);
    char prev[65];
    /* a cached state with its warm copy on its worker: clean; the older dirty session is not */
    uint64_t sess = hot_put(dir, "sess", &b, false, "ck1", false);
    assert_int_equal(ctl_resid_warm_put(dir, "blob", "w0", 5, 1, prev, sizeof(prev)), WK_OK);
    uint64_t blob = hot_put(dir, "blob", &a, true, NULL, true);
    ctl_resid_hot v;
    assert_int_equal(evict_clean(dir, "w0", 0, &v), WK_OK); /* the clean one, though newer */
    assert_int_equal(v.id, blob);
    assert_false(ctl_resid_slot_valid(dir, &a)); /* freed, no call out */
    char where[65];
    uint64_t epoch = 0;
    assert_true(ctl_resid_warm_where(dir, "blob", where, sizeof(where), &epoch));
    assert_string_equal(where, "w0"); /* its warm copy kept */
    /* only the dirty session is left: admission asks the cleaner, which finds it */
    assert_int_equal(evict_clean(dir, "w0", 0, &v), WK_EBUSY);
    assert_true(ctl_resid_slot_valid(dir, &b));
    bool for_room = false;
    ctl_resid_hot e;
    assert_true(ctl_resid_hot_next_clean(dir, 0, 0, 0, NULL, &e, &for_room));
    assert_int_equal(e.id, sess);
    assert_true(for_room && e.taken && e.spilling);
    assert_int_equal(evict_clean(dir, "w0", 0, &v), WK_ENOENT); /* being cleaned: untouchable */
    /* the checkpoint backing it was found live: clean, then freed by the next admission */
    assert_true(ctl_resid_hot_cleaned(dir, e.id, e.lost, false));
    assert_int_equal(evict_clean(dir, "w0", 0, &v), WK_OK);
    assert_int_equal(v.id, sess);
    assert_string_equal(v.backing, "ck1");
    assert_false(ctl_resid_slot_valid(dir, &b));
    /* a backing checkpoint losing a tier turns its clean sessions dirty; a spilled one stays */
    assert_int_equal(ctl_resid_slot_alloc(dir, "w0", &a, NULL), WK_OK);
    assert_int_equal(ctl_resid_slot_alloc(dir, "w0", &b, NULL), WK_OK);
    hot_put(dir, "s1", &a, false, "ck2", true);
    uint64_t s2 = hot_put(dir, "s2", &b, false, "ck2", false);
    ctl_resid_hot_describe(dir, &b, &e, &(uint64_t){0});
    assert_true(ctl_resid_hot_cleaned(dir, s2, e.lost, true)); /* spilled */
    uint32_t clean, dirty;
    ctl_resid_hot_counts(dir, &clean, &dirty);
    assert_int_equal(clean, 2);
    assert_int_equal(ctl_resid_hot_unback(dir, "ck2"), 2);
    assert_int_equal(ctl_resid_hot_unback(dir, "ck9"), 0);
    ctl_resid_hot_counts(dir, &clean, &dirty);
    assert_int_equal(clean, 1);
    assert_int_equal(dirty, 1);
    assert_true(ctl_resid_hot_describe(dir, &a, &e, &(uint64_t){0}));
    assert_true(e.dirty);
    /* a verdict reached before the loss does not count */
    ctl_resid_hot before = e;
    assert_true(ctl_resid_hot_cleaned(dir, before.id, before.lost, false));
    assert_int_equal(ctl_resid_hot_unback(dir, "ck2"), 2);
    assert_false(ctl_resid_hot_cleaned(dir, before.id, before.lost, false));
    /* a cached state's warm copy dropped (its worker's oldest, to make room) turns it dirty */
    assert_int_equal(ctl_resid_warm_put(dir, "b2", "w1", 5, 1, prev, sizeof(prev)), WK_OK);
    uint64_t b2 = hot_put(dir, "b2", &c, true, NULL, true);
    char popped[CTL_RESID_KEY_MAX];
    assert_true(ctl_resid_warm_pop_oldest(dir, "w1", popped));
    assert_string_equal(popped, "b2");
    assert_true(ctl_resid_hot_describe(dir, &c, &e, &(uint64_t){0}));
    assert_int_equal(e.id, b2);
    assert_true(e.dirty);
    assert_int_equal(evict_clean(dir, "w1", 0, &v), WK_EBUSY);
    /* a clean cached state moved to another worker turns dirty: its warm copy stayed behind */
    assert_int_equal(ctl_resid_hot_remove_slot(dir, &c, &e), WK_OK);
    assert_int_equal(ctl_resid_hot_remove_slot(dir, &a, &e), WK_OK);
    assert_int_equal(ctl_resid_warm_put(dir, "b3", "w0", 5, 1, prev, sizeof(prev)), WK_OK);
    hot_put(dir, "b3", &a, true, NULL, true);
    ctl_resid_hot pin;
    assert_int_equal(ctl_resid_hot_pin_slot(dir, &a, &pin), WK_OK);
    ctl_resid_hot_unpin(dir, pin.id, &c);
    assert_true(ctl_resid_hot_describe(dir, &c, &e, &(uint64_t){0}));
    assert_true(e.dirty);
    dir_close(dir, &t0, &t1);
}

/*
 * A put's own verdict (ctl_resid_hot_mark_clean, ctl_vm_put_backed's) on an
 * entry the cleaner or an eviction picked between the put and the verdict
 * marks it clean but leaves the pick alone: it stays taken and spilling (no
 * eviction, no lookup gets it) until the picker's ctl_resid_hot_cleaned or
 * remove_id. A verdict after a loss changes nothing.
 */
static void
test_hot_mark_clean(void **state)
{
    (void)state;
    ctl_resid_dir *dir;
    ctl_resid t0, t1;
    ctl_kv_geom g = {.state_bytes = 64};
    dir_two(&dir, &t0, &t1, &g);
    ctl_slot_ref a, b;
    assert_int_equal(ctl_resid_slot_alloc(dir, "w0", &a, NULL), WK_OK);
    assert_int_equal(ctl_resid_slot_alloc(dir, "w0", &b, NULL), WK_OK);
    ctl_resid_hot put, e, v;
    /* the cleaner picks the session right after its put (admission asked for room) */
    assert_int_equal(ctl_resid_hot_put(dir, "s", &a, false, "ck", &(ctl_resid_hot){0}, &put),
                     WK_OK);
    assert_int_equal(evict_clean(dir, "w0", 0, &v), WK_EBUSY);
    bool for_room = false;
    assert_true(ctl_resid_hot_next_clean(dir, 0, 0, 0, NULL, &e, &for_room));
    assert_int_equal(e.id, put.id);
    pthread_mutex_lock(ctl_resid_dir_mutex(dir));
    uint64_t gen = ctl_resid_hot_clean_gen_locked(dir);
    pthread_mutex_unlock(ctl_resid_dir_mutex(dir));
    /* the put's verdict: clean, the pick intact */
    assert_true(ctl_resid_hot_mark_clean(dir, put.id, put.lost));
    pthread_mutex_lock(ctl_resid_dir_mutex(dir));
    assert_true(ctl_resid_hot_clean_gen_locked(dir) != gen); /* (admission looks again) */
    pthread_mutex_unlock(ctl_resid_dir_mutex(dir));
    assert_true(ctl_resid_hot_describe(dir, &a, &v, &(uint64_t){0}));
    assert_false(v.dirty);
    assert_true(v.taken && v.spilling);
    assert_int_equal(evict_clean(dir, "w0", 0, &v), WK_ENOENT); /* still the cleaner's */
    assert_true(ctl_resid_slot_valid(dir, &a));
    assert_int_equal(ctl_resid_hot_pin_slot(dir, &a, &v), WK_EBUSY);
    assert_int_equal(ctl_resid_hot_remove_key(dir, "s", false, false, &v), WK_EBUSY);
    /* the cleaner's own end releases it (and moves clean_gen: admission looks again); then
     * it is evictable */
    pthread_mutex_lock(ctl_resid_dir_mutex(dir));
    gen = ctl_resid_hot_clean_gen_locked(dir);
    pthread_mutex_unlock(ctl_resid_dir_mutex(dir));
    assert_true(ctl_resid_hot_cleaned(dir, e.id, e.lost, false));
    pthread_mutex_lock(ctl_resid_dir_mutex(dir));
    assert_true(ctl_resid_hot_clean_gen_locked(dir) != gen);
    pthread_mutex_unlock(ctl_resid_dir_mutex(dir));
    assert_true(ctl_resid_hot_describe(dir, &a, &v, &(uint64_t){0}));
    assert_false(v.taken || v.spilling);
    assert_int_equal(evict_clean(dir, "w0", 0, &v), WK_OK);
    assert_int_equal(v.id, put.id);
    assert_false(ctl_resid_slot_valid(dir, &a));
    /* the same with ctl_resid_hot_victim's pick (ctl_vm_evict_lru), and a loss first */
    assert_int_equal(ctl_resid_hot_put(dir, "s2", &b, false, "ck2", &(ctl_resid_hot){0}, &put),
                     WK_OK);
    assert_int_equal(ctl_resid_hot_victim(dir, "w0", 0, &v), WK_OK);
    assert_int_equal(v.id, put.id);
    assert_true(v.dirty && v.taken && v.spilling);
    assert_int_equal(ctl_resid_hot_unback(dir, "ck2"), 1);
    assert_false(ctl_resid_hot_mark_clean(dir, put.id, put.lost)); /* lost since: dirty */
    assert_true(ctl_resid_hot_describe(dir, &b, &e, &(uint64_t){0}));
    assert_true(e.dirty && e.taken && e.spilling);
    ctl_resid_hot_remove_id(dir, v.id); /* the evictor's end */
    assert_false(ctl_resid_hot_describe(dir, &b, &e, &(uint64_t){0}));
    dir_close(dir, &t0, &t1);
}

/*
 * The scheduler's decision under slot pressure on a hybrid model: a clean
 * parked slot evicted under the lock turns stale (its KV pages still on the
 * worker) and is not allocatable, but it is coming back (SLOT_FREE), so the
 * next pass must wait for it, not evict the next clean entry: one waiting
 * request evicts one slot. Draining workers' slots don't count for "any".
 */
static void
test_hot_evict_stale(void **state)
{
    (void)state;
    ctl_resid_dir *dir;
    ctl_resid t0, t1;
    ctl_kv_geom g = {.state_bytes = 64, .kv_token_bytes = 8, .page_tokens = 16, .pages_total = 10};
    dir_two(&dir, &t0, &t1, &g);
    ctl_slot_ref a, b, c;
    wk_diag d = {{0}};
    three_slots(dir, &a, &b, &c);
    const ctl_slot_ref *refs[3] = {&a, &b, &c};
    const char *keys[3] = {"ka", "kb", "kc"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ctl_resid_slot_set_ctx(dir, refs[i], 20, &d), WK_OK); /* 2 pages */
        hot_put(dir, keys[i], refs[i], false, "ck", true);
    }
    pthread_mutex_t *mu = ctl_resid_dir_mutex(dir);
    pthread_mutex_lock(mu);
    assert_false(ctl_resid_slot_coming_locked(dir, NULL)); /* every slot held: evict one */
    pthread_mutex_unlock(mu);
    ctl_resid_hot v;
    assert_int_equal(evict_clean(dir, NULL, 0, &v), WK_OK);
    assert_string_equal(v.key, "ka"); /* the least recently used */
    pthread_mutex_lock(mu);
    assert_true(t0.stale[a.slot]);
    assert_int_equal(ctl_resid_free_slot(&t0), 0); /* not allocatable yet ... */
    assert_true(ctl_resid_slot_coming_locked(dir, NULL)); /* ... but coming: no second eviction */
    assert_true(ctl_resid_slot_coming_locked(dir, "w0"));
    assert_false(ctl_resid_slot_coming_locked(dir, "w1"));
    t0.draining = true; /* (a draining worker's slot takes no new request) */
    assert_false(ctl_resid_slot_coming_locked(dir, NULL));
    assert_true(ctl_resid_slot_coming_locked(dir, "w0"));
    t0.draining = false;
    pthread_mutex_unlock(mu);
    assert_true(ctl_resid_slot_valid(dir, &b)); /* the other parked slots stay */
    assert_true(ctl_resid_slot_valid(dir, &c));
    /* the step loop's SLOT_FREE returned: the slot is free, nothing is coming */
    pthread_mutex_lock(mu);
    ctl_resid_unstale(&t0, a.slot);
    assert_int_equal(ctl_resid_free_slot(&t0), a.slot);
    assert_false(ctl_resid_slot_coming_locked(dir, NULL));
    pthread_mutex_unlock(mu);
    dir_close(dir, &t0, &t1);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generations), cmocka_unit_test(test_kv_pages),
        cmocka_unit_test(test_dir_handles), cmocka_unit_test(test_dir_kv),
        cmocka_unit_test(test_dir_wait),    cmocka_unit_test(test_dir_warm),
        cmocka_unit_test(test_hot_victim),  cmocka_unit_test(test_hot_victim_pages),
        cmocka_unit_test(test_hot_index),   cmocka_unit_test(test_hot_clean),
        cmocka_unit_test(test_hot_mark_clean), cmocka_unit_test(test_hot_evict_stale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
