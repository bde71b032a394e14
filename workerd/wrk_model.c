/*
 * wrk_model: loads a model directory into host memory, for any family.
 *
 * Every family plugs in through family/wrk_family.h (family/wrk_<name>.c:
 * RWKV-7 in wrk_rwkv7.c, Mamba2, Gated DeltaNet, Qwen3.5, Nemotron-H,
 * Granite-4.0-H) and maps the tensors onto its view; this module does the
 * generic parts for them: finding the checkpoint (wrk_model_find_checkpoint)
 * and opening it through wk_tensor (safetensors, sharded index, .pth) or
 * wrk_gguf (a llama.cpp .gguf, presented under the HF names), config.json,
 * family detection, the unknown-tensor check, the parameter count, the
 * weights digest (over the tensors the family declared, in its canonical
 * order and orientation), the fingerprint and the tokenizer.
 *
 * Weights stay where the tensor set maps them, in their stored dtype, unless
 * fp32 is asked for (then owned fp32 copies are made) or Q8_0 (then owned
 * Q8_0 copies of the matrices the family names are made, stored
 * [n_out][n_in] so the blocks run along the input dim, with
 * wk_q8_0_quantize_row, the bytes llama.cpp's converter writes for the same
 * fp32 values). Q8_0 tensors from a GGUF stay Q8_0. Backends build their
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


struct wrk_model {
    wrk_model_info info;     /* what the rest of the worker sees */
    wk_tensor_set *set;      /* the opened checkpoint, owns the mappings */
    wk_tensor *owned;        /* fp32 or Q8_0 copies (opts), owned; names borrowed */
    size_t n_owned;          /* entries used in owned */
    size_t cap_owned;        /* entries allocated in owned */
    wk_tok *tok;             /* tokenizer, NULL when no vocab file */
    const wrk_family *fam;   /* the family (NULL only while loading) */
    void *view;              /* the family's view, owned via fam->free_view */
    json_t *config;          /* config.json, NULL when absent; owned */
    struct wrk_use *uses;    /* tensors the family declared, owned */
    size_t n_uses, cap_uses; /* entries used / allocated in uses */
    const wk_tensor **skips; /* tensors the family skipped (wrk_model_skip), owned array */
    size_t n_skips, cap_skips; /* entries used / allocated in skips */
};

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
    for (size_t i = 0; i < m->n_uses; i++) {
        wk_err e;
        if (!m->uses[i].dup && (e = fn(m, &m->uses[i].v, arg)) != WK_OK)
            return e;
    }
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
 * --quantize q8_0: the matrices the family's quant_mats hook names (the
 * projections and the head; which ones and why: the family's file).
 */
static wk_err
wrk_quantize_q8_0(wrk_model *m, wk_diag *d)
{
    if (m->fam->quant_mats == NULL)
        return wk_diag_set(d, WK_ENOTSUP, "--quantize q8_0: not for %s checkpoints",
                           m->fam->name);
    size_t n_fam = m->fam->quant_mats(m->view, NULL, 0);
    wrk_mat **fam_mats = calloc(n_fam ? n_fam : 1, sizeof(*fam_mats));
    if (fam_mats == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    n_fam = m->fam->quant_mats(m->view, fam_mats, n_fam);
    m->cap_owned = n_fam;
    m->owned = calloc(m->cap_owned ? m->cap_owned : 1, sizeof(*m->owned));
    if (m->owned == NULL) {
        free(fam_mats);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    wk_err e = WK_OK;
    for (size_t i = 0; i < n_fam && e == WK_OK; i++)
        e = wrk_quantize_mat(m, fam_mats[i], d);
    free(fam_mats);
    return e;
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
    if (m->fam->fingerprint != NULL) {
        n = m->fam->fingerprint(m->view, in, buf, sizeof(buf));
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
    if (in->matmul_bf16) {
        /* another numeric mode: a state made under it never loads into an fp32-mode worker,
         * nor one of either bf16 engine into the other (the AMX line is the one states made
         * before the second engine carry) */
        int k = snprintf(buf + n, sizeof(buf) - (size_t)n,
                         in->matmul_dp ? "matmul=bf16-dp\n" : "matmul=bf16\n");
        if (k < 0 || (size_t)k >= sizeof(buf) - (size_t)n)
            return WK_EINVAL;
        n += k;
    }
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

/*
 * Asked in this order: nemotron_h before mamba2 (both name tensors
 * backbone.*, only Nemotron-H has non-Mamba2 layers); RWKV-7 last, as the
 * family of last resort (its detect takes anything).
 */
static const wrk_family *const wrk_families[] = {&wrk_family_nemotron_h, &wrk_family_mamba2,
                                                 &wrk_family_gdn, &wrk_family_qwen3_5,
                                                 &wrk_family_granite_h, &wrk_family_rwkv7};
#define WRK_N_FAMILIES (sizeof(wrk_families) / sizeof(wrk_families[0]))

/*
 * Picks the family: config.json's model_type when it names one (an unknown
 * model_type is refused), else the first family whose tensor names match:
 * RWKV-7 at the latest, whose mapper explains what it did not find.
 */
static wk_err
wrk_model_pick_family(const wk_tensor_set *set, const json_t *config, const wrk_family **out,
                      wk_diag *d)
{
    *out = NULL;
    const json_t *mt = config != NULL ? json_object_get(config, "model_type") : NULL;
    if (mt != NULL && json_is_string(mt)) {
        const char *t = json_string_value(mt);
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
    return wk_diag_set(d, WK_EINVAL, "no model family recognises the checkpoint");
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
    snprintf(in->family, sizeof(in->family), "%s", m->fam->name);
    e = m->fam->map(m, m->set, m->config, &m->view, in, d);
    if (e == WK_OK && !m->fam->checks_names)
        e = wrk_model_check_unused(m, d);
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

    if (opts != NULL && opts->matmul_bf16) {
        if (opts->fp32 || opts->quantize_q8_0 || in->dtype != WK_DTYPE_BF16) {
            e = wk_diag_set(d, WK_EINVAL,
                            "--cpu-matmul bf16 is for BF16 weights (these are kept as %s); drop "
                            "it, --fp32 or --quantize",
                            wk_dtype_name(in->dtype));
            goto fail;
        }
        in->matmul_bf16 = true;
        in->matmul_dp = opts->matmul_dp;
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

const void *
wrk_model_view(const wrk_model *m, const char *family)
{
    if (family == NULL || strcmp(wrk_model_view_kind(m), family) != 0)
        return NULL;
    return m->view;
}

const char *
wrk_model_view_kind(const wrk_model *m)
{
    return m->fam->view != NULL ? m->fam->view : m->fam->name;
}

size_t
wrk_model_state_layout(const wrk_model *m, wrk_state_tensor *out, size_t cap)
{
    return m->fam->state_layout(m->view, out, cap);
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
