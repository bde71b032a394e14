/*
 * libFuzzer harness for wk_grammar's schema compiler and matcher: the first
 * input byte picks the format (XML, Hermes, Granite, Nemotron), parallel
 * calls and a named function (the first tool's name); the input up to a NUL
 * is a request's `tools` JSON, the bytes after it steer a walk. A refused
 * compile must be WK_EINVAL (or WK_ENOMEM) with a reason. A compiled grammar
 * is walked over a vocab of the 256 single bytes and an end-of-text token:
 * at every step the allowed set must equal the bytes the matcher takes one
 * by one, must never be empty before the output is complete (no dead end),
 * and holds end-of-text exactly when the matcher accepts. The steering byte
 * picks among the allowed ones. An output the grammar accepts must come out
 * of wk_toolcall's parser as calls to offered functions with JSON object
 * arguments and no content: what constrained decoding emits is always read
 * back as tool calls.
 */
/* fuzz-sources: common/util/wk_err.c common/text/wk_toolcall.c common/text/wk_grammar.c */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_grammar.h"
#include "wk_toolcall.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
fuzz_check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_grammar: invariant failed: %s\n", what);
        abort();
    }
}

#define FZ_STEPS 256

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    static const wk_toolcall_fmt fmts[] = {WK_TOOLCALL_FMT_XML, WK_TOOLCALL_FMT_HERMES,
                                           WK_TOOLCALL_FMT_GRANITE, WK_TOOLCALL_FMT_NEMOTRON};
    wk_toolcall_fmt fmt = fmts[data[0] & 3];
    bool parallel = (data[0] >> 2) & 1, named = (data[0] >> 3) & 1;
    const uint8_t *tools = data + 1;
    const uint8_t *nul = memchr(tools, 0, size - 1);
    size_t tools_len = nul != NULL ? (size_t)(nul - tools) : size - 1;
    const uint8_t *steer = nul != NULL ? nul + 1 : NULL;
    size_t n_steer = nul != NULL ? size - 1 - tools_len - 1 : 0;

    json_t *tj = json_loadb((const char *)tools, tools_len, 0, NULL);
    const char *name = NULL;
    if (named)
        name = json_string_value(
            json_object_get(json_object_get(json_array_get(tj, 0), "function"), "name"));
    wk_grammar_spec sp = {.format = fmt, .tools = (const char *)tools, .tools_len = tools_len,
                          .function = name, .parallel = parallel,
                          .prefix_until = (data[0] >> 4) & 1 ? "</think>" : NULL};
    wk_grammar *g = NULL;
    wk_diag d = {{0}};
    wk_err err = wk_grammar_compile(&sp, &g, &d);
    if (err != WK_OK) {
        fuzz_check(err == WK_EINVAL || err == WK_ENOMEM, "compile error code");
        fuzz_check(g == NULL, "no grammar on error");
        fuzz_check(err == WK_ENOMEM || d.msg[0] != '\0', "a refusal says why");
        json_decref(tj);
        return 0;
    }
    /*
     * The vocab: token b is byte b, token 256 end-of-text, then control
     * tokens (allowed only as fixed text of the grammar: wk_gvocab_new()).
     */
    static const char *const ctl[] = {"</think>",   "<tool_call>",      "<tool_call>\n", "\"",
                                      "<TOOLCALL>", "\n</parameter>\n", "<|im_end|>",    "}",
                                      "\n",         "</tool_call>"};
    enum { FZ_NCTL = sizeof(ctl) / sizeof(ctl[0]) };
    static uint8_t bytes[256];
    const uint8_t *pieces[257 + FZ_NCTL];
    size_t lens[257 + FZ_NCTL];
    uint8_t lit[257 + FZ_NCTL] = {0};
    for (int b = 0; b < 256; b++) {
        bytes[b] = (uint8_t)b;
        pieces[b] = &bytes[b];
        lens[b] = 1;
    }
    pieces[256] = NULL;
    lens[256] = 0;
    for (int k = 0; k < FZ_NCTL; k++) {
        pieces[257 + k] = (const uint8_t *)ctl[k];
        lens[257 + k] = strlen(ctl[k]);
        lit[257 + k] = 1;
    }
    wk_gvocab *v = NULL;
    fuzz_check(wk_gvocab_new(pieces, lens, 257 + FZ_NCTL, 256, lit, &v) == WK_OK, "vocab");
    wk_gmatch *m = wk_gmatch_new(g);
    fuzz_check(m != NULL, "matcher");
    uint8_t *out = malloc(FZ_STEPS + 1);
    fuzz_check(out != NULL, "memory");
    size_t n_out = 0;
    bool ended = false;
    for (size_t step = 0; step < FZ_STEPS && !ended; step++) {
        uint64_t mask[5];
        size_t c = wk_gmatch_allowed(m, v, mask);
        size_t cb = 0;
        int allowed[256];
        for (int b = 0; b < 256; b++) {
            wk_gmatch *t = wk_gmatch_clone(m);
            fuzz_check(t != NULL, "clone");
            uint8_t ch = (uint8_t)b;
            bool ok = wk_gmatch_advance(t, &ch, 1);
            wk_gmatch_free(t);
            fuzz_check(ok == (((mask[b / 64] >> (b % 64)) & 1) != 0), "mask equals advance");
            if (ok)
                allowed[cb++] = b;
        }
        bool acc = wk_gmatch_accepting(m);
        fuzz_check(acc == (((mask[4] >> 0) & 1) != 0), "end-of-text iff accepting");
        size_t cc = 0;
        for (int k = 0; k < FZ_NCTL; k++) {
            if (!((mask[(257 + k) / 64] >> ((257 + k) % 64)) & 1))
                continue;
            /* an allowed control token's bytes are taken */
            wk_gmatch *t = wk_gmatch_clone(m);
            fuzz_check(t != NULL, "clone");
            fuzz_check(wk_gmatch_advance(t, pieces[257 + k], lens[257 + k]),
                       "an allowed control token advances");
            wk_gmatch_free(t);
            cc++;
        }
        fuzz_check(c == cb + acc + cc, "count");
        fuzz_check(c > 0, "no dead end");
        fuzz_check(wk_gmatch_done(m) == (acc && cb == 0), "done");
        uint8_t s = step < n_steer ? steer[step] : (uint8_t)(step * 151u + 7u);
        if (acc && (cb == 0 || step >= n_steer || s == 0xFF)) {
            ended = true;
            break;
        }
        uint8_t ch = (uint8_t)allowed[s % cb];
        fuzz_check(wk_gmatch_advance(m, &ch, 1), "an allowed byte advances");
        out[n_out++] = ch;
    }
    if (ended && tj != NULL) {
        wk_toolcall_parser *p = NULL;
        fuzz_check(wk_toolcall_parser_new(fmt, tj, &p) == WK_OK, "parser");
        /* Without the reasoning (the chat path splits it off before parsing). */
        const char *start = (const char *)out;
        size_t len = n_out;
        if (sp.prefix_until != NULL) {
            out[n_out] = 0;
            const uint8_t *e = out;
            for (size_t i = 0; i + 8 <= n_out; i++) {
                if (memcmp(out + i, "</think>", 8) == 0) {
                    e = out + i + 8;
                    break;
                }
            }
            while (e < out + n_out && (*e == ' ' || *e == '\n' || *e == '\t' || *e == '\r'))
                e++;
            start = (const char *)e;
            len = n_out - (size_t)(e - out);
        }
        wk_toolcall_out o = {0};
        fuzz_check(wk_toolcall_feed(p, start, len, true, &o) == WK_OK, "feed");
        if (o.n_calls == 0 || o.content_len != 0) {
            fprintf(stderr, "fuzz_grammar: not read back as calls: %.*s\n", (int)len, start);
            fuzz_check(0, "accepted output parses as calls");
        }
        for (size_t k = 0; k < o.n_calls; k++) {
            json_t *a = json_loads(o.calls[k].arguments, 0, NULL);
            fuzz_check(json_is_object(a), "arguments are an object");
            json_decref(a);
            fuzz_check(name == NULL || strcmp(o.calls[k].name, name) == 0, "the named function");
        }
        wk_toolcall_out_fini(&o);
        wk_toolcall_parser_free(p);
    }
    free(out);
    wk_gmatch_free(m);
    wk_gvocab_free(v);
    wk_grammar_free(g);
    json_decref(tj);
    return 0;
}
