/*
 * ctl_resid: slot residence, the one table that says what each slot of a
 * worker holds. Slot ids 1..n and their allocation generations (a handle
 * names a slot at one generation, so a stale handle never touches a reused
 * slot), the job running on each, the tokens of context in each state, and
 * the KV page accounting of hybrid models (pages held or reserved per slot,
 * and those of freed slots the worker has not freed yet: "stale" slots,
 * neither allocatable nor free of pages until their SLOT_FREE returns).
 *
 * Two levels. A ctl_resid is one worker's table: pure data and arithmetic,
 * no lock, no RPC. A ctl_resid_dir is the directory of every worker's table
 * and the lock that guards them all, with the slot-handle calls
 * (ctl_resid_slot_*: validity, generation, context, pages, allocation and
 * release, waiting for a slot to free) that ctl_vm and the API make without
 * going through the scheduler. Below both ctl_sched (admission and the step
 * loop, which attaches a table per worker, asks it for free slots and page
 * room, has it evict a clean parked entry under pressure or ask the cleaner
 * for one, and runs the steps) and ctl_vm (the I/O of parked sessions and cached states: slot
 * reads and writes, spills, warm copies, which accounts what it writes into
 * held slots here): neither keeps its own copy of a slot's residence. The
 * directory keeps the hot index (ctl_resid_hot_*: which held slot keeps
 * which bytes, LRU, dirty / taken / spilling) and chooses eviction victims
 * from it. The directory also keeps the
 * warm tier's index (ctl_resid_warm_*): which worker holds a host-memory
 * copy of a clean state, with its context and that worker process's
 * epoch; ctl_vm decides when to put, get and drop copies (the RPCs are the
 * pool's) and records each here.
 *
 * Locking: the directory's mutex guards every attached table, the slot
 * generations and the slot epoch. The scheduler takes the same mutex as its
 * own (ctl_resid_dir_mutex(): its queue and jobs change together with the
 * tables at admission, so they share one lock) and waits on the directory's
 * condition variable, which every slot release broadcasts. *_locked calls
 * need the mutex held; every other ctl_resid_dir / ctl_resid_slot_* call
 * takes it itself, calls nothing outside this module while holding it, and
 * must not be called with it held. The controller's lock order, outermost
 * first:
 *   ctl_chat_active.mu   (session keys; released before anything below)
 *   ctl_ckpt.pass_mu -> ctl_ckpt.mu
 *   ctl_resid_dir.mu     (every ctl_resid table; also the scheduler's s->mu)
 *   ctl_job.mu           (one job's events)
 * The warm index has a mutex of its own, a leaf: taken only inside the
 * ctl_resid_warm_* calls, nothing called while holding it.
 * The hot index is under the directory's mutex; a lookup waiting for an
 * entry's spill or cleaning to end waits on its condition variable (the
 * end, ctl_resid_hot_remove_id or ctl_resid_hot_cleaned, broadcasts). The
 * scheduler's eviction of a clean victim (ctl_resid_hot_evict_clean_locked)
 * and its request to the cleaner (ctl_resid_hot_want_clean_locked) stay
 * inside this module under the mutex; there is no eviction callback. The
 * cleaner (ctl_vm's thread) waits on the same condition variable
 * (ctl_resid_hot_next_clean) and does its I/O with no lock held. Warm-index
 * calls that turn entries dirty take the directory's mutex only after
 * releasing the warm one; ctl_ckpt turns backed entries dirty
 * (ctl_resid_hot_unback) while holding ctl_ckpt.mu, which the order allows.
 * ctl_vm's mutex is a leaf: never held across a call into ctl_resid,
 * ctl_sched, ctl_ckpt or the pool, and nothing is called while holding it;
 * ctl_pool's mutex is a leaf too. A worker's epoch (whether its memory,
 * slots and warm copies, is still the one a residence record was made in)
 * comes from the pool (ctl_pool_worker_epoch), which owns the connections.
 */
#ifndef CTL_RESID_H
#define CTL_RESID_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctl_kv.h"
#include "wk_err.h"

struct ctl_job;
typedef struct ctl_resid_dir ctl_resid_dir;

#define CTL_RESID_MAX_WORKERS 64 /* tables one directory holds */

/* A slot handle: worker, index and the generation it was allocated at. */
typedef struct ctl_slot_ref {
    char worker[65]; /* worker id, "" = none */
    uint32_t slot;   /* 1..n */
    uint64_t gen;    /* allocation generation */
} ctl_slot_ref;

