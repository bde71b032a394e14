/*
 * be_kv: the page table of the paged KV pool, shared by every backend (see
 * be_kv.h). Never touches the pool's bytes itself: the backend's callbacks
 * do.
 */
#include "be_kv.h"

#include <stdlib.h>
#include <string.h>

wk_err
be_kv_init(be_kv *kv, uint32_t n_slots, size_t tok_floats, uint32_t page_tokens,
           uint32_t pages_total, const char *who, size_t *pool_bytes, wk_diag *d)
{
    memset(kv, 0, sizeof(*kv));
    if (n_slots == 0 || tok_floats == 0 || page_tokens == 0 || pages_total == 0)
        return wk_diag_set(d, WK_EINVAL, "%s: empty KV pool geometry", who);
    const size_t page_floats = (size_t)page_tokens * tok_floats;
    if (page_floats / page_tokens != tok_floats ||
        (size_t)pages_total > SIZE_MAX / sizeof(float) / page_floats)
        return wk_diag_set(d, WK_ENOMEM, "%s: a KV pool of %u pages does not fit", who,
                           pages_total);
    kv->tok_floats = tok_floats;
    kv->page_tokens = page_tokens;
    kv->pages_total = pages_total;
    kv->n_slots = n_slots;
    kv->free_pages = malloc(sizeof(uint32_t) * pages_total);
    kv->slots = calloc(n_slots, sizeof(*kv->slots));
    if (kv->free_pages == NULL || kv->slots == NULL)
        return wk_diag_set(d, WK_ENOMEM, "%s: out of memory for KV page tables", who);
    /* page 0 on top: a fresh pool hands pages out in ascending order */
    for (uint32_t i = 0; i < pages_total; i++)
        kv->free_pages[i] = pages_total - 1 - i;
    kv->n_free = pages_total;
    if (pool_bytes != NULL)
        *pool_bytes = (size_t)pages_total * page_floats * sizeof(float);
    return WK_OK;
}

void
be_kv_fini(be_kv *kv)
{
    if (kv == NULL)
        return;
    if (kv->slots != NULL)
        for (uint32_t s = 0; s < kv->n_slots; s++)
            free(kv->slots[s].pages);
    free(kv->slots);
    free(kv->free_pages);
    memset(kv, 0, sizeof(*kv));
}

/* Grows slot's page table to hold n entries; nothing else changes. */
static wk_err
be_kv_grow(be_kv_slot *s, uint32_t n)
{
    if (n <= s->cap)
        return WK_OK;
    uint32_t cap = s->cap ? s->cap : 8;
    while (cap < n)
        cap = cap > UINT32_MAX / 2 ? n : cap * 2;
    uint32_t *p = realloc(s->pages, sizeof(uint32_t) * cap);
    if (p == NULL)
        return WK_ENOMEM;
    s->pages = p;
    s->cap = cap;
    return WK_OK;
}

/* Gives back pages beyond the first keep. */
static void
be_kv_shrink(be_kv *kv, be_kv_slot *s, uint32_t keep)
{
    while (s->n_pages > keep)
        kv->free_pages[kv->n_free++] = s->pages[--s->n_pages];
}

/* Takes pages until the slot holds want (the caller checked n_free and cap). */
static void
be_kv_take(be_kv *kv, be_kv_slot *s, uint32_t want)
{
    while (s->n_pages < want)
        s->pages[s->n_pages++] = kv->free_pages[--kv->n_free];
}

void
be_kv_reset(be_kv *kv, uint32_t slot)
{
    if (kv == NULL || kv->slots == NULL || slot >= kv->n_slots)
        return;
    be_kv_slot *s = &kv->slots[slot];
    be_kv_shrink(kv, s, 0);
    s->n_ctx = 0;
    s->pos0 = 0;
}

wk_err
be_kv_set_ctx(be_kv *kv, uint32_t slot, uint64_t n_ctx)
{
    if (slot >= kv->n_slots || n_ctx > (uint64_t)kv->pages_total * kv->page_tokens ||
        n_ctx > UINT32_MAX)
        return WK_EINVAL;
    be_kv_slot *s = &kv->slots[slot];
    const uint32_t want = be_kv_pages_for(kv, n_ctx);
    if (want > s->n_pages) {
        if (want - s->n_pages > kv->n_free)
            return WK_EQUOTA;
        if (be_kv_grow(s, want) != WK_OK)
            return WK_ENOMEM;
        be_kv_take(kv, s, want);
    } else {
        be_kv_shrink(kv, s, want);
    }
    s->n_ctx = (uint32_t)n_ctx;
    s->pos0 = s->n_ctx;
    return WK_OK;
}

