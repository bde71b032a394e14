/*
 * rwkv7_synth: test helper that writes small deterministic RWKV-7 model
 * directories (safetensors) in either naming convention, with the same
 * values whatever the convention, and lets a test break them on purpose
 * (drop, reshape, rename or add a tensor). Header-only; test code only.
 *
 * Values come from a splitmix64 stream keyed by the seed and the canonical
 * (BlinkDL) tensor name, so a tensor's values do not depend on the others
 * or on the convention. HF LoRA matrices are written transposed, vectors as
 * [C] (HF) or [1,1,C] (BlinkDL), as the real checkpoints do.
 */
#ifndef RWKV7_SYNTH_H
#define RWKV7_SYNTH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wk_tensor.h"

typedef struct synth_cfg {
    int L, C, N, F, V;      /* layers, embd, head size, ffn, vocab */
    int Dw, Da, Dv, Dg;     /* LoRA ranks */
    wk_dtype dtype;         /* stored dtype of matrices and vectors */
    bool hf;                /* HF fla-hub names (else BlinkDL) */
    bool layer0_v;          /* write v0/v1/v2 on layer 0 too */
    uint64_t seed;          /* value stream */
    bool vocab;             /* write rwkv_vocab_v20230424.txt (256 byte tokens) */
    const char *file;       /* checkpoint file name, NULL: model.safetensors / blink.safetensors */
    /* sabotage, by written (convention) name */
    const char *drop;       /* leave this tensor out */
    const char *reshape;    /* give this tensor reshape_dims */
    int64_t reshape_dims[3]; /* new shape, 0-terminated */
    const char *extra;      /* add a [C] tensor with this name */
} synth_cfg;

static inline synth_cfg
synth_default(void)
{
    synth_cfg c;
    memset(&c, 0, sizeof(c));
    c.L = 2;
    c.C = 64;
    c.N = 16;
    c.F = 128;
    c.V = 300;
    c.Dw = 8;
    c.Da = 12;
    c.Dv = 6;
    c.Dg = 16;
    c.dtype = WK_DTYPE_BF16;
    c.hf = true;
    c.seed = 1;
    c.vocab = true;
    return c;
}

typedef struct synth_t {
    char name[128];   /* written name */
    int ndim;         /* dims */
    int64_t shape[3]; /* written shape */
    float *v;         /* values in written order */
    size_t n;         /* elements */
} synth_t;

typedef struct synth_list {
    synth_t *t;
    size_t n, cap;
} synth_list;

