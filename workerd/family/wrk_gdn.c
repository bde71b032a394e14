/*
 * wrk_gdn: the Gated DeltaNet family (flash-linear-attention
 * `gated_deltanet` checkpoints) for wrk_model: detection, the mapping of the
 * tensors onto wrk_gdn (wrk_gdn.h), the slot layout and the fingerprint.
 *
 * Dimensions come from tensor shapes where they show (C, V, L, KD, VD, HV,
 * F, W); config.json supplies what shapes cannot (num_heads / head_dim
 * split, use_gate, allow_neg_eigval, norm_eps) and every config value that
 * shapes also show is checked against them. Every tensor's presence and
 * shape is checked; a mismatch is refused with a diag naming the tensor or
 * the config key. What this family cannot run is refused up front: other
 * attn_mode values, activations other than swish, use_short_conv false,
 * attention residuals, and in "attn" a sliding window, unknown keys or a
 * model with no Gated DeltaNet layer left.
 *
 * Hybrid models (config "attn", fla's GatedDeltaNetConfig): the listed
 * layers run fla's Attention (q/k/v/o_proj, optional qkv biases and q/k
 * RMSNorm, RoPE, causal GQA softmax attention); their shapes give the
 * attention head dim (q_proj rows / num_heads). The slot layout covers the
 * Gated DeltaNet layers only (wrk_gdn.h); info.kv_token_bytes and
 * info.n_attn_layer describe the attention layers' KV.
 *
 * Never logs, never aborts on bad input.
 */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wrk_family.h"
#include "wrk_gdn.h"

#define GDN_MAX_LAYERS 4096u
#define GDN_MAX_EMBD (1u << 17)
#define GDN_MAX_DIM (1u << 20) /* KD, VD, F */
#define GDN_MAX_VOCAB (1u << 22)
#define GDN_MAX_HEADS 4096u
#define GDN_MAX_CONV 64u
#define GDN_PREFIX "model.layers."
#define GDN_MAX_ATTN_DIM 1024u /* attention head dim */

static const char *const types[] = {"gated_deltanet", NULL};

/* The view and the storage it points into (one allocation, never moved). */
typedef struct gdn_view {
    wrk_gdn g;             /* what the backends read */
    wrk_gdn_layer *layers; /* n_layer entries, owned */
} gdn_view;

/* Which dimension a spec's size refers to. */
typedef enum gdn_dim {
    GDN_C = 0,
    GDN_KD,
    GDN_VD,
    GDN_HV,
    GDN_VH,
    GDN_F,
    GDN_QD,  /* attention: Hq * Da */
    GDN_KVD, /* attention: Hkv * Da */
    GDN_AD,  /* attention: Da */
    GDN_N_DIMS
} gdn_dim;

/* When a spec's tensor is present. */
typedef enum gdn_need {
    GDN_NEED_ALWAYS = 0,
    GDN_NEED_GATE,   /* use_gate */
    GDN_NEED_BIAS,   /* attn.qkv_bias */
    GDN_NEED_QKNORM, /* attn.qk_norm */
} gdn_need;

typedef enum gdn_kind {
    GDN_VEC,  /* [.., n] with leading 1s */
    GDN_MAT,  /* nn.Linear [out, in] */
    GDN_CONV, /* nn.Conv1d depthwise [D, 1, W] */
} gdn_kind;

typedef struct gdn_spec {
    const char *suf; /* name after "model.layers.<i>." */
    gdn_kind kind;   /* shape rule */
    gdn_dim d0, d1;  /* VEC: n = d0; MAT: out = d0, in = d1; CONV: D = d0 */
    size_t off;      /* field in wrk_gdn_layer */
    gdn_need need;   /* when it is present */
} gdn_spec;

#define GOFF(f) offsetof(wrk_gdn_layer, f)

/* The canonical order of a layer's tensors (also the digest order). */
static const gdn_spec gdn_specs[] = {
    {"attn_norm.weight", GDN_VEC, GDN_C, 0, GOFF(attn_norm), GDN_NEED_ALWAYS},
    {"attn.q_proj.weight", GDN_MAT, GDN_KD, GDN_C, GOFF(q_proj), GDN_NEED_ALWAYS},
    {"attn.k_proj.weight", GDN_MAT, GDN_KD, GDN_C, GOFF(k_proj), GDN_NEED_ALWAYS},
    {"attn.v_proj.weight", GDN_MAT, GDN_VD, GDN_C, GOFF(v_proj), GDN_NEED_ALWAYS},
    {"attn.a_proj.weight", GDN_MAT, GDN_HV, GDN_C, GOFF(a_proj), GDN_NEED_ALWAYS},
    {"attn.b_proj.weight", GDN_MAT, GDN_HV, GDN_C, GOFF(b_proj), GDN_NEED_ALWAYS},
    {"attn.g_proj.weight", GDN_MAT, GDN_VD, GDN_C, GOFF(g_proj), GDN_NEED_GATE},
    {"attn.q_conv1d.weight", GDN_CONV, GDN_KD, 0, GOFF(q_conv), GDN_NEED_ALWAYS},
    {"attn.k_conv1d.weight", GDN_CONV, GDN_KD, 0, GOFF(k_conv), GDN_NEED_ALWAYS},
    {"attn.v_conv1d.weight", GDN_CONV, GDN_VD, 0, GOFF(v_conv), GDN_NEED_ALWAYS},
    {"attn.A_log", GDN_VEC, GDN_HV, 0, GOFF(A_log), GDN_NEED_ALWAYS},
    {"attn.dt_bias", GDN_VEC, GDN_HV, 0, GOFF(dt_bias), GDN_NEED_ALWAYS},
    {"attn.o_norm.weight", GDN_VEC, GDN_VH, 0, GOFF(o_norm), GDN_NEED_ALWAYS},
    {"attn.o_proj.weight", GDN_MAT, GDN_C, GDN_VD, GOFF(o_proj), GDN_NEED_ALWAYS},
    {"mlp_norm.weight", GDN_VEC, GDN_C, 0, GOFF(mlp_norm), GDN_NEED_ALWAYS},
    {"mlp.gate_proj.weight", GDN_MAT, GDN_F, GDN_C, GOFF(gate_proj), GDN_NEED_ALWAYS},
    {"mlp.up_proj.weight", GDN_MAT, GDN_F, GDN_C, GOFF(up_proj), GDN_NEED_ALWAYS},
    {"mlp.down_proj.weight", GDN_MAT, GDN_C, GDN_F, GOFF(down_proj), GDN_NEED_ALWAYS},
};
#define GDN_N_SPECS (sizeof(gdn_specs) / sizeof(gdn_specs[0]))

