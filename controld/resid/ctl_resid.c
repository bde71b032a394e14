/*
 * ctl_resid: one worker's slot residence table (slot generations, the job on
 * each slot, context and KV pages), and the directory of every worker's
 * table under one lock, through which ctl_vm and the API reach slots without
 * the scheduler (ctl_resid.h: the lock order).
 */
#include "ctl_resid.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_time.h"

/* A warm-tier copy: a clean state's bytes kept in a worker's host memory. */
typedef struct ctl_resid_warm {
    char key[CTL_RESID_KEY_MAX]; /* blob hex */
    char worker[65];             /* worker holding the copy */
    uint64_t ctx;                /* tokens of context in it (hybrid: its KV) */
    uint64_t epoch;              /* that worker process's epoch (its copies die with it) */
    uint64_t used;               /* LRU clock */
    struct ctl_resid_warm *next; /* list link */
} ctl_resid_warm;

/* A hot-index entry in the directory's list. */
typedef struct ctl_resid_hot_node {
    ctl_resid_hot e;                 /* the entry */
    struct ctl_resid_hot_node *next; /* list link */
} ctl_resid_hot_node;

struct ctl_resid_dir {
    pthread_mutex_t warm_mu;                  /* guards warm and warm_clock only (a leaf) */
    ctl_resid_warm *warm;                     /* the warm tier's index */
    uint64_t warm_clock;                      /* its LRU counter */
    pthread_mutex_t mu;                       /* guards everything below and every table */
    pthread_cond_t cv;                        /* slot releases; the scheduler's step loops */
    ctl_resid *tables[CTL_RESID_MAX_WORKERS]; /* attached tables, NULL = hole */
    uint64_t next_gen;                        /* last slot generation handed out */
    uint64_t epoch;                           /* bumped when a slot may have become free */
    atomic_bool stop;                         /* shut down: waits end */
    ctl_resid_hot_node *hot;                  /* the hot index, newest first */
    uint64_t hot_clock;                       /* its LRU counter */
    uint64_t hot_ids;                         /* last entry id handed out */
    bool clean_wanted;                        /* admission found only dirty victims */
    char clean_worker[65];                    /* ... on this worker ("" = anywhere) */
    uint32_t clean_pages;                     /* ... lacking these KV pages there */
    uint64_t clean_gen;                       /* bumped when a cleaning ends, an entry turns
                                               * clean or a slot is released */
};

wk_err
ctl_resid_init(ctl_resid *t, uint32_t n, const ctl_kv_geom *geom)
{
    memset(t, 0, sizeof(*t));
    t->n = n;
    t->geom = *geom;
    t->gen = calloc((size_t)n + 1, sizeof(*t->gen));
    t->busy = calloc((size_t)n + 1, sizeof(*t->busy));
    t->pages = calloc((size_t)n + 1, sizeof(*t->pages));
    t->ctx = calloc((size_t)n + 1, sizeof(*t->ctx));
    t->stale = calloc((size_t)n + 1, sizeof(*t->stale));
    if (t->gen == NULL || t->busy == NULL || t->pages == NULL || t->ctx == NULL ||
        t->stale == NULL) {
        ctl_resid_fini(t);
        return WK_ENOMEM;
    }
    return WK_OK;
}

void
ctl_resid_fini(ctl_resid *t)
{
    free(t->gen);
    free(t->busy);
    free(t->pages);
    free(t->ctx);
    free(t->stale);
    memset(t, 0, sizeof(*t));
}

bool
ctl_resid_live(const ctl_resid *t, uint32_t k, uint64_t gen)
{
    return k >= 1 && k <= t->n && gen != 0 && t->gen[k] == gen;
}

uint32_t
ctl_resid_free_slot(const ctl_resid *t)
{
    for (uint32_t i = 1; i <= t->n; i++) {
        if (t->gen[i] == 0 && !t->stale[i])
            return i;
    }
    return 0;
}

uint32_t
ctl_resid_used(const ctl_resid *t)
{
    uint32_t used = 0;
    for (uint32_t k = 1; k <= t->n; k++)
        used += t->gen[k] != 0;
    return used;
}

uint32_t
ctl_resid_pages_used(const ctl_resid *t)
{
    uint64_t used = 0;
    for (uint32_t k = 1; k <= t->n; k++)
        used += t->gen[k] != 0 || t->stale[k] ? t->pages[k] : 0;
    return used > UINT32_MAX ? UINT32_MAX : (uint32_t)used;
}

void
ctl_resid_take(ctl_resid *t, uint32_t k, uint64_t gen)
{
    t->gen[k] = gen;
    t->pages[k] = 0;
    t->ctx[k] = 0;
    t->busy[k] = NULL;
}

void
ctl_resid_clear(ctl_resid *t, uint32_t k)
{
    if (ctl_kv_hybrid(&t->geom) && t->ctx[k] + t->pages[k] > 0)
        t->stale[k] = true; /* the step loop frees its pages on the worker */
    else
        t->pages[k] = 0;
    t->gen[k] = 0;
    t->ctx[k] = 0;
}

void
ctl_resid_unstale(ctl_resid *t, uint32_t k)
{
    t->stale[k] = false;
    t->pages[k] = 0;
}

