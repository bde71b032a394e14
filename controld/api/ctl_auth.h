/*
 * ctl_auth: API keys. A keys file holds one `KEY USER [admin]` line per key
 * ('#' comments, blank lines ignored); it must not be readable by group or
 * others (mode & 077 == 0). Requests carry `Authorization: Bearer KEY` or
 * `x-api-key: KEY`. With no keys configured every request is user "local"
 * with admin rights (loopback-only deployments). Keys are compared in
 * constant time. Never logs key material.
 */
#ifndef CTL_AUTH_H
#define CTL_AUTH_H

#include <stdbool.h>

#include "wk_err.h"

typedef struct ctl_auth ctl_auth;

/*
 * Loads path (NULL = no keys). Caller frees with ctl_auth_free(). WK_EINVAL
 * names the line; WK_EPERM when the file is group/world-accessible (mode &
 * 077), so that a key file left readable by others is never used.
 */
WK_MUST_CHECK wk_err ctl_auth_load(const char *path, ctl_auth **out, wk_diag *d);
void ctl_auth_free(ctl_auth *a);

/* True when at least one key is configured. */
bool ctl_auth_enabled(const ctl_auth *a);

/*
 * Resolves the request's credentials to a user: the Authorization header
 * value ("Bearer KEY") when present, else the x-api-key header value (both
 * may be NULL). On success *user is borrowed from a (valid until
 * ctl_auth_free) and *admin tells the key's rights. WK_EAUTH when keys are
 * enabled and no header names a known key. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_auth_check(const ctl_auth *a, const char *authorization,
                                    const char *api_key, const char **user, bool *admin);

#endif /* CTL_AUTH_H */
