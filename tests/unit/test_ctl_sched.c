/*
 * test_ctl_sched: the scheduler through its public API over a real ctl_pool
 * link to a fake worker (fake_worker.h, a thread of this process): admission
 * by free slots with a bounded wait queue, the admission order (fewest input
 * tokens still to compute first; one that fits a prefill chunk before long
 * ones that waited 2 s; the bound on overtaking), prefill chunks under the per-job cap and
 * the step budget, continuous batching of two jobs in one step with each
 * slot's state exactly the tokens reported fed, held slots and their
 * generations (a stale handle never touches a reused slot), the cap on long
 * prefills running at once (a free slot is left to short jobs, and a waiting
 * long job does not make the scheduler evict parked slots), and the refusals
 * (no worker, a bad spec); a step row's penalty history only with a penalty;
 * a prefill tail's step of its own; a prefill that fits the step fed whole,
 * alone. Eviction under slot pressure, with no callback: a clean parked
 * entry's slot is freed by residence itself (its warm copy kept), a dirty
 * one is cleaned by the cleaner first (a stand-in thread here) and then freed.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ctl_pool.h"
#include "ctl_sched.h"
#include "fake_worker.h"

typedef struct fx {
    char dir[256];
    char url[320];
    ctl_pool *pool;
    ctl_resid_dir *resid;
    ctl_sched *sched;
    fake_worker w;
    bool w_on;
} fx;

/* A pool on a fresh ipc URL and a scheduler over it (no worker yet). */
static void
fx_open(fx *f, uint32_t step_tokens, uint32_t job_chunk, uint32_t queue_max)
{
    memset(f, 0, sizeof(*f));
    const char *base = getenv("TMPDIR");
    snprintf(f->dir, sizeof(f->dir), "%s/wkvm-sched-XXXXXX", base && base[0] ? base : "/tmp");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->url, sizeof(f->url), "ipc://%s/c.ipc", f->dir);
    ctl_pool_config pc = {.listen_url = f->url, .heartbeat_ms = 100, .load_timeout_ms = 5000};
    wk_diag d = {{0}};
    if (ctl_pool_new(&pc, &f->pool, &d) != WK_OK)
        fail_msg("pool: %s", d.msg);
    ctl_sched_config sc = {.step_tokens = step_tokens,
                           .job_chunk = job_chunk,
                           .max_rows = 16,
                           .queue_max = queue_max,
                           .step_timeout_ms = 5000,
                           .drain_wait_ms = 5000};
    if (ctl_resid_dir_new(&f->resid) != WK_OK)
        fail_msg("resid: out of memory");
    if (ctl_sched_new(&sc, f->pool, f->resid, NULL, &f->sched, &d) != WK_OK)
        fail_msg("sched: %s", d.msg);
}

/* Connects a fake worker with n usable slots and waits until the scheduler steps on it. */
static void
fx_worker(fx *f, uint32_t n)
{
    assert_int_equal(fw_start(&f->w, f->url, "w0", n), 0);
    f->w_on = true;
    uint64_t until = fw_now_ms() + 4000;
    while (ctl_sched_worker_count(f->sched) == 0 && fw_now_ms() < until)
        usleep(5000);
    assert_int_equal(ctl_sched_worker_count(f->sched), 1);
}

static void
fx_close(fx *f)
{
    ctl_sched_free(f->sched);
    ctl_resid_dir_free(f->resid);
    ctl_pool_stop(f->pool); /* no heartbeat in flight as the worker's link closes */
    if (f->w_on)
        fw_stop(&f->w);
    ctl_pool_free(f->pool);
    char p[400];
    snprintf(p, sizeof(p), "%s/c.ipc", f->dir);
    unlink(p);
    rmdir(f->dir);
}

static ctl_job *
submit(fx *f, const int32_t *toks, size_t n, const ctl_slot_ref *slot, bool sample)
{
    ctl_job_spec sp = {
        .tokens = toks, .n_tokens = n, .sample = sample, .slot = slot, .fresh = slot == NULL};
    ctl_job *j = NULL;
    wk_diag d = {{0}};
    if (ctl_sched_submit(f->sched, &sp, &j, &d) != WK_OK)
        fail_msg("submit: %s", d.msg);
    return j;
}

static ctl_job_event
next_ev(ctl_job *j)
{
    ctl_job_event ev;
    memset(&ev, 0, sizeof(ev));
    if (ctl_job_next(j, 4000, &ev) != WK_OK)
        fail_msg("no event within 4 s");
    return ev;
}

/* Takes n tokens from j (continuing after each but the last), then stops it. */
static void
take_tokens(ctl_job *j, fw_state *expect, size_t n, bool feed_last)
{
    for (size_t i = 0; i < n; i++) {
        ctl_job_event ev = next_ev(j);
        if (ev.type != CTL_JOB_EV_TOKEN)
            fail_msg("event %d (%s), expected a token", (int)ev.type, ev.message);
        /* the toy model samples from the state: the slot holds exactly what was fed */
        assert_int_equal(ev.token, fw_token_of(expect));
        if (i + 1 < n || feed_last)
            fw_feed(expect, ev.token);
        if (i + 1 < n)
            ctl_job_continue(j);
        else
            ctl_job_stop(j, feed_last);
    }
    ctl_job_event ev = next_ev(j);
    assert_int_equal(ev.type, CTL_JOB_EV_DONE);
}

