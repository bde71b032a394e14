/*
 * be_cpu_kv: the CPU backend's paged KV pool for hybrid models (recurrent
 * layers plus a few full-attention layers; be.h, be_kv_info).
 *
 * One pool of pages_total pages, each page_tokens tokens of tok_floats
 * fp32 values laid out exactly like the slot image's KV part (token-major;
 * what a token holds is the family's business), plus one page table per
 * slot. Slot s holds the first n_ctx tokens of its sequence in
 * ceil(n_ctx / page_tokens) pages; token t lives in page pages[t /
 * page_tokens] at row t % page_tokens. Free pages are a stack, so which
 * page a slot gets depends only on the order of operations (never on
 * threads); page contents are not cleared when a page is reused (only the
 * first n_ctx tokens of a slot are ever read).
 *
 * Every operation that can fail checks first and changes nothing on
 * failure (WK_EQUOTA: the pool has too few free pages; WK_ENOMEM: a page
 * table could not grow). Not thread-safe: the backend's one caller at a
 * time. Never logs, never aborts on bad input.
 */
#ifndef BE_CPU_KV_H
#define BE_CPU_KV_H

#include <stddef.h>
#include <stdint.h>

#include "be.h"

/* One slot's page table. */
typedef struct be_cpu_kv_slot {
    uint32_t n_ctx;   /* tokens held */
    uint32_t n_pages; /* pages held: ceil(n_ctx / page_tokens) */
    uint32_t cap;     /* entries allocated in pages */
    uint32_t *pages;  /* page ids [cap], owned */
    uint32_t pos0;    /* n_ctx before the current step (be_cpu_kv_reserve) */
} be_cpu_kv_slot;

typedef struct be_cpu_kv {
    size_t tok_floats;     /* floats per token */
    uint32_t page_tokens;  /* tokens per page */
    uint32_t pages_total;  /* pages in the pool */
    uint32_t n_free;       /* entries on the free stack */
    uint32_t *free_pages;  /* free stack [pages_total], owned */
    float *pool;           /* pages_total * page_tokens * tok_floats, owned */
    uint32_t n_slots;      /* slots (incl. the padding slot 0) */
    be_cpu_kv_slot *slots; /* [n_slots], owned */
} be_cpu_kv;

/*
 * Sets kv up: n_slots empty slots, pages_total pages of page_tokens tokens
 * of tok_floats floats (all >= 1). The pool's memory is reserved, not
 * touched. Returns WK_EINVAL (a zero size), WK_ENOMEM (the diag gives the
 * bytes); kv is ready for be_cpu_kv_fini either way.
 */
WK_MUST_CHECK wk_err be_cpu_kv_init(be_cpu_kv *kv, uint32_t n_slots, size_t tok_floats,
                                    uint32_t page_tokens, uint32_t pages_total, wk_diag *d);

/* Frees everything (NULL-safe, and safe on a zeroed or half-built kv). */
void be_cpu_kv_fini(be_cpu_kv *kv);

/* Pages that n_ctx tokens need. */
static inline uint32_t
be_cpu_kv_pages_for(const be_cpu_kv *kv, uint64_t n_ctx)
{
    return (uint32_t)((n_ctx + kv->page_tokens - 1) / kv->page_tokens);
}

/* Token pos of slot (pos < the slot's n_ctx, unchecked). */
static inline float *
be_cpu_kv_tok(const be_cpu_kv *kv, uint32_t slot, uint32_t pos)
{
    const be_cpu_kv_slot *s = &kv->slots[slot];
    const size_t page = s->pages[pos / kv->page_tokens];
    return kv->pool + (page * kv->page_tokens + pos % kv->page_tokens) * kv->tok_floats;
}

/* Frees slot's pages; n_ctx becomes 0. slot < n_slots (else no-op). */
void be_cpu_kv_reset(be_cpu_kv *kv, uint32_t slot);

/*
 * Sets slot's n_ctx, taking pages from or giving them back to the pool
 * (contents of new tokens unspecified). WK_EINVAL (slot out of range, or
 * n_ctx over what the whole pool can hold), WK_EQUOTA, WK_ENOMEM; nothing
 * changed on failure.
 */
WK_MUST_CHECK wk_err be_cpu_kv_set_ctx(be_cpu_kv *kv, uint32_t slot, uint64_t n_ctx);

/*
 * Makes dst hold a copy of src's tokens (dst's old pages are given back
 * first, so they count as available). dst != src, both < n_slots.
 * WK_EQUOTA, WK_ENOMEM; nothing changed on failure.
 */
WK_MUST_CHECK wk_err be_cpu_kv_copy(be_cpu_kv *kv, uint32_t dst, uint32_t src);

/*
 * Reads (write false) or writes len bytes of slot's KV image (token-major,
 * n_ctx * tok_floats * 4 bytes) at byte offset off. The caller has checked
 * off + len against the image size.
 */
void be_cpu_kv_rw(be_cpu_kv *kv, uint32_t slot, uint64_t off, void *buf, size_t len, bool write);

/*
 * A step's pages: every row on a slot other than 0 grows its slot by
 * n_tokens; a reset row (be_row.reset) starts from n_ctx 0, its pages
 * counted as free for the check. Checks that the pool can supply all of
 * them (WK_EQUOTA naming the first row that does not fit; WK_EINVAL when a
 * slot would pass UINT32_MAX tokens; WK_ENOMEM; nothing changed on
 * failure), and only then gives back the reset rows' pages (in row order)
 * and takes the new ones: each slot's pos0 becomes its old n_ctx (0 after
 * a reset), n_ctx the new one. Rows have been validated (slots in range,
 * no duplicates).
 */
WK_MUST_CHECK wk_err be_cpu_kv_reserve(be_cpu_kv *kv, const be_row *rows, size_t n, wk_diag *d);

/* The pool's geometry and occupancy (kv_token_bytes from tok_floats). */
void be_cpu_kv_info(const be_cpu_kv *kv, be_kv_info *out);

#endif /* BE_CPU_KV_H */
