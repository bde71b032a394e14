/*
 * wk_bpe: tokenizer.json loading and byte-level BPE encoding.
 *
 * Encoding follows the `tokenizers` pipeline: split the input at added
 * tokens (non-normalized ones, then, inside the gaps and after NFC, the
 * normalized ones), pre-tokenize each remaining piece with the GPT-2 pattern
 * (a hand-written matcher over code points, classes from
 * wk_unicode_tables.h), and run BPE on each word's bytes: symbols in a linked
 * list, candidate merges in a binary heap ordered by (rank, position), so a
 * word of n bytes costs O(n log n). The vocab and the merges live in
 * open-addressing hash tables built once at load; nothing is cached or
 * mutated after load, and nothing here logs.
 */
#include "wk_bpe.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_hex.h"
#include "wk_pretok.h"
#include "wk_tok.h"
#include "wk_unicode_tables.h"
#include "wk_utf8.h"

#define BPE_RAW 0x110000u /* code point space for a raw (invalid UTF-8) byte: BPE_RAW | b */
#define BPE_MAX_KEY 4096  /* bytes in one vocab key as written (UTF-8) */
#define BPE_NO_ID (-1)

/* A vocab key in the string table. */
typedef struct bpe_str_slot {
    uint32_t off;  /* offset of the key in wk_bpe.keys */
    uint32_t len;  /* key length in bytes */
    uint32_t hash; /* low bits of the key's hash */
    int32_t id;    /* token id, BPE_NO_ID for an empty slot */
} bpe_str_slot;

/* A merge in the merge table. */
typedef struct bpe_merge_slot {
    uint64_t pair; /* left id << 32 | right id */
    uint32_t rank; /* position in model.merges: lower merges first */
    int32_t id;    /* id of the merged token, BPE_NO_ID for an empty slot */
} bpe_merge_slot;

/* A node of the added-token trie (children are a sibling list). */
typedef struct bpe_trie_node {
    int32_t kid;  /* first child, -1 if none */
    int32_t next; /* next sibling, -1 if none */
    int32_t id;   /* added token ending here, BPE_NO_ID if none */
    uint8_t byte; /* label of the edge from the parent */
} bpe_trie_node;

struct wk_bpe {
    uint32_t vocab_size;   /* largest id + 1 */
    uint32_t count;        /* ids defined */
    uint8_t *bytes;        /* every piece, concatenated */
    uint32_t *piece_off;   /* by id: offset into bytes */
    uint32_t *piece_len;   /* by id: length; 0 when undefined */
    char *keys;            /* vocab keys as written, concatenated */
    bpe_str_slot *str;     /* vocab key -> id, str_mask + 1 slots */
    uint32_t str_mask;     /* slot count - 1 (a power of two minus one) */
    bpe_merge_slot *merge; /* (left, right) -> (rank, merged id) */
    uint32_t merge_mask;   /* slot count - 1 */
    int32_t byte_id[256];  /* token of each single byte */
    bpe_trie_node *trie;   /* added tokens; node 0 and 1 are the two roots */
    uint32_t n_trie;       /* nodes used */
    bool nfc;              /* normalizer NFC */
    bool add_prefix_space; /* ByteLevel add_prefix_space */
    bool use_regex;        /* ByteLevel use_regex (the GPT-2 split) */
    bool ignore_merges;    /* a word that is a vocab key is one token */
    bool spm;              /* SentencePiece-style ("hf-spm") mode, see wk_bpe.h */
    uint8_t spm_prepend;   /* BPE_SPM_*: where a "\u2581" is put in front */
    bool spm_split;        /* Metaspace split: every "\u2581" starts a new word */
    bool byte_fallback;    /* model.byte_fallback: unknown characters become <0xXX> */
    bool fuse_unk;         /* model.fuse_unk: consecutive unknowns are one unk */
    bool strip_lead;       /* the decoder strips one leading space of the text */
    int32_t unk_id;        /* model.unk_token's id, BPE_NO_ID for none */
    int32_t fb_id[256];    /* "<0xXX>" vocab token of each byte, BPE_NO_ID for none */
    uint8_t *added;        /* by id: BPE_ADDED_* (which trie an added token is in) */
    wk_pretok *pretok;     /* regex pre-tokenizer (Split/Digits Sequence), NULL: ByteLevel alone */
    wk_pretok_wordchar *wordchar; /* word characters, when a single_word added token needs them */
};

/* What wk_bpe.added says of an id: a kind, or'd with the strip flags. */
enum {
    BPE_ADDED_NONE = 0,    /* not an added token */
    BPE_ADDED_RAW = 1,     /* non-normalized: matched in the raw input (trie root 0) */
    BPE_ADDED_NORM = 2,    /* normalized: matched in the normalized gaps (trie root 1) */
    BPE_ADDED_KIND = 3,    /* mask of the kind */
    BPE_ADDED_LSTRIP = 4,  /* lstrip: takes the white space before it */
    BPE_ADDED_RSTRIP = 8,  /* rstrip: takes the white space after it */
    BPE_ADDED_SINGLE = 16, /* single_word: only where no word character touches it */
};

/* How the SentencePiece-style modes put the word-boundary mark in front of text. */
enum {
    BPE_SPM_NEVER = 0, /* Metaspace prepend_scheme "never" */
    BPE_SPM_NORM,      /* normalizer Prepend: every normalized piece, unconditionally */
    BPE_SPM_ALWAYS,    /* Metaspace "always": every piece not already starting with it */
    BPE_SPM_FIRST,     /* Metaspace "first": only the piece at input offset 0, same condition */
};

#define BPE_MS "\xe2\x96\x81" /* U+2581, the SentencePiece space, in UTF-8 */
#define BPE_MS_LEN 3

/* Load-time context. */
typedef struct bpe_ld {
    const char *label; /* diag prefix */
    wk_diag *d;        /* caller's diag, may be NULL */
} bpe_ld;

static wk_err WK_PRINTF(3, 4)
bpe_fail(bpe_ld *c, wk_err err, const char *fmt, ...)
{
    char msg[440];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return wk_diag_set(c->d, err, "%s: %s", c->label, msg);
}

/* A short, printable, quoted-safe rendering of n bytes of s for diags. */
static const char *
bpe_show(const char *s, size_t n, char buf[72])
{
    size_t o = 0;

    for (size_t i = 0; i < n && o < 60; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
            buf[o++] = (char)c;
        else
            o += (size_t)snprintf(buf + o, 72 - o, "\\x%02x", c);
    }
    if (o >= 60 && n > 0)
        o += (size_t)snprintf(buf + o, 72 - o, "...");
    buf[o] = '\0';
    return buf;
}

/* ---- byte-level alphabet (GPT-2 bytes_to_unicode) ---- */

static uint32_t
bpe_byte_cp(uint8_t b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    if (b <= 32)
        return 256u + b;
    if (b <= 160)
        return 256u + 33 + (b - 127u);
    return 256u + 33 + 34; /* 173 */
}

/* Byte of alphabet code point cp, or -1 if cp is not in the alphabet. */
static int
bpe_cp_byte(uint32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp >= 256 && cp <= 288)
        return (int)(cp - 256);
    if (cp >= 289 && cp <= 322)
        return (int)(127 + cp - 289);
    if (cp == 323)
        return 173;
    return -1;
}

/* ---- UTF-8 ---- */

/* Writes code point cp (or a raw byte BPE_RAW | b) at out; returns bytes written (1..4). */
static size_t
bpe_utf8_enc(uint32_t cp, uint8_t *out)
{
    if (cp >= BPE_RAW) {
        out[0] = (uint8_t)(cp & 0xff);
        return 1;
    }
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xc0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xe0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (uint8_t)(0xf0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* Decodes n bytes into code points (raw bytes as BPE_RAW | b); cps holds n. Returns the count. */
static size_t
bpe_cps_from(const uint8_t *s, size_t n, uint32_t *cps)
{
    size_t k = 0;

    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = wk_utf8_dec(s + i, n - i, &cp);
        if (l == 0) {
            cps[k++] = BPE_RAW | s[i];
            i++;
        } else {
            cps[k++] = cp;
            i += l;
        }
    }
    return k;
}

/* ---- Unicode tables ---- */

static int
bpe_range_find(const wk_uni_range *r, size_t n, uint32_t cp)
{
    size_t a = 0, b = n;

    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (cp < r[m].lo)
            b = m;
        else if (cp > r[m].hi)
            a = m + 1;
        else
            return r[m].val;
    }
    return 0;
}

#define BPE_CLASS_OTHER 0

/* Regex class of cp: WK_UNI_CLASS_L/N/S or BPE_CLASS_OTHER. */
static int
bpe_class(uint32_t cp)
{
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
            return WK_UNI_CLASS_L;
        if (cp >= '0' && cp <= '9')
            return WK_UNI_CLASS_N;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d))
            return WK_UNI_CLASS_S;
        return BPE_CLASS_OTHER;
    }
    if (cp >= BPE_RAW)
        return BPE_CLASS_OTHER;
    return bpe_range_find(wk_uni_class, sizeof(wk_uni_class) / sizeof(wk_uni_class[0]), cp);
}

static int
bpe_ccc(uint32_t cp)
{
    if (cp < 0x300 || cp >= BPE_RAW)
        return 0;
    return bpe_range_find(wk_uni_ccc, sizeof(wk_uni_ccc) / sizeof(wk_uni_ccc[0]), cp);
}

#define BPE_SBASE 0xac00u
#define BPE_LBASE 0x1100u
#define BPE_VBASE 0x1161u
#define BPE_TBASE 0x11a7u
#define BPE_LCOUNT 19u
#define BPE_VCOUNT 21u
#define BPE_TCOUNT 28u
#define BPE_NCOUNT (BPE_VCOUNT * BPE_TCOUNT)
#define BPE_SCOUNT (BPE_LCOUNT * BPE_NCOUNT)