wk_err
ctl_resid_set_ctx(ctl_resid *t, uint32_t k, uint64_t n_ctx, const char *worker, wk_diag *d)
{
    uint32_t need = ctl_kv_pages(&t->geom, n_ctx);
    uint32_t used = ctl_resid_pages_used(t);
    if (t->busy[k] == NULL && ctl_kv_hybrid(&t->geom) && need > t->geom.pages_total)
        return wk_diag_set(d, WK_ETOOBIG, "%llu tokens of context need %u KV pages, more "
                           "than the pool of worker %s holds (%u pages of %u tokens)",
                           (unsigned long long)n_ctx, need, worker, t->geom.pages_total,
                           t->geom.page_tokens);
    if (t->busy[k] == NULL && !ctl_kv_fits(&t->geom, used, t->pages[k], need))
        return wk_diag_set(d, WK_EQUOTA, "KV pool full on worker %s: %llu tokens need %u "
                           "pages, %u of %u free", worker, (unsigned long long)n_ctx, need,
                           t->geom.pages_total - (used < t->geom.pages_total ? used
                                                                             : t->geom.pages_total),
                           t->geom.pages_total);
    t->ctx[k] = n_ctx;
    if (t->busy[k] == NULL || need > t->pages[k])
        t->pages[k] = need;
    return WK_OK;
}

/* ---- The directory ---- */

wk_err
ctl_resid_dir_new(ctl_resid_dir **out)
{
    ctl_resid_dir *dir = calloc(1, sizeof(*dir));
    if (dir == NULL)
        return WK_ENOMEM;
    pthread_mutex_init(&dir->mu, NULL);
    pthread_mutex_init(&dir->warm_mu, NULL);
    pthread_cond_init(&dir->cv, NULL);
    atomic_init(&dir->stop, false);
    *out = dir;
    return WK_OK;
}

void
ctl_resid_dir_free(ctl_resid_dir *dir)
{
    if (dir == NULL)
        return;
    while (dir->warm != NULL) {
        ctl_resid_warm *w = dir->warm;
        dir->warm = w->next;
        free(w);
    }
    while (dir->hot != NULL) {
        ctl_resid_hot_node *n = dir->hot;
        dir->hot = n->next;
        free(n);
    }
    pthread_cond_destroy(&dir->cv);
    pthread_mutex_destroy(&dir->warm_mu);
    pthread_mutex_destroy(&dir->mu);
    free(dir);
}

pthread_mutex_t *
ctl_resid_dir_mutex(ctl_resid_dir *dir)
{
    return &dir->mu;
}

pthread_cond_t *
ctl_resid_dir_cond(ctl_resid_dir *dir)
{
    return &dir->cv;
}

void
ctl_resid_dir_stop(ctl_resid_dir *dir)
{
    pthread_mutex_lock(&dir->mu);
    atomic_store(&dir->stop, true);
    pthread_cond_broadcast(&dir->cv);
    pthread_mutex_unlock(&dir->mu);
}

wk_err
ctl_resid_dir_attach_locked(ctl_resid_dir *dir, ctl_resid *t, const char *worker)
{
    for (size_t i = 0; i < CTL_RESID_MAX_WORKERS; i++) {
        if (dir->tables[i] == NULL) {
            dir->tables[i] = t;
            t->dir = dir;
            snprintf(t->worker, sizeof(t->worker), "%s", worker);
            return WK_OK;
        }
    }
    return WK_ENOSPC;
}

void
ctl_resid_dir_detach_locked(ctl_resid_dir *dir, ctl_resid *t)
{
    for (size_t i = 0; i < CTL_RESID_MAX_WORKERS; i++) {
        if (dir->tables[i] == t)
            dir->tables[i] = NULL;
    }
    t->dir = NULL;
}

ctl_resid *
ctl_resid_dir_find_locked(ctl_resid_dir *dir, const char *worker)
{
    for (size_t i = 0; i < CTL_RESID_MAX_WORKERS; i++) {
        ctl_resid *t = dir->tables[i];
        if (t != NULL && strcmp(t->worker, worker) == 0)
            return t;
    }
    return NULL;
}

uint64_t
ctl_resid_dir_next_gen_locked(ctl_resid_dir *dir)
{
    return ++dir->next_gen;
}

void
ctl_resid_dir_released_locked(ctl_resid_dir *dir)
{
    dir->epoch++;
    dir->clean_gen++;
    pthread_cond_broadcast(&dir->cv);
}

/* ---- Slot handles ---- */

/* ref's table when ref is live, else NULL. Caller holds the mutex. */
static ctl_resid *
ctl_resid_live_locked(ctl_resid_dir *dir, const ctl_slot_ref *ref)
{
    ctl_resid *t = ctl_resid_dir_find_locked(dir, ref->worker);
    return t != NULL && ctl_resid_live(t, ref->slot, ref->gen) ? t : NULL;
}

bool
ctl_resid_slot_valid(ctl_resid_dir *dir, const ctl_slot_ref *ref)
{
    pthread_mutex_lock(&dir->mu);
    bool ok = ctl_resid_live_locked(dir, ref) != NULL;
    pthread_mutex_unlock(&dir->mu);
    return ok;
}

wk_err
ctl_resid_slot_alloc(ctl_resid_dir *dir, const char *worker, ctl_slot_ref *out, wk_diag *d)
{
    wk_err err = wk_diag_set(d, WK_ENOSPC, "no free slot");
    pthread_mutex_lock(&dir->mu);
    for (size_t i = 0; i < CTL_RESID_MAX_WORKERS; i++) {
        ctl_resid *t = dir->tables[i];
        if (t == NULL || (worker != NULL && strcmp(worker, t->worker) != 0) ||
            (worker == NULL && t->draining))
            continue;
        uint32_t k = ctl_resid_free_slot(t);
        if (k == 0)
            continue;
        ctl_resid_take(t, k, ++dir->next_gen);
        snprintf(out->worker, sizeof(out->worker), "%s", t->worker);
        out->slot = k;
        out->gen = t->gen[k];
        err = WK_OK;
        break;
    }
    pthread_mutex_unlock(&dir->mu);
    return err;
}

