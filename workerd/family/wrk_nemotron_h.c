/*
 * wrk_nemotron_h: NVIDIA Nemotron-H / Nemotron Nano (transformers
 * `nemotron_h`, NemotronHForCausalLM) for wrk_model, mapped onto the hybrid
 * layer-list view (wrk_gdn.h) that the backends run.
 *
 * A Nemotron-H model is a list of blocks over one residual stream, each one
 * RMSNorm (backbone.layers.<l>.norm.weight) and one mixer
 * (backbone.layers.<l>.mixer.*), x += mixer(norm(x)). The kinds come from
 * config.json "layers_block_type" ("linear_attention" or the older
 * "mamba", "full_attention" or "attention", "mlp", "moe"), else the older
 * "hybrid_override_pattern" string (M = Mamba2, * = attention, - = MLP, E =
 * MoE); the number of layers is the list's length. On the view:
 *   M  mixer MAMBA2 (in_proj, conv1d, dt_bias, A_log, D, norm, out_proj;
 *      n_groups > 1 with transformers' grouped gated RMSNorm), no MLP
 *   *  mixer ATTN: q/k/v/o_proj, GQA, scale head_dim^-0.5, NO position
 *      encoding (rope_dim 0: transformers' NemotronHAttention applies none),
 *      no MLP
 *   -  no mixer, MLP RELU2: down_proj(relu(up_proj x)^2)
 *   E  no mixer, MLP MOE (Nemotron 3 Nano): sigmoid router mixer.gate.weight
 *      with mixer.gate.e_score_correction_bias, n_group / topk_group grouped
 *      top-k, norm_topk_prob, routed_scaling_factor; experts
 *      mixer.experts.<e>.{up,down}_proj.weight (one tensor per expert, as
 *      the checkpoints and transformers' save_pretrained store them), RELU2;
 *      plus the ungated shared expert mixer.shared_experts.{up,down}_proj.
 * The block's norm is the mixer's pre-norm (attn_norm) or the MLP's
 * (mlp_norm). Then backbone.norm_f and lm_head (the embedding only when no
 * lm_head is stored and tie_word_embeddings is true: transformers ties
 * nothing). Every RMSNorm uses layer_norm_epsilon.
 *
 * dt: transformers 5.24 clamps dt = softplus(dt + dt_bias) from below at
 * time_step_min on its whole-sequence path only (its cached token-by-token
 * path, mamba_ssm's step kernel and llama.cpp do not); wkvm applies no
 * clamp, so a state is the same however its tokens were chunked. See
 * docs/FAMILIES.md (Nemotron-H) for the reference finding.
 *
 * Refused up front, naming the key: mlp_hidden_act other than relu2,
 * mamba_hidden_act other than silu, attention_bias / mlp_bias / use_bias /
 * mamba_proj_bias true, moe_latent_size set, an unknown layer kind, a model
 * with no Mamba2 layer. Multi-token-prediction layers (mtp.*) are skipped.
 *
 * Never logs, never aborts on bad input.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wrk_family.h"
#include "wrk_gdn.h"

#define NH_MAX_LAYERS 4096u
#define NH_MAX_EMBD (1u << 17)
#define NH_MAX_DIM (1u << 20)
#define NH_MAX_HEADS 4096u
#define NH_MAX_EXPERTS 4096u
#define NH_MAX_CONV 64u
#define NH_MAX_ATTN_DIM 1024u
#define NH_NAME 256

static const char *const types[] = {"nemotron_h", NULL};

typedef struct nh_view {
    wrk_gdn g;             /* what the backends read: must be first */
    wrk_gdn_layer *layers; /* n_layer entries, owned */
    char *pattern;         /* per layer M, *, -, E; NUL-terminated, owned */
    wrk_moe *moes;         /* n_layer entries (the E layers' used), owned */
    wrk_mat *emats;        /* n_layer * 3 * E expert matrices, owned */
    uint32_t n_experts, top_k, moe_ffn, shared_ffn, n_group, topk_group;
    bool norm_topk;
    double scale; /* routed_scaling_factor */
} nh_view;

/* ------------------------------------------------------------------------ */
/* config                                                                    */
/* ------------------------------------------------------------------------ */

