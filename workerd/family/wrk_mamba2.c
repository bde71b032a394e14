/*
 * wrk_mamba2: maps a Mamba2 checkpoint onto wrk_mamba2 (wrk_mamba2.h).
 *
 * Accepts the Hugging Face transformers names (backbone.embeddings.weight,
 * lm_head.weight) and the mamba_ssm / state-spaces names
 * (backbone.embedding.weight, head tied), with config.json in either
 * dialect: transformers keys at the top level (n_groups, state_size,
 * head_dim, conv_kernel, ...) or mamba_ssm's (d_model, n_layer, and an
 * ssm_cfg object with ngroups, d_state, headdim, d_conv, ...). Dimensions
 * come from tensor shapes; config.json supplies only n_groups (how conv_dim
 * splits into d_inner + 2 G N) and the epsilon, and every other key it
 * states is checked against the shapes. Variants this engine does not run
 * (norm_before_gate, LayerNorm instead of RMSNorm, projection biases, a dt
 * limit, another activation, an MLP) are refused with a diag naming the key.
 *
 * Must never: trust a dimension before checking it against its limits,
 * write *view on failure, log.
 */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wrk_family.h"
#include "wrk_gdn.h"
#include "wrk_mamba2.h"

/* Limits on dimensions read from a (hostile) checkpoint. */
#define M2_MAX_LAYERS 4096u
#define M2_MAX_DIM (1u << 17) /* d_model, d_inner, conv_dim */
#define M2_MAX_VOCAB (1u << 22)
#define M2_MAX_CONV 64u                 /* conv kernel */
#define M2_MAX_STATE 4096u              /* d_state, head_dim */
#define M2_MAX_STATE_BYTES (1ull << 34) /* one slot */

#define M2_PREFIX "backbone.layers."
#define M2_EMB_HF "backbone.embeddings.weight"
#define M2_EMB_SSM "backbone.embedding.weight"
#define M2_NORM_F "backbone.norm_f.weight"
#define M2_HEAD "lm_head.weight"

static const char *const m2_types[] = {"mamba2", NULL};

static bool
m2_detect(const wk_tensor_set *set)
{
    return (wk_tensor_set_find(set, M2_EMB_HF) != NULL ||
            wk_tensor_set_find(set, M2_EMB_SSM) != NULL) &&
           wk_tensor_set_find(set, M2_PREFIX "0.mixer.A_log") != NULL;
}

/* ------------------------------------------------------------------------ */
/* config.json                                                               */
/* ------------------------------------------------------------------------ */

/* The two places a key may live: the top level and mamba_ssm's ssm_cfg. */
typedef struct m2_cfg {
    const json_t *top; /* config.json or NULL */
    const json_t *ssm; /* its ssm_cfg object or NULL */
} m2_cfg;

/*
 * The object holding the first of hf_key (top level), ssm_key (ssm_cfg,
 * then top level) that is present, and that key's name; NULL when none.
 */
static const json_t *
m2_cfg_find(const m2_cfg *c, const char *hf_key, const char *ssm_key, const char **key)
{
    if (hf_key != NULL && c->top != NULL && json_object_get(c->top, hf_key) != NULL) {
        *key = hf_key;
        return c->top;
    }
    if (ssm_key != NULL && c->ssm != NULL && json_object_get(c->ssm, ssm_key) != NULL) {
        *key = ssm_key;
        return c->ssm;
    }
    if (ssm_key != NULL && c->top != NULL && json_object_get(c->top, ssm_key) != NULL) {
        *key = ssm_key;
        return c->top;
    }
    *key = hf_key != NULL ? hf_key : ssm_key;
    return NULL;
}

/* An integer key; *present false (and *out def) when absent. */
static wk_err
m2_cfg_u32(const m2_cfg *c, const char *hf_key, const char *ssm_key, uint32_t def, uint32_t *out,
           bool *present, const char **key, wk_diag *d)
{
    const json_t *o = m2_cfg_find(c, hf_key, ssm_key, key);
    *present = o != NULL && !json_is_null(json_object_get(o, *key));
    return wrk_config_u32(o, *key, def, out, d);
}

