/*
 * wrk_granite_h: IBM's Granite-4.0-H family (transformers
 * `granitemoehybrid`, GraniteMoeHybridForCausalLM: Granite-4.0-H-Micro,
 * -Tiny, -Small) for wrk_model, mapped onto the hybrid layer-list view
 * (wrk_gdn.h) that the backends already run.
 *
 * A Granite-4.0-H model is a list of layers over one residual stream
 * (config layer_types: "mamba" / "linear_attention" or "attention" /
 * "full_attention"; absent: every layer Mamba2). Each layer is
 *     x = x + mixer(rmsnorm(x) * input_layernorm) * residual_multiplier
 *     x = x + mlp(rmsnorm(x) * post_attention_layernorm) * residual_multiplier
 * with the mixer a Mamba2 mixer (mamba.*: in_proj z | xBC | dt, conv1d with
 * bias, dt_bias, A_log, D, the gated RMSNorm over mamba_n_groups groups,
 * out_proj) or causal softmax attention (self_attn.{q,k,v,o}_proj, GQA,
 * scores times attention_multiplier instead of head_dim^-0.5, RoPE when
 * position_embedding_type is "rope", none otherwise), and the MLP the
 * shared_mlp (a SwiGLU whose input_linear [2 Fs, C] holds the gate rows,
 * then the up rows) plus, when num_local_experts > 0, block_sparse_moe: the
 * router's top num_experts_per_tok logits, a softmax over those, each
 * expert a SwiGLU with input_linear [E, 2 F, C] (gate rows, up rows) and
 * output_linear [E, C, F]. The embedding is multiplied by
 * embedding_multiplier, the logits divided by logits_scaling.
 *
 * The fused tensors become views (wrk_model_use_part): the shared MLP's
 * gate and up rows, each expert's gate, up and down slices. The dense
 * model's MLP is the shared MLP; the MoE model's is a wrk_moe whose ungated
 * shared expert is the shared MLP.
 *
 * Refused up front, naming the key: hidden_act other than silu,
 * attention_bias, mamba_proj_bias, a time_step_limit other than [0, inf],
 * a rope_type other than default, an unknown layer type, a model with no
 * Mamba2 layer, a multiplier that is not a finite number (0 too).
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

#define GH_MAX_LAYERS 4096u
#define GH_MAX_EMBD (1u << 17)
#define GH_MAX_DIM (1u << 20)
#define GH_MAX_VOCAB (1u << 22)
#define GH_MAX_HEADS 4096u
#define GH_MAX_CONV 64u
#define GH_MAX_HEAD_DIM 1024u
#define GH_MAX_EXPERTS 4096u
#define GH_NAME 256
#define GH_PREFIX "model."

static const char *const types[] = {"granitemoehybrid", NULL};

/* The row views of one layer's shared MLP. */
enum { GH_SH_GATE, GH_SH_UP, GH_N_PARTS };

/* The view and the storage it points into (never moved after map). */
typedef struct gh_view {
    wrk_gdn g;             /* what the backends read: must be first */
    wrk_gdn_layer *layers; /* n_layer entries, owned */
    wk_tensor *parts;      /* n_layer * GH_N_PARTS row views, owned (data borrowed) */
    wrk_moe *moes;         /* n_layer entries (MoE models), owned */
    wrk_mat *emats;        /* n_layer * 3 * E expert matrices, owned */
    wk_tensor *eparts;     /* n_layer * 3 * E views of the fused expert tensors, owned */
    uint32_t n_experts, top_k, moe_ffn, shared_ffn; /* E (0: dense), k, F, Fs */
    uint32_t m2_inner;     /* DI = mamba_expand * C */
    bool rope;             /* position_embedding_type "rope" */
} gh_view;

/* ------------------------------------------------------------------------ */
/* config                                                                    */
/* ------------------------------------------------------------------------ */

static wk_err
gh_u32(const json_t *c, const char *key, uint32_t def, uint32_t min, uint32_t max, uint32_t *out,
       wk_diag *d)
{
    wk_err e = wrk_config_u32(c, key, def, out, d);
    if (e != WK_OK)
        return e;
    if (*out < min || *out > max)
        return wk_diag_set(d, WK_EINVAL, "config.json: %s is %u, expected %u..%u", key, *out, min,
                           max);
    return WK_OK;
}

/* A Granite multiplier: a finite non-zero number (default 1), as float. */
static wk_err
gh_mul(const json_t *c, const char *key, float *out, wk_diag *d)
{
    double v;
    wk_err e = wrk_config_f64(c, key, 1.0, &v, d);
    if (e != WK_OK)
        return e;
    if (!isfinite(v) || v == 0.0 || fabs(v) > 1e30)
        return wk_diag_set(d, WK_EINVAL, "config.json: %s %g is not a usable multiplier", key, v);
    *out = (float)v;
    return WK_OK;
}

/* Infinity as serialisers spell it where JSON has none (a number >= 1e30 too). */
static bool
gh_is_inf(const json_t *v)
{
    if (json_is_number(v))
        return json_number_value(v) >= 1e30;
    if (json_is_object(v) && json_object_size(v) == 1)
        v = json_object_get(v, "__float__");
    if (!json_is_string(v))
        return false;
    const char *s = json_string_value(v);
    return strcmp(s, "Infinity") == 0 || strcmp(s, "inf") == 0 || strcmp(s, "Inf") == 0;
}

