/*
 * Unit tests for wk_pth, the torch .pth reader.
 *
 * Group "crafted" builds pickles and zip archives byte by byte: every opcode
 * the machine knows, every refusal (unknown global or opcode, stack, mark,
 * memo, string, value, item and tensor limits, malformed REDUCE/BUILD/
 * BINPERSID arguments, non-contiguous strides, storage bounds) and every zip
 * defect (compressed, encrypted, multi-disk, zip64 with and without its
 * records, bad local headers, out-of-bounds directories, duplicate entries,
 * byteorder), each with its code and a diagnostic naming the tensor or entry.
 *
 * Group "torch" runs tests/fixtures/make_pth.py with $PYTHON (Debian's
 * python3-torch) into a temp dir under the build dir and reads what real
 * torch.save() wrote: values in F32/F16/BF16, shared storages, OrderedDict
 * state_dicts, parameters, nested state_dicts, and the files that must be
 * refused. When Python or torch is absent that group is skipped and the
 * program exits 77 after the crafted group passes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wk_pth.h"
#include "wk_tensor.h"

/* ------------------------------------------------------------ buffers ---- */

/* A growable byte buffer for pickles and archives. */
typedef struct buf {
    uint8_t *p; /* bytes */
    size_t len; /* used */
    size_t cap; /* allocated */
} buf;

static void
buf_raw(buf *b, const void *s, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void
buf_u8(buf *b, uint8_t v)
{
    buf_raw(b, &v, 1);
}

static void
buf_le(buf *b, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        buf_u8(b, (uint8_t)(v >> (8 * i)));
}

static void
buf_free(buf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* ------------------------------------------------------------- pickle ---- */

static void
pk_op(buf *b, uint8_t op)
{
    buf_u8(b, op);
}

static void
pk_strn(buf *b, const char *s, size_t n)
{
    buf_u8(b, 'X');
    buf_le(b, n, 4);
    buf_raw(b, s, n);
}

static void
pk_str(buf *b, const char *s)
{
    pk_strn(b, s, strlen(s));
}

static void
pk_int(buf *b, int64_t v)
{
    if (v >= 0 && v < 256) {
        buf_u8(b, 'K');
        buf_u8(b, (uint8_t)v);
    } else if (v >= 0 && v < 65536) {
        buf_u8(b, 'M');
        buf_le(b, (uint64_t)v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        buf_u8(b, 'J');
        buf_le(b, (uint64_t)v, 4);
    } else {
        buf_u8(b, 0x8a);
        buf_u8(b, 8);
        buf_le(b, (uint64_t)v, 8);
    }
}

static void
pk_global(buf *b, const char *mod, const char *name)
{
    buf_u8(b, 'c');
    buf_raw(b, mod, strlen(mod));
    buf_u8(b, '\n');
    buf_raw(b, name, strlen(name));
    buf_u8(b, '\n');
}

static void
pk_ints(buf *b, int n, const int64_t *v)
{
    pk_op(b, '(');
    for (int i = 0; i < n; i++)
        pk_int(b, v[i]);
    pk_op(b, 't');
}

/* The persistent-id storage record torch writes: ('storage', cls, key, 'cpu', numel) BINPERSID. */
static void
pk_storage(buf *b, const char *cls, const char *key, int64_t numel)
{
    pk_op(b, '(');
    pk_str(b, "storage");
    pk_global(b, "torch", cls);
    pk_str(b, key);
    pk_str(b, "cpu");
    pk_int(b, numel);
    pk_op(b, 't');
    pk_op(b, 'Q');
}

/* _rebuild_tensor_v2(storage, off, shape, stride, False, OrderedDict()) as torch writes it. */
static void
pk_tensor_ex(buf *b, const char *cls, const char *key, int64_t snumel, int64_t off, int ndim,
             const int64_t *shape, const int64_t *stride)
{
    pk_global(b, "torch._utils", "_rebuild_tensor_v2");
    pk_op(b, '(');
    pk_storage(b, cls, key, snumel);
    pk_int(b, off);
    pk_ints(b, ndim, shape);
    pk_ints(b, ndim, stride);
    pk_op(b, 0x89);
    pk_global(b, "collections", "OrderedDict");
    pk_op(b, ')');
    pk_op(b, 'R');
    pk_op(b, 't');
    pk_op(b, 'R');
}

/* A contiguous tensor over a storage of exactly its size. */
static void
pk_tensor(buf *b, const char *cls, const char *key, int ndim, const int64_t *shape)
{
    int64_t stride[16], n = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = n;
        n *= shape[i];
    }
    pk_tensor_ex(b, cls, key, n, 0, ndim, shape, stride);
}

static void
pk_begin(buf *b)
{
    pk_op(b, 0x80);
    pk_op(b, 2);
    pk_op(b, '}');
    pk_op(b, '(');
}

static void
pk_end(buf *b)
{
    pk_op(b, 'u');
    pk_op(b, '.');
}

/* --------------------------------------------------------- storages ---- */

static const float store_f32[8] = {0.0f, 1.0f, 2.0f, 3.0f, 4.5f, -5.0f, 6.0f, 7.0f};
static const uint8_t store_bf16[4] = {0x80, 0x3f, 0x00, 0xc0}; /* 1, -2 */
static const uint8_t store_f16[4] = {0x00, 0x38, 0x00, 0x3c};  /* 0.5, 1 */

/* Storages of the crafted pickles: "0" f32[8], "1" bf16[2], "2" f16[2], "e" an I/O error. */
static wk_err
res_fn(void *ctx, const char *key, const void **data, size_t *len, wk_diag *d)
{
    (void)ctx;
    if (strcmp(key, "0") == 0) {
        *data = store_f32;
        *len = sizeof(store_f32);
    } else if (strcmp(key, "1") == 0) {
        *data = store_bf16;
        *len = sizeof(store_bf16);
    } else if (strcmp(key, "2") == 0) {
        *data = store_f16;
        *len = sizeof(store_f16);
    } else if (strcmp(key, "z") == 0) {
        *data = NULL;
        *len = 0;
    } else if (strcmp(key, "e") == 0) {
        return wk_diag_set(d, WK_EIO, "storage 'e' unreadable");
    } else {
        return wk_diag_set(d, WK_ENOENT, "no storage '%s'", key);
    }
    return WK_OK;
}

static const wk_tensor *
list_find(const wk_tensor_list *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->v[i].name, name) == 0)
            return &l->v[i];
    return NULL;
}

/* Runs pickle b (freed) and expects err, an unchanged list and each substring in the diag. */
static void
pk_expect(buf *b, wk_err err, ...)
{
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    wk_diag d = {""};
    wk_err got = wk_pth_pickle_load(b->p, b->len, res_fn, NULL, &l, &d);
    if (got != err)
        fail_msg("got %s (%s), want %s", wk_err_name(got), d.msg, wk_err_name(err));
    if (err != WK_OK)
        assert_int_equal(l.n, 0);
    va_list ap;
    va_start(ap, err);
    for (const char *s = va_arg(ap, const char *); s != NULL; s = va_arg(ap, const char *))
        if (strstr(d.msg, s) == NULL)
            fail_msg("diag '%s' lacks '%s'", d.msg, s);
    va_end(ap);
    wk_tensor_list_fini(&l);
    buf_free(b);
}

/* Runs pickle b (kept) into l, expecting success. */
static void
pk_ok(buf *b, wk_tensor_list *l)
{
    wk_diag d = {""};
    wk_err err = wk_pth_pickle_load(b->p, b->len, res_fn, NULL, l, &d);
    if (err != WK_OK)
        fail_msg("got %s (%s)", wk_err_name(err), d.msg);
    assert_string_equal(d.msg, "");
}

/* ------------------------------------------------------ pickle tests ---- */

