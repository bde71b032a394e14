/*
 * store_crash: kills a process that is writing to a ctl_store at random
 * moments and checks that the store it leaves behind is whole.
 *
 * Each round forks a child that opens the store in a temp data dir and loops
 * over random operations (create with a blob, fork by blob reference,
 * hibernate/replace a blob, snapshot, rollback, delete a version or a name,
 * stand-alone blob puts, session puts and deletes, journal appends), with
 * blob contents drawn from a small pool so that blobs are shared, a third
 * of them salted so that fresh blob writes (temp file, fsync, rename) happen
 * too. The parent SIGKILLs the child after a random delay, reopens the store
 * (whose open collects temp files and unreferenced blobs) and checks:
 * ctl_store_verify() finds no problem (records decode, reference counts
 * match, no missing, corrupt, orphan or temp blob), every listed state with a
 * blob reads back and verifies, and the next version of every name is above
 * every version seen in any earlier round (numbers are never reused).
 * Bounded: ROUNDS rounds (default 30) of at most 400 ms each.
 *
 * Usage: store_crash [ROUNDS] [SEED]. Exit 0 when every round passes.
 */
#include <dirent.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl_store.h"

#define N_OWNERS 3 /* owners the child writes for */
#define N_NAMES 5  /* names per owner */
#define N_POOL 12  /* distinct blob contents */

static const char FP[] = "aa00aa00aa00aa00aa00aa00aa00aa00aa00aa00aa00aa00aa00aa00aa00aa00";
static const char *const NAMES[N_NAMES] = {"a", "b", "c.d", "e-f", "g_h"};

static unsigned
rnd(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return (*seed >> 8) & 0xffffff;
}

/* Blob content number k of the pool: a few KiB to ~200 KiB, deterministic. */
static unsigned char *
pool_blob(unsigned k, size_t *len)
{
    size_t n = 1024 + (size_t)k * 17000;
    unsigned char *b = malloc(n);
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(i * 31 + k * 7);
    *len = n;
    return b;
}

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

/* The child: random operations until killed. Never returns. */
static void
child_run(const char *dir, unsigned seed)
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
        size_t len;
        unsigned op = rnd(&seed) % 100;
        snprintf(owner, sizeof(owner), "o%u", rnd(&seed) % N_OWNERS);
        const char *name = NAMES[rnd(&seed) % N_NAMES];
        unsigned char *data = pool_blob(rnd(&seed) % N_POOL, &len);
        if (rnd(&seed) % 3 == 0) { /* a third of the contents are new: fresh blob writes */
            unsigned salt = rnd(&seed) ^ (unsigned)getpid() << 8;
            memcpy(data, &salt, sizeof(salt));
        }
        wk_err e = WK_OK;
        if (op < 30) { /* create (cold, with bytes) */
            fill_state(&st, owner, name, toks, 1 + rnd(&seed) % 64);
            st.tier = CTL_STORE_TIER_COLD;
            e = ctl_store_state_put(s, &st, data, len, NULL, &d);
        } else if (op < 42) { /* fork: share the parent's blob by reference */
            if (pick(s, owner, &seed, id, blob) && blob[0] != '\0') {
                fill_state(&st, owner, name, toks, 8);
                st.tier = CTL_STORE_TIER_COLD;
                st.op = CTL_STORE_OP_FORK;
                snprintf(st.parent, sizeof(st.parent), "%s", id);
                memcpy(st.blob, blob, sizeof(st.blob));
                e = ctl_store_state_put(s, &st, NULL, 0, NULL, &d);
            }
        } else if (op < 50) { /* hot create, then hibernate with new bytes */
            fill_state(&st, owner, name, toks, 4);
            uint64_t v;
            e = ctl_store_state_put(s, &st, NULL, 0, &v, &d);
            if (e == WK_OK) {
                snprintf(id, sizeof(id), "%s@%llu", name, (unsigned long long)v);
                ctl_store_update u = {.set = CTL_STORE_SET_BLOB | CTL_STORE_SET_TIER,
                                      .tier = CTL_STORE_TIER_COLD,
                                      .blob_data = data,
                                      .blob_len = len};
                e = ctl_store_state_update(s, owner, id, &u, &d);
            }
        } else if (op < 56) { /* replace a state's blob */
            if (pick(s, owner, &seed, id, blob)) {
                ctl_store_update u = {.set = CTL_STORE_SET_BLOB, .blob_data = data,
                                      .blob_len = len};
                e = ctl_store_state_update(s, owner, id, &u, &d);
            }
        } else if (op < 64) { /* rollback */
            if (pick(s, owner, &seed, id, blob)) {
                e = ctl_store_state_rollback(s, owner, id, 0, NULL, &d);
                if (e == WK_ESTATE)
                    e = WK_OK;
            }
        } else if (op < 80) { /* delete a version */
            if (pick(s, owner, &seed, id, blob))
                e = ctl_store_state_delete(s, owner, id, NULL, &d);
        } else if (op < 84) { /* delete a whole name */
            e = ctl_store_state_delete(s, owner, name, NULL, &d);
            if (e == WK_ENOENT)
                e = WK_OK;
        } else if (op < 90) { /* a blob put nobody references yet (then maybe a record) */
            e = ctl_store_blob_put(s, data, len, blob, &d);
            if (e == WK_OK && rnd(&seed) % 2) {
                fill_state(&st, owner, name, toks, 2);
                st.tier = CTL_STORE_TIER_COLD;
                memcpy(st.blob, blob, sizeof(st.blob));
                e = ctl_store_state_put(s, &st, NULL, 0, NULL, &d);
            }
        } else if (op < 96) { /* sessions */
            snprintf(key, sizeof(key), "m/%s/%s", owner, name);
            if (rnd(&seed) % 3 == 0) {
                e = ctl_store_session_delete(s, key, &d);
                if (e == WK_ENOENT)
                    e = WK_OK;
            } else {
                e = ctl_store_session_put(s, key, data, len < 5000 ? len : 5000, &d);
            }
        } else { /* journal */
            e = ctl_store_journal_append(s, data, 100, NULL, &d);
        }
        free(data);
        if (e != WK_OK) {
            fprintf(stderr, "store_crash: child op %u: %s: %s\n", op, wk_err_name(e), d.msg);
            _exit(4);
        }
    }
}