/*
 * RoPE: position_embedding_type "rope" rotates the whole head (transformers'
 * default rope over head_dim) with rope_parameters.rope_theta (or the older
 * top-level rope_theta; default 10000); anything else ("nope", null):
 * no position encoding (rope_dim 0).
 */
static wk_err
gh_read_rope(const json_t *c, gh_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    const char *pe;
    wk_err e = wrk_config_str(c, "position_embedding_type", "nope", &pe, d);
    if (e != WK_OK)
        return e;
    v->rope = strcmp(pe, "rope") == 0;
    if (!v->rope) {
        if (strcmp(pe, "nope") != 0)
            return wk_diag_set(d, WK_ENOTSUP,
                               "config.json: position_embedding_type \"%.32s\" is not supported "
                               "(rope, nope, null)",
                               pe);
        g->rope_dim = 0;
        g->rope_theta = 10000.0;
        return WK_OK;
    }
    const json_t *rp = json_object_get(c, "rope_parameters");
    if (rp == NULL || json_is_null(rp))
        rp = json_object_get(c, "rope_scaling");
    if (rp != NULL && json_is_null(rp))
        rp = NULL;
    if (rp != NULL && !json_is_object(rp))
        return wk_diag_set(d, WK_EINVAL, "config.json: rope_parameters must be an object");
    const char *type;
    double theta = 10000.0;
    if ((e = wrk_config_str(rp, "rope_type", "default", &type, d)) != WK_OK)
        return e;
    if (strcmp(type, "default") != 0)
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: rope_parameters.rope_type \"%.32s\" is not supported "
                           "(default only)",
                           type);
    if ((e = wrk_config_f64(c, "rope_theta", theta, &theta, d)) != WK_OK ||
        (rp != NULL && (e = wrk_config_f64(rp, "rope_theta", theta, &theta, d)) != WK_OK))
        return e;
    if (!(theta > 1.0) || !isfinite(theta))
        return wk_diag_set(d, WK_EINVAL, "config.json: rope_theta %g is not a RoPE base", theta);
    g->rope_theta = theta;
    g->rope_dim = g->attn_head_dim;
    return WK_OK;
}

/* The switches, epsilons and Granite's scalars. */
static wk_err
gh_read_switches(const json_t *c, gh_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    const char *act;
    bool b;
    double eps;
    wk_err e;
    if ((e = wrk_config_str(c, "hidden_act", "silu", &act, d)) != WK_OK)
        return e;
    if (strcmp(act, "silu") != 0)
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: hidden_act \"%.32s\" is not supported (silu only)", act);
    if ((e = wrk_config_bool(c, "attention_bias", false, &b, d)) != WK_OK)
        return e;
    if (b)
        return wk_diag_set(d, WK_ENOTSUP, "config.json: attention_bias true is not supported");
    if ((e = wrk_config_bool(c, "mamba_proj_bias", false, &b, d)) != WK_OK)
        return e;
    if (b)
        return wk_diag_set(d, WK_ENOTSUP, "config.json: mamba_proj_bias true is not supported");
    if ((e = wrk_config_bool(c, "mamba_conv_bias", true, &b, d)) != WK_OK)
        return e;
    if (!b)
        return wk_diag_set(d, WK_ENOTSUP, "config.json: mamba_conv_bias false is not supported");
    const json_t *tl = json_object_get(c, "time_step_limit");
    if (tl != NULL && !json_is_null(tl) &&
        !(json_is_array(tl) && json_array_size(tl) == 2 && json_is_number(json_array_get(tl, 0)) &&
          json_number_value(json_array_get(tl, 0)) <= 0.0 && gh_is_inf(json_array_get(tl, 1))))
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: time_step_limit other than [0, inf] is not supported");
    if ((e = wrk_config_f64(c, "rms_norm_eps", 1e-6, &eps, d)) != WK_OK)
        return e;
    if (!(eps > 0.0) || eps > 1.0)
        return wk_diag_set(d, WK_EINVAL, "config.json: rms_norm_eps %g not in (0, 1]", eps);
    g->norm_eps = eps;
    g->attn_norm_eps = eps;
    if ((e = gh_mul(c, "embedding_multiplier", &g->emb_mul, d)) != WK_OK ||
        (e = gh_mul(c, "residual_multiplier", &g->res_mul, d)) != WK_OK ||
        (e = gh_mul(c, "attention_multiplier", &g->attn_scale, d)) != WK_OK ||
        (e = gh_mul(c, "logits_scaling", &g->logit_div, d)) != WK_OK)
        return e;
    return WK_OK;
}

