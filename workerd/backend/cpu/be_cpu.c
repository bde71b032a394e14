/*
 * be_cpu: be_cpu_ops, the CPU backend as the worker sees it. open()
 * picks the implementation by the model's view (RWKV-7, Mamba2, or "gdn":
 * the hybrid layer list that runs Gated DeltaNet, Qwen3.5 and Nemotron-H)
 * and every other call is forwarded to it, so the rest of the worker never
 * knows which family runs. Never logs.
 */
#include <stdlib.h>
#include <string.h>

#include "be_cpu_common.h"

struct be_ctx {
    const be_ops *impl; /* the family's ops */
    be_ctx *inner;      /* the family's context */
};

static const be_ops *
fam_ops(const wrk_model *m)
{
    const char *f = wrk_model_view_kind(m);
    if (strcmp(f, "rwkv7") == 0)
        return &be_cpu_rwkv7_ops;
    if (strcmp(f, "mamba2") == 0)
        return &be_cpu_mamba2_ops;
    if (strcmp(f, "gdn") == 0)
        return &be_cpu_gdn_ops;
    return NULL;
}

static wk_err
fam_probe(int device, char *name, size_t name_len, uint64_t *mem_bytes)
{
    return be_cpu_rwkv7_ops.probe(device, name, name_len, mem_bytes);
}

static wk_err
fam_open(const be_config *cfg, const wrk_model *m, be_ctx **out, wk_diag *d)
{
    if (cfg == NULL || m == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: missing config or model");
    const be_ops *impl = fam_ops(m);
    if (impl == NULL)
        return wk_diag_set(d, WK_ENOTSUP, "cpu backend: model family %s not supported",
                           wrk_model_info_get(m)->family);
    be_ctx *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    c->impl = impl;
    wk_err e = impl->open(cfg, m, &c->inner, d);
    if (e != WK_OK) {
        free(c);
        return e;
    }
    *out = c;
    return WK_OK;
}

static void
fam_close(be_ctx *c)
{
    if (c == NULL)
        return;
    c->impl->close(c->inner);
    free(c);
}

static uint32_t
fam_n_slots(const be_ctx *c)
{
    return c->impl->n_slots(c->inner);
}

static uint64_t
fam_slot_bytes(const be_ctx *c)
{
    return c->impl->slot_bytes(c->inner);
}

static wk_err
fam_slot_reset(be_ctx *c, uint32_t slot)
{
    return c == NULL ? WK_EINVAL : c->impl->slot_reset(c->inner, slot);
}

static wk_err
fam_slot_copy(be_ctx *c, uint32_t dst, uint32_t src)
{
    return c == NULL ? WK_EINVAL : c->impl->slot_copy(c->inner, dst, src);
}

static wk_err
fam_slot_read(be_ctx *c, uint32_t slot, uint64_t off, void *buf, size_t len)
{
    return c == NULL ? WK_EINVAL : c->impl->slot_read(c->inner, slot, off, buf, len);
}

static wk_err
fam_slot_write(be_ctx *c, uint32_t slot, uint64_t off, const void *buf, size_t len)
{
    return c == NULL ? WK_EINVAL : c->impl->slot_write(c->inner, slot, off, buf, len);
}

static wk_err
fam_step(be_ctx *c, be_row *rows, size_t n, wk_diag *d)
{
    if (c == NULL)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: no context");
    return c->impl->step(c->inner, rows, n, d);
}

/* Optional ops: forwarded when the family has them, else their be.h NULL meaning. */
static uint64_t
fam_slot_size(const be_ctx *c, uint32_t slot)
{
    if (c == NULL)
        return 0;
    if (c->impl->slot_size != NULL)
        return c->impl->slot_size(c->inner, slot);
    return slot != 0 && slot < c->impl->n_slots(c->inner) ? c->impl->slot_bytes(c->inner) : 0;
}

static wk_err
fam_slot_resize(be_ctx *c, uint32_t slot, uint64_t bytes)
{
    if (c == NULL)
        return WK_EINVAL;
    if (c->impl->slot_resize != NULL)
        return c->impl->slot_resize(c->inner, slot, bytes);
    if (slot == 0 || slot >= c->impl->n_slots(c->inner))
        return WK_EINVAL;
    return bytes == c->impl->slot_bytes(c->inner) ? WK_OK : WK_EINVAL; /* sizes never change */
}

static void
fam_kv_info(const be_ctx *c, be_kv_info *out)
{
    if (out == NULL)
        return;
    memset(out, 0, sizeof(*out));
    if (c != NULL && c->impl->kv_info != NULL)
        c->impl->kv_info(c->inner, out);
}

static void
fam_describe(const be_ctx *c, char *buf, size_t len)
{
    if (c->impl->describe != NULL)
        c->impl->describe(c->inner, buf, len);
    else if (buf != NULL && len > 0)
        buf[0] = '\0';
}

const be_ops be_cpu_ops = {
    .name = "cpu",
    .probe = fam_probe,
    .open = fam_open,
    .close = fam_close,
    .n_slots = fam_n_slots,
    .slot_bytes = fam_slot_bytes,
    .slot_reset = fam_slot_reset,
    .slot_copy = fam_slot_copy,
    .slot_read = fam_slot_read,
    .slot_write = fam_slot_write,
    .step = fam_step,
    .describe = fam_describe,
    .slot_size = fam_slot_size,
    .slot_resize = fam_slot_resize,
    .kv_info = fam_kv_info,
};
