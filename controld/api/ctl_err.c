/*
 * ctl_err: the HTTP status and the OpenAI error type and code of every
 * wk_err, and the OpenAI error body built from them.
 */
#include "ctl_err.h"

#include <jansson.h>
#include <stdlib.h>

#include "wk_json.h"

typedef struct ctl_err_row {
    int http;            /* HTTP status */
    const char *oa_type; /* OpenAI error type */
    const char *oa_code; /* OpenAI error code */
} ctl_err_row;

static const ctl_err_row ctl_err_rows[WK_ERR__COUNT] = {
    [WK_OK] = {200, "", ""},
    [WK_ENOMEM] = {500, "server_error", "out_of_memory"},
    [WK_EINVAL] = {400, "invalid_request_error", "invalid_request"},
    [WK_ENOENT] = {404, "invalid_request_error", "not_found"},
    [WK_EEXIST] = {409, "invalid_request_error", "already_exists"},
    [WK_EBUSY] = {409, "invalid_request_error", "busy"},
    [WK_ESTATE] = {409, "invalid_request_error", "invalid_state"},
    [WK_ENOSPC] = {503, "server_error", "no_capacity"},
    [WK_ETIMEDOUT] = {504, "server_error", "timeout"},
    [WK_EPROTO] = {502, "server_error", "protocol_error"},
    [WK_EIO] = {500, "server_error", "io_error"},
    [WK_EDEVICE] = {500, "server_error", "device_error"},
    [WK_EPERM] = {403, "permission_error", "forbidden"},
    [WK_EAUTH] = {401, "authentication_error", "invalid_api_key"},
    [WK_ETOOBIG] = {413, "invalid_request_error", "too_large"},
    [WK_ENOTSUP] = {400, "invalid_request_error", "unsupported"},
    [WK_EQUEUEFULL] = {429, "rate_limit_error", "queue_full"},
    [WK_EUNAVAIL] = {503, "server_error", "unavailable"},
    [WK_ECORRUPT] = {500, "server_error", "corrupt_data"},
    [WK_EQUOTA] = {429, "rate_limit_error", "quota_exceeded"},
};

static const ctl_err_row *
ctl_err_row_get(wk_err err)
{
    if ((unsigned)err >= WK_ERR__COUNT)
        return NULL;
    return &ctl_err_rows[err];
}

int
ctl_err_http_status(wk_err err)
{
    const ctl_err_row *r = ctl_err_row_get(err);
    return r ? r->http : 500;
}

const char *
ctl_err_openai_type(wk_err err)
{
    const ctl_err_row *r = ctl_err_row_get(err);
    return r ? r->oa_type : "server_error";
}

const char *
ctl_err_openai_code(wk_err err)
{
    const ctl_err_row *r = ctl_err_row_get(err);
    return r ? r->oa_code : "internal_error";
}

char *
ctl_err_body(wk_err err, const char *message, const char *param)
{
    return ctl_err_body_code(err, message, param, NULL);
}

char *
ctl_err_body_code(wk_err err, const char *message, const char *param, const char *code)
{
    char *msg = wk_json_utf8_scrub(message ? message : "");
    char *par = param ? wk_json_utf8_scrub(param) : NULL;
    json_t *inner = NULL;
    if (msg != NULL && (param == NULL || par != NULL))
        inner = json_pack("{s:s, s:s, s:o, s:s}", "message", msg, "type", ctl_err_openai_type(err),
                          "param", par ? json_string(par) : json_null(), "code",
                          code != NULL ? code : ctl_err_openai_code(err));
    free(msg);
    free(par);
    if (inner == NULL)
        return NULL;
    json_t *body = json_pack("{s:o}", "error", inner);
    if (body == NULL)
        return NULL;
    char *s = wk_json_dump_compact(body);
    json_decref(body);
    return s;
}
