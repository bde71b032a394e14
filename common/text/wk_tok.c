/*
 * wk_tok: RWKV World vocab parsing, greedy longest-match encoding on a byte
 * trie, decoding, the UTF-8-safe stream decoder, and the dispatch to wk_bpe
 * for Hugging Face tokenizer.json files (kinds "hf-bpe" and "hf-spm"): a
 * wk_tok of those kinds holds a wk_bpe, the digest and the end-of-text id,
 * and every function that differs by kind branches on t->bpe.
 *
 * The vocab parser is a strict subset of Python's literal syntax: it accepts
 * everything repr() writes for str and bytes and refuses what it can't decode
 * exactly as Python would, rather than guessing. The trie is built once from
 * the sorted pieces in breadth-first order, so each node's children are
 * contiguous and sorted by byte (binary search; the root has a direct table).
 * Nothing here logs, allocates after load except for results, or keeps
 * mutable state in a wk_tok.
 */
#include "wk_tok.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "wk_bpe.h"
#include "wk_hex.h"
#include "wk_sha256.h"

#define TOK_NO_ID (-1)

typedef struct tok_node {
    uint32_t first; /* index of the first child; children are contiguous */
    int32_t id;     /* token ending at this node, TOK_NO_ID if none */
    uint16_t nkids; /* number of children, 0..256 */
    uint8_t byte;   /* label of the edge from the parent */
} tok_node;

typedef struct tok_entry {
    uint32_t id;   /* token id */
    uint32_t off;  /* offset of the piece in wk_tok.bytes */
    uint32_t len;  /* piece length, 1..WK_TOK_MAX_PIECE */
    uint32_t line; /* 1-based line number, also the file order */
} tok_entry;

struct wk_tok {
    uint8_t *bytes;                 /* every piece, concatenated */
    uint32_t *piece_off;            /* by id: offset into bytes */
    uint16_t *piece_len;            /* by id: length, 0 when undefined */
    uint32_t vocab_size;            /* largest id + 1 */
    uint32_t count;                 /* tokens defined */
    tok_node *nodes;                /* trie, node 0 is the root */
    uint32_t n_nodes;               /* nodes used */
    uint32_t root_kid[256];         /* root's child per byte, 0 if none */
    char digest[WK_SHA256_HEX_LEN]; /* hex SHA-256 of the file */
    wk_bpe *bpe;                    /* HF tokenizer; NULL for World (then the rest is World) */
    int32_t eos;                    /* end-of-text id, -1 if none */
};

/* Parser state shared by the line helpers. */
typedef struct tok_parse {
    wk_diag *d;     /* caller's diag, may be NULL */
    size_t line;    /* current 1-based line number */
    uint8_t *out;   /* decoded piece of the current line */
    size_t out_len; /* bytes in out */
} tok_parse;

static wk_err WK_PRINTF(2, 3)
tok_fail(tok_parse *p, const char *fmt, ...)
{
    char msg[400];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return wk_diag_set(p->d, WK_EINVAL, "vocab line %zu: %s", p->line, msg);
}

/* A printable rendering of byte c for diags. */
static const char *
tok_byte_show(uint8_t c, char buf[8])
{
    if (c >= 0x21 && c <= 0x7e && c != '\'')
        snprintf(buf, 8, "'%c'", c);
    else
        snprintf(buf, 8, "0x%02x", c);
    return buf;
}

static wk_err
tok_put_byte(tok_parse *p, uint32_t b)
{
    if (p->out_len >= WK_TOK_MAX_PIECE)
        return tok_fail(p, "token longer than %d bytes", WK_TOK_MAX_PIECE);
    p->out[p->out_len++] = (uint8_t)b;
    return WK_OK;
}

/* Appends code point cp (already checked: <= 0x10FFFF, not a surrogate). */
static wk_err
tok_put_cp(tok_parse *p, uint32_t cp)
{
    uint8_t b[4];
    size_t n;
    wk_err e;

    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (uint8_t)(0xc0 | (cp >> 6));
        b[1] = (uint8_t)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (uint8_t)(0xe0 | (cp >> 12));
        b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        b[2] = (uint8_t)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        b[0] = (uint8_t)(0xf0 | (cp >> 18));
        b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
        b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        b[3] = (uint8_t)(0x80 | (cp & 0x3f));
        n = 4;
    }
    for (size_t i = 0; i < n; i++) {
        if ((e = tok_put_byte(p, b[i])) != WK_OK)
            return e;
    }
    return WK_OK;
}