static void
test_order_and_queue(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 64, 64, 2);
    fx_worker(&f, 1);
    static const int32_t a[5] = {11, 12, 13, 14, 15};
    int32_t b[30], c[2] = {21, 22};
    for (int i = 0; i < 30; i++)
        b[i] = 30 + i;
    fw_hold(&f.w, true);
    ctl_job *ja = submit(&f, a, 5, NULL, true);
    assert_true(fw_wait_held(&f.w, 4000)); /* A runs on the only slot */
    ctl_job *jb = submit(&f, b, 30, NULL, true);
    ctl_job *jc = submit(&f, c, 2, NULL, true);
    uint32_t waiting = 0, running = 0;
    ctl_sched_depths(f.sched, &waiting, &running);
    assert_int_equal(waiting, 2);
    assert_int_equal(running, 1);
    /* the wait queue holds queue_max jobs */
    ctl_job_spec sp = {.tokens = c, .n_tokens = 2, .sample = true, .fresh = true};
    ctl_job *jd = NULL;
    wk_diag d = {{0}};
    assert_int_equal(ctl_sched_submit(f.sched, &sp, &jd, &d), WK_EQUEUEFULL);
    assert_null(jd);
    uint32_t used = 0, total = 0;
    ctl_resid_counts(f.resid, "w0", &used, &total);
    assert_int_equal(used, 1);
    assert_int_equal(total, 1);

    fw_hold(&f.w, false);
    fw_state sa = fw_state_of(a, 5);
    take_tokens(ja, &sa, 1, false);
    ctl_job_free(ja); /* the slot frees: C (2 tokens to compute) goes before B (30) */
    fw_state sc = fw_state_of(c, 2);
    take_tokens(jc, &sc, 2, true);
    ctl_job_event ev;
    assert_int_equal(ctl_job_next(jb, 0, &ev), WK_ETIMEDOUT); /* B still waits */
    assert_int_equal(ctl_job_fed(jc), 4); /* 2 input + 2 sampled, the last fed too */
    assert_int_equal(ctl_job_n_input(jc), 2);
    ctl_job_free(jc);
    fw_state sb = fw_state_of(b, 30);
    take_tokens(jb, &sb, 1, false);
    ctl_job_free(jb);

    /* the log: A's prefill, then C admitted (a reset row of 2 tokens), then B's */
    static fw_row log[64];
    size_t n = fw_log(&f.w, log, 64);
    int seen_c = -1, seen_b = -1;
    for (size_t i = 0; i < n; i++) {
        if (log[i].reset && log[i].first == 21)
            seen_c = (int)i;
        if (log[i].reset && log[i].first == 30)
            seen_b = (int)i;
    }
    assert_true(log[0].reset && log[0].n_tokens == 5 && log[0].first == 11);
    assert_true(seen_c > 0 && seen_b > seen_c);
    assert_int_equal(log[seen_c].n_tokens, 2);
    assert_int_equal(log[seen_b].n_tokens, 30);
    fx_close(&f);
}

static void
test_chunks_and_batching(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 8, 4, 8);
    fx_worker(&f, 2);
    /*
     * one job: 18 input tokens go in chunks of 4 while more than the step's
     * budget is left, then the last 6 whole, sampling
     */
    int32_t x[18];
    for (int i = 0; i < 18; i++)
        x[i] = 40 + i;
    ctl_job *jx = submit(&f, x, 18, NULL, true);
    fw_state sx = fw_state_of(x, 18);
    take_tokens(jx, &sx, 1, false);
    assert_int_equal(ctl_job_computed(jx), 18);
    ctl_job_free(jx);
    static fw_row log[256];
    size_t n = fw_log(&f.w, log, 256);
    assert_int_equal(n, 4);
    assert_int_equal(log[0].n_tokens, 4);
    assert_true(log[0].reset && !log[0].sample);
    assert_int_equal(log[1].n_tokens, 4);
    assert_int_equal(log[2].n_tokens, 4);
    assert_false(log[2].sample);
    assert_int_equal(log[3].n_tokens, 6);
    assert_true(log[3].sample);

    /* two jobs decode together: some step carries a row of each slot */
    fw_log_clear(&f.w);
    static const int32_t y[3] = {1, 2, 3}, z[3] = {4, 5, 6};
    ctl_job *jy = submit(&f, y, 3, NULL, true);
    ctl_job *jz = submit(&f, z, 3, NULL, true);
    fw_state sy = fw_state_of(y, 3), sz = fw_state_of(z, 3);
    for (int i = 0; i < 6; i++) {
        ctl_job_event ey = next_ev(jy), ez = next_ev(jz);
        assert_int_equal(ey.type, CTL_JOB_EV_TOKEN);
        assert_int_equal(ez.type, CTL_JOB_EV_TOKEN);
        assert_int_equal(ey.token, fw_token_of(&sy));
        assert_int_equal(ez.token, fw_token_of(&sz));
        fw_feed(&sy, ey.token);
        fw_feed(&sz, ez.token);
        if (i < 5) {
            ctl_job_continue(jy);
            ctl_job_continue(jz);
        } else {
            ctl_job_stop(jy, true);
            ctl_job_stop(jz, true);
        }
    }
    assert_int_equal(next_ev(jy).type, CTL_JOB_EV_DONE);
    assert_int_equal(next_ev(jz).type, CTL_JOB_EV_DONE);
    ctl_slot_ref ry, rz;
    assert_int_equal(ctl_job_keep_slot(jy, &ry), WK_OK);
    assert_int_equal(ctl_job_keep_slot(jz, &rz), WK_OK);
    ctl_job_free(jy);
    ctl_job_free(jz);
    /* the kept slots hold exactly the fed tokens (input + 5 accepted + the last) */
    fw_state wy = fw_slot_state(&f.w, ry.slot), wz = fw_slot_state(&f.w, rz.slot);
    assert_int_equal(wy.count, 3 + 6);
    assert_int_equal(wz.count, 3 + 6);
    assert_true(wy.hash == sy.hash && wz.hash == sz.hash);
    n = fw_log(&f.w, log, 256);
    bool together = false;
    for (size_t i = 0; i + 1 < n && !together; i++)
        together = log[i].step == log[i + 1].step && log[i].slot != log[i + 1].slot;
    assert_true(together);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(log[i].n_penalty, 0); /* (no penalty: no history) */
    assert_int_equal(ctl_resid_slot_free(f.resid, &ry), WK_OK);
    assert_int_equal(ctl_resid_slot_free(f.resid, &rz), WK_OK);

    /* with a penalty each sampling row carries the samples accepted so far */
    fw_log_clear(&f.w);
    ctl_job_spec sp = {.tokens = y, .n_tokens = 3, .sample = true, .fresh = true};
    sp.params.frequency_penalty = 0.5f;
    ctl_job *jp = NULL;
    wk_diag d = {{0}};
    assert_int_equal(ctl_sched_submit(f.sched, &sp, &jp, &d), WK_OK);
    fw_state sp_state = fw_state_of(y, 3);
    take_tokens(jp, &sp_state, 4, false);
    ctl_job_free(jp);
    n = fw_log(&f.w, log, 256);
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (log[i].sample)
            assert_int_equal(log[i].n_penalty, k++);
    assert_int_equal(k, 4);
    fx_close(&f);
}

