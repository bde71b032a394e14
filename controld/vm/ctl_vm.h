/*
 * ctl_vm: state bytes and where they live. The hypervisor's memory manager.
 *
 * Durable states are immutable, content-addressed blobs in the store (cold
 * tier). A worker slot holding a blob's bytes is a hot cache entry for it,
 * keyed by the blob's hex digest, so fork, snapshot and rollback never copy
 * bytes, and a generation copies the cached slot into a scratch slot on the
 * worker (SlotCopy) before it runs. Chat sessions park in slots as dirty
 * entries keyed by the session key (write-back). The hot index (which
 * slot, LRU, clean or dirty, taken, spilling) is the residence directory's
 * (ctl_resid_hot_*), which also chooses eviction victims. An entry is clean
 * when a copy its next use resumes from as fast exists (ctl_resid.h): a
 * cached state's warm copy on its worker, a session's live end-of-reply
 * checkpoint (ctl_vm_set_backing) or its spill; freeing a clean entry's
 * slot needs no I/O, so the scheduler has residence do it under its lock.
 * ctl_vm's cleaner thread makes entries clean while they stay in their
 * slots: idle sessions are spilled ahead of time, and when admission finds
 * only dirty victims it asks the cleaner for the least recently used one
 * (a warm copy for a cached state; a spill for a session, none when its
 * checkpoint is live). ctl_vm's own evictions (ctl_vm_slot_get, the KV
 * room of a write) take a clean victim first and clean a dirty one
 * themselves.
 *
 * Slot I/O (read, write, copy, reset) goes through the pool as
 * SlotRead/SlotWrite/SlotCopy/SlotReset RPCs in chunks of at most 4 MiB; the
 * worker runs them between steps, never during one.
 *
 * Residence: what a slot is (valid at its generation, its context, its KV
 * pages; allocation, release, waiting for one) is asked of the residence
 * directory (ctl_resid_slot_*) directly; ctl_vm never calls the scheduler.
 * Warm-tier RPCs are the pool's (ctl_pool_host_call).
 *
 * Threading: all functions are thread-safe; the hot index is the residence
 * directory's (under its mutex); ctl_vm's own mutex guards its callbacks and
 * the cleaner's settings, and is never held across an RPC or a call
 * into ctl_resid. The cleaner is a thread of its own, started by
 * ctl_vm_new() (with a residence directory) and stopped and joined by
 * ctl_vm_flush() (after its cleaning in progress ends), or by ctl_vm_free()
 * when no flush came first. It calls the spill and backing callbacks, so
 * flush before freeing what they use (ctl_ckpt_free()).
 */
#ifndef CTL_VM_H
#define CTL_VM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctl_pool.h"
#include "ctl_resid.h"
#include "ctl_sched.h"
#include "ctl_store.h"
#include "wk_err.h"

typedef struct ctl_vm ctl_vm;

/* Called to spill a dirty entry: store bytes durably and record where. */
typedef wk_err (*ctl_vm_spill_fn)(void *arg, const char *key, const void *bytes, size_t len,
                                  wk_diag *d);

/*
 * A hot cache over the borrowed pool, residence directory (NULL: slot I/O
 * only, no cache and no cleaner thread) and store. WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_vm_new(ctl_pool *pool, ctl_resid_dir *resid, ctl_store *store,
                                ctl_vm **out, wk_diag *d);
void ctl_vm_free(ctl_vm *vm);

/*
 * Spills parked sessions idle for longer than idle_ms to the store, from
 * the cleaner thread; 0 disables. Also keeps at most max_dirty sessions hot
 * that are not spilled (0 = no cap), spilling the least recently used
 * beyond it. A spilled session keeps its slot (clean: an eviction frees it
 * with no I/O, and its next turn reads the spill) and survives its
 * worker's memory.
 */
WK_MUST_CHECK wk_err ctl_vm_set_idle_spill(ctl_vm *vm, uint64_t idle_ms, uint32_t max_dirty);

/*
 * Deadline of one slot I/O request (read, write, copy, verify) in ms; a
 * migration or spill to a worker that does not answer aborts after it.
 * Call once at startup. 0 restores the default (60 s).
 */
void ctl_vm_set_rpc_timeout(ctl_vm *vm, uint32_t ms);

/*
 * That deadline (ctl_ckpt sends its warm-tier requests under the same, read
 * once when it is created: set it before ctl_ckpt_new). vm NULL: the default.
 */
uint32_t ctl_vm_rpc_timeout(const ctl_vm *vm);

/* How long ctl_vm_slot_get() waits for a running request to free a slot (0 = not at all). */
void ctl_vm_set_slot_wait(ctl_vm *vm, uint64_t ms);

/* Shutdown: slot waits end (within 50 ms) and no new one starts. */
void ctl_vm_end_waits(ctl_vm *vm);

