/*
 * ctl_resp_req: parses the body of POST /v1/responses into a ctl_resp_req
 * (see the header). Pure: reads the JSON, allocates the item texts, never
 * logs, never touches the model or the store. Every refusal names its
 * parameter; parameters the API has but wkvm does not implement are refused
 * with a clear message rather than silently ignored.
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_resp_req.h"

#define CTL_RESP_ITEMS_DEFAULT 4096u
#define CTL_RESP_ITEM_BYTES_DEFAULT ((uint64_t)4 << 20)
#define CTL_RESP_TOKENS_DEFAULT 65536u

static wk_err resp_fail(ctl_resp_err *e, wk_err err, const char *param, const char *code,
                        const char *fmt, ...) WK_PRINTF(5, 6);

static wk_err
resp_fail(ctl_resp_err *e, wk_err err, const char *param, const char *code, const char *fmt, ...)
{
    e->err = err;
    snprintf(e->param, sizeof(e->param), "%s", param != NULL ? param : "");
    snprintf(e->code, sizeof(e->code), "%s", code != NULL ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return err;
}

/* True when v is absent or JSON null. */
static bool
resp_absent(const json_t *v)
{
    return v == NULL || json_is_null(v);
}

/* The parameters this server knows, and how each is handled below. */
static const char *const resp_known[] = {
    "model",
    "input",
    "instructions",
    "previous_response_id",
    "store",
    "stream",
    "max_output_tokens",
    "temperature",
    "top_p",
    "text",
    "metadata",
    "user",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "truncation",
    "reasoning",
    "include",
    "background",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "stream_options",
    "top_logprobs",
    "max_tool_calls",
    "prompt",
    "conversation",
    /* wkvm extensions */
    "seed",
    "return_token_ids",
    "logit_bias",
    "frequency_penalty",
    "presence_penalty",
};

/*
 * Copies the text of one message's content (a string, or an array of text
 * parts) into *out. part_type: the text part type the role takes
 * ("input_text" or "output_text"); "text" and the other one are accepted too
 * (clients send both). pfx: the item's parameter name.
 */
static wk_err
resp_content(const json_t *content, const char *pfx, uint64_t max_bytes, const char *other,
             char **out, size_t *len, ctl_resp_err *e)
{
    char param[96];
    snprintf(param, sizeof(param), "%s.content", pfx);
    if (json_is_string(content)) {
        size_t n = json_string_length(content);
        if (n > max_bytes)
            return resp_fail(e, WK_ETOOBIG, param, "string_above_max_length",
                             "an item's text is limited to %llu bytes",
                             (unsigned long long)max_bytes);
        if ((*out = malloc(n + 1)) == NULL)
            return resp_fail(e, WK_ENOMEM, NULL, NULL, "out of memory");
        memcpy(*out, json_string_value(content), n);
        (*out)[n] = '\0';
        *len = n;
        return WK_OK;
    }
    if (!json_is_array(content))
        return resp_fail(e, WK_EINVAL, param, "invalid_type",
                         "content must be a string or an array of content parts");
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(content, i, part)
    {
        snprintf(param, sizeof(param), "%s.content[%zu].type", pfx, i);
        const json_t *type = json_object_get(part, "type");
        if (!json_is_object(part) || !json_is_string(type))
            return resp_fail(e, WK_EINVAL, param, "invalid_type",
                             "each content part needs a string 'type'");
        const char *t = json_string_value(type);
        if (strcmp(t, "input_text") != 0 && strcmp(t, "output_text") != 0 &&
            strcmp(t, "text") != 0 && (other == NULL || strcmp(t, other) != 0)) {
            bool known = strcmp(t, "input_image") == 0 || strcmp(t, "input_file") == 0 ||
                         strcmp(t, "input_audio") == 0 || strcmp(t, "refusal") == 0;
            return resp_fail(e, WK_EINVAL, param, "invalid_value",
                             known ? "content part type '%.64s' is not supported by wkvm "
                                     "(text only: input_text, output_text)"
                                   : "unknown content part type '%.64s' (input_text, "
                                     "output_text)",
                             t);
        }
        const json_t *text = json_object_get(part, "text");
        if (!json_is_string(text)) {
            snprintf(param, sizeof(param), "%s.content[%zu].text", pfx, i);
            return resp_fail(e, WK_EINVAL, param, "invalid_type",
                             "a text part needs a string 'text'");
        }
        total += json_string_length(text);
        if (total > max_bytes)
            return resp_fail(e, WK_ETOOBIG, param, "string_above_max_length",
                             "an item's text is limited to %llu bytes",
                             (unsigned long long)max_bytes);
    }
    char *s = malloc(total + 1);
    if (s == NULL)
        return resp_fail(e, WK_ENOMEM, NULL, NULL, "out of memory");
    size_t off = 0;
    json_array_foreach(content, i, part)
    {
        const json_t *text = json_object_get(part, "text");
        memcpy(s + off, json_string_value(text), json_string_length(text));
        off += json_string_length(text);
    }
    s[off] = '\0';
    *out = s;
    *len = off;
    return WK_OK;
}

/*
 * A reasoning item (as a previous response's output gave it): its
 * reasoning_text parts become the reasoning of the assistant message that
 * follows it. summary is accepted and not read (wkvm writes none);
 * encrypted_content cannot be read back (wkvm never makes any).
 */
