/*
 * ctl_ssefmt: the template split and a JSON string escaper that agrees
 * with jansson byte for byte on well-formed UTF-8 and refuses what jansson
 * refuses (overlong forms, surrogates, code points above U+10FFFF, stray or
 * missing continuation bytes). tests/unit/test_ctl_ssefmt.c compares the
 * two on random byte strings.
 */
#include "ctl_ssefmt.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Length of the well-formed UTF-8 character at p (n bytes left), 0 when there is none. */
static size_t
ctl_ssefmt_utf8_len(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    size_t k;
    uint32_t cp, min;
    if (c < 0xC2 || c > 0xF4)
        return 0; /* (ASCII is handled by the caller; 0x80..0xC1 never start one) */
    if (c < 0xE0) {
        k = 2;
        cp = c & 0x1F;
        min = 0x80;
    } else if (c < 0xF0) {
        k = 3;
        cp = c & 0x0F;
        min = 0x800;
    } else {
        k = 4;
        cp = c & 0x07;
        min = 0x10000;
    }
    if (n < k)
        return 0;
    for (size_t i = 1; i < k; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return k;
}

size_t
ctl_ssefmt_escape(const char *text, size_t len, char *out)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *p = (const unsigned char *)text;
    char *o = out;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        if (c >= 0x80) {
            size_t k = ctl_ssefmt_utf8_len(p + i, len - i);
            if (k == 0)
                return (size_t)-1;
            memcpy(o, p + i, k);
            o += k;
            i += k;
            continue;
        }
        i++;
        if (c >= 0x20 && c != '"' && c != '\\') {
            *o++ = (char)c;
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"':
            *o++ = '"';
            break;
        case '\\':
            *o++ = '\\';
            break;
        case '\b':
            *o++ = 'b';
            break;
        case '\f':
            *o++ = 'f';
            break;
        case '\n':
            *o++ = 'n';
            break;
        case '\r':
            *o++ = 'r';
            break;
        case '\t':
            *o++ = 't';
            break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 0xF];
        }
    }
    return (size_t)(o - out);
}

bool
ctl_ssefmt_init(ctl_ssefmt *f, const char *dump)
{
    memset(f, 0, sizeof(*f));
    size_t n = strlen(dump), k = n;
    while (k > 0 && (dump[k - 1] == '}' || dump[k - 1] == ']'))
        k--;
    /* ...:""}]}: k is just past the empty string */
    if (k < 3 || n - k + 1 >= sizeof(f->suf) || dump[k - 1] != '"' || dump[k - 2] != '"' ||
        dump[k - 3] != ':')
        return false;
    f->pre = malloc(k - 1);
    if (f->pre == NULL)
        return false;
    memcpy(f->pre, dump, k - 1);
    f->pre_len = k - 1;
    memcpy(f->suf, dump + k - 1, n - k + 1);
    f->suf_len = n - k + 1;
    return true;
}

void
ctl_ssefmt_fini(ctl_ssefmt *f)
{
    free(f->pre);
    free(f->buf);
    memset(f, 0, sizeof(*f));
}

wk_err
ctl_ssefmt_chunk(ctl_ssefmt *f, const char *text, size_t len, const char **out)
{
    if (len > (SIZE_MAX - f->pre_len - f->suf_len - 1) / 6)
        return WK_ENOMEM;
    size_t need = f->pre_len + 6 * len + f->suf_len + 1;
    if (need > f->cap) {
        size_t cap = f->cap ? f->cap : 512;
        while (cap < need)
            cap *= 2;
        char *np = realloc(f->buf, cap);
        if (np == NULL)
            return WK_ENOMEM;
        f->buf = np;
        f->cap = cap;
    }
    memcpy(f->buf, f->pre, f->pre_len);
    size_t e = ctl_ssefmt_escape(text, len, f->buf + f->pre_len);
    if (e == (size_t)-1)
        return WK_EINVAL;
    char *o = f->buf + f->pre_len + e;
    memcpy(o, f->suf, f->suf_len);
    o[f->suf_len] = '\0';
    *out = f->buf;
    return WK_OK;
}
