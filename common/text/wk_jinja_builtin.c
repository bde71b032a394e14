/*
 * wk_jinja_builtin: jinja2's filters and tests, the Python str/dict/list
 * methods templates call, the global functions (range, namespace, dict,
 * raise_exception, strftime_now) and Python's operators, each with the
 * semantics of jinja2 3.1 under transformers' ImmutableSandboxedEnvironment
 * (tojson is transformers' json.dumps wrapper). What is not implemented is
 * refused by name (WK_ENOTSUP), never approximated; text case mapping
 * (upper, lower, title, capitalize) covers ASCII letters only and says so in
 * docs/TEMPLATES.md.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wk_jinja_priv.h"

/* ---- names ---- */

enum {
    F_ABS,
    F_CAPITALIZE,
    F_COUNT,
    F_D,
    F_DEFAULT,
    F_DICTSORT,
    F_E,
    F_ESCAPE,
    F_FIRST,
    F_FLOAT,
    F_INDENT,
    F_INT,
    F_ITEMS,
    F_JOIN,
    F_LAST,
    F_LENGTH,
    F_LIST,
    F_LOWER,
    F_MAP,
    F_MAX,
    F_MIN,
    F_REJECT,
    F_REJECTATTR,
    F_REPLACE,
    F_REVERSE,
    F_ROUND,
    F_SAFE,
    F_SELECT,
    F_SELECTATTR,
    F_SORT,
    F_STRING,
    F_SUM,
    F_TITLE,
    F_TOJSON,
    F_TRIM,
    F_UNIQUE,
    F_UPPER,
    F_WORDCOUNT,
    F__COUNT
};

static const char *const FILTER_NAMES[F__COUNT] = {
    "abs",     "capitalize", "count",  "d",      "default",    "dictsort",  "e",          "escape",
    "first",   "float",      "indent", "int",    "items",      "join",      "last",       "length",
    "list",    "lower",      "map",    "max",    "min",        "reject",    "rejectattr", "replace",
    "reverse", "round",      "safe",   "select", "selectattr", "sort",      "string",     "sum",
    "title",   "tojson",     "trim",   "unique", "upper",      "wordcount",
};

/* jinja2 filters this interpreter refuses when reached (the rest are unknown to jinja2 too) */
static const char *const FILTER_REFUSED[] = {
    "attr",      "batch",  "center",   "filesizeformat", "forceescape", "format",
    "groupby",   "pprint", "random",   "slice",          "striptags",   "truncate",
    "urlencode", "urlize", "wordwrap", "xmlattr",        NULL,
};

enum {
    T_BOOLEAN,
    T_CALLABLE,
    T_DEFINED,
    T_DIVISIBLEBY,
    T_EQ,
    T_EQUALTO,
    T_EQEQ,
    T_ESCAPED,
    T_EVEN,
    T_FALSE,
    T_FLOAT,
    T_GE,
    T_GEOP,
    T_GREATERTHAN,
    T_GT,
    T_GTOP,
    T_IN,
    T_INTEGER,
    T_ITERABLE,
    T_LE,
    T_LEOP,
    T_LESSTHAN,
    T_LOWER,
    T_LT,
    T_LTOP,
    T_MAPPING,
    T_NE,
    T_NEOP,
    T_NONE,
    T_NUMBER,
    T_ODD,
    T_SAMEAS,
    T_SEQUENCE,
    T_STRING,
    T_TRUE,
    T_UNDEFINED,
    T_UPPER,
    T__COUNT
};

int jj_test_id(const char *name);
static const char *const TEST_NAMES[T__COUNT] = {
    "boolean",  "callable", "defined",  "divisibleby", "eq",    "equalto",     "==",    "escaped",
    "even",     "false",    "float",    "ge",          ">=",    "greaterthan", "gt",    ">",
    "in",       "integer",  "iterable", "le",          "<=",    "lessthan",    "lower", "lt",
    "<",        "mapping",  "ne",       "!=",          "none",  "number",      "odd",   "sameas",
    "sequence", "string",   "true",     "undefined",   "upper",
};

int
jj_filter_id(const char *name)
{
    for (int i = 0; i < F__COUNT; i++)
        if (strcmp(FILTER_NAMES[i], name) == 0)
            return i;
    return -1;
}

bool
jj_jinja2_knows(const char *name, bool filter)
{
    static const char *const TESTS_REFUSED[] = {"filter", "test", NULL};
    if ((filter ? jj_filter_id(name) : jj_test_id(name)) >= 0)
        return true;
    for (const char *const *f = filter ? FILTER_REFUSED : TESTS_REFUSED; *f != NULL; f++)
        if (strcmp(*f, name) == 0)
            return true;
    return false;
}

int
jj_test_id(const char *name)
{
    for (int i = 0; i < T__COUNT; i++)
        if (strcmp(TEST_NAMES[i], name) == 0)
            return i;
    return -1;
}

enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME, G_LIPSUM, G_CYCLER, G_JOINER, G__COUNT };
static const char *const GLOBAL_NAMES[G__COUNT] = {
    "range", "namespace", "dict", "raise_exception", "strftime_now", "lipsum", "cycler", "joiner",
};

int
jj_global(const char *name)
{
    for (int i = 0; i < G__COUNT; i++)
        if (strcmp(GLOBAL_NAMES[i], name) == 0)
            return i;
    return -1;
}

/* ---- argument helpers ---- */

/* Argument pos (positional) or name (keyword); false when absent. */
static bool
arg(jv *args, const char **names, size_t n, size_t pos, const char *name, jv *out)
{
    size_t p = 0;
    for (size_t i = 0; i < n; i++) {
        if (names == NULL || names[i] == NULL) {
            if (p++ == pos) {
                *out = args[i];
                return true;
            }
        } else if (name != NULL && strcmp(names[i], name) == 0) {
            *out = args[i];
            return true;
        }
    }
    return false;
}

static size_t
npos(const char **names, size_t n)
{
    size_t p = 0;
    for (size_t i = 0; i < n; i++)
        if (names == NULL || names[i] == NULL)
            p++;
    return p;
}

/* Refuses keyword arguments not in allowed (NULL-terminated) and too many positionals. */
static int
check_args(jj_rt *R, const char *what, const char **names, size_t n, size_t maxpos,
           const char *const *allowed)
{
    if (npos(names, n) > maxpos)
        return jj_fail(R, WK_EINVAL, "%s takes at most %zu positional argument(s)", what, maxpos);
    for (size_t i = 0; names != NULL && i < n; i++) {
        if (names[i] == NULL)
            continue;
        bool ok = false;
        for (const char *const *a = allowed; a != NULL && *a != NULL; a++)
            if (strcmp(*a, names[i]) == 0)
                ok = true;
        if (!ok)
            return jj_fail(R, WK_EINVAL, "%s got an unexpected keyword argument '%s'", what,
                           names[i]);
    }
    return 0;
}

static int
need_str(jj_rt *R, jv v, const char *what)
{
    if (v.t == JV_STR)
        return 0;
    if (v.t == JV_UNDEF)
        return jj_fail(R, WK_EINVAL, "%s: '%.*s' is undefined", what, (int)v.u.s.n,
                       v.u.s.p != NULL ? v.u.s.p : "value");
    return jj_fail(R, WK_EINVAL, "%s: expected a str, got '%s'", what, jj_type_name(v));
}

static int
need_int(jj_rt *R, jv v, const char *what, int64_t *out)
{
    if (v.t == JV_INT) {
        *out = v.u.i;
        return 0;
    }
    if (v.t == JV_BOOL) {
        *out = v.u.b;
        return 0;
    }
    return jj_fail(R, WK_EINVAL, "%s: expected an integer, got '%s'", what, jj_type_name(v));
}

static jv
list_value(jlist *l)
{
    jv v = {.t = JV_LIST};
    v.u.l = l;
    return v;
}

static jv
float_value(double f)
{
    jv v = {.t = JV_FLOAT};
    v.u.f = f;
    return v;
}

/* soft_str: str(v) with Undefined as "" */
static int
sv(jj_rt *R, jv v, jv *out)
{
    return jj_strv(R, v, out);
}

static int html_escape(jj_rt *R, jv s, jv *out);

/* ---- string helpers ---- */

static bool
ascii_alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static bool
ascii_alnum(char c)
{
    return ascii_alpha(c) || (c >= '0' && c <= '9');
}

static char *
str_copy(jj_rt *R, jv s)
{
    char *p = jj_strdup(&R->ar, s.u.s.p, s.u.s.n);
    if (p == NULL)
        jj_oom(R);
    return p;
}

enum { CASE_UPPER, CASE_LOWER, CASE_CAPITALIZE, CASE_TITLE_PY, CASE_TITLE_JINJA };

/*
 * Python's one-to-one case mapping of c toward upper (up) or lower case, for
 * ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic and fullwidth Latin.
 * Returns 1 with *out set (c itself when it has no mapping that way) and
 * *cased when c is a cased letter; 0 for a character without case; -1 when
 * the mapping is not one-to-one or the script is not covered (refused).
 */
static int
cp_case(uint32_t c, bool up, uint32_t *out, bool *cased)
{
    *out = c;
    *cased = true;
    if (c < 0x80) {
        if (c >= 'a' && c <= 'z')
            *out = up ? c - 32 : c;
        else if (c >= 'A' && c <= 'Z')
            *out = up ? c : c + 32;
        else
            *cased = false;
        return *cased;
    }
    if (c < 0xc0) {
        if (c == 0xb5) { /* micro sign: upper is GREEK CAPITAL MU */
            *out = up ? 0x39c : c;
            return 1;
        }
        if (c == 0xaa || c == 0xba)
            return 1;
        *cased = false;
        return 0;
    }
    if (c <= 0xff) {
        if (c == 0xd7 || c == 0xf7) {
            *cased = false;
            return 0;
        }
        if (c == 0xdf) /* sharp s: "SS" */
            return up ? -1 : 1;
        if (c == 0xff) {
            *out = up ? 0x178 : c;
            return 1;
        }
        if (c < 0xe0)
            *out = up ? c : c + 0x20;
        else
            *out = up ? c - 0x20 : c;
        return 1;
    }
    if (c <= 0x17f) { /* Latin Extended-A: pairs */
        if (c == 0x130 || c == 0x149)
            return -1; /* İ lower and ŉ upper take two code points */
        if (c == 0x131) {
            *out = up ? 'I' : c;
            return 1;
        }
        if (c == 0x138)
            return 1;
        if (c == 0x178) {
            *out = up ? c : 0xff;
            return 1;
        }
        if (c == 0x17f) {
            *out = up ? 'S' : c;
            return 1;
        }
        bool even_upper = (c <= 0x137) || (c >= 0x14a && c <= 0x177);
        bool is_upper = even_upper ? (c % 2 == 0) : (c % 2 == 1);
        if (up)
            *out = is_upper ? c : c - 1;
        else
            *out = is_upper ? c + 1 : c;
        return 1;
    }
    if (c >= 0x386 && c <= 0x3ce) { /* Greek */
        if (c == 0x390 || c == 0x3b0 || c == 0x387 || c == 0x38b || c == 0x38d || c == 0x3a2)
            return c == 0x387 ? (*cased = false, 0) : -1;
        if (c == 0x3a3 && !up)
            return -1; /* sigma lowers to σ or ς by context */
        if (c == 0x3c2) {
            *out = up ? 0x3a3 : c;
            return 1;
        }
        if (c == 0x386) {
            *out = up ? c : 0x3ac;
        } else if (c >= 0x388 && c <= 0x38a) {
            *out = up ? c : c + 0x25;
        } else if (c == 0x38c) {
            *out = up ? c : 0x3cc;
        } else if (c == 0x38e || c == 0x38f) {
            *out = up ? c : c + 0x3f;
        } else if (c >= 0x391 && c <= 0x3ab) {
            *out = up ? c : c + 0x20;
        } else if (c == 0x3ac) {
            *out = up ? 0x386 : c;
        } else if (c >= 0x3ad && c <= 0x3af) {
            *out = up ? c - 0x25 : c;
        } else if (c >= 0x3b1 && c <= 0x3cb) {
            *out = up ? c - 0x20 : c;
        } else if (c == 0x3cc) {
            *out = up ? 0x38c : c;
        } else if (c == 0x3cd || c == 0x3ce) {
            *out = up ? c - 0x3f : c;
        }
        return 1;
    }
    if (c >= 0x400 && c <= 0x45f) { /* Cyrillic */
        if (c < 0x410)
            *out = up ? c : c + 0x50;
        else if (c < 0x430)
            *out = up ? c : c + 0x20;
        else if (c < 0x450)
            *out = up ? c - 0x20 : c;
        else
            *out = up ? c - 0x50 : c;
        return 1;
    }
    if (c >= 0xff21 && c <= 0xff3a) {
        *out = up ? c : c + 0x20;
        return 1;
    }
    if (c >= 0xff41 && c <= 0xff5a) {
        *out = up ? c - 0x20 : c;
        return 1;
    }
    /* scripts with case this table does not cover */
    if ((c >= 0x180 && c <= 0x2af) || (c >= 0x370 && c <= 0x3ff) || (c >= 0x460 && c <= 0x58f) ||
        (c >= 0x10a0 && c <= 0x10ff) || (c >= 0x13a0 && c <= 0x13ff) ||
        (c >= 0x1c80 && c <= 0x1cbf) || (c >= 0x1d00 && c <= 0x1dbf) ||
        (c >= 0x1e00 && c <= 0x1fff) || (c >= 0x2100 && c <= 0x218f) ||
        (c >= 0x24b6 && c <= 0x24e9) || (c >= 0x2c00 && c <= 0x2d2f) ||
        (c >= 0xa640 && c <= 0xa69f) || (c >= 0xa720 && c <= 0xa7ff) ||
        (c >= 0xab30 && c <= 0xabbf) || (c >= 0xfb00 && c <= 0xfb17) ||
        (c >= 0x10400 && c <= 0x104ff) || (c >= 0x10c80 && c <= 0x10cff) ||
        (c >= 0x118a0 && c <= 0x118ff) || (c >= 0x16e40 && c <= 0x16e9f) ||
        (c >= 0x1d400 && c <= 0x1d7ff) || (c >= 0x1e900 && c <= 0x1e95f) ||
        (c >= 0x1f130 && c <= 0x1f189))
        return -1;
    *cased = false;
    return 0;
}