/* The dimensions the config gives (checked against the shapes as the layers map). */
static wk_err
gh_read_dims(const json_t *c, gh_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    const uint32_t C = g->n_embd;
    uint32_t expand;
    wk_err e;
    if ((e = gh_u32(c, "num_hidden_layers", 0, 1, GH_MAX_LAYERS, &g->n_layer, d)) != WK_OK ||
        (e = gh_u32(c, "num_attention_heads", 32, 1, GH_MAX_HEADS, &g->attn_heads, d)) != WK_OK ||
        (e = gh_u32(c, "num_key_value_heads", g->attn_heads, 1, GH_MAX_HEADS, &g->attn_kv_heads,
                    d)) != WK_OK ||
        (e = gh_u32(c, "num_local_experts", 8, 0, GH_MAX_EXPERTS, &v->n_experts, d)) != WK_OK ||
        (e = gh_u32(c, "shared_intermediate_size", 1024, 1, GH_MAX_DIM, &v->shared_ffn, d)) !=
            WK_OK ||
        (e = gh_u32(c, "mamba_n_heads", 128, 1, GH_MAX_HEADS, &g->m2_heads, d)) != WK_OK ||
        (e = gh_u32(c, "mamba_n_groups", 1, 1, GH_MAX_HEADS, &g->m2_groups, d)) != WK_OK ||
        (e = gh_u32(c, "mamba_d_state", 256, 1, GH_MAX_HEAD_DIM, &g->m2_state, d)) != WK_OK ||
        (e = gh_u32(c, "mamba_d_conv", 4, 2, GH_MAX_CONV, &g->m2_conv, d)) != WK_OK ||
        (e = gh_u32(c, "mamba_expand", 2, 1, 64, &expand, d)) != WK_OK)
        return e;
    if ((uint64_t)expand * C > GH_MAX_DIM)
        return wk_diag_set(d, WK_EINVAL, "config.json: mamba_expand x hidden_size over %u",
                           GH_MAX_DIM);
    v->m2_inner = expand * C;
    /* mamba_d_head: a number, or "auto" (absent too) for DI / mamba_n_heads */
    const json_t *dh = json_object_get(c, "mamba_d_head");
    if (dh == NULL || json_is_null(dh) ||
        (json_is_string(dh) && strcmp(json_string_value(dh), "auto") == 0)) {
        g->m2_head_dim = v->m2_inner / g->m2_heads;
    } else if ((e = gh_u32(c, "mamba_d_head", 0, 1, GH_MAX_DIM, &g->m2_head_dim, d)) != WK_OK) {
        return e;
    }
    if ((uint64_t)g->m2_head_dim * g->m2_heads != v->m2_inner)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: mamba_n_heads %u x mamba_d_head %u is not mamba_expand x "
                           "hidden_size (%u)",
                           g->m2_heads, g->m2_head_dim, v->m2_inner);
    if (g->m2_heads % g->m2_groups != 0)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: mamba_n_heads %u is not a multiple of mamba_n_groups %u",
                           g->m2_heads, g->m2_groups);
    if (g->attn_heads % g->attn_kv_heads != 0)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: num_attention_heads %u is not a multiple of "
                           "num_key_value_heads %u",
                           g->attn_heads, g->attn_kv_heads);
    /* the attention head dim: head_dim when the config has it, else hidden_size / heads */
    if ((e = gh_u32(c, "head_dim", C / g->attn_heads, 2, GH_MAX_HEAD_DIM, &g->attn_head_dim, d)) !=
        WK_OK)
        return e;
    if (g->attn_head_dim % 2 != 0)
        return wk_diag_set(d, WK_EINVAL, "config.json: attention head dim %u is odd",
                           g->attn_head_dim);
    if (v->n_experts > 0 &&
        ((e = gh_u32(c, "num_experts_per_tok", 2, 1, v->n_experts, &v->top_k, d)) != WK_OK ||
         (e = gh_u32(c, "intermediate_size", 0, 1, GH_MAX_DIM, &v->moe_ffn, d)) != WK_OK))
        return e;
    /* the dense MLP (every layer's, or none with experts) is the shared MLP */
    g->ffn_dim = v->n_experts > 0 ? v->moe_ffn : v->shared_ffn;
    return WK_OK;
}

/*
 * The layer kinds: layer_types (or the older layers_block_type), "mamba" /
 * "linear_attention" and "attention" / "full_attention"; absent: all Mamba2
 * (transformers' default).
 */
static wk_err
gh_read_kinds(const json_t *c, gh_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    const char *key = "layer_types";
    const json_t *lt = json_object_get(c, key);
    if (lt == NULL || json_is_null(lt))
        lt = json_object_get(c, key = "layers_block_type");
    if (lt != NULL && json_is_null(lt))
        lt = NULL;
    if (lt != NULL && (!json_is_array(lt) || json_array_size(lt) != g->n_layer))
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: %s must be an array of num_hidden_layers (%u) strings",
                           key, g->n_layer);
    g->n_attn = g->n_m2 = 0;
    for (uint32_t l = 0; l < g->n_layer; l++) {
        const json_t *s = lt != NULL ? json_array_get(lt, l) : NULL;
        const char *k = lt == NULL ? "mamba" : json_is_string(s) ? json_string_value(s) : "";
        wrk_gdn_layer *ly = &v->layers[l];
        if (strcmp(k, "mamba") == 0 || strcmp(k, "linear_attention") == 0)
            ly->mixer = WRK_MIXER_MAMBA2;
        else if (strcmp(k, "attention") == 0 || strcmp(k, "full_attention") == 0)
            ly->mixer = WRK_MIXER_ATTN;
        else
            return wk_diag_set(d, WK_ENOTSUP,
                               "config.json: %s[%u] \"%.32s\" is not supported (mamba, "
                               "attention, linear_attention, full_attention)",
                               key, l, k);
        ly->mlp = v->n_experts > 0 ? WRK_MLP_MOE : WRK_MLP_SWIGLU;
        g->n_attn += ly->mixer == WRK_MIXER_ATTN;
        g->n_m2 += ly->mixer == WRK_MIXER_MAMBA2;
    }
    if (g->n_m2 == 0)
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: no mamba layer (a plain transformer is not a "
                           "recurrent-state model)");
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* tensors                                                                   */
/* ------------------------------------------------------------------------ */