/* One worker's slots. Fields are read directly by the scheduler (under the directory's lock). */
typedef struct ctl_resid {
    uint32_t n;              /* usable slots 1..n */
    uint64_t *gen;           /* per slot: allocation generation, 0 = free */
    struct ctl_job **busy;   /* per slot: job running on it, NULL = none */
    ctl_kv_geom geom;        /* hybrid models: KV geometry, zero otherwise */
    uint32_t *pages;         /* per slot: KV pages held or reserved (0 for recurrent models) */
    uint64_t *ctx;           /* per slot: tokens in its state, when known */
    bool *stale;             /* per slot (hybrid): freed here, its pages not yet freed on the
                              * worker (SLOT_FREE pending); not allocatable until then, and
                              * its pages[] still count as used */
    bool draining;           /* no new allocations without naming the worker, no admissions */
    char worker[65];         /* the worker's id, once attached */
    ctl_resid_dir *dir;      /* the directory it is attached to, NULL = none */
} ctl_resid;

/* A table of n free slots under geom. WK_ENOMEM. */
WK_MUST_CHECK wk_err ctl_resid_init(ctl_resid *t, uint32_t n, const ctl_kv_geom *geom);

/* Frees the arrays; safe on a zeroed or finished table. */
void ctl_resid_fini(ctl_resid *t);

/* True when slot k exists and is allocated at generation gen. */
bool ctl_resid_live(const ctl_resid *t, uint32_t k, uint64_t gen);

/* The first allocatable slot, 0 when none. */
uint32_t ctl_resid_free_slot(const ctl_resid *t);

/* Slots allocated (generation set). */
uint32_t ctl_resid_used(const ctl_resid *t);

/*
 * Pages held or reserved by allocated slots, and those of stale slots (the
 * worker still holds them).
 */
uint32_t ctl_resid_pages_used(const ctl_resid *t);

/* Allocates free slot k at generation gen: no pages, no context, no job. */
void ctl_resid_take(ctl_resid *t, uint32_t k, uint64_t gen);

/*
 * Marks slot k free. A hybrid slot holding KV turns stale and keeps counting
 * its pages until ctl_resid_unstale() (the worker freed them).
 */
void ctl_resid_clear(ctl_resid *t, uint32_t k);

/* Stale slot k's pages are free on the worker: the slot is allocatable again. */
void ctl_resid_unstale(ctl_resid *t, uint32_t k);

/*
 * Records that live slot k now holds n_ctx tokens (worker names the worker
 * in messages): its pages become ceil(n_ctx / page_tokens) when no job runs
 * on it (a running job's reservation only grows). WK_ETOOBIG when n_ctx
 * needs more pages than the whole pool, WK_EQUOTA when the pool has no room
 * for the growth now (nothing changed either way).
 */
WK_MUST_CHECK wk_err ctl_resid_set_ctx(ctl_resid *t, uint32_t k, uint64_t n_ctx,
                                       const char *worker, wk_diag *d);

/* ---- The directory: every worker's table, one lock ---- */

/* An empty directory. WK_ENOMEM. */
WK_MUST_CHECK wk_err ctl_resid_dir_new(ctl_resid_dir **out);

/* Frees it (no table may be attached any more); NULL is a no-op. */
void ctl_resid_dir_free(ctl_resid_dir *dir);

/* The mutex guarding every table, which the scheduler locks as its own. */
pthread_mutex_t *ctl_resid_dir_mutex(ctl_resid_dir *dir);

/* Its condition variable: broadcast whenever a slot is released or the directory stops. */
pthread_cond_t *ctl_resid_dir_cond(ctl_resid_dir *dir);

/* Ends every ctl_resid_slot_wait() at once, now and later (shutdown). */
void ctl_resid_dir_stop(ctl_resid_dir *dir);

/*
 * Attaches table t as worker's (replacing nothing: the caller detached the
 * worker's previous process first). WK_ENOSPC when CTL_RESID_MAX_WORKERS are
 * attached. Caller holds the mutex.
 */
WK_MUST_CHECK wk_err ctl_resid_dir_attach_locked(ctl_resid_dir *dir, ctl_resid *t,
                                                 const char *worker);

/* Detaches t (its worker left): its handles are no longer valid. Caller holds the mutex. */
void ctl_resid_dir_detach_locked(ctl_resid_dir *dir, ctl_resid *t);