/* An attention layer's tensors (fla Attention), canonical order. */
static const gdn_spec attn_specs[] = {
    {"attn_norm.weight", GDN_VEC, GDN_C, 0, GOFF(attn_norm), GDN_NEED_ALWAYS},
    {"attn.q_proj.weight", GDN_MAT, GDN_QD, GDN_C, GOFF(q_proj), GDN_NEED_ALWAYS},
    {"attn.q_proj.bias", GDN_VEC, GDN_QD, 0, GOFF(q_bias), GDN_NEED_BIAS},
    {"attn.k_proj.weight", GDN_MAT, GDN_KVD, GDN_C, GOFF(k_proj), GDN_NEED_ALWAYS},
    {"attn.k_proj.bias", GDN_VEC, GDN_KVD, 0, GOFF(k_bias), GDN_NEED_BIAS},
    {"attn.v_proj.weight", GDN_MAT, GDN_KVD, GDN_C, GOFF(v_proj), GDN_NEED_ALWAYS},
    {"attn.v_proj.bias", GDN_VEC, GDN_KVD, 0, GOFF(v_bias), GDN_NEED_BIAS},
    {"attn.o_proj.weight", GDN_MAT, GDN_C, GDN_QD, GOFF(o_proj), GDN_NEED_ALWAYS},
    {"attn.q_norm.weight", GDN_VEC, GDN_AD, 0, GOFF(q_norm), GDN_NEED_QKNORM},
    {"attn.k_norm.weight", GDN_VEC, GDN_AD, 0, GOFF(k_norm), GDN_NEED_QKNORM},
    {"mlp_norm.weight", GDN_VEC, GDN_C, 0, GOFF(mlp_norm), GDN_NEED_ALWAYS},
    {"mlp.gate_proj.weight", GDN_MAT, GDN_F, GDN_C, GOFF(gate_proj), GDN_NEED_ALWAYS},
    {"mlp.up_proj.weight", GDN_MAT, GDN_F, GDN_C, GOFF(up_proj), GDN_NEED_ALWAYS},
    {"mlp.down_proj.weight", GDN_MAT, GDN_C, GDN_F, GOFF(down_proj), GDN_NEED_ALWAYS},
};
#define GDN_N_ATTN_SPECS (sizeof(attn_specs) / sizeof(attn_specs[0]))

/* ------------------------------------------------------------------------ */
/* helpers                                                                   */
/* ------------------------------------------------------------------------ */

static const wk_tensor *
gdn_find(const wk_tensor_set *set, uint32_t layer, const char *suf, char *name, size_t len)
{
    snprintf(name, len, GDN_PREFIX "%u.%s", layer, suf);
    return wk_tensor_set_find(set, name);
}

/* A 2-D [rows, cols] tensor with cols == want_cols: returns rows, or -1. */
static int64_t
gdn_rows(const wk_tensor *t, int64_t want_cols, int64_t max_rows)
{
    if (t == NULL || t->ndim != 2 || t->shape[1] != want_cols || t->shape[0] < 1 ||
        t->shape[0] > max_rows)
        return -1;
    return t->shape[0];
}

/* A config integer that shapes also show: absent/null is fine, else it must equal got. */
static wk_err
gdn_config_match(const json_t *config, const char *key, uint32_t got, const char *what, wk_diag *d)
{
    uint32_t v;
    wk_err e = wrk_config_u32(config, key, got, &v, d);
    if (e != WK_OK)
        return e;
    if (v != got)
        return wk_diag_set(d, WK_EINVAL, "config.json: %s is %u but %s is %u", key, v, what, got);
    return WK_OK;
}

/* Whether sp's tensor is part of g's checkpoint. */
static bool
gdn_spec_on(const wrk_gdn *g, const gdn_spec *sp)
{
    switch (sp->need) {
    case GDN_NEED_GATE:
        return g->use_gate;
    case GDN_NEED_BIAS:
        return g->qkv_bias;
    case GDN_NEED_QKNORM:
        return g->qk_norm;
    case GDN_NEED_ALWAYS:
        break;
    }
    return true;
}

/* The config key behind a need, for diags. */
static const char *
gdn_need_key(gdn_need need)
{
    switch (need) {
    case GDN_NEED_GATE:
        return "use_gate";
    case GDN_NEED_BIAS:
        return "attn.qkv_bias";
    case GDN_NEED_QKNORM:
        return "attn.qk_norm";
    case GDN_NEED_ALWAYS:
        break;
    }
    return "?";
}

/* ------------------------------------------------------------------------ */
/* family ops                                                                */
/* ------------------------------------------------------------------------ */

