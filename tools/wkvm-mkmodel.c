/*
 * wkvm-mkmodel: writes a small deterministic RWKV-7 ("x070") model directory
 * in the Hugging Face (fla rwkv7) layout, for demos and tests:
 *   config.json, model.safetensors, rwkv_vocab_v20230424.txt
 *
 * The weights are pseudo-random from --seed with the same scale scheme as
 * tests/reference/gen_model.py (LayerNorm weights near 1, decays spread over
 * about (0.55, 0.97), in-context learning rates over (0, 1), logits with a
 * standard deviation of about 2), so the model is numerically meaningful and
 * a CPU runs it fast. Each tensor draws from its own stream (seed + name), so
 * a tensor's values do not depend on the others. The vocab has exactly
 * vocab-1 tokens: the 256 single bytes, then English words and pieces, so a
 * decoded continuation looks like (nonsense) text. With --vocab-file a real
 * World vocab (rwkv_vocab_v20230424.txt, as the `rwkv` Python package ships
 * it) is checked with wk_tok and copied instead, and the model gets as many
 * rows as it needs (rounded up to 64: 65536 for the World vocab), so the
 * demo tokenizes text as the released RWKV models do.
 *
 * It must never overwrite a non-empty directory unless --force is given, and
 * never leaves a half-written file under a final name: each file is written
 * to a temporary name, synced and renamed.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wk_cfg_tool.h"
#include "wk_err.h"
#include "wk_tok.h"

#define MK_PATH_MAX 4096

/* Limits on every user-controlled size (a demo tool, not a trainer). */
#define MK_MAX_LAYERS 64
#define MK_MAX_EMBD 4096
#define MK_MAX_FFN 16384
#define MK_MAX_VOCAB 262144
#define MK_MAX_LORA 1024
#define MK_MAX_VOCAB_FILE (64u << 20) /* bytes of a --vocab-file (the World vocab: ~1 MiB) */

typedef enum mk_dtype {
    MK_DTYPE_F32 = 0, /* IEEE binary32 */
    MK_DTYPE_BF16,    /* bfloat16, round to nearest even */
} mk_dtype;

typedef struct mk_cfg {
    const char *out;    /* output directory */
    int layers;         /* L */
    int embd;           /* C */
    int head_size;      /* N */
    int ffn;            /* F, channel-mix width */
    int vocab;          /* V, rows of the embedding and head */
    int lora_w;         /* decay LoRA rank */
    int lora_a;         /* in-context learning rate LoRA rank */
    int lora_v;         /* value-residual LoRA rank */
    int lora_g;         /* gate LoRA rank */
    mk_dtype dtype;     /* stored weight type */
    uint64_t seed;      /* PRNG seed */
    bool force;         /* allow a non-empty output directory */
    const char *vocab_file;  /* --vocab-file: World vocab to copy, NULL: generate one */
    unsigned char *vocab_buf; /* its bytes, read and checked before anything is written */
    size_t vocab_len;         /* bytes in vocab_buf */
} mk_cfg;

/* How a tensor's values are drawn. */
typedef enum mk_init {
    MK_INIT_NORMAL = 0, /* N(0, a^2) */
    MK_INIT_ONE_PLUS,   /* 1 + N(0, a^2) */
    MK_INIT_UNIFORM,    /* U(a, b) */
} mk_init;

typedef struct mk_tensor {
    char name[96];    /* HF tensor name */
    int ndim;         /* 1..3 */
    int64_t shape[3]; /* row-major shape */
    mk_init init;     /* distribution */
    double a;         /* std, or lower bound */
    double b;         /* upper bound (uniform only) */
    uint64_t offset;  /* byte offset in the data section */
} mk_tensor;

typedef struct mk_plan {
    mk_tensor *t; /* tensors in file order, owned */
    size_t n;     /* count */
    size_t cap;   /* allocated */
} mk_plan;

/* ------------------------------------------------------------------------ */
/* deterministic random numbers: splitmix64 streams keyed by seed and name   */

typedef struct mk_rng {
    uint64_t s;      /* splitmix64 state */
    bool have_spare; /* Box-Muller spare available */
    double spare;    /* the spare normal */
} mk_rng;

