/*
 * wk_jinja_value: the Python values a template computes with, and the ways
 * Python turns them into text: str(), repr() (lists and dicts print their
 * items' repr), float's shortest round-trip repr, and json.dumps as
 * transformers' tojson calls it. Byte equality with jinja2 depends on these
 * details, so each follows CPython's rule, not a look-alike. Values live in
 * the render arena; nothing here frees.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_jinja_priv.h"

/* ---- UTF-8 ---- */

size_t
jj_utf8_next(const char *s, size_t n, size_t i)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t len = 1;
    if (i >= n)
        return n;
    if (u[i] >= 0xf0)
        len = 4;
    else if (u[i] >= 0xe0)
        len = 3;
    else if (u[i] >= 0xc0)
        len = 2;
    for (size_t k = 1; k < len; k++)
        if (i + k >= n || (u[i + k] & 0xc0) != 0x80)
            return i + 1;
    return i + len;
}

size_t
jj_utf8_len(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i = jj_utf8_next(s, n, i))
        c++;
    return c;
}

uint32_t
jj_utf8_cp(const char *s, size_t n, size_t i, size_t *next)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t e = jj_utf8_next(s, n, i);
    *next = e;
    if (e - i == 1)
        return u[i];
    if (e - i == 2)
        return ((uint32_t)(u[i] & 0x1f) << 6) | (u[i + 1] & 0x3f);
    if (e - i == 3)
        return ((uint32_t)(u[i] & 0x0f) << 12) | ((uint32_t)(u[i + 1] & 0x3f) << 6) |
               (u[i + 2] & 0x3f);
    return ((uint32_t)(u[i] & 0x07) << 18) | ((uint32_t)(u[i + 1] & 0x3f) << 12) |
           ((uint32_t)(u[i + 2] & 0x3f) << 6) | (u[i + 3] & 0x3f);
}

size_t
jj_space_len(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0)
        return 0;
    if ((u[0] >= 0x09 && u[0] <= 0x0d) || (u[0] >= 0x1c && u[0] <= 0x20))
        return 1;
    if (n >= 2 && u[0] == 0xc2 && (u[1] == 0x85 || u[1] == 0xa0))
        return 2;
    if (n < 3)
        return 0;
    if (u[0] == 0xe1 && u[1] == 0x9a && u[2] == 0x80)
        return 3;
    if (u[0] == 0xe2 && u[1] == 0x80 &&
        ((u[2] >= 0x80 && u[2] <= 0x8a) || u[2] == 0xa8 || u[2] == 0xa9 || u[2] == 0xaf))
        return 3;
    if (u[0] == 0xe2 && u[1] == 0x81 && u[2] == 0x9f)
        return 3;
    if (u[0] == 0xe3 && u[1] == 0x80 && u[2] == 0x80)
        return 3;
    return 0;
}

size_t
jj_space_len_back(const char *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++)
        if (jj_space_len(s + n - k, k) == k)
            return k;
    return 0;
}

/* ---- constructors ---- */