static wk_err
resp_reasoning_item(const json_t *it, const char *pfx, uint64_t max_bytes, ctl_resp_msg *m,
                    ctl_resp_err *e)
{
    char param[96];
    const char *known[] = {"type", "id", "summary", "content", "encrypted_content", "status"};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)it, key, v)
    {
        bool ok = false;
        for (size_t i = 0; i < sizeof(known) / sizeof(known[0]) && !ok; i++)
            ok = strcmp(key, known[i]) == 0;
        if (!ok) {
            snprintf(param, sizeof(param), "%s.%.40s", pfx, key);
            return resp_fail(e, WK_EINVAL, param, "unknown_parameter",
                             "Unknown parameter: '%s.%.64s'.", pfx, key);
        }
    }
    if (!resp_absent(json_object_get(it, "encrypted_content"))) {
        snprintf(param, sizeof(param), "%s.encrypted_content", pfx);
        return resp_fail(e, WK_EINVAL, param, "invalid_value",
                         "wkvm keeps no encrypted reasoning: send the reasoning_text content "
                         "(or use previous_response_id)");
    }
    const json_t *sum = json_object_get(it, "summary");
    if (!resp_absent(sum) && !json_is_array(sum)) {
        snprintf(param, sizeof(param), "%s.summary", pfx);
        return resp_fail(e, WK_EINVAL, param, "invalid_type", "'summary' must be an array");
    }
    m->role = "assistant";
    m->reasoning = true;
    m->kind = CTL_RESP_REASONING;
    const json_t *content = json_object_get(it, "content");
    if (resp_absent(content)) {
        if ((m->text = calloc(1, 1)) == NULL)
            return resp_fail(e, WK_ENOMEM, NULL, NULL, "out of memory");
        m->len = 0;
        return WK_OK;
    }
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part)
    {
        const json_t *type = json_object_get(part, "type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "reasoning_text") != 0) {
            snprintf(param, sizeof(param), "%s.content[%zu].type", pfx, i);
            return resp_fail(e, WK_EINVAL, param, "invalid_value",
                             "a reasoning item's content parts are of type 'reasoning_text'");
        }
    }
    return resp_content(content, pfx, max_bytes, "reasoning_text", &m->text, &m->len, e);
}

/* An optional string member of an item (max bytes) into *out; required: absent is refused. */
static wk_err
resp_item_str(const json_t *it, const char *pfx, const char *key, bool required, size_t max,
              const char **out, ctl_resp_err *e)
{
    char param[96];
    snprintf(param, sizeof(param), "%s.%s", pfx, key);
    const json_t *v = json_object_get(it, key);
    *out = NULL;
    if (resp_absent(v)) {
        if (required)
            return resp_fail(e, WK_EINVAL, param, "missing_required_parameter", "'%s' is required",
                             param);
        return WK_OK;
    }
    if (!json_is_string(v) || json_string_length(v) > max ||
        strlen(json_string_value(v)) != json_string_length(v))
        return resp_fail(e, WK_EINVAL, param, "invalid_type",
                         "'%s' must be a string of at most %zu bytes", param, max);
    *out = json_string_value(v);
    return WK_OK;
}

/*
 * A function_call item (a call the model made: call_id, name, arguments as
 * JSON text) or a function_call_output item (call_id, output: a string or
 * text parts). id and status are accepted.
 */
static wk_err
resp_call_item(const json_t *it, const char *pfx, uint64_t max_bytes, bool call, ctl_resp_msg *m,
               ctl_resp_err *e)
{
    char param[96];
    const char *known_call[] = {"type", "id", "status", "call_id", "name", "arguments"};
    const char *known_out[] = {"type", "id", "status", "call_id", "output"};
    const char *const *known = call ? known_call : known_out;
    size_t n_known = call ? 6 : 5;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)it, key, v)
    {
        bool ok = false;
        for (size_t i = 0; i < n_known && !ok; i++)
            ok = strcmp(key, known[i]) == 0;
        if (!ok) {
            snprintf(param, sizeof(param), "%s.%.40s", pfx, key);
            return resp_fail(e, WK_EINVAL, param, "unknown_parameter",
                             "Unknown parameter: '%s.%.64s'.", pfx, key);
        }
    }
    wk_err err = resp_item_str(it, pfx, "call_id", true, CTL_RESP_CALL_ID_MAX, &m->call_id, e);
    if (err != WK_OK)
        return err;
    if (call) {
        m->kind = CTL_RESP_FUNCTION_CALL;
        m->role = "assistant";
        const char *args = NULL;
        if ((err = resp_item_str(it, pfx, "name", true, CTL_RESP_TOOL_NAME_MAX, &m->name, e)) !=
                WK_OK ||
            (err = resp_item_str(it, pfx, "arguments", true, max_bytes, &args, e)) != WK_OK)
            return err;
        json_error_t je;
        json_t *o = json_loads(args, JSON_REJECT_DUPLICATES, &je);
        bool obj = json_is_object(o);
        json_decref(o);
        if (!obj) {
            snprintf(param, sizeof(param), "%s.arguments", pfx);
            return resp_fail(e, WK_EINVAL, param, "invalid_value",
                             "'arguments' must be the text of a JSON object");
        }
        if ((m->text = strdup(args)) == NULL)
            return resp_fail(e, WK_ENOMEM, NULL, NULL, "out of memory");
        m->len = strlen(args);
        return WK_OK;
    }
    m->kind = CTL_RESP_FUNCTION_CALL_OUTPUT;
    m->role = "tool";
    const json_t *out = json_object_get(it, "output");
    if (resp_absent(out))
        return resp_fail(e, WK_EINVAL, pfx, "missing_required_parameter",
                         "a function_call_output item needs 'output'");
    snprintf(param, sizeof(param), "%s.output", pfx);
    return resp_content(out, param, max_bytes, NULL, &m->text, &m->len, e);
}