/* Full canonical decomposition of cp into out (WK_UNI_DECOMP_MAX room); returns the count. */
static size_t
bpe_decompose(uint32_t cp, uint32_t *out)
{
    if (cp >= BPE_SBASE && cp < BPE_SBASE + BPE_SCOUNT) {
        uint32_t s = cp - BPE_SBASE;
        out[0] = BPE_LBASE + s / BPE_NCOUNT;
        out[1] = BPE_VBASE + (s % BPE_NCOUNT) / BPE_TCOUNT;
        if (s % BPE_TCOUNT == 0)
            return 2;
        out[2] = BPE_TBASE + s % BPE_TCOUNT;
        return 3;
    }
    if (cp >= 0xc0 && cp < BPE_RAW) {
        size_t a = 0, b = sizeof(wk_uni_decomp) / sizeof(wk_uni_decomp[0]);
        while (a < b) {
            size_t m = a + (b - a) / 2;
            if (cp < wk_uni_decomp[m].cp) {
                b = m;
            } else if (cp > wk_uni_decomp[m].cp) {
                a = m + 1;
            } else {
                memcpy(out, wk_uni_decomp_cps + wk_uni_decomp[m].off,
                       wk_uni_decomp[m].len * sizeof(*out));
                return wk_uni_decomp[m].len;
            }
        }
    }
    out[0] = cp;
    return 1;
}

/* Primary composite of (a, b), or 0 if none. */
static uint32_t
bpe_compose(uint32_t a, uint32_t b)
{
    if (a >= BPE_LBASE && a < BPE_LBASE + BPE_LCOUNT && b >= BPE_VBASE &&
        b < BPE_VBASE + BPE_VCOUNT)
        return BPE_SBASE + ((a - BPE_LBASE) * BPE_VCOUNT + (b - BPE_VBASE)) * BPE_TCOUNT;
    if (a >= BPE_SBASE && a < BPE_SBASE + BPE_SCOUNT && (a - BPE_SBASE) % BPE_TCOUNT == 0 &&
        b > BPE_TBASE && b < BPE_TBASE + BPE_TCOUNT)
        return a + (b - BPE_TBASE);
    if (a >= BPE_RAW || b >= BPE_RAW)
        return 0;
    uint64_t key = ((uint64_t)a << 21) | b;
    size_t lo = 0, hi = sizeof(wk_uni_comp) / sizeof(wk_uni_comp[0]);
    while (lo < hi) {
        size_t m = lo + (hi - lo) / 2;
        if (key < wk_uni_comp[m].pair)
            hi = m;
        else if (key > wk_uni_comp[m].pair)
            lo = m + 1;
        else
            return wk_uni_comp[m].cp;
    }
    return 0;
}

/*
 * Canonical ordering (UAX #15): each run of non-starters is sorted by
 * combining class, stably. A bottom-up merge sort on (class, code point)
 * pairs: O(n log n) however long a run is (an insertion sort is quadratic
 * on a hostile run of alternating marks). Runs of one mark cost nothing.
 */
typedef struct bpe_mark {
    uint32_t cp;
    uint32_t cc;
} bpe_mark;

static wk_err
bpe_nfc_order(uint32_t *v, size_t k)
{
    bpe_mark *a = NULL, *b = NULL;
    size_t cap = 0;
    for (size_t i = 0; i < k;) {
        if (bpe_ccc(v[i]) == 0) {
            i++;
            continue;
        }
        size_t e = i;
        while (e < k && bpe_ccc(v[e]) != 0)
            e++;
        size_t n = e - i;
        if (n > 1) {
            if (n > cap) {
                free(a);
                free(b);
                a = malloc(n * sizeof(*a));
                b = malloc(n * sizeof(*b));
                if (a == NULL || b == NULL) {
                    free(a);
                    free(b);
                    return WK_ENOMEM;
                }
                cap = n;
            }
            for (size_t j = 0; j < n; j++)
                a[j] = (bpe_mark){.cp = v[i + j], .cc = (uint32_t)bpe_ccc(v[i + j])};
            for (size_t w = 1; w < n; w *= 2) {
                for (size_t lo = 0; lo < n; lo += 2 * w) {
                    size_t mid = lo + w < n ? lo + w : n;
                    size_t hi = lo + 2 * w < n ? lo + 2 * w : n;
                    size_t x = lo, y = mid, o = lo;
                    while (x < mid && y < hi)
                        b[o++] = a[y].cc < a[x].cc ? a[y++] : a[x++]; /* ties: left first */
                    while (x < mid)
                        b[o++] = a[x++];
                    while (y < hi)
                        b[o++] = a[y++];
                }
                bpe_mark *t = a;
                a = b;
                b = t;
            }
            for (size_t j = 0; j < n; j++)
                v[i + j] = a[j].cp;
        }
        i = e;
    }
    free(a);
    free(b);
    return WK_OK;
}

/*
 * NFC of n code points at in (raw bytes pass through as starters). On
 * success *out is malloc'd with *n_out code points. Returns WK_OK or WK_ENOMEM.
 */
static wk_err
bpe_nfc(const uint32_t *in, size_t n, uint32_t **out, size_t *n_out)
{
    size_t cap = n + 16, k = 0;
    uint32_t *v = malloc(cap * sizeof(*v));
    uint32_t tmp[WK_UNI_DECOMP_MAX > 3 ? WK_UNI_DECOMP_MAX : 3];

    if (v == NULL)
        return WK_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        size_t m = bpe_decompose(in[i], tmp);
        if (k + m > cap) {
            size_t nc = cap * 2 + m;
            uint32_t *nv = realloc(v, nc * sizeof(*v));
            if (nv == NULL) {
                free(v);
                return WK_ENOMEM;
            }
            v = nv;
            cap = nc;
        }
        memcpy(v + k, tmp, m * sizeof(*v));
        k += m;
    }
    if (bpe_nfc_order(v, k) != WK_OK) {
        free(v);
        return WK_ENOMEM;
    }
    /* Canonical composition (UAX #15). */
    if (k > 0) {
        size_t starter = 0, w = 1;
        int last = bpe_ccc(v[0]) ? 256 : 0;
        for (size_t i = 1; i < k; i++) {
            uint32_t c = v[i];
            int cc = bpe_ccc(c);
            uint32_t comp = bpe_compose(v[starter], c);
            if (comp != 0 && (last < cc || last == 0)) {
                v[starter] = comp;
                continue;
            }
            if (cc == 0)
                starter = w;
            last = cc;
            v[w++] = c;
        }
        k = w;
    }
    *out = v;
    *n_out = k;
    return WK_OK;
}

/* ---- hash tables ---- */

static uint64_t
bpe_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t
bpe_mix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

static uint32_t
bpe_pow2(size_t n)
{
    size_t c = 16;
    while (c < n * 2)
        c *= 2;
    return (uint32_t)c;
}

/* Slot of key s/n in the string table: its own, or the empty one where it would go. */
static bpe_str_slot *
bpe_str_slot_of(const wk_bpe *b, const char *s, size_t n)
{
    uint64_t h = bpe_hash(s, n);
    uint32_t i = (uint32_t)h & b->str_mask;

    for (;;) {
        bpe_str_slot *sl = &b->str[i];
        if (sl->id == BPE_NO_ID)
            return sl;
        if (sl->hash == (uint32_t)h && sl->len == n && memcmp(b->keys + sl->off, s, n) == 0)
            return sl;
        i = (i + 1) & b->str_mask;
    }
}

static int32_t
bpe_str_get(const wk_bpe *b, const char *s, size_t n)
{
    return bpe_str_slot_of(b, s, n)->id;
}

static bpe_merge_slot *
bpe_merge_slot_of(const wk_bpe *b, uint64_t pair)
{
    uint32_t i = (uint32_t)bpe_mix(pair) & b->merge_mask;

    for (;;) {
        bpe_merge_slot *sl = &b->merge[i];
        if (sl->id == BPE_NO_ID || sl->pair == pair)
            return sl;
        i = (i + 1) & b->merge_mask;
    }
}

/* ---- loading ---- */

static bool
bpe_json_bool(const json_t *o, const char *key, bool def, bool *out)
{
    json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v)) {
        *out = def;
        return true;
    }
    if (!json_is_boolean(v))
        return false;
    *out = json_is_true(v);
    return true;
}

/* The "type" string of component o (an object), or NULL. */
static const char *
bpe_type(const json_t *o)
{
    return json_string_value(json_object_get(o, "type"));
}

static wk_err
bpe_check_normalizer(bpe_ld *c, wk_bpe *b, const json_t *n, const char *path)
{
    const char *ty;
    char sh[72];

    if (n == NULL || json_is_null(n))
        return WK_OK;
    if (!json_is_object(n) || (ty = bpe_type(n)) == NULL)
        return bpe_fail(c, WK_EINVAL, "%s is not an object with a \"type\"", path);
    if (strcmp(ty, "NFC") == 0) {
        b->nfc = true;
        return WK_OK;
    }
    if (strcmp(ty, "Sequence") == 0) {
        json_t *arr = json_object_get(n, "normalizers");
        char sub[64];
        if (!json_is_array(arr))
            return bpe_fail(c, WK_EINVAL, "%s.normalizers is not an array", path);
        if (json_array_size(arr) > 1)
            return bpe_fail(c, WK_ENOTSUP, "%s: a Sequence of %zu normalizers is not supported",
                            path, json_array_size(arr));
        if (json_array_size(arr) == 0)
            return WK_OK;
        snprintf(sub, sizeof(sub), "%s.normalizers[0]", path);
        json_t *one = json_array_get(arr, 0);
        if (json_is_object(one) && bpe_type(one) != NULL && strcmp(bpe_type(one), "Sequence") == 0)
            return bpe_fail(c, WK_ENOTSUP, "%s: nested Sequence is not supported", sub);
        return bpe_check_normalizer(c, b, one, sub);
    }
    return bpe_fail(c, WK_ENOTSUP, "%s.type \"%s\" is not supported (only NFC)", path,
                    bpe_show(ty, strlen(ty), sh));
}

static wk_err
bpe_check_bytelevel(bpe_ld *c, const json_t *o, const char *path, bool *prefix, bool *regex)
{
    if (!bpe_json_bool(o, "add_prefix_space", true, prefix))
        return bpe_fail(c, WK_EINVAL, "%s.add_prefix_space is not a boolean", path);
    if (regex != NULL && !bpe_json_bool(o, "use_regex", true, regex))
        return bpe_fail(c, WK_EINVAL, "%s.use_regex is not a boolean", path);
    return WK_OK;
}

/*
 * A regex pre-tokenizer (a Sequence of Split/Digits members ending in
 * ByteLevel): built by wk_pretok from the component's JSON text.
 */