/* Whether c may be byte number idx (1-based after the lead) of lead's char. */
static bool
tok_utf8_cont_ok(uint8_t lead, size_t idx, uint8_t c)
{
    uint8_t lo = 0x80, hi = 0xbf;

    if (idx == 1) {
        if (lead == 0xe0)
            lo = 0xa0;
        else if (lead == 0xed)
            hi = 0x9f;
        else if (lead == 0xf0)
            lo = 0x90;
        else if (lead == 0xf4)
            hi = 0x8f;
    }
    return c >= lo && c <= hi;
}

static size_t
tok_utf8_need(uint8_t c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        return 2;
    if (c >= 0xe0 && c <= 0xef)
        return 3;
    if (c >= 0xf0 && c <= 0xf4)
        return 4;
    return 0;
}

/*
 * Length of the well-formed UTF-8 character at s (n bytes available), or 0
 * if there is none (Unicode Table 3-7: no overlongs, no surrogates, nothing
 * over U+10FFFF).
 */
static size_t
tok_utf8_len(const uint8_t *s, size_t n)
{
    size_t need = tok_utf8_need(s[0]);

    if (need == 0 || need > n)
        return 0;
    for (size_t i = 1; i < need; i++) {
        if (!tok_utf8_cont_ok(s[0], i, s[i]))
            return 0;
    }
    return need;
}

/* Reads exactly n hex digits at s[*i]; returns false if they aren't there. */
static bool
tok_hex_digits(const uint8_t *s, size_t len, size_t *i, size_t n, uint32_t *val)
{
    uint32_t v = 0;

    if (len - *i < n)
        return false;
    for (size_t k = 0; k < n; k++) {
        int h = wk_hex_digit(s[*i + k]);
        if (h < 0)
            return false;
        v = (v << 4) | (uint32_t)h;
    }
    *i += n;
    *val = v;
    return true;
}

/*
 * Decodes one escape after a backslash at s[*i] (s[*i] is the char after the
 * backslash). is_bytes selects the bytes rules.
 */
static wk_err
tok_escape(tok_parse *p, const uint8_t *s, size_t len, size_t *i, bool is_bytes)
{
    uint8_t c = s[*i];
    uint32_t v;
    char show[8];

    (*i)++;
    switch (c) {
    case '\\': return tok_put_byte(p, '\\');
    case '\'': return tok_put_byte(p, '\'');
    case '"': return tok_put_byte(p, '"');
    case 'a': return tok_put_byte(p, 0x07);
    case 'b': return tok_put_byte(p, 0x08);
    case 'f': return tok_put_byte(p, 0x0c);
    case 'n': return tok_put_byte(p, 0x0a);
    case 'r': return tok_put_byte(p, 0x0d);
    case 't': return tok_put_byte(p, 0x09);
    case 'v': return tok_put_byte(p, 0x0b);
    case 'x':
        if (!tok_hex_digits(s, len, i, 2, &v))
            return tok_fail(p, "bad escape: \\x needs two hex digits");
        return is_bytes ? tok_put_byte(p, v) : tok_put_cp(p, v);
    case 'u':
    case 'U':
        if (is_bytes)
            return tok_fail(p, "bad escape: \\%c is not an escape in a bytes literal", c);
        if (!tok_hex_digits(s, len, i, c == 'u' ? 4 : 8, &v))
            return tok_fail(p, "bad escape: \\%c needs %d hex digits", c, c == 'u' ? 4 : 8);
        if (v > 0x10ffff)
            return tok_fail(p, "bad escape: \\U%08x is beyond U+10FFFF", v);
        if (v >= 0xd800 && v <= 0xdfff)
            return tok_fail(p, "bad escape: surrogate U+%04X can't be encoded as UTF-8", v);
        return tok_put_cp(p, v);
    case 'N':
        if (is_bytes)
            return tok_fail(p, "bad escape: \\N is not an escape in a bytes literal");
        return tok_fail(p, "bad escape: \\N{...} named escapes are not supported");
    default:
        break;
    }
    if (c >= '0' && c <= '7') {
        v = (uint32_t)(c - '0');
        for (int k = 0; k < 2 && *i < len && s[*i] >= '0' && s[*i] <= '7'; k++)
            v = v * 8 + (uint32_t)(s[(*i)++] - '0');
        if (is_bytes) {
            if (v > 0377)
                return tok_fail(p, "bad escape: octal \\%o is over \\377 in a bytes literal", v);
            return tok_put_byte(p, v);
        }
        return tok_put_cp(p, v);
    }
    return tok_fail(p, "bad escape: \\ followed by %s", tok_byte_show(c, show));
}

