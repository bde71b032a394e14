/*
 * ctl_vm: the hot cache of state bytes in worker slots (its index and the
 * eviction choice are ctl_resid's), the cleaner that gives each entry a copy
 * to resume from (a spill, a warm copy) so that freeing its slot needs no
 * I/O, and chunked slot I/O over the pool.
 */
#define WK_LOG_MODULE "vm"
#include "ctl_vm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wk_log.h"
#include "wk_time.h"
#include "wk_proto.h"
#include "wk_sha256.h"

#define CTL_VM_RPC_MS 60000 /* default deadline of one slot I/O request */

typedef ctl_resid_hot ctl_vm_entry; /* a hot entry, copied out of the residence directory */

struct ctl_vm {
    ctl_pool *pool;          /* borrowed */
    ctl_resid_dir *resid;    /* borrowed: slot residence (NULL in slot-I/O unit tests) */
    ctl_store *store;        /* borrowed */
    ctl_vm_spill_fn spill;   /* spill function for dirty entries */
    void *spill_arg;         /* its argument */
    ctl_vm_backed_fn backed; /* is a dirty entry's backing copy live? NULL = never */
    void *backed_arg;        /* its argument */
    pthread_mutex_t mu;      /* guards the callbacks and the cleaner's settings */
    uint32_t rpc_ms;         /* deadline of one slot I/O request */
    uint64_t slot_wait_ms;   /* ctl_vm_slot_get() waits this long for a slot */
    atomic_bool no_wait;     /* shutting down: slot waits end at once */
    uint64_t idle_ms;        /* spill sessions idle this long, 0 = never */
    uint32_t max_dirty;      /* most sessions kept hot not spilled, 0 = no cap */
    pthread_t cleaner;       /* the cleaner thread */
    bool cleaner_started;    /* cleaner joinable */
    atomic_bool stop;        /* the cleaner exits */
};

static void *ctl_vm_cleaner_main(void *arg);

wk_err
ctl_vm_new(ctl_pool *pool, ctl_resid_dir *resid, ctl_store *store, ctl_vm **out, wk_diag *d)
{
    (void)d;
    ctl_vm *vm = calloc(1, sizeof(*vm));
    if (vm == NULL)
        return WK_ENOMEM;
    vm->pool = pool;
    vm->resid = resid;
    vm->store = store;
    vm->rpc_ms = CTL_VM_RPC_MS;
    atomic_init(&vm->no_wait, false);
    atomic_init(&vm->stop, false);
    pthread_mutex_init(&vm->mu, NULL);
    if (resid != NULL) {
        if (pthread_create(&vm->cleaner, NULL, ctl_vm_cleaner_main, vm) != 0) {
            pthread_mutex_destroy(&vm->mu);
            free(vm);
            return WK_ENOMEM;
        }
        vm->cleaner_started = true;
    }
    *out = vm;
    return WK_OK;
}

/*
 * Stops the cleaner and joins it: a cleaning in progress ends first (its
 * I/O, its verdict). Called by the thread shutting down (flush, free).
 */
static void
ctl_vm_stop_cleaner(ctl_vm *vm)
{
    if (!vm->cleaner_started)
        return;
    atomic_store(&vm->stop, true);
    ctl_resid_hot_kick(vm->resid);
    pthread_join(vm->cleaner, NULL);
    vm->cleaner_started = false;
}

void
ctl_vm_free(ctl_vm *vm)
{
    if (vm == NULL)
        return;
    ctl_vm_stop_cleaner(vm);
    pthread_mutex_destroy(&vm->mu);
    free(vm);
}

static wk_err ctl_vm_retire(ctl_vm *vm, ctl_vm_entry *e, bool spill);
static wk_err ctl_vm_spill_entry(ctl_vm *vm, ctl_vm_entry *e);
static void ctl_vm_evict_visible(ctl_vm *vm, ctl_vm_entry *e, bool for_room);
/*
 * Evicts the least recently used idle entry (on worker, or anywhere when
 * NULL). pages > 0 (with worker): only entries holding KV pages, and only
 * when the idle entries there hold at least `pages` together.
 */
static wk_err ctl_vm_evict_lru(ctl_vm *vm, const char *worker, uint32_t pages);


wk_err
ctl_vm_set_idle_spill(ctl_vm *vm, uint64_t idle_ms, uint32_t max_dirty)
{
    pthread_mutex_lock(&vm->mu);
    vm->idle_ms = idle_ms;
    vm->max_dirty = max_dirty;
    pthread_mutex_unlock(&vm->mu);
    return WK_OK;
}

void
ctl_vm_set_rpc_timeout(ctl_vm *vm, uint32_t ms)
{
    vm->rpc_ms = ms ? ms : CTL_VM_RPC_MS; /* set once at startup, before any use */
}

uint32_t
ctl_vm_rpc_timeout(const ctl_vm *vm)
{
    return vm != NULL ? vm->rpc_ms : CTL_VM_RPC_MS;
}

void
ctl_vm_set_slot_wait(ctl_vm *vm, uint64_t ms)
{
    vm->slot_wait_ms = ms; /* set once at startup, before any use */
}

void
ctl_vm_end_waits(ctl_vm *vm)
{
    atomic_store(&vm->no_wait, true);
}

