/*
 * Unit tests for wk_tok_gguf: the RWKV World tokenizer from a GGUF file's
 * metadata (tokenizer.ggml.tokens as llama.cpp's converter writes it), on
 * GGUF images built here: ids and bytes of every token, repr() escapes, the
 * "<s>" and "[PAD<id>]" entries that are not tokens, greedy encoding, and
 * each refusal with the key or index it names. Offline; the converter's real
 * output is checked by tests/reference/gguf_llama_cpp.py.
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