static void
test_held_slots(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 64, 64, 8);
    fx_worker(&f, 2);
    wk_diag d = {{0}};
    ctl_slot_ref r1, r2, r3;
    assert_int_equal(ctl_resid_slot_alloc(f.resid, "w0", &r1, &d), WK_OK);
    assert_int_equal(ctl_resid_slot_alloc(f.resid, NULL, &r2, &d), WK_OK);
    assert_int_not_equal(r1.slot, r2.slot);
    assert_int_equal(ctl_resid_slot_alloc(f.resid, NULL, &r3, &d), WK_ENOSPC);
    assert_int_equal(ctl_resid_slot_alloc(f.resid, "nosuch", &r3, &d) == WK_OK, 0);
    uint64_t epoch = ctl_resid_slot_epoch(f.resid);
    assert_false(ctl_resid_slot_wait(f.resid, epoch, fw_now_ms() + 20)); /* nothing freed */

    /* a job on a held slot feeds into it; a second one continues its state */
    static const int32_t p[4] = {7, 8, 9, 10}, q[2] = {11, 12};
    ctl_job *j = submit(&f, p, 4, &r1, false);
    assert_int_equal(next_ev(j).type, CTL_JOB_EV_DONE);
    ctl_job_free(j); /* a held slot stays allocated */
    assert_true(ctl_resid_slot_valid(f.resid, &r1));
    ctl_job_spec sp = {.tokens = q, .n_tokens = 2, .sample = true, .slot = &r1};
    assert_int_equal(ctl_sched_submit(f.sched, &sp, &j, &d), WK_OK);
    int32_t pq[6] = {7, 8, 9, 10, 11, 12};
    fw_state s = fw_state_of(pq, 6);
    take_tokens(j, &s, 1, true);
    ctl_job_free(j);
    fw_state w = fw_slot_state(&f.w, r1.slot);
    assert_int_equal(w.count, 7);
    assert_true(w.hash == s.hash);

    size_t n_slots = ctl_sched_slots(f.sched, NULL, 0);
    assert_int_equal(n_slots, 2);

    /* a freed slot's handle is stale: freeing it again or running on it is refused */
    epoch = ctl_resid_slot_epoch(f.resid);
    assert_int_equal(ctl_resid_slot_free(f.resid, &r1), WK_OK);
    assert_true(ctl_resid_slot_wait(f.resid, epoch, fw_now_ms() + 1000));
    assert_false(ctl_resid_slot_valid(f.resid, &r1));
    assert_int_equal(ctl_resid_slot_free(f.resid, &r1), WK_ESTATE);
    sp.slot = &r1;
    j = NULL;
    assert_int_equal(ctl_sched_submit(f.sched, &sp, &j, &d), WK_ESTATE);
    assert_null(j);
    /* the same slot allocated again has another generation */
    assert_int_equal(ctl_resid_slot_alloc(f.resid, "w0", &r3, &d), WK_OK);
    assert_int_equal(r3.slot, r1.slot);
    assert_true(r3.gen != r1.gen);
    assert_true(ctl_resid_slot_valid(f.resid, &r3));
    /* a busy held slot refuses a second job */
    fw_hold(&f.w, true);
    ctl_job *jb = submit(&f, q, 2, &r3, false);
    assert_true(fw_wait_held(&f.w, 4000));
    sp.slot = &r3;
    j = NULL;
    assert_int_equal(ctl_sched_submit(f.sched, &sp, &j, &d), WK_EBUSY);
    fw_hold(&f.w, false);
    assert_int_equal(next_ev(jb).type, CTL_JOB_EV_DONE);
    ctl_job_free(jb);
    assert_int_equal(ctl_resid_slot_free(f.resid, &r3), WK_OK);
    assert_int_equal(ctl_resid_slot_free(f.resid, &r2), WK_OK);
    fx_close(&f);
}

