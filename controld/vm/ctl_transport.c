/*
 * ctl_transport: the choice between the NCCL and NNG transports of a
 * migration, and the NCCL phase machine (see ctl_transport.h). Talks to
 * workers only through ctl_pool_call(); never links CUDA or NCCL (the
 * ncclUniqueId is 128 opaque bytes relayed from the source to the
 * destination). It must never write the source slot.
 */
#define WK_LOG_MODULE "transport"
#include "ctl_transport.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/types.h>
#include <time.h>

#include "wk_log.h"
#include "wk_proto.h"
#include "wk_sha256.h"

#define CTL_NCCL_INIT_TIMEOUT_MS 30000u     /* default communicator setup deadline */
#define CTL_NCCL_TRANSFER_TIMEOUT_MS 60000u /* default send/receive deadline */
#define CTL_NCCL_GRACE_MS 5000u             /* the controller waits this much past a worker deadline */
#define CTL_NCCL_SHORT_MS 10000u            /* id and commit/abort calls */
#define CTL_TRANSPORT_WORKERS_MAX 256u      /* worker records scanned for a lookup */

const char *
ctl_transport_kind_name(ctl_transport_kind k)
{
    return k == CTL_TRANSPORT_KIND_NCCL ? "nccl" : "nng";
}

const char *
ctl_nccl_phase_name(ctl_nccl_phase p)
{
    static const char *const names[] = {"id",     "prepare", "transfer", "verify",
                                        "commit", "abort",   "done",     "failed"};
    return (unsigned)p < sizeof(names) / sizeof(names[0]) ? names[p] : "unknown";
}

static bool
ctl_transport_str_set(const char *s)
{
    return s != NULL && s[0] != '\0';
}

static const char *
ctl_transport_str(const char *s)
{
    return s != NULL ? s : "";
}

void
ctl_transport_choose(const ctl_transport_peer *src, const ctl_transport_peer *dst,
                     bool nccl_net, ctl_transport_choice *out)
{
    out->kind = CTL_TRANSPORT_KIND_NNG;
    if (src->hybrid || dst->hybrid) {
        /* A slot's image grows with its context and lives partly in KV pages: over NNG. */
        snprintf(out->reason, sizeof(out->reason), "hybrid state (KV pages)");
        return;
    }
    bool src_cuda = strcmp(ctl_transport_str(src->backend), "cuda") == 0;
    bool dst_cuda = strcmp(ctl_transport_str(dst->backend), "cuda") == 0;
    if (!src_cuda || !dst_cuda) {
        if (!src_cuda && !dst_cuda)
            snprintf(out->reason, sizeof(out->reason), "cpu workers");
        else
            snprintf(out->reason, sizeof(out->reason), "cpu worker %.64s",
                     ctl_transport_str(!src_cuda ? src->worker : dst->worker));
        return;
    }
    if (!src->nccl || !dst->nccl) {
        snprintf(out->reason, sizeof(out->reason), "NCCL not available on %.64s",
                 ctl_transport_str(!src->nccl ? src->worker : dst->worker));
        return;
    }
    /* Same device: by UUID when both know it, else PCI bus id, else host + ordinal. */
    bool same_host = strcmp(ctl_transport_str(src->hostname), ctl_transport_str(dst->hostname)) ==
                     0;
    bool same_gpu;
    if (ctl_transport_str_set(src->device_uuid) && ctl_transport_str_set(dst->device_uuid))
        same_gpu = strcmp(src->device_uuid, dst->device_uuid) == 0;
    else if (same_host && ctl_transport_str_set(src->pci_bus_id) &&
             ctl_transport_str_set(dst->pci_bus_id))
        same_gpu = strcmp(src->pci_bus_id, dst->pci_bus_id) == 0;
    else
        same_gpu = same_host && src->device_index == dst->device_index;
    if (same_gpu) {
        snprintf(out->reason, sizeof(out->reason), "same GPU (%.64s)",
                 ctl_transport_str_set(src->device_uuid) ? src->device_uuid : "one device");
        return;
    }
    if (!same_host) {
        if (!nccl_net) {
            snprintf(out->reason, sizeof(out->reason), "different hosts without --nccl-net");
            return;
        }
        out->kind = CTL_TRANSPORT_KIND_NCCL;
        snprintf(out->reason, sizeof(out->reason), "different hosts with --nccl-net");
        return;
    }
    out->kind = CTL_TRANSPORT_KIND_NCCL;
    snprintf(out->reason, sizeof(out->reason), "GPU to GPU on %.64s (device %u -> %u)",
             ctl_transport_str_set(src->hostname) ? src->hostname : "one host",
             src->device_index, dst->device_index);
}

