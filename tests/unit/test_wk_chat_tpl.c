/*
 * Unit tests for wk_chat_tpl: where a model directory's chat template is
 * found (chat_template.jinja before tokenizer_config.json; a string or
 * named templates), special tokens as strings or AddedToken objects, what
 * a render passes to the template (tools null when absent, kwargs), and the
 * errors for a directory without a template or with a refused one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "wk_chat_tpl.h"

static char dir[64];

static void
put(const char *name, const char *text)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Writes DIR/model.gguf: no tensors; tokens "<s>", "</s>"; bos 0, eos 1; the template. */
static void
put_gguf(const char *tpl)
{
    static uint8_t b[4096];
    size_t n = 0;
#define PUT(p, len) (memcpy(b + n, (p), (len)), n += (len))
#define U32(v)                                                                                     \
    do {                                                                                           \
        uint32_t x_ = (v);                                                                         \
        PUT(&x_, 4);                                                                               \
    } while (0)
#define U64(v)                                                                                     \
    do {                                                                                           \
        uint64_t x_ = (v);                                                                         \
        PUT(&x_, 8);                                                                               \
    } while (0)
#define STR(s)                                                                                     \
    do {                                                                                           \
        U64(strlen(s));                                                                            \
        PUT((s), strlen(s));                                                                       \
    } while (0)
    PUT("GGUF", 4);
    U32(3);
    U64(0); /* tensors */
    U64(4); /* key/values */
    STR("tokenizer.chat_template");
    U32(8); /* STRING */
    STR(tpl);
    STR("tokenizer.ggml.tokens");
    U32(9); /* ARRAY */
    U32(8); /* of STRING */
    U64(2);
    STR("<s>");
    STR("</s>");
    STR("tokenizer.ggml.bos_token_id");
    U32(4); /* UINT32 */
    U32(0);
    STR("tokenizer.ggml.eos_token_id");
    U32(4);
    U32(1);
#undef PUT
#undef U32
#undef U64
#undef STR
    char path[128];
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static void
clear(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/override.jinja", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    unlink(path);
}

static int
setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/wk_chat_tpl.XXXXXX");
    return mkdtemp(dir) == NULL ? -1 : 0;
}

static int
teardown(void **state)
{
    (void)state;
    clear();
    return rmdir(dir);
}

/* Renders one user message "hi" with the template in dir. */
static char *
render_hi(wk_chat_tpl *t, bool agp)
{
    wk_chat_msg m = {.role = "user", .content = "hi"};
    char *out = NULL;
    size_t len = 0;
    wk_diag d = {{0}};
    assert_int_equal(wk_chat_tpl_render(t, &m, 1, agp, &out, &len, &d), WK_OK);
    assert_int_equal(len, strlen(out));
    return out;
}

static void
test_none(void **state)
{
    (void)state;
    wk_chat_tpl *t = NULL;
    wk_diag d = {{0}};
    clear();
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_ENOENT);
    assert_null(t);
    put("tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_ENOENT);
    assert_non_null(strstr(d.msg, "no chat template"));
    put("tokenizer_config.json", "{\"chat_template\": 5}");
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_EINVAL);
    put("tokenizer_config.json", "{\"chat_template\": ");
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_EINVAL);
}

static void
test_config_string(void **state)
{
    (void)state;
    wk_chat_tpl *t = NULL;
    wk_diag d = {{0}};
    clear();
    put("tokenizer_config.json",
        "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\"}, \"eos_token\": "
        "\"</s>\","
        " \"chat_template\": \"{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]"
        "{% endfor %}{{ tools is none }}{% if add_generation_prompt %}A:{% endif %}{{ eos_token "
        "}}\"}");
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_OK);
    assert_string_equal(wk_chat_tpl_source(t), "tokenizer_config.json");
    char *out = render_hi(t, true);
    assert_string_equal(out, "<s>[user:hi]TrueA:</s>");
    free(out);
    /* the special tokens as the template sees them; no think markers in this one */
    assert_string_equal(wk_chat_tpl_special(t, "eos_token"), "</s>");
    assert_string_equal(wk_chat_tpl_special(t, "bos_token"), "<s>");
    assert_null(wk_chat_tpl_special(t, "unk_token"));
    assert_false(wk_chat_tpl_thinks(t));
    assert_false(wk_chat_tpl_knows(t, "reasoning_effort"));
    assert_false(wk_chat_tpl_knows(t, "enable_thinking"));
    /* tools and kwargs reach the template; kwargs may not set the reserved names */
    json_error_t je;
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"q\"}]", 0, &je);
    json_t *tools = json_loads("[{\"type\": \"function\"}]", 0, &je);
    json_t *kw = json_loads("{\"eos_token\": \"E\"}", 0, &je);
    size_t len;
    assert_int_equal(wk_chat_tpl_render_json(t, msgs, tools, false, kw, NULL, &out, &len, &d),
                     WK_OK);
    assert_string_equal(out, "<s>[user:q]FalseE");
    free(out);
    json_decref(kw);
    kw = json_loads("{\"messages\": []}", 0, &je);
    assert_int_equal(wk_chat_tpl_render_json(t, msgs, NULL, false, kw, NULL, &out, &len, &d),
                     WK_EINVAL);
    json_decref(kw);
    json_decref(tools);
    json_decref(msgs);
    wk_chat_tpl_free(t);
}