static uint64_t
mk_rng_next(mk_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1). */
static double
mk_rng_unit(mk_rng *r)
{
    return ((double)(mk_rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double
mk_rng_normal(mk_rng *r)
{
    if (r->have_spare) {
        r->have_spare = false;
        return r->spare;
    }
    double u1 = mk_rng_unit(r), u2 = mk_rng_unit(r);
    double rad = sqrt(-2.0 * log(u1));
    r->spare = rad * sin(2.0 * M_PI * u2);
    r->have_spare = true;
    return rad * cos(2.0 * M_PI * u2);
}

static void
mk_rng_init(mk_rng *r, uint64_t seed, const char *name)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the name */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    r->s = seed * 0x9E3779B97F4A7C15ull ^ h;
    r->have_spare = false;
    r->spare = 0.0;
    (void)mk_rng_next(r);
}

static uint16_t
mk_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return 0x7FC0; /* NaN */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ------------------------------------------------------------------------ */
/* the tensor plan                                                           */

static int64_t
mk_tensor_numel(const mk_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

static size_t
mk_dtype_size(mk_dtype dt)
{
    return dt == MK_DTYPE_F32 ? 4 : 2;
}

WK_MUST_CHECK static wk_err
mk_plan_add(mk_plan *p, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2,
            mk_init init, double a, double b)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        mk_tensor *nt = realloc(p->t, cap * sizeof(*nt));
        if (!nt)
            return WK_ENOMEM;
        p->t = nt;
        p->cap = cap;
    }
    mk_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->init = init;
    t->a = a;
    t->b = b;
    return WK_OK;
}

/* Builds the list of tensors, their shapes and scales (gen_model.py scheme). */
WK_MUST_CHECK static wk_err
mk_plan_build(const mk_cfg *c, mk_plan *p)
{
    const int64_t C = c->embd, F = c->ffn, V = c->vocab;
    const int64_t N = c->head_size, H = C / N;
    const double sc = 1.0 / sqrt((double)C);
    char nm[96];
    wk_err e;

#define ADD(ndim, d0, d1, d2, init, a, b)                                      \
    do {                                                                       \
        e = mk_plan_add(p, nm, (ndim), (d0), (d1), (d2), (init), (a), (b));   \
        if (e != WK_OK)                                                        \
            return e;                                                          \
    } while (0)
#define NAME(...) snprintf(nm, sizeof(nm), __VA_ARGS__)

    NAME("model.embeddings.weight");
    ADD(2, V, C, 0, MK_INIT_NORMAL, 0.5, 0);
    for (int i = 0; i < c->layers; i++) {
        if (i == 0) {
            NAME("model.layers.0.pre_norm.weight");
            ADD(1, C, 0, 0, MK_INIT_ONE_PLUS, 0.1, 0);
            NAME("model.layers.0.pre_norm.bias");
            ADD(1, C, 0, 0, MK_INIT_NORMAL, 0.05, 0);
        }
        static const char *const norms[] = {"attn_norm", "ffn_norm"};
        for (int j = 0; j < 2; j++) {
            NAME("model.layers.%d.%s.weight", i, norms[j]);
            ADD(1, C, 0, 0, MK_INIT_ONE_PLUS, 0.1, 0);
            NAME("model.layers.%d.%s.bias", i, norms[j]);
            ADD(1, C, 0, 0, MK_INIT_NORMAL, 0.05, 0);
        }
        static const char *const mix[] = {"x_r", "x_w", "x_k", "x_v", "x_a", "x_g"};
        for (int j = 0; j < 6; j++) {
            NAME("model.layers.%d.attn.%s", i, mix[j]);
            ADD(3, 1, 1, C, MK_INIT_UNIFORM, 0.0, 1.0);
        }
        NAME("model.layers.%d.attn.k_k", i);
        ADD(1, C, 0, 0, MK_INIT_UNIFORM, 0.6, 1.1);
        NAME("model.layers.%d.attn.k_a", i);
        ADD(1, C, 0, 0, MK_INIT_UNIFORM, 0.5, 1.5);
        NAME("model.layers.%d.attn.r_k", i);
        ADD(2, H, N, 0, MK_INIT_NORMAL, 0.3, 0);
        static const char *const proj[] = {"r_proj", "k_proj", "v_proj", "o_proj"};
        for (int j = 0; j < 4; j++) {
            NAME("model.layers.%d.attn.%s.weight", i, proj[j]);
            ADD(2, C, C, 0, MK_INIT_NORMAL, j == 3 ? 0.5 * sc : sc, 0);
        }
        /* w, a, v LoRAs: lora.0 = x1^T [D, C], lora.2 = x2^T [C, D], bias = x0 */
        const struct {
            const char *n; /* LoRA name */
            int64_t d;     /* rank */
            double bias;   /* std of the bias (x0) */
        } lo[] = {{"w", c->lora_w, 1.5}, {"a", c->lora_a, 1.0}, {"v", c->lora_v, 1.0}};
        for (int j = 0; j < 3; j++) {
            if (j == 2 && i == 0)
                continue; /* layer 0 keeps v_first; no value-residual LoRA */
            NAME("model.layers.%d.attn.%s_lora.lora.0.weight", i, lo[j].n);
            ADD(2, lo[j].d, C, 0, MK_INIT_NORMAL, sc, 0);
            NAME("model.layers.%d.attn.%s_lora.lora.2.weight", i, lo[j].n);
            ADD(2, C, lo[j].d, 0, MK_INIT_NORMAL, 0.5 / sqrt((double)lo[j].d), 0);
            NAME("model.layers.%d.attn.%s_lora.lora.2.bias", i, lo[j].n);
            ADD(1, C, 0, 0, MK_INIT_NORMAL, lo[j].bias, 0);
        }
        NAME("model.layers.%d.attn.g_lora.lora.0.weight", i);
        ADD(2, c->lora_g, C, 0, MK_INIT_NORMAL, sc, 0);
        NAME("model.layers.%d.attn.g_lora.lora.2.weight", i);
        ADD(2, C, c->lora_g, 0, MK_INIT_NORMAL, 1.0 / sqrt((double)c->lora_g), 0);
        NAME("model.layers.%d.attn.g_norm.weight", i);
        ADD(1, C, 0, 0, MK_INIT_ONE_PLUS, 0.1, 0);
        NAME("model.layers.%d.attn.g_norm.bias", i);
        ADD(1, C, 0, 0, MK_INIT_NORMAL, 0.05, 0);
        NAME("model.layers.%d.ffn.x_k", i);
        ADD(1, C, 0, 0, MK_INIT_UNIFORM, 0.0, 1.0);
        NAME("model.layers.%d.ffn.key.weight", i);
        ADD(2, F, C, 0, MK_INIT_NORMAL, sc, 0);
        NAME("model.layers.%d.ffn.value.weight", i);
        ADD(2, C, F, 0, MK_INIT_NORMAL, 0.5 / sqrt((double)F), 0);
    }
    NAME("model.norm.weight");
    ADD(1, C, 0, 0, MK_INIT_ONE_PLUS, 0.1, 0);
    NAME("model.norm.bias");
    ADD(1, C, 0, 0, MK_INIT_NORMAL, 0.05, 0);
    NAME("lm_head.weight");
    ADD(2, V, C, 0, MK_INIT_NORMAL, 2.0 * sc, 0);
#undef ADD
#undef NAME

    uint64_t off = 0;
    for (size_t i = 0; i < p->n; i++) {
        p->t[i].offset = off;
        off += (uint64_t)mk_tensor_numel(&p->t[i]) * mk_dtype_size(c->dtype);
    }
    return WK_OK;
}

/*
 * The one departure from gen_model.py's scheme, for the demo: lm_head rows of
 * token 0 (end of text) and of single bytes that are control characters or
 * not valid UTF-8 on their own are scaled down, so greedy text from a random
 * model is made of words rather than stops and replacement characters.
 */
#define MK_QUIET_ROW_SCALE 0.25

static bool
mk_head_row_quiet(int64_t id)
{
    if (id == 0)
        return true;
    if (id < 1 || id > 256)
        return false;
    int b = (int)id - 1; /* ids 1..256 are bytes 0..255 */
    return (b < 0x20 && b != '\n') || b >= 0x7f;
}

/* ------------------------------------------------------------------------ */
/* small string buffer                                                       */

typedef struct mk_buf {
    char *s;    /* NUL-terminated text, owned */
    size_t len; /* bytes used, without the NUL */
    size_t cap; /* allocated */
    bool oom;   /* an append failed */
} mk_buf;

static void mk_buf_printf(mk_buf *b, const char *fmt, ...) WK_PRINTF(2, 3);

static void
mk_buf_printf(mk_buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 256;
        while (cap <= b->len + (size_t)n)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
}

/* ------------------------------------------------------------------------ */
/* files                                                                     */

/* Opens dir/name.tmp for writing; on success *f and tmp (the path) are set. */
WK_MUST_CHECK static wk_err
mk_file_open(const char *dir, const char *name, char *tmp, size_t tmpsz, FILE **f, wk_diag *d)
{
    if ((size_t)snprintf(tmp, tmpsz, "%s/.%s.tmp", dir, name) >= tmpsz)
        return wk_diag_set(d, WK_EINVAL, "%s/%s: path too long", dir, name);
    *f = fopen(tmp, "wb");
    if (!*f)
        return wk_diag_set(d, WK_EIO, "%s: %s", tmp, strerror(errno));
    return WK_OK;
}

/* Flushes, syncs and closes f, then renames tmp to dir/name. Closes f always. */
WK_MUST_CHECK static wk_err
mk_file_commit(FILE *f, const char *tmp, const char *dir, const char *name, wk_diag *d)
{
    char path[MK_PATH_MAX];
    int bad = ferror(f) || fflush(f) != 0 || fsync(fileno(f)) != 0;
    int err = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        err = errno;
    }
    if (bad) {
        unlink(tmp);
        return wk_diag_set(d, WK_EIO, "%s: write failed: %s", tmp, strerror(err));
    }
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, name) >= sizeof(path)) {
        unlink(tmp);
        return wk_diag_set(d, WK_EINVAL, "%s/%s: path too long", dir, name);
    }
    if (rename(tmp, path) != 0) {
        err = errno;
        unlink(tmp);
        return wk_diag_set(d, WK_EIO, "rename %s -> %s: %s", tmp, path, strerror(err));
    }
    return WK_OK;
}

