/*
 * wrk_model: loads a model directory into host memory, for any family.
 *
 * RWKV-7 ("x070") is mapped here; other families plug in through
 * family/wrk_family.h (family/wrk_<name>.c) and this module does the generic parts for
 * them: config.json, family detection, the unknown-tensor check, the
 * parameter count, the weights digest, --fp32 and the tokenizer.
 *
 * The checkpoint is found by fixed rules (wrk_model_find_checkpoint), opened
 * through wk_tensor (safetensors, sharded index, .pth) or wrk_gguf (a
 * llama.cpp RWKV-7 .gguf, presented under the HF names) and mapped onto one
 * family view (wrk_rwkv7) whatever its naming convention: BlinkDL
 * (emb.weight, blocks.N.att.*) or Hugging Face fla-hub rwkv7
 * (model.embeddings.weight, model.layers.N.attn.*). Every dimension is read
 * from tensor shapes; every tensor's presence and shape is checked, and an
 * inconsistent checkpoint is refused with a diag that names the tensor.
 * Unknown tensor names are refused too: a checkpoint we do not fully
 * understand is not run.
 *
 * Weights stay where the tensor set maps them, in their stored dtype, unless
 * fp32 is asked for (then owned fp32 copies are made) or Q8_0 (then owned
 * Q8_0 copies of the RWKV-7 matrices are made, stored [n_out][n_in] so the
 * blocks run along the input dim, with wk_q8_0_quantize_row, the bytes
 * llama.cpp's converter writes for the same fp32 values; which matrices:
 * wrk_quantize_q8_0). Q8_0 tensors from a GGUF stay Q8_0. Backends build their
 * own layouts from the view. This module never logs and never aborts on bad
 * input.
 */
#include "wrk_model.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "wk_file.h"
#include "wk_sha256.h"
#include "wk_tok.h"
#include "wrk_family.h"
#include "wrk_gguf.h"

#define WRK_PATH_MAX 4096
#define WRK_CONFIG_MAX (1u << 20) /* bytes of a config.json */

/* Limits on dimensions read from a (hostile) checkpoint. */
#define WRK_MAX_LAYERS 4096u
#define WRK_MAX_EMBD (1u << 17)
#define WRK_MAX_FFN (1u << 20)
#define WRK_MAX_VOCAB (1u << 22)
#define WRK_MAX_LORA (1u << 16)

struct wrk_model {
    wrk_model_info info;     /* what the rest of the worker sees */
    wk_tensor_set *set;      /* the opened checkpoint, owns the mappings */
    wrk_rwkv7 rwkv7;         /* family view; points into set or owned */
    wrk_rwkv7_layer *layers; /* n_layer entries, owned */
    wk_tensor *owned;        /* fp32 or Q8_0 copies (opts), owned; names borrowed */
    size_t n_owned;          /* entries used in owned */
    size_t cap_owned;        /* entries allocated in owned */
    wk_tok *tok;             /* tokenizer, NULL when no vocab file */
    const wrk_family *fam;   /* the family, NULL for RWKV-7 (mapped here) */
    void *view;              /* the family's view, owned via fam->free_view */
    json_t *config;          /* config.json, NULL when absent; owned */
    struct wrk_use *uses;    /* tensors the family declared, owned */
    size_t n_uses, cap_uses; /* entries used / allocated in uses */
    const wk_tensor **skips; /* tensors the family skipped (wrk_model_skip), owned array */
    size_t n_skips, cap_skips; /* entries used / allocated in skips */
};

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

/* ------------------------------------------------------------------------ */
/* small helpers                                                             */
/* ------------------------------------------------------------------------ */

void
wrk_shape_str(const wk_tensor *t, char *buf, size_t len)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < t->ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, i ? "," : "", t->shape[i]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
}

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

bool
wrk_is_vec(const wk_tensor *t, int64_t n)
{
    if (t->ndim < 1 || t->shape[t->ndim - 1] != n)
        return false;
    for (int i = 0; i + 1 < t->ndim; i++)
        if (t->shape[i] != 1)
            return false;
    return true;
}

bool
wrk_is_mat(const wk_tensor *t, int64_t d0, int64_t d1)
{
    return t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1;
}

long
wrk_layer_parse(const char *s, long limit, const char **rest)
{
    long v = 0;
    const char *p = s;
    if (*p < '0' || *p > '9')
        return -1;
    if (*p == '0' && p[1] != '.')
        return -1; /* no leading zeros: one spelling per layer */
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v >= limit)
            return -1;
        p++;
    }
    if (*p != '.')
        return -1;
    if (rest != NULL)
        *rest = p + 1;
    return v;
}

static int
wrk_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* ------------------------------------------------------------------------ */
/* finding the files                                                         */
/* ------------------------------------------------------------------------ */

static bool
wrk_has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static bool
wrk_is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static wk_err
wrk_join(char *out, size_t len, const char *dir, const char *name, wk_diag *d)
{
    if ((size_t)snprintf(out, len, "%s/%s", dir, name) >= len)
        return wk_diag_set(d, WK_ETOOBIG, "%s/%s: path too long", dir, name);
    return WK_OK;
}

