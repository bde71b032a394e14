/*
 * be_cpu: be_cpu_ops, the CPU backend as the worker sees it: the generic
 * core every family plugs into, as the CUDA backend's be_cuda.c does
 * (be_cuda_family over be_cuda_core).
 *
 * open() picks the pass by the model's view (wrk_model_view_kind; today
 * one pass, the layer list of be_cpu_gdn.c, runs every view: "gdn" for
 * Gated DeltaNet, Qwen3.5, Nemotron-H and Granite-4.0-H, "mamba2",
 * "rwkv7") and lets it build its context, which starts with a be_cpu_base (be_cpu_common.h).
 * Everything else is written once here, over that base: the slot count and sizes, the step
 * (be_cpu_base_step with the family's pass), and the slot operations.
 *
 * Hybrid models (the family set be_cpu_base.kv: attention layers): a slot's
 * image is its fixed part in the base arena followed by its KV,
 * token-major, through the slot's page table (be_kv.h, be_cpu_kv.h):
 * slot_size / slot_resize / kv_info answer from the pool, slot_reset gives
 * back a slot's pages, slot_copy copies them first (WK_EQUOTA when the pool
 * cannot hold the copy: nothing changed), and slot_read / slot_write cover
 * the whole image (a chunk may start or end inside a token). Without KV a
 * slot's image is its fixed part, whose size never changes.
 *
 * The rest of the worker never knows which family runs. Never logs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "be_cpu_common.h"
#include "be_cpu_kv.h"

struct be_ctx {
    const be_cpu_family *fam; /* the family's table */
    be_cpu_base *b;           /* the family's context (its first member), owned via fam->close */
};

/* The families with a CPU pass. */
static const be_cpu_family *const be_cpu_families[] = {
    &be_cpu_gdn_family,
};

static const be_cpu_family *
cpu_family_find(const wrk_model *m)
{
    const char *view = wrk_model_view_kind(m);
    for (size_t i = 0; i < sizeof(be_cpu_families) / sizeof(be_cpu_families[0]); i++)
        for (const char *const *v = be_cpu_families[i]->views; *v != NULL; v++)
            if (strcmp(*v, view) == 0)
                return be_cpu_families[i];
    return NULL;
}

static wk_err
cpu_probe(int device, char *name, size_t name_len, uint64_t *mem_bytes)
{
    (void)device;
    if (name != NULL && name_len > 0) {
        snprintf(name, name_len, "cpu");
        FILE *f = fopen("/proc/cpuinfo", "r");
        if (f != NULL) {
            char line[512];
            while (fgets(line, sizeof(line), f) != NULL) {
                if (strncmp(line, "model name", 10) == 0) {
                    char *p = strchr(line, ':');
                    if (p != NULL) {
                        p++;
                        while (*p == ' ' || *p == '\t')
                            p++;
                        p[strcspn(p, "\n")] = '\0';
                        snprintf(name, name_len, "%s", p);
                    }
                    break;
                }
            }
            fclose(f);
        }
    }
    if (mem_bytes != NULL) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        *mem_bytes = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    }
    return WK_OK;
}

