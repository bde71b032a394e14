/*
 * Unit test of migration transfers against scripted fake workers over a
 * real NNG ipc socket.
 *
 * NNG path: ctl_vm_transfer() reads the source, writes the destination and
 * commits only when the destination's checksum (MIGRATE_RECV) matches the
 * source bytes. A worker that reports a different checksum (a corrupted
 * chunk) makes it abort with WK_ECORRUPT.
 *
 * NCCL path (ctl_transport): the transport choice as a pure function, and
 * the phase machine against two fake "cuda" workers whose NCCL is a shared
 * in-process wire: success (the unique id relayed byte-exact, no bytes
 * through the controller), an init failure (abort both, NNG fallback), a
 * checksum mismatch (abort, fallback), and the destination dying
 * mid-transfer (abort; the fallback fails too; the source is untouched).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <nng/nng.h>
#include <nng/protocol/pair1/pair.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl_pool.h"
#include "ctl_transport.h"
#include "ctl_vm.h"
#include "wk_nng.h"
#include "wk_proto.h"
#include "wk_sha256.h"

#define STATE_BYTES (5u << 20) /* more than one 4 MiB chunk */

/* The fake NCCL link between two fake workers: the source's bytes in flight. */
typedef struct wire {
    pthread_mutex_t mu;        /* guards the rest */
    pthread_cond_t cv;         /* signalled on every change */
    uint8_t *bytes;            /* STATE_BYTES, the "sent" copy */
    bool full;                 /* the source has sent */
    bool taken;                /* the destination has received */
} wire;

typedef struct fake {
    const char *id;            /* worker id */
    const char *backend;       /* "cpu" or "cuda" */
    const char *uuid;          /* device uuid for Hello */
    bool nccl;                 /* Hello.nccl */
    nng_socket sock;           /* pair1 client */
    uint8_t *slot[4];          /* fake slot bytes */
    wire *link;                /* shared with the peer fake, NULL = none */
    atomic_bool corrupt;       /* flip a byte of what was written (NNG) */
    atomic_bool corrupt_nccl;  /* flip a byte of what arrived over "NCCL" */
    atomic_bool fail_prepare;  /* answer MIGRATE_PREPARE with WK_ETIMEDOUT */
    atomic_bool die_on_recv;   /* close the socket when a NCCL MIGRATE_RECV arrives */
    atomic_bool stop;          /* exit */
    atomic_int n_nccl_id;      /* MIGRATE_NCCL_ID served */
    atomic_int n_prepare;      /* MIGRATE_PREPARE received */
    atomic_int n_commit;       /* MIGRATE_COMMIT without abort */
    atomic_int n_abort;        /* MIGRATE_COMMIT with abort */
    atomic_int n_slot_read;    /* SLOT_READ served */
    uint8_t made_uid[WK_PROTO_NCCL_ID_LEN]; /* the id this fake generated (as a source) */
    uint8_t got_uid[WK_PROTO_NCCL_ID_LEN];  /* the id MIGRATE_PREPARE carried */
    size_t got_uid_len;        /* its length */
    char prep_role[8];         /* MIGRATE_PREPARE.role */
} fake;

/* Waits on w->cv until pred or ms pass; returns pred. Called with w->mu held. */
static bool
wire_wait(wire *w, bool *pred, int ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    until.tv_sec += ms / 1000 + until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    while (!*pred)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &until) != 0)
            break;
    return *pred;
}

static void
fake_send(fake *f, const wk_msg *m)
{
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(wk_proto_encode(m, &buf, &len), WK_OK);
    assert_int_equal(nng_send(f->sock, buf, len, 0), 0);
    free(buf);
}

