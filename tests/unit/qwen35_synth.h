/*
 * qwen35_synth: a tiny Qwen3.5 text model for the worker's unit tests (a
 * hybrid: layer 0 Gated DeltaNet, layer 1 full attention): C 16, F 32,
 * vocab 40; linear 2 key heads and 4 value heads of 4, conv 4; attention 2
 * query heads, 1 KV head of 8, half the head rotated. Its tensors as a tset
 * (tset_synth.h) and its config.json text. Header-only; test code only.
 */
#ifndef QWEN35_SYNTH_H
#define QWEN35_SYNTH_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "tset_synth.h"

enum {
    Q35_C = 16,
    Q35_L = 2,
    Q35_F = 32,
    Q35_V = 40,
    Q35_HK = 2,
    Q35_HV = 4,
    Q35_DK = 4,
    Q35_KD = 8,
    Q35_VD = 16,
    Q35_W = 4
};
enum { Q35_HQ = 2, Q35_HKV = 1, Q35_DA = 8, Q35_QD = Q35_HQ * Q35_DA, Q35_KVD = Q35_HKV * Q35_DA };

#define Q35_TEXT_CFG(extra)                                                                        \
    "{\"model_type\":\"qwen3_5_text\",\"vocab_size\":40,\"hidden_size\":16,"                       \
    "\"intermediate_size\":32,\"num_hidden_layers\":2,\"num_attention_heads\":2,"                  \
    "\"num_key_value_heads\":1,\"head_dim\":8,\"hidden_act\":\"silu\",\"rms_norm_eps\":1e-6,"      \
    "\"attention_bias\":false,\"linear_conv_kernel_dim\":4,\"linear_key_head_dim\":4,"             \
    "\"linear_value_head_dim\":4,\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,"         \
    "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000.0,"                     \
    "\"partial_rotary_factor\":0.5},\"tie_word_embeddings\":false" extra "}"
#define Q35_KINDS ",\"layer_types\":[\"linear_attention\",\"full_attention\"]"
static const char *const qwen35_synth_cfg = Q35_TEXT_CFG(Q35_KINDS); /* the config.json text */

/*
 * The tensors under prefix pre ("model." or "model.language_model."), with
 * an lm_head when head, and (extras) the vision tower and MTP layer tensors
 * wkvm skips.
 */
static inline void
qwen35_synth_build(tset *s, const char *pre, bool head, bool extras)
{
    memset(s, 0, sizeof(*s));
    char n[160];
    snprintf(n, sizeof(n), "%sembed_tokens.weight", pre);
    tset_add(s, n, Q35_V, Q35_C, 0);
    for (int l = 0; l < Q35_L; l++) {
#define ADD(suf, a, b, c)                                                                          \
    do {                                                                                           \
        snprintf(n, sizeof(n), "%slayers.%d.%s", pre, l, suf);                                     \
        tset_add(s, n, a, b, c);                                                                   \
    } while (0)
        ADD("input_layernorm.weight", Q35_C, 0, 0);
        if (l == 0) {
            ADD("linear_attn.in_proj_qkv.weight", 2 * Q35_KD + Q35_VD, Q35_C, 0);
            ADD("linear_attn.in_proj_z.weight", Q35_VD, Q35_C, 0);
            ADD("linear_attn.in_proj_b.weight", Q35_HV, Q35_C, 0);
            ADD("linear_attn.in_proj_a.weight", Q35_HV, Q35_C, 0);
            ADD("linear_attn.conv1d.weight", 2 * Q35_KD + Q35_VD, 1, Q35_W);
            ADD("linear_attn.dt_bias", Q35_HV, 0, 0);
            ADD("linear_attn.A_log", Q35_HV, 0, 0);
            ADD("linear_attn.norm.weight", Q35_DK, 0, 0);
            ADD("linear_attn.out_proj.weight", Q35_C, Q35_VD, 0);
        } else {
            ADD("self_attn.q_proj.weight", 2 * Q35_QD, Q35_C, 0);
            ADD("self_attn.k_proj.weight", Q35_KVD, Q35_C, 0);
            ADD("self_attn.v_proj.weight", Q35_KVD, Q35_C, 0);
            ADD("self_attn.o_proj.weight", Q35_C, Q35_QD, 0);
            ADD("self_attn.q_norm.weight", Q35_DA, 0, 0);
            ADD("self_attn.k_norm.weight", Q35_DA, 0, 0);
        }
        ADD("post_attention_layernorm.weight", Q35_C, 0, 0);
        ADD("mlp.gate_proj.weight", Q35_F, Q35_C, 0);
        ADD("mlp.up_proj.weight", Q35_F, Q35_C, 0);
        ADD("mlp.down_proj.weight", Q35_C, Q35_F, 0);
#undef ADD
    }
    snprintf(n, sizeof(n), "%snorm.weight", pre);
    tset_add(s, n, Q35_C, 0, 0);
    if (head)
        tset_add(s, "lm_head.weight", Q35_V, Q35_C, 0);
    if (extras) { /* what wkvm skips: a vision tower and an MTP layer */
        tset_add(s, "model.visual.patch_embed.proj.weight", 8, 12, 0);
        tset_add(s, "model.visual.blocks.0.norm1.weight", 8, 0, 0);
        tset_add(s, "mtp.fc.weight", Q35_C, 2 * Q35_C, 0);
        tset_add(s, "mtp.norm.weight", Q35_C, 0, 0);
    }
}

#endif /* QWEN35_SYNTH_H */
