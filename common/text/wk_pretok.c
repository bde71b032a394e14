/*
 * wk_pretok: Split / Digits / ByteLevel pre-tokenizers over PCRE2.
 *
 * Every stage is one compiled pattern and a split behavior (Digits and the
 * ByteLevel GPT-2 split are written as the patterns they amount to). A split
 * takes each maximal well-formed UTF-8 run of the input through the stages:
 * a list of spans (offset, length into the input), each stage replacing
 * every span by the pieces its matches cut it into, following the
 * `tokenizers` rules (find_matches, then the behavior, then empty pieces
 * dropped). Nothing is copied: a word is a span of the input. The module
 * never logs and keeps no global state; it is the only user of PCRE2.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "wk_pretok.h"

#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_utf8.h"

/* How a stage keeps what its pattern matched (SplitDelimiterBehavior). */
typedef enum pretok_behavior {
    PRETOK_BEHAVIOR_ISOLATED = 0, /* a match is a piece of its own */
    PRETOK_BEHAVIOR_REMOVED,      /* a match is dropped */
    PRETOK_BEHAVIOR_MERGED_PREV,  /* a match joins the piece before it */
    PRETOK_BEHAVIOR_MERGED_NEXT,  /* a match joins the piece after it */
    PRETOK_BEHAVIOR_CONTIGUOUS,   /* consecutive matches are one piece */
} pretok_behavior;

/* One member of the Sequence. */
typedef struct pretok_stage {
    pcre2_code *re;           /* compiled pattern (JIT-compiled when available) */
    pretok_behavior behavior; /* what happens to the matches */
    bool invert;              /* the pieces between matches are the matches */
} pretok_stage;

struct wk_pretok {
    pretok_stage stage[WK_PRETOK_MAX_STAGES]; /* in order */
    size_t n_stage;                           /* stages used */
    pcre2_match_context *mctx;                /* copied per split, which sets the limit */
};

/* A piece of the input. */
typedef struct pretok_span {
    size_t off; /* byte offset in the input */
    size_t len; /* bytes */
} pretok_span;

/* A growable span list. */
typedef struct pretok_list {
    pretok_span *v; /* spans */
    size_t n, cap;  /* used / allocated */
} pretok_list;

/* char::is_numeric: \p{N} with the numerals Unicode 15 added. */
#define PRETOK_NUMERIC "[\\p{N}\\x{11F50}-\\x{11F59}\\x{1D2C0}-\\x{1D2D3}]"

/* The GPT-2 split of ByteLevel use_regex, as `tokenizers` writes it. */
static const char pretok_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- loading ---- */

/* Oniguruma's \s (HT, LF, VT, FF, CR, NEL and \p{Z}); PCRE2's also has U+180E. */
#define PRETOK_SPACE "\\t\\n\\x0b\\f\\r\\x{85}\\p{Z}"

/*
 * Writes r[0..n) as PCRE2 should read it to mean what Oniguruma reads:
 * \s and \S become Oniguruma's white-space set, spelt out (inside a
 * character class too; a \S there is refused). Refuses what the two read
 * differently and is not rewritten: backslash escapes outside a short list,
 * inline options other than i (Oniguruma's (?m) is PCRE2's (?s)), nested
 * classes (POSIX brackets, Oniguruma's [a&&[b]]) and && in a class. out
 * holds PRETOK_GROW * n + 1 bytes. Returns NULL and sets *out_len, or a
 * static description of the first problem, at offset *at.
 */
