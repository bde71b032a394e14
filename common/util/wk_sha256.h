/*
 * wk_sha256: SHA-256 helpers over OpenSSL's EVP interface, plus the
 * token-id digest used by parent-token-v1 (each id as int64 little-endian).
 * Never logs.
 */
#ifndef WK_SHA256_H
#define WK_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"

#define WK_SHA256_LEN 32
#define WK_SHA256_HEX_LEN 65 /* 64 hex digits + NUL */

typedef struct wk_sha256 {
    void *evp; /* EVP_MD_CTX *, owned */
} wk_sha256;

/* Starts a digest. WK_ENOMEM on allocation failure. Pair with final(). */
WK_MUST_CHECK wk_err wk_sha256_init(wk_sha256 *s);

/* Adds len bytes. */
void wk_sha256_update(wk_sha256 *s, const void *data, size_t len);

/* Starts dst as a copy of src's running digest (src goes on). WK_ENOMEM. */
WK_MUST_CHECK wk_err wk_sha256_copy(wk_sha256 *dst, const wk_sha256 *src);

/* Writes the digest and frees the context. */
void wk_sha256_final(wk_sha256 *s, uint8_t out[WK_SHA256_LEN]);

/* Frees a context without producing a digest. NULL-safe, idempotent. */
void wk_sha256_fini(wk_sha256 *s);

/* One-shot digest of a buffer. */
void wk_sha256_buf(const void *data, size_t len, uint8_t out[WK_SHA256_LEN]);

/* One-shot digest of a buffer as lowercase hex. */
void wk_sha256_hex(const void *data, size_t len, char out[WK_SHA256_HEX_LEN]);

/* Lowercase hex of a raw digest. */
void wk_sha256_to_hex(const uint8_t digest[WK_SHA256_LEN], char out[WK_SHA256_HEX_LEN]);

/* SHA-256 over each id as int64 little-endian, as hex (parent-token-v1). WK_ENOMEM. */
WK_MUST_CHECK wk_err wk_sha256_token_ids_hex(const int32_t *ids, size_t n, char out[WK_SHA256_HEX_LEN]);

/* Adds n ids to a running digest in the form wk_sha256_token_ids_hex() hashes (int64 LE each). */
void wk_sha256_update_token_ids(wk_sha256 *s, const int32_t *ids, size_t n);

/* SHA-256 of a whole file as hex. WK_ENOENT / WK_EIO on failure. */
WK_MUST_CHECK wk_err wk_sha256_file_hex(const char *path, char out[WK_SHA256_HEX_LEN],
                                        wk_diag *d);

#endif /* WK_SHA256_H */
