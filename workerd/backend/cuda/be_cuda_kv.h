/*
 * be_cuda_kv: the CUDA backend's side of the paged KV pool for hybrid
 * models (be_kv.h keeps the page tables, the same for every backend, so
 * both backends hand out the same pages for the same sequence of
 * operations): the pool's bytes in one device allocation, and the byte
 * moves over them. Device copies (be_cuda_kv_copy, be_cuda_kv_rw) run on
 * the legacy default stream and complete before they return. Not
 * thread-safe: the backend's one caller at a time. Never logs, never
 * aborts on bad input. Only the CUDA backend's .c files include this
 * header.
 */
#ifndef BE_CUDA_KV_H
#define BE_CUDA_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "be_kv.h"

/*
 * Sets kv up (be_kv_init) on the current device, the pool allocated (not
 * cleared). WK_EINVAL (a zero size), WK_ENOMEM (host tables, or a size
 * that overflows), WK_EDEVICE (cudaMalloc; the diag gives the bytes); kv
 * is ready for be_cuda_kv_fini either way.
 */
WK_MUST_CHECK wk_err be_cuda_kv_init(be_kv *kv, uint32_t n_slots, size_t tok_floats,
                                     uint32_t page_tokens, uint32_t pages_total, wk_diag *d);

/* Frees the pool and the tables (NULL-safe, and safe on a zeroed or half-built kv). */
void be_cuda_kv_fini(be_kv *kv);

/*
 * be_kv_copy with device copies, complete before it returns. WK_EINVAL,
 * WK_EQUOTA, WK_ENOMEM (nothing changed), WK_EDEVICE (the page table has
 * changed, the contents are unspecified).
 */
WK_MUST_CHECK wk_err be_cuda_kv_copy(be_kv *kv, uint32_t dst, uint32_t src);

/*
 * be_kv_rw between the device pool and host memory buf, complete on
 * return; WK_EDEVICE.
 */
WK_MUST_CHECK wk_err be_cuda_kv_rw(be_kv *kv, uint32_t slot, uint64_t off, void *buf, size_t len,
                                   bool write);

#endif /* BE_CUDA_KV_H */
