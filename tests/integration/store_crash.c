/*
 * store_crash: kills a process that is writing to a ctl_store at random
 * moments and checks that every write it acknowledged survived bit for bit,
 * and that nothing it did not acknowledge is half there.
 *
 * Each round forks a child that opens the store in a temp data dir and loops
 * over random operations (create with a blob, fork by blob reference, a hot
 * create then its hibernation with new bytes, blob replacement, rollback,
 * delete of a version or of a name, a stand-alone blob put then maybe a
 * record referencing it, session puts and deletes), with blob contents
 * drawn from a small pool so that blobs are shared, a third of them salted
 * so that fresh blob writes (temp file, fsync, rename) happen too. Around
 * every store call the child writes to an acknowledgement log: a BEGIN
 * record saying what it is about to do before the call, an ACK record with
 * what the store answered (version, count) after it returned WK_OK. Each
 * record is one write() of a fixed-size struct to a file, in the kernel
 * before the next store call starts, so the SIGKILL that the parent sends
 * after a random delay cannot lose it.
 *
 * The parent replays the log into its own model of the store (each state
 * version with the exact bytes of its blob, sessions), reopens the store
 * and judges it by the model and by reading blobs/ directly, not by
 * ctl_store's own checker:
 *  - every acknowledged state version is listed with the fields it was
 *    written with, its tokens read back, and its blob file holds exactly
 *    the bytes written; every acknowledged delete is gone; every
 *    acknowledged session value reads back bit-identical;
 *  - the one call in flight at the kill (a BEGIN without its ACK) is wholly
 *    there or wholly absent: a new version with all its fields and bytes or
 *    none; an update's old blob or its new one; a name's versions all
 *    deleted or all present;
 *  - nothing else is there: no unacknowledged record or session, and
 *    blobs/ holds exactly the blobs the model references (no orphan, no
 *    temp file, none missing);
 *  - version numbers are never reused (the next version of every name is
 *    above every version ever acknowledged).
 * ctl_store_verify() runs too, as a consistency check of the module with
 * itself (records decode, reference counts), not as the judge.
 * Bounded: ROUNDS rounds (default 30) of at most 400 ms each.
 *
 * Usage: store_crash [ROUNDS] [SEED]. Exit 0 when every round passes.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl_store.h"
#include "wk_sha256.h"

#define N_OWNERS 3 /* owners the child writes for */
#define N_NAMES 5  /* names per owner */
#define N_POOL 12  /* distinct blob contents */
#define ACK_MAGIC 0x4b434153u

static const char FP[] = "aa00aa00aa00aa00aa00aa00aa00aa00aa00aa00aa00aa00aa00aa00aa00aa00";
static const char *const NAMES[N_NAMES] = {"a", "b", "c.d", "e-f", "g_h"};

static unsigned
rnd(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return (*seed >> 8) & 0xffffff;
}

/* ---- contents ----------------------------------------------------------- */

/* Bytes the child wrote, as a recipe the parent can replay. */
typedef struct content {
    uint32_t k;      /* pool entry */
    uint32_t salted; /* the first 4 bytes replaced by salt */
    uint32_t salt;   /* salt value */
    uint32_t len;    /* bytes used (a prefix of the pool entry) */
} content;

/* Size of pool entry k: a few KiB to ~200 KiB. */
static size_t
pool_len(unsigned k)
{
    return 1024 + (size_t)k * 17000;
}

/* The bytes of c (caller frees). */
static unsigned char *
content_bytes(const content *c)
{
    size_t n = pool_len(c->k);
    unsigned char *b = malloc(n);
    if (b == NULL)
        abort();
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(i * 31 + c->k * 7);
    if (c->salted)
        memcpy(b, &c->salt, sizeof(c->salt));
    return b;
}

static void
content_hex(const content *c, char hex[WK_SHA256_HEX_LEN])
{
    unsigned char *b = content_bytes(c);
    wk_sha256_hex(b, c->len, hex);
    free(b);
}

/* ---- the acknowledgement log --------------------------------------------- */

enum { PH_BEGIN = 1, PH_ACK = 2 };

enum {
    K_CREATE = 1, /* put, cold, with bytes */
    K_FORK,       /* put, cold, referencing ref's blob */
    K_HOT,        /* put, hot, no blob */
    K_HIBERNATE,  /* update ref: new blob bytes, tier cold */
    K_REPLACE,    /* update ref: new blob bytes */
    K_ROLLBACK,   /* rollback to ref (count 1: refused with WK_ESTATE, nothing changed) */
    K_DEL_VER,    /* delete ref (count: versions deleted) */
    K_DEL_NAME,   /* delete every version of name (count: versions deleted) */
    K_BLOB_REF,   /* put, cold, referencing a blob put just before */
    K_SESS_PUT,   /* session (owner, name) := bytes */
    K_SESS_DEL,   /* delete session (owner, name) (count 0: it was absent) */
};