wk_err
ctl_resid_slot_free(ctl_resid_dir *dir, const ctl_slot_ref *ref)
{
    wk_err err = WK_ESTATE;
    pthread_mutex_lock(&dir->mu);
    ctl_resid *t = ctl_resid_live_locked(dir, ref);
    if (t != NULL && t->busy[ref->slot] == NULL) {
        ctl_resid_clear(t, ref->slot);
        ctl_resid_dir_released_locked(dir);
        err = WK_OK;
    }
    pthread_mutex_unlock(&dir->mu);
    return err;
}

uint64_t
ctl_resid_slot_epoch(ctl_resid_dir *dir)
{
    pthread_mutex_lock(&dir->mu);
    uint64_t e = dir->epoch;
    pthread_mutex_unlock(&dir->mu);
    return e;
}

bool
ctl_resid_slot_wait(ctl_resid_dir *dir, uint64_t epoch, uint64_t until_ms)
{
    pthread_mutex_lock(&dir->mu);
    while (dir->epoch == epoch && !atomic_load(&dir->stop)) {
        uint64_t now = wk_mono_ms();
        if (now >= until_ms)
            break;
        struct timespec until;
        wk_deadline_after_ms(&until, until_ms - now);
        (void)pthread_cond_timedwait(&dir->cv, &dir->mu, &until);
    }
    bool changed = dir->epoch != epoch;
    pthread_mutex_unlock(&dir->mu);
    return changed;
}

uint64_t
ctl_resid_slot_ctx(ctl_resid_dir *dir, const ctl_slot_ref *ref)
{
    pthread_mutex_lock(&dir->mu);
    ctl_resid *t = ctl_resid_live_locked(dir, ref);
    uint64_t n = t != NULL ? t->ctx[ref->slot] : 0;
    pthread_mutex_unlock(&dir->mu);
    return n;
}

uint32_t
ctl_resid_slot_pages(ctl_resid_dir *dir, const ctl_slot_ref *ref)
{
    pthread_mutex_lock(&dir->mu);
    ctl_resid *t = ctl_resid_live_locked(dir, ref);
    uint32_t n = t != NULL ? t->pages[ref->slot] : 0;
    pthread_mutex_unlock(&dir->mu);
    return n;
}

wk_err
ctl_resid_slot_set_ctx(ctl_resid_dir *dir, const ctl_slot_ref *ref, uint64_t n_ctx, wk_diag *d)
{
    wk_err err;
    pthread_mutex_lock(&dir->mu);
    ctl_resid *t = ctl_resid_dir_find_locked(dir, ref->worker);
    if (t == NULL)
        err = wk_diag_set(d, WK_EUNAVAIL, "worker %s left", ref->worker);
    else if (!ctl_resid_live(t, ref->slot, ref->gen))
        err = wk_diag_set(d, WK_ESTATE, "slot %s/%u is no longer valid", ref->worker, ref->slot);
    else
        err = ctl_resid_set_ctx(t, ref->slot, n_ctx, t->worker, d);
    pthread_mutex_unlock(&dir->mu);
    return err;
}

wk_err
ctl_resid_slot_set_bytes(ctl_resid_dir *dir, const ctl_slot_ref *ref, uint64_t bytes, wk_diag *d)
{
    pthread_mutex_lock(&dir->mu);
    ctl_resid *t = ctl_resid_dir_find_locked(dir, ref->worker);
    ctl_kv_geom g = t != NULL ? t->geom : (ctl_kv_geom){0};
    pthread_mutex_unlock(&dir->mu);
    if (t == NULL)
        return wk_diag_set(d, WK_EUNAVAIL, "worker %s left", ref->worker);
    uint64_t n_ctx = 0;
    if (!ctl_kv_hybrid(&g))
        return WK_OK; /* fixed-size slots: nothing to account */
    if (ctl_kv_image_ctx(&g, bytes, &n_ctx) != WK_OK)
        return wk_diag_set(d, WK_EINVAL,
                           "a state of %llu bytes is not an image of this model "
                           "(%llu recurrent bytes + %llu per token)",
                           (unsigned long long)bytes, (unsigned long long)g.state_bytes,
                           (unsigned long long)g.kv_token_bytes);
    return ctl_resid_slot_set_ctx(dir, ref, n_ctx, d);
}

void
ctl_resid_slot_note_ctx(ctl_resid_dir *dir, const ctl_slot_ref *ref, uint64_t n_ctx)
{
    pthread_mutex_lock(&dir->mu);
    ctl_resid *t = ctl_resid_live_locked(dir, ref);
    if (t != NULL && !ctl_kv_hybrid(&t->geom) && t->busy[ref->slot] == NULL)
        t->ctx[ref->slot] = n_ctx;
    pthread_mutex_unlock(&dir->mu);
}

bool
ctl_resid_known(ctl_resid_dir *dir, const char *worker)
{
    pthread_mutex_lock(&dir->mu);
    bool ok = ctl_resid_dir_find_locked(dir, worker) != NULL;
    pthread_mutex_unlock(&dir->mu);
    return ok;
}

void
ctl_resid_counts(ctl_resid_dir *dir, const char *worker, uint32_t *used, uint32_t *total)
{
    pthread_mutex_lock(&dir->mu);
    ctl_resid *t = ctl_resid_dir_find_locked(dir, worker);
    *used = t != NULL ? ctl_resid_used(t) : 0;
    *total = t != NULL ? t->n : 0;
    pthread_mutex_unlock(&dir->mu);
}

