/*
 * ctl_http: civetweb wrapper. One request handler is registered at "/"; it
 * matches the route table (exact paths first, then the longest prefix),
 * answers 404/405 itself, and reports each response to the observer.
 * It never parses JSON bodies: handlers do.
 *
 * Streamed replies can be handed to an event loop (ctl_sseloop) after their
 * headers. civetweb 1.15 has no call that gives a connection's socket: the
 * controller's recv() notes the socket each thread reads (ctl_http_recv.c),
 * and a handler's thread has read its own connection's request, so that is
 * the socket; its addresses are checked against the request's (client
 * address and port, the server's port and bound address) before it is
 * used, and a socket the client has reset (no peer) is not handed over.
 * The handler's thread owns the connection until it returns and waits for
 * the loop meanwhile, so civetweb neither reads, writes nor closes the
 * socket while the loop writes it (and its descriptor cannot be reused);
 * the reply is "Connection: close", so nothing else follows it on the
 * connection. Not handed over (the thread writes, as before): TLS, a name
 * bind address, a socket whose addresses do not match.
 */
#define WK_LOG_MODULE "http"
#include "ctl_http.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ctl_err.h"
#include "wk_json.h"
#include "wk_log.h"
#include "wk_net.h"

/* One end of a TCP connection, comparable by memcmp (zero-padded). */
typedef struct ctl_http_addr {
    uint16_t family;          /* AF_INET, AF_INET6; 0 = none */
    uint16_t port;            /* host order */
    uint8_t ip[16];           /* 4 or 16 bytes used */
} ctl_http_addr;

struct ctl_http {
    struct mg_context *ctx;   /* civetweb server */
    ctl_sseloop *loop;        /* writes handed-over streams; NULL = none */
    ctl_http_addr local;      /* the bound address (ip, port); family 0: no hand-over */
    bool local_any;           /* bound to the wildcard: the local ip is not compared */
    _Atomic uint64_t streams_loop;   /* streamed replies handed to an event loop */
    _Atomic uint64_t streams_thread; /* streamed replies written by their own thread */
    ctl_http_route *routes;   /* owned copy */
    size_t n_routes;          /* entries */
    size_t max_body;          /* body limit */
    size_t max_header;        /* request line + headers limit (civetweb's) */
    unsigned timeout_ms;      /* civetweb's write timeout, also a handed-over stream's */
    ctl_http_observer obs;    /* metrics hook, may be NULL */
    void *obs_arg;            /* passed to obs */
    ctl_http_authorizer auth; /* may be NULL */
    void *auth_arg;           /* passed to auth */
};

struct ctl_http_req {
    struct mg_connection *conn;           /* civetweb connection */
    const struct mg_request_info *ri;     /* request line and headers */
    ctl_http *h;                          /* server */
    char *body;                           /* read body, owned */
    size_t body_len;                      /* bytes in body */
    int status;                           /* status sent, 0 = none yet */
    const char *user;                     /* authenticated user */
    bool admin;                           /* admin rights */
    char *wbuf;                           /* SSE bytes not yet written, owned */
    size_t wlen;                          /* bytes in wbuf */
    size_t wcap;                          /* allocated */
    bool corked;                          /* SSE events wait for ctl_http_flush() */
    bool broken;                          /* a write failed: the client is gone */
    ctl_ssestream *ss;                    /* handed-over stream, owned; NULL = none */
    bool ss_on;                           /* it runs: writes go to the loop */
};

bool
ctl_http_host_is_loopback(const char *host)
{
    return wk_net_host_is_loopback(host);
}

const char *
ctl_http_req_method(const ctl_http_req *req)
{
    return req->ri->request_method;
}

const char *
ctl_http_req_path(const ctl_http_req *req)
{
    return req->ri->local_uri ? req->ri->local_uri : "/";
}

const char *
ctl_http_req_header(const ctl_http_req *req, const char *name)
{
    return mg_get_header(req->conn, name);
}

bool
ctl_http_req_query_get(const ctl_http_req *req, const char *name, char *buf, size_t cap)
{
    const char *q = req->ri->query_string;
    if (q == NULL || cap == 0)
        return false;
    return mg_get_var(q, strlen(q), name, buf, cap) >= 0;
}

const char *
ctl_http_req_user(const ctl_http_req *req)
{
    return req->user;
}

