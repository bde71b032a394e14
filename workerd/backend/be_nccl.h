/*
 * be_nccl: the worker's NCCL point-to-point transfer of slot bytes, device
 * arena to device arena, for live migration between GPU workers. One
 * communicator of two ranks per migration (source rank 0, destination rank
 * 1), made from the ncclUniqueId the source generated and the controller
 * relayed. Every wait has a deadline: the communicator is non-blocking and
 * polled, and on a timeout or a peer's death it is aborted (ncclCommAbort),
 * never left hanging.
 *
 * Compiled only in CUDA builds (WKVM_HAVE_CUDA); otherwise the inline stubs
 * below answer WK_ENOTSUP and be_nccl_available() is false, so the worker
 * advertises no NCCL and the controller always picks NNG. Never logs.
 * Threading: a be_nccl is used by one thread at a time (its owner);
 * separate objects may live on separate threads (the GPU test runs both
 * ranks in one process).
 */
#ifndef BE_NCCL_H
#define BE_NCCL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"

#define BE_NCCL_ID_LEN 128u                  /* sizeof(ncclUniqueId) */
#define BE_NCCL_CHUNK_DEFAULT (4u << 20)     /* bytes per ncclSend/ncclRecv by default */
#define BE_NCCL_TIMEOUT_DEFAULT_MS 30000u    /* deadline when the caller gives 0 */

typedef struct be_nccl be_nccl;

#ifdef WKVM_HAVE_CUDA

/*
 * True when NCCL can work on CUDA device `device` here: the library loads
 * and reports a version, and the device answers.
 */
bool be_nccl_available(int device);

/*
 * The identity of device for Hello: "GPU-<uuid>" into uuid and the PCI bus
 * id ("0000:3b:00.0") into pci (both NUL-terminated, "" when unknown).
 * WK_EDEVICE when the device does not answer.
 */
WK_MUST_CHECK wk_err be_nccl_device_ids(int device, char *uuid, size_t uuid_cap, char *pci,
                                         size_t pci_cap);

/* A fresh ncclUniqueId (ncclGetUniqueId) into id. WK_EDEVICE with a diag on failure. */
WK_MUST_CHECK wk_err be_nccl_unique_id(uint8_t id[BE_NCCL_ID_LEN], wk_diag *d);

/*
 * Joins the two-rank communicator of id (borrowed) as rank (0 = source,
 * 1 = destination) on device; blocks until the peer joins or timeout_ms
 * (0 = default) passes. On success the caller owns *out and ends it with
 * be_nccl_close(). WK_EINVAL (rank not 0/1), WK_ETIMEDOUT (peer never
 * came; the half-made communicator is aborted), WK_EDEVICE.
 */
WK_MUST_CHECK wk_err be_nccl_open(const uint8_t id[BE_NCCL_ID_LEN], int rank, int device,
                                   uint32_t timeout_ms, be_nccl **out, wk_diag *d);

/*
 * Sends len bytes at device pointer buf (borrowed) to the peer in chunks of
 * chunk bytes (0 = default), waiting until the transfer completes or
 * timeout_ms (0 = default) passes. The peer must call be_nccl_recv() with
 * the same len and chunk. WK_ETIMEDOUT (the communicator is then aborted
 * and only be_nccl_close() is left to do), WK_EDEVICE (NCCL or CUDA error,
 * e.g. the peer died), WK_ESTATE (called after an abort).
 */
WK_MUST_CHECK wk_err be_nccl_send(be_nccl *c, const void *buf, uint64_t len, uint32_t chunk,
                                   uint32_t timeout_ms, wk_diag *d);

/* Receives len bytes into device pointer buf; as be_nccl_send(). */
WK_MUST_CHECK wk_err be_nccl_recv(be_nccl *c, void *buf, uint64_t len, uint32_t chunk,
                                   uint32_t timeout_ms, wk_diag *d);

/*
 * Ends the communicator: destroyed after a completed transfer, aborted
 * (ncclCommAbort) when abort is true or a failure already aborted it.
 * Frees c. NULL-safe.
 */
void be_nccl_close(be_nccl *c, bool abort);

#else /* !WKVM_HAVE_CUDA: no NCCL in this build */

static inline bool
be_nccl_available(int device)
{
    (void)device;
    return false;
}

static inline wk_err
be_nccl_device_ids(int device, char *uuid, size_t uuid_cap, char *pci, size_t pci_cap)
{
    (void)device;
    if (uuid_cap > 0)
        uuid[0] = '\0';
    if (pci_cap > 0)
        pci[0] = '\0';
    return WK_ENOTSUP;
}

static inline wk_err
be_nccl_unique_id(uint8_t id[BE_NCCL_ID_LEN], wk_diag *d)
{
    (void)id;
    return wk_diag_set(d, WK_ENOTSUP, "this worker was built without CUDA/NCCL");
}

static inline wk_err
be_nccl_open(const uint8_t id[BE_NCCL_ID_LEN], int rank, int device, uint32_t timeout_ms,
              be_nccl **out, wk_diag *d)
{
    (void)id;
    (void)rank;
    (void)device;
    (void)timeout_ms;
    (void)out;
    return wk_diag_set(d, WK_ENOTSUP, "this worker was built without CUDA/NCCL");
}

static inline wk_err
be_nccl_send(be_nccl *c, const void *buf, uint64_t len, uint32_t chunk, uint32_t timeout_ms,
              wk_diag *d)
{
    (void)c;
    (void)buf;
    (void)len;
    (void)chunk;
    (void)timeout_ms;
    return wk_diag_set(d, WK_ENOTSUP, "this worker was built without CUDA/NCCL");
}

static inline wk_err
be_nccl_recv(be_nccl *c, void *buf, uint64_t len, uint32_t chunk, uint32_t timeout_ms,
              wk_diag *d)
{
    (void)c;
    (void)buf;
    (void)len;
    (void)chunk;
    (void)timeout_ms;
    return wk_diag_set(d, WK_ENOTSUP, "this worker was built without CUDA/NCCL");
}

static inline void
be_nccl_close(be_nccl *c, bool abort)
{
    (void)c;
    (void)abort;
}

#endif /* WKVM_HAVE_CUDA */

#endif /* BE_NCCL_H */