#define PRETOK_GROW 32
static const char *
pretok_translate(const char *r, size_t n, char *out, size_t *out_len, size_t *at)
{
    static const char ok_esc[] = "sSdDpPnrtfaexAzZ";
    bool in_class = false;
    size_t o = 0, class_start = 0;

    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)r[i];
        *at = i;
        if (c == '\\') {
            if (i + 1 == n)
                return "a lone backslash at the end";
            unsigned char e = (unsigned char)r[++i];
            bool alnum = (e >= '0' && e <= '9') || ((e | 0x20) >= 'a' && (e | 0x20) <= 'z');
            if (alnum && strchr(ok_esc, e) == NULL)
                return "an escape whose meaning differs between Oniguruma and PCRE2 "
                       "(only \\s \\S \\d \\D \\p \\P \\n \\r \\t \\f \\a \\e \\x \\A \\z \\Z)";
            if (e == 'x' && !(i + 1 < n && r[i + 1] == '{') &&
                !(i + 2 < n && strchr("0123456789abcdefABCDEF", r[i + 1]) != NULL &&
                  strchr("0123456789abcdefABCDEF", r[i + 2]) != NULL))
                return "\\x not followed by two hex digits or {...}";
            if (e == 's' || e == 'S') {
                if (in_class && e == 'S')
                    return "\\S inside a character class";
                const char *rep = in_class   ? PRETOK_SPACE
                                  : e == 's' ? "[" PRETOK_SPACE "]"
                                             : "[^" PRETOK_SPACE "]";
                memcpy(out + o, rep, strlen(rep));
                o += strlen(rep);
                continue;
            }
            out[o++] = '\\';
            out[o++] = (char)e;
            continue;
        }
        if (in_class) {
            if (c == '[')
                return "a nested character class or POSIX bracket (they differ)";
            if (c == '&' && i + 1 < n && r[i + 1] == '&')
                return "&& in a character class (Oniguruma's intersection)";
            if (c == ']' && i > class_start)
                in_class = false;
            out[o++] = (char)c;
            continue;
        }
        if (c == '[') {
            in_class = true;
            out[o++] = (char)c;
            if (i + 1 < n && r[i + 1] == '^')
                out[o++] = r[++i];
            class_start = i + 1; /* a ] right here is a literal */
            continue;
        }
        if (c == '(' && i + 2 < n && r[i + 1] == '?') {
            size_t j = i + 2;
            bool opt = false;
            while (j < n && (r[j] == '-' || ((r[j] | 0x20) >= 'a' && (r[j] | 0x20) <= 'z'))) {
                if (r[j] != 'i' && r[j] != '-')
                    return "an inline option other than (?i) (Oniguruma reads (?m) as dotall)";
                opt = true;
                j++;
            }
            if (opt && (j == n || (r[j] != ':' && r[j] != ')')))
                return "a malformed inline option group";
        }
        out[o++] = (char)c;
    }
    *out_len = o;
    return NULL;
}

/* Compiles pattern r (n bytes; literal: a String pattern) into st->re. */
static wk_err
pretok_compile(pretok_stage *st, const char *r, size_t n, bool literal, const char *path,
               wk_diag *d)
{
    pcre2_compile_context *cc;
    int ec = 0;
    PCRE2_SIZE eo = 0;
    uint32_t opt;

    if (n > WK_PRETOK_MAX_PATTERN)
        return wk_diag_set(d, WK_ETOOBIG, "%s: pattern of %zu bytes, over %d", path, n,
                           WK_PRETOK_MAX_PATTERN);
    char *tr = malloc(PRETOK_GROW * n + 1);
    if (tr == NULL)
        return wk_diag_set(d, WK_ENOMEM, "%s: out of memory", path);
    if (!literal) {
        size_t at = 0;
        const char *why = pretok_translate(r, n, tr, &n, &at);
        if (why != NULL) {
            free(tr);
            return wk_diag_set(d, WK_ENOTSUP, "%s: pattern offset %zu: %s is not supported", path,
                               at, why);
        }
        r = tr;
    }
    cc = pcre2_compile_context_create(NULL);
    if (cc == NULL) {
        free(tr);
        return wk_diag_set(d, WK_ENOMEM, "%s: out of memory", path);
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    /* Oniguruma's default syntax: ^ and $ at every line start and end. */
    opt = literal ? PCRE2_UTF | PCRE2_LITERAL
                  : PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_ALT_CIRCUMFLEX |
                        PCRE2_NEVER_BACKSLASH_C;
    st->re = pcre2_compile((PCRE2_SPTR)r, n, opt, &ec, &eo, cc);
    pcre2_compile_context_free(cc);
    free(tr); /* the offset of a compile error is in the rewritten pattern */
    if (st->re == NULL) {
        PCRE2_UCHAR msg[160];
        if (pcre2_get_error_message(ec, msg, sizeof(msg)) < 0)
            snprintf((char *)msg, sizeof(msg), "error %d", ec);
        return wk_diag_set(d, ec == PCRE2_ERROR_NOMEMORY ? WK_ENOMEM : WK_EINVAL,
                           "%s: pattern offset %zu: %s", path, (size_t)eo, (const char *)msg);
    }
    (void)pcre2_jit_compile(st->re, PCRE2_JIT_COMPLETE); /* the interpreter when it fails */
    return WK_OK;
}

/* True when member key of o is absent, null, or the boolean want. */
static bool
pretok_bool_is(const json_t *o, const char *key, bool want, bool *out)
{
    const json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v)) {
        *out = want;
        return true;
    }
    if (!json_is_boolean(v))
        return false;
    *out = json_is_true(v);
    return true;
}

