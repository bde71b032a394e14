/*
 * wkvm-tokdump: prints what wk_tok makes of a vocab file (World) or a
 * tokenizer.json (HF, any path ending in .json) or the tokenizer in a GGUF
 * file's metadata (World or byte-level BPE; any path ending in .gguf), for
 * comparison with Python (tests/reference/check_vocab_parse.py,
 * tests/reference/check_bpe.py, tests/reference/check_pretok.py). A
 * test tool only: it trusts its arguments and exits non-zero on the first
 * problem.
 *
 *   wkvm-tokdump FILE          "digest <hex>", "vocab_size <n>", "count <n>",
 *                              then "<id> <hex bytes>" for each defined id
 *                              (World: from 1, end-of-text left out)
 *   wkvm-tokdump FILE encode   reads lines of hex bytes on stdin and prints
 *                              each line's token ids, space separated
 *   wkvm-tokdump FILE info     "kind <world|hf-bpe>", "eos <id>"
 *   wkvm-tokdump FILE decode   reads lines of space-separated token ids on
 *                              stdin and prints each line's wk_tok_decode()
 *                              bytes as hex (an empty line for none)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_hex.h"
#include "wk_tok.h"

static int
tokdump_list(const wk_tok *t)
{
    printf("digest %s\nvocab_size %u\ncount %u\n", wk_tok_digest(t), wk_tok_vocab_size(t),
           wk_tok_count(t));
    uint32_t first = strcmp(wk_tok_kind(t), "world") == 0 ? 1 : 0;
    for (uint32_t id = first; id < wk_tok_vocab_size(t); id++) {
        size_t len;
        const uint8_t *p = wk_tok_piece(t, (int32_t)id, &len);
        if (p == NULL)
            continue;
        printf("%u ", id);
        for (size_t i = 0; i < len; i++)
            printf("%02x", p[i]);
        putchar('\n');
    }
    return 0;
}

static int
tokdump_encode(const wk_tok *t)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;

    while ((n = getline(&line, &cap, stdin)) >= 0) {
        size_t len = 0;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        char *back = NULL;
        size_t back_len = 0;
        wk_diag d = {""};

        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            n--;
        if (n % 2 != 0) {
            fprintf(stderr, "tokdump: odd hex line\n");
            return 1;
        }
        for (ssize_t i = 0; i < n; i += 2) {
            int hi = wk_hex_digit((unsigned char)line[i]), lo = wk_hex_digit((unsigned char)line[i + 1]);
            if (hi < 0 || lo < 0) {
                fprintf(stderr, "tokdump: bad hex\n");
                return 1;
            }
            line[len++] = (char)(hi * 16 + lo);
        }
        if (wk_tok_encode(t, line, len, &ids, &n_ids, &d) != WK_OK ||
            wk_tok_decode(t, ids, n_ids, &back, &back_len, &d) != WK_OK) {
            fprintf(stderr, "tokdump: %s\n", d.msg);
            return 1;
        }
        /* HF with NFC gives the normalized text back; the caller checks that. */
        if (strcmp(wk_tok_kind(t), "world") == 0 &&
            (back_len != len || memcmp(back, line, len) != 0)) {
            fprintf(stderr, "tokdump: round trip mismatch\n");
            return 1;
        }
        for (size_t i = 0; i < n_ids; i++)
            printf(i ? " %d" : "%d", (int)ids[i]);
        putchar('\n');
        free(ids);
        free(back);
    }
    free(line);
    return 0;
}

static int
tokdump_decode(const wk_tok *t)
{
    char *line = NULL;
    size_t cap = 0;
    int32_t *ids = NULL;
    size_t n_cap = 0;

    while (getline(&line, &cap, stdin) >= 0) {
        size_t n_ids = 0;
        char *p = line, *end;
        for (;;) {
            long v = strtol(p, &end, 10);
            if (end == p)
                break;
            if (n_ids == n_cap) {
                n_cap = n_cap ? 2 * n_cap : 256;
                int32_t *g = realloc(ids, n_cap * sizeof(*ids));
                if (g == NULL) {
                    fprintf(stderr, "tokdump: out of memory\n");
                    return 1;
                }
                ids = g;
            }
            ids[n_ids++] = (int32_t)v;
            p = end;
        }
        char *out = NULL;
        size_t out_len = 0;
        wk_diag d = {""};
        if (wk_tok_decode(t, ids, n_ids, &out, &out_len, &d) != WK_OK) {
            fprintf(stderr, "tokdump: %s\n", d.msg);
            return 1;
        }
        for (size_t i = 0; i < out_len; i++)
            printf("%02x", (unsigned char)out[i]);
        putchar('\n');
        free(out);
    }
    free(ids);
    free(line);
    return 0;
}

int
main(int argc, char **argv)
{
    wk_tok *t = NULL;
    wk_diag d = {""};
    int rc;

    if (argc < 2 || argc > 3 ||
        (argc == 3 && strcmp(argv[2], "encode") != 0 && strcmp(argv[2], "info") != 0 &&
         strcmp(argv[2], "decode") != 0)) {
        fprintf(stderr, "usage: wkvm-tokdump FILE [encode|decode|info]\n");
        return 2;
    }
    size_t n = strlen(argv[1]);
    wk_err err = n >= 5 && strcmp(argv[1] + n - 5, ".json") == 0   ? wk_tok_load_hf(argv[1], &t, &d)
                 : n >= 5 && strcmp(argv[1] + n - 5, ".gguf") == 0 ? wk_tok_load_gguf(argv[1], &t, &d)
                                                                   : wk_tok_load(argv[1], &t, &d);
    if (err != WK_OK) {
        fprintf(stderr, "wkvm-tokdump: %s\n", d.msg);
        return 1;
    }
    if (argc == 3 && strcmp(argv[2], "info") == 0) {
        printf("kind %s\neos %d\n", wk_tok_kind(t), (int)wk_tok_eos(t));
        rc = 0;
    } else {
        rc = argc == 3 ? (strcmp(argv[2], "decode") == 0 ? tokdump_decode(t) : tokdump_encode(t))
                       : tokdump_list(t);
    }
    wk_tok_free(t);
    return rc;
}
