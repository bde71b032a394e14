/*
 * wk_proto: the only code that calls protobuf-c's pack/unpack for the
 * envelope. Treats every incoming buffer as hostile: the decoded message is
 * checked against the maxima documented in wkvm.proto before it is returned.
 */
#include "wk_proto.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct wk_proto_kind_row {
    const char *name;                    /* enum name without prefix */
    Wkvm__Envelope__PayloadCase payload; /* required payload */
} wk_proto_kind_row;

static const wk_proto_kind_row wk_proto_kinds[] = {
    [WKVM__KIND__KIND_UNSPECIFIED] = {"KIND_UNSPECIFIED", WKVM__ENVELOPE__PAYLOAD__NOT_SET},
    [WKVM__KIND__HELLO] = {"HELLO", WKVM__ENVELOPE__PAYLOAD_HELLO},
    [WKVM__KIND__HELLO_ACK] = {"HELLO_ACK", WKVM__ENVELOPE__PAYLOAD_HELLO_ACK},
    [WKVM__KIND__LOAD_MODEL] = {"LOAD_MODEL", WKVM__ENVELOPE__PAYLOAD_LOAD_MODEL},
    [WKVM__KIND__MODEL_INFO] = {"MODEL_INFO", WKVM__ENVELOPE__PAYLOAD_MODEL_INFO},
    [WKVM__KIND__SLOT_RESET] = {"SLOT_RESET", WKVM__ENVELOPE__PAYLOAD_SLOT_RESET},
    [WKVM__KIND__SLOT_COPY] = {"SLOT_COPY", WKVM__ENVELOPE__PAYLOAD_SLOT_COPY},
    [WKVM__KIND__SLOT_FREE] = {"SLOT_FREE", WKVM__ENVELOPE__PAYLOAD_SLOT_FREE},
    [WKVM__KIND__STEP] = {"STEP", WKVM__ENVELOPE__PAYLOAD_STEP},
    [WKVM__KIND__STEP_RESULT] = {"STEP_RESULT", WKVM__ENVELOPE__PAYLOAD_STEP_RESULT},
    [WKVM__KIND__SLOT_READ] = {"SLOT_READ", WKVM__ENVELOPE__PAYLOAD_SLOT_READ},
    [WKVM__KIND__SLOT_DATA] = {"SLOT_DATA", WKVM__ENVELOPE__PAYLOAD_SLOT_DATA},
    [WKVM__KIND__SLOT_WRITE] = {"SLOT_WRITE", WKVM__ENVELOPE__PAYLOAD_SLOT_WRITE},
    [WKVM__KIND__MIGRATE_PREPARE] = {"MIGRATE_PREPARE", WKVM__ENVELOPE__PAYLOAD_MIGRATE_PREPARE},
    [WKVM__KIND__MIGRATE_SEND] = {"MIGRATE_SEND", WKVM__ENVELOPE__PAYLOAD_MIGRATE_SEND},
    [WKVM__KIND__MIGRATE_RECV] = {"MIGRATE_RECV", WKVM__ENVELOPE__PAYLOAD_MIGRATE_RECV},
    [WKVM__KIND__MIGRATE_COMMIT] = {"MIGRATE_COMMIT", WKVM__ENVELOPE__PAYLOAD_MIGRATE_COMMIT},
    [WKVM__KIND__STATS] = {"STATS", WKVM__ENVELOPE__PAYLOAD__NOT_SET},
    [WKVM__KIND__STATS_REPLY] = {"STATS_REPLY", WKVM__ENVELOPE__PAYLOAD_STATS_REPLY},
    [WKVM__KIND__ACK] = {"ACK", WKVM__ENVELOPE__PAYLOAD__NOT_SET},
    [WKVM__KIND__SHUTDOWN] = {"SHUTDOWN", WKVM__ENVELOPE__PAYLOAD__NOT_SET},
    [WKVM__KIND__HOST_PUT] = {"HOST_PUT", WKVM__ENVELOPE__PAYLOAD_HOST_REF},
    [WKVM__KIND__HOST_GET] = {"HOST_GET", WKVM__ENVELOPE__PAYLOAD_HOST_REF},
    [WKVM__KIND__HOST_DROP] = {"HOST_DROP", WKVM__ENVELOPE__PAYLOAD_HOST_REF},
    [WKVM__KIND__MIGRATE_NCCL_ID] = {"MIGRATE_NCCL_ID", WKVM__ENVELOPE__PAYLOAD_MIGRATE_NCCL_ID},
    [WKVM__KIND__MIGRATE_NCCL_ID_REPLY] = {"MIGRATE_NCCL_ID_REPLY",
                                           WKVM__ENVELOPE__PAYLOAD_MIGRATE_NCCL_ID},
};
#define WK_PROTO_NKINDS (sizeof(wk_proto_kinds) / sizeof(wk_proto_kinds[0]))

