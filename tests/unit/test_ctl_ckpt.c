/*
 * test_ctl_ckpt: the checkpoint index through its public API, over the real
 * scheduler, ctl_vm and an LMDB store in a temporary directory, with a fake
 * worker (fake_worker.h) whose toy state model makes a resumed state and a
 * recomputed one give the same bytes and tokens: the longest checkpoint
 * that prefixes a prompt (end of reply, message boundary, prompt but its
 * last token), owners and models isolated, reply records, the warm budget
 * evicting the least recently used entries, the disk tier (bytes read from
 * the slot, written back on load), clearing by owner, the disabled
 * module planning nothing, and a parked session backed by its live
 * end-of-reply checkpoint giving its slot up without a spill (ctl_vm), a
 * checkpoint not live while its warm copy is being dropped, no cleaning
 * after ctl_vm_flush(), and a cached state whose warm copy the worker
 * refuses staying dirty (its slot freed by the cleaner).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>

#include "ctl_ckpt.h"
#include "ctl_pool.h"
#include "ctl_sched.h"
#include "ctl_store.h"
#include "ctl_vm.h"
#include "fake_worker.h"

typedef struct fx {
    char dir[256];
    char url[320];
    ctl_pool *pool;
    ctl_resid_dir *resid;
    ctl_sched *sched;
    ctl_store *store;
    ctl_vm *vm;
    ctl_ckpt *ckpt;
    fake_worker w;
} fx;

static bool fx_step_cuts;     /* fx_open(): --checkpoint-step-cuts */
static uint32_t fx_interval;  /* fx_open(): --checkpoint-interval */

static void
fx_open(fx *f, uint64_t warm_bytes, uint64_t disk_bytes)
{
    memset(f, 0, sizeof(*f));
    const char *base = getenv("TMPDIR");
    snprintf(f->dir, sizeof(f->dir), "%s/wkvm-ckpt-XXXXXX", base && base[0] ? base : "/tmp");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->url, sizeof(f->url), "ipc://%s/c.ipc", f->dir);
    wk_diag d = {{0}};
    ctl_pool_config pc = {.listen_url = f->url, .heartbeat_ms = 100, .load_timeout_ms = 5000};
    if (ctl_pool_new(&pc, &f->pool, &d) != WK_OK)
        fail_msg("pool: %s", d.msg);
    ctl_sched_config sc = {.step_tokens = 256,
                           .job_chunk = 256,
                           .max_rows = 16,
                           .queue_max = 16,
                           .step_timeout_ms = 5000,
                           .drain_wait_ms = 5000};
    if (ctl_resid_dir_new(&f->resid) != WK_OK)
        fail_msg("resid: out of memory");
    if (ctl_sched_new(&sc, f->pool, f->resid, NULL, &f->sched, &d) != WK_OK)
        fail_msg("sched: %s", d.msg);
    char sd[300];
    snprintf(sd, sizeof(sd), "%s/store", f->dir);
    if (ctl_store_open(sd, NULL, &f->store, NULL, &d) != WK_OK)
        fail_msg("store: %s", d.msg);
    if (ctl_vm_new(f->pool, f->resid, f->store, &f->vm, &d) != WK_OK)
        fail_msg("vm: %s", d.msg);
    assert_int_equal(fw_start(&f->w, f->url, "w0", 4), 0);
    uint64_t until = fw_now_ms() + 4000;
    while (ctl_sched_worker_count(f->sched) == 0 && fw_now_ms() < until)
        usleep(5000);
    assert_int_equal(ctl_sched_worker_count(f->sched), 1);
    ctl_ckpt_config cc = {.enabled = true, .warm_bytes = warm_bytes, .disk_bytes = disk_bytes,
                          .step_cuts = fx_step_cuts, .interval = fx_interval};
    if (ctl_ckpt_new(&cc, f->pool, f->sched, f->vm, f->store, NULL, &f->ckpt, &d) != WK_OK)
        fail_msg("ckpt: %s", d.msg);
}

