/*
 * wkvm-infer: runs a model directory on one backend from the command line,
 * without the controller: logits for a token list, greedy generation,
 * tokenizer round trips, and a quick throughput measurement. Tests and
 * benchmarks drive it, so its interface is fixed:
 *
 *   wkvm-infer --model DIR --tokens 1,2,3 --logits-out FILE
 *       float32 little-endian logits, one row of vocab floats per position
 *   wkvm-infer --model DIR --tokens 1,2,3 --generate N
 *       N greedy token ids, space separated, newline at the end
 *   wkvm-infer --model DIR --tokens 1,2,3 --batch-check 5 [--generate N]
 *     (exit 1 unless the row's bits are the same alone and in a batch)
 *   wkvm-infer --model DIR --tokens 1,2,3 --slot-check [--generate N]
 *     (exit 1 unless fork, hibernate/resume and KV-pool refusals behave; be.h)
 *   ... --batch-check / --slot-check --check-tolerance 1e-3
 *     (the same within max|diff|/std < T: the CUDA backend's promise)
 *   wkvm-infer --model DIR --encode   (UTF-8 on stdin -> ids on stdout)
 *   wkvm-infer --model DIR --decode   (ids on stdin -> text on stdout)
 *
 * Bad input gives one line on stderr and a non-zero exit (2 for usage, 1
 * otherwise). It never writes a partial --logits-out under its final name.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "be.h"
#include "be_cpu_kernels.h"
#include "wk_cfg_tool.h"
#include "wk_err.h"
#include "wk_tok.h"
#include "wrk_model.h"

#define INFER_MAX_TOKENS (1u << 24) /* ids in --tokens or on stdin */
#define INFER_MAX_GENERATE 1000000  /* --generate */
#define INFER_MAX_BATCH 1024        /* --bench-batch */
#define INFER_MAX_INPUT (256u << 20) /* bytes read from stdin */

typedef struct infer_opts {
    const char *model;      /* --model DIR */
    const char *tokens;     /* --tokens LIST */
    const char *logits_out; /* --logits-out FILE */
    const char *vocab;      /* --vocab FILE */
    const char *backend;    /* --backend NAME */
    const char *quantize;   /* --quantize none|q8_0 */
    const char *check_tol_s; /* --check-tolerance T as given, NULL = not given */
    uint32_t generate_n;    /* --generate N (when given) */
    long generate;          /* --generate N, -1 = not given */
    uint32_t threads;       /* --threads N */
    uint32_t chunk;         /* --prefill-chunk N */
    uint32_t bench_batch;   /* --bench-batch B */
    uint32_t bench_prefill; /* --bench-prefill T */
    uint32_t batch_check;   /* --batch-check B, 0 = off */
    uint32_t kv_pages;      /* --kv-pages N, 0 = the backend's default */
    bool slot_check;        /* --slot-check */
    double check_tol;       /* --check-tolerance T, 0 = bit for bit */
    bool encode, decode;    /* modes */
    bool fp32, bench;       /* flags */
    bool q8_0;              /* --quantize q8_0 */
    const char *cpu_matmul; /* --cpu-matmul fp32|bf16 */
} infer_opts;

/* The option table: --help prints it (wk_cfg_tool). */
static const wk_cfg_opt infer_table[] = {
    {"model", WK_CFG_STR, NULL, 0, 0,
     "model directory (checkpoint + optional vocab), or one .gguf/.pth/.safetensors file (its "
     "vocab beside it); required"},
    {"tokens", WK_CFG_STR, NULL, 0, 64u << 20, "prompt token ids, comma or space separated (1,2,3)"},
    {"logits-out", WK_CFG_STR, NULL, 0, 0,
     "FILE: write float32 LE logits, one row of vocab floats per --tokens position"},
    {"generate", WK_CFG_U64, NULL, 0, INFER_MAX_GENERATE,
     "print N greedy token ids after the prompt, space separated, newline at the end (token 0 "
     "does not stop)"},
    {"encode", WK_CFG_BOOL, NULL, 0, 0, "read text on stdin, print its token ids"},
    {"decode", WK_CFG_BOOL, NULL, 0, 0,
     "read token ids on stdin, print their text (no newline added)"},
    {"vocab", WK_CFG_STR, NULL, 0, 0,
     "tokenizer FILE (default DIR/tokenizer.json, else DIR/rwkv_vocab_v20230424.txt)"},
    {"threads", WK_CFG_U64, "0", 0, 1024, "CPU threads, 0 = all cores"},
    {"backend", WK_CFG_STR, "cpu", 0, 0, "cpu, cuda or auto (= cpu for now)"},
    {"prefill-chunk", WK_CFG_U64, "256", 1, 65536, "prompt tokens per step"},
    {"fp32", WK_CFG_BOOL, NULL, 0, 0, "convert the weights to fp32 at load"},
    {"quantize", WK_CFG_STR, "none", 0, 0,
     "none, or q8_0: quantize the checkpoint's matrices to Q8_0 at load"},
    {"cpu-matmul", WK_CFG_STR, "fp32", 0, 0,
     "fp32 or bf16: BF16-weight products with fp32 activations (FMA chains) or with "
     "activations rounded to bf16 on AMX tiles, else AVX512-BF16 dot products (cpu backend, a "
     "CPU with AMX-BF16 or AVX512_BF16)"},
    {"bench", WK_CFG_BOOL, NULL, 0, 0,
     "print prefill and decode throughput (uses --tokens or --bench-prefill synthetic tokens, "
     "and --generate steps)"},
    {"bench-batch", WK_CFG_U64, "1", 1, INFER_MAX_BATCH,
     "with --bench: decode N sequences per step, each continuing the prefilled prompt"},
    {"bench-prefill", WK_CFG_U64, "512", 1, 1u << 20,
     "with --bench and no --tokens: N synthetic prompt tokens"},
    {"batch-check", WK_CFG_U64, NULL, 2, INFER_MAX_BATCH,
     "run the prompt (and --generate steps) alone, then again with N-1 random rows in every "
     "step; exit 1 unless every logit and the final state are bit-identical"},
    {"check-tolerance", WK_CFG_STR, NULL, 0, 0,
     "a number T in [0, 1]: --batch-check / --slot-check compare logits (and states) within "
     "max|diff|/std < T instead of bit for bit (the CUDA backend agrees across shapes to GEMM "
     "rounding)"},
    {"slot-check", WK_CFG_BOOL, NULL, 0, 0,
     "run the prompt (and --generate steps) once, then check fork (slot_copy), "
     "hibernate/resume (slot_read, reset, slot_resize, slot_write) and migration to another "
     "slot continue bit-identically, image sizes, and (hybrid models) WK_EQUOTA / WK_EINVAL "
     "refusals that change nothing"},
    {"kv-pages", WK_CFG_U64, NULL, 1, 1u << 28,
     "hybrid models: KV pool pages (default: the backend's)"},
};

