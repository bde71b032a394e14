/*
 * libFuzzer harness for wk_jinja: the input is a template. It is parsed; a
 * refusal must come with a message and no template. A parsed template is
 * rendered twice with a fixed chat context (system, user, assistant with a
 * tool call, tool result, content parts, tools, add_generation_prompt) under
 * small limits, so no input can take long: both renders must agree (a
 * template keeps no state between renders), a success must give a
 * NUL-terminated string of the stated length within max_output, and a
 * failure must come with a message and no output.
 */
/* fuzz-sources: common/util/wk_err.c common/text/wk_jinja_parse.c common/text/wk_jinja_value.c common/text/wk_jinja_eval.c common/text/wk_jinja_builtin.c */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char CONTEXT[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"Be brief.\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Weather \\u00e9?\"}]},"
    "{\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"check\","
    " \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\":"
    " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"{\\\"t\\\": 20.5}\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>x</think>20.5 degrees\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}},"
    " \"required\": [\"city\"]}}}],"
    "\"documents\": null, \"add_generation_prompt\": true, \"enable_thinking\": false,"
    "\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

static void
fuzz_check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_jinja: invariant failed: %s\n", what);
        abort();
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *ctx;
    if (ctx == NULL) {
        json_error_t je;
        ctx = json_loads(CONTEXT, 0, &je);
        fuzz_check(ctx != NULL, "the fixed context parses");
    }
    wk_jinja *t = NULL;
    wk_diag d = {{0}};
    wk_err e = wk_jinja_parse((const char *)data, size, &t, &d);
    if (e != WK_OK) {
        fuzz_check(t == NULL, "no template on a parse error");
        fuzz_check(d.msg[0] != '\0', "a parse error has a message");
        return 0;
    }
    fuzz_check(t != NULL, "a template on success");
    wk_jinja_limits lim = {
        .max_output = 1u << 20, .max_memory = 16u << 20, .max_steps = 200000, .max_depth = 32};
    char *out[2] = {NULL, NULL};
    size_t len[2] = {0, 0};
    wk_err r[2];
    wk_diag rd[2] = {{{0}}, {{0}}};
    for (int i = 0; i < 2; i++) {
        r[i] = wk_jinja_render(t, ctx, &lim, &out[i], &len[i], &rd[i]);
        if (r[i] == WK_OK) {
            fuzz_check(out[i] != NULL && out[i][len[i]] == '\0', "output NUL-terminated");
            fuzz_check(len[i] <= lim.max_output, "output within max_output");
        } else {
            fuzz_check(out[i] == NULL, "no output on a render error");
            fuzz_check(rd[i].msg[0] != '\0' || r[i] == WK_EINVAL, "a render error has a message");
        }
    }
    /* strftime_now reads the clock: two renders may straddle a second */
    bool clock = memmem(data, size, "strftime", 8) != NULL;
    fuzz_check(clock || r[0] == r[1], "two renders give the same result");
    if (!clock && r[0] == WK_OK && r[1] == WK_OK)
        fuzz_check(len[0] == len[1] && memcmp(out[0], out[1], len[0]) == 0,
                   "two renders give the same text");
    free(out[0]);
    free(out[1]);
    wk_jinja_free(t);
    return 0;
}
