/*
 * wk_net: loopback and URL checks by parsing (see wk_net.h). Never logs.
 */
#include "wk_net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static bool
wk_net_v4_loopback(const struct in_addr *a)
{
    return (ntohl(a->s_addr) >> 24) == 127u;
}

static bool
wk_net_v6_loopback(const struct in6_addr *a)
{
    if (IN6_IS_ADDR_LOOPBACK(a))
        return true;
    if (IN6_IS_ADDR_V4MAPPED(a)) {
        struct in_addr v4;
        memcpy(&v4, &a->s6_addr[12], 4);
        return wk_net_v4_loopback(&v4);
    }
    return false;
}

bool
wk_net_host_is_loopback(const char *host)
{
    if (host == NULL || host[0] == '\0')
        return false;
    char buf[256];
    size_t n = strlen(host);
    if (host[0] == '[') {
        if (n < 3 || host[n - 1] != ']' || n - 2 >= sizeof(buf))
            return false;
        memcpy(buf, host + 1, n - 2);
        buf[n - 2] = '\0';
    } else {
        if (n >= sizeof(buf))
            return false;
        memcpy(buf, host, n + 1);
    }
    struct in_addr v4;
    struct in6_addr v6;
    if (inet_pton(AF_INET6, buf, &v6) == 1)
        return wk_net_v6_loopback(&v6);
    if (host[0] == '[') /* brackets hold an IPv6 literal, never IPv4 or a name */
        return false;
    if (inet_pton(AF_INET, buf, &v4) == 1)
        return wk_net_v4_loopback(&v4);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(buf, NULL, &hints, &res) != 0 || res == NULL)
        return false;
    bool all = true;
    for (const struct addrinfo *a = res; a != NULL && all; a = a->ai_next) {
        if (a->ai_family == AF_INET)
            all = wk_net_v4_loopback(&((const struct sockaddr_in *)(const void *)a->ai_addr)
                                          ->sin_addr);
        else if (a->ai_family == AF_INET6)
            all = wk_net_v6_loopback(&((const struct sockaddr_in6 *)(const void *)a->ai_addr)
                                          ->sin6_addr);
        else
            all = false;
    }
    freeaddrinfo(res);
    return all;
}

/* "tcp" / "tcp4" / "tcp6" at s, followed by "://": returns the rest, else NULL. */
static const char *
wk_net_tcp_rest(const char *s)
{
    static const char *const forms[] = {"tcp://", "tcp4://", "tcp6://"};
    for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++)
        if (strncmp(s, forms[i], strlen(forms[i])) == 0)
            return s + strlen(forms[i]);
    return NULL;
}

wk_err
wk_net_url_parse(const char *url, wk_net_scheme *scheme, char *host, size_t cap, wk_diag *d)
{
    if (url == NULL || scheme == NULL || host == NULL || cap == 0)
        return wk_diag_set(d, WK_EINVAL, "no URL");
    if (strncmp(url, "ipc://", 6) == 0) {
        if (url[6] == '\0')
            return wk_diag_set(d, WK_EINVAL, "%s: no socket path", url);
        *scheme = WK_NET_SCHEME_IPC;
        host[0] = '\0';
        return WK_OK;
    }
    wk_net_scheme sc = WK_NET_SCHEME_TCP;
    const char *rest = wk_net_tcp_rest(url);
    if (rest == NULL && strncmp(url, "tls+", 4) == 0) {
        rest = wk_net_tcp_rest(url + 4);
        sc = WK_NET_SCHEME_TLS;
    }
    if (rest == NULL)
        return wk_diag_set(d, WK_EINVAL,
                           "%s: the worker link takes ipc://PATH, tcp://HOST:PORT or "
                           "tls+tcp://HOST:PORT",
                           url);
    const char *colon;
    const char *h0 = rest, *h1;
    if (rest[0] == '[') {
        const char *close = strchr(rest, ']');
        if (close == NULL || close[1] != ':')
            return wk_diag_set(d, WK_EINVAL, "%s: an IPv6 host is written [ADDR]:PORT", url);
        h0 = rest + 1;
        h1 = close;
        colon = close + 1;
    } else {
        colon = strrchr(rest, ':');
        if (colon == NULL || strchr(rest, ':') != colon)
            return wk_diag_set(d, WK_EINVAL, "%s: want HOST:PORT (IPv6 in [ ])", url);
        h1 = colon;
    }
    const char *port = colon + 1;
    if (port[0] == '\0' || strspn(port, "0123456789") != strlen(port) || strlen(port) > 5 ||
        atoi(port) > 65535)
        return wk_diag_set(d, WK_EINVAL, "%s: the port must be a number 0..65535", url);
    size_t hn = (size_t)(h1 - h0);
    if (hn == 0)
        return wk_diag_set(d, WK_EINVAL,
                           "%s: no host (a wildcard listen address must be written out, e.g. "
                           "0.0.0.0)",
                           url);
    if (hn >= cap)
        return wk_diag_set(d, WK_EINVAL, "%s: host too long", url);
    memcpy(host, h0, hn);
    host[hn] = '\0';
    *scheme = sc;
    return WK_OK;
}