void
ctl_resid_kv_counts(ctl_resid_dir *dir, const char *worker, uint32_t *used, uint32_t *total)
{
    *used = 0;
    *total = 0;
    pthread_mutex_lock(&dir->mu);
    ctl_resid *t = ctl_resid_dir_find_locked(dir, worker);
    if (t != NULL && ctl_kv_hybrid(&t->geom)) {
        *used = ctl_resid_pages_used(t);
        *total = t->geom.pages_total;
    }
    pthread_mutex_unlock(&dir->mu);
}

bool
ctl_resid_kv_geom(ctl_resid_dir *dir, const char *worker, ctl_kv_geom *out)
{
    pthread_mutex_lock(&dir->mu);
    ctl_resid *t = ctl_resid_dir_find_locked(dir, worker);
    bool hybrid = t != NULL && ctl_kv_hybrid(&t->geom);
    *out = hybrid ? t->geom : (ctl_kv_geom){0};
    pthread_mutex_unlock(&dir->mu);
    return hybrid;
}

/* ---- The warm tier's index ---- */

static void ctl_resid_hot_lose_key(ctl_resid_dir *dir, const char *key, const char *keep_on);

/* Unlinks and returns the copy of key, NULL when none. Caller holds warm_mu. */
static ctl_resid_warm *
ctl_resid_warm_take_locked(ctl_resid_dir *dir, const char *key)
{
    for (ctl_resid_warm **pp = &dir->warm; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->key, key) == 0) {
            ctl_resid_warm *w = *pp;
            *pp = w->next;
            return w;
        }
    }
    return NULL;
}

wk_err
ctl_resid_warm_put(ctl_resid_dir *dir, const char *key, const char *worker, uint64_t n_ctx,
                   uint64_t epoch, char *prev_worker, size_t cap)
{
    if (cap > 0)
        prev_worker[0] = '\0';
    if (strlen(key) >= CTL_RESID_KEY_MAX)
        return WK_EINVAL;
    ctl_resid_warm *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return WK_ENOMEM;
    snprintf(w->key, sizeof(w->key), "%s", key);
    snprintf(w->worker, sizeof(w->worker), "%s", worker);
    w->ctx = n_ctx;
    w->epoch = epoch;
    pthread_mutex_lock(&dir->warm_mu);
    ctl_resid_warm *old = ctl_resid_warm_take_locked(dir, key);
    w->used = ++dir->warm_clock;
    w->next = dir->warm;
    dir->warm = w;
    pthread_mutex_unlock(&dir->warm_mu);
    if (old != NULL && strcmp(old->worker, worker) != 0) {
        if (cap > 0)
            snprintf(prev_worker, cap, "%s", old->worker);
        ctl_resid_hot_lose_key(dir, key, worker); /* (the copy there is dropped) */
    }
    free(old);
    return WK_OK;
}

bool
ctl_resid_warm_use(ctl_resid_dir *dir, const char *key, const char *worker, uint64_t *n_ctx)
{
    bool found = false;
    pthread_mutex_lock(&dir->warm_mu);
    for (ctl_resid_warm *w = dir->warm; w != NULL && !found; w = w->next) {
        if (strcmp(w->key, key) == 0 && strcmp(w->worker, worker) == 0) {
            w->used = ++dir->warm_clock;
            *n_ctx = w->ctx;
            found = true;
        }
    }
    pthread_mutex_unlock(&dir->warm_mu);
    return found;
}

bool
ctl_resid_warm_where(ctl_resid_dir *dir, const char *key, char *worker, size_t cap, uint64_t *epoch)
{
    bool found = false;
    pthread_mutex_lock(&dir->warm_mu);
    for (ctl_resid_warm *w = dir->warm; w != NULL && !found; w = w->next) {
        if (strcmp(w->key, key) == 0) {
            snprintf(worker, cap, "%s", w->worker);
            *epoch = w->epoch;
            found = true;
        }
    }
    pthread_mutex_unlock(&dir->warm_mu);
    return found;
}

void
ctl_resid_warm_forget(ctl_resid_dir *dir, const char *key)
{
    pthread_mutex_lock(&dir->warm_mu);
    ctl_resid_warm *w = ctl_resid_warm_take_locked(dir, key);
    pthread_mutex_unlock(&dir->warm_mu);
    if (w != NULL)
        ctl_resid_hot_lose_key(dir, key, NULL);
    free(w);
}

bool
ctl_resid_warm_pop_oldest(ctl_resid_dir *dir, const char *worker, char *key_out)
{
    pthread_mutex_lock(&dir->warm_mu);
    ctl_resid_warm *oldest = NULL;
    for (ctl_resid_warm *w = dir->warm; w != NULL; w = w->next) {
        if (strcmp(w->worker, worker) == 0 && (oldest == NULL || w->used < oldest->used))
            oldest = w;
    }
    if (oldest != NULL)
        oldest = ctl_resid_warm_take_locked(dir, oldest->key);
    pthread_mutex_unlock(&dir->warm_mu);
    if (oldest == NULL)
        return false;
    ctl_resid_hot_lose_key(dir, oldest->key, NULL); /* before the caller drops the copy */
    snprintf(key_out, CTL_RESID_KEY_MAX, "%s", oldest->key);
    free(oldest);
    return true;
}