/* Decodes the literal s[0..len) into p->out. */
static wk_err
tok_literal(tok_parse *p, const uint8_t *s, size_t len)
{
    size_t i = 0;
    bool is_bytes = false;
    uint8_t quote;
    char show[8];
    wk_err e;

    if (len == 0)
        return tok_fail(p, "missing literal");
    if (s[0] == 'b' || s[0] == 'B') {
        is_bytes = true;
        i++;
    } else if (s[0] == 'u' || s[0] == 'U') {
        i++;
    }
    if (i >= len || (s[i] != '\'' && s[i] != '"'))
        return tok_fail(p, "bad literal: expected a quoted Python str or bytes literal");
    quote = s[i++];
    p->out_len = 0;
    for (;;) {
        if (i >= len)
            return tok_fail(p, "bad literal: no closing quote");
        uint8_t c = s[i];
        if (c == quote) {
            i++;
            break;
        }
        if (c == '\\') {
            i++;
            if (i >= len)
                return tok_fail(p, "bad literal: no closing quote");
            if ((e = tok_escape(p, s, len, &i, is_bytes)) != WK_OK)
                return e;
            continue;
        }
        if (c == '\r')
            return tok_fail(p, "bad literal: raw carriage return");
        if (c < 0x80) {
            if ((e = tok_put_byte(p, c)) != WK_OK)
                return e;
            i++;
            continue;
        }
        if (is_bytes)
            return tok_fail(p, "bad literal: non-ASCII byte %s in a bytes literal",
                            tok_byte_show(c, show));
        size_t n = tok_utf8_len(s + i, len - i);
        if (n == 0)
            return tok_fail(p, "bad literal: invalid UTF-8 at byte %s", tok_byte_show(c, show));
        for (size_t k = 0; k < n; k++) {
            if ((e = tok_put_byte(p, s[i + k])) != WK_OK)
                return e;
        }
        i += n;
    }
    if (i != len)
        return tok_fail(p, "bad literal: unexpected text after the closing quote");
    if (p->out_len == 0)
        return tok_fail(p, "empty token");
    return WK_OK;
}

/* Parses a decimal field; false if empty, non-digit, or over max. */
static bool
tok_decimal(const uint8_t *s, size_t len, uint32_t max, uint32_t *val)
{
    uint64_t v = 0;

    if (len == 0)
        return false;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
        if (v > max)
            return false;
    }
    *val = (uint32_t)v;
    return true;
}

/* Parses one line (ending stripped). Fills e->id/len; the piece is in p->out. */
static wk_err
tok_line(tok_parse *p, const uint8_t *l, size_t n, tok_entry *e)
{
    const uint8_t *sp1, *sp2;
    uint32_t id, declared;
    wk_err err;

    if (n == 0)
        return tok_fail(p, "empty line");
    sp1 = memchr(l, ' ', n);
    sp2 = memrchr(l, ' ', n);
    if (sp1 == NULL || sp1 == sp2)
        return tok_fail(p, "expected '<id> <literal> <length>'");
    if (!tok_decimal(l, (size_t)(sp1 - l), WK_TOK_MAX_ID, &id))
        return tok_fail(p, "bad id: expected a decimal number 1..%d", WK_TOK_MAX_ID);
    if (id == WK_TOK_EOT)
        return tok_fail(p, "id 0 is reserved for end-of-text");
    if ((err = tok_literal(p, sp1 + 1, (size_t)(sp2 - sp1 - 1))) != WK_OK)
        return err;
    if (!tok_decimal(sp2 + 1, (size_t)(l + n - sp2 - 1), WK_TOK_MAX_PIECE, &declared))
        return tok_fail(p, "bad length: expected a decimal number 1..%d", WK_TOK_MAX_PIECE);
    if (declared != p->out_len)
        return tok_fail(p, "length mismatch: the line says %u but the literal decodes to %zu bytes",
                        declared, p->out_len);
    e->id = id;
    e->len = (uint32_t)p->out_len;
    return WK_OK;
}

/* Stable bottom-up merge sort of entries by bytes, a prefix before its extensions. */
static void
tok_sort(tok_entry *v, tok_entry *tmp, size_t n, const uint8_t *bytes)
{
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n;
            size_t hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                const tok_entry *x = &v[i], *y = &v[j];
                uint32_t m = x->len < y->len ? x->len : y->len;
                int c = memcmp(bytes + x->off, bytes + y->off, m);
                if (c == 0)
                    c = x->len < y->len ? -1 : (x->len > y->len ? 1 : 0);
                tmp[k++] = c <= 0 ? v[i++] : v[j++];
            }
            while (i < mid)
                tmp[k++] = v[i++];
            while (j < hi)
                tmp[k++] = v[j++];
        }
        memcpy(v, tmp, n * sizeof(*v));
    }
}

/*
 * Builds the trie from the entries in breadth-first order. Each queued node
 * covers the sorted entries [lo, hi) that share its depth-byte prefix.
 */