/* One log record: a store call about to start (BEGIN) or done (ACK). */
typedef struct ack_rec {
    uint32_t magic;                 /* ACK_MAGIC */
    uint32_t phase;                 /* PH_BEGIN or PH_ACK */
    uint32_t kind;                  /* K_* */
    uint32_t owner;                 /* owner index */
    uint32_t name;                  /* name index (of a new version, a session, a delete) */
    uint32_t n_tokens;              /* tokens of a new version */
    content c;                      /* bytes written (blob, session value) */
    uint64_t version;               /* ACK: the version created */
    uint64_t count;                 /* ACK: see the K_* list */
    char ref[CTL_STORE_ID_MAX + 1]; /* the id operated on ("" when none) */
} ack_rec;

static void
ack_write(int fd, const ack_rec *r)
{
    const char *p = (const char *)r;
    size_t left = sizeof(*r);
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            _exit(5);
        p += n;
        left -= (size_t)n;
    }
}

/* ---- the child ------------------------------------------------------------ */

static void
fill_state(ctl_store_state *st, const char *owner, const char *name, int32_t *toks, unsigned n)
{
    memset(st, 0, sizeof(*st));
    snprintf(st->owner, sizeof(st->owner), "%s", owner);
    snprintf(st->name, sizeof(st->name), "%s", name);
    memcpy(st->fingerprint, FP, sizeof(FP));
    snprintf(st->family, sizeof(st->family), "rwkv7");
    for (unsigned i = 0; i < n; i++)
        toks[i] = (int32_t)(i * 3 + 1);
    st->tokens = toks;
    st->n_tokens = n;
    st->state_bytes = 4096;
}

/* Picks a random listed state of owner into id; 0 when there is none. */
static int
pick(ctl_store *s, const char *owner, unsigned *seed, char id[CTL_STORE_ID_MAX + 1],
     char blob[WK_SHA256_HEX_LEN])
{
    ctl_store_page pg;
    if (ctl_store_state_list(s, owner, NULL, 1000, &pg, NULL) != WK_OK || pg.n == 0) {
        ctl_store_page_fini(&pg);
        return 0;
    }
    size_t i = rnd(seed) % pg.n;
    snprintf(id, CTL_STORE_ID_MAX + 1, "%s", pg.items[i].id);
    snprintf(blob, WK_SHA256_HEX_LEN, "%s", pg.items[i].blob);
    ctl_store_page_fini(&pg);
    return 1;
}

