/*
 * be: the backend interface. One ops table per backend (CPU always, CUDA when
 * built and a device exists), ggml style. A backend owns device bytes: the
 * model weights as it needs them and a state arena of fixed-size slots.
 * Slot 0 is reserved as the padding sink; callers use slots 1..n_slots-1.
 *
 * Backends never log and never abort on bad input; they return wk_err.
 * Threading: one caller at a time per be_ctx (the worker's step loop).
 *
 * Slot state layout (RWKV-7), the same bytes on every backend, so a slot
 * read on one worker can be written on another (hibernate, export, migrate).
 * With L layers, C = n_embd, H heads of size N, all values IEEE binary32
 * little-endian, one slot is L consecutive layer records of
 * (2 * C + H * N * N) floats:
 *     att_shift[C]      LN1 output of the last token (attention token shift)
 *     ffn_shift[C]      LN2 output of the last token (channel-mix token shift)
 *     wkv[H][N][N]      per head S[i][j], i = value index, j = key index
 *                       (the BlinkDL reference layout; y = S r)
 * slot_bytes = L * (2 * C + H * N * N) * 4 = wrk_model_info.state_bytes.
 * A zeroed slot is a fresh sequence.
 */
#ifndef BE_H
#define BE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"
#include "wrk_model.h"

typedef struct be_ctx be_ctx;

typedef struct be_config {
    uint32_t n_slots;       /* arena slots including the reserved slot 0 */
    uint32_t n_threads;     /* CPU threads, 0 = all cores */
    int device;             /* device ordinal (CUDA), ignored by CPU */
    uint32_t max_step_rows; /* most rows in one step */
    uint32_t max_step_tokens; /* most tokens (sum over rows) in one step */
    uint32_t kv_pages;      /* hybrid models: KV pool pages, 0 = the backend's default */
} be_config;

/*
 * Hybrid models (recurrent layers plus a few full-attention layers): a slot
 * is a fixed recurrent part (slot_bytes, the family's layout) followed by
 * the attention layers' KV for every token the slot has seen, token-major:
 *     for t in 0..n_ctx-1, for each attention layer a (in layer order):
 *         K[n_kv_heads][head_dim], V[n_kv_heads][head_dim]   (fp32)
 * so slot_size = slot_bytes + n_ctx * kv_token_bytes, and the image grows by
 * appending. On the device the KV lives in a paged pool (page_tokens
 * tokens per page) owned by the backend; a slot holds ceil(n_ctx /
 * page_tokens) pages. Recurrent-only families have kv_token_bytes 0.
 */
typedef struct be_kv_info {
    uint64_t kv_token_bytes; /* bytes of KV per token (all attention layers), 0: none */
    uint32_t page_tokens;    /* tokens per page */
    uint32_t pages_total;    /* pages in the pool */
    uint32_t pages_free;     /* pages not held by any slot */
} be_kv_info;

/*
 * One row of a step: a decode token (n_tokens == 1) or a prefill chunk.
 * The row reads and writes its own slot's state. Rows on slot 0 are padding:
 * any number of them may appear, their state is never read back, and their
 * logits (when asked for) are unspecified (the CPU backend skips them and
 * writes zeros).
 */
typedef struct be_row {
    uint32_t slot;          /* arena slot, 1..n_slots-1 (0 allowed as padding) */
    const int32_t *tokens;  /* borrowed for the call */
    uint32_t n_tokens;      /* >= 1 */
    uint32_t logits_mode;   /* BE_LOGITS_* */
    float *logits;          /* out: caller-owned; LAST: vocab floats; ALL: n_tokens*vocab */
    bool reset;             /* the row starts a fresh sequence: its slot's state is zeroed
                               (and, on hybrid models, its KV pages released) as part of this
                               step, after every row has been checked, before its tokens run;
                               a refused step resets nothing. Ignored on padding rows. */
} be_row;

enum {
    BE_LOGITS_NONE = 0, /* state update only (prefill that is not the last chunk) */
    BE_LOGITS_LAST = 1, /* logits of the last position */
    BE_LOGITS_ALL = 2,  /* logits of every position */
};