/* One item of an input array into m. */
static wk_err
resp_item(const json_t *it, size_t idx, uint64_t max_bytes, ctl_resp_msg *m, ctl_resp_err *e)
{
    char pfx[48], param[96];
    snprintf(pfx, sizeof(pfx), "input[%zu]", idx);
    if (!json_is_object(it))
        return resp_fail(e, WK_EINVAL, pfx, "invalid_type", "each input item must be an object");
    const json_t *type = json_object_get(it, "type");
    if (!resp_absent(type)) {
        snprintf(param, sizeof(param), "%s.type", pfx);
        if (!json_is_string(type))
            return resp_fail(e, WK_EINVAL, param, "invalid_type", "'type' must be a string");
        const char *t = json_string_value(type);
        if (strcmp(t, "function_call") == 0 || strcmp(t, "function_call_output") == 0)
            return resp_call_item(it, pfx, max_bytes, strcmp(t, "function_call") == 0, m, e);
        if (strcmp(t, "custom_tool_call") == 0 || strcmp(t, "custom_tool_call_output") == 0)
            return resp_fail(e, WK_EINVAL, param, "invalid_value",
                             "input items of type '%s' are not supported by wkvm (function "
                             "tools only)",
                             t);
        if (strcmp(t, "reasoning") == 0)
            return resp_reasoning_item(it, pfx, max_bytes, m, e);
        if (strcmp(t, "item_reference") == 0)
            return resp_fail(e, WK_EINVAL, param, "invalid_value",
                             "input items of type '%s' are not supported by wkvm "
                             "(use previous_response_id)",
                             t);
        if (strcmp(t, "message") != 0)
            return resp_fail(e, WK_EINVAL, param, "invalid_value",
                             "unknown input item type '%.64s' (message)", t);
    }
    const json_t *role = json_object_get(it, "role");
    snprintf(param, sizeof(param), "%s.role", pfx);
    if (!json_is_string(role))
        return resp_fail(e, WK_EINVAL, param, "invalid_type",
                         "a message item needs a string 'role'");
    const char *r = json_string_value(role);
    if (strcmp(r, "user") == 0)
        m->role = "user";
    else if (strcmp(r, "assistant") == 0)
        m->role = "assistant";
    else if (strcmp(r, "system") == 0 || strcmp(r, "developer") == 0)
        m->role = "system";
    else
        return resp_fail(e, WK_EINVAL, param, "invalid_value",
                         "role '%.64s' is not supported (user, assistant, system, developer)", r);
    const char *known[] = {"type", "role", "content", "id", "status"};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)it, key, v)
    {
        bool ok = false;
        for (size_t i = 0; i < sizeof(known) / sizeof(known[0]) && !ok; i++)
            ok = strcmp(key, known[i]) == 0;
        if (!ok) {
            snprintf(param, sizeof(param), "%s.%.40s", pfx, key);
            return resp_fail(e, WK_EINVAL, param, "unknown_parameter",
                             "Unknown parameter: '%s.%.64s'.", pfx, key);
        }
    }
    const json_t *content = json_object_get(it, "content");
    if (content == NULL)
        return resp_fail(e, WK_EINVAL, pfx, "missing_required_parameter",
                         "a message item needs 'content'");
    return resp_content(content, pfx, max_bytes, NULL, &m->text, &m->len, e);
}

/* The input: a string (one user message) or an array of items. */
static wk_err
resp_input(const json_t *in, const ctl_resp_limits *lim, ctl_resp_req *r, ctl_resp_err *e)
{
    if (resp_absent(in))
        return resp_fail(e, WK_EINVAL, "input", "missing_required_parameter",
                         "'input' is required (a string or an array of input items)");
    if (json_is_string(in)) {
        if ((r->items = calloc(1, sizeof(*r->items))) == NULL)
            return resp_fail(e, WK_ENOMEM, NULL, NULL, "out of memory");
        r->n_items = 1;
        r->items[0].role = "user";
        return resp_content(in, "input", lim->max_item_bytes, NULL, &r->items[0].text,
                            &r->items[0].len, e);
    }
    if (!json_is_array(in) || json_array_size(in) == 0)
        return resp_fail(e, WK_EINVAL, "input", "invalid_type",
                         "'input' must be a string or a non-empty array of input items");
    size_t n = json_array_size(in);
    if (n > lim->max_items)
        return resp_fail(e, WK_ETOOBIG, "input", "array_above_max_length", "at most %u input items",
                         lim->max_items);
    if ((r->items = calloc(n, sizeof(*r->items))) == NULL)
        return resp_fail(e, WK_ENOMEM, NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        r->n_items = i + 1; /* (fini frees what the failed item may hold) */
        wk_err err = resp_item(json_array_get(in, i), i, lim->max_item_bytes, &r->items[i], e);
        if (err != WK_OK)
            return err;
    }
    return WK_OK;
}

