/*
 * ctl_kv: page arithmetic for hybrid models (recurrent layers plus a few
 * attention layers whose KV lives in a paged pool on the worker). Pure
 * functions, no state: the scheduler and ctl_vm use them for admission and
 * for reading a slot image's token count off its size.
 *
 * A slot image is state_bytes + n_ctx * kv_token_bytes (workerd/backend/be.h);
 * a slot holding n_ctx tokens holds ceil(n_ctx / page_tokens) pages. Models
 * without KV (kv_token_bytes 0 or page_tokens 0) need 0 pages everywhere.
 */
#ifndef CTL_KV_H
#define CTL_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "wk_err.h"

/* One worker's KV geometry (from ModelInfo); all zero for recurrent-only models. */
typedef struct ctl_kv_geom {
    uint64_t state_bytes;    /* fixed recurrent bytes of a slot */
    uint64_t kv_token_bytes; /* KV bytes per token, 0 = no KV */
    uint32_t page_tokens;    /* tokens per page */
    uint32_t pages_total;    /* pages in the worker's pool */
} ctl_kv_geom;

/* True when g describes a model with a KV pool. */
bool ctl_kv_hybrid(const ctl_kv_geom *g);

/* Pages that n_ctx tokens occupy: ceil(n_ctx / page_tokens), 0 without KV. */
uint32_t ctl_kv_pages(const ctl_kv_geom *g, uint64_t n_ctx);

/*
 * Pages a job needs at its end: ctx (tokens already in its state) + input +
 * max_new (most tokens it may sample and feed). Saturates at UINT32_MAX.
 */
uint32_t ctl_kv_job_pages(const ctl_kv_geom *g, uint64_t ctx, uint64_t input, uint64_t max_new);

/*
 * True when a slot holding `held` pages can grow to `need` with `used` of
 * the pool's pages held or reserved by all slots (including this one's
 * `held`). Always true without KV.
 */
bool ctl_kv_fits(const ctl_kv_geom *g, uint32_t used, uint32_t held, uint32_t need);

/*
 * True when a copy of a slot holding ctx tokens (ceil pages) fits the pool
 * alongside a job on the original that grows it by input + max_new tokens:
 * pages(ctx) + pages(ctx + input + max_new) <= pages_total. Always true
 * without KV. (A chat turn's pre-reply snapshot is taken only then.)
 */
bool ctl_kv_snap_fits(const ctl_kv_geom *g, uint64_t ctx, uint64_t input, uint64_t max_new);

/* Bytes of an image holding n_ctx tokens. */
uint64_t ctl_kv_image_bytes(const ctl_kv_geom *g, uint64_t n_ctx);

/*
 * Token count of an image of `bytes`: WK_OK with *n_ctx, WK_EINVAL when bytes
 * is not state_bytes + k * kv_token_bytes (for recurrent-only models: not
 * exactly state_bytes; *n_ctx is then 0).
 */
WK_MUST_CHECK wk_err ctl_kv_image_ctx(const ctl_kv_geom *g, uint64_t bytes, uint64_t *n_ctx);

#endif /* CTL_KV_H */