wk_err
be_kv_copy(be_kv *kv, uint32_t dst, uint32_t src, be_kv_copy_fn copy, void *arg)
{
    if (dst >= kv->n_slots || src >= kv->n_slots || dst == src)
        return WK_EINVAL;
    be_kv_slot *sd = &kv->slots[dst];
    const be_kv_slot *ss = &kv->slots[src];
    const uint32_t want = ss->n_pages;
    if (want > sd->n_pages && want - sd->n_pages > kv->n_free)
        return WK_EQUOTA;
    if (be_kv_grow(sd, want) != WK_OK)
        return WK_ENOMEM;
    /* keep dst's first pages, give back or take the difference */
    if (want > sd->n_pages)
        be_kv_take(kv, sd, want);
    else
        be_kv_shrink(kv, sd, want);
    sd->n_ctx = ss->n_ctx;
    sd->pos0 = sd->n_ctx;
    const uint64_t page_bytes = (uint64_t)kv->page_tokens * kv->tok_floats * sizeof(float);
    for (uint32_t i = 0; i < want; i++) {
        /* the last page only up to the tokens src holds */
        size_t toks = i + 1 < want ? kv->page_tokens : ss->n_ctx - (size_t)i * kv->page_tokens;
        wk_err e = copy(arg, (uint64_t)sd->pages[i] * page_bytes,
                        (uint64_t)ss->pages[i] * page_bytes, toks * kv->tok_floats * sizeof(float));
        if (e != WK_OK)
            return e;
    }
    return WK_OK;
}

wk_err
be_kv_rw(const be_kv *kv, uint32_t slot, uint64_t off, void *buf, size_t len, bool write,
         be_kv_rw_fn rw, void *arg)
{
    const be_kv_slot *s = &kv->slots[slot];
    const uint64_t page_bytes = (uint64_t)kv->page_tokens * kv->tok_floats * sizeof(float);
    uint8_t *b = buf;
    while (len > 0) {
        /* the piece of page pi from byte po: may start and end inside a token */
        const uint64_t pi = off / page_bytes, po = off % page_bytes;
        const size_t n = page_bytes - po < len ? (size_t)(page_bytes - po) : len;
        wk_err e = rw(arg, (uint64_t)s->pages[pi] * page_bytes + po, b, n, write);
        if (e != WK_OK)
            return e;
        b += n;
        off += n;
        len -= n;
    }
    return WK_OK;
}

wk_err
be_kv_reserve(be_kv *kv, const be_row *rows, size_t n, wk_diag *d)
{
    /* a reset row starts from n_ctx 0: its pages count as given back before any is taken */
    uint64_t avail = kv->n_free;
    for (size_t i = 0; i < n; i++)
        if (rows[i].slot != 0 && rows[i].reset)
            avail += kv->slots[rows[i].slot].n_pages;
    uint64_t need = 0;
    for (size_t i = 0; i < n; i++) {
        const be_row *r = &rows[i];
        if (r->slot == 0)
            continue;
        const be_kv_slot *s = &kv->slots[r->slot];
        const uint64_t ctx = (r->reset ? 0 : (uint64_t)s->n_ctx) + r->n_tokens;
        if (ctx > UINT32_MAX)
            return wk_diag_set(d, WK_EINVAL, "row %zu: slot %u would hold over %u tokens", i,
                               r->slot, UINT32_MAX);
        need += be_kv_pages_for(kv, ctx) - (r->reset ? 0 : s->n_pages);
        if (need > avail)
            return wk_diag_set(d, WK_EQUOTA,
                               "row %zu: slot %u needs KV pages for %llu tokens; the pool has "
                               "%llu of %u pages free (%u tokens each) for this step",
                               i, r->slot, (unsigned long long)ctx, (unsigned long long)avail,
                               kv->pages_total, kv->page_tokens);
    }
    for (size_t i = 0; i < n; i++) {
        const be_row *r = &rows[i];
        if (r->slot == 0)
            continue;
        be_kv_slot *s = &kv->slots[r->slot];
        const uint64_t ctx = (r->reset ? 0 : (uint64_t)s->n_ctx) + r->n_tokens;
        if (be_kv_grow(s, be_kv_pages_for(kv, ctx)) != WK_OK)
            return wk_diag_set(d, WK_ENOMEM, "row %zu: out of memory for a KV page table", i);
    }
    /* nothing can fail from here: the resets' pages go back first, in row order */
    for (size_t i = 0; i < n; i++)
        if (rows[i].slot != 0 && rows[i].reset)
            be_kv_reset(kv, rows[i].slot);
    for (size_t i = 0; i < n; i++) {
        const be_row *r = &rows[i];
        if (r->slot == 0)
            continue;
        be_kv_slot *s = &kv->slots[r->slot];
        s->pos0 = s->n_ctx;
        s->n_ctx += r->n_tokens;
        be_kv_take(kv, s, be_kv_pages_for(kv, s->n_ctx));
    }
    return WK_OK;
}

void
be_kv_usage(const be_kv *kv, be_kv_info *out)
{
    memset(out, 0, sizeof(*out));
    if (kv == NULL || kv->pool == NULL)
        return;
    out->kv_token_bytes = be_kv_token_bytes(kv);
    out->page_tokens = kv->page_tokens;
    out->pages_total = kv->pages_total;
    out->pages_free = kv->n_free;
}