static void
test_pickle_good(void **state)
{
    (void)state;
    buf b = {0};
    int64_t s22[2] = {2, 2}, s2[1] = {2}, st1[1] = {1};
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    pk_begin(&b);
    pk_str(&b, "w"); /* a scalar, 3 elements into an 8-element storage */
    pk_tensor_ex(&b, "FloatStorage", "0", 8, 3, 0, NULL, NULL);
    pk_str(&b, "m");
    pk_tensor_ex(&b, "FloatStorage", "0", 8, 4, 2, s22, (const int64_t[]){2, 1});
    pk_str(&b, "b");
    pk_tensor(&b, "BFloat16Storage", "1", 1, s2);
    pk_str(&b, "h");
    pk_tensor(&b, "HalfStorage", "2", 1, s2);
    pk_str(&b, "one"); /* size-1 dims may carry any stride (torch's contiguity rule) */
    pk_tensor_ex(&b, "FloatStorage", "0", 8, 7, 2, (const int64_t[]){1, 1},
                 (const int64_t[]){99, 42});
    pk_str(&b, "empty"); /* empty: strides do not matter, offset may be the storage end */
    pk_tensor_ex(&b, "FloatStorage", "0", 8, 8, 2, (const int64_t[]){0, 3},
                 (const int64_t[]){5, 7});
    pk_str(&b, "zs");
    pk_tensor_ex(&b, "FloatStorage", "z", 0, 0, 1, (const int64_t[]){0}, st1);
    pk_str(&b, "meta"); /* non-tensor values beside tensors are ignored */
    pk_int(&b, 5);
    pk_end(&b);
    pk_ok(&b, &l);
    assert_int_equal(l.n, 7);
    float out[4];
    const wk_tensor *t = list_find(&l, "w");
    assert_int_equal(t->ndim, 0);
    assert_int_equal(wk_tensor_read_f32(t, 0, 1, out), WK_OK);
    assert_true(out[0] == 3.0f);
    t = list_find(&l, "m");
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->nbytes, 16);
    assert_ptr_equal(t->data, &store_f32[4]);
    assert_int_equal(wk_tensor_read_f32(t, 0, 4, out), WK_OK);
    assert_true(out[0] == 4.5f && out[1] == -5.0f && out[3] == 7.0f);
    t = list_find(&l, "b");
    assert_int_equal(t->dtype, WK_DTYPE_BF16);
    assert_int_equal(wk_tensor_read_f32(t, 0, 2, out), WK_OK);
    assert_true(out[0] == 1.0f && out[1] == -2.0f);
    t = list_find(&l, "h");
    assert_int_equal(t->dtype, WK_DTYPE_F16);
    assert_int_equal(wk_tensor_read_f32(t, 0, 2, out), WK_OK);
    assert_true(out[0] == 0.5f && out[1] == 1.0f);
    t = list_find(&l, "one");
    assert_int_equal(wk_tensor_read_f32(t, 0, 1, out), WK_OK);
    assert_true(out[0] == 7.0f);
    t = list_find(&l, "empty");
    assert_int_equal(t->nbytes, 0);
    assert_int_equal(list_find(&l, "zs")->nbytes, 0);
    assert_null(list_find(&l, "meta"));
    wk_tensor_list_fini(&l);
    buf_free(&b);
}

/* The opcodes torch does not use for a state_dict but that are accepted anyway. */
static void
test_pickle_other_opcodes(void **state)
{
    (void)state;
    buf b = {0};
    pk_op(&b, 0x80);
    pk_op(&b, 4);
    pk_op(&b, 0x95); /* FRAME */
    buf_le(&b, 1000, 8);
    pk_global(&b, "collections", "OrderedDict");
    pk_op(&b, 0x94); /* MEMOIZE -> 0 */
    pk_op(&b, ')');
    pk_op(&b, 'R');
    pk_op(&b, 0x94); /* MEMOIZE -> 1: the dict */
    pk_op(&b, 0x8c); /* SHORT_BINUNICODE */
    pk_op(&b, 1);
    pk_op(&b, 'a');
    /* a _rebuild_parameter around a 7-argument _rebuild_tensor_v2 with metadata */
    pk_op(&b, 0x8c);
    pk_op(&b, 12);
    buf_raw(&b, "torch._utils", 12);
    pk_op(&b, 0x8d); /* BINUNICODE8 */
    buf_le(&b, 18, 8);
    buf_raw(&b, "_rebuild_parameter", 18);
    pk_op(&b, 0x93); /* STACK_GLOBAL */
    pk_global(&b, "torch._utils", "_rebuild_tensor_v2");
    pk_op(&b, '(');
    pk_storage(&b, "BFloat16Storage", "1", 2);
    pk_int(&b, 0);
    pk_op(&b, 'K');
    pk_op(&b, 2);
    pk_op(&b, 0x85); /* TUPLE1 */
    pk_op(&b, 'K');
    pk_op(&b, 1);
    pk_op(&b, 0x85);
    pk_op(&b, 0x88); /* NEWTRUE */
    pk_op(&b, '}');
    pk_op(&b, '}'); /* metadata */
    pk_op(&b, 't');
    pk_op(&b, 'R');
    pk_op(&b, 0x88);
    pk_op(&b, '}');
    pk_op(&b, 0x87); /* TUPLE3 */
    pk_op(&b, 'R');
    pk_op(&b, 's'); /* SETITEM a = tensor */
    /* metadata-ish values of every other kind, via SETITEMS */
    pk_op(&b, '(');
    pk_str(&b, "f");
    pk_op(&b, 'G');
    buf_raw(&b, "\x3f\xf8\0\0\0\0\0\0", 8); /* 1.5 */
    pk_str(&b, "n");
    pk_op(&b, 'N');
    pk_str(&b, "i");
    pk_op(&b, 'J');
    buf_le(&b, (uint64_t)-7, 4);
    pk_str(&b, "l1");
    pk_op(&b, 0x8a);
    pk_op(&b, 2);
    buf_raw(&b, "\x00\xff", 2); /* -256 */
    pk_str(&b, "l0");
    pk_op(&b, 0x8a);
    pk_op(&b, 0);
    pk_str(&b, "lst");
    pk_op(&b, ']');
    pk_op(&b, 'q');
    pk_op(&b, 9);
    pk_op(&b, '(');
    pk_op(&b, 'K');
    pk_op(&b, 1);
    pk_op(&b, 'M');
    buf_le(&b, 300, 2);
    pk_op(&b, 'e'); /* APPENDS */
    pk_op(&b, 'N');
    pk_op(&b, 'a'); /* APPEND */
    pk_str(&b, "t2");
    pk_op(&b, 'K');
    pk_op(&b, 1);
    pk_op(&b, 'K');
    pk_op(&b, 2);
    pk_op(&b, 0x86); /* TUPLE2 */
    pk_str(&b, "memo");
    pk_op(&b, 'r');
    buf_le(&b, 70000, 4); /* LONG_BINPUT */
    pk_op(&b, 'j');
    buf_le(&b, 9, 4); /* LONG_BINGET of the list */
    pk_op(&b, 'u');
    /* BUILD with an OrderedDict's attribute state, as state_dict() pickles _metadata */
    pk_op(&b, '}');
    pk_str(&b, "_metadata");
    pk_op(&b, 'h');
    pk_op(&b, 0);
    pk_op(&b, ')');
    pk_op(&b, 'R');
    pk_op(&b, 's');
    pk_op(&b, 'b');
    pk_op(&b, '.');
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    pk_ok(&b, &l);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.v[0].name, "a");
    float out[2];
    assert_int_equal(wk_tensor_read_f32(&l.v[0], 0, 2, out), WK_OK);
    assert_true(out[0] == 1.0f && out[1] == -2.0f);
    wk_tensor_list_fini(&l);
    buf_free(&b);
}

static void
test_pickle_nested(void **state)
{
    (void)state;
    int64_t s1[1] = {2};
    /* {"epoch": 3, "state_dict": {"x": t}} */
    buf b = {0};
    pk_begin(&b);
    pk_str(&b, "epoch");
    pk_int(&b, 3);
    pk_str(&b, "optimizer");
    pk_op(&b, '}');
    pk_str(&b, "state_dict");
    pk_op(&b, '}');
    pk_op(&b, '(');
    pk_str(&b, "x");
    pk_tensor(&b, "BFloat16Storage", "1", 1, s1);
    pk_op(&b, 'u');
    pk_end(&b);
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    pk_ok(&b, &l);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.v[0].name, "x");
    wk_tensor_list_fini(&l);
    buf_free(&b);

    /* "model" and "module", nested in each other, up to WK_PTH_MAX_NEST levels */
    const char *keys[] = {"model", "module", "state_dict", "model"};
    pk_op(&b, 0x80);
    pk_op(&b, 2);
    for (int i = 0; i < WK_PTH_MAX_NEST; i++) {
        pk_op(&b, '}');
        pk_str(&b, keys[i]);
    }
    pk_op(&b, '}');
    pk_str(&b, "deep");
    pk_tensor(&b, "HalfStorage", "2", 1, s1);
    pk_op(&b, 's');
    for (int i = 0; i < WK_PTH_MAX_NEST; i++)
        pk_op(&b, 's');
    pk_op(&b, '.');
    pk_ok(&b, &l);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.v[0].name, "deep");
    wk_tensor_list_fini(&l);
    buf_free(&b);

    /* one level deeper is not searched: an empty result */
    pk_op(&b, 0x80);
    pk_op(&b, 2);
    for (int i = 0; i <= WK_PTH_MAX_NEST; i++) {
        pk_op(&b, '}');
        pk_str(&b, "model");
    }
    pk_op(&b, '}');
    pk_str(&b, "deep");
    pk_tensor(&b, "HalfStorage", "2", 1, s1);
    pk_op(&b, 's');
    for (int i = 0; i <= WK_PTH_MAX_NEST; i++)
        pk_op(&b, 's');
    pk_op(&b, '.');
    pk_ok(&b, &l);
    assert_int_equal(l.n, 0);
    buf_free(&b);

    /* a dict with no tensors and no known key: empty; "model" that is not a dict: skipped */
    pk_begin(&b);
    pk_str(&b, "model");
    pk_int(&b, 1);
    pk_str(&b, "weights");
    pk_op(&b, '}');
    pk_end(&b);
    pk_ok(&b, &l);
    assert_int_equal(l.n, 0);
    buf_free(&b);

    /* a nested dict of tensors beside top-level tensors is refused */
    pk_begin(&b);
    pk_str(&b, "top");
    pk_tensor(&b, "HalfStorage", "2", 1, s1);
    pk_str(&b, "sub");
    pk_op(&b, '}');
    pk_str(&b, "inner");
    pk_tensor(&b, "HalfStorage", "2", 1, s1);
    pk_op(&b, 's');
    pk_end(&b);
    pk_expect(&b, WK_ENOTSUP, "'sub'", "nested", NULL);

    /* a non-string key for a non-tensor value is fine; for a nested dict, named '?' */
    pk_begin(&b);
    pk_str(&b, "top");
    pk_tensor(&b, "HalfStorage", "2", 1, s1);
    pk_int(&b, 4);
    pk_op(&b, '}');
    pk_str(&b, "inner");
    pk_tensor(&b, "HalfStorage", "2", 1, s1);
    pk_op(&b, 's');
    pk_end(&b);
    pk_expect(&b, WK_ENOTSUP, "'?'", NULL);
}