static void *
fake_main(void *arg)
{
    fake *f = arg;
    Wkvm__Hello h = WKVM__HELLO__INIT;
    Wkvm__ModelInfo mi = WKVM__MODEL_INFO__INIT;
    mi.family = "rwkv7";
    mi.state_bytes = STATE_BYTES;
    mi.n_slots = 4;
    h.worker_id = (char *)f->id;
    h.backend = (char *)f->backend;
    h.device = "test";
    h.hostname = "testhost";
    h.device_uuid = (char *)f->uuid;
    h.nccl = f->nccl;
    h.protocol_version = WK_PROTO_VERSION;
    h.model_loaded = true;
    h.model = &mi;
    wk_msg hello = WKVM__ENVELOPE__INIT;
    hello.kind = WKVM__KIND__HELLO;
    hello.payload_case = WKVM__ENVELOPE__PAYLOAD_HELLO;
    hello.hello = &h;
    fake_send(f, &hello);
    while (!atomic_load(&f->stop)) {
        void *buf = NULL;
        size_t len = 0;
        if (nng_recv(f->sock, &buf, &len, NNG_FLAG_ALLOC) != 0)
            continue;
        wk_msg *m = NULL;
        wk_err err = wk_proto_decode(buf, len, &m, NULL);
        nng_free(buf, len);
        if (err != WK_OK)
            continue;
        wk_msg r = WKVM__ENVELOPE__INIT;
        r.id = m->id;
        r.kind = WKVM__KIND__ACK;
        Wkvm__SlotData sd = WKVM__SLOT_DATA__INIT;
        Wkvm__StatsReply st = WKVM__STATS_REPLY__INIT;
        Wkvm__MigrateNcclId ni = WKVM__MIGRATE_NCCL_ID__INIT;
        char hex[WK_SHA256_HEX_LEN];
        if (m->kind == WKVM__KIND__MIGRATE_NCCL_ID) {
            atomic_fetch_add(&f->n_nccl_id, 1);
            for (size_t i = 0; i < WK_PROTO_NCCL_ID_LEN; i++)
                f->made_uid[i] = (uint8_t)rand(); /* includes zero bytes */
            f->made_uid[5] = 0;
            ni.migration_id = m->migrate_nccl_id->migration_id;
            ni.unique_id.data = f->made_uid;
            ni.unique_id.len = WK_PROTO_NCCL_ID_LEN;
            r.kind = WKVM__KIND__MIGRATE_NCCL_ID_REPLY;
            r.payload_case = WKVM__ENVELOPE__PAYLOAD_MIGRATE_NCCL_ID;
            r.migrate_nccl_id = &ni;
        } else if (m->kind == WKVM__KIND__MIGRATE_PREPARE) {
            const Wkvm__MigratePrepare *mp = m->migrate_prepare;
            atomic_fetch_add(&f->n_prepare, 1);
            f->got_uid_len = mp->nccl_unique_id.len;
            memcpy(f->got_uid, mp->nccl_unique_id.data,
                   mp->nccl_unique_id.len <= WK_PROTO_NCCL_ID_LEN ? mp->nccl_unique_id.len : 0);
            snprintf(f->prep_role, sizeof(f->prep_role), "%s", mp->role);
            if (atomic_load(&f->fail_prepare)) {
                r.status = WK_ETIMEDOUT;
                r.detail = "ncclCommInitRank: the peer did not join";
            } else if (mp->state_bytes != STATE_BYTES) {
                r.status = WK_EINVAL;
                r.detail = "state_bytes";
            } else if (f->link != NULL && strcmp(mp->role, "send") == 0) {
                pthread_mutex_lock(&f->link->mu);
                f->link->full = f->link->taken = false;
                pthread_mutex_unlock(&f->link->mu);
            }
        } else if (m->kind == WKVM__KIND__MIGRATE_SEND) {
            /* "ncclSend": put the slot on the wire, wait for the peer to take it. */
            const Wkvm__MigrateSend *ms = m->migrate_send;
            wk_sha256_hex(f->slot[ms->slot], STATE_BYTES, hex);
            pthread_mutex_lock(&f->link->mu);
            memcpy(f->link->bytes, f->slot[ms->slot], STATE_BYTES);
            f->link->full = true;
            pthread_cond_broadcast(&f->link->cv);
            bool ok = wire_wait(f->link, &f->link->taken, 500);
            pthread_mutex_unlock(&f->link->mu);
            if (ok) {
                r.detail = hex;
            } else {
                r.status = WK_ETIMEDOUT;
                r.detail = "ncclSend did not complete (communicator aborted)";
            }
        } else if (m->kind == WKVM__KIND__MIGRATE_RECV &&
                   m->migrate_recv->migration_id[0] != '\0') {
            /* "ncclRecv" then hash. */
            if (atomic_load(&f->die_on_recv)) {
                wk_proto_free(m);
                (void)wk_nng_close(f->sock, 2000); /* the controller sees the pipe close */
                return NULL;
            }
            uint32_t slot = m->migrate_recv->slot;
            pthread_mutex_lock(&f->link->mu);
            bool ok = wire_wait(f->link, &f->link->full, 2000);
            if (ok) {
                memcpy(f->slot[slot], f->link->bytes, STATE_BYTES);
                f->link->taken = true;
                pthread_cond_broadcast(&f->link->cv);
            }
            pthread_mutex_unlock(&f->link->mu);
            if (ok && atomic_load(&f->corrupt_nccl))
                f->slot[slot][4242] ^= 0x01;
            wk_sha256_hex(f->slot[slot], STATE_BYTES, hex);
            if (ok) {
                r.detail = hex;
            } else {
                r.status = WK_ETIMEDOUT;
                r.detail = "ncclRecv did not complete";
            }
        } else if (m->kind == WKVM__KIND__MIGRATE_COMMIT) {
            atomic_fetch_add(m->migrate_commit->abort ? &f->n_abort : &f->n_commit, 1);
        } else if (m->kind == WKVM__KIND__SLOT_READ) {
            atomic_fetch_add(&f->n_slot_read, 1);
            const Wkvm__SlotRead *rd = m->slot_read;
            size_t n = STATE_BYTES - rd->offset < rd->length ? STATE_BYTES - rd->offset
                                                              : rd->length;
            sd.slot = rd->slot;
            sd.offset = rd->offset;
            sd.total_bytes = STATE_BYTES;
            sd.data.data = f->slot[rd->slot] + rd->offset;
            sd.data.len = n;
            r.kind = WKVM__KIND__SLOT_DATA;
            r.payload_case = WKVM__ENVELOPE__PAYLOAD_SLOT_DATA;
            r.slot_data = &sd;
        } else if (m->kind == WKVM__KIND__SLOT_WRITE) {
            const Wkvm__SlotWrite *wr = m->slot_write;
            memcpy(f->slot[wr->slot] + wr->offset, wr->data.data, wr->data.len);
            if (atomic_load(&f->corrupt) && wr->offset == 0)
                f->slot[wr->slot][17] ^= 0x40; /* a chunk arrives damaged */
        } else if (m->kind == WKVM__KIND__MIGRATE_RECV) {
            wk_sha256_hex(f->slot[m->migrate_recv->slot], STATE_BYTES, hex);
            r.detail = hex;
        } else if (m->kind == WKVM__KIND__STATS) {
            r.kind = WKVM__KIND__STATS_REPLY;
            r.payload_case = WKVM__ENVELOPE__PAYLOAD_STATS_REPLY;
            r.stats_reply = &st;
        }
        fake_send(f, &r);
        wk_proto_free(m);
    }
    return NULL;
}

