/*
 * be_cpu_gdn: the CPU backend's layer-list pass, the one pass of every
 * model (be_cpu_gdn_family; be_cpu.c's core plugs it in for the views
 * "gdn": fla Gated DeltaNet and its hybrids, Qwen3.5, Nemotron-H,
 * Granite-4.0-H; "mamba2" and "rwkv7", whose families give their layer
 * lists, wrk_mamba2_layer_list / wrk_rwkv7_layer_list), over the shared
 * be_cpu_base (arena, step validation, passes, GEMM regions).
 *
 * A model is a list of layers (wrk_gdn.h), each an optional mixer (Gated
 * DeltaNet, softmax attention, Mamba2, RWKV-7 time mix) and an optional MLP
 * (SwiGLU, squared ReLU, mixture of experts, RWKV-7 channel mix), each
 * after its own pre-norm (RMSNorm; LayerNorm with bias for RWKV-7, which
 * also normalises the embedding row), over one residual stream. A pass runs
 * layer by layer over all its tokens, dispatching on the kinds; the Mamba2
 * kind's kernels are be_cpu_mamba2.h's, the RWKV-7 kinds be_cpu_rwkv7.h's
 * (v_first carried across layers in that kind's pass buffer), the rest
 * are here.
 *
 * At open it packs every projection and the head in their stored dtype
 * into one block (a tied head is packed from the embedding), and converts the vectors
 * (norm weights, A_log, dt_bias, conv taps as [W][D]) to fp32. A Gated
 * DeltaNet mixer runs one GEMM region for the q, k, v, a, b, g projections
 * of every token, the short convolutions per token (the inputs before the
 * segment come from the slot's conv state), the delta-rule recurrence per
 * (segment, value head, column span) in token order, the gated per-head
 * RMSNorm per token, then o_proj (added into the residual). The MLP follows;
 * for the logits positions, the final norm and the head.
 *
 * Slot layout: wrk_gdn.h (the recurrent layers in layer order: conv
 * histories then S [HV, K, Vd] per Gated DeltaNet layer, conv then ssm per
 * Mamba2 layer; each layer's offset is gdn_layer.soff).
 *
 * Hybrid models (attention layers, wrk_gdn.h): a slot's image is the fixed
 * part above (in the base arena) followed by its KV, token-major, which
 * lives in a paged pool (be_kv.h, be_cpu_kv.h) of be_config.kv_pages pages
 * of GDN_KV_PAGE_TOKENS tokens (default: enough for every slot to hold
 * GDN_KV_DEF_CTX tokens at once; pool memory is reserved, and only the
 * pages in use are ever touched). A step takes its rows' pages first
 * (gdn_pre_step: refused whole with WK_EQUOTA naming the row), so the pass
 * knows each token's absolute position (the slot's n_ctx before it). An
 * attention layer runs, per pass: one GEMM region for q / k / v, then per
 * token the biases, q / k RMSNorm, RoPE at the token's position and the
 * append of K / V to its slot's pages (every token of the pass is appended
 * before any attends), then per (token, query head) softmax attention over
 * positions 0..pos in ascending order (be_cpu_attn: scores as 4 partial
 * fma chains over the head dim, the max, exp and the sum in double, the
 * weighted sum of V as fma chains in position order). The queries run in blocks
 * (gdn_att_run: consecutive tokens of one segment times the query heads of
 * one KV head, up to GDN_ATT_QMAX) that read each K / V page once for all
 * of them; a block only shares reads, each query
 * keeps exactly its own operations, so the block shape (which varies with
 * the batch, the pass and the thread count) changes no bit. A token reads
 * only its own slot's pages and its own projections, so chunked prefill
 * equals token by token and a row's bits never depend on the batch, bit
 * for bit.
 *
 * Batch invariance: per-token stages read only that token's (and its row's
 * earlier tokens') data; every reduction has a fixed order (RMSNorm and the
 * L2 norms sum in double in a fixed order; the recurrence works column by
 * column of S, each column a fixed sequence over the key index); the GEMM
 * kernels give each element one FMA chain in k order. Each value column of
 * S is computed on its own (how many columns a recurrence task takes varies
 * with the batch and the thread count, never a column's operations), so a
 * row's bits never depend on the other rows, on how its prefill is split or
 * on the thread count.
 *
 * Conventions ride on the view (wrk_gdn.h): Qwen3.5's output gate in q_proj
 * (attn_gate), partial rotary (rope_dim; 0 for Nemotron-H's attention, which
 * has no position encoding), the (1 + weight) norms folded into the fp32
 * vectors at open (norm_offset); the experts' routing (softmax, Nemotron
 * 3's grouped sigmoid with a score bias, or Granite's top-k-then-softmax)
 * and kind (SwiGLU or squared ReLU) are per layer (wrk_moe); Granite's
 * scalars: the embedding times emb_mul, every mixer's and MLP's output
 * times res_mul before it joins the residual (gdn_add_out: the projection
 * into xr, then x += xr * res_mul), attn_scale as the score scale, the
 * logits divided by logit_div (all 0, and skipped, for other models).
 *
 * Must never: log, abort on bad input, or change a slot when a step is
 * refused (be_cpu_base_step validates before any pass).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "be_cpu_common.h"
#include "be_cpu_attn.h"
#include "be_cpu_kv.h"
#include "be_cpu_mamba2.h"
#include "be_cpu_rwkv7.h"
#include "wrk_gdn.h"
#include "wrk_moe_route.h"

#define GDN_L2_EPS 1e-6  /* fla's in-kernel q / k L2 normalisation */
#define GDN_CONV_MAX 64u /* most conv taps (checked at open) */
#define GDN_SPAN 512u    /* most value columns per recurrence task */
#define GDN_TILE 8u      /* key rows per tile of the recurrence (gdn_delta_body) */
/*
 * KV page size: 16 tokens keeps the waste per slot small (half a page on
 * average) while a page of a 340M-class hybrid (2 attention layers, 16 KV
 * heads of 64) is 256 KiB, so page-table lookups are negligible beside the
 * attention's reads.
 */
#define GDN_KV_PAGE_TOKENS 16u
#define GDN_KV_DEF_CTX 2048u  /* default pool: this many tokens for every slot */
#define GDN_ATT_MAX_DIM 1024u /* attention head dim (checked at map) */
#define GDN_ATT_QMAX 64u      /* most queries (token, head) of an attention block */
_Static_assert(GDN_ATT_QMAX <= BE_CPU_ATTN_QMAX, "an attention block fits be_cpu_attn");
#define GDN_M2_CONV_BLOCK 64u /* channels per Mamba2 conv task */

/*
 * One attention block: nt consecutive tokens of one segment (so one slot,
 * consecutive positions) times nh query heads of one KV head, at most
 * GDN_ATT_QMAX queries; query qi is token t0 + qi / nh, head h0 + qi % nh.
 */
typedef struct gdn_att_blk {
    uint32_t t0, nt, h0, nh;
} gdn_att_blk;


/* One token's recurrence over n <= GDN_SPAN value columns of a head (gdn_delta_body). */
typedef void (*gdn_delta_fn)(float *S, size_t ld, uint32_t K, uint32_t n, const float *q,
                             const float *k, const float *v, float decay, float beta, float *o);

/* A mixture-of-experts MLP (wrk_gdn.h wrk_moe), packed. */
typedef struct gdn_moe {
    uint32_t E, k, Fe, Fs;         /* experts, per token, expert width, shared width (0: none) */
    bool relu2;                    /* experts (and the shared one) are RELU2, else SwiGLU */
    bool sh_gated;                 /* the shared expert is times sigmoid(sr x) */
    wrk_moe_route_cfg rt;          /* the routing (wrk_moe_route), owned */
    be_cpu_mat router;             /* C -> E */
    be_cpu_mat *gate, *up, *down;  /* E each, owned arrays */
    be_cpu_mat sg, su, sd, sr;     /* shared expert C -> Fs -> C, its gate C -> 1 */
} gdn_moe;

typedef struct gdn_layer {
    const float *attn_norm, *mlp_norm; /* [C] */
    const float *o_norm;               /* [Vd] */
    const float *neg_A;                /* -exp(A_log) [HV] */
    const float *dt_bias;              /* [HV] */
    const float *cq, *ck, *cv;         /* conv taps [W][KD], [W][KD], [W][VD] */
    be_cpu_mat wq, wk, wv, wa, wb, wg; /* input projections (wg: use_gate only) */
    be_cpu_mat wo;                     /* VD -> C */
    be_cpu_mat gate, up, down;         /* MLP (dense) */
    gdn_moe *moe;                      /* mlp MOE: the experts; NULL otherwise */
    wrk_mixer_kind mixer;              /* the layer's kinds (wrk_gdn.h) */
    wrk_mlp_kind mlp;
    size_t soff; /* recurrent mixers: floats before its state in a slot */
    /* Mamba2 mixers */
    be_cpu_m2_vecs m2;        /* conv taps, biases, A, D, gated norm weight */
    be_cpu_mat m2_in, m2_out; /* C -> DIP, DI -> C */
    /* attention layers (wq, wk, wv, wo are the attention projections) */
    uint32_t idx;              /* attention layers: index among them (KV layer) */
    const float *bq, *bk, *bv; /* qkv biases [QD], [KVD], [KVD]; NULL without */
    const float *nq, *nk;      /* q / k RMSNorm weights [Da]; NULL without */
    /* layer_norm models: the pre-norms' biases [C] (their LayerNorms); NULL: RMSNorms */
    const float *attn_norm_b, *mlp_norm_b;
    be_cpu_rw7_layer rw; /* RWKV7 kinds: the layer's weights */
} gdn_layer;

struct be_ctx {
    be_cpu_base b;                             /* must be first: the pass gets &ctx->b */
    const wrk_gdn *g;                          /* the model's layer list, borrowed or own */
    wrk_gdn *own;                              /* the list made for a pure Mamba2 view, owned */
    uint32_t L, C, H, K, HV, Vd, KD, VD, W, F; /* dimensions (wrk_gdn.h) */
    uint32_t span, nspan;                      /* recurrence columns per task, tasks per head */
    float beta_scale;                          /* 1 or 2 (allow_neg_eigval) */
    float q_scale;                             /* K^-0.5 */
    size_t layer_floats;                       /* floats per Gated DeltaNet layer in a slot */
    float *vecs;                               /* every fp32 vector, one block, owned */
    const float *norm;                         /* final norm [C], into vecs */
    gdn_layer *layers;                         /* L entries, owned */
    be_cpu_mat head;                           /* C -> V */
    uint64_t packed_bytes;                     /* bytes of packed weights */
    uint32_t layer;                            /* the layer a stage runs */
    gdn_delta_fn delta;                        /* the recurrence for the ISA */
    float emb_mul, res_mul, logit_div;         /* Granite's scalars (wrk_gdn.h); 0: none */
    float *xr;                                 /* res_mul: a block's output [cap][C] */

    /* pass scratch, cap tokens each */
    float *x;            /* residual [cap][C] */
    float *xn;           /* normed input [cap][C]; logits rows at the end */
    float *qr, *kr, *vr; /* projections before the conv [cap][KD|KD|VD] */
    float *q, *k, *v;    /* after conv + SiLU (+ L2 norm) */
    float *ar, *br;      /* a / b projections [cap][HV]; then decay / beta */
    float *gr;           /* g_proj [cap][VD] */
    float *o;            /* recurrence output [cap][VD] */
    float *hg, *hu;      /* MLP hidden [cap][F] */

