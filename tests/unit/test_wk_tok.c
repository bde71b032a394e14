/*
 * Unit tests for wk_tok: vocab parsing (every escape, every refusal with its
 * line number), greedy longest-match encoding against a brute-force oracle,
 * decode round trips on random bytes, and the UTF-8 stream decoder against
 * vectors taken from Python's bytes.decode('utf-8', 'replace').
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wk_sha256.h"
#include "wk_tok.h"

/* A growable test string. */
typedef struct tbuf {
    char *p;    /* bytes */
    size_t len; /* used */
    size_t cap; /* allocated */
} tbuf;

static void
tbuf_add(tbuf *b, const void *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void
tbuf_str(tbuf *b, const char *s)
{
    tbuf_add(b, s, strlen(s));
}

/* The 256 single-byte lines (ids 1..256), as the real vocab writes them. */
static void
tbuf_bytes(tbuf *b, int skip_byte)
{
    char line[64];

    for (int c = 0; c < 256; c++) {
        if (c == skip_byte) /* a two-byte token in its place keeps the line count */
            snprintf(line, sizeof(line), "%d b'\\x%02x\\x%02x' 2\n", c + 1, c, c);
        else if (c < 0x80)
            snprintf(line, sizeof(line), "%d '\\x%02x' 1\n", c + 1, c);
        else
            snprintf(line, sizeof(line), "%d b'\\x%02x' 1\n", c + 1, c);
        tbuf_str(b, line);
    }
}

static wk_tok *
load_extra(const char *extra)
{
    tbuf b = {0};
    wk_tok *t = NULL;
    wk_diag d = {""};

    tbuf_bytes(&b, -1);
    tbuf_str(&b, extra);
    if (wk_tok_load_mem(b.p, b.len, &t, &d) != WK_OK)
        fail_msg("load failed: %s", d.msg);
    free(b.p);
    return t;
}

static const char *
fixture_path(void)
{
    static char path[4096];
    const char *src = getenv("WKVM_SOURCE_DIR");

    snprintf(path, sizeof(path), "%s/tests/fixtures/vocab_small.txt", src ? src : ".");
    return path;
}

static void
test_load_fixture(void **state)
{
    (void)state;
    wk_tok *t = NULL;
    wk_diag d = {""};
    size_t len;
    const uint8_t *p;
    char hex[WK_SHA256_HEX_LEN];

    if (wk_tok_load(fixture_path(), &t, &d) != WK_OK)
        fail_msg("%s", d.msg);
    assert_int_equal(wk_tok_vocab_size(t), 666);
    assert_int_equal(wk_tok_count(t), 665);
    assert_int_equal(wk_sha256_file_hex(fixture_path(), hex, NULL), WK_OK);
    assert_string_equal(wk_tok_digest(t), hex);
    p = wk_tok_piece(t, 1, &len);
    assert_int_equal(len, 1);
    assert_int_equal(p[0], 0);
    p = wk_tok_piece(t, 256, &len);
    assert_int_equal(len, 1);
    assert_int_equal(p[0], 0xff);
    p = wk_tok_piece(t, 599, &len); /* 'ĠThe' */
    assert_int_equal(len, 5);
    assert_memory_equal(p, "\xc4\xa0The", 5);
    p = wk_tok_piece(t, 655, &len); /* "it\'s \"q\"" */
    assert_int_equal(len, 8);
    assert_memory_equal(p, "it's \"q\"", 8);
    p = wk_tok_piece(t, 0, &len);
    assert_non_null(p);
    assert_int_equal(len, 0);
    assert_null(wk_tok_piece(t, 666, &len));
    assert_null(wk_tok_piece(t, -1, &len));
    wk_tok_free(t);
    wk_tok_free(NULL);
}

static void
test_load_missing_file(void **state)
{
    (void)state;
    wk_tok *t = NULL;
    wk_diag d = {""};

    assert_int_equal(wk_tok_load("/nonexistent/vocab.txt", &t, &d), WK_ENOENT);
    assert_null(t);
    assert_non_null(strstr(d.msg, "/nonexistent/vocab.txt"));
}

typedef struct esc_case {
    const char *literal; /* as written in the file */
    const char *bytes;   /* expected piece */
    size_t len;          /* expected length */
} esc_case;

static const esc_case esc_cases[] = {
    {"'\\\\'", "\\", 1},
    {"'\\''", "'", 1},
    {"\"'\"", "'", 1},
    {"'\\\"'", "\"", 1},
    {"'\"'", "\"", 1},
    {"'\\a\\b\\f\\n\\r\\t\\v'", "\a\b\f\n\r\t\v", 7},
    {"'\\x41\\x7f'", "A\x7f", 2},
    {"'\\xe9'", "\xc3\xa9", 2},        /* \x in str is a code point */
    {"b'\\xe9'", "\xe9", 1},           /* \x in bytes is a byte */
    {"'\\0'", "\0", 1},
    {"'\\7\\07\\007\\0078'", "\a\a\a\a" "8", 5},
    {"'\\101\\1011'", "AA1", 3},
    {"'\\777'", "\xc7\xbf", 2},        /* U+01FF */
    {"b'\\377\\0'", "\xff\0", 2},
    {"'\\u00e9\\u4E16'", "\xc3\xa9\xe4\xb8\x96", 5},
    {"'\\U0001f600\\U0010FFFF'", "\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf", 8},
    {"'\xc3\xa9\xe4\xb8\x96\xf0\x9f\x98\x80'", "\xc3\xa9\xe4\xb8\x96\xf0\x9f\x98\x80", 9},
    {"b\"it's\"", "it's", 4},
    {"B'\\'\\\"'", "'\"", 2},
    {"u'hi'", "hi", 2},
    {"U\"hi there\"", "hi there", 8},
    {"'a\tb'", "a\tb", 3},             /* a raw tab is allowed, as in Python */
    {"'  '", "  ", 2},
    {"' x '", " x ", 3},
};

static void
test_escapes(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(esc_cases) / sizeof(esc_cases[0]); i++) {
        const esc_case *c = &esc_cases[i];
        char line[256];
        size_t len;
        wk_tok *t;
        const uint8_t *p;

        snprintf(line, sizeof(line), "300 %s %zu\n", c->literal, c->len);
        t = load_extra(line);
        p = wk_tok_piece(t, 300, &len);
        assert_non_null(p);
        if (len != c->len || memcmp(p, c->bytes, len) != 0)
            fail_msg("case %zu %s: wrong bytes (len %zu)", i, c->literal, len);
        assert_int_equal(wk_tok_vocab_size(t), 301);
        assert_int_equal(wk_tok_count(t), 257);
        assert_null(wk_tok_piece(t, 299, &len));
        wk_tok_free(t);
    }
}

