/*
 * ctl_ckpt: checkpoints, the per-owner prefix index and the checkpoint tiers
 * (see ctl_ckpt.h). It must never hold its mutex across an RPC or disk I/O,
 * never give one owner's checkpoint to another, never write a KV tail whose
 * base rows are not the entry's own bytes, and never drop an entry
 * silently: only a budget (counted), a clear, a restarted worker (its warm
 * copies are gone with its memory) or a disk record that can no longer be
 * read (logged) removes one.
 */
#define WK_LOG_MODULE "ckpt"
#include "ctl_ckpt.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_log.h"
#include "wk_proto.h"
#include "wk_time.h"

#define CKPT_BUCKETS 16384u
#define CKPT_MAX_WORKERS 64 /* workers whose warm tiers are budgeted (the scheduler's maximum) */
#define CKPT_HOST_PREFIX "ck:"
#define CKPT_KV_PREFIX "ckpt:"
#define CKPT_META_VERSION "wkvm-ckpt-meta-v1"  /* a disk record holding a whole image */
#define CKPT_META_VERSION2 "wkvm-ckpt-meta-v2" /* one holding its KV past its base's */
#define CKPT_CHAIN_MAX 16u /* disk records a chain of KV tails reads back at most (ckpt_disk_image) */
#define CKPT_FS_RESERVE_PCT 10u      /* disk checkpoints leave this much of the filesystem free */
#define CKPT_WT_RETRY_MS 5000u       /* write-through pauses this long after a failed write */
#define CKPT_ROOM_TRIES 64u          /* warm copies a refused checkpoint may displace */

static const char *const ckpt_kind_names[CTL_CKPT_KIND__COUNT] = {"prompt", "boundary",
                                                                  "interval", "reply"};
static const char *const ckpt_hit_names[CTL_CKPT_HIT__COUNT] = {"parent_bound", "prefix",
                                                                "checkpoint", "regenerate"};

typedef struct ckpt_entry {
    char key[WK_SHA256_HEX_LEN];        /* SHA-256 of (fp, owner, ids) */
    char owner[CTL_STORE_OWNER_MAX + 1]; /* whose */
    char fp[WK_SHA256_HEX_LEN];         /* model fingerprint */
    int32_t *ids;                       /* tokens the state covers, owned */
    size_t n;                           /* entries in ids */
    uint8_t kind;                       /* ctl_ckpt_kind it was made as */
    bool durable;                       /* written through to disk (a stored response's) */
    char reply[WK_SHA256_HEX_LEN];      /* reply key, "" = none */
    uint64_t bytes;                     /* size of the state image */
    bool warm;                          /* a copy in worker's host memory */
    char worker[65];                    /* that worker */
    uint64_t epoch;                     /* its connection epoch at the put */
    bool cold;                          /* a disk record exists */
    bool saving;                        /* being written: not usable yet */
    bool snapping;                      /* saving: copied by a worker inside a step (bytes
                                           set: its image's size) */
    bool busy;                          /* the tier thread moves it */
    bool dropping;                      /* its warm copy is being dropped (HOST_DROP, or a
                                         * demotion's disk write first): not live from the
                                         * warm tier meanwhile (ctl_ckpt_live) */
    bool doomed;                        /* cleared while pinned: removed at the last unpin */
    uint64_t id;                        /* this entry, unique in the index's life (a key can
                                           come back as another entry with other bytes) */
    char lin[WK_SHA256_HEX_LEN];        /* the checkpoint its state was resumed from, "" = none
                                           known: its KV rows below lin_n are that one's bytes */
    uint64_t lin_id;                    /* that entry's id */
    size_t lin_n;                       /* that checkpoint's tokens */
    char blob[WK_SHA256_HEX_LEN];       /* digest of its disk record's bytes, "" = none known */
    char base[WK_SHA256_HEX_LEN];       /* disk: the record holding its KV rows below base_n,
                                           "" = its record is the whole image */
    uint64_t base_id;                   /* that entry's id */
    char base_blob[WK_SHA256_HEX_LEN];  /* that record's digest (checked at every read) */
    size_t base_n;                      /* tokens of KV its record leaves to base's chain */
    uint8_t depth;                      /* records below its own in that chain */
    uint32_t deps;                      /* disk records whose base it is (it stays on disk) */
    uint64_t dbytes;                    /* bytes of its disk record (cold) */
    uint32_t pins;                      /* lookups using it */
    uint64_t used;                      /* LRU clock at the last use */
    struct ckpt_entry *next;            /* all entries */
    struct ckpt_entry *hnext;           /* key hash chain */
    struct ckpt_entry *rnext;           /* reply hash chain */
} ckpt_entry;

struct ctl_ckpt {
    ctl_ckpt_config cfg;              /* copied */
    ctl_pool *pool;                   /* borrowed */
    ctl_sched *sched;                 /* borrowed */
    ctl_vm *vm;                       /* borrowed: slot I/O, warm-tier reads */
    uint32_t rpc_ms;                  /* deadline of one warm-tier request (ctl_vm's) */
    ctl_store *store;                 /* borrowed: the disk tier */
    ctl_metrics *metrics;             /* borrowed, may be NULL */
    pthread_mutex_t pass_mu;          /* one maintenance pass at a time (the tier thread's,
                                         ctl_ckpt_maintain()'s): an entry being demoted still
                                         counts against its budget while mu is dropped, so two
                                         passes at once evicted twice for one excess.
                                         Taken before mu, never while holding it */
    pthread_mutex_t mu;               /* guards everything below */
    pthread_cond_t cv;                /* wakes the tier thread */
    ckpt_entry *entries;              /* all entries */
    ckpt_entry *by_key[CKPT_BUCKETS]; /* key hash */
    ckpt_entry *by_reply[CKPT_BUCKETS]; /* reply hash */
    size_t n_entries;                 /* entries */
    uint64_t clock;                   /* LRU clock */
    uint64_t next_id;                 /* the last entry id given (ckpt_link_locked) */
    uint64_t warm_total;              /* bytes of warm entries, all workers */
    uint64_t disk_total;              /* bytes of disk entries */
    size_t n_warm, n_disk;            /* entries per tier */
    uint64_t lookups, hits, misses;   /* lookup outcomes */
    uint64_t evicted[2];              /* by the warm / disk budget */
    bool stop;                        /* the tier thread exits */
    bool kick;                        /* work for the tier thread */
    uint64_t wt_retry_ms;             /* write-through waits until this monotonic ms after a
                                         failed write (a full disk is not retried every tick) */
    pthread_t thr;                    /* tier thread */
    bool thr_started;                 /* thr joinable */
};

/* A best-effort cleanup's result: logged at debug level, never fatal. */
static void
ckpt_cleanup(wk_err err, const char *what)
{
    if (err != WK_OK && err != WK_ENOENT)
        wk_log_debug("checkpoint cleanup %s: %s", what, wk_strerror(err));
}

/* ------------------------------------------------------------ keys ---- */

static uint32_t
ckpt_bucket(const char *hex)
{
    uint32_t h = 0;
    for (int i = 0; i < 8 && hex[i]; i++) {
        char c = hex[i];
        h = h << 4 | (uint32_t)(c >= 'a' ? c - 'a' + 10 : c - '0');
    }
    return h % CKPT_BUCKETS;
}

static void
ckpt_put_str(wk_sha256 *s, const char *str)
{
    uint8_t le[8];
    uint64_t n = strlen(str);
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(n >> (8 * i));
    wk_sha256_update(s, le, 8);
    wk_sha256_update(s, str, n);
}


static wk_err
ckpt_key_start(wk_sha256 *s, const char *fp, const char *owner)
{
    wk_err err = wk_sha256_init(s);
    if (err != WK_OK)
        return err;
    static const char tag[] = "wkvm-ckpt-v1";
    wk_sha256_update(s, tag, sizeof(tag));
    ckpt_put_str(s, fp);
    ckpt_put_str(s, owner);
    return WK_OK;
}

/* hex of s's running digest; s goes on. */
static wk_err
ckpt_key_peek(const wk_sha256 *s, char out[WK_SHA256_HEX_LEN])
{
    wk_sha256 c;
    wk_err err = wk_sha256_copy(&c, s);
    if (err != WK_OK)
        return err;
    uint8_t dg[WK_SHA256_LEN];
    wk_sha256_final(&c, dg);
    wk_sha256_to_hex(dg, out);
    return WK_OK;
}

/*
 * Keys of ids[0..len[i]) for the m increasing lengths len[] into keys[],
 * hashing ids once.
 */
static wk_err
ckpt_keys_at(const char *fp, const char *owner, const int32_t *ids, const size_t *len, size_t m,
             char (*keys)[WK_SHA256_HEX_LEN])
{
    wk_sha256 s = {0};
    wk_err err = ckpt_key_start(&s, fp, owner);
    size_t at = 0;
    for (size_t i = 0; i < m && err == WK_OK; i++) {
        wk_sha256_update_token_ids(&s, ids + at, len[i] - at);
        at = len[i];
        err = ckpt_key_peek(&s, keys[i]);
    }
    wk_sha256_fini(&s);
    return err;
}

/* The key of ids[0..n). */
static wk_err
ckpt_key(const char *fp, const char *owner, const int32_t *ids, size_t n,
         char out[WK_SHA256_HEX_LEN])
{
    return ckpt_keys_at(fp, owner, ids, &n, 1, (char(*)[WK_SHA256_HEX_LEN])out);
}

void
ctl_ckpt_reply_key(const char *fp, const char *owner, const char *rendered, size_t len,
                   char out[WK_SHA256_HEX_LEN])
{
    wk_sha256 s;
    out[0] = '\0';
    if (wk_sha256_init(&s) != WK_OK)
        return;
    static const char tag[] = "wkvm-reply-v1";
    wk_sha256_update(&s, tag, sizeof(tag));
    ckpt_put_str(&s, fp);
    ckpt_put_str(&s, owner);
    wk_sha256_update(&s, rendered, len);
    uint8_t dg[WK_SHA256_LEN];
    wk_sha256_final(&s, dg);
    wk_sha256_to_hex(dg, out);
}

/* ----------------------------------------------------------- index ---- */

static ckpt_entry *
ckpt_find_locked(ctl_ckpt *c, const char *key)
{
    for (ckpt_entry *e = c->by_key[ckpt_bucket(key)]; e != NULL; e = e->hnext) {
        if (strcmp(e->key, key) == 0)
            return e;
    }
    return NULL;
}

static ckpt_entry *
ckpt_find_reply_locked(ctl_ckpt *c, const char *reply)
{
    for (ckpt_entry *e = c->by_reply[ckpt_bucket(reply)]; e != NULL; e = e->rnext) {
        if (strcmp(e->reply, reply) == 0 && !e->saving && !e->doomed && (e->warm || e->cold))
            return e;
    }
    return NULL;
}

static void
ckpt_reply_link_locked(ctl_ckpt *c, ckpt_entry *e)
{
    uint32_t b = ckpt_bucket(e->reply);
    e->rnext = c->by_reply[b];
    c->by_reply[b] = e;
}

static void
ckpt_reply_unlink_locked(ctl_ckpt *c, ckpt_entry *e)
{
    if (e->reply[0] == '\0')
        return;
    for (ckpt_entry **pp = &c->by_reply[ckpt_bucket(e->reply)]; *pp; pp = &(*pp)->rnext) {
        if (*pp == e) {
            *pp = e->rnext;
            break;
        }
    }
    e->rnext = NULL;
}

