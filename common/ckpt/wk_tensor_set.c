/*
 * wk_tensor_set: the set of tensors in a checkpoint, whatever its container
 * (declared in wk_tensor.h). wk_tensor_set_open() picks the reader from the
 * path and the first bytes (wk_safetensors.c, wk_pth.c, wk_gguf.c), lets it
 * validate the file, then sorts the tensors by name and refuses duplicates
 * so that lookups are a binary search. The set owns its mappings and names;
 * it never copies tensor bytes, never writes to a file and never logs.
 *
 * It sits above the readers, which build on wk_tensor.c below it: the one
 * direction wk_tensor.c -> readers -> wk_tensor_set.c.
 */
#include "wk_tensor.h"

#include <stdlib.h>
#include <string.h>

#include "wk_gguf.h"
#include "wk_pth.h"
#include "wk_safetensors.h"
#include "wk_tensor_priv.h"

struct wk_tensor_set {
    wk_map *maps;      /* mapped files backing the tensors */
    size_t n_maps;     /* entries in maps */
    wk_tensor *v;      /* tensors sorted by name; names owned here */
    size_t n;          /* entries in v */
    void *owner;                 /* wk_tensor_set_new(): what backs the data, owned */
    void (*owner_free)(void *);  /* frees owner, NULL when there is none */
};

static int
wk_tensor_cmp_name(const void *a, const void *b)
{
    return strcmp(((const wk_tensor *)a)->name, ((const wk_tensor *)b)->name);
}

static int
wk_path_has_suffix(const char *path, const char *suffix)
{
    size_t n = strlen(path), k = strlen(suffix);
    return n >= k && strcmp(path + n - k, suffix) == 0;
}

/* Reads one file (not an index) into maps[0] and l. */
static wk_err
wk_tensor_set_open_file(const char *path, wk_map *map, wk_tensor_list *l, wk_diag *d)
{
    wk_err err = wk_map_open(path, 0, map, d);
    if (err != WK_OK)
        return err;
    const uint8_t *p = map->data;
    if (map->len >= 4 && memcmp(p, "PK\x03\x04", 4) == 0) {
        err = wk_pth_parse(p, map->len, l, d);
    } else if (map->len >= 4 && memcmp(p, "GGUF", 4) == 0) {
        wk_gguf *g = NULL;
        err = wk_gguf_parse(p, map->len, &g, d);
        for (size_t i = 0; err == WK_OK && i < wk_gguf_tensor_count(g); i++) {
            const wk_tensor *t = wk_gguf_tensor_at(g, i);
            if ((err = wk_tensor_list_push(l, t, t->name, strlen(t->name))) != WK_OK)
                wk_diag_set(d, err, "out of memory");
        }
        wk_gguf_free(g);
        if (err != WK_OK)
            wk_tensor_list_fini(l);
    } else if (map->len >= 4 && memcmp(p, "\x80\x02\x8a\x0a", 4) == 0) {
        /* PROTO 2, LONG1 of 10 bytes: the magic number legacy torch.save() pickles first */
        err = wk_diag_set(d, WK_ENOTSUP,
                          "legacy (pre-1.6, non-zip) torch serialization is not supported; "
                          "re-save with torch.save() from torch >= 1.6");
    } else {
        err = wk_st_parse(p, map->len, l, d);
    }
    if (err != WK_OK) {
        wk_diag_prefix(d, "%s", path);
        wk_map_close(map);
    }
    return err;
}

wk_err
wk_tensor_set_open(const char *path, wk_tensor_set **out, wk_diag *d)
{
    if (path == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "wk_tensor_set_open: NULL argument");
    wk_tensor_set *set = calloc(1, sizeof(*set));
    if (set == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    wk_err err;
    if (wk_path_has_suffix(path, ".json")) {
        err = wk_st_index_open(path, &set->maps, &set->n_maps, &l, d);
    } else {
        set->maps = calloc(1, sizeof(*set->maps));
        if (set->maps == NULL) {
            err = wk_diag_set(d, WK_ENOMEM, "out of memory");
        } else {
            err = wk_tensor_set_open_file(path, set->maps, &l, d);
            if (err == WK_OK)
                set->n_maps = 1;
        }
    }
    if (err != WK_OK)
        goto fail;
    if (l.n > 1)
        qsort(l.v, l.n, sizeof(*l.v), wk_tensor_cmp_name);
    for (size_t i = 1; i < l.n; i++) {
        if (strcmp(l.v[i - 1].name, l.v[i].name) == 0) {
            err = wk_diag_set(d, WK_EINVAL, "%s: duplicate tensor name '%s'", path, l.v[i].name);
            goto fail;
        }
    }
    set->v = l.v;
    set->n = l.n;
    *out = set;
    return WK_OK;
fail:
    wk_tensor_list_fini(&l);
    wk_tensor_set_free(set);
    return err;
}

wk_err
wk_tensor_set_new(const wk_tensor *v, size_t n, void *owner, void (*owner_free)(void *),
                  wk_tensor_set **out, wk_diag *d)
{
    if ((v == NULL && n > 0) || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "wk_tensor_set_new: NULL argument");
    wk_tensor_set *set = calloc(1, sizeof(*set));
    if (set == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    wk_err err = WK_OK;
    for (size_t i = 0; i < n; i++) {
        size_t nb;
        if (v[i].name == NULL || wk_tensor_size(v[i].dtype, v[i].ndim, v[i].shape, NULL, &nb) !=
                                     WK_OK || nb != v[i].nbytes) {
            err = wk_diag_set(d, WK_EINVAL, "tensor '%s': bad view",
                              v[i].name ? v[i].name : "(null)");
            goto fail;
        }
        if ((err = wk_tensor_list_push(&l, &v[i], v[i].name, strlen(v[i].name))) != WK_OK) {
            wk_diag_set(d, err, "out of memory");
            goto fail;
        }
    }
    if (l.n > 1)
        qsort(l.v, l.n, sizeof(*l.v), wk_tensor_cmp_name);
    for (size_t i = 1; i < l.n; i++) {
        if (strcmp(l.v[i - 1].name, l.v[i].name) == 0) {
            err = wk_diag_set(d, WK_EINVAL, "duplicate tensor name '%s'", l.v[i].name);
            goto fail;
        }
    }
    set->v = l.v;
    set->n = l.n;
    set->owner = owner;
    set->owner_free = owner_free;
    *out = set;
    return WK_OK;
fail:
    wk_tensor_list_fini(&l);
    free(set);
    return err;
}

void
wk_tensor_set_free(wk_tensor_set *set)
{
    if (set == NULL)
        return;
    if (set->owner_free != NULL)
        set->owner_free(set->owner);
    for (size_t i = 0; i < set->n; i++)
        free((char *)set->v[i].name);
    free(set->v);
    for (size_t i = 0; i < set->n_maps; i++)
        wk_map_close(&set->maps[i]);
    free(set->maps);
    free(set);
}

size_t
wk_tensor_set_count(const wk_tensor_set *set)
{
    return set ? set->n : 0;
}

const wk_tensor *
wk_tensor_set_at(const wk_tensor_set *set, size_t i)
{
    if (set == NULL || i >= set->n)
        return NULL;
    return &set->v[i];
}

const wk_tensor *
wk_tensor_set_find(const wk_tensor_set *set, const char *name)
{
    if (set == NULL || name == NULL)
        return NULL;
    size_t lo = 0, hi = set->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, set->v[mid].name);
        if (c == 0)
            return &set->v[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}
