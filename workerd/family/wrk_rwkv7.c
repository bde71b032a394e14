/*
 * wrk_rwkv7: maps an RWKV-7 ("x070") checkpoint onto wrk_rwkv7 (wrk_rwkv7.h).
 *
 * One view whatever the checkpoint's naming convention: BlinkDL
 * (emb.weight, blocks.N.att.*: .pth or .safetensors) or Hugging Face
 * fla-hub rwkv7 (model.embeddings.weight, model.layers.N.attn.*; a
 * llama.cpp RWKV-7 .gguf arrives under these names through wrk_gguf). One
 * table of layer tensors serves both conventions and fixes the canonical
 * order (BlinkDL names and orientation) in which the tensors are declared,
 * and so counted and hashed. Every dimension is read from tensor shapes;
 * every tensor's presence and shape is checked, and an inconsistent
 * checkpoint is refused with a diag that names the tensor. Unknown tensor
 * names are refused here, with RWKV-7's own message (wrk_family.checks_names:
 * wrk_model's generic check is not run), and a stored layer-0 value LoRA,
 * which RWKV-7 never uses, is checked and ignored. RWKV-7 is the family of
 * last resort: a checkpoint no other family recognises is mapped here, and
 * the diag says what was not found.
 *
 * Must never: trust a dimension before checking it against its limits,
 * write *view on failure, log.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wrk_family.h"
#include "wrk_gdn.h"
#include "wrk_rwkv7.h"

/* Limits on dimensions read from a (hostile) checkpoint. */
#define WRK_MAX_LAYERS 4096u
#define WRK_MAX_EMBD (1u << 17)
#define WRK_MAX_FFN (1u << 20)
#define WRK_MAX_VOCAB (1u << 22)
#define WRK_MAX_LORA (1u << 16)

/* The view: wrk_rwkv7 first (wrk_model_view hands out a pointer to it), then what it owns. */
typedef struct rw_view {
    wrk_rwkv7 r;             /* the view the backends read */
    wrk_rwkv7_layer *layers; /* r.n_layer entries, owned */
} rw_view;

/* ------------------------------------------------------------------------ */
/* tensor specs: one table for both conventions                              */
/* ------------------------------------------------------------------------ */

typedef enum spec_kind {
    SPEC_VEC,       /* C values, shape [..1.., C] */
    SPEC_RK,        /* [H, N] */
    SPEC_LINEAR,    /* C -> C, stored [C, C] (nn.Linear) */
    SPEC_LORA_IN,   /* C -> D: BlinkDL [C, D] (x @ W), HF [D, C] (nn.Linear) */
    SPEC_LORA_OUT,  /* D -> C: BlinkDL [D, C], HF [C, D] */
    SPEC_FFN_KEY,   /* C -> F, stored [F, C] */
    SPEC_FFN_VALUE, /* F -> C, stored [C, F] */
} spec_kind;

enum {
    LORA_W = 0, /* decay */
    LORA_A = 1, /* in-context learning rate */
    LORA_V = 2, /* value residual */
    LORA_G = 3, /* gate */
};

enum {
    SPEC_F_VRES = 1u, /* value-residual tensor: absent (or ignored) on layer 0 */
};

typedef struct spec {
    const char *blink; /* name after "blocks.<i>." */
    const char *hf;    /* name after "model.layers.<i>." */
    spec_kind kind;    /* shape rule */
    int lora;          /* LORA_* for LoRA kinds */
    size_t off;        /* offset of the field in wrk_rwkv7_layer */
    unsigned flags;    /* SPEC_F_* */
} spec;

#define LOFF(f) offsetof(wrk_rwkv7_layer, f)

