/*
 * wk_nng: nng_close() on a detached thread with a bounded wait (see wk_nng.h).
 * The caller and the thread share one reference-counted record; whoever
 * drops the last reference frees it, so a close that never ends leaks only
 * that record.
 */
#include "wk_nng.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include <time.h>

#include "wk_time.h"

typedef struct wk_nng_closer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    nng_socket sock;
    bool done;
    int refs; /* the caller's and the thread's */
} wk_nng_closer;

/* Drops one reference; called with c->mu held, returns with it released. */
static void
wk_nng_closer_put(wk_nng_closer *c)
{
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (last) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        free(c);
    }
}

static void *
wk_nng_closer_main(void *arg)
{
    wk_nng_closer *c = arg;
    nng_close(c->sock);
    pthread_mutex_lock(&c->mu);
    c->done = true;
    pthread_cond_broadcast(&c->cv);
    wk_nng_closer_put(c);
    return NULL;
}

bool
wk_nng_close(nng_socket s, uint32_t wait_ms)
{
    if (nng_socket_id(s) <= 0)
        return true;
    wk_nng_closer *c = calloc(1, sizeof(*c));
    if (c == NULL) { /* no memory for the thread's record: close here, unbounded */
        nng_close(s);
        return true;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca; /* the bound on the monotonic clock: a clock step cannot stretch it */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    c->sock = s;
    c->refs = 2;
    pthread_attr_t attr;
    pthread_t th;
    bool started = pthread_attr_init(&attr) == 0;
    if (started) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        started = pthread_create(&th, &attr, wk_nng_closer_main, c) == 0;
        pthread_attr_destroy(&attr);
    }
    if (!started) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        free(c);
        nng_close(s);
        return true;
    }
    struct timespec until;
    wk_mono_deadline_after_ms(&until, wait_ms);
    pthread_mutex_lock(&c->mu);
    while (!c->done) {
        if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT)
            break;
    }
    bool done = c->done;
    wk_nng_closer_put(c);
    return done;
}