static wk_err
tok_build(wk_tok *t, tok_entry *ent, size_t n, size_t total_bytes, wk_diag *d)
{
    tok_entry *tmp = NULL;
    uint32_t *lo = NULL, *hi = NULL;
    uint16_t *depth = NULL;
    size_t max_nodes = total_bytes + 1;
    size_t used = 1;

    tmp = malloc(n * sizeof(*tmp));
    t->nodes = calloc(max_nodes, sizeof(*t->nodes));
    lo = malloc(max_nodes * sizeof(*lo));
    hi = malloc(max_nodes * sizeof(*hi));
    depth = malloc(max_nodes * sizeof(*depth));
    if (tmp == NULL || t->nodes == NULL || lo == NULL || hi == NULL || depth == NULL)
        goto nomem;
    /* Stable sort by bytes: equal pieces keep file order, the last one wins. */
    tok_sort(ent, tmp, n, t->bytes);

    lo[0] = 0;
    hi[0] = (uint32_t)n;
    depth[0] = 0;
    t->nodes[0].id = TOK_NO_ID;
    for (size_t q = 0; q < used; q++) {
        uint32_t a = lo[q], b = hi[q];
        uint16_t dep = depth[q];

        /* Pieces that end here sort first. */
        while (a < b && ent[a].len == dep)
            t->nodes[q].id = (int32_t)ent[a++].id;
        t->nodes[q].first = (uint32_t)used;
        while (a < b) {
            uint8_t c = t->bytes[ent[a].off + dep];
            uint32_t e = a + 1;
            while (e < b && t->bytes[ent[e].off + dep] == c)
                e++;
            /* used < max_nodes: each node is a distinct prefix of some piece. */
            tok_node *k = &t->nodes[used];
            k->byte = c;
            k->id = TOK_NO_ID;
            lo[used] = a;
            hi[used] = e;
            depth[used] = (uint16_t)(dep + 1);
            if (q == 0)
                t->root_kid[c] = (uint32_t)used;
            used++;
            t->nodes[q].nkids++;
            a = e;
        }
    }
    t->n_nodes = (uint32_t)used;
    {
        tok_node *shrunk = realloc(t->nodes, used * sizeof(*t->nodes));
        if (shrunk != NULL)
            t->nodes = shrunk;
    }
    free(tmp);
    free(lo);
    free(hi);
    free(depth);
    return WK_OK;
nomem:
    free(tmp);
    free(lo);
    free(hi);
    free(depth);
    return wk_diag_set(d, WK_ENOMEM, "vocab: out of memory building the trie");
}

/* Grows *arr (elements of size sz) to hold at least want elements; new ones are zeroed. */
static bool
tok_grow(void **arr, size_t *cap, size_t want, size_t sz)
{
    size_t nc;
    void *np;

    if (want <= *cap)
        return true;
    nc = *cap ? *cap : 256;
    while (nc < want)
        nc *= 2;
    np = realloc(*arr, nc * sz);
    if (np == NULL)
        return false;
    memset((uint8_t *)np + *cap * sz, 0, (nc - *cap) * sz);
    *arr = np;
    *cap = nc;
    return true;
}

