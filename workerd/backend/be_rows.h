/*
 * be_rows: what every backend does with a step's rows before any device
 * work, written once so a step is refused with the same error and message
 * on every backend and cut into the same passes: the row checks of be.h's
 * step contract, and the split of the rows into passes of at most `cap`
 * tokens (segments: contiguous runs of one slot's tokens; a row longer
 * than the room left continues in the next pass from its slot state).
 * Never logs, never aborts, makes no device call.
 */
#ifndef BE_ROWS_H
#define BE_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "be.h"

#define BE_ROWS_DEF_ROWS 1024u    /* max_step_rows when the config says 0 */
#define BE_ROWS_DEF_TOKENS 65536u /* max_step_tokens when the config says 0 */

/* What a step's rows are checked against. */
typedef struct be_rows_limits {
    uint32_t n_slots;    /* arena slots incl. the padding slot 0 */
    uint32_t vocab;      /* token ids must be below it */
    uint32_t max_rows;   /* rows in one step */
    uint32_t max_tokens; /* tokens (sum over rows) in one step */
} be_rows_limits;

/*
 * Checks every row of a step (be.h): WK_ETOOBIG (over max_rows /
 * max_tokens), WK_EINVAL (rows missing, slot outside the arena, a slot
 * twice, no tokens, bad logits_mode, logits without a buffer, a token
 * outside the vocab); the diag names the row. slot_mark ([n_slots],
 * caller-owned) and *mark_gen carry the duplicate detection from step to
 * step. Changes nothing else.
 */
WK_MUST_CHECK wk_err be_rows_check(const be_row *rows, size_t n, const be_rows_limits *lim,
                                   uint32_t *slot_mark, uint32_t *mark_gen, wk_diag *d);

/* One contiguous run of a row's tokens inside a pass. */
typedef struct be_rows_seg {
    uint32_t row;  /* index into the step's rows */
    uint32_t slot; /* arena slot */
    uint32_t t0;   /* first token's index in the pass */
    uint32_t n;    /* tokens */
    uint32_t off;  /* index of the first token within the row */
} be_rows_seg;

/*
 * The backend's side of be_rows_split. seg() records segment s of the
 * pass being built (its tokens are rows[sg->row].tokens + sg->off);
 * logits() records logits row i of the pass: pass token pos, written to
 * dst (vocab floats); run() runs the pass of T tokens, n_segs segments and
 * n_logits logits rows, and returns WK_OK or its error (which ends the
 * step).
 */
typedef struct be_rows_pass_ops {
    void (*seg)(void *arg, uint32_t s, const be_rows_seg *sg, const int32_t *tokens);
    void (*logits)(void *arg, uint32_t i, uint32_t pos, float *dst);
    wk_err (*run)(void *arg, uint32_t T, uint32_t n_segs, uint32_t n_logits, wk_diag *d);
} be_rows_pass_ops;

/*
 * Cuts checked rows into passes of at most cap tokens, in row order:
 * padding rows (slot 0) are skipped and get zero logits (vocab floats a
 * position), the others' tokens fill the passes, run() for every full
 * pass and the last partial one. Returns WK_OK or run()'s first error.
 */
WK_MUST_CHECK wk_err be_rows_split(be_row *rows, size_t n, uint32_t cap, uint32_t vocab,
                                   const be_rows_pass_ops *ops, void *arg, wk_diag *d);

#endif /* BE_ROWS_H */
