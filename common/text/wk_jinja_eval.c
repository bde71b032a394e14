/*
 * wk_jinja_eval: walks a parsed template and writes its output, with
 * jinja2's runtime rules as transformers configures them: scoping (a for
 * loop's body and a macro's body are scopes, if is not; namespace() crosses
 * them), the loop variable, macros with defaults and caller, jinja2's
 * lenient lookups (a missing key or index is Undefined, using an Undefined
 * fails) and the immutable sandbox (no method that changes a list or dict).
 * Every render has its own arena and counters; a limit reached stops the
 * render with WK_ETOOBIG, never a crash or a hang.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_jinja_priv.h"

/* A scope: names and values, looked up innermost first. */
struct jj_frame {
    jj_frame *parent;   /* enclosing scope; NULL for the globals */
    const char **names; /* variable names */
    jv *vals;           /* their values */
    size_t n, cap;
};

struct jmacro {
    const jnode *def;  /* JN_MACRO node; NULL for a call block's caller */
    const jnode *body; /* what it renders */
    jj_frame *closure; /* scope it was defined in */
    const char *name;  /* its name */
};

struct jloop {
    jlist *items; /* what is iterated */
    size_t i;     /* index0 */
    int depth;    /* loop.depth */
};

/* ---- errors, limits, strings ---- */

int
jj_fail(jj_rt *R, wk_err e, const char *fmt, ...)
{
    if (R->err != WK_OK)
        return -1;
    R->err = e;
    if (R->d != NULL) {
        char msg[440];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        wk_diag_set(R->d, e, "line %d: %s", R->line, msg);
    }
    return -1;
}

int
jj_raise(jj_rt *R, const char *msg, size_t n)
{
    if (R->err != WK_OK)
        return -1;
    R->err = WK_EINVAL;
    if (R->d != NULL)
        wk_diag_set(R->d, WK_EINVAL, "%.*s", (int)(n > 500 ? 500 : n), msg);
    return -1;
}

int
jj_oom(jj_rt *R)
{
    if (R->ar.over)
        return jj_fail(R, WK_ETOOBIG, "template used more than max_memory (%zu bytes)",
                       R->ar.limit);
    return jj_fail(R, WK_ENOMEM, "out of memory");
}

int
jj_step(jj_rt *R, uint64_t n)
{
    R->steps += n;
    if (R->steps > R->lim.max_steps)
        return jj_fail(R, WK_ETOOBIG, "template took more than max_steps (%llu)",
                       (unsigned long long)R->lim.max_steps);
    return 0;
}

int
jj_sb_put(jj_rt *R, jj_sb *b, const char *s, size_t n)
{
    if (n == 0)
        return 0;
    if (b->top && b->n + n > R->lim.max_output)
        return jj_fail(R, WK_ETOOBIG, "output over max_output (%zu bytes)", R->lim.max_output);
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n)
            cap *= 2;
        char *p;
        if (b->top) {
            if (jj_step(R, cap / 64) < 0)
                return -1;
            p = realloc(b->p, cap);
        } else {
            if (jj_step(R, cap / 64) < 0)
                return -1;
            p = jj_alloc(&R->ar, cap);
            if (p != NULL && b->n > 0)
                memcpy(p, b->p, b->n);
        }
        if (p == NULL)
            return jj_oom(R);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

int
jj_sb_puts(jj_rt *R, jj_sb *b, const char *s)
{
    return jj_sb_put(R, b, s, strlen(s));
}

jv
jj_sb_value(const jj_sb *b)
{
    return jj_str(b->p != NULL ? b->p : "", b->n);
}

/* ---- scopes ---- */

static jj_frame *
frame_new(jj_rt *R, jj_frame *parent)
{
    jj_frame *f = jj_alloc(&R->ar, sizeof *f);
    if (f == NULL) {
        jj_oom(R);
        return NULL;
    }
    f->parent = parent;
    return f;
}

static int
frame_set(jj_rt *R, jj_frame *f, const char *name, jv v)
{
    for (size_t i = 0; i < f->n; i++) {
        if (strcmp(f->names[i], name) == 0) {
            f->vals[i] = v;
            return 0;
        }
    }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        const char **nn = jj_alloc(&R->ar, cap * sizeof *nn);
        jv *nv = jj_alloc(&R->ar, cap * sizeof *nv);
        if (nn == NULL || nv == NULL)
            return jj_oom(R);
        if (f->n > 0) {
            memcpy(nn, f->names, f->n * sizeof *nn);
            memcpy(nv, f->vals, f->n * sizeof *nv);
        }
        f->names = nn;
        f->vals = nv;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n] = v;
    f->n++;
    return 0;
}

