/*
 * wk_toolcall: tool-call formats, their detection in a template's source, and
 * the streaming parser of a reply into content and calls (wk_toolcall.h has
 * the exact bytes of each format and the rules the parser follows).
 *
 * The parser has two states. In text it looks for the format's open marker,
 * holding back bytes that may begin it and the trailing whitespace that may
 * turn out to separate content from a call. In a call it buffers the body
 * until the close marker, then parses it whole: a valid call is returned,
 * anything else goes out as content with its markers.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wk_toolcall.h"
#include "wk_utf8.h"

/* A growable byte buffer (always NUL-terminated when non-NULL). */
typedef struct tc_buf {
    char *p;
    size_t n, cap;
} tc_buf;

static wk_err
tc_buf_add(tc_buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (q == NULL)
            return WK_ENOMEM;
        b->p = q;
        b->cap = cap;
    }
    if (n > 0)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return WK_OK;
}

static void
tc_buf_cut(tc_buf *b, size_t off) /* drops the first off bytes */
{
    memmove(b->p, b->p + off, b->n - off);
    b->n -= off;
    b->p[b->n] = '\0';
}

struct wk_toolcall_parser {
    wk_toolcall_fmt fmt;
    const json_t *tools; /* borrowed: the request's tools (maybe NULL) */
    const char *open, *close;
    size_t open_len, close_len;
    bool in_call;    /* between a call's markers */
    tc_buf pend;     /* text: bytes not yet settled (may begin the open marker) */
    tc_buf body;     /* call: the body so far */
    size_t scanned;  /* call: body bytes already searched for the close marker */
    tc_buf ws;       /* whitespace held after content: kept or dropped by what follows */
    bool after_call; /* the last thing settled was a call: its trailing whitespace drops */
    size_t n_calls;  /* calls completed so far */
    /* eager: the incremental parse of the call being read (XML) */
    bool eager;
    size_t e_pos;       /* body bytes it consumed */
    int e_state;        /* 0 before "<function=", 1 in the parameters, 2 done, 3 gave up */
    bool e_begun;       /* the call's first delta was reported */
    size_t e_nargs;     /* arguments reported */
    const json_t *e_fn; /* the offered function (NULL: any) */
    json_t *e_seen;     /* keys reported */
    /* the current feed's output */
    tc_buf out;
    wk_toolcall_call *calls;
    size_t n_out_calls, cap_calls;
    wk_toolcall_delta *deltas;
    size_t n_deltas, cap_deltas;
    bool aborted;
};

wk_toolcall_fmt
wk_toolcall_fmt_detect(const char *src)
{
    if (src == NULL)
        return WK_TOOLCALL_FMT_NONE;
    if (strstr(src, "<function=") != NULL && strstr(src, "<parameter=") != NULL)
        return WK_TOOLCALL_FMT_XML;
    if (strstr(src, "<TOOLCALL>") != NULL)
        return WK_TOOLCALL_FMT_NEMOTRON;
    /* (other <tool_call> forms, GLM's "<tool_call>NAME<arg_key>...", are none of these) */
    if (strstr(src, "<tool_call>") != NULL &&
        (strstr(src, "\"name\": \"") != NULL || strstr(src, "\\\"name\\\": \\\"") != NULL))
        return strstr(src, "<|start_of_role|>") != NULL ? WK_TOOLCALL_FMT_GRANITE
                                                       : WK_TOOLCALL_FMT_HERMES;
    return WK_TOOLCALL_FMT_NONE;
}

const char *
wk_toolcall_fmt_name(wk_toolcall_fmt fmt)
{
    switch (fmt) {
    case WK_TOOLCALL_FMT_XML:
        return "xml";
    case WK_TOOLCALL_FMT_HERMES:
        return "hermes";
    case WK_TOOLCALL_FMT_GRANITE:
        return "granite";
    case WK_TOOLCALL_FMT_NEMOTRON:
        return "nemotron";
    default:
        return "none";
    }
}

bool
wk_toolcall_tpl_object_args(const char *src)
{
    if (src == NULL)
        return false;
    static const char *const pats[] = {"arguments|items", "arguments | items",
                                       "arguments.items()", "arguments|dictsort",
                                       "arguments | dictsort"};
    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++)
        if (strstr(src, pats[i]) != NULL)
            return true;
    return false;
}