    /* mixture-of-experts layers (moe_k 0: none of this is allocated) */
    uint32_t moe_E, moe_k, moe_Fe, moe_Fs; /* the largest E, k, Fe, Fs of any layer */
    float *rl;           /* router logits [cap][E] */
    float *rc;           /* sigmoid routing: choice scores [cap][E] */
    uint32_t *sel;       /* each token's experts, ascending [cap][k] */
    float *sw;           /* their weights [cap][k] */
    uint32_t *trow;      /* each token's rows in xe, by ascending expert [cap][k] */
    uint32_t *ecnt;      /* rows per expert, then offsets [E + 1] */
    float *xe;           /* the gathered inputs, expert-major [cap k][C] */
    float *he, *hue;     /* expert hidden [cap k][Fe] */
    float *oe;           /* expert outputs [cap k][C] */
    float *hs, *hsu;     /* shared expert hidden [cap][Fs] */
    float *os, *sgv;     /* shared expert output [cap][C], its gate [cap] */
    uint32_t moe_rows;   /* rows in xe this layer */

    /* Mamba2 mixers (n_m2 0: none of this is allocated) */
    uint32_t n_m2;             /* Mamba2 layers */
    be_cpu_m2_dims m2d;        /* their dimensions */
    size_t m2_conv_floats;     /* CD * (K-1): the conv state before the ssm state */
    uint32_t m2_conv_blocks;   /* channel blocks per segment */
    be_cpu_m2_scan_fn m2_scan; /* the scan kernel for the ISA */
    float *m2p, *m2x, *m2y;    /* [cap][DIP], [cap][CD], [cap][DI] */

    /* hybrid attention layers (n_attn 0: none of this is allocated) */
    uint32_t n_attn;          /* attention layers */
    uint32_t Hq, Hkv, Da;     /* query heads, KV heads, head dim */
    uint32_t QD, KVD;         /* Hq * Da, Hkv * Da */
    float att_scale;          /* Da^-0.5, or the view's attn_scale */
    uint32_t rope_half;       /* rotary pairs per head: rope_dim / 2 */
    double *inv_freq;         /* RoPE theta^(-2i/rope_dim) [rope_half], owned */
    be_kv kv;                 /* the KV page pool */
    float *aq, *ak, *av, *ao; /* [cap][QD|KVD|KVD|QD] */
    float *aqg, *ag;          /* attn_gate: q_proj output [cap][2 QD], the gates [cap][QD] */
    uint32_t *tpos;           /* absolute position of each pass token [cap] */
    uint32_t att_tasks;       /* most tasks of the attention region: one per thread */
    size_t scr_len;           /* positions the attention scratch holds (>= the longest context) */
    float *scr;               /* [att_tasks][be_cpu_attn_scr_floats(scr_len, Da)] */
    gdn_att_blk *att_blks;    /* the pass's attention blocks [cap * Hq], owned */
    uint32_t n_att_blks;      /* blocks in the current layer */
    _Atomic uint32_t att_next; /* next block to take (gdn_stage_att) */
    be_cpu_attn_fn att;       /* attention of one block of queries, for the ISA */

    /* RWKV-7 layers (g->rw NULL: none of this is allocated) */
    be_cpu_rw7 rw7;             /* their dimensions and pass buffers */
    const float *norm_b;        /* layer_norm: the final LayerNorm's bias [C] */
    const float *emb_w, *emb_b; /* emb_norm: the embedding's LayerNorm [C] */
    void *weights;              /* one block holding every packed matrix, owned */
};

/* ------------------------------------------------------------------------ */
/* small math                                                                */
/* ------------------------------------------------------------------------ */

static inline float
gdn_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static inline float
gdn_softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

/* x /= sqrt(sum(x^2) + eps), then *= scale; sum in double, fixed order. */
static void
gdn_l2norm(float *x, uint32_t n, float scale)
{
    double ps[4] = {0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            ps[j] += (double)x[i + j] * x[i + j];
    double s = (ps[0] + ps[1]) + (ps[2] + ps[3]);
    for (; i < n; i++)
        s += (double)x[i] * x[i];
    const float inv = (float)(1.0 / sqrt(s + GDN_L2_EPS)) * scale;
    for (i = 0; i < n; i++)
        x[i] *= inv;
}

/* The slot state of recurrent layer `layer` (a Gated DeltaNet or Mamba2 mixer). */
static inline float *
gdn_slot_layer(const be_ctx *c, uint32_t slot, uint32_t layer)
{
    return be_cpu_base_slot(&c->b, slot) + c->layers[layer].soff;
}

/* Offsets of a layer's state tensors (floats). */
static inline size_t
gdn_off_kconv(const be_ctx *c)
{
    return (size_t)(c->W - 1) * c->KD;
}
static inline size_t
gdn_off_vconv(const be_ctx *c)
{
    return 2 * (size_t)(c->W - 1) * c->KD;
}
static inline size_t
gdn_off_S(const be_ctx *c)
{
    return (size_t)(c->W - 1) * (2 * (size_t)c->KD + c->VD);
}

/* ------------------------------------------------------------------------ */
/* token-parallel stages                                                     */
/* ------------------------------------------------------------------------ */

static void
gdn_stage_embed(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        float *x = c->x + (size_t)t * c->C;
        /* the id was validated against the vocab before the pass */
        if (wk_tensor_read_f32(c->g->emb, (size_t)c->b.tok[t] * c->C, c->C, x) != WK_OK)
            memset(x, 0, sizeof(float) * c->C);
        if (c->emb_mul != 0.0f)
            for (uint32_t i = 0; i < c->C; i++)
                x[i] *= c->emb_mul;
        if (c->emb_w != NULL)
            be_cpu_layernorm(x, c->emb_w, c->emb_b, c->C, c->g->norm_eps, x);
    }
}

/* res_mul: x += xr * res_mul per token (the product rounded, then the sum, as torch). */
static void
gdn_stage_res_add(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        float *x = c->x + (size_t)t * c->C;
        const float *r = c->xr + (size_t)t * c->C;
        for (uint32_t i = 0; i < c->C; i++)
            x[i] += r[i] * c->res_mul;
    }
}

/*
 * A block's output projection w (in: its input rows) added into the
 * residual: straight into x by the GEMM's epilogue, or, with res_mul, into
 * xr and then scaled into x. Runs the region.
 */
static void
gdn_add_out(be_ctx *c, const be_cpu_mat *w, const float *in)
{
    be_cpu_base *b = &c->b;
    if (c->res_mul == 0.0f) {
        be_cpu_job_add(b, w, in, b->T, c->x, NULL, BE_CPU_EPI_ADD);
        be_cpu_jobs_run(b);
        return;
    }
    be_cpu_job_add(b, w, in, b->T, c->xr, NULL, BE_CPU_EPI_STORE);
    be_cpu_jobs_run(b);
    be_cpu_tok_run(b, gdn_stage_res_add, c);
}

/* logit_div: every logits row divided by it (as torch's logits / logits_scaling). */
static void
gdn_stage_logit_div(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const be_cpu_base *b = &c->b;
    uint32_t i0, i1;
    be_cpu_logits_range(b, task, &i0, &i1);
    for (uint32_t i = i0; i < i1; i++) {
        float *y = b->lrows[i];
        for (uint32_t v = 0; v < b->V; v++)
            y[v] = y[v] / c->logit_div;
    }
}

/* The logits rows divided by logit_div (nothing when it is 0 or there are none). */
static void
gdn_logits_scale(be_ctx *c)
{
    be_cpu_base *b = &c->b;
    if (c->logit_div == 0.0f || b->n_logits == 0)
        return;
    uint32_t n = b->n_logits < 8 ? 1 : b->n_threads * 2;
    b->tok_tasks = n < b->n_logits ? n : b->n_logits;
    be_cpu_pool_run(b->pool, gdn_stage_logit_div, c, b->tok_tasks);
}

/* A pre-norm or the final norm of one row: LayerNorm with bias b, or RMSNorm (b NULL). */
static inline void
gdn_norm(const be_ctx *c, const float *x, const float *w, const float *b, float *y)
{
    if (b != NULL)
        be_cpu_layernorm(x, w, b, c->C, c->g->norm_eps, y);
    else
        be_cpu_rmsnorm(x, w, c->C, c->g->norm_eps, y);
}

static void
gdn_stage_attn_norm(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const gdn_layer *ly = &c->layers[c->layer];
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++)
        gdn_norm(c, c->x + (size_t)t * c->C, ly->attn_norm, ly->attn_norm_b,
                 c->xn + (size_t)t * c->C);
}

static void
gdn_stage_mlp_norm(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const gdn_layer *ly = &c->layers[c->layer];
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++)
        gdn_norm(c, c->x + (size_t)t * c->C, ly->mlp_norm, ly->mlp_norm_b,
                 c->xn + (size_t)t * c->C);
}

/*
 * SiLU(causal depthwise conv) of one token's D channels: taps [W][D] (tap
 * W-1 on the current input), raw [T][D] the pass's projections, hist the
 * slot's [W-1][D] history (oldest first) for the positions before the
 * segment start t0. The sum runs over the taps oldest first.
 */
static void
gdn_conv_token(const be_ctx *c, const float *taps, const float *raw, const float *hist, uint32_t D,
               uint32_t t, uint32_t t0, float *out)
{
    const uint32_t W = c->W;
    const float *src[GDN_CONV_MAX]; /* W <= GDN_CONV_MAX (checked at open) */
    for (uint32_t j = 0; j < W; j++) {
        int64_t p = (int64_t)t - (W - 1) + j;
        src[j] = p >= (int64_t)t0 ? raw + (size_t)p * D
                                  : hist + (size_t)((int64_t)(W - 1) - ((int64_t)t0 - p)) * D;
    }
    for (uint32_t d = 0; d < D; d++)
        out[d] = 0.0f;
    for (uint32_t j = 0; j < W; j++) {
        const float *s = src[j], *w = taps + (size_t)j * D;
        for (uint32_t d = 0; d < D; d++)
            out[d] += w[d] * s[d];
    }
    be_cpu_silu(c->b.isa, out, D);
}

/*
 * Per token: the three convolutions, the q / k L2 norms (q also scaled by
 * K^-0.5), beta = sigmoid(b) (x2 with allow_neg_eigval) into br and the
 * decay factor exp(-exp(A_log) softplus(a + dt_bias)) into ar.
 */
static void
gdn_stage_conv(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const gdn_layer *ly = &c->layers[c->layer];
    const uint32_t KD = c->KD, VD = c->VD, HV = c->HV, K = c->K;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        const be_cpu_seg *sg = &c->b.segs[c->b.tseg[t]];
        const float *st = gdn_slot_layer(c, sg->slot, c->layer);
        float *q = c->q + (size_t)t * KD, *k = c->k + (size_t)t * KD;
        gdn_conv_token(c, ly->cq, c->qr, st, KD, t, sg->t0, q);
        gdn_conv_token(c, ly->ck, c->kr, st + gdn_off_kconv(c), KD, t, sg->t0, k);
        gdn_conv_token(c, ly->cv, c->vr, st + gdn_off_vconv(c), VD, t, sg->t0,
                       c->v + (size_t)t * VD);
        for (uint32_t h = 0; h < c->H; h++) {
            gdn_l2norm(q + (size_t)h * K, K, c->q_scale);
            gdn_l2norm(k + (size_t)h * K, K, 1.0f);
        }
        float *a = c->ar + (size_t)t * HV, *bt = c->br + (size_t)t * HV;
        for (uint32_t j = 0; j < HV; j++) {
            a[j] = expf(ly->neg_A[j] * gdn_softplus(a[j] + ly->dt_bias[j]));
            bt[j] = gdn_sigmoid(bt[j]) * c->beta_scale;
        }
    }
}

