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
#include <jansson.h>
#include <math.h>
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
                           "%s: expected shape [6,1,1,C] (x_r, x_w, x_k, x_v, x_a, x_g)", t->name);
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

/*
 * The epsilon the HF config.json had: the metadata holds it as float32, so
 * the shortest decimal that rounds to the same float is taken (1e-05 for
 * 9.99999975e-06), as the double the safetensors run reads.
 */
static double
wrk_gguf_eps(double stored)
{
    float f = (float)stored;
    for (int prec = 1; prec <= 9; prec++) {
        char buf[32];
        snprintf(buf, sizeof(buf), "%.*g", prec, (double)f);
        double v = strtod(buf, NULL);
        if ((float)v == f)
            return v;
    }
    return stored;
}

/* Reads <arch>.<key> (u64) into *out; the diag names the key. */
static wk_err
wrk_gguf_u64(const wk_gguf *g, const char *arch, const char *key, uint64_t *out, wk_diag *d)
{
    char k[96];
    snprintf(k, sizeof(k), "%s.%s", arch, key);
    return wk_gguf_get_u64(g, k, out, d);
}

/* Reads the optional float <arch>.<key> (default def when absent) into *out. */
static wk_err
wrk_gguf_eps_key(const wk_gguf *g, const char *arch, const char *key, double *out, wk_diag *d)
{
    char k[96];
    snprintf(k, sizeof(k), "%s.%s", arch, key);
    double eps = 1e-5;
    wk_diag ed = {""};
    wk_err e = wk_gguf_get_f64(g, k, &eps, &ed);
    if (e == WK_ENOENT)
        eps = 1e-5; /* the converter always writes it; llama.cpp's default */
    else if (e != WK_OK)
        return wk_diag_set(d, e, "%s", ed.msg);
    if (!(eps > 0.0 && eps < 1.0))
        return wk_diag_set(d, WK_EINVAL, "%s %g outside (0, 1)", k, eps);
    *out = wrk_gguf_eps(eps);
    return WK_OK;
}

/* What the set owns besides the views: the GGUF mapping and computed tensors. */
typedef struct wrk_gguf_owner {
    wk_gguf *g;           /* the parsed, mapped file */
    float *extra;         /* tensors computed at open (Mamba2 A_log), or NULL */
    void **bufs;          /* more computed tensors (Qwen3.5: A_log, regrouped copies), owned */
    size_t n_bufs, cap_bufs; /* used / allocated entries of bufs */
} wrk_gguf_owner;

static void
wrk_gguf_owner_free(void *p)
{
    wrk_gguf_owner *o = p;
    if (o == NULL)
        return;
    wk_gguf_free(o->g);
    free(o->extra);
    for (size_t i = 0; i < o->n_bufs; i++)
        free(o->bufs[i]);
    free(o->bufs);
    free(o);
}

/* A buffer of len bytes the owner frees with the set; NULL when out of memory. */
static void *
wrk_gguf_owned(wrk_gguf_owner *o, size_t len)
{
    if (o->n_bufs == o->cap_bufs) {
        size_t cap = o->cap_bufs ? 2 * o->cap_bufs : 64;
        void **b = realloc(o->bufs, cap * sizeof(*b));
        if (b == NULL)
            return NULL;
        o->bufs = b;
        o->cap_bufs = cap;
    }
    void *p = malloc(len ? len : 1);
    if (p != NULL)
        o->bufs[o->n_bufs++] = p;
    return p;
}

/* Maps the tensors of an rwkv7 file and builds its config. */
static wk_err
wrk_gguf_rwkv7(const wk_gguf *g, wrk_gguf_views *vs, json_t **config, wk_diag *d)
{
    uint64_t n_layer, head_size;
    wk_err e;
    if ((e = wk_gguf_get_u64(g, "rwkv7.block_count", &n_layer, d)) != WK_OK ||
        (e = wk_gguf_get_u64(g, "rwkv7.wkv.head_size", &head_size, d)) != WK_OK)
        return e;
    if (n_layer < 1 || n_layer > WRK_GGUF_MAX_LAYERS || head_size < 1 || head_size > 65536)
        return wk_diag_set(d, WK_EINVAL,
                           "rwkv7.block_count %" PRIu64 " or rwkv7.wkv.head_size %" PRIu64
                           " out of range",
                           n_layer, head_size);
    double eps;
    if ((e = wrk_gguf_eps_key(g, "rwkv7", "attention.layer_norm_epsilon", &eps, d)) != WK_OK)
        return e;

    size_t nt = wk_gguf_tensor_count(g);
    vs->cap = nt + 5 * n_layer; /* the fused lerp grows from 1 to 6 per layer */
    vs->v = calloc(vs->cap ? vs->cap : 1, sizeof(*vs->v));
    vs->names = calloc(vs->cap ? vs->cap : 1, sizeof(*vs->names));
    if (vs->v == NULL || vs->names == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
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
                (void)wrk_gguf_view_add(vs, t, -1, wrk_gguf_global_names[k].hf);
            }
        } else {
            if ((uint64_t)layer >= n_layer)
                return wk_diag_set(d, WK_EINVAL, "%s: layer past rwkv7.block_count %" PRIu64,
                                   t->name, n_layer);
            for (size_t k = 0; k < WRK_GGUF_N_LAYER_NAMES && !known; k++) {
                if (strcmp(rest, wrk_gguf_layer_names[k].gguf) != 0)
                    continue;
                known = true;
                const char *hf = wrk_gguf_layer_names[k].hf;
                if (hf == NULL) {
                    if ((e = wrk_gguf_split_lerp(vs, t, layer, d)) != WK_OK)
                        return e;
                } else if (layer == 0 && strncmp(rest, "time_mix_v", 10) == 0 && rest[10] >= '0' &&
                           rest[10] <= '2' && rest[11] == '.') {
                    /* the converter's dummy layer-0 value LoRA: unused, dropped */
                } else {
                    wk_tensor *o = wrk_gguf_view_add(vs, t, layer, hf);
                    if (strcmp(hf, "attn.r_k") == 0) {
                        int64_t c = wk_tensor_numel(t);
                        if (t->ndim != 1 || c % (int64_t)head_size != 0)
                            return wk_diag_set(d, WK_EINVAL,
                                               "%s: expected [C] with C a multiple of "
                                               "rwkv7.wkv.head_size %" PRIu64,
                                               t->name, head_size);
                        o->ndim = 2;
                        o->shape[0] = c / (int64_t)head_size;
                        o->shape[1] = (int64_t)head_size;
                    }
                }
            }
        }
        if (!known)
            return wk_diag_set(d, WK_EINVAL, "%s: unexpected tensor for an RWKV-7 GGUF file",
                               t->name);
    }
    *config = json_pack("{s:s, s:f, s:b}", "model_type", "rwkv7", "norm_eps", eps,
                        "tie_word_embeddings", 0);
    return *config != NULL ? WK_OK : wk_diag_set(d, WK_ENOMEM, "out of memory");
}

/* blk.N.<gguf> -> backbone.layers.N.<hf> for mamba2 */
static const struct {
    const char *gguf; /* suffix after "blk.N." */
    const char *hf;   /* suffix after "backbone.layers.N." */
} wrk_gguf_m2_layer_names[] = {
    {"attn_norm.weight", "norm.weight"},
    {"ssm_in.weight", "mixer.in_proj.weight"},
    {"ssm_conv1d.weight", "mixer.conv1d.weight"}, /* [CD,K] -> [CD,1,K] */
    {"ssm_conv1d.bias", "mixer.conv1d.bias"},
    {"ssm_dt.bias", "mixer.dt_bias"},
    {"ssm_a", "mixer.A_log"}, /* A = -exp(A_log) [H,1] -> A_log [H], see wrk_gguf_a_log */
    {"ssm_d", "mixer.D"},     /* [H,1] -> [H] */
    {"ssm_norm.weight", "mixer.norm.weight"}, /* [G, d_inner/G] -> [d_inner] */
    {"ssm_out.weight", "mixer.out_proj.weight"},
};
#define WRK_GGUF_N_M2_LAYER_NAMES                                                                  \
    (sizeof(wrk_gguf_m2_layer_names) / sizeof(wrk_gguf_m2_layer_names[0]))

static const struct {
    const char *gguf; /* full GGUF name */
    const char *hf;   /* full HF name */
} wrk_gguf_m2_global_names[] = {
    {"token_embd.weight", "backbone.embeddings.weight"},
    {"output_norm.weight", "backbone.norm_f.weight"},
    {"output.weight", "lm_head.weight"},
};
#define WRK_GGUF_N_M2_GLOBAL_NAMES                                                                 \
    (sizeof(wrk_gguf_m2_global_names) / sizeof(wrk_gguf_m2_global_names[0]))

/*
 * The float x with -expf(x) == A, which the Mamba2 backends compute
 * from A_log: the converter stored A = -exp(A_log) (torch, float32), and
 * this hands the engine an A_log that gives back exactly that A when a float
 * does (expf is monotonic: the floats around logf(-A) are searched), else
 * the one whose -expf is nearest (|error| under one step of expf there,
 * about |A_log| ulps of A). *exact says which.
 */
static float
wrk_gguf_a_log(float A, bool *exact)
{
    const float y = -A;
    float x = logf(y);
    float best = x;
    float best_err = fabsf(expf(x) - y);
    /* walk towards y; expf steps over at most a few floats per ulp of x */
    float dir = expf(x) < y ? INFINITY : -INFINITY;
    for (int i = 0; i < 256 && best_err != 0.0f; i++) {
        float nx = nextafterf(x, dir);
        float ny = expf(nx);
        float err = fabsf(ny - y);
        if (err < best_err) {
            best = nx;
            best_err = err;
        }
        if ((dir > 0 && ny > y) || (dir < 0 && ny < y))
            break; /* crossed y */
        x = nx;
    }
    *exact = best_err == 0.0f;
    return best;
}