static void
test_line_endings(void **state)
{
    (void)state;
    tbuf b = {0};
    wk_tok *t = NULL;
    wk_diag d = {""};
    size_t len;

    /* CRLF everywhere and no final newline. */
    for (int c = 0; c < 256; c++) {
        char line[64];
        snprintf(line, sizeof(line), "%d b'\\x%02x' 1\r\n", c + 1, c);
        tbuf_str(&b, line);
    }
    tbuf_str(&b, "257 'ab' 2");
    assert_int_equal(wk_tok_load_mem(b.p, b.len, &t, &d), WK_OK);
    assert_non_null(wk_tok_piece(t, 257, &len));
    assert_int_equal(len, 2);
    wk_tok_free(t);
    free(b.p);
}

typedef struct bad_case {
    const char *extra; /* lines after the 256 byte lines */
    size_t line;       /* line the diag must name */
    const char *what;  /* substring the diag must contain */
} bad_case;

static const bad_case bad_cases[] = {
    {"257 abc 3\n", 257, "bad literal"},
    {"257 'ab' 2\n258 'abc 4\n", 258, "no closing quote"},
    {"257 'a''b' 2\n", 257, "after the closing quote"},
    {"257 'a'x 1\n", 257, "after the closing quote"},
    {"257 r'ab' 2\n", 257, "bad literal"},
    {"257 '\\q' 2\n", 257, "bad escape"},
    {"257 '\\8' 2\n", 257, "bad escape"},
    {"257 'ab\\' 3\n", 257, "no closing quote"},
    {"257 '\\x4' 1\n", 257, "two hex digits"},
    {"257 '\\xg0' 1\n", 257, "two hex digits"},
    {"257 '\\u12' 1\n", 257, "4 hex digits"},
    {"257 '\\U0001F60' 1\n", 257, "8 hex digits"},
    {"257 '\\U00110000' 4\n", 257, "beyond U+10FFFF"},
    {"257 '\\ud800' 3\n", 257, "surrogate"},
    {"257 '\\N{BULLET}' 3\n", 257, "\\N{...}"},
    {"257 b'\\u0041' 1\n", 257, "not an escape in a bytes literal"},
    {"257 b'\\N{X}' 1\n", 257, "not an escape in a bytes literal"},
    {"257 b'\\400' 1\n", 257, "over \\377"},
    {"257 b'\xc3\xa9' 2\n", 257, "non-ASCII"},
    {"257 '\xff' 1\n", 257, "invalid UTF-8"},
    {"257 '\xc3' 1\n", 257, "invalid UTF-8"},
    {"257 '\xed\xa0\x80' 3\n", 257, "invalid UTF-8"},
    {"257 '\xc0\xaf' 2\n", 257, "invalid UTF-8"},
    {"257 'a\rb' 3\n", 257, "carriage return"},
    {"257 'ab' 3\n", 257, "length mismatch"},
    {"257 'ab' 2\n258 '\\xe9' 1\n", 258, "length mismatch"},
    {"257 'ab' x\n", 257, "bad length"},
    {"257 'ab' \n", 257, "bad length"},
    {"257 'ab' 2\n258 'cd' 2\n5 'ef' 2\n", 259, "duplicate id 5 (first defined on line 5)"},
    {"257 'ab' 2\n257 'cd' 2\n", 258, "duplicate id 257 (first defined on line 257)"},
    {"x257 'ab' 2\n", 257, "bad id"},
    {"-1 'ab' 2\n", 257, "bad id"},
    {"+257 'ab' 2\n", 257, "bad id"},
    {" 257 'ab' 2\n", 257, "bad id"},
    {"0 'ab' 2\n", 257, "reserved for end-of-text"},
    {"1048576 'ab' 2\n", 257, "bad id"},
    {"99999999999999999999 'ab' 2\n", 257, "bad id"},
    {"257 'ab' 2\n\n258 'cd' 2\n", 258, "empty line"},
    {"257 '' 0\n", 257, "empty token"},
    {"257 'ab'\n", 257, "expected '<id> <literal> <length>'"},
    {"257\n", 257, "expected"},
    {"257 'a\0b' 3\n", 257, "NUL byte"},
};