/* Highest version seen per (owner, name) so far, to check they never go back. */
static unsigned long long hi_version[N_OWNERS][N_NAMES];

/* The parent's checks on the store a killed child left. Returns 0 when whole. */
static int
check_store(const char *dir, int round, ctl_store_open_stats *st)
{
    ctl_store *s = NULL;
    wk_diag d = {""};
    if (ctl_store_open(dir, NULL, &s, st, &d) != WK_OK) {
        fprintf(stderr, "round %d: reopen: %s\n", round, d.msg);
        return 1;
    }
    int bad = 0;
    ctl_store_verify_report r;
    if (ctl_store_verify(s, true, &r, &d) != WK_OK) {
        fprintf(stderr, "round %d: verify: %s\n", round, d.msg);
        bad = 1;
    } else if (r.problems != 0) {
        fprintf(stderr,
                "round %d: verify: bad %llu refs %llu missing %llu corrupt %llu orphans %llu "
                "temps %llu\n",
                round, (unsigned long long)r.bad_records, (unsigned long long)r.refs_mismatched,
                (unsigned long long)r.blobs_missing, (unsigned long long)r.blobs_corrupt,
                (unsigned long long)r.orphans, (unsigned long long)r.temps);
        bad = 1;
    }
    char cur[CTL_STORE_CURSOR_MAX] = "";
    do {
        ctl_store_page pg;
        if (ctl_store_state_list(s, NULL, cur, 50, &pg, &d) != WK_OK) {
            fprintf(stderr, "round %d: list: %s\n", round, d.msg);
            bad = 1;
            break;
        }
        for (size_t i = 0; i < pg.n; i++) {
            const ctl_store_state *x = &pg.items[i];
            if (x->blob[0] != '\0') {
                void *data;
                size_t len;
                if (ctl_store_blob_get(s, x->blob, &data, &len, &d) != WK_OK) {
                    fprintf(stderr, "round %d: %s/%s: %s\n", round, x->owner, x->id, d.msg);
                    bad = 1;
                } else {
                    if (len != x->blob_bytes) {
                        fprintf(stderr, "round %d: %s/%s: blob_bytes %llu, blob has %zu\n",
                                round, x->owner, x->id, (unsigned long long)x->blob_bytes, len);
                        bad = 1;
                    }
                    free(data);
                }
            } else if (x->tier == CTL_STORE_TIER_COLD) {
                fprintf(stderr, "round %d: %s/%s: cold without a blob\n", round, x->owner, x->id);
                bad = 1;
            }
            int o = x->owner[1] - '0';
            for (int n = 0; n < N_NAMES; n++)
                if (strcmp(NAMES[n], x->name) == 0 && x->version > hi_version[o][n])
                    hi_version[o][n] = x->version;
        }
        snprintf(cur, sizeof(cur), "%s", pg.next);
        ctl_store_page_fini(&pg);
    } while (cur[0] != '\0');
    /* the next version of every name is above every version ever seen */
    for (int o = 0; o < N_OWNERS && !bad; o++) {
        for (int n = 0; n < N_NAMES; n++) {
            ctl_store_state x;
            int32_t toks[1];
            char owner[8];
            uint64_t v;
            snprintf(owner, sizeof(owner), "o%d", o);
            fill_state(&x, owner, NAMES[n], toks, 1);
            if (ctl_store_state_put(s, &x, NULL, 0, &v, &d) != WK_OK) {
                fprintf(stderr, "round %d: put: %s\n", round, d.msg);
                bad = 1;
                break;
            }
            if (v <= hi_version[o][n]) {
                fprintf(stderr, "round %d: %s/%s got version %llu, %llu was seen before\n",
                        round, owner, NAMES[n], (unsigned long long)v, hi_version[o][n]);
                bad = 1;
            }
            hi_version[o][n] = v;
        }
    }
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
    char dir[256];
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof(dir), "%s/wk_store_crash.XXXXXX", base);
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    printf("store_crash: %d rounds, seed %u, dir %s\n", rounds, seed, dir);
    int failed = 0;
    unsigned long long orphans = 0, temps = 0;
    ctl_store_open_stats st = {0};
    for (int round = 0; round < rounds && !failed; round++) {
        unsigned rs = seed + (unsigned)round * 7919u;
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0)
            child_run(dir, rs);
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
        if (check_store(dir, round, &st) != 0)
            failed = 1;
        orphans += st.orphans_removed;
        temps += st.temps_removed;
    }
    if (!failed) {
        ctl_store *s = NULL;
        if (ctl_store_open(dir, NULL, &s, &st, NULL) == WK_OK)
            ctl_store_close(s);
        printf("store_crash: %d rounds passed; last open saw %llu states, %llu blobs; "
               "open collected %llu orphan blobs and %llu temp files in all\n",
               rounds, (unsigned long long)st.states, (unsigned long long)st.blobs, orphans,
               temps);
    }
    (void)nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return failed;
}
