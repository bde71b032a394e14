/*
 * wk_safetensors: validates safetensors headers and exposes the tensors of a
 * single file or of a sharded checkpoint (model.safetensors.index.json).
 *
 * Layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON
 * ({name: {"dtype", "shape", "data_offsets"}, "__metadata__": {str: str}}),
 * then the data section that data_offsets index. Everything in the header is
 * hostile: lengths, integers and offsets are checked against the buffer, and
 * tensors may not overlap. It must never read outside the buffer, never
 * follow a shard name out of the index's directory, and never log.
 */
#include "wk_safetensors.h"
#include "wk_bytes.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One tensor of a header while it is being validated. */
typedef struct wk_st_rec {
    const char *name;  /* key in the JSON header, borrowed from the json_t */
    size_t name_len;   /* bytes of name */
    uint64_t begin;    /* first byte in the data section */
    uint64_t end;      /* one past the last byte */
    wk_tensor t;       /* dtype and shape; data/nbytes set once offsets check out */
} wk_st_rec;

/* Reads a JSON integer >= 0 into *out. */
static int
wk_st_json_u64(const json_t *j, uint64_t *out)
{
    if (!json_is_integer(j) || json_integer_value(j) < 0)
        return 0;
    *out = (uint64_t)json_integer_value(j);
    return 1;
}

/*
 * Loads a JSON object. Without JSON_ALLOW_NUL jansson refuses "\u0000" in keys
 * and strings, so every name handed on is a proper C string.
 */
static wk_err
wk_st_load_json(const void *buf, size_t len, const char *what, json_t **out, wk_diag *d)
{
    json_error_t je;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
        if (json_error_code(&je) == json_error_duplicate_key)
            return wk_diag_set(d, WK_EINVAL, "%s: duplicate name (%s)", what, je.text);
        return wk_diag_set(d, WK_EINVAL, "%s: bad JSON at line %d column %d: %s", what, je.line,
                           je.column, je.text);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return wk_diag_set(d, WK_EINVAL, "%s: not a JSON object", what);
    }
    *out = root;
    return WK_OK;
}

/* Validates dtype and shape of one header entry into r->t. */
static wk_err
wk_st_entry(const char *name, const json_t *e, uint64_t data_len, wk_st_rec *r, wk_diag *d)
{
    if (!json_is_object(e))
        return wk_diag_set(d, WK_EINVAL, "tensor '%s': entry is not a JSON object", name);
    const json_t *jd = json_object_get(e, "dtype");
    const json_t *js = json_object_get(e, "shape");
    const json_t *jo = json_object_get(e, "data_offsets");
    if (!json_is_string(jd))
        return wk_diag_set(d, WK_EINVAL, "tensor '%s': missing or non-string \"dtype\"", name);
    if (wk_dtype_parse(json_string_value(jd), &r->t.dtype) != WK_OK)
        return wk_diag_set(d, WK_ENOTSUP, "tensor '%s': dtype '%s' not supported (F32, F16, BF16)",
                           name, json_string_value(jd));
    if (!json_is_array(js))
        return wk_diag_set(d, WK_EINVAL, "tensor '%s': missing or non-array \"shape\"", name);
    size_t ndim = json_array_size(js);
    if (ndim > WK_TENSOR_MAX_DIMS)
        return wk_diag_set(d, WK_ENOTSUP, "tensor '%s': %zu dimensions, at most %d supported",
                           name, ndim, WK_TENSOR_MAX_DIMS);
    r->t.ndim = (int)ndim;
    for (size_t i = 0; i < ndim; i++) {
        uint64_t v;
        if (!wk_st_json_u64(json_array_get(js, i), &v))
            return wk_diag_set(d, WK_EINVAL,
                               "tensor '%s': shape[%zu] is not a non-negative integer", name, i);
        r->t.shape[i] = (int64_t)v;
    }
    size_t nbytes;
    if (wk_tensor_size(r->t.dtype, r->t.ndim, r->t.shape, NULL, &nbytes) != WK_OK)
        return wk_diag_set(d, WK_EINVAL, "tensor '%s': shape overflows the element count", name);
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !wk_st_json_u64(json_array_get(jo, 0), &r->begin) ||
        !wk_st_json_u64(json_array_get(jo, 1), &r->end))
        return wk_diag_set(d, WK_EINVAL,
                           "tensor '%s': \"data_offsets\" is not [begin, end] of non-negative "
                           "integers", name);
    if (r->begin > r->end)
        return wk_diag_set(d, WK_EINVAL, "tensor '%s': data_offsets begin %llu > end %llu", name,
                           (unsigned long long)r->begin, (unsigned long long)r->end);
    if (r->end > data_len)
        return wk_diag_set(d, WK_EINVAL,
                           "tensor '%s': data_offsets end %llu past the data section (%llu bytes)",
                           name, (unsigned long long)r->end, (unsigned long long)data_len);
    if (r->end - r->begin != nbytes)
        return wk_diag_set(d, WK_EINVAL,
                           "tensor '%s': data_offsets span %llu bytes but shape and dtype need %zu",
                           name, (unsigned long long)(r->end - r->begin), nbytes);
    r->t.nbytes = nbytes;
    return WK_OK;
}

