/*
 * ctl_sseloop: one epoll loop per thread. A loop sleeps in epoll_wait() on
 * its streams' sockets (EPOLLRDHUP always, EPOLLOUT only while output waits)
 * and an eventfd that wakers write when the loop sleeps and a stream became
 * ready; woken streams wait on the loop's ready list. A stream that ends is
 * taken off epoll and the ready list before its owner is told (at the end
 * of the loop's iteration), so that the owner may free it as soon as no
 * waker can reach it anymore.
 *
 * Coalescing (flush_ms > 0): what a pump writes into an empty buffer after
 * the stream's first write is held instead of sent, and the stream goes on
 * the loop's hold list (in the order it started holding, so in deadline
 * order: the delay is the same for all). The loop sends a held buffer when
 * its flush_ms ran out (epoll_wait sleeps until the first one), when it
 * reaches CTL_SSELOOP_FLUSH_BYTES, when the pump is done or fails, and when
 * a deadline ends the stream. A held stream is pumped as before: holding is
 * not waiting for the socket (that is still EPOLLOUT, and no pump meanwhile).
 */
#define WK_LOG_MODULE "sseloop"
#include "ctl_sseloop.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wk_log.h"
#include "wk_time.h"

#define CTL_SSELOOP_EVENTS 128       /* epoll events taken per wait */
#define CTL_SSELOOP_FLUSH_BYTES 8192 /* a held buffer this large is sent at once */

typedef struct ctl_sseloop_thr {
    pthread_t thr;       /* the loop */
    int ep;              /* epoll instance */
    int efd;             /* eventfd: wakes a sleeping loop */
    bool started;        /* thr runs */
    pthread_mutex_t mu;  /* guards the fields below and each stream's (mu) fields */
    ctl_ssestream *head; /* ready list: woken streams, in wake order */
    ctl_ssestream *tail; /* its last entry */
    bool sleeping;       /* the loop waits with an empty ready list */
    bool stop;           /* the loop exits */
    /* loop thread only: */
    ctl_ssestream *hold_head; /* streams whose output is held (coalescing), oldest first */
    ctl_ssestream *hold_tail; /* its last entry */
} ctl_sseloop_thr;

struct ctl_sseloop {
    unsigned n;              /* threads */
    uint32_t flush_ms;       /* coalescing delay, 0 = every write is sent at once */
    ctl_sseloop_thr *t;      /* them */
    atomic_uint next;        /* round-robin placement of new streams */
    pthread_mutex_t live_mu; /* guards live and closing; taken before a loop's mu */
    ctl_ssestream *live;     /* running streams (ctl_ssestream_run) */
    bool closing;            /* ctl_sseloop_close(): every stream ends */
};

struct ctl_ssestream {
    ctl_sseloop *l;                  /* its pool */
    ctl_sseloop_thr *t;              /* its loop */
    struct ctl_ssestream *live_prev; /* l->live links (live_mu) */
    struct ctl_ssestream *live_next; /* */
    int fd;                          /* the socket, borrowed */
    ctl_ssestream_pump_fn pump;      /* producer */
    void *arg;                       /* its argument */
    /* loop thread only (and the owner before the start, after the end): */
    char *out;                 /* output the socket did not take yet */
    size_t off;                /* first unwritten byte in out */
    size_t len;                /* bytes in out */
    size_t cap;                /* allocated */
    bool out_armed;            /* EPOLLOUT is registered */
    bool wrote;                /* the stream wrote before (its first write is never held) */
    bool held;                 /* out[off..len) is held (coalescing), not tried yet */
    uint64_t flush_at;         /* when held: monotonic ms at which it is sent */
    struct ctl_ssestream *hold_prev; /* the loop's hold list */
    struct ctl_ssestream *hold_next; /* */
    bool broken;               /* a send failed: the client is gone */
    bool pump_done;            /* the pump said done; ends once out is written */
    wk_err end_err;            /* what it ends with then: WK_OK, the pump's error, WK_ETIMEDOUT */
    bool fin;                  /* ended (the loop's own view of ended) */
    bool cancel_seen;          /* cancel was set when the loop took it from the list */
    wk_err cancel_err_seen;    /* with it: cancel_err */
    _Atomic uint64_t stall_ms; /* monotonic ms since when output waits without progress, 0 */
    wk_err result;             /* why it ended */
    struct ctl_ssestream *fin_next; /* the loop's list of streams to report ended */
    /* (mu): */
    bool queued;                /* on the ready list */
    bool cancel;                /* the owner ends it: a deadline, a stalled client */
    wk_err cancel_err;          /* with what: WK_ETIMEDOUT (output written first), WK_EIO */
    bool ended;                 /* no wake-up queues it anymore */
    struct ctl_ssestream *next; /* ready list link */
    struct ctl_ssestream *rnext; /* the loop's taken list: next is relinked by a wake-up during
                                   the loop's pass, rnext only when the loop takes the list */
    sem_t done;                 /* posted once it ended */
};

