/*
 * ctl_toolgram: constrained decoding of a forced tool call (tool_choice
 * "required" or a named function, issue #29 item 3). Compiles the call
 * grammar for the template's tool-call format and the request's tools
 * (wk_grammar), takes the vocab trie of the model's tokenizer (built once per
 * tokenizer, shared by every request, ~150 ms for a 150k vocab), and hands
 * ctl_gen a matcher so that every sampled token keeps the reply a prefix of a
 * schema-valid call; the reply then goes through wk_toolcall's parser as any
 * other reply does. The tokenizer's added tokens are control tokens for the
 * grammar (wk_gvocab_new's literal): allowed only where their text is fixed
 * (the format's markers, the reasoning's end), never inside a value.
 *
 * Threading: ctl_toolgram_new() may run on any HTTP thread (the vocab cache
 * is locked); one ctl_toolgram belongs to one request.
 */
#ifndef CTL_TOOLGRAM_H
#define CTL_TOOLGRAM_H

#include <jansson.h>
#include <stdbool.h>

#include "ctl_gen.h"
#include "wk_err.h"
#include "wk_tok.h"
#include "wk_toolcall.h"

typedef struct ctl_toolgram ctl_toolgram;

/*
 * The constraint for one request: a call (several with parallel) in format
 * fmt to one of tools (an OpenAI tools array, borrowed for the call), or to
 * function name only (NULL: any of them). in_reasoning: the prompt leaves
 * the reply inside a think block, so free reasoning up to think_close comes
 * first. WK_EINVAL with the reason (a schema construct it does not enforce
 * and where, a name it cannot carry) for a 400; WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_toolgram_new(const wk_tok *tok, wk_toolcall_fmt fmt, const json_t *tools,
                                      const char *name, bool parallel, bool in_reasoning,
                                      const char *think_close, ctl_toolgram **out, wk_diag *d);

/* Points gen's constraint (match, gvocab) at t, which must outlive the generation. */
void ctl_toolgram_apply(ctl_toolgram *t, ctl_gen_params *gen);

/* Frees t (its reference to the shared vocab trie); NULL-safe. */
void ctl_toolgram_free(ctl_toolgram *t);

#endif /* CTL_TOOLGRAM_H */