/* The new conv histories: the last W-1 inputs of each segment. */
static void
gdn_save_conv(be_ctx *c)
{
    const uint32_t W = c->W;
    for (uint32_t s = 0; s < c->b.n_segs; s++) {
        const be_cpu_seg *sg = &c->b.segs[s];
        float *st = gdn_slot_layer(c, sg->slot, c->layer);
        struct {
            float *hist;
            const float *raw;
            uint32_t D;
        } parts[3] = {{st, c->qr, c->KD},
                      {st + gdn_off_kconv(c), c->kr, c->KD},
                      {st + gdn_off_vconv(c), c->vr, c->VD}};
        for (int p = 0; p < 3; p++) {
            const uint32_t D = parts[p].D;
            /* new[j] = old[j + n] while that is history, else raw[t0 + j + n - (W-1)] */
            for (uint32_t j = 0; j + 1 < W; j++) {
                size_t src = (size_t)j + sg->n;
                float *dst = parts[p].hist + (size_t)j * D;
                if (src + 1 < W)
                    memmove(dst, parts[p].hist + src * D, sizeof(float) * D);
                else
                    memcpy(dst, parts[p].raw + (size_t)(sg->t0 + src - (W - 1)) * D,
                           sizeof(float) * D);
            }
        }
    }
}

/*
 * The recurrence of one token over n value columns (n <= GDN_SPAN) of one
 * head, per column i:
 *   kv = sum_r (S[r][i] decay) k[r];  u = beta (v[i] - kv)
 *   S[r][i] = S[r][i] decay + u k[r];  o[i] = sum_r S[r][i] q[r]
 * S points at column 0 of key row 0 (rows ld floats apart). Two passes
 * over the columns, each in tiles of GDN_TILE key rows across all n
 * columns, so memory is walked row by row in long contiguous runs: the
 * first only reads S (the decayed value is recomputed in the second, the
 * same product, so the same bits), the second updates it, by then in
 * cache. Within a tile the columns go in groups of nv 16-float vectors
 * whose sums stay in registers; between tiles the sums live in acc / o.
 * Every column's sums run over r = 0..K-1 in order and see the same
 * operations (a rounded product, then a rounded sum: ISO C mode keeps
 * -ffp-contract=off) whatever the group, tile or vector width, so which
 * columns share a task, the ISA path and the scalar tail never change a
 * bit. Written with GCC vector extensions; compiled for three targets
 * below with the group width that fits each one's registers.
 */
typedef float gdn_v16 __attribute__((vector_size(64)));
#define GDN_NV_MAX 4 /* 16-float vectors per column group, at most */

/* Unaligned 16-float load / store (the slot's rows need not be 64-byte aligned). */
#define GDN_LD(v, p) memcpy(&(v), (p), sizeof(gdn_v16))
#define GDN_ST(p, v) memcpy((p), &(v), sizeof(gdn_v16))

/* Pass 1 over rows [r0, r1) of nv vectors at column c: acc += (S decay) k. */
static inline __attribute__((always_inline)) void
gdn_tile_kv(const float *S, size_t ld, uint32_t r0, uint32_t r1, uint32_t c, const float *k,
            float decay, float *acc, const int nv)
{
    gdn_v16 a[GDN_NV_MAX];
#pragma GCC unroll 4
    for (int b = 0; b < nv; b++)
        GDN_LD(a[b], acc + c + 16 * b);
    for (uint32_t r = r0; r < r1; r++) {
        const float *row = S + (size_t)r * ld + c;
        const float kr = k[r];
#pragma GCC unroll 4
        for (int b = 0; b < nv; b++) {
            gdn_v16 x;
            GDN_LD(x, row + 16 * b);
            x = x * decay;
            a[b] = a[b] + x * kr;
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < nv; b++)
        GDN_ST(acc + c + 16 * b, a[b]);
}

/* Pass 2 over rows [r0, r1) of nv vectors at column c: S = S decay + u k, o += S q. */
static inline __attribute__((always_inline)) void
gdn_tile_upd(float *S, size_t ld, uint32_t r0, uint32_t r1, uint32_t c, const float *q,
             const float *k, const float *u, float decay, float *o, const int nv)
{
    gdn_v16 a[GDN_NV_MAX], uv[GDN_NV_MAX];
#pragma GCC unroll 4
    for (int b = 0; b < nv; b++) {
        GDN_LD(a[b], o + c + 16 * b);
        GDN_LD(uv[b], u + c + 16 * b);
    }
    for (uint32_t r = r0; r < r1; r++) {
        float *row = S + (size_t)r * ld + c;
        const float kr = k[r], qr = q[r];
#pragma GCC unroll 4
        for (int b = 0; b < nv; b++) {
            gdn_v16 x;
            GDN_LD(x, row + 16 * b);
            x = x * decay;
            x = x + uv[b] * kr;
            GDN_ST(row + 16 * b, x);
            a[b] = a[b] + x * qr;
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < nv; b++)
        GDN_ST(o + c + 16 * b, a[b]);
}

static inline __attribute__((always_inline)) void
gdn_delta_body(float *S, size_t ld, uint32_t K, uint32_t n, const float *q, const float *k,
               const float *v, float decay, float beta, float *o, const int nv)
{
    float acc[GDN_SPAN] __attribute__((aligned(64)));
    float u[GDN_SPAN] __attribute__((aligned(64)));
    const uint32_t nvec = n / 16 * 16, ngrp = nvec / (16 * (uint32_t)nv) * (16 * (uint32_t)nv);

    for (uint32_t i = 0; i < n; i++)
        acc[i] = 0.0f;
    for (uint32_t r0 = 0; r0 < K; r0 += GDN_TILE) {
        const uint32_t r1 = K - r0 < GDN_TILE ? K : r0 + GDN_TILE;
        uint32_t c = 0;
        for (; c < ngrp; c += 16 * (uint32_t)nv)
            gdn_tile_kv(S, ld, r0, r1, c, k, decay, acc, nv);
        for (; c < nvec; c += 16)
            gdn_tile_kv(S, ld, r0, r1, c, k, decay, acc, 1);
        for (; c < n; c++)
            for (uint32_t r = r0; r < r1; r++) {
                const float x = S[(size_t)r * ld + c] * decay;
                acc[c] = acc[c] + x * k[r];
            }
    }
    for (uint32_t i = 0; i < n; i++) {
        u[i] = (v[i] - acc[i]) * beta;
        o[i] = 0.0f;
    }
    for (uint32_t r0 = 0; r0 < K; r0 += GDN_TILE) {
        const uint32_t r1 = K - r0 < GDN_TILE ? K : r0 + GDN_TILE;
        uint32_t c = 0;
        for (; c < ngrp; c += 16 * (uint32_t)nv)
            gdn_tile_upd(S, ld, r0, r1, c, q, k, u, decay, o, nv);
        for (; c < nvec; c += 16)
            gdn_tile_upd(S, ld, r0, r1, c, q, k, u, decay, o, 1);
        for (; c < n; c++)
            for (uint32_t r = r0; r < r1; r++) {
                float *s = S + (size_t)r * ld + c;
                float x = *s * decay;
                x = x + u[c] * k[r];
                *s = x;
                o[c] = o[c] + x * q[r];
            }
    }
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f"))) static void
gdn_delta_avx512(float *S, size_t ld, uint32_t K, uint32_t n, const float *q, const float *k,
                 const float *v, float decay, float beta, float *o)
{
    gdn_delta_body(S, ld, K, n, q, k, v, decay, beta, o, 4);
}

__attribute__((target("avx2,fma"))) static void
gdn_delta_avx2(float *S, size_t ld, uint32_t K, uint32_t n, const float *q, const float *k,
               const float *v, float decay, float beta, float *o)
{
    gdn_delta_body(S, ld, K, n, q, k, v, decay, beta, o, 2);
}
#endif

static void
gdn_delta_generic(float *S, size_t ld, uint32_t K, uint32_t n, const float *q, const float *k,
                  const float *v, float decay, float beta, float *o)
{
    gdn_delta_body(S, ld, K, n, q, k, v, decay, beta, o, 1);
}

static gdn_delta_fn
gdn_delta_pick(be_cpu_isa isa)
{
#if defined(__x86_64__) || defined(__i386__)
    if (isa == BE_CPU_ISA_AVX512)
        return gdn_delta_avx512;
    if (isa == BE_CPU_ISA_AVX2)
        return gdn_delta_avx2;
#endif
    (void)isa;
    return gdn_delta_generic;
}

/*
 * Columns per recurrence task for this pass: a whole value head (up to
 * GDN_SPAN) while there are at least two tasks per thread, else halved
 * (a multiple of 16, at least 64) until there are. Only speed depends on
 * it (see gdn_delta_body).
 */
static void
gdn_delta_split(be_ctx *c)
{
    const uint64_t want = 2 * (uint64_t)c->b.n_threads;
    uint32_t span = c->Vd < GDN_SPAN ? c->Vd : GDN_SPAN;
    while (span > 64 && (uint64_t)c->b.n_segs * c->HV * ((c->Vd + span - 1) / span) < want)
        span = (span / 2 + 15) / 16 * 16;
    c->span = span;
    c->nspan = (c->Vd + span - 1) / span;
}

/*
 * The recurrence for one (segment, value head, column span), tokens in
 * order; S [K][Vd] row-major for the head, the span's columns independent
 * of the others (gdn_delta_body).
 */
static void
gdn_stage_delta(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const uint32_t K = c->K, Vd = c->Vd, HV = c->HV;
    const uint32_t per_seg = HV * c->nspan;
    const be_cpu_seg *sg = &c->b.segs[task / per_seg];
    const uint32_t j = (task % per_seg) / c->nspan;
    const uint32_t c0 = (task % c->nspan) * c->span;
    const uint32_t nc = Vd - c0 < c->span ? Vd - c0 : c->span;
    const uint32_t kh = j / (HV / c->H);
    float *S = gdn_slot_layer(c, sg->slot, c->layer) + gdn_off_S(c) + (size_t)j * K * Vd + c0;

    for (uint32_t t = sg->t0; t < sg->t0 + sg->n; t++) {
        const float *q = c->q + (size_t)t * c->KD + (size_t)kh * K;
        const float *k = c->k + (size_t)t * c->KD + (size_t)kh * K;
        const float *v = c->v + (size_t)t * c->VD + (size_t)j * Vd + c0;
        float *out = c->o + (size_t)t * c->VD + (size_t)j * Vd + c0;
        c->delta(S, Vd, K, nc, q, k, v, c->ar[(size_t)t * HV + j], c->br[(size_t)t * HV + j], out);
    }
}

/* Per token and value head: RMSNorm * o_norm, times SiLU(g) with use_gate. */
static void
gdn_stage_onorm(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const gdn_layer *ly = &c->layers[c->layer];
    const uint32_t Vd = c->Vd, VD = c->VD;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        float *o = c->o + (size_t)t * VD;
        for (uint32_t j = 0; j < c->HV; j++)
            be_cpu_rmsnorm(o + (size_t)j * Vd, ly->o_norm, Vd, c->g->norm_eps, o + (size_t)j * Vd);
        if (c->g->use_gate) {
            const float *g = c->gr + (size_t)t * VD;
            be_cpu_mul_silu(c->b.isa, o, g, VD);
        }
    }
}

static void
gdn_stage_swiglu(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        float *hg = c->hg + (size_t)t * c->F;
        const float *hu = c->hu + (size_t)t * c->F;
        be_cpu_silu_mul(c->b.isa, hg, hu, c->F);
    }
}

/* relu(h)^2 over n floats in place (transformers' relu2: relu, then square). */
static inline void
gdn_relu2(float *h, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        const float r = h[i] > 0.0f ? h[i] : 0.0f;
        h[i] = r * r;
    }
}

