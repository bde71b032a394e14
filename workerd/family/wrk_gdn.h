/*
 * wrk_gdn: the hybrid layer-list view ("gdn" for the family it was first
 * written for: fla-hub `gated_deltanet`), as the families map a checkpoint
 * onto it and the backends read it. Families on it: wrk_gdn.c (fla Gated
 * DeltaNet and its hybrids), wrk_qwen35.c (Qwen3.5 / Qwen3-Next),
 * wrk_nemotron_h.c (NVIDIA Nemotron-H), wrk_granite_h.c (IBM Granite-4.0-H:
 * Mamba2 + attention with Granite's multipliers, emb_mul .. logit_div below).
 * RWKV-7 and pure Mamba2 keep their own views and give the backends this
 * list (wrk_rwkv7_layer_list, wrk_mamba2_layer_list, below).
 *
 * A model is a list of layers over one residual stream x (fp32). Each layer
 * is an optional mixer and an optional MLP, each with its own pre-norm:
 *     if mixer != NONE:  x += mixer(rmsnorm(x) * attn_norm)
 *     if mlp   != NONE:  x += mlp(rmsnorm(x) * mlp_norm)
 * then the final RMSNorm (norm) and the head (layer_norm: every norm a
 * LayerNorm with its bias, RWKV-7's). Kinds (wrk_mixer_kind, wrk_mlp_kind):
 *   mixer GDN     Gated DeltaNet (below): q/k/v/a/b/g_proj, convs, o_proj
 *   mixer ATTN    causal softmax attention, GQA, RoPE on the first rope_dim
 *                 dims of each head (rope_dim 0: no position encoding)
 *   mixer MAMBA2  a Mamba2 mixer (field m2; math as wrk_mamba2.h, the
 *                 grouped gated RMSNorm over m2_groups groups)
 *   mlp SWIGLU    down(silu(gate x) * up x)
 *   mlp RELU2     down(relu(up x)^2)   (gate_proj NULL)
 *   mlp MOE       a mixture of experts (wrk_moe, field moe)
 *   mixer RWKV7   RWKV-7 time mix (field rw; math and state: wrk_rwkv7.h,
 *                 the backends' be_*_rwkv7), value residual from the first
 *                 RWKV7 layer
 *   mlp RWKV7     RWKV-7 channel mix (field rw; after an RWKV7 mixer)
 * Fields of kinds a layer does not have are left zero / NULL.
 *
 * Gated DeltaNet dimensions: C = hidden_size, H query/key heads of K =
 * head_dim, HV value heads (num_v_heads, a multiple of H: value head j reads
 * key head j / (HV / H)) of Vd = head_dim * expand_v, KD = H * K, VD = HV *
 * Vd, W = conv_size, F = intermediate_size, V = vocab rows.
 * Mamba2 dimensions (every Mamba2 layer alike): m2_heads H2 of m2_head_dim
 * P, DI = H2 P, m2_groups G2, m2_state N, m2_conv K2, conv_dim CD = DI + 2
 * G2 N, in_proj rows z [DI] | xBC [CD] | dt [H2].
 *
 * Slot state layout (fp32, little-endian): the recurrent layers (GDN and
 * MAMBA2 mixers) in layer order, each named by its real layer index l:
 *   GDN:    layers.l.q_conv [W-1, KD]   the last W-1 q_proj outputs, oldest first
 *           layers.l.k_conv [W-1, KD]   the same for k_proj
 *           layers.l.v_conv [W-1, VD]   the same for v_proj
 *           layers.l.S      [HV, K, Vd] per value head S[key index][value index]
 *                                       (fla's naive / state_v_first=False order;
 *                                       fla's current layer caches the transpose)
 *   MAMBA2: layers.l.conv   [CD, K2-1]  the last K2-1 xBC inputs per channel,
 *                                       oldest first (as wrk_mamba2.h)
 *           layers.l.ssm    [H2, P, N]  S_h[p][n] (as wrk_mamba2.h)
 * wrk_gdn_state_bytes() gives their sum = info.state_bytes. A zeroed slot
 * is a fresh sequence. Layers without a recurrent mixer hold no slot state.
 *
 * Attention layers (fla hybrids: config.json "attn": {"layers": [...]};
 * Qwen3.5's full_attention layers; Nemotron-H's '*' layers) hold their KV
 * in the backend's paged pool (be.h, be_kv_info). Per token the KV image
 * holds, for each attention layer in layer order, K [Hkv, Da] then V [Hkv,
 * Da] (fp32, K after q/k norm and RoPE), so info.kv_token_bytes = n_attn *
 * 2 * Hkv * Da * 4. Attention layers reuse the q_proj / k_proj / v_proj /
 * o_proj fields with their own shapes (C -> Hq Da, C -> Hkv Da, C -> Hkv
 * Da, Hq Da -> C).
 *
 * Qwen3.5 checkpoints (family/wrk_qwen35.c): their fused projections become
 * views of rows (q, k, v of in_proj_qkv and of the conv taps), their norms
 * use (1 + weight) (norm_offset 1), their attention carries an output gate
 * in q_proj (attn_gate, q_proj C -> 2 Hq Da) and rotates only the first
 * rope_dim dims of each head.
 *
 * Everything is borrowed until wrk_model_free().
 */
