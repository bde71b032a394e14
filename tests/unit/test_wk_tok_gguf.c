/*
 * Unit tests for wk_tok_gguf: the RWKV World tokenizer from a GGUF file's
 * metadata (tokenizer.ggml.tokens as llama.cpp's converter writes it), on
 * GGUF images built here: ids and bytes of every token, repr() escapes, the
 * "<s>" and "[PAD<id>]" entries that are not tokens, greedy encoding, and
 * each refusal with the key or index it names; then a byte-level BPE
 * ("gpt2") GGUF: the Qwen2 split, a merge, an added token, eos, fillers and
 * raw symbols left out, and its refusals (unknown or absent
 * tokenizer.ggml.pre, bad token types). Offline; the converter's real
 * output is checked by tests/reference/gguf_llama_cpp.py and
 * tests/reference/check_pretok.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "wk_tok.h"

/* A growable GGUF image. */
typedef struct gbuf {
    uint8_t p[1 << 16]; /* bytes */
    size_t len;         /* used */
} gbuf;

static void
g_put(gbuf *b, const void *s, size_t n)
{
    assert_true(b->len + n <= sizeof(b->p));
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void
g_u32(gbuf *b, uint32_t v)
{
    g_put(b, &v, 4); /* the test machine is little-endian, as GGUF */
}

static void
g_u64(gbuf *b, uint64_t v)
{
    g_put(b, &v, 8);
}

static void
g_str(gbuf *b, const char *s)
{
    g_u64(b, strlen(s));
    g_put(b, s, strlen(s));
}

/* The repr(bytes)[2:-1] body of the single byte c, as the converter writes it. */
static void
repr_byte(unsigned c, char out[8])
{
    if (c == '\\')
        snprintf(out, 8, "\\\\");
    else if (c == '\t')
        snprintf(out, 8, "\\t");
    else if (c == '\n')
        snprintf(out, 8, "\\n");
    else if (c == '\r')
        snprintf(out, 8, "\\r");
    else if (c >= 0x20 && c < 0x7f)
        snprintf(out, 8, "%c", c);
    else
        snprintf(out, 8, "\\x%02x", c);
}

/*
 * Writes a GGUF file with tokenizer.ggml.model = model (NULL: absent) and
 * tokens: "<s>", the 256 single bytes (ids 1..256), then extra[0..n_extra).
 */
static char *
write_gguf(const char *model, const char *const *extra, size_t n_extra)
{
    static gbuf b;
    b.len = 0;
    g_put(&b, "GGUF", 4);
    g_u32(&b, 3);
    g_u64(&b, 0);                     /* tensors */
    g_u64(&b, model != NULL ? 2 : 1); /* key/values */
    if (model != NULL) {
        g_str(&b, "tokenizer.ggml.model");
        g_u32(&b, 8); /* STRING */
        g_str(&b, model);
    }
    g_str(&b, "tokenizer.ggml.tokens");
    g_u32(&b, 9); /* ARRAY */
    g_u32(&b, 8); /* of STRING */
    g_u64(&b, 1 + 256 + n_extra);
    g_str(&b, "<s>");
    for (unsigned c = 0; c < 256; c++) {
        char r[8];
        repr_byte(c, r);
        g_str(&b, r);
    }
    for (size_t i = 0; i < n_extra; i++)
        g_str(&b, extra[i]);
    char *path = strdup("/tmp/wk_tok_gguf_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b.p, b.len), (ssize_t)b.len);
    close(fd);
    return path;
}

static void
test_tokens(void **state)
{
    (void)state;
    const char *extra[] = {"hello", "\\t\\'x\\\\", "\\xe4\\xb8\\xad", "[PAD260]", "[PAD7]"};
    char *path = write_gguf("rwkv", extra, 5);
    wk_tok *t = NULL;
    wk_diag d = {""};
    assert_int_equal(wk_tok_load_gguf(path, &t, &d), WK_OK);
    /* 256 bytes + hello + the escapes + the CJK char + a "[PAD7]" that is a token */
    assert_int_equal(wk_tok_count(t), 260);
    assert_int_equal(wk_tok_vocab_size(t), 262);
    size_t len;
    const uint8_t *p = wk_tok_piece(t, 1 + 'A', &len);
    assert_int_equal(len, 1);
    assert_int_equal(p[0], 'A');
    p = wk_tok_piece(t, 258, &len);
    assert_int_equal(len, 4);
    assert_memory_equal(p, "\t'x\\", 4);
    p = wk_tok_piece(t, 259, &len);
    assert_int_equal(len, 3);
    assert_memory_equal(p, "\xe4\xb8\xad", 3);
    assert_null(wk_tok_piece(t, 260, &len)); /* the converter's filler */
    p = wk_tok_piece(t, 261, &len);          /* "[PAD7]" at id 261 is text */
    assert_int_equal(len, 6);
    int32_t *ids = NULL;
    size_t n = 0;
    const char text[] = "hello\t'x\\\xe4\xb8\xad[PAD260]";
    assert_int_equal(wk_tok_encode(t, text, sizeof(text) - 1, &ids, &n, &d), WK_OK);
    assert_int_equal(n, 3 + 8);
    assert_int_equal(ids[0], 257);
    assert_int_equal(ids[1], 258);
    assert_int_equal(ids[2], 259);
    assert_int_equal(ids[3], 1 + '['); /* "[PAD260]" is not one token */
    free(ids);
    wk_tok_free(t);
    unlink(path);
    free(path);
}

/* UTF-8 of the byte-level alphabet's character for byte c (GPT-2's bytes_to_unicode). */
static void
bl_char(unsigned c, char out[4])
{
    unsigned cp = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174 ? c
                  : c <= 32                                                   ? 256 + c
                  : c <= 160                                                  ? 256 + 33 + (c - 127)
                                                                              : 256 + 67;
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = '\0';
    }
}

/*
 * Writes a "gpt2" GGUF: ids 0..255 the byte-level alphabet (NORMAL), 256
 * "Ġa" (NORMAL, merge "Ġ a"), 257 "<|im_start|>" (CONTROL), 258 "[PAD258]"
 * (UNUSED), 259 a raw "\u2122" (NORMAL, outside the alphabet), eos 257.
 * pre NULL: no tokenizer.ggml.pre. bad_type: token 256's type.
 */
static char *
write_gguf_bpe(const char *pre, int32_t bad_type, uint64_t n_types)
{
    static gbuf b;
    static const char *const extra[] = {"\xc4\xa0" "a", "<|im_start|>", "[PAD258]", "\xe2\x84\xa2"};
    const int32_t types[] = {bad_type, 3, 5, 1};
    b.len = 0;
    g_put(&b, "GGUF", 4);
    g_u32(&b, 3);
    g_u64(&b, 0);
    g_u64(&b, pre != NULL ? 6 : 5);
    g_str(&b, "tokenizer.ggml.model");
    g_u32(&b, 8);
    g_str(&b, "gpt2");
    if (pre != NULL) {
        g_str(&b, "tokenizer.ggml.pre");
        g_u32(&b, 8);
        g_str(&b, pre);
    }
    g_str(&b, "tokenizer.ggml.tokens");
    g_u32(&b, 9);
    g_u32(&b, 8);
    g_u64(&b, 260);
    for (unsigned c = 0; c < 256; c++) {
        char ch[4];
        bl_char(c, ch);
        g_str(&b, ch);
    }
    for (size_t i = 0; i < 4; i++)
        g_str(&b, extra[i]);
    g_str(&b, "tokenizer.ggml.token_type");
    g_u32(&b, 9);
    g_u32(&b, 5); /* INT32 */
    g_u64(&b, n_types);
    for (uint64_t i = 0; i < n_types; i++) {
        int32_t ty = i < 256 ? 1 : types[i - 256];
        g_put(&b, &ty, 4);
    }
    g_str(&b, "tokenizer.ggml.merges");
    g_u32(&b, 9);
    g_u32(&b, 8);
    g_u64(&b, 1);
    g_str(&b, "\xc4\xa0 a");
    g_str(&b, "tokenizer.ggml.eos_token_id");
    g_u32(&b, 4); /* UINT32 */
    g_u32(&b, 257);
    char *path = strdup("/tmp/wk_tok_gguf_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b.p, b.len), (ssize_t)b.len);
    close(fd);
    return path;
}

static void
test_bpe(void **state)
{
    (void)state;
    char *path = write_gguf_bpe("qwen2", 1, 260);
    wk_tok *t = NULL;
    wk_diag d = {""};
    if (wk_tok_load_gguf(path, &t, &d) != WK_OK)
        fail_msg("load: %s", d.msg);
    assert_string_equal(wk_tok_kind(t), "hf-bpe");
    assert_int_equal(wk_tok_eos(t), 257);
    assert_int_equal(wk_tok_count(t), 258); /* the filler and the raw symbol are no tokens */
    size_t len;
    assert_null(wk_tok_piece(t, 258, &len));
    assert_null(wk_tok_piece(t, 259, &len));
    const uint8_t *p = wk_tok_piece(t, 256, &len);
    assert_int_equal(len, 2);
    assert_memory_equal(p, " a", 2);
    int32_t *ids = NULL;
    size_t n = 0;
    /* the Qwen2 split: "a", " a", "1", "2", "'S", then the added token */
    const char text[] = "a a12'S<|im_start|>";
    assert_int_equal(wk_tok_encode(t, text, sizeof(text) - 1, &ids, &n, &d), WK_OK);
    const int32_t want[] = {'a', 256, '1', '2', '\'', 'S', 257};
    assert_int_equal(n, sizeof(want) / sizeof(want[0]));
    assert_memory_equal(ids, want, sizeof(want));
    free(ids);
    wk_tok_free(t);
    /* a directory holding only this .gguf: wk_tok_load_dir() falls back to it */
    char dir[] = "/tmp/wk_tok_gguf_dir_XXXXXX", moved[64];
    assert_non_null(mkdtemp(dir));
    snprintf(moved, sizeof(moved), "%s/model.gguf", dir);
    assert_int_equal(rename(path, moved), 0);
    t = NULL;
    if (wk_tok_load_dir(dir, NULL, &t, &d) != WK_OK)
        fail_msg("load_dir: %s", d.msg);
    assert_string_equal(wk_tok_kind(t), "hf-bpe");
    wk_tok_free(t);
    unlink(moved);
    rmdir(dir);
    free(path);

    static const struct {
        const char *pre;    /* tokenizer.ggml.pre */
        int32_t type;       /* token 256's type */
        uint64_t n_types;   /* token_type entries */
        wk_err want;        /* the code */
        const char *substr; /* in the diag */
    } bad[] = {
        {"falcon", 1, 260, WK_ENOTSUP, "tokenizer.ggml.pre \"falcon\" is not supported"},
        {NULL, 1, 260, WK_ENOTSUP, "without tokenizer.ggml.pre"},
        {"qwen2", 9, 260, WK_EINVAL, "tokenizer.ggml.token_type[256]: token type 9"},
        {"qwen2", 1, 259, WK_EINVAL, "tokenizer.ggml.token_type has 259 entries"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        path = write_gguf_bpe(bad[i].pre, bad[i].type, bad[i].n_types);
        t = NULL;
        assert_int_equal(wk_tok_load_gguf(path, &t, &d), bad[i].want);
        assert_null(t);
        if (strstr(d.msg, bad[i].substr) == NULL || strstr(d.msg, path) == NULL)
            fail_msg("case %zu: diag \"%s\" lacks \"%s\" or the path", i, d.msg, bad[i].substr);
        unlink(path);
        free(path);
    }
}

static void
test_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *model;  /* tokenizer.ggml.model, NULL: absent */
        const char *extra;  /* one token after the bytes, NULL: none */
        wk_err want;        /* the code */
        const char *substr; /* in the diag */
    } cases[] = {
        {"gpt2", NULL, WK_ENOTSUP, "tokenizer.ggml.model \"gpt2\""},
        {NULL, NULL, WK_ENOENT, "tokenizer.ggml.model absent"},
        {"rwkv", "\\q", WK_EINVAL, "tokenizer.ggml.tokens[257]: an escape"},
        {"rwkv", "ab\\", WK_EINVAL, "tokenizer.ggml.tokens[257]: a lone backslash"},
        {"rwkv", "\\x4", WK_EINVAL, "tokenizer.ggml.tokens[257]: \\x not followed"},
        {"rwkv", "caf\xc3\xa9", WK_EINVAL, "tokenizer.ggml.tokens[257]: a raw byte"},
        {"rwkv", "", WK_EINVAL, "tokenizer.ggml.tokens[257]: empty"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *extra[1] = {cases[i].extra};
        char *path = write_gguf(cases[i].model, extra, cases[i].extra != NULL);
        wk_tok *t = NULL;
        wk_diag d = {""};
        assert_int_equal(wk_tok_load_gguf(path, &t, &d), cases[i].want);
        assert_null(t);
        if (strstr(d.msg, cases[i].substr) == NULL)
            fail_msg("case %zu: diag \"%s\" lacks \"%s\"", i, d.msg, cases[i].substr);
        assert_non_null(strstr(d.msg, path)); /* the diag starts with the file */
        unlink(path);
        free(path);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokens),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_bpe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