static void
test_verify_phase(void **state)
{
    (void)state;
    char url[128];
    snprintf(url, sizeof(url), "ipc:///tmp/wkvm-migrate-test-%d.ipc", (int)getpid());
    ctl_pool_config pc = {.listen_url = url, .slots = 3, .heartbeat_ms = 1000};
    ctl_pool *pool = NULL;
    wk_diag d = {{0}};
    assert_int_equal(ctl_pool_new(&pc, &pool, &d), WK_OK);
    fake f;
    memset(&f, 0, sizeof(f));
    f.id = "fake";
    f.backend = "cpu";
    f.uuid = "";
    for (int i = 0; i < 4; i++)
        f.slot[i] = calloc(STATE_BYTES, 1);
    for (size_t i = 0; i < STATE_BYTES; i++)
        f.slot[1][i] = (uint8_t)(i * 2654435761u >> 13);
    assert_int_equal(nng_pair1_open(&f.sock), 0);
    nng_socket_set_size(f.sock, NNG_OPT_RECVMAXSZ, WK_PROTO_MSG_MAX);
    nng_socket_set_ms(f.sock, NNG_OPT_RECVTIMEO, 100);
    assert_int_equal(nng_dial(f.sock, url, NULL, 0), 0);
    pthread_t thr;
    assert_int_equal(pthread_create(&thr, NULL, fake_main, &f), 0);
    for (int i = 0; i < 100 && ctl_pool_ready_count(pool) == 0; i++) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(ctl_pool_ready_count(pool), 1);

    ctl_vm *vm = NULL;
    assert_int_equal(ctl_vm_new(pool, NULL, NULL, &vm, &d), WK_OK);
    ctl_slot_ref src = {"fake", 1, 1}, dst = {"fake", 2, 1}, dst3 = {"fake", 3, 1};
    uint64_t moved = 0;
    /* A clean transfer commits: the destination holds the source bytes. */
    assert_int_equal(ctl_vm_transfer(vm, &src, &dst, &moved, &d), WK_OK);
    assert_int_equal(moved, STATE_BYTES);
    assert_memory_equal(f.slot[1], f.slot[2], STATE_BYTES);
    /* A damaged chunk: the destination's checksum differs, the transfer aborts. */
    atomic_store(&f.corrupt, true);
    moved = 0;
    assert_int_equal(ctl_vm_transfer(vm, &src, &dst3, &moved, &d), WK_ECORRUPT);
    assert_non_null(strstr(d.msg, "checksum"));
    assert_int_equal(moved, 0);
    /* The source is untouched by either. */
    for (size_t i = 0; i < STATE_BYTES; i += 4099)
        assert_int_equal(f.slot[1][i], (uint8_t)(i * 2654435761u >> 13));

    ctl_pool_stop(pool); /* no heartbeat in flight as the fake's link closes */
    atomic_store(&f.stop, true);
    pthread_join(thr, NULL);
    (void)wk_nng_close(f.sock, 2000);
    ctl_vm_free(vm);
    ctl_pool_free(pool);
    for (int i = 0; i < 4; i++)
        free(f.slot[i]);
}

