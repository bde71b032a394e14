/*
 * ctl_cpustat: thread names map to the documented components, a named
 * thread's time lands in its component, and no component ever goes down,
 * also after that thread exits. (cmocka needs its four headers first.)
 */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "ctl_cpustat.h"

static void
test_component_of(void **state)
{
    (void)state;
    assert_int_equal(ctl_cpu_component_of("civetweb-worker"), CTL_CPU_COMPONENT_HTTP);
    assert_int_equal(ctl_cpu_component_of("civetweb-master"), CTL_CPU_COMPONENT_HTTP);
    assert_int_equal(ctl_cpu_component_of("wkc-sse"), CTL_CPU_COMPONENT_HTTP);
    assert_int_equal(ctl_cpu_component_of("wkc-step"), CTL_CPU_COMPONENT_STEP);
    assert_int_equal(ctl_cpu_component_of("wkc-sched"), CTL_CPU_COMPONENT_SCHED);
    assert_int_equal(ctl_cpu_component_of("wkc-pool-recv"), CTL_CPU_COMPONENT_POOL);
    assert_int_equal(ctl_cpu_component_of("nng:task"), CTL_CPU_COMPONENT_POOL);
    assert_int_equal(ctl_cpu_component_of("wkc-ckpt"), CTL_CPU_COMPONENT_VM);
    assert_int_equal(ctl_cpu_component_of("wkvm-controld"), CTL_CPU_COMPONENT_OTHER);
    assert_int_equal(ctl_cpu_component_of(""), CTL_CPU_COMPONENT_OTHER);
    assert_string_equal(ctl_cpu_component_name(CTL_CPU_COMPONENT_STEP), "step");
    assert_string_equal(ctl_cpu_component_name(CTL_CPU_COMPONENT_COUNT), "other");
}

static void
burn_ms(long ms)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    do {
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
}

/* set once the step thread has burnt 20 ms of its own CPU time */
static atomic_int step_burnt;

static void *
step_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "wkc-step");
    burn_ms(20);
    atomic_store(&step_burnt, 1);
    burn_ms(40);
    return NULL;
}

static void
test_sample(void **state)
{
    (void)state;
    double a[CTL_CPU_COMPONENT_COUNT], b[CTL_CPU_COMPONENT_COUNT];
    assert_int_equal(ctl_cpustat_sample(a), WK_OK);
    pthread_t thr;
    assert_int_equal(pthread_create(&thr, NULL, step_main, NULL), 0);
    /* (waits for the thread's CPU time, not wall time: on a loaded machine it may not run for a while) */
    struct timespec ms = {0, 1000 * 1000};
    while (!atomic_load(&step_burnt))
        nanosleep(&ms, NULL);
    assert_int_equal(ctl_cpustat_sample(b), WK_OK); /* sees the thread alive */
    pthread_join(thr, NULL);
    assert_int_equal(ctl_cpustat_sample(b), WK_OK); /* and after its exit */
    for (int c = 0; c < CTL_CPU_COMPONENT_COUNT; c++)
        assert_true(b[c] >= a[c]);
    /* the step thread burnt 60 ms; at least what it had at the live sample is kept */
    assert_true(b[CTL_CPU_COMPONENT_STEP] - a[CTL_CPU_COMPONENT_STEP] > 0.005);
    burn_ms(30);
    double c2[CTL_CPU_COMPONENT_COUNT];
    assert_int_equal(ctl_cpustat_sample(c2), WK_OK);
    for (int c = 0; c < CTL_CPU_COMPONENT_COUNT; c++)
        assert_true(c2[c] >= b[c]);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_component_of),
        cmocka_unit_test(test_sample),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