/* Where each option goes. */
#define INFER_BIND(opt, type, field) WK_CFG_BIND(infer_opts, opt, type, field)
static const wk_cfg_bind infer_binds[] = {
    INFER_BIND("model", STR, model),
    INFER_BIND("tokens", STR, tokens),
    INFER_BIND("logits-out", STR, logits_out),
    INFER_BIND("generate", U32, generate_n),
    INFER_BIND("encode", BOOL, encode),
    INFER_BIND("decode", BOOL, decode),
    INFER_BIND("vocab", STR, vocab),
    INFER_BIND("threads", U32, threads),
    INFER_BIND("backend", STR, backend),
    INFER_BIND("prefill-chunk", U32, chunk),
    INFER_BIND("fp32", BOOL, fp32),
    INFER_BIND("quantize", STR, quantize),
    INFER_BIND("cpu-matmul", STR, cpu_matmul),
    INFER_BIND("bench", BOOL, bench),
    INFER_BIND("bench-batch", U32, bench_batch),
    INFER_BIND("bench-prefill", U32, bench_prefill),
    INFER_BIND("batch-check", U32, batch_check),
    INFER_BIND("check-tolerance", STR, check_tol_s),
    INFER_BIND("slot-check", BOOL, slot_check),
    INFER_BIND("kv-pages", U32, kv_pages),
};

static const wk_cfg_tool infer_tool = {
    .prog = "wkvm-infer",
    .about = "Runs a model directory on one backend without the controller. Modes (one):\n"
             "  --tokens LIST with --logits-out FILE, --generate N, --batch-check B or "
             "--slot-check;\n"
             "  --bench (synthetic or --tokens prompt); --encode; --decode.",
    .opts = infer_table,
    .n_opts = sizeof(infer_table) / sizeof(infer_table[0]),
    .binds = infer_binds,
    .n_binds = sizeof(infer_binds) / sizeof(infer_binds[0]),
};

static void infer_die(int code, const char *fmt, ...) WK_PRINTF(2, 3);