static void
ckpt_link_locked(ctl_ckpt *c, ckpt_entry *e)
{
    e->id = ++c->next_id;
    uint32_t b = ckpt_bucket(e->key);
    e->hnext = c->by_key[b];
    c->by_key[b] = e;
    if (e->reply[0])
        ckpt_reply_link_locked(c, e);
    e->next = c->entries;
    c->entries = e;
    c->n_entries++;
}

/*
 * Checkpoint e is losing a tier (or the index): parked sessions backed by it
 * turn dirty until the cleaner finds it live again or spills them. Caller
 * holds mu (ckpt.mu before the residence directory's mutex: allowed).
 */
static void
ckpt_gone_locked(ctl_ckpt *c, const ckpt_entry *e)
{
    ctl_vm_backing_gone(c->vm, e->key);
}

/* e's disk record goes: its base no longer serves it. Caller holds mu. */
static void
ckpt_base_release_locked(ctl_ckpt *c, ckpt_entry *e)
{
    if (e->base[0] == '\0')
        return;
    ckpt_entry *b = ckpt_find_locked(c, e->base);
    if (b != NULL && b->id == e->base_id && b->deps > 0) /* (not a later entry of that key) */
        b->deps--;
    e->base[0] = '\0';
    e->base_blob[0] = '\0';
    e->base_id = 0;
    e->base_n = 0;
    e->depth = 0;
}

static void
ckpt_unlink_locked(ctl_ckpt *c, ckpt_entry *e)
{
    ckpt_gone_locked(c, e);
    for (ckpt_entry **pp = &c->by_key[ckpt_bucket(e->key)]; *pp; pp = &(*pp)->hnext) {
        if (*pp == e) {
            *pp = e->hnext;
            break;
        }
    }
    ckpt_reply_unlink_locked(c, e);
    for (ckpt_entry **pp = &c->entries; *pp; pp = &(*pp)->next) {
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    }
    c->n_entries--;
    if (e->warm) {
        c->warm_total -= e->bytes;
        c->n_warm--;
    }
    if (e->cold) {
        c->disk_total -= e->dbytes;
        c->n_disk--;
        ckpt_base_release_locked(c, e);
    }
}

static void
ckpt_entry_free(ckpt_entry *e)
{
    if (e == NULL)
        return;
    free(e->ids);
    free(e);
}

static void
ckpt_host_key(const ckpt_entry *e, char out[8 + WK_SHA256_HEX_LEN])
{
    snprintf(out, 8 + WK_SHA256_HEX_LEN, CKPT_HOST_PREFIX "%s", e->key);
}

/* State-record name of a disk entry: "c" + the key's first 63 digits (64 bytes). */
static void
ckpt_record_name(const char *key, char out[CTL_STORE_NAME_MAX + 1])
{
    snprintf(out, CTL_STORE_NAME_MAX + 1, "c%.63s", key);
}

static void
ckpt_gauges_locked(ctl_ckpt *c)
{
    if (c->metrics == NULL)
        return;
    ctl_metrics_set(c->metrics, "wkvm_state_cache_bytes", "tier=\"warm\"", (double)c->warm_total);
    ctl_metrics_set(c->metrics, "wkvm_state_cache_bytes", "tier=\"disk\"", (double)c->disk_total);
    ctl_metrics_set(c->metrics, "wkvm_state_cache_entries", "tier=\"warm\"", (double)c->n_warm);
    ctl_metrics_set(c->metrics, "wkvm_state_cache_entries", "tier=\"disk\"", (double)c->n_disk);
}

/*
 * Deletes what an unlinked entry still has on a worker and on disk, then
 * frees it. No lock held.
 */
static void
ckpt_finalize(ctl_ckpt *c, ckpt_entry *e, bool drop_warm, bool drop_cold)
{
    if (drop_warm) {
        char hk[8 + WK_SHA256_HEX_LEN];
        ckpt_host_key(e, hk);
        ckpt_cleanup(
            ctl_pool_host_call(c->pool, WKVM__KIND__HOST_DROP, e->worker, hk, 0, c->rpc_ms, NULL),
            "ctl_pool_host_call");
    }
    if (drop_cold) {
        char name[CTL_STORE_NAME_MAX + 1], kv[sizeof(CKPT_KV_PREFIX) + WK_SHA256_HEX_LEN];
        ckpt_record_name(e->key, name);
        snprintf(kv, sizeof(kv), CKPT_KV_PREFIX "%s", e->key);
        wk_err err = ctl_store_state_delete(c->store, CTL_CKPT_OWNER, name, NULL, NULL);
        if (err != WK_OK && err != WK_ENOENT)
            wk_log_warn("cannot delete checkpoint record key=%.16s: %s", e->key,
                        wk_strerror(err));
        ckpt_cleanup(ctl_store_session_delete(c->store, kv, NULL), "ctl_store_session_delete");
    }
    ckpt_entry_free(e);
}

/* Unlinks e and finalizes it (drops its tiers). Caller holds mu; dropped and retaken. */
static void
ckpt_remove_locked(ctl_ckpt *c, ckpt_entry *e)
{
    bool w = e->warm, k = e->cold;
    ckpt_unlink_locked(c, e);
    ckpt_gauges_locked(c);
    pthread_mutex_unlock(&c->mu);
    ckpt_finalize(c, e, w, k);
    pthread_mutex_lock(&c->mu);
}

/* True when the warm copy of e is still in its worker's memory. Caller holds mu. */
static bool
ckpt_warm_live_locked(ctl_ckpt *c, const ckpt_entry *e)
{
    return e->warm && e->epoch != 0 && ctl_pool_worker_epoch(c->pool, e->worker) == e->epoch;
}

/* -------------------------------------------------------- disk tier ---- */

/*
 * Deletes the disk copy of the least recently used disk entry other than
 * self (the whole entry when it has no warm copy). False when there is none
 * to delete. Caller holds mu (dropped and retaken).
 */
static bool
ckpt_disk_evict_lru_locked(ctl_ckpt *c, const ckpt_entry *self)
{
    ckpt_entry *lru = NULL;
    for (ckpt_entry *e = c->entries; e != NULL; e = e->next) {
        if (e->cold && e != self && e->pins == 0 && e->deps == 0 && !e->busy && !e->saving &&
            (lru == NULL || e->used < lru->used))
            lru = e;
    }
    if (lru == NULL)
        return false;
    c->evicted[1]++;
    if (c->metrics != NULL)
        ctl_metrics_add(c->metrics, "wkvm_state_cache_evictions_total", "tier=\"disk\"", 1);
    if (!lru->warm) {
        ckpt_remove_locked(c, lru);
        return true;
    }
    /* Still warm: only its disk copy goes. */
    lru->busy = true;
    lru->cold = false;
    c->disk_total -= lru->dbytes;
    c->n_disk--;
    ckpt_base_release_locked(c, lru);
    char name[CTL_STORE_NAME_MAX + 1], kv[sizeof(CKPT_KV_PREFIX) + WK_SHA256_HEX_LEN];
    ckpt_record_name(lru->key, name);
    snprintf(kv, sizeof(kv), CKPT_KV_PREFIX "%s", lru->key);
    pthread_mutex_unlock(&c->mu);
    ckpt_cleanup(ctl_store_state_delete(c->store, CTL_CKPT_OWNER, name, NULL, NULL),
                 "ctl_store_state_delete");
    ckpt_cleanup(ctl_store_session_delete(c->store, kv, NULL), "ctl_store_session_delete");
    pthread_mutex_lock(&c->mu);
    lru->busy = false;
    return true;
}

/*
 * True when writing need more bytes leaves the data filesystem at least
 * CKPT_FS_RESERVE_PCT percent free: checkpoints are a cache, and the last
 * of the disk belongs to the states and sessions users asked to keep. True
 * when the space can't be read (the write itself then tells).
 */
static bool
ckpt_fs_fits(ctl_ckpt *c, uint64_t need)
{
    uint64_t avail = 0, total = 0;
    if (ctl_store_fs_space(c->store, &avail, &total) != WK_OK)
        return true;
    return avail >= need && avail - need >= total / 100u * CKPT_FS_RESERVE_PCT;
}

/*
 * Makes room for need bytes on disk by deleting least recently used disk
 * entries other than self, within the budget and the filesystem reserve
 * (ckpt_fs_fits). False when it can't. Caller holds mu (dropped and
 * retaken).
 */
static bool
ckpt_disk_room_locked(ctl_ckpt *c, uint64_t need, const ckpt_entry *self)
{
    if (need > c->cfg.disk_bytes)
        return false;
    while (c->disk_total + need > c->cfg.disk_bytes) {
        if (!ckpt_disk_evict_lru_locked(c, self))
            return false;
    }
    while (!ckpt_fs_fits(c, need)) {
        if (!ckpt_disk_evict_lru_locked(c, self))
            return false;
    }
    return true;
}

/*
 * The meta value of a disk entry, one field per line: version, kind, bytes
 * (the whole image), owner, fp, reply; a record of a KV tail (v2) then its
 * base's key, base_n, its depth and the digest of the base's record.
 */
static int
ckpt_meta_format(const ckpt_entry *e, char *out, size_t cap)
{
    if (e->base[0] != '\0')
        return snprintf(out, cap,
                        CKPT_META_VERSION2 "\n%u\n%llu\n%s\n%s\n%s\n%s\n%zu\n%u\n%s\n", e->kind,
                        (unsigned long long)e->bytes, e->owner, e->fp,
                        e->reply[0] ? e->reply : "-", e->base, e->base_n, (unsigned)e->depth,
                        e->base_blob);
    return snprintf(out, cap, CKPT_META_VERSION "\n%u\n%llu\n%s\n%s\n%s\n", e->kind,
                    (unsigned long long)e->bytes, e->owner, e->fp, e->reply[0] ? e->reply : "-");
}

/*
 * The fixed part and the bytes a token of KV adds to an image (the worker's
 * geometry); false for a model without KV (an image is all fixed part) or
 * when no worker told.
 */
static bool
ckpt_geom(ctl_ckpt *c, uint64_t *fixed, uint64_t *per_token)
{
    ctl_worker_view v;
    if (ctl_pool_model_view(c->pool, &v) != WK_OK || v.kv_token_bytes == 0)
        return false;
    *fixed = v.state_bytes;
    *per_token = v.kv_token_bytes;
    return true;
}

/*
 * The base e's disk record may leave its KV rows to: the checkpoint e's
 * state was resumed from (so those rows are that one's bytes, not a
 * recomputation's), on disk, not on its way out, with a chain short enough
 * and both images of the model's geometry. NULL: a whole image. Caller
 * holds mu.
 */
static ckpt_entry *
ckpt_base_pick_locked(ctl_ckpt *c, const ckpt_entry *e, uint64_t F, uint64_t T)
{
    if (e->lin[0] == '\0')
        return NULL;
    ckpt_entry *b = ckpt_find_locked(c, e->lin);
    if (b == NULL || b == e || b->id != e->lin_id || b->blob[0] == '\0' || !b->cold ||
        b->busy || b->doomed || b->n != e->lin_n ||
        b->n >= e->n || b->depth + 1u >= CKPT_CHAIN_MAX || strcmp(b->owner, e->owner) != 0 ||
        strcmp(b->fp, e->fp) != 0 || b->bytes != F + T * (uint64_t)b->n ||
        e->bytes != F + T * (uint64_t)e->n)
        return NULL;
    return b;
}