/* Creates dir (and missing parents); refuses a non-empty one unless force. */
WK_MUST_CHECK static wk_err
mk_dir_prepare(const char *dir, bool force, wk_diag *d)
{
    char p[MK_PATH_MAX];
    if ((size_t)snprintf(p, sizeof(p), "%s", dir) >= sizeof(p))
        return wk_diag_set(d, WK_EINVAL, "output path too long");
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return wk_diag_set(d, WK_EIO, "mkdir %s: %s", p, strerror(errno));
        *s = '/';
    }
    if (mkdir(p, 0777) != 0 && errno != EEXIST)
        return wk_diag_set(d, WK_EIO, "mkdir %s: %s", p, strerror(errno));
    DIR *dh = opendir(dir);
    if (!dh)
        return wk_diag_set(d, WK_EIO, "%s: %s", dir, strerror(errno));
    bool empty = true;
    struct dirent *de;
    while ((de = readdir(dh)) != NULL) {
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
            empty = false;
            break;
        }
    }
    closedir(dh);
    if (!empty && !force)
        return wk_diag_set(d, WK_EEXIST, "%s is not empty (use --force to overwrite)", dir);
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* model.safetensors                                                         */

WK_MUST_CHECK static wk_err
mk_write_safetensors(const mk_cfg *c, const mk_plan *p, wk_diag *d)
{
    const char *dtn = c->dtype == MK_DTYPE_F32 ? "F32" : "BF16";
    const size_t esz = mk_dtype_size(c->dtype);
    char tmp[MK_PATH_MAX];
    mk_buf h = {0};
    float *vals = NULL;
    void *raw = NULL;
    FILE *f = NULL;
    wk_err e;

    mk_buf_printf(&h, "{\"__metadata__\":{\"format\":\"pt\",\"generator\":\"wkvm-mkmodel\","
                      "\"seed\":\"%" PRIu64 "\"}",
                  c->seed);
    for (size_t i = 0; i < p->n; i++) {
        const mk_tensor *t = &p->t[i];
        uint64_t nb = (uint64_t)mk_tensor_numel(t) * esz;
        mk_buf_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, dtn);
        for (int j = 0; j < t->ndim; j++)
            mk_buf_printf(&h, "%s%" PRId64, j ? "," : "", t->shape[j]);
        mk_buf_printf(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", t->offset,
                      t->offset + nb);
    }
    mk_buf_printf(&h, "}");
    while (!h.oom && h.len % 8 != 0)
        mk_buf_printf(&h, " ");
    if (h.oom) {
        e = wk_diag_set(d, WK_ENOMEM, "safetensors header");
        goto fail;
    }

    int64_t maxn = 0;
    for (size_t i = 0; i < p->n; i++)
        if (mk_tensor_numel(&p->t[i]) > maxn)
            maxn = mk_tensor_numel(&p->t[i]);
    vals = malloc((size_t)maxn * sizeof(*vals));
    raw = malloc((size_t)maxn * esz);
    if (!vals || !raw) {
        e = wk_diag_set(d, WK_ENOMEM, "tensor buffer of %" PRId64 " elements", maxn);
        goto fail;
    }

    e = mk_file_open(c->out, "model.safetensors", tmp, sizeof(tmp), &f, d);
    if (e != WK_OK)
        goto fail;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(h.s, 1, h.len, f);
    for (size_t i = 0; i < p->n; i++) {
        const mk_tensor *t = &p->t[i];
        int64_t n = mk_tensor_numel(t);
        mk_rng r;
        mk_rng_init(&r, c->seed, t->name);
        const bool head = strcmp(t->name, "lm_head.weight") == 0;
        for (int64_t j = 0; j < n; j++) {
            double v;
            switch (t->init) {
            case MK_INIT_ONE_PLUS:
                v = 1.0 + t->a * mk_rng_normal(&r);
                break;
            case MK_INIT_UNIFORM:
                v = t->a + (t->b - t->a) * mk_rng_unit(&r);
                break;
            case MK_INIT_NORMAL:
            default:
                v = t->a * mk_rng_normal(&r);
                break;
            }
            if (head && mk_head_row_quiet(j / t->shape[1]))
                v *= MK_QUIET_ROW_SCALE;
            vals[j] = (float)v;
        }
        unsigned char *o = raw;
        for (int64_t j = 0; j < n; j++) {
            if (c->dtype == MK_DTYPE_F32) {
                uint32_t u;
                memcpy(&u, &vals[j], 4);
                for (int k = 0; k < 4; k++)
                    o[4 * j + k] = (unsigned char)(u >> (8 * k));
            } else {
                uint16_t u = mk_f32_to_bf16(vals[j]);
                o[2 * j] = (unsigned char)u;
                o[2 * j + 1] = (unsigned char)(u >> 8);
            }
        }
        fwrite(raw, esz, (size_t)n, f);
    }
    e = mk_file_commit(f, tmp, c->out, "model.safetensors", d);
    f = NULL;
