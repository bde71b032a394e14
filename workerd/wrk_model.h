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
    const char *vocab_path; /* vocab file, NULL: look in the model dir */
} wrk_model_opts;

/* What the rest of the worker (and the controller, via ModelInfo) sees. */
typedef struct wrk_model_info {
    char family[16];         /* "rwkv7" */
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
    uint64_t state_bytes;    /* bytes of one slot's state */
    char weights_digest[65]; /* hex SHA-256 over tensor names, shapes, dtypes, bytes */
    char vocab_digest[65];   /* hex SHA-256 of the vocab file, "" when none */
    char fingerprint[65];    /* hex SHA-256 binding family, shapes, dtype, both digests */
} wrk_model_info;

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
