/*
 * wk_jinja_priv.h: what the wk_jinja_*.c files share: the arena, the syntax
 * tree the parser builds (wk_jinja_parse.c), the Python-like values the
 * evaluator works on (wk_jinja_value.c) and the render state
 * (wk_jinja_eval.c, wk_jinja_builtin.c). Not a public interface.
 */
#ifndef WK_JINJA_PRIV_H
#define WK_JINJA_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "wk_err.h"
#include "wk_jinja.h"

/* ---- arena: every node of a template, every value of a render ---- */

typedef struct jj_chunk jj_chunk;
typedef struct jj_arena {
    jj_chunk *head; /* newest chunk first */
    size_t used;    /* bytes handed out (and chunk overhead) */
    size_t limit;   /* jj_alloc fails past this many bytes */
    bool over;      /* a jj_alloc failed for the limit (not for malloc) */
} jj_arena;

void *jj_alloc(jj_arena *a, size_t n); /* zeroed; NULL past the limit or on ENOMEM */
void jj_arena_fini(jj_arena *a);       /* frees every chunk; NULL-safe */
char *jj_strdup(jj_arena *a, const char *s, size_t n); /* NUL-terminated copy */

/* ---- values ---- */

typedef enum jv_type {
    JV_UNDEF, /* jinja2's Undefined: prints "", iterates empty, fails when used */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST, /* list, or tuple when l->tuple */
    JV_DICT,
    JV_NS,    /* namespace(): a dict whose keys are attributes */
    JV_MACRO, /* a {% macro %} */
    JV_FUNC,  /* a global function (range, namespace, raise_exception, ...) */
    JV_BOUND, /* a method looked up but not called yet: obj.name */
    JV_LOOP,  /* the loop variable of a for loop */
} jv_type;

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jmacro jmacro;
typedef struct jbound jbound;
typedef struct jloop jloop;

typedef struct jv {
    uint8_t t;  /* jv_type */
    uint8_t mk; /* JV_STR: a markupsafe Markup (from safe/escape): "+" escapes plain text */
    union {
        bool b;    /* JV_BOOL */
        int64_t i; /* JV_INT; JV_FUNC: which function */
        double f;  /* JV_FLOAT */
        struct {
            const char *p; /* JV_STR bytes (UTF-8, not NUL-terminated); JV_UNDEF: the name */
            size_t n;      /* their length */
        } s;
        jlist *l;   /* JV_LIST */
        jdict *d;   /* JV_DICT, JV_NS */
        jmacro *m;  /* JV_MACRO */
        jbound *bm; /* JV_BOUND */
        jloop *lp;  /* JV_LOOP */
    } u;
} jv;

/* What a JV_LIST is in Python terms (jinja2 hands out iterators in places). */
enum {
    JL_PLAIN,   /* a list, or a tuple */
    JL_GEN,     /* a generator (select, map, items filter ...): no len, no index, always true */
    JL_REVITER, /* reversed(list): like a generator */
    JL_ITEMS,   /* dict.items(): len, no index */
    JL_KEYS,    /* dict.keys() */
    JL_VALUES,  /* dict.values() */
};

struct jlist {
    size_t n, cap; /* items used, allocated */
    jv *v;         /* items */
    bool tuple;    /* printed as a tuple */
    uint8_t kind;  /* JL_* */
    bool used;     /* a generator already iterated (it yields nothing more) */
};

static inline bool
jj_plain(jv v)
{
    return v.t == JV_LIST && v.u.l->kind == JL_PLAIN;
}

struct jdict {
    size_t n, cap; /* entries used, allocated */
    jv *k, *v;     /* keys and values, in insertion order */
};

struct jbound {
    jv obj;           /* the object */
    const char *name; /* the method's name (NUL-terminated, template-owned) */
};

/* ---- syntax tree ---- */

