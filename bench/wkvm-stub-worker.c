/*
 * wkvm-stub-worker: a worker that speaks the real controller <-> worker
 * protocol (proto/wkvm.proto over NNG pair1) and computes nothing, so that
 * bench/controller.py --stub can measure the controller alone at high
 * stream counts. It says Hello, answers LOAD_MODEL with the ModelInfo of a
 * synthetic RWKV-7 shape given on the command line (--layers, --embd,
 * --head-size, --ffn, --vocab: the shape of the model the controller was
 * given, whose tokenizer it uses), acknowledges slot and host-cache
 * operations (a warm-tier checkpoint "loads" without bytes: the state is
 * fiction anyway), and answers every STEP at once with one fixed token per
 * sampling row (--token) and every snap of a row saved (a HOST_PUT
 * without bytes, acknowledged like the others). State reads are refused
 * (WK_ENOTSUP): migration, spills and state files are out of its scope.
 *
 * It must never be used for serving. It is the one program outside
 * pool/ctl_pool.c and workerd/wrk_rpc.c that uses NNG: a bench tool that
 * stands in for wrk_rpc.c, kept out of the daemons.
 */
#include <nng/nng.h>
#include <nng/protocol/pair1/pair.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wk_cfg.h"
#include "wk_nng.h"
#include "wk_proto.h"

static const wk_cfg_opt stub_opts[] = {
    {"data-dir", WK_CFG_STR, NULL, 0, 0,
     "the controller's data directory (link: DATA/controller.ipc)"},
    {"link-url", WK_CFG_STR, NULL, 0, 0, "controller link URL (default ipc://DATA/controller.ipc)"},
    {"id", WK_CFG_STR, "stub0", 0, 0, "worker id"},
    {"layers", WK_CFG_U64, "2", 1, 1024, "n_layer of the model the controller serves"},
    {"embd", WK_CFG_U64, "64", 1, 65536, "n_embd"},
    {"head-size", WK_CFG_U64, "16", 1, 1024, "head size"},
    {"ffn", WK_CFG_U64, "128", 1, 1048576, "ffn dim"},
    {"vocab", WK_CFG_U64, "512", 2, 1048576, "vocabulary size"},
    {"token", WK_CFG_U64, "300", 0, 1048575, "the token every sampling row gets"},
};
#define STUB_NOPTS (sizeof(stub_opts) / sizeof(stub_opts[0]))

static atomic_bool stub_stop;

static void
stub_on_signal(int sig)
{
    (void)sig;
    atomic_store(&stub_stop, true);
}

static int
stub_send(nng_socket sock, const wk_msg *m)
{
    void *buf = NULL;
    size_t len = 0;
    if (wk_proto_encode(m, &buf, &len) != WK_OK)
        return -1;
    int rv = nng_send(sock, buf, len, 0);
    free(buf);
    return rv;
}

static void
stub_ack(nng_socket sock, const wk_msg *req, Wkvm__Kind kind, wk_err err, const char *detail)
{
    wk_msg r = WKVM__ENVELOPE__INIT;
    r.id = req->id;
    r.kind = kind;
    r.status = (int32_t)err;
    r.detail = (char *)detail;
    (void)stub_send(sock, &r);
}