static int
wk_st_rec_cmp_offset(const void *a, const void *b)
{
    const wk_st_rec *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* Validates __metadata__: an object of strings. */
static wk_err
wk_st_metadata(const json_t *m, wk_diag *d)
{
    if (!json_is_object(m))
        return wk_diag_set(d, WK_EINVAL, "header field '__metadata__' is not a JSON object");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)m, k, v) {
        if (!json_is_string(v))
            return wk_diag_set(d, WK_EINVAL, "header field '__metadata__': value of '%s' is not "
                               "a string", k);
    }
    return WK_OK;
}

wk_err
wk_st_parse(const void *buf, size_t len, wk_tensor_list *out, wk_diag *d)
{
    const uint8_t *p = buf;
    if (len < 8)
        return wk_diag_set(d, WK_EINVAL, "truncated: %zu bytes, the header length alone needs 8",
                           len);
    uint64_t hlen = wk_le64_get(p);
    if (hlen > WK_ST_MAX_HEADER)
        return wk_diag_set(d, WK_ETOOBIG, "header length %llu over the limit of %zu bytes",
                           (unsigned long long)hlen, WK_ST_MAX_HEADER);
    if (hlen > len - 8)
        return wk_diag_set(d, WK_EINVAL, "header length %llu past the end of the file (%zu bytes)",
                           (unsigned long long)hlen, len);
    json_t *root = NULL;
    wk_err err = wk_st_load_json(p + 8, (size_t)hlen, "header", &root, d);
    if (err != WK_OK)
        return err;
    const uint8_t *data = p + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;
    size_t cap = json_object_size(root);
    wk_st_rec *recs = NULL;
    wk_tensor_list tmp;
    wk_tensor_list_init(&tmp);
    if (cap > WK_ST_MAX_TENSORS + 1) {
        err = wk_diag_set(d, WK_ETOOBIG, "header lists %zu tensors, over the limit of %zu", cap,
                          WK_ST_MAX_TENSORS);
        goto done;
    }
    recs = calloc(cap ? cap : 1, sizeof(*recs));
    if (recs == NULL) {
        err = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto done;
    }
    size_t n = 0;
    void *it;
    for (it = json_object_iter(root); it != NULL; it = json_object_iter_next(root, it)) {
        const char *name = json_object_iter_key(it);
        size_t name_len = json_object_iter_key_len(it);
        json_t *e = json_object_iter_value(it);
        if (strcmp(name, "__metadata__") == 0) {
            err = wk_st_metadata(e, d);
            if (err != WK_OK)
                goto done;
            continue;
        }
        if (n >= WK_ST_MAX_TENSORS) {
            err = wk_diag_set(d, WK_ETOOBIG, "header lists more than %zu tensors (at '%s')",
                              WK_ST_MAX_TENSORS, name);
            goto done;
        }
        wk_st_rec *r = &recs[n];
        r->name = name;
        r->name_len = name_len;
        err = wk_st_entry(name, e, data_len, r, d);
        if (err != WK_OK)
            goto done;
        n++;
    }
    if (n > 1)
        qsort(recs, n, sizeof(*recs), wk_st_rec_cmp_offset);
    /* sorted by begin: a non-empty tensor overlaps when it starts before the furthest end */
    size_t far = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        if (recs[i].begin == recs[i].end)
            continue;
        if (far != SIZE_MAX && recs[i].begin < recs[far].end) {
            err = wk_diag_set(d, WK_EINVAL, "tensor '%s': data_offsets [%llu, %llu] overlap "
                              "tensor '%s' [%llu, %llu]", recs[i].name,
                              (unsigned long long)recs[i].begin, (unsigned long long)recs[i].end,
                              recs[far].name, (unsigned long long)recs[far].begin,
                              (unsigned long long)recs[far].end);
            goto done;
        }
        far = i;
    }
    for (size_t i = 0; i < n; i++) {
        recs[i].t.data = data + recs[i].begin;
        if (wk_tensor_list_push(&tmp, &recs[i].t, recs[i].name, recs[i].name_len) != WK_OK) {
            err = wk_diag_set(d, WK_ENOMEM, "out of memory");
            goto done;
        }
    }
    if (wk_tensor_list_take(out, &tmp) != WK_OK)
        err = wk_diag_set(d, WK_ENOMEM, "out of memory");
