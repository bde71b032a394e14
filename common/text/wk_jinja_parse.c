/*
 * wk_jinja_parse: template source -> syntax tree (wk_jinja_priv.h), with
 * jinja2's lexing rules as transformers configures them: line breaks
 * normalised to "\n", one trailing newline dropped, trim_blocks (the newline
 * after a block or comment tag goes), lstrip_blocks (blanks before a block
 * or comment tag alone on its line go), "-" and "+" whitespace control, and
 * jinja2's operator precedence. It must never accept a construct the
 * evaluator cannot render exactly: such input is refused with WK_ENOTSUP
 * naming line, column and construct. The arena lives in the template.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_jinja_priv.h"

/* ---- arena ---- */

struct jj_chunk {
    jj_chunk *next; /* older chunk */
    size_t cap;     /* bytes of data */
    size_t off;     /* bytes used */
    max_align_t data[];
};

void *
jj_alloc(jj_arena *a, size_t n)
{
    jj_chunk *c = a->head;
    size_t need = (n + 15) & ~(size_t)15;
    if (n > SIZE_MAX / 2) {
        a->over = true;
        return NULL;
    }
    if (c == NULL || c->cap - c->off < need) {
        size_t cap = need > 65536 ? need : 65536;
        if (a->used + cap + sizeof(jj_chunk) > a->limit) {
            a->over = true;
            return NULL;
        }
        c = malloc(sizeof(jj_chunk) + cap);
        if (c == NULL)
            return NULL;
        c->cap = cap;
        c->off = 0;
        c->next = a->head;
        a->head = c;
        a->used += cap + sizeof(jj_chunk);
    }
    void *p = (char *)c->data + c->off;
    c->off += need;
    memset(p, 0, n);
    return p;
}