static wk_err
pretok_split_stage(pretok_stage *st, const json_t *o, const char *path, wk_diag *d)
{
    static const char *const names[] = {"Isolated", "Removed", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    const json_t *pat = json_object_get(o, "pattern");
    const json_t *beh = json_object_get(o, "behavior");
    const json_t *r;
    bool literal;
    size_t k;

    if (!json_is_object(pat) || json_object_size(pat) != 1)
        return wk_diag_set(d, WK_EINVAL, "%s.pattern is not {\"Regex\": ...} or {\"String\": ...}",
                           path);
    if ((r = json_object_get(pat, "Regex")) != NULL)
        literal = false;
    else if ((r = json_object_get(pat, "String")) != NULL)
        literal = true;
    else
        return wk_diag_set(d, WK_EINVAL, "%s.pattern is not {\"Regex\": ...} or {\"String\": ...}",
                           path);
    if (!json_is_string(r))
        return wk_diag_set(d, WK_EINVAL, "%s.pattern value is not a string", path);
    if (!json_is_string(beh))
        return wk_diag_set(d, WK_EINVAL, "%s.behavior is not a string", path);
    for (k = 0; k < 5 && strcmp(json_string_value(beh), names[k]) != 0; k++)
        ;
    if (k == 5)
        return wk_diag_set(d, WK_EINVAL,
                           "%s.behavior \"%.40s\" is not Isolated, Removed, MergedWithPrevious, "
                           "MergedWithNext or Contiguous",
                           path, json_string_value(beh));
    st->behavior = (pretok_behavior)k;
    if (!pretok_bool_is(o, "invert", false, &st->invert))
        return wk_diag_set(d, WK_EINVAL, "%s.invert is not a boolean", path);
    char sub[96];
    snprintf(sub, sizeof(sub), "%s.pattern", path);
    return pretok_compile(st, json_string_value(r), json_string_length(r), literal, sub, d);
}

/* Reads member o (at path) into stage *st; last: it is the Sequence's last member. */
static wk_err
pretok_stage_load(pretok_stage *st, const json_t *o, const char *path, bool last, wk_diag *d)
{
    const char *ty = json_is_object(o) ? json_string_value(json_object_get(o, "type")) : NULL;
    bool b;

    if (ty == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s is not an object with a \"type\"", path);
    if (strcmp(ty, "Split") == 0)
        return pretok_split_stage(st, o, path, d);
    if (strcmp(ty, "Digits") == 0) {
        if (!pretok_bool_is(o, "individual_digits", false, &b))
            return wk_diag_set(d, WK_EINVAL, "%s.individual_digits is not a boolean", path);
        /*
         * Rust's char::is_numeric (Nd, Nl, No) in the Unicode 15 tables of
         * `tokenizers`' builds: PCRE2 10.42's \p{N} (Unicode 14) plus the
         * Unicode 15 Kawi digits and Kaktovik numerals. Runs of them are one
         * piece unless individual_digits.
         */
        st->behavior = PRETOK_BEHAVIOR_ISOLATED;
        const char *re = b ? PRETOK_NUMERIC : PRETOK_NUMERIC "+";
        return pretok_compile(st, re, strlen(re), false, path, d);
    }
    if (strcmp(ty, "ByteLevel") == 0) {
        if (!last)
            return wk_diag_set(d, WK_ENOTSUP, "%s: ByteLevel is supported only as the last member",
                               path);
        if (!pretok_bool_is(o, "add_prefix_space", true, &b))
            return wk_diag_set(d, WK_EINVAL, "%s.add_prefix_space is not a boolean", path);
        if (b)
            return wk_diag_set(d, WK_ENOTSUP,
                               "%s.add_prefix_space true is not supported in a Sequence", path);
        if (!pretok_bool_is(o, "use_regex", true, &b))
            return wk_diag_set(d, WK_EINVAL, "%s.use_regex is not a boolean", path);
        if (!b)
            return WK_OK; /* st->re stays NULL: no split */
        st->behavior = PRETOK_BEHAVIOR_ISOLATED;
        return pretok_compile(st, pretok_gpt2, sizeof(pretok_gpt2) - 1, false, path, d);
    }
    return wk_diag_set(d, WK_ENOTSUP,
                       "%s.type \"%.40s\" is not supported (Split, Digits, ByteLevel last)", path,
                       ty);
}

wk_err
wk_pretok_new(const char *json, size_t len, const char *path, wk_pretok **out, wk_diag *d)
{
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    wk_pretok *p = NULL;
    wk_err err = WK_OK;
    const char *ty;

    if (root == NULL)
        return wk_diag_set(d, WK_EINVAL, "%s: %s", path, je.text);
    p = calloc(1, sizeof(*p));
    if (p == NULL || (p->mctx = pcre2_match_context_create(NULL)) == NULL) {
        err = wk_diag_set(d, WK_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    ty = json_is_object(root) ? json_string_value(json_object_get(root, "type")) : NULL;
    if (ty != NULL && strcmp(ty, "Sequence") == 0) {
        const json_t *arr = json_object_get(root, "pretokenizers");
        size_t i;
        json_t *m;
        if (!json_is_array(arr)) {
            err = wk_diag_set(d, WK_EINVAL, "%s.pretokenizers is not an array", path);
            goto fail;
        }
        if (json_array_size(arr) > WK_PRETOK_MAX_STAGES) {
            err = wk_diag_set(d, WK_ETOOBIG, "%s.pretokenizers has %zu members, over %d", path,
                              json_array_size(arr), WK_PRETOK_MAX_STAGES);
            goto fail;
        }
        json_array_foreach(arr, i, m) {
            char sub[96];
            snprintf(sub, sizeof(sub), "%s.pretokenizers[%zu]", path, i);
            const char *mt =
                json_is_object(m) ? json_string_value(json_object_get(m, "type")) : NULL;
            if (mt != NULL && strcmp(mt, "ByteLevel") != 0 && i + 1 == json_array_size(arr)) {
                err = wk_diag_set(d, WK_ENOTSUP,
                                  "%s: the Sequence must end in ByteLevel (the byte-level "
                                  "alphabet)",
                                  sub);
                goto fail;
            }
            if ((err = pretok_stage_load(&p->stage[p->n_stage], m, sub,
                                         i + 1 == json_array_size(arr), d)) != WK_OK)
                goto fail;
            if (p->stage[p->n_stage].re != NULL)
                p->n_stage++;
        }
    } else if (ty != NULL && strcmp(ty, "Split") == 0) {
        if ((err = pretok_split_stage(&p->stage[0], root, path, d)) != WK_OK)
            goto fail;
        p->n_stage = 1;
    } else {
        err = wk_diag_set(d, WK_ENOTSUP,
                          "%s: only Split or a Sequence of Split/Digits ending in "
                          "ByteLevel is supported here",
                          path);
        goto fail;
    }
    json_decref(root);
    *out = p;
    return WK_OK;
fail:
    json_decref(root);
    wk_pretok_free(p);
    return err;
}

void
wk_pretok_free(wk_pretok *p)
{
    if (p == NULL)
        return;
    for (size_t i = 0; i < WK_PRETOK_MAX_STAGES; i++)
        pcre2_code_free(p->stage[i].re);
    pcre2_match_context_free(p->mctx);
    free(p);
}

/* ---- splitting ---- */

static bool
pretok_push(pretok_list *l, size_t off, size_t len)
{
    if (l->n == l->cap) {
        size_t nc = l->cap * 2 + 16;
        pretok_span *nv = realloc(l->v, nc * sizeof(*nv));
        if (nv == NULL)
            return false;
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = (pretok_span){.off = off, .len = len};
    return true;
}

/* A match or a gap between matches, in order (find_matches). */
typedef struct pretok_cut {
    size_t a, b;   /* byte range in the subject */
    bool is_match; /* the pattern matched it (after invert) */
} pretok_cut;

/* A growable list of cuts. */
typedef struct pretok_cuts {
    pretok_cut *v; /* cuts */
    size_t n, cap; /* used / allocated */
} pretok_cuts;

static bool
pretok_cut_add(pretok_cuts *c, size_t a, size_t b, bool m)
{
    if (c->n == c->cap) {
        size_t nc = c->cap * 2 + 16;
        pretok_cut *nv = realloc(c->v, nc * sizeof(*nv));
        if (nv == NULL)
            return false;
        c->v = nv;
        c->cap = nc;
    }
    c->v[c->n++] = (pretok_cut){.a = a, .b = b, .is_match = m};
    return true;
}

/*
 * The matches of st in s[0..n) (well-formed UTF-8) and the gaps between
 * them, as `tokenizers` lists them: leftmost matches from where the last one
 * ended; an empty match right where the previous match ended is skipped by
 * moving on one character (Oniguruma's find_iter).
 */
static wk_err
pretok_find(const pretok_stage *st, const uint8_t *s, size_t n, pcre2_match_data *md,
            pcre2_match_context *mctx, pretok_cuts *c, wk_diag *d)
{
    size_t prev = 0, from = 0, last_me = 0;
    bool have_last = false;

    c->n = 0;
    /*
     * The limit grows with the piece: a real pattern backtracks over a run
     * once (Qwen's \s*[\r\n]+ over a run of spaces); an exponential one
     * still stops.
     */
    if (n > (UINT32_MAX - WK_PRETOK_MATCH_LIMIT) / WK_PRETOK_MATCH_PER_BYTE)
        return wk_diag_set(d, WK_ETOOBIG, "pre-tokenizer: a piece of %zu bytes is too large", n);
    pcre2_set_match_limit(mctx, WK_PRETOK_MATCH_LIMIT + WK_PRETOK_MATCH_PER_BYTE * (uint32_t)n);
    while (from <= n) {
        int rc = pcre2_match(st->re, s, n, from, PCRE2_NO_UTF_CHECK, md, mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(st->re, s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
            rc == PCRE2_ERROR_HEAPLIMIT)
            return wk_diag_set(d, WK_ETOOBIG,
                               "pre-tokenizer: the pattern ran into its match limit on a piece "
                               "of %zu bytes",
                               n);
        if (rc == PCRE2_ERROR_NOMEMORY)
            return wk_diag_set(d, WK_ENOMEM, "pre-tokenizer: out of memory");
        if (rc < 0)
            return wk_diag_set(d, WK_EINVAL, "pre-tokenizer: PCRE2 match error %d", rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms || ms < from)
            return wk_diag_set(d, WK_EINVAL, "pre-tokenizer: a match that ends before it starts");
        if (ms == me && have_last && last_me == me) {
            if (from == n)
                break;
            size_t l = wk_utf8_dec(s + from, n - from, NULL);
            from += l ? l : 1;
            continue;
        }
        from = me;
        last_me = me;
        have_last = true;
        if (prev != ms && !pretok_cut_add(c, prev, ms, st->invert))
            return wk_diag_set(d, WK_ENOMEM, "pre-tokenizer: out of memory");
        if (!pretok_cut_add(c, ms, me, !st->invert))
            return wk_diag_set(d, WK_ENOMEM, "pre-tokenizer: out of memory");
        prev = me;
    }
    if (prev != n && !pretok_cut_add(c, prev, n, st->invert))
        return wk_diag_set(d, WK_ENOMEM, "pre-tokenizer: out of memory");
    return WK_OK;
}

/*
 * Applies the behavior to the cuts in place (the `tokenizers` folds): each
 * cut that stays is kept with is_match cleared, a cut to drop has it set
 * (Removed only). Returns the number of cuts left.
 */
static size_t
pretok_behave(pretok_behavior beh, pretok_cut *v, size_t n)
{
    size_t k = 0;
    bool prev_match = false;

    switch (beh) {
    case PRETOK_BEHAVIOR_ISOLATED:
        for (size_t i = 0; i < n; i++)
            v[i].is_match = false;
        return n;
    case PRETOK_BEHAVIOR_REMOVED:
        return n;
    case PRETOK_BEHAVIOR_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            bool m = v[i].is_match;
            if (m == prev_match && k > 0)
                v[k - 1].b = v[i].b;
            else
                v[k++] = (pretok_cut){.a = v[i].a, .b = v[i].b, .is_match = false};
            prev_match = m;
        }
        return k;
    case PRETOK_BEHAVIOR_MERGED_PREV:
        for (size_t i = 0; i < n; i++) {
            bool m = v[i].is_match;
            if (m && !prev_match && k > 0)
                v[k - 1].b = v[i].b;
            else
                v[k++] = (pretok_cut){.a = v[i].a, .b = v[i].b, .is_match = false};
            prev_match = m;
        }
        return k;
    case PRETOK_BEHAVIOR_MERGED_NEXT:
        /* right to left, written from the end of v, then moved to the front */
        k = n;
        for (size_t i = n; i-- > 0;) {
            bool m = v[i].is_match;
            if (m && !prev_match && k < n)
                v[k].a = v[i].a;
            else
                v[--k] = (pretok_cut){.a = v[i].a, .b = v[i].b, .is_match = false};
            prev_match = m;
        }
        memmove(v, v + k, (n - k) * sizeof(*v));
        return n - k;
    }
    return 0;
}

/* Runs every stage over the valid UTF-8 run s[off..off+n) and hands out its words. */
static wk_err
pretok_run(const wk_pretok *p, const uint8_t *s, size_t off, size_t n, pretok_list *cur,
           pretok_list *next, pretok_cuts *cuts, pcre2_match_data *md, pcre2_match_context *mctx,
           wk_pretok_word_fn fn, void *ctx, wk_diag *d)
{
    wk_err err;

    cur->n = 0;
    if (!pretok_push(cur, off, n))
        return wk_diag_set(d, WK_ENOMEM, "pre-tokenizer: out of memory");
    for (size_t k = 0; k < p->n_stage; k++) {
        const pretok_stage *st = &p->stage[k];
        next->n = 0;
        for (size_t i = 0; i < cur->n; i++) {
            const pretok_span sp = cur->v[i];
            if ((err = pretok_find(st, s + sp.off, sp.len, md, mctx, cuts, d)) != WK_OK)
                return err;
            size_t m = pretok_behave(st->behavior, cuts->v, cuts->n);
            for (size_t j = 0; j < m; j++) {
                const pretok_cut *c = &cuts->v[j];
                if (c->is_match || c->b == c->a)
                    continue; /* removed, or empty */
                if (!pretok_push(next, sp.off + c->a, c->b - c->a))
                    return wk_diag_set(d, WK_ENOMEM, "pre-tokenizer: out of memory");
            }
        }
        pretok_list t = *cur;
        *cur = *next;
        *next = t;
    }
    for (size_t i = 0; i < cur->n; i++) {
        if (!fn(ctx, s + cur->v[i].off, cur->v[i].len))
            return wk_diag_set(d, WK_ENOMEM, "pre-tokenizer: out of memory");
    }
    return WK_OK;
}

wk_err
wk_pretok_split(const wk_pretok *p, const uint8_t *s, size_t n, wk_pretok_word_fn fn, void *ctx,
                wk_diag *d)
{
    pretok_list a = {0}, b = {0};
    pretok_cuts cuts = {0};
    pcre2_match_data *md = NULL;
    pcre2_match_context *mctx = NULL;
    wk_err err = WK_OK;
    size_t i = 0, run = 0;

    if (n > PCRE2_SIZE_MAX / 2)
        return wk_diag_set(d, WK_ETOOBIG, "pre-tokenizer: input of %zu bytes is too large", n);
    md = pcre2_match_data_create(1, NULL);
    mctx = pcre2_match_context_copy(p->mctx); /* this call's: the limit follows the piece */
    if (md == NULL || mctx == NULL) {
        pcre2_match_data_free(md);
        pcre2_match_context_free(mctx);
        return wk_diag_set(d, WK_ENOMEM, "pre-tokenizer: out of memory");
    }
    while (i < n && err == WK_OK) {
        size_t l = wk_utf8_dec(s + i, n - i, NULL);
        if (l > 0) {
            i += l;
            continue;
        }
        /* s[i] is no part of well-formed UTF-8: the run before it, then the byte alone */
        if (i > run)
            err = pretok_run(p, s, run, i - run, &a, &b, &cuts, md, mctx, fn, ctx, d);
        if (err == WK_OK && !fn(ctx, s + i, 1))
            err = wk_diag_set(d, WK_ENOMEM, "pre-tokenizer: out of memory");
        run = ++i;
    }
    if (err == WK_OK && n > run)
        err = pretok_run(p, s, run, n - run, &a, &b, &cuts, md, mctx, fn, ctx, d);
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    free(a.v);
    free(b.v);
    free(cuts.v);
    return err;
}

/* ---- word characters (single_word added tokens) ---- */

struct wk_pretok_wordchar {
    pcre2_code *re; /* one word character, anchored at both ends */
};

wk_err
wk_pretok_wordchar_new(wk_pretok_wordchar **out, wk_diag *d)
{
    static const char re[] = "\\A[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]\\z";
    wk_pretok_wordchar *w = calloc(1, sizeof(*w));
    int ec = 0;
    PCRE2_SIZE eo = 0;

    if (w == NULL)
        return wk_diag_set(d, WK_ENOMEM, "word characters: out of memory");
    w->re = pcre2_compile((PCRE2_SPTR)re, sizeof(re) - 1, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (w->re == NULL) {
        free(w);
        return wk_diag_set(d, WK_ENOMEM, "word characters: PCRE2 error %d", ec);
    }
    (void)pcre2_jit_compile(w->re, PCRE2_JIT_COMPLETE);
    *out = w;
    return WK_OK;
}

void
wk_pretok_wordchar_free(wk_pretok_wordchar *w)
{
    if (w == NULL)
        return;
    pcre2_code_free(w->re);
    free(w);
}

bool
wk_pretok_wordchar_is(const wk_pretok_wordchar *w, const uint8_t *s, size_t n)
{
    if (n == 0 || wk_utf8_dec(s, n, NULL) != n)
        return false;
    if (n == 1)
        return ((s[0] | 0x20) >= 'a' && (s[0] | 0x20) <= 'z') || (s[0] >= '0' && s[0] <= '9') ||
               s[0] == '_';
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (md == NULL)
        return false;
    int rc = pcre2_match(w->re, s, n, 0, PCRE2_NO_UTF_CHECK, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}
