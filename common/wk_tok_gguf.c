/*
 * wk_tok_gguf: the RWKV World tokenizer of a GGUF file, read from its
 * metadata, for a model directory that holds a .gguf and no vocab file.
 *
 * llama.cpp's convert_hf_to_gguf.py (_set_vocab_rwkv_world) stores the World
 * vocab as tokenizer.ggml.model "rwkv" and tokenizer.ggml.tokens: id 0 is
 * "<s>", id k (k >= 1) is line k of rwkv_vocab_v20230424.txt, written as
 * repr(token_bytes)[2:-1] (the body of a Python bytes literal: printable
 * ASCII, \\ \' \t \n \r and \xHH), and ids from the vocab's end up to the
 * model's vocab_size are "[PAD<id>]" fillers. This module undoes that and
 * hands the result to wk_tok_load_mem() as a vocab file with the same ids
 * and bytes, so the tokenizer is built, checked and behaves exactly as the
 * one loaded from the vocab file (the trie, the later-line-wins rule for
 * duplicates, every limit). id 0 and the fillers are not tokens (the vocab
 * file has neither: id 0 is end-of-text). Anything the converter cannot
 * have written (another escape, a raw non-ASCII byte, an empty token) is
 * refused with a diag naming the token's index. Never logs.
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "wk_gguf.h"
#include "wk_hex.h"
#include "wk_tok.h"

#define TOKG_KEY_MODEL "tokenizer.ggml.model"
#define TOKG_KEY_TOKENS "tokenizer.ggml.tokens"

/*
 * Decodes the repr() body s[0..n) into out (at least n bytes); *out_len is
 * set. Returns false when s is not something repr() of bytes writes.
 */
static bool
tokg_unescape(const char *s, size_t n, uint8_t *out, size_t *out_len, const char **why)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c != '\\') {
            if (c < 0x20 || c > 0x7e) {
                *why = "a raw byte outside printable ASCII";
                return false;
            }
            out[o++] = c;
            continue;
        }
        if (++i == n) {
            *why = "a lone backslash at the end";
            return false;
        }
        switch (s[i]) {
        case '\\':
        case '\'':
        case '"':
            out[o++] = (uint8_t)s[i];
            break;
        case 't':
            out[o++] = '\t';
            break;
        case 'n':
            out[o++] = '\n';
            break;
        case 'r':
            out[o++] = '\r';
            break;
        case 'x': {
            int hi = i + 2 < n ? wk_hex_digit((unsigned char)s[i + 1]) : -1;
            int lo = i + 2 < n ? wk_hex_digit((unsigned char)s[i + 2]) : -1;
            if (hi < 0 || lo < 0) {
                *why = "\\x not followed by two hex digits";
                return false;
            }
            out[o++] = (uint8_t)(hi << 4 | lo);
            i += 2;
            break;
        }
        default:
            *why = "an escape repr() does not write";
            return false;
        }
    }
    *out_len = o;
    return true;
}

/* Whether s[0..n) is the converter's filler "[PAD<id>]" for this id. */
static bool
tokg_is_pad(const char *s, size_t n, uint64_t id)
{
    char pad[32];
    int k = snprintf(pad, sizeof(pad), "[PAD%llu]", (unsigned long long)id);
    return k > 0 && (size_t)k == n && memcmp(s, pad, n) == 0;
}

/* Appends to the growing vocab text; false when out of memory. */
static bool
tokg_put(char **buf, size_t *len, size_t *cap, const char *src, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 65536;
        while (*len + n + 1 > nc)
            nc *= 2;
        char *nb = realloc(*buf, nc);
        if (nb == NULL)
            return false;
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, src, n);
    *len += n;
    return true;
}

