/*
 * be_kv: the page table of a backend's paged KV pool for hybrid models
 * (recurrent layers plus a few full-attention layers; be.h, be_kv_info),
 * the same code for every backend, so every backend hands out the same
 * pages for the same sequence of operations.
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
 * This module keeps the host-side accounting only; the pool's bytes
 * (be_kv.pool: host memory on the CPU, device memory on CUDA) are
 * allocated, freed and copied by the backend (be_cpu_kv.c, be_cuda_kv.c),
 * which hands the byte moves to be_kv_copy / be_kv_rw as callbacks.
 *
 * Every operation that can fail checks first and changes nothing on
 * failure (WK_EQUOTA: the pool has too few free pages; WK_ENOMEM: a page
 * table could not grow). Not thread-safe: the backend's one caller at a
 * time. Never logs, never aborts on bad input, makes no device call.
 */
#ifndef BE_KV_H
#define BE_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "be.h"

/* One slot's page table (host memory). */
typedef struct be_kv_slot {
    uint32_t n_ctx;   /* tokens held */
    uint32_t n_pages; /* pages held: ceil(n_ctx / page_tokens) */
    uint32_t cap;     /* entries allocated in pages */
    uint32_t *pages;  /* page ids [cap], owned */
    uint32_t pos0;    /* n_ctx before the current step (be_kv_reserve) */
} be_kv_slot;

typedef struct be_kv {
    size_t tok_floats;     /* floats per token */
    uint32_t page_tokens;  /* tokens per page */
    uint32_t pages_total;  /* pages in the pool */
    uint32_t n_free;       /* entries on the free stack */
    uint32_t *free_pages;  /* free stack [pages_total], host, owned */
    float *pool;           /* pages_total * page_tokens * tok_floats: the backend's (host or
                              device memory), allocated and freed by it; NULL until then */
    uint32_t n_slots;      /* slots (incl. the padding slot 0) */
    be_kv_slot *slots;     /* [n_slots], host, owned */
} be_kv;

/*
 * Sets kv's tables up: n_slots empty slots, pages_total pages of
 * page_tokens tokens of tok_floats floats (all >= 1); pool stays NULL for
 * the backend to allocate (*pool_bytes, when not NULL, gets its size).
 * who ("cpu backend") starts the diag. Returns WK_EINVAL (a zero size),
 * WK_ENOMEM (a size that overflows, or the tables); kv is ready for
 * be_kv_fini either way.
 */
WK_MUST_CHECK wk_err be_kv_init(be_kv *kv, uint32_t n_slots, size_t tok_floats,
                                uint32_t page_tokens, uint32_t pages_total, const char *who,
                                size_t *pool_bytes, wk_diag *d);

/*
 * Frees the tables (NULL-safe, and safe on a zeroed or half-built kv) and
 * zeroes kv; the backend has freed pool first.
 */
void be_kv_fini(be_kv *kv);

/* Pages that n_ctx tokens need. */
static inline uint32_t
be_kv_pages_for(const be_kv *kv, uint64_t n_ctx)
{
    return (uint32_t)((n_ctx + kv->page_tokens - 1) / kv->page_tokens);
}

/* Bytes of KV per token. */
static inline uint64_t
be_kv_token_bytes(const be_kv *kv)
{
    return (uint64_t)kv->tok_floats * sizeof(float);
}

/* Frees slot's pages; n_ctx becomes 0. slot < n_slots (else no-op). */
void be_kv_reset(be_kv *kv, uint32_t slot);

/*
 * Sets slot's n_ctx, taking pages from or giving them back to the pool
 * (contents of new tokens unspecified). WK_EINVAL (slot out of range, or
 * n_ctx over what the whole pool can hold), WK_EQUOTA, WK_ENOMEM; nothing
 * changed on failure.
 */
WK_MUST_CHECK wk_err be_kv_set_ctx(be_kv *kv, uint32_t slot, uint64_t n_ctx);

/*
 * Moves bytes bytes inside the pool, from byte offset src to byte offset
 * dst (be_kv_copy); the backend's memcpy. Returns WK_OK or its error.
 */
typedef wk_err (*be_kv_copy_fn)(void *arg, uint64_t dst, uint64_t src, size_t bytes);

/*
 * Makes dst hold a copy of src's tokens (dst's old pages are given back
 * first, so they count as available): the page table first, then copy()
 * for each page, in page order, the last one only up to the tokens src
 * holds. dst != src, both < n_slots. WK_EINVAL, WK_EQUOTA, WK_ENOMEM
 * (nothing changed), or copy()'s error (the page table has changed, the
 * contents are unspecified).
 */
WK_MUST_CHECK wk_err be_kv_copy(be_kv *kv, uint32_t dst, uint32_t src, be_kv_copy_fn copy,
                                void *arg);

/*
 * Moves n bytes between the pool at byte offset at and buf (write: buf
 * into the pool); the backend's memcpy. Returns WK_OK or its error.
 */
typedef wk_err (*be_kv_rw_fn)(void *arg, uint64_t at, uint8_t *buf, size_t n, bool write);

/*
 * Reads (write false) or writes len bytes of slot's KV image (token-major,
 * n_ctx * tok_floats * 4 bytes) at byte offset off, one rw() call per page
 * piece (a piece may start and end inside a token). The caller has checked
 * off + len against the image size. Returns WK_OK or the first rw() error.
 */
WK_MUST_CHECK wk_err be_kv_rw(const be_kv *kv, uint32_t slot, uint64_t off, void *buf, size_t len,
                              bool write, be_kv_rw_fn rw, void *arg);

/*
 * A step's pages: every row on a slot other than 0 grows its slot by
 * n_tokens; a reset row (be_row.reset) starts from n_ctx 0, its pages
 * counted as free for the check. Checks that the pool can supply all of
 * them (WK_EQUOTA naming the first row that does not fit; WK_EINVAL when a
 * slot would pass UINT32_MAX tokens; WK_ENOMEM; nothing changed on
 * failure), and only then gives back the reset rows' pages (in row order)
 * and takes the new ones: each slot's pos0 becomes its old n_ctx (0 after
 * a reset), n_ctx the new one. Rows have been validated (slots in range,
 * no duplicates: be_rows_check). Host only: no device call.
 */
WK_MUST_CHECK wk_err be_kv_reserve(be_kv *kv, const be_row *rows, size_t n, wk_diag *d);

/* The pool's geometry and occupancy (all zero for NULL or a kv without a pool). */
void be_kv_usage(const be_kv *kv, be_kv_info *out);

#endif /* BE_KV_H */