wk_err
ctl_http_req_body(ctl_http_req *req, const char **buf, size_t *len)
{
    if (req->body != NULL) {
        *buf = req->body;
        *len = req->body_len;
        return WK_OK;
    }
    long long cl = req->ri->content_length;
    if (cl > (long long)req->h->max_body)
        return WK_ETOOBIG;
    /*
     * A client that sent "Expect: 100-continue" (curl does for bodies over
     * 1 MB) waits for this interim answer before it sends the body; civetweb
     * sends it only for its own file handlers. A body refused by its length
     * (above) gets the final answer instead, and the body is never sent.
     */
    const char *expect = mg_get_header(req->conn, "Expect");
    if (expect != NULL && strcasecmp(expect, "100-continue") == 0 &&
        req->ri->http_version != NULL && strcmp(req->ri->http_version, "1.1") == 0)
        (void)mg_printf(req->conn, "HTTP/1.1 100 Continue\r\n\r\n");
    size_t cap = cl >= 0 ? (size_t)cl + 1 : 4096;
    char *b = malloc(cap);
    if (b == NULL)
        return WK_ENOMEM;
    size_t n = 0;
    for (;;) {
        if (n + 1 >= cap) {
            if (cap > req->h->max_body) {
                free(b);
                return WK_ETOOBIG;
            }
            size_t ncap = cap * 2;
            char *nb = realloc(b, ncap);
            if (nb == NULL) {
                free(b);
                return WK_ENOMEM;
            }
            b = nb;
            cap = ncap;
        }
        int r = mg_read(req->conn, b + n, cap - 1 - n);
        if (r < 0) {
            free(b);
            return WK_EIO;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n > req->h->max_body) {
            free(b);
            return WK_ETOOBIG;
        }
    }
    b[n] = '\0';
    req->body = b;
    req->body_len = n;
    *buf = b;
    *len = n;
    return WK_OK;
}

static const char *
ctl_http_reason(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 204:
        return "No Content";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 409:
        return "Conflict";
    case 413:
        return "Payload Too Large";
    case 429:
        return "Too Many Requests";
    case 500:
        return "Internal Server Error";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    default:
        return "Status";
    }
}

void
ctl_http_send(ctl_http_req *req, int status, const char *content_type, const char *body,
              size_t len)
{
    if (req->status != 0)
        return;
    req->status = status;
    mg_printf(req->conn,
              "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
              "Cache-Control: no-store\r\n\r\n",
              status, ctl_http_reason(status), content_type, len);
    if (len > 0 && strcmp(ctl_http_req_method(req), "HEAD") != 0)
        mg_write(req->conn, body, len);
}

void
ctl_http_send_json(ctl_http_req *req, int status, json_t *v)
{
    char *s = v ? wk_json_dump_compact(v) : NULL;
    json_decref(v);
    if (s == NULL) {
        static const char oom[] =
            "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
            "\"param\":null,\"code\":\"out_of_memory\"}}";
        ctl_http_send(req, 500, "application/json", oom, sizeof(oom) - 1);
        return;
    }
    ctl_http_send(req, status, "application/json", s, strlen(s));
    free(s);
}

/*
 * One info line per refused request (a 5xx: a warning): method, path, user,
 * status, param and the message, control characters of client text
 * replaced so that a line stays one line.
 */