static void
test_pickle_tensor_errors(void **state)
{
    (void)state;
    int64_t s2[1] = {2}, st1[1] = {1};
    buf b = {0};
    /* unsupported storage types, by tensor name */
    pk_begin(&b);
    pk_str(&b, "ids");
    pk_tensor(&b, "LongStorage", "0", 1, s2);
    pk_end(&b);
    pk_expect(&b, WK_ENOTSUP, "'ids'", "LongStorage", NULL);
    pk_begin(&b);
    pk_str(&b, "dbl");
    pk_tensor(&b, "DoubleStorage", "0", 1, s2);
    pk_end(&b);
    pk_expect(&b, WK_ENOTSUP, "'dbl'", "DoubleStorage", NULL);
    /* non-string key */
    pk_begin(&b);
    pk_int(&b, 7);
    pk_tensor(&b, "FloatStorage", "0", 1, s2);
    pk_end(&b);
    pk_expect(&b, WK_EINVAL, "keyed by a int", NULL);
    /* NUL and bad UTF-8 in names */
    pk_begin(&b);
    pk_strn(&b, "a\0b", 3);
    pk_tensor(&b, "FloatStorage", "0", 1, s2);
    pk_end(&b);
    pk_expect(&b, WK_EINVAL, "'a'", "NUL", NULL);
    const char *bad_utf8[] = {"x\xff", "x\xc0\x80", "x\xe0\x80\x80", "x\xed\xa0\x80",
                              "x\xf4\x90\x80\x80", "x\xc3", "x\xe2\x28\xa1", "x\xf8\x88\x80\x80"};
    for (size_t i = 0; i < sizeof(bad_utf8) / sizeof(bad_utf8[0]); i++) {
        pk_begin(&b);
        pk_str(&b, bad_utf8[i]);
        pk_tensor(&b, "FloatStorage", "0", 1, s2);
        pk_end(&b);
        pk_expect(&b, WK_EINVAL, "UTF-8", NULL);
    }
    /* good UTF-8 of every length */
    pk_begin(&b);
    pk_str(&b, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    pk_tensor_ex(&b, "FloatStorage", "0", 8, 0, 1, s2, st1);
    pk_end(&b);
    pk_expect(&b, WK_OK, NULL);
    /* too many dims */
    int64_t s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 8}, t9[9] = {8, 8, 8, 8, 8, 8, 8, 8, 1};
    pk_begin(&b);
    pk_str(&b, "nine");
    pk_tensor_ex(&b, "FloatStorage", "0", 8, 0, 9, s9, t9);
    pk_end(&b);
    pk_expect(&b, WK_ENOTSUP, "'nine'", "9 dimensions", NULL);
    /* negative and overflowing sizes */
    pk_begin(&b);
    pk_str(&b, "neg");
    pk_tensor_ex(&b, "FloatStorage", "0", 8, 0, 1, (const int64_t[]){-2}, st1);
    pk_end(&b);
    pk_expect(&b, WK_EINVAL, "'neg'", "size", NULL);
    pk_begin(&b);
    pk_str(&b, "huge");
    pk_tensor_ex(&b, "FloatStorage", "0", 8, 0, 2,
                 (const int64_t[]){INT64_C(1) << 40, INT64_C(1) << 40},
                 (const int64_t[]){INT64_C(1) << 40, 1});
    pk_end(&b);
    pk_expect(&b, WK_EINVAL, "'huge'", "size", NULL);
    /* non-contiguous: transposed, stepped, broadcast (stride 0) */
    pk_begin(&b);
    pk_str(&b, "wt");
    pk_tensor_ex(&b, "FloatStorage", "0", 8, 0, 2, (const int64_t[]){2, 3},
                 (const int64_t[]){1, 2});
    pk_end(&b);
    pk_expect(&b, WK_EINVAL, "'wt'", "not contiguous", NULL);
    pk_begin(&b);
    pk_str(&b, "step");
    pk_tensor_ex(&b, "FloatStorage", "0", 8, 0, 1, (const int64_t[]){4},
                 (const int64_t[]){2});
    pk_end(&b);
    pk_expect(&b, WK_EINVAL, "'step'", "not contiguous", NULL);
    pk_begin(&b);
    pk_str(&b, "bcast");
    pk_tensor_ex(&b, "FloatStorage", "0", 8, 0, 2, (const int64_t[]){3, 2},
                 (const int64_t[]){0, 1});
    pk_end(&b);
    pk_expect(&b, WK_EINVAL, "'bcast'", "not contiguous", NULL);
    /* storage bounds: offset negative, past the end, span past the end */
    pk_begin(&b);
    pk_str(&b, "o1");
    pk_tensor_ex(&b, "FloatStorage", "0", 8, -1, 1, s2, st1);
    pk_end(&b);
    pk_expect(&b, WK_EINVAL, "'o1'", "outside storage", NULL);
    pk_begin(&b);
    pk_str(&b, "o2");
    pk_tensor_ex(&b, "FloatStorage", "0", 8, 9, 1, (const int64_t[]){0}, st1);
    pk_end(&b);
    pk_expect(&b, WK_EINVAL, "'o2'", "outside storage", NULL);
    pk_begin(&b);
    pk_str(&b, "o3");
    pk_tensor_ex(&b, "FloatStorage", "0", 8, 7, 1, s2, st1);
    pk_end(&b);
    pk_expect(&b, WK_EINVAL, "'o3'", "outside storage", NULL);
    pk_begin(&b);
    pk_str(&b, "o4");
    pk_tensor_ex(&b, "FloatStorage", "0", 8, INT64_MAX, 1, s2, st1);
    pk_end(&b);
    pk_expect(&b, WK_EINVAL, "'o4'", "outside storage", NULL);
    /* storage record element count overflowing bytes */
    pk_begin(&b);
    pk_str(&b, "ov");
    pk_tensor_ex(&b, "FloatStorage", "0", INT64_MAX, 0, 1, s2, st1);
    pk_end(&b);
    pk_expect(&b, WK_EINVAL, "'ov'", "overflows", NULL);
    /* storage bytes disagree with the record */
    pk_begin(&b);
    pk_str(&b, "sz");
    pk_tensor_ex(&b, "FloatStorage", "0", 7, 0, 1, s2, st1);
    pk_end(&b);
    pk_expect(&b, WK_EINVAL, "'sz'", "holds 32 bytes", NULL);
    /* storage missing or failing: the tensor is named, the code kept (ENOENT -> EINVAL) */
    pk_begin(&b);
    pk_str(&b, "miss");
    pk_tensor(&b, "FloatStorage", "9", 1, s2);
    pk_end(&b);
    pk_expect(&b, WK_EINVAL, "tensor 'miss'", "no storage '9'", NULL);
    pk_begin(&b);
    pk_str(&b, "io");
    pk_tensor(&b, "FloatStorage", "e", 1, s2);
    pk_end(&b);
    pk_expect(&b, WK_EIO, "tensor 'io'", NULL);
    /* two names for one tensor are fine here (wk_tensor_set refuses duplicate names) */
    pk_begin(&b);
    pk_str(&b, "a");
    pk_tensor(&b, "BFloat16Storage", "1", 1, s2);
    pk_op(&b, 'q');
    pk_op(&b, 200);
    pk_str(&b, "b");
    pk_op(&b, 'h');
    pk_op(&b, 200);
    pk_end(&b);
    pk_expect(&b, WK_OK, NULL);
}