static int
str_case(jj_rt *R, jv s, int mode, jv *out)
{
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, o = 0;
    char *buf = jj_alloc(&R->ar, n + 4);
    if (buf == NULL)
        return jj_oom(R);
    bool start = true, first = true;
    for (size_t i = 0; i < n;) {
        size_t nx;
        uint32_t c = jj_utf8_cp(p, n, i, &nx), m;
        bool up, cased;
        switch (mode) {
        case CASE_UPPER:
            up = true;
            break;
        case CASE_LOWER:
            up = false;
            break;
        case CASE_CAPITALIZE:
            up = first;
            break;
        default:
            up = start;
            break;
        }
        if (nx - i == 1 && (unsigned char)p[i] >= 0x80) { /* an invalid byte stays */
            buf[o++] = p[i];
            cased = false;
        } else {
            int r = cp_case(c, up, &m, &cased);
            if (r < 0)
                return jj_fail(R, WK_ENOTSUP, "case mapping of U+%04X is not supported",
                               (unsigned)c);
            size_t before = o;
            jj_utf8_put(buf, &o, m);
            if (o - before > nx - i) /* a mapping that grows the text (never in the table) */
                return jj_fail(R, WK_ENOTSUP, "case mapping of U+%04X is not supported",
                               (unsigned)c);
        }
        if (mode == CASE_TITLE_PY) {
            start = !cased;
        } else if (mode == CASE_TITLE_JINJA) {
            start = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' ||
                    jj_space_len(p + i, nx - i) > 0;
        }
        first = false;
        i = nx;
    }
    *out = jj_str(buf, o);
    return jj_step(R, n / 64);
}

/* Does code point sequence chars contain the code point at s[i..e)? */
static bool
in_chars(jv chars, const char *s, size_t i, size_t e)
{
    const char *c = chars.u.s.p;
    size_t n = chars.u.s.n;
    for (size_t k = 0; k < n;) {
        size_t ke = jj_utf8_next(c, n, k);
        if (ke - k == e - i && memcmp(c + k, s + i, e - i) == 0)
            return true;
        k = ke;
    }
    return false;
}

/* str.strip/lstrip/rstrip(chars): which 1 left, 2 right, 3 both. */
static int
str_strip(jj_rt *R, jv s, jv chars, int which, jv *out)
{
    const char *p = s.u.s.p;
    size_t a = 0, b = s.u.s.n, k;
    bool ws = chars.t == JV_NONE || chars.t == JV_UNDEF;
    if (!ws && need_str(R, chars, "strip") < 0)
        return -1;
    if (which & 1) {
        while (a < b) {
            if (ws) {
                if ((k = jj_space_len(p + a, b - a)) == 0)
                    break;
                a += k;
            } else {
                size_t e = jj_utf8_next(p, b, a);
                if (!in_chars(chars, p, a, e))
                    break;
                a = e;
            }
        }
    }
    if (which & 2) {
        while (b > a) {
            if (ws) {
                if ((k = jj_space_len_back(p + a, b - a)) == 0)
                    break;
                b -= k;
            } else {
                size_t st = b - 1;
                while (st > a && ((unsigned char)p[st] & 0xc0) == 0x80 && b - st < 4)
                    st--;
                if (jj_utf8_next(p, b, st) != b)
                    st = b - 1;
                if (!in_chars(chars, p, st, b))
                    break;
                b = st;
            }
        }
    }
    *out = jj_str(p + a, b - a);
    return jj_step(R, s.u.s.n / 64);
}

static const char *
mem_find(const char *h, size_t hn, const char *nd, size_t nn)
{
    if (nn == 0)
        return h;
    if (nn > hn)
        return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && memcmp(h + i, nd, nn) == 0)
            return h + i;
    return NULL;
}

static int
str_replace(jj_rt *R, jv s, jv old, jv new, int64_t count, jv *out)
{
    jj_sb b = {0};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    int64_t done = 0;
    if (jj_step(R, n / 16) < 0)
        return -1;
    if (old.u.s.n == 0) { /* Python inserts new between every character */
        while (count < 0 || done < count) {
            if (jj_sb_put(R, &b, new.u.s.p, new.u.s.n) < 0)
                return -1;
            done++;
            if (i >= n)
                break;
            size_t e = jj_utf8_next(p, n, i);
            if (jj_sb_put(R, &b, p + i, e - i) < 0)
                return -1;
            i = e;
        }
        if (jj_sb_put(R, &b, p + i, n - i) < 0)
            return -1;
        *out = jj_sb_value(&b);
        return 0;
    }
    while (i <= n && (count < 0 || done < count)) {
        const char *f = mem_find(p + i, n - i, old.u.s.p, old.u.s.n);
        if (f == NULL)
            break;
        size_t at = (size_t)(f - p);
        if (jj_sb_put(R, &b, p + i, at - i) < 0 || jj_sb_put(R, &b, new.u.s.p, new.u.s.n) < 0)
            return -1;
        i = at + old.u.s.n;
        done++;
    }
    if (done == 0) {
        *out = s;
        return 0;
    }
    if (jj_sb_put(R, &b, p + i, n - i) < 0)
        return -1;
    *out = jj_sb_value(&b);
    return 0;
}

/* str.split(sep=None, maxsplit=-1) and rsplit */
static int
str_split(jj_rt *R, jv s, jv sep, int64_t maxsplit, bool right, jv *out)
{
    jlist *l = jj_list_new(R, 0);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (l == NULL || jj_step(R, n / 16) < 0)
        return -1;
    if (sep.t == JV_NONE || sep.t == JV_UNDEF) {
        if (right && maxsplit >= 0)
            return jj_fail(R, WK_ENOTSUP, "rsplit() on whitespace with maxsplit");
        size_t i = 0, k;
        int64_t done = 0;
        for (;;) {
            while (i < n && (k = jj_space_len(p + i, n - i)) > 0)
                i += k;
            if (i >= n)
                break;
            if (maxsplit >= 0 && done >= maxsplit) {
                size_t e = n;
                while (e > i && (k = jj_space_len_back(p + i, e - i)) > 0)
                    e -= k;
                if (jj_list_push(R, l, jj_str(p + i, e - i)) < 0)
                    return -1;
                break;
            }
            size_t st = i;
            while (i < n && jj_space_len(p + i, n - i) == 0)
                i = jj_utf8_next(p, n, i);
            if (jj_list_push(R, l, jj_str(p + st, i - st)) < 0)
                return -1;
            done++;
        }
        *out = list_value(l);
        return 0;
    }
    if (need_str(R, sep, "split") < 0)
        return -1;
    if (sep.u.s.n == 0)
        return jj_fail(R, WK_EINVAL, "empty separator");
    const char *q = sep.u.s.p;
    size_t m = sep.u.s.n;
    if (!right) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *f = maxsplit >= 0 && done >= maxsplit ? NULL : mem_find(p + i, n - i, q, m);
            if (f == NULL) {
                if (jj_list_push(R, l, jj_str(p + i, n - i)) < 0)
                    return -1;
                break;
            }
            if (jj_list_push(R, l, jj_str(p + i, (size_t)(f - p) - i)) < 0)
                return -1;
            i = (size_t)(f - p) + m;
            done++;
        }
    } else {
        /* collect from the right, then reverse */
        size_t e = n;
        int64_t done = 0;
        for (;;) {
            ptrdiff_t at = -1;
            if (!(maxsplit >= 0 && done >= maxsplit) && e >= m) {
                for (size_t x = e - m + 1; x-- > 0;)
                    if (memcmp(p + x, q, m) == 0) {
                        at = (ptrdiff_t)x;
                        break;
                    }
            }
            if (at < 0) {
                if (jj_list_push(R, l, jj_str(p, e)) < 0)
                    return -1;
                break;
            }
            if (jj_list_push(R, l, jj_str(p + at + m, e - (size_t)at - m)) < 0)
                return -1;
            e = (size_t)at;
            done++;
        }
        for (size_t a = 0, b = l->n - 1; a < b; a++, b--) {
            jv t = l->v[a];
            l->v[a] = l->v[b];
            l->v[b] = t;
        }
    }
    *out = list_value(l);
    return 0;
}

static int
str_splitlines(jj_rt *R, jv s, jv *out)
{
    jlist *l = jj_list_new(R, 0);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0, st = 0;
    if (l == NULL)
        return -1;
    while (i < n) {
        unsigned char c = (unsigned char)p[i];
        size_t brk = 0;
        if (c == '\n' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e)
            brk = 1;
        else if (c == '\r')
            brk = i + 1 < n && p[i + 1] == '\n' ? 2 : 1;
        else if (c == 0xc2 && i + 1 < n && (unsigned char)p[i + 1] == 0x85)
            brk = 2;
        else if (c == 0xe2 && i + 2 < n && (unsigned char)p[i + 1] == 0x80 &&
                 ((unsigned char)p[i + 2] == 0xa8 || (unsigned char)p[i + 2] == 0xa9))
            brk = 3;
        if (brk == 0) {
            i++;
            continue;
        }
        if (jj_list_push(R, l, jj_str(p + st, i - st)) < 0)
            return -1;
        i += brk;
        st = i;
    }
    if (st < n && jj_list_push(R, l, jj_str(p + st, n - st)) < 0)
        return -1;
    *out = list_value(l);
    return 0;
}