static void
test_named(void **state)
{
    (void)state;
    wk_chat_tpl *t = NULL;
    wk_diag d = {{0}};
    clear();
    put("tokenizer_config.json",
        "{\"chat_template\": [{\"name\": \"default\", \"template\": \"D{{ messages|length }}\"},"
        " {\"name\": \"rag\", \"template\": \"{% include 'x' %}\"},"
        " {\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}\"}]}");
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_OK);
    char *out = render_hi(t, false);
    assert_string_equal(out, "D1");
    free(out);
    json_error_t je;
    json_t *msgs = json_loads("[]", 0, &je);
    json_t *tools = json_loads("[1, 2]", 0, &je);
    size_t len;
    assert_int_equal(wk_chat_tpl_render_json(t, msgs, tools, false, NULL, NULL, &out, &len, &d),
                     WK_OK);
    assert_string_equal(out, "T2");
    free(out);
    json_decref(tools);
    json_decref(msgs);
    wk_chat_tpl_free(t);
}

static void
test_jinja_file(void **state)
{
    (void)state;
    wk_chat_tpl *t = NULL;
    wk_diag d = {{0}};
    clear();
    put("tokenizer_config.json", "{\"bos_token\": \"<B>\", \"chat_template\": \"config\"}");
    put("chat_template.jinja", "{{ bos_token }}file{{ messages[0].content }}\n");
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_OK);
    assert_string_equal(wk_chat_tpl_source(t), "chat_template.jinja");
    char *out = render_hi(t, false);
    assert_string_equal(out, "<B>filehi");
    free(out);
    wk_chat_tpl_free(t);
    /* a template that names </think> marks a thinking model */
    put("chat_template.jinja", "{{ messages[0].content }}{% if x %}<think>\n\n</think>{% endif %}");
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_OK);
    assert_true(wk_chat_tpl_thinks(t));
    assert_false(wk_chat_tpl_knows(t, "reasoning_effort"));
    wk_chat_tpl_free(t);
    /* the reasoning variables a template reads */
    put("chat_template.jinja", "{% if enable_thinking is false %}{% endif %}"
                               "{% if reasoning_effort %}{{ reasoning_effort }}{% endif %}");
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_OK);
    assert_true(wk_chat_tpl_knows(t, "reasoning_effort"));
    assert_true(wk_chat_tpl_knows(t, "enable_thinking"));
    assert_false(wk_chat_tpl_knows(t, "messages"));
    assert_false(wk_chat_tpl_knows(NULL, "reasoning_effort"));
    wk_chat_tpl_free(t);
    /* a refused template is an error naming file and line, not a fallback */
    put("chat_template.jinja", "ok\n{% include 'other.jinja' %}");
    t = NULL;
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_ENOTSUP);
    assert_null(t);
    assert_non_null(strstr(d.msg, "chat_template.jinja"));
    assert_non_null(strstr(d.msg, "line 2"));
    /* the template's own error comes back verbatim */
    put("chat_template.jinja", "{{ raise_exception('only user turns') }}");
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_OK);
    wk_chat_msg m = {.role = "user", .content = "hi"};
    char *o = NULL;
    size_t len;
    assert_int_equal(wk_chat_tpl_render(t, &m, 1, true, &o, &len, &d), WK_EINVAL);
    assert_string_equal(d.msg, "only user turns");
    wk_chat_tpl_free(t);
    wk_chat_tpl_free(NULL);
}

