/*
 * wk_err: the one project error enum and its strings. The table that maps
 * each code to an HTTP status and an OpenAI error type and code belongs to
 * the controller (controld/api/ctl_err.h): the worker never speaks HTTP.
 *
 * Library-like code returns a wk_err and, when the caller passes one, writes
 * human detail into a wk_diag. It never logs and never aborts on bad input.
 */
#ifndef WK_ERR_H
#define WK_ERR_H

#include <stddef.h>

#define WK_MUST_CHECK __attribute__((warn_unused_result))
#define WK_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))

typedef enum wk_err {
    WK_OK = 0,     /* success */
    WK_ENOMEM,     /* out of memory */
    WK_EINVAL,     /* invalid argument or malformed input */
    WK_ENOENT,     /* no such object */
    WK_EEXIST,     /* object already exists */
    WK_EBUSY,      /* object in use (session busy, slot pinned) */
    WK_ESTATE,     /* operation not valid in the object's current state */
    WK_ENOSPC,     /* no free slot or storage */
    WK_ETIMEDOUT,  /* deadline passed */
    WK_EPROTO,     /* protocol violation on the wire */
    WK_EIO,        /* I/O error (file, socket) */
    WK_EDEVICE,    /* accelerator or backend failure */
    WK_EPERM,      /* caller lacks permission (forbidden) */
    WK_EAUTH,      /* missing or unknown credentials */
    WK_ETOOBIG,    /* input over a documented limit */
    WK_ENOTSUP,    /* feature not supported */
    WK_EQUEUEFULL, /* admission queue full */
    WK_EUNAVAIL,   /* no worker / service unavailable */
    WK_ECORRUPT,   /* stored data failed a checksum or format check */
    WK_EQUOTA,     /* a per-user quota or concurrency limit is reached */
    WK_ERR__COUNT
} wk_err;

/* Human detail for a failure. Written only on failure, never required. */
typedef struct wk_diag {
    char msg[512]; /* NUL-terminated message, "" when unset */
} wk_diag;

/* Returns a static, human-readable string for err ("invalid argument"). */
const char *wk_strerror(wk_err err);

/* Returns the enum name of err ("WK_EINVAL"), static. */
const char *wk_err_name(wk_err err);

/*
 * Writes a formatted message into d. NULL-safe: does nothing when d is NULL.
 * Returns err so that call sites read `return wk_diag_set(d, WK_EINVAL, ...)`.
 */
wk_err wk_diag_set(wk_diag *d, wk_err err, const char *fmt, ...) WK_PRINTF(3, 4);

/* Prefixes the message in d with a formatted context string. NULL-safe. */
void wk_diag_prefix(wk_diag *d, const char *fmt, ...) WK_PRINTF(2, 3);

#endif /* WK_ERR_H */
