/*
 * ctl_store: the controller's durable store, and the only LMDB user in wkvm.
 *
 * Layout under the data directory:
 *   <data>/store/   one LMDB environment with the named databases
 *                   states   (owner, name, version) -> state record
 *                   names    (owner, name) -> next version counter
 *                   blobrefs blob SHA-256 -> number of records referencing it
 *                   sessions key -> bytes (the chat-session module's table)
 *                   meta     schema version
 *                   plus ctl_store.lock, which one process holds while open
 *   <data>/blobs/   content-addressed state blobs named by their SHA-256 hex
 *
 * Durability: every operation is one short write transaction, and blobs are
 * written (temp file, fsync, rename, fsync dir) before any record refers to
 * them, so a crash at any point leaves the old or the new record, never a
 * half, and never a record whose blob was not yet on disk. A blob is
 * collected when the last record referring to it goes (in the same call,
 * after the commit); blobs left unreferenced by a crash, and temp files, are
 * collected by ctl_store_open(). Every blob read verifies the SHA-256.
 *
 * Versions of a (owner, name) are append-only: each put gets the next
 * number, and numbers are never reused, even after every version is deleted.
 * A state's id is "name@version". Owners are isolated: an operation scoped to
 * an owner answers WK_ENOENT for another owner's state, so ids never leak.
 *
 * It never logs (it returns wk_err with detail in wk_diag), never builds a
 * path from client input other than validated names and 64-hex digests, and
 * never hands out pointers into LMDB memory: every value is copied before
 * its transaction ends.
 *
 * Threading: after ctl_store_open() returns, every function may be called
 * from any thread concurrently; ctl_store_close() must not race with them.
 * One process at a time may open a data directory (WK_EBUSY otherwise).
 *
 * Compatibility: stores written by earlier builds may also hold a named
 * database "journal" and a meta key "journal_next" (a migration journal that
 * nothing wrote). This module never opens that database nor reads that key:
 * they are left alone, untouched, and such a store opens as any other.
 */
#ifndef CTL_STORE_H
#define CTL_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"
#include "wk_sha256.h"

#define CTL_STORE_SCHEMA_VERSION 1u                      /* meta "schema" this build writes */
#define CTL_STORE_NAME_MAX 64u                           /* state name: 1..64 of [A-Za-z0-9._-] */
#define CTL_STORE_OWNER_MAX 128u                         /* owner: 1..128 printable ASCII bytes */
#define CTL_STORE_ID_MAX (CTL_STORE_NAME_MAX + 1u + 20u) /* "name@version" without the NUL */
#define CTL_STORE_FAMILY_MAX 31u                         /* family: 1..31 of [a-z0-9_-] */
#define CTL_STORE_MAX_TOKENS ((size_t)1 << 20)           /* token ids per record */
#define CTL_STORE_CURSOR_MAX 512u                        /* list cursor buffer, with the NUL */
#define CTL_STORE_PAGE_DEFAULT 100u                      /* list page size when limit is 0 */
#define CTL_STORE_PAGE_MAX 1000u                         /* largest list page */
#define CTL_STORE_SESSION_KEY_MAX 511u                   /* session key bytes (LMDB's key max) */
#define CTL_STORE_SESSION_VALUE_MAX ((size_t)64 << 20)   /* session value bytes (64 MiB) */
#define CTL_STORE_BLOB_MAX ((uint64_t)1 << 32)           /* blob bytes (4 GiB) */
#define CTL_STORE_MAP_SIZE_DEFAULT ((uint64_t)1 << 30)   /* initial LMDB map (1 GiB) */
#define CTL_STORE_MAP_SIZE_MAX_DEFAULT ((uint64_t)1 << 36) /* growth ceiling (64 GiB) */

typedef struct ctl_store ctl_store;

/* Where a state's bytes live. The on-disk code is the enum value. */
typedef enum ctl_store_tier {
    CTL_STORE_TIER_HOT = 0,  /* in a worker's device slot */
    CTL_STORE_TIER_WARM = 1, /* in a worker's host memory */
    CTL_STORE_TIER_COLD = 2, /* only in its blob on disk (needs a blob) */
} ctl_store_tier;

