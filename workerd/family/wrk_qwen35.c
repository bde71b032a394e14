/*
 * wrk_qwen35: the Qwen3.5 family (transformers `qwen3_5`: the text model of
 * Qwen3_5ForConditionalGeneration, weights under model.language_model.*,
 * and `qwen3_5_text`: Qwen3_5ForCausalLM, weights under model.*) for
 * wrk_model, mapped onto the Gated DeltaNet view (wrk_gdn.h) that the
 * backends already run.
 *
 * A Qwen3.5 model is a list of layers of two kinds over one residual
 * stream (config "layer_types", else every full_attention_interval-th layer
 * is attention): "linear_attention" (Gated DeltaNet: fused in_proj_qkv,
 * in_proj_z (the output gate), in_proj_b (beta), in_proj_a (decay input),
 * one depthwise conv over q|k|v, A_log, dt_bias, the gated per-head RMSNorm,
 * out_proj; linear_num_key_heads query/key heads shared by groups of the
 * linear_num_value_heads value heads) and "full_attention" (q_proj giving
 * per head the query then an output gate, per-head q/k RMSNorm, GQA,
 * rotary embedding on the first head_dim * partial_rotary_factor dims),
 * each followed by the SwiGLU MLP. Every RMSNorm but the Gated DeltaNet's
 * output norm multiplies by (1 + weight) (norm_offset 1).
 *
 * The fused projections become views of rows: in_proj_qkv's first KD rows
 * are q_proj, the next KD k_proj, the last VD v_proj, and conv1d's rows
 * split the same way (a depthwise conv over the concatenation is three
 * convs over its parts). The views are this family's (one allocation per
 * model), declared with wrk_model_use_part.
 *
 * Multimodal RoPE: for text every one of the three position streams is the
 * token index, so the interleaved sections all rotate by the same angle and
 * mrope reduces to 1-D RoPE over rope_dim; images and video are not served.
 * The vision tower (model.visual.*) and the multi-token-prediction layers
 * (mtp.*) are skipped (wrk_model_skip: the worker logs their count once).
 *
 * Refused up front, naming the key: hidden_act other than silu,
 * attention_bias, a rope_type other than default, an odd rotary width, a
 * layer type other than the two above, a model with no Gated DeltaNet layer.
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

#define Q35_MAX_LAYERS 4096u
#define Q35_MAX_EMBD (1u << 17)
#define Q35_MAX_DIM (1u << 20)
#define Q35_MAX_VOCAB (1u << 22)
#define Q35_MAX_HEADS 4096u
#define Q35_MAX_CONV 64u
#define Q35_MAX_ATTN_DIM 1024u
#define Q35_NAME 256 /* longest tensor name built here */

static const char *const types[] = {"qwen3_5",          "qwen3_5_text", "qwen3_5_moe",
                                     "qwen3_5_moe_text", "qwen3_next",   NULL};

/*
 * Parts of one Gated DeltaNet layer's fused tensors: row views of
 * in_proj_qkv and conv1d (Qwen3.5), or, for Qwen3-Next, copies gathered
 * from the per-key-head groups of in_proj_qkvz and in_proj_ba.
 */
enum { Q35_PQ, Q35_PK, Q35_PV, Q35_CQ, Q35_CK, Q35_CV, Q35_PZ, Q35_PB, Q35_PA, Q35_N_PARTS };

/* Which checkpoint layout. */
typedef enum q35_kind {
    Q35_DENSE = 0, /* qwen3_5, qwen3_5_text */
    Q35_MOE,       /* qwen3_5_moe, qwen3_5_moe_text: every MLP a mixture of experts */
    Q35_NEXT,      /* qwen3_next: in_proj_qkvz / in_proj_ba, decoder_sparse_step */
} q35_kind;

/* The view and the storage it points into (never moved after map). */
typedef struct q35_view {
    wrk_gdn g;              /* what the backends read: must be first */
    wrk_gdn_layer *layers;  /* n_layer entries, owned */
    wk_tensor *parts;       /* n_layer * Q35_N_PARTS row views, owned (data borrowed) */
    char prefix[32];        /* "model.language_model." or "model." */
    double partial_rotary;  /* partial_rotary_factor */
    q35_kind kind;          /* checkpoint layout */
    bool grouped_in;        /* in_proj_qkvz / in_proj_ba (Qwen3-Next's HF layout); false:
                               in_proj_qkv / _z / _b / _a (Qwen3.5's, and a qwen3next GGUF's) */
    wrk_moe *moes;          /* n_layer entries (the MoE layers' used), owned */
    wrk_mat *emats;         /* n_layer * 3 * E expert matrices, owned */
    wk_tensor *eparts;      /* n_layer * 3 * E views of fused expert tensors, owned */
    uint8_t **gathered;     /* Qwen3-Next: n_layer gathered copies (NULL for others), owned */
    uint32_t n_experts, top_k, moe_ffn, shared_ffn; /* the MoE config (0 experts: none) */
    bool norm_topk;         /* norm_topk_prob */
    uint32_t sparse_step;   /* decoder_sparse_step (Qwen3-Next; 1 otherwise) */
} q35_view;

/* ------------------------------------------------------------------------ */
/* config                                                                    */
/* ------------------------------------------------------------------------ */

/* The text config: config.text_config when present (the multimodal model), else config. */
static const json_t *
q35_text_config(const json_t *config)
{
    const json_t *t = config != NULL ? json_object_get(config, "text_config") : NULL;
    return t != NULL && json_is_object(t) ? t : config;
}

