/*
 * libFuzzer harness for the body of POST /v1/responses: the input is parsed
 * as JSON (wk_json_parse, the routes' parser) and, when it is a value,
 * handed to ctl_resp_req_parse() with small limits, so the limit paths are
 * reached too. Invariants: a success has a model, 1..max_items items, each
 * with a known role and a NUL-terminated text of its stated length within
 * the byte limit (function items: a call_id, a call's name and arguments
 * that are a JSON object, role tool exactly for an output), max_output_tokens within its limit, and
 * a previous id that is the body's string; a refusal has an error code, a message, a zeroed output,
 * and a parameter that names something (or nothing for the whole body); fini twice is harmless.
 */
/* fuzz-sources: common/util/wk_err.c common/util/wk_json.c controld/api/ctl_resp_req.c */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_resp_req.h"
#include "wk_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
fuzz_check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_resp_body: invariant failed: %s\n", what);
        abort();
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *body = NULL;
    if (wk_json_parse((const char *)data, size, &body, NULL) != WK_OK)
        return 0;
    ctl_resp_limits lim = {.max_items = 8, .max_item_bytes = 64, .max_tokens = 32};
    ctl_resp_req r;
    ctl_resp_err e;
    wk_err err = ctl_resp_req_parse(body, &lim, &r, &e);
    if (err == WK_OK) {
        fuzz_check(r.model != NULL && r.model[0] != '\0', "a model");
        fuzz_check(r.n_items >= 1 && r.n_items <= lim.max_items, "item count");
        for (size_t i = 0; i < r.n_items; i++) {
            const ctl_resp_msg *m = &r.items[i];
            const char *role = m->role;
            fuzz_check(role != NULL &&
                           (strcmp(role, "user") == 0 || strcmp(role, "assistant") == 0 ||
                            strcmp(role, "system") == 0 || strcmp(role, "tool") == 0),
                       "a known role");
            fuzz_check((strcmp(role, "tool") == 0) == (m->kind == CTL_RESP_FUNCTION_CALL_OUTPUT),
                       "role tool is a call's output");
            fuzz_check(m->reasoning == (m->kind == CTL_RESP_REASONING), "reasoning flag");
            bool call = m->kind == CTL_RESP_FUNCTION_CALL;
            fuzz_check((call || m->kind == CTL_RESP_FUNCTION_CALL_OUTPUT) == (m->call_id != NULL),
                       "a call_id exactly on function items");
            fuzz_check(call == (m->name != NULL), "a name exactly on a call");
            if (call) {
                json_t *a = json_loads(m->text, 0, NULL);
                fuzz_check(json_is_object(a), "a call's arguments are a JSON object");
                json_decref(a);
            }
            fuzz_check(r.items[i].text != NULL && r.items[i].text[r.items[i].len] == '\0',
                       "text NUL-terminated at its length");
            fuzz_check(r.items[i].len <= lim.max_item_bytes, "text within the limit");
        }
        fuzz_check(r.max_output_tokens <= lim.max_tokens, "max_output_tokens within the limit");
        fuzz_check(!r.has_temperature || (r.temperature >= 0 && r.temperature <= 2),
                   "temperature in range");
        fuzz_check(!r.has_top_p || (r.top_p >= 0 && r.top_p <= 1), "top_p in range");
        const json_t *p = json_object_get(body, "previous_response_id");
        fuzz_check(
            r.previous_response_id == NULL ||
                (json_is_string(p) && strcmp(r.previous_response_id, json_string_value(p)) == 0),
            "previous id is the body's");
        ctl_resp_req_fini(&r);
        ctl_resp_req_fini(&r);
        fuzz_check(r.items == NULL && r.n_items == 0, "fini zeroes");
    } else {
        fuzz_check(err == e.err, "the error is the one returned");
        fuzz_check(err == WK_EINVAL || err == WK_ETOOBIG || err == WK_ENOMEM, "a known error");
        fuzz_check(e.msg[0] != '\0', "a message");
        fuzz_check(r.items == NULL && r.model == NULL, "output zeroed on failure");
        fuzz_check(strlen(e.param) < sizeof(e.param), "param terminated");
    }
    json_decref(body);
    return 0;
}