/* Queues st on its loop (caller holds t->mu); true when the loop must be signalled. */
static bool
ctl_ssestream_queue_locked(ctl_ssestream *st)
{
    ctl_sseloop_thr *t = st->t;
    if (st->queued || st->ended)
        return false;
    st->queued = true;
    st->next = NULL;
    if (t->tail != NULL)
        t->tail->next = st;
    else
        t->head = st;
    t->tail = st;
    bool sig = t->sleeping;
    t->sleeping = false;
    return sig;
}

static void
ctl_sseloop_signal(ctl_sseloop_thr *t)
{
    uint64_t one = 1;
    ssize_t r;
    do
        r = write(t->efd, &one, sizeof(one));
    while (r < 0 && errno == EINTR);
}

void
ctl_ssestream_wake(void *arg)
{
    ctl_ssestream *st = arg;
    pthread_mutex_lock(&st->t->mu);
    bool sig = ctl_ssestream_queue_locked(st);
    pthread_mutex_unlock(&st->t->mu);
    if (sig)
        ctl_sseloop_signal(st->t);
}

/* Sends out[off..len) without blocking. WK_OK (all or part written), WK_EIO. */
static wk_err
ctl_ssestream_send(ctl_ssestream *st, const char *p, size_t n, size_t *sent)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = send(st->fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r > 0) {
            done += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        st->broken = true;
        return WK_EIO; /* EPIPE, ECONNRESET, ... */
    }
    *sent = done;
    return WK_OK;
}

/* Appends p[0..n) to st's buffer (compacted or grown first). WK_ENOMEM. */
static wk_err
ctl_ssestream_keep(ctl_ssestream *st, const char *p, size_t n)
{
    if (st->len + n > st->cap) {
        if (st->off > 0) { /* (compact first) */
            memmove(st->out, st->out + st->off, st->len - st->off);
            st->len -= st->off;
            st->off = 0;
        }
        size_t cap = st->cap ? st->cap : 4096;
        while (cap < st->len + n)
            cap *= 2;
        if (cap > st->cap) {
            char *np = realloc(st->out, cap);
            if (np == NULL)
                return WK_ENOMEM;
            st->out = np;
            st->cap = cap;
        }
    }
    memcpy(st->out + st->len, p, n);
    st->len += n;
    return WK_OK;
}

/* Puts st (whose buffer holds what it must not send yet) on its loop's hold list. */
static void
ctl_ssestream_hold(ctl_ssestream *st)
{
    ctl_sseloop_thr *t = st->t;
    st->held = true;
    st->flush_at = wk_mono_ms() + st->l->flush_ms;
    st->hold_next = NULL;
    st->hold_prev = t->hold_tail;
    if (t->hold_tail != NULL)
        t->hold_tail->hold_next = st;
    else
        t->hold_head = st;
    t->hold_tail = st;
}

/* Takes st off its loop's hold list, if it is on it. */
static void
ctl_ssestream_unhold(ctl_ssestream *st)
{
    if (!st->held)
        return;
    ctl_sseloop_thr *t = st->t;
    if (st->hold_prev != NULL)
        st->hold_prev->hold_next = st->hold_next;
    else
        t->hold_head = st->hold_next;
    if (st->hold_next != NULL)
        st->hold_next->hold_prev = st->hold_prev;
    else
        t->hold_tail = st->hold_prev;
    st->hold_prev = st->hold_next = NULL;
    st->held = false;
}