static void
ctl_http_log_refusal(const ctl_http_req *req, int status, const char *param, const char *message)
{
    if (status < 400 || (status >= 500 ? WK_LOG_WARN : WK_LOG_INFO) > wk_log_threshold)
        return;
    char msg[240], prm[72], path[160];
    snprintf(msg, sizeof(msg), "%s", message ? message : "");
    snprintf(prm, sizeof(prm), "%s", param ? param : "-");
    snprintf(path, sizeof(path), "%s", req->ri && req->ri->local_uri ? req->ri->local_uri : "-");
    for (char *p = msg; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    for (char *p = prm; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f)
            *p = '?';
    for (char *p = path; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f)
            *p = '?';
    const char *method = req->ri && req->ri->request_method ? req->ri->request_method : "-";
    if (status >= 500)
        wk_log_warn("refused %s %s user=%s status=%d param=%s: %s", method, path,
                    req->user ? req->user : "-", status, prm, msg);
    else
        wk_log_info("refused %s %s user=%s status=%d param=%s: %s", method, path,
                    req->user ? req->user : "-", status, prm, msg);
}

void
ctl_http_send_error_status(ctl_http_req *req, int status, wk_err err, const char *message,
                           const char *param)
{
    ctl_http_log_refusal(req, status, param, message);
    char *s = ctl_err_body(err, message, param);
    if (s == NULL) {
        ctl_http_send(req, 500, "application/json", "{}", 2);
        return;
    }
    ctl_http_send(req, status, "application/json", s, strlen(s));
    free(s);
}

void
ctl_http_send_error_code(ctl_http_req *req, int status, wk_err err, const char *message,
                         const char *param, const char *code)
{
    ctl_http_log_refusal(req, status, param, message);
    char *s = ctl_err_body_code(err, message, param, code);
    if (s == NULL) {
        ctl_http_send(req, 500, "application/json", "{}", 2);
        return;
    }
    ctl_http_send(req, status, "application/json", s, strlen(s));
    free(s);
}

void
ctl_http_send_error(ctl_http_req *req, wk_err err, const char *message, const char *param)
{
    ctl_http_send_error_status(req, ctl_err_http_status(err), err, message, param);
}

void
ctl_http_sse_begin(ctl_http_req *req)
{
    if (req->status != 0)
        return;
    req->status = 200;
    mg_printf(req->conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         "Cache-Control: no-cache\r\nConnection: close\r\n"
                         "X-Accel-Buffering: no\r\n\r\n");
}

/* Appends n bytes to the request's write buffer. */
static wk_err
ctl_http_wbuf_put(ctl_http_req *req, const char *p, size_t n)
{
    if (req->wlen + n > req->wcap) {
        size_t cap = req->wcap ? req->wcap : 4096;
        while (cap < req->wlen + n)
            cap *= 2;
        char *np = realloc(req->wbuf, cap);
        if (np == NULL)
            return WK_ENOMEM;
        req->wbuf = np;
        req->wcap = cap;
    }
    memcpy(req->wbuf + req->wlen, p, n);
    req->wlen += n;
    return WK_OK;
}

bool
ctl_http_req_broken(const ctl_http_req *req)
{
    return req->broken;
}

wk_err
ctl_http_flush(ctl_http_req *req)
{
    if (req->broken) {
        req->wlen = 0;
        return WK_EIO;
    }
    if (req->wlen == 0)
        return WK_OK;
    if (req->ss_on) { /* (on the loop's thread: a non-blocking send, the rest kept) */
        wk_err err = ctl_ssestream_write(req->ss, req->wbuf, req->wlen);
        req->wlen = 0;
        if (err != WK_OK)
            req->broken = true;
        return err == WK_OK ? WK_OK : WK_EIO;
    }
    /* one write (one send() with tcp_nodelay) for everything buffered */
    int wr = mg_write(req->conn, req->wbuf, req->wlen);
    req->wlen = 0;
    if (wr <= 0) {
        req->broken = true;
        return WK_EIO;
    }
    return WK_OK;
}

void
ctl_http_cork(ctl_http_req *req, bool on)
{
    req->corked = on;
    if (!on) {
        wk_err err = ctl_http_flush(req);
        (void)err; /* (a failure shows at the next write: broken) */
    }
}

/* Buffers one event ("event: <event>\n" when event is set, then the data line). */
static wk_err
ctl_http_sse_put(ctl_http_req *req, const char *event, const char *payload)
{
    if (req->broken)
        return WK_EIO;
    size_t n = strlen(payload);
    wk_err err = WK_OK;
    if (event != NULL) {
        err = ctl_http_wbuf_put(req, "event: ", 7);
        if (err == WK_OK)
            err = ctl_http_wbuf_put(req, event, strlen(event));
        if (err == WK_OK)
            err = ctl_http_wbuf_put(req, "\n", 1);
    }
    if (err == WK_OK)
        err = ctl_http_wbuf_put(req, "data: ", 6);
    if (err == WK_OK)
        err = ctl_http_wbuf_put(req, payload, n);
    if (err == WK_OK)
        err = ctl_http_wbuf_put(req, "\n\n", 2);
    if (err != WK_OK)
        return err;
    return req->corked ? WK_OK : ctl_http_flush(req);
}

wk_err
ctl_http_sse_data(ctl_http_req *req, const char *payload)
{
    return ctl_http_sse_put(req, NULL, payload);
}

wk_err
ctl_http_sse_event(ctl_http_req *req, const char *event, const char *payload)
{
    return ctl_http_sse_put(req, event, payload);
}

/* addr from a sockaddr; false for other families. */
static bool
ctl_http_addr_of(const struct sockaddr_storage *sa, ctl_http_addr *out)
{
    memset(out, 0, sizeof(*out));
    if (sa->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        out->family = AF_INET;
        out->port = ntohs(in->sin_port);
        memcpy(out->ip, &in->sin_addr, 4);
        return true;
    }
    if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        out->family = AF_INET6;
        out->port = ntohs(in6->sin6_port);
        memcpy(out->ip, &in6->sin6_addr, 16);
        return true;
    }
    return false;
}