static void
infer_die(int code, const char *fmt, ...)
{
    va_list ap;
    fputs("wkvm-infer: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(code);
}

/* Parses ids separated by commas and/or whitespace. Dies on bad input. */
static int32_t *
infer_parse_ids(const char *what, const char *s, size_t *n_out)
{
    size_t cap = 64, n = 0;
    int32_t *ids = malloc(cap * sizeof(*ids));
    if (ids == NULL)
        infer_die(1, "out of memory");
    const char *p = s;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (*p == '\0')
            break;
        char *end = NULL;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno != 0 || v < 0 || v > INT32_MAX ||
            (*end != '\0' && *end != ',' && *end != ' ' && *end != '\t' && *end != '\n' &&
             *end != '\r'))
            infer_die(1, "%s: bad token id near '%.20s'", what, p);
        if (n == cap) {
            if (cap >= INFER_MAX_TOKENS)
                infer_die(1, "%s: more than %u token ids", what, INFER_MAX_TOKENS);
            cap *= 2;
            int32_t *nid = realloc(ids, cap * sizeof(*ids));
            if (nid == NULL)
                infer_die(1, "out of memory");
            ids = nid;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    *n_out = n;
    return ids;
}

static char *
infer_read_stdin(size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (buf == NULL)
        infer_die(1, "out of memory");
    for (;;) {
        if (n == cap) {
            if (cap >= INFER_MAX_INPUT)
                infer_die(1, "stdin: more than %u bytes", INFER_MAX_INPUT);
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (nb == NULL)
                infer_die(1, "out of memory");
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, stdin);
        n += r;
        if (r == 0) {
            if (ferror(stdin))
                infer_die(1, "stdin: read error");
            break;
        }
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static double
infer_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int32_t
infer_argmax(const float *v, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return (int32_t)best;
}

/* --encode / --decode: only the tokenizer is loaded. */
static int
infer_tok_mode(const infer_opts *o)
{
    wk_diag d = {{0}};
    wk_tok *tok = NULL;
    wk_err e = wk_tok_load_dir(o->model, o->vocab, &tok, &d);
    if (e != WK_OK)
        infer_die(1, "%s", d.msg[0] ? d.msg : wk_strerror(e));
    size_t len = 0;
    char *in = infer_read_stdin(&len);
    if (o->encode) {
        int32_t *ids = NULL;
        size_t n = 0;
        if ((e = wk_tok_encode(tok, in, len, &ids, &n, &d)) != WK_OK)
            infer_die(1, "%s", d.msg[0] ? d.msg : wk_strerror(e));
        for (size_t i = 0; i < n; i++)
            printf("%s%" PRId32, i ? " " : "", ids[i]);
        printf("\n");
        free(ids);
    } else {
        size_t n = 0;
        int32_t *ids = infer_parse_ids("stdin", in, &n);
        char *out = NULL;
        size_t olen = 0;
        if ((e = wk_tok_decode(tok, ids, n, &out, &olen, &d)) != WK_OK)
            infer_die(1, "%s", d.msg[0] ? d.msg : wk_strerror(e));
        if (olen > 0 && fwrite(out, 1, olen, stdout) != olen)
            infer_die(1, "stdout: write error");
        free(out);
        free(ids);
    }
    free(in);
    wk_tok_free(tok);
    if (fflush(stdout) != 0)
        infer_die(1, "stdout: write error");
    return 0;
}

typedef struct infer_run {
    const be_ops *ops; /* backend */
    be_ctx *ctx;       /* context */
    uint32_t V;        /* vocab rows */
    double tol;        /* --check-tolerance: 0 = the checks compare bits */
} infer_run;

/*
 * Whether got matches ref over n floats: bit for bit when tol is 0 (the CPU
 * backend's promise), else max|got - ref| / std(ref) < tol (the CUDA
 * backend agrees across batch shapes and chunkings only to GEMM rounding).
 * *rel (may be NULL) gets the ratio when tol > 0. A NaN never matches.
 */
static bool
infer_match(const float *ref, const float *got, size_t n, double tol, double *rel)
{
    if (tol <= 0.0)
        return memcmp(ref, got, n * sizeof(float)) == 0;
    double mean = 0.0, var = 0.0, mx = 0.0;
    for (size_t i = 0; i < n; i++)
        mean += ref[i];
    mean = n ? mean / (double)n : 0.0;
    for (size_t i = 0; i < n; i++)
        var += ((double)ref[i] - mean) * ((double)ref[i] - mean);
    const double sd = n ? sqrt(var / (double)n) : 0.0;
    for (size_t i = 0; i < n; i++) {
        const double dd = fabs((double)got[i] - (double)ref[i]);
        if (!(dd <= mx))
            mx = isnan(dd) ? INFINITY : dd;
    }
    const double r = sd > 0.0 ? mx / sd : mx;
    if (rel != NULL)
        *rel = r;
    return r < tol;
}

static void
infer_step(infer_run *r, be_row *rows, size_t n)
{
    wk_diag d = {{0}};
    wk_err e = r->ops->step(r->ctx, rows, n, &d);
    if (e != WK_OK)
        infer_die(1, "step: %s", d.msg[0] ? d.msg : wk_strerror(e));
}

/*
 * Prefills ids into slot in chunks. When lf is not NULL, every position's
 * logits go to it; last (V floats) receives the last position's logits.
 */
static void
infer_prefill(infer_run *r, uint32_t slot, const int32_t *ids, size_t n, uint32_t chunk, FILE *lf,
              const char *lf_name, float *last)
{
    float *buf = NULL;
    if (lf != NULL) {
        buf = malloc((size_t)chunk * r->V * sizeof(float));
        if (buf == NULL)
            infer_die(1, "out of memory for %u logits rows", chunk);
    }
    for (size_t off = 0; off < n; off += chunk) {
        uint32_t take = n - off < chunk ? (uint32_t)(n - off) : chunk;
        bool is_last = off + take == n;
        be_row row = {.slot = slot, .tokens = ids + off, .n_tokens = take};
        if (lf != NULL) {
            row.logits_mode = BE_LOGITS_ALL;
            row.logits = buf;
        } else if (is_last && last != NULL) {
            row.logits_mode = BE_LOGITS_LAST;
            row.logits = last;
        }
        infer_step(r, &row, 1);
        if (lf != NULL) {
            size_t cnt = (size_t)take * r->V;
            if (fwrite(buf, sizeof(float), cnt, lf) != cnt)
                infer_die(1, "%s: write error", lf_name);
            if (is_last && last != NULL)
                memcpy(last, buf + (size_t)(take - 1) * r->V, r->V * sizeof(float));
        }
    }
    free(buf);
}

/* slot_size, or slot_bytes for backends without it. */
static uint64_t
infer_slot_size(const infer_run *r, uint32_t slot)
{
    return r->ops->slot_size != NULL ? r->ops->slot_size(r->ctx, slot)
                                     : r->ops->slot_bytes(r->ctx);
}

/* A small deterministic generator for --batch-check's companion rows. */
static uint32_t
infer_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

/*
 * --batch-check: the prompt in chunks of `chunk`, then `gen` greedy steps,
 * first alone (slot 1), then with B-1 companion rows (random prefill chunks
 * and decode tokens on slots 2..B, the checked row at a varying position).
 * Every logit of the checked row and its final state must match bit for bit.
 */
static int
infer_batch_check(infer_run *r, const int32_t *ids, size_t n, uint32_t chunk, uint32_t B, long gen)
{
    const size_t V = r->V;
    size_t n_pos = n + (size_t)(gen > 0 ? gen : 0);
    /* the whole image: the fixed part, then (hybrid models) the KV of every position */
    uint64_t sbytes = r->ops->slot_bytes(r->ctx);
    if (r->ops->kv_info != NULL) {
        be_kv_info kv;
        r->ops->kv_info(r->ctx, &kv);
        sbytes += kv.kv_token_bytes * n_pos;
    }
    float *ref = malloc(n_pos * V * sizeof(float));
    float *got = malloc(n_pos * V * sizeof(float));
    float *other = malloc((size_t)chunk * V * sizeof(float) * (B > 1 ? B - 1 : 1));
    int32_t *seq = malloc(n_pos * sizeof(int32_t));
    int32_t *otok = malloc((size_t)chunk * (B > 1 ? B - 1 : 1) * sizeof(int32_t));
    be_row *rows = calloc(B, sizeof(*rows));
    uint8_t *st_ref = malloc(sbytes), *st_got = malloc(sbytes);
    if (!ref || !got || !other || !seq || !otok || !rows || !st_ref || !st_got)
        infer_die(1, "out of memory for --batch-check");
    memcpy(seq, ids, n * sizeof(int32_t));

    for (int pass = 0; pass < 2; pass++) {
        float *out = pass == 0 ? ref : got;
        uint64_t rng = 0x9e3779b97f4a7c15ull;
        for (uint32_t s = 1; s <= B; s++)
            if (r->ops->slot_reset(r->ctx, s) != WK_OK)
                infer_die(1, "--batch-check: slot reset failed");
        size_t pos = 0;
        while (pos < n_pos) {
            uint32_t take = 1;
            if (pos < n)
                take = n - pos < chunk ? (uint32_t)(n - pos) : chunk;
            else /* greedy: the argmax of the previous position */
                seq[pos] = infer_argmax(out + (pos - 1) * V, r->V);
            size_t nr = 0;
            uint32_t at = pass == 0 ? 0 : infer_rand(&rng) % B;
            for (uint32_t k = 0; k < B; k++) {
                if (pass == 0 && k > 0)
                    break;
                if (k == at) {
                    rows[nr++] = (be_row){.slot = 1, .tokens = seq + pos, .n_tokens = take,
                                          .logits_mode = BE_LOGITS_ALL, .logits = out + pos * V};
                    continue;
                }
                uint32_t j = k < at ? k : k - 1; /* companion index 0..B-2 */
                uint32_t ot = 1 + infer_rand(&rng) % chunk;
                for (uint32_t t = 0; t < ot; t++)
                    otok[(size_t)j * chunk + t] = (int32_t)(infer_rand(&rng) % r->V);
                uint32_t mode = infer_rand(&rng) % 3;
                rows[nr++] = (be_row){.slot = 2 + j, .tokens = otok + (size_t)j * chunk,
                                      .n_tokens = ot, .logits_mode = mode,
                                      .logits = other + (size_t)j * chunk * V};
            }
            infer_step(r, rows, nr);
            pos += take;
        }
        if (infer_slot_size(r, 1) != sbytes ||
            r->ops->slot_read(r->ctx, 1, 0, pass == 0 ? st_ref : st_got, sbytes) != WK_OK)
            infer_die(1, "--batch-check: slot read failed");
    }
    int rc = 0;
    double rl = 0.0, rs = 0.0;
    if (r->tol > 0.0) {
        /* the state as floats: the fixed part and the KV are fp32 */
        bool ok_l = infer_match(ref, got, n_pos * V, r->tol, &rl);
        bool ok_s = infer_match((const float *)(const void *)st_ref,
                                (const float *)(const void *)st_got, sbytes / 4, r->tol, &rs);
        if (!ok_l || !ok_s) {
            fprintf(stderr,
                    "wkvm-infer: --batch-check: alone vs in a batch of %u: logits max|d|/std "
                    "%.3e, state %.3e (tolerance %g)\n",
                    B, rl, rs, r->tol);
            rc = 1;
        }
    }
    for (size_t p = 0; p < n_pos && rc == 0 && r->tol <= 0.0; p++)
        if (memcmp(ref + p * V, got + p * V, V * sizeof(float)) != 0) {
            for (size_t v = 0; v < V; v++)
                if (memcmp(&ref[p * V + v], &got[p * V + v], sizeof(float)) != 0) {
                    fprintf(stderr,
                            "wkvm-infer: --batch-check: position %zu id %zu differs: alone "
                            "%.9g, in a batch of %u %.9g\n",
                            p, v, ref[p * V + v], B, got[p * V + v]);
                    break;
                }
            rc = 1;
        }
    if (rc == 0 && r->tol <= 0.0 && memcmp(st_ref, st_got, sbytes) != 0) {
        fprintf(stderr, "wkvm-infer: --batch-check: the final state differs\n");
        rc = 1;
    }
    if (rc == 0 && r->tol > 0.0)
        printf("batch-check: within tolerance (batch %u, %zu positions, chunk %u, %llu state "
               "bytes; logits max|d|/std %.3e, state %.3e < %g)\n",
               B, n_pos, chunk, (unsigned long long)sbytes, rl, rs, r->tol);
    else if (rc == 0)
        printf("batch-check: identical (batch %u, %zu positions, chunk %u, %llu state bytes)\n",
               B, n_pos, chunk, (unsigned long long)sbytes);
    free(ref);
    free(got);
    free(other);
    free(seq);
    free(otok);
    free(rows);
    free(st_ref);
    free(st_got);
    return rc;
}

/* --slot-check: a failed expectation (message on stderr); counts into *fails. */
static void
infer_expect(int *fails, bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "wkvm-infer: --slot-check: %s\n", what);
        (*fails)++;
    }
}

/*
 * Feeds seq[a..b) to slot in chunks, every position's logits into
 * out + a * V; returns the first refused step's wk_err.
 */
static wk_err
infer_feed(infer_run *r, uint32_t slot, const int32_t *seq, size_t a, size_t b, uint32_t chunk,
           float *out)
{
    for (size_t p = a; p < b;) {
        uint32_t take = b - p < chunk ? (uint32_t)(b - p) : chunk;
        be_row row = {.slot = slot, .tokens = seq + p, .n_tokens = take,
                      .logits_mode = BE_LOGITS_ALL, .logits = out + p * r->V};
        wk_diag d = {{0}};
        wk_err e = r->ops->step(r->ctx, &row, 1, &d);
        if (e != WK_OK)
            return e;
        p += take;
    }
    return WK_OK;
}

/* Reads slot's whole image into a new buffer (*len bytes); dies on failure. */
static uint8_t *
infer_image(infer_run *r, uint32_t slot, uint64_t *len)
{
    *len = infer_slot_size(r, slot);
    uint8_t *img = malloc(*len ? *len : 1);
    if (img == NULL)
        infer_die(1, "out of memory for a slot image");
    if (r->ops->slot_read(r->ctx, slot, 0, img, *len) != WK_OK)
        infer_die(1, "--slot-check: slot_read of %llu bytes failed", (unsigned long long)*len);
    return img;
}

/*
 * --slot-check (slots 1..3): the reference run of prompt + greedy steps in
 * slot 1, then the same sequence interrupted at the middle by (a) a fork
 * into slot 2 with both continuing, (b) hibernation: image read, slot
 * reset, slot_resize + slot_write back into slot 1 and (migration) into
 * slot 3. Every continued position's logits must equal the reference bit
 * for bit; image sizes must be slot_bytes + n_ctx * kv_token_bytes. With a
 * KV pool, the pool is then filled and a step, a copy and a resize must be
 * refused with WK_EQUOTA leaving every image and the free count unchanged,
 * and so must a step with a reset row (be_row.reset) plus a refused row;
 * the reset row alone then runs on pages only its reset freed, as on a
 * fresh slot. Bad sizes and ranges must give WK_EINVAL.
 */
/* What the --slot-check phases share: the run, the sequence, the buffers. */
typedef struct infer_sc {
    infer_run *r;           /* the model and backend */
    int32_t *seq;           /* prompt, then the reference's greedy tokens */
    size_t n;               /* prompt tokens */
    size_t n_pos;           /* positions checked */
    size_t mid;             /* where the run is interrupted */
    uint32_t chunk;         /* prefill chunk */
    size_t V;               /* vocab */
    uint64_t sb;            /* slot_bytes */
    uint64_t tb;            /* kv_token_bytes (0: no KV) */
    float *ref;             /* reference logits, n_pos x V */
    float *got, *got2;      /* logits of the interrupted runs */
    int fails;              /* failed expectations */
} infer_sc;

static void
infer_sc_reset3(infer_sc *c)
{
    for (uint32_t s = 1; s <= 3; s++)
        if (c->r->ops->slot_reset(c->r->ctx, s) != WK_OK)
            infer_die(1, "--slot-check: slot reset failed");
}

/* The logits after the interruption equal the reference's bit for bit. */
static void
infer_sc_same(infer_sc *c, const float *buf, const char *label)
{
    char what[128];
    snprintf(what, sizeof(what), "%s: logits after the interruption differ", label);
    bool same = infer_match(c->ref + c->mid * c->V, buf + c->mid * c->V,
                            (c->n_pos - c->mid) * c->V, c->r->tol, NULL);
    infer_expect(&c->fails, same, what);
}

/* The reference: prompt, then greedy, in slot 1. */
static void
infer_sc_reference(infer_sc *c)
{
    infer_run *r = c->r;
    char what[256];
    infer_sc_reset3(c);
    if (infer_feed(r, 1, c->seq, 0, c->n, c->chunk, c->ref) != WK_OK)
        infer_die(1, "--slot-check: reference prefill refused");
    for (size_t p = c->n; p < c->n_pos; p++) {
        c->seq[p] = infer_argmax(c->ref + (p - 1) * c->V, r->V);
        if (infer_feed(r, 1, c->seq, p, p + 1, 1, c->ref) != WK_OK)
            infer_die(1, "--slot-check: reference decode refused");
    }
    snprintf(what, sizeof(what), "slot_size after %zu tokens is %llu, want %llu", c->n_pos,
             (unsigned long long)infer_slot_size(r, 1),
             (unsigned long long)(c->sb + c->n_pos * c->tb));
    infer_expect(&c->fails, infer_slot_size(r, 1) == c->sb + c->n_pos * c->tb, what);
}

/* (a) Fork at mid: both continue identically. */
static void
infer_sc_fork(infer_sc *c)
{
    infer_run *r = c->r;
    infer_sc_reset3(c);
    if (infer_feed(r, 1, c->seq, 0, c->mid, c->chunk, c->got) != WK_OK ||
        r->ops->slot_copy(r->ctx, 2, 1) != WK_OK)
        infer_die(1, "--slot-check: fork failed");
    infer_expect(&c->fails, infer_slot_size(r, 2) == c->sb + c->mid * c->tb,
                 "fork: slot_size of the copy");
    if (infer_feed(r, 2, c->seq, c->mid, c->n_pos, c->chunk, c->got2) != WK_OK ||
        infer_feed(r, 1, c->seq, c->mid, c->n_pos, 1, c->got) != WK_OK)
        infer_die(1, "--slot-check: continuing after the fork refused");
    infer_sc_same(c, c->got, "fork (source)");
    infer_sc_same(c, c->got2, "fork (copy)");
}

/* (b) Hibernate at mid: read, reset, resize + write, continue; also into slot 3. */
static void
infer_sc_hibernate(infer_sc *c)
{
    infer_run *r = c->r;
    const uint64_t sb = c->sb, tb = c->tb;
    infer_sc_reset3(c);
    if (infer_feed(r, 1, c->seq, 0, c->mid, c->chunk, c->got) != WK_OK)
        infer_die(1, "--slot-check: prefill refused");
    uint64_t ilen;
    uint8_t *img = infer_image(r, 1, &ilen);
    infer_expect(&c->fails, ilen == sb + c->mid * tb, "hibernate: image size");
    be_kv_info k0 = {0}, k1 = {0};
    if (r->ops->kv_info != NULL)
        r->ops->kv_info(r->ctx, &k0);
    if (r->ops->slot_reset(r->ctx, 1) != WK_OK)
        infer_die(1, "--slot-check: slot reset failed");
    if (r->ops->kv_info != NULL)
        r->ops->kv_info(r->ctx, &k1);
    infer_expect(&c->fails, infer_slot_size(r, 1) == sb, "reset: slot_size is not slot_bytes");
    infer_expect(&c->fails,
                 k1.pages_free == k1.pages_total && (tb == 0 || k0.pages_free < k1.pages_free),
                 "reset: the slot's KV pages did not go back to the pool");
    for (uint32_t s = 1; s <= 3; s += 2) {
        wk_err e = r->ops->slot_resize != NULL ? r->ops->slot_resize(r->ctx, s, ilen) : WK_OK;
        if (e != WK_OK || r->ops->slot_write(r->ctx, s, 0, img, ilen) != WK_OK)
            infer_die(1, "--slot-check: resume into slot %u failed (%s)", s, wk_strerror(e));
    }
    if (infer_feed(r, 1, c->seq, c->mid, c->n_pos, c->chunk, c->got) != WK_OK ||
        infer_feed(r, 3, c->seq, c->mid, c->n_pos, 1, c->got2) != WK_OK)
        infer_die(1, "--slot-check: continuing after resume refused");
    infer_sc_same(c, c->got, "hibernate/resume");
    infer_sc_same(c, c->got2, "migrate to another slot");
    free(img);
}

/* Bad sizes and ranges are refused with WK_EINVAL. */
static void
infer_sc_bad_ranges(infer_sc *c)
{
    infer_run *r = c->r;
    const uint64_t sb = c->sb, tb = c->tb;
    int *fails = &c->fails;
    if (r->ops->slot_resize != NULL) {
        infer_expect(fails, r->ops->slot_resize(r->ctx, 2, sb - 4) == WK_EINVAL,
                     "resize below slot_bytes accepted");
        infer_expect(fails, r->ops->slot_resize(r->ctx, 0, sb) == WK_EINVAL,
                     "resize of slot 0 accepted");
        infer_expect(fails, r->ops->slot_resize(r->ctx, 4, sb) == WK_EINVAL,
                     "resize outside the arena accepted");
        if (tb > 0)
            infer_expect(fails, r->ops->slot_resize(r->ctx, 2, sb + tb + 4) == WK_EINVAL,
                         "resize to a partial token accepted");
        else
            infer_expect(fails, r->ops->slot_resize(r->ctx, 2, sb + 4) == WK_EINVAL,
                         "resize of a fixed-size slot accepted");
    }
    uint8_t byte[8];
    uint64_t sz1 = infer_slot_size(r, 1);
    infer_expect(fails, r->ops->slot_read(r->ctx, 1, sz1 - 4, byte, 8) == WK_EINVAL,
                 "read past slot_size accepted");
    infer_expect(fails, r->ops->slot_write(r->ctx, 1, sz1, byte, 1) == WK_EINVAL,
                 "write past slot_size accepted");
    infer_expect(fails, r->ops->slot_copy(r->ctx, 0, 1) == WK_EINVAL, "copy into slot 0 accepted");

}

/*
 * (c) A full pool: a step, a copy and a resize are refused and change
 * nothing. Leaves slot 1 at mid and slot 2 holding every page left;
 * returns that count (the pages slot 2 took).
 */
static uint32_t
infer_sc_full_pool(infer_sc *c)
{
    infer_run *r = c->r;
    const size_t V = c->V, mid = c->mid;
    const uint64_t sb = c->sb, tb = c->tb;
    int32_t *seq = c->seq;
    int *fails = &c->fails;
    char what[256];
    be_kv_info k0 = {0}, k1 = {0};
    uint64_t ilen;
    uint8_t *img;
    infer_sc_reset3(c);
    if (infer_feed(r, 1, seq, 0, mid, c->chunk, c->got) != WK_OK)
        infer_die(1, "--slot-check: prefill refused");
    r->ops->kv_info(r->ctx, &k0);
    uint64_t fill = (uint64_t)k0.pages_free * k0.page_tokens;
    const uint32_t p2 = k0.pages_free; /* the pages slot 2 takes below */
    if (r->ops->slot_resize(r->ctx, 2, sb + (fill + 1) * tb) != WK_EQUOTA)
        infer_expect(fails, false, "resize over the free pages not refused with WK_EQUOTA");
    if (r->ops->slot_resize(r->ctx, 2, sb + fill * tb) != WK_OK)
        infer_die(1, "--slot-check: resize to fill the pool failed");
    img = infer_image(r, 1, &ilen);
    r->ops->kv_info(r->ctx, &k0);
    infer_expect(fails, k0.pages_free == 0, "the pool is not full");
    /*
     * Row 0 fits in slot 1's last page (when it has room), row 1 needs a
     * page for slot 3: the whole step is refused, naming row 1, and row
     * 0 must not have run either.
     */
    uint32_t room = (k0.page_tokens - (uint32_t)(mid % k0.page_tokens)) % k0.page_tokens;
    int32_t *row_toks = calloc(k0.page_tokens, sizeof(int32_t));
    float *lg = malloc(V * sizeof(float));
    if (row_toks == NULL || lg == NULL)
        infer_die(1, "out of memory");
    be_row rows[2] = {
        {.slot = 1, .tokens = row_toks, .n_tokens = room, .logits_mode = BE_LOGITS_LAST,
         .logits = lg},
        {.slot = 3, .tokens = seq, .n_tokens = 1, .logits_mode = BE_LOGITS_NONE},
    };
    const size_t first = room > 0 ? 0 : 1;
    wk_diag d = {{0}};
    wk_err e = r->ops->step(r->ctx, rows + first, 2 - first, &d);
    snprintf(what, sizeof(what), "row %zu", 1 - first);
    infer_expect(fails, e == WK_EQUOTA, "a step over the pool not refused with WK_EQUOTA");
    infer_expect(fails, e != WK_EQUOTA || strstr(d.msg, what) != NULL,
                 "the WK_EQUOTA diag does not name the row");
    if (e == WK_EQUOTA)
        printf("slot-check: full pool step refused: %s\n", d.msg);
    infer_expect(fails, r->ops->slot_copy(r->ctx, 3, 1) == WK_EQUOTA,
                 "a copy over the pool not refused with WK_EQUOTA");
    infer_expect(fails, r->ops->slot_resize(r->ctx, 3, sb + tb) == WK_EQUOTA,
                 "a resize over the pool not refused with WK_EQUOTA");
    r->ops->kv_info(r->ctx, &k1);
    uint64_t l2;
    uint8_t *img2 = infer_image(r, 1, &l2);
    infer_expect(fails, l2 == ilen && memcmp(img, img2, ilen) == 0,
                 "a refused operation changed slot 1");
    infer_expect(fails, infer_slot_size(r, 3) == sb, "a refused operation changed slot 3");
    infer_expect(fails, k1.pages_free == 0, "a refused operation changed the free pages");
    free(img2);
    free(img);
    free(row_toks);
    free(lg);

    return p2;
}

/*
 * (d) A reset is part of its step. Slot 2 holds every page left (p2) and,
 * written from slot 1, a recurrent state that is not zero. A reset row on
 * it next to a row that needs one page more than the reset gives back is
 * refused (WK_EQUOTA naming row 1), and so is a reset row next to a token
 * outside the vocab (WK_EINVAL); neither changes a byte or a page. Then the
 * reset row alone runs on a page only its own reset gave back, exactly as
 * on a fresh slot (slot 3, same row shape).
 */
static void
infer_sc_reset_in_step(infer_sc *c, uint32_t p2)
{
    infer_run *r = c->r;
    const size_t V = c->V;
    const uint64_t sb = c->sb, tb = c->tb;
    int32_t *seq = c->seq;
    int *fails = &c->fails;
    char what[256];
    be_kv_info k0 = {0}, k1 = {0};
    r->ops->kv_info(r->ctx, &k0);
    wk_diag d = {{0}};
    wk_err e;
    uint64_t la, lb;
    uint8_t *ia = infer_image(r, 1, &la);
    if (r->ops->slot_write(r->ctx, 2, 0, ia, sb) != WK_OK)
        infer_die(1, "--slot-check: slot_write failed");
    uint8_t *ib = infer_image(r, 2, &lb);
    const uint64_t big = (uint64_t)p2 * k0.page_tokens; /* all of slot 2's pages */
    int32_t *ztoks = calloc(big + 1, sizeof(int32_t));
    float *lr = malloc(V * sizeof(float)), *lf = malloc(V * sizeof(float));
    if (ztoks == NULL || lr == NULL || lf == NULL)
        infer_die(1, "out of memory");
    const int32_t bad = (int32_t)r->V;
    be_row rr[2] = {
        {.slot = 2, .tokens = ztoks, .n_tokens = (uint32_t)big, .reset = true},
        {.slot = 3, .tokens = ztoks, .n_tokens = 1},
    };
    e = r->ops->step(r->ctx, rr, 2, &d);
    infer_expect(fails, e == WK_EQUOTA && strstr(d.msg, "row 1") != NULL,
                 "reset + a row over the freed pages: not refused with WK_EQUOTA on row 1");
    rr[0] = (be_row){.slot = 2, .tokens = seq, .n_tokens = 1, .logits_mode = BE_LOGITS_LAST,
                     .logits = lr, .reset = true};
    rr[1] = (be_row){.slot = 1, .tokens = &bad, .n_tokens = 1};
    infer_expect(fails, r->ops->step(r->ctx, rr, 2, &d) == WK_EINVAL,
                 "reset + a token outside the vocab: not refused with WK_EINVAL");
    r->ops->kv_info(r->ctx, &k1);
    uint64_t l1, l2b;
    uint8_t *ja = infer_image(r, 1, &l1), *jb = infer_image(r, 2, &l2b);
    infer_expect(fails,
                 l1 == la && memcmp(ia, ja, la) == 0 && l2b == lb && memcmp(ib, jb, lb) == 0,
                 "a refused step with a reset row changed a slot image");
    infer_expect(fails, infer_slot_size(r, 3) == sb && k1.pages_free == 0,
                 "a refused step with a reset row changed slot 3 or the free pages");
    e = r->ops->step(r->ctx, rr, 1, &d);
    snprintf(what, sizeof(what), "a reset row needing its own freed pages refused (%s: %.150s)",
             wk_strerror(e), d.msg);
    infer_expect(fails, e == WK_OK, what);
    r->ops->kv_info(r->ctx, &k1);
    infer_expect(fails, infer_slot_size(r, 2) == sb + tb && k1.pages_free == p2 - 1,
                 "after a reset row: slot 2's size or the free pages are wrong");
    if (e == WK_OK && p2 >= 2) {
        /* the same row on a fresh slot: same logits, same image */
        if (infer_feed(r, 3, seq, 0, 1, 1, lf) != WK_OK)
            infer_die(1, "--slot-check: a fresh one-token row refused");
        uint64_t l3;
        free(jb);
        jb = infer_image(r, 2, &l2b);
        uint8_t *jc = infer_image(r, 3, &l3);
        infer_expect(fails, memcmp(lr, lf, V * sizeof(float)) == 0,
                     "a reset row's logits differ from a fresh slot's");
        infer_expect(fails, l2b == l3 && memcmp(jb, jc, l3) == 0,
                     "a reset row's image differs from a fresh slot's");
        free(jc);
    }
    free(ia);
    free(ib);
    free(ja);
    free(jb);
    free(ztoks);
    free(lr);
    free(lf);

}

static int
infer_slot_check(infer_run *r, const int32_t *ids, size_t n, uint32_t chunk, long gen)
{
    infer_sc c = {.r = r, .n = n, .chunk = chunk, .V = r->V};
    c.n_pos = n + (size_t)(gen > 0 ? gen : 0);
    c.mid = c.n_pos / 2;
    c.sb = r->ops->slot_bytes(r->ctx);
    be_kv_info kv = {0};
    if (r->ops->kv_info != NULL)
        r->ops->kv_info(r->ctx, &kv);
    c.tb = kv.kv_token_bytes;
    c.ref = malloc(c.n_pos * c.V * sizeof(float));
    c.got = malloc(c.n_pos * c.V * sizeof(float));
    c.got2 = malloc(c.n_pos * c.V * sizeof(float));
    c.seq = malloc(c.n_pos * sizeof(int32_t));
    if (!c.ref || !c.got || !c.got2 || !c.seq)
        infer_die(1, "out of memory for --slot-check");
    memcpy(c.seq, ids, n * sizeof(int32_t));

    infer_sc_reference(&c);
    infer_sc_fork(&c);
    infer_sc_hibernate(&c);
    infer_sc_bad_ranges(&c);
    if (c.tb > 0 && r->ops->slot_resize != NULL) {
        uint32_t p2 = infer_sc_full_pool(&c);
        infer_sc_reset_in_step(&c, p2);
        /* give slot 2's (and 3's) pages back: slot 1 continues as if nothing happened */
        if (r->ops->slot_reset(r->ctx, 2) != WK_OK || r->ops->slot_reset(r->ctx, 3) != WK_OK)
            infer_die(1, "--slot-check: slot reset failed");
        if (infer_feed(r, 1, c.seq, c.mid, c.n_pos, c.chunk, c.got) != WK_OK)
            infer_die(1, "--slot-check: continuing after the refusals refused");
        infer_sc_same(&c, c.got, "after refusals");
    }
    if (c.fails == 0)
        printf("slot-check: ok (%zu positions, interrupted at %zu, slot_bytes %llu, "
               "kv_token_bytes %llu, page_tokens %u, pages %u)\n",
               c.n_pos, c.mid, (unsigned long long)c.sb, (unsigned long long)c.tb,
               kv.page_tokens, kv.pages_total);
    free(c.ref);
    free(c.got);
    free(c.got2);
    free(c.seq);
    return c.fails ? 1 : 0;
}

static void
infer_bench(infer_run *r, const infer_opts *o, const int32_t *ids, size_t n, uint32_t chunk)
{
    const uint32_t B = (uint32_t)o->bench_batch;
    const long steps = o->generate >= 0 ? o->generate : 64;
    int32_t *syn = NULL;
    if (n == 0) {
        n = (size_t)o->bench_prefill;
        syn = malloc(n * sizeof(*syn));
        if (syn == NULL)
            infer_die(1, "out of memory");
        for (size_t i = 0; i < n; i++)
            syn[i] = (int32_t)((i * 7919u + 13u) % r->V);
        ids = syn;
    }
    float *logits = malloc((size_t)B * r->V * sizeof(float));
    be_row *rows = calloc(B, sizeof(*rows));
    int32_t *cur = calloc(B, sizeof(*cur));
    if (logits == NULL || rows == NULL || cur == NULL)
        infer_die(1, "out of memory");

    /* prefill: one sequence, chunked, logits of the last position only */
    if (r->ops->slot_reset(r->ctx, 1) != WK_OK)
        infer_die(1, "slot reset failed");
    double t0 = infer_now();
    infer_prefill(r, 1, ids, n, chunk, NULL, NULL, logits);
    double tp = infer_now() - t0;

    /*
     * decode: B sequences, one token each per step, each continuing the
     * prefilled prompt (slot 1, forked into the others), so a hybrid
     * model's attention reads a context of the prompt's length
     */
    for (uint32_t b = 0; b < B; b++) {
        wk_err e = b == 0 ? WK_OK : r->ops->slot_copy(r->ctx, b + 1, 1);
        if (e != WK_OK)
            infer_die(1, "slot copy failed: %s (hybrid models: raise --kv-pages)",
                      wk_strerror(e));
        cur[b] = (int32_t)((b * 104729u + 1u) % r->V);
    }
    double td = 0.0;
    for (long s = -2; s < steps; s++) { /* two warm-up steps */
        for (uint32_t b = 0; b < B; b++)
            rows[b] = (be_row){.slot = b + 1, .tokens = &cur[b], .n_tokens = 1,
                               .logits_mode = BE_LOGITS_LAST,
                               .logits = logits + (size_t)b * r->V};
        double ts = infer_now();
        infer_step(r, rows, B);
        if (s >= 0)
            td += infer_now() - ts;
        for (uint32_t b = 0; b < B; b++)
            cur[b] = infer_argmax(logits + (size_t)b * r->V, r->V);
    }
    char desc[256] = "";
    if (r->ops->describe != NULL)
        r->ops->describe(r->ctx, desc, sizeof(desc));
    printf("backend: %s\n", desc[0] ? desc : r->ops->name);
    printf("prefill: %zu tokens, chunk %u: %.3f s, %.1f tok/s\n", n, chunk, tp,
           tp > 0 ? (double)n / tp : 0.0);
    printf("decode: batch %u, %ld steps: %.3f s, %.2f ms/step, %.1f tok/s\n", B, steps, td,
           steps > 0 ? td * 1e3 / (double)steps : 0.0,
           td > 0 ? (double)B * (double)steps / td : 0.0);
    free(cur);
    free(rows);
    free(logits);
    free(syn);
}

int
main(int argc, char **argv)
{
    infer_opts o = {0};
    wk_cfg *cfg = NULL;
    int prc = wk_cfg_tool_parse(&infer_tool, argc, argv, &o, &cfg);
    if (prc != WK_CFG_TOOL_RUN)
        return prc;
    o.generate = wk_cfg_is_set(cfg, "generate") ? (long)o.generate_n : -1;
    if (strcmp(o.quantize, "q8_0") == 0)
        o.q8_0 = true;
    else if (strcmp(o.quantize, "none") != 0)
        infer_die(2, "--quantize %s: none or q8_0", o.quantize);
    if (strcmp(o.cpu_matmul, "fp32") != 0 && strcmp(o.cpu_matmul, "bf16") != 0)
        infer_die(2, "--cpu-matmul %s: fp32 or bf16", o.cpu_matmul);
    const bool mm_bf16 = strcmp(o.cpu_matmul, "bf16") == 0;
    if (o.check_tol_s != NULL) {
        char *end = NULL;
        errno = 0;
        o.check_tol = strtod(o.check_tol_s, &end);
        if (errno != 0 || end == o.check_tol_s || *end != '\0' || !(o.check_tol >= 0.0) ||
            o.check_tol > 1.0)
            infer_die(2, "--check-tolerance: '%s' is not a number in [0, 1]", o.check_tol_s);
    }
    if (o.model == NULL)
        infer_die(2, "--model DIR is required (see --help)");
    int modes = (o.encode != 0) + (o.decode != 0) +
                (o.tokens != NULL || o.bench || o.generate >= 0 || o.logits_out != NULL ||
                 o.slot_check);
    if (modes != 1)
        infer_die(2, "give exactly one of --encode, --decode, or --tokens with --logits-out / "
                     "--generate / --bench");
    if (o.encode || o.decode) {
        int trc = infer_tok_mode(&o);
        wk_cfg_free(cfg);
        return trc;
    }
    if (o.tokens == NULL && !o.bench)
        infer_die(2, "--tokens LIST is required with --logits-out / --generate");
    if (!o.bench && o.logits_out == NULL && o.generate < 0 && o.batch_check == 0 &&
        !o.slot_check)
        infer_die(2, "nothing to do: add --logits-out FILE, --generate N, --batch-check B, "
                     "--slot-check or --bench");
    if ((o.batch_check > 0 || o.slot_check) && (o.bench || o.logits_out != NULL))
        infer_die(2, "--batch-check / --slot-check go with --tokens (and --generate), not "
                     "--bench or --logits-out");
    if (o.batch_check > 0 && o.slot_check)
        infer_die(2, "give one of --batch-check and --slot-check");

    size_t n_ids = 0;
    int32_t *ids = o.tokens != NULL ? infer_parse_ids("--tokens", o.tokens, &n_ids) : NULL;
    if (o.tokens != NULL && n_ids == 0)
        infer_die(1, "--tokens: no token ids");

    const be_ops *ops = be_ops_find(o.backend);
    if (ops == NULL)
        infer_die(1, "--backend %s: not available in this build", o.backend);
    if (mm_bf16 && strcmp(ops->name, "cpu") != 0)
        infer_die(1, "--cpu-matmul bf16: the cpu backend only");
    const be_cpu_matmul engine = mm_bf16 ? be_cpu_bf16_engine() : BE_CPU_MATMUL_FP32;
    if (mm_bf16 && engine == BE_CPU_MATMUL_FP32)
        infer_die(1, "--cpu-matmul bf16: needs AMX-BF16 tiles or AVX512_BF16, neither in this CPU, "
                     "kernel and build");

    wk_diag d = {{0}};
    wrk_model_opts mo = {.fp32 = o.fp32 != 0, .quantize_q8_0 = o.q8_0 != 0,
                         .matmul_bf16 = mm_bf16,
                         .matmul_dp = engine == BE_CPU_MATMUL_BF16_DP, .vocab_path = o.vocab};
    wrk_model *m = NULL;
    wk_err e = wrk_model_load(o.model, &mo, &m, &d);
    if (e != WK_OK)
        infer_die(1, "%s", d.msg[0] ? d.msg : wk_strerror(e));
    const wrk_model_info *info = wrk_model_info_get(m);
    for (size_t i = 0; i < n_ids; i++)
        if ((uint32_t)ids[i] >= info->vocab_size)
            infer_die(1, "--tokens: id %" PRId32 " at position %zu outside vocab %u", ids[i], i,
                      info->vocab_size);

    be_config bc = {
        .n_slots = (uint32_t)(o.bench         ? o.bench_batch + 1
                              : o.batch_check ? o.batch_check + 1
                              : o.slot_check  ? 4
                                              : 2),
        .n_threads = (uint32_t)o.threads,
        .device = 0,
        .max_step_rows =
            (uint32_t)(o.bench ? o.bench_batch : o.batch_check ? o.batch_check : o.slot_check ? 2 : 1),
        .max_step_tokens = 0,
        .kv_pages = (uint32_t)o.kv_pages,
    };
    infer_run r = {.ops = ops, .V = info->vocab_size, .tol = o.check_tol};
    if ((e = ops->open(&bc, m, &r.ctx, &d)) != WK_OK)
        infer_die(1, "%s", d.msg[0] ? d.msg : wk_strerror(e));
    /*
     * What runs, on stderr: the backend's own description, with the CPU path
     * actually chosen (isa=avx2 when WKVM_CPU_ISA=avx512 asks for more than
     * the CPU has), so a comparison of paths can tell what it compared.
     */
    char be_desc[256] = "";
    if (ops->describe != NULL)
        ops->describe(r.ctx, be_desc, sizeof(be_desc));
    fprintf(stderr, "wkvm-infer: backend: %s\n", be_desc[0] ? be_desc : ops->name);

    int rc = 0;
    if (o.bench) {
        infer_bench(&r, &o, ids, n_ids, (uint32_t)o.chunk);
    } else if (o.slot_check) {
        rc = infer_slot_check(&r, ids, n_ids, (uint32_t)o.chunk, o.generate);
    } else if (o.batch_check > 0) {
        rc = infer_batch_check(&r, ids, n_ids, (uint32_t)o.chunk, (uint32_t)o.batch_check,
                               o.generate);
    } else {
        float *last = malloc((size_t)r.V * sizeof(float));
        if (last == NULL)
            infer_die(1, "out of memory");
        FILE *lf = NULL;
        char tmp[4200];
        if (o.logits_out != NULL) {
            if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", o.logits_out) >= sizeof(tmp))
                infer_die(1, "--logits-out: path too long");
            lf = fopen(tmp, "wb");
            if (lf == NULL)
                infer_die(1, "%s: %s", tmp, strerror(errno));
        }
        infer_prefill(&r, 1, ids, n_ids, (uint32_t)o.chunk, lf, tmp, last);
        if (lf != NULL) {
            if (fclose(lf) != 0)
                infer_die(1, "%s: write error", tmp);
            if (rename(tmp, o.logits_out) != 0)
                infer_die(1, "rename %s -> %s: %s", tmp, o.logits_out, strerror(errno));
        }
        if (o.generate >= 0) {
            for (long i = 0; i < o.generate; i++) {
                int32_t next = infer_argmax(last, r.V);
                printf("%s%" PRId32, i ? " " : "", next);
                if (i + 1 < o.generate) {
                    be_row row = {.slot = 1, .tokens = &next, .n_tokens = 1,
                                  .logits_mode = BE_LOGITS_LAST, .logits = last};
                    infer_step(&r, &row, 1);
                }
            }
            printf("\n");
        }
        free(last);
    }
    ops->close(r.ctx);
    wrk_model_free(m);
    free(ids);
    wk_cfg_free(cfg);
    if (fflush(stdout) != 0)
        infer_die(1, "stdout: write error");
    return rc;
}