static wk_err
bpe_load_pretok(bpe_ld *c, wk_bpe *b, const json_t *p)
{
    char path[96];
    char *js = json_dumps(p, JSON_COMPACT);
    wk_err err;

    if (js == NULL)
        return bpe_fail(c, WK_ENOMEM, "out of memory");
    snprintf(path, sizeof(path), "%s: pre_tokenizer", c->label);
    err = wk_pretok_new(js, strlen(js), path, &b->pretok, c->d);
    free(js);
    return err;
}

static wk_err
bpe_check_pretok(bpe_ld *c, wk_bpe *b, const json_t *p)
{
    const char *ty;
    char sh[72];
    const char *path = "pre_tokenizer";

    if (p == NULL || json_is_null(p))
        return bpe_fail(c, WK_ENOTSUP, "pre_tokenizer is null; only ByteLevel is supported");
    if (!json_is_object(p) || (ty = bpe_type(p)) == NULL)
        return bpe_fail(c, WK_EINVAL, "pre_tokenizer is not an object with a \"type\"");
    if (strcmp(ty, "Sequence") == 0) {
        json_t *arr = json_object_get(p, "pretokenizers");
        if (!json_is_array(arr))
            return bpe_fail(c, WK_EINVAL, "pre_tokenizer.pretokenizers is not an array");
        if (json_array_size(arr) == 0)
            return bpe_fail(c, WK_ENOTSUP,
                            "pre_tokenizer: an empty Sequence is not supported (it needs "
                            "ByteLevel)");
        if (json_array_size(arr) != 1)
            return bpe_load_pretok(c, b, p);
        p = json_array_get(arr, 0);
        path = "pre_tokenizer.pretokenizers[0]";
        if (!json_is_object(p) || (ty = bpe_type(p)) == NULL)
            return bpe_fail(c, WK_EINVAL, "%s is not an object with a \"type\"", path);
    }
    if (strcmp(ty, "ByteLevel") != 0)
        return bpe_fail(c, WK_ENOTSUP, "%s.type \"%s\" is not supported", path,
                        bpe_show(ty, strlen(ty), sh));
    return bpe_check_bytelevel(c, p, path, &b->add_prefix_space, &b->use_regex);
}

static wk_err
bpe_check_decoder(bpe_ld *c, const json_t *p)
{
    const char *ty;
    char sh[72];

    if (p == NULL || json_is_null(p))
        return bpe_fail(c, WK_ENOTSUP, "decoder is null; only ByteLevel is supported");
    if (!json_is_object(p) || (ty = bpe_type(p)) == NULL)
        return bpe_fail(c, WK_EINVAL, "decoder is not an object with a \"type\"");
    if (strcmp(ty, "ByteLevel") != 0)
        return bpe_fail(c, WK_ENOTSUP, "decoder.type \"%s\" is not supported",
                        bpe_show(ty, strlen(ty), sh));
    return WK_OK;
}

/* ---- SentencePiece-style (Llama / Mistral) components ---- */

/* True when o is an object whose "type" is ty. */
static bool
bpe_is(const json_t *o, const char *ty)
{
    const char *t = json_is_object(o) ? bpe_type(o) : NULL;
    return t != NULL && strcmp(t, ty) == 0;
}

/* True when member key of o is the string want. */
static bool
bpe_str_is(const json_t *o, const char *key, const char *want)
{
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) && json_string_length(v) == strlen(want) &&
           strcmp(json_string_value(v), want) == 0;
}

/* True when o is {"type": "Replace", "pattern": {"String": from}, "content": to}. */
static bool
bpe_is_replace(const json_t *o, const char *from, const char *to)
{
    const json_t *pat = json_object_get(o, "pattern");
    return bpe_is(o, "Replace") && json_is_object(pat) && json_object_size(pat) == 1 &&
           bpe_str_is(pat, "String", from) && bpe_str_is(o, "content", to);
}

/* True when member key of o is the integer want. */
static bool
bpe_int_is(const json_t *o, const char *key, json_int_t want)
{
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) && json_integer_value(v) == want;
}

/*
 * Reads a Metaspace component's prepend rule (pre-tokenizer or decoder, at
 * path): replacement must be U+2581; prepend_scheme "first", "always"
 * (the default) or "never"; the older add_prefix_space must agree with it,
 * as the library requires.
 */
static wk_err
bpe_check_metaspace(bpe_ld *c, const json_t *o, const char *path, uint8_t *scheme)
{
    const json_t *ps = json_object_get(o, "prepend_scheme");
    const json_t *aps = json_object_get(o, "add_prefix_space");
    char sh[72];

    if (!bpe_str_is(o, "replacement", BPE_MS))
        return bpe_fail(c, WK_ENOTSUP, "%s.replacement must be \"\\u2581\"", path);
    if (ps == NULL || json_is_null(ps)) {
        *scheme = aps != NULL && json_is_false(aps) ? BPE_SPM_NEVER : BPE_SPM_ALWAYS;
    } else if (!json_is_string(ps)) {
        return bpe_fail(c, WK_EINVAL, "%s.prepend_scheme is not a string", path);
    } else if (strcmp(json_string_value(ps), "first") == 0) {
        *scheme = BPE_SPM_FIRST;
    } else if (strcmp(json_string_value(ps), "always") == 0) {
        *scheme = BPE_SPM_ALWAYS;
    } else if (strcmp(json_string_value(ps), "never") == 0) {
        *scheme = BPE_SPM_NEVER;
    } else {
        return bpe_fail(c, WK_EINVAL, "%s.prepend_scheme \"%s\" is not first, always or never",
                        path, bpe_show(json_string_value(ps), json_string_length(ps), sh));
    }
    if (aps != NULL && !json_is_null(aps)) {
        if (!json_is_boolean(aps))
            return bpe_fail(c, WK_EINVAL, "%s.add_prefix_space is not a boolean", path);
        if (json_is_true(aps) != (*scheme != BPE_SPM_NEVER))
            return bpe_fail(c, WK_EINVAL, "%s.add_prefix_space does not match prepend_scheme",
                            path);
    }
    return WK_OK;
}

/*
 * The decoder of the SentencePiece-style mode: Sequence[Replace("\u2581" ->
 * " "), ByteFallback, Fuse, Strip(" ", 1, 0)] (Strip optional) or Metaspace.
 * Sets strip_lead: whether decoding drops one leading space of the text.
 */
static wk_err
bpe_check_spm_decoder(bpe_ld *c, wk_bpe *b, const json_t *p)
{
    const char *ty;
    char sh[72];

    if (p == NULL || json_is_null(p))
        return bpe_fail(c, WK_ENOTSUP,
                        "decoder is null; only Metaspace or the Llama Sequence "
                        "is supported with this pre_tokenizer");
    if (!json_is_object(p) || (ty = bpe_type(p)) == NULL)
        return bpe_fail(c, WK_EINVAL, "decoder is not an object with a \"type\"");
    if (strcmp(ty, "Metaspace") == 0) {
        uint8_t scheme;
        wk_err err = bpe_check_metaspace(c, p, "decoder", &scheme);
        b->strip_lead = scheme != BPE_SPM_NEVER;
        return err;
    }
    if (strcmp(ty, "Sequence") != 0)
        return bpe_fail(c, WK_ENOTSUP,
                        "decoder.type \"%s\" is not supported (only Metaspace or "
                        "Sequence[Replace, ByteFallback, Fuse, Strip])",
                        bpe_show(ty, strlen(ty), sh));
    const json_t *arr = json_object_get(p, "decoders");
    size_t n = json_array_size(arr);
    if (!json_is_array(arr))
        return bpe_fail(c, WK_EINVAL, "decoder.decoders is not an array");
    if ((n != 3 && n != 4) || !bpe_is_replace(json_array_get(arr, 0), BPE_MS, " ") ||
        !bpe_is(json_array_get(arr, 1), "ByteFallback") || !bpe_is(json_array_get(arr, 2), "Fuse"))
        return bpe_fail(c, WK_ENOTSUP,
                        "decoder: only the Sequence [Replace(\"\\u2581\", \" \"), ByteFallback, "
                        "Fuse, Strip(\" \", 1, 0)] is supported (Strip optional)");
    if (n == 4) {
        const json_t *st = json_array_get(arr, 3);
        if (!bpe_is(st, "Strip") || !bpe_str_is(st, "content", " ") ||
            !bpe_int_is(st, "start", 1) || !bpe_int_is(st, "stop", 0))
            return bpe_fail(c, WK_ENOTSUP,
                            "decoder.decoders[3]: only Strip(\" \", start 1, stop 0) is supported");
        b->strip_lead = true;
    }
    return WK_OK;
}

/*
 * The SentencePiece-style pipeline: either the Llama-2 conversion (normalizer
 * Sequence[Prepend("\u2581"), Replace(" " -> "\u2581")], pre_tokenizer null)
 * or a Metaspace pre_tokenizer with normalizer null; then the decoder.
 */
static wk_err
bpe_check_spm(bpe_ld *c, wk_bpe *b, const json_t *norm, const json_t *pre, const json_t *dec)
{
    wk_err err;

    if (pre == NULL || json_is_null(pre)) {
        const json_t *arr = json_object_get(norm, "normalizers");
        const json_t *pp = json_array_get(arr, 0);
        if (!bpe_is(norm, "Sequence") || json_array_size(arr) != 2 || !bpe_is(pp, "Prepend") ||
            !bpe_str_is(pp, "prepend", BPE_MS) ||
            !bpe_is_replace(json_array_get(arr, 1), " ", BPE_MS))
            return bpe_fail(c, WK_ENOTSUP,
                            "pre_tokenizer is null, which is supported only with the normalizer "
                            "Sequence[Prepend(\"\\u2581\"), Replace(\" \", \"\\u2581\")] "
                            "(else use ByteLevel or Metaspace)");
        b->spm_prepend = BPE_SPM_NORM;
        b->spm_split = false;
    } else {
        if (norm != NULL && !json_is_null(norm))
            return bpe_fail(c, WK_ENOTSUP,
                            "normalizer must be null with a Metaspace pre_tokenizer");
        if ((err = bpe_check_metaspace(c, pre, "pre_tokenizer", &b->spm_prepend)) != WK_OK)
            return err;
        if (!bpe_json_bool(pre, "split", true, &b->spm_split))
            return bpe_fail(c, WK_EINVAL, "pre_tokenizer.split is not a boolean");
    }
    return bpe_check_spm_decoder(c, b, dec);
}