wk_err
wk_tok_load_mem(const void *buf, size_t len, wk_tok **out, wk_diag *d)
{
    const uint8_t *src = buf;
    wk_tok *t = NULL;
    tok_entry *ent = NULL;
    size_t n_ent = 0, cap_ent = 0;
    uint32_t *id_line = NULL; /* by id: line that defined it, 0 if none */
    size_t cap_id = 0;
    uint32_t max_id = 0;
    size_t total = 0;
    uint8_t piece[WK_TOK_MAX_PIECE];
    tok_parse p = {.d = d, .line = 0, .out = piece, .out_len = 0};
    size_t pos = 0;
    wk_err err;

    if (len > WK_TOK_MAX_FILE)
        return wk_diag_set(d, WK_ETOOBIG, "vocab: file is %zu bytes, over the %u byte limit", len,
                           WK_TOK_MAX_FILE);
    if (len == 0)
        return wk_diag_set(d, WK_EINVAL, "vocab: empty file");
    if (memchr(src, '\0', len) != NULL) {
        const uint8_t *z = memchr(src, '\0', len);
        size_t ln = 1;
        for (const uint8_t *c = src; c < z; c++)
            ln += *c == '\n';
        return wk_diag_set(d, WK_EINVAL, "vocab line %zu: NUL byte", ln);
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL)
        goto nomem;
    /* A decoded piece is never longer than its literal, so len bounds all. */
    t->bytes = malloc(len);
    if (t->bytes == NULL)
        goto nomem;

    while (pos < len) {
        const uint8_t *l = src + pos;
        const uint8_t *nl = memchr(l, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - l) : len - pos;
        tok_entry e;

        pos += n + (nl != NULL);
        p.line++;
        if (n > 0 && l[n - 1] == '\r')
            n--;
        if (n > WK_TOK_MAX_LINE) {
            err = tok_fail(&p, "line longer than %d bytes", WK_TOK_MAX_LINE);
            goto fail;
        }
        if ((err = tok_line(&p, l, n, &e)) != WK_OK)
            goto fail;
        if (!tok_grow((void **)&id_line, &cap_id, (size_t)e.id + 1, sizeof(*id_line)))
            goto nomem;
        if (e.id > max_id)
            max_id = e.id;
        if (id_line[e.id] != 0) {
            err = tok_fail(&p, "duplicate id %u (first defined on line %u)", e.id,
                           id_line[e.id]);
            goto fail;
        }
        id_line[e.id] = (uint32_t)p.line;
        if (!tok_grow((void **)&ent, &cap_ent, n_ent + 1, sizeof(*ent)))
            goto nomem;
        e.off = (uint32_t)total;
        e.line = (uint32_t)p.line;
        memcpy(t->bytes + total, piece, e.len);
        total += e.len;
        ent[n_ent++] = e;
    }

    t->vocab_size = max_id + 1;
    t->count = (uint32_t)n_ent;
    t->piece_off = calloc(t->vocab_size, sizeof(*t->piece_off));
    t->piece_len = calloc(t->vocab_size, sizeof(*t->piece_len));
    if (t->piece_off == NULL || t->piece_len == NULL)
        goto nomem;
    for (size_t i = 0; i < n_ent; i++) {
        t->piece_off[ent[i].id] = ent[i].off;
        t->piece_len[ent[i].id] = (uint16_t)ent[i].len;
    }
    {
        bool have[256] = {false};
        for (size_t i = 0; i < n_ent; i++) {
            if (ent[i].len == 1)
                have[t->bytes[ent[i].off]] = true;
        }
        for (int b = 0; b < 256; b++) {
            if (!have[b]) {
                err = wk_diag_set(d, WK_EINVAL,
                                  "vocab line %zu (end of file): no single-byte token for byte "
                                  "0x%02x, so some inputs could not be encoded",
                                  p.line, b);
                goto fail;
            }
        }
    }
    if (total > 0) {
        uint8_t *shrunk = realloc(t->bytes, total);
        if (shrunk != NULL)
            t->bytes = shrunk;
    }
    if ((err = tok_build(t, ent, n_ent, total, d)) != WK_OK)
        goto fail;
    wk_sha256_hex(src, len, t->digest);
    t->eos = WK_TOK_EOT;
    free(ent);
    free(id_line);
    *out = t;
    return WK_OK;

nomem:
    err = wk_diag_set(d, WK_ENOMEM, "vocab: out of memory");
fail:
    free(ent);
    free(id_line);
    wk_tok_free(t);
    return err;
}

/*
 * Reads the regular file at path, at most max bytes. *buf is malloc'd (a NUL
 * is added after the *len bytes); what names the file in diags.
 */
static wk_err
tok_read_file(const char *path, const char *what, size_t max, uint8_t **buf, size_t *len,
              wk_diag *d)
{
    FILE *f;
    struct stat st;
    uint8_t *b;
    size_t got;

    f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        return wk_diag_set(d, e == ENOENT ? WK_ENOENT : WK_EIO, "%s %s: %s", what, path,
                           strerror(e));
    }
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return wk_diag_set(d, WK_EIO, "%s %s: not a regular file", what, path);
    }
    if ((uint64_t)st.st_size > max) {
        fclose(f);
        return wk_diag_set(d, WK_ETOOBIG, "%s %s: %lld bytes, over the %zu byte limit", what,
                           path, (long long)st.st_size, max);
    }
    b = malloc((size_t)st.st_size + 1);
    if (b == NULL) {
        fclose(f);
        return wk_diag_set(d, WK_ENOMEM, "%s %s: out of memory", what, path);
    }
    /* Read one byte more than stat said, to notice a file that grew. */
    got = fread(b, 1, (size_t)st.st_size + 1, f);
    if (ferror(f) || got != (size_t)st.st_size) {
        free(b);
        fclose(f);
        return wk_diag_set(d, WK_EIO, "%s %s: read error or file changed while reading", what,
                           path);
    }
    fclose(f);
    b[got] = 0;
    *buf = b;
    *len = got;
    return WK_OK;
}

wk_err
wk_tok_load(const char *path, wk_tok **out, wk_diag *d)
{
    uint8_t *buf;
    size_t got;
    wk_err err;

    if ((err = tok_read_file(path, "vocab", WK_TOK_MAX_FILE, &buf, &got, d)) != WK_OK)
        return err;
    err = wk_tok_load_mem(buf, got, out, d);
    free(buf);
    if (err != WK_OK)
        wk_diag_prefix(d, "%s", path);
    return err;
}

