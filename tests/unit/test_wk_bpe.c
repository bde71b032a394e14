/*
 * Unit tests for wk_bpe and the "hf-bpe" kind of wk_tok: small hand-written
 * tokenizer.json files for merge order, both merge formats, added tokens
 * (leftmost-longest), the prefix space, the GPT-2 split (contractions,
 * numbers, whitespace runs, non-ASCII letters, invalid UTF-8), NFC, empty
 * input, decode round trips, hostile files refused with their diags, the
 * end-of-text rules and wk_tok_load_dir(); then the SentencePiece-style
 * ("hf-spm", Llama-2 / Mistral) mode: Prepend/Replace and Metaspace forms,
 * byte fallback, unk (fused or not), added tokens, pieces, decode, the
 * stream, a long single word, and hostile variants; last, continuations
 * (wk_tok_encode_continue) and the text-prefix match of kept tokens
 * (wk_tok_text_prefix) in every form.
 * tests/reference/check_bpe.py compares against the real `tokenizers`
 * library.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include <cmocka.h>

#include "wk_bpe.h"
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

static void WK_PRINTF(2, 3)
tbuf_fmt(tbuf *b, const char *fmt, ...)
{
    char tmp[4096];
    va_list ap;

    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    assert_true(n >= 0 && (size_t)n < sizeof(tmp));
    tbuf_add(b, tmp, (size_t)n);
}

/* GPT-2 bytes_to_unicode. */
static unsigned
byte_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    if (b <= 32)
        return 256 + b;
    if (b <= 160)
        return 256 + 33 + (b - 127);
    return 256 + 67;
}

/* Appends s through the byte-level alphabet as JSON \u escapes (no quotes). */
static void
tbuf_esc(tbuf *b, const char *s)
{
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        tbuf_fmt(b, "\\u%04x", byte_cp(*c));
}

/* Appends the JSON string (quotes included) of the byte-level key of s. */
static void
tbuf_key(tbuf *b, const char *s)
{
    tbuf_add(b, "\"", 1);
    tbuf_esc(b, s);
    tbuf_add(b, "\"", 1);
}

/*
 * Components of a test tokenizer.json. The vocab always has the 256 bytes
 * (byte b has id b) unless no_bytes; `words` are extra keys (plain text,
 * written through the byte-level alphabet) with ids 256, 257, ...
 */
typedef struct spec {
    const char *words[24];   /* extra vocab entries, NULL-terminated */
    const char *merges[24];  /* "a|b" in plain text, NULL-terminated */
    bool merge_arrays;       /* write merges as ["a", "b"] */
    const char *added;       /* raw JSON of added_tokens, NULL: [] */
    const char *normalizer;  /* raw JSON, NULL: null */
    const char *pre;         /* raw JSON, NULL: ByteLevel without prefix space */
    const char *decoder;     /* raw JSON, NULL: ByteLevel */
    const char *model_extra; /* raw JSON members added to model, with leading comma */
    const char *vocab_extra; /* raw JSON members added to vocab, with leading comma */
    int skip_byte;           /* a byte left out of the vocab, -1 for none */
} spec;

static char *
spec_json(const spec *sp, size_t *len)
{
    tbuf b = {0};

    tbuf_fmt(&b, "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n");
    tbuf_fmt(&b, "\"added_tokens\": %s,\n", sp->added ? sp->added : "[]");
    tbuf_fmt(&b, "\"normalizer\": %s,\n", sp->normalizer ? sp->normalizer : "null");
    tbuf_fmt(&b, "\"pre_tokenizer\": %s,\n",
             sp->pre ? sp->pre
                     : "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                       "\"trim_offsets\": true, \"use_regex\": true}");
    tbuf_fmt(&b, "\"post_processor\": null,\n\"decoder\": %s,\n",
             sp->decoder ? sp->decoder : "{\"type\": \"ByteLevel\"}");
    tbuf_fmt(&b,
             "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
             "\"fuse_unk\": false, \"byte_fallback\": false%s,\n\"vocab\": {",
             sp->model_extra ? sp->model_extra : "");
    bool first = true;
    for (int c = 0; c < 256; c++) {
        char one[2] = {(char)c, 0};
        if (c == sp->skip_byte)
            continue;
        if (!first)
            tbuf_add(&b, ", ", 2);
        first = false;
        if (c == 0)
            tbuf_fmt(&b, "\"\\u%04x\"", byte_cp(0));
        else
            tbuf_key(&b, one);
        tbuf_fmt(&b, ": %d", c);
    }
    for (int i = 0; sp->words[i]; i++) {
        tbuf_add(&b, ", ", 2);
        tbuf_key(&b, sp->words[i]);
        tbuf_fmt(&b, ": %d", 256 + i);
    }
    tbuf_fmt(&b, "%s},\n\"merges\": [", sp->vocab_extra ? sp->vocab_extra : "");
    for (int i = 0; sp->merges[i]; i++) {
        char l[64], r[64];
        const char *bar = strchr(sp->merges[i], '|');
        assert_non_null(bar);
        snprintf(l, sizeof(l), "%.*s", (int)(bar - sp->merges[i]), sp->merges[i]);
        snprintf(r, sizeof(r), "%s", bar + 1);
        if (i)
            tbuf_add(&b, ", ", 2);
        if (sp->merge_arrays) {
            tbuf_add(&b, "[", 1);
            tbuf_key(&b, l);
            tbuf_add(&b, ", ", 2);
            tbuf_key(&b, r);
            tbuf_add(&b, "]", 1);
        } else {
            tbuf_add(&b, "\"", 1);
            tbuf_esc(&b, l);
            tbuf_add(&b, " ", 1);
            tbuf_esc(&b, r);
            tbuf_add(&b, "\"", 1);
        }
    }
    tbuf_fmt(&b, "]}}\n");
    *len = b.len;
    return b.p;
}

static wk_tok *
spec_load(const spec *sp, const char *cfg)
{
    size_t len;
    char *j = spec_json(sp, &len);
    wk_tok *t = NULL;
    wk_diag d = {""};

    if (wk_tok_load_hf_mem(j, len, cfg, cfg ? strlen(cfg) : 0, &t, &d) != WK_OK)
        fail_msg("load failed: %s\n%s", d.msg, j);
    free(j);
    return t;
}

/* Expects the load of sp to fail with err and a diag containing want. */
static void
spec_refused(const spec *sp, wk_err err, const char *want)
{
    size_t len;
    char *j = spec_json(sp, &len);
    wk_tok *t = NULL;
    wk_diag d = {""};
    wk_err got = wk_tok_load_hf_mem(j, len, NULL, 0, &t, &d);

    if (got != err || strstr(d.msg, want) == NULL)
        fail_msg("want %s \"%s\", got %s \"%s\"", wk_err_name(err), want, wk_err_name(got), d.msg);
    assert_null(t);
    free(j);
}

/* Encodes s and compares with the n ids that follow. */
static void
enc_eq(const wk_tok *t, const char *s, size_t slen, size_t n, ...)
{
    int32_t *ids = NULL;
    size_t n_ids = 0;
    wk_diag d = {""};
    va_list ap;

    assert_int_equal(wk_tok_encode(t, s, slen, &ids, &n_ids, &d), WK_OK);
    assert_non_null(ids);
    va_start(ap, n);
    bool ok = n_ids == n;
    for (size_t i = 0; ok && i < n; i++)
        ok = ids[i] == va_arg(ap, int);
    va_end(ap);
    if (!ok) {
        char got[1024] = "";
        size_t o = 0;
        for (size_t i = 0; i < n_ids && o < 1000; i++)
            o += (size_t)snprintf(got + o, sizeof(got) - o, " %d", (int)ids[i]);
        fail_msg("encode \"%.*s\": got [%s ], want %zu ids", (int)slen, s, got, n);
    }
    free(ids);
}

#define ENC(t, s, ...)                                                                             \
    enc_eq((t), (s), sizeof(s) - 1, sizeof((int[]){__VA_ARGS__}) / sizeof(int), __VA_ARGS__)

