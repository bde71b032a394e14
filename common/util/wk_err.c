/*
 * wk_err: names and strings for the project error enum. Pure tables; no
 * allocation, no logging. What a code means on the HTTP API (status, OpenAI
 * type and code) is the controller's business: controld/api/ctl_err.
 */
#include "wk_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct wk_err_row {
    const char *name; /* enum name */
    const char *text; /* human string */
} wk_err_row;

static const wk_err_row wk_err_rows[WK_ERR__COUNT] = {
    [WK_OK] = {"WK_OK", "success"},
    [WK_ENOMEM] = {"WK_ENOMEM", "out of memory"},
    [WK_EINVAL] = {"WK_EINVAL", "invalid argument"},
    [WK_ENOENT] = {"WK_ENOENT", "not found"},
    [WK_EEXIST] = {"WK_EEXIST", "already exists"},
    [WK_EBUSY] = {"WK_EBUSY", "busy"},
    [WK_ESTATE] = {"WK_ESTATE", "invalid state for this operation"},
    [WK_ENOSPC] = {"WK_ENOSPC", "no space left"},
    [WK_ETIMEDOUT] = {"WK_ETIMEDOUT", "timed out"},
    [WK_EPROTO] = {"WK_EPROTO", "protocol error"},
    [WK_EIO] = {"WK_EIO", "I/O error"},
    [WK_EDEVICE] = {"WK_EDEVICE", "device error"},
    [WK_EPERM] = {"WK_EPERM", "permission denied"},
    [WK_EAUTH] = {"WK_EAUTH", "authentication required"},
    [WK_ETOOBIG] = {"WK_ETOOBIG", "input too large"},
    [WK_ENOTSUP] = {"WK_ENOTSUP", "not supported"},
    [WK_EQUEUEFULL] = {"WK_EQUEUEFULL", "queue full"},
    [WK_EUNAVAIL] = {"WK_EUNAVAIL", "service unavailable"},
    [WK_ECORRUPT] = {"WK_ECORRUPT", "data corrupt"},
    [WK_EQUOTA] = {"WK_EQUOTA", "quota exceeded"},
};

static const wk_err_row *
wk_err_row_get(wk_err err)
{
    if ((unsigned)err >= WK_ERR__COUNT)
        return NULL;
    return &wk_err_rows[err];
}

const char *
wk_strerror(wk_err err)
{
    const wk_err_row *r = wk_err_row_get(err);
    return r ? r->text : "unknown error";
}

const char *
wk_err_name(wk_err err)
{
    const wk_err_row *r = wk_err_row_get(err);
    return r ? r->name : "WK_E?";
}

wk_err
wk_diag_set(wk_diag *d, wk_err err, const char *fmt, ...)
{
    if (d == NULL)
        return err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->msg, sizeof(d->msg), fmt, ap);
    va_end(ap);
    return err;
}

void
wk_diag_prefix(wk_diag *d, const char *fmt, ...)
{
    if (d == NULL)
        return;
    char pre[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(pre, sizeof(pre) - 2, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    size_t plen = strlen(pre);
    pre[plen++] = ':';
    pre[plen++] = ' ';
    size_t cap = sizeof(d->msg) - 1;
    size_t old = strnlen(d->msg, cap);
    if (plen > cap)
        plen = cap;
    if (old > cap - plen)
        old = cap - plen;
    memmove(d->msg + plen, d->msg, old);
    memcpy(d->msg, pre, plen);
    d->msg[plen + old] = '\0';
}