static wk_err
cpu_open(const be_config *cfg, const wrk_model *m, be_ctx **out, wk_diag *d)
{
    if (cfg == NULL || m == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: missing config or model");
    const be_cpu_family *fam = cpu_family_find(m);
    if (fam == NULL)
        return wk_diag_set(d, WK_ENOTSUP, "cpu backend: model family %s not supported",
                           wrk_model_info_get(m)->family);
    be_ctx *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    c->fam = fam;
    wk_err e = fam->open(cfg, m, &c->b, d);
    if (e != WK_OK) {
        free(c);
        return e;
    }
    *out = c;
    return WK_OK;
}

static void
cpu_close(be_ctx *c)
{
    if (c == NULL)
        return;
    c->fam->close(c->b);
    free(c);
}

static uint32_t
cpu_n_slots(const be_ctx *c)
{
    return c->b->n_slots;
}

static uint64_t
cpu_slot_bytes(const be_ctx *c)
{
    return (uint64_t)c->b->slot_floats * sizeof(float);
}

/* Bytes of KV per token (0 without a KV pool). */
static uint64_t
cpu_kv_token_bytes(const be_ctx *c)
{
    return c->b->kv != NULL ? (uint64_t)c->b->kv->tok_floats * sizeof(float) : 0;
}

static uint64_t
cpu_slot_size(const be_ctx *c, uint32_t slot)
{
    if (c == NULL || slot == 0 || slot >= c->b->n_slots)
        return 0;
    return cpu_slot_bytes(c) +
           (c->b->kv != NULL ? (uint64_t)c->b->kv->slots[slot].n_ctx * cpu_kv_token_bytes(c) : 0);
}

static wk_err
cpu_slot_resize(be_ctx *c, uint32_t slot, uint64_t bytes)
{
    if (c == NULL || slot == 0 || slot >= c->b->n_slots)
        return WK_EINVAL;
    const uint64_t sb = cpu_slot_bytes(c), tb = cpu_kv_token_bytes(c);
    if (bytes < sb)
        return WK_EINVAL;
    if (tb == 0)
        return bytes == sb ? WK_OK : WK_EINVAL; /* sizes never change */
    if ((bytes - sb) % tb != 0)
        return WK_EINVAL;
    return be_kv_set_ctx(c->b->kv, slot, (bytes - sb) / tb);
}

static void
cpu_kv_info(const be_ctx *c, be_kv_info *out)
{
    if (out == NULL)
        return;
    memset(out, 0, sizeof(*out));
    if (c != NULL && c->b->kv != NULL)
        be_kv_usage(c->b->kv, out);
}

static wk_err
cpu_slot_reset(be_ctx *c, uint32_t slot)
{
    if (c == NULL)
        return WK_EINVAL;
    wk_err e = be_cpu_base_slot_reset(c->b, slot);
    if (e == WK_OK && c->b->kv != NULL)
        be_kv_reset(c->b->kv, slot);
    return e;
}

static wk_err
cpu_slot_copy(be_ctx *c, uint32_t dst, uint32_t src)
{
    if (c == NULL || dst == 0 || src == 0 || dst >= c->b->n_slots || src >= c->b->n_slots)
        return WK_EINVAL;
    if (dst == src)
        return WK_OK;
    if (c->b->kv != NULL) {
        wk_err e = be_cpu_kv_copy(c->b->kv, dst, src); /* first: it may refuse */
        if (e != WK_OK)
            return e;
    }
    return be_cpu_base_slot_copy(c->b, dst, src);
}

/* Reads or writes [off, off + len) of slot's image: the arena, then the KV pages. */
static wk_err
cpu_slot_rw(be_ctx *c, uint32_t slot, uint64_t off, void *buf, size_t len, bool write)
{
    if (c == NULL || (buf == NULL && len > 0))
        return WK_EINVAL;
    const uint64_t total = cpu_slot_size(c, slot), sb = cpu_slot_bytes(c);
    if (total == 0 || off > total || len > total - off)
        return WK_EINVAL;
    uint8_t *p = buf;
    if (off < sb) {
        size_t n = sb - off < len ? (size_t)(sb - off) : len;
        wk_err e = write ? be_cpu_base_slot_write(c->b, slot, off, p, n)
                         : be_cpu_base_slot_read(c->b, slot, off, p, n);
        if (e != WK_OK)
            return e;
        p += n;
        off += n;
        len -= n;
    }
    if (len > 0)
        be_cpu_kv_rw(c->b->kv, slot, off - sb, p, len, write);
    return WK_OK;
}

static wk_err
cpu_slot_read(be_ctx *c, uint32_t slot, uint64_t off, void *buf, size_t len)
{
    return cpu_slot_rw(c, slot, off, buf, len, false);
}

static wk_err
cpu_slot_write(be_ctx *c, uint32_t slot, uint64_t off, const void *buf, size_t len)
{
    return cpu_slot_rw(c, slot, off, (void *)buf, len, true);
}

static wk_err
cpu_step(be_ctx *c, be_row *rows, size_t n, wk_diag *d)
{
    if (c == NULL)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: no context");
    return be_cpu_base_step(c->b, rows, n, c->fam->pass, d);
}

static void
cpu_describe(const be_ctx *c, char *buf, size_t len)
{
    if (buf == NULL || len == 0)
        return;
    c->fam->describe(c->b, buf, len);
}

const be_ops be_cpu_ops = {
    .name = "cpu",
    .probe = cpu_probe,
    .open = cpu_open,
    .close = cpu_close,
    .n_slots = cpu_n_slots,
    .slot_bytes = cpu_slot_bytes,
    .slot_reset = cpu_slot_reset,
    .slot_copy = cpu_slot_copy,
    .slot_read = cpu_slot_read,
    .slot_write = cpu_slot_write,
    .step = cpu_step,
    .describe = cpu_describe,
    .slot_size = cpu_slot_size,
    .slot_resize = cpu_slot_resize,
    .kv_info = cpu_kv_info,
};
