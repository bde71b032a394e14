/*
 * wrk_family: how a model family plugs into wrk_model (internal to workerd).
 *
 * wrk_model finds and opens the checkpoint, reads config.json when there is
 * one, and asks each family in turn whether the checkpoint is its own: by
 * config.json's "model_type" first, then by tensor names. The chosen family
 * maps the tensor set onto its view (a struct of its own, declared in its
 * header, e.g. wrk_mamba2.h), fills the dimensions in wrk_model_info, and
 * declares every tensor it uses with wrk_model_use(); wrk_model then refuses
 * a checkpoint holding tensors no family declared, counts parameters, hashes
 * the weights and, for --fp32, replaces the declared tensors by fp32 copies
 * (the view's fields are updated in place, so a view must keep its tensor
 * pointers in fields it passed to wrk_model_use and never copy them before
 * map returns).
 *
 * The state layout is the family's too: an ordered list of fp32 tensors that
 * tile one slot's bytes exactly (state_layout). Every backend stores a slot
 * in this layout, so the bytes move between backends and workers unchanged,
 * and the state file's tensor table is built from it.
 *
 * Every family lives in family/wrk_<name>.c, with its view in wrk_<name>.h.
 */
#ifndef WRK_FAMILY_H
#define WRK_FAMILY_H

#include <stdbool.h>

#include "wk_err.h"
#include "wk_tensor.h"
#include "wrk_model.h"

/*
 * A parsed config.json object (jansson's json_t, declared only: jansson.h
 * stays inside the .c files that read it).
 */
struct json_t;

typedef struct wrk_family {
    const char *name; /* reported as wrk_model_info.family ("mamba2") */
    const char *view; /* the view struct it maps onto and the backends read ("gdn"); NULL: name */

    /* config.json "model_type" values this family accepts; NULL-terminated. */
    const char *const *model_types;

    /* True when the tensor names look like this family (no config.json, or no model_type). */
    bool (*detect)(const wk_tensor_set *set);

    /*
     * True when map itself refuses every stored tensor it does not know
     * (with the family's own message) and may accept some it knows and does
     * not use: wrk_model's unknown-tensor check is then not run (RWKV-7).
     */
    bool checks_names;

    /*
     * Maps set onto a new view (*view, freed with free_view), with config the
     * parsed config.json object or NULL. Fills info's n_layer, n_embd,
     * n_head, head_size, ffn_dim (0 when none), vocab_size and state_bytes,
     * and calls wrk_model_use() for every tensor it will read. Returns WK_OK;
     * WK_EINVAL with a diag naming the tensor or config key; WK_ENOMEM.
     */
    wk_err (*map)(wrk_model *m, const wk_tensor_set *set, const struct json_t *config,
                  void **view, wrk_model_info *info, wk_diag *d);

    /* Frees a view (NULL-safe). */
    void (*free_view)(void *view);

    /*
     * Writes the slot layout: up to cap entries into out (when out is not
     * NULL), returns the number of entries. The entries tile
     * info.state_bytes in order, with no gaps.
     */
    size_t (*state_layout)(const void *view, wrk_state_tensor *out, size_t cap);

    /* Extra fingerprint text (hyperparameters not visible in shapes), NUL-terminated. */
    void (*fingerprint_extra)(const void *view, char *buf, size_t len);

    /*
     * Optional, instead of the generic fingerprint text: the whole text for
     * a family whose fingerprints predate it (RWKV-7, so its states keep
     * loading), from the view and info (digests and dtype filled).
     * Returns snprintf's count; wrk_model refuses one that does not fit.
     */
    int (*fingerprint)(const void *view, const wrk_model_info *info, char *buf, size_t len);

    /*
     * The matrices --quantize q8_0 converts: the projections and the head
     * (not the embedding, vectors, norms or convolution taps; a tied head
     * is named as a field pointing at the embedding, which the quantization
     * repoints at the head's own copy). Writes up to cap pointers into the
     * view (out may be NULL) and returns how many there are. NULL: the
     * family cannot be quantized at load.
     */
    size_t (*quant_mats)(void *view, wrk_mat **out, size_t cap);
} wrk_family;

/*
 * Declares a tensor the family uses. field points into the family's view;
 * name is the canonical name hashed into the weights digest; transpose says
 * the canonical element order is the transpose of the stored 2-D tensor; vec
 * says the canonical shape is [numel]. The same tensor may be declared under
 * two fields (tied embeddings): it is counted once. Returns WK_OK or WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wrk_model_use(wrk_model *m, const wk_tensor **field, const char *name,
                                   bool transpose, bool vec, wk_diag *d);

/*
 * Declares a view the family made of part of a stored tensor (rows of a
 * fused projection, e.g. Qwen3.5's in_proj_qkv split into q, k and v):
 * *field is the family's own wk_tensor (owned by its view, data pointing
 * into parent's), counted, hashed and converted like any declared tensor
 * under name; parent counts as used for the unknown-tensor check. The parts
 * of one parent must tile it. Returns WK_OK, WK_EINVAL, WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wrk_model_use_part(wrk_model *m, const wk_tensor **field, const char *name,
                                        bool vec, const wk_tensor *parent, wk_diag *d);

/*
 * Marks a stored tensor the family knows and does not serve (a vision tower,
 * multi-token-prediction layers): not refused as unknown, not counted,
 * hashed or loaded; counted in info.n_skipped (the worker logs it once).
 * Returns WK_OK or WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wrk_model_skip(wrk_model *m, const wk_tensor *t, wk_diag *d);

/* The families (family/wrk_<name>.c). */
extern const wrk_family wrk_family_rwkv7;
extern const wrk_family wrk_family_mamba2;
extern const wrk_family wrk_family_gdn;
extern const wrk_family wrk_family_qwen3_5;
extern const wrk_family wrk_family_nemotron_h;
extern const wrk_family wrk_family_granite_h;

/*
 * config.json helpers: an integer / number / boolean member, or def when the
 * member is absent or config is NULL. A present member of the wrong type
 * fails with WK_EINVAL naming the key.
 */
WK_MUST_CHECK wk_err wrk_config_u32(const struct json_t *config, const char *key, uint32_t def,
                                    uint32_t *out, wk_diag *d);
WK_MUST_CHECK wk_err wrk_config_f64(const struct json_t *config, const char *key, double def,
                                    double *out, wk_diag *d);
WK_MUST_CHECK wk_err wrk_config_bool(const struct json_t *config, const char *key, bool def,
                                     bool *out, wk_diag *d);
/* A string member (borrowed from config), def when absent or null. */
WK_MUST_CHECK wk_err wrk_config_str(const struct json_t *config, const char *key, const char *def,
                                    const char **out, wk_diag *d);

/* Fails with WK_EINVAL: "<name>: shape [..], expected <want>". */
wk_err wrk_shape_err(wk_diag *d, const char *name, const wk_tensor *t, const char *want);

/*
 * Parses the layer number of a tensor name at s, "<digits>." with no leading
 * zeros (one spelling per layer); returns it, or -1 when s does not start so
 * or the number is >= limit. *rest (optional) points after the dot.
 */
/* True when t's shape is [n] with any leading 1s (how checkpoints store vectors). */
bool wrk_is_vec(const wk_tensor *t, int64_t n);

/* True when t's shape is exactly [d0, d1]. */
bool wrk_is_mat(const wk_tensor *t, int64_t d0, int64_t d1);

long wrk_layer_parse(const char *s, long limit, const char **rest);

/* Shape of t as "[a,b,c]" into buf, for diags. */
void wrk_shape_str(const wk_tensor *t, char *buf, size_t len);

#endif /* WRK_FAMILY_H */