static inline uint64_t
synth_mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static inline float
synth_unif(uint64_t *s, float lo, float hi)
{
    double u = (double)(synth_mix(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

static inline void
synth_fill(const synth_cfg *c, const char *canon, float *v, size_t n, float lo, float hi)
{
    uint64_t s = c->seed * 1000003u;
    for (const char *p = canon; *p; p++)
        s = (s ^ (uint8_t)*p) * 1099511628211ull;
    for (size_t i = 0; i < n; i++)
        v[i] = synth_unif(&s, lo, hi);
}

/*
 * Adds a tensor: canonical values of canonical shape [d0] or [d0, d1]
 * (BlinkDL orientation); written as name with the given layout.
 * kind: 'v' vector ([1,1,C] blink, [C] hf), 'p' plain vector [d0],
 * 'm' matrix as is, 't' matrix transposed in HF.
 */
static inline void
synth_add(synth_list *l, const synth_cfg *c, const char *canon, const char *name, char kind,
          int64_t d0, int64_t d1, float lo, float hi)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->t = realloc(l->t, l->cap * sizeof(*l->t));
    }
    synth_t *t = &l->t[l->n++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->n = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    float *canv = malloc(t->n * sizeof(float));
    synth_fill(c, canon, canv, t->n, lo, hi);
    if (kind == 'v' && !c->hf) {
        t->ndim = 3;
        t->shape[0] = 1;
        t->shape[1] = 1;
        t->shape[2] = d0;
    } else if (kind == 'v' || kind == 'p') {
        t->ndim = 1;
        t->shape[0] = d0;
    } else if (kind == 't' && c->hf) {
        t->ndim = 2;
        t->shape[0] = d1;
        t->shape[1] = d0;
        float *tv = malloc(t->n * sizeof(float));
        for (int64_t i = 0; i < d0; i++)
            for (int64_t j = 0; j < d1; j++)
                tv[j * d0 + i] = canv[i * d1 + j];
        free(canv);
        canv = tv;
    } else {
        t->ndim = 2;
        t->shape[0] = d0;
        t->shape[1] = d1;
    }
    t->v = canv;
}

static inline void
synth_list_free(synth_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->t[i].v);
    free(l->t);
    memset(l, 0, sizeof(*l));
}

static inline void
synth_build(const synth_cfg *c, synth_list *l)
{
    const int C = c->C, H = c->C / c->N, N = c->N, F = c->F, V = c->V;
    const float sc = 1.7320508f / sqrtf((float)C);
    char canon[128], name[128];
    memset(l, 0, sizeof(*l));

#define NM(fmt_b, fmt_h, ...)                                                  \
    do {                                                                       \
        snprintf(canon, sizeof(canon), fmt_b, __VA_ARGS__);                    \
        if (c->hf)                                                             \
            snprintf(name, sizeof(name), fmt_h, __VA_ARGS__);                  \
        else                                                                   \
            snprintf(name, sizeof(name), fmt_b, __VA_ARGS__);                  \
    } while (0)

    NM("emb.weight%s", "model.embeddings.weight%s", "");
    synth_add(l, c, canon, name, 'm', V, C, -0.8f, 0.8f);
    NM("blocks.0.ln0.weight%s", "model.layers.0.pre_norm.weight%s", "");
    synth_add(l, c, canon, name, 'p', C, 0, 0.9f, 1.1f);
    NM("blocks.0.ln0.bias%s", "model.layers.0.pre_norm.bias%s", "");
    synth_add(l, c, canon, name, 'p', C, 0, -0.05f, 0.05f);
    for (int i = 0; i < c->L; i++) {
        NM("blocks.%d.ln1.weight", "model.layers.%d.attn_norm.weight", i);
        synth_add(l, c, canon, name, 'p', C, 0, 0.9f, 1.1f);
        NM("blocks.%d.ln1.bias", "model.layers.%d.attn_norm.bias", i);
        synth_add(l, c, canon, name, 'p', C, 0, -0.05f, 0.05f);
        NM("blocks.%d.ln2.weight", "model.layers.%d.ffn_norm.weight", i);
        synth_add(l, c, canon, name, 'p', C, 0, 0.9f, 1.1f);
        NM("blocks.%d.ln2.bias", "model.layers.%d.ffn_norm.bias", i);
        synth_add(l, c, canon, name, 'p', C, 0, -0.05f, 0.05f);
        static const char *const mix[] = {"x_r", "x_w", "x_k", "x_v", "x_a", "x_g"};
        for (int j = 0; j < 6; j++) {
            snprintf(canon, sizeof(canon), "blocks.%d.att.%s", i, mix[j]);
            snprintf(name, sizeof(name), c->hf ? "model.layers.%d.attn.%s" : "blocks.%d.att.%s",
                     i, mix[j]);
            /* x_* are [1,1,C] in both conventions */
            synth_add(l, c, canon, name, 'm', 1, C, 0.0f, 1.0f);
            l->t[l->n - 1].ndim = 3;
            l->t[l->n - 1].shape[0] = 1;
            l->t[l->n - 1].shape[1] = 1;
            l->t[l->n - 1].shape[2] = C;
        }
        struct {
            const char *b, *h; /* lora letter */
            int D;
            float blo, bhi;
        } lo[] = {{"w", "w", c->Dw, -1.5f, 1.0f}, {"a", "a", c->Da, -1.0f, 1.0f},
                  {"v", "v", c->Dv, -1.0f, 1.0f}, {"g", "g", c->Dg, 0, 0}};
        for (int j = 0; j < 4; j++) {
            if (j == 2 && i == 0 && !c->layer0_v)
                continue;
            if (j < 3) {
                NM("blocks.%d.att.%s0", "model.layers.%d.attn.%s_lora.lora.2.bias", i, lo[j].b);
                synth_add(l, c, canon, name, 'v', C, 0, lo[j].blo, lo[j].bhi);
            }
            NM("blocks.%d.att.%s1", "model.layers.%d.attn.%s_lora.lora.0.weight", i, lo[j].b);
            synth_add(l, c, canon, name, 't', C, lo[j].D, -sc, sc);
            NM("blocks.%d.att.%s2", "model.layers.%d.attn.%s_lora.lora.2.weight", i, lo[j].b);
            float s2 = 1.7320508f / sqrtf((float)lo[j].D) * 0.5f;
            synth_add(l, c, canon, name, 't', lo[j].D, C, -s2, s2);
        }
        NM("blocks.%d.att.k_k", "model.layers.%d.attn.k_k", i);
        synth_add(l, c, canon, name, 'v', C, 0, 0.6f, 1.1f);
        NM("blocks.%d.att.k_a", "model.layers.%d.attn.k_a", i);
        synth_add(l, c, canon, name, 'v', C, 0, 0.5f, 1.5f);
        NM("blocks.%d.att.r_k", "model.layers.%d.attn.r_k", i);
        synth_add(l, c, canon, name, 'm', H, N, -0.3f, 0.3f);
        static const char *const pb[] = {"receptance", "key", "value", "output"};
        static const char *const ph[] = {"r_proj", "k_proj", "v_proj", "o_proj"};
        for (int j = 0; j < 4; j++) {
            snprintf(canon, sizeof(canon), "blocks.%d.att.%s.weight", i, pb[j]);
            if (c->hf)
                snprintf(name, sizeof(name), "model.layers.%d.attn.%s.weight", i, ph[j]);
            else
                snprintf(name, sizeof(name), "%s", canon);
            synth_add(l, c, canon, name, 'm', C, C, -sc, sc);
        }
        NM("blocks.%d.att.ln_x.weight", "model.layers.%d.attn.g_norm.weight", i);
        synth_add(l, c, canon, name, 'p', C, 0, 0.9f, 1.1f);
        NM("blocks.%d.att.ln_x.bias", "model.layers.%d.attn.g_norm.bias", i);
        synth_add(l, c, canon, name, 'p', C, 0, -0.05f, 0.05f);
        NM("blocks.%d.ffn.x_k", "model.layers.%d.ffn.x_k", i);
        synth_add(l, c, canon, name, 'v', C, 0, 0.0f, 1.0f);
        NM("blocks.%d.ffn.key.weight", "model.layers.%d.ffn.key.weight", i);
        synth_add(l, c, canon, name, 'm', F, C, -sc, sc);
        NM("blocks.%d.ffn.value.weight", "model.layers.%d.ffn.value.weight", i);
        float sf = 1.7320508f / sqrtf((float)F) * 0.5f;
        synth_add(l, c, canon, name, 'm', C, F, -sf, sf);
    }
    NM("ln_out.weight%s", "model.norm.weight%s", "");
    synth_add(l, c, canon, name, 'p', C, 0, 0.9f, 1.1f);
    NM("ln_out.bias%s", "model.norm.bias%s", "");
    synth_add(l, c, canon, name, 'p', C, 0, -0.05f, 0.05f);
    NM("head.weight%s", "lm_head.weight%s", "");
    synth_add(l, c, canon, name, 'm', V, C, -2.0f * sc, 2.0f * sc);
#undef NM
}

static inline const char *
synth_dtype_str(wk_dtype d)
{
    return d == WK_DTYPE_F32 ? "F32" : d == WK_DTYPE_F16 ? "F16" : "BF16";
}

/* Writes a safetensors file from l (after sabotage). Returns 0 on success. */
static inline int
synth_write_st(const char *path, const synth_cfg *c, const synth_list *l)
{
    const size_t es = wk_dtype_size(c->dtype);
    size_t hcap = 1 << 16, hlen = 0;
    char *hdr = malloc(hcap);
    uint64_t off = 0;
    hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "{");
    bool first = true;
    for (size_t i = 0; i < l->n; i++) {
        const synth_t *t = &l->t[i];
        if (c->drop != NULL && strcmp(t->name, c->drop) == 0)
            continue;
        int64_t shape[3];
        int ndim = t->ndim;
        memcpy(shape, t->shape, sizeof(shape));
        size_t n = t->n;
        if (c->reshape != NULL && strcmp(t->name, c->reshape) == 0) {
            ndim = 0;
            n = 1;
            while (ndim < 3 && c->reshape_dims[ndim] > 0) {
                shape[ndim] = c->reshape_dims[ndim];
                n *= (size_t)shape[ndim];
                ndim++;
            }
        }
        if (hcap - hlen < 512) {
            hcap *= 2;
            hdr = realloc(hdr, hcap);
        }
        hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                 first ? "" : ",", t->name, synth_dtype_str(c->dtype));
        for (int d = 0; d < ndim; d++)
            hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "%s%lld", d ? "," : "",
                                     (long long)shape[d]);
        hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "],\"data_offsets\":[%llu,%llu]}",
                                 (unsigned long long)off, (unsigned long long)(off + n * es));
        off += n * es;
        first = false;
    }
    if (c->extra != NULL) {
        hlen += (size_t)snprintf(hdr + hlen, hcap - hlen,
                                 ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%d],\"data_offsets\":"
                                 "[%llu,%llu]}",
                                 c->extra, synth_dtype_str(c->dtype), c->C,
                                 (unsigned long long)off,
                                 (unsigned long long)(off + (uint64_t)c->C * es));
        off += (uint64_t)c->C * es;
    }
    hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "}");
    while (hlen % 8 != 0)
        hdr[hlen++] = ' ';

    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        free(hdr);
        return -1;
    }
    uint64_t hl = hlen;
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(hl >> (8 * i));
    fwrite(le, 1, 8, f);
    fwrite(hdr, 1, hlen, f);
    free(hdr);
    for (size_t i = 0; i <= l->n; i++) {
        const float *v;
        size_t n;
        float *zeros = NULL;
        if (i == l->n) {
            if (c->extra == NULL)
                break;
            zeros = calloc((size_t)c->C, sizeof(float));
            v = zeros;
            n = (size_t)c->C;
        } else {
            const synth_t *t = &l->t[i];
            if (c->drop != NULL && strcmp(t->name, c->drop) == 0)
                continue;
            v = t->v;
            n = t->n;
            if (c->reshape != NULL && strcmp(t->name, c->reshape) == 0) {
                size_t m = 1;
                for (int d = 0; d < 3 && c->reshape_dims[d] > 0; d++)
                    m *= (size_t)c->reshape_dims[d];
                if (m != n) {
                    zeros = calloc(m, sizeof(float));
                    memcpy(zeros, t->v, (m < n ? m : n) * sizeof(float));
                    v = zeros;
                    n = m;
                }
            }
        }
        for (size_t j = 0; j < n; j++) {
            if (c->dtype == WK_DTYPE_F32) {
                fwrite(&v[j], 4, 1, f);
            } else {
                uint16_t h = c->dtype == WK_DTYPE_BF16 ? wk_f32_to_bf16(v[j]) : wk_f32_to_f16(v[j]);
                uint8_t b[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
                fwrite(b, 1, 2, f);
            }
        }
        free(zeros);
    }
    return fclose(f) == 0 ? 0 : -1;
}

