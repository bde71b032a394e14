/*
 * wrk_rwkv7: the RWKV-7 ("x070") view of a loaded model (filled by
 * family/wrk_rwkv7.c; backends read it through wrk_model_rwkv7(m)).
 * Matrices are wrk_mat (wrk_model.h), vectors stored tensors.
 */
#ifndef WRK_RWKV7_H
#define WRK_RWKV7_H

#include <stdbool.h>
#include <stdint.h>

#include "wk_tensor.h"
#include "wrk_model.h"

/*
 * One RWKV-7 layer. Vectors are tensors whose elements, in storage order,
 * are the C (or H*N for r_k, stored [H, N]) values; their shape may carry
 * leading 1s. All pointers borrowed until wrk_model_free().
 */
typedef struct wrk_rwkv7_layer {
    const wk_tensor *ln1_w, *ln1_b; /* attention LayerNorm [C] */
    const wk_tensor *ln2_w, *ln2_b; /* channel-mix LayerNorm [C] */
    const wk_tensor *x_r, *x_w, *x_k, *x_v, *x_a, *x_g; /* token-shift mixes [C] */
    const wk_tensor *w0, *a0, *v0;  /* LoRA biases [C]; v0 NULL on layer 0 */
    wrk_mat w1, w2;                 /* decay LoRA C -> Dw -> C */
    wrk_mat a1, a2;                 /* in-context learning rate LoRA C -> Da -> C */
    wrk_mat v1, v2;                 /* value-residual LoRA C -> Dv -> C; .t NULL on layer 0 */
    wrk_mat g1, g2;                 /* gate LoRA C -> Dg -> C */
    const wk_tensor *k_k, *k_a;     /* key normalisation / ICLR mix [C] */
    const wk_tensor *r_k;           /* bonus [H, N] */
    wrk_mat wr, wk, wv, wo;         /* receptance, key, value, output C -> C */
    const wk_tensor *lnx_w, *lnx_b; /* GroupNorm (ln_x / g_norm) [C] */
    const wk_tensor *ffn_x_k;       /* channel-mix token shift [C] */
    wrk_mat ffn_key;                /* C -> F */
    wrk_mat ffn_value;              /* F -> C */
} wrk_rwkv7_layer;

typedef enum wrk_convention {
    WRK_CONVENTION_BLINKDL = 0, /* emb.weight, blocks.N.att.* ... */
    WRK_CONVENTION_HF = 1,      /* fla-hub rwkv7: model.embeddings.weight ... */
} wrk_convention;

/* An RWKV-7 model as loaded. Borrowed until wrk_model_free(). */
typedef struct wrk_rwkv7 {
    wrk_convention convention;       /* checkpoint naming */
    uint32_t n_layer, n_embd;        /* L, C */
    uint32_t n_head, head_size;      /* H, N (H * N == C) */
    uint32_t ffn_dim, vocab_size;    /* F, V */
    uint32_t lora_w, lora_a;         /* decay / ICLR LoRA ranks */
    uint32_t lora_v, lora_g;         /* value-residual (0 when L == 1) / gate ranks */
    const wk_tensor *emb;            /* embedding [V, C] */
    const wk_tensor *ln0_w, *ln0_b;  /* LayerNorm on the embedding [C] */
    const wk_tensor *lnout_w, *lnout_b; /* LayerNorm before the head [C] */
    wrk_mat head;                    /* C -> V, stored [V, C]; .t == emb when tied */
    bool tied;                       /* HF tie_word_embeddings: no lm_head, the head is emb */
    double ln_eps;                   /* LayerNorm epsilon: BlinkDL 1e-5, HF config norm_eps */
    double gn_eps;                   /* per-head GroupNorm (ln_x / g_norm) epsilon: BlinkDL
                                        64e-5 (1e-5 * head_size_divisor 8 squared, any N),
                                        HF head_dim * norm_eps (fla's g_norm) */
    const wrk_rwkv7_layer *layers;   /* n_layer entries */
} wrk_rwkv7;

/* The RWKV-7 view of m, borrowed until wrk_model_free(); NULL for other families. */
const wrk_rwkv7 *wrk_model_rwkv7(const wrk_model *m);

#endif /* WRK_RWKV7_H */