static void
gdn_stage_relu2(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++)
        gdn_relu2(c->hg + (size_t)t * c->F, c->F);
}

/* Final RMSNorm of the logits positions into xn rows 0..n_logits-1. */
static void
gdn_stage_final_norm(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    uint32_t i0, i1;
    be_cpu_logits_range(&c->b, task, &i0, &i1);
    for (uint32_t i = i0; i < i1; i++)
        gdn_norm(c, c->x + (size_t)c->b.lpos[i] * c->C, c->norm, c->norm_b,
                 c->xn + (size_t)i * c->C);
}

/* ------------------------------------------------------------------------ */
/* attention layers (hybrid models)                                          */
/* ------------------------------------------------------------------------ */

/*
 * RoPE (GPT-NeoX rotate-half over the first rope_dim dims of each head;
 * the rest pass through) of n heads of Da at position pos, in place.
 */
static void
gdn_rope(const be_ctx *c, float *x, uint32_t n, uint32_t pos)
{
    const uint32_t half = c->rope_half;
    for (uint32_t i = 0; i < half; i++) {
        const double ang = (double)pos * c->inv_freq[i];
        const float cs = (float)cos(ang), sn = (float)sin(ang);
        for (uint32_t h = 0; h < n; h++) {
            float *p = x + (size_t)h * c->Da;
            const float x1 = p[i], x2 = p[i + half];
            p[i] = x1 * cs - x2 * sn;
            p[i + half] = x1 * sn + x2 * cs;
        }
    }
}

/* Per token: biases, q / k norm, RoPE, then K / V appended to the slot's pages. */
static void
gdn_stage_att_prep(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const gdn_layer *ly = &c->layers[c->layer];
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        float *q = c->aq + (size_t)t * c->QD;
        float *k = c->ak + (size_t)t * c->KVD;
        const float *v = c->av + (size_t)t * c->KVD;
        if (c->aqg != NULL) { /* per head: the query, then its gate */
            const float *src = c->aqg + (size_t)t * 2 * c->QD;
            float *gt = c->ag + (size_t)t * c->QD;
            for (uint32_t h = 0; h < c->Hq; h++) {
                memcpy(q + (size_t)h * c->Da, src + (size_t)h * 2 * c->Da, sizeof(float) * c->Da);
                memcpy(gt + (size_t)h * c->Da, src + ((size_t)h * 2 + 1) * c->Da,
                       sizeof(float) * c->Da);
            }
        }
        if (ly->bq != NULL) {
            float *vv = c->av + (size_t)t * c->KVD;
            for (uint32_t i = 0; i < c->QD; i++)
                q[i] += ly->bq[i];
            for (uint32_t i = 0; i < c->KVD; i++) {
                k[i] += ly->bk[i];
                vv[i] += ly->bv[i];
            }
        }
        if (ly->nq != NULL) {
            for (uint32_t h = 0; h < c->Hq; h++)
                be_cpu_rmsnorm(q + (size_t)h * c->Da, ly->nq, c->Da, c->g->attn_norm_eps,
                               q + (size_t)h * c->Da);
            for (uint32_t h = 0; h < c->Hkv; h++)
                be_cpu_rmsnorm(k + (size_t)h * c->Da, ly->nk, c->Da, c->g->attn_norm_eps,
                               k + (size_t)h * c->Da);
        }
        const uint32_t pos = c->tpos[t];
        gdn_rope(c, q, c->Hq, pos);
        gdn_rope(c, k, c->Hkv, pos);
        float *dst =
            be_cpu_kv_tok(&c->kv, c->b.segs[c->b.tseg[t]].slot, pos) + (size_t)ly->idx * 2 * c->KVD;
        memcpy(dst, k, sizeof(float) * c->KVD);
        memcpy(dst + c->KVD, v, sizeof(float) * c->KVD);
    }
}

/*
 * Causal softmax attention of the queries of block bk (each over positions
 * 0..pos of its token) into ao, by be_cpu_attn (the ops per query and why
 * the block shape changes no bit are there); scr is the task's scratch.
 */
static void
gdn_att_run(const be_ctx *c, const gdn_att_blk *bk, float *scr)
{
    be_cpu_attn_blk a;
    const uint32_t nq = bk->nt * bk->nh;
    a.kv = &c->kv;
    a.slot = c->b.segs[c->b.tseg[bk->t0]].slot;
    a.koff = (size_t)c->layers[c->layer].idx * 2 * c->KVD +
             (size_t)(bk->h0 / (c->Hq / c->Hkv)) * c->Da;
    a.voff = a.koff + c->KVD;
    a.Da = c->Da;
    a.scale = c->att_scale;
    a.nq = nq;
    for (uint32_t i = 0; i < nq; i++) {
        const uint32_t t = bk->t0 + i / bk->nh, h = bk->h0 + i % bk->nh;
        a.q[i] = c->aq + (size_t)t * c->QD + (size_t)h * c->Da;
        a.o[i] = c->ao + (size_t)t * c->QD + (size_t)h * c->Da;
        a.nn[i] = c->tpos[t] + 1;
    }
    c->att(&a, scr);
}

/*
 * One task of the attention region per thread, scratch row = task: each
 * takes the next block (c->att_next) until none is left. Which task runs a
 * block changes no bit (gdn_att_run).
 */
static void
gdn_stage_att(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    float *scr = c->scr + (size_t)task * be_cpu_attn_scr_floats(c->scr_len, c->Da);
    for (;;) {
        const uint32_t i = atomic_fetch_add_explicit(&c->att_next, 1u, memory_order_relaxed);
        if (i >= c->n_att_blks)
            break;
        gdn_att_run(c, &c->att_blks[i], scr);
    }
}

/*
 * The pass's attention blocks of up to nt tokens of a segment times nh
 * query heads of a KV head (gdn_att_run), written to att_blks when fill;
 * returns how many.
 */
static uint32_t
gdn_att_blocks(be_ctx *c, uint32_t nt, uint32_t nh, bool fill)
{
    const be_cpu_base *b = &c->b;
    const uint32_t G = c->Hq / c->Hkv;
    uint32_t n = 0;
    for (uint32_t s = 0; s < b->n_segs; s++) {
        const be_cpu_seg *sg = &b->segs[s];
        for (uint32_t t = 0; t < sg->n; t += nt)
            for (uint32_t g = 0; g < c->Hkv; g++)
                for (uint32_t h = 0; h < G; h += nh, n++)
                    if (fill)
                        c->att_blks[n] = (gdn_att_blk){.t0 = sg->t0 + t,
                                                       .nt = sg->n - t < nt ? sg->n - t : nt,
                                                       .h0 = g * G + h,
                                                       .nh = G - h < nh ? G - h : nh};
    }
    return n;
}

/* attn_gate: the attention output times sigmoid(gate), per token. */
static void
gdn_stage_att_gate(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        float *o = c->ao + (size_t)t * c->QD;
        const float *g = c->ag + (size_t)t * c->QD;
        be_cpu_mul_sigmoid(c->b.isa, o, g, c->QD);
    }
}

/* The absolute position of every pass token: its slot's n_ctx before the step + its index. */
static void
gdn_att_positions(be_ctx *c)
{
    const be_cpu_base *b = &c->b;
    for (uint32_t t = 0; t < b->T; t++) {
        const be_cpu_seg *sg = &b->segs[b->tseg[t]];
        c->tpos[t] = c->kv.slots[sg->slot].pos0 + sg->off + (t - sg->t0);
    }
}

static void
gdn_layer_attention(be_ctx *c, const gdn_layer *ly)
{
    be_cpu_base *b = &c->b;
    const uint32_t T = b->T;
    be_cpu_job_add(b, &ly->wq, c->xn, T, c->aqg != NULL ? c->aqg : c->aq, NULL, BE_CPU_EPI_STORE);
    be_cpu_job_add(b, &ly->wk, c->xn, T, c->ak, NULL, BE_CPU_EPI_STORE);
    be_cpu_job_add(b, &ly->wv, c->xn, T, c->av, NULL, BE_CPU_EPI_STORE);
    be_cpu_jobs_run(b);
    be_cpu_tok_run(b, gdn_stage_att_prep, c); /* every K / V of the pass is in the pool ... */
    /*
     * Blocks: all the heads of a KV head times as many tokens as fit in
     * GDN_ATT_QMAX queries, halved (tokens first) while there are fewer
     * blocks than 2 per thread (decode: few tokens). The shape only shares
     * reads; it changes no bit.
     */
    const uint32_t G = c->Hq / c->Hkv;
    uint32_t nh = G < GDN_ATT_QMAX ? G : GDN_ATT_QMAX, nt = GDN_ATT_QMAX / nh;
    while ((nt > 1 || nh > 1) && gdn_att_blocks(c, nt, nh, false) < 2 * b->n_threads) {
        if (nt > 1)
            nt = (nt + 1) / 2;
        else
            nh = (nh + 1) / 2;
    }
    c->n_att_blks = gdn_att_blocks(c, nt, nh, true);
    atomic_store_explicit(&c->att_next, 0u, memory_order_relaxed);
    const uint32_t n = c->n_att_blks < c->att_tasks ? c->n_att_blks : c->att_tasks;
    be_cpu_pool_run(b->pool, gdn_stage_att, c, n); /* ... before any token attends */
    if (c->aqg != NULL)
        be_cpu_tok_run(b, gdn_stage_att_gate, c);
    gdn_add_out(c, &ly->wo, c->ao);
}

/*
 * The step's KV pages (be_cpu_base pre_step): the attention scratch first
 * (an allocation, not a state change), then every row's pages (a reset
 * row's old ones given back first), refused whole when the pool can't
 * supply them.
 */
static wk_err
gdn_pre_step(be_cpu_base *base, const be_row *rows, size_t n, wk_diag *d)
{
    be_ctx *c = (be_ctx *)base;
    uint64_t longest = 0;
    const uint64_t cap = (uint64_t)c->kv.pages_total * c->kv.page_tokens;
    for (size_t i = 0; i < n; i++)
        if (rows[i].slot != 0) {
            uint64_t ctx =
                (rows[i].reset ? 0 : (uint64_t)c->kv.slots[rows[i].slot].n_ctx) + rows[i].n_tokens;
            longest = ctx > longest ? ctx : longest;
        }
    if (longest > cap)
        longest = cap; /* such a row is refused below */
    if (longest > c->scr_len) {
        size_t len = ((size_t)longest + 255) / 256 * 256;
        float *p = be_cpu_alloc_f((size_t)c->att_tasks * be_cpu_attn_scr_floats(len, c->Da));
        if (p == NULL)
            return wk_diag_set(
                d, WK_ENOMEM, "cpu backend: out of memory for attention scratch (%zu tokens)", len);
        free(c->scr);
        c->scr = p;
        c->scr_len = len;
    }
    return be_kv_reserve(&c->kv, rows, n, d);
}

