/*
 * ctl_http: the controller's HTTP server, the only civetweb user. It binds
 * (loopback by default), dispatches requests to a route table, and gives
 * handlers a small request/response API: headers, a bounded body read, JSON
 * and OpenAI-error replies, and server-sent events.
 *
 * Threading: handlers run on civetweb worker threads, concurrently; a
 * ctl_http_req is only valid inside its handler call.
 */
#ifndef CTL_HTTP_H
#define CTL_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "ctl_sseloop.h"
#include "wk_err.h"

typedef struct json_t json_t; /* jansson's value, opaque here */

typedef struct ctl_http ctl_http;
typedef struct ctl_http_req ctl_http_req;

/* Handles one request; must send exactly one response. */
typedef void (*ctl_http_handler)(ctl_http_req *req, void *arg);

typedef enum ctl_http_access {
    CTL_HTTP_ACCESS_PUBLIC = 0, /* no key needed (/health, /ready) */
    CTL_HTTP_ACCESS_USER,       /* any valid key */
    CTL_HTTP_ACCESS_ADMIN,      /* an admin key */
} ctl_http_access;

/*
 * Maps the Authorization and x-api-key headers (each may be NULL) to a user;
 * WK_EAUTH when missing/unknown. *user must stay valid for the server's life.
 */
typedef wk_err (*ctl_http_authorizer)(const char *authorization, const char *api_key,
                                      const char **user, bool *admin, void *arg);

typedef struct ctl_http_route {
    const char *method;  /* "GET", "POST", ..., or NULL for any */
    const char *path;    /* exact path, or a prefix when prefix is true */
    bool prefix;         /* match path as a prefix ("/v1/states/") */
    ctl_http_handler fn; /* handler */
    void *arg;           /* passed to fn */
    const char *label;   /* route label for metrics ("/v1/states/{id}") */
    ctl_http_access access; /* who may call it */
} ctl_http_route;

typedef struct ctl_http_config {
    const char *host;       /* bind address, "127.0.0.1" */
    unsigned port;          /* TCP port */
    unsigned threads;       /* request threads */
    size_t max_body;        /* largest request body accepted */
    unsigned timeout_ms;    /* request read/write timeout */
    size_t max_header;      /* largest request line + headers (civetweb max_request_size) */
    ctl_http_authorizer auth; /* NULL: everyone is user "local", admin */
    void *auth_arg;         /* passed to auth */
    unsigned sse_loops;     /* event-loop threads for streamed replies, 0 = none (threads write) */
    unsigned sse_flush_ms;  /* their coalescing delay (ctl_sseloop_new), 0 = none */
} ctl_http_config;

/* Called after each response for metrics; may be NULL. */
typedef void (*ctl_http_observer)(const char *route_label, const char *method, int status,
                                  double seconds, void *arg);

/*
 * Starts the server with routes (copied). Returns WK_EIO when the port cannot
 * be bound (diag says why), WK_EINVAL for a bad config.
 */
WK_MUST_CHECK wk_err ctl_http_new(const ctl_http_config *cfg, const ctl_http_route *routes,
                                  size_t n_routes, ctl_http_observer obs, void *obs_arg,
                                  ctl_http **out, wk_diag *d);

/* Stops the server (waits for handlers to finish) and frees it. NULL-safe. */
void ctl_http_free(ctl_http *h);

/* Request accessors; strings borrowed for the handler call. */
const char *ctl_http_req_method(const ctl_http_req *req);
const char *ctl_http_req_path(const ctl_http_req *req);
const char *ctl_http_req_header(const ctl_http_req *req, const char *name); /* case-insensitive */

/*
 * The URL-decoded query parameter name into buf (cap bytes, NUL-terminated).
 * Returns true when present and it fit.
 */
WK_MUST_CHECK bool ctl_http_req_query_get(const ctl_http_req *req, const char *name, char *buf,
                                          size_t cap);
const char *ctl_http_req_user(const ctl_http_req *req); /* the authenticated user */

/*
 * Reads the whole body (at most the configured max_body). *buf is owned by
 * the request and freed after the handler returns. WK_ETOOBIG, WK_EIO.
 */