static inline int
synth_write_vocab(const char *dir)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/rwkv_vocab_v20230424.txt", dir);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    for (int i = 0; i < 256; i++)
        fprintf(f, "%d b'\\x%02x' 1\n", i + 1, i);
    return fclose(f) == 0 ? 0 : -1;
}

/* Writes the model directory dir (created if needed). Returns 0 on success. */
static inline int
synth_write(const char *dir, const synth_cfg *c)
{
    char path[1024];
    synth_list l;
    mkdir(dir, 0755);
    synth_build(c, &l);
    snprintf(path, sizeof(path), "%s/%s", dir,
             c->file ? c->file : c->hf ? "model.safetensors" : "blink.safetensors");
    int rc = synth_write_st(path, c, &l);
    synth_list_free(&l);
    if (rc == 0 && c->vocab)
        rc = synth_write_vocab(dir);
    return rc;
}

/* A fresh temporary directory under TMPDIR (or /tmp); caller removes it. */
static inline void
synth_tmpdir(char *out, size_t len, const char *tag)
{
    const char *base = getenv("TMPDIR");
    snprintf(out, len, "%s/wkvm-%s-XXXXXX", base && base[0] ? base : "/tmp", tag);
    if (mkdtemp(out) == NULL)
        out[0] = '\0';
}

/* Removes a directory holding only plain files (what these tests create). */
static inline void
synth_rmdir(const char *dir)
{
    char path[1200];
    if (dir == NULL || dir[0] == '\0' || strstr(dir, "/wkvm-") == NULL)
        return;
    DIR *dh = opendir(dir);
    if (dh != NULL) {
        struct dirent *de;
        while ((de = readdir(dh)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
            unlink(path);
        }
        closedir(dh);
    }
    rmdir(dir);
}

#endif /* RWKV7_SYNTH_H */