/*
 * Sends what st holds now; what the socket does not take waits for EPOLLOUT
 * (which the caller arms). WK_EIO when the client went away.
 */
static wk_err
ctl_ssestream_release(ctl_ssestream *st)
{
    ctl_ssestream_unhold(st);
    size_t sent = 0;
    if (ctl_ssestream_send(st, st->out + st->off, st->len - st->off, &sent) != WK_OK)
        return WK_EIO;
    st->off += sent;
    if (st->off == st->len) {
        st->off = st->len = 0;
        return WK_OK;
    }
    atomic_store(&st->stall_ms, wk_mono_ms()); /* (output waits from now) */
    return WK_OK;
}

wk_err
ctl_ssestream_write(ctl_ssestream *st, const char *p, size_t n)
{
    bool first = !st->wrote;
    st->wrote = true;
    if (st->held || (st->off == st->len && st->l->flush_ms > 0 && !first)) {
        /* coalesced: sent with what follows, at flush_ms or CTL_SSELOOP_FLUSH_BYTES */
        if (!st->held)
            st->off = st->len = 0;
        if (ctl_ssestream_keep(st, p, n) != WK_OK)
            return WK_ENOMEM;
        if (!st->held)
            ctl_ssestream_hold(st);
        if (st->len - st->off >= CTL_SSELOOP_FLUSH_BYTES)
            return ctl_ssestream_release(st);
        return WK_OK;
    }
    size_t sent = 0;
    if (st->off == st->len) {
        st->off = st->len = 0;
        if (ctl_ssestream_send(st, p, n, &sent) != WK_OK)
            return WK_EIO;
        if (sent == n)
            return WK_OK;
    }
    bool was_empty = st->off == st->len;
    if (ctl_ssestream_keep(st, p + sent, n - sent) != WK_OK)
        return WK_ENOMEM;
    if (was_empty || sent > 0)
        atomic_store(&st->stall_ms, wk_mono_ms()); /* (output waits from now) */
    return WK_OK;
}

/* Registers (or drops) EPOLLOUT for st. */
static wk_err
ctl_ssestream_arm(ctl_ssestream *st, bool out)
{
    if (st->out_armed == out)
        return WK_OK;
    struct epoll_event ev = {.events = EPOLLRDHUP | (out ? EPOLLOUT : 0), .data.ptr = st};
    if (epoll_ctl(st->t->ep, EPOLL_CTL_MOD, st->fd, &ev) != 0)
        return WK_EIO;
    st->out_armed = out;
    return WK_OK;
}

/*
 * Ends st with err: off epoll and the ready list now; its owner is told at
 * the end of the iteration (*fin list), after the loop's last look at it.
 */
static void
ctl_ssestream_finish(ctl_ssestream *st, wk_err err, ctl_ssestream **fin)
{
    if (st->fin)
        return;
    st->fin = true;
    st->result = err;
    ctl_ssestream_unhold(st);
    (void)epoll_ctl(st->t->ep, EPOLL_CTL_DEL, st->fd, NULL);
    ctl_sseloop_thr *t = st->t;
    pthread_mutex_lock(&t->mu);
    st->ended = true;
    if (st->queued) { /* (woken and not taken yet: unlink) */
        ctl_ssestream *prev = NULL;
        for (ctl_ssestream *p = t->head; p != NULL; prev = p, p = p->next) {
            if (p != st)
                continue;
            if (prev != NULL)
                prev->next = p->next;
            else
                t->head = p->next;
            if (t->tail == p)
                t->tail = prev;
            break;
        }
        st->queued = false;
    }
    pthread_mutex_unlock(&t->mu);
    st->fin_next = *fin;
    *fin = st;
}

