/*
 * be_cuda_gdn: the layer-list step on a CUDA device, host side (the
 * family be_cuda.c reaches through be_cuda_gdn_family), the one step of
 * every family: fla Gated DeltaNet and its hybrids, Qwen3.5 /
 * Qwen3.5-MoE / Qwen3-Next, Nemotron-H and Granite-4.0-H (the "gdn" view,
 * wrk_gdn.h), and pure Mamba2 and RWKV-7 as lists of their layers
 * (wrk_mamba2_layer_list, wrk_rwkv7_layer_list). The math, the stage order
 * and the slot layout are the CPU reference's (be_cpu_gdn.c,
 * be_cpu_mamba2.c, be_cpu_rwkv7.c, wrk_gdn.h); the kernels are
 * kernels/k_gdn.cu, k_attn.cu, k_mamba2.cu, k_rwkv7.cu, k_hybrid.cu and
 * k_common.cu behind kernels/k.h.
 *
 * At creation every projection, expert, the head and the embedding (the
 * same device bytes when tied) are copied to the device as stored; the
 * vectors (norm weights with Qwen3.5's (1 + weight) folded in as the CPU
 * does, -exp(A_log), dt_bias, conv taps as stored [D][W], Mamba2's conv
 * taps [CD][K2] and bias, A, D and gated-norm weight; RWKV-7's norm
 * biases, ln0, mixes, LoRA biases, k_k, k_a, r_k and GroupNorm) are
 * widened to fp32.
 * A pass (be_cuda_core: at most `cap` tokens, rows cut as the CPU cuts
 * them) runs the embedding (times Granite's emb_mul), then per layer its
 * mixer and its MLP, each after its own RMSNorm and each skipped when the
 * layer has none, then the final norm and the head for the logits rows
 * only (divided by Granite's logit_div on the device); on layer_norm models
 * (RWKV-7) every pre-norm and the final norm are LayerNorms with their
 * biases and the embedding row gets ln0 (emb_norm) as it is gathered
 * (k_rwkv7_embed). Every mixer's and MLP's output projection is added
 * into the residual by the GEMM's epilogue, or, with Granite's res_mul,
 * stored into xr and added as x + xr * res_mul (gdn_add_out, the CPU's
 * order of rounding).
 *
 * Mixers:
 *   GDN     the q / k / v / a / b (/ g) GEMMs for every token, the three
 *           short convs + SiLU per (segment, channel) in token order over
 *           the slot's histories, the q / k L2 norms (q scaled by K^-0.5),
 *           decay and beta, the delta rule per (segment, value head,
 *           32-column tile) in token order over the slot's S, the gated
 *           per-head RMSNorm, o_proj.
 *   ATTN    below (hybrid models).
 *   MAMBA2  k_mamba2.cu's kernels (every layer of a pure Mamba2 model
 *           too: wrk_mamba2_layer_list): in_proj into m2p [T][DIP]
 *           (z [DI] | xBC [CD] | dt [H2] per token), the conv + SiLU of
 *           xBC (m2p + DI, rows DIP apart) per (segment, channel) over the
 *           slot's conv state into m2x [T][CD], the scan per (segment,
 *           head) over the slot's ssm state (dt at m2p + DI + CD, rows DIP
 *           apart) into m2y [T][DI], the gate silu(z) (z at m2p, rows DIP
 *           apart) and the grouped RMSNorm over G2 groups (norm_eps, as the
 *           CPU's be_cpu_m2_dims.eps), out_proj.
 *   RWKV7   RWKV-7's time mix (k_rwkv7.cu): the token shift of xn against
 *           the slot's time-mix shift (which then takes each segment's
 *           last xn row) into RW_MIX_N mix buffers, the r / k / v GEMMs
 *           and the decay (tanh), ICLR, value-residual and gate (sigmoid)
 *           LoRAs, the attention prologue (k_rwkv7_att: decay, ICLR, key
 *           normalisation; the first RWKV7 layer stores v_first = v, the
 *           later ones mix v towards it), the WKV recurrence per (segment,
 *           head) over the slot's state with GroupNorm, bonus and gate,
 *           W_o.
 * MLPs:
 *   SWIGLU  gate / up GEMMs, silu(gate) * up, down.
 *   RELU2   the up GEMM with the relu(.)^2 epilogue (the CPU: the GEMM,
 *           then relu, then the square: the same two roundings), down.
 *   MOE     below.
 *   RWKV7   RWKV-7's channel mix (after an RWKV7 mixer): the token shift
 *           against the slot's channel-mix shift, relu(W_k .)^2 (the
 *           GEMM's epilogue), W_v.
 *
 * Slot layout: wrk_gdn.h. The recurrent layers (GDN and MAMBA2 mixers) in
 * layer order, layer l's state gdn_layer.soff floats into the slot (the
 * sum of wrk_gdn_layer_floats of the layers before it, as the CPU's soff):
 *   GDN:    q_conv [W-1][KD] at soff, k_conv [W-1][KD] at soff + (W-1) KD,
 *           v_conv [W-1][VD] at soff + 2 (W-1) KD, S [HV][K][Vd] at soff +
 *           (W-1)(2 KD + VD) (gdn_off_*);
 *   MAMBA2: conv [CD][K2-1] at soff, ssm [H2][P][N] at soff + CD (K2-1)
 *           (m2_conv_floats);
 *   RWKV7:  the time mix's shift [C] at soff, the channel mix's shift [C]
 *           at soff + C, the WKV state [H][N][N] at soff + 2C (the
 *           layout RWKV-7 always had);
 * slot_floats, the sum over every layer, is the arena stride (slot_bytes).
 *
 * Attention layers (hybrid models): the attention layers' K / V live in a
 * paged device pool (be_kv.h, be_cuda_kv.h) of be_config.kv_pages pages of
 * GDN_KV_PAGE_TOKENS tokens (default, as the CPU: every slot can hold
 * GDN_KV_DEF_CTX tokens at once; unlike the CPU the device memory is
 * allocated at open), handed to be_cuda.c through be_cuda_gdn_family.kv for
 * the slot operations. A step takes its rows' pages after the row checks
 * and before any device call (gdn_pre_step: refused whole with WK_EQUOTA
 * naming the row), which fixes each row's first position (its slot's
 * n_ctx before the step, 0 for a reset row). Each pass uploads, per
 * segment, the segment's first position and its slot's page table (the
 * pass's slots are distinct, so the tables fit in pages_total entries). An
 * attention layer runs: the q / k / v GEMMs (with Qwen3.5's output gate,
 * attn_gate, q_proj gives aqg [T][Hq][2 Da], per head the query then its
 * gate, split into aq [T][Hq][Da] and ag [T][Hq][Da]), the biases, the
 * per-head q / k RMSNorm, RoPE on the first rope_dim dims of each head
 * (inv_freq theta^(-2i/rope_dim), i < rope_dim / 2; rope_dim 0: none, as
 * Nemotron-H's and Granite-4.0-H's attention) at each token's absolute
 * position and the append of every pass token's K / V to its slot's pages
 * (k_attn_rope_store), then per (token, query head) softmax attention over
 * positions 0..pos through the page table (k_attn; the score scale
 * Da^-0.5 or Granite's attention_multiplier), the output times
 * sigmoid(gate) with attn_gate, then o_proj.
 *
 * Mixture of experts (wrk_moe; correctness first): the router GEMM (and
 * the shared expert's GEMMs and its sigmoid gate) on the device for every
 * token, then one copy of the router logits [T][E] to pinned host memory
 * and a stream synchronisation, the routing per token on the host with the
 * CPU's own code (wrk_moe_route: softmax / sigmoid with score
 * bias and groups / top-k-then-softmax; the selection stored by ascending
 * expert), a counting sort of the T k (token, expert) pairs into
 * expert-major rows (tokens ascending within an expert), one upload of the
 * row tables (idx [T k]: the token of each gathered row; trow [T k]: the
 * row of each (token, j); w [T k]: the weights), the gather of the normed
 * inputs into xe [T k][C], per expert with rows its gate / up GEMMs over
 * its rows (up with the relu(.)^2 epilogue for RELU2 experts), the
 * activation, its down GEMM into oe [T k][C], and per token the weighted
 * sum in ascending expert order plus the (gated) shared expert added into
 * the residual (k_moe_combine, the CPU's gdn_stage_combine). Cost: one
 * device-to-host copy of T E floats, one synchronisation (the pass waits
 * for the device once per MoE layer, so the host cannot run ahead), one
 * host-to-device copy of 3 T k words and, per active expert, three GEMMs
 * of its own rows (each a split, a cuBLAS call and an epilogue launch):
 * decode with many experts is launch-bound (k active experts per token,
 * up to E per layer for a batch); a grouped GEMM and routing on the device
 * are the next steps.
 *
 * GEMMs (be_cuda_gemm): cublasGemmEx with CUBLAS_COMPUTE_32F (fp32
 * accumulation, no TF32). 16-bit weights stay 16-bit; the fp32
 * activations are split per token row into hi + lo 16-bit halves
 * (k_split16, with a power-of-two row scale so binary16 cannot overflow)
 * and multiplied in one GEMM over 2T columns, so the weights stream once
 * and the product keeps ~16 significant bits of the activations (~1e-6
 * relative against the CPU's fp32 activations times the widened weights).
 * F32 weights multiply the fp32 activations directly.
 *
 * Batch invariance (be.h asks for bit-identical rows whatever the batch):
 * every kernel reduces in a fixed order per row, so a row's bits depend
 * only on its own data EXCEPT through cuBLAS, which picks its algorithm
 * (tiling, split-K) from the GEMM shape, i.e. from the number of tokens in
 * the pass. So a row's results are repeatable for one pass composition
 * (same shapes, same device, one stream and a fixed cuBLAS workspace) but
 * NOT bit-exact across batch sizes or prefill chunkings: they agree to
 * GEMM rounding, which is what the CUDA parity tests check. Pinning one
 * cublasLt algorithm for every shape would make it exact; not done yet.
 * The experts' choice is a
 * comparison of router outputs, so a near tie may pick another expert on
 * the two backends (as it may across GEMM kernels on the CPU's ISAs).
 *
 * Without a device, tests/gpu/cuda_mock/run.sh runs this file's host code
 * (sizes, offsets, strides, launch arguments, the routing) against the CPU
 * backend with the runtime and the k.h launchers emulated on the host.
 *
 * Must never: log, abort on bad input, or change any slot when a step is
 * refused (be_cuda_core_step checks every row first).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be_cuda_common.h"
#include "be_cuda_kv.h"
#include "k.h"
#include "wrk_gdn.h"
#include "wrk_moe_route.h"

#define GDN_MAX_CONV 64u       /* conv taps limit (the CPU's and the kernels') */
#define GDN_KV_PAGE_TOKENS 16u /* tokens per KV page (the CPU's, be_cpu_gdn.c) */
#define GDN_KV_DEF_CTX 2048u   /* default pool: this many tokens for every slot (the CPU's) */
#define GDN_ATT_MAX_DIM 1024u  /* attention head dim (k_attn's limit, the CPU's) */
#define GDN_M2_SMEM 49152u     /* k_mamba2_scan's shared memory for x, B, C (bytes) */

/* Offsets of a layer's vectors in the device vector block (floats). */
enum {
    GV_ATTN_NORM = 0,
    GV_MLP_NORM,
    GV_O_NORM,
    GV_NEG_A,
    GV_DT_BIAS,
    GV_CQ,
    GV_CK,
    GV_CV,
    GV_BQ, /* attention layers: qkv biases (qkv_bias), q / k norm weights (qk_norm) */
    GV_BK,
    GV_BV,
    GV_NQ,
    GV_NK,
    GV_M2_CW, /* Mamba2 mixers: conv taps [CD][K2], bias [CD], dt_bias, A, D [H2], gnorm [DI] */
    GV_M2_CB,
    GV_M2_DTB,
    GV_M2_A,
    GV_M2_D,
    GV_M2_GN,
    GV_ATTN_NORM_B, /* layer_norm models (RWKV-7): the pre-norms' biases */
    GV_MLP_NORM_B,
    GV_RW_MIX, /* RWKV7 time mix: the token-shift mixes r, w, k, v, a, g [C] each, consecutive */
    GV_RW_MIX_LAST = GV_RW_MIX + 5,
    GV_RW_W0, /* LoRA biases, k_k, k_a, r_k [H N], GroupNorm weight and bias [C] */
    GV_RW_A0,
    GV_RW_V0,
    GV_RW_K_K,
    GV_RW_K_A,
    GV_RW_R_K,
    GV_RW_LNX_W,
    GV_RW_LNX_B,
    GV_RW_FFN_X_K, /* RWKV7 channel mix: its token-shift mix [C] */
    GV_N
};

