/*
 * wctl_http: wkvmctl's HTTP client over civetweb's client API
 * (mg_connect_client, mg_write, mg_get_response, mg_read). One connection
 * per request; the request line and headers go out in one write. It must
 * never print, never follow redirects, and never put a caller's control
 * characters on the wire (header injection).
 */
#include "wctl_http.h"

#include <civetweb.h>
#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define WCTL_HTTP_CHUNK (256u << 10) /* bytes per read or write of a body */

void
wctl_http_init(void)
{
    mg_init_library(0);
}

void
wctl_http_fini(void)
{
    mg_exit_library();
}

wk_err
wctl_url_parse(const char *text, wctl_url *out, wk_diag *d)
{
    wctl_url u;
    memset(&u, 0, sizeof(u));
    if (text == NULL || text[0] == '\0')
        return wk_diag_set(d, WK_EINVAL, "empty URL");
    for (const char *p = text; *p; p++) {
        if ((unsigned char)*p <= 0x20 || *p == 0x7f)
            return wk_diag_set(d, WK_EINVAL, "URL '%s' contains a space or control character",
                               text);
    }
    const char *p = text;
    if (strncasecmp(p, "https://", 8) == 0)
        return wk_diag_set(d, WK_ENOTSUP,
                           "https is not supported; use http:// (loopback) or a "
                           "local TLS proxy");
    if (strncasecmp(p, "http://", 7) != 0) {
        if (strstr(p, "://") != NULL)
            return wk_diag_set(d, WK_ENOTSUP, "URL '%s': only http:// is supported", text);
        return wk_diag_set(d, WK_EINVAL, "URL '%s' must start with http://", text);
    }
    p += 7;
    const char *host = p, *host_end;
    if (*p == '[') {
        host = p + 1;
        host_end = strchr(host, ']');
        if (host_end == NULL)
            return wk_diag_set(d, WK_EINVAL, "URL '%s': unterminated '[' in host", text);
        p = host_end + 1;
        u.ipv6 = true;
    } else {
        host_end = p + strcspn(p, ":/?#");
        p = host_end;
    }
    size_t hl = (size_t)(host_end - host);
    if (hl == 0 || hl >= sizeof(u.host))
        return wk_diag_set(d, WK_EINVAL, "URL '%s': %s host", text, hl ? "overlong" : "no");
    memcpy(u.host, host, hl);
    u.host[hl] = '\0';
    u.port = 80;
    if (*p == ':') {
        p++;
        char *end = NULL;
        if (!isdigit((unsigned char)*p))
            return wk_diag_set(d, WK_EINVAL, "URL '%s': bad port", text);
        unsigned long port = strtoul(p, &end, 10);
        if (port == 0 || port > 65535)
            return wk_diag_set(d, WK_EINVAL, "URL '%s': port out of range", text);
        u.port = (int)port;
        p = end;
    }
    if (*p == '?' || *p == '#')
        return wk_diag_set(d, WK_EINVAL, "URL '%s': a query or fragment is not allowed", text);
    if (*p != '\0' && *p != '/')
        return wk_diag_set(d, WK_EINVAL, "URL '%s': bad port", text);
    size_t bl = strlen(p);
    while (bl > 0 && p[bl - 1] == '/')
        bl--;
    if (strpbrk(p, "?#") != NULL)
        return wk_diag_set(d, WK_EINVAL, "URL '%s': a query or fragment is not allowed", text);
    if (bl >= sizeof(u.base))
        return wk_diag_set(d, WK_EINVAL, "URL '%s': path too long", text);
    memcpy(u.base, p, bl);
    u.base[bl] = '\0';
    *out = u;
    return WK_OK;
}

wk_err
wctl_http_escape(const char *s, char *out, size_t cap)
{
    static const char hx[] = "0123456789ABCDEF";
    size_t n = strnlen(out, cap);
    if (n >= cap)
        return WK_ETOOBIG;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        bool plain =
            isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == '@' || c == ':';
        size_t need = plain ? 1 : 3;
        if (n + need >= cap) {
            out[n] = '\0';
            return WK_ETOOBIG;
        }
        if (plain) {
            out[n++] = (char)c;
        } else {
            out[n++] = '%';
            out[n++] = hx[c >> 4];
            out[n++] = hx[c & 15];
        }
    }
    out[n] = '\0';
    return WK_OK;
}

static bool
wctl_http_clean(const char *s)
{
    for (; s != NULL && *s; s++) {
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return false;
    }
    return true;
}

static double
wctl_http_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A growing string for the request head. */
typedef struct wctl_http_buf {
    char *s;    /* NUL-terminated text, owned */
    size_t n;   /* bytes used, without the NUL */
    size_t cap; /* bytes allocated */
    bool oom;   /* an append failed */
} wctl_http_buf;