static void
test_pickle_structure_errors(void **state)
{
    (void)state;
    buf b = {0};
    int64_t s2[1] = {2}, st1[1] = {1};
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    wk_diag d = {""};
    assert_int_equal(wk_pth_pickle_load("", 0, res_fn, NULL, &l, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "empty"));
    assert_int_equal(wk_pth_pickle_load("x", WK_PTH_MAX_PICKLE + 1, res_fn, NULL, &l, &d),
                     WK_ETOOBIG);

    /* the globals that must never run, and storages of unknown kinds */
    pk_op(&b, 0x80);
    pk_op(&b, 2);
    pk_global(&b, "os", "system");
    pk_expect(&b, WK_ENOTSUP, "'os.system'", "not allowed", NULL);
    pk_global(&b, "builtins", "eval");
    pk_expect(&b, WK_ENOTSUP, "'builtins.eval'", NULL);
    pk_global(&b, "torch", "UntypedStorage");
    pk_expect(&b, WK_ENOTSUP, "'torch.UntypedStorage'", NULL);
    pk_global(&b, "torch._utils", "_rebuild_tensor_v3");
    pk_expect(&b, WK_ENOTSUP, "_rebuild_tensor_v3", NULL);
    pk_global(&b, "collections", "OrderedDic");
    pk_expect(&b, WK_ENOTSUP, NULL);
    pk_op(&b, 0x8c);
    pk_op(&b, 2);
    buf_raw(&b, "os", 2);
    pk_op(&b, 0x8c);
    pk_op(&b, 5);
    buf_raw(&b, "popen", 5);
    pk_op(&b, 0x93);
    pk_expect(&b, WK_ENOTSUP, "'os.popen'", NULL);
    pk_op(&b, 'K');
    pk_op(&b, 1);
    pk_op(&b, 'K');
    pk_op(&b, 1);
    pk_op(&b, 0x93);
    pk_expect(&b, WK_EINVAL, "STACK_GLOBAL", NULL);
    pk_op(&b, 'c');
    buf_raw(&b, "torch\nFloatStorage", 18); /* unterminated name */
    pk_expect(&b, WK_EINVAL, "GLOBAL", NULL);
    pk_op(&b, 'c');
    for (int i = 0; i < 300; i++)
        pk_op(&b, 'a');
    pk_op(&b, '\n');
    pk_expect(&b, WK_EINVAL, "GLOBAL", NULL);
    /* unknown opcodes, protocols, truncation */
    pk_op(&b, 'I'); /* INT (text) */
    pk_expect(&b, WK_ENOTSUP, "opcode 0x49", "offset 0", NULL);
    pk_op(&b, 0x80);
    pk_op(&b, 2);
    pk_op(&b, 'i'); /* INST */
    pk_expect(&b, WK_ENOTSUP, "opcode 0x69", "offset 2", NULL);
    pk_op(&b, 0x80);
    pk_op(&b, 6);
    pk_expect(&b, WK_ENOTSUP, "protocol 6", NULL);
    pk_op(&b, 0x80);
    pk_expect(&b, WK_EINVAL, "truncated", NULL);
    pk_op(&b, '}');
    pk_expect(&b, WK_EINVAL, "no STOP", NULL);
    const uint8_t ops_needing_bytes[] = {'K', 'M', 'J', 0x8a, 'G', 'X', 0x8c, 0x8d, 'q', 'r',
                                         'h', 'j', 0x95};
    for (size_t i = 0; i < sizeof(ops_needing_bytes); i++) {
        pk_op(&b, 'N');
        pk_op(&b, ops_needing_bytes[i]);
        pk_expect(&b, WK_EINVAL, "truncated", NULL);
    }
    pk_op(&b, 0x8a);
    pk_op(&b, 4);
    pk_op(&b, 1);
    pk_expect(&b, WK_EINVAL, "truncated", NULL);
    pk_op(&b, 0x8a);
    pk_op(&b, 9);
    pk_expect(&b, WK_ENOTSUP, "9 bytes", NULL);
    pk_op(&b, 'X');
    buf_le(&b, 10, 4);
    buf_raw(&b, "abc", 3);
    pk_expect(&b, WK_EINVAL, "truncated", NULL);
    /* stack underflow, also across a MARK */
    pk_op(&b, '.');
    pk_expect(&b, WK_EINVAL, "underflow", NULL);
    pk_op(&b, 'N');
    pk_op(&b, '(');
    pk_op(&b, '.');
    pk_expect(&b, WK_EINVAL, "underflow", NULL);
    pk_op(&b, 'N');
    pk_op(&b, '(');
    pk_op(&b, 0x85);
    pk_expect(&b, WK_EINVAL, "underflow", NULL);
    pk_op(&b, 'q');
    pk_op(&b, 0);
    pk_expect(&b, WK_EINVAL, "underflow", NULL);
    pk_op(&b, 'b');
    pk_expect(&b, WK_EINVAL, "underflow", NULL);
    pk_op(&b, 't');
    pk_expect(&b, WK_EINVAL, "MARK", NULL);
    /* memo */
    pk_op(&b, 'h');
    pk_op(&b, 3);
    pk_expect(&b, WK_EINVAL, "memo index 3", NULL);
    pk_op(&b, 'N');
    pk_op(&b, 'q');
    pk_op(&b, 1);
    pk_op(&b, 'h');
    pk_op(&b, 0);
    pk_expect(&b, WK_EINVAL, "memo index 0", NULL);
    pk_op(&b, 'N');
    pk_op(&b, 'r');
    buf_le(&b, WK_PTH_MAX_MEMO, 4);
    pk_expect(&b, WK_ETOOBIG, "memo index", NULL);
    pk_op(&b, 'N');
    pk_op(&b, 'r');
    buf_le(&b, WK_PTH_MAX_MEMO - 1, 4);
    pk_op(&b, 'j');
    buf_le(&b, 0xffffffffu, 4);
    pk_expect(&b, WK_EINVAL, "memo index 4294967295", NULL);
    /* top is not a dict */
    pk_op(&b, ']');
    pk_op(&b, '.');
    pk_expect(&b, WK_EINVAL, "top is a list", NULL);
    pk_op(&b, 'N');
    pk_op(&b, '.');
    pk_expect(&b, WK_EINVAL, "top is a None", NULL);
    /* SETITEM(S) / APPEND(S) / BUILD on the wrong things */
    pk_op(&b, ']');
    pk_op(&b, 'N');
    pk_op(&b, 'N');
    pk_op(&b, 's');
    pk_expect(&b, WK_EINVAL, "SETITEM on a list", NULL);
    pk_op(&b, '}');
    pk_op(&b, 'N');
    pk_op(&b, 's');
    pk_expect(&b, WK_EINVAL, "underflow", NULL);
    pk_op(&b, '}');
    pk_op(&b, '(');
    pk_op(&b, 'N');
    pk_op(&b, 'u');
    pk_expect(&b, WK_EINVAL, "odd", NULL);
    pk_op(&b, '(');
    pk_op(&b, 'N');
    pk_op(&b, 'N');
    pk_op(&b, 'u');
    pk_expect(&b, WK_EINVAL, "SETITEMS", NULL);
    pk_op(&b, 'u');
    pk_expect(&b, WK_EINVAL, "MARK", NULL);
    pk_op(&b, ')');
    pk_op(&b, '(');
    pk_op(&b, 'u');
    pk_expect(&b, WK_EINVAL, "SETITEM on a tuple", NULL);
    pk_op(&b, '}');
    pk_op(&b, 'N');
    pk_op(&b, 'a');
    pk_expect(&b, WK_EINVAL, "APPEND on a dict", NULL);
    pk_op(&b, 'N');
    pk_op(&b, 'a');
    pk_expect(&b, WK_EINVAL, "underflow", NULL);
    pk_op(&b, '(');
    pk_op(&b, 'N');
    pk_op(&b, 'e');
    pk_expect(&b, WK_EINVAL, "APPENDS", NULL);
    pk_op(&b, 'e');
    pk_expect(&b, WK_EINVAL, "MARK", NULL);
    pk_op(&b, ']');
    pk_op(&b, '}');
    pk_op(&b, 'b');
    pk_expect(&b, WK_EINVAL, "BUILD on a list", NULL);
    /* REDUCE */
    pk_op(&b, 'N');
    pk_op(&b, ')');
    pk_op(&b, 'R');
    pk_expect(&b, WK_EINVAL, "REDUCE on a None", NULL);
    pk_global(&b, "collections", "OrderedDict");
    pk_op(&b, ']');
    pk_op(&b, 'R');
    pk_expect(&b, WK_EINVAL, "not a tuple", NULL);
    pk_global(&b, "collections", "OrderedDict");
    pk_op(&b, 'N');
    pk_op(&b, 0x85);
    pk_op(&b, 'R');
    pk_expect(&b, WK_EINVAL, "OrderedDict called with 1", NULL);
    pk_global(&b, "torch", "HalfStorage");
    pk_op(&b, ')');
    pk_op(&b, 'R');
    pk_expect(&b, WK_EINVAL, "torch.HalfStorage called", NULL);
    pk_global(&b, "torch._utils", "_rebuild_tensor_v2");
    pk_op(&b, ')');
    pk_op(&b, 'R');
    pk_expect(&b, WK_EINVAL, "0 arguments", NULL);
    pk_global(&b, "torch._utils", "_rebuild_parameter");
    pk_op(&b, ')');
    pk_op(&b, 'R');
    pk_expect(&b, WK_EINVAL, "_rebuild_parameter", NULL);
    /* each _rebuild_tensor_v2 argument of the wrong kind */
    for (int bad = 0; bad < 9; bad++) {
        pk_global(&b, "torch._utils", "_rebuild_tensor_v2");
        pk_op(&b, '(');
        if (bad == 0)
            pk_op(&b, 'N');
        else
            pk_storage(&b, "FloatStorage", "0", 8);
        if (bad == 1)
            pk_op(&b, 'N');
        else
            pk_int(&b, 0);
        if (bad == 2)
            pk_op(&b, 'N');
        else if (bad == 3)
            pk_ints(&b, 2, (const int64_t[]){1, 2}); /* size and stride lengths differ */
        else if (bad == 4) {
            pk_op(&b, '(');
            pk_op(&b, 'N');
            pk_op(&b, 't');
        } else
            pk_ints(&b, 1, s2);
        if (bad == 5)
            pk_op(&b, ')');
        else
            pk_ints(&b, 1, st1);
        if (bad == 6)
            pk_int(&b, 0);
        else
            pk_op(&b, 0x89);
        if (bad == 7) { /* a non-empty hooks dict */
            pk_op(&b, '}');
            pk_op(&b, 'N');
            pk_op(&b, 'N');
            pk_op(&b, 's');
        } else {
            pk_op(&b, '}');
        }
        if (bad == 8)
            pk_int(&b, 1); /* metadata neither dict nor None */
        pk_op(&b, 't');
        pk_op(&b, 'R');
        pk_expect(&b, WK_EINVAL, "_rebuild_tensor_v2 arguments", NULL);
    }
    /* BINPERSID records */
    for (int bad = 0; bad < 7; bad++) {
        pk_op(&b, '(');
        pk_str(&b, bad == 0 ? "storagex" : "storage");
        if (bad == 1)
            pk_global(&b, "collections", "OrderedDict");
        else
            pk_global(&b, "torch", "FloatStorage");
        if (bad == 2)
            pk_int(&b, 0);
        else if (bad == 3)
            pk_strn(&b, "a\0", 2);
        else
            pk_str(&b, "0");
        if (bad == 4)
            pk_int(&b, 0);
        else
            pk_str(&b, "cpu");
        if (bad == 5)
            pk_int(&b, -1);
        else
            pk_int(&b, 8);
        if (bad == 6)
            pk_op(&b, 'N'); /* a 6-tuple */
        pk_op(&b, 't');
        pk_op(&b, 'Q');
        pk_expect(&b, WK_EINVAL, "persistent id", NULL);
    }
    pk_op(&b, 'N');
    pk_op(&b, 'Q');
    pk_expect(&b, WK_EINVAL, "5-tuple", NULL);
    (void)l;
    (void)d;
}

