/*
 * wk_tok_gguf: the tokenizer of a GGUF file, read from its metadata, for a
 * model directory that holds a .gguf and no tokenizer file. Two kinds of
 * token list, as llama.cpp's convert_hf_to_gguf.py writes them:
 *
 * tokenizer.ggml.model "rwkv" (_set_vocab_rwkv_world): id 0 is "<s>", id k
 * (k >= 1) is line k of rwkv_vocab_v20230424.txt, written as
 * repr(token_bytes)[2:-1] (the body of a Python bytes literal: printable
 * ASCII, \\ \' \t \n \r and \xHH), and ids from the vocab's end up to the
 * model's vocab_size are "[PAD<id>]" fillers. This module undoes that and
 * hands the result to wk_tok_load_mem() as a vocab file with the same ids
 * and bytes, so the tokenizer is built, checked and behaves exactly as the
 * one loaded from the vocab file (the trie, the later-line-wins rule for
 * duplicates, every limit). id 0 and the fillers are not tokens (the vocab
 * file has neither: id 0 is end-of-text). Anything the converter cannot
 * have written (another escape, a raw non-ASCII byte, an empty token) is
 * refused with a diag naming the token's index.
 *
 * tokenizer.ggml.model "gpt2" (byte-level BPE): tokens (vocab keys in the
 * byte-level alphabet), token_type, merges ("a b") and tokenizer.ggml.pre,
 * which names the Hugging Face tokenizer the file was converted from. This
 * module writes the equivalent tokenizer.json (the vocab of the NORMAL
 * tokens, CONTROL and USER_DEFINED tokens as added tokens, matched in the
 * raw text, UNUSED fillers left out; the normalizer, pre-tokenizer and
 * ignore_merges of the tokenizer that pre names, from the table below) and
 * a tokenizer_config.json naming tokenizer.ggml.eos_token_id, and hands both
 * to wk_tok_load_hf_mem(), so every check and the encoding are those of the
 * tokenizer.json path. An absent or unknown pre is refused with a diag
 * naming it. Never logs.
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "wk_gguf.h"
#include "wk_hex.h"
#include "wk_tok.h"

#define TOKG_KEY_MODEL "tokenizer.ggml.model"
#define TOKG_KEY_TOKENS "tokenizer.ggml.tokens"
#define TOKG_KEY_TYPES "tokenizer.ggml.token_type"
#define TOKG_KEY_MERGES "tokenizer.ggml.merges"
#define TOKG_KEY_PRE "tokenizer.ggml.pre"
#define TOKG_KEY_EOS "tokenizer.ggml.eos_token_id"

/* llama.cpp's token types (llama_token_type). */
enum {
    TOKG_TYPE_NORMAL = 1,       /* a vocab token */
    TOKG_TYPE_UNKNOWN = 2,      /* the unknown token: a vocab token here */
    TOKG_TYPE_CONTROL = 3,      /* a special added token */
    TOKG_TYPE_USER_DEFINED = 4, /* a non-special added token */
    TOKG_TYPE_UNUSED = 5,       /* a filler: not a token */
    TOKG_TYPE_BYTE = 6,         /* a byte token: a vocab token here */
};

/*
 * The Hugging Face pre-tokenizers behind the tokenizer.ggml.pre names this
 * module knows (facts from the tokenizer.json files of those models, and
 * the names and regex lists of llama.cpp's src/llama-vocab.cpp). The
 * pre-tokenizer is: a Split (Isolated) per pattern in split[], then Digits
 * when digits >= 0 (individual_digits = digits), then ByteLevel
 * (add_prefix_space false, use_regex = byte_regex).
 */
typedef struct tokg_pre {
    const char *name;     /* tokenizer.ggml.pre */
    const char *split[7]; /* Split regexes, NULL-terminated */
    int digits;           /* -1: no Digits; 0: runs; 1: individual_digits */
    bool byte_regex;      /* ByteLevel use_regex (the GPT-2 split) */
    bool nfc;             /* normalizer NFC (else none) */
    bool ignore_merges;   /* model.ignore_merges */
} tokg_pre;

#define TOKG_LLAMA3                                                                                \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                     \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define TOKG_QWEN2                                                                                 \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                          \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define TOKG_QWEN35                                                                                \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "                  \
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define TOKG_GPT4O                                                                                 \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"    \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| "                    \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define TOKG_CJK "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+"

