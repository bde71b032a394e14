/*
 * ctl_resid: slot residence, the one table that says what each slot of a
 * worker holds. Slot ids 1..n and their allocation generations (a handle
 * names a slot at one generation, so a stale handle never touches a reused
 * slot), the job running on each, the tokens of context in each state, and
 * the KV page accounting of hybrid models (pages held or reserved per slot,
 * and those of freed slots the worker has not freed yet: "stale" slots,
 * neither allocatable nor free of pages until their SLOT_FREE returns).
 *
 * Below both ctl_sched (admission and the step loop, which asks this table
 * for free slots and page room) and ctl_vm (parked sessions, state cache,
 * eviction, which account what they write into held slots through the
 * scheduler's ctl_sched_slot_* calls): neither keeps its own copy of a
 * slot's residence. Pure data and arithmetic, no RPC, no thread.
 *
 * Locking: a ctl_resid has no lock of its own; the scheduler's mutex guards
 * every table (ctl_sched keeps one per worker). The controller's lock order,
 * outermost first:
 *   ctl_chat_active.mu   (session keys; released before anything below)
 *   ctl_ckpt.pass_mu -> ctl_ckpt.mu
 *   ctl_sched.mu         (every ctl_resid table)
 *   ctl_job.mu           (one job's events)
 * ctl_vm's entry mutex is a leaf: never held across a call into ctl_sched,
 * ctl_ckpt or the pool, and nothing is called while holding it; ctl_pool's
 * mutex is a leaf too. A worker's epoch (whether its memory, slots and warm
 * copies, is still the one a residence record was made in) comes from the
 * pool (ctl_pool_worker_epoch), which owns the connections.
 */
#ifndef CTL_RESID_H
#define CTL_RESID_H

#include <stdbool.h>
#include <stdint.h>

#include "ctl_kv.h"
#include "wk_err.h"

struct ctl_job;

/* One worker's slots. Fields are read directly by the scheduler (under its lock). */
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

#endif /* CTL_RESID_H */
