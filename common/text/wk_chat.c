/*
 * wk_chat: message cleaning, the World chat template and stop-string
 * scanning. The exact prompt format is documented in wk_chat.h; changing a
 * byte of it changes every rendered prompt and so every stored session's
 * token digest, so it must never change silently. No globals, no logging.
 */
#include "wk_chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/*
 * Length of the whitespace character (per Python's str.isspace) starting at
 * s with n bytes available, or 0 if s doesn't start with one.
 */
static size_t
chat_ws_len(const unsigned char *s, size_t n)
{
    if (n == 0)
        return 0;
    if ((s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x20))
        return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0))
        return 2; /* U+0085, U+00A0 */
    if (n < 3)
        return 0;
    if (s[0] == 0xe1 && s[1] == 0x9a && s[2] == 0x80)
        return 3; /* U+1680 */
    if (s[0] == 0xe2 && s[1] == 0x80 &&
        ((s[2] >= 0x80 && s[2] <= 0x8a) || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
        return 3; /* U+2000..U+200A, U+2028, U+2029, U+202F */
    if (s[0] == 0xe2 && s[1] == 0x81 && s[2] == 0x9f)
        return 3; /* U+205F */
    if (s[0] == 0xe3 && s[1] == 0x80 && s[2] == 0x80)
        return 3; /* U+3000 */
    return 0;
}

/* Length of a whitespace character ending exactly at s + n, or 0. */
static size_t
chat_ws_len_back(const unsigned char *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        if (chat_ws_len(s + n - k, k) == k)
            return k;
    }
    return 0;
}

void
wk_chat_strip(const char *s, size_t len, size_t *off, size_t *n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = len, k;

    while (a < b && (k = chat_ws_len(u + a, b - a)) > 0)
        a += k;
    while (b > a && (k = chat_ws_len_back(u + a, b - a)) > 0)
        b -= k;
    *off = a;
    *n = b - a;
}

wk_err
wk_chat_clean(const char *in, size_t len, char **out)
{
    const unsigned char *s = (const unsigned char *)in;
    unsigned char *buf;
    size_t o = 0, a, n;

    if (len == SIZE_MAX)
        return WK_ENOMEM;
    buf = malloc(len + 1);
    if (buf == NULL)
        return WK_ENOMEM;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = s[i];
        if (c == '\0')
            continue;
        if (c == '\r') {
            c = '\n';
            if (i + 1 < len && s[i + 1] == '\n')
                i++;
        }
        if (c == '\n' && o > 0 && buf[o - 1] == '\n')
            continue;
        buf[o++] = c;
    }
    wk_chat_strip((const char *)buf, o, &a, &n);
    memmove(buf, buf + a, n);
    buf[n] = '\0';
    *out = (char *)buf;
    return WK_OK;
}

/* A growable output string. */
typedef struct chat_buf {
    char *p;    /* bytes, NUL-terminated when returned */
    size_t len; /* bytes used */
    size_t cap; /* bytes allocated */
} chat_buf;

static wk_err
chat_buf_put(chat_buf *b, const char *s, size_t n)
{
    if (n > SIZE_MAX - b->len - 1)
        return WK_ENOMEM;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n + 1)
            nc = nc > SIZE_MAX / 2 ? b->len + n + 1 : nc * 2;
        char *np = realloc(b->p, nc);
        if (np == NULL)
            return WK_ENOMEM;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return WK_OK;
}

/* The template prefix for role, or NULL for an unknown role. */
static const char *
chat_role_prefix(const char *role)
{
    if (strcmp(role, "system") == 0)
        return "System: ";
    if (strcmp(role, "user") == 0)
        return "User: ";
    if (strcmp(role, "assistant") == 0)
        return "Assistant: ";
    return NULL;
}

wk_err
wk_chat_render(const wk_chat_msg *msgs, size_t n, bool add_generation_prompt, char **out,
               size_t *len, wk_diag *d)
{
    return wk_chat_render_spans(msgs, n, add_generation_prompt, out, len, NULL, d);
}