static bool
gdn_detect(const wk_tensor_set *set)
{
    return wk_tensor_set_find(set, "model.embeddings.weight") != NULL &&
           wk_tensor_set_find(set, GDN_PREFIX "0.attn.b_proj.weight") != NULL &&
           wk_tensor_set_find(set, GDN_PREFIX "0.attn.a_proj.weight") != NULL &&
           wk_tensor_set_find(set, GDN_PREFIX "0.attn.A_log") != NULL;
}

static void
gdn_free_view(void *view)
{
    gdn_view *v = view;
    if (v == NULL)
        return;
    free(v->layers);
    free(v);
}

/* The config switches this family refuses or reads; fills g's flags and eps. */
static wk_err
gdn_read_switches(const json_t *config, wrk_gdn *g, wk_diag *d)
{
    wk_err e;
    const char *s;
    bool b;

    const json_t *ar = config != NULL ? json_object_get(config, "attnres_block_size") : NULL;
    if (ar != NULL && !json_is_null(ar))
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: attnres_block_size: attention residuals are not "
                           "supported");
    if ((e = wrk_config_str(config, "attn_mode", "chunk", &s, d)) != WK_OK)
        return e;
    if (strcmp(s, "chunk") != 0 && strcmp(s, "fused_recurrent") != 0)
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: attn_mode \"%.64s\" is not supported (chunk, "
                           "fused_recurrent)",
                           s);
    if ((e = wrk_config_str(config, "hidden_act", "swish", &s, d)) != WK_OK)
        return e;
    if (strcmp(s, "swish") != 0 && strcmp(s, "silu") != 0)
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: hidden_act \"%.64s\" is not supported (swish)", s);
    if ((e = wrk_config_bool(config, "use_short_conv", true, &b, d)) != WK_OK)
        return e;
    if (!b)
        return wk_diag_set(d, WK_ENOTSUP, "config.json: use_short_conv false is not supported");
    if ((e = wrk_config_bool(config, "use_gate", true, &g->use_gate, d)) != WK_OK)
        return e;
    if ((e = wrk_config_bool(config, "allow_neg_eigval", false, &g->allow_neg_eigval, d)) != WK_OK)
        return e;
    if ((e = wrk_config_f64(config, "norm_eps", 1e-6, &g->norm_eps, d)) != WK_OK)
        return e;
    if (!(g->norm_eps > 0.0 && g->norm_eps < 1.0))
        return wk_diag_set(d, WK_EINVAL, "config.json: norm_eps %g outside (0, 1)", g->norm_eps);
    return WK_OK;
}

/* attn.<key>: an integer >= min, def when absent or null. */
static wk_err
gdn_attn_u32(const json_t *attn, const char *key, uint32_t def, uint32_t min, uint32_t max,
             uint32_t *out, wk_diag *d)
{
    const json_t *v = json_object_get(attn, key);
    *out = def;
    if (v == NULL || json_is_null(v))
        return WK_OK;
    if (!json_is_integer(v) || json_integer_value(v) < (json_int_t)min ||
        json_integer_value(v) > (json_int_t)max)
        return wk_diag_set(d, WK_EINVAL, "config.json: attn.%s must be an integer in [%u, %u]", key,
                           min, max);
    *out = (uint32_t)json_integer_value(v);
    return WK_OK;
}

/* attn.<key>: a boolean, false when absent or null (fla passes None on). */
static wk_err
gdn_attn_bool(const json_t *attn, const char *key, bool *out, wk_diag *d)
{
    const json_t *v = json_object_get(attn, key);
    *out = false;
    if (v == NULL || json_is_null(v))
        return WK_OK;
    if (!json_is_boolean(v))
        return wk_diag_set(d, WK_EINVAL, "config.json: attn.%s must be a boolean", key);
    *out = json_is_true(v);
    return WK_OK;
}

/*
 * config.json "attn" (fla's hybrid layers): fills g's attention settings
 * and is_attn[l] for the listed layers (n_layer entries, zeroed by the
 * caller). Absent or null: no attention layer. Refuses what this family
 * cannot run (window_size, unknown keys, no Gated DeltaNet layer left).
 */
