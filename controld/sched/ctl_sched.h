/*
 * ctl_sched: admission and continuous batching.
 *
 * A job is one generation: input tokens to feed into a slot, then tokens
 * sampled one at a time. Each job has one integer, `computed`, converging to
 * its token count; every step feeds part of the gap under a per-step token
 * budget and a per-job cap (decode rows first, then prefill chunks).
 * Admission is exact: a job needs one free slot on a worker; waiting jobs are
 * admitted while a slot is free; the wait queue is bounded (WK_EQUEUEFULL).
 * Order, of admission and of prefill chunks (ctl_sched_rank_class()): jobs
 * whose input left fits one prefill chunk first, fewest left first (a
 * request that resumed a checkpoint waits neither for a slot nor for
 * prefill behind long prompts), then jobs that waited 2 s or more in submit
 * order, then the others fewest left first; a waiting job that 16 younger
 * ones overtook goes before all (short ones never keep it out for ever).
 * Long prefills (more than one chunk of input left) run at most
 * step_tokens / job_chunk at once per worker, what one step can feed: a
 * further long job waits and the free slots serve short jobs at once.
 *
 * Every worker has its own step loop (a thread), so workers step concurrently.
 * Each sampled token needs a decision: continue (the token is fed next step),
 * or stop (the token is fed or dropped, then the job finishes), so the slot's
 * state always holds exactly the tokens reported as fed. A job with a token
 * hook (ctl_job_set_on_token) is decided by that hook, called by the step
 * loop right after the step (no scheduler lock held), and the row goes on in
 * the next step without waiting for anyone; the hook publishes what it made
 * of the token under the job's own lock (ctl_job_lock/unlock) and the
 * consumer is woken only when it sleeps. Without a hook (or for a token that
 * came before the hook was set) the row pauses and the consumer decides with
 * ctl_job_continue() / ctl_job_stop() after a TOKEN event.
 *
 * Slots: every worker's slot table is a ctl_resid attached to the residence
 * directory (ctl_resid.h), whose mutex the scheduler takes as its own; it
 * attaches a table when a worker joins and detaches it when the worker
 * leaves. A job either takes a fresh slot at admission (freed at the end
 * unless the consumer keeps it) or runs on a slot the caller already holds
 * (ctl_resid_slot_alloc), e.g. a parked state. Every slot carries a generation number; every use
 * checks it, so a stale handle can never touch a reused slot.
 *
 * Threading: all functions are thread-safe. ctl_job_next() blocks.
 * Locks: the scheduler's mutex (tables, states, queues) and one mutex per job
 * (its event queue and what its token hook publishes). Order: scheduler,
 * then job; never the scheduler's while holding a job's. The consumer's side
 * of a stream (ctl_job_next, ctl_job_lock) takes only the job's lock.
 */
#ifndef CTL_SCHED_H
#define CTL_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctl_kv.h"
#include "ctl_metrics.h"
#include "ctl_pool.h"
#include "ctl_resid.h"
#include "wk_err.h"

typedef struct ctl_sched ctl_sched;
typedef struct ctl_job ctl_job;

typedef struct ctl_sched_config {
    uint32_t step_tokens;   /* token budget of one step */
    uint32_t job_chunk;     /* most prefill tokens of one job in one step */
    uint32_t max_rows;      /* most rows in one step */
    uint32_t queue_max;     /* waiting jobs before WK_EQUEUEFULL */
    uint32_t step_timeout_ms; /* deadline of one step RPC */
    uint32_t drain_wait_ms;   /* a request only draining workers could run fails (503) after this */
} ctl_sched_config;

#define CTL_SAMPLE_BIAS_MAX 300 /* logit_bias entries of one request (= the wire's maximum) */

/* One logit_bias entry: bias added to the token's logit before sampling. */
typedef struct ctl_logit_bias {
    int32_t token; /* token id in the model's vocab */
    float bias;    /* -100..100 */
} ctl_logit_bias;

typedef struct ctl_sample_spec {
    float temperature;       /* 0 = greedy */
    float top_p;             /* 1 = off */
    uint32_t top_k;          /* 0 = off */
    float min_p;             /* 0 = off */
    uint64_t seed;           /* request seed */
    float presence_penalty;  /* OpenAI presence penalty */
    float frequency_penalty; /* OpenAI frequency penalty */
    uint32_t top_logprobs;   /* 0..20 */
    bool logprobs;           /* report the chosen token's logprob */
    uint32_t n_bias;         /* entries in bias */
    ctl_logit_bias bias[CTL_SAMPLE_BIAS_MAX]; /* OpenAI logit_bias, applied by the worker */
} ctl_sample_spec;

