/*
 * wk_grammar: the tool-call grammar compiler, its byte matcher and the vocab
 * trie walk.
 *
 * Nodes: literals, sequences, choices among sorted byte strings (function
 * names, property keys, enum values), raw text up to a terminator, JSON
 * values of a schema (dispatched on their first byte to an object, array,
 * string, number or literal frame), the XML argument list, optional
 * whitespace, and the list of calls. A frame is 24 bytes; a matcher state is
 * a stack of at most WK_GM_STACK frames, copied per trie node in
 * wk_gmatch_allowed(). Every prefix the matcher takes can be completed (no
 * dead ends), so a row constrained by it always has a token to take.
 */
#include "wk_grammar.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WK_GM_STACK 48
#define WK_GM_NUM_INT_MAX 16
#define WK_GM_NUM_FRAC_MAX 16
/* (two exponent digits: 16 + 99 stays inside a double, which the call parser reads back) */
#define WK_GM_NUM_EXP_MAX 2
#define WK_GM_ENUM_MAX 256
#define WK_GM_CALLS_MAX 32

enum { T_STRING = 1, T_NUMBER = 2, T_INTEGER = 4, T_BOOLEAN = 8, T_NULL = 16, T_OBJECT = 32,
       T_ARRAY = 64 };

typedef enum gm_kind {
    N_LIT = 1, N_SEQ, N_CHOICE, N_RAW, N_VALUE, N_XOBJ, N_CALLS, N_WS,
} gm_kind;

typedef struct gm_node {
    uint8_t kind;       /* gm_kind */
    uint8_t types;      /* N_VALUE: T_* mask */
    uint8_t lookahead;  /* N_CHOICE: a complete candidate may end before a longer one (enum);
                           N_RAW: the terminator must follow a "\n" */
    uint8_t parallel;   /* N_CALLS */
    uint8_t no_closers; /* N_RAW: the text may not hold the call's closing tags (XML values) */
    uint32_t str;       /* N_LIT / N_RAW: offset of the bytes (N_RAW: the terminator) */
    uint32_t len;       /* their length */
    uint32_t first;     /* N_SEQ: first kid index; N_CHOICE / N_VALUE / N_XOBJ: first candidate */
    uint32_t n;         /* kids or candidates */
    uint32_t items;     /* N_VALUE array: item node; N_CALLS: the call node */
    uint32_t alt;       /* N_VALUE: enum choice node (0 = none); N_CALLS: separator+call node */
    uint64_t required;  /* N_VALUE / N_XOBJ: required candidates (bit = sorted index) */
} gm_node;

typedef struct gm_cand {
    uint32_t str;    /* offset of the bytes */
    uint32_t len;    /* length */
    uint32_t child;  /* node after it (0 = none) */
} gm_cand;

struct wk_grammar {
    gm_node *nodes;
    uint32_t n_nodes, cap_nodes;
    gm_cand *cands;
    uint32_t n_cands, cap_cands;
    uint32_t *kids;
    uint32_t n_kids, cap_kids;
    uint8_t *bytes;
    uint32_t n_bytes, cap_bytes;
    uint32_t root;
    uint32_t lit_true, lit_false, lit_null;
    uint32_t closer, closer_len; /* the call's close marker: never inside a JSON string */
};

/* ---- the matcher ---- */

typedef enum gm_fkind {
    F_LIT = 1, F_SEQ, F_CHOICE, F_RAW, F_VALUE, F_OBJ, F_XOBJ, F_ARR, F_STR, F_NUM, F_CALLS, F_WS,
} gm_fkind;

typedef struct gm_frame {
    uint32_t node;   /* node */
    uint8_t kind;    /* gm_fkind */
    uint8_t phase;   /* per kind */
    uint16_t pos;    /* bytes of a literal / choice / terminator matched; kid index */
    uint16_t lo, hi; /* choice: alive candidate range (relative) */
    uint16_t aux;    /* whitespace run, digit count, UTF-8 state, call count */
    uint16_t aux2;   /* \u digits seen so far */
    uint64_t used;   /* objects: properties given */
} gm_frame;

typedef struct gm_state {
    uint32_t n;
    gm_frame f[WK_GM_STACK];
} gm_state;

struct wk_gmatch {
    const wk_grammar *g;
    gm_state st;
    gm_state *scratch; /* trie walk: one state per depth, allocated on first use */
    gm_state **cur;    /* trie walk: the state at each depth (a scratch one or shared) */
    size_t scratch_n;
};

typedef enum gm_res { R_OK, R_POP_OK, R_REJECT, R_POP_REFEED, R_REFEED } gm_res;