/* ---- the transport choice (pure) ---- */

static void
test_transport_choose(void **state)
{
    (void)state;
    ctl_transport_peer a = {"g0", "cuda", "h1", 0, "GPU-aaaa", "0000:01:00.0", true, false};
    ctl_transport_peer b = {"g1", "cuda", "h1", 1, "GPU-bbbb", "0000:02:00.0", true, false};
    ctl_transport_choice c;
    ctl_transport_choose(&a, &b, false, &c);
    assert_int_equal(c.kind, CTL_TRANSPORT_KIND_NCCL);
    assert_non_null(strstr(c.reason, "GPU to GPU"));
    /* Hybrid models (slots with KV pages) always move over NNG. */
    ctl_transport_peer ha = a, hb = b;
    ha.hybrid = hb.hybrid = true;
    ctl_transport_choose(&ha, &hb, true, &c);
    assert_int_equal(c.kind, CTL_TRANSPORT_KIND_NNG);
    assert_string_equal(c.reason, "hybrid state (KV pages)");
    /* Two workers on one GPU: by UUID, even with different ordinals (CUDA_VISIBLE_DEVICES). */
    ctl_transport_peer s = b;
    s.device_uuid = "GPU-aaaa";
    ctl_transport_choose(&a, &s, true, &c);
    assert_int_equal(c.kind, CTL_TRANSPORT_KIND_NNG);
    assert_non_null(strstr(c.reason, "same GPU"));
    /* No UUIDs: PCI bus id, then host + ordinal. */
    ctl_transport_peer nu_a = a, nu_b = b;
    nu_a.device_uuid = nu_b.device_uuid = "";
    nu_b.pci_bus_id = "0000:01:00.0";
    ctl_transport_choose(&nu_a, &nu_b, false, &c);
    assert_int_equal(c.kind, CTL_TRANSPORT_KIND_NNG);
    nu_a.pci_bus_id = nu_b.pci_bus_id = "";
    nu_b.device_index = 0;
    ctl_transport_choose(&nu_a, &nu_b, false, &c);
    assert_int_equal(c.kind, CTL_TRANSPORT_KIND_NNG);
    assert_non_null(strstr(c.reason, "same GPU"));
    nu_b.device_index = 1;
    ctl_transport_choose(&nu_a, &nu_b, false, &c);
    assert_int_equal(c.kind, CTL_TRANSPORT_KIND_NCCL);
    /* CPU workers, one or both. */
    ctl_transport_peer cpu = {"c0", "cpu", "h1", 0, "", "", false, false};
    ctl_transport_choose(&cpu, &b, true, &c);
    assert_int_equal(c.kind, CTL_TRANSPORT_KIND_NNG);
    assert_string_equal(c.reason, "cpu worker c0");
    ctl_transport_choose(&a, &cpu, true, &c);
    assert_string_equal(c.reason, "cpu worker c0");
    ctl_transport_choose(&cpu, &cpu, true, &c);
    assert_string_equal(c.reason, "cpu workers");
    /* A CUDA worker without NCCL (built without it, or no device). */
    ctl_transport_peer nonccl = b;
    nonccl.nccl = false;
    ctl_transport_choose(&a, &nonccl, true, &c);
    assert_int_equal(c.kind, CTL_TRANSPORT_KIND_NNG);
    assert_string_equal(c.reason, "NCCL not available on g1");
    /* Different hosts: only with --nccl-net. */
    ctl_transport_peer far = b;
    far.hostname = "h2";
    ctl_transport_choose(&a, &far, false, &c);
    assert_int_equal(c.kind, CTL_TRANSPORT_KIND_NNG);
    assert_string_equal(c.reason, "different hosts without --nccl-net");
    ctl_transport_choose(&a, &far, true, &c);
    assert_int_equal(c.kind, CTL_TRANSPORT_KIND_NCCL);
    assert_string_equal(c.reason, "different hosts with --nccl-net");
    /* NULL strings are tolerated (treated as ""). */
    ctl_transport_peer empty = {NULL, NULL, NULL, 0, NULL, NULL, false, false};
    ctl_transport_choose(&empty, &empty, false, &c);
    assert_int_equal(c.kind, CTL_TRANSPORT_KIND_NNG);
    assert_string_equal(ctl_transport_kind_name(CTL_TRANSPORT_KIND_NCCL), "nccl");
    assert_string_equal(ctl_nccl_phase_name(CTL_NCCL_PHASE_VERIFY), "verify");
}

