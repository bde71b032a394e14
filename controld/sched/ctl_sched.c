/*
 * ctl_sched: slot tables, the wait queue and one step loop per worker.
 *
 * Locking: one mutex (s->mu) guards workers, slots, jobs and queues: the
 * residence directory's (ctl_resid.h), which also guards every worker's slot
 * table, so that admission sees the queue and the tables at once. Step
 * RPCs run with the mutex released; a job taking part in a step is marked
 * in_flight so that consumer calls (stop, free) only flag it, and the loop
 * finishes what they asked once the step returns. s->cv wakes the step loops.
 *
 * The token path does not go through s->mu on the consumer's side: each job
 * has its own mutex (j->mu) guarding its event queue and what its token hook
 * publishes, and its own wake-up (a semaphore), posted (never a broadcast)
 * only when the consumer sleeps on it. Lock order: s->mu, then j->mu. A step
 * with hooked rows is applied in three parts: under s->mu the rows are
 * accounted and the sampled ones marked `deciding` (still in flight, so no
 * one frees them); without s->mu the hooks run (detokenize, stop strings,
 * publish under j->mu); under s->mu again the decisions are applied. The
 * step loop then steps again at once: no per-token round trip through the
 * consumer, and one s->cv broadcast per step, not per token.
 */
#define WK_LOG_MODULE "sched"
#include "ctl_sched.h"
#include "ctl_resid.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl_kv.h"
#include "wk_log.h"
#include "wk_time.h"
#include "wk_proto.h"

#define CTL_SCHED_MAX_WORKERS 64
#define CTL_JOB_EVQ 4

typedef struct ctl_job_rank ctl_job_rank;

typedef enum ctl_job_state {
    CTL_JOB_WAITING = 0, /* queued for a slot */
    CTL_JOB_RUNNING,     /* has a slot; feeding or about to sample */
    CTL_JOB_PAUSED,      /* a sampled token awaits the consumer */
    CTL_JOB_STOPPING,    /* feeding the last accepted token, then done */
    CTL_JOB_DONE,        /* finished; slot kept or freed */
    CTL_JOB_FAILED,      /* finished with an error */
} ctl_job_state;

typedef struct ctl_sworker ctl_sworker;

struct ctl_job {
    ctl_sched *s;               /* owner */
    int32_t *tokens;            /* everything to feed: input + accepted samples */
    size_t n_tokens;            /* entries in tokens */
    size_t cap;                 /* allocated entries */
    size_t computed;            /* tokens fed into the slot so far */
    size_t own_computed;        /* tokens computed by this job (usage) */
    size_t n_input;             /* input length at submit */
    bool sample;                /* sample after the input */
    uint64_t max_new;           /* most tokens it may sample (KV admission) */
    uint64_t ctx0;              /* tokens in the slot's state when it started */
    ctl_sample_spec params;     /* sampling parameters */
    uint64_t sample_index;      /* RNG position of the next sample */
    int32_t *gen;               /* accepted samples (penalties), shares tokens' tail */
    size_t n_gen;               /* accepted samples */
    int32_t pending;            /* last sampled token, not yet accepted */
    uint8_t *allowed;           /* the next sample's allowed-token bitset, NULL = any token */
    size_t n_allowed;           /* bytes in allowed */
    bool held;                  /* the slot belongs to the caller */
    bool fresh;                 /* reset the slot with the first chunk */
    ctl_slot_ref slot;          /* the slot, once admitted */
    char want_worker[65];       /* placement: only this worker, "" = any */
    char prefer_worker[65];     /* placement: this worker while it has a free slot, "" = none */
    ctl_job_state state;        /* lifecycle */
    size_t in_flight;           /* tokens of this job in the step being run, 0 = none */
    bool cancelled;             /* the consumer freed it */
    bool kept;                  /* the consumer keeps the slot */
    bool migrating;             /* left out of steps while its slot moves */
    uint64_t deadline_ms;       /* monotonic, 0 = none */
    uint64_t seq;               /* submit order */
    uint32_t bypassed;          /* younger jobs admitted on its worker while it waited */
    uint32_t unfed_steps;       /* running: steps in a row its prefill got no chunk */
    uint64_t submit_ms;         /* monotonic submit time */
    uint64_t last_tok_ms;       /* monotonic time of the last sampled token */
    ctl_sched_reuse reuse;      /* hooks (ckpt_at points at ckpt below) */
    size_t *ckpt;               /* checkpoint positions, owned */
    size_t next_ckpt;           /* first position not yet reached */
    bool load_pending;          /* admitted; the load hook has not run yet */
    bool in_hook;               /* a hook runs (the job is also marked in_flight) */
    ctl_job_token_fn on_token;  /* token hook, NULL = the consumer decides (TOKEN events) */
    void *on_token_arg;         /* its argument */
    bool deciding;              /* the hook runs without s->mu (in_flight is kept) */
    atomic_bool throttled;      /* the consumer is too far behind: left out of steps */
    /* Under mu (the job's own lock; taken after s->mu, never before it): */
    pthread_mutex_t mu;         /* the consumer's side */
    ctl_job_event evq[CTL_JOB_EVQ]; /* events for the consumer */
    unsigned ev_head;           /* next event to read */
    unsigned ev_len;            /* events queued */
    bool data;                  /* the hook published since the consumer last looked */
    bool sleeping;              /* the consumer waits on wake */
    bool wake_pending;          /* the step loop posts wake once its step's hooks ran */
    /*
     * Consumer wake-up, posted only when it sleeps (at most once a sleep).
     * A semaphore, not a condition variable: waking from a condition
     * variable retakes its mutex as contended, one more futex call per
     * token on unlock; the consumer sleeps here with j->mu released.
     */
    sem_t wake;
    ctl_job_waker_fn waker;     /* replaces the semaphore post when set (ctl_job_set_waker) */
    void *waker_arg;            /* its argument */
    struct ctl_job *next;       /* list link (s->jobs) */
};

struct ctl_sworker {
    char id[65];           /* worker id */
    uint64_t epoch;        /* connection start; a new process means new slots */
    ctl_resid t;           /* its slots: generations, jobs, context, KV pages (ctl_resid) */
    uint64_t stale_retry_ms; /* monotonic ms before which a failed SLOT_FREE is not retried */
    bool dead;               /* left the pool; the loop exits */
    uint32_t tail_steps;     /* tail-only steps in a row (ctl_sched_pick_locked) */
    pthread_t thr;         /* step loop */
    ctl_sched *s;          /* back pointer */
};

struct ctl_sched {
    ctl_sched_config cfg;                        /* limits */
    ctl_pool *pool;                              /* borrowed */
    ctl_metrics *metrics;                        /* borrowed, may be NULL */
    ctl_resid_dir *resid;                        /* borrowed: every worker's slot table */
    pthread_mutex_t *mu;                         /* resid's mutex: guards everything below */
    pthread_cond_t *cv;                          /* resid's: wakes step loops and slot waits */
    ctl_sworker *workers[CTL_SCHED_MAX_WORKERS]; /* live workers */
    ctl_job *jobs;                               /* all unfinished jobs, submit order */
    uint32_t n_waiting;                          /* jobs in CTL_JOB_WAITING */
    uint64_t next_seq;                           /* submit counter */
    atomic_bool stop;                            /* shut down */
    ctl_job_rank *rank;                          /* ctl_sched_order_locked()'s buffer */
    size_t rank_cap;                             /* its entries */
    pthread_t mgr;                               /* syncs workers with the pool */
    bool mgr_started;                            /* mgr joinable */
};

static void
ctl_observe(ctl_sched *s, const char *name, double v)
{
    if (s->metrics != NULL)
        ctl_metrics_observe(s->metrics, name, NULL, v);
}

/* Caller holds mu. */
static ctl_sworker *
ctl_sched_worker_locked(ctl_sched *s, const char *id)
{
    for (size_t i = 0; i < CTL_SCHED_MAX_WORKERS; i++) {
        ctl_sworker *w = s->workers[i];
        if (w != NULL && !w->dead && strcmp(w->id, id) == 0)
            return w;
    }
    return NULL;
}

/*
 * Marks slot k of w free. Its pages go back to the pool once the worker
 * freed them: a slot holding KV turns stale and keeps counting its pages
 * until the step loop's SLOT_FREE returns. Caller holds mu.
 */
static void
ctl_sworker_slot_clear(ctl_sworker *w, uint32_t k)
{
    ctl_resid_clear(&w->t, k);
    ctl_resid_dir_released_locked(w->s->resid); /* (wakes the step loops too: one cv) */
}

/*
 * A job's slot after it stopped feeding: its state holds ctx0 + computed
 * tokens, and it keeps exactly the pages those need (a reservation for
 * tokens never fed goes back). Caller holds mu.
 */
static void
ctl_job_settle_pages(ctl_sched *s, ctl_job *j)
{
    if (j->slot.worker[0] == '\0')
        return;
    ctl_sworker *w = ctl_sched_worker_locked(s, j->slot.worker);
    uint32_t k = j->slot.slot;
    if (w == NULL || !ctl_resid_live(&w->t, k, j->slot.gen))
        return;
    if (j->fresh)
        return; /* its reset never ran: the slot still holds what it held */
    w->t.ctx[k] = j->ctx0 + j->computed;
    w->t.pages[k] = ctl_kv_pages(&w->t.geom, w->t.ctx[k]);
}

static void
ctl_job_sync_fini(ctl_job *j)
{
    sem_destroy(&j->wake);
    pthread_mutex_destroy(&j->mu);
}

/*
 * Wakes the consumer that slept (saw j->sleeping): its waker, or its
 * semaphore. j->mu not held; the waker was set before the consumer armed it.
 * A job its consumer freed while it was in a step (cancelled, read under
 * s->mu or while the job's hook runs, when it cannot change) has no
 * consumer left: its waker's argument may be gone.
 */
static void
ctl_job_wake(ctl_job *j)
{
    if (j->waker != NULL) {
        if (!j->cancelled)
            j->waker(j->waker_arg);
        return;
    }
    sem_post(&j->wake);
}

/* Caller holds s->mu (and not j->mu). */
static void
ctl_job_post(ctl_job *j, const ctl_job_event *ev)
{
    pthread_mutex_lock(&j->mu);
    if (j->ev_len == CTL_JOB_EVQ) {
        /* Cannot happen with at most one token outstanding; keep the newest final event. */
        j->ev_head = (j->ev_head + 1) % CTL_JOB_EVQ;
        j->ev_len--;
    }
    j->evq[(j->ev_head + j->ev_len) % CTL_JOB_EVQ] = *ev;
    j->ev_len++;
    bool wake = j->sleeping;
    j->sleeping = false; /* (woken once: later posts need not signal again) */
    pthread_mutex_unlock(&j->mu);
    /* One consumer: never a broadcast; after the unlock, so that it does not wake into
     * a held mutex (j cannot go away: freeing it takes s->mu, held here). */
    if (wake)
        ctl_job_wake(j);
}

/* Releases the job's slot unless kept or held. Caller holds mu. */
static void
ctl_job_release_slot(ctl_sched *s, ctl_job *j)
{
    if (j->slot.worker[0] == '\0')
        return;
    ctl_sworker *w = ctl_sched_worker_locked(s, j->slot.worker);
    if (w != NULL && ctl_resid_live(&w->t, j->slot.slot, j->slot.gen)) {
        if (w->t.busy[j->slot.slot] == j)
            w->t.busy[j->slot.slot] = NULL;
        if (!j->held && !j->kept)
            ctl_sworker_slot_clear(w, j->slot.slot);
        else
            ctl_job_settle_pages(s, j);
    }
}

/* Ends a job with an error event. Caller holds mu. */
static void
ctl_job_fail(ctl_sched *s, ctl_job *j, wk_err err, const char *msg)
{
    if (j->state == CTL_JOB_DONE || j->state == CTL_JOB_FAILED)
        return;
    if (j->state == CTL_JOB_WAITING)
        s->n_waiting--;
    j->state = CTL_JOB_FAILED;
    ctl_job_release_slot(s, j);
    ctl_job_event ev = {.type = CTL_JOB_EV_ERROR, .err = err};
    snprintf(ev.message, sizeof(ev.message), "%s", msg);
    ctl_job_post(j, &ev);
}