typedef enum jn_kind {
    /* expressions */
    JN_LIT,     /* lit */
    JN_NAME,    /* name */
    JN_LIST,    /* kids */
    JN_TUPLE,   /* kids */
    JN_DICT,    /* kids: key, value, key, value ... */
    JN_GETATTR, /* a.name */
    JN_GETITEM, /* a[b] */
    JN_SLICE,   /* a[b:c:d], any of b c d NULL */
    JN_CALL,    /* a(kids), names[i] for keyword arguments */
    JN_FILTER,  /* a | name(kids); a NULL in a filter block */
    JN_TEST,    /* a is [not] name(kids); op 1 when negated */
    JN_NEG,     /* -a */
    JN_POS,     /* +a */
    JN_NOT,     /* not a */
    JN_BINOP,   /* a op b, op a JJ_OP_* */
    JN_CONCAT,  /* a ~ b */
    JN_AND,     /* a and b */
    JN_OR,      /* a or b */
    JN_COMPARE, /* a (ops[i] kids[i])... */
    JN_COND,    /* b if a else c (c may be NULL) */
    /* statements */
    JN_BODY,     /* kids */
    JN_TEXT,     /* lit (a string) */
    JN_OUTPUT,   /* {{ a }} */
    JN_IF,       /* if a: b else c */
    JN_FOR,      /* for names[0..nnames) in a [if d]: b else c */
    JN_SET,      /* set name[.attr] = a, or names = a */
    JN_SETBLOCK, /* set name %}b{% endset, then filter d (input NULL) when given */
    JN_MACRO,    /* macro name(names = kids defaults) body b */
    JN_BREAK,
    JN_CONTINUE,
    JN_FILTERBLOCK, /* filter d (input NULL) %}b{% endfilter */
    JN_CALLBLOCK,   /* call a (a JN_CALL) %}b{% endcall */
} jn_kind;

enum {
    JJ_OP_ADD,
    JJ_OP_SUB,
    JJ_OP_MUL,
    JJ_OP_DIV,
    JJ_OP_FLOORDIV,
    JJ_OP_MOD,
    JJ_OP_POW,
    JJ_OP_EQ,
    JJ_OP_NE,
    JJ_OP_LT,
    JJ_OP_LE,
    JJ_OP_GT,
    JJ_OP_GE,
    JJ_OP_IN,
    JJ_OP_NOTIN,
};

typedef struct jnode jnode;
struct jnode {
    uint8_t kind;         /* jn_kind */
    uint8_t op;           /* JJ_OP_* for JN_BINOP; 1 for a negated test */
    int line;             /* source line (1-based) */
    int fid;              /* filter/test id resolved at parse, -1 unknown */
    const char *name;     /* NAME, GETATTR, FILTER, TEST, SET, MACRO, attribute of SET */
    const char *attr;     /* JN_SET on a namespace: the attribute */
    jnode *a, *b, *c, *d; /* operands, see jn_kind */
    jnode **kids;         /* arguments, items, statements */
    const char **names;   /* keyword names of kids (NULL entries: positional); FOR/SET targets */
    uint8_t *ops;         /* JN_COMPARE: the operator before each of kids */
    size_t n;             /* number of kids */
    size_t nnames;        /* number of names (FOR/SET targets, MACRO parameters) */
    jv lit;               /* JN_LIT, JN_TEXT */
    const char **undefs;  /* JN_BODY of a scope: names jinja2 binds to Undefined on entry */
    size_t nundefs;       /* their number */
};

struct wk_jinja {
    jj_arena arena; /* every node and string of the template */
    jnode *root;    /* JN_BODY */
};

/* filters and tests known to the evaluator (wk_jinja_builtin.c) */
int jj_filter_id(const char *name);
int jj_test_id(const char *name);
bool jj_jinja2_knows(const char *name,
                     bool filter); /* a filter/test jinja2 has (we may refuse it) */

/* ---- UTF-8 and Python text helpers (wk_jinja_value.c) ---- */

size_t jj_utf8_len(const char *s, size_t n);            /* code points (invalid bytes: 1 each) */
size_t jj_utf8_next(const char *s, size_t n, size_t i); /* byte index of the next code point */
uint32_t jj_utf8_cp(const char *s, size_t n, size_t i, size_t *next); /* decode at i */
void jj_utf8_put(char *buf, size_t *o, uint32_t cp);                  /* encode (<= 4 bytes) */
size_t jj_space_len(const char *s, size_t n);          /* a str.isspace() char at s, or 0 */
size_t jj_space_len_back(const char *s, size_t n);     /* one ending at s + n, or 0 */
void jj_format_float(double f, char *buf, size_t cap); /* Python repr(float) */

/* ---- render state (wk_jinja_eval.c) ---- */

typedef struct jj_frame jj_frame;

/* A string being built in the render arena. */
typedef struct jj_sb {
    char *p;       /* bytes */
    size_t n, cap; /* used, allocated */
    bool top;      /* the render's output: max_output applies */
} jj_sb;