/*
 * Reuse hooks of one job (ctl_ckpt plans them). Both callbacks run on the
 * step loop thread of the job's worker, between two steps (no step runs on
 * that worker meanwhile), with no scheduler lock held; ctl_job_free() waits
 * for a running callback, so arg only has to outlive the job.
 *
 * load: the job was admitted onto a fresh slot; put the bytes of the state
 * after input[0..resume_at) into it (e.g. HOST_GET of a warm checkpoint).
 * WK_OK: the job feeds input[resume_at..] only; any error: the slot is reset
 * and the job feeds its whole input (a recompute, never a failure).
 *
 * ckpt: the slot's state now covers input[0..pos) exactly (pos is one of
 * ckpt_at); the callback may copy it (HOST_PUT). Its failure is its own.
 *
 * snap_begin / snap_end (both or neither; they replace ckpt): checkpoints
 * taken by the worker inside a step (StepRow.snaps), so that a position
 * does not end the step's chunk: a prefill runs in one row however many
 * checkpoints it passes (each cut cost a step of its own, and in a busy
 * batch a whole batched step). Before the step that feeds input position
 * pos - 1 (pos one of ckpt_at), snap_begin(arg, ...) names the worker's
 * warm-tier key to copy the state after input[0..pos) under (out, at most
 * CTL_SCHED_SNAP_KEY_MAX bytes with its NUL) and a token of its own (out);
 * false: no copy wanted there. After that step snap_end(snap_arg, token,
 * ...) says what came of the copy: WK_OK made, WK_ENOSPC not made (the
 * worker's host cache was full or the copy failed there; the step ran),
 * another error: the step failed. Both run on the step loop thread without
 * scheduler locks; snap_begin like ckpt (ctl_job_free() waits for it), but
 * snap_end after the job may have been freed (a freed job does not wait for
 * its step), so it gets snap_arg, which must outlive the scheduler's step
 * loops (ctl_sched_free() stops them), never arg.
 */
typedef wk_err (*ctl_sched_load_fn)(void *arg, const ctl_slot_ref *slot, wk_diag *d);
typedef void (*ctl_sched_ckpt_fn)(void *arg, const ctl_slot_ref *slot, size_t pos);
#define CTL_SCHED_SNAP_KEY_MAX 129 /* a warm-tier key (1..128 bytes) and its NUL */
typedef bool (*ctl_sched_snap_begin_fn)(void *arg, const ctl_slot_ref *slot, size_t pos,
                                        char key[CTL_SCHED_SNAP_KEY_MAX], void **token);
typedef void (*ctl_sched_snap_end_fn)(void *snap_arg, void *token, const ctl_slot_ref *slot,
                                      wk_err result);

typedef struct ctl_sched_reuse {
    size_t resume_at;        /* with load: input tokens the loaded state covers (< n_tokens) */
    ctl_sched_load_fn load;  /* NULL: nothing to load */
    const size_t *ckpt_at;   /* strictly increasing input positions, each < n_tokens, copied */
    size_t n_ckpt;           /* entries in ckpt_at (at most CTL_SCHED_CKPT_MAX) */
    ctl_sched_ckpt_fn ckpt;  /* NULL: no checkpoints (but with snap_begin) */
    ctl_sched_snap_begin_fn snap_begin; /* NULL: checkpoints end chunks, ckpt copies them */
    ctl_sched_snap_end_fn snap_end;     /* with snap_begin */
    void *snap_arg;                     /* snap_end's (outlives the step loops) */
    void *arg;                          /* passed to the others */
} ctl_sched_reuse;

#define CTL_SCHED_CKPT_MAX 256 /* checkpoint positions of one job */