static void
test_pickle_limits(void **state)
{
    (void)state;
    buf b = {0};
    /* stack depth */
    for (size_t i = 0; i <= WK_PTH_MAX_STACK; i++)
        pk_op(&b, 'N');
    pk_expect(&b, WK_ETOOBIG, "stack deeper", NULL);
    /* marks */
    for (size_t i = 0; i <= WK_PTH_MAX_MARKS; i++)
        pk_op(&b, '(');
    pk_expect(&b, WK_ETOOBIG, "MARK", NULL);
    /* string length (refused before the bytes are needed) */
    pk_op(&b, 'X');
    buf_le(&b, WK_PTH_MAX_STR + 1, 4);
    pk_expect(&b, WK_ETOOBIG, "string", NULL);
    pk_op(&b, 0x8d);
    buf_le(&b, UINT64_MAX, 8);
    pk_expect(&b, WK_ETOOBIG, "string", NULL);
    /* values: a list of WK_PTH_MAX_OBJECTS Nones */
    pk_op(&b, ']');
    for (size_t i = 0; i < WK_PTH_MAX_OBJECTS / 8192 + 1; i++) {
        pk_op(&b, '(');
        for (int k = 0; k < 8192; k++)
            pk_op(&b, 'N');
        pk_op(&b, 'e');
    }
    pk_expect(&b, WK_ETOOBIG, "values", NULL);
    /* container items: one None appended WK_PTH_MAX_ITEMS times through the memo */
    pk_op(&b, ']');
    pk_op(&b, 'N');
    pk_op(&b, 'q');
    pk_op(&b, 1);
    pk_op(&b, 'a');
    for (size_t i = 0; i < WK_PTH_MAX_ITEMS / 60000 + 1; i++) {
        pk_op(&b, '(');
        for (int k = 0; k < 60000; k++) {
            pk_op(&b, 'h');
            pk_op(&b, 1);
        }
        pk_op(&b, 'e');
    }
    pk_expect(&b, WK_ETOOBIG, "container items", NULL);
    /* tensors: one tensor under WK_PTH_MAX_TENSORS + 1 names */
    pk_begin(&b);
    pk_str(&b, "t0");
    pk_tensor(&b, "BFloat16Storage", "1", 1, (const int64_t[]){2});
    pk_op(&b, 'q');
    pk_op(&b, 1);
    char name[32];
    for (size_t i = 1; i <= WK_PTH_MAX_TENSORS; i++) {
        if (i % 10000 == 0) { /* keep SETITEMS batches small, as pickle does */
            pk_op(&b, 'u');
            pk_op(&b, '(');
        }
        snprintf(name, sizeof(name), "t%zu", i);
        pk_str(&b, name);
        pk_op(&b, 'h');
        pk_op(&b, 1);
    }
    pk_end(&b);
    pk_expect(&b, WK_ETOOBIG, "more than 65536 tensors", NULL);
}

/* ---------------------------------------------------------------- zip ---- */

/* One entry of a crafted archive, and the defects to give it. */
typedef struct zent {
    const char *name;       /* entry name */
    const void *data;       /* stored bytes */
    size_t len;             /* bytes of data */
    uint16_t method;        /* compression method in both headers */
    uint16_t flags;         /* general purpose flags in both headers */
    int zip64;              /* sizes and offset through the zip64 extra field */
    int zip64_short;        /* zip64 markers with a too-short extra field */
    const char *local_name; /* a different name in the local header */
    int local_method;       /* >= 0: a different method in the local header */
    int64_t csize_delta;    /* added to the central compressed size */
    int64_t size_delta;     /* added to both central sizes */
    int64_t lho_delta;      /* added to the central local header offset */
    uint16_t disk;          /* disk number start */
} zent;

typedef struct zopts {
    int zip64_end;        /* write zip64 end record and locator */
    uint16_t comment_len; /* end record comment of this many bytes */
} zopts;

static uint8_t *
zip_build(const zent *e, int n, const zopts *o, size_t *len)
{
    buf b = {0};
    uint64_t lho[32];
    assert_true(n <= 32);
    for (int i = 0; i < n; i++) {
        lho[i] = b.len;
        const char *ln = e[i].local_name ? e[i].local_name : e[i].name;
        buf_le(&b, 0x04034b50, 4);
        buf_le(&b, 45, 2);
        buf_le(&b, e[i].flags | 0x0808, 2);
        buf_le(&b, e[i].local_method >= 0 ? (uint16_t)e[i].local_method : e[i].method, 2);
        buf_le(&b, 0, 4); /* time, date */
        buf_le(&b, 0, 4); /* crc */
        buf_le(&b, 0, 4); /* sizes: in the data descriptor, as torch writes them */
        buf_le(&b, 0, 4);
        buf_le(&b, strlen(ln), 2);
        buf_le(&b, 4 + 12, 2); /* an "FB" padding extra field like torch's */
        buf_raw(&b, ln, strlen(ln));
        buf_le(&b, 0x4246, 2);
        buf_le(&b, 12, 2);
        buf_raw(&b, "ZZZZZZZZZZZZ", 12);
        buf_raw(&b, e[i].data, e[i].len);
    }
    uint64_t cd = b.len;
    for (int i = 0; i < n; i++) {
        int z = e[i].zip64 || e[i].zip64_short;
        buf_le(&b, 0x02014b50, 4);
        buf_le(&b, 45, 2);
        buf_le(&b, 45, 2);
        buf_le(&b, e[i].flags | 0x0808, 2);
        buf_le(&b, e[i].method, 2);
        buf_le(&b, 0, 4);
        buf_le(&b, 0, 4);
        uint64_t us = (uint64_t)((int64_t)e[i].len + e[i].size_delta);
        uint64_t cs = us + (uint64_t)e[i].csize_delta;
        uint64_t off = (uint64_t)((int64_t)lho[i] + e[i].lho_delta);
        buf_le(&b, z ? 0xffffffffu : cs, 4);
        buf_le(&b, z ? 0xffffffffu : us, 4);
        buf_le(&b, strlen(e[i].name), 2);
        buf_le(&b, e[i].zip64 ? 4 + 8 + 4 + 28 : e[i].zip64_short ? 4 + 8 : 0, 2);
        buf_le(&b, 0, 2);                         /* comment */
        buf_le(&b, z ? 0xffff : e[i].disk, 2);    /* disk start */
        buf_le(&b, 0, 2);
        buf_le(&b, 0, 4);
        buf_le(&b, z ? 0xffffffffu : off, 4);
        buf_raw(&b, e[i].name, strlen(e[i].name));
        if (e[i].zip64) {
            buf_le(&b, 0x5455, 2); /* an unrelated extra field first */
            buf_le(&b, 8, 2);
            buf_le(&b, 0, 8);
            buf_le(&b, 0x0001, 2);
            buf_le(&b, 28, 2);
            buf_le(&b, us, 8);
            buf_le(&b, cs, 8);
            buf_le(&b, off, 8);
            buf_le(&b, e[i].disk, 4);
        } else if (e[i].zip64_short) {
            buf_le(&b, 0x0001, 2);
            buf_le(&b, 12, 2); /* claims 12 bytes, which also runs past the field */
            buf_le(&b, e[i].len, 8);
        }
    }
    uint64_t cd_size = b.len - cd;
    if (o && o->zip64_end) {
        uint64_t e64 = b.len;
        buf_le(&b, 0x06064b50, 4);
        buf_le(&b, 44, 8);
        buf_le(&b, 45, 2);
        buf_le(&b, 45, 2);
        buf_le(&b, 0, 4);
        buf_le(&b, 0, 4);
        buf_le(&b, (uint64_t)n, 8);
        buf_le(&b, (uint64_t)n, 8);
        buf_le(&b, cd_size, 8);
        buf_le(&b, cd, 8);
        buf_le(&b, 0x07064b50, 4);
        buf_le(&b, 0, 4);
        buf_le(&b, e64, 8);
        buf_le(&b, 1, 4);
    }
    int big = o && o->zip64_end;
    buf_le(&b, 0x06054b50, 4);
    buf_le(&b, 0, 2);
    buf_le(&b, 0, 2);
    buf_le(&b, big ? 0xffff : (uint64_t)n, 2);
    buf_le(&b, big ? 0xffff : (uint64_t)n, 2);
    buf_le(&b, big ? 0xffffffffu : cd_size, 4);
    buf_le(&b, big ? 0xffffffffu : cd, 4);
    uint16_t cl = o ? o->comment_len : 0;
    buf_le(&b, cl, 2);
    for (int i = 0; i < cl; i++)
        buf_u8(&b, 'c');
    *len = b.len;
    return b.p;
}

