/*
 * be_cuda_nccl: the CUDA backend's NCCL point-to-point slot transfer
 * between two workers' device arenas (the be_nccl.h seam); the worker's
 * only NCCL user, and its CUDA runtime calls are the backend's. The
 * communicators are non-blocking (ncclConfig_t.blocking = 0) so that every
 * wait can be polled against a deadline; a deadline that passes, or an
 * asynchronous NCCL error (a dead peer), aborts the communicator. Must
 * never block without a deadline and never logs.
 */
#include "be_nccl.h"

#include <cuda_runtime.h>
/* nccl.h declares a few functions as f() (third-party header, not ours to fix). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Static_assert(sizeof(ncclUniqueId) == BE_NCCL_ID_LEN, "ncclUniqueId is 128 bytes");

#define BE_NCCL_POLL_NS 50000L           /* sleep between polls: 50 us */
#define BE_NCCL_FINALIZE_MS 5000u        /* deadline of the clean teardown */

struct be_nccl {
    ncclComm_t comm;     /* two-rank communicator */
    cudaStream_t stream; /* where the sends/receives run */
    int device;          /* CUDA ordinal */
    int rank;            /* 0 = source, 1 = destination */
    bool aborted;        /* comm was aborted: only close() is left */
};

static uint64_t
be_nccl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void
be_nccl_nap(void)
{
    struct timespec ts = {0, BE_NCCL_POLL_NS};
    nanosleep(&ts, NULL);
}

/* A runtime failure handled here: clears the runtime's last error, returns ce's message. */
static const char *
be_nccl_cuda_handled(cudaError_t ce)
{
    (void)cudaGetLastError();
    return cudaGetErrorString(ce);
}

/* Waits until comm's asynchronous state leaves ncclInProgress or the deadline passes. */
static ncclResult_t
be_nccl_settle(ncclComm_t comm, uint64_t deadline_ms, bool *timed_out)
{
    ncclResult_t st = ncclInProgress;
    *timed_out = false;
    for (;;) {
        ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess)
            return r;
        if (st != ncclInProgress)
            return st;
        if (be_nccl_now_ms() >= deadline_ms) {
            *timed_out = true;
            return ncclInProgress;
        }
        be_nccl_nap();
    }
}

bool
be_nccl_available(int device)
{
    int n = 0, version = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    if (device < 0 || device >= n)
        return false;
    return ncclGetVersion(&version) == ncclSuccess && version > 0;
}

wk_err
be_nccl_device_ids(int device, char *uuid, size_t uuid_cap, char *pci, size_t pci_cap)
{
    if (uuid_cap > 0)
        uuid[0] = '\0';
    if (pci_cap > 0)
        pci[0] = '\0';
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return WK_EDEVICE;
    }
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(uuid, uuid_cap,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
    char bus[32];
    if (cudaDeviceGetPCIBusId(bus, (int)sizeof(bus), device) == cudaSuccess)
        snprintf(pci, pci_cap, "%s", bus);
    else
        (void)cudaGetLastError();
    return WK_OK;
}

wk_err
be_nccl_unique_id(uint8_t id[BE_NCCL_ID_LEN], wk_diag *d)
{
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess)
        return wk_diag_set(d, WK_EDEVICE, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(id, uid.internal, BE_NCCL_ID_LEN);
    return WK_OK;
}

wk_err
be_nccl_open(const uint8_t id[BE_NCCL_ID_LEN], int rank, int device, uint32_t timeout_ms,
              be_nccl **out, wk_diag *d)
{
    if (rank != 0 && rank != 1)
        return wk_diag_set(d, WK_EINVAL, "rank %d: a pair has ranks 0 and 1", rank);
    uint64_t deadline = be_nccl_now_ms() + (timeout_ms ? timeout_ms : BE_NCCL_TIMEOUT_DEFAULT_MS);
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return wk_diag_set(d, WK_EDEVICE, "cudaSetDevice(%d): %s", device,
                           be_nccl_cuda_handled(ce));
    be_nccl *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory for an NCCL pair");
    c->device = device;
    c->rank = rank;
    ce = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        free(c);
        return wk_diag_set(d, WK_EDEVICE, "cudaStreamCreate: %s", be_nccl_cuda_handled(ce));
    }
    ncclUniqueId uid;
    memcpy(uid.internal, id, BE_NCCL_ID_LEN);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, 2, uid, rank, &cfg);
    bool timed_out = false;
    if ((r == ncclSuccess || r == ncclInProgress) && c->comm != NULL)
        r = be_nccl_settle(c->comm, deadline, &timed_out);
    if (r != ncclSuccess) {
        wk_err err = timed_out ? wk_diag_set(d, WK_ETIMEDOUT, "ncclCommInitRank rank %d: the "
                                             "peer did not join within %u ms", rank,
                                             timeout_ms ? timeout_ms
                                                        : BE_NCCL_TIMEOUT_DEFAULT_MS)
                               : wk_diag_set(d, WK_EDEVICE, "ncclCommInitRank rank %d: %s",
                                             rank, ncclGetErrorString(r));
        c->aborted = true;
        be_nccl_close(c, true);
        return err;
    }
    *out = c;
    return WK_OK;
}

