/*
 * ctl_limits: a chained hash table of the users holding units, guarded by
 * one mutex. An entry exists only while its count is above zero.
 */
#include "ctl_limits.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define CTL_LIMITS_BUCKETS 256

typedef struct ctl_limits_user {
    struct ctl_limits_user *next; /* bucket chain */
    uint32_t held;                /* units held, > 0 */
    char name[];                  /* user name, NUL-terminated */
} ctl_limits_user;

struct ctl_limits {
    uint32_t max;                                  /* units per user, 0 = unlimited */
    pthread_mutex_t mu;                            /* guards everything below */
    ctl_limits_user *buckets[CTL_LIMITS_BUCKETS];  /* users holding units */
    uint32_t active;                               /* entries in the table */
};

/* FNV-1a over the name. */
static size_t
ctl_limits_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h % CTL_LIMITS_BUCKETS;
}

/* The entry of user and the link that points at it. Caller holds mu. */
static ctl_limits_user **
ctl_limits_find_locked(ctl_limits *l, const char *user, size_t n)
{
    ctl_limits_user **pp = &l->buckets[ctl_limits_hash(user, n)];
    while (*pp != NULL && strcmp((*pp)->name, user) != 0)
        pp = &(*pp)->next;
    return pp;
}

static size_t
ctl_limits_user_len(const char *user)
{
    if (user == NULL)
        return 0;
    size_t n = strnlen(user, CTL_LIMITS_USER_MAX + 1);
    return n > CTL_LIMITS_USER_MAX ? 0 : n;
}

wk_err
ctl_limits_new(uint32_t max_per_user, ctl_limits **out)
{
    ctl_limits *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return WK_ENOMEM;
    l->max = max_per_user;
    if (pthread_mutex_init(&l->mu, NULL) != 0) {
        free(l);
        return WK_ENOMEM;
    }
    *out = l;
    return WK_OK;
}

void
ctl_limits_free(ctl_limits *l)
{
    if (l == NULL)
        return;
    for (size_t i = 0; i < CTL_LIMITS_BUCKETS; i++) {
        ctl_limits_user *u = l->buckets[i];
        while (u != NULL) {
            ctl_limits_user *next = u->next;
            free(u);
            u = next;
        }
    }
    pthread_mutex_destroy(&l->mu);
    free(l);
}

wk_err
ctl_limits_acquire(ctl_limits *l, const char *user)
{
    size_t n = ctl_limits_user_len(user);
    if (l == NULL || n == 0)
        return WK_EINVAL;
    if (l->max == 0)
        return WK_OK;
    wk_err err = WK_OK;
    pthread_mutex_lock(&l->mu);
    ctl_limits_user **pp = ctl_limits_find_locked(l, user, n);
    if (*pp != NULL) {
        if ((*pp)->held >= l->max)
            err = WK_EQUOTA;
        else
            (*pp)->held++;
    } else {
        ctl_limits_user *u = malloc(sizeof(*u) + n + 1);
        if (u == NULL) {
            err = WK_ENOMEM;
        } else {
            memcpy(u->name, user, n + 1);
            u->held = 1;
            u->next = NULL;
            *pp = u;
            l->active++;
        }
    }
    pthread_mutex_unlock(&l->mu);
    return err;
}

void
ctl_limits_release(ctl_limits *l, const char *user)
{
    size_t n = ctl_limits_user_len(user);
    if (l == NULL || n == 0 || l->max == 0)
        return;
    pthread_mutex_lock(&l->mu);
    ctl_limits_user **pp = ctl_limits_find_locked(l, user, n);
    ctl_limits_user *u = *pp;
    if (u != NULL && --u->held == 0) {
        *pp = u->next;
        free(u);
        l->active--;
    }
    pthread_mutex_unlock(&l->mu);
}

uint32_t
ctl_limits_held(ctl_limits *l, const char *user)
{
    size_t n = ctl_limits_user_len(user);
    if (l == NULL || n == 0 || l->max == 0)
        return 0;
    pthread_mutex_lock(&l->mu);
    ctl_limits_user *u = *ctl_limits_find_locked(l, user, n);
    uint32_t held = u != NULL ? u->held : 0;
    pthread_mutex_unlock(&l->mu);
    return held;
}

uint32_t
ctl_limits_active_users(ctl_limits *l)
{
    if (l == NULL)
        return 0;
    pthread_mutex_lock(&l->mu);
    uint32_t n = l->active;
    pthread_mutex_unlock(&l->mu);
    return n;
}

uint32_t
ctl_limits_max(const ctl_limits *l)
{
    return l != NULL ? l->max : 0;
}
