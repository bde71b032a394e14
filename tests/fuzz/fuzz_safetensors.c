/*
 * libFuzzer harness for wk_safetensors. Each input is parsed in memory twice:
 * as a safetensors image (wk_st_parse) and as a sharded index document
 * (wk_st_index_check). On success every tensor must lie inside the input, its
 * byte count must match its shape and dtype, and its first and last elements
 * must convert through wk_tensor_read_f32. No file I/O per iteration.
 */
/* fuzz-sources: common/util/wk_err.c common/ckpt/wk_tensor.c common/ckpt/wk_safetensors.c */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_safetensors.h"
#include "wk_tensor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
fuzz_check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_safetensors: invariant failed: %s\n", what);
        abort();
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    wk_diag d = {""};
    wk_err err = wk_st_parse(data, size, &l, &d);
    fuzz_check(err != WK_OK || d.msg[0] == '\0', "diag written on success");
    fuzz_check(err == WK_OK || l.n == 0, "tensors kept on failure");
    for (size_t i = 0; i < l.n; i++) {
        const wk_tensor *t = &l.v[i];
        const uint8_t *p = t->data;
        size_t nb;
        fuzz_check(wk_tensor_size(t->dtype, t->ndim, t->shape, NULL, &nb) == WK_OK, "shape");
        fuzz_check(nb == t->nbytes, "nbytes");
        fuzz_check(p >= data && t->nbytes <= size && p - data <= (ptrdiff_t)(size - t->nbytes),
                   "tensor outside the input");
        size_t n = (size_t)wk_tensor_numel(t);
        float f[2];
        if (n > 0) {
            fuzz_check(wk_tensor_read_f32(t, 0, 1, f) == WK_OK, "read first");
            fuzz_check(wk_tensor_read_f32(t, n - 1, 1, f + 1) == WK_OK, "read last");
        }
        fuzz_check(wk_tensor_read_f32(t, n, 1, f) == WK_EINVAL, "read past the end");
    }
    wk_tensor_list_fini(&l);

    size_t nt = 0, ns = 0;
    if (wk_st_index_check(data, size, &nt, &ns, &d) == WK_OK)
        fuzz_check(ns <= nt, "more shards than tensors");
    return 0;
}
