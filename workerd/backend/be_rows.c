/*
 * be_rows: the row checks and the pass split every backend's step shares
 * (see be_rows.h).
 */
#include "be_rows.h"

#include <string.h>

wk_err
be_rows_check(const be_row *rows, size_t n, const be_rows_limits *lim, uint32_t *slot_mark,
              uint32_t *mark_gen, wk_diag *d)
{
    uint64_t total = 0;
    if (n > lim->max_rows)
        return wk_diag_set(d, WK_ETOOBIG, "step has %zu rows, at most %u", n, lim->max_rows);
    if (n > 0 && rows == NULL)
        return wk_diag_set(d, WK_EINVAL, "step rows missing");
    if (++*mark_gen == 0) {
        memset(slot_mark, 0, sizeof(uint32_t) * lim->n_slots);
        *mark_gen = 1;
    }
    for (size_t i = 0; i < n; i++) {
        const be_row *r = &rows[i];
        if (r->slot >= lim->n_slots)
            return wk_diag_set(d, WK_EINVAL, "row %zu: slot %u outside the arena (%u slots)", i,
                               r->slot, lim->n_slots);
        if (r->slot != 0) {
            if (slot_mark[r->slot] == *mark_gen)
                return wk_diag_set(d, WK_EINVAL, "row %zu: slot %u appears twice in one step",
                                   i, r->slot);
            slot_mark[r->slot] = *mark_gen;
        }
        if (r->n_tokens == 0 || r->tokens == NULL)
            return wk_diag_set(d, WK_EINVAL, "row %zu: no tokens", i);
        if (r->logits_mode > BE_LOGITS_ALL)
            return wk_diag_set(d, WK_EINVAL, "row %zu: bad logits_mode %u", i, r->logits_mode);
        if (r->logits_mode != BE_LOGITS_NONE && r->logits == NULL)
            return wk_diag_set(d, WK_EINVAL, "row %zu: logits requested without a buffer", i);
        for (uint32_t t = 0; t < r->n_tokens; t++)
            if (r->tokens[t] < 0 || (uint32_t)r->tokens[t] >= lim->vocab)
                return wk_diag_set(d, WK_EINVAL, "row %zu: token %d at %u outside vocab %u", i,
                                   r->tokens[t], t, lim->vocab);
        total += r->n_tokens;
    }
    if (total > lim->max_tokens)
        return wk_diag_set(d, WK_ETOOBIG, "step has %llu tokens, at most %u",
                           (unsigned long long)total, lim->max_tokens);
    return WK_OK;
}

wk_err
be_rows_split(be_row *rows, size_t n, uint32_t cap, uint32_t vocab, const be_rows_pass_ops *ops,
              void *arg, wk_diag *d)
{
    uint32_t T = 0, n_segs = 0, n_logits = 0;
    for (size_t i = 0; i < n; i++) {
        be_row *r = &rows[i];
        if (r->slot == 0) {
            /* padding: skipped; its logits are zeros */
            if (r->logits_mode == BE_LOGITS_LAST)
                memset(r->logits, 0, sizeof(float) * vocab);
            else if (r->logits_mode == BE_LOGITS_ALL)
                memset(r->logits, 0, sizeof(float) * vocab * r->n_tokens);
            continue;
        }
        uint32_t off = 0;
        while (off < r->n_tokens) {
            const uint32_t room = cap - T;
            const uint32_t take = r->n_tokens - off < room ? r->n_tokens - off : room;
            const be_rows_seg sg = {
                .row = (uint32_t)i, .slot = r->slot, .t0 = T, .n = take, .off = off};
            ops->seg(arg, n_segs, &sg, r->tokens + off);
            for (uint32_t j = 0; j < take; j++)
                if (r->logits_mode == BE_LOGITS_ALL ||
                    (r->logits_mode == BE_LOGITS_LAST && off + j == r->n_tokens - 1))
                    ops->logits(arg, n_logits++, T + j,
                                r->logits + (r->logits_mode == BE_LOGITS_ALL
                                                 ? (size_t)(off + j) * vocab
                                                 : 0));
            n_segs++;
            T += take;
            off += take;
            if (T == cap) {
                wk_err e = ops->run(arg, T, n_segs, n_logits, d);
                if (e != WK_OK)
                    return e;
                T = 0;
                n_segs = 0;
                n_logits = 0;
            }
        }
    }
    return T > 0 ? ops->run(arg, T, n_segs, n_logits, d) : WK_OK;
}