static wk_err
gdn_read_attn(const json_t *config, wrk_gdn *g, bool *is_attn, wk_diag *d)
{
    static const char *const known[] = {"layers",  "num_heads",   "num_kv_heads", "qkv_bias",
                                        "qk_norm", "window_size", "rope_theta",   NULL};
    const json_t *attn = config != NULL ? json_object_get(config, "attn") : NULL;
    wk_err e;
    g->n_attn = 0;
    if (attn == NULL || json_is_null(attn))
        return WK_OK;
    if (!json_is_object(attn))
        return wk_diag_set(d, WK_EINVAL, "config.json: attn must be an object or null");
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)attn, key, val)
    {
        size_t i = 0;
        while (known[i] != NULL && strcmp(known[i], key) != 0)
            i++;
        if (known[i] == NULL)
            return wk_diag_set(d, WK_ENOTSUP, "config.json: attn.%.64s is not supported", key);
    }
    const json_t *ws = json_object_get(attn, "window_size");
    if (ws != NULL && !json_is_null(ws))
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: attn.window_size: sliding-window attention is not "
                           "supported (only null, full attention)");
    const json_t *ls = json_object_get(attn, "layers");
    if (ls == NULL || !json_is_array(ls) || json_array_size(ls) == 0)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: attn.layers must be a non-empty array of "
                           "layer indices");
    for (size_t i = 0; i < json_array_size(ls); i++) {
        const json_t *v = json_array_get(ls, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= (json_int_t)g->n_layer)
            return wk_diag_set(d, WK_EINVAL,
                               "config.json: attn.layers[%zu] is not a layer index in [0, %u)", i,
                               g->n_layer);
        is_attn[json_integer_value(v)] = true; /* fla tests membership: repeats are harmless */
    }
    for (uint32_t l = 0; l < g->n_layer; l++)
        g->n_attn += is_attn[l];
    if (g->n_attn == g->n_layer)
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: attn.layers lists every layer: no Gated DeltaNet layer "
                           "left (not a hybrid model)");
    if (json_object_get(attn, "num_heads") == NULL)
        return wk_diag_set(d, WK_EINVAL, "config.json: attn.num_heads is required");
    if ((e = gdn_attn_u32(attn, "num_heads", 0, 1, GDN_MAX_HEADS, &g->attn_heads, d)) != WK_OK)
        return e;
    if ((e = gdn_attn_u32(attn, "num_kv_heads", g->attn_heads, 1, GDN_MAX_HEADS, &g->attn_kv_heads,
                          d)) != WK_OK)
        return e;
    if (g->attn_heads % g->attn_kv_heads != 0)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: attn.num_heads %u is not a multiple of "
                           "attn.num_kv_heads %u",
                           g->attn_heads, g->attn_kv_heads);
    if ((e = gdn_attn_bool(attn, "qkv_bias", &g->qkv_bias, d)) != WK_OK ||
        (e = gdn_attn_bool(attn, "qk_norm", &g->qk_norm, d)) != WK_OK)
        return e;
    const json_t *rt = json_object_get(attn, "rope_theta");
    g->rope_theta = 10000.0;
    if (rt != NULL) {
        if (!json_is_number(rt) || !(json_number_value(rt) > 1.0) ||
            !(json_number_value(rt) < 1e12))
            return wk_diag_set(d, WK_EINVAL,
                               "config.json: attn.rope_theta must be a number in (1, 1e12)");
        g->rope_theta = json_number_value(rt);
    }
    g->attn_norm_eps = 1e-5; /* fla's RMSNorm default: q_norm / k_norm get no eps */
    return WK_OK;
}

/* Reads the attention dims from layer la's shapes (la an attention layer). */
static wk_err
gdn_read_attn_dims(const wk_tensor_set *set, uint32_t la, wrk_gdn *g, uint32_t dim[], wk_diag *d)
{
    char name[256];
    const wk_tensor *t = gdn_find(set, la, "attn.q_proj.weight", name, sizeof(name));
    int64_t QD = gdn_rows(t, g->n_embd, GDN_MAX_DIM);
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    if (QD < 0)
        return wrk_shape_err(d, name, t, "[attn.num_heads * head_dim, hidden_size]");
    if (QD % g->attn_heads != 0 || (QD / g->attn_heads) % 2 != 0 ||
        QD / g->attn_heads > (int64_t)GDN_MAX_ATTN_DIM)
        return wk_diag_set(d, WK_EINVAL,
                           "%s: %" PRId64 " rows do not split into attn.num_heads %u heads of an "
                           "even size up to %u",
                           name, QD, g->attn_heads, GDN_MAX_ATTN_DIM);
    g->attn_head_dim = (uint32_t)(QD / g->attn_heads);
    g->rope_dim = g->attn_head_dim; /* fla rotates the whole head */
    dim[GDN_QD] = (uint32_t)QD;
    dim[GDN_KVD] = g->attn_kv_heads * g->attn_head_dim;
    dim[GDN_AD] = g->attn_head_dim;
    return WK_OK;
}