static bool
gm_is_ws(uint8_t c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

static bool
gm_is_hex(uint8_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static gm_frame
gm_frame_for(const wk_grammar *g, uint32_t node)
{
    gm_frame f;
    memset(&f, 0, sizeof(f));
    f.node = node;
    switch ((gm_kind)g->nodes[node].kind) {
    case N_LIT: f.kind = F_LIT; break;
    case N_SEQ: f.kind = F_SEQ; break;
    case N_CHOICE:
        f.kind = F_CHOICE;
        f.hi = (uint16_t)g->nodes[node].n;
        break;
    case N_RAW: f.kind = F_RAW; break;
    case N_VALUE: f.kind = F_VALUE; break;
    case N_XOBJ: f.kind = F_XOBJ; break;
    case N_CALLS: f.kind = F_CALLS; break;
    case N_WS: f.kind = F_WS; break;
    }
    return f;
}

static bool
gm_push(gm_state *s, gm_frame f)
{
    if (s->n >= WK_GM_STACK)
        return false;
    s->f[s->n++] = f;
    return true;
}

/*
 * Choice step: narrows f's candidate range to those whose byte at f->pos is
 * c and that are not in `used`. Returns false when none is left.
 * *done is set to the index of the one candidate that is now complete and
 * alone (-1 otherwise).
 */
static bool
gm_choice_take(const wk_grammar *g, uint32_t first, gm_frame *f, uint64_t used, uint8_t c,
               int *done)
{
    int nl = -1, nh = -1;
    bool live = false;
    for (uint32_t i = f->lo; i < f->hi; i++) {
        const gm_cand *k = &g->cands[first + i];
        if (k->len > f->pos && g->bytes[k->str + f->pos] == c) {
            if (nl < 0)
                nl = (int)i;
            nh = (int)i + 1;
            if (!(i < 64 && (used >> i) & 1))
                live = true;
        } else if (nl >= 0) {
            break; /* sorted: the matching ones are contiguous */
        }
    }
    if (!live)
        return false;
    f->lo = (uint16_t)nl;
    f->hi = (uint16_t)nh;
    f->pos++;
    *done = -1;
    int alive = 0, complete = -1;
    for (uint32_t i = f->lo; i < f->hi; i++) {
        if (i < 64 && (used >> i) & 1)
            continue;
        alive++;
        if (g->cands[first + i].len == f->pos)
            complete = (int)i;
    }
    if (alive == 1 && complete >= 0)
        *done = complete;
    return true;
}

/* The candidate complete at f->pos in the range, or -1. */
static int
gm_choice_complete(const wk_grammar *g, uint32_t first, const gm_frame *f, uint64_t used)
{
    for (uint32_t i = f->lo; i < f->hi; i++) {
        if (!(i < 64 && (used >> i) & 1) && g->cands[first + i].len == f->pos)
            return (int)i;
    }
    return -1;
}

/* UTF-8: f->aux low 3 bits = continuation bytes still due, bits 3.. = range of the next one. */
static bool
gm_utf8(gm_frame *f, uint8_t c, bool *ok)
{
    uint16_t need = f->aux & 7, rng = f->aux >> 3;
    if (need > 0) {
        uint8_t lo = 0x80, hi = 0xBF;
        if (rng == 1) lo = 0xA0;
        else if (rng == 2) hi = 0x9F;
        else if (rng == 3) lo = 0x90;
        else if (rng == 4) hi = 0x8F;
        *ok = c >= lo && c <= hi;
        if (*ok)
            f->aux = (uint16_t)(need - 1);
        return true;
    }
    if (c < 0x80)
        return false; /* not part of a multi-byte character: the caller decides */
    if (c >= 0xC2 && c <= 0xDF)
        f->aux = 1;
    else if (c == 0xE0)
        f->aux = 2 | (1 << 3);
    else if (c == 0xED)
        f->aux = 2 | (2 << 3);
    else if (c >= 0xE1 && c <= 0xEF)
        f->aux = 2;
    else if (c == 0xF0)
        f->aux = 3 | (3 << 3);
    else if (c >= 0xF1 && c <= 0xF3)
        f->aux = 3;
    else if (c == 0xF4)
        f->aux = 3 | (4 << 3);
    else {
        *ok = false;
        return true;
    }
    *ok = true;
    return true;
}

enum { O_OPEN, O_FIRST, O_KEY, O_COLON, O_VAL, O_AFTER, O_NEXT };
enum { A_OPEN, A_FIRST, A_AFTER, A_NEXT };
enum { S_OPEN, S_BODY, S_ESC, S_HEX };
enum { NU_START, NU_MINUS, NU_ZERO, NU_INT, NU_DOT, NU_FRAC, NU_E, NU_ESIGN, NU_EXP };
enum { X_LT, X_AFTER_LT, X_PARAM, X_KEY, X_VAL, X_CLOSE };
enum { C_FIRST, C_AFTER };

static const char gm_x_param[] = "parameter=";
static const char gm_x_close[] = "function>\n";

static bool
gm_num_complete(uint8_t phase)
{
    return phase == NU_ZERO || phase == NU_INT || phase == NU_FRAC || phase == NU_EXP;
}

/* One byte into the top frame. */
static gm_res
gm_step(const wk_grammar *g, gm_state *s, uint8_t c)
{
    gm_frame *f = &s->f[s->n - 1];
    const gm_node *nd = &g->nodes[f->node];
    switch ((gm_fkind)f->kind) {
    case F_LIT:
        if (g->bytes[nd->str + f->pos] != c)
            return R_REJECT;
        f->pos++;
        return f->pos == nd->len ? R_POP_OK : R_OK;
    case F_SEQ:
        if (f->pos == nd->n)
            return R_POP_REFEED;
        {
            uint32_t kid = g->kids[nd->first + f->pos++];
            return gm_push(s, gm_frame_for(g, kid)) ? R_REFEED : R_REJECT;
        }
    case F_WS:
        if (gm_is_ws(c) && f->aux < WK_GRAMMAR_WS_MAX) {
            f->aux++;
            return R_OK;
        }
        return R_POP_REFEED;
    case F_CHOICE: {
        int done = -1;
        gm_frame save = *f;
        if (!gm_choice_take(g, nd->first, f, 0, c, &done)) {
            *f = save;
            if (nd->lookahead && f->pos > 0) {
                int k = gm_choice_complete(g, nd->first, f, 0);
                if (k >= 0)
                    return R_POP_REFEED;
            }
            return R_REJECT;
        }
        if (done >= 0) {
            uint32_t child = g->cands[nd->first + (uint32_t)done].child;
            if (child == 0)
                return R_POP_OK;
            *f = gm_frame_for(g, child);
            return R_OK;
        }
        return R_OK;
    }
    case F_RAW: {
        /* aux2 bit 0: the last content byte was "\n"; bit 1: so was the byte before the match. */
        bool ok;
        if (gm_utf8(f, c, &ok)) {
            f->pos = 0;
            f->aux2 = 0;
            f->lo = f->hi = 0;
            return ok ? R_OK : R_REJECT;
        }
        if (nd->no_closers) {
            /*
             * An XML value may not hold "</function>" or "</tool_call>": the
             * reply parser (wk_toolcall) ends the call there, so the text
             * would no longer be one call. lo / hi: bytes of each matched
             * (neither repeats its first byte, so a mismatch restarts at '<').
             */
            static const char fn[] = "</function>", tc[] = "</tool_call>";
            f->lo = (uint16_t)(c == (uint8_t)fn[f->lo] ? f->lo + 1 : c == '<');
            f->hi = (uint16_t)(c == (uint8_t)tc[f->hi] ? f->hi + 1 : c == '<');
            if (f->lo == sizeof(fn) - 1 || f->hi == sizeof(tc) - 1)
                return R_REJECT;
        }
        if (c == g->bytes[nd->str + f->pos]) {
            if (f->pos == 0)
                f->aux2 = (f->aux2 & 1) ? 3 : 0;
            if (++f->pos < nd->len)
                return R_OK;
            return nd->lookahead && !(f->aux2 & 2) ? R_REJECT : R_POP_OK;
        }
        if (c < 0x20 && c != '\n' && c != '\t' && c != '\r')
            return R_REJECT;
        if (c == g->bytes[nd->str]) {
            f->pos = 1; /* the byte before it was the terminator's, not "\n" */
            f->aux2 = 0;
        } else {
            f->pos = 0;
            f->aux2 = c == '\n';
        }
        return R_OK;
    }
    case F_VALUE:
        if (nd->alt != 0) {
            *f = gm_frame_for(g, nd->alt);
            return R_REFEED;
        }
        if (c == '"' && (nd->types & T_STRING))
            f->kind = F_STR;
        else if ((c == '-' || (c >= '0' && c <= '9')) && (nd->types & (T_NUMBER | T_INTEGER)))
            f->kind = F_NUM;
        else if (c == 't' && (nd->types & T_BOOLEAN))
            *f = gm_frame_for(g, g->lit_true);
        else if (c == 'f' && (nd->types & T_BOOLEAN))
            *f = gm_frame_for(g, g->lit_false);
        else if (c == 'n' && (nd->types & T_NULL))
            *f = gm_frame_for(g, g->lit_null);
        else if (c == '{' && (nd->types & T_OBJECT))
            f->kind = F_OBJ;
        else if (c == '[' && (nd->types & T_ARRAY))
            f->kind = F_ARR;
        else
            return R_REJECT;
        return R_REFEED;
    case F_STR:
        switch (f->phase) {
        case S_OPEN:
            if (c != '"')
                return R_REJECT;
            f->phase = S_BODY;
            return R_OK;
        case S_BODY: {
            bool ok;
            if (gm_utf8(f, c, &ok)) {
                f->lo = 0;
                return ok ? R_OK : R_REJECT;
            }
            /*
             * The reply parser (wk_toolcall) ends a call at the first close
             * marker, even inside a string: a string may hold it only
             * escaped ("<\/tool_call>"). lo: its bytes matched (it does not
             * repeat its first byte '<', so a mismatch restarts there).
             */
            f->lo = (uint16_t)(c == g->bytes[g->closer + f->lo] ? f->lo + 1 : c == '<');
            if (f->lo == g->closer_len)
                return R_REJECT;
            if (c == '"')
                return R_POP_OK;
            if (c == '\\') {
                f->phase = S_ESC;
                return R_OK;
            }
            return c >= 0x20 ? R_OK : R_REJECT;
        }
        case S_ESC:
            if (c == 'u') {
                f->phase = S_HEX;
                f->aux2 = 0;
                f->used = 0;
                return R_OK;
            }
            if (strchr("\"\\/bfnrt", c) == NULL || c == 0)
                return R_REJECT;
            f->phase = S_BODY;
            return R_OK;
        case S_HEX: {
            if (!gm_is_hex(c))
                return R_REJECT;
            uint32_t v = c <= '9' ? (uint32_t)(c - '0') : (uint32_t)((c | 0x20) - 'a' + 10);
            /* Neither a surrogate (D800..DFFF) nor NUL: decided digit by digit, so no dead end. */
            if (f->aux2 == 1 && f->used == 0xD && v >= 8)
                return R_REJECT;
            if (f->aux2 == 3 && f->used == 0 && v == 0)
                return R_REJECT;
            f->used = f->used * 16 + v;
            if (++f->aux2 == 4)
                f->phase = S_BODY;
            return R_OK;
        }
        }
        return R_REJECT;
    case F_NUM: {
        bool digit = c >= '0' && c <= '9';
        bool integer = !(nd->types & T_NUMBER);
        switch (f->phase) {
        case NU_START:
            if (c == '-') {
                f->phase = NU_MINUS;
                return R_OK;
            }
            /* fallthrough */
        case NU_MINUS:
            if (!digit)
                return R_REJECT;
            f->phase = c == '0' ? NU_ZERO : NU_INT;
            f->aux = 1;
            return R_OK;
        case NU_INT:
            if (digit) {
                if (f->aux >= WK_GM_NUM_INT_MAX)
                    return R_POP_REFEED;
                f->aux++;
                return R_OK;
            }
            /* fallthrough */
        case NU_ZERO:
            if (c == '.' && !integer) {
                f->phase = NU_DOT;
                f->aux = 0;
                return R_OK;
            }
            if ((c == 'e' || c == 'E') && !integer) {
                f->phase = NU_E;
                f->aux = 0;
                return R_OK;
            }
            return R_POP_REFEED;
        case NU_DOT:
            if (!digit)
                return R_REJECT;
            f->phase = NU_FRAC;
            f->aux = 1;
            return R_OK;
        case NU_FRAC:
            if (digit && f->aux < WK_GM_NUM_FRAC_MAX) {
                f->aux++;
                return R_OK;
            }
            if (c == 'e' || c == 'E') {
                f->phase = NU_E;
                f->aux = 0;
                return R_OK;
            }
            return R_POP_REFEED;
        case NU_E:
            if (c == '+' || c == '-') {
                f->phase = NU_ESIGN;
                return R_OK;
            }
            /* fallthrough */
        case NU_ESIGN:
            if (!digit)
                return R_REJECT;
            f->phase = NU_EXP;
            f->aux = 1;
            return R_OK;
        case NU_EXP:
            if (digit && f->aux < WK_GM_NUM_EXP_MAX) {
                f->aux++;
                return R_OK;
            }
            return R_POP_REFEED;
        }
        return R_REJECT;
    }
    case F_OBJ: {
        bool ws_ok = gm_is_ws(c) && f->aux < WK_GRAMMAR_WS_MAX;
        uint64_t all = nd->n >= 64 ? ~0ull : ((1ull << nd->n) - 1);
        bool req_ok = (f->used & nd->required) == nd->required;
        bool more = (f->used & all) != all;
        switch (f->phase) {
        case O_OPEN:
            if (c != '{')
                return R_REJECT;
            f->phase = O_FIRST;
            return R_OK;
        case O_FIRST:
        case O_NEXT:
            if (ws_ok) {
                f->aux++;
                return R_OK;
            }
            if (c == '"' && more) {
                f->phase = O_KEY;
                f->pos = 0;
                f->lo = 0;
                f->hi = (uint16_t)nd->n;
                return R_OK;
            }
            if (c == '}' && f->phase == O_FIRST && req_ok)
                return R_POP_OK;
            return R_REJECT;
        case O_KEY: {
            int done = -1;
            if (!gm_choice_take(g, nd->first, f, f->used, c, &done))
                return R_REJECT;
            if (done >= 0) {
                f->used |= 1ull << done;
                f->aux2 = (uint16_t)done;
                f->phase = O_COLON;
                f->aux = 0;
            }
            return R_OK;
        }
        case O_COLON:
            if (ws_ok) {
                f->aux++;
                return R_OK;
            }
            if (c != ':')
                return R_REJECT;
            f->phase = O_VAL;
            f->aux = 0;
            return R_OK;
        case O_VAL:
            if (ws_ok) {
                f->aux++;
                return R_OK;
            }
            f->phase = O_AFTER;
            f->aux = 0;
            return gm_push(s, gm_frame_for(g, g->cands[nd->first + f->aux2].child)) ? R_REFEED
                                                                                    : R_REJECT;
        case O_AFTER:
            if (ws_ok) {
                f->aux++;
                return R_OK;
            }
            if (c == ',' && more) {
                f->phase = O_NEXT;
                f->aux = 0;
                return R_OK;
            }
            if (c == '}' && req_ok)
                return R_POP_OK;
            return R_REJECT;
        }
        return R_REJECT;
    }
    case F_ARR: {
        bool ws_ok = gm_is_ws(c) && f->aux < WK_GRAMMAR_WS_MAX;
        switch (f->phase) {
        case A_OPEN:
            if (c != '[')
                return R_REJECT;
            f->phase = A_FIRST;
            return R_OK;
        case A_FIRST:
        case A_NEXT:
            if (ws_ok) {
                f->aux++;
                return R_OK;
            }
            if (c == ']' && f->phase == A_FIRST)
                return R_POP_OK;
            f->phase = A_AFTER;
            f->aux = 0;
            return gm_push(s, gm_frame_for(g, nd->items)) ? R_REFEED : R_REJECT;
        case A_AFTER:
            if (ws_ok) {
                f->aux++;
                return R_OK;
            }
            if (c == ',') {
                f->phase = A_NEXT;
                f->aux = 0;
                return R_OK;
            }
            return c == ']' ? R_POP_OK : R_REJECT;
        }
        return R_REJECT;
    }
    case F_XOBJ: {
        uint64_t all = nd->n >= 64 ? ~0ull : ((1ull << nd->n) - 1);
        bool req_ok = (f->used & nd->required) == nd->required;
        bool more = (f->used & all) != all;
        switch (f->phase) {
        case X_LT:
            if (c != '<')
                return R_REJECT;
            f->phase = X_AFTER_LT;
            return R_OK;
        case X_AFTER_LT:
            if (c == gm_x_param[0] && more) {
                f->phase = X_PARAM;
                f->pos = 1;
                return R_OK;
            }
            if (c == '/' && req_ok) {
                f->phase = X_CLOSE;
                f->pos = 0;
                return R_OK;
            }
            return R_REJECT;
        case X_PARAM:
            if (c != (uint8_t)gm_x_param[f->pos])
                return R_REJECT;
            if (++f->pos == sizeof(gm_x_param) - 1) {
                f->phase = X_KEY;
                f->pos = 0;
                f->lo = 0;
                f->hi = (uint16_t)nd->n;
            }
            return R_OK;
        case X_KEY: {
            int done = -1;
            if (!gm_choice_take(g, nd->first, f, f->used, c, &done))
                return R_REJECT;
            if (done >= 0) {
                f->used |= 1ull << done;
                f->aux2 = (uint16_t)done;
                f->phase = X_VAL;
            }
            return R_OK;
        }
        case X_VAL:
            f->phase = X_LT;
            return gm_push(s, gm_frame_for(g, g->cands[nd->first + f->aux2].child)) ? R_REFEED
                                                                                    : R_REJECT;
        case X_CLOSE:
            if (c != (uint8_t)gm_x_close[f->pos])
                return R_REJECT;
            return ++f->pos == sizeof(gm_x_close) - 1 ? R_POP_OK : R_OK;
        }
        return R_REJECT;
    }
    case F_CALLS: {
        if (f->phase == C_FIRST) {
            f->phase = C_AFTER;
            f->aux = 1;
            return gm_push(s, gm_frame_for(g, nd->items)) ? R_REFEED : R_REJECT;
        }
        /* Another call only when this byte starts the separator; else the list is over. */
        const gm_node *sep = &g->nodes[g->kids[g->nodes[nd->alt].first]];
        if (!nd->parallel || f->aux >= WK_GM_CALLS_MAX || c != g->bytes[sep->str])
            return R_POP_REFEED;
        f->aux++;
        return gm_push(s, gm_frame_for(g, nd->alt)) ? R_REFEED : R_REJECT;
    }
    }
    return R_REJECT;
}

static bool
gm_can_end(const wk_grammar *g, const gm_frame *f)
{
    const gm_node *nd = &g->nodes[f->node];
    switch ((gm_fkind)f->kind) {
    case F_SEQ: return f->pos == nd->n;
    case F_WS: return true;
    case F_CHOICE: return nd->lookahead && f->pos > 0 && gm_choice_complete(g, nd->first, f, 0) >= 0;
    case F_NUM: return gm_num_complete(f->phase);
    case F_CALLS: return f->phase == C_AFTER;
    default: return false;
    }
}

/* One byte; false leaves s unusable (callers work on copies). */
static bool
gm_feed(const wk_grammar *g, gm_state *s, uint8_t c)
{
    for (int guard = 0; guard < 4 * WK_GM_STACK + 8; guard++) {
        if (s->n == 0)
            return false;
        switch (gm_step(g, s, c)) {
        case R_OK:
            return true;
        case R_POP_OK:
            s->n--;
            return true;
        case R_REJECT:
            return false;
        case R_POP_REFEED:
            s->n--;
            break;
        case R_REFEED:
            break;
        }
    }
    return false;
}

/* How a byte was taken (gm_taken()). */
enum { GM_FREE, GM_FIXED, GM_SEP };

/*
 * How the frame top (as it was before c) took c (r: what it returned):
 * GM_FIXED for fixed text of the grammar: a string's quotes, a raw text's
 * end marker (c continues its match), every byte of the other frames
 * (literals, names, enum values, punctuation); GM_SEP for the "\n" an XML
 * value's end marker must follow (fixed only when the marker follows);
 * GM_FREE for a string's contents, a number, whitespace, a raw text's
 * contents.
 */
static int
gm_taken(const wk_grammar *g, const gm_frame *top, uint8_t c, gm_res r)
{
    switch (top->kind) {
    case F_STR:
        return top->phase == S_OPEN || (top->phase == S_BODY && r == R_POP_OK) ? GM_FIXED
                                                                                 : GM_FREE;
    case F_NUM:
    case F_WS:
        return GM_FREE;
    case F_RAW: {
        const gm_node *nd = &g->nodes[top->node];
        if (top->aux != 0)
            return GM_FREE; /* (inside a multi-byte character) */
        if (c == g->bytes[nd->str + top->pos])
            return GM_FIXED;
        return nd->lookahead && c == '\n' ? GM_SEP : GM_FREE;
    }
    default:
        return GM_FIXED;
    }
}

/* gm_feed() that also says how c was taken (*how: gm_taken()). */
static bool
gm_feed_fixed(const wk_grammar *g, gm_state *s, uint8_t c, int *how)
{
    for (int guard = 0; guard < 4 * WK_GM_STACK + 8; guard++) {
        if (s->n == 0)
            return false;
        gm_frame top = s->f[s->n - 1];
        gm_res r = gm_step(g, s, c);
        switch (r) {
        case R_OK:
        case R_POP_OK:
            *how = gm_taken(g, &top, c, r);
            if (r == R_POP_OK)
                s->n--;
            return true;
        case R_REJECT:
            return false;
        case R_POP_REFEED:
            s->n--;
            break;
        case R_REFEED:
            break;
        }
    }
    return false;
}

static bool
gm_state_accepting(const wk_grammar *g, const gm_state *s)
{
    for (uint32_t i = 0; i < s->n; i++) {
        if (!gm_can_end(g, &s->f[i]))
            return false;
    }
    return true;
}

static void
gm_state_copy(gm_state *dst, const gm_state *src)
{
    dst->n = src->n;
    memcpy(dst->f, src->f, src->n * sizeof(gm_frame));
}

wk_gmatch *
wk_gmatch_new(const wk_grammar *g)
{
    wk_gmatch *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    m->g = g;
    m->st.n = 1;
    m->st.f[0] = gm_frame_for(g, g->root);
    return m;
}

wk_gmatch *
wk_gmatch_clone(const wk_gmatch *m)
{
    wk_gmatch *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->g = m->g;
    gm_state_copy(&c->st, &m->st);
    return c;
}

void
wk_gmatch_free(wk_gmatch *m)
{
    if (m == NULL)
        return;
    free(m->scratch);
    free(m->cur);
    free(m);
}

bool
wk_gmatch_advance(wk_gmatch *m, const uint8_t *bytes, size_t n)
{
    gm_state tmp;
    gm_state_copy(&tmp, &m->st);
    for (size_t i = 0; i < n; i++) {
        if (!gm_feed(m->g, &tmp, bytes[i]))
            return false;
    }
    gm_state_copy(&m->st, &tmp);
    return true;
}

bool
wk_gmatch_accepting(const wk_gmatch *m)
{
    return gm_state_accepting(m->g, &m->st);
}

bool
wk_gmatch_done(const wk_gmatch *m)
{
    if (!wk_gmatch_accepting(m))
        return false;
    gm_state tmp;
    for (int c = 0; c < 256; c++) {
        gm_state_copy(&tmp, &m->st);
        if (gm_feed(m->g, &tmp, (uint8_t)c))
            return false;
    }
    return true;
}

/* ---- the vocab trie ---- */

/*
 * Nodes in preorder (the order of the sorted byte strings), so a subtree is
 * the range [i, end[i]) and the walk is one loop that skips dead subtrees.
 * The tokens that end at node i are sorted_ids[tok[i] .. tok[i + 1]).
 */
struct wk_gvocab {
    uint32_t n_tokens;    /* vocab size */
    int32_t eos;          /* end-of-text id, -1 = none */
    uint32_t n_nodes;     /* trie nodes, root included */
    uint8_t *byte;        /* edge byte into node i */
    uint16_t *depth;      /* node depth (root 0) */
    uint32_t *end;        /* end of node i's subtree */
    uint32_t *tok;        /* n_nodes + 1 entries */
    uint32_t *ids;        /* token ids sorted by their bytes (empty ones left out) */
    uint8_t *plain;       /* bit 0: node i and its subtree are plain bytes (gm_plain_byte);
                             bit 1: every path through node i's subtree, read from the root,
                             is plain bytes and valid UTF-8 (possibly ending mid-character) */
    uint32_t max_depth;   /* longest token */
    uint32_t n_lit;       /* control tokens: allowed only as fixed text (not in the trie) */
    uint32_t *lit_ids;    /* their ids */
    uint32_t *lit_off;    /* n_lit + 1 offsets into lit_bytes */
    uint8_t *lit_bytes;   /* their bytes, one after the other */
};

/*
 * Plain bytes: printable ASCII other than '"', '\\' and '<'. Inside a JSON
 * string or a raw text whose terminator starts with a byte that is not plain,
 * they change nothing in the matcher, so a subtree made only of them is
 * allowed whole without walking it.
 */
static bool
gm_plain_byte(uint8_t c)
{
    return c >= 0x20 && c < 0x7F && c != '"' && c != '\\' && c != '<';
}

/* True when every plain byte leaves state s as it is. */
static bool
gm_plain_idle(const wk_grammar *g, const gm_state *s)
{
    if (s->n == 0)
        return false;
    const gm_frame *f = &s->f[s->n - 1];
    if (f->kind == F_STR)
        return f->phase == S_BODY && f->aux == 0 && f->lo == 0;
    if (f->kind == F_RAW)
        return f->pos == 0 && f->aux == 0 && f->aux2 == 0 && f->lo == 0 && f->hi == 0 &&
               !gm_plain_byte(g->bytes[g->nodes[f->node].str]);
    return false;
}

typedef struct gm_sortkey {
    const uint8_t *p;
    size_t len;
    uint32_t id;
} gm_sortkey;

static int
gm_key_cmp(const void *a, const void *b)
{
    const gm_sortkey *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int r = memcmp(x->p, y->p, n);
    if (r != 0)
        return r;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void
wk_gvocab_free(wk_gvocab *v)
{
    if (v == NULL)
        return;
    free(v->byte);
    free(v->depth);
    free(v->end);
    free(v->tok);
    free(v->ids);
    free(v->plain);
    free(v->lit_ids);
    free(v->lit_off);
    free(v->lit_bytes);
    free(v);
}

uint32_t
wk_gvocab_size(const wk_gvocab *v)
{
    return v->n_tokens;
}

/* The control tokens of literal into v (lit_*). WK_OK or WK_ENOMEM. */
static wk_err
gm_vocab_lits(wk_gvocab *v, const uint8_t *const *pieces, const size_t *lens, uint32_t n,
              const uint8_t *literal)
{
    size_t nl = 0, bytes = 0;
    for (uint32_t i = 0; literal != NULL && i < n; i++) {
        if (literal[i] && pieces[i] != NULL && lens[i] > 0 && lens[i] <= 65535 &&
            (int32_t)i != v->eos) {
            nl++;
            bytes += lens[i];
        }
    }
    v->lit_ids = malloc((nl ? nl : 1) * sizeof(*v->lit_ids));
    v->lit_off = malloc((nl + 1) * sizeof(*v->lit_off));
    v->lit_bytes = malloc(bytes ? bytes : 1);
    if (v->lit_ids == NULL || v->lit_off == NULL || v->lit_bytes == NULL || bytes > UINT32_MAX)
        return WK_ENOMEM;
    uint32_t k = 0, off = 0;
    for (uint32_t i = 0; literal != NULL && i < n; i++) {
        if (literal[i] && pieces[i] != NULL && lens[i] > 0 && lens[i] <= 65535 &&
            (int32_t)i != v->eos) {
            v->lit_ids[k] = i;
            v->lit_off[k++] = off;
            memcpy(v->lit_bytes + off, pieces[i], lens[i]);
            off += (uint32_t)lens[i];
        }
    }
    v->lit_off[k] = off;
    v->n_lit = k;
    return WK_OK;
}

wk_err
wk_gvocab_new(const uint8_t *const *pieces, const size_t *lens, uint32_t n, int32_t eos,
              const uint8_t *literal, wk_gvocab **out)
{
    *out = NULL;
    wk_gvocab *v = calloc(1, sizeof(*v));
    gm_sortkey *keys = calloc(n ? n : 1, sizeof(*keys));
    if (v == NULL || keys == NULL) {
        free(v);
        free(keys);
        return WK_ENOMEM;
    }
    v->n_tokens = n;
    v->eos = eos;
    if (gm_vocab_lits(v, pieces, lens, n, literal) != WK_OK) {
        free(keys);
        wk_gvocab_free(v);
        return WK_ENOMEM;
    }
    size_t nk = 0, total = 1;
    for (uint32_t i = 0; i < n; i++) {
        if (pieces[i] == NULL || lens[i] == 0 || lens[i] > 65535 || (int32_t)i == eos ||
            (literal != NULL && literal[i]))
            continue;
        keys[nk++] = (gm_sortkey){pieces[i], lens[i], i};
        total += lens[i];
    }
    qsort(keys, nk, sizeof(*keys), gm_key_cmp);
    /* Upper bound on nodes: every byte of every token a node, plus the root. */
    v->byte = malloc(total);
    v->depth = malloc(total * sizeof(*v->depth));
    v->end = malloc(total * sizeof(*v->end));
    v->tok = malloc((total + 1) * sizeof(*v->tok));
    v->ids = malloc((nk ? nk : 1) * sizeof(*v->ids));
    v->plain = malloc(total);
    uint32_t *parent = malloc(total * sizeof(*parent));
    uint32_t *path = malloc(65536 * sizeof(*path)); /* node at each depth of the current path */
    if (v->byte == NULL || v->depth == NULL || v->end == NULL || v->tok == NULL ||
        v->ids == NULL || v->plain == NULL || parent == NULL || path == NULL) {
        free(keys);
        free(path);
        free(parent);
        wk_gvocab_free(v);
        return WK_ENOMEM;
    }
    uint32_t nn = 1;
    v->byte[0] = 0;
    v->depth[0] = 0;
    v->tok[0] = 0;
    path[0] = 0;
    size_t plen = 0; /* length of the current path (the previous key) */
    const gm_sortkey *prev = NULL;
    for (size_t k = 0; k < nk; k++) {
        const gm_sortkey *key = &keys[k];
        size_t common = 0;
        if (prev != NULL) {
            size_t m = prev->len < key->len ? prev->len : key->len;
            while (common < m && prev->p[common] == key->p[common])
                common++;
        }
        /* Close the nodes of the previous path below the common prefix. */
        for (size_t dd = plen; dd > common; dd--)
            v->end[path[dd]] = nn;
        for (size_t dd = common; dd < key->len; dd++) {
            v->byte[nn] = key->p[dd];
            v->depth[nn] = (uint16_t)(dd + 1);
            v->tok[nn] = (uint32_t)k;
            parent[nn] = path[dd];
            path[dd + 1] = nn;
            nn++;
        }
        plen = key->len;
        if (key->len > v->max_depth)
            v->max_depth = (uint32_t)key->len;
        v->ids[k] = key->id;
        prev = key;
    }
    for (size_t dd = plen; dd > 0; dd--)
        v->end[path[dd]] = nn;
    v->end[0] = nn;
    v->tok[nn] = (uint32_t)nk;
    v->n_nodes = nn;
    /* Children come after their parent in preorder: one backward pass. */
    uint8_t *u8 = (uint8_t *)path; /* UTF-8 state of the path to each node; 0xFF = not plain */
    if (nn > 65536 * sizeof(*path)) {
        u8 = malloc(nn);
        if (u8 == NULL) {
            free(keys);
            free(path);
            free(parent);
            wk_gvocab_free(v);
            return WK_ENOMEM;
        }
    }
    u8[0] = 0;
    for (uint32_t i = 1; i < nn; i++) {
        uint8_t ps = u8[parent[i]];
        gm_frame fr = {.aux = ps};
        bool ok = false;
        if (ps != 0xFF && !gm_utf8(&fr, v->byte[i], &ok))
            ok = gm_plain_byte(v->byte[i]);
        u8[i] = ok ? (uint8_t)fr.aux : 0xFF;
    }
    for (uint32_t i = 0; i < nn; i++)
        v->plain[i] = (uint8_t)((i == 0 || gm_plain_byte(v->byte[i])) | (u8[i] != 0xFF ? 2 : 0));
    for (uint32_t i = nn; i-- > 1;) {
        if (!(v->plain[i] & 1))
            v->plain[parent[i]] &= (uint8_t)~1;
        if (!(v->plain[i] & 2))
            v->plain[parent[i]] &= (uint8_t)~2;
    }
    if (u8 != (uint8_t *)path)
        free(u8);
    free(parent);
    free(path);
    free(keys);
    *out = v;
    return WK_OK;
}

size_t
wk_gmatch_allowed(const wk_gmatch *mc, const wk_gvocab *v, uint64_t *mask)
{
    wk_gmatch *m = (wk_gmatch *)mc; /* the scratch stack is a cache, not state */
    size_t words = ((size_t)v->n_tokens + 63) / 64;
    memset(mask, 0, words * sizeof(*mask));
    size_t count = 0;
    if (m->scratch_n < (size_t)v->max_depth + 1) {
        size_t nd = (size_t)v->max_depth + 1;
        gm_state *ns = realloc(m->scratch, nd * sizeof(*ns));
        if (ns != NULL)
            m->scratch = ns;
        gm_state **nc = realloc(m->cur, nd * sizeof(*nc));
        if (nc != NULL)
            m->cur = nc;
        if (ns == NULL || nc == NULL)
            return 0;
        m->scratch_n = nd;
    }
    /*
     * cur[d]: the state after the first d bytes of the current path. A plain
     * byte in an idle string leaves it as it is, so cur[d] then points at
     * cur[d - 1] (no copy), and a subtree of plain bytes is taken whole.
     */
    gm_state **cur = m->cur;
    cur[0] = &m->st;
    bool root_idle = gm_plain_idle(m->g, &m->st);
    for (uint32_t i = 1; i < v->n_nodes;) {
        uint32_t dep = v->depth[i];
        const gm_state *up = cur[dep - 1];
        bool idle = gm_plain_idle(m->g, up);
        if ((root_idle && (v->plain[i] & 2)) ||
            (idle && gm_plain_byte(v->byte[i]) && (v->plain[i] & 1))) {
            /* The whole subtree is allowed. */
            uint32_t e = v->end[i];
            for (uint32_t t = v->tok[i]; t < v->tok[e]; t++) {
                uint32_t id = v->ids[t];
                mask[id / 64] |= 1ull << (id % 64);
            }
            count += v->tok[e] - v->tok[i];
            i = e;
            continue;
        }
        if (idle && gm_plain_byte(v->byte[i])) {
            cur[dep] = (gm_state *)up;
        } else {
            gm_state *st = &m->scratch[dep];
            gm_state_copy(st, up);
            if (!gm_feed(m->g, st, v->byte[i])) {
                i = v->end[i];
                continue;
            }
            cur[dep] = st;
        }
        for (uint32_t t = v->tok[i]; t < v->tok[i + 1]; t++) {
            /* the tokens that end exactly here */
            uint32_t id = v->ids[t];
            mask[id / 64] |= 1ull << (id % 64);
            count++;
        }
        i++;
    }
    /* Control tokens, one by one: every byte must be fixed text of the grammar. */
    for (uint32_t k = 0; k < v->n_lit; k++) {
        gm_state *st = &m->scratch[0];
        gm_state_copy(st, &m->st);
        bool ok = true, sep = false; /* sep: a "\n" that the marker must follow next */
        for (uint32_t j = v->lit_off[k]; ok && j < v->lit_off[k + 1]; j++) {
            int how = GM_FREE;
            ok = gm_feed_fixed(m->g, st, v->lit_bytes[j], &how) && how != GM_FREE &&
                 !(sep && how != GM_FIXED);
            sep = how == GM_SEP;
        }
        if (ok && !sep) {
            uint32_t id = v->lit_ids[k];
            mask[id / 64] |= 1ull << (id % 64);
            count++;
        }
    }
    if (v->eos >= 0 && (uint32_t)v->eos < v->n_tokens && wk_gmatch_accepting(m)) {
        mask[(uint32_t)v->eos / 64] |= 1ull << ((uint32_t)v->eos % 64);
        count++;
    }
    return count;
}

/* ---- the compiler ---- */

typedef struct gm_cc {
    wk_grammar *g;
    wk_diag *d;
    wk_err err;
    wk_toolcall_fmt format;
} gm_cc;

static bool
gm_grow(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    uint32_t nc = *cap ? *cap : 64;
    while (nc < need)
        nc *= 2;
    void *np = realloc(*p, (size_t)nc * elem);
    if (np == NULL)
        return false;
    *p = np;
    *cap = nc;
    return true;
}

static uint32_t gm_fail(gm_cc *c, wk_err err, const char *fmt, ...) WK_PRINTF(3, 4);

static uint32_t
gm_fail(gm_cc *c, wk_err err, const char *fmt, ...)
{
    if (c->err == WK_OK) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        c->err = err;
        wk_diag_set(c->d, err, "%s", msg);
    }
    return 0;
}

static uint32_t
gm_oom(gm_cc *c)
{
    return gm_fail(c, WK_ENOMEM, "out of memory");
}

static uint32_t
gm_bytes(gm_cc *c, const void *p, size_t n)
{
    wk_grammar *g = c->g;
    if (n > 1u << 20 || !gm_grow((void **)&g->bytes, &g->cap_bytes, g->n_bytes + (uint32_t)n + 1, 1))
        return gm_oom(c), 0;
    uint32_t off = g->n_bytes;
    memcpy(g->bytes + off, p, n);
    g->n_bytes += (uint32_t)n;
    return off;
}

static uint32_t
gm_node_new(gm_cc *c, gm_kind kind)
{
    wk_grammar *g = c->g;
    if (c->err != WK_OK)
        return 0;
    if (!gm_grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(gm_node)))
        return gm_oom(c);
    memset(&g->nodes[g->n_nodes], 0, sizeof(gm_node));
    g->nodes[g->n_nodes].kind = (uint8_t)kind;
    return g->n_nodes++;
}

static uint32_t
gm_lit(gm_cc *c, const char *s, size_t n)
{
    uint32_t id = gm_node_new(c, N_LIT);
    if (c->err != WK_OK)
        return 0;
    c->g->nodes[id].str = gm_bytes(c, s, n);
    c->g->nodes[id].len = (uint32_t)n;
    return id;
}

static uint32_t
gm_seq(gm_cc *c, const uint32_t *kids, uint32_t n)
{
    uint32_t id = gm_node_new(c, N_SEQ);
    wk_grammar *g = c->g;
    if (c->err != WK_OK)
        return 0;
    if (!gm_grow((void **)&g->kids, &g->cap_kids, g->n_kids + n, sizeof(uint32_t)))
        return gm_oom(c);
    g->nodes[id].first = g->n_kids;
    g->nodes[id].n = n;
    memcpy(g->kids + g->n_kids, kids, n * sizeof(uint32_t));
    g->n_kids += n;
    return id;
}

/* A pending candidate before sorting. */
typedef struct gm_pcand {
    char *s;         /* bytes, owned */
    size_t len;      /* length */
    uint32_t child;  /* node after it */
    bool required;   /* objects: a required property */
} gm_pcand;

static int
gm_pcand_cmp(const void *a, const void *b)
{
    const gm_pcand *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int r = memcmp(x->s, y->s, n);
    return r != 0 ? r : (x->len > y->len) - (x->len < y->len);
}

/* Sorts pc and stores it as node id's candidates; frees the strings. */
static void
gm_set_cands(gm_cc *c, uint32_t id, gm_pcand *pc, uint32_t n)
{
    wk_grammar *g = c->g;
    qsort(pc, n, sizeof(*pc), gm_pcand_cmp);
    for (uint32_t i = 0; i + 1 < n && c->err == WK_OK; i++) {
        if (pc[i].len == pc[i + 1].len && memcmp(pc[i].s, pc[i + 1].s, pc[i].len) == 0)
            gm_fail(c, WK_EINVAL, "duplicate name or enum value '%s'", pc[i].s);
    }
    if (c->err == WK_OK &&
        !gm_grow((void **)&g->cands, &g->cap_cands, g->n_cands + n, sizeof(gm_cand)))
        gm_oom(c);
    if (c->err == WK_OK) {
        g->nodes[id].first = g->n_cands;
        g->nodes[id].n = n;
        for (uint32_t i = 0; i < n; i++) {
            gm_cand *k = &g->cands[g->n_cands + i];
            k->str = gm_bytes(c, pc[i].s, pc[i].len);
            k->len = (uint32_t)pc[i].len;
            k->child = pc[i].child;
            if (pc[i].required)
                g->nodes[id].required |= 1ull << i;
        }
        g->n_cands += n;
    }
    for (uint32_t i = 0; i < n; i++)
        free(pc[i].s);
}

static char *
gm_concat(const char *a, size_t na, const char *b, size_t *len)
{
    size_t nb = strlen(b);
    char *s = malloc(na + nb + 1);
    if (s == NULL)
        return NULL;
    memcpy(s, a, na);
    memcpy(s + na, b, nb + 1);
    *len = na + nb;
    return s;
}

/* Function and property names: 1..64 bytes of [A-Za-z0-9_.$:-] (names travel inside the format's markup). */
static bool
gm_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > WK_GRAMMAR_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '-' || ch == '.' || ch == '$' || ch == ':'))
            return false;
    }
    return true;
}