/* startswith/endswith with a str or a tuple of str */
static int
str_affix(jj_rt *R, jv s, jv x, bool end, jv *out)
{
    size_t cnt = 1;
    jv *cands = &x;
    if (x.t == JV_LIST && x.u.l->tuple) {
        cnt = x.u.l->n;
        cands = x.u.l->v;
    }
    for (size_t i = 0; i < cnt; i++) {
        jv c = cands[i];
        if (need_str(R, c, end ? "endswith" : "startswith") < 0)
            return -1;
        if (c.u.s.n <= s.u.s.n &&
            memcmp(s.u.s.p + (end ? s.u.s.n - c.u.s.n : 0), c.u.s.p, c.u.s.n) == 0) {
            *out = jj_bool(true);
            return 0;
        }
    }
    *out = jj_bool(false);
    return 0;
}

/* str.format with {} {0} {name} fields and no format spec */
static int
str_format(jj_rt *R, jv s, jv *args, const char **names, size_t n, jv *out)
{
    jj_sb b = {0};
    const char *p = s.u.s.p;
    size_t len = s.u.s.n, auto_i = 0;
    for (size_t i = 0; i < len; i++) {
        char c = p[i];
        if (c == '}') {
            if (i + 1 < len && p[i + 1] == '}') {
                i++;
                if (jj_sb_put(R, &b, "}", 1) < 0)
                    return -1;
                continue;
            }
            return jj_fail(R, WK_EINVAL, "format: single '}' encountered");
        }
        if (c != '{') {
            if (jj_sb_put(R, &b, &c, 1) < 0)
                return -1;
            continue;
        }
        if (i + 1 < len && p[i + 1] == '{') {
            i++;
            if (jj_sb_put(R, &b, "{", 1) < 0)
                return -1;
            continue;
        }
        size_t e = i + 1;
        while (e < len && p[e] != '}')
            e++;
        if (e >= len)
            return jj_fail(R, WK_EINVAL, "format: single '{' encountered");
        const char *f = p + i + 1;
        size_t fn = e - i - 1;
        jv v;
        bool found = false;
        if (memchr(f, ':', fn) != NULL || memchr(f, '!', fn) != NULL ||
            memchr(f, '.', fn) != NULL || memchr(f, '[', fn) != NULL)
            return jj_fail(R, WK_ENOTSUP, "format: field '%.*s' (conversions, specs, attributes)",
                           (int)fn, f);
        if (fn == 0) {
            found = arg(args, names, n, auto_i++, NULL, &v);
        } else if (f[0] >= '0' && f[0] <= '9') {
            found = arg(args, names, n, (size_t)atoi(f), NULL, &v);
        } else {
            for (size_t k = 0; names != NULL && k < n; k++)
                if (names[k] != NULL && strlen(names[k]) == fn && memcmp(names[k], f, fn) == 0) {
                    v = args[k];
                    found = true;
                }
        }
        if (!found)
            return jj_fail(R, WK_EINVAL, "format: no argument for field '{%.*s}'", (int)fn, f);
        if (jj_to_str(R, v, &b) < 0)
            return -1;
        i = e;
    }
    *out = jj_sb_value(&b);
    return 0;
}

/* ---- comparisons and operators ---- */

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

static int64_t
num_i(jv v)
{
    return v.t == JV_INT ? v.u.i : v.u.b;
}

/* Python's a < b: -1, 0, 1 in *c; fails for unorderable types. */
static int
order(jj_rt *R, jv a, jv b, int *c, const char *op)
{
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = num_i(a), y = num_i(b);
            *c = x < y ? -1 : x > y;
        } else {
            double x = num_f(a), y = num_f(b);
            *c = x < y ? -1 : x > y; /* NaN compares as equal here; Python: all False */
        }
        return 0;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int m = memcmp(a.u.s.p, b.u.s.p, n);
        *c = m != 0 ? (m < 0 ? -1 : 1) : a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
        return 0;
    }
    if (jj_plain(a) && jj_plain(b) && a.u.l->tuple == b.u.l->tuple) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jj_eq(a.u.l->v[i], b.u.l->v[i]))
                continue;
            return order(R, a.u.l->v[i], b.u.l->v[i], c, op);
        }
        *c = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
        return 0;
    }
    if (a.t == JV_UNDEF || b.t == JV_UNDEF)
        return jj_fail(R, WK_EINVAL, "an undefined value is compared with '%s'", op);
    return jj_fail(R, WK_EINVAL, "'%s' not supported between instances of '%s' and '%s'", op,
                   jj_type_name(a), jj_type_name(b));
}

static int
contains(jj_rt *R, jv item, jv seq, bool *out)
{
    switch (seq.t) {
    case JV_STR:
        if (item.t != JV_STR)
            return jj_fail(R, WK_EINVAL, "'in <string>' requires string as left operand, not %s",
                           jj_type_name(item));
        *out = mem_find(seq.u.s.p, seq.u.s.n, item.u.s.p, item.u.s.n) != NULL;
        return jj_step(R, seq.u.s.n / 64);
    case JV_LIST:
        *out = false;
        for (size_t i = 0; i < seq.u.l->n && !*out; i++)
            *out = jj_eq(item, seq.u.l->v[i]);
        return jj_step(R, seq.u.l->n);
    case JV_DICT: {
        jv v;
        if ((item.t == JV_LIST && !item.u.l->tuple) || item.t == JV_DICT || item.t == JV_NS)
            return jj_fail(R, WK_EINVAL, "unhashable type: '%s'", jj_type_name(item));
        *out = jj_dict_getv(seq.u.d, item, &v);
        return jj_step(R, seq.u.d->n);
    }
    case JV_UNDEF:
        *out = false;
        return 0;
    default:
        return jj_fail(R, WK_EINVAL, "argument of type '%s' is not iterable", jj_type_name(seq));
    }
}

int
jj_compare(jj_rt *R, int op, jv a, jv b, bool *out)
{
    int c;
    switch (op) {
    case JJ_OP_EQ:
        *out = jj_eq(a, b);
        return 0;
    case JJ_OP_NE:
        *out = !jj_eq(a, b);
        return 0;
    case JJ_OP_IN:
        return contains(R, a, b, out);
    case JJ_OP_NOTIN:
        if (contains(R, a, b, out) < 0)
            return -1;
        *out = !*out;
        return 0;
    case JJ_OP_LT:
        if (order(R, a, b, &c, "<") < 0)
            return -1;
        *out = c < 0;
        return 0;
    case JJ_OP_LE:
        if (order(R, a, b, &c, "<=") < 0)
            return -1;
        *out = c <= 0;
        return 0;
    case JJ_OP_GT:
        if (order(R, a, b, &c, ">") < 0)
            return -1;
        *out = c > 0;
        return 0;
    case JJ_OP_GE:
        if (order(R, a, b, &c, ">=") < 0)
            return -1;
        *out = c >= 0;
        return 0;
    default:
        return jj_fail(R, WK_EINVAL, "internal: comparison %d", op);
    }
}

static int
repeat(jj_rt *R, jv s, int64_t times, jv *out)
{
    if (times <= 0) {
        if (s.t == JV_STR) {
            *out = jj_str("", 0);
        } else {
            jlist *l = jj_list_new(R, 0);
            if (l == NULL)
                return -1;
            l->tuple = s.u.l->tuple;
            *out = list_value(l);
        }
        return 0;
    }
    size_t unit = s.t == JV_STR ? s.u.s.n : s.u.l->n * sizeof(jv);
    if (unit > 0 && (uint64_t)times > R->lim.max_memory / unit)
        return jj_fail(R, WK_ETOOBIG, "repetition over max_memory");
    if (s.t == JV_STR) {
        jj_sb b = {0};
        for (int64_t i = 0; i < times; i++)
            if (jj_sb_put(R, &b, s.u.s.p, s.u.s.n) < 0)
                return -1;
        *out = jj_sb_value(&b);
        return 0;
    }
    jlist *l = jj_list_new(R, 0);
    if (l == NULL)
        return -1;
    l->tuple = s.u.l->tuple;
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < s.u.l->n; k++)
            if (jj_list_push(R, l, s.u.l->v[k]) < 0)
                return -1;
    *out = list_value(l);
    return 0;
}

static int
bad_operands(jj_rt *R, const char *op, jv a, jv b)
{
    if (a.t == JV_UNDEF || b.t == JV_UNDEF) {
        jv u = a.t == JV_UNDEF ? a : b;
        if (u.u.s.p != NULL)
            return jj_fail(R, WK_EINVAL, "'%.*s' is undefined (operand of '%s')", (int)u.u.s.n,
                           u.u.s.p, op);
        return jj_fail(R, WK_EINVAL, "an undefined value is an operand of '%s'", op);
    }
    return jj_fail(R, WK_EINVAL, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                   jj_type_name(a), jj_type_name(b));
}

int
jj_binop(jj_rt *R, int op, jv a, jv b, jv *out)
{
    static const char *const opname[] = {"+", "-", "*", "/", "//", "%", "**"};
    bool ints = (a.t == JV_INT || a.t == JV_BOOL) && (b.t == JV_INT || b.t == JV_BOOL);
    if (is_num(a) && is_num(b)) {
        if (ints) {
            int64_t x = num_i(a), y = num_i(b), r = 0;
            bool ovf = false;
            switch (op) {
            case JJ_OP_ADD:
                ovf = __builtin_add_overflow(x, y, &r);
                break;
            case JJ_OP_SUB:
                ovf = __builtin_sub_overflow(x, y, &r);
                break;
            case JJ_OP_MUL:
                ovf = __builtin_mul_overflow(x, y, &r);
                break;
            case JJ_OP_DIV:
                if (y == 0)
                    return jj_fail(R, WK_EINVAL, "division by zero");
                *out = float_value((double)x / (double)y);
                return 0;
            case JJ_OP_FLOORDIV:
            case JJ_OP_MOD:
                if (y == 0)
                    return jj_fail(R, WK_EINVAL, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) {
                    ovf = true;
                    break;
                }
                {
                    int64_t q = x / y, m = x % y;
                    if (m != 0 && ((m < 0) != (y < 0))) {
                        q--;
                        m += y;
                    }
                    r = op == JJ_OP_FLOORDIV ? q : m;
                }
                break;
            case JJ_OP_POW:
                if (y < 0) {
                    if (x == 0)
                        return jj_fail(R, WK_EINVAL, "0.0 cannot be raised to a negative power");
                    *out = float_value(pow((double)x, (double)y));
                    return 0;
                }
                r = 1;
                for (int64_t i = 0; i < y && !ovf; i++) {
                    ovf = __builtin_mul_overflow(r, x, &r);
                    if (jj_step(R, 1) < 0)
                        return -1;
                    if (r == 0 || r == 1)
                        break;
                }
                break;
            default:
                return jj_fail(R, WK_EINVAL, "internal: operator %d", op);
            }
            if (ovf)
                return jj_fail(R, WK_ENOTSUP, "integer beyond 64 bits from '%s'", opname[op]);
            *out = jj_int(r);
            return 0;
        }
        double x = num_f(a), y = num_f(b), r;
        switch (op) {
        case JJ_OP_ADD:
            r = x + y;
            break;
        case JJ_OP_SUB:
            r = x - y;
            break;
        case JJ_OP_MUL:
            r = x * y;
            break;
        case JJ_OP_DIV:
            if (y == 0)
                return jj_fail(R, WK_EINVAL, "float division by zero");
            r = x / y;
            break;
        case JJ_OP_FLOORDIV:
        case JJ_OP_MOD: {
            if (y == 0)
                return jj_fail(R, WK_EINVAL, "float modulo");
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0)))
                m += y;
            else if (m == 0)
                m = copysign(0.0, y); /* Python: the sign of the divisor */
            r = op == JJ_OP_MOD ? m : floor((x - m) / y + 0.5);
            if (op == JJ_OP_FLOORDIV)
                r = floor(x / y);
            break;
        }
        case JJ_OP_POW:
            if (x == 0 && y < 0)
                return jj_fail(R, WK_EINVAL, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y))
                return jj_fail(R, WK_ENOTSUP, "a negative number to a fractional power (complex)");
            r = pow(x, y);
            break;
        default:
            return jj_fail(R, WK_EINVAL, "internal: operator %d", op);
        }
        if (op == JJ_OP_POW && isinf(r) && isfinite(x) && isfinite(y))
            return jj_fail(R, WK_EINVAL, "(34, 'Numerical result out of range')");
        *out = float_value(r);
        return 0;
    }
    if (op == JJ_OP_ADD && a.t == JV_STR && b.t == JV_STR) {
        jj_sb s = {0};
        bool mk = a.mk || b.mk;
        /* Markup + str escapes the str (and str + Markup) */
        if (mk && !a.mk && html_escape(R, a, &a) < 0)
            return -1;
        if (mk && !b.mk && html_escape(R, b, &b) < 0)
            return -1;
        if (jj_sb_put(R, &s, a.u.s.p, a.u.s.n) < 0 || jj_sb_put(R, &s, b.u.s.p, b.u.s.n) < 0)
            return -1;
        *out = jj_sb_value(&s);
        out->mk = mk;
        return 0;
    }
    if (op == JJ_OP_ADD && jj_plain(a) && jj_plain(b) && a.u.l->tuple == b.u.l->tuple) {
        jlist *l = jj_list_new(R, a.u.l->n + b.u.l->n);
        if (l == NULL)
            return -1;
        if (a.u.l->n > 0)
            memcpy(l->v, a.u.l->v, a.u.l->n * sizeof(jv));
        if (b.u.l->n > 0)
            memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof(jv));
        l->n = a.u.l->n + b.u.l->n;
        l->tuple = a.u.l->tuple;
        *out = list_value(l);
        return jj_step(R, l->n);
    }
    if (op == JJ_OP_MUL && (a.t == JV_STR || jj_plain(a)) && (b.t == JV_INT || b.t == JV_BOOL))
        return repeat(R, a, num_i(b), out);
    if (op == JJ_OP_MUL && (b.t == JV_STR || jj_plain(b)) && (a.t == JV_INT || a.t == JV_BOOL))
        return repeat(R, b, num_i(a), out);
    if (op == JJ_OP_MOD && a.t == JV_STR)
        return jj_fail(R, WK_ENOTSUP, "printf-style string formatting ('%%')");
    return bad_operands(R, opname[op], a, b);
}

