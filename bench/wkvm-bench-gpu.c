/*
 * wkvm-bench-gpu: throughput of the CUDA backend next to the device's
 * measured memory-bandwidth roof, in one run, as one JSON document on
 * stdout (bench/gpu.sh collects them):
 *   - the roof: device-to-device cudaMemcpy of a large buffer (each byte is
 *     read and written once), best of --rounds;
 *   - decode tok/s at each --batches size (B rows of one token per step,
 *     logits of every row copied back, as the worker does), each against
 *     the roof for that batch: BW / (weight bytes + 2 * B * state bytes)
 *     steps per second, times B;
 *   - prefill tok/s for each --prefill length (one row, split into passes
 *     by the backend) and the model FLOP/s it implies (2 * params * tok/s).
 * The model is any directory wrk_model_load() reads (every family).
 *
 * A benchmark, not a test: it measures, it does not judge. It calls the
 * CUDA runtime itself only for the roof's copy (the backend's step and
 * slot operations go through be_ops, as the worker's do).
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "be.h"
#include "wk_cfg_tool.h"
#include "wrk_model.h"

#define BG_MAX_LIST 16
#define BG_PROMPT 16 /* tokens prefilled into each decode slot first */

static double
bg_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void
bg_die(const char *msg, const char *detail)
{
    fprintf(stderr, "wkvm-bench-gpu: %s%s%s\n", msg, detail ? ": " : "", detail ? detail : "");
    exit(1);
}

/* Parses "1,8,32" into out (at most BG_MAX_LIST values in [lo, hi]); returns the count. */
static int
bg_list(const char *s, long lo, long hi, long *out, const char *what)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < lo || v > hi || n == BG_MAX_LIST)
            bg_die(what, s);
        out[n++] = v;
        if (*end == ',')
            end++;
        else if (*end != '\0')
            bg_die(what, s);
        p = end;
    }
    if (n == 0)
        bg_die(what, s);
    return n;
}

/* Device-to-device copy bandwidth in bytes/s (read + write), best of rounds. */
static double
bg_roof(int device, size_t bytes, int rounds)
{
    void *a = NULL, *b = NULL;
    if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&a, bytes) != cudaSuccess ||
        cudaMalloc(&b, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(a);
        return 0.0;
    }
    cudaMemset(a, 1, bytes);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice); /* warm-up */
    cudaDeviceSynchronize();
    double best = 0.0;
    for (int r = 0; r < rounds; r++) {
        double t0 = bg_now();
        for (int i = 0; i < 5; i++)
            cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaDeviceSynchronize();
        double bw = 5.0 * 2.0 * (double)bytes / (bg_now() - t0);
        if (bw > best)
            best = bw;
    }
    cudaFree(a);
    cudaFree(b);
    return best;
}

/* Writes s as a JSON string (quoted, escaped). */
static void
bg_json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

typedef struct bg_run {
    const be_ops *ops; /* the CUDA backend */
    be_ctx *ctx;       /* its context */
    uint32_t V;        /* vocab */
} bg_run;

static void
bg_step(bg_run *r, be_row *rows, size_t n)
{
    wk_diag d = {{0}};
    wk_err e = r->ops->step(r->ctx, rows, n, &d);
    if (e != WK_OK)
        bg_die("step", d.msg[0] ? d.msg : wk_strerror(e));
}

/* Decode tok/s at batch B (slots 1..B), best of rounds of about `secs` each. */
static double
bg_decode(bg_run *r, uint32_t B, double secs, int rounds)
{
    int32_t *tok = malloc(sizeof(int32_t) * B * BG_PROMPT);
    float *lg = malloc(sizeof(float) * (size_t)B * r->V);
    be_row *rows = calloc(B, sizeof(*rows));
    if (tok == NULL || lg == NULL || rows == NULL)
        bg_die("out of memory", NULL);
    for (uint32_t i = 0; i < B * BG_PROMPT; i++)
        tok[i] = (int32_t)((i * 2654435761u) % r->V);
    for (uint32_t s = 1; s <= B; s++)
        if (r->ops->slot_reset(r->ctx, s) != WK_OK)
            bg_die("slot reset", NULL);
    /* a short prompt in every slot, in steps of at most 32 rows */
    for (uint32_t s0 = 0; s0 < B; s0 += 32) {
        uint32_t n = B - s0 < 32 ? B - s0 : 32;
        for (uint32_t i = 0; i < n; i++)
            rows[i] = (be_row){.slot = s0 + i + 1, .tokens = tok + (s0 + i) * BG_PROMPT,
                               .n_tokens = BG_PROMPT, .logits_mode = BE_LOGITS_NONE};
        bg_step(r, rows, n);
    }
    for (uint32_t i = 0; i < B; i++)
        rows[i] = (be_row){.slot = i + 1, .tokens = tok + i, .n_tokens = 1,
                           .logits_mode = BE_LOGITS_LAST, .logits = lg + (size_t)i * r->V};
    bg_step(r, rows, B); /* warm-up */
    double best = 0.0;
    for (int k = 0; k < rounds; k++) {
        long steps = 0;
        double t0 = bg_now(), t;
        do {
            bg_step(r, rows, B);
            steps++;
            t = bg_now() - t0;
        } while (t < secs);
        double tps = (double)steps * B / t;
        if (tps > best)
            best = tps;
    }
    free(tok);
    free(lg);
    free(rows);
    return best;
}