/* Removes dir and everything below it (what these tests create). */
static void
rm_tree(const char *dir)
{
    DIR *dh = opendir(dir);
    if (dh != NULL) {
        struct dirent *de;
        while ((de = readdir(dh)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            char p[1024];
            snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
            if (unlink(p) != 0)
                rm_tree(p);
        }
        closedir(dh);
    }
    rmdir(dir);
}

static void
fx_close(fx *f)
{
    ctl_vm_flush(f->vm); /* (stops ctl_vm's cleaner, which calls ctl_ckpt_live) */
    ctl_sched_free(f->sched); /* (a step in flight ends in ctl_ckpt's hook: main.c's order) */
    ctl_ckpt_free(f->ckpt);
    ctl_vm_free(f->vm);
    ctl_resid_dir_free(f->resid);
    ctl_pool_stop(f->pool); /* no heartbeat in flight as the worker's link closes */
    fw_stop(&f->w);
    ctl_pool_free(f->pool);
    ctl_store_close(f->store);
    if (strstr(f->dir, "/wkvm-ckpt-") != NULL)
        rm_tree(f->dir);
}

/* What one turn did. */
typedef struct turn {
    size_t hit_len; /* tokens the plan resumed */
    size_t prefill; /* tokens the job fed before it sampled (its steps up to the first
                       sampling row: with step cuts, checkpoint positions split them) */
    size_t first;   /* tokens of its first step */
    int32_t gen[8]; /* sampled tokens */
} turn;

/*
 * One generation for owner under fp: plans (with lookup), runs the job with
 * its hooks, samples n_gen tokens (each checked against the toy model run
 * over the whole prompt: a resumed state must be exact), leaves the
 * end-of-reply checkpoint (a reply record when reply_key is set).
 */
static turn
run_turn(fx *f, const char *owner, const char *fp, const int32_t *in, size_t n,
         const size_t *bounds, size_t n_bounds, size_t n_gen, const char *reply_key)
{
    turn t;
    memset(&t, 0, sizeof(t));
    static ctl_ckpt_plan p;
    wk_diag d = {{0}};
    assert_int_equal(
        ctl_ckpt_plan_begin(f->ckpt, &p, owner, fp, NULL, 0, in, n, bounds, n_bounds, true, &d),
        WK_OK);
    t.hit_len = p.hit_len;
    fw_log_clear(&f->w);
    ctl_job_spec sp = {.tokens = in,
                       .n_tokens = n,
                       .sample = true,
                       .fresh = true,
                       .prefer = p.worker[0] ? p.worker : NULL,
                       .reuse = &p.reuse};
    ctl_job *j = NULL;
    if (ctl_sched_submit(f->sched, &sp, &j, &d) != WK_OK)
        fail_msg("submit: %s", d.msg);
    fw_state want = fw_state_of(in, n);
    for (size_t i = 0; i < n_gen; i++) {
        ctl_job_event ev;
        assert_int_equal(ctl_job_next(j, 4000, &ev), WK_OK);
        if (ev.type != CTL_JOB_EV_TOKEN)
            fail_msg("event %d: %s", (int)ev.type, ev.message);
        assert_int_equal(ev.token, fw_token_of(&want));
        fw_feed(&want, ev.token);
        t.gen[i] = ev.token;
        if (i + 1 < n_gen)
            ctl_job_continue(j);
        else
            ctl_job_stop(j, true);
    }
    ctl_job_event ev;
    assert_int_equal(ctl_job_next(j, 4000, &ev), WK_OK);
    assert_int_equal(ev.type, CTL_JOB_EV_DONE);
    ctl_slot_ref slot;
    assert_int_equal(ctl_job_keep_slot(j, &slot), WK_OK);
    ctl_job_free(j);
    fw_state got = fw_slot_state(&f->w, slot.slot);
    assert_true(got.hash == want.hash && got.count == want.count);
    ctl_ckpt_plan_reply(&p, &slot, t.gen, n_gen, reply_key);
    ctl_ckpt_plan_end(&p);
    assert_int_equal(ctl_resid_slot_free(f->resid, &slot), WK_OK);
    static fw_row log[64];
    size_t nl = fw_log(&f->w, log, 64);
    t.first = nl > 0 ? log[0].n_tokens : 0;
    for (size_t i = 0; i < nl; i++) {
        t.prefill += log[i].n_tokens;
        if (log[i].sample)
            break;
    }
    return t;
}

/* The hit length a lookup for (owner, fp, ids) would resume, the pin released at once. */
static size_t
probe(fx *f, const char *owner, const char *fp, const int32_t *ids, size_t n)
{
    static ctl_ckpt_plan p;
    assert_int_equal(
        ctl_ckpt_plan_begin(f->ckpt, &p, owner, fp, NULL, 0, ids, n, NULL, 0, true, NULL), WK_OK);
    size_t h = p.hit_len;
    ctl_ckpt_plan_end(&p);
    return h;
}

static uint64_t
owner_entries(fx *f, const char *owner)
{
    ctl_ckpt_stats st;
    assert_int_equal(ctl_ckpt_stats_get(f->ckpt, owner, &st), WK_OK);
    uint64_t n = st.entries;
    ctl_ckpt_stats_fini(&st);
    return n;
}

/*
 * Prefill checkpoints: taken by the worker inside the step (StepRow.snaps,
 * the default), or (--checkpoint-step-cuts) each ending its step's chunk and
 * copied by a HOST_PUT between steps. Both leave the same checkpoints.
 */
static void
longest_prefix(bool step_cuts)
{
    static fx f;
    fx_step_cuts = step_cuts;
    fx_open(&f, 1 << 20, 0);
    fx_step_cuts = false;
    int32_t a[12];
    for (int i = 0; i < 12; i++)
        a[i] = 10 + i;
    const size_t bounds[1] = {4};
    /* the first turn finds nothing; leaves the boundary (4), prompt (11) and reply (15) */
    turn t1 = run_turn(&f, "alice", FW_FP, a, 12, bounds, 1, 3, NULL);
    assert_int_equal(t1.hit_len, 0);
    assert_int_equal(t1.prefill, 12);
    assert_int_equal(owner_entries(&f, "alice"), 3);
    if (step_cuts) {
        assert_int_equal(t1.first, 4); /* the prefill stops at the boundary checkpoint */
        assert_int_equal(fw_count(&f.w, WKVM__KIND__HOST_PUT), 3);
        assert_int_equal(fw_snaps(&f.w), 0);
    } else {
        assert_int_equal(t1.first, 12); /* one row: both prefill copies taken inside it */
        assert_int_equal(fw_count(&f.w, WKVM__KIND__HOST_PUT), 1); /* (the reply's) */
        assert_int_equal(fw_snaps(&f.w), 2);
    }

    /* a follow-up resumes the end of the reply and feeds only the rest */
    int32_t b[19];
    memcpy(b, a, sizeof(a));
    memcpy(b + 12, t1.gen, 3 * sizeof(int32_t));
    for (int i = 15; i < 19; i++)
        b[i] = 40 + i;
    uint32_t gets = fw_count(&f.w, WKVM__KIND__HOST_GET);
    turn t2 = run_turn(&f, "alice", FW_FP, b, 19, NULL, 0, 2, NULL);
    assert_int_equal(t2.hit_len, 15);
    assert_int_equal(t2.prefill, 4);
    assert_int_equal(t2.first, step_cuts ? 3 : 4); /* (cut: up to the prompt checkpoint, 18) */
    assert_int_equal(fw_count(&f.w, WKVM__KIND__HOST_GET), gets + 1);

    /* a prompt that leaves the history after 6 tokens: the boundary checkpoint (4) */
    int32_t c[10];
    memcpy(c, a, 6 * sizeof(int32_t));
    for (int i = 6; i < 10; i++)
        c[i] = 90 + i;
    assert_int_equal(probe(&f, "alice", FW_FP, c, 10), 4);
    turn t3 = run_turn(&f, "alice", FW_FP, c, 10, NULL, 0, 1, NULL);
    assert_int_equal(t3.hit_len, 4);
    assert_int_equal(t3.prefill, 6);
    /* an exact repeat (a regenerate) resumes all but the last token */
    assert_int_equal(probe(&f, "alice", FW_FP, a, 12), 11);
    /* owners and models never share */
    assert_int_equal(probe(&f, "bob", FW_FP, b, 19), 0);
    assert_int_equal(probe(&f, "alice", "ffff", b, 19), 0);
    /* a prompt no checkpoint prefixes */
    int32_t z[5] = {1, 2, 3, 4, 5};
    assert_int_equal(probe(&f, "alice", FW_FP, z, 5), 0);

    ctl_ckpt_stats st;
    assert_int_equal(ctl_ckpt_stats_get(f.ckpt, NULL, &st), WK_OK);
    assert_true(st.lookups >= 8);
    assert_true(st.hits >= 4);
    assert_int_equal(st.warm_entries, st.entries);
    assert_int_equal(st.warm_bytes, st.entries * FW_STATE_BYTES);
    assert_int_equal(st.n_owners, 1);
    assert_string_equal(st.owners[0].owner, "alice");
    ctl_ckpt_stats_fini(&st);
    fx_close(&f);
}

static void
test_longest_prefix(void **state)
{
    (void)state;
    longest_prefix(false);
}

static void
test_longest_prefix_step_cuts(void **state)
{
    (void)state;
    longest_prefix(true);
}

static void
test_reply_records_and_clear(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 1 << 20, 0);
    char ka[WK_SHA256_HEX_LEN], kb[WK_SHA256_HEX_LEN], kc[WK_SHA256_HEX_LEN];
    ctl_ckpt_reply_key(FW_FP, "alice", "<user>hi<bot>yo", 15, ka);
    ctl_ckpt_reply_key(FW_FP, "bob", "<user>hi<bot>yo", 15, kb);
    ctl_ckpt_reply_key(FW_FP, "alice", "<user>hi<bot>yo!", 16, kc);
    assert_string_not_equal(ka, kb);
    assert_string_not_equal(ka, kc);
    static const int32_t a[6] = {5, 6, 7, 8, 9, 10};
    turn t = run_turn(&f, "alice", FW_FP, a, 6, NULL, 0, 2, ka);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_true(ctl_ckpt_reply_tokens(f.ckpt, ka, &ids, &n));
    assert_int_equal(n, 8);
    assert_memory_equal(ids, a, sizeof(a));
    assert_int_equal(ids[6], t.gen[0]);
    assert_int_equal(ids[7], t.gen[1]);
    free(ids);
    assert_false(ctl_ckpt_reply_tokens(f.ckpt, kb, &ids, &n));
    assert_false(ctl_ckpt_reply_tokens(f.ckpt, kc, &ids, &n));

    (void)run_turn(&f, "bob", FW_FP, a, 6, NULL, 0, 1, NULL);
    assert_int_equal(owner_entries(&f, "alice"), 2);
    assert_int_equal(owner_entries(&f, "bob"), 2);
    size_t cleared = 0;
    ctl_ckpt_clear(f.ckpt, "alice", &cleared);
    assert_int_equal(cleared, 2);
    assert_int_equal(owner_entries(&f, "alice"), 0);
    assert_int_equal(owner_entries(&f, "bob"), 2);
    assert_false(ctl_ckpt_reply_tokens(f.ckpt, ka, &ids, &n));
    assert_int_equal(probe(&f, "alice", FW_FP, a, 6), 0);
    assert_int_equal(probe(&f, "bob", FW_FP, a, 6), 5);
    ctl_ckpt_clear(f.ckpt, NULL, &cleared);
    assert_int_equal(cleared, 2);
    fx_close(&f);
}

