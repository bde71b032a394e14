/*
 * ctl_sseloop: event loops that write server-sent event streams. A small
 * pool of threads (one per core) each own the sockets of the streams handed
 * to them: a stream is woken from any thread (ctl_ssestream_wake: the step
 * loop, once per step for all the tokens it published), its pump runs on the
 * loop's thread and writes what it formats with ctl_ssestream_write(), which
 * sends at once without blocking (or, coalescing, holds it up to a few ms
 * to send several events in one write) and keeps what the socket did not
 * take (EPOLLOUT only then). A stream whose output is not written out is not
 * pumped: its producer is throttled by what it did not hand over. A client
 * that goes away (EPOLLRDHUP, EPOLLERR, EPOLLHUP) ends its stream at once.
 *
 * It never reads from a socket, never closes one and never touches one
 * after its stream ended: the socket belongs to the thread that handed it
 * over (ctl_http), which waits in ctl_ssestream_run() meanwhile.
 */
#ifndef CTL_SSELOOP_H
#define CTL_SSELOOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"

typedef struct ctl_sseloop ctl_sseloop;
typedef struct ctl_ssestream ctl_ssestream;

/*
 * A stream's pump: called on its loop's thread, one call at a time, after a
 * wake-up and once its earlier output is written out. It hands what it has
 * to ctl_ssestream_write(). *done = false: more will come and someone calls
 * ctl_ssestream_wake() then; *done = true: the stream ends once its output
 * is written. An error ends it with that error once the output written
 * before it is out (at once when the client is gone or memory ran out).
 */
typedef wk_err (*ctl_ssestream_pump_fn)(void *arg, ctl_ssestream *st, bool *done);

/*
 * Starts n loop threads (n >= 1). flush_ms > 0 coalesces: a stream's
 * output after its first write is held up to flush_ms (or until 8 KiB
 * wait, or the pump is done or failed, or a deadline ends it) and then sent
 * in one write, so a token may reach its client up to flush_ms later; 0
 * sends every write at once. WK_EIO when epoll or a thread fails (diag says
 * why).
 */
WK_MUST_CHECK wk_err ctl_sseloop_new(unsigned n, uint32_t flush_ms, ctl_sseloop **out,
                                     wk_diag *d);

/*
 * Ends every running stream, and every one started from now on, with
 * WK_EIO (the server stops: as civetweb's writes fail once it stops).
 * NULL-safe.
 */
void ctl_sseloop_close(ctl_sseloop *l);

/* Stops the threads and frees. No stream may be running. NULL-safe. */
void ctl_sseloop_free(ctl_sseloop *l);

/*
 * A stream through fd (a connected TCP socket, borrowed; its O_NONBLOCK is
 * not needed: every send is MSG_DONTWAIT) on one of l's loops; nothing runs
 * until ctl_ssestream_run(). Its pump is called once at the start and then
 * after each wake-up. Freed with ctl_ssestream_free(). WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_ssestream_new(ctl_sseloop *l, int fd, ctl_ssestream_pump_fn pump,
                                       void *arg, ctl_ssestream **out);

/*
 * Runs st and blocks the calling thread until it ends; at deadline_ms
 * (monotonic ms, 0 = none) it is ended with WK_ETIMEDOUT once the output
 * before it is written; a client that takes none of the waiting output for
 * stall_ms (0 = no limit) ends it with WK_EIO. Returns WK_OK
 * (the pump was done and everything was written), WK_EIO (the client went
 * away or a write failed), WK_ETIMEDOUT, or the pump's error. Once it
 * returned the loop no longer touches st or fd; free st with
 * ctl_ssestream_free() once nothing can call ctl_ssestream_wake() on it.
 * One run per stream.
 */
WK_MUST_CHECK wk_err ctl_ssestream_run(ctl_ssestream *st, uint64_t deadline_ms, uint32_t stall_ms);

/* Wakes st (a ctl_job_waker_fn): any thread, never blocks but on the loop's mutex. */
void ctl_ssestream_wake(void *st);

/*
 * From the pump: writes n bytes, or keeps what the socket does not take now
 * (it is written when it can, and the pump waits until then); coalescing,
 * holds them (the pump does not wait for held output). WK_EIO when
 * the client went away, WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_ssestream_write(ctl_ssestream *st, const char *p, size_t n);

/* Frees a stream that ended (ctl_ssestream_run returned) or never ran. NULL-safe. */
void ctl_ssestream_free(ctl_ssestream *st);

#endif /* CTL_SSELOOP_H */
