/*
 * be_cpu_rwkv7: the CPU backend's RWKV-7 layer kinds, run by the layer-list
 * pass (be_cpu_gdn.c) for a wrk_gdn layer with mixer WRK_MIXER_RWKV7 (the
 * time mix) and mlp WRK_MLP_RWKV7 (the channel mix): every layer of an
 * RWKV-7 model (wrk_rwkv7_layer_list). Math: wrk_rwkv7.h and the
 * references in tests/reference (rwkv7_ref.py).
 *
 * The pass runs the pre-norms (LayerNorms, into xn) and adds the kinds'
 * outputs into the residual (the wo / fv projection of the rows these
 * functions return). A layer's slot state, from its offset soff: the time
 * mix's shift [C] (its last normed input), the channel mix's shift [C],
 * then the WKV state [H][N][N]. v_first (the first layer's value, which
 * every later layer mixes in) lives in the pass buffer vf across layers.
 */
#ifndef BE_CPU_RWKV7_H
#define BE_CPU_RWKV7_H

#include <stdbool.h>
#include <stdint.h>

#include "be_cpu_common.h"
#include "wrk_rwkv7.h"

/* Indices of the token-shift mixes. */
enum {
    BE_CPU_RW7_MIX_R = 0,
    BE_CPU_RW7_MIX_W,
    BE_CPU_RW7_MIX_K,
    BE_CPU_RW7_MIX_V,
    BE_CPU_RW7_MIX_A,
    BE_CPU_RW7_MIX_G,
    BE_CPU_RW7_MIX_N
};

/* One layer's RWKV-7 weights (fp32 vectors and packed matrices, in the pass's blocks). */
typedef struct be_cpu_rw7_layer {
    bool first;                         /* the model's first RWKV-7 layer: sets v_first */
    const float *mix[BE_CPU_RW7_MIX_N]; /* x_r, x_w, x_k, x_v, x_a, x_g */
    const float *w0, *a0, *v0;          /* LoRA biases (v0 NULL on the first layer) */
    const float *k_k, *k_a;             /* key normalisation / ICLR mix */
    const float *r_k;                   /* bonus [H * N] */
    const float *lnx_w, *lnx_b;         /* GroupNorm */
    const float *ffn_x_k;               /* channel-mix shift mix */
    be_cpu_mat wr, wk, wv, wo;          /* C -> C projections */
    be_cpu_mat w1, w2, a1, a2;          /* decay and ICLR LoRAs */
    be_cpu_mat v1, v2, g1, g2;          /* value-residual (not on the first layer) and gate LoRAs */
    be_cpu_mat fk, fv;                  /* channel mix C -> F -> C */
} be_cpu_rw7_layer;

/* The kinds' dimensions and pass buffers (b.cap tokens each). */
typedef struct be_cpu_rw7 {
    be_cpu_base *b;              /* the pass's base, borrowed */
    uint32_t C, H, N, F;         /* width, heads, head size, channel-mix width */
    uint32_t Dw, Da, Dv, Dg;     /* LoRA ranks */
    uint32_t head_panels;        /* panels per head when N % BE_CPU_NR == 0, else 0 */
    double gn_eps;               /* GroupNorm epsilon */
    float *mx[BE_CPU_RW7_MIX_N]; /* mixes, then reused [cap][C] */
    float *r, *k, *v, *vf;       /* [cap][C]; vf: v_first across layers */
    float *lw, *la, *lv, *lg;    /* LoRA hidden [cap][D*] */
    float *hf;                   /* channel-mix hidden [cap][F] */
    /* the layer being run (for task bodies) */
    const be_cpu_rw7_layer *ly;
    const float *xn; /* its normed input [cap][C] */
    size_t soff;     /* its slot state's offset (floats) */
} be_cpu_rw7;

/* Sets k up for v over b and allocates its buffers; WK_ENOMEM. k is then ready for close. */
WK_MUST_CHECK wk_err be_cpu_rw7_open(be_cpu_rw7 *k, be_cpu_base *b, const wrk_rwkv7 *v, wk_diag *d);
void be_cpu_rw7_close(be_cpu_rw7 *k);

/* fp32 floats of one layer's vectors (be_cpu_rw7_load). */
size_t be_cpu_rw7_vec_floats(uint32_t C);

/* Converts layer s's vectors to fp32 at *vp (advanced), pointing ly's fields there. */
WK_MUST_CHECK wk_err be_cpu_rw7_load(const wrk_rwkv7_layer *s, bool first, uint32_t C, float **vp,
                                     be_cpu_rw7_layer *ly);

/* Appends layer s's matrices (src) and ly's packed holders (dst); returns how many (<= 14). */
size_t be_cpu_rw7_mats(const wrk_rwkv7_layer *s, be_cpu_rw7_layer *ly, const wrk_mat **src,
                       be_cpu_mat **dst);
void be_cpu_rw7_mats_free(be_cpu_rw7_layer *ly);

/*
 * The time mix over the pass: xn the ln1 output, soff the layer's state.
 * Saves the time mix's shift, runs the projections, the LoRAs and per
 * (segment, head) the WKV recurrence; returns the rows for ly->wo.
 */
const float *be_cpu_rw7_tmix(be_cpu_rw7 *k, const be_cpu_rw7_layer *ly, const float *xn,
                             size_t soff);

/* The channel mix's hidden relu(key(mix))^2 over the pass; returns the rows for ly->fv. */
const float *be_cpu_rw7_cmix(be_cpu_rw7 *k, const be_cpu_rw7_layer *ly, const float *xn,
                             size_t soff);

#endif /* BE_CPU_RWKV7_H */