/* worker's attached table, NULL when none. Caller holds the mutex. */
ctl_resid *ctl_resid_dir_find_locked(ctl_resid_dir *dir, const char *worker);

/* A new slot generation (global, never 0). Caller holds the mutex. */
uint64_t ctl_resid_dir_next_gen_locked(ctl_resid_dir *dir);

/* Marks a slot released: bumps the slot epoch and wakes waiters. Caller holds the mutex. */
void ctl_resid_dir_released_locked(ctl_resid_dir *dir);

/* ---- Slot handles, through the directory (each takes the mutex) ---- */

/* True when ref names a live slot (its worker attached, the slot at ref->gen). */
bool ctl_resid_slot_valid(ctl_resid_dir *dir, const ctl_slot_ref *ref);

/*
 * Allocates a free slot on worker (NULL: the first attached worker not
 * draining that has one) for the caller to hold: no pages, no context, no
 * job. WK_ENOSPC when none is free.
 */
WK_MUST_CHECK wk_err ctl_resid_slot_alloc(ctl_resid_dir *dir, const char *worker, ctl_slot_ref *out,
                                          wk_diag *d);

/* Releases a held slot no job runs on. WK_ESTATE when ref is stale or a job runs on it. */
wk_err ctl_resid_slot_free(ctl_resid_dir *dir, const ctl_slot_ref *ref);

/*
 * The slot epoch, bumped whenever a slot may have become free, and a wait
 * for it to move until monotonic ms until_ms (true when it moved).
 */
uint64_t ctl_resid_slot_epoch(ctl_resid_dir *dir);
bool ctl_resid_slot_wait(ctl_resid_dir *dir, uint64_t epoch, uint64_t until_ms);

/* Tokens in the state of live slot ref, 0 when not live or unknown. */
uint64_t ctl_resid_slot_ctx(ctl_resid_dir *dir, const ctl_slot_ref *ref);

/* KV pages held or reserved by live slot ref, 0 when not live or recurrent. */
uint32_t ctl_resid_slot_pages(ctl_resid_dir *dir, const ctl_slot_ref *ref);

/*
 * ctl_resid_set_ctx() on live slot ref: WK_EUNAVAIL when its worker left,
 * WK_ESTATE when ref is stale, else ctl_resid_set_ctx()'s answer.
 */
WK_MUST_CHECK wk_err ctl_resid_slot_set_ctx(ctl_resid_dir *dir, const ctl_slot_ref *ref,
                                            uint64_t n_ctx, wk_diag *d);

/*
 * ctl_resid_slot_set_ctx() from a state image's size (state_bytes + n_ctx *
 * kv_token_bytes) on a hybrid model; nothing on recurrent ones (WK_OK).
 * WK_EINVAL when bytes is not an image of the model.
 */
WK_MUST_CHECK wk_err ctl_resid_slot_set_bytes(ctl_resid_dir *dir, const ctl_slot_ref *ref,
                                              uint64_t bytes, wk_diag *d);

/*
 * Records the context of an idle live slot of a recurrent model (its pages
 * need no accounting; hybrid slots go through ctl_resid_slot_set_ctx()).
 */
void ctl_resid_slot_note_ctx(ctl_resid_dir *dir, const ctl_slot_ref *ref, uint64_t n_ctx);

/* True when worker has an attached table. */
bool ctl_resid_known(ctl_resid_dir *dir, const char *worker);

/* Slots of worker allocated, and its total (0, 0 when unknown). */
void ctl_resid_counts(ctl_resid_dir *dir, const char *worker, uint32_t *used, uint32_t *total);

/* KV pages of worker in use and its pool (0, 0 when unknown or recurrent). */
void ctl_resid_kv_counts(ctl_resid_dir *dir, const char *worker, uint32_t *used, uint32_t *total);

/* worker's KV geometry: true for a hybrid model, else false and *out zeroed. */
WK_MUST_CHECK bool ctl_resid_kv_geom(ctl_resid_dir *dir, const char *worker, ctl_kv_geom *out);

/* ---- The warm tier's index (its own leaf lock) ---- */

#define CTL_RESID_KEY_MAX 160 /* bytes of a warm copy's key, with its NUL */

/*
 * Records that worker (process epoch) holds a warm copy of key with n_ctx
 * tokens of context, the most recently used now. A copy of key indexed on
 * another worker is forgotten and its worker written to prev_worker (cap
 * bytes; "" when none) for the caller to drop there. WK_ENOMEM, WK_EINVAL
 * for a key of CTL_RESID_KEY_MAX bytes or more.
 */
