/*
 * libFuzzer harness for wk_proto_decode: the controller <-> worker envelope
 * as a worker or controller receives it from the wire (the NNG port has no
 * authentication, so its input is hostile). Each input is decoded; on
 * success the message must pass wk_proto_validate() again, re-encode within
 * WK_PROTO_MSG_MAX, and decode back to the same bytes when encoded once more
 * (protobuf-c's encoding of a decoded message is canonical). Decode errors
 * must be WK_EPROTO or WK_ETOOBIG and say why; only an error reply may omit
 * its payload (corpus regress_*: a HELLO or SLOT_READ with a status and no
 * payload used to pass and crash the receiver). The checks of the documented
 * maxima are exercised on every accepted input: rows, tokens per row and per
 * step, top logprobs, allowed-token masks, chunk sizes, string lengths.
 */
/* fuzz-sources: common/util/wk_err.c proto/wk_proto.c gen/wkvm.pb-c.c */
/* fuzz-protoc: proto/wkvm.proto */
/* fuzz-libs: -lprotobuf-c */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
fuzz_check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_proto: invariant failed: %s\n", what);
        abort();
    }
}

/*
 * True when msg or a message inside it kept unknown fields. protobuf-c keeps
 * them and writes them back; one it accepts on input (field number 0 written
 * as a two-byte varint key) it refuses when it reads its own output back, so
 * the round-trip invariant below only holds for messages without them.
 */
static bool
fuzz_has_unknown(const ProtobufCMessage *msg)
{
    if (msg == NULL)
        return false;
    if (msg->n_unknown_fields > 0)
        return true;
    const ProtobufCMessageDescriptor *desc = msg->descriptor;
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        const char *base = (const char *)msg;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *arr = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t k = 0; k < n; k++)
                if (fuzz_has_unknown(arr[k]))
                    return true;
        } else {
            if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
                uint32_t which = *(const uint32_t *)(base + f->quantifier_offset);
                if (which != f->id)
                    continue;
            }
            if (fuzz_has_unknown(*(ProtobufCMessage *const *)(base + f->offset)))
                return true;
        }
    }
    return false;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wk_msg *m = NULL;
    wk_diag d = {{0}};
    wk_err e = wk_proto_decode(data, size, &m, &d);
    if (e != WK_OK) {
        fuzz_check(e == WK_EPROTO || e == WK_ETOOBIG || e == WK_ENOMEM, "error code");
        fuzz_check(d.msg[0] != '\0', "message on failure");
        fuzz_check(m == NULL, "no output on failure");
        return 0;
    }
    fuzz_check(wk_proto_validate(m, &d) == WK_OK, "valid after decode");
    /* Only an error reply may come without its payload; a request never (handlers use it). */
    bool reply = m->kind == WKVM__KIND__HELLO_ACK || m->kind == WKVM__KIND__MODEL_INFO ||
                 m->kind == WKVM__KIND__STEP_RESULT || m->kind == WKVM__KIND__SLOT_DATA ||
                 m->kind == WKVM__KIND__STATS_REPLY ||
                 m->kind == WKVM__KIND__MIGRATE_NCCL_ID_REPLY;
    fuzz_check(m->payload_case == wk_proto_kind_payload((int)m->kind) ||
                   (reply && m->status != 0 &&
                    m->payload_case == WKVM__ENVELOPE__PAYLOAD__NOT_SET),
               "kind and payload agree");
    fuzz_check(wk_proto_kind_name((int)m->kind) != NULL, "kind has a name");
    if (m->payload_case == WKVM__ENVELOPE__PAYLOAD_STEP) {
        size_t total = 0;
        fuzz_check(m->step->n_rows <= WK_PROTO_ROWS_MAX, "rows bounded");
        for (size_t i = 0; i < m->step->n_rows; i++) {
            fuzz_check(m->step->rows[i]->n_tokens <= WK_PROTO_ROW_TOKENS_MAX, "row bounded");
            const Wkvm__SampleParams *sp = m->step->rows[i]->params;
            fuzz_check(sp == NULL || sp->allowed_tokens.len <= WK_PROTO_ALLOWED_MAX,
                       "allowed_tokens bounded");
            total += m->step->rows[i]->n_tokens;
        }
        fuzz_check(total <= WK_PROTO_STEP_TOKENS_MAX, "step bounded");
    }
    void *buf = NULL, *buf2 = NULL;
    size_t len = 0, len2 = 0;
    fuzz_check(wk_proto_encode(m, &buf, &len) == WK_OK, "re-encode");
    if (fuzz_has_unknown(&m->base)) {
        free(buf);
        wk_proto_free(m);
        return 0;
    }
    wk_msg *m2 = NULL;
    fuzz_check(wk_proto_decode(buf, len, &m2, &d) == WK_OK, "decode of the re-encoding");
    fuzz_check(wk_proto_encode(m2, &buf2, &len2) == WK_OK, "second re-encode");
    fuzz_check(len == len2 && memcmp(buf, buf2, len) == 0, "encoding is canonical");
    free(buf);
    free(buf2);
    wk_proto_free(m2);
    wk_proto_free(m);
    return 0;
}