static wk_err
q35_u32(const json_t *c, const char *key, uint32_t def, uint32_t min, uint32_t max, uint32_t *out,
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

/*
 * RoPE: rope_parameters {rope_type, rope_theta, partial_rotary_factor}
 * (transformers 5), else the older top-level rope_theta /
 * partial_rotary_factor / rope_scaling. Defaults as transformers': theta
 * 10000, partial_rotary_factor 0.25.
 */
static wk_err
q35_read_rope(const json_t *tc, q35_view *v, wk_diag *d)
{
    const json_t *rp = json_object_get(tc, "rope_parameters");
    if (rp == NULL || json_is_null(rp))
        rp = json_object_get(tc, "rope_scaling");
    if (rp != NULL && !json_is_null(rp) && !json_is_object(rp))
        return wk_diag_set(d, WK_EINVAL, "config.json: rope_parameters must be an object");
    if (rp != NULL && json_is_null(rp))
        rp = NULL;
    const char *type;
    wk_err e = wrk_config_str(rp, "rope_type", "default", &type, d);
    if (e == WK_OK && strcmp(type, "default") != 0)
        e = wk_diag_set(d, WK_ENOTSUP,
                        "config.json: rope_parameters.rope_type \"%.32s\" is not supported "
                        "(default only)",
                        type);
    double theta = 10000.0, prf = 0.25;
    if (e == WK_OK)
        e = wrk_config_f64(tc, "rope_theta", theta, &theta, d);
    if (e == WK_OK && rp != NULL)
        e = wrk_config_f64(rp, "rope_theta", theta, &theta, d);
    if (e == WK_OK)
        e = wrk_config_f64(tc, "partial_rotary_factor", prf, &prf, d);
    if (e == WK_OK && rp != NULL)
        e = wrk_config_f64(rp, "partial_rotary_factor", prf, &prf, d);
    if (e != WK_OK)
        return e;
    if (!(theta > 1.0) || !isfinite(theta))
        return wk_diag_set(d, WK_EINVAL, "config.json: rope_theta %g is not a RoPE base", theta);
    if (!(prf > 0.0) || prf > 1.0)
        return wk_diag_set(d, WK_EINVAL, "config.json: partial_rotary_factor %g not in (0, 1]",
                           prf);
    v->g.rope_theta = theta;
    v->partial_rotary = prf;
    return WK_OK;
}

/* The switches: activation, biases, epsilons; the fixed Qwen3.5 conventions. */
static wk_err
q35_read_switches(const json_t *tc, q35_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    const char *act;
    bool bias;
    double eps;
    wk_err e;
    if ((e = wrk_config_str(tc, "hidden_act", "silu", &act, d)) != WK_OK)
        return e;
    if (strcmp(act, "silu") != 0)
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: hidden_act \"%.32s\" is not supported (silu only)", act);
    if ((e = wrk_config_bool(tc, "attention_bias", false, &bias, d)) != WK_OK)
        return e;
    if (bias)
        return wk_diag_set(d, WK_ENOTSUP, "config.json: attention_bias true is not supported");
    if ((e = wrk_config_f64(tc, "rms_norm_eps", 1e-6, &eps, d)) != WK_OK)
        return e;
    if (!(eps > 0.0) || eps > 1.0)
        return wk_diag_set(d, WK_EINVAL, "config.json: rms_norm_eps %g not in (0, 1]", eps);
    g->norm_eps = eps;
    g->attn_norm_eps = eps;
    g->use_gate = true;          /* in_proj_z */
    g->allow_neg_eigval = false; /* beta = sigmoid(b) */
    g->qk_norm = true;
    g->qkv_bias = false;
    g->attn_gate = true;
    /* a GGUF file from llama.cpp's converter stores the norms as 1 + weight (float32) */
    bool incl;
    if ((e = wrk_config_bool(tc, "wkvm_norms_include_one", false, &incl, d)) != WK_OK)
        return e;
    g->norm_offset = incl ? 0.0f : 1.0f;
    /* a qwen3next GGUF file: llama.cpp's converter split in_proj_qkvz / in_proj_ba */
    bool split;
    if ((e = wrk_config_bool(tc, "wkvm_split_linear_proj", false, &split, d)) != WK_OK)
        return e;
    v->grouped_in = v->kind == Q35_NEXT && !split;
    return q35_read_rope(tc, v, d);
}

/*
 * The layer kinds: layer_types when present, else every
 * full_attention_interval-th layer (default 4) is attention, as
 * transformers' config builds it.
 */