fail:
    if (f) {
        fclose(f);
        unlink(tmp);
    }
    free(vals);
    free(raw);
    free(h.s);
    return e;
}

/* ------------------------------------------------------------------------ */
/* config.json                                                               */

WK_MUST_CHECK static wk_err
mk_write_config(const mk_cfg *c, wk_diag *d)
{
    char tmp[MK_PATH_MAX];
    FILE *f;
    wk_err e = mk_file_open(c->out, "config.json", tmp, sizeof(tmp), &f, d);
    if (e != WK_OK)
        return e;
    fprintf(f,
            "{\n"
            "  \"architectures\": [\"RWKV7ForCausalLM\"],\n"
            "  \"model_type\": \"rwkv7\",\n"
            "  \"hidden_size\": %d,\n"
            "  \"num_hidden_layers\": %d,\n"
            "  \"head_dim\": %d,\n"
            "  \"num_heads\": %d,\n"
            "  \"intermediate_size\": %d,\n"
            "  \"vocab_size\": %d,\n"
            "  \"decay_low_rank_dim\": %d,\n"
            "  \"a_low_rank_dim\": %d,\n"
            "  \"v_low_rank_dim\": %d,\n"
            "  \"gate_low_rank_dim\": %d,\n"
            "  \"norm_eps\": 1e-05,\n"
            "  \"hidden_act\": \"sqrelu\",\n"
            "  \"torch_dtype\": \"%s\",\n"
            "  \"tie_word_embeddings\": false,\n"
            "  \"wkvm_generator\": {\"tool\": \"wkvm-mkmodel\", \"seed\": %" PRIu64 "}\n"
            "}\n",
            c->embd, c->layers, c->head_size, c->embd / c->head_size, c->ffn, c->vocab,
            c->lora_w, c->lora_a, c->lora_v, c->lora_g,
            c->dtype == MK_DTYPE_F32 ? "float32" : "bfloat16", c->seed);
    return mk_file_commit(f, tmp, c->out, "config.json", d);
}

/* ------------------------------------------------------------------------ */
/* the vocab                                                                 */