/* The pickle of the standard crafted archive: w = f32[2,2] at storage "0", v = w[1]. */
static void
std_pickle(buf *b)
{
    int64_t s22[2] = {2, 2}, s2[1] = {2}, st1[1] = {1};
    pk_begin(b);
    pk_str(b, "w");
    pk_tensor(b, "FloatStorage", "0", 2, s22);
    pk_str(b, "v");
    pk_tensor_ex(b, "FloatStorage", "0", 4, 2, 1, s2, st1);
    pk_end(b);
}

static const float std_data[4] = {1.0f, 2.0f, 3.0f, 4.0f};

/* Entries of the standard archive, which tests then damage: pkl, data/0, byteorder, version. */
static int
std_entries(zent *e, buf *pkl)
{
    memset(e, 0, 4 * sizeof(*e));
    buf_free(pkl);
    std_pickle(pkl);
    e[0] = (zent){.name = "arch/data.pkl", .data = pkl->p, .len = pkl->len, .local_method = -1};
    e[1] = (zent){.name = "arch/data/0", .data = std_data, .len = sizeof(std_data),
                  .local_method = -1};
    e[2] = (zent){.name = "arch/byteorder", .data = "little", .len = 6, .local_method = -1};
    e[3] = (zent){.name = "arch/version", .data = "3\n", .len = 2, .local_method = -1};
    return 4;
}

/* Parses an archive and expects err with each substring in the diag. */
static void
zip_expect(const zent *e, int n, const zopts *o, wk_err err, ...)
{
    size_t len;
    uint8_t *z = zip_build(e, n, o, &len);
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    wk_diag d = {""};
    wk_err got = wk_pth_parse(z, len, &l, &d);
    if (got != err)
        fail_msg("got %s (%s), want %s", wk_err_name(got), d.msg, wk_err_name(err));
    if (err == WK_OK) {
        assert_int_equal(l.n, 2);
        float out[4];
        const wk_tensor *t = list_find(&l, "w");
        assert_non_null(t);
        assert_int_equal(wk_tensor_read_f32(t, 0, 4, out), WK_OK);
        assert_true(out[0] == 1.0f && out[3] == 4.0f);
        t = list_find(&l, "v");
        assert_int_equal(wk_tensor_read_f32(t, 0, 2, out), WK_OK);
        assert_true(out[0] == 3.0f && out[1] == 4.0f);
    } else {
        assert_int_equal(l.n, 0);
    }
    va_list ap;
    va_start(ap, err);
    for (const char *s = va_arg(ap, const char *); s != NULL; s = va_arg(ap, const char *))
        if (strstr(d.msg, s) == NULL)
            fail_msg("diag '%s' lacks '%s'", d.msg, s);
    va_end(ap);
    wk_tensor_list_fini(&l);
    free(z);
}

static void
test_zip_good(void **state)
{
    (void)state;
    zent e[8];
    buf pkl = {0};
    int n = std_entries(e, &pkl);
    zip_expect(e, n, NULL, WK_OK, NULL);
    zopts o = {.comment_len = 100};
    zip_expect(e, n, &o, WK_OK, NULL);
    o.zip64_end = 1;
    zip_expect(e, n, &o, WK_OK, NULL);
    for (int i = 0; i < n; i++)
        e[i].zip64 = 1;
    zip_expect(e, n, &o, WK_OK, NULL);
    /* without byteorder (torch < 2.1), in another entry order */
    n = std_entries(e, &pkl);
    zent r[3] = {e[3], e[1], e[0]};
    zip_expect(r, 3, NULL, WK_OK, NULL);
    /* other files in the archive, deeper data.pkl names and other folders are ignored */
    e[4] = (zent){.name = "arch/.data/serialization_id", .data = "x", .len = 1,
                  .local_method = -1};
    e[5] = (zent){.name = "a/b/data.pkl", .data = "?", .len = 1, .method = 8,
                  .local_method = -1};
    e[6] = (zent){.name = "data.pkl", .data = "?", .len = 1, .local_method = -1};
    e[7] = (zent){.name = "other/x", .data = "?", .len = 1, .flags = 1, .local_method = -1};
    zip_expect(e, 8, NULL, WK_OK, NULL);
    buf_free(&pkl);
}

static void
test_zip_entries(void **state)
{
    (void)state;
    zent e[8];
    buf pkl = {0};
    int n = std_entries(e, &pkl);
    /* compressed and encrypted entries, data and pickle */
    e[1].method = 8;
    zip_expect(e, n, NULL, WK_ENOTSUP, "tensor 'w'", "'arch/data/0'", "compressed", NULL);
    e[1].method = 0;
    e[1].flags = 1;
    zip_expect(e, n, NULL, WK_ENOTSUP, "tensor 'w'", "encrypted", NULL);
    e[1].flags = 0x40;
    zip_expect(e, n, NULL, WK_ENOTSUP, "encrypted", NULL);
    e[1].flags = 0;
    e[0].method = 8;
    zip_expect(e, n, NULL, WK_ENOTSUP, "'arch/data.pkl'", "compressed", NULL);
    e[0].method = 0;
    e[1].local_method = 8;
    zip_expect(e, n, NULL, WK_ENOTSUP, "'arch/data/0'", "local header", NULL);
    e[1].local_method = -1;
    /* stored but sizes differ */
    e[1].csize_delta = 1;
    zip_expect(e, n, NULL, WK_EINVAL, "'arch/data/0'", "sizes differ", NULL);
    e[1].csize_delta = 0;
    /* local header names another entry, or is not where the directory says */
    e[1].local_name = "arch/data/X";
    zip_expect(e, n, NULL, WK_EINVAL, "'arch/data/0'", "names another", NULL);
    e[1].local_name = NULL;
    e[1].lho_delta = 1;
    zip_expect(e, n, NULL, WK_EINVAL, "'arch/data/0'", "local header", NULL);
    e[1].lho_delta = 1 << 20;
    zip_expect(e, n, NULL, WK_EINVAL, "'arch/data/0'", "out of bounds", NULL);
    e[1].lho_delta = 0;
    /* data running into the central directory: the last entry claims one more byte */
    zent r[4] = {e[0], e[2], e[3], e[1]};
    r[3].size_delta = 1;
    zip_expect(r, 4, NULL, WK_EINVAL, "'arch/data/0'", "run past", NULL);
    /* a storage entry bigger than its record */
    static uint8_t large[64];
    r[3].size_delta = 0;
    r[3].data = large;
    r[3].len = sizeof(large);
    zip_expect(r, 4, NULL, WK_EINVAL, "'w'", "holds 64 bytes", NULL);
    /* missing storage entry */
    zip_expect(e, 1, NULL, WK_EINVAL, "tensor 'w'", "no zip entry 'arch/data/0'", NULL);
    /* no data.pkl, two of them, none with a folder */
    zip_expect(e + 1, n - 1, NULL, WK_EINVAL, "no '<name>/data.pkl'", NULL);
    zent two[5] = {e[0], e[1], e[2], e[3], e[0]};
    two[4].name = "other/data.pkl";
    zip_expect(two, 5, NULL, WK_EINVAL, "two data.pkl", NULL);
    two[4].name = "/data.pkl";
    zip_expect(two, 5, NULL, WK_OK, NULL); /* an empty folder name does not count */
    /* the same entry twice */
    two[4] = e[1];
    zip_expect(two, 5, NULL, WK_EINVAL, "'arch/data/0' appears twice", NULL);
    /* byteorder */
    e[2].data = "big";
    e[2].len = 3;
    zip_expect(e, n, NULL, WK_ENOTSUP, "big-endian", NULL);
    e[2].data = "middle";
    e[2].len = 6;
    zip_expect(e, n, NULL, WK_EINVAL, "byteorder", NULL);
    e[2].data = "littl";
    e[2].len = 5;
    zip_expect(e, n, NULL, WK_EINVAL, "byteorder", NULL);
    e[2].data = "little";
    e[2].len = 6;
    e[2].method = 8;
    zip_expect(e, n, NULL, WK_ENOTSUP, "byteorder", "compressed", NULL);
    e[2].method = 0;
    /* disk numbers and zip64 extra fields */
    e[1].disk = 1;
    zip_expect(e, n, NULL, WK_ENOTSUP, "'arch/data/0'", "disk 1", NULL);
    e[1].zip64 = 1;
    zopts o = {.zip64_end = 1};
    zip_expect(e, n, &o, WK_ENOTSUP, "disk 1", NULL);
    e[1].disk = 0;
    e[1].zip64 = 0;
    e[1].zip64_short = 1;
    zip_expect(e, n, NULL, WK_EINVAL, "'arch/data/0'", "zip64 extra", NULL);
    buf_free(&pkl);
}

