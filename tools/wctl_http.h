/*
 * wctl_http: the HTTP/1.1 client of wkvmctl, the only civetweb user in the
 * CLI. One request per connection ("Connection: close"), plain HTTP only
 * (the controller binds loopback by default; TLS belongs to a proxy). It
 * sends a body from memory or from a file, and keeps the response body in
 * memory or streams a successful one into a file.
 *
 * It never prints: progress goes to the caller's callback, failures come
 * back as wk_err with a diag. Not thread-safe across calls of
 * wctl_http_init/fini; requests themselves share nothing.
 */
#ifndef WCTL_HTTP_H
#define WCTL_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "wk_err.h"

#define WCTL_HTTP_HOST_MAX 256          /* longest host name */
#define WCTL_HTTP_BASE_MAX 512          /* longest path prefix of a URL */
#define WCTL_HTTP_BODY_MAX (256u << 20) /* largest response body kept in memory */

/* A parsed http:// URL. */
typedef struct wctl_url {
    char host[WCTL_HTTP_HOST_MAX]; /* host name or address, IPv6 without brackets */
    int port;                      /* TCP port (80 when the URL names none) */
    char base[WCTL_HTTP_BASE_MAX]; /* path prefix without a trailing '/', "" for none */
    bool ipv6;                     /* host was written in brackets */
} wctl_url;

/* Called as body bytes move: done so far, total (0 when unknown). */
typedef void (*wctl_http_progress_fn)(void *arg, uint64_t done, uint64_t total);

/* Where and how to talk; borrowed by every call. */
typedef struct wctl_http_opts {
    const wctl_url *url; /* the server */
    const char *key;     /* bearer key; NULL or "" sends no Authorization header */
    unsigned timeout_ms; /* wait for the response headers at most this long; 0 = forever */
} wctl_http_opts;

/* One request. Strings and buffers are borrowed for the call. */
typedef struct wctl_http_req {
    const char *method;             /* "GET", "POST", "DELETE" */
    const char *path;               /* escaped path and query, starting with '/' */
    const char *content_type;       /* body type; NULL when there is no body */
    const void *body;               /* in-memory body, or NULL */
    size_t body_len;                /* bytes in body */
    FILE *body_file;                /* or a body read from this file, or NULL */
    uint64_t body_file_len;         /* bytes to send from body_file */
    FILE *sink;                     /* a 2xx response body is written here; NULL keeps it */
    wctl_http_progress_fn progress; /* called while sending body_file and filling sink */
    void *progress_arg;             /* passed to progress */
} wctl_http_req;

/* A response. */
typedef struct wctl_http_resp {
    int status;    /* HTTP status code */
    char *body;    /* the body, NUL-terminated, owned (wctl_http_resp_fini); "" if streamed */
    size_t len;    /* bytes in body */
    uint64_t sunk; /* bytes written to the request's sink */
} wctl_http_resp;

/* Initialises the HTTP library; call once before any request. */
void wctl_http_init(void);

/* Releases what wctl_http_init took. */
void wctl_http_fini(void);

/*
 * Parses text ("http://host[:port][/prefix]") into *out. WK_ENOTSUP for
 * https:// and other schemes, WK_EINVAL for anything malformed (the diag
 * says what). *out is written only on success.
 */
WK_MUST_CHECK wk_err wctl_url_parse(const char *text, wctl_url *out, wk_diag *d);

/*
 * Appends s to out (capacity cap, NUL-terminated) with every byte outside
 * RFC 3986's unreserved set and "@:" percent-encoded, so that s stays one
 * path segment or query value. WK_ETOOBIG when it does not fit (out is then
 * unspecified but NUL-terminated).
 */
WK_MUST_CHECK wk_err wctl_http_escape(const char *s, char *out, size_t cap);

/*
 * Sends req and reads the response into *out (fini it in every case).
 * WK_OK means a response arrived, whatever its status. Failures:
 * WK_EUNAVAIL the connection could not be made; WK_ETIMEDOUT no response
 * headers within opts->timeout_ms; WK_EPROTO the connection broke or the
 * response was malformed or truncated; WK_ETOOBIG a kept body over
 * WCTL_HTTP_BODY_MAX; WK_EIO reading body_file or writing sink failed;
 * WK_EINVAL a key or path with control characters; WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wctl_http_do(const wctl_http_opts *opts, const wctl_http_req *req,
                                  wctl_http_resp *out, wk_diag *d);

/* Frees what out holds and zeroes it. NULL-safe. */
void wctl_http_resp_fini(wctl_http_resp *out);

#endif /* WCTL_HTTP_H */