/* The model-wide vectors before the layers' in the offset table. */
enum { GG_NORM = 0, GG_NORM_B, GG_EMB_NORM, GG_EMB_NORM_B, GG_N };

/* RWKV7 time mix: the mixes in the order of the GV_RW_MIX vectors. */
enum { RW_MIX_R = 0, RW_MIX_W, RW_MIX_K, RW_MIX_V, RW_MIX_A, RW_MIX_G, RW_MIX_N };

/* A mixture-of-experts MLP (wrk_moe) on the device, its routing on the host. */
typedef struct gdn_moe {
    uint32_t E, k, Fe, Fs;         /* experts, per token, expert width, shared width (0: none) */
    bool relu2;                    /* RELU2 experts (and shared expert), else SwiGLU */
    bool sh_gated;                 /* the shared expert is times sigmoid(sr x) */
    wrk_moe_route_cfg rt;          /* the routing (wrk_moe_route, on the host), owned */
    be_cuda_mat router;            /* C -> E */
    be_cuda_mat *gate, *up, *down; /* E each (gate unused for RELU2), owned host arrays */
    be_cuda_mat sg, su, sd, sr;    /* shared expert C -> Fs -> C, its gate C -> 1 */
} gdn_moe;

typedef struct gdn_layer {
    wrk_mixer_kind mixer; /* the layer's kinds (wrk_gdn.h) */
    wrk_mlp_kind mlp;
    uint32_t idx;                          /* attention layers: index among them (KV layer) */
    size_t soff;                           /* recurrent mixers: floats before its state in a slot */
    const float *bq, *bk, *bv;             /* attention: biases [QD], [KVD], [KVD]; NULL without */
    const float *nq, *nk;                  /* attention: q / k norm weights [Da]; NULL without */
    const float *attn_norm, *mlp_norm;     /* [C], device; NULL without a mixer / an MLP */
    const float *o_norm;                   /* [Vd], device */
    const float *neg_A, *dt_bias;          /* [HV], device */
    const float *cq, *ck, *cv;             /* conv taps [KD][W], [KD][W], [VD][W], device */
    const float *m2_cw, *m2_cb;            /* Mamba2: conv taps [CD][K2], bias [CD], device */
    const float *m2_dtb, *m2_A, *m2_D;     /* Mamba2: dt_bias, -exp(A_log), D [H2], device */
    const float *m2_gn;                    /* Mamba2: gated RMSNorm weight [DI], device */
    be_cuda_mat wq, wk, wv, wa, wb;        /* input projections (attention: q, k, v only) */
    be_cuda_mat wg;                        /* output gate (use_gate only) */
    be_cuda_mat wo;                        /* VD -> C (attention: QD -> C) */
    be_cuda_mat m2_in, m2_out;             /* Mamba2: C -> DIP, DI -> C */
    be_cuda_mat gate, up, down;            /* dense MLP (RELU2: no gate) */
    gdn_moe *moe;                          /* mlp MOE: the experts; NULL otherwise */
    const float *attn_norm_b, *mlp_norm_b; /* layer_norm: the pre-norms' biases [C], device */
    /* RWKV7 time mix (wr, wk, wv, wo: C -> C; the LoRAs C -> D -> C) and channel mix */
    bool rw_first;                         /* the first RWKV7 mixer: v_first = v */
    const float *rw_mix;                   /* RW_MIX_N mixes [C] each, consecutive, device */
    const float *rw_w0, *rw_a0, *rw_v0;    /* [C] (v0 NULL on the first RWKV7 layer) */
    const float *rw_k_k, *rw_k_a, *rw_r_k; /* [C], [C], [H N] */
    const float *rw_lnx_w, *rw_lnx_b;      /* GroupNorm [C] */
    const float *rw_ffn_x_k;               /* channel mix token-shift mix [C] */
    be_cuda_mat wr, w1, w2, a1, a2, v1, v2, g1, g2; /* with wk, wv, wo above */
    be_cuda_mat fk, fv;                             /* channel mix C -> F -> C */
} gdn_layer;

typedef struct be_cuda_gdn {
    be_cuda_core core;                         /* stream, cuBLAS, weights, scratch, passes */
    uint32_t L, C, H, K, HV, Vd, KD, VD, W, F; /* dimensions (wrk_gdn.h; GDN ones 0 without) */
    uint32_t V;                                /* vocab */
    double eps;                                /* every RMSNorm's epsilon */
    bool use_gate;                             /* o_norm gated by SiLU(g_proj x) */
    bool tied;                                 /* the head is the embedding */
    float beta_scale;                          /* 1 or 2 (allow_neg_eigval) */
    float q_scale;                             /* K^-0.5 */
    float emb_mul, res_mul;                    /* Granite's scalars (wrk_gdn.h); 0: none */
    wk_dtype dtype;                            /* the weights' dtype (describe) */
    uint32_t n_gdn;                            /* Gated DeltaNet layers */
    size_t layer_floats;                       /* floats per Gated DeltaNet layer in a slot */
    size_t slot_floats;                        /* every recurrent layer's floats: the stride */
    float *arena;                              /* device, borrowed from be_cuda */

    float *vecs;       /* device block of every fp32 vector, owned */
    const float *norm; /* final norm [C], into vecs */
    gdn_layer *layers; /* host array of L, owned */
    be_cuda_mat emb;   /* [V][C] as stored */
    be_cuda_mat head;  /* C -> V (tied: the embedding's bytes) */

    /* device scratch (fp32), cap tokens unless noted */
    float *x;            /* residual [cap][C] */
    float *xn;           /* normed input [cap][C] */
    float *xr;           /* res_mul: a block's output [cap][C] (NULL without) */
    float *qr, *kr, *vr; /* projections before the conv [cap][KD|KD|VD] */
    float *q, *k, *v;    /* after conv + SiLU (+ L2 norm) */
    float *ar, *br;      /* a / b projections [cap][HV]; then decay / beta */
    float *gr;           /* g_proj [cap][VD] */
    float *o;            /* recurrence output [cap][VD] */
    float *hg, *hu;      /* MLP hidden [cap][F] */
    float *xo;           /* final-norm rows [lcap][C] */

    /* Mamba2 mixers (n_m2 0: none of this is allocated) */
    uint32_t n_m2;             /* Mamba2 layers */
    uint32_t H2, P, G2, N, K2; /* heads, head dim, groups, state, conv taps */
    uint32_t DI, CD, DIP;      /* H2 P, DI + 2 G2 N, DI + CD + H2 */
    size_t m2_conv_floats;     /* CD (K2-1): the conv state before the ssm state */
    float *m2p, *m2x, *m2y;    /* [cap][DIP], [cap][CD], [cap][DI] */

    /* layer_norm models (RWKV-7): LayerNorms with biases; ln0 on the embedding (emb_norm) */
    bool layer_norm;
    const float *norm_b;                /* final norm's bias [C] */
    const float *emb_norm, *emb_norm_b; /* [C] each; NULL without */

    /* RWKV-7 time and channel mixes (n_rw 0: none of this is allocated) */
    uint32_t n_rw;            /* RWKV7 mixers */
    bool swiglu;              /* a SwiGLU MLP layer (the only user of hu) */
    uint32_t rH, rN;          /* heads, head size (rH rN = C) */
    uint32_t Dw, Dal, Dv, Dg; /* LoRA ranks: decay, ICLR, value residual, gate */
    float gn_eps;             /* the per-head GroupNorm's epsilon */
    float *mx;                /* RW_MIX_N buffers [RW_MIX_N][cap][C] */
    float *rr, *rk, *rv, *vf; /* r, k, v, v_first [cap][C] */
    float *lw, *la, *lv, *lg; /* LoRA hidden [cap][D*] */

    /* mixture-of-experts layers (moe_k 0: none of this is allocated) */
    uint32_t moe_E, moe_k, moe_Fe, moe_Fs; /* the largest E, k, Fe, Fs of any layer */
    float *rl;                             /* router logits [cap][E], device */
    float *xe;                             /* gathered inputs, expert-major [cap k][C] */
    float *he, *hue;                       /* expert hidden [cap k][Fe] (rows Fe of the layer) */
    float *oe;                             /* expert outputs [cap k][C] */
    float *hs, *hsu;                       /* shared expert hidden [cap][Fs] */
    float *os, *sgv;                       /* shared expert output [cap][C], its gate [cap] */
    uint32_t *dmoe;                        /* device row tables: idx, trow [cap k], w [cap k] */
    uint32_t *hmoe;                        /* their pinned staging copy */
    float *hrl;                            /* pinned router logits [cap][E] */
    uint32_t *sel;                         /* host: each token's experts, ascending [cap k] */
    float *sw;                             /* host: their weights [cap k] */
    float *cs;                             /* host: sigmoid routing choice scores [E] */
    uint32_t *ecnt;                        /* host: rows per expert, then ends [E + 1] */

    /* hybrid attention layers (n_attn 0: none of this is allocated) */
    uint32_t n_attn;      /* attention layers */
    uint32_t Hq, Hkv, Da; /* query heads, KV heads, head dim */
    uint32_t QD, KVD;     /* Hq * Da, Hkv * Da */
    bool attn_gate;       /* q_proj carries the output gate (Qwen3.5) */
    uint32_t rope_dim;    /* rotary dims of each head (0: none) */
    double attn_eps;      /* q / k norm epsilon */
    double rope_theta;    /* RoPE base */
    float att_scale;      /* Da^-0.5, or the view's attn_scale */
    double *inv_freq;     /* RoPE inverse frequencies [rope_dim / 2], device */
    be_kv kv;             /* the KV page pool */
    uint32_t *pos_next;   /* next position of each slot in the running step [n_slots], host */
    uint32_t *hkv;        /* pinned pass KV metadata: seg_pos [cap], seg_pg [cap], pages */
    uint32_t *dkv;        /* its device copy [2 cap + pages_total] */
    float *aq, *ak, *av;  /* attention q [cap][QD], k / v [cap][KVD] */
    float *ao;            /* attention output [cap][QD] */
    float *aqg, *ag;      /* attn_gate: q_proj output [cap][2 QD], the gates [cap][QD] */
} be_cuda_gdn;

/* Offsets of a Gated DeltaNet layer's state tensors after its soff (floats). */
static size_t
gdn_off_kconv(const be_cuda_gdn *c)
{
    return (size_t)(c->W - 1) * c->KD;
}

static size_t
gdn_off_vconv(const be_cuda_gdn *c)
{
    return 2 * (size_t)(c->W - 1) * c->KD;
}

static size_t
gdn_off_S(const be_cuda_gdn *c)
{
    return (size_t)(c->W - 1) * (2 * (size_t)c->KD + c->VD);
}

/* ------------------------------------------------------------------------ */
/* a pass                                                                    */
/* ------------------------------------------------------------------------ */

/*
 * A block's output projection w over in (T rows) added into the residual:
 * by the GEMM's epilogue, or with res_mul into xr, then x += xr * res_mul
 * (the CPU's gdn_add_out).
 */
static wk_err
gdn_add_out(be_cuda_gdn *c, const be_cuda_mat *w, const float *in, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    if (c->res_mul == 0.0f)
        return be_cuda_gemm(co, w, in, co->T, c->x, c->C, K_EPI_ADD, d);
    BE_CUDA_TRY(be_cuda_gemm(co, w, in, co->T, c->xr, c->C, K_EPI_STORE, d));
    WK_CUDA_CHECK(k_add_scaled(c->x, c->xr, (size_t)co->T * c->C, c->res_mul, co->stream), d);
    return WK_OK;
}