/*
 * Writes e's bytes (read from its warm copy, or given) to the disk tier.
 * When the state was resumed from a checkpoint already on disk
 * (ckpt_base_pick_locked), only its fixed part and the KV rows past that
 * one's go (the rest is read back through the chain, ckpt_disk_image): a
 * turn of a hybrid writes its new tokens' KV, not the whole context's
 * again. Caller holds mu and has set e->busy; dropped and retaken. WK_OK
 * when e is cold afterwards.
 */
static wk_err
ckpt_spill_locked(ctl_ckpt *c, ckpt_entry *e, const void *given, size_t given_len)
{
    if (e->cold)
        return WK_OK;
    uint64_t F = 0, T = 0;
    ckpt_entry *b = NULL;
    if (ckpt_geom(c, &F, &T) && (given == NULL || given_len == e->bytes))
        b = ckpt_base_pick_locked(c, e, F, T);
    if (b != NULL) { /* its record stays while e's takes rows from it (never evicted) */
        b->deps++;
        snprintf(e->base, sizeof(e->base), "%s", b->key);
        snprintf(e->base_blob, sizeof(e->base_blob), "%s", b->blob);
        e->base_id = b->id;
        e->base_n = b->n;
        e->depth = (uint8_t)(b->depth + 1u);
    }
    const bool tail = e->base[0] != '\0'; /* (b is not used past here: mu gets dropped) */
    const uint64_t need = tail ? F + T * (e->n - e->base_n) : e->bytes;
    if (c->cfg.disk_bytes == 0 || !ckpt_disk_room_locked(c, need, e)) {
        ckpt_base_release_locked(c, e);
        return WK_ENOSPC;
    }
    /* Reserve the room now so two spills can't both take it. */
    uint64_t reserved = need;
    c->disk_total += reserved;
    char hk[8 + WK_SHA256_HEX_LEN], worker[65], meta[512];
    ckpt_host_key(e, hk);
    snprintf(worker, sizeof(worker), "%s", e->worker);
    int ml = ckpt_meta_format(e, meta, sizeof(meta)); /* (the reply key may change meanwhile) */
    const uint64_t tail_off = F + T * (uint64_t)e->base_n;
    pthread_mutex_unlock(&c->mu);

    void *bytes = (void *)given;
    size_t len = given_len;
    wk_diag d = {{0}};
    wk_err err = WK_OK;
    if (tail) {
        /* the fixed part, then the rows past the base's */
        len = (size_t)reserved;
        bytes = malloc(len ? len : 1);
        if (bytes == NULL)
            err = WK_ENOMEM;
        else if (given != NULL) {
            memcpy(bytes, given, (size_t)F);
            memcpy((uint8_t *)bytes + F, (const uint8_t *)given + tail_off, len - (size_t)F);
        } else {
            uint64_t total = 0;
            err = ctl_vm_host_read_range(c->vm, worker, hk, 0, (size_t)F, bytes, &total, &d);
            if (err == WK_OK && total != tail_off + (len - F))
                err = wk_diag_set(&d, WK_EPROTO, "warm copy of %llu bytes, %llu expected",
                                  (unsigned long long)total,
                                  (unsigned long long)(tail_off + (len - F)));
            if (err == WK_OK)
                err = ctl_vm_host_read_range(c->vm, worker, hk, tail_off, len - (size_t)F,
                                             (uint8_t *)bytes + F, NULL, &d);
        }
        if (err != WK_OK) { /* (an image not of the geometry's size: write it whole) */
            wk_log_debug("checkpoint key=%.16s: its KV tail not read (%s); the whole image",
                         e->key, d.msg);
            free(bytes);
            bytes = (void *)given;
            len = given_len;
            err = WK_OK;
            pthread_mutex_lock(&c->mu);
            ckpt_base_release_locked(c, e);
            ml = ckpt_meta_format(e, meta, sizeof(meta));
            c->disk_total -= reserved; /* (room for the whole image, within the budget) */
            reserved = 0;
            if (ckpt_disk_room_locked(c, e->bytes, e))
                reserved = e->bytes;
            else
                err = wk_diag_set(&d, WK_ENOSPC, "no room for the whole image");
            c->disk_total += reserved;
            pthread_mutex_unlock(&c->mu);
        }
    }
    if (err == WK_OK && bytes == NULL) {
        err = ctl_vm_host_read(c->vm, worker, hk, &bytes, &len, &d);
    }
    ctl_store_state st;
    memset(&st, 0, sizeof(st));
    snprintf(st.owner, sizeof(st.owner), "%s", CTL_CKPT_OWNER);
    ckpt_record_name(e->key, st.name);
    snprintf(st.fingerprint, sizeof(st.fingerprint), "%s", e->fp);
    ctl_worker_view v;
    if (ctl_pool_model_view(c->pool, &v) == WK_OK && v.family[0] != '\0')
        snprintf(st.family, sizeof(st.family), "%s", v.family);
    else
        snprintf(st.family, sizeof(st.family), "rwkv7");
    st.tokens = e->ids; /* (immutable while busy) */
    st.n_tokens = e->n;
    st.op = CTL_STORE_OP_SESSION;
    st.tier = CTL_STORE_TIER_COLD;
    st.state_bytes = len;
    if (err == WK_OK) {
        ckpt_cleanup(ctl_store_state_delete(c->store, CTL_CKPT_OWNER, st.name, NULL, NULL), "ctl_store_state_delete");
        err = ctl_store_state_put(c->store, &st, bytes, len, NULL, &d);
    }
    char digest[WK_SHA256_HEX_LEN] = ""; /* (what a tail of this record will check) */
    if (err == WK_OK) {
        ctl_store_state back;
        memset(&back, 0, sizeof(back));
        if (ctl_store_state_get(c->store, CTL_CKPT_OWNER, st.name, &back, NULL) == WK_OK)
            snprintf(digest, sizeof(digest), "%s", back.blob);
        ctl_store_state_fini(&back);
    }
    if (err == WK_OK) {
        char kv[sizeof(CKPT_KV_PREFIX) + WK_SHA256_HEX_LEN];
        snprintf(kv, sizeof(kv), CKPT_KV_PREFIX "%s", e->key);
        err = ctl_store_session_put(c->store, kv, meta, (size_t)ml, &d);
        if (err != WK_OK)
            ckpt_cleanup(ctl_store_state_delete(c->store, CTL_CKPT_OWNER, st.name, NULL, NULL), "ctl_store_state_delete");
    }
    if (bytes != given)
        free(bytes);
    if (err != WK_OK)
        wk_log_warn("checkpoint not written to disk key=%.16s: %s", e->key, d.msg);
    pthread_mutex_lock(&c->mu);
    c->disk_total -= reserved;
    if (err == WK_OK) {
        if (e->base[0] == '\0' && len != e->bytes) { /* (the image's real size) */
            if (e->warm)
                c->warm_total = c->warm_total - e->bytes + len;
            e->bytes = len;
        }
        e->cold = true;
        e->dbytes = len;
        snprintf(e->blob, sizeof(e->blob), "%s", digest);
        c->disk_total += e->dbytes;
        c->n_disk++;
        if (c->metrics != NULL) {
            const char *lb = e->base[0] != '\0' ? "record=\"tail\"" : "record=\"image\"";
            ctl_metrics_add(c->metrics, "wkvm_state_cache_disk_writes_total", lb, 1);
            ctl_metrics_add(c->metrics, "wkvm_state_cache_disk_write_bytes_total", lb,
                            (double)len);
        }
    } else {
        ckpt_base_release_locked(c, e);
    }
    return err;
}

/*
 * After the disk tier was read back: a KV tail whose base is missing or does
 * not match (its tokens, owner, model, geometry) is removed, until none is
 * left; then every base counts the tails that take rows from it. Returns
 * how many were removed. No lock held.
 */