static const char *const gm_ignored[] = {"description", "title", "default", "examples", "format",
                                         "$schema", "$comment", "additionalProperties", "strict",
                                         NULL};

static uint8_t
gm_type_bit(const char *t)
{
    static const char *const names[] = {"string", "number", "integer", "boolean", "null",
                                        "object", "array"};
    for (int i = 0; i < 7; i++) {
        if (strcmp(t, names[i]) == 0)
            return (uint8_t)(1u << i);
    }
    return 0;
}

static uint32_t gm_schema(gm_cc *c, json_t *sch, const char *path, int depth, bool xml_params);

/* The text of one enum value in the XML format: a string raw, anything else as JSON. */
static char *
gm_enum_text(json_t *v, bool xml)
{
    if (xml && json_is_string(v))
        return strdup(json_string_value(v));
    return json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
}

/* An enum as a choice; suffix follows every value (XML: the parameter's end). */
static uint32_t
gm_enum(gm_cc *c, json_t *en, const char *path, bool xml, const char *suffix)
{
    size_t n = json_array_size(en);
    if (!json_is_array(en) || n == 0 || n > WK_GM_ENUM_MAX)
        return gm_fail(c, WK_EINVAL, "%s: 'enum' must be an array of 1 to 256 values", path);
    gm_pcand *pc = calloc(n, sizeof(*pc));
    if (pc == NULL)
        return gm_oom(c);
    uint32_t id = gm_node_new(c, N_CHOICE);
    size_t i;
    json_t *v;
    json_array_foreach(en, i, v)
    {
        if (json_is_object(v) || json_is_array(v)) {
            gm_fail(c, WK_EINVAL, "%s: enum values must be strings, numbers, booleans or null",
                    path);
            break;
        }
        char *t = gm_enum_text(v, xml);
        if (t == NULL) {
            gm_oom(c);
            break;
        }
        if (xml && strstr(t, "</parameter>") != NULL)
            gm_fail(c, WK_EINVAL, "%s: an enum value contains '</parameter>'", path);
        pc[i].s = gm_concat(t, strlen(t), suffix, &pc[i].len);
        free(t);
        if (pc[i].s == NULL) {
            gm_oom(c);
            break;
        }
    }
    if (c->err == WK_OK) {
        c->g->nodes[id].lookahead = suffix[0] == '\0';
        gm_set_cands(c, id, pc, (uint32_t)n);
    } else {
        for (size_t k = 0; k < n; k++)
            free(pc[k].s);
    }
    free(pc);
    return c->err == WK_OK ? id : 0;
}