const char *
wk_proto_kind_name(int kind)
{
    if (kind < 0 || (size_t)kind >= WK_PROTO_NKINDS || wk_proto_kinds[kind].name == NULL)
        return "UNKNOWN";
    return wk_proto_kinds[kind].name;
}

Wkvm__Envelope__PayloadCase
wk_proto_kind_payload(int kind)
{
    if (kind < 0 || (size_t)kind >= WK_PROTO_NKINDS)
        return WKVM__ENVELOPE__PAYLOAD__NOT_SET;
    return wk_proto_kinds[kind].payload;
}

/* protobuf-c has already checked UTF-8 for proto3 strings; we bound the length. */
static wk_err
wk_proto_check_str(const char *s, const char *field, wk_diag *d)
{
    if (s != NULL && strnlen(s, WK_PROTO_STR_MAX + 1) > WK_PROTO_STR_MAX)
        return wk_diag_set(d, WK_EPROTO, "%s longer than %u bytes", field, WK_PROTO_STR_MAX);
    return WK_OK;
}

#define CHECK_STR(s, name)                                                                         \
    do {                                                                                           \
        wk_err e_ = wk_proto_check_str((s), (name), d);                                            \
        if (e_ != WK_OK)                                                                           \
            return e_;                                                                             \
    } while (0)

static wk_err
wk_proto_check_sample(const Wkvm__SampleParams *p, wk_diag *d)
{
    if (p == NULL)
        return WK_OK;
    if (p->top_logprobs > WK_PROTO_TOP_MAX)
        return wk_diag_set(d, WK_EPROTO, "top_logprobs %u over %u", p->top_logprobs,
                           WK_PROTO_TOP_MAX);
    if (!(p->temperature >= 0.0f && p->temperature <= 100.0f))
        return wk_diag_set(d, WK_EPROTO, "temperature out of range");
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
        return wk_diag_set(d, WK_EPROTO, "top_p out of range");
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return wk_diag_set(d, WK_EPROTO, "min_p out of range");
    if (p->n_logit_bias > WK_PROTO_LOGIT_BIAS_MAX)
        return wk_diag_set(d, WK_EPROTO, "logit_bias has %zu entries, max %u", p->n_logit_bias,
                           WK_PROTO_LOGIT_BIAS_MAX);
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        const Wkvm__LogitBias *b = p->logit_bias[i];
        if (b == NULL || b->token < 0 ||
            !(b->bias >= -WK_PROTO_LOGIT_BIAS_ABS && b->bias <= WK_PROTO_LOGIT_BIAS_ABS))
            return wk_diag_set(d, WK_EPROTO, "logit_bias entry %zu out of range", i);
    }
    if (p->allowed_tokens.len > WK_PROTO_ALLOWED_MAX)
        return wk_diag_set(d, WK_EPROTO, "allowed_tokens has %zu bytes, max %u",
                           p->allowed_tokens.len, WK_PROTO_ALLOWED_MAX);
    return WK_OK;
}