/* A boolean key (def when absent). */
static wk_err
m2_cfg_bool(const m2_cfg *c, const char *hf_key, const char *ssm_key, bool def, bool *out,
            const char **key, wk_diag *d)
{
    const json_t *o = m2_cfg_find(c, hf_key, ssm_key, key);
    return wrk_config_bool(o, *key, def, out, d);
}

/* A stated integer must equal what the shapes say. */
static wk_err
m2_cfg_expect(const m2_cfg *c, const char *hf_key, const char *ssm_key, uint32_t want,
              const char *what, wk_diag *d)
{
    uint32_t v;
    bool present;
    const char *key;
    wk_err e = m2_cfg_u32(c, hf_key, ssm_key, want, &v, &present, &key, d);
    if (e != WK_OK)
        return e;
    if (present && v != want)
        return wk_diag_set(d, WK_EINVAL, "config.json: %s is %u but the tensors give %s = %u", key,
                           v, what, want);
    return WK_OK;
}

/*
 * An upper dt limit that means "none": a number >= 1e30, or infinity as
 * serialisers spell it where JSON has no literal ("Infinity", "inf",
 * {"__float__": "Infinity"}).
 */
static bool
m2_cfg_is_inf(const json_t *v)
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

/* The keys that select variants this engine does not run. */
static wk_err
m2_cfg_variants(const m2_cfg *c, wk_diag *d)
{
    const char *key;
    bool b;
    wk_err e;

    if ((e = m2_cfg_bool(c, "norm_before_gate", "norm_before_gate", false, &b, &key, d)) != WK_OK)
        return e;
    if (b)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: %s is true; only the gate-then-norm Mamba2 "
                           "(norm_before_gate false) is supported",
                           key);
    if ((e = m2_cfg_bool(c, "rms_norm", "rms_norm", true, &b, &key, d)) != WK_OK)
        return e;
    if (!b)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: %s is false; LayerNorm blocks are not "
                           "supported",
                           key);
    if ((e = m2_cfg_bool(c, NULL, "rmsnorm", true, &b, &key, d)) != WK_OK)
        return e;
    if (!b)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: %s is false; the mixer without its "
                           "gated RMSNorm is not supported",
                           key);
    if ((e = m2_cfg_bool(c, "use_bias", "bias", false, &b, &key, d)) != WK_OK)
        return e;
    if (b)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: %s is true; in_proj / out_proj biases "
                           "are not supported",
                           key);
    if ((e = m2_cfg_bool(c, NULL, "D_has_hdim", false, &b, &key, d)) != WK_OK)
        return e;
    if (b)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: %s is true; D per channel is not "
                           "supported",
                           key);

    uint32_t u;
    bool present;
    if ((e = m2_cfg_u32(c, NULL, "d_intermediate", 0, &u, &present, &key, d)) != WK_OK)
        return e;
    if (u != 0)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: %s is %u; Mamba2 blocks with an MLP "
                           "are not supported",
                           key, u);

    const json_t *v;
    if (c->top != NULL && (v = json_object_get(c->top, "hidden_act")) != NULL && !json_is_null(v)) {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(s, "silu") != 0 && strcmp(s, "swish") != 0)
            return wk_diag_set(d, WK_EINVAL,
                               "config.json: hidden_act \"%.32s\" is not "
                               "supported (silu)",
                               s);
    }
    if (c->ssm != NULL && (v = json_object_get(c->ssm, "activation")) != NULL && !json_is_null(v)) {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(s, "silu") != 0 && strcmp(s, "swish") != 0)
            return wk_diag_set(d, WK_EINVAL,
                               "config.json: activation \"%.32s\" is not "
                               "supported (silu)",
                               s);
    }
    if (c->ssm != NULL && (v = json_object_get(c->ssm, "layer")) != NULL &&
        (!json_is_string(v) || strcmp(json_string_value(v), "Mamba2") != 0))
        return wk_diag_set(d, WK_EINVAL, "config.json: ssm_cfg.layer is not \"Mamba2\"");
    if (c->top != NULL && (v = json_object_get(c->top, "attn_layer_idx")) != NULL &&
        !json_is_null(v) && (!json_is_array(v) || json_array_size(v) != 0))
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: attn_layer_idx: attention layers are "
                           "not supported");

    /* dt limit: only the default (0, inf) */
    const char *lk = "time_step_limit";
    v = c->top != NULL ? json_object_get(c->top, lk) : NULL;
    if (v == NULL && c->ssm != NULL)
        v = json_object_get(c->ssm, lk = "dt_limit");
    if (v != NULL && !json_is_null(v)) {
        bool ok =
            json_is_array(v) && json_array_size(v) == 2 && json_is_number(json_array_get(v, 0)) &&
            json_number_value(json_array_get(v, 0)) <= 0.0 && m2_cfg_is_inf(json_array_get(v, 1));
        if (!ok)
            return wk_diag_set(d, WK_EINVAL, "config.json: %s other than [0, inf] is not supported",
                               lk);
    }
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* shapes                                                                    */
/* ------------------------------------------------------------------------ */

