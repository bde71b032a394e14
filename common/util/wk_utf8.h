/*
 * wk_utf8: one rule for a well-formed UTF-8 character (RFC 3629: no
 * overlong forms, no surrogates, nothing past U+10FFFF), header-only, for
 * the modules that walk text byte by byte (the BPE tokenizer, the regex
 * pre-tokenizers). Never reads past n.
 */
#ifndef WK_UTF8_H
#define WK_UTF8_H

#include <stddef.h>
#include <stdint.h>

/*
 * Length (1..4) of the well-formed UTF-8 character at s (n > 0 bytes), 0
 * when there is none (a stray or truncated sequence); sets *cp (when cp is
 * not NULL) on success only.
 */
static inline size_t
wk_utf8_dec(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint8_t c = s[0], lo = 0x80, hi = 0xbf;
    size_t need;
    uint32_t v;

    if (c < 0x80) {
        if (cp != NULL)
            *cp = c;
        return 1;
    }
    if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
        v = c & 0x1fu;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        v = c & 0x0fu;
        lo = c == 0xe0 ? 0xa0 : 0x80;
        hi = c == 0xed ? 0x9f : 0xbf;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        v = c & 0x07u;
        lo = c == 0xf0 ? 0x90 : 0x80;
        hi = c == 0xf4 ? 0x8f : 0xbf;
    } else {
        return 0;
    }
    if (n < need)
        return 0;
    for (size_t i = 1; i < need; i++) {
        if (s[i] < lo || s[i] > hi)
            return 0;
        lo = 0x80;
        hi = 0xbf;
        v = (v << 6) | (s[i] & 0x3fu);
    }
    if (cp != NULL)
        *cp = v;
    return need;
}

#endif /* WK_UTF8_H */
