/*
 * libFuzzer harness for wk_tok and wk_chat. The input is split at its first
 * blank line ("\n\n"): the part before is a vocab file, the part after is
 * text. If the first byte is odd, the 256 single-byte lines are prepended to
 * the vocab so that many inputs load and the encoder gets exercised; if it is
 * even, the vocab is used as is (the parser's refusals get exercised).
 * On a successful load the text is encoded, decoded (must give the text
 * back), every id must be defined, and the ids are streamed through the
 * UTF-8 decoder, which must agree with a one-shot decode of the same bytes and
 * produce well-formed UTF-8. The text also goes through wk_chat_clean,
 * wk_chat_render and wk_chat_stop_scan, whose invariants are checked.
 */
/* fuzz-sources: common/util/wk_err.c common/util/wk_sha256.c common/text/wk_tok.c common/text/wk_bpe.c common/text/wk_pretok.c common/text/wk_chat.c */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_chat.h"
#include "wk_tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
fuzz_check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_tok: invariant failed: %s\n", what);
        abort();
    }
}

/* Streams ids and returns the malloc'd text; *len its length. */
static char *
fuzz_stream_ids(const wk_tok *t, const int32_t *ids, size_t n, size_t *len)
{
    wk_tok_stream s;
    char buf[WK_TOK_STREAM_OUT_MAX];
    size_t cap = 3 * n * 8 + 16, o = 0, got;
    char *out = malloc(cap);

    fuzz_check(out != NULL, "malloc");
    wk_tok_stream_init(&s, t);
    for (size_t i = 0; i < n; i++) {
        fuzz_check(wk_tok_stream_push(&s, ids[i], buf, sizeof(buf), &got, NULL) == WK_OK,
                   "stream push");
        if (o + got + 8 > cap) {
            cap = (o + got + 8) * 2;
            out = realloc(out, cap);
            fuzz_check(out != NULL, "realloc");
        }
        memcpy(out + o, buf, got);
        o += got;
    }
    o += wk_tok_stream_flush(&s, out + o);
    *len = o;
    return out;
}

/* One-shot stream decode of raw bytes (no vocab). */
static char *
fuzz_stream_bytes(const uint8_t *b, size_t n, size_t *len)
{
    wk_tok_stream s;
    size_t got;
    char *out = malloc(3 * (n + 3) + 3);

    fuzz_check(out != NULL, "malloc");
    wk_tok_stream_init(&s, NULL);
    fuzz_check(wk_tok_stream_push_bytes(&s, b, n, out, 3 * (n + 3), &got) == WK_OK,
               "push_bytes");
    got += wk_tok_stream_flush(&s, out + got);
    *len = got;
    return out;
}

