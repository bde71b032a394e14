/*
 * wrk_gguf: opens a GGUF checkpoint written by llama.cpp's convert_hf_to_gguf.py
 * and presents it to wrk_model as the Hugging Face (fla-hub rwkv7) tensor set.
 *
 * Only general.architecture "rwkv7" is mapped. The converter's renames and
 * layouts are undone as views (no tensor bytes are copied): the fused token
 * shift tensor blk.N.time_mix_lerp_fused [6,1,1,C] becomes attn.x_r .. x_g,
 * blk.N.time_mix_r_k [C] becomes attn.r_k [H, N] with N from
 * rwkv7.wkv.head_size, and the dummy layer-0 value LoRA (a copy of the ICLR
 * one) is dropped. LoRA matrices already have the HF orientation. Never logs.
 */
#ifndef WRK_GGUF_H
#define WRK_GGUF_H

#include <jansson.h>

#include "wk_err.h"
#include "wk_tensor.h"

/*
 * Opens the GGUF file at path. On success *set (free with wk_tensor_set_free();
 * it owns the mapping) holds the tensors under their HF names, and *config
 * (json_decref() it) is the config.json that the GGUF metadata implies:
 * model_type "rwkv7", norm_eps from rwkv7.attention.layer_norm_epsilon,
 * tie_word_embeddings false; wrk_model uses it when the directory has no
 * config.json. Returns the codes of wk_gguf_open(), WK_ENOTSUP (another
 * architecture, a quantized tensor), WK_EINVAL (missing or unknown tensor,
 * bad shape, bad metadata: the diag names it), WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wrk_gguf_open(const char *path, wk_tensor_set **set, json_t **config,
                                   wk_diag *d);

#endif /* WRK_GGUF_H */
