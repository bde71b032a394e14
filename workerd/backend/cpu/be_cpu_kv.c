/*
 * be_cpu_kv: the KV pool's bytes in host memory (see be_cpu_kv.h); the page
 * accounting is be_kv.c's.
 */
#include "be_cpu_kv.h"

#include <stdlib.h>
#include <string.h>

#include "be_cpu_kernels.h"

wk_err
be_cpu_kv_init(be_kv *kv, uint32_t n_slots, size_t tok_floats, uint32_t page_tokens,
               uint32_t pages_total, wk_diag *d)
{
    size_t bytes = 0;
    wk_err e = be_kv_init(kv, n_slots, tok_floats, page_tokens, pages_total, "cpu backend",
                          &bytes, d);
    if (e != WK_OK)
        return e;
    kv->pool = be_cpu_big_alloc(bytes);
    if (kv->pool == NULL)
        return wk_diag_set(d, WK_ENOMEM,
                           "cpu backend: out of memory for the KV pool (%u pages, %zu bytes)",
                           pages_total, bytes);
    return WK_OK;
}

void
be_cpu_kv_fini(be_kv *kv)
{
    if (kv == NULL)
        return;
    free(kv->pool);
    kv->pool = NULL;
    be_kv_fini(kv);
}

/* be_kv_copy_fn over the host pool. */
static wk_err
be_cpu_kv_move(void *arg, uint64_t dst, uint64_t src, size_t bytes)
{
    uint8_t *pool = arg;
    memcpy(pool + dst, pool + src, bytes);
    return WK_OK;
}

wk_err
be_cpu_kv_copy(be_kv *kv, uint32_t dst, uint32_t src)
{
    return be_kv_copy(kv, dst, src, be_cpu_kv_move, kv->pool);
}

/* be_kv_rw_fn over the host pool. */
static wk_err
be_cpu_kv_piece(void *arg, uint64_t at, uint8_t *buf, size_t n, bool write)
{
    uint8_t *p = (uint8_t *)arg + at;
    if (write)
        memcpy(p, buf, n);
    else
        memcpy(buf, p, n);
    return WK_OK;
}

void
be_cpu_kv_rw(be_kv *kv, uint32_t slot, uint64_t off, void *buf, size_t len, bool write)
{
    /* be_cpu_kv_piece cannot fail */
    wk_err e = be_kv_rw(kv, slot, off, buf, len, write, be_cpu_kv_piece, kv->pool);
    (void)e;
}