static bool
frame_get(const jj_frame *f, const char *name, jv *out)
{
    for (; f != NULL; f = f->parent) {
        for (size_t i = f->n; i-- > 0;) {
            if (strcmp(f->names[i], name) == 0) {
                *out = f->vals[i];
                return true;
            }
        }
    }
    return false;
}

/* A new scope for body: a frame under parent with the names jinja2 starts Undefined. */
static jj_frame *
scope_new(jj_rt *R, jj_frame *parent, const jnode *body)
{
    jj_frame *f = frame_new(R, parent);
    if (f == NULL)
        return NULL;
    for (size_t i = 0; i < body->nundefs; i++)
        if (frame_set(R, f, body->undefs[i], jj_undef(body->undefs[i])) < 0)
            return NULL;
    return f;
}

/* ---- lookups ---- */

static int
undefined_use(jj_rt *R, jv u)
{
    if (u.u.s.p != NULL)
        return jj_fail(R, WK_EINVAL, "'%.*s' is undefined", (int)u.u.s.n, u.u.s.p);
    return jj_fail(R, WK_EINVAL, "an undefined value is used");
}

static int
loop_attr(jj_rt *R, jloop *lp, const char *name, jv *out)
{
    size_t n = lp->items->n, i = lp->i;
    if (strcmp(name, "index") == 0)
        *out = jj_int((int64_t)i + 1);
    else if (strcmp(name, "index0") == 0)
        *out = jj_int((int64_t)i);
    else if (strcmp(name, "first") == 0)
        *out = jj_bool(i == 0);
    else if (strcmp(name, "last") == 0)
        *out = jj_bool(i + 1 == n);
    else if (strcmp(name, "length") == 0)
        *out = jj_int((int64_t)n);
    else if (strcmp(name, "revindex") == 0)
        *out = jj_int((int64_t)(n - i));
    else if (strcmp(name, "revindex0") == 0)
        *out = jj_int((int64_t)(n - i - 1));
    else if (strcmp(name, "depth") == 0)
        *out = jj_int(lp->depth);
    else if (strcmp(name, "depth0") == 0)
        *out = jj_int(lp->depth - 1);
    else if (strcmp(name, "previtem") == 0)
        *out = i > 0 ? lp->items->v[i - 1] : jj_undef("previtem");
    else if (strcmp(name, "nextitem") == 0)
        *out = i + 1 < n ? lp->items->v[i + 1] : jj_undef("nextitem");
    else if (strcmp(name, "cycle") == 0 || strcmp(name, "changed") == 0) {
        jbound *b = jj_alloc(&R->ar, sizeof *b);
        if (b == NULL)
            return jj_oom(R);
        b->obj.t = JV_LOOP;
        b->obj.u.lp = lp;
        b->name = name;
        out->t = JV_BOUND;
        out->u.bm = b;
        if (strcmp(name, "changed") == 0)
            return jj_fail(R, WK_ENOTSUP, "loop.changed is not supported");
    } else
        *out = jj_undef(name);
    return 0;
}

int
jj_getattr(jj_rt *R, jv obj, const char *name, jv *out)
{
    bool unsafe = false;
    switch (obj.t) {
    case JV_UNDEF:
        return undefined_use(R, obj);
    case JV_LOOP:
        return loop_attr(R, obj.u.lp, name, out);
    case JV_NS:
        if (!jj_dict_get(obj.u.d, name, strlen(name), out))
            *out = jj_undef(name);
        return 0;
    case JV_DICT:
    case JV_STR:
    case JV_LIST:
        if (jj_method_kind(obj, name, &unsafe)) {
            if (unsafe) {
                *out = jj_undef(name);
                return 0;
            }
            jbound *b = jj_alloc(&R->ar, sizeof *b);
            if (b == NULL)
                return jj_oom(R);
            b->obj = obj;
            b->name = name;
            out->t = JV_BOUND;
            out->u.bm = b;
            return 0;
        }
        if (obj.t == JV_DICT && jj_dict_get(obj.u.d, name, strlen(name), out))
            return 0;
        *out = jj_undef(name);
        return 0;
    default:
        *out = jj_undef(name);
        return 0;
    }
}

