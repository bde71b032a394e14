/*
 * ctl_sseloop over socketpairs: a stream's output arrives whole and in
 * order over several wake-ups; a reader that stops reading stops the pump
 * (nothing is pumped while output waits) and gets everything once it reads
 * again; a peer that closes ends the stream with WK_EIO without any write;
 * a deadline ends it with WK_ETIMEDOUT, closing the loops with WK_EIO; a
 * reader that takes nothing for the stall limit ends it with WK_EIO. The
 * first two again with coalescing (a 3 ms delay), and the delay itself
 * (test_flush_timer).
 * (cmocka needs its four headers first.)
 */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctl_sseloop.h"
#include "wk_time.h"

/* A producer: rounds of chunks "<round>:<i>\n", woken by a thread. */
typedef struct prod {
    ctl_ssestream *st;        /* its stream */
    atomic_int avail;         /* rounds published */
    int taken;                /* rounds written (pump thread) */
    int rounds;               /* rounds in all */
    int per_round;            /* chunks per round */
    size_t chunk;             /* bytes per chunk (padded) */
    atomic_int pumps;         /* pump calls */
    atomic_int pumps_pending; /* pump calls made while output waited (must stay 0) */
    atomic_bool waiting;      /* the pump found nothing: wake it on the next round */
} prod;

static void
prod_line(const prod *p, int r, int i, char *buf)
{
    int n = snprintf(buf, p->chunk, "%d:%d", r, i);
    memset(buf + n, '.', p->chunk - 1 - (size_t)n);
    buf[p->chunk - 1] = '\n';
}

static wk_err
prod_pump(void *arg, ctl_ssestream *st, bool *done)
{
    prod *p = arg;
    atomic_fetch_add(&p->pumps, 1);
    char buf[4096];
    int avail = atomic_load(&p->avail);
    while (p->taken < avail) {
        for (int i = 0; i < p->per_round; i++) {
            prod_line(p, p->taken, i, buf);
            wk_err err = ctl_ssestream_write(st, buf, p->chunk);
            if (err != WK_OK)
                return err;
        }
        p->taken++;
    }
    *done = p->taken == p->rounds;
    if (!*done) {
        atomic_store(&p->waiting, true);
        if (atomic_load(&p->avail) != avail && atomic_exchange(&p->waiting, false))
            ctl_ssestream_wake(st); /* (a round came meanwhile) */
    }
    return WK_OK;
}

/* Publishes the rounds one by one, waking the stream when its pump waits. */
static void *
prod_main(void *arg)
{
    prod *p = arg;
    for (int r = 0; r < p->rounds; r++) {
        usleep(2000);
        atomic_fetch_add(&p->avail, 1);
        if (atomic_exchange(&p->waiting, false))
            ctl_ssestream_wake(p->st);
    }
    return NULL;
}

typedef struct run_arg {
    ctl_ssestream *st; /* stream */
    uint64_t deadline; /* its deadline */
    uint32_t stall;    /* its stall limit */
    wk_err err;        /* what run returned */
    atomic_bool over;  /* run returned */
} run_arg;

static void *
run_main(void *arg)
{
    run_arg *a = arg;
    a->err = ctl_ssestream_run(a->st, a->deadline, a->stall);
    atomic_store(&a->over, true);
    return NULL;
}

/* Reads fd until EOF-free total bytes arrived or timeout; returns bytes read. */
static size_t
read_n(int fd, char *buf, size_t want)
{
    size_t got = 0;
    uint64_t until = wk_mono_ms() + 20000;
    while (got < want && wk_mono_ms() < until) {
        ssize_t r = read(fd, buf + got, want - got);
        if (r > 0)
            got += (size_t)r;
        else if (r == 0)
            break;
    }
    return got;
}

static void
check_stream(const prod *p, const char *buf, size_t n)
{
    assert_int_equal(n, (size_t)p->rounds * (size_t)p->per_round * p->chunk);
    char want[4096];
    for (int r = 0; r < p->rounds; r++)
        for (int i = 0; i < p->per_round; i++) {
            prod_line(p, r, i, want);
            size_t at = ((size_t)r * (size_t)p->per_round + (size_t)i) * p->chunk;
            assert_memory_equal(buf + at, want, p->chunk);
        }
}

static void
run_stream(ctl_sseloop *l, prod *p, int sv[2], bool stall)
{
    assert_int_equal(ctl_ssestream_new(l, sv[0], prod_pump, p, &p->st), WK_OK);
    run_arg a = {.st = p->st};
    pthread_t rt, pt;
    assert_int_equal(pthread_create(&rt, NULL, run_main, &a), 0);
    assert_int_equal(pthread_create(&pt, NULL, prod_main, p), 0);
    size_t total = (size_t)p->rounds * (size_t)p->per_round * p->chunk;
    char *buf = malloc(total);
    assert_non_null(buf);
    if (stall) {
        /* not reading: the socket fills, the pump stops while output waits */
        usleep(300000);
        assert_false(atomic_load(&a.over));
        int pumps = atomic_load(&p->pumps);
        usleep(100000);
        assert_int_equal(atomic_load(&p->pumps), pumps);
    }
    assert_int_equal(read_n(sv[1], buf, total), total);
    pthread_join(pt, NULL);
    pthread_join(rt, NULL);
    assert_int_equal(a.err, WK_OK);
    check_stream(p, buf, total);
    free(buf);
    ctl_ssestream_free(p->st);
}

