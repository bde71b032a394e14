/*
 * libFuzzer harness for the regex pre-tokenizer (wk_pretok): the input is
 * split at its first NUL byte, the part before is a pre_tokenizer JSON
 * (patterns from a hostile file), the part after is text. If the first byte
 * is odd, the JSON part is taken as the body of one Split pattern inside a
 * Qwen-style Sequence (so the fuzzer spends its time on PCRE2 syntax and the
 * Oniguruma screen, with the behavior chosen by the byte's value), else as
 * the whole pre_tokenizer. On a successful load the text is split: every
 * word must be non-empty and lie inside the text, words must come in order
 * without overlap, and when no stage removes anything (no "Removed" in the
 * JSON, and no \u escape that could spell it) they must cover the text
 * exactly. A failed split may only be the
 * match limit (WK_ETOOBIG). A failed load must leave a diag.
 */
/* fuzz-sources: common/util/wk_err.c common/text/wk_pretok.c */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_pretok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
fuzz_check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_pretok: invariant failed: %s\n", what);
        abort();
    }
}

/* Where the words must fall. */
typedef struct fuzz_walk {
    const uint8_t *text; /* the text split */
    size_t len;          /* its bytes */
    size_t at;           /* end of the last word */
    size_t covered;      /* bytes in words so far */
} fuzz_walk;

static bool
fuzz_word(void *ctx, const uint8_t *w, size_t n)
{
    fuzz_walk *fw = ctx;
    fuzz_check(n > 0, "word not empty");
    fuzz_check(w >= fw->text + fw->at && w + n <= fw->text + fw->len, "word in order, in text");
    fw->at = (size_t)(w - fw->text) + n;
    fw->covered += n;
    return true;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const beh[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext",
                                      "Contiguous"};
    if (size == 0)
        return 0;
    const uint8_t *nul = memchr(data + 1, 0, size - 1);
    size_t jlen = nul ? (size_t)(nul - data) - 1 : size - 1;
    const uint8_t *text = nul ? nul + 1 : data + size;
    size_t tlen = (size_t)(data + size - text);
    char *json = malloc(jlen + 256);
    size_t off = 0;
    fuzz_check(json != NULL, "malloc");
    if (data[0] & 1) {
        off = (size_t)sprintf(json,
                              "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                              "\"pattern\": {\"Regex\": \"");
        memcpy(json + off, data + 1, jlen);
        off += jlen;
        off += (size_t)sprintf(json + off,
                               "\"}, \"behavior\": \"%s\", \"invert\": %s}, {\"type\": "
                               "\"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": %s}]}",
                               beh[(data[0] >> 1) % 5], (data[0] & 0x10) ? "true" : "false",
                               (data[0] & 0x20) ? "true" : "false");
    } else {
        memcpy(json, data + 1, jlen);
        off = jlen;
    }
    json[off] = '\0';
    wk_pretok *p = NULL;
    wk_diag d = {""};
    if (wk_pretok_new(json, off, "pre_tokenizer", &p, &d) != WK_OK) {
        fuzz_check(p == NULL && strncmp(d.msg, "pre_tokenizer", 13) == 0, "diag on failure");
        free(json);
        return 0;
    }
    fuzz_walk fw = {.text = text, .len = tlen};
    wk_err err = wk_pretok_split(p, text, tlen, fuzz_word, &fw, &d);
    fuzz_check(err == WK_OK || err == WK_ETOOBIG, "split fails only at the match limit");
    /* nothing removed: no Removed behavior, spelt out or escaped */
    if (err == WK_OK && strstr(json, "Removed") == NULL && strstr(json, "\\u") == NULL)
        fuzz_check(fw.covered == tlen, "words cover the text");
    wk_pretok_free(p);
    free(json);
    return 0;
}