void
jj_arena_fini(jj_arena *a)
{
    if (a == NULL)
        return;
    jj_chunk *c = a->head;
    while (c != NULL) {
        jj_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

char *
jj_strdup(jj_arena *a, const char *s, size_t n)
{
    char *p = jj_alloc(a, n + 1);
    if (p != NULL && n > 0)
        memcpy(p, s, n);
    return p;
}

/* ---- tokens ---- */

enum {
    T_EOF,
    T_DATA,   /* template text (p, n) */
    T_VBEGIN, /* {{ */
    T_VEND,   /* }} */
    T_BBEGIN, /* {% */
    T_BEND,   /* %} */
    T_NAME,   /* p, n */
    T_STR,    /* decoded s, n */
    T_INT,    /* i */
    T_FLOAT,  /* f */
    T_OP,     /* op: a character, or one of OP_* */
};

enum { OP_FLOORDIV = 'F', OP_POW = 'P', OP_EQ = 'E', OP_NE = 'N', OP_LE = 'L', OP_GE = 'G' };

typedef struct jj_tok {
    int type;      /* T_* */
    int op;        /* T_OP */
    int line, col; /* where it starts */
    const char *p; /* T_DATA, T_NAME, T_STR bytes */
    size_t n;      /* their length */
    int64_t i;     /* T_INT */
    double f;      /* T_FLOAT */
} jj_tok;

typedef struct jj_parser {
    wk_jinja *t;   /* the template being built */
    const char *s; /* normalised source */
    size_t len;    /* its length */
    jj_tok *toks;  /* tokens */
    size_t ntok, cap;
    size_t pos;         /* next token */
    int depth;          /* nesting of the parse */
    bool in_loop;       /* break/continue allowed here (a for body, not a macro or set block) */
    bool soft;          /* inside an if or a conditional expression of this scope */
    jj_tok *unknown;    /* the first filter/test jinja2 lacks outside any if: a compile error */
    size_t unknown_pos; /* its token index */
    size_t lpos;        /* byte whose line and column are lline, lcol */
    int lline, lcol;
    wk_err err; /* first error */
    wk_diag *d;
} jj_parser;

static int perr(jj_parser *P, wk_err e, int line, int col, const char *fmt, ...) WK_PRINTF(5, 6);

static int
perr(jj_parser *P, wk_err e, int line, int col, const char *fmt, ...)
{
    if (P->err != WK_OK)
        return -1;
    P->err = e;
    if (P->d != NULL) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        wk_diag_set(P->d, e, "line %d column %d: %s", line, col, msg);
    }
    return -1;
}

static jj_tok *
tok_push(jj_parser *P, int type, size_t at)
{
    if (P->ntok == P->cap) {
        size_t cap = P->cap ? P->cap * 2 : 256;
        jj_tok *nt = realloc(P->toks, cap * sizeof *nt);
        if (nt == NULL) {
            perr(P, WK_ENOMEM, 0, 0, "out of memory");
            return NULL;
        }
        P->toks = nt;
        P->cap = cap;
    }
    jj_tok *k = &P->toks[P->ntok++];
    memset(k, 0, sizeof *k);
    k->type = type;
    /* line and column of byte at, counted on from the last token's */
    if (at < P->lpos || P->lline == 0) {
        P->lpos = 0;
        P->lline = 1;
        P->lcol = 1;
    }
    int line = P->lline, col = P->lcol;
    for (size_t i = P->lpos; i < at && i < P->len; i++) {
        if (P->s[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    P->lpos = at < P->len ? at : P->len;
    P->lline = line;
    P->lcol = col;
    k->line = line;
    k->col = col;
    return k;
}

/* Python's \s on UTF-8: the length of the whitespace char at s, or 0. */
static size_t
ws_at(const char *s, size_t n)
{
    return jj_space_len(s, n);
}

static size_t
skip_ws(const char *s, size_t n, size_t i)
{
    size_t k;
    while (i < n && (k = ws_at(s + i, n - i)) > 0)
        i += k;
    return i;
}

static bool
is_name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool
is_digit(char c)
{
    return c >= '0' && c <= '9';
}

void
jj_utf8_put(char *buf, size_t *o, uint32_t cp)
{
    if (cp < 0x80) {
        buf[(*o)++] = (char)cp;
    } else if (cp < 0x800) {
        buf[(*o)++] = (char)(0xc0 | (cp >> 6));
        buf[(*o)++] = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        buf[(*o)++] = (char)(0xe0 | (cp >> 12));
        buf[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        buf[(*o)++] = (char)(0x80 | (cp & 0x3f));
    } else {
        buf[(*o)++] = (char)(0xf0 | (cp >> 18));
        buf[(*o)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
        buf[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        buf[(*o)++] = (char)(0x80 | (cp & 0x3f));
    }
}

static int
hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/*
 * Lexes a string literal starting at i (the quote); decodes Python's escapes
 * (unicode-escape, as jinja2 does). Returns the index after the closing
 * quote, or 0 on error.
 */
static size_t
lex_string(jj_parser *P, size_t i, jj_tok *k)
{
    const char *s = P->s;
    char q = s[i];
    size_t j = i + 1;
    while (j < P->len && s[j] != q) {
        if (s[j] == '\\' && j + 1 < P->len)
            j++;
        j++;
    }
    if (j >= P->len) {
        perr(P, WK_EINVAL, k->line, k->col, "unterminated string literal");
        return 0;
    }
    char *buf = jj_alloc(&P->t->arena, (j - i) * 4 + 1);
    if (buf == NULL) {
        perr(P, WK_ENOMEM, k->line, k->col, "out of memory");
        return 0;
    }
    size_t o = 0;
    for (size_t x = i + 1; x < j; x++) {
        char c = s[x];
        if (c != '\\') {
            buf[o++] = c;
            continue;
        }
        char e = s[++x];
        switch (e) {
        case 'n':
            buf[o++] = '\n';
            break;
        case 't':
            buf[o++] = '\t';
            break;
        case 'r':
            buf[o++] = '\r';
            break;
        case '\\':
            buf[o++] = '\\';
            break;
        case '\'':
            buf[o++] = '\'';
            break;
        case '"':
            buf[o++] = '"';
            break;
        case 'a':
            buf[o++] = '\a';
            break;
        case 'b':
            buf[o++] = '\b';
            break;
        case 'f':
            buf[o++] = '\f';
            break;
        case 'v':
            buf[o++] = '\v';
            break;
        case '\n':
            break; /* line continuation */
        case 'x':
        case 'u':
        case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int m = 0; m < nd; m++) {
                int h = x + 1 + (size_t)m < j ? hexval(s[x + 1 + m]) : -1;
                if (h < 0) {
                    perr(P, WK_EINVAL, k->line, k->col, "truncated \\%c escape in string", e);
                    return 0;
                }
                cp = cp * 16 + (uint32_t)h;
            }
            x += (size_t)nd;
            if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
                perr(P, WK_ENOTSUP, k->line, k->col, "escape of a surrogate or beyond U+10FFFF");
                return 0;
            }
            jj_utf8_put(buf, &o, cp);
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = 0;
                int m = 0;
                while (m < 3 && x < j && s[x] >= '0' && s[x] <= '7') {
                    cp = cp * 8 + (uint32_t)(s[x] - '0');
                    x++;
                    m++;
                }
                x--;
                jj_utf8_put(buf, &o, cp);
            } else if (e == 'N') {
                perr(P, WK_ENOTSUP, k->line, k->col, "\\N{...} escape in string");
                return 0;
            } else {
                buf[o++] = '\\';
                buf[o++] = e;
            }
        }
    }
    k->type = T_STR;
    k->p = buf;
    k->n = o;
    return j + 1;
}

/* Lexes the inside of a tag from i until its end; returns the index after it, 0 on error. */
static size_t
lex_tag(jj_parser *P, size_t i, int kind, bool *lstrip_next, bool *line_starting)
{
    const char *s = P->s;
    size_t n = P->len;
    int balance = 0;
    for (;;) {
        i = skip_ws(s, n, i);
        if (i >= n) {
            jj_tok *k = tok_push(P, T_EOF, i);
            if (k != NULL)
                perr(P, WK_EINVAL, k->line, k->col, "unexpected end of template inside a tag");
            return 0;
        }
        if (balance == 0) {
            /* end of the tag */
            size_t e = 0;
            bool minus = false, plus = false;
            if (kind == T_VBEGIN) {
                if (s[i] == '-' && i + 2 < n && s[i + 1] == '}' && s[i + 2] == '}') {
                    e = i + 3;
                    minus = true;
                } else if (s[i] == '}' && i + 1 < n && s[i + 1] == '}') {
                    e = i + 2;
                }
            } else {
                if ((s[i] == '-' || s[i] == '+') && i + 2 < n && s[i + 1] == '%' &&
                    s[i + 2] == '}') {
                    e = i + 3;
                    minus = s[i] == '-';
                    plus = s[i] == '+';
                } else if (s[i] == '%' && i + 1 < n && s[i + 1] == '}') {
                    e = i + 2;
                }
            }
            if (e != 0) {
                if (tok_push(P, kind == T_VBEGIN ? T_VEND : T_BEND, i) == NULL)
                    return 0;
                *line_starting = false;
                if (minus) {
                    size_t w = skip_ws(s, n, e);
                    *line_starting = w > e && s[w - 1] == '\n';
                    e = w;
                } else if (kind == T_BBEGIN && !plus && e < n && s[e] == '\n') {
                    e++; /* trim_blocks */
                    *line_starting = true;
                }
                *lstrip_next = false;
                return e;
            }
        }
        char c = s[i];
        jj_tok *k = tok_push(P, T_OP, i);
        if (k == NULL)
            return 0;
        if (is_name_start(c)) {
            size_t j = i;
            while (j < n && (is_name_start(s[j]) || is_digit(s[j])))
                j++;
            k->type = T_NAME;
            k->p = s + i;
            k->n = j - i;
            i = j;
        } else if (is_digit(c)) {
            size_t j = i;
            bool flt = false;
            while (j < n && (is_digit(s[j]) || s[j] == '_'))
                j++;
            if (j + 1 < n && s[j] == '.' && is_digit(s[j + 1])) {
                flt = true;
                j++;
                while (j < n && (is_digit(s[j]) || s[j] == '_'))
                    j++;
            }
            if (j < n && (s[j] == 'e' || s[j] == 'E')) {
                size_t x = j + 1;
                if (x < n && (s[x] == '+' || s[x] == '-'))
                    x++;
                if (x < n && is_digit(s[x])) {
                    flt = true;
                    j = x;
                    while (j < n && is_digit(s[j]))
                        j++;
                }
            }
            char num[64];
            size_t m = 0;
            for (size_t x = i; x < j && m < sizeof num - 1; x++)
                if (s[x] != '_')
                    num[m++] = s[x];
            num[m] = '\0';
            errno = 0;
            if (flt) {
                k->type = T_FLOAT;
                k->f = strtod(num, NULL);
            } else {
                k->type = T_INT;
                k->i = strtoll(num, NULL, 10);
                if (errno == ERANGE || j - i > 18) {
                    perr(P, WK_ENOTSUP, k->line, k->col, "integer literal beyond 64 bits");
                    return 0;
                }
            }
            i = j;
        } else if (c == '\'' || c == '"') {
            i = lex_string(P, i, k);
            if (i == 0)
                return 0;
        } else {
            char c2 = i + 1 < n ? s[i + 1] : '\0';
            k->op = c;
            size_t w = 1;
            if (c == '/' && c2 == '/') {
                k->op = OP_FLOORDIV;
                w = 2;
            } else if (c == '*' && c2 == '*') {
                k->op = OP_POW;
                w = 2;
            } else if (c == '=' && c2 == '=') {
                k->op = OP_EQ;
                w = 2;
            } else if (c == '!' && c2 == '=') {
                k->op = OP_NE;
                w = 2;
            } else if (c == '<' && c2 == '=') {
                k->op = OP_LE;
                w = 2;
            } else if (c == '>' && c2 == '=') {
                k->op = OP_GE;
                w = 2;
            } else if (strchr("+-*/%~<>=()[]{},.:|", c) == NULL || c == '\0') {
                perr(P, WK_EINVAL, k->line, k->col, "unexpected character '%c'", c);
                return 0;
            }
            if (c == '(' || c == '[' || c == '{')
                balance++;
            else if ((c == ')' || c == ']' || c == '}') && balance > 0)
                balance--;
            i += w;
        }
    }
}

/* Splits the source into tokens. Returns 0 or -1 (P->err set). */
static int
lex(jj_parser *P)
{
    const char *s = P->s;
    size_t n = P->len, i = 0;
    bool lstrip_next = false, line_starting = true;
    while (i < n) {
        /* the next tag */
        size_t j = i;
        int kind = 0;
        while (j + 1 < n) {
            if (s[j] == '{' && (s[j + 1] == '{' || s[j + 1] == '%' || s[j + 1] == '#')) {
                kind = s[j + 1] == '{' ? T_VBEGIN : s[j + 1] == '%' ? T_BBEGIN : T_DATA;
                break;
            }
            j++;
        }
        if (kind == 0)
            j = n;
        size_t ta = i, tb = j; /* text before the tag */
        (void)lstrip_next;
        char sign = kind != 0 && j + 2 < n ? s[j + 2] : '\0';
        if (kind != 0 && sign == '-') {
            while (tb > ta) {
                size_t k = jj_space_len_back(s + ta, tb - ta);
                if (k == 0)
                    break;
                tb -= k;
            }
        } else if (kind != 0 && sign != '+' && kind != T_VBEGIN) {
            size_t lp = tb;
            while (lp > ta && s[lp - 1] != '\n')
                lp--;
            if (lp > ta || line_starting) {
                size_t x = lp;
                while (x < tb && ws_at(s + x, tb - x) > 0)
                    x += ws_at(s + x, tb - x);
                if (x == tb && tb > lp)
                    tb = lp;
            }
        }
        if (tb > ta) {
            jj_tok *k = tok_push(P, T_DATA, ta);
            if (k == NULL)
                return -1;
            k->p = s + ta;
            k->n = tb - ta;
        }
        if (kind == 0)
            break;
        size_t body = j + 2 + (sign == '-' || sign == '+');
        if (kind == T_DATA) { /* comment */
            size_t e = body;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}'))
                e++;
            if (e + 1 >= n) {
                jj_tok *k = tok_push(P, T_EOF, j);
                if (k != NULL)
                    perr(P, WK_EINVAL, k->line, k->col, "unterminated comment");
                return -1;
            }
            bool minus = e > body && s[e - 1] == '-';
            bool plus = e > body && s[e - 1] == '+';
            i = e + 2;
            line_starting = false;
            if (minus) {
                size_t w = skip_ws(s, n, i);
                line_starting = w > i && s[w - 1] == '\n';
                i = w;
            } else if (!plus && i < n && s[i] == '\n') {
                i++;
                line_starting = true;
            }
            continue;
        }
        if (kind == T_BBEGIN) {
            size_t x = skip_ws(s, n, body);
            if (n - x >= 3 && memcmp(s + x, "raw", 3) == 0 &&
                (x + 3 >= n || !(is_name_start(s[x + 3]) || is_digit(s[x + 3])))) {
                jj_tok *k = tok_push(P, T_EOF, j);
                if (k != NULL)
                    perr(P, WK_ENOTSUP, k->line, k->col, "unsupported tag 'raw'");
                return -1;
            }
        }
        if (tok_push(P, kind, j) == NULL)
            return -1;
        i = lex_tag(P, body, kind, &lstrip_next, &line_starting);
        if (i == 0)
            return -1;
    }
    return tok_push(P, T_EOF, n) == NULL ? -1 : 0;
}

/* ---- parser ---- */

static jj_tok *
cur(jj_parser *P)
{
    return &P->toks[P->pos];
}

static jj_tok *
next(jj_parser *P)
{
    jj_tok *k = &P->toks[P->pos];
    if (k->type != T_EOF)
        P->pos++;
    return k;
}

static bool
is_op(jj_parser *P, int op)
{
    return cur(P)->type == T_OP && cur(P)->op == op;
}

static bool
tok_is_name(const jj_tok *k, const char *name)
{
    return k->type == T_NAME && strlen(name) == k->n && memcmp(k->p, name, k->n) == 0;
}

static bool
is_name(jj_parser *P, const char *name)
{
    return tok_is_name(cur(P), name);
}

static const char *
tok_desc(const jj_tok *k, char *buf, size_t cap)
{
    switch (k->type) {
    case T_EOF:
        return "end of template";
    case T_DATA:
        return "template text";
    case T_VBEGIN:
        return "'{{'";
    case T_VEND:
        return "'}}'";
    case T_BBEGIN:
        return "'{%'";
    case T_BEND:
        return "'%}'";
    case T_NAME:
        snprintf(buf, cap, "'%.*s'", (int)(k->n > 40 ? 40 : k->n), k->p);
        return buf;
    case T_STR:
        return "a string";
    case T_INT:
    case T_FLOAT:
        return "a number";
    default:
        switch (k->op) {
        case OP_FLOORDIV:
            return "'//'";
        case OP_POW:
            return "'**'";
        case OP_EQ:
            return "'=='";
        case OP_NE:
            return "'!='";
        case OP_LE:
            return "'<='";
        case OP_GE:
            return "'>='";
        default:
            snprintf(buf, cap, "'%c'", k->op);
            return buf;
        }
    }
}

static int
unexpected(jj_parser *P, const char *expected)
{
    char b[64];
    jj_tok *k = cur(P);
    return perr(P, WK_EINVAL, k->line, k->col, "expected %s, found %s", expected,
                tok_desc(k, b, sizeof b));
}

static int
expect_op(jj_parser *P, int op, const char *what)
{
    if (!is_op(P, op))
        return unexpected(P, what);
    next(P);
    return 0;
}

static jnode *
node(jj_parser *P, int kind, const jj_tok *at)
{
    jnode *x = jj_alloc(&P->t->arena, sizeof *x);
    if (x == NULL) {
        perr(P, WK_ENOMEM, at->line, at->col, "out of memory");
        return NULL;
    }
    x->kind = (uint8_t)kind;
    x->line = at->line;
    x->fid = -1;
    return x;
}

static const char *
tok_name(jj_parser *P, const jj_tok *k)
{
    const char *s = jj_strdup(&P->t->arena, k->p, k->n);
    if (s == NULL)
        perr(P, WK_ENOMEM, k->line, k->col, "out of memory");
    return s;
}

/* A growable list of nodes and names built in the arena. */
typedef struct nvec {
    jnode **v;
    const char **names;
    uint8_t *ops;
    size_t n, cap;
} nvec;

static int
nvec_push(jj_parser *P, nvec *a, jnode *x, const char *name, int op)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 4;
        jnode **v = jj_alloc(&P->t->arena, cap * sizeof *v);
        const char **nm = jj_alloc(&P->t->arena, cap * sizeof *nm);
        uint8_t *ops = jj_alloc(&P->t->arena, cap);
        if (v == NULL || nm == NULL || ops == NULL)
            return perr(P, WK_ENOMEM, 0, 0, "out of memory");
        if (a->n > 0) {
            memcpy(v, a->v, a->n * sizeof *v);
            memcpy(nm, a->names, a->n * sizeof *nm);
            memcpy(ops, a->ops, a->n);
        }
        a->v = v;
        a->names = nm;
        a->ops = ops;
        a->cap = cap;
    }
    a->v[a->n] = x;
    a->names[a->n] = name;
    a->ops[a->n] = (uint8_t)op;
    a->n++;
    return 0;
}

static void
nvec_to(jnode *x, const nvec *a)
{
    x->kids = a->v;
    x->names = a->names;
    x->ops = a->ops;
    x->n = a->n;
}

static jnode *parse_expr(jj_parser *P);
static jnode *parse_or(jj_parser *P);
static jnode *parse_unary(jj_parser *P, bool with_filter);
static jnode *parse_primary(jj_parser *P);
static jnode *parse_postfix(jj_parser *P, jnode *x);
static jnode *parse_body(jj_parser *P, const char *const *ends, int *which);

static int
enter(jj_parser *P)
{
    if (++P->depth > WK_JINJA_NEST_MAX) {
        jj_tok *k = cur(P);
        return perr(P, WK_ETOOBIG, k->line, k->col, "nesting deeper than %d", WK_JINJA_NEST_MAX);
    }
    return 0;
}

/* Parses "a, b, c" into a tuple, or one expression when there is no comma. */
static jnode *
parse_tuple(jj_parser *P, bool condexpr, bool explicit_parens)
{
    jj_tok *at = cur(P);
    nvec items = {0};
    bool comma = false;
    for (;;) {
        if (items.n > 0) {
            if (!is_op(P, ','))
                break;
            next(P);
            comma = true;
        }
        /* end of a tuple */
        jj_tok *k = cur(P);
        if (k->type == T_VEND || k->type == T_BEND || k->type == T_EOF ||
            (k->type == T_OP && k->op == ')') || (items.n > 0 && tok_is_name(k, "if")) ||
            (items.n > 0 && tok_is_name(k, "recursive")))
            break;
        if (items.n == 0 && explicit_parens && k->type == T_OP && k->op == ')')
            break;
        jnode *x = condexpr ? parse_expr(P) : parse_or(P);
        if (x == NULL || nvec_push(P, &items, x, NULL, 0) < 0)
            return NULL;
    }
    if (items.n == 1 && !comma)
        return items.v[0];
    if (items.n == 0 && !explicit_parens) {
        unexpected(P, "an expression");
        return NULL;
    }
    jnode *x = node(P, JN_TUPLE, at);
    if (x != NULL)
        nvec_to(x, &items);
    return x;
}

static jnode *
parse_expr(jj_parser *P)
{
    if (enter(P) < 0)
        return NULL;
    size_t start = P->pos;
    jnode *x = parse_or(P);
    bool saved_soft = P->soft;
    if (x != NULL && is_name(P, "if")) {
        /* jinja2 compiles a whole conditional expression in a soft frame */
        if (P->unknown != NULL && P->unknown_pos >= start)
            P->unknown = NULL;
        P->soft = true;
    }
    while (x != NULL && is_name(P, "if")) {
        jnode *c = node(P, JN_COND, next(P));
        if (c == NULL)
            return NULL;
        c->b = x;
        c->a = parse_or(P);
        if (c->a == NULL)
            return NULL;
        if (is_name(P, "else")) {
            next(P);
            c->c = parse_expr(P);
            if (c->c == NULL)
                return NULL;
        }
        x = c;
    }
    P->soft = saved_soft;
    P->depth--;
    return x;
}

static jnode *parse_not(jj_parser *P);

static jnode *
parse_and(jj_parser *P)
{
    jnode *x = parse_not(P);
    while (x != NULL && is_name(P, "and")) {
        jnode *y = node(P, JN_AND, next(P));
        if (y == NULL)
            return NULL;
        y->a = x;
        y->b = parse_not(P);
        if (y->b == NULL)
            return NULL;
        x = y;
    }
    return x;
}

static jnode *
parse_or(jj_parser *P)
{
    jnode *x = parse_and(P);
    while (x != NULL && is_name(P, "or")) {
        jnode *y = node(P, JN_OR, next(P));
        if (y == NULL)
            return NULL;
        y->a = x;
        y->b = parse_and(P);
        if (y->b == NULL)
            return NULL;
        x = y;
    }
    return x;
}

static jnode *parse_compare(jj_parser *P);

static jnode *
parse_not(jj_parser *P)
{
    if (is_name(P, "not")) {
        jnode *x = node(P, JN_NOT, next(P));
        if (x == NULL || enter(P) < 0)
            return NULL;
        x->a = parse_not(P);
        P->depth--;
        return x->a == NULL ? NULL : x;
    }
    return parse_compare(P);
}

static jnode *parse_math1(jj_parser *P);

static jnode *
parse_compare(jj_parser *P)
{
    jj_tok *at = cur(P);
    jnode *x = parse_math1(P);
    if (x == NULL)
        return NULL;
    nvec ops = {0};
    for (;;) {
        jj_tok *k = cur(P);
        int op = -1;
        if (k->type == T_OP) {
            switch (k->op) {
            case OP_EQ:
                op = JJ_OP_EQ;
                break;
            case OP_NE:
                op = JJ_OP_NE;
                break;
            case '<':
                op = JJ_OP_LT;
                break;
            case '>':
                op = JJ_OP_GT;
                break;
            case OP_LE:
                op = JJ_OP_LE;
                break;
            case OP_GE:
                op = JJ_OP_GE;
                break;
            default:
                break;
            }
            if (op >= 0)
                next(P);
        } else if (tok_is_name(k, "in")) {
            op = JJ_OP_IN;
            next(P);
        } else if (tok_is_name(k, "not") && tok_is_name(&P->toks[P->pos + 1], "in")) {
            op = JJ_OP_NOTIN;
            next(P);
            next(P);
        }
        if (op < 0)
            break;
        jnode *y = parse_math1(P);
        if (y == NULL || nvec_push(P, &ops, y, NULL, op) < 0)
            return NULL;
    }
    if (ops.n == 0)
        return x;
    jnode *c = node(P, JN_COMPARE, at);
    if (c == NULL)
        return NULL;
    c->a = x;
    nvec_to(c, &ops);
    return c;
}

static jnode *
binop(jj_parser *P, int kind, int op, jnode *a, jnode *b, const jj_tok *at)
{
    if (a == NULL || b == NULL)
        return NULL;
    jnode *x = node(P, kind, at);
    if (x == NULL)
        return NULL;
    x->op = (uint8_t)op;
    x->a = a;
    x->b = b;
    return x;
}

static jnode *parse_concat(jj_parser *P);
static jnode *parse_math2(jj_parser *P);
static jnode *parse_pow(jj_parser *P);

static jnode *
parse_math1(jj_parser *P)
{
    jnode *x = parse_concat(P);
    while (x != NULL && (is_op(P, '+') || is_op(P, '-'))) {
        jj_tok *k = next(P);
        x = binop(P, JN_BINOP, k->op == '+' ? JJ_OP_ADD : JJ_OP_SUB, x, parse_concat(P), k);
    }
    return x;
}

static jnode *
parse_concat(jj_parser *P)
{
    jnode *x = parse_math2(P);
    while (x != NULL && is_op(P, '~')) {
        jj_tok *k = next(P);
        x = binop(P, JN_CONCAT, 0, x, parse_math2(P), k);
    }
    return x;
}

static jnode *
parse_math2(jj_parser *P)
{
    jnode *x = parse_pow(P);
    for (;;) {
        if (x == NULL)
            return NULL;
        int op;
        if (is_op(P, '*'))
            op = JJ_OP_MUL;
        else if (is_op(P, '/'))
            op = JJ_OP_DIV;
        else if (is_op(P, OP_FLOORDIV))
            op = JJ_OP_FLOORDIV;
        else if (is_op(P, '%'))
            op = JJ_OP_MOD;
        else
            return x;
        jj_tok *k = next(P);
        x = binop(P, JN_BINOP, op, x, parse_pow(P), k);
    }
}

static jnode *
parse_pow(jj_parser *P)
{
    jnode *x = parse_unary(P, true);
    while (x != NULL && is_op(P, OP_POW)) {
        jj_tok *k = next(P);
        x = binop(P, JN_BINOP, JJ_OP_POW, x, parse_unary(P, true), k);
    }
    return x;
}

/* Parses "(args)" after a call, filter or test into x's kids/names. */
static int
parse_args(jj_parser *P, jnode *x)
{
    nvec args = {0};
    bool kw = false;
    if (expect_op(P, '(', "'('") < 0)
        return -1;
    while (!is_op(P, ')')) {
        if (args.n > 0 && expect_op(P, ',', "',' or ')'") < 0)
            return -1;
        if (is_op(P, ')'))
            break;
        if (is_op(P, '*') || is_op(P, OP_POW)) {
            jj_tok *k = cur(P);
            return perr(P, WK_ENOTSUP, k->line, k->col, "unsupported *args/**kwargs in a call");
        }
        const char *name = NULL;
        if (cur(P)->type == T_NAME && P->toks[P->pos + 1].type == T_OP &&
            P->toks[P->pos + 1].op == '=') {
            name = tok_name(P, next(P));
            next(P);
            if (name == NULL)
                return -1;
            kw = true;
        } else if (kw) {
            jj_tok *k = cur(P);
            return perr(P, WK_EINVAL, k->line, k->col,
                        "positional argument after keyword argument");
        }
        jnode *v = parse_expr(P);
        if (v == NULL || nvec_push(P, &args, v, name, 0) < 0)
            return -1;
    }
    next(P);
    nvec_to(x, &args);
    return 0;
}

static jnode *
parse_filter(jj_parser *P, jnode *input)
{
    jj_tok *k = next(P); /* the name */
    if (k->type != T_NAME) {
        P->pos--;
        unexpected(P, "a filter name");
        return NULL;
    }
    jnode *f = node(P, JN_FILTER, k);
    if (f == NULL || (f->name = tok_name(P, k)) == NULL)
        return NULL;
    if (is_op(P, '.')) {
        perr(P, WK_ENOTSUP, k->line, k->col, "unsupported dotted filter name");
        return NULL;
    }
    f->fid = jj_filter_id(f->name);
    if (!P->soft && P->unknown == NULL && !jj_jinja2_knows(f->name, true)) {
        P->unknown = k;
        P->unknown_pos = (size_t)(k - P->toks);
    }
    f->a = input;
    if (is_op(P, '(') && parse_args(P, f) < 0)
        return NULL;
    return f;
}

static jnode *
parse_test(jj_parser *P, jnode *input)
{
    jj_tok *at = next(P); /* "is" */
    jnode *t = node(P, JN_TEST, at);
    if (t == NULL)
        return NULL;
    if (is_name(P, "not")) {
        next(P);
        t->op = 1;
    }
    jj_tok *k = next(P);
    if (k->type != T_NAME) {
        P->pos--;
        unexpected(P, "a test name");
        return NULL;
    }
    if ((t->name = tok_name(P, k)) == NULL)
        return NULL;
    t->fid = jj_test_id(t->name);
    if (!P->soft && P->unknown == NULL && !jj_jinja2_knows(t->name, false)) {
        P->unknown = k;
        P->unknown_pos = (size_t)(k - P->toks);
    }
    t->a = input;
    jj_tok *c = cur(P);
    if (is_op(P, '(')) {
        if (parse_args(P, t) < 0)
            return NULL;
    } else if ((c->type == T_NAME || c->type == T_STR || c->type == T_INT || c->type == T_FLOAT ||
                (c->type == T_OP && (c->op == '[' || c->op == '{'))) &&
               !tok_is_name(c, "else") && !tok_is_name(c, "or") && !tok_is_name(c, "and")) {
        if (tok_is_name(c, "is")) {
            perr(P, WK_EINVAL, c->line, c->col, "tests cannot be chained with 'is'");
            return NULL;
        }
        jnode *arg = parse_primary(P);
        if (arg != NULL)
            arg = parse_postfix(P, arg);
        if (arg == NULL)
            return NULL;
        nvec args = {0};
        if (nvec_push(P, &args, arg, NULL, 0) < 0)
            return NULL;
        nvec_to(t, &args);
    }
    return t;
}

static jnode *
parse_unary(jj_parser *P, bool with_filter)
{
    jnode *x;
    if (enter(P) < 0)
        return NULL;
    if (is_op(P, '-') || is_op(P, '+')) {
        jj_tok *k = next(P);
        x = node(P, k->op == '-' ? JN_NEG : JN_POS, k);
        if (x == NULL || (x->a = parse_unary(P, false)) == NULL)
            return NULL;
    } else {
        x = parse_primary(P);
    }
    if (x != NULL)
        x = parse_postfix(P, x);
    while (with_filter && x != NULL) {
        if (is_op(P, '|')) {
            next(P);
            x = parse_filter(P, x);
        } else if (is_name(P, "is")) {
            x = parse_test(P, x);
        } else if (is_op(P, '(')) {
            jnode *c = node(P, JN_CALL, cur(P));
            if (c == NULL || parse_args(P, c) < 0)
                return NULL;
            c->a = x;
            x = c;
        } else {
            break;
        }
    }
    P->depth--;
    return x;
}

static jnode *
lit(jj_parser *P, const jj_tok *k, jv v)
{
    jnode *x = node(P, JN_LIT, k);
    if (x != NULL)
        x->lit = v;
    return x;
}

static jnode *
parse_primary(jj_parser *P)
{
    jj_tok *k = cur(P);
    jv v = {0};
    switch (k->type) {
    case T_NAME:
        next(P);
        if (tok_is_name(k, "true") || tok_is_name(k, "True") || tok_is_name(k, "false") ||
            tok_is_name(k, "False")) {
            v.t = JV_BOOL;
            v.u.b = k->p[0] == 't' || k->p[0] == 'T';
            return lit(P, k, v);
        }
        if (tok_is_name(k, "none") || tok_is_name(k, "None")) {
            v.t = JV_NONE;
            return lit(P, k, v);
        }
        {
            jnode *x = node(P, JN_NAME, k);
            if (x == NULL || (x->name = tok_name(P, k)) == NULL)
                return NULL;
            return x;
        }
    case T_STR: {
        next(P);
        v.t = JV_STR;
        v.u.s.p = k->p;
        v.u.s.n = k->n;
        if (cur(P)->type == T_STR) { /* adjacent literals concatenate */
            size_t total = k->n;
            size_t first = P->pos;
            while (cur(P)->type == T_STR)
                total += next(P)->n;
            char *buf = jj_alloc(&P->t->arena, total + 1);
            if (buf == NULL) {
                perr(P, WK_ENOMEM, k->line, k->col, "out of memory");
                return NULL;
            }
            memcpy(buf, k->p, k->n);
            size_t o = k->n;
            for (size_t i = first; i < P->pos; i++) {
                memcpy(buf + o, P->toks[i].p, P->toks[i].n);
                o += P->toks[i].n;
            }
            v.u.s.p = buf;
            v.u.s.n = o;
        }
        return lit(P, k, v);
    }
    case T_INT:
        next(P);
        v.t = JV_INT;
        v.u.i = k->i;
        return lit(P, k, v);
    case T_FLOAT:
        next(P);
        v.t = JV_FLOAT;
        v.u.f = k->f;
        return lit(P, k, v);
    case T_OP:
        if (k->op == '(') {
            next(P);
            if (enter(P) < 0)
                return NULL;
            jnode *x = parse_tuple(P, true, true);
            P->depth--;
            if (x == NULL || expect_op(P, ')', "')'") < 0)
                return NULL;
            return x;
        }
        if (k->op == '[' || k->op == '{') {
            bool dict = k->op == '{';
            int close = dict ? '}' : ']';
            next(P);
            if (enter(P) < 0)
                return NULL;
            nvec items = {0};
            while (!is_op(P, close)) {
                if (items.n > 0 && expect_op(P, ',', dict ? "',' or '}'" : "',' or ']'") < 0)
                    return NULL;
                if (is_op(P, close))
                    break;
                jnode *e = parse_expr(P);
                if (e == NULL || nvec_push(P, &items, e, NULL, 0) < 0)
                    return NULL;
                if (dict) {
                    if (expect_op(P, ':', "':'") < 0)
                        return NULL;
                    e = parse_expr(P);
                    if (e == NULL || nvec_push(P, &items, e, NULL, 0) < 0)
                        return NULL;
                }
            }
            next(P);
            P->depth--;
            jnode *x = node(P, dict ? JN_DICT : JN_LIST, k);
            if (x != NULL)
                nvec_to(x, &items);
            return x;
        }
        break;
    default:
        break;
    }
    unexpected(P, "an expression");
    return NULL;
}

static jnode *
parse_subscript(jj_parser *P, jnode *obj, const jj_tok *at)
{
    jnode *parts[3] = {NULL, NULL, NULL};
    int np = 0;
    bool slice = false;
    for (;;) {
        if (is_op(P, ':')) {
            slice = true;
            next(P);
            if (++np > 2) {
                unexpected(P, "']'");
                return NULL;
            }
            continue;
        }
        if (is_op(P, ']'))
            break;
        if (parts[np] != NULL) {
            unexpected(P, "']'");
            return NULL;
        }
        parts[np] = parse_expr(P);
        if (parts[np] == NULL)
            return NULL;
        if (is_op(P, ',')) {
            jj_tok *k = cur(P);
            perr(P, WK_ENOTSUP, k->line, k->col, "unsupported tuple subscript");
            return NULL;
        }
    }
    next(P);
    jnode *x = node(P, slice ? JN_SLICE : JN_GETITEM, at);
    if (x == NULL)
        return NULL;
    x->a = obj;
    if (slice) {
        x->b = parts[0];
        x->c = parts[1];
        x->d = parts[2];
    } else {
        if (parts[0] == NULL) {
            unexpected(P, "a subscript");
            return NULL;
        }
        x->b = parts[0];
    }
    return x;
}

static jnode *
parse_postfix(jj_parser *P, jnode *x)
{
    while (x != NULL) {
        jj_tok *k = cur(P);
        if (is_op(P, '.')) {
            next(P);
            jj_tok *a = next(P);
            if (a->type == T_NAME) {
                jnode *g = node(P, JN_GETATTR, a);
                if (g == NULL || (g->name = tok_name(P, a)) == NULL)
                    return NULL;
                g->a = x;
                x = g;
            } else if (a->type == T_INT) {
                jnode *g = node(P, JN_GETITEM, a);
                jv v = {.t = JV_INT, .u.i = a->i};
                if (g == NULL || (g->b = lit(P, a, v)) == NULL)
                    return NULL;
                g->a = x;
                x = g;
            } else {
                P->pos--;
                unexpected(P, "an attribute name");
                return NULL;
            }
        } else if (is_op(P, '[')) {
            next(P);
            x = parse_subscript(P, x, k);
        } else if (is_op(P, '(')) {
            jnode *c = node(P, JN_CALL, k);
            if (c == NULL || parse_args(P, c) < 0)
                return NULL;
            c->a = x;
            x = c;
        } else {
            break;
        }
    }
    return x;
}

/* ---- statements ---- */

static int
expect_bend(jj_parser *P)
{
    if (cur(P)->type != T_BEND)
        return unexpected(P, "'%}'");
    next(P);
    return 0;
}

/* Assignment target: name, ns.attr (when attr_ok), or names separated by commas. */
static int
parse_target(jj_parser *P, jnode *x, bool attr_ok)
{
    nvec names = {0};
    bool paren = false;
    if (is_op(P, '(')) {
        paren = true;
        next(P);
    }
    for (;;) {
        jj_tok *k = next(P);
        if (k->type != T_NAME) {
            P->pos--;
            return unexpected(P, "a name to assign to");
        }
        const char *nm = tok_name(P, k);
        if (nm == NULL)
            return -1;
        if (is_op(P, '.')) {
            if (!attr_ok || names.n > 0) {
                return perr(P, WK_ENOTSUP, k->line, k->col, "unsupported assignment target");
            }
            next(P);
            jj_tok *a = next(P);
            if (a->type != T_NAME) {
                P->pos--;
                return unexpected(P, "an attribute name");
            }
            x->name = nm;
            if ((x->attr = tok_name(P, a)) == NULL)
                return -1;
            return 0;
        }
        if (nvec_push(P, &names, NULL, nm, 0) < 0)
            return -1;
        if (!is_op(P, ','))
            break;
        next(P);
        if (is_op(P, ')') || !(cur(P)->type == T_NAME))
            break;
    }
    if (paren && expect_op(P, ')', "')'") < 0)
        return -1;
    if (names.n == 1 && !paren) {
        x->name = names.names[0];
    } else {
        x->names = names.names;
        x->nnames = names.n;
    }
    return 0;
}

static jnode *parse_stmt(jj_parser *P);

/* A set or filter block's body: an inner frame (not soft), still inside the loop's Python code. */
static jnode *
parse_inner_body(jj_parser *P, const char *const *ends, int *which)
{
    bool saved_soft = P->soft;
    P->soft = false;
    jnode *b = parse_body(P, ends, which);
    P->soft = saved_soft;
    return b;
}

/*
 * A body jinja2 compiles into a Python function of its own (a macro, a call
 * block's caller): no break/continue of an outer loop there.
 */
static jnode *
parse_frame_body(jj_parser *P, const char *const *ends, int *which)
{
    bool saved = P->in_loop, saved_soft = P->soft;
    P->in_loop = false;
    P->soft = false;
    jnode *b = parse_body(P, ends, which);
    P->in_loop = saved;
    P->soft = saved_soft;
    return b;
}

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_FOR[] = {"else", "endfor", NULL};
static const char *const END_ENDFOR[] = {"endfor", NULL};
static const char *const END_ENDIF[] = {"endif", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};
static const char *const END_GEN[] = {"endgeneration", NULL};
static const char *const END_CALL[] = {"endcall", NULL};

/* Parses "name(args) | name ..." of a filter block; the first filter's input is NULL. */
static jnode *
parse_filter_chain(jj_parser *P)
{
    jnode *f = parse_filter(P, NULL);
    while (f != NULL && is_op(P, '|')) {
        next(P);
        f = parse_filter(P, f);
    }
    return f;
}

static jnode *parse_if_soft(jj_parser *P, const jj_tok *at);

/* An if, test and branches, is a soft frame in jinja2: unknown filters fail only when run. */
static jnode *
parse_if(jj_parser *P, const jj_tok *at)
{
    bool saved = P->soft;
    P->soft = true;
    jnode *x = parse_if_soft(P, at);
    P->soft = saved;
    return x;
}

static jnode *
parse_if_soft(jj_parser *P, const jj_tok *at)
{
    jnode *x = node(P, JN_IF, at);
    int which;
    if (x == NULL || (x->a = parse_tuple(P, false, false)) == NULL || expect_bend(P) < 0)
        return NULL;
    if ((x->b = parse_body(P, END_IF, &which)) == NULL)
        return NULL;
    if (which == 0) { /* elif */
        jj_tok *k = cur(P);
        jnode *body = node(P, JN_BODY, k);
        if (body == NULL || enter(P) < 0)
            return NULL;
        jnode *e = parse_if(P, k);
        P->depth--;
        if (e == NULL)
            return NULL;
        e->op = 1; /* an elif: jinja2 keeps it in the first if's elif list */
        nvec v = {0};
        if (nvec_push(P, &v, e, NULL, 0) < 0)
            return NULL;
        nvec_to(body, &v);
        x->c = body;
        return x; /* the nested if consumed endif */
    }
    if (which == 1) {
        if (expect_bend(P) < 0 || (x->c = parse_body(P, END_ENDIF, &which)) == NULL)
            return NULL;
    }
    return expect_bend(P) < 0 ? NULL : x;
}

static jnode *
parse_stmt(jj_parser *P)
{
    jj_tok *k = next(P); /* the tag name */
    int which;
    if (k->type != T_NAME) {
        P->pos--;
        unexpected(P, "a tag name");
        return NULL;
    }
    if (tok_is_name(k, "if"))
        return parse_if(P, k);
    if (tok_is_name(k, "for")) {
        jnode *x = node(P, JN_FOR, k);
        if (x == NULL || parse_target(P, x, false) < 0)
            return NULL;
        if (x->names == NULL) {
            x->names = jj_alloc(&P->t->arena, sizeof *x->names);
            if (x->names == NULL) {
                perr(P, WK_ENOMEM, k->line, k->col, "out of memory");
                return NULL;
            }
            x->names[0] = x->name;
            x->nnames = 1;
        }
        if (!is_name(P, "in")) {
            unexpected(P, "'in'");
            return NULL;
        }
        next(P);
        if ((x->a = parse_tuple(P, false, false)) == NULL)
            return NULL;
        if (is_name(P, "if")) {
            next(P);
            if ((x->d = parse_expr(P)) == NULL)
                return NULL;
        }
        if (is_name(P, "recursive")) {
            perr(P, WK_ENOTSUP, cur(P)->line, cur(P)->col, "unsupported recursive for loop");
            return NULL;
        }
        bool saved = P->in_loop, saved_soft = P->soft;
        P->in_loop = true;
        P->soft = false; /* a loop body is an inner frame: not soft */
        x->b = expect_bend(P) < 0 ? NULL : parse_body(P, END_FOR, &which);
        P->in_loop = saved;
        if (x->b == NULL)
            return NULL;
        if (which == 0 &&
            (expect_bend(P) < 0 || (x->c = parse_body(P, END_ENDFOR, &which)) == NULL))
            return NULL;
        P->soft = saved_soft;
        return expect_bend(P) < 0 ? NULL : x;
    }
    if (tok_is_name(k, "set")) {
        jnode *x = node(P, JN_SET, k);
        if (x == NULL || parse_target(P, x, true) < 0)
            return NULL;
        if (is_op(P, '=')) {
            next(P);
            if ((x->a = parse_tuple(P, true, false)) == NULL || expect_bend(P) < 0)
                return NULL;
            return x;
        }
        if (x->name == NULL || x->attr != NULL) {
            perr(P, WK_ENOTSUP, k->line, k->col, "unsupported block set target");
            return NULL;
        }
        x->kind = JN_SETBLOCK;
        if (is_op(P, '|')) {
            next(P);
            if ((x->d = parse_filter_chain(P)) == NULL)
                return NULL;
        }
        if (expect_bend(P) < 0 || (x->b = parse_inner_body(P, END_SET, &which)) == NULL ||
            expect_bend(P) < 0)
            return NULL;
        return x;
    }
    if (tok_is_name(k, "macro")) {
        jnode *x = node(P, JN_MACRO, k);
        jj_tok *nk = next(P);
        if (x == NULL)
            return NULL;
        if (nk->type != T_NAME) {
            P->pos--;
            unexpected(P, "a macro name");
            return NULL;
        }
        if ((x->name = tok_name(P, nk)) == NULL || expect_op(P, '(', "'('") < 0)
            return NULL;
        nvec params = {0};
        while (!is_op(P, ')')) {
            if (params.n > 0 && expect_op(P, ',', "',' or ')'") < 0)
                return NULL;
            jj_tok *pk = next(P);
            if (pk->type != T_NAME) {
                P->pos--;
                unexpected(P, "a parameter name");
                return NULL;
            }
            const char *pn = tok_name(P, pk);
            jnode *def = NULL;
            if (pn == NULL)
                return NULL;
            if (is_op(P, '=')) {
                next(P);
                if ((def = parse_expr(P)) == NULL)
                    return NULL;
            } else if (params.n > 0 && params.v[params.n - 1] != NULL) {
                perr(P, WK_EINVAL, pk->line, pk->col,
                     "non-default argument follows default argument");
                return NULL;
            }
            if (nvec_push(P, &params, def, pn, 0) < 0)
                return NULL;
        }
        next(P);
        nvec_to(x, &params);
        x->nnames = params.n;
        if (expect_bend(P) < 0 || (x->b = parse_frame_body(P, END_MACRO, &which)) == NULL)
            return NULL;
        if (cur(P)->type == T_NAME) /* {% endmacro name %} */
            next(P);
        return expect_bend(P) < 0 ? NULL : x;
    }
    if (tok_is_name(k, "break") || tok_is_name(k, "continue")) {
        if (!P->in_loop) {
            perr(P, WK_EINVAL, k->line, k->col, "'%.*s' outside loop", (int)k->n, k->p);
            return NULL;
        }
        jnode *x = node(P, tok_is_name(k, "break") ? JN_BREAK : JN_CONTINUE, k);
        return x == NULL || expect_bend(P) < 0 ? NULL : x;
    }
    if (tok_is_name(k, "filter")) {
        jnode *x = node(P, JN_FILTERBLOCK, k);
        if (x == NULL || (x->d = parse_filter_chain(P)) == NULL || expect_bend(P) < 0 ||
            (x->b = parse_inner_body(P, END_FILTER, &which)) == NULL || expect_bend(P) < 0)
            return NULL;
        return x;
    }
    if (tok_is_name(k, "generation")) {
        jnode *x;
        if (expect_bend(P) < 0 || (x = parse_body(P, END_GEN, &which)) == NULL ||
            expect_bend(P) < 0)
            return NULL;
        return x;
    }
    if (tok_is_name(k, "call")) {
        jnode *x = node(P, JN_CALLBLOCK, k);
        if (x == NULL)
            return NULL;
        if (is_op(P, '(')) {
            perr(P, WK_ENOTSUP, k->line, k->col, "unsupported call block with caller arguments");
            return NULL;
        }
        x->a = parse_unary(P, false);
        if (x->a == NULL)
            return NULL;
        if (x->a->kind != JN_CALL) {
            perr(P, WK_EINVAL, k->line, k->col, "expected a call after 'call'");
            return NULL;
        }
        if (expect_bend(P) < 0 || (x->b = parse_frame_body(P, END_CALL, &which)) == NULL ||
            expect_bend(P) < 0)
            return NULL;
        return x;
    }
    perr(P, WK_ENOTSUP, k->line, k->col, "unsupported tag '%.*s'", (int)(k->n > 40 ? 40 : k->n),
         k->p);
    return NULL;
}

/*
 * Parses statements until a block tag named in ends (NULL: until the end of
 * the template). *which is the index of the end found; the parser is left on
 * the token after the end tag's name.
 */
static jnode *
parse_body(jj_parser *P, const char *const *ends, int *which)
{
    jj_tok *at = cur(P);
    jnode *body = node(P, JN_BODY, at);
    nvec items = {0};
    if (body == NULL || enter(P) < 0)
        return NULL;
    for (;;) {
        jj_tok *k = cur(P);
        jnode *x = NULL;
        if (k->type == T_EOF) {
            if (ends != NULL) {
                char want[64];
                snprintf(want, sizeof want, "'{%% %s %%}'", ends[0] != NULL ? ends[0] : "");
                for (const char *const *e = ends; *e != NULL; e++)
                    if (strncmp(*e, "end", 3) == 0)
                        snprintf(want, sizeof want, "'{%% %s %%}'", *e);
                unexpected(P, want);
                return NULL;
            }
            break;
        }
        if (k->type == T_DATA) {
            next(P);
            x = node(P, JN_TEXT, k);
            if (x == NULL)
                return NULL;
            x->lit.t = JV_STR;
            x->lit.u.s.p = k->p;
            x->lit.u.s.n = k->n;
        } else if (k->type == T_VBEGIN) {
            next(P);
            x = node(P, JN_OUTPUT, k);
            if (x == NULL || (x->a = parse_tuple(P, true, false)) == NULL)
                return NULL;
            if (cur(P)->type != T_VEND) {
                unexpected(P, "'}}'");
                return NULL;
            }
            next(P);
        } else if (k->type == T_BBEGIN) {
            jj_tok *nk = &P->toks[P->pos + 1];
            if (ends != NULL && nk->type == T_NAME) {
                for (int e = 0; ends[e] != NULL; e++) {
                    if (tok_is_name(nk, ends[e])) {
                        P->pos += 2;
                        *which = e;
                        nvec_to(body, &items);
                        P->depth--;
                        return body;
                    }
                }
            }
            if (nk->type == T_NAME &&
                (tok_is_name(nk, "endif") || tok_is_name(nk, "endfor") || tok_is_name(nk, "elif") ||
                 tok_is_name(nk, "else") || tok_is_name(nk, "endmacro") ||
                 tok_is_name(nk, "endset") || tok_is_name(nk, "endfilter") ||
                 tok_is_name(nk, "endgeneration") || tok_is_name(nk, "endcall"))) {
                perr(P, WK_EINVAL, nk->line, nk->col, "unexpected '%.*s'", (int)nk->n, nk->p);
                return NULL;
            }
            next(P);
            x = parse_stmt(P);
            if (x == NULL)
                return NULL;
        } else {
            unexpected(P, "template text or a tag");
            return NULL;
        }
        if (nvec_push(P, &items, x, NULL, 0) < 0)
            return NULL;
    }
    nvec_to(body, &items);
    P->depth--;
    return body;
}

/* ---- scopes ----
 *
 * jinja2 compiles each scope (the template, a loop body, a loop's else, a
 * macro, a set or filter block, a call block's caller) into Python locals
 * decided at compile time: a name a scope assigns before it reads it, on
 * every path, is a local that starts Undefined, hiding a context variable
 * of the same name, unless an enclosing scope references the name (then it
 * starts as the outer value). A name assigned only on some branches, or read
 * first, starts as what the enclosing scopes (or the context) hold. The
 * walk below finds, per scope, the names that start Undefined; the
 * evaluator binds them on entry. Everything else is what a lookup through
 * the enclosing frames finds.
 */

enum { SK_LOAD = 1, SK_UNDEF, SK_COND, SK_PARAM };

typedef struct scope_names {
    const char **name; /* names referenced at this level */
    uint8_t *kind;     /* SK_* of each */
    bool *stored;      /* assigned somewhere at this level */
    size_t n, cap;
} scope_names;

typedef struct scope_chain {
    const scope_names *names;     /* a complete enclosing level */
    const struct scope_chain *up; /* the next one out */
} scope_chain;

/* nested scopes found while walking a level, analysed once the level is complete */
typedef struct scope_todo {
    jnode *body;         /* the JN_BODY of the scope */
    const char **params; /* names bound on entry (loop targets, macro parameters) */
    size_t nparams;
    jnode *extra; /* an expression evaluated in the scope (a loop's if, macro defaults) */
} scope_todo;

typedef struct scope_walk {
    jj_parser *P;
    scope_names lv;   /* the level being walked */
    scope_todo *todo; /* nested scopes */
    size_t ntodo, captodo;
    int err;
} scope_walk;

static ptrdiff_t
sn_find(const scope_names *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->name[i], name) == 0)
            return (ptrdiff_t)i;
    return -1;
}

