/*
 * be_cuda_kv: the KV pool's bytes on the device (see be_cuda_kv.h); the
 * page accounting is be_kv.c's, so both backends hand out the same pages.
 */
#include "be_cuda_kv.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "be_cuda_common.h"

wk_err
be_cuda_kv_init(be_kv *kv, uint32_t n_slots, size_t tok_floats, uint32_t page_tokens,
                uint32_t pages_total, wk_diag *d)
{
    size_t bytes = 0;
    BE_CUDA_TRY(be_kv_init(kv, n_slots, tok_floats, page_tokens, pages_total, "cuda backend",
                           &bytes, d));
    cudaError_t ce = cudaMalloc((void **)&kv->pool, bytes);
    if (ce != cudaSuccess) {
        kv->pool = NULL;
        return wk_diag_set(d, WK_EDEVICE,
                           "cuda backend: KV pool of %u pages x %u tokens (%zu bytes): %s; set "
                           "a smaller kv_pages",
                           pages_total, page_tokens, bytes, be_cuda_handled(ce));
    }
    return WK_OK;
}

void
be_cuda_kv_fini(be_kv *kv)
{
    if (kv == NULL)
        return;
    if (kv->pool != NULL)
        (void)cudaFree(kv->pool);
    kv->pool = NULL;
    be_kv_fini(kv);
}

/* be_kv_copy_fn over the device pool (enqueued on the legacy stream). */
static wk_err
be_cuda_kv_move(void *arg, uint64_t dst, uint64_t src, size_t bytes)
{
    uint8_t *pool = arg;
    WK_CUDA_CHECK(cudaMemcpyAsync(pool + dst, pool + src, bytes, cudaMemcpyDeviceToDevice, NULL),
                  NULL);
    return WK_OK;
}

wk_err
be_cuda_kv_copy(be_kv *kv, uint32_t dst, uint32_t src)
{
    BE_CUDA_TRY(be_kv_copy(kv, dst, src, be_cuda_kv_move, kv->pool));
    WK_CUDA_CHECK(cudaStreamSynchronize(NULL), NULL);
    return WK_OK;
}

/* be_kv_rw_fn between the device pool and host memory. */
static wk_err
be_cuda_kv_piece(void *arg, uint64_t at, uint8_t *buf, size_t n, bool write)
{
    uint8_t *p = (uint8_t *)arg + at;
    if (write)
        WK_CUDA_CHECK(cudaMemcpy(p, buf, n, cudaMemcpyHostToDevice), NULL);
    else
        WK_CUDA_CHECK(cudaMemcpy(buf, p, n, cudaMemcpyDeviceToHost), NULL);
    return WK_OK;
}

wk_err
be_cuda_kv_rw(be_kv *kv, uint32_t slot, uint64_t off, void *buf, size_t len, bool write)
{
    BE_CUDA_TRY(be_kv_rw(kv, slot, off, buf, len, write, be_cuda_kv_piece, kv->pool));
    /* pageable host-to-device copies may return before the DMA is done */
    if (write)
        WK_CUDA_CHECK(cudaStreamSynchronize(NULL), NULL);
    return WK_OK;
}
