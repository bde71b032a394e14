/*
 * wk_time: clock helpers (see wk_time.h).
 */
#include "wk_time.h"

uint64_t
wk_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void
wk_deadline_after_ms(struct timespec *out, uint64_t ms)
{
    clock_gettime(CLOCK_REALTIME, out);
    out->tv_sec += (time_t)(ms / 1000);
    out->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (out->tv_nsec >= 1000000000L) {
        out->tv_sec++;
        out->tv_nsec -= 1000000000L;
    }
}
