/*
 * be_cuda: the CUDA backend: device probe, the state arena in device memory
 * (slot reset, fork copy, chunked read/write for hibernate/resume/migration,
 * the device address of a slot for NCCL migration) and the step, which a
 * family supplies through a be_cuda_family (be_cuda_common.h) chosen by the
 * model's view at open: the layer list (be_cuda_gdn.c: Gated DeltaNet and
 * the hybrids, and pure Mamba2 and RWKV-7 as lists of their layers,
 * wrk_mamba2_layer_list, wrk_rwkv7_layer_list), over the shared
 * be_cuda_core (weights on the device, cuBLAS GEMMs, kernels/k_*.cu). A
 * family without one opens (the slot operations work) but its step answers
 * WK_ENOTSUP naming the family.
 *
 * Hybrid models (attention layers, kv_token_bytes > 0; be.h, be_kv_info):
 * the family owns a paged device KV pool (be_kv.h, be_cuda_kv.h) and hands it out
 * through be_cuda_family.kv; a family without one refuses such a model at
 * open with WK_ENOTSUP. A slot's image is then its fixed part in the arena
 * followed by its KV, token-major, through the slot's page table: slot_size
 * / slot_resize / kv_info answer from the pool, slot_reset frees a slot's
 * pages, slot_copy copies them first (WK_EQUOTA when the pool can't hold
 * the copy: nothing changed), slot_read / slot_write cover the whole image
 * (a chunk may start or end inside a token), and slot_device_ptr gives only
 * the fixed part (NCCL migration of the KV part is not written).
 *
 * Numerics: the step matches the CPU reference to GEMM rounding, not bit
 * for bit, and a row's bits may change with the batch shape (cuBLAS picks
 * algorithms by shape; see be_cuda_gdn.c). So "auto" backend selection
 * stays on the CPU (be.c) until the GPU suite (cuda_parity, cuda_step,
 * cuda_families, cuda_mamba2_parity, cuda_gdn_parity) has passed on a
 * device. Compiled only when nvcc is found; never logs.
 */
#include <cuda_runtime.h>
#include <glob.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "be_cuda_common.h"
#include "be_cuda_kv.h"
#include "be_cuda_priv.h"
#include "k.h"

wk_err be_cuda_device_check_impl(int device, wk_diag *d); /* be.c's be_cuda_device_check */

struct be_ctx {
    int device;                /* CUDA ordinal */
    uint32_t n_slots;          /* arena slots including slot 0 */
    uint64_t slot_bytes;       /* bytes per slot */
    uint8_t *arena;            /* device memory, n_slots * slot_bytes */
    char family[16];           /* the model's family (for messages) */
    char dev_name[256];        /* device name (describe) */
    const be_cuda_family *fam; /* the family's step; NULL: none for this family */
    void *impl;                /* fam's step object, owned */
    be_kv *kv;                 /* hybrid models: fam's KV pool (borrowed from impl); else NULL */
};

/* The families with a CUDA step. */
static const be_cuda_family *const be_cuda_families[] = {
    &be_cuda_gdn_family,
};

static const be_cuda_family *
be_cuda_family_find(const char *family)
{
    for (size_t i = 0; i < sizeof(be_cuda_families) / sizeof(be_cuda_families[0]); i++)
        for (const char *const *v = be_cuda_families[i]->views; *v != NULL; v++)
            if (strcmp(*v, family) == 0)
                return be_cuda_families[i];
    return NULL;
}

wk_err
be_cuda_device_classify(bool have_nodes, int ce, int n_dev, int device, wk_diag *d)
{
    if (!have_nodes)
        return wk_diag_set(d, WK_ENOENT, "no CUDA device: no /dev/nvidia* device node");
    if ((cudaError_t)ce == cudaErrorNoDevice)
        return wk_diag_set(d, WK_ENOENT, "no CUDA device: %s",
                           cudaGetErrorString((cudaError_t)ce));
    if ((cudaError_t)ce != cudaSuccess)
        return wk_diag_set(d, WK_EDEVICE,
                           "CUDA devices do not answer: cudaGetDeviceCount: %s (%s, error %d)",
                           cudaGetErrorString((cudaError_t)ce), cudaGetErrorName((cudaError_t)ce),
                           ce);
    if (device < 0 || device >= n_dev)
        return wk_diag_set(d, WK_ENOENT, "no CUDA device %d (%d present)", device, n_dev);
    return WK_OK;
}