/* Reads the dimensions from layer l0's shapes (the first Gated DeltaNet layer) and config.json. */
static wk_err
gdn_read_dims(const wk_tensor_set *set, const json_t *config, uint32_t l0, wrk_gdn *g,
              uint32_t dim[], wk_diag *d)
{
    char name[256], qname[256], aname[256], vname[256];
    const wk_tensor *t;
    wk_err e;
    const int64_t C = g->n_embd;

    t = gdn_find(set, l0, "attn.q_proj.weight", name, sizeof(name));
    snprintf(qname, sizeof(qname), "%s", name);
    int64_t KD = gdn_rows(t, C, GDN_MAX_DIM);
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    if (KD < 0)
        return wrk_shape_err(d, name, t, "[key_dim, hidden_size]");
    t = gdn_find(set, l0, "attn.v_proj.weight", name, sizeof(name));
    snprintf(vname, sizeof(vname), "%s", name);
    int64_t VD = gdn_rows(t, C, GDN_MAX_DIM);
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    if (VD < 0)
        return wrk_shape_err(d, name, t, "[value_dim, hidden_size]");
    t = gdn_find(set, l0, "mlp.gate_proj.weight", name, sizeof(name));
    int64_t F = gdn_rows(t, C, GDN_MAX_DIM);
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    if (F < 0)
        return wrk_shape_err(d, name, t, "[intermediate_size, hidden_size]");
    t = gdn_find(set, l0, "attn.A_log", name, sizeof(name));
    snprintf(aname, sizeof(aname), "%s", name);
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    int64_t HV = t->ndim >= 1 ? t->shape[t->ndim - 1] : 0;
    if (HV < 1 || HV > (int64_t)GDN_MAX_HEADS || !wrk_is_vec(t, HV))
        return wrk_shape_err(d, name, t, "[num_v_heads]");
    t = gdn_find(set, l0, "attn.q_conv1d.weight", name, sizeof(name));
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    if (t->ndim != 3 || t->shape[0] != KD || t->shape[1] != 1 || t->shape[2] < 1 ||
        t->shape[2] > (int64_t)GDN_MAX_CONV)
        return wrk_shape_err(d, name, t, "[key_dim, 1, conv_size]");
    int64_t W = t->shape[2];
    if (W < 2)
        return wk_diag_set(d, WK_ENOTSUP, "%s: conv_size %" PRId64 " (need at least 2)", name, W);

    /* what shapes cannot show: the split of KD into heads */
    uint32_t nv_cfg, H, K;
    if ((e = wrk_config_u32(config, "num_v_heads", 0, &nv_cfg, d)) != WK_OK)
        return e;
    if ((e = wrk_config_u32(config, "num_heads", nv_cfg ? 0 : (uint32_t)HV, &H, d)) != WK_OK)
        return e;
    if (H == 0)
        return wk_diag_set(d, WK_EINVAL, "config.json: num_heads is required with num_v_heads");
    if ((e = wrk_config_u32(config, "head_dim", (uint32_t)(KD / H), &K, d)) != WK_OK)
        return e;
    if (K == 0 || (int64_t)H * K != KD)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: num_heads %u x head_dim %u does not match the %" PRId64
                           " rows of %s",
                           H, K, KD, qname);
    uint32_t HVc = nv_cfg ? nv_cfg : H;
    if ((int64_t)HVc != HV)
        return wk_diag_set(d, WK_EINVAL, "config.json: %s is %u but %s has %" PRId64 " value heads",
                           nv_cfg ? "num_v_heads" : "num_heads (num_v_heads absent)", HVc, aname,
                           HV);
    if (HV % H != 0)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: num_v_heads %" PRId64 " is not a multiple of num_heads "
                           "%u",
                           HV, H);
    if (VD % HV != 0)
        return wk_diag_set(d, WK_EINVAL,
                           "%s: %" PRId64 " rows do not split into %" PRId64 " value heads", vname,
                           VD, HV);
    const int64_t Vh = VD / HV;
    double ev;
    if ((e = wrk_config_f64(config, "expand_v", (double)Vh / K, &ev, d)) != WK_OK)
        return e;
    if (fabs(ev * K - (double)Vh) > 1e-6 * (double)Vh)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: expand_v %g x head_dim %u does not match the value "
                           "head size %" PRId64 " of %s",
                           ev, K, Vh, vname);
    if ((e = gdn_config_match(config, "intermediate_size", (uint32_t)F,
                              "the row count of mlp.gate_proj.weight", d)) != WK_OK)
        return e;
    if ((e = gdn_config_match(config, "conv_size", (uint32_t)W,
                              "the kernel size of attn.q_conv1d.weight", d)) != WK_OK)
        return e;

    g->n_head = H;
    g->head_k = K;
    g->n_v_head = (uint32_t)HV;
    g->head_v = (uint32_t)Vh;
    g->conv = (uint32_t)W;
    g->ffn_dim = (uint32_t)F;
    dim[GDN_C] = g->n_embd;
    dim[GDN_KD] = (uint32_t)KD;
    dim[GDN_VD] = (uint32_t)VD;
    dim[GDN_HV] = (uint32_t)HV;
    dim[GDN_VH] = (uint32_t)Vh;
    dim[GDN_F] = (uint32_t)F;
    return WK_OK;
}

/* Checks t against sp; fills the layer field. */
static wk_err
gdn_map_tensor(const gdn_spec *sp, const uint32_t dim[], uint32_t W, const wk_tensor *t,
               const char *name, wrk_gdn_layer *ly, wk_diag *d)
{
    char want[96];
    void *field = (char *)ly + sp->off;
    switch (sp->kind) {
    case GDN_VEC:
        if (!wrk_is_vec(t, dim[sp->d0])) {
            snprintf(want, sizeof(want), "[%u]", dim[sp->d0]);
            return wrk_shape_err(d, name, t, want);
        }
        *(const wk_tensor **)field = t;
        return WK_OK;
    case GDN_MAT:
        if (t->ndim != 2 || t->shape[0] != dim[sp->d0] || t->shape[1] != dim[sp->d1]) {
            snprintf(want, sizeof(want), "[%u,%u]", dim[sp->d0], dim[sp->d1]);
            return wrk_shape_err(d, name, t, want);
        }
        *(wrk_mat *)field = (wrk_mat){t, dim[sp->d1], dim[sp->d0], false};
        return WK_OK;
    case GDN_CONV:
        if (t->ndim != 3 || t->shape[0] != dim[sp->d0] || t->shape[1] != 1 || t->shape[2] != W) {
            snprintf(want, sizeof(want), "[%u,1,%u]", dim[sp->d0], W);
            return wrk_shape_err(d, name, t, want);
        }
        *(const wk_tensor **)field = t;
        return WK_OK;
    }
    return wk_diag_set(d, WK_EINVAL, "%s: internal: unknown spec", name);
}

/* The embedding and the layer count, checked against config.json. */
static wk_err
gdn_map_embd(const wk_tensor_set *set, const json_t *config, wrk_gdn *g, wk_diag *d)
{
    const wk_tensor *emb = wk_tensor_set_find(set, "model.embeddings.weight");
    if (emb == NULL)
        return wk_diag_set(d, WK_EINVAL, "model.embeddings.weight: missing");
    if (emb->ndim != 2 || emb->shape[0] < 1 || emb->shape[1] < 1 ||
        emb->shape[0] > (int64_t)GDN_MAX_VOCAB || emb->shape[1] > (int64_t)GDN_MAX_EMBD)
        return wrk_shape_err(d, "model.embeddings.weight", emb, "[vocab_size, hidden_size]");
    g->emb = emb;
    g->vocab_size = (uint32_t)emb->shape[0];
    g->n_embd = (uint32_t)emb->shape[1];

    /* layers: the highest index among model.layers.<i>.* names */
    long max_layer = -1;
    for (size_t i = 0; i < wk_tensor_set_count(set); i++) {
        const char *nm = wk_tensor_set_at(set, i)->name;
        if (strncmp(nm, GDN_PREFIX, strlen(GDN_PREFIX)) != 0)
            continue;
        long l = wrk_layer_parse(nm + strlen(GDN_PREFIX), GDN_MAX_LAYERS, NULL);
        if (l < 0)
            return wk_diag_set(d, WK_EINVAL, "%s: unexpected tensor for a gdn checkpoint", nm);
        if (l > max_layer)
            max_layer = l;
    }
    if (max_layer < 0)
        return wk_diag_set(d, WK_EINVAL, GDN_PREFIX "0.*: no layers in the checkpoint");
    g->n_layer = (uint32_t)max_layer + 1;

    wk_err e;
    if ((e = gdn_config_match(config, "hidden_size", g->n_embd, "model.embeddings.weight's width",
                              d)) != WK_OK ||
        (e = gdn_config_match(config, "vocab_size", g->vocab_size,
                              "model.embeddings.weight's row count", d)) != WK_OK ||
        (e = gdn_config_match(config, "num_hidden_layers", g->n_layer,
                              "the number of layers in the checkpoint", d)) != WK_OK)
        return e;
    return WK_OK;
}