int
jj_getitem(jj_rt *R, jv obj, jv key, jv *out)
{
    switch (obj.t) {
    case JV_UNDEF:
        return undefined_use(R, obj);
    case JV_DICT:
        if (jj_dict_getv(obj.u.d, key, out))
            return 0;
        break;
    case JV_NS:
        break;
    case JV_LIST:
    case JV_STR:
        if (obj.t == JV_LIST && obj.u.l->kind != JL_PLAIN) { /* not subscriptable */
            *out = jj_undef(NULL);
            return 0;
        }
        if (key.t == JV_INT || key.t == JV_BOOL) {
            int64_t i = key.t == JV_INT ? key.u.i : key.u.b;
            if (obj.t == JV_LIST) {
                int64_t n = (int64_t)obj.u.l->n;
                if (i < 0)
                    i += n;
                if (i >= 0 && i < n) {
                    *out = obj.u.l->v[i];
                    return 0;
                }
            } else {
                const char *s = obj.u.s.p;
                size_t n = obj.u.s.n;
                int64_t cn = (int64_t)jj_utf8_len(s, n);
                if (jj_step(R, n / 64) < 0)
                    return -1;
                if (i < 0)
                    i += cn;
                if (i >= 0 && i < cn) {
                    size_t b = 0;
                    for (int64_t c = 0; c < i; c++)
                        b = jj_utf8_next(s, n, b);
                    *out = jj_str(s + b, jj_utf8_next(s, n, b) - b);
                    return 0;
                }
            }
            *out = jj_undef(NULL);
            return 0;
        }
        break;
    default:
        break;
    }
    if (key.t == JV_STR) {
        char *nm = jj_strdup(&R->ar, key.u.s.p, key.u.s.n);
        if (nm == NULL)
            return jj_oom(R);
        if (obj.t != JV_DICT)
            return jj_getattr(R, obj, nm, out);
        bool unsafe = false;
        if (jj_method_kind(obj, nm, &unsafe))
            return jj_getattr(R, obj, nm, out);
        *out = jj_undef(nm);
        return 0;
    }
    *out = jj_undef(NULL);
    return 0;
}

int
jj_iter(jj_rt *R, jv v, jlist **out)
{
    switch (v.t) {
    case JV_UNDEF:
        *out = jj_list_new(R, 0);
        return *out == NULL ? -1 : 0;
    case JV_LIST:
        if (v.u.l->kind == JL_GEN || v.u.l->kind == JL_REVITER) {
            if (v.u.l->used) { /* a generator yields its items once */
                *out = jj_list_new(R, 0);
                return *out == NULL ? -1 : 0;
            }
            v.u.l->used = true;
        }
        *out = v.u.l;
        return 0;
    case JV_DICT: {
        jlist *l = jj_list_new(R, v.u.d->n);
        if (l == NULL)
            return -1;
        if (v.u.d->n > 0)
            memcpy(l->v, v.u.d->k, v.u.d->n * sizeof *l->v);
        l->n = v.u.d->n;
        *out = l;
        return 0;
    }
    case JV_STR: {
        const char *s = v.u.s.p;
        size_t n = v.u.s.n;
        jlist *l = jj_list_new(R, 0);
        if (l == NULL || jj_step(R, n) < 0)
            return -1;
        for (size_t i = 0; i < n;) {
            size_t e = jj_utf8_next(s, n, i);
            if (jj_list_push(R, l, jj_str(s + i, e - i)) < 0)
                return -1;
            i = e;
        }
        *out = l;
        return 0;
    }
    default:
        return jj_fail(R, WK_EINVAL, "'%s' object is not iterable", jj_type_name(v));
    }
}

/* ---- expressions ---- */

/*
 * Whether jinja2's optimizer folds x at compile time (literals and operators
 * over literals). A folded slice goes through the sandbox's lenient getitem
 * (Undefined on failure); any other slice is Python's subscript (an error).
 */
static bool
node_const(const jnode *x)
{
    if (x == NULL)
        return true;
    switch (x->kind) {
    case JN_LIT:
        return true;
    case JN_LIST:
    case JN_TUPLE:
    case JN_DICT:
        for (size_t i = 0; i < x->n; i++)
            if (!node_const(x->kids[i]))
                return false;
        return true;
    case JN_NEG:
    case JN_POS:
    case JN_NOT:
        return node_const(x->a);
    case JN_BINOP:
    case JN_CONCAT:
    case JN_AND:
    case JN_OR:
        return node_const(x->a) && node_const(x->b);
    case JN_COMPARE:
        for (size_t i = 0; i < x->n; i++)
            if (!node_const(x->kids[i]))
                return false;
        return node_const(x->a);
    case JN_COND:
        return node_const(x->a) && node_const(x->b) && node_const(x->c);
    default:
        return false;
    }
}

static int eval(jj_rt *R, const jnode *x, jv *out);
static int exec_body(jj_rt *R, const jnode *body);

typedef struct jj_args {
    jv *v;              /* values */
    const char **names; /* keyword names (NULL: positional) */
    size_t n;
} jj_args;