/* Reads an id field: an integer in 0..WK_TOK_MAX_ID. */
static bool
bpe_json_id(const json_t *v, int32_t *id)
{
    if (!json_is_integer(v))
        return false;
    json_int_t x = json_integer_value(v);
    if (x < 0 || x > WK_TOK_MAX_ID)
        return false;
    *id = (int32_t)x;
    return true;
}

/* Adds content/n as an added token id to trie root (0 or 1). */
static void
bpe_trie_add(wk_bpe *b, uint32_t root, const char *s, size_t n, int32_t id)
{
    int32_t q = (int32_t)root;

    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        int32_t k = b->trie[q].kid;
        while (k >= 0 && b->trie[k].byte != c)
            k = b->trie[k].next;
        if (k < 0) {
            k = (int32_t)b->n_trie++;
            b->trie[k] =
                (bpe_trie_node){.kid = -1, .next = b->trie[q].kid, .id = BPE_NO_ID, .byte = c};
            b->trie[q].kid = k;
        }
        q = k;
    }
    b->trie[q].id = id;
}

/* Longest added token of trie root at s (n bytes); returns its length (0: none), sets *id. */
static size_t
bpe_trie_match(const wk_bpe *b, uint32_t root, const uint8_t *s, size_t n, int32_t *id)
{
    int32_t q = (int32_t)root;
    size_t best = 0;

    for (size_t i = 0; i < n; i++) {
        int32_t k = b->trie[q].kid;
        while (k >= 0 && b->trie[k].byte != s[i])
            k = b->trie[k].next;
        if (k < 0)
            break;
        q = k;
        if (b->trie[q].id != BPE_NO_ID) {
            best = i + 1;
            *id = b->trie[q].id;
        }
    }
    return best;
}

/* Sets piece id to n bytes at s; the pool has room (checked by the caller's sizing). */
static void
bpe_piece_set(wk_bpe *b, size_t *pool_len, int32_t id, const uint8_t *s, size_t n)
{
    memcpy(b->bytes + *pool_len, s, n);
    b->piece_off[id] = (uint32_t)*pool_len;
    b->piece_len[id] = (uint32_t)n;
    *pool_len += n;
}

/* Decodes vocab key s (UTF-8, n bytes) through the alphabet into out; false if it can't. */
static bool
bpe_key_bytes(const char *s, size_t n, uint8_t *out, size_t *out_len)
{
    size_t k = 0;

    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = wk_utf8_dec((const uint8_t *)s + i, n - i, &cp);
        int byte;
        if (l == 0 || (byte = bpe_cp_byte(cp)) < 0)
            return false;
        out[k++] = (uint8_t)byte;
        i += l;
    }
    *out_len = k;
    return true;
}

/* Value of hex digit c, -1 if it is none. */
/*
 * Byte of a byte-fallback key "<0xXX>" (either case, as the ByteFallback
 * decoder reads it), -1 if s is none; *upper: the digits are uppercase, the
 * form the model looks up when it falls back.
 */
static int
bpe_fb_byte(const char *s, size_t n, bool *upper)
{
    int hi, lo;

    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>' || (hi = wk_hex_digit((unsigned char)s[3])) < 0 ||
        (lo = wk_hex_digit((unsigned char)s[4])) < 0)
        return -1;
    *upper = !(s[3] >= 'a' && s[3] <= 'f') && !(s[4] >= 'a' && s[4] <= 'f');
    return hi * 16 + lo;
}

/* Copies n bytes of s to out with every "\u2581" as a space; returns the length (<= n). */
static size_t
bpe_spm_unmark(const char *s, size_t n, uint8_t *out)
{
    size_t k = 0;

    for (size_t i = 0; i < n;) {
        if (n - i >= BPE_MS_LEN && memcmp(s + i, BPE_MS, BPE_MS_LEN) == 0) {
            out[k++] = ' ';
            i += BPE_MS_LEN;
        } else {
            out[k++] = (uint8_t)s[i++];
        }
    }
    return k;
}

/*
 * Writes n bytes of s to out with every space as "\u2581", after a leading
 * "\u2581" if prepend; out holds 3 * n + 3 bytes. Returns the length.
 */
static size_t
bpe_spm_mark(const uint8_t *s, size_t n, bool prepend, uint8_t *out)
{
    size_t k = 0;

    if (prepend) {
        memcpy(out, BPE_MS, BPE_MS_LEN);
        k = BPE_MS_LEN;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(out + k, BPE_MS, BPE_MS_LEN);
            k += BPE_MS_LEN;
        } else {
            out[k++] = s[i];
        }
    }
    return k;
}

static wk_err
bpe_load_added(bpe_ld *c, wk_bpe *b, const json_t *added, uint8_t *is_added, size_t *pool_len)
{
    size_t i;
    json_t *t;
    char sh[72];

    char scratch[3 * WK_TOK_MAX_PIECE + BPE_MS_LEN];

    json_array_foreach(added, i, t) {
        int32_t id;
        const char *content;
        size_t n;
        bool special, normalized, flag;

        if (!json_is_object(t))
            return bpe_fail(c, WK_EINVAL, "added_tokens[%zu] is not an object", i);
        if (!bpe_json_id(json_object_get(t, "id"), &id))
            return bpe_fail(c, WK_EINVAL, "added_tokens[%zu].id is not an integer in 0..%d", i,
                            WK_TOK_MAX_ID);
        content = json_string_value(json_object_get(t, "content"));
        if (content == NULL)
            return bpe_fail(c, WK_EINVAL, "added_tokens[%zu].content is not a string", i);
        n = json_string_length(json_object_get(t, "content"));
        if (n == 0 || n > WK_TOK_MAX_PIECE)
            return bpe_fail(c, WK_EINVAL, "added_tokens[%zu].content has %zu bytes (1..%d)", i, n,
                            WK_TOK_MAX_PIECE);
        if (!bpe_json_bool(t, "special", false, &special))
            return bpe_fail(c, WK_EINVAL, "added_tokens[%zu].special is not a boolean", i);
        if (!bpe_json_bool(t, "normalized", !special, &normalized))
            return bpe_fail(c, WK_EINVAL, "added_tokens[%zu].normalized is not a boolean", i);
        /* single_word / lstrip / rstrip: byte-level mode only */
        static const char *const flags[] = {"single_word", "lstrip", "rstrip"};
        static const uint8_t bits[] = {BPE_ADDED_SINGLE, BPE_ADDED_LSTRIP, BPE_ADDED_RSTRIP};
        uint8_t strip = 0;
        for (size_t f = 0; f < 3; f++) {
            if (!bpe_json_bool(t, flags[f], false, &flag))
                return bpe_fail(c, WK_EINVAL, "added_tokens[%zu].%s is not a boolean", i, flags[f]);
            if (flag && b->spm)
                return bpe_fail(c, WK_ENOTSUP,
                                "added_tokens[%zu].%s true is not supported with this "
                                "pre_tokenizer",
                                i, flags[f]);
            if (flag)
                strip |= bits[f];
        }
        if ((strip & BPE_ADDED_SINGLE) && b->wordchar == NULL) {
            wk_err werr = wk_pretok_wordchar_new(&b->wordchar, c->d);
            if (werr != WK_OK)
                return werr;
        }
        if (is_added[id])
            return bpe_fail(c, WK_EINVAL, "added_tokens[%zu]: duplicate id %d", i, (int)id);
        /*
         * A normalized token is matched in normalized text, so the Llama-2
         * normalizer applies to its content too (the library does the same);
         * in the SentencePiece-style mode its piece is that content with
         * "\u2581" read as a space, which is what the decoder makes of it.
         */
        const char *key = content;
        size_t kn = n;
        if (b->spm && b->spm_prepend == BPE_SPM_NORM && normalized) {
            kn = bpe_spm_mark((const uint8_t *)content, n, true, (uint8_t *)scratch);
            key = scratch;
        }
        /* The same content twice would make matching ambiguous. */
        int32_t other = BPE_NO_ID;
        if (bpe_trie_match(b, 0, (const uint8_t *)key, kn, &other) == kn ||
            bpe_trie_match(b, 1, (const uint8_t *)key, kn, &other) == kn)
            return bpe_fail(c, WK_EINVAL, "added_tokens[%zu]: content \"%s\" is also id %d", i,
                            bpe_show(content, n, sh), (int)other);
        is_added[id] = (normalized ? BPE_ADDED_NORM : BPE_ADDED_RAW) | strip;
        bpe_trie_add(b, normalized ? 1 : 0, key, kn, id);
        if (b->spm) {
            size_t pn = bpe_spm_unmark(key, kn, b->bytes + *pool_len);
            if (pn > WK_TOK_MAX_PIECE)
                return bpe_fail(c, WK_EINVAL,
                                "added_tokens[%zu].content has %zu bytes once normalized (1..%d)",
                                i, pn, WK_TOK_MAX_PIECE);
            bpe_piece_set(b, pool_len, id, b->bytes + *pool_len, pn);
        } else {
            bpe_piece_set(b, pool_len, id, (const uint8_t *)content, n);
        }
    }
    return WK_OK;
}