/*
 * Which layers are attention layers (config.json attn.layers); l0 and la:
 * the first Gated DeltaNet and the first attention layer (n_layer if none).
 */
static wk_err
gdn_map_kinds(gdn_view *v, const json_t *config, uint32_t *l0, uint32_t *la, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    v->layers = calloc(g->n_layer, sizeof(*v->layers));
    bool *is_attn = calloc(g->n_layer, sizeof(bool));
    if (v->layers == NULL || is_attn == NULL) {
        free(is_attn);
        return wk_diag_set(d, WK_ENOMEM, "out of memory (%u layers)", g->n_layer);
    }
    g->layers = v->layers;
    wk_err e = gdn_read_attn(config, g, is_attn, d);
    *l0 = *la = 0;
    while (*l0 < g->n_layer && is_attn[*l0])
        (*l0)++;
    while (*la < g->n_layer && !is_attn[*la])
        (*la)++;
    for (uint32_t l = 0; l < g->n_layer; l++) {
        v->layers[l].mixer = is_attn[l] ? WRK_MIXER_ATTN : WRK_MIXER_GDN;
        v->layers[l].mlp = WRK_MLP_SWIGLU;
    }
    free(is_attn);
    return e;
}

/* Every layer's tensors, each checked against its spec (switched off: absent). */
static wk_err
gdn_map_layers(gdn_view *v, const wk_tensor_set *set, const uint32_t dim[], wk_diag *d)
{
    wrk_gdn *g = &v->g;
    char name[256];
    wk_err e;
    for (uint32_t l = 0; l < g->n_layer; l++) {
        const bool at = v->layers[l].mixer == WRK_MIXER_ATTN;
        const gdn_spec *specs = at ? attn_specs : gdn_specs;
        const size_t n_specs = at ? GDN_N_ATTN_SPECS : GDN_N_SPECS;
        for (size_t s = 0; s < n_specs; s++) {
            const gdn_spec *sp = &specs[s];
            const wk_tensor *t = gdn_find(set, l, sp->suf, name, sizeof(name));
            if (!gdn_spec_on(g, sp)) {
                if (t != NULL)
                    return wk_diag_set(d, WK_EINVAL, "%s: present but config.json %s is false",
                                       name, gdn_need_key(sp->need));
                continue;
            }
            if (t == NULL)
                return wk_diag_set(d, WK_EINVAL, "%s: missing%s", name,
                                   at ? " (an attention layer in config.json attn.layers)" : "");
            if ((e = gdn_map_tensor(sp, dim, g->conv, t, name, &v->layers[l], d)) != WK_OK)
                return e;
        }
    }
    return WK_OK;
}

/* The final norm and the head: tie_word_embeddings decides; without config.json, its absence. */
static wk_err
gdn_map_head(const wk_tensor_set *set, const json_t *config, wrk_gdn *g, wk_diag *d)
{
    char want[96];
    g->norm = wk_tensor_set_find(set, "model.norm.weight");
    if (g->norm == NULL)
        return wk_diag_set(d, WK_EINVAL, "model.norm.weight: missing");
    if (!wrk_is_vec(g->norm, g->n_embd)) {
        snprintf(want, sizeof(want), "[%u]", g->n_embd);
        return wrk_shape_err(d, "model.norm.weight", g->norm, want);
    }
    const wk_tensor *head = wk_tensor_set_find(set, "lm_head.weight");
    bool tied;
    wk_err e = wrk_config_bool(config, "tie_word_embeddings", head == NULL, &tied, d);
    if (e != WK_OK)
        return e;
    if (tied && head != NULL)
        return wk_diag_set(d, WK_EINVAL,
                           "lm_head.weight: present but config.json tie_word_embeddings is true");
    if (!tied && head == NULL)
        return wk_diag_set(d, WK_EINVAL,
                           "lm_head.weight: missing (config.json tie_word_embeddings is false)");
    if (head != NULL &&
        (head->ndim != 2 || head->shape[0] != g->vocab_size || head->shape[1] != g->n_embd)) {
        snprintf(want, sizeof(want), "[%u,%u] (as model.embeddings.weight)", g->vocab_size,
                 g->n_embd);
        return wrk_shape_err(d, "lm_head.weight", head, want);
    }
    g->tied = tied;
    g->head = (wrk_mat){tied ? g->emb : head, g->n_embd, g->vocab_size, false};
    return WK_OK;
}