static int
eval_args(jj_rt *R, const jnode *x, jj_args *a)
{
    a->n = x->n;
    a->names = x->names;
    a->v = NULL;
    if (x->n == 0)
        return 0;
    a->v = jj_alloc(&R->ar, x->n * sizeof *a->v);
    if (a->v == NULL)
        return jj_oom(R);
    for (size_t i = 0; i < x->n; i++)
        if (eval(R, x->kids[i], &a->v[i]) < 0)
            return -1;
    return 0;
}

static int call_macro(jj_rt *R, jmacro *m, jv *args, const char **names, size_t n, jmacro *caller,
                      jv *out);

int
jj_call_value(jj_rt *R, jv fn, jv *args, const char **names, size_t n, jv *out)
{
    switch (fn.t) {
    case JV_MACRO:
        return call_macro(R, fn.u.m, args, names, n, NULL, out);
    case JV_FUNC:
        return jj_func(R, (int)fn.u.i, args, names, n, out);
    case JV_BOUND:
        if (fn.u.bm->obj.t == JV_LOOP) {
            jloop *lp = fn.u.bm->obj.u.lp;
            if (n == 0)
                return jj_fail(R, WK_EINVAL, "no items for cycling given");
            *out = args[lp->i % n];
            return 0;
        }
        return jj_method(R, fn.u.bm->obj, fn.u.bm->name, args, names, n, out);
    case JV_UNDEF:
        if (fn.u.s.p != NULL)
            return jj_fail(R, WK_EINVAL, "'%.*s' is undefined (called)", (int)fn.u.s.n, fn.u.s.p);
        return jj_fail(R, WK_EINVAL, "an undefined value is called");
    default:
        return jj_fail(R, WK_EINVAL, "'%s' object is not callable", jj_type_name(fn));
    }
}

static int
eval_call(jj_rt *R, const jnode *x, jv *out)
{
    jv fn;
    jj_args a;
    const jnode *callee = x->a;
    if (callee->kind == JN_GETATTR) {
        jv obj;
        bool unsafe = false;
        if (eval(R, callee->a, &obj) < 0)
            return -1;
        R->line = x->line;
        if ((obj.t == JV_DICT || obj.t == JV_STR || obj.t == JV_LIST) &&
            jj_method_kind(obj, callee->name, &unsafe)) {
            if (unsafe)
                return jj_fail(R, WK_EINVAL, "access to attribute '%s' of '%s' object is unsafe",
                               callee->name, jj_type_name(obj));
            if (eval_args(R, x, &a) < 0)
                return -1;
            R->line = x->line;
            return jj_method(R, obj, callee->name, a.v, a.names, a.n, out);
        }
        if (jj_getattr(R, obj, callee->name, &fn) < 0)
            return -1;
    } else if (eval(R, callee, &fn) < 0) {
        return -1;
    }
    if (eval_args(R, x, &a) < 0)
        return -1;
    R->line = x->line;
    return jj_call_value(R, fn, a.v, a.names, a.n, out);
}

static int
eval_filter(jj_rt *R, const jnode *x, jv in, jv *out)
{
    jj_args a;
    if (eval_args(R, x, &a) < 0)
        return -1;
    R->line = x->line;
    return jj_filter(R, x->fid, x->name, in, a.v, a.names, a.n, out);
}