void
ctl_vm_set_spill(ctl_vm *vm, ctl_vm_spill_fn fn, void *arg)
{
    pthread_mutex_lock(&vm->mu);
    vm->spill = fn;
    vm->spill_arg = arg;
    pthread_mutex_unlock(&vm->mu);
}

void
ctl_vm_set_backing(ctl_vm *vm, ctl_vm_backed_fn fn, void *arg)
{
    pthread_mutex_lock(&vm->mu);
    vm->backed = fn;
    vm->backed_arg = arg;
    pthread_mutex_unlock(&vm->mu);
}

/* True when session e's bytes live elsewhere (its backing). Called without mu. */
static bool
ctl_vm_backed(ctl_vm *vm, const ctl_vm_entry *e)
{
    if (e->stored || e->backing[0] == '\0')
        return false;
    pthread_mutex_lock(&vm->mu);
    ctl_vm_backed_fn fn = vm->backed;
    void *arg = vm->backed_arg;
    pthread_mutex_unlock(&vm->mu);
    return fn != NULL && fn(arg, e->backing);
}

static wk_err
ctl_vm_call(ctl_vm *vm, const char *worker, wk_msg *req, wk_msg **rep, wk_diag *d)
{
    return ctl_pool_call(vm->pool, worker, req, vm->rpc_ms, rep, d);
}

wk_err
ctl_vm_slot_reset(ctl_vm *vm, const ctl_slot_ref *ref, wk_diag *d)
{
    Wkvm__SlotReset r = WKVM__SLOT_RESET__INIT;
    r.slot = ref->slot;
    wk_msg req = WKVM__ENVELOPE__INIT;
    req.kind = WKVM__KIND__SLOT_RESET;
    req.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_RESET;
    req.slot_reset = &r;
    wk_msg *rep = NULL;
    wk_err err = ctl_vm_call(vm, ref->worker, &req, &rep, d);
    wk_proto_free(rep);
    if (err == WK_OK && vm->resid != NULL &&
        ctl_resid_slot_set_ctx(vm->resid, ref, 0, NULL) != WK_OK)
        wk_log_debug("slot reset: %s/%u went stale", ref->worker, ref->slot); /* a zeroed slot holds no KV pages */
    return err;
}

/*
 * One SLOT_READ of at most want bytes at off of slot's image, or with key
 * ("" = none) of that warm-tier entry: *rep (caller frees) and its slot data
 * in *sd, checked to be one. ctl_vm_call's errors, WK_EPROTO.
 */
static wk_err
ctl_vm_read_chunk(ctl_vm *vm, const char *worker, uint32_t slot, const char *key, uint64_t off,
                  uint32_t want, wk_msg **rep, const Wkvm__SlotData **sd, wk_diag *d)
{
    Wkvm__SlotRead r = WKVM__SLOT_READ__INIT;
    r.slot = slot;
    r.host_key = (char *)key;
    r.offset = off;
    r.length = want;
    wk_msg req = WKVM__ENVELOPE__INIT;
    req.kind = WKVM__KIND__SLOT_READ;
    req.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_READ;
    req.slot_read = &r;
    wk_err err = ctl_vm_call(vm, worker, &req, rep, d);
    if (err != WK_OK)
        return err;
    *sd = (*rep)->slot_data;
    if ((*rep)->payload_case != WKVM__ENVELOPE__PAYLOAD_SLOT_DATA || *sd == NULL) {
        wk_proto_free(*rep);
        *rep = NULL;
        return wk_diag_set(d, WK_EPROTO, "worker %s: a reply without slot data", worker);
    }
    return WK_OK;
}

/* Reads a slot's bytes, or with host_key those of that warm-tier entry. */
static wk_err
ctl_vm_read(ctl_vm *vm, const ctl_slot_ref *ref, const char *host_key, void **bytes, size_t *len,
            wk_diag *d)
{
    uint8_t *buf = NULL;
    uint64_t total = 0, off = 0;
    do {
        wk_msg *rep = NULL;
        const Wkvm__SlotData *sd = NULL;
        wk_err err = ctl_vm_read_chunk(vm, ref->worker, ref->slot,
                                       host_key != NULL ? host_key : "", off, WK_PROTO_CHUNK_MAX,
                                       &rep, &sd, d);
        if (err != WK_OK) {
            free(buf);
            return err;
        }
        if (buf == NULL) {
            total = sd->total_bytes;
            buf = malloc(total ? total : 1);
            if (buf == NULL) {
                wk_proto_free(rep);
                return WK_ENOMEM;
            }
        }
        if (sd->total_bytes != total || sd->offset != off || sd->data.len > total - off ||
            (sd->data.len == 0 && off < total)) {
            wk_proto_free(rep);
            free(buf);
            return wk_diag_set(d, WK_EPROTO, "worker %s: inconsistent slot data", ref->worker);
        }
        memcpy(buf + off, sd->data.data, sd->data.len);
        off += sd->data.len;
        wk_proto_free(rep);
    } while (off < total);
    *bytes = buf;
    *len = (size_t)total;
    return WK_OK;
}

