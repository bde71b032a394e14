/*
 * wrk_gdn: the Gated DeltaNet view of a model (fla-hub `gated_deltanet`
 * checkpoints), as wrk_gdn.c maps it and the backends read it.
 *
 * Dimensions: C = hidden_size, H query/key heads of K = head_dim, HV value
 * heads (num_v_heads, a multiple of H: value head j reads key head
 * j / (HV / H)) of Vd = head_dim * expand_v, KD = H * K, VD = HV * Vd, W =
 * conv_size, F = intermediate_size, V = vocab rows.
 *
 * Slot state layout (fp32, little-endian), per layer l in order:
 *     layers.l.q_conv [W-1, KD]   the last W-1 q_proj outputs, oldest first
 *     layers.l.k_conv [W-1, KD]   the same for k_proj
 *     layers.l.v_conv [W-1, VD]   the same for v_proj
 *     layers.l.S      [HV, K, Vd] per value head S[key index][value index]
 *                                 (fla's naive / state_v_first=False order;
 *                                 fla's current layer caches the transpose)
 * slot_bytes = Lg * ((W-1) * (2 KD + VD) + HV K Vd) * 4 = info.state_bytes,
 * with Lg the number of Gated DeltaNet layers.
 * A zeroed slot is a fresh sequence.
 *
 * Hybrid models (config.json "attn": {"layers": [...], ...}, fla's
 * Attention in the listed layers): an attention layer has attn_norm, the
 * MLP and mlp_norm like every layer, but its mixer is causal softmax
 * attention with RoPE (GPT-NeoX rotate-half, rotary dim = head dim,
 * base rope_theta) and grouped KV heads. Attention layers hold NO
 * recurrent state: the slot layout above lists only the Gated DeltaNet
 * layers (in layer order, named by their real layer index), and their KV
 * lives in the backend's paged pool (be.h, be_kv_info). Per token the KV
 * image holds, for each attention layer in layer order, K [Hkv, Da] then
 * V [Hkv, Da] (fp32, K after q/k norm and RoPE), so
 * info.kv_token_bytes = n_attn * 2 * Hkv * Da * 4.
 * Attention layers reuse the q_proj / k_proj / v_proj / o_proj fields with
 * their own shapes (C -> Hq Da, C -> Hkv Da, C -> Hkv Da, Hq Da -> C) and
 * leave the Gated DeltaNet-only fields NULL.
 *
 * Qwen3.5 checkpoints (family/wrk_qwen35.c) map onto this view too: their
 * fused projections become views of rows (q, k, v of in_proj_qkv and of the
 * conv taps), their norms use (1 + weight) (norm_offset 1), their attention
 * carries an output gate in q_proj (attn_gate, q_proj C -> 2 Hq Da) and
 * rotates only the first rope_dim dims of each head.
 *
 * Everything is borrowed until wrk_model_free().
 */
#ifndef WRK_GDN_H
#define WRK_GDN_H

#include <stdbool.h>
#include <stdint.h>

#include "wk_tensor.h"
#include "wrk_model.h"

/*
 * A sparse mixture-of-experts MLP (Qwen3.5-MoE, Qwen3-Next): per token the
 * router's softmax over n_experts, the top_k of them (renormalised to sum 1
 * when norm_topk), each a SwiGLU MLP C -> ffn -> C, summed with those
 * weights in ascending expert order; plus, when shared_ffn > 0, a shared
 * SwiGLU expert C -> shared_ffn -> C times sigmoid(shared_gate x).
 */
typedef struct wrk_moe {
    uint32_t n_experts;            /* E */
    uint32_t top_k;                /* experts per token (<= E) */
    uint32_t ffn;                  /* Fe: an expert's width */
    bool norm_topk;                /* renormalise the top_k weights */
    wrk_mat router;                /* C -> E */
    wrk_mat *gate, *up, *down;     /* E entries each: C -> Fe, C -> Fe, Fe -> C */
    uint32_t shared_ffn;           /* Fs, 0: no shared expert */
    wrk_mat sh_gate, sh_up, sh_down; /* C -> Fs, C -> Fs, Fs -> C */
    wrk_mat sh_router;             /* C -> 1: the shared expert's gate */
} wrk_moe;