static int
eval(jj_rt *R, const jnode *x, jv *out)
{
    jv a, b;
    R->line = x->line;
    if (jj_step(R, 1) < 0)
        return -1;
    switch (x->kind) {
    case JN_LIT:
        *out = x->lit;
        return 0;
    case JN_NAME: {
        if (frame_get(R->frame, x->name, out))
            return 0;
        int g = jj_global(x->name);
        if (g >= 0) {
            out->t = JV_FUNC;
            out->u.i = g;
            return 0;
        }
        *out = jj_undef(x->name);
        return 0;
    }
    case JN_LIST:
    case JN_TUPLE: {
        jlist *l = jj_list_new(R, x->n);
        if (l == NULL)
            return -1;
        for (size_t i = 0; i < x->n; i++)
            if (eval(R, x->kids[i], &l->v[i]) < 0)
                return -1;
        l->n = x->n;
        l->tuple = x->kind == JN_TUPLE;
        out->t = JV_LIST;
        out->u.l = l;
        return 0;
    }
    case JN_DICT: {
        jdict *d = jj_dict_new(R, x->n / 2);
        if (d == NULL)
            return -1;
        for (size_t i = 0; i + 1 < x->n; i += 2) {
            if (eval(R, x->kids[i], &a) < 0 || eval(R, x->kids[i + 1], &b) < 0)
                return -1;
            if (a.t == JV_LIST && !a.u.l->tuple)
                return jj_fail(R, WK_EINVAL, "unhashable type: 'list'");
            if (a.t == JV_DICT || a.t == JV_NS)
                return jj_fail(R, WK_EINVAL, "unhashable type: 'dict'");
            if (jj_dict_set(R, d, a, b) < 0)
                return -1;
        }
        out->t = JV_DICT;
        out->u.d = d;
        return 0;
    }
    case JN_GETATTR:
        if (eval(R, x->a, &a) < 0)
            return -1;
        R->line = x->line;
        return jj_getattr(R, a, x->name, out);
    case JN_GETITEM:
        if (eval(R, x->a, &a) < 0 || eval(R, x->b, &b) < 0)
            return -1;
        R->line = x->line;
        return jj_getitem(R, a, b, out);
    case JN_SLICE: {
        jv s = jj_none(), e = jj_none(), st = jj_none();
        if (eval(R, x->a, &a) < 0 || (x->b != NULL && eval(R, x->b, &s) < 0) ||
            (x->c != NULL && eval(R, x->c, &e) < 0) || (x->d != NULL && eval(R, x->d, &st) < 0))
            return -1;
        R->line = x->line;
        if (a.t == JV_UNDEF)
            return undefined_use(R, a);
        if (a.t != JV_STR && !jj_plain(a) && node_const(x->a)) {
            *out = jj_undef(NULL); /* folded at compile time by jinja2: lenient */
            return 0;
        }
        return jj_slice(R, a, s, e, st, out);
    }
    case JN_CALL:
        return eval_call(R, x, out);
    case JN_FILTER:
        if (eval(R, x->a, &a) < 0)
            return -1;
        return eval_filter(R, x, a, out);
    case JN_TEST: {
        jj_args args;
        bool r;
        if (eval(R, x->a, &a) < 0 || eval_args(R, x, &args) < 0)
            return -1;
        R->line = x->line;
        if (jj_test(R, x->fid, x->name, a, args.v, args.n, &r) < 0)
            return -1;
        *out = jj_bool(x->op ? !r : r);
        return 0;
    }
    case JN_NEG:
    case JN_POS:
        if (eval(R, x->a, &a) < 0)
            return -1;
        R->line = x->line;
        if (a.t == JV_INT || a.t == JV_BOOL) {
            int64_t i = a.t == JV_INT ? a.u.i : a.u.b;
            if (x->kind == JN_NEG && i == INT64_MIN)
                return jj_fail(R, WK_ENOTSUP, "integer overflow");
            *out = jj_int(x->kind == JN_NEG ? -i : i);
        } else if (a.t == JV_FLOAT) {
            *out = a;
            if (x->kind == JN_NEG)
                out->u.f = -a.u.f;
        } else if (a.t == JV_UNDEF) {
            return undefined_use(R, a);
        } else {
            return jj_fail(R, WK_EINVAL, "bad operand type for unary %c: '%s'",
                           x->kind == JN_NEG ? '-' : '+', jj_type_name(a));
        }
        return 0;
    case JN_NOT:
        if (eval(R, x->a, &a) < 0)
            return -1;
        *out = jj_bool(!jj_truthy(a));
        return 0;
    case JN_AND:
        if (eval(R, x->a, &a) < 0)
            return -1;
        if (!jj_truthy(a)) {
            *out = a;
            return 0;
        }
        return eval(R, x->b, out);
    case JN_OR:
        if (eval(R, x->a, &a) < 0)
            return -1;
        if (jj_truthy(a)) {
            *out = a;
            return 0;
        }
        return eval(R, x->b, out);
    case JN_BINOP:
        if (eval(R, x->a, &a) < 0 || eval(R, x->b, &b) < 0)
            return -1;
        R->line = x->line;
        return jj_binop(R, x->op, a, b, out);
    case JN_CONCAT: {
        jj_sb s = {0};
        if (eval(R, x->a, &a) < 0 || eval(R, x->b, &b) < 0)
            return -1;
        R->line = x->line;
        if (jj_to_str(R, a, &s) < 0 || jj_to_str(R, b, &s) < 0)
            return -1;
        *out = jj_sb_value(&s);
        return 0;
    }
    case JN_COMPARE: {
        if (eval(R, x->a, &a) < 0)
            return -1;
        for (size_t i = 0; i < x->n; i++) {
            bool r;
            if (eval(R, x->kids[i], &b) < 0)
                return -1;
            R->line = x->line;
            if (jj_compare(R, x->ops[i], a, b, &r) < 0)
                return -1;
            if (!r) {
                *out = jj_bool(false);
                return 0;
            }
            a = b;
        }
        *out = jj_bool(true);
        return 0;
    }
    case JN_COND:
        if (eval(R, x->a, &a) < 0)
            return -1;
        if (jj_truthy(a))
            return eval(R, x->b, out);
        if (x->c == NULL) {
            *out = jj_undef(NULL);
            return 0;
        }
        return eval(R, x->c, out);
    default:
        return jj_fail(R, WK_EINVAL, "internal: node %d is not an expression", x->kind);
    }
}