/*
 * A row's RowSnaps: at most WK_PROTO_ROW_SNAPS_MAX, `at` in 1..n_tokens and
 * strictly increasing (the worker feeds the row in pieces ending at each
 * one), keys of 1..WK_PROTO_HOST_KEY_MAX bytes. Distinct keys across the
 * step are the worker's check (it knows the whole step at once anyway).
 */
static wk_err
wk_proto_check_snaps(const Wkvm__StepRow *r, size_t row, wk_diag *d)
{
    if (r->n_snaps > WK_PROTO_ROW_SNAPS_MAX)
        return wk_diag_set(d, WK_EPROTO, "step row %zu has %zu snaps, max %u", row, r->n_snaps,
                           WK_PROTO_ROW_SNAPS_MAX);
    uint32_t prev = 0;
    for (size_t k = 0; k < r->n_snaps; k++) {
        const Wkvm__RowSnap *sn = r->snaps[k];
        if (sn == NULL)
            return wk_diag_set(d, WK_EPROTO, "step row %zu snap %zu missing", row, k);
        if (sn->at == 0 || sn->at > r->n_tokens || sn->at <= prev)
            return wk_diag_set(d, WK_EPROTO,
                               "step row %zu snap %zu: at %u must be in %u..%zu "
                               "(strictly increasing, within the row's tokens)",
                               row, k, sn->at, prev + 1, r->n_tokens);
        prev = sn->at;
        size_t klen = sn->host_key != NULL ? strnlen(sn->host_key, WK_PROTO_HOST_KEY_MAX + 1) : 0;
        if (klen == 0 || klen > WK_PROTO_HOST_KEY_MAX)
            return wk_diag_set(d, WK_EPROTO, "step row %zu snap %zu: host_key must be 1..%u bytes",
                               row, k, WK_PROTO_HOST_KEY_MAX);
    }
    return WK_OK;
}

static wk_err
wk_proto_check_step(const Wkvm__Step *s, wk_diag *d)
{
    if (s->n_rows > WK_PROTO_ROWS_MAX)
        return wk_diag_set(d, WK_EPROTO, "step has %zu rows, max %u", s->n_rows,
                           WK_PROTO_ROWS_MAX);
    size_t total = 0;
    for (size_t i = 0; i < s->n_rows; i++) {
        const Wkvm__StepRow *r = s->rows[i];
        if (r == NULL)
            return wk_diag_set(d, WK_EPROTO, "step row %zu missing", i);
        if (r->n_tokens == 0 || r->n_tokens > WK_PROTO_ROW_TOKENS_MAX)
            return wk_diag_set(d, WK_EPROTO, "step row %zu has %zu tokens (1..%u)", i,
                               r->n_tokens, WK_PROTO_ROW_TOKENS_MAX);
        if (r->n_penalty_tokens > WK_PROTO_ROW_TOKENS_MAX)
            return wk_diag_set(d, WK_EPROTO, "step row %zu has %zu penalty tokens, max %u", i,
                               r->n_penalty_tokens, WK_PROTO_ROW_TOKENS_MAX);
        total += r->n_tokens;
        wk_err e = wk_proto_check_sample(r->params, d);
        if (e != WK_OK)
            return e;
        e = wk_proto_check_snaps(r, i, d);
        if (e != WK_OK)
            return e;
    }
    if (total > WK_PROTO_STEP_TOKENS_MAX)
        return wk_diag_set(d, WK_EPROTO, "step has %zu tokens, max %u", total,
                           WK_PROTO_STEP_TOKENS_MAX);
    return WK_OK;
}

