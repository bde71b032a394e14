/*
 * wrk_gguf: opens a GGUF checkpoint written by llama.cpp's convert_hf_to_gguf.py
 * and presents it to wrk_model as the Hugging Face (fla-hub rwkv7) tensor set.
 *
 * general.architecture "rwkv7" and "mamba2" are mapped; any other is refused
 * by name. The converter's renames and layouts are undone as views (no
 * tensor bytes are copied). RWKV-7: the fused token shift tensor
 * blk.N.time_mix_lerp_fused [6,1,1,C] becomes attn.x_r .. x_g,
 * blk.N.time_mix_r_k [C] becomes attn.r_k [H, N] with N from
 * rwkv7.wkv.head_size, and the dummy layer-0 value LoRA (a copy of the ICLR
 * one) is dropped; LoRA matrices already have the HF orientation. Mamba2:
 * the transformers names (backbone.layers.N.mixer.*), conv1d [CD,K] back to
 * [CD,1,K], ssm_d [H,1] and the grouped ssm_norm [G, d_inner/G] flattened,
 * and ssm_a, which holds A = -exp(A_log), turned back into an A_log (the only
 * tensor computed: n_layer * H floats) that gives that A exactly where a
 * float does. Never logs.
 */
#ifndef WRK_GGUF_H
#define WRK_GGUF_H

#include "wk_err.h"
#include "wk_tensor.h"

struct json_t; /* jansson's json_t, declared only (jansson.h stays in the .c files) */

/*
 * Opens the GGUF file at path. On success *set (free with wk_tensor_set_free();
 * it owns the mapping) holds the tensors under their HF names, and *config
 * (json_decref() it) is the config.json that the GGUF metadata implies
 * (rwkv7: model_type, norm_eps from rwkv7.attention.layer_norm_epsilon,
 * tie_word_embeddings false; mamba2: model_type, every dimension from the
 * mamba2.* keys for family/wrk_mamba2.c to check against the shapes,
 * layer_norm_epsilon, tie_word_embeddings when output.weight is absent,
 * use_conv_bias; epsilons as the shortest decimal that rounds to the
 * stored float32); wrk_model uses it when the directory has no
 * config.json. Returns the codes of wk_gguf_open(), WK_ENOTSUP (another
 * architecture, named; a quantized tensor), WK_EINVAL (unknown tensor, a
 * shape the mapping needs, bad metadata: the diag names the GGUF tensor or
 * key), WK_ENOMEM. Other shapes and missing tensors are found by wrk_model
 * and the family under the HF names (see wrk_gguf_diag_names()).
 */
WK_MUST_CHECK wk_err wrk_gguf_open(const char *path, wk_tensor_set **set, struct json_t **config,
                                   wk_diag *d);

/*
 * Appends " (GGUF <name>)" to d's message when it names a tensor under the
 * HF name wrk_gguf_open() gave it (the first such name), so that an error
 * found later by wrk_model or a family (missing tensor, wrong shape) also
 * names the tensor as the GGUF file calls it. NULL-safe; the message is
 * truncated to fit. Not thread-safe on a shared d.
 */
void wrk_gguf_diag_names(wk_diag *d);

#endif /* WRK_GGUF_H */