/* ---- statements ---- */

enum { FLOW_NEXT = 0, FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

/* Renders body into a new string (a macro call, a block set, a filter block). */
static int
capture(jj_rt *R, const jnode *body, jv *out)
{
    jj_sb s = {0};
    jj_sb *saved = R->out;
    jj_frame *outer = R->frame;
    jj_frame *f = scope_new(R, outer, body);
    if (f == NULL)
        return -1;
    R->out = &s;
    R->frame = f;
    int r = exec_body(R, body);
    R->frame = outer;
    R->out = saved;
    if (r < 0)
        return -1;
    *out = jj_sb_value(&s);
    return r; /* FLOW_BREAK/FLOW_CONTINUE from a set or filter block inside a loop */
}

static int
call_macro(jj_rt *R, jmacro *m, jv *args, const char **names, size_t n, jmacro *caller, jv *out)
{
    const jnode *def = m->def;
    if (R->depth >= R->lim.max_depth)
        return jj_fail(R, WK_ETOOBIG, "macro calls nested deeper than max_depth (%u)",
                       R->lim.max_depth);
    jj_frame *f = frame_new(R, m->closure);
    if (f == NULL)
        return -1;
    size_t np = def != NULL ? def->nnames : 0;
    bool *set = np > 0 ? jj_alloc(&R->ar, np) : NULL;
    if (np > 0 && set == NULL)
        return jj_oom(R);
    /* a body that reads varargs / kwargs takes extra arguments into them (op bits 1, 2) */
    jlist *va = NULL;
    jdict *kw = NULL;
    if (def != NULL && (def->op & 1) && (va = jj_list_new(R, 0)) == NULL)
        return -1;
    if (def != NULL && (def->op & 2) && (kw = jj_dict_new(R, 0)) == NULL)
        return -1;
    if (va != NULL)
        va->tuple = true;
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        if ((names == NULL || names[i] == NULL) && pos >= np && va != NULL) {
            if (jj_list_push(R, va, args[i]) < 0)
                return -1;
            continue;
        }
        if (names == NULL || names[i] == NULL) {
            if (pos >= np)
                return jj_fail(R, WK_EINVAL, "macro '%s' takes not more than %zu argument(s)",
                               m->name, np);
            if (frame_set(R, f, def->names[pos], args[i]) < 0)
                return -1;
            set[pos++] = true;
            continue;
        }
        size_t p;
        for (p = 0; p < np; p++)
            if (strcmp(def->names[p], names[i]) == 0)
                break;
        if (p == np && kw != NULL) {
            if (jj_dict_set(R, kw, jj_str(names[i], strlen(names[i])), args[i]) < 0)
                return -1;
            continue;
        }
        if (p == np)
            return jj_fail(R, WK_EINVAL, "macro '%s' takes no keyword argument '%s'", m->name,
                           names[i]);
        if (set[p])
            return jj_fail(R, WK_EINVAL, "macro '%s' got multiple values for argument '%s'",
                           m->name, names[i]);
        if (frame_set(R, f, def->names[p], args[i]) < 0)
            return -1;
        set[p] = true;
    }
    if (va != NULL) {
        jv v = {.t = JV_LIST};
        v.u.l = va;
        if (frame_set(R, f, "varargs", v) < 0)
            return -1;
    }
    if (kw != NULL) {
        jv v = {.t = JV_DICT};
        v.u.d = kw;
        if (frame_set(R, f, "kwargs", v) < 0)
            return -1;
    }
    jj_frame *saved = R->frame;
    R->frame = f;
    for (size_t p = 0; p < np; p++) {
        if (set[p])
            continue;
        jv v = jj_undef(def->names[p]);
        if (def->kids[p] != NULL && eval(R, def->kids[p], &v) < 0) {
            R->frame = saved;
            return -1;
        }
        if (frame_set(R, f, def->names[p], v) < 0) {
            R->frame = saved;
            return -1;
        }
    }
    if (caller != NULL) {
        jv c = {.t = JV_MACRO};
        c.u.m = caller;
        if (frame_set(R, f, "caller", c) < 0) {
            R->frame = saved;
            return -1;
        }
    }
    R->depth++;
    int r = capture(R, m->body, out);
    R->depth--;
    R->frame = saved;
    return r < 0 ? -1 : 0;
}