/* The canonical order of a layer's tensors (also the digest order). */
static const spec wrk_layer_specs[] = {
    {"ln1.weight", "attn_norm.weight", SPEC_VEC, 0, LOFF(ln1_w), 0},
    {"ln1.bias", "attn_norm.bias", SPEC_VEC, 0, LOFF(ln1_b), 0},
    {"att.x_r", "attn.x_r", SPEC_VEC, 0, LOFF(x_r), 0},
    {"att.x_w", "attn.x_w", SPEC_VEC, 0, LOFF(x_w), 0},
    {"att.x_k", "attn.x_k", SPEC_VEC, 0, LOFF(x_k), 0},
    {"att.x_v", "attn.x_v", SPEC_VEC, 0, LOFF(x_v), 0},
    {"att.x_a", "attn.x_a", SPEC_VEC, 0, LOFF(x_a), 0},
    {"att.x_g", "attn.x_g", SPEC_VEC, 0, LOFF(x_g), 0},
    {"att.w0", "attn.w_lora.lora.2.bias", SPEC_VEC, 0, LOFF(w0), 0},
    {"att.w1", "attn.w_lora.lora.0.weight", SPEC_LORA_IN, LORA_W, LOFF(w1), 0},
    {"att.w2", "attn.w_lora.lora.2.weight", SPEC_LORA_OUT, LORA_W, LOFF(w2), 0},
    {"att.a0", "attn.a_lora.lora.2.bias", SPEC_VEC, 0, LOFF(a0), 0},
    {"att.a1", "attn.a_lora.lora.0.weight", SPEC_LORA_IN, LORA_A, LOFF(a1), 0},
    {"att.a2", "attn.a_lora.lora.2.weight", SPEC_LORA_OUT, LORA_A, LOFF(a2), 0},
    {"att.v0", "attn.v_lora.lora.2.bias", SPEC_VEC, 0, LOFF(v0), SPEC_F_VRES},
    {"att.v1", "attn.v_lora.lora.0.weight", SPEC_LORA_IN, LORA_V, LOFF(v1), SPEC_F_VRES},
    {"att.v2", "attn.v_lora.lora.2.weight", SPEC_LORA_OUT, LORA_V, LOFF(v2), SPEC_F_VRES},
    {"att.g1", "attn.g_lora.lora.0.weight", SPEC_LORA_IN, LORA_G, LOFF(g1), 0},
    {"att.g2", "attn.g_lora.lora.2.weight", SPEC_LORA_OUT, LORA_G, LOFF(g2), 0},
    {"att.k_k", "attn.k_k", SPEC_VEC, 0, LOFF(k_k), 0},
    {"att.k_a", "attn.k_a", SPEC_VEC, 0, LOFF(k_a), 0},
    {"att.r_k", "attn.r_k", SPEC_RK, 0, LOFF(r_k), 0},
    {"att.receptance.weight", "attn.r_proj.weight", SPEC_LINEAR, 0, LOFF(wr), 0},
    {"att.key.weight", "attn.k_proj.weight", SPEC_LINEAR, 0, LOFF(wk), 0},
    {"att.value.weight", "attn.v_proj.weight", SPEC_LINEAR, 0, LOFF(wv), 0},
    {"att.output.weight", "attn.o_proj.weight", SPEC_LINEAR, 0, LOFF(wo), 0},
    {"att.ln_x.weight", "attn.g_norm.weight", SPEC_VEC, 0, LOFF(lnx_w), 0},
    {"att.ln_x.bias", "attn.g_norm.bias", SPEC_VEC, 0, LOFF(lnx_b), 0},
    {"ln2.weight", "ffn_norm.weight", SPEC_VEC, 0, LOFF(ln2_w), 0},
    {"ln2.bias", "ffn_norm.bias", SPEC_VEC, 0, LOFF(ln2_b), 0},
    {"ffn.x_k", "ffn.x_k", SPEC_VEC, 0, LOFF(ffn_x_k), 0},
    {"ffn.key.weight", "ffn.key.weight", SPEC_FFN_KEY, 0, LOFF(ffn_key), 0},
    {"ffn.value.weight", "ffn.value.weight", SPEC_FFN_VALUE, 0, LOFF(ffn_value), 0},
};
#define WRK_N_LAYER_SPECS (sizeof(wrk_layer_specs) / sizeof(wrk_layer_specs[0]))

/* Names outside the layers, per convention. */
typedef struct wrk_names {
    const char *layer_prefix; /* "blocks." */
    const char *emb;          /* embedding */
    const char *ln0_w, *ln0_b;     /* full names (layer 0) */
    const char *lnout_w, *lnout_b; /* final LayerNorm */
    const char *head;              /* head */
} wrk_names;