static void
test_warm_budget_lru(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 4 * FW_STATE_BYTES, 0); /* room for four checkpoints, no disk tier */
    static const int32_t t1[3] = {1, 1, 1}, t2[3] = {2, 2, 2}, t3[3] = {3, 3, 3};
    turn r1 = run_turn(&f, "u", FW_FP, t1, 3, NULL, 0, 1, NULL); /* prompt (2) + reply (4) */
    turn r2 = run_turn(&f, "u", FW_FP, t2, 3, NULL, 0, 1, NULL);
    assert_int_equal(owner_entries(&f, "u"), 4);
    /*
     * Least recently used so far: t1's prompt, t1's reply, t2's prompt, t2's
     * reply. A lookup touches t1's reply; t3's two entries then push out the
     * two least recently used: t1's prompt and t2's prompt.
     */
    int32_t f1[5] = {1, 1, 1, r1.gen[0], 7};
    assert_int_equal(probe(&f, "u", FW_FP, f1, 5), 4);
    (void)run_turn(&f, "u", FW_FP, t3, 3, NULL, 0, 1, NULL);
    ctl_ckpt_maintain(f.ckpt);
    ctl_ckpt_stats st;
    /* (the tier thread may be dropping a copy right now: such an entry is not counted) */
    uint64_t until = fw_now_ms() + 3000;
    for (;;) {
        assert_int_equal(ctl_ckpt_stats_get(f.ckpt, NULL, &st), WK_OK);
        if ((st.entries == 4 && st.warm_evictions == 2) || fw_now_ms() > until)
            break;
        ctl_ckpt_stats_fini(&st);
        usleep(5000);
    }
    if (st.entries != 4 || st.warm_evictions != 2)
        fail_msg("entries %llu, warm evictions %llu (want 4 and 2)", (unsigned long long)st.entries,
                 (unsigned long long)st.warm_evictions);
    assert_int_equal(st.warm_bytes, 4 * FW_STATE_BYTES);
    assert_int_equal(st.disk_entries, 0);
    ctl_ckpt_stats_fini(&st);
    assert_int_equal(probe(&f, "u", FW_FP, f1, 5), 4); /* t1's reply: kept (touched) */
    assert_int_equal(probe(&f, "u", FW_FP, t1, 3), 0); /* t1's prompt: evicted */
    assert_int_equal(probe(&f, "u", FW_FP, t2, 3), 0); /* t2's prompt: evicted */
    assert_int_equal(probe(&f, "u", FW_FP, t3, 3), 2); /* t3's prompt: kept */
    int32_t f2[5] = {2, 2, 2, r2.gen[0], 7};
    assert_int_equal(probe(&f, "u", FW_FP, f2, 5), 4); /* t2's reply: kept */
    /* the evicted copies were dropped from the worker's memory */
    assert_true(fw_count(&f.w, WKVM__KIND__HOST_DROP) >= 2);
    fx_close(&f);
}