/* Binds a for/set target (one name or several) to v in f. */
static int
assign(jj_rt *R, jj_frame *f, const jnode *x, jv v)
{
    if (x->names == NULL || (x->kind == JN_FOR && x->nnames == 1 && x->name != NULL))
        return frame_set(R, f, x->name != NULL ? x->name : x->names[0], v);
    if (v.t == JV_STR && x->nnames > 0) {
        jlist *cl;
        if (jj_iter(R, v, &cl) < 0)
            return -1;
        v.t = JV_LIST;
        v.u.l = cl;
    }
    if (v.t != JV_LIST)
        return jj_fail(R, WK_EINVAL, "cannot unpack non-iterable %s object", jj_type_name(v));
    if (v.u.l->n != x->nnames)
        return jj_fail(R, WK_EINVAL, "%s values to unpack (expected %zu, got %zu)",
                       v.u.l->n > x->nnames ? "too many" : "not enough", x->nnames, v.u.l->n);
    for (size_t i = 0; i < x->nnames; i++)
        if (frame_set(R, f, x->names[i], v.u.l->v[i]) < 0)
            return -1;
    return 0;
}

static int
exec_for(jj_rt *R, const jnode *x)
{
    jv it;
    jlist *items;
    jj_frame *outer = R->frame;
    if (eval(R, x->a, &it) < 0 || jj_iter(R, it, &items) < 0)
        return -1;
    if (x->d != NULL) { /* {% for x in y if cond %} */
        jlist *kept = jj_list_new(R, 0);
        if (kept == NULL)
            return -1;
        for (size_t i = 0; i < items->n; i++) {
            jv c;
            jj_frame *f = frame_new(R, outer);
            if (f == NULL || assign(R, f, x, items->v[i]) < 0)
                return -1;
            R->frame = f;
            int r = eval(R, x->d, &c);
            R->frame = outer;
            if (r < 0)
                return -1;
            if (jj_truthy(c) && jj_list_push(R, kept, items->v[i]) < 0)
                return -1;
        }
        items = kept;
    }
    jloop *lp = jj_alloc(&R->ar, sizeof *lp);
    if (lp == NULL)
        return jj_oom(R);
    lp->items = items;
    lp->depth = 1; /* only recursive loops (refused) go deeper */
    for (size_t i = 0; i < items->n; i++) {
        jv lv = {.t = JV_LOOP};
        lv.u.lp = lp;
        lp->i = i;
        if (jj_step(R, 1) < 0)
            return -1;
        jj_frame *f = scope_new(R, outer, x->b);
        if (f == NULL || frame_set(R, f, "loop", lv) < 0 || assign(R, f, x, items->v[i]) < 0)
            return -1;
        R->frame = f;
        int r = exec_body(R, x->b);
        R->frame = outer;
        if (r < 0)
            return -1;
        if (r == FLOW_BREAK)
            break;
    }
    if (items->n == 0 && x->c != NULL) {
        jj_frame *f = scope_new(R, outer, x->c);
        if (f == NULL)
            return -1;
        R->frame = f;
        int r = exec_body(R, x->c);
        R->frame = outer;
        return r;
    }
    return FLOW_NEXT;
}

static int
apply_filter_chain(jj_rt *R, const jnode *f, jv in, jv *out)
{
    if (f->a != NULL) {
        if (apply_filter_chain(R, f->a, in, &in) < 0)
            return -1;
    }
    return eval_filter(R, f, in, out);
}

