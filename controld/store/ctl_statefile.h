/*
 * ctl_statefile: the portable state file behind export and import of the
 * Durable State API, as pure functions over memory buffers (no I/O).
 *
 * A state file is a fixed 168-byte header (magic "WKVMSTAT", format version,
 * lengths, family, model fingerprint, tokenizer digest, token digest), the
 * token ids, a tensor table describing the state bytes, zero padding to a
 * 64-byte boundary, the state bytes, and a SHA-256 trailer over everything
 * before it. docs/STATE_FORMAT.md gives the byte layout field by field.
 *
 * The reader treats its input as hostile: every length, count and offset is
 * bounded and checked against the buffer before use, the tensor table must
 * tile the state bytes exactly and in order, the token digest is recomputed,
 * the checksum is verified, and the encoding is canonical (a file that reads
 * back writes back byte for byte). It never reads outside the buffer, never
 * logs and never compares the fingerprint with a model: that is the caller's
 * decision. All functions are thread-safe (no shared state).
 */
#ifndef CTL_STATEFILE_H
#define CTL_STATEFILE_H

#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"
#include "wk_sha256.h"

#define CTL_STATEFILE_MAGIC "WKVMSTAT"                   /* first 8 bytes of every file */
#define CTL_STATEFILE_VERSION 1u                         /* the format version written/read */
#define CTL_STATEFILE_FIXED_BYTES 168u                   /* bytes of the fixed header */
#define CTL_STATEFILE_ALIGN 64u                          /* the state bytes start at a multiple */
#define CTL_STATEFILE_CHECKSUM_BYTES 32u                 /* SHA-256 trailer */
#define CTL_STATEFILE_MAX_TOKENS ((uint64_t)1 << 20)     /* most token ids in a file */
#define CTL_STATEFILE_MAX_TENSORS 4096u                  /* most tensor table entries */
#define CTL_STATEFILE_MAX_DIMS 4u                        /* most dimensions of a tensor */
#define CTL_STATEFILE_NAME_MAX 127u                      /* longest tensor name, bytes */
#define CTL_STATEFILE_FAMILY_MAX 15u                     /* longest family name, bytes */
#define CTL_STATEFILE_MAX_STATE_BYTES ((uint64_t)1 << 34) /* most state bytes (16 GiB) */

/* Element type of a tensor; the on-disk code is the enum value. */
typedef enum ctl_statefile_dtype {
    CTL_STATEFILE_DTYPE_F32 = 1, /* IEEE-754 binary32, little-endian */
} ctl_statefile_dtype;

/* One entry of the tensor table: a named slice of the state bytes. */
typedef struct ctl_statefile_tensor {
    char name[CTL_STATEFILE_NAME_MAX + 1];   /* [A-Za-z0-9._-]+, unique in the table */
    ctl_statefile_dtype dtype;               /* element type */
    uint32_t ndim;                           /* dimensions used in shape, 1..MAX_DIMS */
    uint64_t shape[CTL_STATEFILE_MAX_DIMS];  /* extent of each dimension, each >= 1 */
    uint64_t offset;                         /* first byte within the state bytes */
    uint64_t nbytes;                         /* product(shape) * element size (derived) */
} ctl_statefile_tensor;

/* What a state file says about the state it carries. */
typedef struct ctl_statefile_hdr {
    uint32_t version;                          /* format version (read: from the file) */
    char family[CTL_STATEFILE_FAMILY_MAX + 1]; /* model family, [a-z0-9_-]+, e.g. "rwkv7" */
    char fingerprint[WK_SHA256_HEX_LEN];       /* model fingerprint, 64 lowercase hex */
    char tokenizer_digest[WK_SHA256_HEX_LEN];  /* tokenizer digest, 64 lowercase hex */
    char token_digest[WK_SHA256_HEX_LEN];      /* SHA-256 over ids as int64 LE, 64 hex */
    int32_t *tokens;                           /* token ids, each >= 0 (see ownership) */
    uint64_t n_tokens;                         /* entries in tokens, <= MAX_TOKENS */
    uint64_t state_bytes;                      /* bytes of state the tensors tile */
    ctl_statefile_tensor *tensors;             /* tensor table, in offset order */
    uint32_t n_tensors;                        /* entries in tensors, 1..MAX_TENSORS */
} ctl_statefile_hdr;

/*
 * Encodes a state file. Reads from h: family, fingerprint, tokenizer_digest,
 * tokens/n_tokens and tensors/n_tensors (all borrowed for the call; each
 * tensor's nbytes is recomputed, not trusted). h->version is ignored (the
 * file is version 1). h->token_digest, when not "", must equal the digest
 * of the tokens, and h->state_bytes, when not 0, must equal state_len: both
 * catch a record that disagrees with its state. The tensors must tile
 * [0, state_len) exactly, in order. On success *out is a heap buffer of
 * *out_len bytes that the caller frees with free(). Returns WK_EINVAL (bad
 * field, with a message naming it), WK_ETOOBIG (over a limit above),
 * WK_ENOMEM. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_statefile_write(const ctl_statefile_hdr *h, const void *state,
                                         size_t state_len, void **out, size_t *out_len,
                                         wk_diag *d);

/*
 * Decodes and verifies the state file [buf, buf + len). On success fills
 * *h_out (whose tokens and tensors are heap arrays owned by *h_out: release
 * them with ctl_statefile_hdr_fini()), and points *state_out at the state
 * bytes inside buf (borrowed: valid while buf is, 64-byte aligned when buf
 * is), with *state_len bytes. Nothing is written on failure. Returns
 * WK_EINVAL for a malformed or unsupported file (truncated, bad magic, other
 * format version, reserved bits set, bad lengths, bad family or digests,
 * negative token id, token digest mismatch, tensor table that does not tile
 * the state, non-zero padding; each with its own message), WK_ECORRUPT when
 * the checksum does not match, WK_ENOMEM. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_statefile_read(const void *buf, size_t len, ctl_statefile_hdr *h_out,
                                        const void **state_out, size_t *state_len, wk_diag *d);

/*
 * Frees the token and tensor arrays of a header filled by
 * ctl_statefile_read() and sets them to NULL. NULL-safe, idempotent. Not for
 * headers whose arrays the caller allocated itself.
 */
void ctl_statefile_hdr_fini(ctl_statefile_hdr *h);

/*
 * Builds the tensor table of an RWKV-7 slot (workerd/backend/be.h): n_layer
 * consecutive layer records of float32 att_shift[C], ffn_shift[C] and
 * wkv[H][N][N], named "layers.<i>.att_shift", "layers.<i>.ffn_shift" and
 * "layers.<i>.wkv". On success *out is a heap array of *n_out = 3 * n_layer
 * entries (caller frees with free()) and *state_bytes the bytes they tile
 * (n_layer * (2C + H*N*N) * 4). Returns WK_EINVAL for a zero argument,
 * WK_ETOOBIG when the table or the state would pass the limits above,
 * WK_ENOMEM. Thread-safe.
 */
WK_MUST_CHECK wk_err ctl_statefile_layout_rwkv7(uint32_t n_layer, uint32_t C, uint32_t H,
                                                uint32_t N, ctl_statefile_tensor **out,
                                                uint32_t *n_out, uint64_t *state_bytes,
                                                wk_diag *d);

/* Static name of a dtype ("F32"), or "?" for a value outside the enum. */
const char *ctl_statefile_dtype_name(ctl_statefile_dtype dt);

#endif /* CTL_STATEFILE_H */