WK_MUST_CHECK wk_err ctl_http_req_body(ctl_http_req *req, const char **buf, size_t *len);

/* Sends a complete response. */
void ctl_http_send(ctl_http_req *req, int status, const char *content_type, const char *body,
                   size_t len);

/* Sends v as compact JSON; consumes the reference to v. */
void ctl_http_send_json(ctl_http_req *req, int status, json_t *v);

/* Sends an OpenAI error body with the status that err maps to. */
void ctl_http_send_error(ctl_http_req *req, wk_err err, const char *message, const char *param);

/*
 * Like ctl_http_send_error_status() with an explicit OpenAI error code
 * ("context_length_exceeded") in place of the one err maps to.
 */
void ctl_http_send_error_code(ctl_http_req *req, int status, wk_err err, const char *message,
                              const char *param, const char *code);

/* Like ctl_http_send_error() with an explicit status. */
void ctl_http_send_error_status(ctl_http_req *req, int status, wk_err err, const char *message,
                                const char *param);

/* Server-sent events: begin the stream (status 200, text/event-stream). */
void ctl_http_sse_begin(ctl_http_req *req);

/*
 * Sends one "data: <payload>\n\n" event (one write; buffered while corked).
 * WK_EIO when the client went away.
 */
WK_MUST_CHECK wk_err ctl_http_sse_data(ctl_http_req *req, const char *payload);

/*
 * Sends one named event: "event: <event>\n" then ctl_http_sse_data()'s line
 * (the Responses API's typed events). event must hold no newline. WK_EIO
 * when the client went away.
 */
WK_MUST_CHECK wk_err ctl_http_sse_event(ctl_http_req *req, const char *event,
                                        const char *payload);

/*
 * Corked, SSE events are only buffered, and ctl_http_flush() writes all of
 * them at once (a streamed reply writes what one wake-up found in one
 * send()). Uncorking flushes.
 */
void ctl_http_cork(ctl_http_req *req, bool on);

/* True once a write failed or the client went away. */
bool ctl_http_req_broken(const ctl_http_req *req);

/* Writes the buffered events. WK_EIO when the client went away (then and after). */
WK_MUST_CHECK wk_err ctl_http_flush(ctl_http_req *req);

/*
 * The socket this thread last read with recv() (ctl_http_recv.c), -1 if
 * none: on a civetweb thread inside a handler, its connection's.
 */
int ctl_http_recv_last_fd(void);

/* Streamed replies so far, written by an event loop / by their own threads. */
void ctl_http_stream_counts(const ctl_http *h, uint64_t *by_loop, uint64_t *by_thread);

/*
 * Hands the rest of a streamed reply (after ctl_http_sse_begin(), while
 * corked) to an event loop: *out is a stream of one of the server's loops
 * that writes req's socket, pumped by pump(arg) (which writes with
 * ctl_http_sse_data/event and ctl_http_flush as before, on the loop's
 * thread); start it with ctl_http_sse_run(). Owned by req. WK_ENOTSUP when
 * this reply cannot be handed over (no loops, TLS, socket not found): the
 * handler writes it on its own thread as before.
 */
WK_MUST_CHECK wk_err ctl_http_sse_detach(ctl_http_req *req, ctl_ssestream_pump_fn pump,
                                         void *arg, ctl_ssestream **out);

/*
 * Runs the stream of ctl_http_sse_detach() and waits for its end
 * (ctl_ssestream_run(): WK_OK, WK_EIO when the client went away, after
 * which req counts as broken, WK_ETIMEDOUT at deadline_ms, the pump's
 * error). Afterwards the handler writes req itself again.
 */
WK_MUST_CHECK wk_err ctl_http_sse_run(ctl_http_req *req, uint64_t deadline_ms);

/*
 * True when the loopback-only rule allows binding host: every address it
 * stands for is loopback (wk_net_host_is_loopback: parsed, names resolved).
 */
bool ctl_http_host_is_loopback(const char *host);

#endif /* CTL_HTTP_H */