static const tokg_pre tokg_pres[] = {
    {"gpt-2", {NULL}, -1, true, false, false},
    {"mpt", {NULL}, -1, true, true, false},
    {"starcoder", {NULL}, 1, true, false, false},
    {"refact", {NULL}, 1, true, false, false},
    {"command-r", {NULL}, 1, true, true, false},
    {"llama-bpe", {TOKG_LLAMA3, NULL}, -1, false, false, true},
    {"llama3", {TOKG_LLAMA3, NULL}, -1, false, false, true},
    {"llama-v3", {TOKG_LLAMA3, NULL}, -1, false, false, true},
    {"qwen2", {TOKG_QWEN2, NULL}, -1, false, true, false},
    {"qwen35", {TOKG_QWEN35, NULL}, -1, false, false, false},
    {"gpt-4o", {TOKG_GPT4O, NULL}, -1, false, false, false},
    {"deepseek-coder",
     {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", TOKG_CJK, NULL},
     1,
     false,
     false,
     false},
    {"deepseek-llm",
     {"[\\r\\n]",
      "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
      "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
      "\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556"
      "\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
      "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
      "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
      "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
      "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
      "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
      "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
      "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
      "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
      "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
      "\U0001e900-\U0001e943]+",
      "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", "\\s+$", TOKG_CJK, NULL},
     0,
     false,
     false,
     false},
};

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

/*
 * Whether s[0..n) (valid UTF-8) is spelt in the byte-level alphabet (GPT-2's
 * bytes_to_unicode: U+0021..U+007E, U+00A1..U+00AC, U+00AE..U+00FF and
 * U+0100..U+0143). A vocab token that is not can never come out of BPE over
 * byte-level words (Command-R's vocab holds 1403 such raw characters).
 */
static bool
tokg_in_alphabet(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        uint32_t cp;
        if (c < 0x80) {
            cp = c;
            i++;
        } else if (c >= 0xc2 && c <= 0xc5 && i + 1 < n) {
            cp = (uint32_t)(c & 0x1f) << 6 | ((unsigned char)s[i + 1] & 0x3f);
            i += 2;
        } else {
            return false;
        }
        if (cp < 0x21 || (cp > 0x7e && cp < 0xa1) || cp == 0xad || cp > 0x143)
            return false;
    }
    return true;
}

/* Sets key of o to v (consumed); false when v is NULL or out of memory. */
static bool
tokg_set(json_t *o, const char *key, json_t *v)
{
    return v != NULL && json_object_set_new(o, key, v) == 0;
}

/* The pre_tokenizer object of pre. NULL when out of memory. */
static json_t *
tokg_pretok(const tokg_pre *pre)
{
    json_t *seq = json_array(), *bl = json_object(), *o;
    bool ok = seq != NULL && bl != NULL;

    for (size_t i = 0; ok && pre->split[i] != NULL; i++) {
        json_t *pat = json_object();
        ok = (o = json_object()) != NULL && json_array_append_new(seq, o) == 0 && pat != NULL &&
             tokg_set(o, "type", json_string("Split")) &&
             tokg_set(pat, "Regex", json_string(pre->split[i])) && tokg_set(o, "pattern", pat) &&
             tokg_set(o, "behavior", json_string("Isolated")) &&
             tokg_set(o, "invert", json_false());
    }
    if (ok && pre->digits >= 0)
        ok = (o = json_object()) != NULL && json_array_append_new(seq, o) == 0 &&
             tokg_set(o, "type", json_string("Digits")) &&
             tokg_set(o, "individual_digits", json_boolean(pre->digits == 1));
    ok = ok && tokg_set(bl, "type", json_string("ByteLevel")) &&
         tokg_set(bl, "add_prefix_space", json_false()) &&
         tokg_set(bl, "trim_offsets", json_true()) &&
         tokg_set(bl, "use_regex", json_boolean(pre->byte_regex));
    if (!ok) {
        json_decref(seq);
        json_decref(bl);
        return NULL;
    }
    if (json_array_size(seq) == 0) {
        json_decref(seq);
        return bl; /* ByteLevel alone: wk_bpe's own GPT-2 split */
    }
    json_t *root = json_object();
    if (json_array_append_new(seq, bl) != 0 || root == NULL ||
        !tokg_set(root, "type", json_string("Sequence")) || !tokg_set(root, "pretokenizers", seq)) {
        json_decref(root);
        return NULL;
    }
    return root;
}

/*
 * Builds the tokenizer.json and tokenizer_config.json of a "gpt2" GGUF (see
 * the top of the file) and loads them. Diags name keys and indexes; the
 * caller prefixes the path.
 */