static void
test_merge_order(void **state)
{
    (void)state;
    /* bc (rank 0) before ab (rank 1): "abc" -> a + bc */
    spec a = {.words = {"ab", "bc", "aa"}, .merges = {"b|c", "a|b", "a|a"}, .skip_byte = -1};
    /* ab first: "abc" -> ab + c */
    spec b = {.words = {"ab", "bc", "aa"}, .merges = {"a|b", "b|c", "a|a"}, .skip_byte = -1};
    wk_tok *ta = spec_load(&a, NULL), *tb = spec_load(&b, NULL);

    ENC(ta, "abc", 'a', 257);
    ENC(tb, "abc", 256, 'c');
    /* all occurrences, left to right */
    ENC(ta, "aaaa", 258, 258);
    ENC(ta, "aaa", 258, 'a');
    ENC(ta, "abcabc", 'a', 257, 'a', 257);
    assert_string_equal(wk_tok_kind(ta), "hf-bpe");
    assert_int_equal(wk_tok_vocab_size(ta), 259);
    assert_int_equal(wk_tok_count(ta), 259);
    wk_tok_free(ta);
    wk_tok_free(tb);
}

static void
test_merge_chain(void **state)
{
    (void)state;
    /* A long word merges down to one token; both merge formats agree. */
    spec s = {.words = {"he", "ll", "hell", "hello", "lo"},
              .merges = {"h|e", "l|l", "he|ll", "hell|o", "l|o"},
              .skip_byte = -1};
    wk_tok *t1 = spec_load(&s, NULL);
    s.merge_arrays = true;
    wk_tok *t2 = spec_load(&s, NULL);

    ENC(t1, "hello", 259);
    ENC(t2, "hello", 259);
    ENC(t1, "hellohello", 259, 259);
    ENC(t1, "hel", 256, 'l');
    ENC(t2, "llo", 257, 'o');
    wk_tok_free(t1);
    wk_tok_free(t2);
}

static void
test_long_word(void **state)
{
    (void)state;
    /* 200k 'a's: one word, every pair merges; the heap keeps this fast. */
    spec s = {.words = {"aa", "aaaa"}, .merges = {"a|a", "aa|aa"}, .skip_byte = -1};
    wk_tok *t = spec_load(&s, NULL);
    size_t n = 200000;
    char *txt = malloc(n);
    int32_t *ids = NULL;
    size_t n_ids = 0;

    memset(txt, 'a', n);
    assert_int_equal(wk_tok_encode(t, txt, n, &ids, &n_ids, NULL), WK_OK);
    assert_int_equal(n_ids, n / 4);
    for (size_t i = 0; i < n_ids; i++)
        assert_int_equal(ids[i], 257);
    free(ids);
    free(txt);
    wk_tok_free(t);
}

static const char *const ADDED =
    "[{\"id\": 300, \"content\": \"<|endoftext|>\", \"single_word\": false, \"lstrip\": false, "
    "\"rstrip\": false, \"normalized\": false, \"special\": true},"
    " {\"id\": 301, \"content\": \"<a>\", \"special\": true},"
    " {\"id\": 302, \"content\": \"<a><b>\", \"special\": true},"
    " {\"id\": 303, \"content\": \"  \", \"special\": false, \"normalized\": true}]";