size_t
ctl_resid_warm_count(ctl_resid_dir *dir)
{
    size_t n = 0;
    pthread_mutex_lock(&dir->warm_mu);
    for (ctl_resid_warm *w = dir->warm; w != NULL; w = w->next)
        n++;
    pthread_mutex_unlock(&dir->warm_mu);
    return n;
}

/* ---- The hot index ---- */

/* The newest entry of key, NULL when none. Caller holds the mutex. */
static ctl_resid_hot_node *
ctl_resid_hot_by_key_locked(ctl_resid_dir *dir, const char *key)
{
    for (ctl_resid_hot_node *n = dir->hot; n != NULL; n = n->next) {
        if (strcmp(n->e.key, key) == 0)
            return n;
    }
    return NULL;
}

/* The entry on slot ref, NULL when none. Caller holds the mutex. */
static ctl_resid_hot_node *
ctl_resid_hot_by_slot_locked(ctl_resid_dir *dir, const ctl_slot_ref *ref)
{
    for (ctl_resid_hot_node *n = dir->hot; n != NULL; n = n->next) {
        if (strcmp(n->e.slot.worker, ref->worker) == 0 && n->e.slot.slot == ref->slot &&
            n->e.slot.gen == ref->gen)
            return n;
    }
    return NULL;
}

/* Unlinks n, copies it to *out (NULL: not copied) and frees it. Caller holds the mutex. */
static void
ctl_resid_hot_unlink_locked(ctl_resid_dir *dir, ctl_resid_hot_node *n, ctl_resid_hot *out)
{
    for (ctl_resid_hot_node **pp = &dir->hot; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == n) {
            *pp = n->next;
            break;
        }
    }
    if (out != NULL)
        *out = n->e;
    free(n);
}

/* Marks n used now. Caller holds the mutex. */
static void
ctl_resid_hot_touch_locked(ctl_resid_dir *dir, ctl_resid_hot_node *n)
{
    n->e.used = ++dir->hot_clock;
    n->e.used_ms = wk_mono_ms();
}

/* Waits while key's newest entry is being spilled; returns it. Caller holds the mutex. */
static ctl_resid_hot_node *
ctl_resid_hot_wait_locked(ctl_resid_dir *dir, const char *key)
{
    ctl_resid_hot_node *n = ctl_resid_hot_by_key_locked(dir, key);
    while (n != NULL && n->e.spilling) {
        pthread_cond_wait(&dir->cv, &dir->mu);
        n = ctl_resid_hot_by_key_locked(dir, key);
    }
    return n;
}

/*
 * Marks n dirty: the copy its cleanness rested on is going (a warm copy
 * dropped, a backing checkpoint losing a tier). A cleaner's verdict reached
 * before this (ctl_resid_hot_cleaned with the older `lost`) no longer
 * counts. Caller holds the mutex.
 */
static void
ctl_resid_hot_lose_locked(ctl_resid_hot_node *n)
{
    n->e.lost++;
    if (!n->e.spilled)
        n->e.dirty = true;
}

/*
 * Cached states of key whose clean copy was the warm copy now dropped (on
 * any worker but keep_on, NULL = every one) turn dirty. Takes the mutex
 * (the caller holds no lock).
 */
static void
ctl_resid_hot_lose_key(ctl_resid_dir *dir, const char *key, const char *keep_on)
{
    pthread_mutex_lock(&dir->mu);
    for (ctl_resid_hot_node *n = dir->hot; n != NULL; n = n->next) {
        if (n->e.stored && strcmp(n->e.key, key) == 0 &&
            (keep_on == NULL || strcmp(n->e.slot.worker, keep_on) != 0))
            ctl_resid_hot_lose_locked(n);
    }
    pthread_mutex_unlock(&dir->mu);
}

wk_err
ctl_resid_hot_put(ctl_resid_dir *dir, const char *key, const ctl_slot_ref *slot, bool stored,
                  const char *backing, ctl_resid_hot *old, ctl_resid_hot *out)
{
    memset(old, 0, sizeof(*old));
    if (strlen(key) >= CTL_RESID_KEY_MAX ||
        (backing != NULL && strlen(backing) >= CTL_RESID_KEY_MAX))
        return WK_EINVAL;
    ctl_resid_hot_node *nn = calloc(1, sizeof(*nn));
    if (nn == NULL)
        return WK_ENOMEM;
    snprintf(nn->e.key, sizeof(nn->e.key), "%s", key);
    if (!stored && backing != NULL)
        snprintf(nn->e.backing, sizeof(nn->e.backing), "%s", backing);
    nn->e.slot = *slot;
    nn->e.dirty = true; /* until a copy to resume from is known (ctl_resid_hot_cleaned) */
    nn->e.stored = stored;
    pthread_mutex_lock(&dir->mu);
    ctl_resid_hot_node *o = ctl_resid_hot_by_key_locked(dir, key);
    if (o != NULL && !o->e.taken)
        ctl_resid_hot_unlink_locked(dir, o, old);
    nn->e.id = ++dir->hot_ids;
    ctl_resid_hot_touch_locked(dir, nn);
    nn->next = dir->hot;
    dir->hot = nn;
    if (out != NULL)
        *out = nn->e;
    pthread_mutex_unlock(&dir->mu);
    return WK_OK;
}

uint32_t
ctl_resid_hot_unback(ctl_resid_dir *dir, const char *backing)
{
    uint32_t count = 0;
    pthread_mutex_lock(&dir->mu);
    for (ctl_resid_hot_node *n = dir->hot; n != NULL; n = n->next) {
        if (n->e.backing[0] != '\0' && strcmp(n->e.backing, backing) == 0) {
            ctl_resid_hot_lose_locked(n);
            count++;
        }
    }
    pthread_mutex_unlock(&dir->mu);
    return count;
}