/* Marks a job done. Caller holds mu. */
static void
ctl_job_done(ctl_sched *s, ctl_job *j)
{
    j->state = CTL_JOB_DONE;
    ctl_job_settle_pages(s, j);
    if (j->slot.worker[0] != '\0') {
        ctl_sworker *w = ctl_sched_worker_locked(s, j->slot.worker);
        if (w != NULL && w->t.busy[j->slot.slot] == j)
            w->t.busy[j->slot.slot] = NULL;
    }
    ctl_job_event ev = {.type = CTL_JOB_EV_DONE};
    ctl_job_post(j, &ev);
}

/* Unlinks and frees a job whose consumer is gone. Caller holds mu. */
static void
ctl_job_destroy_locked(ctl_sched *s, ctl_job *j)
{
    for (ctl_job **pp = &s->jobs; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    }
    if (j->state == CTL_JOB_WAITING)
        s->n_waiting--;
    if (j->state != CTL_JOB_DONE || !j->kept)
        ctl_job_release_slot(s, j);
    ctl_job_sync_fini(j);
    free(j->tokens);
    free(j->ckpt);
    free(j->allowed);
    free(j);
}

static wk_err
ctl_job_push_token(ctl_job *j, int32_t tok)
{
    if (j->n_tokens == j->cap) {
        size_t ncap = j->cap ? j->cap * 2 : 64;
        int32_t *nt = realloc(j->tokens, ncap * sizeof(*nt));
        if (nt == NULL)
            return WK_ENOMEM;
        j->tokens = nt;
        j->cap = ncap;
    }
    j->tokens[j->n_tokens++] = tok;
    return WK_OK;
}

/* KV pages job j needs on w at its end (0 for recurrent models). Caller holds mu. */
static uint32_t
ctl_job_pages_need(const ctl_sworker *w, const ctl_job *j)
{
    return ctl_kv_job_pages(&w->t.geom, j->ctx0, j->n_input, j->max_new);
}

/* A job's place in the admission and prefill order (ctl_sched_order_locked()). */
struct ctl_job_rank {
    ctl_job *job;       /* the job */
    ctl_sched_rank key; /* its class, input left and submit order */
};

ctl_sched_class
ctl_sched_rank_class(bool waiting, uint32_t bypassed, uint64_t waited_ms, size_t left,
                     uint32_t job_chunk)
{
    (void)waiting; /* (what bypassed counts differs, the bound does not) */
    if (bypassed >= CTL_SCHED_BYPASS_MAX)
        return CTL_SCHED_CLASS_STARVED;
    if (left <= job_chunk)
        return CTL_SCHED_CLASS_SHORT;
    if (waited_ms >= CTL_SCHED_AGING_MS)
        return CTL_SCHED_CLASS_AGED;
    return CTL_SCHED_CLASS_OTHER;
}

