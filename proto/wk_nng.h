/*
 * wk_nng: closing an NNG socket without risking a hang. libnng before 1.8
 * (Debian 12 ships 1.5.2) can block forever in nng_close() when a message
 * from the peer arrives while the socket closes: a pipe's receive is left
 * prepared but never finished, and the reaper waits on it (nanomsg/nng#1543,
 * fixed upstream by aac4dc36 and 11dbeed1). A worker leaving while the
 * controller's heartbeats still arrive is exactly that race.
 */
#ifndef WK_NNG_H
#define WK_NNG_H

#include <stdbool.h>
#include <stdint.h>

#include <nng/nng.h>

/*
 * Closes s, waiting at most wait_ms for nng_close() to return (it runs on a
 * detached thread). true when the close finished; false when it is still
 * blocked: the socket must not be used again, and the close is left to that
 * thread (it may never end). A socket never opened (id 0) is a no-op: true.
 */
bool wk_nng_close(nng_socket s, uint32_t wait_ms);

#endif /* WK_NNG_H */