/* Whether a /dev/nvidia* node exists (the driver's device files). */
static bool
be_cuda_have_nodes(void)
{
    glob_t g;
    int r = glob("/dev/nvidia*", GLOB_NOSORT, NULL, &g);
    bool have = r == 0 && g.gl_pathc > 0;
    if (r == 0)
        globfree(&g);
    return have;
}

wk_err
be_cuda_device_check_impl(int device, wk_diag *d)
{
    const bool nodes = be_cuda_have_nodes();
    int n = 0;
    cudaError_t ce = cudaSuccess;
    if (nodes) {
        ce = cudaGetDeviceCount(&n);
        if (ce != cudaSuccess)
            (void)cudaGetLastError(); /* handled here: not the next launch's error */
    }
    return be_cuda_device_classify(nodes, (int)ce, n, device, d);
}

static wk_err
be_cuda_probe(int device, char *name, size_t name_len, uint64_t *mem_bytes)
{
    if (name == NULL || mem_bytes == NULL)
        return WK_EINVAL;
    wk_err e = be_cuda_device_check_impl(device, NULL);
    if (e != WK_OK)
        return e;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return WK_EDEVICE;
    }
    if (name_len > 0)
        snprintf(name, name_len, "%s", prop.name);
    *mem_bytes = prop.totalGlobalMem;
    return WK_OK;
}

static void
be_cuda_close(be_ctx *ctx)
{
    if (ctx == NULL)
        return;
    (void)cudaSetDevice(ctx->device);
    if (ctx->fam != NULL)
        ctx->fam->destroy(ctx->impl);
    if (ctx->arena != NULL)
        (void)cudaFree(ctx->arena);
    free(ctx);
}