/* ---- the NCCL phase machine against two scripted "cuda" workers ---- */

typedef struct pair_env {
    char url[128];             /* pool listen URL */
    ctl_pool *pool;            /* the controller's pool */
    ctl_vm *vm;                /* for the NNG fallback */
    wire link;                 /* the fake NCCL link */
    fake src, dst;             /* the two workers */
    pthread_t thr[2];          /* their threads */
} pair_env;

static void
fake_start(pair_env *e, fake *f, const char *id, const char *uuid)
{
    f->id = id;
    f->backend = "cuda";
    f->uuid = uuid;
    f->nccl = true;
    f->link = &e->link;
    for (int i = 0; i < 4; i++)
        f->slot[i] = calloc(STATE_BYTES, 1);
    assert_int_equal(nng_pair1_open(&f->sock), 0);
    nng_socket_set_size(f->sock, NNG_OPT_RECVMAXSZ, WK_PROTO_MSG_MAX);
    nng_socket_set_ms(f->sock, NNG_OPT_RECVTIMEO, 100);
    assert_int_equal(nng_dial(f->sock, e->url, NULL, 0), 0);
}

static pair_env *
pair_up(void)
{
    pair_env *e = calloc(1, sizeof(*e));
    assert_non_null(e);
    static int seq;
    snprintf(e->url, sizeof(e->url), "ipc:///tmp/wkvm-migrate-nccl-%d-%d.ipc", (int)getpid(),
             ++seq);
    ctl_pool_config pc = {.listen_url = e->url, .slots = 3, .heartbeat_ms = 1000};
    wk_diag d = {{0}};
    assert_int_equal(ctl_pool_new(&pc, &e->pool, &d), WK_OK);
    pthread_mutex_init(&e->link.mu, NULL);
    pthread_cond_init(&e->link.cv, NULL);
    e->link.bytes = calloc(STATE_BYTES, 1);
    fake_start(e, &e->src, "src", "GPU-0000-src");
    fake_start(e, &e->dst, "dst", "GPU-0001-dst");
    for (size_t i = 0; i < STATE_BYTES; i++)
        e->src.slot[1][i] = (uint8_t)(i * 2246822519u >> 11);
    assert_int_equal(pthread_create(&e->thr[0], NULL, fake_main, &e->src), 0);
    assert_int_equal(pthread_create(&e->thr[1], NULL, fake_main, &e->dst), 0);
    for (int i = 0; i < 200 && ctl_pool_ready_count(e->pool) < 2; i++) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(ctl_pool_ready_count(e->pool), 2);
    assert_int_equal(ctl_vm_new(e->pool, NULL, NULL, &e->vm, &d), WK_OK);
    return e;
}