/* Python's slice.indices: normalises start/stop for a length n and step. */
static int
slice_bounds(jj_rt *R, jv start, jv stop, jv step, int64_t n, int64_t *a, int64_t *b, int64_t *s)
{
    *s = 1;
    if (step.t != JV_NONE && need_int(R, step, "slice step", s) < 0)
        return -1;
    if (*s == 0)
        return jj_fail(R, WK_EINVAL, "slice step cannot be zero");
    int64_t lo = *s < 0 ? -1 : 0, hi = *s < 0 ? n - 1 : n;
    if (start.t == JV_NONE) {
        *a = *s < 0 ? hi : lo;
    } else {
        if (need_int(R, start, "slice start", a) < 0)
            return -1;
        if (*a < 0) {
            *a += n;
            if (*a < lo)
                *a = lo;
        } else if (*a > hi) {
            *a = hi;
        }
    }
    if (stop.t == JV_NONE) {
        *b = *s < 0 ? lo : hi;
    } else {
        if (need_int(R, stop, "slice stop", b) < 0)
            return -1;
        if (*b < 0) {
            *b += n;
            if (*b < lo)
                *b = lo;
        } else if (*b > hi) {
            *b = hi;
        }
    }
    return 0;
}

int
jj_slice(jj_rt *R, jv obj, jv start, jv stop, jv step, jv *out)
{
    int64_t a, b, s;
    /* jinja2 slices with Python's subscript (not its lenient getitem) */
    if (obj.t == JV_DICT)
        return jj_fail(R, WK_EINVAL, "unhashable type: 'slice'");
    if (obj.t != JV_STR && !jj_plain(obj))
        return jj_fail(R, WK_EINVAL, "'%s' object is not subscriptable", jj_type_name(obj));
    if (obj.t == JV_LIST) {
        jlist *src = obj.u.l;
        if (slice_bounds(R, start, stop, step, (int64_t)src->n, &a, &b, &s) < 0)
            return -1;
        jlist *l = jj_list_new(R, 0);
        if (l == NULL)
            return -1;
        l->tuple = src->tuple;
        for (int64_t i = a; s > 0 ? i < b : i > b; i += s)
            if (jj_list_push(R, l, src->v[i]) < 0)
                return -1;
        *out = list_value(l);
        return jj_step(R, l->n);
    }
    if (obj.t == JV_STR) {
        const char *p = obj.u.s.p;
        size_t n = obj.u.s.n;
        /* code point offsets */
        size_t cn = jj_utf8_len(p, n);
        size_t *off = jj_alloc(&R->ar, (cn + 1) * sizeof *off);
        if (off == NULL)
            return jj_oom(R);
        if (jj_step(R, n / 16) < 0)
            return -1;
        for (size_t i = 0, c = 0; c <= cn; c++) {
            off[c] = i;
            i = jj_utf8_next(p, n, i);
        }
        if (slice_bounds(R, start, stop, step, (int64_t)cn, &a, &b, &s) < 0)
            return -1;
        if (s == 1) {
            *out = a < b ? jj_str(p + off[a], off[b] - off[a]) : jj_str("", 0);
            return 0;
        }
        jj_sb sb = {0};
        for (int64_t i = a; s > 0 ? i < b : i > b; i += s)
            if (jj_sb_put(R, &sb, p + off[i], off[i + 1] - off[i]) < 0)
                return -1;
        *out = jj_sb_value(&sb);
        return 0;
    }
    return jj_fail(R, WK_ENOTSUP, "slicing a %s", jj_type_name(obj));
}

/* ---- tests ---- */

int
jj_test(jj_rt *R, int id, const char *name, jv in, jv *args, size_t n, bool *out)
{
    jv a = n > 0 ? args[0] : jj_none();
    switch (id) {
    case T_BOOLEAN:
        *out = in.t == JV_BOOL;
        return 0;
    case T_CALLABLE:
        *out = in.t == JV_MACRO || in.t == JV_FUNC || in.t == JV_BOUND;
        return 0;
    case T_DEFINED:
        *out = in.t != JV_UNDEF;
        return 0;
    case T_UNDEFINED:
        *out = in.t == JV_UNDEF;
        return 0;
    case T_DIVISIBLEBY: { /* value % num == 0 */
        jv m;
        if (jj_binop(R, JJ_OP_MOD, in, a, &m) < 0)
            return -1;
        *out = jj_eq(m, jj_int(0));
        return 0;
    }
    case T_EQ:
    case T_EQUALTO:
    case T_EQEQ:
        *out = jj_eq(in, a);
        return 0;
    case T_NE:
    case T_NEOP:
        *out = !jj_eq(in, a);
        return 0;
    case T_GE:
    case T_GEOP:
        return jj_compare(R, JJ_OP_GE, in, a, out);
    case T_GT:
    case T_GTOP:
    case T_GREATERTHAN:
        return jj_compare(R, JJ_OP_GT, in, a, out);
    case T_LE:
    case T_LEOP:
        return jj_compare(R, JJ_OP_LE, in, a, out);
    case T_LT:
    case T_LTOP:
    case T_LESSTHAN:
        return jj_compare(R, JJ_OP_LT, in, a, out);
    case T_IN:
        return contains(R, in, a, out);
    case T_ESCAPED:
        *out = false;
        return 0;
    case T_EVEN:
    case T_ODD: { /* value % 2 == 0 / == 1 */
        jv m;
        if (jj_binop(R, JJ_OP_MOD, in, jj_int(2), &m) < 0)
            return -1;
        *out = jj_eq(m, jj_int(id == T_EVEN ? 0 : 1));
        return 0;
    }
    case T_FALSE:
        *out = in.t == JV_BOOL && !in.u.b;
        return 0;
    case T_TRUE:
        *out = in.t == JV_BOOL && in.u.b;
        return 0;
    case T_FLOAT:
        *out = in.t == JV_FLOAT;
        return 0;
    case T_INTEGER:
        *out = in.t == JV_INT;
        return 0;
    case T_NUMBER:
        *out = is_num(in);
        return 0;
    case T_ITERABLE:
        *out = in.t == JV_STR || in.t == JV_LIST || in.t == JV_DICT || in.t == JV_UNDEF;
        return 0;
    case T_SEQUENCE:
        *out = in.t == JV_STR || jj_plain(in) || in.t == JV_DICT || in.t == JV_UNDEF;
        return 0;
    case T_MAPPING:
        *out = in.t == JV_DICT;
        return 0;
    case T_NONE:
        *out = in.t == JV_NONE;
        return 0;
    case T_STRING:
        *out = in.t == JV_STR;
        return 0;
    case T_SAMEAS:
        if (in.t != a.t) {
            *out = false;
        } else if (in.t == JV_NONE || in.t == JV_BOOL || in.t == JV_UNDEF) {
            *out = jj_eq(in, a);
        } else if (in.t == JV_INT) {
            *out = in.u.i == a.u.i && in.u.i >= -5 && in.u.i <= 256;
        } else if (in.t == JV_LIST || in.t == JV_DICT || in.t == JV_NS) {
            *out = in.t == JV_LIST ? in.u.l == a.u.l : in.u.d == a.u.d;
        } else {
            return jj_fail(R, WK_ENOTSUP, "'sameas' on a %s", jj_type_name(in));
        }
        return 0;
    case T_LOWER:
    case T_UPPER: {
        if (in.t != JV_STR) {
            jv s;
            if (jj_strv(R, in, &s) < 0)
                return -1;
            in = s;
        }
        /* str.islower(): some cased character and none of the other case */
        bool any = false, ok = true;
        for (size_t i = 0; i < in.u.s.n;) {
            size_t nx;
            uint32_t c = jj_utf8_cp(in.u.s.p, in.u.s.n, i, &nx), m;
            bool cased;
            int r = cp_case(c, id == T_UPPER, &m, &cased);
            if (r < 0)
                return jj_fail(R, WK_ENOTSUP, "'%s' test on U+%04X", name, (unsigned)c);
            if (cased) {
                any = true;
                if (m != c)
                    ok = false;
            }
            i = nx;
        }
        *out = any && ok;
        return 0;
    }
    default:
        return jj_fail(R, WK_ENOTSUP, "no test named '%s'", name);
    }
}

/* ---- methods ---- */

static const char *const STR_METHODS[] = {
    "strip",    "lstrip",  "rstrip",  "split", "rsplit",  "splitlines", "startswith",
    "endswith", "replace", "upper",   "lower", "title",   "capitalize", "format",
    "find",     "rfind",   "count",   "join",  "isdigit", "isalpha",    "isalnum",
    "isspace",  "isupper", "islower", NULL,
};
static const char *const DICT_METHODS[] = {"get", "items", "keys", "values", "copy", NULL};
static const char *const DICT_UNSAFE[] = {"pop", "popitem", "update", "setdefault", "clear", NULL};
static const char *const LIST_METHODS[] = {"count", "index", "copy", NULL};
static const char *const LIST_UNSAFE[] = {"append", "pop",     "extend", "insert", "remove",
                                          "sort",   "reverse", "clear",  NULL};

static bool
in_list(const char *const *l, const char *name)
{
    for (; *l != NULL; l++)
        if (strcmp(*l, name) == 0)
            return true;
    return false;
}