/* The order's classes and keys (ctl_sched_rank_class / ctl_sched_rank_cmp). */
static void
test_rank_decision(void **state)
{
    (void)state;
    const uint32_t chunk = 256;
    /* a resumed follow-up (64 tokens left) vs another chat's long first prompt */
    assert_int_equal(ctl_sched_rank_class(true, 0, 0, 64, chunk), CTL_SCHED_CLASS_SHORT);
    assert_int_equal(ctl_sched_rank_class(true, 0, 600000, 64, chunk), CTL_SCHED_CLASS_SHORT);
    assert_int_equal(ctl_sched_rank_class(true, 0, 0, 1500, chunk), CTL_SCHED_CLASS_OTHER);
    assert_int_equal(ctl_sched_rank_class(true, 0, CTL_SCHED_AGING_MS, 1500, chunk),
                     CTL_SCHED_CLASS_AGED);
    /* overtaken often enough, a waiting job goes before all, however long it waited */
    assert_int_equal(ctl_sched_rank_class(true, CTL_SCHED_BYPASS_MAX - 1, 600000, 1500, chunk),
                     CTL_SCHED_CLASS_AGED);
    assert_int_equal(ctl_sched_rank_class(true, CTL_SCHED_BYPASS_MAX, 0, 1500, chunk),
                     CTL_SCHED_CLASS_STARVED);
    assert_int_equal(ctl_sched_rank_class(true, CTL_SCHED_BYPASS_MAX, 0, 1, chunk),
                     CTL_SCHED_CLASS_STARVED);
    /* a running job's prefill waits for short ones, for CTL_SCHED_BYPASS_MAX steps at most */
    assert_int_equal(ctl_sched_rank_class(false, CTL_SCHED_BYPASS_MAX - 1, 600000, 1500, chunk),
                     CTL_SCHED_CLASS_AGED);
    assert_int_equal(ctl_sched_rank_class(false, CTL_SCHED_BYPASS_MAX, 600000, 1500, chunk),
                     CTL_SCHED_CLASS_STARVED);
    assert_int_equal(ctl_sched_rank_class(false, 0, 600000, 256, chunk), CTL_SCHED_CLASS_SHORT);
    assert_int_equal(ctl_sched_rank_class(false, 0, 0, 257, chunk), CTL_SCHED_CLASS_OTHER);
    /* the short one goes first although the long one is older and aged */
    ctl_sched_rank old_long = {CTL_SCHED_CLASS_AGED, 1500, 1}, follow = {CTL_SCHED_CLASS_SHORT, 64, 9};
    assert_true(ctl_sched_rank_cmp(&follow, &old_long) < 0);
    assert_true(ctl_sched_rank_cmp(&old_long, &follow) > 0);
    /* within a class: short ones and young ones fewest left first, aged and starved FIFO */
    ctl_sched_rank s1 = {CTL_SCHED_CLASS_SHORT, 10, 5}, s2 = {CTL_SCHED_CLASS_SHORT, 90, 2};
    assert_true(ctl_sched_rank_cmp(&s1, &s2) < 0);
    ctl_sched_rank a1 = {CTL_SCHED_CLASS_AGED, 9000, 3}, a2 = {CTL_SCHED_CLASS_AGED, 300, 4};
    assert_true(ctl_sched_rank_cmp(&a1, &a2) < 0);
    ctl_sched_rank o1 = {CTL_SCHED_CLASS_OTHER, 300, 7}, o2 = {CTL_SCHED_CLASS_OTHER, 9000, 6};
    assert_true(ctl_sched_rank_cmp(&o1, &o2) < 0);
    ctl_sched_rank st = {CTL_SCHED_CLASS_STARVED, 9000, 8};
    assert_true(ctl_sched_rank_cmp(&st, &s1) < 0);
    assert_true(ctl_sched_rank_cmp(&a1, &o1) < 0);
    assert_int_equal(ctl_sched_rank_cmp(&s1, &s1), 0);
}

/*
 * The same through the step loop: a long prompt runs and two more wait past
 * CTL_SCHED_AGING_MS, then a short job (a resumed follow-up) comes. When the
 * step loop goes on, the short job takes a free slot before both older long
 * ones and its one chunk goes before the running long one's next chunk.
 */
