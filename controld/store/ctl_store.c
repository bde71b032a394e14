/*
 * ctl_store: LMDB metadata and content-addressed blobs (see ctl_store.h for
 * the layout and the contract). The only production file that includes lmdb.h.
 *
 * Locking. LMDB serializes write transactions itself. On top of it:
 *   map_lock (rwlock)  every transaction holds it shared; growing the map on
 *                      MDB_MAP_FULL takes it exclusive, because LMDB may only
 *                      resize with no transaction active in the process.
 *   blob_mu (mutex)    held by operations that take a reference to a blob
 *                      whose count may be zero (check the file exists, then
 *                      commit) and by the collector (check the count is
 *                      zero, then unlink), so a blob is never unlinked under
 *                      a reference that is being created.
 * Order: blob_mu before map_lock. A write operation is a function run inside
 * st_write(), which retries it after growing the map, so it must keep its
 * effects inside the transaction and its outputs in its argument.
 *
 * It must never log, never keep a pointer into LMDB memory past its
 * transaction (or past a later write in the same transaction), and never
 * unlink a blob that a committed record references.
 */
#include "ctl_store.h"
#include "ctl_store_priv.h"
#include "wk_bytes.h"
#include "wk_hex.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define ST_REC_FORMAT 1u               /* encoding version of a state record */
#define ST_REC_FIXED 140u              /* bytes of a record before its strings */
#define ST_KEY_MAX (CTL_STORE_OWNER_MAX + 1 + CTL_STORE_NAME_MAX + 1 + 8) /* state key bytes */
#define ST_FLAG_DAMAGED 1u             /* record flag: damaged */
#define ST_FLAG_BLOB 2u                /* record flag: has a blob */
#define ST_MAXDBS 8                    /* named databases LMDB reserves room for */
#define ST_GROW_ATTEMPTS 64            /* most map doublings one operation may need */
#define ST_IO_CHUNK ((size_t)1 << 20)  /* read size when hashing a blob file */
#define ST_PAGE 4096u                  /* map sizes are rounded up to this */

struct ctl_store {
    MDB_env *env;             /* the LMDB environment under <data>/store */
    MDB_dbi db_states;        /* (owner\0name\0ver_be64) -> record */
    MDB_dbi db_names;         /* (owner\0name\0) -> next version (u64 LE) */
    MDB_dbi db_refs;          /* blob sha256 (32 raw bytes) -> reference count (u64 LE) */
    MDB_dbi db_sessions;      /* session key -> bytes */
    MDB_dbi db_meta;          /* "schema" -> u32 LE */
    pthread_rwlock_t map_lock; /* shared by transactions, exclusive to resize */
    pthread_mutex_t blob_mu;  /* orders blob reference-taking against collection */
    bool locks_ready;         /* map_lock and blob_mu are initialized */
    uint64_t map_size;        /* current map size (under map_lock) */
    uint64_t map_size_max;    /* growth ceiling */
    int blob_dirfd;           /* <data>/blobs, O_DIRECTORY; -1 when not open */
    int lock_fd;              /* <data>/store/ctl_store.lock, flock'ed; -1 when not open */
    atomic_uint tmp_seq;      /* distinguishes temp files of one process */
    ctl_store_write_fn write_fn; /* blob writes go through it: write(2), or a test's hook */
};

/* ---- write hook (ctl_store_priv.h) ---------------------------------------- */

static ssize_t
st_sys_write(int fd, const void *buf, size_t len)
{
    return write(fd, buf, len);
}

void
ctl_store_priv_set_write(ctl_store *s, ctl_store_write_fn fn)
{
    s->write_fn = fn != NULL ? fn : st_sys_write;
}

/* ---- small helpers --------------------------------------------------------- */

static int64_t
st_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* True when s is exactly 64 lowercase hex digits. */
static bool
st_is_hex64(const char *s)
{
    if (s == NULL)
        return false;
    for (int i = 0; i < 64; i++)
        if (wk_hex_digit_lower((unsigned char)s[i]) < 0)
            return false;
    return s[64] == '\0';
}

/* Decodes 64 lowercase hex digits (already checked) into 32 bytes. */
static void
st_hex_to_raw(const char *hex, uint8_t raw[WK_SHA256_LEN])
{
    (void)wk_hex_decode_lower(hex, WK_SHA256_LEN, raw);
}

/* Maps an errno from file I/O to a wk_err with a message. */
static wk_err
st_errno(int err, const char *what, const char *name, wk_diag *d)
{
    if (err == ENOSPC || err == EDQUOT)
        return wk_diag_set(d, WK_ENOSPC, "%s %s: no space left (%s)", what, name, strerror(err));
    if (err == ENOMEM)
        return wk_diag_set(d, WK_ENOMEM, "%s %s: out of memory", what, name);
    if (err == ENOENT)
        return wk_diag_set(d, WK_ENOENT, "%s %s: no such file", what, name);
    return wk_diag_set(d, WK_EIO, "%s %s: %s", what, name, strerror(err));
}

/* ---- names, owners, ids ------------------------------------------------------ */

static bool
st_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
}

wk_err
ctl_store_name_check(const char *name, wk_diag *d)
{
    if (name == NULL || name[0] == '\0')
        return wk_diag_set(d, WK_EINVAL, "state name must be 1..%u bytes of [A-Za-z0-9._-]",
                           CTL_STORE_NAME_MAX);
    size_t n = strnlen(name, CTL_STORE_NAME_MAX + 1);
    if (n > CTL_STORE_NAME_MAX)
        return wk_diag_set(d, WK_EINVAL, "state name is longer than %u bytes", CTL_STORE_NAME_MAX);
    for (size_t i = 0; i < n; i++)
        if (!st_name_char(name[i]))
            return wk_diag_set(d, WK_EINVAL,
                               "state name may only contain [A-Za-z0-9._-] (byte %zu is not)", i);
    return WK_OK;
}

wk_err
ctl_store_owner_check(const char *owner, wk_diag *d)
{
    if (owner == NULL || owner[0] == '\0')
        return wk_diag_set(d, WK_EINVAL, "owner must be 1..%u printable ASCII bytes",
                           CTL_STORE_OWNER_MAX);
    size_t n = strnlen(owner, CTL_STORE_OWNER_MAX + 1);
    if (n > CTL_STORE_OWNER_MAX)
        return wk_diag_set(d, WK_EINVAL, "owner is longer than %u bytes", CTL_STORE_OWNER_MAX);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)owner[i] < 0x20 || (unsigned char)owner[i] > 0x7e)
            return wk_diag_set(d, WK_EINVAL, "owner must be printable ASCII (byte %zu is not)", i);
    return WK_OK;
}

wk_err
ctl_store_id_parse(const char *ref, char name[CTL_STORE_NAME_MAX + 1], uint64_t *version,
                   wk_diag *d)
{
    if (ref == NULL || name == NULL || version == NULL)
        return wk_diag_set(d, WK_EINVAL, "state id: NULL argument");
    size_t rl = strnlen(ref, CTL_STORE_ID_MAX + 1);
    if (rl > CTL_STORE_ID_MAX)
        return wk_diag_set(d, WK_EINVAL, "state id is longer than %u bytes", CTL_STORE_ID_MAX);
    const char *at = memchr(ref, '@', rl);
    size_t nl = at != NULL ? (size_t)(at - ref) : rl;
    char nm[CTL_STORE_ID_MAX + 1];
    memcpy(nm, ref, nl);
    nm[nl] = '\0';
    wk_err e = ctl_store_name_check(nm, d);
    if (e != WK_OK)
        return e;
    uint64_t v = 0;
    if (at != NULL) {
        const char *p = at + 1;
        size_t dl = rl - nl - 1;
        if (dl == 0 || dl > 19 || p[0] == '0')
            return wk_diag_set(d, WK_EINVAL,
                               "state id version must be a decimal number >= 1 without leading "
                               "zeros ('name@3')");
        for (size_t i = 0; i < dl; i++) {
            if (p[i] < '0' || p[i] > '9')
                return wk_diag_set(d, WK_EINVAL, "state id version has a non-digit");
            v = v * 10 + (uint64_t)(p[i] - '0');
        }
    }
    memcpy(name, nm, nl + 1);
    *version = v;
    return WK_OK;
}

static const char *const st_tier_names[] = {"hot", "warm", "cold"};
static const char *const st_op_names[] = {"create", "fork",   "snapshot", "generate",
                                          "import", "rollback", "session"};
#define ST_N_TIERS (sizeof(st_tier_names) / sizeof(st_tier_names[0]))
#define ST_N_OPS (sizeof(st_op_names) / sizeof(st_op_names[0]))

const char *
ctl_store_tier_name(ctl_store_tier t)
{
    return (unsigned)t < ST_N_TIERS ? st_tier_names[t] : "?";
}

const char *
ctl_store_op_name(ctl_store_op op)
{
    return (unsigned)op < ST_N_OPS ? st_op_names[op] : "?";
}

wk_err
ctl_store_tier_parse(const char *s, ctl_store_tier *out, wk_diag *d)
{
    for (unsigned i = 0; s != NULL && i < ST_N_TIERS; i++) {
        if (strcmp(s, st_tier_names[i]) == 0) {
            *out = (ctl_store_tier)i;
            return WK_OK;
        }
    }
    return wk_diag_set(d, WK_EINVAL, "tier must be one of hot, warm, cold");
}

wk_err
ctl_store_op_parse(const char *s, ctl_store_op *out, wk_diag *d)
{
    for (unsigned i = 0; s != NULL && i < ST_N_OPS; i++) {
        if (strcmp(s, st_op_names[i]) == 0) {
            *out = (ctl_store_op)i;
            return WK_OK;
        }
    }
    return wk_diag_set(d, WK_EINVAL,
                       "operation must be one of create, fork, snapshot, generate, import, "
                       "rollback, session");
}

