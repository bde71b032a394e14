/*
 * Unit tests for wk_nng: a quiet nlink closes and reports so; a socket never
 * opened is a no-op; and a nlink closed while its peer keeps sending (the
 * race that hangs nng_close() in libnng < 1.8) never holds the caller past
 * its bound, whether or not this libnng hangs that time.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "wk_nng.h"
#include <nng/protocol/pair1/pair.h>
#include "wk_time.h"

typedef struct nlink {
    char dir[128];
    char url[200];
    nng_socket lsn; /* the controller's side */
    nng_socket dlr; /* the worker's side */
} nlink;

static void
link_open(nlink *k)
{
    memset(k, 0, sizeof(*k));
    const char *base = getenv("TMPDIR");
    snprintf(k->dir, sizeof(k->dir), "%s/wkvm-nng-XXXXXX", base && base[0] ? base : "/tmp");
    assert_non_null(mkdtemp(k->dir));
    snprintf(k->url, sizeof(k->url), "ipc://%s/l.ipc", k->dir);
    assert_int_equal(nng_pair1_open(&k->lsn), 0);
    assert_int_equal(nng_listen(k->lsn, k->url, NULL, 0), 0);
    assert_int_equal(nng_pair1_open(&k->dlr), 0);
    nng_socket_set_ms(k->dlr, NNG_OPT_RECVTIMEO, 2000);
    nng_socket_set_ms(k->dlr, NNG_OPT_RECONNMINT, 10);
    assert_int_equal(nng_dial(k->dlr, k->url, NULL, NNG_FLAG_NONBLOCK), 0);
}

static void
link_rmdir(nlink *k)
{
    char p[260];
    snprintf(p, sizeof(p), "%s/l.ipc", k->dir);
    unlink(p);
    rmdir(k->dir);
}

/* One message each way, so the pipe is up. */
static void
link_ping(nlink *k)
{
    assert_int_equal(nng_send(k->lsn, "ping", 4, 0), 0);
    void *b = NULL;
    size_t n = 0;
    assert_int_equal(nng_recv(k->dlr, &b, &n, NNG_FLAG_ALLOC), 0);
    assert_int_equal(n, 4);
    nng_free(b, n);
}

static void
test_quiet_and_unopened(void **state)
{
    (void)state;
    nng_socket none = NNG_SOCKET_INITIALIZER;
    assert_true(wk_nng_close(none, 10));
    nlink k;
    link_open(&k);
    link_ping(&k);
    assert_true(wk_nng_close(k.dlr, 5000));
    assert_true(wk_nng_close(k.lsn, 5000));
    /* closed means closed: the ids are no longer sockets */
    assert_int_equal(nng_send(k.lsn, "x", 1, NNG_FLAG_NONBLOCK), NNG_ECLOSED);
    assert_int_equal(nng_send(k.dlr, "x", 1, NNG_FLAG_NONBLOCK), NNG_ECLOSED);
    link_rmdir(&k);
}

typedef struct flood {
    nng_socket s;
    atomic_bool stop;
} flood;

/*
 * LeakSanitizer's hook (read only in the ASan build): libnng 1.5.2 drops the
 * messages still queued in a socket it closes without freeing them (fixed
 * upstream by dcb89245); a flood closed mid-stream always has some: the
 * copies nng_send() made, and (now and then, seen in CI) a message its own
 * receive thread had just allocated for the closing pipe, whose stack holds
 * libnng's frames only (Debian's library has no symbols to name them). So
 * what libnng allocated is excused in this test, whose code owns no
 * message (test_wk_nng only opens, floods and closes links).
 */
const char *__lsan_default_suppressions(void);
const char *
__lsan_default_suppressions(void)
{
    return "leak:nng_send\nleak:libnng.so\n";
}

/* The controller's heartbeats, much faster: a message every 100 us. */
static void *
flood_main(void *arg)
{
    flood *f = arg;
    char m[64] = "stats";
    while (!atomic_load(&f->stop)) {
        (void)nng_send(f->s, m, sizeof(m), NNG_FLAG_NONBLOCK);
        usleep(100);
    }
    return NULL;
}

/* How long a bounded close may hold the caller past its bound (a loaded CI machine). */
#define SLACK_MS 2000u

/* Closes s; the ms it held the caller into *took. Whether the close finished. */
static bool
close_timed(nng_socket s, uint32_t wait_ms, uint64_t *took)
{
    uint64_t t0 = wk_mono_ms();
    bool done = wk_nng_close(s, wait_ms);
    *took = wk_mono_ms() - t0;
    return done;
}

/*
 * The worker's side closes while the controller's side floods it; then the
 * controller's side closes. Either close may hang in libnng < 1.8, and once
 * one has, libnng's reaper is stuck for the process (every later close
 * hangs too): the loop ends at the first, having shown the bound held.
 */
static void
test_close_under_traffic(void **state)
{
    (void)state;
    const uint32_t wait_ms = 300;
    unsigned stuck = 0;
    int i;
    for (i = 0; i < 150 && stuck == 0; i++) {
        nlink k;
        link_open(&k);
        link_ping(&k);
        flood f = {.s = k.lsn};
        atomic_init(&f.stop, false);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, flood_main, &f), 0);
        usleep(500); /* messages are arriving */
        uint64_t took_dlr = 0, took_lsn = 0;
        bool dlr_done = close_timed(k.dlr, wait_ms, &took_dlr);
        atomic_store(&f.stop, true);
        pthread_join(th, NULL); /* (before any assertion: the flood reads f) */
        bool lsn_done = close_timed(k.lsn, wait_ms, &took_lsn);
        stuck += !dlr_done + !lsn_done;
        if (took_dlr > wait_ms + SLACK_MS || took_lsn > wait_ms + SLACK_MS)
            fail_msg("iteration %d: a close held the caller %llu / %llu ms (bound %u)", i,
                     (unsigned long long)took_dlr, (unsigned long long)took_lsn, wait_ms);
        if (dlr_done) /* a finished close is a close */
            assert_int_equal(nng_send(k.dlr, "x", 1, NNG_FLAG_NONBLOCK), NNG_ECLOSED);
        link_rmdir(&k);
    }
    print_message("closes under traffic: %d links, %u left hanging to their thread\n", i, stuck);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quiet_and_unopened),
        cmocka_unit_test(test_close_under_traffic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