static void
test_disk_tier(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 0, 1 << 20); /* no warm tier: checkpoints go to disk */
    static const int32_t a[8] = {3, 1, 4, 1, 5, 9, 2, 6};
    turn t1 = run_turn(&f, "u", FW_FP, a, 8, NULL, 0, 2, NULL);
    assert_int_equal(t1.hit_len, 0);
    assert_true(fw_count(&f.w, WKVM__KIND__SLOT_READ) >= 2);
    assert_int_equal(fw_count(&f.w, WKVM__KIND__HOST_PUT), 0);
    ctl_ckpt_stats st;
    assert_int_equal(ctl_ckpt_stats_get(f.ckpt, "u", &st), WK_OK);
    assert_int_equal(st.disk_entries, 2);
    assert_int_equal(st.warm_entries, 0);
    assert_true(st.disk_bytes > 0);
    ctl_ckpt_stats_fini(&st);
    /* a follow-up loads the reply's bytes from disk into its slot and is exact */
    int32_t b[13];
    memcpy(b, a, sizeof(a));
    b[8] = t1.gen[0];
    b[9] = t1.gen[1];
    b[10] = 7, b[11] = 7, b[12] = 7;
    uint32_t writes = fw_count(&f.w, WKVM__KIND__SLOT_WRITE);
    turn t2 = run_turn(&f, "u", FW_FP, b, 13, NULL, 0, 1, NULL);
    assert_int_equal(t2.hit_len, 10);
    assert_int_equal(t2.prefill, 3);
    assert_true(fw_count(&f.w, WKVM__KIND__SLOT_WRITE) > writes);
    fx_close(&f);
}