/*
 * The schema's choice of values: its 'enum', or its 'const' as an enum of
 * that one value (Open WebUI 0.12's builtin tools use it). A new reference,
 * NULL when the schema has neither (or on error, set in c).
 */
static json_t *
gm_enum_get(gm_cc *c, json_t *sch, const char *path)
{
    json_t *en = json_object_get(sch, "enum");
    json_t *cst = json_object_get(sch, "const");
    if (cst == NULL)
        return json_incref(en);
    if (en != NULL) {
        gm_fail(c, WK_EINVAL, "%s: 'const' together with 'enum' is not supported", path);
        return NULL;
    }
    if (json_is_object(cst) || json_is_array(cst)) {
        gm_fail(c, WK_EINVAL, "%s: 'const' must be a string, number, boolean or null", path);
        return NULL;
    }
    json_t *one = json_array();
    if (one == NULL || json_array_append(one, cst) != 0) {
        json_decref(one);
        gm_oom(c);
        return NULL;
    }
    return one;
}

static bool
gm_has_enum(json_t *sch)
{
    return json_object_get(sch, "enum") != NULL || json_object_get(sch, "const") != NULL;
}

/* A property's value in the XML format: raw text, an enum, or JSON, each ending the parameter. */
static uint32_t
gm_xml_value(gm_cc *c, json_t *sch, const char *path, int depth)
{
    if (gm_has_enum(sch)) {
        /* Check the rest of the schema too. */
        if (gm_schema(c, sch, path, depth, false) == 0 && c->err != WK_OK)
            return 0;
        json_t *en = gm_enum_get(c, sch, path);
        uint32_t id = en != NULL ? gm_enum(c, en, path, true, "\n</parameter>\n") : 0;
        json_decref(en);
        return c->err == WK_OK ? id : 0;
    }
    uint32_t val = gm_schema(c, sch, path, depth, false);
    if (c->err != WK_OK)
        return 0;
    if (c->g->nodes[val].types & T_STRING) {
        uint32_t raw = gm_node_new(c, N_RAW);
        if (c->err != WK_OK)
            return 0;
        c->g->nodes[raw].str = gm_bytes(c, "</parameter>", 12);
        c->g->nodes[raw].len = 12;
        c->g->nodes[raw].lookahead = 1;
        c->g->nodes[raw].no_closers = 1;
        uint32_t kids[2] = {raw, gm_lit(c, "\n", 1)};
        return gm_seq(c, kids, 2);
    }
    uint32_t kids[2] = {val, gm_lit(c, "\n</parameter>\n", 14)};
    return gm_seq(c, kids, 2);
}