static void
test_added_tokens(void **state)
{
    (void)state;
    spec s = {.words = {"xy"}, .merges = {"x|y"}, .added = ADDED, .skip_byte = -1};
    wk_tok *t = spec_load(&s, NULL);
    size_t len;
    const uint8_t *p;

    ENC(t, "xy<|endoftext|>xy", 256, 300, 256);
    ENC(t, "<|endoftext|><|endoftext|>", 300, 300);
    ENC(t, "<a><b>", 302); /* longest */
    ENC(t, "<a><a><b>", 301, 302);
    ENC(t, "<a>x<b>", 301, 'x', '<', 'b', '>');
    ENC(t, "x  y", 'x', 303, 'y'); /* a plain added token, matched verbatim */
    ENC(t, "<|endoftext", '<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't');
    p = wk_tok_piece(t, 300, &len);
    assert_int_equal(len, 13);
    assert_memory_equal(p, "<|endoftext|>", 13);
    assert_null(wk_tok_piece(t, 299, &len)); /* a hole between the vocab and the added ids */
    assert_int_equal(wk_tok_vocab_size(t), 304);
    assert_int_equal(wk_tok_count(t), 257 + 4);
    assert_int_equal(wk_tok_eos(t), 300);
    wk_tok_free(t);
}

static void
test_prefix_space(void **state)
{
    (void)state;
    spec s = {.words = {" h", " hi", "hi"},
              .merges = {" |h", " h|i", "h|i"},
              .added = ADDED,
              .pre = "{\"type\": \"ByteLevel\", \"add_prefix_space\": true}",
              .skip_byte = -1};
    wk_tok *t = spec_load(&s, NULL);

    ENC(t, "hi", 257);
    ENC(t, " hi", 257);
    ENC(t, "hi hi", 257, 257);
    /* every piece between added tokens gets its own space */
    ENC(t, "hi<|endoftext|>hi", 257, 300, 257);
    {
        int32_t *ids = NULL;
        size_t n = 99;
        assert_int_equal(wk_tok_encode(t, "", 0, &ids, &n, NULL), WK_OK);
        assert_non_null(ids);
        assert_int_equal(n, 0);
        free(ids);
    }
    wk_tok_free(t);
}

static void
test_regex_split(void **state)
{
    (void)state;
    /* ignore_merges: a word that is a vocab key is one token, so splits show. */
    spec s = {.words = {"don", "'t", "'m", " we", "'re", " b", "   \n", "123", "abc",
                        " \xc3\xbc"
                        "ber",
                        "\xe6\x97\xa5\xe6\x9c\xac", "\xc2\xb2", "!!?", "\xff\xfe", " '", "\n\n",
                        "  "},
              .model_extra = ", \"ignore_merges\": true",
              .skip_byte = -1};
    wk_tok *t = spec_load(&s, NULL);

    ENC(t, "don't", 256, 257);
    ENC(t, "I'm we're", 'I', 258, 259, 260);
    ENC(t, "a  b", 'a', ' ', 261); /* \s+(?!\S) leaves the last space to " b" */
    ENC(t, "x   \n", 'x', 262);    /* trailing whitespace run is one word */
    ENC(t, "123abc", 263, 264);    /* numbers and letters split */
    ENC(t,
        " \xc3\xbc"
        "ber",
        265);                                /* non-ASCII letters */
    ENC(t, "\xe6\x97\xa5\xe6\x9c\xac", 266); /* CJK letters */
    ENC(t, "x\xc2\xb2", 'x', 267);           /* superscript two is \p{N} */
    ENC(t, "!!?", 268);                      /* punctuation run */
    ENC(t, "\xff\xfe", 269);                 /* invalid UTF-8: "other" bytes */
    ENC(t,
        "a\xff"
        "b",
        'a', 0xff, 'b');
    ENC(t, " 'x", 270, 'x');                /* ' ?[^\s\p{L}\p{N}]+' then x */
    ENC(t, "a\n\nb", 'a', '\n', '\n', 'b'); /* a run of 2 before \S: 1 + 1 */
    ENC(t, "a\n\n", 'a', 271);
    ENC(t, "a   b", 'a', 272, 261);
    ENC(t, "'S", '\'', 'S'); /* contractions are case-sensitive */
    wk_tok_free(t);
}

static void
test_nfc(void **state)
{
    (void)state;
    spec s = {.words = {"caf\xc3\xa9"},
              .normalizer = "{\"type\": \"NFC\"}",
              .skip_byte = -1,
              .model_extra = ", \"ignore_merges\": true"};
    wk_tok *t = spec_load(&s, NULL);
    int32_t *ids = NULL;
    size_t n = 0, blen = 0;
    char *back = NULL;
    static const struct {
        const char *in, *out;
    } v[] = {
        {"cafe\xcc\x81", "caf\xc3\xa9"},                          /* e + U+0301 -> U+00E9 */
        {"A\xcc\x8a", "\xc3\x85"},                                /* A + ring -> U+00C5 */
        {"\xe2\x84\xab", "\xc3\x85"},                             /* U+212B ANGSTROM (singleton) */
        {"a\xcc\x81\xcc\x96", "\xc3\xa1\xcc\x96"},                /* reorder 0301/0316, compose */
        {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"}, /* Hangul L V T */
        {"\xcc\x81x", "\xcc\x81x"},                               /* leading combining mark */
        {"\xff\xcc\x81", "\xff\xcc\x81"}, /* raw byte is no starter to compose */
    };

    ENC(t, "cafe\xcc\x81", 256);
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        assert_int_equal(wk_tok_encode(t, v[i].in, strlen(v[i].in), &ids, &n, NULL), WK_OK);
        assert_int_equal(wk_tok_decode(t, ids, n, &back, &blen, NULL), WK_OK);
        if (blen != strlen(v[i].out) || memcmp(back, v[i].out, blen) != 0)
            fail_msg("NFC case %zu", i);
        free(ids);
        free(back);
    }
    wk_tok_free(t);
}

/* Encodes in with an NFC tokenizer and decodes it back into *back (caller frees). */
static void
nfc_round(wk_tok *t, const char *in, size_t len, char **back, size_t *blen)
{
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(wk_tok_encode(t, in, len, &ids, &n, NULL), WK_OK);
    assert_int_equal(wk_tok_decode(t, ids, n, back, blen, NULL), WK_OK);
    free(ids);
}

static void
test_nfc_long_run(void **state)
{
    (void)state;
    spec s = {.words = {"caf\xc3\xa9"},
              .normalizer = "{\"type\": \"NFC\"}",
              .skip_byte = -1,
              .model_extra = ", \"ignore_merges\": true"};
    wk_tok *t = spec_load(&s, NULL);
    char *back = NULL;
    size_t blen = 0;
    /* A small reference: classes 240 230 220 216 202 230 sort stably to 202 216 220 230 230 240. */
    static const char mix[] = "x\xcd\x85\xcc\x81\xcc\x96\xcc\x9b\xcc\xa7\xcc\x81";
    static const char mix_nfc[] = "x\xcc\xa7\xcc\x9b\xcc\x96\xcc\x81\xcc\x81\xcd\x85";
    nfc_round(t, mix, strlen(mix), &back, &blen);
    assert_int_equal(blen, strlen(mix_nfc));
    assert_memory_equal(back, mix_nfc, blen);
    free(back);
    /* Ties keep their order and the first unblocked mark composes: a 0301 0316 0301 0316. */
    static const char tie[] = "a\xcc\x81\xcc\x96\xcc\x81\xcc\x96";
    static const char tie_nfc[] = "\xc3\xa1\xcc\x96\xcc\x96\xcc\x81";
    nfc_round(t, tie, strlen(tie), &back, &blen);
    assert_int_equal(blen, strlen(tie_nfc));
    assert_memory_equal(back, tie_nfc, blen);
    free(back);
    /*
     * 200k alternating marks (230, 220, ...): all the 220s move in front of
     * all the 230s. Quadratic canonical ordering took minutes here.
     */
    enum { PAIRS = 100000 };
    char *in = malloc(1 + 4 * (size_t)PAIRS), *want = malloc(1 + 4 * (size_t)PAIRS);
    assert_non_null(in);
    assert_non_null(want);
    in[0] = want[0] = 'x';
    for (size_t i = 0; i < PAIRS; i++) {
        memcpy(in + 1 + 4 * i, "\xcc\x81\xcc\x96", 4);
        memcpy(want + 1 + 2 * i, "\xcc\x96", 2);
        memcpy(want + 1 + 2 * (PAIRS + i), "\xcc\x81", 2);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    nfc_round(t, in, 1 + 4 * (size_t)PAIRS, &back, &blen);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    assert_int_equal(blen, 1 + 4 * (size_t)PAIRS);
    assert_memory_equal(back, want, blen);
    /* a safety limit, not a speed test (bench/ measures speed): linear ordering
     * takes well under a second, the quadratic one minutes */
    if (secs > 60.0)
        fail_msg("NFC of a 200k-mark run took %.1f s (quadratic ordering?)", secs);
    free(back);
    free(in);
    free(want);
    wk_tok_free(t);
}

static void
test_round_trip(void **state)
{
    (void)state;
    spec s = {.words = {" t", "he", " the", "in", "\xc3\xa9", "  "},
              .merges = {" |t", "h|e", " t|he", "i|n", "\xc3|\xa9", " | "},
              .added = ADDED,
              .skip_byte = -1};
    wk_tok *t = spec_load(&s, NULL);
    uint64_t x = 88172645463325252ull;
    static const char alpha[] = "the in  \n\t'sxyz0123\xc3\xa9\xe6\x97\xa5<|>a";

    for (int iter = 0; iter < 3000; iter++) {
        char buf[96];
        size_t n = (size_t)(iter % 90);
        int32_t *ids = NULL;
        size_t n_ids = 0, blen = 0;
        char *back = NULL;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[i] = (iter & 1) ? (char)(x & 0xff) : alpha[x % (sizeof(alpha) - 1)];
        }
        assert_int_equal(wk_tok_encode(t, buf, n, &ids, &n_ids, NULL), WK_OK);
        assert_int_equal(wk_tok_decode(t, ids, n_ids, &back, &blen, NULL), WK_OK);
        if (blen != n || memcmp(back, buf, n) != 0)
            fail_msg("round trip of \"%.*s\" gave \"%.*s\"", (int)n, buf, (int)blen, back);
        /* the stream decoder agrees with a one-shot decode */
        wk_tok_stream st;
        wk_tok_stream_init(&st, t);
        size_t o = 0;
        char *out = malloc(n_ids * WK_TOK_STREAM_OUT_MAX + WK_TOK_STREAM_FLUSH_MAX + 1);
        for (size_t i = 0; i < n_ids; i++) {
            size_t w = 0;
            assert_int_equal(
                wk_tok_stream_push(&st, ids[i], out + o, WK_TOK_STREAM_OUT_MAX, &w, NULL), WK_OK);
            o += w;
        }
        o += wk_tok_stream_flush(&st, out + o);
        {
            char *one = malloc(3 * (n + 3) + WK_TOK_STREAM_FLUSH_MAX);
            size_t on = 0;
            wk_tok_stream_init(&st, t);
            assert_int_equal(
                wk_tok_stream_push_bytes(&st, (const uint8_t *)buf, n, one, 3 * (n + 3), &on),
                WK_OK);
            on += wk_tok_stream_flush(&st, one + on);
            assert_int_equal(o, on);
            assert_memory_equal(out, one, on);
            free(one);
        }
        free(out);
        free(ids);
        free(back);
    }
    wk_tok_free(t);
}

static void
test_hostile(void **state)
{
    (void)state;
    spec ok = {.words = {"ab"}, .merges = {"a|b"}, .skip_byte = -1};
    spec s;
    wk_tok *t = NULL;
    wk_diag d = {""};

    assert_int_equal(wk_tok_load_hf_mem("{\"model\": ", 10, NULL, 0, &t, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "tokenizer.json: line 1"));
    assert_int_equal(wk_tok_load_hf_mem("[]", 2, NULL, 0, &t, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "top level"));
    assert_int_equal(wk_tok_load_hf_mem("", 0, NULL, 0, &t, &d), WK_EINVAL);
    {
        size_t big = (size_t)WK_BPE_MAX_FILE + 1;
        char *huge = calloc(1, big);
        assert_int_equal(wk_tok_load_hf_mem(huge, big, NULL, 0, &t, &d), WK_ETOOBIG);
        free(huge);
    }
    assert_null(t);

    s = ok;
    s.pre = "{\"type\": \"Whitespace\"}";
    spec_refused(&s, WK_ENOTSUP,
                 "tokenizer.json: pre_tokenizer.type \"Whitespace\" is not "
                 "supported");
    s = ok;
    s.pre = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}]}";
    spec_refused(&s, WK_ENOTSUP, "pre_tokenizer.pretokenizers[0].type \"Digits\"");
    s = ok;
    s.pre = "null";
    spec_refused(&s, WK_ENOTSUP, "pre_tokenizer is null");
    s = ok;
    s.normalizer = "{\"type\": \"NFKC\"}";
    spec_refused(&s, WK_ENOTSUP, "normalizer.type \"NFKC\" is not supported");
    s = ok;
    s.decoder = "{\"type\": \"WordPiece\"}";
    spec_refused(&s, WK_ENOTSUP, "decoder.type \"WordPiece\"");
    s = ok;
    s.model_extra = ", \"continuing_subword_prefix\": \"##\"";
    spec_refused(&s, WK_ENOTSUP, "model.continuing_subword_prefix");
    s = ok;
    /* single_word, lstrip, rstrip: supported in byte-level mode (test_wk_pretok.c) */
    s.added = "[{\"id\": 300, \"content\": \"<x>\", \"lstrip\": 1}]";
    spec_refused(&s, WK_EINVAL, "added_tokens[0].lstrip is not a boolean");
    s = ok;
    s.added = "[{\"id\": 300, \"content\": \"<x>\"}, {\"id\": 300, \"content\": \"<y>\"}]";
    spec_refused(&s, WK_EINVAL, "added_tokens[1]: duplicate id 300");
    s = ok;
    s.added = "[{\"id\": 300, \"content\": \"<x>\"}, {\"id\": 301, \"content\": \"<x>\"}]";
    spec_refused(&s, WK_EINVAL, "is also id 300");
    s = ok;
    s.added = "[{\"id\": 1048576, \"content\": \"<x>\"}]";
    spec_refused(&s, WK_EINVAL, "added_tokens[0].id is not an integer in 0..1048575");
    s = ok;
    s.added = "[{\"id\": 300, \"content\": \"\"}]";
    spec_refused(&s, WK_EINVAL, "added_tokens[0].content has 0 bytes");
    s = ok;
    s.vocab_extra = ", \"zz\": 5";
    spec_refused(&s, WK_EINVAL, "duplicate id 5");
    s = ok;
    s.vocab_extra = ", \"zz\": -1";
    spec_refused(&s, WK_EINVAL, "model.vocab \"zz\": id is not an integer");
    s = ok;
    s.vocab_extra = ", \"a b\": 400";
    spec_refused(&s, WK_EINVAL, "model.vocab \"a b\" (id 400): character outside the byte-level");
    s = ok;
    s.vocab_extra = ", \"\\u0101\": 400"; /* byte 0x01's key again: JSON duplicate */
    spec_refused(&s, WK_EINVAL, "duplicate object key");
    s = ok;
    s.merges[0] = "a|c";
    spec_refused(&s, WK_EINVAL, "model.merges[0]: merged \"ac\" is not in the vocab");
    s = ok;
    s.merges[0] = "a|xyz";
    spec_refused(&s, WK_EINVAL, "model.merges[0]: \"xyz\" is not in the vocab");
    s = ok;
    s.skip_byte = 'q';
    spec_refused(&s, WK_EINVAL, "no token \"q\" for byte 0x71");
    s = ok;
    s.normalizer = "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, "
                   "{\"type\": \"Lowercase\"}]}";
    spec_refused(&s, WK_ENOTSUP, "Sequence of 2 normalizers");
    s = ok;
    s.normalizer = "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]}";
    t = spec_load(&s, NULL);
    wk_tok_free(t);
    t = NULL;

    /* model type and merge shape, written by hand */
    static const char *const bad[][2] = {
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}",
         "model.type \"WordPiece\" is not supported"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b c\"]}, "
         "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}}",
         "model.merges[0] is neither"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}, "
         "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}}",
         "model.merges[0] is neither"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], "
         "\"byte_fallback\": true}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, "
         "\"decoder\": {\"type\": \"ByteLevel\"}}",
         "model.byte_fallback true is not supported"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], "
         "\"dropout\": 0.5}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, "
         "\"decoder\": {\"type\": \"ByteLevel\"}}",
         "model.dropout is not supported"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, "
         "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}}",
         "model.vocab is empty"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}",
         "model.vocab is missing or not an object"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": 1}, "
         "\"decoder\": {\"type\": \"ByteLevel\"}}",
         "pre_tokenizer.add_prefix_space is not a boolean"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        d.msg[0] = '\0';
        assert_int_not_equal(wk_tok_load_hf_mem(bad[i][0], strlen(bad[i][0]), NULL, 0, &t, &d),
                             WK_OK);
        if (strstr(d.msg, bad[i][1]) == NULL)
            fail_msg("case %zu: want \"%s\", got \"%s\"", i, bad[i][1], d.msg);
        assert_null(t);
    }
}