static wk_err
st_family_check(const char *fam, wk_diag *d)
{
    size_t n = strnlen(fam, CTL_STORE_FAMILY_MAX + 1);
    if (n == 0 || n > CTL_STORE_FAMILY_MAX)
        return wk_diag_set(d, WK_EINVAL, "family must be 1..%u bytes of [a-z0-9_-]",
                           CTL_STORE_FAMILY_MAX);
    for (size_t i = 0; i < n; i++) {
        char c = fam[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return wk_diag_set(d, WK_EINVAL, "family may only contain [a-z0-9_-]");
    }
    return WK_OK;
}

/* ---- keys ------------------------------------------------------------------------ */

/* A states/names key being built: owner \0 [name \0 [version big-endian]]. */
typedef struct st_key {
    uint8_t b[ST_KEY_MAX]; /* key bytes */
    size_t n;              /* bytes used */
} st_key;

static void
st_key_owner(st_key *k, const char *owner)
{
    size_t ol = strlen(owner);
    memcpy(k->b, owner, ol + 1);
    k->n = ol + 1;
}

static void
st_key_name(st_key *k, const char *owner, const char *name)
{
    st_key_owner(k, owner);
    size_t nl = strlen(name);
    memcpy(k->b + k->n, name, nl + 1);
    k->n += nl + 1;
}

static void
st_key_state(st_key *k, const char *owner, const char *name, uint64_t version)
{
    st_key_name(k, owner, name);
    wk_be64_put(k->b + k->n, version);
    k->n += 8;
}

static bool
st_has_prefix(const MDB_val *k, const void *prefix, size_t n)
{
    return k->mv_size >= n && memcmp(k->mv_data, prefix, n) == 0;
}

/* ---- transactions ---------------------------------------------------------------- */

/* A write transaction in progress inside st_write(). */
typedef struct st_txn {
    ctl_store *s;  /* the store */
    MDB_txn *txn;  /* the LMDB transaction */
    bool map_full; /* an operation hit MDB_MAP_FULL: grow and retry */
} st_txn;

/* Translates an LMDB return code (never 0) into a wk_err. */
static wk_err
st_mdb_err(st_txn *t, int rc, const char *what, wk_diag *d)
{
    switch (rc) {
    case MDB_MAP_FULL:
        if (t != NULL)
            t->map_full = true;
        return wk_diag_set(d, WK_ENOSPC, "store: %s: the LMDB map is full", what);
    case MDB_NOTFOUND:
        return wk_diag_set(d, WK_ENOENT, "store: %s: not found", what);
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_BAD_DBI:
    case MDB_INCOMPATIBLE:
        return wk_diag_set(d, WK_ECORRUPT, "store: %s: %s", what, mdb_strerror(rc));
    case MDB_VERSION_MISMATCH:
        return wk_diag_set(d, WK_ENOTSUP, "store: %s: %s", what, mdb_strerror(rc));
    case MDB_READERS_FULL:
    case MDB_TXN_FULL:
        return wk_diag_set(d, WK_EBUSY, "store: %s: %s", what, mdb_strerror(rc));
    case ENOSPC:
    case EDQUOT:
        return wk_diag_set(d, WK_ENOSPC, "store: %s: no space left on the store's disk", what);
    case ENOMEM:
        return wk_diag_set(d, WK_ENOMEM, "store: %s: out of memory", what);
    default:
        return wk_diag_set(d, WK_EIO, "store: %s: %s", what, mdb_strerror(rc));
    }
}

/*
 * True when the filesystem under the LMDB file has (almost) no room left:
 * LMDB turns a short write, which is what a full disk gives it, into EIO,
 * and the caller must be told "no space" (a transient 503 that frees up),
 * not "I/O error".
 */
static bool
st_disk_full(ctl_store *s)
{
    int fd = -1;
    struct statvfs v;
    if (mdb_env_get_fd(s->env, &fd) != 0 || fd < 0 || fstatvfs(fd, &v) != 0)
        return false;
    return (uint64_t)v.f_bavail * v.f_frsize < (4u << 20); /* under 4 MiB: full */
}

wk_err
ctl_store_fs_space(ctl_store *s, uint64_t *avail, uint64_t *total)
{
    int fd = -1;
    struct statvfs v;
    if (s == NULL || s->env == NULL || mdb_env_get_fd(s->env, &fd) != 0 || fd < 0 ||
        fstatvfs(fd, &v) != 0)
        return WK_EIO;
    *avail = (uint64_t)v.f_bavail * v.f_frsize;
    *total = (uint64_t)v.f_blocks * v.f_frsize;
    return WK_OK;
}

/* Rereads the map size LMDB uses (it may round a requested size up). */
static uint64_t
st_env_map_size(MDB_env *env)
{
    MDB_envinfo info;
    if (mdb_env_info(env, &info) != 0)
        return 0;
    return (uint64_t)info.me_mapsize;
}

/* Doubles the map (up to the ceiling) unless another thread already grew it from `seen`. */
static wk_err
st_grow(ctl_store *s, uint64_t seen, wk_diag *d)
{
    wk_err e = WK_OK;
    pthread_rwlock_wrlock(&s->map_lock);
    if (s->map_size == seen) {
        if (seen >= s->map_size_max) {
            e = wk_diag_set(d, WK_ENOSPC,
                            "store: the LMDB map is full at its maximum of %llu bytes (raise "
                            "the store's map size maximum)",
                            (unsigned long long)s->map_size_max);
        } else {
            uint64_t n = seen > s->map_size_max / 2 ? s->map_size_max : seen * 2;
            int rc = mdb_env_set_mapsize(s->env, (size_t)n);
            if (rc != 0) {
                e = st_mdb_err(NULL, rc, "growing the map", d);
            } else {
                uint64_t got = st_env_map_size(s->env);
                s->map_size = got > n ? got : n;
            }
        }
    }
    pthread_rwlock_unlock(&s->map_lock);
    return e;
}

/* A write operation run inside st_write(); returns WK_OK to commit. */
typedef wk_err (*st_write_op)(st_txn *t, void *arg, wk_diag *d);

/* Runs fn in a write transaction, growing the map and retrying on MDB_MAP_FULL. */
static wk_err
st_write(ctl_store *s, st_write_op fn, void *arg, wk_diag *d)
{
    wk_diag ld = {{0}};
    wk_err e = WK_OK;
    for (int attempt = 0; attempt < ST_GROW_ATTEMPTS; attempt++) {
        st_txn t = {s, NULL, false};
        pthread_rwlock_rdlock(&s->map_lock);
        uint64_t seen = s->map_size;
        int rc = mdb_txn_begin(s->env, NULL, 0, &t.txn);
        if (rc != 0) {
            e = st_mdb_err(&t, rc, "beginning a write", &ld);
        } else {
            e = fn(&t, arg, &ld);
            if (e == WK_OK) {
                rc = mdb_txn_commit(t.txn);
                if (rc == EIO && st_disk_full(s))
                    rc = ENOSPC; /* LMDB reports a short write as EIO */
                if (rc != 0)
                    e = st_mdb_err(&t, rc, "commit", &ld);
            } else {
                mdb_txn_abort(t.txn);
            }
        }
        pthread_rwlock_unlock(&s->map_lock);
        if (e == WK_OK || !t.map_full)
            break;
        if ((e = st_grow(s, seen, &ld)) != WK_OK)
            break;
        e = WK_ENOSPC;
        wk_diag_set(&ld, WK_ENOSPC, "store: the LMDB map stayed full after growing");
    }
    if (e != WK_OK && d != NULL)
        *d = ld;
    return e;
}

static wk_err
st_read_begin(ctl_store *s, MDB_txn **txn, wk_diag *d)
{
    pthread_rwlock_rdlock(&s->map_lock);
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, txn);
    if (rc != 0) {
        pthread_rwlock_unlock(&s->map_lock);
        return st_mdb_err(NULL, rc, "beginning a read", d);
    }
    return WK_OK;
}

static void
st_read_end(ctl_store *s, MDB_txn *txn)
{
    mdb_txn_abort(txn);
    pthread_rwlock_unlock(&s->map_lock);
}

uint64_t
ctl_store_map_size(ctl_store *s)
{
    pthread_rwlock_rdlock(&s->map_lock);
    uint64_t n = s->map_size;
    pthread_rwlock_unlock(&s->map_lock);
    return n;
}

/* ---- records --------------------------------------------------------------------- */

/*
 * A state record in its stored form. Strings are not NUL-terminated; they
 * and the tokens point either into caller memory (put) or into a copied
 * value (decode).
 */
typedef struct st_rec {
    const char *owner;      /* owner bytes */
    size_t owner_len;       /* 1..CTL_STORE_OWNER_MAX */
    const char *name;       /* name bytes */
    size_t name_len;        /* 1..CTL_STORE_NAME_MAX */
    const char *family;     /* family bytes */
    size_t family_len;      /* 1..CTL_STORE_FAMILY_MAX */
    const char *parent;     /* parent id bytes */
    size_t parent_len;      /* 0..CTL_STORE_ID_MAX */
    uint64_t version;       /* version number */
    uint8_t fp[WK_SHA256_LEN];   /* model fingerprint */
    uint8_t td[WK_SHA256_LEN];   /* token digest */
    uint8_t blob[WK_SHA256_LEN]; /* blob SHA-256 when has_blob */
    bool has_blob;          /* blob is set */
    bool damaged;           /* damaged flag */
    uint8_t tier;           /* ctl_store_tier */
    uint8_t op;             /* ctl_store_op */
    int64_t created_ms;     /* creation time */
    int64_t used_ms;        /* last use */
    uint64_t blob_bytes;    /* blob size */
    uint64_t state_bytes;   /* state size */
    const int32_t *tok;     /* tokens as host ints (put), or NULL */
    const uint8_t *tok_le;  /* tokens as stored int32 LE (decode), or NULL */
    uint32_t n_tokens;      /* token count */
} st_rec;

static size_t
st_rec_size(const st_rec *r)
{
    return ST_REC_FIXED + 4 + r->owner_len + r->name_len + r->family_len + r->parent_len + 4 +
           4 * (size_t)r->n_tokens;
}

/*
 * Encodes r into a heap buffer of *len bytes:
 *   u8 format, u8 flags, u8 tier, u8 op, u64 version, i64 created_ms,
 *   i64 used_ms, u64 blob_bytes, u64 state_bytes (all LE), fingerprint[32],
 *   token digest[32], blob[32], then u8 len + bytes of owner, name, family
 *   and parent, then u32 n_tokens and the ids as int32 LE.
 */
static uint8_t *
st_rec_encode(const st_rec *r, size_t *len)
{
    size_t n = st_rec_size(r);
    uint8_t *b = malloc(n), *p = b;
    if (b == NULL)
        return NULL;
    *p++ = ST_REC_FORMAT;
    *p++ = (uint8_t)((r->damaged ? ST_FLAG_DAMAGED : 0) | (r->has_blob ? ST_FLAG_BLOB : 0));
    *p++ = r->tier;
    *p++ = r->op;
    wk_le64_put(p, r->version);
    wk_le64_put(p + 8, (uint64_t)r->created_ms);
    wk_le64_put(p + 16, (uint64_t)r->used_ms);
    wk_le64_put(p + 24, r->blob_bytes);
    wk_le64_put(p + 32, r->state_bytes);
    p += 40;
    memcpy(p, r->fp, WK_SHA256_LEN);
    memcpy(p + 32, r->td, WK_SHA256_LEN);
    if (r->has_blob)
        memcpy(p + 64, r->blob, WK_SHA256_LEN);
    else
        memset(p + 64, 0, WK_SHA256_LEN);
    p += 96;
    const char *strs[4] = {r->owner, r->name, r->family, r->parent};
    size_t lens[4] = {r->owner_len, r->name_len, r->family_len, r->parent_len};
    for (int i = 0; i < 4; i++) {
        *p++ = (uint8_t)lens[i];
        memcpy(p, strs[i], lens[i]);
        p += lens[i];
    }
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(r->n_tokens >> (8 * i));
    p += 4;
    if (r->tok_le != NULL) {
        memcpy(p, r->tok_le, 4 * (size_t)r->n_tokens);
    } else {
        for (uint32_t i = 0; i < r->n_tokens; i++, p += 4) {
            uint32_t v = (uint32_t)r->tok[i];
            p[0] = (uint8_t)v;
            p[1] = (uint8_t)(v >> 8);
            p[2] = (uint8_t)(v >> 16);
            p[3] = (uint8_t)(v >> 24);
        }
    }
    *len = n;
    return b;
}

/* Decodes a stored record (copied out of LMDB, or still in the txn). WK_ECORRUPT. */
static wk_err
st_rec_decode(const void *buf, size_t len, st_rec *r, wk_diag *d)
{
    const uint8_t *b = buf, *p = b, *end = b + len;
    memset(r, 0, sizeof(*r));
    if (len < ST_REC_FIXED + 8)
        return wk_diag_set(d, WK_ECORRUPT, "store: state record of %zu bytes is truncated", len);
    if (p[0] != ST_REC_FORMAT)
        return wk_diag_set(d, WK_ECORRUPT, "store: state record format %u is unknown", p[0]);
    r->damaged = (p[1] & ST_FLAG_DAMAGED) != 0;
    r->has_blob = (p[1] & ST_FLAG_BLOB) != 0;
    r->tier = p[2];
    r->op = p[3];
    if (r->tier >= ST_N_TIERS || r->op >= ST_N_OPS || (p[1] & ~3u) != 0)
        return wk_diag_set(d, WK_ECORRUPT, "store: state record has a bad tier, op or flag");
    p += 4;
    r->version = wk_le64_get(p);
    r->created_ms = (int64_t)wk_le64_get(p + 8);
    r->used_ms = (int64_t)wk_le64_get(p + 16);
    r->blob_bytes = wk_le64_get(p + 24);
    r->state_bytes = wk_le64_get(p + 32);
    p += 40;
    memcpy(r->fp, p, WK_SHA256_LEN);
    memcpy(r->td, p + 32, WK_SHA256_LEN);
    memcpy(r->blob, p + 64, WK_SHA256_LEN);
    p += 96;
    const char **strs[4] = {&r->owner, &r->name, &r->family, &r->parent};
    size_t *lens[4] = {&r->owner_len, &r->name_len, &r->family_len, &r->parent_len};
    const size_t maxs[4] = {CTL_STORE_OWNER_MAX, CTL_STORE_NAME_MAX, CTL_STORE_FAMILY_MAX,
                            CTL_STORE_ID_MAX};
    for (int i = 0; i < 4; i++) {
        if (end - p < 1 || *p > maxs[i] || (size_t)(end - p - 1) < *p)
            return wk_diag_set(d, WK_ECORRUPT, "store: state record string %d is malformed", i);
        *lens[i] = *p;
        *strs[i] = (const char *)p + 1;
        p += 1 + *p;
    }
    if (r->owner_len == 0 || r->name_len == 0 || r->family_len == 0)
        return wk_diag_set(d, WK_ECORRUPT, "store: state record has an empty owner/name/family");
    if (end - p < 4)
        return wk_diag_set(d, WK_ECORRUPT, "store: state record has no token count");
    r->n_tokens = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                  (uint32_t)p[3] << 24;
    p += 4;
    if (r->n_tokens > CTL_STORE_MAX_TOKENS || (size_t)(end - p) != 4 * (size_t)r->n_tokens)
        return wk_diag_set(d, WK_ECORRUPT, "store: state record token array is malformed");
    r->tok_le = p;
    return WK_OK;
}