/* ------------------------------------------------------------------------ */
/* a pass                                                                    */
/* ------------------------------------------------------------------------ */

/* A Gated DeltaNet mixer over the pass (xn holds attn_norm's output), added into x. */
static void
gdn_layer_delta(be_ctx *c, const gdn_layer *ly)
{
    be_cpu_base *b = &c->b;
    const uint32_t T = b->T;
    be_cpu_job_add(b, &ly->wq, c->xn, T, c->qr, NULL, BE_CPU_EPI_STORE);
    be_cpu_job_add(b, &ly->wk, c->xn, T, c->kr, NULL, BE_CPU_EPI_STORE);
    be_cpu_job_add(b, &ly->wv, c->xn, T, c->vr, NULL, BE_CPU_EPI_STORE);
    be_cpu_job_add(b, &ly->wa, c->xn, T, c->ar, NULL, BE_CPU_EPI_STORE);
    be_cpu_job_add(b, &ly->wb, c->xn, T, c->br, NULL, BE_CPU_EPI_STORE);
    if (c->g->use_gate)
        be_cpu_job_add(b, &ly->wg, c->xn, T, c->gr, NULL, BE_CPU_EPI_STORE);
    be_cpu_jobs_run(b);

    be_cpu_tok_run(b, gdn_stage_conv, c);
    gdn_save_conv(c); /* after every token read the old history */
    gdn_delta_split(c);
    be_cpu_pool_run(b->pool, gdn_stage_delta, c, b->n_segs * c->HV * c->nspan);
    be_cpu_tok_run(b, gdn_stage_onorm, c);
    gdn_add_out(c, &ly->wo, c->o);
}

/* Mamba2 conv + SiLU for one (segment, channel block) (be_cpu_mamba2.h). */
static void
gdn_stage_m2_conv(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const be_cpu_seg *sg = &c->b.segs[task / c->m2_conv_blocks];
    const uint32_t CD = c->m2d.CD;
    const uint32_t c0 = (task % c->m2_conv_blocks) * GDN_M2_CONV_BLOCK;
    const uint32_t c1 = c0 + GDN_M2_CONV_BLOCK < CD ? c0 + GDN_M2_CONV_BLOCK : CD;
    be_cpu_m2_conv(&c->m2d, &c->layers[c->layer].m2, c->m2p, c->m2x, sg->t0, sg->n,
                   gdn_slot_layer(c, sg->slot, c->layer), c0, c1);
}

/* Mamba2 scan for one (segment, head). */
static void
gdn_stage_m2_scan(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const be_cpu_seg *sg = &c->b.segs[task / c->m2d.H];
    be_cpu_m2_scan(&c->m2d, &c->layers[c->layer].m2, c->m2_scan, c->m2p, c->m2x, c->m2y, sg->t0,
                   sg->n, gdn_slot_layer(c, sg->slot, c->layer) + c->m2_conv_floats,
                   task % c->m2d.H);
}

/* Mamba2 gate and grouped RMSNorm per token. */
static void
gdn_stage_m2_gate(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++)
        be_cpu_m2_gate(&c->m2d, &c->layers[c->layer].m2, c->m2p, c->m2y, t);
}

/* A Mamba2 mixer over the pass (xn holds attn_norm's output), added into x. */
static void
gdn_layer_mamba2(be_ctx *c, const gdn_layer *ly)
{
    be_cpu_base *b = &c->b;
    const uint32_t T = b->T;
    be_cpu_job_add(b, &ly->m2_in, c->xn, T, c->m2p, NULL, BE_CPU_EPI_STORE);
    be_cpu_jobs_run(b);
    be_cpu_pool_run(b->pool, gdn_stage_m2_conv, c, b->n_segs * c->m2_conv_blocks);
    be_cpu_pool_run(b->pool, gdn_stage_m2_scan, c, b->n_segs * c->m2d.H);
    be_cpu_tok_run(b, gdn_stage_m2_gate, c);
    gdn_add_out(c, &ly->m2_out, c->m2y);
}

/* ------------------------------------------------------------------------ */
/* mixture-of-experts MLP                                                    */
/* ------------------------------------------------------------------------ */

/*
 * Per token: the routing (wrk_moe_route: the chosen experts by ascending
 * index and their weights). Then the shared expert's activation.
 */
static void
gdn_stage_route(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const gdn_moe *mo = c->layers[c->layer].moe;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        float *p = c->rl + (size_t)t * c->moe_E;
        uint32_t *sel = c->sel + (size_t)t * c->moe_k;
        float *w = c->sw + (size_t)t * c->moe_k;
        wrk_moe_route(&mo->rt, p, c->rc + (size_t)t * c->moe_E, sel, w);
        if (mo->Fs > 0 && mo->relu2) {
            gdn_relu2(c->hs + (size_t)t * c->moe_Fs, mo->Fs);
        } else if (mo->Fs > 0) {
            float *hg = c->hs + (size_t)t * c->moe_Fs;
            const float *hu = c->hsu + (size_t)t * c->moe_Fs;
            be_cpu_silu_mul(c->b.isa, hg, hu, mo->Fs);
        }
    }
}

/* The experts' activation (SwiGLU, or relu2 in place) over a range of the gathered rows. */
static void
gdn_stage_expert_swiglu(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const gdn_moe *mo = c->layers[c->layer].moe;
    const uint32_t Fe = mo->Fe, n = c->b.tok_tasks;
    const uint32_t r0 = (uint32_t)((uint64_t)c->moe_rows * task / n);
    const uint32_t r1 = (uint32_t)((uint64_t)c->moe_rows * (task + 1) / n);
    for (uint32_t r = r0; r < r1; r++) {
        float *hg = c->he + (size_t)r * c->moe_Fe;
        if (mo->relu2) {
            gdn_relu2(hg, Fe);
            continue;
        }
        const float *hu = c->hue + (size_t)r * c->moe_Fe;
        be_cpu_silu_mul(c->b.isa, hg, hu, Fe);
    }
}

/*
 * Per token: its experts' outputs times their weights summed in ascending
 * expert order from zero, plus sigmoid(gate) times the shared expert's,
 * added into the residual (transformers' order of operations).
 */
static void
gdn_stage_combine(void *arg, uint32_t task)
{
    be_ctx *c = arg;
    const gdn_moe *mo = c->layers[c->layer].moe;
    const uint32_t C = c->C;
    uint32_t t0, t1;
    be_cpu_tok_range(&c->b, task, &t0, &t1);
    for (uint32_t t = t0; t < t1; t++) {
        float *acc = c->os + (size_t)t * C; /* the shared output (or zeros) is read first */
        float *x = c->x + (size_t)t * C;
        const float sg = mo->Fs == 0 ? 0.0f : mo->sh_gated ? c->sgv[t] : 1.0f;
        float *tmp = c->xn + (size_t)t * C; /* xn is free again: the layer's input is gathered */
        for (uint32_t i = 0; i < C; i++)
            tmp[i] = 0.0f;
        for (uint32_t j = 0; j < mo->k; j++) {
            const float w = c->sw[(size_t)t * c->moe_k + j];
            const float *o = c->oe + (size_t)c->trow[(size_t)t * c->moe_k + j] * C;
            for (uint32_t i = 0; i < C; i++)
                tmp[i] += o[i] * w;
        }
        if (mo->Fs > 0)
            for (uint32_t i = 0; i < C; i++)
                tmp[i] += sg * acc[i];
        if (c->res_mul != 0.0f)
            for (uint32_t i = 0; i < C; i++)
                x[i] += tmp[i] * c->res_mul;
        else
            for (uint32_t i = 0; i < C; i++)
                x[i] += tmp[i];
    }
}

/* A mixture-of-experts MLP over the pass (xn holds mlp_norm's output), added into x. */
static void
gdn_layer_moe(be_ctx *c, const gdn_moe *mo)
{
    be_cpu_base *b = &c->b;
    const uint32_t T = b->T, C = c->C, k = mo->k;
    /* the router and the shared expert, one region */
    be_cpu_job_add_ld(b, &mo->router, c->xn, C, T, c->rl, c->moe_E, BE_CPU_EPI_STORE);
    if (mo->Fs > 0 && mo->relu2) {
        be_cpu_job_add_ld(b, &mo->su, c->xn, C, T, c->hs, c->moe_Fs, BE_CPU_EPI_STORE);
    } else if (mo->Fs > 0) {
        be_cpu_job_add_ld(b, &mo->sg, c->xn, C, T, c->hs, c->moe_Fs, BE_CPU_EPI_STORE);
        be_cpu_job_add_ld(b, &mo->su, c->xn, C, T, c->hsu, c->moe_Fs, BE_CPU_EPI_STORE);
    }
    if (mo->Fs > 0 && mo->sh_gated)
        be_cpu_job_add_ld(b, &mo->sr, c->xn, C, T, c->sgv, 1, BE_CPU_EPI_SIGMOID);
    be_cpu_jobs_run(b);
    be_cpu_tok_run(b, gdn_stage_route, c);
    if (mo->Fs > 0)
        be_cpu_job_add_ld(b, &mo->sd, c->hs, c->moe_Fs, T, c->os, C, BE_CPU_EPI_STORE);
    else
        memset(c->os, 0, sizeof(float) * (size_t)T * C);

    /* the rows of each expert, expert-major, tokens ascending: a counting sort */
    uint32_t *cnt = c->ecnt;
    memset(cnt, 0, sizeof(uint32_t) * (mo->E + 1));
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t j = 0; j < k; j++)
            cnt[c->sel[(size_t)t * c->moe_k + j] + 1]++;
    for (uint32_t e = 0; e < mo->E; e++)
        cnt[e + 1] += cnt[e];
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t j = 0; j < k; j++) {
            const uint32_t e = c->sel[(size_t)t * c->moe_k + j];
            const uint32_t r = cnt[e]++;
            c->trow[(size_t)t * c->moe_k + j] = r;
            memcpy(c->xe + (size_t)r * C, c->xn + (size_t)t * C, sizeof(float) * C);
        }
    /* cnt[e] is now the end of expert e's rows, its start cnt[e - 1] (0 for e = 0) */
    c->moe_rows = T * k;
    for (uint32_t e = 0; e < mo->E; e++) {
        const uint32_t r0 = e ? cnt[e - 1] : 0, n = cnt[e] - r0;
        if (n == 0)
            continue;
        /* a full region runs before the next job is queued (be_cpu_job_add_ld) */
        if (mo->relu2) { /* up into he, activated in place */
            be_cpu_job_add_ld(b, &mo->up[e], c->xe + (size_t)r0 * C, C, n,
                              c->he + (size_t)r0 * c->moe_Fe, c->moe_Fe, BE_CPU_EPI_STORE);
            continue;
        }
        be_cpu_job_add_ld(b, &mo->gate[e], c->xe + (size_t)r0 * C, C, n,
                          c->he + (size_t)r0 * c->moe_Fe, c->moe_Fe, BE_CPU_EPI_STORE);
        be_cpu_job_add_ld(b, &mo->up[e], c->xe + (size_t)r0 * C, C, n,
                          c->hue + (size_t)r0 * c->moe_Fe, c->moe_Fe, BE_CPU_EPI_STORE);
    }
    be_cpu_jobs_run(b);
    uint32_t n_tasks = c->moe_rows < b->n_threads ? c->moe_rows : b->n_threads;
    b->tok_tasks = n_tasks;
    be_cpu_pool_run(b->pool, gdn_stage_expert_swiglu, c, n_tasks);
    for (uint32_t e = 0; e < mo->E; e++) {
        const uint32_t r0 = e ? cnt[e - 1] : 0, n = cnt[e] - r0;
        if (n == 0)
            continue;
        be_cpu_job_add_ld(b, &mo->down[e], c->he + (size_t)r0 * c->moe_Fe, c->moe_Fe, n,
                          c->oe + (size_t)r0 * C, C, BE_CPU_EPI_STORE);
    }
    be_cpu_jobs_run(b);
    be_cpu_tok_run(b, gdn_stage_combine, c);
}

