/*
 * wk_tok: the tokenizer, of one of three kinds behind the same functions:
 *  - "world": the RWKV World tokenizer. Loads a vocab file in the format of
 *    rwkv_vocab_v20230424.txt (one `<id> <python str or bytes literal> <byte
 *    length>` per line), encodes bytes to token ids by greedy longest match on
 *    a byte trie (exactly what the reference TRIE_TOKENIZER does). Id 0 is
 *    end-of-text and decodes to nothing.
 *  - "hf-bpe": a Hugging Face tokenizer.json with a byte-level BPE model
 *    (GPT-NeoX for Mamba2, GPT-2, Llama-3, Qwen2/Qwen3.5, DeepSeek,
 *    StarCoder style), see wk_bpe.h for what is supported, or the
 *    byte-level BPE of a GGUF's metadata (wk_tok_load_gguf()). Every id is
 *    an ordinary token; end-of-text is wk_tok_eos().
 *  - "hf-spm": a Hugging Face tokenizer.json with a SentencePiece-style BPE
 *    model (Llama-2 / Mistral: "\u2581" for spaces, byte fallback to
 *    "<0xXX>", unk), see wk_bpe.h. As hf-bpe otherwise; BOS ("<s>") is
 *    never added by encode. Pieces are real bytes ("\u2581" is a space,
 *    "<0xXX>" that byte), and encode puts a space in front of each piece of
 *    text (between added tokens), which wk_tok_decode() drops again at the
 *    very start but the stream decoder does not, see there. A caller that
 *    keeps tokens and feeds only new text matches kept tokens with
 *    wk_tok_text_prefix() (which knows that space is no text) and encodes
 *    the rest with wk_tok_encode_continue() (no space put in front mid-text).
 * Both decode ids back to bytes, and turn a stream of token ids into text
 * that never ends in half a UTF-8 character.
 *
 * Tokenizer files are treated as hostile input: everything is checked, every
 * size is bounded (WK_TOK_MAX_*, WK_BPE_MAX_*), and a bad file is refused
 * with a diag that names the line or the JSON path. A loaded wk_tok is
 * immutable, so any number of threads may encode and decode with it at once.
 * This module never logs.
 */
#ifndef WK_TOK_H
#define WK_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"

#define WK_TOK_EOT 0                /* World end-of-text token id: decodes to nothing */
#define WK_TOK_MAX_LINE 8192        /* bytes per vocab line, line ending excluded */
#define WK_TOK_MAX_PIECE 1024       /* bytes in one token */
#define WK_TOK_MAX_ID 1048575       /* largest token id, so vocab size <= 2^20 */
#define WK_TOK_MAX_FILE (16u << 20) /* bytes in a vocab file (the real one: 1.1 MiB) */

/* Output bytes a stream push may need for a token (see wk_tok_stream_push). */
#define WK_TOK_STREAM_OUT_MAX (3 * (WK_TOK_MAX_PIECE + 3))
/* Output bytes a stream flush may need: one U+FFFD. */
#define WK_TOK_STREAM_FLUSH_MAX 3

typedef struct wk_tok wk_tok;

/*
 * Loads the vocab file at path. On success *out is a new tokenizer, freed
 * with wk_tok_free(). Accepted format, one token per line (LF or CRLF):
 *   <id> <literal> <length>
 * id: decimal, 1..WK_TOK_MAX_ID, unique (0 is end-of-text and implicit).
 * literal: a Python str ('..' / "..", optional u prefix, UTF-8 encoded) or
 *   bytes (b'..' / b"..") literal with Python's escapes: \\ \' \" \a \b \f
 *   \n \r \t \v \xHH \ooo, and in str only \uXXXX \UXXXXXXXX. \N{...},
 *   escapes Python would keep verbatim (\q), surrogates, octal over \377 in
 *   bytes, raw non-ASCII in bytes, invalid raw UTF-8, NUL, and empty tokens
 *   are refused. At most WK_TOK_MAX_PIECE bytes once decoded.
 * length: decimal, must equal the decoded byte length.
 * Every byte value 0..255 must have a single-byte token. When two ids have
 * the same bytes, encoding picks the later line (as the reference does);
 * decoding knows both. Lines are at most WK_TOK_MAX_LINE bytes, the file
 * at most WK_TOK_MAX_FILE.
 * Returns WK_OK; WK_ENOENT / WK_EIO when the file can't be read; WK_ETOOBIG
 * when it is over WK_TOK_MAX_FILE; WK_EINVAL for a malformed file, with d
 * reading "vocab line N: ..."; WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_tok_load(const char *path, wk_tok **out, wk_diag *d);

/*
 * Same as wk_tok_load() over len bytes at buf (borrowed for the call only).
 * The digest is that of these bytes.
 */