/* Copies r into the public form; tokens only when want_tokens (heap). */
static wk_err
st_rec_export(const st_rec *r, bool want_tokens, ctl_store_state *out, wk_diag *d)
{
    memset(out, 0, sizeof(*out));
    memcpy(out->owner, r->owner, r->owner_len);
    memcpy(out->name, r->name, r->name_len);
    memcpy(out->family, r->family, r->family_len);
    memcpy(out->parent, r->parent, r->parent_len);
    out->version = r->version;
    snprintf(out->id, sizeof(out->id), "%s@%llu", out->name, (unsigned long long)r->version);
    wk_sha256_to_hex(r->fp, out->fingerprint);
    wk_sha256_to_hex(r->td, out->token_digest);
    if (r->has_blob)
        wk_sha256_to_hex(r->blob, out->blob);
    out->n_tokens = r->n_tokens;
    out->op = (ctl_store_op)r->op;
    out->tier = (ctl_store_tier)r->tier;
    out->blob_bytes = r->blob_bytes;
    out->state_bytes = r->state_bytes;
    out->created_ms = r->created_ms;
    out->used_ms = r->used_ms;
    out->damaged = r->damaged;
    if (want_tokens && r->n_tokens > 0) {
        out->tokens = malloc(4 * (size_t)r->n_tokens);
        if (out->tokens == NULL)
            return wk_diag_set(d, WK_ENOMEM, "store: out of memory for %u token ids",
                               r->n_tokens);
        for (uint32_t i = 0; i < r->n_tokens; i++) {
            const uint8_t *q = r->tok_le + 4 * (size_t)i;
            out->tokens[i] = (int32_t)((uint32_t)q[0] | (uint32_t)q[1] << 8 |
                                       (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24);
        }
    }
    return WK_OK;
}

void
ctl_store_state_fini(ctl_store_state *st)
{
    if (st == NULL)
        return;
    free(st->tokens);
    st->tokens = NULL;
}

void
ctl_store_page_fini(ctl_store_page *page)
{
    if (page == NULL)
        return;
    free(page->items);
    memset(page, 0, sizeof(*page));
}

/* ---- blob reference counts ----------------------------------------------------------- */

/* Adds delta (+1/-1) to the count of blob; *now_zero says the entry went away. */
static wk_err
st_ref_add(st_txn *t, const uint8_t blob[WK_SHA256_LEN], int delta, bool *now_zero, wk_diag *d)
{
    MDB_val k = {WK_SHA256_LEN, (void *)blob}, v;
    uint64_t c = 0;
    int rc = mdb_get(t->txn, t->s->db_refs, &k, &v);
    if (rc == 0) {
        if (v.mv_size != 8)
            return wk_diag_set(d, WK_ECORRUPT, "store: blob reference count is malformed");
        c = wk_le64_get(v.mv_data);
    } else if (rc != MDB_NOTFOUND) {
        return st_mdb_err(t, rc, "reading a blob reference count", d);
    }
    /* a count that would go below zero is clamped: the record goes regardless */
    c = delta < 0 ? (c > 0 ? c - 1 : 0) : c + 1;
    if (now_zero != NULL)
        *now_zero = c == 0;
    if (c == 0) {
        if (rc == 0 && (rc = mdb_del(t->txn, t->s->db_refs, &k, NULL)) != 0)
            return st_mdb_err(t, rc, "dropping a blob reference count", d);
        return WK_OK;
    }
    uint8_t cb[8];
    wk_le64_put(cb, c);
    v.mv_size = 8;
    v.mv_data = cb;
    if ((rc = mdb_put(t->txn, t->s->db_refs, &k, &v, 0)) != 0)
        return st_mdb_err(t, rc, "writing a blob reference count", d);
    return WK_OK;
}

/* A growable list of blobs whose last reference went, to collect after commit. */
typedef struct st_gc_list {
    uint8_t (*h)[WK_SHA256_LEN]; /* heap array of blob hashes */
    size_t n;                    /* entries used */
    size_t cap;                  /* entries allocated */
} st_gc_list;

static wk_err
st_gc_add(st_gc_list *g, const uint8_t h[WK_SHA256_LEN], wk_diag *d)
{
    if (g->n == g->cap) {
        size_t nc = g->cap ? 2 * g->cap : 4;
        void *p = realloc(g->h, nc * sizeof(*g->h));
        if (p == NULL)
            return wk_diag_set(d, WK_ENOMEM, "store: out of memory");
        g->h = p;
        g->cap = nc;
    }
    memcpy(g->h[g->n++], h, WK_SHA256_LEN);
    return WK_OK;
}

/*
 * Unlinks each listed blob whose count is still zero. Failures are ignored:
 * a blob left behind is collected by the next open.
 */
static void
st_gc_run(ctl_store *s, const st_gc_list *g)
{
    MDB_txn *txn;
    if (g->n == 0)
        return;
    pthread_mutex_lock(&s->blob_mu);
    if (st_read_begin(s, &txn, NULL) == WK_OK) {
        for (size_t i = 0; i < g->n; i++) {
            MDB_val k = {WK_SHA256_LEN, (void *)g->h[i]}, v;
            if (mdb_get(txn, s->db_refs, &k, &v) != MDB_NOTFOUND)
                continue;
            char hex[WK_SHA256_HEX_LEN];
            wk_sha256_to_hex(g->h[i], hex);
            (void)unlinkat(s->blob_dirfd, hex, 0);
        }
        st_read_end(s, txn);
    }
    pthread_mutex_unlock(&s->blob_mu);
}

/* ---- blob files ------------------------------------------------------------------------- */

/* Hashes the open file fd; *size receives its length. WK_EIO. */
static wk_err
st_hash_fd(int fd, const char *hex, char out[WK_SHA256_HEX_LEN], uint64_t *size, wk_diag *d)
{
    wk_sha256 h;
    uint64_t total = 0;
    uint8_t dg[WK_SHA256_LEN];
    if (wk_sha256_init(&h) != WK_OK)
        return wk_diag_set(d, WK_ENOMEM, "store: out of memory hashing blob %s", hex);
    uint8_t *buf = malloc(ST_IO_CHUNK);
    if (buf == NULL) {
        wk_sha256_fini(&h);
        return wk_diag_set(d, WK_ENOMEM, "store: out of memory hashing blob %s", hex);
    }
    for (;;) {
        ssize_t n = read(fd, buf, ST_IO_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int err = errno;
            free(buf);
            wk_sha256_fini(&h);
            return st_errno(err, "reading blob", hex, d);
        }
        if (n == 0)
            break;
        wk_sha256_update(&h, buf, (size_t)n);
        total += (uint64_t)n;
    }
    free(buf);
    wk_sha256_final(&h, dg);
    wk_sha256_to_hex(dg, out);
    *size = total;
    return WK_OK;
}

/* Writes all of [data, data + len) to fd through s's write hook; errno on failure. */
static int
st_write_all(ctl_store *s, int fd, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len > 0) {
        size_t chunk = len < ((size_t)1 << 30) ? len : ((size_t)1 << 30);
        ssize_t n = s->write_fn(fd, p, chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno != 0 ? errno : EIO;
        if (n == 0)
            return ENOSPC;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/*
 * Makes <blobs>/<hex> hold data (whose SHA-256 is hex): reuses a file that
 * verifies, else writes a temp file, fsyncs, renames over and fsyncs the
 * directory. On failure nothing new is left behind.
 */
static wk_err
st_blob_write(ctl_store *s, const void *data, size_t len, const char *hex, wk_diag *d)
{
    int fd = openat(s->blob_dirfd, hex, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char got[WK_SHA256_HEX_LEN];
        uint64_t size = 0;
        wk_err e = st_hash_fd(fd, hex, got, &size, NULL);
        close(fd);
        if (e == WK_OK && size == len && strcmp(got, hex) == 0)
            return WK_OK;
        /* a damaged copy: replace it below */
    } else if (errno != ENOENT) {
        return st_errno(errno, "opening blob", hex, d);
    }

    char tmp[WK_SHA256_HEX_LEN + 48];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld.%u", hex, (long)getpid(),
             atomic_fetch_add(&s->tmp_seq, 1u));
    fd = openat(s->blob_dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return st_errno(errno, "creating blob", tmp, d);
    int err = st_write_all(s, fd, data, len);
    const char *what = "writing blob";
    if (err == 0 && fsync(fd) != 0) {
        err = errno;
        what = "syncing blob";
    }
    if (close(fd) != 0 && err == 0) {
        err = errno;
        what = "closing blob";
    }
    if (err == 0 && renameat(s->blob_dirfd, tmp, s->blob_dirfd, hex) != 0) {
        err = errno;
        what = "renaming blob";
    }
    if (err != 0) {
        (void)unlinkat(s->blob_dirfd, tmp, 0);
        return st_errno(err, what, hex, d);
    }
    if (fsync(s->blob_dirfd) != 0)
        return st_errno(errno, "syncing the blob directory for", hex, d);
    return WK_OK;
}

wk_err
ctl_store_blob_put(ctl_store *s, const void *data, size_t len, char hex_out[WK_SHA256_HEX_LEN],
                   wk_diag *d)
{
    char hex[WK_SHA256_HEX_LEN];
    if (s == NULL || hex_out == NULL || (data == NULL && len > 0))
        return wk_diag_set(d, WK_EINVAL, "store: blob put: NULL argument");
    if ((uint64_t)len > CTL_STORE_BLOB_MAX)
        return wk_diag_set(d, WK_ETOOBIG, "store: a blob of %zu bytes is over the limit of %llu",
                           len, (unsigned long long)CTL_STORE_BLOB_MAX);
    wk_sha256_hex(data, len, hex);
    wk_err e = st_blob_write(s, data, len, hex, d);
    if (e != WK_OK)
        return e;
    memcpy(hex_out, hex, WK_SHA256_HEX_LEN);
    return WK_OK;
}

wk_err
ctl_store_blob_get(ctl_store *s, const char *hex, void **data, size_t *len, wk_diag *d)
{
    if (s == NULL || data == NULL || len == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: blob get: NULL argument");
    if (!st_is_hex64(hex))
        return wk_diag_set(d, WK_EINVAL, "store: a blob name must be 64 lowercase hex digits");
    int fd = openat(s->blob_dirfd, hex, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return wk_diag_set(d, WK_ENOENT, "store: blob %s is missing", hex);
        return st_errno(errno, "opening blob", hex, d);
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return st_errno(err, "reading blob", hex, d);
    }
    if ((uint64_t)st.st_size > CTL_STORE_BLOB_MAX) {
        close(fd);
        return wk_diag_set(d, WK_ECORRUPT, "store: blob %s is %lld bytes, over the limit", hex,
                           (long long)st.st_size);
    }
    size_t n = (size_t)st.st_size, got = 0;
    uint8_t *buf = malloc(n > 0 ? n : 1);
    if (buf == NULL) {
        close(fd);
        return wk_diag_set(d, WK_ENOMEM, "store: out of memory for blob %s (%zu bytes)", hex, n);
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int err = errno;
            free(buf);
            close(fd);
            return st_errno(err, "reading blob", hex, d);
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    char sum[WK_SHA256_HEX_LEN];
    wk_sha256_hex(buf, got, sum);
    if (got != n || strcmp(sum, hex) != 0) {
        free(buf);
        return wk_diag_set(d, WK_ECORRUPT,
                           "store: blob %s failed verification (%zu bytes hash to %s)", hex, got,
                           sum);
    }
    *data = buf;
    *len = got;
    return WK_OK;
}

/*
 * Under blob_mu: makes sure the blob file of hex exists before a reference
 * to it commits, rewriting it from data when given. *size gets its length.
 */
static wk_err
st_blob_ensure_locked(ctl_store *s, const char *hex, const void *data, size_t len,
                      uint64_t *size, wk_diag *d)
{
    struct stat st;
    if (fstatat(s->blob_dirfd, hex, &st, 0) == 0) {
        *size = (uint64_t)st.st_size;
        return WK_OK;
    }
    if (errno != ENOENT)
        return st_errno(errno, "checking blob", hex, d);
    if (data == NULL)
        return wk_diag_set(d, WK_ENOENT, "store: blob %s is not in the store (put it first)", hex);
    wk_err e = st_blob_write(s, data, len, hex, d);
    if (e == WK_OK)
        *size = len;
    return e;
}

/* ---- state operations ----------------------------------------------------------------- */

/* Validates the public input of a put into r (pointing into in). */
static wk_err
st_rec_from_input(const ctl_store_state *in, st_rec *r, wk_diag *d)
{
    wk_err e;
    memset(r, 0, sizeof(*r));
    if ((e = ctl_store_owner_check(in->owner, d)) != WK_OK ||
        (e = ctl_store_name_check(in->name, d)) != WK_OK ||
        (e = st_family_check(in->family, d)) != WK_OK)
        return e;
    if (!st_is_hex64(in->fingerprint))
        return wk_diag_set(d, WK_EINVAL, "model fingerprint must be 64 lowercase hex digits");
    if (in->n_tokens > CTL_STORE_MAX_TOKENS)
        return wk_diag_set(d, WK_ETOOBIG, "%zu tokens is over the limit of %zu", in->n_tokens,
                           CTL_STORE_MAX_TOKENS);
    if (in->n_tokens > 0 && in->tokens == NULL)
        return wk_diag_set(d, WK_EINVAL, "%zu tokens but no token array", in->n_tokens);
    for (size_t i = 0; i < in->n_tokens; i++)
        if (in->tokens[i] < 0)
            return wk_diag_set(d, WK_EINVAL, "token %zu is negative (%d)", i, (int)in->tokens[i]);
    size_t pl = strnlen(in->parent, sizeof(in->parent));
    if (pl > 0) {
        char pn[CTL_STORE_NAME_MAX + 1];
        uint64_t pv;
        if (pl > CTL_STORE_ID_MAX || ctl_store_id_parse(in->parent, pn, &pv, NULL) != WK_OK ||
            pv == 0)
            return wk_diag_set(d, WK_EINVAL, "parent must be \"\" or a state id 'name@version'");
    }
    if ((unsigned)in->op >= ST_N_OPS)
        return wk_diag_set(d, WK_EINVAL, "operation %d is unknown", (int)in->op);
    if ((unsigned)in->tier >= ST_N_TIERS)
        return wk_diag_set(d, WK_EINVAL, "tier %d is unknown", (int)in->tier);
    char td[WK_SHA256_HEX_LEN];
    if (wk_sha256_token_ids_hex(in->tokens, in->n_tokens, td) != WK_OK)
        return wk_diag_set(d, WK_ENOMEM, "out of memory hashing token ids");
    if (in->token_digest[0] != '\0' && strncmp(in->token_digest, td, sizeof(td)) != 0)
        return wk_diag_set(d, WK_EINVAL, "token digest does not match the token ids");
    r->owner = in->owner;
    r->owner_len = strlen(in->owner);
    r->name = in->name;
    r->name_len = strlen(in->name);
    r->family = in->family;
    r->family_len = strlen(in->family);
    r->parent = in->parent;
    r->parent_len = pl;
    st_hex_to_raw(in->fingerprint, r->fp);
    st_hex_to_raw(td, r->td);
    r->tier = (uint8_t)in->tier;
    r->op = (uint8_t)in->op;
    r->damaged = in->damaged;
    int64_t now = st_now_ms();
    r->created_ms = in->created_ms != 0 ? in->created_ms : now;
    r->used_ms = in->used_ms != 0 ? in->used_ms : now;
    r->state_bytes = in->state_bytes;
    r->tok = in->tokens;
    r->n_tokens = (uint32_t)in->n_tokens;
    return WK_OK;
}

/* Appends r as the next version of its (owner, name); r->version is set. */
static wk_err
st_append(st_txn *t, st_rec *r, wk_diag *d)
{
    char owner[CTL_STORE_OWNER_MAX + 1], name[CTL_STORE_NAME_MAX + 1];
    memcpy(owner, r->owner, r->owner_len);
    owner[r->owner_len] = '\0';
    memcpy(name, r->name, r->name_len);
    name[r->name_len] = '\0';
    st_key nk, sk;
    st_key_name(&nk, owner, name);
    MDB_val k = {nk.n, nk.b}, v;
    uint64_t next = 1;
    int rc = mdb_get(t->txn, t->s->db_names, &k, &v);
    if (rc == 0) {
        if (v.mv_size != 8)
            return wk_diag_set(d, WK_ECORRUPT, "store: version counter of %s is malformed", name);
        next = wk_le64_get(v.mv_data);
    } else if (rc != MDB_NOTFOUND) {
        return st_mdb_err(t, rc, "reading a version counter", d);
    }
    r->version = next;
    size_t len;
    uint8_t *enc = st_rec_encode(r, &len);
    if (enc == NULL)
        return wk_diag_set(d, WK_ENOMEM, "store: out of memory encoding a record");
    uint8_t nb[8];
    wk_le64_put(nb, next + 1);
    v.mv_size = 8;
    v.mv_data = nb;
    if ((rc = mdb_put(t->txn, t->s->db_names, &k, &v, 0)) != 0) {
        free(enc);
        return st_mdb_err(t, rc, "writing a version counter", d);
    }
    st_key_state(&sk, owner, name, next);
    MDB_val k2 = {sk.n, sk.b}, v2 = {len, enc};
    rc = mdb_put(t->txn, t->s->db_states, &k2, &v2, MDB_NOOVERWRITE);
    free(enc);
    if (rc == MDB_KEYEXIST)
        return wk_diag_set(d, WK_ECORRUPT, "store: %s@%llu exists above its version counter",
                           name, (unsigned long long)next);
    if (rc != 0)
        return st_mdb_err(t, rc, "writing a state record", d);
    if (r->has_blob)
        return st_ref_add(t, r->blob, +1, NULL, d);
    return WK_OK;
}

/* Argument of st_put_op. */
typedef struct st_put_arg {
    st_rec *r;        /* the record to append */
    uint64_t version; /* out: assigned version */
} st_put_arg;

static wk_err
st_put_op(st_txn *t, void *arg, wk_diag *d)
{
    st_put_arg *a = arg;
    wk_err e = st_append(t, a->r, d);
    if (e == WK_OK)
        a->version = a->r->version;
    return e;
}

wk_err
ctl_store_state_put(ctl_store *s, const ctl_store_state *in, const void *blob_data,
                    size_t blob_len, uint64_t *version_out, wk_diag *d)
{
    st_rec r;
    wk_err e;
    char hex[WK_SHA256_HEX_LEN] = "";

    if (s == NULL || in == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: state put: NULL argument");
    if ((e = st_rec_from_input(in, &r, d)) != WK_OK)
        return e;
    if (blob_data != NULL) {
        if ((uint64_t)blob_len > CTL_STORE_BLOB_MAX)
            return wk_diag_set(d, WK_ETOOBIG, "a blob of %zu bytes is over the limit of %llu",
                               blob_len, (unsigned long long)CTL_STORE_BLOB_MAX);
        wk_sha256_hex(blob_data, blob_len, hex);
        if (in->blob[0] != '\0' && strncmp(in->blob, hex, sizeof(hex)) != 0)
            return wk_diag_set(d, WK_EINVAL, "blob %.64s does not match the blob bytes (%s)",
                               in->blob, hex);
        if ((e = st_blob_write(s, blob_data, blob_len, hex, d)) != WK_OK)
            return e;
    } else if (in->blob[0] != '\0') {
        if (!st_is_hex64(in->blob))
            return wk_diag_set(d, WK_EINVAL, "blob must be \"\" or 64 lowercase hex digits");
        memcpy(hex, in->blob, sizeof(hex));
    }
    if (hex[0] == '\0' && in->tier == CTL_STORE_TIER_COLD)
        return wk_diag_set(d, WK_EINVAL, "a cold state needs a blob");

    st_put_arg a = {&r, 0};
    if (hex[0] == '\0') {
        e = st_write(s, st_put_op, &a, d);
    } else {
        uint64_t size = 0;
        pthread_mutex_lock(&s->blob_mu);
        e = st_blob_ensure_locked(s, hex, blob_data, blob_len, &size, d);
        if (e == WK_OK && blob_data == NULL && in->blob_bytes != 0 && in->blob_bytes != size)
            e = wk_diag_set(d, WK_EINVAL, "blob_bytes %llu disagrees with blob %s (%llu bytes)",
                            (unsigned long long)in->blob_bytes, hex, (unsigned long long)size);
        if (e == WK_OK) {
            r.has_blob = true;
            st_hex_to_raw(hex, r.blob);
            r.blob_bytes = size;
            e = st_write(s, st_put_op, &a, d);
        }
        pthread_mutex_unlock(&s->blob_mu);
    }
    if (e != WK_OK && blob_data != NULL) {
        /* collect the blob just written unless something else references it */
        st_gc_list g = {NULL, 0, 0};
        uint8_t raw[WK_SHA256_LEN];
        st_hex_to_raw(hex, raw);
        if (st_gc_add(&g, raw, NULL) == WK_OK)
            st_gc_run(s, &g);
        free(g.h);
    }
    if (e == WK_OK && version_out != NULL)
        *version_out = a.version;
    return e;
}

/* Parses and checks owner and ref; *version is 0 for "latest". */
static wk_err
st_ref_args(const char *owner, const char *ref, char name[CTL_STORE_NAME_MAX + 1],
            uint64_t *version, wk_diag *d)
{
    wk_err e = ctl_store_owner_check(owner, d);
    if (e != WK_OK)
        return e;
    return ctl_store_id_parse(ref, name, version, d);
}

/*
 * Finds the record of (owner, name, version), or the newest version present
 * when version is 0. *val points into LMDB (valid until the next write or the
 * end of txn); *ver_out gets the version. WK_ENOENT when absent.
 */
static wk_err
st_lookup(ctl_store *s, MDB_txn *txn, st_txn *t, const char *owner, const char *name,
          uint64_t version, MDB_val *val, uint64_t *ver_out, wk_diag *d)
{
    st_key k;
    int rc;
    if (version != 0) {
        st_key_state(&k, owner, name, version);
        MDB_val mk = {k.n, k.b};
        rc = mdb_get(txn, s->db_states, &mk, val);
        if (rc == MDB_NOTFOUND)
            return wk_diag_set(d, WK_ENOENT, "no state '%s@%llu'", name,
                               (unsigned long long)version);
        if (rc != 0)
            return st_mdb_err(t, rc, "reading a state record", d);
        *ver_out = version;
        return WK_OK;
    }
    MDB_cursor *c;
    if ((rc = mdb_cursor_open(txn, s->db_states, &c)) != 0)
        return st_mdb_err(t, rc, "opening a cursor", d);
    st_key_name(&k, owner, name);
    size_t plen = k.n;
    memset(k.b + k.n, 0xff, 8);
    MDB_val mk = {k.n + 8, k.b};
    rc = mdb_cursor_get(c, &mk, val, MDB_SET_RANGE);
    if (rc == 0)
        rc = mdb_cursor_get(c, &mk, val, MDB_PREV);
    else if (rc == MDB_NOTFOUND)
        rc = mdb_cursor_get(c, &mk, val, MDB_LAST);
    mdb_cursor_close(c);
    if (rc != 0 && rc != MDB_NOTFOUND)
        return st_mdb_err(t, rc, "reading a state record", d);
    if (rc == MDB_NOTFOUND || mk.mv_size != plen + 8 || !st_has_prefix(&mk, k.b, plen))
        return wk_diag_set(d, WK_ENOENT, "no state '%s'", name);
    *ver_out = wk_be64_get((const uint8_t *)mk.mv_data + plen);
    return WK_OK;
}

wk_err
ctl_store_state_get(ctl_store *s, const char *owner, const char *ref, ctl_store_state *out,
                    wk_diag *d)
{
    char name[CTL_STORE_NAME_MAX + 1];
    uint64_t version, ver;
    MDB_txn *txn;
    MDB_val v;
    st_rec r;
    ctl_store_state tmp;
    wk_err e;

    if (s == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: state get: NULL argument");
    if ((e = st_ref_args(owner, ref, name, &version, d)) != WK_OK)
        return e;
    if ((e = st_read_begin(s, &txn, d)) != WK_OK)
        return e;
    e = st_lookup(s, txn, NULL, owner, name, version, &v, &ver, d);
    if (e == WK_OK)
        e = st_rec_decode(v.mv_data, v.mv_size, &r, d);
    if (e == WK_OK)
        e = st_rec_export(&r, true, &tmp, d);
    st_read_end(s, txn);
    if (e == WK_OK)
        *out = tmp;
    return e;
}

/* Writes the hex of key bytes into a cursor buffer. */
static void
st_cursor_encode(const MDB_val *k, char out[CTL_STORE_CURSOR_MAX])
{
    static const char hx[] = "0123456789abcdef";
    const uint8_t *b = k->mv_data;
    size_t n = k->mv_size < ST_KEY_MAX ? k->mv_size : ST_KEY_MAX;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[b[i] >> 4];
        out[2 * i + 1] = hx[b[i] & 15];
    }
    out[2 * n] = '\0';
}

/* Decodes a cursor into key bytes, which must start with prefix. */
static wk_err
st_cursor_decode(const char *cur, const uint8_t *prefix, size_t plen, st_key *k, wk_diag *d)
{
    size_t n = strnlen(cur, CTL_STORE_CURSOR_MAX);
    if (n == 0 || n % 2 != 0 || n / 2 > ST_KEY_MAX)
        return wk_diag_set(d, WK_EINVAL, "malformed list cursor");
    if (!wk_hex_decode_lower(cur, n / 2, k->b))
        return wk_diag_set(d, WK_EINVAL, "malformed list cursor");
    k->n = n / 2;
    if (k->n <= plen || memcmp(k->b, prefix, plen) != 0)
        return wk_diag_set(d, WK_EINVAL, "list cursor does not belong to this listing");
    return WK_OK;
}

/* Lists the states whose keys start with prefix (plen may be 0: every state). */
static wk_err
st_list_prefix(ctl_store *s, const uint8_t *prefix, size_t plen, const char *cursor, size_t limit,
               ctl_store_page *page, wk_diag *d)
{
    st_key ck;
    MDB_txn *txn;
    MDB_cursor *c;
    MDB_val k, v;
    wk_err e = WK_OK;
    int rc;
    bool has_cursor = cursor != NULL && cursor[0] != '\0';

    if (page == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: list: NULL page");
    if (limit == 0)
        limit = CTL_STORE_PAGE_DEFAULT;
    if (limit > CTL_STORE_PAGE_MAX)
        limit = CTL_STORE_PAGE_MAX;
    if (has_cursor && (e = st_cursor_decode(cursor, prefix, plen, &ck, d)) != WK_OK)
        return e;
    ctl_store_state *items = calloc(limit, sizeof(*items));
    if (items == NULL)
        return wk_diag_set(d, WK_ENOMEM, "store: out of memory for a page of %zu", limit);
    if ((e = st_read_begin(s, &txn, d)) != WK_OK) {
        free(items);
        return e;
    }
    size_t n = 0;
    char next[CTL_STORE_CURSOR_MAX] = "";
    if ((rc = mdb_cursor_open(txn, s->db_states, &c)) != 0) {
        e = st_mdb_err(NULL, rc, "opening a cursor", d);
        goto out;
    }
    if (has_cursor) {
        k.mv_size = ck.n;
        k.mv_data = ck.b;
        rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
        if (rc == 0 && k.mv_size == ck.n && memcmp(k.mv_data, ck.b, ck.n) == 0)
            rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
    } else if (plen > 0) {
        k.mv_size = plen;
        k.mv_data = (void *)prefix;
        rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
    } else {
        rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
    }
    MDB_val last = {0, NULL};
    while (rc == 0 && st_has_prefix(&k, prefix, plen)) {
        if (n == limit) {
            st_cursor_encode(&last, next);
            break;
        }
        st_rec r;
        if ((e = st_rec_decode(v.mv_data, v.mv_size, &r, d)) != WK_OK ||
            (e = st_rec_export(&r, false, &items[n], d)) != WK_OK)
            break;
        n++;
        last = k;
        rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
    }
    if (e == WK_OK && rc != 0 && rc != MDB_NOTFOUND)
        e = st_mdb_err(NULL, rc, "listing states", d);
    mdb_cursor_close(c);
out:
    st_read_end(s, txn);
    if (e != WK_OK) {
        free(items);
        return e;
    }
    page->items = items;
    page->n = n;
    memcpy(page->next, next, sizeof(page->next));
    return WK_OK;
}

wk_err
ctl_store_state_list(ctl_store *s, const char *owner, const char *cursor, size_t limit,
                     ctl_store_page *page, wk_diag *d)
{
    st_key p = {{0}, 0};
    if (s == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: list: NULL store");
    if (owner != NULL) {
        wk_err e = ctl_store_owner_check(owner, d);
        if (e != WK_OK)
            return e;
        st_key_owner(&p, owner);
    }
    return st_list_prefix(s, p.b, p.n, cursor, limit, page, d);
}

wk_err
ctl_store_state_versions(ctl_store *s, const char *owner, const char *name, const char *cursor,
                         size_t limit, ctl_store_page *page, wk_diag *d)
{
    st_key p;
    wk_err e;
    if (s == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: versions: NULL store");
    if ((e = ctl_store_owner_check(owner, d)) != WK_OK ||
        (e = ctl_store_name_check(name, d)) != WK_OK)
        return e;
    st_key_name(&p, owner, name);
    return st_list_prefix(s, p.b, p.n, cursor, limit, page, d);
}

wk_err
ctl_store_state_count(ctl_store *s, const char *owner, uint64_t *n, wk_diag *d)
{
    st_key p;
    MDB_txn *txn;
    MDB_cursor *c;
    MDB_val k, v;
    wk_err e;
    if (s == NULL || n == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: count: NULL argument");
    if ((e = ctl_store_owner_check(owner, d)) != WK_OK)
        return e;
    st_key_owner(&p, owner);
    if ((e = st_read_begin(s, &txn, d)) != WK_OK)
        return e;
    uint64_t cnt = 0;
    int rc = mdb_cursor_open(txn, s->db_states, &c);
    if (rc == 0) {
        k.mv_size = p.n;
        k.mv_data = p.b;
        for (rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
             rc == 0 && st_has_prefix(&k, p.b, p.n); rc = mdb_cursor_get(c, &k, &v, MDB_NEXT))
            cnt++;
        mdb_cursor_close(c);
    }
    if (rc != 0 && rc != MDB_NOTFOUND)
        e = st_mdb_err(NULL, rc, "counting states", d);
    st_read_end(s, txn);
    if (e == WK_OK)
        *n = cnt;
    return e;
}

/* Copies an LMDB value to the heap so that later writes in the txn cannot move it. */
static void *
st_dup_val(const MDB_val *v)
{
    void *p = malloc(v->mv_size > 0 ? v->mv_size : 1);
    if (p != NULL)
        memcpy(p, v->mv_data, v->mv_size);
    return p;
}

/* Argument of st_update_op. */
typedef struct st_upd_arg {
    const char *owner;           /* owner */
    const char *name;            /* name */
    uint64_t version;            /* version, 0 = latest */
    const ctl_store_update *u;   /* the change */
    bool new_blob;               /* with SET_BLOB: a blob is set (else dropped) */
    uint8_t blob[WK_SHA256_LEN]; /* with new_blob: its hash */
    uint64_t blob_bytes;         /* with new_blob: its size */
    st_gc_list gc;               /* out: blobs whose last reference went */
} st_upd_arg;

static wk_err
st_update_op(st_txn *t, void *arg, wk_diag *d)
{
    st_upd_arg *a = arg;
    const ctl_store_update *u = a->u;
    MDB_val v;
    uint64_t ver;
    st_rec r;
    bool zero;
    wk_err e;

    a->gc.n = 0;
    if ((e = st_lookup(t->s, t->txn, t, a->owner, a->name, a->version, &v, &ver, d)) != WK_OK)
        return e;
    uint8_t *copy = st_dup_val(&v);
    if (copy == NULL)
        return wk_diag_set(d, WK_ENOMEM, "store: out of memory");
    if ((e = st_rec_decode(copy, v.mv_size, &r, d)) != WK_OK)
        goto out;
    if (u->set & CTL_STORE_SET_TIER)
        r.tier = (uint8_t)u->tier;
    if (u->set & CTL_STORE_SET_USED)
        r.used_ms = u->used_ms;
    if (u->set & CTL_STORE_SET_DAMAGED)
        r.damaged = u->damaged;
    if (u->set & CTL_STORE_SET_BLOB) {
        bool same = r.has_blob == a->new_blob &&
                    (!a->new_blob || memcmp(r.blob, a->blob, WK_SHA256_LEN) == 0);
        if (!same) {
            if (a->new_blob && (e = st_ref_add(t, a->blob, +1, NULL, d)) != WK_OK)
                goto out;
            if (r.has_blob) {
                if ((e = st_ref_add(t, r.blob, -1, &zero, d)) != WK_OK)
                    goto out;
                if (zero && (e = st_gc_add(&a->gc, r.blob, d)) != WK_OK)
                    goto out;
            }
        }
        r.has_blob = a->new_blob;
        if (a->new_blob)
            memcpy(r.blob, a->blob, WK_SHA256_LEN);
        r.blob_bytes = a->new_blob ? a->blob_bytes : 0;
    }
    if (r.tier == CTL_STORE_TIER_COLD && !r.has_blob) {
        e = wk_diag_set(d, WK_EINVAL, "a cold state needs a blob");
        goto out;
    }
    size_t len;
    uint8_t *enc = st_rec_encode(&r, &len);
    if (enc == NULL) {
        e = wk_diag_set(d, WK_ENOMEM, "store: out of memory encoding a record");
        goto out;
    }
    st_key k;
    st_key_state(&k, a->owner, a->name, ver);
    MDB_val mk = {k.n, k.b}, mv = {len, enc};
    int rc = mdb_put(t->txn, t->s->db_states, &mk, &mv, 0);
    free(enc);
    if (rc != 0)
        e = st_mdb_err(t, rc, "writing a state record", d);
out:
    free(copy);
    return e;
}

wk_err
ctl_store_state_update(ctl_store *s, const char *owner, const char *ref,
                       const ctl_store_update *u, wk_diag *d)
{
    char name[CTL_STORE_NAME_MAX + 1], hex[WK_SHA256_HEX_LEN] = "";
    st_upd_arg a;
    wk_err e;

    if (s == NULL || u == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: update: NULL argument");
    memset(&a, 0, sizeof(a));
    if ((e = st_ref_args(owner, ref, name, &a.version, d)) != WK_OK)
        return e;
    if ((u->set & ~(unsigned)(CTL_STORE_SET_TIER | CTL_STORE_SET_BLOB | CTL_STORE_SET_USED |
                              CTL_STORE_SET_DAMAGED)) != 0)
        return wk_diag_set(d, WK_EINVAL, "update: unknown field bits 0x%x", u->set);
    if ((u->set & CTL_STORE_SET_TIER) && (unsigned)u->tier >= ST_N_TIERS)
        return wk_diag_set(d, WK_EINVAL, "tier %d is unknown", (int)u->tier);
    a.owner = owner;
    a.name = name;
    a.u = u;
    if (u->set & CTL_STORE_SET_BLOB) {
        if (u->blob_data != NULL) {
            if ((uint64_t)u->blob_len > CTL_STORE_BLOB_MAX)
                return wk_diag_set(d, WK_ETOOBIG, "a blob of %zu bytes is over the limit of %llu",
                                   u->blob_len, (unsigned long long)CTL_STORE_BLOB_MAX);
            wk_sha256_hex(u->blob_data, u->blob_len, hex);
            if ((e = st_blob_write(s, u->blob_data, u->blob_len, hex, d)) != WK_OK)
                return e;
        } else if (u->blob != NULL && u->blob[0] != '\0') {
            if (!st_is_hex64(u->blob))
                return wk_diag_set(d, WK_EINVAL, "blob must be \"\" or 64 lowercase hex digits");
            memcpy(hex, u->blob, sizeof(hex));
        }
        a.new_blob = hex[0] != '\0';
    }
    if (a.new_blob) {
        pthread_mutex_lock(&s->blob_mu);
        e = st_blob_ensure_locked(s, hex, u->blob_data, u->blob_len, &a.blob_bytes, d);
        if (e == WK_OK) {
            st_hex_to_raw(hex, a.blob);
            e = st_write(s, st_update_op, &a, d);
        }
        pthread_mutex_unlock(&s->blob_mu);
    } else {
        e = st_write(s, st_update_op, &a, d);
    }
    if (e != WK_OK) {
        /* nothing committed: only the blob this call wrote may need collecting */
        a.gc.n = 0;
        uint8_t raw[WK_SHA256_LEN];
        if (u->blob_data != NULL && hex[0] != '\0') {
            st_hex_to_raw(hex, raw);
            (void)st_gc_add(&a.gc, raw, NULL);
        }
    }
    st_gc_run(s, &a.gc);
    free(a.gc.h);
    return e;
}

/* Argument of st_delete_op. */
typedef struct st_del_arg {
    const char *owner; /* owner */
    const char *name;  /* name */
    uint64_t version;  /* version, 0 = every version */
    uint64_t n;        /* out: versions removed */
    st_gc_list gc;     /* out: blobs whose last reference went */
} st_del_arg;

/* Deletes the record at key (present), dropping its blob reference. */
static wk_err
st_delete_one(st_txn *t, MDB_val *k, st_del_arg *a, wk_diag *d)
{
    MDB_val v;
    st_rec r;
    bool has_blob = false, zero;
    uint8_t blob[WK_SHA256_LEN];
    int rc = mdb_get(t->txn, t->s->db_states, k, &v);
    if (rc != 0)
        return st_mdb_err(t, rc, "reading a state record", d);
    /* a record that does not decode is still deleted; its blob is left to verify() */
    if (st_rec_decode(v.mv_data, v.mv_size, &r, NULL) == WK_OK && r.has_blob) {
        has_blob = true;
        memcpy(blob, r.blob, WK_SHA256_LEN);
    }
    if ((rc = mdb_del(t->txn, t->s->db_states, k, NULL)) != 0)
        return st_mdb_err(t, rc, "deleting a state record", d);
    a->n++;
    if (!has_blob)
        return WK_OK;
    wk_err e = st_ref_add(t, blob, -1, &zero, d);
    if (e == WK_OK && zero)
        e = st_gc_add(&a->gc, blob, d);
    return e;
}

static wk_err
st_delete_op(st_txn *t, void *arg, wk_diag *d)
{
    st_del_arg *a = arg;
    st_key k;
    wk_err e = WK_OK;
    a->n = 0;
    a->gc.n = 0;
    if (a->version != 0) {
        st_key_state(&k, a->owner, a->name, a->version);
        MDB_val mk = {k.n, k.b}, v;
        int rc = mdb_get(t->txn, t->s->db_states, &mk, &v);
        if (rc == MDB_NOTFOUND)
            return wk_diag_set(d, WK_ENOENT, "no state '%s@%llu'", a->name,
                               (unsigned long long)a->version);
        if (rc != 0)
            return st_mdb_err(t, rc, "reading a state record", d);
        return st_delete_one(t, &mk, a, d);
    }
    /* every version: collect the keys first, then delete them one by one */
    st_key_name(&k, a->owner, a->name);
    uint64_t *vers = NULL;
    size_t nv = 0, cap = 0;
    MDB_cursor *c;
    MDB_val mk = {k.n, k.b}, v;
    int rc = mdb_cursor_open(t->txn, t->s->db_states, &c);
    if (rc != 0)
        return st_mdb_err(t, rc, "opening a cursor", d);
    for (rc = mdb_cursor_get(c, &mk, &v, MDB_SET_RANGE); rc == 0 && st_has_prefix(&mk, k.b, k.n);
         rc = mdb_cursor_get(c, &mk, &v, MDB_NEXT)) {
        if (mk.mv_size != k.n + 8)
            continue;
        if (nv == cap) {
            size_t nc = cap ? 2 * cap : 16;
            uint64_t *p = realloc(vers, nc * sizeof(*vers));
            if (p == NULL) {
                e = wk_diag_set(d, WK_ENOMEM, "store: out of memory");
                break;
            }
            vers = p;
            cap = nc;
        }
        vers[nv++] = wk_be64_get((const uint8_t *)mk.mv_data + k.n);
    }
    mdb_cursor_close(c);
    if (e == WK_OK && rc != 0 && rc != MDB_NOTFOUND)
        e = st_mdb_err(t, rc, "listing versions", d);
    if (e == WK_OK && nv == 0)
        e = wk_diag_set(d, WK_ENOENT, "no state '%s'", a->name);
    for (size_t i = 0; e == WK_OK && i < nv; i++) {
        st_key sk;
        st_key_state(&sk, a->owner, a->name, vers[i]);
        MDB_val skv = {sk.n, sk.b};
        e = st_delete_one(t, &skv, a, d);
    }
    free(vers);
    return e;
}

wk_err
ctl_store_state_delete(ctl_store *s, const char *owner, const char *ref, uint64_t *n_deleted,
                       wk_diag *d)
{
    char name[CTL_STORE_NAME_MAX + 1];
    st_del_arg a;
    wk_err e;
    if (s == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: delete: NULL store");
    memset(&a, 0, sizeof(a));
    if ((e = st_ref_args(owner, ref, name, &a.version, d)) != WK_OK)
        return e;
    a.owner = owner;
    a.name = name;
    e = st_write(s, st_delete_op, &a, d);
    if (e == WK_OK) {
        st_gc_run(s, &a.gc);
        if (n_deleted != NULL)
            *n_deleted = a.n;
    }
    free(a.gc.h);
    return e;
}

/* Argument of st_rollback_op. */
typedef struct st_rb_arg {
    const char *owner;    /* owner */
    const char *name;     /* name */
    uint64_t version;     /* source version, 0 = latest */
    int64_t now_ms;       /* time stamp of the new version */
    uint64_t new_version; /* out: the version appended */
} st_rb_arg;

static wk_err
st_rollback_op(st_txn *t, void *arg, wk_diag *d)
{
    st_rb_arg *a = arg;
    MDB_val v;
    uint64_t ver;
    st_rec r;
    wk_err e;
    if ((e = st_lookup(t->s, t->txn, t, a->owner, a->name, a->version, &v, &ver, d)) != WK_OK)
        return e;
    uint8_t *copy = st_dup_val(&v);
    if (copy == NULL)
        return wk_diag_set(d, WK_ENOMEM, "store: out of memory");
    if ((e = st_rec_decode(copy, v.mv_size, &r, d)) != WK_OK)
        goto out;
    char parent[CTL_STORE_ID_MAX + 1], hex[WK_SHA256_HEX_LEN];
    snprintf(parent, sizeof(parent), "%s@%llu", a->name, (unsigned long long)ver);
    if (!r.has_blob) {
        e = wk_diag_set(d, WK_ESTATE, "state '%s' has no stored blob to roll back to", parent);
        goto out;
    }
    if (r.damaged) {
        e = wk_diag_set(d, WK_ESTATE, "state '%s' is damaged", parent);
        goto out;
    }
    wk_sha256_to_hex(r.blob, hex);
    struct stat st;
    if (fstatat(t->s->blob_dirfd, hex, &st, 0) != 0) {
        e = wk_diag_set(d, WK_ESTATE, "state '%s' has lost its blob", parent);
        goto out;
    }
    r.parent = parent;
    r.parent_len = strlen(parent);
    r.op = CTL_STORE_OP_ROLLBACK;
    r.tier = CTL_STORE_TIER_COLD;
    r.created_ms = a->now_ms;
    r.used_ms = a->now_ms;
    r.damaged = false;
    if ((e = st_append(t, &r, d)) == WK_OK)
        a->new_version = r.version;
out:
    free(copy);
    return e;
}

wk_err
ctl_store_state_rollback(ctl_store *s, const char *owner, const char *ref, int64_t now_ms,
                         uint64_t *version_out, wk_diag *d)
{
    char name[CTL_STORE_NAME_MAX + 1];
    st_rb_arg a;
    wk_err e;
    if (s == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: rollback: NULL store");
    memset(&a, 0, sizeof(a));
    if ((e = st_ref_args(owner, ref, name, &a.version, d)) != WK_OK)
        return e;
    a.owner = owner;
    a.name = name;
    a.now_ms = now_ms != 0 ? now_ms : st_now_ms();
    e = st_write(s, st_rollback_op, &a, d);
    if (e == WK_OK && version_out != NULL)
        *version_out = a.new_version;
    return e;
}

/* ---- sessions ------------------------------------------------------------------------ */

static wk_err
st_session_key(const char *key, size_t *len, wk_diag *d)
{
    if (key == NULL)
        return wk_diag_set(d, WK_EINVAL, "session key is NULL");
    size_t n = strnlen(key, CTL_STORE_SESSION_KEY_MAX + 1);
    if (n == 0 || n > CTL_STORE_SESSION_KEY_MAX)
        return wk_diag_set(d, WK_EINVAL, "session key must be 1..%u bytes",
                           CTL_STORE_SESSION_KEY_MAX);
    *len = n;
    return WK_OK;
}

/* Argument of the session put/delete operations. */
typedef struct st_kv_arg {
    const char *key;  /* key */
    size_t key_len;   /* bytes of key */
    const void *val;  /* value (put) */
    size_t len;       /* bytes of val */
} st_kv_arg;

static wk_err
st_session_put_op(st_txn *t, void *arg, wk_diag *d)
{
    st_kv_arg *a = arg;
    MDB_val k = {a->key_len, (void *)a->key}, v = {a->len, (void *)a->val};
    int rc = mdb_put(t->txn, t->s->db_sessions, &k, &v, 0);
    return rc == 0 ? WK_OK : st_mdb_err(t, rc, "writing a session", d);
}

static wk_err
st_session_del_op(st_txn *t, void *arg, wk_diag *d)
{
    st_kv_arg *a = arg;
    MDB_val k = {a->key_len, (void *)a->key};
    int rc = mdb_del(t->txn, t->s->db_sessions, &k, NULL);
    if (rc == MDB_NOTFOUND)
        return wk_diag_set(d, WK_ENOENT, "no session '%.64s'", a->key);
    return rc == 0 ? WK_OK : st_mdb_err(t, rc, "deleting a session", d);
}

wk_err
ctl_store_session_put(ctl_store *s, const char *key, const void *val, size_t len, wk_diag *d)
{
    st_kv_arg a = {key, 0, val, len};
    wk_err e;
    if (s == NULL || (val == NULL && len > 0))
        return wk_diag_set(d, WK_EINVAL, "store: session put: NULL argument");
    if ((e = st_session_key(key, &a.key_len, d)) != WK_OK)
        return e;
    if (len > CTL_STORE_SESSION_VALUE_MAX)
        return wk_diag_set(d, WK_ETOOBIG, "a session value of %zu bytes is over the limit of %zu",
                           len, CTL_STORE_SESSION_VALUE_MAX);
    if (a.val == NULL)
        a.val = "";
    return st_write(s, st_session_put_op, &a, d);
}

wk_err
ctl_store_session_get(ctl_store *s, const char *key, void **val, size_t *len, wk_diag *d)
{
    size_t kl;
    MDB_txn *txn;
    wk_err e;
    if (s == NULL || val == NULL || len == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: session get: NULL argument");
    if ((e = st_session_key(key, &kl, d)) != WK_OK)
        return e;
    if ((e = st_read_begin(s, &txn, d)) != WK_OK)
        return e;
    MDB_val k = {kl, (void *)key}, v;
    void *copy = NULL;
    int rc = mdb_get(txn, s->db_sessions, &k, &v);
    if (rc == MDB_NOTFOUND)
        e = wk_diag_set(d, WK_ENOENT, "no session '%.64s'", key);
    else if (rc != 0)
        e = st_mdb_err(NULL, rc, "reading a session", d);
    else if ((copy = st_dup_val(&v)) == NULL)
        e = wk_diag_set(d, WK_ENOMEM, "store: out of memory for a %zu-byte session", v.mv_size);
    st_read_end(s, txn);
    if (e == WK_OK) {
        *val = copy;
        *len = v.mv_size;
    }
    return e;
}

wk_err
ctl_store_session_delete(ctl_store *s, const char *key, wk_diag *d)
{
    st_kv_arg a = {key, 0, NULL, 0};
    wk_err e;
    if (s == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: session delete: NULL store");
    if ((e = st_session_key(key, &a.key_len, d)) != WK_OK)
        return e;
    return st_write(s, st_session_del_op, &a, d);
}

void
ctl_store_kv_page_fini(ctl_store_kv_page *page)
{
    if (page == NULL)
        return;
    for (size_t i = 0; i < page->n; i++) {
        free(page->items[i].key);
        free(page->items[i].val);
    }
    free(page->items);
    memset(page, 0, sizeof(*page));
}

wk_err
ctl_store_session_list(ctl_store *s, const char *prefix, const char *after, size_t limit,
                       bool values, ctl_store_kv_page *page, wk_diag *d)
{
    MDB_txn *txn;
    MDB_cursor *c;
    MDB_val k, v;
    wk_err e;
    int rc;
    if (s == NULL || page == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: session list: NULL argument");
    if (prefix == NULL)
        prefix = "";
    size_t pl = strnlen(prefix, CTL_STORE_SESSION_KEY_MAX + 1), al = 0;
    if (pl > CTL_STORE_SESSION_KEY_MAX)
        return wk_diag_set(d, WK_EINVAL, "session prefix is longer than %u bytes",
                           CTL_STORE_SESSION_KEY_MAX);
    if (after != NULL && after[0] != '\0' && (e = st_session_key(after, &al, d)) != WK_OK)
        return e;
    if (limit == 0)
        limit = CTL_STORE_PAGE_DEFAULT;
    if (limit > CTL_STORE_PAGE_MAX)
        limit = CTL_STORE_PAGE_MAX;
    ctl_store_kv *items = calloc(limit, sizeof(*items));
    if (items == NULL)
        return wk_diag_set(d, WK_ENOMEM, "store: out of memory for a page of %zu", limit);
    if ((e = st_read_begin(s, &txn, d)) != WK_OK) {
        free(items);
        return e;
    }
    size_t n = 0;
    char next[CTL_STORE_SESSION_KEY_MAX + 1] = "";
    if ((rc = mdb_cursor_open(txn, s->db_sessions, &c)) != 0) {
        e = st_mdb_err(NULL, rc, "opening a cursor", d);
        goto out;
    }
    /* start after `after` when it sorts at or past the prefix, else at the prefix */
    MDB_val pk = {pl, (void *)prefix}, ak = {al, (void *)after};
    bool use_after = al > 0 && mdb_cmp(txn, s->db_sessions, &ak, &pk) >= 0;
    k = use_after ? ak : pk;
    rc = pl == 0 && !use_after ? mdb_cursor_get(c, &k, &v, MDB_FIRST)
                               : mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
    if (rc == 0 && use_after && k.mv_size == al && memcmp(k.mv_data, after, al) == 0)
        rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
    MDB_val last = {0, NULL};
    while (rc == 0 && st_has_prefix(&k, prefix, pl)) {
        if (n == limit) {
            memcpy(next, last.mv_data, last.mv_size);
            next[last.mv_size] = '\0';
            break;
        }
        ctl_store_kv *it = &items[n];
        it->key = malloc(k.mv_size + 1);
        if (it->key == NULL || (values && (it->val = st_dup_val(&v)) == NULL)) {
            e = wk_diag_set(d, WK_ENOMEM, "store: out of memory listing sessions");
            n++;
            break;
        }
        memcpy(it->key, k.mv_data, k.mv_size);
        it->key[k.mv_size] = '\0';
        it->len = v.mv_size;
        n++;
        last = k;
        rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
    }
    if (e == WK_OK && rc != 0 && rc != MDB_NOTFOUND)
        e = st_mdb_err(NULL, rc, "listing sessions", d);
    mdb_cursor_close(c);
out:
    st_read_end(s, txn);
    ctl_store_kv_page pg = {items, n, ""};
    if (e != WK_OK) {
        ctl_store_kv_page_fini(&pg);
        return e;
    }
    *page = pg;
    memcpy(page->next, next, sizeof(page->next));
    return WK_OK;
}

/* ---- verify ------------------------------------------------------------------------------ */

static int
st_hash_cmp(const void *a, const void *b)
{
    return memcmp(a, b, WK_SHA256_LEN);
}

/* What kind of file a name in blobs/ is. */
typedef enum st_file_kind {
    ST_FILE_BLOB,    /* 64 lowercase hex: a blob */
    ST_FILE_TEMP,    /* a temp file of a blob write ("<...>.tmp<...>") */
    ST_FILE_OTHER,   /* anything else: not ours */
} st_file_kind;

static st_file_kind
st_file_classify(const char *name)
{
    if (st_is_hex64(name))
        return ST_FILE_BLOB;
    if (strstr(name, ".tmp") != NULL)
        return ST_FILE_TEMP;
    return ST_FILE_OTHER;
}

/* The blob references of every record, sorted (a multiset: shared blobs repeat). */
typedef struct st_refs {
    uint8_t (*h)[WK_SHA256_LEN]; /* heap array of n raw digests */
    size_t n;                    /* digests in h */
    size_t cap;                  /* digests allocated */
} st_refs;

/* Verify step 1: every record decodes (counting states, bad records); collects its blob. */
static wk_err
st_verify_records(ctl_store *s, MDB_txn *txn, st_refs *refs, ctl_store_verify_report *rep,
                  wk_diag *d)
{
    MDB_cursor *c;
    MDB_val k, v;
    wk_err e = WK_OK;
    int rc = mdb_cursor_open(txn, s->db_states, &c);
    if (rc != 0)
        return st_mdb_err(NULL, rc, "verifying", d);
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        st_rec rec;
        rep->states++;
        if (st_rec_decode(v.mv_data, v.mv_size, &rec, NULL) != WK_OK) {
            rep->bad_records++;
            continue;
        }
        if (!rec.has_blob)
            continue;
        if (refs->n == refs->cap) {
            size_t nc = refs->cap ? 2 * refs->cap : 64;
            void *p = realloc(refs->h, nc * sizeof(*refs->h));
            if (p == NULL) {
                e = wk_diag_set(d, WK_ENOMEM, "store: out of memory verifying");
                break;
            }
            refs->h = p;
            refs->cap = nc;
        }
        memcpy(refs->h[refs->n++], rec.blob, WK_SHA256_LEN);
    }
    mdb_cursor_close(c);
    if (e != WK_OK)
        return e;
    if (rc != MDB_NOTFOUND)
        return st_mdb_err(NULL, rc, "verifying", d);
    if (refs->n > 0)
        qsort(refs->h, refs->n, sizeof(*refs->h), st_hash_cmp);
    return WK_OK;
}

/*
 * Verify step 2: the blobrefs table equals the multiset of record
 * references, and every referenced blob is in blobs/ (and, with hash_blobs,
 * hashes to its name).
 */
static wk_err
st_verify_refcounts(ctl_store *s, MDB_txn *txn, const st_refs *refs, bool hash_blobs,
                    ctl_store_verify_report *rep, wk_diag *d)
{
    MDB_cursor *c;
    MDB_val k, v;
    int rc = mdb_cursor_open(txn, s->db_refs, &c);
    if (rc != 0)
        return st_mdb_err(NULL, rc, "verifying", d);
    size_t i = 0;
    rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
    while (rc == 0 || i < refs->n) {
        int cmp;
        if (rc != 0)
            cmp = 1; /* refs left, table exhausted */
        else if (i >= refs->n)
            cmp = -1;
        else if (k.mv_size != WK_SHA256_LEN)
            cmp = -1;
        else
            cmp = memcmp(k.mv_data, refs->h[i], WK_SHA256_LEN);
        if (cmp < 0) { /* a count with no record */
            rep->refs_mismatched++;
            rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
            continue;
        }
        size_t j = i;
        while (j < refs->n && memcmp(refs->h[j], refs->h[i], WK_SHA256_LEN) == 0)
            j++;
        if (cmp > 0) {
            rep->refs_mismatched++;
        } else {
            if (v.mv_size != 8 || wk_le64_get(v.mv_data) != j - i)
                rep->refs_mismatched++;
            rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
        }
        rep->blobs++;
        char hex[WK_SHA256_HEX_LEN];
        wk_sha256_to_hex(refs->h[i], hex);
        int fd = openat(s->blob_dirfd, hex, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            rep->blobs_missing++;
        } else {
            if (hash_blobs) {
                char got[WK_SHA256_HEX_LEN];
                uint64_t size;
                if (st_hash_fd(fd, hex, got, &size, NULL) != WK_OK || strcmp(got, hex) != 0)
                    rep->blobs_corrupt++;
            }
            close(fd);
        }
        i = j;
    }
    mdb_cursor_close(c);
    if (rc != MDB_NOTFOUND && rc != 0)
        return st_mdb_err(NULL, rc, "verifying", d);
    return WK_OK;
}

/* Verify step 3: blobs/ holds only referenced blobs (counting orphans and temp files). */
static wk_err
st_verify_blob_dir(ctl_store *s, const st_refs *refs, ctl_store_verify_report *rep, wk_diag *d)
{
    int dfd = dup(s->blob_dirfd);
    DIR *dir = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (dir == NULL) {
        if (dfd >= 0)
            close(dfd);
        return st_errno(errno, "listing", "blobs/", d);
    }
    rewinddir(dir);
    struct dirent *ent;
    while ((ent = readdir(dir)) != NULL) {
        if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0)
            continue;
        st_file_kind kind = st_file_classify(ent->d_name);
        if (kind == ST_FILE_TEMP) {
            rep->temps++;
        } else if (kind == ST_FILE_BLOB) {
            uint8_t raw[WK_SHA256_LEN];
            st_hex_to_raw(ent->d_name, raw);
            if (refs->n == 0 ||
                bsearch(raw, refs->h, refs->n, sizeof(*refs->h), st_hash_cmp) == NULL)
                rep->orphans++;
        }
    }
    closedir(dir);
    return WK_OK;
}

wk_err
ctl_store_verify(ctl_store *s, bool hash_blobs, ctl_store_verify_report *r, wk_diag *d)
{
    MDB_txn *txn;
    wk_err e;
    ctl_store_verify_report rep;
    st_refs refs = {NULL, 0, 0};

    if (s == NULL || r == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: verify: NULL argument");
    memset(&rep, 0, sizeof(rep));
    if ((e = st_read_begin(s, &txn, d)) != WK_OK)
        return e;
    if ((e = st_verify_records(s, txn, &refs, &rep, d)) == WK_OK &&
        (e = st_verify_refcounts(s, txn, &refs, hash_blobs, &rep, d)) == WK_OK)
        e = st_verify_blob_dir(s, &refs, &rep, d);
    st_read_end(s, txn);
    free(refs.h);
    if (e != WK_OK)
        return e;
    rep.problems = rep.bad_records + rep.refs_mismatched + rep.blobs_missing + rep.blobs_corrupt +
                   rep.orphans + rep.temps;
    *r = rep;
    return WK_OK;
}

/* ---- open and close ------------------------------------------------------------------------ */

/* mkdir that accepts an existing directory. */
static wk_err
st_mkdir(const char *path, wk_diag *d)
{
    if (mkdir(path, 0700) == 0 || errno == EEXIST) {
        struct stat st;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
            return WK_OK;
        return wk_diag_set(d, WK_EIO, "store: %s is not a directory", path);
    }
    return st_errno(errno, "creating", path, d);
}

static const char st_meta_schema[] = "schema"; /* meta key: u32 LE schema version */

/*
 * Opens the named databases and checks (or writes) the schema version. A
 * "journal" database and a "journal_next" meta key that earlier builds may
 * have left are never opened nor read (see ctl_store.h).
 */
static wk_err
st_init_op(st_txn *t, void *arg, wk_diag *d)
{
    ctl_store *s = t->s;
    (void)arg;
    struct {
        const char *name; /* database name */
        MDB_dbi *dbi;     /* where its handle goes */
    } dbs[] = {
        {"states", &s->db_states},     {"names", &s->db_names},     {"blobrefs", &s->db_refs},
        {"sessions", &s->db_sessions}, {"meta", &s->db_meta},
    };
    for (size_t i = 0; i < sizeof(dbs) / sizeof(dbs[0]); i++) {
        int rc = mdb_dbi_open(t->txn, dbs[i].name, MDB_CREATE, dbs[i].dbi);
        if (rc != 0)
            return st_mdb_err(t, rc, "opening a database", d);
    }
    MDB_val k = {sizeof(st_meta_schema) - 1, (void *)st_meta_schema}, v;
    int rc = mdb_get(t->txn, s->db_meta, &k, &v);
    if (rc == 0) {
        if (v.mv_size != 4)
            return wk_diag_set(d, WK_ECORRUPT, "store: schema version is malformed");
        const uint8_t *p = v.mv_data;
        uint32_t ver = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                       (uint32_t)p[3] << 24;
        if (ver > CTL_STORE_SCHEMA_VERSION)
            return wk_diag_set(d, WK_ENOTSUP,
                               "store: schema version %u is newer than this build supports (%u)",
                               ver, CTL_STORE_SCHEMA_VERSION);
        if (ver < 1)
            return wk_diag_set(d, WK_ECORRUPT, "store: schema version %u is invalid", ver);
        return WK_OK;
    }
    if (rc != MDB_NOTFOUND)
        return st_mdb_err(t, rc, "reading the schema version", d);
    MDB_stat ms;
    if ((rc = mdb_stat(t->txn, s->db_states, &ms)) != 0)
        return st_mdb_err(t, rc, "reading store statistics", d);
    if (ms.ms_entries != 0)
        return wk_diag_set(d, WK_ECORRUPT, "store: state records but no schema version");
    uint8_t b[4] = {CTL_STORE_SCHEMA_VERSION & 0xff, 0, 0, 0};
    v.mv_size = 4;
    v.mv_data = b;
    if ((rc = mdb_put(t->txn, s->db_meta, &k, &v, 0)) != 0)
        return st_mdb_err(t, rc, "writing the schema version", d);
    return WK_OK;
}

/* Removes temp files and unreferenced blobs from blobs/, counting what it saw. */
static wk_err
st_open_gc(ctl_store *s, ctl_store_open_stats *st, wk_diag *d)
{
    MDB_txn *txn;
    MDB_cursor *c;
    MDB_val k, v;
    wk_err e;
    if ((e = st_read_begin(s, &txn, d)) != WK_OK)
        return e;
    int dfd = dup(s->blob_dirfd);
    DIR *dir = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (dir == NULL) {
        if (dfd >= 0)
            close(dfd);
        e = st_errno(errno, "listing", "blobs/", d);
        goto out;
    }
    struct dirent *ent;
    while ((ent = readdir(dir)) != NULL) {
        if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0)
            continue;
        switch (st_file_classify(ent->d_name)) {
        case ST_FILE_BLOB: {
            uint8_t raw[WK_SHA256_LEN];
            st_hex_to_raw(ent->d_name, raw);
            MDB_val rk = {WK_SHA256_LEN, raw};
            int rc = mdb_get(txn, s->db_refs, &rk, &v);
            if (rc == 0)
                st->blobs++;
            else if (rc == MDB_NOTFOUND && unlinkat(s->blob_dirfd, ent->d_name, 0) == 0)
                st->orphans_removed++;
            break;
        }
        case ST_FILE_TEMP:
            if (unlinkat(s->blob_dirfd, ent->d_name, 0) == 0)
                st->temps_removed++;
            break;
        case ST_FILE_OTHER:
            st->unknown_files++;
            break;
        }
    }
    closedir(dir);
    int rc = mdb_cursor_open(txn, s->db_refs, &c);
    if (rc == 0) {
        for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
             rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
            char hex[WK_SHA256_HEX_LEN];
            struct stat sb;
            if (k.mv_size != WK_SHA256_LEN)
                continue;
            wk_sha256_to_hex(k.mv_data, hex);
            if (fstatat(s->blob_dirfd, hex, &sb, 0) != 0)
                st->blobs_missing++;
        }
        mdb_cursor_close(c);
    }
    if (rc != 0 && rc != MDB_NOTFOUND) {
        e = st_mdb_err(NULL, rc, "scanning blob references", d);
        goto out;
    }
    MDB_stat ms;
    if ((rc = mdb_stat(txn, s->db_states, &ms)) != 0)
        e = st_mdb_err(NULL, rc, "reading store statistics", d);
    else
        st->states = ms.ms_entries;
    if (e == WK_OK && (st->orphans_removed > 0 || st->temps_removed > 0))
        (void)fsync(s->blob_dirfd);
out:
    st_read_end(s, txn);
    return e;
}

void
ctl_store_close(ctl_store *s)
{
    if (s == NULL)
        return;
    if (s->env != NULL)
        mdb_env_close(s->env);
    if (s->blob_dirfd >= 0)
        close(s->blob_dirfd);
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    if (s->locks_ready) {
        pthread_rwlock_destroy(&s->map_lock);
        pthread_mutex_destroy(&s->blob_mu);
    }
    free(s);
}

wk_err
ctl_store_open(const char *data_dir, const ctl_store_config *cfg, ctl_store **out,
               ctl_store_open_stats *stats, wk_diag *d)
{
    char path[4096];
    ctl_store_open_stats st;
    wk_err e;
    int rc;

    if (data_dir == NULL || data_dir[0] == '\0' || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "store: open: no data directory");
    if (strlen(data_dir) > sizeof(path) - 64)
        return wk_diag_set(d, WK_EINVAL, "store: data directory path is too long");
    uint64_t map = cfg != NULL && cfg->map_size != 0 ? cfg->map_size : CTL_STORE_MAP_SIZE_DEFAULT;
    uint64_t max = cfg != NULL && cfg->map_size_max != 0 ? cfg->map_size_max
                                                         : CTL_STORE_MAP_SIZE_MAX_DEFAULT;
    if (map > ((uint64_t)1 << 46) || max > ((uint64_t)1 << 46) || (uint64_t)SIZE_MAX < max)
        return wk_diag_set(d, WK_EINVAL, "store: map size is over 64 TiB");
    map = (map + ST_PAGE - 1) / ST_PAGE * ST_PAGE;
    if (max < map)
        max = map;

    memset(&st, 0, sizeof(st));
    ctl_store *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return wk_diag_set(d, WK_ENOMEM, "store: out of memory");
    s->blob_dirfd = -1;
    s->lock_fd = -1;
    s->map_size_max = max;
    s->write_fn = st_sys_write;
    atomic_init(&s->tmp_seq, 0u);
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    /* a resize must not wait behind a stream of readers */
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    rc = pthread_rwlock_init(&s->map_lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    if (rc != 0) {
        free(s);
        return wk_diag_set(d, WK_ENOMEM, "store: cannot create a lock");
    }
    if (pthread_mutex_init(&s->blob_mu, NULL) != 0) {
        pthread_rwlock_destroy(&s->map_lock);
        free(s);
        return wk_diag_set(d, WK_ENOMEM, "store: cannot create a lock");
    }
    s->locks_ready = true;

    if ((e = st_mkdir(data_dir, d)) != WK_OK)
        goto fail;
    snprintf(path, sizeof(path), "%s/store", data_dir);
    if ((e = st_mkdir(path, d)) != WK_OK)
        goto fail;
    snprintf(path, sizeof(path), "%s/blobs", data_dir);
    if ((e = st_mkdir(path, d)) != WK_OK)
        goto fail;
    s->blob_dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s->blob_dirfd < 0) {
        e = st_errno(errno, "opening", path, d);
        goto fail;
    }
    snprintf(path, sizeof(path), "%s/store/ctl_store.lock", data_dir);
    s->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->lock_fd < 0) {
        e = st_errno(errno, "opening", path, d);
        goto fail;
    }
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK)
            e = wk_diag_set(d, WK_EBUSY, "store: %s/store is in use by another process",
                            data_dir);
        else
            e = st_errno(errno, "locking", path, d);
        goto fail;
    }

    if ((rc = mdb_env_create(&s->env)) != 0 ||
        (rc = mdb_env_set_maxdbs(s->env, ST_MAXDBS)) != 0 ||
        (rc = mdb_env_set_mapsize(s->env, (size_t)map)) != 0) {
        e = st_mdb_err(NULL, rc, "creating the environment", d);
        goto fail;
    }
    snprintf(path, sizeof(path), "%s/store", data_dir);
    if ((rc = mdb_env_open(s->env, path, MDB_NOTLS, 0600)) != 0) {
        e = st_mdb_err(NULL, rc, "opening the environment", d);
        wk_diag_prefix(d, "%s: ", path);
        goto fail;
    }
    int dead = 0;
    (void)mdb_reader_check(s->env, &dead);
    s->map_size = st_env_map_size(s->env);
    if (s->map_size < map)
        s->map_size = map;
    if (s->map_size > s->map_size_max)
        s->map_size_max = s->map_size;
    if ((e = st_write(s, st_init_op, NULL, d)) != WK_OK)
        goto fail;
    if ((e = st_open_gc(s, &st, d)) != WK_OK)
        goto fail;
    st.map_size = ctl_store_map_size(s);
    if (stats != NULL)
        *stats = st;
    *out = s;
    return WK_OK;
fail:
    ctl_store_close(s);
    return e;
}