static bool
tc_utf8_ok(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t k = wk_utf8_dec((const uint8_t *)s + i, n - i, NULL);
        if (k == 0)
            return false;
        i += k;
    }
    return true;
}

wk_err
wk_toolcall_json_str(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (!tc_utf8_ok(s, n))
        return WK_EINVAL;
    tc_buf b = {.p = *buf, .n = *len, .cap = *cap};
    wk_err err = tc_buf_add(&b, "\"", 1);
    size_t run = 0; /* start of the bytes copied as they are */
    for (size_t i = 0; err == WK_OK && i <= n; i++) {
        unsigned char c = i < n ? (unsigned char)s[i] : 0;
        if (i < n && c >= 0x20 && c != '"' && c != '\\')
            continue;
        err = tc_buf_add(&b, s + run, i - run);
        run = i + 1;
        if (err != WK_OK || i == n)
            break;
        char esc[8];
        const char *e = esc;
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            esc[0] = '\\', esc[1] = 'u', esc[2] = '0', esc[3] = '0';
            esc[4] = "0123456789abcdef"[c >> 4], esc[5] = "0123456789abcdef"[c & 15];
            esc[6] = '\0';
        }
        err = tc_buf_add(&b, e, strlen(e));
    }
    if (err == WK_OK)
        err = tc_buf_add(&b, "\"", 1);
    *buf = b.p;
    *len = b.n;
    *cap = b.cap;
    return err;
}

wk_err
wk_toolcall_parser_new(wk_toolcall_fmt fmt, const json_t *tools, wk_toolcall_parser **out)
{
    const char *open, *close;
    switch (fmt) {
    case WK_TOOLCALL_FMT_XML:
    case WK_TOOLCALL_FMT_HERMES:
    case WK_TOOLCALL_FMT_GRANITE:
        open = "<tool_call>";
        close = "</tool_call>";
        break;
    case WK_TOOLCALL_FMT_NEMOTRON:
        open = "<TOOLCALL>";
        close = "</TOOLCALL>";
        break;
    default:
        return WK_EINVAL;
    }
    wk_toolcall_parser *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return WK_ENOMEM;
    p->fmt = fmt;
    p->tools = json_is_array(tools) ? tools : NULL;
    p->open = open;
    p->close = close;
    p->open_len = strlen(open);
    p->close_len = strlen(close);
    *out = p;
    return WK_OK;
}

wk_err
wk_toolcall_parser_new_eager(wk_toolcall_fmt fmt, const json_t *tools, wk_toolcall_parser **out)
{
    wk_err err = wk_toolcall_parser_new(fmt, tools, out);
    if (err == WK_OK)
        (*out)->eager = true;
    return err;
}

static void
tc_deltas_free(wk_toolcall_delta *d, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(d[i].name);
        free(d[i].arguments);
    }
    free(d);
}

