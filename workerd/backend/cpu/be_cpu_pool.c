/*
 * be_cpu_pool: a small fork-join thread pool for the CPU backend.
 *
 * One job at a time. A job is published in one 64-bit atomic word:
 * generation (32 bits) | next task (16) | task count (16). Any thread,
 * the caller included, claims a task with a compare-and-swap on that word,
 * so a claim is only ever made on the current job; the caller returns when
 * every task has completed, not when every worker has checked in. A worker
 * that is descheduled (a busy machine) therefore never stalls a step: the
 * caller and the other workers simply take its share.
 *
 * Idle workers spin briefly (a decode step runs dozens of short jobs back
 * to back), then sleep on a condition variable. Which thread runs a task is
 * not fixed; task bodies must not depend on it (the kernels never do).
 *
 * Never logs, never aborts.
 */
#include "be_cpu_kernels.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BE_CPU_PAUSE() _mm_pause()
#else
#define BE_CPU_PAUSE() ((void)0)
#endif

#define BE_CPU_POOL_SPIN 4000       /* pause iterations before a worker sleeps */
#define BE_CPU_POOL_WAIT_SPIN 2000  /* pause iterations before the caller yields */
#define BE_CPU_POOL_MAX 256         /* most threads */
#define BE_CPU_POOL_JOB_MAX 0xffffu /* tasks per published job (16 bits) */

#define ST_GEN(s) ((uint32_t)((s) >> 32))
#define ST_NEXT(s) ((uint32_t)(((s) >> 16) & 0xffffu))
#define ST_N(s) ((uint32_t)((s)&0xffffu))

struct be_cpu_pool {
    uint32_t n;              /* threads including the caller */
    pthread_t *th;           /* n - 1 workers */
    uint32_t started;        /* workers actually started */
    uint32_t gen;            /* caller's copy of the current generation */
    be_cpu_pool_fn fn;       /* current job body: read only after a successful claim */
    void *arg;               /* current job argument (same rule) */
    uint32_t base;           /* task index offset of the published part of the job */
    _Atomic uint64_t state;  /* gen | next | count, see above */
    atomic_uint completed;   /* tasks of the current job finished */
    atomic_uint sleepers;    /* workers blocked (or about to block) on cv */
    atomic_bool stop;        /* workers exit */
    pthread_mutex_t mu;      /* guards the cv sleep */
    pthread_cond_t cv;       /* wakes sleeping workers */
};

/* Claims and runs tasks of job generation g until none is left. */
static void
be_cpu_pool_work(be_cpu_pool *p, uint32_t g)
{
    uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    for (;;) {
        if (ST_GEN(s) != g || ST_NEXT(s) >= ST_N(s))
            return;
        if (!atomic_compare_exchange_weak_explicit(&p->state, &s, s + (1u << 16),
                                                   memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* s reloaded */
        /* the job cannot finish (nor change) before this task completes */
        p->fn(p->arg, p->base + ST_NEXT(s));
        atomic_fetch_add_explicit(&p->completed, 1, memory_order_release);
        s = atomic_load_explicit(&p->state, memory_order_acquire);
    }
}

static void *
be_cpu_pool_main(void *vp)
{
    be_cpu_pool *p = vp;
    uint32_t seen = 0;

    for (;;) {
        uint64_t s;
        int spins = 0;
        while (ST_GEN(s = atomic_load_explicit(&p->state, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->stop, memory_order_acquire)) {
            if (++spins < BE_CPU_POOL_SPIN) {
                BE_CPU_PAUSE();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (ST_GEN(atomic_load(&p->state)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        seen = ST_GEN(s);
        be_cpu_pool_work(p, seen);
    }
}

static uint32_t
be_cpu_pool_ncpu(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return (uint32_t)n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (uint32_t)n : 1;
}

wk_err
be_cpu_pool_new(uint32_t n_threads, be_cpu_pool **out)
{
    be_cpu_pool *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return WK_ENOMEM;
    if (n_threads == 0)
        n_threads = be_cpu_pool_ncpu();
    if (n_threads > BE_CPU_POOL_MAX)
        n_threads = BE_CPU_POOL_MAX;
    p->n = n_threads;
    atomic_init(&p->state, 0);
    atomic_init(&p->completed, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, false);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->th = calloc(n_threads - 1, sizeof(pthread_t));
        if (p->th == NULL) {
            be_cpu_pool_free(p);
            return WK_ENOMEM;
        }
        for (uint32_t i = 0; i + 1 < n_threads; i++) {
            if (pthread_create(&p->th[i], NULL, be_cpu_pool_main, p) != 0) {
                be_cpu_pool_free(p);
                return WK_EDEVICE;
            }
            p->started++;
        }
    }
    *out = p;
    return WK_OK;
}

void
be_cpu_pool_free(be_cpu_pool *p)
{
    if (p == NULL)
        return;
    atomic_store(&p->stop, true);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < p->started; i++)
        pthread_join(p->th[i], NULL);
    free(p->th);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

uint32_t
be_cpu_pool_size(const be_cpu_pool *p)
{
    return p->n;
}

void
be_cpu_pool_run(be_cpu_pool *p, be_cpu_pool_fn fn, void *arg, uint32_t n_tasks)
{
    if (n_tasks == 0)
        return;
    if (p == NULL || p->started == 0 || n_tasks == 1) {
        for (uint32_t t = 0; t < n_tasks; t++)
            fn(arg, t);
        return;
    }
    for (uint32_t base = 0; base < n_tasks; base += BE_CPU_POOL_JOB_MAX) {
        const uint32_t n = n_tasks - base < BE_CPU_POOL_JOB_MAX ? n_tasks - base
                                                                : BE_CPU_POOL_JOB_MAX;
        p->fn = fn;
        p->arg = arg;
        p->base = base;
        atomic_store_explicit(&p->completed, 0, memory_order_relaxed);
        p->gen++;
        /* seq_cst: publishes fn/arg/base, and pairs with the sleepers check */
        atomic_store(&p->state, ((uint64_t)p->gen << 32) | n);
        if (atomic_load(&p->sleepers) != 0) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
        }
        be_cpu_pool_work(p, p->gen);
        int spins = 0;
        while (atomic_load_explicit(&p->completed, memory_order_acquire) != n) {
            if (++spins < BE_CPU_POOL_WAIT_SPIN) {
                BE_CPU_PAUSE();
            } else {
                sched_yield();
                spins = 0;
            }
        }
    }
}