int
ctl_sched_rank_cmp(const ctl_sched_rank *x, const ctl_sched_rank *y)
{
    if (x->cls != y->cls)
        return x->cls < y->cls ? -1 : 1;
    bool by_left = x->cls == CTL_SCHED_CLASS_SHORT || x->cls == CTL_SCHED_CLASS_OTHER;
    if (by_left && x->left != y->left)
        return x->left < y->left ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int
ctl_job_rank_cmp(const void *a, const void *b)
{
    return ctl_sched_rank_cmp(&((const ctl_job_rank *)a)->key, &((const ctl_job_rank *)b)->key);
}

/*
 * The jobs in state (or, with state < 0, the running and stopping ones)
 * in the order they get slots and prefill budget (ctl_sched_rank_class()):
 * a job whose input left fits one prefill chunk goes before longer ones,
 * aged or not (a follow-up that resumed a checkpoint needs a few dozen
 * tokens: it neither waits for a slot behind other chats' long first
 * prompts nor, once admitted, for their prefill to finish); among the
 * longer ones, jobs that waited past CTL_SCHED_AGING_MS first in submit
 * order, then the others fewest left first; a waiting job that younger
 * ones overtook CTL_SCHED_BYPASS_MAX times goes before all (short jobs keep
 * no one from a slot for ever; a count, not a time, so that a loaded or
 * slow machine does not turn the order back into submit order). Returns
 * the count; *out is s->rank. Caller holds mu.
 */
static size_t
ctl_sched_order_locked(ctl_sched *s, int state, ctl_job_rank **out)
{
    uint64_t now = wk_mono_ms();
    size_t n = 0;
    for (ctl_job *j = s->jobs; j != NULL; j = j->next)
        n++;
    if (n > s->rank_cap) {
        ctl_job_rank *nr = realloc(s->rank, n * sizeof(*nr));
        if (nr == NULL) {
            *out = s->rank;
            return 0;
        }
        s->rank = nr;
        s->rank_cap = n;
    }
    size_t m = 0;
    for (ctl_job *j = s->jobs; j != NULL; j = j->next) {
        bool want = state >= 0 ? (int)j->state == state
                               : j->state == CTL_JOB_RUNNING || j->state == CTL_JOB_STOPPING;
        if (!want)
            continue;
        size_t from = j->state == CTL_JOB_WAITING && j->reuse.load != NULL ? j->reuse.resume_at
                                                                            : j->computed;
        size_t left = j->n_input > from ? j->n_input - from : 0;
        uint64_t waited = now > j->submit_ms ? now - j->submit_ms : 0;
        s->rank[m++] = (ctl_job_rank){
            .job = j,
            .key = {.cls = ctl_sched_rank_class(j->state == CTL_JOB_WAITING,
                                                j->state == CTL_JOB_WAITING ? j->bypassed
                                                                            : j->unfed_steps,
                                                waited, left, s->cfg.job_chunk),
                    .left = left,
                    .seq = j->seq}};
    }
    if (m > 1) /* (s->rank is NULL until a job exists: qsort must not see it) */
        qsort(s->rank, m, sizeof(*s->rank), ctl_job_rank_cmp);
    *out = s->rank;
    return m;
}

/*
 * j was just admitted onto w: every older job still waiting for a slot that
 * w could take was overtaken once more. Caller holds mu.
 */
static void
ctl_sched_count_bypass_locked(ctl_sched *s, const ctl_sworker *w, const ctl_job *j)
{
    for (ctl_job *k = s->jobs; k != NULL; k = k->next) {
        if (k->state == CTL_JOB_WAITING && !k->held && k->seq < j->seq &&
            (k->want_worker[0] == '\0' || strcmp(k->want_worker, w->id) == 0) &&
            k->bypassed < UINT32_MAX)
            k->bypassed++;
    }
}

/*
 * Long prefills one step can feed: the step's token budget over the per-job
 * chunk (at least 1). More running at once would only hold slots while
 * they wait for budget (the prefill order feeds the fewest-left first), so
 * a job whose input left exceeds one chunk is admitted only while fewer long
 * prefills than this run on the worker; the slots left over serve short
 * jobs (a follow-up or a regenerate that resumed a checkpoint) at once
 * instead of behind other chats' long first prompts.
 */
static uint32_t
ctl_sched_prefill_cap(const ctl_sched *s)
{
    uint32_t cap = s->cfg.step_tokens / s->cfg.job_chunk;
    return cap ? cap : 1;
}

/*
 * Running jobs on w with more than one prefill chunk of input left (a job
 * whose load hook has not run yet counts from where it resumes). Caller
 * holds mu.
 */
static bool
ctl_sched_long_prefill(const ctl_sched *s, const ctl_job *j)
{
    size_t from = j->load_pending ? j->reuse.resume_at : j->computed;
    return j->n_input > from && j->n_input - from > s->cfg.job_chunk;
}

static uint32_t
ctl_sched_long_prefills_locked(const ctl_sched *s, const ctl_sworker *w)
{
    uint32_t n = 0;
    for (const ctl_job *j = s->jobs; j != NULL; j = j->next)
        if (j->state == CTL_JOB_RUNNING && strcmp(j->slot.worker, w->id) == 0 &&
            ctl_sched_long_prefill(s, j))
            n++;
    return n;
}

/*
 * Admits waiting jobs onto w in ctl_sched_order_locked()'s order while a
 * slot and the KV pages the job needs at its end are free (the pages are
 * reserved until the job ends or its slot is freed): nobody behind the first
 * job that can't be admitted jumps ahead of it on this worker, except that
 * a long job past the worker's long-prefill cap (ctl_sched_prefill_cap())
 * lets short ones by. A job waiting only for pages on a slot it already
 * holds needs no free slot. Caller holds mu.
 */
static void
ctl_sched_admit_locked(ctl_sched *s, ctl_sworker *w)
{
    uint64_t now = wk_mono_ms();
    ctl_job_rank *rank = NULL;
    size_t n_rank = ctl_sched_order_locked(s, CTL_JOB_WAITING, &rank);
    /* long prefills running on w: counted once, when a long job first asks, then kept up to
     * date (UINT32_MAX: not counted yet) */
    uint32_t n_long = UINT32_MAX;
    for (size_t ri = 0; ri < n_rank; ri++) {
        ctl_job *j = rank[ri].job;
        if (j->state != CTL_JOB_WAITING)
            continue;
        if (j->held) {
            if (strcmp(j->slot.worker, w->id) != 0)
                continue;
            uint32_t k = j->slot.slot;
            if (!ctl_resid_live(&w->t, k, j->slot.gen)) {
                /* (its worker restarted under it: the slot is gone) */
                ctl_job_fail(s, j, WK_EUNAVAIL, "the slot's worker restarted");
                continue;
            }
            uint32_t need = ctl_job_pages_need(w, j);
            if (!ctl_kv_fits(&w->t.geom, ctl_resid_pages_used(&w->t), w->t.pages[k], need))
                return; /* FIFO on this worker */
            if (need > w->t.pages[k])
                w->t.pages[k] = need;
            j->state = CTL_JOB_RUNNING;
            if (n_long != UINT32_MAX)
                n_long += ctl_sched_long_prefill(s, j);
            s->n_waiting--;
            ctl_observe(s, "wkvm_queue_wait_seconds", (double)(now - j->submit_ms) / 1000.0);
            continue;
        }
        if (w->t.draining)
            return;
        if (j->want_worker[0] && strcmp(j->want_worker, w->id) != 0)
            continue;
        if (j->prefer_worker[0] && strcmp(j->prefer_worker, w->id) != 0) {
            /* Elsewhere only while the preferred worker has no free slot. */
            ctl_sworker *pw = ctl_sched_worker_locked(s, j->prefer_worker);
            if (pw != NULL && !pw->t.draining && ctl_resid_free_slot(&pw->t) != 0)
                continue;
        }
        uint32_t free_slot = ctl_resid_free_slot(&w->t);
        if (free_slot == 0)
            return; /* FIFO: nobody behind it may jump ahead on this worker */
        if (rank[ri].key.left > s->cfg.job_chunk && n_long == UINT32_MAX)
            n_long = ctl_sched_long_prefills_locked(s, w);
        if (rank[ri].key.left > s->cfg.job_chunk && n_long >= ctl_sched_prefill_cap(s))
            continue; /* waits for a prefill to end; short jobs behind it go on */
        uint32_t need = ctl_job_pages_need(w, j);
        if (!ctl_kv_fits(&w->t.geom, ctl_resid_pages_used(&w->t), 0, need))
            return; /* waits for pages (the manager evicts idle parked slots meanwhile) */
        ctl_resid_take(&w->t, free_slot, ctl_resid_dir_next_gen_locked(s->resid));
        w->t.pages[free_slot] = need; /* its reservation */
        w->t.busy[free_slot] = j;
        snprintf(j->slot.worker, sizeof(j->slot.worker), "%s", w->id);
        j->slot.slot = free_slot;
        j->slot.gen = w->t.gen[free_slot];
        j->fresh = true;
        j->load_pending = j->reuse.load != NULL;
        j->state = CTL_JOB_RUNNING;
        if (n_long != UINT32_MAX)
            n_long += ctl_sched_long_prefill(s, j);
        s->n_waiting--;
        ctl_sched_count_bypass_locked(s, w, j);
        ctl_observe(s, "wkvm_queue_wait_seconds", (double)(now - j->submit_ms) / 1000.0);
    }
}

typedef struct ctl_step_row {
    ctl_job *job;  /* the job */
    size_t take;   /* tokens fed by this row */
    bool sample;   /* a token is sampled */
    bool decide;   /* after the step: its token goes to the job's hook (ev) */
    ctl_job_decision decision; /* what the hook decided */
    ctl_job_event ev; /* the sampled token, for the hook */
    size_t n_snap;    /* checkpoint positions inside the row (reuse.snap_begin) */
    size_t snap_pos[WK_PROTO_ROW_SNAPS_MAX];                       /* their input positions */
    char snap_key[WK_PROTO_ROW_SNAPS_MAX][CTL_SCHED_SNAP_KEY_MAX]; /* "" = not copied */
    void *snap_tok[WK_PROTO_ROW_SNAPS_MAX];                        /* snap_begin's tokens */
} ctl_step_row;

/*
 * Adds job j's row to the step being picked on w when it belongs there:
 * decode rows (input fed) in the decode pass, prefill rows otherwise, at
 * most chunk tokens. Caller holds mu.
 */
static void
ctl_sched_pick_row_locked(ctl_sched *s, ctl_sworker *w, ctl_job *j, bool decode_pass,
                          size_t chunk, ctl_step_row *rows, size_t *n, uint32_t *budget,
                          uint64_t now)
{
    if ((j->state != CTL_JOB_RUNNING && j->state != CTL_JOB_STOPPING) || j->in_flight ||
        j->migrating || j->load_pending || strcmp(j->slot.worker, w->id) != 0 ||
        atomic_load_explicit(&j->throttled, memory_order_relaxed))
        return;
    if (j->deadline_ms && now > j->deadline_ms) {
        ctl_job_fail(s, j, WK_ETIMEDOUT, "request timed out");
        return;
    }
    bool decode = j->computed >= j->n_input;
    size_t gap = j->n_tokens - j->computed;
    if (decode_pass != decode || gap == 0)
        return;
    size_t take = gap;
    if (take > chunk)
        take = chunk;
    if (take > *budget)
        take = *budget;
    if (take > WK_PROTO_ROW_TOKENS_MAX)
        take = WK_PROTO_ROW_TOKENS_MAX;
    size_t ns = 0;
    if (j->reuse.snap_begin != NULL) {
        /* Checkpoints inside the row: the worker copies them (at most a row's worth). */
        for (size_t k = j->next_ckpt; k < j->reuse.n_ckpt && j->ckpt[k] <= j->computed + take;
             k++) {
            if (j->ckpt[k] <= j->computed)
                continue;
            if (ns == WK_PROTO_ROW_SNAPS_MAX) {
                take = rows[*n].snap_pos[ns - 1] - j->computed;
                break;
            }
            rows[*n].snap_pos[ns++] = j->ckpt[k];
        }
    } else if (j->next_ckpt < j->reuse.n_ckpt && j->ckpt[j->next_ckpt] > j->computed &&
               j->computed + take > j->ckpt[j->next_ckpt]) {
        /* A checkpoint position ends the chunk: the state there is copied. */
        take = j->ckpt[j->next_ckpt] - j->computed;
    }
    rows[*n].n_snap = ns;
    rows[*n].job = j;
    rows[*n].take = take;
    rows[*n].sample = j->sample && j->state == CTL_JOB_RUNNING && j->computed + take == j->n_tokens;
    j->in_flight = take;
    *budget -= (uint32_t)take;
    (*n)++;
}

/*
 * Prefill tails. With --checkpoint-step-cuts (or no warm tier) a turn's
 * prefill ends in short chunks (to its boundary checkpoint, to its prompt
 * checkpoint, then the last token, whose row samples the first reply
 * token), each a step of its own because the state is copied between them;
 * a long prompt fed in chunks ends in one short chunk either way. Beside
 * other requests' chunks and decode rows
 * each of those steps lasted as long as the longest chunk in it, so a first
 * token waited for about three long steps where its own work was one. A
 * prefill with at most CTL_SCHED_TAIL input tokens left (and at most a
 * quarter of the per-job chunk) is a tail; while
 * one can be fed on a worker, the step carries the tails alone (a few
 * tokens: milliseconds), at most CTL_SCHED_TAIL_STEPS such steps in a row,
 * so decode rows and long chunks wait a few milliseconds, never longer.
 */
#define CTL_SCHED_TAIL 64
#define CTL_SCHED_TAIL_STEPS 3

/* j is a prefill tail that w could feed now. Caller holds mu. */
static bool
ctl_sched_tail_locked(const ctl_sched *s, const ctl_sworker *w, const ctl_job *j)
{
    size_t tail = s->cfg.job_chunk / 4 < CTL_SCHED_TAIL ? s->cfg.job_chunk / 4 : CTL_SCHED_TAIL;
    return (j->state == CTL_JOB_RUNNING || j->state == CTL_JOB_STOPPING) && !j->in_flight &&
           !j->migrating && !j->load_pending && j->computed < j->n_input &&
           j->n_input - j->computed <= tail && strcmp(j->slot.worker, w->id) == 0 &&
           !atomic_load_explicit(&j->throttled, memory_order_relaxed);
}

/*
 * Picks the rows of the next step on w: the prefill tails alone when there
 * are any (above); else decode rows (their input is fed) first, in submit
 * order, then prefill chunks in ctl_sched_order_locked()'s order (jobs that
 * finish their prefill in this chunk first), under the step's token budget.
 *
 * When the first prefill in that order has no more input left than the
 * budget (a follow-up turn of a few hundred tokens), it is fed whole, past
 * the per-job chunk (still ending at its checkpoint positions with step
 * cuts), and no other
 * prefill joins that step: turns that arrive together are served one at a
 * time, fewest tokens first, instead of sharing steps, so each waits only
 * for the turns before it, not also for chunks of the ones after it. In the
 * eight-agent Responses loop (bench/responses_loop.py, 16 slots) this took
 * the median TTFT from 212-308 to 176-213 ms at the same wall and worker
 * CPU. A prefill skipped so counts as unfed; a prompt longer than any one
 * step left out CTL_SCHED_WHOLE_YIELD steps in a row takes the budget the
 * whole turn leaves (so a stream of short turns slows a long prompt, never
 * stops it; at CTL_SCHED_BYPASS_MAX it goes first). Caller holds mu.
 * Returns the row count.
 */
#define CTL_SCHED_WHOLE_YIELD 4
static size_t
ctl_sched_pick_locked(ctl_sched *s, ctl_sworker *w, ctl_step_row *rows, size_t cap)
{
    size_t n = 0;
    uint32_t budget = s->cfg.step_tokens;
    uint64_t now = wk_mono_ms();
    if (w->tail_steps < CTL_SCHED_TAIL_STEPS) {
        for (ctl_job *j = s->jobs; j != NULL && n < cap && budget > 0; j = j->next)
            if (ctl_sched_tail_locked(s, w, j))
                ctl_sched_pick_row_locked(s, w, j, false, s->cfg.job_chunk, rows, &n, &budget,
                                          now);
        if (n > 0) {
            w->tail_steps++;
            return n;
        }
    }
    w->tail_steps = 0;
    for (ctl_job *j = s->jobs; j != NULL && n < cap && budget > 0; j = j->next)
        ctl_sched_pick_row_locked(s, w, j, true, s->cfg.job_chunk, rows, &n, &budget, now);
    ctl_job_rank *rank = NULL;
    size_t n_rank = ctl_sched_order_locked(s, -1, &rank);
    bool fed = false, whole = false; /* a prefill row was added; it finishes the prompt */
    for (size_t i = 0; i < n_rank; i++) {
        ctl_job *j = rank[i].job;
        bool idle = j->in_flight == 0;
        size_t left = j->n_input > j->computed ? j->n_input - j->computed : 0;
        /* beside a whole turn only a prompt too long for any one step, after a few skipped */
        bool yield = left > s->cfg.step_tokens && j->unfed_steps >= CTL_SCHED_WHOLE_YIELD;
        if (n < cap && budget > 0 && (!whole || yield)) {
            bool fits = !fed && left > 0 && left <= budget;
            size_t before = n;
            ctl_sched_pick_row_locked(s, w, j, false, fits ? left : s->cfg.job_chunk, rows, &n,
                                      &budget, now);
            if (n > before) {
                whole = whole || fits; /* (a yielded long prompt does not open the step) */
                fed = true;
            }
        }
        /* a prefill left out of CTL_SCHED_BYPASS_MAX steps in a row goes first */
        if (idle && j->computed < j->n_input && strcmp(j->slot.worker, w->id) == 0)
            j->unfed_steps = j->in_flight ? 0 : j->unfed_steps + (j->unfed_steps < UINT32_MAX);
    }
    return n;
}

_Static_assert(CTL_SAMPLE_BIAS_MAX == WK_PROTO_LOGIT_BIAS_MAX, "logit_bias maximum");

/* Runs one step RPC for rows (mutex released by the caller). */
static wk_err
ctl_sched_run_step(ctl_sched *s, ctl_sworker *w, ctl_step_row *rows, size_t n, wk_msg **rep,
                   wk_diag *d)
{
    Wkvm__StepRow *pr = calloc(n, sizeof(*pr));
    Wkvm__StepRow **pp = calloc(n, sizeof(*pp));
    Wkvm__SampleParams *sp = calloc(n, sizeof(*sp));
    size_t nb = 0;
    for (size_t i = 0; i < n; i++)
        nb += rows[i].sample ? rows[i].job->params.n_bias : 0;
    Wkvm__LogitBias *lb = calloc(nb ? nb : 1, sizeof(*lb));
    Wkvm__LogitBias **lbp = calloc(nb ? nb : 1, sizeof(*lbp));
    size_t nsn = 0;
    for (size_t i = 0; i < n; i++)
        nsn += rows[i].n_snap;
    Wkvm__RowSnap *sn = calloc(nsn ? nsn : 1, sizeof(*sn));
    Wkvm__RowSnap **snp = calloc(nsn ? nsn : 1, sizeof(*snp));
    if (pr == NULL || pp == NULL || sp == NULL || lb == NULL || lbp == NULL || sn == NULL ||
        snp == NULL) {
        free(pr);
        free(pp);
        free(sp);
        free(lb);
        free(lbp);
        free(sn);
        free(snp);
        return WK_ENOMEM;
    }
    size_t isn = 0;
    size_t ib = 0;
    for (size_t i = 0; i < n; i++) {
        ctl_job *j = rows[i].job;
        wkvm__step_row__init(&pr[i]);
        pr[i].slot = j->slot.slot;
        pr[i].tokens = j->tokens + j->computed;
        pr[i].n_tokens = rows[i].take;
        pr[i].reset = j->fresh && j->computed == 0;
        pr[i].sample = rows[i].sample;
        /* (snaps[k] of the row is its k-th copied position: snaps_saved bit k) */
        pr[i].snaps = snp + isn;
        for (size_t k = 0; k < rows[i].n_snap; k++) {
            if (rows[i].snap_key[k][0] == '\0')
                continue;
            wkvm__row_snap__init(&sn[isn]);
            sn[isn].at = (uint32_t)(rows[i].snap_pos[k] - j->computed);
            sn[isn].host_key = rows[i].snap_key[k];
            snp[isn] = &sn[isn];
            isn++;
            pr[i].n_snaps++;
        }
        if (rows[i].sample) {
            wkvm__sample_params__init(&sp[i]);
            sp[i].temperature = j->params.temperature;
            sp[i].top_p = j->params.top_p;
            sp[i].top_k = j->params.top_k;
            sp[i].min_p = j->params.min_p;
            sp[i].seed = j->params.seed;
            sp[i].presence_penalty = j->params.presence_penalty;
            sp[i].frequency_penalty = j->params.frequency_penalty;
            sp[i].want_logprobs = j->params.logprobs;
            sp[i].top_logprobs = j->params.top_logprobs;
            sp[i].logit_bias = lbp + ib;
            sp[i].n_logit_bias = j->params.n_bias;
            for (uint32_t k = 0; k < j->params.n_bias; k++, ib++) {
                wkvm__logit_bias__init(&lb[ib]);
                lb[ib].token = j->params.bias[k].token;
                lb[ib].bias = j->params.bias[k].bias;
                lbp[ib] = &lb[ib];
            }
            if (j->allowed != NULL) {
                /* constrained rows only: every other row's step message is unchanged */
                sp[i].allowed_tokens.data = j->allowed;
                sp[i].allowed_tokens.len = j->n_allowed;
            }
            pr[i].params = &sp[i];
            pr[i].sample_index = j->sample_index;
            /*
             * The history only where a penalty reads it (wrk_sample): it grows
             * by a token per step, so sent always it made packing a step
             * O(tokens generated) per row.
             */
            size_t ng = j->params.presence_penalty != 0.0f || j->params.frequency_penalty != 0.0f
                            ? j->n_tokens - j->n_input
                            : 0;
            if (ng > WK_PROTO_ROW_TOKENS_MAX)
                ng = WK_PROTO_ROW_TOKENS_MAX;
            pr[i].penalty_tokens = j->tokens + j->n_tokens - ng;
            pr[i].n_penalty_tokens = ng;
        }
        pp[i] = &pr[i];
    }
    Wkvm__Step st = WKVM__STEP__INIT;
    st.rows = pp;
    st.n_rows = n;
    wk_msg req = WKVM__ENVELOPE__INIT;
    req.kind = WKVM__KIND__STEP;
    req.payload_case = WKVM__ENVELOPE__PAYLOAD_STEP;
    req.step = &st;
    wk_err err = ctl_pool_call(s->pool, w->id, &req, s->cfg.step_timeout_ms, rep, d);
    free(pr);
    free(pp);
    free(sp);
    free(lb);
    free(lbp);
    free(sn);
    free(snp);
    return err;
}

/*
 * The in-step checkpoints of a step's rows, before it (keys from snap_begin,
 * the rows' jobs in_hook: ctl_job_free() waits, the hook uses its argument)
 * and after it (snap_end with what the worker made of each; the jobs only in
 * flight: a freed one is destroyed after the step). No lock held.
 */
static void
ctl_sched_snaps_begin(ctl_step_row *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ctl_job *j = rows[i].job;
        for (size_t k = 0; k < rows[i].n_snap; k++) {
            rows[i].snap_tok[k] = NULL;
            if (!j->reuse.snap_begin(j->reuse.arg, &j->slot, rows[i].snap_pos[k],
                                     rows[i].snap_key[k], &rows[i].snap_tok[k]))
                rows[i].snap_key[k][0] = '\0';
        }
    }
}