WK_MUST_CHECK wk_err ctl_resid_warm_put(ctl_resid_dir *dir, const char *key, const char *worker,
                                        uint64_t n_ctx, uint64_t epoch, char *prev_worker,
                                        size_t cap);

/*
 * True when worker holds a copy of key: marks it used and writes its
 * context to *n_ctx.
 */
bool ctl_resid_warm_use(ctl_resid_dir *dir, const char *key, const char *worker, uint64_t *n_ctx);

/*
 * Where a copy of key lives: true with its worker (cap bytes) and that
 * process's epoch, false when none is indexed.
 */
bool ctl_resid_warm_where(ctl_resid_dir *dir, const char *key, char *worker, size_t cap,
                          uint64_t *epoch);

/* Forgets the copy of key (it is gone or being dropped). */
void ctl_resid_warm_forget(ctl_resid_dir *dir, const char *key);

/*
 * Forgets worker's least recently used copy and writes its key to key_out
 * (CTL_RESID_KEY_MAX bytes) for the caller to drop: false when worker has none.
 */
bool ctl_resid_warm_pop_oldest(ctl_resid_dir *dir, const char *worker, char *key_out);

/* Copies indexed (all workers). */
size_t ctl_resid_warm_count(ctl_resid_dir *dir);

/*
 * ---- The hot index (under the directory's mutex) ----
 *
 * Which held slot keeps a parked session or a cached state's bytes (the hot
 * tier), with its LRU clock and flags. ctl_vm puts, pins and removes entries
 * and does their I/O (spills, warm copies, resets); the choice of an
 * eviction victim is made here, next to the slot tables, so the KV pages an
 * entry holds are read under the same lock. Every call copies entries out
 * (an id names one while the caller works on it without the lock). Keys may
 * repeat: a put while an older entry of the key is taken adds a newer one,
 * and lookups by key see the newest.
 *
 * Clean and dirty. An entry is clean when a copy exists that its next use
 * resumes from as fast as it would have before its slot was freed, so its
 * slot can be freed with no I/O at all (the scheduler does so under this
 * lock): a cached state (stored) with a warm copy on its slot's worker; a
 * parked session whose backing checkpoint is live (warm, or on disk: the
 * copy an eviction always resumed from), or whose bytes were spilled to the
 * store. Every entry is put dirty; ctl_vm marks it clean when it finds or
 * makes such a copy (ctl_resid_hot_cleaned, ctl_resid_hot_mark_clean), and
 * only then: a cleaning that could not make one (a warm copy refused, a
 * spill failed) leaves it dirty and frees its slot as an eviction did. When that copy goes (a warm
 * copy dropped from the index here, a backing checkpoint losing a tier:
 * ctl_resid_hot_unback) the entry turns dirty again, and a verdict reached
 * before that no longer counts (`lost`). Dirty entries are cleaned by
 * ctl_vm's cleaner thread: idle sessions ahead of time, and the dirty LRU
 * victim at once when admission finds no clean one
 * (ctl_resid_hot_want_clean_locked, ctl_resid_hot_next_clean).
 */

/* One hot entry. */
typedef struct ctl_resid_hot {
    uint64_t id;                      /* unique in the directory, never 0 */
    char key[CTL_RESID_KEY_MAX];      /* blob hex or session key */
    char backing[CTL_RESID_KEY_MAX];  /* a session: the checkpoint also holding its bytes, "" = none */
    ctl_slot_ref slot;                /* the held slot with the bytes */
    bool stored;                      /* a cached state: its bytes are in the store; its clean
                                       * copy is a warm copy of key on its worker */
    bool spilled;                     /* a session whose bytes were spilled to the store */
    bool dirty;                       /* no copy to resume from as fast yet: cleaned (warm copy,
                                       * spill) before its slot is freed */
    uint64_t lost;                    /* times its clean copy went (see ctl_resid_hot_cleaned) */
    bool taken;                       /* a caller works on it (copy, move, spill) */
    bool spilling;                    /* being cleaned or spilled: lookups wait for the end */
    uint64_t used;                    /* LRU clock */
    uint64_t used_ms;                 /* monotonic ms of the last use */
} ctl_resid_hot;