static void
test_short_first_behind_aged(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 4, 4, 8);
    fx_worker(&f, 2);
    int32_t l[40], x[40], w[40];
    for (int i = 0; i < 40; i++) {
        l[i] = 100 + i;
        x[i] = 200 + i;
        w[i] = 300 + i;
    }
    static const int32_t sh[3] = {7, 8, 9};
    fw_hold(&f.w, true);
    ctl_job *jl = submit(&f, l, 40, NULL, true);
    assert_true(fw_wait_held(&f.w, 4000)); /* L's first chunk is in flight */
    ctl_job *jx = submit(&f, x, 40, NULL, true); /* wait (the loop is in L's step) */
    ctl_job *jw = submit(&f, w, 40, NULL, true);
    usleep((CTL_SCHED_AGING_MS + 200) * 1000);   /* L, X and W are aged now */
    ctl_job *js = submit(&f, sh, 3, NULL, true);
    fw_hold(&f.w, false);
    fw_state sl = fw_state_of(l, 40), ss = fw_state_of(sh, 3), sx = fw_state_of(x, 40),
             sw = fw_state_of(w, 40);
    take_tokens(js, &ss, 1, false);
    ctl_job_free(js);
    take_tokens(jl, &sl, 1, false);
    ctl_job_free(jl);
    take_tokens(jx, &sx, 1, false);
    ctl_job_free(jx);
    take_tokens(jw, &sw, 1, false);
    ctl_job_free(jw);
    static fw_row log[256];
    size_t n = fw_log(&f.w, log, 256);
    int s_at = -1, x_at = -1, l2_at = -1;
    for (size_t i = 0; i < n; i++) {
        if (log[i].reset && log[i].first == 7)
            s_at = (int)i;
        if (log[i].reset && log[i].first == 200)
            x_at = (int)i;
        if (log[i].first == 104)
            l2_at = (int)i; /* L's second chunk */
    }
    assert_true(log[0].reset && log[0].first == 100);
    assert_true(s_at > 0 && x_at > s_at);     /* the slot went to S, not to the older X */
    assert_true(l2_at > s_at);                /* S's chunk before L's next one */
    assert_int_equal(log[s_at].n_tokens, 3);  /* its whole input in one chunk, sampled */
    assert_true(log[s_at].sample);
    fx_close(&f);
}

static void
no_ckpt(void *arg, const ctl_slot_ref *slot, size_t pos)
{
    (void)arg;
    (void)slot;
    (void)pos;
}

/*
 * A prefill tail (a few tokens left: the last chunk before the first reply
 * token, after a checkpoint position ended the chunk before it) gets a step
 * of its own: not beside another job's long chunk, which waits one step.
 */
static void
test_tail_step(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 64, 16, 8); /* (a tail: at most 16 / 4 tokens left) */
    fx_worker(&f, 2);
    int32_t l[400], c[18];
    for (int i = 0; i < 400; i++)
        l[i] = 100 + i;
    for (int i = 0; i < 18; i++)
        c[i] = 500 + i;
    fw_hold(&f.w, true);
    ctl_job *jl = submit(&f, l, 400, NULL, true);
    assert_true(fw_wait_held(&f.w, 4000)); /* L's first chunk is in flight */
    static const size_t at[1] = {16};
    ctl_sched_reuse ru = {.ckpt_at = at, .n_ckpt = 1, .ckpt = no_ckpt};
    ctl_job_spec sp = {.tokens = c, .n_tokens = 18, .sample = true, .fresh = true, .reuse = &ru};
    ctl_job *jc = NULL;
    wk_diag d = {{0}};
    assert_int_equal(ctl_sched_submit(f.sched, &sp, &jc, &d), WK_OK);
    fw_hold(&f.w, false);
    fw_state sl = fw_state_of(l, 400), sc = fw_state_of(c, 18);
    take_tokens(jc, &sc, 1, false);
    ctl_job_free(jc);
    take_tokens(jl, &sl, 1, false);
    ctl_job_free(jl);
    static fw_row log[256];
    size_t n = fw_log(&f.w, log, 256);
    int tail_at = -1;
    for (size_t i = 0; i < n; i++)
        if (log[i].first == 516)
            tail_at = (int)i;
    assert_true(tail_at >= 0);
    assert_int_equal(log[tail_at].n_tokens, 2);
    assert_true(log[tail_at].sample);
    size_t beside = 0;
    for (size_t i = 0; i < n; i++)
        beside += log[i].step == log[tail_at].step;
    assert_int_equal(beside, 1); /* alone in its step */
    bool l_after = false;        /* and L still had chunks to run after it */
    for (size_t i = 0; i < n; i++)
        l_after = l_after || (log[i].first >= 100 && log[i].first < 500 &&
                              log[i].step > log[tail_at].step);
    assert_true(l_after);
    fx_close(&f);
}

/*
 * A prefill whose input left fits the step budget is fed whole, past the
 * per-job chunk, and no other prefill joins its step: two turns that arrive
 * together are served one after the other, fewest tokens first, while a
 * long prompt keeps its per-job chunks.
 */
static void
test_whole_prefill(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 64, 16, 8);
    fx_worker(&f, 3);
    int32_t l[200], a[40], b[41];
    for (int i = 0; i < 200; i++)
        l[i] = 100 + i;
    for (int i = 0; i < 40; i++)
        a[i] = 400 + i;
    for (int i = 0; i < 41; i++)
        b[i] = 500 + i;
    fw_hold(&f.w, true);
    ctl_job *jl = submit(&f, l, 200, NULL, true);
    assert_true(fw_wait_held(&f.w, 4000)); /* L's first chunk is in flight */
    ctl_job *jb = submit(&f, b, 41, NULL, true);
    ctl_job *ja = submit(&f, a, 40, NULL, true);
    fw_hold(&f.w, false);
    fw_state sa = fw_state_of(a, 40), sb = fw_state_of(b, 41), sl = fw_state_of(l, 200);
    take_tokens(ja, &sa, 1, false);
    take_tokens(jb, &sb, 1, false);
    take_tokens(jl, &sl, 1, false);
    ctl_job_free(ja);
    ctl_job_free(jb);
    ctl_job_free(jl);
    static fw_row log[256];
    size_t n = fw_log(&f.w, log, 256);
    int a_at = -1, b_at = -1;
    for (size_t i = 0; i < n; i++) {
        if (log[i].first == 400)
            a_at = (int)i;
        if (log[i].first == 500)
            b_at = (int)i;
        if (log[i].first >= 100 && log[i].first < 300 && !log[i].sample)
            assert_true(log[i].n_tokens <= 16); /* L: per-job chunks (then its end whole) */
    }
    assert_true(a_at >= 0 && b_at >= 0);
    assert_int_equal(log[a_at].n_tokens, 40); /* whole, sampled */
    assert_true(log[a_at].sample);
    assert_int_equal(log[b_at].n_tokens, 41);
    assert_true(log[b_at].sample);
    assert_true(log[b_at].step > log[a_at].step); /* fewest tokens first, one at a time */
    for (size_t i = 0; i < n; i++) {
        if ((int)i != a_at && log[i].step == log[a_at].step)
            fail_msg("row %zu (first %d) shares A's step", i, log[i].first);
        if ((int)i != b_at && log[i].step == log[b_at].step)
            fail_msg("row %zu (first %d) shares B's step", i, log[i].first);
    }
    fx_close(&f);
}