int
jj_method_kind(jv obj, const char *name, bool *unsafe)
{
    *unsafe = false;
    if (obj.t == JV_STR)
        return in_list(STR_METHODS, name) || in_list((const char *const[]){"encode",
                                                                           "center",
                                                                           "ljust",
                                                                           "rjust",
                                                                           "zfill",
                                                                           "partition",
                                                                           "rpartition",
                                                                           "casefold",
                                                                           "swapcase",
                                                                           "expandtabs",
                                                                           "index",
                                                                           "rindex",
                                                                           "removeprefix",
                                                                           "removesuffix",
                                                                           "translate",
                                                                           "isnumeric",
                                                                           "isdecimal",
                                                                           "istitle",
                                                                           "isidentifier",
                                                                           "isprintable",
                                                                           "isascii",
                                                                           "format_map",
                                                                           NULL},
                                                     name);
    if (obj.t == JV_DICT) {
        if (in_list(DICT_UNSAFE, name)) {
            *unsafe = true;
            return 1;
        }
        return in_list(DICT_METHODS, name) || strcmp(name, "fromkeys") == 0;
    }
    if (jj_plain(obj)) {
        if (!obj.u.l->tuple && in_list(LIST_UNSAFE, name)) {
            *unsafe = true;
            return 1;
        }
        return in_list(LIST_METHODS, name);
    }
    return 0;
}

static jv
tuple2(jj_rt *R, jv a, jv b)
{
    jlist *l = jj_list_new(R, 2);
    if (l == NULL)
        return jj_undef(NULL);
    l->v[0] = a;
    l->v[1] = b;
    l->n = 2;
    l->tuple = true;
    return list_value(l);
}

static int
dict_items(jj_rt *R, jdict *d, int which, jv *out)
{
    jlist *l = jj_list_new(R, d->n);
    if (l == NULL)
        return -1;
    for (size_t i = 0; i < d->n; i++) {
        if (which == 0) {
            l->v[i] = tuple2(R, d->k[i], d->v[i]);
            if (l->v[i].t == JV_UNDEF)
                return -1;
        } else {
            l->v[i] = which == 1 ? d->k[i] : d->v[i];
        }
    }
    l->n = d->n;
    l->kind = which == 0 ? JL_ITEMS : which == 1 ? JL_KEYS : JL_VALUES;
    *out = list_value(l);
    return jj_step(R, d->n);
}

static int
str_find(jj_rt *R, jv s, jv sub, bool right, jv *out)
{
    if (need_str(R, sub, "find") < 0)
        return -1;
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, m = sub.u.s.n;
    ptrdiff_t at = -1;
    if (!right) {
        const char *f = mem_find(p, n, sub.u.s.p, m);
        if (f != NULL)
            at = f - p;
    } else if (m <= n) {
        for (size_t x = n - m + 1; x-- > 0;)
            if (memcmp(p + x, sub.u.s.p, m) == 0) {
                at = (ptrdiff_t)x;
                break;
            }
    }
    *out = jj_int(at < 0 ? -1 : (int64_t)jj_utf8_len(p, (size_t)at));
    return 0;
}

static int join_values(jj_rt *R, jlist *l, jv sep, jv *out);

int
jj_method(jj_rt *R, jv obj, const char *name, jv *args, const char **names, size_t n, jv *out)
{
    jv a0 = jj_none(), a1 = jj_none();
    bool h0 = arg(args, names, n, 0, NULL, &a0);
    bool h1 = arg(args, names, n, 1, NULL, &a1);
    (void)h1;
    if (jj_step(R, 1) < 0)
        return -1;
    if (obj.t == JV_STR && obj.mk) /* markupsafe's methods escape their arguments */
        return jj_fail(R, WK_ENOTSUP, "str.%s() on Markup text (from safe/escape)", name);
    if (obj.t == JV_STR) {
        if (strcmp(name, "format") == 0)
            return str_format(R, obj, args, names, n, out);
        if (check_args(R, name, names, n, 3,
                       (const char *const[]){"sep", "maxsplit", "chars", NULL}) < 0)
            return -1;
        if (strcmp(name, "strip") == 0 || strcmp(name, "lstrip") == 0 ||
            strcmp(name, "rstrip") == 0)
            return str_strip(R, obj, a0, name[0] == 'l' ? 1 : name[0] == 'r' ? 2 : 3, out);
        if (strcmp(name, "split") == 0 || strcmp(name, "rsplit") == 0) {
            int64_t maxs = -1;
            jv sep = jj_none(), ms;
            arg(args, names, n, 0, "sep", &sep);
            if (arg(args, names, n, 1, "maxsplit", &ms) && need_int(R, ms, name, &maxs) < 0)
                return -1;
            return str_split(R, obj, sep, maxs, name[0] == 'r', out);
        }
        if (strcmp(name, "splitlines") == 0)
            return str_splitlines(R, obj, out);
        if (strcmp(name, "startswith") == 0 || strcmp(name, "endswith") == 0) {
            if (!h0 || n > 1)
                return jj_fail(R, WK_ENOTSUP, "%s() with start/end arguments", name);
            return str_affix(R, obj, a0, name[0] == 'e', out);
        }
        if (strcmp(name, "replace") == 0) {
            int64_t cnt = -1;
            jv c;
            if (need_str(R, a0, "replace") < 0 || need_str(R, a1, "replace") < 0)
                return -1;
            if (arg(args, names, n, 2, NULL, &c) && need_int(R, c, "replace", &cnt) < 0)
                return -1;
            return str_replace(R, obj, a0, a1, cnt, out);
        }
        if (strcmp(name, "upper") == 0)
            return str_case(R, obj, CASE_UPPER, out);
        if (strcmp(name, "lower") == 0)
            return str_case(R, obj, CASE_LOWER, out);
        if (strcmp(name, "title") == 0)
            return str_case(R, obj, CASE_TITLE_PY, out);
        if (strcmp(name, "capitalize") == 0)
            return str_case(R, obj, CASE_CAPITALIZE, out);
        if (strcmp(name, "find") == 0 || strcmp(name, "rfind") == 0) {
            if (n > 1)
                return jj_fail(R, WK_ENOTSUP, "%s() with start/end arguments", name);
            return str_find(R, obj, a0, name[0] == 'r', out);
        }
        if (strcmp(name, "count") == 0) {
            if (need_str(R, a0, "count") < 0)
                return -1;
            if (n > 1)
                return jj_fail(R, WK_ENOTSUP, "count() with start/end arguments");
            int64_t c = 0;
            const char *p = obj.u.s.p;
            size_t len = obj.u.s.n, i = 0;
            if (a0.u.s.n == 0) {
                *out = jj_int((int64_t)jj_utf8_len(p, len) + 1);
                return 0;
            }
            const char *f;
            while ((f = mem_find(p + i, len - i, a0.u.s.p, a0.u.s.n)) != NULL) {
                c++;
                i = (size_t)(f - p) + a0.u.s.n;
            }
            *out = jj_int(c);
            return 0;
        }
        if (strcmp(name, "join") == 0) {
            jlist *l;
            if (jj_iter(R, a0, &l) < 0)
                return -1;
            for (size_t i = 0; i < l->n; i++)
                if (l->v[i].t != JV_STR)
                    return jj_fail(R, WK_EINVAL,
                                   "sequence item %zu: expected str instance, %s "
                                   "found",
                                   i, jj_type_name(l->v[i]));
            return join_values(R, l, obj, out);
        }
        if (strncmp(name, "is", 2) == 0) {
            const char *p = obj.u.s.p;
            size_t len = obj.u.s.n;
            bool ok = len > 0, cased = false;
            for (size_t i = 0; i < len; i++) {
                char c = p[i];
                if ((unsigned char)c >= 0x80)
                    return jj_fail(R, WK_ENOTSUP, "%s() on non-ASCII text", name);
                if (strcmp(name, "isdigit") == 0)
                    ok = ok && c >= '0' && c <= '9';
                else if (strcmp(name, "isalpha") == 0)
                    ok = ok && ascii_alpha(c);
                else if (strcmp(name, "isalnum") == 0)
                    ok = ok && ascii_alnum(c);
                else if (strcmp(name, "isspace") == 0)
                    ok = ok && jj_space_len(p + i, len - i) > 0;
                else if (ascii_alpha(c)) {
                    cased = true;
                    if ((strcmp(name, "islower") == 0) != (c >= 'a' && c <= 'z'))
                        ok = false;
                }
            }
            if (strcmp(name, "isupper") == 0 || strcmp(name, "islower") == 0)
                ok = cased && ok;
            *out = jj_bool(ok);
            return 0;
        }
        return jj_fail(R, WK_ENOTSUP, "str.%s() is not supported", name);
    }
    if (obj.t == JV_DICT) {
        jdict *d = obj.u.d;
        if (strcmp(name, "get") == 0) {
            if (!h0 || npos(names, n) > 2 || npos(names, n) != n)
                return jj_fail(R, WK_EINVAL, "get() takes 1 or 2 positional arguments");
            if (!jj_dict_getv(d, a0, out))
                *out = a1;
            return 0;
        }
        if (n > 0)
            return jj_fail(R, WK_EINVAL, "dict.%s() takes no arguments", name);
        if (strcmp(name, "items") == 0)
            return dict_items(R, d, 0, out);
        if (strcmp(name, "keys") == 0)
            return dict_items(R, d, 1, out);
        if (strcmp(name, "values") == 0)
            return dict_items(R, d, 2, out);
        if (strcmp(name, "copy") == 0) {
            jdict *c = jj_dict_new(R, d->n);
            if (c == NULL)
                return -1;
            if (d->n > 0) {
                memcpy(c->k, d->k, d->n * sizeof(jv));
                memcpy(c->v, d->v, d->n * sizeof(jv));
            }
            c->n = d->n;
            out->t = JV_DICT;
            out->u.d = c;
            return 0;
        }
        return jj_fail(R, WK_ENOTSUP, "dict.%s() is not supported", name);
    }
    if (obj.t == JV_LIST) {
        jlist *l = obj.u.l;
        if (strcmp(name, "count") == 0 || strcmp(name, "index") == 0) {
            int64_t c = 0;
            for (size_t i = 0; i < l->n; i++) {
                if (jj_eq(l->v[i], a0)) {
                    if (name[0] == 'i') {
                        *out = jj_int((int64_t)i);
                        return 0;
                    }
                    c++;
                }
            }
            if (name[0] == 'i')
                return jj_fail(R, WK_EINVAL, "list.index(x): x not in list");
            *out = jj_int(c);
            return 0;
        }
        if (strcmp(name, "copy") == 0) {
            jlist *c = jj_list_new(R, l->n);
            if (c == NULL)
                return -1;
            if (l->n > 0)
                memcpy(c->v, l->v, l->n * sizeof(jv));
            c->n = l->n;
            *out = list_value(c);
            return 0;
        }
    }
    return jj_fail(R, WK_ENOTSUP, "%s.%s() is not supported", jj_type_name(obj), name);
}

/* ---- filters ---- */

static int
join_values(jj_rt *R, jlist *l, jv sep, jv *out)
{
    jj_sb b = {0};
    for (size_t i = 0; i < l->n; i++) {
        if (i > 0 && jj_sb_put(R, &b, sep.u.s.p, sep.u.s.n) < 0)
            return -1;
        if (jj_to_str(R, l->v[i], &b) < 0)
            return -1;
    }
    *out = jj_sb_value(&b);
    return 0;
}

/* jinja2's make_attrgetter: "a.b.0" looked up item by item */
static int
attr_path(jj_rt *R, jv v, jv path, jv *out)
{
    if (path.t == JV_INT) {
        return jj_getitem(R, v, path, out);
    }
    if (need_str(R, path, "attribute") < 0)
        return -1;
    const char *p = path.u.s.p;
    size_t n = path.u.s.n, i = 0;
    while (i <= n) {
        size_t e = i;
        while (e < n && p[e] != '.')
            e++;
        jv key = jj_str(p + i, e - i);
        bool digits = e > i;
        for (size_t k = i; k < e; k++)
            if (p[k] < '0' || p[k] > '9')
                digits = false;
        if (digits)
            key = jj_int(strtoll(p + i, NULL, 10));
        if (jj_getitem(R, v, key, &v) < 0)
            return -1;
        i = e + 1;
    }
    *out = v;
    return 0;
}