/* An optional string parameter of at most max bytes into *out (NULL when absent). */
static wk_err
resp_str(const json_t *body, const char *key, size_t max, const char **out, size_t *len,
         ctl_resp_err *e)
{
    const json_t *v = json_object_get(body, key);
    *out = NULL;
    if (len != NULL)
        *len = 0;
    if (resp_absent(v))
        return WK_OK;
    if (!json_is_string(v))
        return resp_fail(e, WK_EINVAL, key, "invalid_type", "'%s' must be a string", key);
    if (json_string_length(v) > max)
        return resp_fail(e, WK_ETOOBIG, key, "string_above_max_length",
                         "'%s' is limited to %zu bytes", key, max);
    *out = json_string_value(v);
    if (len != NULL)
        *len = json_string_length(v);
    return WK_OK;
}

/* An optional boolean parameter (def when absent). */
static wk_err
resp_bool(const json_t *body, const char *key, bool def, bool *out, ctl_resp_err *e)
{
    const json_t *v = json_object_get(body, key);
    if (resp_absent(v)) {
        *out = def;
        return WK_OK;
    }
    if (!json_is_boolean(v))
        return resp_fail(e, WK_EINVAL, key, "invalid_type", "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return WK_OK;
}

/* An optional number in [lo, hi]; *has says whether it was given. */
static wk_err
resp_num(const json_t *body, const char *key, double lo, double hi, bool *has, double *out,
         ctl_resp_err *e)
{
    const json_t *v = json_object_get(body, key);
    *has = false;
    if (resp_absent(v))
        return WK_OK;
    if (!json_is_number(v))
        return resp_fail(e, WK_EINVAL, key, "invalid_type", "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return resp_fail(e, WK_EINVAL, key, "invalid_value", "'%s' must be in [%g, %g]", key, lo,
                         hi);
    *has = true;
    *out = x;
    return WK_OK;
}

/* The parameters wkvm accepts only in their neutral form. */
/*
 * One tool of "tools": a function tool as the Responses API writes it,
 * {"type": "function", "name", "description"?, "parameters"?, "strict"?}.
 * Other tool types (web_search, file_search, custom, mcp, ...) are refused:
 * wkvm runs none of them.
 */
static wk_err
resp_tool(const json_t *t, size_t i, ctl_resp_err *e)
{
    char param[96];
    const json_t *type = json_object_get(t, "type");
    snprintf(param, sizeof(param), "tools[%zu].type", i);
    if (!json_is_object(t) || !json_is_string(type))
        return resp_fail(e, WK_EINVAL, param, "invalid_type",
                         "each tool must be an object with a string 'type'");
    if (strcmp(json_string_value(type), "function") != 0)
        return resp_fail(e, WK_EINVAL, param, "invalid_value",
                         "tool type '%.64s' is not supported by wkvm (function tools only)",
                         json_string_value(type));
    const char *key;
    json_t *x;
    json_object_foreach((json_t *)t, key, x)
    {
        if (strcmp(key, "type") != 0 && strcmp(key, "name") != 0 &&
            strcmp(key, "description") != 0 && strcmp(key, "parameters") != 0 &&
            strcmp(key, "strict") != 0) {
            snprintf(param, sizeof(param), "tools[%zu].%.40s", i, key);
            return resp_fail(e, WK_EINVAL, param, "unknown_parameter",
                             "Unknown parameter: 'tools[%zu].%.64s'.", i, key);
        }
    }
    const json_t *name = json_object_get(t, "name");
    size_t nl = json_is_string(name) ? json_string_length(name) : 0;
    bool ok = nl > 0 && nl <= CTL_RESP_TOOL_NAME_MAX;
    for (size_t k = 0; ok && k < nl; k++) {
        char ch = json_string_value(name)[k];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
             ch == '_' || ch == '-' || ch == '.';
    }
    if (!ok) {
        snprintf(param, sizeof(param), "tools[%zu].name", i);
        return resp_fail(e, WK_EINVAL, param, "invalid_value",
                         "a function tool needs a 'name' of 1..%u bytes of [a-zA-Z0-9_.-]",
                         CTL_RESP_TOOL_NAME_MAX);
    }
    const json_t *p = json_object_get(t, "parameters");
    const json_t *d = json_object_get(t, "description");
    const json_t *st = json_object_get(t, "strict");
    if ((!resp_absent(p) && !json_is_object(p)) || (!resp_absent(d) && !json_is_string(d)) ||
        (!resp_absent(st) && !json_is_boolean(st))) {
        snprintf(param, sizeof(param), "tools[%zu]", i);
        return resp_fail(e, WK_EINVAL, param, "invalid_type",
                         "'parameters' must be an object, 'description' a string, 'strict' a "
                         "boolean");
    }
    return WK_OK;
}

/*
 * tool_choice {"type": "allowed_tools", "mode": "auto" | "required",
 * "tools": [{"type": "function", "name": ...}, ...]}: every tool still
 * reaches the template (the prompt, and so its checkpoints, do not change
 * with the choice), and a call may name only the listed ones. Each must be
 * a function among the request's tools (r->tools, parsed before).
 */
static wk_err
resp_allowed_tools(const json_t *v, ctl_resp_req *r, ctl_resp_err *e)
{
    const char *key;
    json_t *x;
    json_object_foreach((json_t *)v, key, x)
    {
        if (strcmp(key, "type") != 0 && strcmp(key, "mode") != 0 && strcmp(key, "tools") != 0) {
            char param[96];
            snprintf(param, sizeof(param), "tool_choice.%.40s", key);
            return resp_fail(e, WK_EINVAL, param, "unknown_parameter",
                             "Unknown parameter: 'tool_choice.%.64s'.", key);
        }
    }
    const char *mode = json_string_value(json_object_get(v, "mode"));
    if (mode == NULL || (strcmp(mode, "auto") != 0 && strcmp(mode, "required") != 0))
        return resp_fail(e, WK_EINVAL, "tool_choice.mode", "invalid_value",
                         "'tool_choice.mode' must be \"auto\" or \"required\"");
    const json_t *list = json_object_get(v, "tools");
    if (!json_is_array(list) || json_array_size(list) == 0 ||
        json_array_size(list) > CTL_RESP_TOOLS_MAX)
        return resp_fail(e, WK_EINVAL, "tool_choice.tools", "invalid_type",
                         "'tool_choice.tools' must be an array of 1 to %u tools",
                         CTL_RESP_TOOLS_MAX);
    size_t i;
    json_t *t;
    json_array_foreach(list, i, t)
    {
        char param[96];
        snprintf(param, sizeof(param), "tool_choice.tools[%zu]", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        const json_t *name = json_object_get(t, "name");
        if (!json_is_object(t) || type == NULL || strcmp(type, "function") != 0)
            return resp_fail(e, WK_EINVAL, param, "invalid_value",
                             "'%s' must be {\"type\": \"function\", \"name\": ...}: wkvm "
                             "serves function tools only",
                             param);
        if (json_object_size(t) != 2 || !json_is_string(name))
            return resp_fail(e, WK_EINVAL, param, "invalid_value",
                             "'%s' names a function by a string 'name' (and nothing else)", param);
        bool found = false;
        size_t k;
        json_t *o;
        json_array_foreach(r->tools, k, o)
        {
            found = found || json_equal(json_object_get(o, "name"), name);
        }
        if (!found)
            return resp_fail(e, WK_EINVAL, param, "invalid_value",
                             "'%s' names function '%.64s', which is not among the 'tools'", param,
                             json_string_value(name));
    }
    r->allowed_tools = v;
    r->allowed_required = strcmp(mode, "required") == 0;
    return WK_OK;
}

/*
 * reasoning: {"effort", "summary", "generate_summary"}, each null or one of
 * the API's values. The effort reaches the template (ctl_responses decides
 * whether it knows one); a summary is echoed and never generated (no
 * summarizer: a reasoning item's summary is the empty list).
 */
static wk_err
resp_reasoning(const json_t *v, ctl_resp_req *r, ctl_resp_err *e)
{
    if (resp_absent(v))
        return WK_OK;
    if (!json_is_object(v))
        return resp_fail(e, WK_EINVAL, "reasoning", "invalid_type",
                         "'reasoning' must be an object");
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    static const char *const summaries[] = {"auto", "concise", "detailed"};
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x)
    {
        bool effort = strcmp(k, "effort") == 0;
        if (!effort && strcmp(k, "summary") != 0 && strcmp(k, "generate_summary") != 0) {
            char param[96];
            snprintf(param, sizeof(param), "reasoning.%.40s", k);
            return resp_fail(e, WK_EINVAL, param, "unknown_parameter",
                             "Unknown parameter: 'reasoning.%.64s'.", k);
        }
        if (resp_absent(x))
            continue;
        const char *const *allowed = effort ? efforts : summaries;
        size_t n = effort ? sizeof(efforts) / sizeof(efforts[0])
                          : sizeof(summaries) / sizeof(summaries[0]);
        bool ok = false;
        for (size_t i = 0; json_is_string(x) && i < n && !ok; i++)
            ok = strcmp(json_string_value(x), allowed[i]) == 0;
        if (!ok) {
            char param[96];
            snprintf(param, sizeof(param), "reasoning.%s", k);
            return resp_fail(e, WK_EINVAL, param, "invalid_value", "'%s' must be one of %s", param,
                             effort ? "none, minimal, low, medium, high, xhigh"
                                    : "auto, concise, detailed");
        }
        if (effort)
            r->reasoning_effort = json_string_value(x);
        else if (r->reasoning_summary == NULL || strcmp(k, "summary") == 0)
            r->reasoning_summary = json_string_value(x); /* (summary over generate_summary) */
    }
    return WK_OK;
}

static wk_err
resp_neutral(const json_t *body, ctl_resp_req *r, ctl_resp_err *e)
{
    wk_err err;
    /*
     * Tools, as the chat route treats them: offered function tools go to the
     * template and the reply is parsed for calls; "required" or a named
     * function is enforced while sampling (ctl_responses, ctl_toolgram).
     */
    const json_t *v = json_object_get(body, "tools");
    if (!resp_absent(v)) {
        if (!json_is_array(v) || json_array_size(v) > CTL_RESP_TOOLS_MAX)
            return resp_fail(e, WK_EINVAL, "tools", "invalid_type",
                             "'tools' must be an array of at most %u tools", CTL_RESP_TOOLS_MAX);
        size_t i;
        json_t *t;
        json_array_foreach(v, i, t)
        {
            if ((err = resp_tool(t, i, e)) != WK_OK)
                return err;
        }
        r->tools = json_array_size(v) > 0 ? v : NULL;
    }
    v = json_object_get(body, "tool_choice");
    const char *choice = json_is_string(v) ? json_string_value(v) : NULL;
    const json_t *fname = json_object_get(v, "name");
    const char *ctype = json_string_value(json_object_get(v, "type"));
    bool named = json_is_object(v) && ctype != NULL && strcmp(ctype, "function") == 0;
    bool allowed = json_is_object(v) && ctype != NULL && strcmp(ctype, "allowed_tools") == 0;
    if (!resp_absent(v) &&
        !(choice != NULL && (strcmp(choice, "auto") == 0 || strcmp(choice, "none") == 0 ||
                             strcmp(choice, "required") == 0)) &&
        !named && !allowed)
        return resp_fail(e, WK_EINVAL, "tool_choice", "invalid_value",
                         json_is_object(v)
                             ? "'tool_choice' may name a function ({\"type\": \"function\", "
                               "\"name\": ...}) or allowed functions ({\"type\": "
                               "\"allowed_tools\", ...}) only; wkvm serves function tools only"
                             : "'tool_choice' must be \"auto\", \"none\", \"required\", "
                               "{\"type\": \"function\", \"name\": ...} or {\"type\": "
                               "\"allowed_tools\", \"mode\": ..., \"tools\": [...]}");
    if (allowed && (err = resp_allowed_tools(v, r, e)) != WK_OK)
        return err;
    if (named) {
        size_t k;
        json_t *t;
        bool found = false;
        const char *key;
        json_t *x;
        json_object_foreach((json_t *)v, key, x)
        {
            if (strcmp(key, "type") != 0 && strcmp(key, "name") != 0)
                return resp_fail(e, WK_EINVAL, "tool_choice", "unknown_parameter",
                                 "Unknown parameter: 'tool_choice.%.64s'.", key);
        }
        if (!json_is_string(fname))
            return resp_fail(e, WK_EINVAL, "tool_choice.name", "invalid_type",
                             "'tool_choice' names a function by a string 'name'");
        json_array_foreach(r->tools, k, t)
        {
            found = found || json_equal(json_object_get(t, "name"), fname);
        }
        if (!found)
            return resp_fail(e, WK_EINVAL, "tool_choice", "invalid_value",
                             "'tool_choice' names function '%.64s', which is not among the "
                             "'tools'",
                             json_string_value(fname));
        r->tool_name = json_string_value(fname);
    }
    r->tool_required =
        named || r->allowed_required || (choice != NULL && strcmp(choice, "required") == 0);
    if (r->tool_required && r->tools == NULL)
        return resp_fail(e, WK_EINVAL, "tool_choice", "invalid_value",
                         "'tool_choice' cannot require a call: the request offers no 'tools'");
    r->tool_choice_none = json_is_string(v) && strcmp(json_string_value(v), "none") == 0;
    v = json_object_get(body, "parallel_tool_calls");
    if (!resp_absent(v) && !json_is_boolean(v))
        return resp_fail(e, WK_EINVAL, "parallel_tool_calls", "invalid_type",
                         "'parallel_tool_calls' must be a boolean");
    r->parallel_tool_calls_off = json_is_false(v);
    v = json_object_get(body, "max_tool_calls");
    if (!resp_absent(v) && !(json_is_integer(v) && json_integer_value(v) >= 0))
        return resp_fail(e, WK_EINVAL, "max_tool_calls", "invalid_type",
                         "'max_tool_calls' must be a non-negative integer");
    v = json_object_get(body, "truncation");
    if (!resp_absent(v) && !(json_is_string(v) && (strcmp(json_string_value(v), "disabled") == 0 ||
                                                   strcmp(json_string_value(v), "auto") == 0)))
        return resp_fail(e, WK_EINVAL, "truncation", "invalid_value",
                         "'truncation' must be \"auto\" or \"disabled\"");
    if ((err = resp_reasoning(json_object_get(body, "reasoning"), r, e)) != WK_OK)
        return err;
    v = json_object_get(body, "include");
    if (!resp_absent(v) && !(json_is_array(v) && json_array_size(v) == 0))
        return resp_fail(e, WK_EINVAL, "include", "invalid_value",
                         "'include' is not supported by wkvm (no extra output data)");
    v = json_object_get(body, "service_tier");
    if (!resp_absent(v) && !(json_is_string(v) && (strcmp(json_string_value(v), "auto") == 0 ||
                                                   strcmp(json_string_value(v), "default") == 0)))
        return resp_fail(e, WK_EINVAL, "service_tier", "invalid_value",
                         "'service_tier' must be \"auto\" or \"default\"");
    v = json_object_get(body, "top_logprobs");
    if (!resp_absent(v) && !(json_is_integer(v) && json_integer_value(v) == 0))
        return resp_fail(e, WK_EINVAL, "top_logprobs", "invalid_value",
                         "'top_logprobs' is not supported yet by wkvm's Responses API");
    v = json_object_get(body, "stream_options");
    if (!resp_absent(v) && !json_is_object(v))
        return resp_fail(e, WK_EINVAL, "stream_options", "invalid_type",
                         "'stream_options' must be an object");
    static const char *const refused[] = {"prompt", "conversation"};
    for (size_t i = 0; i < 2; i++) {
        if (!resp_absent(json_object_get(body, refused[i])))
            return resp_fail(e, WK_EINVAL, refused[i], "invalid_value",
                             "'%s' is not supported by wkvm (use previous_response_id)",
                             refused[i]);
    }
    return WK_OK;
}

/* text: {"format": {"type": "text"}, "verbosity": ...}. */
static wk_err
resp_text(const json_t *body, ctl_resp_err *e)
{
    const json_t *t = json_object_get(body, "text");
    if (resp_absent(t))
        return WK_OK;
    if (!json_is_object(t))
        return resp_fail(e, WK_EINVAL, "text", "invalid_type", "'text' must be an object");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)t, key, v)
    {
        if (strcmp(key, "format") == 0) {
            if (resp_absent(v))
                continue;
            const json_t *ty = json_object_get(v, "type");
            if (!json_is_object(v) || !json_is_string(ty))
                return resp_fail(e, WK_EINVAL, "text.format", "invalid_type",
                                 "'text.format' must be an object with a string 'type'");
            if (strcmp(json_string_value(ty), "text") != 0)
                return resp_fail(e, WK_EINVAL, "text.format", "invalid_value",
                                 "text.format type '%.64s' is not supported by wkvm (only "
                                 "\"text\"; no structured outputs)",
                                 json_string_value(ty));
        } else if (strcmp(key, "verbosity") == 0) {
            if (!resp_absent(v) && !json_is_string(v))
                return resp_fail(e, WK_EINVAL, "text.verbosity", "invalid_type",
                                 "'text.verbosity' must be a string");
        } else {
            char param[96];
            snprintf(param, sizeof(param), "text.%.40s", key);
            return resp_fail(e, WK_EINVAL, param, "unknown_parameter",
                             "Unknown parameter: 'text.%.64s'.", key);
        }
    }
    return WK_OK;
}