static int
sn_add(scope_walk *W, scope_names *s, const char *name, int kind, bool stored)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        const char **nn = realloc(s->name, cap * sizeof *nn);
        if (nn != NULL)
            s->name = nn;
        uint8_t *nk = realloc(s->kind, cap);
        if (nk != NULL)
            s->kind = nk;
        bool *ns = realloc(s->stored, cap * sizeof *ns);
        if (ns != NULL)
            s->stored = ns;
        if (nn == NULL || nk == NULL || ns == NULL) {
            W->err = -1;
            return -1;
        }
        s->cap = cap;
    }
    s->name[s->n] = name;
    s->kind[s->n] = (uint8_t)kind;
    s->stored[s->n] = stored;
    s->n++;
    return 0;
}

static void
sn_free(scope_names *s)
{
    free(s->name);
    free(s->kind);
    free(s->stored);
    memset(s, 0, sizeof *s);
}

static int
sn_copy(scope_walk *W, scope_names *dst, const scope_names *src)
{
    memset(dst, 0, sizeof *dst);
    for (size_t i = 0; i < src->n; i++)
        if (sn_add(W, dst, src->name[i], src->kind[i], src->stored[i]) < 0)
            return -1;
    return 0;
}

static void
sw_load(scope_walk *W, const char *name)
{
    if (sn_find(&W->lv, name) < 0)
        sn_add(W, &W->lv, name, SK_LOAD, false);
}

