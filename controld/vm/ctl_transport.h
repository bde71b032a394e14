/*
 * ctl_transport: how a migration's bytes move between two workers.
 *
 * Two transports. "nng": the controller relays the slot in chunks
 * (SlotRead from the source, SlotWrite to the destination, ctl_vm_transfer)
 * and works between any two workers. "nccl": the two workers move the bytes
 * themselves, device arena to device arena, with ncclSend/ncclRecv on a
 * two-rank communicator made for the pair; the controller only passes the
 * source's ncclUniqueId to the destination and drives the phases. The
 * controller never links CUDA or NCCL: to it an ncclUniqueId is 128 opaque
 * bytes.
 *
 * ctl_transport_choose() is a pure function of what the two workers said in
 * Hello. ctl_transport_nccl_run() is the NCCL phase machine:
 *
 *   ID        MIGRATE_NCCL_ID to the source: a fresh ncclUniqueId
 *   PREPARE   MIGRATE_PREPARE to both at once, the id byte-exact to each
 *             (ncclCommInitRank: source rank 0, destination rank 1)
 *   TRANSFER  MIGRATE_SEND to the source and MIGRATE_RECV to the destination
 *             at once (ncclSend/ncclRecv in chunks; each replies with the hex
 *             SHA-256 of the bytes it sent / now holds)
 *   VERIFY    the two checksums agree
 *   COMMIT    MIGRATE_COMMIT to both: communicators destroyed      -> DONE
 *   ABORT     MIGRATE_COMMIT abort to both: ncclCommAbort          -> FAILED
 *
 * Every failure after ID goes through ABORT. The source slot is never
 * written by any phase, so a failed NCCL attempt leaves it intact and
 * ctl_transport_move() retries the same migration once over NNG.
 *
 * Threading: thread-safe; the functions block the calling thread (never a
 * pool thread) and use one helper thread per two-sided phase.
 */
#ifndef CTL_TRANSPORT_H
#define CTL_TRANSPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "ctl_pool.h"
#include "ctl_sched.h"
#include "ctl_vm.h"
#include "wk_err.h"

typedef enum ctl_transport_kind {
    CTL_TRANSPORT_KIND_NNG = 0, /* controller-relayed chunks */
    CTL_TRANSPORT_KIND_NCCL,    /* ncclSend/ncclRecv between the two devices */
} ctl_transport_kind;

/* What the choice looks at, from one worker's Hello. Strings borrowed. */
typedef struct ctl_transport_peer {
    const char *worker;      /* worker id */
    const char *backend;     /* "cpu" or "cuda" */
    const char *hostname;    /* host the worker runs on */
    uint32_t device_index;   /* CUDA ordinal */
    const char *device_uuid; /* "GPU-<uuid>", "" when unknown */
    const char *pci_bus_id;  /* "0000:3b:00.0", "" when unknown */
    bool nccl;               /* built with NCCL and a device present */
    bool hybrid;             /* its model's slots carry KV pages (variable size): NNG only */
} ctl_transport_peer;

typedef struct ctl_transport_choice {
    ctl_transport_kind kind; /* the transport to try */
    char reason[160];        /* why, for logs and the admin API ("same GPU (GPU-1a..)") */
} ctl_transport_choice;

/*
 * Picks the transport for moving a slot from src to dst (both borrowed).
 * NCCL only when both are CUDA workers with NCCL, on different devices, and
 * on the same host unless nccl_net (NCCL's network transport between hosts)
 * is allowed. Pure; never fails; *out always written.
 */
void ctl_transport_choose(const ctl_transport_peer *src, const ctl_transport_peer *dst,
                          bool nccl_net, ctl_transport_choice *out);

/* "nng" or "nccl", static. */
const char *ctl_transport_kind_name(ctl_transport_kind k);

typedef enum ctl_nccl_phase {
    CTL_NCCL_PHASE_ID = 0,   /* the source makes an ncclUniqueId */
    CTL_NCCL_PHASE_PREPARE,  /* both join the communicator */
    CTL_NCCL_PHASE_TRANSFER, /* send / receive + checksums */
    CTL_NCCL_PHASE_VERIFY,   /* compare the checksums */
    CTL_NCCL_PHASE_COMMIT,   /* tear the communicator down */
    CTL_NCCL_PHASE_ABORT,    /* abort the communicator on both sides */
    CTL_NCCL_PHASE_DONE,     /* final: the destination holds verified bytes */
    CTL_NCCL_PHASE_FAILED,   /* final: nothing changed on the source */
} ctl_nccl_phase;

/* "id", "prepare", ... static. */
const char *ctl_nccl_phase_name(ctl_nccl_phase p);

typedef struct ctl_transport_opts {
    bool nccl_net;                /* allow NCCL between hosts */
    uint32_t init_timeout_ms;     /* communicator setup deadline, 0 = 30000 */
    uint32_t transfer_timeout_ms; /* send/receive deadline, 0 = 60000 */
    uint32_t chunk_bytes;         /* bytes per ncclSend, 0 = the worker's 4 MiB */
} ctl_transport_opts;

/* What a move did. */
typedef struct ctl_transport_report {
    ctl_transport_kind kind;     /* the transport that moved (or last tried to move) the bytes */
    char reason[160];            /* why the first choice was made */
    char fallback[512];          /* "" or why the NCCL attempt gave way to NNG */
    ctl_nccl_phase failed_phase; /* where the NCCL attempt failed, when fallback != "" */
    uint64_t bytes;              /* bytes moved by the transfer that committed */
} ctl_transport_report;

/*
 * Runs the NCCL phase machine (above) for slot src -> dst, both slots held
 * by the caller, state_bytes per slot. o borrowed (NULL: defaults).
 * *failed_phase (may be NULL) receives the phase that failed. WK_OK: dst
 * holds bytes whose SHA-256 both workers reported equal. Errors: the
 * failing call's (WK_ENOTSUP worker without NCCL, WK_ETIMEDOUT,
 * WK_EUNAVAIL/WK_ENOENT worker gone, WK_EDEVICE), WK_ECORRUPT checksum
 * mismatch, WK_EPROTO malformed reply; the diag names the phase.
 */
WK_MUST_CHECK wk_err ctl_transport_nccl_run(ctl_pool *pool, const ctl_slot_ref *src,
                                            const ctl_slot_ref *dst, uint64_t state_bytes,
                                            const ctl_transport_opts *o,
                                            ctl_nccl_phase *failed_phase, wk_diag *d);

/*
 * Moves the bytes of slot src into slot dst (both held by the caller; src
 * is only read): chooses the transport from the pool's records of the two
 * workers, runs NCCL when chosen and falls back to NNG (ctl_vm_transfer)
 * once when it fails, logging why. *rep is always written. Returns the
 * final attempt's error (see ctl_vm_transfer).
 */
WK_MUST_CHECK wk_err ctl_transport_move(ctl_pool *pool, ctl_vm *vm, const ctl_slot_ref *src,
                                        const ctl_slot_ref *dst, const ctl_transport_opts *o,
                                        ctl_transport_report *rep, wk_diag *d);

#endif /* CTL_TRANSPORT_H */