wk_err
ctl_vm_host_read_range(ctl_vm *vm, const char *worker, const char *key, uint64_t off, size_t len,
                       void *out, uint64_t *total, wk_diag *d)
{
    uint8_t *o = out;
    uint64_t at = off, size = UINT64_MAX;
    const uint64_t end = off + len;
    if (end < off || key == NULL || key[0] == '\0')
        return wk_diag_set(d, WK_EINVAL, "no warm entry key, or a range past the end");
    do {
        wk_msg *rep = NULL;
        const Wkvm__SlotData *sd = NULL;
        const uint32_t want =
            end - at < WK_PROTO_CHUNK_MAX ? (uint32_t)(end - at) : WK_PROTO_CHUNK_MAX;
        wk_err err = ctl_vm_read_chunk(vm, worker, 0, key, at, want, &rep, &sd, d);
        if (err != WK_OK)
            return err;
        if (size == UINT64_MAX) {
            size = sd->total_bytes;
            if (end > size) {
                wk_proto_free(rep);
                return wk_diag_set(d, WK_EINVAL, "bytes %llu..%llu of a %llu-byte entry",
                                   (unsigned long long)off, (unsigned long long)end,
                                   (unsigned long long)size);
            }
        }
        if (sd->total_bytes != size || sd->offset != at || sd->data.len > end - at ||
            (sd->data.len == 0 && at < end)) {
            wk_proto_free(rep);
            return wk_diag_set(d, WK_EPROTO, "worker %s: inconsistent slot data", worker);
        }
        memcpy(o + (at - off), sd->data.data, sd->data.len);
        at += sd->data.len;
        wk_proto_free(rep);
    } while (at < end);
    if (total != NULL)
        *total = size;
    return WK_OK;
}

wk_err
ctl_vm_slot_read(ctl_vm *vm, const ctl_slot_ref *ref, void **bytes, size_t *len, wk_diag *d)
{
    return ctl_vm_read(vm, ref, NULL, bytes, len, d);
}

wk_err
ctl_vm_host_read(ctl_vm *vm, const char *worker, const char *key, void **bytes, size_t *len,
                 wk_diag *d)
{
    ctl_slot_ref ref = {.slot = 0};
    snprintf(ref.worker, sizeof(ref.worker), "%s", worker);
    return ctl_vm_read(vm, &ref, key, bytes, len, d);
}

/* KV pages slot ref lacks to hold n_ctx tokens (or an image of bytes when n_ctx is UINT64_MAX). */
static uint32_t
ctl_vm_kv_missing(ctl_vm *vm, const ctl_slot_ref *ref, uint64_t n_ctx, uint64_t bytes)
{
    ctl_kv_geom g;
    if (!ctl_resid_kv_geom(vm->resid, ref->worker, &g))
        return 0;
    if (n_ctx == UINT64_MAX && ctl_kv_image_ctx(&g, bytes, &n_ctx) != WK_OK)
        return 0;
    uint32_t used = 0, total = 0;
    ctl_resid_kv_counts(vm->resid, ref->worker, &used, &total);
    uint64_t need = ctl_kv_pages(&g, n_ctx);
    uint64_t held = ctl_resid_slot_pages(vm->resid, ref);
    uint64_t others = used > held ? used - held : 0;
    if (need <= held || others + need <= total)
        return 0;
    uint64_t miss = others + need - total;
    return miss > UINT32_MAX ? UINT32_MAX : (uint32_t)miss;
}

/*
 * Accounts n_ctx tokens of context (bytes: an image's size, when n_ctx is
 * UINT64_MAX) in slot ref before its image is written: on a hybrid model
 * the slot's KV pages come from the worker's pool, and under page pressure
 * idle entries are evicted (LRU) to make room. WK_EQUOTA ("KV pool full")
 * when nothing more can be evicted.
 */
static wk_err
ctl_vm_kv_reserve(ctl_vm *vm, const ctl_slot_ref *ref, uint64_t n_ctx, uint64_t bytes,
                  wk_diag *d)
{
    if (vm->resid == NULL) /* (unit tests drive slot I/O without a scheduler) */
        return WK_OK;
    for (int tries = 0;; tries++) {
        wk_diag ed = {{0}};
        wk_err err = n_ctx == UINT64_MAX ? ctl_resid_slot_set_bytes(vm->resid, ref, bytes, &ed)
                                         : ctl_resid_slot_set_ctx(vm->resid, ref, n_ctx, &ed);
        /* Only a pool full now can be helped by evicting (never WK_ETOOBIG). */
        uint32_t missing = err == WK_EQUOTA ? ctl_vm_kv_missing(vm, ref, n_ctx, bytes) : 0;
        if (err != WK_EQUOTA || tries >= 1024 || missing == 0 ||
            ctl_vm_evict_lru(vm, ref->worker, missing) != WK_OK) {
            if (err != WK_OK)
                wk_diag_set(d, err, "%s", ed.msg);
            return err;
        }
    }
}

wk_err
ctl_vm_slot_write(ctl_vm *vm, const ctl_slot_ref *ref, const void *bytes, size_t len,
                  wk_diag *d)
{
    wk_err kerr = ctl_vm_kv_reserve(vm, ref, UINT64_MAX, len, d);
    if (kerr != WK_OK)
        return kerr;
    return ctl_vm_slot_write_raw(vm, ref, bytes, len, d);
}