static void
check_bad(const char *data, size_t len, size_t line, const char *what, size_t idx)
{
    wk_tok *t = NULL;
    wk_diag d = {""};
    char want[64];
    wk_err e = wk_tok_load_mem(data, len, &t, &d);

    if (e != WK_EINVAL)
        fail_msg("case %zu: got %s, want WK_EINVAL (diag '%s')", idx, wk_err_name(e), d.msg);
    assert_null(t);
    snprintf(want, sizeof(want), "vocab line %zu", line);
    if (strstr(d.msg, want) == NULL || strstr(d.msg, what) == NULL)
        fail_msg("case %zu: diag '%s' lacks '%s' or '%s'", idx, d.msg, want, what);
}

static void
test_bad_files(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        tbuf b = {0};
        const char *x = bad_cases[i].extra;
        size_t xlen = strlen(x);

        if (strstr(bad_cases[i].what, "NUL") != NULL)
            xlen = sizeof("257 'a\0b' 3\n") - 1; /* strlen stops at the NUL */
        tbuf_bytes(&b, -1);
        tbuf_add(&b, x, xlen);
        check_bad(b.p, b.len, bad_cases[i].line, bad_cases[i].what, i);
        free(b.p);
    }
}

static void
test_bad_missing_byte(void **state)
{
    (void)state;
    tbuf b = {0};

    tbuf_bytes(&b, 0x41);
    check_bad(b.p, b.len, 256, "no single-byte token for byte 0x41", 0);
    free(b.p);
}