/* Registers the spill function for dirty entries (sessions). */
void ctl_vm_set_spill(ctl_vm *vm, ctl_vm_spill_fn fn, void *arg);

/*
 * Whether the bytes of a dirty entry also live elsewhere: backing is the key
 * given to ctl_vm_put_backed() (an end-of-reply checkpoint's key). True
 * when that copy can still be loaded. Called with no ctl_vm lock held; it
 * must not call into ctl_vm.
 */
typedef bool (*ctl_vm_backed_fn)(void *arg, const char *backing);

/*
 * Registers the backing check (ctl_ckpt does, for its checkpoints); NULL
 * removes it. A session whose backing is live is clean: under slot pressure
 * it gives its slot up without a spill (the next turn resumes the backing
 * copy). Idle spills, ctl_vm_evict_slot() and ctl_vm_flush() still spill it
 * (they are for durability, not room).
 */
void ctl_vm_set_backing(ctl_vm *vm, ctl_vm_backed_fn fn, void *arg);

/*
 * The backing check's other half: checkpoint backing is losing a tier (its
 * warm copy or its disk record is about to be dropped), so sessions backed
 * by it turn dirty (ctl_resid_hot_unback) until the cleaner finds the
 * checkpoint live again or spills them. ctl_ckpt calls it under its mutex,
 * before the drop; it takes only the directory's mutex (ckpt.mu before
 * resid_dir.mu in the lock order).
 */
void ctl_vm_backing_gone(ctl_vm *vm, const char *backing);

/*
 * Gets a free slot, evicting LRU idle entries when none is free. worker:
 * preferred worker or NULL. When every slot runs a request, waits up to the
 * slot wait (ctl_vm_set_slot_wait) for one to end; WK_ENOSPC past it.
 */
WK_MUST_CHECK wk_err ctl_vm_slot_get(ctl_vm *vm, const char *worker, ctl_slot_ref *out,
                                     wk_diag *d);

/*
 * Evicts one LRU idle entry (residence's choice). Returns WK_OK when a slot
 * was freed, WK_ENOENT when none.
 */
WK_MUST_CHECK wk_err ctl_vm_evict_one(ctl_vm *vm);


/* Slot I/O. bytes: caller frees with free(). */
WK_MUST_CHECK wk_err ctl_vm_slot_read(ctl_vm *vm, const ctl_slot_ref *ref, void **bytes,
                                      size_t *len, wk_diag *d);
WK_MUST_CHECK wk_err ctl_vm_slot_write(ctl_vm *vm, const ctl_slot_ref *ref, const void *bytes,
                                       size_t len, wk_diag *d);
WK_MUST_CHECK wk_err ctl_vm_slot_reset(ctl_vm *vm, const ctl_slot_ref *ref, wk_diag *d);

/*
 * ctl_vm_slot_write() without the KV page accounting: for a slot whose job
 * already reserved the pages of its whole context (a scheduler load hook).
 */
WK_MUST_CHECK wk_err ctl_vm_slot_write_raw(ctl_vm *vm, const ctl_slot_ref *ref, const void *bytes,
                                           size_t len, wk_diag *d);

/* Reads the bytes of warm-tier entry key on worker. bytes: caller frees with free(). */
WK_MUST_CHECK wk_err ctl_vm_host_read(ctl_vm *vm, const char *worker, const char *key,
                                      void **bytes, size_t *len, wk_diag *d);

/*
 * Reads bytes [off, off + len) of warm-tier entry key on worker into out.
 * *total gets the entry's size (may be NULL). WK_EINVAL when the range is
 * not inside the entry, WK_EPROTO on an inconsistent reply.
 */
WK_MUST_CHECK wk_err ctl_vm_host_read_range(ctl_vm *vm, const char *worker, const char *key,
                                            uint64_t off, size_t len, void *out,
                                            uint64_t *total, wk_diag *d);

/*
 * Puts a copy of the bytes of entry key (or, when not cached, of blob hex,
 * "" for none) into the scratch slot dst. WK_ENOENT when neither exists.
 */
WK_MUST_CHECK wk_err ctl_vm_load_into(ctl_vm *vm, const char *key, const char *blob_hex,
                                      const ctl_slot_ref *dst, wk_diag *d);

/*
 * Makes slot (held by the caller, consumed on success) the cache entry for
 * key. dirty: the bytes exist nowhere else (spilled on eviction); not
 * dirty: they are already durable in the store (a stored state's blob),
 * which is what lets the cleaner free its slot when the worker refuses a
 * warm copy. Replaces an older entry for key (its slot is freed).
 */
WK_MUST_CHECK wk_err ctl_vm_put(ctl_vm *vm, const char *key, const ctl_slot_ref *slot,
                                bool dirty, wk_diag *d);

