/*
 * wrk_gguf: maps llama.cpp's RWKV-7 GGUF tensors (convert_hf_to_gguf.py,
 * conversion/rwkv.py Rwkv7Model) onto the HF fla-hub names that wrk_model's
 * RWKV-7 mapper checks, as views into the GGUF mapping.
 *
 * What the converter did, and what is undone here:
 *   - renames: model.layers.N.attn.* -> blk.N.time_mix_*, ffn.* ->
 *     blk.N.channel_mix_*, norms -> attn_norm / attn_norm_2 / time_mix_ln,
 *     pre_norm -> token_embd_norm, lm_head -> output (table below);
 *   - the six token-shift vectors x_r, x_w, x_k, x_v, x_a, x_g stacked into
 *     blk.N.time_mix_lerp_fused [6,1,1,C] (split back into six [C] views);
 *   - r_k [H, N] flattened to [C] (reshaped with rwkv7.wkv.head_size);
 *   - every other tensor squeezed (wrk_model accepts [C] vectors);
 *   - LoRA: BlinkDL-layout sources are transposed by the converter, fla ones
 *     kept, so GGUF always holds the nn.Linear (HF) orientation;
 *   - layer 0's value LoRA replaced by a copy of its ICLR LoRA (dropped here:
 *     layer 0 never uses it).
 * A tensor name outside the table is refused, as wrk_model refuses unknown
 * names. Shapes are checked by wrk_model against each other; here only what
 * the split and the reshape need. It never copies tensor bytes and never logs.
 */
#include "wrk_gguf.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_gguf.h"

#define WRK_GGUF_MAX_LAYERS 4096u

/* blk.N.<gguf> -> model.layers.N.<hf> */
static const struct {
    const char *gguf; /* suffix after "blk.N." */
    const char *hf;   /* suffix after "model.layers.N." */
} wrk_gguf_layer_names[] = {
    {"attn_norm.weight", "attn_norm.weight"},
    {"attn_norm.bias", "attn_norm.bias"},
    {"attn_norm_2.weight", "ffn_norm.weight"},
    {"attn_norm_2.bias", "ffn_norm.bias"},
    {"time_mix_w0.weight", "attn.w_lora.lora.2.bias"},
    {"time_mix_w1.weight", "attn.w_lora.lora.0.weight"},
    {"time_mix_w2.weight", "attn.w_lora.lora.2.weight"},
    {"time_mix_a0.weight", "attn.a_lora.lora.2.bias"},
    {"time_mix_a1.weight", "attn.a_lora.lora.0.weight"},
    {"time_mix_a2.weight", "attn.a_lora.lora.2.weight"},
    {"time_mix_v0.weight", "attn.v_lora.lora.2.bias"},
    {"time_mix_v1.weight", "attn.v_lora.lora.0.weight"},
    {"time_mix_v2.weight", "attn.v_lora.lora.2.weight"},
    {"time_mix_g1.weight", "attn.g_lora.lora.0.weight"},
    {"time_mix_g2.weight", "attn.g_lora.lora.2.weight"},
    {"time_mix_k_k.weight", "attn.k_k"},
    {"time_mix_k_a.weight", "attn.k_a"},
    {"time_mix_r_k.weight", "attn.r_k"},
    {"time_mix_receptance.weight", "attn.r_proj.weight"},
    {"time_mix_key.weight", "attn.k_proj.weight"},
    {"time_mix_value.weight", "attn.v_proj.weight"},
    {"time_mix_output.weight", "attn.o_proj.weight"},
    {"time_mix_ln.weight", "attn.g_norm.weight"},
    {"time_mix_ln.bias", "attn.g_norm.bias"},
    {"channel_mix_lerp_k.weight", "ffn.x_k"},
    {"channel_mix_key.weight", "ffn.key.weight"},
    {"channel_mix_value.weight", "ffn.value.weight"},
    {"time_mix_lerp_fused.weight", NULL}, /* split below */
};
#define WRK_GGUF_N_LAYER_NAMES (sizeof(wrk_gguf_layer_names) / sizeof(wrk_gguf_layer_names[0]))

static const struct {
    const char *gguf; /* full GGUF name */
    const char *hf;   /* full HF name */
} wrk_gguf_global_names[] = {
    {"token_embd.weight", "model.embeddings.weight"},
    {"token_embd_norm.weight", "model.layers.0.pre_norm.weight"},
    {"token_embd_norm.bias", "model.layers.0.pre_norm.bias"},
    {"output_norm.weight", "model.norm.weight"},
    {"output_norm.bias", "model.norm.bias"},
    {"output.weight", "lm_head.weight"},
};
#define WRK_GGUF_N_GLOBAL_NAMES (sizeof(wrk_gguf_global_names) / sizeof(wrk_gguf_global_names[0]))

