/*
 * tset_synth: test helper that writes a small model directory from a list of
 * named tensor shapes (fp32 safetensors, deterministic values) and a
 * config.json text, and loads it through wrk_model_load(), so that a family
 * mapping can be checked on a tiny synthetic checkpoint: the view's fields,
 * and every refusal with its message (drop, reshape or add a tensor, change
 * the config). Header-only; test code only.
 *
 * Values come from a splitmix64 stream keyed by the tensor's name, in
 * [-0.5, 0.5): the mappings read shapes and config, never the values.
 */
#ifndef TSET_SYNTH_H
#define TSET_SYNTH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wrk_model.h"

#define TSET_MAX 256 /* tensors in one set */

typedef struct tset_t {
    char name[160];   /* checkpoint name */
    int ndim;         /* 1..4 */
    int64_t shape[4]; /* dims */
} tset_t;

typedef struct tset {
    tset_t t[TSET_MAX];
    size_t n;
} tset;

/* Adds name with the given dims (trailing zeros end the shape). */
static inline void
tset_add(tset *s, const char *name, int64_t d0, int64_t d1, int64_t d2)
{
    if (s->n >= TSET_MAX)
        abort();
    tset_t *t = &s->t[s->n++];
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->shape[3] = 0;
    t->ndim = d2 > 0 ? 3 : d1 > 0 ? 2 : 1;
}

/* The entry named name, or NULL. */
static inline tset_t *
tset_find(tset *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->t[i].name, name) == 0)
            return &s->t[i];
    return NULL;
}

/* Removes name (which must be there). */
static inline void
tset_drop(tset *s, const char *name)
{
    tset_t *t = tset_find(s, name);
    if (t == NULL)
        abort();
    size_t i = (size_t)(t - s->t);
    memmove(&s->t[i], &s->t[i + 1], (s->n - i - 1) * sizeof(*t));
    s->n--;
}

/* Gives name (which must be there) another shape. */
static inline void
tset_reshape(tset *s, const char *name, int64_t d0, int64_t d1, int64_t d2)
{
    tset_t *t = tset_find(s, name);
    if (t == NULL)
        abort();
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->ndim = d2 > 0 ? 3 : d1 > 0 ? 2 : 1;
}

static inline size_t
tset_numel(const tset_t *t)
{
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (size_t)t->shape[d];
    return n;
}

/* Writes s as dir/model.safetensors (F32). Returns 0 on success. */
static inline int
tset_write_st(const tset *s, const char *dir)
{
    size_t hcap = 512 + s->n * 256, hlen = 0;
    char *hdr = malloc(hcap);
    if (hdr == NULL)
        return -1;
    uint64_t off = 0;
    hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < s->n; i++) {
        const tset_t *t = &s->t[i];
        hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[",
                                 t->name);
        for (int d = 0; d < t->ndim; d++)
            hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "%s%lld", d ? "," : "",
                                     (long long)t->shape[d]);
        uint64_t bytes = (uint64_t)tset_numel(t) * 4u;
        hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "],\"data_offsets\":[%llu,%llu]}",
                                 (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "}");
    while (hlen % 8 != 0)
        hdr[hlen++] = ' ';
    char path[1024];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        free(hdr);
        return -1;
    }
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    fwrite(le, 1, 8, f);
    fwrite(hdr, 1, hlen, f);
    free(hdr);
    for (size_t i = 0; i < s->n; i++) {
        const tset_t *t = &s->t[i];
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (const char *c = t->name; *c; c++)
            x = (x ^ (uint8_t)*c) * 0x100000001b3ull;
        size_t n = tset_numel(t);
        for (size_t j = 0; j < n; j++) {
            uint64_t z = (x += 0x9e3779b97f4a7c15ull);
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            z ^= z >> 31;
            float v = (float)((double)(z >> 40) / (double)(1ull << 24)) - 0.5f;
            fwrite(&v, 4, 1, f);
        }
    }
    return fclose(f) == 0 ? 0 : -1;
}

/* Removes a directory holding only plain files (what these tests create). */
static inline void
tset_rmdir(const char *dir)
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

/*
 * Writes s and config (config.json's text, NULL: none) into a fresh
 * temporary directory, loads it and removes the directory (the loaded model
 * keeps its mapping). Returns wrk_model_load()'s code; *m on WK_OK.
 */
static inline wk_err
tset_load(const tset *s, const char *config, wrk_model **m, wk_diag *d)
{
    const char *base = getenv("TMPDIR");
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/wkvm-tset-XXXXXX", base && base[0] ? base : "/tmp");
    if (mkdtemp(dir) == NULL)
        return WK_EIO;
    wk_err e = WK_EIO;
    if (tset_write_st(s, dir) == 0) {
        bool ok = true;
        if (config != NULL) {
            char path[1024];
            snprintf(path, sizeof(path), "%s/config.json", dir);
            FILE *f = fopen(path, "w");
            ok = f != NULL && fputs(config, f) >= 0;
            if (f != NULL && fclose(f) != 0)
                ok = false;
        }
        if (ok)
            e = wrk_model_load(dir, NULL, m, d);
    }
    tset_rmdir(dir);
    return e;
}

#endif /* TSET_SYNTH_H */