/* Layer count: one more than the largest N in backbone.layers.N.* names. */
static wk_err
m2_count_layers(const wk_tensor_set *set, uint32_t *out, wk_diag *d)
{
    const size_t plen = strlen(M2_PREFIX);
    long max = -1;
    for (size_t i = 0; i < wk_tensor_set_count(set); i++) {
        const char *name = wk_tensor_set_at(set, i)->name;
        if (strncmp(name, M2_PREFIX, plen) != 0)
            continue;
        long l = wrk_layer_parse(name + plen, M2_MAX_LAYERS, NULL);
        if (l < 0)
            return wk_diag_set(d, WK_EINVAL,
                               "%s: unexpected tensor for a mamba2 checkpoint "
                               "(bad layer number)",
                               name);
        if (l > max)
            max = l;
    }
    if (max < 0)
        return wk_diag_set(d, WK_EINVAL, M2_PREFIX "0.*: no layers in the checkpoint");
    *out = (uint32_t)max + 1;
    return WK_OK;
}

static const wk_tensor *
m2_layer_find(const wk_tensor_set *set, uint32_t l, const char *suf, char *name, size_t len)
{
    snprintf(name, len, M2_PREFIX "%u.%s", l, suf);
    return wk_tensor_set_find(set, name);
}

/* A required layer tensor. */
static wk_err
m2_layer_need(const wk_tensor_set *set, uint32_t l, const char *suf, const wk_tensor **out,
              char *name, size_t len, wk_diag *d)
{
    *out = m2_layer_find(set, l, suf, name, len);
    if (*out == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    return WK_OK;
}

/* The dimensions of layer 0 (and config.json's n_groups) into v. */
static wk_err
m2_read_dims(const wk_tensor_set *set, const m2_cfg *c, wrk_mamba2 *v, wk_diag *d)
{
    char name[128], want[160];
    const wk_tensor *t;
    wk_err e;

    /* d_inner from out_proj [C, d_inner] */
    if ((e = m2_layer_need(set, 0, "mixer.out_proj.weight", &t, name, sizeof(name), d)) != WK_OK)
        return e;
    if (t->ndim != 2 || t->shape[0] != (int64_t)v->d_model || t->shape[1] < 1 ||
        t->shape[1] > (int64_t)M2_MAX_DIM) {
        snprintf(want, sizeof(want), "[%u,d_inner] (d_inner <= %u)", v->d_model, M2_MAX_DIM);
        return wrk_shape_err(d, name, t, want);
    }
    v->d_inner = (uint32_t)t->shape[1];

    /* H from A_log [H] */
    if ((e = m2_layer_need(set, 0, "mixer.A_log", &t, name, sizeof(name), d)) != WK_OK)
        return e;
    int64_t H = t->ndim >= 1 ? t->shape[t->ndim - 1] : 0;
    if (H < 1 || !wrk_is_vec(t, H) || v->d_inner % (uint64_t)H != 0 ||
        v->d_inner / (uint64_t)H > M2_MAX_STATE) {
        snprintf(want, sizeof(want), "[H] with H dividing d_inner %u (head_dim <= %u)", v->d_inner,
                 M2_MAX_STATE);
        return wrk_shape_err(d, name, t, want);
    }
    v->n_head = (uint32_t)H;
    v->head_dim = v->d_inner / v->n_head;

    /* conv_dim, K from conv1d.weight [conv_dim, 1, K] */
    if ((e = m2_layer_need(set, 0, "mixer.conv1d.weight", &t, name, sizeof(name), d)) != WK_OK)
        return e;
    if (t->ndim != 3 || t->shape[1] != 1 || t->shape[2] < 2 || t->shape[2] > (int64_t)M2_MAX_CONV ||
        t->shape[0] <= (int64_t)v->d_inner || t->shape[0] > (int64_t)M2_MAX_DIM) {
        snprintf(want, sizeof(want),
                 "[conv_dim,1,K] with d_inner %u < conv_dim <= %u, 2 <= K <= %u", v->d_inner,
                 M2_MAX_DIM, M2_MAX_CONV);
        return wrk_shape_err(d, name, t, want);
    }
    v->conv_dim = (uint32_t)t->shape[0];
    v->d_conv = (uint32_t)t->shape[2];

    /* G from config.json; N from conv_dim = d_inner + 2 G N */
    uint32_t G;
    bool present;
    const char *key;
    if ((e = m2_cfg_u32(c, "n_groups", "ngroups", 1, &G, &present, &key, d)) != WK_OK)
        return e;
    if (G < 1 || v->n_head % G != 0)
        return wk_diag_set(d, WK_EINVAL,
                           "config.json: %s %u must divide the head count %u "
                           "(" M2_PREFIX "0.mixer.A_log)",
                           key, G, v->n_head);
    uint32_t gn2 = v->conv_dim - v->d_inner;
    if (gn2 % (2 * G) != 0 || gn2 / (2 * G) > M2_MAX_STATE)
        return wk_diag_set(d, WK_EINVAL,
                           "%s: conv_dim %u - d_inner %u = %u is not 2 * %s (%u) * d_state "
                           "(d_state <= %u)",
                           name, v->conv_dim, v->d_inner, gn2, key, G, M2_MAX_STATE);
    v->n_groups = G;
    v->d_state = gn2 / (2 * G);
    v->d_in_proj = 2 * v->d_inner + gn2 + v->n_head;
    return WK_OK;
}

/* Checks every tensor of layer l against v's dimensions; fills ly. */
static wk_err
m2_map_layer(const wk_tensor_set *set, const wrk_mamba2 *v, bool conv_bias, uint32_t l,
             wrk_mamba2_layer *ly, wk_diag *d)
{
    char name[128], want[96];
    const wk_tensor *t;
    wk_err e;
    struct {
        const char *suf;
        const wk_tensor **field;
        uint32_t n;
    } vecs[] = {
        {"norm.weight", &ly->norm, v->d_model},        {"mixer.dt_bias", &ly->dt_bias, v->n_head},
        {"mixer.A_log", &ly->A_log, v->n_head},        {"mixer.D", &ly->D, v->n_head},
        {"mixer.norm.weight", &ly->gnorm, v->d_inner},
    };
    for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]); i++) {
        if ((e = m2_layer_need(set, l, vecs[i].suf, &t, name, sizeof(name), d)) != WK_OK)
            return e;
        if (!wrk_is_vec(t, vecs[i].n)) {
            snprintf(want, sizeof(want), "[%u]", vecs[i].n);
            return wrk_shape_err(d, name, t, want);
        }
        *vecs[i].field = t;
    }

    if ((e = m2_layer_need(set, l, "mixer.in_proj.weight", &t, name, sizeof(name), d)) != WK_OK)
        return e;
    if (!wrk_is_mat(t, v->d_in_proj, v->d_model)) {
        snprintf(want, sizeof(want), "[%u,%u] (2*d_inner + 2*n_groups*d_state + n_heads, d_model)",
                 v->d_in_proj, v->d_model);
        return wrk_shape_err(d, name, t, want);
    }
    ly->in_proj = (wrk_mat){t, v->d_model, v->d_in_proj, false};

    if ((e = m2_layer_need(set, l, "mixer.out_proj.weight", &t, name, sizeof(name), d)) != WK_OK)
        return e;
    if (!wrk_is_mat(t, v->d_model, v->d_inner)) {
        snprintf(want, sizeof(want), "[%u,%u]", v->d_model, v->d_inner);
        return wrk_shape_err(d, name, t, want);
    }
    ly->out_proj = (wrk_mat){t, v->d_inner, v->d_model, false};

    if ((e = m2_layer_need(set, l, "mixer.conv1d.weight", &t, name, sizeof(name), d)) != WK_OK)
        return e;
    if (t->ndim != 3 || t->shape[0] != (int64_t)v->conv_dim || t->shape[1] != 1 ||
        t->shape[2] != (int64_t)v->d_conv) {
        snprintf(want, sizeof(want), "[%u,1,%u]", v->conv_dim, v->d_conv);
        return wrk_shape_err(d, name, t, want);
    }
    ly->conv_w = t;

    t = m2_layer_find(set, l, "mixer.conv1d.bias", name, sizeof(name));
    if (t == NULL && conv_bias)
        return wk_diag_set(d, WK_EINVAL, "%s: missing (config.json use_conv_bias is not false)",
                           name);
    if (t != NULL && !conv_bias)
        return wk_diag_set(d, WK_EINVAL, "%s: present but config.json use_conv_bias is false",
                           name);
    if (t != NULL && !wrk_is_vec(t, v->conv_dim)) {
        snprintf(want, sizeof(want), "[%u]", v->conv_dim);
        return wrk_shape_err(d, name, t, want);
    }
    ly->conv_b = t;
    return WK_OK;
}