static const wrk_names wrk_names_blink = {
    "blocks.", "emb.weight", "blocks.0.ln0.weight", "blocks.0.ln0.bias",
    "ln_out.weight", "ln_out.bias", "head.weight",
};
static const wrk_names wrk_names_hf = {
    "model.layers.", "model.embeddings.weight", "model.layers.0.pre_norm.weight",
    "model.layers.0.pre_norm.bias", "model.norm.weight", "model.norm.bias", "lm_head.weight",
};

/* The dimensions being established / checked. */
typedef struct wrk_dims {
    uint32_t L, C, H, N, F, V;
    uint32_t lora[4]; /* LORA_W, LORA_A, LORA_V, LORA_G; 0 = not yet known */
} wrk_dims;

/* wrk_shape_err with the expected shape [e0] (e1 < 0) or [e0,e1]. */
static wk_err
wrk_shape_err_dims(wk_diag *d, const char *name, const wk_tensor *t, int64_t e0, int64_t e1)
{
    char want[64];
    if (e1 < 0)
        snprintf(want, sizeof(want), "[%" PRId64 "]", e0);
    else
        snprintf(want, sizeof(want), "[%" PRId64 ",%" PRId64 "]", e0, e1);
    return wrk_shape_err(d, name, t, want);
}

/* ------------------------------------------------------------------------ */
/* mapping the tensors                                                       */
/* ------------------------------------------------------------------------ */

/* Checks that every tensor name is one we know; counts the layers. */
static wk_err
wrk_scan_names(const wk_tensor_set *set, const wrk_names *nm, uint32_t *n_layer, wk_diag *d)
{
    size_t n = wk_tensor_set_count(set);
    size_t plen = strlen(nm->layer_prefix);
    long max_layer = -1;

    for (size_t i = 0; i < n; i++) {
        const wk_tensor *t = wk_tensor_set_at(set, i);
        const char *name = t->name;
        if (strcmp(name, nm->emb) == 0 || strcmp(name, nm->lnout_w) == 0 ||
            strcmp(name, nm->lnout_b) == 0 || strcmp(name, nm->head) == 0 ||
            strcmp(name, nm->ln0_w) == 0 || strcmp(name, nm->ln0_b) == 0)
            continue;
        const char *rest = NULL;
        long layer = -1;
        if (strncmp(name, nm->layer_prefix, plen) == 0)
            layer = wrk_layer_parse(name + plen, (long)WRK_MAX_LAYERS, &rest);
        if (layer < 0 && strncmp(name, nm->layer_prefix, plen) == 0 && name[plen] >= '1' &&
            name[plen] <= '9' && strtol(name + plen, NULL, 10) >= (long)WRK_MAX_LAYERS)
            return wk_diag_set(d, WK_EINVAL, "%s: layer index over %u (at most %u layers)", name,
                               WRK_MAX_LAYERS - 1, WRK_MAX_LAYERS);
        bool known = false;
        if (layer >= 0) {
            for (size_t s = 0; s < WRK_N_LAYER_SPECS && !known; s++) {
                const char *suf = nm == &wrk_names_blink ? wrk_layer_specs[s].blink
                                                         : wrk_layer_specs[s].hf;
                known = strcmp(rest, suf) == 0;
            }
        }
        if (!known)
            return wk_diag_set(d, WK_EINVAL, "%s: unexpected tensor for an RWKV-7 checkpoint",
                               name);
        if (layer > max_layer)
            max_layer = layer;
    }
    if (max_layer < 0)
        return wk_diag_set(d, WK_EINVAL, "%s0.*: no layers in the checkpoint", nm->layer_prefix);
    *n_layer = (uint32_t)max_layer + 1;
    return WK_OK;
}

static const wk_tensor *
wrk_find_layer(const wk_tensor_set *set, const wrk_names *nm, uint32_t layer, const char *suf,
               char *name, size_t name_len)
{
    snprintf(name, name_len, "%s%u.%s", nm->layer_prefix, layer, suf);
    return wk_tensor_set_find(set, name);
}