typedef struct ctl_job_spec {
    const int32_t *tokens;      /* input to feed, copied; may be 0 only with a held slot */
    size_t n_tokens;            /* entries */
    bool sample;                /* sample after the input (false: prefill only) */
    ctl_sample_spec params;     /* sampling parameters */
    uint64_t sample_index;      /* RNG position of the first sampled token */
    const ctl_slot_ref *slot;   /* run on this held slot (NULL: allocate at admission) */
    bool fresh;                 /* zero the slot before feeding (always for new slots) */
    const char *worker;         /* with slot == NULL: only this worker, NULL = any */
    const char *prefer;         /* with slot == NULL and no worker: this one while it has a
                                 * free slot, else any (a warm checkpoint's worker), NULL */
    uint64_t deadline_ms;       /* monotonic ms after which the job fails, 0 = none */
    uint64_t max_new;           /* with sample: most tokens it may sample (hybrid models
                                 * reserve KV pages for them at admission), 0 = none */
    const ctl_sched_reuse *reuse; /* reuse hooks, borrowed for the call; NULL = none
                                   * (load only for jobs without a held slot) */
    const uint8_t *allowed;     /* with sample: the first sample's allowed tokens (bit i % 8 of
                                 * byte i / 8), copied; NULL = any (constrained decoding) */
    size_t n_allowed;           /* bytes in allowed: ceil(vocab / 8) of the worker's model */
} ctl_job_spec;

typedef enum ctl_job_ev {
    CTL_JOB_EV_TOKEN = 0, /* a sampled token; call ctl_job_continue() or ctl_job_stop() */
    CTL_JOB_EV_DONE,      /* input fed (prefill-only job) or stop completed */
    CTL_JOB_EV_ERROR,     /* failed; err and message set */
    CTL_JOB_EV_DATA,      /* the token hook published something (ctl_job_unlock(j, true)) */
} ctl_job_ev;

typedef struct ctl_job_event {
    ctl_job_ev type;      /* what happened */
    int32_t token;        /* CTL_JOB_EV_TOKEN: the token */
    float logprob;        /* its logprob */
    uint32_t n_top;       /* alternatives */
    int32_t top_token[20];   /* alternatives, descending */
    float top_logprob[20];   /* their logprobs */
    wk_err err;           /* CTL_JOB_EV_ERROR */
    char message[256];    /* CTL_JOB_EV_ERROR */
} ctl_job_event;

#define CTL_SCHED_AGING_MS 2000 /* a longer job waiting this long goes before others */
/* overtaken this often (waiting) or left out this many steps (a running prefill): first */
#define CTL_SCHED_BYPASS_MAX 16

/* The classes of the admission and prefill order, first first. */
typedef enum ctl_sched_class {
    CTL_SCHED_CLASS_STARVED = 0, /* overtaken / left out CTL_SCHED_BYPASS_MAX times: submit order */
    CTL_SCHED_CLASS_SHORT,       /* its input left fits one prefill chunk: fewest left first */
    CTL_SCHED_CLASS_AGED,        /* waited CTL_SCHED_AGING_MS or more: submit order */
    CTL_SCHED_CLASS_OTHER,       /* fewest left first */
} ctl_sched_class;

/* A job's key in that order. */
typedef struct ctl_sched_rank {
    ctl_sched_class cls; /* ctl_sched_rank_class() */
    size_t left;         /* input tokens it still has to compute */
    uint64_t seq;        /* submit order */
} ctl_sched_rank;

/*
 * The class of a job that waited waited_ms since its submit with left input
 * tokens still to compute, under a per-job prefill chunk of job_chunk
 * tokens. waiting: it waits for admission, and younger jobs were admitted
 * bypassed times meanwhile; running: its prefill got no chunk in the last
 * bypassed steps (shorter jobs' prefill took the step's budget). Either
 * goes before all at CTL_SCHED_BYPASS_MAX.
 */
ctl_sched_class ctl_sched_rank_class(bool waiting, uint32_t bypassed, uint64_t waited_ms,
                                     size_t left, uint32_t job_chunk);

/* qsort-style: < 0 when x goes before y (class, then fewest left or submit order). */
int ctl_sched_rank_cmp(const ctl_sched_rank *x, const ctl_sched_rank *y);

/*
 * Starts the scheduler over pool and the residence directory resid (both
 * borrowed; resid outlives it, and its slot waits end when it is freed).
 * metrics may be NULL.
 */
WK_MUST_CHECK wk_err ctl_sched_new(const ctl_sched_config *cfg, ctl_pool *pool,
                                   ctl_resid_dir *resid, ctl_metrics *metrics, ctl_sched **out,
                                   wk_diag *d);

/* Stops every loop, fails all jobs (WK_EUNAVAIL), frees. NULL-safe. */
void ctl_sched_free(ctl_sched *s);

/*
 * Submits a job. On success *out is owned by the caller, who must end it
 * with ctl_job_free(). WK_EQUEUEFULL (wait queue full), WK_EUNAVAIL (no
 * worker can ever take it: none ready), WK_EINVAL (bad spec or stale slot).
 */