/*
 * Indexes key's bytes in held slot as the most recently used entry, dirty.
 * stored: a cached state whose bytes the store holds (backing ignored);
 * else a parked session, with backing the checkpoint that also holds them
 * (NULL = none). An older entry of key that no one holds is removed and
 * copied to *old (old->id 0 when none) for the caller to retire; the new one
 * is copied to *out (NULL: not). WK_EINVAL for a key or backing of
 * CTL_RESID_KEY_MAX bytes or more, WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_resid_hot_put(ctl_resid_dir *dir, const char *key,
                                       const ctl_slot_ref *slot, bool stored, const char *backing,
                                       ctl_resid_hot *old, ctl_resid_hot *out);

/*
 * Entry id has a copy to resume from (ctl_vm checked or made it): it turns
 * clean unless that copy was lost since its `lost` was read (lost differs:
 * it stays dirty). spilled: its bytes are now in the store (clean whatever
 * happened). Ends a cleaner's pick (taken, spilling) and wakes waiters:
 * only the caller that picked it (ctl_resid_hot_next_clean) may call it.
 * True when it is clean now.
 */
bool ctl_resid_hot_cleaned(ctl_resid_dir *dir, uint64_t id, uint64_t lost, bool spilled);

/*
 * Entry id has a copy to resume from, found by a caller that did not pick
 * it (ctl_vm_put_backed, right after the put): it turns clean unless that
 * copy was lost since its `lost` was read. Never ends a pick: a cleaner or
 * an eviction that took the entry meanwhile keeps it (taken, spilling)
 * until its own end. True when it is clean now.
 */
bool ctl_resid_hot_mark_clean(ctl_resid_dir *dir, uint64_t id, uint64_t lost);

/*
 * A counter bumped whenever a cleaning or spill ends, an entry turns clean
 * or a slot is released: the scheduler reads it before dropping the mutex
 * and waits for the cleaner only when it has not moved meanwhile (a
 * broadcast it could have missed). Caller holds the mutex.
 */
uint64_t ctl_resid_hot_clean_gen_locked(const ctl_resid_dir *dir);

/*
 * The checkpoint backing is losing a tier (its warm copy or its disk record
 * is being dropped): entries backed by it that were not spilled turn dirty.
 * Called by ctl_ckpt under its own mutex (ckpt.mu before the directory's).
 * Returns how many entries it names.
 */
uint32_t ctl_resid_hot_unback(ctl_resid_dir *dir, const char *backing);

/*
 * Removes the newest entry of key and copies it to *out. wait: first waits
 * while it is being spilled or cleaned (that ends with
 * ctl_resid_hot_remove_id or ctl_resid_hot_cleaned). only_stored: a session
 * stays (WK_ESTATE). WK_ENOENT none, WK_EBUSY taken.
 */
WK_MUST_CHECK wk_err ctl_resid_hot_remove_key(ctl_resid_dir *dir, const char *key, bool wait,
                                              bool only_stored, ctl_resid_hot *out);

/* Removes the entry on slot ref (not taken) and copies it out. WK_ENOENT, WK_EBUSY. */
WK_MUST_CHECK wk_err ctl_resid_hot_remove_slot(ctl_resid_dir *dir, const ctl_slot_ref *ref,
                                               ctl_resid_hot *out);

/* Removes entry id (a spill ended) and wakes those waiting for it. */
void ctl_resid_hot_remove_id(ctl_resid_dir *dir, uint64_t id);

/*
 * Marks the newest entry of key (by_key) or the one on slot ref taken and
 * copies it out; by key it is also used now. WK_ENOENT, WK_EBUSY.
 */
WK_MUST_CHECK wk_err ctl_resid_hot_pin_key(ctl_resid_dir *dir, const char *key,
                                           ctl_resid_hot *out);
WK_MUST_CHECK wk_err ctl_resid_hot_pin_slot(ctl_resid_dir *dir, const ctl_slot_ref *ref,
                                            ctl_resid_hot *out);

/*
 * Ends entry id's pin; moved_to (NULL = stays): its bytes now live in that
 * slot (a cached state moved to another worker turns dirty: its warm copy
 * is on the old one).
 */
void ctl_resid_hot_unpin(ctl_resid_dir *dir, uint64_t id, const ctl_slot_ref *moved_to);

/* The newest entry of key (after waiting for its spill to end): true with its slot. */
bool ctl_resid_hot_find(ctl_resid_dir *dir, const char *key, ctl_slot_ref *slot);

/* The entry on slot ref: true with a copy, and its age in uses since (*age). */
bool ctl_resid_hot_describe(ctl_resid_dir *dir, const ctl_slot_ref *ref, ctl_resid_hot *out,
                            uint64_t *age);

