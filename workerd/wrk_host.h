/*
 * wrk_host: the worker's warm tier, copies of slot images in host memory
 * under controller-chosen keys (HOST_PUT / HOST_GET / HOST_DROP, a STEP
 * row's snaps, SLOT_READ of an entry).
 *
 * On a hybrid model an image is a fixed part (slot_bytes) followed by the
 * KV of every token so far, kv_token_bytes each (be_kv_info), and the KV
 * of a position never changes once written. So an entry is a list of
 * pieces of refcounted segments, and a slot remembers (its lineage) the KV
 * pieces of the entry it was last loaded from or copied to: the next copy
 * of that slot references those pieces for the rows they cover and copies
 * only its fixed part and the rows past them. A conversation's turn then
 * copies its new tokens' KV, not the whole context's again, and its copies
 * share memory. The lineage is a promise about the slot's bytes, so every
 * operation that may rewrite a slot other than by appending tokens ends it
 * (wrk_host_slot_changed); the worker calls that for every message but the
 * few it knows (deny by default).
 *
 * A copy may defer its KV part (a snap inside a step): wrk_host_put returns
 * the entry and wrk_host_fill reads the rest before the worker takes its
 * next message; a failed fill drops every entry that shares the unfilled
 * bytes and ends every lineage (a missing warm copy is a recompute, a
 * wrong one would not be).
 *
 * Not thread-safe: the worker's message loop owns it. Never logs.
 */
#ifndef WRK_HOST_H
#define WRK_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"

typedef struct wrk_host wrk_host;
typedef struct wrk_host_entry wrk_host_entry;

/* Reads [off, off + len) of slot's image into buf (the backend's slot_read). */
typedef wk_err (*wrk_host_read_fn)(void *arg, uint32_t slot, uint64_t off, void *buf, size_t len);
/* Writes [off, off + len) of slot's image from buf (the backend's slot_write). */
typedef wk_err (*wrk_host_write_fn)(void *arg, uint32_t slot, uint64_t off, const void *buf,
                                    size_t len);

/*
 * A warm tier of at most cap bytes (held: every segment once, however many
 * entries share it) for slots 0..n_slots-1. NULL when out of memory.
 */
wrk_host *wrk_host_new(uint64_t cap, uint32_t n_slots);

/* Frees everything. NULL-safe. */
void wrk_host_free(wrk_host *h);

/*
 * Drops every entry and lineage, and sets the image geometry of the model
 * now loaded: fixed bytes then per_token bytes a token (0: no KV, nothing
 * shared). n_slots: the model's slot count.
 */
wk_err wrk_host_reset(wrk_host *h, uint64_t fixed, uint64_t per_token, uint32_t n_slots);

/* Bytes held now (segments, each once). */
uint64_t wrk_host_bytes(const wrk_host *h);

/* The capacity (wrk_host_new). */
uint64_t wrk_host_cap(const wrk_host *h);

/*
 * Copies slot's image (len bytes now) under key (1..128 bytes), after
 * dropping any entry of that key. What the slot's lineage covers is
 * referenced, the rest copied through rd. With pend (a snap), only the
 * fixed part is read now and *pend is the entry whose KV part
 * wrk_host_fill() must read before the slot changes (NULL: nothing left).
 * Afterwards the slot's lineage is this entry's KV. WK_ENOSPC past the cap
 * (the other slots' lineages given up first), WK_ENOMEM, rd's error; on
 * failure only the dropped entry changed.
 */
wk_err wrk_host_put(wrk_host *h, uint32_t slot, uint64_t len, const char *key, wrk_host_read_fn rd,
                    void *arg, wrk_host_entry **pend);

/*
 * Reads entry p's deferred part from slot through rd. On failure every
 * entry holding bytes still to be read goes (p and every other pending
 * entry: the caller fills no more) and every lineage ends; the error is
 * returned. p must still be in the tier: nothing may drop or replace its
 * key between its wrk_host_put and this call.
 */
wk_err wrk_host_fill(wrk_host *h, wrk_host_entry *p, uint32_t slot, wrk_host_read_fn rd, void *arg);

/* Drops entry key; false when there was none. */
bool wrk_host_drop(wrk_host *h, const char *key);

/* The image size of entry key into *len; false when there is none. */
bool wrk_host_len(const wrk_host *h, const char *key, uint64_t *len);

/*
 * Writes entry key's image into slot through wr (the caller sized the slot
 * to wrk_host_len first); the slot's lineage becomes the entry's KV. WK_ENOENT
 * when there is no such entry, wr's error (the lineage then ends).
 */
wk_err wrk_host_load(wrk_host *h, const char *key, uint32_t slot, wrk_host_write_fn wr, void *arg);

/*
 * [off, off + len) of entry key's image: *direct points into the entry
 * when one piece holds the range, else the bytes are copied into buf (len
 * bytes). WK_ENOENT, WK_EINVAL (past the image).
 */
wk_err wrk_host_read(const wrk_host *h, const char *key, uint64_t off, size_t len, void *buf,
                     const uint8_t **direct);

/* Slot's bytes may have changed other than by appending tokens: its lineage ends
 * (UINT32_MAX: every slot's). */
void wrk_host_slot_changed(wrk_host *h, uint32_t slot);

/* The KV tokens slot's lineage covers (tests, stats). */
uint64_t wrk_host_lineage(const wrk_host *h, uint32_t slot);

#endif /* WRK_HOST_H */