static void
gdn_pass(be_cpu_base *base)
{
    be_ctx *c = (be_ctx *)base;
    be_cpu_base *b = &c->b;
    const uint32_t T = b->T;

    be_cpu_tok_run(b, gdn_stage_embed, c);
    if (c->n_attn > 0)
        gdn_att_positions(c);
    for (uint32_t l = 0; l < c->L; l++) {
        const gdn_layer *ly = &c->layers[l];
        c->layer = l;

        if (ly->mixer != WRK_MIXER_NONE)
            be_cpu_tok_run(b, gdn_stage_attn_norm, c);
        switch (ly->mixer) {
        case WRK_MIXER_GDN:
            gdn_layer_delta(c, ly);
            break;
        case WRK_MIXER_ATTN:
            gdn_layer_attention(c, ly);
            break;
        case WRK_MIXER_MAMBA2:
            gdn_layer_mamba2(c, ly);
            break;
        case WRK_MIXER_RWKV7:
            gdn_add_out(c, &ly->rw.wo, be_cpu_rw7_tmix(&c->rw7, &ly->rw, c->xn, ly->soff));
            break;
        case WRK_MIXER_NONE:
            break;
        }

        if (ly->mlp == WRK_MLP_NONE)
            continue;
        be_cpu_tok_run(b, gdn_stage_mlp_norm, c);
        if (ly->mlp == WRK_MLP_MOE) {
            gdn_layer_moe(c, ly->moe);
            continue;
        }
        if (ly->mlp == WRK_MLP_RWKV7) {
            gdn_add_out(c, &ly->rw.fv, be_cpu_rw7_cmix(&c->rw7, &ly->rw, c->xn, ly->soff));
            continue;
        }
        if (ly->mlp == WRK_MLP_RELU2) {
            be_cpu_job_add(b, &ly->up, c->xn, T, c->hg, NULL, BE_CPU_EPI_STORE);
            be_cpu_jobs_run(b);
            be_cpu_tok_run(b, gdn_stage_relu2, c);
        } else {
            be_cpu_job_add(b, &ly->gate, c->xn, T, c->hg, NULL, BE_CPU_EPI_STORE);
            be_cpu_job_add(b, &ly->up, c->xn, T, c->hu, NULL, BE_CPU_EPI_STORE);
            be_cpu_jobs_run(b);
            be_cpu_tok_run(b, gdn_stage_swiglu, c);
        }
        gdn_add_out(c, &ly->down, c->hg);
    }

    be_cpu_logits_run(b, gdn_stage_final_norm, c, &c->head, c->xn);
    gdn_logits_scale(c);
}

/* ------------------------------------------------------------------------ */
/* open / close                                                              */
/* ------------------------------------------------------------------------ */

static void
gdn_close(be_cpu_base *b)
{
    be_ctx *c = (be_ctx *)b; /* b is the context's first member */
    if (c == NULL)
        return;
    be_cpu_base_close(&c->b);
    if (c->layers != NULL) {
        for (uint32_t l = 0; l < c->L; l++) {
            gdn_layer *ly = &c->layers[l];
            be_cpu_mat *mats[] = {&ly->wq, &ly->wk,   &ly->wv, &ly->wa,   &ly->wb,    &ly->wg,
                                  &ly->wo, &ly->gate, &ly->up, &ly->down, &ly->m2_in, &ly->m2_out};
            for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++)
                be_cpu_mat_free(mats[i]);
            be_cpu_rw7_mats_free(&ly->rw);
            gdn_moe *mo = ly->moe;
            if (mo == NULL)
                continue;
            for (uint32_t e = 0; e < mo->E && mo->gate != NULL; e++) {
                be_cpu_mat_free(&mo->gate[e]);
                be_cpu_mat_free(&mo->up[e]);
                be_cpu_mat_free(&mo->down[e]);
            }
            be_cpu_mat *sm[] = {&mo->router, &mo->sg, &mo->su, &mo->sd, &mo->sr};
            for (size_t i = 0; i < sizeof(sm) / sizeof(sm[0]); i++)
                be_cpu_mat_free(sm[i]);
            free(mo->gate);
            free(mo->up);
            free(mo->down);
            wrk_moe_route_close(&mo->rt);
            free(mo);
        }
    }
    be_cpu_mat_free(&c->head);
    free(c->layers);
    free(c->vecs);
    float *bufs[] = {c->x,  c->xn, c->qr, c->kr, c->vr, c->q,  c->k,  c->v,  c->ar,
                     c->br, c->gr, c->o,  c->hg, c->hu, c->aq, c->ak, c->av, c->ao,
                     c->aqg, c->ag, c->xr};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
    float *moe_bufs[] = {c->rl, c->rc,  c->sw, c->xe,  c->he,  c->hue, c->oe,
                         c->hs, c->hsu, c->os, c->sgv, c->m2p, c->m2x, c->m2y};
    for (size_t i = 0; i < sizeof(moe_bufs) / sizeof(moe_bufs[0]); i++)
        free(moe_bufs[i]);
    free(c->sel);
    free(c->trow);
    free(c->ecnt);
    be_cpu_kv_fini(&c->kv);
    free(c->inv_freq);
    free(c->tpos);
    free(c->scr);
    free(c->att_blks);
    be_cpu_rw7_close(&c->rw7);
    free(c->weights);
    free(c->own);
    free(c);
}

/* Reads n values of t as fp32 into *vp, advancing it; field points there. */
static wk_err
gdn_vec(const wk_tensor *t, size_t n, float **vp, const float **field)
{
    wk_err e = wk_tensor_read_f32(t, 0, n, *vp);
    if (e != WK_OK)
        return e;
    *field = *vp;
    *vp += n;
    return WK_OK;
}

/* Conv taps stored [D, 1, W] -> fp32 [W][D] at *vp. */
static wk_err
gdn_taps(const wk_tensor *t, uint32_t D, uint32_t W, float *tmp, float **vp, const float **field)
{
    wk_err e = wk_tensor_read_f32(t, 0, (size_t)D * W, tmp);
    if (e != WK_OK)
        return e;
    float *dst = *vp;
    for (uint32_t d = 0; d < D; d++)
        for (uint32_t j = 0; j < W; j++)
            dst[(size_t)j * D + d] = tmp[(size_t)d * W + j];
    *field = dst;
    *vp += (size_t)D * W;
    return WK_OK;
}

/*
 * w += off over n weights (the (1 + weight) RMSNorm convention; fp32, as
 * transformers computes 1.0 + weight.float()). Nothing when off is 0.
 */
static void
gdn_offset(float *w, size_t n, float off)
{
    if (off == 0.0f)
        return;
    for (size_t i = 0; i < n; i++)
        w[i] = off + w[i];
}

/* fp32 floats of layer s's vectors (gdn_load_vectors). */
static size_t
gdn_layer_vec_floats(const be_ctx *c, const wrk_gdn_layer *s)
{
    const wrk_gdn *g = c->g;
    const size_t C = c->C;
    size_t n = ((s->mixer != WRK_MIXER_NONE ? C : 0) + (s->mlp != WRK_MLP_NONE ? C : 0)) *
               (g->layer_norm ? 2 : 1);
    switch (s->mixer) {
    case WRK_MIXER_GDN:
        n += c->Vd + 2 * (size_t)c->HV + (size_t)c->W * (2 * (size_t)c->KD + c->VD);
        break;
    case WRK_MIXER_ATTN:
        n += (g->qkv_bias ? c->QD + 2 * (size_t)c->KVD : 0) + (g->qk_norm ? 2 * (size_t)c->Da : 0);
        break;
    case WRK_MIXER_MAMBA2:
        n += (size_t)c->m2d.CD * (c->m2d.K + 1) + 3 * (size_t)c->m2d.H + c->m2d.DI;
        break;
    case WRK_MIXER_RWKV7:
        n += be_cpu_rw7_vec_floats(c->C);
        break;
    case WRK_MIXER_NONE:
        break;
    }
    return n;
}

/* A Mamba2 mixer's vectors: conv taps [CD][K] as stored, bias (zeros when absent), A = -exp(A_log).
 */
static wk_err
gdn_load_m2(be_ctx *c, const wrk_gdn_layer *s, gdn_layer *ly, float **vp)
{
    const be_cpu_m2_dims *m = &c->m2d;
    wk_err e;
    if ((e = gdn_vec(s->m2.conv_w, (size_t)m->CD * m->K, vp, &ly->m2.conv_w)) != WK_OK)
        return e;
    if (s->m2.conv_b != NULL) {
        if ((e = gdn_vec(s->m2.conv_b, m->CD, vp, &ly->m2.conv_b)) != WK_OK)
            return e;
    } else {
        memset(*vp, 0, sizeof(float) * m->CD);
        ly->m2.conv_b = *vp;
        *vp += m->CD;
    }
    if ((e = gdn_vec(s->m2.dt_bias, m->H, vp, &ly->m2.dt_bias)) != WK_OK ||
        (e = gdn_vec(s->m2.A_log, m->H, vp, &ly->m2.A)) != WK_OK ||
        (e = gdn_vec(s->m2.D, m->H, vp, &ly->m2.D)) != WK_OK ||
        (e = gdn_vec(s->m2.gnorm, m->DI, vp, &ly->m2.gnorm)) != WK_OK)
        return e;
    float *A = (float *)ly->m2.A;
    for (uint32_t h = 0; h < m->H; h++)
        A[h] = -expf(A[h]);
    return WK_OK;
}

/*
 * Every layer's fp32 vectors (one block), its kinds and slot offset: the
 * pre-norms of the parts it has, then its mixer's own vectors.
 */
