/*
 * be_cpu_attn: causal softmax attention of a block of queries over one
 * slot's paged KV (be_cpu_kv), the CPU backend's attention layer kind. Used
 * by every family with attention layers (the hybrids of be_cpu_gdn.c).
 *
 * A block is up to BE_CPU_ATTN_QMAX queries that share one KV head of one
 * slot (in practice: consecutive tokens of a segment times the query heads
 * of a KV head); query i attends to positions 0..nn[i]-1. The block only
 * shares the reads of K and V: each query's output has exactly the
 * operations of that query alone, in any block, on every ISA path:
 *   score_j = ((p0 + p1) + (p2 + p3)) * scale, p_l the fma chain over the dims
 *             d = l mod 4 (in order) of q[d] * k_j[d] from +0
 *   mx      = the largest score that is not NaN (the loop m = s > m ? s : m)
 *   e_j     = exp(score_j - mx) (a vectorised exp, be_cpu_attn.c), sum_j e_j in double
 *   o[d]    = fma chain over j = 0..nn-1 of e_j * v_j[d] from +0, times (float)(1 / sum)
 * (fma: one rounding, IEEE fmaf; scalar, AVX2 and AVX-512 give the same bits;
 * a NaN output is always the one quiet NaN, whatever its inputs' payloads).
 * Scratch: 256 bytes per position of the longest query and per head dim
 * (64 lanes of fp32), per thread.
 *
 * Must never: log, allocate, or read past the slot's pages for position
 * nn[i]-1 of the block's longest query.
 */
#ifndef BE_CPU_ATTN_H
#define BE_CPU_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "be_cpu_kernels.h"
#include "be_kv.h"

#define BE_CPU_ATTN_QMAX 64u /* most queries of a block */

/* One block of queries (be_cpu_attn_fn). Everything borrowed for the call. */
typedef struct be_cpu_attn_blk {
    const be_kv *kv;                    /* the pool (its pages hold fp32 token rows) */
    uint32_t slot;                      /* whose pages */
    size_t koff, voff;                  /* floats into a token row: this KV head's K, its V */
    uint32_t Da;                        /* head dim */
    float scale;                        /* score scale */
    uint32_t nq;                        /* queries, 1..BE_CPU_ATTN_QMAX */
    const float *q[BE_CPU_ATTN_QMAX];   /* query i: Da floats */
    float *o[BE_CPU_ATTN_QMAX];         /* its output: Da floats (not aliasing q or the pool) */
    uint32_t nn[BE_CPU_ATTN_QMAX];      /* its positions 0..nn-1: >= 1, nondecreasing in i */
} be_cpu_attn_blk;

/* Runs block b with scratch scr (be_cpu_attn_scr_floats of its longest nn and Da). */
typedef void (*be_cpu_attn_fn)(const be_cpu_attn_blk *b, float *scr);

/* The kernel for isa (each gives the same bits). */
be_cpu_attn_fn be_cpu_attn_pick(be_cpu_isa isa);

/* Scratch floats for blocks of up to n_keys positions and head dim Da (64-byte multiples). */
static inline size_t
be_cpu_attn_scr_floats(size_t n_keys, uint32_t Da)
{
    return (size_t)BE_CPU_ATTN_QMAX * (n_keys + Da);
}

#endif /* BE_CPU_ATTN_H */