wk_err
wrk_model_find_checkpoint(const char *dir, char *out, size_t out_len, wk_diag *d)
{
    char path[WRK_PATH_MAX];
    wk_err e;
    static const char *const fixed[] = {"model.safetensors.index.json", "model.safetensors"};

    if (dir == NULL || out == NULL || out_len == 0)
        return wk_diag_set(d, WK_EINVAL, "no model directory given");
    if (wrk_is_file(dir)) { /* --model FILE: that checkpoint itself */
        if (!wrk_has_suffix(dir, ".gguf") && !wrk_has_suffix(dir, ".pth") &&
            !wrk_has_suffix(dir, ".safetensors") &&
            !wrk_has_suffix(dir, "model.safetensors.index.json"))
            return wk_diag_set(d, WK_EINVAL,
                               "model file %s: not a checkpoint (a .gguf, .pth or .safetensors "
                               "file, or a directory holding one)",
                               dir);
        if (strlen(dir) >= out_len)
            return wk_diag_set(d, WK_ETOOBIG, "%s: path too long", dir);
        snprintf(out, out_len, "%s", dir);
        return WK_OK;
    }
    for (size_t i = 0; i < 2; i++) {
        if ((e = wrk_join(path, sizeof(path), dir, fixed[i], d)) != WK_OK)
            return e;
        if (wrk_is_file(path))
            goto found;
    }

    DIR *dh = opendir(dir);
    if (dh == NULL) {
        int err = errno;
        return wk_diag_set(d, err == ENOENT || err == ENOTDIR ? WK_ENOENT : WK_EIO,
                           "model directory %s: %s", dir, strerror(err));
    }
    /* Up to 8 names per kind are kept for the message; all are counted. */
    char *names[3][8] = {{0}};
    size_t count[3] = {0, 0, 0};
    static const char *const sufs[3] = {".safetensors", ".pth", ".gguf"};
    struct dirent *de;
    e = WK_OK;
    while ((de = readdir(dh)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        for (int k = 0; k < 3; k++) {
            if (!wrk_has_suffix(de->d_name, sufs[k]))
                continue;
            if (wrk_join(path, sizeof(path), dir, de->d_name, NULL) != WK_OK ||
                !wrk_is_file(path))
                continue;
            if (count[k] < 8) {
                names[k][count[k]] = strdup(de->d_name);
                if (names[k][count[k]] == NULL)
                    e = WK_ENOMEM;
            }
            count[k]++;
        }
    }
    closedir(dh);
    if (e == WK_OK) {
        e = WK_ENOENT;
        for (int k = 0; k < 3; k++) {
            if (count[k] == 0)
                continue;
            size_t shown = count[k] < 8 ? count[k] : 8;
            qsort(names[k], shown, sizeof(char *), wrk_cmp_str);
            if (count[k] == 1) {
                e = wrk_join(path, sizeof(path), dir, names[k][0], d);
                break;
            }
            char list[400];
            size_t o = 0;
            for (size_t i = 0; i < shown && o < sizeof(list); i++)
                o += (size_t)snprintf(list + o, sizeof(list) - o, "%s%s", i ? ", " : "",
                                      names[k][i]);
            if (count[k] > shown && o < sizeof(list))
                snprintf(list + o, sizeof(list) - o, ", ...");
            e = wk_diag_set(d, WK_EINVAL, "%s: %zu *%s checkpoints (%s); keep exactly one",
                            dir, count[k], sufs[k], list);
            break;
        }
        if (e == WK_ENOENT)
            wk_diag_set(d, WK_ENOENT,
                        "%s: no checkpoint (model.safetensors.index.json, model.safetensors, "
                        "*.safetensors, *.pth or *.gguf)",
                        dir);
    } else {
        wk_diag_set(d, e, "out of memory listing %s", dir);
    }
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < 8; i++)
            free(names[k][i]);
    if (e != WK_OK)
        return e;

found:
    if (strlen(path) + 1 > out_len)
        return wk_diag_set(d, WK_ETOOBIG, "%s: path too long", path);
    memcpy(out, path, strlen(path) + 1);
    return WK_OK;
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
wrk_map_rwkv7(wrk_model *m, wk_diag *d)
{
    const wk_tensor_set *set = m->set;
    wrk_rwkv7 *r = &m->rwkv7;
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

    m->layers = calloc(dm.L, sizeof(*m->layers));
    if (m->layers == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory (%u layers)", dm.L);

    for (uint32_t l = 0; l < dm.L; l++) {
        wrk_rwkv7_layer *ly = &m->layers[l];
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
    if (hf && (e = wrk_config_bool(m->config, "tie_word_embeddings",
                                   m->config == NULL && head == NULL, &tied, d)) != WK_OK)
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
        if ((e = wrk_config_f64(m->config, "norm_eps", 1e-5, &r->ln_eps, d)) != WK_OK)
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
    r->layers = m->layers;
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* visiting every used tensor in canonical order                             */
/* ------------------------------------------------------------------------ */

/*
 * One used tensor, as the canonical (BlinkDL-orientation) form sees it:
 * canonical name, the stored tensor, and whether its elements must be
 * transposed (HF LoRA) to get the canonical element order.
 */
typedef struct wrk_visit {
    char name[96];        /* canonical name ("blocks.3.att.w1") */
    const wk_tensor **tp; /* where the model points at the tensor (replaceable) */
    bool transpose;       /* stored [a, b], canonical [b, a] */
    bool vec;             /* canonical shape is [numel] */
} wrk_visit;

typedef wk_err (*wrk_visit_fn)(wrk_model *m, const wrk_visit *v, void *arg);

/* A tensor a family declared with wrk_model_use(). */
typedef struct wrk_use {
    wrk_visit v;            /* name, field, orientation */
    const wk_tensor *orig;  /* the stored tensor declared */
    const wk_tensor *parent; /* the stored tensor orig is a part of (wrk_model_use_part), or NULL */
    bool dup;               /* the same tensor was declared before under another field */
} wrk_use;

wk_err
wrk_model_use(wrk_model *m, const wk_tensor **field, const char *name, bool transpose, bool vec,
              wk_diag *d)
{
    if (field == NULL || *field == NULL || name == NULL)
        return wk_diag_set(d, WK_EINVAL, "wrk_model_use: NULL tensor");
    if (m->n_uses == m->cap_uses) {
        size_t cap = m->cap_uses ? 2 * m->cap_uses : 64;
        wrk_use *u = realloc(m->uses, cap * sizeof(*u));
        if (u == NULL)
            return wk_diag_set(d, WK_ENOMEM, "out of memory declaring %s", name);
        m->uses = u;
        m->cap_uses = cap;
    }
    wrk_use *u = &m->uses[m->n_uses];
    memset(u, 0, sizeof(*u));
    snprintf(u->v.name, sizeof(u->v.name), "%s", name);
    u->v.tp = field;
    u->v.transpose = transpose;
    u->v.vec = vec;
    u->orig = *field;
    for (size_t i = 0; i < m->n_uses; i++)
        if (*m->uses[i].v.tp == *field)
            u->dup = true;
    m->n_uses++;
    return WK_OK;
}

wk_err
wrk_model_use_part(wrk_model *m, const wk_tensor **field, const char *name, bool vec,
                   const wk_tensor *parent, wk_diag *d)
{
    if (parent == NULL)
        return wk_diag_set(d, WK_EINVAL, "wrk_model_use_part: NULL parent");
    wk_err e = wrk_model_use(m, field, name, false, vec, d);
    if (e == WK_OK)
        m->uses[m->n_uses - 1].parent = parent;
    return e;
}

wk_err
wrk_model_skip(wrk_model *m, const wk_tensor *t, wk_diag *d)
{
    if (t == NULL)
        return wk_diag_set(d, WK_EINVAL, "wrk_model_skip: NULL tensor");
    if (m->n_skips == m->cap_skips) {
        size_t cap = m->cap_skips ? 2 * m->cap_skips : 64;
        const wk_tensor **p = realloc(m->skips, cap * sizeof(*p));
        if (p == NULL)
            return wk_diag_set(d, WK_ENOMEM, "out of memory skipping %s", t->name);
        m->skips = p;
        m->cap_skips = cap;
    }
    m->skips[m->n_skips++] = t;
    m->info.n_skipped++;
    return WK_OK;
}

static wk_err
wrk_visit_all(wrk_model *m, wrk_visit_fn fn, void *arg)
{
    if (m->fam != NULL) {
        for (size_t i = 0; i < m->n_uses; i++) {
            wk_err e;
            if (!m->uses[i].dup && (e = fn(m, &m->uses[i].v, arg)) != WK_OK)
                return e;
        }
        return WK_OK;
    }
    wrk_rwkv7 *r = &m->rwkv7;
    bool hf = r->convention == WRK_CONVENTION_HF;
    wrk_visit v;
    wk_err e;

#define VISIT(ptr, nmfmt, ...)                                                 \
    do {                                                                       \
        snprintf(v.name, sizeof(v.name), nmfmt, __VA_ARGS__);                  \
        v.tp = (ptr);                                                          \
        if ((e = fn(m, &v, arg)) != WK_OK)                                     \
            return e;                                                          \
    } while (0)

    v.transpose = false;
    v.vec = false;
    VISIT(&r->emb, "%s", "emb.weight");
    v.vec = true;
    VISIT(&r->ln0_w, "%s", "blocks.0.ln0.weight");
    VISIT(&r->ln0_b, "%s", "blocks.0.ln0.bias");
    for (uint32_t l = 0; l < r->n_layer; l++) {
        wrk_rwkv7_layer *ly = &m->layers[l];
        for (size_t s = 0; s < WRK_N_LAYER_SPECS; s++) {
            const spec *sp = &wrk_layer_specs[s];
            char *field = (char *)ly + sp->off;
            if ((sp->flags & SPEC_F_VRES) && l == 0)
                continue;
            v.vec = sp->kind == SPEC_VEC;
            v.transpose = hf && (sp->kind == SPEC_LORA_IN || sp->kind == SPEC_LORA_OUT);
            const wk_tensor **tp = sp->kind == SPEC_VEC || sp->kind == SPEC_RK
                                       ? (const wk_tensor **)field
                                       : &((wrk_mat *)field)->t;
            VISIT(tp, "blocks.%u.%s", l, sp->blink);
        }
    }
    v.transpose = false;
    v.vec = true;
    VISIT(&r->lnout_w, "%s", "ln_out.weight");
    VISIT(&r->lnout_b, "%s", "ln_out.bias");
    v.vec = false;
    if (!r->tied) /* tied: the head is emb.weight, visited above */
        VISIT(&r->head.t, "%s", "head.weight");
#undef VISIT
    return WK_OK;
}

/* counting */
typedef struct wrk_count {
    uint64_t params;           /* elements */
    uint64_t bytes_by_dtype[WK_DTYPE_COUNT]; /* stored bytes per wk_dtype */
    size_t n;                  /* tensors */
} wrk_count;

static wk_err
wrk_visit_count(wrk_model *m, const wrk_visit *v, void *arg)
{
    wrk_count *c = arg;
    const wk_tensor *t = *v->tp;
    (void)m;
    c->params += (uint64_t)wk_tensor_numel(t);
    if ((unsigned)t->dtype < WK_DTYPE_COUNT)
        c->bytes_by_dtype[t->dtype] += t->nbytes;
    c->n++;
    return WK_OK;
}

/* digest */
typedef struct wrk_digest {
    wk_sha256 sha; /* running digest */
    uint8_t *tmp;  /* transpose buffer */
    size_t tmp_len; /* bytes in tmp */
    const wrk_model_opts *opts; /* progress callback, may be NULL */
    uint64_t total;  /* weight bytes to read */
    uint64_t done;   /* weight bytes read */
} wrk_digest;

static wk_err
wrk_visit_digest(wrk_model *m, const wrk_visit *v, void *arg)
{
    wrk_digest *g = arg;
    const wk_tensor *t = *v->tp;
    char hdr[256];
    int64_t numel = wk_tensor_numel(t);
    int n;
    (void)m;

    /* Q8_0 blocks cannot be transposed element by element: hashed as stored */
    const bool transpose = v->transpose && t->dtype != WK_DTYPE_Q8_0;
    if (v->vec)
        n = snprintf(hdr, sizeof(hdr), "%s|%s|[%" PRId64 "]|", v->name, wk_dtype_name(t->dtype),
                     numel);
    else if (transpose)
        n = snprintf(hdr, sizeof(hdr), "%s|%s|[%" PRId64 ",%" PRId64 "]|", v->name,
                     wk_dtype_name(t->dtype), t->shape[1], t->shape[0]);
    else
        n = snprintf(hdr, sizeof(hdr), "%s|%s|[%" PRId64 ",%" PRId64 "]|", v->name,
                     wk_dtype_name(t->dtype), t->shape[0], t->shape[1]);
    wk_sha256_update(&g->sha, hdr, (size_t)n);
    g->done += t->nbytes;
    if (g->opts != NULL && g->opts->progress != NULL && g->total > 0)
        g->opts->progress(g->opts->progress_arg, "reading weights",
                          (double)g->done / (double)g->total);
    if (!transpose) {
        wk_sha256_update(&g->sha, t->data, t->nbytes);
        return WK_OK;
    }
    /* stored [a, b] -> canonical [b, a] */
    size_t a = (size_t)t->shape[0], b = (size_t)t->shape[1], es = wk_dtype_size(t->dtype);
    if (t->nbytes > g->tmp_len) {
        uint8_t *p = realloc(g->tmp, t->nbytes);
        if (p == NULL)
            return WK_ENOMEM;
        g->tmp = p;
        g->tmp_len = t->nbytes;
    }
    const uint8_t *src = t->data;
    for (size_t i = 0; i < a; i++)
        for (size_t j = 0; j < b; j++)
            memcpy(g->tmp + (j * a + i) * es, src + (i * b + j) * es, es);
    wk_sha256_update(&g->sha, g->tmp, t->nbytes);
    return WK_OK;
}

/* fp32 conversion */
static wk_err
wrk_visit_fp32(wrk_model *m, const wrk_visit *v, void *arg)
{
    const wk_tensor *t = *v->tp;
    (void)arg;
    if (t->dtype == WK_DTYPE_F32)
        return WK_OK;
    if (m->n_owned == m->cap_owned)
        return WK_EINVAL; /* counted beforehand; cannot happen */
    size_t numel = (size_t)wk_tensor_numel(t);
    float *buf = malloc(numel * sizeof(float) + 1);
    if (buf == NULL)
        return WK_ENOMEM;
    wk_err e = wk_tensor_read_f32(t, 0, numel, buf);
    if (e != WK_OK) {
        free(buf);
        return e;
    }
    wk_tensor *o = &m->owned[m->n_owned++];
    *o = *t;
    o->dtype = WK_DTYPE_F32;
    o->data = buf;
    o->nbytes = numel * sizeof(float);
    *v->tp = o;
    return WK_OK;
}

/*
 * --quantize q8_0: replaces one matrix by an owned Q8_0 copy stored
 * [n_out][n_in] (in_major cleared). Skips a matrix already Q8_0 or whose
 * n_in is not a multiple of 32 (it stays in its dtype).
 */
static wk_err
wrk_quantize_mat(wrk_model *m, wrk_mat *w, wk_diag *d)
{
    const wk_tensor *t = w->t;
    if (t == NULL || t->dtype == WK_DTYPE_Q8_0 || w->n_in % WK_Q8_0_BLOCK != 0)
        return WK_OK;
    if (m->n_owned == m->cap_owned)
        return wk_diag_set(d, WK_EINVAL, "%s: more matrices than counted", t->name);
    const size_t K = w->n_in, N = w->n_out, row_bytes = K / WK_Q8_0_BLOCK * WK_Q8_0_BYTES;
    uint8_t *q = malloc(N * row_bytes);
    float *row = malloc(K * sizeof(float));
    if (q == NULL || row == NULL) {
        free(q);
        free(row);
        return wk_diag_set(d, WK_ENOMEM, "out of memory quantizing %s", t->name);
    }
    wk_err e = WK_OK;
    for (size_t c = 0; c < N && e == WK_OK; c++) {
        if (w->in_major) {
            for (size_t k = 0; k < K && e == WK_OK; k++)
                e = wk_tensor_read_f32(t, k * N + c, 1, row + k);
        } else {
            e = wk_tensor_read_f32(t, c * K, K, row);
        }
        if (e == WK_OK)
            e = wk_q8_0_quantize_row(row, K, q + c * row_bytes);
    }
    free(row);
    if (e != WK_OK) {
        free(q);
        return wk_diag_set(d, e, "%s: cannot quantize to Q8_0", t->name);
    }
    wk_tensor *o = &m->owned[m->n_owned++];
    *o = *t;
    o->dtype = WK_DTYPE_Q8_0;
    o->ndim = 2;
    o->shape[0] = (int64_t)N;
    o->shape[1] = (int64_t)K;
    o->data = q;
    o->nbytes = N * row_bytes;
    w->t = o;
    w->in_major = false;
    return WK_OK;
}

/*
 * Quantizes the RWKV-7 matrices to Q8_0 as llama.cpp's convert_hf_to_gguf.py
 * --outtype q8_0 does: the projections (r, k, v, o), the channel mix (key,
 * value), the ICLR, value-residual and gate LoRAs and the head. Kept in
 * their dtype, as llama.cpp keeps them in F32: the decay LoRA (w1, w2: the
 * decay is exp(-exp(..)), sensitive to every bit), vectors and norms. The
 * embedding stays too (llama.cpp quantizes token_embd, but wkvm only reads
 * one row of it per token, so it costs no bandwidth). Other families: the
 * matrices their quant_mats hook names (projections and the head).
 */
static wk_err
wrk_quantize_q8_0(wrk_model *m, wk_diag *d)
{
    wrk_mat **fam_mats = NULL;
    size_t n_fam = 0;
    if (m->fam != NULL) {
        if (m->fam->quant_mats == NULL)
            return wk_diag_set(d, WK_ENOTSUP, "--quantize q8_0: not for %s checkpoints",
                               m->fam->name);
        n_fam = m->fam->quant_mats(m->view, NULL, 0);
        fam_mats = calloc(n_fam ? n_fam : 1, sizeof(*fam_mats));
        if (fam_mats == NULL)
            return wk_diag_set(d, WK_ENOMEM, "out of memory");
        n_fam = m->fam->quant_mats(m->view, fam_mats, n_fam);
        m->cap_owned = n_fam;
    } else {
        m->cap_owned = (size_t)m->rwkv7.n_layer * 12 + 1;
    }
    m->owned = calloc(m->cap_owned ? m->cap_owned : 1, sizeof(*m->owned));
    if (m->owned == NULL) {
        free(fam_mats);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    wk_err e = WK_OK;
    if (m->fam != NULL) {
        for (size_t i = 0; i < n_fam && e == WK_OK; i++)
            e = wrk_quantize_mat(m, fam_mats[i], d);
        free(fam_mats);
        return e;
    }
    wrk_rwkv7 *r = &m->rwkv7;
    for (uint32_t l = 0; l < r->n_layer; l++) {
        wrk_rwkv7_layer *ly = &m->layers[l];
        wrk_mat *mats[] = {&ly->wr, &ly->wk,     &ly->wv,        &ly->wo, &ly->a1, &ly->a2,
                           &ly->v1, &ly->v2,     &ly->g1,        &ly->g2, &ly->ffn_key,
                           &ly->ffn_value};
        for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++)
            if ((e = wrk_quantize_mat(m, mats[i], d)) != WK_OK)
                return e;
    }
    return wrk_quantize_mat(m, &r->head, d);
}

/* ------------------------------------------------------------------------ */
/* public                                                                    */
/* ------------------------------------------------------------------------ */

static wk_err
wrk_model_fingerprint(wrk_model *m)
{
    wrk_model_info *in = &m->info;
    char buf[2048], extra[512] = "";
    int n;
    if (m->fam == NULL) {
        const wrk_rwkv7 *r = &m->rwkv7;
        /*
         * What changes the math beyond shapes and weights, only where it
         * differs from what every fingerprint before it implied (untied,
         * LayerNorm 1e-5, GroupNorm N * 1e-5), so those stay valid.
         */
        if (r->tied || r->ln_eps != 1e-5 || r->gn_eps != (double)r->head_size * 1e-5)
            snprintf(extra, sizeof(extra), "rwkv7.tied=%d\nrwkv7.ln_eps=%.17g\n"
                     "rwkv7.gn_eps=%.17g\n", r->tied, r->ln_eps, r->gn_eps);
        n = snprintf(buf, sizeof(buf),
                     "wkvm-fingerprint-v1\nfamily=%s\nn_layer=%u\nn_embd=%u\nn_head=%u\n"
                     "head_size=%u\nffn_dim=%u\nvocab_size=%u\nlora=%u,%u,%u,%u\n%sdtype=%s\n"
                     "weights=%s\nvocab=%s\n",
                     in->family, r->n_layer, r->n_embd, r->n_head, r->head_size, r->ffn_dim,
                     r->vocab_size, r->lora_w, r->lora_a, r->lora_v, r->lora_g, extra,
                     wk_dtype_name(in->dtype), in->weights_digest, in->vocab_digest);
    } else {
        if (m->fam->fingerprint_extra != NULL)
            m->fam->fingerprint_extra(m->view, extra, sizeof(extra));
        n = snprintf(buf, sizeof(buf),
                     "wkvm-fingerprint-v1\nfamily=%s\nn_layer=%u\nn_embd=%u\nn_head=%u\n"
                     "head_size=%u\nffn_dim=%u\nvocab_size=%u\nstate_bytes=%llu\n%s\ndtype=%s\n"
                     "weights=%s\nvocab=%s\n",
                     in->family, in->n_layer, in->n_embd, in->n_head, in->head_size, in->ffn_dim,
                     in->vocab_size, (unsigned long long)in->state_bytes, extra,
                     wk_dtype_name(in->dtype), in->weights_digest, in->vocab_digest);
    }
    if (n < 0 || (size_t)n >= sizeof(buf))
        return WK_EINVAL;
    wk_sha256_hex(buf, (size_t)n, in->fingerprint);
    return WK_OK;
}

static wk_err
wrk_model_load_vocab(wrk_model *m, const char *dir, const wrk_model_opts *opts, wk_diag *d)
{
    const char *vp = opts != NULL ? opts->vocab_path : NULL;
    wk_err e = wk_tok_load_dir(dir, vp, &m->tok, d);
    if (e == WK_ENOENT && vp == NULL) {
        m->tok = NULL;
        return WK_OK; /* no tokenizer: token ids only */
    }
    if (e != WK_OK)
        return e;
    if (wk_tok_vocab_size(m->tok) > m->info.vocab_size)
        return wk_diag_set(d, WK_EINVAL,
                           "%s: the tokenizer defines ids up to %u but the model has %u rows",
                           vp != NULL ? vp : dir, wk_tok_vocab_size(m->tok) - 1,
                           m->info.vocab_size);
    snprintf(m->info.vocab_digest, sizeof(m->info.vocab_digest), "%s", wk_tok_digest(m->tok));
    return WK_OK;
}

/* Reads dir/config.json into *out (NULL when there is none). */
static wk_err
wrk_model_read_config(const char *dir, json_t **out, wk_diag *d)
{
    char path[WRK_PATH_MAX];
    wk_err e;
    *out = NULL;
    if ((e = wrk_join(path, sizeof(path), dir, "config.json", d)) != WK_OK)
        return e;
    if (!wrk_is_file(path))
        return WK_OK;
    /*
     * transformers writes Python's float('inf') as a bare Infinity (not
     * JSON): such tokens outside strings become +-1e308, NaN becomes null.
     */
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return wk_diag_set(d, WK_EIO, "%s: cannot open", path);
    char *raw = malloc(WRK_CONFIG_MAX + 1);
    size_t n = raw != NULL ? fread(raw, 1, WRK_CONFIG_MAX + 1, f) : 0;
    fclose(f);
    if (raw == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory reading %s", path);
    if (n > WRK_CONFIG_MAX) {
        free(raw);
        return wk_diag_set(d, WK_ETOOBIG, "%s: over %u bytes", path, WRK_CONFIG_MAX);
    }
    char *txt = malloc(2 * n + 1); /* "NaN" -> "null", "Infinity" -> "1e308": never longer x2 */
    if (txt == NULL) {
        free(raw);
        return wk_diag_set(d, WK_ENOMEM, "out of memory reading %s", path);
    }
    size_t o = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = raw[i];
        if (in_str) {
            txt[o++] = c;
            if (c == '\\' && i + 1 < n)
                txt[o++] = raw[++i];
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
            txt[o++] = c;
        } else if (n - i >= 8 && memcmp(raw + i, "Infinity", 8) == 0) {
            memcpy(txt + o, "1e308", 5);
            o += 5;
            i += 7;
        } else if (n - i >= 3 && memcmp(raw + i, "NaN", 3) == 0) {
            memcpy(txt + o, "null", 4);
            o += 4;
            i += 2;
        } else {
            txt[o++] = c;
        }
    }
    free(raw);
    json_error_t je;
    json_t *j = json_loadb(txt, o, JSON_REJECT_DUPLICATES, &je);
    free(txt);
    if (j == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: line %d: %s", path, je.line, je.text);
    if (!json_is_object(j)) {
        json_decref(j);
        return wk_diag_set(d, WK_EINVAL, "%s: not a JSON object", path);
    }
    *out = j;
    return WK_OK;
}

/* nemotron_h before mamba2: both name tensors backbone.*, only Nemotron-H has non-Mamba2 layers */
static const wrk_family *const wrk_families[] = {&wrk_family_nemotron_h, &wrk_family_mamba2,
                                                 &wrk_family_gdn, &wrk_family_qwen3_5,
                                                 &wrk_family_granite_h};
#define WRK_N_FAMILIES (sizeof(wrk_families) / sizeof(wrk_families[0]))

/*
 * Picks the family: config.json's model_type when it names one (an unknown
 * model_type is refused), else the first family whose tensor names match,
 * else RWKV-7 (*out NULL), whose mapper explains what it did not find.
 */
static wk_err
wrk_model_pick_family(const wk_tensor_set *set, const json_t *config, const wrk_family **out,
                      wk_diag *d)
{
    *out = NULL;
    const json_t *mt = config != NULL ? json_object_get(config, "model_type") : NULL;
    if (mt != NULL && json_is_string(mt)) {
        const char *t = json_string_value(mt);
        if (strcmp(t, "rwkv7") == 0)
            return WK_OK;
        for (size_t i = 0; i < WRK_N_FAMILIES; i++)
            for (const char *const *p = wrk_families[i]->model_types; *p != NULL; p++)
                if (strcmp(*p, t) == 0) {
                    *out = wrk_families[i];
                    return WK_OK;
                }
        return wk_diag_set(d, WK_ENOTSUP,
                           "config.json: model_type \"%.64s\" is not supported (rwkv7, "
                           "mamba2, gated_deltanet, qwen3_5, qwen3_5_text, nemotron_h, "
                           "granitemoehybrid)",
                           t);
    }
    for (size_t i = 0; i < WRK_N_FAMILIES; i++)
        if (wrk_families[i]->detect(set)) {
            *out = wrk_families[i];
            return WK_OK;
        }
    return WK_OK;
}

/* Refuses a checkpoint holding a tensor the family did not declare. */
static wk_err
wrk_model_check_unused(const wrk_model *m, wk_diag *d)
{
    size_t n = wk_tensor_set_count(m->set);
    for (size_t i = 0; i < n; i++) {
        const wk_tensor *t = wk_tensor_set_at(m->set, i);
        bool used = false;
        for (size_t u = 0; u < m->n_uses && !used; u++)
            used = *m->uses[u].v.tp == t || m->uses[u].parent == t;
        for (size_t u = 0; u < m->n_skips && !used; u++)
            used = m->skips[u] == t;
        if (!used)
            return wk_diag_set(d, WK_EINVAL, "%s: unexpected tensor for a %s checkpoint", t->name,
                               m->fam->name);
    }
    return WK_OK;
}

/* Maps the RWKV-7 view and fills the info's dimensions. */
static wk_err
wrk_model_map_rwkv7_info(wrk_model *m, wk_diag *d)
{
    wk_err e = wrk_map_rwkv7(m, d);
    if (e != WK_OK)
        return e;
    wrk_model_info *in = &m->info;
    const wrk_rwkv7 *r = &m->rwkv7;
    snprintf(in->family, sizeof(in->family), "rwkv7");
    in->n_layer = r->n_layer;
    in->n_embd = r->n_embd;
    in->n_head = r->n_head;
    in->head_size = r->head_size;
    in->ffn_dim = r->ffn_dim;
    in->vocab_size = r->vocab_size;
    in->state_bytes = (uint64_t)r->n_layer *
                      (2ull * r->n_embd + (uint64_t)r->n_head * r->head_size * r->head_size) * 4u;
    return WK_OK;
}

wk_err
wrk_model_load(const char *dir, const wrk_model_opts *opts, wrk_model **out, wk_diag *d)
{
    char path[WRK_PATH_MAX];
    wrk_model *m;
    wk_err e;

    if (dir == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "wrk_model_load: no directory");
    if ((e = wrk_model_find_checkpoint(dir, path, sizeof(path), d)) != WK_OK)
        return e;
    m = calloc(1, sizeof(*m));
    if (m == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");

    /* --model FILE: config.json (and the tokenizer) beside the file; the name is the file's */
    char mdir[WRK_PATH_MAX], mname[WRK_PATH_MAX]; /* (a longer name is cut to info.name) */
    bool is_file = false;
    if (wk_file_model_path(dir, mdir, sizeof(mdir), mname, sizeof(mname), &is_file) != WK_OK) {
        free(m);
        return wk_diag_set(d, WK_ETOOBIG, "%s: path too long", dir);
    }
    /* a GGUF file brings the config.json its metadata implies, used when dir has none */
    json_t *gguf_config = NULL;
    if (wrk_has_suffix(path, ".gguf"))
        e = wrk_gguf_open(path, &m->set, &gguf_config, d);
    else
        e = wk_tensor_set_open(path, &m->set, d);
    if (e != WK_OK)
        goto fail;
    e = wrk_model_read_config(mdir, &m->config, d);
    if (e == WK_OK && m->config == NULL) {
        m->config = gguf_config;
        gguf_config = NULL;
    } else if (e == WK_OK && gguf_config != NULL &&
               json_object_get(gguf_config, "wkvm_norms_include_one") != NULL) {
        /* a Qwen3.5 GGUF beside its config.json: its norms already hold 1 + weight */
        json_object_set_new(m->config, "wkvm_norms_include_one", json_true());
    }
    json_decref(gguf_config);
    if (e != WK_OK)
        goto fail;
    if ((e = wrk_model_pick_family(m->set, m->config, &m->fam, d)) != WK_OK)
        goto fail;
    wrk_model_info *in = &m->info;
    if (m->fam == NULL) {
        e = wrk_model_map_rwkv7_info(m, d);
    } else {
        snprintf(in->family, sizeof(in->family), "%s", m->fam->name);
        e = m->fam->map(m, m->set, m->config, &m->view, in, d);
        if (e == WK_OK)
            e = wrk_model_check_unused(m, d);
    }
    if (e != WK_OK) {
        wk_diag_prefix(d, "%s", path);
        goto fail;
    }

    snprintf(in->name, sizeof(in->name), "%.127s", mname); /* (a file's: without extension) */

    wrk_count cnt;
    memset(&cnt, 0, sizeof(cnt));
    (void)wrk_visit_all(m, wrk_visit_count, &cnt);
    in->n_params = cnt.params;

    /* digest of the stored weights, in canonical order and orientation */
    {
        wrk_digest g;
        memset(&g, 0, sizeof(g));
        g.opts = opts;
        for (int i = 0; i < WK_DTYPE_COUNT; i++)
            g.total += cnt.bytes_by_dtype[i];
        if ((e = wk_sha256_init(&g.sha)) != WK_OK) {
            wk_diag_set(d, e, "sha256 init failed");
            goto fail;
        }
        e = wrk_visit_all(m, wrk_visit_digest, &g);
        free(g.tmp);
        if (e != WK_OK) {
            wk_sha256_fini(&g.sha);
            wk_diag_set(d, e, "out of memory hashing the weights");
            goto fail;
        }
        uint8_t dig[WK_SHA256_LEN];
        wk_sha256_final(&g.sha, dig);
        wk_sha256_to_hex(dig, in->weights_digest);
    }

    if (opts != NULL && opts->fp32 && opts->quantize_q8_0) {
        e = wk_diag_set(d, WK_EINVAL, "--fp32 and --quantize q8_0 exclude each other");
        goto fail;
    }
    if (opts != NULL && opts->quantize_q8_0) {
        if ((e = wrk_quantize_q8_0(m, d)) != WK_OK)
            goto fail;
        /* what is kept now: recount (the matrices point at the Q8_0 copies) */
        memset(&cnt, 0, sizeof(cnt));
        (void)wrk_visit_all(m, wrk_visit_count, &cnt);
        cnt.params = in->n_params;
    }
    if (opts != NULL && opts->fp32) {
        m->cap_owned = cnt.n;
        m->owned = calloc(cnt.n ? cnt.n : 1, sizeof(*m->owned));
        if (m->owned == NULL) {
            e = wk_diag_set(d, WK_ENOMEM, "out of memory");
            goto fail;
        }
        if ((e = wrk_visit_all(m, wrk_visit_fp32, NULL)) != WK_OK) {
            wk_diag_set(d, e, "converting the weights to fp32: %s", wk_strerror(e));
            goto fail;
        }
        if (m->fam == NULL && m->rwkv7.tied)
            m->rwkv7.head.t = m->rwkv7.emb; /* tied: the head sees the fp32 embedding */
        /* a tensor declared under two fields (tied): both see the fp32 copy */
        for (size_t i = 0; i < m->n_uses; i++)
            for (size_t j = 0; m->uses[i].dup && j < i; j++)
                if (!m->uses[j].dup && m->uses[j].orig == m->uses[i].orig) {
                    *m->uses[i].v.tp = *m->uses[j].v.tp;
                    break;
                }
        in->dtype = WK_DTYPE_F32;
        in->weight_bytes = cnt.params * 4u;
    } else {
        int best = 0;
        in->weight_bytes = 0;
        for (int i = 0; i < WK_DTYPE_COUNT; i++) {
            if (cnt.bytes_by_dtype[i] > cnt.bytes_by_dtype[best])
                best = i;
            in->weight_bytes += cnt.bytes_by_dtype[i];
        }
        /* the fingerprint binds it: a state made under Q8_0 never loads into BF16 weights */
        in->dtype = opts != NULL && opts->quantize_q8_0 ? WK_DTYPE_Q8_0 : (wk_dtype)best;
    }

    if ((e = wrk_model_load_vocab(m, dir, opts, d)) != WK_OK)
        goto fail;
    if ((e = wrk_model_fingerprint(m)) != WK_OK) {
        wk_diag_set(d, e, "fingerprint text too long");
        goto fail;
    }
    *out = m;
    return WK_OK;

fail:
    if (wrk_has_suffix(path, ".gguf"))
        wrk_gguf_diag_names(d); /* name the tensor as the GGUF file does, too */
    wrk_model_free(m);
    return e;
}

void
wrk_model_free(wrk_model *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->n_owned; i++)
        free((void *)m->owned[i].data);
    free(m->owned);
    free(m->layers);
    if (m->fam != NULL && m->fam->free_view != NULL)
        m->fam->free_view(m->view);
    free(m->uses);
    free(m->skips);
    json_decref(m->config);
    wk_tok_free(m->tok);
    wk_tensor_set_free(m->set);
    free(m);
}

const wrk_model_info *
wrk_model_info_get(const wrk_model *m)
{
    return &m->info;
}

const struct wk_tok *
wrk_model_tokenizer(const wrk_model *m)
{
    return m->tok;
}

const wrk_rwkv7 *
wrk_model_rwkv7(const wrk_model *m)
{
    return m->fam == NULL ? &m->rwkv7 : NULL;
}

const void *
wrk_model_view(const wrk_model *m, const char *family)
{
    if (m->fam == NULL || family == NULL || strcmp(wrk_model_view_kind(m), family) != 0)
        return NULL;
    return m->view;
}

const char *
wrk_model_view_kind(const wrk_model *m)
{
    if (m->fam == NULL)
        return "rwkv7";
    return m->fam->view != NULL ? m->fam->view : m->fam->name;
}

size_t
wrk_model_state_layout(const wrk_model *m, wrk_state_tensor *out, size_t cap)
{
    if (m->fam != NULL)
        return m->fam->state_layout(m->view, out, cap);
    const wrk_rwkv7 *r = &m->rwkv7;
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

/* ------------------------------------------------------------------------ */
/* config.json helpers for the families                                      */
/* ------------------------------------------------------------------------ */

wk_err
wrk_config_u32(const json_t *config, const char *key, uint32_t def, uint32_t *out, wk_diag *d)
{
    const json_t *v = config != NULL ? json_object_get(config, key) : NULL;
    *out = def;
    if (v == NULL || json_is_null(v))
        return WK_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > (json_int_t)UINT32_MAX)
        return wk_diag_set(d, WK_EINVAL, "config.json: %s must be a non-negative integer", key);
    *out = (uint32_t)json_integer_value(v);
    return WK_OK;
}

wk_err
wrk_config_f64(const json_t *config, const char *key, double def, double *out, wk_diag *d)
{
    const json_t *v = config != NULL ? json_object_get(config, key) : NULL;
    *out = def;
    if (v == NULL || json_is_null(v))
        return WK_OK;
    if (!json_is_number(v))
        return wk_diag_set(d, WK_EINVAL, "config.json: %s must be a number", key);
    *out = json_number_value(v);
    return WK_OK;
}

wk_err
wrk_config_str(const json_t *config, const char *key, const char *def, const char **out,
               wk_diag *d)
{
    const json_t *v = config != NULL ? json_object_get(config, key) : NULL;
    *out = def;
    if (v == NULL || json_is_null(v))
        return WK_OK;
    if (!json_is_string(v))
        return wk_diag_set(d, WK_EINVAL, "config.json: %s must be a string", key);
    *out = json_string_value(v);
    return WK_OK;
}

wk_err
wrk_shape_err(wk_diag *d, const char *name, const wk_tensor *t, const char *want)
{
    char got[128];
    wrk_shape_str(t, got, sizeof(got));
    return wk_diag_set(d, WK_EINVAL, "%s: shape %s, expected %s", name, got, want);
}

wk_err
wrk_config_bool(const json_t *config, const char *key, bool def, bool *out, wk_diag *d)
{
    const json_t *v = config != NULL ? json_object_get(config, key) : NULL;
    *out = def;
    if (v == NULL || json_is_null(v))
        return WK_OK;
    if (!json_is_boolean(v))
        return wk_diag_set(d, WK_EINVAL, "config.json: %s must be true or false", key);
    *out = json_is_true(v);
    return WK_OK;
}