/* One worker call, run on a helper thread or the caller's. */
typedef struct ctl_nccl_call {
    ctl_pool *pool;      /* borrowed */
    const char *worker;  /* worker id, borrowed */
    wk_msg *req;         /* request, borrowed */
    uint32_t timeout_ms; /* reply deadline */
    wk_msg *reply;       /* owned reply on success */
    wk_err err;          /* result */
    wk_diag d;           /* detail on failure */
} ctl_nccl_call;

static void *
ctl_nccl_call_main(void *arg)
{
    ctl_nccl_call *c = arg;
    c->err = ctl_pool_call(c->pool, c->worker, c->req, c->timeout_ms, &c->reply, &c->d);
    return NULL;
}

/*
 * Runs a and b at once (a on a helper thread): a source-side and a
 * destination-side step that each block until the other side joins.
 */
static void
ctl_nccl_pair(ctl_nccl_call *a, ctl_nccl_call *b)
{
    pthread_t thr;
    bool threaded = pthread_create(&thr, NULL, ctl_nccl_call_main, a) == 0;
    if (!threaded) {
        a->err = wk_diag_set(&a->d, WK_ENOMEM, "cannot start a thread for worker %s", a->worker);
        b->err = wk_diag_set(&b->d, WK_ENOMEM, "not sent: no thread for the peer's side");
        return;
    }
    ctl_nccl_call_main(b);
    pthread_join(thr, NULL);
}

static void
ctl_nccl_call_fini(ctl_nccl_call *c)
{
    wk_proto_free(c->reply);
    c->reply = NULL;
}

/* The first failure of a (source) and b (destination), into d. */
static wk_err
ctl_nccl_pair_err(const ctl_nccl_call *a, const ctl_nccl_call *b, ctl_nccl_phase p, wk_diag *d)
{
    const ctl_nccl_call *f = a->err != WK_OK ? a : b;
    /* A dead peer makes the survivor time out too: name the dead one first. */
    if (a->err != WK_OK && b->err != WK_OK &&
        (b->err == WK_EUNAVAIL || b->err == WK_ENOENT) && a->err != WK_EUNAVAIL &&
        a->err != WK_ENOENT)
        f = b;
    return wk_diag_set(d, f->err, "nccl %s on %s %s: %s", ctl_nccl_phase_name(p),
                       f == a ? "source" : "destination", f->worker, f->d.msg);
}

/*
 * A fresh migration id: the wall clock in ns and 64 random bits, so two
 * migrations (of this controller or another) never share one without a
 * process-wide counter. Without getrandom() the bits come from the caller's
 * stack address and thread, which still differ between concurrent calls.
 */
static void
ctl_nccl_new_id(char *out, size_t cap)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd))
        rnd = (uint64_t)(uintptr_t)&ts ^ (uint64_t)pthread_self();
    snprintf(out, cap, "mig-%llx-%llu", (unsigned long long)ts.tv_sec * 1000000000ull +
                                            (unsigned long long)ts.tv_nsec,
             (unsigned long long)rnd);
}

static bool
ctl_nccl_hex_ok(const char *s)
{
    if (s == NULL || strlen(s) != WK_SHA256_HEX_LEN - 1)
        return false;
    return strspn(s, "0123456789abcdef") == WK_SHA256_HEX_LEN - 1;
}

static void
ctl_nccl_commit_req(wk_msg *m, Wkvm__MigrateCommit *mc, const char *id, bool abort,
                    const char *checksum)
{
    wkvm__migrate_commit__init(mc);
    mc->migration_id = (char *)id;
    mc->abort = abort;
    mc->checksum = (char *)(checksum ? checksum : "");
    wkvm__envelope__init(m);
    m->kind = WKVM__KIND__MIGRATE_COMMIT;
    m->payload_case = WKVM__ENVELOPE__PAYLOAD_MIGRATE_COMMIT;
    m->migrate_commit = mc;
}

