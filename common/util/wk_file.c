/*
 * wk_file: whole small files into memory (see wk_file.h).
 */
#include "wk_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

wk_err
wk_file_model_path(const char *model, char *dir, size_t dir_cap, char *name, size_t name_cap,
                   bool *is_file)
{
    struct stat st;
    bool file = stat(model, &st) == 0 && S_ISREG(st.st_mode);
    size_t len = strlen(model);
    while (len > 1 && model[len - 1] == '/')
        len--;
    size_t start = len;
    while (start > 0 && model[start - 1] != '/')
        start--;
    size_t nlen = len - start;
    if (file) {
        const char *dot = strrchr(model + start, '.'); /* (a file's path ends in no '/') */
        if (dot != NULL && dot > model + start)
            nlen = (size_t)(dot - (model + start));
    }
    if (name != NULL && nlen >= name_cap)
        return WK_ETOOBIG;
    int n = !file          ? snprintf(dir, dir_cap, "%s", model)
            : start == 0   ? snprintf(dir, dir_cap, ".")
            : start == 1   ? snprintf(dir, dir_cap, "/")
                           : snprintf(dir, dir_cap, "%.*s", (int)(start - 1), model);
    if (n < 0 || (size_t)n >= dir_cap)
        return WK_ETOOBIG;
    if (name != NULL) {
        memcpy(name, model + start, nlen);
        name[nlen] = '\0';
    }
    *is_file = file;
    return WK_OK;
}
