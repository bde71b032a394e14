/*
 * wrk_host: the warm tier over fake slot images (a fixed part of F bytes,
 * then T bytes a KV token). A copy of a slot loaded from or copied to an
 * entry references that entry's KV and copies only its fixed part and the
 * rows past it: the bytes held grow by that much, every entry still reads
 * back its own image byte for byte (after the entries it shares with are
 * dropped too), a deferred copy reads back only once filled, a failed fill
 * drops every entry sharing the unread bytes, a changed slot shares
 * nothing, the budget gives up other slots' lineages before refusing, and a
 * model without KV shares nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wrk_host.h"

#define F 16u      /* fixed part */
#define T 8u       /* KV bytes a token */
#define ROWS 80u   /* most tokens of a fake slot */
#define SLOTS 4u

typedef struct fake {
    uint8_t img[SLOTS][F + ROWS * T]; /* each slot's image */
    uint64_t len[SLOTS];              /* its size now */
    bool fail_reads;                  /* rd answers WK_EIO */
} fake;

static wk_err
rd(void *arg, uint32_t slot, uint64_t off, void *buf, size_t len)
{
    fake *f = arg;
    if (f->fail_reads)
        return WK_EIO;
    assert_true(slot < SLOTS && off + len <= f->len[slot]);
    memcpy(buf, f->img[slot] + off, len);
    return WK_OK;
}

static wk_err
wr(void *arg, uint32_t slot, uint64_t off, const void *buf, size_t len)
{
    fake *f = arg;
    assert_true(slot < SLOTS && off + len <= f->len[slot]);
    memcpy(f->img[slot] + off, buf, len);
    return WK_OK;
}

/* Slot s gets a new fixed part and n more KV rows (bytes from seed), as a step would. */
static void
grow(fake *f, uint32_t s, uint32_t n, uint8_t seed)
{
    for (uint32_t i = 0; i < F; i++)
        f->img[s][i] = (uint8_t)(seed * 31u + i);
    uint64_t rows = f->len[s] ? (f->len[s] - F) / T : 0;
    assert_true(rows + n <= ROWS);
    for (uint64_t b = F + rows * T; b < F + (rows + n) * T; b++)
        f->img[s][b] = (uint8_t)(seed * 7u + b * 13u);
    f->len[s] = F + (rows + n) * T;
}

/* Entry key reads back exactly slot s's image as it was when want was taken. */
static void
same(wrk_host *h, const char *key, const uint8_t *want, uint64_t len)
{
    uint64_t got = 0;
    assert_true(wrk_host_len(h, key, &got));
    assert_int_equal(got, len);
    uint8_t *buf = malloc(len + 1);
    const uint8_t *p = NULL;
    assert_int_equal(wrk_host_read(h, key, 0, (size_t)len, buf, &p), WK_OK);
    assert_memory_equal(p, want, len);
    for (uint64_t off = 0; off + 5 <= len; off += 11) { /* ranges across pieces */
        assert_int_equal(wrk_host_read(h, key, off, 5, buf, &p), WK_OK);
        assert_memory_equal(p, want + off, 5);
    }
    free(buf);
}

/* A tier of cap bytes with the geometry (F, T) over the zeroed fake f. */
static wrk_host *
tier(fake *f, uint64_t cap)
{
    memset(f, 0, sizeof(*f));
    wrk_host *h = wrk_host_new(cap, SLOTS);
    assert_non_null(h);
    assert_int_equal(wrk_host_reset(h, F, T, SLOTS), WK_OK);
    return h;
}