static void
ctl_sched_snaps_end(ctl_step_row *rows, size_t n, wk_err err, const wk_msg *rep)
{
    for (size_t i = 0; i < n; i++) {
        ctl_job *j = rows[i].job;
        const Wkvm__RowResult *rr = NULL;
        if (err == WK_OK && rep != NULL && i < rep->step_result->n_rows &&
            rep->step_result->rows[i]->slot == j->slot.slot)
            rr = rep->step_result->rows[i];
        unsigned bit = 0;
        for (size_t k = 0; k < rows[i].n_snap; k++) {
            if (rows[i].snap_key[k][0] == '\0')
                continue;
            /* a clear bit of a step that ran: the worker's host cache refused the copy */
            wk_err r = rr == NULL                      ? (err != WK_OK ? err : WK_EPROTO)
                       : (rr->snaps_saved >> bit) & 1u ? WK_OK
                                                       : WK_ENOSPC;
            bit++;
            j->reuse.snap_end(j->reuse.snap_arg, rows[i].snap_tok[k], &j->slot, r);
        }
    }
}

/*
 * Applies a step's outcome. Rows whose token goes to the job's hook are left
 * in flight and marked decide (their jobs `deciding`); the caller runs the
 * hooks without mu, then ctl_sched_decided_locked(). Returns true when there
 * is such a row. Caller holds mu.
 */
static bool
ctl_sched_apply_locked(ctl_sched *s, ctl_sworker *w, ctl_step_row *rows, size_t n, wk_err err,
                       const wk_msg *rep, const char *errmsg)
{
    uint64_t now = wk_mono_ms();
    bool any_decide = false;
    for (size_t i = 0; i < n; i++) {
        ctl_job *j = rows[i].job;
        size_t take = j->in_flight;
        j->in_flight = 0;
        rows[i].decide = false;
        if (err != WK_OK) {
            ctl_job_fail(s, j, err, errmsg);
        } else {
            if (j->fresh && j->computed == 0) {
                /* The reset ran: the slot holds nothing but this job's reservation. */
                j->fresh = false;
                uint32_t k = j->slot.slot;
                if (ctl_resid_live(&w->t, k, j->slot.gen)) {
                    w->t.ctx[k] = 0;
                    w->t.pages[k] = ctl_job_pages_need(w, j);
                }
            }
            j->computed += take;
            j->own_computed += take;
            /* (in-step checkpoints: the positions this row passed were taken in it) */
            while (j->reuse.snap_begin != NULL && j->next_ckpt < j->reuse.n_ckpt &&
                   j->ckpt[j->next_ckpt] <= j->computed)
                j->next_ckpt++;
            const Wkvm__RowResult *rr = NULL;
            if (rep != NULL && i < rep->step_result->n_rows)
                rr = rep->step_result->rows[i];
            if (rows[i].sample && j->sample &&
                (rr == NULL || !rr->sampled || rr->slot != j->slot.slot)) {
                ctl_job_fail(s, j, WK_EPROTO, "worker returned no token for a sampled row");
            } else if (rows[i].sample && j->sample && j->state == CTL_JOB_RUNNING) {
                ctl_job_event ev = {.type = CTL_JOB_EV_TOKEN, .token = rr->token,
                                    .logprob = rr->logprob};
                ev.n_top = rr->n_top < 20 ? (uint32_t)rr->n_top : 20;
                for (uint32_t k = 0; k < ev.n_top; k++) {
                    ev.top_token[k] = rr->top[k]->token;
                    ev.top_logprob[k] = rr->top[k]->logprob;
                }
                if (j->sample_index == 0 || j->last_tok_ms == 0)
                    ctl_observe(s, "wkvm_time_to_first_token_seconds",
                                (double)(now - j->submit_ms) / 1000.0);
                else
                    ctl_observe(s, "wkvm_time_per_output_token_seconds",
                                (double)(now - j->last_tok_ms) / 1000.0);
                j->last_tok_ms = now;
                j->sample_index++;
                j->pending = rr->token;
                j->state = CTL_JOB_PAUSED;
                if (j->on_token != NULL && !j->cancelled) {
                    /* decided by the hook after mu is dropped; nobody frees j meanwhile */
                    rows[i].decide = true;
                    rows[i].ev = ev;
                    j->in_flight = 1;
                    j->deciding = true;
                    any_decide = true;
                } else {
                    ctl_job_post(j, &ev);
                }
            } else if (j->computed == j->n_tokens &&
                       (j->state == CTL_JOB_STOPPING || !j->sample)) {
                ctl_job_done(s, j);
            }
        }
        if (j->cancelled && !rows[i].decide)
            ctl_job_destroy_locked(s, j);
    }
    pthread_cond_broadcast(s->cv);
    return any_decide;
}

/* Carries out decision d on a job paused on a sampled token. Caller holds mu. */
static void
ctl_job_decide_locked(ctl_sched *s, ctl_job *j, ctl_job_decision d)
{
    if (j->state != CTL_JOB_PAUSED)
        return;
    if (d == CTL_JOB_CONTINUE) {
        if (ctl_job_push_token(j, j->pending) != WK_OK)
            ctl_job_fail(s, j, WK_ENOMEM, "out of memory");
        else
            j->state = CTL_JOB_RUNNING;
    } else if (d == CTL_JOB_STOP_FEED && ctl_job_push_token(j, j->pending) == WK_OK) {
        j->state = CTL_JOB_STOPPING;
    } else {
        ctl_job_done(s, j);
    }
}

/*
 * Runs the hooks of the rows ctl_sched_apply_locked() marked decide, with mu
 * released, then applies their decisions. Caller holds mu; dropped and retaken.
 */
static _Thread_local bool ctl_sched_in_decide; /* this thread runs a step's hooks */

static void
ctl_sched_decide(ctl_sched *s, ctl_step_row *rows, size_t n)
{
    pthread_mutex_unlock(s->mu);
    ctl_sched_in_decide = true;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].decide) {
            ctl_job *j = rows[i].job;
            rows[i].decision = j->on_token(j->on_token_arg, j, &rows[i].ev);
        }
    }
    ctl_sched_in_decide = false;
    /*
     * The consumers that slept are woken only now, all hooks of the step
     * done: a woken thread does not preempt the loop in the middle of the
     * step (on few cores it would), and never wakes into a held lock.
     */
    for (size_t i = 0; i < n; i++) {
        ctl_job *j = rows[i].job;
        if (rows[i].decide && j->wake_pending) {
            j->wake_pending = false;
            ctl_job_wake(j);
        }
    }
    pthread_mutex_lock(s->mu);
    for (size_t i = 0; i < n; i++) {
        if (!rows[i].decide)
            continue;
        ctl_job *j = rows[i].job;
        j->in_flight = 0;
        j->deciding = false;
        if (j->cancelled)
            ctl_job_destroy_locked(s, j);
        else
            ctl_job_decide_locked(s, j, rows[i].decision);
    }
    pthread_cond_broadcast(s->cv); /* (ctl_job_free waits for deciding jobs) */
}

/*
 * Runs job j's hook fn (mu dropped and retaken): j is marked in flight so no
 * step picks it and ctl_job_free() waits. Returns false when the consumer
 * freed j meanwhile (it is destroyed here then). Caller holds mu.
 */
static bool
ctl_job_hook_locked(ctl_sched *s, ctl_job *j, bool load, size_t pos, wk_err *err)
{
    ctl_slot_ref slot = j->slot;
    j->in_flight = 1;
    j->in_hook = true;
    pthread_mutex_unlock(s->mu);
    wk_diag d = {{0}};
    if (load)
        *err = j->reuse.load(j->reuse.arg, &slot, &d);
    else
        j->reuse.ckpt(j->reuse.arg, &slot, pos);
    pthread_mutex_lock(s->mu);
    j->in_flight = 0;
    j->in_hook = false;
    pthread_cond_broadcast(s->cv);
    if (j->cancelled) {
        ctl_job_destroy_locked(s, j);
        return false;
    }
    return true;
}

/*
 * Runs the pending hooks of the jobs on w: loads of freshly admitted jobs,
 * then checkpoints whose position a job's state just reached. Returns after
 * one hook (the job list may have changed); the loop calls it until it
 * finds nothing. Caller holds mu; dropped and retaken.
 */
static bool
ctl_sched_hooks_locked(ctl_sched *s, ctl_sworker *w)
{
    for (ctl_job *j = s->jobs; j != NULL; j = j->next) {
        if (j->in_flight || strcmp(j->slot.worker, w->id) != 0 ||
            (j->state != CTL_JOB_RUNNING && j->state != CTL_JOB_STOPPING &&
             j->state != CTL_JOB_PAUSED))
            continue;
        if (j->load_pending) {
            j->load_pending = false;
            wk_err err = WK_EINVAL;
            if (!ctl_job_hook_locked(s, j, true, 0, &err))
                return true;
            uint32_t k = j->slot.slot;
            bool live = ctl_resid_live(&w->t, k, j->slot.gen);
            if (err == WK_OK && live && j->state == CTL_JOB_RUNNING) {
                j->computed = j->reuse.resume_at;
                j->fresh = false;
                w->t.ctx[k] = j->reuse.resume_at;
                while (j->next_ckpt < j->reuse.n_ckpt && j->ckpt[j->next_ckpt] <= j->computed)
                    j->next_ckpt++;
            }
            return true;
        }
        if (j->reuse.ckpt != NULL && j->next_ckpt < j->reuse.n_ckpt &&
            j->computed == j->ckpt[j->next_ckpt]) {
            size_t pos = j->ckpt[j->next_ckpt++];
            wk_err unused = WK_OK;
            (void)ctl_job_hook_locked(s, j, false, pos, &unused);
            return true;
        }
    }
    return false;
}

/* True when a job on w waits for its consumer's decision. Caller holds mu. */
static bool
ctl_sched_paused_locked(ctl_sched *s, ctl_sworker *w)
{
    for (ctl_job *j = s->jobs; j != NULL; j = j->next) {
        if (j->state == CTL_JOB_PAUSED && strcmp(j->slot.worker, w->id) == 0)
            return true;
    }
    return false;
}

/*
 * Hybrid models: slots freed here still hold KV pages on the worker until
 * reset; SLOT_FREE them (this loop is the worker's only stepper, so no step
 * runs meanwhile) and make them allocatable again. Drops and retakes mu.
 */
