/*
 * wk_toolcall: the tool-call output formats of the chat templates wkvm
 * serves, which one a template uses (from its source), and a streaming
 * parser that cuts a model's reply into content and OpenAI tool calls.
 *
 * One call, byte for byte, in each format (what the templates render for an
 * assistant turn with tool_calls, so what the models were trained to emit;
 * a constrained decoder builds its grammar from exactly these). NAME is the
 * function's name, KEY a parameter's name (neither holds '>', '<' or a line
 * break), ARGS a JSON object, "\n" one line feed:
 *
 *   WK_TOOLCALL_FMT_XML (Qwen3.5, Qwen3-Coder, Nemotron-3-Nano):
 *     "<tool_call>\n<function=NAME>\n"
 *     then per argument "<parameter=KEY>\nVALUE\n</parameter>\n"
 *     then "</function>\n</tool_call>"
 *     VALUE is the argument as the template prints it: a string verbatim (it
 *     must not contain "</parameter>"), an object or array as JSON
 *     (tojson: ", " and ": " separators), a number as its JSON text. The
 *     templates print booleans and null as Python does (True, False, None);
 *     the parser reads both those and JSON's true/false/null. Several calls
 *     are joined with "\n"; content before the first call ends with "\n\n".
 *
 *   WK_TOOLCALL_FMT_HERMES (Hermes 2 Pro / 3, Qwen2.5, Qwen3):
 *     "<tool_call>\n{\"name\": \"NAME\", \"arguments\": ARGS}\n</tool_call>"
 *     Several calls are joined with "\n".
 *
 *   WK_TOOLCALL_FMT_GRANITE (Granite 4.0 / 4.1): the Hermes bytes above
 *     (its template prints the same "<tool_call>\n{\"name\": ...}\n</tool_call>";
 *     a call follows content or a previous call after one "\n").
 *
 *   WK_TOOLCALL_FMT_NEMOTRON (Nemotron Nano v2): every call of the turn in one
 *     block, a JSON array of call objects:
 *     "<TOOLCALL>[{\"name\": \"NAME\", \"arguments\": ARGS}, {...}]</TOOLCALL>"
 *
 * What the parser accepts (a superset of the bytes above, never less):
 * whitespace anywhere between the parts the formats separate with "\n"; in
 * the JSON formats any JSON spacing, "arguments" absent (= {}) or a string
 * holding a JSON object; in the XML format one "\n" after "<parameter=KEY>"
 * and one before "</parameter>" are the separators, not the value. The
 * function must be one of the offered tools (when tools are given), names
 * and string values well-formed UTF-8, keys unique. Anything else between a
 * call's markers, or a call never closed when the reply ends unless it is
 * complete without its end marker, is a malformed call: its bytes, markers
 * included, are returned as content, never an error. Whitespace between
 * content and a call, between calls, and after the last call is the
 * format's separator and is dropped; a reply without calls comes back
 * byte for byte as content.
 *
 * Arguments are returned as the text of a JSON object: in the JSON formats
 * the model's own bytes for it (a string-wrapped object unwrapped); in the
 * XML format {"KEY": VALUE, ...} (", " and ": " separators, as tojson) with
 * each VALUE typed by the tool's JSON schema (parameters.properties.KEY.type,
 * a type or a list of types): "string" stays the text; "integer", "number",
 * "boolean", "object", "array", "null" are parsed as that JSON type when the
 * text is one (True/False/None read as true/false/null); a parameter the
 * schema does not type, or a text that is none of its types, stays a string.
 *
 * A call is reported once it is complete (its end marker seen, or the reply
 * ended), never before: until then the bytes might still turn out to be
 * content, and a stream must reassemble to the blocking answer.
 *
 * An eager parser (wk_toolcall_parser_new_eager) also reports partial-call
 * deltas as OpenAI streams them: in the XML format the name as soon as
 * "<function=NAME>" is complete and offered, then each argument as soon as
 * its "</parameter>" comes ("{" + "\"KEY\": VALUE", ", " + ... , "}"), so
 * the fragments of a call concatenate to its final arguments text; in the
 * JSON formats the name and whole arguments when the call completes. A call
 * that turns out malformed after deltas were reported cannot be taken back:
 * its bytes go to content as always and the feed says `aborted`. Eager
 * deltas are for output that cannot be malformed (constrained decoding);
 * with free decoding use the completed calls.
 *
 * Pure, no globals, no logging; a parser is used by one thread at a time.
 */
#ifndef WK_TOOLCALL_H
#define WK_TOOLCALL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "wk_err.h"

typedef enum wk_toolcall_fmt {
    WK_TOOLCALL_FMT_NONE = 0, /* no tool-call format wkvm knows: replies are content */
    WK_TOOLCALL_FMT_XML,      /* <tool_call><function=NAME><parameter=KEY>... */
    WK_TOOLCALL_FMT_HERMES,   /* <tool_call>{"name": ..., "arguments": ...}</tool_call> */
    WK_TOOLCALL_FMT_GRANITE,  /* Granite 4: the Hermes bytes */
    WK_TOOLCALL_FMT_NEMOTRON, /* <TOOLCALL>[{"name": ..., "arguments": ...}, ...]</TOOLCALL> */
} wk_toolcall_fmt;