/*
 * Entry id's verdict: clean unless its copy was lost since `lost` was read
 * (spilled: clean whatever happened); ends_pick: the caller is the cleaner
 * that picked it (taken, spilling), whose pick ends. Bumps clean_gen and
 * wakes waiters. True when it is clean now. Caller holds the mutex.
 */
static bool
ctl_resid_hot_verdict_locked(ctl_resid_dir *dir, uint64_t id, uint64_t lost, bool spilled,
                             bool ends_pick)
{
    bool clean = false;
    for (ctl_resid_hot_node *n = dir->hot; n != NULL; n = n->next) {
        if (n->e.id != id)
            continue;
        if (spilled) {
            n->e.spilled = true; /* its bytes are in the store, whatever its backing does */
            n->e.dirty = false;
        } else if (n->e.lost == lost) {
            n->e.dirty = false;
        }
        clean = !n->e.dirty;
        if (ends_pick && n->e.spilling) { /* the cleaner's pick ends */
            n->e.spilling = false;
            n->e.taken = false;
        }
        break;
    }
    dir->clean_gen++;
    pthread_cond_broadcast(&dir->cv); /* lookups waiting for the spill; admission */
    return clean;
}

bool
ctl_resid_hot_cleaned(ctl_resid_dir *dir, uint64_t id, uint64_t lost, bool spilled)
{
    pthread_mutex_lock(&dir->mu);
    bool clean = ctl_resid_hot_verdict_locked(dir, id, lost, spilled, true);
    pthread_mutex_unlock(&dir->mu);
    return clean;
}

bool
ctl_resid_hot_mark_clean(ctl_resid_dir *dir, uint64_t id, uint64_t lost)
{
    pthread_mutex_lock(&dir->mu);
    bool clean = ctl_resid_hot_verdict_locked(dir, id, lost, false, false);
    pthread_mutex_unlock(&dir->mu);
    return clean;
}

uint64_t
ctl_resid_hot_clean_gen_locked(const ctl_resid_dir *dir)
{
    return dir->clean_gen;
}

wk_err
ctl_resid_hot_remove_key(ctl_resid_dir *dir, const char *key, bool wait, bool only_stored,
                         ctl_resid_hot *out)
{
    pthread_mutex_lock(&dir->mu);
    ctl_resid_hot_node *n = wait ? ctl_resid_hot_wait_locked(dir, key)
                                 : ctl_resid_hot_by_key_locked(dir, key);
    wk_err err = n == NULL                    ? WK_ENOENT
                 : n->e.taken                 ? WK_EBUSY
                 : only_stored && !n->e.stored ? WK_ESTATE
                                              : WK_OK;
    if (err == WK_OK)
        ctl_resid_hot_unlink_locked(dir, n, out);
    pthread_mutex_unlock(&dir->mu);
    return err;
}

wk_err
ctl_resid_hot_remove_slot(ctl_resid_dir *dir, const ctl_slot_ref *ref, ctl_resid_hot *out)
{
    pthread_mutex_lock(&dir->mu);
    ctl_resid_hot_node *n = ctl_resid_hot_by_slot_locked(dir, ref);
    wk_err err = n == NULL ? WK_ENOENT : n->e.taken ? WK_EBUSY : WK_OK;
    if (err == WK_OK)
        ctl_resid_hot_unlink_locked(dir, n, out);
    pthread_mutex_unlock(&dir->mu);
    return err;
}

void
ctl_resid_hot_remove_id(ctl_resid_dir *dir, uint64_t id)
{
    pthread_mutex_lock(&dir->mu);
    for (ctl_resid_hot_node *n = dir->hot; n != NULL; n = n->next) {
        if (n->e.id == id) {
            ctl_resid_hot_unlink_locked(dir, n, NULL);
            break;
        }
    }
    dir->clean_gen++;
    pthread_cond_broadcast(&dir->cv);
    pthread_mutex_unlock(&dir->mu);
}

/* Pins n (when free) and copies it out. Caller holds the mutex. */
static wk_err
ctl_resid_hot_pin_locked(ctl_resid_hot_node *n, ctl_resid_hot *out)
{
    if (n == NULL)
        return WK_ENOENT;
    if (n->e.taken)
        return WK_EBUSY;
    n->e.taken = true;
    *out = n->e;
    return WK_OK;
}

wk_err
ctl_resid_hot_pin_key(ctl_resid_dir *dir, const char *key, ctl_resid_hot *out)
{
    pthread_mutex_lock(&dir->mu);
    ctl_resid_hot_node *n = ctl_resid_hot_by_key_locked(dir, key);
    if (n != NULL && !n->e.taken)
        ctl_resid_hot_touch_locked(dir, n);
    wk_err err = ctl_resid_hot_pin_locked(n, out);
    pthread_mutex_unlock(&dir->mu);
    return err;
}

wk_err
ctl_resid_hot_pin_slot(ctl_resid_dir *dir, const ctl_slot_ref *ref, ctl_resid_hot *out)
{
    pthread_mutex_lock(&dir->mu);
    wk_err err = ctl_resid_hot_pin_locked(ctl_resid_hot_by_slot_locked(dir, ref), out);
    pthread_mutex_unlock(&dir->mu);
    return err;
}

