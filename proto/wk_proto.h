/*
 * wk_proto: encoding, decoding and validation of the controller <-> worker
 * Envelope (proto/wkvm.proto). Every decoded message passes
 * wk_proto_validate() before a handler sees it: the documented maxima, the
 * kind/payload agreement and string sanity. Never logs.
 */
#ifndef WK_PROTO_H
#define WK_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"
#include "wkvm.pb-c.h"

/* 2: StepRow.snaps (a version-1 worker would ignore them and copy nothing) */
#define WK_PROTO_VERSION 2
#define WK_PROTO_STR_MAX 4096u
#define WK_PROTO_ROWS_MAX 1024u
#define WK_PROTO_ROW_TOKENS_MAX 16384u
#define WK_PROTO_ROW_SNAPS_MAX 8u  /* RowSnap entries of one step row */
#define WK_PROTO_HOST_KEY_MAX 128u /* bytes of a warm-tier key */
#define WK_PROTO_STEP_TOKENS_MAX 65536u
#define WK_PROTO_TOP_MAX 20u
#define WK_PROTO_LOGIT_BIAS_MAX 300u  /* SampleParams.logit_bias entries */
#define WK_PROTO_LOGIT_BIAS_ABS 100.0f /* |bias| of one entry */
#define WK_PROTO_ALLOWED_MAX 131072u   /* SampleParams.allowed_tokens bytes (2^20 tokens) */
#define WK_PROTO_CHUNK_MAX (4u << 20)
#define WK_PROTO_MSG_MAX (64u << 20)
#define WK_PROTO_STATE_TENSORS_MAX 4096u /* ModelInfo.state_tensors entries */
#define WK_PROTO_STATE_NAME_MAX 127u     /* bytes of a state tensor name */
#define WK_PROTO_NCCL_ID_LEN 128u
#define WK_PROTO_NCCL_CHUNK_MAX (256u << 20) /* MigratePrepare.chunk_bytes */
#define WK_PROTO_NCCL_TIMEOUT_MAX 600000u    /* MigratePrepare.timeout_ms */
#define WK_PROTO_DEVICE_ID_MAX 64u           /* Hello.device_uuid, Hello.pci_bus_id */

typedef Wkvm__Envelope wk_msg;

/*
 * Decodes len bytes into *out and validates it. On success the caller owns
 * *out and frees it with wk_proto_free(). WK_EPROTO (not a valid envelope, a
 * limit exceeded, kind and payload disagree; diag says which), WK_ETOOBIG
 * (len over WK_PROTO_MSG_MAX), WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_proto_decode(const void *buf, size_t len, wk_msg **out, wk_diag *d);

/* Frees a message from wk_proto_decode(). NULL-safe. */
void wk_proto_free(wk_msg *m);

/* Checks limits and kind/payload agreement of m (borrowed). WK_EPROTO on failure. */
WK_MUST_CHECK wk_err wk_proto_validate(const wk_msg *m, wk_diag *d);

/*
 * Serialises m (borrowed) into a malloc'd buffer; caller frees *buf with
 * free(). WK_ETOOBIG over WK_PROTO_MSG_MAX, WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_proto_encode(const wk_msg *m, void **buf, size_t *len);

/*
 * The two halves of wk_proto_encode() for a caller that owns the buffer
 * (the worker packs a reply straight into its NNG message, no second copy):
 * *len gets m's serialised size (WK_ETOOBIG over WK_PROTO_MSG_MAX), then
 * wk_proto_encode_into() writes exactly that many bytes to buf and returns
 * the count.
 */
WK_MUST_CHECK wk_err wk_proto_encoded_size(const wk_msg *m, size_t *len);
size_t wk_proto_encode_into(const wk_msg *m, void *buf);

/* Name of a kind ("STEP"), static. */
const char *wk_proto_kind_name(int kind);

/* The payload case a kind must carry (NOT_SET for ACK, STATS, SHUTDOWN). */
Wkvm__Envelope__PayloadCase wk_proto_kind_payload(int kind);

#endif /* WK_PROTO_H */