static void
test_disabled(void **state)
{
    (void)state;
    static const int32_t a[3] = {1, 2, 3};
    static ctl_ckpt_plan p;
    /* no module: an empty plan, no hooks */
    assert_int_equal(ctl_ckpt_plan_begin(NULL, &p, "u", FW_FP, NULL, 0, a, 3, NULL, 0, true, NULL),
                     WK_OK);
    assert_null(p.c);
    assert_null(p.reuse.load);
    assert_null(p.reuse.ckpt);
    ctl_ckpt_plan_end(&p);
    ctl_ckpt_plan_end(&p); /* idempotent */
    ctl_ckpt_config cfg = ctl_ckpt_get_config(NULL);
    assert_false(cfg.enabled);
    ctl_ckpt_stats st;
    assert_int_equal(ctl_ckpt_stats_get(NULL, NULL, &st), WK_OK);
    assert_int_equal(st.entries, 0);
    ctl_ckpt_stats_fini(&st);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_false(ctl_ckpt_reply_tokens(NULL, "k", &ids, &n));
}

static int g_spills;

static wk_err
count_spill(void *arg, const char *key, const void *bytes, size_t len, wk_diag *d)
{
    (void)arg;
    (void)key;
    (void)bytes;
    (void)len;
    (void)d;
    g_spills++;
    return WK_OK;
}

/*
 * One turn of owner whose slot parks as dirty entry `key` in ctl_vm, backed
 * by the turn's end-of-reply checkpoint when backed (else by nothing).
 */
static char g_reply[WK_SHA256_HEX_LEN]; /* the last park_turn()'s end-of-reply checkpoint */

static void
park_turn(fx *f, const char *owner, const int32_t *in, size_t n, const char *key, bool backed)
{
    static ctl_ckpt_plan p;
    wk_diag d = {{0}};
    assert_int_equal(
        ctl_ckpt_plan_begin(f->ckpt, &p, owner, FW_FP, NULL, 0, in, n, NULL, 0, true, &d), WK_OK);
    ctl_job_spec sp = {.tokens = in, .n_tokens = n, .sample = true, .fresh = true,
                       .reuse = &p.reuse};
    ctl_job *j = NULL;
    if (ctl_sched_submit(f->sched, &sp, &j, &d) != WK_OK)
        fail_msg("submit: %s", d.msg);
    ctl_job_event ev;
    assert_int_equal(ctl_job_next(j, 4000, &ev), WK_OK);
    assert_int_equal(ev.type, CTL_JOB_EV_TOKEN);
    int32_t gen = ev.token;
    ctl_job_stop(j, true);
    assert_int_equal(ctl_job_next(j, 4000, &ev), WK_OK);
    assert_int_equal(ev.type, CTL_JOB_EV_DONE);
    ctl_slot_ref slot;
    assert_int_equal(ctl_job_keep_slot(j, &slot), WK_OK);
    ctl_job_free(j);
    ctl_ckpt_plan_reply(&p, &slot, &gen, 1, NULL);
    assert_true(p.reply_ckpt[0] != '\0');
    assert_true(ctl_ckpt_live(f->ckpt, p.reply_ckpt));
    snprintf(g_reply, sizeof(g_reply), "%s", p.reply_ckpt);
    assert_int_equal(ctl_vm_put_backed(f->vm, key, &slot, true, backed ? p.reply_ckpt : NULL, &d),
                     WK_OK);
    ctl_ckpt_plan_end(&p);
}