/* How a state version came to be. The on-disk code is the enum value. */
typedef enum ctl_store_op {
    CTL_STORE_OP_CREATE = 0,   /* created from a prompt */
    CTL_STORE_OP_FORK = 1,     /* forked from the parent */
    CTL_STORE_OP_SNAPSHOT = 2, /* snapshot of a live state */
    CTL_STORE_OP_GENERATE = 3, /* saved after a generation (save_as) */
    CTL_STORE_OP_IMPORT = 4,   /* imported from a state file */
    CTL_STORE_OP_ROLLBACK = 5, /* copy of an older version (parent) */
    CTL_STORE_OP_SESSION = 6,  /* spilled chat session */
} ctl_store_op;

/* Options of ctl_store_open(); a zero field takes its default. */
typedef struct ctl_store_config {
    uint64_t map_size;     /* initial LMDB map size in bytes; 0 = CTL_STORE_MAP_SIZE_DEFAULT */
    uint64_t map_size_max; /* doubling stops here; 0 = CTL_STORE_MAP_SIZE_MAX_DEFAULT */
} ctl_store_config;

/* What ctl_store_open() found and cleaned, for the daemon to log. */
typedef struct ctl_store_open_stats {
    uint64_t states;          /* state records in the store */
    uint64_t blobs;           /* referenced blob files present */
    uint64_t blobs_missing;   /* referenced blobs with no file (their records read ENOENT) */
    uint64_t orphans_removed; /* blob files no record referenced, removed */
    uint64_t temps_removed;   /* temp files of interrupted blob writes, removed */
    uint64_t unknown_files;   /* other files in blobs/, left alone */
    uint64_t map_size;        /* LMDB map size in effect, bytes */
} ctl_store_open_stats;

/*
 * One state version. Filled by the get/list functions; the input of
 * ctl_store_state_put() (see there for which fields it reads).
 */
typedef struct ctl_store_state {
    char owner[CTL_STORE_OWNER_MAX + 1];    /* owning user (API key identity) */
    char name[CTL_STORE_NAME_MAX + 1];      /* state name */
    uint64_t version;                       /* version number, >= 1 */
    char id[CTL_STORE_ID_MAX + 1];          /* "name@version" */
    char fingerprint[WK_SHA256_HEX_LEN];    /* model fingerprint, 64 lowercase hex */
    char family[CTL_STORE_FAMILY_MAX + 1];  /* model family, e.g. "rwkv7" */
    int32_t *tokens;                        /* token ids; heap (see ctl_store_state_fini) */
    size_t n_tokens;                        /* token count (set even when tokens is NULL) */
    char token_digest[WK_SHA256_HEX_LEN];   /* SHA-256 over ids as int64 LE (computed) */
    char parent[CTL_STORE_ID_MAX + 1];      /* lineage: parent id, "" when none */
    ctl_store_op op;                        /* lineage: how this version was made */
    ctl_store_tier tier;                    /* where the bytes live */
    char blob[WK_SHA256_HEX_LEN];           /* blob SHA-256 hex, "" when none */
    uint64_t blob_bytes;                    /* bytes of the blob, 0 when none */
    uint64_t state_bytes;                   /* bytes of the state itself */
    int64_t created_ms;                     /* creation time, Unix ms */
    int64_t used_ms;                        /* last use, Unix ms */
    bool damaged;                           /* the blob failed verification once */
} ctl_store_state;

/* One page of state records. */
typedef struct ctl_store_page {
    ctl_store_state *items;            /* heap array of n records, tokens NULL */
    size_t n;                          /* records in items */
    char next[CTL_STORE_CURSOR_MAX];   /* cursor for the next page, "" at the end */
} ctl_store_page;

/* Which fields of ctl_store_update apply (bit mask in .set). */
enum {
    CTL_STORE_SET_TIER = 1u << 0,    /* tier */
    CTL_STORE_SET_BLOB = 1u << 1,    /* blob / blob_data (blob_bytes follow) */
    CTL_STORE_SET_USED = 1u << 2,    /* used_ms */
    CTL_STORE_SET_DAMAGED = 1u << 3, /* damaged */
};

/* A change to one state record, applied in one transaction. */
typedef struct ctl_store_update {
    unsigned set;          /* CTL_STORE_SET_* bits: the fields below that apply */
    ctl_store_tier tier;   /* new tier */
    const char *blob;      /* hex of a blob already stored, "" or NULL to drop the blob */
    const void *blob_data; /* bytes to store as the new blob (then blob is ignored) */
    size_t blob_len;       /* bytes at blob_data */
    int64_t used_ms;       /* new last-use time, Unix ms */
    bool damaged;          /* new damaged flag */
} ctl_store_update;

