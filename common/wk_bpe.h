/*
 * wk_bpe: the byte-level BPE tokenizer of Hugging Face `tokenizer.json`
 * files (GPT-2, GPT-NeoX, Llama-3 style), encoding exactly as the
 * `tokenizers` library does with add_special_tokens=False.
 *
 * Supported, and checked on load: model.type "BPE" with vocab, merges (both
 * the "a b" string and the ["a", "b"] array forms), ignore_merges; added
 * tokens (matched verbatim in the input before anything else, leftmost then
 * longest, non-normalized ones first as the library does); normalizer null or
 * NFC (a real NFC, from tables generated out of Python's unicodedata, see
 * tools/gen_unicode_tables.py); pre_tokenizer ByteLevel (add_prefix_space,
 * use_regex with the GPT-2 pattern), alone or as the only member of a
 * Sequence; decoder ByteLevel. The post_processor is ignored: encode never
 * adds BOS/EOS. Everything else (other model types, normalizers,
 * pre-tokenizers, decoders, dropout, subword prefixes, byte_fallback,
 * lstrip/rstrip/single_word added tokens) is refused with a diag naming the
 * JSON path, e.g. `tokenizer.json: pre_tokenizer.type "Whitespace" is not
 * supported`.
 *
 * Input text is any bytes: valid UTF-8 is handled as Unicode; a byte that is
 * not part of a well-formed UTF-8 character is kept as that raw byte, counts
 * as "other" (neither letter, number nor space) for the pre-tokenizer, and
 * passes NFC unchanged, so decode(encode(x)) == x whenever NFC(x) == x.
 *
 * The file is hostile input: its size, every id (unique, <= WK_TOK_MAX_ID),
 * every token (maps back to bytes through the byte-level alphabet, at most
 * WK_TOK_MAX_PIECE bytes), every merge (both halves and their concatenation
 * in the vocab) and every byte of the alphabet (each needs a token) are
 * checked. A loaded wk_bpe is immutable: any number of threads may encode
 * with it at once. Nothing here logs or keeps global state.
 */
#ifndef WK_BPE_H
#define WK_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"

#define WK_BPE_MAX_FILE (64u << 20)  /* bytes in a tokenizer.json (Llama-3's: 9 MB) */
#define WK_BPE_MAX_MERGES (4u << 20) /* merges in one file */
#define WK_BPE_MAX_ADDED 65536       /* added tokens in one file */

typedef struct wk_bpe wk_bpe;

/*
 * Parses len bytes at buf (borrowed for the call) as a tokenizer.json. label
 * starts every diag (NULL: "tokenizer.json"). On success *out is a new
 * tokenizer, freed with wk_bpe_free(). Returns WK_OK; WK_ETOOBIG over
 * WK_BPE_MAX_FILE (or another WK_BPE_MAX_*); WK_EINVAL for malformed JSON or a
 * bad value; WK_ENOTSUP for a well-formed but unsupported component;
 * WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_bpe_load_mem(const void *buf, size_t len, const char *label, wk_bpe **out,
                                     wk_diag *d);

/* Frees a tokenizer. NULL-safe. */
void wk_bpe_free(wk_bpe *b);

/* Largest defined id + 1. */
uint32_t wk_bpe_vocab_size(const wk_bpe *b);

/* Number of distinct ids defined (vocab and added tokens together). */
uint32_t wk_bpe_count(const wk_bpe *b);

/*
 * Bytes of token id, borrowed until wk_bpe_free(b): a vocab token's bytes
 * through the byte-level alphabet, an added token's content. *len is set.
 * An undefined id gives NULL and *len = 0.
 */
const uint8_t *wk_bpe_piece(const wk_bpe *b, int32_t id, size_t *len);

/*
 * Id of the token written s (n bytes) in the file: an added token's content
 * first, else a vocab key (as written in the JSON, byte-level alphabet).
 * -1 when there is none.
 */
int32_t wk_bpe_find(const wk_bpe *b, const char *s, size_t n);

/*
 * Encodes len bytes of text (any bytes). On success *ids is a malloc'd array
 * of *n_ids ids (never NULL, even for empty input), caller frees with free().
 * Returns WK_OK, WK_ENOMEM or WK_ETOOBIG (input too large to index).
 * Thread-safe on a shared b.
 */
WK_MUST_CHECK wk_err wk_bpe_encode(const wk_bpe *b, const char *text, size_t len, int32_t **ids,
                                   size_t *n_ids, wk_diag *d);

#endif /* WK_BPE_H */