static void
sw_store(scope_walk *W, const char *name)
{
    ptrdiff_t i = sn_find(&W->lv, name);
    if (i < 0)
        sn_add(W, &W->lv, name, SK_UNDEF, true);
    else
        W->lv.stored[i] = true;
}

static void
sw_todo(scope_walk *W, jnode *body, const char **params, size_t nparams, jnode *extra)
{
    if (body == NULL)
        return;
    if (W->ntodo == W->captodo) {
        size_t cap = W->captodo ? W->captodo * 2 : 8;
        scope_todo *t = realloc(W->todo, cap * sizeof *t);
        if (t == NULL) {
            W->err = -1;
            return;
        }
        W->todo = t;
        W->captodo = cap;
    }
    W->todo[W->ntodo++] = (scope_todo){body, params, nparams, extra};
}

static void
sw_expr(scope_walk *W, const jnode *x)
{
    if (x == NULL)
        return;
    if (x->kind == JN_NAME) {
        sw_load(W, x->name);
        return;
    }
    sw_expr(W, x->a);
    sw_expr(W, x->b);
    sw_expr(W, x->c);
    sw_expr(W, x->d);
    for (size_t i = 0; i < x->n; i++)
        sw_expr(W, x->kids[i]);
}

static void sw_stmts(scope_walk *W, jnode *body);