/*
 * Points view o of t (n values of A = -exp(A_log), as the converter stores
 * Mamba2 / Gated DeltaNet decays) at an owned float32 A_log, value by
 * value through wrk_gguf_a_log.
 */
static wk_err
wrk_gguf_a_log_view(wrk_gguf_owner *own, const wk_tensor *t, wk_tensor *o, uint64_t n,
                    wk_diag *d)
{
    float *a_log = wrk_gguf_owned(own, n * sizeof(float));
    if (a_log == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    for (uint64_t h = 0; h < n; h++) {
        float A;
        bool exact;
        if (wk_tensor_read_f32(t, h, 1, &A) != WK_OK || !(A < 0.0f) || !isfinite(A))
            return wk_diag_set(d, WK_EINVAL, "%s[%" PRIu64 "]: expected A = -exp(A_log) < 0",
                               t->name, h);
        a_log[h] = wrk_gguf_a_log(A, &exact);
    }
    o->dtype = WK_DTYPE_F32;
    o->data = a_log;
    o->nbytes = n * sizeof(float);
    return WK_OK;
}

/* Maps the tensors of a mamba2 file (computing A_log into *extra) and builds its config. */
static wk_err
wrk_gguf_mamba2(const wk_gguf *g, wrk_gguf_views *vs, float **extra, json_t **config, wk_diag *d)
{
    uint64_t n_layer, n_embd, d_inner, d_state, d_conv, n_head, n_group;
    wk_err e;
    if ((e = wrk_gguf_u64(g, "mamba2", "block_count", &n_layer, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, "mamba2", "embedding_length", &n_embd, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, "mamba2", "ssm.inner_size", &d_inner, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, "mamba2", "ssm.state_size", &d_state, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, "mamba2", "ssm.conv_kernel", &d_conv, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, "mamba2", "ssm.time_step_rank", &n_head, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, "mamba2", "ssm.group_count", &n_group, d)) != WK_OK)
        return e;
    if (n_layer < 1 || n_layer > WRK_GGUF_MAX_LAYERS || n_embd < 1 || n_embd > (1u << 17) ||
        d_inner < 1 || d_inner > (1u << 17) || d_state < 1 || d_state > 4096 || d_conv < 1 ||
        d_conv > 64 || n_head < 1 || d_inner % n_head != 0 || n_group < 1 || n_head % n_group != 0)
        return wk_diag_set(d, WK_EINVAL,
                           "mamba2.block_count %" PRIu64 ", embedding_length %" PRIu64
                           ", ssm.inner_size %" PRIu64 ", ssm.state_size %" PRIu64
                           ", ssm.conv_kernel %" PRIu64 ", ssm.time_step_rank %" PRIu64
                           ", ssm.group_count %" PRIu64 ": out of range or inconsistent",
                           n_layer, n_embd, d_inner, d_state, d_conv, n_head, n_group);
    double eps;
    if ((e = wrk_gguf_eps_key(g, "mamba2", "attention.layer_norm_rms_epsilon", &eps, d)) != WK_OK)
        return e;

    size_t nt = wk_gguf_tensor_count(g);
    vs->cap = nt;
    vs->v = calloc(nt ? nt : 1, sizeof(*vs->v));
    vs->names = calloc(nt ? nt : 1, sizeof(*vs->names));
    *extra = calloc((size_t)n_layer * n_head, sizeof(float));
    if (vs->v == NULL || vs->names == NULL || *extra == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    bool have_output = false, conv_bias = false;
    for (size_t i = 0; i < nt; i++) {
        const wk_tensor *t = wk_gguf_tensor_at(g, i);
        const char *rest = NULL;
        long layer = wrk_gguf_layer(t->name, &rest);
        const char *hf = NULL;
        if (layer < 0) {
            for (size_t k = 0; k < WRK_GGUF_N_M2_GLOBAL_NAMES && hf == NULL; k++)
                if (strcmp(t->name, wrk_gguf_m2_global_names[k].gguf) == 0)
                    hf = wrk_gguf_m2_global_names[k].hf;
        } else {
            if ((uint64_t)layer >= n_layer)
                return wk_diag_set(d, WK_EINVAL, "%s: layer past mamba2.block_count %" PRIu64,
                                   t->name, n_layer);
            for (size_t k = 0; k < WRK_GGUF_N_M2_LAYER_NAMES && hf == NULL; k++)
                if (strcmp(rest, wrk_gguf_m2_layer_names[k].gguf) == 0)
                    hf = wrk_gguf_m2_layer_names[k].hf;
        }
        if (hf == NULL)
            return wk_diag_set(d, WK_EINVAL, "%s: unexpected tensor for a Mamba2 GGUF file",
                               t->name);
        char full[128];
        if (layer < 0)
            snprintf(full, sizeof(full), "%s", hf);
        else
            snprintf(full, sizeof(full), "backbone.layers.%ld.%s", layer, hf);
        wk_tensor *o = wrk_gguf_view_add(vs, t, -1, full);
        if (o == NULL)
            return wk_diag_set(d, WK_ENOMEM, "internal: view table full");
        if (layer < 0) {
            have_output = have_output || strcmp(hf, "lm_head.weight") == 0;
            continue;
        }
        int64_t numel = wk_tensor_numel(t);
        if (strcmp(hf, "mixer.conv1d.weight") == 0) {
            if (t->ndim != 2)
                return wk_diag_set(d, WK_EINVAL,
                                   "%s: expected [conv_dim, %" PRIu64 "] (the converter "
                                   "squeezes [conv_dim, 1, K])",
                                   t->name, d_conv);
            o->ndim = 3;
            o->shape[0] = t->shape[0];
            o->shape[1] = 1;
            o->shape[2] = t->shape[1];
        } else if (strcmp(hf, "mixer.conv1d.bias") == 0) {
            conv_bias = true;
        } else if (strcmp(hf, "mixer.D") == 0 || strcmp(hf, "mixer.A_log") == 0) {
            if (numel != (int64_t)n_head || t->ndim < 1 || t->shape[0] != (int64_t)n_head)
                return wk_diag_set(d, WK_EINVAL,
                                   "%s: expected [%" PRIu64 ", 1] (mamba2.ssm.time_step_rank "
                                   "heads)",
                                   t->name, n_head);
            o->ndim = 1;
            if (strcmp(hf, "mixer.A_log") == 0) {
                float *a_log = *extra + (size_t)layer * n_head;
                for (uint64_t h = 0; h < n_head; h++) {
                    float A;
                    bool exact;
                    if (wk_tensor_read_f32(t, h, 1, &A) != WK_OK)
                        return wk_diag_set(d, WK_EINVAL, "%s: cannot read it as float32", t->name);
                    if (!(A < 0.0f) || !isfinite(A))
                        return wk_diag_set(d, WK_EINVAL,
                                           "%s[%" PRIu64 "] = %g: expected A = -exp(A_log) < 0",
                                           t->name, h, (double)A);
                    a_log[h] = wrk_gguf_a_log(A, &exact);
                }
                o->dtype = WK_DTYPE_F32;
                o->data = a_log;
                o->nbytes = (size_t)n_head * sizeof(float);
            }
        } else if (strcmp(hf, "mixer.norm.weight") == 0) {
            if (t->ndim != 2 || t->shape[0] != (int64_t)n_group)
                return wk_diag_set(d, WK_EINVAL,
                                   "%s: expected [%" PRIu64 ", d_inner / %" PRIu64
                                   "] (mamba2.ssm.group_count groups)",
                                   t->name, n_group, n_group);
            o->ndim = 1;
        }
        if (o->ndim == 1)
            o->shape[0] = numel;
    }
    /* every other shape is checked by family/wrk_mamba2.c against these keys */
    json_t *c = json_pack(
        "{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:b, s:b}", "model_type", "mamba2",
        "hidden_size", (json_int_t)n_embd, "num_hidden_layers", (json_int_t)n_layer, "state_size",
        (json_int_t)d_state, "conv_kernel", (json_int_t)d_conv, "n_groups", (json_int_t)n_group,
        "head_dim", (json_int_t)(d_inner / n_head), "num_heads", (json_int_t)n_head,
        "layer_norm_epsilon", eps, "tie_word_embeddings", !have_output, "use_conv_bias", conv_bias);
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    if (d_inner % n_embd == 0 &&
        json_object_set_new(c, "expand", json_integer((json_int_t)(d_inner / n_embd))) != 0) {
        json_decref(c);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    *config = c;
    return WK_OK;
}


/* blk.N.<gguf> -> model.layers.N.<hf> for qwen35 / qwen35moe (NULL: split per expert) */
static const struct {
    const char *gguf; /* suffix after "blk.N." */
    const char *hf;   /* suffix after "model.layers.N." */
} wrk_gguf_q35_layer_names[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"attn_qkv.weight", "linear_attn.in_proj_qkv.weight"},
    {"attn_gate.weight", "linear_attn.in_proj_z.weight"},
    {"ssm_beta.weight", "linear_attn.in_proj_b.weight"},
    {"ssm_alpha.weight", "linear_attn.in_proj_a.weight"},
    {"ssm_ba.weight", "linear_attn.in_proj_ba.weight"}, /* qwen3next: split, wrk_gguf_next_ba */
    {"ssm_a", "linear_attn.A_log"}, /* A = -exp(A_log) -> A_log, see wrk_gguf_a_log */
    {"ssm_dt.bias", "linear_attn.dt_bias"},
    {"ssm_conv1d.weight", "linear_attn.conv1d.weight"}, /* [CD,K] -> [CD,1,K] */
    {"ssm_norm.weight", "linear_attn.norm.weight"},
    {"ssm_out.weight", "linear_attn.out_proj.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"ffn_gate_inp.weight", "mlp.gate.weight"},
    {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"}, /* [C] -> [1, C] */
    {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
    {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
    {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
    {"ffn_gate_exps.weight", "gate_proj"}, /* [E, F, C] -> mlp.experts.<e>.gate_proj.weight */
    {"ffn_up_exps.weight", "up_proj"},
    {"ffn_down_exps.weight", "down_proj"},
};
#define WRK_GGUF_N_Q35_LAYER_NAMES                                                                 \
    (sizeof(wrk_gguf_q35_layer_names) / sizeof(wrk_gguf_q35_layer_names[0]))

static const struct {
    const char *gguf; /* full GGUF name */
    const char *hf;   /* full HF name */
} wrk_gguf_q35_global_names[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};
#define WRK_GGUF_N_Q35_GLOBAL_NAMES                                                                \
    (sizeof(wrk_gguf_q35_global_names) / sizeof(wrk_gguf_q35_global_names[0]))

/* Bytes of one row of t (its last dim), any dtype; 0 when t has no dims. */
static size_t
wrk_gguf_row_bytes(const wk_tensor *t)
{
    if (t->ndim < 1)
        return 0;
    int64_t n = t->shape[t->ndim - 1];
    return (size_t)n / wk_dtype_block_len(t->dtype) * wk_dtype_block_bytes(t->dtype);
}

/*
 * The converter stores the value heads of a linear-attention layer with
 * num_v_heads > num_k_heads in a tiled order (value head v of key group g
 * at v * H + g) where transformers groups them (g * r + v). Undoes that for
 * rows [r0, r0 + H r blk) of o (blocks of blk rows; cols 0) or for the
 * column blocks of blk elements of every row (cols 1), into an owned copy
 * that o then points at.
 */
static wk_err
wrk_gguf_q35_regroup(wrk_gguf_owner *own, wk_tensor *o, int64_t r0, uint64_t H, uint64_t r,
                     int64_t blk, bool cols, wk_diag *d)
{
    uint8_t *dst = wrk_gguf_owned(own, o->nbytes);
    if (dst == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory regrouping %s", o->name);
    const uint8_t *src = o->data;
    memcpy(dst, src, o->nbytes);
    /* bytes per index of the first dim: a vector's element, a matrix's row */
    const size_t row = o->ndim == 1 ? o->nbytes / (size_t)o->shape[0] : wrk_gguf_row_bytes(o);
    if (!cols) {
        const size_t bb = (size_t)blk * row;
        for (uint64_t g = 0; g < H; g++)
            for (uint64_t v = 0; v < r; v++)
                memcpy(dst + (size_t)r0 * row + (g * r + v) * bb,
                       src + (size_t)r0 * row + (v * H + g) * bb, bb);
    } else {
        const size_t bl = wk_dtype_block_len(o->dtype);
        if (blk % (int64_t)bl != 0 || o->ndim != 2)
            return wk_diag_set(d, WK_ENOTSUP, "%s: value heads of %" PRId64 " columns cannot be "
                               "regrouped in %s blocks", o->name, blk, wk_dtype_name(o->dtype));
        const size_t bb = (size_t)blk / bl * wk_dtype_block_bytes(o->dtype);
        for (int64_t i = 0; i < o->shape[0]; i++)
            for (uint64_t g = 0; g < H; g++)
                for (uint64_t v = 0; v < r; v++)
                    memcpy(dst + (size_t)i * row + (g * r + v) * bb,
                           src + (size_t)i * row + (v * H + g) * bb, bb);
    }
    o->data = dst;
    return WK_OK;
}

/* Reads the u64 <arch>.<key>, def when absent. */
static wk_err
wrk_gguf_u64_def(const wk_gguf *g, const char *arch, const char *key, uint64_t def, uint64_t *out,
                 wk_diag *d)
{
    wk_err e = wrk_gguf_u64(g, arch, key, out, d);
    if (e == WK_ENOENT) {
        *out = def;
        return WK_OK;
    }
    return e;
}

/*
 * Qwen3-Next's in_proj_ba [H * 2r, C] holds, per key head g, the r beta
 * rows then the r alpha rows (transformers' grouped order, which llama.cpp
 * keeps): copies them into in_proj_b [HV, C] and in_proj_a [HV, C], value
 * head g * r + v in row g * r + v of each.
 */
static wk_err
wrk_gguf_next_ba(wrk_gguf_views *vs, wrk_gguf_owner *own, const wk_tensor *t, long layer,
                 uint64_t H, uint64_t r, wk_diag *d)
{
    if (t->ndim != 2 || t->shape[0] != (int64_t)(2 * H * r))
        return wk_diag_set(d, WK_EINVAL, "%s: expected %" PRIu64 " rows", t->name, 2 * H * r);
    const size_t row = wrk_gguf_row_bytes(t), half = (size_t)(H * r) * row;
    static const char *const names[2] = {"linear_attn.in_proj_b.weight",
                                         "linear_attn.in_proj_a.weight"};
    for (int part = 0; part < 2; part++) {
        uint8_t *dst = wrk_gguf_owned(own, half);
        wk_tensor *o = dst != NULL ? wrk_gguf_view_add(vs, t, layer, names[part]) : NULL;
        if (o == NULL)
            return wk_diag_set(d, WK_ENOMEM, "out of memory splitting %s", t->name);
        const uint8_t *src = t->data;
        for (uint64_t g = 0; g < H; g++)
            memcpy(dst + g * r * row, src + (g * 2 * r + (uint64_t)part * r) * row, r * row);
        o->shape[0] = (int64_t)(H * r);
        o->data = dst;
        o->nbytes = half;
    }
    return WK_OK;
}

/*
 * Maps the tensors of a qwen35 / qwen35moe / qwen3next file (llama.cpp's
 * Qwen3_5TextModel, Qwen3_5MoeTextModel and Qwen3NextModel) onto
 * Qwen3_5ForCausalLM's names and builds its config. Undone: A =
 * -exp(A_log), the tiled value heads (qwen35*: the converter keeps
 * Qwen3-Next's grouped order), the squeezed conv, the stacked experts (one
 * view per expert), Qwen3-Next's in_proj_ba (split into b and a). Kept: the
 * norms, which the converter stored as 1 + weight in float32 (the config's
 * wkvm_norms_include_one tells the family not to add the 1 again), and
 * Qwen3-Next's in_proj_qkvz, which the converter already split into the
 * Qwen3.5 layout (attn_qkv + attn_gate; the config's wkvm_split_linear_proj
 * says so). A qwen3next file records neither norm_topk_prob nor which layers
 * are sparse: as llama.cpp, a layer with a router is a MoE layer, the others
 * dense, and the top-k weights are renormalised (every released Qwen3-Next).
 */
static wk_err
wrk_gguf_qwen35(const wk_gguf *g, wrk_gguf_views *vs, wrk_gguf_owner *own, const char *arch,
                json_t **config, wk_diag *d)
{
    uint64_t L, C, F, Hq, Hkv, Da, W, K, H, HV, VD, rope_dim, E, k, Fe, Fs, interval;
    double eps, theta = 10000.0;
    wk_err e;
    const bool next = strcmp(arch, "qwen3next") == 0;
    const bool moe = next || strcmp(arch, "qwen35moe") == 0;
    if ((e = wrk_gguf_u64(g, arch, "block_count", &L, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "embedding_length", &C, d)) != WK_OK ||
        (e = wrk_gguf_u64_def(g, arch, "feed_forward_length", 0, &F, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "attention.head_count", &Hq, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "attention.head_count_kv", &Hkv, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "attention.key_length", &Da, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.conv_kernel", &W, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.state_size", &K, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.group_count", &H, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.time_step_rank", &HV, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.inner_size", &VD, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "rope.dimension_count", &rope_dim, d)) != WK_OK ||
        (e = wrk_gguf_u64_def(g, arch, "full_attention_interval", 4, &interval, d)) != WK_OK ||
        (e = wrk_gguf_u64_def(g, arch, "expert_count", 0, &E, d)) != WK_OK ||
        (e = wrk_gguf_u64_def(g, arch, "expert_used_count", 0, &k, d)) != WK_OK ||
        (e = wrk_gguf_u64_def(g, arch, "expert_feed_forward_length", 0, &Fe, d)) != WK_OK ||
        (e = wrk_gguf_u64_def(g, arch, "expert_shared_feed_forward_length", 0, &Fs, d)) != WK_OK ||
        (e = wrk_gguf_eps_key(g, arch, "attention.layer_norm_rms_epsilon", &eps, d)) != WK_OK)
        return e;
    char key[96];
    snprintf(key, sizeof(key), "%s.rope.freq_base", arch);
    wk_diag ed = {""};
    if ((e = wk_gguf_get_f64(g, key, &theta, &ed)) != WK_OK && e != WK_ENOENT)
        return wk_diag_set(d, e, "%s", ed.msg);
    if (L < 1 || L > WRK_GGUF_MAX_LAYERS || C < 1 || C > (1u << 17) || Hq < 1 || Hkv < 1 ||
        Hq % Hkv != 0 || Da < 2 || Da > 1024 || H < 1 || HV < 1 || HV % H != 0 || VD % HV != 0 ||
        K < 1 || K > 1024 || W < 2 || W > 64 || rope_dim < 2 || rope_dim > Da || interval < 1 ||
        (moe && !next && (E < 1 || k < 1 || k > E || Fe < 1)) ||
        (next && E > 0 && (k < 1 || k > E || Fe < 1)))
        return wk_diag_set(d, WK_EINVAL, "%s.* dimensions out of range or inconsistent", arch);
    const uint64_t Vd = VD / HV, r = HV / H;

    /* the layer kinds: attention.recurrent_layers, else every interval-th is attention */
    json_t *types = json_array();
    if (types == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    snprintf(key, sizeof(key), "%s.attention.recurrent_layers", arch);
    for (uint64_t l = 0; l < L; l++) {
        int64_t rec;
        wk_diag rd = {""};
        e = wk_gguf_arr_int(g, key, l, &rec, &rd);
        if (e == WK_ENOENT)
            rec = (l + 1) % interval != 0;
        else if (e != WK_OK) {
            json_decref(types);
            return wk_diag_set(d, e, "%s", rd.msg);
        }
        json_array_append_new(types, json_string(rec ? "linear_attention" : "full_attention"));
    }

    size_t nt = wk_gguf_tensor_count(g);
    vs->cap = nt + (size_t)L * (3 * E + 1);
    vs->v = calloc(vs->cap ? vs->cap : 1, sizeof(*vs->v));
    vs->names = calloc(vs->cap ? vs->cap : 1, sizeof(*vs->names));
    if (vs->v == NULL || vs->names == NULL) {
        json_decref(types);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    bool have_output = false;
    uint8_t routed[WRK_GGUF_MAX_LAYERS] = {0}; /* layers with a router (qwen3next) */
    for (size_t i = 0; i < nt && e == WK_OK; i++) {
        const wk_tensor *t = wk_gguf_tensor_at(g, i);
        const char *rest = NULL, *hf = NULL;
        long layer = wrk_gguf_layer(t->name, &rest);
        size_t ki = 0;
        if (layer < 0) {
            for (size_t m = 0; m < WRK_GGUF_N_Q35_GLOBAL_NAMES && hf == NULL; m++)
                if (strcmp(t->name, wrk_gguf_q35_global_names[m].gguf) == 0)
                    hf = wrk_gguf_q35_global_names[m].hf;
        } else if ((uint64_t)layer < L) {
            for (ki = 0; ki < WRK_GGUF_N_Q35_LAYER_NAMES; ki++)
                if (strcmp(rest, wrk_gguf_q35_layer_names[ki].gguf) == 0) {
                    hf = wrk_gguf_q35_layer_names[ki].hf;
                    break;
                }
        }
        if (hf == NULL) {
            e = wk_diag_set(d, WK_EINVAL, "%s: unexpected tensor for a %s GGUF file (MTP "
                            "layers: convert with --no-mtp)", t->name, arch);
            break;
        }
        const bool is_ba = layer >= 0 && strcmp(rest, "ssm_ba.weight") == 0;
        const bool is_b_or_a = layer >= 0 && (strcmp(rest, "ssm_beta.weight") == 0 ||
                                              strcmp(rest, "ssm_alpha.weight") == 0);
        if ((is_ba && !next) || (is_b_or_a && next)) { /* the other layout's tensor */
            e = wk_diag_set(d, WK_EINVAL, "%s: unexpected tensor for a %s GGUF file", t->name,
                            arch);
            break;
        }
        if (layer >= 0 && strcmp(rest, "ffn_gate_inp.weight") == 0)
            routed[layer] = 1;
        if (is_ba) {
            if ((e = wrk_gguf_next_ba(vs, own, t, layer, H, r, d)) != WK_OK)
                break;
            continue;
        }
        if (strstr(rest != NULL ? rest : "", "_exps.") != NULL) { /* stacked experts */
            if (t->ndim != 3 || t->shape[0] != (int64_t)E) {
                e = wk_diag_set(d, WK_EINVAL, "%s: expected [%" PRIu64 ", ., .] experts",
                                t->name, E);
                break;
            }
            const size_t per = t->nbytes / E;
            for (uint64_t x = 0; x < E; x++) {
                char full[128];
                snprintf(full, sizeof(full), "mlp.experts.%" PRIu64 ".%s.weight", x, hf);
                wk_tensor *o = wrk_gguf_view_add(vs, t, layer, full);
                if (o == NULL) {
                    e = wk_diag_set(d, WK_ENOMEM, "internal: view table full");
                    break;
                }
                o->ndim = 2;
                o->shape[0] = t->shape[1];
                o->shape[1] = t->shape[2];
                o->data = (const uint8_t *)t->data + x * per;
                o->nbytes = per;
            }
            continue;
        }
        wk_tensor *o = wrk_gguf_view_add(vs, t, layer < 0 ? -1 : layer, hf);
        if (o == NULL) {
            e = wk_diag_set(d, WK_ENOMEM, "internal: view table full");
            break;
        }
        if (layer < 0) {
            have_output = have_output || strcmp(hf, "lm_head.weight") == 0;
            continue;
        }
        const int64_t numel = wk_tensor_numel(t);
        const bool regroup = r > 1 && !next;
        if (strcmp(rest, "ssm_conv1d.weight") == 0) {
            if (t->ndim != 2 || t->shape[1] != (int64_t)W ||
                t->shape[0] != (int64_t)(2 * H * K + VD)) {
                e = wk_diag_set(d, WK_EINVAL, "%s: expected [%" PRIu64 ", %" PRIu64 "]", t->name,
                                2 * H * K + VD, W);
                break;
            }
            o->ndim = 3;
            o->shape[0] = t->shape[0];
            o->shape[1] = 1;
            o->shape[2] = t->shape[1];
            if (regroup)
                e = wrk_gguf_q35_regroup(own, o, (int64_t)(2 * H * K), H, r, (int64_t)Vd, false,
                                         d);
        } else if (strcmp(rest, "ssm_a") == 0 || strcmp(rest, "ssm_dt.bias") == 0) {
            if (numel != (int64_t)HV) {
                e = wk_diag_set(d, WK_EINVAL, "%s: expected %" PRIu64 " values", t->name, HV);
                break;
            }
            o->ndim = 1;
            o->shape[0] = numel;
            if (strcmp(rest, "ssm_a") == 0)
                e = wrk_gguf_a_log_view(own, t, o, HV, d);
            if (e == WK_OK && regroup)
                e = wrk_gguf_q35_regroup(own, o, 0, H, r, 1, false, d);
        } else if (strcmp(rest, "ffn_gate_inp_shexp.weight") == 0 && numel == (int64_t)C) {
            o->ndim = 2;
            o->shape[0] = 1;
            o->shape[1] = (int64_t)C;
        } else if (regroup && strcmp(rest, "attn_qkv.weight") == 0) {
            if (t->ndim != 2 || t->shape[0] != (int64_t)(2 * H * K + VD))
                e = wk_diag_set(d, WK_EINVAL, "%s: expected %" PRIu64 " rows", t->name,
                                2 * H * K + VD);
            else
                e = wrk_gguf_q35_regroup(own, o, (int64_t)(2 * H * K), H, r, (int64_t)Vd, false,
                                         d);
        } else if (regroup && strcmp(rest, "attn_gate.weight") == 0) {
            e = t->ndim == 2 && t->shape[0] == (int64_t)VD
                    ? wrk_gguf_q35_regroup(own, o, 0, H, r, (int64_t)Vd, false, d)
                    : wk_diag_set(d, WK_EINVAL, "%s: expected %" PRIu64 " rows", t->name, VD);
        } else if (regroup && (strcmp(rest, "ssm_alpha.weight") == 0 ||
                               strcmp(rest, "ssm_beta.weight") == 0)) {
            e = t->ndim == 2 && t->shape[0] == (int64_t)HV
                    ? wrk_gguf_q35_regroup(own, o, 0, H, r, 1, false, d)
                    : wk_diag_set(d, WK_EINVAL, "%s: expected %" PRIu64 " rows", t->name, HV);
        } else if (regroup && strcmp(rest, "ssm_out.weight") == 0) {
            e = t->ndim == 2 && t->shape[1] == (int64_t)VD
                    ? wrk_gguf_q35_regroup(own, o, 0, H, r, (int64_t)Vd, true, d)
                    : wk_diag_set(d, WK_EINVAL, "%s: expected %" PRIu64 " columns", t->name, VD);
        }
    }
    if (e != WK_OK) {
        json_decref(types);
        return e;
    }
    /* every other shape is checked by family/wrk_qwen35.c against these keys */
    json_t *c = json_pack(
        "{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:f, s:b, s:I, s:I, s:I, s:I, s:I, s:o, "
        "s:{s:s, s:f, s:f}, s:b, s:b}",
        "model_type", next ? "qwen3_next" : moe ? "qwen3_5_moe_text" : "qwen3_5_text",
        "hidden_size", (json_int_t)C,
        "num_hidden_layers", (json_int_t)L, "intermediate_size", (json_int_t)F,
        "num_attention_heads", (json_int_t)Hq, "num_key_value_heads", (json_int_t)Hkv,
        "head_dim", (json_int_t)Da, "hidden_act", "silu", "rms_norm_eps", eps,
        "tie_word_embeddings", !have_output, "linear_conv_kernel_dim", (json_int_t)W,
        "linear_key_head_dim", (json_int_t)K, "linear_value_head_dim", (json_int_t)Vd,
        "linear_num_key_heads", (json_int_t)H, "linear_num_value_heads", (json_int_t)HV,
        "layer_types", types, "rope_parameters", "rope_type", "default", "rope_theta", theta,
        "partial_rotary_factor", (double)rope_dim / (double)Da, "attention_bias", false,
        "wkvm_norms_include_one", true);
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    if (moe) {
        json_t *x = json_pack("{s:I, s:I, s:I, s:I}", "num_experts", (json_int_t)E,
                              "num_experts_per_tok", (json_int_t)k, "moe_intermediate_size",
                              (json_int_t)Fe, "shared_expert_intermediate_size", (json_int_t)Fs);
        json_t *dense = next ? json_array() : NULL;
        for (uint64_t l = 0; dense != NULL && l < L; l++)
            if (!routed[l] && json_array_append_new(dense, json_integer((json_int_t)l)) != 0) {
                json_decref(dense);
                dense = NULL;
            }
        int rc = x != NULL && (!next || dense != NULL) ? json_object_update(c, x) : -1;
        if (rc == 0 && next)
            rc = json_object_set_new(c, "mlp_only_layers", dense) |
                 json_object_set_new(c, "norm_topk_prob", json_true()) |
                 json_object_set_new(c, "wkvm_split_linear_proj", json_true());
        else
            json_decref(dense);
        json_decref(x);
        if (rc != 0) {
            json_decref(c);
            return wk_diag_set(d, WK_ENOMEM, "out of memory");
        }
    }
    *config = c;
    return WK_OK;
}

/* blk.N.<gguf> -> backbone.layers.N.<hf> for nemotron_h / nemotron_h_moe, with the kind it implies
 */
static const struct {
    const char *gguf; /* suffix after "blk.N." */
    const char *hf;   /* suffix after "backbone.layers.N." ("mixer.experts.<e>." for _exps) */
    char kind;        /* the layer kind the tensor shows (0: any) */
} wrk_gguf_nh_layer_names[] = {
    {"attn_norm.weight", "norm.weight", 0},
    {"ssm_in.weight", "mixer.in_proj.weight", 'M'},
    {"ssm_conv1d.weight", "mixer.conv1d.weight", 'M'}, /* [CD,K] -> [CD,1,K] */
    {"ssm_conv1d.bias", "mixer.conv1d.bias", 'M'},
    {"ssm_dt.bias", "mixer.dt_bias", 'M'},
    {"ssm_a", "mixer.A_log", 'M'},                 /* A = -exp(A_log) [H,1] -> A_log [H] */
    {"ssm_d", "mixer.D", 'M'},                     /* [H,1] -> [H] */
    {"ssm_norm.weight", "mixer.norm.weight", 'M'}, /* [G, d_inner/G] -> [d_inner] */
    {"ssm_out.weight", "mixer.out_proj.weight", 'M'},
    {"attn_q.weight", "mixer.q_proj.weight", '*'},
    {"attn_k.weight", "mixer.k_proj.weight", '*'},
    {"attn_v.weight", "mixer.v_proj.weight", '*'},
    {"attn_output.weight", "mixer.o_proj.weight", '*'},
    {"ffn_up.weight", "mixer.up_proj.weight", '-'},
    {"ffn_down.weight", "mixer.down_proj.weight", '-'},
    {"ffn_gate_inp.weight", "mixer.gate.weight", 'E'},
    {"exp_probs_b.bias", "mixer.gate.e_score_correction_bias", 'E'},
    {"ffn_up_shexp.weight", "mixer.shared_experts.up_proj.weight", 'E'},
    {"ffn_down_shexp.weight", "mixer.shared_experts.down_proj.weight", 'E'},
    {"ffn_up_exps.weight", "up_proj", 'E'}, /* [E, F, C] -> mixer.experts.<e>.up_proj.weight */
    {"ffn_down_exps.weight", "down_proj", 'E'},
};
#define WRK_GGUF_N_NH_LAYER_NAMES                                                                  \
    (sizeof(wrk_gguf_nh_layer_names) / sizeof(wrk_gguf_nh_layer_names[0]))

/* Adds t as backbone.layers.<layer>.<name>. */
static wk_tensor *
wrk_gguf_nh_add(wrk_gguf_views *vs, const wk_tensor *t, long layer, const char *name)
{
    char full[128];
    snprintf(full, sizeof(full), "backbone.layers.%ld.%s", layer, name);
    return wrk_gguf_view_add(vs, t, -1, full);
}

/*
 * Undoes the converter's q / k row permutation (llama.cpp's rope layout: per
 * head of d rows, row 2 i + j of the file is row j d/2 + i of the checkpoint)
 * into an owned copy: wkvm's attention is position-free here, and the
 * checkpoint's order keeps its sums in the checkpoint's order.
 */
static wk_err
wrk_gguf_nh_unpermute(wrk_gguf_owner *own, wk_tensor *o, uint64_t n_head, wk_diag *d)
{
    const size_t rb = wrk_gguf_row_bytes(o);
    if (o->ndim != 2 || n_head == 0 || o->shape[0] % (int64_t)(2 * n_head) != 0 || rb == 0)
        return wk_diag_set(d, WK_EINVAL, "%s: %" PRId64 " rows, not %" PRIu64 " heads of pairs",
                           o->name, o->ndim >= 1 ? o->shape[0] : 0, n_head);
    const uint64_t hd = (uint64_t)o->shape[0] / n_head, half = hd / 2;
    uint8_t *dst = wrk_gguf_owned(own, (size_t)o->shape[0] * rb);
    if (dst == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    const uint8_t *src = o->data;
    for (uint64_t h = 0; h < n_head; h++)
        for (uint64_t i = 0; i < half; i++)
            for (uint64_t j = 0; j < 2; j++)
                memcpy(dst + (size_t)(h * hd + j * half + i) * rb,
                       src + (size_t)(h * hd + 2 * i + j) * rb, rb);
    o->data = dst;
    return WK_OK;
}

/* Index of GGUF layer suffix rest in wrk_gguf_nh_layer_names, or -1. */
static int
wrk_gguf_nh_find(const char *rest)
{
    for (size_t k = 0; k < WRK_GGUF_N_NH_LAYER_NAMES; k++)
        if (strcmp(rest, wrk_gguf_nh_layer_names[k].gguf) == 0)
            return (int)k;
    return -1;
}

/* Reads the optional float <arch>.<key> as the shortest decimal of its float32, def when absent. */
static wk_err
wrk_gguf_f64_def(const wk_gguf *g, const char *arch, const char *key, double def, double *out,
                 wk_diag *d)
{
    char k[96];
    snprintf(k, sizeof(k), "%s.%s", arch, key);
    wk_diag ed = {""};
    wk_err e = wk_gguf_get_f64(g, k, out, &ed);
    if (e == WK_ENOENT) {
        *out = def;
        return WK_OK;
    }
    if (e != WK_OK)
        return wk_diag_set(d, e, "%s", ed.msg);
    *out = wrk_gguf_eps(*out);
    return WK_OK;
}

/*
 * The Mamba2-hybrid layouts (nemotron_h, granitehybrid) back in the
 * checkpoint's shapes, for view o of GGUF tensor t (name tail rest): q / k
 * rows un-permuted (Hq query, Hkv KV heads; 0: Hq), the squeezed conv
 * [conv_dim, K2] as [conv_dim, 1, K2], A / D / the gated norm / the router's
 * score bias as 1-D, and A (ssm_a, H values) as A_log. Other tensors stay.
 */
static wk_err
wrk_gguf_m2h_view(wrk_gguf_owner *own, const wk_tensor *t, wk_tensor *o, const char *rest,
                  uint64_t Hq, uint64_t Hkv, uint64_t K2, uint64_t H, wk_diag *d)
{
    const int64_t numel = wk_tensor_numel(t);
    if (strcmp(rest, "attn_q.weight") == 0 || strcmp(rest, "attn_k.weight") == 0)
        return wrk_gguf_nh_unpermute(own, o, rest[5] == 'q' ? Hq : (Hkv ? Hkv : Hq), d);
    if (strcmp(rest, "ssm_conv1d.weight") == 0) {
        if (t->ndim != 2 || t->shape[1] != (int64_t)K2)
            return wk_diag_set(d, WK_EINVAL, "%s: expected [conv_dim, %" PRIu64 "]", t->name, K2);
        o->ndim = 3;
        o->shape[0] = t->shape[0];
        o->shape[1] = 1;
        o->shape[2] = t->shape[1];
        return WK_OK;
    }
    if (strcmp(rest, "ssm_a") == 0 || strcmp(rest, "ssm_d") == 0 ||
        strcmp(rest, "ssm_norm.weight") == 0 || strcmp(rest, "exp_probs_b.bias") == 0) {
        o->ndim = 1;
        o->shape[0] = numel;
        if (strcmp(rest, "ssm_a") != 0)
            return WK_OK;
        if (numel != (int64_t)H)
            return wk_diag_set(d, WK_EINVAL, "%s: expected %" PRIu64 " values", t->name, H);
        return wrk_gguf_a_log_view(own, t, o, H, d);
    }
    return WK_OK;
}

/*
 * Maps the tensors of a nemotron_h / nemotron_h_moe file (llama.cpp's
 * NemotronHModel) back to the checkpoint's names and builds its config:
 * the layer kinds from the tensors each block holds (ssm_* Mamba2, attn_q
 * attention, ffn_up MLP, ffn_gate_inp MoE), the stacked experts split into
 * one view each, A = -exp(A_log) turned back into A_log (as for Mamba2), the
 * squeezed conv and the grouped norm reshaped, q / k rows put back in the
 * checkpoint's order (wrk_gguf_nh_unpermute).
 */
static wk_err
wrk_gguf_nemotron_h(const wk_gguf *g, wrk_gguf_views *vs, wrk_gguf_owner *own, const char *arch,
                    json_t **config, wk_diag *d)
{
    uint64_t L, C, Hq, Da, K2, N, G, H, DI, E = 0, k = 0, Fe = 0, Fs = 0, ng = 1, tg = 1, nrm = 1;
    double eps, scale = 1.0;
    wk_err e;
    const bool moe = strcmp(arch, "nemotron_h_moe") == 0;
    if ((e = wrk_gguf_u64(g, arch, "block_count", &L, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "embedding_length", &C, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "attention.head_count", &Hq, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "attention.key_length", &Da, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.conv_kernel", &K2, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.state_size", &N, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.group_count", &G, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.time_step_rank", &H, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.inner_size", &DI, d)) != WK_OK ||
        (e = wrk_gguf_eps_key(g, arch, "attention.layer_norm_epsilon", &eps, d)) != WK_OK)
        return e;
    if (moe &&
        ((e = wrk_gguf_u64(g, arch, "expert_count", &E, d)) != WK_OK ||
         (e = wrk_gguf_u64(g, arch, "expert_used_count", &k, d)) != WK_OK ||
         (e = wrk_gguf_u64(g, arch, "expert_feed_forward_length", &Fe, d)) != WK_OK ||
         (e = wrk_gguf_u64_def(g, arch, "expert_shared_feed_forward_length", 0, &Fs, d)) != WK_OK ||
         (e = wrk_gguf_u64_def(g, arch, "expert_group_count", 1, &ng, d)) != WK_OK ||
         (e = wrk_gguf_u64_def(g, arch, "expert_group_used_count", 1, &tg, d)) != WK_OK ||
         (e = wrk_gguf_u64_def(g, arch, "expert_weights_norm", 1, &nrm, d)) != WK_OK ||
         (e = wrk_gguf_f64_def(g, arch, "expert_weights_scale", 1.0, &scale, d)) != WK_OK))
        return e;
    if (L < 1 || L > WRK_GGUF_MAX_LAYERS || C < 1 || C > (1u << 17) || Hq < 1 || Da < 1 ||
        Da > 1024 || K2 < 2 || K2 > 64 || N < 1 || N > 4096 || H < 1 || G < 1 || H % G != 0 ||
        DI < H || DI % H != 0 || DI > (1u << 20) || (moe && (E < 1 || E > 4096 || k < 1)))
        return wk_diag_set(d, WK_EINVAL, "%s.* dimensions out of range or inconsistent", arch);

    /* the layer kinds, from the tensors each block holds */
    char *kinds = wrk_gguf_owned(own, L + 1);
    if (kinds == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    memset(kinds, 0, L + 1);
    size_t nt = wk_gguf_tensor_count(g);
    uint64_t F = 0, Hkv = 0;
    bool have_output = false, conv_bias = false;
    for (size_t i = 0; i < nt; i++) {
        const wk_tensor *t = wk_gguf_tensor_at(g, i);
        const char *rest = NULL;
        long layer = wrk_gguf_layer(t->name, &rest);
        if (layer < 0) {
            have_output = have_output || strcmp(t->name, "output.weight") == 0;
            continue;
        }
        int ki = (uint64_t)layer < L ? wrk_gguf_nh_find(rest) : -1;
        if (ki < 0)
            return wk_diag_set(d, WK_EINVAL,
                               "%s: unexpected tensor for a %s GGUF file (MTP layers: convert "
                               "with --no-mtp)",
                               t->name, arch);
        const char kind = wrk_gguf_nh_layer_names[ki].kind;
        if (kind == 0)
            continue;
        if (kinds[layer] != 0 && kinds[layer] != kind)
            return wk_diag_set(d, WK_EINVAL, "%s: block %ld holds tensors of two kinds", t->name,
                               layer);
        kinds[layer] = kind;
        conv_bias = conv_bias || strcmp(rest, "ssm_conv1d.bias") == 0;
        if (strcmp(rest, "ffn_up.weight") == 0 && t->ndim == 2)
            F = (uint64_t)t->shape[0];
        if (strcmp(rest, "attn_k.weight") == 0 && t->ndim == 2)
            Hkv = (uint64_t)t->shape[0] / Da;
    }
    json_t *types = json_array();
    if (types == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    for (uint64_t l = 0; l < L; l++) {
        const char *name = kinds[l] == 'M'   ? "linear_attention"
                           : kinds[l] == '*' ? "full_attention"
                           : kinds[l] == '-' ? "mlp"
                           : kinds[l] == 'E' ? "moe"
                                             : NULL;
        if (name == NULL) {
            json_decref(types);
            return wk_diag_set(d, WK_EINVAL, "blk.%" PRIu64 ": no mixer tensors", l);
        }
        json_array_append_new(types, json_string(name));
    }

    vs->cap = nt + (size_t)L * 2 * E;
    vs->v = calloc(vs->cap ? vs->cap : 1, sizeof(*vs->v));
    vs->names = calloc(vs->cap ? vs->cap : 1, sizeof(*vs->names));
    if (vs->v == NULL || vs->names == NULL) {
        json_decref(types);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < nt && e == WK_OK; i++) {
        const wk_tensor *t = wk_gguf_tensor_at(g, i);
        const char *rest = NULL, *hf = NULL;
        long layer = wrk_gguf_layer(t->name, &rest);
        if (layer < 0) {
            for (size_t m = 0; m < WRK_GGUF_N_M2_GLOBAL_NAMES && hf == NULL; m++)
                if (strcmp(t->name, wrk_gguf_m2_global_names[m].gguf) == 0)
                    hf = wrk_gguf_m2_global_names[m].hf;
            if (hf == NULL) {
                e = wk_diag_set(d, WK_EINVAL, "%s: unexpected tensor for a %s GGUF file", t->name,
                                arch);
                break;
            }
            if (wrk_gguf_view_add(vs, t, -1, hf) == NULL)
                e = wk_diag_set(d, WK_ENOMEM, "internal: view table full");
            continue;
        }
        hf = wrk_gguf_nh_layer_names[wrk_gguf_nh_find(rest)].hf;
        if (strstr(rest, "_exps.") != NULL) { /* stacked experts: whole rows each, any dtype */
            if (t->ndim != 3 || t->shape[0] != (int64_t)E) {
                e = wk_diag_set(d, WK_EINVAL, "%s: expected [%" PRIu64 ", ., .] experts", t->name,
                                E);
                break;
            }
            const size_t per = t->nbytes / E;
            for (uint64_t x = 0; x < E && e == WK_OK; x++) {
                char full[128];
                snprintf(full, sizeof(full), "mixer.experts.%" PRIu64 ".%s.weight", x, hf);
                wk_tensor *o = wrk_gguf_nh_add(vs, t, layer, full);
                if (o == NULL) {
                    e = wk_diag_set(d, WK_ENOMEM, "internal: view table full");
                    break;
                }
                o->ndim = 2;
                o->shape[0] = t->shape[1];
                o->shape[1] = t->shape[2];
                o->data = (const uint8_t *)t->data + x * per;
                o->nbytes = per;
            }
            continue;
        }
        wk_tensor *o = wrk_gguf_nh_add(vs, t, layer, hf);
        if (o == NULL) {
            e = wk_diag_set(d, WK_ENOMEM, "internal: view table full");
            break;
        }
        e = wrk_gguf_m2h_view(own, t, o, rest, Hq, Hkv, K2, H, d);
    }
    if (e != WK_OK) {
        json_decref(types);
        return e;
    }
    /* every other shape is checked by family/wrk_nemotron_h.c against these keys */
    json_t *c = json_pack(
        "{s:s, s:I, s:o, s:I, s:I, s:I, s:I, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:b, s:f, s:b}",
        "model_type", "nemotron_h", "hidden_size", (json_int_t)C, "layers_block_type", types,
        "num_attention_heads", (json_int_t)Hq, "num_key_value_heads", (json_int_t)(Hkv ? Hkv : Hq),
        "head_dim", (json_int_t)Da, "intermediate_size", (json_int_t)(F ? F : 1), "mlp_hidden_act",
        "relu2", "mamba_hidden_act", "silu", "mamba_num_heads", (json_int_t)H, "mamba_head_dim",
        (json_int_t)(DI / H), "n_groups", (json_int_t)G, "ssm_state_size", (json_int_t)N,
        "conv_kernel", (json_int_t)K2, "use_conv_bias", conv_bias, "layer_norm_epsilon", eps,
        "tie_word_embeddings", !have_output);
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    if (moe) {
        json_t *x =
            json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:f}", "n_routed_experts", (json_int_t)E,
                      "num_experts_per_tok", (json_int_t)k, "moe_intermediate_size", (json_int_t)Fe,
                      "moe_shared_expert_intermediate_size", (json_int_t)(Fs ? Fs : 1), "n_group",
                      (json_int_t)ng, "topk_group", (json_int_t)tg, "norm_topk_prob", nrm != 0,
                      "routed_scaling_factor", scale);
        int rc = x != NULL ? json_object_update(c, x) : -1;
        json_decref(x);
        if (rc != 0) {
            json_decref(c);
            return wk_diag_set(d, WK_ENOMEM, "out of memory");
        }
    }
    *config = c;
    return WK_OK;
}

/* blk.N.<gguf> -> model.layers.N.<hf> for granitehybrid, with the kind it implies */
static const struct {
    const char *gguf; /* suffix after "blk.N." */
    const char *hf;   /* suffix after "model.layers.N." (NULL: fused below) */
    char kind;        /* the mixer kind the tensor shows: 'M' Mamba2, '*' attention, 0 any */
} wrk_gguf_gh_layer_names[] = {
    {"attn_norm.weight", "input_layernorm.weight", 0},
    {"ffn_norm.weight", "post_attention_layernorm.weight", 0},
    {"ssm_in.weight", "mamba.in_proj.weight", 'M'},
    {"ssm_conv1d.weight", "mamba.conv1d.weight", 'M'}, /* [CD,K] -> [CD,1,K] */
    {"ssm_conv1d.bias", "mamba.conv1d.bias", 'M'},
    {"ssm_dt.bias", "mamba.dt_bias", 'M'},
    {"ssm_a", "mamba.A_log", 'M'},                 /* A = -exp(A_log) [H,1] -> A_log [H] */
    {"ssm_d", "mamba.D", 'M'},                     /* [H,1] -> [H] */
    {"ssm_norm.weight", "mamba.norm.weight", 'M'}, /* [G, d_inner/G] -> [d_inner] */
    {"ssm_out.weight", "mamba.out_proj.weight", 'M'},
    {"attn_q.weight", "self_attn.q_proj.weight", '*'},
    {"attn_k.weight", "self_attn.k_proj.weight", '*'},
    {"attn_v.weight", "self_attn.v_proj.weight", '*'},
    {"attn_output.weight", "self_attn.o_proj.weight", '*'},
    {"ffn_down.weight", "shared_mlp.output_linear.weight", 0},
    {"ffn_down_shexp.weight", "shared_mlp.output_linear.weight", 0},
    {"ffn_gate_inp.weight", "block_sparse_moe.router.layer.weight", 0},
    {"ffn_down_exps.weight", "block_sparse_moe.output_linear.weight", 0},
    {"ffn_gate.weight", NULL, 0}, /* + ffn_up: shared_mlp.input_linear [gate; up] */
    {"ffn_up.weight", NULL, 0},
    {"ffn_gate_shexp.weight", NULL, 0},
    {"ffn_up_shexp.weight", NULL, 0},
    {"ffn_gate_exps.weight", NULL, 0}, /* + ffn_up_exps: block_sparse_moe.input_linear */
    {"ffn_up_exps.weight", NULL, 0},
};
#define WRK_GGUF_N_GH_LAYER_NAMES                                                                  \
    (sizeof(wrk_gguf_gh_layer_names) / sizeof(wrk_gguf_gh_layer_names[0]))

/* Index of GGUF layer suffix rest in wrk_gguf_gh_layer_names, or -1. */
static int
wrk_gguf_gh_find(const char *rest)
{
    for (size_t k = 0; k < WRK_GGUF_N_GH_LAYER_NAMES; k++)
        if (strcmp(rest, wrk_gguf_gh_layer_names[k].gguf) == 0)
            return (int)k;
    return -1;
}

/*
 * Adds model.layers.<layer>.<name>, Granite's fused input_linear, from the
 * converter's split halves: per expert (or once, E = 1) the gate rows then
 * the up rows, as transformers' GraniteMoeHybrid checkpoints hold them, in an
 * owned copy. gate and up must agree in type and shape ([F, C] or [E, F, C]).
 */
static wk_err
wrk_gguf_gh_fuse(wrk_gguf_views *vs, wrk_gguf_owner *own, const wk_tensor *gate,
                 const wk_tensor *up, long layer, const char *name, wk_diag *d)
{
    if (gate->dtype != up->dtype || gate->ndim != up->ndim || gate->nbytes != up->nbytes ||
        (gate->ndim != 2 && gate->ndim != 3))
        return wk_diag_set(d, WK_EINVAL, "%s and %s differ in type or shape", gate->name, up->name);
    for (int i = 0; i < (int)gate->ndim; i++)
        if (gate->shape[i] != up->shape[i] || gate->shape[i] < 1)
            return wk_diag_set(d, WK_EINVAL, "%s and %s differ in shape", gate->name, up->name);
    const uint64_t E = gate->ndim == 3 ? (uint64_t)gate->shape[0] : 1;
    const size_t per = gate->nbytes / E;
    uint8_t *dst = wrk_gguf_owned(own, 2 * gate->nbytes);
    if (dst == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory fusing %s", gate->name);
    for (uint64_t x = 0; x < E; x++) {
        memcpy(dst + 2 * x * per, (const uint8_t *)gate->data + x * per, per);
        memcpy(dst + (2 * x + 1) * per, (const uint8_t *)up->data + x * per, per);
    }
    wk_tensor *o = wrk_gguf_view_add(vs, gate, layer, name);
    if (o == NULL)
        return wk_diag_set(d, WK_ENOMEM, "internal: view table full");
    o->shape[o->ndim - 2] *= 2;
    o->data = dst;
    o->nbytes = 2 * gate->nbytes;
    return WK_OK;
}

/*
 * Maps the tensors of a granitehybrid file (llama.cpp's GraniteHybridModel,
 * IBM's Granite-4.0-H) back to transformers' GraniteMoeHybrid names and
 * builds its config. What the converter changed, undone: the layer kinds
 * come from the tensors each block holds (ssm_* Mamba2, attn_q attention);
 * the fused input_linear of the shared MLP and of the experts was split into
 * gate and up halves (fused again, wrk_gguf_gh_fuse); A_log became
 * A = -exp(A_log) (turned back as for Mamba2), the conv was squeezed and the
 * grouped norm reshaped; q / k rows were permuted into llama.cpp's rope
 * layout (put back, wrk_gguf_nh_unpermute: the converter permutes with or
 * without RoPE); Granite's multipliers are the *_scale keys; the file has
 * no head_dim (hidden / heads, as Granite's config) and says whether the
 * attention uses RoPE in rope.scaling.finetuned. The vocabulary the
 * converter pads to a multiple of 8 is the tokenizer's only: the embedding
 * keeps the checkpoint's rows.
 */
static wk_err
wrk_gguf_granite_h(const wk_gguf *g, wrk_gguf_views *vs, wrk_gguf_owner *own, json_t **config,
                   wk_diag *d)
{
    const char *arch = "granitehybrid";
    uint64_t L, C, Hq, K2, N, G, H, DI, E = 0, k = 0, Fe = 0, Fs = 0, rope = 0;
    double eps, emb_mul, res_mul, attn_mul, logit_div, theta;
    wk_err e;
    if ((e = wrk_gguf_u64(g, arch, "block_count", &L, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "embedding_length", &C, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "attention.head_count", &Hq, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.conv_kernel", &K2, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.state_size", &N, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.group_count", &G, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.time_step_rank", &H, d)) != WK_OK ||
        (e = wrk_gguf_u64(g, arch, "ssm.inner_size", &DI, d)) != WK_OK ||
        (e = wrk_gguf_u64_def(g, arch, "expert_count", 0, &E, d)) != WK_OK ||
        (e = wrk_gguf_u64_def(g, arch, "expert_used_count", 0, &k, d)) != WK_OK ||
        (e = wrk_gguf_u64_def(g, arch, "rope.scaling.finetuned", 0, &rope, d)) != WK_OK ||
        (e = wrk_gguf_eps_key(g, arch, "attention.layer_norm_rms_epsilon", &eps, d)) != WK_OK ||
        (e = wrk_gguf_f64_def(g, arch, "embedding_scale", 1.0, &emb_mul, d)) != WK_OK ||
        (e = wrk_gguf_f64_def(g, arch, "residual_scale", 1.0, &res_mul, d)) != WK_OK ||
        (e = wrk_gguf_f64_def(g, arch, "attention.scale", 1.0, &attn_mul, d)) != WK_OK ||
        (e = wrk_gguf_f64_def(g, arch, "logit_scale", 1.0, &logit_div, d)) != WK_OK ||
        (e = wrk_gguf_f64_def(g, arch, "rope.freq_base", 10000.0, &theta, d)) != WK_OK)
        return e;
    if (L < 1 || L > WRK_GGUF_MAX_LAYERS || C < 1 || C > (1u << 17) || Hq < 1 || C % Hq != 0 ||
        K2 < 2 || K2 > 64 || N < 1 || N > 4096 || H < 1 || G < 1 || H % G != 0 || DI < H ||
        DI % H != 0 || DI % C != 0 || DI > (1u << 20) || E > 4096 || (E > 0 && k < 1))
        return wk_diag_set(d, WK_EINVAL, "%s.* dimensions out of range or inconsistent", arch);
    const uint64_t Da = C / Hq;

    /* the mixer kinds, from the tensors each block holds */
    char *kinds = wrk_gguf_owned(own, L + 1);
    if (kinds == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    memset(kinds, 0, L + 1);
    size_t nt = wk_gguf_tensor_count(g);
    uint64_t Hkv = 0;
    bool have_output = false;
    for (size_t i = 0; i < nt; i++) {
        const wk_tensor *t = wk_gguf_tensor_at(g, i);
        const char *rest = NULL;
        long layer = wrk_gguf_layer(t->name, &rest);
        if (layer < 0) {
            have_output = have_output || strcmp(t->name, "output.weight") == 0;
            continue;
        }
        int ki = (uint64_t)layer < L ? wrk_gguf_gh_find(rest) : -1;
        if (ki < 0)
            return wk_diag_set(d, WK_EINVAL, "%s: unexpected tensor for a %s GGUF file", t->name,
                               arch);
        if (strcmp(rest, "attn_k.weight") == 0 && t->ndim == 2)
            Hkv = (uint64_t)t->shape[0] / Da;
        if (strcmp(rest, "ffn_up_exps.weight") == 0 && t->ndim == 3)
            Fe = (uint64_t)t->shape[1];
        if ((strcmp(rest, "ffn_up.weight") == 0 || strcmp(rest, "ffn_up_shexp.weight") == 0) &&
            t->ndim == 2)
            Fs = (uint64_t)t->shape[0];
        const char kind = wrk_gguf_gh_layer_names[ki].kind;
        if (kind == 0)
            continue;
        if (kinds[layer] != 0 && kinds[layer] != kind)
            return wk_diag_set(d, WK_EINVAL, "%s: block %ld holds tensors of two kinds", t->name,
                               layer);
        kinds[layer] = kind;
    }
    json_t *types = json_array();
    if (types == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    for (uint64_t l = 0; l < L; l++) {
        if (kinds[l] == 0) {
            json_decref(types);
            return wk_diag_set(d, WK_EINVAL, "blk.%" PRIu64 ": no mixer tensors", l);
        }
        json_array_append_new(types, json_string(kinds[l] == 'M' ? "mamba" : "attention"));
    }

    vs->cap = nt;
    vs->v = calloc(vs->cap ? vs->cap : 1, sizeof(*vs->v));
    vs->names = calloc(vs->cap ? vs->cap : 1, sizeof(*vs->names));
    if (vs->v == NULL || vs->names == NULL) {
        json_decref(types);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < nt && e == WK_OK; i++) {
        const wk_tensor *t = wk_gguf_tensor_at(g, i);
        const char *rest = NULL;
        long layer = wrk_gguf_layer(t->name, &rest);
        if (layer < 0) {
            const char *hf = NULL;
            if (strcmp(t->name, "token_embd.weight") == 0)
                hf = "model.embed_tokens.weight";
            else if (strcmp(t->name, "output_norm.weight") == 0)
                hf = "model.norm.weight";
            else if (strcmp(t->name, "output.weight") == 0)
                hf = "lm_head.weight";
            if (hf == NULL)
                e = wk_diag_set(d, WK_EINVAL, "%s: unexpected tensor for a %s GGUF file", t->name,
                                arch);
            else if (wrk_gguf_view_add(vs, t, -1, hf) == NULL)
                e = wk_diag_set(d, WK_ENOMEM, "internal: view table full");
            continue;
        }
        const char *hf = wrk_gguf_gh_layer_names[wrk_gguf_gh_find(rest)].hf;
        if (hf == NULL) { /* a gate half: fused with its up half; the up half is taken there */
            const char *p = strstr(rest, "ffn_gate");
            if (p == NULL)
                continue;
            char upn[64];
            snprintf(upn, sizeof(upn), "blk.%ld.ffn_up%s", layer, rest + strlen("ffn_gate"));
            const wk_tensor *up = wk_gguf_tensor_find(g, upn);
            if (up == NULL) {
                e = wk_diag_set(d, WK_EINVAL, "%s: no %s to go with it", t->name, upn);
                break;
            }
            e = wrk_gguf_gh_fuse(vs, own, t, up, layer,
                                 strstr(rest, "_exps") != NULL
                                     ? "block_sparse_moe.input_linear.weight"
                                     : "shared_mlp.input_linear.weight",
                                 d);
            continue;
        }
        wk_tensor *o = wrk_gguf_view_add(vs, t, layer, hf);
        if (o == NULL) {
            e = wk_diag_set(d, WK_ENOMEM, "internal: view table full");
            break;
        }
        e = wrk_gguf_m2h_view(own, t, o, rest, Hq, Hkv, K2, H, d);
    }
    if (e != WK_OK) {
        json_decref(types);
        return e;
    }
    const wk_tensor *emb = wk_gguf_tensor_find(g, "token_embd.weight");
    /* every shape is checked by family/wrk_granite_h.c against these keys */
    json_t *c = json_pack(
        "{s:s, s:I, s:I, s:I, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
        " s:s, s:f, s:f, s:f, s:f, s:f, s:b, s:{s:s, s:f}}",
        "model_type", "granitemoehybrid", "hidden_size", (json_int_t)C, "vocab_size",
        (json_int_t)(emb != NULL && emb->ndim == 2 ? emb->shape[0] : 0), "num_hidden_layers",
        (json_int_t)L, "layer_types", types, "num_attention_heads", (json_int_t)Hq,
        "num_key_value_heads", (json_int_t)(Hkv ? Hkv : Hq), "mamba_n_heads", (json_int_t)H,
        "mamba_d_head", (json_int_t)(DI / H), "mamba_expand", (json_int_t)(DI / C),
        "mamba_n_groups", (json_int_t)G, "mamba_d_state", (json_int_t)N, "mamba_d_conv",
        (json_int_t)K2, "num_local_experts", (json_int_t)E, "num_experts_per_tok",
        (json_int_t)(k ? k : 1), "intermediate_size", (json_int_t)(Fe ? Fe : 1),
        "shared_intermediate_size", (json_int_t)(Fs ? Fs : 1), "position_embedding_type",
        rope ? "rope" : "nope", "rms_norm_eps", eps, "embedding_multiplier", emb_mul,
        "residual_multiplier", res_mul, "attention_multiplier", attn_mul, "logits_scaling",
        logit_div, "tie_word_embeddings", !have_output, "rope_parameters", "rope_type", "default",
        "rope_theta", theta);
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    *config = c;
    return WK_OK;
}

wk_err
wrk_gguf_open(const char *path, wk_tensor_set **set, json_t **config, wk_diag *d)
{
    wrk_gguf_owner *own = calloc(1, sizeof(*own));
    wrk_gguf_views vs = {0};
    json_t *cfg = NULL;
    if (own == NULL)
        return wk_diag_set(d, WK_ENOMEM, "%s: out of memory", path);
    wk_err e = wk_gguf_open(path, &own->g, d);
    if (e != WK_OK) {
        free(own);
        return e;
    }

    const char *arch;
    size_t arch_len;
    if ((e = wk_gguf_get_str(own->g, "general.architecture", &arch, &arch_len, d)) != WK_OK)
        goto fail;
    if (arch_len == 5 && memcmp(arch, "rwkv7", 5) == 0) {
        e = wrk_gguf_rwkv7(own->g, &vs, &cfg, d);
    } else if (arch_len == 6 && memcmp(arch, "mamba2", 6) == 0) {
        e = wrk_gguf_mamba2(own->g, &vs, &own->extra, &cfg, d);
    } else if (arch_len == 6 && memcmp(arch, "qwen35", 6) == 0) {
        e = wrk_gguf_qwen35(own->g, &vs, own, "qwen35", &cfg, d);
    } else if (arch_len == 9 && memcmp(arch, "qwen35moe", 9) == 0) {
        e = wrk_gguf_qwen35(own->g, &vs, own, "qwen35moe", &cfg, d);
    } else if (arch_len == 9 && memcmp(arch, "qwen3next", 9) == 0) {
        e = wrk_gguf_qwen35(own->g, &vs, own, "qwen3next", &cfg, d);
    } else if (arch_len == 10 && memcmp(arch, "nemotron_h", 10) == 0) {
        e = wrk_gguf_nemotron_h(own->g, &vs, own, "nemotron_h", &cfg, d);
    } else if (arch_len == 14 && memcmp(arch, "nemotron_h_moe", 14) == 0) {
        e = wrk_gguf_nemotron_h(own->g, &vs, own, "nemotron_h_moe", &cfg, d);
    } else if (arch_len == 13 && memcmp(arch, "granitehybrid", 13) == 0) {
        e = wrk_gguf_granite_h(own->g, &vs, own, &cfg, d);
    } else {
        e = wk_diag_set(d, WK_ENOTSUP,
                        "general.architecture \"%.*s\": only rwkv7, mamba2, qwen35, "
                        "qwen35moe, qwen3next, nemotron_h, nemotron_h_moe and granitehybrid "
                        "GGUF files are supported",
                        (int)(arch_len > 64 ? 64 : arch_len), arch);
    }
    if (e != WK_OK)
        goto fail;
    if ((e = wk_tensor_set_new(vs.v, vs.n, own, wrk_gguf_owner_free, set, d)) != WK_OK)
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
    wrk_gguf_owner_free(own);
    return e;
}

/* The GGUF name of the HF layer tensor suffix hf (after "<prefix>N."), or NULL. */
static const char *
wrk_gguf_layer_gguf_name(bool mamba2, const char *hf, size_t len)
{
    if (!mamba2) {
        for (size_t k = 0; k < WRK_GGUF_N_LAYER_NAMES; k++) {
            const char *h = wrk_gguf_layer_names[k].hf;
            if (h != NULL && strlen(h) == len && memcmp(h, hf, len) == 0)
                return wrk_gguf_layer_names[k].gguf;
        }
        for (int k = 0; k < 6; k++)
            if (strlen(wrk_gguf_lerp[k]) == len && memcmp(wrk_gguf_lerp[k], hf, len) == 0)
                return "time_mix_lerp_fused.weight";
        return NULL;
    }
    for (size_t k = 0; k < WRK_GGUF_N_M2_LAYER_NAMES; k++) {
        const char *h = wrk_gguf_m2_layer_names[k].hf;
        if (strlen(h) == len && memcmp(h, hf, len) == 0)
            return wrk_gguf_m2_layer_names[k].gguf;
    }
    return NULL;
}

static bool
wrk_gguf_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.';
}

void
wrk_gguf_diag_names(wk_diag *d)
{
    if (d == NULL)
        return;
    const char *msg = d->msg;
    char hint[160] = "";
    /* the first tensor name in the message that this module made */
    for (const char *p = msg; *p != '\0' && hint[0] == '\0'; p++) {
        if (p > msg && wrk_gguf_name_char(p[-1]))
            continue; /* only at the start of a name */
        size_t n = 0;
        while (wrk_gguf_name_char(p[n]))
            n++;
        if (n == 0)
            continue;
        while (n > 0 && p[n - 1] == '.')
            n--; /* a sentence's full stop */
        for (size_t k = 0; k < WRK_GGUF_N_GLOBAL_NAMES && hint[0] == '\0'; k++)
            if (strlen(wrk_gguf_global_names[k].hf) == n &&
                memcmp(wrk_gguf_global_names[k].hf, p, n) == 0)
                snprintf(hint, sizeof(hint), "%s", wrk_gguf_global_names[k].gguf);
        for (size_t k = 0; k < WRK_GGUF_N_M2_GLOBAL_NAMES && hint[0] == '\0'; k++)
            if (strlen(wrk_gguf_m2_global_names[k].hf) == n &&
                memcmp(wrk_gguf_m2_global_names[k].hf, p, n) == 0)
                snprintf(hint, sizeof(hint), "%s", wrk_gguf_m2_global_names[k].gguf);
        static const char *const prefixes[2] = {"model.layers.", "backbone.layers."};
        for (int m = 0; m < 2 && hint[0] == '\0'; m++) {
            size_t pl = strlen(prefixes[m]);
            if (n <= pl || memcmp(p, prefixes[m], pl) != 0)
                continue;
            size_t i = pl;
            unsigned long layer = 0;
            while (i < n && p[i] >= '0' && p[i] <= '9' && layer < WRK_GGUF_MAX_LAYERS)
                layer = layer * 10 + (unsigned long)(p[i++] - '0');
            if (i == pl || i >= n || p[i] != '.')
                continue;
            const char *g = wrk_gguf_layer_gguf_name(m == 1, p + i + 1, n - i - 1);
            if (g != NULL)
                snprintf(hint, sizeof(hint), "blk.%lu.%s", layer, g);
        }
        p += n > 0 ? n - 1 : 0;
    }
    if (hint[0] == '\0')
        return;
    size_t used = strlen(msg);
    snprintf(d->msg + used, sizeof(d->msg) - used, " (GGUF %s)", hint);
}