static const char *const mk_words[] = {
    "the", "of", "and", "to", "in", "is", "was", "for", "that", "on", "as", "with", "by",
    "he", "it", "at", "from", "his", "an", "were", "are", "which", "this", "be", "or",
    "has", "had", "not", "but", "first", "one", "their", "its", "new", "after", "who",
    "they", "have", "her", "she", "two", "been", "other", "when", "there", "all", "during",
    "into", "school", "time", "may", "years", "more", "most", "only", "over", "city",
    "some", "world", "would", "where", "later", "up", "such", "used", "many", "can",
    "state", "about", "national", "out", "known", "university", "united", "then", "made",
    "no", "you", "we", "what", "so", "if", "do", "like", "just", "people", "think", "good",
    "very", "see", "make", "hello", "model", "token", "water", "light", "house", "story",
    "small", "large", "great", "little", "day", "year", "way", "man", "woman", "child",
    "life", "work", "part", "place", "case", "week", "company", "system", "program",
    "question", "government", "number", "night", "point", "home", "room", "mother",
    "area", "money", "fact", "month", "lot", "right", "study", "book", "eye", "job",
    "word", "business", "issue", "side", "kind", "head", "service", "friend", "father",
    "power", "hour", "game", "line", "end", "member", "law", "car", "name", "president",
    "team", "minute", "idea", "kid", "body", "information", "back", "parent", "face",
    "others", "level", "office", "door", "health", "person", "art", "war", "history",
    "party", "result", "change", "morning", "reason", "research", "girl", "guy", "moment",
    "air", "teacher", "force", "education", "say", "get", "go", "know", "take", "come",
    "want", "look", "use", "find", "give", "tell", "call", "try", "ask", "need", "feel",
    "become", "leave", "put", "mean", "keep", "let", "begin", "seem", "help", "talk",
    "turn", "start", "show", "hear", "play", "run", "move", "live", "believe", "hold",
    "bring", "happen", "write", "provide", "sit", "stand", "lose", "pay", "meet",
    "include", "continue", "set", "learn", "lead", "understand", "watch", "follow",
    "stop", "create", "speak", "read", "allow", "add", "spend", "grow", "open", "walk",
    "win", "offer", "remember", "love", "consider", "appear", "buy", "wait", "serve",
    "die", "send", "expect", "build", "stay", "fall", "cut", "reach", "kill", "remain",
    "old", "different", "big", "high", "long", "young", "important", "few", "public",
    "bad", "same", "able", "late", "hard", "major", "better", "economic", "strong",
    "possible", "whole", "free", "military", "true", "federal", "international", "full",
    "special", "easy", "clear", "recent", "certain", "personal", "red", "difficult",
    "available", "likely", "short", "single", "medical", "current", "wrong", "private",
    "past", "foreign", "fine", "common", "poor", "natural", "significant", "similar",
    "hot", "dead", "central", "happy", "serious", "ready", "simple", "left", "physical",
    "general", "environmental", "financial", "blue", "democratic", "dark", "various",
    "entire", "close", "legal", "religious", "cold", "final", "main", "green", "nice",
    "huge", "popular", "traditional", "cultural", "also", "well", "even", "because",
    "any", "these", "how", "our", "me", "him", "your", "them", "my", "than", "now",
    "here", "why", "each", "much", "before", "through", "still", "between", "never",
    "under", "while", "again", "always", "often", "however", "yes", "today", "together",
    "river", "mountain", "garden", "music", "color", "road", "tree", "sun", "moon", "star",
};

static const char *const mk_pieces[] = {
    "\n\n", "\n", ". ", ", ", "! ", "? ", ": ", "; ", " (", ") ", ").", "),", " -", "- ",
    " \"", "\" ", "'s", " '", "...", " 1", " 2", " 10", "2024", " I", " A", "ing", "ed",
    "er", "ly", "tion", "ment", "ness", "able", "est", "ful", "less", "ous", "ive", "al",
    "es", "s", "re", "un", "dis", "pre", "over", "ter", "ers", "ings", "ation", "ity",
};

/* Syllables: pairs of them make pronounceable pseudo-words (" conta"). */
static const char *const mk_syllables[] = {
    "ba", "be", "con", "de", "di", "en", "er", "ex", "for", "ga", "in", "la", "le", "li",
    "lo", "ma", "me", "mi", "mo", "na", "ne", "no", "pa", "pe", "per", "po", "pro", "ra",
    "re", "ri", "ro", "sa", "se", "si", "so", "sta", "ta", "te", "ti", "to", "tra", "tu",
    "un", "va", "ve", "vi", "al", "an", "ar", "is", "on", "or", "ur", "ca", "co", "cu",
    "da", "do", "fa", "fi",
};

/* A set of token byte strings (open addressing on FNV-1a). */
typedef struct mk_tokset {
    char **tok;  /* stored tokens, owned; NULL = empty */
    size_t cap;  /* power of two */
} mk_tokset;

static uint64_t
mk_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Adds s; returns 1 if added, 0 if present, -1 on OOM. */
static int
mk_tokset_add(mk_tokset *ts, const char *s)
{
    size_t i = (size_t)mk_hash(s) & (ts->cap - 1);
    while (ts->tok[i]) {
        if (strcmp(ts->tok[i], s) == 0)
            return 0;
        i = (i + 1) & (ts->cap - 1);
    }
    ts->tok[i] = strdup(s);
    return ts->tok[i] ? 1 : -1;
}