static void
test_backed_session(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 1 << 20, 0);
    ctl_vm_set_spill(f.vm, count_spill, NULL);
    g_spills = 0;
    static const int32_t a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12},
                         c[6] = {13, 14, 15, 16, 17, 18};
    park_turn(&f, "alice", a, 6, "sess-a", true);
    park_turn(&f, "bob", b, 6, "sess-b", false);
    park_turn(&f, "carol", c, 6, "sess-c", true);
    uint32_t reads = fw_count(&f.w, WKVM__KIND__SLOT_READ);
    /* backed by a live checkpoint, sess-a and sess-c are clean; sess-b (no backing) is not */
    uint32_t clean = 0, dirty = 0;
    ctl_resid_hot_counts(f.resid, &clean, &dirty);
    assert_int_equal(clean, 2);
    assert_int_equal(dirty, 1);
    /* LRU among the clean ones: sess-a; its slot goes, nothing is read or spilled */
    assert_int_equal(ctl_vm_evict_one(f.vm), WK_OK);
    assert_false(ctl_vm_cached(f.vm, "sess-a"));
    assert_int_equal(g_spills, 0);
    assert_int_equal(fw_count(&f.w, WKVM__KIND__SLOT_READ), reads);
    /* sess-c's checkpoint is dropped: sess-c turns dirty at once */
    size_t cleared = 0;
    ctl_ckpt_clear(f.ckpt, "carol", &cleared);
    assert_true(cleared > 0);
    ctl_resid_hot_counts(f.resid, &clean, &dirty);
    assert_int_equal(clean, 0);
    assert_int_equal(dirty, 2);
    /* both dirty now: the LRU, sess-b, is spilled (its bytes read from the slot), then sess-c */
    assert_int_equal(ctl_vm_evict_one(f.vm), WK_OK);
    assert_false(ctl_vm_cached(f.vm, "sess-b"));
    assert_true(ctl_vm_cached(f.vm, "sess-c"));
    assert_int_equal(g_spills, 1);
    assert_true(fw_count(&f.w, WKVM__KIND__SLOT_READ) > reads);
    assert_int_equal(ctl_vm_evict_one(f.vm), WK_OK);
    assert_int_equal(g_spills, 2);
    assert_int_equal(ctl_vm_evict_one(f.vm), WK_ENOENT);
    /* the cleaner's idle spill and a flush are for durability: a backed entry is spilled there */
    park_turn(&f, "alice", a, 6, "sess-a", true);
    ctl_vm_flush(f.vm);
    assert_int_equal(g_spills, 3);
    /* the flush stopped the cleaner: an idle session is no longer spilled behind its back */
    assert_int_equal(ctl_vm_set_idle_spill(f.vm, 1, 0), WK_OK);
    park_turn(&f, "bob", b, 6, "sess-b", false);
    usleep(400 * 1000); /* (the cleaner looks every 200 ms at most) */
    assert_int_equal(g_spills, 3);
    assert_true(ctl_vm_cached(f.vm, "sess-b"));
    fx_close(&f);
}

/*
 * The warm budget evicting a session's backing checkpoint (no disk tier:
 * the copy is gone) turns the session dirty: its slot is no longer given up
 * without a spill.
 */
static void
test_backed_warm_budget(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 2 * FW_STATE_BYTES, 0); /* room for one turn's two checkpoints */
    static const int32_t a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12};
    park_turn(&f, "alice", a, 6, "sess-a", true);
    uint32_t clean = 0, dirty = 0;
    ctl_resid_hot_counts(f.resid, &clean, &dirty);
    assert_int_equal(clean, 1);
    park_turn(&f, "bob", b, 6, "sess-b", true); /* alice's two are the least recently used */
    uint64_t until = fw_now_ms() + 3000;
    do {
        ctl_ckpt_maintain(f.ckpt);
        ctl_resid_hot_counts(f.resid, &clean, &dirty);
    } while (dirty == 0 && fw_now_ms() < until && usleep(5000) == 0);
    assert_int_equal(clean, 1); /* sess-b: its checkpoint is warm */
    assert_int_equal(dirty, 1); /* sess-a */
    ctl_slot_ref slots[2];
    assert_int_equal(ctl_vm_slots_on(f.vm, "w0", slots, 2), 2);
    for (int i = 0; i < 2; i++) {
        bool session = false;
        uint64_t age = 0;
        assert_true(ctl_vm_describe(f.vm, &slots[i], &session, &age));
        assert_true(session);
    }
    fx_close(&f);
}

/*
 * What the scheduler's manager does under slot pressure: evicts a clean
 * entry under residence's lock (*v, WK_OK), or asks the cleaner for one
 * (WK_EBUSY).
 */
static wk_err
evict_or_ask_clean(ctl_resid_dir *dir, ctl_resid_hot *v)
{
    pthread_mutex_t *mu = ctl_resid_dir_mutex(dir);
    pthread_mutex_lock(mu);
    wk_err err = ctl_resid_hot_evict_clean_locked(dir, NULL, 0, v);
    if (err == WK_EBUSY)
        ctl_resid_hot_want_clean_locked(dir, NULL, 0);
    pthread_mutex_unlock(mu);
    return err;
}

/*
 * A cached state is dirty until its worker holds a warm copy; asked for room,
 * ctl_vm's cleaner makes that copy (one HOST_PUT) while the state keeps its
 * slot, and the scheduler's eviction then frees the slot with no I/O and the
 * warm copy stays.
 */