static void
test_order(void **state)
{
    uint32_t flush_ms = (uint32_t)(uintptr_t)*state;
    ctl_sseloop *l = NULL;
    wk_diag d = {{0}};
    assert_int_equal(ctl_sseloop_new(2, flush_ms, &l, &d), WK_OK);
    for (int k = 0; k < 3; k++) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        prod p = {.rounds = 40, .per_round = 3, .chunk = 100};
        run_stream(l, &p, sv, false);
        assert_true(atomic_load(&p.pumps) >= 2);
        close(sv[0]);
        close(sv[1]);
    }
    ctl_sseloop_free(l);
}

static void
test_backpressure(void **state)
{
    uint32_t flush_ms = (uint32_t)(uintptr_t)*state;
    ctl_sseloop *l = NULL;
    wk_diag d = {{0}};
    assert_int_equal(ctl_sseloop_new(1, flush_ms, &l, &d), WK_OK);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    int small = 4096;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    /* 2 MB in all: far more than the socket holds */
    prod p = {.rounds = 20, .per_round = 26, .chunk = 4000};
    run_stream(l, &p, sv, true);
    close(sv[0]);
    close(sv[1]);
    ctl_sseloop_free(l);
}

/* A pump with nothing to write, ever. */
static wk_err
idle_pump(void *arg, ctl_ssestream *st, bool *done)
{
    (void)arg;
    (void)st;
    *done = false;
    return WK_OK;
}

static void
test_peer_gone_and_deadline(void **state)
{
    (void)state;
    ctl_sseloop *l = NULL;
    wk_diag d = {{0}};
    assert_int_equal(ctl_sseloop_new(1, 0, &l, &d), WK_OK);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    run_arg a = {0};
    assert_int_equal(ctl_ssestream_new(l, sv[0], idle_pump, NULL, &a.st), WK_OK);
    pthread_t rt;
    uint64_t t0 = wk_mono_ms();
    assert_int_equal(pthread_create(&rt, NULL, run_main, &a), 0);
    usleep(50000);
    assert_false(atomic_load(&a.over));
    close(sv[1]); /* the client goes away */
    pthread_join(rt, NULL);
    assert_int_equal(a.err, WK_EIO);
    assert_true(wk_mono_ms() - t0 < 5000);
    ctl_ssestream_free(a.st);
    close(sv[0]);

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    run_arg b = {.deadline = wk_mono_ms() + 200};
    assert_int_equal(ctl_ssestream_new(l, sv[0], idle_pump, NULL, &b.st), WK_OK);
    assert_int_equal(pthread_create(&rt, NULL, run_main, &b), 0);
    pthread_join(rt, NULL);
    assert_int_equal(b.err, WK_ETIMEDOUT);
    assert_true(wk_mono_ms() >= b.deadline);
    ctl_ssestream_wake(b.st); /* (after the end: ignored) */
    ctl_ssestream_free(b.st);
    close(sv[0]);
    close(sv[1]);

    /* the server stops: a running stream ends, and one started afterwards */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    run_arg c = {0};
    assert_int_equal(ctl_ssestream_new(l, sv[0], idle_pump, NULL, &c.st), WK_OK);
    assert_int_equal(pthread_create(&rt, NULL, run_main, &c), 0);
    usleep(50000);
    assert_false(atomic_load(&c.over));
    ctl_sseloop_close(l);
    pthread_join(rt, NULL);
    assert_int_equal(c.err, WK_EIO);
    ctl_ssestream_free(c.st);
    run_arg e = {0};
    assert_int_equal(ctl_ssestream_new(l, sv[0], idle_pump, NULL, &e.st), WK_OK);
    run_main(&e);
    assert_int_equal(e.err, WK_EIO);
    ctl_ssestream_free(e.st);
    close(sv[0]);
    close(sv[1]);
    ctl_sseloop_free(l);
}

/* Writes 1 MB once and is done. */
static wk_err
big_pump(void *arg, ctl_ssestream *st, bool *done)
{
    (void)arg;
    static char mb[1 << 20];
    *done = true;
    return ctl_ssestream_write(st, mb, sizeof(mb));
}

static void
test_stalled_reader(void **state)
{
    (void)state;
    ctl_sseloop *l = NULL;
    wk_diag d = {{0}};
    assert_int_equal(ctl_sseloop_new(1, 0, &l, &d), WK_OK);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    run_arg a = {.stall = 300};
    assert_int_equal(ctl_ssestream_new(l, sv[0], big_pump, NULL, &a.st), WK_OK);
    uint64_t t0 = wk_mono_ms();
    run_main(&a); /* the peer never reads: the stream ends after its stall limit */
    assert_int_equal(a.err, WK_EIO);
    assert_true(wk_mono_ms() - t0 >= 300);
    assert_true(wk_mono_ms() - t0 < 5000);
    ctl_ssestream_free(a.st);
    close(sv[0]);
    close(sv[1]);
    ctl_sseloop_free(l);
}