/* The child: random operations until killed, each logged to logfd. Never returns. */
static void
child_run(const char *dir, unsigned seed, int logfd)
{
    ctl_store *s = NULL;
    wk_diag d = {""};
    ctl_store_config cfg = {.map_size = 256 << 10, .map_size_max = 1u << 30};
    if (ctl_store_open(dir, &cfg, &s, NULL, &d) != WK_OK) {
        fprintf(stderr, "store_crash: child open: %s\n", d.msg);
        _exit(3);
    }
    for (;;) {
        char owner[8], id[CTL_STORE_ID_MAX + 1], blob[WK_SHA256_HEX_LEN], key[64];
        int32_t toks[64];
        ctl_store_state st;
        unsigned op = rnd(&seed) % 100;
        unsigned o = rnd(&seed) % N_OWNERS, nm = rnd(&seed) % N_NAMES;
        snprintf(owner, sizeof(owner), "o%u", o);
        const char *name = NAMES[nm];
        content c = {.k = rnd(&seed) % N_POOL};
        c.len = (uint32_t)pool_len(c.k);
        if (rnd(&seed) % 3 == 0) { /* a third of the contents are new: fresh blob writes */
            c.salted = 1;
            c.salt = rnd(&seed) ^ (unsigned)getpid() << 8;
        }
        unsigned char *data = content_bytes(&c);
        ack_rec r = {.magic = ACK_MAGIC, .phase = PH_BEGIN, .owner = o, .name = nm, .c = c};
        wk_err e = WK_OK;
        uint64_t v = 0, n = 0;
        int logged = 1;
        if (op < 30) { /* create (cold, with bytes) */
            fill_state(&st, owner, name, toks, 1 + rnd(&seed) % 64);
            st.tier = CTL_STORE_TIER_COLD;
            r.kind = K_CREATE;
            r.n_tokens = (uint32_t)st.n_tokens;
            ack_write(logfd, &r);
            e = ctl_store_state_put(s, &st, data, c.len, &v, &d);
        } else if (op < 42) { /* fork: share the parent's blob by reference */
            if (pick(s, owner, &seed, id, blob) && blob[0] != '\0') {
                fill_state(&st, owner, name, toks, 8);
                st.tier = CTL_STORE_TIER_COLD;
                st.op = CTL_STORE_OP_FORK;
                snprintf(st.parent, sizeof(st.parent), "%s", id);
                memcpy(st.blob, blob, sizeof(st.blob));
                r.kind = K_FORK;
                r.n_tokens = 8;
                snprintf(r.ref, sizeof(r.ref), "%s", id);
                ack_write(logfd, &r);
                e = ctl_store_state_put(s, &st, NULL, 0, &v, &d);
            } else {
                logged = 0;
            }
        } else if (op < 50) { /* hot create, then hibernate with new bytes */
            fill_state(&st, owner, name, toks, 4);
            r.kind = K_HOT;
            r.n_tokens = 4;
            ack_write(logfd, &r);
            e = ctl_store_state_put(s, &st, NULL, 0, &v, &d);
            if (e == WK_OK) {
                r.phase = PH_ACK;
                r.version = v;
                ack_write(logfd, &r);
                snprintf(id, sizeof(id), "%s@%llu", name, (unsigned long long)v);
                ctl_store_update u = {.set = CTL_STORE_SET_BLOB | CTL_STORE_SET_TIER,
                                      .tier = CTL_STORE_TIER_COLD,
                                      .blob_data = data,
                                      .blob_len = c.len};
                r = (ack_rec){.magic = ACK_MAGIC, .phase = PH_BEGIN, .kind = K_HIBERNATE,
                              .owner = o, .name = nm, .c = c};
                snprintf(r.ref, sizeof(r.ref), "%s", id);
                ack_write(logfd, &r);
                v = 0;
                e = ctl_store_state_update(s, owner, id, &u, &d);
            }
        } else if (op < 56) { /* replace a state's blob */
            if (pick(s, owner, &seed, id, blob)) {
                ctl_store_update u = {.set = CTL_STORE_SET_BLOB, .blob_data = data,
                                      .blob_len = c.len};
                r.kind = K_REPLACE;
                snprintf(r.ref, sizeof(r.ref), "%s", id);
                ack_write(logfd, &r);
                e = ctl_store_state_update(s, owner, id, &u, &d);
            } else {
                logged = 0;
            }
        } else if (op < 64) { /* rollback */
            if (pick(s, owner, &seed, id, blob)) {
                r.kind = K_ROLLBACK;
                snprintf(r.ref, sizeof(r.ref), "%s", id);
                ack_write(logfd, &r);
                e = ctl_store_state_rollback(s, owner, id, 0, &v, &d);
                if (e == WK_ESTATE) { /* the source has no blob: refused, nothing changed */
                    e = WK_OK;
                    n = 1;
                }
            } else {
                logged = 0;
            }
        } else if (op < 80) { /* delete a version */
            if (pick(s, owner, &seed, id, blob)) {
                r.kind = K_DEL_VER;
                snprintf(r.ref, sizeof(r.ref), "%s", id);
                ack_write(logfd, &r);
                e = ctl_store_state_delete(s, owner, id, &n, &d);
            } else {
                logged = 0;
            }
        } else if (op < 84) { /* delete a whole name */
            r.kind = K_DEL_NAME;
            ack_write(logfd, &r);
            e = ctl_store_state_delete(s, owner, name, &n, &d);
            if (e == WK_ENOENT) {
                e = WK_OK;
                n = 0;
            }
        } else if (op < 90) { /* a blob put nobody references yet (then maybe a record) */
            logged = 0; /* an unreferenced blob is collected by the next open: no claim */
            e = ctl_store_blob_put(s, data, c.len, blob, &d);
            if (e == WK_OK && rnd(&seed) % 2) {
                fill_state(&st, owner, name, toks, 2);
                st.tier = CTL_STORE_TIER_COLD;
                memcpy(st.blob, blob, sizeof(st.blob));
                r.kind = K_BLOB_REF;
                r.n_tokens = 2;
                ack_write(logfd, &r);
                logged = 1;
                e = ctl_store_state_put(s, &st, NULL, 0, &v, &d);
            }
        } else { /* sessions */
            snprintf(key, sizeof(key), "m/%s/%s", owner, name);
            if (rnd(&seed) % 3 == 0) {
                r.kind = K_SESS_DEL;
                ack_write(logfd, &r);
                e = ctl_store_session_delete(s, key, &d);
                n = 1;
                if (e == WK_ENOENT) {
                    e = WK_OK;
                    n = 0;
                }
            } else {
                r.kind = K_SESS_PUT;
                r.c.len = c.len < 5000 ? c.len : 5000;
                ack_write(logfd, &r);
                e = ctl_store_session_put(s, key, data, r.c.len, &d);
            }
        }
        free(data);
        if (e != WK_OK) {
            fprintf(stderr, "store_crash: child op %u: %s: %s\n", op, wk_err_name(e), d.msg);
            _exit(4);
        }
        if (logged) {
            r.phase = PH_ACK;
            r.version = v;
            r.count = n;
            ack_write(logfd, &r);
        }
    }
}

/* ---- the parent's model ---------------------------------------------------- */

/* One state version the store must hold. */
typedef struct mstate {
    uint32_t owner, name;
    uint64_t version;
    uint32_t n_tokens;
    int tier;                          /* ctl_store_tier */
    int op;                            /* ctl_store_op */
    char parent[CTL_STORE_ID_MAX + 1]; /* lineage parent id */
    int has_blob;                      /* c holds the blob's bytes */
    content c;                         /* the blob's bytes */
    char hex[WK_SHA256_HEX_LEN];       /* their SHA-256, computed here */
} mstate;

