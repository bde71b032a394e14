/*
 * wk_bpe: the BPE tokenizers of Hugging Face `tokenizer.json` files, in two
 * modes, encoding exactly as the `tokenizers` library does with
 * add_special_tokens=False.
 *
 * Byte-level mode ("hf-bpe": GPT-2, GPT-NeoX, Llama-3 style). Supported, and
 * checked on load: model.type "BPE" with vocab, merges (both the "a b"
 * string and the ["a", "b"] array forms), ignore_merges; added tokens
 * (matched verbatim in the input before anything else, leftmost then
 * longest, non-normalized ones first as the library does); normalizer null or
 * NFC (a real NFC, from tables generated out of Python's unicodedata, see
 * tools/gen_unicode_tables.py); pre_tokenizer ByteLevel (add_prefix_space,
 * use_regex with the GPT-2 pattern), alone or as the only member of a
 * Sequence, or a Sequence of Split / Digits members ending in ByteLevel
 * (Qwen2, Qwen3.5, Llama-3, DeepSeek, StarCoder: run by wk_pretok, see
 * wk_pretok.h and docs/TOKENIZERS.md); decoder ByteLevel. A vocab may lack
 * the byte tokens no well-formed UTF-8 text needs (0xc0, 0xc1, 0xf1..0xff);
 * such a byte in the input is dropped, as `tokenizers` drops a character
 * the vocab cannot spell.
 *
 * SentencePiece-style mode ("hf-spm": Llama-1/2, Mistral, and models that
 * reuse their tokenizer such as fla-hub's), chosen when pre_tokenizer is
 * null or Metaspace. Two forms: the Llama-2 conversion (normalizer
 * Sequence[Prepend("\u2581"), Replace(" " -> "\u2581")], pre_tokenizer null:
 * every piece of text between added tokens gets a leading "\u2581", even one
 * that starts with a space, and is one word with no pre-tokenizer split), or
 * normalizer null with pre_tokenizer Metaspace (replacement "\u2581";
 * prepend_scheme "always", "first" (only the text at input offset 0) or
 * "never", or the older add_prefix_space; a piece already starting with a
 * space gets none; split true makes every "\u2581" start a word). Decoder
 * Sequence[Replace("\u2581" -> " "), ByteFallback, Fuse, Strip(" ", 1, 0)]
 * (Strip optional) or Metaspace. The model: characters (not bytes) are the
 * initial symbols; a character that is not a vocab key becomes the "<0xXX>"
 * tokens of its UTF-8 bytes when byte_fallback is set and all of them exist,
 * else model.unk_token (fuse_unk: a run of them is one unk); a byte that is
 * not part of well-formed UTF-8 is a character of its own (so it falls back
 * to its "<0xXX>"). The load refuses a file where some input could be
 * encoded to nothing (the library drops such characters): it needs
 * byte_fallback with all 256 byte tokens, or an unk_token in the vocab.
 * Normalized added tokens are matched in the normalized text, their content
 * normalized the same way. A piece (wk_bpe_piece) is the token's real bytes:
 * "\u2581" reads as a space and "<0xXX>" as that byte, so the pieces of
 * encode(x) concatenate to x with a space added in front of each piece of
 * text (Llama-2 form: also before one that already starts with a space);
 * wk_bpe_strips_space() says when decoders drop the first one.
 *
 * Both modes ignore the post_processor: encode never adds BOS/EOS (the
 * Llama files' TemplateProcessing would put "<s>" first; callers that want
 * it, e.g. a chat template, write it). In byte-level mode an added token
 * may have lstrip / rstrip: it takes the white space (Unicode White_Space)
 * before it, back to the previous added token, or after it, as the library
 * does; and single_word: no token where a word character (Rust regex's \w,
 * see wk_pretok_wordchar_is()) touches the match. Everything else (other
 * model types, normalizers, pre-tokenizers, decoders, dropout, subword
 * prefixes, byte_fallback in byte-level mode, single_word / lstrip /
 * rstrip in hf-spm mode) is refused with a diag naming the JSON path, e.g. `tokenizer.json:
 * pre_tokenizer.type "Whitespace" is not supported`.
 *
 * Input text is any bytes: valid UTF-8 is handled as Unicode; in byte-level
 * mode a byte that is not part of a well-formed UTF-8 character is kept as
 * that raw byte and passes NFC unchanged; for the GPT-2 split it counts as
 * "other" (neither letter, number nor space), for a regex pre-tokenizer it
 * is a word of its own and the text around it is split as separate texts.
 * So decode(encode(x)) == x whenever NFC(x) == x and no Split removes text
 * and the vocab has every byte.
 *
 * The file is hostile input: its size, every id (unique, <= WK_TOK_MAX_ID),
 * every token (maps back to bytes through the byte-level alphabet, or in
 * hf-spm as described above, at most WK_TOK_MAX_PIECE bytes), every merge
 * (both halves and their concatenation in the vocab), every byte of the
 * alphabet (each needs a token; hf-spm: the fallback/unk cover rule above)
 * and every component's parameters are checked. A loaded wk_bpe is
 * immutable: any number of threads may encode with it at once. Nothing here
 * logs or keeps global state.
 */