static void
test_eos_and_digest(void **state)
{
    (void)state;
    spec s = {.words = {"</s>"}, .skip_byte = -1};
    wk_tok *t = spec_load(&s, NULL);
    char hex[WK_SHA256_HEX_LEN];
    size_t len;
    char *j = spec_json(&s, &len);
    wk_diag d = {""};

    assert_int_equal(wk_tok_eos(t), 256); /* no <|endoftext|>: </s> */
    wk_sha256_hex(j, len, hex);
    assert_string_equal(wk_tok_digest(t), hex);
    wk_tok_free(t);

    t = spec_load(&s, "{\"eos_token\": \"a\"}");
    assert_int_equal(wk_tok_eos(t), 'a');
    wk_tok_free(t);
    t = spec_load(&s, "{\"eos_token\": {\"content\": \"</s>\", \"lstrip\": false}}");
    assert_int_equal(wk_tok_eos(t), 256);
    wk_tok_free(t);
    t = spec_load(&s, "{\"eos_token\": null}");
    assert_int_equal(wk_tok_eos(t), -1);
    wk_tok_free(t);
    t = spec_load(&s, "{\"bos_token\": \"a\"}"); /* no eos_token: the defaults */
    assert_int_equal(wk_tok_eos(t), 256);
    wk_tok_free(t);
    t = NULL;
    assert_int_equal(wk_tok_load_hf_mem(j, len, "{\"eos_token\": \"<nope>\"}", 23, &t, &d),
                     WK_EINVAL);
    assert_non_null(strstr(d.msg, "tokenizer_config.json: eos_token \"<nope>\""));
    assert_int_equal(wk_tok_load_hf_mem(j, len, "{\"eos_token\": 5}", 16, &t, &d), WK_EINVAL);
    assert_int_equal(wk_tok_load_hf_mem(j, len, "nope", 4, &t, &d), WK_EINVAL);
    assert_null(t);
    free(j);

    spec none = {.words = {"xy"}, .skip_byte = -1};
    t = spec_load(&none, NULL);
    assert_int_equal(wk_tok_eos(t), -1);
    wk_tok_free(t);
}

static void
write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void
test_load_dir(void **state)
{
    (void)state;
    char dir[] = "/tmp/wk_bpe_test.XXXXXX";
    char path[256], vocab[4096];
    wk_tok *t = NULL;
    wk_diag d = {""};
    spec s = {.words = {"ab"}, .merges = {"a|b"}, .added = ADDED, .skip_byte = -1};
    size_t len;
    char *j = spec_json(&s, &len);
    const char *src = getenv("WKVM_SOURCE_DIR");

    assert_non_null(mkdtemp(dir));
    assert_int_equal(wk_tok_load_dir(dir, NULL, &t, &d), WK_ENOENT);
    assert_non_null(strstr(d.msg, "tokenizer.json"));
    assert_non_null(strstr(d.msg, "rwkv_vocab_v20230424.txt"));

    /* World only */
    snprintf(vocab, sizeof(vocab), "%s/tests/fixtures/vocab_small.txt", src ? src : ".");
    FILE *f = fopen(vocab, "rb");
    assert_non_null(f);
    char *vb = malloc(1 << 20);
    size_t vn = fread(vb, 1, 1 << 20, f);
    fclose(f);
    snprintf(path, sizeof(path), "%s/rwkv_vocab_v20230424.txt", dir);
    write_file(path, vb, vn);
    assert_int_equal(wk_tok_load_dir(dir, NULL, &t, &d), WK_OK);
    assert_string_equal(wk_tok_kind(t), "world");
    assert_int_equal(wk_tok_eos(t), 0);
    wk_tok_free(t);

    /* tokenizer.json wins, with tokenizer_config.json next to it */
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    write_file(path, j, len);
    assert_int_equal(wk_tok_load_dir(dir, NULL, &t, &d), WK_OK);
    assert_string_equal(wk_tok_kind(t), "hf-bpe");
    assert_int_equal(wk_tok_eos(t), 300);
    wk_tok_free(t);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    write_file(path, "{\"eos_token\": \"<a>\"}", 20);
    assert_int_equal(wk_tok_load_dir(dir, NULL, &t, &d), WK_OK);
    assert_int_equal(wk_tok_eos(t), 301);
    wk_tok_free(t);

    /* overrides: .json is HF, anything else World */
    snprintf(path, sizeof(path), "%s/rwkv_vocab_v20230424.txt", dir);
    assert_int_equal(wk_tok_load_dir(dir, path, &t, &d), WK_OK);
    assert_string_equal(wk_tok_kind(t), "world");
    wk_tok_free(t);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    assert_int_equal(wk_tok_load_dir("/nonexistent", path, &t, &d), WK_OK);
    assert_string_equal(wk_tok_kind(t), "hf-bpe");
    wk_tok_free(t);
    snprintf(path, sizeof(path), "%s/other.json", dir);
    write_file(path, "{", 1);
    t = NULL;
    assert_int_equal(wk_tok_load_dir(dir, path, &t, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "other.json: line 1"));
    assert_null(t);

    unlink(path);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/rwkv_vocab_v20230424.txt", dir);
    unlink(path);
    rmdir(dir);
    free(vb);
    free(j);
}