void
wk_toolcall_parser_free(wk_toolcall_parser *p)
{
    if (p == NULL)
        return;
    tc_deltas_free(p->deltas, p->n_deltas);
    json_decref(p->e_seen);
    free(p->pend.p);
    free(p->body.p);
    free(p->ws.p);
    free(p->out.p);
    for (size_t i = 0; i < p->n_out_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    free(p);
}

size_t
wk_toolcall_count(const wk_toolcall_parser *p)
{
    return p->n_calls;
}

void
wk_toolcall_out_fini(wk_toolcall_out *out)
{
    if (out == NULL)
        return;
    free(out->content);
    for (size_t i = 0; i < out->n_calls; i++) {
        free(out->calls[i].name);
        free(out->calls[i].arguments);
    }
    free(out->calls);
    tc_deltas_free(out->deltas, out->n_deltas);
    memset(out, 0, sizeof(*out));
}

static bool
tc_is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

/*
 * Settles content bytes: whitespace right after a call is dropped, trailing
 * whitespace is held until what follows says whether it separates a call.
 */
static wk_err
tc_content(wk_toolcall_parser *p, const char *s, size_t n)
{
    size_t i = 0;
    if (p->after_call)
        while (i < n && tc_is_ws(s[i]))
            i++;
    size_t last = n; /* one past the last non-whitespace byte */
    while (last > i && tc_is_ws(s[last - 1]))
        last--;
    if (last == i) /* whitespace only: held */
        return p->after_call ? WK_OK : tc_buf_add(&p->ws, s + i, n - i);
    wk_err err = tc_buf_add(&p->out, p->ws.p, p->ws.n);
    p->ws.n = 0;
    p->after_call = false;
    if (err == WK_OK)
        err = tc_buf_add(&p->out, s + i, last - i);
    if (err == WK_OK)
        err = tc_buf_add(&p->ws, s + last, n - last);
    return err;
}

static wk_err
tc_add_call(wk_toolcall_parser *p, char *name, char *args)
{
    if (p->n_out_calls == p->cap_calls) {
        size_t cap = p->cap_calls ? 2 * p->cap_calls : 4;
        wk_toolcall_call *q = realloc(p->calls, cap * sizeof(*q));
        if (q == NULL) {
            free(name);
            free(args);
            return WK_ENOMEM;
        }
        p->calls = q;
        p->cap_calls = cap;
    }
    p->calls[p->n_out_calls++] = (wk_toolcall_call){.name = name, .arguments = args};
    return WK_OK;
}

/* The function object of tool name (n bytes) in the tools; NULL when not offered. */
static const json_t *
tc_tool(const wk_toolcall_parser *p, const char *name, size_t n)
{
    size_t i;
    const json_t *t;
    json_array_foreach(p->tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        if (!json_is_object(f))
            f = t;
        const json_t *nm = json_object_get(f, "name");
        if (json_is_string(nm) && json_string_length(nm) == n &&
            memcmp(json_string_value(nm), name, n) == 0)
            return f;
    }
    return NULL;
}

/* Whether the call's function name is acceptable: offered (when tools are), non-empty. */
static bool
tc_name_ok(const wk_toolcall_parser *p, const char *name, size_t n, const json_t **fn)
{
    *fn = NULL;
    if (n == 0 || !tc_utf8_ok(name, n) || memchr(name, '\0', n) != NULL)
        return false;
    if (p->tools == NULL || json_array_size(p->tools) == 0)
        return true;
    *fn = tc_tool(p, name, n);
    return *fn != NULL;
}

static char *
tc_strndup(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d != NULL) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static bool
tc_has_type(const json_t *types, const char *t)
{
    if (json_is_string(types))
        return strcmp(json_string_value(types), t) == 0;
    size_t i;
    const json_t *e;
    json_array_foreach(types, i, e) if (json_is_string(e) && strcmp(json_string_value(e), t) == 0)
        return true;
    return false;
}

/*
 * The JSON text of an XML parameter value v (n bytes) typed by the schema's
 * types (NULL: untyped): written to b. WK_EINVAL when v is not UTF-8.
 */
static wk_err
tc_xml_value(tc_buf *b, const json_t *types, const char *v, size_t n)
{
    static const char *const order[] = {"null", "boolean", "integer", "number", "object", "array"};
    for (size_t k = 0; types != NULL && k < sizeof(order) / sizeof(order[0]); k++) {
        if (!tc_has_type(types, order[k]))
            continue;
        const char *lit = NULL;
        if (k == 0 && ((n == 4 && memcmp(v, "null", 4) == 0) || (n == 4 && memcmp(v, "None", 4) == 0)))
            lit = "null";
        if (k == 1 && ((n == 4 && memcmp(v, "true", 4) == 0) || (n == 4 && memcmp(v, "True", 4) == 0)))
            lit = "true";
        if (k == 1 && ((n == 5 && memcmp(v, "false", 5) == 0) || (n == 5 && memcmp(v, "False", 5) == 0)))
            lit = "false";
        if (lit != NULL)
            return tc_buf_add(b, lit, strlen(lit));
        if (k < 2 || n == 0 || tc_is_ws(v[0]) || tc_is_ws(v[n - 1]))
            continue;
        json_error_t je;
        json_t *j = json_loadb(v, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
        bool ok = j != NULL && ((k == 2 && json_is_integer(j)) || (k == 3 && json_is_number(j)) ||
                                (k == 4 && json_is_object(j)) || (k == 5 && json_is_array(j)));
        json_decref(j);
        if (ok)
            return tc_buf_add(b, v, n);
    }
    return wk_toolcall_json_str(&b->p, &b->n, &b->cap, v, n);
}

static bool
tc_starts(const char *s, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    return n >= l && memcmp(s, lit, l) == 0;
}

/* Parses an XML call body; adds the call and returns WK_OK, or WK_EINVAL when malformed. */
static wk_err
tc_parse_xml(wk_toolcall_parser *p, const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && tc_is_ws(s[i]))
        i++;
    if (!tc_starts(s + i, n - i, "<function="))
        return WK_EINVAL;
    i += 10;
    size_t ns = i;
    while (i < n && s[i] != '>' && s[i] != '\n' && s[i] != '<')
        i++;
    if (i == n || s[i] != '>')
        return WK_EINVAL;
    const json_t *fn = NULL;
    if (!tc_name_ok(p, s + ns, i - ns, &fn))
        return WK_EINVAL;
    size_t ne = i++;
    const json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
    tc_buf a = {0};
    json_t *seen = json_object();
    wk_err err = seen != NULL ? tc_buf_add(&a, "{", 1) : WK_ENOMEM;
    size_t n_args = 0;
    for (;;) {
        if (err != WK_OK)
            break;
        while (i < n && tc_is_ws(s[i]))
            i++;
        if (tc_starts(s + i, n - i, "</function>")) {
            i += 11;
            break;
        }
        if (!tc_starts(s + i, n - i, "<parameter=")) {
            err = WK_EINVAL;
            break;
        }
        i += 11;
        size_t ks = i;
        while (i < n && s[i] != '>' && s[i] != '\n' && s[i] != '<')
            i++;
        if (i == n || s[i] != '>' || i == ks || !tc_utf8_ok(s + ks, i - ks) ||
            memchr(s + ks, '\0', i - ks) != NULL) {
            err = WK_EINVAL;
            break;
        }
        size_t ke = i++;
        const char *end = NULL;
        for (size_t j = i; j + 12 <= n; j++)
            if (memcmp(s + j, "</parameter>", 12) == 0) {
                end = s + j;
                break;
            }
        if (end == NULL) {
            err = WK_EINVAL;
            break;
        }
        const char *v = s + i;
        size_t vl = (size_t)(end - v);
        if (vl > 0 && v[0] == '\n')
            v++, vl--;
        if (vl > 0 && v[vl - 1] == '\n')
            vl--;
        i = (size_t)(end - s) + 12;
        char *key = tc_strndup(s + ks, ke - ks);
        if (key == NULL) {
            err = WK_ENOMEM;
            break;
        }
        if (json_object_get(seen, key) != NULL) { /* a key given twice */
            free(key);
            err = WK_EINVAL;
            break;
        }
        json_object_set_new(seen, key, json_true());
        const json_t *types = json_object_get(json_object_get(props, key), "type");
        free(key);
        if (n_args++ > 0)
            err = tc_buf_add(&a, ", ", 2);
        if (err == WK_OK)
            err = wk_toolcall_json_str(&a.p, &a.n, &a.cap, s + ks, ke - ks);
        if (err == WK_OK)
            err = tc_buf_add(&a, ": ", 2);
        if (err == WK_OK)
            err = tc_xml_value(&a, types, v, vl);
    }
    json_decref(seen);
    while (err == WK_OK && i < n && tc_is_ws(s[i]))
        i++;
    if (err == WK_OK && i != n)
        err = WK_EINVAL;
    if (err == WK_OK)
        err = tc_buf_add(&a, "}", 1);
    char *name = err == WK_OK ? tc_strndup(s + ns, ne - ns) : NULL;
    if (err == WK_OK && name == NULL)
        err = WK_ENOMEM;
    if (err != WK_OK) {
        free(a.p);
        return err;
    }
    return tc_add_call(p, name, a.p);
}

/* Raw JSON scanning over text jansson already accepted: skips one value at *i. */
static size_t
tc_js_ws(const char *s, size_t n, size_t i)
{
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t'))
        i++;
    return i;
}

static size_t
tc_js_skip(const char *s, size_t n, size_t i)
{
    if (i >= n)
        return n;
    if (s[i] == '"') {
        for (i++; i < n && s[i] != '"'; i++)
            if (s[i] == '\\')
                i++;
        return i < n ? i + 1 : n;
    }
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        for (; i < n; i++) {
            if (s[i] == '"') {
                i = tc_js_skip(s, n, i) - 1;
            } else if (s[i] == '{' || s[i] == '[') {
                depth++;
            } else if (s[i] == '}' || s[i] == ']') {
                if (--depth == 0)
                    return i + 1;
            }
        }
        return n;
    }
    while (i < n && s[i] != ',' && s[i] != '}' && s[i] != ']' && !tc_is_ws(s[i]))
        i++;
    return i;
}