/* Longest buffered call body the parser keeps; a longer one is malformed. */
#define WK_TOOLCALL_BODY_MAX (1u << 20)

/*
 * The format a template's source renders assistant tool_calls in: "<function="
 * and "<parameter=" -> XML; "<TOOLCALL>" -> NEMOTRON; "<tool_call>" and a
 * JSON `"name": "` (plain or backslash-escaped) -> GRANITE with Granite's
 * "<|start_of_role|>", else HERMES; else NONE (GLM-style
 * "<tool_call>NAME<arg_key>..." included). src is NUL-terminated, borrowed
 * for the call; NULL -> NONE.
 */
wk_toolcall_fmt wk_toolcall_fmt_detect(const char *src);

/* Short lower-case name of fmt ("xml", "hermes", "granite", "nemotron", "none"). */
const char *wk_toolcall_fmt_name(wk_toolcall_fmt fmt);

/*
 * True when a template source iterates a tool call's arguments as a mapping
 * (`arguments|items`, `arguments.items()`): such a template needs
 * arguments given as a JSON string turned into an object first (jinja2's
 * items filter refuses a string), as vLLM and llama.cpp do.
 */
bool wk_toolcall_tpl_object_args(const char *src);

/* One parsed call: both strings malloc'd, NUL-terminated, well-formed UTF-8. */
typedef struct wk_toolcall_call {
    char *name;      /* the function's name */
    char *arguments; /* the text of a JSON object */
} wk_toolcall_call;

/* One partial-call delta of an eager parser: strings malloc'd, NUL-terminated. */
typedef struct wk_toolcall_delta {
    size_t index;    /* the call's index in the reply: 0, 1, ... */
    char *name;      /* the function's name on the call's first delta, else NULL */
    char *arguments; /* the next fragment of its arguments text (may be "") */
} wk_toolcall_delta;

/* What one feed settled. Free with wk_toolcall_out_fini(). */
typedef struct wk_toolcall_out {
    char *content;           /* content bytes settled now (malloc'd, NUL-terminated; may be "") */
    size_t content_len;      /* bytes in content (a NUL byte of the reply is kept) */
    wk_toolcall_call *calls; /* calls completed now, in order (malloc'd; NULL when none) */
    size_t n_calls;          /* entries in calls */
    wk_toolcall_delta *deltas; /* eager parser: partial-call deltas, in order (NULL when none) */
    size_t n_deltas;           /* entries in deltas */
    bool aborted; /* eager parser: a call with deltas reported turned out malformed (content) */
} wk_toolcall_out;

typedef struct wk_toolcall_parser wk_toolcall_parser;

/*
 * A parser for fmt (not NONE) over the request's tools (an OpenAI tools
 * array, [{"type":"function","function":{"name","parameters"}}]; NULL or
 * empty: any function name, parameters untyped). tools is borrowed for the
 * parser's life. *out is freed with wk_toolcall_parser_free().
 * Returns WK_OK, WK_EINVAL (fmt NONE or unknown), WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_toolcall_parser_new(wk_toolcall_fmt fmt, const json_t *tools,
                                            wk_toolcall_parser **out);
/* wk_toolcall_parser_new() for a parser that also reports partial-call deltas (above). */
WK_MUST_CHECK wk_err wk_toolcall_parser_new_eager(wk_toolcall_fmt fmt, const json_t *tools,
                                                  wk_toolcall_parser **out);
void wk_toolcall_parser_free(wk_toolcall_parser *p); /* NULL-safe */

/*
 * Feeds len bytes of reply text (after the reasoning split: content only);
 * final says no more text follows (held bytes are settled). Concatenating
 * every feed's content and calls gives the same result for any cut of the
 * text into feeds. On success *out is written (caller frees with
 * wk_toolcall_out_fini()). Returns WK_OK or WK_ENOMEM (parser unusable).
 */
WK_MUST_CHECK wk_err wk_toolcall_feed(wk_toolcall_parser *p, const char *text, size_t len,
                                      bool final, wk_toolcall_out *out);

/* Calls completed so far by p (over all feeds). */
size_t wk_toolcall_count(const wk_toolcall_parser *p);

/* Frees what out holds and zeroes it. NULL-safe. */
void wk_toolcall_out_fini(wk_toolcall_out *out);

/*
 * Appends s (n bytes) to buf as a JSON string literal the way Python's
 * json.dumps(ensure_ascii=False) writes it: quotes, \" \\ \n \r \t \b \f,
 * other bytes below 0x20 as \u00XX, everything else (UTF-8 included) as is.
 * buf is a growable malloc'd buffer of *len bytes and *cap capacity.
 * Returns WK_OK, WK_EINVAL (s is not well-formed UTF-8), WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_toolcall_json_str(char **buf, size_t *len, size_t *cap, const char *s,
                                          size_t n);

#endif /* WK_TOOLCALL_H */