/* The Gated DeltaNet mixer of layer l over the pass (xn holds attn_norm's output), into x. */
static wk_err
gdn_mixer(be_cuda_gdn *c, const gdn_layer *ly, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    const uint32_t T = co->T, ns = co->n_segs;
    const size_t lay_off = ly->soff;
    const uint32_t *seg_t0 = be_cuda_meta(co, BE_CUDA_M_SEG_T0);
    const uint32_t *seg_n = be_cuda_meta(co, BE_CUDA_M_SEG_N);
    const uint32_t *seg_slot = be_cuda_meta(co, BE_CUDA_M_SEG_SLOT);

    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wq, c->xn, T, c->qr, c->KD, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wk, c->xn, T, c->kr, c->KD, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wv, c->xn, T, c->vr, c->VD, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wa, c->xn, T, c->ar, c->HV, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wb, c->xn, T, c->br, c->HV, K_EPI_STORE, d));
    if (c->use_gate)
        BE_CUDA_TRY(be_cuda_gemm(co, &ly->wg, c->xn, T, c->gr, c->VD, K_EPI_STORE, d));

    /* each (segment, channel) thread reads its history, then writes it back */
    WK_CUDA_CHECK(k_gdn_conv(c->qr, c->KD, c->W, ly->cq, ns, seg_t0, seg_n, seg_slot, c->arena,
                             c->slot_floats, lay_off, c->q, co->stream),
                  d);
    WK_CUDA_CHECK(k_gdn_conv(c->kr, c->KD, c->W, ly->ck, ns, seg_t0, seg_n, seg_slot, c->arena,
                             c->slot_floats, lay_off + gdn_off_kconv(c), c->k, co->stream),
                  d);
    WK_CUDA_CHECK(k_gdn_conv(c->vr, c->VD, c->W, ly->cv, ns, seg_t0, seg_n, seg_slot, c->arena,
                             c->slot_floats, lay_off + gdn_off_vconv(c), c->v, co->stream),
                  d);
    WK_CUDA_CHECK(k_gdn_l2norm(c->q, T, c->H, c->K, c->q_scale, co->stream), d);
    WK_CUDA_CHECK(k_gdn_l2norm(c->k, T, c->H, c->K, 1.0f, co->stream), d);
    WK_CUDA_CHECK(k_gdn_gates(c->ar, c->br, (size_t)T * c->HV, c->HV, ly->neg_A, ly->dt_bias,
                              c->beta_scale, co->stream),
                  d);
    WK_CUDA_CHECK(k_gdn_delta(c->arena, c->slot_floats, lay_off + gdn_off_S(c), ns, seg_t0, seg_n,
                              seg_slot, c->H, c->HV, c->K, c->Vd, c->q, c->k, c->v, c->ar, c->br,
                              c->o, co->stream),
                  d);
    WK_CUDA_CHECK(k_gdn_onorm(c->o, c->use_gate ? c->gr : NULL, T, c->HV, c->Vd, ly->o_norm, c->eps,
                              co->stream),
                  d);
    return gdn_add_out(c, &ly->wo, c->o, d);
}

/*
 * A Mamba2 mixer over the pass (xn holds attn_norm's output), added into
 * x: k_mamba2.cu's kernels over the buffer layout m2p rows
 * z [DI] | xBC [CD] | dt [H2] (also every layer of a pure Mamba2 model).
 */
static wk_err
gdn_mamba2(be_cuda_gdn *c, const gdn_layer *ly, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    const uint32_t T = co->T;
    const uint32_t *seg_t0 = be_cuda_meta(co, BE_CUDA_M_SEG_T0);
    const uint32_t *seg_n = be_cuda_meta(co, BE_CUDA_M_SEG_N);
    const uint32_t *seg_slot = be_cuda_meta(co, BE_CUDA_M_SEG_SLOT);

    BE_CUDA_TRY(be_cuda_gemm(co, &ly->m2_in, c->xn, T, c->m2p, c->DIP, K_EPI_STORE, d));
    WK_CUDA_CHECK(k_mamba2_conv(c->m2p + c->DI, c->DIP, c->CD, c->K2, ly->m2_cw, ly->m2_cb,
                                co->n_segs, seg_t0, seg_n, seg_slot, c->arena, c->slot_floats,
                                ly->soff, c->m2x, co->stream),
                  d);
    WK_CUDA_CHECK(k_mamba2_scan(c->arena, c->slot_floats, ly->soff + c->m2_conv_floats, co->n_segs,
                                seg_t0, seg_n, seg_slot, c->H2, c->P, c->N, c->G2, c->m2x, c->CD,
                                c->m2p + c->DI + c->CD, c->DIP, ly->m2_dtb, ly->m2_A, ly->m2_D,
                                c->m2y, co->stream),
                  d);
    WK_CUDA_CHECK(
        k_mamba2_gate_norm(c->m2y, c->m2p, c->DIP, T, c->DI, c->G2, ly->m2_gn, c->eps, co->stream),
        d);
    return gdn_add_out(c, &ly->m2_out, c->m2y, d);
}

/*
 * An attention layer over the pass (xn holds attn_norm's output), added
 * into x. Every pass token's K / V is stored before any token attends.
 */
static wk_err
gdn_attention(be_cuda_gdn *c, const gdn_layer *ly, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    const uint32_t T = co->T;
    const uint32_t *tseg = be_cuda_meta(co, BE_CUDA_M_TSEG);
    const uint32_t *seg_t0 = be_cuda_meta(co, BE_CUDA_M_SEG_T0);
    const uint32_t *seg_pos = c->dkv, *seg_pg = c->dkv + co->cap, *pages = c->dkv + 2 * co->cap;
    const size_t kv_off = (size_t)ly->idx * 2 * c->KVD;

    if (c->attn_gate) {
        BE_CUDA_TRY(be_cuda_gemm(co, &ly->wq, c->xn, T, c->aqg, 2 * (size_t)c->QD, K_EPI_STORE, d));
        WK_CUDA_CHECK(k_attn_gate_split(c->aqg, T, c->Hq, c->Da, c->aq, c->ag, co->stream), d);
    } else {
        BE_CUDA_TRY(be_cuda_gemm(co, &ly->wq, c->xn, T, c->aq, c->QD, K_EPI_STORE, d));
    }
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wk, c->xn, T, c->ak, c->KVD, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wv, c->xn, T, c->av, c->KVD, K_EPI_STORE, d));
    if (ly->bq != NULL) {
        WK_CUDA_CHECK(k_add_rows(c->aq, ly->bq, T, c->QD, co->stream), d);
        WK_CUDA_CHECK(k_add_rows(c->ak, ly->bk, T, c->KVD, co->stream), d);
        WK_CUDA_CHECK(k_add_rows(c->av, ly->bv, T, c->KVD, co->stream), d);
    }
    if (ly->nq != NULL) {
        /* per head: rows of Da, in place */
        WK_CUDA_CHECK(
            k_rmsnorm_rows(c->aq, NULL, T * c->Hq, c->Da, ly->nq, c->attn_eps, c->aq, co->stream),
            d);
        WK_CUDA_CHECK(
            k_rmsnorm_rows(c->ak, NULL, T * c->Hkv, c->Da, ly->nk, c->attn_eps, c->ak, co->stream),
            d);
    }
    WK_CUDA_CHECK(k_attn_rope_store(c->aq, c->ak, c->av, T, c->Hq, c->Hkv, c->Da, c->rope_dim,
                                    c->inv_freq, tseg, seg_t0, seg_pos, seg_pg, pages, c->kv.pool,
                                    c->kv.page_tokens, c->kv.tok_floats, kv_off, co->stream),
                  d);
    WK_CUDA_CHECK(k_attn(c->aq, T, c->Hq, c->Hkv, c->Da, c->att_scale, tseg, seg_t0, seg_pos,
                         seg_pg, pages, c->kv.pool, c->kv.page_tokens, c->kv.tok_floats, kv_off,
                         c->ao, co->stream),
                  d);
    if (c->attn_gate)
        WK_CUDA_CHECK(k_mul_sigmoid(c->ao, c->ag, (size_t)T * c->QD, co->stream), d);
    return gdn_add_out(c, &ly->wo, c->ao, d);
}

/* The i-th RWKV7 mix buffer [cap][C]. */
static float *
gdn_rw_mixbuf(const be_cuda_gdn *c, int i)
{
    return c->mx + (size_t)i * c->core.cap * c->C;
}

/*
 * An RWKV7 time mix over the pass (xn holds ln1's output), added into x:
 * the token shift (from the slot's time-mix shift at soff, which then
 * gets each segment's last xn row), the r / k / v projections and the
 * LoRAs, the attention prologue (decay, in-context learning rate, the
 * value residual against v_first, which the first RWKV7 layer sets), the
 * WKV recurrence over the slot's state at soff + 2C with the GroupNorm,
 * bonus and gate, then W_o.
 */
static wk_err
gdn_rwkv7_time(be_cuda_gdn *c, const gdn_layer *ly, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    const uint32_t T = co->T, C = c->C;
    const uint32_t *tseg = be_cuda_meta(co, BE_CUDA_M_TSEG);
    const uint32_t *seg_t0 = be_cuda_meta(co, BE_CUDA_M_SEG_T0);
    const uint32_t *seg_n = be_cuda_meta(co, BE_CUDA_M_SEG_N);
    const uint32_t *seg_slot = be_cuda_meta(co, BE_CUDA_M_SEG_SLOT);
    float *mx0 = gdn_rw_mixbuf(c, 0), *mx1 = gdn_rw_mixbuf(c, 1), *mx2 = gdn_rw_mixbuf(c, 2);
    float *mx3 = gdn_rw_mixbuf(c, 3), *mx4 = gdn_rw_mixbuf(c, 4), *mx5 = gdn_rw_mixbuf(c, 5);

    WK_CUDA_CHECK(k_rwkv7_shift_mix(c->xn, T, C, tseg, seg_t0, seg_slot, c->arena, c->slot_floats,
                                    ly->soff, ly->rw_mix, RW_MIX_N, c->mx, co->cap * C, co->stream),
                  d);
    WK_CUDA_CHECK(k_rwkv7_save_shift(c->xn, C, co->n_segs, seg_t0, seg_n, seg_slot, c->arena,
                                     c->slot_floats, ly->soff, co->stream),
                  d);
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wr, gdn_rw_mixbuf(c, RW_MIX_R), T, c->rr, C, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wk, gdn_rw_mixbuf(c, RW_MIX_K), T, c->rk, C, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->wv, gdn_rw_mixbuf(c, RW_MIX_V), T, c->rv, C, K_EPI_STORE, d));
    BE_CUDA_TRY(
        be_cuda_gemm(co, &ly->w1, gdn_rw_mixbuf(c, RW_MIX_W), T, c->lw, c->Dw, K_EPI_TANH, d));
    BE_CUDA_TRY(
        be_cuda_gemm(co, &ly->a1, gdn_rw_mixbuf(c, RW_MIX_A), T, c->la, c->Dal, K_EPI_STORE, d));
    if (!ly->rw_first)
        BE_CUDA_TRY(
            be_cuda_gemm(co, &ly->v1, gdn_rw_mixbuf(c, RW_MIX_V), T, c->lv, c->Dv, K_EPI_STORE, d));
    BE_CUDA_TRY(
        be_cuda_gemm(co, &ly->g1, gdn_rw_mixbuf(c, RW_MIX_G), T, c->lg, c->Dg, K_EPI_SIGMOID, d));
    /* the mixes are consumed: mx0..mx3 now take the LoRA outputs */
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->w2, c->lw, T, mx0, C, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->a2, c->la, T, mx1, C, K_EPI_STORE, d));
    if (!ly->rw_first)
        BE_CUDA_TRY(be_cuda_gemm(co, &ly->v2, c->lv, T, mx2, C, K_EPI_STORE, d));
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->g2, c->lg, T, mx3, C, K_EPI_STORE, d));

    /* mx0 = decay, mx1 = b, mx4 = a, k and v updated (the first layer: vf = v) */
    WK_CUDA_CHECK(k_rwkv7_att(T, C, c->rH, c->rN, ly->rw_first, ly->rw_w0, ly->rw_a0, ly->rw_v0,
                              ly->rw_k_k, ly->rw_k_a, mx0, mx1, mx2, mx4, c->rk, c->rv, c->vf,
                              co->stream),
                  d);
    WK_CUDA_CHECK(k_rwkv7_wkv(c->arena, c->slot_floats, ly->soff + 2 * (size_t)C, co->n_segs,
                              seg_t0, seg_n, seg_slot, c->rH, c->rN, C, c->rr, mx0, c->rk, c->rv,
                              mx4, mx1, mx3, ly->rw_r_k, ly->rw_lnx_w, ly->rw_lnx_b, c->gn_eps, mx5,
                              co->stream),
                  d);
    return gdn_add_out(c, &ly->wo, mx5, d);
}

/*
 * An RWKV7 channel mix over the pass (xn holds ln2's output), added into
 * x: the token shift (the slot's channel-mix shift at soff + C, after
 * the time mix's), relu(W_k mix)^2, W_v.
 */