/* addr from a numeric address (brackets allowed) and a port; false if not one. */
static bool
ctl_http_addr_parse(const char *s, unsigned port, ctl_http_addr *out)
{
    char buf[64];
    size_t n = strlen(s);
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
        s++;
        n -= 2;
    }
    if (n >= sizeof(buf))
        return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    memset(out, 0, sizeof(*out));
    out->port = (uint16_t)port;
    if (inet_pton(AF_INET, buf, out->ip) == 1) {
        out->family = AF_INET;
        return true;
    }
    if (inet_pton(AF_INET6, buf, out->ip) == 1) {
        out->family = AF_INET6;
        return true;
    }
    return false;
}

/* True when fd is a TCP socket from h's bound address to peer. */
static bool
ctl_http_fd_is(const ctl_http *h, int fd, const ctl_http_addr *peer)
{
    struct sockaddr_storage sa;
    socklen_t len = sizeof(sa);
    ctl_http_addr a;
    if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0 || !ctl_http_addr_of(&sa, &a))
        return false;
    if (h->local_any ? a.family != h->local.family || a.port != h->local.port
                     : memcmp(&a, &h->local, sizeof(a)) != 0)
        return false;
    len = sizeof(sa);
    return getpeername(fd, (struct sockaddr *)&sa, &len) == 0 && ctl_http_addr_of(&sa, &a) &&
           memcmp(&a, peer, sizeof(a)) == 0;
}

/* The socket of req's connection (see the top of this file), -1 when it cannot be handed over. */
static int
ctl_http_conn_fd(ctl_http_req *req)
{
    ctl_http *h = req->h;
    const struct mg_request_info *ri = req->ri;
    ctl_http_addr peer;
    if (h->local.family == 0 || ri->is_ssl || ri->server_port != h->local.port ||
        !ctl_http_addr_parse(ri->remote_addr, (unsigned)ri->remote_port, &peer))
        return -1;
    int fd = ctl_http_recv_last_fd();
    if (fd < 0 || !ctl_http_fd_is(h, fd, &peer)) {
        wk_log_debug("stream of port %d stays on its thread (fd=%d)", ri->remote_port, fd);
        return -1;
    }
    return fd;
}

static wk_err
ctl_http_sse_handover(ctl_http_req *req, ctl_ssestream_pump_fn pump, void *arg,
                      ctl_ssestream **out)
{
    if (req->h->loop == NULL || req->status != 200 || req->broken || req->ss != NULL)
        return WK_ENOTSUP;
    /* what the thread buffered goes out first, by the thread */
    if (req->wlen > 0 && ctl_http_flush(req) != WK_OK)
        return WK_ENOTSUP;
    int fd = ctl_http_conn_fd(req);
    if (fd < 0)
        return WK_ENOTSUP;
    wk_err err = ctl_ssestream_new(req->h->loop, fd, pump, arg, &req->ss);
    if (err != WK_OK)
        return err == WK_ENOMEM ? WK_ENOTSUP : err;
    *out = req->ss;
    return WK_OK;
}

wk_err
ctl_http_sse_detach(ctl_http_req *req, ctl_ssestream_pump_fn pump, void *arg,
                    ctl_ssestream **out)
{
    wk_err err = ctl_http_sse_handover(req, pump, arg, out);
    atomic_fetch_add(err == WK_OK ? &req->h->streams_loop : &req->h->streams_thread, 1);
    return err;
}

void
ctl_http_stream_counts(const ctl_http *h, uint64_t *by_loop, uint64_t *by_thread)
{
    *by_loop = atomic_load(&((ctl_http *)h)->streams_loop);
    *by_thread = atomic_load(&((ctl_http *)h)->streams_thread);
}

wk_err
ctl_http_sse_run(ctl_http_req *req, uint64_t deadline_ms)
{
    req->ss_on = true;
    /* (a client that stops reading is dropped after the same time as civetweb's writes) */
    wk_err err = ctl_ssestream_run(req->ss, deadline_ms, req->h->timeout_ms);
    req->ss_on = false;
    if (err == WK_EIO)
        req->broken = true;
    return err;
}