jv
jj_str(const char *p, size_t n)
{
    jv v = {.t = JV_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}

jv
jj_int(int64_t i)
{
    jv v = {.t = JV_INT};
    v.u.i = i;
    return v;
}

jv
jj_bool(bool b)
{
    jv v = {.t = JV_BOOL};
    v.u.b = b;
    return v;
}

jv
jj_none(void)
{
    jv v = {.t = JV_NONE};
    return v;
}

jv
jj_undef(const char *name)
{
    jv v = {.t = JV_UNDEF};
    v.u.s.p = name;
    v.u.s.n = name != NULL ? strlen(name) : 0;
    return v;
}

jlist *
jj_list_new(jj_rt *R, size_t cap)
{
    jlist *l = jj_alloc(&R->ar, sizeof *l);
    if (l == NULL) {
        jj_oom(R);
        return NULL;
    }
    if (cap > 0) {
        l->v = jj_alloc(&R->ar, cap * sizeof *l->v);
        if (l->v == NULL) {
            jj_oom(R);
            return NULL;
        }
        l->cap = cap;
    }
    return l;
}

int
jj_list_push(jj_rt *R, jlist *l, jv v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *nv = jj_alloc(&R->ar, cap * sizeof *nv);
        if (nv == NULL)
            return jj_oom(R);
        if (l->n > 0)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return 0;
}

jdict *
jj_dict_new(jj_rt *R, size_t cap)
{
    jdict *d = jj_alloc(&R->ar, sizeof *d);
    if (d == NULL) {
        jj_oom(R);
        return NULL;
    }
    if (cap > 0) {
        d->k = jj_alloc(&R->ar, cap * sizeof *d->k);
        d->v = jj_alloc(&R->ar, cap * sizeof *d->v);
        if (d->k == NULL || d->v == NULL) {
            jj_oom(R);
            return NULL;
        }
        d->cap = cap;
    }
    return d;
}

static ptrdiff_t
dict_find(const jdict *d, jv k)
{
    for (size_t i = 0; i < d->n; i++)
        if (jj_eq(d->k[i], k))
            return (ptrdiff_t)i;
    return -1;
}

int
jj_dict_set(jj_rt *R, jdict *d, jv k, jv v)
{
    ptrdiff_t i = dict_find(d, k);
    if (i >= 0) {
        d->v[i] = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jv *nk = jj_alloc(&R->ar, cap * sizeof *nk);
        jv *nv = jj_alloc(&R->ar, cap * sizeof *nv);
        if (nk == NULL || nv == NULL)
            return jj_oom(R);
        if (d->n > 0) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return 0;
}

bool
jj_dict_get(const jdict *d, const char *k, size_t kn, jv *out)
{
    for (size_t i = 0; i < d->n; i++) {
        if (d->k[i].t == JV_STR && d->k[i].u.s.n == kn && memcmp(d->k[i].u.s.p, k, kn) == 0) {
            *out = d->v[i];
            return true;
        }
    }
    return false;
}

bool
jj_dict_getv(const jdict *d, jv k, jv *out)
{
    ptrdiff_t i = dict_find(d, k);
    if (i < 0)
        return false;
    *out = d->v[i];
    return true;
}

/* ---- truth, equality ---- */

bool
jj_truthy(jv v)
{
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE:
        return false;
    case JV_BOOL:
        return v.u.b;
    case JV_INT:
        return v.u.i != 0;
    case JV_FLOAT:
        return v.u.f != 0.0;
    case JV_STR:
        return v.u.s.n > 0;
    case JV_LIST:
        return v.u.l->kind == JL_GEN || v.u.l->kind == JL_REVITER || v.u.l->n > 0;
    case JV_DICT:
        return v.u.d->n > 0;
    default:
        return true;
    }
}

static bool
is_num(jv v)
{
    return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT;
}

static double
num_f(jv v)
{
    return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b;
}

bool
jj_eq(jv a, jv b)
{
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = a.t == JV_INT ? a.u.i : a.u.b, y = b.t == JV_INT ? b.u.i : b.u.b;
            return x == y;
        }
        return num_f(a) == num_f(b);
    }
    if (a.t != b.t)
        return false;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE:
        return true;
    case JV_STR:
        return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case JV_LIST:
        if (a.u.l == b.u.l)
            return true;
        if (a.u.l->kind != JL_PLAIN || b.u.l->kind != JL_PLAIN)
            return false;
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jj_eq(a.u.l->v[i], b.u.l->v[i]))
                return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n)
            return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv o;
            if (!jj_dict_getv(b.u.d, a.u.d->k[i], &o) || !jj_eq(a.u.d->v[i], o))
                return false;
        }
        return true;
    case JV_NS:
        return a.u.d == b.u.d;
    case JV_MACRO:
        return a.u.m == b.u.m;
    case JV_FUNC:
        return a.u.i == b.u.i;
    case JV_LOOP:
        return a.u.lp == b.u.lp;
    case JV_BOUND:
        return a.u.bm == b.u.bm;
    default:
        return false;
    }
}

bool
jj_is_str(jv v, const char *s)
{
    size_t n = strlen(s);
    return v.t == JV_STR && v.u.s.n == n && memcmp(v.u.s.p, s, n) == 0;
}