static size_t
ckpt_restore_chains(ctl_ckpt *c)
{
    size_t removed = 0;
    pthread_mutex_lock(&c->mu);
    for (bool again = true; again;) {
        again = false;
        for (ckpt_entry *e = c->entries; e != NULL; e = e->next) {
            if (!e->cold || e->base[0] == '\0')
                continue;
            const ckpt_entry *b = ckpt_find_locked(c, e->base);
            bool ok = b != NULL && b != e && b->cold && strcmp(b->blob, e->base_blob) == 0 &&
                      b->n == e->base_n && b->n < e->n &&
                      b->depth < e->depth && strcmp(b->owner, e->owner) == 0 &&
                      strcmp(b->fp, e->fp) == 0 &&
                      memcmp(b->ids, e->ids, b->n * sizeof(*e->ids)) == 0 &&
                      b->bytes < e->bytes && (e->bytes - b->bytes) % (e->n - b->n) == 0;
            if (ok) { /* its record: the fixed part and rows [b->n, e->n) */
                const uint64_t T = (e->bytes - b->bytes) / (e->n - b->n);
                ok = T * b->n < e->bytes && e->dbytes == e->bytes - T * b->n;
            }
            if (!ok) {
                e->base[0] = '\0'; /* (no base to release) */
                ckpt_remove_locked(c, e);
                removed++;
                again = true;
                break; /* (mu was dropped: walk again) */
            }
        }
    }
    for (ckpt_entry *e = c->entries; e != NULL; e = e->next) {
        ckpt_entry *b = e->cold && e->base[0] != '\0' ? ckpt_find_locked(c, e->base) : NULL;
        if (b != NULL) {
            b->deps++;
            e->base_id = b->id;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return removed;
}

/* Reads the disk tier back (startup). */
static void
ckpt_restore(ctl_ckpt *c)
{
    char after[CTL_STORE_SESSION_KEY_MAX + 1] = "";
    size_t restored = 0, dropped = 0;
    for (;;) {
        ctl_store_kv_page page;
        memset(&page, 0, sizeof(page));
        if (ctl_store_session_list(c->store, CKPT_KV_PREFIX, after, 0, true, &page, NULL) !=
            WK_OK)
            break;
        for (size_t i = 0; i < page.n; i++) {
            const char *key = page.items[i].key + strlen(CKPT_KV_PREFIX);
            char meta[512];
            size_t ml = page.items[i].len < sizeof(meta) - 1 ? page.items[i].len : sizeof(meta) - 1;
            if (page.items[i].val != NULL)
                memcpy(meta, page.items[i].val, ml);
            else
                ml = 0;
            meta[ml] = '\0';
            char ver[32] = "", owner[CTL_STORE_OWNER_MAX + 1] = "", fp[WK_SHA256_HEX_LEN] = "",
                 reply[WK_SHA256_HEX_LEN] = "", base[WK_SHA256_HEX_LEN] = "",
                 base_blob[WK_SHA256_HEX_LEN] = "";
            unsigned kind = 0, depth = 0;
            unsigned long long bytes = 0;
            size_t base_n = 0;
            ckpt_entry *e = NULL;
            ctl_store_state st;
            memset(&st, 0, sizeof(st));
            char name[CTL_STORE_NAME_MAX + 1];
            ckpt_record_name(key, name);
            int got = sscanf(
                meta,
                "%31[^\n]\n%u\n%llu\n%128[^\n]\n%64[^\n]\n%64[^\n]\n%64[^\n]\n%zu\n%u\n%64[^\n]\n",
                ver, &kind, &bytes, owner, fp, reply, base, &base_n, &depth, base_blob);
            const bool v2 = strcmp(ver, CKPT_META_VERSION2) == 0;
            bool ok = strlen(key) == WK_SHA256_HEX_LEN - 1 &&
                      (v2 ? got == 10 && strlen(base) == WK_SHA256_HEX_LEN - 1 && base_n > 0 &&
                                depth > 0 && depth < CKPT_CHAIN_MAX &&
                                strlen(base_blob) == WK_SHA256_HEX_LEN - 1
                          : got >= 6 && strcmp(ver, CKPT_META_VERSION) == 0) &&
                      kind < CTL_CKPT_KIND__COUNT &&
                      ctl_store_state_get(c->store, CTL_CKPT_OWNER, name, &st, NULL) == WK_OK &&
                      st.n_tokens > 0 && st.tokens != NULL;
            if (ok) {
                char check[WK_SHA256_HEX_LEN];
                ok = ckpt_key(fp, owner, st.tokens, st.n_tokens, check) == WK_OK &&
                     strcmp(check, key) == 0;
            }
            if (ok && (e = calloc(1, sizeof(*e))) != NULL) {
                snprintf(e->key, sizeof(e->key), "%s", key);
                snprintf(e->owner, sizeof(e->owner), "%s", owner);
                snprintf(e->fp, sizeof(e->fp), "%s", fp);
                if (strcmp(reply, "-") != 0)
                    snprintf(e->reply, sizeof(e->reply), "%s", reply);
                e->kind = (uint8_t)kind;
                e->bytes = v2 ? bytes : st.state_bytes ? st.state_bytes : bytes;
                e->dbytes = st.state_bytes ? st.state_bytes : bytes;
                snprintf(e->blob, sizeof(e->blob), "%s", st.blob);
                if (v2) {
                    snprintf(e->base, sizeof(e->base), "%s", base);
                    snprintf(e->base_blob, sizeof(e->base_blob), "%s", base_blob);
                    e->base_n = base_n;
                    e->depth = (uint8_t)depth;
                }
                e->ids = st.tokens;
                e->n = st.n_tokens;
                st.tokens = NULL;
                e->cold = true;
                pthread_mutex_lock(&c->mu);
                if (ckpt_find_locked(c, key) == NULL) {
                    e->used = ++c->clock;
                    ckpt_link_locked(c, e);
                    c->disk_total += e->dbytes;
                    c->n_disk++;
                    e = NULL;
                    restored++;
                }
                pthread_mutex_unlock(&c->mu);
                ckpt_entry_free(e);
            } else if (!ok) {
                dropped++;
                ckpt_cleanup(ctl_store_state_delete(c->store, CTL_CKPT_OWNER, name, NULL, NULL), "ctl_store_state_delete");
                ckpt_cleanup(ctl_store_session_delete(c->store, page.items[i].key, NULL), "ctl_store_session_delete");
            }
            ctl_store_state_fini(&st);
        }
        bool more = page.n > 0 && page.next[0] != '\0';
        if (more)
            snprintf(after, sizeof(after), "%s", page.next);
        ctl_store_kv_page_fini(&page);
        if (!more)
            break;
    }
    size_t broken = ckpt_restore_chains(c);
    if (restored || dropped)
        wk_log_info("checkpoints restored from disk entries=%zu dropped=%zu", restored - broken,
                    dropped + broken);
}

/* -------------------------------------------------------- tier thread ---- */

/* Bytes of warm entries on worker. Caller holds mu. */
static uint64_t
ckpt_warm_on_locked(ctl_ckpt *c, const char *worker)
{
    uint64_t b = 0;
    for (ckpt_entry *e = c->entries; e != NULL; e = e->next)
        b += e->warm && strcmp(e->worker, worker) == 0 ? e->bytes : 0;
    return b;
}

/*
 * Moves e out of the warm tier (to disk when the disk budget allows, else it
 * is gone), counted. Caller holds mu and set e->busy; dropped and retaken.
 */
static void
ckpt_demote_locked(ctl_ckpt *c, ckpt_entry *e)
{
    e->dropping = true; /* (with the first gone: a verdict reached after it must not count) */
    ckpt_gone_locked(c, e); /* (before the drop: a session must not count on the copy) */
    (void)ckpt_spill_locked(c, e, NULL, 0);
    char hk[8 + WK_SHA256_HEX_LEN], worker[65];
    ckpt_host_key(e, hk);
    snprintf(worker, sizeof(worker), "%s", e->worker);
    pthread_mutex_unlock(&c->mu);
    ckpt_cleanup(ctl_pool_host_call(c->pool, WKVM__KIND__HOST_DROP, worker, hk, 0, c->rpc_ms, NULL),
                 "ctl_pool_host_call");
    pthread_mutex_lock(&c->mu);
    if (e->warm) {
        e->warm = false;
        c->warm_total -= e->bytes;
        c->n_warm--;
    }
    e->dropping = false;
    c->evicted[0]++;
    if (c->metrics != NULL)
        ctl_metrics_add(c->metrics, "wkvm_state_cache_evictions_total", "tier=\"warm\"", 1);
    e->busy = false;
    if (!e->cold)
        ckpt_gone_locked(c, e); /* (a cleaner may have found it live during the drop) */
    if (!e->cold && e->pins == 0)
        ckpt_remove_locked(c, e);
}

void
ctl_ckpt_maintain(ctl_ckpt *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->pass_mu);
    pthread_mutex_lock(&c->mu);
    /* Warm copies on a worker that restarted are gone with its memory. */
    for (bool again = true; again;) {
        again = false;
        for (ckpt_entry *e = c->entries; e != NULL; e = e->next) {
            if (e->warm && !e->busy && !e->saving && !ckpt_warm_live_locked(c, e)) {
                e->warm = false;
                c->warm_total -= e->bytes;
                c->n_warm--;
                if (!e->cold)
                    ckpt_gone_locked(c, e);
                if (!e->cold && e->pins == 0) {
                    ckpt_unlink_locked(c, e);
                    ckpt_entry_free(e);
                    again = true;
                    break;
                }
            }
        }
    }
    /* Entries cleared while in use go once released. */
    for (bool again = true; again;) {
        again = false;
        for (ckpt_entry *e = c->entries; e != NULL; e = e->next) {
            if (e->doomed && e->pins == 0 && !e->busy && !e->saving) {
                ckpt_remove_locked(c, e);
                again = true;
                break;
            }
        }
    }
    /*
     * Each worker's warm budget: least recently used first, entries in use
     * last. The workers holding warm entries are few: one pass per worker.
     */
    char workers[CKPT_MAX_WORKERS][65];
    size_t nw = 0;
    for (ckpt_entry *e = c->entries; e != NULL; e = e->next) {
        bool seen = !e->warm;
        for (size_t i = 0; !seen && i < nw; i++)
            seen = strcmp(workers[i], e->worker) == 0;
        if (!seen && nw < sizeof(workers) / sizeof(workers[0]))
            snprintf(workers[nw++], sizeof(workers[0]), "%s", e->worker);
    }
    for (size_t i = 0; i < nw && !c->stop; i++) {
        while (!c->stop && ckpt_warm_on_locked(c, workers[i]) > c->cfg.warm_bytes) {
            ckpt_entry *lru = NULL;
            for (ckpt_entry *x = c->entries; x != NULL; x = x->next) {
                if (x->warm && !x->busy && !x->saving && strcmp(x->worker, workers[i]) == 0 &&
                    (lru == NULL || (x->pins == 0) > (lru->pins == 0) ||
                     ((x->pins == 0) == (lru->pins == 0) && x->used < lru->used)))
                    lru = x;
            }
            if (lru == NULL)
                break;
            lru->busy = true;
            ckpt_demote_locked(c, lru);
        }
    }
    /*
     * Write-through: every end-of-reply checkpoint also goes to disk, newest
     * first, keeping its warm copy, so that a session survives its worker's
     * death (the warm copy dies with it). The scan restarts after each write
     * (mu was dropped); a write that fails waits for the next pass.
     */
    while (c->cfg.disk_bytes > 0 && !c->stop && wk_mono_ms() >= c->wt_retry_ms) {
        ckpt_entry *pick = NULL;
        for (ckpt_entry *e = c->entries; e != NULL; e = e->next) {
            /* (durable: a stored response's state, written through whatever the flag) */
            if (((e->kind == CTL_CKPT_KIND_REPLY && c->cfg.write_through) || e->durable) &&
                e->warm && !e->cold && !e->busy && !e->saving && !e->doomed &&
                ckpt_warm_live_locked(c, e) && (pick == NULL || e->used > pick->used))
                pick = e;
        }
        if (pick == NULL)
            break;
        pick->busy = true;
        wk_err err = ckpt_spill_locked(c, pick, NULL, 0);
        pick->busy = false;
        if (err != WK_OK) {
            c->wt_retry_ms = wk_mono_ms() + CKPT_WT_RETRY_MS;
            break;
        }
    }
    /* The entry count. */
    uint32_t max = c->cfg.max_entries ? c->cfg.max_entries : CTL_CKPT_MAX_ENTRIES_DEFAULT;
    while (c->n_entries > max) {
        ckpt_entry *lru = NULL;
        for (ckpt_entry *e = c->entries; e != NULL; e = e->next) {
            if (e->pins == 0 && e->deps == 0 && !e->busy && !e->saving &&
                (lru == NULL || e->used < lru->used))
                lru = e;
        }
        if (lru == NULL)
            break;
        c->evicted[lru->warm ? 0 : 1]++;
        if (c->metrics != NULL)
            ctl_metrics_add(c->metrics, "wkvm_state_cache_evictions_total",
                            lru->warm ? "tier=\"warm\"" : "tier=\"disk\"", 1);
        ckpt_remove_locked(c, lru);
    }
    ckpt_gauges_locked(c);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->pass_mu);
}