static void
test_bad_long_lines(void **state)
{
    (void)state;
    tbuf b = {0};
    char *lit;

    /* A token over WK_TOK_MAX_PIECE bytes on a line within the line limit. */
    tbuf_bytes(&b, -1);
    tbuf_str(&b, "257 'ab' 2\n258 '");
    lit = malloc(WK_TOK_MAX_LINE + 16);
    memset(lit, 'a', WK_TOK_MAX_PIECE + 1);
    tbuf_add(&b, lit, WK_TOK_MAX_PIECE + 1);
    tbuf_str(&b, "' 1025\n");
    check_bad(b.p, b.len, 258, "token longer than 1024 bytes", 0);
    free(b.p);

    /* A line over WK_TOK_MAX_LINE bytes. */
    memset(&b, 0, sizeof(b));
    tbuf_bytes(&b, -1);
    tbuf_str(&b, "257 '");
    memset(lit, 'b', WK_TOK_MAX_LINE);
    tbuf_add(&b, lit, WK_TOK_MAX_LINE);
    tbuf_str(&b, "' 8192\n");
    check_bad(b.p, b.len, 257, "line longer than 8192 bytes", 1);
    free(b.p);

    /* Exactly WK_TOK_MAX_LINE bytes is fine for the line check; a max-size
     * token written with \x escapes fits. */
    memset(&b, 0, sizeof(b));
    tbuf_bytes(&b, -1);
    tbuf_str(&b, "257 b'");
    for (int i = 0; i < WK_TOK_MAX_PIECE; i++)
        tbuf_str(&b, "\\xab");
    tbuf_str(&b, "' 1024\n");
    {
        wk_tok *t = NULL;
        wk_diag d = {""};
        size_t len;
        assert_int_equal(wk_tok_load_mem(b.p, b.len, &t, &d), WK_OK);
        assert_non_null(wk_tok_piece(t, 257, &len));
        assert_int_equal(len, WK_TOK_MAX_PIECE);
        wk_tok_free(t);
    }
    free(b.p);
    free(lit);
}

static void
test_bad_empty(void **state)
{
    (void)state;
    wk_tok *t = NULL;
    wk_diag d = {""};

    assert_int_equal(wk_tok_load_mem("", 0, &t, &d), WK_EINVAL);
    assert_null(t);
    assert_int_equal(wk_tok_load_mem("\n", 1, &t, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "vocab line 1: empty line"));
}

static void
expect_ids(const wk_tok *t, const char *text, size_t len, const int32_t *want, size_t n_want)
{
    int32_t *ids = NULL;
    size_t n = 0;
    wk_diag d = {""};

    assert_int_equal(wk_tok_encode(t, text, len, &ids, &n, &d), WK_OK);
    if (n != n_want)
        fail_msg("'%s': %zu ids, want %zu", text, n, n_want);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] != want[i])
            fail_msg("'%s': id %zu is %d, want %d", text, i, ids[i], want[i]);
    }
    free(ids);
}

#define B(c) ((int32_t)(unsigned char)(c) + 1) /* id of a single byte */
#define EXPECT(t, s, ...)                                                                      \
    do {                                                                                       \
        const int32_t w_[] = {__VA_ARGS__};                                                    \
        expect_ids(t, s, strlen(s), w_, sizeof(w_) / sizeof(w_[0]));                           \
    } while (0)