static wk_err
nh_u32(const json_t *c, const char *key, uint32_t def, uint32_t min, uint32_t max, uint32_t *out,
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

/* alt when present, else key, else def (older and newer spellings of one setting). */
static wk_err
nh_u32_alt(const json_t *c, const char *key, const char *alt, uint32_t def, uint32_t min,
           uint32_t max, uint32_t *out, wk_diag *d)
{
    const json_t *v = json_object_get(c, alt);
    if (v != NULL && !json_is_null(v))
        return nh_u32(c, alt, def, min, max, out, d);
    return nh_u32(c, key, def, min, max, out, d);
}

/* A boolean key that must be false (a bias or feature wkvm does not run). */
static wk_err
nh_need_false(const json_t *c, const char *key, wk_diag *d)
{
    bool b;
    wk_err e = wrk_config_bool(c, key, false, &b, d);
    if (e == WK_OK && b)
        e = wk_diag_set(d, WK_ENOTSUP, "config.json: %s true is not supported", key);
    return e;
}

static wk_err
nh_read_switches(const json_t *c, wk_diag *d)
{
    const char *act;
    wk_err e;
    if ((e = wrk_config_str(c, "mlp_hidden_act", "relu2", &act, d)) != WK_OK)
        return e;
    if (strcmp(act, "relu2") != 0)
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: mlp_hidden_act \"%.32s\" is not supported (relu2 only)",
                           act);
    if ((e = wrk_config_str(c, "mamba_hidden_act", "silu", &act, d)) != WK_OK)
        return e;
    if (strcmp(act, "silu") != 0)
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: mamba_hidden_act \"%.32s\" is not supported (silu only)",
                           act);
    static const char *const off[] = {"attention_bias", "mlp_bias", "use_bias", "mamba_proj_bias"};
    for (size_t i = 0; i < sizeof(off) / sizeof(off[0]); i++)
        if ((e = nh_need_false(c, off[i], d)) != WK_OK)
            return e;
    const json_t *lat = json_object_get(c, "moe_latent_size");
    if (lat != NULL && !json_is_null(lat))
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: moe_latent_size is not supported (null only)");
    return WK_OK;
}

/* One layer kind from a layers_block_type name (legacy names remapped) or a pattern char. */
static char
nh_kind_of_name(const char *s)
{
    if (strcmp(s, "linear_attention") == 0 || strcmp(s, "mamba") == 0)
        return 'M';
    if (strcmp(s, "full_attention") == 0 || strcmp(s, "attention") == 0)
        return '*';
    if (strcmp(s, "mlp") == 0)
        return '-';
    if (strcmp(s, "moe") == 0)
        return 'E';
    return 0;
}

