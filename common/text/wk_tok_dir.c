/*
 * wk_tok_dir: which tokenizer a model directory (or checkpoint file) has
 * (declared in wk_tok.h): tokenizer.json (wk_bpe through wk_tok.c), the RWKV
 * World vocab file (wk_tok.c), else the token list in a GGUF's metadata
 * (wk_tok_gguf.c). It sits above both loaders, so that wk_tok.c and
 * wk_tok_gguf.c depend one way: wk_tok.c -> wk_tok_gguf.c -> wk_tok_dir.c.
 * Never logs.
 */
#include "wk_tok.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Whether path ends in ".json". */
static bool
tok_is_json(const char *path)
{
    size_t n = strlen(path);
    return n >= 5 && strcmp(path + n - 5, ".json") == 0;
}

wk_err
wk_tok_load_dir(const char *dir, const char *override_path, wk_tok **out, wk_diag *d)
{
    char *hf, *world;
    struct stat st;
    wk_err err;

    if (override_path != NULL) {
        size_t on = strlen(override_path);
        if (on >= 5 && strcmp(override_path + on - 5, ".gguf") == 0)
            return wk_tok_load_gguf(override_path, out, d);
        return tok_is_json(override_path) ? wk_tok_load_hf(override_path, out, d)
                                          : wk_tok_load(override_path, out, d);
    }
    /* A checkpoint file: the tokenizer beside it, else (a .gguf) its own metadata. */
    char parent[4096];
    const char *file = NULL;
    if (stat(dir, &st) == 0 && S_ISREG(st.st_mode)) {
        const char *slash = strrchr(dir, '/');
        int len = slash == NULL ? 0 : slash == dir ? 1 : (int)(slash - dir);
        int pn = slash == NULL ? snprintf(parent, sizeof(parent), ".")
                               : snprintf(parent, sizeof(parent), "%.*s", len, dir);
        if (pn < 0 || (size_t)pn >= sizeof(parent))
            return wk_diag_set(d, WK_ETOOBIG, "tokenizer: path too long: %s", dir);
        file = dir;
        dir = parent;
    }
    size_t dn = strlen(dir);
    hf = malloc(dn + sizeof("/tokenizer.json"));
    world = malloc(dn + sizeof("/rwkv_vocab_v20230424.txt"));
    if (hf == NULL || world == NULL) {
        free(hf);
        free(world);
        return wk_diag_set(d, WK_ENOMEM, "tokenizer: out of memory");
    }
    snprintf(hf, dn + sizeof("/tokenizer.json"), "%s/tokenizer.json", dir);
    snprintf(world, dn + sizeof("/rwkv_vocab_v20230424.txt"), "%s/rwkv_vocab_v20230424.txt", dir);
    if (stat(hf, &st) == 0)
        err = wk_tok_load_hf(hf, out, d);
    else if (stat(world, &st) == 0)
        err = wk_tok_load(world, out, d);
    else {
        /* a directory holding one .gguf: the World token list in its metadata */
        char *gguf = NULL;
        wk_diag gd = {""};
        size_t fl = file != NULL ? strlen(file) : 0;
        if (file != NULL)
            err = fl >= 5 && strcmp(file + fl - 5, ".gguf") == 0
                      ? ((gguf = strdup(file)) != NULL ? WK_OK : WK_ENOMEM)
                      : WK_ENOENT;
        else
            err = wk_tok_find_gguf(dir, &gguf, &gd);
        if (err == WK_OK) {
            err = wk_tok_load_gguf(gguf, out, d);
            free(gguf);
        } else if (err == WK_ENOENT) {
            err = wk_diag_set(d, WK_ENOENT,
                              "no tokenizer in %s: neither %s nor %s nor a *.gguf exists", dir, hf,
                              world);
        } else {
            err = wk_diag_set(d, err, "%s", gd.msg);
        }
    }
    free(hf);
    free(world);
    return err;
}