/* The order of the token-shift vectors in time_mix_lerp_fused (the converter's lerp_list). */
static const char *const wrk_gguf_lerp[6] = {"attn.x_r", "attn.x_w", "attn.x_k",
                                             "attn.x_v", "attn.x_a", "attn.x_g"};

/* Parses "blk.<n>." at name; returns n or -1, *rest after the dot. */
static long
wrk_gguf_layer(const char *name, const char **rest)
{
    if (strncmp(name, "blk.", 4) != 0)
        return -1;
    const char *p = name + 4;
    long v = 0;
    if (*p < '0' || *p > '9' || (*p == '0' && p[1] != '.'))
        return -1;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v >= (long)WRK_GGUF_MAX_LAYERS)
            return -1;
        p++;
    }
    if (*p != '.')
        return -1;
    *rest = p + 1;
    return v;
}

static void
wrk_gguf_free_owner(void *g)
{
    wk_gguf_free(g);
}

/* The views being built: tensors with names in a parallel array. */
typedef struct wrk_gguf_views {
    wk_tensor *v;       /* views; v[i].name points at names[i] */
    char (*names)[128]; /* name storage */
    size_t n, cap;      /* used / allocated */
} wrk_gguf_views;

/* Adds t as model.layers.<layer>.<name> (layer >= 0) or <name> (layer < 0). */
static wk_tensor *
wrk_gguf_view_add(wrk_gguf_views *vs, const wk_tensor *t, long layer, const char *name)
{
    if (vs->n == vs->cap)
        return NULL; /* cap is sized up front */
    wk_tensor *o = &vs->v[vs->n];
    *o = *t;
    if (layer >= 0)
        snprintf(vs->names[vs->n], sizeof(vs->names[0]), "model.layers.%ld.%s", layer, name);
    else
        snprintf(vs->names[vs->n], sizeof(vs->names[0]), "%s", name);
    o->name = vs->names[vs->n];
    vs->n++;
    return o;
}

/* Splits blk.N.time_mix_lerp_fused [6,1,1,C] into the six [C] views. */
static wk_err
wrk_gguf_split_lerp(wrk_gguf_views *vs, const wk_tensor *t, long layer, wk_diag *d)
{
    int64_t numel = wk_tensor_numel(t);
    bool ok = t->ndim >= 2 && t->shape[0] == 6 && numel > 0 && numel % 6 == 0 &&
              t->shape[t->ndim - 1] == numel / 6;
    for (int i = 1; ok && i + 1 < t->ndim; i++)
        ok = t->shape[i] == 1;
    if (!ok)
        return wk_diag_set(d, WK_EINVAL,
                           "%s: expected shape [6,1,1,C] (x_r, x_w, x_k, x_v, x_a, x_g)",
                           t->name);
    size_t part = t->nbytes / 6;
    for (int k = 0; k < 6; k++) {
        wk_tensor *o = wrk_gguf_view_add(vs, t, layer, wrk_gguf_lerp[k]);
        if (o == NULL)
            return wk_diag_set(d, WK_ENOMEM, "internal: view table full");
        o->ndim = 1;
        o->shape[0] = numel / 6;
        o->data = (const uint8_t *)t->data + (size_t)k * part;
        o->nbytes = part;
    }
    return WK_OK;
}