#ifndef WRK_GDN_H
#define WRK_GDN_H

#include <stdbool.h>
#include <stdint.h>

#include "wk_tensor.h"
#include "wrk_mamba2.h"
#include "wrk_model.h"
#include "wrk_rwkv7.h"

/* A layer's mixer (wrk_gdn.h's layer list). */
typedef enum wrk_mixer_kind {
    WRK_MIXER_NONE = 0, /* no mixer: the layer is its MLP only */
    WRK_MIXER_GDN,      /* Gated DeltaNet (recurrent: slot state) */
    WRK_MIXER_ATTN,     /* softmax attention (KV pages) */
    WRK_MIXER_MAMBA2,   /* Mamba2 (recurrent: slot state) */
    WRK_MIXER_RWKV7,    /* RWKV-7 time mix (recurrent: slot state, holding the channel
                           mix's shift too) */
} wrk_mixer_kind;

/* A layer's MLP. */
typedef enum wrk_mlp_kind {
    WRK_MLP_NONE = 0, /* no MLP: the layer is its mixer only */
    WRK_MLP_SWIGLU,   /* down(silu(gate x) * up x) */
    WRK_MLP_RELU2,    /* down(relu(up x)^2), non-gated (Nemotron-H) */
    WRK_MLP_MOE,      /* mixture of experts (wrk_moe) */
    WRK_MLP_RWKV7,    /* RWKV-7 channel mix (only after an RWKV7 mixer: its shift is
                         in that mixer's slot state) */
} wrk_mlp_kind;

/* How a mixture of experts routes. */
typedef enum wrk_moe_router {
    WRK_MOE_SOFTMAX = 0, /* softmax over the router logits, top_k of the probabilities */
    WRK_MOE_SIGMOID,     /* sigmoid scores; choice by score + score_bias within the
                            topk_group best of n_group groups (DeepSeek-V3 / Nemotron 3) */
    WRK_MOE_TOPK_SOFTMAX, /* the top_k router logits, then a softmax over those k
                             (Granite-4.0-H, Mixtral); norm_topk is moot */
} wrk_moe_router;

/*
 * A sparse mixture-of-experts MLP. Per token:
 *   SOFTMAX router (Qwen3.5-MoE, Qwen3-Next): p = softmax(router x), the
 *     top_k experts by p, weights p (renormalised to sum 1 when norm_topk);
 *   TOPK_SOFTMAX router (Granite-4.0-H): the top_k experts by the logits
 *     router x, weights the softmax of those k logits;
 *   SIGMOID router (Nemotron 3): s = sigmoid(router x), choice score c = s +
 *     score_bias; the experts split into n_group equal groups scored by the
 *     sum of their two best c, the topk_group best groups kept, the top_k
 *     experts by c among those; weights s (divided by their sum + 1e-20 when
 *     norm_topk), times scale.
 * Each expert is an MLP of kind act (SWIGLU: gate, up, down; RELU2: up,
 * down, gate NULL) C -> ffn -> C; their outputs times their weights are
 * summed in ascending expert order. Plus, when shared_ffn > 0, a shared
 * expert of the same act C -> shared_ffn -> C, times sigmoid(sh_router x)
 * when sh_router.t is set (Qwen), else added as is (Nemotron).
 */