/* metadata: up to 16 string pairs (keys <= 64 bytes, values <= 512). */
static wk_err
resp_metadata(const json_t *body, ctl_resp_req *r, ctl_resp_err *e)
{
    const json_t *m = json_object_get(body, "metadata");
    if (resp_absent(m))
        return WK_OK;
    if (!json_is_object(m))
        return resp_fail(e, WK_EINVAL, "metadata", "invalid_type", "'metadata' must be an object");
    if (json_object_size(m) > CTL_RESP_METADATA_MAX)
        return resp_fail(e, WK_EINVAL, "metadata", "object_above_max_properties",
                         "'metadata' holds at most %u pairs", CTL_RESP_METADATA_MAX);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)m, key, v)
    {
        if (strlen(key) > CTL_RESP_METADATA_KEY_MAX || !json_is_string(v) ||
            json_string_length(v) > CTL_RESP_METADATA_VAL_MAX)
            return resp_fail(e, WK_EINVAL, "metadata", "invalid_value",
                             "metadata keys are strings of at most %u bytes, values strings of "
                             "at most %u",
                             CTL_RESP_METADATA_KEY_MAX, CTL_RESP_METADATA_VAL_MAX);
    }
    r->metadata = m;
    return WK_OK;
}

bool
ctl_resp_id_valid(const char *id)
{
    if (id == NULL || strncmp(id, "resp_", 5) != 0)
        return false;
    size_t n = strlen(id + 5);
    if (n == 0 || n > CTL_RESP_ID_MAX - 5)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = id[5 + i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
    }
    return true;
}

