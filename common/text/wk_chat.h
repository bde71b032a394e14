/*
 * wk_chat: the RWKV World chat template, message cleaning, stop-string
 * scanning for streamed output, and the reasoning split of a reply at think
 * markers (wk_chat_think; any template's: the markers are arguments).
 *
 * Rendered prompt, byte for byte (<clean> is wk_chat_clean() of the content):
 *   system message     "System: <clean>\n\n"
 *   user message       "User: <clean>\n\n"
 *   assistant message  "Assistant: <clean>\n\n"
 *   generation prompt  "Assistant:"            (no trailing space, last)
 * Messages are rendered in order; roles are case-sensitive. Because cleaning
 * collapses every run of newlines to one, no message body contains "\n\n",
 * so a message can't forge a turn and "\n\n" is a safe default stop string.
 *
 * Pure functions over caller memory: no globals, no logging, thread-safe.
 */
#ifndef WK_CHAT_H
#define WK_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "wk_err.h"

#define WK_CHAT_STOP_DEFAULT "\n\n" /* stop string used when none is given */

/* One chat message, borrowed for the call. */
typedef struct wk_chat_msg {
    const char *role;    /* "system", "user" or "assistant" (NUL-terminated) */
    const char *content; /* message text, content_len bytes */
    size_t content_len;  /* bytes of content; 0 means content is NUL-terminated */
} wk_chat_msg;

/*
 * Python's str.strip() on UTF-8: sets *off and *n to the part of s (len
 * bytes) without leading and trailing whitespace, the characters
 * str.isspace() accepts: ASCII whitespace, U+001C..U+001F, U+0085, U+00A0,
 * U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000. Invalid
 * UTF-8 is never stripped. The one definition of the rule: wk_chat_clean()
 * and the chat-session module (which must agree with the template) both use
 * it. s is borrowed for the call; pure, thread-safe.
 */
void wk_chat_strip(const char *s, size_t len, size_t *off, size_t *n);

/*
 * Cleans message text: CRLF and lone CR become LF, every run of two or more
 * LFs becomes one LF (regex "\n\n+" -> "\n"), NUL bytes are dropped, and
 * leading and trailing whitespace is stripped (wk_chat_strip()). On success
 * *out is a malloc'd NUL-terminated string, caller frees with free().
 * Returns WK_OK or WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_chat_clean(const char *in, size_t len, char **out);

/*
 * Renders n messages with the template above, appending the generation
 * prompt "Assistant:" when add_generation_prompt. On success *out is a
 * malloc'd NUL-terminated string of *len bytes, caller frees with free().
 * Returns WK_OK; WK_EINVAL for a NULL or unknown role, naming the role and
 * message index in d; WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_chat_render(const wk_chat_msg *msgs, size_t n, bool add_generation_prompt,
                                    char **out, size_t *len, wk_diag *d);

/* Where one rendered message lies in the rendered text (byte offsets). */
typedef struct wk_chat_span {
    size_t start;       /* its role prefix ("User: ") begins */
    size_t content;     /* its cleaned content begins */
    size_t content_end; /* its cleaned content ends ("\n\n" follows) */
    size_t end;         /* after its "\n\n": the next message (or the generation prompt) */
} wk_chat_span;

/*
 * wk_chat_render() that also writes each message's span into spans (n
 * entries, caller memory; NULL: none). Same returns; spans are written only
 * as far as rendering got, and are meaningful only on WK_OK.
 */
WK_MUST_CHECK wk_err wk_chat_render_spans(const wk_chat_msg *msgs, size_t n,
                                          bool add_generation_prompt, char **out, size_t *len,
                                          wk_chat_span *spans, wk_diag *d);

/* Result of wk_chat_stop_scan(). */
typedef struct wk_chat_stop {
    bool found;        /* a stop string occurs in the text */
    size_t stop_index; /* which stop string (index into stops), when found */
    size_t match_pos;  /* byte offset where it starts, when found */
    size_t safe_len;   /* bytes from the start of text that may be emitted now */
} wk_chat_stop;

/*
 * Scans text (len bytes generated and not yet emitted) for stop strings.
 * stops: n_stops NUL-terminated strings, borrowed; when n_stops is 0 the
 * default WK_CHAT_STOP_DEFAULT is used (pass it explicitly to combine it with
 * others); empty strings are ignored.
 * If some stop string occurs, r->found is set, r->match_pos is the earliest
 * start of any occurrence (ties go to the stop listed first), r->stop_index
 * says which, and r->safe_len = r->match_pos: emit that much and finish.
 * Otherwise r->safe_len = len minus the longest suffix of text that is a
 * proper prefix of some stop string: emit that much, keep the rest, append
 * the next output to it and scan again. A kept suffix is at most the longest
 * stop string minus one byte. Cost O(len * total stop bytes).
 */
void wk_chat_stop_scan(const char *text, size_t len, const char *const *stops, size_t n_stops,
                       wk_chat_stop *r);

/*
 * Reasoning split: a model's reply text cut at think markers (open, close:
 * "<think>", "</think>") into reasoning (between them) and content (the
 * rest), the markers themselves dropped. Fed in pieces (a stream) or whole,
 * the concatenated outputs are the same: bytes that may begin a marker are
 * held until the next piece (or the final call) settles them.
 */
typedef struct wk_chat_think {
    const char *open;  /* the open marker, borrowed for the splitter's life */
    const char *close; /* the close marker, borrowed likewise */
    bool in_think;     /* between the markers now */
    char held[32];     /* bytes that may begin the awaited marker, not emitted yet */
    size_t n_held;     /* bytes in held */
} wk_chat_think;

/*
 * Starts a splitter: in_think says whether the reply starts inside the
 * markers (the prompt ended with an unclosed open marker). open and close
 * are non-empty NUL-terminated strings shorter than 32 bytes, borrowed.
 */
void wk_chat_think_init(wk_chat_think *t, const char *open, const char *close, bool in_think);

/*
 * True when text (len bytes, a rendered prompt) leaves the reply inside the
 * markers: its last open marker comes after its last close marker.
 */
bool wk_chat_think_open_at_end(const char *text, size_t len, const char *open, const char *close);

/*
 * Feeds len bytes of reply text; final says no more text follows (held
 * bytes are settled as text of the current part). On success *reason and
 * *content are malloc'd NUL-terminated strings (caller frees both with
 * free()) of *reason_len and *content_len bytes, either may be empty.
 * Returns WK_OK or WK_ENOMEM (outputs untouched, t unchanged).
 */
WK_MUST_CHECK wk_err wk_chat_think_feed(wk_chat_think *t, const char *text, size_t len, bool final,
                                        char **reason, size_t *reason_len, char **content,
                                        size_t *content_len);

#endif /* WK_CHAT_H */