/* Writes one token as a Python literal the way repr() does (str tokens). */
static void
mk_vocab_literal(FILE *f, const unsigned char *b, size_t n)
{
    bool has_sq = memchr(b, '\'', n) != NULL, has_dq = memchr(b, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    fputc(q, f);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = b[i];
        if (ch == '\\')
            fputs("\\\\", f);
        else if (ch == (unsigned char)q)
            fprintf(f, "\\%c", q);
        else if (ch == '\n')
            fputs("\\n", f);
        else if (ch == '\r')
            fputs("\\r", f);
        else if (ch == '\t')
            fputs("\\t", f);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(f, "\\x%02x", ch);
        else
            fputc(ch, f);
    }
    fputc(q, f);
}

/* Writes token id with bytes b[0..n): str literal when ASCII, else bytes. */
static void
mk_vocab_line(FILE *f, int id, const unsigned char *b, size_t n)
{
    fprintf(f, "%d ", id);
    if (n == 1 && b[0] >= 0x80)
        fprintf(f, "b'\\x%02x'", b[0]);
    else
        mk_vocab_literal(f, b, n);
    fprintf(f, " %zu\n", n);
}

WK_MUST_CHECK static wk_err
mk_write_vocab(const mk_cfg *c, wk_diag *d)
{
    const int want = c->vocab - 1; /* ids 1..V-1; 0 is end of text */
    char tmp[MK_PATH_MAX];
    char tok[64];
    FILE *f = NULL;
    mk_tokset ts = {0};
    wk_err e;
    int id = 1;

    ts.cap = 1;
    while (ts.cap < (size_t)want * 2 + 16)
        ts.cap *= 2;
    ts.tok = calloc(ts.cap, sizeof(*ts.tok));
    if (!ts.tok)
        return wk_diag_set(d, WK_ENOMEM, "vocab table");

    e = mk_file_open(c->out, "rwkv_vocab_v20230424.txt", tmp, sizeof(tmp), &f, d);
    if (e != WK_OK)
        goto fail;
    for (int b = 0; b < 256 && id <= want; b++, id++) {
        unsigned char ch = (unsigned char)b;
        mk_vocab_line(f, id, &ch, 1);
    }

    /* Multi-byte tokens, in order of preference, without duplicates. */
    const size_t nw = sizeof(mk_words) / sizeof(mk_words[0]);
    const size_t np = sizeof(mk_pieces) / sizeof(mk_pieces[0]);
    const size_t ns = sizeof(mk_syllables) / sizeof(mk_syllables[0]);
    static const char letters[] = "etaoinshrdlcumwfgypbvkjxqz";
    for (int stage = 0; id <= want; stage++) {
        size_t count;
        switch (stage) {
        case 0: count = np; break;                 /* punctuation and affixes */
        case 1: case 2: case 3: count = nw; break; /* " word", "word", " Word" */
        case 4: case 5: count = ns * ns; break;    /* " conta", "conta" */
        case 6: case 7: count = 26 * 26; break;    /* "ab", " ab" */
        default: count = 26 * 26 * 26; break;      /* "abc" + s repeated */
        }
        for (size_t k = 0; k < count && id <= want; k++) {
            switch (stage) {
            case 0:
                snprintf(tok, sizeof(tok), "%s", mk_pieces[k]);
                break;
            case 1:
                snprintf(tok, sizeof(tok), " %s", mk_words[k]);
                break;
            case 2:
                snprintf(tok, sizeof(tok), "%s", mk_words[k]);
                break;
            case 3:
                snprintf(tok, sizeof(tok), " %s", mk_words[k]);
                tok[1] = (char)(tok[1] - 'a' + 'A');
                break;
            case 4:
            case 5:
                snprintf(tok, sizeof(tok), "%s%s%s", stage == 4 ? " " : "",
                         mk_syllables[k / ns], mk_syllables[k % ns]);
                break;
            case 6:
            case 7:
                snprintf(tok, sizeof(tok), "%s%c%c", stage == 7 ? " " : "", letters[k % 26],
                         letters[k / 26]);
                break;
            default: {
                int rep = stage - 8;
                if (rep > 40) {
                    e = wk_diag_set(d, WK_EINVAL, "vocab %d too large for the generator",
                                    c->vocab);
                    goto fail;
                }
                int n = snprintf(tok, sizeof(tok), "%c%c%c", letters[k % 26],
                                 letters[(k / 26) % 26], letters[k / 676]);
                for (int s = 0; s < rep && n < (int)sizeof(tok) - 1; s++)
                    tok[n++] = 's';
                tok[n] = '\0';
                break;
            }
            }
            if (strlen(tok) < 2)
                continue; /* single bytes are already ids 1..256 */
            int r = mk_tokset_add(&ts, tok);
            if (r < 0) {
                e = wk_diag_set(d, WK_ENOMEM, "vocab table");
                goto fail;
            }
            if (r == 1) {
                mk_vocab_line(f, id, (const unsigned char *)tok, strlen(tok));
                id++;
            }
        }
    }
    e = mk_file_commit(f, tmp, c->out, "rwkv_vocab_v20230424.txt", d);
    f = NULL;
fail:
    if (f) {
        fclose(f);
        unlink(tmp);
    }
    for (size_t i = 0; i < ts.cap; i++)
        free(ts.tok[i]);
    free(ts.tok);
    return e;
}

/*
 * Reads c->vocab_file into c->vocab_buf and checks it with wk_tok; fills
 * *rows with the rows the model needs (the largest id + 1). Writes nothing.
 */