static void
test_zip_directory(void **state)
{
    (void)state;
    zent e[4];
    buf pkl = {0};
    int n = std_entries(e, &pkl);
    size_t len;
    uint8_t *z = zip_build(e, n, NULL, &len);
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    wk_diag d = {""};
    uint8_t *eo = z + len - 22;
    assert_int_equal(wk_pth_parse(z, 21, &l, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "not a zip"));
    /* every truncation and every single-byte change: an error or a valid result, never a crash */
    for (size_t cut = 0; cut < len; cut++) {
        assert_int_not_equal(wk_pth_parse(z, cut, &l, &d), WK_OK);
        assert_int_equal(l.n, 0);
    }
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            z[i] ^= (uint8_t)(1u << bit);
            if (wk_pth_parse(z, len, &l, &d) == WK_OK) {
                for (size_t k = 0; k < l.n; k++) {
                    assert_true((const uint8_t *)l.v[k].data >= z);
                    assert_true((const uint8_t *)l.v[k].data + l.v[k].nbytes <= z + len);
                }
            }
            wk_tensor_list_fini(&l);
            z[i] ^= (uint8_t)(1u << bit);
        }
    }
    /* a comment length that does not reach the end */
    eo[20] = 1;
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "no end of central directory"));
    eo[20] = 0;
    /* multi-disk */
    eo[4] = 1;
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_ENOTSUP);
    assert_non_null(strstr(d.msg, "multi-disk"));
    eo[4] = 0;
    eo[8] = 3; /* entries on this disk != total */
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_ENOTSUP);
    eo[8] = (uint8_t)n;
    /* directory out of bounds, too long, or with more entries than it holds */
    uint8_t save[4];
    memcpy(save, eo + 16, 4);
    memcpy(eo + 16, "\x00\x00\x00\x10", 4);
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "out of bounds"));
    memcpy(eo + 16, save, 4);
    eo[12] += 1;
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "out of bounds"));
    eo[12] -= 1;
    eo[8] = eo[10] = (uint8_t)(n + 1);
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "truncated at entry 4"));
    eo[8] = eo[10] = (uint8_t)n;
    /* zip64 markers without the zip64 records */
    memcpy(save, eo + 16, 4);
    memcpy(eo + 16, "\xff\xff\xff\xff", 4);
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "zip64"));
    memcpy(eo + 16, save, 4);
    /* a central header whose name runs past the directory */
    size_t cd = (size_t)(eo[16] | eo[17] << 8);
    z[cd + 28] = 0xff;
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "truncated at entry 0"));
    assert_int_equal(wk_pth_parse(z, len, &l, NULL), WK_EINVAL); /* NULL diag */
    free(z);

    /* zip64 records: locator bounds, signature, disks, entry count */
    zopts o = {.zip64_end = 1};
    z = zip_build(e, n, &o, &len);
    eo = z + len - 22;
    uint8_t *loc = eo - 20, *e64 = loc - 56;
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_OK);
    wk_tensor_list_fini(&l);
    loc[8] += 1;
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "zip64 end"));
    loc[8] -= 1;
    loc[15] = 0x80;
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_EINVAL);
    loc[15] = 0;
    loc[4] = 1;
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_ENOTSUP);
    loc[4] = 0;
    loc[16] = 2;
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_ENOTSUP);
    loc[16] = 1;
    e64[16] = 1;
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_ENOTSUP);
    e64[16] = 0;
    e64[32 + 2] = 0x10; /* total entries 2^20 + n */
    e64[24 + 2] = 0x10;
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_ETOOBIG);
    assert_non_null(strstr(d.msg, "entries"));
    e64[32 + 2] = e64[24 + 2] = 0;
    e64[40 + 7] = 0x01; /* directory size huge */
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_EINVAL);
    e64[40 + 7] = 0;
    assert_int_equal(wk_pth_parse(z, len, &l, &d), WK_OK);
    wk_tensor_list_fini(&l);
    free(z);
    buf_free(&pkl);
}

static void
test_zip_big_pickle(void **state)
{
    (void)state;
    size_t n = WK_PTH_MAX_PICKLE + 1;
    uint8_t *big = calloc(1, n);
    assert_non_null(big);
    zent e = {.name = "a/data.pkl", .data = big, .len = n, .local_method = -1};
    zip_expect(&e, 1, NULL, WK_ETOOBIG, "data.pkl", NULL);
    free(big);
}