/* The layer kinds into v->pattern and g->n_layer. */
static wk_err
nh_read_kinds(const json_t *c, nh_view *v, wk_diag *d)
{
    const json_t *lt = json_object_get(c, "layers_block_type");
    size_t n;
    if (lt != NULL && !json_is_null(lt)) {
        if (!json_is_array(lt) || json_array_size(lt) == 0 || json_array_size(lt) > NH_MAX_LAYERS)
            return wk_diag_set(d, WK_EINVAL,
                               "config.json: layers_block_type must be a non-empty array of at "
                               "most %u strings",
                               NH_MAX_LAYERS);
        n = json_array_size(lt);
    } else {
        const json_t *hp = json_object_get(c, "hybrid_override_pattern");
        if (hp == NULL || !json_is_string(hp) || json_string_length(hp) == 0 ||
            json_string_length(hp) > NH_MAX_LAYERS)
            return wk_diag_set(d, WK_EINVAL,
                               "config.json: layers_block_type or hybrid_override_pattern "
                               "needed (one entry per layer)");
        lt = NULL;
        n = json_string_length(hp);
    }
    v->pattern = calloc(n + 1, 1);
    if (v->pattern == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    const char *hp =
        lt == NULL ? json_string_value(json_object_get(c, "hybrid_override_pattern")) : NULL;
    bool any_m2 = false;
    for (size_t l = 0; l < n; l++) {
        char k;
        if (lt != NULL) {
            const json_t *s = json_array_get(lt, l);
            const char *name = json_is_string(s) ? json_string_value(s) : "";
            if ((k = nh_kind_of_name(name)) == 0)
                return wk_diag_set(d, WK_ENOTSUP,
                                   "config.json: layers_block_type[%zu] \"%.32s\" is not "
                                   "supported (linear_attention, full_attention, mlp, moe)",
                                   l, name);
        } else {
            k = hp[l];
            if (k != 'M' && k != '*' && k != '-' && k != 'E')
                return wk_diag_set(d, WK_ENOTSUP,
                                   "config.json: hybrid_override_pattern[%zu] '%c' is not "
                                   "supported (M, *, -, E)",
                                   l, k >= 32 && k < 127 ? k : '?');
        }
        v->pattern[l] = k;
        any_m2 = any_m2 || k == 'M';
    }
    if (!any_m2)
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: no Mamba2 layer (a plain transformer is not a "
                           "recurrent-state model)");
    v->g.n_layer = (uint32_t)n;
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* tensors                                                                   */
/* ------------------------------------------------------------------------ */

static const wk_tensor *
nh_find(const wk_tensor_set *set, long layer, const char *suf, char *name)
{
    if (layer < 0)
        snprintf(name, NH_NAME, "%s", suf);
    else
        snprintf(name, NH_NAME, "backbone.layers.%ld.%s", layer, suf);
    return wk_tensor_set_find(set, name);
}

/* A present tensor of shape [d0, d1] (d1 0: a vector [d0] with any leading 1s). */
static wk_err
nh_need(const wk_tensor_set *set, long layer, const char *suf, int64_t d0, int64_t d1,
        const wk_tensor **out, wk_diag *d)
{
    char name[NH_NAME], want[64];
    const wk_tensor *t = nh_find(set, layer, suf, name);
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

/* The Mamba2 dimensions (config) and one Mamba2 layer's tensors. */
static wk_err
nh_read_m2(const json_t *c, wrk_gdn *g, bool *conv_bias, wk_diag *d)
{
    wk_err e;
    if ((e = nh_u32(c, "mamba_num_heads", 128, 1, NH_MAX_HEADS, &g->m2_heads, d)) != WK_OK ||
        (e = nh_u32(c, "mamba_head_dim", 64, 1, NH_MAX_ATTN_DIM, &g->m2_head_dim, d)) != WK_OK ||
        (e = nh_u32_alt(c, "n_groups", "mamba_n_groups", 8, 1, NH_MAX_HEADS, &g->m2_groups, d)) !=
            WK_OK ||
        (e = nh_u32(c, "ssm_state_size", 128, 1, NH_MAX_ATTN_DIM, &g->m2_state, d)) != WK_OK ||
        (e = nh_u32_alt(c, "conv_kernel", "mamba_d_conv", 4, 2, NH_MAX_CONV, &g->m2_conv, d)) !=
            WK_OK)
        return e;
    if (g->m2_heads % g->m2_groups != 0)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: mamba_num_heads %u is not a multiple of n_groups %u",
                           g->m2_heads, g->m2_groups);
    if ((uint64_t)g->m2_heads * g->m2_head_dim > NH_MAX_DIM ||
        (uint64_t)g->m2_groups * g->m2_state > NH_MAX_DIM)
        return wk_diag_set(d, WK_EINVAL, "config.json: Mamba2 widths over %u", NH_MAX_DIM);
    const json_t *cb = json_object_get(c, "mamba_conv_bias");
    return wrk_config_bool(c, cb != NULL && !json_is_null(cb) ? "mamba_conv_bias" : "use_conv_bias",
                           true, conv_bias, d);
}

static wk_err
nh_map_m2(const wk_tensor_set *set, nh_view *v, uint32_t l, bool conv_bias, wk_diag *d)
{
    const wrk_gdn *g = &v->g;
    wrk_mamba2_layer *m = &v->layers[l].m2;
    const int64_t C = g->n_embd, H = g->m2_heads, DI = (int64_t)H * g->m2_head_dim;
    const int64_t CD = DI + 2 * (int64_t)g->m2_groups * g->m2_state, K = g->m2_conv;
    char name[NH_NAME], want[64];
    const wk_tensor *in, *out;
    wk_err e;
    if ((e = nh_need(set, l, "mixer.in_proj.weight", DI + CD + H, C, &in, d)) != WK_OK ||
        (e = nh_need(set, l, "mixer.out_proj.weight", C, DI, &out, d)) != WK_OK ||
        (e = nh_need(set, l, "mixer.dt_bias", H, 0, &m->dt_bias, d)) != WK_OK ||
        (e = nh_need(set, l, "mixer.A_log", H, 0, &m->A_log, d)) != WK_OK ||
        (e = nh_need(set, l, "mixer.D", H, 0, &m->D, d)) != WK_OK ||
        (e = nh_need(set, l, "mixer.norm.weight", DI, 0, &m->gnorm, d)) != WK_OK)
        return e;
    const wk_tensor *cw = nh_find(set, l, "mixer.conv1d.weight", name);
    if (cw == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    if (cw->ndim != 3 || cw->shape[0] != CD || cw->shape[1] != 1 || cw->shape[2] != K) {
        snprintf(want, sizeof(want), "[%" PRId64 ",1,%" PRId64 "]", CD, K);
        return wrk_shape_err(d, name, cw, want);
    }
    m->conv_w = cw;
    const wk_tensor *cb = nh_find(set, l, "mixer.conv1d.bias", name);
    if (conv_bias && (e = nh_need(set, l, "mixer.conv1d.bias", CD, 0, &m->conv_b, d)) != WK_OK)
        return e;
    if (!conv_bias && cb != NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: present but config.json use_conv_bias is false",
                           name);
    m->in_proj = (wrk_mat){in, (uint32_t)C, (uint32_t)(DI + CD + H), false};
    m->out_proj = (wrk_mat){out, (uint32_t)DI, (uint32_t)C, false};
    return WK_OK;
}

static wk_err
nh_map_attn(const wk_tensor_set *set, nh_view *v, uint32_t l, wk_diag *d)
{
    const wrk_gdn *g = &v->g;
    wrk_gdn_layer *ly = &v->layers[l];
    const int64_t C = g->n_embd, QD = (int64_t)g->attn_heads * g->attn_head_dim;
    const int64_t KVD = (int64_t)g->attn_kv_heads * g->attn_head_dim;
    const wk_tensor *q, *k, *vv, *o;
    wk_err e;
    if ((e = nh_need(set, l, "mixer.q_proj.weight", QD, C, &q, d)) != WK_OK ||
        (e = nh_need(set, l, "mixer.k_proj.weight", KVD, C, &k, d)) != WK_OK ||
        (e = nh_need(set, l, "mixer.v_proj.weight", KVD, C, &vv, d)) != WK_OK ||
        (e = nh_need(set, l, "mixer.o_proj.weight", C, QD, &o, d)) != WK_OK)
        return e;
    ly->q_proj = (wrk_mat){q, (uint32_t)C, (uint32_t)QD, false};
    ly->k_proj = (wrk_mat){k, (uint32_t)C, (uint32_t)KVD, false};
    ly->v_proj = (wrk_mat){vv, (uint32_t)C, (uint32_t)KVD, false};
    ly->o_proj = (wrk_mat){o, (uint32_t)QD, (uint32_t)C, false};
    return WK_OK;
}

static wk_err
nh_map_mlp(const wk_tensor_set *set, nh_view *v, uint32_t l, wk_diag *d)
{
    const wrk_gdn *g = &v->g;
    wrk_gdn_layer *ly = &v->layers[l];
    const int64_t C = g->n_embd, F = g->ffn_dim;
    const wk_tensor *up, *down;
    wk_err e;
    if ((e = nh_need(set, l, "mixer.up_proj.weight", F, C, &up, d)) != WK_OK ||
        (e = nh_need(set, l, "mixer.down_proj.weight", C, F, &down, d)) != WK_OK)
        return e;
    ly->up_proj = (wrk_mat){up, (uint32_t)C, (uint32_t)F, false};
    ly->down_proj = (wrk_mat){down, (uint32_t)F, (uint32_t)C, false};
    return WK_OK;
}

static wk_err
nh_read_moe(const json_t *c, nh_view *v, wk_diag *d)
{
    wk_err e;
    if ((e = nh_u32(c, "n_routed_experts", 8, 1, NH_MAX_EXPERTS, &v->n_experts, d)) != WK_OK ||
        (e = nh_u32(c, "num_experts_per_tok", 2, 1, v->n_experts, &v->top_k, d)) != WK_OK ||
        (e = nh_u32(c, "moe_intermediate_size", 7688, 1, NH_MAX_DIM, &v->moe_ffn, d)) != WK_OK ||
        (e = nh_u32(c, "moe_shared_expert_intermediate_size", 7688, 1, NH_MAX_DIM, &v->shared_ffn,
                    d)) != WK_OK ||
        (e = nh_u32(c, "n_group", 1, 1, 64, &v->n_group, d)) != WK_OK ||
        (e = nh_u32(c, "topk_group", 1, 1, v->n_group, &v->topk_group, d)) != WK_OK ||
        (e = wrk_config_bool(c, "norm_topk_prob", true, &v->norm_topk, d)) != WK_OK ||
        (e = wrk_config_f64(c, "routed_scaling_factor", 1.0, &v->scale, d)) != WK_OK)
        return e;
    if (v->n_experts % v->n_group != 0 ||
        (uint64_t)v->topk_group * (v->n_experts / v->n_group) < v->top_k)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: n_routed_experts %u in n_group %u groups, topk_group %u "
                           "cannot give num_experts_per_tok %u",
                           v->n_experts, v->n_group, v->topk_group, v->top_k);
    if (!(v->scale > 0.0) || v->scale > 1e6)
        return wk_diag_set(d, WK_EINVAL, "config.json: routed_scaling_factor %g out of range",
                           v->scale);
    return WK_OK;
}

static wk_err
nh_map_moe(const wk_tensor_set *set, nh_view *v, uint32_t l, wk_diag *d)
{
    const uint32_t E = v->n_experts, Fe = v->moe_ffn, Fs = v->shared_ffn, C = v->g.n_embd;
    wrk_moe *mo = &v->moes[l];
    const wk_tensor *t;
    wk_err e;
    mo->n_experts = E;
    mo->top_k = v->top_k;
    mo->ffn = Fe;
    mo->norm_topk = v->norm_topk;
    mo->act = WRK_MLP_RELU2;
    mo->route = WRK_MOE_SIGMOID;
    mo->n_group = v->n_group;
    mo->topk_group = v->topk_group;
    mo->scale = (float)v->scale;
    mo->shared_ffn = Fs;
    mo->gate = &v->emats[(size_t)l * 3 * E];
    mo->up = mo->gate + E;
    mo->down = mo->up + E;
    if ((e = nh_need(set, l, "mixer.gate.weight", E, C, &t, d)) != WK_OK)
        return e;
    mo->router = (wrk_mat){t, C, E, false};
    if ((e = nh_need(set, l, "mixer.gate.e_score_correction_bias", E, 0, &mo->score_bias, d)) !=
        WK_OK)
        return e;
    for (uint32_t x = 0; x < E; x++) {
        char suf[96];
        const wk_tensor *tu, *td;
        snprintf(suf, sizeof(suf), "mixer.experts.%u.up_proj.weight", x);
        if ((e = nh_need(set, l, suf, Fe, C, &tu, d)) != WK_OK)
            return e;
        snprintf(suf, sizeof(suf), "mixer.experts.%u.down_proj.weight", x);
        if ((e = nh_need(set, l, suf, C, Fe, &td, d)) != WK_OK)
            return e;
        mo->up[x] = (wrk_mat){tu, C, Fe, false};
        mo->down[x] = (wrk_mat){td, Fe, C, false};
    }
    const wk_tensor *su, *sd;
    if ((e = nh_need(set, l, "mixer.shared_experts.up_proj.weight", Fs, C, &su, d)) != WK_OK ||
        (e = nh_need(set, l, "mixer.shared_experts.down_proj.weight", C, Fs, &sd, d)) != WK_OK)
        return e;
    mo->sh_up = (wrk_mat){su, C, Fs, false};
    mo->sh_down = (wrk_mat){sd, Fs, C, false};
    v->layers[l].moe = mo;
    return WK_OK;
}

/* The embedding, C, V, and the attention / MLP dims the config gives. */
static wk_err
nh_map_embd(const wk_tensor_set *set, const json_t *c, nh_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    const wk_tensor *emb = wk_tensor_set_find(set, "backbone.embeddings.weight");
    if (emb == NULL)
        return wk_diag_set(d, WK_EINVAL, "backbone.embeddings.weight: missing");
    if (emb->ndim != 2 || emb->shape[0] < 1 || emb->shape[0] > (1 << 22) || emb->shape[1] < 1 ||
        emb->shape[1] > NH_MAX_EMBD)
        return wrk_shape_err(d, "backbone.embeddings.weight", emb, "[vocab_size, hidden_size]");
    g->emb = emb;
    g->vocab_size = (uint32_t)emb->shape[0];
    g->n_embd = (uint32_t)emb->shape[1];
    uint32_t x;
    double eps;
    wk_err e;
    if ((e = wrk_config_u32(c, "hidden_size", g->n_embd, &x, d)) != WK_OK)
        return e;
    if (x != g->n_embd)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: hidden_size is %u but backbone.embeddings.weight has "
                           "%u columns",
                           x, g->n_embd);
    if ((e = wrk_config_f64(c, "layer_norm_epsilon", 1e-5, &eps, d)) != WK_OK)
        return e;
    if (!(eps > 0.0) || eps > 1.0)
        return wk_diag_set(d, WK_EINVAL, "config.json: layer_norm_epsilon %g not in (0, 1]", eps);
    g->norm_eps = eps;
    g->attn_norm_eps = eps;
    uint32_t heads;
    if ((e = nh_u32(c, "num_attention_heads", 32, 1, NH_MAX_HEADS, &heads, d)) != WK_OK ||
        (e = nh_u32(c, "num_key_value_heads", heads, 1, NH_MAX_HEADS, &g->attn_kv_heads, d)) !=
            WK_OK ||
        (e = nh_u32_alt(c, "attention_head_dim", "head_dim", 128, 2, NH_MAX_ATTN_DIM,
                        &g->attn_head_dim, d)) != WK_OK ||
        (e = nh_u32(c, "intermediate_size", 21504, 1, NH_MAX_DIM, &g->ffn_dim, d)) != WK_OK)
        return e;
    g->attn_heads = heads;
    if (heads % g->attn_kv_heads != 0)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: num_attention_heads %u is not a multiple of "
                           "num_key_value_heads %u",
                           heads, g->attn_kv_heads);
    if ((uint64_t)heads * g->attn_head_dim > NH_MAX_DIM)
        return wk_diag_set(d, WK_EINVAL, "config.json: attention width over %u", NH_MAX_DIM);
    g->rope_dim = 0; /* no position encoding */
    g->rope_theta = 10000.0;
    return WK_OK;
}