/* Reads a dimension-defining tensor's shape; fills dims. */
static wk_err
wrk_read_dims(const wk_tensor_set *set, const wrk_names *nm, bool hf, wrk_dims *dm, wk_diag *d)
{
    char name[256];
    const wk_tensor *t;

    /* H, N from layer 0 r_k [H, N] */
    t = wrk_find_layer(set, nm, 0, hf ? "attn.r_k" : "att.r_k", name, sizeof(name));
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    if (t->ndim != 2 || t->shape[0] < 1 || t->shape[1] < 1 ||
        t->shape[0] * t->shape[1] != (int64_t)dm->C) {
        char got[128];
        wrk_shape_str(t, got, sizeof(got));
        return wk_diag_set(d, WK_EINVAL,
                           "%s: shape %s, expected [H,N] with H*N = n_embd %u", name, got, dm->C);
    }
    dm->H = (uint32_t)t->shape[0];
    dm->N = (uint32_t)t->shape[1];

    /* F from layer 0 ffn.key [F, C] */
    t = wrk_find_layer(set, nm, 0, "ffn.key.weight", name, sizeof(name));
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
    if (t->ndim != 2 || t->shape[0] < 1 || t->shape[0] > (int64_t)WRK_MAX_FFN ||
        t->shape[1] != (int64_t)dm->C) {
        char got[128];
        wrk_shape_str(t, got, sizeof(got));
        return wk_diag_set(d, WK_EINVAL, "%s: shape %s, expected [F,%u]", name, got, dm->C);
    }
    dm->F = (uint32_t)t->shape[0];

    /* LoRA ranks from the first layer that has each first-stage matrix */
    for (size_t s = 0; s < WRK_N_LAYER_SPECS; s++) {
        const spec *sp = &wrk_layer_specs[s];
        if (sp->kind != SPEC_LORA_IN)
            continue;
        uint32_t first = (sp->flags & SPEC_F_VRES) && dm->L > 1 ? 1 : 0;
        t = wrk_find_layer(set, nm, first, hf ? sp->hf : sp->blink, name, sizeof(name));
        if (t == NULL) {
            if (sp->flags & SPEC_F_VRES)
                continue; /* single layer without a value LoRA: rank 0 */
            return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
        }
        int64_t D = -1;
        if (t->ndim == 2) {
            if (!hf && t->shape[0] == (int64_t)dm->C)
                D = t->shape[1];
            if (hf && t->shape[1] == (int64_t)dm->C)
                D = t->shape[0];
        }
        if (D < 1 || D > (int64_t)WRK_MAX_LORA) {
            char got[128];
            wrk_shape_str(t, got, sizeof(got));
            return wk_diag_set(d, WK_EINVAL, "%s: shape %s, expected %s", name, got,
                               hf ? "[D,C] (LoRA down projection)" : "[C,D] (LoRA down)");
        }
        dm->lora[sp->lora] = (uint32_t)D;
    }
    return WK_OK;
}

/* Checks t against sp and the dims; fills the field at out. */
static wk_err
wrk_map_tensor(const spec *sp, bool hf, const wrk_dims *dm, const wk_tensor *t, const char *name,
               void *field, wk_diag *d)
{
    const int64_t C = dm->C;
    int64_t D = sp->kind == SPEC_LORA_IN || sp->kind == SPEC_LORA_OUT ? dm->lora[sp->lora] : 0;
    wrk_mat *m = field;

    switch (sp->kind) {
    case SPEC_VEC:
        if (!wrk_is_vec(t, C))
            return wrk_shape_err_dims(d, name, t, C, -1);
        *(const wk_tensor **)field = t;
        return WK_OK;
    case SPEC_RK:
        if (!wrk_is_mat(t, dm->H, dm->N))
            return wrk_shape_err_dims(d, name, t, dm->H, dm->N);
        *(const wk_tensor **)field = t;
        return WK_OK;
    case SPEC_LINEAR:
        if (!wrk_is_mat(t, C, C))
            return wrk_shape_err_dims(d, name, t, C, C);
        *m = (wrk_mat){t, dm->C, dm->C, false};
        return WK_OK;
    case SPEC_LORA_IN:
        if (hf ? !wrk_is_mat(t, D, C) : !wrk_is_mat(t, C, D))
            return hf ? wrk_shape_err_dims(d, name, t, D, C) : wrk_shape_err_dims(d, name, t, C, D);
        *m = (wrk_mat){t, dm->C, (uint32_t)D, !hf};
        return WK_OK;
    case SPEC_LORA_OUT:
        if (hf ? !wrk_is_mat(t, C, D) : !wrk_is_mat(t, D, C))
            return hf ? wrk_shape_err_dims(d, name, t, C, D) : wrk_shape_err_dims(d, name, t, D, C);
        *m = (wrk_mat){t, (uint32_t)D, dm->C, !hf};
        return WK_OK;
    case SPEC_FFN_KEY:
        if (!wrk_is_mat(t, dm->F, C))
            return wrk_shape_err_dims(d, name, t, dm->F, C);
        *m = (wrk_mat){t, dm->C, dm->F, false};
        return WK_OK;
    case SPEC_FFN_VALUE:
        if (!wrk_is_mat(t, C, dm->F))
            return wrk_shape_err_dims(d, name, t, C, dm->F);
        *m = (wrk_mat){t, dm->F, dm->C, false};
        return WK_OK;
    }
    return wk_diag_set(d, WK_EINVAL, "%s: internal: unknown spec", name);
}

