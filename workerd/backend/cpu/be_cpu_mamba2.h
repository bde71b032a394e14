/*
 * be_cpu_mamba2: the CPU backend's Mamba2 layer kind, run by the layer-list
 * pass (be_cpu_gdn.c) for a wrk_gdn layer with mixer WRK_MIXER_MAMBA2: the
 * hybrids' Mamba2 layers and every layer of a pure Mamba2 model
 * (wrk_mamba2_layer_list). Math and slot layout: wrk_mamba2.h.
 *
 * A pass's buffers, per token t: proj [DIP] the in_proj output (z | xBC |
 * dt), xbc [CD] the conv + SiLU output, y [DI] the scan output (then gated
 * and normalised in place). A layer's slot state: conv [CD][K-1] then ssm
 * [H][P][N].
 */
#ifndef BE_CPU_MAMBA2_H
#define BE_CPU_MAMBA2_H

#include <stdint.h>

#include "be_cpu_common.h"

/* Dimensions of a Mamba2 layer (wrk_mamba2.h). */
typedef struct be_cpu_m2_dims {
    uint32_t DI, H, P, G, N, K; /* d_inner, heads, head dim, groups, state, conv taps */
    uint32_t CD, DIP;           /* conv_dim, in_proj rows */
    double eps;                 /* the gated RMSNorm's epsilon */
} be_cpu_m2_dims;

/* A Mamba2 layer's fp32 vectors (borrowed). */
typedef struct be_cpu_m2_vecs {
    const float *conv_w;  /* [CD][K] */
    const float *conv_b;  /* [CD] (zeros without a conv bias) */
    const float *dt_bias; /* [H] */
    const float *A;       /* -exp(A_log) [H] */
    const float *D;       /* [H] */
    const float *gnorm;   /* gated RMSNorm weight [DI] */
} be_cpu_m2_vecs;

/* One token of one head's scan (compiled per ISA path). */
typedef void (*be_cpu_m2_scan_fn)(uint32_t P, uint32_t N, float *S, const float *x, const float *B,
                                  const float *Cv, float dt, float dA, float Dh, float *y);

/* The scan kernel for isa. */
be_cpu_m2_scan_fn be_cpu_m2_scan_pick(be_cpu_isa isa);

/*
 * Causal depthwise conv + SiLU of channels [c0, c1) over the n tokens of a
 * segment starting at pass token t0, in token order; the inputs before the
 * segment come from state [CD][K-1], which then gets the segment's last
 * K-1 inputs. K <= 64.
 */
void be_cpu_m2_conv(const be_cpu_m2_dims *m, const be_cpu_m2_vecs *v, const float *proj, float *xbc,
                    uint32_t t0, uint32_t n, float *state, uint32_t c0, uint32_t c1);

/* The scan of head h over the n tokens from t0, in order; ssm the layer's [H][P][N]. */
void be_cpu_m2_scan(const be_cpu_m2_dims *m, const be_cpu_m2_vecs *v, be_cpu_m2_scan_fn scan,
                    const float *proj, const float *xbc, float *y, uint32_t t0, uint32_t n,
                    float *ssm, uint32_t h);

/* Token t: y = rmsnorm_per_group(y * silu(z)) * gnorm, in place. */
void be_cpu_m2_gate(const be_cpu_m2_dims *m, const be_cpu_m2_vecs *v, const float *proj, float *y,
                    uint32_t t);

#endif /* BE_CPU_MAMBA2_H */
