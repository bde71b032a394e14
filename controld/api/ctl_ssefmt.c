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

#include "wk_utf8.h"

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
            size_t k = wk_utf8_dec(p + i, len - i, NULL);
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