/* ---- SentencePiece-style (Llama / Mistral) mode ---- */

#define MS "\xe2\x96\x81" /* U+2581 in UTF-8 */
#define MSJ "\\u2581"     /* and as a JSON escape */
#define FB(b) (3 + (b))   /* id of "<0xXX>" in spm files */

/*
 * Components of a Llama-style tokenizer.json: <unk> <s> </s> (ids 0..2), the
 * 256 "<0xXX>" tokens (3..258) from byte 0 to bytes - 1, then 259 "▁", 260
 * "a", 261 "b", 262 "h", 263 "i", 264 "▁a", 265 "▁h", 266 "hi", 267 "▁hi",
 * 268 "é", 269 "x", 270 "▁▁"; merges ▁+a, ▁+h, h+i, ▁h+i, ▁+▁. Added:
 * the three specials and the normalized "hi b" (271).
 */
typedef struct spm_spec {
    const char *normalizer; /* raw JSON, NULL: the Llama-2 Sequence[Prepend, Replace] */
    const char *pre;        /* raw JSON, NULL: null */
    const char *decoder;    /* raw JSON, NULL: Sequence[Replace, ByteFallback, Fuse, Strip] */
    const char *model;      /* raw JSON model flags, NULL: byte_fallback, unk, fuse_unk */
    int bytes;              /* byte tokens 0..bytes-1; 0 means all 256 */
} spm_spec;

#define SPM_NORM                                                                                   \
    "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"" MSJ      \
    "\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"" MSJ "\"}]}"
#define SPM_DEC                                                                                    \
    "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": "  \
    "\"" MSJ "\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, "     \
    "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}"
#define SPM_META(scheme, split)                                                                    \
    "{\"type\": \"Metaspace\", \"replacement\": \"" MSJ "\", \"prepend_scheme\": \"" scheme       \
    "\", \"split\": " split "}"

static char *
spm_json(const spm_spec *sp, size_t *len)
{
    tbuf b = {0};
    static const char *const words[] = {MS,      "a",     "b",      "h",         "i",
                                         MS "a", MS "h",  "hi",     MS "hi",     "\xc3\xa9",
                                         "x",    MS MS};
    int nb = sp->bytes ? sp->bytes : 256;

    tbuf_fmt(&b, "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n");
    tbuf_fmt(&b, "\"added_tokens\": [");
    static const char *const sp_tok[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++)
        tbuf_fmt(&b,
                 "{\"id\": %d, \"content\": \"%s\", \"single_word\": false, \"lstrip\": false, "
                 "\"rstrip\": false, \"normalized\": false, \"special\": true}, ",
                 i, sp_tok[i]);
    tbuf_fmt(&b,
             "{\"id\": 271, \"content\": \"hi b\", \"normalized\": true, \"special\": false}],\n");
    tbuf_fmt(&b, "\"normalizer\": %s,\n", sp->normalizer ? sp->normalizer : SPM_NORM);
    tbuf_fmt(&b, "\"pre_tokenizer\": %s,\n", sp->pre ? sp->pre : "null");
    tbuf_fmt(&b,
             "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [], \"pair\": [], "
             "\"special_tokens\": {}},\n\"decoder\": %s,\n",
             sp->decoder ? sp->decoder : SPM_DEC);
    tbuf_fmt(&b, "\"model\": {\"type\": \"BPE\", \"dropout\": null, %s, \"vocab\": {",
             sp->model ? sp->model
                       : "\"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true");
    tbuf_fmt(&b, "\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2");
    for (int c = 0; c < nb; c++)
        tbuf_fmt(&b, ", \"<0x%02X>\": %d", c, FB(c));
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        tbuf_fmt(&b, ", \"%s\": %zu", words[i], 259 + i);
    tbuf_fmt(&b, "},\n\"merges\": [\"" MS " a\", [\"" MS "\", \"h\"], \"h i\", \"" MS "h i\", "
                 "\"" MS " " MS "\"]}}\n");
    *len = b.len;
    return b.p;
}

static wk_tok *
spm_load(const spm_spec *sp, const char *cfg)
{
    size_t len;
    char *j = spm_json(sp, &len);
    wk_tok *t = NULL;
    wk_diag d = {""};

    if (wk_tok_load_hf_mem(j, len, cfg, cfg ? strlen(cfg) : 0, &t, &d) != WK_OK)
        fail_msg("load failed: %s\n%s", d.msg, j);
    free(j);
    return t;
}

static void
spm_refused(const spm_spec *sp, wk_err err, const char *want)
{
    size_t len;
    char *j = spm_json(sp, &len);
    wk_tok *t = NULL;
    wk_diag d = {""};
    wk_err got = wk_tok_load_hf_mem(j, len, NULL, 0, &t, &d);

    if (got != err || strstr(d.msg, want) == NULL)
        fail_msg("want %s \"%s\", got %s \"%s\"", wk_err_name(err), want, wk_err_name(got), d.msg);
    assert_null(t);
    free(j);
}

/* Expects wk_tok_piece(t, id) to be want. */
static void
piece_eq(const wk_tok *t, int32_t id, const char *want)
{
    size_t n = 0;
    const uint8_t *p = wk_tok_piece(t, id, &n);
    assert_non_null(p);
    if (n != strlen(want) || memcmp(p, want, n) != 0)
        fail_msg("piece %d: got \"%.*s\", want \"%s\"", (int)id, (int)n, p, want);
}

/* Expects decode(encode(s)) to be want. */
static void
round_trip_eq(const wk_tok *t, const char *s, const char *want)
{
    int32_t *ids = NULL;
    size_t n = 0, bl = 0;
    char *back = NULL;

    assert_int_equal(wk_tok_encode(t, s, strlen(s), &ids, &n, NULL), WK_OK);
    assert_int_equal(wk_tok_decode(t, ids, n, &back, &bl, NULL), WK_OK);
    if (bl != strlen(want) || memcmp(back, want, bl) != 0)
        fail_msg("round trip \"%s\": got \"%.*s\", want \"%s\"", s, (int)bl, back, want);
    free(ids);
    free(back);
}