/*
 * The raw span of the member "arguments" of the object at s[i] (text
 * jansson accepted); false when there is none spelled without escapes.
 */
static bool
tc_js_member(const char *s, size_t n, size_t i, const char *key, size_t *vs, size_t *ve)
{
    size_t kl = strlen(key);
    i = tc_js_ws(s, n, i);
    if (i >= n || s[i] != '{')
        return false;
    i++;
    for (;;) {
        i = tc_js_ws(s, n, i);
        if (i >= n || s[i] != '"')
            return false;
        size_t ks = i;
        i = tc_js_skip(s, n, i);
        bool hit = i - ks == kl + 2 && memcmp(s + ks + 1, key, kl) == 0;
        i = tc_js_ws(s, n, i);
        if (i >= n || s[i] != ':')
            return false;
        i = tc_js_ws(s, n, i + 1);
        size_t v0 = i;
        i = tc_js_skip(s, n, i);
        if (hit) {
            *vs = v0;
            *ve = i;
            return true;
        }
        i = tc_js_ws(s, n, i);
        if (i >= n || s[i] != ',')
            return false;
        i++;
    }
}

/*
 * One JSON call object (o, decoded; raw: its text s[i..]): adds the call, or
 * WK_EINVAL when it is not {"name": NAME, "arguments": OBJECT-or-string}.
 */