static void *
ckpt_thread_main(void *arg)
{
    ctl_ckpt *c = arg;
    pthread_setname_np(pthread_self(), "wkc-ckpt"); /* for the CPU metric */
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        if (!c->kick) {
            struct timespec until;
            wk_deadline_after_ms(&until, 1000);
            pthread_cond_timedwait(&c->cv, &c->mu, &until);
        }
        c->kick = false;
        if (c->stop)
            break;
        pthread_mutex_unlock(&c->mu);
        ctl_ckpt_maintain(c);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ------------------------------------------------------------ save ---- */

/* Bytes of a slot image holding n tokens of context. */
static uint64_t
ckpt_image_bytes(ctl_ckpt *c, size_t n)
{
    ctl_worker_view v;
    if (ctl_pool_model_view(c->pool, &v) != WK_OK)
        return 0;
    return v.state_bytes + v.kv_token_bytes * (uint64_t)n;
}

/*
 * The worker refused a warm copy (its host cache, --host-cache-bytes, is
 * full): drops the warm copy of one other entry on worker so that the newest
 * checkpoint takes its room, the least recently used one of those already on
 * disk (nothing lost) first, else the least recently used (gone, counted as a
 * warm eviction). Entries in use, being saved or moved, and those still to be
 * written through to disk (a stored response's, a reply's under
 * --checkpoint-write-through) are left alone. Runs
 * on the step loop: memory only, no disk I/O. The controller's own budget
 * (--state-cache-bytes) is enforced by the tier thread, which demotes to
 * disk at the disk's pace; when checkpoints come faster than that (a
 * hybrid's carry their KV, tens of MB each) or the worker's limit is the
 * smaller one, the worker fills first, and without this every new
 * checkpoint was skipped while the oldest stayed. Returns the bytes freed,
 * 0 when there is nothing to drop. No lock held.
 */
static uint64_t
ckpt_warm_room(ctl_ckpt *c, const char *worker, const ckpt_entry *self)
{
    pthread_mutex_lock(&c->mu);
    ckpt_entry *v = NULL;
    for (ckpt_entry *e = c->entries; e != NULL; e = e->next) {
        if (e == self || !e->warm || e->pins > 0 || e->busy || e->saving ||
            strcmp(e->worker, worker) != 0)
            continue;
        /* (one the tier thread still has to write through to disk is kept) */
        if (!e->cold && (e->durable || (e->kind == CTL_CKPT_KIND_REPLY && c->cfg.write_through)))
            continue;
        if (v == NULL || (e->cold && !v->cold) || (e->cold == v->cold && e->used < v->used))
            v = e;
    }
    if (v == NULL) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    v->busy = true;
    v->dropping = true; /* (with the first gone: a verdict reached after it must not count) */
    if (!v->cold)
        ckpt_gone_locked(c, v); /* (before the drop: a session must not count on the copy) */
    uint64_t freed = v->bytes > 0 ? v->bytes : 1;
    char hk[8 + WK_SHA256_HEX_LEN];
    ckpt_host_key(v, hk);
    pthread_mutex_unlock(&c->mu);
    wk_err err = ctl_pool_host_call(c->pool, WKVM__KIND__HOST_DROP, worker, hk, 0, c->rpc_ms, NULL);
    pthread_mutex_lock(&c->mu);
    v->busy = false;
    v->dropping = false; /* (a failed drop leaves the copy warm and live again) */
    /* (ENOENT: the copy was already gone, e.g. a restarted worker; it is not warm either way) */
    bool dropped = err == WK_OK || err == WK_ENOENT;
    if (dropped && v->warm) {
        v->warm = false;
        c->warm_total -= v->bytes;
        c->n_warm--;
        if (!v->cold)
            ckpt_gone_locked(c, v); /* (a cleaner may have found it live during the drop) */
        c->evicted[0]++;
        if (c->metrics != NULL)
            ctl_metrics_add(c->metrics, "wkvm_state_cache_evictions_total", "tier=\"warm\"", 1);
        if (!v->cold && v->pins == 0)
            ckpt_remove_locked(c, v);
    }
    ckpt_gauges_locked(c);
    pthread_mutex_unlock(&c->mu);
    return dropped ? freed : 0;
}

/*
 * The first half of a save: a new entry for the state that covers ids[0..n)
 * on worker, marked saving (nobody drops or frees it meanwhile), or NULL
 * when one exists (touched, and marked durable / given the reply record as
 * asked) or memory is short. ckpt_save_end() finishes it once the copy was
 * tried.
 */
static ckpt_entry *
ckpt_save_begin(ctl_ckpt *c, const char *owner, const char *fp, const int32_t *ids, size_t n,
                const char *worker, ctl_ckpt_kind kind, const char *reply, bool durable,
                const char *lin, uint64_t lin_id, size_t lin_n)
{
    char key[WK_SHA256_HEX_LEN];
    if (n == 0 || ckpt_key(fp, owner, ids, n, key) != WK_OK)
        return NULL;
    pthread_mutex_lock(&c->mu);
    ckpt_entry *e = ckpt_find_locked(c, key);
    if (e != NULL) {
        e->used = ++c->clock;
        if (durable && !e->durable) {
            e->durable = true;
            if (!e->cold) {
                c->kick = true; /* to disk now, not at the next tick */
                pthread_cond_broadcast(&c->cv);
            }
        }
        if (reply != NULL && reply[0] && strcmp(e->reply, reply) != 0) {
            /*
             * The same tokens ended a reply the client sees differently (another
             * stop string): the most recent reply record wins.
             */
            ckpt_reply_unlink_locked(c, e);
            snprintf(e->reply, sizeof(e->reply), "%s", reply);
            ckpt_reply_link_locked(c, e);
            if (e->cold) {
                char meta[512], kv[sizeof(CKPT_KV_PREFIX) + WK_SHA256_HEX_LEN];
                int ml = ckpt_meta_format(e, meta, sizeof(meta));
                snprintf(kv, sizeof(kv), CKPT_KV_PREFIX "%s", e->key);
                pthread_mutex_unlock(&c->mu);
                ckpt_cleanup(ctl_store_session_put(c->store, kv, meta, (size_t)ml, NULL),
                             "ctl_store_session_put");
                return NULL;
            }
        }
        pthread_mutex_unlock(&c->mu);
        return NULL;
    }
    e = calloc(1, sizeof(*e));
    int32_t *copy = malloc(n * sizeof(*copy));
    if (e == NULL || copy == NULL) {
        pthread_mutex_unlock(&c->mu);
        free(e);
        free(copy);
        return NULL;
    }
    memcpy(copy, ids, n * sizeof(*copy));
    snprintf(e->key, sizeof(e->key), "%s", key);
    snprintf(e->owner, sizeof(e->owner), "%s", owner);
    snprintf(e->fp, sizeof(e->fp), "%s", fp);
    if (reply != NULL)
        snprintf(e->reply, sizeof(e->reply), "%s", reply);
    e->ids = copy;
    e->n = n;
    if (lin != NULL && lin[0] != '\0' && lin_n > 0 && lin_n < n) {
        snprintf(e->lin, sizeof(e->lin), "%s", lin);
        e->lin_id = lin_id;
        e->lin_n = lin_n;
    }
    e->kind = (uint8_t)kind;
    e->durable = durable;
    e->saving = true;
    e->used = ++c->clock;
    snprintf(e->worker, sizeof(e->worker), "%s", worker);
    ckpt_link_locked(c, e);
    pthread_mutex_unlock(&c->mu);
    return e;
}

/*
 * The second half: err is what the copy came to (WK_OK: a warm copy of
 * bytes on e's worker of that epoch, or with direct, the image to write to
 * disk, taken and freed here; WK_ENOSPC: the worker's host cache refused it).
 */
static void
ckpt_save_end(ctl_ckpt *c, ckpt_entry *e, wk_err err, uint64_t bytes, uint64_t epoch, void *direct,
              size_t direct_len)
{
    ctl_ckpt_kind kind = (ctl_ckpt_kind)e->kind;
    pthread_mutex_lock(&c->mu);
    bool durable = e->durable;
    e->saving = false;
    if (err == WK_OK && c->cfg.warm_bytes > 0) {
        e->warm = true;
        e->epoch = epoch;
        e->bytes = bytes;
        c->warm_total += bytes;
        c->n_warm++;
        /* (all workers' total first: the per-worker sum is a walk over the index) */
        if (c->warm_total > c->cfg.warm_bytes &&
            ckpt_warm_on_locked(c, e->worker) > c->cfg.warm_bytes) {
            c->kick = true;
            pthread_cond_broadcast(&c->cv);
        }
    } else if (err == WK_OK) {
        e->bytes = direct_len;
        e->busy = true;
        err = ckpt_spill_locked(c, e, direct, direct_len);
        e->busy = false;
    }
    if (err == WK_OK) {
        if ((c->cfg.write_through || durable) && kind == CTL_CKPT_KIND_REPLY && !e->cold) {
            c->kick = true; /* to disk now, not at the next tick */
            pthread_cond_broadcast(&c->cv);
        }
        if (c->metrics != NULL) {
            char lb[48];
            snprintf(lb, sizeof(lb), "kind=\"%s\"", ckpt_kind_names[kind]);
            ctl_metrics_add(c->metrics, "wkvm_checkpoints_total", lb, 1);
        }
    } else {
        if (err == WK_ENOSPC) { /* the worker's host cache is full: make room for the next */
            c->kick = true;
            pthread_cond_broadcast(&c->cv);
        }
        if (c->metrics != NULL)
            ctl_metrics_add(c->metrics, "wkvm_checkpoints_skipped_total", NULL, 1);
        if (e->pins == 0) {
            ckpt_unlink_locked(c, e);
            ckpt_entry_free(e);
        }
    }
    ckpt_gauges_locked(c);
    pthread_mutex_unlock(&c->mu);
    free(direct);
}

/*
 * Leaves a checkpoint of slot (its state covers ids[0..n) exactly) unless
 * one exists. lin (entry lin_id, lin_n tokens; NULL: none): the checkpoint
 * the slot's state was resumed from (ckpt_plan_lin). Runs between steps of
 * slot's worker.
 */
static void
ckpt_save(ctl_ckpt *c, const char *owner, const char *fp, const int32_t *ids, size_t n,
          const ctl_slot_ref *slot, ctl_ckpt_kind kind, const char *reply, bool durable,
          const char *lin, uint64_t lin_id, size_t lin_n)
{
    ckpt_entry *e = ckpt_save_begin(c, owner, fp, ids, n, slot->worker, kind, reply, durable, lin,
                                    lin_id, lin_n);
    if (e == NULL)
        return;
    uint64_t bytes = ckpt_image_bytes(c, n);
    uint64_t epoch = ctl_pool_worker_epoch(c->pool, slot->worker);
    wk_err err = WK_ENOSPC;
    void *direct = NULL;
    size_t direct_len = 0;
    char hk[8 + WK_SHA256_HEX_LEN];
    ckpt_host_key(e, hk);
    if (c->cfg.warm_bytes > 0) {
        err = ctl_pool_host_call(c->pool, WKVM__KIND__HOST_PUT, slot->worker, hk, slot->slot,
                                 c->rpc_ms, NULL);
        /*
         * The worker is full: the oldest copies make room for this one, at
         * most this image's size of them (an image larger than the worker's
         * whole cache empties nothing more) and CKPT_ROOM_TRIES calls.
         */
        uint64_t freed = 0, f = 0;
        for (unsigned i = 0; err == WK_ENOSPC && i < CKPT_ROOM_TRIES && freed < bytes &&
                             (f = ckpt_warm_room(c, slot->worker, e)) > 0;
             i++) {
            freed += f;
            err = ctl_pool_host_call(c->pool, WKVM__KIND__HOST_PUT, slot->worker, hk, slot->slot,
                                     c->rpc_ms, NULL);
        }
    } else if (c->cfg.disk_bytes > 0) {
        /* No warm tier: straight to disk (the slot's bytes, read between two steps). */
        err = ctl_vm_slot_read(c->vm, slot, &direct, &direct_len, NULL);
    }
    ckpt_save_end(c, e, err, bytes, epoch, direct, direct_len);
}

/* ------------------------------------------------------------ plans ---- */

static int
ckpt_cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/*
 * The longest usable checkpoint of (owner, fp) whose ids are a prefix of
 * ids[0..n) with at least one token after it: pinned, key and length out.
 */
static bool
ckpt_lookup(ctl_ckpt *c, const char *owner, const char *fp, const int32_t *ids, size_t n,
            char key_out[WK_SHA256_HEX_LEN], size_t *len_out, char worker_out[65])
{
    size_t cap = 64, m = 0;
    size_t *lens = malloc(cap * sizeof(*lens));
    if (lens == NULL)
        return false;
    pthread_mutex_lock(&c->mu);
    c->lookups++;
    for (ckpt_entry *e = c->entries; e != NULL; e = e->next) {
        if (e->n == 0 || e->n >= n || e->saving || e->doomed || (!e->warm && !e->cold) ||
            strcmp(e->owner, owner) != 0 || strcmp(e->fp, fp) != 0)
            continue;
        if (m == cap) {
            size_t *nl = realloc(lens, 2 * cap * sizeof(*nl));
            if (nl == NULL)
                break;
            lens = nl;
            cap *= 2;
        }
        lens[m++] = e->n;
    }
    pthread_mutex_unlock(&c->mu);
    qsort(lens, m, sizeof(*lens), ckpt_cmp_size);
    size_t u = 0;
    for (size_t i = 0; i < m; i++) {
        if (u == 0 || lens[u - 1] != lens[i])
            lens[u++] = lens[i];
    }
    char(*keys)[WK_SHA256_HEX_LEN] = u ? malloc(u * sizeof(*keys)) : NULL;
    bool found = false;
    if (u > 0 && keys != NULL && ckpt_keys_at(fp, owner, ids, lens, u, keys) == WK_OK) {
        pthread_mutex_lock(&c->mu);
        for (size_t i = u; i > 0 && !found; i--) {
            ckpt_entry *e = ckpt_find_locked(c, keys[i - 1]);
            if (e == NULL || e->saving || e->doomed || (!e->warm && !e->cold) ||
                e->n != lens[i - 1] || strcmp(e->owner, owner) != 0 ||
                memcmp(e->ids, ids, e->n * sizeof(*ids)) != 0)
                continue;
            e->pins++;
            e->used = ++c->clock;
            snprintf(key_out, WK_SHA256_HEX_LEN, "%s", e->key);
            *len_out = e->n;
            snprintf(worker_out, 65, "%s", ckpt_warm_live_locked(c, e) ? e->worker : "");
            found = true;
        }
        if (found)
            c->hits++;
        else
            c->misses++;
        pthread_mutex_unlock(&c->mu);
    } else {
        pthread_mutex_lock(&c->mu);
        c->misses++;
        pthread_mutex_unlock(&c->mu);
    }
    free(keys);
    free(lens);
    if (c->metrics != NULL) {
        ctl_metrics_add(c->metrics, "wkvm_reuse_lookups_total", NULL, 1);
        if (!found)
            ctl_metrics_add(c->metrics, "wkvm_reuse_misses_total", NULL, 1);
    }
    return found;
}

static void
ckpt_unpin(ctl_ckpt *c, const char *key)
{
    pthread_mutex_lock(&c->mu);
    ckpt_entry *e = ckpt_find_locked(c, key);
    if (e != NULL && e->pins > 0 && --e->pins == 0 && !e->busy &&
        (e->doomed || (!e->warm && !e->cold)))
        ckpt_remove_locked(c, e);
    pthread_mutex_unlock(&c->mu);
}

/*
 * The whole image of disk entry key: its record, and for a KV tail the rows
 * below its base_n from its base's chain (at most CKPT_CHAIN_MAX records),
 * each record's size checked against the model's geometry. *bytes: caller
 * frees. WK_ENOENT when a record of the chain is gone, WK_EPROTO when one
 * does not fit.
 */
static wk_err
ckpt_disk_image(ctl_ckpt *c, const char *key, void **bytes, size_t *len, wk_diag *d)
{
    char cur[WK_SHA256_HEX_LEN], want[WK_SHA256_HEX_LEN] = ""; /* want: cur's record digest */
    snprintf(cur, sizeof(cur), "%s", key);
    uint8_t *out = NULL;
    uint64_t F = 0, T = 0, total = 0, need = 0; /* need: rows [0, need) still to place */
    wk_err err = WK_OK;
    for (unsigned hop = 0; err == WK_OK; hop++) {
        pthread_mutex_lock(&c->mu);
        ckpt_entry *e = ckpt_find_locked(c, cur);
        char base[WK_SHA256_HEX_LEN] = "", base_blob[WK_SHA256_HEX_LEN] = "";
        uint64_t n = 0, base_n = 0, ibytes = 0;
        if (e != NULL) {
            snprintf(base, sizeof(base), "%s", e->base);
            snprintf(base_blob, sizeof(base_blob), "%s", e->base_blob);
            n = e->n;
            base_n = e->base_n;
            ibytes = e->bytes;
        }
        pthread_mutex_unlock(&c->mu);
        if (e == NULL || hop >= CKPT_CHAIN_MAX) {
            err = wk_diag_set(d, WK_ENOENT, "checkpoint %.16s of a chain is gone", cur);
            break;
        }
        char name[CTL_STORE_NAME_MAX + 1];
        ckpt_record_name(cur, name);
        ctl_store_state st;
        memset(&st, 0, sizeof(st));
        void *rec = NULL;
        size_t rl = 0;
        err = ctl_store_state_get(c->store, CTL_CKPT_OWNER, name, &st, d);
        if (err == WK_OK && want[0] != '\0' && strcmp(st.blob, want) != 0)
            err = wk_diag_set(d, WK_ENOENT, "checkpoint %.16s of a chain was replaced", cur);
        if (err == WK_OK)
            err = ctl_store_blob_get(c->store, st.blob, &rec, &rl, d);
        ctl_store_state_fini(&st);
        if (err != WK_OK)
            break;
        if (hop == 0 && base[0] == '\0') { /* a whole image */
            if (rl != ibytes) {
                free(rec);
                return wk_diag_set(d, WK_EPROTO, "checkpoint %.16s: %zu bytes, %llu expected",
                                   cur, rl, (unsigned long long)ibytes);
            }
            *bytes = rec;
            *len = rl;
            return WK_OK;
        }
        if (hop == 0) {
            if (!ckpt_geom(c, &F, &T) || ibytes != F + T * n) {
                free(rec);
                err = wk_diag_set(d, WK_EPROTO, "checkpoint %.16s: not of the model's geometry",
                                  cur);
                break;
            }
            if ((out = malloc(ibytes)) == NULL) {
                free(rec);
                err = WK_ENOMEM;
                break;
            }
            total = ibytes;
            need = n;
            memcpy(out, rec, (size_t)F); /* the fixed part is the newest record's */
        }
        /* this record holds the fixed part and rows [base_n, n); rows [base_n, need) go in */
        const uint64_t lo = base[0] != '\0' ? base_n : 0;
        if (need > n || lo > need || rl != F + T * (n - lo)) {
            free(rec);
            err = wk_diag_set(d, WK_EPROTO, "checkpoint %.16s: a record of %zu bytes does not fit",
                              cur, rl);
            break;
        }
        memcpy(out + F + T * lo, (const uint8_t *)rec + F, (size_t)(T * (need - lo)));
        free(rec);
        need = lo;
        if (need == 0) {
            *bytes = out;
            *len = (size_t)total;
            return WK_OK;
        }
        snprintf(cur, sizeof(cur), "%s", base);
        snprintf(want, sizeof(want), "%s", base_blob);
    }
    free(out);
    return err;
}

/* The scheduler's load hook: the pinned checkpoint into the fresh slot. */
static wk_err
ckpt_plan_load(void *arg, const ctl_slot_ref *slot, wk_diag *d)
{
    ctl_ckpt_plan *p = arg;
    ctl_ckpt *c = p->c;
    pthread_mutex_lock(&c->mu);
    ckpt_entry *e = ckpt_find_locked(c, p->hit_key);
    bool warm_here = false, warm_else = false, cold = false;
    char worker[65] = "", hk[8 + WK_SHA256_HEX_LEN] = "";
    if (e != NULL) {
        bool live = ckpt_warm_live_locked(c, e);
        warm_here = live && strcmp(e->worker, slot->worker) == 0;
        warm_else = live && !warm_here;
        cold = e->cold;
        snprintf(worker, sizeof(worker), "%s", e->worker);
        ckpt_host_key(e, hk);
        e->used = ++c->clock;
        p->hit_id = e->id;
    }
    pthread_mutex_unlock(&c->mu);
    if (e == NULL)
        return wk_diag_set(d, WK_ENOENT, "checkpoint gone");
    wk_err err = WK_ENOENT;
    if (warm_here)
        err = ctl_pool_host_call(c->pool, WKVM__KIND__HOST_GET, slot->worker, hk, slot->slot,
                                 c->rpc_ms, d);
    if (err != WK_OK && warm_else) {
        void *bytes = NULL;
        size_t len = 0;
        err = ctl_vm_host_read(c->vm, worker, hk, &bytes, &len, d);
        if (err == WK_OK)
            err = ctl_vm_slot_write_raw(c->vm, slot, bytes, len, d);
        free(bytes);
    }
    if (err != WK_OK && cold) {
        void *bytes = NULL;
        size_t len = 0;
        err = ckpt_disk_image(c, p->hit_key, &bytes, &len, d);
        if (err == WK_ENOENT || err == WK_EPROTO) {
            /* its record or a record of its chain is gone or does not fit: it can never load
               again, so it goes at the plan's unpin (logged below), and the job recomputes */
            pthread_mutex_lock(&c->mu);
            ckpt_entry *x = ckpt_find_locked(c, p->hit_key);
            if (x != NULL && x->id == p->hit_id)
                x->doomed = true;
            pthread_mutex_unlock(&c->mu);
        }
        if (err == WK_OK)
            err = ctl_vm_slot_write_raw(c->vm, slot, bytes, len, d);
        free(bytes);
    }
    if (err == WK_OK)
        p->loaded = true;
    else
        wk_log_warn("checkpoint not loaded key=%.16s: %s (recomputing)", p->hit_key,
                    d != NULL ? d->msg : wk_strerror(err));
    return err;
}

/*
 * The checkpoint the plan's slot was resumed from, whose KV rows the
 * checkpoints it leaves share (ckpt_spill_locked), or NULL: only a
 * checkpoint this plan loaded counts (a held slot's state may have been
 * computed apart from any checkpoint with its tokens).
 */
static const char *
ckpt_plan_lin(const ctl_ckpt_plan *p)
{
    return p->loaded && p->base == 0 && p->hit_key[0] != '\0' && p->hit_id != 0 ? p->hit_key
                                                                                 : NULL;
}

/* The kind of checkpoint planned at job position pos. */
static ctl_ckpt_kind
ckpt_plan_kind(const ctl_ckpt_plan *p, size_t pos)
{
    for (size_t i = 0; i < p->n_pos; i++) {
        if (p->pos[i] == pos)
            return (ctl_ckpt_kind)p->kind[i];
    }
    return CTL_CKPT_KIND_PROMPT;
}

/* The scheduler's checkpoint hook: the state covers all[0..base + pos). */
static void
ckpt_plan_ckpt(void *arg, const ctl_slot_ref *slot, size_t pos)
{
    ctl_ckpt_plan *p = arg;
    ckpt_save(p->c, p->owner, p->fp, p->all, p->base + pos, slot, ckpt_plan_kind(p, pos), NULL,
              false, ckpt_plan_lin(p), p->hit_id, p->hit_len);
}

/*
 * Bytes worker's warm tier holds for this index and the images being copied
 * into it inside steps, in one walk. Caller holds mu.
 */
static uint64_t
ckpt_held_on_locked(ctl_ckpt *c, const char *worker)
{
    uint64_t b = 0;
    for (ckpt_entry *e = c->entries; e != NULL; e = e->next)
        b += (e->warm || (e->saving && e->snapping)) && strcmp(e->worker, worker) == 0 ? e->bytes
                                                                                      : 0;
    return b;
}

/* A checkpoint being taken inside a step: the scheduler's token. */
typedef struct ckpt_snap {
    ckpt_entry *e;  /* the entry, saving */
    uint64_t bytes; /* its image's size */
    uint64_t epoch; /* its worker's epoch */
} ckpt_snap;

/* The scheduler's in-step checkpoint hooks: a key for the worker's copy. */
static bool
ckpt_plan_snap_begin(void *arg, const ctl_slot_ref *slot, size_t pos,
                     char key[CTL_SCHED_SNAP_KEY_MAX], void **token)
{
    ctl_ckpt_plan *p = arg;
    ctl_ckpt *c = p->c;
    uint64_t cap = ctl_pool_worker_host_cache(c->pool, slot->worker);
    if (cap == 0)
        return false; /* (no warm tier on that worker: every copy would be refused) */
    ckpt_snap *sn = malloc(sizeof(*sn));
    if (sn == NULL)
        return false;
    sn->e = ckpt_save_begin(c, p->owner, p->fp, p->all, p->base + pos, slot->worker,
                            ckpt_plan_kind(p, pos), NULL, false, ckpt_plan_lin(p), p->hit_id,
                            p->hit_len);
    if (sn->e == NULL) {
        free(sn);
        return false; /* (one exists: touched) */
    }
    sn->bytes = ckpt_image_bytes(c, p->base + pos);
    sn->epoch = ctl_pool_worker_epoch(c->pool, slot->worker);
    /*
     * A copy the worker refuses is lost (the state moves on in the step),
     * so room is made before it: while the worker's warm copies and the
     * images being copied there inside steps (this one included) exceed
     * its capacity (from its Hello), the oldest copies go. Other modules'
     * copies there (ctl_vm's parked states) are not counted: when they
     * make one copy refused, room is made after it for the next
     * (ckpt_plan_snap_end).
     */
    pthread_mutex_lock(&c->mu);
    sn->e->bytes = sn->bytes;
    sn->e->snapping = true;
    uint64_t used = ckpt_held_on_locked(c, slot->worker);
    pthread_mutex_unlock(&c->mu);
    uint64_t excess = used > cap ? used - cap : 0, freed = 0, f = 0;
    for (unsigned t = 0;
         freed < excess && t < CKPT_ROOM_TRIES && (f = ckpt_warm_room(c, slot->worker, sn->e)) > 0;
         t++)
        freed += f;
    _Static_assert(8 + WK_SHA256_HEX_LEN <= CTL_SCHED_SNAP_KEY_MAX, "host key size");
    ckpt_host_key(sn->e, key);
    *token = sn;
    return true;
}

static void
ckpt_plan_snap_end(void *snap_arg, void *token, const ctl_slot_ref *slot, wk_err result)
{
    ctl_ckpt *c = snap_arg;
    ckpt_snap *sn = token;
    if (sn == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    sn->e->snapping = false;
    pthread_mutex_unlock(&c->mu);
    ckpt_save_end(c, sn->e, result, sn->bytes, sn->epoch, NULL, 0);
    /*
     * Not copied for want of room: that copy is lost, but the oldest copies
     * make room for the next one, as ckpt_save() does before its retry.
     */
    uint64_t freed = 0, f = 0;
    for (unsigned t = 0; result == WK_ENOSPC && t < CKPT_ROOM_TRIES && freed < sn->bytes &&
                         (f = ckpt_warm_room(c, slot->worker, NULL)) > 0;
         t++)
        freed += f;
    free(sn);
}

wk_err
ctl_ckpt_plan_begin(ctl_ckpt *c, ctl_ckpt_plan *p, const char *owner, const char *fp,
                    const int32_t *prefix, size_t n_prefix, const int32_t *input, size_t n_input,
                    const size_t *bounds, size_t n_bounds, bool lookup, wk_diag *d)
{
    memset(p, 0, sizeof(*p));
    if (c == NULL || !c->cfg.enabled || n_input == 0 || owner == NULL || fp == NULL ||
        fp[0] == '\0' || (c->cfg.warm_bytes == 0 && c->cfg.disk_bytes == 0))
        return WK_OK;
    p->all = malloc((n_prefix + n_input) * sizeof(*p->all));
    if (p->all == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    if (n_prefix)
        memcpy(p->all, prefix, n_prefix * sizeof(*p->all));
    memcpy(p->all + n_prefix, input, n_input * sizeof(*p->all));
    p->c = c;
    p->n_all = n_prefix + n_input;
    p->base = n_prefix;
    snprintf(p->owner, sizeof(p->owner), "%s", owner);
    snprintf(p->fp, sizeof(p->fp), "%s", fp);
    if (lookup && n_prefix == 0 &&
        ckpt_lookup(c, owner, fp, p->all, p->n_all, p->hit_key, &p->hit_len, p->worker)) {
        p->reuse.resume_at = p->hit_len;
        p->reuse.load = ckpt_plan_load;
    }
    /* Candidate positions (job-relative), then sorted, deduplicated, capped. */
    size_t cand[CTL_SCHED_CKPT_MAX + CTL_CKPT_MAX_BOUNDS + 1];
    uint8_t ckind[CTL_SCHED_CKPT_MAX + CTL_CKPT_MAX_BOUNDS + 1];
    size_t nc = 0, floor = p->hit_len > n_prefix ? p->hit_len - n_prefix : 0;
    for (size_t i = 0; i < n_bounds && i < CTL_CKPT_MAX_BOUNDS; i++) {
        if (bounds[i] > floor && bounds[i] < n_input) {
            cand[nc] = bounds[i];
            ckind[nc++] = CTL_CKPT_KIND_BOUNDARY;
        }
    }
    if (c->cfg.interval > 0) {
        size_t first = (p->base + floor) / c->cfg.interval + 1;
        for (size_t k = first * c->cfg.interval; k < p->n_all && nc < CTL_SCHED_CKPT_MAX;
             k += c->cfg.interval) {
            cand[nc] = k - p->base;
            ckind[nc++] = CTL_CKPT_KIND_INTERVAL;
        }
    }
    if (n_input - 1 > floor) {
        cand[nc] = n_input - 1;
        ckind[nc++] = CTL_CKPT_KIND_PROMPT;
    }
    /* Sort by position (insertion: nc is small), the prompt kind wins on a tie. */
    for (size_t i = 1; i < nc; i++) {
        size_t v = cand[i];
        uint8_t kv = ckind[i];
        size_t j = i;
        while (j > 0 && cand[j - 1] > v) {
            cand[j] = cand[j - 1];
            ckind[j] = ckind[j - 1];
            j--;
        }
        cand[j] = v;
        ckind[j] = kv;
    }
    size_t u = 0;
    for (size_t i = 0; i < nc; i++) {
        if (u > 0 && cand[u - 1] == cand[i]) {
            if (ckind[i] == CTL_CKPT_KIND_PROMPT)
                ckind[u - 1] = ckind[i];
            continue;
        }
        cand[u] = cand[i];
        ckind[u++] = ckind[i];
    }
    size_t skip = u > CTL_SCHED_CKPT_MAX ? u - CTL_SCHED_CKPT_MAX : 0;
    /* Leave out positions that already have a checkpoint (touching them). */
    size_t lens[CTL_SCHED_CKPT_MAX];
    size_t m = u - skip;
    for (size_t i = 0; i < m; i++)
        lens[i] = p->base + cand[skip + i];
    char(*keys)[WK_SHA256_HEX_LEN] = m ? malloc(m * sizeof(*keys)) : NULL;
    bool have_keys = keys != NULL && ckpt_keys_at(fp, owner, p->all, lens, m, keys) == WK_OK;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < m; i++) {
        ckpt_entry *e = have_keys ? ckpt_find_locked(c, keys[i]) : NULL;
        if (e != NULL) {
            e->used = ++c->clock;
            continue;
        }
        p->pos[p->n_pos] = cand[skip + i];
        p->kind[p->n_pos++] = ckind[skip + i];
    }
    pthread_mutex_unlock(&c->mu);
    free(keys);
    if (p->n_pos > 0) {
        p->reuse.ckpt_at = p->pos;
        p->reuse.n_ckpt = p->n_pos;
        p->reuse.ckpt = ckpt_plan_ckpt;
        if (c->cfg.warm_bytes > 0 && !c->cfg.step_cuts) {
            /* taken by the worker inside the step (without a warm tier: cut and read) */
            p->reuse.snap_begin = ckpt_plan_snap_begin;
            p->reuse.snap_end = ckpt_plan_snap_end;
            p->reuse.snap_arg = c;
        }
    }
    p->reuse.arg = p;
    return WK_OK;
}

void
ctl_ckpt_plan_reply(ctl_ckpt_plan *p, const ctl_slot_ref *slot, const int32_t *gen, size_t n_gen,
                    const char *reply_key)
{
    if (p == NULL || p->c == NULL || slot == NULL || slot->worker[0] == '\0')
        return;
    int32_t *ids = malloc((p->n_all + n_gen + 1) * sizeof(*ids));
    if (ids == NULL)
        return;
    memcpy(ids, p->all, p->n_all * sizeof(*ids));
    if (n_gen)
        memcpy(ids + p->n_all, gen, n_gen * sizeof(*ids));
    ckpt_save(p->c, p->owner, p->fp, ids, p->n_all + n_gen, slot, CTL_CKPT_KIND_REPLY, reply_key,
              p->durable, ckpt_plan_lin(p), p->hit_id, p->hit_len);
    if (ckpt_key(p->fp, p->owner, ids, p->n_all + n_gen, p->reply_ckpt) != WK_OK)
        p->reply_ckpt[0] = '\0';
    free(ids);
}

void
ctl_ckpt_plan_end(ctl_ckpt_plan *p)
{
    if (p == NULL)
        return;
    if (p->c != NULL && p->hit_key[0] != '\0')
        ckpt_unpin(p->c, p->hit_key);
    free(p->all);
    memset(p, 0, sizeof(*p));
}

bool
ctl_ckpt_live(ctl_ckpt *c, const char *key)
{
    if (c == NULL || !c->cfg.enabled || key == NULL || key[0] == '\0')
        return false;
    pthread_mutex_lock(&c->mu);
    ckpt_entry *e = ckpt_find_locked(c, key);
    /* (a warm copy being dropped is not live: its `gone` was reported before the drop) */
    bool live = e != NULL && !e->saving && !e->doomed &&
                (e->cold || (!e->dropping && ckpt_warm_live_locked(c, e)));
    pthread_mutex_unlock(&c->mu);
    return live;
}

/* ctl_vm's backing check (ctl_vm_set_backing): a parked session's end-of-reply checkpoint. */
static bool
ckpt_backed(void *arg, const char *key)
{
    return ctl_ckpt_live(arg, key);
}

bool
ctl_ckpt_reply_tokens(ctl_ckpt *c, const char *reply_key, int32_t **ids, size_t *n)
{
    if (c == NULL || !c->cfg.enabled || reply_key == NULL || reply_key[0] == '\0')
        return false;
    bool ok = false;
    pthread_mutex_lock(&c->mu);
    ckpt_entry *e = ckpt_find_reply_locked(c, reply_key);
    if (e != NULL && (*ids = malloc(e->n * sizeof(**ids))) != NULL) {
        memcpy(*ids, e->ids, e->n * sizeof(**ids));
        *n = e->n;
        e->used = ++c->clock;
        ok = true;
    }
    pthread_mutex_unlock(&c->mu);
    return ok;
}

/* ------------------------------------------------------------ admin ---- */

void
ctl_ckpt_count_hit(ctl_ckpt *c, ctl_ckpt_hit kind, size_t tokens)
{
    if (c == NULL || c->metrics == NULL || kind >= CTL_CKPT_HIT__COUNT)
        return;
    char lb[48];
    snprintf(lb, sizeof(lb), "kind=\"%s\"", ckpt_hit_names[kind]);
    ctl_metrics_add(c->metrics, "wkvm_reuse_hits_total", lb, 1);
    ctl_metrics_add(c->metrics, "wkvm_prefix_tokens_reused_total", NULL, (double)tokens);
}

ctl_ckpt_config
ctl_ckpt_get_config(const ctl_ckpt *c)
{
    ctl_ckpt_config none = {0};
    return c != NULL ? c->cfg : none;
}

/* Rows of a ctl_ckpt_stats being filled, with an owner -> row hash (open addressing). */
typedef struct ckpt_stats_fill {
    ctl_ckpt_stats *s; /* the stats */
    size_t cap;        /* rows allocated in s->owners */
    uint32_t *rows;    /* row index + 1 per hash slot, 0 = empty */
    size_t n_rows;     /* hash slots, a power of two above twice the entries */
} ckpt_stats_fill;

/* The row of owner, appended when new; NULL on allocation failure. */
static ctl_ckpt_owner_stats *
ckpt_stats_owner(ckpt_stats_fill *f, const char *owner)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *p = owner; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    size_t i = h & (f->n_rows - 1);
    for (; f->rows[i] != 0; i = (i + 1) & (f->n_rows - 1))
        if (strcmp(f->s->owners[f->rows[i] - 1].owner, owner) == 0)
            return &f->s->owners[f->rows[i] - 1];
    if (f->s->n_owners == f->cap) {
        size_t ncap = f->cap ? 2 * f->cap : 8;
        ctl_ckpt_owner_stats *o = realloc(f->s->owners, ncap * sizeof(*o));
        if (o == NULL)
            return NULL;
        f->s->owners = o;
        f->cap = ncap;
    }
    ctl_ckpt_owner_stats *o = &f->s->owners[f->s->n_owners++];
    memset(o, 0, sizeof(*o));
    snprintf(o->owner, sizeof(o->owner), "%s", owner);
    f->rows[i] = (uint32_t)f->s->n_owners;
    return o;
}

wk_err
ctl_ckpt_stats_get(ctl_ckpt *c, const char *owner, ctl_ckpt_stats *out)
{
    ctl_ckpt_stats s = {.config = ctl_ckpt_get_config(c)};
    ckpt_stats_fill f = {.s = &s};
    wk_err err = WK_OK;
    if (c != NULL) {
        pthread_mutex_lock(&c->mu);
        f.n_rows = 16;
        while (f.n_rows < 2 * c->n_entries)
            f.n_rows *= 2;
        f.rows = calloc(f.n_rows, sizeof(*f.rows));
        if (f.rows == NULL) {
            pthread_mutex_unlock(&c->mu);
            return WK_ENOMEM;
        }
        s.lookups = c->lookups;
        s.hits = c->hits;
        s.warm_evictions = c->evicted[0];
        s.disk_evictions = c->evicted[1];
        for (ckpt_entry *e = c->entries; e != NULL; e = e->next) {
            if (e->saving || e->doomed || (owner != NULL && strcmp(e->owner, owner) != 0))
                continue;
            s.entries++;
            s.warm_bytes += e->warm ? e->bytes : 0;
            s.disk_bytes += e->cold ? e->dbytes : 0;
            s.warm_entries += e->warm;
            s.disk_entries += e->cold;
            ctl_ckpt_owner_stats *o = ckpt_stats_owner(&f, e->owner);
            if (o == NULL) {
                err = WK_ENOMEM;
                break;
            }
            o->entries++;
            o->warm += e->warm;
            o->disk += e->cold;
            o->bytes += e->bytes;
            o->tokens += e->n;
        }
        pthread_mutex_unlock(&c->mu);
        free(f.rows);
    }
    if (err != WK_OK) {
        ctl_ckpt_stats_fini(&s);
        return err;
    }
    *out = s;
    return WK_OK;
}

void
ctl_ckpt_stats_fini(ctl_ckpt_stats *s)
{
    if (s == NULL)
        return;
    free(s->owners);
    s->owners = NULL;
    s->n_owners = 0;
}

void
ctl_ckpt_clear(ctl_ckpt *c, const char *owner, size_t *n)
{
    size_t cleared = 0;
    if (c != NULL) {
        pthread_mutex_lock(&c->mu);
        for (bool again = true; again;) {
            again = false;
            for (ckpt_entry *e = c->entries; e != NULL; e = e->next) {
                if (e->doomed || (owner != NULL && strcmp(e->owner, owner) != 0))
                    continue;
                cleared++;
                if (e->pins > 0 || e->busy || e->saving) {
                    e->doomed = true; /* (removed at the last unpin, or by the tier thread) */
                    ckpt_gone_locked(c, e);
                    continue;
                }
                ckpt_remove_locked(c, e);
                again = true;
                break;
            }
        }
        c->kick = true; /* (the doomed ones) */
        pthread_cond_broadcast(&c->cv);
        ckpt_gauges_locked(c);
        pthread_mutex_unlock(&c->mu);
    }
    if (n != NULL)
        *n = cleared;
}

/* ------------------------------------------------------------ life ---- */

wk_err
ctl_ckpt_metrics_declare(ctl_metrics *m)
{
    static const struct {
        const char *name;
        ctl_metric_type type;
        const char *help;
    } fams[] = {
        {"wkvm_reuse_hits_total", CTL_METRIC_COUNTER,
         "Requests that reused a state instead of recomputing their prompt, by kind "
         "(parent_bound, prefix, checkpoint, regenerate)."},
        {"wkvm_reuse_lookups_total", CTL_METRIC_COUNTER, "Prefix-index lookups."},
        {"wkvm_reuse_misses_total", CTL_METRIC_COUNTER,
         "Prefix-index lookups that found no checkpoint of the owner prefixing the prompt."},
        {"wkvm_checkpoints_total", CTL_METRIC_COUNTER,
         "Checkpoints left, by kind (prompt, boundary, interval, reply)."},
        {"wkvm_checkpoints_skipped_total", CTL_METRIC_COUNTER,
         "Checkpoints not left because no tier had room."},
        {"wkvm_state_cache_bytes", CTL_METRIC_GAUGE, "Bytes of checkpoints by tier (warm, disk)."},
        {"wkvm_state_cache_entries", CTL_METRIC_GAUGE, "Checkpoints by tier (warm, disk)."},
        {"wkvm_state_cache_evictions_total", CTL_METRIC_COUNTER,
         "Checkpoints removed from a tier by its byte budget (warm: moved to disk or gone; "
         "disk: gone)."},
        {"wkvm_state_cache_disk_writes_total", CTL_METRIC_COUNTER,
         "Checkpoints written to disk, by record (image: the whole state; tail: its fixed "
         "part and the KV past the checkpoint it was resumed from, which holds the rest)."},
        {"wkvm_state_cache_disk_write_bytes_total", CTL_METRIC_COUNTER,
         "Bytes of checkpoint records written to disk, by record (image, tail)."},
    };
    for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++) {
        wk_err err = ctl_metrics_declare(m, fams[i].name, fams[i].type, fams[i].help, NULL, 0);
        if (err != WK_OK)
            return err;
    }
    /* Both tiers show from the start, at 0. */
    ctl_metrics_add(m, "wkvm_state_cache_evictions_total", "tier=\"warm\"", 0);
    ctl_metrics_add(m, "wkvm_state_cache_evictions_total", "tier=\"disk\"", 0);
    for (int t = 0; t < 2; t++) {
        ctl_metrics_add(m, "wkvm_state_cache_disk_writes_total",
                        t ? "record=\"tail\"" : "record=\"image\"", 0);
        ctl_metrics_add(m, "wkvm_state_cache_disk_write_bytes_total",
                        t ? "record=\"tail\"" : "record=\"image\"", 0);
    }
    return WK_OK;
}