/* The properties of an object schema as candidates of node id. */
static void
gm_props(gm_cc *c, uint32_t id, json_t *sch, const char *path, int depth, bool xml)
{
    json_t *props = json_object_get(sch, "properties");
    json_t *req = json_object_get(sch, "required");
    if (props != NULL && !json_is_object(props)) {
        gm_fail(c, WK_EINVAL, "%s: 'properties' must be an object", path);
        return;
    }
    if (req != NULL && !json_is_array(req)) {
        gm_fail(c, WK_EINVAL, "%s: 'required' must be an array of names", path);
        return;
    }
    size_t n = json_object_size(props);
    if (n > WK_GRAMMAR_PROPS_MAX) {
        gm_fail(c, WK_EINVAL, "%s: more than 64 properties", path);
        return;
    }
    size_t i;
    json_t *r;
    json_array_foreach(req, i, r)
    {
        if (!json_is_string(r) || json_object_get(props, json_string_value(r)) == NULL) {
            gm_fail(c, WK_EINVAL, "%s: 'required' names '%s', which is not in 'properties'", path,
                    json_is_string(r) ? json_string_value(r) : "?");
            return;
        }
    }
    gm_pcand *pc = calloc(n ? n : 1, sizeof(*pc));
    if (pc == NULL) {
        gm_oom(c);
        return;
    }
    const char *key;
    json_t *ps;
    size_t k = 0;
    json_object_foreach(props, key, ps)
    {
        size_t pl = strlen(path) + strlen(key) + 16;
        char *sub = malloc(pl);
        if (sub == NULL) {
            gm_oom(c);
            break;
        }
        snprintf(sub, pl, "%s.properties.%s", path, key);
        if (!gm_name_ok(key)) {
            gm_fail(c, WK_EINVAL, "%s: property name not supported (1 to 64 of A-Z a-z 0-9 _ - . $ :)",
                    sub);
            free(sub);
            break;
        }
        uint32_t child = xml ? gm_xml_value(c, ps, sub, depth + 1)
                             : gm_schema(c, ps, sub, depth + 1, false);
        free(sub);
        if (c->err != WK_OK)
            break;
        pc[k].s = gm_concat(key, strlen(key), xml ? ">\n" : "\"", &pc[k].len);
        pc[k].child = child;
        json_array_foreach(req, i, r)
        {
            if (strcmp(json_string_value(r), key) == 0)
                pc[k].required = true;
        }
        if (pc[k].s == NULL) {
            gm_oom(c);
            break;
        }
        k++;
    }
    if (c->err == WK_OK)
        gm_set_cands(c, id, pc, (uint32_t)k);
    else
        for (size_t q = 0; q < n; q++)
            free(pc[q].s);
    free(pc);
}

