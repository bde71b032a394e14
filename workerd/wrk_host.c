/*
 * wrk_host: the worker's warm tier (see wrk_host.h).
 *
 * Layout: a segment is one allocation of bytes with a reference count (the
 * entries and lineages whose pieces point into it); an entry's image is the
 * concatenation of its pieces; a slot's lineage is the KV pieces (image
 * bytes [fixed, fixed + rows * per_token)) of the entry it was last loaded
 * from or copied to. held counts every live segment once.
 */
#include "wrk_host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WRK_HOST_PIECES_MAX 64u /* pieces a lineage may have and still be shared */

typedef struct wrk_seg {
    uint32_t refs;   /* pieces pointing into it */
    bool pending;    /* part of it is still to be read (wrk_host_fill) */
    size_t len;      /* bytes */
    uint8_t bytes[]; /* the bytes */
} wrk_seg;

typedef struct wrk_piece {
    wrk_seg *seg; /* referenced */
    size_t off;   /* into seg */
    size_t len;   /* bytes */
} wrk_piece;

typedef struct wrk_lin {
    wrk_piece *p;  /* the KV pieces, in order */
    size_t n;      /* entries */
    uint64_t rows; /* KV tokens they hold */
} wrk_lin;

struct wrk_host_entry {
    char key[129];               /* controller-chosen name */
    wrk_piece *p;                /* the image, in order */
    size_t n;                    /* pieces */
    uint64_t len;                /* image bytes */
    wrk_seg *own;                /* the segment of the KV rows this entry copied, NULL = none */
    uint64_t fill_off;           /* deferred: image offset of the bytes still to read */
    size_t fill_len;             /* their length (into own), 0 = none */
    struct wrk_host_entry *next; /* list link */
};

struct wrk_host {
    uint64_t cap;         /* bytes at most */
    uint64_t held;        /* bytes of live segments */
    uint64_t fixed;       /* image geometry: fixed part */
    uint64_t per_token;   /* KV bytes a token, 0 = nothing shared */
    uint32_t n_slots;     /* lineages */
    wrk_lin *lins;        /* [n_slots] */
    wrk_host_entry *head; /* entries */
};

static wrk_seg *
seg_new(wrk_host *h, size_t len)
{
    wrk_seg *s = malloc(sizeof(*s) + (len ? len : 1));
    if (s == NULL)
        return NULL;
    s->refs = 1;
    s->pending = false;
    s->len = len;
    h->held += len;
    return s;
}

static void
seg_unref(wrk_host *h, wrk_seg *s)
{
    if (s != NULL && --s->refs == 0) {
        h->held -= s->len;
        free(s);
    }
}

static void
pieces_free(wrk_host *h, wrk_piece *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        seg_unref(h, p[i].seg);
    free(p);
}

/*
 * Appends to *out (*n entries, *cap allocated) references to the bytes
 * [from, to) of the image made of pieces src[0..ns). false on ENOMEM (what
 * was appended stays referenced: the caller frees *out).
 */
static bool
pieces_slice(const wrk_piece *src, size_t ns, uint64_t from, uint64_t to, wrk_piece **out,
             size_t *n, size_t *cap)
{
    uint64_t at = 0;
    for (size_t i = 0; i < ns && at < to; at += src[i].len, i++) {
        const uint64_t lo = from > at ? from : at;
        const uint64_t hi = to < at + src[i].len ? to : at + src[i].len;
        if (lo >= hi)
            continue;
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 8;
            wrk_piece *q = realloc(*out, nc * sizeof(*q));
            if (q == NULL)
                return false;
            *out = q;
            *cap = nc;
        }
        (*out)[(*n)++] = (wrk_piece){src[i].seg, src[i].off + (size_t)(lo - at), (size_t)(hi - lo)};
        src[i].seg->refs++;
    }
    return true;
}

static void
lin_end(wrk_host *h, uint32_t slot)
{
    wrk_lin *l = &h->lins[slot];
    pieces_free(h, l->p, l->n);
    memset(l, 0, sizeof(*l));
}

/* Slot's lineage becomes entry e's KV (none when e has no KV or on ENOMEM). */
static void
lin_set(wrk_host *h, uint32_t slot, const wrk_host_entry *e)
{
    wrk_lin nl = {0};
    size_t cap = 0;
    if (h->per_token > 0 && e->len > h->fixed && (e->len - h->fixed) % h->per_token == 0) {
        if (pieces_slice(e->p, e->n, h->fixed, e->len, &nl.p, &nl.n, &cap)) {
            nl.rows = (e->len - h->fixed) / h->per_token;
        } else { /* (out of memory: no lineage, only no sharing) */
            pieces_free(h, nl.p, nl.n);
            nl = (wrk_lin){0};
        }
    }
    lin_end(h, slot);
    h->lins[slot] = nl;
}