static void
test_longest_match(void **state)
{
    (void)state;
    wk_tok *t = load_extra("300 'ab' 2\n301 'abc' 3\n302 'abcd' 4\n303 'bcd' 3\n"
                           "304 'xyz' 3\n305 'cd' 2\n306 'ef' 2\n307 'def' 3\n");

    EXPECT(t, "abcde", 302, B('e'));
    EXPECT(t, "abcx", 301, B('x'));
    EXPECT(t, "abx", 300, B('x'));
    EXPECT(t, "a", B('a'));
    /* The walk passes "xy" (no token) and falls back to the last match. */
    EXPECT(t, "xy", B('x'), B('y'));
    EXPECT(t, "xyzxy", 304, B('x'), B('y'));
    /* Greedy, not optimal: "abc" + "def" beats "ab" + "cd" + "ef". */
    EXPECT(t, "abcdef", 302, 306);
    EXPECT(t, "zabcdef", B('z'), 302, 306);
    EXPECT(t, "bcdef", 303, 306);
    EXPECT(t, "cdef", 305, 306);
    wk_tok_free(t);
}

static void
test_duplicate_piece(void **state)
{
    (void)state;
    /* Same bytes under two ids: encode picks the later line, decode knows both. */
    wk_tok *t = load_extra("400 'ab' 2\n300 'ab' 2\n");
    char *out = NULL;
    size_t len = 0;
    const int32_t ids[] = {400, 300};
    wk_diag d = {""};

    EXPECT(t, "abab", 300, 300);
    assert_int_equal(wk_tok_decode(t, ids, 2, &out, &len, &d), WK_OK);
    assert_int_equal(len, 4);
    assert_string_equal(out, "abab");
    free(out);
    wk_tok_free(t);
}

static void
test_encode_empty_and_nul(void **state)
{
    (void)state;
    wk_tok *t = load_extra("");
    int32_t *ids = NULL;
    size_t n = 99;
    wk_diag d = {""};

    assert_int_equal(wk_tok_encode(t, "", 0, &ids, &n, &d), WK_OK);
    assert_non_null(ids);
    assert_int_equal(n, 0);
    free(ids);
    assert_int_equal(wk_tok_encode(t, "a\0b", 3, &ids, &n, &d), WK_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 1);
    free(ids);
    wk_tok_free(t);
}

static void
test_decode(void **state)
{
    (void)state;
    wk_tok *t = load_extra("300 'ab' 2\n");
    const int32_t ok[] = {300, 0, B('c'), 1, 0};
    const int32_t bad[] = {300, 299};
    const int32_t neg[] = {-5};
    const int32_t big[] = {1 << 30};
    char *out = (char *)"untouched";
    size_t len = 7;
    wk_diag d = {""};

    assert_int_equal(wk_tok_decode(t, ok, 5, &out, &len, &d), WK_OK);
    assert_int_equal(len, 4);
    assert_memory_equal(out, "abc\0", 5);
    free(out);
    assert_int_equal(wk_tok_decode(t, NULL, 0, &out, &len, &d), WK_OK);
    assert_int_equal(len, 0);
    assert_string_equal(out, "");
    free(out);
    out = (char *)"untouched";
    assert_int_equal(wk_tok_decode(t, bad, 2, &out, &len, &d), WK_EINVAL);
    assert_string_equal(out, "untouched");
    assert_non_null(strstr(d.msg, "unknown token id 299 at index 1"));
    assert_int_equal(wk_tok_decode(t, neg, 1, &out, &len, &d), WK_EINVAL);
    assert_int_equal(wk_tok_decode(t, big, 1, &out, &len, &d), WK_EINVAL);
    wk_tok_free(t);
}