static void
pair_down(pair_env *e)
{
    ctl_pool_stop(e->pool); /* no heartbeat in flight as the fakes' links close */
    atomic_store(&e->src.stop, true);
    atomic_store(&e->dst.stop, true);
    pthread_join(e->thr[0], NULL);
    pthread_join(e->thr[1], NULL);
    (void)wk_nng_close(e->src.sock, 2000);
    (void)wk_nng_close(e->dst.sock, 2000); /* (ECLOSED at once when the fake closed it) */
    ctl_vm_free(e->vm);
    ctl_pool_free(e->pool);
    for (int i = 0; i < 4; i++) {
        free(e->src.slot[i]);
        free(e->dst.slot[i]);
    }
    free(e->link.bytes);
    pthread_mutex_destroy(&e->link.mu);
    pthread_cond_destroy(&e->link.cv);
    free(e);
}

static const ctl_transport_opts quick = {.init_timeout_ms = 1000, .transfer_timeout_ms = 1000};

static void
assert_src_intact(const pair_env *e)
{
    for (size_t i = 0; i < STATE_BYTES; i += 4093)
        assert_int_equal(e->src.slot[1][i], (uint8_t)(i * 2246822519u >> 11));
}

static void
test_nccl_success(void **state)
{
    (void)state;
    pair_env *e = pair_up();
    ctl_slot_ref src = {"src", 1, 1}, dst = {"dst", 2, 1};
    ctl_transport_report rep;
    wk_diag d = {{0}};
    assert_int_equal(ctl_transport_move(e->pool, e->vm, &src, &dst, &quick, &rep, &d), WK_OK);
    assert_int_equal(rep.kind, CTL_TRANSPORT_KIND_NCCL);
    assert_non_null(strstr(rep.reason, "GPU to GPU"));
    assert_string_equal(rep.fallback, "");
    assert_int_equal(rep.bytes, STATE_BYTES);
    assert_memory_equal(e->src.slot[1], e->dst.slot[2], STATE_BYTES);
    /* The source made the id; both got it byte-exact in MIGRATE_PREPARE. */
    assert_int_equal(atomic_load(&e->src.n_nccl_id), 1);
    assert_int_equal(atomic_load(&e->dst.n_nccl_id), 0);
    assert_int_equal(e->src.got_uid_len, WK_PROTO_NCCL_ID_LEN);
    assert_int_equal(e->dst.got_uid_len, WK_PROTO_NCCL_ID_LEN);
    assert_memory_equal(e->src.got_uid, e->src.made_uid, WK_PROTO_NCCL_ID_LEN);
    assert_memory_equal(e->dst.got_uid, e->src.made_uid, WK_PROTO_NCCL_ID_LEN);
    assert_string_equal(e->src.prep_role, "send");
    assert_string_equal(e->dst.prep_role, "recv");
    assert_int_equal(atomic_load(&e->src.n_commit), 1);
    assert_int_equal(atomic_load(&e->dst.n_commit), 1);
    assert_int_equal(atomic_load(&e->src.n_abort) + atomic_load(&e->dst.n_abort), 0);
    /* No byte went through the controller. */
    assert_int_equal(atomic_load(&e->src.n_slot_read), 0);
    assert_src_intact(e);
    pair_down(e);
}