typedef struct jj_rt {
    jj_arena ar;         /* every value of this render */
    const wk_jinja *t;   /* the template */
    wk_jinja_limits lim; /* limits in force */
    uint64_t steps;      /* steps taken */
    unsigned depth;      /* macro call depth */
    int line;            /* line of the node being evaluated (for errors) */
    wk_err err;          /* first error */
    wk_diag *d;          /* where its message goes */
    jj_frame *globals;   /* the template's top-level frame */
    jj_frame *frame;     /* the innermost scope now */
    jj_sb *out;          /* where output goes now */
} jj_rt;

/* Records the first error ("line L: ..." unless raw) and returns -1. */
int jj_fail(jj_rt *R, wk_err e, const char *fmt, ...) WK_PRINTF(3, 4);
int jj_raise(jj_rt *R, const char *msg, size_t n); /* raise_exception(msg): message verbatim */
int jj_oom(jj_rt *R);                              /* the memory limit or ENOMEM */
int jj_step(jj_rt *R, uint64_t n);                 /* counts n steps; -1 past max_steps */

int jj_sb_put(jj_rt *R, jj_sb *b, const char *s, size_t n);
int jj_sb_puts(jj_rt *R, jj_sb *b, const char *s);
jv jj_sb_value(const jj_sb *b); /* the built string as a value (shares the bytes) */

/* values (wk_jinja_value.c) */
jv jj_str(const char *p, size_t n);
jv jj_int(int64_t i);
jv jj_bool(bool b);
jv jj_none(void);
jv jj_undef(const char *name);
jlist *jj_list_new(jj_rt *R, size_t cap);
int jj_list_push(jj_rt *R, jlist *l, jv v);
jdict *jj_dict_new(jj_rt *R, size_t cap);
int jj_dict_set(jj_rt *R, jdict *d, jv k, jv v);
bool jj_dict_get(const jdict *d, const char *k, size_t kn, jv *out);
bool jj_dict_getv(const jdict *d, jv k, jv *out);
bool jj_truthy(jv v);
bool jj_eq(jv a, jv b);
bool jj_is_str(jv v, const char *s);      /* v is the string s */
const char *jj_type_name(jv v);           /* Python's type name: "str", "NoneType", ... */
int jj_to_str(jj_rt *R, jv v, jj_sb *b);  /* Python's str(v) */
int jj_to_repr(jj_rt *R, jv v, jj_sb *b); /* Python's repr(v) */
int jj_strv(jj_rt *R, jv v, jv *out);     /* str(v) as a value (strings as they are) */
int jj_from_json(jj_rt *R, const json_t *j, jv *out, int depth);

/* transformers' tojson: json.dumps(v, ensure_ascii, indent, separators, sort_keys) */
typedef struct jj_json_opt {
    const char *indent;             /* NULL: no newlines; else the string per level */
    size_t indent_n;                /* its length */
    const char *item_sep, *key_sep; /* separators */
    bool sort_keys;
    bool ensure_ascii;
} jj_json_opt;
int jj_to_json(jj_rt *R, jv v, const jj_json_opt *o, jj_sb *b, int level);

/* evaluator services for the builtins (wk_jinja_eval.c) */
int jj_iter(jj_rt *R, jv v, jlist **out); /* the items a for loop over v sees */
int jj_getattr(jj_rt *R, jv obj, const char *name, jv *out);
int jj_getitem(jj_rt *R, jv obj, jv key, jv *out);
int jj_call_value(jj_rt *R, jv fn, jv *args, const char **names, size_t n, jv *out);

/* builtins (wk_jinja_builtin.c) */
int jj_filter(jj_rt *R, int id, const char *name, jv in, jv *args, const char **names, size_t n,
              jv *out);
int jj_test(jj_rt *R, int id, const char *name, jv in, jv *args, size_t n, bool *out);
/* 1 when obj has a method called name (*unsafe: one the immutable sandbox forbids), else 0 */
int jj_method_kind(jv obj, const char *name, bool *unsafe);
int jj_method(jj_rt *R, jv obj, const char *name, jv *args, const char **names, size_t n, jv *out);
int jj_global(const char *name); /* a global function's id, -1 if none */
int jj_func(jj_rt *R, int fn, jv *args, const char **names, size_t n, jv *out);
int jj_compare(jj_rt *R, int op, jv a, jv b, bool *out);
int jj_binop(jj_rt *R, int op, jv a, jv b, jv *out);
int jj_slice(jj_rt *R, jv obj, jv start, jv stop, jv step, jv *out);

#endif /* WK_JINJA_PRIV_H */