WK_MUST_CHECK wk_err wk_tok_load_mem(const void *buf, size_t len, wk_tok **out, wk_diag *d);

/*
 * Loads a Hugging Face tokenizer.json at path (at most WK_BPE_MAX_FILE bytes)
 * as an "hf-bpe" or "hf-spm" tokenizer. The end-of-text id comes from the
 * `eos_token` of a tokenizer_config.json in the same directory when that
 * file exists (a string or {"content": ...}; null: none), else from the token
 * `<|endoftext|>`, else `</s>`, else there is none (wk_tok_eos() < 0).
 * On success *out is freed with wk_tok_free(). Returns WK_OK; WK_ENOENT /
 * WK_EIO when a file can't be read; WK_ETOOBIG; WK_EINVAL for a malformed
 * file (also an eos_token that is no token); WK_ENOTSUP for an unsupported
 * component, each with d naming the file and the JSON path; WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_tok_load_hf(const char *path, wk_tok **out, wk_diag *d);

/*
 * Same as wk_tok_load_hf() over len bytes of tokenizer.json at buf, with the
 * optional tokenizer_config.json as cfg/cfg_len (cfg NULL: no such file).
 * Both are borrowed for the call only. The digest is that of buf.
 */
WK_MUST_CHECK wk_err wk_tok_load_hf_mem(const void *buf, size_t len, const void *cfg,
                                        size_t cfg_len, wk_tok **out, wk_diag *d);

/*
 * Loads the tokenizer stored in the metadata of the GGUF file at path, as
 * llama.cpp's convert_hf_to_gguf.py writes it:
 *  - tokenizer.ggml.model "rwkv" (tokenizer.ggml.tokens: "<s>" at id 0,
 *    then the vocab file's tokens as the body of Python's repr() of their
 *    bytes, then "[PAD<id>]" fillers up to the model's vocab size): the
 *    tokenizer wk_tok_load() builds from the vocab file the converter read
 *    (same ids, bytes and encoding); id 0 and the fillers are not tokens.
 *    Its digest is that of the equivalent vocab text (one
 *    `<id> b'\xHH..' <length>` line per token), not of the GGUF file.
 *  - tokenizer.ggml.model "gpt2" (byte-level BPE: tokens, token_type,
 *    merges, tokenizer.ggml.pre): an "hf-bpe" tokenizer built from the
 *    equivalent tokenizer.json, with the normalizer and pre-tokenizer of
 *    the Hugging Face tokenizer that tokenizer.ggml.pre names (gpt-2, mpt,
 *    starcoder, refact, command-r, llama-bpe, qwen2, qwen35, gpt-4o,
 *    deepseek-coder, deepseek-llm; see docs/TOKENIZERS.md); CONTROL and
 *    USER_DEFINED tokens are added tokens, end-of-text is
 *    tokenizer.ggml.eos_token_id. Its digest is that of that tokenizer.json.
 * On success *out is freed with wk_tok_free(). Returns the codes of
 * wk_gguf_open(), WK_ENOENT (no tokenizer.ggml.model), WK_ENOTSUP (another
 * tokenizer model; a "gpt2" one without tokenizer.ggml.pre or with one not
 * listed above, named), WK_EINVAL (a token the converter cannot have
 * written, named by its index; or a vocab the loaders refuse), WK_ENOMEM;
 * the diag starts with path.
 */
WK_MUST_CHECK wk_err wk_tok_load_gguf(const char *path, wk_tok **out, wk_diag *d);

/*
 * Finds the one regular *.gguf file in dir. On success *path is malloc'd
 * (caller frees with free()). Returns WK_ENOENT (dir unreadable or no such
 * file), WK_EINVAL (more than one), WK_EIO, WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_tok_find_gguf(const char *dir, char **path, wk_diag *d);

/*
 * Loads the tokenizer of a model directory. With override_path (borrowed,
 * may be NULL): a path ending in ".json" is loaded with wk_tok_load_hf(),
 * one ending in ".gguf" with wk_tok_load_gguf(), any other with
 * wk_tok_load(). Without: DIR/tokenizer.json if it exists, else
 * DIR/rwkv_vocab_v20230424.txt, else the token list in the metadata of the
 * one DIR/ *.gguf when there is one (wk_tok_load_gguf()), else WK_ENOENT
 * with a diag naming the files looked for. Returns what the loader returns.
 */