static void
test_nccl_init_failure_falls_back(void **state)
{
    (void)state;
    pair_env *e = pair_up();
    atomic_store(&e->dst.fail_prepare, true);
    ctl_slot_ref src = {"src", 1, 1}, dst = {"dst", 3, 1};
    ctl_transport_report rep;
    wk_diag d = {{0}};
    assert_int_equal(ctl_transport_move(e->pool, e->vm, &src, &dst, &quick, &rep, &d), WK_OK);
    assert_int_equal(rep.kind, CTL_TRANSPORT_KIND_NNG);
    assert_int_equal(rep.failed_phase, CTL_NCCL_PHASE_PREPARE);
    assert_non_null(strstr(rep.fallback, "prepare"));
    assert_non_null(strstr(rep.fallback, "did not join"));
    assert_int_equal(rep.bytes, STATE_BYTES);
    assert_memory_equal(e->src.slot[1], e->dst.slot[3], STATE_BYTES);
    /* Both sides were told to abort; the NNG retry read the source. */
    assert_int_equal(atomic_load(&e->src.n_abort), 1);
    assert_int_equal(atomic_load(&e->dst.n_abort), 1);
    assert_int_equal(atomic_load(&e->src.n_commit) + atomic_load(&e->dst.n_commit), 0);
    assert_true(atomic_load(&e->src.n_slot_read) > 0);
    assert_src_intact(e);
    pair_down(e);
}

static void
test_nccl_checksum_mismatch_aborts(void **state)
{
    (void)state;
    pair_env *e = pair_up();
    atomic_store(&e->dst.corrupt_nccl, true);
    ctl_slot_ref src = {"src", 1, 1}, dst = {"dst", 2, 1};
    /* The phase machine alone: verify fails, both abort, nothing committed. */
    wk_diag d = {{0}};
    ctl_nccl_phase failed = CTL_NCCL_PHASE_DONE;
    assert_int_equal(ctl_transport_nccl_run(e->pool, &src, &dst, STATE_BYTES, &quick, &failed, &d),
                     WK_ECORRUPT);
    assert_int_equal(failed, CTL_NCCL_PHASE_VERIFY);
    assert_non_null(strstr(d.msg, "checksum"));
    assert_int_equal(atomic_load(&e->src.n_abort), 1);
    assert_int_equal(atomic_load(&e->dst.n_abort), 1);
    assert_int_equal(atomic_load(&e->src.n_commit) + atomic_load(&e->dst.n_commit), 0);
    /* Through ctl_transport_move: the same migration is retried over NNG once. */
    ctl_transport_report rep;
    memset(&d, 0, sizeof(d));
    assert_int_equal(ctl_transport_move(e->pool, e->vm, &src, &dst, &quick, &rep, &d), WK_OK);
    assert_int_equal(rep.kind, CTL_TRANSPORT_KIND_NNG);
    assert_int_equal(rep.failed_phase, CTL_NCCL_PHASE_VERIFY);
    assert_non_null(strstr(rep.fallback, "checksum"));
    assert_memory_equal(e->src.slot[1], e->dst.slot[2], STATE_BYTES);
    /* Corrupted over NNG too: the fallback's verify aborts as well. */
    atomic_store(&e->dst.corrupt, true);
    memset(&d, 0, sizeof(d));
    assert_int_equal(ctl_transport_move(e->pool, e->vm, &src, &dst, &quick, &rep, &d),
                     WK_ECORRUPT);
    assert_non_null(strstr(rep.fallback, "checksum"));
    assert_src_intact(e);
    pair_down(e);
}

static void
test_nccl_destination_dies(void **state)
{
    (void)state;
    pair_env *e = pair_up();
    /* no heartbeat in flight when the destination's link drops (wk_nng.h): only the move's
       own messages, which the fake answers before it closes */
    ctl_pool_stop(e->pool);
    atomic_store(&e->dst.die_on_recv, true);
    ctl_slot_ref src = {"src", 1, 1}, dst = {"dst", 2, 1};
    ctl_transport_report rep;
    wk_diag d = {{0}};
    wk_err err = ctl_transport_move(e->pool, e->vm, &src, &dst, &quick, &rep, &d);
    assert_int_not_equal(err, WK_OK);
    assert_true(err == WK_ENOENT || err == WK_EUNAVAIL);
    assert_int_equal(rep.failed_phase, CTL_NCCL_PHASE_TRANSFER);
    assert_non_null(strstr(rep.fallback, "transfer"));
    assert_non_null(strstr(rep.fallback, "destination dst"));
    /* The source was told to abort and committed nothing; its slot is untouched. */
    assert_int_equal(atomic_load(&e->src.n_abort), 1);
    assert_int_equal(atomic_load(&e->src.n_commit), 0);
    assert_src_intact(e);
    pair_down(e);
}

