/*
 * ctl_err: what a wk_err means on the HTTP API: its status, its OpenAI error
 * type and code, and the OpenAI error body. The table lives here, in the
 * controller, because only the controller speaks HTTP: common/util/wk_err holds
 * the codes and their strings, and the worker links nothing of this.
 *
 * Pure tables and one JSON builder; no logging, thread-safe.
 */
#ifndef CTL_ERR_H
#define CTL_ERR_H

#include "wk_err.h"

/* HTTP status code for err (WK_OK -> 200, WK_EINVAL -> 400, ...; unknown -> 500). */
int ctl_err_http_status(wk_err err);

/* OpenAI error "type" for err ("invalid_request_error", "server_error", ...), static. */
const char *ctl_err_openai_type(wk_err err);

/* OpenAI error "code" for err ("invalid_request", "queue_full", ...), static. */
const char *ctl_err_openai_code(wk_err err);

/*
 * OpenAI error body {"error":{"message","type","param","code"}} for err.
 * param may be NULL (-> null). Bytes of message or param that are not
 * well-formed UTF-8 (a quote of client input cut inside a character) become
 * '?'. Caller frees. NULL on ENOMEM.
 */
char *ctl_err_body(wk_err err, const char *message, const char *param);

/* Same with an explicit OpenAI code ("context_length_exceeded"); NULL code: err's. */
char *ctl_err_body_code(wk_err err, const char *message, const char *param, const char *code);

#endif /* CTL_ERR_H */