static wk_err
tc_json_call(wk_toolcall_parser *p, const json_t *o, const char *s, size_t n, size_t i)
{
    const json_t *nm = json_object_get(o, "name");
    const json_t *args = json_object_get(o, "arguments");
    const json_t *fn = NULL;
    if (!json_is_object(o) || !json_is_string(nm) ||
        !tc_name_ok(p, json_string_value(nm), json_string_length(nm), &fn))
        return WK_EINVAL;
    char *text = NULL;
    if (args == NULL) {
        text = strdup("{}");
    } else if (json_is_string(args)) {
        json_error_t je;
        json_t *j = json_loadb(json_string_value(args), json_string_length(args),
                               JSON_REJECT_DUPLICATES, &je);
        bool ok = json_is_object(j);
        json_decref(j);
        if (!ok)
            return WK_EINVAL;
        text = tc_strndup(json_string_value(args), json_string_length(args));
    } else if (json_is_object(args)) {
        size_t vs = 0, ve = 0;
        if (tc_js_member(s, n, i, "arguments", &vs, &ve))
            text = tc_strndup(s + vs, ve - vs);
        else /* (the key spelled with escapes: jansson's own text of the value) */
            text = json_dumps(args, JSON_ENCODE_ANY);
    } else {
        return WK_EINVAL;
    }
    char *name = tc_strndup(json_string_value(nm), json_string_length(nm));
    if (text == NULL || name == NULL) {
        free(text);
        free(name);
        return WK_ENOMEM;
    }
    return tc_add_call(p, name, text);
}

/* Parses a JSON-format body (an object; NEMOTRON: an array of them). */
static wk_err
tc_parse_json(wk_toolcall_parser *p, const char *s, size_t n)
{
    json_error_t je;
    json_t *j = json_loadb(s, n, JSON_REJECT_DUPLICATES, &je);
    if (j == NULL)
        return WK_EINVAL;
    size_t first = p->n_out_calls;
    wk_err err = WK_OK;
    size_t i = tc_js_ws(s, n, 0);
    if (p->fmt == WK_TOOLCALL_FMT_NEMOTRON) {
        if (!json_is_array(j) || json_array_size(j) == 0) {
            err = WK_EINVAL;
        } else {
            i++; /* '[' */
            for (size_t k = 0; err == WK_OK && k < json_array_size(j); k++) {
                i = tc_js_ws(s, n, i);
                err = tc_json_call(p, json_array_get(j, k), s, n, i);
                i = tc_js_ws(s, n, tc_js_skip(s, n, i)) + 1; /* past ',' */
            }
        }
    } else {
        err = tc_json_call(p, j, s, n, i);
    }
    json_decref(j);
    if (err != WK_OK) { /* (a block's calls come all or none) */
        while (p->n_out_calls > first) {
            p->n_out_calls--;
            free(p->calls[p->n_out_calls].name);
            free(p->calls[p->n_out_calls].arguments);
        }
    }
    return err;
}