/* Runs st's pump and settles what it left: more output (EPOLLOUT), done, an error. */
static void
ctl_ssestream_pump(ctl_ssestream *st, ctl_ssestream **fin)
{
    bool done = false;
    wk_err err = st->pump(st->arg, st, &done);
    if ((done || err != WK_OK) && st->held && ctl_ssestream_release(st) != WK_OK) {
        ctl_ssestream_finish(st, WK_EIO, fin); /* (the end is never held) */
        return;
    }
    bool pending = st->off < st->len && !st->held;
    if (err != WK_OK && (st->broken || err == WK_ENOMEM || !pending)) {
        ctl_ssestream_finish(st, err, fin);
        return;
    }
    if (err != WK_OK) {
        /* the producer failed (a worker error): what it wrote before goes out first */
        done = true;
        st->end_err = err;
    }
    if (done) {
        st->pump_done = true;
        if (!pending) {
            ctl_ssestream_finish(st, WK_OK, fin);
            return;
        }
    }
    if (ctl_ssestream_arm(st, pending) != WK_OK)
        ctl_ssestream_finish(st, WK_EIO, fin);
}

/* The socket can take more: write what waits, then pump again (or end). */
static void
ctl_ssestream_drain(ctl_ssestream *st, ctl_ssestream **fin)
{
    ctl_ssestream_unhold(st); /* (never both; all of out goes now) */
    size_t sent = 0;
    if (ctl_ssestream_send(st, st->out + st->off, st->len - st->off, &sent) != WK_OK) {
        ctl_ssestream_finish(st, WK_EIO, fin);
        return;
    }
    st->off += sent;
    if (st->off < st->len) {
        if (sent > 0)
            atomic_store(&st->stall_ms, wk_mono_ms()); /* (progress) */
        return;                                        /* (EPOLLOUT stays armed) */
    }
    st->off = st->len = 0;
    atomic_store(&st->stall_ms, 0);
    if (st->pump_done) {
        ctl_ssestream_finish(st, st->end_err, fin);
        return;
    }
    if (ctl_ssestream_arm(st, false) != WK_OK) {
        ctl_ssestream_finish(st, WK_EIO, fin);
        return;
    }
    ctl_ssestream_pump(st, fin); /* (what came while it waited) */
}

/* Takes the ready list (caller holds t->mu). */
static ctl_ssestream *
ctl_sseloop_take_locked(ctl_sseloop_thr *t)
{
    ctl_ssestream *list = t->head;
    for (ctl_ssestream *p = list; p != NULL; p = p->next) {
        p->rnext = p->next;
        p->queued = false;
        p->cancel_seen = p->cancel;
        p->cancel_err_seen = p->cancel_err;
    }
    t->head = t->tail = NULL;
    return list;
}

static void *
ctl_sseloop_main(void *arg)
{
    ctl_sseloop_thr *t = arg;
    pthread_setname_np(pthread_self(), "wkc-sse"); /* wkvm_controller_cpu_seconds_total */
    struct epoll_event evs[CTL_SSELOOP_EVENTS];
    for (;;) {
        pthread_mutex_lock(&t->mu);
        ctl_ssestream *ready = ctl_sseloop_take_locked(t);
        bool stop = t->stop;
        if (ready == NULL && !stop)
            t->sleeping = true;
        pthread_mutex_unlock(&t->mu);
        if (stop && ready == NULL)
            break;
        int timeout = -1; /* (until a wake-up, or the first held buffer's flush) */
        if (ready != NULL) {
            timeout = 0;
        } else if (t->hold_head != NULL) {
            uint64_t now = wk_mono_ms(), at = t->hold_head->flush_at;
            timeout = at > now ? (int)(at - now) : 0;
        }
        int n = epoll_wait(t->ep, evs, CTL_SSELOOP_EVENTS, timeout);
        if (ready == NULL) {
            pthread_mutex_lock(&t->mu);
            t->sleeping = false;
            ready = ctl_sseloop_take_locked(t);
            pthread_mutex_unlock(&t->mu);
        }
        ctl_ssestream *fin = NULL;
        for (int i = 0; i < n; i++) {
            ctl_ssestream *st = evs[i].data.ptr;
            if (st == NULL) { /* the eventfd */
                uint64_t cnt;
                ssize_t r = read(t->efd, &cnt, sizeof(cnt));
                (void)r;
                continue;
            }
            if (st->fin)
                continue;
            if (evs[i].events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP))
                ctl_ssestream_finish(st, WK_EIO, &fin); /* the client went away */
            else if (evs[i].events & EPOLLOUT)
                ctl_ssestream_drain(st, &fin);
        }
        for (ctl_ssestream *st = ready, *nx; st != NULL; st = nx) {
            nx = st->rnext;
            if (st->fin)
                continue;
            if (st->cancel_seen && st->held && st->cancel_err_seen == WK_ETIMEDOUT &&
                ctl_ssestream_release(st) != WK_OK) { /* (held output goes out first) */
                ctl_ssestream_finish(st, WK_EIO, &fin);
                continue;
            }
            if (st->cancel_seen && (st->off == st->len || st->cancel_err_seen != WK_ETIMEDOUT)) {
                ctl_ssestream_finish(st, st->cancel_err_seen, &fin);
            } else if (st->cancel_seen) {
                /* what was written before the deadline still goes out, as on a thread */
                st->pump_done = true;
                st->end_err = WK_ETIMEDOUT;
                if (ctl_ssestream_arm(st, true) != WK_OK)
                    ctl_ssestream_finish(st, WK_EIO, &fin);
            } else if (st->off == st->len || st->held)
                ctl_ssestream_pump(st, &fin);
            /* else: output waits for EPOLLOUT, which pumps after it */
        }
        if (t->hold_head != NULL) { /* held buffers whose time came */
            uint64_t now = wk_mono_ms();
            while (t->hold_head != NULL && t->hold_head->flush_at <= now) {
                ctl_ssestream *st = t->hold_head;
                if (ctl_ssestream_release(st) != WK_OK ||
                    (st->off < st->len && ctl_ssestream_arm(st, true) != WK_OK))
                    ctl_ssestream_finish(st, WK_EIO, &fin);
            }
        }
        while (fin != NULL) {
            ctl_ssestream *st = fin;
            fin = st->fin_next;
            sem_post(&st->done); /* (the owner may free st from here on) */
        }
    }
    return NULL;
}