static wk_err
tokg_load_bpe(const wk_gguf *g, wk_tok **out, wk_diag *d)
{
    const char *pre_name;
    size_t pre_len, sl;
    const char *s;
    const tokg_pre *pre = NULL;
    wk_gguf_type elem;
    uint64_t n, n_merges, eos = UINT64_MAX;
    json_t *root = NULL, *model, *vocab, *merges, *added, *cfg = NULL;
    char *js = NULL, *cs = NULL;
    wk_err e;

    if ((e = wk_gguf_get_str(g, TOKG_KEY_PRE, &pre_name, &pre_len, d)) != WK_OK) {
        if (e == WK_ENOENT)
            return wk_diag_set(d, WK_ENOTSUP,
                               "%s \"gpt2\" without %s: which pre-tokenizer the tokens need is "
                               "unknown",
                               TOKG_KEY_MODEL, TOKG_KEY_PRE);
        return e;
    }
    for (size_t i = 0; i < sizeof(tokg_pres) / sizeof(tokg_pres[0]); i++) {
        if (strlen(tokg_pres[i].name) == pre_len &&
            memcmp(tokg_pres[i].name, pre_name, pre_len) == 0)
            pre = &tokg_pres[i];
    }
    if (pre == NULL)
        return wk_diag_set(d, WK_ENOTSUP,
                           "%s \"%.*s\" is not supported (known: gpt-2, mpt, starcoder, refact, "
                           "command-r, llama-bpe, qwen2, qwen35, gpt-4o, deepseek-coder, "
                           "deepseek-llm); put the model's tokenizer.json beside the .gguf",
                           TOKG_KEY_PRE, (int)(pre_len > 64 ? 64 : pre_len), pre_name);
    if ((e = wk_gguf_get_arr(g, TOKG_KEY_TOKENS, &elem, &n, d)) != WK_OK)
        return e;
    if (elem != WK_GGUF_TYPE_STRING || n == 0 || n > (uint64_t)WK_TOK_MAX_ID + 1)
        return wk_diag_set(d, WK_EINVAL, "%s: expected 1..%u strings, got %llu of type %d",
                           TOKG_KEY_TOKENS, WK_TOK_MAX_ID + 1, (unsigned long long)n, (int)elem);
    uint64_t nt;
    if ((e = wk_gguf_get_arr(g, TOKG_KEY_TYPES, &elem, &nt, d)) != WK_OK)
        return e;
    if (nt != n)
        return wk_diag_set(d, WK_EINVAL, "%s has %llu entries, %s %llu", TOKG_KEY_TYPES,
                           (unsigned long long)nt, TOKG_KEY_TOKENS, (unsigned long long)n);
    if ((e = wk_gguf_get_arr(g, TOKG_KEY_MERGES, &elem, &n_merges, d)) != WK_OK)
        return e;
    if (elem != WK_GGUF_TYPE_STRING)
        return wk_diag_set(d, WK_EINVAL, "%s is not a string array", TOKG_KEY_MERGES);
    e = wk_gguf_get_u64(g, TOKG_KEY_EOS, &eos, d);
    if (e != WK_OK && e != WK_ENOENT)
        return e;
    if (e == WK_ENOENT || eos >= n)
        eos = UINT64_MAX;

    root = json_object();
    model = json_object();
    vocab = json_object();
    merges = json_array();
    added = json_array();
    bool ok = root != NULL && tokg_set(root, "model", model) && tokg_set(model, "vocab", vocab) &&
              tokg_set(model, "merges", merges) && tokg_set(root, "added_tokens", added) &&
              tokg_set(model, "type", json_string("BPE")) &&
              tokg_set(model, "ignore_merges", json_boolean(pre->ignore_merges)) &&
              tokg_set(root, "pre_tokenizer", tokg_pretok(pre)) &&
              tokg_set(root, "decoder", json_pack("{s:s}", "type", "ByteLevel"));
    if (ok && pre->nfc)
        ok = tokg_set(root, "normalizer", json_pack("{s:s}", "type", "NFC"));
    if (!ok)
        goto nomem;
    for (uint64_t id = 0; id < n; id++) {
        int64_t ty;
        if ((e = wk_gguf_arr_str(g, TOKG_KEY_TOKENS, id, &s, &sl, d)) != WK_OK ||
            (e = wk_gguf_arr_int(g, TOKG_KEY_TYPES, id, &ty, d)) != WK_OK)
            goto fail;
        if (ty == TOKG_TYPE_UNUSED)
            continue;
        if (ty < TOKG_TYPE_NORMAL || ty > TOKG_TYPE_BYTE) {
            e = wk_diag_set(d, WK_EINVAL, "%s[%llu]: token type %lld is not one of 1..6",
                            TOKG_KEY_TYPES, (unsigned long long)id, (long long)ty);
            goto fail;
        }
        if (sl == 0 || memchr(s, '\0', sl) != NULL) {
            e = wk_diag_set(d, WK_EINVAL, "%s[%llu]: empty, or holds a NUL byte", TOKG_KEY_TOKENS,
                            (unsigned long long)id);
            goto fail;
        }
        json_t *str = json_stringn(s, sl);
        if (str == NULL) {
            e = wk_diag_set(d, WK_EINVAL, "%s[%llu]: not valid UTF-8", TOKG_KEY_TOKENS,
                            (unsigned long long)id);
            goto fail;
        }
        if (ty == TOKG_TYPE_CONTROL || ty == TOKG_TYPE_USER_DEFINED) {
            json_t *a = json_object();
            if (a == NULL || json_array_append_new(added, a) != 0 ||
                !tokg_set(a, "id", json_integer((json_int_t)id)) || !tokg_set(a, "content", str) ||
                !tokg_set(a, "special", json_boolean(ty == TOKG_TYPE_CONTROL)) ||
                !tokg_set(a, "normalized", json_false()))
                goto nomem;
            continue;
        }
        json_decref(str);
        if (!tokg_in_alphabet(s, sl))
            continue; /* unreachable by BPE: no token here (decoding it is refused) */
        char *key = strndup(s, sl);
        if (key == NULL)
            goto nomem;
        if (json_object_get(vocab, key) != NULL) {
            e = wk_diag_set(d, WK_EINVAL, "%s[%llu]: the same token as id %lld", TOKG_KEY_TOKENS,
                            (unsigned long long)id,
                            (long long)json_integer_value(json_object_get(vocab, key)));
            free(key);
            goto fail;
        }
        ok = tokg_set(vocab, key, json_integer((json_int_t)id));
        free(key);
        if (!ok)
            goto nomem;
    }
    /*
     * The added tokens in the vocab too, as in the tokenizer.json files
     * (where the model looks up a byte-level character that is also an added
     * token, e.g. DeepSeek-Coder's "\u00c0", it finds it), unless a vocab
     * token has the same spelling.
     */
    size_t ai;
    json_t *a;
    json_array_foreach(added, ai, a) {
        const char *content = json_string_value(json_object_get(a, "content"));
        if (json_object_get(vocab, content) == NULL &&
            !tokg_set(vocab, content, json_incref(json_object_get(a, "id"))))
            goto nomem;
    }
    for (uint64_t i = 0; i < n_merges; i++) {
        if ((e = wk_gguf_arr_str(g, TOKG_KEY_MERGES, i, &s, &sl, d)) != WK_OK)
            goto fail;
        json_t *m = json_stringn(s, sl);
        if (m == NULL) {
            e = wk_diag_set(d, WK_EINVAL, "%s[%llu]: not valid UTF-8", TOKG_KEY_MERGES,
                            (unsigned long long)i);
            goto fail;
        }
        if (json_array_append_new(merges, m) != 0)
            goto nomem;
    }
    if (eos != UINT64_MAX) {
        if ((e = wk_gguf_arr_str(g, TOKG_KEY_TOKENS, eos, &s, &sl, d)) != WK_OK)
            goto fail;
        cfg = json_object();
        if (cfg == NULL || !tokg_set(cfg, "eos_token", json_stringn(s, sl)))
            goto nomem;
    } else if ((cfg = json_pack("{s:n}", "eos_token")) == NULL) {
        goto nomem;
    }
    js = json_dumps(root, JSON_COMPACT);
    cs = json_dumps(cfg, JSON_COMPACT);
    if (js == NULL || cs == NULL)
        goto nomem;
    json_decref(root);
    json_decref(cfg);
    root = cfg = NULL;
    e = wk_tok_load_hf_mem(js, strlen(js), cs, strlen(cs), out, d);
    if (e != WK_OK)
        wk_diag_prefix(d, "the tokenizer.json of %s \"%s\"", TOKG_KEY_PRE, pre->name);
    free(js);
    free(cs);
    return e;
nomem:
    e = wk_diag_set(d, WK_ENOMEM, "out of memory");
fail:
    json_decref(root);
    json_decref(cfg);
    free(js);
    free(cs);
    return e;
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
    if (model_len == 4 && memcmp(model, "gpt2", 4) == 0) {
        e = tokg_load_bpe(g, out, d);
        wk_gguf_free(g);
        if (e != WK_OK)
            wk_diag_prefix(d, "%s", path);
        return e;
    }
    if (model_len != 4 || memcmp(model, "rwkv", 4) != 0) {
        e = wk_diag_set(d, WK_ENOTSUP,
                        "%s \"%.*s\": only the RWKV World token list (\"rwkv\") and byte-level "
                        "BPE (\"gpt2\") are read from GGUF metadata; put the tokenizer.json "
                        "beside the .gguf",
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