/* Declares every tensor the backend reads, under its transformers name. */
static wk_err
m2_declare(wrk_model *m, wrk_mamba2 *v, wk_diag *d)
{
    char name[128];
    wk_err e;
    if ((e = wrk_model_use(m, &v->emb, M2_EMB_HF, false, false, d)) != WK_OK)
        return e;
    for (uint32_t l = 0; l < v->n_layer; l++) {
        wrk_mamba2_layer *ly = &v->layers[l];
        struct {
            const char *suf;
            const wk_tensor **field;
            bool vec;
        } uses[] = {
            {"norm.weight", &ly->norm, true},
            {"mixer.in_proj.weight", &ly->in_proj.t, false},
            {"mixer.conv1d.weight", &ly->conv_w, true},
            {"mixer.conv1d.bias", &ly->conv_b, true},
            {"mixer.dt_bias", &ly->dt_bias, true},
            {"mixer.A_log", &ly->A_log, true},
            {"mixer.D", &ly->D, true},
            {"mixer.norm.weight", &ly->gnorm, true},
            {"mixer.out_proj.weight", &ly->out_proj.t, false},
        };
        for (size_t i = 0; i < sizeof(uses) / sizeof(uses[0]); i++) {
            if (*uses[i].field == NULL)
                continue; /* conv bias off */
            snprintf(name, sizeof(name), M2_PREFIX "%u.%s", l, uses[i].suf);
            if ((e = wrk_model_use(m, uses[i].field, name, false, uses[i].vec, d)) != WK_OK)
                return e;
        }
    }
    if ((e = wrk_model_use(m, &v->norm_f, M2_NORM_F, false, true, d)) != WK_OK)
        return e;
    if (v->lm_head.t != NULL &&
        (e = wrk_model_use(m, &v->lm_head.t, M2_HEAD, false, false, d)) != WK_OK)
        return e;
    return WK_OK;
}