/*
 * ctl_vm_put() of a dirty entry whose bytes also live under backing (or
 * NULL / "": nowhere), e.g. the end-of-reply checkpoint of the turn that
 * parks it (ctl_vm_set_backing).
 */
WK_MUST_CHECK wk_err ctl_vm_put_backed(ctl_vm *vm, const char *key, const ctl_slot_ref *slot,
                                       bool dirty, const char *backing, wk_diag *d);

/*
 * Takes the entry for key out of the cache: *slot is then held by the
 * caller (to run on, then ctl_vm_put again). WK_ENOENT when not cached or
 * its slot went stale (worker restarted), WK_EBUSY when taken already.
 */
WK_MUST_CHECK wk_err ctl_vm_take(ctl_vm *vm, const char *key, ctl_slot_ref *slot);

/* Drops key from the cache (frees its slot; a dirty entry is spilled first). */
void ctl_vm_drop(ctl_vm *vm, const char *key, bool spill);

/*
 * Frees the hot slot of clean entry key, keeping a warm copy in its worker's
 * host memory when the worker has room (else only the blob remains).
 */
void ctl_vm_hibernate(ctl_vm *vm, const char *key);

/* The worker holding a warm copy of key into buf, or NULL when none. */
const char *ctl_vm_warm_worker(ctl_vm *vm, const char *key, char *buf, size_t cap);

/* True when key is cached in a live slot. */
bool ctl_vm_cached(ctl_vm *vm, const char *key);

/*
 * Entries by kind, for metrics: cached states, and parked sessions only in
 * their slots (the hot tier; a spilled session still in its slot is the
 * store's, the cold tier).
 */
void ctl_vm_counts(ctl_vm *vm, uint32_t *states, uint32_t *sessions);

/*
 * Copies src's bytes into dst and has the destination worker confirm them
 * (MIGRATE_RECV: SHA-256 of its slot, compared with the bytes read from the
 * source). Moves *bytes_moved. WK_ECORRUPT on a checksum mismatch.
 */
WK_MUST_CHECK wk_err ctl_vm_transfer(ctl_vm *vm, const ctl_slot_ref *src, const ctl_slot_ref *dst,
                                     uint64_t *bytes_moved, wk_diag *d);

/*
 * Moves the cache entry held in slot src to a new slot on worker to
 * (transfer + verify, then the entry points at the new slot and the old one
 * is freed). WK_ENOENT when src holds no cache entry, WK_EBUSY when it is in
 * use or to has no free slot, WK_EINVAL when to is unknown. *dst_out receives the new slot.
 */
WK_MUST_CHECK wk_err ctl_vm_move(ctl_vm *vm, const ctl_slot_ref *src, const char *to,
                                 ctl_slot_ref *dst_out, uint64_t *bytes_moved, wk_diag *d);

/*
 * ctl_vm_move() with the transfer done by mover (arg passed through; it
 * must leave src intact and return WK_OK only when dst holds verified
 * bytes, e.g. ctl_transport_move): the NCCL-capable path. mover NULL is
 * ctl_vm_move() without the byte count.
 */
WK_MUST_CHECK wk_err ctl_vm_move_with(ctl_vm *vm, const ctl_slot_ref *src, const char *to,
                                      ctl_sched_mover_fn mover, void *arg,
                                      ctl_slot_ref *dst_out, wk_diag *d);

/* Slots of the cache entries on worker (cap entries); returns the count. */
size_t ctl_vm_slots_on(ctl_vm *vm, const char *worker, ctl_slot_ref *out, size_t cap);

/*
 * Describes the entry in slot ref: a parked session (*session true) or a
 * cached state, and its age in uses; false when none.
 */
WK_MUST_CHECK bool ctl_vm_describe(ctl_vm *vm, const ctl_slot_ref *ref, bool *session,
                                   uint64_t *age);

/* Copies the bytes of slot src into slot dst (SlotCopy on one worker, else relayed). */
WK_MUST_CHECK wk_err ctl_vm_copy(ctl_vm *vm, const ctl_slot_ref *src, const ctl_slot_ref *dst,
                                 wk_diag *d);

/* Evicts the entry in slot ref (spilled first when dirty). WK_ENOENT / WK_EBUSY. */
WK_MUST_CHECK wk_err ctl_vm_evict_slot(ctl_vm *vm, const ctl_slot_ref *ref);

/*
 * Shutdown: stops and joins the cleaner (waiting for the cleaning in
 * progress to end, so no spill or backing callback runs after this
 * returns), then spills every parked session not in the store. Called
 * before the callbacks' owners are freed (ctl_ckpt_free()); nothing is
 * cleaned ahead of time afterwards.
 */
void ctl_vm_flush(ctl_vm *vm);

#endif /* CTL_VM_H */