static wk_err
bpe_load_vocab(bpe_ld *c, wk_bpe *b, const json_t *vocab, const uint8_t *is_added,
               uint8_t *in_vocab, size_t *pool_len)
{
    const char *key;
    json_t *v;
    size_t key_off = 0;
    uint8_t piece[BPE_MAX_KEY];
    char sh[72];

    json_object_foreach((json_t *)vocab, key, v) {
        size_t n = strlen(key), plen;
        int32_t id;

        if (!bpe_json_id(v, &id))
            return bpe_fail(c, WK_EINVAL, "model.vocab \"%s\": id is not an integer in 0..%d",
                            bpe_show(key, n, sh), WK_TOK_MAX_ID);
        if (n == 0)
            return bpe_fail(c, WK_EINVAL, "model.vocab: empty token (id %d)", (int)id);
        if (n > BPE_MAX_KEY)
            return bpe_fail(c, WK_EINVAL, "model.vocab \"%s\": key over %d bytes",
                            bpe_show(key, n, sh), BPE_MAX_KEY);
        if (in_vocab[id])
            return bpe_fail(c, WK_EINVAL, "model.vocab \"%s\": duplicate id %d",
                            bpe_show(key, n, sh), (int)id);
        in_vocab[id] = 1;
        bpe_str_slot *sl = bpe_str_slot_of(b, key, n);
        /* Keys are unique (JSON_REJECT_DUPLICATES), so sl is empty. */
        memcpy(b->keys + key_off, key, n);
        *sl = (bpe_str_slot){.off = (uint32_t)key_off,
                             .len = (uint32_t)n,
                             .hash = (uint32_t)bpe_hash(key, n),
                             .id = id};
        key_off += n;
        if (b->spm) {
            bool upper = false;
            int by = bpe_fb_byte(key, n, &upper);
            if (by >= 0 && upper)
                b->fb_id[by] = id;
            if (is_added[id])
                continue;
            if (by >= 0) {
                piece[0] = (uint8_t)by;
                plen = 1;
            } else {
                plen = bpe_spm_unmark(key, n, piece);
            }
        } else if (is_added[id]) {
            continue; /* the added token's content is its piece */
        } else if (!bpe_key_bytes(key, n, piece, &plen))
            return bpe_fail(c, WK_EINVAL,
                            "model.vocab \"%s\" (id %d): character outside the byte-level "
                            "alphabet",
                            bpe_show(key, n, sh), (int)id);
        if (plen > WK_TOK_MAX_PIECE)
            return bpe_fail(c, WK_EINVAL, "model.vocab \"%s\" (id %d): over %d bytes",
                            bpe_show(key, n, sh), (int)id, WK_TOK_MAX_PIECE);
        bpe_piece_set(b, pool_len, id, piece, plen);
    }
    return WK_OK;
}

/* Splits merge i into its two halves; false if malformed. */
static bool
bpe_merge_parts(const json_t *m, const char **l, size_t *ln, const char **r, size_t *rn)
{
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        const char *sp = memchr(s, ' ', n);
        if (sp == NULL || memchr(sp + 1, ' ', n - (size_t)(sp - s) - 1) != NULL)
            return false;
        *l = s;
        *ln = (size_t)(sp - s);
        *r = sp + 1;
        *rn = n - *ln - 1;
        return true;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *l = json_string_value(json_array_get(m, 0));
        *ln = json_string_length(json_array_get(m, 0));
        *r = json_string_value(json_array_get(m, 1));
        *rn = json_string_length(json_array_get(m, 1));
        return true;
    }
    return false;
}

static wk_err
bpe_load_merges(bpe_ld *c, wk_bpe *b, const json_t *merges)
{
    size_t i;
    json_t *m;
    char sh[72];
    char *cat = malloc(2 * BPE_MAX_KEY);

    if (cat == NULL)
        return bpe_fail(c, WK_ENOMEM, "out of memory");
    json_array_foreach(merges, i, m) {
        const char *l, *r;
        size_t ln, rn;
        int32_t li, ri, mi;

        if (!bpe_merge_parts(m, &l, &ln, &r, &rn)) {
            free(cat);
            return bpe_fail(c, WK_EINVAL,
                            "model.merges[%zu] is neither \"a b\" (one space) nor [\"a\", \"b\"]",
                            i);
        }
        if ((li = bpe_str_get(b, l, ln)) < 0 || (ri = bpe_str_get(b, r, rn)) < 0) {
            const char *bad = li < 0 ? l : r;
            size_t bn = li < 0 ? ln : rn;
            free(cat);
            return bpe_fail(c, WK_EINVAL, "model.merges[%zu]: \"%s\" is not in the vocab", i,
                            bpe_show(bad, bn, sh));
        }
        memcpy(cat, l, ln);
        memcpy(cat + ln, r, rn);
        if (ln + rn > BPE_MAX_KEY || (mi = bpe_str_get(b, cat, ln + rn)) < 0) {
            bpe_show(cat, ln + rn, sh);
            free(cat);
            return bpe_fail(c, WK_EINVAL, "model.merges[%zu]: merged \"%s\" is not in the vocab", i,
                            sh);
        }
        /* A repeated pair: the later rank wins, as in `tokenizers`. */
        uint64_t pair = ((uint64_t)(uint32_t)li << 32) | (uint32_t)ri;
        *bpe_merge_slot_of(b, pair) = (bpe_merge_slot){.pair = pair, .rank = (uint32_t)i, .id = mi};
    }
    free(cat);
    return WK_OK;
}

/* Largest id in vocab and added tokens (ids already type-checked lazily here). */
static wk_err
bpe_max_id(bpe_ld *c, const json_t *vocab, const json_t *added, int32_t *max_id)
{
    const char *key;
    json_t *v;
    size_t i;
    int32_t mx = -1, id;
    char sh[72];

    json_object_foreach((json_t *)vocab, key, v) {
        if (!bpe_json_id(v, &id))
            return bpe_fail(c, WK_EINVAL, "model.vocab \"%s\": id is not an integer in 0..%d",
                            bpe_show(key, strlen(key), sh), WK_TOK_MAX_ID);
        if (id > mx)
            mx = id;
    }
    json_array_foreach(added, i, v) {
        if (!json_is_object(v) || !bpe_json_id(json_object_get(v, "id"), &id))
            return bpe_fail(c, WK_EINVAL, "added_tokens[%zu].id is not an integer in 0..%d", i,
                            WK_TOK_MAX_ID);
        if (id > mx)
            mx = id;
    }
    *max_id = mx;
    return WK_OK;
}

static wk_err
bpe_check_model(bpe_ld *c, wk_bpe *b, const json_t *model)
{
    const char *ty;
    char sh[72];
    bool fb;

    if (!json_is_object(model))
        return bpe_fail(c, WK_EINVAL, "model is missing or not an object");
    ty = bpe_type(model);
    if (json_object_get(model, "type") != NULL && ty == NULL)
        return bpe_fail(c, WK_EINVAL, "model.type is not a string");
    if (ty != NULL && strcmp(ty, "BPE") != 0)
        return bpe_fail(c, WK_ENOTSUP, "model.type \"%s\" is not supported (only BPE)",
                        bpe_show(ty, strlen(ty), sh));
    if (!json_is_object(json_object_get(model, "vocab")))
        return bpe_fail(c, WK_EINVAL, "model.vocab is missing or not an object");
    if (!json_is_array(json_object_get(model, "merges")))
        return bpe_fail(c, WK_EINVAL, "model.merges is missing or not an array");
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout != NULL && !json_is_null(dropout))
        return bpe_fail(c, WK_ENOTSUP, "model.dropout is not supported (must be null)");
    static const char *const affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_object_get(model, affix[i]);
        if (v != NULL && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return bpe_fail(c, WK_ENOTSUP, "model.%s is not supported (must be null)", affix[i]);
    }
    if (!bpe_json_bool(model, "byte_fallback", false, &fb))
        return bpe_fail(c, WK_EINVAL, "model.byte_fallback is not a boolean");
    if (fb && !b->spm)
        return bpe_fail(c, WK_ENOTSUP,
                        "model.byte_fallback true is not supported with a ByteLevel "
                        "pre_tokenizer");
    b->byte_fallback = fb;
    if (!bpe_json_bool(model, "fuse_unk", false, &b->fuse_unk))
        return bpe_fail(c, WK_EINVAL, "model.fuse_unk is not a boolean");
    if (!bpe_json_bool(model, "ignore_merges", false, &b->ignore_merges))
        return bpe_fail(c, WK_EINVAL, "model.ignore_merges is not a boolean");
    json_t *unk = json_object_get(model, "unk_token");
    if (unk != NULL && !json_is_null(unk) && !json_is_string(unk))
        return bpe_fail(c, WK_EINVAL, "model.unk_token is not a string");
    return WK_OK;
}

/*
 * SentencePiece-style mode: resolves model.unk_token (a vocab key) and checks
 * that every input can be encoded: either byte_fallback with all 256 "<0xXX>"
 * tokens, or an unk_token (the library silently drops what neither covers).
 */
static wk_err
bpe_check_spm_cover(bpe_ld *c, wk_bpe *b, const json_t *unk)
{
    char sh[72];
    int missing = -1;

    if (json_is_string(unk)) {
        b->unk_id = bpe_str_get(b, json_string_value(unk), json_string_length(unk));
        if (b->unk_id < 0)
            return bpe_fail(c, WK_EINVAL, "model.unk_token \"%s\" is not in model.vocab",
                            bpe_show(json_string_value(unk), json_string_length(unk), sh));
    }
    for (int by = 0; by < 256 && missing < 0; by++) {
        if (b->fb_id[by] < 0)
            missing = by;
    }
    if (b->unk_id < 0 && (!b->byte_fallback || missing >= 0)) {
        if (!b->byte_fallback)
            return bpe_fail(c, WK_EINVAL,
                            "model has neither byte_fallback nor an unk_token, so some inputs "
                            "could not be encoded");
        return bpe_fail(c, WK_EINVAL,
                        "model.vocab has no token \"<0x%02X>\" for byte_fallback and model has "
                        "no unk_token, so some inputs could not be encoded",
                        missing);
    }
    return WK_OK;
}