static void
test_spm_llama2(void **state)
{
    (void)state;
    spm_spec sp = {0};
    wk_tok *t = spm_load(&sp, "{\"eos_token\": \"</s>\"}");

    assert_string_equal(wk_tok_kind(t), "hf-spm");
    assert_int_equal(wk_tok_eos(t), 2);
    assert_int_equal(wk_tok_vocab_size(t), 272);
    assert_int_equal(wk_tok_count(t), 272);
    /* Prepend + Replace, then merges by rank over the one word */
    ENC(t, "hi", 267);
    ENC(t, "a hi", 264, 267);
    enc_eq(t, "", 0, 0);
    /* a leading space is kept: "▁▁hi" -> ▁ + ▁hi (▁h outranks ▁▁) */
    ENC(t, " hi", 259, 267);
    /* space runs: "▁▁▁a" -> ▁a first, then ▁▁ */
    ENC(t, "  a", 270, 264);
    ENC(t, "a   ", 264, 270, 259);
    /* byte fallback: "c" and "€" are no vocab characters; é is */
    ENC(t, "c", 259, FB('c'));
    ENC(t, "\xe2\x82\xac", 259, FB(0xe2), FB(0x82), FB(0xac));
    ENC(t, "\xc3\xa9", 259, 268);
    /* a byte outside UTF-8 is a character of its own, falling back to itself */
    ENC(t, "\xff" "a", 259, FB(0xff), 260);
    /* a literal U+2581 in the text is the same as a space */
    ENC(t, MS "hi", 259, 267);
    /* special tokens split the text; each piece of text gets its own ▁ */
    ENC(t, "<s>hi", 1, 267);
    ENC(t, "a<s>hi</s>", 264, 1, 267, 2);
    ENC(t, "</s>", 2);
    ENC(t, "<unk>", 0);
    /* a normalized added token is matched in normalized text: "hi b" is "▁hi▁b" */
    ENC(t, "x hi b", 259, 269, 271);
    ENC(t, "hi b", 271);
    ENC(t, "xhi b", 259, 269, 266, 259, 261);

    /* pieces are real bytes */
    piece_eq(t, 259, " ");
    piece_eq(t, 267, " hi");
    piece_eq(t, 270, "  ");
    piece_eq(t, FB('c'), "c");
    {
        size_t n0 = 0;
        const uint8_t *p0 = wk_tok_piece(t, FB(0), &n0);
        assert_non_null(p0);
        assert_int_equal(n0, 1);
        assert_int_equal(p0[0], 0);
    }
    piece_eq(t, 1, "<s>");
    piece_eq(t, 0, "<unk>");
    piece_eq(t, 271, " hi b");

    /* decode drops the one leading space encode put in front */
    round_trip_eq(t, "hi", "hi");
    round_trip_eq(t, "a hi \xe2\x82\xac c", "a hi \xe2\x82\xac c");
    round_trip_eq(t, " hi", " hi");
    round_trip_eq(t, "  a", "  a");
    round_trip_eq(t, "x hi b", "x hi b");
    round_trip_eq(t, "\xff" "ab", "\xff" "ab");
    /* after a special token the added space stays, as in the library */
    round_trip_eq(t, "a<s>hi", "a<s> hi");

    /* the stream decoder does not strip: the first piece's space shows */
    {
        int32_t ids[] = {264, FB(0xe2), FB(0x82), FB(0xac)};
        wk_tok_stream st;
        char out[WK_TOK_STREAM_OUT_MAX], all[64];
        size_t o = 0, got;
        wk_tok_stream_init(&st, t);
        for (size_t i = 0; i < 4; i++) {
            assert_int_equal(wk_tok_stream_push(&st, ids[i], out, sizeof(out), &got, NULL), WK_OK);
            if (i == 1 || i == 2)
                assert_int_equal(got, 0); /* half a character is held back */
            memcpy(all + o, out, got);
            o += got;
        }
        o += wk_tok_stream_flush(&st, all + o);
        assert_int_equal(o, 5);
        assert_memory_equal(all, " a\xe2\x82\xac", 5);
    }
    wk_tok_free(t);
}

static void
test_spm_unk(void **state)
{
    (void)state;
    /* no byte fallback: unknown characters are <unk>, fused or not */
    spm_spec fused = {.model = "\"unk_token\": \"<unk>\", \"fuse_unk\": true, "
                               "\"byte_fallback\": false"};
    spm_spec apart = {.model = "\"unk_token\": \"<unk>\", \"fuse_unk\": false, "
                               "\"byte_fallback\": false"};
    /* fallback only for ASCII: other characters are unk; as in the library, a
     * pending unk waits for the next vocab character, so fallback bytes pass it */
    spm_spec ascii = {.bytes = 128};
    wk_tok *tf = spm_load(&fused, NULL), *ta = spm_load(&apart, NULL), *tb = spm_load(&ascii, NULL);

    ENC(tf, "cc", 259, 0);
    ENC(tf, "acca", 264, 0, 260);
    ENC(ta, "cc", 259, 0, 0);
    ENC(ta, "acca", 264, 0, 0, 260);
    ENC(tb, "c", 259, FB('c'));
    ENC(tb, "\xe2\x82\xac" "c" "\xe2\x82\xac\xe2\x82\xac", 259, FB('c'), 0);
    ENC(tb, "\xe2\x82\xac" "a", 259, 0, 260);
    /* eos without a config: </s> */
    assert_int_equal(wk_tok_eos(tb), 2);
    wk_tok_free(tf);
    wk_tok_free(ta);
    wk_tok_free(tb);
}

static void
test_spm_metaspace(void **state)
{
    (void)state;
    spm_spec first = {.normalizer = "null", .pre = SPM_META("first", "false")};
    spm_spec always = {.normalizer = "null",
                       .pre = "{\"type\": \"Metaspace\", \"replacement\": \"" MSJ
                              "\", \"add_prefix_space\": true}",
                       .decoder = SPM_META("always", "true")};
    spm_spec never = {.normalizer = "null", .pre = SPM_META("never", "true"),
                      .decoder = SPM_META("never", "true")};
    wk_tok *tf = spm_load(&first, NULL), *ta = spm_load(&always, NULL),
           *tn = spm_load(&never, NULL);

    assert_string_equal(wk_tok_kind(tf), "hf-spm");
    /* "first": only the text at offset 0 gets the mark, and not when it has one */
    ENC(tf, "hi", 267);
    ENC(tf, " hi", 267);
    ENC(tf, "<s>hi", 1, 266);
    ENC(tf, "a<s>hi", 264, 1, 266);
    /* no split: "hi b" (normalized added token) is matched in the raw text */
    ENC(tf, "x hi b", 259, 269, 259, 271);
    /* "always" (old add_prefix_space spelling), split at every mark */
    ENC(ta, "<s>hi", 1, 267);
    ENC(ta, "a  hi", 264, 259, 267);
    /* "never" */
    ENC(tn, "hi", 266);
    ENC(tn, "a hi", 260, 267);
    round_trip_eq(tf, "hi a", "hi a");
    round_trip_eq(tf, " hi", "hi"); /* the library loses it too */
    round_trip_eq(tn, " hi", " hi");
    wk_tok_free(tf);
    wk_tok_free(ta);
    wk_tok_free(tn);
}