wk_err
wrk_gguf_open(const char *path, wk_tensor_set **set, json_t **config, wk_diag *d)
{
    wk_gguf *g = NULL;
    wrk_gguf_views vs = {0};
    json_t *cfg = NULL;
    wk_err e = wk_gguf_open(path, &g, d);
    if (e != WK_OK)
        return e;

    const char *arch;
    size_t arch_len;
    if ((e = wk_gguf_get_str(g, "general.architecture", &arch, &arch_len, d)) != WK_OK)
        goto fail;
    if (arch_len != 5 || memcmp(arch, "rwkv7", 5) != 0) {
        e = wk_diag_set(d, WK_ENOTSUP,
                        "general.architecture \"%.*s\": only rwkv7 GGUF files are supported",
                        (int)(arch_len > 64 ? 64 : arch_len), arch);
        goto fail;
    }
    uint64_t n_layer, head_size;
    if ((e = wk_gguf_get_u64(g, "rwkv7.block_count", &n_layer, d)) != WK_OK ||
        (e = wk_gguf_get_u64(g, "rwkv7.wkv.head_size", &head_size, d)) != WK_OK)
        goto fail;
    if (n_layer < 1 || n_layer > WRK_GGUF_MAX_LAYERS || head_size < 1 || head_size > 65536) {
        e = wk_diag_set(d, WK_EINVAL, "rwkv7.block_count %" PRIu64 " or rwkv7.wkv.head_size %"
                                      PRIu64 " out of range",
                        n_layer, head_size);
        goto fail;
    }
    double eps = 1e-5;
    wk_diag ed = {""};
    e = wk_gguf_get_f64(g, "rwkv7.attention.layer_norm_epsilon", &eps, &ed);
    if (e == WK_ENOENT) {
        eps = 1e-5; /* the converter always writes it; llama.cpp's default */
    } else if (e != WK_OK) {
        e = wk_diag_set(d, e, "%s", ed.msg);
        goto fail;
    }
    if (!(eps > 0.0 && eps < 1.0)) {
        e = wk_diag_set(d, WK_EINVAL, "rwkv7.attention.layer_norm_epsilon %g outside (0, 1)",
                        eps);
        goto fail;
    }

    size_t nt = wk_gguf_tensor_count(g);
    vs.cap = nt + 5 * n_layer; /* the fused lerp grows from 1 to 6 per layer */
    vs.v = calloc(vs.cap ? vs.cap : 1, sizeof(*vs.v));
    vs.names = calloc(vs.cap ? vs.cap : 1, sizeof(*vs.names));
    if (vs.v == NULL || vs.names == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < nt; i++) {
        const wk_tensor *t = wk_gguf_tensor_at(g, i);
        const char *rest = NULL;
        long layer = wrk_gguf_layer(t->name, &rest);
        bool known = false;
        if (layer < 0) {
            for (size_t k = 0; k < WRK_GGUF_N_GLOBAL_NAMES && !known; k++) {
                if (strcmp(t->name, wrk_gguf_global_names[k].gguf) != 0)
                    continue;
                known = true;
                (void)wrk_gguf_view_add(&vs, t, -1, wrk_gguf_global_names[k].hf);
            }
        } else {
            if ((uint64_t)layer >= n_layer) {
                e = wk_diag_set(d, WK_EINVAL, "%s: layer past rwkv7.block_count %" PRIu64,
                                t->name, n_layer);
                goto fail;
            }
            for (size_t k = 0; k < WRK_GGUF_N_LAYER_NAMES && !known; k++) {
                if (strcmp(rest, wrk_gguf_layer_names[k].gguf) != 0)
                    continue;
                known = true;
                const char *hf = wrk_gguf_layer_names[k].hf;
                if (hf == NULL) {
                    if ((e = wrk_gguf_split_lerp(&vs, t, layer, d)) != WK_OK)
                        goto fail;
                } else if (layer == 0 && strncmp(rest, "time_mix_v", 10) == 0 &&
                           rest[10] >= '0' && rest[10] <= '2' && rest[11] == '.') {
                    /* the converter's dummy layer-0 value LoRA: unused, dropped */
                } else {
                    wk_tensor *o = wrk_gguf_view_add(&vs, t, layer, hf);
                    if (strcmp(hf, "attn.r_k") == 0) {
                        int64_t c = wk_tensor_numel(t);
                        if (t->ndim != 1 || c % (int64_t)head_size != 0) {
                            e = wk_diag_set(d, WK_EINVAL,
                                            "%s: expected [C] with C a multiple of "
                                            "rwkv7.wkv.head_size %" PRIu64,
                                            t->name, head_size);
                            goto fail;
                        }
                        o->ndim = 2;
                        o->shape[0] = c / (int64_t)head_size;
                        o->shape[1] = (int64_t)head_size;
                    }
                }
            }
        }
        if (!known) {
            e = wk_diag_set(d, WK_EINVAL, "%s: unexpected tensor for an RWKV-7 GGUF file",
                            t->name);
            goto fail;
        }
    }

    cfg = json_pack("{s:s, s:f, s:b}", "model_type", "rwkv7", "norm_eps", eps,
                    "tie_word_embeddings", 0);
    if (cfg == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto fail;
    }
    if ((e = wk_tensor_set_new(vs.v, vs.n, g, wrk_gguf_free_owner, set, d)) != WK_OK)
        goto fail;
    free(vs.v);
    free(vs.names);
    *config = cfg;
    return WK_OK;
fail:
    wk_diag_prefix(d, "%s", path);
    json_decref(cfg);
    free(vs.v);
    free(vs.names);
    wk_gguf_free(g);
    return e;
}
