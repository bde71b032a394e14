/*
 * libFuzzer harness for ctl_statefile_read. Each input is read twice: as
 * is, and with its SHA-256 trailer recomputed (when it is long enough), so
 * that mutations get past the checksum and reach the header, token and
 * tensor table checks. On success the invariants are checked: the state
 * bytes lie inside the input at a 64-byte offset, the tensors tile them in
 * order, the token digest matches, and writing the header and state back
 * gives the input byte for byte (the encoding is canonical).
 */
/* fuzz-sources: common/util/wk_err.c common/util/wk_sha256.c controld/store/ctl_statefile.c */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_statefile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
fuzz_check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_statefile: invariant failed: %s\n", what);
        abort();
    }
}

static void
fuzz_one(const uint8_t *buf, size_t len)
{
    ctl_statefile_hdr h;
    const void *st = NULL;
    size_t sl = 0;
    wk_diag d = {""};
    wk_err e = ctl_statefile_read(buf, len, &h, &st, &sl, &d);
    fuzz_check(e == WK_OK || e == WK_EINVAL || e == WK_ECORRUPT, "error code");
    fuzz_check(e == WK_OK || d.msg[0] != '\0', "message on failure");
    if (e != WK_OK)
        return;
    const uint8_t *sp = st;
    fuzz_check(sp >= buf && sp + sl <= buf + len, "state inside the input");
    fuzz_check((size_t)(sp - buf) % CTL_STATEFILE_ALIGN == 0, "state aligned");
    fuzz_check(sl == h.state_bytes, "state length");
    fuzz_check(h.n_tensors >= 1 && h.n_tensors <= CTL_STATEFILE_MAX_TENSORS, "tensor count");
    uint64_t off = 0;
    for (uint32_t i = 0; i < h.n_tensors; i++) {
        fuzz_check(h.tensors[i].offset == off, "tensors in order");
        off += h.tensors[i].nbytes;
    }
    fuzz_check(off == sl, "tensors tile the state");
    char td[WK_SHA256_HEX_LEN];
    fuzz_check(wk_sha256_token_ids_hex(h.tokens, (size_t)h.n_tokens, td) == WK_OK, "digest");
    fuzz_check(strcmp(td, h.token_digest) == 0, "token digest");
    void *out = NULL;
    size_t olen = 0;
    fuzz_check(ctl_statefile_write(&h, st, sl, &out, &olen, &d) == WK_OK, "rewrite");
    fuzz_check(olen == len && memcmp(out, buf, len) == 0, "rewrite is byte-identical");
    free(out);
    ctl_statefile_hdr_fini(&h);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_one(data, size);
    if (size >= CTL_STATEFILE_FIXED_BYTES + CTL_STATEFILE_CHECKSUM_BYTES) {
        uint8_t *copy = malloc(size);
        if (copy == NULL)
            return 0;
        memcpy(copy, data, size);
        wk_sha256_buf(copy, size - CTL_STATEFILE_CHECKSUM_BYTES,
                      copy + size - CTL_STATEFILE_CHECKSUM_BYTES);
        fuzz_one(copy, size);
        free(copy);
    }
    return 0;
}
