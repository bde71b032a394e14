/*
 * wk_err: strings and the HTTP/OpenAI mapping for the project error enum.
 * Pure tables; no allocation, no logging.
 */
#include "wk_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct wk_err_row {
    const char *name;    /* enum name */
    const char *text;    /* human string */
    int http;            /* HTTP status */
    const char *oa_type; /* OpenAI error type */
    const char *oa_code; /* OpenAI error code */
} wk_err_row;

static const wk_err_row wk_err_rows[WK_ERR__COUNT] = {
    [WK_OK] = {"WK_OK", "success", 200, "", ""},
    [WK_ENOMEM] = {"WK_ENOMEM", "out of memory", 500, "server_error", "out_of_memory"},
    [WK_EINVAL] = {"WK_EINVAL", "invalid argument", 400, "invalid_request_error",
                   "invalid_request"},
    [WK_ENOENT] = {"WK_ENOENT", "not found", 404, "invalid_request_error", "not_found"},
    [WK_EEXIST] = {"WK_EEXIST", "already exists", 409, "invalid_request_error",
                   "already_exists"},
    [WK_EBUSY] = {"WK_EBUSY", "busy", 409, "invalid_request_error", "busy"},
    [WK_ESTATE] = {"WK_ESTATE", "invalid state for this operation", 409,
                   "invalid_request_error", "invalid_state"},
    [WK_ENOSPC] = {"WK_ENOSPC", "no space left", 503, "server_error", "no_capacity"},
    [WK_ETIMEDOUT] = {"WK_ETIMEDOUT", "timed out", 504, "server_error", "timeout"},
    [WK_EPROTO] = {"WK_EPROTO", "protocol error", 502, "server_error", "protocol_error"},
    [WK_EIO] = {"WK_EIO", "I/O error", 500, "server_error", "io_error"},
    [WK_EDEVICE] = {"WK_EDEVICE", "device error", 500, "server_error", "device_error"},
    [WK_EPERM] = {"WK_EPERM", "permission denied", 403, "permission_error", "forbidden"},
    [WK_EAUTH] = {"WK_EAUTH", "authentication required", 401, "authentication_error",
                  "invalid_api_key"},
    [WK_ETOOBIG] = {"WK_ETOOBIG", "input too large", 413, "invalid_request_error",
                    "too_large"},
    [WK_ENOTSUP] = {"WK_ENOTSUP", "not supported", 400, "invalid_request_error",
                    "unsupported"},
    [WK_EQUEUEFULL] = {"WK_EQUEUEFULL", "queue full", 429, "rate_limit_error", "queue_full"},
    [WK_EUNAVAIL] = {"WK_EUNAVAIL", "service unavailable", 503, "server_error",
                     "unavailable"},
    [WK_ECORRUPT] = {"WK_ECORRUPT", "data corrupt", 500, "server_error", "corrupt_data"},
    [WK_EQUOTA] = {"WK_EQUOTA", "quota exceeded", 429, "rate_limit_error", "quota_exceeded"},
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

int
wk_err_http_status(wk_err err)
{
    const wk_err_row *r = wk_err_row_get(err);
    return r ? r->http : 500;
}

const char *
wk_err_openai_type(wk_err err)
{
    const wk_err_row *r = wk_err_row_get(err);
    return r ? r->oa_type : "server_error";
}

const char *
wk_err_openai_code(wk_err err)
{
    const wk_err_row *r = wk_err_row_get(err);
    return r ? r->oa_code : "internal_error";
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
