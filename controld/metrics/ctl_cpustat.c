/*
 * ctl_cpustat: controller CPU time by component from procfs (see the header).
 * Must never log, allocate or block on anything but its own mutex.
 */
#include "ctl_cpustat.h"

#include <dirent.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CTL_CPUSTAT_MAX_THREADS 4096 /* tracked threads; beyond, live time only */

typedef struct ctl_cpustat_thread {
    long tid;   /* kernel thread id */
    int comp;   /* ctl_cpu_component */
    double cpu; /* on-CPU seconds at the last sample */
    bool seen;  /* seen in the current sample */
} ctl_cpustat_thread;

static struct {
    pthread_mutex_t mu;                            /* guards all of this */
    size_t n;                                      /* entries in t */
    ctl_cpustat_thread t[CTL_CPUSTAT_MAX_THREADS]; /* threads seen alive */
    double retired[CTL_CPU_COMPONENT_COUNT];       /* time of exited threads */
    double last[CTL_CPU_COMPONENT_COUNT];          /* last values returned */
} g_cpu = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const char *const ctl_cpu_names[CTL_CPU_COMPONENT_COUNT] = {
    "http", "step", "sched", "pool", "vm", "other",
};

const char *
ctl_cpu_component_name(ctl_cpu_component c)
{
    return (unsigned)c < CTL_CPU_COMPONENT_COUNT ? ctl_cpu_names[c] : "other";
}

ctl_cpu_component
ctl_cpu_component_of(const char *comm)
{
    static const struct {
        const char *prefix;
        ctl_cpu_component comp;
    } map[] = {
        {"civetweb", CTL_CPU_COMPONENT_HTTP},   {"wkc-sse", CTL_CPU_COMPONENT_HTTP},
        {"wkc-step", CTL_CPU_COMPONENT_STEP},
        {"wkc-sched", CTL_CPU_COMPONENT_SCHED}, {"wkc-pool", CTL_CPU_COMPONENT_POOL},
        {"nng:", CTL_CPU_COMPONENT_POOL},       {"wkc-vm", CTL_CPU_COMPONENT_VM},
        {"wkc-ckpt", CTL_CPU_COMPONENT_VM},
    };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strncmp(comm, map[i].prefix, strlen(map[i].prefix)) == 0)
            return map[i].comp;
    return CTL_CPU_COMPONENT_OTHER;
}

/* utime+stime (seconds) and comm of one /proc stat file; false if unreadable. */
static bool
ctl_cpustat_read(const char *path, double *cpu, char comm[16])
{
    char buf[1024];
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *open = strchr(buf, '('), *close = strrchr(buf, ')');
    if (open == NULL || close == NULL || close < open)
        return false;
    size_t cl = (size_t)(close - open - 1);
    if (comm != NULL) {
        if (cl > 15)
            cl = 15;
        memcpy(comm, open + 1, cl);
        comm[cl] = '\0';
    }
    /* after ") ": state ppid pgrp session tty tpgid flags, 4 fault counts, utime stime */
    unsigned long long ut = 0, st = 0;
    if (sscanf(close + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return false;
    long tck = sysconf(_SC_CLK_TCK);
    *cpu = (double)(ut + st) / (double)(tck > 0 ? tck : 100);
    return true;
}

wk_err
ctl_cpustat_sample(double out[CTL_CPU_COMPONENT_COUNT])
{
    double total = 0, live[CTL_CPU_COMPONENT_COUNT] = {0};
    if (!ctl_cpustat_read("/proc/self/stat", &total, NULL))
        return WK_EIO;
    DIR *d = opendir("/proc/self/task");
    if (d == NULL)
        return WK_EIO;
    pthread_mutex_lock(&g_cpu.mu);
    for (size_t i = 0; i < g_cpu.n; i++)
        g_cpu.t[i].seen = false;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char *end = NULL;
        long tid = strtol(de->d_name, &end, 10);
        if (end == de->d_name || *end != '\0')
            continue;
        char path[64], comm[16];
        double cpu = 0;
        snprintf(path, sizeof(path), "/proc/self/task/%ld/stat", tid);
        if (!ctl_cpustat_read(path, &cpu, comm))
            continue; /* exited meanwhile: counted as retired below */
        /* schedstat's on-CPU nanoseconds, where the kernel has it: stat's ticks
         * are truncated per thread, which loses most of a short busy thread's time */
        snprintf(path, sizeof(path), "/proc/self/task/%ld/schedstat", tid);
        FILE *f = fopen(path, "re");
        unsigned long long ns = 0;
        if (f != NULL) {
            if (fscanf(f, "%llu", &ns) == 1)
                cpu = (double)ns / 1e9;
            fclose(f);
        }
        int comp = (int)ctl_cpu_component_of(comm);
        live[comp] += cpu;
        size_t i = 0;
        while (i < g_cpu.n && g_cpu.t[i].tid != tid)
            i++;
        if (i < g_cpu.n && g_cpu.t[i].cpu > cpu) {
            /* tid reused: the old thread's time is retired (a renamed thread just moves) */
            g_cpu.retired[g_cpu.t[i].comp] += g_cpu.t[i].cpu;
        } else if (i == g_cpu.n) {
            if (g_cpu.n == CTL_CPUSTAT_MAX_THREADS)
                continue;
            g_cpu.n++;
            g_cpu.t[i].tid = tid;
        }
        g_cpu.t[i].comp = comp;
        g_cpu.t[i].cpu = cpu;
        g_cpu.t[i].seen = true;
    }
    closedir(d);
    for (size_t i = 0; i < g_cpu.n;) {
        if (g_cpu.t[i].seen) {
            i++;
            continue;
        }
        g_cpu.retired[g_cpu.t[i].comp] += g_cpu.t[i].cpu;
        g_cpu.t[i] = g_cpu.t[--g_cpu.n];
    }
    double named = 0, v[CTL_CPU_COMPONENT_COUNT];
    for (int c = 0; c < CTL_CPU_COMPONENT_OTHER; c++) {
        v[c] = live[c] + g_cpu.retired[c];
        named += v[c];
    }
    v[CTL_CPU_COMPONENT_OTHER] = total > named ? total - named : 0;
    for (int c = 0; c < CTL_CPU_COMPONENT_COUNT; c++) {
        if (v[c] > g_cpu.last[c])
            g_cpu.last[c] = v[c];
        out[c] = g_cpu.last[c];
    }
    pthread_mutex_unlock(&g_cpu.mu);
    return WK_OK;
}