/* select/reject/selectattr/rejectattr */
static int
select_items(jj_rt *R, jv in, jv *args, const char **names, size_t n, bool attr, bool keep, jv *out)
{
    jlist *l, *r;
    size_t first = 0;
    jv path = jj_none();
    if (names != NULL)
        for (size_t i = 0; i < n; i++)
            if (names[i] != NULL)
                return jj_fail(R, WK_EINVAL, "select filters take no keyword arguments");
    if (attr) {
        if (n < 1)
            return jj_fail(R, WK_EINVAL, "missing attribute for selectattr/rejectattr");
        path = args[0];
        first = 1;
    }
    int tid = -1;
    const char *tname = NULL;
    if (n > first) {
        if (need_str(R, args[first], "test name") < 0)
            return -1;
        char *tn = str_copy(R, args[first]);
        if (tn == NULL)
            return -1;
        tname = tn;
        tid = jj_test_id(tn);
        if (tid < 0)
            return jj_fail(R, WK_ENOTSUP, "no test named '%s'", tn);
    }
    if ((r = jj_list_new(R, 0)) == NULL)
        return -1;
    r->kind = JL_GEN;
    if (!jj_truthy(in)) { /* jinja2: "if value:" before iterating */
        *out = list_value(r);
        return 0;
    }
    if (jj_iter(R, in, &l) < 0)
        return -1;
    for (size_t i = 0; i < l->n; i++) {
        jv v = l->v[i];
        bool t;
        if (attr && attr_path(R, v, path, &v) < 0)
            return -1;
        if (tid < 0)
            t = jj_truthy(v);
        else if (jj_test(R, tid, tname, v, args + first + 1, n - first - 1, &t) < 0)
            return -1;
        if (t == keep && jj_list_push(R, r, l->v[i]) < 0)
            return -1;
    }
    *out = list_value(r);
    return jj_step(R, l->n);
}

/* sort key: v, or its attribute; lowercased when !case_sensitive */
static int
sort_key(jj_rt *R, jv v, jv attribute, bool cs, jv *out)
{
    if (attribute.t != JV_NONE && attr_path(R, v, attribute, &v) < 0)
        return -1;
    if (!cs && v.t == JV_STR)
        return str_case(R, v, CASE_LOWER, out);
    *out = v;
    return 0;
}

/* stable merge sort of items by keys */
static int
msort(jj_rt *R, jv *items, jv *keys, size_t n, jv *ti, jv *tk, bool rev)
{
    if (n < 2)
        return 0;
    size_t h = n / 2;
    if (msort(R, items, keys, h, ti, tk, rev) < 0 ||
        msort(R, items + h, keys + h, n - h, ti, tk, rev) < 0)
        return -1;
    size_t a = 0, b = h, o = 0;
    while (a < h || b < n) {
        bool take_b;
        if (a >= h) {
            take_b = true;
        } else if (b >= n) {
            take_b = false;
        } else {
            int c;
            if (order(R, keys[b], keys[a], &c, "<") < 0)
                return -1;
            take_b = rev ? c > 0 : c < 0;
        }
        size_t s = take_b ? b++ : a++;
        ti[o] = items[s];
        tk[o] = keys[s];
        o++;
    }
    memcpy(items, ti, n * sizeof *ti);
    memcpy(keys, tk, n * sizeof *tk);
    return jj_step(R, n);
}

static int
sort_list(jj_rt *R, jlist *l, jv attribute, bool cs, bool rev, jv *out)
{
    size_t n = l->n;
    jlist *r = jj_list_new(R, n);
    jv *keys = jj_alloc(&R->ar, (n + 1) * sizeof *keys);
    jv *ti = jj_alloc(&R->ar, (n + 1) * sizeof *ti);
    jv *tk = jj_alloc(&R->ar, (n + 1) * sizeof *tk);
    if (r == NULL || keys == NULL || ti == NULL || tk == NULL)
        return jj_oom(R);
    for (size_t i = 0; i < n; i++) {
        r->v[i] = l->v[i];
        if (sort_key(R, l->v[i], attribute, cs, &keys[i]) < 0)
            return -1;
    }
    r->n = n;
    if (msort(R, r->v, keys, n, ti, tk, rev) < 0)
        return -1;
    *out = list_value(r);
    return 0;
}

static int
filter_int(jv in, jv def, jv *out)
{
    switch (in.t) {
    case JV_INT:
        *out = in;
        return 0;
    case JV_BOOL:
        *out = jj_int(in.u.b);
        return 0;
    case JV_FLOAT:
        if (isfinite(in.u.f) && fabs(in.u.f) < 9.2e18) {
            *out = jj_int((int64_t)in.u.f);
            return 0;
        }
        break;
    case JV_STR: {
        char buf[80];
        size_t a = 0, b = in.u.s.n;
        const char *p = in.u.s.p;
        while (a < b && jj_space_len(p + a, b - a) > 0)
            a += jj_space_len(p + a, b - a);
        while (b > a && jj_space_len_back(p + a, b - a) > 0)
            b -= jj_space_len_back(p + a, b - a);
        if (b - a == 0 || b - a >= sizeof buf)
            break;
        size_t m = 0;
        for (size_t i = a; i < b; i++)
            if (p[i] != '_')
                buf[m++] = p[i];
        buf[m] = '\0';
        char *end;
        long long v = strtoll(buf, &end, 10);
        if (*end == '\0' && (buf[0] == '-' || buf[0] == '+' || (buf[0] >= '0' && buf[0] <= '9'))) {
            *out = jj_int(v);
            return 0;
        }
        double f = strtod(buf, &end);
        if (*end == '\0' && isfinite(f) && fabs(f) < 9.2e18 && !(buf[0] == 'i' || buf[0] == 'n')) {
            *out = jj_int((int64_t)f);
            return 0;
        }
        break;
    }
    default:
        break;
    }
    *out = def;
    return 0;
}

static int
filter_float(jj_rt *R, jv in, jv def, jv *out)
{
    (void)R;
    if (is_num(in)) {
        *out = float_value(num_f(in));
        return 0;
    }
    if (in.t == JV_STR && in.u.s.n > 0 && in.u.s.n < 80) {
        char buf[80], *end;
        memcpy(buf, in.u.s.p, in.u.s.n);
        buf[in.u.s.n] = '\0';
        double f = strtod(buf, &end);
        while (*end == ' ' || *end == '\t' || *end == '\n')
            end++;
        if (end != buf && *end == '\0') {
            *out = float_value(f);
            return 0;
        }
    }
    *out = def;
    return 0;
}

static int
filter_tojson(jj_rt *R, jv in, jv *args, const char **names, size_t n, jv *out)
{
    static const char *const kw[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    jv ea = jj_bool(false), ind = jj_none(), sep = jj_none(), sk = jj_bool(false);
    if (check_args(R, "tojson", names, n, 4, kw) < 0)
        return -1;
    arg(args, names, n, 0, "ensure_ascii", &ea);
    arg(args, names, n, 1, "indent", &ind);
    arg(args, names, n, 2, "separators", &sep);
    arg(args, names, n, 3, "sort_keys", &sk);
    jj_json_opt o = {.ensure_ascii = jj_truthy(ea), .sort_keys = jj_truthy(sk)};
    if (ind.t == JV_INT) {
        int64_t k = ind.u.i < 0 ? 0 : ind.u.i;
        if (k > 64)
            return jj_fail(R, WK_ENOTSUP, "tojson: indent over 64");
        char *sp = jj_alloc(&R->ar, (size_t)k + 1);
        if (sp == NULL)
            return jj_oom(R);
        memset(sp, ' ', (size_t)k);
        o.indent = sp;
        o.indent_n = (size_t)k;
    } else if (ind.t == JV_STR) {
        o.indent = ind.u.s.p;
        o.indent_n = ind.u.s.n;
    } else if (ind.t != JV_NONE) {
        return jj_fail(R, WK_ENOTSUP, "tojson: indent of type %s", jj_type_name(ind));
    }
    o.item_sep = o.indent != NULL ? "," : ", ";
    o.key_sep = ": ";
    if (sep.t != JV_NONE) {
        if (sep.t != JV_LIST || sep.u.l->n != 2 || sep.u.l->v[0].t != JV_STR ||
            sep.u.l->v[1].t != JV_STR)
            return jj_fail(R, WK_EINVAL, "tojson: separators must be two strings");
        char *a = str_copy(R, sep.u.l->v[0]), *b = str_copy(R, sep.u.l->v[1]);
        if (a == NULL || b == NULL)
            return -1;
        if (strlen(a) != sep.u.l->v[0].u.s.n || strlen(b) != sep.u.l->v[1].u.s.n)
            return jj_fail(R, WK_ENOTSUP, "tojson: a separator holding NUL");
        o.item_sep = a;
        o.key_sep = b;
    }
    jj_sb b = {0};
    if (jj_to_json(R, in, &o, &b, 0) < 0)
        return -1;
    *out = jj_sb_value(&b);
    return 0;
}

static int
filter_indent(jj_rt *R, jv in, jv *args, const char **names, size_t n, jv *out)
{
    static const char *const kw[] = {"width", "first", "blank", NULL};
    jv w = jj_int(4), first = jj_bool(false), blank = jj_bool(false), s = in;
    if (check_args(R, "indent", names, n, 3, kw) < 0)
        return -1;
    if (in.t != JV_STR) /* jinja2 does s += "\n" first: only a str gets through */
        return need_str(R, in, "indent");
    arg(args, names, n, 0, "width", &w);
    arg(args, names, n, 1, "first", &first);
    arg(args, names, n, 2, "blank", &blank);
    jv ind;
    if (w.t == JV_STR) {
        ind = w;
    } else {
        int64_t k = 0;
        if (need_int(R, w, "indent width", &k) < 0)
            return -1;
        if (k < 0)
            k = 0;
        if (k > 1024)
            return jj_fail(R, WK_ENOTSUP, "indent width over 1024");
        char *sp = jj_alloc(&R->ar, (size_t)k + 1);
        if (sp == NULL)
            return jj_oom(R);
        memset(sp, ' ', (size_t)k);
        ind = jj_str(sp, (size_t)k);
    }
    /* s += "\n"; lines = s.splitlines() */
    jj_sb t = {0};
    if (jj_sb_put(R, &t, s.u.s.p, s.u.s.n) < 0 || jj_sb_put(R, &t, "\n", 1) < 0)
        return -1;
    jv lv;
    if (str_splitlines(R, jj_sb_value(&t), &lv) < 0)
        return -1;
    jlist *lines = lv.u.l;
    jj_sb b = {0};
    if (jj_truthy(first) && jj_sb_put(R, &b, ind.u.s.p, ind.u.s.n) < 0)
        return -1;
    for (size_t i = 0; i < lines->n; i++) {
        jv line = lines->v[i];
        if (i > 0) {
            if (jj_sb_put(R, &b, "\n", 1) < 0)
                return -1;
            if ((jj_truthy(blank) || line.u.s.n > 0) && jj_sb_put(R, &b, ind.u.s.p, ind.u.s.n) < 0)
                return -1;
        }
        if (jj_sb_put(R, &b, line.u.s.p, line.u.s.n) < 0)
            return -1;
    }
    *out = jj_sb_value(&b);
    return 0;
}

/* markupsafe's escape(): & < > " ' as entities; Markup stays as it is */
static int
html_escape(jj_rt *R, jv s, jv *out)
{
    jj_sb b = {0};
    if (s.mk) {
        *out = s;
        return 0;
    }
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = s.u.s.p[i];
        const char *e = c == '&'    ? "&amp;"
                        : c == '<'  ? "&lt;"
                        : c == '>'  ? "&gt;"
                        : c == '"'  ? "&#34;"
                        : c == '\'' ? "&#39;"
                                    : NULL;
        if ((e != NULL ? jj_sb_puts(R, &b, e) : jj_sb_put(R, &b, &c, 1)) < 0)
            return -1;
    }
    *out = jj_sb_value(&b);
    out->mk = 1;
    return 0;
}

