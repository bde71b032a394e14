/*
 * wk_jinja: a small Jinja interpreter for the chat templates checkpoints
 * ship (tokenizer_config.json "chat_template", chat_template.jinja, GGUF
 * tokenizer.chat_template). It renders what transformers' apply_chat_template
 * renders with Python's jinja2 (ImmutableSandboxedEnvironment, trim_blocks,
 * lstrip_blocks, loop controls, {% generation %}, the globals raise_exception
 * and strftime_now, transformers' tojson), byte for byte, for the subset of
 * Jinja real templates use; docs/TEMPLATES.md lists it. Everything outside
 * the subset is refused with an error naming the line and the construct,
 * never rendered approximately.
 *
 * A template is hostile input: parsing bounds the source size and nesting,
 * rendering bounds output bytes, working memory, evaluation steps and call
 * depth (wk_jinja_limits), so no template can hang or exhaust the caller.
 * Pure library code: no globals, no logging. A parsed template is immutable
 * and may be rendered from several threads at once.
 */
#ifndef WK_JINJA_H
#define WK_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"

typedef struct wk_jinja wk_jinja;

#define WK_JINJA_SOURCE_MAX (1u << 20) /* template source bytes accepted by parse */
#define WK_JINJA_NEST_MAX 64           /* block and expression nesting accepted by parse */

/* Resource limits of one render; a field left 0 takes the default shown. */
typedef struct wk_jinja_limits {
    size_t max_output;  /* rendered bytes (default 16 MiB) */
    size_t max_memory;  /* working memory of values (default 64 MiB) */
    uint64_t max_steps; /* evaluation steps, loop iterations and copied bytes / 64 (default 50M) */
    unsigned max_depth; /* macro call depth (default 64) */
} wk_jinja_limits;

/*
 * Parses len bytes of template source (UTF-8). On success *out is the
 * template, caller frees with wk_jinja_free(); src is not referenced after
 * the call. Returns WK_OK; WK_EINVAL for a syntax error and WK_ENOTSUP for a
 * construct outside the subset (tag, operator, call form), d naming
 * "line L column C" and the construct; WK_ETOOBIG for a source over
 * WK_JINJA_SOURCE_MAX or nesting over WK_JINJA_NEST_MAX; WK_ENOMEM.
 * Unknown filters and tests are not parse errors (jinja2 reports them only
 * when reached): rendering them fails with WK_ENOTSUP naming the line.
 */
WK_MUST_CHECK wk_err wk_jinja_parse(const char *src, size_t len, wk_jinja **out, wk_diag *d);

/*
 * Renders t with the variables of ctx (a JSON object, borrowed for the call):
 * typically messages, tools, documents, add_generation_prompt, bos_token,
 * eos_token and any chat_template_kwargs (enable_thinking, ...). JSON
 * null/true/false/integer/real/string/array/object become Python's
 * None/True/False/int/float/str/list/dict, objects keeping their key order.
 * lim may be NULL (defaults). On success *out is a malloc'd NUL-terminated
 * UTF-8 string of *out_len bytes, caller frees with free().
 * Returns WK_OK; WK_EINVAL when the template raises (raise_exception(msg):
 * d holds msg verbatim) or fails at run time the way jinja2 would (an
 * undefined value used, a type error, "line L: ..." in d); WK_ENOTSUP for an
 * unsupported filter, test, method or call reached ("line L: ..."); WK_ETOOBIG
 * when a limit of lim is reached (naming it); WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_jinja_render(const wk_jinja *t, const json_t *ctx,
                                     const wk_jinja_limits *lim, char **out, size_t *out_len,
                                     wk_diag *d);

/* Frees a template; NULL-safe. */
void wk_jinja_free(wk_jinja *t);

#endif /* WK_JINJA_H */