/* Brute-force greedy longest match over every id: the oracle for encode. */
static size_t
oracle_encode(const wk_tok *t, const uint8_t *s, size_t len, int32_t *out)
{
    size_t n = 0, i = 0;

    while (i < len) {
        int32_t best = -1;
        size_t best_len = 0;
        for (uint32_t id = 1; id < wk_tok_vocab_size(t); id++) {
            size_t pl;
            const uint8_t *p = wk_tok_piece(t, (int32_t)id, &pl);
            /* The fixture has no repeated pieces, so the first longest is the one. */
            if (p != NULL && pl > best_len && pl <= len - i && memcmp(p, s + i, pl) == 0) {
                best = (int32_t)id;
                best_len = pl;
            }
        }
        assert_true(best > 0);
        out[n++] = best;
        i += best_len;
    }
    return n;
}

static void
test_random_round_trip(void **state)
{
    (void)state;
    wk_tok *t = NULL;
    wk_diag d = {""};
    uint32_t seed = 12345;
    uint8_t text[512];
    int32_t want[512];

    if (wk_tok_load(fixture_path(), &t, &d) != WK_OK)
        fail_msg("%s", d.msg);
    for (int iter = 0; iter < 1500; iter++) {
        size_t len = 0, target;
        int32_t *ids = NULL;
        size_t n = 0, n_want;
        char *back = NULL;
        size_t back_len = 0;

        seed = seed * 1103515245u + 12345u;
        target = (seed >> 8) % 200;
        while (len < target) {
            seed = seed * 1103515245u + 12345u;
            if ((seed >> 16) % 3 == 0) {
                text[len++] = (uint8_t)(seed >> 24);
            } else {
                size_t pl;
                const uint8_t *p = wk_tok_piece(t, (int32_t)(1 + (seed >> 12) % 665), &pl);
                if (len + pl <= sizeof(text)) {
                    memcpy(text + len, p, pl);
                    len += pl;
                } else {
                    break;
                }
            }
        }
        assert_int_equal(wk_tok_encode(t, (const char *)text, len, &ids, &n, &d), WK_OK);
        n_want = oracle_encode(t, text, len, want);
        assert_int_equal(n, n_want);
        assert_memory_equal(ids, want, n * sizeof(*ids));
        assert_int_equal(wk_tok_decode(t, ids, n, &back, &back_len, &d), WK_OK);
        assert_int_equal(back_len, len);
        assert_memory_equal(back, text, len);
        free(ids);
        free(back);
    }
    wk_tok_free(t);
}

/* Pushes each token and collects the output, then flushes. */
static size_t
stream_all(const wk_tok *t, const int32_t *ids, size_t n, char *out)
{
    wk_tok_stream s;
    size_t o = 0, got;
    char buf[WK_TOK_STREAM_OUT_MAX];
    wk_diag d = {""};

    wk_tok_stream_init(&s, t);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(wk_tok_stream_push(&s, ids[i], buf, sizeof(buf), &got, &d), WK_OK);
        memcpy(out + o, buf, got);
        o += got;
    }
    o += wk_tok_stream_flush(&s, out + o);
    assert_int_equal(wk_tok_stream_pending(&s), 0);
    return o;
}

#define FFFD "\xef\xbf\xbd"

