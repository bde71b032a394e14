/*
 * wk_chat_tpl: a checkpoint's own chat template, found in its model
 * directory the way transformers finds it, rendered with wk_jinja the way
 * apply_chat_template renders it. A model directory without one keeps the
 * plain World template of wk_chat.h (the caller decides: WK_ENOENT here).
 *
 * Where the template comes from, first found wins:
 *   0. an override file (the operator's --chat-template FILE)
 *   1. chat_template.jinja
 *   2. tokenizer_config.json "chat_template": a string, or a list of
 *      {"name", "template"} objects (transformers' named templates: "default",
 *      and "tool_use" for requests that carry tools)
 *   3. the metadata key tokenizer.chat_template of the one *.gguf file
 * Special tokens (bos_token, eos_token, unk_token, pad_token) come from
 * tokenizer_config.json, as a string or an AddedToken object's "content",
 * else from the GGUF file (tokenizer.ggml.<name>_id into tokenizer.ggml.tokens).
 *
 * Never logs. A loaded template is immutable: render from any thread.
 */
#ifndef WK_CHAT_TPL_H
#define WK_CHAT_TPL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "wk_chat.h"
#include "wk_err.h"
#include "wk_jinja.h"
#include "wk_toolcall.h"

typedef struct wk_chat_tpl wk_chat_tpl;

#define WK_CHAT_TPL_CONFIG_MAX (16u << 20) /* tokenizer_config.json bytes read at most */

/*
 * Loads the chat template of the model directory dir, or of override_path
 * (a template file, borrowed; NULL: none) with dir's special tokens. On
 * success *out is the template, caller frees with wk_chat_tpl_free().
 * Returns WK_OK; WK_ENOENT when dir has no chat template (no source holds
 * one) or override_path does not exist;
 * WK_EINVAL for a malformed tokenizer_config.json or chat_template field,
 * WK_ENOTSUP / WK_EINVAL / WK_ETOOBIG for a template wk_jinja_parse()
 * refuses (d names the file, line and construct); WK_EIO, WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_chat_tpl_load(const char *dir, const char *override_path, wk_chat_tpl **out,
                                      wk_diag *d);

/*
 * Renders messages (a JSON array of message objects, as a request carries
 * them: role, content string or parts, tool_calls, reasoning_content ...)
 * with tools (a JSON array or NULL), add_generation_prompt and kwargs (the
 * request's chat_template_kwargs, a JSON object or NULL: enable_thinking,
 * ...), passing what transformers passes: messages, tools (null when
 * absent), documents (null), add_generation_prompt, the special tokens, then
 * kwargs (which may override any of them). All JSON is borrowed for the
 * call. lim as wk_jinja_render() (NULL: defaults). On success *out is a
 * malloc'd NUL-terminated string of *len bytes, caller frees with free().
 * Returns what wk_jinja_render() returns (WK_EINVAL with the template's own
 * message when it raises), or WK_EINVAL for arguments of the wrong JSON type.
 */
WK_MUST_CHECK wk_err wk_chat_tpl_render_json(const wk_chat_tpl *t, const json_t *messages,
                                             const json_t *tools, bool add_generation_prompt,
                                             const json_t *kwargs, const wk_jinja_limits *lim,
                                             char **out, size_t *len, wk_diag *d);

/*
 * wk_chat_tpl_render_json() for n plain-text messages (wk_chat_msg: role and
 * content; a NULL content is ""), no tools, no kwargs: the drop-in for
 * wk_chat_render() when a checkpoint has its own template.
 */
WK_MUST_CHECK wk_err wk_chat_tpl_render(const wk_chat_tpl *t, const wk_chat_msg *msgs, size_t n,
                                        bool add_generation_prompt, char **out, size_t *len,
                                        wk_diag *d);

/* Where the template was found: "chat_template.jinja", "tokenizer_config.json", "gguf", "override".
 */
const char *wk_chat_tpl_source(const wk_chat_tpl *t);

/*
 * The special token name ("eos_token", "bos_token", "unk_token",
 * "pad_token") as the template sees it, or NULL when none was found.
 * Borrowed until wk_chat_tpl_free().
 */
const char *wk_chat_tpl_special(const wk_chat_tpl *t, const char *name);

/* The think markers of Qwen3 / Qwen3.5 / DeepSeek-R1 style templates. */
#define WK_CHAT_TPL_THINK_OPEN "<think>"
#define WK_CHAT_TPL_THINK_CLOSE "</think>"

/*
 * True when a template source of t names WK_CHAT_TPL_THINK_CLOSE: replies
 * of its model may carry reasoning between the think markers.
 */
bool wk_chat_tpl_thinks(const wk_chat_tpl *t);

/*
 * True when a template source of t names the variable var, one of
 * "reasoning_effort" and "enable_thinking" (any other: false): a request's
 * reasoning settings reach the template only where it reads them.
 */
bool wk_chat_tpl_knows(const wk_chat_tpl *t, const char *var);

/*
 * The tool-call format t's sources render assistant tool_calls in
 * (wk_toolcall_fmt_detect() of each source, the first one known; NONE for a
 * NULL t): how the reply of a request with tools is parsed.
 */
wk_toolcall_fmt wk_chat_tpl_toolcall_fmt(const wk_chat_tpl *t);

/*
 * True when a source of t iterates a call's arguments as a mapping
 * (wk_toolcall_tpl_object_args()): arguments sent as a JSON string are
 * turned into the object before rendering.
 */
bool wk_chat_tpl_object_args(const wk_chat_tpl *t);

/*
 * Prepares a chat request's messages (a JSON array, changed in place) the
 * way the controller passes them to t: role "developer" becomes "system",
 * and for a template that iterates a call's arguments
 * (wk_chat_tpl_object_args()) each assistant tool call's arguments string
 * becomes the JSON object it holds, as vLLM and llama.cpp pass it. Returns
 * WK_OK; WK_EINVAL when such a string is not a JSON object (*bad_msg and
 * *bad_call index it, d says so); WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_chat_tpl_prepare(const wk_chat_tpl *t, json_t *messages, size_t *bad_msg,
                                         size_t *bad_call, wk_diag *d);

/* Frees a template; NULL-safe. */
void wk_chat_tpl_free(wk_chat_tpl *t);

#endif /* WK_CHAT_TPL_H */