/* Sets t->eos from tokenizer_config.json (cfg may be NULL) or the defaults. */
static wk_err
tok_hf_eos(wk_tok *t, const void *cfg, size_t cfg_len, const char *cfg_label, wk_diag *d)
{
    json_error_t je;
    json_t *root, *eos;

    if (cfg != NULL) {
        if (cfg_len > WK_BPE_MAX_FILE)
            return wk_diag_set(d, WK_ETOOBIG, "%s: %zu bytes, over the %u byte limit", cfg_label,
                               cfg_len, WK_BPE_MAX_FILE);
        root = json_loadb(cfg, cfg_len, JSON_REJECT_DUPLICATES, &je);
        if (root == NULL)
            return wk_diag_set(d, WK_EINVAL, "%s: line %d column %d: %s", cfg_label, je.line,
                               je.column, je.text);
        if (!json_is_object(root)) {
            json_decref(root);
            return wk_diag_set(d, WK_EINVAL, "%s: the top level is not an object", cfg_label);
        }
        eos = json_object_get(root, "eos_token");
        if (json_is_object(eos))
            eos = json_object_get(eos, "content");
        if (eos != NULL && json_is_null(eos)) {
            json_decref(root);
            t->eos = -1;
            return WK_OK;
        }
        if (eos != NULL && !json_is_string(eos)) {
            json_decref(root);
            return wk_diag_set(d, WK_EINVAL,
                               "%s: eos_token is neither a string nor {\"content\": string}",
                               cfg_label);
        }
        if (eos != NULL) {
            int32_t id = wk_bpe_find(t->bpe, json_string_value(eos), json_string_length(eos));
            if (id < 0) {
                wk_err e = wk_diag_set(d, WK_EINVAL,
                                       "%s: eos_token \"%.64s\" is not a token of the tokenizer",
                                       cfg_label, json_string_value(eos));
                json_decref(root);
                return e;
            }
            t->eos = id;
            json_decref(root);
            return WK_OK;
        }
        json_decref(root);
    }
    /* No config, or no eos_token in it: the usual names, first found wins. */
    static const char *const defaults[] = {"<|endoftext|>", "</s>"};
    t->eos = -1;
    for (size_t i = 0; i < 2 && t->eos < 0; i++)
        t->eos = wk_bpe_find(t->bpe, defaults[i], strlen(defaults[i]));
    return WK_OK;
}

/* The HF loader behind both entry points; label and cfg_label name the files in diags. */
static wk_err
tok_hf_load(const void *buf, size_t len, const char *label, const void *cfg, size_t cfg_len,
            const char *cfg_label, wk_tok **out, wk_diag *d)
{
    wk_tok *t = calloc(1, sizeof(*t));
    wk_err err;

    if (t == NULL)
        return wk_diag_set(d, WK_ENOMEM, "%s: out of memory", label);
    if ((err = wk_bpe_load_mem(buf, len, label, &t->bpe, d)) != WK_OK ||
        (err = tok_hf_eos(t, cfg, cfg_len, cfg_label, d)) != WK_OK) {
        wk_tok_free(t);
        return err;
    }
    t->vocab_size = wk_bpe_vocab_size(t->bpe);
    t->count = wk_bpe_count(t->bpe);
    wk_sha256_hex(buf, len, t->digest);
    *out = t;
    return WK_OK;
}

wk_err
wk_tok_load_hf_mem(const void *buf, size_t len, const void *cfg, size_t cfg_len, wk_tok **out,
                   wk_diag *d)
{
    return tok_hf_load(buf, len, "tokenizer.json", cfg, cfg_len, "tokenizer_config.json", out,
                       d);
}

wk_err
wk_tok_load_hf(const char *path, wk_tok **out, wk_diag *d)
{
    uint8_t *buf = NULL, *cfg = NULL;
    size_t len = 0, cfg_len = 0;
    char *cfg_path = NULL;
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    wk_err err;

    if ((err = tok_read_file(path, "tokenizer", WK_BPE_MAX_FILE, &buf, &len, d)) != WK_OK)
        return err;
    cfg_path = malloc(dir_len + sizeof("tokenizer_config.json"));
    if (cfg_path == NULL) {
        free(buf);
        return wk_diag_set(d, WK_ENOMEM, "%s: out of memory", path);
    }
    memcpy(cfg_path, path, dir_len);
    memcpy(cfg_path + dir_len, "tokenizer_config.json", sizeof("tokenizer_config.json"));
    err = tok_read_file(cfg_path, "tokenizer config", WK_BPE_MAX_FILE, &cfg, &cfg_len, d);
    if (err == WK_ENOENT) {
        cfg = NULL;
        err = WK_OK;
    }
    if (err == WK_OK)
        err = tok_hf_load(buf, len, path, cfg, cfg_len, cfg_path, out, d);
    free(buf);
    free(cfg);
    free(cfg_path);
    return err;
}