static void
test_spm_hostile(void **state)
{
    (void)state;
    static const struct {
        spm_spec sp;
        wk_err err;
        const char *want;
    } cases[] = {
        {{.normalizer = "null"}, WK_ENOTSUP, "pre_tokenizer is null, which is supported only"},
        {{.normalizer = "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", "
                        "\"prepend\": \"_\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": "
                        "\" \"}, \"content\": \"" MSJ "\"}]}"},
         WK_ENOTSUP, "pre_tokenizer is null"},
        {{.normalizer = "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", "
                        "\"prepend\": \"" MSJ "\"}, {\"type\": \"Replace\", \"pattern\": "
                        "{\"Regex\": \" \"}, \"content\": \"" MSJ "\"}]}"},
         WK_ENOTSUP, "pre_tokenizer is null"},
        {{.normalizer = "{\"type\": \"NFC\"}", .pre = SPM_META("first", "false")},
         WK_ENOTSUP, "normalizer must be null with a Metaspace"},
        {{.normalizer = "null",
          .pre = "{\"type\": \"Metaspace\", \"replacement\": \"_\", "
                 "\"prepend_scheme\": \"first\"}"},
         WK_ENOTSUP, "pre_tokenizer.replacement must be"},
        {{.normalizer = "null", .pre = SPM_META("sometimes", "false")},
         WK_EINVAL, "pre_tokenizer.prepend_scheme \"sometimes\""},
        {{.normalizer = "null",
          .pre = "{\"type\": \"Metaspace\", \"replacement\": \"" MSJ
                 "\", \"prepend_scheme\": \"first\", \"add_prefix_space\": false}"},
         WK_EINVAL, "add_prefix_space does not match"},
        {{.normalizer = "null", .pre = SPM_META("first", "1")},
         WK_EINVAL, "pre_tokenizer.split is not a boolean"},
        {{.decoder = "{\"type\": \"ByteLevel\"}"}, WK_ENOTSUP, "decoder.type \"ByteLevel\""},
        {{.decoder = "null"}, WK_ENOTSUP, "decoder is null"},
        {{.decoder = "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, "
                     "{\"type\": \"Fuse\"}]}"},
         WK_ENOTSUP, "only the Sequence"},
        {{.decoder = "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", "
                     "\"pattern\": {\"String\": \"" MSJ "\"}, \"content\": \" \"}, {\"type\": "
                     "\"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", "
                     "\"content\": \" \", \"start\": 2, \"stop\": 0}]}"},
         WK_ENOTSUP, "decoder.decoders[3]"},
        {{.model = "\"unk_token\": \"<nope>\", \"byte_fallback\": true"},
         WK_EINVAL, "model.unk_token \"<nope>\" is not in model.vocab"},
        {{.model = "\"unk_token\": null, \"byte_fallback\": false"},
         WK_EINVAL, "neither byte_fallback nor an unk_token"},
        {{.model = "\"unk_token\": null, \"byte_fallback\": true", .bytes = 128},
         WK_EINVAL, "no token \"<0x80>\" for byte_fallback"},
        {{.model = "\"unk_token\": \"<unk>\", \"fuse_unk\": 1"},
         WK_EINVAL, "model.fuse_unk is not a boolean"},
        {{.model = "\"unk_token\": 7"}, WK_EINVAL, "model.unk_token is not a string"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        spm_refused(&cases[i].sp, cases[i].err, cases[i].want);

    /* all byte tokens, no unk: fine */
    spm_spec ok = {.model = "\"unk_token\": null, \"byte_fallback\": true"};
    wk_tok *t = spm_load(&ok, NULL);
    ENC(t, "c", 259, FB('c'));
    wk_tok_free(t);
}

/* A long text is one word in the Llama-2 form: the heap keeps it O(n log n). */
static void
test_spm_long(void **state)
{
    (void)state;
    spm_spec sp = {0};
    wk_tok *t = spm_load(&sp, NULL);
    size_t n = 1 << 20;
    char *s = malloc(n);
    int32_t *ids = NULL;
    size_t n_ids = 0;

    assert_non_null(s);
    for (size_t i = 0; i < n; i += 3)
        memcpy(s + i, "hi ", i + 3 <= n ? 3 : n - i);
    assert_int_equal(wk_tok_encode(t, s, n, &ids, &n_ids, NULL), WK_OK);
    /* "▁hi" per "hi ", the last one cut to "h" (2^20 = 3 * 349525 + 1): "▁h" */
    assert_int_equal(n_ids, (n + 2) / 3);
    for (size_t i = 0; i + 1 < n_ids; i++)
        assert_int_equal(ids[i], 267);
    assert_int_equal(ids[n_ids - 1], 265);
    free(ids);
    free(s);
    wk_tok_free(t);
}

/* ---- continuation: wk_tok_encode_continue and wk_tok_text_prefix ---- */

/* Encodes text[start..] as a continuation (wk_tok_encode_continue) and compares with n ids. */
static void
cont_eq(const wk_tok *t, const char *s, size_t slen, size_t start, size_t n, ...)
{
    int32_t *ids = NULL;
    size_t n_ids = 0;
    wk_diag d = {""};
    va_list ap;

    assert_int_equal(wk_tok_encode_continue(t, s, slen, start, &ids, &n_ids, &d), WK_OK);
    assert_non_null(ids);
    va_start(ap, n);
    bool ok = n_ids == n;
    for (size_t i = 0; ok && i < n; i++)
        ok = ids[i] == va_arg(ap, int);
    va_end(ap);
    if (!ok) {
        char got[1024] = "";
        size_t o = 0;
        for (size_t i = 0; i < n_ids && o < 1000; i++)
            o += (size_t)snprintf(got + o, sizeof(got) - o, " %d", (int)ids[i]);
        fail_msg("continue \"%.*s\" at %zu: got [%s ], want %zu ids", (int)slen, s, start, got,
                 n);
    }
    free(ids);
}

#define CONT(t, s, start, ...)                                                                     \
    cont_eq((t), (s), sizeof(s) - 1, (start), sizeof((int[]){__VA_ARGS__}) / sizeof(int),         \
            __VA_ARGS__)
#define CONT0(t, s, start) cont_eq((t), (s), sizeof(s) - 1, (start), 0, 0)

/* Expects wk_tok_text_prefix(ids, text) to cover want bytes (-1: no match). */
static void
tp_eq(const wk_tok *t, const int32_t *ids, size_t n, int32_t hidden, const char *text, long want)
{
    size_t got = 12345;
    bool ok = wk_tok_text_prefix(t, ids, n, hidden, text, strlen(text), &got);
    if (want < 0 && ok)
        fail_msg("text prefix of \"%s\": matched %zu bytes, want a mismatch", text, got);
    if (want >= 0 && (!ok || got != (size_t)want))
        fail_msg("text prefix of \"%s\": %s %zu, want %ld bytes", text, ok ? "got" : "no match",
                 ok ? got : 0, want);
    if (!ok)
        assert_int_equal(got, 12345); /* untouched on a mismatch */
}

#define TP(t, hidden, text, want, ...)                                                             \
    tp_eq((t), (const int32_t[]){__VA_ARGS__}, sizeof((int32_t[]){__VA_ARGS__}) / sizeof(int32_t), \
          (hidden), (text), (want))

/*
 * The contract's round trip: encode a first part, then for every split point
 * k after it the kept tokens cover exactly text[0..k) (text_prefix), and
 * kept + continue(text, k) read as the whole text; when the split falls
 * where the whole encoding splits too, the tokens equal the whole encoding.
 */
static void
cont_round_trip(const wk_tok *t, const char *text, size_t k, bool same_as_whole)
{
    int32_t *kept = NULL, *rest = NULL, *whole = NULL;
    size_t nk = 0, nr = 0, nw = 0, covered = 0, len = strlen(text);

    assert_int_equal(wk_tok_encode(t, text, k, &kept, &nk, NULL), WK_OK);
    if (!wk_tok_text_prefix(t, kept, nk, -1, text, len, &covered) || covered != k)
        fail_msg("\"%s\": kept tokens of %zu bytes cover %zu", text, k, covered);
    assert_int_equal(wk_tok_encode_continue(t, text, len, k, &rest, &nr, NULL), WK_OK);
    int32_t *all = malloc((nk + nr + 1) * sizeof(*all));
    assert_non_null(all);
    memcpy(all, kept, nk * sizeof(*all));
    memcpy(all + nk, rest, nr * sizeof(*all));
    if (!wk_tok_text_prefix(t, all, nk + nr, -1, text, len, &covered) || covered != len)
        fail_msg("\"%s\" split at %zu: kept + continuation cover %zu of %zu", text, k, covered,
                 len);
    assert_int_equal(wk_tok_encode(t, text, len, &whole, &nw, NULL), WK_OK);
    if (same_as_whole && (nw != nk + nr || memcmp(whole, all, nw * sizeof(*all)) != 0))
        fail_msg("\"%s\" split at %zu: kept + continuation differ from the whole encoding", text,
                 k);
    free(all);
    free(kept);
    free(rest);
    free(whole);
}

static void
test_spm_continue_llama2(void **state)
{
    (void)state;
    spm_spec sp = {0};
    wk_tok *t = spm_load(&sp, "{\"eos_token\": \"</s>\"}");

    /* start 0 is a plain encode */
    CONT(t, "hi", 0, 267);
    CONT(t, "a hi", 0, 264, 267);
    /* mid-text: no Prepend, spaces still become ▁ */
    CONT(t, "a hi", 1, 267);
    CONT(t, "ahi", 1, 266);
    CONT(t, "hi  a", 2, 259, 264); /* "▁▁a": ▁a outranks ▁▁ */
    ENC(t, "ahi", 264, 266); /* the whole text splits the same way */
    CONT0(t, "hi", 2);
    /* after a non-normalized added token the whole text starts a new run: Prepend */
    CONT(t, "a<s>hi", 4, 267);
    CONT(t, "a</s>hi", 5, 267);
    ENC(t, "a</s>hi", 264, 2, 267);
    /* a delta that starts with an added token, and one inside the delta */
    CONT(t, "ab<s>hi", 2, 1, 267);
    CONT(t, "ahi<s>hi", 1, 266, 1, 267);
    /* a normalized added token is part of its gap in this form: no new run after it */
    CONT(t, "x hi bhi", 6, 266);
    /* ...and is matched in the delta's normalized text without a ▁ in front */
    CONT(t, "ax hi b", 1, 269, 271);
    CONT(t, "a hi b", 1, 271);
    /* an added token cut by start is none (a boundary effect, as for any split) */
    CONT(t, "a<s>hi", 2, FB('s'), FB('>'), 266);
    {
        int32_t *ids = NULL;
        size_t n = 0;
        wk_diag d = {""};
        assert_int_equal(wk_tok_encode_continue(t, "hi", 2, 3, &ids, &n, &d), WK_EINVAL);
        assert_null(ids);
    }

    /* text prefix: the Prepend's space at the start of the text is not in it */
    TP(t, -1, "hi there", 2, 267);
    TP(t, -1, "a hi b", 4, 264, 267);
    TP(t, -1, " hi", 3, 259, 267); /* encode(" hi"): "▁▁hi", the first ▁ is the Prepend */
    TP(t, -1, " hi", -1, 267);     /* "▁hi" at the start means "hi", not " hi" */
    /* nor after a non-normalized added token */
    TP(t, -1, "<s>hi", 5, 1, 267);
    TP(t, -1, "a<s>hi!", 6, 264, 1, 267);
    TP(t, -1, "a<s> hi", -1, 264, 1, 267);
    /* a normalized added token at the start carries the Prepend; mid-run its space is real */
    TP(t, -1, "hi b", 4, 271);
    TP(t, -1, "x hi b", 6, 259, 269, 271);
    /* a hidden end-of-text is skipped and the text goes on: its next space is real */
    TP(t, 2, "a hi", 4, 264, 2, 267);
    TP(t, 2, "ahi", -1, 264, 2, 267);
    TP(t, -1, "a hi", -1, 264, 2, 267); /* not hidden: "</s>" is text */
    /* real misses stay misses */
    TP(t, -1, "b", -1, 264);
    TP(t, -1, "ab", -1, 264, 261, 260);
    TP(t, -1, "a", -1, 264, 267);
    TP(t, -1, "hi", -1, 9999);
    TP(t, -1, "", 0, 259); /* "▁" alone at the start: the Prepend of an empty-looking text */
    {
        size_t got = 7;
        assert_true(wk_tok_text_prefix(t, NULL, 0, -1, "x", 1, &got));
        assert_int_equal(got, 0);
    }

    /* round trips: split after the first part, and the delta is the rest */
    cont_round_trip(t, "a hi", 1, true);
    cont_round_trip(t, "a hi", 2, false);
    cont_round_trip(t, "hi hi a", 2, true);
    cont_round_trip(t, "hi hi a", 3, false); /* "▁hi▁" + "hi▁a": a BPE boundary */
    cont_round_trip(t, "hi<s>hi", 5, true);
    cont_round_trip(t, "hi<s> hi", 5, true);
    cont_round_trip(t, "x \xe2\x82\xac c", 2, true);
    cont_round_trip(t, "x \xe2\x82\xac c", 5, true);
    wk_tok_free(t);
}

static void
test_spm_continue_metaspace(void **state)
{
    (void)state;
    spm_spec first = {.normalizer = "null", .pre = SPM_META("first", "false")};
    spm_spec always = {.normalizer = "null", .pre = SPM_META("always", "true"),
                       .decoder = SPM_META("always", "true")};
    spm_spec never = {.normalizer = "null", .pre = SPM_META("never", "true"),
                      .decoder = SPM_META("never", "true")};
    wk_tok *tf = spm_load(&first, NULL), *ta = spm_load(&always, NULL),
           *tn = spm_load(&never, NULL);

    /* "first": only offset 0 is marked, so a continuation never is */
    CONT(tf, "hi", 0, 267);
    CONT(tf, "a hi", 1, 267);
    CONT(tf, "ahi", 1, 266);
    CONT(tf, "a<s>hi", 4, 266);
    ENC(tf, "a<s>hi", 264, 1, 266);
    TP(tf, -1, "hi", 2, 267);
    TP(tf, -1, " hi", 3, 267); /* the text's own space: Metaspace marked nothing */
    TP(tf, -1, "<s>hi", 5, 1, 266);
    TP(tf, -1, "<s>hi", -1, 1, 267);
    cont_round_trip(tf, "hi a hi", 2, true);
    cont_round_trip(tf, "hi<s>hi", 2, true);

    /* "always": a new run after every added token, normalized ones too */
    CONT(ta, "ahi", 1, 266);
    CONT(ta, "a hi", 1, 267);
    CONT(ta, "a<s>hi", 4, 267);
    CONT(ta, "a<s> hi", 4, 267);
    CONT(ta, "xhi bhi", 5, 267);
    ENC(ta, "xhi bhi", 259, 269, 271, 267);
    TP(ta, -1, "<s>hi", 5, 1, 267);
    TP(ta, -1, "<s> hi", 6, 1, 267);
    TP(ta, -1, "xhi bhi", 7, 259, 269, 271, 267);
    TP(ta, -1, "xhi b hi", 8, 259, 269, 271, 267);
    TP(ta, 2, "ahi", -1, 264, 2, 267); /* a hidden end-of-text starts no run */
    cont_round_trip(ta, "a<s>hi", 4, true);
    cont_round_trip(ta, "xhi bhi", 5, true);

    /* "never": nothing to undo */
    CONT(tn, "hi", 0, 266);
    CONT(tn, "a hi", 1, 267);
    TP(tn, -1, "hi", 2, 266);
    TP(tn, -1, "hi", -1, 267);
    TP(tn, -1, " hi", 3, 267);
    wk_tok_free(tf);
    wk_tok_free(ta);
    wk_tok_free(tn);
}

/* World-like kinds keep the plain rule: hf-bpe continues as a separate encode. */
static void
test_bpe_continue_plain(void **state)
{
    (void)state;
    spec s = {.words = {" h", " hi", "hi"},
              .merges = {" |h", " h|i", "h|i"},
              .added = ADDED,
              .pre = "{\"type\": \"ByteLevel\", \"add_prefix_space\": true}",
              .skip_byte = -1};
    wk_tok *t = spec_load(&s, NULL);

    /* add_prefix_space applies to the delta, exactly as wk_tok_encode() of it */
    CONT(t, "ahi", 1, 257);
    ENC(t, "hi", 257);
    CONT(t, "a hi", 1, 257);
    TP(t, -1, "hi", -1, 257); /* pieces as they are: " hi" */
    TP(t, -1, " hi!", 3, 257);
    TP(t, 300, " hi", 3, 257, 300);
    wk_tok_free(t);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_order),  cmocka_unit_test(test_merge_chain),
        cmocka_unit_test(test_long_word),    cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_prefix_space), cmocka_unit_test(test_regex_split),
        cmocka_unit_test(test_nfc),          cmocka_unit_test(test_nfc_long_run),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_hostile),      cmocka_unit_test(test_eos_and_digest),
        cmocka_unit_test(test_load_dir),     cmocka_unit_test(test_spm_llama2),
        cmocka_unit_test(test_spm_unk),      cmocka_unit_test(test_spm_metaspace),
        cmocka_unit_test(test_spm_hostile),  cmocka_unit_test(test_spm_long),
        cmocka_unit_test(test_spm_continue_llama2),
        cmocka_unit_test(test_spm_continue_metaspace),
        cmocka_unit_test(test_bpe_continue_plain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