static void
ctl_sched_free_stale_locked(ctl_sched *s, ctl_sworker *w)
{
    if (wk_mono_ms() < w->stale_retry_ms)
        return;
    for (uint32_t k = 1; k <= w->t.n && !w->dead; k++) {
        if (!w->t.stale[k] || w->t.gen[k] != 0)
            continue;
        pthread_mutex_unlock(s->mu);
        Wkvm__SlotFree f = WKVM__SLOT_FREE__INIT;
        f.slot = k;
        wk_msg req = WKVM__ENVELOPE__INIT;
        req.kind = WKVM__KIND__SLOT_FREE;
        req.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_FREE;
        req.slot_free = &f;
        wk_msg *rep = NULL;
        wk_diag d = {{0}};
        wk_err err = ctl_pool_call(s->pool, w->id, &req, s->cfg.step_timeout_ms, &rep, &d);
        wk_proto_free(rep);
        pthread_mutex_lock(s->mu);
        if (err != WK_OK) {
            /* The worker still holds the pages: keep them counted, retry in a second. */
            wk_log_warn("slot free failed worker=%s slot=%u: %s", w->id, k, d.msg);
            w->stale_retry_ms = wk_mono_ms() + 1000;
            return;
        }
        ctl_resid_unstale(&w->t, k);
        ctl_resid_dir_released_locked(s->resid);
    }
}

