/*
 * ctl_resid: one worker's slot residence table (slot generations, the job on
 * each slot, context and KV pages), moved out of ctl_sched so that one
 * module owns it. No lock: the scheduler's mutex guards it (ctl_resid.h).
 */
#include "ctl_resid.h"

#include <stdlib.h>
#include <string.h>

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
