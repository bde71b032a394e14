/*
 * wk_time: the two clock helpers the daemons need everywhere: a monotonic
 * millisecond counter for durations and deadlines, and the absolute
 * CLOCK_REALTIME instant pthread_cond_timedwait() wants for "ms from now".
 */
#ifndef WK_TIME_H
#define WK_TIME_H

#include <stdint.h>
#include <time.h>

/* Milliseconds on CLOCK_MONOTONIC. */
uint64_t wk_mono_ms(void);

/* The CLOCK_REALTIME instant ms milliseconds from now, for pthread_cond_timedwait(). */
void wk_deadline_after_ms(struct timespec *out, uint64_t ms);

/*
 * The CLOCK_MONOTONIC instant ms milliseconds from now, for a condition
 * variable made with pthread_condattr_setclock(CLOCK_MONOTONIC).
 */
void wk_mono_deadline_after_ms(struct timespec *out, uint64_t ms);

#endif /* WK_TIME_H */