/*
 * A JSON value of schema sch at path (for messages). xml_params: the
 * function's parameters in the XML format (an N_XOBJ node).
 */
static uint32_t
gm_schema(gm_cc *c, json_t *sch, const char *path, int depth, bool xml_params)
{
    if (c->err != WK_OK)
        return 0;
    if (!json_is_object(sch))
        return gm_fail(c, WK_EINVAL, "%s: a schema must be an object", path);
    if (depth > WK_GRAMMAR_DEPTH_MAX)
        return gm_fail(c, WK_EINVAL, "%s: schema nested deeper than 16", path);
    const char *key;
    json_t *v;
    json_object_foreach(sch, key, v)
    {
        bool known = strcmp(key, "type") == 0 || strcmp(key, "properties") == 0 ||
                     strcmp(key, "required") == 0 || strcmp(key, "items") == 0 ||
                     strcmp(key, "enum") == 0 || strcmp(key, "const") == 0;
        for (int i = 0; !known && gm_ignored[i] != NULL; i++)
            known = strcmp(key, gm_ignored[i]) == 0;
        if (!known)
            return gm_fail(c, WK_EINVAL,
                           "%s: schema keyword '%s' is not supported by constrained tool calls",
                           path, key);
    }
    json_t *ap = json_object_get(sch, "additionalProperties");
    if (ap != NULL && !json_is_boolean(ap))
        return gm_fail(c, WK_EINVAL,
                       "%s: schema keyword 'additionalProperties' is supported only as a boolean",
                       path);
    uint8_t types = 0;
    json_t *t = json_object_get(sch, "type");
    bool has_en = gm_has_enum(sch);
    if (json_is_string(t)) {
        types = gm_type_bit(json_string_value(t));
        if (types == 0)
            return gm_fail(c, WK_EINVAL, "%s: unknown type '%s'", path, json_string_value(t));
    } else if (json_is_array(t) && json_array_size(t) > 0) {
        size_t i;
        json_array_foreach(t, i, v)
        {
            uint8_t b = json_is_string(v) ? gm_type_bit(json_string_value(v)) : 0;
            if (b == 0)
                return gm_fail(c, WK_EINVAL, "%s: 'type' lists an unknown type", path);
            types |= b;
        }
    } else if (t != NULL) {
        return gm_fail(c, WK_EINVAL, "%s: 'type' must be a type name or a list of them", path);
    } else if (!has_en) {
        if (xml_params || depth == 0)
            types = T_OBJECT; /* a function's parameters without a type: an object */
        else
            return gm_fail(c, WK_EINVAL, "%s: a schema needs 'type', 'enum' or 'const'", path);
    }
    if (xml_params && types != T_OBJECT)
        return gm_fail(c, WK_EINVAL, "%s: a function's parameters must be of type object", path);
    if ((types & T_ARRAY) && json_object_get(sch, "items") == NULL && !has_en)
        return gm_fail(c, WK_EINVAL, "%s: an array schema needs 'items'", path);
    uint32_t id = gm_node_new(c, xml_params ? N_XOBJ : N_VALUE);
    if (c->err != WK_OK)
        return 0;
    c->g->nodes[id].types = types;
    if (types & T_OBJECT)
        gm_props(c, id, sch, path, depth, xml_params);
    if ((types & T_ARRAY) && !has_en) {
        size_t pl = strlen(path) + 8;
        char *sub = malloc(pl);
        if (sub == NULL)
            return gm_oom(c);
        snprintf(sub, pl, "%s.items", path);
        uint32_t it = gm_schema(c, json_object_get(sch, "items"), sub, depth + 1, false);
        free(sub);
        c->g->nodes[id].items = it;
    }
    if (has_en && !xml_params) {
        json_t *en = gm_enum_get(c, sch, path);
        uint32_t ch = en != NULL ? gm_enum(c, en, path, false, "") : 0;
        json_decref(en);
        if (c->err != WK_OK)
            return 0;
        c->g->nodes[id].alt = ch;
        if (types == 0)
            c->g->nodes[id].types = T_STRING | T_NUMBER | T_BOOLEAN | T_NULL;
    }
    return c->err == WK_OK ? id : 0;
}