/* One session entry. */
typedef struct ctl_store_kv {
    char *key;  /* NUL-terminated key, heap */
    void *val;  /* value bytes, heap; NULL when values were not asked for */
    size_t len; /* bytes of the value (set even when val is NULL) */
} ctl_store_kv;

/* One page of session entries. */
typedef struct ctl_store_kv_page {
    ctl_store_kv *items;                      /* heap array of n entries */
    size_t n;                                 /* entries in items */
    char next[CTL_STORE_SESSION_KEY_MAX + 1]; /* pass as `after` for the next page, "" at end */
} ctl_store_kv_page;

/* Result of ctl_store_verify(); every count but states/blobs is a problem. */
typedef struct ctl_store_verify_report {
    uint64_t states;          /* state records */
    uint64_t blobs;           /* distinct blobs referenced */
    uint64_t bad_records;     /* records that do not decode */
    uint64_t refs_mismatched; /* blobrefs entries that disagree with the records */
    uint64_t blobs_missing;   /* referenced blobs with no file */
    uint64_t blobs_corrupt;   /* referenced blobs failing SHA-256 (when hashing) */
    uint64_t orphans;         /* blob files no record references */
    uint64_t temps;           /* temp files in blobs/ */
    uint64_t problems;        /* sum of the problem counts above */
} ctl_store_verify_report;

/*
 * Opens (creating when missing) the store under data_dir: the directory
 * itself, <data_dir>/store and <data_dir>/blobs are created (mode 0700).
 * cfg may be NULL for defaults. Takes the store's lock file, clears stale
 * LMDB readers, checks the schema version, then removes temp files and
 * unreferenced blobs from blobs/; *stats (optional) says what it found. On
 * success *out is the store (close with ctl_store_close()). Returns
 * WK_EINVAL (bad argument or config), WK_EBUSY (another process has it
 * open), WK_ENOTSUP (schema newer than this build), WK_ECORRUPT (not a
 * store), WK_EIO, WK_ENOSPC, WK_ENOMEM. Not thread-safe with respect to the
 * same data_dir.
 */
WK_MUST_CHECK wk_err ctl_store_open(const char *data_dir, const ctl_store_config *cfg,
                                    ctl_store **out, ctl_store_open_stats *stats, wk_diag *d);

/* Closes the store and releases its lock. NULL-safe. No call may be in flight. */
void ctl_store_close(ctl_store *s);

/* LMDB map size now in effect (it grows on demand). Thread-safe. */
uint64_t ctl_store_map_size(ctl_store *s);

/* ---- names and ids ---------------------------------------------------- */

/* WK_OK when name is 1..64 bytes of [A-Za-z0-9._-]; WK_EINVAL naming the rule. */
WK_MUST_CHECK wk_err ctl_store_name_check(const char *name, wk_diag *d);

/* WK_OK when owner is 1..128 printable ASCII bytes; WK_EINVAL naming the rule. */
WK_MUST_CHECK wk_err ctl_store_owner_check(const char *owner, wk_diag *d);

/*
 * Parses a state reference: "name" (then *version = 0, meaning "latest") or
 * "name@version" with version a decimal >= 1 without leading zeros. name
 * receives the name (buffer of CTL_STORE_NAME_MAX + 1). Outputs written only
 * on success; WK_EINVAL otherwise. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_id_parse(const char *ref, char name[CTL_STORE_NAME_MAX + 1],
                                        uint64_t *version, wk_diag *d);

/* Static lower-case names of tiers ("hot") and operations ("fork"); "?" when unknown. */
const char *ctl_store_tier_name(ctl_store_tier t);
const char *ctl_store_op_name(ctl_store_op op);

/* Parses "hot"/"warm"/"cold" (or an op name) into *out; WK_EINVAL when unknown. */
WK_MUST_CHECK wk_err ctl_store_tier_parse(const char *s, ctl_store_tier *out, wk_diag *d);
WK_MUST_CHECK wk_err ctl_store_op_parse(const char *s, ctl_store_op *out, wk_diag *d);

/* ---- state records ------------------------------------------------------ */

