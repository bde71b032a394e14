/*
 * wrk_mamba2: the Mamba2 family view (wrk_mamba2.c maps a checkpoint
 * onto it; backends read it through wrk_model_view(m, "mamba2")).
 *
 * Checkpoints: Hugging Face transformers `mamba2` (backbone.embeddings.weight,
 * lm_head.weight unless tied) and mamba_ssm / state-spaces
 * (backbone.embedding.weight, lm_head tied to the embedding and usually
 * absent). Every dimension is read from tensor shapes except n_groups (and
 * so the d_state split of conv_dim), which comes from config.json
 * (n_groups, or ssm_cfg.ngroups; default 1).
 *
 * Per layer, with x the residual stream (fp32):
 *   x += out_proj(gated_rmsnorm(ssm(conv(in_proj(rmsnorm(x) * norm)))))
 * in_proj rows are z [d_inner], xBC [conv_dim = d_inner + 2 G N], dt [H];
 * the depthwise causal conv (kernel K, bias) runs over xBC, then SiLU;
 * xBC = x [H, P] | B [G, N] | C [G, N]; dt = softplus(dt + dt_bias),
 * A = -exp(A_log); per head h (group g = h / (H / G)):
 *   S_h = S_h * exp(dt_h A_h) + dt_h x_h B_g^T,  y_h = S_h C_g + D_h x_h;
 * y = rmsnorm per group of d_inner / G (y * silu(z)) * norm.weight.
 *
 * Slot state layout (the same bytes on every backend; fp32 little-endian):
 * for each layer l in order,
 *   layers.<l>.conv  [conv_dim, K-1]  the last K-1 xBC inputs (before the
 *                                     conv) per channel, oldest first
 *   layers.<l>.ssm   [H, P, N]        S_h[p][n]
 * state_bytes = L * (conv_dim * (K-1) + H * P * N) * 4. A zeroed slot is a
 * fresh sequence.
 */
#ifndef WRK_MAMBA2_H
#define WRK_MAMBA2_H

#include <stdbool.h>
#include <stdint.h>

#include "wk_tensor.h"
#include "wrk_model.h"

/* One Mamba2 layer. Vectors are tensors of the stated element count. Borrowed. */
typedef struct wrk_mamba2_layer {
    const wk_tensor *norm;    /* pre-mixer RMSNorm weight [C] */
    wrk_mat in_proj;          /* C -> d_in_proj (z, xBC, dt), stored [d_in_proj, C] */
    const wk_tensor *conv_w;  /* depthwise conv [conv_dim, 1, K] */
    const wk_tensor *conv_b;  /* conv bias [conv_dim] */
    const wk_tensor *dt_bias; /* [H] */
    const wk_tensor *A_log;   /* [H] */
    const wk_tensor *D;       /* skip [H] */
    const wk_tensor *gnorm;   /* gated RMSNorm weight [d_inner] */
    wrk_mat out_proj;         /* d_inner -> C, stored [C, d_inner] */
} wrk_mamba2_layer;

typedef enum wrk_mamba2_convention {
    WRK_MAMBA2_HF = 0,  /* transformers: backbone.embeddings.weight */
    WRK_MAMBA2_SSM = 1, /* mamba_ssm: backbone.embedding.weight */
} wrk_mamba2_convention;

/* A Mamba2 model as loaded. Borrowed until wrk_model_free(). */
typedef struct wrk_mamba2 {
    wrk_mamba2_convention convention; /* checkpoint naming */
    uint32_t n_layer;                 /* L */
    uint32_t d_model;                 /* C */
    uint32_t d_inner;                 /* H * P */
    uint32_t n_head;                  /* H */
    uint32_t head_dim;                /* P */
    uint32_t n_groups;                /* G (divides H) */
    uint32_t d_state;                 /* N */
    uint32_t d_conv;                  /* K (>= 2) */
    uint32_t conv_dim;                /* d_inner + 2 G N */
    uint32_t d_in_proj;               /* 2 d_inner + 2 G N + H */
    uint32_t vocab_size;              /* V: embedding rows */
    double eps;                       /* RMSNorm epsilon (all three norms) */
    const wk_tensor *emb;             /* embedding [V, C] */
    const wk_tensor *norm_f;          /* final RMSNorm weight [C] */
    wrk_mat lm_head;                  /* C -> V, stored [V, C]; .t NULL when tied to emb */
    wrk_mat head_q8;                  /* tied and --quantize q8_0: the head's own Q8_0
                                         copy of emb (emb stays); .t NULL otherwise */
    wrk_mamba2_layer *layers;         /* n_layer entries */
} wrk_mamba2;

#endif /* WRK_MAMBA2_H */