wk_err
ctl_transport_nccl_run(ctl_pool *pool, const ctl_slot_ref *src, const ctl_slot_ref *dst,
                       uint64_t state_bytes, const ctl_transport_opts *o,
                       ctl_nccl_phase *failed_phase, wk_diag *d)
{
    uint32_t init_ms = o && o->init_timeout_ms ? o->init_timeout_ms : CTL_NCCL_INIT_TIMEOUT_MS;
    uint32_t xfer_ms = o && o->transfer_timeout_ms ? o->transfer_timeout_ms
                                                   : CTL_NCCL_TRANSFER_TIMEOUT_MS;
    if (init_ms > WK_PROTO_NCCL_TIMEOUT_MAX)
        init_ms = WK_PROTO_NCCL_TIMEOUT_MAX;
    if (xfer_ms > WK_PROTO_NCCL_TIMEOUT_MAX)
        xfer_ms = WK_PROTO_NCCL_TIMEOUT_MAX;
    uint32_t chunk = o ? o->chunk_bytes : 0;
    char mig[64];
    ctl_nccl_new_id(mig, sizeof(mig));
    uint8_t uid[WK_PROTO_NCCL_ID_LEN];
    char src_hex[WK_SHA256_HEX_LEN] = "", dst_hex[WK_SHA256_HEX_LEN] = "";
    ctl_nccl_phase phase = CTL_NCCL_PHASE_ID, failed = CTL_NCCL_PHASE_DONE;
    wk_err err = WK_OK;

    while (phase != CTL_NCCL_PHASE_DONE && phase != CTL_NCCL_PHASE_FAILED) {
        switch (phase) {
        case CTL_NCCL_PHASE_ID: {
            Wkvm__MigrateNcclId ni = WKVM__MIGRATE_NCCL_ID__INIT;
            ni.migration_id = mig;
            wk_msg req = WKVM__ENVELOPE__INIT;
            req.kind = WKVM__KIND__MIGRATE_NCCL_ID;
            req.payload_case = WKVM__ENVELOPE__PAYLOAD_MIGRATE_NCCL_ID;
            req.migrate_nccl_id = &ni;
            ctl_nccl_call c = {.pool = pool, .worker = src->worker, .req = &req,
                               .timeout_ms = CTL_NCCL_SHORT_MS};
            ctl_nccl_call_main(&c);
            if (c.err == WK_OK && (c.reply->kind != WKVM__KIND__MIGRATE_NCCL_ID_REPLY ||
                                   c.reply->migrate_nccl_id == NULL ||
                                   c.reply->migrate_nccl_id->unique_id.len !=
                                       WK_PROTO_NCCL_ID_LEN))
                c.err = wk_diag_set(&c.d, WK_EPROTO, "no 128-byte ncclUniqueId in the reply");
            if (c.err == WK_OK) {
                memcpy(uid, c.reply->migrate_nccl_id->unique_id.data, WK_PROTO_NCCL_ID_LEN);
                phase = CTL_NCCL_PHASE_PREPARE;
            } else {
                /* Nothing was set up yet: no abort needed. */
                err = wk_diag_set(d, c.err, "nccl id on source %s: %s", src->worker, c.d.msg);
                failed = phase;
                phase = CTL_NCCL_PHASE_FAILED;
            }
            ctl_nccl_call_fini(&c);
            break;
        }
        case CTL_NCCL_PHASE_PREPARE: {
            Wkvm__MigratePrepare ps = WKVM__MIGRATE_PREPARE__INIT, pr;
            ps.migration_id = mig;
            ps.nccl_unique_id.data = uid;
            ps.nccl_unique_id.len = WK_PROTO_NCCL_ID_LEN;
            ps.state_bytes = state_bytes;
            ps.chunk_bytes = chunk;
            ps.timeout_ms = init_ms;
            pr = ps;
            ps.role = "send";
            ps.slot = src->slot;
            ps.peer_worker = (char *)dst->worker;
            pr.role = "recv";
            pr.slot = dst->slot;
            pr.peer_worker = (char *)src->worker;
            wk_msg qs = WKVM__ENVELOPE__INIT, qr = WKVM__ENVELOPE__INIT;
            qs.kind = qr.kind = WKVM__KIND__MIGRATE_PREPARE;
            qs.payload_case = qr.payload_case = WKVM__ENVELOPE__PAYLOAD_MIGRATE_PREPARE;
            qs.migrate_prepare = &ps;
            qr.migrate_prepare = &pr;
            ctl_nccl_call a = {.pool = pool, .worker = src->worker, .req = &qs,
                               .timeout_ms = init_ms + CTL_NCCL_GRACE_MS};
            ctl_nccl_call b = {.pool = pool, .worker = dst->worker, .req = &qr,
                               .timeout_ms = init_ms + CTL_NCCL_GRACE_MS};
            ctl_nccl_pair(&a, &b);
            if (a.err == WK_OK && b.err == WK_OK) {
                phase = CTL_NCCL_PHASE_TRANSFER;
            } else {
                err = ctl_nccl_pair_err(&a, &b, phase, d);
                failed = phase;
                phase = CTL_NCCL_PHASE_ABORT;
            }
            ctl_nccl_call_fini(&a);
            ctl_nccl_call_fini(&b);
            break;
        }
        case CTL_NCCL_PHASE_TRANSFER: {
            Wkvm__MigrateSend ms = WKVM__MIGRATE_SEND__INIT;
            Wkvm__MigrateRecv mr = WKVM__MIGRATE_RECV__INIT;
            ms.migration_id = mig;
            ms.slot = src->slot;
            mr.migration_id = mig;
            mr.slot = dst->slot;
            wk_msg qs = WKVM__ENVELOPE__INIT, qr = WKVM__ENVELOPE__INIT;
            qs.kind = WKVM__KIND__MIGRATE_SEND;
            qs.payload_case = WKVM__ENVELOPE__PAYLOAD_MIGRATE_SEND;
            qs.migrate_send = &ms;
            qr.kind = WKVM__KIND__MIGRATE_RECV;
            qr.payload_case = WKVM__ENVELOPE__PAYLOAD_MIGRATE_RECV;
            qr.migrate_recv = &mr;
            ctl_nccl_call a = {.pool = pool, .worker = src->worker, .req = &qs,
                               .timeout_ms = xfer_ms + CTL_NCCL_GRACE_MS};
            ctl_nccl_call b = {.pool = pool, .worker = dst->worker, .req = &qr,
                               .timeout_ms = xfer_ms + CTL_NCCL_GRACE_MS};
            ctl_nccl_pair(&a, &b);
            if (a.err == WK_OK && b.err == WK_OK) {
                snprintf(src_hex, sizeof(src_hex), "%s", a.reply->detail);
                snprintf(dst_hex, sizeof(dst_hex), "%s", b.reply->detail);
                phase = CTL_NCCL_PHASE_VERIFY;
            } else {
                err = ctl_nccl_pair_err(&a, &b, phase, d);
                failed = phase;
                phase = CTL_NCCL_PHASE_ABORT;
            }
            ctl_nccl_call_fini(&a);
            ctl_nccl_call_fini(&b);
            break;
        }
        case CTL_NCCL_PHASE_VERIFY:
            if (!ctl_nccl_hex_ok(src_hex) || !ctl_nccl_hex_ok(dst_hex)) {
                err = wk_diag_set(d, WK_EPROTO, "nccl verify: a worker sent no SHA-256 "
                                  "(source \"%.16s\", destination \"%.16s\")", src_hex, dst_hex);
                failed = phase;
                phase = CTL_NCCL_PHASE_ABORT;
            } else if (strcmp(src_hex, dst_hex) != 0) {
                err = wk_diag_set(d, WK_ECORRUPT, "nccl verify: destination checksum %.16s... "
                                  "differs from the source's %.16s...", dst_hex, src_hex);
                failed = phase;
                phase = CTL_NCCL_PHASE_ABORT;
            } else {
                phase = CTL_NCCL_PHASE_COMMIT;
            }
            break;
        case CTL_NCCL_PHASE_COMMIT:
        case CTL_NCCL_PHASE_ABORT: {
            bool abort = phase == CTL_NCCL_PHASE_ABORT;
            Wkvm__MigrateCommit cs, cr;
            wk_msg qs, qr;
            ctl_nccl_commit_req(&qs, &cs, mig, abort, abort ? "" : src_hex);
            ctl_nccl_commit_req(&qr, &cr, mig, abort, abort ? "" : dst_hex);
            ctl_nccl_call a = {.pool = pool, .worker = src->worker, .req = &qs,
                               .timeout_ms = CTL_NCCL_SHORT_MS};
            ctl_nccl_call b = {.pool = pool, .worker = dst->worker, .req = &qr,
                               .timeout_ms = CTL_NCCL_SHORT_MS};
            ctl_nccl_pair(&a, &b);
            /*
             * The bytes are verified before COMMIT; a worker that cannot tear
             * its communicator down cleanly does not undo that. An abort to a
             * dead worker cannot be answered; its communicator died with it.
             */
            if (a.err != WK_OK || b.err != WK_OK)
                wk_log_warn("nccl %s not confirmed migration=%s src=%s:%u dst=%s:%u%s%s%s%s",
                            abort ? "abort" : "commit", mig, src->worker, src->slot,
                            dst->worker, dst->slot, a.err ? " source: " : "",
                            a.err ? a.d.msg : "", b.err ? " destination: " : "",
                            b.err ? b.d.msg : "");
            ctl_nccl_call_fini(&a);
            ctl_nccl_call_fini(&b);
            phase = abort ? CTL_NCCL_PHASE_FAILED : CTL_NCCL_PHASE_DONE;
            break;
        }
        default:
            err = wk_diag_set(d, WK_ESTATE, "nccl phase machine in phase %d", (int)phase);
            failed = phase;
            phase = CTL_NCCL_PHASE_FAILED;
        }
    }
    if (failed_phase != NULL)
        *failed_phase = failed;
    if (err == WK_OK)
        wk_log_debug("nccl transfer committed migration=%s src=%s:%u dst=%s:%u bytes=%llu", mig,
                     src->worker, src->slot, dst->worker, dst->slot,
                     (unsigned long long)state_bytes);
    return err;
}