wk_err
ctl_ssestream_new(ctl_sseloop *l, int fd, ctl_ssestream_pump_fn pump, void *arg,
                  ctl_ssestream **out)
{
    ctl_ssestream *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return WK_ENOMEM;
    st->l = l;
    st->t = &l->t[atomic_fetch_add(&l->next, 1) % l->n];
    st->fd = fd;
    st->pump = pump;
    st->arg = arg;
    sem_init(&st->done, 0, 0);
    *out = st;
    return WK_OK;
}

/* Asks st's loop to end it with err (once). */
static void
ctl_ssestream_cancel(ctl_ssestream *st, wk_err err)
{
    pthread_mutex_lock(&st->t->mu);
    if (!st->cancel) {
        st->cancel = true;
        st->cancel_err = err;
    } else if (err == WK_EIO) {
        st->cancel_err = WK_EIO; /* (a stalled client ends even a stream that drains) */
    }
    /* (queued again: a stream that was taken with the old cancel is looked at again) */
    bool sig = ctl_ssestream_queue_locked(st);
    pthread_mutex_unlock(&st->t->mu);
    if (sig)
        ctl_sseloop_signal(st->t);
}

wk_err
ctl_ssestream_run(ctl_ssestream *st, uint64_t deadline_ms, uint32_t stall_ms)
{
    struct epoll_event ev = {.events = EPOLLRDHUP, .data.ptr = st};
    if (epoll_ctl(st->t->ep, EPOLL_CTL_ADD, st->fd, &ev) != 0) {
        wk_log_warn("epoll_ctl add fd=%d: %s", st->fd, strerror(errno));
        pthread_mutex_lock(&st->t->mu);
        st->ended = true;
        pthread_mutex_unlock(&st->t->mu);
        st->fin = true;
        st->result = WK_EIO;
        return WK_EIO;
    }
    ctl_sseloop *l = st->l;
    pthread_mutex_lock(&l->live_mu);
    st->live_next = l->live;
    if (l->live != NULL)
        l->live->live_prev = st;
    l->live = st;
    bool closing = l->closing;
    pthread_mutex_unlock(&l->live_mu);
    ctl_ssestream_wake(st); /* the first pump */
    if (closing)
        ctl_ssestream_cancel(st, WK_EIO);
    bool timed_out = false, stalled = false;
    for (;;) {
        /* (a parked thread wakes rarely: a stall is seen within an eighth of its limit) */
        uint64_t wait_ms = stall_ms > 0 ? stall_ms / 8 : 60000;
        if (wait_ms < 100)
            wait_ms = 100;
        uint64_t now = wk_mono_ms();
        if (deadline_ms != 0 && !timed_out) {
            if (now >= deadline_ms) {
                ctl_ssestream_cancel(st, WK_ETIMEDOUT);
                timed_out = true;
            } else if (deadline_ms - now < wait_ms) {
                wait_ms = deadline_ms - now;
            }
        }
        uint64_t since = atomic_load(&st->stall_ms);
        if (stall_ms > 0 && !stalled && since != 0 && now >= since + stall_ms) {
            wk_log_info("client stopped reading for %u ms: stream ended", stall_ms);
            ctl_ssestream_cancel(st, WK_EIO);
            stalled = true;
        }
        struct timespec until;
        wk_deadline_after_ms(&until, wait_ms);
        int rc;
        do
            rc = sem_timedwait(&st->done, &until);
        while (rc != 0 && errno == EINTR);
        if (rc == 0)
            break;
    }
    pthread_mutex_lock(&l->live_mu);
    if (st->live_prev != NULL)
        st->live_prev->live_next = st->live_next;
    else
        l->live = st->live_next;
    if (st->live_next != NULL)
        st->live_next->live_prev = st->live_prev;
    pthread_mutex_unlock(&l->live_mu);
    return st->result;
}