static const char *
tc_find(const char *s, size_t n, const char *lit, size_t l)
{
    if (n < l)
        return NULL;
    for (size_t i = 0; i + l <= n; i++)
        if (s[i] == lit[0] && memcmp(s + i, lit, l) == 0)
            return s + i;
    return NULL;
}

/* Reports a delta (name: n bytes or NULL; args: m bytes). */
static wk_err
tc_add_delta(wk_toolcall_parser *p, size_t index, const char *name, size_t n, const char *args,
             size_t m)
{
    if (p->n_deltas == p->cap_deltas) {
        size_t cap = p->cap_deltas ? 2 * p->cap_deltas : 4;
        wk_toolcall_delta *q = realloc(p->deltas, cap * sizeof(*q));
        if (q == NULL)
            return WK_ENOMEM;
        p->deltas = q;
        p->cap_deltas = cap;
    }
    char *nm = name != NULL ? tc_strndup(name, n) : NULL;
    char *a = tc_strndup(args, m);
    if ((name != NULL && nm == NULL) || a == NULL) {
        free(nm);
        free(a);
        return WK_ENOMEM;
    }
    p->deltas[p->n_deltas++] = (wk_toolcall_delta){.index = index, .name = nm, .arguments = a};
    return WK_OK;
}

/* 1: s (n bytes) starts with lit; 0: s is a proper prefix of lit (wait); -1: neither. */
static int
tc_lit(const char *s, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    if (n >= l)
        return memcmp(s, lit, l) == 0 ? 1 : -1;
    return memcmp(s, lit, n) == 0 ? 0 : -1;
}

/*
 * Eager, XML: advances the incremental parse of the call being read over
 * its first n body bytes, reporting the name and each complete argument.
 * The same rules as tc_parse_xml(), so when that accepts the call the
 * deltas spell its arguments; stops (state 3) where it would refuse it.
 */