static wk_err
gdn_rwkv7_channel(be_cuda_gdn *c, const gdn_layer *ly, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    const uint32_t T = co->T, C = c->C;
    const size_t shift_off = ly->soff + C;
    const uint32_t *seg_t0 = be_cuda_meta(co, BE_CUDA_M_SEG_T0);
    const uint32_t *seg_slot = be_cuda_meta(co, BE_CUDA_M_SEG_SLOT);

    WK_CUDA_CHECK(k_rwkv7_shift_mix(c->xn, T, C, be_cuda_meta(co, BE_CUDA_M_TSEG), seg_t0, seg_slot,
                                    c->arena, c->slot_floats, shift_off, ly->rw_ffn_x_k, 1, c->mx,
                                    co->cap * C, co->stream),
                  d);
    WK_CUDA_CHECK(k_rwkv7_save_shift(c->xn, C, co->n_segs, seg_t0,
                                     be_cuda_meta(co, BE_CUDA_M_SEG_N), seg_slot, c->arena,
                                     c->slot_floats, shift_off, co->stream),
                  d);
    BE_CUDA_TRY(be_cuda_gemm(co, &ly->fk, gdn_rw_mixbuf(c, 0), T, c->hg, c->F, K_EPI_RELU2, d));
    return gdn_add_out(c, &ly->fv, c->hg, d);
}

/* ------------------------------------------------------------------------ */
/* mixture of experts: routing on the host (wrk_moe_route, the CPU's code) */
/* ------------------------------------------------------------------------ */

/*
 * A mixture-of-experts MLP over the pass (xn holds mlp_norm's output),
 * added into x. Row tables (n = T k pairs, uploaded as one block of 3 n
 * words): idx [n] the token of gathered row r (expert-major, tokens
 * ascending within an expert: the CPU's counting sort), trow [n] the row
 * of pair (t, j) at t k + j, w [n] the pair's weight at t k + j.
 */
static wk_err
gdn_moe_run(be_cuda_gdn *c, const gdn_moe *mo, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    const uint32_t T = co->T, C = c->C, E = mo->E, k = mo->k, Fe = mo->Fe, Fs = mo->Fs;
    const size_t n = (size_t)T * k;

    /* the router, the shared expert and its gate: every token, on the device */
    BE_CUDA_TRY(be_cuda_gemm(co, &mo->router, c->xn, T, c->rl, E, K_EPI_STORE, d));
    if (Fs > 0) {
        if (mo->relu2) {
            BE_CUDA_TRY(be_cuda_gemm(co, &mo->su, c->xn, T, c->hs, Fs, K_EPI_RELU2, d));
        } else {
            BE_CUDA_TRY(be_cuda_gemm(co, &mo->sg, c->xn, T, c->hs, Fs, K_EPI_STORE, d));
            BE_CUDA_TRY(be_cuda_gemm(co, &mo->su, c->xn, T, c->hsu, Fs, K_EPI_STORE, d));
            WK_CUDA_CHECK(k_swiglu(c->hs, c->hsu, (size_t)T * Fs, co->stream), d);
        }
        if (mo->sh_gated)
            BE_CUDA_TRY(be_cuda_gemm(co, &mo->sr, c->xn, T, c->sgv, 1, K_EPI_SIGMOID, d));
        BE_CUDA_TRY(be_cuda_gemm(co, &mo->sd, c->hs, T, c->os, C, K_EPI_STORE, d));
    }

    /*
     * The router logits to the host (the wait also covers the previous
     * upload from hmoe: the host may overwrite it now).
     */
    WK_CUDA_CHECK(
        cudaMemcpyAsync(c->hrl, c->rl, sizeof(float) * T * E, cudaMemcpyDeviceToHost, co->stream),
        d);
    WK_CUDA_CHECK(cudaStreamSynchronize(co->stream), d);
    for (uint32_t t = 0; t < T; t++)
        wrk_moe_route(&mo->rt, c->hrl + (size_t)t * E, c->cs, c->sel + (size_t)t * k,
                      c->sw + (size_t)t * k);

    /* the rows of each expert, expert-major, tokens ascending: a counting sort */
    uint32_t *cnt = c->ecnt, *idx = c->hmoe, *trow = c->hmoe + n;
    float *w = (float *)(c->hmoe + 2 * n);
    memset(cnt, 0, sizeof(uint32_t) * (E + 1));
    for (size_t i = 0; i < n; i++)
        cnt[c->sel[i] + 1]++;
    for (uint32_t e = 0; e < E; e++)
        cnt[e + 1] += cnt[e];
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t j = 0; j < k; j++) {
            const size_t tj = (size_t)t * k + j;
            const uint32_t r = cnt[c->sel[tj]]++;
            trow[tj] = r;
            idx[r] = t;
            w[tj] = c->sw[tj];
        }
    /* cnt[e] is now the end of expert e's rows, its start cnt[e - 1] (0 for e = 0) */
    WK_CUDA_CHECK(cudaMemcpyAsync(c->dmoe, c->hmoe, sizeof(uint32_t) * 3 * n,
                                  cudaMemcpyHostToDevice, co->stream),
                  d);
    const uint32_t *didx = c->dmoe, *dtrow = c->dmoe + n;
    const float *dw = (const float *)(c->dmoe + 2 * n);
    WK_CUDA_CHECK(k_gather_rows(c->xn, didx, (uint32_t)n, C, c->xe, co->stream), d);
    for (uint32_t e = 0; e < E; e++) {
        const uint32_t r0 = e ? cnt[e - 1] : 0, m = cnt[e] - r0;
        if (m == 0)
            continue;
        const float *xe = c->xe + (size_t)r0 * C;
        if (mo->relu2) {
            BE_CUDA_TRY(
                be_cuda_gemm(co, &mo->up[e], xe, m, c->he + (size_t)r0 * Fe, Fe, K_EPI_RELU2, d));
            continue;
        }
        BE_CUDA_TRY(
            be_cuda_gemm(co, &mo->gate[e], xe, m, c->he + (size_t)r0 * Fe, Fe, K_EPI_STORE, d));
        BE_CUDA_TRY(
            be_cuda_gemm(co, &mo->up[e], xe, m, c->hue + (size_t)r0 * Fe, Fe, K_EPI_STORE, d));
    }
    if (!mo->relu2)
        WK_CUDA_CHECK(k_swiglu(c->he, c->hue, n * Fe, co->stream), d);
    for (uint32_t e = 0; e < E; e++) {
        const uint32_t r0 = e ? cnt[e - 1] : 0, m = cnt[e] - r0;
        if (m == 0)
            continue;
        BE_CUDA_TRY(be_cuda_gemm(co, &mo->down[e], c->he + (size_t)r0 * Fe, m,
                                 c->oe + (size_t)r0 * C, C, K_EPI_STORE, d));
    }
    WK_CUDA_CHECK(k_moe_combine(c->x, c->oe, dtrow, dw, k, Fs > 0 ? c->os : NULL,
                                Fs > 0 && mo->sh_gated ? c->sgv : NULL, T, C, c->res_mul,
                                co->stream),
                  d);
    return WK_OK;
}

/*
 * The pass's KV metadata (hybrid models): per segment its first position
 * (the slot's running position, advanced here: passes run in order) and
 * its slot's pages up to its last token, uploaded on the step's stream.
 * The pinned buffer is free: the previous pass has completed.
 */
static wk_err
gdn_kv_meta(be_cuda_gdn *c, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    const size_t cap = co->cap;
    const uint32_t *seg_n = co->hmeta + BE_CUDA_M_SEG_N * cap;
    const uint32_t *seg_slot = co->hmeta + BE_CUDA_M_SEG_SLOT * cap;
    uint32_t *seg_pos = c->hkv, *seg_pg = c->hkv + cap, *pages = c->hkv + 2 * cap;
    size_t np = 0;
    for (uint32_t s = 0; s < co->n_segs; s++) {
        const uint32_t slot = seg_slot[s];
        const be_kv_slot *ks = &c->kv.slots[slot];
        const uint32_t pos = c->pos_next[slot], end = pos + seg_n[s];
        const uint32_t need = be_kv_pages_for(&c->kv, end);
        if (end > ks->n_ctx || np + need > c->kv.pages_total)
            return wk_diag_set(d, WK_ESTATE,
                               "cuda backend: segment %u: slot %u tokens %u..%u past its %u KV "
                               "tokens",
                               s, slot, pos, end, ks->n_ctx);
        seg_pos[s] = pos;
        seg_pg[s] = (uint32_t)np;
        memcpy(pages + np, ks->pages, sizeof(uint32_t) * need);
        np += need;
        c->pos_next[slot] = end;
    }
    WK_CUDA_CHECK(cudaMemcpyAsync(c->dkv, c->hkv, sizeof(uint32_t) * (2 * cap + np),
                                  cudaMemcpyHostToDevice, co->stream),
                  d);
    return WK_OK;
}

/* xn = a block's pre-norm of x: RMSNorm (w), or LayerNorm (w, b) on layer_norm models. */
static wk_err
gdn_prenorm(be_cuda_gdn *c, const float *w, const float *b, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    if (c->layer_norm)
        WK_CUDA_CHECK(
            k_layernorm_rows(c->x, NULL, co->T, c->C, w, b, (float)c->eps, c->xn, co->stream), d);
    else
        WK_CUDA_CHECK(k_rmsnorm_rows(c->x, NULL, co->T, c->C, w, c->eps, c->xn, co->stream), d);
    return WK_OK;
}

static wk_err
gdn_layer_run(be_cuda_gdn *c, uint32_t l, wk_diag *d)
{
    be_cuda_core *co = &c->core;
    const gdn_layer *ly = &c->layers[l];
    const uint32_t T = co->T;
    if (ly->mixer != WRK_MIXER_NONE)
        BE_CUDA_TRY(gdn_prenorm(c, ly->attn_norm, ly->attn_norm_b, d));
    switch (ly->mixer) {
    case WRK_MIXER_GDN:
        BE_CUDA_TRY(gdn_mixer(c, ly, d));
        break;
    case WRK_MIXER_ATTN:
        BE_CUDA_TRY(gdn_attention(c, ly, d));
        break;
    case WRK_MIXER_MAMBA2:
        BE_CUDA_TRY(gdn_mamba2(c, ly, d));
        break;
    case WRK_MIXER_RWKV7:
        BE_CUDA_TRY(gdn_rwkv7_time(c, ly, d));
        break;
    case WRK_MIXER_NONE:
        break;
    }
    if (ly->mlp == WRK_MLP_NONE)
        return WK_OK;
    BE_CUDA_TRY(gdn_prenorm(c, ly->mlp_norm, ly->mlp_norm_b, d));
    if (ly->mlp == WRK_MLP_RWKV7)
        return gdn_rwkv7_channel(c, ly, d);
    if (ly->mlp == WRK_MLP_MOE)
        return gdn_moe_run(c, ly->moe, d);
    if (ly->mlp == WRK_MLP_RELU2) {
        BE_CUDA_TRY(be_cuda_gemm(co, &ly->up, c->xn, T, c->hg, c->F, K_EPI_RELU2, d));
    } else {
        BE_CUDA_TRY(be_cuda_gemm(co, &ly->gate, c->xn, T, c->hg, c->F, K_EPI_STORE, d));
        BE_CUDA_TRY(be_cuda_gemm(co, &ly->up, c->xn, T, c->hu, c->F, K_EPI_STORE, d));
        WK_CUDA_CHECK(k_swiglu(c->hg, c->hu, (size_t)T * c->F, co->stream), d);
    }
    return gdn_add_out(c, &ly->down, c->hg, d);
}

/* The final norm of the logits rows lpos[0..n-1] into out (be_cuda_norm_fn). */
static wk_err
gdn_norm_final(void *arg, const uint32_t *lpos, uint32_t n, float *out, wk_diag *d)
{
    be_cuda_gdn *c = arg;
    if (c->layer_norm)
        WK_CUDA_CHECK(k_layernorm_rows(c->x, lpos, n, c->C, c->norm, c->norm_b, (float)c->eps, out,
                                       c->core.stream),
                      d);
    else
        WK_CUDA_CHECK(k_rmsnorm_rows(c->x, lpos, n, c->C, c->norm, c->eps, out, c->core.stream), d);
    return WK_OK;
}

