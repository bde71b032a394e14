/*
 * wk_hex: hex digits, one rule for every parser that reads them: tokenizer
 * escapes (\xHH, \uHHHH), byte-fallback keys (<0xHH>) and the SHA-256
 * digests in store keys and state files (lowercase only: the canonical form
 * wk_sha256_hex writes, so one digest has one spelling).
 */
#ifndef WK_HEX_H
#define WK_HEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The value of hex digit c (either case), or -1. */
static inline int
wk_hex_digit(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The value of lowercase hex digit c, or -1 (uppercase included). */
static inline int
wk_hex_digit_lower(int c)
{
    return c >= 'A' && c <= 'F' ? -1 : wk_hex_digit(c);
}

/*
 * Decodes n bytes from the 2n lowercase hex digits at s; false when one of
 * them is not such a digit (out is then partly written). s need not be
 * terminated after them.
 */
static inline bool
wk_hex_decode_lower(const char *s, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int hi = wk_hex_digit_lower((unsigned char)s[2 * i]);
        int lo = hi < 0 ? -1 : wk_hex_digit_lower((unsigned char)s[2 * i + 1]);
        if (lo < 0)
            return false;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

#endif /* WK_HEX_H */