/*
 * A prompt longer than any one step, behind a stream of short turns each
 * fed whole: it is left out of their steps, but after
 * CTL_SCHED_WHOLE_YIELD (4) of them in a row it takes the budget a whole
 * turn leaves, beside it.
 */
static void
test_whole_yield(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 64, 16, 16);
    fx_worker(&f, 10);
    static int32_t l[400], sh[8][12];
    for (int i = 0; i < 400; i++)
        l[i] = 1000 + i;
    for (int k = 0; k < 8; k++)
        for (int i = 0; i < 12; i++)
            sh[k][i] = 100 * (k + 1) + i;
    fw_hold(&f.w, true);
    ctl_job *jl = submit(&f, l, 400, NULL, true);
    assert_true(fw_wait_held(&f.w, 4000)); /* L's first chunk is in flight */
    ctl_job *js[8];
    for (int k = 0; k < 8; k++)
        js[k] = submit(&f, sh[k], 12, NULL, true);
    fw_hold(&f.w, false);
    for (int k = 0; k < 8; k++) {
        fw_state ss = fw_state_of(sh[k], 12);
        take_tokens(js[k], &ss, 1, false);
        ctl_job_free(js[k]);
    }
    fw_state sl = fw_state_of(l, 400);
    take_tokens(jl, &sl, 1, false);
    ctl_job_free(jl);
    static fw_row log[512];
    size_t n = fw_log(&f.w, log, 512);
    /* the steps of the short turns' rows (each whole: 12 tokens, sampled) */
    uint32_t first_short = 0, beside = 0, alone = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(log[i].first >= 100 && log[i].first < 1000 && log[i].reset))
            continue;
        assert_int_equal(log[i].n_tokens, 12);
        assert_true(log[i].sample);
        if (first_short == 0)
            first_short = log[i].step;
        bool l_there = false;
        int shorts = 0; /* one turn per step, L beside it or not */
        for (size_t k = 0; k < n; k++) {
            l_there = l_there || (log[k].step == log[i].step && log[k].first >= 1000);
            shorts += log[k].step == log[i].step && log[k].first >= 100 && log[k].first < 1000;
        }
        assert_int_equal(shorts, 1);
        if (l_there)
            beside++;
        else
            alone++;
    }
    assert_true(first_short > 0);
    assert_true(alone >= 4); /* L left out at first */
    assert_true(beside >= 1); /* then beside one of them */
    fx_close(&f);
}

/*
 * step 8 / chunk 4: two long prefills fill a step, so a third long job waits
 * while a slot is free, and a short job submitted after it takes that slot.
 */