WK_MUST_CHECK static wk_err
mk_read_vocab_file(mk_cfg *c, uint32_t *rows, wk_diag *d)
{
    FILE *f = fopen(c->vocab_file, "rb");
    if (!f)
        return wk_diag_set(d, WK_EIO, "%s: %s", c->vocab_file, strerror(errno));
    unsigned char *buf = malloc(MK_MAX_VOCAB_FILE + 1);
    size_t n = buf ? fread(buf, 1, MK_MAX_VOCAB_FILE + 1, f) : 0;
    int bad = buf ? ferror(f) : 0;
    fclose(f);
    if (!buf)
        return wk_diag_set(d, WK_ENOMEM, "reading %s", c->vocab_file);
    if (bad || n > MK_MAX_VOCAB_FILE) {
        free(buf);
        return wk_diag_set(d, bad ? WK_EIO : WK_ETOOBIG, "%s: %s", c->vocab_file,
                           bad ? "read error" : "over 64 MiB");
    }
    wk_tok *t = NULL;
    wk_err e = wk_tok_load_mem(buf, n, &t, d);
    if (e != WK_OK) {
        free(buf);
        wk_diag_prefix(d, "%s", c->vocab_file);
        return e;
    }
    *rows = wk_tok_vocab_size(t);
    wk_tok_free(t);
    c->vocab_buf = buf;
    c->vocab_len = n;
    return WK_OK;
}

/* Writes c->vocab_buf as the model's rwkv_vocab_v20230424.txt. */
WK_MUST_CHECK static wk_err
mk_copy_vocab(const mk_cfg *c, wk_diag *d)
{
    char tmp[MK_PATH_MAX];
    FILE *f = NULL;
    wk_err e = mk_file_open(c->out, "rwkv_vocab_v20230424.txt", tmp, sizeof(tmp), &f, d);
    if (e != WK_OK)
        return e;
    if (fwrite(c->vocab_buf, 1, c->vocab_len, f) != c->vocab_len) {
        fclose(f);
        unlink(tmp);
        return wk_diag_set(d, WK_EIO, "%s: write failed", tmp);
    }
    return mk_file_commit(f, tmp, c->out, "rwkv_vocab_v20230424.txt", d);
}

/* ------------------------------------------------------------------------ */
/* command line                                                              */

/* The command line as wk_cfg fills it; main() checks it into an mk_cfg. */
typedef struct mk_args {
    const char *out, *vocab_file, *dtype;
    uint32_t layers, embd, head_size, ffn, vocab;
    uint32_t lora_w, lora_a, lora_v, lora_g; /* 0: from C */
    uint64_t seed;
    bool force;
} mk_args;

/* The option table: --help prints it (wk_cfg_tool). */
static const wk_cfg_opt mk_table[] = {
    {"out", WK_CFG_STR, NULL, 0, 0, "output directory (created; must be empty); required"},
    {"layers", WK_CFG_U64, "4", 1, MK_MAX_LAYERS, "layers"},
    {"embd", WK_CFG_U64, "256", 1, MK_MAX_EMBD, "hidden size C"},
    {"head-size", WK_CFG_U64, "64", 1, MK_MAX_EMBD, "head size, divides C"},
    {"ffn", WK_CFG_U64, NULL, 1, MK_MAX_FFN, "channel-mix width (default 4*C)"},
    {"vocab", WK_CFG_U64, "4096", 257, MK_MAX_VOCAB,
     "vocab rows incl. token 0 (with --vocab-file, when not given: its largest id + 1 rounded "
     "up to 64)"},
    {"vocab-file", WK_CFG_STR, NULL, 0, 0,
     "copy this World vocab (rwkv_vocab_v20230424.txt) instead of generating one"},
    {"lora-w", WK_CFG_U64, NULL, 1, MK_MAX_LORA, "decay LoRA rank (default from C)"},
    {"lora-a", WK_CFG_U64, NULL, 1, MK_MAX_LORA,
     "in-context learning rate LoRA rank (default from C)"},
    {"lora-v", WK_CFG_U64, NULL, 1, MK_MAX_LORA, "value-residual LoRA rank (default from C)"},
    {"lora-g", WK_CFG_U64, NULL, 1, MK_MAX_LORA, "gate LoRA rank (default from C)"},
    {"dtype", WK_CFG_STR, "bf16", 0, 0, "f32 or bf16"},
    {"seed", WK_CFG_U64, "1", 0, UINT64_MAX, "PRNG seed"},
    {"force", WK_CFG_BOOL, NULL, 0, 0, "write into a non-empty directory"},
};

#define MK_BIND(opt, type, field) WK_CFG_BIND(mk_args, opt, type, field)
static const wk_cfg_bind mk_binds[] = {
    MK_BIND("out", STR, out),           MK_BIND("layers", U32, layers),
    MK_BIND("embd", U32, embd),         MK_BIND("head-size", U32, head_size),
    MK_BIND("ffn", U32, ffn),           MK_BIND("vocab", U32, vocab),
    MK_BIND("vocab-file", STR, vocab_file), MK_BIND("lora-w", U32, lora_w),
    MK_BIND("lora-a", U32, lora_a),     MK_BIND("lora-v", U32, lora_v),
    MK_BIND("lora-g", U32, lora_g),     MK_BIND("dtype", STR, dtype),
    MK_BIND("seed", U64, seed),         MK_BIND("force", BOOL, force),
};

static const wk_cfg_tool mk_tool = {
    .prog = "wkvm-mkmodel",
    .about = "Writes a small deterministic RWKV-7 model (HF layout: config.json,\n"
             "model.safetensors, rwkv_vocab_v20230424.txt).",
    .opts = mk_table,
    .n_opts = sizeof(mk_table) / sizeof(mk_table[0]),
    .binds = mk_binds,
    .n_binds = sizeof(mk_binds) / sizeof(mk_binds[0]),
};