/* One layer. Vectors may carry leading 1s in their stored shape. */
typedef struct wrk_gdn_layer {
    bool is_attn;                     /* a softmax attention layer (hybrid models) */
    const wk_tensor *attn_norm;       /* RMSNorm weight [C] */
    wrk_mat q_proj, k_proj;           /* C -> KD */
    wrk_mat v_proj;                   /* C -> VD */
    wrk_mat a_proj, b_proj;           /* C -> HV (decay input, beta) */
    wrk_mat g_proj;                   /* C -> VD output gate; .t NULL without use_gate */
    const wk_tensor *q_conv, *k_conv; /* depthwise taps [KD, 1, W] */
    const wk_tensor *v_conv;          /* depthwise taps [VD, 1, W] */
    const wk_tensor *A_log, *dt_bias; /* [HV] */
    const wk_tensor *o_norm;          /* per-head RMSNorm weight [Vd] */
    wrk_mat o_proj;                   /* VD -> C */
    const wk_tensor *mlp_norm;        /* RMSNorm weight [C] */
    wrk_mat gate_proj, up_proj;       /* C -> F; .t NULL with moe */
    wrk_mat down_proj;                /* F -> C */
    wrk_moe *moe;                     /* the MLP is a mixture of experts; NULL: dense */
    /* attention layers only (is_attn) */
    const wk_tensor *q_bias, *k_bias, *v_bias; /* [Hq Da], [Hkv Da], [Hkv Da]; qkv_bias only */
    const wk_tensor *q_norm, *k_norm;          /* per-head RMSNorm weight [Da]; qk_norm only */
} wrk_gdn_layer;

typedef struct wrk_gdn {
    uint32_t n_layer;            /* L */
    uint32_t n_embd;             /* C */
    uint32_t n_head;             /* H: query / key heads */
    uint32_t head_k;             /* K */
    uint32_t n_v_head;           /* HV: value heads */
    uint32_t head_v;             /* Vd */
    uint32_t conv;               /* W: short convolution taps (>= 2) */
    uint32_t ffn_dim;            /* F */
    uint32_t vocab_size;         /* V */
    bool use_gate;               /* o_norm gated by SiLU(g_proj x) */
    bool allow_neg_eigval;       /* beta = 2 sigmoid(.) */
    bool tied;                   /* the head is the embedding */
    double norm_eps;             /* every RMSNorm's epsilon */
    const wk_tensor *emb;        /* model.embeddings.weight [V, C] */
    const wk_tensor *norm;       /* model.norm.weight [C] */
    wrk_mat head;                /* C -> V, stored [V, C]; over emb when tied */
    const wrk_gdn_layer *layers; /* n_layer entries */
    /* hybrid attention layers (config "attn"); n_attn 0 without */
    uint32_t n_attn;        /* attention layers */
    uint32_t attn_heads;    /* Hq: query heads */
    uint32_t attn_kv_heads; /* Hkv: key / value heads (divides Hq) */
    uint32_t attn_head_dim; /* Da: even */
    double rope_theta;      /* RoPE base */
    double attn_norm_eps;   /* q_norm / k_norm epsilon (fla RMSNorm default 1e-5) */
    bool qkv_bias;          /* q / k / v projections carry a bias */
    bool qk_norm;           /* per-head RMSNorm on q and k before RoPE */
    bool attn_gate;         /* q_proj rows are [Hq][2 Da]: per head the query, then a gate;
                               the attention output is multiplied by sigmoid(gate) (Qwen3.5) */
    uint32_t rope_dim;      /* rotary dims: the first rope_dim of each head (even, <= Da) */
    float norm_offset;      /* added to every RMSNorm weight but o_norm's: 0, or 1 for the
                               (1 + weight) convention of Qwen3.5 */
    /*
     * Granite's scalars (family/wrk_granite_h.c); 0 in each: none (what
     * every other family leaves them). emb_mul multiplies the embedding
     * row; res_mul multiplies each mixer's and each MLP's output before it
     * is added into the residual (x = x + out * res_mul); attn_scale
     * replaces Da^-0.5 as the attention score scale; logit_div divides the
     * logits (logits = head(norm(x)) / logit_div).
     */
    float emb_mul;
    float res_mul;
    float attn_scale;
    float logit_div;
} wrk_gdn;

/*
 * The slot layout of g (wrk_family.state_layout for every family mapping
 * onto this view): up to cap entries into out (NULL: count only); returns
 * the number of entries.
 */
size_t wrk_gdn_state_layout(const wrk_gdn *g, wrk_state_tensor *out, size_t cap);

/*
 * The matrices --quantize q8_0 converts (wrk_family.quant_mats for every
 * family mapping onto this view): every layer's projections and MLP, and
 * the head. layers is g's layer array, writable.
 */
size_t wrk_gdn_quant_mats(wrk_gdn *g, wrk_gdn_layer *layers, wrk_mat **out, size_t cap);

#endif /* WRK_GDN_H */