done:
    wk_tensor_list_fini(&tmp);
    free(recs);
    json_decref(root);
    return err;
}

/* ---- sharded checkpoints ---- */

/* One weight_map entry. */
typedef struct wk_st_wm {
    const char *name;  /* tensor name, borrowed from the index json_t */
    const char *shard; /* shard base name, borrowed from the index json_t */
    int found;         /* 1 once a shard header listed it */
    const char *found_in; /* shard that listed it */
} wk_st_wm;

static int
wk_st_wm_cmp(const void *a, const void *b)
{
    return strcmp(((const wk_st_wm *)a)->name, ((const wk_st_wm *)b)->name);
}

static int
wk_st_str_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard name is a plain base name: not empty, no '/', not "." or "..". */
static int
wk_st_shard_name_ok(const char *v)
{
    return v[0] != '\0' && strchr(v, '/') == NULL && strcmp(v, ".") != 0 && strcmp(v, "..") != 0;
}

/* Parsed index: weight_map sorted by name and the distinct shard names, sorted. */
typedef struct wk_st_index {
    json_t *root;        /* the index document */
    wk_st_wm *wm;        /* weight_map entries sorted by name */
    size_t n_wm;         /* entries in wm */
    const char **shards; /* distinct shard names, sorted */
    size_t n_shards;     /* entries in shards */
} wk_st_index;

static void
wk_st_index_fini(wk_st_index *ix)
{
    free(ix->wm);
    free(ix->shards);
    json_decref(ix->root);
    memset(ix, 0, sizeof(*ix));
}

static wk_err
wk_st_index_load(const void *buf, size_t len, wk_st_index *ix, wk_diag *d)
{
    memset(ix, 0, sizeof(*ix));
    wk_err err = wk_st_load_json(buf, len, "index", &ix->root, d);
    if (err != WK_OK)
        return err;
    json_t *wm = json_object_get(ix->root, "weight_map");
    if (!json_is_object(wm)) {
        err = wk_diag_set(d, WK_EINVAL, "index field 'weight_map' missing or not an object");
        goto fail;
    }
    size_t n = json_object_size(wm);
    if (n > WK_ST_MAX_TENSORS) {
        err = wk_diag_set(d, WK_ETOOBIG, "weight_map lists %zu tensors, over the limit of %zu", n,
                          WK_ST_MAX_TENSORS);
        goto fail;
    }
    ix->wm = calloc(n ? n : 1, sizeof(*ix->wm));
    ix->shards = calloc(n ? n : 1, sizeof(*ix->shards));
    if (ix->wm == NULL || ix->shards == NULL) {
        err = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto fail;
    }
    void *it;
    for (it = json_object_iter(wm); it != NULL; it = json_object_iter_next(wm, it)) {
        const char *name = json_object_iter_key(it);
        json_t *v = json_object_iter_value(it);
        if (!json_is_string(v)) {
            err = wk_diag_set(d, WK_EINVAL, "weight_map: tensor '%s': shard is not a string",
                              name);
            goto fail;
        }
        if (!wk_st_shard_name_ok(json_string_value(v))) {
            err = wk_diag_set(d, WK_EINVAL, "weight_map: tensor '%s': shard '%s' is not a plain "
                              "file name in the index directory", name, json_string_value(v));
            goto fail;
        }
        ix->wm[ix->n_wm].name = name;
        ix->wm[ix->n_wm].shard = json_string_value(v);
        ix->shards[ix->n_wm] = json_string_value(v);
        ix->n_wm++;
    }
    qsort(ix->wm, ix->n_wm, sizeof(*ix->wm), wk_st_wm_cmp);
    qsort(ix->shards, ix->n_wm, sizeof(*ix->shards), wk_st_str_cmp);
    for (size_t i = 0; i < ix->n_wm; i++) {
        if (ix->n_shards == 0 || strcmp(ix->shards[ix->n_shards - 1], ix->shards[i]) != 0)
            ix->shards[ix->n_shards++] = ix->shards[i];
    }
    if (ix->n_shards > WK_ST_MAX_SHARDS) {
        err = wk_diag_set(d, WK_ETOOBIG, "index names %zu shards, over the limit of %zu",
                          ix->n_shards, WK_ST_MAX_SHARDS);
        goto fail;
    }
    return WK_OK;
fail:
    wk_st_index_fini(ix);
    return err;
}