static wk_err
wk_proto_check_model_info(const Wkvm__ModelInfo *mi, wk_diag *d)
{
    if (mi == NULL)
        return WK_OK;
    CHECK_STR(mi->family, "model_info.family");
    CHECK_STR(mi->name, "model_info.name");
    CHECK_STR(mi->dtype, "model_info.dtype");
    CHECK_STR(mi->weights_digest, "model_info.weights_digest");
    CHECK_STR(mi->vocab_digest, "model_info.vocab_digest");
    CHECK_STR(mi->fingerprint, "model_info.fingerprint");
    if (mi->n_state_tensors > WK_PROTO_STATE_TENSORS_MAX)
        return wk_diag_set(d, WK_EPROTO, "model_info has %zu state tensors, max %u",
                           mi->n_state_tensors, WK_PROTO_STATE_TENSORS_MAX);
    for (size_t i = 0; i < mi->n_state_tensors; i++) {
        const Wkvm__StateTensor *t = mi->state_tensors[i];
        if (t == NULL || t->name == NULL || t->name[0] == '\0' ||
            strlen(t->name) > WK_PROTO_STATE_NAME_MAX)
            return wk_diag_set(d, WK_EPROTO, "model_info state tensor %zu: name missing or over "
                                             "%u bytes", i, WK_PROTO_STATE_NAME_MAX);
        if (t->n_shape < 1 || t->n_shape > 4)
            return wk_diag_set(d, WK_EPROTO, "model_info state tensor %zu: %zu dims (1..4)", i,
                               t->n_shape);
        for (size_t k = 0; k < t->n_shape; k++)
            if (t->shape[k] == 0 || t->shape[k] > ((uint64_t)1 << 34))
                return wk_diag_set(d, WK_EPROTO, "model_info state tensor %zu: bad extent", i);
    }
    return WK_OK;
}