static wk_err
gdn_pass(void *arg, wk_diag *d)
{
    be_cuda_gdn *c = arg;
    be_cuda_core *co = &c->core;
    if (c->emb_norm != NULL) /* RWKV-7's ln0 on the embedding row */
        WK_CUDA_CHECK(k_rwkv7_embed(c->emb.w, c->emb.dtype, be_cuda_meta(co, BE_CUDA_M_TOK), co->T,
                                    c->C, c->emb_norm, c->emb_norm_b, (float)c->eps, c->x,
                                    co->stream),
                      d);
    else
        WK_CUDA_CHECK(k_embed_rows(c->emb.w, c->emb.dtype, be_cuda_meta(co, BE_CUDA_M_TOK), co->T,
                                   c->C, c->x, co->stream),
                      d);
    if (c->emb_mul != 0.0f)
        WK_CUDA_CHECK(k_scale(c->x, (size_t)co->T * c->C, c->emb_mul, 0, co->stream), d);
    if (c->n_attn > 0)
        BE_CUDA_TRY(gdn_kv_meta(c, d));
    for (uint32_t l = 0; l < c->L; l++)
        BE_CUDA_TRY(gdn_layer_run(c, l, d));
    if (co->n_logits > 0)
        BE_CUDA_TRY(be_cuda_core_logits(co, &c->head, c->xo, gdn_norm_final, c, d));
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* create / destroy                                                          */
/* ------------------------------------------------------------------------ */

static void
gdn_destroy(void *impl)
{
    be_cuda_gdn *c = impl;
    if (c == NULL)
        return;
    be_cuda_core_fini(&c->core); /* waits for the stream first */
    void *dev[] = {c->vecs, c->x,   c->xn,  c->xr,  c->qr,  c->kr,       c->vr, c->q,
                   c->k,    c->v,   c->ar,  c->br,  c->gr,  c->o,        c->hg, c->hu,
                   c->xo,   c->m2p, c->m2x, c->m2y, c->rl,  c->xe,       c->he, c->hue,
                   c->oe,   c->hs,  c->hsu, c->os,  c->sgv, c->dmoe,     c->aq, c->ak,
                   c->av,   c->ao,  c->aqg, c->ag,  c->dkv, c->inv_freq, c->mx, c->rr,
                   c->rk,   c->rv,  c->vf,  c->lw,  c->la,  c->lv,       c->lg};
    be_cuda_free_all(dev, sizeof(dev) / sizeof(dev[0]));
    if (c->hkv != NULL)
        (void)cudaFreeHost(c->hkv);
    if (c->hmoe != NULL)
        (void)cudaFreeHost(c->hmoe);
    if (c->hrl != NULL)
        (void)cudaFreeHost(c->hrl);
    be_cuda_kv_fini(&c->kv);
    for (uint32_t l = 0; c->layers != NULL && l < c->L; l++) {
        gdn_moe *mo = c->layers[l].moe;
        if (mo == NULL)
            continue;
        wrk_moe_route_close(&mo->rt);
        free(mo->gate);
        free(mo->up);
        free(mo->down);
        free(mo);
    }
    free(c->sel);
    free(c->sw);
    free(c->cs);
    free(c->ecnt);
    free(c->pos_next);
    free(c->layers);
    free(c);
}

/* n values of t as fp32 at h + *off; records the offset in *field, advances *off. */
static wk_err
gdn_vec(const wk_tensor *t, size_t n, float *h, size_t *off, size_t *field, wk_diag *d)
{
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: a gdn vector tensor is missing");
    if (wk_tensor_read_f32(t, 0, n, h + *off) != WK_OK)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: cannot read %s as %zu values", t->name, n);
    *field = *off;
    *off += n;
    return WK_OK;
}

/* w[i] = off + w[i] for n floats (the (1 + weight) convention; the CPU's gdn_offset). */
static void
gdn_offset(float *w, size_t n, float off)
{
    if (off == 0.0f)
        return;
    for (size_t i = 0; i < n; i++)
        w[i] = off + w[i];
}

/* Device pointer of a vector recorded at offset o (SIZE_MAX: absent). */
static const float *
gdn_vec_at(const be_cuda_gdn *c, size_t o)
{
    return o == SIZE_MAX ? NULL : c->vecs + o;
}

/*
 * Every fp32 vector into one device block: the final norm, then per layer
 * the pre-norms of the parts it has and its mixer's vectors (the CPU's
 * gdn_load_vectors: (1 + weight) folded into every norm but o_norm and
 * the Mamba2 gated norm; -exp(A_log); a missing Mamba2 conv bias as zeros).
 */
static wk_err
gdn_upload_vecs(be_cuda_gdn *c, const wrk_gdn *g, wk_diag *d)
{
    const size_t C = c->C, HV = c->HV, KD = c->KD, VD = c->VD, W = c->W;
    /* an upper bound per layer: every kind's vectors */
    const size_t per_layer = 2 * C + c->Vd + 2 * HV + W * (2 * KD + VD) + c->QD +
                             2 * (size_t)c->KVD + 2 * c->Da + (size_t)c->CD * (c->K2 + 1) +
                             3 * (size_t)c->H2 + c->DI + (c->n_rw ? 18 * C : 2 * C);
    const size_t total = GG_N * C + per_layer * c->L;
    float *h = calloc(total ? total : 1, sizeof(float));
    size_t *offs = malloc((GG_N + GV_N * (size_t)c->L) * sizeof(size_t));
    if (h == NULL || offs == NULL) {
        free(h);
        free(offs);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < GG_N + GV_N * (size_t)c->L; i++)
        offs[i] = SIZE_MAX;
    size_t off = 0;
    wk_err e = gdn_vec(g->norm, C, h, &off, &offs[GG_NORM], d);
    if (e == WK_OK)
        gdn_offset(h + offs[GG_NORM], C, g->norm_offset);
    if (e == WK_OK && c->layer_norm)
        e = gdn_vec(g->norm_b, C, h, &off, &offs[GG_NORM_B], d);
    if (e == WK_OK && g->emb_norm != NULL)
        e = gdn_vec(g->emb_norm, C, h, &off, &offs[GG_EMB_NORM], d);
    if (e == WK_OK && g->emb_norm != NULL)
        e = gdn_vec(g->emb_norm_b, C, h, &off, &offs[GG_EMB_NORM_B], d);
    for (uint32_t l = 0; l < c->L && e == WK_OK; l++) {
        const wrk_gdn_layer *s = &g->layers[l];
        size_t *o = offs + GG_N + GV_N * (size_t)l;
        const bool dn = s->mixer == WRK_MIXER_GDN, at = s->mixer == WRK_MIXER_ATTN,
                   m2 = s->mixer == WRK_MIXER_MAMBA2, bias = at && g->qkv_bias,
                   qkn = at && g->qk_norm, rw = s->mixer == WRK_MIXER_RWKV7,
                   rwc = s->mlp == WRK_MLP_RWKV7, ln = c->layer_norm;
        const wrk_rwkv7_layer *r = s->rw;
        /* the first RWKV7 layer keeps v_first = v: its v0 (if any) is unused */
        const bool v0 = rw && !c->layers[l].rw_first;
        /* n 0: the layer has no such vector */
        const struct {
            const wk_tensor *t;
            size_t n;
        } vs[GV_N] = {[GV_ATTN_NORM] = {s->attn_norm, s->mixer != WRK_MIXER_NONE ? C : 0},
                      [GV_MLP_NORM] = {s->mlp_norm, s->mlp != WRK_MLP_NONE ? C : 0},
                      [GV_O_NORM] = {s->o_norm, dn ? c->Vd : 0},
                      [GV_NEG_A] = {s->A_log, dn ? HV : 0},
                      [GV_DT_BIAS] = {s->dt_bias, dn ? HV : 0},
                      [GV_CQ] = {s->q_conv, dn ? KD * W : 0},
                      [GV_CK] = {s->k_conv, dn ? KD * W : 0},
                      [GV_CV] = {s->v_conv, dn ? VD * W : 0},
                      [GV_BQ] = {s->q_bias, bias ? c->QD : 0},
                      [GV_BK] = {s->k_bias, bias ? c->KVD : 0},
                      [GV_BV] = {s->v_bias, bias ? c->KVD : 0},
                      [GV_NQ] = {s->q_norm, qkn ? c->Da : 0},
                      [GV_NK] = {s->k_norm, qkn ? c->Da : 0},
                      [GV_M2_CW] = {s->m2.conv_w, m2 ? (size_t)c->CD * c->K2 : 0},
                      [GV_M2_CB] = {s->m2.conv_b, m2 && s->m2.conv_b != NULL ? c->CD : 0},
                      [GV_M2_DTB] = {s->m2.dt_bias, m2 ? c->H2 : 0},
                      [GV_M2_A] = {s->m2.A_log, m2 ? c->H2 : 0},
                      [GV_M2_D] = {s->m2.D, m2 ? c->H2 : 0},
                      [GV_M2_GN] = {s->m2.gnorm, m2 ? c->DI : 0},
                      [GV_ATTN_NORM_B] = {s->attn_norm_b, ln && s->mixer != WRK_MIXER_NONE ? C : 0},
                      [GV_MLP_NORM_B] = {s->mlp_norm_b, ln && s->mlp != WRK_MLP_NONE ? C : 0},
                      [GV_RW_MIX + RW_MIX_R] = {rw ? r->x_r : NULL, rw ? C : 0},
                      [GV_RW_MIX + RW_MIX_W] = {rw ? r->x_w : NULL, rw ? C : 0},
                      [GV_RW_MIX + RW_MIX_K] = {rw ? r->x_k : NULL, rw ? C : 0},
                      [GV_RW_MIX + RW_MIX_V] = {rw ? r->x_v : NULL, rw ? C : 0},
                      [GV_RW_MIX + RW_MIX_A] = {rw ? r->x_a : NULL, rw ? C : 0},
                      [GV_RW_MIX + RW_MIX_G] = {rw ? r->x_g : NULL, rw ? C : 0},
                      [GV_RW_W0] = {rw ? r->w0 : NULL, rw ? C : 0},
                      [GV_RW_A0] = {rw ? r->a0 : NULL, rw ? C : 0},
                      [GV_RW_V0] = {v0 ? r->v0 : NULL, v0 ? C : 0},
                      [GV_RW_K_K] = {rw ? r->k_k : NULL, rw ? C : 0},
                      [GV_RW_K_A] = {rw ? r->k_a : NULL, rw ? C : 0},
                      [GV_RW_R_K] = {rw ? r->r_k : NULL, rw ? C : 0},
                      [GV_RW_LNX_W] = {rw ? r->lnx_w : NULL, rw ? C : 0},
                      [GV_RW_LNX_B] = {rw ? r->lnx_b : NULL, rw ? C : 0},
                      [GV_RW_FFN_X_K] = {rwc ? r->ffn_x_k : NULL, rwc ? C : 0}};
        for (int i = 0; i < GV_N && e == WK_OK; i++)
            if (vs[i].n > 0)
                e = gdn_vec(vs[i].t, vs[i].n, h, &off, &o[i], d);
        if (e != WK_OK)
            break;
        if (m2 && s->m2.conv_b == NULL) { /* zeros (h is calloc'ed) */
            o[GV_M2_CB] = off;
            off += c->CD;
        }
        const int normed[] = {GV_ATTN_NORM, GV_MLP_NORM, GV_NQ, GV_NK};
        for (size_t i = 0; i < sizeof(normed) / sizeof(normed[0]); i++)
            if (o[normed[i]] != SIZE_MAX)
                gdn_offset(h + o[normed[i]], vs[normed[i]].n, g->norm_offset);
        const int neg[] = {GV_NEG_A, GV_M2_A};
        for (size_t i = 0; i < sizeof(neg) / sizeof(neg[0]); i++)
            for (size_t j = 0; o[neg[i]] != SIZE_MAX && j < vs[neg[i]].n; j++)
                h[o[neg[i]] + j] = -expf(h[o[neg[i]] + j]);
    }
    if (e == WK_OK)
        e = be_cuda_upload_f32(h, off, &c->vecs, "vectors", d);
    if (e == WK_OK) {
        c->norm = gdn_vec_at(c, offs[GG_NORM]);
        c->norm_b = gdn_vec_at(c, offs[GG_NORM_B]);
        c->emb_norm = gdn_vec_at(c, offs[GG_EMB_NORM]);
        c->emb_norm_b = gdn_vec_at(c, offs[GG_EMB_NORM_B]);
        for (uint32_t l = 0; l < c->L; l++) {
            const size_t *o = offs + GG_N + GV_N * (size_t)l;
            gdn_layer *ly = &c->layers[l];
            ly->attn_norm = gdn_vec_at(c, o[GV_ATTN_NORM]);
            ly->mlp_norm = gdn_vec_at(c, o[GV_MLP_NORM]);
            ly->o_norm = gdn_vec_at(c, o[GV_O_NORM]);
            ly->neg_A = gdn_vec_at(c, o[GV_NEG_A]);
            ly->dt_bias = gdn_vec_at(c, o[GV_DT_BIAS]);
            ly->cq = gdn_vec_at(c, o[GV_CQ]);
            ly->ck = gdn_vec_at(c, o[GV_CK]);
            ly->cv = gdn_vec_at(c, o[GV_CV]);
            ly->bq = gdn_vec_at(c, o[GV_BQ]);
            ly->bk = gdn_vec_at(c, o[GV_BK]);
            ly->bv = gdn_vec_at(c, o[GV_BV]);
            ly->nq = gdn_vec_at(c, o[GV_NQ]);
            ly->nk = gdn_vec_at(c, o[GV_NK]);
            ly->m2_cw = gdn_vec_at(c, o[GV_M2_CW]);
            ly->m2_cb = gdn_vec_at(c, o[GV_M2_CB]);
            ly->m2_dtb = gdn_vec_at(c, o[GV_M2_DTB]);
            ly->m2_A = gdn_vec_at(c, o[GV_M2_A]);
            ly->m2_D = gdn_vec_at(c, o[GV_M2_D]);
            ly->m2_gn = gdn_vec_at(c, o[GV_M2_GN]);
            ly->attn_norm_b = gdn_vec_at(c, o[GV_ATTN_NORM_B]);
            ly->mlp_norm_b = gdn_vec_at(c, o[GV_MLP_NORM_B]);
            ly->rw_mix = gdn_vec_at(c, o[GV_RW_MIX]); /* the six follow it */
            ly->rw_w0 = gdn_vec_at(c, o[GV_RW_W0]);
            ly->rw_a0 = gdn_vec_at(c, o[GV_RW_A0]);
            ly->rw_v0 = gdn_vec_at(c, o[GV_RW_V0]);
            ly->rw_k_k = gdn_vec_at(c, o[GV_RW_K_K]);
            ly->rw_k_a = gdn_vec_at(c, o[GV_RW_K_A]);
            ly->rw_r_k = gdn_vec_at(c, o[GV_RW_R_K]);
            ly->rw_lnx_w = gdn_vec_at(c, o[GV_RW_LNX_W]);
            ly->rw_lnx_b = gdn_vec_at(c, o[GV_RW_LNX_B]);
            ly->rw_ffn_x_k = gdn_vec_at(c, o[GV_RW_FFN_X_K]);
        }
    }
    free(h);
    free(offs);
    return e;
}

/* The matrices to upload, each with the (k, n) it must have. */
typedef struct gdn_mats {
    const wrk_mat **src;
    be_cuda_mat **dst;
    size_t n, cap;
} gdn_mats;

/* Queues s -> dst, checking it is present and k -> n; `what` and l name it in the error. */
static wk_err
gdn_want(gdn_mats *ms, const wrk_mat *s, be_cuda_mat *dst, uint32_t k, uint32_t n, uint32_t l,
         const char *what, wk_diag *d)
{
    if (s->t == NULL || s->n_in != k || s->n_out != n)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: gdn layer %u: %s missing or not %u -> %u",
                           l, what, k, n);
    if (ms->n == ms->cap)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: gdn matrix list overflow");
    ms->src[ms->n] = s;
    ms->dst[ms->n++] = dst;
    return WK_OK;
}