void
wk_grammar_free(wk_grammar *g)
{
    if (g == NULL)
        return;
    free(g->nodes);
    free(g->cands);
    free(g->kids);
    free(g->bytes);
    free(g);
}

wk_err
wk_grammar_compile(const wk_grammar_spec *spec, wk_grammar **out, wk_diag *d)
{
    *out = NULL;
    if (spec->format != WK_TOOLCALL_FMT_XML && spec->format != WK_TOOLCALL_FMT_HERMES &&
        spec->format != WK_TOOLCALL_FMT_GRANITE && spec->format != WK_TOOLCALL_FMT_NEMOTRON)
        return wk_diag_set(d, WK_EINVAL, "no tool-call format this model's template is known for");
    json_error_t je;
    json_t *tools = json_loadb(spec->tools ? spec->tools : "", spec->tools_len,
                               JSON_REJECT_DUPLICATES, &je);
    if (tools == NULL)
        return wk_diag_set(d, WK_EINVAL, "tools: %s", je.text);
    wk_grammar *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        json_decref(tools);
        return WK_ENOMEM;
    }
    gm_cc c = {.g = g, .d = d, .err = WK_OK, .format = spec->format};
    bool xml = spec->format == WK_TOOLCALL_FMT_XML;
    bool nemo = spec->format == WK_TOOLCALL_FMT_NEMOTRON;
    (void)gm_node_new(&c, N_LIT); /* node 0 means "none" */
    const char *closer = nemo ? "</TOOLCALL>" : "</tool_call>";
    g->closer_len = (uint32_t)strlen(closer);
    g->closer = gm_bytes(&c, closer, g->closer_len);
    g->lit_true = gm_lit(&c, "true", 4);
    g->lit_false = gm_lit(&c, "false", 5);
    g->lit_null = gm_lit(&c, "null", 4);
    size_t nt = json_array_size(tools);
    if (!json_is_array(tools) || nt == 0 || nt > WK_GRAMMAR_TOOLS_MAX)
        gm_fail(&c, WK_EINVAL, "tools: an array of 1 to 128 tools is needed");
    gm_pcand *pc = calloc(nt ? nt : 1, sizeof(*pc));
    if (pc == NULL)
        gm_oom(&c);
    uint32_t np = 0;
    for (size_t i = 0; i < nt && c.err == WK_OK; i++) {
        json_t *tool = json_array_get(tools, i);
        json_t *fn = json_object_get(tool, "function");
        json_t *nm = json_object_get(fn, "name");
        char path[64];
        snprintf(path, sizeof(path), "tools[%zu].function.parameters", i);
        if (!json_is_object(fn) || !json_is_string(nm)) {
            gm_fail(&c, WK_EINVAL, "tools[%s]: a function with a name is needed",
                    path + 6);
            break;
        }
        const char *name = json_string_value(nm);
        if (!gm_name_ok(name)) {
            gm_fail(&c, WK_EINVAL,
                    "function name '%s' is not supported (1 to 64 of A-Z a-z 0-9 _ - . $ :)",
                    name);
            break;
        }
        if (spec->function != NULL && strcmp(spec->function, name) != 0)
            continue;
        json_t *params = json_object_get(fn, "parameters");
        json_t *empty = NULL;
        if (params == NULL)
            params = empty = json_object();
        uint32_t body = gm_schema(&c, params, path, 0, xml);
        json_decref(empty);
        if (c.err != WK_OK)
            break;
        if (!xml && !(g->nodes[body].types & T_OBJECT && g->nodes[body].types == T_OBJECT)) {
            gm_fail(&c, WK_EINVAL, "%s: a function's parameters must be of type object", path);
            break;
        }
        pc[np].s = gm_concat(name, strlen(name), xml ? ">\n" : "\", \"arguments\": ", &pc[np].len);
        pc[np].child = body;
        if (pc[np].s == NULL) {
            gm_oom(&c);
            break;
        }
        np++;
    }
    if (c.err == WK_OK && np == 0)
        gm_fail(&c, WK_EINVAL, "tool_choice names function '%s', which is not in tools",
                spec->function ? spec->function : "");
    uint32_t names = 0;
    if (c.err == WK_OK) {
        names = gm_node_new(&c, N_CHOICE);
        gm_set_cands(&c, names, pc, np);
    } else {
        for (uint32_t i = 0; i < np; i++)
            free(pc[i].s);
    }
    free(pc);
    json_decref(tools);
    if (c.err == WK_OK) {
        /* One call; the separator between calls; around the list (Nemotron's block). */
        const char *head = xml ? "<tool_call>\n<function="
                               : nemo ? "{\"name\": \"" : "<tool_call>\n{\"name\": \"";
        const char *tail = xml ? "</tool_call>" : nemo ? "}" : "}\n</tool_call>";
        const char *sep = nemo ? ", " : "\n";
        uint32_t call_kids[3] = {gm_lit(&c, head, strlen(head)), names,
                                 gm_lit(&c, tail, strlen(tail))};
        uint32_t call = gm_seq(&c, call_kids, 3);
        uint32_t more_kids[2] = {gm_lit(&c, sep, strlen(sep)), call};
        uint32_t more = gm_seq(&c, more_kids, 2);
        uint32_t calls = gm_node_new(&c, N_CALLS);
        if (c.err == WK_OK) {
            g->nodes[calls].items = call;
            g->nodes[calls].alt = more;
            g->nodes[calls].parallel = spec->parallel;
            g->root = calls;
        }
        if (nemo) {
            uint32_t kids[3] = {gm_lit(&c, "<TOOLCALL>[", 11), calls,
                                gm_lit(&c, "]</TOOLCALL>", 12)};
            g->root = gm_seq(&c, kids, 3);
            calls = g->root;
        }
        if (c.err == WK_OK && spec->prefix_until != NULL && spec->prefix_until[0] != '\0') {
            size_t pl = strlen(spec->prefix_until);
            if (memchr(spec->prefix_until + 1, spec->prefix_until[0], pl - 1) != NULL) {
                gm_fail(&c, WK_EINVAL, "reasoning end marker '%s' repeats its first byte",
                        spec->prefix_until);
            } else {
                uint32_t raw = gm_node_new(&c, N_RAW);
                if (c.err == WK_OK) {
                    g->nodes[raw].str = gm_bytes(&c, spec->prefix_until, pl);
                    g->nodes[raw].len = (uint32_t)pl;
                }
                uint32_t kids[3] = {raw, gm_node_new(&c, N_WS), calls};
                g->root = gm_seq(&c, kids, 3);
            }
        }
    }
    if (c.err != WK_OK) {
        wk_grammar_free(g);
        return c.err;
    }
    *out = g;
    return WK_OK;
}