/*
 * Appends a new version of (in->owner, in->name). Reads from in: owner, name,
 * fingerprint (64 lowercase hex), family, tokens/n_tokens (borrowed, at most
 * CTL_STORE_MAX_TOKENS, each >= 0), parent ("" or an id), op, tier, blob,
 * blob_bytes, state_bytes, created_ms and used_ms (0 = now). version, id and
 * token_digest are computed (token_digest, when not "", must match).
 * The blob, three ways:
 *   blob_data != NULL: the bytes are stored as a blob (content-addressed) and
 *     referenced; in->blob must be "" or their hex, blob_bytes is blob_len;
 *   blob_data == NULL, in->blob a hex: references a blob already stored
 *     (ctl_store_blob_put()); WK_ENOENT if its file is not there (it may
 *     have been collected after its last reference went: put it again);
 *   neither: no blob; the tier must then be hot or warm.
 * *version_out (optional) receives the version on success. Returns WK_EINVAL
 * (a field, named), WK_ETOOBIG (too many tokens, blob too big), WK_ENOENT,
 * WK_ENOSPC (disk or map ceiling), WK_EIO, WK_ENOMEM. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_state_put(ctl_store *s, const ctl_store_state *in,
                                         const void *blob_data, size_t blob_len,
                                         uint64_t *version_out, wk_diag *d);

/*
 * Reads the state ref ("name@version", or "name" for the latest version
 * still present) of owner into *out, tokens included: out->tokens is a heap
 * array the caller releases with ctl_store_state_fini(). Returns WK_ENOENT
 * (no such state for this owner, including another owner's), WK_EINVAL (bad
 * owner or ref), WK_ECORRUPT (record does not decode), WK_EIO, WK_ENOMEM.
 * Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_state_get(ctl_store *s, const char *owner, const char *ref,
                                         ctl_store_state *out, wk_diag *d);

/* Frees out->tokens and sets it to NULL. NULL-safe, idempotent. */
void ctl_store_state_fini(ctl_store_state *st);

/*
 * Lists state versions in (owner, name, version) order: those of owner, or
 * of every owner when owner is NULL (admin). cursor is NULL or "" for the
 * first page, else a page's `next`; limit 0 means CTL_STORE_PAGE_DEFAULT
 * and is capped at CTL_STORE_PAGE_MAX. Records come without tokens
 * (tokens NULL, n_tokens set). Release the page with ctl_store_page_fini().
 * Returns WK_EINVAL (bad owner, or a cursor that is malformed or belongs to
 * another listing), WK_ECORRUPT, WK_EIO, WK_ENOMEM. Thread-safe; pages are
 * each consistent, not the listing as a whole.
 */
WK_MUST_CHECK wk_err ctl_store_state_list(ctl_store *s, const char *owner, const char *cursor,
                                          size_t limit, ctl_store_page *page, wk_diag *d);

/*
 * Lists the versions of (owner, name) still present, oldest first, paged as
 * ctl_store_state_list(). An unknown name gives an empty page (not an
 * error). Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_state_versions(ctl_store *s, const char *owner, const char *name,
                                              const char *cursor, size_t limit,
                                              ctl_store_page *page, wk_diag *d);

/* Frees a page's records and zeroes it. NULL-safe, idempotent. */
void ctl_store_page_fini(ctl_store_page *page);

/*
 * Counts the state versions of owner into *n (for per-user limits). WK_EINVAL
 * for a bad owner, WK_EIO. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_state_count(ctl_store *s, const char *owner, uint64_t *n,
                                           wk_diag *d);

/*
 * Applies u to the state ref of owner in one transaction. A blob given by
 * bytes is stored first; one given by hex must already be stored (WK_ENOENT
 * otherwise). A blob no longer referenced is deleted after the commit. The
 * result must keep the rule that a cold state has a blob (WK_EINVAL).
 * Returns WK_ENOENT (no such state for this owner), WK_EINVAL, WK_ETOOBIG,
 * WK_ENOSPC, WK_EIO, WK_ENOMEM. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_state_update(ctl_store *s, const char *owner, const char *ref,
                                            const ctl_store_update *u, wk_diag *d);

/*
 * Deletes state versions of owner: "name@version" deletes that version,
 * "name" deletes every version of the name. The version counter is kept, so
 * numbers are not reused. Blobs no longer referenced are deleted after the
 * commit. *n_deleted (optional) receives the number of versions removed.
 * Returns WK_ENOENT (nothing to delete for this owner), WK_EINVAL, WK_EIO,
 * WK_ENOMEM. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_state_delete(ctl_store *s, const char *owner, const char *ref,
                                            uint64_t *n_deleted, wk_diag *d);

/*
 * Rolls the name of ref back to the version ref names: appends a new version
 * with that version's content (tokens, fingerprint, family, state and blob,
 * tier cold), op CTL_STORE_OP_ROLLBACK and parent = the source id, so history
 * stays append-only. now_ms stamps created/used (0 = now). *version_out
 * (optional) receives the new version. Returns WK_ENOENT (no such state),
 * WK_ESTATE (the source has no blob, or is marked damaged), WK_EINVAL,
 * WK_ENOSPC, WK_EIO, WK_ENOMEM. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_state_rollback(ctl_store *s, const char *owner, const char *ref,
                                              int64_t now_ms, uint64_t *version_out, wk_diag *d);

/* ---- blobs ----------------------------------------------------------------- */