static void
test_stream_split_chars(void **state)
{
    (void)state;
    wk_tok *t = NULL;
    wk_diag d = {""};
    wk_tok_stream s;
    char buf[WK_TOK_STREAM_OUT_MAX];
    size_t got = 99;

    if (wk_tok_load(fixture_path(), &t, &d) != WK_OK)
        fail_msg("%s", d.msg);
    wk_tok_stream_init(&s, t);
    /* 643 = b'\xe4\xb8', then the byte 0x96: U+4E16. */
    assert_int_equal(wk_tok_stream_push(&s, 643, buf, sizeof(buf), &got, &d), WK_OK);
    assert_int_equal(got, 0);
    assert_int_equal(wk_tok_stream_pending(&s), 2);
    assert_int_equal(wk_tok_stream_push(&s, 0, buf, sizeof(buf), &got, &d), WK_OK);
    assert_int_equal(got, 0);
    assert_int_equal(wk_tok_stream_push(&s, B(0x96), buf, sizeof(buf), &got, &d), WK_OK);
    assert_int_equal(got, 3);
    assert_memory_equal(buf, "\xe4\xb8\x96", 3);
    /* 644 = b'\xf0\x9f', 0x98, 0x80 then 'a': U+1F600 arrives in three tokens. */
    assert_int_equal(wk_tok_stream_push(&s, 644, buf, sizeof(buf), &got, &d), WK_OK);
    assert_int_equal(got, 0);
    assert_int_equal(wk_tok_stream_push(&s, B(0x98), buf, sizeof(buf), &got, &d), WK_OK);
    assert_int_equal(got, 0);
    assert_int_equal(wk_tok_stream_push(&s, B(0x80), buf, sizeof(buf), &got, &d), WK_OK);
    assert_int_equal(got, 4);
    assert_memory_equal(buf, "\xf0\x9f\x98\x80", 4);
    /* 648 = b'\xc3\xa9\xc3': one char out, one byte held. */
    assert_int_equal(wk_tok_stream_push(&s, 648, buf, sizeof(buf), &got, &d), WK_OK);
    assert_int_equal(got, 2);
    assert_int_equal(wk_tok_stream_pending(&s), 1);
    /* Unknown id and a too-small buffer leave the stream as it was. */
    assert_int_equal(wk_tok_stream_push(&s, 9999, buf, sizeof(buf), &got, &d), WK_EINVAL);
    assert_int_equal(wk_tok_stream_push(&s, 599, buf, 10, &got, &d), WK_ETOOBIG);
    assert_int_equal(wk_tok_stream_pending(&s), 1);
    assert_int_equal(wk_tok_stream_push(&s, B(0xa9), buf, sizeof(buf), &got, &d), WK_OK);
    assert_int_equal(got, 2);
    assert_memory_equal(buf, "\xc3\xa9", 2);
    /* A held prefix at the end flushes as one U+FFFD. */
    assert_int_equal(wk_tok_stream_push(&s, 645, buf, sizeof(buf), &got, &d), WK_OK);
    assert_int_equal(got, 0);
    assert_int_equal(wk_tok_stream_flush(&s, buf), 3);
    assert_memory_equal(buf, FFFD, 3);
    assert_int_equal(wk_tok_stream_flush(&s, buf), 0);
    wk_tok_free(t);
}

typedef struct replace_case {
    const char *in;  /* raw bytes */
    const char *out; /* Python: in.decode('utf-8', 'replace').encode() */
} replace_case;

static const replace_case replace_cases[] = {
    {"\xed\xa0\x80", FFFD FFFD FFFD},
    {"\xc0\xaf", FFFD FFFD},
    {"\xe4\xb8" "a", FFFD "a"},
    {"\xf0\x9f\x98", FFFD},
    {"\xf4\x90\x80\x80", FFFD FFFD FFFD FFFD},
    {"\xe0\x80\xaf", FFFD FFFD FFFD},
    {"a\x80" "b", "a" FFFD "b"},
    {"\xf0\x9f\x98\x80\xe4", "\xf0\x9f\x98\x80" FFFD},
    {"\xe1\x80\xe2\xf0\x91\x92\xf1\xbf" "A", FFFD FFFD FFFD FFFD "A"},
    {"\xff\xfe", FFFD FFFD},
    {"plain \xc3\xa9 text", "plain \xc3\xa9 text"},
};