const char *
jj_type_name(jv v)
{
    switch (v.t) {
    case JV_UNDEF:
        return "Undefined";
    case JV_NONE:
        return "NoneType";
    case JV_BOOL:
        return "bool";
    case JV_INT:
        return "int";
    case JV_FLOAT:
        return "float";
    case JV_STR:
        return "str";
    case JV_LIST:
        switch (v.u.l->kind) {
        case JL_GEN:
            return "generator";
        case JL_REVITER:
            return "list_reverseiterator";
        case JL_ITEMS:
            return "dict_items";
        case JL_KEYS:
            return "dict_keys";
        case JL_VALUES:
            return "dict_values";
        default:
            return v.u.l->tuple ? "tuple" : "list";
        }
    case JV_DICT:
        return "dict";
    case JV_NS:
        return "Namespace";
    case JV_MACRO:
        return "Macro";
    case JV_LOOP:
        return "LoopContext";
    default:
        return "function";
    }
}

/* ---- text ---- */

void
jj_format_float(double f, char *buf, size_t cap)
{
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    if (f == 0.0) {
        snprintf(buf, cap, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    /* shortest digits that read back to f */
    char e[40];
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec, f);
        if (strtod(e, NULL) == f)
            break;
    }
    /* e is [-]d[.ddd]e[+-]XX */
    char digits[32];
    size_t nd = 0;
    const char *p = e;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    while (*p != 'e') {
        if (*p != '.')
            digits[nd++] = *p;
        p++;
    }
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    char *o = buf;
    size_t left = cap;
#define PUT(c)                                                                                     \
    do {                                                                                           \
        if (left > 1) {                                                                            \
            *o++ = (c);                                                                            \
            left--;                                                                                \
        }                                                                                          \
    } while (0)
    if (neg)
        PUT('-');
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            PUT('0');
            PUT('.');
            for (int z = 0; z < -exp - 1; z++)
                PUT('0');
            for (size_t i = 0; i < nd; i++)
                PUT(digits[i]);
        } else {
            for (int i = 0; i <= exp; i++)
                PUT((size_t)i < nd ? digits[i] : '0');
            PUT('.');
            if ((size_t)exp + 1 < nd) {
                for (size_t i = (size_t)exp + 1; i < nd; i++)
                    PUT(digits[i]);
            } else {
                PUT('0');
            }
        }
    } else {
        PUT(digits[0]);
        if (nd > 1) {
            PUT('.');
            for (size_t i = 1; i < nd; i++)
                PUT(digits[i]);
        }
        char ex[16];
        snprintf(ex, sizeof ex, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        for (char *x = ex; *x; x++)
            PUT(*x);
    }
#undef PUT
    *o = '\0';
}

/* Python's str.isprintable() for a code point, as far as chat text needs it. */
static bool
cp_printable(uint32_t c)
{
    if (c < 0x20 || c == 0x7f)
        return false;
    if (c < 0x7f)
        return true;
    if (c <= 0xa0 || c == 0xad)
        return false;
    if ((c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) ||
        (c >= 0x205f && c <= 0x206f) || c == 0x3000 || c == 0xfeff || c == 0x1680 ||
        (c >= 0xd800 && c <= 0xf8ff) || (c >= 0xfff9 && c <= 0xfffb) || c >= 0xf0000 ||
        (c >= 0xe0000 && c <= 0xe0fff))
        return false;
    return true;
}