static mstate *g_m;  /* live state versions */
static size_t g_mn;  /* entries in g_m */
static size_t g_mcap;

/* Highest version ever acknowledged per (owner, name): numbers are never reused. */
static uint64_t hi_version[N_OWNERS][N_NAMES];

/* Sessions: key "m/o<owner>/<name>". */
static struct {
    int live;
    content c;
} g_sess[N_OWNERS][N_NAMES];

static int
name_index(const char *name, size_t len)
{
    for (int i = 0; i < N_NAMES; i++)
        if (strlen(NAMES[i]) == len && strncmp(NAMES[i], name, len) == 0)
            return i;
    return -1;
}

/* Parses "name@version" into indexes; 0 on success. */
static int
id_parse(const char *id, uint32_t *name, uint64_t *version)
{
    const char *at = strrchr(id, '@');
    if (at == NULL)
        return -1;
    int n = name_index(id, (size_t)(at - id));
    if (n < 0)
        return -1;
    *name = (uint32_t)n;
    *version = strtoull(at + 1, NULL, 10);
    return 0;
}

static mstate *
m_find(uint32_t owner, uint32_t name, uint64_t version)
{
    for (size_t i = 0; i < g_mn; i++)
        if (g_m[i].owner == owner && g_m[i].name == name && g_m[i].version == version)
            return &g_m[i];
    return NULL;
}

static mstate *
m_find_id(uint32_t owner, const char *id)
{
    uint32_t name;
    uint64_t version;
    if (id_parse(id, &name, &version) != 0)
        return NULL;
    return m_find(owner, name, version);
}

static void
m_remove(mstate *m)
{
    *m = g_m[--g_mn];
}

/* Adds a version; returns it, or NULL (with a message) when its number was used before. */
static mstate *
m_add(int round, uint32_t owner, uint32_t name, uint64_t version)
{
    if (version <= hi_version[owner][name]) {
        fprintf(stderr, "round %d: o%u/%s@%llu: version not above %llu, seen before\n", round,
                owner, NAMES[name], (unsigned long long)version,
                (unsigned long long)hi_version[owner][name]);
        return NULL;
    }
    hi_version[owner][name] = version;
    if (g_mn == g_mcap) {
        g_mcap = g_mcap ? 2 * g_mcap : 256;
        g_m = realloc(g_m, g_mcap * sizeof(*g_m));
        if (g_m == NULL)
            abort();
    }
    mstate *m = &g_m[g_mn++];
    memset(m, 0, sizeof(*m));
    m->owner = owner;
    m->name = name;
    m->version = version;
    return m;
}

/*
 * Applies one completed store call r to the model; version is the version it
 * created (r->version for an ACK, the one observed for the call in flight).
 * Returns 0, or 1 with a message when the log contradicts the model.
 */
static int
m_apply(int round, const ack_rec *r, uint64_t version)
{
    mstate *src = NULL, *m;
    switch (r->kind) {
    case K_CREATE:
    case K_HOT:
    case K_BLOB_REF:
        if ((m = m_add(round, r->owner, r->name, version)) == NULL)
            return 1;
        m->n_tokens = r->n_tokens;
        m->tier = r->kind == K_HOT ? CTL_STORE_TIER_HOT : CTL_STORE_TIER_COLD;
        m->op = CTL_STORE_OP_CREATE;
        m->has_blob = r->kind != K_HOT;
        m->c = r->c;
        if (m->has_blob)
            content_hex(&m->c, m->hex);
        return 0;
    case K_FORK:
    case K_ROLLBACK:
        if (r->kind == K_ROLLBACK && r->phase == PH_ACK && r->count == 1) { /* refused */
            if ((src = m_find_id(r->owner, r->ref)) == NULL || src->has_blob) {
                fprintf(stderr, "round %d: o%u: rollback to %s refused (no blob), model has %s\n",
                        round, r->owner, r->ref, src ? "its blob" : "no such state");
                return 1;
            }
            return 0;
        }
        if ((src = m_find_id(r->owner, r->ref)) == NULL || !src->has_blob) {
            fprintf(stderr, "round %d: o%u: %s from %s, which the model has no blob for\n",
                    round, r->owner, r->kind == K_FORK ? "fork" : "rollback", r->ref);
            return 1;
        }
        {
            mstate s0 = *src; /* m_add may move the array */
            uint32_t nm = r->kind == K_FORK ? r->name : s0.name;
            if ((m = m_add(round, r->owner, nm, version)) == NULL)
                return 1;
            m->n_tokens = r->kind == K_FORK ? r->n_tokens : s0.n_tokens;
            m->tier = CTL_STORE_TIER_COLD;
            m->op = r->kind == K_FORK ? CTL_STORE_OP_FORK : CTL_STORE_OP_ROLLBACK;
            snprintf(m->parent, sizeof(m->parent), "%s", r->ref);
            m->has_blob = 1;
            m->c = s0.c;
            memcpy(m->hex, s0.hex, sizeof(m->hex));
        }
        return 0;
    case K_HIBERNATE:
    case K_REPLACE:
        if ((m = m_find_id(r->owner, r->ref)) == NULL) {
            fprintf(stderr, "round %d: o%u: update of %s, not in the model\n", round, r->owner,
                    r->ref);
            return 1;
        }
        m->has_blob = 1;
        m->c = r->c;
        content_hex(&m->c, m->hex);
        if (r->kind == K_HIBERNATE)
            m->tier = CTL_STORE_TIER_COLD;
        return 0;
    case K_DEL_VER:
        if ((m = m_find_id(r->owner, r->ref)) == NULL ||
            (r->phase == PH_ACK && r->count != 1)) {
            fprintf(stderr, "round %d: o%u: delete of %s (%llu deleted), model has %s\n", round,
                    r->owner, r->ref, (unsigned long long)r->count, m ? "it" : "none");
            return 1;
        }
        m_remove(m);
        return 0;
    case K_DEL_NAME: {
        uint64_t n = 0;
        for (size_t i = g_mn; i-- > 0;)
            if (g_m[i].owner == r->owner && g_m[i].name == r->name) {
                m_remove(&g_m[i]);
                n++;
            }
        if (r->phase == PH_ACK && n != r->count) {
            fprintf(stderr, "round %d: o%u: delete of %s removed %llu versions, model had %llu\n",
                    round, r->owner, NAMES[r->name], (unsigned long long)r->count,
                    (unsigned long long)n);
            return 1;
        }
        return 0;
    }
    case K_SESS_PUT:
        g_sess[r->owner][r->name].live = 1;
        g_sess[r->owner][r->name].c = r->c;
        return 0;
    case K_SESS_DEL:
        if (r->phase == PH_ACK && (uint64_t)g_sess[r->owner][r->name].live != r->count) {
            fprintf(stderr, "round %d: session m/o%u/%s: delete says %s, model says %s\n", round,
                    r->owner, NAMES[r->name], r->count ? "there" : "absent",
                    g_sess[r->owner][r->name].live ? "there" : "absent");
            return 1;
        }
        g_sess[r->owner][r->name].live = 0;
        return 0;
    }
    fprintf(stderr, "round %d: unknown log record kind %u\n", round, r->kind);
    return 1;
}

