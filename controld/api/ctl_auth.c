/*
 * ctl_auth: key file parsing and bearer-token lookup.
 */
#include "ctl_auth.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define CTL_AUTH_MAX_KEYS 4096
#define CTL_AUTH_KEY_MAX 256

typedef struct ctl_key {
    char key[CTL_AUTH_KEY_MAX]; /* secret */
    size_t key_len;             /* bytes in key */
    char user[128];             /* user name */
    bool admin;                 /* may use /admin */
} ctl_key;

struct ctl_auth {
    ctl_key *keys; /* array */
    size_t n;      /* entries */
};

wk_err
ctl_auth_load(const char *path, ctl_auth **out, wk_diag *d)
{
    ctl_auth *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return WK_ENOMEM;
    if (path == NULL || path[0] == '\0') {
        *out = a;
        return WK_OK;
    }
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        free(a);
        return wk_diag_set(d, errno == ENOENT ? WK_ENOENT : WK_EIO, "api keys %s: %s", path,
                           strerror(errno));
    }
    /* Checked on the open file, so that a swap after the check cannot matter. */
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        wk_err e = wk_diag_set(d, WK_EIO, "api keys %s: %s", path, strerror(errno));
        fclose(f);
        free(a);
        return e;
    }
    if ((sb.st_mode & 077) != 0) {
        fclose(f);
        free(a);
        return wk_diag_set(d, WK_EPERM, "api keys %s: mode %03o lets group or others read the "
                           "keys; run 'chmod 600 %s'", path, (unsigned)(sb.st_mode & 0777), path);
    }
    wk_err err = WK_OK;
    char line[1024];
    unsigned lineno = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash != NULL)
            *hash = '\0';
        char key[CTL_AUTH_KEY_MAX + 1] = "", user[129] = "", flag[32] = "", extra[8] = "";
        int nf = sscanf(line, "%256s %128s %31s %7s", key, user, flag, extra);
        if (nf <= 0)
            continue;
        if (nf < 2 || nf > 3 || (nf == 3 && strcmp(flag, "admin") != 0)) {
            err = wk_diag_set(d, WK_EINVAL, "api keys %s line %u: expected 'KEY USER [admin]'",
                              path, lineno);
            break;
        }
        if (strncmp(user, "__", 2) == 0) {
            err = wk_diag_set(d, WK_EINVAL, "api keys %s line %u: user names starting with "
                              "'__' are reserved", path, lineno);
            break;
        }
        if (strlen(key) < 8 || strlen(key) >= CTL_AUTH_KEY_MAX || strlen(user) >= 128) {
            err = wk_diag_set(d, WK_EINVAL, "api keys %s line %u: key must be 8..255 bytes",
                              path, lineno);
            break;
        }
        if (a->n >= CTL_AUTH_MAX_KEYS) {
            err = wk_diag_set(d, WK_EINVAL, "api keys %s: more than %d keys", path,
                              CTL_AUTH_MAX_KEYS);
            break;
        }
        ctl_key *nk = realloc(a->keys, (a->n + 1) * sizeof(*nk));
        if (nk == NULL) {
            err = WK_ENOMEM;
            break;
        }
        a->keys = nk;
        ctl_key *k = &a->keys[a->n++];
        memset(k, 0, sizeof(*k));
        snprintf(k->key, sizeof(k->key), "%s", key);
        k->key_len = strlen(key);
        snprintf(k->user, sizeof(k->user), "%s", user);
        k->admin = nf == 3;
    }
    fclose(f);
    if (err == WK_OK && a->n == 0)
        err = wk_diag_set(d, WK_EINVAL, "api keys %s: no keys", path);
    if (err != WK_OK) {
        ctl_auth_free(a);
        return err;
    }
    *out = a;
    return WK_OK;
}

void
ctl_auth_free(ctl_auth *a)
{
    if (a == NULL)
        return;
    if (a->keys != NULL)
        memset(a->keys, 0, a->n * sizeof(*a->keys));
    free(a->keys);
    free(a);
}

bool
ctl_auth_enabled(const ctl_auth *a)
{
    return a != NULL && a->n > 0;
}

/* Constant-time comparison over the longer length. */
static bool
ctl_auth_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    unsigned char diff = (unsigned char)(alen != blen);
    size_t n = alen > blen ? alen : blen;
    for (size_t i = 0; i < n; i++) {
        unsigned char x = i < alen ? (unsigned char)a[i] : 0;
        unsigned char y = i < blen ? (unsigned char)b[i] : 0;
        diff |= x ^ y;
    }
    return diff == 0;
}

/* The key tok names (surrounding blanks ignored), NULL when none; scans every key. */
static const ctl_key *
ctl_auth_lookup(const ctl_auth *a, const char *tok)
{
    while (*tok == ' ')
        tok++;
    size_t len = strlen(tok);
    while (len > 0 && isspace((unsigned char)tok[len - 1]))
        len--;
    const ctl_key *hit = NULL;
    for (size_t i = 0; i < a->n; i++) {
        if (ctl_auth_equal(a->keys[i].key, a->keys[i].key_len, tok, len))
            hit = &a->keys[i];
    }
    return hit;
}

wk_err
ctl_auth_check(const ctl_auth *a, const char *authorization, const char *api_key,
               const char **user, bool *admin)
{
    if (!ctl_auth_enabled(a)) {
        *user = "local";
        *admin = true;
        return WK_OK;
    }
    const ctl_key *hit = NULL;
    if (authorization != NULL && strncasecmp(authorization, "Bearer ", 7) == 0)
        hit = ctl_auth_lookup(a, authorization + 7);
    if (hit == NULL && api_key != NULL)
        hit = ctl_auth_lookup(a, api_key);
    if (hit == NULL)
        return WK_EAUTH;
    *user = hit->user;
    *admin = hit->admin;
    return WK_OK;
}