static void
m2_free_view(void *view)
{
    wrk_mamba2 *v = view;
    if (v == NULL)
        return;
    free(v->layers);
    free(v);
}

static wk_err
m2_map_into(wrk_model *m, const wk_tensor_set *set, const json_t *config, wrk_mamba2 *v, wk_diag *d)
{
    const wk_tensor *eh = wk_tensor_set_find(set, M2_EMB_HF);
    const wk_tensor *es = wk_tensor_set_find(set, M2_EMB_SSM);
    char want[96];
    wk_err e;

    if (eh != NULL && es != NULL)
        return wk_diag_set(d, WK_EINVAL, "%s and %s: both naming conventions in one checkpoint",
                           M2_EMB_HF, M2_EMB_SSM);
    if (eh == NULL && es == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing (nor %s): not a mamba2 checkpoint", M2_EMB_HF,
                           M2_EMB_SSM);
    const wk_tensor *emb = eh != NULL ? eh : es;
    const char *emb_name = eh != NULL ? M2_EMB_HF : M2_EMB_SSM;
    v->convention = eh != NULL ? WRK_MAMBA2_HF : WRK_MAMBA2_SSM;
    if (emb->ndim != 2 || emb->shape[0] < 1 || emb->shape[1] < 1 ||
        emb->shape[0] > (int64_t)M2_MAX_VOCAB || emb->shape[1] > (int64_t)M2_MAX_DIM) {
        snprintf(want, sizeof(want), "[V,C] (V <= %u, C <= %u)", M2_MAX_VOCAB, M2_MAX_DIM);
        return wrk_shape_err(d, emb_name, emb, want);
    }
    v->emb = emb;
    v->vocab_size = (uint32_t)emb->shape[0];
    v->d_model = (uint32_t)emb->shape[1];

    m2_cfg c = {config, NULL};
    if (config != NULL) {
        const json_t *s = json_object_get(config, "ssm_cfg");
        if (s != NULL && !json_is_null(s) && !json_is_object(s))
            return wk_diag_set(d, WK_EINVAL, "config.json: ssm_cfg must be an object");
        c.ssm = s != NULL && json_is_object(s) ? s : NULL;
    }
    if ((e = m2_cfg_variants(&c, d)) != WK_OK)
        return e;
    if ((e = m2_count_layers(set, &v->n_layer, d)) != WK_OK)
        return e;
    if ((e = m2_read_dims(set, &c, v, d)) != WK_OK)
        return e;

    /* what config.json states must match the shapes */
    if ((e = m2_cfg_expect(&c, "hidden_size", "d_model", v->d_model, "d_model", d)) != WK_OK ||
        (e = m2_cfg_expect(&c, "num_hidden_layers", "n_layer", v->n_layer, "n_layer", d)) !=
            WK_OK ||
        (e = m2_cfg_expect(&c, "state_size", "d_state", v->d_state, "d_state", d)) != WK_OK ||
        (e = m2_cfg_expect(&c, "head_dim", "headdim", v->head_dim, "head_dim", d)) != WK_OK ||
        (e = m2_cfg_expect(&c, "num_heads", NULL, v->n_head, "num_heads", d)) != WK_OK ||
        (e = m2_cfg_expect(&c, "conv_kernel", "d_conv", v->d_conv, "d_conv", d)) != WK_OK)
        return e;
    {
        uint32_t x;
        bool present;
        const char *key;
        if ((e = m2_cfg_u32(&c, "expand", "expand", 0, &x, &present, &key, d)) != WK_OK)
            return e;
        if (present && (uint64_t)x * v->d_model != v->d_inner)
            return wk_diag_set(d, WK_EINVAL,
                               "config.json: %s %u * d_model %u != d_inner %u "
                               "(" M2_PREFIX "0.mixer.out_proj.weight)",
                               key, x, v->d_model, v->d_inner);
        if ((e = m2_cfg_u32(&c, "vocab_size", "vocab_size", 0, &x, &present, &key, d)) != WK_OK)
            return e;
        if (present && x > v->vocab_size)
            return wk_diag_set(d, WK_EINVAL, "config.json: %s %u is more than the %u rows of %s",
                               key, x, v->vocab_size, emb_name);
    }
    if ((e = wrk_config_f64(config, "layer_norm_epsilon", 1e-5, &v->eps, d)) != WK_OK)
        return e;
    if (config != NULL && json_object_get(config, "layer_norm_epsilon") == NULL &&
        (e = wrk_config_f64(config, "norm_epsilon", 1e-5, &v->eps, d)) != WK_OK)
        return e;
    if (!(v->eps > 0.0 && v->eps < 1.0))
        return wk_diag_set(d, WK_EINVAL, "config.json: layer_norm_epsilon %g out of (0, 1)",
                           v->eps);
    bool conv_bias, tied;
    const char *key;
    if ((e = m2_cfg_bool(&c, "use_conv_bias", "conv_bias", true, &conv_bias, &key, d)) != WK_OK)
        return e;
    if ((e = m2_cfg_bool(&c, "tie_word_embeddings", "tie_embeddings", true, &tied, &key, d)) !=
        WK_OK)
        return e;

    uint64_t per_layer =
        (uint64_t)v->conv_dim * (v->d_conv - 1) + (uint64_t)v->n_head * v->head_dim * v->d_state;
    if (per_layer * v->n_layer * 4u > M2_MAX_STATE_BYTES)
        return wk_diag_set(d, WK_EINVAL,
                           "state of %" PRIu64 " bytes per sequence is over the "
                           "limit %llu",
                           per_layer * v->n_layer * 4u, (unsigned long long)M2_MAX_STATE_BYTES);

    v->layers = calloc(v->n_layer, sizeof(*v->layers));
    if (v->layers == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory (%u layers)", v->n_layer);
    for (uint32_t l = 0; l < v->n_layer; l++)
        if ((e = m2_map_layer(set, v, conv_bias, l, &v->layers[l], d)) != WK_OK)
            return e;

    const wk_tensor *t = wk_tensor_set_find(set, M2_NORM_F);
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", M2_NORM_F);
    if (!wrk_is_vec(t, v->d_model)) {
        snprintf(want, sizeof(want), "[%u]", v->d_model);
        return wrk_shape_err(d, M2_NORM_F, t, want);
    }
    v->norm_f = t;
    t = wk_tensor_set_find(set, M2_HEAD);
    if (t == NULL && !tied)
        return wk_diag_set(d, WK_EINVAL, "%s: missing (config.json %s is false)", M2_HEAD, key);
    if (t != NULL && !wrk_is_mat(t, v->vocab_size, v->d_model)) {
        snprintf(want, sizeof(want), "[%u,%u] (the rows of %s)", v->vocab_size, v->d_model,
                 emb_name);
        return wrk_shape_err(d, M2_HEAD, t, want);
    }
    v->lm_head = (wrk_mat){t, v->d_model, v->vocab_size, false};
    return m2_declare(m, v, d);
}

static wk_err
m2_map(wrk_model *m, const wk_tensor_set *set, const json_t *config, void **view,
       wrk_model_info *info, wk_diag *d)
{
    wrk_mamba2 *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wk_err e = m2_map_into(m, set, config, v, d);
    if (e != WK_OK) {
        m2_free_view(v);
        return e;
    }
    info->n_layer = v->n_layer;
    info->n_embd = v->d_model;
    info->n_head = v->n_head;
    info->head_size = v->head_dim;
    info->ffn_dim = 0;
    info->vocab_size = v->vocab_size;
    info->state_bytes =
        (uint64_t)v->n_layer *
        ((uint64_t)v->conv_dim * (v->d_conv - 1) + (uint64_t)v->n_head * v->head_dim * v->d_state) *
        4u;
    *view = v;
    return WK_OK;
}

static size_t
m2_layout(const void *view, wrk_state_tensor *out, size_t cap)
{
    const wrk_mamba2 *v = view;
    size_t n = (size_t)v->n_layer * 2;
    for (size_t i = 0; out != NULL && i < n && i < cap; i++) {
        wrk_state_tensor *t = &out[i];
        memset(t, 0, sizeof(*t));
        uint32_t l = (uint32_t)(i / 2);
        if (i % 2 == 0) {
            snprintf(t->name, sizeof(t->name), "layers.%u.conv", l);
            t->ndim = 2;
            t->shape[0] = v->conv_dim;
            t->shape[1] = v->d_conv - 1;
        } else {
            snprintf(t->name, sizeof(t->name), "layers.%u.ssm", l);
            t->ndim = 3;
            t->shape[0] = v->n_head;
            t->shape[1] = v->head_dim;
            t->shape[2] = v->d_state;
        }
    }
    return n;
}

static void
m2_fingerprint_extra(const void *view, char *buf, size_t len)
{
    const wrk_mamba2 *v = view;
    snprintf(buf, len, "n_groups=%u\nd_state=%u\nd_conv=%u\nconv_bias=%d\neps=%.9g", v->n_groups,
             v->d_state, v->d_conv, v->layers[0].conv_b != NULL, v->eps);
}

/*
 * --quantize q8_0: in_proj and out_proj of every layer, and the head. A tied
 * head is named as head_q8, set here to the embedding: the quantization
 * gives the head its own Q8_0 copy while the embedding stays (a token reads
 * one row of it; the head streams all of it every step).
 */
static size_t
m2_quant_mats(void *view, wrk_mat **out, size_t cap)
{
    wrk_mamba2 *v = view;
    size_t n = 0;
    for (uint32_t l = 0; l < v->n_layer; l++) {
        wrk_mat *mats[] = {&v->layers[l].in_proj, &v->layers[l].out_proj};
        for (size_t i = 0; i < 2; i++, n++)
            if (out != NULL && n < cap)
                out[n] = mats[i];
    }
    if (out != NULL && n < cap) {
        if (v->lm_head.t == NULL)
            v->head_q8 = (wrk_mat){v->emb, v->d_model, v->vocab_size, false};
        out[n] = v->lm_head.t != NULL ? &v->lm_head : &v->head_q8;
    }
    return n + 1;
}

/*
 * The model as the layer list (wrk_gdn.h): layer l is a MAMBA2 mixer
 * behind its pre-norm (layers.l.norm as attn_norm), no MLP, then norm_f and
 * the head; the slot layout is the same bytes (conv then ssm per layer).
 * The head: lm_head, else the tied head's Q8_0 copy (--quantize), else
 * the embedding (tied). Reads the view as it is now (after --fp32 or
 * --quantize replaced its tensors), so the backends call it at open.
 */
wk_err
wrk_mamba2_layer_list(const wrk_mamba2 *v, wrk_gdn **out, wk_diag *d)
{
    wrk_gdn *g = calloc(1, sizeof(*g) + sizeof(wrk_gdn_layer) * v->n_layer);
    if (g == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wrk_gdn_layer *layers = (wrk_gdn_layer *)(g + 1);
    g->n_layer = v->n_layer;
    g->n_embd = v->d_model;
    g->vocab_size = v->vocab_size;
    g->norm_eps = v->eps;
    g->emb = v->emb;
    g->norm = v->norm_f;
    g->tied = v->lm_head.t == NULL;
    g->head = v->lm_head.t != NULL   ? v->lm_head
              : v->head_q8.t != NULL ? v->head_q8
                                     : (wrk_mat){v->emb, v->d_model, v->vocab_size, false};
    g->n_m2 = v->n_layer;
    g->m2_heads = v->n_head;
    g->m2_head_dim = v->head_dim;
    g->m2_groups = v->n_groups;
    g->m2_state = v->d_state;
    g->m2_conv = v->d_conv;
    for (uint32_t l = 0; l < v->n_layer; l++) {
        layers[l].mixer = WRK_MIXER_MAMBA2;
        layers[l].attn_norm = v->layers[l].norm;
        layers[l].m2 = v->layers[l];
        layers[l].m2.norm = NULL; /* attn_norm is the pre-norm */
    }
    g->layers = layers;
    *out = g;
    return WK_OK;
}

const wrk_family wrk_family_mamba2 = {
    .name = "mamba2",
    .model_types = m2_types,
    .detect = m2_detect,
    .map = m2_map,
    .free_view = m2_free_view,
    .state_layout = m2_layout,
    .fingerprint_extra = m2_fingerprint_extra,
    .quant_mats = m2_quant_mats,
};