void
wk_tok_free(wk_tok *t)
{
    if (t == NULL)
        return;
    free(t->bytes);
    free(t->piece_off);
    free(t->piece_len);
    free(t->nodes);
    wk_bpe_free(t->bpe);
    free(t);
}

const char *
wk_tok_kind(const wk_tok *t)
{
    return t->bpe != NULL ? wk_bpe_kind(t->bpe) : "world";
}

int32_t
wk_tok_eos(const wk_tok *t)
{
    return t->eos;
}

uint32_t
wk_tok_vocab_size(const wk_tok *t)
{
    return t->vocab_size;
}

uint32_t
wk_tok_count(const wk_tok *t)
{
    return t->count;
}

const char *
wk_tok_digest(const wk_tok *t)
{
    return t->digest;
}

const uint8_t *
wk_tok_piece(const wk_tok *t, int32_t id, size_t *len)
{
    *len = 0;
    if (t->bpe != NULL)
        return wk_bpe_piece(t->bpe, id, len);
    if (id == WK_TOK_EOT)
        return (const uint8_t *)"";
    if (id < 0 || (uint32_t)id >= t->vocab_size || t->piece_len[id] == 0)
        return NULL;
    *len = t->piece_len[id];
    return t->bytes + t->piece_off[id];
}

bool
wk_tok_is_added(const wk_tok *t, int32_t id)
{
    return t->bpe != NULL && wk_bpe_is_added(t->bpe, id);
}

/* The child of node q along byte c, or 0 (the root is never a child). */
static uint32_t
tok_child(const wk_tok *t, uint32_t q, uint8_t c)
{
    const tok_node *nd = &t->nodes[q];
    uint32_t a = nd->first, b = nd->first + nd->nkids;

    while (a < b) {
        uint32_t m = a + (b - a) / 2;
        uint8_t mc = t->nodes[m].byte;
        if (mc == c)
            return m;
        if (mc < c)
            a = m + 1;
        else
            b = m;
    }
    return 0;
}

wk_err
wk_tok_encode(const wk_tok *t, const char *text, size_t len, int32_t **ids, size_t *n_ids,
              wk_diag *d)
{
    const uint8_t *s = (const uint8_t *)text;
    int32_t *v;
    size_t n = 0, i = 0;

    if (t->bpe != NULL)
        return wk_bpe_encode(t->bpe, text, len, ids, n_ids, d);
    if (len > SIZE_MAX / sizeof(*v) - 1)
        return wk_diag_set(d, WK_ETOOBIG, "encode: input of %zu bytes is too large", len);
    v = malloc((len ? len : 1) * sizeof(*v));
    if (v == NULL)
        return wk_diag_set(d, WK_ENOMEM, "encode: out of memory for %zu bytes", len);
    while (i < len) {
        uint32_t q = t->root_kid[s[i]];
        int32_t best = TOK_NO_ID;
        size_t best_len = 0, j = i + 1;

        /* Every byte has a token (checked at load), so q != 0 here. */
        while (q != 0) {
            if (t->nodes[q].id != TOK_NO_ID) {
                best = t->nodes[q].id;
                best_len = j - i;
            }
            if (j >= len)
                break;
            q = tok_child(t, q, s[j++]);
        }
        if (best == TOK_NO_ID) {
            free(v);
            return wk_diag_set(d, WK_EINVAL, "encode: no token for byte 0x%02x", s[i]);
        }
        v[n++] = best;
        i += best_len;
    }
    if (n < len) {
        int32_t *shrunk = realloc(v, (n ? n : 1) * sizeof(*v));
        if (shrunk != NULL)
            v = shrunk;
    }
    *ids = v;
    *n_ids = n;
    return WK_OK;
}

wk_err
wk_tok_encode_continue(const wk_tok *t, const char *text, size_t len, size_t start,
                       int32_t **ids, size_t *n_ids, wk_diag *d)
{
    if (t->bpe != NULL)
        return wk_bpe_encode_continue(t->bpe, text, len, start, ids, n_ids, d);
    if (start > len)
        return wk_diag_set(d, WK_EINVAL, "encode: start %zu is past the %zu bytes of text", start,
                           len);
    return wk_tok_encode(t, text + start, len - start, ids, n_ids, d);
}