#ifndef WK_BPE_H
#define WK_BPE_H

#include <stdbool.h>
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

/* "hf-bpe" (byte-level mode) or "hf-spm" (SentencePiece-style mode), static. */
const char *wk_bpe_kind(const wk_bpe *b);

/*
 * True when the file's decoder drops one leading space of the decoded text
 * (hf-spm with Strip(" ", 1, 0), or Metaspace with a prepend scheme), undoing
 * the "\u2581" put in front at encode. Always false in byte-level mode.
 */
bool wk_bpe_strips_space(const wk_bpe *b);

/*
 * Bytes of token id, borrowed until wk_bpe_free(b): byte-level mode, a vocab
 * token's bytes through the byte-level alphabet; hf-spm, the vocab key with
 * "\u2581" as a space, or the byte of a "<0xXX>" key. An added token's
 * content (hf-spm: normalized if it is a normalized one, "\u2581" as a
 * space). *len is set. An undefined id gives NULL and *len = 0.
 */
const uint8_t *wk_bpe_piece(const wk_bpe *b, int32_t id, size_t *len);

/* True when id is one of the file's added tokens (special or not). */
bool wk_bpe_is_added(const wk_bpe *b, int32_t id);

/*
 * Id of the token written s (n bytes) in the file: an added token's content
 * first (hf-spm Llama-2 form: a normalized one by its normalized content),
 * else a vocab key (as written in the JSON: byte-level alphabet, or "\u2581").
 * -1 when there is none.
 */
int32_t wk_bpe_find(const wk_bpe *b, const char *s, size_t n);

/*
 * Encodes len bytes of text (any bytes). On success *ids is a malloc'd array
 * of *n_ids ids (never NULL, even for empty input), caller frees with free().
 * Returns WK_OK, WK_ENOMEM or WK_ETOOBIG (input too large to index, or a
 * regex pre-tokenizer's match limit reached, WK_PRETOK_MATCH_LIMIT); with a
 * hostile pattern also WK_EINVAL (a PCRE2 match error, named in d).
 * Thread-safe on a shared b.
 */
WK_MUST_CHECK wk_err wk_bpe_encode(const wk_bpe *b, const char *text, size_t len, int32_t **ids,
                                   size_t *n_ids, wk_diag *d);

/*
 * Encodes text[start..len) as the continuation of text[0..start), for a
 * caller that keeps the tokens of text[0..start) and feeds only the rest.
 * Byte-level mode: exactly wk_bpe_encode(text + start, len - start). hf-spm:
 * as wk_bpe_encode() except for the "\u2581" mark in front of the first
 * piece, which is put there only when the whole text's encoding would put
 * one there: start == 0 (the input start), or, in the Llama-2 form, right
 * after a non-normalized added token in text[0..start), and with Metaspace
 * "always", right after any added token (and then, as always, not before a
 * space). Otherwise the text continues a run, spaces still become "\u2581",
 * and nothing is prepended; "first" never prepends when start > 0. Added
 * tokens are found in text[0..start) and in the rest separately: one that
 * straddles start is none, and the tokens may differ from a whole-text
 * encoding at start as they may for any BPE split. text is borrowed for the
 * call. On success *ids is malloc'd (*n_ids ids, never NULL), caller frees
 * with free(). Returns WK_OK; WK_EINVAL when start > len; WK_ENOMEM;
 * WK_ETOOBIG. Thread-safe on a shared b.
 */
WK_MUST_CHECK wk_err wk_bpe_encode_continue(const wk_bpe *b, const char *text, size_t len,
                                            size_t start, int32_t **ids, size_t *n_ids,
                                            wk_diag *d);

/*
 * Whether n ids (borrowed) are an encoding of the first bytes of text (len
 * bytes, borrowed), as kept tokens followed by wk_bpe_encode_continue()
 * produce it: the pieces of the ids, in order, must be the start of text,
 * except that the space the hf-spm mark reads as, at the start of a run the
 * encoder marks, is not in the text: a run starts at ids[0] and, as at
 * wk_bpe_encode_continue(), after a non-normalized added token (Llama-2
 * form) or any added token (Metaspace "always"). There the first piece's
 * leading space is dropped, always in the Llama-2 form (its Prepend is
 * unconditional), and in the Metaspace form when the text has no space at
 * that point (a run that began with a space got no mark). Byte-level mode:
 * the pieces, unchanged. Ids equal to hidden (when >= 0; the end-of-text a
 * template never renders) are skipped and do not end a run. On a match sets
 * *bytes to the bytes of text covered and returns true; false when an id is
 * undefined or a piece differs. Thread-safe.
 */
bool wk_bpe_text_prefix(const wk_bpe *b, const int32_t *ids, size_t n, int32_t hidden,
                        const char *text, size_t len, size_t *bytes);

#endif /* WK_BPE_H */