/* Enqueues the chunks of one direction, then waits for the stream with a deadline. */
static wk_err
be_nccl_move(be_nccl *c, void *buf, uint64_t len, uint32_t chunk, uint32_t timeout_ms,
              bool send, wk_diag *d)
{
    const char *what = send ? "ncclSend" : "ncclRecv";
    if (c == NULL || c->aborted)
        return wk_diag_set(d, WK_ESTATE, "%s on an aborted communicator", what);
    uint32_t ms = timeout_ms ? timeout_ms : BE_NCCL_TIMEOUT_DEFAULT_MS;
    uint64_t deadline = be_nccl_now_ms() + ms;
    uint64_t step = chunk ? chunk : BE_NCCL_CHUNK_DEFAULT;
    int peer = 1 - c->rank;
    cudaError_t ce = cudaSetDevice(c->device);
    if (ce != cudaSuccess)
        return wk_diag_set(d, WK_EDEVICE, "cudaSetDevice(%d): %s", c->device,
                           be_nccl_cuda_handled(ce));
    bool timed_out = false;
    ncclResult_t r = ncclSuccess;
    for (uint64_t off = 0; off < len && r == ncclSuccess; off += step) {
        size_t n = (size_t)(len - off < step ? len - off : step);
        uint8_t *p = (uint8_t *)buf + off;
        r = send ? ncclSend(p, n, ncclUint8, peer, c->comm, c->stream)
                 : ncclRecv(p, n, ncclUint8, peer, c->comm, c->stream);
        if (r == ncclInProgress)
            r = be_nccl_settle(c->comm, deadline, &timed_out);
    }
    /*
     * Wait for the stream, watching for asynchronous errors (a dead peer).
     * Every answer of cudaStreamQuery but cudaSuccess, cudaErrorNotReady
     * included, is also left as the runtime's last error: cleared here, where
     * it is handled, or the next kernel launch of this thread would report it.
     */
    while (r == ncclSuccess) {
        ce = cudaStreamQuery(c->stream);
        if (ce == cudaSuccess)
            break;
        (void)cudaGetLastError();
        if (ce != cudaErrorNotReady) {
            ncclCommAbort(c->comm);
            c->comm = NULL;
            c->aborted = true;
            return wk_diag_set(d, WK_EDEVICE, "%s: %s", what, cudaGetErrorString(ce));
        }
        ncclResult_t st = ncclSuccess;
        r = ncclCommGetAsyncError(c->comm, &st);
        if (r == ncclSuccess && st != ncclSuccess && st != ncclInProgress)
            r = st;
        if (r == ncclSuccess && be_nccl_now_ms() >= deadline) {
            timed_out = true;
            r = ncclInProgress;
        }
        if (r == ncclSuccess)
            be_nccl_nap();
    }
    if (r == ncclSuccess)
        return WK_OK;
    /* Abort: the peer may be gone, and what is queued must not wait for it. */
    ncclCommAbort(c->comm);
    c->comm = NULL;
    c->aborted = true;
    if (timed_out)
        return wk_diag_set(d, WK_ETIMEDOUT, "%s of %llu bytes did not complete within %u ms "
                           "(communicator aborted)", what, (unsigned long long)len, ms);
    return wk_diag_set(d, WK_EDEVICE, "%s: %s (communicator aborted)", what,
                       ncclGetErrorString(r));
}

wk_err
be_nccl_send(be_nccl *c, const void *buf, uint64_t len, uint32_t chunk, uint32_t timeout_ms,
              wk_diag *d)
{
    return be_nccl_move(c, (void *)buf, len, chunk, timeout_ms, true, d);
}

wk_err
be_nccl_recv(be_nccl *c, void *buf, uint64_t len, uint32_t chunk, uint32_t timeout_ms,
              wk_diag *d)
{
    return be_nccl_move(c, buf, len, chunk, timeout_ms, false, d);
}

void
be_nccl_close(be_nccl *c, bool abort)
{
    if (c == NULL)
        return;
    (void)cudaSetDevice(c->device);
    if (c->comm != NULL) {
        bool clean = !abort && !c->aborted;
        if (clean) {
            bool timed_out = false;
            ncclResult_t r = ncclCommFinalize(c->comm);
            if (r == ncclSuccess || r == ncclInProgress)
                r = be_nccl_settle(c->comm, be_nccl_now_ms() + BE_NCCL_FINALIZE_MS,
                                    &timed_out);
            if (r == ncclSuccess) {
                ncclResult_t dr = ncclCommDestroy(c->comm);
                clean = dr == ncclSuccess || dr == ncclInProgress;
            } else {
                clean = false;
            }
        }
        if (!clean)
            ncclCommAbort(c->comm);
        c->comm = NULL;
    }
    if (c->stream != NULL)
        cudaStreamDestroy(c->stream);
    free(c);
}
