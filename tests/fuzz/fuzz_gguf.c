/*
 * libFuzzer harness for wk_gguf. Each input is parsed in memory as a GGUF
 * image (wk_gguf_parse). On success every tensor must lie inside the input,
 * its byte count must match its shape and dtype, its first and last elements
 * must convert through wk_tensor_read_f32, every key must be readable through
 * the typed getters without crossing the input, and every string of a string
 * array must lie inside the input. No file I/O per iteration.
 */
/* fuzz-sources: common/util/wk_err.c common/ckpt/wk_tensor.c common/ckpt/wk_gguf.c */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_gguf.h"
#include "wk_tensor_priv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
fuzz_check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_gguf: invariant failed: %s\n", what);
        abort();
    }
}

static void
fuzz_inside(const uint8_t *data, size_t size, const void *p, size_t n, const char *what)
{
    const uint8_t *q = p;
    fuzz_check(n == 0 || (q >= data && n <= size && q - data <= (ptrdiff_t)(size - n)), what);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wk_gguf *g = NULL;
    wk_diag d = {""};
    wk_err err = wk_gguf_parse(data, size, &g, &d);
    fuzz_check(err != WK_OK || d.msg[0] == '\0', "diag written on success");
    fuzz_check(err == WK_OK || g == NULL, "object kept on failure");
    if (err != WK_OK)
        return 0;
    for (size_t i = 0; i < wk_gguf_tensor_count(g); i++) {
        const wk_tensor *t = wk_gguf_tensor_at(g, i);
        size_t nb;
        fuzz_check(wk_tensor_size(t->dtype, t->ndim, t->shape, NULL, &nb) == WK_OK, "shape");
        fuzz_check(nb == t->nbytes, "nbytes");
        fuzz_inside(data, size, t->data, t->nbytes, "tensor outside the input");
        fuzz_check(wk_gguf_tensor_find(g, t->name) == t, "find by name");
        size_t n = (size_t)wk_tensor_numel(t);
        float f[2];
        if (n > 0) {
            fuzz_check(wk_tensor_read_f32(t, 0, 1, f) == WK_OK, "read first");
            fuzz_check(wk_tensor_read_f32(t, n - 1, 1, f + 1) == WK_OK, "read last");
        }
    }
    for (size_t i = 0; i < wk_gguf_kv_count(g); i++) {
        wk_gguf_type type;
        const char *key = wk_gguf_kv_key(g, i, &type);
        fuzz_check(key != NULL, "key");
        uint64_t u;
        double f;
        const char *s;
        size_t len;
        wk_gguf_type elem;
        uint64_t n;
        if (wk_gguf_get_u64(g, key, &u, NULL) == WK_OK)
            fuzz_check(type != WK_GGUF_TYPE_STRING && type != WK_GGUF_TYPE_ARRAY, "u64 type");
        if (wk_gguf_get_f64(g, key, &f, NULL) == WK_OK)
            fuzz_check(type == WK_GGUF_TYPE_FLOAT32 || type == WK_GGUF_TYPE_FLOAT64, "f64 type");
        if (wk_gguf_get_str(g, key, &s, &len, NULL) == WK_OK)
            fuzz_inside(data, size, s, len, "string outside the input");
        if (wk_gguf_get_arr(g, key, &elem, &n, NULL) == WK_OK && elem == WK_GGUF_TYPE_STRING) {
            fuzz_check(n <= size / 8, "string array count");
            for (uint64_t k = 0; k < n; k++) {
                fuzz_check(wk_gguf_arr_str(g, key, k, &s, &len, NULL) == WK_OK, "array string");
                fuzz_inside(data, size, s, len, "array string outside the input");
            }
            fuzz_check(wk_gguf_arr_str(g, key, n, &s, &len, NULL) == WK_EINVAL, "past the end");
        }
    }
    wk_gguf_free(g);
    return 0;
}
