/*
 * wk_grammar: constrained decoding of tool calls. A grammar is compiled
 * from (call format, the request's OpenAI `tools`, the forced function or
 * "any offered one", parallel calls) into a table of nodes; a matcher walks
 * it byte by byte with a small stack of frames (a pushdown matcher, no
 * backtracking: every choice in the grammar is decided by the next byte), and
 * the set of vocab tokens whose bytes the matcher can take next is found by
 * walking a trie of the vocab's byte strings alongside it, so one step costs
 * the trie nodes that are still alive, not vocab x token length.
 *
 * What the grammar admits (docs/OPENAI_COMPAT.md, "Constrained tool calls"):
 * one call (or, with parallel, one or more separated by "\n") to an offered
 * function, in the format's exact bytes, with arguments of the declared
 * schema: an object with the declared properties only, each at most once and
 * in any order, every required one present; values of type string, number,
 * integer, boolean, null, object, array (with items), enum of scalars (const:
 * an enum of its one value), or a list of these types. JSON whitespace between tokens is free up to
 * WK_GRAMMAR_WS_MAX bytes in a row; numbers have at most 16 integer digits,
 * 16 fraction digits and 3 exponent digits; "\u" escapes name a character
 * other than NUL and a surrogate; strings are valid UTF-8. Constructs it does
 * not enforce (anyOf, $ref, pattern, minimum, ...) are refused at compile
 * time with WK_EINVAL naming the keyword and where it is. Annotations
 * (description, title, default, examples, format, $schema) are ignored.
 *
 * Threading: a grammar and a vocab are immutable once built and may be
 * shared; a matcher belongs to one thread at a time. Never logs.
 */
#ifndef WK_GRAMMAR_H
#define WK_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"
#include "wk_toolcall.h"

#define WK_GRAMMAR_WS_MAX 8       /* JSON whitespace bytes in a row */
#define WK_GRAMMAR_DEPTH_MAX 16   /* schema nesting (objects and arrays) */
#define WK_GRAMMAR_PROPS_MAX 64   /* properties of one object */
#define WK_GRAMMAR_TOOLS_MAX 128  /* offered functions */
#define WK_GRAMMAR_NAME_MAX 64    /* bytes of a function or property name */


/*
 * The bytes of a call are the format's (wk_toolcall.h): WK_TOOLCALL_FMT_XML,
 * HERMES, GRANITE (Hermes's bytes) and NEMOTRON. In the XML format a value is
 * raw text (valid UTF-8, without "</parameter>", "</function>" or
 * "</tool_call>", which would end the call for the reply parser, its last
 * byte a "\n" separator) for a parameter whose type allows a string or an enum of
 * strings, else JSON. The JSON formats print the envelope exactly as the
 * templates do and leave JSON whitespace inside ARGS free.
 */
typedef struct wk_grammar_spec {
    wk_toolcall_fmt format;   /* not NONE */
    const char *tools;        /* the request's `tools` array as JSON text */
    size_t tools_len;         /* bytes */
    const char *function;     /* a named tool_choice, NULL = any offered function */
    bool parallel;            /* one or more calls, joined as the format joins them */
    /*
     * When the prompt leaves the model inside a reasoning block: free text
     * up to and including this marker first (e.g. "</think>"), then optional
     * whitespace before the call. NULL = the call comes first.
     */
    const char *prefix_until;
} wk_grammar_spec;

typedef struct wk_grammar wk_grammar;
typedef struct wk_gmatch wk_gmatch;
typedef struct wk_gvocab wk_gvocab;

/*
 * Compiles spec. WK_EINVAL with the reason in d (a schema keyword it does
 * not enforce and where, a bad name, a function not offered, limits),
 * WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_grammar_compile(const wk_grammar_spec *spec, wk_grammar **out,
                                        wk_diag *d);
void wk_grammar_free(wk_grammar *g);

/* A matcher at the start of g (borrowed; must outlive it). NULL on ENOMEM. */
wk_gmatch *wk_gmatch_new(const wk_grammar *g);
void wk_gmatch_free(wk_gmatch *m);

/* A matcher in m's state (same grammar). NULL on ENOMEM. */
wk_gmatch *wk_gmatch_clone(const wk_gmatch *m);

/*
 * Takes n bytes. true: all taken. false: some byte is not allowed there; the
 * matcher is left as it was before the call.
 */
bool wk_gmatch_advance(wk_gmatch *m, const uint8_t *bytes, size_t n);

/* True when the bytes so far form a complete output (end of text allowed). */
bool wk_gmatch_accepting(const wk_gmatch *m);

/* True when accepting and no byte at all may follow (nothing left to generate). */
bool wk_gmatch_done(const wk_gmatch *m);

/*
 * A vocab for wk_gmatch_allowed: token i's bytes are pieces[i] (lens[i]
 * bytes; NULL or empty: never allowed), eos the end-of-text id (allowed
 * exactly when the matcher accepts; -1 = none). The bytes are copied.
 *
 * literal (NULL: none) marks the control tokens (a tokenizer's added tokens:
 * <think>, <tool_call>, <|im_start|>, ...): a token i with literal[i] != 0
 * is allowed only where each of its bytes is fixed text of the grammar (the
 * format's markers, a property name, an enum value, the end marker of a raw
 * text such as "</think>" or "\n</parameter>\n"), never as free text: the
 * contents of a string or of an XML value, a number, whitespace, the
 * reasoning before the call. The same text spelled with ordinary pieces is
 * free text like any other. (A control token that is a proper prefix of a
 * raw text's end marker is taken as the start of that marker.)
 */
WK_MUST_CHECK wk_err wk_gvocab_new(const uint8_t *const *pieces, const size_t *lens, uint32_t n,
                                   int32_t eos, const uint8_t *literal, wk_gvocab **out);
void wk_gvocab_free(wk_gvocab *v);
uint32_t wk_gvocab_size(const wk_gvocab *v);

/*
 * Writes the allowed tokens as a bitset (bit i of mask[i / 64] is token i)
 * of (wk_gvocab_size(v) + 63) / 64 words. Returns how many are allowed.
 */
size_t wk_gmatch_allowed(const wk_gmatch *m, const wk_gvocab *v, uint64_t *mask);

#endif /* WK_GRAMMAR_H */
