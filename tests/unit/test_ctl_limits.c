/*
 * Unit tests for ctl_limits: per-user units, the limit, unlimited mode,
 * bad names, many users sharing buckets, and a threaded stress that checks
 * no user ever holds more than the limit and every unit comes back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "ctl_limits.h"

static void
test_acquire_release(void **state)
{
    (void)state;
    ctl_limits *l = NULL;
    assert_int_equal(ctl_limits_new(2, &l), WK_OK);
    assert_int_equal(ctl_limits_max(l), 2);
    assert_int_equal(ctl_limits_acquire(l, "alice"), WK_OK);
    assert_int_equal(ctl_limits_acquire(l, "alice"), WK_OK);
    assert_int_equal(ctl_limits_acquire(l, "alice"), WK_EQUOTA);
    assert_int_equal(ctl_limits_held(l, "alice"), 2);
    /* Another user has a budget of their own. */
    assert_int_equal(ctl_limits_acquire(l, "bob"), WK_OK);
    assert_int_equal(ctl_limits_active_users(l), 2);
    ctl_limits_release(l, "alice");
    assert_int_equal(ctl_limits_held(l, "alice"), 1);
    assert_int_equal(ctl_limits_acquire(l, "alice"), WK_OK);
    ctl_limits_release(l, "alice");
    ctl_limits_release(l, "alice");
    ctl_limits_release(l, "bob");
    assert_int_equal(ctl_limits_held(l, "alice"), 0);
    assert_int_equal(ctl_limits_active_users(l), 0);
    /* A release without a unit is ignored; it does not create credit. */
    ctl_limits_release(l, "alice");
    ctl_limits_release(l, "carol");
    assert_int_equal(ctl_limits_acquire(l, "alice"), WK_OK);
    assert_int_equal(ctl_limits_acquire(l, "alice"), WK_OK);
    assert_int_equal(ctl_limits_acquire(l, "alice"), WK_EQUOTA);
    ctl_limits_free(l); /* frees what is still held */
}

static void
test_unlimited_and_bad_names(void **state)
{
    (void)state;
    ctl_limits *l = NULL;
    assert_int_equal(ctl_limits_new(0, &l), WK_OK);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(ctl_limits_acquire(l, "alice"), WK_OK);
    assert_int_equal(ctl_limits_held(l, "alice"), 0);
    assert_int_equal(ctl_limits_active_users(l), 0);
    ctl_limits_release(l, "alice");
    ctl_limits_free(l);

    assert_int_equal(ctl_limits_new(1, &l), WK_OK);
    char longname[CTL_LIMITS_USER_MAX + 2];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_int_equal(ctl_limits_acquire(l, NULL), WK_EINVAL);
    assert_int_equal(ctl_limits_acquire(l, ""), WK_EINVAL);
    assert_int_equal(ctl_limits_acquire(l, longname), WK_EINVAL);
    longname[CTL_LIMITS_USER_MAX] = '\0'; /* exactly the maximum: accepted */
    assert_int_equal(ctl_limits_acquire(l, longname), WK_OK);
    assert_int_equal(ctl_limits_acquire(l, longname), WK_EQUOTA);
    ctl_limits_release(l, longname);
    ctl_limits_release(l, NULL);
    ctl_limits_release(NULL, "x");
    assert_int_equal(ctl_limits_active_users(l), 0);
    ctl_limits_free(l);
    ctl_limits_free(NULL);
    assert_int_equal(ctl_limits_acquire(NULL, "x"), WK_EINVAL);
}

static void
test_many_users(void **state)
{
    (void)state;
    ctl_limits *l = NULL;
    assert_int_equal(ctl_limits_new(3, &l), WK_OK);
    char name[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(name, sizeof(name), "user-%d", i);
        assert_int_equal(ctl_limits_acquire(l, name), WK_OK);
    }
    assert_int_equal(ctl_limits_active_users(l), 5000);
    for (int i = 0; i < 5000; i += 2) {
        snprintf(name, sizeof(name), "user-%d", i);
        ctl_limits_release(l, name);
    }
    assert_int_equal(ctl_limits_active_users(l), 2500);
    for (int i = 1; i < 5000; i += 2) {
        snprintf(name, sizeof(name), "user-%d", i);
        assert_int_equal(ctl_limits_held(l, name), 1);
        assert_int_equal(ctl_limits_acquire(l, name), WK_OK);
        assert_int_equal(ctl_limits_acquire(l, name), WK_OK);
        assert_int_equal(ctl_limits_acquire(l, name), WK_EQUOTA);
    }
    ctl_limits_free(l);
}

#define STRESS_THREADS 8
#define STRESS_ITERS 20000
#define STRESS_MAX 3

typedef struct stress_arg {
    ctl_limits *l;             /* shared accounting */
    const char *user;          /* user this thread acts as */
    atomic_int *inside;        /* units of that user held right now (by the test) */
    atomic_int *violations;    /* times more than STRESS_MAX were inside */
    int granted;               /* acquires that succeeded */
} stress_arg;

static void *
stress_main(void *p)
{
    stress_arg *a = p;
    for (int i = 0; i < STRESS_ITERS; i++) {
        if (ctl_limits_acquire(a->l, a->user) != WK_OK)
            continue;
        a->granted++;
        if (atomic_fetch_add(a->inside, 1) + 1 > STRESS_MAX)
            atomic_fetch_add(a->violations, 1);
        atomic_fetch_sub(a->inside, 1);
        ctl_limits_release(a->l, a->user);
    }
    return NULL;
}

static void
test_threaded_stress(void **state)
{
    (void)state;
    ctl_limits *l = NULL;
    assert_int_equal(ctl_limits_new(STRESS_MAX, &l), WK_OK);
    pthread_t t[STRESS_THREADS];
    stress_arg args[STRESS_THREADS];
    atomic_int inside[2] = {0, 0};
    atomic_int violations = 0;
    for (int i = 0; i < STRESS_THREADS; i++) {
        args[i] = (stress_arg){.l = l, .user = i % 2 ? "odd" : "even", .inside = &inside[i % 2],
                               .violations = &violations};
        assert_int_equal(pthread_create(&t[i], NULL, stress_main, &args[i]), 0);
    }
    int granted = 0;
    for (int i = 0; i < STRESS_THREADS; i++) {
        pthread_join(t[i], NULL);
        granted += args[i].granted;
    }
    assert_int_equal(atomic_load(&violations), 0);
    assert_true(granted > 0);
    assert_int_equal(ctl_limits_held(l, "odd"), 0);
    assert_int_equal(ctl_limits_held(l, "even"), 0);
    assert_int_equal(ctl_limits_active_users(l), 0);
    ctl_limits_free(l);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_acquire_release),
        cmocka_unit_test(test_unlimited_and_bad_names),
        cmocka_unit_test(test_many_users),
        cmocka_unit_test(test_threaded_stress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