static void
entry_free(wrk_host *h, wrk_host_entry *e)
{
    pieces_free(h, e->p, e->n);
    free(e);
}

static wrk_host_entry *
entry_find(const wrk_host *h, const char *key)
{
    wrk_host_entry *e = h->head;
    while (e != NULL && strcmp(e->key, key) != 0)
        e = e->next;
    return e;
}

wrk_host *
wrk_host_new(uint64_t cap, uint32_t n_slots)
{
    wrk_host *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return NULL;
    h->cap = cap;
    if (wrk_host_reset(h, 0, 0, n_slots) != WK_OK) {
        free(h);
        return NULL;
    }
    return h;
}

void
wrk_host_free(wrk_host *h)
{
    if (h == NULL)
        return;
    (void)wrk_host_reset(h, 0, 0, 0);
    free(h);
}

wk_err
wrk_host_reset(wrk_host *h, uint64_t fixed, uint64_t per_token, uint32_t n_slots)
{
    while (h->head != NULL) {
        wrk_host_entry *e = h->head;
        h->head = e->next;
        entry_free(h, e);
    }
    for (uint32_t s = 0; s < h->n_slots; s++)
        lin_end(h, s);
    free(h->lins);
    h->lins = NULL;
    h->n_slots = 0;
    h->fixed = fixed;
    h->per_token = per_token;
    if (n_slots > 0) {
        h->lins = calloc(n_slots, sizeof(*h->lins));
        if (h->lins == NULL)
            return WK_ENOMEM;
        h->n_slots = n_slots;
    }
    return WK_OK;
}

uint64_t
wrk_host_bytes(const wrk_host *h)
{
    return h->held;
}

uint64_t
wrk_host_cap(const wrk_host *h)
{
    return h->cap;
}

bool
wrk_host_drop(wrk_host *h, const char *key)
{
    for (wrk_host_entry **pp = &h->head; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->key, key) == 0) {
            wrk_host_entry *e = *pp;
            *pp = e->next;
            entry_free(h, e);
            return true;
        }
    }
    return false;
}

void
wrk_host_slot_changed(wrk_host *h, uint32_t slot)
{
    if (slot == UINT32_MAX) {
        for (uint32_t s = 0; s < h->n_slots; s++)
            lin_end(h, s);
    } else if (slot < h->n_slots) {
        lin_end(h, slot);
    }
}

uint64_t
wrk_host_lineage(const wrk_host *h, uint32_t slot)
{
    return slot < h->n_slots ? h->lins[slot].rows : 0;
}

wk_err
wrk_host_put(wrk_host *h, uint32_t slot, uint64_t len, const char *key, wrk_host_read_fn rd,
             void *arg, wrk_host_entry **pend)
{
    if (pend != NULL)
        *pend = NULL;
    if (key == NULL || key[0] == '\0' || strlen(key) > 128)
        return WK_EINVAL;
    (void)wrk_host_drop(h, key);
    const uint64_t F = h->fixed, T = h->per_token;
    const bool lin = slot < h->n_slots; /* (none without the lineages' memory) */
    const bool kv = T > 0 && len > F && (len - F) % T == 0;
    /* shared: what the slot's lineage covers, unless its pieces are many (a new chain then) */
    const uint64_t m =
        lin && kv && F + h->lins[slot].rows * T <= len && h->lins[slot].n < WRK_HOST_PIECES_MAX
            ? h->lins[slot].rows
            : 0;
    const uint64_t own = len - m * T; /* the fixed part and the rows past the lineage's */
    /* over the cap: other slots' lineages go, one at a time, until it fits */
    for (uint32_t s = 0; s < h->n_slots && h->held + own > h->cap; s++)
        if (s != slot)
            lin_end(h, s);
    if (h->held + own > h->cap)
        return WK_ENOSPC;
    /*
     * Two segments: the fixed part (everything, without KV) and the KV rows
     * past the lineage's, so that a later copy sharing these rows keeps only
     * them alive, not this copy's fixed part.
     */
    const size_t head = (size_t)(kv ? F : own);
    const size_t tail = (size_t)(own - head);
    wrk_host_entry *e = calloc(1, sizeof(*e));
    wrk_seg *fs = e != NULL ? seg_new(h, head) : NULL;
    wrk_seg *ks = fs != NULL && tail > 0 ? seg_new(h, tail) : NULL;
    if (fs == NULL || (tail > 0 && ks == NULL)) {
        seg_unref(h, fs);
        free(e);
        return WK_ENOMEM;
    }
    snprintf(e->key, sizeof(e->key), "%s", key);
    e->len = len;
    e->own = ks;
    const bool defer = pend != NULL && tail > 0;
    wk_err err = rd(arg, slot, 0, fs->bytes, head);
    if (err == WK_OK && !defer && tail > 0)
        err = rd(arg, slot, F + m * T, ks->bytes, tail);
    size_t cap = 8;
    e->p = err == WK_OK ? malloc(cap * sizeof(*e->p)) : NULL;
    if (err == WK_OK && e->p == NULL)
        err = WK_ENOMEM;
    if (err != WK_OK) {
        seg_unref(h, fs);
        seg_unref(h, ks);
        entry_free(h, e);
        return err;
    }
    e->p[e->n++] = (wrk_piece){fs, 0, head}; /* (the pieces hold the segments' references) */
    if (m > 0 && !pieces_slice(h->lins[slot].p, h->lins[slot].n, 0, m * T, &e->p, &e->n, &cap))
        err = WK_ENOMEM;
    if (err == WK_OK && tail > 0) {
        if (e->n == cap) {
            wrk_piece *q = realloc(e->p, (cap + 1) * sizeof(*q));
            if (q == NULL)
                err = WK_ENOMEM;
            else
                e->p = q;
        }
        if (err == WK_OK)
            e->p[e->n++] = (wrk_piece){ks, 0, tail};
    }
    if (err != WK_OK) {
        if (tail > 0 && (e->n == 0 || e->p[e->n - 1].seg != ks))
            seg_unref(h, ks); /* (not in the pieces yet) */
        entry_free(h, e);
        return err;
    }
    if (defer) {
        ks->pending = true;
        e->fill_off = F + m * T;
        e->fill_len = tail;
        *pend = e;
    }
    e->next = h->head;
    h->head = e;
    if (lin && kv)
        lin_set(h, slot, e);
    else if (lin) /* (an image off the geometry: the slot shares nothing with it) */
        lin_end(h, slot);
    return WK_OK;
}

