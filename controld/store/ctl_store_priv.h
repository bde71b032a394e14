/*
 * ctl_store_priv: what only the tests of ctl_store need. The write hook lets
 * a test make blob writes fail (ENOSPC, EDQUOT, EIO, short writes) without a
 * full disk; production code never calls these.
 */
#ifndef CTL_STORE_PRIV_H
#define CTL_STORE_PRIV_H

#include <stddef.h>
#include <sys/types.h>

#include "ctl_store.h"

/* Signature of write(2); the store writes blob bytes through one of these. */
typedef ssize_t (*ctl_store_write_fn)(int fd, const void *buf, size_t len);

/*
 * Replaces the function s's blob writes go through; NULL restores write(2).
 * Not thread-safe: call it while no operation on s is in flight.
 */
void ctl_store_priv_set_write(ctl_store *s, ctl_store_write_fn fn);

#endif /* CTL_STORE_PRIV_H */