bool
wk_tok_text_prefix(const wk_tok *t, const int32_t *ids, size_t n, int32_t hidden,
                   const char *text, size_t len, size_t *bytes)
{
    size_t off = 0;

    if (t->bpe != NULL)
        return wk_bpe_text_prefix(t->bpe, ids, n, hidden, text, len, bytes);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] == hidden && hidden >= 0)
            continue;
        size_t pl = 0;
        const uint8_t *p = wk_tok_piece(t, ids[i], &pl);
        if (p == NULL || pl > len - off || memcmp(text + off, p, pl) != 0)
            return false;
        off += pl;
    }
    *bytes = off;
    return true;
}

wk_err
wk_tok_decode(const wk_tok *t, const int32_t *ids, size_t n, char **out, size_t *out_len,
              wk_diag *d)
{
    size_t total = 0, len;
    char *buf;

    for (size_t i = 0; i < n; i++) {
        if (wk_tok_piece(t, ids[i], &len) == NULL)
            return wk_diag_set(d, WK_EINVAL, "decode: unknown token id %d at index %zu",
                               (int)ids[i], i);
        total += len; /* <= n * WK_TOK_MAX_PIECE; n is bounded by memory */
    }
    buf = malloc(total + 1);
    if (buf == NULL)
        return wk_diag_set(d, WK_ENOMEM, "decode: out of memory for %zu bytes", total);
    total = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *pc = wk_tok_piece(t, ids[i], &len);
        memcpy(buf + total, pc, len);
        total += len;
    }
    /* hf-spm: the decoder drops the space the encoder put in front (Strip / Metaspace). */
    if (t->bpe != NULL && wk_bpe_strips_space(t->bpe) && total > 0 && buf[0] == ' ') {
        memmove(buf, buf + 1, total - 1);
        total--;
    }
    buf[total] = '\0';
    *out = buf;
    *out_len = total;
    return WK_OK;
}

void
wk_tok_stream_init(wk_tok_stream *s, const wk_tok *t)
{
    memset(s, 0, sizeof(*s));
    s->tok = t;
}

size_t
wk_tok_stream_pending(const wk_tok_stream *s)
{
    return s->npend;
}

static size_t
tok_put_fffd(char *out)
{
    out[0] = (char)0xef;
    out[1] = (char)0xbf;
    out[2] = (char)0xbd;
    return 3;
}

/* Runs the decoder over n bytes; out must hold 3 * (s->npend + n). */
static size_t
tok_stream_feed(wk_tok_stream *s, const uint8_t *b, size_t n, char *out)
{
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        uint8_t c = b[i];

        if (s->npend > 0) {
            if (tok_utf8_cont_ok(s->pend[0], s->npend, c)) {
                s->pend[s->npend++] = c;
                if (s->npend == s->need) {
                    memcpy(out + o, s->pend, s->npend);
                    o += s->npend;
                    s->npend = 0;
                    s->need = 0;
                }
                continue;
            }
            /* The held bytes are a maximal invalid subpart; c starts afresh. */
            o += tok_put_fffd(out + o);
            s->npend = 0;
            s->need = 0;
        }
        size_t need = tok_utf8_need(c);
        if (need == 1) {
            out[o++] = (char)c;
        } else if (need == 0) {
            o += tok_put_fffd(out + o);
        } else {
            s->pend[0] = c;
            s->npend = 1;
            s->need = (uint8_t)need;
        }
    }
    return o;
}

wk_err
wk_tok_stream_push_bytes(wk_tok_stream *s, const uint8_t *bytes, size_t n, char *out, size_t cap,
                         size_t *out_len)
{
    if (n > SIZE_MAX / 3 - 4 || cap < 3 * (n + s->npend))
        return WK_ETOOBIG;
    *out_len = tok_stream_feed(s, bytes, n, out);
    return WK_OK;
}

wk_err
wk_tok_stream_push(wk_tok_stream *s, int32_t id, char *out, size_t cap, size_t *out_len,
                   wk_diag *d)
{
    size_t len;
    const uint8_t *pc;

    if (s->tok == NULL)
        return wk_diag_set(d, WK_EINVAL, "stream: no vocabulary");
    pc = wk_tok_piece(s->tok, id, &len);
    if (pc == NULL)
        return wk_diag_set(d, WK_EINVAL, "stream: unknown token id %d", (int)id);
    if (cap < 3 * (len + s->npend))
        return wk_diag_set(d, WK_ETOOBIG, "stream: output buffer of %zu bytes is too small",
                           cap);
    *out_len = tok_stream_feed(s, pc, len, out);
    return WK_OK;
}

size_t
wk_tok_stream_flush(wk_tok_stream *s, char out[WK_TOK_STREAM_FLUSH_MAX])
{
    size_t o = 0;

    if (s->npend > 0)
        o = tok_put_fffd(out);
    s->npend = 0;
    s->need = 0;
    return o;
}