/* ---- what the store holds after the reopen ----------------------------------- */

typedef struct actual {
    ctl_store_state *st; /* every listed version, tokens read back */
    size_t n;
    size_t cap;
    int *matched; /* st[i] has a model entry */
} actual;

static void
actual_fini(actual *a)
{
    for (size_t i = 0; i < a->n; i++)
        ctl_store_state_fini(&a->st[i]);
    free(a->st);
    free(a->matched);
    memset(a, 0, sizeof(*a));
}

/* Lists every state and reads each one back with its tokens; 0 on success. */
static int
actual_load(ctl_store *s, int round, actual *a)
{
    char cur[CTL_STORE_CURSOR_MAX] = "";
    wk_diag d = {""};
    memset(a, 0, sizeof(*a));
    do {
        ctl_store_page pg;
        if (ctl_store_state_list(s, NULL, cur, 50, &pg, &d) != WK_OK) {
            fprintf(stderr, "round %d: list: %s\n", round, d.msg);
            return 1;
        }
        for (size_t i = 0; i < pg.n; i++) {
            if (a->n == a->cap) {
                a->cap = a->cap ? 2 * a->cap : 256;
                a->st = realloc(a->st, a->cap * sizeof(*a->st));
                if (a->st == NULL)
                    abort();
            }
            if (ctl_store_state_get(s, pg.items[i].owner, pg.items[i].id, &a->st[a->n], &d) !=
                WK_OK) {
                fprintf(stderr, "round %d: %s/%s listed but not readable: %s\n", round,
                        pg.items[i].owner, pg.items[i].id, d.msg);
                ctl_store_page_fini(&pg);
                return 1;
            }
            a->n++;
        }
        snprintf(cur, sizeof(cur), "%s", pg.next);
        ctl_store_page_fini(&pg);
    } while (cur[0] != '\0');
    a->matched = calloc(a->n + 1, sizeof(int));
    return a->matched == NULL;
}

static ctl_store_state *
actual_find(actual *a, uint32_t owner, uint32_t name, uint64_t version, size_t *idx)
{
    char o[8];
    snprintf(o, sizeof(o), "o%u", owner);
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->st[i].owner, o) == 0 && strcmp(a->st[i].name, NAMES[name]) == 0 &&
            a->st[i].version == version) {
            if (idx != NULL)
                *idx = i;
            return &a->st[i];
        }
    return NULL;
}

/* Reads <dir>/blobs/<hex> itself (not through ctl_store); heap buffer or NULL. */
static unsigned char *
blob_file_read(const char *dir, const char *hex, size_t *len)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/blobs/%s", dir, hex);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    struct stat sb;
    unsigned char *b = NULL;
    if (fstat(fileno(f), &sb) == 0 && (b = malloc((size_t)sb.st_size + 1)) != NULL)
        *len = fread(b, 1, (size_t)sb.st_size, f);
    fclose(f);
    return b;
}