/* Declares every tensor to the model, canonical (fla) names, in checkpoint order. */
static wk_err
gdn_declare(wrk_model *m, gdn_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    char name[256];
    wk_err e;
    if ((e = wrk_model_use(m, &g->emb, "model.embeddings.weight", false, false, d)) != WK_OK)
        return e;
    for (uint32_t l = 0; l < g->n_layer; l++) {
        wrk_gdn_layer *ly = &v->layers[l];
        const bool at = ly->mixer == WRK_MIXER_ATTN;
        const gdn_spec *specs = at ? attn_specs : gdn_specs;
        const size_t n_specs = at ? GDN_N_ATTN_SPECS : GDN_N_SPECS;
        for (size_t s = 0; s < n_specs; s++) {
            const gdn_spec *sp = &specs[s];
            if (!gdn_spec_on(g, sp))
                continue;
            char *field = (char *)ly + sp->off;
            const wk_tensor **tp =
                sp->kind == GDN_MAT ? &((wrk_mat *)field)->t : (const wk_tensor **)field;
            snprintf(name, sizeof(name), GDN_PREFIX "%u.%s", l, sp->suf);
            if ((e = wrk_model_use(m, tp, name, false, sp->kind != GDN_MAT, d)) != WK_OK)
                return e;
        }
    }
    if ((e = wrk_model_use(m, &g->norm, "model.norm.weight", false, true, d)) != WK_OK)
        return e;
    /* tied: the same tensor again, counted once (backends take the head from emb) */
    return wrk_model_use(m, &g->head.t, "lm_head.weight", false, false, d);
}

static wk_err
gdn_map(wrk_model *m, const wk_tensor_set *set, const json_t *config, void **out,
        wrk_model_info *info, wk_diag *d)
{
    wk_err e;
    uint32_t dim[GDN_N_DIMS], l0 = 0, la = 0;
    gdn_view *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wrk_gdn *g = &v->g;

    if ((e = gdn_read_switches(config, g, d)) != WK_OK ||
        (e = gdn_map_embd(set, config, g, d)) != WK_OK ||
        (e = gdn_map_kinds(v, config, &l0, &la, d)) != WK_OK ||
        (e = gdn_read_dims(set, config, l0, g, dim, d)) != WK_OK)
        goto fail;
    dim[GDN_QD] = dim[GDN_KVD] = dim[GDN_AD] = 0;
    if ((g->n_attn > 0 && (e = gdn_read_attn_dims(set, la, g, dim, d)) != WK_OK) ||
        (e = gdn_map_layers(v, set, dim, d)) != WK_OK ||
        (e = gdn_map_head(set, config, g, d)) != WK_OK || (e = gdn_declare(m, v, d)) != WK_OK)
        goto fail;

    wrk_gdn_fill_info(g, g->n_head, g->head_k, info);
    *out = v;
    return WK_OK;

fail:
    gdn_free_view(v);
    return e;
}

uint64_t
wrk_gdn_layer_floats(const wrk_gdn *g, uint32_t l)
{
    switch (g->layers[l].mixer) {
    case WRK_MIXER_GDN: {
        const uint64_t KD = (uint64_t)g->n_head * g->head_k;
        const uint64_t VD = (uint64_t)g->n_v_head * g->head_v;
        return (uint64_t)(g->conv - 1) * (2 * KD + VD) +
               (uint64_t)g->n_v_head * g->head_k * g->head_v;
    }
    case WRK_MIXER_MAMBA2: {
        const uint64_t DI = (uint64_t)g->m2_heads * g->m2_head_dim;
        const uint64_t CD = DI + 2 * (uint64_t)g->m2_groups * g->m2_state;
        return CD * (g->m2_conv - 1) + DI * g->m2_state;
    }
    case WRK_MIXER_RWKV7: /* shifts of the time and channel mix, then the WKV state */
        return 2 * (uint64_t)g->n_embd +
               (uint64_t)g->rw->n_head * g->rw->head_size * g->rw->head_size;
    default:
        return 0;
    }
}

uint64_t
wrk_gdn_state_bytes(const wrk_gdn *g)
{
    uint64_t n = 0;
    for (uint32_t l = 0; l < g->n_layer; l++)
        n += wrk_gdn_layer_floats(g, l);
    return n * sizeof(float);
}

void
wrk_gdn_fill_info(const wrk_gdn *g, uint32_t n_head, uint32_t head_size, wrk_model_info *info)
{
    info->n_layer = g->n_layer;
    info->n_embd = g->n_embd;
    info->n_head = n_head;
    info->head_size = head_size;
    info->ffn_dim = g->ffn_dim;
    info->vocab_size = g->vocab_size;
    info->state_bytes = wrk_gdn_state_bytes(g);
    info->n_attn_layer = g->n_attn;
    info->kv_token_bytes = wrk_gdn_kv_token_bytes(g);
}

uint64_t
wrk_gdn_kv_token_bytes(const wrk_gdn *g)
{
    return (uint64_t)g->n_attn * 2 * g->attn_kv_heads * g->attn_head_dim * sizeof(float);
}