/* Layer l's matrices by its kinds (wrk_gdn.h), with the shapes the pass uses. */
static wk_err
gdn_want_layer(be_cuda_gdn *c, gdn_mats *ms, const wrk_gdn_layer *s, gdn_layer *ly, uint32_t l,
               wk_diag *d)
{
    const uint32_t C = c->C;
    switch (s->mixer) {
    case WRK_MIXER_GDN:
        BE_CUDA_TRY(gdn_want(ms, &s->q_proj, &ly->wq, C, c->KD, l, "q_proj", d));
        BE_CUDA_TRY(gdn_want(ms, &s->k_proj, &ly->wk, C, c->KD, l, "k_proj", d));
        BE_CUDA_TRY(gdn_want(ms, &s->v_proj, &ly->wv, C, c->VD, l, "v_proj", d));
        BE_CUDA_TRY(gdn_want(ms, &s->a_proj, &ly->wa, C, c->HV, l, "a_proj", d));
        BE_CUDA_TRY(gdn_want(ms, &s->b_proj, &ly->wb, C, c->HV, l, "b_proj", d));
        if (c->use_gate)
            BE_CUDA_TRY(gdn_want(ms, &s->g_proj, &ly->wg, C, c->VD, l, "g_proj", d));
        BE_CUDA_TRY(gdn_want(ms, &s->o_proj, &ly->wo, c->VD, C, l, "o_proj", d));
        break;
    case WRK_MIXER_ATTN:
        BE_CUDA_TRY(gdn_want(ms, &s->q_proj, &ly->wq, C, c->attn_gate ? 2 * c->QD : c->QD, l,
                             "attention q_proj", d));
        BE_CUDA_TRY(gdn_want(ms, &s->k_proj, &ly->wk, C, c->KVD, l, "attention k_proj", d));
        BE_CUDA_TRY(gdn_want(ms, &s->v_proj, &ly->wv, C, c->KVD, l, "attention v_proj", d));
        BE_CUDA_TRY(gdn_want(ms, &s->o_proj, &ly->wo, c->QD, C, l, "attention o_proj", d));
        break;
    case WRK_MIXER_MAMBA2:
        BE_CUDA_TRY(gdn_want(ms, &s->m2.in_proj, &ly->m2_in, C, c->DIP, l, "mamba2 in_proj", d));
        BE_CUDA_TRY(gdn_want(ms, &s->m2.out_proj, &ly->m2_out, c->DI, C, l, "mamba2 out_proj", d));
        break;
    case WRK_MIXER_RWKV7: {
        const wrk_rwkv7_layer *r = s->rw;
        BE_CUDA_TRY(gdn_want(ms, &r->wr, &ly->wr, C, C, l, "rwkv7 receptance", d));
        BE_CUDA_TRY(gdn_want(ms, &r->wk, &ly->wk, C, C, l, "rwkv7 key", d));
        BE_CUDA_TRY(gdn_want(ms, &r->wv, &ly->wv, C, C, l, "rwkv7 value", d));
        BE_CUDA_TRY(gdn_want(ms, &r->wo, &ly->wo, C, C, l, "rwkv7 output", d));
        BE_CUDA_TRY(gdn_want(ms, &r->w1, &ly->w1, C, c->Dw, l, "rwkv7 decay lora w1", d));
        BE_CUDA_TRY(gdn_want(ms, &r->w2, &ly->w2, c->Dw, C, l, "rwkv7 decay lora w2", d));
        BE_CUDA_TRY(gdn_want(ms, &r->a1, &ly->a1, C, c->Dal, l, "rwkv7 iclr lora a1", d));
        BE_CUDA_TRY(gdn_want(ms, &r->a2, &ly->a2, c->Dal, C, l, "rwkv7 iclr lora a2", d));
        if (!ly->rw_first) { /* the first keeps v_first = v: its value LoRA (if any) is unused */
            BE_CUDA_TRY(gdn_want(ms, &r->v1, &ly->v1, C, c->Dv, l, "rwkv7 value lora v1", d));
            BE_CUDA_TRY(gdn_want(ms, &r->v2, &ly->v2, c->Dv, C, l, "rwkv7 value lora v2", d));
        }
        BE_CUDA_TRY(gdn_want(ms, &r->g1, &ly->g1, C, c->Dg, l, "rwkv7 gate lora g1", d));
        BE_CUDA_TRY(gdn_want(ms, &r->g2, &ly->g2, c->Dg, C, l, "rwkv7 gate lora g2", d));
        break;
    }
    case WRK_MIXER_NONE:
        break;
    }
    if (s->mlp == WRK_MLP_RWKV7) {
        BE_CUDA_TRY(gdn_want(ms, &s->rw->ffn_key, &ly->fk, C, c->F, l, "rwkv7 ffn key", d));
        BE_CUDA_TRY(gdn_want(ms, &s->rw->ffn_value, &ly->fv, c->F, C, l, "rwkv7 ffn value", d));
    }
    if (s->mlp == WRK_MLP_SWIGLU)
        BE_CUDA_TRY(gdn_want(ms, &s->gate_proj, &ly->gate, C, c->F, l, "gate_proj", d));
    if (s->mlp == WRK_MLP_SWIGLU || s->mlp == WRK_MLP_RELU2) {
        BE_CUDA_TRY(gdn_want(ms, &s->up_proj, &ly->up, C, c->F, l, "up_proj", d));
        BE_CUDA_TRY(gdn_want(ms, &s->down_proj, &ly->down, c->F, C, l, "down_proj", d));
    }
    const wrk_moe *wm = s->moe;
    gdn_moe *mo = ly->moe;
    if (s->mlp != WRK_MLP_MOE)
        return WK_OK;
    BE_CUDA_TRY(gdn_want(ms, &wm->router, &mo->router, C, mo->E, l, "expert router", d));
    for (uint32_t e = 0; e < mo->E; e++) {
        if (!mo->relu2)
            BE_CUDA_TRY(gdn_want(ms, &wm->gate[e], &mo->gate[e], C, mo->Fe, l, "expert gate", d));
        BE_CUDA_TRY(gdn_want(ms, &wm->up[e], &mo->up[e], C, mo->Fe, l, "expert up", d));
        BE_CUDA_TRY(gdn_want(ms, &wm->down[e], &mo->down[e], mo->Fe, C, l, "expert down", d));
    }
    if (mo->Fs > 0) {
        if (!mo->relu2)
            BE_CUDA_TRY(gdn_want(ms, &wm->sh_gate, &mo->sg, C, mo->Fs, l, "shared gate", d));
        BE_CUDA_TRY(gdn_want(ms, &wm->sh_up, &mo->su, C, mo->Fs, l, "shared up", d));
        BE_CUDA_TRY(gdn_want(ms, &wm->sh_down, &mo->sd, mo->Fs, C, l, "shared down", d));
        if (mo->sh_gated)
            BE_CUDA_TRY(gdn_want(ms, &wm->sh_router, &mo->sr, C, 1, l, "shared gate router", d));
    }
    return WK_OK;
}