typedef struct wrk_moe {
    uint32_t n_experts;            /* E */
    uint32_t top_k;                /* experts per token (<= E) */
    uint32_t ffn;                  /* Fe: an expert's width */
    bool norm_topk;                /* renormalise the top_k weights */
    wrk_mlp_kind act;              /* the experts' kind: SWIGLU (0 is taken as it) or RELU2 */
    wrk_moe_router route;          /* SOFTMAX or SIGMOID */
    uint32_t n_group, topk_group;  /* SIGMOID: groups of experts, groups kept (1, 1: none) */
    float scale;                   /* SIGMOID: routed_scaling_factor on the weights */
    const wk_tensor *score_bias;   /* SIGMOID: [E] added for the choice only; NULL: zeros */
    wrk_mat router;                /* C -> E */
    wrk_mat *gate, *up, *down;     /* E entries each: C -> Fe (NULL for RELU2), C -> Fe, Fe -> C */
    uint32_t shared_ffn;           /* Fs, 0: no shared expert */
    wrk_mat sh_gate, sh_up, sh_down; /* C -> Fs (RELU2: .t NULL), C -> Fs, Fs -> C */
    wrk_mat sh_router;               /* C -> 1: the shared expert's gate; .t NULL: ungated */
} wrk_moe;

/* One layer. Vectors may carry leading 1s in their stored shape. */
typedef struct wrk_gdn_layer {
    wrk_mixer_kind mixer;             /* the mixer's kind (NONE: no mixer, no attn_norm) */
    wrk_mlp_kind mlp;                 /* the MLP's kind (NONE: no MLP, no mlp_norm) */
    const wk_tensor *attn_norm;       /* the mixer's pre-norm: RMSNorm weight [C] */
    wrk_mat q_proj, k_proj;           /* C -> KD */
    wrk_mat v_proj;                   /* C -> VD */
    wrk_mat a_proj, b_proj;           /* C -> HV (decay input, beta) */
    wrk_mat g_proj;                   /* C -> VD output gate; .t NULL without use_gate */
    const wk_tensor *q_conv, *k_conv; /* depthwise taps [KD, 1, W] */
    const wk_tensor *v_conv;          /* depthwise taps [VD, 1, W] */
    const wk_tensor *A_log, *dt_bias; /* [HV] */
    const wk_tensor *o_norm;          /* per-head RMSNorm weight [Vd] */
    wrk_mat o_proj;                   /* VD -> C */
    const wk_tensor *mlp_norm;        /* the MLP's pre-norm: RMSNorm weight [C] */
    wrk_mat gate_proj, up_proj;       /* C -> F; gate .t NULL for RELU2, both for MOE */
    wrk_mat down_proj;                /* F -> C */
    wrk_moe *moe;                     /* mlp MOE: the experts; NULL otherwise */
    /* Mamba2 mixers only: m2.norm is unused (attn_norm is the pre-norm) */
    wrk_mamba2_layer m2; /* in_proj, conv_w / conv_b, dt_bias, A_log, D, gnorm,
                            out_proj (wrk_mamba2.h) */
    /* attention layers only (is_attn) */
    const wk_tensor *q_bias, *k_bias, *v_bias; /* [Hq Da], [Hkv Da], [Hkv Da]; qkv_bias only */
    const wk_tensor *q_norm, *k_norm;          /* per-head RMSNorm weight [Da]; qk_norm only */
    /* layer_norm models: the pre-norms' biases [C] */
    const wk_tensor *attn_norm_b, *mlp_norm_b;
    /* RWKV7 kinds: the layer's RWKV-7 tensors (wrk_rwkv7.h; its ln1 / ln2 are the pre-norms) */
    const wrk_rwkv7_layer *rw;
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
    /* Mamba2 mixers (n_m2 0: none; the m2_ fields are then 0) */
    uint32_t n_m2;        /* Mamba2 layers */
    uint32_t m2_heads;    /* H2 */
    uint32_t m2_head_dim; /* P */
    uint32_t m2_groups;   /* G2 (divides H2) */
    uint32_t m2_state;    /* N */
    uint32_t m2_conv;     /* K2: conv taps (2..64) */
    /* attention layers; n_attn 0 without */
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
    /*
     * RWKV-7's conventions (wrk_rwkv7_layer_list); false / NULL for every
     * other model. layer_norm: every pre-norm and the final norm are
     * LayerNorms with a bias (attn_norm_b, mlp_norm_b, norm_b) instead of
     * RMSNorms; emb_norm (with emb_norm_b): a LayerNorm on the embedding
     * row; rw: the RWKV7 kinds' dimensions (heads, head size, LoRA ranks,
     * the GroupNorm epsilon) and ffn_dim is its channel-mix width.
     */
    bool layer_norm;
    const wk_tensor *norm_b;
    const wk_tensor *emb_norm, *emb_norm_b;
    const wrk_rwkv7 *rw;
} wrk_gdn;