static int
exec_stmt(jj_rt *R, const jnode *x)
{
    jv v;
    R->line = x->line;
    if (jj_step(R, 1) < 0)
        return -1;
    switch (x->kind) {
    case JN_TEXT:
        return jj_sb_put(R, R->out, x->lit.u.s.p, x->lit.u.s.n);
    case JN_OUTPUT:
        if (eval(R, x->a, &v) < 0)
            return -1;
        return jj_to_str(R, v, R->out);
    case JN_BODY:
        return exec_body(R, x);
    case JN_IF:
        if (eval(R, x->a, &v) < 0)
            return -1;
        if (jj_truthy(v))
            return exec_body(R, x->b);
        return x->c != NULL ? exec_body(R, x->c) : FLOW_NEXT;
    case JN_FOR:
        return exec_for(R, x);
    case JN_SET:
        if (eval(R, x->a, &v) < 0)
            return -1;
        R->line = x->line;
        if (x->attr != NULL) {
            jv ns;
            if (!frame_get(R->frame, x->name, &ns) || ns.t != JV_NS)
                return jj_fail(R, WK_EINVAL, "can only set attributes on a namespace ('%s')",
                               x->name);
            return jj_dict_set(R, ns.u.d, jj_str(x->attr, strlen(x->attr)), v);
        }
        return assign(R, R->frame, x, v);
    case JN_SETBLOCK: {
        /* a break inside leaves the loop before the assignment, as in jinja2 */
        int r = capture(R, x->b, &v);
        if (r != FLOW_NEXT)
            return r;
        if (x->d != NULL && apply_filter_chain(R, x->d, v, &v) < 0)
            return -1;
        return frame_set(R, R->frame, x->name, v);
    }
    case JN_FILTERBLOCK: {
        int r = capture(R, x->b, &v);
        if (r != FLOW_NEXT)
            return r;
        if (apply_filter_chain(R, x->d, v, &v) < 0)
            return -1;
        return jj_to_str(R, v, R->out);
    }
    case JN_MACRO: {
        jmacro *m = jj_alloc(&R->ar, sizeof *m);
        if (m == NULL)
            return jj_oom(R);
        m->def = x;
        m->body = x->b;
        m->closure = R->frame;
        m->name = x->name;
        v.t = JV_MACRO;
        v.u.m = m;
        return frame_set(R, R->frame, x->name, v);
    }
    case JN_CALLBLOCK: {
        const jnode *c = x->a;
        jv fn;
        jj_args a;
        jmacro *caller = jj_alloc(&R->ar, sizeof *caller);
        if (caller == NULL)
            return jj_oom(R);
        caller->body = x->b;
        caller->closure = R->frame;
        caller->name = "caller";
        if (eval(R, c->a, &fn) < 0 || eval_args(R, c, &a) < 0)
            return -1;
        R->line = x->line;
        if (fn.t != JV_MACRO)
            return jj_fail(R, WK_ENOTSUP, "call block on a %s (only macros)", jj_type_name(fn));
        if (call_macro(R, fn.u.m, a.v, a.names, a.n, caller, &v) < 0)
            return -1;
        return jj_to_str(R, v, R->out);
    }
    case JN_BREAK:
        return FLOW_BREAK;
    case JN_CONTINUE:
        return FLOW_CONTINUE;
    default:
        return jj_fail(R, WK_EINVAL, "internal: node %d is not a statement", x->kind);
    }
}

static int
exec_body(jj_rt *R, const jnode *body)
{
    for (size_t i = 0; i < body->n; i++) {
        int r = exec_stmt(R, body->kids[i]);
        if (r != FLOW_NEXT)
            return r;
    }
    return FLOW_NEXT;
}

wk_err
wk_jinja_render(const wk_jinja *t, const json_t *ctx, const wk_jinja_limits *lim, char **out,
                size_t *out_len, wk_diag *d)
{
    if (t == NULL || out == NULL || (ctx != NULL && !json_is_object(ctx)))
        return wk_diag_set(d, WK_EINVAL,
                           "wk_jinja_render: NULL template or a context that is "
                           "not an object");
    jj_rt R = {.t = t, .d = d};
    jj_sb top = {.top = true};
    if (lim != NULL)
        R.lim = *lim;
    if (R.lim.max_output == 0)
        R.lim.max_output = 16u << 20;
    if (R.lim.max_memory == 0)
        R.lim.max_memory = 64u << 20;
    if (R.lim.max_steps == 0)
        R.lim.max_steps = 50000000;
    if (R.lim.max_depth == 0)
        R.lim.max_depth = 64;
    R.ar.limit = R.lim.max_memory;
    R.out = &top;
    int r = 0;
    R.globals = frame_new(&R, NULL);
    if (R.globals == NULL)
        r = -1;
    if (r == 0 && ctx != NULL) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)ctx, key, val)
        {
            jv v;
            if (jj_from_json(&R, val, &v, 0) < 0 || frame_set(&R, R.globals, key, v) < 0) {
                r = -1;
                break;
            }
        }
    }
    if (r == 0) {
        /* the template's scope, under the context's variables */
        R.frame = scope_new(&R, R.globals, t->root);
        r = R.frame == NULL ? -1 : exec_body(&R, t->root);
    }
    if (r == 0) { /* the terminating NUL, not counted in *out_len */
        R.lim.max_output++;
        r = jj_sb_put(&R, &top, "", 1);
        top.n--;
    }
    jj_arena_fini(&R.ar);
    if (r < 0) {
        free(top.p);
        return R.err != WK_OK ? R.err : WK_EINVAL;
    }
    *out = top.p;
    if (out_len != NULL)
        *out_len = top.n;
    return WK_OK;
}