/* model.[layers.<l>.]<suf> into name; NULL when absent. */
static const wk_tensor *
gh_find(const wk_tensor_set *set, long layer, const char *suf, char *name)
{
    if (layer < 0)
        snprintf(name, GH_NAME, GH_PREFIX "%s", suf);
    else
        snprintf(name, GH_NAME, GH_PREFIX "layers.%ld.%s", layer, suf);
    return wk_tensor_set_find(set, name);
}

/* A present tensor of shape [d0, d1] (d1 0: a vector [d0] with any leading 1s). */
static wk_err
gh_need(const wk_tensor_set *set, long layer, const char *suf, int64_t d0, int64_t d1,
        const wk_tensor **out, wk_diag *d)
{
    char name[GH_NAME], want[64];
    const wk_tensor *t = gh_find(set, layer, suf, name);
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    bool ok = d1 == 0 ? wrk_is_vec(t, d0) : wrk_is_mat(t, d0, d1);
    if (!ok) {
        if (d1 == 0)
            snprintf(want, sizeof(want), "[%" PRId64 "]", d0);
        else
            snprintf(want, sizeof(want), "[%" PRId64 ",%" PRId64 "]", d0, d1);
        return wrk_shape_err(d, name, t, want);
    }
    *out = t;
    return WK_OK;
}

/* A 2-D view [d0, d1] of t's rows from row r0 (of t's last dim, d1 wide; not Q8_0 blocks). */
static void
gh_view2(const wk_tensor *t, size_t r0, int64_t d0, int64_t d1, wk_tensor *out)
{
    const size_t row = (size_t)d1 / wk_dtype_block_len(t->dtype) * wk_dtype_block_bytes(t->dtype);
    *out = *t;
    out->ndim = 2;
    out->shape[0] = d0;
    out->shape[1] = d1;
    out->data = (const uint8_t *)t->data + r0 * row;
    out->nbytes = (size_t)d0 * row;
}

