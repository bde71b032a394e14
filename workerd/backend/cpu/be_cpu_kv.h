/*
 * be_cpu_kv: the CPU backend's side of the paged KV pool for hybrid models
 * (be_kv.h keeps the page tables, the same for every backend): the pool's
 * bytes in host memory, and the byte moves over them. Not thread-safe:
 * the backend's one caller at a time. Never logs, never aborts on bad
 * input.
 */
#ifndef BE_CPU_KV_H
#define BE_CPU_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "be_kv.h"

/*
 * Sets kv up (be_kv_init) with its pool in host memory (reserved, not
 * touched). Returns WK_EINVAL (a zero size), WK_ENOMEM (the diag gives the
 * bytes); kv is ready for be_cpu_kv_fini either way.
 */
WK_MUST_CHECK wk_err be_cpu_kv_init(be_kv *kv, uint32_t n_slots, size_t tok_floats,
                                    uint32_t page_tokens, uint32_t pages_total, wk_diag *d);

/* Frees the pool and the tables (NULL-safe, and safe on a zeroed or half-built kv). */
void be_cpu_kv_fini(be_kv *kv);

/* Token pos of slot (pos < the slot's n_ctx, unchecked). */
static inline float *
be_cpu_kv_tok(const be_kv *kv, uint32_t slot, uint32_t pos)
{
    const be_kv_slot *s = &kv->slots[slot];
    const size_t page = s->pages[pos / kv->page_tokens];
    return kv->pool + (page * kv->page_tokens + pos % kv->page_tokens) * kv->tok_floats;
}

/* be_kv_copy with host copies: WK_EINVAL, WK_EQUOTA, WK_ENOMEM; nothing changed on failure. */
WK_MUST_CHECK wk_err be_cpu_kv_copy(be_kv *kv, uint32_t dst, uint32_t src);

/* be_kv_rw over host memory (cannot fail: the caller checked the range). */
void be_cpu_kv_rw(be_kv *kv, uint32_t slot, uint64_t off, void *buf, size_t len, bool write);

#endif /* BE_CPU_KV_H */