/* A filter block's or block set's filters: arguments read at this level. */
static void
sw_filters(scope_walk *W, const jnode *f)
{
    for (; f != NULL; f = f->a)
        for (size_t i = 0; i < f->n; i++)
            sw_expr(W, f->kids[i]);
}

/* Walks body (may be NULL) from a copy of before into *out. */
static void
sw_branch(scope_walk *W, const scope_names *before, jnode *body, scope_names *out)
{
    scope_names saved = W->lv;
    sn_copy(W, &W->lv, before);
    if (body != NULL)
        sw_stmts(W, body);
    *out = W->lv;
    W->lv = saved;
}

/*
 * jinja2's branch_update: a name a branch assigns, that this level had not
 * assigned before the if, reads through to the enclosing scopes (or the
 * context) until assigned, whatever the other branches do; a name only read
 * in a branch is read through too. The branches are freed.
 */
static void
sw_merge(scope_walk *W, const scope_names *before, scope_names *br, int nb)
{
    for (int k = 0; k < nb; k++) {
        for (size_t i = before->n; i < br[k].n; i++) {
            const char *nm = br[k].name[i];
            if (sn_find(&W->lv, nm) >= 0)
                continue;
            bool stored = false;
            for (int m = 0; m < nb; m++) {
                ptrdiff_t o = sn_find(&br[m], nm);
                if (o >= 0 && br[m].stored[o])
                    stored = true;
            }
            sn_add(W, &W->lv, nm, stored ? SK_COND : SK_LOAD, stored);
        }
    }
    for (size_t i = 0; i < before->n && i < W->lv.n; i++) {
        for (int k = 0; k < nb; k++) {
            if (i < br[k].n && br[k].stored[i] && !before->stored[i]) {
                W->lv.stored[i] = true;
                if (W->lv.kind[i] != SK_PARAM)
                    W->lv.kind[i] = SK_COND;
            }
        }
    }
    for (int k = 0; k < nb; k++)
        sn_free(&br[k]);
}