static wk_err
tc_eager_step(wk_toolcall_parser *p, size_t n)
{
    const char *s = p->body.p;
    size_t i = p->e_pos;
    wk_err err = WK_OK;
    while (err == WK_OK && p->e_state < 2) {
        while (i < n && tc_is_ws(s[i]))
            i++;
        if (i == n)
            break;
        if (p->e_state == 0) {
            int m = tc_lit(s + i, n - i, "<function=");
            if (m <= 0) {
                p->e_state = m < 0 ? 3 : p->e_state;
                break;
            }
            size_t ns = i + 10, j = ns;
            while (j < n && s[j] != '>' && s[j] != '\n' && s[j] != '<')
                j++;
            if (j == n)
                break; /* (the name goes on) */
            if (s[j] != '>' || !tc_name_ok(p, s + ns, j - ns, &p->e_fn)) {
                p->e_state = 3;
                break;
            }
            err = tc_add_delta(p, p->n_calls, s + ns, j - ns, "", 0);
            p->e_begun = true;
            p->e_state = 1;
            i = j + 1;
            continue;
        }
        int f = tc_lit(s + i, n - i, "</function>");
        if (f == 1) {
            err = tc_add_delta(p, p->n_calls, NULL, 0, p->e_nargs ? "}" : "{}", p->e_nargs ? 1 : 2);
            p->e_state = 2;
            i += 11;
            break;
        }
        int m = tc_lit(s + i, n - i, "<parameter=");
        if (m < 0 && f < 0) {
            p->e_state = 3;
            break;
        }
        if (m <= 0)
            break; /* (a prefix of either: wait) */
        size_t ks = i + 11, j = ks;
        while (j < n && s[j] != '>' && s[j] != '\n' && s[j] != '<')
            j++;
        if (j == n)
            break;
        if (s[j] != '>' || j == ks || !tc_utf8_ok(s + ks, j - ks) ||
            memchr(s + ks, '\0', j - ks) != NULL) {
            p->e_state = 3;
            break;
        }
        const char *end = tc_find(s + j + 1, n - j - 1, "</parameter>", 12);
        if (end == NULL)
            break; /* (the value goes on) */
        const char *v = s + j + 1;
        size_t vl = (size_t)(end - v);
        if (vl > 0 && v[0] == '\n')
            v++, vl--;
        if (vl > 0 && v[vl - 1] == '\n')
            vl--;
        char *key = tc_strndup(s + ks, j - ks);
        if (key == NULL || (p->e_seen == NULL && (p->e_seen = json_object()) == NULL)) {
            free(key);
            return WK_ENOMEM;
        }
        if (json_object_get(p->e_seen, key) != NULL) {
            free(key);
            p->e_state = 3;
            break;
        }
        json_object_set_new(p->e_seen, key, json_true());
        const json_t *props = json_object_get(json_object_get(p->e_fn, "parameters"), "properties");
        const json_t *types = json_object_get(json_object_get(props, key), "type");
        free(key);
        tc_buf a = {0};
        err = tc_buf_add(&a, p->e_nargs ? ", " : "{", p->e_nargs ? 2 : 1);
        if (err == WK_OK)
            err = wk_toolcall_json_str(&a.p, &a.n, &a.cap, s + ks, j - ks);
        if (err == WK_OK)
            err = tc_buf_add(&a, ": ", 2);
        if (err == WK_OK)
            err = tc_xml_value(&a, types, v, vl);
        if (err == WK_OK)
            err = tc_add_delta(p, p->n_calls, NULL, 0, a.p, a.n);
        free(a.p);
        if (err == WK_EINVAL) { /* (a value that is not UTF-8: the call is malformed) */
            p->e_state = 3;
            err = WK_OK;
            break;
        }
        p->e_nargs++;
        i = (size_t)(end - s) + 12;
    }
    p->e_pos = i;
    return err;
}

/* Starts the eager state of a new call. */
static void
tc_eager_reset(wk_toolcall_parser *p)
{
    p->e_pos = 0;
    p->e_state = 0;
    p->e_begun = false;
    p->e_nargs = 0;
    p->e_fn = NULL;
    if (p->e_seen != NULL)
        json_object_clear(p->e_seen);
}

/* A call's body ended (closed: the close marker followed). */
static wk_err
tc_call_end(wk_toolcall_parser *p, size_t body_len, bool closed)
{
    size_t before = p->n_out_calls;
    wk_err err = p->fmt == WK_TOOLCALL_FMT_XML ? tc_parse_xml(p, p->body.p, body_len)
                                               : tc_parse_json(p, p->body.p, body_len);
    if (err == WK_ENOMEM)
        return err;
    if (err == WK_OK) {
        for (size_t i = before; p->eager && p->fmt != WK_TOOLCALL_FMT_XML && i < p->n_out_calls;
             i++) {
            size_t index = p->n_calls + (i - before);
            const wk_toolcall_call *c = &p->calls[i];
            err = tc_add_delta(p, index, c->name, strlen(c->name), "", 0);
            if (err == WK_OK)
                err = tc_add_delta(p, index, NULL, 0, c->arguments, strlen(c->arguments));
            if (err != WK_OK)
                return err;
        }
        p->n_calls += p->n_out_calls - before;
        p->ws.n = 0; /* (whitespace before a call separates it) */
        p->after_call = true;
        return WK_OK;
    }
    if (p->eager && p->e_begun)
        p->aborted = true;
    /* malformed: the bytes are content, markers included */
    tc_buf raw = {0};
    err = tc_buf_add(&raw, p->open, p->open_len);
    if (err == WK_OK)
        err = tc_buf_add(&raw, p->body.p, body_len);
    if (err == WK_OK && closed)
        err = tc_buf_add(&raw, p->close, p->close_len);
    if (err == WK_OK)
        err = tc_content(p, raw.p, raw.n);
    free(raw.p);
    return err;
}