wk_err
wk_st_index_check(const void *buf, size_t len, size_t *n_tensors, size_t *n_shards, wk_diag *d)
{
    wk_st_index ix;
    wk_err err = wk_st_index_load(buf, len, &ix, d);
    if (err != WK_OK)
        return err;
    if (n_tensors)
        *n_tensors = ix.n_wm;
    if (n_shards)
        *n_shards = ix.n_shards;
    wk_st_index_fini(&ix);
    return WK_OK;
}

/* Checks the tensors of one shard against the weight_map. */
static wk_err
wk_st_index_match(wk_st_index *ix, const char *shard, const wk_tensor_list *l, wk_diag *d)
{
    for (size_t i = 0; i < l->n; i++) {
        wk_st_wm key = {.name = l->v[i].name};
        wk_st_wm *w = bsearch(&key, ix->wm, ix->n_wm, sizeof(*ix->wm), wk_st_wm_cmp);
        if (w == NULL)
            return wk_diag_set(d, WK_EINVAL, "tensor '%s' of shard '%s' is not in weight_map",
                               key.name, shard);
        if (w->found)
            return wk_diag_set(d, WK_EINVAL, "tensor '%s' appears in two shards, '%s' and '%s'",
                               key.name, w->found_in, shard);
        w->found = 1;
        w->found_in = shard;
        if (strcmp(w->shard, shard) != 0)
            return wk_diag_set(d, WK_EINVAL, "tensor '%s' is in shard '%s' but weight_map names "
                               "'%s'", key.name, shard, w->shard);
    }
    return WK_OK;
}

wk_err
wk_st_index_open(const char *index_path, wk_map **maps, size_t *n_maps, wk_tensor_list *out,
                 wk_diag *d)
{
    wk_map imap = {NULL, 0};
    wk_st_index ix;
    memset(&ix, 0, sizeof(ix));
    wk_map *m = NULL;
    size_t nm = 0;
    char *path = NULL;
    wk_tensor_list all, one;
    wk_tensor_list_init(&all);
    wk_tensor_list_init(&one);
    wk_err err = wk_map_open(index_path, WK_ST_MAX_INDEX, &imap, d); /* names the path */
    if (err != WK_OK)
        return err;
    err = wk_st_index_load(imap.data, imap.len, &ix, d);
    if (err != WK_OK)
        goto done;
    const char *slash = strrchr(index_path, '/');
    size_t dir_len = slash ? (size_t)(slash - index_path) + 1 : 0;
    m = calloc(ix.n_shards ? ix.n_shards : 1, sizeof(*m));
    if (m == NULL) {
        err = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < ix.n_shards; i++) {
        const char *shard = ix.shards[i];
        size_t sl = strlen(shard);
        free(path);
        path = malloc(dir_len + sl + 1);
        if (path == NULL) {
            err = wk_diag_set(d, WK_ENOMEM, "out of memory");
            goto done;
        }
        memcpy(path, index_path, dir_len);
        memcpy(path + dir_len, shard, sl + 1);
        err = wk_map_open(path, 0, &m[nm], d);
        if (err != WK_OK)
            goto done;
        nm++;
        err = wk_st_parse(m[nm - 1].data, m[nm - 1].len, &one, d);
        if (err == WK_OK)
            err = wk_st_index_match(&ix, shard, &one, d);
        if (err != WK_OK) {
            wk_diag_prefix(d, "shard '%s'", shard);
            goto done;
        }
        if (wk_tensor_list_take(&all, &one) != WK_OK) {
            err = wk_diag_set(d, WK_ENOMEM, "out of memory");
            goto done;
        }
    }
    for (size_t i = 0; i < ix.n_wm; i++) {
        if (!ix.wm[i].found) {
            err = wk_diag_set(d, WK_EINVAL, "tensor '%s' listed in weight_map is missing from "
                              "shard '%s'", ix.wm[i].name, ix.wm[i].shard);
            goto done;
        }
    }
    if (wk_tensor_list_take(out, &all) != WK_OK) {
        err = wk_diag_set(d, WK_ENOMEM, "out of memory");
        goto done;
    }
    *maps = m;
    *n_maps = nm;
    m = NULL;
    nm = 0;
done:
    if (err != WK_OK)
        wk_diag_prefix(d, "%s", index_path);
    free(path);
    wk_tensor_list_fini(&one);
    wk_tensor_list_fini(&all);
    for (size_t i = 0; i < nm; i++)
        wk_map_close(&m[i]);
    free(m);
    wk_st_index_fini(&ix);
    wk_map_close(&imap);
    return err;
}