static void
sw_stmt(scope_walk *W, jnode *x)
{
    switch (x->kind) {
    case JN_OUTPUT:
        sw_expr(W, x->a);
        break;
    case JN_BODY:
        sw_stmts(W, x);
        break;
    case JN_IF: {
        /* jinja2's three branches: the body, all elifs, the else */
        scope_names before, br[3];
        sw_expr(W, x->a);
        if (sn_copy(W, &before, &W->lv) < 0)
            return;
        sw_branch(W, &before, x->b, &br[0]);
        scope_names saved = W->lv;
        sn_copy(W, &W->lv, &before);
        jnode *e = x->c;
        while (e != NULL && e->n == 1 && e->kids[0]->kind == JN_IF && e->kids[0]->op == 1) {
            jnode *elif = e->kids[0];
            scope_names b2, eb[3];
            sw_expr(W, elif->a);
            if (sn_copy(W, &b2, &W->lv) < 0)
                return;
            sw_branch(W, &b2, elif->b, &eb[0]);
            sn_copy(W, &eb[1], &b2);
            sn_copy(W, &eb[2], &b2);
            sw_merge(W, &b2, eb, 3);
            sn_free(&b2);
            e = elif->c;
        }
        br[1] = W->lv;
        W->lv = saved;
        sw_branch(W, &before, e, &br[2]);
        sw_merge(W, &before, br, 3);
        sn_free(&before);
        break;
    }
    case JN_FOR:
        sw_expr(W, x->a);
        sw_todo(W, x->b, x->names, x->nnames, x->d);
        sw_todo(W, x->c, NULL, 0, NULL);
        break;
    case JN_SET:
        sw_expr(W, x->a);
        if (x->attr != NULL)
            sw_load(W, x->name);
        else if (x->names != NULL)
            for (size_t i = 0; i < x->nnames; i++)
                sw_store(W, x->names[i]);
        else
            sw_store(W, x->name);
        break;
    case JN_SETBLOCK:
        sw_filters(W, x->d);
        sw_store(W, x->name);
        sw_todo(W, x->b, NULL, 0, NULL);
        break;
    case JN_FILTERBLOCK:
        sw_filters(W, x->d);
        sw_todo(W, x->b, NULL, 0, NULL);
        break;
    case JN_MACRO:
        sw_store(W, x->name);
        sw_todo(W, x->b, x->names, x->nnames, x);
        break;
    case JN_CALLBLOCK:
        sw_expr(W, x->a);
        sw_todo(W, x->b, NULL, 0, NULL);
        break;
    default:
        break;
    }
}

