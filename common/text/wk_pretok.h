/*
 * wk_pretok: the regex pre-tokenizers of Hugging Face byte-level BPE
 * tokenizer.json files (Qwen2, Qwen3.5, Llama-3, DeepSeek, StarCoder,
 * GPT-4o-style patterns), splitting text into the words BPE then runs on,
 * exactly as the `tokenizers` library splits it.
 *
 * Supported: a Sequence of Split and Digits members ending in one ByteLevel
 * (add_prefix_space false; use_regex true or false), or a lone Split.
 *  - Split: pattern {"Regex": r} or {"String": s}, behavior Isolated,
 *    Removed, MergedWithPrevious, MergedWithNext or Contiguous, invert.
 *  - Digits: individual_digits true (each \p{N} alone) or false (runs).
 *  - ByteLevel use_regex true: the GPT-2 pattern as a Split Isolated.
 * `tokenizers` compiles patterns with Oniguruma; here they are compiled with
 * PCRE2 (PCRE2_UTF | PCRE2_UCP, ^ and $ at line ends as in Oniguruma's
 * default syntax, JIT when available), whose syntax agrees with Oniguruma's
 * on the constructs these tokenizers use. Escapes whose meaning differs
 * between the two (\h \v \w \W \b \B \K \R \X \G \u and the like) are
 * refused at load rather than guessed, as is every other component (Punctuation,
 * Whitespace, Metaspace, add_prefix_space true in a Sequence, a pre-tokenizer
 * after ByteLevel). Empty matches advance as Oniguruma's find_iter does.
 * Each stage runs on each piece the previous one produced, as a subject of
 * its own (lookarounds, ^ and $ see that piece only); empty pieces vanish.
 *
 * Invalid UTF-8: `tokenizers` only ever sees Rust strings. Here the input is
 * any bytes: it is cut into maximal well-formed UTF-8 runs and the bytes
 * between them; each run is pre-tokenized as if it were the whole text, and
 * each byte outside well-formed UTF-8 is a word of its own. So the words of
 * valid text are those `tokenizers` gives.
 *
 * Patterns come from a hostile file: compile errors are refused with the
 * offset, every match attempt is bounded by a match limit that grows with
 * the piece (linear backtracking over a run passes, exponential stops), and
 * a match that hits it fails the encode (WK_ETOOBIG) instead of running away. A loaded wk_pretok
 * is immutable and any number of threads may split with it at once. This
 * module is the only one that touches PCRE2, and it never logs.
 */
#ifndef WK_PRETOK_H
#define WK_PRETOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"

#define WK_PRETOK_MAX_STAGES 16       /* members of a Sequence */
#define WK_PRETOK_MAX_PATTERN 4096    /* bytes in one pattern */
#define WK_PRETOK_MATCH_LIMIT 1000000 /* PCRE2 match limit per match attempt, plus: */
#define WK_PRETOK_MATCH_PER_BYTE 16u  /* ... this much per byte of the piece matched in */

typedef struct wk_pretok wk_pretok;

/*
 * Builds a pre-tokenizer from the pre_tokenizer object of a tokenizer.json
 * as JSON text (json, len bytes, borrowed for the call). path names it in
 * diags (e.g. "tokenizer.json: pre_tokenizer"). On success *out is new,
 * freed with wk_pretok_free(). Returns WK_OK; WK_EINVAL for malformed JSON,
 * a bad value or a pattern PCRE2 refuses; WK_ENOTSUP for a component or
 * escape that is not supported (the diag names the JSON path); WK_ETOOBIG
 * for too many members or too long a pattern; WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_pretok_new(const char *json, size_t len, const char *path, wk_pretok **out,
                                   wk_diag *d);

/* Frees a pre-tokenizer. NULL-safe. */
void wk_pretok_free(wk_pretok *p);

/*
 * Receives one word: n > 0 bytes at w, borrowed for the call. Returns false
 * to stop the split (wk_pretok_split() then returns WK_ENOMEM).
 */
typedef bool (*wk_pretok_word_fn)(void *ctx, const uint8_t *w, size_t n);

/*
 * Splits n bytes at s (any bytes, borrowed for the call) into words and
 * calls fn(ctx, ...) with each, in order; the words concatenate to s less
 * what a Removed behavior drops. Returns WK_OK; WK_ENOMEM (also when fn
 * returns false); WK_ETOOBIG when a match runs into its limit
 * (WK_PRETOK_MATCH_LIMIT + WK_PRETOK_MATCH_PER_BYTE per byte of the piece)
 * or n is too large (a piece over about 268 MB); WK_EINVAL for another
 * PCRE2 match error (named in d). Thread-safe on a shared p.
 */
WK_MUST_CHECK wk_err wk_pretok_split(const wk_pretok *p, const uint8_t *s, size_t n,
                                     wk_pretok_word_fn fn, void *ctx, wk_diag *d);

/*
 * Word characters as `tokenizers` tests them for single_word added tokens
 * (Rust regex's \w: Alphabetic, marks, decimal digits, connector
 * punctuation, Join_Control), read with PCRE2's Unicode tables.
 */
typedef struct wk_pretok_wordchar wk_pretok_wordchar;

/*
 * Compiles the word-character class. On success *out is new, freed with
 * wk_pretok_wordchar_free(). Returns WK_OK or WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_pretok_wordchar_new(wk_pretok_wordchar **out, wk_diag *d);

/* Frees it. NULL-safe. */
void wk_pretok_wordchar_free(wk_pretok_wordchar *w);

/*
 * Whether s[0..n) is exactly one well-formed UTF-8 character and a word
 * character; false otherwise (also when out of memory). s is borrowed for
 * the call. Thread-safe on a shared w.
 */
bool wk_pretok_wordchar_is(const wk_pretok_wordchar *w, const uint8_t *s, size_t n);

#endif /* WK_PRETOK_H */