static int
repr_str(jj_rt *R, const char *s, size_t n, jj_sb *b)
{
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    if (jj_sb_put(R, b, &q, 1) < 0)
        return -1;
    size_t i = 0;
    while (i < n) {
        size_t nx;
        uint32_t c = jj_utf8_cp(s, n, i, &nx);
        char esc[16];
        const char *put = s + i;
        size_t pn = nx - i;
        if (c == '\\' || c == (uint32_t)q) {
            esc[0] = '\\';
            esc[1] = (char)c;
            put = esc;
            pn = 2;
        } else if (c == '\n' || c == '\r' || c == '\t') {
            esc[0] = '\\';
            esc[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
            put = esc;
            pn = 2;
        } else if (!cp_printable(c)) {
            if (c < 0x100)
                pn = (size_t)snprintf(esc, sizeof esc, "\\x%02x", c);
            else if (c < 0x10000)
                pn = (size_t)snprintf(esc, sizeof esc, "\\u%04x", c);
            else
                pn = (size_t)snprintf(esc, sizeof esc, "\\U%08x", c);
            put = esc;
        }
        if (jj_sb_put(R, b, put, pn) < 0)
            return -1;
        i = nx;
    }
    return jj_sb_put(R, b, &q, 1);
}

static int
to_text(jj_rt *R, jv v, jj_sb *b, bool repr)
{
    char buf[64];
    switch (v.t) {
    case JV_UNDEF:
        return repr ? jj_sb_puts(R, b, "Undefined") : 0;
    case JV_NONE:
        return jj_sb_puts(R, b, "None");
    case JV_BOOL:
        return jj_sb_puts(R, b, v.u.b ? "True" : "False");
    case JV_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v.u.i);
        return jj_sb_puts(R, b, buf);
    case JV_FLOAT:
        jj_format_float(v.u.f, buf, sizeof buf);
        return jj_sb_puts(R, b, buf);
    case JV_STR:
        if (repr && v.mk) /* Markup('...') */
            return jj_sb_puts(R, b, "Markup(") < 0 || repr_str(R, v.u.s.p, v.u.s.n, b) < 0
                       ? -1
                       : jj_sb_puts(R, b, ")");
        return repr ? repr_str(R, v.u.s.p, v.u.s.n, b) : jj_sb_put(R, b, v.u.s.p, v.u.s.n);
    case JV_LIST: {
        jlist *l = v.u.l;
        if (l->kind == JL_GEN || l->kind == JL_REVITER)
            return jj_fail(R, WK_ENOTSUP, "printing a %s (Python prints its address)",
                           jj_type_name(v));
        if (l->kind != JL_PLAIN) {
            jv plain = v;
            jlist copy = *l;
            copy.kind = JL_PLAIN;
            plain.u.l = &copy;
            if (jj_sb_puts(R, b, jj_type_name(v)) < 0 || jj_sb_puts(R, b, "(") < 0 ||
                to_text(R, plain, b, true) < 0)
                return -1;
            return jj_sb_puts(R, b, ")");
        }
        if (jj_step(R, l->n) < 0 || jj_sb_puts(R, b, l->tuple ? "(" : "[") < 0)
            return -1;
        for (size_t i = 0; i < l->n; i++) {
            if ((i > 0 && jj_sb_puts(R, b, ", ") < 0) || to_text(R, l->v[i], b, true) < 0)
                return -1;
        }
        if (l->tuple && l->n == 1 && jj_sb_puts(R, b, ",") < 0)
            return -1;
        return jj_sb_puts(R, b, l->tuple ? ")" : "]");
    }
    case JV_DICT:
    case JV_NS: {
        jdict *d = v.u.d;
        if (jj_step(R, d->n) < 0 || jj_sb_puts(R, b, v.t == JV_NS ? "<Namespace {" : "{") < 0)
            return -1;
        for (size_t i = 0; i < d->n; i++) {
            if ((i > 0 && jj_sb_puts(R, b, ", ") < 0) || to_text(R, d->k[i], b, true) < 0 ||
                jj_sb_puts(R, b, ": ") < 0 || to_text(R, d->v[i], b, true) < 0)
                return -1;
        }
        return jj_sb_puts(R, b, v.t == JV_NS ? "}>" : "}");
    }
    default:
        return jj_fail(R, WK_ENOTSUP, "printing a %s is not supported", jj_type_name(v));
    }
}

int
jj_to_str(jj_rt *R, jv v, jj_sb *b)
{
    return to_text(R, v, b, false);
}

int
jj_to_repr(jj_rt *R, jv v, jj_sb *b)
{
    return to_text(R, v, b, true);
}

int
jj_strv(jj_rt *R, jv v, jv *out)
{
    if (v.t == JV_STR) {
        *out = v;
        return 0;
    }
    jj_sb b = {0};
    if (jj_to_str(R, v, &b) < 0)
        return -1;
    *out = jj_sb_value(&b);
    return 0;
}

/* ---- JSON in ---- */

