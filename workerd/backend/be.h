/*
 * be: the backend interface. One ops table per backend (CPU always, CUDA when
 * built and a device exists), ggml style. A backend owns device bytes: the
 * model weights as it needs them and a state arena of fixed-size slots.
 * Slot 0 is reserved as the padding sink; callers use slots 1..n_slots-1.
 *
 * Backends never log and never abort on bad input; they return wk_err.
 * Threading: one caller at a time per be_ctx (the worker's step loop).
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
} be_config;

/*
 * One row of a step: a decode token (n_tokens == 1) or a prefill chunk.
 * The row reads and writes its own slot's state.
 */
typedef struct be_row {
    uint32_t slot;          /* arena slot, 1..n_slots-1 (0 allowed as padding) */
    const int32_t *tokens;  /* borrowed for the call */
    uint32_t n_tokens;      /* >= 1 */
    uint32_t logits_mode;   /* BE_LOGITS_* */
    float *logits;          /* out: caller-owned; LAST: vocab floats; ALL: n_tokens*vocab */
} be_row;

enum {
    BE_LOGITS_NONE = 0, /* state update only (prefill that is not the last chunk) */
    BE_LOGITS_LAST = 1, /* logits of the last position */
    BE_LOGITS_ALL = 2,  /* logits of every position */
};

typedef struct be_ops {
    const char *name; /* "cpu", "cuda" */

    /* Probes the device; fills name and total memory. WK_EDEVICE when none. */
    wk_err (*probe)(int device, char *name, size_t name_len, uint64_t *mem_bytes);

    /*
     * Opens a context for model m (borrowed for the context's life) with an
     * arena of cfg->n_slots slots, all zeroed. Caller frees with close().
     */
    wk_err (*open)(const be_config *cfg, const wrk_model *m, be_ctx **out, wk_diag *d);
    void (*close)(be_ctx *ctx); /* NULL-safe */

    uint32_t (*n_slots)(const be_ctx *ctx);
    uint64_t (*slot_bytes)(const be_ctx *ctx);

    /* Zeroes a slot (a fresh sequence). */
    wk_err (*slot_reset)(be_ctx *ctx, uint32_t slot);
    /* Copies slot src to dst on the device (fork). */
    wk_err (*slot_copy)(be_ctx *ctx, uint32_t dst, uint32_t src);
    /* Reads / writes len bytes of a slot's state at byte offset off. */
    wk_err (*slot_read)(be_ctx *ctx, uint32_t slot, uint64_t off, void *buf, size_t len);
    wk_err (*slot_write)(be_ctx *ctx, uint32_t slot, uint64_t off, const void *buf,
                         size_t len);

    /*
     * Runs one step over n rows. Each slot appears at most once (except the
     * padding slot 0). A row's results never depend on the other rows.
     */
    wk_err (*step)(be_ctx *ctx, be_row *rows, size_t n, wk_diag *d);
} be_ops;

/* The CPU backend, always built. */
extern const be_ops be_cpu_ops;

/* The CUDA backend, or NULL when not built. */
const be_ops *be_cuda_ops_get(void);

/* Backend by name ("cpu", "cuda", "auto": cuda when a device answers). */
const be_ops *be_ops_find(const char *name);

#endif /* BE_H */