/*
 * Stores len bytes (at most CTL_STORE_BLOB_MAX) as the blob named by their
 * SHA-256, written to a temp file, fsynced, renamed and the directory
 * fsynced. An existing blob with that name is verified and reused (and
 * rewritten when it fails verification). hex_out receives the name. A blob
 * that no record references is collected by the next open (or by a delete
 * that drops the last reference to the same content). Returns WK_ENOSPC
 * (disk full or quota; nothing is left behind), WK_ETOOBIG, WK_EIO,
 * WK_ENOMEM. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_blob_put(ctl_store *s, const void *data, size_t len,
                                        char hex_out[WK_SHA256_HEX_LEN], wk_diag *d);

/*
 * Reads the blob named hex (exactly 64 lowercase hex digits, else WK_EINVAL)
 * and verifies its SHA-256. On success *data is a heap buffer of *len bytes
 * that the caller frees with free(). Returns WK_ENOENT (no such blob),
 * WK_ECORRUPT (content does not match its name: the caller marks the record
 * damaged), WK_EIO, WK_ENOMEM. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_blob_get(ctl_store *s, const char *hex, void **data, size_t *len,
                                        wk_diag *d);

/* ---- sessions --------------------------------------------------------------- */

/*
 * The session table holds opaque bytes: a blob hex kept only in a session
 * value is not a reference, and the blob is collected. A session whose
 * state must survive keeps it in a state record (op CTL_STORE_OP_SESSION)
 * and stores that record's id in its value.
 */

/*
 * Sets key (1..CTL_STORE_SESSION_KEY_MAX bytes, NUL-terminated) to the len
 * bytes at val (at most CTL_STORE_SESSION_VALUE_MAX), replacing any value.
 * Returns WK_EINVAL, WK_ETOOBIG, WK_ENOSPC, WK_EIO. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_session_put(ctl_store *s, const char *key, const void *val,
                                           size_t len, wk_diag *d);

/*
 * Reads key's value: *val is a heap copy (caller frees with free(); non-NULL
 * even for an empty value) of *len bytes. WK_ENOENT, WK_EINVAL, WK_EIO,
 * WK_ENOMEM. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_session_get(ctl_store *s, const char *key, void **val, size_t *len,
                                           wk_diag *d);

/* Deletes key. WK_ENOENT when absent, WK_EINVAL, WK_EIO. Thread-safe. */
WK_MUST_CHECK wk_err ctl_store_session_delete(ctl_store *s, const char *key, wk_diag *d);

/*
 * Lists keys starting with prefix ("" for all) in byte order, after the key
 * `after` (NULL or "" to start), at most limit (0 = CTL_STORE_PAGE_DEFAULT,
 * capped at CTL_STORE_PAGE_MAX) entries, with values copied when `values`.
 * Release with ctl_store_kv_page_fini(). WK_EINVAL, WK_EIO, WK_ENOMEM.
 * Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_session_list(ctl_store *s, const char *prefix, const char *after,
                                            size_t limit, bool values, ctl_store_kv_page *page,
                                            wk_diag *d);

/* Frees a session page and zeroes it. NULL-safe, idempotent. */
void ctl_store_kv_page_fini(ctl_store_kv_page *page);

/* ---- checking ---------------------------------------------------------------- */

/*
 * Checks the store's invariants: every record decodes, the blob reference
 * counts equal the records' references, every referenced blob exists (and,
 * with hash_blobs, verifies), and blobs/ holds no orphan or temp file. Fills
 * *r (problems = 0 when all hold) and returns WK_OK, or WK_EIO / WK_ENOMEM
 * when it cannot finish. Meaningful on a quiet store: a blob being put
 * concurrently shows as an orphan until its record commits. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_verify(ctl_store *s, bool hash_blobs, ctl_store_verify_report *r,
                                      wk_diag *d);

/*
 * Space of the filesystem that holds the data directory: bytes available to
 * this process (*avail) and its size (*total). WK_EIO when it can't be read.
 * Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_store_fs_space(ctl_store *s, uint64_t *avail, uint64_t *total);

#endif /* CTL_STORE_H */