/* A pump that does what the test asks, one step per phase: see test_flush_timer. */
typedef struct stepper {
    atomic_int phase; /* steps asked for */
    int done_phase;   /* steps done (pump thread) */
    int last;         /* the phase that ends the stream */
} stepper;

static wk_err
stepper_pump(void *arg, ctl_ssestream *st, bool *done)
{
    stepper *s = arg;
    static char big[9000];
    int want = atomic_load(&s->phase);
    wk_err err = WK_OK;
    for (; s->done_phase < want && err == WK_OK; s->done_phase++) {
        int ph = s->done_phase + 1;
        if (ph == 3) { /* more than a held buffer's limit: sent at once */
            memset(big, 'x', sizeof(big));
            err = ctl_ssestream_write(st, big, sizeof(big));
        } else {
            char c = (char)('A' + ph - 1);
            err = ctl_ssestream_write(st, &c, 1);
        }
    }
    *done = s->done_phase == s->last;
    return err;
}

/* Reads until want bytes came (or 20 s); returns when the last one came (monotonic ms). */
static uint64_t
read_all(int fd, char *buf, size_t want)
{
    assert_int_equal(read_n(fd, buf, want), want);
    return wk_mono_ms();
}

/* Asks the stepper for its next phase; returns when (monotonic ms). */
static uint64_t
step(stepper *s, ctl_ssestream *st)
{
    uint64_t t = wk_mono_ms();
    atomic_fetch_add(&s->phase, 1);
    ctl_ssestream_wake(st);
    return t;
}

/*
 * Coalescing with a 1 s delay: the first write goes out at once, the next
 * is held at least the delay, one that passes the size limit goes out at
 * once with what was held before it, the last one (the pump is done) at
 * once. A deadline sends what is held before the stream ends.
 */
static void
test_flush_timer(void **state)
{
    (void)state;
    ctl_sseloop *l = NULL;
    wk_diag d = {{0}};
    assert_int_equal(ctl_sseloop_new(1, 1000, &l, &d), WK_OK);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    stepper s = {.last = 5};
    run_arg a = {0};
    assert_int_equal(ctl_ssestream_new(l, sv[0], stepper_pump, &s, &a.st), WK_OK);
    pthread_t rt;
    assert_int_equal(pthread_create(&rt, NULL, run_main, &a), 0);
    char buf[9100];
    uint64_t t = step(&s, a.st); /* "A": the first write, at once */
    assert_true(read_all(sv[1], buf, 1) - t < 700);
    assert_int_equal(buf[0], 'A');
    t = step(&s, a.st); /* "B": held for the delay */
    assert_true(read_all(sv[1], buf, 1) - t >= 990);
    assert_int_equal(buf[0], 'B');
    t = step(&s, a.st); /* 9,000 bytes: at once */
    assert_true(read_all(sv[1], buf, 9000) - t < 700);
    assert_int_equal(buf[0], 'x');
    assert_int_equal(buf[8999], 'x');
    step(&s, a.st); /* "D": held, then "E" and done: both at once */
    t = step(&s, a.st);
    assert_true(read_all(sv[1], buf, 2) - t < 700);
    assert_memory_equal(buf, "DE", 2);
    pthread_join(rt, NULL);
    assert_int_equal(a.err, WK_OK);
    ctl_ssestream_free(a.st);
    close(sv[0]);
    close(sv[1]);

    /* a deadline while output is held: it goes out, then the stream ends */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    stepper s2 = {.last = 99};
    run_arg b = {.deadline = wk_mono_ms() + 300};
    assert_int_equal(ctl_ssestream_new(l, sv[0], stepper_pump, &s2, &b.st), WK_OK);
    assert_int_equal(pthread_create(&rt, NULL, run_main, &b), 0);
    step(&s2, b.st);
    step(&s2, b.st);
    pthread_join(rt, NULL);
    assert_int_equal(b.err, WK_ETIMEDOUT);
    assert_true(wk_mono_ms() - (b.deadline - 300) < 900);
    assert_int_equal(read_n(sv[1], buf, 2), 2);
    assert_memory_equal(buf, "AB", 2);
    ctl_ssestream_free(b.st);
    close(sv[0]);
    close(sv[1]);
    ctl_sseloop_free(l);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order),
        cmocka_unit_test_prestate(test_order, (void *)(uintptr_t)3),
        cmocka_unit_test(test_backpressure),
        cmocka_unit_test_prestate(test_backpressure, (void *)(uintptr_t)3),
        cmocka_unit_test(test_flush_timer),
        cmocka_unit_test(test_peer_gone_and_deadline),
        cmocka_unit_test(test_stalled_reader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
