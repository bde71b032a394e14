/* ctl_kv: page arithmetic for hybrid models (see ctl_kv.h). */
#include "ctl_kv.h"

bool
ctl_kv_hybrid(const ctl_kv_geom *g)
{
    return g != NULL && g->kv_token_bytes != 0 && g->page_tokens != 0;
}

uint32_t
ctl_kv_pages(const ctl_kv_geom *g, uint64_t n_ctx)
{
    if (!ctl_kv_hybrid(g))
        return 0;
    uint64_t p = n_ctx / g->page_tokens + (n_ctx % g->page_tokens != 0);
    return p > UINT32_MAX ? UINT32_MAX : (uint32_t)p;
}

uint32_t
ctl_kv_job_pages(const ctl_kv_geom *g, uint64_t ctx, uint64_t input, uint64_t max_new)
{
    uint64_t n = ctx;
    n = UINT64_MAX - n < input ? UINT64_MAX : n + input;
    n = UINT64_MAX - n < max_new ? UINT64_MAX : n + max_new;
    return ctl_kv_pages(g, n);
}

bool
ctl_kv_fits(const ctl_kv_geom *g, uint32_t used, uint32_t held, uint32_t need)
{
    if (!ctl_kv_hybrid(g) || need <= held)
        return true;
    uint64_t after = (uint64_t)used - (held <= used ? held : used) + need;
    return after <= g->pages_total;
}

bool
ctl_kv_snap_fits(const ctl_kv_geom *g, uint64_t ctx, uint64_t input, uint64_t max_new)
{
    if (!ctl_kv_hybrid(g))
        return true;
    uint64_t snap = ctl_kv_pages(g, ctx);
    uint64_t job = ctl_kv_job_pages(g, ctx, input, max_new);
    return snap + job <= g->pages_total;
}

uint64_t
ctl_kv_image_bytes(const ctl_kv_geom *g, uint64_t n_ctx)
{
    return g->state_bytes + n_ctx * g->kv_token_bytes;
}

wk_err
ctl_kv_image_ctx(const ctl_kv_geom *g, uint64_t bytes, uint64_t *n_ctx)
{
    if (bytes < g->state_bytes)
        return WK_EINVAL;
    uint64_t kv = bytes - g->state_bytes;
    if (g->kv_token_bytes == 0) {
        if (kv != 0)
            return WK_EINVAL;
        *n_ctx = 0;
        return WK_OK;
    }
    if (kv % g->kv_token_bytes != 0)
        return WK_EINVAL;
    *n_ctx = kv / g->kv_token_bytes;
    return WK_OK;
}