static wk_err
q35_read_kinds(const json_t *tc, q35_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    const json_t *lt = json_object_get(tc, "layer_types");
    uint32_t interval = 4;
    wk_err e;
    if (lt != NULL && !json_is_null(lt)) {
        if (!json_is_array(lt) || json_array_size(lt) != g->n_layer)
            return wk_diag_set(d, WK_EINVAL,
                               "config.json: layer_types must be an array of num_hidden_layers "
                               "(%u) strings",
                               g->n_layer);
    } else if ((e = q35_u32(tc, "full_attention_interval", 4, 1, Q35_MAX_LAYERS, &interval, d)) !=
               WK_OK) {
        return e;
    }
    g->n_attn = 0;
    for (uint32_t l = 0; l < g->n_layer; l++) {
        bool attn;
        if (lt != NULL && !json_is_null(lt)) {
            const json_t *s = json_array_get(lt, l);
            const char *k = json_is_string(s) ? json_string_value(s) : "";
            if (strcmp(k, "full_attention") == 0)
                attn = true;
            else if (strcmp(k, "linear_attention") == 0)
                attn = false;
            else
                return wk_diag_set(d, WK_ENOTSUP,
                                   "config.json: layer_types[%u] \"%.32s\" is not supported "
                                   "(linear_attention, full_attention)",
                                   l, k);
        } else {
            attn = (l + 1) % interval == 0;
        }
        v->layers[l].mixer = attn ? WRK_MIXER_ATTN : WRK_MIXER_GDN;
        v->layers[l].mlp = WRK_MLP_SWIGLU; /* WRK_MLP_MOE set with the experts */
        g->n_attn += attn;
    }
    if (g->n_attn == g->n_layer)
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: no linear_attention layer (a plain transformer is not "
                           "a recurrent-state model)");
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* tensors                                                                   */
/* ------------------------------------------------------------------------ */

/* The tensor prefix + suffix (layer < 0: no layer part), into name; NULL when absent. */
static const wk_tensor *
q35_find(const wk_tensor_set *set, const q35_view *v, long layer, const char *suf, char *name)
{
    if (layer < 0)
        snprintf(name, Q35_NAME, "%s%s", v->prefix, suf);
    else
        snprintf(name, Q35_NAME, "%slayers.%ld.%s", v->prefix, layer, suf);
    return wk_tensor_set_find(set, name);
}

/* A present tensor of shape [d0, d1] (d1 0: a vector [d0] with any leading 1s). */
static wk_err
q35_need(const wk_tensor_set *set, const q35_view *v, long layer, const char *suf, int64_t d0,
         int64_t d1, const wk_tensor **out, wk_diag *d)
{
    char name[Q35_NAME], want[64];
    const wk_tensor *t = q35_find(set, v, layer, suf, name);
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

/*
 * Row view [r0, r0 + n) of t (rows of its first dim, the rest of the shape
 * kept) into *out; name borrowed from t.
 */
static void
q35_rows(const wk_tensor *t, int64_t r0, int64_t n, wk_tensor *out)
{
    int64_t per_row = 1;
    for (int i = 1; i < t->ndim; i++)
        per_row *= t->shape[i];
    const size_t row_bytes =
        (size_t)per_row / wk_dtype_block_len(t->dtype) * wk_dtype_block_bytes(t->dtype);
    *out = *t;
    out->shape[0] = n;
    out->data = (const uint8_t *)t->data + (size_t)r0 * row_bytes;
    out->nbytes = (size_t)n * row_bytes;
}

/* The embedding prefix, C and V, and the per-kind dims checked against the config. */
static wk_err
q35_map_embd(const wk_tensor_set *set, const json_t *tc, q35_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    char name[Q35_NAME];
    const wk_tensor *emb = NULL;
    static const char *const prefixes[] = {"model.language_model.", "model."};
    for (size_t i = 0; i < 2 && emb == NULL; i++) {
        snprintf(v->prefix, sizeof(v->prefix), "%s", prefixes[i]);
        emb = q35_find(set, v, -1, "embed_tokens.weight", name);
    }
    if (emb == NULL)
        return wk_diag_set(d, WK_EINVAL,
                           "model.language_model.embed_tokens.weight: missing (nor "
                           "model.embed_tokens.weight)");
    if (emb->ndim != 2 || emb->shape[0] < 1 || emb->shape[0] > Q35_MAX_VOCAB || emb->shape[1] < 1 ||
        emb->shape[1] > Q35_MAX_EMBD)
        return wrk_shape_err(d, name, emb, "[vocab_size, hidden_size]");
    g->emb = emb;
    g->vocab_size = (uint32_t)emb->shape[0];
    g->n_embd = (uint32_t)emb->shape[1];
    uint32_t x;
    wk_err e;
    if ((e = wrk_config_u32(tc, "hidden_size", g->n_embd, &x, d)) != WK_OK)
        return e;
    if (x != g->n_embd)
        return wk_diag_set(d, WK_EINVAL, "config.json: hidden_size is %u but %s has %u columns",
                           x, name, g->n_embd);
    if ((e = q35_u32(tc, "num_hidden_layers", 0, 1, Q35_MAX_LAYERS, &g->n_layer, d)) != WK_OK)
        return e;
    return WK_OK;
}

/* The dimensions the config gives (checked against the shapes as the layers map). */
static wk_err
q35_read_dims(const json_t *tc, q35_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    wk_err e;
    if ((e = q35_u32(tc, "linear_num_key_heads", 16, 1, Q35_MAX_HEADS, &g->n_head, d)) != WK_OK ||
        (e = q35_u32(tc, "linear_num_value_heads", 32, 1, Q35_MAX_HEADS, &g->n_v_head, d)) !=
            WK_OK ||
        (e = q35_u32(tc, "linear_key_head_dim", 128, 1, Q35_MAX_ATTN_DIM, &g->head_k, d)) !=
            WK_OK ||
        (e = q35_u32(tc, "linear_value_head_dim", 128, 1, Q35_MAX_ATTN_DIM, &g->head_v, d)) !=
            WK_OK ||
        (e = q35_u32(tc, "linear_conv_kernel_dim", 4, 2, Q35_MAX_CONV, &g->conv, d)) != WK_OK ||
        (e = q35_u32(tc, "intermediate_size", 0, v->kind == Q35_DENSE, Q35_MAX_DIM, &g->ffn_dim,
                     d)) != WK_OK ||
        (e = q35_u32(tc, "num_attention_heads", 16, 1, Q35_MAX_HEADS, &g->attn_heads, d)) !=
            WK_OK ||
        (e = q35_u32(tc, "num_key_value_heads", 4, 1, Q35_MAX_HEADS, &g->attn_kv_heads, d)) !=
            WK_OK ||
        (e = q35_u32(tc, "head_dim", 256, 2, Q35_MAX_ATTN_DIM, &g->attn_head_dim, d)) != WK_OK)
        return e;
    if (g->n_v_head % g->n_head != 0)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: linear_num_value_heads %u is not a multiple of "
                           "linear_num_key_heads %u",
                           g->n_v_head, g->n_head);
    if (g->attn_heads % g->attn_kv_heads != 0)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: num_attention_heads %u is not a multiple of "
                           "num_key_value_heads %u",
                           g->attn_heads, g->attn_kv_heads);
    if ((uint64_t)g->n_head * g->head_k > Q35_MAX_DIM ||
        (uint64_t)g->n_v_head * g->head_v > Q35_MAX_DIM ||
        (uint64_t)g->attn_heads * g->attn_head_dim > Q35_MAX_DIM)
        return wk_diag_set(d, WK_EINVAL, "config.json: head counts x head dims over %u",
                           Q35_MAX_DIM);
    /* transformers: int(head_dim * partial_rotary_factor) rotary dims, in pairs */
    uint32_t rd = (uint32_t)((double)g->attn_head_dim * v->partial_rotary);
    if (rd == 0 || rd % 2 != 0)
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: head_dim %u x partial_rotary_factor %g gives %u rotary "
                           "dims (an even count > 0 is needed)",
                           g->attn_head_dim, v->partial_rotary, rd);
    g->rope_dim = rd;
    return WK_OK;
}

/* A 2-D view [d0, d1] of t's elements from element `first` on (t's dtype, not Q8_0). */
static void
q35_view2(const wk_tensor *t, size_t first, int64_t d0, int64_t d1, wk_tensor *out)
{
    const size_t es = wk_dtype_size(t->dtype);
    *out = *t;
    out->ndim = 2;
    out->shape[0] = d0;
    out->shape[1] = d1;
    out->data = (const uint8_t *)t->data + first * es;
    out->nbytes = (size_t)d0 * (size_t)d1 * es;
}

/* Whether layer l's MLP is a mixture of experts. */
static bool
q35_is_moe(const json_t *tc, const q35_view *v, uint32_t l)
{
    if (v->n_experts == 0 || (l + 1) % v->sparse_step != 0)
        return false;
    const json_t *only = json_object_get(tc, "mlp_only_layers");
    size_t i;
    const json_t *x;
    json_array_foreach(only, i, x)
    {
        if (json_is_integer(x) && json_integer_value(x) == (json_int_t)l)
            return false;
    }
    return true;
}

/*
 * One MoE layer's experts: per-expert tensors (mlp.experts.<e>.{gate,up,
 * down}_proj.weight, what save_pretrained writes) or the fused 3-D ones
 * (mlp.experts.gate_up_proj [E, 2 Fe, C], mlp.experts.down_proj [E, C, Fe]:
 * views of each expert's slice), the router and the shared expert.
 */