WK_MUST_CHECK wk_err wk_tok_load_dir(const char *dir, const char *override_path, wk_tok **out,
                                     wk_diag *d);

/* Frees a tokenizer. NULL-safe. */
void wk_tok_free(wk_tok *t);

/* "world", "hf-bpe" or "hf-spm" (wk_bpe_kind()), static. */
const char *wk_tok_kind(const wk_tok *t);

/*
 * The end-of-text id a generation stops at: WK_TOK_EOT for World; for HF as
 * described at wk_tok_load_hf(); -1 when the tokenizer has none (never stop
 * on end-of-text).
 */
int32_t wk_tok_eos(const wk_tok *t);

/* Largest defined id + 1 (so ids are < this; some below may be undefined). */
uint32_t wk_tok_vocab_size(const wk_tok *t);

/* Number of tokens defined by the file (World: end-of-text not counted). */
uint32_t wk_tok_count(const wk_tok *t);

/*
 * Encodes len bytes of text (any bytes, not only UTF-8; NUL is an ordinary
 * byte). World: by greedy longest match, at each position the longest token
 * whose bytes match is taken. HF: as `tokenizers` does without special tokens
 * added (wk_bpe_encode()). On success *ids is a malloc'd array of *n_ids ids
 * (never NULL, even for empty input), caller frees with free(). World never
 * emits end-of-text; HF emits an added token (end-of-text included) wherever
 * its content appears verbatim in text. Returns WK_OK, WK_ENOMEM, or WK_ETOOBIG when len is too large
 * to index. Thread-safe on a shared t.
 */
WK_MUST_CHECK wk_err wk_tok_encode(const wk_tok *t, const char *text, size_t len, int32_t **ids,
                                   size_t *n_ids, wk_diag *d);

/*
 * Encodes text[start..len) as the continuation of text[0..start), whose
 * tokens the caller already has (a parked state), so that the kept tokens
 * plus these read as the whole text (wk_tok_text_prefix()). World and
 * hf-bpe: exactly wk_tok_encode(text + start, len - start). hf-spm: no
 * "\u2581" is put in front unless the whole text's encoding would put one
 * at start (the text start; after an added token in the Llama-2 form and
 * with Metaspace "always"), spaces still become "\u2581"; see
 * wk_bpe_encode_continue(). Tokens at the boundary may differ from encoding
 * the whole text, as for any BPE split. text is borrowed for the call;
 * ownership, returns and threading as wk_tok_encode(), plus WK_EINVAL when
 * start > len.
 */
WK_MUST_CHECK wk_err wk_tok_encode_continue(const wk_tok *t, const char *text, size_t len,
                                            size_t start, int32_t **ids, size_t *n_ids,
                                            wk_diag *d);

/*
 * Whether the n ids (borrowed) read as the first bytes of text (len bytes,
 * borrowed): the text the encoder saw, not the decoded text. World and
 * hf-bpe: the pieces of the ids concatenated are a prefix of text. hf-spm:
 * the same, except that the space of the "\u2581" the encoder puts in front
 * of a run (at ids[0], and after an added token where the tokenizer's form
 * marks again) is not in the text; see wk_bpe_text_prefix() for the rules.
 * Ids equal to hidden (when >= 0, e.g. wk_tok_eos(): an end-of-text the
 * text never shows) are skipped. On a match sets *bytes to the bytes of
 * text covered and returns true; false on a mismatch or an undefined id.
 * Thread-safe.
 */
bool wk_tok_text_prefix(const wk_tok *t, const int32_t *ids, size_t n, int32_t hidden,
                        const char *text, size_t len, size_t *bytes);

