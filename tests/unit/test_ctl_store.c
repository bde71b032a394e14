/*
 * Unit tests for ctl_store: names, owners and ids; versions that are
 * append-only and never reused after a delete; owner isolation (another
 * owner's state is WK_ENOENT everywhere); blobs that are corrupted,
 * truncated or missing; reference-counted blob collection on delete and
 * update; pagination with cursors; rollback; the session table; a store
 * left with an earlier build's journal database; persistence across reopen
 * and the single-process lock; collection of orphans and temp files on
 * open; map growth from a tiny map and the map ceiling; ENOSPC and other
 * write failures through the write hook and, when the sandbox allows a
 * private mount namespace, on a real full tmpfs; a schema from the future;
 * concurrent writers; and ctl_store_verify().
 * Every test works in its own temp directory.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <lmdb.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl_store.h"
#include "ctl_store_priv.h"

static const char FP[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/* Per-test fixture: a temp data dir and the store open on it. */
typedef struct fx {
    char dir[256];  /* data directory */
    ctl_store *s;   /* open store, or NULL */
} fx;

static int
rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void
rm_tree(const char *dir)
{
    (void)nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static ctl_store *
open_store(const char *dir, const ctl_store_config *cfg, ctl_store_open_stats *st)
{
    ctl_store *s = NULL;
    wk_diag d = {""};
    wk_err e = ctl_store_open(dir, cfg, &s, st, &d);
    if (e != WK_OK)
        fail_msg("open %s: %s: %s", dir, wk_err_name(e), d.msg);
    return s;
}

static int
setup(void **state)
{
    fx *f = calloc(1, sizeof(*f));
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(f->dir, sizeof(f->dir), "%s/wk_store_test.XXXXXX", base);
    if (mkdtemp(f->dir) == NULL)
        return -1;
    f->s = open_store(f->dir, NULL, NULL);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    fx *f = *state;
    ctl_store_close(f->s);
    rm_tree(f->dir);
    free(f);
    return 0;
}

static void
reopen(fx *f, ctl_store_open_stats *st)
{
    ctl_store_close(f->s);
    f->s = NULL;
    f->s = open_store(f->dir, NULL, st);
}

/* Fills a put input for owner/name with n tokens starting at t0. */
static void
mk_state(ctl_store_state *st, const char *owner, const char *name, int32_t *toks, size_t n,
         int32_t t0)
{
    memset(st, 0, sizeof(*st));
    snprintf(st->owner, sizeof(st->owner), "%s", owner);
    snprintf(st->name, sizeof(st->name), "%s", name);
    memcpy(st->fingerprint, FP, sizeof(FP));
    snprintf(st->family, sizeof(st->family), "rwkv7");
    for (size_t i = 0; i < n; i++)
        toks[i] = t0 + (int32_t)i;
    st->tokens = toks;
    st->n_tokens = n;
    st->op = CTL_STORE_OP_CREATE;
    st->tier = CTL_STORE_TIER_HOT;
    st->state_bytes = 4096;
}

/* Puts a hot state without a blob; returns its version. */
static uint64_t
put_hot(ctl_store *s, const char *owner, const char *name)
{
    ctl_store_state st;
    int32_t toks[3];
    uint64_t v = 0;
    wk_diag d = {""};
    mk_state(&st, owner, name, toks, 3, 10);
    wk_err e = ctl_store_state_put(s, &st, NULL, 0, &v, &d);
    if (e != WK_OK)
        fail_msg("put %s/%s: %s", owner, name, d.msg);
    return v;
}

/* Puts a cold state with blob bytes; returns its version and the blob hex. */
static uint64_t
put_cold(ctl_store *s, const char *owner, const char *name, const void *blob, size_t len,
         char hex[WK_SHA256_HEX_LEN])
{
    ctl_store_state st;
    int32_t toks[5];
    uint64_t v = 0;
    wk_diag d = {""};
    mk_state(&st, owner, name, toks, 5, 100);
    st.tier = CTL_STORE_TIER_COLD;
    wk_err e = ctl_store_state_put(s, &st, blob, len, &v, &d);
    if (e != WK_OK)
        fail_msg("put cold %s/%s: %s", owner, name, d.msg);
    if (hex != NULL)
        wk_sha256_hex(blob, len, hex);
    return v;
}

static bool
blob_file_exists(const fx *f, const char *hex)
{
    char p[512];
    struct stat sb;
    snprintf(p, sizeof(p), "%s/blobs/%s", f->dir, hex);
    return stat(p, &sb) == 0;
}

static size_t
blob_dir_count(const char *dir)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/blobs", dir);
    DIR *dd = opendir(p);
    size_t n = 0;
    struct dirent *e;
    assert_non_null(dd);
    while ((e = readdir(dd)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(dd);
    return n;
}

static void
assert_verified(ctl_store *s)
{
    ctl_store_verify_report r;
    assert_int_equal(ctl_store_verify(s, true, &r, NULL), WK_OK);
    if (r.problems != 0)
        fail_msg("verify: bad %llu refs %llu missing %llu corrupt %llu orphans %llu temps %llu",
                 (unsigned long long)r.bad_records, (unsigned long long)r.refs_mismatched,
                 (unsigned long long)r.blobs_missing, (unsigned long long)r.blobs_corrupt,
                 (unsigned long long)r.orphans, (unsigned long long)r.temps);
}

static void
expect_err(wk_err got, const wk_diag *d, wk_err want, const char *msg)
{
    if (got != want || (msg != NULL && strstr(d->msg, msg) == NULL))
        fail_msg("got %s '%s', want %s '%s'", wk_err_name(got), d->msg, wk_err_name(want),
                 msg ? msg : "");
}

/* ---- tests ------------------------------------------------------------------ */

static void
test_names_and_ids(void **state)
{
    (void)state;
    char name[CTL_STORE_NAME_MAX + 1];
    uint64_t v;
    wk_diag d = {""};
    assert_int_equal(ctl_store_name_check("Chat-1.v_2", NULL), WK_OK);
    char n64[65];
    memset(n64, 'a', 64);
    n64[64] = '\0';
    assert_int_equal(ctl_store_name_check(n64, NULL), WK_OK);
    char n65[66];
    memset(n65, 'a', 65);
    n65[65] = '\0';
    expect_err(ctl_store_name_check(n65, &d), &d, WK_EINVAL, "longer than 64");
    expect_err(ctl_store_name_check("", &d), &d, WK_EINVAL, "[A-Za-z0-9._-]");
    expect_err(ctl_store_name_check("a/b", &d), &d, WK_EINVAL, "[A-Za-z0-9._-]");
    expect_err(ctl_store_name_check("a@1", &d), &d, WK_EINVAL, "[A-Za-z0-9._-]");
    expect_err(ctl_store_name_check("a b", &d), &d, WK_EINVAL, "[A-Za-z0-9._-]");
    assert_int_equal(ctl_store_name_check(NULL, NULL), WK_EINVAL);
    assert_int_equal(ctl_store_owner_check("user 1 <x@y>", NULL), WK_OK);
    expect_err(ctl_store_owner_check("a\nb", &d), &d, WK_EINVAL, "printable");
    expect_err(ctl_store_owner_check("", &d), &d, WK_EINVAL, "1..128");
    char o129[130];
    memset(o129, 'o', 129);
    o129[129] = '\0';
    expect_err(ctl_store_owner_check(o129, &d), &d, WK_EINVAL, "longer than 128");
    assert_int_equal(ctl_store_id_parse("chat", name, &v, NULL), WK_OK);
    assert_string_equal(name, "chat");
    assert_int_equal(v, 0);
    assert_int_equal(ctl_store_id_parse("chat@17", name, &v, NULL), WK_OK);
    assert_int_equal(v, 17);
    assert_int_equal(ctl_store_id_parse("chat@0", name, &v, NULL), WK_EINVAL);
    assert_int_equal(ctl_store_id_parse("chat@01", name, &v, NULL), WK_EINVAL);
    assert_int_equal(ctl_store_id_parse("chat@", name, &v, NULL), WK_EINVAL);
    assert_int_equal(ctl_store_id_parse("chat@1x", name, &v, NULL), WK_EINVAL);
    assert_int_equal(ctl_store_id_parse("chat@1@2", name, &v, NULL), WK_EINVAL);
    assert_int_equal(ctl_store_id_parse("@3", name, &v, NULL), WK_EINVAL);
    assert_int_equal(ctl_store_id_parse("../x@3", name, &v, NULL), WK_EINVAL);
    assert_int_equal(ctl_store_id_parse("c@99999999999999999999", name, &v, NULL), WK_EINVAL);
    ctl_store_tier t;
    ctl_store_op op;
    assert_int_equal(ctl_store_tier_parse("warm", &t, NULL), WK_OK);
    assert_int_equal(t, CTL_STORE_TIER_WARM);
    assert_int_equal(ctl_store_tier_parse("tepid", &t, NULL), WK_EINVAL);
    assert_int_equal(ctl_store_op_parse("rollback", &op, NULL), WK_OK);
    assert_int_equal(op, CTL_STORE_OP_ROLLBACK);
    assert_int_equal(ctl_store_op_parse("merge", &op, NULL), WK_EINVAL);
    assert_string_equal(ctl_store_tier_name(CTL_STORE_TIER_COLD), "cold");
    assert_string_equal(ctl_store_op_name(CTL_STORE_OP_SESSION), "session");
    assert_string_equal(ctl_store_op_name((ctl_store_op)42), "?");
}

static void
test_put_get_fields(void **state)
{
    fx *f = *state;
    ctl_store_state in, out;
    int32_t toks[6];
    uint64_t v;
    char hex[WK_SHA256_HEX_LEN], td[WK_SHA256_HEX_LEN];
    const char blob[] = "state bytes";
    mk_state(&in, "alice", "chat", toks, 6, 7);
    in.op = CTL_STORE_OP_FORK;
    snprintf(in.parent, sizeof(in.parent), "base@2");
    in.tier = CTL_STORE_TIER_WARM;
    in.created_ms = 1000;
    in.used_ms = 2000;
    assert_int_equal(ctl_store_state_put(f->s, &in, blob, sizeof(blob), &v, NULL), WK_OK);
    assert_int_equal(v, 1);
    assert_int_equal(ctl_store_state_get(f->s, "alice", "chat@1", &out, NULL), WK_OK);
    wk_sha256_hex(blob, sizeof(blob), hex);
    assert_int_equal(wk_sha256_token_ids_hex(toks, 6, td), WK_OK);
    assert_string_equal(out.owner, "alice");
    assert_string_equal(out.name, "chat");
    assert_string_equal(out.id, "chat@1");
    assert_int_equal(out.version, 1);
    assert_string_equal(out.fingerprint, FP);
    assert_string_equal(out.family, "rwkv7");
    assert_int_equal(out.n_tokens, 6);
    assert_memory_equal(out.tokens, toks, sizeof(toks));
    assert_string_equal(out.token_digest, td);
    assert_string_equal(out.parent, "base@2");
    assert_int_equal(out.op, CTL_STORE_OP_FORK);
    assert_int_equal(out.tier, CTL_STORE_TIER_WARM);
    assert_string_equal(out.blob, hex);
    assert_int_equal(out.blob_bytes, sizeof(blob));
    assert_int_equal(out.state_bytes, 4096);
    assert_int_equal(out.created_ms, 1000);
    assert_int_equal(out.used_ms, 2000);
    assert_false(out.damaged);
    ctl_store_state_fini(&out);
    ctl_store_state_fini(&out);
    ctl_store_state_fini(NULL);
    void *data;
    size_t len;
    assert_int_equal(ctl_store_blob_get(f->s, hex, &data, &len, NULL), WK_OK);
    assert_int_equal(len, sizeof(blob));
    assert_memory_equal(data, blob, len);
    free(data);
    /* zero timestamps mean now; zero tokens are fine */
    mk_state(&in, "alice", "empty", toks, 0, 0);
    assert_int_equal(ctl_store_state_put(f->s, &in, NULL, 0, NULL, NULL), WK_OK);
    assert_int_equal(ctl_store_state_get(f->s, "alice", "empty", &out, NULL), WK_OK);
    assert_true(out.created_ms > 1600000000000LL);
    assert_int_equal(out.n_tokens, 0);
    assert_null(out.tokens);
    assert_string_equal(out.token_digest,
                        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    ctl_store_state_fini(&out);
    assert_verified(f->s);
}

static void
test_versions_append_only(void **state)
{
    fx *f = *state;
    ctl_store_state out;
    uint64_t n;
    wk_diag d = {""};
    assert_int_equal(put_hot(f->s, "u", "chat"), 1);
    assert_int_equal(put_hot(f->s, "u", "chat"), 2);
    assert_int_equal(put_hot(f->s, "u", "chat"), 3);
    assert_int_equal(put_hot(f->s, "u", "chat.b"), 1);
    assert_int_equal(ctl_store_state_get(f->s, "u", "chat", &out, NULL), WK_OK);
    assert_string_equal(out.id, "chat@3");
    ctl_store_state_fini(&out);
    assert_int_equal(ctl_store_state_delete(f->s, "u", "chat@3", &n, NULL), WK_OK);
    assert_int_equal(n, 1);
    expect_err(ctl_store_state_get(f->s, "u", "chat@3", &out, &d), &d, WK_ENOENT, "chat@3");
    assert_int_equal(ctl_store_state_get(f->s, "u", "chat", &out, NULL), WK_OK);
    assert_string_equal(out.id, "chat@2");
    ctl_store_state_fini(&out);
    /* the deleted number is not reused */
    assert_int_equal(put_hot(f->s, "u", "chat"), 4);
    expect_err(ctl_store_state_delete(f->s, "u", "chat@3", &n, &d), &d, WK_ENOENT, "chat@3");
    /* delete every version, then the counter carries on */
    assert_int_equal(ctl_store_state_delete(f->s, "u", "chat", &n, NULL), WK_OK);
    assert_int_equal(n, 3);
    expect_err(ctl_store_state_get(f->s, "u", "chat", &out, &d), &d, WK_ENOENT, "no state");
    expect_err(ctl_store_state_delete(f->s, "u", "chat", &n, &d), &d, WK_ENOENT, "no state");
    assert_int_equal(put_hot(f->s, "u", "chat"), 5);
    /* the neighbour name "chat.b" was untouched */
    assert_int_equal(ctl_store_state_get(f->s, "u", "chat.b@1", &out, NULL), WK_OK);
    ctl_store_state_fini(&out);
    reopen(f, NULL);
    assert_int_equal(put_hot(f->s, "u", "chat"), 6);
    assert_int_equal(ctl_store_state_count(f->s, "u", &n, NULL), WK_OK);
    assert_int_equal(n, 3);
}

static void
test_owner_isolation(void **state)
{
    fx *f = *state;
    ctl_store_state out;
    ctl_store_page pg;
    uint64_t n, v;
    char hex[WK_SHA256_HEX_LEN];
    wk_diag d = {""};
    put_cold(f->s, "alice", "secret", "abc", 3, hex);
    put_hot(f->s, "alice", "other");
    put_hot(f->s, "bob", "mine");
    expect_err(ctl_store_state_get(f->s, "bob", "secret", &out, &d), &d, WK_ENOENT, NULL);
    expect_err(ctl_store_state_get(f->s, "bob", "secret@1", &out, &d), &d, WK_ENOENT, NULL);
    expect_err(ctl_store_state_delete(f->s, "bob", "secret@1", &n, &d), &d, WK_ENOENT, NULL);
    expect_err(ctl_store_state_delete(f->s, "bob", "secret", &n, &d), &d, WK_ENOENT, NULL);
    expect_err(ctl_store_state_rollback(f->s, "bob", "secret@1", 0, &v, &d), &d, WK_ENOENT,
               NULL);
    ctl_store_update u = {.set = CTL_STORE_SET_DAMAGED, .damaged = true};
    expect_err(ctl_store_state_update(f->s, "bob", "secret@1", &u, &d), &d, WK_ENOENT, NULL);
    /* a different owner that is a prefix of the other must not match either */
    expect_err(ctl_store_state_get(f->s, "alic", "secret", &out, &d), &d, WK_ENOENT, NULL);
    assert_int_equal(ctl_store_state_versions(f->s, "bob", "secret", NULL, 0, &pg, NULL), WK_OK);
    assert_int_equal(pg.n, 0);
    ctl_store_page_fini(&pg);
    assert_int_equal(ctl_store_state_list(f->s, "bob", NULL, 0, &pg, NULL), WK_OK);
    assert_int_equal(pg.n, 1);
    assert_string_equal(pg.items[0].id, "mine@1");
    ctl_store_page_fini(&pg);
    assert_int_equal(ctl_store_state_count(f->s, "bob", &n, NULL), WK_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ctl_store_state_count(f->s, "alice", &n, NULL), WK_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ctl_store_state_count(f->s, "carol", &n, NULL), WK_OK);
    assert_int_equal(n, 0);
    /* alice's cursor is refused in bob's listing */
    assert_int_equal(ctl_store_state_list(f->s, "alice", NULL, 1, &pg, NULL), WK_OK);
    assert_string_not_equal(pg.next, "");
    char cur[CTL_STORE_CURSOR_MAX];
    memcpy(cur, pg.next, sizeof(cur));
    ctl_store_page_fini(&pg);
    ctl_store_page pg2;
    expect_err(ctl_store_state_list(f->s, "bob", cur, 1, &pg2, &d), &d, WK_EINVAL,
               "does not belong");
    /* the admin listing sees both */
    assert_int_equal(ctl_store_state_list(f->s, NULL, NULL, 0, &pg, NULL), WK_OK);
    assert_int_equal(pg.n, 3);
    ctl_store_page_fini(&pg);
    /* alice still has everything */
    assert_int_equal(ctl_store_state_get(f->s, "alice", "secret", &out, NULL), WK_OK);
    assert_false(out.damaged);
    ctl_store_state_fini(&out);
    assert_true(blob_file_exists(f, hex));
}

/* Rewrites the blob file hex with a byte flipped, or truncated to keep bytes. */
static void
damage_blob(const fx *f, const char *hex, long flip_at, long keep)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/blobs/%s", f->dir, hex);
    int fd = open(p, O_RDWR);
    assert_true(fd >= 0);
    if (flip_at >= 0) {
        unsigned char c;
        assert_int_equal(pread(fd, &c, 1, flip_at), 1);
        c ^= 0x20;
        assert_int_equal(pwrite(fd, &c, 1, flip_at), 1);
    }
    if (keep >= 0)
        assert_int_equal(ftruncate(fd, keep), 0);
    close(fd);
}

static void
test_blob_damage(void **state)
{
    fx *f = *state;
    char hex[WK_SHA256_HEX_LEN], hex2[WK_SHA256_HEX_LEN];
    uint8_t data[3000];
    void *got;
    size_t len;
    wk_diag d = {""};
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 7);
    assert_int_equal(ctl_store_blob_put(f->s, data, sizeof(data), hex, NULL), WK_OK);
    assert_int_equal(ctl_store_blob_get(f->s, hex, &got, &len, NULL), WK_OK);
    free(got);
    damage_blob(f, hex, 1234, -1);
    expect_err(ctl_store_blob_get(f->s, hex, &got, &len, &d), &d, WK_ECORRUPT, "verification");
    /* putting the same content again repairs the file */
    assert_int_equal(ctl_store_blob_put(f->s, data, sizeof(data), hex2, NULL), WK_OK);
    assert_string_equal(hex, hex2);
    assert_int_equal(ctl_store_blob_get(f->s, hex, &got, &len, NULL), WK_OK);
    assert_memory_equal(got, data, sizeof(data));
    free(got);
    damage_blob(f, hex, -1, 2999);
    expect_err(ctl_store_blob_get(f->s, hex, &got, &len, &d), &d, WK_ECORRUPT, "verification");
    damage_blob(f, hex, -1, 0);
    expect_err(ctl_store_blob_get(f->s, hex, &got, &len, &d), &d, WK_ECORRUPT, "verification");
    char p[512];
    snprintf(p, sizeof(p), "%s/blobs/%s", f->dir, hex);
    assert_int_equal(unlink(p), 0);
    expect_err(ctl_store_blob_get(f->s, hex, &got, &len, &d), &d, WK_ENOENT, "missing");
    /* names that are not exactly 64 lowercase hex digits */
    const char *bad[] = {"", "abc", "../../etc/passwd",
                         "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
                         "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0",
                         "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde/",
                         NULL};
    for (int i = 0; bad[i] != NULL; i++)
        expect_err(ctl_store_blob_get(f->s, bad[i], &got, &len, &d), &d, WK_EINVAL, "64");
    assert_int_equal(ctl_store_blob_get(f->s, NULL, &got, &len, NULL), WK_EINVAL);
    /* the empty blob is a blob */
    assert_int_equal(ctl_store_blob_put(f->s, "", 0, hex, NULL), WK_OK);
    assert_int_equal(ctl_store_blob_get(f->s, hex, &got, &len, NULL), WK_OK);
    assert_int_equal(len, 0);
    free(got);
}

static void
test_bad_records(void **state)
{
    fx *f = *state;
    ctl_store_state in;
    int32_t toks[4];
    wk_diag d = {""};
#define BAD(code, msg)                                                                         \
    expect_err(ctl_store_state_put(f->s, &in, NULL, 0, NULL, &d), &d, code, msg)
    mk_state(&in, "u", "bad/name", toks, 4, 0);
    BAD(WK_EINVAL, "[A-Za-z0-9._-]");
    mk_state(&in, "u", "", toks, 4, 0);
    BAD(WK_EINVAL, "state name");
    mk_state(&in, "u", "x", toks, 4, 0);
    memset(in.name, 'n', sizeof(in.name));
    BAD(WK_EINVAL, "longer than 64");
    mk_state(&in, "u\t", "x", toks, 4, 0);
    BAD(WK_EINVAL, "printable");
    mk_state(&in, "u", "x", toks, 4, 0);
    in.fingerprint[10] = 'G';
    BAD(WK_EINVAL, "fingerprint");
    mk_state(&in, "u", "x", toks, 4, 0);
    snprintf(in.family, sizeof(in.family), "RWKV");
    BAD(WK_EINVAL, "family");
    mk_state(&in, "u", "x", toks, 4, 0);
    toks[2] = -1;
    BAD(WK_EINVAL, "token 2 is negative");
    mk_state(&in, "u", "x", toks, 4, 0);
    in.n_tokens = CTL_STORE_MAX_TOKENS + 1;
    BAD(WK_ETOOBIG, "over the limit");
    mk_state(&in, "u", "x", toks, 4, 0);
    snprintf(in.parent, sizeof(in.parent), "p@0");
    BAD(WK_EINVAL, "parent");
    mk_state(&in, "u", "x", toks, 4, 0);
    snprintf(in.parent, sizeof(in.parent), "p");
    BAD(WK_EINVAL, "parent");
    mk_state(&in, "u", "x", toks, 4, 0);
    in.tier = CTL_STORE_TIER_COLD;
    BAD(WK_EINVAL, "cold state needs a blob");
    mk_state(&in, "u", "x", toks, 4, 0);
    in.tier = (ctl_store_tier)7;
    BAD(WK_EINVAL, "tier 7");
    mk_state(&in, "u", "x", toks, 4, 0);
    in.op = (ctl_store_op)9;
    BAD(WK_EINVAL, "operation 9");
    mk_state(&in, "u", "x", toks, 4, 0);
    memcpy(in.token_digest, FP, sizeof(FP));
    BAD(WK_EINVAL, "token digest");
    mk_state(&in, "u", "x", toks, 4, 0);
    snprintf(in.blob, sizeof(in.blob), "nothex");
    BAD(WK_EINVAL, "blob");
    mk_state(&in, "u", "x", toks, 4, 0);
    memcpy(in.blob, FP, sizeof(FP));
    BAD(WK_ENOENT, "not in the store");
    mk_state(&in, "u", "x", toks, 4, 0);
    memcpy(in.blob, FP, sizeof(FP));
    expect_err(ctl_store_state_put(f->s, &in, "zz", 2, NULL, &d), &d, WK_EINVAL,
               "does not match the blob bytes");
#undef BAD
    /* nothing was stored by any of these */
    ctl_store_page pg;
    assert_int_equal(ctl_store_state_list(f->s, NULL, NULL, 0, &pg, NULL), WK_OK);
    assert_int_equal(pg.n, 0);
    ctl_store_page_fini(&pg);
    assert_int_equal(blob_dir_count(f->dir), 0);
    assert_verified(f->s);
}

static void
test_pagination(void **state)
{
    fx *f = *state;
    ctl_store_page pg;
    char cur[CTL_STORE_CURSOR_MAX] = "";
    char seen[64][CTL_STORE_ID_MAX + 1];
    size_t total = 0;
    wk_diag d = {""};
    const char *names[] = {"a", "b", "b.x", "c", "zz"};
    for (int i = 0; i < 25; i++)
        put_hot(f->s, "pager", names[i % 5]);
    put_hot(f->s, "pager2", "a");
    put_hot(f->s, "pagep", "a");
    for (int pages = 0;; pages++) {
        assert_true(pages < 10);
        assert_int_equal(ctl_store_state_list(f->s, "pager", cur, 7, &pg, NULL), WK_OK);
        for (size_t i = 0; i < pg.n; i++) {
            assert_string_equal(pg.items[i].owner, "pager");
            assert_null(pg.items[i].tokens);
            assert_int_equal(pg.items[i].n_tokens, 3);
            snprintf(seen[total++], sizeof(seen[0]), "%s", pg.items[i].id);
        }
        memcpy(cur, pg.next, sizeof(cur));
        size_t n = pg.n;
        ctl_store_page_fini(&pg);
        if (cur[0] == '\0') {
            assert_int_equal(n, 4);
            break;
        }
        assert_int_equal(n, 7);
    }
    assert_int_equal(total, 25);
    /* (name, version) order: a@1..5, b@1..5, b.x@1..5, c@..., zz@... */
    assert_string_equal(seen[0], "a@1");
    assert_string_equal(seen[4], "a@5");
    assert_string_equal(seen[5], "b@1");
    assert_string_equal(seen[10], "b.x@1");
    assert_string_equal(seen[24], "zz@5");
    /* an exact page leaves no next cursor */
    assert_int_equal(ctl_store_state_versions(f->s, "pager", "b", NULL, 5, &pg, NULL), WK_OK);
    assert_int_equal(pg.n, 5);
    assert_string_equal(pg.next, "");
    assert_string_equal(pg.items[4].id, "b@5");
    ctl_store_page_fini(&pg);
    assert_int_equal(ctl_store_state_versions(f->s, "pager", "b", NULL, 2, &pg, NULL), WK_OK);
    assert_int_equal(pg.n, 2);
    memcpy(cur, pg.next, sizeof(cur));
    ctl_store_page_fini(&pg);
    assert_int_equal(ctl_store_state_versions(f->s, "pager", "b", cur, 100, &pg, NULL), WK_OK);
    assert_int_equal(pg.n, 3);
    assert_string_equal(pg.items[0].id, "b@3");
    ctl_store_page_fini(&pg);
    /* a version cursor used on another name is refused */
    expect_err(ctl_store_state_versions(f->s, "pager", "c", cur, 0, &pg, &d), &d, WK_EINVAL,
               "does not belong");
    /* a cursor whose record was deleted still continues after it */
    assert_int_equal(ctl_store_state_delete(f->s, "pager", "b@2", NULL, NULL), WK_OK);
    assert_int_equal(ctl_store_state_versions(f->s, "pager", "b", cur, 100, &pg, NULL), WK_OK);
    assert_int_equal(pg.n, 3);
    ctl_store_page_fini(&pg);
    expect_err(ctl_store_state_list(f->s, "pager", "xyz", 0, &pg, &d), &d, WK_EINVAL,
               "malformed");
    expect_err(ctl_store_state_list(f->s, "pager", "abc", 0, &pg, &d), &d, WK_EINVAL,
               "malformed");
    /* admin listing over every owner, in owner order */
    assert_int_equal(ctl_store_state_list(f->s, NULL, NULL, 1000, &pg, NULL), WK_OK);
    assert_int_equal(pg.n, 26);
    assert_string_equal(pg.items[0].owner, "pagep");
    assert_string_equal(pg.items[25].owner, "pager2");
    ctl_store_page_fini(&pg);
    ctl_store_page_fini(&pg);
    ctl_store_page_fini(NULL);
}

static void
test_rollback(void **state)
{
    fx *f = *state;
    ctl_store_state out, in;
    int32_t toks[2] = {42, 43};
    uint64_t v;
    char h1[WK_SHA256_HEX_LEN], h2[WK_SHA256_HEX_LEN];
    wk_diag d = {""};
    assert_int_equal(put_cold(f->s, "u", "doc", "one", 3, h1), 1);
    mk_state(&in, "u", "doc", toks, 2, 42);
    in.op = CTL_STORE_OP_SNAPSHOT;
    in.tier = CTL_STORE_TIER_COLD;
    assert_int_equal(ctl_store_state_put(f->s, &in, "two", 3, &v, NULL), WK_OK);
    assert_int_equal(v, 2);
    wk_sha256_hex("two", 3, h2);
    assert_int_equal(ctl_store_state_rollback(f->s, "u", "doc@1", 5555, &v, NULL), WK_OK);
    assert_int_equal(v, 3);
    assert_int_equal(ctl_store_state_get(f->s, "u", "doc", &out, NULL), WK_OK);
    assert_string_equal(out.id, "doc@3");
    assert_int_equal(out.op, CTL_STORE_OP_ROLLBACK);
    assert_string_equal(out.parent, "doc@1");
    assert_string_equal(out.blob, h1);
    assert_int_equal(out.tier, CTL_STORE_TIER_COLD);
    assert_int_equal(out.n_tokens, 5);
    assert_int_equal(out.tokens[0], 100);
    assert_int_equal(out.created_ms, 5555);
    ctl_store_state_fini(&out);
    /* the old versions are untouched */
    assert_int_equal(ctl_store_state_get(f->s, "u", "doc@2", &out, NULL), WK_OK);
    assert_string_equal(out.blob, h2);
    ctl_store_state_fini(&out);
    /* the shared blob survives deleting the original */
    assert_int_equal(ctl_store_state_delete(f->s, "u", "doc@1", NULL, NULL), WK_OK);
    assert_true(blob_file_exists(f, h1));
    assert_verified(f->s);
    /* rolling back "doc" (the latest) is allowed and makes doc@4 */
    assert_int_equal(ctl_store_state_rollback(f->s, "u", "doc", 0, &v, NULL), WK_OK);
    assert_int_equal(v, 4);
    /* a hot state without a blob, or a damaged one, cannot be rolled back to */
    put_hot(f->s, "u", "live");
    expect_err(ctl_store_state_rollback(f->s, "u", "live@1", 0, &v, &d), &d, WK_ESTATE,
               "no stored blob");
    ctl_store_update u = {.set = CTL_STORE_SET_DAMAGED, .damaged = true};
    assert_int_equal(ctl_store_state_update(f->s, "u", "doc@2", &u, NULL), WK_OK);
    expect_err(ctl_store_state_rollback(f->s, "u", "doc@2", 0, &v, &d), &d, WK_ESTATE,
               "damaged");
    expect_err(ctl_store_state_rollback(f->s, "u", "doc@9", 0, &v, &d), &d, WK_ENOENT, NULL);
    assert_verified(f->s);
}

static void
test_update_and_blob_gc(void **state)
{
    fx *f = *state;
    ctl_store_state out, in;
    int32_t toks[3];
    char ha[WK_SHA256_HEX_LEN], hb[WK_SHA256_HEX_LEN];
    wk_diag d = {""};
    put_hot(f->s, "u", "s");
    /* hibernate: bytes to a blob, tier cold */
    ctl_store_update u = {.set = CTL_STORE_SET_BLOB | CTL_STORE_SET_TIER | CTL_STORE_SET_USED,
                          .tier = CTL_STORE_TIER_COLD,
                          .blob_data = "AAAA",
                          .blob_len = 4,
                          .used_ms = 77};
    assert_int_equal(ctl_store_state_update(f->s, "u", "s", &u, NULL), WK_OK);
    wk_sha256_hex("AAAA", 4, ha);
    assert_int_equal(ctl_store_state_get(f->s, "u", "s@1", &out, NULL), WK_OK);
    assert_int_equal(out.tier, CTL_STORE_TIER_COLD);
    assert_string_equal(out.blob, ha);
    assert_int_equal(out.blob_bytes, 4);
    assert_int_equal(out.used_ms, 77);
    assert_int_equal(out.n_tokens, 3);
    ctl_store_state_fini(&out);
    /* a second record shares the blob by hex (a fork of a cold state) */
    mk_state(&in, "u", "fork", toks, 3, 10);
    in.tier = CTL_STORE_TIER_COLD;
    in.op = CTL_STORE_OP_FORK;
    memcpy(in.blob, ha, sizeof(ha));
    in.blob_bytes = 5;
    expect_err(ctl_store_state_put(f->s, &in, NULL, 0, NULL, &d), &d, WK_EINVAL, "blob_bytes");
    in.blob_bytes = 0;
    assert_int_equal(ctl_store_state_put(f->s, &in, NULL, 0, NULL, NULL), WK_OK);
    assert_verified(f->s);
    /* replacing the blob of s keeps A (fork still has it) */
    u = (ctl_store_update){.set = CTL_STORE_SET_BLOB, .blob_data = "BBBB", .blob_len = 4};
    assert_int_equal(ctl_store_state_update(f->s, "u", "s@1", &u, NULL), WK_OK);
    wk_sha256_hex("BBBB", 4, hb);
    assert_true(blob_file_exists(f, ha));
    assert_true(blob_file_exists(f, hb));
    assert_verified(f->s);
    /* dropping a cold state's blob is refused */
    u = (ctl_store_update){.set = CTL_STORE_SET_BLOB, .blob = ""};
    expect_err(ctl_store_state_update(f->s, "u", "s", &u, &d), &d, WK_EINVAL, "cold");
    /* warm again, then drop: B goes away */
    u = (ctl_store_update){.set = CTL_STORE_SET_BLOB | CTL_STORE_SET_TIER,
                           .tier = CTL_STORE_TIER_WARM, .blob = NULL};
    assert_int_equal(ctl_store_state_update(f->s, "u", "s", &u, NULL), WK_OK);
    assert_false(blob_file_exists(f, hb));
    /* point s at A by hex */
    u = (ctl_store_update){.set = CTL_STORE_SET_BLOB, .blob = ha};
    assert_int_equal(ctl_store_state_update(f->s, "u", "s", &u, NULL), WK_OK);
    /* a blob hex that is not stored */
    u = (ctl_store_update){.set = CTL_STORE_SET_BLOB, .blob = FP};
    expect_err(ctl_store_state_update(f->s, "u", "s", &u, &d), &d, WK_ENOENT, "not in the store");
    u = (ctl_store_update){.set = 1u << 9};
    expect_err(ctl_store_state_update(f->s, "u", "s", &u, &d), &d, WK_EINVAL, "unknown field");
    u = (ctl_store_update){.set = CTL_STORE_SET_TIER, .tier = (ctl_store_tier)5};
    expect_err(ctl_store_state_update(f->s, "u", "s", &u, &d), &d, WK_EINVAL, "tier 5");
    /* damaged flag */
    u = (ctl_store_update){.set = CTL_STORE_SET_DAMAGED, .damaged = true};
    assert_int_equal(ctl_store_state_update(f->s, "u", "fork@1", &u, NULL), WK_OK);
    assert_int_equal(ctl_store_state_get(f->s, "u", "fork", &out, NULL), WK_OK);
    assert_true(out.damaged);
    ctl_store_state_fini(&out);
    /* A is referenced twice now; deleting both collects it */
    assert_int_equal(ctl_store_state_delete(f->s, "u", "fork", NULL, NULL), WK_OK);
    assert_true(blob_file_exists(f, ha));
    assert_int_equal(ctl_store_state_delete(f->s, "u", "s@1", NULL, NULL), WK_OK);
    assert_false(blob_file_exists(f, ha));
    assert_int_equal(blob_dir_count(f->dir), 0);
    assert_verified(f->s);
}

static void
test_sessions(void **state)
{
    fx *f = *state;
    void *v;
    size_t len;
    ctl_store_kv_page pg;
    wk_diag d = {""};
    char key[64];
    for (int i = 0; i < 12; i++) {
        snprintf(key, sizeof(key), "m/user1/chat%02d", i);
        assert_int_equal(ctl_store_session_put(f->s, key, key, strlen(key), NULL), WK_OK);
    }
    assert_int_equal(ctl_store_session_put(f->s, "m/user10/x", "y", 1, NULL), WK_OK);
    assert_int_equal(ctl_store_session_put(f->s, "a", NULL, 0, NULL), WK_OK);
    assert_int_equal(ctl_store_session_get(f->s, "m/user1/chat03", &v, &len, NULL), WK_OK);
    assert_int_equal(len, 14);
    assert_memory_equal(v, "m/user1/chat03", 14);
    free(v);
    assert_int_equal(ctl_store_session_get(f->s, "a", &v, &len, NULL), WK_OK);
    assert_int_equal(len, 0);
    assert_non_null(v);
    free(v);
    /* replace */
    assert_int_equal(ctl_store_session_put(f->s, "m/user1/chat03", "new", 3, NULL), WK_OK);
    assert_int_equal(ctl_store_session_get(f->s, "m/user1/chat03", &v, &len, NULL), WK_OK);
    assert_int_equal(len, 3);
    free(v);
    /* prefix listing in pages of 5 */
    char after[CTL_STORE_SESSION_KEY_MAX + 1] = "";
    size_t total = 0;
    for (int pages = 0; pages < 5; pages++) {
        assert_int_equal(
            ctl_store_session_list(f->s, "m/user1/", after, 5, pages == 0, &pg, NULL), WK_OK);
        for (size_t i = 0; i < pg.n; i++) {
            assert_int_equal(strncmp(pg.items[i].key, "m/user1/", 8), 0);
            if (pages == 0)
                assert_non_null(pg.items[i].val);
            else
                assert_null(pg.items[i].val);
        }
        if (pages == 0) {
            assert_string_equal(pg.items[0].key, "m/user1/chat00");
            assert_memory_equal(pg.items[0].val, "m/user1/chat00", 14);
        }
        total += pg.n;
        memcpy(after, pg.next, sizeof(after));
        ctl_store_kv_page_fini(&pg);
        if (after[0] == '\0')
            break;
    }
    assert_int_equal(total, 12);
    /* `after` before the prefix starts at the prefix; after everything is empty */
    assert_int_equal(ctl_store_session_list(f->s, "m/user1/", "a", 100, false, &pg, NULL), WK_OK);
    assert_int_equal(pg.n, 12);
    ctl_store_kv_page_fini(&pg);
    assert_int_equal(ctl_store_session_list(f->s, "m/user1/", "z", 100, false, &pg, NULL), WK_OK);
    assert_int_equal(pg.n, 0);
    ctl_store_kv_page_fini(&pg);
    assert_int_equal(ctl_store_session_list(f->s, "", NULL, 0, false, &pg, NULL), WK_OK);
    assert_int_equal(pg.n, 14);
    assert_string_equal(pg.items[0].key, "a");
    ctl_store_kv_page_fini(&pg);
    ctl_store_kv_page_fini(NULL);
    /* delete */
    assert_int_equal(ctl_store_session_delete(f->s, "m/user10/x", NULL), WK_OK);
    expect_err(ctl_store_session_delete(f->s, "m/user10/x", &d), &d, WK_ENOENT, "no session");
    expect_err(ctl_store_session_get(f->s, "m/user10/x", &v, &len, &d), &d, WK_ENOENT,
               "no session");
    /* limits */
    char big[600];
    memset(big, 'k', sizeof(big));
    big[511] = '\0';
    assert_int_equal(ctl_store_session_put(f->s, big, "v", 1, NULL), WK_OK);
    big[511] = 'k';
    big[512] = '\0';
    expect_err(ctl_store_session_put(f->s, big, "v", 1, &d), &d, WK_EINVAL, "1..511");
    expect_err(ctl_store_session_put(f->s, "", "v", 1, &d), &d, WK_EINVAL, "1..511");
    /* the length is checked before the bytes are read */
    expect_err(ctl_store_session_put(f->s, "k", "v", CTL_STORE_SESSION_VALUE_MAX + 1, &d), &d,
               WK_ETOOBIG, "over the limit");
    reopen(f, NULL);
    assert_int_equal(ctl_store_session_get(f->s, "m/user1/chat11", &v, &len, NULL), WK_OK);
    free(v);
}

/*
 * A store written by an earlier build holds a "journal" database and a
 * "journal_next" meta key: it opens and verifies as any other, and both are
 * left as they were.
 */
static void
test_legacy_journal(void **state)
{
    fx *f = *state;
    char p[512];
    uint64_t v1 = put_hot(f->s, "alice", "old");
    ctl_store_close(f->s);
    f->s = NULL;
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi jdb, meta;
    uint8_t seq1[8] = {0, 0, 0, 0, 0, 0, 0, 1}, next[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    MDB_val jk = {8, seq1}, jv = {5, "entry"};
    MDB_val mk = {12, "journal_next"}, mv = {8, next}, got;
    snprintf(p, sizeof(p), "%s/store", f->dir);
    assert_int_equal(mdb_env_create(&env), 0);
    assert_int_equal(mdb_env_set_maxdbs(env, 8), 0);
    assert_int_equal(mdb_env_open(env, p, 0, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, "journal", MDB_CREATE, &jdb), 0);
    assert_int_equal(mdb_dbi_open(txn, "meta", 0, &meta), 0);
    assert_int_equal(mdb_put(txn, jdb, &jk, &jv, 0), 0);
    assert_int_equal(mdb_put(txn, meta, &mk, &mv, 0), 0);
    assert_int_equal(mdb_txn_commit(txn), 0);
    mdb_env_close(env);

    f->s = open_store(f->dir, NULL, NULL);
    assert_verified(f->s);
    ctl_store_state st;
    assert_int_equal(ctl_store_state_get(f->s, "alice", "old@1", &st, NULL), WK_OK);
    ctl_store_state_fini(&st);
    assert_int_equal(put_hot(f->s, "alice", "old"), v1 + 1);
    ctl_store_close(f->s);
    f->s = NULL;

    assert_int_equal(mdb_env_create(&env), 0);
    assert_int_equal(mdb_env_set_maxdbs(env, 8), 0);
    assert_int_equal(mdb_env_open(env, p, MDB_RDONLY, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, "journal", 0, &jdb), 0);
    assert_int_equal(mdb_dbi_open(txn, "meta", 0, &meta), 0);
    assert_int_equal(mdb_get(txn, jdb, &jk, &got), 0);
    assert_int_equal(got.mv_size, 5);
    assert_memory_equal(got.mv_data, "entry", 5);
    assert_int_equal(mdb_get(txn, meta, &mk, &got), 0);
    assert_int_equal(got.mv_size, 8);
    assert_memory_equal(got.mv_data, next, 8);
    mdb_txn_abort(txn);
    mdb_env_close(env);
    f->s = open_store(f->dir, NULL, NULL);
}

static void
test_reopen_and_lock(void **state)
{
    fx *f = *state;
    ctl_store_open_stats st;
    ctl_store *other = NULL;
    wk_diag d = {""};
    char hex[WK_SHA256_HEX_LEN];
    put_cold(f->s, "u", "a", "blob-a", 6, hex);
    put_hot(f->s, "u", "b");
    put_hot(f->s, "v", "a");
    /* a second open of the same data dir is refused while the first holds it */
    expect_err(ctl_store_open(f->dir, NULL, &other, NULL, &d), &d, WK_EBUSY, "in use");
    assert_null(other);
    reopen(f, &st);
    assert_int_equal(st.states, 3);
    assert_int_equal(st.blobs, 1);
    assert_int_equal(st.blobs_missing, 0);
    assert_int_equal(st.orphans_removed, 0);
    assert_int_equal(st.temps_removed, 0);
    assert_int_equal(st.map_size, CTL_STORE_MAP_SIZE_DEFAULT);
    ctl_store_state out;
    assert_int_equal(ctl_store_state_get(f->s, "u", "a", &out, NULL), WK_OK);
    assert_string_equal(out.blob, hex);
    ctl_store_state_fini(&out);
    /* a missing blob is reported by open */
    char p[512];
    snprintf(p, sizeof(p), "%s/blobs/%s", f->dir, hex);
    assert_int_equal(unlink(p), 0);
    reopen(f, &st);
    assert_int_equal(st.blobs_missing, 1);
    ctl_store_verify_report r;
    assert_int_equal(ctl_store_verify(f->s, false, &r, NULL), WK_OK);
    assert_int_equal(r.blobs_missing, 1);
    assert_int_equal(r.problems, 1);
    ctl_store_close(NULL);
    expect_err(ctl_store_open("", NULL, &other, NULL, &d), &d, WK_EINVAL, NULL);
}

static void
touch(const char *dir, const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/blobs/%s", dir, name);
    FILE *fp = fopen(p, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static void
test_open_gc(void **state)
{
    fx *f = *state;
    ctl_store_open_stats st;
    char kept[WK_SHA256_HEX_LEN], orphan[WK_SHA256_HEX_LEN], tmp[128];
    put_cold(f->s, "u", "keep", "kept bytes", 10, kept);
    assert_int_equal(ctl_store_blob_put(f->s, "orphan bytes", 12, orphan, NULL), WK_OK);
    snprintf(tmp, sizeof(tmp), "%s.tmp.99999.3", orphan);
    touch(f->dir, tmp, "half a blo");
    touch(f->dir, "leftover.tmp", "x");
    touch(f->dir, "README", "not ours");
    ctl_store_verify_report r;
    assert_int_equal(ctl_store_verify(f->s, true, &r, NULL), WK_OK);
    assert_int_equal(r.orphans, 1);
    assert_int_equal(r.temps, 2);
    reopen(f, &st);
    assert_int_equal(st.orphans_removed, 1);
    assert_int_equal(st.temps_removed, 2);
    assert_int_equal(st.unknown_files, 1);
    assert_int_equal(st.blobs, 1);
    assert_int_equal(st.states, 1);
    assert_true(blob_file_exists(f, kept));
    assert_false(blob_file_exists(f, orphan));
    assert_false(blob_file_exists(f, tmp));
    assert_true(blob_file_exists(f, "README"));
    assert_verified(f->s);
}

static void
test_map_growth(void **state)
{
    fx *f = *state;
    ctl_store_config cfg = {.map_size = 64 << 10, .map_size_max = 64 << 20};
    ctl_store_open_stats st;
    ctl_store_close(f->s);
    f->s = NULL;
    rm_tree(f->dir);
    f->s = open_store(f->dir, &cfg, &st);
    assert_int_equal(st.map_size, 64 << 10);
    uint8_t *val = malloc(200 << 10);
    char key[32];
    for (int i = 0; i < 40; i++) {
        memset(val, i, 200 << 10);
        snprintf(key, sizeof(key), "k%02d", i);
        wk_diag d = {""};
        wk_err e = ctl_store_session_put(f->s, key, val, 200 << 10, &d);
        if (e != WK_OK)
            fail_msg("session put %d: %s", i, d.msg);
    }
    assert_true(ctl_store_map_size(f->s) >= (8u << 20));
    assert_true(ctl_store_map_size(f->s) <= (64u << 20));
    /* states grow the map too; everything stays readable */
    for (int i = 0; i < 20; i++)
        put_hot(f->s, "g", "grow");
    void *v;
    size_t len;
    assert_int_equal(ctl_store_session_get(f->s, "k07", &v, &len, NULL), WK_OK);
    assert_int_equal(len, 200 << 10);
    assert_int_equal(((uint8_t *)v)[1000], 7);
    free(v);
    /* on reopen with the tiny configured size LMDB keeps room for the data */
    ctl_store_close(f->s);
    f->s = open_store(f->dir, &cfg, &st);
    assert_true(st.map_size >= (8u << 20));
    assert_int_equal(ctl_store_session_put(f->s, "after", val, 200 << 10, NULL), WK_OK);
    /* at the ceiling: WK_ENOSPC, and the store still works */
    ctl_store_close(f->s);
    rm_tree(f->dir);
    cfg = (ctl_store_config){.map_size = 64 << 10, .map_size_max = 128 << 10};
    f->s = open_store(f->dir, &cfg, NULL);
    wk_diag d = {""};
    expect_err(ctl_store_session_put(f->s, "big", val, 200 << 10, &d), &d, WK_ENOSPC,
               "maximum");
    assert_int_equal(ctl_store_map_size(f->s), 128 << 10);
    assert_int_equal(ctl_store_session_put(f->s, "small", "x", 1, NULL), WK_OK);
    assert_int_equal(ctl_store_session_get(f->s, "small", &v, &len, NULL), WK_OK);
    free(v);
    expect_err(ctl_store_session_get(f->s, "big", &v, &len, &d), &d, WK_ENOENT, NULL);
    free(val);
}

/* Write hooks that fail the way a full disk, a quota, a bad disk do. */
static int hook_errno;    /* errno the failing hook sets */
static size_t hook_after; /* bytes it lets through first */
static size_t hook_done;  /* bytes let through so far */

static ssize_t
failing_write(int fd, const void *buf, size_t len)
{
    if (hook_done >= hook_after) {
        errno = hook_errno;
        return -1;
    }
    size_t n = len < hook_after - hook_done ? len : hook_after - hook_done;
    ssize_t w = write(fd, buf, n);
    if (w > 0)
        hook_done += (size_t)w;
    return w;
}

static ssize_t
trickle_write(int fd, const void *buf, size_t len)
{
    return write(fd, buf, len < 7 ? len : 7);
}

static void
test_write_failures(void **state)
{
    fx *f = *state;
    char hex[WK_SHA256_HEX_LEN];
    uint8_t data[10000];
    wk_diag d = {""};
    memset(data, 0x5a, sizeof(data));
    const struct {
        int err;      /* errno injected */
        size_t after; /* bytes written before it */
        wk_err want;  /* expected code */
    } cases[] = {
        {ENOSPC, 0, WK_ENOSPC}, {ENOSPC, 4096, WK_ENOSPC}, {EDQUOT, 100, WK_ENOSPC},
        {EIO, 10, WK_EIO},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        hook_errno = cases[i].err;
        hook_after = cases[i].after;
        hook_done = 0;
        ctl_store_priv_set_write(f->s, failing_write);
        expect_err(ctl_store_blob_put(f->s, data, sizeof(data), hex, &d), &d, cases[i].want,
                   NULL);
        assert_int_equal(blob_dir_count(f->dir), 0);
        /* through a state put the same: no record, no file */
        ctl_store_state in;
        int32_t toks[2];
        mk_state(&in, "u", "full", toks, 2, 0);
        in.tier = CTL_STORE_TIER_COLD;
        hook_done = 0;
        expect_err(ctl_store_state_put(f->s, &in, data, sizeof(data), NULL, &d), &d,
                   cases[i].want, NULL);
        assert_int_equal(blob_dir_count(f->dir), 0);
        ctl_store_priv_set_write(f->s, NULL);
    }
    ctl_store_page pg;
    assert_int_equal(ctl_store_state_list(f->s, NULL, NULL, 0, &pg, NULL), WK_OK);
    assert_int_equal(pg.n, 0);
    ctl_store_page_fini(&pg);
    /* short writes are carried on */
    ctl_store_priv_set_write(f->s, trickle_write);
    assert_int_equal(ctl_store_blob_put(f->s, data, 1000, hex, NULL), WK_OK);
    ctl_store_priv_set_write(f->s, NULL);
    void *got;
    size_t len;
    assert_int_equal(ctl_store_blob_get(f->s, hex, &got, &len, NULL), WK_OK);
    assert_int_equal(len, 1000);
    free(got);
}

/*
 * In a child: a private mount namespace with a 256 KiB tmpfs as the data dir;
 * a 1 MiB blob must fail with WK_ENOSPC and leave nothing, and the store must
 * keep working. Exits 77 when the sandbox refuses the namespace or mount.
 */
static int
enospc_child(const char *mnt)
{
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", mnt, "tmpfs", 0, "size=256k") != 0)
        return 77;
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/data", mnt);
    ctl_store_config cfg = {.map_size = 64 << 10, .map_size_max = 1 << 20};
    ctl_store *s = NULL;
    if (ctl_store_open(dir, &cfg, &s, NULL, NULL) != WK_OK)
        return 2;
    size_t n = 1 << 20;
    uint8_t *big = malloc(n);
    memset(big, 1, n);
    char hex[WK_SHA256_HEX_LEN];
    wk_diag d = {""};
    if (ctl_store_blob_put(s, big, n, hex, &d) != WK_ENOSPC)
        return 3;
    if (strstr(d.msg, "no space") == NULL)
        return 4;
    free(big);
    char bl[700];
    snprintf(bl, sizeof(bl), "%s/blobs", dir);
    DIR *dd = opendir(bl);
    struct dirent *e;
    while (dd != NULL && (e = readdir(dd)) != NULL)
        if (e->d_name[0] != '.')
            return 5;
    if (dd != NULL)
        closedir(dd);
    if (ctl_store_blob_put(s, "small", 5, hex, NULL) != WK_OK)
        return 6;
    ctl_store_close(s);
    return 0;
}

static void
test_enospc_tmpfs(void **state)
{
    fx *f = *state;
    char mnt[512];
    snprintf(mnt, sizeof(mnt), "%s/mnt", f->dir);
    assert_int_equal(mkdir(mnt, 0700), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(enospc_child(mnt));
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77)
        skip();
    if (WEXITSTATUS(status) != 0)
        fail_msg("tmpfs ENOSPC child failed at step %d", WEXITSTATUS(status));
}

static void
test_schema_from_future(void **state)
{
    fx *f = *state;
    char p[512];
    ctl_store_close(f->s);
    f->s = NULL;
    /* write schema 2 with LMDB directly, as a newer build would */
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    snprintf(p, sizeof(p), "%s/store", f->dir);
    assert_int_equal(mdb_env_create(&env), 0);
    assert_int_equal(mdb_env_set_maxdbs(env, 8), 0);
    assert_int_equal(mdb_env_open(env, p, 0, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
    uint8_t two[4] = {2, 0, 0, 0};
    MDB_val k = {6, "schema"}, v = {4, two};
    assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
    assert_int_equal(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
    wk_diag d = {""};
    expect_err(ctl_store_open(f->dir, NULL, &f->s, NULL, &d), &d, WK_ENOTSUP,
               "schema version 2");
    assert_null(f->s);
    /* and not an LMDB store at all */
    snprintf(p, sizeof(p), "%s/store/data.mdb", f->dir);
    FILE *fp = fopen(p, "w");
    assert_non_null(fp);
    for (int i = 0; i < 2000; i++)
        fputs("garbage!", fp);
    fclose(fp);
    wk_err e = ctl_store_open(f->dir, NULL, &f->s, NULL, &d);
    assert_true(e == WK_ECORRUPT || e == WK_ENOTSUP);
    assert_null(f->s);
}

/* Argument of a concurrent worker thread. */
typedef struct worker_arg {
    ctl_store *s;   /* the store */
    int id;         /* worker number */
    int failures;   /* operations that failed */
} worker_arg;

static void *
worker(void *p)
{
    worker_arg *a = p;
    char owner[16], blob[64];
    snprintf(owner, sizeof(owner), "w%d", a->id);
    for (int i = 0; i < 40; i++) {
        ctl_store_state in, out;
        int32_t toks[8];
        uint64_t v;
        mk_state(&in, owner, i % 2 ? "odd" : "even", toks, 8, i);
        in.tier = CTL_STORE_TIER_COLD;
        /* the same content in every thread: shared blobs under concurrent deletes */
        int len = snprintf(blob, sizeof(blob), "shared blob %d", i % 4);
        wk_err e = ctl_store_state_put(a->s, &in, blob, (size_t)len, &v, NULL);
        if (e == WK_OK && ctl_store_state_get(a->s, owner, in.name, &out, NULL) == WK_OK) {
            void *data;
            size_t dl;
            if (ctl_store_blob_get(a->s, out.blob, &data, &dl, NULL) != WK_OK)
                a->failures++;
            else
                free(data);
            ctl_store_state_fini(&out);
        } else {
            a->failures++;
        }
        if (i % 3 == 2 && ctl_store_state_delete(a->s, owner, "even", NULL, NULL) != WK_OK)
            a->failures++;
        char key[32];
        snprintf(key, sizeof(key), "%s/%d", owner, i);
        if (ctl_store_session_put(a->s, key, blob, (size_t)len, NULL) != WK_OK)
            a->failures++;
    }
    return NULL;
}

static void
test_concurrent(void **state)
{
    fx *f = *state;
    ctl_store_config cfg = {.map_size = 64 << 10, .map_size_max = 256 << 20};
    ctl_store_close(f->s);
    rm_tree(f->dir);
    f->s = open_store(f->dir, &cfg, NULL);
    pthread_t th[6];
    worker_arg args[6];
    for (int i = 0; i < 6; i++) {
        args[i] = (worker_arg){f->s, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < 6; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
    }
    assert_verified(f->s);
    assert_true(ctl_store_map_size(f->s) > (64u << 10));
}

int
main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_ids),
        T(test_put_get_fields),
        T(test_versions_append_only),
        T(test_owner_isolation),
        T(test_blob_damage),
        T(test_bad_records),
        T(test_pagination),
        T(test_rollback),
        T(test_update_and_blob_gc),
        T(test_sessions),
        T(test_legacy_journal),
        T(test_reopen_and_lock),
        T(test_open_gc),
        T(test_map_growth),
        T(test_write_failures),
        T(test_enospc_tmpfs),
        T(test_schema_from_future),
        T(test_concurrent),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