int
main(int argc, char **argv)
{
    wk_cfg *cfg = NULL;
    wk_diag d = {{0}};
    if (wk_cfg_parse(stub_opts, STUB_NOPTS, "WKVM_STUB", argc, argv, &cfg, &d) != WK_OK) {
        fprintf(stderr, "wkvm-stub-worker: %s\n", d.msg);
        return 2;
    }
    if (wk_cfg_help_requested(cfg)) {
        wk_cfg_print_help(stub_opts, STUB_NOPTS, "wkvm-stub-worker",
                          "a worker that answers every step at once (benchmarks only)", "WKVM_STUB",
                          stdout);
        wk_cfg_free(cfg);
        return 0;
    }
    if (wk_cfg_version_requested(cfg)) {
        printf("%s %s\n", "wkvm-stub-worker", WK_VERSION);
        wk_cfg_free(cfg);
        return 0;
    }
    char url[4200];
    if (wk_cfg_get_str(cfg, "link-url") != NULL)
        snprintf(url, sizeof(url), "%s", wk_cfg_get_str(cfg, "link-url"));
    else if (wk_cfg_get_str(cfg, "data-dir") != NULL)
        snprintf(url, sizeof(url), "ipc://%s/controller.ipc", wk_cfg_get_str(cfg, "data-dir"));
    else {
        fprintf(stderr, "wkvm-stub-worker: --data-dir or --link-url is required\n");
        return 2;
    }
    uint32_t L = (uint32_t)wk_cfg_get_u64(cfg, "layers"), C = (uint32_t)wk_cfg_get_u64(cfg, "embd");
    uint32_t N = (uint32_t)wk_cfg_get_u64(cfg, "head-size");
    int32_t token = (int32_t)wk_cfg_get_u64(cfg, "token");
    char id[128];
    snprintf(id, sizeof(id), "%s", wk_cfg_get_str(cfg, "id"));
    signal(SIGTERM, stub_on_signal);
    signal(SIGINT, stub_on_signal);

    nng_socket sock;
    if (nng_pair1_open(&sock) != 0)
        return 1;
    nng_socket_set_size(sock, NNG_OPT_RECVMAXSZ, WK_PROTO_MSG_MAX);
    nng_socket_set_ms(sock, NNG_OPT_RECVTIMEO, 200);
    nng_socket_set_ms(sock, NNG_OPT_RECONNMINT, 100);
    nng_socket_set_ms(sock, NNG_OPT_RECONNMAXT, 1000);
    int rv = nng_dial(sock, url, NULL, NNG_FLAG_NONBLOCK);
    if (rv != 0) {
        fprintf(stderr, "wkvm-stub-worker: dial %s: %s\n", url, nng_strerror(rv));
        return 1;
    }
    char host[128] = "";
    gethostname(host, sizeof(host) - 1);
    Wkvm__Hello h = WKVM__HELLO__INIT;
    h.worker_id = id;
    h.backend = "cpu";
    h.device = "stub (answers steps at once)";
    h.device_mem_bytes = 1ull << 34;
    h.protocol_version = WK_PROTO_VERSION;
    h.pid = (uint32_t)getpid();
    h.hostname = host;
    wk_msg hello = WKVM__ENVELOPE__INIT;
    hello.kind = WKVM__KIND__HELLO;
    hello.payload_case = WKVM__ENVELOPE__PAYLOAD_HELLO;
    hello.hello = &h;
    while (!atomic_load(&stub_stop) && stub_send(sock, &hello) != 0)
        usleep(100 * 1000); /* until the dialer is connected */

    Wkvm__ModelInfo mi = WKVM__MODEL_INFO__INIT;
    mi.family = "rwkv7";
    mi.name = "stub";
    mi.n_layer = L;
    mi.n_embd = C;
    mi.head_size = N;
    mi.n_head = C / N;
    mi.ffn_dim = (uint32_t)wk_cfg_get_u64(cfg, "ffn");
    mi.vocab_size = (uint32_t)wk_cfg_get_u64(cfg, "vocab");
    mi.dtype = "F32";
    mi.state_bytes = (uint64_t)L * (2u * C + (uint64_t)(C / N) * N * N) * 4u;
    mi.weights_digest = "stub";
    mi.vocab_digest = "stub";
    mi.fingerprint = "0000000000000000000000000000000000000000000000000000000000057ab0";
    uint64_t steps = 0, tokens = 0;
    Wkvm__RowResult *rr = calloc(WK_PROTO_ROWS_MAX, sizeof(*rr));
    Wkvm__RowResult **rp = calloc(WK_PROTO_ROWS_MAX, sizeof(*rp));
    if (rr == NULL || rp == NULL)
        return 1;
    while (!atomic_load(&stub_stop)) {
        void *buf = NULL;
        size_t len = 0;
        rv = nng_recv(sock, &buf, &len, NNG_FLAG_ALLOC);
        if (rv == NNG_ETIMEDOUT)
            continue;
        if (rv != 0)
            break;
        wk_msg *req = NULL;
        wk_err err = wk_proto_decode(buf, len, &req, &d);
        nng_free(buf, len);
        if (err != WK_OK)
            continue;
        switch (req->kind) {
        case WKVM__KIND__HELLO_ACK:
            break;
        case WKVM__KIND__LOAD_MODEL: {
            mi.n_slots = req->load_model->n_slots;
            wk_msg r = WKVM__ENVELOPE__INIT;
            r.id = req->id;
            r.kind = WKVM__KIND__MODEL_INFO;
            r.payload_case = WKVM__ENVELOPE__PAYLOAD_MODEL_INFO;
            r.model_info = &mi;
            (void)stub_send(sock, &r);
            break;
        }
        case WKVM__KIND__STATS: {
            Wkvm__StatsReply s = WKVM__STATS_REPLY__INIT;
            s.slots_total = mi.n_slots ? mi.n_slots - 1 : 0;
            s.steps = steps;
            s.tokens = tokens;
            s.model_loaded = mi.n_slots > 0;
            s.model_fingerprint = mi.n_slots > 0 ? mi.fingerprint : "";
            s.load_permille = mi.n_slots > 0 ? 1000 : 0;
            wk_msg r = WKVM__ENVELOPE__INIT;
            r.id = req->id;
            r.kind = WKVM__KIND__STATS_REPLY;
            r.payload_case = WKVM__ENVELOPE__PAYLOAD_STATS_REPLY;
            r.stats_reply = &s;
            (void)stub_send(sock, &r);
            break;
        }
        case WKVM__KIND__STEP: {
            size_t n = 0;
            for (size_t i = 0; i < req->step->n_rows; i++) {
                const Wkvm__StepRow *row = req->step->rows[i];
                tokens += row->n_tokens;
                wkvm__row_result__init(&rr[n]);
                rr[n].slot = row->slot;
                rr[n].sampled = row->sample;
                rr[n].token = row->sample ? token : 0;
                /* (wk_proto bounds snaps to WK_PROTO_ROW_SNAPS_MAX, under 32) */
                rr[n].snaps_saved = (uint32_t)((1ull << row->n_snaps) - 1u);
                rp[n] = &rr[n];
                n++;
            }
            steps++;
            Wkvm__StepResult sr = WKVM__STEP_RESULT__INIT;
            sr.n_rows = n;
            sr.rows = rp;
            sr.step_us = 1;
            wk_msg r = WKVM__ENVELOPE__INIT;
            r.id = req->id;
            r.kind = WKVM__KIND__STEP_RESULT;
            r.payload_case = WKVM__ENVELOPE__PAYLOAD_STEP_RESULT;
            r.step_result = &sr;
            (void)stub_send(sock, &r);
            break;
        }
        case WKVM__KIND__SLOT_RESET:
        case WKVM__KIND__SLOT_COPY:
        case WKVM__KIND__SLOT_FREE:
        case WKVM__KIND__HOST_PUT:
        case WKVM__KIND__HOST_GET: /* the controller asks only for keys it put */
        case WKVM__KIND__HOST_DROP:
            stub_ack(sock, req, WKVM__KIND__ACK, WK_OK, "");
            break;
        case WKVM__KIND__SHUTDOWN:
            stub_ack(sock, req, WKVM__KIND__ACK, WK_OK, "");
            atomic_store(&stub_stop, true);
            break;
        case WKVM__KIND__SLOT_READ:
            stub_ack(sock, req, WKVM__KIND__SLOT_DATA, WK_ENOTSUP, "stub worker");
            break;
        default:
            stub_ack(sock, req, WKVM__KIND__ACK, WK_ENOTSUP, "stub worker");
            break;
        }
        wk_proto_free(req);
    }
    free(rr);
    free(rp);
    (void)wk_nng_close(sock, 2000); /* bounded: wk_nng.h */
    wk_cfg_free(cfg);
    return 0;
}