/* The embedding: C and V, checked against the config. */
static wk_err
gh_map_embd(const wk_tensor_set *set, const json_t *c, gh_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    char name[GH_NAME];
    const wk_tensor *emb = gh_find(set, -1, "embed_tokens.weight", name);
    if (emb == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    if (emb->ndim != 2 || emb->shape[0] < 1 || emb->shape[0] > GH_MAX_VOCAB || emb->shape[1] < 1 ||
        emb->shape[1] > GH_MAX_EMBD)
        return wrk_shape_err(d, name, emb, "[vocab_size, hidden_size]");
    g->emb = emb;
    g->vocab_size = (uint32_t)emb->shape[0];
    g->n_embd = (uint32_t)emb->shape[1];
    uint32_t x;
    wk_err e;
    if ((e = wrk_config_u32(c, "hidden_size", g->n_embd, &x, d)) != WK_OK)
        return e;
    if (x != g->n_embd)
        return wk_diag_set(d, WK_EINVAL, "config.json: hidden_size is %u but %s has %u columns", x,
                           name, g->n_embd);
    if ((e = wrk_config_u32(c, "vocab_size", g->vocab_size, &x, d)) != WK_OK)
        return e;
    if (x != g->vocab_size)
        return wk_diag_set(d, WK_EINVAL, "config.json: vocab_size is %u but %s has %u rows", x,
                           name, g->vocab_size);
    return WK_OK;
}

/* One Mamba2 mixer (mamba.*). */
static wk_err
gh_map_mamba(const wk_tensor_set *set, gh_view *v, uint32_t l, wk_diag *d)
{
    const wrk_gdn *g = &v->g;
    wrk_gdn_layer *ly = &v->layers[l];
    const int64_t C = g->n_embd, DI = v->m2_inner, H = g->m2_heads;
    const int64_t CD = DI + 2 * (int64_t)g->m2_groups * g->m2_state;
    const int64_t DIP = DI + CD + H;
    const wk_tensor *in, *out;
    char name[GH_NAME], want[64];
    wk_err e;
    if ((e = gh_need(set, l, "mamba.in_proj.weight", DIP, C, &in, d)) != WK_OK ||
        (e = gh_need(set, l, "mamba.conv1d.bias", CD, 0, &ly->m2.conv_b, d)) != WK_OK ||
        (e = gh_need(set, l, "mamba.dt_bias", H, 0, &ly->m2.dt_bias, d)) != WK_OK ||
        (e = gh_need(set, l, "mamba.A_log", H, 0, &ly->m2.A_log, d)) != WK_OK ||
        (e = gh_need(set, l, "mamba.D", H, 0, &ly->m2.D, d)) != WK_OK ||
        (e = gh_need(set, l, "mamba.norm.weight", DI, 0, &ly->m2.gnorm, d)) != WK_OK ||
        (e = gh_need(set, l, "mamba.out_proj.weight", C, DI, &out, d)) != WK_OK)
        return e;
    const wk_tensor *cw = gh_find(set, l, "mamba.conv1d.weight", name);
    if (cw == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    if (cw->ndim != 3 || cw->shape[0] != CD || cw->shape[1] != 1 || cw->shape[2] != g->m2_conv) {
        snprintf(want, sizeof(want), "[%" PRId64 ",1,%u]", CD, g->m2_conv);
        return wrk_shape_err(d, name, cw, want);
    }
    ly->m2.conv_w = cw;
    ly->m2.in_proj = (wrk_mat){in, (uint32_t)C, (uint32_t)DIP, false};
    ly->m2.out_proj = (wrk_mat){out, (uint32_t)DI, (uint32_t)C, false};
    return WK_OK;
}

/* One attention mixer (self_attn.*: no biases, no q/k norms). */
static wk_err
gh_map_attn(const wk_tensor_set *set, gh_view *v, uint32_t l, wk_diag *d)
{
    const wrk_gdn *g = &v->g;
    wrk_gdn_layer *ly = &v->layers[l];
    const int64_t C = g->n_embd, Da = g->attn_head_dim;
    const int64_t QD = (int64_t)g->attn_heads * Da, KVD = (int64_t)g->attn_kv_heads * Da;
    const wk_tensor *q, *k, *vv, *o;
    wk_err e;
    if ((e = gh_need(set, l, "self_attn.q_proj.weight", QD, C, &q, d)) != WK_OK ||
        (e = gh_need(set, l, "self_attn.k_proj.weight", KVD, C, &k, d)) != WK_OK ||
        (e = gh_need(set, l, "self_attn.v_proj.weight", KVD, C, &vv, d)) != WK_OK ||
        (e = gh_need(set, l, "self_attn.o_proj.weight", C, QD, &o, d)) != WK_OK)
        return e;
    ly->q_proj = (wrk_mat){q, (uint32_t)C, (uint32_t)QD, false};
    ly->k_proj = (wrk_mat){k, (uint32_t)C, (uint32_t)KVD, false};
    ly->v_proj = (wrk_mat){vv, (uint32_t)C, (uint32_t)KVD, false};
    ly->o_proj = (wrk_mat){o, (uint32_t)QD, (uint32_t)C, false};
    return WK_OK;
}

/* A fused 3-D expert tensor [E, d1, d2] (not Q8_0: its views are rows of whole blocks). */
static wk_err
gh_need3(const wk_tensor_set *set, uint32_t l, const char *suf, int64_t E, int64_t d1, int64_t d2,
         const wk_tensor **out, wk_diag *d)
{
    char name[GH_NAME], want[80];
    const wk_tensor *t = gh_find(set, l, suf, name);
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    if (t->ndim != 3 || t->shape[0] != E || t->shape[1] != d1 || t->shape[2] != d2 ||
        (t->dtype == WK_DTYPE_Q8_0 && d2 % 32 != 0)) {
        snprintf(want, sizeof(want), "[%" PRId64 ",%" PRId64 ",%" PRId64 "]", E, d1, d2);
        return wrk_shape_err(d, name, t, want);
    }
    *out = t;
    return WK_OK;
}

/*
 * Layer l's MLP: the shared MLP (input_linear's gate and up rows as views,
 * output_linear) as the dense SwiGLU, or as the ungated shared expert of
 * the layer's mixture of experts (router.layer, input_linear [E, 2 F, C],
 * output_linear [E, C, F], one view per expert and part).
 */
static wk_err
gh_map_mlp(const wk_tensor_set *set, gh_view *v, uint32_t l, wk_diag *d)
{
    const wrk_gdn *g = &v->g;
    wrk_gdn_layer *ly = &v->layers[l];
    const uint32_t C = g->n_embd, Fs = v->shared_ffn, E = v->n_experts, F = v->moe_ffn;
    const wk_tensor *in, *out, *r, *gu, *dn;
    wk_err e;
    if ((e = gh_need(set, l, "post_attention_layernorm.weight", C, 0, &ly->mlp_norm, d)) != WK_OK ||
        (e = gh_need(set, l, "shared_mlp.input_linear.weight", 2 * (int64_t)Fs, C, &in, d)) !=
            WK_OK ||
        (e = gh_need(set, l, "shared_mlp.output_linear.weight", C, Fs, &out, d)) != WK_OK)
        return e;
    wk_tensor *p = &v->parts[(size_t)l * GH_N_PARTS];
    gh_view2(in, 0, Fs, C, &p[GH_SH_GATE]);
    gh_view2(in, Fs, Fs, C, &p[GH_SH_UP]);
    const wrk_mat sg = {&p[GH_SH_GATE], C, Fs, false}, su = {&p[GH_SH_UP], C, Fs, false};
    const wrk_mat sd = {out, Fs, C, false};
    if (E == 0) {
        ly->gate_proj = sg;
        ly->up_proj = su;
        ly->down_proj = sd;
        return WK_OK;
    }
    wrk_moe *mo = &v->moes[l];
    mo->n_experts = E;
    mo->top_k = v->top_k;
    mo->ffn = F;
    mo->act = WRK_MLP_SWIGLU;
    mo->route = WRK_MOE_TOPK_SOFTMAX;
    mo->shared_ffn = Fs;
    mo->sh_gate = sg;
    mo->sh_up = su;
    mo->sh_down = sd;
    mo->gate = &v->emats[(size_t)l * 3 * E];
    mo->up = mo->gate + E;
    mo->down = mo->up + E;
    if ((e = gh_need(set, l, "block_sparse_moe.router.layer.weight", E, C, &r, d)) != WK_OK ||
        (e = gh_need3(set, l, "block_sparse_moe.input_linear.weight", E, 2 * (int64_t)F, C, &gu,
                      d)) != WK_OK ||
        (e = gh_need3(set, l, "block_sparse_moe.output_linear.weight", E, C, F, &dn, d)) != WK_OK)
        return e;
    mo->router = (wrk_mat){r, C, E, false};
    wk_tensor *ep = &v->eparts[(size_t)l * 3 * E];
    for (uint32_t x = 0; x < E; x++) {
        gh_view2(gu, (size_t)x * 2 * F, F, C, &ep[3 * x]);
        gh_view2(gu, (size_t)x * 2 * F + F, F, C, &ep[3 * x + 1]);
        gh_view2(dn, (size_t)x * C, C, F, &ep[3 * x + 2]);
        mo->gate[x] = (wrk_mat){&ep[3 * x], C, F, false};
        mo->up[x] = (wrk_mat){&ep[3 * x + 1], C, F, false};
        mo->down[x] = (wrk_mat){&ep[3 * x + 2], F, C, false};
    }
    ly->moe = mo;
    return WK_OK;
}

/* The final norm and the head (tie_word_embeddings; a stored lm_head is ignored when tied). */
static wk_err
gh_map_head(const wk_tensor_set *set, const json_t *c, gh_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    wk_err e;
    if ((e = gh_need(set, -1, "norm.weight", g->n_embd, 0, &g->norm, d)) != WK_OK)
        return e;
    const wk_tensor *head = wk_tensor_set_find(set, "lm_head.weight");
    bool tied;
    if ((e = wrk_config_bool(c, "tie_word_embeddings", head == NULL, &tied, d)) != WK_OK)
        return e;
    if (!tied && head == NULL)
        return wk_diag_set(d, WK_EINVAL,
                           "lm_head.weight: missing (config.json tie_word_embeddings is false)");
    if (tied)
        head = NULL; /* transformers ties the head to the embedding, whatever is stored */
    if (head != NULL && !wrk_is_mat(head, g->vocab_size, g->n_embd)) {
        char want[64];
        snprintf(want, sizeof(want), "[%u,%u] (as the embedding)", g->vocab_size, g->n_embd);
        return wrk_shape_err(d, "lm_head.weight", head, want);
    }
    g->tied = tied;
    g->head = (wrk_mat){tied ? g->emb : head, g->n_embd, g->vocab_size, false};
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* declaration                                                               */
/* ------------------------------------------------------------------------ */

static wk_err
gh_use(wrk_model *m, long layer, const char *suf, const wk_tensor **field, bool vec, wk_diag *d)
{
    char name[GH_NAME];
    if (layer < 0)
        snprintf(name, sizeof(name), GH_PREFIX "%s", suf);
    else
        snprintf(name, sizeof(name), GH_PREFIX "layers.%ld.%s", layer, suf);
    return wrk_model_use(m, field, name, false, vec, d);
}

static wk_err
gh_use_part(wrk_model *m, const wk_tensor_set *set, uint32_t l, const char *parent_suf,
            const char *part, const wk_tensor **field, wk_diag *d)
{
    char name[GH_NAME], pname[GH_NAME];
    const wk_tensor *parent = gh_find(set, l, parent_suf, pname);
    snprintf(name, sizeof(name), "%s%s", pname, part);
    return wrk_model_use_part(m, field, name, false, parent, d);
}

/* Layer l's MLP tensors (checkpoint names; views as "<name>[gate]", "<name>[<e>][up]" ...). */
static wk_err
gh_declare_mlp(wrk_model *m, const wk_tensor_set *set, gh_view *v, uint32_t l, wk_diag *d)
{
    wrk_gdn_layer *ly = &v->layers[l];
    wrk_moe *mo = ly->moe;
    const char *sh_in = "shared_mlp.input_linear.weight";
    wk_err e;
    if ((e = gh_use(m, l, "post_attention_layernorm.weight", &ly->mlp_norm, true, d)) != WK_OK)
        return e;
    if (mo == NULL) {
        if ((e = gh_use_part(m, set, l, sh_in, "[gate]", &ly->gate_proj.t, d)) != WK_OK ||
            (e = gh_use_part(m, set, l, sh_in, "[up]", &ly->up_proj.t, d)) != WK_OK)
            return e;
        return gh_use(m, l, "shared_mlp.output_linear.weight", &ly->down_proj.t, false, d);
    }
    if ((e = gh_use(m, l, "block_sparse_moe.router.layer.weight", &mo->router.t, false, d)) !=
        WK_OK)
        return e;
    for (uint32_t x = 0; x < mo->n_experts; x++) {
        char part[48];
        snprintf(part, sizeof(part), "[%u][gate]", x);
        if ((e = gh_use_part(m, set, l, "block_sparse_moe.input_linear.weight", part,
                             &mo->gate[x].t, d)) != WK_OK)
            return e;
        snprintf(part, sizeof(part), "[%u][up]", x);
        if ((e = gh_use_part(m, set, l, "block_sparse_moe.input_linear.weight", part, &mo->up[x].t,
                             d)) != WK_OK)
            return e;
        snprintf(part, sizeof(part), "[%u]", x);
        if ((e = gh_use_part(m, set, l, "block_sparse_moe.output_linear.weight", part,
                             &mo->down[x].t, d)) != WK_OK)
            return e;
    }
    if ((e = gh_use_part(m, set, l, sh_in, "[gate]", &mo->sh_gate.t, d)) != WK_OK ||
        (e = gh_use_part(m, set, l, sh_in, "[up]", &mo->sh_up.t, d)) != WK_OK)
        return e;
    return gh_use(m, l, "shared_mlp.output_linear.weight", &mo->sh_down.t, false, d);
}

/* Declares every tensor served, in checkpoint order. */
static wk_err
gh_declare(wrk_model *m, const wk_tensor_set *set, gh_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    wk_err e;
    if ((e = gh_use(m, -1, "embed_tokens.weight", &g->emb, false, d)) != WK_OK)
        return e;
    for (uint32_t l = 0; l < g->n_layer; l++) {
        wrk_gdn_layer *ly = &v->layers[l];
        if ((e = gh_use(m, l, "input_layernorm.weight", &ly->attn_norm, true, d)) != WK_OK)
            return e;
        if (ly->mixer == WRK_MIXER_ATTN) {
            if ((e = gh_use(m, l, "self_attn.q_proj.weight", &ly->q_proj.t, false, d)) != WK_OK ||
                (e = gh_use(m, l, "self_attn.k_proj.weight", &ly->k_proj.t, false, d)) != WK_OK ||
                (e = gh_use(m, l, "self_attn.v_proj.weight", &ly->v_proj.t, false, d)) != WK_OK ||
                (e = gh_use(m, l, "self_attn.o_proj.weight", &ly->o_proj.t, false, d)) != WK_OK)
                return e;
        } else {
            wrk_mamba2_layer *m2 = &ly->m2;
            if ((e = gh_use(m, l, "mamba.in_proj.weight", &m2->in_proj.t, false, d)) != WK_OK ||
                (e = gh_use(m, l, "mamba.conv1d.weight", &m2->conv_w, false, d)) != WK_OK ||
                (e = gh_use(m, l, "mamba.conv1d.bias", &m2->conv_b, true, d)) != WK_OK ||
                (e = gh_use(m, l, "mamba.dt_bias", &m2->dt_bias, true, d)) != WK_OK ||
                (e = gh_use(m, l, "mamba.A_log", &m2->A_log, true, d)) != WK_OK ||
                (e = gh_use(m, l, "mamba.D", &m2->D, true, d)) != WK_OK ||
                (e = gh_use(m, l, "mamba.norm.weight", &m2->gnorm, true, d)) != WK_OK ||
                (e = gh_use(m, l, "mamba.out_proj.weight", &m2->out_proj.t, false, d)) != WK_OK)
                return e;
        }
        if ((e = gh_declare_mlp(m, set, v, l, d)) != WK_OK)
            return e;
    }
    if ((e = gh_use(m, -1, "norm.weight", &g->norm, true, d)) != WK_OK ||
        (e = wrk_model_use(m, &g->head.t, "lm_head.weight", false, false, d)) != WK_OK)
        return e;
    /* tied: a stored lm_head is transformers' tie too (never read) */
    const wk_tensor *stored = wk_tensor_set_find(set, "lm_head.weight");
    if (g->tied && stored != NULL && (e = wrk_model_skip(m, stored, d)) != WK_OK)
        return e;
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* family ops                                                                */
/* ------------------------------------------------------------------------ */

static bool
gh_detect(const wk_tensor_set *set)
{
    return wk_tensor_set_find(set, GH_PREFIX "embed_tokens.weight") != NULL &&
           wk_tensor_set_find(set, GH_PREFIX "layers.0.shared_mlp.input_linear.weight") != NULL;
}

static void
gh_free_view(void *view)
{
    gh_view *v = view;
    if (v == NULL)
        return;
    free(v->layers);
    free(v->parts);
    free(v->moes);
    free(v->emats);
    free(v->eparts);
    free(v);
}

/* The per-layer arrays (the experts' only with experts). */
static wk_err
gh_alloc(gh_view *v, wk_diag *d)
{
    const uint32_t L = v->g.n_layer;
    v->layers = calloc(L, sizeof(*v->layers));
    v->parts = calloc((size_t)L * GH_N_PARTS, sizeof(*v->parts));
    if (v->layers == NULL || v->parts == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    v->g.layers = v->layers;
    if (v->n_experts == 0)
        return WK_OK;
    const size_t n3 = (size_t)L * 3 * v->n_experts;
    v->moes = calloc(L, sizeof(*v->moes));
    v->emats = calloc(n3, sizeof(*v->emats));
    v->eparts = calloc(n3, sizeof(*v->eparts));
    if (v->moes == NULL || v->emats == NULL || v->eparts == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory (%u layers of %u experts)", L,
                           v->n_experts);
    return WK_OK;
}

static wk_err
gh_map(wrk_model *m, const wk_tensor_set *set, const json_t *config, void **out,
       wrk_model_info *info, wk_diag *d)
{
    wk_err e;
    if (config == NULL)
        return wk_diag_set(d, WK_EINVAL, "config.json: missing (a Granite-4.0-H model needs it)");
    gh_view *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wrk_gdn *g = &v->g;
    if ((e = gh_read_switches(config, v, d)) != WK_OK || (e = gh_map_embd(set, config, v, d)) != WK_OK ||
        (e = gh_read_dims(config, v, d)) != WK_OK || (e = gh_read_rope(config, v, d)) != WK_OK ||
        (e = gh_alloc(v, d)) != WK_OK || (e = gh_read_kinds(config, v, d)) != WK_OK)
        goto fail;
    for (uint32_t l = 0; l < g->n_layer; l++) {
        wrk_gdn_layer *ly = &v->layers[l];
        if ((e = gh_need(set, l, "input_layernorm.weight", g->n_embd, 0, &ly->attn_norm, d)) !=
                WK_OK ||
            (e = ly->mixer == WRK_MIXER_ATTN ? gh_map_attn(set, v, l, d)
                                             : gh_map_mamba(set, v, l, d)) != WK_OK ||
            (e = gh_map_mlp(set, v, l, d)) != WK_OK)
            goto fail;
    }
    if (g->n_attn == 0) /* no attention layer: its dims describe nothing */
        g->attn_heads = g->attn_kv_heads = g->attn_head_dim = g->rope_dim = 0;
    if ((e = gh_map_head(set, config, v, d)) != WK_OK || (e = gh_declare(m, set, v, d)) != WK_OK)
        goto fail;

    wrk_gdn_fill_info(g, g->m2_heads, g->m2_head_dim, info);
    *out = v;
    return WK_OK;

fail:
    gh_free_view(v);
    return e;
}

static size_t
gh_layout(const void *view, wrk_state_tensor *out, size_t cap)
{
    return wrk_gdn_state_layout(&((const gh_view *)view)->g, out, cap);
}

static void
gh_fingerprint_extra(const void *view, char *buf, size_t len)
{
    const gh_view *v = view;
    const wrk_gdn *g = &v->g;
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the layer kinds */
    for (uint32_t l = 0; l < g->n_layer; l++) {
        h ^= (uint64_t)g->layers[l].mixer;
        h *= 1099511628211ull;
    }
    snprintf(buf, len,
             "granite_h.kinds_fnv=%016llx\ngranite_h.m2.heads=%u\ngranite_h.m2.head_dim=%u\n"
             "granite_h.m2.groups=%u\ngranite_h.m2.state=%u\ngranite_h.m2.conv=%u\n"
             "granite_h.tied=%d\ngranite_h.norm_eps=%.17g\ngranite_h.attn.heads=%u\n"
             "granite_h.attn.kv_heads=%u\ngranite_h.attn.head_dim=%u\ngranite_h.attn.rope_dim=%u\n"
             "granite_h.attn.rope_theta=%.17g\ngranite_h.emb_mul=%.9g\ngranite_h.res_mul=%.9g\n"
             "granite_h.attn_scale=%.9g\ngranite_h.logit_div=%.9g\ngranite_h.moe.experts=%u\n"
             "granite_h.moe.top_k=%u",
             (unsigned long long)h, g->m2_heads, g->m2_head_dim, g->m2_groups, g->m2_state,
             g->m2_conv, g->tied, g->norm_eps, g->attn_heads, g->attn_kv_heads, g->attn_head_dim,
             g->rope_dim, g->rope_theta, (double)g->emb_mul, (double)g->res_mul,
             (double)g->attn_scale, (double)g->logit_div, v->n_experts, v->top_k);
}

static size_t
gh_quant_mats(void *view, wrk_mat **out, size_t cap)
{
    gh_view *v = view;
    return wrk_gdn_quant_mats(&v->g, v->layers, out, cap);
}

const wrk_family wrk_family_granite_h = {
    .name = "granite_h",
    .view = "gdn",
    .model_types = types,
    .detect = gh_detect,
    .map = gh_map,
    .free_view = gh_free_view,
    .state_layout = gh_layout,
    .fingerprint_extra = gh_fingerprint_extra,
    .quant_mats = gh_quant_mats,
};
