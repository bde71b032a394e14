/*
 * ctl_ssefmt: a streamed reply's per-token chunk without building a JSON
 * tree. The chunk's JSON, dumped once by jansson with an empty string where
 * the token's text goes, is the template: its text before that string's
 * closing quote and after it. Each token's chunk is the template around the
 * text escaped the way jansson escapes it (compact, not ASCII-only: '"',
 * '\\' and the characters below U+0020 escaped, \b \f \n \r \t by name, the
 * others as \u00XX in upper-case hex; everything else as it is), so the
 * bytes are the same as dumping the tree. Text that is not well-formed
 * UTF-8 (which jansson refuses) is left to the caller's jansson path.
 *
 * Plain data; one per stream, not shared by threads.
 */
#ifndef CTL_SSEFMT_H
#define CTL_SSEFMT_H

#include <stdbool.h>
#include <stddef.h>

#include "wk_err.h"

typedef struct ctl_ssefmt {
    char *pre;      /* the template up to the text (its opening quote included), owned */
    size_t pre_len; /* bytes */
    char suf[16];   /* the template after the text (its closing quote, then brackets) */
    size_t suf_len; /* bytes */
    char *buf;      /* the last chunk, NUL-terminated, owned */
    size_t cap;     /* buf's bytes */
} ctl_ssefmt;

/*
 * Takes the template from dump (a compact jansson dump that ends in an
 * empty string value and then only '}' and ']'). false (f unchanged, empty)
 * when dump does not end like that or memory ran out: no fast path then.
 */
bool ctl_ssefmt_init(ctl_ssefmt *f, const char *dump);

/* Frees what f owns. Safe on a zeroed f. */
void ctl_ssefmt_fini(ctl_ssefmt *f);

/*
 * The chunk for text (len bytes) in f->buf, NUL-terminated: *out points at
 * it (valid until the next call). WK_EINVAL when text is not well-formed
 * UTF-8 (use the jansson path), WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_ssefmt_chunk(ctl_ssefmt *f, const char *text, size_t len,
                                      const char **out);

/*
 * Escapes text (len bytes of well-formed UTF-8) into out as a JSON string's
 * body, without quotes; out has room for 6 * len bytes. Returns the bytes
 * written, or (size_t)-1 when text is not well-formed UTF-8.
 */
size_t ctl_ssefmt_escape(const char *text, size_t len, char *out);

#endif /* CTL_SSEFMT_H */