wk_err
wk_tok_load_gguf(const char *path, wk_tok **out, wk_diag *d)
{
    wk_gguf *g = NULL;
    char *text = NULL;
    size_t len = 0, cap = 0;
    wk_err e = wk_gguf_open(path, &g, d);
    if (e != WK_OK)
        return e;

    const char *model;
    size_t model_len;
    wk_gguf_type elem;
    uint64_t n;
    if ((e = wk_gguf_get_str(g, TOKG_KEY_MODEL, &model, &model_len, d)) != WK_OK) {
        if (e == WK_ENOENT)
            e = wk_diag_set(d, WK_ENOENT, "no tokenizer in the metadata (%s absent)",
                            TOKG_KEY_MODEL);
        goto fail;
    }
    if (model_len != 4 || memcmp(model, "rwkv", 4) != 0) {
        e = wk_diag_set(d, WK_ENOTSUP,
                        "%s \"%.*s\": only the RWKV World token list (\"rwkv\") is read from "
                        "GGUF metadata; put the tokenizer.json beside the .gguf",
                        TOKG_KEY_MODEL, (int)(model_len > 64 ? 64 : model_len), model);
        goto fail;
    }
    if ((e = wk_gguf_get_arr(g, TOKG_KEY_TOKENS, &elem, &n, d)) != WK_OK)
        goto fail;
    if (elem != WK_GGUF_TYPE_STRING || n < 2 || n > (uint64_t)WK_TOK_MAX_ID + 1) {
        e = wk_diag_set(d, WK_EINVAL, "%s: expected 2..%u strings, got %llu of type %d",
                        TOKG_KEY_TOKENS, WK_TOK_MAX_ID + 1, (unsigned long long)n, (int)elem);
        goto fail;
    }
    uint8_t piece[WK_TOK_MAX_PIECE];
    for (uint64_t id = 1; id < n; id++) {
        const char *s;
        size_t sl, pl = 0;
        const char *why = NULL;
        if ((e = wk_gguf_arr_str(g, TOKG_KEY_TOKENS, id, &s, &sl, d)) != WK_OK)
            goto fail;
        if (tokg_is_pad(s, sl, id))
            continue;
        if (sl > 4 * (size_t)WK_TOK_MAX_PIECE) {
            why = "longer than any token";
        } else if (sl == 0) {
            why = "empty";
        } else {
            uint8_t tmp[4 * WK_TOK_MAX_PIECE];
            if (tokg_unescape(s, sl, tmp, &pl, &why) && pl > WK_TOK_MAX_PIECE)
                why = "longer than any token";
            else if (why == NULL)
                memcpy(piece, tmp, pl);
        }
        if (why != NULL) {
            e = wk_diag_set(d, WK_EINVAL, "%s[%llu]: %s (not a token as the converter writes it)",
                            TOKG_KEY_TOKENS, (unsigned long long)id, why);
            goto fail;
        }
        /* one vocab-file line: <id> b'\xHH...' <length> */
        char head[48];
        int hl = snprintf(head, sizeof(head), "%llu b'", (unsigned long long)id);
        if (!tokg_put(&text, &len, &cap, head, (size_t)hl))
            goto nomem;
        for (size_t k = 0; k < pl; k++) {
            char hx[5];
            snprintf(hx, sizeof(hx), "\\x%02x", piece[k]);
            if (!tokg_put(&text, &len, &cap, hx, 4))
                goto nomem;
        }
        hl = snprintf(head, sizeof(head), "' %zu\n", pl);
        if (!tokg_put(&text, &len, &cap, head, (size_t)hl))
            goto nomem;
    }
    if (len == 0) {
        e = wk_diag_set(d, WK_EINVAL, "%s: no token besides id 0 and fillers", TOKG_KEY_TOKENS);
        goto fail;
    }
    e = wk_tok_load_mem(text, len, out, d);
    if (e != WK_OK)
        wk_diag_prefix(d, "%s (as a World vocab)", TOKG_KEY_TOKENS);
    free(text);
    wk_gguf_free(g);
    if (e != WK_OK)
        wk_diag_prefix(d, "%s", path);
    return e;
nomem:
    e = wk_diag_set(d, WK_ENOMEM, "out of memory");
fail:
    free(text);
    wk_gguf_free(g);
    wk_diag_prefix(d, "%s", path);
    return e;
}

wk_err
wk_tok_find_gguf(const char *dir, char **path, wk_diag *d)
{
    DIR *dh = opendir(dir);
    if (dh == NULL) {
        int err = errno;
        return wk_diag_set(d, err == ENOENT || err == ENOTDIR ? WK_ENOENT : WK_EIO, "%s: %s", dir,
                           strerror(err));
    }
    char *found = NULL;
    size_t count = 0;
    wk_err e = WK_OK;
    struct dirent *de;
    while ((de = readdir(dh)) != NULL) {
        size_t nl = strlen(de->d_name);
        if (de->d_name[0] == '.' || nl < 5 || strcmp(de->d_name + nl - 5, ".gguf") != 0)
            continue;
        size_t pl = strlen(dir) + 1 + nl + 1;
        char *p = malloc(pl);
        if (p == NULL) {
            e = WK_ENOMEM;
            break;
        }
        snprintf(p, pl, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
            free(p);
            continue;
        }
        count++;
        if (found == NULL)
            found = p;
        else
            free(p);
    }
    closedir(dh);
    if (e == WK_OK && count == 1) {
        *path = found;
        return WK_OK;
    }
    free(found);
    if (e == WK_ENOMEM)
        return wk_diag_set(d, e, "out of memory listing %s", dir);
    if (count == 0)
        return wk_diag_set(d, WK_ENOENT, "%s: no *.gguf file", dir);
    return wk_diag_set(d, WK_EINVAL, "%s: %zu *.gguf files; keep exactly one", dir, count);
}