static wk_err
gdn_upload_mats(be_cuda_gdn *c, const wrk_gdn *g, wk_diag *d)
{
    size_t max = (size_t)c->L * 14 + 2;
    for (uint32_t l = 0; l < c->L; l++)
        if (g->layers[l].moe != NULL)
            max += 3 * (size_t)g->layers[l].moe->n_experts + 5;
    gdn_mats ms = {.src = calloc(max, sizeof(*ms.src)),
                   .dst = calloc(max, sizeof(*ms.dst)),
                   .n = 0,
                   .cap = max};
    if (ms.src == NULL || ms.dst == NULL) {
        free(ms.src);
        free(ms.dst);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    const wrk_mat emb = {g->emb, c->C, c->V, false}; /* [V][C]: an nn.Linear C -> V */
    wk_err e =
        g->emb != NULL ? WK_OK : wk_diag_set(d, WK_EINVAL, "cuda backend: gdn embedding missing");
    ms.src[ms.n] = &emb;
    ms.dst[ms.n++] = &c->emb;
    for (uint32_t l = 0; l < c->L && e == WK_OK; l++)
        e = gdn_want_layer(c, &ms, &g->layers[l], &c->layers[l], l, d);
    if (e == WK_OK && !c->tied) {
        if (g->head.t == NULL || g->head.n_in != c->C || g->head.n_out != c->V)
            e = wk_diag_set(d, WK_EINVAL, "cuda backend: gdn head missing or not %u -> %u", c->C,
                            c->V);
        ms.src[ms.n] = &g->head;
        ms.dst[ms.n++] = &c->head;
    }
    if (e == WK_OK)
        e = be_cuda_core_upload(&c->core, ms.src, ms.dst, ms.n, d);
    if (e == WK_OK && c->tied)
        c->head = c->emb;
    free(ms.src);
    free(ms.dst);
    return e;
}

/*
 * The mixture-of-experts layers' host holders (routing parameters, the
 * score bias, the expert matrix arrays filled by gdn_upload_mats), checked
 * as the CPU checks them; the largest E, k, Fe, Fs.
 */
static wk_err
gdn_open_moe(be_cuda_gdn *c, const wrk_gdn *g, wk_diag *d)
{
    for (uint32_t l = 0; l < c->L; l++) {
        const wrk_moe *wm = g->layers[l].moe;
        if (g->layers[l].mlp != WRK_MLP_MOE)
            continue;
        if (wm == NULL || wm->n_experts == 0 || wm->top_k == 0 || wm->top_k > wm->n_experts ||
            wm->ffn == 0)
            return wk_diag_set(d, WK_EINVAL, "cuda backend: layer %u: bad experts", l);
        gdn_moe *mo = calloc(1, sizeof(*mo));
        if (mo == NULL)
            return wk_diag_set(d, WK_ENOMEM, "out of memory");
        c->layers[l].moe = mo;
        wk_err e = wrk_moe_route_open(&mo->rt, wm, "cuda backend", l, d);
        if (e != WK_OK)
            return e;
        mo->E = mo->rt.E;
        mo->k = mo->rt.k;
        mo->Fe = wm->ffn;
        mo->Fs = wm->shared_ffn;
        mo->relu2 = wm->act == WRK_MLP_RELU2;
        mo->sh_gated = wm->sh_router.t != NULL;
        mo->gate = calloc(mo->E, sizeof(*mo->gate));
        mo->up = calloc(mo->E, sizeof(*mo->up));
        mo->down = calloc(mo->E, sizeof(*mo->down));
        if (mo->gate == NULL || mo->up == NULL || mo->down == NULL)
            return wk_diag_set(d, WK_ENOMEM, "out of memory");
        c->moe_E = mo->E > c->moe_E ? mo->E : c->moe_E;
        c->moe_k = mo->k > c->moe_k ? mo->k : c->moe_k;
        c->moe_Fe = mo->Fe > c->moe_Fe ? mo->Fe : c->moe_Fe;
        c->moe_Fs = mo->Fs > c->moe_Fs ? mo->Fs : c->moe_Fs;
    }
    return WK_OK;
}

static wk_err
gdn_alloc_scratch(be_cuda_gdn *c, wk_diag *d)
{
    const size_t cap = c->core.cap, lcap = c->core.lcap;
    uint32_t max_k = c->C, max_n = c->C;
    const uint32_t ks[] = {c->VD,     c->F,  c->QD,  c->DI, c->moe_Fe,
                           c->moe_Fs, c->Dw, c->Dal, c->Dv, c->Dg};
    const uint32_t ns[] = {c->KD,  c->VD,  c->HV,    c->F,      c->attn_gate ? 2 * c->QD : c->QD,
                           c->KVD, c->DIP, c->moe_E, c->moe_Fe, c->moe_Fs,
                           c->Dw,  c->Dal, c->Dv,    c->Dg};
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++)
        max_k = ks[i] > max_k ? ks[i] : max_k;
    for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++)
        max_n = ns[i] > max_n ? ns[i] : max_n;
    BE_CUDA_TRY(be_cuda_core_scratch(&c->core, max_k, max_n, c->C, d));
    const size_t rows = cap * c->moe_k; /* gathered expert rows */
    const bool moe = c->moe_k > 0, att = c->n_attn > 0, m2 = c->n_m2 > 0, rw = c->n_rw > 0;
    struct {
        float **p;
        size_t n;
        const char *what;
    } a[] = {
        {&c->x, cap * c->C, "x"},
        {&c->xn, cap * c->C, "xn"},
        {&c->xr, c->res_mul != 0.0f ? cap * c->C : 0, "xr"},
        {&c->qr, cap * c->KD, "q"},
        {&c->kr, cap * c->KD, "k"},
        {&c->vr, cap * c->VD, "v"},
        {&c->q, cap * c->KD, "q"},
        {&c->k, cap * c->KD, "k"},
        {&c->v, cap * c->VD, "v"},
        {&c->ar, cap * c->HV, "a"},
        {&c->br, cap * c->HV, "b"},
        {&c->gr, c->use_gate ? cap * c->VD : 0, "g"},
        {&c->o, cap * c->VD, "o"},
        {&c->hg, cap * c->F, "mlp g"},
        {&c->hu, c->swiglu ? cap * c->F : 0, "mlp u"},
        {&c->xo, lcap * c->C, "norm"},
        {&c->m2p, m2 ? cap * c->DIP : 0, "mamba2 in_proj"},
        {&c->m2x, m2 ? cap * c->CD : 0, "mamba2 conv"},
        {&c->m2y, m2 ? cap * c->DI : 0, "mamba2 scan"},
        {&c->rl, moe ? cap * c->moe_E : 0, "router"},
        {&c->xe, rows * c->C, "expert in"},
        {&c->he, rows * c->moe_Fe, "expert g"},
        {&c->hue, rows * c->moe_Fe, "expert u"},
        {&c->oe, rows * c->C, "expert out"},
        {&c->hs, moe ? cap * c->moe_Fs : 0, "shared g"},
        {&c->hsu, moe ? cap * c->moe_Fs : 0, "shared u"},
        {&c->os, moe ? cap * c->C : 0, "shared out"},
        {&c->sgv, moe ? cap : 0, "shared gate"},
        {&c->aq, att ? cap * c->QD : 0, "attn q"},
        {&c->ak, att ? cap * c->KVD : 0, "attn k"},
        {&c->av, att ? cap * c->KVD : 0, "attn v"},
        {&c->ao, att ? cap * c->QD : 0, "attn o"},
        {&c->aqg, att && c->attn_gate ? cap * 2 * c->QD : 0, "attn q + gate"},
        {&c->ag, att && c->attn_gate ? cap * c->QD : 0, "attn gate"},
        {&c->mx, rw ? RW_MIX_N * cap * c->C : 0, "rwkv7 mixes"},
        {&c->rr, rw ? cap * c->C : 0, "rwkv7 r"},
        {&c->rk, rw ? cap * c->C : 0, "rwkv7 k"},
        {&c->rv, rw ? cap * c->C : 0, "rwkv7 v"},
        {&c->vf, rw ? cap * c->C : 0, "rwkv7 v_first"},
        {&c->lw, rw ? cap * c->Dw : 0, "rwkv7 lora w"},
        {&c->la, rw ? cap * c->Dal : 0, "rwkv7 lora a"},
        {&c->lv, rw ? cap * c->Dv : 0, "rwkv7 lora v"},
        {&c->lg, rw ? cap * c->Dg : 0, "rwkv7 lora g"},
    };
    for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++)
        if (a[i].n > 0)
            BE_CUDA_TRY(be_cuda_dalloc((void **)a[i].p, a[i].n * sizeof(float), a[i].what, d));
    /* v_first is read by every RWKV7 layer after the first for every token: keep it defined */
    if (rw)
        WK_CUDA_CHECK(cudaMemset(c->vf, 0, cap * c->C * sizeof(float)), d);
    if (!moe)
        return WK_OK;
    BE_CUDA_TRY(be_cuda_dalloc((void **)&c->dmoe, sizeof(uint32_t) * 3 * rows, "expert rows", d));
    cudaError_t ce = cudaMallocHost((void **)&c->hmoe, sizeof(uint32_t) * 3 * rows);
    if (ce != cudaSuccess) {
        c->hmoe = NULL;
        return wk_diag_set(d, WK_EDEVICE, "cuda backend: pinned expert rows: %s",
                           be_cuda_handled(ce));
    }
    ce = cudaMallocHost((void **)&c->hrl, sizeof(float) * cap * c->moe_E);
    if (ce != cudaSuccess) {
        c->hrl = NULL;
        return wk_diag_set(d, WK_EDEVICE, "cuda backend: pinned router logits: %s",
                           be_cuda_handled(ce));
    }
    c->sel = calloc(rows, sizeof(uint32_t));
    c->sw = calloc(rows, sizeof(float));
    c->cs = calloc(c->moe_E, sizeof(float));
    c->ecnt = calloc((size_t)c->moe_E + 1, sizeof(uint32_t));
    if (c->sel == NULL || c->sw == NULL || c->cs == NULL || c->ecnt == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    return WK_OK;
}

/*
 * The hybrid parts: the KV pool (cfg->kv_pages, else the CPU's default:
 * GDN_KV_DEF_CTX tokens for every slot), the per-pass KV metadata, the
 * RoPE frequencies theta^(-2i/rope_dim) (computed in double as the CPU does).
 */
static wk_err
gdn_open_attention(be_cuda_gdn *c, const be_config *cfg, uint32_t n_slots, wk_diag *d)
{
    const uint64_t def =
        ((uint64_t)(n_slots - 1) * GDN_KV_DEF_CTX + GDN_KV_PAGE_TOKENS - 1) / GDN_KV_PAGE_TOKENS;
    const uint64_t pages = cfg->kv_pages ? cfg->kv_pages : def;
    if (pages > UINT32_MAX / GDN_KV_PAGE_TOKENS)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: kv_pages %llu over %u",
                           (unsigned long long)pages, UINT32_MAX / GDN_KV_PAGE_TOKENS);
    BE_CUDA_TRY(be_cuda_kv_init(&c->kv, n_slots, (size_t)c->n_attn * 2 * c->KVD, GDN_KV_PAGE_TOKENS,
                                (uint32_t)pages, d));
    const uint32_t half = c->rope_dim / 2, nf = half ? half : 1;
    c->pos_next = calloc(n_slots, sizeof(uint32_t));
    double *fr = calloc(nf, sizeof(double));
    if (c->pos_next == NULL || fr == NULL) {
        free(fr);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < half; i++)
        fr[i] = pow(c->rope_theta, -(double)(2 * i) / (double)c->rope_dim);
    wk_err e = be_cuda_dalloc((void **)&c->inv_freq, sizeof(double) * nf, "rope", d);
    if (e == WK_OK) {
        cudaError_t ce = cudaMemcpy(c->inv_freq, fr, sizeof(double) * nf, cudaMemcpyHostToDevice);
        if (ce != cudaSuccess)
            e = wk_diag_set(d, WK_EDEVICE, "cuda backend: rope upload: %s", be_cuda_handled(ce));
    }
    free(fr);
    if (e != WK_OK)
        return e;
    const size_t meta = 2 * (size_t)c->core.cap + c->kv.pages_total;
    BE_CUDA_TRY(be_cuda_dalloc((void **)&c->dkv, sizeof(uint32_t) * meta, "kv meta", d));
    cudaError_t ce = cudaMallocHost((void **)&c->hkv, sizeof(uint32_t) * meta);
    if (ce != cudaSuccess) {
        c->hkv = NULL;
        return wk_diag_set(d, WK_EDEVICE, "cuda backend: pinned KV metadata (%zu entries): %s",
                           meta, be_cuda_handled(ce));
    }
    return WK_OK;
}

/*
 * The step's KV pages (be_cuda_core.pre_step: after the row checks, before
 * any device call): refused whole with WK_EQUOTA naming the row; then each
 * row's slot starts at its old n_ctx (0 for a reset row, whose pages went
 * back first).
 */
static wk_err
gdn_pre_step(void *arg, const be_row *rows, size_t n, wk_diag *d)
{
    be_cuda_gdn *c = arg;
    BE_CUDA_TRY(be_kv_reserve(&c->kv, rows, n, d));
    for (size_t i = 0; i < n; i++)
        if (rows[i].slot != 0)
            c->pos_next[rows[i].slot] = c->kv.slots[rows[i].slot].pos0;
    return WK_OK;
}

/* The geometry the kernels need, checked before anything is allocated. */
static wk_err
gdn_check_view(const wrk_gdn *g, uint32_t n_gdn, wk_diag *d)
{
    if (n_gdn > 0 && (g->conv < 2 || g->conv > GDN_MAX_CONV))
        return wk_diag_set(d, WK_ENOTSUP, "cuda backend: conv_size %u outside 2..%u", g->conv,
                           GDN_MAX_CONV);
    if (n_gdn > 0 &&
        (g->n_head == 0 || g->head_k == 0 || g->head_v == 0 || g->n_v_head % g->n_head != 0))
        return wk_diag_set(d, WK_EINVAL, "cuda backend: inconsistent gdn heads");
    if (g->n_attn > 0 &&
        (g->n_attn > g->n_layer || g->attn_head_dim == 0 || g->attn_head_dim % 2 != 0 ||
         g->attn_head_dim > GDN_ATT_MAX_DIM || g->attn_kv_heads == 0 || g->attn_heads == 0 ||
         g->attn_heads % g->attn_kv_heads != 0 || g->rope_dim % 2 != 0 ||
         g->rope_dim > g->attn_head_dim))
        return wk_diag_set(d, WK_EINVAL,
                           "cuda backend: bad gdn attention geometry (%u heads, %u KV heads, "
                           "head dim %u: even, at most %u; rotary dims %u: even, at most the "
                           "head dim)",
                           g->attn_heads, g->attn_kv_heads, g->attn_head_dim, GDN_ATT_MAX_DIM,
                           g->rope_dim);
    if (g->n_m2 > 0) {
        if (g->m2_heads == 0 || g->m2_head_dim == 0 || g->m2_state == 0 || g->m2_groups == 0 ||
            g->m2_heads % g->m2_groups != 0)
            return wk_diag_set(d, WK_EINVAL, "cuda backend: inconsistent mamba2 heads / groups");
        if (g->m2_conv < 2 || g->m2_conv > GDN_MAX_CONV)
            return wk_diag_set(d, WK_ENOTSUP, "cuda backend: mamba2 conv %u outside 2..%u",
                               g->m2_conv, GDN_MAX_CONV);
        if (((size_t)g->m2_head_dim + 2 * (size_t)g->m2_state) * sizeof(float) > GDN_M2_SMEM)
            return wk_diag_set(d, WK_ENOTSUP,
                               "cuda backend: mamba2 head dim %u + 2 x state %u over the scan's "
                               "%u bytes of shared memory",
                               g->m2_head_dim, g->m2_state, GDN_M2_SMEM);
    }
    if (g->rw != NULL) {
        const wrk_rwkv7 *rw = g->rw;
        if (rw->n_head == 0 || rw->head_size == 0 || rw->n_head * rw->head_size != g->n_embd)
            return wk_diag_set(d, WK_EINVAL, "cuda backend: %u heads of %u do not make n_embd %u",
                               rw->n_head, rw->head_size, g->n_embd);
        if (rw->head_size > 1024)
            return wk_diag_set(d, WK_ENOTSUP, "cuda backend: head size %u over 1024",
                               rw->head_size);
    }
    return WK_OK;
}