static wk_err
bpe_build(bpe_ld *c, wk_bpe *b, const json_t *root)
{
    const json_t *model = json_object_get(root, "model");
    const json_t *vocab, *merges, *added;
    int32_t max_id = -1;
    uint8_t *is_added = NULL, *in_vocab = NULL;
    size_t pool_len = 0, key_bytes = 0, added_bytes = 0, i;
    const char *key;
    json_t *v;
    wk_err err;

    if (!json_is_object(root))
        return bpe_fail(c, WK_EINVAL, "the top level is not an object");
    const json_t *pre = json_object_get(root, "pre_tokenizer");
    /* No pre-tokenizer, or Metaspace: the SentencePiece-style mode. */
    b->spm = pre == NULL || json_is_null(pre) || bpe_is(pre, "Metaspace");
    b->unk_id = BPE_NO_ID;
    for (int by = 0; by < 256; by++)
        b->fb_id[by] = BPE_NO_ID;
    if ((err = bpe_check_model(c, b, model)) != WK_OK)
        return err;
    if (b->spm) {
        if ((err = bpe_check_spm(c, b, json_object_get(root, "normalizer"), pre,
                                 json_object_get(root, "decoder"))) != WK_OK)
            return err;
    } else {
        if ((err = bpe_check_normalizer(c, b, json_object_get(root, "normalizer"),
                                        "normalizer")) != WK_OK)
            return err;
        if ((err = bpe_check_pretok(c, b, pre)) != WK_OK)
            return err;
        if ((err = bpe_check_decoder(c, json_object_get(root, "decoder"))) != WK_OK)
            return err;
    }
    vocab = json_object_get(model, "vocab");
    merges = json_object_get(model, "merges");
    added = json_object_get(root, "added_tokens");
    if (added == NULL || json_is_null(added))
        added = NULL;
    else if (!json_is_array(added))
        return bpe_fail(c, WK_EINVAL, "added_tokens is not an array");
    if (added != NULL && json_array_size(added) > WK_BPE_MAX_ADDED)
        return bpe_fail(c, WK_ETOOBIG, "added_tokens has %zu entries, over %d",
                        json_array_size(added), WK_BPE_MAX_ADDED);
    if (json_array_size(merges) > WK_BPE_MAX_MERGES)
        return bpe_fail(c, WK_ETOOBIG, "model.merges has %zu entries, over %u",
                        json_array_size(merges), WK_BPE_MAX_MERGES);
    if (json_object_size(vocab) == 0)
        return bpe_fail(c, WK_EINVAL, "model.vocab is empty");
    if ((err = bpe_max_id(c, vocab, added, &max_id)) != WK_OK)
        return err;

    json_object_foreach((json_t *)vocab, key, v) {
        key_bytes += strlen(key);
    }
    json_array_foreach(added, i, v) {
        size_t n = json_string_length(json_object_get(v, "content"));
        /* SentencePiece-style: a normalized content may grow to "\u2581" + 3 bytes a space. */
        added_bytes += b->spm ? 3 * n + BPE_MS_LEN : n;
    }

    b->vocab_size = (uint32_t)max_id + 1;
    b->piece_off = calloc(b->vocab_size, sizeof(*b->piece_off));
    b->piece_len = calloc(b->vocab_size, sizeof(*b->piece_len));
    is_added = calloc(b->vocab_size, 1);
    in_vocab = calloc(b->vocab_size, 1);
    /* A decoded vocab piece is never longer than its key. */
    b->bytes = malloc(key_bytes + added_bytes + 1);
    b->keys = malloc(key_bytes + 1);
    b->str_mask = bpe_pow2(json_object_size(vocab)) - 1;
    b->str = malloc(((size_t)b->str_mask + 1) * sizeof(*b->str));
    b->merge_mask = bpe_pow2(json_array_size(merges)) - 1;
    b->merge = malloc(((size_t)b->merge_mask + 1) * sizeof(*b->merge));
    b->trie = malloc((added_bytes + 2) * sizeof(*b->trie));
    if (b->piece_off == NULL || b->piece_len == NULL || is_added == NULL || in_vocab == NULL ||
        b->bytes == NULL || b->keys == NULL || b->str == NULL || b->merge == NULL ||
        b->trie == NULL) {
        err = bpe_fail(c, WK_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t k = 0; k <= b->str_mask; k++)
        b->str[k].id = BPE_NO_ID;
    for (size_t k = 0; k <= b->merge_mask; k++)
        b->merge[k].id = BPE_NO_ID;
    b->trie[0] = b->trie[1] = (bpe_trie_node){.kid = -1, .next = -1, .id = BPE_NO_ID};
    b->n_trie = 2;

    if (added != NULL && (err = bpe_load_added(c, b, added, is_added, &pool_len)) != WK_OK)
        goto out;
    if ((err = bpe_load_vocab(c, b, vocab, is_added, in_vocab, &pool_len)) != WK_OK)
        goto out;
    for (uint32_t id = 0; id < b->vocab_size; id++)
        b->count += is_added[id] || in_vocab[id];
    if ((err = bpe_load_merges(c, b, merges)) != WK_OK)
        goto out;
    if (b->spm) {
        err = bpe_check_spm_cover(c, b, json_object_get(model, "unk_token"));
        goto out;
    }
    for (int by = 0; by < 256; by++) {
        uint8_t u[4];
        size_t n = bpe_utf8_enc(bpe_byte_cp((uint8_t)by), u);
        char sh[72];
        b->byte_id[by] = bpe_str_get(b, (const char *)u, n);
        /*
         * Vocabs trained on text (StarCoder, DeepSeek, GPT-NeoX) may lack
         * the bytes that never occur in well-formed UTF-8 (0xc0, 0xc1,
         * 0xf5..0xff) and the lead bytes of planes 4..16 (0xf1..0xf4: almost
         * nothing is assigned there). `tokenizers` drops a character whose
         * byte-level form is not in the vocab (no unk_token in these files),
         * and so does bpe_word() with such a byte.
         */
        if (b->byte_id[by] < 0 && !(by == 0xc0 || by == 0xc1 || by >= 0xf1)) {
            err = bpe_fail(c, WK_EINVAL,
                           "model.vocab has no token \"%s\" for byte 0x%02x, so some inputs "
                           "could not be encoded",
                           bpe_show((const char *)u, n, sh), by);
            goto out;
        }
    }
out:
    b->added = is_added; /* kept: the text-prefix match asks which ids are added tokens */
    free(in_vocab);
    return err;
}

wk_err
wk_bpe_load_mem(const void *buf, size_t len, const char *label, wk_bpe **out, wk_diag *d)
{
    bpe_ld c = {.label = label ? label : "tokenizer.json", .d = d};
    json_error_t je;
    json_t *root;
    wk_bpe *b;
    wk_err err;

    if (len > WK_BPE_MAX_FILE)
        return bpe_fail(&c, WK_ETOOBIG, "%zu bytes, over the %u byte limit", len, WK_BPE_MAX_FILE);
    root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        return bpe_fail(&c, WK_EINVAL, "line %d column %d: %s", je.line, je.column, je.text);
    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        json_decref(root);
        return bpe_fail(&c, WK_ENOMEM, "out of memory");
    }
    err = bpe_build(&c, b, root);
    json_decref(root);
    if (err != WK_OK) {
        wk_bpe_free(b);
        return err;
    }
    *out = b;
    return WK_OK;
}

void
wk_bpe_free(wk_bpe *b)
{
    if (b == NULL)
        return;
    free(b->bytes);
    free(b->piece_off);
    free(b->piece_len);
    free(b->keys);
    free(b->str);
    free(b->merge);
    free(b->trie);
    free(b->added);
    wk_pretok_free(b->pretok);
    wk_pretok_wordchar_free(b->wordchar);
    free(b);
}

uint32_t
wk_bpe_vocab_size(const wk_bpe *b)
{
    return b->vocab_size;
}

uint32_t
wk_bpe_count(const wk_bpe *b)
{
    return b->count;
}

const char *
wk_bpe_kind(const wk_bpe *b)
{
    return b->spm ? "hf-spm" : "hf-bpe";
}

bool
wk_bpe_strips_space(const wk_bpe *b)
{
    return b->strip_lead;
}

const uint8_t *
wk_bpe_piece(const wk_bpe *b, int32_t id, size_t *len)
{
    *len = 0;
    if (id < 0 || (uint32_t)id >= b->vocab_size || b->piece_len[id] == 0)
        return NULL;
    *len = b->piece_len[id];
    return b->bytes + b->piece_off[id];
}

bool
wk_bpe_is_added(const wk_bpe *b, int32_t id)
{
    return id >= 0 && (uint32_t)id < b->vocab_size && b->added != NULL &&
           (b->added[id] & BPE_ADDED_KIND) != BPE_ADDED_NONE;
}

int32_t
wk_bpe_find(const wk_bpe *b, const char *s, size_t n)
{
    int32_t id = BPE_NO_ID;

    for (uint32_t root = 0; root < 2; root++) {
        if (n > 0 && bpe_trie_match(b, root, (const uint8_t *)s, n, &id) == n)
            return id;
    }
    return bpe_str_get(b, s, n);
}

/* ---- encoding ---- */

/* Output ids and scratch space of one encode call. */
typedef struct bpe_enc {
    int32_t *ids;   /* output */
    size_t n, cap;  /* ids used / allocated */
    uint32_t *cps;  /* code points of the current piece */
    uint8_t *word;  /* bytes of the current word */
    char *key;      /* byte-level string of the current word (ignore_merges) */
    int32_t *sym;   /* BPE symbols: id */
    int32_t *prev;  /* previous live symbol or -1 */
    int32_t *next;  /* next live symbol or -1 */
    uint64_t *heap; /* candidate merges: rank << 32 | position */
    size_t scratch; /* bytes the per-word arrays hold */
    const uint8_t *text; /* start of the input (Metaspace "first" looks for offset 0) */
    const uint8_t *cont; /* hf-spm: where the text continues a run (no mark put there), or NULL */
    uint8_t *mark;       /* SentencePiece-style: a piece with spaces as "\u2581" */
    size_t mark_cap;     /* bytes mark holds */
    const wk_bpe *bpe;   /* the tokenizer (the pre-tokenizer's word callback needs it) */
    wk_err err;          /* why encoding stopped, when not for memory (diag in d) */
    wk_diag *d;          /* caller's diag */
} bpe_enc;

static bool
bpe_emit(bpe_enc *e, int32_t id)
{
    if (e->n == e->cap) {
        size_t nc = e->cap * 2 + 16;
        int32_t *nv = realloc(e->ids, nc * sizeof(*nv));
        if (nv == NULL)
            return false;
        e->ids = nv;
        e->cap = nc;
    }
    e->ids[e->n++] = id;
    return true;
}

/* Makes room for words and pieces of n bytes. */
static bool
bpe_scratch(bpe_enc *e, size_t n)
{
    if (n <= e->scratch)
        return true;
    size_t c = n + 1;
    free(e->cps);
    free(e->word);
    free(e->key);
    free(e->sym);
    free(e->prev);
    free(e->next);
    free(e->heap);
    e->cps = malloc((c + 1) * sizeof(*e->cps));
    e->word = malloc(c * 4);
    e->key = malloc(c * 2);
    e->sym = malloc(c * sizeof(*e->sym));
    e->prev = malloc(c * sizeof(*e->prev));
    e->next = malloc(c * sizeof(*e->next));
    e->heap = malloc(3 * c * sizeof(*e->heap));
    if (!e->cps || !e->word || !e->key || !e->sym || !e->prev || !e->next || !e->heap) {
        e->scratch = 0;
        return false;
    }
    e->scratch = n;
    return true;
}

