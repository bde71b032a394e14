/*
 * wk_net: what a listen or dial address is, decided by parsing it, never by
 * how it is spelt ("127.0.0.1.example.com" is not loopback, "::ffff:127.0.0.1"
 * is). Used by the controller for its HTTP bind address and the worker link,
 * and by the worker for the link it dials. No I/O but name resolution.
 */
#ifndef WK_NET_H
#define WK_NET_H

#include <stdbool.h>
#include <stddef.h>

#include "wk_err.h"

/*
 * True when every address host stands for is a loopback address
 * (127.0.0.0/8, ::1, or ::ffff:127.0.0.0/104). host is an IPv4 or IPv6
 * literal (IPv6 with or without [ ]) or a name, which is resolved: a name
 * is loopback only when it resolves and all of its addresses are. NULL,
 * "", a wildcard ("0.0.0.0", "::", "*") or an unresolvable name: false.
 * Thread-safe.
 */
bool wk_net_host_is_loopback(const char *host);

/* The transport of an NNG URL (wk_net_url_parse). */
typedef enum wk_net_scheme {
    WK_NET_SCHEME_IPC = 0, /* ipc:// (a local socket file) */
    WK_NET_SCHEME_TCP,     /* tcp://, tcp4://, tcp6:// (no encryption, no authentication) */
    WK_NET_SCHEME_TLS,     /* tls+tcp://, tls+tcp4://, tls+tcp6:// */
} wk_net_scheme;

/*
 * Splits an NNG URL of the worker link into its scheme and host (the host
 * without [ ] for IPv6; "" for ipc://). The tcp forms need "host:port" with
 * a host and a numeric port. WK_EINVAL (diag says why) for any other scheme
 * or a malformed address; host is written only on success (cap bytes).
 */
WK_MUST_CHECK wk_err wk_net_url_parse(const char *url, wk_net_scheme *scheme, char *host,
                                      size_t cap, wk_diag *d);

#endif /* WK_NET_H */