static wk_err
q35_map_moe(const wk_tensor_set *set, q35_view *v, uint32_t l, wk_diag *d)
{
    const wrk_gdn *g = &v->g;
    const uint32_t E = v->n_experts, Fe = v->moe_ffn, Fs = v->shared_ffn, C = g->n_embd;
    wrk_moe *mo = &v->moes[l];
    char name[Q35_NAME], want[64];
    const wk_tensor *t;
    wk_err e;
    mo->n_experts = E;
    mo->top_k = v->top_k;
    mo->ffn = Fe;
    mo->norm_topk = v->norm_topk;
    mo->act = WRK_MLP_SWIGLU;
    mo->route = WRK_MOE_SOFTMAX;
    mo->shared_ffn = Fs;
    mo->gate = &v->emats[(size_t)l * 3 * E];
    mo->up = mo->gate + E;
    mo->down = mo->up + E;
    if ((e = q35_need(set, v, l, "mlp.gate.weight", E, C, &t, d)) != WK_OK)
        return e;
    mo->router = (wrk_mat){t, C, E, false};
    const wk_tensor *gu = q35_find(set, v, l, "mlp.experts.gate_up_proj", name);
    if (gu != NULL) {
        if (gu->ndim != 3 || gu->shape[0] != E || gu->shape[1] != 2 * (int64_t)Fe ||
            gu->shape[2] != C || gu->dtype == WK_DTYPE_Q8_0) {
            snprintf(want, sizeof(want), "[%u,%u,%u]", E, 2 * Fe, C);
            return wrk_shape_err(d, name, gu, want);
        }
        const wk_tensor *dn = q35_find(set, v, l, "mlp.experts.down_proj", name);
        if (dn == NULL)
            return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
        if (dn->ndim != 3 || dn->shape[0] != E || dn->shape[1] != C || dn->shape[2] != Fe ||
            dn->dtype == WK_DTYPE_Q8_0) {
            snprintf(want, sizeof(want), "[%u,%u,%u]", E, C, Fe);
            return wrk_shape_err(d, name, dn, want);
        }
        wk_tensor *ep = &v->eparts[(size_t)l * 3 * E];
        for (uint32_t x = 0; x < E; x++) {
            const size_t base = (size_t)x * 2 * Fe * C;
            q35_view2(gu, base, Fe, C, &ep[3 * x]);
            q35_view2(gu, base + (size_t)Fe * C, Fe, C, &ep[3 * x + 1]);
            q35_view2(dn, (size_t)x * C * Fe, C, Fe, &ep[3 * x + 2]);
            mo->gate[x] = (wrk_mat){&ep[3 * x], C, Fe, false};
            mo->up[x] = (wrk_mat){&ep[3 * x + 1], C, Fe, false};
            mo->down[x] = (wrk_mat){&ep[3 * x + 2], Fe, C, false};
        }
    } else {
        for (uint32_t x = 0; x < E; x++) {
            char suf[96];
            const wk_tensor *tg, *tu, *td;
            snprintf(suf, sizeof(suf), "mlp.experts.%u.gate_proj.weight", x);
            if ((e = q35_need(set, v, l, suf, Fe, C, &tg, d)) != WK_OK)
                return e;
            snprintf(suf, sizeof(suf), "mlp.experts.%u.up_proj.weight", x);
            if ((e = q35_need(set, v, l, suf, Fe, C, &tu, d)) != WK_OK)
                return e;
            snprintf(suf, sizeof(suf), "mlp.experts.%u.down_proj.weight", x);
            if ((e = q35_need(set, v, l, suf, C, Fe, &td, d)) != WK_OK)
                return e;
            mo->gate[x] = (wrk_mat){tg, C, Fe, false};
            mo->up[x] = (wrk_mat){tu, C, Fe, false};
            mo->down[x] = (wrk_mat){td, Fe, C, false};
        }
    }
    if (Fs > 0) {
        const wk_tensor *sg, *su, *sd, *sr;
        if ((e = q35_need(set, v, l, "mlp.shared_expert.gate_proj.weight", Fs, C, &sg, d)) !=
                WK_OK ||
            (e = q35_need(set, v, l, "mlp.shared_expert.up_proj.weight", Fs, C, &su, d)) !=
                WK_OK ||
            (e = q35_need(set, v, l, "mlp.shared_expert.down_proj.weight", C, Fs, &sd, d)) !=
                WK_OK ||
            (e = q35_need(set, v, l, "mlp.shared_expert_gate.weight", 1, C, &sr, d)) != WK_OK)
            return e;
        mo->sh_gate = (wrk_mat){sg, C, Fs, false};
        mo->sh_up = (wrk_mat){su, C, Fs, false};
        mo->sh_down = (wrk_mat){sd, Fs, C, false};
        mo->sh_router = (wrk_mat){sr, C, 1, false};
    }
    v->layers[l].moe = mo;
    return WK_OK;
}

/* Layer l's post-attention norm and MLP (dense SwiGLU, or experts). */
static wk_err
q35_map_mlp(const wk_tensor_set *set, q35_view *v, uint32_t l, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    wrk_gdn_layer *ly = &v->layers[l];
    const int64_t C = g->n_embd;
    const wk_tensor *gate, *up, *down;
    wk_err e;
    if ((e = q35_need(set, v, l, "post_attention_layernorm.weight", C, 0, &ly->mlp_norm, d)) !=
        WK_OK)
        return e;
    if (v->moes != NULL && v->layers[l].moe != NULL)
        return q35_map_moe(set, v, l, d);
    if ((e = q35_need(set, v, l, "mlp.gate_proj.weight", g->ffn_dim, C, &gate, d)) != WK_OK ||
        (e = q35_need(set, v, l, "mlp.up_proj.weight", g->ffn_dim, C, &up, d)) != WK_OK ||
        (e = q35_need(set, v, l, "mlp.down_proj.weight", C, g->ffn_dim, &down, d)) != WK_OK)
        return e;
    ly->gate_proj = (wrk_mat){gate, (uint32_t)C, g->ffn_dim, false};
    ly->up_proj = (wrk_mat){up, (uint32_t)C, g->ffn_dim, false};
    ly->down_proj = (wrk_mat){down, g->ffn_dim, (uint32_t)C, false};
    return WK_OK;
}

/*
 * Qwen3-Next's fused projections: in_proj_qkvz [H * (2 K + 2 r Vd), C] holds,
 * per key head group g (r = HV / H value heads each), q_g, k_g, v_g, z_g;
 * in_proj_ba [H * 2 r, C] holds b_g, a_g (transformers'
 * fix_query_key_value_ordering). Gathered once into q, k, v, z, b, a
 * matrices of the usual order (owned copies, one allocation per layer).
 */