/*
 * Concatenates the bytes of n ids (World end-of-text adds nothing); hf-spm
 * whose decoder strips (wk_bpe_strips_space()) then drops one leading space
 * of the whole text, as the `tokenizers` decoder does, so decode(encode(x))
 * == x for text that has no added token in it (Llama-2 form: any such text;
 * Metaspace form: text not starting with a space, whose space is lost as in
 * the library). Text after an added token keeps the space encode put in
 * front of it ("a<s>b" comes back "a<s> b", as in the library). On success
 * *out is malloc'd, *out_len bytes plus a NUL terminator (the bytes may hold
 * NULs or invalid UTF-8), caller frees with free(). Returns WK_OK; WK_EINVAL
 * naming the index of an id the vocab doesn't define; WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_tok_decode(const wk_tok *t, const int32_t *ids, size_t n, char **out,
                                   size_t *out_len, wk_diag *d);

/*
 * Bytes of one token, borrowed until wk_tok_free(t); *len is set. World
 * end-of-text gives a non-NULL pointer and *len = 0. HF: a vocab token's
 * bytes through the byte-level alphabet, an added token's content; hf-spm:
 * "\u2581" as a space, "<0xXX>" as that byte (see wk_bpe_piece()). An
 * undefined id gives NULL, *len = 0.
 */
const uint8_t *wk_tok_piece(const wk_tok *t, int32_t id, size_t *len);

/*
 * True when id is an added token of an HF tokenizer (special or not:
 * <|im_end|>, <think>, <tool_call>, ...; from GGUF, a CONTROL or
 * USER_DEFINED token). World vocabs have none.
 */
bool wk_tok_is_added(const wk_tok *t, int32_t id);

/*
 * Lowercase hex SHA-256 of the vocab file (World) or tokenizer.json (HF)
 * bytes, borrowed until wk_tok_free(t).
 */
const char *wk_tok_digest(const wk_tok *t);

/*
 * Incremental, UTF-8-safe decoder for generated tokens. Bytes are held back
 * only while they form a valid, still incomplete UTF-8 character, so the
 * output is always valid UTF-8 and never half a character. Invalid bytes
 * become U+FFFD, one per maximal invalid subpart (the Unicode recommendation,
 * and what Python's bytes.decode('utf-8', 'replace') does): the concatenated
 * output of pushes and the final flush equals that of decoding all bytes at
 * once with replacement. A byte that can neither start nor continue a
 * character is replaced at once, so nothing stalls. hf-spm: pieces are
 * streamed as they are, no leading space is stripped (a generation
 * continues a prompt, where the space of its first "\u2581word" token is
 * real text: HF's incremental detokenizers keep it too); only
 * wk_tok_decode() strips, and a caller streaming from the very start of a
 * text would see the encoder's leading space as the first output byte.
 * The struct is plain
 * data: no fini needed; one stream per generation, not shared by threads.
 */
typedef struct wk_tok_stream {
    const wk_tok *tok; /* borrowed vocabulary, may be NULL for push_bytes only */
    uint8_t pend[4];   /* bytes of the incomplete character held back */
    uint8_t npend;     /* bytes used in pend (0..3) */
    uint8_t need;      /* full length of the held character (2..4), 0 if none */
} wk_tok_stream;

/* Starts an empty stream over t (borrowed until the stream is dropped). */
void wk_tok_stream_init(wk_tok_stream *s, const wk_tok *t);

/*
 * Feeds token id. Writes the text completed so far to out (cap bytes, no NUL
 * added) and sets *out_len. At most 3 * (held + piece length) bytes are
 * written, so cap >= WK_TOK_STREAM_OUT_MAX always suffices. World end-of-text
 * adds nothing (call flush at the end of generation). Returns WK_OK; WK_EINVAL for
 * an id the vocab doesn't define; WK_ETOOBIG when cap might be too small; the
 * stream is unchanged on failure.
 */
WK_MUST_CHECK wk_err wk_tok_stream_push(wk_tok_stream *s, int32_t id, char *out, size_t cap,
                                        size_t *out_len, wk_diag *d);

/*
 * Feeds raw bytes, as push does for one token. cap >= 3 * (n + 3) always
 * suffices. Returns WK_OK or WK_ETOOBIG (stream unchanged).
 */
WK_MUST_CHECK wk_err wk_tok_stream_push_bytes(wk_tok_stream *s, const uint8_t *bytes, size_t n,
                                              char *out, size_t cap, size_t *out_len);

/*
 * Ends the stream: a held incomplete character becomes one U+FFFD. Writes at
 * most WK_TOK_STREAM_FLUSH_MAX bytes to out and returns how many. The stream
 * is empty afterwards and may be reused.
 */
size_t wk_tok_stream_flush(wk_tok_stream *s, char out[WK_TOK_STREAM_FLUSH_MAX]);

/* Bytes currently held back (0..3). */
size_t wk_tok_stream_pending(const wk_tok_stream *s);

#endif /* WK_TOK_H */