static void
bpe_heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v)
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t
bpe_heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        uint64_t mv = v;
        if (l < *n && h[l] < mv) {
            m = l;
            mv = h[l];
        }
        if (l + 1 < *n && h[l + 1] < mv)
            m = l + 1;
        if (m == i)
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0)
        h[i] = v;
    return top;
}

/* Pushes the merge of live symbol i with its successor, if there is one. */
static void
bpe_cand(const wk_bpe *b, bpe_enc *e, size_t *hn, int32_t i)
{
    if (i < 0 || e->next[i] < 0)
        return;
    uint64_t pair = ((uint64_t)(uint32_t)e->sym[i] << 32) | (uint32_t)e->sym[e->next[i]];
    const bpe_merge_slot *m = bpe_merge_slot_of(b, pair);
    if (m->id != BPE_NO_ID)
        bpe_heap_push(e->heap, hn, ((uint64_t)m->rank << 32) | (uint32_t)i);
}

/* Merges the n > 0 symbols in e->sym (by rank, then leftmost) and appends the result. */
static bool
bpe_merge_run(const wk_bpe *b, bpe_enc *e, size_t n)
{
    size_t hn = 0;

    for (size_t i = 0; i < n; i++) {
        e->prev[i] = (int32_t)i - 1;
        e->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++)
        bpe_cand(b, e, &hn, (int32_t)i);
    while (hn > 0) {
        uint64_t top = bpe_heap_pop(e->heap, &hn);
        int32_t i = (int32_t)(uint32_t)top;
        uint32_t rank = (uint32_t)(top >> 32);
        int32_t j;
        if (e->sym[i] < 0 || (j = e->next[i]) < 0)
            continue;
        uint64_t pair = ((uint64_t)(uint32_t)e->sym[i] << 32) | (uint32_t)e->sym[j];
        const bpe_merge_slot *m = bpe_merge_slot_of(b, pair);
        if (m->id == BPE_NO_ID || m->rank != rank)
            continue; /* stale: one side merged since */
        e->sym[i] = m->id;
        e->sym[j] = -1;
        e->next[i] = e->next[j];
        if (e->next[j] >= 0)
            e->prev[e->next[j]] = i;
        bpe_cand(b, e, &hn, e->prev[i]);
        bpe_cand(b, e, &hn, i);
    }
    for (int32_t i = 0; i >= 0; i = e->next[i]) {
        if (!bpe_emit(e, e->sym[i]))
            return false;
    }
    return true;
}

/* BPE over one word of n > 0 bytes in e->word; appends its ids. */
static bool
bpe_word(const wk_bpe *b, bpe_enc *e, size_t n)
{
    const uint8_t *w = e->word;

    if (b->ignore_merges) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            k += bpe_utf8_enc(bpe_byte_cp(w[i]), (uint8_t *)e->key + k);
        int32_t id = bpe_str_get(b, e->key, k);
        if (id >= 0)
            return bpe_emit(e, id);
    }
    size_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        /* a byte the vocab has no token for (see bpe_build) is dropped */
        if (b->byte_id[w[i]] >= 0)
            e->sym[ns++] = b->byte_id[w[i]];
    }
    return ns == 0 || bpe_merge_run(b, e, ns);
}

/*
 * SentencePiece-style BPE over one word of n bytes at w (spaces already
 * "\u2581"). Each character that is a vocab key is a symbol; any other
 * becomes its bytes' "<0xXX>" tokens (byte_fallback, when all exist), else
 * unk, consecutive unks fused into one when fuse_unk. As in the library, a
 * pending unk is written only when a vocab character or the end comes, so
 * byte-fallback tokens can precede it. A byte outside well-formed UTF-8 is a
 * character of its own. Then the merges run over the symbols.
 */
static bool
bpe_spm_word(const wk_bpe *b, bpe_enc *e, const uint8_t *w, size_t n)
{
    size_t ns = 0;
    bool unk = false;

    if (n == 0)
        return true;
    if (!bpe_scratch(e, n))
        return false;
    if (b->ignore_merges) {
        int32_t id = bpe_str_get(b, (const char *)w, n);
        if (id >= 0)
            return bpe_emit(e, id);
    }
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = wk_utf8_dec(w + i, n - i, &cp);
        int32_t id = l > 0 ? bpe_str_get(b, (const char *)w + i, l) : BPE_NO_ID;
        bool fb = b->byte_fallback;
        if (l == 0)
            l = 1;
        if (id >= 0) {
            if (unk)
                e->sym[ns++] = b->unk_id;
            unk = false;
            e->sym[ns++] = id;
        } else {
            for (size_t k = 0; k < l && fb; k++)
                fb = b->fb_id[w[i + k]] >= 0;
            if (fb) {
                for (size_t k = 0; k < l; k++)
                    e->sym[ns++] = b->fb_id[w[i + k]];
            } else if (b->unk_id >= 0) {
                if (unk && !b->fuse_unk)
                    e->sym[ns++] = b->unk_id;
                unk = true;
            }
        }
        i += l;
    }
    if (unk)
        e->sym[ns++] = b->unk_id;
    return ns == 0 || bpe_merge_run(b, e, ns);
}

/* Makes room for m bytes in e->mark. */
static bool
bpe_mark_room(bpe_enc *e, size_t m)
{
    if (m <= e->mark_cap)
        return true;
    uint8_t *nb = realloc(e->mark, m);
    if (nb == NULL)
        return false;
    e->mark = nb;
    e->mark_cap = m;
    return true;
}

/*
 * SentencePiece-style encoding of a piece of n bytes with no added token in
 * it. Llama-2 form: already normalized, one word. Metaspace form: spaces
 * become "\u2581", one is put in front by the prepend scheme (never when the
 * piece already starts with one; "first" only for the piece at input offset
 * 0), and with split each "\u2581" starts a new word.
 */
static bool
bpe_spm_plain(const wk_bpe *b, bpe_enc *e, const uint8_t *s, size_t n)
{
    size_t m, start = 0;
    bool pre;

    if (n == 0)
        return true;
    if (b->spm_prepend == BPE_SPM_NORM)
        return bpe_spm_word(b, e, s, n);
    if (!bpe_mark_room(e, 3 * n + BPE_MS_LEN))
        return false;
    m = bpe_spm_mark(s, n, false, e->mark);
    pre = (b->spm_prepend == BPE_SPM_ALWAYS || (b->spm_prepend == BPE_SPM_FIRST && s == e->text)) &&
          s != e->cont && !(m >= BPE_MS_LEN && memcmp(e->mark, BPE_MS, BPE_MS_LEN) == 0);
    if (pre) {
        memmove(e->mark + BPE_MS_LEN, e->mark, m);
        memcpy(e->mark, BPE_MS, BPE_MS_LEN);
        m += BPE_MS_LEN;
    }
    if (!b->spm_split)
        return bpe_spm_word(b, e, e->mark, m);
    for (size_t i = 1; i + BPE_MS_LEN <= m; i++) {
        if (memcmp(e->mark + i, BPE_MS, BPE_MS_LEN) == 0) {
            if (!bpe_spm_word(b, e, e->mark + start, i - start))
                return false;
            start = i;
            i += BPE_MS_LEN - 1;
        }
    }
    return bpe_spm_word(b, e, e->mark + start, m - start);
}

/* End of the GPT-2 pattern's match at cps[i] (i < n). */
static size_t
bpe_split_next(const uint32_t *cps, size_t n, size_t i)
{
    uint32_t c = cps[i];
    size_t j;
    int cl;

    if (c == '\'' && i + 1 < n) {
        uint32_t c1 = cps[i + 1];
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
            return i + 2;
        if (i + 2 < n) {
            uint32_t c2 = cps[i + 2];
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
                return i + 3;
        }
    }
    cl = bpe_class(c);
    j = i;
    if (c == ' ' && i + 1 < n && bpe_class(cps[i + 1]) != WK_UNI_CLASS_S) {
        cl = bpe_class(cps[i + 1]);
        j = i + 1;
    }
    if (cl != WK_UNI_CLASS_S) {
        while (j < n && bpe_class(cps[j]) == cl)
            j++;
        return j;
    }
    /* \s+(?!\S)|\s+ */
    while (j < n && bpe_class(cps[j]) == WK_UNI_CLASS_S)
        j++;
    if (j == n || j - i < 2)
        return j;
    return j - 1;
}

/* Pre-tokenizes and encodes n code points of one piece. */
static bool
bpe_piece_enc(const wk_bpe *b, bpe_enc *e, const uint32_t *cps, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t j = b->use_regex ? bpe_split_next(cps, n, i) : n;
        size_t k = 0;
        for (size_t x = i; x < j; x++)
            k += bpe_utf8_enc(cps[x], e->word + k);
        if (!bpe_word(b, e, k))
            return false;
        i = j;
    }
    return true;
}

/* One word of the regex pre-tokenizer: BPE over its bytes. */
static bool
bpe_pretok_word(void *ctx, const uint8_t *w, size_t n)
{
    bpe_enc *e = ctx;

    memcpy(e->word, w, n);
    return bpe_word(e->bpe, e, n);
}

/* Encodes a piece of n bytes with no added token in it (after normalization). */
static bool
bpe_plain(const wk_bpe *b, bpe_enc *e, const uint8_t *s, size_t n)
{
    size_t k;

    if (n == 0)
        return true;
    if (b->spm)
        return bpe_spm_plain(b, e, s, n);
    if (!bpe_scratch(e, n + 1))
        return false;
    if (b->pretok != NULL) {
        wk_err err = wk_pretok_split(b->pretok, s, n, bpe_pretok_word, e, e->d);
        if (err != WK_OK && err != WK_ENOMEM)
            e->err = err;
        return err == WK_OK;
    }
    if (b->add_prefix_space && s[0] != ' ') {
        e->cps[0] = ' ';
        k = 1 + bpe_cps_from(s, n, e->cps + 1);
    } else {
        k = bpe_cps_from(s, n, e->cps);
    }
    return bpe_piece_enc(b, e, e->cps, k);
}