void
ctl_sseloop_close(ctl_sseloop *l)
{
    if (l == NULL)
        return;
    pthread_mutex_lock(&l->live_mu);
    l->closing = true;
    for (ctl_ssestream *st = l->live; st != NULL; st = st->live_next)
        ctl_ssestream_cancel(st, WK_EIO); /* (st stays alive: its owner unlinks it first) */
    pthread_mutex_unlock(&l->live_mu);
}

void
ctl_ssestream_free(ctl_ssestream *st)
{
    if (st == NULL)
        return;
    sem_destroy(&st->done);
    free(st->out);
    free(st);
}

wk_err
ctl_sseloop_new(unsigned n, uint32_t flush_ms, ctl_sseloop **out, wk_diag *d)
{
    if (n == 0)
        n = 1;
    ctl_sseloop *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return WK_ENOMEM;
    l->t = calloc(n, sizeof(*l->t));
    if (l->t == NULL) {
        free(l);
        return WK_ENOMEM;
    }
    atomic_init(&l->next, 0);
    l->flush_ms = flush_ms;
    pthread_mutex_init(&l->live_mu, NULL);
    wk_err err = WK_OK;
    for (unsigned i = 0; i < n && err == WK_OK; i++) {
        ctl_sseloop_thr *t = &l->t[i];
        t->ep = epoll_create1(EPOLL_CLOEXEC);
        t->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        pthread_mutex_init(&t->mu, NULL);
        l->n = i + 1;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
        if (t->ep < 0 || t->efd < 0 || epoll_ctl(t->ep, EPOLL_CTL_ADD, t->efd, &ev) != 0) {
            err = wk_diag_set(d, WK_EIO, "event loop: %s", strerror(errno));
            break;
        }
        if (pthread_create(&t->thr, NULL, ctl_sseloop_main, t) != 0) {
            err = wk_diag_set(d, WK_EIO, "event loop: cannot start a thread");
            break;
        }
        t->started = true;
    }
    if (err != WK_OK) {
        ctl_sseloop_free(l);
        return err;
    }
    *out = l;
    return WK_OK;
}

void
ctl_sseloop_free(ctl_sseloop *l)
{
    if (l == NULL)
        return;
    for (unsigned i = 0; i < l->n; i++) {
        ctl_sseloop_thr *t = &l->t[i];
        if (t->started) {
            pthread_mutex_lock(&t->mu);
            t->stop = true;
            pthread_mutex_unlock(&t->mu);
            ctl_sseloop_signal(t);
            pthread_join(t->thr, NULL);
        }
        if (t->ep >= 0)
            close(t->ep);
        if (t->efd >= 0)
            close(t->efd);
        pthread_mutex_destroy(&t->mu);
    }
    pthread_mutex_destroy(&l->live_mu);
    free(l->t);
    free(l);
}
