/*
 * libFuzzer harness for wk_toolcall's parser: the first input byte picks
 * the format (XML, Hermes, Granite, Nemotron) and a feed size, the rest is a
 * model's reply. The reply is parsed whole and fed in pieces of that size:
 * both must give the same content and calls (a stream reassembles to the
 * blocking answer); every call must have a non-empty name (of an offered
 * tool when tools are given: the top input bit gives none) and arguments
 * that parse as a JSON object; a reply holding no open marker must come back
 * as content byte for byte. An eager parser, whole and in pieces, must give
 * the same content and calls, and its partial-call deltas must spell the
 * calls unless it reported a call aborted.
 */
/* fuzz-sources: common/util/wk_err.c common/text/wk_toolcall.c */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_toolcall.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\":"
    " {\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\"},"
    " \"i\": {\"type\": \"integer\"}, \"b\": {\"type\": \"boolean\"},"
    " \"n\": {\"type\": [\"number\", \"null\"]}, \"o\": {\"type\": \"object\"},"
    " \"a\": {\"type\": \"array\"}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}]";

static void
fuzz_check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_toolcall: invariant failed: %s\n", what);
        abort();
    }
}

typedef struct fz_res {
    char *content;
    size_t content_len;
    char *calls; /* "name\0args\0" per call */
    size_t calls_len;
    char *deltas; /* an eager parser's deltas in the same spelling */
    size_t deltas_len;
    bool open, aborted;
} fz_res;

static void
fz_append(char **b, size_t *n, const char *s, size_t l)
{
    char *q = realloc(*b, *n + l + 1);
    fuzz_check(q != NULL, "memory");
    memcpy(q + *n, s, l);
    *n += l;
    q[*n] = '\0';
    *b = q;
}

static void
fz_run(wk_toolcall_fmt fmt, const json_t *tools, const char *text, size_t len, size_t step,
       bool eager, fz_res *r)
{
    memset(r, 0, sizeof(*r));
    fz_append(&r->content, &r->content_len, "", 0);
    fz_append(&r->calls, &r->calls_len, "", 0);
    fz_append(&r->deltas, &r->deltas_len, "", 0);
    wk_toolcall_parser *p = NULL;
    fuzz_check((eager ? wk_toolcall_parser_new_eager(fmt, tools, &p)
                      : wk_toolcall_parser_new(fmt, tools, &p)) == WK_OK,
               "a parser");
    size_t i = 0;
    for (;;) {
        size_t n = step == 0 || len - i < step ? len - i : step;
        bool final = i + n == len;
        wk_toolcall_out o;
        fuzz_check(wk_toolcall_feed(p, text + i, n, final, &o) == WK_OK, "a feed");
        fuzz_check(o.content != NULL && o.content[o.content_len] == '\0', "content terminated");
        fz_append(&r->content, &r->content_len, o.content, o.content_len);
        for (size_t k = 0; k < o.n_calls; k++) {
            const char *nm = o.calls[k].name, *args = o.calls[k].arguments;
            fuzz_check(nm[0] != '\0', "a call has a name");
            fuzz_check(tools == NULL || strcmp(nm, "f") == 0 || strcmp(nm, "get_weather") == 0,
                       "a call names an offered tool");
            json_error_t je;
            json_t *j = json_loads(args, JSON_ALLOW_NUL, &je); /* (a NUL in a value is \\u0000) */
            fuzz_check(json_is_object(j), "arguments are a JSON object");
            json_decref(j);
            fz_append(&r->calls, &r->calls_len, nm, strlen(nm) + 1);
            fz_append(&r->calls, &r->calls_len, args, strlen(args) + 1);
        }
        for (size_t k = 0; k < o.n_deltas; k++) {
            const wk_toolcall_delta *dl = &o.deltas[k];
            fuzz_check(dl->name != NULL || r->open, "a call's first delta names it");
            if (dl->name != NULL) {
                if (r->open)
                    fz_append(&r->deltas, &r->deltas_len, "", 1);
                fz_append(&r->deltas, &r->deltas_len, dl->name, strlen(dl->name) + 1);
                r->open = true;
            }
            fz_append(&r->deltas, &r->deltas_len, dl->arguments, strlen(dl->arguments));
        }
        r->aborted |= o.aborted;
        wk_toolcall_out_fini(&o);
        i += n;
        if (final)
            break;
    }
    wk_toolcall_parser_free(p);
    if (r->open)
        fz_append(&r->deltas, &r->deltas_len, "", 1);
}

static void
fz_free(fz_res *r)
{
    free(r->content);
    free(r->calls);
    free(r->deltas);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *tools;
    if (tools == NULL) {
        json_error_t je;
        tools = json_loads(TOOLS, 0, &je);
        fuzz_check(tools != NULL, "the fixed tools parse");
    }
    if (size < 1 || size > (1u << 16))
        return 0;
    static const wk_toolcall_fmt fmts[] = {WK_TOOLCALL_FMT_XML, WK_TOOLCALL_FMT_HERMES,
                                           WK_TOOLCALL_FMT_GRANITE, WK_TOOLCALL_FMT_NEMOTRON};
    wk_toolcall_fmt fmt = fmts[data[0] & 3];
    size_t step = 1 + (data[0] >> 2);
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    fz_res whole, parts, ewhole, eparts;
    const json_t *t = (data[0] & 0x80) ? NULL : tools;
    fz_run(fmt, t, text, len, 0, false, &whole);
    fz_run(fmt, t, text, len, step, false, &parts);
    fz_run(fmt, t, text, len, 0, true, &ewhole);
    fz_run(fmt, t, text, len, step, true, &eparts);
    const fz_res *ev[2] = {&ewhole, &eparts};
    for (int k = 0; k < 2; k++) {
        fuzz_check(ev[k]->content_len == whole.content_len &&
                       memcmp(ev[k]->content, whole.content, whole.content_len) == 0 &&
                       ev[k]->calls_len == whole.calls_len &&
                       memcmp(ev[k]->calls, whole.calls, whole.calls_len) == 0,
                   "an eager parser gives the same content and calls");
        fuzz_check(ev[k]->aborted ||
                       (ev[k]->deltas_len == whole.calls_len &&
                        memcmp(ev[k]->deltas, whole.calls, whole.calls_len) == 0),
                   "an eager parser's deltas spell its calls");
    }
    fuzz_check(whole.content_len == parts.content_len &&
                   memcmp(whole.content, parts.content, whole.content_len) == 0,
               "pieces give the content of the whole");
    fuzz_check(whole.calls_len == parts.calls_len &&
                   memcmp(whole.calls, parts.calls, whole.calls_len) == 0,
               "pieces give the calls of the whole");
    const char *open = fmt == WK_TOOLCALL_FMT_NEMOTRON ? "<TOOLCALL>" : "<tool_call>";
    if (memmem(text, len, open, strlen(open)) == NULL)
        fuzz_check(whole.content_len == len && memcmp(whole.content, text, len) == 0,
                   "a reply without calls is its content");
    fz_free(&whole);
    fz_free(&parts);
    fz_free(&ewhole);
    fz_free(&eparts);
    return 0;
}