static void
test_long_prefill_cap(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 8, 4, 8);
    fx_worker(&f, 5);
    /* a dirty parked session in a fifth slot: evicting it would ask residence's cleaner */
    ctl_slot_ref parked;
    ctl_resid_hot old;
    assert_int_equal(ctl_resid_slot_alloc(f.resid, "w0", &parked, NULL), WK_OK);
    assert_int_equal(ctl_resid_hot_put(f.resid, "parked", &parked, false, NULL, &old, NULL),
                     WK_OK);
    static int32_t l1[400], l2[400], l3[400];
    for (int i = 0; i < 400; i++) {
        l1[i] = 1000 + i;
        l2[i] = 2000 + i;
        l3[i] = 3000 + i;
    }
    static const int32_t sh[2] = {7, 8}, sh2[2] = {9, 10};
    fw_hold(&f.w, true);
    ctl_job *j1 = submit(&f, l1, 400, NULL, true);
    assert_true(fw_wait_held(&f.w, 4000)); /* L1's first chunk is in flight */
    ctl_job *j2 = submit(&f, l2, 400, NULL, true);
    ctl_job *j3 = submit(&f, l3, 400, NULL, true);
    ctl_job *js = submit(&f, sh, 2, NULL, true);
    fw_hold(&f.w, false);
    fw_state ss = fw_state_of(sh, 2);
    ctl_job_event ev = next_ev(js);
    assert_int_equal(ev.type, CTL_JOB_EV_TOKEN);
    assert_int_equal(ev.token, fw_token_of(&ss));
    fw_hold(&f.w, true); /* L1 and L2 are still hundreds of tokens from their end */
    uint32_t waiting = 0, running = 0, used = 0, total = 0;
    ctl_sched_depths(f.sched, &waiting, &running);
    assert_int_equal(running, 3);  /* L1, L2, S */
    assert_int_equal(waiting, 1);  /* L3, though slot 4 is free */
    ctl_resid_counts(f.resid, "w0", &used, &total);
    assert_int_equal(used, 4); /* and the parked one */
    assert_int_equal(total, 5);
    /* a second short job takes the free slot at once */
    ctl_job *js2 = submit(&f, sh2, 2, NULL, true);
    fw_hold(&f.w, false);
    fw_state ss2 = fw_state_of(sh2, 2);
    take_tokens(js2, &ss2, 1, false);
    ctl_job_stop(js, false);
    assert_int_equal(next_ev(js).type, CTL_JOB_EV_DONE);
    ctl_job_free(js);
    ctl_job_free(js2);
    /* S and S2 ended: slots are free, and L3 only waited for prefill room, so no eviction */
    ctl_slot_ref where;
    assert_true(ctl_resid_hot_find(f.resid, "parked", &where));
    ctl_resid_hot e;
    bool for_room = false; /* (no cleaning was asked for) */
    assert_false(ctl_resid_hot_next_clean(f.resid, 0, 0, 0, NULL, &e, &for_room));
    fw_state s1 = fw_state_of(l1, 400), s2 = fw_state_of(l2, 400), s3 = fw_state_of(l3, 400);
    take_tokens(j1, &s1, 1, false);
    take_tokens(j2, &s2, 1, false);
    take_tokens(j3, &s3, 1, false); /* admitted once L1 or L2 neared its end */
    ctl_job_free(j1);
    ctl_job_free(j2);
    ctl_job_free(j3);
    static fw_row log[512];
    size_t n = fw_log(&f.w, log, 512);
    int s_at = -1, l3_at = -1, long_ends = 0;
    for (size_t i = 0; i < n; i++) {
        if (log[i].reset && log[i].first == 7)
            s_at = (int)i;
        if (log[i].reset && log[i].first == 3000)
            l3_at = (int)i;
        /* a chunk of L1 or L2 reaching its last 4 tokens, before L3's first row */
        if (l3_at < 0 && ((log[i].first >= 1392 && log[i].first < 1400) ||
                          (log[i].first >= 2392 && log[i].first < 2400)))
            long_ends++;
    }
    assert_true(s_at > 0 && l3_at > s_at);
    assert_true(long_ends >= 1);
    fx_close(&f);
}

static void
test_refusals(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 64, 64, 8);
    static const int32_t t[2] = {1, 2};
    ctl_job *j = NULL;
    wk_diag d = {{0}};
    /* no worker has connected */
    ctl_job_spec sp = {.tokens = t, .n_tokens = 2, .sample = true, .fresh = true};
    assert_int_equal(ctl_sched_submit(f.sched, &sp, &j, &d), WK_EUNAVAIL);
    assert_non_null(strstr(d.msg, "no worker is ready"));
    assert_null(j);
    /* bad specs */
    sp.n_tokens = 0;
    assert_int_equal(ctl_sched_submit(f.sched, &sp, &j, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "a sampling job needs at least one input token"));
    sp.sample = false;
    assert_int_equal(ctl_sched_submit(f.sched, &sp, &j, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "a job needs input tokens"));
    /* a job waiting when its worker leaves fails */
    fx_worker(&f, 1);
    ctl_pool_stop(f.pool); /* no heartbeat queued unread at the held worker as it leaves */
    fw_hold(&f.w, true);
    sp.n_tokens = 2;
    sp.sample = true;
    assert_int_equal(ctl_sched_submit(f.sched, &sp, &j, &d), WK_OK);
    assert_true(fw_wait_held(&f.w, 4000));
    fw_stop(&f.w);
    f.w_on = false;
    ctl_job_event ev = next_ev(j);
    assert_int_equal(ev.type, CTL_JOB_EV_ERROR);
    assert_true(ev.err == WK_EUNAVAIL || ev.err == WK_ETIMEDOUT || ev.err == WK_EIO);
    ctl_job_free(j);
    fx_close(&f);
}

typedef struct cleaner {
    ctl_resid_dir *dir;
    atomic_bool stop;
    atomic_int spills; /* sessions it "spilled" */
    atomic_int bad;    /* picks that were not a dirty victim for room, or not cleaned */
    pthread_t th;
} cleaner;

/* A cleaner standing in for ctl_vm's: "spills" each session residence asks for, keeping its slot. */
static void *
cleaner_main(void *arg)
{
    cleaner *c = arg;
    while (!atomic_load(&c->stop)) {
        ctl_resid_hot e;
        bool for_room = false;
        if (!ctl_resid_hot_next_clean(c->dir, 0, 0, 50, &c->stop, &e, &for_room))
            continue;
        if (!for_room || !e.dirty)
            atomic_fetch_add(&c->bad, 1);
        atomic_fetch_add(&c->spills, 1);
        if (!ctl_resid_hot_cleaned(c->dir, e.id, e.lost, true))
            atomic_fetch_add(&c->bad, 1);
    }
    return NULL;
}

/*
 * One slot held by a parked entry; a request waits for it. No callback: a
 * clean entry (a cached state with its warm copy) is freed by residence with
 * no I/O and its warm copy stays; a dirty one (a session) goes to the
 * cleaner first, and is freed once clean.
 */