/* The pool's record of worker id into *v; false when it is not registered. */
static bool
ctl_transport_view(ctl_pool *pool, const char *id, ctl_worker_view *v)
{
    ctl_worker_view *all = calloc(CTL_TRANSPORT_WORKERS_MAX, sizeof(*all));
    if (all == NULL)
        return false;
    size_t n = ctl_pool_list(pool, all, CTL_TRANSPORT_WORKERS_MAX);
    bool found = false;
    for (size_t i = 0; i < n && i < CTL_TRANSPORT_WORKERS_MAX; i++) {
        if (strcmp(all[i].id, id) == 0) {
            *v = all[i];
            found = true;
            break;
        }
    }
    free(all);
    return found;
}

static void
ctl_transport_peer_of(const ctl_worker_view *v, ctl_transport_peer *p)
{
    p->worker = v->id;
    p->backend = v->backend;
    p->hostname = v->hostname;
    p->device_index = v->device_index;
    p->device_uuid = v->device_uuid;
    p->pci_bus_id = v->pci_bus_id;
    p->nccl = v->nccl;
    p->hybrid = v->kv_token_bytes > 0;
}

wk_err
ctl_transport_move(ctl_pool *pool, ctl_vm *vm, const ctl_slot_ref *src, const ctl_slot_ref *dst,
                   const ctl_transport_opts *o, ctl_transport_report *rep, wk_diag *d)
{
    memset(rep, 0, sizeof(*rep));
    rep->failed_phase = CTL_NCCL_PHASE_DONE;
    ctl_worker_view *vs = calloc(2, sizeof(*vs));
    ctl_transport_choice ch = {.kind = CTL_TRANSPORT_KIND_NNG, .reason = "worker not registered"};
    uint64_t state_bytes = 0;
    if (vs != NULL && ctl_transport_view(pool, src->worker, &vs[0]) &&
        ctl_transport_view(pool, dst->worker, &vs[1])) {
        ctl_transport_peer ps, pd;
        ctl_transport_peer_of(&vs[0], &ps);
        ctl_transport_peer_of(&vs[1], &pd);
        ctl_transport_choose(&ps, &pd, o != NULL && o->nccl_net, &ch);
        state_bytes = vs[0].state_bytes;
        if (ch.kind == CTL_TRANSPORT_KIND_NCCL && (state_bytes == 0 ||
                                                   vs[1].state_bytes != state_bytes)) {
            ch.kind = CTL_TRANSPORT_KIND_NNG;
            snprintf(ch.reason, sizeof(ch.reason), "slot sizes unknown or different");
        }
    }
    free(vs);
    rep->kind = ch.kind;
    snprintf(rep->reason, sizeof(rep->reason), "%s", ch.reason);
    wk_log_info("migration transport=%s reason=\"%s\" src=%s:%u dst=%s:%u",
                ctl_transport_kind_name(ch.kind), ch.reason, src->worker, src->slot, dst->worker,
                dst->slot);
    if (ch.kind == CTL_TRANSPORT_KIND_NCCL) {
        wk_diag nd = {{0}};
        ctl_nccl_phase failed = CTL_NCCL_PHASE_DONE;
        wk_err err = ctl_transport_nccl_run(pool, src, dst, state_bytes, o, &failed, &nd);
        if (err == WK_OK) {
            rep->bytes = state_bytes;
            return WK_OK;
        }
        rep->failed_phase = failed;
        rep->kind = CTL_TRANSPORT_KIND_NNG;
        snprintf(rep->fallback, sizeof(rep->fallback), "%s", nd.msg);
        wk_log_warn("nccl transfer failed, falling back to nng src=%s:%u dst=%s:%u phase=%s "
                    "error=\"%s\"", src->worker, src->slot, dst->worker, dst->slot,
                    ctl_nccl_phase_name(failed), nd.msg);
    }
    return ctl_vm_transfer(vm, src, dst, &rep->bytes, d);
}