/* The new wire fields' limits (wk_proto). */
static void
test_nccl_proto_limits(void **state)
{
    (void)state;
    uint8_t id[WK_PROTO_NCCL_ID_LEN + 1];
    memset(id, 7, sizeof(id));
    Wkvm__MigrateNcclId ni = WKVM__MIGRATE_NCCL_ID__INIT;
    wk_msg m = WKVM__ENVELOPE__INIT;
    m.kind = WKVM__KIND__MIGRATE_NCCL_ID_REPLY;
    m.payload_case = WKVM__ENVELOPE__PAYLOAD_MIGRATE_NCCL_ID;
    m.migrate_nccl_id = &ni;
    ni.unique_id.data = id;
    ni.unique_id.len = WK_PROTO_NCCL_ID_LEN;
    assert_int_equal(wk_proto_validate(&m, NULL), WK_OK);
    ni.unique_id.len = WK_PROTO_NCCL_ID_LEN + 1;
    assert_int_equal(wk_proto_validate(&m, NULL), WK_EPROTO);
    /* A request never goes without its payload; an error reply may. */
    wk_msg q = WKVM__ENVELOPE__INIT;
    q.kind = WKVM__KIND__MIGRATE_NCCL_ID;
    q.status = WK_EINVAL;
    assert_int_equal(wk_proto_validate(&q, NULL), WK_EPROTO);
    q.kind = WKVM__KIND__MIGRATE_NCCL_ID_REPLY;
    assert_int_equal(wk_proto_validate(&q, NULL), WK_OK);
    Wkvm__MigratePrepare mp = WKVM__MIGRATE_PREPARE__INIT;
    mp.role = "send";
    wk_msg p = WKVM__ENVELOPE__INIT;
    p.kind = WKVM__KIND__MIGRATE_PREPARE;
    p.payload_case = WKVM__ENVELOPE__PAYLOAD_MIGRATE_PREPARE;
    p.migrate_prepare = &mp;
    mp.chunk_bytes = WK_PROTO_NCCL_CHUNK_MAX;
    mp.timeout_ms = WK_PROTO_NCCL_TIMEOUT_MAX;
    assert_int_equal(wk_proto_validate(&p, NULL), WK_OK);
    mp.chunk_bytes = WK_PROTO_NCCL_CHUNK_MAX + 1;
    assert_int_equal(wk_proto_validate(&p, NULL), WK_EPROTO);
    mp.chunk_bytes = 0;
    mp.timeout_ms = WK_PROTO_NCCL_TIMEOUT_MAX + 1;
    assert_int_equal(wk_proto_validate(&p, NULL), WK_EPROTO);
    char longid[WK_PROTO_DEVICE_ID_MAX + 2];
    memset(longid, 'a', sizeof(longid) - 1);
    longid[sizeof(longid) - 1] = '\0';
    Wkvm__Hello h = WKVM__HELLO__INIT;
    h.worker_id = "w0";
    h.device_uuid = longid;
    wk_msg hm = WKVM__ENVELOPE__INIT;
    hm.kind = WKVM__KIND__HELLO;
    hm.payload_case = WKVM__ENVELOPE__PAYLOAD_HELLO;
    hm.hello = &h;
    assert_int_equal(wk_proto_validate(&hm, NULL), WK_EPROTO);
    longid[WK_PROTO_DEVICE_ID_MAX] = '\0';
    assert_int_equal(wk_proto_validate(&hm, NULL), WK_OK);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_phase),
        cmocka_unit_test(test_transport_choose),
        cmocka_unit_test(test_nccl_proto_limits),
        cmocka_unit_test(test_nccl_success),
        cmocka_unit_test(test_nccl_init_failure_falls_back),
        cmocka_unit_test(test_nccl_checksum_mismatch_aborts),
        cmocka_unit_test(test_nccl_destination_dies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