wk_err
ctl_vm_slot_write_raw(ctl_vm *vm, const ctl_slot_ref *ref, const void *bytes, size_t len,
                      wk_diag *d)
{
    size_t off = 0;
    do {
        size_t n = len - off < WK_PROTO_CHUNK_MAX ? len - off : WK_PROTO_CHUNK_MAX;
        Wkvm__SlotWrite w = WKVM__SLOT_WRITE__INIT;
        w.slot = ref->slot;
        w.offset = off;
        w.data.data = (uint8_t *)bytes + off;
        w.data.len = n;
        w.total_bytes = off == 0 ? len : 0; /* the worker sizes the slot (hybrid: KV pages) */
        wk_msg req = WKVM__ENVELOPE__INIT;
        req.kind = WKVM__KIND__SLOT_WRITE;
        req.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_WRITE;
        req.slot_write = &w;
        wk_msg *rep = NULL;
        wk_err err = ctl_vm_call(vm, ref->worker, &req, &rep, d);
        wk_proto_free(rep);
        if (err != WK_OK)
            return err;
        off += n;
    } while (off < len);
    return WK_OK;
}

static wk_err
ctl_vm_slot_copy(ctl_vm *vm, const ctl_slot_ref *src, const ctl_slot_ref *dst, wk_diag *d)
{
    if (strcmp(src->worker, dst->worker) == 0) {
        wk_err kerr =
            ctl_vm_kv_reserve(vm, dst, vm->resid ? ctl_resid_slot_ctx(vm->resid, src) : 0, 0, d);
        if (kerr != WK_OK)
            return kerr;
        Wkvm__SlotCopy c = WKVM__SLOT_COPY__INIT;
        c.src = src->slot;
        c.dst = dst->slot;
        wk_msg req = WKVM__ENVELOPE__INIT;
        req.kind = WKVM__KIND__SLOT_COPY;
        req.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_COPY;
        req.slot_copy = &c;
        wk_msg *rep = NULL;
        wk_err err = ctl_vm_call(vm, src->worker, &req, &rep, d);
        wk_proto_free(rep);
        return err;
    }
    void *bytes = NULL;
    size_t len = 0;
    wk_err err = ctl_vm_slot_read(vm, src, &bytes, &len, d);
    if (err == WK_OK)
        err = ctl_vm_slot_write(vm, dst, bytes, len, d);
    free(bytes);
    return err;
}



/* Forgets a warm copy on worker; best effort (a restarted worker has none). */
static void
ctl_vm_host_drop(ctl_vm *vm, const char *worker, const char *key)
{
    wk_err err =
        ctl_pool_host_call(vm->pool, WKVM__KIND__HOST_DROP, worker, key, 0, vm->rpc_ms, NULL);
    if (err != WK_OK && err != WK_ENOENT)
        wk_log_debug("warm copy not dropped worker=%s key=%.16s: %s", worker, key,
                     wk_strerror(err));
}

/*
 * Keeps a copy of a clean entry's bytes in its worker's host memory before
 * its slot is freed (the warm tier), and records it in the residence
 * directory's warm index. When the worker's budget is full, its least
 * recently used warm copy is dropped and the put retried once. True when
 * the copy was made and indexed; false when the slot went, the worker
 * refused (HOST_PUT failed) or the index could not record it.
 */
static bool
ctl_vm_to_warm(ctl_vm *vm, const ctl_vm_entry *e)
{
    if (!ctl_resid_slot_valid(vm->resid, &e->slot))
        return false;
    wk_err err = ctl_pool_host_call(vm->pool, WKVM__KIND__HOST_PUT, e->slot.worker, e->key,
                                    e->slot.slot, vm->rpc_ms, NULL);
    if (err == WK_ENOSPC) {
        char oldest[CTL_RESID_KEY_MAX];
        if (!ctl_resid_warm_pop_oldest(vm->resid, e->slot.worker, oldest))
            return false;
        ctl_vm_host_drop(vm, e->slot.worker, oldest);
        err = ctl_pool_host_call(vm->pool, WKVM__KIND__HOST_PUT, e->slot.worker, e->key,
                                 e->slot.slot, vm->rpc_ms, NULL);
    }
    if (err != WK_OK) {
        wk_log_debug("no warm copy of key=%.16s on worker=%s: %s", e->key, e->slot.worker,
                     wk_strerror(err));
        return false;
    }
    char prev[65];
    if (ctl_resid_warm_put(vm->resid, e->key, e->slot.worker,
                           ctl_resid_slot_ctx(vm->resid, &e->slot),
                           ctl_pool_worker_epoch(vm->pool, e->slot.worker), prev,
                           sizeof(prev)) != WK_OK) {
        ctl_vm_host_drop(vm, e->slot.worker, e->key); /* (unindexed, it would never be used) */
        return false;
    }
    if (prev[0] != '\0')
        ctl_vm_host_drop(vm, prev, e->key);
    return true;
}

/* Writes a dirty entry's bytes through the spill function. */
static wk_err
ctl_vm_spill_entry(ctl_vm *vm, ctl_vm_entry *e)
{
    wk_err err = WK_OK;
    wk_diag d = {{0}};
    if (ctl_resid_slot_valid(vm->resid, &e->slot)) {
        void *bytes = NULL;
        size_t len = 0;
        ctl_vm_spill_fn fn;
        void *arg;
        pthread_mutex_lock(&vm->mu);
        fn = vm->spill;
        arg = vm->spill_arg;
        pthread_mutex_unlock(&vm->mu);
        err = ctl_vm_slot_read(vm, &e->slot, &bytes, &len, &d);
        if (err == WK_OK && fn != NULL)
            err = fn(arg, e->key, bytes, len, &d);
        free(bytes);
        if (err != WK_OK)
            wk_log_warn("spill failed key=%.16s: %s", e->key, d.msg);
    }
    return err;
}

