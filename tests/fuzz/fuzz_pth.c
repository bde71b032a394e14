/*
 * libFuzzer harness for wk_pth. Each input is parsed in memory twice: as a
 * torch zip archive (wk_pth_parse) and as a bare pickle (wk_pth_pickle_load)
 * whose storage keys are decimal byte counts resolved into a static buffer,
 * so that the fuzzer can reach the tensor checks without building a zip. On
 * success every tensor must lie inside the bytes it was resolved from, match
 * its shape and dtype, and convert through wk_tensor_read_f32. Seeds in
 * tests/fuzz/corpus/pth: small torch.save() archives (torch 1.13) and bare
 * pickles of the same shape whose storage keys are byte counts.
 */
/* fuzz-sources: common/util/wk_err.c common/ckpt/wk_tensor.c common/ckpt/wk_pth.c */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_pth.h"
#include "wk_tensor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t fuzz_store[4096]; /* every storage of the bare-pickle mode */

static void
fuzz_check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_pth: invariant failed: %s\n", what);
        abort();
    }
}

/* Storage key "N" (decimal, N <= 4096) is the first N bytes of fuzz_store. */
static wk_err
fuzz_resolve(void *ctx, const char *key, const void **data, size_t *len, wk_diag *d)
{
    (void)ctx;
    char *end;
    unsigned long n = strtoul(key, &end, 10);
    if (*end != '\0' || n > sizeof(fuzz_store))
        return wk_diag_set(d, WK_ENOENT, "no storage '%s'", key);
    *data = fuzz_store;
    *len = n;
    return WK_OK;
}

static void
fuzz_check_tensors(const wk_tensor_list *l, const uint8_t *lo, size_t span)
{
    for (size_t i = 0; i < l->n; i++) {
        const wk_tensor *t = &l->v[i];
        const uint8_t *p = t->data;
        size_t nb;
        fuzz_check(wk_tensor_size(t->dtype, t->ndim, t->shape, NULL, &nb) == WK_OK, "shape");
        fuzz_check(nb == t->nbytes, "nbytes");
        fuzz_check(t->nbytes == 0 || (p >= lo && t->nbytes <= span &&
                                      p - lo <= (ptrdiff_t)(span - t->nbytes)),
                   "tensor outside its storage");
        size_t n = (size_t)wk_tensor_numel(t);
        float f[2];
        if (n > 0) {
            fuzz_check(wk_tensor_read_f32(t, 0, 1, f) == WK_OK, "read first");
            fuzz_check(wk_tensor_read_f32(t, n - 1, 1, f + 1) == WK_OK, "read last");
        }
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    wk_diag d = {""};
    wk_err err = wk_pth_parse(data, size, &l, &d);
    fuzz_check(err != WK_OK || d.msg[0] == '\0', "diag written on success");
    fuzz_check(err == WK_OK || l.n == 0, "tensors kept on failure");
    if (err == WK_OK)
        fuzz_check_tensors(&l, data, size);
    wk_tensor_list_fini(&l);

    d.msg[0] = '\0';
    err = wk_pth_pickle_load(data, size, fuzz_resolve, NULL, &l, &d);
    fuzz_check(err != WK_OK || d.msg[0] == '\0', "diag written on success");
    fuzz_check(err == WK_OK || l.n == 0, "tensors kept on failure");
    if (err == WK_OK)
        fuzz_check_tensors(&l, fuzz_store, sizeof(fuzz_store));
    wk_tensor_list_fini(&l);
    return 0;
}