static void
test_stream_invalid_bytes(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(replace_cases) / sizeof(replace_cases[0]); i++) {
        const char *in = replace_cases[i].in;
        size_t n = strlen(in);
        /* Every split of the input into two pushes gives the same output. */
        for (size_t cut = 0; cut <= n; cut++) {
            wk_tok_stream s;
            char out[256];
            size_t o = 0, got;

            wk_tok_stream_init(&s, NULL);
            assert_int_equal(wk_tok_stream_push_bytes(&s, (const uint8_t *)in, cut, out,
                                                      sizeof(out), &got), WK_OK);
            o += got;
            for (size_t k = cut; k < n; k++) {
                assert_int_equal(wk_tok_stream_push_bytes(&s, (const uint8_t *)in + k, 1,
                                                          out + o, sizeof(out) - o, &got), WK_OK);
                o += got;
            }
            o += wk_tok_stream_flush(&s, out + o);
            out[o] = '\0';
            if (strcmp(out, replace_cases[i].out) != 0)
                fail_msg("case %zu cut %zu: wrong output", i, cut);
        }
    }
    /* A push without a vocab is refused; small buffers are refused. */
    {
        wk_tok_stream s;
        char out[8];
        size_t got;
        wk_diag d = {""};
        wk_tok_stream_init(&s, NULL);
        assert_int_equal(wk_tok_stream_push(&s, 1, out, sizeof(out), &got, &d), WK_EINVAL);
        assert_int_equal(wk_tok_stream_push_bytes(&s, (const uint8_t *)"abc", 3, out, 8, &got),
                         WK_ETOOBIG);
    }
}

static void
test_stream_random(void **state)
{
    (void)state;
    wk_tok *t = NULL;
    wk_diag d = {""};
    uint32_t seed = 777;

    if (wk_tok_load(fixture_path(), &t, &d) != WK_OK)
        fail_msg("%s", d.msg);
    for (int iter = 0; iter < 500; iter++) {
        int32_t ids[64];
        size_t n = 0;
        char *raw = NULL;
        size_t raw_len = 0;
        char streamed[64 * 3 * 32];
        size_t sl;
        wk_tok_stream s;
        size_t got, chunked = 0;
        char again[sizeof(streamed)];

        seed = seed * 1103515245u + 12345u;
        n = (seed >> 8) % 64;
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            ids[i] = (int32_t)((seed >> 10) % 666);
        }
        sl = stream_all(t, ids, n, streamed);
        assert_int_equal(wk_tok_decode(t, ids, n, &raw, &raw_len, &d), WK_OK);
        /* The same bytes pushed all at once give the same text. */
        wk_tok_stream_init(&s, NULL);
        assert_int_equal(wk_tok_stream_push_bytes(&s, (const uint8_t *)raw, raw_len, again,
                                                  sizeof(again), &got), WK_OK);
        chunked = got + wk_tok_stream_flush(&s, again + got);
        assert_int_equal(chunked, sl);
        assert_memory_equal(again, streamed, sl);
        /* Output is always well-formed UTF-8: re-decoding changes nothing. */
        wk_tok_stream_init(&s, NULL);
        assert_int_equal(wk_tok_stream_push_bytes(&s, (const uint8_t *)streamed, sl, again,
                                                  sizeof(again), &got), WK_OK);
        assert_int_equal(wk_tok_stream_pending(&s), 0);
        assert_int_equal(got, sl);
        assert_memory_equal(again, streamed, sl);
        free(raw);
    }
    wk_tok_free(t);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_fixture),
        cmocka_unit_test(test_load_missing_file),
        cmocka_unit_test(test_escapes),
        cmocka_unit_test(test_line_endings),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_bad_missing_byte),
        cmocka_unit_test(test_bad_long_lines),
        cmocka_unit_test(test_bad_empty),
        cmocka_unit_test(test_longest_match),
        cmocka_unit_test(test_duplicate_piece),
        cmocka_unit_test(test_encode_empty_and_nul),
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_random_round_trip),
        cmocka_unit_test(test_stream_split_chars),
        cmocka_unit_test(test_stream_invalid_bytes),
        cmocka_unit_test(test_stream_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
