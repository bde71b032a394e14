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

/* The instant ms milliseconds after now on clock. */
static void
wk_after_ms(clockid_t clock, struct timespec *out, uint64_t ms)
{
    clock_gettime(clock, out);
    out->tv_sec += (time_t)(ms / 1000);
    out->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (out->tv_nsec >= 1000000000L) {
        out->tv_sec++;
        out->tv_nsec -= 1000000000L;
    }
}

void
wk_deadline_after_ms(struct timespec *out, uint64_t ms)
{
    wk_after_ms(CLOCK_REALTIME, out, ms);
}

void
wk_mono_deadline_after_ms(struct timespec *out, uint64_t ms)
{
    wk_after_ms(CLOCK_MONOTONIC, out, ms);
}