wk_err
wk_chat_render_spans(const wk_chat_msg *msgs, size_t n, bool add_generation_prompt, char **out,
                     size_t *len, wk_chat_span *spans, wk_diag *d)
{
    chat_buf b = {0};
    wk_err err = WK_OK;

    for (size_t i = 0; i < n; i++) {
        const char *prefix = msgs[i].role ? chat_role_prefix(msgs[i].role) : NULL;
        if (prefix == NULL) {
            free(b.p);
            if (msgs[i].role == NULL)
                return wk_diag_set(d, WK_EINVAL, "message %zu: missing role", i);
            return wk_diag_set(d, WK_EINVAL,
                               "message %zu: unknown role '%.64s' (expected system, user or "
                               "assistant)",
                               i, msgs[i].role);
        }
    }
    for (size_t i = 0; i < n && err == WK_OK; i++) {
        const char *content = msgs[i].content ? msgs[i].content : "";
        size_t clen = msgs[i].content_len ? msgs[i].content_len : strlen(content);
        char *clean = NULL;
        const char *prefix = chat_role_prefix(msgs[i].role);

        if ((err = wk_chat_clean(content, clen, &clean)) != WK_OK)
            break;
        if (spans != NULL)
            spans[i].start = b.len;
        err = chat_buf_put(&b, prefix, strlen(prefix));
        if (spans != NULL)
            spans[i].content = b.len;
        if (err == WK_OK)
            err = chat_buf_put(&b, clean, strlen(clean));
        if (spans != NULL)
            spans[i].content_end = b.len;
        if (err == WK_OK)
            err = chat_buf_put(&b, "\n\n", 2);
        if (spans != NULL)
            spans[i].end = b.len;
        free(clean);
    }
    if (err == WK_OK && add_generation_prompt)
        err = chat_buf_put(&b, "Assistant:", 10);
    if (err == WK_OK && b.p == NULL)
        err = chat_buf_put(&b, "", 0);
    if (err != WK_OK) {
        free(b.p);
        return wk_diag_set(d, err, "chat render: out of memory");
    }
    *out = b.p;
    *len = b.len;
    return WK_OK;
}

void
wk_chat_stop_scan(const char *text, size_t len, const char *const *stops, size_t n_stops,
                  wk_chat_stop *r)
{
    static const char *const defaults[] = {WK_CHAT_STOP_DEFAULT};
    size_t best = SIZE_MAX, best_k = 0, hold = 0;

    if (n_stops == 0) {
        stops = defaults;
        n_stops = 1;
    }
    for (size_t k = 0; k < n_stops; k++) {
        size_t sl = stops[k] ? strlen(stops[k]) : 0;
        if (sl == 0 || sl > len)
            continue;
        const char *p = memmem(text, len, stops[k], sl);
        if (p != NULL && (size_t)(p - text) < best) {
            best = (size_t)(p - text);
            best_k = k;
        }
    }
    if (best != SIZE_MAX) {
        r->found = true;
        r->stop_index = best_k;
        r->match_pos = best;
        r->safe_len = best;
        return;
    }
    for (size_t k = 0; k < n_stops; k++) {
        size_t sl = stops[k] ? strlen(stops[k]) : 0;
        size_t m = sl > 0 ? sl - 1 : 0;
        if (m > len)
            m = len;
        for (; m > hold; m--) {
            if (memcmp(text + len - m, stops[k], m) == 0) {
                hold = m;
                break;
            }
        }
    }
    r->found = false;
    r->stop_index = 0;
    r->match_pos = 0;
    r->safe_len = len - hold;
}

void
wk_chat_think_init(wk_chat_think *t, const char *open, const char *close, bool in_think)
{
    memset(t, 0, sizeof(*t));
    t->open = open;
    t->close = close;
    t->in_think = in_think;
}

/* The last occurrence of needle in text (len bytes): its offset + 1, or 0 when none. */
static size_t
wk_chat_last_of(const char *text, size_t len, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = len >= n ? len - n + 1 : 0; i-- > 0;)
        if (memcmp(text + i, needle, n) == 0)
            return i + 1;
    return 0;
}

bool
wk_chat_think_open_at_end(const char *text, size_t len, const char *open, const char *close)
{
    size_t o = wk_chat_last_of(text, len, open);
    return o > 0 && o > wk_chat_last_of(text, len, close);
}

wk_err
wk_chat_think_feed(wk_chat_think *t, const char *text, size_t len, bool final, char **reason,
                   size_t *reason_len, char **content, size_t *content_len)
{
    size_t n = t->n_held + len;
    char *buf = malloc(n + 1), *rs = malloc(n + 1), *cs = malloc(n + 1);
    if (buf == NULL || rs == NULL || cs == NULL) {
        free(buf);
        free(rs);
        free(cs);
        return WK_ENOMEM;
    }
    memcpy(buf, t->held, t->n_held);
    if (len)
        memcpy(buf + t->n_held, text, len);
    size_t nr = 0, nc = 0, i = 0, keep = n;
    bool in = t->in_think;
    while (i < n) {
        const char *m = in ? t->close : t->open;
        size_t ml = strlen(m), avail = n - i;
        if (avail >= ml && memcmp(buf + i, m, ml) == 0) {
            in = !in;
            i += ml;
            continue;
        }
        if (!final && avail < ml && memcmp(buf + i, m, avail) == 0) {
            keep = i; /* may begin the marker: wait for more text */
            break;
        }
        if (in)
            rs[nr++] = buf[i];
        else
            cs[nc++] = buf[i];
        i++;
    }
    t->n_held = keep < n ? n - keep : 0;
    if (t->n_held)
        memcpy(t->held, buf + keep, t->n_held);
    t->in_think = in;
    free(buf);
    rs[nr] = '\0';
    cs[nc] = '\0';
    *reason = rs;
    *reason_len = nr;
    *content = cs;
    *content_len = nc;
    return WK_OK;
}