wk_err
ctl_ckpt_new(const ctl_ckpt_config *cfg, ctl_pool *pool, ctl_sched *sched, ctl_vm *vm,
             ctl_store *store, ctl_metrics *metrics, ctl_ckpt **out, wk_diag *d)
{
    ctl_ckpt *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    c->cfg = *cfg;
    c->pool = pool;
    c->sched = sched;
    c->vm = vm;
    c->rpc_ms = ctl_vm_rpc_timeout(vm); /* (set at startup, before this) */
    c->store = store;
    c->metrics = metrics;
    pthread_mutex_init(&c->pass_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (store != NULL)
        ckpt_restore(c);
    pthread_mutex_lock(&c->mu);
    ckpt_gauges_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (pthread_create(&c->thr, NULL, ckpt_thread_main, c) != 0) {
        ctl_ckpt_free(c);
        return wk_diag_set(d, WK_ENOMEM, "cannot start the checkpoint tier thread");
    }
    c->thr_started = true;
    if (vm != NULL && cfg->enabled)
        ctl_vm_set_backing(vm, ckpt_backed, c);
    *out = c;
    return WK_OK;
}

void
ctl_ckpt_flush(ctl_ckpt *c)
{
    if (c == NULL || c->cfg.disk_bytes == 0)
        return;
    size_t moved = 0, todo = 0;
    const char *why = "";
    uint64_t t0 = wk_mono_ms(), next_note = t0 + 5000;
    pthread_mutex_lock(&c->mu);
    for (ckpt_entry *e = c->entries; e != NULL; e = e->next)
        todo += e->warm && !e->cold && !e->doomed && ckpt_warm_live_locked(c, e);
    if (todo > 0)
        wk_log_info("writing warm checkpoints to disk at shutdown entries=%zu budget_ms=%u", todo,
                    c->cfg.flush_ms);
    for (;;) {
        uint64_t now = wk_mono_ms();
        if (now - t0 >= c->cfg.flush_ms) {
            why = "the time budget (--checkpoint-flush-ms) ran out";
            break;
        }
        if (now >= next_note) {
            wk_log_info("writing warm checkpoints to disk at shutdown: written=%zu of %zu", moved,
                        todo);
            next_note = now + 5000;
        }
        /* Most recently used first: the disk budget keeps what matters most. */
        ckpt_entry *mru = NULL;
        for (ckpt_entry *e = c->entries; e != NULL; e = e->next) {
            if (e->warm && !e->cold && !e->busy && !e->saving && !e->doomed &&
                ckpt_warm_live_locked(c, e) && (mru == NULL || e->used > mru->used))
                mru = e;
        }
        if (mru == NULL)
            break;
        if (mru->bytes > c->cfg.disk_bytes) {
            why = "the disk budget (--state-cache-disk-bytes) is full";
            break;
        }
        uint64_t oldest_disk = UINT64_MAX;
        for (ckpt_entry *e = c->entries; e != NULL; e = e->next) {
            if (e->cold && e->pins == 0 && e->used < oldest_disk)
                oldest_disk = e->used;
        }
        if (c->disk_total + mru->bytes > c->cfg.disk_bytes && oldest_disk > mru->used) {
            /* (never evict a more recently used disk entry for an older one) */
            why = "the disk budget (--state-cache-disk-bytes) is full";
            break;
        }
        mru->busy = true;
        wk_err err = ckpt_spill_locked(c, mru, NULL, 0);
        mru->busy = false;
        if (err != WK_OK) {
            why = "a write failed";
            break;
        }
        moved++;
    }
    ckpt_gauges_locked(c);
    pthread_mutex_unlock(&c->mu);
    size_t left = todo > moved ? todo - moved : 0;
    if (left > 0 && why[0] != '\0')
        wk_log_warn("checkpoints written to disk at shutdown entries=%zu not_written=%zu "
                    "seconds=%.1f: %s (they are lost with the workers' memory)",
                    moved, left, (double)(wk_mono_ms() - t0) / 1000.0, why);
    else if (todo > 0)
        wk_log_info("checkpoints written to disk at shutdown entries=%zu seconds=%.1f", moved,
                    (double)(wk_mono_ms() - t0) / 1000.0);
}

void
ctl_ckpt_free(ctl_ckpt *c)
{
    if (c == NULL)
        return;
    if (c->vm != NULL && c->cfg.enabled)
        ctl_vm_set_backing(c->vm, NULL, NULL);
    if (c->thr_started) {
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thr, NULL);
    }
    for (ckpt_entry *e = c->entries, *next; e != NULL; e = next) {
        next = e->next;
        ckpt_entry_free(e);
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->pass_mu);
    free(c);
}
