/*
 * GPU suite: the CUDA backend's device arena on a real device. Exits 77
 * (meson's skip) when the build has no CUDA backend or no device answers.
 * Checks slot reset, write/read round trips in odd pieces, copy (fork),
 * range checks (slot 0 is not readable), and that a step runs and a bad
 * step is refused (test_cuda_step checks the step's numbers).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../unit/rwkv7_synth.h"
#include "be.h"
#include "gpu_gate.h"
#include "wrk_model.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int
main(void)
{
    const be_ops *cu = be_cuda_ops_get();
    char dev[128];
    uint64_t mem = 0;
    const int gate = gpu_gate_probe(cu, dev, sizeof(dev), &mem);
    if (gate >= 0)
        return gate;
    printf("device: %s, %llu MiB\n", dev, (unsigned long long)(mem >> 20));
    char dir[] = "/tmp/wkvm-gpu-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    synth_cfg c = synth_default();
    CHECK(synth_write(dir, &c) == 0, "synth model");
    wrk_model *m = NULL;
    wk_diag d = {{0}};
    wrk_model_opts mo = {0};
    CHECK(wrk_model_load(dir, &mo, &m, &d) == WK_OK, "load: %s", d.msg);
    be_config bc = {.n_slots = 4, .n_threads = 1, .device = 0, .max_step_rows = 8,
                    .max_step_tokens = 64};
    be_ctx *ctx = NULL;
    CHECK(cu->open(&bc, m, &ctx, &d) == WK_OK, "open: %s", d.msg);
    uint64_t sb = cu->slot_bytes(ctx);
    CHECK(sb == wrk_model_info_get(m)->state_bytes, "slot bytes");
    unsigned char *a = malloc(sb), *b = malloc(sb);
    for (uint64_t i = 0; i < sb; i++)
        a[i] = (unsigned char)(i * 131 + 7);
    /* Write in odd pieces, read back whole. */
    for (uint64_t off = 0; off < sb; off += 1000) {
        size_t n = sb - off < 1000 ? (size_t)(sb - off) : 1000;
        CHECK(cu->slot_write(ctx, 1, off, a + off, n) == WK_OK, "write at %llu",
              (unsigned long long)off);
    }
    CHECK(cu->slot_read(ctx, 1, 0, b, sb) == WK_OK && memcmp(a, b, sb) == 0, "round trip");
    CHECK(cu->slot_copy(ctx, 2, 1) == WK_OK, "copy");
    CHECK(cu->slot_read(ctx, 2, 0, b, sb) == WK_OK && memcmp(a, b, sb) == 0, "copy bytes");
    CHECK(cu->slot_reset(ctx, 1) == WK_OK, "reset");
    CHECK(cu->slot_read(ctx, 1, 0, b, sb) == WK_OK, "read after reset");
    for (uint64_t i = 0; i < sb; i++)
        CHECK(b[i] == 0, "reset byte %llu", (unsigned long long)i);
    CHECK(cu->slot_read(ctx, 9, 0, b, 8) == WK_EINVAL, "bad slot refused");
    CHECK(cu->slot_read(ctx, 1, sb - 4, b, 8) == WK_EINVAL, "range refused");
    int32_t tok = 1;
    float *logits = calloc(wrk_model_info_get(m)->vocab_size, sizeof(float));
    be_row row = {.slot = 1, .tokens = &tok, .n_tokens = 1, .logits_mode = BE_LOGITS_LAST,
                  .logits = logits};
    CHECK(cu->slot_read(ctx, 0, 0, b, 8) == WK_EINVAL, "slot 0 refused");
    CHECK(cu->step(ctx, &row, 1, &d) == WK_OK, "step: %s", d.msg);
    row.slot = 9;
    CHECK(cu->step(ctx, &row, 1, &d) == WK_EINVAL, "bad slot step refused");
    cu->close(ctx);
    wrk_model_free(m);
    free(logits);
    free(a);
    free(b);
    printf("1 passed, 0 failed\n");
    return 0;
}