/* The result of a str method on s: Markup stays Markup (markupsafe wraps them). */
static int
keep_mk(jv s, int r, jv *out)
{
    if (r == 0 && s.mk && out->t == JV_STR)
        out->mk = 1;
    return r;
}

int
jj_filter(jj_rt *R, int id, const char *name, jv in, jv *args, const char **names, size_t n,
          jv *out)
{
    jv a0 = jj_none(), s;
    bool h0 = arg(args, names, n, 0, NULL, &a0);
    if (jj_step(R, 1) < 0)
        return -1;
    switch (id) {
    case F_ABS:
        if (in.t == JV_INT || in.t == JV_BOOL) {
            int64_t v = num_i(in);
            if (v == INT64_MIN)
                return jj_fail(R, WK_ENOTSUP, "integer overflow");
            *out = jj_int(v < 0 ? -v : v);
            return 0;
        }
        if (in.t == JV_FLOAT) {
            *out = float_value(fabs(in.u.f));
            return 0;
        }
        return jj_fail(R, WK_EINVAL, "bad operand type for abs(): '%s'", jj_type_name(in));
    case F_CAPITALIZE:
        return sv(R, in, &s) < 0 ? -1 : keep_mk(s, str_case(R, s, CASE_CAPITALIZE, out), out);
    case F_TITLE:
        return sv(R, in, &s) < 0 ? -1 : keep_mk(s, str_case(R, s, CASE_TITLE_JINJA, out), out);
    case F_UPPER:
        return sv(R, in, &s) < 0 ? -1 : keep_mk(s, str_case(R, s, CASE_UPPER, out), out);
    case F_LOWER:
        return sv(R, in, &s) < 0 ? -1 : keep_mk(s, str_case(R, s, CASE_LOWER, out), out);
    case F_COUNT:
    case F_LENGTH:
        switch (in.t) {
        case JV_STR:
            *out = jj_int((int64_t)jj_utf8_len(in.u.s.p, in.u.s.n));
            return 0;
        case JV_LIST:
            if (in.u.l->kind == JL_GEN || in.u.l->kind == JL_REVITER)
                return jj_fail(R, WK_EINVAL, "object of type '%s' has no len()", jj_type_name(in));
            *out = jj_int((int64_t)in.u.l->n);
            return 0;
        case JV_DICT:
            *out = jj_int((int64_t)in.u.d->n);
            return 0;
        case JV_UNDEF:
            *out = jj_int(0);
            return 0;
        default:
            return jj_fail(R, WK_EINVAL, "object of type '%s' has no len()", jj_type_name(in));
        }
    case F_D:
    case F_DEFAULT: {
        static const char *const kw[] = {"default_value", "boolean", NULL};
        jv def = jj_str("", 0), boolean = jj_bool(false);
        if (check_args(R, name, names, n, 2, kw) < 0)
            return -1;
        arg(args, names, n, 0, "default_value", &def);
        arg(args, names, n, 1, "boolean", &boolean);
        *out = in.t == JV_UNDEF || (jj_truthy(boolean) && !jj_truthy(in)) ? def : in;
        return 0;
    }
    case F_DICTSORT: {
        static const char *const kw[] = {"case_sensitive", "by", "reverse", NULL};
        jv cs = jj_bool(false), by = jj_str("key", 3), rev = jj_bool(false), items;
        if (check_args(R, name, names, n, 3, kw) < 0)
            return -1;
        arg(args, names, n, 0, "case_sensitive", &cs);
        arg(args, names, n, 1, "by", &by);
        arg(args, names, n, 2, "reverse", &rev);
        if (in.t != JV_DICT)
            return jj_fail(R, WK_EINVAL, "dictsort on a %s", jj_type_name(in));
        int pos = jj_is_str(by, "key") ? 0 : jj_is_str(by, "value") ? 1 : -1;
        if (pos < 0)
            return jj_fail(R, WK_EINVAL, "You can only sort by either \"key\" or \"value\"");
        if (dict_items(R, in.u.d, 0, &items) < 0)
            return -1;
        return sort_list(R, items.u.l, jj_int(pos), jj_truthy(cs), jj_truthy(rev), out);
    }
    case F_E:
    case F_ESCAPE:
        return sv(R, in, &s) < 0 ? -1 : html_escape(R, s, out);
    case F_FIRST:
    case F_LAST: {
        jlist *l;
        if (id == F_LAST && in.t == JV_LIST && in.u.l->kind == JL_GEN)
            return jj_fail(R, WK_EINVAL, "'generator' object is not reversible");
        if (id == F_LAST && in.t == JV_DICT)
            return jj_fail(R, WK_ENOTSUP, "last of a dict");
        if (jj_iter(R, in, &l) < 0)
            return -1;
        if (l->n == 0)
            *out = jj_undef(NULL);
        else
            *out = id == F_FIRST ? l->v[0] : l->v[l->n - 1];
        return 0;
    }
    case F_FLOAT:
        if (in.t == JV_UNDEF) /* float(Undefined) raises */
            return need_str(R, in, name);
        return filter_float(R, in, h0 ? a0 : float_value(0.0), out);
    case F_INT: {
        if (npos(names, n) > 1 ||
            (n > 0 && names != NULL && names[0] != NULL && strcmp(names[0], "default") != 0))
            return jj_fail(R, WK_ENOTSUP, "int filter with a base");
        jv def = jj_int(0);
        arg(args, names, n, 0, "default", &def);
        if (in.t == JV_UNDEF) /* int(Undefined) raises */
            return need_str(R, in, name);
        return filter_int(in, def, out);
    }
    case F_INDENT:
        return filter_indent(R, in, args, names, n, out);
    case F_ITEMS:
        if (in.t == JV_UNDEF) {
            jlist *l = jj_list_new(R, 0);
            if (l == NULL)
                return -1;
            *out = list_value(l);
            return 0;
        }
        if (in.t != JV_DICT)
            return jj_fail(R, WK_EINVAL, "Can only get item pairs from a mapping.");
        if (dict_items(R, in.u.d, 0, out) < 0)
            return -1;
        out->u.l->kind = JL_GEN;
        return 0;
    case F_JOIN: {
        static const char *const kw[] = {"d", "attribute", NULL};
        jv sep = jj_str("", 0), attr = jj_none();
        jlist *l;
        if (check_args(R, name, names, n, 2, kw) < 0)
            return -1;
        arg(args, names, n, 0, "d", &sep);
        arg(args, names, n, 1, "attribute", &attr);
        if (sv(R, sep, &sep) < 0 || jj_iter(R, in, &l) < 0)
            return -1;
        if (attr.t != JV_NONE) {
            jlist *m = jj_list_new(R, l->n);
            if (m == NULL)
                return -1;
            for (size_t i = 0; i < l->n; i++)
                if (attr_path(R, l->v[i], attr, &m->v[i]) < 0)
                    return -1;
            m->n = l->n;
            l = m;
        }
        return join_values(R, l, sep, out);
    }
    case F_LIST: {
        jlist *l, *c;
        if (jj_iter(R, in, &l) < 0 || (c = jj_list_new(R, l->n)) == NULL)
            return -1;
        if (l->n > 0)
            memcpy(c->v, l->v, l->n * sizeof(jv));
        c->n = l->n;
        *out = list_value(c);
        return 0;
    }
    case F_MAP: {
        jlist *l, *r;
        jv attr, def;
        bool has_def = arg(args, names, n, (size_t)-1, "default", &def);
        if (!jj_truthy(in)) { /* jinja2: "if value:" before iterating */
            if ((r = jj_list_new(R, 0)) == NULL)
                return -1;
            r->kind = JL_GEN;
            *out = list_value(r);
            return 0;
        }
        if (jj_iter(R, in, &l) < 0 || (r = jj_list_new(R, l->n)) == NULL)
            return -1;
        r->kind = JL_GEN;
        if (arg(args, names, n, (size_t)-1, "attribute", &attr)) {
            for (size_t i = 0; i < l->n; i++) {
                if (attr_path(R, l->v[i], attr, &r->v[i]) < 0)
                    return -1;
                if (has_def && r->v[i].t == JV_UNDEF)
                    r->v[i] = def;
            }
        } else {
            if (!h0 || need_str(R, a0, "map") < 0)
                return jj_fail(R, WK_EINVAL, "map: expected a filter name or attribute=");
            char *fname = str_copy(R, a0);
            if (fname == NULL)
                return -1;
            size_t skip = 0;
            while (skip < n && names != NULL && names[skip] != NULL)
                skip++;
            /* the filter's own arguments are the ones after its name */
            jv *fa = args + skip + 1;
            const char **fnames = names != NULL ? names + skip + 1 : NULL;
            size_t fn = n - skip - 1;
            int fid = jj_filter_id(fname);
            for (size_t i = 0; i < l->n; i++)
                if (jj_filter(R, fid, fname, l->v[i], fa, fnames, fn, &r->v[i]) < 0)
                    return -1;
        }
        r->n = l->n;
        *out = list_value(r);
        return 0;
    }
    case F_MAX:
    case F_MIN: {
        static const char *const kw[] = {"case_sensitive", "attribute", NULL};
        jv cs = jj_bool(false), attr = jj_none(), sorted;
        jlist *l;
        if (check_args(R, name, names, n, 2, kw) < 0)
            return -1;
        arg(args, names, n, 0, "case_sensitive", &cs);
        arg(args, names, n, 1, "attribute", &attr);
        if (jj_iter(R, in, &l) < 0)
            return -1;
        if (l->n == 0) {
            *out = jj_undef(NULL);
            return 0;
        }
        if (sort_list(R, l, attr, jj_truthy(cs), false, &sorted) < 0)
            return -1;
        /* Python's min/max return the first of equal extremes */
        jlist *sl = sorted.u.l;
        if (id == F_MIN) {
            *out = sl->v[0];
        } else {
            jv best = l->v[0], bk, k;
            if (sort_key(R, best, attr, jj_truthy(cs), &bk) < 0)
                return -1;
            for (size_t i = 1; i < l->n; i++) {
                int c;
                if (sort_key(R, l->v[i], attr, jj_truthy(cs), &k) < 0 ||
                    order(R, k, bk, &c, ">") < 0)
                    return -1;
                if (c > 0) {
                    best = l->v[i];
                    bk = k;
                }
            }
            *out = best;
        }
        return 0;
    }
    case F_REJECT:
        return select_items(R, in, args, names, n, false, false, out);
    case F_SELECT:
        return select_items(R, in, args, names, n, false, true, out);
    case F_REJECTATTR:
        return select_items(R, in, args, names, n, true, false, out);
    case F_SELECTATTR:
        return select_items(R, in, args, names, n, true, true, out);
    case F_REPLACE: {
        jv old, new, cnt;
        int64_t c = -1;
        if (sv(R, in, &s) < 0)
            return -1;
        if (!arg(args, names, n, 0, "old", &old) || !arg(args, names, n, 1, "new", &new))
            return jj_fail(R, WK_EINVAL, "replace: missing arguments");
        if (sv(R, old, &old) < 0 || sv(R, new, &new) < 0)
            return -1;
        if (arg(args, names, n, 2, "count", &cnt) && cnt.t != JV_NONE &&
            need_int(R, cnt, "replace count", &c) < 0)
            return -1;
        return str_replace(R, s, old, new, c, out);
    }
    case F_REVERSE:
        if (in.t == JV_STR) {
            jj_sb b = {0};
            const char *p = in.u.s.p;
            size_t e = in.u.s.n;
            while (e > 0) {
                size_t st = e - 1;
                while (st > 0 && ((unsigned char)p[st] & 0xc0) == 0x80 && e - st < 4)
                    st--;
                if (jj_utf8_next(p, e, st) != e)
                    st = e - 1;
                if (jj_sb_put(R, &b, p + st, e - st) < 0)
                    return -1;
                e = st;
            }
            *out = jj_sb_value(&b);
            return 0;
        } else {
            jlist *l, *r;
            bool gen = in.t == JV_LIST && (in.u.l->kind == JL_GEN || in.u.l->kind == JL_REVITER);
            if (in.t == JV_DICT)
                return jj_fail(R, WK_ENOTSUP, "reverse of a dict");
            if (jj_iter(R, in, &l) < 0 || (r = jj_list_new(R, l->n)) == NULL)
                return -1;
            for (size_t i = 0; i < l->n; i++)
                r->v[i] = l->v[l->n - 1 - i];
            r->n = l->n;
            r->kind = gen ? JL_PLAIN : JL_REVITER; /* reversed() where Python has it */
            *out = list_value(r);
            return 0;
        }
    case F_ROUND: {
        static const char *const kw[] = {"precision", "method", NULL};
        jv prec = jj_int(0), method = jj_str("common", 6);
        int64_t p = 0;
        if (check_args(R, name, names, n, 2, kw) < 0)
            return -1;
        arg(args, names, n, 0, "precision", &prec);
        arg(args, names, n, 1, "method", &method);
        if (need_int(R, prec, "round precision", &p) < 0)
            return -1;
        if (!is_num(in))
            return jj_fail(R, WK_EINVAL, "round of a %s", jj_type_name(in));
        if (!jj_is_str(method, "common"))
            return jj_fail(R, WK_ENOTSUP, "round with method other than 'common'");
        if (in.t != JV_FLOAT) {
            *out = in.t == JV_BOOL ? jj_int(in.u.b) : in;
            if (p < 0)
                return jj_fail(R, WK_ENOTSUP, "round of an int to negative precision");
            return 0;
        }
        if (p < 0 || p > 30)
            return jj_fail(R, WK_ENOTSUP, "round to precision %lld", (long long)p);
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)p, in.u.f);
        *out = float_value(strtod(buf, NULL));
        return 0;
    }
    case F_SAFE:
        if (sv(R, in, out) < 0)
            return -1;
        out->mk = 1;
        return 0;
    case F_STRING:
        if (sv(R, in, out) < 0)
            return -1;
        return 0;
    case F_SORT: {
        static const char *const kw[] = {"reverse", "case_sensitive", "attribute", NULL};
        jv rev = jj_bool(false), cs = jj_bool(false), attr = jj_none();
        jlist *l;
        if (check_args(R, name, names, n, 3, kw) < 0)
            return -1;
        arg(args, names, n, 0, "reverse", &rev);
        arg(args, names, n, 1, "case_sensitive", &cs);
        arg(args, names, n, 2, "attribute", &attr);
        if (jj_iter(R, in, &l) < 0)
            return -1;
        return sort_list(R, l, attr, jj_truthy(cs), jj_truthy(rev), out);
    }
    case F_SUM: {
        static const char *const kw[] = {"attribute", "start", NULL};
        jv attr = jj_none(), acc = jj_int(0);
        jlist *l;
        if (check_args(R, name, names, n, 2, kw) < 0)
            return -1;
        arg(args, names, n, 0, "attribute", &attr);
        arg(args, names, n, 1, "start", &acc);
        if (jj_iter(R, in, &l) < 0)
            return -1;
        for (size_t i = 0; i < l->n; i++) {
            jv v = l->v[i];
            if (attr.t != JV_NONE && attr_path(R, v, attr, &v) < 0)
                return -1;
            if (jj_binop(R, JJ_OP_ADD, acc, v, &acc) < 0)
                return -1;
        }
        *out = acc;
        return 0;
    }
    case F_TOJSON:
        return filter_tojson(R, in, args, names, n, out);
    case F_TRIM: {
        jv chars = jj_none();
        if (check_args(R, name, names, n, 1, (const char *const[]){"chars", NULL}) < 0 ||
            sv(R, in, &s) < 0)
            return -1;
        arg(args, names, n, 0, "chars", &chars);
        return keep_mk(s, str_strip(R, s, chars, 3, out), out);
    }
    case F_UNIQUE: {
        static const char *const kw[] = {"case_sensitive", "attribute", NULL};
        jv cs = jj_bool(false), attr = jj_none();
        jlist *l, *r, *seen;
        if (check_args(R, name, names, n, 2, kw) < 0)
            return -1;
        arg(args, names, n, 0, "case_sensitive", &cs);
        arg(args, names, n, 1, "attribute", &attr);
        if (jj_iter(R, in, &l) < 0 || (r = jj_list_new(R, 0)) == NULL ||
            (seen = jj_list_new(R, 0)) == NULL)
            return -1;
        for (size_t i = 0; i < l->n; i++) {
            jv k;
            bool dup = false;
            if (sort_key(R, l->v[i], attr, jj_truthy(cs), &k) < 0)
                return -1;
            if ((k.t == JV_LIST && !k.u.l->tuple) || k.t == JV_DICT || k.t == JV_NS)
                return jj_fail(R, WK_EINVAL, "unhashable type: '%s'", jj_type_name(k));
            if (jj_step(R, seen->n) < 0)
                return -1;
            for (size_t x = 0; x < seen->n && !dup; x++)
                dup = jj_eq(seen->v[x], k);
            if (!dup && (jj_list_push(R, seen, k) < 0 || jj_list_push(R, r, l->v[i]) < 0))
                return -1;
        }
        r->kind = JL_GEN;
        *out = list_value(r);
        return 0;
    }
    case F_WORDCOUNT: {
        int64_t c = 0;
        bool inw = false;
        if (sv(R, in, &s) < 0)
            return -1;
        for (size_t i = 0; i < s.u.s.n; i++) {
            char ch = s.u.s.p[i];
            bool w = ascii_alnum(ch) || ch == '_' || (unsigned char)ch >= 0x80;
            if (w && !inw)
                c++;
            inw = w;
        }
        *out = jj_int(c);
        return 0;
    }
    default:
        for (const char *const *f = FILTER_REFUSED; *f != NULL; f++)
            if (strcmp(*f, name) == 0)
                return jj_fail(R, WK_ENOTSUP, "filter '%s' is not supported", name);
        return jj_fail(R, WK_ENOTSUP, "no filter named '%s'", name);
    }
}