/* Appends formatted text; on ENOMEM sets b->oom and leaves b as it was. */
static void wctl_http_buf_add(wctl_http_buf *b, const char *fmt, ...) WK_PRINTF(2, 3);

static void
wctl_http_buf_add(wctl_http_buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
        return;
    }
    if (b->n + (size_t)n + 1 > b->cap) {
        size_t ncap = (b->n + (size_t)n + 1) * 2;
        char *ns = realloc(b->s, ncap);
        if (ns == NULL) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap = ncap;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

/* Writes all of buf; false when the peer closed or the write failed. */
static bool
wctl_http_write(struct mg_connection *conn, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        size_t n = len > WCTL_HTTP_CHUNK ? WCTL_HTTP_CHUNK : len;
        int w = mg_write(conn, p, n);
        if (w <= 0)
            return false;
        p += w;
        len -= (size_t)w;
    }
    return true;
}

/*
 * Sends the request line, headers and body. *sent becomes false when the
 * peer stopped taking bytes: not fatal yet, it may have answered (413, 401).
 * Errors: WK_ENOMEM, WK_EIO (body_file ended early).
 */
static wk_err
wctl_http_send(struct mg_connection *conn, const wctl_http_opts *o, const wctl_http_req *r,
               bool *sent, wk_diag *d)
{
    const wctl_url *u = o->url;
    bool has_body = r->content_type != NULL;
    uint64_t body_len = r->body_file != NULL ? r->body_file_len : r->body_len;
    wctl_http_buf h = {0};
    wctl_http_buf_add(&h, "%s %s%s HTTP/1.1\r\n", r->method, u->base, r->path);
    wctl_http_buf_add(&h, "Host: %s%s%s:%d\r\n", u->ipv6 ? "[" : "", u->host, u->ipv6 ? "]" : "",
                      u->port);
    wctl_http_buf_add(&h, "User-Agent: wkvmctl\r\nConnection: close\r\n");
    if (o->key != NULL && o->key[0] != '\0')
        wctl_http_buf_add(&h, "Authorization: Bearer %s\r\n", o->key);
    if (has_body)
        wctl_http_buf_add(&h, "Content-Type: %s\r\nContent-Length: %llu\r\n", r->content_type,
                          (unsigned long long)body_len);
    else if (strcmp(r->method, "GET") != 0 && strcmp(r->method, "HEAD") != 0)
        wctl_http_buf_add(&h, "Content-Length: 0\r\n");
    wctl_http_buf_add(&h, "\r\n");
    if (h.oom) {
        free(h.s);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    char *head = h.s;
    *sent = wctl_http_write(conn, head, h.n);
    free(head);
    if (!*sent || !has_body)
        return WK_OK;
    if (r->body_file == NULL) {
        *sent = wctl_http_write(conn, r->body, r->body_len);
        return WK_OK;
    }
    char *buf = malloc(WCTL_HTTP_CHUNK);
    if (buf == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    uint64_t done = 0;
    wk_err err = WK_OK;
    while (done < r->body_file_len) {
        uint64_t left = r->body_file_len - done;
        size_t want = left > WCTL_HTTP_CHUNK ? WCTL_HTTP_CHUNK : (size_t)left;
        size_t got = fread(buf, 1, want, r->body_file);
        if (got == 0) {
            err = wk_diag_set(d, WK_EIO, "the file ended after %llu of %llu bytes",
                              (unsigned long long)done, (unsigned long long)r->body_file_len);
            break;
        }
        if (!wctl_http_write(conn, buf, got)) {
            *sent = false;
            break;
        }
        done += got;
        if (r->progress != NULL)
            r->progress(r->progress_arg, done, r->body_file_len);
    }
    free(buf);
    return err;
}

/* Reads the body: into r->sink for a 2xx when there is one, else into out->body. */
static wk_err
wctl_http_read_body(struct mg_connection *conn, const wctl_http_req *r, long long clen,
                    wctl_http_resp *out, wk_diag *d)
{
    bool to_sink = r->sink != NULL && out->status >= 200 && out->status < 300;
    uint64_t total = clen > 0 ? (uint64_t)clen : 0;
    if (!to_sink && clen > (long long)WCTL_HTTP_BODY_MAX)
        return wk_diag_set(d, WK_ETOOBIG, "the response is %lld bytes, over the %u MiB limit", clen,
                           WCTL_HTTP_BODY_MAX >> 20);
    size_t cap = to_sink ? WCTL_HTTP_CHUNK : (clen >= 0 ? (size_t)clen + 1 : 4096);
    char *buf = malloc(cap);
    if (buf == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    size_t n = 0;
    uint64_t done = 0;
    wk_err err = WK_OK;
    for (;;) {
        if (!to_sink && n + 1 >= cap) {
            if (cap > WCTL_HTTP_BODY_MAX) {
                err = wk_diag_set(d, WK_ETOOBIG, "the response is over the %u MiB limit",
                                  WCTL_HTTP_BODY_MAX >> 20);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                err = wk_diag_set(d, WK_ENOMEM, "out of memory");
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t room = to_sink ? cap : cap - 1 - n;
        int got = mg_read(conn, to_sink ? buf : buf + n, room);
        if (got < 0) {
            err = wk_diag_set(d, WK_EPROTO, "the connection broke after %llu body bytes",
                              (unsigned long long)(to_sink ? done : n));
            break;
        }
        if (got == 0)
            break;
        if (to_sink) {
            if (fwrite(buf, 1, (size_t)got, r->sink) != (size_t)got) {
                err = wk_diag_set(d, WK_EIO, "cannot write the output file");
                break;
            }
            done += (uint64_t)got;
            if (r->progress != NULL)
                r->progress(r->progress_arg, done, total);
        } else {
            n += (size_t)got;
        }
    }
    uint64_t have = to_sink ? done : n;
    if (err == WK_OK && clen >= 0 && have != (uint64_t)clen)
        err = wk_diag_set(d, WK_EPROTO, "the response ended after %llu of %lld bytes",
                          (unsigned long long)have, clen);
    if (err != WK_OK || to_sink) {
        free(buf);
        buf = NULL;
        n = 0;
    }
    if (err != WK_OK)
        return err;
    if (buf == NULL) {
        buf = calloc(1, 1);
        if (buf == NULL)
            return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    buf[n] = '\0';
    out->body = buf;
    out->len = n;
    out->sunk = done;
    return WK_OK;
}

wk_err
wctl_http_do(const wctl_http_opts *o, const wctl_http_req *r, wctl_http_resp *out, wk_diag *d)
{
    memset(out, 0, sizeof(*out));
    if (!wctl_http_clean(o->key))
        return wk_diag_set(d, WK_EINVAL, "the API key contains control characters");
    if (!wctl_http_clean(r->path) || r->path[0] != '/' || strchr(r->path, ' ') != NULL)
        return wk_diag_set(d, WK_EINVAL, "bad request path");
    if (r->content_type != NULL && !wctl_http_clean(r->content_type))
        return wk_diag_set(d, WK_EINVAL, "bad content type");
    char ebuf[256] = "";
    struct mg_connection *conn =
        mg_connect_client(o->url->host, o->url->port, 0, ebuf, sizeof(ebuf));
    if (conn == NULL)
        return wk_diag_set(d, WK_EUNAVAIL, "%s", ebuf[0] ? ebuf : "connection failed");
    bool sent = true;
    wk_err err = wctl_http_send(conn, o, r, &sent, d);
    if (err != WK_OK) {
        mg_close_connection(conn);
        return err;
    }
    /* Even when the send broke off, the server may have answered (413, 401). */
    int tmo = o->timeout_ms == 0 ? -1 : o->timeout_ms > INT_MAX ? INT_MAX : (int)o->timeout_ms;
    double t0 = wctl_http_now();
    ebuf[0] = '\0';
    if (mg_get_response(conn, ebuf, sizeof(ebuf), tmo) < 0) {
        double waited = wctl_http_now() - t0;
        mg_close_connection(conn);
        if (tmo > 0 && waited * 1000.0 >= (double)tmo - 50.0)
            return wk_diag_set(d, WK_ETIMEDOUT, "no response within %.0f s", tmo / 1000.0);
        if (!sent)
            return wk_diag_set(d, WK_EPROTO,
                               "the server closed the connection while the "
                               "request was sent%s%s",
                               ebuf[0] ? ": " : "", ebuf);
        return wk_diag_set(d, WK_EPROTO, "%s", ebuf[0] ? ebuf : "no valid HTTP response");
    }
    const struct mg_response_info *ri = mg_get_response_info(conn);
    if (ri == NULL || ri->status_code < 100 || ri->status_code > 999) {
        mg_close_connection(conn);
        return wk_diag_set(d, WK_EPROTO, "malformed HTTP status line");
    }
    out->status = ri->status_code;
    err = wctl_http_read_body(conn, r, ri->content_length, out, d);
    mg_close_connection(conn);
    if (err != WK_OK)
        out->status = 0;
    return err;
}

void
wctl_http_resp_fini(wctl_http_resp *out)
{
    if (out == NULL)
        return;
    free(out->body);
    memset(out, 0, sizeof(*out));
}