static void
sw_stmts(scope_walk *W, jnode *body)
{
    for (size_t i = 0; i < body->n && W->err == 0; i++)
        sw_stmt(W, body->kids[i]);
}

static bool
chain_has(const scope_chain *c, const char *name)
{
    for (; c != NULL; c = c->up)
        if (sn_find(c->names, name) >= 0)
            return true;
    return false;
}

/* Analyses one scope and, recursively, the scopes inside it. */
static int
scope_analyze(jj_parser *P, jnode *body, const char **params, size_t nparams, jnode *extra,
              const scope_chain *up, int depth)
{
    scope_walk W = {.P = P};
    int rc = 0;
    if (depth > 4 * WK_JINJA_NEST_MAX)
        return perr(P, WK_ETOOBIG, body->line, 1, "scopes nested too deeply");
    for (size_t i = 0; i < nparams; i++)
        sn_add(&W, &W.lv, params[i], SK_PARAM, true);
    sn_add(&W, &W.lv, "loop", SK_PARAM, true);
    if (extra != NULL && extra->kind == JN_MACRO) {
        sn_add(&W, &W.lv, "caller", SK_PARAM, true);
        for (size_t i = 0; i < extra->n; i++)
            sw_expr(&W, extra->kids[i]);
    } else if (extra != NULL) {
        sw_expr(&W, extra);
    }
    sw_stmts(&W, body);
    if (extra != NULL && extra->kind == JN_MACRO) {
        /* jinja2: a macro whose body reads varargs / kwargs collects extra arguments */
        ptrdiff_t va = sn_find(&W.lv, "varargs"), kw = sn_find(&W.lv, "kwargs");
        if (va >= 0 && W.lv.kind[va] == SK_LOAD)
            extra->op |= 1;
        if (kw >= 0 && W.lv.kind[kw] == SK_LOAD)
            extra->op |= 2;
    }
    if (W.err != 0) {
        rc = perr(P, WK_ENOMEM, body->line, 1, "out of memory");
        goto done;
    }
    size_t nu = 0;
    for (size_t i = 0; i < W.lv.n; i++)
        if (W.lv.kind[i] == SK_UNDEF && !chain_has(up, W.lv.name[i]))
            nu++;
    if (nu > 0) {
        body->undefs = jj_alloc(&P->t->arena, nu * sizeof *body->undefs);
        if (body->undefs == NULL) {
            rc = perr(P, WK_ENOMEM, body->line, 1, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < W.lv.n; i++)
            if (W.lv.kind[i] == SK_UNDEF && !chain_has(up, W.lv.name[i]))
                body->undefs[body->nundefs++] = W.lv.name[i];
    }
    scope_chain here = {&W.lv, up};
    for (size_t i = 0; i < W.ntodo && rc == 0; i++)
        rc = scope_analyze(P, W.todo[i].body, W.todo[i].params, W.todo[i].nparams, W.todo[i].extra,
                           &here, depth + 1);
done:
    sn_free(&W.lv);
    free(W.todo);
    return rc;
}

wk_err
wk_jinja_parse(const char *src, size_t len, wk_jinja **out, wk_diag *d)
{
    if (src == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "wk_jinja_parse: NULL argument");
    if (len > WK_JINJA_SOURCE_MAX)
        return wk_diag_set(d, WK_ETOOBIG, "template of %zu bytes, over the limit of %u", len,
                           WK_JINJA_SOURCE_MAX);
    wk_jinja *t = calloc(1, sizeof *t);
    if (t == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    t->arena.limit = SIZE_MAX / 4;
    jj_parser P = {.t = t, .d = d};
    /* newlines normalised to \n, one trailing newline dropped */
    char *s = jj_alloc(&t->arena, len + 1);
    if (s == NULL) {
        wk_jinja_free(t);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n > 0 && s[n - 1] == '\n')
        n--;
    P.s = s;
    P.len = n;
    int which = 0;
    if (lex(&P) == 0)
        t->root = parse_body(&P, NULL, &which);
    if (t->root != NULL && P.unknown != NULL) { /* jinja2 refuses these when compiling */
        jj_tok *k = P.unknown;
        perr(&P, WK_ENOTSUP, k->line, k->col, "no %s named '%.*s'",
             P.toks[P.unknown_pos - 1].type == T_OP ? "filter" : "test", (int)k->n, k->p);
        t->root = NULL;
    }
    if (t->root != NULL && scope_analyze(&P, t->root, NULL, 0, NULL, NULL, 0) < 0)
        t->root = NULL;
    free(P.toks);
    if (t->root == NULL) {
        wk_err e = P.err != WK_OK ? P.err : WK_EINVAL;
        wk_jinja_free(t);
        return e;
    }
    *out = t;
    return WK_OK;
}

void
wk_jinja_free(wk_jinja *t)
{
    if (t == NULL)
        return;
    jj_arena_fini(&t->arena);
    free(t);
}
