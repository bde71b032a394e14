/*
 * wk_file: whole small files into memory (see wk_file.h).
 */
#include "wk_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

wk_err
wk_file_read(const char *path, size_t max, char **out, size_t *len, wk_diag *d)
{
    if (path == NULL || out == NULL || len == NULL)
        return wk_diag_set(d, WK_EINVAL, "no file");
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        return wk_diag_set(d, e == ENOENT ? WK_ENOENT : e == EACCES ? WK_EPERM : WK_EIO,
                           "%s: %s", path, strerror(e));
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    wk_err err = WK_OK;
    while (buf != NULL) {
        if (n == cap) {
            if (cap > max) /* read max + 1 bytes: too big */
                break;
            cap = cap * 2 > max + 1 ? max + 1 : cap * 2;
            char *nb = realloc(buf, cap + 1);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f))
                err = wk_diag_set(d, WK_EIO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (buf == NULL)
        return wk_diag_set(d, WK_ENOMEM, "%s: out of memory", path);
    if (err == WK_OK && n > max)
        err = wk_diag_set(d, WK_ETOOBIG, "%s: larger than %zu bytes", path, max);
    if (err != WK_OK) {
        free(buf);
        return err;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return WK_OK;
}