/* Compares one model version with what the store holds; 0 when identical. */
static int
state_check(const char *dir, int round, const mstate *m, const ctl_store_state *x)
{
    const char *want_hex = m->has_blob ? m->hex : "";
    int bad = 0;
#define STATE_EXPECT(cond, ...)                                                                  \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            fprintf(stderr, "round %d: o%u/%s@%llu: ", round, m->owner, NAMES[m->name],          \
                    (unsigned long long)m->version);                                             \
            fprintf(stderr, __VA_ARGS__);                                                        \
            fputc('\n', stderr);                                                                 \
            bad = 1;                                                                             \
        }                                                                                        \
    } while (0)
    STATE_EXPECT(x->n_tokens == m->n_tokens, "%zu tokens, %u written", x->n_tokens, m->n_tokens);
    for (size_t i = 0; i < x->n_tokens && i < m->n_tokens && x->tokens != NULL; i++)
        if (x->tokens[i] != (int32_t)(i * 3 + 1)) {
            STATE_EXPECT(0, "token %zu is %d, %d written", i, x->tokens[i], (int)(i * 3 + 1));
            break;
        }
    STATE_EXPECT((int)x->tier == m->tier, "tier %s, %s written", ctl_store_tier_name(x->tier),
                 ctl_store_tier_name((ctl_store_tier)m->tier));
    STATE_EXPECT((int)x->op == m->op, "op %s, %s written", ctl_store_op_name(x->op),
                 ctl_store_op_name((ctl_store_op)m->op));
    STATE_EXPECT(strcmp(x->parent, m->parent) == 0, "parent '%s', '%s' written", x->parent,
                 m->parent);
    STATE_EXPECT(strcmp(x->fingerprint, FP) == 0 && strcmp(x->family, "rwkv7") == 0 &&
                     x->state_bytes == 4096,
                 "fingerprint/family/state_bytes changed");
    STATE_EXPECT(!x->damaged, "marked damaged");
    STATE_EXPECT(strcmp(x->blob, want_hex) == 0, "blob '%.12s', '%.12s' written", x->blob,
                 want_hex);
    if (m->has_blob && strcmp(x->blob, want_hex) == 0) {
        STATE_EXPECT(x->blob_bytes == m->c.len, "blob_bytes %llu, %u written",
                     (unsigned long long)x->blob_bytes, m->c.len);
        size_t len = 0;
        unsigned char *got = blob_file_read(dir, x->blob, &len);
        unsigned char *want = content_bytes(&m->c);
        STATE_EXPECT(got != NULL, "blob file %.12s missing", x->blob);
        STATE_EXPECT(got == NULL || (len == m->c.len && memcmp(got, want, len) == 0),
                     "blob file %.12s: %zu bytes, not the %u bytes written", x->blob, len,
                     m->c.len);
        free(got);
        free(want);
    }
#undef STATE_EXPECT
    return bad;
}

/* The call in flight at the kill, if it left a trace: applies it to the model. */
static int
inflight_apply(const char *dir, int round, const ack_rec *r, actual *a, ctl_store *s)
{
    wk_diag d = {""};
    switch (r->kind) {
    case K_CREATE:
    case K_HOT:
    case K_BLOB_REF:
    case K_FORK:
    case K_ROLLBACK: {
        uint32_t nm = r->name;
        uint64_t v;
        if (r->kind == K_ROLLBACK && id_parse(r->ref, &nm, &v) != 0)
            return 1;
        /* a version of the name the model does not know: the call's, whole */
        for (size_t i = 0; i < a->n; i++) {
            char o[8];
            snprintf(o, sizeof(o), "o%u", r->owner);
            if (strcmp(a->st[i].owner, o) == 0 && strcmp(a->st[i].name, NAMES[nm]) == 0 &&
                m_find(r->owner, nm, a->st[i].version) == NULL)
                return m_apply(round, r, a->st[i].version);
        }
        return 0;
    }
    case K_HIBERNATE:
    case K_REPLACE: {
        uint32_t nm;
        uint64_t v;
        char want_hex[WK_SHA256_HEX_LEN];
        content_hex(&r->c, want_hex);
        ctl_store_state *x = id_parse(r->ref, &nm, &v) == 0
                                 ? actual_find(a, r->owner, nm, v, NULL)
                                 : NULL;
        if (x != NULL && strcmp(x->blob, want_hex) == 0 &&
            (r->kind == K_REPLACE || x->tier == CTL_STORE_TIER_COLD))
            return m_apply(round, r, 0);
        return 0;
    }
    case K_DEL_VER: {
        uint32_t nm;
        uint64_t v;
        if (id_parse(r->ref, &nm, &v) == 0 && actual_find(a, r->owner, nm, v, NULL) == NULL)
            return m_apply(round, r, 0);
        return 0;
    }
    case K_DEL_NAME: {
        for (size_t i = 0; i < g_mn; i++)
            if (g_m[i].owner == r->owner && g_m[i].name == r->name &&
                actual_find(a, r->owner, r->name, g_m[i].version, NULL) != NULL)
                return 0; /* not applied (all present is checked below) */
        return m_apply(round, r, 0);
    }
    case K_SESS_PUT:
    case K_SESS_DEL: {
        char key[64];
        void *val = NULL;
        size_t len = 0;
        snprintf(key, sizeof(key), "m/o%u/%s", r->owner, NAMES[r->name]);
        wk_err e = ctl_store_session_get(s, key, &val, &len, &d);
        int applied = 0;
        if (r->kind == K_SESS_DEL) {
            applied = e == WK_ENOENT;
        } else if (e == WK_OK && len == r->c.len) {
            unsigned char *want = content_bytes(&r->c);
            applied = memcmp(val, want, len) == 0;
            free(want);
        }
        free(val);
        return applied ? m_apply(round, r, 0) : 0;
    }
    }
    (void)dir;
    return 1;
}