typedef struct be_ops {
    const char *name; /* "cpu", "cuda" */

    /*
     * Probes the device; fills name and total memory. WK_ENOENT when there
     * is none, WK_EDEVICE when it is there but does not answer (the CUDA
     * backend: be_cuda_device_check()).
     */
    wk_err (*probe)(int device, char *name, size_t name_len, uint64_t *mem_bytes);

    /*
     * Opens a context for model m (borrowed for the context's life) with an
     * arena of cfg->n_slots slots, all zeroed. Caller frees with close().
     */
    wk_err (*open)(const be_config *cfg, const wrk_model *m, be_ctx **out, wk_diag *d);
    void (*close)(be_ctx *ctx); /* NULL-safe */

    uint32_t (*n_slots)(const be_ctx *ctx);
    uint64_t (*slot_bytes)(const be_ctx *ctx);

    /* Zeroes a slot (a fresh sequence); 0..n_slots-1. WK_EINVAL out of range. */
    wk_err (*slot_reset)(be_ctx *ctx, uint32_t slot);
    /* Copies slot src to dst on the device (fork); both 1..n_slots-1 (src == dst: no-op). */
    wk_err (*slot_copy)(be_ctx *ctx, uint32_t dst, uint32_t src);
    /*
     * Reads / writes len bytes of a slot's state (layout above) at byte offset
     * off; slot 1..n_slots-1, off + len <= slot_bytes, else WK_EINVAL.
     */
    wk_err (*slot_read)(be_ctx *ctx, uint32_t slot, uint64_t off, void *buf, size_t len);
    wk_err (*slot_write)(be_ctx *ctx, uint32_t slot, uint64_t off, const void *buf,
                         size_t len);

    /*
     * Runs one step over n rows. Each slot appears at most once (except the
     * padding slot 0). A row's results never depend on the other rows (bit
     * for bit), and a prefill split into chunks over several steps ends in
     * the same state as one token per step. Every row is checked before any
     * state changes: WK_EINVAL (bad slot, duplicate slot, no tokens, token
     * outside the vocab, missing logits buffer, bad logits_mode), WK_ETOOBIG
     * (over max_step_rows / max_step_tokens), WK_EQUOTA (hybrid KV pages, see
     * slot_resize); the diag names the row. Resets (be_row.reset) are part of
     * the step: applied only once every row has passed, so a refused step
     * leaves every slot, reset rows included, exactly as it was; a reset row
     * then runs as on a fresh slot (its released KV pages count as free when
     * the step's pages are checked).
     * Exception, for now: the CUDA steps (RWKV-7, Mamba2, Gated DeltaNet
     * incl. hybrid; not yet run on a device) are repeatable for one step composition,
     * but across batch compositions and chunkings they agree only to GEMM
     * rounding (cuBLAS picks its algorithm by shape); see be_cuda_gdn.c.
     */
    wk_err (*step)(be_ctx *ctx, be_row *rows, size_t n, wk_diag *d);

    /*
     * Optional (may be NULL): one line describing the context for logs and
     * benchmarks ("cpu isa=avx512 threads=16"), NUL-terminated into buf.
     */
    void (*describe)(const be_ctx *ctx, char *buf, size_t len);

    /*
     * Optional (NULL on backends without device memory, e.g. the CPU): the
     * device address of slot's state bytes (slot_bytes long) in *ptr, for
     * device-to-device transfers (NCCL migration). Valid until close();
     * the caller must not use it concurrently with a step. slot
     * 1..n_slots-1, else WK_EINVAL. Callers treat NULL as WK_ENOTSUP.
     */
    wk_err (*slot_device_ptr)(be_ctx *ctx, uint32_t slot, void **ptr);

    /* Optional (NULL = 0): the device ordinal the context runs on. */
    int (*device_index)(const be_ctx *ctx);

    /*
     * Optional (NULL: every slot is slot_bytes, no KV): the bytes of slot's
     * state image now (see be_kv_info). slot_read / slot_write ranges are
     * checked against it; slot 0 or out of range gives 0.
     */
    uint64_t (*slot_size)(const be_ctx *ctx, uint32_t slot);

    /*
     * Optional (NULL: sizes never change): sets slot's image to bytes =
     * slot_bytes + k * kv_token_bytes before the whole image is written
     * (resume, import, migration). Pages are taken from or given back to the
     * pool; the contents are unspecified until written. WK_EINVAL (bad slot
     * or size), WK_EQUOTA (not enough free pages: nothing changed).
     * slot_reset frees a slot's pages; slot_copy copies them (WK_EQUOTA when
     * the pool can't hold the copy); a step takes the pages its rows' new
     * tokens need (a reset row: its old pages given back first) and is
     * refused whole, before any change, with WK_EQUOTA naming the row when
     * the pool can't supply them.
     */
    wk_err (*slot_resize)(be_ctx *ctx, uint32_t slot, uint64_t bytes);

    /* Optional (NULL: no KV, all zero): the KV pool's geometry and occupancy. */
    void (*kv_info)(const be_ctx *ctx, be_kv_info *out);
} be_ops;

/* The CPU backend, always built. */
extern const be_ops be_cpu_ops;

/* The CUDA backend, or NULL when not built. */
const be_ops *be_cuda_ops_get(void);

/*
 * Whether CUDA device `device` can be used here:
 *   WK_OK      it answers;
 *   WK_ENOENT  there is none to use: this build has no CUDA backend, no
 *              /dev/nvidia* node exists, the runtime answers
 *              cudaErrorNoDevice, or fewer than device + 1 devices answer;
 *   WK_EDEVICE anything else: a driver older than the runtime needs, a
 *              device in a bad state... (a failure, never a reason to skip).
 * d (may be NULL) gets the reason with the runtime's message on every
 * result but WK_OK. The gpu suite skips (exit 77) on WK_ENOENT only.
 * Thread-safe; never logs.
 */
wk_err be_cuda_device_check(int device, wk_diag *d);

/*
 * Backend by name: "cpu", "cuda", or "auto". "auto" is the CPU for now: the
 * CUDA backend has not yet passed its gpu suite on a device (docs/
 * PERFORMANCE.md, bench/gpu.sh); "cuda" selects it explicitly.
 */
const be_ops *be_ops_find(const char *name);

#endif /* BE_H */