static wk_err
gdn_load_vectors(be_ctx *c, wk_diag *d)
{
    const wrk_gdn *g = c->g;
    const size_t C = c->C, HV = c->HV, KD = c->KD, VD = c->VD, W = c->W;
    size_t total = C * (g->layer_norm ? 2 : 1) + (g->emb_norm != NULL ? 2 * C : 0);
    for (uint32_t l = 0; l < c->L; l++)
        total += gdn_layer_vec_floats(c, &g->layers[l]);
    c->vecs = be_cpu_alloc_f(total);
    float *tmp = be_cpu_alloc_f(W * (KD > VD ? KD : VD) + 1);
    c->layers = calloc(c->L, sizeof(*c->layers));
    if (c->vecs == NULL || tmp == NULL || c->layers == NULL) {
        free(tmp);
        return wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory");
    }
    float *vp = c->vecs;
    wk_err e = gdn_vec(g->norm, C, &vp, &c->norm);
    if (e == WK_OK)
        gdn_offset((float *)c->norm, C, g->norm_offset);
    if (e == WK_OK && g->layer_norm)
        e = gdn_vec(g->norm_b, C, &vp, &c->norm_b);
    if (e == WK_OK && g->emb_norm != NULL && (e = gdn_vec(g->emb_norm, C, &vp, &c->emb_w)) == WK_OK)
        e = gdn_vec(g->emb_norm_b, C, &vp, &c->emb_b);
    uint32_t n_att = 0;
    bool rw_first = true;
    size_t soff = 0;
    for (uint32_t l = 0; l < c->L && e == WK_OK; l++) {
        const wrk_gdn_layer *s = &g->layers[l];
        gdn_layer *ly = &c->layers[l];
        ly->mixer = s->mixer;
        ly->mlp = s->mlp;
        ly->soff = soff;
        soff += (size_t)wrk_gdn_layer_floats(g, l);
        if (s->mixer == WRK_MIXER_ATTN)
            ly->idx = n_att++;
        if (s->mixer != WRK_MIXER_NONE &&
            (e = gdn_vec(s->attn_norm, C, &vp, &ly->attn_norm)) != WK_OK)
            break;
        if (s->mlp != WRK_MLP_NONE && (e = gdn_vec(s->mlp_norm, C, &vp, &ly->mlp_norm)) != WK_OK)
            break;
        if (g->layer_norm && ((s->mixer != WRK_MIXER_NONE &&
                               (e = gdn_vec(s->attn_norm_b, C, &vp, &ly->attn_norm_b)) != WK_OK) ||
                              (s->mlp != WRK_MLP_NONE &&
                               (e = gdn_vec(s->mlp_norm_b, C, &vp, &ly->mlp_norm_b)) != WK_OK)))
            break;
        if (ly->attn_norm != NULL)
            gdn_offset((float *)ly->attn_norm, C, g->norm_offset);
        if (ly->mlp_norm != NULL)
            gdn_offset((float *)ly->mlp_norm, C, g->norm_offset);
        if (s->mixer == WRK_MIXER_ATTN) {
            if (g->qkv_bias && ((e = gdn_vec(s->q_bias, c->QD, &vp, &ly->bq)) != WK_OK ||
                                (e = gdn_vec(s->k_bias, c->KVD, &vp, &ly->bk)) != WK_OK ||
                                (e = gdn_vec(s->v_bias, c->KVD, &vp, &ly->bv)) != WK_OK))
                break;
            if (g->qk_norm && ((e = gdn_vec(s->q_norm, c->Da, &vp, &ly->nq)) != WK_OK ||
                               (e = gdn_vec(s->k_norm, c->Da, &vp, &ly->nk)) != WK_OK))
                break;
            if (g->qk_norm) {
                gdn_offset((float *)ly->nq, c->Da, g->norm_offset);
                gdn_offset((float *)ly->nk, c->Da, g->norm_offset);
            }
        } else if (s->mixer == WRK_MIXER_MAMBA2) {
            if ((e = gdn_load_m2(c, s, ly, &vp)) != WK_OK)
                break;
        } else if (s->mixer == WRK_MIXER_RWKV7) {
            if ((e = be_cpu_rw7_load(s->rw, rw_first, c->C, &vp, &ly->rw)) != WK_OK)
                break;
            rw_first = false;
        } else if (s->mixer == WRK_MIXER_GDN) {
            if ((e = gdn_vec(s->o_norm, c->Vd, &vp, &ly->o_norm)) != WK_OK ||
                (e = gdn_vec(s->A_log, HV, &vp, &ly->neg_A)) != WK_OK ||
                (e = gdn_vec(s->dt_bias, HV, &vp, &ly->dt_bias)) != WK_OK ||
                (e = gdn_taps(s->q_conv, c->KD, c->W, tmp, &vp, &ly->cq)) != WK_OK ||
                (e = gdn_taps(s->k_conv, c->KD, c->W, tmp, &vp, &ly->ck)) != WK_OK ||
                (e = gdn_taps(s->v_conv, c->VD, c->W, tmp, &vp, &ly->cv)) != WK_OK)
                break;
            float *na = (float *)ly->neg_A;
            for (size_t j = 0; j < HV; j++)
                na[j] = -expf(na[j]);
        }
    }
    free(tmp);
    if (e != WK_OK)
        return wk_diag_set(d, e, "cpu backend: cannot read a gdn vector tensor");
    return WK_OK;
}

/*
 * Packs the n matrices into one block (huge pages: a decode step streams
 * all of it), laid out here and filled on the pool by be_cpu_pack_run.
 */
static wk_err
gdn_pack_block(be_ctx *c, be_cpu_mat *const *dst, const wrk_mat *const *src, size_t n, wk_diag *d)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t bytes = be_cpu_mat_bytes_as(src[i], c->b.matmul);
        if (bytes == 0)
            return wk_diag_set(d, WK_EINVAL, "cpu backend: %s: cannot pack (dtype %s)",
                               src[i]->t != NULL ? src[i]->t->name : "absent",
                               src[i]->t != NULL ? wk_dtype_name(src[i]->t->dtype) : "none");
        total += bytes;
    }
    if ((c->weights = be_cpu_big_alloc(total)) == NULL)
        return wk_diag_set(d, WK_ENOMEM, "cpu backend: cannot allocate %zu bytes of packed weights",
                           total);
    uint8_t *wp = c->weights;
    for (size_t i = 0; i < n; i++) {
        wk_err e = be_cpu_mat_init_as(dst[i], src[i], wp, c->b.matmul);
        if (e != WK_OK)
            return wk_diag_set(d, e, "cpu backend: cannot pack %s", src[i]->t->name);
        wp += dst[i]->bytes;
        c->packed_bytes += dst[i]->bytes;
    }
    return be_cpu_pack_run(&c->b, dst, src, n, d);
}

static wk_err
gdn_pack(be_ctx *c, wk_diag *d)
{
    const wrk_gdn *g = c->g;
    size_t max = (size_t)c->L * (12 + 14) + 1;
    for (uint32_t l = 0; l < c->L; l++)
        if (g->layers[l].moe != NULL)
            max += 3 * (size_t)g->layers[l].moe->n_experts + 5;
    be_cpu_mat **dst = calloc(max, sizeof(*dst));
    const wrk_mat **src = calloc(max, sizeof(*src));
    wrk_mat head = g->head;
    size_t n = 0;
    if (dst == NULL || src == NULL) {
        free(dst);
        free(src);
        return wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory");
    }
    for (uint32_t l = 0; l < c->L; l++) {
        const wrk_gdn_layer *s = &g->layers[l];
        gdn_layer *ly = &c->layers[l];
        const wrk_mat *sm[] = {&s->q_proj,  &s->k_proj,    &s->v_proj,     &s->a_proj,
                               &s->b_proj,  &s->g_proj,    &s->o_proj,     &s->gate_proj,
                               &s->up_proj, &s->down_proj, &s->m2.in_proj, &s->m2.out_proj};
        be_cpu_mat *dm[] = {&ly->wq, &ly->wk,   &ly->wv, &ly->wa,   &ly->wb,    &ly->wg,
                            &ly->wo, &ly->gate, &ly->up, &ly->down, &ly->m2_in, &ly->m2_out};
        for (size_t i = 0; i < 12; i++) {
            if (sm[i]->t == NULL)
                continue; /* what the layer's kinds do not use (g_proj without use_gate, ...) */
            src[n] = sm[i];
            dst[n] = dm[i];
            n++;
        }
        if (s->rw != NULL)
            n += be_cpu_rw7_mats(s->rw, &ly->rw, src + n, dst + n);
        const wrk_moe *wm = s->moe;
        gdn_moe *mo = ly->moe;
        if (wm == NULL)
            continue;
        src[n] = &wm->router, dst[n] = &mo->router, n++;
        for (uint32_t e = 0; e < wm->n_experts; e++) {
            if (wm->gate[e].t != NULL) /* RELU2 experts have none */
                src[n] = &wm->gate[e], dst[n] = &mo->gate[e], n++;
            src[n] = &wm->up[e], dst[n] = &mo->up[e], n++;
            src[n] = &wm->down[e], dst[n] = &mo->down[e], n++;
        }
        if (wm->shared_ffn > 0) {
            if (wm->sh_gate.t != NULL)
                src[n] = &wm->sh_gate, dst[n] = &mo->sg, n++;
            src[n] = &wm->sh_up, dst[n] = &mo->su, n++;
            src[n] = &wm->sh_down, dst[n] = &mo->sd, n++;
            if (wm->sh_router.t != NULL)
                src[n] = &wm->sh_router, dst[n] = &mo->sr, n++;
        }
    }
    /*
     * Tied: after --fp32 the embedding field holds the converted copy; after
     * --quantize q8_0 the head field holds its own Q8_0 copy.
     */
    if (g->tied && g->head.t->dtype != WK_DTYPE_Q8_0)
        head = (wrk_mat){g->emb, c->C, g->vocab_size, false};
    src[n] = &head;
    dst[n] = &c->head;
    n++;
    wk_err e = gdn_pack_block(c, dst, src, n, d);
    free(dst);
    free(src);
    return e;
}

/*
 * The mixture-of-experts layers: their packed-matrix holders (filled by
 * gdn_pack) and the pass scratch, sized by the largest E, k, Fe, Fs.
 */
static wk_err
gdn_open_moe(be_ctx *c, wk_diag *d)
{
    const wrk_gdn *g = c->g;
    for (uint32_t l = 0; l < c->L; l++) {
        const wrk_moe *wm = g->layers[l].moe;
        if (wm == NULL)
            continue;
        gdn_moe *mo = calloc(1, sizeof(*mo));
        if (mo == NULL)
            return wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory");
        c->layers[l].moe = mo;
        wk_err e = wrk_moe_route_open(&mo->rt, wm, "cpu backend", l, d);
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
            return wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory");
        c->moe_E = mo->E > c->moe_E ? mo->E : c->moe_E;
        c->moe_k = mo->k > c->moe_k ? mo->k : c->moe_k;
        c->moe_Fe = mo->Fe > c->moe_Fe ? mo->Fe : c->moe_Fe;
        c->moe_Fs = mo->Fs > c->moe_Fs ? mo->Fs : c->moe_Fs;
    }
    if (c->moe_k == 0)
        return WK_OK;
    const size_t cap = c->b.cap, rows = cap * c->moe_k;
    if ((c->rl = be_cpu_alloc_f(cap * c->moe_E)) == NULL ||
        (c->rc = be_cpu_alloc_f(cap * c->moe_E)) == NULL ||
        (c->sw = be_cpu_alloc_f(rows)) == NULL || (c->xe = be_cpu_alloc_f(rows * c->C)) == NULL ||
        (c->he = be_cpu_alloc_f(rows * c->moe_Fe)) == NULL ||
        (c->hue = be_cpu_alloc_f(rows * c->moe_Fe)) == NULL ||
        (c->oe = be_cpu_alloc_f(rows * c->C)) == NULL ||
        (c->hs = be_cpu_alloc_f(cap * (c->moe_Fs ? c->moe_Fs : 1))) == NULL ||
        (c->hsu = be_cpu_alloc_f(cap * (c->moe_Fs ? c->moe_Fs : 1))) == NULL ||
        (c->os = be_cpu_alloc_f(cap * c->C)) == NULL || (c->sgv = be_cpu_alloc_f(cap)) == NULL ||
        (c->sel = calloc(rows, sizeof(uint32_t))) == NULL ||
        (c->trow = calloc(rows, sizeof(uint32_t))) == NULL ||
        (c->ecnt = calloc((size_t)c->moe_E + 1, sizeof(uint32_t))) == NULL)
        return wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory for expert buffers");
    return WK_OK;
}