/* The parent's checks after a round; 0 when the store holds exactly the model. */
static int
check_store(const char *dir, const char *logpath, int round, ctl_store_open_stats *ost)
{
    /* 1. replay the acknowledgement log */
    int bad = 0;
    ack_rec inflight = {0}, r;
    int have_inflight = 0;
    size_t n_acked = 0;
    FILE *lf = fopen(logpath, "rb");
    if (lf == NULL) {
        perror(logpath);
        return 1;
    }
    while (fread(&r, sizeof(r), 1, lf) == 1) { /* a cut last record: never started */
        if (r.magic != ACK_MAGIC) {
            fprintf(stderr, "round %d: bad log record\n", round);
            fclose(lf);
            return 1;
        }
        if (r.phase == PH_BEGIN) {
            inflight = r;
            have_inflight = 1;
        } else {
            have_inflight = 0;
            n_acked++;
            if (m_apply(round, &r, r.version) != 0)
                bad = 1;
        }
    }
    fclose(lf);
    if (bad)
        return 1;

    /* 2. reopen and read everything back */
    ctl_store *s = NULL;
    wk_diag d = {""};
    if (ctl_store_open(dir, NULL, &s, ost, &d) != WK_OK) {
        fprintf(stderr, "round %d: reopen: %s\n", round, d.msg);
        return 1;
    }
    actual a;
    if (actual_load(s, round, &a) != 0) {
        actual_fini(&a);
        ctl_store_close(s);
        return 1;
    }
    if (have_inflight && inflight_apply(dir, round, &inflight, &a, s) != 0)
        bad = 1;

    /* 3. every model version is there, identical; nothing else is */
    for (size_t i = 0; i < g_mn; i++) {
        size_t idx;
        ctl_store_state *x = actual_find(&a, g_m[i].owner, g_m[i].name, g_m[i].version, &idx);
        if (x == NULL) {
            fprintf(stderr, "round %d: acknowledged o%u/%s@%llu is gone\n", round, g_m[i].owner,
                    NAMES[g_m[i].name], (unsigned long long)g_m[i].version);
            bad = 1;
            continue;
        }
        a.matched[idx] = 1;
        bad |= state_check(dir, round, &g_m[i], x);
    }
    for (size_t i = 0; i < a.n; i++)
        if (!a.matched[i]) {
            fprintf(stderr, "round %d: %s/%s is there, never acknowledged (op %s)\n", round,
                    a.st[i].owner, a.st[i].id, ctl_store_op_name(a.st[i].op));
            bad = 1;
        }
    actual_fini(&a);

    /* 4. blobs/ holds exactly the referenced blobs, read without ctl_store */
    char blobs[512];
    snprintf(blobs, sizeof(blobs), "%s/blobs", dir);
    DIR *bd = opendir(blobs);
    size_t files = 0;
    if (bd == NULL) {
        perror(blobs);
        bad = 1;
    } else {
        struct dirent *e;
        while ((e = readdir(bd)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            files++;
            int used = 0;
            for (size_t i = 0; i < g_mn && !used; i++)
                used = g_m[i].has_blob && strcmp(g_m[i].hex, e->d_name) == 0;
            if (!used) {
                fprintf(stderr, "round %d: blobs/%s is there, no state holds it\n", round,
                        e->d_name);
                bad = 1;
            }
        }
        closedir(bd);
    }

    /* 5. sessions, bit for bit, both ways */
    ctl_store_kv_page kp;
    size_t n_sess = 0;
    if (ctl_store_session_list(s, "", NULL, 1000, true, &kp, &d) != WK_OK) {
        fprintf(stderr, "round %d: session list: %s\n", round, d.msg);
        bad = 1;
    } else {
        for (size_t i = 0; i < kp.n; i++) {
            unsigned o = 99;
            char nm[32] = "";
            int ni = -1;
            if (sscanf(kp.items[i].key, "m/o%u/%31s", &o, nm) == 2)
                ni = name_index(nm, strlen(nm));
            if (o >= N_OWNERS || ni < 0 || !g_sess[o][ni].live) {
                fprintf(stderr, "round %d: session %s is there, never acknowledged\n", round,
                        kp.items[i].key);
                bad = 1;
                continue;
            }
            n_sess++;
            unsigned char *want = content_bytes(&g_sess[o][ni].c);
            if (kp.items[i].len != g_sess[o][ni].c.len ||
                memcmp(kp.items[i].val, want, kp.items[i].len) != 0) {
                fprintf(stderr, "round %d: session %s: not the value written\n", round,
                        kp.items[i].key);
                bad = 1;
            }
            free(want);
        }
        ctl_store_kv_page_fini(&kp);
        size_t live = 0;
        for (int o = 0; o < N_OWNERS; o++)
            for (int n = 0; n < N_NAMES; n++)
                live += (size_t)g_sess[o][n].live;
        if (live != n_sess) {
            fprintf(stderr, "round %d: %zu acknowledged sessions, %zu there\n", round, live,
                    n_sess);
            bad = 1;
        }
    }

    /* 6. the module's view of itself agrees (a consistency check, not the judge) */
    ctl_store_verify_report vr;
    if (ctl_store_verify(s, true, &vr, &d) != WK_OK) {
        fprintf(stderr, "round %d: verify: %s\n", round, d.msg);
        bad = 1;
    } else if (vr.problems != 0) {
        fprintf(stderr,
                "round %d: verify: bad %llu refs %llu missing %llu corrupt %llu orphans %llu "
                "temps %llu\n",
                round, (unsigned long long)vr.bad_records, (unsigned long long)vr.refs_mismatched,
                (unsigned long long)vr.blobs_missing, (unsigned long long)vr.blobs_corrupt,
                (unsigned long long)vr.orphans, (unsigned long long)vr.temps);
        bad = 1;
    }

    /* 7. the next version of every name is above every version ever acknowledged */
    for (uint32_t o = 0; o < N_OWNERS && !bad; o++) {
        for (uint32_t n = 0; n < N_NAMES; n++) {
            ctl_store_state x;
            int32_t toks[1];
            char owner[8];
            uint64_t v;
            snprintf(owner, sizeof(owner), "o%u", o);
            fill_state(&x, owner, NAMES[n], toks, 1);
            if (ctl_store_state_put(s, &x, NULL, 0, &v, &d) != WK_OK) {
                fprintf(stderr, "round %d: put: %s\n", round, d.msg);
                bad = 1;
                break;
            }
            mstate *m = m_add(round, o, n, v);
            if (m == NULL) {
                bad = 1;
                break;
            }
            m->n_tokens = 1;
            m->tier = CTL_STORE_TIER_HOT;
            m->op = CTL_STORE_OP_CREATE;
        }
    }
    if (getenv("STORE_CRASH_VERBOSE") != NULL)
        printf("round %d: %zu acknowledged calls, in flight: %s; %zu states, %zu blob files, "
               "%zu sessions\n",
               round, n_acked, have_inflight ? "one" : "none", g_mn, files, n_sess);
    ctl_store_close(s);
    return bad;
}

static int
rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int
main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 30;
    unsigned seed = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : (unsigned)time(NULL);
    char dir[256], logpath[300];
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof(dir), "%s/wk_store_crash.XXXXXX", base);
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    /* the log lives beside the data dir, not in it (the store owns its dir) */
    snprintf(logpath, sizeof(logpath), "%s.acklog", dir);
    printf("store_crash: %d rounds, seed %u, dir %s\n", rounds, seed, dir);
    int failed = 0;
    unsigned long long orphans = 0, temps = 0;
    ctl_store_open_stats st = {0};
    for (int round = 0; round < rounds && !failed; round++) {
        unsigned rs = seed + (unsigned)round * 7919u;
        int logfd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
        if (logfd < 0) {
            perror(logpath);
            return 1;
        }
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0)
            child_run(dir, rs, logfd);
        close(logfd);
        struct timespec ts = {0, (long)(10 + rnd(&rs) % 390) * 1000000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        if (!WIFSIGNALED(status)) {
            fprintf(stderr, "round %d: child exited on its own (status %d)\n", round,
                    WIFEXITED(status) ? WEXITSTATUS(status) : -1);
            failed = 1;
            break;
        }
        if (check_store(dir, logpath, round, &st) != 0)
            failed = 1;
        orphans += st.orphans_removed;
        temps += st.temps_removed;
    }
    if (!failed) {
        ctl_store *s = NULL;
        if (ctl_store_open(dir, NULL, &s, &st, NULL) == WK_OK)
            ctl_store_close(s);
        size_t sessions = 0;
        for (int o = 0; o < N_OWNERS; o++)
            for (int n = 0; n < N_NAMES; n++)
                sessions += (size_t)g_sess[o][n].live;
        printf("store_crash: %d rounds passed; the store holds exactly what was acknowledged: "
               "%zu states, %zu sessions (%llu blobs); open collected %llu orphan blobs and %llu "
               "temp files in all\n",
               rounds, g_mn, sessions, (unsigned long long)st.blobs, orphans, temps);
    }
    (void)nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    (void)remove(logpath);
    free(g_m);
    return failed;
}