static const ctl_http_route *
ctl_http_match(const ctl_http *h, const char *path, const char *method, bool *method_ok)
{
    const ctl_http_route *best = NULL;
    size_t best_len = 0;
    bool path_seen = false;
    for (size_t i = 0; i < h->n_routes; i++) {
        const ctl_http_route *r = &h->routes[i];
        size_t len = strlen(r->path);
        bool hit = r->prefix ? strncmp(path, r->path, len) == 0 : strcmp(path, r->path) == 0;
        if (!hit)
            continue;
        path_seen = true;
        bool m = r->method == NULL || strcmp(r->method, method) == 0 ||
                 (strcmp(method, "HEAD") == 0 && strcmp(r->method, "GET") == 0);
        if (!m)
            continue;
        /* Exact routes beat prefixes; longer prefixes beat shorter ones. */
        size_t score = r->prefix ? len : (size_t)-1;
        if (best == NULL || score > best_len) {
            best = r;
            best_len = score;
        }
    }
    *method_ok = best != NULL || !path_seen;
    return best;
}

static int
ctl_http_dispatch(struct mg_connection *conn, void *cbdata)
{
    ctl_http *h = cbdata;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ctl_http_req req = {.conn = conn, .ri = mg_get_request_info(conn), .h = h};
    bool method_ok = true;
    const char *path = ctl_http_req_path(&req);
    const ctl_http_route *r = ctl_http_match(h, path, req.ri->request_method, &method_ok);
    const char *label = "other";
    req.user = "local";
    req.admin = true;
    wk_err aerr = WK_OK;
    if (r != NULL && r->access != CTL_HTTP_ACCESS_PUBLIC && h->auth != NULL)
        aerr = h->auth(mg_get_header(conn, "Authorization"), mg_get_header(conn, "x-api-key"),
                       &req.user, &req.admin, h->auth_arg);
    if (r != NULL && aerr != WK_OK) {
        label = r->label ? r->label : r->path;
        ctl_http_send_error(&req, WK_EAUTH, "missing or invalid API key", NULL);
    } else if (r != NULL && r->access == CTL_HTTP_ACCESS_ADMIN && !req.admin) {
        label = r->label ? r->label : r->path;
        ctl_http_send_error(&req, WK_EPERM, "this route needs an admin key", NULL);
    } else if (r != NULL) {
        label = r->label ? r->label : r->path;
        r->fn(&req, r->arg);
        if (req.status == 0)
            ctl_http_send_error(&req, WK_EIO, "handler sent no response", NULL);
    } else if (!method_ok) {
        char msg[160];
        snprintf(msg, sizeof(msg), "method %s not allowed on %s", req.ri->request_method,
                 path);
        ctl_http_send_error_status(&req, 405, WK_EINVAL, msg, NULL);
    } else {
        char msg[200];
        snprintf(msg, sizeof(msg), "no route for %.150s", path);
        ctl_http_send_error(&req, WK_ENOENT, msg, NULL);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (h->obs != NULL)
        h->obs(label, req.ri->request_method, req.status, secs, h->obs_arg);
    wk_log_debug("%s %s status=%d seconds=%.6f", req.ri->request_method, path, req.status,
                 secs);
    free(req.body);
    free(req.wbuf);
    ctl_ssestream_free(req.ss); /* (its job, and so its waker, went with the handler) */
    return req.status;
}

/*
 * civetweb's own refusals (a malformed request, a request line + headers
 * over max_request_size, ...) get an OpenAI error body instead of text/plain.
 */
static int
ctl_http_civetweb_error(struct mg_connection *conn, int status, const char *errmsg)
{
    const ctl_http *h = mg_get_user_data(mg_get_context(conn));
    char msg[400];
    snprintf(msg, sizeof(msg), "%.200s (request line and headers are limited to %zu bytes)",
             errmsg != NULL && errmsg[0] ? errmsg : "bad request", h ? h->max_header : 0);
    wk_err err = status == 413 || status == 431 ? WK_ETOOBIG
                 : status >= 500                 ? WK_EIO
                                                 : WK_EINVAL;
    char *body = ctl_err_body(err, msg, NULL);
    if (body == NULL)
        return 1; /* civetweb's plain page */
    mg_printf(conn,
              "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
              "Cache-Control: no-store\r\nConnection: close\r\n\r\n%s",
              status, ctl_http_reason(status), strlen(body), body);
    free(body);
    return 0;
}

static int
ctl_http_log_message(const struct mg_connection *conn, const char *message)
{
    (void)conn;
    wk_log_warn("civetweb: %s", message);
    return 1;
}

wk_err
ctl_http_new(const ctl_http_config *cfg, const ctl_http_route *routes, size_t n_routes,
             ctl_http_observer obs, void *obs_arg, ctl_http **out, wk_diag *d)
{
    if (cfg->port == 0 || cfg->port > 65535)
        return wk_diag_set(d, WK_EINVAL, "port %u out of range", cfg->port);
    if (strchr(cfg->host, ':') != NULL && cfg->host[0] != '[')
        return wk_diag_set(d, WK_EINVAL, "write IPv6 hosts in brackets: [%s]", cfg->host);
    ctl_http *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return WK_ENOMEM;
    h->routes = calloc(n_routes ? n_routes : 1, sizeof(*h->routes));
    if (h->routes == NULL) {
        free(h);
        return WK_ENOMEM;
    }
    memcpy(h->routes, routes, n_routes * sizeof(*routes));
    h->n_routes = n_routes;
    h->max_body = cfg->max_body;
    h->max_header = cfg->max_header ? cfg->max_header : 16384;
    h->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : 600000;
    h->obs = obs;
    h->obs_arg = obs_arg;
    h->auth = cfg->auth;
    h->auth_arg = cfg->auth_arg;
    char ports[300];
    const char *host = strcmp(cfg->host, "localhost") == 0 ? "127.0.0.1" : cfg->host;
    if (host[0] == '[')
        snprintf(ports, sizeof(ports), "%s:%u", host, cfg->port);
    else
        snprintf(ports, sizeof(ports), "%s:%u", host, cfg->port);
    char threads[16], timeout[16], maxreq[24];
    snprintf(threads, sizeof(threads), "%u", cfg->threads ? cfg->threads : 16);
    snprintf(timeout, sizeof(timeout), "%u", cfg->timeout_ms ? cfg->timeout_ms : 600000);
    snprintf(maxreq, sizeof(maxreq), "%zu", h->max_header);
    const char *opts[] = {"listening_ports", ports,     "num_threads",        threads,
                          "request_timeout_ms", timeout, "enable_keep_alive", "yes",
                          "tcp_nodelay",        "1",     "max_request_size",  maxreq,
                          NULL};
    struct mg_callbacks cb;
    memset(&cb, 0, sizeof(cb));
    cb.log_message = ctl_http_log_message;
    cb.http_error = ctl_http_civetweb_error;
    struct mg_init_data init = {.callbacks = &cb, .user_data = h, .configuration_options = opts};
    struct mg_error_data err = {0};
    char errtext[256] = "";
    err.text = errtext;
    err.text_buffer_size = sizeof(errtext);
    mg_init_library(0);
    h->ctx = mg_start2(&init, &err);
    if (h->ctx == NULL) {
        wk_err e = wk_diag_set(d, WK_EIO, "cannot listen on %s: %s", ports,
                               errtext[0] ? errtext : "civetweb start failed");
        free(h->routes);
        free(h);
        return e;
    }
    mg_set_request_handler(h->ctx, "/", ctl_http_dispatch, h);
    /*
     * Streams are handed to the event loops when the bind address is
     * numeric (a wildcard one compares the local port and family only).
     */
    ctl_http_addr any4 = {.family = AF_INET, .port = (uint16_t)cfg->port};
    ctl_http_addr any6 = {.family = AF_INET6, .port = (uint16_t)cfg->port};
    if (cfg->sse_loops > 0 && ctl_http_addr_parse(host, cfg->port, &h->local)) {
        h->local_any = memcmp(&h->local, &any4, sizeof(any4)) == 0 ||
                       memcmp(&h->local, &any6, sizeof(any6)) == 0;
        wk_diag ld = {{0}};
        if (ctl_sseloop_new(cfg->sse_loops, cfg->sse_flush_ms, &h->loop, &ld) != WK_OK) {
            wk_log_warn("streams stay on their threads: %s", ld.msg);
            h->loop = NULL;
        }
    }
    if (h->loop == NULL)
        memset(&h->local, 0, sizeof(h->local));
    *out = h;
    return WK_OK;
}

void
ctl_http_free(ctl_http *h)
{
    if (h == NULL)
        return;
    /* streams end first, as civetweb's own writes fail once it stops */
    ctl_sseloop_close(h->loop);
    if (h->ctx != NULL)
        mg_stop(h->ctx); /* (handlers, and so streams, have ended) */
    ctl_sseloop_free(h->loop);
    free(h->routes);
    free(h);
}