static wk_err
resp_parse(const json_t *body, const ctl_resp_limits *lim, ctl_resp_req *r, ctl_resp_err *e)
{
    if (!json_is_object(body))
        return resp_fail(e, WK_EINVAL, NULL, "invalid_type",
                         "the request body must be a JSON object");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)body, key, v)
    {
        bool ok = false;
        for (size_t i = 0; i < sizeof(resp_known) / sizeof(resp_known[0]) && !ok; i++)
            ok = strcmp(key, resp_known[i]) == 0;
        if (!ok) {
            char param[96];
            snprintf(param, sizeof(param), "%.90s", key);
            return resp_fail(e, WK_EINVAL, param, "unknown_parameter",
                             "Unknown parameter: '%.64s'.", key);
        }
    }
    wk_err err;
    const json_t *model = json_object_get(body, "model");
    if (!json_is_string(model) || json_string_length(model) == 0 || json_string_length(model) > 256)
        return resp_fail(e, WK_EINVAL, "model", "missing_required_parameter",
                         "'model' is required (a string of at most 256 bytes)");
    r->model = json_string_value(model);
    if ((err = resp_neutral(body, r, e)) != WK_OK || (err = resp_text(body, e)) != WK_OK ||
        (err = resp_metadata(body, r, e)) != WK_OK)
        return err;
    if ((err = resp_str(body, "instructions", lim->max_item_bytes, &r->instructions,
                        &r->instructions_len, e)) != WK_OK ||
        (err = resp_str(body, "user", CTL_RESP_USER_MAX, &r->user, NULL, e)) != WK_OK)
        return err;
    const char *s = NULL;
    if ((err = resp_str(body, "safety_identifier", CTL_RESP_USER_MAX, &s, NULL, e)) != WK_OK ||
        (err = resp_str(body, "prompt_cache_key", CTL_RESP_USER_MAX, &s, NULL, e)) != WK_OK)
        return err;
    if ((err = resp_str(body, "previous_response_id", 256, &r->previous_response_id, NULL, e)) !=
        WK_OK)
        return err;
    if ((err = resp_bool(body, "store", true, &r->store, e)) != WK_OK ||
        (err = resp_bool(body, "stream", false, &r->stream, e)) != WK_OK ||
        (err = resp_bool(body, "return_token_ids", false, &r->return_token_ids, e)) != WK_OK ||
        (err = resp_bool(body, "background", false, &r->background, e)) != WK_OK)
        return err;
    if (r->background && !r->store)
        return resp_fail(e, WK_EINVAL, "background", "invalid_value",
                         "a background response must be stored: 'background' needs store: true");

    if (!r->stream && !resp_absent(json_object_get(body, "stream_options")))
        return resp_fail(e, WK_EINVAL, "stream_options", "invalid_value",
                         "'stream_options' needs stream: true");
    r->temperature = 1.0;
    r->top_p = 1.0;
    if ((err = resp_num(body, "temperature", 0.0, 2.0, &r->has_temperature, &r->temperature, e)) !=
            WK_OK ||
        (err = resp_num(body, "top_p", 0.0, 1.0, &r->has_top_p, &r->top_p, e)) != WK_OK)
        return err;
    v = json_object_get(body, "max_output_tokens");
    if (!resp_absent(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > (json_int_t)lim->max_tokens)
            return resp_fail(e, WK_EINVAL, "max_output_tokens", "invalid_value",
                             "'max_output_tokens' must be an integer in [1, %u]", lim->max_tokens);
        r->max_output_tokens = (uint32_t)json_integer_value(v);
    }
    if ((err = resp_num(body, "frequency_penalty", -2.0, 2.0, &r->has_frequency_penalty,
                        &r->frequency_penalty, e)) != WK_OK ||
        (err = resp_num(body, "presence_penalty", -2.0, 2.0, &r->has_presence_penalty,
                        &r->presence_penalty, e)) != WK_OK)
        return err;
    v = json_object_get(body, "logit_bias");
    if (!resp_absent(v)) {
        bool ok = json_is_object(v) && json_object_size(v) <= CTL_RESP_BIAS_MAX;
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x)
        {
            size_t kl = strlen(k);
            ok = ok && kl > 0 && kl <= 9 && strspn(k, "0123456789") == kl && json_is_number(x) &&
                 json_number_value(x) >= -100.0 && json_number_value(x) <= 100.0;
        }
        if (!ok)
            return resp_fail(e, WK_EINVAL, "logit_bias", "invalid_value",
                             "'logit_bias' must be an object of at most %u token ids (decimal "
                             "strings) -> numbers in [-100, 100]",
                             CTL_RESP_BIAS_MAX);
        r->logit_bias = v;
    }
    v = json_object_get(body, "seed");
    if (!resp_absent(v)) {
        if (!json_is_integer(v))
            return resp_fail(e, WK_EINVAL, "seed", "invalid_type", "'seed' must be an integer");
        r->has_seed = true;
        r->seed = json_integer_value(v);
    }
    return resp_input(json_object_get(body, "input"), lim, r, e);
}

wk_err
ctl_resp_req_parse(const json_t *body, const ctl_resp_limits *lim, ctl_resp_req *out,
                   ctl_resp_err *e)
{
    ctl_resp_limits l = lim != NULL ? *lim : (ctl_resp_limits){0};
    if (l.max_items == 0)
        l.max_items = CTL_RESP_ITEMS_DEFAULT;
    if (l.max_item_bytes == 0)
        l.max_item_bytes = CTL_RESP_ITEM_BYTES_DEFAULT;
    if (l.max_tokens == 0)
        l.max_tokens = CTL_RESP_TOKENS_DEFAULT;
    memset(e, 0, sizeof(*e));
    ctl_resp_req r = {0};
    wk_err err = resp_parse(body, &l, &r, e);
    if (err != WK_OK) {
        ctl_resp_req_fini(&r);
        memset(out, 0, sizeof(*out));
        return err;
    }
    *out = r;
    return WK_OK;
}

void
ctl_resp_req_fini(ctl_resp_req *r)
{
    if (r == NULL)
        return;
    for (size_t i = 0; r->items != NULL && i < r->n_items; i++)
        free(r->items[i].text);
    free(r->items);
    memset(r, 0, sizeof(*r));
}