static wk_err
wrk_map_rwkv7(rw_view *v, const wk_tensor_set *set, const json_t *config, wk_diag *d)
{
    wrk_rwkv7 *r = &v->r;
    const wk_tensor *eb = wk_tensor_set_find(set, wrk_names_blink.emb);
    const wk_tensor *eh = wk_tensor_set_find(set, wrk_names_hf.emb);
    const wrk_names *nm;
    bool hf;
    wrk_dims dm;
    wk_err e;
    char name[256];

    if (eb != NULL && eh != NULL)
        return wk_diag_set(d, WK_EINVAL, "%s and %s: both naming conventions in one checkpoint",
                           wrk_names_blink.emb, wrk_names_hf.emb);
    if (eb == NULL && eh == NULL)
        return wk_diag_set(d, WK_EINVAL,
                           "no embedding tensor (emb.weight or model.embeddings.weight): "
                           "not an RWKV-7 checkpoint");
    hf = eh != NULL;
    nm = hf ? &wrk_names_hf : &wrk_names_blink;
    r->convention = hf ? WRK_CONVENTION_HF : WRK_CONVENTION_BLINKDL;

    memset(&dm, 0, sizeof(dm));
    const wk_tensor *emb = hf ? eh : eb;
    if (emb->ndim != 2 || emb->shape[0] < 1 || emb->shape[1] < 1 ||
        emb->shape[0] > (int64_t)WRK_MAX_VOCAB || emb->shape[1] > (int64_t)WRK_MAX_EMBD) {
        char got[128];
        wrk_shape_str(emb, got, sizeof(got));
        return wk_diag_set(d, WK_EINVAL, "%s: shape %s, expected [V,C] (V <= %u, C <= %u)",
                           nm->emb, got, WRK_MAX_VOCAB, WRK_MAX_EMBD);
    }
    dm.V = (uint32_t)emb->shape[0];
    dm.C = (uint32_t)emb->shape[1];
    if ((e = wrk_scan_names(set, nm, &dm.L, d)) != WK_OK)
        return e;
    if ((e = wrk_read_dims(set, nm, hf, &dm, d)) != WK_OK)
        return e;

    v->layers = calloc(dm.L, sizeof(*v->layers));
    if (v->layers == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory (%u layers)", dm.L);

    for (uint32_t l = 0; l < dm.L; l++) {
        wrk_rwkv7_layer *ly = &v->layers[l];
        for (size_t s = 0; s < WRK_N_LAYER_SPECS; s++) {
            const spec *sp = &wrk_layer_specs[s];
            const wk_tensor *t =
                wrk_find_layer(set, nm, l, hf ? sp->hf : sp->blink, name, sizeof(name));
            if ((sp->flags & SPEC_F_VRES) && l == 0) {
                /* layer 0 keeps v_first; a stored value LoRA is checked, then ignored */
                if (t != NULL) {
                    wrk_mat scratch; /* big enough for a tensor pointer too */
                    if ((e = wrk_map_tensor(sp, hf, &dm, t, name, &scratch, d)) != WK_OK)
                        return e;
                }
                continue;
            }
            if (t == NULL)
                return wk_diag_set(d, WK_EINVAL, "%s: missing", name);
            if ((e = wrk_map_tensor(sp, hf, &dm, t, name, (char *)ly + sp->off, d)) != WK_OK)
                return e;
        }
    }

    /* globals */
    struct {
        const char *name;
        const wk_tensor **field;
    } vecs[] = {
        {nm->ln0_w, &r->ln0_w},
        {nm->ln0_b, &r->ln0_b},
        {nm->lnout_w, &r->lnout_w},
        {nm->lnout_b, &r->lnout_b},
    };
    for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]); i++) {
        const wk_tensor *t = wk_tensor_set_find(set, vecs[i].name);
        if (t == NULL)
            return wk_diag_set(d, WK_EINVAL, "%s: missing", vecs[i].name);
        if (!wrk_is_vec(t, dm.C))
            return wrk_shape_err_dims(d, vecs[i].name, t, dm.C, -1);
        *vecs[i].field = t;
    }
    /*
     * The head. BlinkDL checkpoints always store head.weight. HF (fla rwkv7):
     * config.json's tie_word_embeddings decides (default: false, as fla's
     * RWKV7Config; without config.json, the head's absence); tied, the head
     * is the embedding, as transformers ties lm_head to it.
     */
    const wk_tensor *head = wk_tensor_set_find(set, nm->head);
    bool tied = false;
    if (hf && (e = wrk_config_bool(config, "tie_word_embeddings",
                                   config == NULL && head == NULL, &tied, d)) != WK_OK)
        return e;
    if (tied && head != NULL)
        return wk_diag_set(d, WK_EINVAL,
                           "%s: present but config.json tie_word_embeddings is true", nm->head);
    if (!tied && head == NULL)
        return wk_diag_set(d, WK_EINVAL, hf ? "%s: missing (config.json tie_word_embeddings is "
                                              "false)"
                                            : "%s: missing",
                           nm->head);
    if (head != NULL && !wrk_is_mat(head, dm.V, dm.C))
        return wrk_shape_err_dims(d, nm->head, head, dm.V, dm.C);

    /*
     * Epsilons. BlinkDL: LayerNorm 1e-5, GroupNorm 64e-5 whatever the head
     * size (its training code divides by head_size_divisor 8 before the
     * GroupNorm of eps 1e-5, which inference folds into eps 1e-5 * 8^2).
     * HF (fla rwkv7): LayerNorms norm_eps, g_norm head_dim * norm_eps.
     */
    r->ln_eps = 1e-5;
    r->gn_eps = 64e-5;
    if (hf) {
        if ((e = wrk_config_f64(config, "norm_eps", 1e-5, &r->ln_eps, d)) != WK_OK)
            return e;
        if (!(r->ln_eps > 0.0 && r->ln_eps < 1.0))
            return wk_diag_set(d, WK_EINVAL, "config.json: norm_eps %g outside (0, 1)",
                               r->ln_eps);
        r->gn_eps = (double)dm.N * r->ln_eps;
    }

    r->emb = emb;
    r->tied = tied;
    r->head = (wrk_mat){tied ? emb : head, dm.C, dm.V, false};
    r->n_layer = dm.L;
    r->n_embd = dm.C;
    r->n_head = dm.H;
    r->head_size = dm.N;
    r->ffn_dim = dm.F;
    r->vocab_size = dm.V;
    r->lora_w = dm.lora[LORA_W];
    r->lora_a = dm.lora[LORA_A];
    r->lora_v = dm.L > 1 ? dm.lora[LORA_V] : 0; /* layer 0 never uses its value LoRA */
    r->lora_g = dm.lora[LORA_G];
    r->layers = v->layers;
    return WK_OK;
}