static void
test_evict_parked(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 8, 4, 8);
    fx_worker(&f, 1);
    static cleaner cl;
    cl.dir = f.resid;
    atomic_init(&cl.stop, false);
    atomic_init(&cl.spills, 0);
    atomic_init(&cl.bad, 0);
    assert_int_equal(pthread_create(&cl.th, NULL, cleaner_main, &cl), 0);
    static const int32_t t1[2] = {11, 12}, t2[2] = {13, 14};
    for (int dirty = 0; dirty < 2; dirty++) {
        ctl_slot_ref held;
        ctl_resid_hot old, e;
        const char *key = dirty ? "session" : "state";
        assert_int_equal(ctl_resid_slot_alloc(f.resid, "w0", &held, NULL), WK_OK);
        assert_int_equal(ctl_resid_hot_put(f.resid, key, &held, !dirty, NULL, &old, &e), WK_OK);
        if (!dirty) {
            char prev[65];
            assert_int_equal(ctl_resid_warm_put(f.resid, key, "w0", 2, 1, prev, sizeof(prev)),
                             WK_OK);
            assert_true(ctl_resid_hot_cleaned(f.resid, e.id, e.lost, false));
        }
        const int32_t *t = dirty ? t2 : t1;
        ctl_job *j = submit(&f, t, 2, NULL, true);
        fw_state st = fw_state_of(t, 2);
        ctl_job_event ev = next_ev(j);
        assert_int_equal(ev.type, CTL_JOB_EV_TOKEN);
        assert_int_equal(ev.token, fw_token_of(&st));
        assert_false(ctl_resid_slot_valid(f.resid, &held)); /* the parked slot was taken back */
        ctl_slot_ref where;
        assert_false(ctl_resid_hot_find(f.resid, key, &where));
        assert_int_equal(atomic_load(&cl.spills), dirty); /* a clean entry needed no cleaning */
        char w[65];
        uint64_t epoch = 0;
        assert_true(ctl_resid_warm_where(f.resid, "state", w, sizeof(w), &epoch)); /* kept */
        ctl_job_stop(j, false);
        assert_int_equal(next_ev(j).type, CTL_JOB_EV_DONE);
        ctl_job_free(j);
    }
    atomic_store(&cl.stop, true);
    ctl_resid_hot_kick(f.resid);
    pthread_join(cl.th, NULL);
    assert_int_equal(atomic_load(&cl.bad), 0);
    fx_close(&f);
}

/*
 * A hybrid model: a clean parked slot evicted under the lock still holds KV
 * pages on the worker (stale) until the step loop's SLOT_FREE. One request
 * waiting for a slot, two clean parked slots: the manager evicts one and
 * waits for it to come back, never the second.
 */
static void
test_evict_stale_hybrid(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 8, 4, 8);
    assert_int_equal(fw_start_kv(&f.w, f.url, "w0", 3, 64), 0);
    f.w_on = true;
    uint64_t until = fw_now_ms() + 4000;
    while (ctl_sched_worker_count(f.sched) == 0 && fw_now_ms() < until)
        usleep(5000);
    assert_int_equal(ctl_sched_worker_count(f.sched), 1);
    ctl_slot_ref held[3];
    const char *keys[2] = {"sa", "sb"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ctl_resid_slot_alloc(f.resid, "w0", &held[i], NULL), WK_OK);
        assert_int_equal(ctl_resid_slot_set_ctx(f.resid, &held[i], 20, NULL), WK_OK); /* 2 pages */
    }
    for (int i = 0; i < 2; i++) { /* two clean parked states (their warm copies exist) */
        ctl_resid_hot old, e;
        char prev[65];
        assert_int_equal(ctl_resid_hot_put(f.resid, keys[i], &held[i], false, NULL, &old, &e),
                         WK_OK);
        assert_int_equal(ctl_resid_warm_put(f.resid, keys[i], "w0", 2, 1, prev, sizeof(prev)),
                         WK_OK);
        assert_true(ctl_resid_hot_cleaned(f.resid, e.id, e.lost, false));
    }
    /* (held[2] stays held by "someone": no slot is free) */
    static const int32_t t[2] = {21, 22};
    ctl_job *j = submit(&f, t, 2, NULL, true);
    fw_state st = fw_state_of(t, 2);
    ctl_job_event ev = next_ev(j);
    assert_int_equal(ev.type, CTL_JOB_EV_TOKEN);
    assert_int_equal(ev.token, fw_token_of(&st));
    ctl_slot_ref where;
    int left = ctl_resid_hot_find(f.resid, "sa", &where);
    left += ctl_resid_hot_find(f.resid, "sb", &where);
    assert_int_equal(left, 1); /* one evicted, the other still parked */
    ctl_job_stop(j, false);
    assert_int_equal(next_ev(j).type, CTL_JOB_EV_DONE);
    ctl_job_free(j);
    fx_close(&f);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_queue),
        cmocka_unit_test(test_chunks_and_batching),
        cmocka_unit_test(test_held_slots),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_rank_decision),
        cmocka_unit_test(test_short_first_behind_aged),
        cmocka_unit_test(test_long_prefill_cap),
        cmocka_unit_test(test_tail_step),
        cmocka_unit_test(test_whole_prefill),
        cmocka_unit_test(test_whole_yield),
        cmocka_unit_test(test_evict_parked),
        cmocka_unit_test(test_evict_stale_hybrid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
