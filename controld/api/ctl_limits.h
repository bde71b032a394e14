/*
 * ctl_limits: per-user concurrency accounting for the generation routes.
 * A request takes one unit of its user's budget before it parses or
 * generates anything and gives it back when it has answered; a user already
 * at the limit is refused (WK_EQUOTA, answered 429 "quota_exceeded"). Users
 * are tracked only while they hold units, so the table never grows with the
 * number of users seen, only with the number active at once.
 *
 * Pure bookkeeping: no HTTP, no logging. Threading: every function is
 * thread-safe (one mutex; each call is O(1) expected).
 */
#ifndef CTL_LIMITS_H
#define CTL_LIMITS_H

#include <stdint.h>

#include "wk_err.h"

typedef struct ctl_limits ctl_limits;

/* Longest user name tracked (longer names are refused with WK_EINVAL). */
#define CTL_LIMITS_USER_MAX 128

/*
 * Creates the accounting with max_per_user units per user (0 = unlimited:
 * acquire always succeeds, nothing is tracked). Caller frees with
 * ctl_limits_free(). WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_limits_new(uint32_t max_per_user, ctl_limits **out);

/* Frees the accounting. NULL-safe. Units still held are forgotten. */
void ctl_limits_free(ctl_limits *l);

/*
 * Takes one unit for user (borrowed for the call). WK_OK: the caller must
 * call ctl_limits_release() with the same user exactly once. WK_EQUOTA:
 * user already holds max_per_user units (nothing taken). WK_EINVAL: user is
 * NULL, empty or longer than CTL_LIMITS_USER_MAX. WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_limits_acquire(ctl_limits *l, const char *user);

/* Gives back one unit of user; a release without a unit held is ignored. NULL-safe. */
void ctl_limits_release(ctl_limits *l, const char *user);

/* Units user holds now (0 when unknown). */
uint32_t ctl_limits_held(ctl_limits *l, const char *user);

/* Users holding at least one unit now. */
uint32_t ctl_limits_active_users(ctl_limits *l);

/* The configured units per user (0 = unlimited). */
uint32_t ctl_limits_max(const ctl_limits *l);

#endif /* CTL_LIMITS_H */