/*
 * The slot layout of g (wrk_family.state_layout for every family mapping
 * onto this view): up to cap entries into out (NULL: count only); returns
 * the number of entries.
 */
size_t wrk_gdn_state_layout(const wrk_gdn *g, wrk_state_tensor *out, size_t cap);

/* Floats of layer l's slot state (0 for a layer without a recurrent mixer). */
uint64_t wrk_gdn_layer_floats(const wrk_gdn *g, uint32_t l);

/* Bytes of a slot's state: the sum over the layers (info.state_bytes). */
uint64_t wrk_gdn_state_bytes(const wrk_gdn *g);

/* Bytes of KV per token: n_attn * 2 * Hkv * Da * 4 (info.kv_token_bytes). */
uint64_t wrk_gdn_kv_token_bytes(const wrk_gdn *g);

/*
 * Fills what wrk_family.map reports of a model on this view (info's layers,
 * widths, vocab, state and KV bytes); n_head / head_size are the family's
 * own notion of its heads (GDN key heads, or Mamba2 heads).
 */
void wrk_gdn_fill_info(const wrk_gdn *g, uint32_t n_head, uint32_t head_size,
                       wrk_model_info *info);

/*
 * The matrices --quantize q8_0 converts (wrk_family.quant_mats for every
 * family mapping onto this view): every layer's projections and MLP, and
 * the head. layers is g's layer array, writable.
 */
size_t wrk_gdn_quant_mats(wrk_gdn *g, wrk_gdn_layer *layers, wrk_mat **out, size_t cap);

/*
 * A pure Mamba2 model (wrk_mamba2.h) as a layer list: every layer a MAMBA2
 * mixer (its norm as attn_norm), no MLP; the same slot bytes. *out is one
 * allocation (free()), borrowing v's tensors. Returns WK_OK or WK_ENOMEM.
 * In family/wrk_mamba2.c.
 */
WK_MUST_CHECK wk_err wrk_mamba2_layer_list(const wrk_mamba2 *v, wrk_gdn **out, wk_diag *d);

/*
 * An RWKV-7 model (wrk_rwkv7.h) as a layer list: every layer an RWKV7 time
 * mix and an RWKV7 channel mix behind their LayerNorms (ln1, ln2), ln0 on
 * the embedding, ln_out and the head; the same slot bytes (per layer the
 * time mix's shift, the channel mix's shift, then the WKV state). One
 * allocation (free()), borrowing v's tensors. In family/wrk_rwkv7.c.
 */
WK_MUST_CHECK wk_err wrk_rwkv7_layer_list(const wrk_rwkv7 *v, wrk_gdn **out, wk_diag *d);

#endif /* WRK_GDN_H */