int
jj_from_json(jj_rt *R, const json_t *j, jv *out, int depth)
{
    if (depth > 512)
        return jj_fail(R, WK_ETOOBIG, "context nested deeper than 512");
    switch (json_typeof(j)) {
    case JSON_NULL:
        *out = jj_none();
        return 0;
    case JSON_TRUE:
        *out = jj_bool(true);
        return 0;
    case JSON_FALSE:
        *out = jj_bool(false);
        return 0;
    case JSON_INTEGER:
        *out = jj_int((int64_t)json_integer_value(j));
        return 0;
    case JSON_REAL:
        out->t = JV_FLOAT;
        out->u.f = json_real_value(j);
        return 0;
    case JSON_STRING:
        *out = jj_str(json_string_value(j), json_string_length(j));
        return 0;
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jlist *l = jj_list_new(R, n);
        if (l == NULL)
            return -1;
        for (size_t i = 0; i < n; i++) {
            if (jj_from_json(R, json_array_get(j, i), &l->v[i], depth + 1) < 0)
                return -1;
        }
        l->n = n;
        out->t = JV_LIST;
        out->u.l = l;
        return jj_step(R, n);
    }
    case JSON_OBJECT: {
        size_t n = json_object_size(j);
        jdict *d = jj_dict_new(R, n);
        const char *key;
        json_t *val;
        if (d == NULL)
            return -1;
        /* keys are unique in a JSON object: appended without a search */
        json_object_foreach((json_t *)j, key, val)
        {
            if (d->n == d->cap)
                return jj_fail(R, WK_EINVAL, "context object changed while read");
            d->k[d->n] = jj_str(key, strlen(key));
            if (jj_from_json(R, val, &d->v[d->n], depth + 1) < 0)
                return -1;
            d->n++;
        }
        out->t = JV_DICT;
        out->u.d = d;
        return jj_step(R, n);
    }
    }
    return jj_fail(R, WK_EINVAL, "context holds a value of unknown JSON type");
}

/* ---- JSON out ---- */

static int
json_str(jj_rt *R, const char *s, size_t n, bool ascii, jj_sb *b)
{
    if (jj_sb_put(R, b, "\"", 1) < 0)
        return -1;
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        char esc[16];
        size_t en = 0;
        size_t nx = i + 1;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            en = 2;
        } else if (c < 0x20) {
            esc[0] = '\\';
            en = 2;
            switch (c) {
            case '\n':
                esc[1] = 'n';
                break;
            case '\r':
                esc[1] = 'r';
                break;
            case '\t':
                esc[1] = 't';
                break;
            case '\b':
                esc[1] = 'b';
                break;
            case '\f':
                esc[1] = 'f';
                break;
            default:
                en = (size_t)snprintf(esc, sizeof esc, "\\u%04x", c);
            }
        } else if (c >= 0x80 && ascii) {
            uint32_t cp = jj_utf8_cp(s, n, i, &nx);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                en = (size_t)snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + (cp >> 10),
                                      0xdc00 + (cp & 0x3ff));
            } else {
                en = (size_t)snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
        }
        if (en > 0) {
            if (jj_sb_put(R, b, s + run, i - run) < 0 || jj_sb_put(R, b, esc, en) < 0)
                return -1;
            run = nx;
        }
        i = nx;
    }
    if (jj_sb_put(R, b, s + run, n - run) < 0)
        return -1;
    return jj_sb_put(R, b, "\"", 1);
}

static int
json_nl(jj_rt *R, const jj_json_opt *o, jj_sb *b, int level)
{
    if (jj_sb_put(R, b, "\n", 1) < 0)
        return -1;
    for (int i = 0; i < level; i++)
        if (jj_sb_put(R, b, o->indent, o->indent_n) < 0)
            return -1;
    return 0;
}

/* json.dumps' key for a non-string key (ints, floats, bools, None). */
static int
json_key(jj_rt *R, jv k, const jj_json_opt *o, jj_sb *b)
{
    if (k.t == JV_STR)
        return json_str(R, k.u.s.p, k.u.s.n, o->ensure_ascii, b);
    if (k.t == JV_BOOL || k.t == JV_NONE) {
        const char *s = k.t == JV_NONE ? "\"null\"" : k.u.b ? "\"true\"" : "\"false\"";
        return jj_sb_puts(R, b, s);
    }
    if (k.t == JV_INT || k.t == JV_FLOAT) {
        if (jj_sb_puts(R, b, "\"") < 0 || jj_to_str(R, k, b) < 0)
            return -1;
        return jj_sb_puts(R, b, "\"");
    }
    return jj_fail(R, WK_EINVAL, "tojson: keys must be str, int, float, bool or None, not %s",
                   jj_type_name(k));
}

