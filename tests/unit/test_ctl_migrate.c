/*
 * Unit test of the migration transfer's verify phase against a scripted
 * fake worker over a real NNG ipc socket: ctl_vm_transfer() reads the
 * source, writes the destination and commits only when the destination's
 * checksum (MIGRATE_RECV) matches the source bytes. A worker that reports a
 * different checksum (a corrupted chunk) makes it abort with WK_ECORRUPT.
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
#include "ctl_vm.h"
#include "wk_proto.h"
#include "wk_sha256.h"

#define STATE_BYTES (5u << 20) /* more than one 4 MiB chunk */

typedef struct fake {
    nng_socket sock;           /* pair1 client */
    uint8_t *slot[4];          /* fake slot bytes */
    atomic_bool corrupt;       /* flip a byte of what was written */
    atomic_bool stop;          /* exit */
} fake;

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
    h.worker_id = "fake";
    h.backend = "cpu";
    h.device = "test";
    h.protocol_version = WK_PROTO_VERSION;
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
        char hex[WK_SHA256_HEX_LEN];
        if (m->kind == WKVM__KIND__SLOT_READ) {
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

    atomic_store(&f.stop, true);
    pthread_join(thr, NULL);
    nng_close(f.sock);
    ctl_vm_free(vm);
    ctl_pool_free(pool);
    for (int i = 0; i < 4; i++)
        free(f.slot[i]);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_phase),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