static void
fuzz_chat(const uint8_t *text, size_t len)
{
    char *clean = NULL, *prompt = NULL;
    size_t plen = 0;
    wk_chat_stop r;
    const char *const stops[] = {"\n\n", "ab", "", "User:"};
    wk_chat_msg m[2] = {{.role = "system", .content = "s"}, {.role = "user"}};

    fuzz_check(wk_chat_clean((const char *)text, len, &clean) == WK_OK, "clean");
    size_t cl = strlen(clean);
    fuzz_check(strchr(clean, '\r') == NULL, "clean: no CR");
    fuzz_check(strstr(clean, "\n\n") == NULL, "clean: no blank line");
    fuzz_check(cl == 0 || (clean[0] != ' ' && clean[0] != '\n' && clean[cl - 1] != ' ' &&
                           clean[cl - 1] != '\n' && clean[cl - 1] != '\t'),
               "clean: stripped");
    fuzz_check(cl <= len, "clean: not longer");
    m[1].content = (const char *)text;
    m[1].content_len = len;
    if (len > 0) {
        fuzz_check(wk_chat_render(m, 2, true, &prompt, &plen, NULL) == WK_OK, "render");
        fuzz_check(plen == strlen("System: s\n\nUser: ") + cl + strlen("\n\nAssistant:"),
                   "render: length");
        fuzz_check(memcmp(prompt + strlen("System: s\n\nUser: "), clean, cl) == 0,
                   "render: content");
        free(prompt);
    }
    free(clean);
    for (size_t k = 0; k <= 4; k++) {
        wk_chat_stop_scan((const char *)text, len, k ? stops : NULL, k, &r);
        fuzz_check(r.safe_len <= len, "stop: safe_len");
        if (r.found) {
            const char *s = k ? stops[r.stop_index] : WK_CHAT_STOP_DEFAULT;
            fuzz_check(r.match_pos == r.safe_len, "stop: pos");
            fuzz_check(r.match_pos + strlen(s) <= len, "stop: bounds");
            fuzz_check(memcmp(text + r.match_pos, s, strlen(s)) == 0, "stop: match");
        } else {
            fuzz_check(len - r.safe_len < 5, "stop: held back");
        }
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *sep;
    size_t vlen, tlen;
    const uint8_t *text;
    uint8_t *vocab;
    size_t off = 0;
    wk_tok *t = NULL;
    wk_diag d = {""};
    int32_t *ids = NULL;
    size_t n_ids = 0;

    if (size == 0)
        return 0;
    sep = memmem(data + 1, size - 1, "\n\n", 2);
    vlen = sep ? (size_t)(sep - data) - 1 : size - 1; /* vocab: data[1..sep) */
    text = sep ? sep + 2 : data + size;
    tlen = (size_t)(data + size - text);
    fuzz_chat(text, tlen);

    vocab = malloc(256 * 16 + vlen + 1);
    fuzz_check(vocab != NULL, "malloc");
    if (data[0] & 1) {
        for (int c = 0; c < 256; c++)
            off += (size_t)sprintf((char *)vocab + off, "%d b'\\x%02x' 1\n", c + 1, c);
    }
    memcpy(vocab + off, data + 1, vlen);
    off += vlen; /* a last line without a newline is accepted */
    if (wk_tok_load_mem(vocab, off, &t, &d) != WK_OK) {
        fuzz_check(strncmp(d.msg, "vocab", 5) == 0, "diag set on failure");
        free(vocab);
        return 0;
    }
    free(vocab);
    fuzz_check(wk_tok_vocab_size(t) >= 257 && strlen(wk_tok_digest(t)) == 64, "loaded");

    fuzz_check(wk_tok_encode(t, (const char *)text, tlen, &ids, &n_ids, NULL) == WK_OK,
               "encode");
    fuzz_check(n_ids <= tlen, "encode: at most one id per byte");
    for (size_t i = 0; i < n_ids; i++) {
        size_t pl;
        fuzz_check(ids[i] > 0 && wk_tok_piece(t, ids[i], &pl) != NULL && pl > 0,
                   "encode: defined ids");
    }
    {
        char *back = NULL;
        size_t blen = 0;
        fuzz_check(wk_tok_decode(t, ids, n_ids, &back, &blen, NULL) == WK_OK, "decode");
        fuzz_check(blen == tlen && memcmp(back, text, tlen) == 0, "round trip");
        fuzz_check(back[blen] == '\0', "decode: NUL-terminated");
        free(back);
    }
    {
        size_t sl, ol, rl;
        char *streamed = fuzz_stream_ids(t, ids, n_ids, &sl);
        char *oneshot = fuzz_stream_bytes(text, tlen, &ol);
        char *again = fuzz_stream_bytes((const uint8_t *)streamed, sl, &rl);
        fuzz_check(sl == ol && memcmp(streamed, oneshot, sl) == 0, "stream = one shot");
        fuzz_check(rl == sl && memcmp(again, streamed, sl) == 0, "stream output is UTF-8");
        free(streamed);
        free(oneshot);
        free(again);
    }
    free(ids);
    wk_tok_free(t);
    return 0;
}