static int
key_cmp(const void *a, const void *b)
{
    const jv *x = *(const jv *const *)a, *y = *(const jv *const *)b;
    size_t n = x->u.s.n < y->u.s.n ? x->u.s.n : y->u.s.n;
    int c = memcmp(x->u.s.p, y->u.s.p, n);
    if (c != 0)
        return c;
    return x->u.s.n < y->u.s.n ? -1 : x->u.s.n > y->u.s.n;
}

int
jj_to_json(jj_rt *R, jv v, const jj_json_opt *o, jj_sb *b, int level)
{
    char buf[64];
    if (level > 512)
        return jj_fail(R, WK_ETOOBIG, "tojson: nested deeper than 512");
    switch (v.t) {
    case JV_NONE:
        return jj_sb_puts(R, b, "null");
    case JV_BOOL:
        return jj_sb_puts(R, b, v.u.b ? "true" : "false");
    case JV_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v.u.i);
        return jj_sb_puts(R, b, buf);
    case JV_FLOAT:
        if (isnan(v.u.f))
            return jj_sb_puts(R, b, "NaN");
        if (isinf(v.u.f))
            return jj_sb_puts(R, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        jj_format_float(v.u.f, buf, sizeof buf);
        return jj_sb_puts(R, b, buf);
    case JV_STR:
        return json_str(R, v.u.s.p, v.u.s.n, o->ensure_ascii, b);
    case JV_LIST: {
        jlist *l = v.u.l;
        if (l->kind != JL_PLAIN)
            return jj_fail(R, WK_EINVAL, "Object of type %s is not JSON serializable",
                           jj_type_name(v));
        if (l->n == 0)
            return jj_sb_puts(R, b, "[]");
        if (jj_step(R, l->n) < 0 || jj_sb_puts(R, b, "[") < 0)
            return -1;
        for (size_t i = 0; i < l->n; i++) {
            if (i > 0 && jj_sb_puts(R, b, o->item_sep) < 0)
                return -1;
            if (o->indent != NULL && json_nl(R, o, b, level + 1) < 0)
                return -1;
            if (jj_to_json(R, l->v[i], o, b, level + 1) < 0)
                return -1;
        }
        if (o->indent != NULL && json_nl(R, o, b, level) < 0)
            return -1;
        return jj_sb_puts(R, b, "]");
    }
    case JV_DICT: {
        jdict *d = v.u.d;
        if (d->n == 0)
            return jj_sb_puts(R, b, "{}");
        if (jj_step(R, d->n) < 0 || jj_sb_puts(R, b, "{") < 0)
            return -1;
        size_t *order = NULL;
        if (o->sort_keys) {
            const jv **keys = jj_alloc(&R->ar, d->n * sizeof *keys);
            order = jj_alloc(&R->ar, d->n * sizeof *order);
            if (keys == NULL || order == NULL)
                return jj_oom(R);
            for (size_t i = 0; i < d->n; i++) {
                if (d->k[i].t != JV_STR)
                    return jj_fail(R, WK_ENOTSUP, "tojson: sort_keys with a non-string key");
                keys[i] = &d->k[i];
            }
            qsort(keys, d->n, sizeof *keys, key_cmp);
            for (size_t i = 0; i < d->n; i++)
                order[i] = (size_t)(keys[i] - d->k);
        }
        for (size_t x = 0; x < d->n; x++) {
            size_t i = order != NULL ? order[x] : x;
            if (x > 0 && jj_sb_puts(R, b, o->item_sep) < 0)
                return -1;
            if (o->indent != NULL && json_nl(R, o, b, level + 1) < 0)
                return -1;
            if (json_key(R, d->k[i], o, b) < 0 || jj_sb_puts(R, b, o->key_sep) < 0 ||
                jj_to_json(R, d->v[i], o, b, level + 1) < 0)
                return -1;
        }
        if (o->indent != NULL && json_nl(R, o, b, level) < 0)
            return -1;
        return jj_sb_puts(R, b, "}");
    }
    default:
        return jj_fail(R, WK_EINVAL, "Object of type %s is not JSON serializable", jj_type_name(v));
    }
}