static wk_err
be_cuda_open(const be_config *cfg, const wrk_model *m, be_ctx **out, wk_diag *d)
{
    if (cfg == NULL || m == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: missing config or model");
    if (cfg->n_slots < 2)
        return wk_diag_set(d, WK_EINVAL, "need at least 2 slots (slot 0 is reserved)");
    /* a clear "no CUDA device" first: the GPU tests and parity scripts skip on it alone */
    wk_diag cd = {{0}};
    wk_err ce_chk = be_cuda_device_check_impl(cfg->device, &cd);
    if (ce_chk == WK_ENOENT)
        return wk_diag_set(d, WK_EDEVICE, "cuda backend: %s", cd.msg);
    if (ce_chk != WK_OK)
        return wk_diag_set(d, WK_EDEVICE, "cuda backend: device %d unusable: %s", cfg->device,
                           cd.msg);
    cudaError_t ce;
    const wrk_model_info *info = wrk_model_info_get(m);
    const be_cuda_family *fam = be_cuda_family_find(wrk_model_view_kind(m));
    if (info->kv_token_bytes > 0 && (fam == NULL || fam->kv == NULL))
        return wk_diag_set(d, WK_ENOTSUP,
                           "cuda backend: hybrid %s models (attention layers, %llu KV bytes a "
                           "token) have no CUDA KV pool for this family; run this worker with "
                           "--backend cpu",
                           info->family, (unsigned long long)info->kv_token_bytes);
    be_ctx *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    ctx->device = cfg->device;
    ctx->n_slots = cfg->n_slots;
    ctx->slot_bytes = info->state_bytes;
    snprintf(ctx->family, sizeof(ctx->family), "%s", info->family);
    struct cudaDeviceProp prop;
    ce = cudaSetDevice(cfg->device);
    if (ce == cudaSuccess) {
        if (cudaGetDeviceProperties(&prop, cfg->device) == cudaSuccess)
            snprintf(ctx->dev_name, sizeof(ctx->dev_name), "%s", prop.name);
        else
            (void)cudaGetLastError(); /* the name is only for describe() */
    }
    if (ce == cudaSuccess && ctx->slot_bytes > SIZE_MAX / cfg->n_slots)
        ce = cudaErrorMemoryAllocation;
    if (ce == cudaSuccess)
        ce = cudaMalloc((void **)&ctx->arena, (size_t)ctx->slot_bytes * cfg->n_slots);
    if (ce == cudaSuccess)
        ce = cudaMemset(ctx->arena, 0, (size_t)ctx->slot_bytes * cfg->n_slots);
    if (ce != cudaSuccess) {
        uint64_t bytes = ctx->slot_bytes;
        be_cuda_close(ctx);
        return wk_diag_set(d, WK_EDEVICE, "device %d arena of %u x %llu bytes: %s", cfg->device,
                           cfg->n_slots, (unsigned long long)bytes, be_cuda_handled(ce));
    }
    if (fam != NULL) {
        wk_err e = fam->create(cfg, m, (float *)(void *)ctx->arena, ctx->n_slots, ctx->slot_bytes,
                               &ctx->impl, d);
        if (e != WK_OK) {
            be_cuda_close(ctx);
            return e;
        }
        ctx->fam = fam;
        if (info->kv_token_bytes > 0) {
            ctx->kv = fam->kv(ctx->impl);
            if (ctx->kv == NULL || ctx->kv->n_slots != ctx->n_slots ||
                be_kv_token_bytes(ctx->kv) != info->kv_token_bytes) {
                be_cuda_close(ctx);
                return wk_diag_set(d, WK_EINVAL,
                                   "cuda backend: the %s step's KV pool does not match the "
                                   "model's %llu KV bytes a token",
                                   info->family, (unsigned long long)info->kv_token_bytes);
            }
        }
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

/*
 * The slot operations run on the legacy default stream and complete before
 * they return (cudaMemset and device-to-device or pageable host-to-device
 * copies may return early): the step runs on its own non-blocking stream,
 * which does not wait for the default one. The step, in turn, completes
 * before it returns.
 */
static wk_err
be_cuda_slot_reset(be_ctx *ctx, uint32_t slot)
{
    if (ctx == NULL || slot >= ctx->n_slots)
        return WK_EINVAL;
    WK_CUDA_CHECK(cudaSetDevice(ctx->device), NULL);
    WK_CUDA_CHECK(cudaMemset(be_cuda_slot_ptr(ctx, slot), 0, ctx->slot_bytes), NULL);
    WK_CUDA_CHECK(cudaStreamSynchronize(NULL), NULL);
    if (ctx->kv != NULL)
        be_kv_reset(ctx->kv, slot);
    return WK_OK;
}

static wk_err
be_cuda_slot_copy(be_ctx *ctx, uint32_t dst, uint32_t src)
{
    if (ctx == NULL || dst == 0 || src == 0 || dst >= ctx->n_slots || src >= ctx->n_slots)
        return WK_EINVAL;
    if (dst == src)
        return WK_OK;
    WK_CUDA_CHECK(cudaSetDevice(ctx->device), NULL);
    if (ctx->kv != NULL) {
        wk_err e = be_cuda_kv_copy(ctx->kv, dst, src); /* first: it may refuse */
        if (e != WK_OK)
            return e;
    }
    WK_CUDA_CHECK(cudaMemcpy(be_cuda_slot_ptr(ctx, dst), be_cuda_slot_ptr(ctx, src),
                             ctx->slot_bytes, cudaMemcpyDeviceToDevice),
                  NULL);
    WK_CUDA_CHECK(cudaStreamSynchronize(NULL), NULL);
    return WK_OK;
}

/* Bytes of KV per token (0: not a hybrid model). */
static uint64_t
be_cuda_kv_tb(const be_ctx *ctx)
{
    return ctx->kv != NULL ? be_kv_token_bytes(ctx->kv) : 0;
}

static uint64_t
be_cuda_slot_size(const be_ctx *ctx, uint32_t slot)
{
    if (ctx == NULL || slot == 0 || slot >= ctx->n_slots)
        return 0;
    return ctx->slot_bytes +
           (ctx->kv != NULL ? (uint64_t)ctx->kv->slots[slot].n_ctx * be_cuda_kv_tb(ctx) : 0);
}

static wk_err
be_cuda_slot_resize(be_ctx *ctx, uint32_t slot, uint64_t bytes)
{
    if (ctx == NULL || slot == 0 || slot >= ctx->n_slots || bytes < ctx->slot_bytes)
        return WK_EINVAL;
    const uint64_t tb = be_cuda_kv_tb(ctx);
    if (tb == 0)
        return bytes == ctx->slot_bytes ? WK_OK : WK_EINVAL;
    if ((bytes - ctx->slot_bytes) % tb != 0)
        return WK_EINVAL;
    return be_kv_set_ctx(ctx->kv, slot, (bytes - ctx->slot_bytes) / tb);
}

static void
be_cuda_kv_info_op(const be_ctx *ctx, be_kv_info *out)
{
    if (out == NULL)
        return;
    memset(out, 0, sizeof(*out));
    if (ctx != NULL && ctx->kv != NULL)
        be_kv_usage(ctx->kv, out);
}

/*
 * Reads or writes [off, off + len) of slot's image (slot 1..n_slots-1,
 * inside slot_size, as the CPU backend checks): the arena part, then the
 * KV pages. Complete on return (the arena write synchronises the legacy
 * stream; be_cuda_kv_rw does the same).
 */
static wk_err
be_cuda_slot_rw(be_ctx *ctx, uint32_t slot, uint64_t off, void *buf, size_t len, bool write)
{
    if (ctx == NULL || (buf == NULL && len > 0))
        return WK_EINVAL;
    const uint64_t total = be_cuda_slot_size(ctx, slot), sb = ctx->slot_bytes;
    if (total == 0 || off > total || len > total - off)
        return WK_EINVAL;
    if (len == 0)
        return WK_OK;
    WK_CUDA_CHECK(cudaSetDevice(ctx->device), NULL);
    uint8_t *p = buf;
    if (off < sb) {
        const size_t n = sb - off < len ? (size_t)(sb - off) : len;
        if (write) {
            WK_CUDA_CHECK(
                cudaMemcpy(be_cuda_slot_ptr(ctx, slot) + off, p, n, cudaMemcpyHostToDevice), NULL);
            WK_CUDA_CHECK(cudaStreamSynchronize(NULL), NULL);
        } else {
            WK_CUDA_CHECK(
                cudaMemcpy(p, be_cuda_slot_ptr(ctx, slot) + off, n, cudaMemcpyDeviceToHost), NULL);
        }
        p += n;
        off += n;
        len -= n;
    }
    if (len > 0) /* only a hybrid slot's image goes past slot_bytes */
        return be_cuda_kv_rw(ctx->kv, slot, off - sb, p, len, write);
    return WK_OK;
}

static wk_err
be_cuda_slot_read(be_ctx *ctx, uint32_t slot, uint64_t off, void *buf, size_t len)
{
    return be_cuda_slot_rw(ctx, slot, off, buf, len, false);
}

static wk_err
be_cuda_slot_write(be_ctx *ctx, uint32_t slot, uint64_t off, const void *buf, size_t len)
{
    return be_cuda_slot_rw(ctx, slot, off, (void *)buf, len, true);
}

static wk_err
be_cuda_step(be_ctx *ctx, be_row *rows, size_t n, wk_diag *d)
{
    if (ctx == NULL)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: no context");
    if (ctx->fam == NULL)
        return wk_diag_set(d, WK_ENOTSUP,
                           "cuda backend: no CUDA step for the %s family yet; run this worker "
                           "with --backend cpu",
                           ctx->family);
    return ctx->fam->step(ctx->impl, rows, n, d);
}

static void
be_cuda_describe(const be_ctx *ctx, char *buf, size_t len)
{
    if (buf == NULL || len == 0)
        return;
    if (ctx == NULL) {
        snprintf(buf, len, "cuda (no context)");
        return;
    }
    char rest[256] = "";
    if (ctx->fam != NULL)
        ctx->fam->describe(ctx->impl, rest, sizeof(rest));
    snprintf(buf, len, "cuda device=%d name=\"%s\" family=%s%s%s", ctx->device, ctx->dev_name,
             ctx->family, rest[0] ? " " : "", rest);
}

static wk_err
be_cuda_slot_device_ptr(be_ctx *ctx, uint32_t slot, void **ptr)
{
    if (ctx == NULL || ptr == NULL || slot == 0 || slot >= ctx->n_slots)
        return WK_EINVAL;
    *ptr = be_cuda_slot_ptr(ctx, slot);
    return WK_OK;
}

static int
be_cuda_device_index(const be_ctx *ctx)
{
    return ctx != NULL ? ctx->device : 0;
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
    .describe = be_cuda_describe,
    .slot_device_ptr = be_cuda_slot_device_ptr,
    .device_index = be_cuda_device_index,
    .slot_size = be_cuda_slot_size,
    .slot_resize = be_cuda_slot_resize,
    .kv_info = be_cuda_kv_info_op,
};