/* ---- global functions ---- */

int
jj_func(jj_rt *R, int fn, jv *args, const char **names, size_t n, jv *out)
{
    switch (fn) {
    case G_RANGE: {
        int64_t v[3] = {0, 0, 1};
        if (npos(names, n) != n || n < 1 || n > 3)
            return jj_fail(R, WK_EINVAL, "range expected 1 to 3 positional arguments");
        for (size_t i = 0; i < n; i++)
            if (need_int(R, args[i], "range", &v[n == 1 ? 1 : i]) < 0)
                return -1;
        if (v[2] == 0)
            return jj_fail(R, WK_EINVAL, "range() arg 3 must not be zero");
        jlist *l = jj_list_new(R, 0);
        if (l == NULL)
            return -1;
        for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) {
            if (l->n >= 100000) /* jinja2's sandbox MAX_RANGE */
                return jj_fail(R, WK_ETOOBIG,
                               "Range too big. The sandbox blocks ranges larger "
                               "than MAX_RANGE (100000).");
            if (jj_list_push(R, l, jj_int(i)) < 0 || jj_step(R, 1) < 0)
                return -1;
        }
        *out = list_value(l);
        return 0;
    }
    case G_NAMESPACE:
    case G_DICT: {
        jdict *d = jj_dict_new(R, n);
        if (d == NULL)
            return -1;
        for (size_t i = 0; i < n; i++) {
            if (names == NULL || names[i] == NULL) {
                if (i > 0 || args[i].t != JV_DICT)
                    return jj_fail(R, WK_ENOTSUP,
                                   "%s() with positional arguments other than "
                                   "one dict",
                                   GLOBAL_NAMES[fn]);
                jdict *src = args[i].u.d;
                for (size_t k = 0; k < src->n; k++)
                    if (jj_dict_set(R, d, src->k[k], src->v[k]) < 0)
                        return -1;
                continue;
            }
            if (jj_dict_set(R, d, jj_str(names[i], strlen(names[i])), args[i]) < 0)
                return -1;
        }
        out->t = fn == G_NAMESPACE ? JV_NS : JV_DICT;
        out->u.d = d;
        return 0;
    }
    case G_RAISE: {
        jv msg;
        if (n < 1)
            return jj_fail(R, WK_EINVAL, "raise_exception() missing its message");
        if (jj_strv(R, args[0], &msg) < 0)
            return -1;
        return jj_raise(R, msg.u.s.p, msg.u.s.n);
    }
    case G_STRFTIME: {
        if (n != 1 || args[0].t != JV_STR)
            return jj_fail(R, WK_EINVAL, "strftime_now(format) takes one string");
        time_t now = time(NULL);
        struct tm tm;
        jj_sb b = {0};
        if (localtime_r(&now, &tm) == NULL)
            return jj_fail(R, WK_EINVAL, "strftime_now: no local time");
        const char *f = args[0].u.s.p;
        for (size_t i = 0; i < args[0].u.s.n; i++) {
            char tmp[128];
            size_t k = 0;
            if (f[i] != '%' || i + 1 >= args[0].u.s.n) {
                if (jj_sb_put(R, &b, f + i, 1) < 0)
                    return -1;
                continue;
            }
            /* one literal format per conversion: the C library's text, as Python's */
            switch (f[++i]) {
            case 'a':
                k = strftime(tmp, sizeof tmp, "%a", &tm);
                break;
            case 'A':
                k = strftime(tmp, sizeof tmp, "%A", &tm);
                break;
            case 'b':
                k = strftime(tmp, sizeof tmp, "%b", &tm);
                break;
            case 'B':
                k = strftime(tmp, sizeof tmp, "%B", &tm);
                break;
            case 'd':
                k = strftime(tmp, sizeof tmp, "%d", &tm);
                break;
            case 'e':
                k = strftime(tmp, sizeof tmp, "%e", &tm);
                break;
            case 'H':
                k = strftime(tmp, sizeof tmp, "%H", &tm);
                break;
            case 'I':
                k = strftime(tmp, sizeof tmp, "%I", &tm);
                break;
            case 'j':
                k = strftime(tmp, sizeof tmp, "%j", &tm);
                break;
            case 'm':
                k = strftime(tmp, sizeof tmp, "%m", &tm);
                break;
            case 'M':
                k = strftime(tmp, sizeof tmp, "%M", &tm);
                break;
            case 'p':
                k = strftime(tmp, sizeof tmp, "%p", &tm);
                break;
            case 'S':
                k = strftime(tmp, sizeof tmp, "%S", &tm);
                break;
            case 'y':
                k = (size_t)snprintf(tmp, sizeof tmp, "%02d", (tm.tm_year + 1900) % 100);
                break;
            case 'Y':
                k = strftime(tmp, sizeof tmp, "%Y", &tm);
                break;
            case 'Z':
                k = strftime(tmp, sizeof tmp, "%Z", &tm);
                break;
            case 'z':
                k = strftime(tmp, sizeof tmp, "%z", &tm);
                break;
            case '%':
                k = strftime(tmp, sizeof tmp, "%%", &tm);
                break;
            default:
                return jj_fail(R, WK_ENOTSUP, "strftime_now: conversion '%%%c'", f[i]);
            }
            if (jj_sb_put(R, &b, tmp, k) < 0)
                return -1;
        }
        *out = jj_sb_value(&b);
        return 0;
    }
    default:
        return jj_fail(R, WK_ENOTSUP, "global '%s' is not supported", GLOBAL_NAMES[fn]);
    }
}