/*
 * The final norm and the head. transformers 5.24's NemotronHForCausalLM ties
 * nothing (_tied_weights_keys is empty): a stored lm_head.weight is the head
 * even with tie_word_embeddings true; only without one does a tied config
 * take the embedding.
 */
static wk_err
nh_map_head(const wk_tensor_set *set, const json_t *c, wrk_gdn *g, wk_diag *d)
{
    char name[NH_NAME];
    wk_err e;
    if ((e = nh_need(set, -1, "backbone.norm_f.weight", g->n_embd, 0, &g->norm, d)) != WK_OK)
        return e;
    bool tied;
    if ((e = wrk_config_bool(c, "tie_word_embeddings", false, &tied, d)) != WK_OK)
        return e;
    const wk_tensor *head = NULL;
    if ((!tied || nh_find(set, -1, "lm_head.weight", name) != NULL) &&
        (e = nh_need(set, -1, "lm_head.weight", g->vocab_size, g->n_embd, &head, d)) != WK_OK)
        return e;
    g->tied = head == NULL;
    g->head = (wrk_mat){head == NULL ? g->emb : head, g->n_embd, g->vocab_size, false};
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* declaration                                                               */
/* ------------------------------------------------------------------------ */

static wk_err
nh_use(wrk_model *m, long layer, const char *suf, const wk_tensor **field, bool vec, wk_diag *d)
{
    char name[NH_NAME];
    if (layer < 0)
        snprintf(name, sizeof(name), "%s", suf);
    else
        snprintf(name, sizeof(name), "backbone.layers.%ld.%s", layer, suf);
    return wrk_model_use(m, field, name, false, vec, d);
}

static wk_err
nh_declare_layer(wrk_model *m, nh_view *v, uint32_t l, wk_diag *d)
{
    wrk_gdn_layer *ly = &v->layers[l];
    const bool mixer = ly->mixer != WRK_MIXER_NONE;
    wk_err e = nh_use(m, l, "norm.weight", mixer ? &ly->attn_norm : &ly->mlp_norm, true, d);
    if (e != WK_OK)
        return e;
    if (ly->mixer == WRK_MIXER_MAMBA2) {
        wrk_mamba2_layer *m2 = &ly->m2;
        if ((e = nh_use(m, l, "mixer.in_proj.weight", &m2->in_proj.t, false, d)) != WK_OK ||
            (e = nh_use(m, l, "mixer.conv1d.weight", &m2->conv_w, false, d)) != WK_OK ||
            (m2->conv_b != NULL &&
             (e = nh_use(m, l, "mixer.conv1d.bias", &m2->conv_b, true, d)) != WK_OK) ||
            (e = nh_use(m, l, "mixer.dt_bias", &m2->dt_bias, true, d)) != WK_OK ||
            (e = nh_use(m, l, "mixer.A_log", &m2->A_log, true, d)) != WK_OK ||
            (e = nh_use(m, l, "mixer.D", &m2->D, true, d)) != WK_OK ||
            (e = nh_use(m, l, "mixer.norm.weight", &m2->gnorm, true, d)) != WK_OK)
            return e;
        return nh_use(m, l, "mixer.out_proj.weight", &m2->out_proj.t, false, d);
    }
    if (ly->mixer == WRK_MIXER_ATTN) {
        if ((e = nh_use(m, l, "mixer.q_proj.weight", &ly->q_proj.t, false, d)) != WK_OK ||
            (e = nh_use(m, l, "mixer.k_proj.weight", &ly->k_proj.t, false, d)) != WK_OK ||
            (e = nh_use(m, l, "mixer.v_proj.weight", &ly->v_proj.t, false, d)) != WK_OK)
            return e;
        return nh_use(m, l, "mixer.o_proj.weight", &ly->o_proj.t, false, d);
    }
    if (ly->mlp == WRK_MLP_RELU2) {
        if ((e = nh_use(m, l, "mixer.up_proj.weight", &ly->up_proj.t, false, d)) != WK_OK)
            return e;
        return nh_use(m, l, "mixer.down_proj.weight", &ly->down_proj.t, false, d);
    }
    wrk_moe *mo = ly->moe;
    if ((e = nh_use(m, l, "mixer.gate.weight", &mo->router.t, false, d)) != WK_OK ||
        (e = nh_use(m, l, "mixer.gate.e_score_correction_bias", &mo->score_bias, true, d)) != WK_OK)
        return e;
    for (uint32_t x = 0; x < mo->n_experts; x++) {
        char suf[96];
        snprintf(suf, sizeof(suf), "mixer.experts.%u.up_proj.weight", x);
        if ((e = nh_use(m, l, suf, &mo->up[x].t, false, d)) != WK_OK)
            return e;
        snprintf(suf, sizeof(suf), "mixer.experts.%u.down_proj.weight", x);
        if ((e = nh_use(m, l, suf, &mo->down[x].t, false, d)) != WK_OK)
            return e;
    }
    if ((e = nh_use(m, l, "mixer.shared_experts.up_proj.weight", &mo->sh_up.t, false, d)) != WK_OK)
        return e;
    return nh_use(m, l, "mixer.shared_experts.down_proj.weight", &mo->sh_down.t, false, d);
}

static wk_err
nh_declare(wrk_model *m, const wk_tensor_set *set, nh_view *v, wk_diag *d)
{
    wrk_gdn *g = &v->g;
    wk_err e;
    if ((e = nh_use(m, -1, "backbone.embeddings.weight", &g->emb, false, d)) != WK_OK)
        return e;
    for (uint32_t l = 0; l < g->n_layer; l++)
        if ((e = nh_declare_layer(m, v, l, d)) != WK_OK)
            return e;
    if ((e = nh_use(m, -1, "backbone.norm_f.weight", &g->norm, true, d)) != WK_OK)
        return e;
    /* tied (no lm_head stored): the embedding again, counted once */
    if ((e = wrk_model_use(m, &g->head.t, "lm_head.weight", false, false, d)) != WK_OK)
        return e;
    const size_t n = wk_tensor_set_count(set);
    for (size_t i = 0; i < n; i++) {
        const wk_tensor *t = wk_tensor_set_at(set, i);
        if (strncmp(t->name, "mtp.", 4) == 0 && (e = wrk_model_skip(m, t, d)) != WK_OK)
            return e;
    }
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* family ops                                                                */
/* ------------------------------------------------------------------------ */

/* Without config.json: a backbone.* checkpoint with a layer only Nemotron-H has. */
static bool
nh_detect(const wk_tensor_set *set)
{
    if (wk_tensor_set_find(set, "backbone.embeddings.weight") == NULL)
        return false;
    const size_t n = wk_tensor_set_count(set);
    for (size_t i = 0; i < n; i++) {
        const char *s = wk_tensor_set_at(set, i)->name;
        if (strncmp(s, "backbone.layers.", 16) == 0 &&
            (strstr(s, ".mixer.q_proj.") != NULL || strstr(s, ".mixer.up_proj.") != NULL ||
             strstr(s, ".mixer.experts.") != NULL))
            return true;
    }
    return false;
}

static void
nh_free_view(void *view)
{
    nh_view *v = view;
    if (v == NULL)
        return;
    free(v->layers);
    free(v->pattern);
    free(v->moes);
    free(v->emats);
    free(v);
}

static wk_err
nh_map(wrk_model *m, const wk_tensor_set *set, const json_t *config, void **out,
       wrk_model_info *info, wk_diag *d)
{
    if (config == NULL)
        return wk_diag_set(d, WK_EINVAL, "config.json: missing (a Nemotron-H model needs it)");
    nh_view *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wrk_gdn *g = &v->g;
    bool conv_bias = true, any_moe = false;
    wk_err e;
    if ((e = nh_read_switches(config, d)) != WK_OK || (e = nh_read_kinds(config, v, d)) != WK_OK ||
        (e = nh_map_embd(set, config, v, d)) != WK_OK ||
        (e = nh_read_m2(config, g, &conv_bias, d)) != WK_OK)
        goto fail;
    for (uint32_t l = 0; l < g->n_layer; l++)
        any_moe = any_moe || v->pattern[l] == 'E';
    v->layers = calloc(g->n_layer, sizeof(*v->layers));
    if (v->layers == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto fail;
    }
    g->layers = v->layers;
    if (any_moe) {
        if ((e = nh_read_moe(config, v, d)) != WK_OK)
            goto fail;
        v->moes = calloc(g->n_layer, sizeof(*v->moes));
        v->emats = calloc((size_t)g->n_layer * 3 * v->n_experts, sizeof(*v->emats));
        if (v->moes == NULL || v->emats == NULL) {
            e = wk_diag_set(d, WK_ENOMEM, "out of memory");
            goto fail;
        }
    }
    for (uint32_t l = 0; l < g->n_layer; l++) {
        wrk_gdn_layer *ly = &v->layers[l];
        switch (v->pattern[l]) {
        case 'M':
            ly->mixer = WRK_MIXER_MAMBA2;
            g->n_m2++;
            e = nh_map_m2(set, v, l, conv_bias, d);
            break;
        case '*':
            ly->mixer = WRK_MIXER_ATTN;
            g->n_attn++;
            e = nh_map_attn(set, v, l, d);
            break;
        case '-':
            ly->mlp = WRK_MLP_RELU2;
            e = nh_map_mlp(set, v, l, d);
            break;
        default:
            ly->mlp = WRK_MLP_MOE;
            e = nh_map_moe(set, v, l, d);
            break;
        }
        if (e == WK_OK)
            e = nh_need(set, l, "norm.weight", g->n_embd, 0,
                        ly->mixer != WRK_MIXER_NONE ? &ly->attn_norm : &ly->mlp_norm, d);
        if (e != WK_OK)
            goto fail;
    }
    if ((e = nh_map_head(set, config, g, d)) != WK_OK || (e = nh_declare(m, set, v, d)) != WK_OK)
        goto fail;

    wrk_gdn_fill_info(g, g->m2_heads, g->m2_head_dim, info);
    *out = v;
    return WK_OK;

fail:
    nh_free_view(v);
    return e;
}

static size_t
nh_layout(const void *view, wrk_state_tensor *out, size_t cap)
{
    return wrk_gdn_state_layout(&((const nh_view *)view)->g, out, cap);
}

static void
nh_fingerprint_extra(const void *view, char *buf, size_t len)
{
    const nh_view *v = view;
    const wrk_gdn *g = &v->g;
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the layer pattern */
    for (uint32_t l = 0; l < g->n_layer; l++) {
        h ^= (uint8_t)v->pattern[l];
        h *= 1099511628211ull;
    }
    snprintf(buf, len,
             "nemotron_h.kinds_fnv=%016llx\nnemotron_h.m2.heads=%u\nnemotron_h.m2.groups=%u\n"
             "nemotron_h.m2.state=%u\nnemotron_h.m2.conv=%u\nnemotron_h.tied=%d\n"
             "nemotron_h.norm_eps=%.17g\nnemotron_h.attn.heads=%u\nnemotron_h.attn.kv_heads=%u\n"
             "nemotron_h.attn.head_dim=%u",
             (unsigned long long)h, g->m2_heads, g->m2_groups, g->m2_state, g->m2_conv, g->tied,
             g->norm_eps, g->attn_heads, g->attn_kv_heads, g->attn_head_dim);
    size_t n = strlen(buf);
    if (v->n_experts > 0 && n < len)
        snprintf(buf + n, len - n,
                 "\nnemotron_h.moe.experts=%u\nnemotron_h.moe.top_k=%u\nnemotron_h.moe.groups=%u/"
                 "%u\nnemotron_h.moe.norm_topk=%d\nnemotron_h.moe.scale=%.17g",
                 v->n_experts, v->top_k, v->topk_group, v->n_group, v->norm_topk, v->scale);
}

static size_t
nh_quant_mats(void *view, wrk_mat **out, size_t cap)
{
    nh_view *v = view;
    return wrk_gdn_quant_mats(&v->g, v->layers, out, cap);
}

const wrk_family wrk_family_nemotron_h = {
    .name = "nemotron_h",
    .view = "gdn",
    .model_types = types,
    .detect = nh_detect,
    .map = nh_map,
    .free_view = nh_free_view,
    .state_layout = nh_layout,
    .fingerprint_extra = nh_fingerprint_extra,
    .quant_mats = nh_quant_mats,
};