void
ctl_resid_hot_unpin(ctl_resid_dir *dir, uint64_t id, const ctl_slot_ref *moved_to)
{
    pthread_mutex_lock(&dir->mu);
    for (ctl_resid_hot_node *n = dir->hot; n != NULL; n = n->next) {
        if (n->e.id == id) {
            n->e.taken = false;
            /* (a cached state's warm copy stays on the worker it left: no use from there) */
            if (moved_to != NULL && n->e.stored && strcmp(moved_to->worker, n->e.slot.worker) != 0)
                ctl_resid_hot_lose_locked(n);
            if (moved_to != NULL)
                n->e.slot = *moved_to;
            break;
        }
    }
    pthread_mutex_unlock(&dir->mu);
}

bool
ctl_resid_hot_find(ctl_resid_dir *dir, const char *key, ctl_slot_ref *slot)
{
    pthread_mutex_lock(&dir->mu);
    ctl_resid_hot_node *n = ctl_resid_hot_wait_locked(dir, key);
    if (n != NULL)
        *slot = n->e.slot;
    pthread_mutex_unlock(&dir->mu);
    return n != NULL;
}

bool
ctl_resid_hot_describe(ctl_resid_dir *dir, const ctl_slot_ref *ref, ctl_resid_hot *out,
                       uint64_t *age)
{
    pthread_mutex_lock(&dir->mu);
    ctl_resid_hot_node *n = ctl_resid_hot_by_slot_locked(dir, ref);
    if (n != NULL) {
        *out = n->e;
        *age = dir->hot_clock - n->e.used;
    }
    pthread_mutex_unlock(&dir->mu);
    return n != NULL;
}

void
ctl_resid_hot_counts(ctl_resid_dir *dir, uint32_t *clean, uint32_t *dirty)
{
    *clean = 0;
    *dirty = 0;
    pthread_mutex_lock(&dir->mu);
    for (ctl_resid_hot_node *n = dir->hot; n != NULL; n = n->next) {
        if (n->e.dirty)
            (*dirty)++;
        else
            (*clean)++;
    }
    pthread_mutex_unlock(&dir->mu);
}

void
ctl_resid_hot_kinds(ctl_resid_dir *dir, uint32_t *states, uint32_t *sessions)
{
    *states = 0;
    *sessions = 0;
    pthread_mutex_lock(&dir->mu);
    for (ctl_resid_hot_node *n = dir->hot; n != NULL; n = n->next) {
        if (n->e.stored)
            (*states)++;
        else if (!n->e.spilled)
            (*sessions)++;
    }
    pthread_mutex_unlock(&dir->mu);
}

size_t
ctl_resid_hot_slots_on(ctl_resid_dir *dir, const char *worker, ctl_slot_ref *out, size_t cap)
{
    size_t count = 0;
    pthread_mutex_lock(&dir->mu);
    for (ctl_resid_hot_node *n = dir->hot; n != NULL; n = n->next) {
        if (strcmp(n->e.slot.worker, worker) != 0)
            continue;
        if (count < cap)
            out[count] = n->e.slot;
        count++;
    }
    pthread_mutex_unlock(&dir->mu);
    return count;
}

/* Which entries a victim may be. */
typedef enum ctl_resid_pick { CTL_RESID_ANY, CTL_RESID_CLEAN, CTL_RESID_DIRTY } ctl_resid_pick;

/*
 * The eviction victim: the least recently used idle entry of kind `kind`
 * (ctl_resid_hot_victim()'s rules), NULL when none. Caller holds the mutex.
 */
static ctl_resid_hot_node *
ctl_resid_hot_choose_locked(ctl_resid_dir *dir, const char *worker, uint32_t pages,
                            ctl_resid_pick kind)
{
    ctl_resid_hot_node *victim = NULL;
    uint64_t idle_pages = 0;
    for (ctl_resid_hot_node *n = dir->hot; n != NULL; n = n->next) {
        if (worker != NULL && strcmp(n->e.slot.worker, worker) != 0)
            continue;
        if (n->e.taken)
            continue;
        uint32_t p = 0;
        if (pages > 0) {
            ctl_resid *t = ctl_resid_dir_find_locked(dir, n->e.slot.worker);
            if (t != NULL && ctl_resid_live(t, n->e.slot.slot, n->e.slot.gen))
                p = t->pages[n->e.slot.slot];
            if (p == 0)
                continue; /* evicting it frees no page */
        }
        idle_pages += p; /* (every idle entry counts towards the room evicting can make) */
        if ((kind == CTL_RESID_CLEAN && n->e.dirty) || (kind == CTL_RESID_DIRTY && !n->e.dirty))
            continue;
        if (victim == NULL || n->e.used < victim->e.used)
            victim = n;
    }
    if (pages > 0 && idle_pages < pages)
        return NULL; /* evicting all of them would not make room: keep them */
    return victim;
}

wk_err
ctl_resid_hot_victim(ctl_resid_dir *dir, const char *worker, uint32_t pages,
                     ctl_resid_hot *out)
{
    pthread_mutex_lock(&dir->mu);
    /* A clean entry first: freeing it needs no I/O. */
    ctl_resid_hot_node *victim = ctl_resid_hot_choose_locked(dir, worker, pages, CTL_RESID_CLEAN);
    if (victim == NULL)
        victim = ctl_resid_hot_choose_locked(dir, worker, pages, CTL_RESID_ANY);
    wk_err err = victim != NULL ? WK_OK : WK_ENOENT;
    if (victim != NULL && victim->e.dirty) {
        victim->e.taken = true;
        victim->e.spilling = true;
        *out = victim->e;
    } else if (victim != NULL) {
        ctl_resid_hot_unlink_locked(dir, victim, out);
    }
    pthread_mutex_unlock(&dir->mu);
    return err;
}