static wk_err gdn_create_list(const be_config *cfg, const wrk_model *m, const wrk_gdn *g,
                              float *arena, uint32_t n_slots, uint64_t slot_bytes, void **out,
                              wk_diag *d);

/*
 * The model's layer list: the "gdn" view, or a pure Mamba2 or RWKV-7
 * model's (wrk_mamba2_layer_list, wrk_rwkv7_layer_list: read only while
 * the step is created; what the kinds use stays the view's).
 */
static wk_err
gdn_create(const be_config *cfg, const wrk_model *m, float *arena, uint32_t n_slots,
           uint64_t slot_bytes, void **out, wk_diag *d)
{
    if (cfg == NULL || m == NULL || arena == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: missing config, model or arena");
    const wrk_gdn *g = wrk_model_view(m, "gdn");
    if (g != NULL)
        return gdn_create_list(cfg, m, g, arena, n_slots, slot_bytes, out, d);
    const wrk_mamba2 *m2 = wrk_model_view(m, "mamba2");
    const wrk_rwkv7 *rw = wrk_model_rwkv7(m);
    if (m2 == NULL && rw == NULL)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: not a layer-list model");
    wrk_gdn *own = NULL;
    wk_err e = m2 != NULL ? wrk_mamba2_layer_list(m2, &own, d) : wrk_rwkv7_layer_list(rw, &own, d);
    if (e == WK_OK)
        e = gdn_create_list(cfg, m, own, arena, n_slots, slot_bytes, out, d);
    free(own);
    return e;
}

static wk_err
gdn_create_list(const be_config *cfg, const wrk_model *m, const wrk_gdn *g, float *arena,
                uint32_t n_slots, uint64_t slot_bytes, void **out, wk_diag *d)
{
    uint32_t n_gdn = 0, n_att = 0, n_m2 = 0, n_rw = 0;
    bool swiglu = false;
    for (uint32_t l = 0; l < g->n_layer; l++) {
        const wrk_gdn_layer *ly = &g->layers[l];
        n_gdn += ly->mixer == WRK_MIXER_GDN;
        n_att += ly->mixer == WRK_MIXER_ATTN;
        n_m2 += ly->mixer == WRK_MIXER_MAMBA2;
        n_rw += ly->mixer == WRK_MIXER_RWKV7;
        swiglu = swiglu || ly->mlp == WRK_MLP_SWIGLU;
        if (ly->mixer > WRK_MIXER_RWKV7 || ly->mlp > WRK_MLP_RWKV7)
            return wk_diag_set(d, WK_ENOTSUP, "cuda backend: %s layer %u: unknown layer kind",
                               wrk_model_info_get(m)->family, l);
        /* the RWKV7 kinds: the view's RWKV-7 tensors; the channel mix's shift is the time mix's */
        if ((ly->mixer == WRK_MIXER_RWKV7 || ly->mlp == WRK_MLP_RWKV7) &&
            (g->rw == NULL || ly->rw == NULL || ly->mixer != WRK_MIXER_RWKV7 || !g->layer_norm))
            return wk_diag_set(d, WK_EINVAL,
                               "cuda backend: layer %u: an RWKV7 kind without its tensors, its "
                               "LayerNorms or the time mix",
                               l);
    }
    if (n_att != g->n_attn || n_m2 != g->n_m2)
        return wk_diag_set(d, WK_EINVAL,
                           "cuda backend: %u attention / %u mamba2 layers flagged, the view "
                           "says %u / %u",
                           n_att, n_m2, g->n_attn, g->n_m2);
    BE_CUDA_TRY(gdn_check_view(g, n_gdn, d));
    be_cuda_gdn *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wk_err e = WK_OK;
    c->L = g->n_layer;
    c->C = g->n_embd;
    c->n_gdn = n_gdn;
    if (n_gdn > 0) { /* the Gated DeltaNet dimensions stay 0 without such layers */
        c->H = g->n_head;
        c->K = g->head_k;
        c->HV = g->n_v_head;
        c->Vd = g->head_v;
        c->W = g->conv;
        c->use_gate = g->use_gate;
    }
    c->KD = c->H * c->K;
    c->VD = c->HV * c->Vd;
    c->F = g->ffn_dim;
    c->V = g->vocab_size;
    c->eps = g->norm_eps;
    c->tied = g->tied;
    c->beta_scale = g->allow_neg_eigval ? 2.0f : 1.0f;
    c->q_scale = c->K ? (float)(1.0 / sqrt((double)c->K)) : 0.0f;
    c->emb_mul = g->emb_mul;
    c->res_mul = g->res_mul;
    c->dtype = wrk_model_info_get(m)->dtype;
    c->arena = arena;
    c->layer_norm = g->layer_norm;
    c->n_rw = n_rw;
    c->swiglu = swiglu;
    if (n_rw > 0) {
        c->rH = g->rw->n_head;
        c->rN = g->rw->head_size;
        c->Dw = g->rw->lora_w;
        c->Dal = g->rw->lora_a;
        c->Dv = g->rw->lora_v;
        c->Dg = g->rw->lora_g;
        c->gn_eps = (float)g->rw->gn_eps;
    }
    c->n_attn = g->n_attn;
    if (c->n_attn > 0) {
        c->Hq = g->attn_heads;
        c->Hkv = g->attn_kv_heads;
        c->Da = g->attn_head_dim;
        c->attn_gate = g->attn_gate;
        c->rope_dim = g->rope_dim;
        c->att_scale =
            g->attn_scale != 0.0f ? g->attn_scale : (float)(1.0 / sqrt((double)g->attn_head_dim));
    }
    c->QD = c->Hq * c->Da;
    c->KVD = c->Hkv * c->Da;
    c->attn_eps = g->attn_norm_eps;
    c->rope_theta = g->rope_theta;
    c->n_m2 = g->n_m2;
    if (c->n_m2 > 0) {
        c->H2 = g->m2_heads;
        c->P = g->m2_head_dim;
        c->G2 = g->m2_groups;
        c->N = g->m2_state;
        c->K2 = g->m2_conv;
        c->DI = c->H2 * c->P;
        c->CD = c->DI + 2 * c->G2 * c->N;
        c->DIP = c->DI + c->CD + c->H2;
        c->m2_conv_floats = (size_t)c->CD * (c->K2 - 1);
    }
    c->layer_floats =
        c->n_gdn ? (size_t)(c->W - 1) * (2 * (size_t)c->KD + c->VD) + (size_t)c->HV * c->K * c->Vd
                 : 0;
    c->layers = calloc(c->L ? c->L : 1, sizeof(*c->layers));
    if (c->layers == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto fail;
    }
    /* each layer's kinds, KV index and state offset (wrk_gdn.h; the CPU's soff) */
    size_t soff = 0;
    n_att = 0;
    for (uint32_t l = 0; l < c->L; l++) {
        gdn_layer *ly = &c->layers[l];
        const wrk_gdn_layer *s = &g->layers[l];
        ly->mixer = s->mixer;
        ly->mlp = s->mlp;
        ly->soff = soff;
        const size_t lf = (size_t)wrk_gdn_layer_floats(g, l);
        const size_t want =
            s->mixer == WRK_MIXER_GDN      ? c->layer_floats
            : s->mixer == WRK_MIXER_MAMBA2 ? c->m2_conv_floats + (size_t)c->H2 * c->P * c->N
            : s->mixer == WRK_MIXER_RWKV7  ? 2 * (size_t)c->C + (size_t)c->rH * c->rN * c->rN
                                           : 0;
        if (lf != want) {
            e = wk_diag_set(d, WK_EINVAL,
                            "cuda backend: layer %u holds %zu state floats, its kind %zu", l, lf,
                            want);
            goto fail;
        }
        soff += lf;
        if (s->mixer == WRK_MIXER_ATTN)
            ly->idx = n_att++;
        if (s->mixer == WRK_MIXER_RWKV7)
            ly->rw_first = n_rw-- == c->n_rw; /* counts down: the first sees all */
    }
    c->slot_floats = soff;
    if (c->slot_floats * sizeof(float) != slot_bytes ||
        wrk_model_info_get(m)->kv_token_bytes != (uint64_t)c->n_attn * 2 * c->KVD * sizeof(float)) {
        e = wk_diag_set(d, WK_EINVAL,
                        "cuda backend: slot of %llu bytes, the layer list needs %zu (or KV "
                        "bytes a token mismatch)",
                        (unsigned long long)slot_bytes, c->slot_floats * sizeof(float));
        goto fail;
    }
    if ((e = gdn_open_moe(c, g, d)) != WK_OK ||
        (e = be_cuda_core_init(&c->core, cfg, c->V, c->arena, n_slots, slot_bytes, d)) != WK_OK ||
        (e = gdn_upload_mats(c, g, d)) != WK_OK || (e = gdn_upload_vecs(c, g, d)) != WK_OK ||
        (e = gdn_alloc_scratch(c, d)) != WK_OK)
        goto fail;
    c->core.logit_div = g->logit_div; /* be_cuda_core_init sets the core up afresh */
    if (c->n_attn > 0) {
        if ((e = gdn_open_attention(c, cfg, n_slots, d)) != WK_OK)
            goto fail;
        c->core.pre_step = gdn_pre_step;
    }
    if ((e = be_cuda_open_sync(d)) != WK_OK)
        goto fail;
    *out = c;
    return WK_OK;

fail:
    gdn_destroy(c);
    return e;
}

static wk_err
gdn_step(void *impl, be_row *rows, size_t n, wk_diag *d)
{
    be_cuda_gdn *c = impl;
    return be_cuda_core_step(&c->core, rows, n, gdn_pass, c, d);
}

static void
gdn_describe(const void *impl, char *buf, size_t len)
{
    const be_cuda_gdn *c = impl;
    if (buf == NULL || len == 0)
        return;
    int n = snprintf(
        buf, len, "pass_tokens=%u weights=%s weight_bytes=%llu tied=%s gate=%s gemm=cublas-split16",
        c->core.cap, wk_dtype_name(c->dtype), (unsigned long long)c->core.weight_bytes,
        c->tied ? "yes" : "no", c->use_gate ? "yes" : "no");
    if (c->n_m2 > 0 && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, " mamba2_layers=%u", c->n_m2);
    if (c->n_rw > 0 && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, " rwkv7_layers=%u", c->n_rw);
    if (c->moe_k > 0 && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, " experts=%u top_k=%u routing=host", c->moe_E,
                      c->moe_k);
    if (c->n_attn > 0 && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n,
                 " attn_layers=%u kv_token_bytes=%llu kv_pages=%u page_tokens=%u", c->n_attn,
                 (unsigned long long)be_kv_token_bytes(&c->kv), c->kv.pages_total,
                 c->kv.page_tokens);
}

/* The KV pool of a hybrid model (be_cuda_family.kv), NULL without attention layers. */
static be_kv *
gdn_kv(void *impl)
{
    be_cuda_gdn *c = impl;
    return c != NULL && c->n_attn > 0 ? &c->kv : NULL;
}

const be_cuda_family be_cuda_gdn_family = {
    .views = (const char *const[]){"gdn", "mamba2", "rwkv7", NULL},
    .create = gdn_create,
    .destroy = gdn_destroy,
    .step = gdn_step,
    .describe = gdn_describe,
    .kv = gdn_kv,
};
