/*
 * be_cuda: the CUDA backend's device side as built so far: device probe,
 * the state arena in device memory (slot reset, fork copy, chunked
 * read/write for hibernate/resume/migration, and the device address of a
 * slot for NCCL migration) and the checksum kernel.
 * The RWKV-7 step on the GPU is not written yet: step() answers WK_ENOTSUP
 * with a clear message, and "auto" backend selection never picks CUDA until
 * it is (see be.c). Compiled only when nvcc is found; never logs.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "k.h"

/* Funnel for CUDA calls: on failure, records expr, function, file and line. */
#define WK_CUDA_CHECK(expr, d)                                                                     \
    do {                                                                                           \
        cudaError_t ce_ = (expr);                                                                  \
        if (ce_ != cudaSuccess)                                                                    \
            return wk_diag_set((d), WK_EDEVICE, "%s failed: %s (%s at %s:%d)", #expr,             \
                               cudaGetErrorString(ce_), __func__, __FILE__, __LINE__);            \
    } while (0)

struct be_ctx {
    int device;          /* CUDA ordinal */
    uint32_t n_slots;    /* arena slots including slot 0 */
    uint64_t slot_bytes; /* bytes per slot */
    uint8_t *arena;      /* device memory, n_slots * slot_bytes */
};

static wk_err
be_cuda_probe(int device, char *name, size_t name_len, uint64_t *mem_bytes)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n)
        return WK_EDEVICE;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess)
        return WK_EDEVICE;
    snprintf(name, name_len, "%s", prop.name);
    *mem_bytes = prop.totalGlobalMem;
    return WK_OK;
}

static void
be_cuda_close(be_ctx *ctx)
{
    if (ctx == NULL)
        return;
    if (ctx->arena != NULL) {
        cudaSetDevice(ctx->device);
        cudaFree(ctx->arena);
    }
    free(ctx);
}

static wk_err
be_cuda_open(const be_config *cfg, const wrk_model *m, be_ctx **out, wk_diag *d)
{
    if (cfg->n_slots < 2)
        return wk_diag_set(d, WK_EINVAL, "need at least 2 slots (slot 0 is reserved)");
    be_ctx *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return WK_ENOMEM;
    ctx->device = cfg->device;
    ctx->n_slots = cfg->n_slots;
    ctx->slot_bytes = wrk_model_info_get(m)->state_bytes;
    cudaError_t ce = cudaSetDevice(cfg->device);
    if (ce == cudaSuccess)
        ce = cudaMalloc((void **)&ctx->arena, (size_t)ctx->slot_bytes * cfg->n_slots);
    if (ce == cudaSuccess)
        ce = cudaMemset(ctx->arena, 0, (size_t)ctx->slot_bytes * cfg->n_slots);
    if (ce != cudaSuccess) {
        uint64_t bytes = ctx->slot_bytes;
        be_cuda_close(ctx);
        return wk_diag_set(d, WK_EDEVICE, "device %d arena of %u x %llu bytes: %s",
                           cfg->device, cfg->n_slots, (unsigned long long)bytes,
                           cudaGetErrorString(ce));
    }
    *out = ctx;
    return WK_OK;
}

static uint32_t
be_cuda_n_slots(const be_ctx *ctx)
{
    return ctx->n_slots;
}

static uint64_t
be_cuda_slot_bytes(const be_ctx *ctx)
{
    return ctx->slot_bytes;
}

static uint8_t *
be_cuda_slot_ptr(be_ctx *ctx, uint32_t slot)
{
    return ctx->arena + (size_t)slot * ctx->slot_bytes;
}

static wk_err
be_cuda_slot_reset(be_ctx *ctx, uint32_t slot)
{
    if (slot >= ctx->n_slots)
        return WK_EINVAL;
    WK_CUDA_CHECK(cudaMemset(be_cuda_slot_ptr(ctx, slot), 0, ctx->slot_bytes), NULL);
    return WK_OK;
}

static wk_err
be_cuda_slot_copy(be_ctx *ctx, uint32_t dst, uint32_t src)
{
    if (dst >= ctx->n_slots || src >= ctx->n_slots)
        return WK_EINVAL;
    WK_CUDA_CHECK(cudaMemcpy(be_cuda_slot_ptr(ctx, dst), be_cuda_slot_ptr(ctx, src),
                             ctx->slot_bytes, cudaMemcpyDeviceToDevice),
                  NULL);
    return WK_OK;
}

static wk_err
be_cuda_slot_read(be_ctx *ctx, uint32_t slot, uint64_t off, void *buf, size_t len)
{
    if (slot >= ctx->n_slots || off > ctx->slot_bytes || len > ctx->slot_bytes - off)
        return WK_EINVAL;
    WK_CUDA_CHECK(cudaMemcpy(buf, be_cuda_slot_ptr(ctx, slot) + off, len,
                             cudaMemcpyDeviceToHost),
                  NULL);
    return WK_OK;
}

static wk_err
be_cuda_slot_write(be_ctx *ctx, uint32_t slot, uint64_t off, const void *buf, size_t len)
{
    if (slot >= ctx->n_slots || off > ctx->slot_bytes || len > ctx->slot_bytes - off)
        return WK_EINVAL;
    WK_CUDA_CHECK(cudaMemcpy(be_cuda_slot_ptr(ctx, slot) + off, buf, len,
                             cudaMemcpyHostToDevice),
                  NULL);
    return WK_OK;
}

static wk_err
be_cuda_step(be_ctx *ctx, be_row *rows, size_t n, wk_diag *d)
{
    (void)ctx;
    (void)rows;
    (void)n;
    return wk_diag_set(d, WK_ENOTSUP,
                       "the CUDA RWKV-7 step is not built yet; run this worker with "
                       "--backend cpu");
}

static wk_err
be_cuda_slot_device_ptr(be_ctx *ctx, uint32_t slot, void **ptr)
{
    if (slot == 0 || slot >= ctx->n_slots)
        return WK_EINVAL;
    *ptr = be_cuda_slot_ptr(ctx, slot);
    return WK_OK;
}

static int
be_cuda_device_index(const be_ctx *ctx)
{
    return ctx->device;
}

const be_ops be_cuda_ops = {
    .name = "cuda",
    .probe = be_cuda_probe,
    .open = be_cuda_open,
    .close = be_cuda_close,
    .n_slots = be_cuda_n_slots,
    .slot_bytes = be_cuda_slot_bytes,
    .slot_reset = be_cuda_slot_reset,
    .slot_copy = be_cuda_slot_copy,
    .slot_read = be_cuda_slot_read,
    .slot_write = be_cuda_slot_write,
    .step = be_cuda_step,
    .slot_device_ptr = be_cuda_slot_device_ptr,
    .device_index = be_cuda_device_index,
};