wk_err
wk_proto_validate(const wk_msg *m, wk_diag *d)
{
    if (m->kind <= WKVM__KIND__KIND_UNSPECIFIED || (size_t)m->kind >= WK_PROTO_NKINDS)
        return wk_diag_set(d, WK_EPROTO, "unknown message kind %d", (int)m->kind);
    Wkvm__Envelope__PayloadCase want = wk_proto_kind_payload(m->kind);
    /*
     * Error replies may omit the payload; otherwise kind and payload agree.
     * Requests (and Hello) always carry theirs: handlers dereference it.
     */
    bool reply = m->kind == WKVM__KIND__HELLO_ACK || m->kind == WKVM__KIND__MODEL_INFO ||
                 m->kind == WKVM__KIND__STEP_RESULT || m->kind == WKVM__KIND__SLOT_DATA ||
                 m->kind == WKVM__KIND__STATS_REPLY ||
                 m->kind == WKVM__KIND__MIGRATE_NCCL_ID_REPLY;
    if (m->payload_case != want && !(reply && m->status != 0 && m->payload_case == 0))
        return wk_diag_set(d, WK_EPROTO, "kind %s carries payload %d, expected %d",
                           wk_proto_kind_name(m->kind), (int)m->payload_case, (int)want);
    CHECK_STR(m->detail, "detail");
    switch (m->payload_case) {
    case WKVM__ENVELOPE__PAYLOAD_HELLO:
        CHECK_STR(m->hello->worker_id, "hello.worker_id");
        CHECK_STR(m->hello->backend, "hello.backend");
        CHECK_STR(m->hello->device, "hello.device");
        CHECK_STR(m->hello->hostname, "hello.hostname");
        CHECK_STR(m->hello->model_dir, "hello.model_dir");
        if (m->hello->worker_id[0] == '\0' || strlen(m->hello->worker_id) > 64)
            return wk_diag_set(d, WK_EPROTO, "hello.worker_id must be 1..64 bytes");
        if (strlen(m->hello->device_uuid) > WK_PROTO_DEVICE_ID_MAX ||
            strlen(m->hello->pci_bus_id) > WK_PROTO_DEVICE_ID_MAX)
            return wk_diag_set(d, WK_EPROTO, "hello.device_uuid and hello.pci_bus_id are at most "
                               "%u bytes", WK_PROTO_DEVICE_ID_MAX);
        return wk_proto_check_model_info(m->hello->model, d);
    case WKVM__ENVELOPE__PAYLOAD_HELLO_ACK:
        CHECK_STR(m->hello_ack->controller_id, "hello_ack.controller_id");
        return WK_OK;
    case WKVM__ENVELOPE__PAYLOAD_LOAD_MODEL:
        CHECK_STR(m->load_model->model_dir, "load_model.model_dir");
        CHECK_STR(m->load_model->vocab_path, "load_model.vocab_path");
        return WK_OK;
    case WKVM__ENVELOPE__PAYLOAD_MODEL_INFO:
        return wk_proto_check_model_info(m->model_info, d);
    case WKVM__ENVELOPE__PAYLOAD_STEP:
        return wk_proto_check_step(m->step, d);
    case WKVM__ENVELOPE__PAYLOAD_STEP_RESULT:
        if (m->step_result->n_rows > WK_PROTO_ROWS_MAX)
            return wk_diag_set(d, WK_EPROTO, "step result has %zu rows, max %u",
                               m->step_result->n_rows, WK_PROTO_ROWS_MAX);
        for (size_t i = 0; i < m->step_result->n_rows; i++) {
            if (m->step_result->rows[i] == NULL ||
                m->step_result->rows[i]->n_top > WK_PROTO_TOP_MAX)
                return wk_diag_set(d, WK_EPROTO, "step result row %zu invalid", i);
        }
        return WK_OK;
    case WKVM__ENVELOPE__PAYLOAD_SLOT_READ:
        if (m->slot_read->length > WK_PROTO_CHUNK_MAX)
            return wk_diag_set(d, WK_EPROTO, "slot_read.length %u over %u",
                               m->slot_read->length, WK_PROTO_CHUNK_MAX);
        CHECK_STR(m->slot_read->host_key, "slot_read.host_key");
        if (strlen(m->slot_read->host_key) > 128)
            return wk_diag_set(d, WK_EPROTO, "slot_read.host_key over 128 bytes");
        return WK_OK;
    case WKVM__ENVELOPE__PAYLOAD_SLOT_DATA:
        if (m->slot_data->data.len > WK_PROTO_CHUNK_MAX)
            return wk_diag_set(d, WK_EPROTO, "slot_data.data %zu bytes over %u",
                               m->slot_data->data.len, WK_PROTO_CHUNK_MAX);
        return WK_OK;
    case WKVM__ENVELOPE__PAYLOAD_SLOT_WRITE:
        if (m->slot_write->data.len > WK_PROTO_CHUNK_MAX)
            return wk_diag_set(d, WK_EPROTO, "slot_write.data %zu bytes over %u",
                               m->slot_write->data.len, WK_PROTO_CHUNK_MAX);
        return WK_OK;
    case WKVM__ENVELOPE__PAYLOAD_MIGRATE_PREPARE:
        CHECK_STR(m->migrate_prepare->migration_id, "migrate_prepare.migration_id");
        CHECK_STR(m->migrate_prepare->role, "migrate_prepare.role");
        CHECK_STR(m->migrate_prepare->peer_worker, "migrate_prepare.peer_worker");
        if (m->migrate_prepare->nccl_unique_id.len != 0 &&
            m->migrate_prepare->nccl_unique_id.len != WK_PROTO_NCCL_ID_LEN)
            return wk_diag_set(d, WK_EPROTO, "migrate_prepare.nccl_unique_id must be 0 or %u "
                               "bytes", WK_PROTO_NCCL_ID_LEN);
        if (strcmp(m->migrate_prepare->role, "send") && strcmp(m->migrate_prepare->role, "recv"))
            return wk_diag_set(d, WK_EPROTO, "migrate_prepare.role must be send or recv");
        if (m->migrate_prepare->chunk_bytes > WK_PROTO_NCCL_CHUNK_MAX)
            return wk_diag_set(d, WK_EPROTO, "migrate_prepare.chunk_bytes %u over %u",
                               m->migrate_prepare->chunk_bytes, WK_PROTO_NCCL_CHUNK_MAX);
        if (m->migrate_prepare->timeout_ms > WK_PROTO_NCCL_TIMEOUT_MAX)
            return wk_diag_set(d, WK_EPROTO, "migrate_prepare.timeout_ms %u over %u",
                               m->migrate_prepare->timeout_ms, WK_PROTO_NCCL_TIMEOUT_MAX);
        return WK_OK;
    case WKVM__ENVELOPE__PAYLOAD_MIGRATE_NCCL_ID:
        CHECK_STR(m->migrate_nccl_id->migration_id, "migrate_nccl_id.migration_id");
        if (m->migrate_nccl_id->unique_id.len != 0 &&
            m->migrate_nccl_id->unique_id.len != WK_PROTO_NCCL_ID_LEN)
            return wk_diag_set(d, WK_EPROTO, "migrate_nccl_id.unique_id must be 0 or %u bytes",
                               WK_PROTO_NCCL_ID_LEN);
        return WK_OK;
    case WKVM__ENVELOPE__PAYLOAD_MIGRATE_SEND:
        CHECK_STR(m->migrate_send->migration_id, "migrate_send.migration_id");
        return WK_OK;
    case WKVM__ENVELOPE__PAYLOAD_MIGRATE_RECV:
        CHECK_STR(m->migrate_recv->migration_id, "migrate_recv.migration_id");
        return WK_OK;
    case WKVM__ENVELOPE__PAYLOAD_MIGRATE_COMMIT:
        CHECK_STR(m->migrate_commit->migration_id, "migrate_commit.migration_id");
        CHECK_STR(m->migrate_commit->checksum, "migrate_commit.checksum");
        return WK_OK;
    case WKVM__ENVELOPE__PAYLOAD_HOST_REF:
        if (m->host_ref->key[0] == '\0' || strlen(m->host_ref->key) > 128)
            return wk_diag_set(d, WK_EPROTO, "host_ref.key must be 1..128 bytes");
        return WK_OK;
    case WKVM__ENVELOPE__PAYLOAD_STATS_REPLY:
        CHECK_STR(m->stats_reply->model_fingerprint, "stats_reply.model_fingerprint");
        CHECK_STR(m->stats_reply->load_phase, "stats_reply.load_phase");
        if (m->stats_reply->load_permille > 1000)
            return wk_diag_set(d, WK_EPROTO, "stats_reply.load_permille over 1000");
        return WK_OK;
    default:
        return WK_OK;
    }
}