WK_MUST_CHECK wk_err ctl_sched_submit(ctl_sched *s, const ctl_job_spec *spec, ctl_job **out,
                                      wk_diag *d);

/*
 * Waits up to timeout_ms for the job's next event. WK_ETIMEDOUT when none
 * came. A DATA event (the hook published since the last call) comes before
 * queued events; anything published before a DONE or ERROR is visible (under
 * ctl_job_lock) once that event is returned.
 */
WK_MUST_CHECK wk_err ctl_job_next(ctl_job *j, uint32_t timeout_ms, ctl_job_event *ev);

/*
 * Like ctl_job_next() without waiting: WK_ETIMEDOUT when nothing is there,
 * and then the consumer counts as asleep until the next event or
 * publication, which calls the job's waker once (ctl_job_set_waker). For a
 * consumer that is not a thread of its own (an event loop).
 */
WK_MUST_CHECK wk_err ctl_job_poll(ctl_job *j, ctl_job_event *ev);

/* Wakes a consumer that polls (ctl_job_poll); must not block or call into j. */
typedef void (*ctl_job_waker_fn)(void *arg);

/*
 * Sets the consumer's wake-up: fn(arg) instead of the semaphore that
 * ctl_job_next() sleeps on. Called by the step loop or a thread that posts
 * an event, at most once per ctl_job_poll() that found nothing, with no
 * job lock held; arg must stay valid until ctl_job_free() returns. Set it
 * before the first ctl_job_poll().
 */
void ctl_job_set_waker(ctl_job *j, ctl_job_waker_fn fn, void *arg);

/*
 * Constrained decoding: the tokens the next sample may take (copied; NULL or
 * n 0 = any), sent with the row's sampling parameters. Call it between a
 * TOKEN event and ctl_job_continue(). WK_ENOMEM leaves the old mask.
 */
WK_MUST_CHECK wk_err ctl_job_set_allowed(ctl_job *j, const uint8_t *mask, size_t n);

typedef enum ctl_job_decision {
    CTL_JOB_CONTINUE = 0, /* feed the token next step and sample on */
    CTL_JOB_STOP,         /* drop the token; the job is done */
    CTL_JOB_STOP_FEED,    /* feed the token, then the job is done */
} ctl_job_decision;

/*
 * A token hook: decides on each sampled token ev (type TOKEN), in order, one
 * call at a time. Called by the worker's step loop without the scheduler's
 * lock (the job cannot be freed meanwhile: ctl_job_free() waits), or by the
 * consumer itself for a TOKEN event. It must not block and must not call
 * into the scheduler other than ctl_job_lock/unlock/throttle.
 */
typedef ctl_job_decision (*ctl_job_token_fn)(void *arg, ctl_job *j, const ctl_job_event *ev);

/*
 * Sets j's token hook (before or while it runs). A token sampled before this
 * call still comes as a TOKEN event; the caller decides it (it may call fn
 * itself) with ctl_job_continue/stop.
 */
void ctl_job_set_on_token(ctl_job *j, ctl_job_token_fn fn, void *arg);

/* The job's own lock, guarding what its hook publishes for the consumer. */
void ctl_job_lock(ctl_job *j);

/* Unlocks; publish: the consumer gets a DATA event (woken if it sleeps). */
void ctl_job_unlock(ctl_job *j, bool publish);

/*
 * Back-pressure for hooked jobs: on (from the hook, job lock held): the job
 * is left out of steps, its consumer being too far behind; off (from the
 * consumer, no lock held, after it took what was published): it is stepped
 * again. Cheap when nothing changes.
 */
void ctl_job_throttle(ctl_job *j, bool on);

/* Accepts the last sampled token: it is fed next step and sampling goes on. */
void ctl_job_continue(ctl_job *j);

/*
 * Ends sampling after the last TOKEN event. feed_last: the last sampled token
 * is fed into the state before the job is done (the slot then holds it).
 * A DONE event follows.
 */
void ctl_job_stop(ctl_job *j, bool feed_last);

/* Tokens fed into the slot by this job so far (input + accepted samples). */
size_t ctl_job_fed(const ctl_job *j);

/* Input tokens the job was submitted with. */
size_t ctl_job_n_input(const ctl_job *j);

/* Tokens this job computed itself (for usage accounting). */
size_t ctl_job_computed(const ctl_job *j);

