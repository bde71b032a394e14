/*
 * ctl_http_recv: which socket a civetweb thread reads. civetweb 1.15 has no
 * call that gives a connection's socket, and a streamed reply is handed to
 * an event loop by its socket (ctl_http_sse_detach). civetweb reads a plain
 * connection with recv(); this definition of recv() in the controller
 * interposes the C library's for the shared library (the dynamic linker
 * binds civetweb's recv to the executable's), does the same system call,
 * and notes the descriptor per thread. A civetweb thread serves one
 * connection at a time and reads the request (and its body) before the
 * handler runs on that same thread, so the handler's thread's last
 * descriptor is its connection's socket: exact, without matching addresses
 * (which a reset connection and a new one from the same address and port
 * could share). ctl_http still checks the descriptor's addresses.
 *
 * This file includes no <sys/socket.h>: with _FORTIFY_SOURCE it defines
 * recv() inline.
 */
#include <stddef.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "ctl_http.h"

ssize_t recv(int fd, void *buf, size_t len, int flags);

static _Thread_local int ctl_http_recv_fd = -1;

ssize_t
recv(int fd, void *buf, size_t len, int flags)
{
    /* (recv is recvfrom without an address, as the C library does it) */
    ssize_t r = (ssize_t)syscall(SYS_recvfrom, fd, buf, len, flags, NULL, NULL);
    if (r >= 0)
        ctl_http_recv_fd = fd;
    return r;
}

int
ctl_http_recv_last_fd(void)
{
    return ctl_http_recv_fd;
}