static wk_err
tc_run(wk_toolcall_parser *p, bool final)
{
    wk_err err = WK_OK;
    for (;;) {
        if (!p->in_call) {
            const char *hit = tc_find(p->pend.p, p->pend.n, p->open, p->open_len);
            if (hit != NULL) {
                size_t k = (size_t)(hit - p->pend.p);
                if ((err = tc_content(p, p->pend.p, k)) != WK_OK)
                    return err;
                p->body.n = 0;
                p->scanned = 0;
                if ((err = tc_buf_add(&p->body, hit + p->open_len,
                                      p->pend.n - k - p->open_len)) != WK_OK)
                    return err;
                p->pend.n = 0;
                p->in_call = true;
                tc_eager_reset(p);
                continue;
            }
            size_t keep = 0; /* longest suffix that is a proper prefix of the marker */
            for (size_t l = p->open_len - 1; !final && l > 0 && keep == 0; l--)
                if (p->pend.n >= l && memcmp(p->pend.p + p->pend.n - l, p->open, l) == 0)
                    keep = l;
            if ((err = tc_content(p, p->pend.p, p->pend.n - keep)) != WK_OK)
                return err;
            tc_buf_cut(&p->pend, p->pend.n - keep);
            break;
        }
        size_t from = p->scanned >= p->close_len ? p->scanned - p->close_len + 1 : 0;
        const char *hit = tc_find(p->body.p + from, p->body.n - from, p->close, p->close_len);
        if (hit != NULL) {
            size_t k = (size_t)(hit - p->body.p);
            if (p->eager && p->fmt == WK_TOOLCALL_FMT_XML && (err = tc_eager_step(p, k)) != WK_OK)
                return err;
            if ((err = tc_call_end(p, k, true)) != WK_OK)
                return err;
            p->in_call = false;
            p->pend.n = 0;
            if ((err = tc_buf_add(&p->pend, hit + p->close_len,
                                  p->body.n - k - p->close_len)) != WK_OK)
                return err;
            p->body.n = 0;
            continue;
        }
        p->scanned = p->body.n;
        if (p->eager && p->fmt == WK_TOOLCALL_FMT_XML) {
            /* (bytes that may begin the close marker are not the call's yet) */
            size_t keep = 0;
            for (size_t l = p->close_len - 1; !final && l > 0 && keep == 0; l--)
                if (p->body.n >= l && memcmp(p->body.p + p->body.n - l, p->close, l) == 0)
                    keep = l;
            if ((err = tc_eager_step(p, p->body.n - keep)) != WK_OK)
                return err;
        }
        if (final || p->body.n > WK_TOOLCALL_BODY_MAX) {
            /* never closed: a complete call without its end marker, else content */
            if ((err = tc_call_end(p, p->body.n, false)) != WK_OK)
                return err;
            p->in_call = false;
            p->body.n = 0;
            if (final)
                break;
            continue;
        }
        break;
    }
    if (final) {
        if (!p->after_call)
            err = tc_buf_add(&p->out, p->ws.p, p->ws.n);
        p->ws.n = 0;
    }
    return err;
}

wk_err
wk_toolcall_feed(wk_toolcall_parser *p, const char *text, size_t len, bool final,
                 wk_toolcall_out *out)
{
    p->out.n = 0;
    p->n_out_calls = 0;
    p->aborted = false;
    wk_err err = tc_buf_add(p->in_call ? &p->body : &p->pend, text, len);
    if (err == WK_OK)
        err = tc_buf_add(&p->out, "", 0);
    if (err == WK_OK)
        err = tc_run(p, final);
    if (err != WK_OK)
        return err;
    char *c = tc_strndup(p->out.p, p->out.n);
    if (c == NULL)
        return WK_ENOMEM;
    out->content = c;
    out->content_len = p->out.n;
    out->calls = p->n_out_calls > 0 ? p->calls : NULL;
    out->n_calls = p->n_out_calls;
    if (p->n_out_calls > 0) { /* (handed over: the parser starts a new array) */
        p->calls = NULL;
        p->cap_calls = 0;
        p->n_out_calls = 0;
    }
    out->deltas = p->n_deltas > 0 ? p->deltas : NULL;
    out->n_deltas = p->n_deltas;
    out->aborted = p->aborted;
    if (p->n_deltas > 0) {
        p->deltas = NULL;
        p->cap_deltas = 0;
        p->n_deltas = 0;
    }
    return WK_OK;
}