static wk_err
q35_gather_next(const wk_tensor_set *set, q35_view *v, uint32_t l, wk_tensor *p, wk_diag *d)
{
    const wrk_gdn *g = &v->g;
    const int64_t C = g->n_embd, H = g->n_head, K = g->head_k, r = g->n_v_head / g->n_head;
    const int64_t Vd = g->head_v, G = 2 * K + 2 * r * Vd;
    const wk_tensor *qkvz, *ba;
    wk_err e;
    if ((e = q35_need(set, v, l, "linear_attn.in_proj_qkvz.weight", H * G, C, &qkvz, d)) !=
            WK_OK ||
        (e = q35_need(set, v, l, "linear_attn.in_proj_ba.weight", H * 2 * r, C, &ba, d)) != WK_OK)
        return e;
    if (qkvz->dtype != ba->dtype || qkvz->dtype == WK_DTYPE_Q8_0)
        return wk_diag_set(d, WK_ENOTSUP, "%s: dtype %s cannot be regrouped", qkvz->name,
                           wk_dtype_name(qkvz->dtype));
    const size_t row = (size_t)C * wk_dtype_size(qkvz->dtype);
    uint8_t *buf = malloc((size_t)(H * G + H * 2 * r) * row);
    if (buf == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory regrouping %s", qkvz->name);
    v->gathered[l] = buf;
    /* destination row blocks: q [H K], k [H K], v [HV Vd], z [HV Vd], b [HV], a [HV] */
    const int64_t off[6] = {0, H * K, 2 * H * K, 2 * H * K + H * r * Vd,
                            2 * H * K + 2 * H * r * Vd, 2 * H * K + 2 * H * r * Vd + H * r};
    const int64_t per[4] = {K, K, r * Vd, r * Vd};
    const uint8_t *src = qkvz->data;
    for (int64_t h = 0; h < H; h++) {
        int64_t s0 = h * G;
        for (int part = 0; part < 4; part++) {
            memcpy(buf + (size_t)(off[part] + h * per[part]) * row, src + (size_t)s0 * row,
                   (size_t)per[part] * row);
            s0 += per[part];
        }
        const uint8_t *bs = (const uint8_t *)ba->data + (size_t)(h * 2 * r) * row;
        memcpy(buf + (size_t)(off[4] + h * r) * row, bs, (size_t)r * row);
        memcpy(buf + (size_t)(off[5] + h * r) * row, bs + (size_t)r * row, (size_t)r * row);
    }
    const int idx[6] = {Q35_PQ, Q35_PK, Q35_PV, Q35_PZ, Q35_PB, Q35_PA};
    const int64_t rows[6] = {H * K, H * K, H * r * Vd, H * r * Vd, H * r, H * r};
    for (int i = 0; i < 6; i++) {
        wk_tensor *t = &p[idx[i]];
        *t = *(i < 4 ? qkvz : ba);
        t->ndim = 2;
        t->shape[0] = rows[i];
        t->shape[1] = C;
        t->data = buf + (size_t)off[i] * row;
        t->nbytes = (size_t)rows[i] * row;
    }
    return WK_OK;
}

/*
 * The mixture-of-experts config: Qwen3.5-MoE (every layer, top-k always
 * renormalised) and Qwen3-Next (decoder_sparse_step, mlp_only_layers,
 * norm_topk_prob); none for the dense model.
 */
static wk_err
q35_read_moe(const json_t *tc, q35_view *v, wk_diag *d)
{
    wk_err e;
    v->sparse_step = 1;
    if (v->kind == Q35_DENSE)
        return WK_OK;
    if ((e = q35_u32(tc, "num_experts", 0, 0, 4096, &v->n_experts, d)) != WK_OK)
        return e;
    if (v->n_experts == 0) {
        if (v->kind == Q35_MOE)
            return wk_diag_set(d, WK_EINVAL, "config.json: num_experts 0 in a MoE model");
        return WK_OK;
    }
    if ((e = q35_u32(tc, "num_experts_per_tok", 0, 1, v->n_experts, &v->top_k, d)) != WK_OK ||
        (e = q35_u32(tc, "moe_intermediate_size", 0, 1, Q35_MAX_DIM, &v->moe_ffn, d)) != WK_OK ||
        (e = q35_u32(tc, "shared_expert_intermediate_size", 0, 0, Q35_MAX_DIM, &v->shared_ffn,
                     d)) != WK_OK)
        return e;
    v->norm_topk = true;
    if (v->kind == Q35_NEXT &&
        ((e = wrk_config_bool(tc, "norm_topk_prob", true, &v->norm_topk, d)) != WK_OK ||
         (e = q35_u32(tc, "decoder_sparse_step", 1, 1, Q35_MAX_LAYERS, &v->sparse_step, d)) !=
             WK_OK))
        return e;
    const json_t *only = json_object_get(tc, "mlp_only_layers");
    if (only != NULL && !json_is_null(only) && !json_is_array(only))
        return wk_diag_set(d, WK_EINVAL, "config.json: mlp_only_layers must be an array");
    return WK_OK;
}

/* One Gated DeltaNet layer: the fused tensors split into row views, the rest as stored. */
static wk_err
q35_map_linear(const wk_tensor_set *set, q35_view *v, uint32_t l, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    wrk_gdn_layer *ly = &v->layers[l];
    const int64_t C = g->n_embd, KD = (int64_t)g->n_head * g->head_k;
    const int64_t VD = (int64_t)g->n_v_head * g->head_v, HV = g->n_v_head;
    const int64_t CD = 2 * KD + VD;
    const wk_tensor *qkv = NULL, *z = NULL, *b = NULL, *a = NULL, *conv, *out;
    char name[Q35_NAME], want[64];
    wk_err e;
    wk_tensor *p = &v->parts[(size_t)l * Q35_N_PARTS];
    if (v->grouped_in) {
        if ((e = q35_gather_next(set, v, l, p, d)) != WK_OK)
            return e;
    } else if ((e = q35_need(set, v, l, "linear_attn.in_proj_qkv.weight", CD, C, &qkv, d)) !=
                   WK_OK ||
               (e = q35_need(set, v, l, "linear_attn.in_proj_z.weight", VD, C, &z, d)) != WK_OK ||
               (e = q35_need(set, v, l, "linear_attn.in_proj_b.weight", HV, C, &b, d)) != WK_OK ||
               (e = q35_need(set, v, l, "linear_attn.in_proj_a.weight", HV, C, &a, d)) != WK_OK) {
        return e;
    }
    if ((e = q35_need(set, v, l, "input_layernorm.weight", C, 0, &ly->attn_norm, d)) != WK_OK ||
        (e = q35_need(set, v, l, "linear_attn.dt_bias", HV, 0, &ly->dt_bias, d)) != WK_OK ||
        (e = q35_need(set, v, l, "linear_attn.A_log", HV, 0, &ly->A_log, d)) != WK_OK ||
        (e = q35_need(set, v, l, "linear_attn.norm.weight", g->head_v, 0, &ly->o_norm, d)) !=
            WK_OK ||
        (e = q35_need(set, v, l, "linear_attn.out_proj.weight", C, VD, &out, d)) != WK_OK ||
        (e = q35_map_mlp(set, v, l, d)) != WK_OK)
        return e;
    conv = q35_find(set, v, l, "linear_attn.conv1d.weight", name);
    if (conv == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    if (conv->ndim != 3 || conv->shape[0] != CD || conv->shape[1] != 1 ||
        conv->shape[2] != g->conv) {
        snprintf(want, sizeof(want), "[%" PRId64 ",1,%u]", CD, g->conv);
        return wrk_shape_err(d, name, conv, want);
    }
    if (q35_find(set, v, l, "linear_attn.conv1d.bias", name) != NULL)
        return wk_diag_set(d, WK_ENOTSUP, "%s: a conv bias is not supported", name);
    if (qkv != NULL) { /* Qwen3.5: row views; Qwen3-Next's were gathered above */
        q35_rows(qkv, 0, KD, &p[Q35_PQ]);
        q35_rows(qkv, KD, KD, &p[Q35_PK]);
        q35_rows(qkv, 2 * KD, VD, &p[Q35_PV]);
    }
    q35_rows(conv, 0, KD, &p[Q35_CQ]);
    q35_rows(conv, KD, KD, &p[Q35_CK]);
    q35_rows(conv, 2 * KD, VD, &p[Q35_CV]);
    ly->q_proj = (wrk_mat){&p[Q35_PQ], (uint32_t)C, (uint32_t)KD, false};
    ly->k_proj = (wrk_mat){&p[Q35_PK], (uint32_t)C, (uint32_t)KD, false};
    ly->v_proj = (wrk_mat){&p[Q35_PV], (uint32_t)C, (uint32_t)VD, false};
    ly->q_conv = &p[Q35_CQ];
    ly->k_conv = &p[Q35_CK];
    ly->v_conv = &p[Q35_CV];
    ly->g_proj = (wrk_mat){z != NULL ? z : &p[Q35_PZ], (uint32_t)C, (uint32_t)VD, false};
    ly->b_proj = (wrk_mat){b != NULL ? b : &p[Q35_PB], (uint32_t)C, (uint32_t)HV, false};
    ly->a_proj = (wrk_mat){a != NULL ? a : &p[Q35_PA], (uint32_t)C, (uint32_t)HV, false};
    ly->o_proj = (wrk_mat){out, (uint32_t)VD, (uint32_t)C, false};
    return WK_OK;
}

/* One gated attention layer. */
static wk_err
q35_map_attn(const wk_tensor_set *set, q35_view *v, uint32_t l, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    wrk_gdn_layer *ly = &v->layers[l];
    const int64_t C = g->n_embd, Da = g->attn_head_dim;
    const int64_t QD = (int64_t)g->attn_heads * Da, KVD = (int64_t)g->attn_kv_heads * Da;
    const wk_tensor *q, *k, *vv, *o;
    wk_err e;
    if ((e = q35_need(set, v, l, "input_layernorm.weight", C, 0, &ly->attn_norm, d)) != WK_OK ||
        (e = q35_need(set, v, l, "self_attn.q_proj.weight", 2 * QD, C, &q, d)) != WK_OK ||
        (e = q35_need(set, v, l, "self_attn.k_proj.weight", KVD, C, &k, d)) != WK_OK ||
        (e = q35_need(set, v, l, "self_attn.v_proj.weight", KVD, C, &vv, d)) != WK_OK ||
        (e = q35_need(set, v, l, "self_attn.o_proj.weight", C, QD, &o, d)) != WK_OK ||
        (e = q35_need(set, v, l, "self_attn.q_norm.weight", Da, 0, &ly->q_norm, d)) != WK_OK ||
        (e = q35_need(set, v, l, "self_attn.k_norm.weight", Da, 0, &ly->k_norm, d)) != WK_OK ||
        (e = q35_map_mlp(set, v, l, d)) != WK_OK)
        return e;
    ly->q_proj = (wrk_mat){q, (uint32_t)C, (uint32_t)(2 * QD), false};
    ly->k_proj = (wrk_mat){k, (uint32_t)C, (uint32_t)KVD, false};
    ly->v_proj = (wrk_mat){vv, (uint32_t)C, (uint32_t)KVD, false};
    ly->o_proj = (wrk_mat){o, (uint32_t)QD, (uint32_t)C, false};
    return WK_OK;
}

/* The final norm and the head (tie_word_embeddings of the text config or the top level). */
static wk_err
q35_map_head(const wk_tensor_set *set, const json_t *config, const json_t *tc, q35_view *v,
             wk_diag *d)
{
    wrk_gdn *g = &v->g;
    wk_err e;
    if ((e = q35_need(set, v, -1, "norm.weight", g->n_embd, 0, &g->norm, d)) != WK_OK)
        return e;
    const wk_tensor *head = wk_tensor_set_find(set, "lm_head.weight");
    bool tied;
    if ((e = wrk_config_bool(config, "tie_word_embeddings", head == NULL, &tied, d)) != WK_OK ||
        (tc != config && (e = wrk_config_bool(tc, "tie_word_embeddings", tied, &tied, d)) != WK_OK))
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
q35_use(wrk_model *m, const q35_view *v, long layer, const char *suf, const wk_tensor **field,
        bool vec, wk_diag *d)
{
    char name[Q35_NAME];
    if (layer < 0)
        snprintf(name, sizeof(name), "%s%s", v->prefix, suf);
    else
        snprintf(name, sizeof(name), "%slayers.%ld.%s", v->prefix, layer, suf);
    return wrk_model_use(m, field, name, false, vec, d);
}

static wk_err
q35_use_part(wrk_model *m, const q35_view *v, uint32_t l, const char *suf, const wk_tensor **field,
             const wk_tensor *parent, wk_diag *d)
{
    char name[Q35_NAME];
    snprintf(name, sizeof(name), "%slayers.%u.%s", v->prefix, l, suf);
    return wrk_model_use_part(m, field, name, false, parent, d);
}

/* A Gated DeltaNet layer's input projections: Qwen3.5's as stored or parts, Qwen3-Next's parts. */
static wk_err
q35_declare_in(wrk_model *m, const wk_tensor_set *set, q35_view *v, uint32_t l, wk_diag *d)
{
    wrk_gdn_layer *ly = &v->layers[l];
    char name[Q35_NAME];
    wk_err e;
    if (v->grouped_in) {
        const wk_tensor *qkvz = q35_find(set, v, l, "linear_attn.in_proj_qkvz.weight", name);
        const wk_tensor *ba = q35_find(set, v, l, "linear_attn.in_proj_ba.weight", name);
        static const char *const sq[4] = {"q", "k", "v", "z"};
        const wk_tensor **fq[4] = {&ly->q_proj.t, &ly->k_proj.t, &ly->v_proj.t, &ly->g_proj.t};
        for (int i = 0; i < 4; i++) {
            char suf[64];
            snprintf(suf, sizeof(suf), "linear_attn.in_proj_qkvz.weight[%s]", sq[i]);
            if ((e = q35_use_part(m, v, l, suf, fq[i], qkvz, d)) != WK_OK)
                return e;
        }
        if ((e = q35_use_part(m, v, l, "linear_attn.in_proj_ba.weight[b]", &ly->b_proj.t, ba,
                              d)) != WK_OK)
            return e;
        return q35_use_part(m, v, l, "linear_attn.in_proj_ba.weight[a]", &ly->a_proj.t, ba, d);
    }
    const wk_tensor *qkv = q35_find(set, v, l, "linear_attn.in_proj_qkv.weight", name);
    if ((e = q35_use_part(m, v, l, "linear_attn.in_proj_qkv.weight[q]", &ly->q_proj.t, qkv, d)) !=
            WK_OK ||
        (e = q35_use_part(m, v, l, "linear_attn.in_proj_qkv.weight[k]", &ly->k_proj.t, qkv, d)) !=
            WK_OK ||
        (e = q35_use_part(m, v, l, "linear_attn.in_proj_qkv.weight[v]", &ly->v_proj.t, qkv, d)) !=
            WK_OK ||
        (e = q35_use(m, v, l, "linear_attn.in_proj_z.weight", &ly->g_proj.t, false, d)) != WK_OK ||
        (e = q35_use(m, v, l, "linear_attn.in_proj_b.weight", &ly->b_proj.t, false, d)) != WK_OK)
        return e;
    return q35_use(m, v, l, "linear_attn.in_proj_a.weight", &ly->a_proj.t, false, d);
}

/* A MoE layer's router, experts (as stored, or parts of the fused tensors) and shared expert. */
static wk_err
q35_declare_moe(wrk_model *m, const wk_tensor_set *set, q35_view *v, uint32_t l, wk_diag *d)
{
    wrk_moe *mo = v->layers[l].moe;
    char name[Q35_NAME], suf[96];
    wk_err e;
    if ((e = q35_use(m, v, l, "mlp.gate.weight", &mo->router.t, false, d)) != WK_OK)
        return e;
    const wk_tensor *gu = q35_find(set, v, l, "mlp.experts.gate_up_proj", name);
    const wk_tensor *dn = q35_find(set, v, l, "mlp.experts.down_proj", name);
    for (uint32_t x = 0; x < mo->n_experts; x++) {
        static const char *const nm[3] = {"gate_proj", "up_proj", "down_proj"};
        wrk_mat *mats[3] = {&mo->gate[x], &mo->up[x], &mo->down[x]};
        for (int i = 0; i < 3; i++) {
            if (gu != NULL) {
                snprintf(suf, sizeof(suf), "mlp.experts.%s[%u]%s", i < 2 ? "gate_up_proj" : "down_proj",
                         x, i == 0 ? "[gate]" : i == 1 ? "[up]" : "");
                e = q35_use_part(m, v, l, suf, &mats[i]->t, i < 2 ? gu : dn, d);
            } else {
                snprintf(suf, sizeof(suf), "mlp.experts.%u.%s.weight", x, nm[i]);
                e = q35_use(m, v, l, suf, &mats[i]->t, false, d);
            }
            if (e != WK_OK)
                return e;
        }
    }
    if (mo->shared_ffn == 0)
        return WK_OK;
    if ((e = q35_use(m, v, l, "mlp.shared_expert.gate_proj.weight", &mo->sh_gate.t, false, d)) !=
            WK_OK ||
        (e = q35_use(m, v, l, "mlp.shared_expert.up_proj.weight", &mo->sh_up.t, false, d)) !=
            WK_OK ||
        (e = q35_use(m, v, l, "mlp.shared_expert.down_proj.weight", &mo->sh_down.t, false, d)) !=
            WK_OK)
        return e;
    return q35_use(m, v, l, "mlp.shared_expert_gate.weight", &mo->sh_router.t, false, d);
}

/* Declares every tensor served (checkpoint names; parts as "<name>[q|k|v]"), and the skipped ones. */
static wk_err
q35_declare(wrk_model *m, const wk_tensor_set *set, q35_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    wk_err e;
    if ((e = q35_use(m, v, -1, "embed_tokens.weight", &g->emb, false, d)) != WK_OK)
        return e;
    for (uint32_t l = 0; l < g->n_layer; l++) {
        wrk_gdn_layer *ly = &v->layers[l];
        if ((e = q35_use(m, v, l, "input_layernorm.weight", &ly->attn_norm, true, d)) != WK_OK)
            return e;
        if (ly->mixer == WRK_MIXER_ATTN) {
            if ((e = q35_use(m, v, l, "self_attn.q_proj.weight", &ly->q_proj.t, false, d)) !=
                    WK_OK ||
                (e = q35_use(m, v, l, "self_attn.k_proj.weight", &ly->k_proj.t, false, d)) !=
                    WK_OK ||
                (e = q35_use(m, v, l, "self_attn.v_proj.weight", &ly->v_proj.t, false, d)) !=
                    WK_OK ||
                (e = q35_use(m, v, l, "self_attn.o_proj.weight", &ly->o_proj.t, false, d)) !=
                    WK_OK ||
                (e = q35_use(m, v, l, "self_attn.q_norm.weight", &ly->q_norm, true, d)) != WK_OK ||
                (e = q35_use(m, v, l, "self_attn.k_norm.weight", &ly->k_norm, true, d)) != WK_OK)
                return e;
        } else {
            char name[Q35_NAME];
            const wk_tensor *conv = q35_find(set, v, l, "linear_attn.conv1d.weight", name);
            if ((e = q35_declare_in(m, set, v, l, d)) != WK_OK ||
                (e = q35_use_part(m, v, l, "linear_attn.conv1d.weight[q]", &ly->q_conv, conv, d)) !=
                    WK_OK ||
                (e = q35_use_part(m, v, l, "linear_attn.conv1d.weight[k]", &ly->k_conv, conv, d)) !=
                    WK_OK ||
                (e = q35_use_part(m, v, l, "linear_attn.conv1d.weight[v]", &ly->v_conv, conv, d)) !=
                    WK_OK ||
                (e = q35_use(m, v, l, "linear_attn.dt_bias", &ly->dt_bias, true, d)) != WK_OK ||
                (e = q35_use(m, v, l, "linear_attn.A_log", &ly->A_log, true, d)) != WK_OK ||
                (e = q35_use(m, v, l, "linear_attn.norm.weight", &ly->o_norm, true, d)) != WK_OK ||
                (e = q35_use(m, v, l, "linear_attn.out_proj.weight", &ly->o_proj.t, false, d)) !=
                    WK_OK)
                return e;
        }
        if ((e = q35_use(m, v, l, "post_attention_layernorm.weight", &ly->mlp_norm, true, d)) !=
            WK_OK)
            return e;
        if (ly->moe != NULL)
            e = q35_declare_moe(m, set, v, l, d);
        else if ((e = q35_use(m, v, l, "mlp.gate_proj.weight", &ly->gate_proj.t, false, d)) ==
                     WK_OK &&
                 (e = q35_use(m, v, l, "mlp.up_proj.weight", &ly->up_proj.t, false, d)) == WK_OK)
            e = q35_use(m, v, l, "mlp.down_proj.weight", &ly->down_proj.t, false, d);
        if (e != WK_OK)
            return e;
    }
    if ((e = q35_use(m, v, -1, "norm.weight", &g->norm, true, d)) != WK_OK)
        return e;
    if (!g->tied) {
        if ((e = wrk_model_use(m, &g->head.t, "lm_head.weight", false, false, d)) != WK_OK)
            return e;
    } else {
        /* tied: the embedding again, counted once; a stored lm_head is transformers' tie too */
        if ((e = wrk_model_use(m, &g->head.t, "lm_head.weight", false, false, d)) != WK_OK)
            return e;
        const wk_tensor *stored = wk_tensor_set_find(set, "lm_head.weight");
        if (stored != NULL && (e = wrk_model_skip(m, stored, d)) != WK_OK)
            return e;
    }
    /* what this family does not serve: the vision tower and the MTP layers */
    const size_t n = wk_tensor_set_count(set);
    for (size_t i = 0; i < n; i++) {
        const wk_tensor *t = wk_tensor_set_at(set, i);
        if ((strncmp(t->name, "model.visual.", 13) == 0 || strncmp(t->name, "mtp.", 4) == 0) &&
            (e = wrk_model_skip(m, t, d)) != WK_OK)
            return e;
    }
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* family ops                                                                */
/* ------------------------------------------------------------------------ */

static bool
q35_detect(const wk_tensor_set *set)
{
    return (wk_tensor_set_find(set, "model.language_model.embed_tokens.weight") != NULL &&
            wk_tensor_set_find(set, "model.language_model.layers.0.linear_attn.A_log") != NULL) ||
           (wk_tensor_set_find(set, "model.embed_tokens.weight") != NULL &&
            wk_tensor_set_find(set, "model.layers.0.linear_attn.in_proj_qkv.weight") != NULL);
}

static void
q35_free_view(void *view)
{
    q35_view *v = view;
    if (v == NULL)
        return;
    for (uint32_t l = 0; v->gathered != NULL && l < v->g.n_layer; l++)
        free(v->gathered[l]);
    free(v->gathered);
    free(v->layers);
    free(v->parts);
    free(v->moes);
    free(v->emats);
    free(v->eparts);
    free(v);
}

static wk_err
q35_map(wrk_model *m, const wk_tensor_set *set, const json_t *config, void **out,
        wrk_model_info *info, wk_diag *d)
{
    wk_err e;
    if (config == NULL)
        return wk_diag_set(d, WK_EINVAL, "config.json: missing (a Qwen3.5 model needs it)");
    const json_t *tc = q35_text_config(config);
    q35_view *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wrk_gdn *g = &v->g;
    const json_t *mt = json_object_get(config, "model_type");
    const char *type = json_is_string(mt) ? json_string_value(mt) : "";
    v->kind = strncmp(type, "qwen3_5_moe", 11) == 0 ? Q35_MOE
              : strcmp(type, "qwen3_next") == 0     ? Q35_NEXT
                                                    : Q35_DENSE;
    if ((e = q35_read_switches(tc, v, d)) != WK_OK || (e = q35_map_embd(set, tc, v, d)) != WK_OK ||
        (e = q35_read_dims(tc, v, d)) != WK_OK || (e = q35_read_moe(tc, v, d)) != WK_OK)
        goto fail;
    v->layers = calloc(g->n_layer, sizeof(*v->layers));
    v->parts = calloc((size_t)g->n_layer * Q35_N_PARTS, sizeof(*v->parts));
    v->gathered = calloc(g->n_layer, sizeof(*v->gathered));
    if (v->layers == NULL || v->parts == NULL || v->gathered == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto fail;
    }
    g->layers = v->layers;
    if ((e = q35_read_kinds(tc, v, d)) != WK_OK)
        goto fail;
    if (v->n_experts > 0) {
        const size_t n3 = (size_t)g->n_layer * 3 * v->n_experts;
        v->moes = calloc(g->n_layer, sizeof(*v->moes));
        v->emats = calloc(n3, sizeof(*v->emats));
        v->eparts = calloc(n3, sizeof(*v->eparts));
        if (v->moes == NULL || v->emats == NULL || v->eparts == NULL) {
            e = wk_diag_set(d, WK_ENOMEM, "out of memory");
            goto fail;
        }
        bool dense = false;
        for (uint32_t l = 0; l < g->n_layer; l++) {
            if (q35_is_moe(tc, v, l)) {
                v->layers[l].moe = &v->moes[l]; /* filled by q35_map_moe */
                v->layers[l].mlp = WRK_MLP_MOE;
            } else
                dense = true;
        }
        if (!dense)
            g->ffn_dim = v->moe_ffn; /* no dense MLP: the width reported is an expert's */
    }
    for (uint32_t l = 0; l < g->n_layer; l++) {
        e = v->layers[l].mixer == WRK_MIXER_ATTN ? q35_map_attn(set, v, l, d)
                                                 : q35_map_linear(set, v, l, d);
        if (e != WK_OK)
            goto fail;
    }
    if ((e = q35_map_head(set, config, tc, v, d)) != WK_OK || (e = q35_declare(m, set, v, d)) != WK_OK)
        goto fail;

    wrk_gdn_fill_info(g, g->n_head, g->head_k, info);
    *out = v;
    return WK_OK;

fail:
    q35_free_view(v);
    return e;
}

static size_t
q35_layout(const void *view, wrk_state_tensor *out, size_t cap)
{
    return wrk_gdn_state_layout(&((const q35_view *)view)->g, out, cap);
}

static void
q35_fingerprint_extra(const void *view, char *buf, size_t len)
{
    const q35_view *v = view;
    const wrk_gdn *g = &v->g;
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the layer kinds */
    for (uint32_t l = 0; l < g->n_layer; l++) {
        h ^= g->layers[l].mixer == WRK_MIXER_ATTN ? 1u : 0u;
        h *= 1099511628211ull;
    }
    snprintf(buf, len,
             "qwen3_5.kinds_fnv=%016llx\nqwen3_5.n_v_head=%u\nqwen3_5.head_v=%u\n"
             "qwen3_5.conv=%u\nqwen3_5.tied=%d\nqwen3_5.norm_eps=%.17g\nqwen3_5.attn.heads=%u\n"
             "qwen3_5.attn.kv_heads=%u\nqwen3_5.attn.head_dim=%u\nqwen3_5.attn.rope_dim=%u\n"
             "qwen3_5.attn.rope_theta=%.17g",
             (unsigned long long)h, g->n_v_head, g->head_v, g->conv, g->tied, g->norm_eps,
             g->attn_heads, g->attn_kv_heads, g->attn_head_dim, g->rope_dim, g->rope_theta);
    size_t n = strlen(buf);
    if (v->n_experts > 0 && n < len) /* the experts; the MoE layer set is in the shapes' digest */
        snprintf(buf + n, len - n,
                 "\nqwen3_5.moe.experts=%u\nqwen3_5.moe.top_k=%u\nqwen3_5.moe.norm_topk=%d\n"
                 "qwen3_5.moe.shared=%u",
                 v->n_experts, v->top_k, v->norm_topk, v->shared_ffn);
}

static size_t
q35_quant_mats(void *view, wrk_mat **out, size_t cap)
{
    q35_view *v = view;
    return wrk_gdn_quant_mats(&v->g, v->layers, out, cap);
}

const wrk_family wrk_family_qwen3_5 = {
    .name = "qwen3_5",
    .view = "gdn",
    .model_types = types,
    .detect = q35_detect,
    .map = q35_map,
    .free_view = q35_free_view,
    .state_layout = q35_layout,
    .fingerprint_extra = q35_fingerprint_extra,
    .quant_mats = q35_quant_mats,
};