/* Duplicate names reach wk_tensor_set through a real file, which refuses them. */
static void
test_set_duplicates(void **state)
{
    (void)state;
    buf pkl = {0};
    pk_begin(&pkl);
    pk_str(&pkl, "w");
    pk_tensor(&pkl, "FloatStorage", "0", 1, (const int64_t[]){4});
    pk_op(&pkl, 'q');
    pk_op(&pkl, 7);
    pk_str(&pkl, "w");
    pk_op(&pkl, 'h');
    pk_op(&pkl, 7);
    pk_end(&pkl);
    zent e[2] = {
        {.name = "arch/data.pkl", .data = pkl.p, .len = pkl.len, .local_method = -1},
        {.name = "arch/data/0", .data = std_data, .len = sizeof(std_data), .local_method = -1},
    };
    size_t len;
    uint8_t *z = zip_build(e, 2, NULL, &len);
    char dir[] = "/tmp/wk_pth_dup.XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/dup.pth", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(z, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    wk_tensor_set *set = NULL;
    wk_diag d = {""};
    assert_int_equal(wk_tensor_set_open(path, &set, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "duplicate tensor name 'w'"));
    assert_null(set);
    /* the same archive without the duplicate opens */
    buf_free(&pkl);
    pk_begin(&pkl);
    pk_str(&pkl, "w");
    pk_tensor(&pkl, "FloatStorage", "0", 1, (const int64_t[]){4});
    pk_end(&pkl);
    e[0].data = pkl.p;
    e[0].len = pkl.len;
    free(z);
    z = zip_build(e, 2, NULL, &len);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(z, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(wk_tensor_set_open(path, &set, &d), WK_OK);
    assert_int_equal(wk_tensor_set_count(set), 1);
    wk_tensor_set_free(set);
    unlink(path);
    rmdir(dir);
    free(z);
    buf_free(&pkl);
}

/* ----------------------------------------------- torch-written files ---- */

static char fx_dir[512];  /* temp dir with the generated fixtures */
static int fx_available;  /* 1 once make_pth.py wrote them */
static int fx_missing;    /* 1 when Python or torch is absent */

static int
fx_setup(void **state)
{
    (void)state;
    const char *py = getenv("PYTHON");
    if (py == NULL || *py == '\0')
        py = "/usr/bin/python3";
    char script[512];
    const char *src = getenv("WKVM_SOURCE_DIR");
    if (src != NULL) {
        snprintf(script, sizeof(script), "%s/tests/fixtures/make_pth.py", src);
    } else { /* run by hand: next to this source file */
        const char *slash = strrchr(__FILE__, '/');
        int dl = slash ? (int)(slash - __FILE__) : 1;
        snprintf(script, sizeof(script), "%.*s/../fixtures/make_pth.py", dl,
                 slash ? __FILE__ : ".");
    }
    if (access(script, R_OK) != 0) {
        fprintf(stderr, "test_wk_pth: %s not found (set WKVM_SOURCE_DIR)\n", script);
        return -1;
    }
    const char *base = getenv("WKVM_BUILD_DIR");
    if (base == NULL)
        base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(fx_dir, sizeof(fx_dir), "%s/wk_pth_fixtures.XXXXXX", base);
    if (mkdtemp(fx_dir) == NULL) {
        fprintf(stderr, "test_wk_pth: mkdtemp %s: %s\n", fx_dir, strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execlp(py, py, script, fx_dir, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    if (rc == 127 || rc == 77) {
        fprintf(stderr, "test_wk_pth: %s: %s, skipping the torch fixtures\n", py,
                rc == 127 ? "python not found" : "torch not importable");
        fx_missing = 1;
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "test_wk_pth: %s %s failed (status %d)\n", py, script, rc);
        return -1;
    }
    fx_available = 1;
    return 0;
}

static int
fx_teardown(void **state)
{
    (void)state;
    DIR *dp = opendir(fx_dir);
    if (dp == NULL)
        return 0;
    struct dirent *de;
    char p[1024];
    while ((de = readdir(dp)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(p, sizeof(p), "%s/%s", fx_dir, de->d_name);
        unlink(p);
    }
    closedir(dp);
    rmdir(fx_dir);
    return 0;
}

static wk_tensor_set *
fx_open(const char *name)
{
    if (!fx_available)
        skip();
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", fx_dir, name);
    wk_tensor_set *set = NULL;
    wk_diag d = {""};
    wk_err err = wk_tensor_set_open(p, &set, &d);
    if (err != WK_OK)
        fail_msg("%s: %s (%s)", name, wk_err_name(err), d.msg);
    return set;
}

static void
fx_refused(const char *name, wk_err want, const char *s1, const char *s2)
{
    if (!fx_available)
        skip();
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", fx_dir, name);
    wk_tensor_set *set = NULL;
    wk_diag d = {""};
    wk_err err = wk_tensor_set_open(p, &set, &d);
    if (err != want)
        fail_msg("%s: got %s (%s), want %s", name, wk_err_name(err), d.msg, wk_err_name(want));
    assert_null(set);
    assert_non_null(strstr(d.msg, s1));
    if (s2)
        assert_non_null(strstr(d.msg, s2));
}

static void
expect_values(const wk_tensor_set *set, const char *name, wk_dtype dt, int ndim,
              const int64_t *shape, const float *vals)
{
    const wk_tensor *t = wk_tensor_set_find(set, name);
    if (t == NULL)
        fail_msg("no tensor '%s'", name);
    assert_int_equal(t->dtype, dt);
    assert_int_equal(t->ndim, ndim);
    for (int i = 0; i < ndim; i++)
        assert_int_equal(t->shape[i], shape[i]);
    size_t n = (size_t)wk_tensor_numel(t);
    assert_int_equal(t->nbytes, n * wk_dtype_size(dt));
    float *out = calloc(n + 1, sizeof(float));
    assert_non_null(out);
    assert_int_equal(wk_tensor_read_f32(t, 0, n, out), WK_OK);
    for (size_t i = 0; i < n; i++)
        if (out[i] != vals[i])
            fail_msg("%s[%zu] = %g, want %g", name, i, (double)out[i], (double)vals[i]);
    free(out);
}

static void
test_torch_f32(void **state)
{
    (void)state;
    wk_tensor_set *set = fx_open("f32.pth");
    assert_int_equal(wk_tensor_set_count(set), 4);
    expect_values(set, "emb.weight", WK_DTYPE_F32, 2, (const int64_t[]){2, 3},
                  (const float[]){0, 0.5f, 1, 1.5f, 2, 2.5f});
    expect_values(set, "blocks.0.ln.bias", WK_DTYPE_F32, 1, (const int64_t[]){3},
                  (const float[]){1.5f, -2, 3});
    expect_values(set, "scalar", WK_DTYPE_F32, 0, NULL, (const float[]){2.5f});
    expect_values(set, "empty", WK_DTYPE_F32, 2, (const int64_t[]){0, 4}, NULL);
    wk_tensor_set_free(set);
}

static void
test_torch_f16_shared(void **state)
{
    (void)state;
    wk_tensor_set *set = fx_open("f16.pth");
    float full[12];
    for (int i = 0; i < 12; i++)
        full[i] = (float)i / 4 - 1;
    expect_values(set, "full", WK_DTYPE_F16, 2, (const int64_t[]){4, 3}, full);
    expect_values(set, "row", WK_DTYPE_F16, 1, (const int64_t[]){3}, full + 3);
    /* the view points into the same storage, 3 elements in */
    const wk_tensor *f = wk_tensor_set_find(set, "full"), *r = wk_tensor_set_find(set, "row");
    assert_ptr_equal(r->data, (const uint8_t *)f->data + 6);
    wk_tensor_set_free(set);
}

static void
test_torch_bf16_many(void **state)
{
    (void)state;
    wk_tensor_set *set = fx_open("bf16.pth");
    assert_int_equal(wk_tensor_set_count(set), 301);
    expect_values(set, "w", WK_DTYPE_BF16, 2, (const int64_t[]){3, 2},
                  (const float[]){-0.75f, -0.5f, -0.25f, 0, 0.25f, 0.5f});
    char name[16];
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof(name), "t.%03d", i);
        /* torch rounds 257.. to bf16 the way wk_f32_to_bf16 does */
        float want = wk_bf16_to_f32(wk_f32_to_bf16((float)i));
        expect_values(set, name, WK_DTYPE_BF16, 1, (const int64_t[]){1}, &want);
    }
    wk_tensor_set_free(set);
}

static void
test_torch_module_param_nested(void **state)
{
    (void)state;
    wk_tensor_set *set = fx_open("module.pth");
    assert_int_equal(wk_tensor_set_count(set), 2);
    expect_values(set, "weight", WK_DTYPE_F32, 2, (const int64_t[]){2, 3},
                  (const float[]){1, 2, 3, 4, 5, 6});
    expect_values(set, "bias", WK_DTYPE_F32, 1, (const int64_t[]){2}, (const float[]){-1, -2});
    wk_tensor_set_free(set);
    set = fx_open("param.pth");
    expect_values(set, "p", WK_DTYPE_F32, 1, (const int64_t[]){2}, (const float[]){0.25f, 0.75f});
    wk_tensor_set_free(set);
    set = fx_open("nested.pth");
    assert_int_equal(wk_tensor_set_count(set), 2);
    expect_values(set, "a", WK_DTYPE_F32, 1, (const int64_t[]){1}, (const float[]){7});
    expect_values(set, "b", WK_DTYPE_F32, 2, (const int64_t[]){1, 1}, (const float[]){8});
    wk_tensor_set_free(set);
}

static void
test_torch_refused(void **state)
{
    (void)state;
    fx_refused("transposed.pth", WK_EINVAL, "tensor 'wt'", "not contiguous");
    fx_refused("strided.pth", WK_EINVAL, "tensor 'ws'", "not contiguous");
    fx_refused("int64.pth", WK_ENOTSUP, "tensor 'ids'", "LongStorage");
    fx_refused("legacy.pth", WK_ENOTSUP, "legacy", NULL);
}

/* Every truncation and byte flip of a real file: an error or a sane result, never a crash. */
static void
test_torch_damaged(void **state)
{
    (void)state;
    if (!fx_available)
        skip();
    char p[1024];
    snprintf(p, sizeof(p), "%s/module.pth", fx_dir);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    uint8_t img[4096];
    size_t len = fread(img, 1, sizeof(img), f);
    fclose(f);
    assert_true(len > 100 && len < sizeof(img));
    wk_tensor_list l;
    wk_tensor_list_init(&l);
    wk_diag d = {""};
    assert_int_equal(wk_pth_parse(img, len, &l, &d), WK_OK);
    assert_int_equal(l.n, 2);
    wk_tensor_list_fini(&l);
    for (size_t cut = 0; cut < len; cut++)
        assert_int_not_equal(wk_pth_parse(img, cut, &l, &d), WK_OK);
    int ok = 0;
    for (size_t i = 0; i < len; i++) {
        for (int v = 0; v < 3; v++) {
            uint8_t old = img[i];
            img[i] = v == 0 ? (uint8_t)(old ^ 1) : v == 1 ? 0xff : 0x00;
            if (wk_pth_parse(img, len, &l, &d) == WK_OK) {
                ok++;
                for (size_t k = 0; k < l.n; k++) {
                    const wk_tensor *t = &l.v[k];
                    assert_true((const uint8_t *)t->data >= img);
                    assert_true((const uint8_t *)t->data + t->nbytes <= img + len);
                }
            }
            wk_tensor_list_fini(&l);
            img[i] = old;
        }
    }
    assert_true(ok > 0); /* padding and unused fields do not matter */
}

int
main(void)
{
    const struct CMUnitTest crafted[] = {
        cmocka_unit_test(test_pickle_good),
        cmocka_unit_test(test_pickle_other_opcodes),
        cmocka_unit_test(test_pickle_nested),
        cmocka_unit_test(test_pickle_tensor_errors),
        cmocka_unit_test(test_pickle_structure_errors),
        cmocka_unit_test(test_pickle_limits),
        cmocka_unit_test(test_zip_good),
        cmocka_unit_test(test_zip_entries),
        cmocka_unit_test(test_zip_directory),
        cmocka_unit_test(test_zip_big_pickle),
        cmocka_unit_test(test_set_duplicates),
    };
    const struct CMUnitTest torch[] = {
        cmocka_unit_test(test_torch_f32),
        cmocka_unit_test(test_torch_f16_shared),
        cmocka_unit_test(test_torch_bf16_many),
        cmocka_unit_test(test_torch_module_param_nested),
        cmocka_unit_test(test_torch_refused),
        cmocka_unit_test(test_torch_damaged),
    };
    int failed = cmocka_run_group_tests_name("crafted", crafted, NULL, NULL);
    failed += cmocka_run_group_tests_name("torch", torch, fx_setup, fx_teardown);
    if (failed)
        return 1;
    return fx_missing ? 77 : 0;
}
