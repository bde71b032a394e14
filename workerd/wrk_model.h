/*
 * wrk_model: loading a model directory into host memory, for any family.
 *
 * A model directory holds a checkpoint (HF config.json + model.safetensors or
 * a sharded index, or a BlinkDL .safetensors / .pth) and a World vocab file.
 * Every dimension is read from tensor shapes. Weights stay in their stored
 * 16-bit type unless fp32 is asked for. A malformed or inconsistent checkpoint
 * is refused with a diag that names the tensor. Never logs.
 */
#ifndef WRK_MODEL_H
#define WRK_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"
#include "wk_tensor.h"

typedef struct wrk_model wrk_model;

typedef struct wrk_model_opts {
    bool fp32;              /* convert all weights to fp32 at load */
    bool quantize_q8_0;     /* quantize the matrices to Q8_0 at load (RWKV-7; see wrk_model.c) */
    bool matmul_bf16;       /* --cpu-matmul bf16: BF16 weights only; bound into the fingerprint */
    bool matmul_dp;         /* with matmul_bf16: the AVX512-BF16 engine, not AMX (fingerprint) */
    const char *vocab_path; /* vocab file, NULL: look in the model dir */
    /* Optional: called as the weights are read (frac 0..1), from the loading thread. */
    void (*progress)(void *arg, const char *phase, double frac);
    void *progress_arg;     /* passed to progress */
} wrk_model_opts;

/* What the rest of the worker (and the controller, via ModelInfo) sees. */
typedef struct wrk_model_info {
    char family[16];         /* "rwkv7", "mamba2", "gdn", "qwen3_5" ... (the checkpoint's) */
    char name[128];          /* directory base name */
    uint32_t n_layer;        /* layers */
    uint32_t n_embd;         /* C */
    uint32_t n_head;         /* H */
    uint32_t head_size;      /* N */
    uint32_t ffn_dim;        /* channel-mix width */
    uint32_t vocab_size;     /* rows of the embedding / head */
    wk_dtype dtype;          /* weight dtype kept in memory */
    uint64_t n_params;       /* parameter count */
    uint64_t weight_bytes;   /* bytes of weights as kept */
    uint64_t state_bytes;    /* bytes of one slot's state (the fixed, recurrent part) */
    uint32_t n_attn_layer;   /* hybrid models: full-attention layers, 0 for recurrent-only */
    uint64_t kv_token_bytes; /* hybrid models: KV bytes per token (all attention layers), else 0 */
    uint32_t n_skipped;      /* tensors present but not served (a vision tower, MTP layers) */
    char weights_digest[65]; /* hex SHA-256 over tensor names, shapes, dtypes, bytes */
    char vocab_digest[65];   /* hex SHA-256 of the vocab file, "" when none */
    char fingerprint[65];    /* hex SHA-256 binding family, shapes, dtype, both digests */
    bool matmul_bf16;        /* --cpu-matmul bf16 (in the fingerprint: states never cross modes) */
    bool matmul_dp;          /* ... on AVX512-BF16 dot products, not AMX tiles (likewise) */
} wrk_model_info;

/* ------------------------------------------------------------------------ */
/* Family views: what a backend reads to build its own copy of the weights.   */
/* ------------------------------------------------------------------------ */

/*
 * A weight matrix mapping n_in features to n_out (y = x W), as stored.
 * t is borrowed until wrk_model_free(); its dtype is F32, F16, BF16 or Q8_0
 * (Q8_0: blocks along the last stored dim).
 * in_major: stored [n_in, n_out] (x @ W, BlinkDL LoRA w1/w2 ...);
 * otherwise stored [n_out, n_in] (torch nn.Linear weight). NULL t: absent.
 */
typedef struct wrk_mat {
    const wk_tensor *t; /* stored tensor, borrowed */
    uint32_t n_in;      /* K: input features */
    uint32_t n_out;     /* N: output features */
    bool in_major;      /* true: [n_in, n_out]; false: [n_out, n_in] */
} wrk_mat;

/*
 * The family view of m (wrk_mamba2, wrk_gdn ... from the family's header)
 * when m's family is `family`, else NULL. Borrowed until wrk_model_free().
 */
const void *wrk_model_view(const wrk_model *m, const char *family);

/*
 * The kind of view m's family maps onto, which names the backend
 * implementation: "rwkv7", "mamba2" or "gdn" (Qwen3.5 checkpoints, family
 * "qwen3_5", are served through the "gdn" view). Static string.
 */
const char *wrk_model_view_kind(const wrk_model *m);

/* One fp32 tensor of a slot's state, in slot order (see wrk_model_state_layout). */
#define WRK_STATE_MAX_DIMS 4
typedef struct wrk_state_tensor {
    char name[48];                      /* "layers.3.ssm" */
    uint32_t ndim;                      /* 1..WRK_STATE_MAX_DIMS */
    uint64_t shape[WRK_STATE_MAX_DIMS]; /* elements per dimension */
} wrk_state_tensor;

/*
 * The slot layout of m's family: the fp32 tensors that tile one slot's
 * state_bytes, in byte order. Writes up to cap entries (out may be NULL) and
 * returns how many there are.
 */
size_t wrk_model_state_layout(const wrk_model *m, wrk_state_tensor *out, size_t cap);

/*
 * Finds the checkpoint file in dir, by these rules in order:
 * model.safetensors.index.json, model.safetensors, the only *.safetensors,
 * the only *.pth. On success writes the path (NUL-terminated) to out.
 * Returns WK_ENOENT (none; the diag says what was looked for), WK_EINVAL
 * (several candidates: the diag names them), WK_ETOOBIG (path over out_len),
 * WK_EIO (dir unreadable).
 */
WK_MUST_CHECK wk_err wrk_model_find_checkpoint(const char *dir, char *out, size_t out_len,
                                               wk_diag *d);

/*
 * Loads the model in dir. On success *out is owned by the caller (free with
 * wrk_model_free). Returns WK_ENOENT (no checkpoint), WK_EINVAL (malformed or
 * inconsistent; diag names the tensor), WK_ENOTSUP, WK_EIO, WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wrk_model_load(const char *dir, const wrk_model_opts *opts,
                                    wrk_model **out, wk_diag *d);

/* Frees the model. NULL-safe. */
void wrk_model_free(wrk_model *m);

/* Borrowed until wrk_model_free(). */
const wrk_model_info *wrk_model_info_get(const wrk_model *m);

/* The model's tokenizer, borrowed until wrk_model_free(); NULL when none. */
struct wk_tok;
const struct wk_tok *wrk_model_tokenizer(const wrk_model *m);

#endif /* WRK_MODEL_H */