static void
test_cached_state_warm(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 1 << 20, 0);
    wk_diag d = {{0}};
    ctl_slot_ref slot;
    assert_int_equal(ctl_resid_slot_alloc(f.resid, "w0", &slot, NULL), WK_OK);
    assert_int_equal(ctl_vm_put(f.vm, "blob1", &slot, false, &d), WK_OK);
    uint32_t clean = 0, dirty = 0;
    ctl_resid_hot_counts(f.resid, &clean, &dirty);
    assert_int_equal(dirty, 1);
    uint32_t puts = fw_count(&f.w, WKVM__KIND__HOST_PUT);
    ctl_resid_hot v;
    assert_int_equal(evict_or_ask_clean(f.resid, &v), WK_EBUSY);
    uint64_t until = fw_now_ms() + 3000;
    do {
        ctl_resid_hot_counts(f.resid, &clean, &dirty);
    } while (clean == 0 && fw_now_ms() < until && usleep(2000) == 0);
    assert_int_equal(clean, 1);
    assert_int_equal(fw_count(&f.w, WKVM__KIND__HOST_PUT), puts + 1);
    assert_true(ctl_resid_slot_valid(f.resid, &slot)); /* cleaned in its slot */
    char w[65];
    assert_non_null(ctl_vm_warm_worker(f.vm, "blob1", w, sizeof(w)));
    assert_string_equal(w, "w0");
    assert_int_equal(evict_or_ask_clean(f.resid, &v), WK_OK);
    assert_string_equal(v.key, "blob1");
    assert_false(ctl_resid_slot_valid(f.resid, &slot));
    assert_int_equal(fw_count(&f.w, WKVM__KIND__HOST_PUT), puts + 1); /* no I/O */
    assert_non_null(ctl_vm_warm_worker(f.vm, "blob1", w, sizeof(w))); /* the copy stays */
    fx_close(&f);
}

/*
 * A worker that refuses the warm copy (its host memory full of copies the
 * index doesn't know: HOST_PUT answers ENOSPC and there is none to drop):
 * the cached state is not marked clean without a copy; the cleaner asked
 * for room frees its slot as an eviction did (its bytes are in the store),
 * so the request waiting for a slot is not stuck behind it.
 */
static void
test_cached_state_refused(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 1 << 20, 0);
    pthread_mutex_lock(&f.w.mu);
    for (int k = 0; k < FW_MAX_HOST; k++) {
        if (!f.w.host[k].used) {
            snprintf(f.w.host[k].key, sizeof(f.w.host[k].key), "other-%d", k);
            f.w.host[k].used = true;
        }
    }
    pthread_mutex_unlock(&f.w.mu);
    wk_diag d = {{0}};
    ctl_slot_ref slot;
    assert_int_equal(ctl_resid_slot_alloc(f.resid, "w0", &slot, NULL), WK_OK);
    assert_int_equal(ctl_vm_put(f.vm, "blob2", &slot, false, &d), WK_OK);
    uint32_t puts = fw_count(&f.w, WKVM__KIND__HOST_PUT);
    ctl_resid_hot v;
    assert_int_equal(evict_or_ask_clean(f.resid, &v), WK_EBUSY);
    uint64_t until = fw_now_ms() + 3000;
    uint32_t clean = 0, dirty = 0;
    bool was_clean = false;
    do {
        ctl_resid_hot_counts(f.resid, &clean, &dirty);
        was_clean = was_clean || clean > 0;
    } while (ctl_resid_slot_valid(f.resid, &slot) && fw_now_ms() < until && usleep(2000) == 0);
    assert_false(was_clean);
    assert_false(ctl_resid_slot_valid(f.resid, &slot)); /* freed by the cleaner */
    assert_false(ctl_vm_cached(f.vm, "blob2"));
    assert_true(fw_count(&f.w, WKVM__KIND__HOST_PUT) > puts); /* it was asked, and refused */
    char w[65];
    assert_null(ctl_vm_warm_worker(f.vm, "blob2", w, sizeof(w)));
    fx_close(&f);
}

/*
 * A checkpoint whose warm copy is being dropped (the budget demoting it, no
 * disk tier) is not live while the HOST_DROP is in flight: its sessions
 * were told it is gone before the drop, so a cleaner's verdict reached in
 * that window must not find it live and turn one clean with no copy.
 */
static void
test_dropping_not_live(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 3 * FW_STATE_BYTES, 0); /* room for three checkpoints */
    static const int32_t a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12};
    park_turn(&f, "alice", a, 6, "sess-a", true);
    char reply_a[WK_SHA256_HEX_LEN];
    snprintf(reply_a, sizeof(reply_a), "%s", g_reply);
    assert_int_equal(probe(&f, "alice", FW_FP, a, 6), 5); /* alice's reply: least recently used */
    /* bob's reply is the fourth: the budget demotes alice's reply; its HOST_DROP is held */
    fw_hold_drop(&f.w, true);
    park_turn(&f, "bob", b, 6, "sess-b", true);
    assert_true(fw_wait_drop_held(&f.w, 3000));
    assert_false(ctl_ckpt_live(f.ckpt, reply_a)); /* still warm, but being dropped */
    ctl_resid_hot e;
    ctl_slot_ref where;
    assert_true(ctl_resid_hot_find(f.resid, "sess-a", &where));
    assert_true(ctl_resid_hot_describe(f.resid, &where, &e, &(uint64_t){0}));
    assert_true(e.dirty);
    fw_hold_drop(&f.w, false);
    ctl_ckpt_stats st;
    uint64_t until = fw_now_ms() + 3000;
    for (;;) {
        assert_int_equal(ctl_ckpt_stats_get(f.ckpt, NULL, &st), WK_OK);
        if (st.warm_evictions >= 1 || fw_now_ms() > until)
            break;
        ctl_ckpt_stats_fini(&st);
        usleep(5000);
    }
    assert_true(st.warm_evictions >= 1);
    ctl_ckpt_stats_fini(&st);
    assert_false(ctl_ckpt_live(f.ckpt, reply_a)); /* gone (no disk tier) */
    assert_true(ctl_ckpt_live(f.ckpt, g_reply));  /* bob's stays */
    fx_close(&f);
}