static void *
ctl_sched_worker_main(void *arg)
{
    ctl_sworker *w = arg;
    ctl_sched *s = w->s;
    size_t cap = s->cfg.max_rows;
    pthread_setname_np(pthread_self(), "wkc-step"); /* wkvm_controller_cpu_seconds_total */
    ctl_step_row *rows = calloc(cap, sizeof(*rows));
    pthread_mutex_lock(s->mu);
    while (!atomic_load(&s->stop) && !w->dead && rows != NULL) {
        ctl_sched_free_stale_locked(s, w);
        ctl_sched_admit_locked(s, w);
        if (ctl_sched_hooks_locked(s, w))
            continue;
        size_t n = ctl_sched_pick_locked(s, w, rows, cap);
        if (n == 0) {
            struct timespec until;
            wk_deadline_after_ms(&until, 100);
            pthread_cond_timedwait(s->cv, s->mu, &until);
            continue;
        }
        bool snaps = false;
        for (size_t i = 0; i < n; i++) {
            if (rows[i].n_snap > 0) {
                rows[i].job->in_hook = true; /* (snap_begin uses its argument) */
                snaps = true;
            }
        }
        pthread_mutex_unlock(s->mu);
        wk_msg *rep = NULL;
        wk_diag d = {{0}};
        struct timespec t0, t1;
        if (snaps) {
            ctl_sched_snaps_begin(rows, n);
            pthread_mutex_lock(s->mu);
            for (size_t i = 0; i < n; i++)
                if (rows[i].n_snap > 0)
                    rows[i].job->in_hook = false; /* (the step itself is not waited for) */
            pthread_cond_broadcast(s->cv);
            pthread_mutex_unlock(s->mu);
        }
        clock_gettime(CLOCK_MONOTONIC, &t0);
        wk_err err = ctl_sched_run_step(s, w, rows, n, &rep, &d);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (snaps)
            ctl_sched_snaps_end(rows, n, err, rep);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        if (err == WK_OK) {
            ctl_observe(s, "wkvm_step_seconds", secs);
            if (s->metrics != NULL && rep->step_result->step_us > 0)
                ctl_metrics_observe(s->metrics, "wkvm_step_backend_seconds", NULL,
                                    (double)rep->step_result->step_us * 1e-6);
        } else {
            wk_log_warn("step failed worker=%s rows=%zu: %s", w->id, n, d.msg);
        }
        if (err == WK_ENOENT || err == WK_EUNAVAIL) {
            /* The worker's connection closed under the step. */
            err = WK_EUNAVAIL;
            snprintf(d.msg, sizeof(d.msg), "worker %s left during the request", w->id);
        }
        pthread_mutex_lock(s->mu);
        bool decide = ctl_sched_apply_locked(s, w, rows, n, err, rep, d.msg);
        wk_proto_free(rep);
        if (decide)
            ctl_sched_decide(s, rows, n);
        /*
         * The rows that just sampled wait for their consumers' decision
         * (continue or stop), which comes within microseconds. Stepping at
         * once would leave them out and split the decode batch in two
         * alternating halves, so wait a moment for them first.
         */
        struct timespec until;
        wk_deadline_after_ms(&until, 2);
        while (!atomic_load(&s->stop) && ctl_sched_paused_locked(s, w) &&
               pthread_cond_timedwait(s->cv, s->mu, &until) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(s->mu);
    free(rows);
    return NULL;
}

/*
 * True when job j runs (or waits, on a held slot) on a slot of this very
 * worker process (generations are global, so a process that replaced w
 * under the same id never matches). Caller holds mu.
 */
static bool
ctl_job_on_locked(const ctl_job *j, const ctl_sworker *w)
{
    uint32_t k = j->slot.slot;
    return strcmp(j->slot.worker, w->id) == 0 && ctl_resid_live(&w->t, k, j->slot.gen);
}

/*
 * Fails every job on w (waiting held-slot jobs included) and marks it dead.
 * Caller holds mu.
 */
static void
ctl_sched_worker_gone_locked(ctl_sched *s, ctl_sworker *w, const char *why)
{
    w->dead = true;
    ctl_resid_dir_detach_locked(s->resid, &w->t); /* its handles are no longer valid */
    for (ctl_job *j = s->jobs; j != NULL; j = j->next) {
        if (ctl_job_on_locked(j, w) && !j->in_flight)
            ctl_job_fail(s, j, WK_EUNAVAIL, why);
    }
    pthread_cond_broadcast(s->cv);
}

static void
ctl_sworker_free(ctl_sworker *w)
{
    if (w == NULL)
        return;
    ctl_resid_fini(&w->t);
    free(w);
}

static bool ctl_sched_free_slot_locked(ctl_sched *s, const char *want);
static uint32_t ctl_sched_slots_wanted_locked(ctl_sched *s);

/* Stale slots on their way back on live workers not waiting to retry a SLOT_FREE. */
static uint32_t
ctl_sched_slots_coming_locked(ctl_sched *s)
{
    uint64_t now = wk_mono_ms();
    uint32_t n = 0;
    for (size_t i = 0; i < CTL_SCHED_MAX_WORKERS; i++) {
        const ctl_sworker *w = s->workers[i];
        if (w != NULL && !w->dead && !w->t.draining && now >= w->stale_retry_ms)
            n += ctl_resid_slot_coming_locked(s->resid, w->id);
    }
    return n;
}

/*
 * Pages job j still lacks on w (holding `held` of them already): what the
 * pool can't give it now, counting the pages of stale slots (on their way
 * back) as free. 0 when it fits or will once those come back. Caller holds mu.
 */
static uint32_t
ctl_sched_pages_missing_locked(const ctl_sworker *w, const ctl_job *j, uint32_t held)
{
    if (!ctl_kv_hybrid(&w->t.geom))
        return 0;
    uint64_t need = ctl_job_pages_need(w, j);
    uint64_t used = ctl_resid_pages_used(&w->t);
    for (uint32_t k = 1; k <= w->t.n; k++)
        used -= w->t.gen[k] == 0 && w->t.stale[k] ? w->t.pages[k] : 0;
    used -= held <= used ? held : used;
    if (need <= held || used + (need - held) <= w->t.geom.pages_total)
        return 0;
    uint64_t miss = used + (need - held) - w->t.geom.pages_total;
    return miss > UINT32_MAX ? UINT32_MAX : (uint32_t)miss;
}

/*
 * Page pressure: when the first waiting job can't get its KV pages on any
 * worker it may run on, names the worker where it lacks the fewest
 * (want, 65 bytes) and how many it lacks (evicting idle parked slots there
 * can help; elsewhere it can't). False when it isn't starved for pages.
 * Caller holds mu.
 */
static bool
ctl_sched_page_starved_locked(ctl_sched *s, char *want, uint32_t *missing)
{
    ctl_job *j = s->jobs;
    while (j != NULL && j->state != CTL_JOB_WAITING)
        j = j->next;
    if (j == NULL)
        return false;
    uint32_t best = 0;
    for (size_t i = 0; i < CTL_SCHED_MAX_WORKERS; i++) {
        ctl_sworker *w = s->workers[i];
        if (w == NULL || w->dead)
            continue;
        uint32_t miss;
        if (j->held) {
            if (strcmp(j->slot.worker, w->id) != 0)
                continue;
            uint32_t k = j->slot.slot;
            if (!ctl_resid_live(&w->t, k, j->slot.gen))
                return false; /* (admission fails it) */
            miss = ctl_sched_pages_missing_locked(w, j, w->t.pages[k]);
        } else {
            if (w->t.draining || (j->want_worker[0] && strcmp(j->want_worker, w->id) != 0))
                continue;
            miss = ctl_sched_pages_missing_locked(w, j, 0);
        }
        if (miss == 0)
            return false;
        if (best == 0 || miss < best) {
            best = miss;
            snprintf(want, 65, "%s", w->id);
        }
    }
    if (best == 0)
        return false;
    *missing = best;
    return true;
}

/*
 * True when a new job (pinned to want, or any worker when "") has live
 * workers to run on and every one of them drains. Caller holds mu.
 */
static bool
ctl_sched_only_draining_locked(ctl_sched *s, const char *want)
{
    size_t live = 0, draining = 0;
    for (size_t i = 0; i < CTL_SCHED_MAX_WORKERS; i++) {
        ctl_sworker *w = s->workers[i];
        if (w == NULL || w->dead || (want[0] && strcmp(want, w->id) != 0))
            continue;
        live++;
        draining += w->t.draining;
    }
    return live > 0 && draining == live;
}

/*
 * The largest KV pool of the live workers job j could run on, and whether
 * any of them is hybrid. Caller holds mu.
 */
static bool
ctl_sched_kv_pool_max_locked(ctl_sched *s, const char *want, ctl_kv_geom *out)
{
    bool hybrid = false;
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < CTL_SCHED_MAX_WORKERS; i++) {
        ctl_sworker *w = s->workers[i];
        if (w == NULL || w->dead || (want[0] && strcmp(want, w->id) != 0))
            continue;
        if (!ctl_kv_hybrid(&w->t.geom))
            return false; /* a worker without KV limits can take anything */
        hybrid = true;
        if (w->t.geom.pages_total >= out->pages_total)
            *out = w->t.geom;
    }
    return hybrid;
}

static void *
ctl_sched_mgr_main(void *arg)
{
    ctl_sched *s = arg;
    pthread_setname_np(pthread_self(), "wkc-sched");
    ctl_worker_view *views = calloc(CTL_SCHED_MAX_WORKERS, sizeof(*views));
    while (views != NULL && !atomic_load(&s->stop)) {
        size_t n = ctl_pool_list(s->pool, views, CTL_SCHED_MAX_WORKERS);
        if (n > CTL_SCHED_MAX_WORKERS)
            n = CTL_SCHED_MAX_WORKERS;
        ctl_sworker *reap[CTL_SCHED_MAX_WORKERS];
        size_t nreap = 0;
        pthread_mutex_lock(s->mu);
        /* Workers that left, or came back as a new process. */
        for (size_t i = 0; i < CTL_SCHED_MAX_WORKERS; i++) {
            ctl_sworker *w = s->workers[i];
            if (w == NULL)
                continue;
            bool present = false;
            for (size_t k = 0; k < n; k++) {
                if (strcmp(views[k].id, w->id) == 0 && views[k].connected_ms == w->epoch &&
                    views[k].state != CTL_WORKER_STATE_FAILED)
                    present = true;
            }
            if (!present && !w->dead) {
                char why[160];
                snprintf(why, sizeof(why), "worker %s left during the request", w->id);
                wk_log_warn("worker gone worker=%s; failing its requests", w->id);
                ctl_sched_worker_gone_locked(s, w, why);
            }
            if (w->dead) {
                reap[nreap++] = w;
                s->workers[i] = NULL;
            }
        }
        /* New ready workers. */
        for (size_t k = 0; k < n; k++) {
            const ctl_worker_view *v = &views[k];
            if (v->state != CTL_WORKER_STATE_READY || !v->model_loaded || v->slots_total == 0)
                continue;
            bool known = false;
            size_t hole = CTL_SCHED_MAX_WORKERS;
            for (size_t i = 0; i < CTL_SCHED_MAX_WORKERS; i++) {
                if (s->workers[i] != NULL && strcmp(s->workers[i]->id, v->id) == 0)
                    known = true;
                if (s->workers[i] == NULL && hole == CTL_SCHED_MAX_WORKERS)
                    hole = i;
            }
            if (known || hole == CTL_SCHED_MAX_WORKERS)
                continue;
            ctl_sworker *w = calloc(1, sizeof(*w));
            if (w == NULL)
                continue;
            snprintf(w->id, sizeof(w->id), "%s", v->id);
            w->epoch = v->connected_ms;
            ctl_kv_geom geom = {.state_bytes = v->state_bytes,
                                .kv_token_bytes = v->kv_token_bytes,
                                .page_tokens = v->kv_page_tokens,
                                .pages_total = v->kv_pages};
            w->s = s;
            if (ctl_resid_init(&w->t, v->slots_total, &geom) != WK_OK) {
                ctl_sworker_free(w);
                continue;
            }
            if (ctl_resid_dir_attach_locked(s->resid, &w->t, w->id) != WK_OK ||
                pthread_create(&w->thr, NULL, ctl_sched_worker_main, w) != 0) {
                ctl_resid_dir_detach_locked(s->resid, &w->t);
                ctl_sworker_free(w);
                continue;
            }
            s->workers[hole] = w;
            ctl_resid_dir_released_locked(s->resid);
            wk_log_info("scheduling on worker=%s slots=%u kv_pages=%u page_tokens=%u", w->id,
                        w->t.n, w->t.geom.pages_total, w->t.geom.page_tokens);
        }
        /*
         * Waiting jobs fail when no worker is ready at all, when the worker
         * they are pinned to is gone, or when their deadline passed.
         */
        size_t ready = 0;
        for (size_t k = 0; k < n; k++)
            ready += views[k].state == CTL_WORKER_STATE_READY && views[k].model_loaded;
        uint64_t now = wk_mono_ms();
        for (ctl_job *j = s->jobs; j != NULL; j = j->next) {
            if (j->state != CTL_JOB_WAITING)
                continue;
            if (ready == 0)
                ctl_job_fail(s, j, WK_EUNAVAIL, "no worker is available");
            else if (j->want_worker[0] && ctl_sched_worker_locked(s, j->want_worker) == NULL &&
                     now - j->submit_ms > 5000)
                ctl_job_fail(s, j, WK_EUNAVAIL, "the requested worker is not available");
            else if (!j->held && now - j->submit_ms >= s->cfg.drain_wait_ms &&
                     ctl_sched_only_draining_locked(s, j->want_worker))
                ctl_job_fail(s, j, WK_EUNAVAIL,
                             "every worker this request may run on is draining (undrain one "
                             "with POST /admin/workers/{id}/drain {\"undrain\": true}, or add a "
                             "worker)");
            else if (j->deadline_ms && now > j->deadline_ms)
                ctl_job_fail(s, j, WK_ETIMEDOUT, "request timed out waiting for a slot");
        }
        /*
         * Requests wait and no slot is free anywhere: a parked slot comes
         * back (anywhere). Or the first waits for KV pages: parked slots on
         * the worker where it lacks the fewest, and only those that can make
         * up the shortfall there. Residence frees the least recently used
         * clean one (its copy to resume from exists) here under the lock, no
         * call out, no I/O. When only dirty ones could make room, residence
         * wakes ctl_vm's cleaner, which makes the victim clean (a spill or a
         * warm copy, after no lock of ours); its end wakes this thread, and
         * the next pass frees it. The jobs wait meanwhile, as for any slot.
         */
        char starved_on[65] = "";
        uint32_t missing = 0;
        uint32_t wanted = s->n_waiting > 0 && !ctl_sched_free_slot_locked(s, "")
                              ? ctl_sched_slots_wanted_locked(s)
                              : 0;
        bool slot_starved = wanted > 0;
        bool starving = slot_starved || (s->n_waiting > 0 &&
                                         ctl_sched_page_starved_locked(s, starved_on, &missing));
        /*
         * A hybrid slot an earlier pass freed is stale until its worker's
         * step loop frees its KV pages (SLOT_FREE): that slot is on its
         * way, so while as many slots are coming as requests want one, wait
         * for them as for a cleaning instead of evicting every other clean
         * parked slot for the same requests (a worker whose SLOT_FREE failed
         * and waits to retry counts none). (Page starvation already counts
         * stale slots' pages as coming back.)
         */
        bool coming = slot_starved && ctl_sched_slots_coming_locked(s) >= wanted;
        bool freed = false, cleaning = coming;
        if (starving && !coming) {
            const char *on = starved_on[0] ? starved_on : NULL;
            ctl_resid_hot gone;
            wk_err ev = ctl_resid_hot_evict_clean_locked(s->resid, on, missing, &gone);
            freed = ev == WK_OK;
            cleaning = ev == WK_EBUSY;
            if (cleaning)
                ctl_resid_hot_want_clean_locked(s->resid, on, missing);
            if (freed)
                wk_log_debug("evicting key=%.16s clean worker=%s slot=%u", gone.key,
                             gone.slot.worker, gone.slot.slot);
        }
        /* (a cleaning ending or a slot released after this is not waited for below) */
        uint64_t clean_gen = ctl_resid_hot_clean_gen_locked(s->resid);
        pthread_cond_broadcast(s->cv);
        pthread_mutex_unlock(s->mu);
        for (size_t i = 0; i < nreap; i++) {
            pthread_join(reap[i]->thr, NULL);
            pthread_mutex_lock(s->mu);
            /* Jobs that were in flight when the worker died fail now. */
            for (ctl_job *j = s->jobs; j != NULL; j = j->next) {
                if (ctl_job_on_locked(j, reap[i]))
                    ctl_job_fail(s, j, WK_EUNAVAIL, "worker left during the request");
            }
            pthread_mutex_unlock(s->mu);
            ctl_sworker_free(reap[i]);
        }
        if (freed)
            continue; /* look again at once */
        if (cleaning) {
            /* (the cleaner's end and a stale slot's SLOT_FREE broadcast the directory's
             * condition variable) */
            struct timespec until;
            wk_deadline_after_ms(&until, 50);
            pthread_mutex_lock(s->mu);
            /* (its broadcast may have come while we held no lock: then look again at once) */
            if (!atomic_load(&s->stop) && ctl_resid_hot_clean_gen_locked(s->resid) == clean_gen)
                (void)pthread_cond_timedwait(s->cv, s->mu, &until);
            pthread_mutex_unlock(s->mu);
            continue;
        }
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    free(views);
    return NULL;
}

wk_err
ctl_sched_new(const ctl_sched_config *cfg, ctl_pool *pool, ctl_resid_dir *resid,
              ctl_metrics *metrics, ctl_sched **out, wk_diag *d)
{
    if (cfg->step_tokens == 0 || cfg->job_chunk == 0 || cfg->max_rows == 0 ||
        cfg->max_rows > WK_PROTO_ROWS_MAX || cfg->step_tokens > WK_PROTO_STEP_TOKENS_MAX)
        return wk_diag_set(d, WK_EINVAL, "scheduler limits out of range");
    ctl_sched *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return WK_ENOMEM;
    s->cfg = *cfg;
    if (s->cfg.step_timeout_ms == 0)
        s->cfg.step_timeout_ms = 120000;
    s->pool = pool;
    s->metrics = metrics;
    s->resid = resid;
    s->mu = ctl_resid_dir_mutex(resid);
    s->cv = ctl_resid_dir_cond(resid);
    atomic_init(&s->stop, false);
    if (metrics != NULL) {
        static const double lat[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                     0.5,   1,      2.5,   5,    10,    30,   60};
        static const char *const hist[][2] = {
            {"wkvm_time_to_first_token_seconds", "Time from admission request to first token."},
            {"wkvm_time_per_output_token_seconds", "Time between consecutive output tokens."},
            {"wkvm_queue_wait_seconds", "Time a request waited for a slot."},
            {"wkvm_step_seconds", "Wall time of one step round trip to a worker."},
            {"wkvm_step_backend_seconds", "Time the worker's backend spent in one step."},
        };
        for (size_t i = 0; i < sizeof(hist) / sizeof(hist[0]); i++) {
            wk_err e = ctl_metrics_declare(metrics, hist[i][0], CTL_METRIC_HISTOGRAM, hist[i][1],
                                           lat, sizeof(lat) / sizeof(lat[0]));
            if (e != WK_OK && e != WK_EEXIST) {
                ctl_sched_free(s);
                return wk_diag_set(d, e, "cannot declare scheduler metrics");
            }
        }
    }
    if (pthread_create(&s->mgr, NULL, ctl_sched_mgr_main, s) != 0) {
        ctl_sched_free(s);
        return WK_ENOMEM;
    }
    s->mgr_started = true;
    *out = s;
    return WK_OK;
}

void
ctl_sched_free(ctl_sched *s)
{
    if (s == NULL)
        return;
    atomic_store(&s->stop, true);
    ctl_resid_dir_stop(s->resid); /* (slot waits end) */
    if (s->mgr_started)
        pthread_join(s->mgr, NULL);
    pthread_mutex_lock(s->mu);
    pthread_cond_broadcast(s->cv);
    pthread_mutex_unlock(s->mu);
    for (size_t i = 0; i < CTL_SCHED_MAX_WORKERS; i++) {
        if (s->workers[i] != NULL) {
            pthread_join(s->workers[i]->thr, NULL);
        }
    }
    pthread_mutex_lock(s->mu);
    for (ctl_job *j = s->jobs; j != NULL; j = j->next)
        ctl_job_fail(s, j, WK_EUNAVAIL, "server shutting down");
    /* Jobs whose consumers are gone are freed here; others by ctl_job_free(). */
    while (s->jobs != NULL) {
        ctl_job *j = s->jobs;
        s->jobs = j->next;
        j->s = NULL;
        j->next = NULL;
    }
    for (size_t i = 0; i < CTL_SCHED_MAX_WORKERS; i++) {
        if (s->workers[i] != NULL)
            ctl_resid_dir_detach_locked(s->resid, &s->workers[i]->t);
    }
    pthread_mutex_unlock(s->mu);
    for (size_t i = 0; i < CTL_SCHED_MAX_WORKERS; i++)
        ctl_sworker_free(s->workers[i]);
    free(s->rank);
    free(s);
}

/* True when a worker (want, or any when "") has a free slot now. Caller holds mu. */
/*
 * How many waiting jobs would take a slot now if one were free: short
 * ones, and long ones that some worker they may run on has prefill room for
 * (ctl_sched_prefill_cap()); parked slots are not evicted for jobs that
 * would only wait on them. Caller holds mu.
 */
static uint32_t
ctl_sched_slots_wanted_locked(ctl_sched *s)
{
    uint32_t n = 0;
    for (const ctl_job *j = s->jobs; j != NULL; j = j->next) {
        if (j->state != CTL_JOB_WAITING || j->held)
            continue;
        size_t from = j->reuse.load != NULL ? j->reuse.resume_at : j->computed;
        if (j->n_input <= from || j->n_input - from <= s->cfg.job_chunk) {
            n++;
            continue;
        }
        for (size_t i = 0; i < CTL_SCHED_MAX_WORKERS; i++) {
            const ctl_sworker *w = s->workers[i];
            if (w != NULL && !w->dead && !w->t.draining &&
                (j->want_worker[0] == '\0' || strcmp(j->want_worker, w->id) == 0) &&
                ctl_sched_long_prefills_locked(s, w) < ctl_sched_prefill_cap(s)) {
                n++;
                break;
            }
        }
    }
    return n;
}

static bool
ctl_sched_free_slot_locked(ctl_sched *s, const char *want)
{
    for (size_t i = 0; i < CTL_SCHED_MAX_WORKERS; i++) {
        ctl_sworker *w = s->workers[i];
        if (w == NULL || w->dead || w->t.draining || (want[0] && strcmp(want, w->id) != 0))
            continue;
        if (ctl_resid_free_slot(&w->t) != 0)
            return true;
    }
    return false;
}

static uint32_t
ctl_sched_live_workers_locked(ctl_sched *s)
{
    uint32_t n = 0;
    for (size_t i = 0; i < CTL_SCHED_MAX_WORKERS; i++) {
        if (s->workers[i] != NULL && !s->workers[i]->dead)
            n++;
    }
    return n;
}

wk_err
ctl_sched_submit(ctl_sched *s, const ctl_job_spec *spec, ctl_job **out, wk_diag *d)
{
    if (spec->n_tokens == 0 && spec->sample)
        return wk_diag_set(d, WK_EINVAL, "a sampling job needs at least one input token");
    if (spec->n_tokens == 0 && spec->slot == NULL)
        return wk_diag_set(d, WK_EINVAL, "a job needs input tokens");
    ctl_job *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return WK_ENOMEM;
    j->s = s;
    j->cap = spec->n_tokens + 64;
    j->tokens = malloc(j->cap * sizeof(*j->tokens));
    if (j->tokens == NULL) {
        free(j);
        return WK_ENOMEM;
    }
    if (spec->n_tokens)
        memcpy(j->tokens, spec->tokens, spec->n_tokens * sizeof(*j->tokens));
    j->n_tokens = spec->n_tokens;
    j->n_input = spec->n_tokens;
    j->sample = spec->sample;
    j->max_new = spec->sample ? spec->max_new : 0;
    j->params = spec->params;
    j->sample_index = spec->sample_index;
    if (spec->sample && spec->allowed != NULL && spec->n_allowed > 0) {
        j->allowed = malloc(spec->n_allowed);
        if (j->allowed == NULL) {
            free(j->tokens);
            free(j);
            return WK_ENOMEM;
        }
        memcpy(j->allowed, spec->allowed, spec->n_allowed);
        j->n_allowed = spec->n_allowed;
    }
    j->deadline_ms = spec->deadline_ms;
    j->submit_ms = wk_mono_ms();
    sem_init(&j->wake, 0, 0);
    pthread_mutex_init(&j->mu, NULL);
    atomic_init(&j->throttled, false);
    if (spec->worker != NULL)
        snprintf(j->want_worker, sizeof(j->want_worker), "%s", spec->worker);
    else if (spec->prefer != NULL)
        snprintf(j->prefer_worker, sizeof(j->prefer_worker), "%s", spec->prefer);
    if (spec->reuse != NULL) {
        const ctl_sched_reuse *ru = spec->reuse;
        bool bad = ru->n_ckpt > CTL_SCHED_CKPT_MAX || (ru->n_ckpt && ru->ckpt_at == NULL) ||
                   (ru->snap_begin == NULL) != (ru->snap_end == NULL) ||
                   (ru->load != NULL && (spec->slot != NULL || ru->resume_at >= spec->n_tokens));
        for (size_t i = 0; !bad && i < ru->n_ckpt; i++)
            bad = ru->ckpt_at[i] >= spec->n_tokens || (i && ru->ckpt_at[i] <= ru->ckpt_at[i - 1]);
        j->reuse = *ru;
        j->reuse.ckpt_at = NULL;
        if (ru->ckpt == NULL && ru->snap_begin == NULL)
            j->reuse.n_ckpt = 0;
        if (!bad && j->reuse.n_ckpt) {
            j->ckpt = malloc(j->reuse.n_ckpt * sizeof(*j->ckpt));
            bad = j->ckpt == NULL;
            if (!bad)
                memcpy(j->ckpt, ru->ckpt_at, j->reuse.n_ckpt * sizeof(*j->ckpt));
        }
        while (!bad && j->next_ckpt < j->reuse.n_ckpt && j->ckpt[j->next_ckpt] == 0)
            j->next_ckpt++; /* position 0: nothing to copy */
        if (bad) {
            ctl_job_sync_fini(j);
            free(j->tokens);
            free(j->ckpt);
    free(j->allowed);
            free(j);
            return wk_diag_set(d, WK_EINVAL, "bad reuse hooks");
        }
    }

    pthread_mutex_lock(s->mu);
    wk_err err = WK_OK;
    ctl_kv_geom geom;
    if (spec->slot != NULL) {
        ctl_sworker *w = ctl_sched_worker_locked(s, spec->slot->worker);
        if (w == NULL) {
            err = wk_diag_set(d, WK_EUNAVAIL, "worker %s left", spec->slot->worker);
        } else if (!ctl_resid_live(&w->t, spec->slot->slot, spec->slot->gen)) {
            err = wk_diag_set(d, WK_ESTATE, "slot %s/%u is no longer valid", spec->slot->worker,
                              spec->slot->slot);
        } else if (w->t.busy[spec->slot->slot] != NULL) {
            err = wk_diag_set(d, WK_EBUSY, "slot %s/%u is in use", spec->slot->worker,
                              spec->slot->slot);
        } else {
            uint32_t k = spec->slot->slot;
            j->ctx0 = spec->fresh ? 0 : w->t.ctx[k];
            uint32_t need = ctl_job_pages_need(w, j);
            if (j->n_tokens > 0 && ctl_kv_hybrid(&w->t.geom) && need > w->t.geom.pages_total) {
                err = wk_diag_set(d, WK_ETOOBIG,
                                  "this request needs %llu tokens of context (%llu in the state, "
                                  "%zu input, up to %llu to generate), more than the KV pool of "
                                  "worker %s holds (%u pages of %u tokens: %llu tokens)",
                                  (unsigned long long)(j->ctx0 + j->n_input + j->max_new),
                                  (unsigned long long)j->ctx0, j->n_input,
                                  (unsigned long long)j->max_new, w->id, w->t.geom.pages_total,
                                  w->t.geom.page_tokens,
                                  (unsigned long long)w->t.geom.pages_total * w->t.geom.page_tokens);
            } else {
                w->t.busy[k] = j;
                j->slot = *spec->slot;
                j->held = true;
                j->fresh = spec->fresh;
                /*
                 * (fresh: the slot's pages stay counted until the reset step
                 * ran, then shrink to the job's reservation)
                 */
                if (j->n_tokens == 0) {
                    j->state = CTL_JOB_RUNNING;
                    ctl_job_done(s, j);
                } else if (ctl_kv_fits(&w->t.geom, ctl_resid_pages_used(&w->t), w->t.pages[k], need)) {
                    if (need > w->t.pages[k])
                        w->t.pages[k] = need;
                    j->state = CTL_JOB_RUNNING;
                } else {
                    /* Its slot is held; it waits (FIFO) for the pages to grow into. */
                    snprintf(j->want_worker, sizeof(j->want_worker), "%s", w->id);
                    j->state = CTL_JOB_WAITING;
                    s->n_waiting++;
                }
            }
        }
    } else if (ctl_sched_live_workers_locked(s) == 0 && ctl_pool_ready_count(s->pool) == 0) {
        err = wk_diag_set(d, WK_EUNAVAIL, "no worker is ready");
    } else if (ctl_sched_kv_pool_max_locked(s, j->want_worker, &geom) &&
               ctl_kv_job_pages(&geom, 0, j->n_input, j->max_new) > geom.pages_total) {
        err = wk_diag_set(d, WK_ETOOBIG,
                          "this request needs %llu tokens of context (%zu input, up to %llu to "
                          "generate), more than the largest KV pool holds (%u pages of %u "
                          "tokens: %llu tokens)",
                          (unsigned long long)(j->n_input + j->max_new), j->n_input,
                          (unsigned long long)j->max_new, geom.pages_total, geom.page_tokens,
                          (unsigned long long)geom.pages_total * geom.page_tokens);
    } else if (s->n_waiting >= s->cfg.queue_max &&
               !(s->n_waiting == 0 && ctl_sched_free_slot_locked(s, j->want_worker))) {
        err = wk_diag_set(d, WK_EQUEUEFULL, "the wait queue is full (%u requests)",
                          s->cfg.queue_max);
    } else {
        j->state = CTL_JOB_WAITING;
        s->n_waiting++;
    }
    if (err != WK_OK) {
        pthread_mutex_unlock(s->mu);
        ctl_job_sync_fini(j);
        free(j->tokens);
        free(j->ckpt);
    free(j->allowed);
        free(j);
        return err;
    }
    j->seq = s->next_seq++;
    ctl_job **pp = &s->jobs;
    while (*pp != NULL)
        pp = &(*pp)->next;
    *pp = j;
    pthread_cond_broadcast(s->cv);
    pthread_mutex_unlock(s->mu);
    *out = j;
    return WK_OK;
}

wk_err
ctl_job_next(ctl_job *j, uint32_t timeout_ms, ctl_job_event *ev)
{
    ctl_sched *s = j->s;
    if (s == NULL) {
        memset(ev, 0, sizeof(*ev));
        ev->type = CTL_JOB_EV_ERROR;
        ev->err = WK_EUNAVAIL;
        snprintf(ev->message, sizeof(ev->message), "server shutting down");
        return WK_OK;
    }
    pthread_mutex_lock(&j->mu);
    if (j->ev_len == 0 && !j->data) {
        struct timespec until;
        wk_deadline_after_ms(&until, timeout_ms);
        while (j->ev_len == 0 && !j->data) {
            /*
             * Sleeping is set under j->mu; a producer that sees it clears it
             * and posts once, after its unlock. A post that comes after a
             * timeout stays in the semaphore: the next wait returns at once
             * and finds nothing, harmless.
             */
            j->sleeping = true;
            pthread_mutex_unlock(&j->mu);
            int rc;
            do
                rc = sem_timedwait(&j->wake, &until);
            while (rc != 0 && errno == EINTR);
            pthread_mutex_lock(&j->mu);
            j->sleeping = false;
            if (rc != 0)
                break; /* (ETIMEDOUT) */
        }
    }
    wk_err err = WK_ETIMEDOUT;
    if (j->data) {
        j->data = false;
        ev->type = CTL_JOB_EV_DATA;
        err = WK_OK;
    } else if (j->ev_len > 0) {
        *ev = j->evq[j->ev_head];
        j->ev_head = (j->ev_head + 1) % CTL_JOB_EVQ;
        j->ev_len--;
        err = WK_OK;
    }
    pthread_mutex_unlock(&j->mu);
    return err;
}

wk_err
ctl_job_poll(ctl_job *j, ctl_job_event *ev)
{
    if (j->s == NULL)
        return ctl_job_next(j, 0, ev);
    wk_err err = WK_ETIMEDOUT;
    pthread_mutex_lock(&j->mu);
    if (j->data) {
        j->data = false;
        ev->type = CTL_JOB_EV_DATA;
        err = WK_OK;
    } else if (j->ev_len > 0) {
        *ev = j->evq[j->ev_head];
        j->ev_head = (j->ev_head + 1) % CTL_JOB_EVQ;
        j->ev_len--;
        err = WK_OK;
    } else {
        j->sleeping = true; /* armed: the next publication or event calls the waker */
    }
    pthread_mutex_unlock(&j->mu);
    return err;
}

void
ctl_job_set_waker(ctl_job *j, ctl_job_waker_fn fn, void *arg)
{
    pthread_mutex_lock(&j->mu);
    j->waker = fn;
    j->waker_arg = arg;
    pthread_mutex_unlock(&j->mu);
}

wk_err
ctl_job_set_allowed(ctl_job *j, const uint8_t *mask, size_t n)
{
    ctl_sched *s = j->s;
    uint8_t *copy = NULL;
    if (mask != NULL && n > 0) {
        copy = malloc(n);
        if (copy == NULL)
            return WK_ENOMEM;
        memcpy(copy, mask, n);
    }
    if (s != NULL)
        pthread_mutex_lock(s->mu);
    free(j->allowed);
    j->allowed = copy;
    j->n_allowed = copy != NULL ? n : 0;
    if (s != NULL)
        pthread_mutex_unlock(s->mu);
    return WK_OK;
}

void
ctl_job_set_on_token(ctl_job *j, ctl_job_token_fn fn, void *arg)
{
    if (j->s == NULL)
        return;
    pthread_mutex_lock(j->s->mu);
    j->on_token = fn;
    j->on_token_arg = arg;
    pthread_mutex_unlock(j->s->mu);
}

void
ctl_job_lock(ctl_job *j)
{
    pthread_mutex_lock(&j->mu);
}

void
ctl_job_unlock(ctl_job *j, bool publish)
{
    bool wake = false;
    if (publish) {
        j->data = true;
        wake = j->sleeping;
        j->sleeping = false; /* woken once, not once per publication */
    }
    if (wake && ctl_sched_in_decide) {
        j->wake_pending = true; /* (ctl_sched_decide signals after the step's hooks) */
        wake = false;
    }
    pthread_mutex_unlock(&j->mu);
    if (wake)
        ctl_job_wake(j);
}

void
ctl_job_throttle(ctl_job *j, bool on)
{
    if (on) {
        atomic_store(&j->throttled, true);
        return;
    }
    if (!atomic_load(&j->throttled) || j->s == NULL)
        return;
    /* (under s->mu: a step loop that found nothing to pick sleeps on s->cv) */
    pthread_mutex_lock(j->s->mu);
    atomic_store(&j->throttled, false);
    pthread_cond_broadcast(j->s->cv);
    pthread_mutex_unlock(j->s->mu);
}

void
ctl_job_continue(ctl_job *j)
{
    ctl_sched *s = j->s;
    if (s == NULL)
        return;
    pthread_mutex_lock(s->mu);
    if (j->state == CTL_JOB_PAUSED && !j->deciding) {
        ctl_job_decide_locked(s, j, CTL_JOB_CONTINUE);
        if (j->state == CTL_JOB_RUNNING)
            pthread_cond_broadcast(s->cv);
    }
    pthread_mutex_unlock(s->mu);
}

void
ctl_job_stop(ctl_job *j, bool feed_last)
{
    ctl_sched *s = j->s;
    if (s == NULL)
        return;
    pthread_mutex_lock(s->mu);
    if (j->deciding) {
        /* (the hook decides this token) */
    } else if (j->state == CTL_JOB_PAUSED) {
        ctl_job_decide_locked(s, j, feed_last ? CTL_JOB_STOP_FEED : CTL_JOB_STOP);
        pthread_cond_broadcast(s->cv);
    } else if (j->state == CTL_JOB_RUNNING || j->state == CTL_JOB_WAITING) {
        /* Stop before any token: finish once the input is fed. */
        if (j->state == CTL_JOB_WAITING) {
            ctl_job_fail(s, j, WK_EINVAL, "stopped before admission");
        } else {
            j->sample = false;
            if (j->computed == j->n_tokens && !j->in_flight)
                ctl_job_done(s, j);
        }
    }
    pthread_mutex_unlock(s->mu);
}

size_t
ctl_job_fed(const ctl_job *j)
{
    size_t n;
    if (j->s == NULL)
        return j->computed;
    pthread_mutex_lock(j->s->mu);
    n = j->computed;
    pthread_mutex_unlock(j->s->mu);
    return n;
}

size_t
ctl_job_n_input(const ctl_job *j)
{
    return j->n_input; /* immutable after submit */
}

size_t
ctl_job_computed(const ctl_job *j)
{
    size_t n;
    if (j->s == NULL)
        return j->own_computed;
    pthread_mutex_lock(j->s->mu);
    n = j->own_computed;
    pthread_mutex_unlock(j->s->mu);
    return n;
}

wk_err
ctl_job_keep_slot(ctl_job *j, ctl_slot_ref *out)
{
    ctl_sched *s = j->s;
    if (s == NULL)
        return WK_ESTATE;
    wk_err err = WK_OK;
    pthread_mutex_lock(s->mu);
    if (j->state != CTL_JOB_DONE || j->slot.worker[0] == '\0') {
        err = WK_ESTATE;
    } else {
        j->kept = true;
        *out = j->slot;
    }
    pthread_mutex_unlock(s->mu);
    return err;
}

void
ctl_job_free(ctl_job *j)
{
    if (j == NULL)
        return;
    ctl_sched *s = j->s;
    if (s == NULL) {
        ctl_job_sync_fini(j);
        free(j->tokens);
        free(j);
        return;
    }
    pthread_mutex_lock(s->mu);
    while (j->in_hook || j->deciding)
        pthread_cond_wait(s->cv, s->mu); /* a hook uses the caller's argument */
    if (j->in_flight) {
        j->cancelled = true; /* the step loop destroys it when the step returns */
    } else {
        ctl_job_destroy_locked(s, j);
    }
    pthread_cond_broadcast(s->cv);
    pthread_mutex_unlock(s->mu);
}

size_t
ctl_sched_slots(ctl_sched *s, ctl_slot_info *out, size_t cap)
{
    size_t n = 0;
    pthread_mutex_lock(s->mu);
    for (size_t i = 0; i < CTL_SCHED_MAX_WORKERS; i++) {
        ctl_sworker *w = s->workers[i];
        if (w == NULL || w->dead)
            continue;
        for (uint32_t k = 1; k <= w->t.n; k++) {
            if (w->t.gen[k] == 0)
                continue;
            if (n < cap) {
                ctl_slot_info *o = &out[n];
                memset(o, 0, sizeof(*o));
                snprintf(o->ref.worker, sizeof(o->ref.worker), "%s", w->id);
                o->ref.slot = k;
                o->ref.gen = w->t.gen[k];
                ctl_job *j = w->t.busy[k];
                o->tokens = w->t.ctx[k]; /* what the slot holds between jobs */
                if (j != NULL) {
                    o->running = true;
                    o->held = j->held;
                    o->tokens = j->ctx0 + j->computed;
                    o->last_used_ms = j->last_tok_ms;
                }
            }
            n++;
        }
    }
    pthread_mutex_unlock(s->mu);
    return n;
}

wk_err
ctl_sched_migrate_job(ctl_sched *s, const ctl_slot_ref *src, const char *to,
                      ctl_sched_mover_fn mover, void *arg, ctl_slot_ref *dst_out, wk_diag *d)
{
    if (strcmp(src->worker, to) == 0)
        return wk_diag_set(d, WK_EINVAL, "the slot is already on worker %s", to);
    ctl_slot_ref dst;
    wk_err err = ctl_resid_slot_alloc(s->resid, to, &dst, NULL);
    if (err != WK_OK)
        return wk_diag_set(d, ctl_sched_known(s, to) ? WK_EBUSY : WK_EINVAL,
                           ctl_sched_known(s, to) ? "no free slot on worker %s"
                                                  : "no worker %s",
                           to);
    pthread_mutex_lock(s->mu);
    ctl_sworker *w = ctl_sched_worker_locked(s, src->worker);
    ctl_job *j = NULL;
    if (w != NULL && ctl_resid_live(&w->t, src->slot, src->gen))
        j = w->t.busy[src->slot];
    if (j == NULL || j->migrating || j->state == CTL_JOB_DONE || j->state == CTL_JOB_FAILED) {
        pthread_mutex_unlock(s->mu);
        (void)ctl_resid_slot_free(s->resid, &dst);
        return wk_diag_set(d, WK_ENOENT, "no running request on %s:%u", src->worker, src->slot);
    }
    if (j->held) {
        pthread_mutex_unlock(s->mu);
        (void)ctl_resid_slot_free(s->resid, &dst);
        return wk_diag_set(d, WK_ESTATE, "the slot is held by a state operation or chat turn; "
                                         "it can be moved once parked");
    }
    j->migrating = true;
    while (j->in_flight && !atomic_load(&s->stop))
        pthread_cond_wait(s->cv, s->mu);
    bool alive = j->state != CTL_JOB_DONE && j->state != CTL_JOB_FAILED && !j->cancelled;
    /*
     * The job's reservation moves with it (workers of one model share a
     * geometry): reserve it on the destination before any byte moves, so
     * a full pool there fails the migration and the job stays where it is.
     */
    ctl_sworker *w_to = ctl_sched_worker_locked(s, dst.worker);
    ctl_sworker *w_from = ctl_sched_worker_locked(s, src->worker);
    err = WK_OK;
    if (alive && w_to != NULL && ctl_resid_live(&w_to->t, dst.slot, dst.gen) && w_from != NULL &&
        ctl_resid_live(&w_from->t, src->slot, src->gen)) {
        uint32_t need = w_from->t.pages[src->slot];
        uint32_t used = ctl_resid_pages_used(&w_to->t);
        if (!ctl_kv_fits(&w_to->t.geom, used, w_to->t.pages[dst.slot], need))
            err = wk_diag_set(d, WK_EQUOTA, "KV pool full on worker %s: the request holds %u "
                              "pages, %u of %u free", to, need,
                              used < w_to->t.geom.pages_total ? w_to->t.geom.pages_total - used : 0,
                              w_to->t.geom.pages_total);
        else if (need > w_to->t.pages[dst.slot])
            w_to->t.pages[dst.slot] = need;
    }
    pthread_mutex_unlock(s->mu);

    if (err == WK_OK)
        err = alive ? mover(arg, src, &dst, d) : wk_diag_set(d, WK_ENOENT, "the request ended");

    pthread_mutex_lock(s->mu);
    ctl_sworker *w_src = ctl_sched_worker_locked(s, src->worker);
    ctl_sworker *w_dst = ctl_sched_worker_locked(s, dst.worker);
    if (err == WK_OK && (w_dst == NULL || !ctl_resid_live(&w_dst->t, dst.slot, dst.gen) ||
                         j->cancelled || j->state == CTL_JOB_DONE || j->state == CTL_JOB_FAILED))
        err = wk_diag_set(d, WK_EUNAVAIL, "the destination or the request went away");
    if (err == WK_OK) {
        /* Commit: the job now lives on dst; the source slot is released. */
        w_dst->t.busy[dst.slot] = j;
        if (w_src != NULL && ctl_resid_live(&w_src->t, src->slot, src->gen)) {
            /* (dst holds the job's reservation since before the move) */
            if (w_src->t.pages[src->slot] > w_dst->t.pages[dst.slot])
                w_dst->t.pages[dst.slot] = w_src->t.pages[src->slot];
            w_dst->t.ctx[dst.slot] = w_src->t.ctx[src->slot];
            w_src->t.busy[src->slot] = NULL;
            ctl_sworker_slot_clear(w_src, src->slot);
        }
        j->slot = dst;
        *dst_out = dst;
    }
    j->migrating = false;
    if (j->cancelled && !j->in_flight)
        ctl_job_destroy_locked(s, j);
    pthread_cond_broadcast(s->cv);
    pthread_mutex_unlock(s->mu);
    if (err != WK_OK)
        (void)ctl_resid_slot_free(s->resid, &dst);
    return err;
}

uint64_t
ctl_sched_worker_epoch(ctl_sched *s, const char *worker)
{
    pthread_mutex_lock(s->mu);
    ctl_sworker *w = ctl_sched_worker_locked(s, worker);
    uint64_t e = w != NULL ? w->epoch : 0;
    pthread_mutex_unlock(s->mu);
    return e;
}

bool
ctl_sched_known(ctl_sched *s, const char *worker)
{
    pthread_mutex_lock(s->mu);
    bool ok = ctl_sched_worker_locked(s, worker) != NULL;
    pthread_mutex_unlock(s->mu);
    return ok;
}

wk_err
ctl_sched_set_draining(ctl_sched *s, const char *worker, bool draining)
{
    wk_err err = WK_ENOENT;
    pthread_mutex_lock(s->mu);
    ctl_sworker *w = ctl_sched_worker_locked(s, worker);
    if (w != NULL) {
        w->t.draining = draining;
        err = WK_OK;
        pthread_cond_broadcast(s->cv);
    }
    pthread_mutex_unlock(s->mu);
    return err;
}

bool
ctl_sched_draining(ctl_sched *s, const char *worker)
{
    pthread_mutex_lock(s->mu);
    ctl_sworker *w = ctl_sched_worker_locked(s, worker);
    bool d = w != NULL && w->t.draining;
    pthread_mutex_unlock(s->mu);
    return d;
}

uint32_t
ctl_sched_worker_count(ctl_sched *s)
{
    pthread_mutex_lock(s->mu);
    uint32_t n = ctl_sched_live_workers_locked(s);
    pthread_mutex_unlock(s->mu);
    return n;
}

void
ctl_sched_depths(ctl_sched *s, uint32_t *waiting, uint32_t *running)
{
    pthread_mutex_lock(s->mu);
    *waiting = s->n_waiting;
    *running = 0;
    for (ctl_job *j = s->jobs; j != NULL; j = j->next)
        *running += j->state == CTL_JOB_RUNNING || j->state == CTL_JOB_PAUSED ||
                    j->state == CTL_JOB_STOPPING;
    pthread_mutex_unlock(s->mu);
}