/* Prefill tok/s of one T-token row (slot 1), best of rounds. */
static double
bg_prefill(bg_run *r, uint32_t T, int rounds)
{
    int32_t *tok = malloc(sizeof(int32_t) * T);
    float *lg = malloc(sizeof(float) * r->V);
    if (tok == NULL || lg == NULL)
        bg_die("out of memory", NULL);
    for (uint32_t i = 0; i < T; i++)
        tok[i] = (int32_t)((i * 40503u + 7u) % r->V);
    double best = 0.0;
    for (int k = 0; k <= rounds; k++) { /* round 0 warms up */
        if (r->ops->slot_reset(r->ctx, 1) != WK_OK)
            bg_die("slot reset", NULL);
        be_row row = {.slot = 1, .tokens = tok, .n_tokens = T, .logits_mode = BE_LOGITS_LAST,
                      .logits = lg};
        double t0 = bg_now();
        bg_step(r, &row, 1);
        double tps = (double)T / (bg_now() - t0);
        if (k > 0 && tps > best)
            best = tps;
    }
    free(tok);
    free(lg);
    return best;
}

/* The command line as wk_cfg fills it. */
typedef struct bg_args {
    const char *model, *batches, *prefill, *seconds, *label;
    uint32_t device, rounds;
} bg_args;

/* The option table: --help prints it (wk_cfg_tool). */
static const wk_cfg_opt bg_table[] = {
    {"model", WK_CFG_STR, NULL, 0, 0, "model directory or checkpoint file; required"},
    {"device", WK_CFG_U64, "0", 0, 255, "CUDA device"},
    {"batches", WK_CFG_STR, "1,8,32,64,128,256", 0, 0,
     "decode batch sizes, comma separated (1..4096)"},
    {"prefill", WK_CFG_STR, "512,4096", 0, 0, "prefill lengths, comma separated (1..65536)"},
    {"seconds", WK_CFG_STR, "1", 0, 0, "decode time per batch size per round, in (0, 60]"},
    {"rounds", WK_CFG_U64, "3", 1, 20, "every figure is the best of R rounds"},
    {"label", WK_CFG_STR, NULL, 0, 0, "the JSON's label (default: the model's name)"},
};

#define BG_BIND(opt, type, field) WK_CFG_BIND(bg_args, opt, type, field)
static const wk_cfg_bind bg_binds[] = {
    BG_BIND("model", STR, model),     BG_BIND("device", U32, device),
    BG_BIND("batches", STR, batches), BG_BIND("prefill", STR, prefill),
    BG_BIND("seconds", STR, seconds), BG_BIND("rounds", U32, rounds),
    BG_BIND("label", STR, label),
};

static const wk_cfg_tool bg_tool = {
    .prog = "wkvm-bench-gpu",
    .about = "Prints one JSON object: the device, the measured copy-bandwidth roof, decode\n"
             "tok/s per batch against it, prefill tok/s per length.",
    .opts = bg_table,
    .n_opts = sizeof(bg_table) / sizeof(bg_table[0]),
    .binds = bg_binds,
    .n_binds = sizeof(bg_binds) / sizeof(bg_binds[0]),
};