/* BlinkDL's LoRA rank rule: max(32, round(k * C^p / 32) * 32). */
static int
mk_lora_default(int C, double k, double p)
{
    int d = (int)lround(k * pow((double)C, p) / 32.0) * 32;
    return d < 32 ? 32 : d;
}

/* Checks c (as parsed) and writes the model; the exit status. */
static int
mk_run(mk_cfg c, bool vocab_set)
{
    if (c.embd % c.head_size != 0) {
        fprintf(stderr, "wkvm-mkmodel: --head-size %d does not divide --embd %d\n",
                c.head_size, c.embd);
        return 2;
    }
    if (c.ffn == 0)
        c.ffn = 4 * c.embd > MK_MAX_FFN ? MK_MAX_FFN : 4 * c.embd;
    if (c.lora_w == 0)
        c.lora_w = mk_lora_default(c.embd, 1.8, 0.5);
    if (c.lora_a == 0)
        c.lora_a = mk_lora_default(c.embd, 1.8, 0.5);
    if (c.lora_v == 0)
        c.lora_v = mk_lora_default(c.embd, 1.3, 0.5);
    if (c.lora_g == 0)
        c.lora_g = mk_lora_default(c.embd, 0.6, 0.8);

    wk_diag d = {{0}};
    mk_plan plan = {0};
    wk_err e = WK_OK;
    if (c.vocab_file != NULL) {
        uint32_t rows = 0;
        if ((e = mk_read_vocab_file(&c, &rows, &d)) != WK_OK) {
            fprintf(stderr, "wkvm-mkmodel: --vocab-file: %s\n", d.msg);
            return 1;
        }
        uint32_t want = rows < 257 ? 257 : (rows + 63u) / 64u * 64u;
        if (!vocab_set) {
            c.vocab = (int)want;
        } else if ((uint32_t)c.vocab < rows) {
            fprintf(stderr, "wkvm-mkmodel: --vocab %d is under the %u rows %s needs\n", c.vocab,
                    rows, c.vocab_file);
            free(c.vocab_buf);
            return 2;
        }
        if (c.vocab > MK_MAX_VOCAB) {
            fprintf(stderr, "wkvm-mkmodel: %s needs %d rows, over %d\n", c.vocab_file, c.vocab,
                    MK_MAX_VOCAB);
            free(c.vocab_buf);
            return 2;
        }
    }
    if (e == WK_OK)
        e = mk_dir_prepare(c.out, c.force, &d);
    if (e == WK_OK)
        e = mk_plan_build(&c, &plan);
    if (e == WK_OK)
        e = mk_write_safetensors(&c, &plan, &d);
    if (e == WK_OK)
        e = mk_write_config(&c, &d);
    if (e == WK_OK)
        e = c.vocab_file != NULL ? mk_copy_vocab(&c, &d) : mk_write_vocab(&c, &d);
    free(c.vocab_buf);
    if (e != WK_OK) {
        fprintf(stderr, "wkvm-mkmodel: %s%s%s\n", wk_strerror(e), d.msg[0] ? ": " : "", d.msg);
        free(plan.t);
        return 1;
    }
    uint64_t elems = 0;
    for (size_t i = 0; i < plan.n; i++)
        elems += (uint64_t)mk_tensor_numel(&plan.t[i]);
    printf("wrote %s: rwkv7 L%d C%d N%d F%d V%d lora w%d a%d v%d g%d %s, %" PRIu64
           " params, seed %" PRIu64 "\n",
           c.out, c.layers, c.embd, c.head_size, c.ffn, c.vocab, c.lora_w, c.lora_a, c.lora_v,
           c.lora_g, c.dtype == MK_DTYPE_F32 ? "f32" : "bf16", elems, c.seed);
    free(plan.t);
    return 0;
}

int
main(int argc, char **argv)
{
    mk_args a = {0};
    wk_cfg *cfg = NULL;
    int prc = wk_cfg_tool_parse(&mk_tool, argc, argv, &a, &cfg);
    if (prc != WK_CFG_TOOL_RUN)
        return prc;
    /* every number is within its table limits, which fit an int */
    mk_cfg c = {
        .out = a.out, .layers = (int)a.layers, .embd = (int)a.embd,
        .head_size = (int)a.head_size, .ffn = (int)a.ffn, .vocab = (int)a.vocab,
        .lora_w = (int)a.lora_w, .lora_a = (int)a.lora_a, .lora_v = (int)a.lora_v,
        .lora_g = (int)a.lora_g, .seed = a.seed, .force = a.force, .vocab_file = a.vocab_file,
    };
    bool vocab_set = wk_cfg_is_set(cfg, "vocab");
    if (strcmp(a.dtype, "f32") == 0) {
        c.dtype = MK_DTYPE_F32;
    } else if (strcmp(a.dtype, "bf16") == 0) {
        c.dtype = MK_DTYPE_BF16;
    } else {
        fprintf(stderr, "wkvm-mkmodel: --dtype: '%s' is not f32 or bf16\n", a.dtype);
        wk_cfg_free(cfg);
        return 2;
    }
    if (!c.out || !*c.out) {
        fprintf(stderr, "wkvm-mkmodel: --out DIR is required (see --help)\n");
        wk_cfg_free(cfg);
        return 2;
    }
    int rc = mk_run(c, vocab_set);
    wk_cfg_free(cfg);
    return rc;
}