static void
test_shared_kv(void **state)
{
    (void)state;
    static fake f;
    memset(&f, 0, sizeof(f));
    wrk_host *h = wrk_host_new(1u << 20, 0);
    assert_non_null(h);
    assert_int_equal(wrk_host_reset(h, F, T, SLOTS), WK_OK);
    static uint8_t a[F + ROWS * T], b[F + ROWS * T], c[F + ROWS * T];
    grow(&f, 1, 4, 1);
    assert_int_equal(wrk_host_put(h, 1, f.len[1], "a", rd, &f, NULL), WK_OK);
    memcpy(a, f.img[1], f.len[1]);
    const uint64_t la = f.len[1];
    assert_int_equal(wrk_host_bytes(h), F + 4 * T);
    assert_int_equal(wrk_host_lineage(h, 1), 4);
    /* the slot goes on: the copy holds its fixed part and the 6 new rows only */
    grow(&f, 1, 6, 2);
    assert_int_equal(wrk_host_put(h, 1, f.len[1], "b", rd, &f, NULL), WK_OK);
    memcpy(b, f.img[1], f.len[1]);
    const uint64_t lb = f.len[1];
    assert_int_equal(wrk_host_bytes(h), (F + 4 * T) + (F + 6 * T));
    same(h, "a", a, la);
    same(h, "b", b, lb);
    /* loaded into another slot, which goes its own way */
    f.len[2] = la;
    assert_int_equal(wrk_host_load(h, "a", 2, wr, &f), WK_OK);
    assert_memory_equal(f.img[2], a, la);
    assert_int_equal(wrk_host_lineage(h, 2), 4);
    grow(&f, 2, 3, 3);
    uint64_t before = wrk_host_bytes(h);
    assert_int_equal(wrk_host_put(h, 2, f.len[2], "c", rd, &f, NULL), WK_OK);
    memcpy(c, f.img[2], f.len[2]);
    const uint64_t lc = f.len[2];
    assert_int_equal(wrk_host_bytes(h) - before, F + 3 * T);
    /* the entries shared from go; what shares them still reads its own image */
    assert_true(wrk_host_drop(h, "a"));
    assert_false(wrk_host_drop(h, "a"));
    same(h, "b", b, lb);
    same(h, "c", c, lc);
    /* a replaced key: the new bytes */
    grow(&f, 2, 1, 4);
    assert_int_equal(wrk_host_put(h, 2, f.len[2], "c", rd, &f, NULL), WK_OK);
    same(h, "c", f.img[2], f.len[2]);
    /* a changed slot shares nothing: its next copy is whole */
    wrk_host_slot_changed(h, 2);
    assert_int_equal(wrk_host_lineage(h, 2), 0);
    before = wrk_host_bytes(h);
    assert_int_equal(wrk_host_put(h, 2, f.len[2], "d", rd, &f, NULL), WK_OK);
    assert_int_equal(wrk_host_bytes(h) - before, f.len[2]);
    same(h, "d", f.img[2], f.len[2]);
    /* everything dropped: nothing held (lineages end with the reset) */
    assert_int_equal(wrk_host_reset(h, F, T, SLOTS), WK_OK);
    assert_int_equal(wrk_host_bytes(h), 0);
    assert_int_equal(wrk_host_load(h, "b", 1, wr, &f), WK_ENOENT);
    wrk_host_free(h);
}

static void
test_deferred(void **state)
{
    (void)state;
    static fake f;
    wrk_host *h = tier(&f, 1u << 20);
    static uint8_t want[2][F + ROWS * T];
    uint64_t wl[2];
    /* two snaps of one slot in a step: the second shares the first's unread rows */
    grow(&f, 1, 5, 5);
    wrk_host_entry *p1 = NULL, *p2 = NULL;
    assert_int_equal(wrk_host_put(h, 1, f.len[1], "s1", rd, &f, &p1), WK_OK);
    assert_non_null(p1);
    memcpy(want[0], f.img[1], f.len[1]);
    wl[0] = f.len[1];
    grow(&f, 1, 2, 6); /* (the step goes on: a new fixed part, two more rows) */
    assert_int_equal(wrk_host_put(h, 1, f.len[1], "s2", rd, &f, &p2), WK_OK);
    assert_non_null(p2);
    memcpy(want[1], f.img[1], f.len[1]);
    wl[1] = f.len[1];
    assert_int_equal(wrk_host_bytes(h), (F + 5 * T) + (F + 2 * T));
    uint8_t buf[8];
    const uint8_t *q = NULL;
    assert_int_equal(wrk_host_read(h, "s1", F, 4, buf, &q), WK_ESTATE); /* not yet read */
    assert_int_equal(wrk_host_fill(h, p1, 1, rd, &f), WK_OK);
    assert_int_equal(wrk_host_fill(h, p2, 1, rd, &f), WK_OK);
    uint64_t l = 0;
    /* s1: its fixed part read at its put, its rows at the fill (the same: rows never change) */
    same(h, "s1", want[0], wl[0]);
    same(h, "s2", want[1], wl[1]);
    /* a fill that fails drops every entry sharing unread bytes, and every lineage */
    grow(&f, 1, 3, 8);
    wrk_host_entry *p3 = NULL, *p4 = NULL;
    assert_int_equal(wrk_host_put(h, 1, f.len[1], "s3", rd, &f, &p3), WK_OK);
    grow(&f, 1, 1, 9);
    assert_int_equal(wrk_host_put(h, 1, f.len[1], "s4", rd, &f, &p4), WK_OK);
    f.fail_reads = true;
    assert_int_equal(wrk_host_fill(h, p3, 1, rd, &f), WK_EIO);
    f.fail_reads = false;
    assert_false(wrk_host_len(h, "s3", &l));
    assert_false(wrk_host_len(h, "s4", &l));
    assert_true(wrk_host_len(h, "s2", &l)); /* (read long before: kept) */
    assert_int_equal(wrk_host_lineage(h, 1), 0);
    same(h, "s2", want[1], wl[1]);
    assert_int_equal(wrk_host_bytes(h), (F + 5 * T) + (F + 2 * T)); /* (nothing leaked) */
    wrk_host_free(h);
}