int
main(int argc, char **argv)
{
    bg_args a = {0};
    wk_cfg *cfg = NULL;
    int prc = wk_cfg_tool_parse(&bg_tool, argc, argv, &a, &cfg);
    if (prc != WK_CFG_TOOL_RUN)
        return prc;
    const char *model = a.model, *label = a.label;
    long batches[BG_MAX_LIST], prefill[BG_MAX_LIST];
    int nb = bg_list(a.batches, 1, 4096, batches, "--batches");
    int np = bg_list(a.prefill, 1, 65536, prefill, "--prefill");
    int rounds = (int)a.rounds, device = (int)a.device;
    double secs = atof(a.seconds);
    if (!(secs > 0.0 && secs <= 60.0))
        bg_die("--seconds must be in (0, 60]", a.seconds);
    if (model == NULL) {
        fprintf(stderr, "wkvm-bench-gpu: --model DIR is required (see --help)\n");
        return 2;
    }
    wk_diag d = {{0}};
    wk_err e = be_cuda_device_check(device, &d);
    if (e != WK_OK) {
        fprintf(stderr, "wkvm-bench-gpu: %s\n", d.msg);
        return e == WK_ENOENT ? 77 : 1;
    }
    const be_ops *ops = be_cuda_ops_get();
    wrk_model *m = NULL;
    wrk_model_opts mo = {0};
    if (wrk_model_load(model, &mo, &m, &d) != WK_OK)
        bg_die("load", d.msg);
    const wrk_model_info *info = wrk_model_info_get(m);
    long maxb = 1, maxp = BG_PROMPT * 32;
    for (int i = 0; i < nb; i++)
        maxb = batches[i] > maxb ? batches[i] : maxb;
    for (int i = 0; i < np; i++)
        maxp = prefill[i] > maxp ? prefill[i] : maxp;
    be_config bc = {.n_slots = (uint32_t)maxb + 1, .n_threads = 1, .device = device,
                    .max_step_rows = (uint32_t)maxb, .max_step_tokens = (uint32_t)maxp};
    bg_run r = {.ops = ops, .V = info->vocab_size};
    double t0 = bg_now();
    if (ops->open(&bc, m, &r.ctx, &d) != WK_OK)
        bg_die("open", d.msg);
    const double open_s = bg_now() - t0;
    char name[128] = "", desc[512] = "";
    uint64_t mem = 0;
    ops->probe(device, name, sizeof(name), &mem);
    if (ops->describe != NULL)
        ops->describe(r.ctx, desc, sizeof(desc));
    const double bw = bg_roof(device, (size_t)1 << 30, rounds);

    const char *keys[5] = {"label", "model", "family", "device", "backend"};
    const char *vals[5] = {label ? label : info->name, info->name, info->family, name, desc};
    for (int i = 0; i < 5; i++) {
        printf("%s\"%s\": ", i ? ", " : "{", keys[i]);
        bg_json_str(vals[i]);
    }
    printf(",\n");
    printf(" \"params\": %llu, \"weight_bytes\": %llu, \"state_bytes\": %llu, "
           "\"layers\": %u, \"embd\": %u, \"vocab\": %u, \"open_s\": %.2f,\n",
           (unsigned long long)info->n_params, (unsigned long long)info->weight_bytes,
           (unsigned long long)info->state_bytes, info->n_layer, info->n_embd, info->vocab_size,
           open_s);
    printf(" \"roof_copy_gbps\": %.1f,\n \"decode\": [", bw / 1e9);
    for (int i = 0; i < nb; i++) {
        const uint32_t B = (uint32_t)batches[i];
        const double tps = bg_decode(&r, B, secs, rounds);
        const double step_bytes = (double)info->weight_bytes + 2.0 * B * (double)info->state_bytes;
        const double roof = bw > 0.0 ? bw / step_bytes * B : 0.0;
        printf("%s\n  {\"batch\": %u, \"tok_s\": %.1f, \"roof_tok_s\": %.1f, \"of_roof\": %.3f}",
               i ? "," : "", B, tps, roof, roof > 0.0 ? tps / roof : 0.0);
        fflush(stdout);
    }
    printf("],\n \"prefill\": [");
    for (int i = 0; i < np; i++) {
        const double tps = bg_prefill(&r, (uint32_t)prefill[i], rounds);
        printf("%s\n  {\"tokens\": %ld, \"tok_s\": %.1f, \"model_tflops\": %.2f}", i ? "," : "",
               prefill[i], tps, 2.0 * (double)info->n_params * tps / 1e12);
        fflush(stdout);
    }
    printf("]}\n");
    ops->close(r.ctx);
    wrk_model_free(m);
    return 0;
}