/*
 * Frees an entry's slot. On a hybrid worker the slot is reset first (it is
 * idle, so in no step): its KV pages are back on the worker and in the
 * scheduler's count when this returns, so a write that evicted it to make
 * room finds them free. (Were the reset to fail, the scheduler's step loop
 * frees them later.) A recurrent worker's slot is freed as it is: whoever
 * takes it next resets or overwrites it, so no RPC (which would wait for the
 * worker's step in flight) delays the waiting request.
 */
static void
ctl_vm_slot_release(ctl_vm *vm, const ctl_slot_ref *ref)
{
    if (vm->resid == NULL)
        return;
    ctl_kv_geom g;
    if (ctl_resid_kv_geom(vm->resid, ref->worker, &g) &&
        (ctl_resid_slot_pages(vm->resid, ref) > 0 || ctl_resid_slot_ctx(vm->resid, ref) > 0) &&
        ctl_vm_slot_reset(vm, ref, NULL) != WK_OK)
        wk_log_debug("slot reset before free failed worker=%s slot=%u", ref->worker, ref->slot);
    (void)ctl_resid_slot_free(vm->resid, ref);
}

/*
 * Frees the slot of an entry that the hot index marked taken + spilling
 * (it stayed findable meanwhile, so lookups waited for its cleaning instead
 * of missing it): a session is spilled first, unless for_room and its
 * backing checkpoint is live (its next turn resumes that copy); a cached
 * state gets a warm copy first. Then it is removed from the index (waking
 * the lookups) and its slot freed.
 */
static void
ctl_vm_evict_visible(ctl_vm *vm, ctl_vm_entry *e, bool for_room)
{
    if (e->stored)
        (void)ctl_vm_to_warm(vm, e); /* (none: its bytes are in the store all the same) */
    else if (e->spilled || (for_room && ctl_vm_backed(vm, e)))
        wk_log_debug("evicting key=%.16s without a spill: %s", e->key,
                     e->spilled ? "spilled" : "backed");
    else
        (void)ctl_vm_spill_entry(vm, e);
    ctl_resid_hot_remove_id(vm->resid, e->id); /* (wakes lookups waiting for the spill) */
    ctl_vm_slot_release(vm, &e->slot);
}

/*
 * Frees the slot of an entry already removed. spill: keep its bytes first
 * (a session not in the store is spilled, a cached state without a warm
 * copy gets one); else they go.
 */
static wk_err
ctl_vm_retire(ctl_vm *vm, ctl_vm_entry *e, bool spill)
{
    wk_err err = WK_OK;
    if (spill && e->stored && e->dirty)
        (void)ctl_vm_to_warm(vm, e); /* (none: its bytes are in the store all the same) */
    else if (spill && !e->stored && !e->spilled)
        err = ctl_vm_spill_entry(vm, e);
    ctl_vm_slot_release(vm, &e->slot);
    return err;
}

/*
 * The cleaner's work on an entry residence marked taken + spilling
 * (ctl_resid_hot_next_clean): gives it a copy to resume from, keeping its
 * slot. A cached state gets a warm copy; a session picked for room whose
 * backing checkpoint is live needs nothing; any other session is spilled
 * to the store. Clean only once that copy exists. A cached state the
 * worker refuses a warm copy (HOST_PUT failed: no host budget, the worker
 * restarted) stays dirty, and since only admission asks for cached states
 * (for room) and asking again would fail again, its slot is freed as an
 * eviction did: its bytes are in the store, its next use loads them from
 * there. A spill that fails frees the entry's slot the same way (the
 * session then falls back to its checkpoints).
 */
static void
ctl_vm_clean(ctl_vm *vm, ctl_vm_entry *e, bool for_room)
{
    if (e->stored) {
        if (!ctl_vm_to_warm(vm, e)) {
            wk_log_debug("evicting key=%.16s worker=%s slot=%u: no warm copy, still dirty",
                         e->key, e->slot.worker, e->slot.slot);
            ctl_resid_hot_remove_id(vm->resid, e->id);
            ctl_vm_slot_release(vm, &e->slot);
        } else if (!ctl_resid_hot_cleaned(vm->resid, e->id, e->lost, false)) {
            wk_log_debug("warm copy of key=%.16s lost while made: still dirty", e->key);
        }
        return;
    }
    if (for_room && ctl_vm_backed(vm, e) && ctl_resid_hot_mark_clean(vm->resid, e->id, e->lost)) {
        /* clean: only now does the pick end (a dirty verdict keeps it for the spill below) */
        (void)ctl_resid_hot_cleaned(vm->resid, e->id, e->lost, false);
        return;
    }
    wk_log_info("spilling %s session key=%.16s worker=%s slot=%u", for_room ? "evictable" : "idle",
                e->key, e->slot.worker, e->slot.slot);
    if (ctl_vm_spill_entry(vm, e) == WK_OK) {
        (void)ctl_resid_hot_cleaned(vm->resid, e->id, e->lost, true);
        return;
    }
    ctl_resid_hot_remove_id(vm->resid, e->id);
    ctl_vm_slot_release(vm, &e->slot);
}