/* The hybrid parts: KV pool (cfg->kv_pages, else GDN_KV_DEF_CTX tokens a slot), RoPE, buffers. */
static wk_err
gdn_open_attention(be_ctx *c, const be_config *cfg, wk_diag *d)
{
    const uint64_t def = ((uint64_t)(c->b.n_slots - 1) * GDN_KV_DEF_CTX + GDN_KV_PAGE_TOKENS - 1) /
                         GDN_KV_PAGE_TOKENS;
    uint64_t pages = cfg->kv_pages ? cfg->kv_pages : def;
    if (pages > UINT32_MAX / GDN_KV_PAGE_TOKENS)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: kv_pages %llu over %u",
                           (unsigned long long)pages, UINT32_MAX / GDN_KV_PAGE_TOKENS);
    wk_err e = be_cpu_kv_init(&c->kv, c->b.n_slots, (size_t)c->n_attn * 2 * c->KVD,
                              GDN_KV_PAGE_TOKENS, (uint32_t)pages, d);
    if (e != WK_OK)
        return e;
    c->att_scale =
        c->g->attn_scale != 0.0f ? c->g->attn_scale : (float)(1.0 / sqrt((double)c->Da));
    c->rope_half = c->g->rope_dim / 2;
    c->inv_freq = malloc(sizeof(double) * (c->rope_half ? c->rope_half : 1));
    c->tpos = calloc(c->b.cap, sizeof(uint32_t));
    c->att_tasks = c->b.n_threads;
    c->att_blks = calloc((size_t)c->b.cap * c->Hq, sizeof(gdn_att_blk));
    if (c->inv_freq == NULL || c->tpos == NULL || c->att_blks == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < c->rope_half; i++)
        c->inv_freq[i] = pow(c->g->rope_theta, -(double)(2 * i) / (double)c->g->rope_dim);
    const size_t cap = c->b.cap;
    if ((c->aq = be_cpu_alloc_f(cap * c->QD)) == NULL ||
        (c->ak = be_cpu_alloc_f(cap * c->KVD)) == NULL ||
        (c->av = be_cpu_alloc_f(cap * c->KVD)) == NULL ||
        (c->ao = be_cpu_alloc_f(cap * c->QD)) == NULL ||
        (c->g->attn_gate && ((c->aqg = be_cpu_alloc_f(cap * 2 * c->QD)) == NULL ||
                             (c->ag = be_cpu_alloc_f(cap * c->QD)) == NULL)))
        return wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory for step buffers");
    c->att = be_cpu_attn_pick(c->b.isa);
    c->b.pre_step = gdn_pre_step;
    c->b.kv = &c->kv;
    return WK_OK;
}

static wk_err
gdn_open(const be_config *cfg, const wrk_model *m, be_cpu_base **out, wk_diag *d)
{
    if (cfg == NULL || m == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: missing config or model");
    const wrk_gdn *g = wrk_model_view(m, "gdn");
    const wrk_mamba2 *m2 = wrk_model_view(m, "mamba2");
    const wrk_rwkv7 *rw = wrk_model_rwkv7(m);
    wrk_gdn *own = NULL; /* a pure Mamba2 or an RWKV-7 model's layer list */
    if (g == NULL && (m2 != NULL || rw != NULL)) {
        wk_err e =
            m2 != NULL ? wrk_mamba2_layer_list(m2, &own, d) : wrk_rwkv7_layer_list(rw, &own, d);
        if (e != WK_OK)
            return e;
        g = own;
    }
    if (g == NULL)
        return wk_diag_set(d, WK_EINVAL, "cpu backend: not a layer-list model");
    if (g->conv > GDN_CONV_MAX) {
        free(own);
        return wk_diag_set(d, WK_ENOTSUP, "cpu backend: conv_size %u over %u", g->conv,
                           GDN_CONV_MAX);
    }
    be_ctx *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        free(own);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    c->g = g;
    c->own = own;
    c->L = g->n_layer;
    c->C = g->n_embd;
    c->H = g->n_head;
    c->K = g->head_k;
    c->HV = g->n_v_head;
    c->Vd = g->head_v;
    c->KD = c->H * c->K;
    c->VD = c->HV * c->Vd;
    c->W = g->conv;
    c->F = g->ffn_dim;
    c->beta_scale = g->allow_neg_eigval ? 2.0f : 1.0f;
    c->emb_mul = g->emb_mul;
    c->res_mul = g->res_mul;
    c->logit_div = g->logit_div;
    c->q_scale = (float)(1.0 / sqrt((double)c->K));
    c->layer_floats =
        (size_t)(c->W - 1) * (2 * (size_t)c->KD + c->VD) + (size_t)c->HV * c->K * c->Vd;
    c->n_attn = g->n_attn;
    c->Hq = g->attn_heads;
    c->Hkv = g->attn_kv_heads;
    c->Da = g->attn_head_dim;
    c->QD = c->Hq * c->Da;
    c->KVD = c->Hkv * c->Da;

    c->n_m2 = g->n_m2;
    if (c->n_m2 > 0) {
        const uint32_t DI = g->m2_heads * g->m2_head_dim, CD = DI + 2 * g->m2_groups * g->m2_state;
        c->m2d = (be_cpu_m2_dims){DI,           g->m2_heads,           g->m2_head_dim,
                                  g->m2_groups, g->m2_state,           g->m2_conv,
                                  CD,           DI + CD + g->m2_heads, g->norm_eps};
        c->m2_conv_floats = (size_t)CD * (g->m2_conv - 1);
        c->m2_conv_blocks = (CD + GDN_M2_CONV_BLOCK - 1) / GDN_M2_CONV_BLOCK;
    }

    const wrk_model_info *info = wrk_model_info_get(m);
    const uint64_t sb = info->state_bytes;
    wk_err e;
    if (sb != wrk_gdn_state_bytes(g) ||
        info->kv_token_bytes != (uint64_t)c->n_attn * 2 * c->KVD * sizeof(float)) {
        e = wk_diag_set(d, WK_EINVAL, "cpu backend: gdn state size mismatch");
        goto fail;
    }
    if (c->n_m2 > 0 &&
        (g->m2_conv < 2 || g->m2_conv > GDN_CONV_MAX || g->m2_groups == 0 || g->m2_heads == 0 ||
         g->m2_heads % g->m2_groups != 0 || c->m2d.DI % g->m2_groups != 0)) {
        e = wk_diag_set(d, WK_EINVAL,
                        "cpu backend: bad mamba2 geometry (%u heads, %u groups, "
                        "conv %u: 2..%u)",
                        g->m2_heads, g->m2_groups, g->m2_conv, GDN_CONV_MAX);
        goto fail;
    }
    if (c->n_attn > 0 && (c->Da == 0 || c->Da % 2 != 0 || c->Da > GDN_ATT_MAX_DIM || c->Hkv == 0 ||
                          c->Hq % c->Hkv != 0 || g->rope_dim % 2 != 0 || g->rope_dim > c->Da)) {
        e = wk_diag_set(d, WK_EINVAL, "cpu backend: bad gdn attention geometry");
        goto fail;
    }
    if ((e = be_cpu_base_open(&c->b, cfg, m, (size_t)(sb / sizeof(float)), d)) != WK_OK)
        goto fail;
    if (c->b.cap > c->b.max_tokens)
        c->b.cap = c->b.max_tokens; /* no pass is longer than a step */
    if (g->rw != NULL && (e = be_cpu_rw7_open(&c->rw7, &c->b, g->rw, d)) != WK_OK)
        goto fail;
    c->m2_scan = be_cpu_m2_scan_pick(c->b.isa);
    if (c->n_attn > 0 && (e = gdn_open_attention(c, cfg, d)) != WK_OK)
        goto fail;
    c->delta = gdn_delta_pick(c->b.isa);
    if ((e = gdn_load_vectors(c, d)) != WK_OK)
        goto fail;
    if ((e = gdn_open_moe(c, d)) != WK_OK)
        goto fail;
    if ((e = gdn_pack(c, d)) != WK_OK)
        goto fail;

    const size_t cap = c->b.cap;
    uint32_t dense_F = 0; /* hg / hu: only for SwiGLU / squared-ReLU MLPs */
    for (uint32_t l = 0; l < c->L; l++)
        if (g->layers[l].mlp == WRK_MLP_SWIGLU || g->layers[l].mlp == WRK_MLP_RELU2)
            dense_F = c->F;
    struct {
        float **p;
        size_t n;
    } bufs[] = {
        {&c->x, c->C},        {&c->xn, c->C},    {&c->qr, c->KD},       {&c->kr, c->KD},
        {&c->vr, c->VD},      {&c->q, c->KD},    {&c->k, c->KD},        {&c->v, c->VD},
        {&c->ar, c->HV},      {&c->br, c->HV},   {&c->gr, c->VD},       {&c->o, c->VD},
        {&c->hg, dense_F},    {&c->hu, dense_F}, {&c->m2p, c->m2d.DIP}, {&c->m2x, c->m2d.CD},
        {&c->m2y, c->m2d.DI},
    };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if ((*bufs[i].p = be_cpu_alloc_f(cap * (bufs[i].n ? bufs[i].n : 1))) == NULL) {
            e = wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory for step buffers");
            goto fail;
        }
    if (c->res_mul != 0.0f && (c->xr = be_cpu_alloc_f(cap * c->C)) == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "cpu backend: out of memory for step buffers");
        goto fail;
    }
    *out = &c->b;
    return WK_OK;

fail:
    gdn_close(&c->b);
    return e;
}

/* ------------------------------------------------------------------------ */
/* the family                                                                */
/* ------------------------------------------------------------------------ */

static void
gdn_describe(const be_cpu_base *b, char *buf, size_t len)
{
    const be_ctx *c = (const be_ctx *)b;
    int n = snprintf(
        buf, len,
        "cpu family=%s isa=%s matmul=%s threads=%u pass_tokens=%u weights=%s packed_bytes=%llu",
        wrk_model_view_kind(c->b.model), be_cpu_isa_name(c->b.isa),
        be_cpu_matmul_name(c->b.matmul), c->b.n_threads, c->b.cap,
        wk_dtype_name(wrk_model_info_get(c->b.model)->dtype), (unsigned long long)c->packed_bytes);
    if (c->n_attn > 0 && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n,
                 " attn_layers=%u kv_token_bytes=%llu kv_pages=%u page_tokens=%u", c->n_attn,
                 (unsigned long long)c->kv.tok_floats * sizeof(float), c->kv.pages_total,
                 c->kv.page_tokens);
}

static const char *const gdn_views[] = {"gdn", "mamba2", "rwkv7", NULL};

const be_cpu_family be_cpu_gdn_family = {
    .views = gdn_views,
    .open = gdn_open,
    .close = gdn_close,
    .pass = gdn_pass,
    .describe = gdn_describe,
};