/*
 * Length of the white-space character (Unicode White_Space, what Rust's
 * regex \s matches) at s (n bytes), 0 if there is none.
 */
static size_t
bpe_ws_at(const uint8_t *s, size_t n)
{
    uint32_t cp;
    size_t l = n > 0 ? wk_utf8_dec(s, n, &cp) : 0;

    if (l == 0)
        return 0;
    if ((cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
        (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
        cp == 0x205f || cp == 0x3000)
        return l;
    return 0;
}

/* Length of the white-space character ending at s[n) (n bytes before), 0 if none. */
static size_t
bpe_ws_before(const uint8_t *s, size_t n)
{
    for (size_t l = 1; l <= 3 && l <= n; l++) {
        if (bpe_ws_at(s + n - l, l) == l)
            return l;
    }
    return 0;
}

/* Whether the character at s (n bytes) is a word character (single_word). */
static bool
bpe_word_at(const wk_bpe *b, const uint8_t *s, size_t n)
{
    uint32_t cp;
    size_t l = n > 0 ? wk_utf8_dec(s, n, &cp) : 0;
    return l > 0 && wk_pretok_wordchar_is(b->wordchar, s, l);
}

/* Whether the character ending at s[n) is a word character (single_word). */
static bool
bpe_word_before(const wk_bpe *b, const uint8_t *s, size_t n)
{
    for (size_t l = 1; l <= 4 && l <= n; l++) {
        uint32_t cp;
        if (wk_utf8_dec(s + n - l, l, &cp) == l)
            return wk_pretok_wordchar_is(b->wordchar, s + n - l, l);
    }
    return false;
}

/* Splits at the added tokens of trie root (0, then 1 after NFC) and encodes. */
static bool
bpe_span(const wk_bpe *b, bpe_enc *e, const uint8_t *s, size_t n, uint32_t root)
{
    size_t start = 0;

    if (n == 0)
        return true;
    if (root == 1 && b->spm && b->spm_prepend == BPE_SPM_NORM) {
        /*
         * Normalize the gap (Prepend, Replace; no Prepend where the text
         * continues a run), then match normalized added tokens in it.
         */
        uint8_t *u = malloc(3 * n + BPE_MS_LEN);
        if (u == NULL)
            return false;
        bool ok = bpe_span(b, e, u, bpe_spm_mark(s, n, s != e->cont, u), 2);
        free(u);
        return ok;
    }
    if (root == 1 && b->nfc) {
        /* NFC the gap, then look for normalized added tokens in the result. */
        bool ascii = true;
        for (size_t i = 0; i < n && ascii; i++)
            ascii = s[i] < 0xcc; /* every code point below U+0300 is NFC-stable */
        if (!ascii) {
            uint32_t *cps = malloc(n * sizeof(*cps)), *nf = NULL;
            uint8_t *u = NULL;
            size_t nk = 0, ul = 0;
            bool ok = cps != NULL && bpe_nfc(cps, bpe_cps_from(s, n, cps), &nf, &nk) == WK_OK &&
                      (u = malloc(nk * 4 + 1)) != NULL;
            if (ok) {
                for (size_t i = 0; i < nk; i++)
                    ul += bpe_utf8_enc(nf[i], u + ul);
            }
            free(cps);
            free(nf);
            ok = ok && bpe_span(b, e, u, ul, 2);
            free(u);
            return ok;
        }
    }
    if (root == 2)
        root = 1;
    for (size_t i = 0; i < n;) {
        int32_t id = BPE_NO_ID;
        size_t m = bpe_trie_match(b, root, s + i, n - i, &id);
        if (m == 0) {
            i++;
            continue;
        }
        /*
         * As `tokenizers` does: lstrip takes the white space before the
         * token back to where the last token ended, rstrip the white space
         * after it; the search for the next token goes on from this one's
         * end all the same.
         */
        size_t a = i, z = i + m, w;
        if ((b->added[id] & BPE_ADDED_SINGLE) &&
            (bpe_word_before(b, s, i) || bpe_word_at(b, s + z, n - z))) {
            i = z; /* not a single word: no token, the search goes on after it */
            continue;
        }
        if (b->added[id] & BPE_ADDED_LSTRIP) {
            while (a > start && (w = bpe_ws_before(s + start, a - start)) > 0)
                a -= w;
        }
        if (b->added[id] & BPE_ADDED_RSTRIP) {
            while ((w = bpe_ws_at(s + z, n - z)) > 0)
                z += w;
        }
        if (start < a && !(root == 0 ? bpe_span(b, e, s + start, a - start, 1)
                                     : bpe_plain(b, e, s + start, a - start)))
            return false;
        if (!bpe_emit(e, id))
            return false;
        i += m;
        start = z;
    }
    if (start >= n)
        return true;
    return root == 0 ? bpe_span(b, e, s + start, n - start, 1)
                     : bpe_plain(b, e, s + start, n - start);
}

/*
 * True when text[start..] begins a run that gets the "\u2581" mark in the
 * whole text's encoding (hf-spm): the input start, or (Llama-2 form, and
 * Metaspace "always") the end of an added token found in text[0..start),
 * found as bpe_span() finds them: leftmost then longest, the non-normalized
 * ones in the raw text, the normalized ones in the gaps between them. An
 * added token cut by start is no token, as for any BPE boundary.
 */
static bool
bpe_run_starts(const wk_bpe *b, const uint8_t *s, size_t start)
{
    size_t gap = 0;
    bool hit = false;

    if (start == 0)
        return true;
    if (b->spm_prepend != BPE_SPM_NORM && b->spm_prepend != BPE_SPM_ALWAYS)
        return false;
    for (uint32_t root = 0; root < 2 && !hit; root++) {
        for (size_t i = gap; i < start;) {
            int32_t id;
            size_t m = bpe_trie_match(b, root, s + i, start - i, &id);
            if (m == 0) {
                i++;
                continue;
            }
            i += m;
            gap = i;
            hit = i == start;
        }
        /* Llama-2 form: a normalized token is part of its normalized gap, no run of its own. */
        if (b->spm_prepend == BPE_SPM_NORM)
            break;
    }
    return hit;
}

/* Encodes text[start..len); cont: it continues text[0..start) (see wk_bpe_encode_continue). */
static wk_err
bpe_encode(const wk_bpe *b, const char *text, size_t start, size_t len, bool cont, int32_t **ids,
           size_t *n_ids, wk_diag *d)
{
    bpe_enc e = {0};
    size_t n = len - start;
    bool ok;

    /* SentencePiece-style normalization makes a piece up to 3 times longer (+ 3). */
    if (n > (SIZE_MAX / 16) - 16 || n > (b->spm ? INT32_MAX / 3 - 16 : INT32_MAX - 16))
        return wk_diag_set(d, WK_ETOOBIG, "encode: input of %zu bytes is too large", n);
    e.text = (const uint8_t *)text;
    e.bpe = b;
    e.d = d;
    if (cont && b->spm && !bpe_run_starts(b, e.text, start))
        e.cont = e.text + start;
    ok = bpe_span(b, &e, (const uint8_t *)text + start, n, 0);
    free(e.mark);
    free(e.cps);
    free(e.word);
    free(e.key);
    free(e.sym);
    free(e.prev);
    free(e.next);
    free(e.heap);
    if (ok && e.ids == NULL)
        ok = (e.ids = malloc(sizeof(*e.ids))) != NULL;
    if (!ok) {
        free(e.ids);
        if (e.err != WK_OK)
            return e.err;
        return wk_diag_set(d, WK_ENOMEM, "encode: out of memory for %zu bytes", n);
    }
    *ids = e.ids;
    *n_ids = e.n;
    return WK_OK;
}

wk_err
wk_bpe_encode(const wk_bpe *b, const char *text, size_t len, int32_t **ids, size_t *n_ids,
              wk_diag *d)
{
    return bpe_encode(b, text, 0, len, false, ids, n_ids, d);
}

wk_err
wk_bpe_encode_continue(const wk_bpe *b, const char *text, size_t len, size_t start,
                       int32_t **ids, size_t *n_ids, wk_diag *d)
{
    if (start > len)
        return wk_diag_set(d, WK_EINVAL, "encode: start %zu is past the %zu bytes of text", start,
                           len);
    if (!b->spm)
        return bpe_encode(b, text + start, 0, len - start, false, ids, n_ids, d);
    return bpe_encode(b, text, start, len, true, ids, n_ids, d);
}

/* ---- text prefix ---- */

/*
 * Whether the text after token prev (BPE_NO_ID: the input start) begins a
 * run the encoder marks: see bpe_run_starts(), by token.
 */
static bool
bpe_run_after(const wk_bpe *b, int32_t prev)
{
    if (!b->spm || b->spm_prepend == BPE_SPM_NEVER)
        return false;
    if (prev < 0)
        return true;
    if (b->spm_prepend == BPE_SPM_FIRST || (uint32_t)prev >= b->vocab_size)
        return false;
    return (b->added[prev] & BPE_ADDED_KIND) == BPE_ADDED_RAW ||
           ((b->added[prev] & BPE_ADDED_KIND) == BPE_ADDED_NORM &&
            b->spm_prepend == BPE_SPM_ALWAYS);
}

bool
wk_bpe_text_prefix(const wk_bpe *b, const int32_t *ids, size_t n, int32_t hidden,
                   const char *text, size_t len, size_t *bytes)
{
    size_t off = 0;
    bool run = bpe_run_after(b, BPE_NO_ID);

    for (size_t i = 0; i < n; i++) {
        if (ids[i] == hidden && hidden >= 0)
            continue; /* not in the text, and no boundary: the text goes on past it */
        size_t pl = 0;
        const uint8_t *p = wk_bpe_piece(b, ids[i], &pl);
        if (p == NULL)
            return false;
        /*
         * The mark put in front of a run reads as a space the text lacks:
         * always there in the Llama-2 form, and in the Metaspace form unless
         * the run began with a space of its own (then the text has it).
         */
        if (run && pl > 0 && p[0] == ' ' &&
            (b->spm_prepend == BPE_SPM_NORM || off == len || text[off] != ' ')) {
            p++;
            pl--;
        }
        if (pl > len - off || memcmp(text + off, p, pl) != 0)
            return false;
        off += pl;
        run = bpe_run_after(b, ids[i]);
    }
    *bytes = off;
    return true;
}