static void *
ctl_vm_cleaner_main(void *arg)
{
    ctl_vm *vm = arg;
    pthread_setname_np(pthread_self(), "wkc-vm"); /* for the CPU metric */
    while (!atomic_load(&vm->stop)) {
        pthread_mutex_lock(&vm->mu); /* (a leaf: never held into ctl_resid) */
        uint64_t idle_ms = vm->idle_ms;
        uint32_t max_dirty = vm->max_dirty;
        pthread_mutex_unlock(&vm->mu);
        ctl_vm_entry e;
        bool for_room = false;
        if (ctl_resid_hot_next_clean(vm->resid, idle_ms, max_dirty, 200, &vm->stop, &e,
                                     &for_room))
            ctl_vm_clean(vm, &e, for_room);
    }
    return NULL;
}

wk_err
ctl_vm_evict_one(ctl_vm *vm)
{
    return ctl_vm_evict_lru(vm, NULL, 0);
}

static wk_err
ctl_vm_evict_lru(ctl_vm *vm, const char *worker, uint32_t pages)
{
    /* The victim is the residence directory's choice (LRU, clean ones first). */
    ctl_vm_entry v;
    if (vm->resid == NULL || ctl_resid_hot_victim(vm->resid, worker, pages, &v) != WK_OK)
        return WK_ENOENT;
    if (v.dirty) {
        /*
         * A dirty entry stays visible while it is cleaned, so a turn arriving
         * meanwhile waits for the spill and then resumes from it, instead of
         * finding the session nowhere.
         */
        ctl_vm_evict_visible(vm, &v, true);
        return WK_OK;
    }
    wk_log_debug("evicting key=%.16s clean worker=%s slot=%u", v.key, v.slot.worker,
                 v.slot.slot);
    ctl_vm_slot_release(vm, &v.slot); /* (its copy stays: warm, backing or spilled) */
    return WK_OK;
}

/* One try: a free slot (worker first), else evict LRU idle entries. */
static wk_err
ctl_vm_slot_try(ctl_vm *vm, const char *worker, ctl_slot_ref *out)
{
    for (int tries = 0; tries < 1024; tries++) {
        if (ctl_resid_slot_alloc(vm->resid, worker, out, NULL) == WK_OK)
            return WK_OK;
        if (worker != NULL && ctl_resid_slot_alloc(vm->resid, NULL, out, NULL) == WK_OK)
            return WK_OK;
        if (ctl_vm_evict_one(vm) != WK_OK)
            break;
    }
    return WK_ENOSPC;
}

/*
 * When every slot runs a request, waits for one to end (as a chat request
 * waits in the scheduler's queue) for up to slot_wait_ms: woken when a slot
 * is freed, and every 50 ms, since a request that ends parks its slot as an
 * idle entry, which frees nothing until it is evicted.
 */
wk_err
ctl_vm_slot_get(ctl_vm *vm, const char *worker, ctl_slot_ref *out, wk_diag *d)
{
    uint64_t until = wk_mono_ms() + vm->slot_wait_ms;
    for (;;) {
        uint64_t epoch = ctl_resid_slot_epoch(vm->resid);
        if (ctl_vm_slot_try(vm, worker, out) == WK_OK)
            return WK_OK;
        uint64_t now = wk_mono_ms();
        if (now >= until || atomic_load(&vm->no_wait))
            break;
        (void)ctl_resid_slot_wait(vm->resid, epoch, now + 50 < until ? now + 50 : until);
        if (atomic_load(&vm->no_wait))
            break; /* shutting down: no new work, even on a slot freed meanwhile */
    }
    return wk_diag_set(d, WK_ENOSPC, "no free state slot (all slots are running requests)");
}

wk_err
ctl_vm_put(ctl_vm *vm, const char *key, const ctl_slot_ref *slot, bool dirty, wk_diag *d)
{
    return ctl_vm_put_backed(vm, key, slot, dirty, NULL, d);
}

wk_err
ctl_vm_put_backed(ctl_vm *vm, const char *key, const ctl_slot_ref *slot, bool dirty,
                  const char *backing, wk_diag *d)
{
    if (vm->resid == NULL)
        return wk_diag_set(d, WK_ESTATE, "no residence directory");
    ctl_vm_entry old, e;
    wk_err err = ctl_resid_hot_put(vm->resid, key, slot, !dirty, backing, &old, &e);
    if (err == WK_EINVAL)
        return wk_diag_set(d, WK_EINVAL, "cache key too long");
    if (err != WK_OK)
        return err;
    if (old.id != 0)
        (void)ctl_vm_retire(vm, &old, false);
    /*
     * Clean at once when a copy to resume from already exists: a cached
     * state's warm copy on this worker (it was loaded from it), a session's
     * live end-of-reply checkpoint. Else the cleaner makes one when needed.
     */
    char where[65];
    bool copy = e.stored ? ctl_vm_warm_worker(vm, key, where, sizeof(where)) != NULL &&
                               strcmp(where, slot->worker) == 0
                         : ctl_vm_backed(vm, &e);
    if (copy) /* (not a pick of ours: a cleaner or eviction that took it meanwhile keeps it) */
        (void)ctl_resid_hot_mark_clean(vm->resid, e.id, e.lost);
    return WK_OK;
}

