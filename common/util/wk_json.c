/*
 * wk_json: typed, bounded access to jansson values, canonical dumps and the
 * OpenAI error body. The only place in common/ that knows jansson's API
 * beyond json_t.
 */
#include "wk_json.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static wk_err
wk_json_load(const char *buf, size_t len, size_t flags, json_t **out, wk_diag *d)
{
    json_error_t jerr;
    json_t *v = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | flags, &jerr);
    if (v == NULL)
        return wk_diag_set(d, WK_EINVAL, "invalid JSON at line %d column %d: %s", jerr.line,
                           jerr.column, jerr.text);
    *out = v;
    return WK_OK;
}

wk_err
wk_json_parse(const char *buf, size_t len, json_t **out, wk_diag *d)
{
    return wk_json_load(buf, len, 0, out, d);
}

wk_err
wk_json_parse_text(const char *buf, size_t len, json_t **out, wk_diag *d)
{
    return wk_json_load(buf, len, JSON_ALLOW_NUL, out, d);
}

wk_err
wk_json_get_str(const json_t *obj, const char *key, bool required, const char *def,
                size_t max_len, const char **out, wk_diag *d)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        if (required)
            return wk_diag_set(d, WK_ENOENT, "'%s' is required", key);
        *out = def;
        return WK_OK;
    }
    if (!json_is_string(v))
        return wk_diag_set(d, WK_EINVAL, "'%s' must be a string", key);
    if (json_string_length(v) > max_len)
        return wk_diag_set(d, WK_ETOOBIG, "'%s' is longer than %zu bytes", key, max_len);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return wk_diag_set(d, WK_EINVAL, "'%s' contains a NUL character", key);
    *out = json_string_value(v);
    return WK_OK;
}

wk_err
wk_json_get_i64(const json_t *obj, const char *key, bool required, int64_t def, int64_t min,
                int64_t max, int64_t *out, wk_diag *d)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        if (required)
            return wk_diag_set(d, WK_ENOENT, "'%s' is required", key);
        *out = def;
        return WK_OK;
    }
    if (!json_is_integer(v))
        return wk_diag_set(d, WK_EINVAL, "'%s' must be an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < min || x > max)
        return wk_diag_set(d, WK_EINVAL, "'%s' must be between %lld and %lld", key,
                           (long long)min, (long long)max);
    *out = x;
    return WK_OK;
}

wk_err
wk_json_get_num(const json_t *obj, const char *key, bool required, double def, double min,
                double max, double *out, wk_diag *d)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        if (required)
            return wk_diag_set(d, WK_ENOENT, "'%s' is required", key);
        *out = def;
        return WK_OK;
    }
    if (!json_is_number(v))
        return wk_diag_set(d, WK_EINVAL, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < min || x > max)
        return wk_diag_set(d, WK_EINVAL, "'%s' must be between %g and %g", key, min, max);
    *out = x;
    return WK_OK;
}

wk_err
wk_json_get_bool(const json_t *obj, const char *key, bool def, bool *out, wk_diag *d)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        *out = def;
        return WK_OK;
    }
    if (!json_is_boolean(v))
        return wk_diag_set(d, WK_EINVAL, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return WK_OK;
}

char *
wk_json_dump_compact(const json_t *v)
{
    return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
}

typedef struct wk_json_buf {
    char *p;    /* heap buffer, owned */
    size_t len; /* bytes used */
    size_t cap; /* bytes allocated */
    bool oom;   /* an allocation failed */
} wk_json_buf;

static void
wk_json_buf_put(wk_json_buf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (np == NULL) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void
wk_json_buf_str(wk_json_buf *b, const char *s, size_t n)
{
    static const char hx[] = "0123456789abcdef";
    wk_json_buf_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];
        switch (c) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        default:
            if (c < 0x20) {
                u[0] = '\\';
                u[1] = 'u';
                u[2] = '0';
                u[3] = '0';
                u[4] = hx[c >> 4];
                u[5] = hx[c & 15];
                u[6] = '\0';
                esc = u;
            }
        }
        if (esc == NULL) {
            run++;
            continue;
        }
        wk_json_buf_put(b, s + i - run, run);
        run = 0;
        wk_json_buf_put(b, esc, strlen(esc));
    }
    wk_json_buf_put(b, s + n - run, run);
    wk_json_buf_put(b, "\"", 1);
}

static int
wk_json_key_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Python's repr() of a float: the shortest text that reads back exactly. */
static void
wk_json_buf_real(wk_json_buf *b, double x)
{
    char t[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(t, sizeof(t), "%.*g", prec, x);
        if (strtod(t, NULL) == x)
            break;
    }
    /* Python writes 1.0 where %g writes 1, and 1e+16 where %g writes 1e+16. */
    if (strpbrk(t, ".eEn") == NULL)
        strcat(t, ".0");
    wk_json_buf_put(b, t, strlen(t));
}

static void
wk_json_buf_value(wk_json_buf *b, const json_t *v)
{
    char t[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        size_t n = json_object_size(v);
        const char **keys = calloc(n ? n : 1, sizeof(*keys));
        if (keys == NULL) {
            b->oom = true;
            return;
        }
        size_t i = 0;
        const char *k;
        json_t *item;
        json_object_foreach((json_t *)v, k, item) keys[i++] = k;
        qsort(keys, n, sizeof(*keys), wk_json_key_cmp);
        wk_json_buf_put(b, "{", 1);
        for (i = 0; i < n; i++) {
            if (i)
                wk_json_buf_put(b, ",", 1);
            wk_json_buf_str(b, keys[i], strlen(keys[i]));
            wk_json_buf_put(b, ":", 1);
            wk_json_buf_value(b, json_object_get(v, keys[i]));
        }
        wk_json_buf_put(b, "}", 1);
        free(keys);
        break;
    }
    case JSON_ARRAY:
        wk_json_buf_put(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i)
                wk_json_buf_put(b, ",", 1);
            wk_json_buf_value(b, json_array_get(v, i));
        }
        wk_json_buf_put(b, "]", 1);
        break;
    case JSON_STRING:
        wk_json_buf_str(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        snprintf(t, sizeof(t), "%lld", (long long)json_integer_value(v));
        wk_json_buf_put(b, t, strlen(t));
        break;
    case JSON_REAL:
        wk_json_buf_real(b, json_real_value(v));
        break;
    case JSON_TRUE:
        wk_json_buf_put(b, "true", 4);
        break;
    case JSON_FALSE:
        wk_json_buf_put(b, "false", 5);
        break;
    case JSON_NULL:
        wk_json_buf_put(b, "null", 4);
        break;
    }
}

char *
wk_json_dump_canonical(const json_t *v)
{
    wk_json_buf b = {0};
    wk_json_buf_value(&b, v);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

char *
wk_json_utf8_scrub(const char *s)
{
    size_t n = strlen(s);
    char *o = malloc(n + 1);
    if (o == NULL)
        return NULL;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1
                     : c >= 0xc2 && c <= 0xdf ? 2
                     : c >= 0xe0 && c <= 0xef ? 3
                     : c >= 0xf0 && c <= 0xf4 ? 4
                                              : 0;
        bool ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++)
            ok = ((unsigned char)s[i + k] & 0xc0) == 0x80;
        if (ok && len >= 3) {
            unsigned char c1 = (unsigned char)s[i + 1];
            ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 > 0x9f) && /* overlong, UTF-16 */
                 !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 > 0x8f);   /* overlong, > U+10FFFF */
        }
        if (!ok) {
            o[i++] = '?';
            continue;
        }
        memcpy(o + i, s + i, len);
        i += len;
    }
    o[n] = '\0';
    return o;
}