size_t
wrk_gdn_state_layout(const wrk_gdn *g, wrk_state_tensor *out, size_t cap)
{
    const uint64_t KD = (uint64_t)g->n_head * g->head_k;
    const uint64_t VD = (uint64_t)g->n_v_head * g->head_v;
    const uint64_t DI = (uint64_t)g->m2_heads * g->m2_head_dim;
    size_t n = 0;
    for (uint32_t l = 0; l < g->n_layer; l++) {
        const wrk_mixer_kind kind = g->layers[l].mixer;
        if (kind != WRK_MIXER_GDN && kind != WRK_MIXER_MAMBA2)
            continue;
        static const char *const nm_gdn[4] = {"q_conv", "k_conv", "v_conv", "S"};
        static const char *const nm_m2[2] = {"conv", "ssm"};
        const uint32_t parts = kind == WRK_MIXER_GDN ? 4 : 2;
        for (uint32_t k = 0; k < parts; k++, n++) {
            if (out == NULL || n >= cap)
                continue;
            wrk_state_tensor *t = &out[n];
            memset(t, 0, sizeof(*t));
            snprintf(t->name, sizeof(t->name), "layers.%u.%s", l,
                     kind == WRK_MIXER_GDN ? nm_gdn[k] : nm_m2[k]);
            if (kind == WRK_MIXER_MAMBA2 && k == 0) {
                t->ndim = 2;
                t->shape[0] = DI + 2 * (uint64_t)g->m2_groups * g->m2_state;
                t->shape[1] = g->m2_conv - 1;
            } else if (kind == WRK_MIXER_MAMBA2) {
                t->ndim = 3;
                t->shape[0] = g->m2_heads;
                t->shape[1] = g->m2_head_dim;
                t->shape[2] = g->m2_state;
            } else if (k < 3) {
                t->ndim = 2;
                t->shape[0] = g->conv - 1;
                t->shape[1] = k < 2 ? KD : VD;
            } else {
                t->ndim = 3;
                t->shape[0] = g->n_v_head;
                t->shape[1] = g->head_k;
                t->shape[2] = g->head_v;
            }
        }
    }
    return n;
}

/* The slot layout: the Gated DeltaNet layers only (attention layers keep their KV in the pool). */
static size_t
gdn_layout(const void *view, wrk_state_tensor *out, size_t cap)
{
    return wrk_gdn_state_layout(&((const gdn_view *)view)->g, out, cap);
}

static void
gdn_fingerprint_extra(const void *view, char *buf, size_t len)
{
    const wrk_gdn *g = &((const gdn_view *)view)->g;
    int n = snprintf(buf, len,
                     "gdn.n_v_head=%u\ngdn.head_v=%u\ngdn.conv=%u\ngdn.use_gate=%d\n"
                     "gdn.allow_neg_eigval=%d\ngdn.tied=%d\ngdn.norm_eps=%.17g",
                     g->n_v_head, g->head_v, g->conv, g->use_gate, g->allow_neg_eigval, g->tied,
                     g->norm_eps);
    if (g->n_attn == 0 || n < 0 || (size_t)n >= len)
        return;
    /* hybrid: the attention config (the layer set as a hash, so any count fits) */
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the attention layer indices */
    for (uint32_t l = 0; l < g->n_layer; l++)
        if (g->layers[l].mixer == WRK_MIXER_ATTN)
            for (int b = 0; b < 4; b++) {
                h ^= (l >> (8 * b)) & 0xffu;
                h *= 1099511628211ull;
            }
    snprintf(buf + n, len - (size_t)n,
             "\ngdn.attn.n=%u\ngdn.attn.layers_fnv=%016llx\ngdn.attn.heads=%u\n"
             "gdn.attn.kv_heads=%u\ngdn.attn.head_dim=%u\ngdn.attn.qkv_bias=%d\n"
             "gdn.attn.qk_norm=%d\ngdn.attn.rope_theta=%.17g\ngdn.attn.norm_eps=%.17g",
             g->n_attn, (unsigned long long)h, g->attn_heads, g->attn_kv_heads, g->attn_head_dim,
             g->qkv_bias, g->qk_norm, g->rope_theta, g->attn_norm_eps);
}

/*
 * --quantize q8_0: every layer's projections (Gated DeltaNet and attention
 * layers alike: q, k, v, a, b, g, o) and MLP, and the head. A tied head's
 * field points at the embedding; its quantization becomes the head's own
 * Q8_0 copy while the embedding stays (a token reads one row of it; the
 * head streams all of it every step).
 */
size_t
wrk_gdn_quant_mats(wrk_gdn *g, wrk_gdn_layer *layers, wrk_mat **out, size_t cap)
{
    size_t n = 0;
    for (uint32_t l = 0; l < g->n_layer; l++) {
        wrk_gdn_layer *ly = &layers[l];
        wrk_mat *mats[] = {&ly->q_proj,  &ly->k_proj,    &ly->v_proj,     &ly->a_proj,
                           &ly->b_proj,  &ly->g_proj,    &ly->o_proj,     &ly->gate_proj,
                           &ly->up_proj, &ly->down_proj, &ly->m2.in_proj, &ly->m2.out_proj};
        for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++) {
            if (mats[i]->t == NULL)
                continue;
            if (out != NULL && n < cap)
                out[n] = mats[i];
            n++;
        }
        wrk_moe *mo = ly->moe; /* the experts; the routers stay as stored (C x E, tiny) */
        for (uint32_t e = 0; mo != NULL && e < mo->n_experts + 1; e++) {
            wrk_mat *em[3];
            if (e < mo->n_experts) {
                em[0] = &mo->gate[e], em[1] = &mo->up[e], em[2] = &mo->down[e];
            } else if (mo->shared_ffn > 0) {
                em[0] = &mo->sh_gate, em[1] = &mo->sh_up, em[2] = &mo->sh_down;
            } else {
                break;
            }
            for (int i = 0; i < 3; i++) {
                if (em[i]->t == NULL)
                    continue; /* RELU2 experts have no gate */
                if (out != NULL && n < cap)
                    out[n] = em[i];
                n++;
            }
        }
    }
    if (out != NULL && n < cap)
        out[n] = &g->head;
    return n + 1;
}

static size_t
gdn_quant_mats(void *view, wrk_mat **out, size_t cap)
{
    gdn_view *v = view;
    return wrk_gdn_quant_mats(&v->g, v->layers, out, cap);
}

const wrk_family wrk_family_gdn = {
    .name = "gdn",
    .model_types = types,
    .detect = gdn_detect,
    .map = gdn_map,
    .free_view = gdn_free_view,
    .state_layout = gdn_layout,
    .fingerprint_extra = gdn_fingerprint_extra,
    .quant_mats = gdn_quant_mats,
};