wk_err
wrk_rwkv7_layer_list(const wrk_rwkv7 *v, wrk_gdn **out, wk_diag *d)
{
    wrk_gdn *g = calloc(1, sizeof(*g) + sizeof(wrk_gdn_layer) * v->n_layer);
    if (g == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wrk_gdn_layer *layers = (wrk_gdn_layer *)(g + 1);
    g->n_layer = v->n_layer;
    g->n_embd = v->n_embd;
    g->ffn_dim = v->ffn_dim;
    g->vocab_size = v->vocab_size;
    g->norm_eps = v->ln_eps;
    g->emb = v->emb;
    g->head = v->head; /* tied: over the embedding already */
    g->layer_norm = true;
    g->emb_norm = v->ln0_w;
    g->emb_norm_b = v->ln0_b;
    g->norm = v->lnout_w;
    g->norm_b = v->lnout_b;
    g->rw = v;
    for (uint32_t l = 0; l < v->n_layer; l++) {
        const wrk_rwkv7_layer *s = &v->layers[l];
        layers[l].mixer = WRK_MIXER_RWKV7;
        layers[l].mlp = WRK_MLP_RWKV7;
        layers[l].attn_norm = s->ln1_w;
        layers[l].attn_norm_b = s->ln1_b;
        layers[l].mlp_norm = s->ln2_w;
        layers[l].mlp_norm_b = s->ln2_b;
        layers[l].rw = s;
    }
    g->layers = layers;
    *out = g;
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* the family                                                                */
/* ------------------------------------------------------------------------ */

static const char *const rw_types[] = {"rwkv7", NULL};

/* The family of last resort: every checkpoint no family before it took. */
static bool
rw_detect(const wk_tensor_set *set)
{
    (void)set;
    return true;
}

/*
 * Declares every used tensor in canonical order (the order and names the
 * weights digest has always had): the embedding, ln0, each layer's tensors
 * in table order (layer 0 without its value LoRA), ln_out, the head. A tied
 * head is the embedding declared a second time: not counted or hashed
 * again, and it follows the embedding to its fp32 copy.
 */
static wk_err
rw_declare(wrk_model *m, rw_view *v, wk_diag *d)
{
    wrk_rwkv7 *r = &v->r;
    const bool hf = r->convention == WRK_CONVENTION_HF;
    char name[96];
    wk_err e;

    if ((e = wrk_model_use(m, &r->emb, "emb.weight", false, false, d)) != WK_OK ||
        (e = wrk_model_use(m, &r->ln0_w, "blocks.0.ln0.weight", false, true, d)) != WK_OK ||
        (e = wrk_model_use(m, &r->ln0_b, "blocks.0.ln0.bias", false, true, d)) != WK_OK)
        return e;
    for (uint32_t l = 0; l < r->n_layer; l++) {
        wrk_rwkv7_layer *ly = &v->layers[l];
        for (size_t s = 0; s < WRK_N_LAYER_SPECS; s++) {
            const spec *sp = &wrk_layer_specs[s];
            char *field = (char *)ly + sp->off;
            if ((sp->flags & SPEC_F_VRES) && l == 0)
                continue;
            const bool vec = sp->kind == SPEC_VEC;
            const bool transpose = hf && (sp->kind == SPEC_LORA_IN || sp->kind == SPEC_LORA_OUT);
            const wk_tensor **tp = sp->kind == SPEC_VEC || sp->kind == SPEC_RK
                                       ? (const wk_tensor **)field
                                       : &((wrk_mat *)field)->t;
            snprintf(name, sizeof(name), "blocks.%u.%s", l, sp->blink);
            if ((e = wrk_model_use(m, tp, name, transpose, vec, d)) != WK_OK)
                return e;
        }
    }
    if ((e = wrk_model_use(m, &r->lnout_w, "ln_out.weight", false, true, d)) != WK_OK ||
        (e = wrk_model_use(m, &r->lnout_b, "ln_out.bias", false, true, d)) != WK_OK)
        return e;
    return wrk_model_use(m, &r->head.t, "head.weight", false, false, d);
}

static void
rw_free_view(void *view)
{
    rw_view *v = view;
    if (v == NULL)
        return;
    free(v->layers);
    free(v);
}

static wk_err
rw_map(wrk_model *m, const wk_tensor_set *set, const json_t *config, void **view,
       wrk_model_info *in, wk_diag *d)
{
    rw_view *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wk_err e = wrk_map_rwkv7(v, set, config, d);
    if (e == WK_OK)
        e = rw_declare(m, v, d);
    if (e != WK_OK) {
        rw_free_view(v);
        return e;
    }
    const wrk_rwkv7 *r = &v->r;
    in->n_layer = r->n_layer;
    in->n_embd = r->n_embd;
    in->n_head = r->n_head;
    in->head_size = r->head_size;
    in->ffn_dim = r->ffn_dim;
    in->vocab_size = r->vocab_size;
    in->state_bytes = (uint64_t)r->n_layer *
                      (2ull * r->n_embd + (uint64_t)r->n_head * r->head_size * r->head_size) * 4u;
    *view = v;
    return WK_OK;
}

/* Per layer: att_shift [C], ffn_shift [C], wkv [H, N, N]. */
static size_t
rw_layout(const void *view, wrk_state_tensor *out, size_t cap)
{
    const wrk_rwkv7 *r = view;
    size_t n = (size_t)r->n_layer * 3;
    for (uint32_t l = 0; out != NULL && l < r->n_layer; l++) {
        static const char *const nm[3] = {"att_shift", "ffn_shift", "wkv"};
        for (uint32_t k = 0; k < 3 && 3 * (size_t)l + k < cap; k++) {
            wrk_state_tensor *t = &out[3 * l + k];
            memset(t, 0, sizeof(*t));
            snprintf(t->name, sizeof(t->name), "layers.%u.%s", l, nm[k]);
            if (k < 2) {
                t->ndim = 1;
                t->shape[0] = r->n_embd;
            } else {
                t->ndim = 3;
                t->shape[0] = r->n_head;
                t->shape[1] = r->head_size;
                t->shape[2] = r->head_size;
            }
        }
    }
    return n;
}

/*
 * RWKV-7's fingerprint text predates the generic one (it names the LoRA
 * ranks, not the state bytes) and stays as it was, so the states and
 * checkpoints made before keep loading.
 */
static int
rw_fingerprint(const void *view, const wrk_model_info *in, char *buf, size_t len)
{
    const wrk_rwkv7 *r = view;
    char extra[512] = "";
    /*
     * What changes the math beyond shapes and weights, only where it
     * differs from what every fingerprint before it implied (untied,
     * LayerNorm 1e-5, GroupNorm N * 1e-5), so those stay valid.
     */
    if (r->tied || r->ln_eps != 1e-5 || r->gn_eps != (double)r->head_size * 1e-5)
        snprintf(extra, sizeof(extra), "rwkv7.tied=%d\nrwkv7.ln_eps=%.17g\n"
                 "rwkv7.gn_eps=%.17g\n", r->tied, r->ln_eps, r->gn_eps);
    return snprintf(buf, len,
                    "wkvm-fingerprint-v1\nfamily=%s\nn_layer=%u\nn_embd=%u\nn_head=%u\n"
                    "head_size=%u\nffn_dim=%u\nvocab_size=%u\nlora=%u,%u,%u,%u\n%sdtype=%s\n"
                    "weights=%s\nvocab=%s\n",
                    in->family, r->n_layer, r->n_embd, r->n_head, r->head_size, r->ffn_dim,
                    r->vocab_size, r->lora_w, r->lora_a, r->lora_v, r->lora_g, extra,
                    wk_dtype_name(in->dtype), in->weights_digest, in->vocab_digest);
}

/*
 * --quantize q8_0, as llama.cpp's convert_hf_to_gguf.py --outtype q8_0
 * does: the projections (r, k, v, o), the channel mix (key, value), the
 * ICLR, value-residual and gate LoRAs and the head. Kept in their dtype, as
 * llama.cpp keeps them in F32: the decay LoRA (w1, w2: the decay is
 * exp(-exp(..)), sensitive to every bit), vectors and norms. The embedding
 * stays too (llama.cpp quantizes token_embd, but wkvm only reads one row
 * of it per token, so it costs no bandwidth).
 */
static size_t
rw_quant_mats(void *view, wrk_mat **out, size_t cap)
{
    rw_view *v = view;
    size_t n = 0;
    for (uint32_t l = 0; l < v->r.n_layer; l++) {
        wrk_rwkv7_layer *ly = &v->layers[l];
        wrk_mat *mats[] = {&ly->wr, &ly->wk, &ly->wv, &ly->wo, &ly->a1, &ly->a2,
                           &ly->v1, &ly->v2, &ly->g1, &ly->g2, &ly->ffn_key, &ly->ffn_value};
        for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++, n++)
            if (out != NULL && n < cap)
                out[n] = mats[i];
    }
    if (out != NULL && n < cap)
        out[n] = &v->r.head;
    return n + 1;
}

const wrk_family wrk_family_rwkv7 = {
    .name = "rwkv7",
    .model_types = rw_types,
    .detect = rw_detect,
    .checks_names = true,
    .map = rw_map,
    .free_view = rw_free_view,
    .state_layout = rw_layout,
    .fingerprint = rw_fingerprint,
    .quant_mats = rw_quant_mats,
};

const wrk_rwkv7 *
wrk_model_rwkv7(const wrk_model *m)
{
    return wrk_model_view(m, "rwkv7");
}