/*
 * A row carries at most 8 checkpoints: with one every 2 tokens a 30-token
 * prompt's first row ends at its 8th (16), the rest (7 and the prompt's)
 * go in the second; all are taken, none by a HOST_PUT of its own.
 */
static void
test_snaps_eight_a_row(void **state)
{
    (void)state;
    static fx f;
    fx_interval = 2;
    fx_open(&f, 1 << 20, 0);
    fx_interval = 0;
    int32_t a[30];
    for (int i = 0; i < 30; i++)
        a[i] = 100 + i;
    turn t = run_turn(&f, "alice", FW_FP, a, 30, NULL, 0, 1, NULL);
    assert_int_equal(t.first, 16);
    assert_int_equal(t.prefill, 30);
    assert_int_equal(fw_snaps(&f.w), 15); /* 2..28 and 29 */
    assert_int_equal(fw_count(&f.w, WKVM__KIND__HOST_PUT), 1);
    assert_int_equal(owner_entries(&f, "alice"), 16);
    assert_int_equal(probe(&f, "alice", FW_FP, a, 30), 29);
    fx_close(&f);
}

/*
 * A copy the worker does not make (its table full: the bit clear) is not a
 * checkpoint, and the turn goes on exact; a job freed while its step (with
 * copies) is held returns at once, and the copies still land once the step
 * returns.
 */
static void
test_snaps_refused_and_freed(void **state)
{
    (void)state;
    static fx f;
    fx_open(&f, 1 << 20, 0);
    f.w.host_cap = 1;
    int32_t a[12];
    for (int i = 0; i < 12; i++)
        a[i] = 10 + i;
    const size_t bounds[1] = {4};
    turn t = run_turn(&f, "alice", FW_FP, a, 12, bounds, 1, 2, NULL);
    assert_int_equal(t.first, 12);
    assert_int_equal(fw_snaps(&f.w), 1); /* (the boundary's; the prompt's refused) */
    /* the refusal made room for the next copy (the reply's): it alone is left */
    assert_int_equal(owner_entries(&f, "alice"), 1);
    assert_int_equal(probe(&f, "alice", FW_FP, a, 12), 0);
    int32_t a2[15];
    memcpy(a2, a, sizeof(a));
    memcpy(a2 + 12, t.gen, 2 * sizeof(int32_t));
    a2[14] = 7;
    assert_int_equal(probe(&f, "alice", FW_FP, a2, 15), 14);
    f.w.host_cap = 0;

    int32_t b[20];
    for (int i = 0; i < 20; i++)
        b[i] = 300 + i;
    static ctl_ckpt_plan p;
    wk_diag d = {{0}};
    assert_int_equal(
        ctl_ckpt_plan_begin(f.ckpt, &p, "bob", FW_FP, NULL, 0, b, 20, bounds, 1, true, &d), WK_OK);
    fw_hold(&f.w, true);
    ctl_job_spec sp = {.tokens = b, .n_tokens = 20, .sample = true, .fresh = true,
                       .reuse = &p.reuse};
    ctl_job *j = NULL;
    assert_int_equal(ctl_sched_submit(f.sched, &sp, &j, &d), WK_OK);
    assert_true(fw_wait_held(&f.w, 4000));
    uint64_t t0 = fw_now_ms();
    ctl_job_free(j); /* (must not wait for the held step) */
    assert_true(fw_now_ms() - t0 < 1000);
    ctl_ckpt_plan_end(&p);
    memset(&p, 0xa5, sizeof(p)); /* (the step's end must not read the plan) */
    fw_hold(&f.w, false);
    uint64_t until = fw_now_ms() + 4000;
    while (owner_entries(&f, "bob") < 2 && fw_now_ms() < until)
        usleep(5000);
    assert_int_equal(owner_entries(&f, "bob"), 2); /* the boundary's and the prompt's */
    assert_int_equal(probe(&f, "bob", FW_FP, b, 20), 19);
    fx_close(&f);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_longest_prefix),
        cmocka_unit_test(test_longest_prefix_step_cuts),
        cmocka_unit_test(test_reply_records_and_clear),
        cmocka_unit_test(test_warm_budget_lru),
        cmocka_unit_test(test_disk_tier),
        cmocka_unit_test(test_disabled),
        cmocka_unit_test(test_backed_session),
        cmocka_unit_test(test_backed_warm_budget),
        cmocka_unit_test(test_cached_state_warm),
        cmocka_unit_test(test_cached_state_refused),
        cmocka_unit_test(test_dropping_not_live),
        cmocka_unit_test(test_snaps_eight_a_row),
        cmocka_unit_test(test_snaps_refused_and_freed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
