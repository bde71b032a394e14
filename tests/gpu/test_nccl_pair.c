/*
 * GPU suite: the NCCL migration transport (be_nccl) between two devices in
 * one process: two threads, ranks 0 and 1, one device each, join a pair
 * communicator from one ncclUniqueId, and move a 33 MiB slot-sized pattern
 * from device arena to device arena in chunks. Checks the bytes and their
 * SHA-256, reports GB/s, then checks that a rank whose peer never comes
 * times out (and aborts) instead of hanging. Exits 77 (meson's skip) with
 * fewer than two CUDA devices.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "be_nccl.h"
#include "gpu_gate.h"
#include "k.h"
#include "wk_sha256.h"

#define SLOT_BYTES (33u << 20) /* a slot-sized transfer */
#define CHUNK (4u << 20)

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

typedef struct rank_arg {
    int rank;                        /* 0 sends, 1 receives */
    int device;                      /* CUDA ordinal */
    const uint8_t *id;               /* the pair's ncclUniqueId */
    void *arena;                     /* device buffer, SLOT_BYTES */
    wk_err err;                      /* result */
    wk_diag d;                       /* detail */
    double secs;                     /* transfer time */
    int after;                       /* a kernel launch on this thread after the transfer */
} rank_arg;

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *
rank_main(void *p)
{
    rank_arg *a = p;
    be_nccl *c = NULL;
    a->err = be_nccl_open(a->id, a->rank, a->device, 30000, &c, &a->d);
    if (a->err != WK_OK)
        return NULL;
    double t0 = now_s();
    a->err = a->rank == 0 ? be_nccl_send(c, a->arena, SLOT_BYTES, CHUNK, 30000, &a->d)
                          : be_nccl_recv(c, a->arena, SLOT_BYTES, CHUNK, 30000, &a->d);
    a->secs = now_s() - t0;
    be_nccl_close(c, a->err != WK_OK);
    /*
     * The first launch after a transfer must succeed: the transfer's polls
     * (cudaStreamQuery answering cudaErrorNotReady) leave nothing behind
     * that the next launch on this thread would report as its own.
     */
    float *g = NULL;
    a->after = (int)cudaMalloc((void **)&g, 2 * 64 * sizeof(float));
    if (a->after == 0) {
        (void)cudaMemset(g, 0, 2 * 64 * sizeof(float));
        a->after = k_swiglu(g, g + 64, 64, NULL);
        if (a->after == 0)
            a->after = (int)cudaDeviceSynchronize();
        cudaFree(g);
    }
    return NULL;
}

int
main(void)
{
    const int gate = gpu_gate(0);
    if (gate >= 0)
        return gate;
    wk_diag gd = {{0}};
    wk_err ge = be_cuda_device_check(1, &gd);
    if (ge == WK_ENOENT) {
        printf("fewer than two CUDA devices (%s): skipped\n", gd.msg);
        return 77;
    }
    CHECK(ge == WK_OK, "device 1: %s", gd.msg);
    CHECK(be_nccl_available(0) && be_nccl_available(1), "NCCL not available");
    char uuid[2][65], pci[2][65];
    for (int i = 0; i < 2; i++) {
        CHECK(be_nccl_device_ids(i, uuid[i], sizeof(uuid[i]), pci[i], sizeof(pci[i])) == WK_OK,
              "device ids of %d", i);
        printf("device %d: %s %s\n", i, uuid[i], pci[i]);
    }
    CHECK(strncmp(uuid[0], "GPU-", 4) == 0 && strcmp(uuid[0], uuid[1]) != 0, "distinct UUIDs");

    uint8_t *host = malloc(SLOT_BYTES), *back = malloc(SLOT_BYTES);
    CHECK(host != NULL && back != NULL, "host buffers");
    for (size_t i = 0; i < SLOT_BYTES; i++)
        host[i] = (uint8_t)((i * 2654435761u) >> 13);
    void *arena[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        CHECK(cudaSetDevice(i) == cudaSuccess, "set device %d", i);
        CHECK(cudaMalloc(&arena[i], SLOT_BYTES) == cudaSuccess, "arena on %d", i);
        CHECK(cudaMemset(arena[i], 0, SLOT_BYTES) == cudaSuccess, "memset on %d", i);
    }
    CHECK(cudaSetDevice(0) == cudaSuccess &&
              cudaMemcpy(arena[0], host, SLOT_BYTES, cudaMemcpyHostToDevice) == cudaSuccess,
          "pattern upload");

    uint8_t id[BE_NCCL_ID_LEN];
    wk_diag d = {{0}};
    CHECK(be_nccl_unique_id(id, &d) == WK_OK, "unique id: %s", d.msg);
    rank_arg ra[2] = {{.rank = 0, .device = 0, .id = id, .arena = arena[0]},
                      {.rank = 1, .device = 1, .id = id, .arena = arena[1]}};
    pthread_t thr[2];
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&thr[i], NULL, rank_main, &ra[i]) == 0, "thread");
    for (int i = 0; i < 2; i++)
        pthread_join(thr[i], NULL);
    CHECK(ra[0].err == WK_OK, "rank 0: %s", ra[0].d.msg);
    CHECK(ra[1].err == WK_OK, "rank 1: %s", ra[1].d.msg);
    for (int i = 0; i < 2; i++)
        CHECK(ra[i].after == 0, "rank %d: the first kernel launch after the transfer failed: %s",
              i, cudaGetErrorString((cudaError_t)ra[i].after));
    CHECK(cudaSetDevice(1) == cudaSuccess &&
              cudaMemcpy(back, arena[1], SLOT_BYTES, cudaMemcpyDeviceToHost) == cudaSuccess,
          "read back");
    CHECK(memcmp(host, back, SLOT_BYTES) == 0, "bytes differ after the transfer");
    char h0[WK_SHA256_HEX_LEN], h1[WK_SHA256_HEX_LEN];
    wk_sha256_hex(host, SLOT_BYTES, h0);
    wk_sha256_hex(back, SLOT_BYTES, h1);
    CHECK(strcmp(h0, h1) == 0, "checksum");
    double secs = ra[1].secs > ra[0].secs ? ra[1].secs : ra[0].secs;
    printf("nccl pair: %u MiB in %.3f ms, %.2f GB/s, sha256 %.16s...\n", SLOT_BYTES >> 20,
           secs * 1e3, secs > 0 ? (double)SLOT_BYTES / secs / 1e9 : 0.0, h1);

    /* A rank whose peer never joins times out and aborts instead of hanging. */
    CHECK(be_nccl_unique_id(id, &d) == WK_OK, "unique id: %s", d.msg);
    be_nccl *lonely = NULL;
    double t0 = now_s();
    wk_err err = be_nccl_open(id, 1, 1, 1500, &lonely, &d);
    CHECK(err == WK_ETIMEDOUT, "lonely rank: %d (%s)", (int)err, d.msg);
    CHECK(now_s() - t0 < 10.0, "the timeout took %.1f s", now_s() - t0);

    for (int i = 0; i < 2; i++) {
        cudaSetDevice(i);
        cudaFree(arena[i]);
    }
    free(host);
    free(back);
    printf("1 passed, 0 failed\n");
    return 0;
}