wk_err
ctl_resid_hot_evict_clean_locked(ctl_resid_dir *dir, const char *worker, uint32_t pages,
                                 ctl_resid_hot *out)
{
    ctl_resid_hot_node *victim = ctl_resid_hot_choose_locked(dir, worker, pages, CTL_RESID_CLEAN);
    if (victim == NULL)
        return ctl_resid_hot_choose_locked(dir, worker, pages, CTL_RESID_DIRTY) != NULL
                   ? WK_EBUSY /* only dirty ones: cleaning them is I/O, ctl_vm's */
                   : WK_ENOENT;
    ctl_slot_ref ref = victim->e.slot;
    ctl_resid_hot_unlink_locked(dir, victim, out);
    ctl_resid *t = ctl_resid_live_locked(dir, &ref);
    if (t != NULL && t->busy[ref.slot] == NULL) {
        ctl_resid_clear(t, ref.slot); /* hybrid: stale until the step loop frees its pages */
        ctl_resid_dir_released_locked(dir);
    }
    return WK_OK;
}

uint32_t
ctl_resid_slot_coming_locked(ctl_resid_dir *dir, const char *worker)
{
    uint32_t n = 0;
    for (size_t i = 0; i < CTL_RESID_MAX_WORKERS; i++) {
        const ctl_resid *t = dir->tables[i];
        if (t == NULL || (worker != NULL ? strcmp(t->worker, worker) != 0 : t->draining))
            continue;
        for (uint32_t k = 1; k <= t->n; k++)
            n += t->gen[k] == 0 && t->stale[k];
    }
    return n;
}

void
ctl_resid_hot_want_clean_locked(ctl_resid_dir *dir, const char *worker, uint32_t pages)
{
    for (ctl_resid_hot_node *n = dir->hot; n != NULL; n = n->next) {
        if (n->e.spilling && (worker == NULL || strcmp(n->e.slot.worker, worker) == 0))
            return; /* one is being cleaned there: its end makes the room (no second spill) */
    }
    dir->clean_wanted = true;
    snprintf(dir->clean_worker, sizeof(dir->clean_worker), "%s", worker != NULL ? worker : "");
    dir->clean_pages = worker != NULL ? pages : 0;
    pthread_cond_broadcast(&dir->cv);
}

/*
 * The idle cleaner's pick: the least recently used session not in the
 * store that no one holds, when it was idle idle_ms (0: never) or more than
 * max_unspilled (0: no cap) are not in the store. Caller holds the mutex.
 */
static ctl_resid_hot_node *
ctl_resid_hot_idle_locked(ctl_resid_dir *dir, uint64_t now_ms, uint64_t idle_ms,
                          uint32_t max_unspilled)
{
    ctl_resid_hot_node *oldest = NULL;
    uint32_t unspilled = 0;
    for (ctl_resid_hot_node *n = dir->hot; n != NULL; n = n->next) {
        if (n->e.stored || n->e.spilled)
            continue;
        unspilled++;
        if (!n->e.taken && (oldest == NULL || n->e.used < oldest->e.used))
            oldest = n;
    }
    if (oldest == NULL)
        return NULL;
    bool idle = idle_ms > 0 && now_ms - oldest->e.used_ms >= idle_ms;
    bool over = max_unspilled > 0 && unspilled > max_unspilled;
    return idle || over ? oldest : NULL;
}

bool
ctl_resid_hot_next_clean(ctl_resid_dir *dir, uint64_t idle_ms, uint32_t max_unspilled,
                         uint64_t wait_ms, const atomic_bool *stop, ctl_resid_hot *out,
                         bool *for_room)
{
    pthread_mutex_lock(&dir->mu);
    uint64_t until = wk_mono_ms() + wait_ms;
    ctl_resid_hot_node *pick = NULL;
    while (stop == NULL || !atomic_load(stop)) {
        if (dir->clean_wanted) {
            /* (the request is consumed: the scheduler asks again while it starves) */
            dir->clean_wanted = false;
            pick = ctl_resid_hot_choose_locked(dir, dir->clean_worker[0] ? dir->clean_worker : NULL,
                                               dir->clean_pages, CTL_RESID_DIRTY);
            *for_room = pick != NULL;
        }
        uint64_t now = wk_mono_ms();
        if (pick == NULL) {
            pick = ctl_resid_hot_idle_locked(dir, now, idle_ms, max_unspilled);
            *for_room = false;
        }
        if (pick != NULL || now >= until)
            break;
        struct timespec ts;
        wk_deadline_after_ms(&ts, until - now);
        pthread_cond_timedwait(&dir->cv, &dir->mu, &ts);
    }
    if (pick != NULL) {
        pick->e.taken = true;
        pick->e.spilling = true; /* lookups wait for its cleaning */
        *out = pick->e;
    }
    pthread_mutex_unlock(&dir->mu);
    return pick != NULL;
}

void
ctl_resid_hot_kick(ctl_resid_dir *dir)
{
    pthread_mutex_lock(&dir->mu);
    pthread_cond_broadcast(&dir->cv);
    pthread_mutex_unlock(&dir->mu);
}

bool
ctl_resid_hot_pop_unspilled(ctl_resid_dir *dir, ctl_resid_hot *out)
{
    pthread_mutex_lock(&dir->mu);
    ctl_resid_hot_node *n = dir->hot;
    while (n != NULL && (n->e.stored || n->e.spilled || n->e.taken))
        n = n->next;
    if (n != NULL)
        ctl_resid_hot_unlink_locked(dir, n, out);
    pthread_mutex_unlock(&dir->mu);
    return n != NULL;
}