wk_err
wk_proto_decode(const void *buf, size_t len, wk_msg **out, wk_diag *d)
{
    if (len > WK_PROTO_MSG_MAX)
        return wk_diag_set(d, WK_ETOOBIG, "message of %zu bytes over %u", len,
                           WK_PROTO_MSG_MAX);
    wk_msg *m = wkvm__envelope__unpack(NULL, len, buf);
    if (m == NULL)
        return wk_diag_set(d, WK_EPROTO, "malformed envelope (%zu bytes)", len);
    wk_err err = wk_proto_validate(m, d);
    if (err != WK_OK) {
        wkvm__envelope__free_unpacked(m, NULL);
        return err;
    }
    *out = m;
    return WK_OK;
}

void
wk_proto_free(wk_msg *m)
{
    if (m != NULL)
        wkvm__envelope__free_unpacked(m, NULL);
}

wk_err
wk_proto_encoded_size(const wk_msg *m, size_t *len)
{
    size_t n = wkvm__envelope__get_packed_size(m);
    if (n > WK_PROTO_MSG_MAX)
        return WK_ETOOBIG;
    *len = n;
    return WK_OK;
}

size_t
wk_proto_encode_into(const wk_msg *m, void *buf)
{
    return wkvm__envelope__pack(m, buf);
}

wk_err
wk_proto_encode(const wk_msg *m, void **buf, size_t *len)
{
    size_t n = 0;
    wk_err e = wk_proto_encoded_size(m, &n);
    if (e != WK_OK)
        return e;
    uint8_t *b = malloc(n ? n : 1);
    if (b == NULL)
        return WK_ENOMEM;
    size_t w = wk_proto_encode_into(m, b);
    *buf = b;
    *len = w;
    return WK_OK;
}