wk_err
ctl_vm_take(ctl_vm *vm, const char *key, ctl_slot_ref *slot)
{
    ctl_vm_entry e;
    wk_err err = vm->resid != NULL ? ctl_resid_hot_remove_key(vm->resid, key, true, false, &e)
                                   : WK_ENOENT;
    if (err != WK_OK)
        return err;
    if (!ctl_resid_slot_valid(vm->resid, &e.slot))
        return WK_ENOENT; /* stale: its slot was freed or its worker left; forgotten */
    *slot = e.slot;
    return WK_OK;
}

wk_err
ctl_vm_load_into(ctl_vm *vm, const char *key, const char *blob_hex, const ctl_slot_ref *dst,
                 wk_diag *d)
{
    ctl_vm_entry e;
    if (key != NULL && vm->resid != NULL && ctl_resid_hot_pin_key(vm->resid, key, &e) == WK_OK) {
        wk_err err = WK_ESTATE;
        if (ctl_resid_slot_valid(vm->resid, &e.slot))
            err = ctl_vm_slot_copy(vm, &e.slot, dst, d);
        ctl_resid_hot_unpin(vm->resid, e.id, NULL);
        if (err == WK_OK)
            return WK_OK;
        ctl_vm_drop(vm, key, false); /* stale: fall back to the blob */
    }
    /* Warm: a copy in the destination worker's host memory. */
    if (key != NULL) {
        uint64_t warm_ctx = 0;
        bool warm = vm->resid != NULL && ctl_resid_warm_use(vm->resid, key, dst->worker, &warm_ctx);
        if (warm) {
            wk_err kerr = ctl_vm_kv_reserve(vm, dst, warm_ctx, 0, d);
            if (kerr != WK_OK)
                return kerr;
        }
        if (warm && ctl_pool_host_call(vm->pool, WKVM__KIND__HOST_GET, dst->worker, key, dst->slot,
                                       vm->rpc_ms, NULL) == WK_OK)
            return WK_OK;
        if (warm) /* the worker restarted or dropped it: forget the copy */
            ctl_resid_warm_forget(vm->resid, key);
    }
    if (blob_hex == NULL || blob_hex[0] == '\0')
        return wk_diag_set(d, WK_ENOENT, "the state's bytes are not available");
    void *bytes = NULL;
    size_t len = 0;
    wk_err err = ctl_store_blob_get(vm->store, blob_hex, &bytes, &len, d);
    if (err == WK_OK)
        err = ctl_vm_slot_write(vm, dst, bytes, len, d);
    free(bytes);
    return err;
}

void
ctl_vm_drop(ctl_vm *vm, const char *key, bool spill)
{
    ctl_vm_entry e;
    if (vm->resid != NULL && ctl_resid_hot_remove_key(vm->resid, key, false, false, &e) == WK_OK)
        (void)ctl_vm_retire(vm, &e, spill);
}

const char *
ctl_vm_warm_worker(ctl_vm *vm, const char *key, char *buf, size_t cap)
{
    char worker[65] = "";
    uint64_t epoch = 0;
    if (vm->resid == NULL || !ctl_resid_warm_where(vm->resid, key, worker, sizeof(worker), &epoch))
        return NULL;
    if (epoch == 0 || ctl_pool_worker_epoch(vm->pool, worker) != epoch) {
        /* The worker restarted: its host memory, and the copy, are gone. */
        ctl_resid_warm_forget(vm->resid, key);
        return NULL;
    }
    snprintf(buf, cap, "%s", worker);
    return buf;
}

void
ctl_vm_hibernate(ctl_vm *vm, const char *key)
{
    ctl_vm_entry e;
    if (vm->resid != NULL && ctl_resid_hot_remove_key(vm->resid, key, false, true, &e) == WK_OK)
        (void)ctl_vm_retire(vm, &e, true); /* a cached state: a warm copy, then the slot is freed */
}

void
ctl_vm_backing_gone(ctl_vm *vm, const char *backing)
{
    if (vm != NULL && vm->resid != NULL)
        (void)ctl_resid_hot_unback(vm->resid, backing);
}

bool
ctl_vm_cached(ctl_vm *vm, const char *key)
{
    ctl_slot_ref ref;
    return vm->resid != NULL && ctl_resid_hot_find(vm->resid, key, &ref) &&
           ctl_resid_slot_valid(vm->resid, &ref);
}

void
ctl_vm_counts(ctl_vm *vm, uint32_t *states, uint32_t *sessions)
{
    *states = 0;
    *sessions = 0;
    if (vm->resid != NULL)
        ctl_resid_hot_kinds(vm->resid, states, sessions);
}

