/*
 * wk_sha256: thin wrappers around OpenSSL EVP SHA-256. The only place in
 * common/ that includes OpenSSL headers.
 */
#include "wk_sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

wk_err
wk_sha256_init(wk_sha256 *s)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL)
        return WK_ENOMEM;
    if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(ctx);
        return WK_ENOMEM;
    }
    s->evp = ctx;
    return WK_OK;
}

void
wk_sha256_update(wk_sha256 *s, const void *data, size_t len)
{
    if (len > 0)
        EVP_DigestUpdate((EVP_MD_CTX *)s->evp, data, len);
}

void
wk_sha256_final(wk_sha256 *s, uint8_t out[WK_SHA256_LEN])
{
    unsigned int n = 0;
    EVP_DigestFinal_ex((EVP_MD_CTX *)s->evp, out, &n);
    wk_sha256_fini(s);
}

wk_err
wk_sha256_copy(wk_sha256 *dst, const wk_sha256 *src)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (c == NULL)
        return WK_ENOMEM;
    if (EVP_MD_CTX_copy_ex(c, (const EVP_MD_CTX *)src->evp) != 1) {
        EVP_MD_CTX_free(c);
        return WK_ENOMEM;
    }
    dst->evp = c;
    return WK_OK;
}

void
wk_sha256_fini(wk_sha256 *s)
{
    if (s == NULL || s->evp == NULL)
        return;
    EVP_MD_CTX_free((EVP_MD_CTX *)s->evp);
    s->evp = NULL;
}

void
wk_sha256_buf(const void *data, size_t len, uint8_t out[WK_SHA256_LEN])
{
    unsigned int n = 0;
    EVP_Digest(data, len, out, &n, EVP_sha256(), NULL);
}

void
wk_sha256_to_hex(const uint8_t digest[WK_SHA256_LEN], char out[WK_SHA256_HEX_LEN])
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < WK_SHA256_LEN; i++) {
        out[2 * i] = hx[digest[i] >> 4];
        out[2 * i + 1] = hx[digest[i] & 15];
    }
    out[64] = '\0';
}

void
wk_sha256_hex(const void *data, size_t len, char out[WK_SHA256_HEX_LEN])
{
    uint8_t dg[WK_SHA256_LEN];
    wk_sha256_buf(data, len, dg);
    wk_sha256_to_hex(dg, out);
}

void
wk_sha256_update_token_ids(wk_sha256 *s, const int32_t *ids, size_t n)
{
    uint8_t buf[8 * 256];
    size_t fill = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = (uint64_t)(int64_t)ids[i];
        for (int b = 0; b < 8; b++)
            buf[fill++] = (uint8_t)(v >> (8 * b));
        if (fill == sizeof(buf)) {
            wk_sha256_update(s, buf, fill);
            fill = 0;
        }
    }
    if (fill)
        wk_sha256_update(s, buf, fill);
}

wk_err
wk_sha256_token_ids_hex(const int32_t *ids, size_t n, char out[WK_SHA256_HEX_LEN])
{
    wk_sha256 s;
    if (wk_sha256_init(&s) != WK_OK)
        return WK_ENOMEM;
    wk_sha256_update_token_ids(&s, ids, n);
    uint8_t dg[WK_SHA256_LEN];
    wk_sha256_final(&s, dg);
    wk_sha256_to_hex(dg, out);
    return WK_OK;
}

wk_err
wk_sha256_file_hex(const char *path, char out[WK_SHA256_HEX_LEN], wk_diag *d)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return wk_diag_set(d, errno == ENOENT ? WK_ENOENT : WK_EIO, "%s: %s", path,
                           strerror(errno));
    wk_sha256 s;
    wk_err err = wk_sha256_init(&s);
    if (err != WK_OK) {
        close(fd);
        return err;
    }
    uint8_t buf[1 << 16];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof(buf));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            err = wk_diag_set(d, WK_EIO, "%s: %s", path, strerror(errno));
            wk_sha256_fini(&s);
            close(fd);
            return err;
        }
        if (r == 0)
            break;
        wk_sha256_update(&s, buf, (size_t)r);
    }
    close(fd);
    uint8_t dg[WK_SHA256_LEN];
    wk_sha256_final(&s, dg);
    wk_sha256_to_hex(dg, out);
    return WK_OK;
}