wk_err
wrk_host_fill(wrk_host *h, wrk_host_entry *p, uint32_t slot, wrk_host_read_fn rd, void *arg)
{
    wk_err err = rd(arg, slot, p->fill_off, p->own->bytes, p->fill_len);
    if (err == WK_OK) {
        p->own->pending = false;
        p->fill_len = 0;
        return WK_OK;
    }
    /* every entry holding bytes still to be read goes, and every lineage (they may too) */
    wrk_host_slot_changed(h, UINT32_MAX);
    for (wrk_host_entry **pp = &h->head; *pp != NULL;) {
        wrk_host_entry *e = *pp;
        bool unread = false;
        for (size_t i = 0; i < e->n && !unread; i++)
            unread = e->p[i].seg->pending;
        if (unread) {
            *pp = e->next;
            entry_free(h, e);
        } else {
            pp = &e->next;
        }
    }
    return err;
}

bool
wrk_host_len(const wrk_host *h, const char *key, uint64_t *len)
{
    const wrk_host_entry *e = entry_find(h, key);
    if (e != NULL)
        *len = e->len;
    return e != NULL;
}

wk_err
wrk_host_load(wrk_host *h, const char *key, uint32_t slot, wrk_host_write_fn wr, void *arg)
{
    const wrk_host_entry *e = entry_find(h, key);
    if (e == NULL)
        return WK_ENOENT;
    wrk_host_slot_changed(h, slot);
    for (size_t i = 0; i < e->n; i++)
        if (e->p[i].seg->pending)
            return WK_ESTATE; /* (never: fills come before the next message) */
    uint64_t off = 0;
    for (size_t i = 0; i < e->n; off += e->p[i].len, i++) {
        wk_err err = wr(arg, slot, off, e->p[i].seg->bytes + e->p[i].off, e->p[i].len);
        if (err != WK_OK)
            return err;
    }
    if (slot < h->n_slots)
        lin_set(h, slot, e);
    return WK_OK;
}

wk_err
wrk_host_read(const wrk_host *h, const char *key, uint64_t off, size_t len, void *buf,
              const uint8_t **direct)
{
    const wrk_host_entry *e = entry_find(h, key);
    if (e == NULL)
        return WK_ENOENT;
    if (off > e->len || len > e->len - off)
        return WK_EINVAL;
    uint64_t at = 0;
    size_t done = 0;
    *direct = buf;
    for (size_t i = 0; i < e->n && done < len; at += e->p[i].len, i++) {
        const wrk_piece *q = &e->p[i];
        if (off + done >= at + q->len)
            continue;
        if (q->seg->pending)
            return WK_ESTATE;
        const size_t from = (size_t)(off + done - at);
        const size_t n = q->len - from < len - done ? q->len - from : len - done;
        if (done == 0 && n == len) { /* one piece holds the range */
            *direct = q->seg->bytes + q->off + from;
            return WK_OK;
        }
        memcpy((uint8_t *)buf + done, q->seg->bytes + q->off + from, n);
        done += n;
    }
    return WK_OK;
}