wk_err
ctl_vm_transfer(ctl_vm *vm, const ctl_slot_ref *src, const ctl_slot_ref *dst,
                uint64_t *bytes_moved, wk_diag *d)
{
    void *bytes = NULL;
    size_t len = 0;
    wk_err err = ctl_vm_slot_read(vm, src, &bytes, &len, d);
    if (err == WK_OK)
        err = ctl_vm_slot_write(vm, dst, bytes, len, d);
    char want[WK_SHA256_HEX_LEN];
    if (err == WK_OK)
        wk_sha256_hex(bytes, len, want);
    free(bytes);
    if (err != WK_OK)
        return err;
    Wkvm__MigrateRecv mr = WKVM__MIGRATE_RECV__INIT;
    mr.migration_id = "";
    mr.slot = dst->slot;
    wk_msg req = WKVM__ENVELOPE__INIT;
    req.kind = WKVM__KIND__MIGRATE_RECV;
    req.payload_case = WKVM__ENVELOPE__PAYLOAD_MIGRATE_RECV;
    req.migrate_recv = &mr;
    wk_msg *rep = NULL;
    err = ctl_vm_call(vm, dst->worker, &req, &rep, d);
    if (err == WK_OK && strcmp(rep->detail, want) != 0)
        err = wk_diag_set(d, WK_ECORRUPT, "destination checksum %.16s... differs from the "
                          "source's %.16s...", rep->detail, want);
    wk_proto_free(rep);
    if (err == WK_OK && bytes_moved != NULL)
        *bytes_moved = len;
    return err;
}


static wk_err
ctl_vm_move_impl(ctl_vm *vm, const ctl_slot_ref *src, const char *to, ctl_sched_mover_fn mover,
                 void *arg, ctl_slot_ref *dst_out, uint64_t *bytes_moved, wk_diag *d)
{
    ctl_vm_entry e;
    wk_err err = vm->resid != NULL ? ctl_resid_hot_pin_slot(vm->resid, src, &e) : WK_ENOENT;
    if (err != WK_OK)
        return wk_diag_set(d, err, "%s:%u holds no parked state", src->worker, src->slot);
    ctl_slot_ref dst;
    err = ctl_resid_slot_alloc(vm->resid, to, &dst, NULL);
    if (err != WK_OK) {
        err = wk_diag_set(
            d, ctl_resid_known(vm->resid, to) ? WK_EBUSY : WK_EINVAL,
            ctl_resid_known(vm->resid, to) ? "no free slot on worker %s" : "no worker %s", to);
    } else {
        /*
         * An external mover writes dst behind the scheduler's back: reserve
         * its KV pages first, so a failed move gives them back when dst is
         * freed. (The NNG path accounts them with its write.)
         */
        if (mover != NULL)
            err = ctl_vm_kv_reserve(vm, &dst, ctl_resid_slot_ctx(vm->resid, src), 0, d);
        if (err == WK_OK)
            err = mover != NULL ? mover(arg, src, &dst, d)
                                : ctl_vm_transfer(vm, src, &dst, bytes_moved, d);
        if (err != WK_OK)
            (void)ctl_resid_slot_free(vm->resid, &dst);
    }
    ctl_resid_hot_unpin(vm->resid, e.id, err == WK_OK ? &dst : NULL);
    if (err == WK_OK) {
        (void)ctl_resid_slot_free(vm->resid, src);
        *dst_out = dst;
    }
    return err;
}

wk_err
ctl_vm_move(ctl_vm *vm, const ctl_slot_ref *src, const char *to, ctl_slot_ref *dst_out,
            uint64_t *bytes_moved, wk_diag *d)
{
    return ctl_vm_move_impl(vm, src, to, NULL, NULL, dst_out, bytes_moved, d);
}

wk_err
ctl_vm_move_with(ctl_vm *vm, const ctl_slot_ref *src, const char *to, ctl_sched_mover_fn mover,
                 void *arg, ctl_slot_ref *dst_out, wk_diag *d)
{
    return ctl_vm_move_impl(vm, src, to, mover, arg, dst_out, NULL, d);
}

wk_err
ctl_vm_copy(ctl_vm *vm, const ctl_slot_ref *src, const ctl_slot_ref *dst, wk_diag *d)
{
    return ctl_vm_slot_copy(vm, src, dst, d);
}

wk_err
ctl_vm_evict_slot(ctl_vm *vm, const ctl_slot_ref *ref)
{
    ctl_vm_entry e;
    wk_err err = vm->resid != NULL ? ctl_resid_hot_remove_slot(vm->resid, ref, &e) : WK_ENOENT;
    if (err == WK_OK)
        (void)ctl_vm_retire(vm, &e, true);
    return err;
}

size_t
ctl_vm_slots_on(ctl_vm *vm, const char *worker, ctl_slot_ref *out, size_t cap)
{
    return vm->resid != NULL ? ctl_resid_hot_slots_on(vm->resid, worker, out, cap) : 0;
}

bool
ctl_vm_describe(ctl_vm *vm, const ctl_slot_ref *ref, bool *session, uint64_t *age)
{
    ctl_vm_entry e;
    if (vm->resid == NULL || !ctl_resid_hot_describe(vm->resid, ref, &e, age))
        return false;
    *session = !e.stored;
    return true;
}

void
ctl_vm_flush(ctl_vm *vm)
{
    /*
     * The cleaner first: it calls the backing and spill callbacks with no
     * lock held, whose owners (ctl_ckpt) are freed after this returns, and
     * an entry it holds (taken) would be skipped below.
     */
    ctl_vm_stop_cleaner(vm);
    ctl_vm_entry e;
    while (vm->resid != NULL && ctl_resid_hot_pop_unspilled(vm->resid, &e))
        (void)ctl_vm_retire(vm, &e, true);
}