/* Entries clean and dirty. */
void ctl_resid_hot_counts(ctl_resid_dir *dir, uint32_t *clean, uint32_t *dirty);

/*
 * Entries by kind: cached states (stored), and parked sessions not in the
 * store (a spilled one, though still in its slot, is counted by the store).
 */
void ctl_resid_hot_kinds(ctl_resid_dir *dir, uint32_t *states, uint32_t *sessions);

/* Slots of entries on worker: up to cap written to out; returns how many there are. */
size_t ctl_resid_hot_slots_on(ctl_resid_dir *dir, const char *worker, ctl_slot_ref *out,
                              size_t cap);

/*
 * The eviction victim: the least recently used clean entry no one holds, else
 * the least recently used dirty one, on worker (NULL: anywhere). pages > 0
 * (with worker): only entries whose slot holds KV pages, and only when the
 * idle entries there hold at least `pages` together (else evicting cannot
 * make room). A clean entry is removed; a dirty one stays listed, taken and
 * spilling (lookups wait for it), for the caller to clean (spill, warm copy)
 * and then remove (ctl_resid_hot_remove_id). Copied to *out. WK_ENOENT: none.
 */
WK_MUST_CHECK wk_err ctl_resid_hot_victim(ctl_resid_dir *dir, const char *worker,
                                          uint32_t pages, ctl_resid_hot *out);

/*
 * The scheduler's eviction under pressure, with no call out: the least
 * recently used clean entry no one holds (ctl_resid_hot_victim()'s rules
 * otherwise) is removed, copied to *out and its slot freed here at once (a
 * hybrid slot turns stale until the step loop frees its pages, and the
 * scheduler waits for it: ctl_resid_slot_coming_locked); its copy
 * (warm, backing checkpoint, spill) stays where it is. WK_EBUSY when only
 * dirty entries could make room (cleaning them is I/O: ask the cleaner,
 * ctl_resid_hot_want_clean_locked), WK_ENOENT when none could. Caller holds
 * the mutex.
 */
WK_MUST_CHECK wk_err ctl_resid_hot_evict_clean_locked(ctl_resid_dir *dir, const char *worker,
                                                      uint32_t pages, ctl_resid_hot *out);

/*
 * How many slots are on their way back on worker (NULL: any worker not
 * draining): hybrid slots freed here (by ctl_resid_hot_evict_clean_locked
 * or a release) that are stale only until the step loop's SLOT_FREE
 * returns. While they are as many as the requests waiting for a slot, the
 * scheduler waits for them instead of evicting more parked slots for the
 * same requests. Caller holds the mutex.
 */
uint32_t ctl_resid_slot_coming_locked(ctl_resid_dir *dir, const char *worker);

/*
 * Asks the cleaner (ctl_resid_hot_next_clean) to clean the dirty victim
 * ctl_resid_hot_evict_clean_locked(worker, pages) found, and wakes it (and
 * every waiter on the directory's condition variable); nothing while an
 * entry there is being cleaned or spilled (its end makes the room). The
 * request is consumed by the cleaner's next pick: ask again while the
 * pressure lasts. Caller holds the mutex.
 */
void ctl_resid_hot_want_clean_locked(ctl_resid_dir *dir, const char *worker, uint32_t pages);

/*
 * For the cleaner (ctl_vm's thread): waits up to wait_ms (or until *stop)
 * for an entry to clean and marks it taken and spilling (lookups wait for
 * it); copied to *out (true). First the dirty victim admission asked for
 * (*for_room true: make it clean, with no spill when a copy already
 * exists); else the least recently used parked session not in the store
 * (*for_room false: spill it), when it was idle idle_ms (0: never) or more
 * than max_unspilled (0: no cap) are not in the store. The cleaning ends
 * with ctl_resid_hot_cleaned().
 */
bool ctl_resid_hot_next_clean(ctl_resid_dir *dir, uint64_t idle_ms, uint32_t max_unspilled,
                              uint64_t wait_ms, const atomic_bool *stop, ctl_resid_hot *out,
                              bool *for_room);

/* Wakes every waiter on the directory's condition variable (the cleaner's stop). */
void ctl_resid_hot_kick(ctl_resid_dir *dir);

/*
 * Removes a parked session not spilled to the store that no one holds and
 * copies it out (true); false when none (the shutdown's flush spills them).
 */
bool ctl_resid_hot_pop_unspilled(ctl_resid_dir *dir, ctl_resid_hot *out);

#endif /* CTL_RESID_H */