/*
 * Keeps the job's slot after it ends: the slot is no longer freed by
 * ctl_job_free(); the caller owns it (ctl_resid_slot_free later). Valid once
 * the job is DONE. Writes the handle to *out. WK_ESTATE when not done.
 */
WK_MUST_CHECK wk_err ctl_job_keep_slot(ctl_job *j, ctl_slot_ref *out);

/* Cancels (if running) and frees the job; its slot is freed unless kept. NULL-safe. */
void ctl_job_free(ctl_job *j);

/*
 * Eviction has no callback: under pressure (requests wait for a slot and
 * none is free anywhere, or the first waiting request lacks KV pages on a
 * worker) the manager thread has residence free the least recently used
 * clean parked slot under its lock (ctl_resid_hot_evict_clean_locked), or,
 * when only dirty ones could make room, wake ctl_vm's cleaner
 * (ctl_resid_hot_want_clean_locked) and look again when it is done.
 */

/* One busy or allocated slot, for /admin/slots. */
typedef struct ctl_slot_info {
    ctl_slot_ref ref;        /* the slot */
    bool running;            /* a job runs on it */
    bool held;               /* the job runs on a caller-held slot (state op, chat turn) */
    size_t tokens;           /* tokens fed into the slot's state (running jobs: so far) */
    uint64_t last_used_ms;   /* monotonic ms of the job's last token, 0 = none */
} ctl_slot_info;

/*
 * Copies up to cap allocated slots into out; returns how many exist. Slots
 * without a job are reported with running = false (held by the state cache
 * or a caller).
 */
size_t ctl_sched_slots(ctl_sched *s, ctl_slot_info *out, size_t cap);

/*
 * Moves the bytes of src to dst (both allocated by the caller, src's job is
 * paused). Returns WK_OK only when dst verifiably holds src's bytes.
 */
typedef wk_err (*ctl_sched_mover_fn)(void *arg, const ctl_slot_ref *src, const ctl_slot_ref *dst,
                                     wk_diag *d);

/*
 * Live-migrates the running job on slot src to a fresh slot on worker to:
 * the job is left out of steps from the next one on, its in-flight step
 * finishes, mover copies and verifies the bytes, and on success the job's
 * placement switches to the new slot (the old one is freed) before it is
 * scheduled again; on any failure the new slot is freed and the job simply
 * continues on src. WK_ENOENT (no running job there), WK_ESTATE (the job
 * runs on a caller-held slot), WK_EBUSY (no free slot on to), WK_EQUOTA
 * (hybrid: the job's KV pages don't fit to's pool; they are reserved there
 * before mover runs), WK_EINVAL (to is the same worker or unknown).
 * *dst_out receives the new slot.
 */
WK_MUST_CHECK wk_err ctl_sched_migrate_job(ctl_sched *s, const ctl_slot_ref *src, const char *to,
                                           ctl_sched_mover_fn mover, void *arg,
                                           ctl_slot_ref *dst_out, wk_diag *d);

/* Marks a worker as draining: no new admissions or allocations land there. */
WK_MUST_CHECK wk_err ctl_sched_set_draining(ctl_sched *s, const char *worker, bool draining);

/* The connection epoch of worker (changes when its process restarts), 0 when unknown. */
uint64_t ctl_sched_worker_epoch(ctl_sched *s, const char *worker);

/* True when the scheduler steps on worker. */
bool ctl_sched_known(ctl_sched *s, const char *worker);

/* True when worker exists and is draining. */
bool ctl_sched_draining(ctl_sched *s, const char *worker);

/* Workers the scheduler is stepping on (ready in the pool and picked up). */
uint32_t ctl_sched_worker_count(ctl_sched *s);

/*
 * Hybrid models (a KV pool per worker): each allocated slot holds or reserves
 * ceil(n_ctx / page_tokens) pages. A job is admitted (in order) only when a slot
 * and the pages for its final context (tokens already in its state + input
 * + max_new) are free; the reservation shrinks to what the state holds when
 * it ends and goes back when the slot is freed. A job that could never fit
 * the largest pool fails at submit with WK_ETOOBIG. Recurrent models: 0.
 * The tables and their accounting are ctl_resid's (ctl_resid_kv_counts).
 */

/* Jobs waiting for admission and jobs running (for metrics). */
void ctl_sched_depths(ctl_sched *s, uint32_t *waiting, uint32_t *running);

#endif /* CTL_SCHED_H */