/* The tool-call format and the messages prepared for a template that iterates arguments. */
static void
test_tool_calls(void **state)
{
    (void)state;
    wk_chat_tpl *t = NULL;
    wk_diag d = {{0}};
    clear();
    put("chat_template.jinja",
        "{% for m in messages %}{{ m.role }}:{% for c in m.tool_calls or [] %}"
        "<tool_call>\n<function={{ c.function.name }}>\n{% for k, v in c.function.arguments|items %}"
        "<parameter={{ k }}>\n{{ v }}\n</parameter>\n{% endfor %}</function>\n</tool_call>"
        "{% endfor %}{{ m.content }};{% endfor %}");
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_OK);
    assert_int_equal(wk_chat_tpl_toolcall_fmt(t), WK_TOOLCALL_FMT_XML);
    assert_true(wk_chat_tpl_object_args(t));
    json_error_t je;
    json_t *msgs = json_loads(
        "[{\"role\": \"developer\", \"content\": \"s\"},"
        " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c\","
        " \"type\": \"function\", \"function\": {\"name\": \"f\","
        " \"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": \\\"x\\\"}\"}}]}]",
        0, &je);
    assert_non_null(msgs);
    size_t bm = 9, bc = 9;
    assert_int_equal(wk_chat_tpl_prepare(t, msgs, &bm, &bc, &d), WK_OK);
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(wk_chat_tpl_render_json(t, msgs, NULL, false, NULL, NULL, &out, &len, &d),
                     WK_OK);
    assert_string_equal(out, "system:s;assistant:<tool_call>\n<function=f>\n<parameter=a>\n1\n"
                             "</parameter>\n<parameter=b>\nx\n</parameter>\n</function>\n"
                             "</tool_call>;");
    free(out);
    /* arguments that are not a JSON object: WK_EINVAL naming the call */
    json_object_set_new(json_object_get(json_array_get(json_object_get(json_array_get(msgs, 1),
                                                                        "tool_calls"),
                                                       0),
                                        "function"),
                        "arguments", json_string("[1]"));
    assert_int_equal(wk_chat_tpl_prepare(t, msgs, &bm, &bc, &d), WK_EINVAL);
    assert_int_equal(bm, 1);
    assert_int_equal(bc, 0);
    assert_non_null(strstr(d.msg, "messages[1].tool_calls[0].function.arguments"));
    json_decref(msgs);
    wk_chat_tpl_free(t);
    /* a template that prints arguments as they come keeps the string */
    put("chat_template.jinja", "{{ '<tool_call>\\n{\"name\": \"' }}{{ messages }}");
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_OK);
    assert_int_equal(wk_chat_tpl_toolcall_fmt(t), WK_TOOLCALL_FMT_HERMES);
    assert_false(wk_chat_tpl_object_args(t));
    wk_chat_tpl_free(t);
}

static void
test_gguf_and_override(void **state)
{
    (void)state;
    wk_chat_tpl *t = NULL;
    wk_diag d = {{0}};
    clear();
    put_gguf("{{ bos_token }}g{{ messages[0].content }}{{ eos_token }}");
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_OK);
    assert_string_equal(wk_chat_tpl_source(t), "gguf");
    char *out = render_hi(t, false);
    assert_string_equal(out, "<s>ghi</s>");
    free(out);
    wk_chat_tpl_free(t);
    /* tokenizer_config.json's template wins over the GGUF's; its tokens too */
    put("tokenizer_config.json",
        "{\"eos_token\": \"E\", \"chat_template\": \"c{{ bos_token }}{{ eos_token }}\"}");
    assert_int_equal(wk_chat_tpl_load(dir, NULL, &t, &d), WK_OK);
    out = render_hi(t, false);
    assert_string_equal(out, "c<s>E");
    free(out);
    wk_chat_tpl_free(t);
    /* an override file wins over everything */
    put("override.jinja", "o{{ eos_token }}");
    char path[128];
    snprintf(path, sizeof path, "%s/override.jinja", dir);
    assert_int_equal(wk_chat_tpl_load(dir, path, &t, &d), WK_OK);
    assert_string_equal(wk_chat_tpl_source(t), "override");
    out = render_hi(t, false);
    assert_string_equal(out, "oE");
    free(out);
    wk_chat_tpl_free(t);
    t = NULL;
    snprintf(path, sizeof path, "%s/missing.jinja", dir);
    assert_int_equal(wk_chat_tpl_load(dir, path, &t, &d), WK_ENOENT);
    assert_null(t);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_none),
        cmocka_unit_test(test_config_string),
        cmocka_unit_test(test_named),
        cmocka_unit_test(test_jinja_file),
        cmocka_unit_test(test_gguf_and_override),
        cmocka_unit_test(test_tool_calls),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
