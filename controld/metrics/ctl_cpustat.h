/*
 * ctl_cpustat: the controller's CPU time split by component, for
 * wkvm_controller_cpu_seconds_total{component}. It reads /proc/self/stat and
 * /proc/self/task/<tid>/stat and attributes each thread by its name (comm):
 * civetweb-* -> http, wkc-step -> step (the per-worker step loops), wkc-sched
 * -> sched, wkc-pool-* and nng:* -> pool (the worker link), wkc-vm and
 * wkc-ckpt -> vm (state tiers, checkpoints); "other" is the rest of the
 * process's utime+stime (the main thread, unnamed threads, and the time of a
 * named thread between its last sample and its exit).
 *
 * It never logs and never allocates; it is Linux-only (procfs) and returns
 * WK_EIO where /proc cannot be read. State (the threads seen so far and the
 * time of those that exited) is process-wide, like /proc/self.
 */
#ifndef CTL_CPUSTAT_H
#define CTL_CPUSTAT_H

#include "wk_err.h"

typedef enum ctl_cpu_component {
    CTL_CPU_COMPONENT_HTTP = 0, /* civetweb threads: request parsing, handlers, SSE writes */
    CTL_CPU_COMPONENT_STEP,     /* the step loop of each worker (wkc-step) */
    CTL_CPU_COMPONENT_SCHED,    /* the scheduler's manager thread (wkc-sched) */
    CTL_CPU_COMPONENT_POOL,     /* the worker link: wkc-pool-* and NNG's own threads */
    CTL_CPU_COMPONENT_VM,       /* state tiers: janitor and checkpoint writer */
    CTL_CPU_COMPONENT_OTHER,    /* everything else, exited unsampled time included */
    CTL_CPU_COMPONENT_COUNT,
} ctl_cpu_component;

/* The label value ("http", "step", ...); "other" for an out-of-range value. */
const char *ctl_cpu_component_name(ctl_cpu_component c);

/* The component of a thread named comm (a /proc comm, at most 15 bytes). Pure. */
ctl_cpu_component ctl_cpu_component_of(const char *comm);

/*
 * Samples the process: out[c] is the CPU seconds (user + system) of component
 * c since the process started. Each out[c] never decreases from one call to
 * the next (a thread's time stays with its component after it exits; a value
 * that would go down, e.g. after a tid is reused, is held). Thread-safe
 * (one internal mutex); costs one read per thread. WK_EIO when /proc/self
 * cannot be read; out is then untouched.
 */
WK_MUST_CHECK wk_err ctl_cpustat_sample(double out[CTL_CPU_COMPONENT_COUNT]);

#endif /* CTL_CPUSTAT_H */