static void
test_budget_and_no_kv(void **state)
{
    (void)state;
    static fake f;
    memset(&f, 0, sizeof(f));
    /* room for 3 whole images of 8 rows */
    wrk_host *h = wrk_host_new(3 * (F + 8 * T), SLOTS);
    assert_int_equal(wrk_host_reset(h, F, T, SLOTS), WK_OK);
    grow(&f, 1, 8, 1);
    grow(&f, 2, 8, 2);
    grow(&f, 3, 8, 3);
    assert_int_equal(wrk_host_put(h, 1, f.len[1], "x", rd, &f, NULL), WK_OK);
    assert_int_equal(wrk_host_put(h, 2, f.len[2], "y", rd, &f, NULL), WK_OK);
    assert_true(wrk_host_drop(h, "y")); /* its fixed part goes; slot 2's lineage keeps its KV */
    assert_int_equal(wrk_host_bytes(h), (F + 8 * T) + 8 * T);
    assert_int_equal(wrk_host_lineage(h, 2), 8);
    assert_int_equal(wrk_host_put(h, 3, f.len[3], "z", rd, &f, NULL), WK_OK);
    assert_int_equal(wrk_host_put(h, 3, f.len[3], "z2", rd, &f, NULL), WK_OK); /* (its F only) */
    assert_int_equal(wrk_host_bytes(h), 3 * (F + 8 * T));
    /* slot 1 goes on: over the cap by its new part; slot 2's lineage (only it holds y's KV)
       is given up, slot 1's kept */
    grow(&f, 1, 4, 4);
    assert_int_equal(wrk_host_put(h, 1, f.len[1], "x2", rd, &f, NULL), WK_OK);
    assert_int_equal(wrk_host_lineage(h, 2), 0);
    assert_int_equal(wrk_host_lineage(h, 1), 12);
    same(h, "x2", f.img[1], f.len[1]);
    /* what cannot fit is refused, nothing else changed */
    grow(&f, 2, 40, 5);
    assert_int_equal(wrk_host_put(h, 2, f.len[2], "big", rd, &f, NULL), WK_ENOSPC);
    assert_false(wrk_host_len(h, "big", &(uint64_t){0}));
    /* an image off the geometry is copied whole and ends the slot's lineage */
    f.len[1] = F / 2;
    assert_int_equal(wrk_host_put(h, 1, f.len[1], "half", rd, &f, NULL), WK_OK);
    assert_int_equal(wrk_host_lineage(h, 1), 0);
    same(h, "half", f.img[1], F / 2);
    /* reads at the end, past it; keys */
    uint8_t buf[4];
    const uint8_t *q = NULL;
    assert_int_equal(wrk_host_read(h, "half", F / 2, 0, buf, &q), WK_OK);
    assert_int_equal(wrk_host_read(h, "half", F / 2, 1, buf, &q), WK_EINVAL);
    assert_int_equal(wrk_host_read(h, "nope", 0, 1, buf, &q), WK_ENOENT);
    char long_key[140];
    memset(long_key, 'k', sizeof(long_key) - 1);
    long_key[sizeof(long_key) - 1] = '\0';
    assert_int_equal(wrk_host_put(h, 1, f.len[1], long_key, rd, &f, NULL), WK_EINVAL);
    assert_int_equal(wrk_host_put(h, 1, f.len[1], "", rd, &f, NULL), WK_EINVAL);
    /* a model without KV: whole images, no lineage */
    assert_int_equal(wrk_host_reset(h, 40, 0, SLOTS), WK_OK);
    f.len[1] = 40;
    assert_int_equal(wrk_host_put(h, 1, 40, "r", rd, &f, NULL), WK_OK);
    assert_int_equal(wrk_host_lineage(h, 1), 0);
    assert_int_equal(wrk_host_bytes(h), 40);
    f.len[2] = 40;
    assert_int_equal(wrk_host_load(h, "r", 2, wr, &f), WK_OK);
    assert_memory_equal(f.img[2], f.img[1], 40);
    wrk_host_free(h);
    wrk_host_free(NULL);
}

/*
 * A conversation's chain of copies, each dropping the one before: the bytes
 * held are exactly the live image (each copy's fixed part goes with it; the
 * KV rows stay once), and a chain of many pieces starts over whole.
 */
static void
test_chain(void **state)
{
    (void)state;
    static fake f;
    wrk_host *h = tier(&f, 1u << 20);
    char key[16], prev[16] = "";
    int whole = 0, whole_at = -1;
    for (int i = 0; i < 70; i++) {
        grow(&f, 1, 1, (uint8_t)i);
        snprintf(key, sizeof(key), "c%d", i);
        uint64_t before = wrk_host_bytes(h);
        assert_int_equal(wrk_host_put(h, 1, f.len[1], key, rd, &f, NULL), WK_OK);
        if (i > 0 && wrk_host_bytes(h) - before == f.len[1]) { /* (a new chain) */
            whole++;
            whole_at = i;
        }
        if (prev[0])
            assert_true(wrk_host_drop(h, prev));
        assert_int_equal(wrk_host_bytes(h), f.len[1]);
        same(h, key, f.img[1], f.len[1]);
        snprintf(prev, sizeof(prev), "%s", key);
    }
    /* one new chain, when the lineage had 64 pieces (one a copy) */
    assert_int_equal(whole, 1);
    assert_int_equal(whole_at, 64);
    wrk_host_free(h);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_kv),
        cmocka_unit_test(test_deferred),
        cmocka_unit_test(test_budget_and_no_kv),
        cmocka_unit_test(test_chain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
