/*
 * test_ctl_route_parse: the request bodies of the state, migrate and drain
 * routes (ctl_route_parse.c) and a Responses request planned into the
 * shared generation request (ctl_resp_plan.c), without a connection. Each
 * parser's happy path and each refusal class once, with the code, "param",
 * message (and for the Responses API the HTTP status and OpenAI code) the
 * route sends; Responses items of every type rendered with the World
 * template and with a model's own template (tools, forced calls, reasoning),
 * the exact path over a previous state's tokens and the generation's
 * parameters.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <unistd.h>

#include "ctl_app.h"
#include "ctl_openai.h"
#include "ctl_resp_plan.h"
#include "ctl_resp_req.h"
#include "ctl_route_parse.h"
#include "wk_chat_tpl.h"
#include "wk_tok.h"

#include "parse_fixture.h"

static ctl_app app;  /* the World template, small limits */
static ctl_app wapp; /* the World template, room for a conversation */
static ctl_app tapp; /* a model with its own chat template (hermes tool calls, think markers) */
static ctl_app papp; /* a plain template of its own: no tool-call format */
static char tdir[64], pdir[64];

/* ChatML with tools in a system turn and an open think block; "boom" raises. */
static const char tpl_src[] =
    "{%- if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }}\n{% endfor %}"
    "<tool_call>{\"name\": \"...\"}</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}{% if m.content == 'boom' %}{{ raise_exception('no boom') }}"
    "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}"
    "</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
    "{%- if false %}</think>{% endif %}";

static int
setup(void **state)
{
    (void)state;
    pf_app_init(&app);
    wapp = app;
    wapp.max_messages = 0;
    wapp.max_message_bytes = 0;
    wapp.max_prompt_tokens = 4096;
    tapp = wapp;
    pf_tpl_load(tdir, "wkvm-route-parse", tpl_src, "<|im_end|>", &tapp.chat_tpl);
    papp = wapp;
    pf_tpl_load(pdir, "wkvm-route-parse",
                "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}", "</s>",
                &papp.chat_tpl);
    return 0;
}

static int
teardown(void **state)
{
    (void)state;
    wk_tok_free(app.tok);
    wk_chat_tpl_free(tapp.chat_tpl);
    wk_chat_tpl_free(papp.chat_tpl);
    pf_tpl_dir_remove(tdir);
    pf_tpl_dir_remove(pdir);
    return 0;
}

static json_t *
body_of(const char *text)
{
    json_t *b = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
    if (b == NULL)
        fail_msg("bad test JSON: %s", text);
    return b;
}

/* pe is the refusal err / param ("" none) / a message holding want, status and code as given. */
static void
expect_perr(const ctl_openai_perr *pe, wk_err err, const char *param, const char *want, int status,
            const char *code)
{
    if (pe->err != err || strcmp(pe->param, param) != 0 || strstr(pe->msg, want) == NULL ||
        pe->status != status || strcmp(pe->code, code) != 0)
        fail_msg("got %s param '%s' '%s' status %d code '%s'; expected %s param '%s' '%s' "
                 "status %d code '%s'",
                 wk_err_name(pe->err), pe->param, pe->msg, pe->status, pe->code, wk_err_name(err),
                 param, want, status, code);
}

/* ---- the state routes ---- */

static void
create_refused(const char *text, wk_err err, const char *param, const char *want)
{
    json_t *b = body_of(text);
    ctl_states_create_body cb;
    ctl_openai_perr pe;
    if (ctl_states_parse_create(&app, b, &cb, &pe))
        fail_msg("accepted: %s", text);
    expect_perr(&pe, err, param, want, 0, "");
    ctl_states_create_body_fini(&cb);
    json_decref(b);
}

static void
test_states_create(void **state)
{
    (void)state;
    json_t *b = body_of("{\"name\":\"s1\",\"model\":\"m\",\"prompt\":\"abc\"}");
    ctl_states_create_body cb;
    ctl_openai_perr pe;
    assert_true(ctl_states_parse_create(&app, b, &cb, &pe));
    assert_string_equal(cb.name, "s1");
    assert_int_equal(cb.n_ids, 3);
    assert_int_equal(cb.ids[0], 'a' + 1); /* byte b is token b + 1 */
    assert_int_equal(cb.ids[2], 'c' + 1);
    ctl_states_create_body_fini(&cb);
    assert_null(cb.ids);
    json_decref(b);
    /* token ids as given; the model may be left out */
    b = body_of("{\"name\":\"s1\",\"prompt_ids\":[5,6]}");
    assert_true(ctl_states_parse_create(&app, b, &cb, &pe));
    assert_int_equal(cb.n_ids, 2);
    assert_int_equal(cb.ids[1], 6);
    ctl_states_create_body_fini(&cb);
    json_decref(b);
    /* messages: rendered with the World template, as the chat route renders them */
    b = body_of("{\"name\":\"s1\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_true(ctl_states_parse_create(&app, b, &cb, &pe));
    assert_int_equal(cb.n_ids, strlen("User: hi\n\nAssistant:"));
    ctl_states_create_body_fini(&cb);
    json_decref(b);
    /* refusals, in the route's order: name, model, the tokens */
    create_refused("{\"prompt\":\"x\"}", WK_EINVAL, "name", "'name' is required");
    create_refused("{\"name\":\"a/b\",\"model\":\"nope\"}", WK_EINVAL, "name", "state name");
    create_refused("{\"name\":\"s\",\"model\":\"nope\",\"prompt\":1}", WK_ENOENT, "model",
                   "unknown model");
    create_refused("{\"name\":\"s\",\"model\":5}", WK_ENOENT, "model", "unknown model");
    create_refused("{\"name\":\"s\"}", WK_EINVAL, "prompt",
                   "one of prompt, prompt_ids, messages is required");
    create_refused("{\"name\":\"s\",\"prompt\":\"x\",\"prompt_ids\":[1]}", WK_EINVAL, "prompt",
                   "give one of prompt, prompt_ids, messages");
    create_refused("{\"name\":\"s\",\"prompt_ids\":[1,99999]}", WK_EINVAL, "prompt", "");
    create_refused("{\"name\":\"s\",\"prompt\":\"\"}", WK_EINVAL, "prompt", "no tokens");
    create_refused("{\"name\":\"s\",\"messages\":[{\"role\":\"bad\",\"content\":\"x\"}]}",
                   WK_EINVAL, "messages[0].role", "not supported");
}

static void
test_states_generate(void **state)
{
    (void)state;
    json_t *b = body_of("{\"save_as\":\"next\",\"prompt\":\"xy\",\"max_tokens\":5,"
                        "\"temperature\":0}");
    ctl_states_gen_body gb;
    ctl_openai_req r = {.wire.model_optional = true};
    ctl_openai_perr pe;
    assert_true(ctl_states_parse_generate(&app, b, &gb, &r, &pe));
    assert_string_equal(gb.save_as, "next");
    assert_int_equal(gb.n_q, 2);
    assert_int_equal(gb.q[0], 'x' + 1);
    assert_int_equal(r.plan.gen.max_tokens, 5);
    assert_true(r.plan.gen.sample.temperature == 0.0f);
    assert_null(json_object_get(b, "prompt")); /* taken: it was the tokens */
    ctl_states_gen_body_fini(&gb);
    ctl_openai_req_fini(&r);
    json_decref(b);
    /* nothing at all: no tokens, no name, the defaults */
    b = body_of("{}");
    memset(&r, 0, sizeof(r));
    r.wire.model_optional = true;
    assert_true(ctl_states_parse_generate(&app, b, &gb, &r, &pe));
    assert_null(gb.save_as);
    assert_null(gb.q);
    assert_int_equal(r.plan.gen.max_tokens, 16); /* completions: OpenAI's 16 */
    ctl_openai_req_fini(&r);
    json_decref(b);
    /* refusals: save_as, the tokens, the common fields */
    const struct {
        const char *body, *param, *want;
    } bad[] = {
        {"{\"save_as\":3}", "save_as", "string"},
        {"{\"save_as\":\"a/b\",\"prompt_ids\":[99999]}", "save_as", "state name"},
        {"{\"prompt_ids\":[99999],\"temperature\":9}", "prompt", ""},
        {"{\"prompt\":\"x\",\"messages\":[]}", "prompt", "give one of"},
        {"{\"temperature\":9}", "temperature", "between"},
        {"{\"model\":4}", "model", "'model' must be a string"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        b = body_of(bad[i].body);
        memset(&r, 0, sizeof(r));
        r.wire.model_optional = true;
        if (ctl_states_parse_generate(&app, b, &gb, &r, &pe))
            fail_msg("accepted: %s", bad[i].body);
        expect_perr(&pe, WK_EINVAL, bad[i].param, bad[i].want, 0, "");
        ctl_states_gen_body_fini(&gb);
        ctl_openai_req_fini(&r);
        json_decref(b);
    }
    /* an unknown model is the common fields' 404 */
    b = body_of("{\"model\":\"nope\"}");
    memset(&r, 0, sizeof(r));
    r.wire.model_optional = true;
    assert_false(ctl_states_parse_generate(&app, b, &gb, &r, &pe));
    assert_int_equal(pe.err, WK_ENOENT);
    assert_string_equal(pe.param, "model");
    ctl_openai_req_fini(&r);
    json_decref(b);
}

static void
test_states_fork_and_admin(void **state)
{
    (void)state;
    ctl_states_fork_body fb;
    ctl_openai_perr pe;
    json_t *b = body_of("{\"name\":\"f\"}");
    assert_true(ctl_states_parse_fork(b, &fb, &pe));
    assert_string_equal(fb.name, "f");
    assert_int_equal(fb.count, 1);
    json_decref(b);
    b = body_of("{\"name\":\"f\",\"count\":64}");
    assert_true(ctl_states_parse_fork(b, &fb, &pe));
    assert_int_equal(fb.count, CTL_STATES_FORK_MAX);
    json_decref(b);
    assert_false(ctl_states_parse_fork(NULL, &fb, &pe)); /* no body sent */
    expect_perr(&pe, WK_EINVAL, "name", "'name' is required", 0, "");
    const struct {
        const char *body, *param, *want;
    } bad[] = {
        {"{\"count\":2}", "name", "'name' is required"},
        {"{\"name\":\"\"}", "name", "state name"},
        {"{\"name\":\"f\",\"count\":0}", "count", "count"},
        {"{\"name\":\"f\",\"count\":65}", "count", "count"},
        {"{\"name\":\"f\",\"count\":1.5}", "count", "count"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        b = body_of(bad[i].body);
        if (ctl_states_parse_fork(b, &fb, &pe))
            fail_msg("accepted: %s", bad[i].body);
        expect_perr(&pe, WK_EINVAL, bad[i].param, bad[i].want, 0, "");
        json_decref(b);
    }
    /* migrate: "to" */
    const char *to = NULL;
    b = body_of("{\"to\":\"w1\"}");
    assert_true(ctl_migrate_parse_to(b, &to, &pe));
    assert_string_equal(to, "w1");
    json_decref(b);
    b = body_of("{\"to\":3}");
    assert_false(ctl_migrate_parse_to(b, &to, &pe));
    expect_perr(&pe, WK_EINVAL, "to", "string", 0, "");
    json_decref(b);
    b = body_of("{}");
    assert_false(ctl_migrate_parse_to(b, &to, &pe));
    expect_perr(&pe, WK_EINVAL, "to", "required", 0, "");
    json_decref(b);
    /* drain: "undrain" */
    bool undrain = true;
    assert_true(ctl_migrate_parse_drain(NULL, &undrain, &pe));
    assert_false(undrain);
    b = body_of("{\"undrain\":true}");
    assert_true(ctl_migrate_parse_drain(b, &undrain, &pe));
    assert_true(undrain);
    json_decref(b);
    b = body_of("{\"undrain\":1}");
    assert_false(ctl_migrate_parse_drain(b, &undrain, &pe));
    expect_perr(&pe, WK_EINVAL, "undrain", "boolean", 0, "");
    json_decref(b);
}

/* ---- the Responses API ---- */

/* One planned Responses request and what it borrows. */
typedef struct plan_case {
    json_t *body, *history, *input, *prev;
    ctl_resp_req q;
    ctl_openai_req r;
    ctl_openai_perr pe;
    bool exact;
} plan_case;

/*
 * Parses body (the Responses API's JSON) and plans it on a with the
 * record-form history and input (JSON arrays; NULL: none), the previous
 * record prev (NULL: none) and the served fingerprint fp.
 */
static bool
plan(plan_case *pc, ctl_app *a, const char *body, const char *history, const char *input,
     const char *prev, const char *fp)
{
    memset(pc, 0, sizeof(*pc));
    pc->body = body_of(body);
    pc->history = body_of(history ? history : "[]");
    pc->input = body_of(input ? input : "[]");
    pc->prev = prev ? body_of(prev) : NULL;
    ctl_resp_limits lim = {0};
    ctl_resp_err e;
    if (ctl_resp_req_parse(pc->body, &lim, &pc->q, &e) != WK_OK)
        fail_msg("ctl_resp_req_parse refused %s: %s", body, e.msg);
    pc->r = (ctl_openai_req){.wire.chat = true, .plan.reuse = true, .wire.cache = true};
    ctl_resp_conv cv = {
        .prev = pc->prev, .fingerprint = fp, .history = pc->history, .input = pc->input};
    return ctl_resp_plan(a, &pc->q, &cv, &pc->r, &pc->exact, &pc->pe);
}

static void
plan_fini(plan_case *pc)
{
    ctl_openai_req_fini(&pc->r);
    ctl_resp_req_fini(&pc->q);
    json_decref(pc->body);
    json_decref(pc->history);
    json_decref(pc->input);
    json_decref(pc->prev);
}

static void
test_resp_world(void **state)
{
    (void)state;
    plan_case pc;
    /* instructions and a message: the World template, byte tokens, the parameters */
    assert_true(plan(&pc, &wapp,
                     "{\"model\":\"m\",\"input\":\"hi\",\"instructions\":\"be\",\"stream\":true,"
                     "\"temperature\":0.5,\"top_p\":0.9,\"seed\":7,\"max_output_tokens\":9,"
                     "\"logit_bias\":{\"3\":-100}}",
                     NULL, "[{\"role\":\"user\",\"text\":\"hi\"}]", NULL, NULL));
    const char *want = "System: be\n\nUser: hi\n\nAssistant:";
    assert_int_equal(pc.r.wire.prompt_len, strlen(want));
    assert_memory_equal(pc.r.wire.prompt_text, want, strlen(want));
    assert_int_equal(pc.r.plan.n_prompt, strlen(want));
    assert_int_equal(pc.r.plan.prompt[0], 'S' + 1);
    assert_false(pc.exact);
    assert_int_equal(pc.r.plan.aligned_tokens, 0);
    assert_false(pc.r.wire.templated);
    assert_string_equal(pc.r.wire.model, "m");
    assert_true(pc.r.wire.stream);
    ctl_gen_params *g = &pc.r.plan.gen;
    assert_int_equal(g->max_tokens, 9);
    assert_true(g->stop_on_eot);
    assert_int_equal(g->n_stops, 1);
    assert_string_equal(g->stops[0], "\n\n");
    assert_true(g->sample.temperature == 0.5f);
    assert_true(g->sample.top_p == 0.9f);
    assert_int_equal(g->sample.seed, 7);
    assert_int_equal(g->sample.n_bias, 1);
    assert_int_equal(g->sample.bias[0].token, 3);
    assert_true(g->sample.bias[0].bias == -100.0f);
    assert_true(pc.r.plan.n_bounds >= 1); /* a checkpoint where a message ends */
    plan_fini(&pc);
    /* defaults: the server's max tokens; a reasoning item has no place in the World template */
    assert_true(plan(&pc, &wapp, "{\"model\":\"m\",\"input\":\"q\"}", NULL,
                     "[{\"type\":\"reasoning\",\"text\":\"t\"},"
                     "{\"role\":\"assistant\",\"text\":\"a\"},{\"role\":\"user\",\"text\":\"q\"}]",
                     NULL, NULL));
    want = "Assistant: a\n\nUser: q\n\nAssistant:";
    assert_int_equal(pc.r.wire.prompt_len, strlen(want));
    assert_memory_equal(pc.r.wire.prompt_text, want, strlen(want));
    assert_int_equal(pc.r.plan.gen.max_tokens, 64);
    assert_int_equal(pc.r.wire.n_msgs, 2);
    plan_fini(&pc);
}

static void
test_resp_exact(void **state)
{
    (void)state;
    plan_case pc;
    const char *hist =
        "[{\"role\":\"user\",\"text\":\"a\"},{\"role\":\"assistant\",\"text\":\"b\"}]";
    const char *in = "[{\"role\":\"user\",\"text\":\"c\"}]";
    const char *prev = "{\"fp\":\"F\",\"tokens\":[9,8,7],\"instructions\":null}";
    /* the previous state's tokens as they are, the rest after the reply's content */
    assert_true(plan(&pc, &wapp, "{\"model\":\"m\",\"input\":\"c\"}", hist, in, prev, "F"));
    assert_true(pc.exact);
    assert_int_equal(pc.r.plan.aligned_tokens, 3);
    assert_int_equal(pc.r.plan.prompt[0], 9);
    assert_int_equal(pc.r.plan.prompt[2], 7);
    const char *rest = "\n\nUser: c\n\nAssistant:";
    assert_int_equal(pc.r.plan.n_prompt, 3 + strlen(rest));
    assert_int_equal(pc.r.plan.prompt[3], '\n' + 1);
    plan_fini(&pc);
    /* another model served, other instructions, tokens out of the vocab: the whole text */
    const char *whole = "User: a\n\nAssistant: b\n\nUser: c\n\nAssistant:";
    const char *other[][2] = {
        {"{\"fp\":\"F\",\"tokens\":[9,8,7],\"instructions\":null}", "G"},
        {"{\"fp\":\"F\",\"tokens\":[9,8,7],\"instructions\":\"x\"}", "F"},
        {"{\"fp\":\"F\",\"tokens\":[9,8,70000],\"instructions\":null}", "F"},
        {"{\"fp\":\"F\",\"tokens\":[9,8,7],\"instructions\":null}", NULL},
    };
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
        assert_true(plan(&pc, &wapp, "{\"model\":\"m\",\"input\":\"c\"}", hist, in, other[i][0],
                         other[i][1]));
        assert_false(pc.exact);
        assert_int_equal(pc.r.plan.aligned_tokens, 0);
        assert_int_equal(pc.r.plan.n_prompt, strlen(whole));
        plan_fini(&pc);
    }
}

/* Plans body on a (items as given) and expects the refusal. */
static void
plan_refused(ctl_app *a, const char *body, const char *history, const char *input, int status,
             wk_err err, const char *param, const char *code, const char *want)
{
    plan_case pc;
    if (plan(&pc, a, body, history, input, NULL, NULL))
        fail_msg("accepted: %s", body);
    expect_perr(&pc.pe, err, param, want, status, code);
    plan_fini(&pc);
}

static void
test_resp_refusals(void **state)
{
    (void)state;
    const char *b = "{\"model\":\"m\",\"input\":\"q\"}";
    /* the World template: no calls, no forced call; the message and token limits */
    plan_refused(
        &wapp, b, NULL,
        "[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"}]", 400,
        WK_EINVAL, "input[0].type", "invalid_value", "'function_call' items need");
    plan_refused(&wapp, b,
                 "[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"o\"}]", NULL,
                 400, WK_EINVAL, "previous_response_id", "invalid_value",
                 "'function_call_output' items need");
    plan_refused(&wapp,
                 "{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\","
                 "\"name\":\"f\"}],\"tool_choice\":\"required\"}",
                 NULL, "[{\"role\":\"user\",\"text\":\"q\"}]", 400, WK_EINVAL, "tool_choice",
                 "invalid_value", "plain User:/Assistant: template");
    plan_refused(&app, b, NULL,
                 "[{\"role\":\"user\",\"text\":\"1\"},{\"role\":\"user\",\"text\":\"2\"},"
                 "{\"role\":\"user\",\"text\":\"3\"},{\"role\":\"user\",\"text\":\"4\"},"
                 "{\"role\":\"user\",\"text\":\"5\"}]",
                 400, WK_ETOOBIG, "input", "context_length_exceeded", "5 messages");
    plan_refused(&app, b, NULL, "[{\"role\":\"user\",\"text\":\"q\"}]", 400, WK_ETOOBIG, "input",
                 "context_length_exceeded", "more than the limit of 8");
    /* logit_bias against the vocab (257 ids), after the prompt */
    plan_refused(&wapp, "{\"model\":\"m\",\"input\":\"q\",\"logit_bias\":{\"257\":1}}", NULL,
                 "[{\"role\":\"user\",\"text\":\"q\"}]", 400, WK_EINVAL, "logit_bias",
                 "invalid_value", "'257' is not a token id in [0, 257)");
    /* the model's own template: its errors, and a named call it cannot constrain */
    plan_refused(&tapp, b, NULL, "[{\"role\":\"user\",\"text\":\"boom\"}]", 400, WK_EINVAL, "input",
                 "", "chat template: ");
    plan_refused(&papp,
                 "{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\","
                 "\"name\":\"f\"}],\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"}}",
                 NULL, "[{\"role\":\"user\",\"text\":\"q\"}]", 400, WK_EINVAL, "tool_choice",
                 "invalid_value", "has no tool-call format wkvm knows");
}

static void
test_resp_templated(void **state)
{
    (void)state;
    plan_case pc;
    /* items of every type, tools offered: rendered by the template, calls parsed (hermes) */
    assert_true(plan(&pc, &tapp,
                     "{\"model\":\"m\",\"input\":\"q\",\"instructions\":\"sys\",\"tools\":"
                     "[{\"type\":\"function\",\"name\":\"get\",\"parameters\":{\"type\":"
                     "\"object\"}}],\"reasoning\":{\"effort\":\"low\"}}",
                     "[{\"role\":\"user\",\"text\":\"u1\"},{\"type\":\"reasoning\",\"text\":"
                     "\"why\"},{\"role\":\"assistant\",\"text\":\"a1\"},{\"type\":"
                     "\"function_call\",\"call_id\":\"c1\",\"name\":\"get\",\"arguments\":"
                     "\"{}\"}]",
                     "[{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"42\"},"
                     "{\"role\":\"user\",\"text\":\"u2\"}]",
                     NULL, NULL));
    assert_true(pc.r.wire.templated);
    assert_true(pc.r.wire.think);
    assert_true(pc.r.wire.think_open);
    assert_int_equal(pc.r.wire.tool_fmt, WK_TOOLCALL_FMT_HERMES);
    assert_non_null(pc.r.wire.tools);
    assert_int_equal(json_array_size(pc.r.wire.tools), 1);
    assert_false(pc.r.wire.tool_forced);
    const char *p = pc.r.wire.prompt_text;
    const char *order[] = {"get\n<tool_call>",
                           "<|im_start|>system\nsys<|im_end|>",
                           "<|im_start|>user\nu1<|im_end|>",
                           "<|im_start|>assistant\na1<tool_call>get</tool_call><|im_end|>",
                           "<|im_start|>tool\n42<|im_end|>",
                           "<|im_start|>user\nu2<|im_end|>",
                           "<|im_start|>assistant\n<think>\n"};
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        const char *at = strstr(p, order[i]);
        if (at == NULL)
            fail_msg("'%s' not in order in the prompt: %s", order[i], pc.r.wire.prompt_text);
        p = at + strlen(order[i]);
    }
    assert_int_equal(pc.r.plan.gen.n_stops, 1); /* the template's eos */
    assert_string_equal(pc.r.plan.gen.stops[0], "<|im_end|>");
    assert_true(pc.r.plan.hist_end > 0);
    plan_fini(&pc);
    /* a named function among allowed_tools: forced (the grammar ends the reply, no stop) */
    assert_true(plan(&pc, &tapp,
                     "{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":"
                     "\"get\"},{\"type\":\"function\",\"name\":\"put\"}],\"tool_choice\":"
                     "{\"type\":\"allowed_tools\",\"mode\":\"required\",\"tools\":[{\"type\":"
                     "\"function\",\"name\":\"put\"}]},\"parallel_tool_calls\":false}",
                     NULL, "[{\"role\":\"user\",\"text\":\"q\"}]", NULL, NULL));
    assert_true(pc.r.wire.tool_forced);
    assert_non_null(pc.r.wire.toolgram);
    assert_true(pc.r.wire.tool_serial);
    assert_non_null(pc.r.wire.call_tools);
    assert_int_equal(json_array_size(pc.r.wire.call_tools), 1);
    assert_int_equal(json_array_size(pc.r.wire.tools), 2); /* the template sees every tool */
    assert_int_equal(pc.r.plan.gen.n_stops, 0);
    plan_fini(&pc);
    /* tool_choice none: tools rendered, the reply not parsed for calls */
    assert_true(plan(&pc, &tapp,
                     "{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":"
                     "\"get\"}],\"tool_choice\":\"none\"}",
                     NULL, "[{\"role\":\"user\",\"text\":\"q\"}]", NULL, NULL));
    assert_int_equal(pc.r.wire.tool_fmt, WK_TOOLCALL_FMT_NONE);
    assert_false(pc.r.wire.tool_forced);
    plan_fini(&pc);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_states_create),
        cmocka_unit_test(test_states_generate),
        cmocka_unit_test(test_states_fork_and_admin),
        cmocka_unit_test(test_resp_world),
        cmocka_unit_test(test_resp_exact),
        cmocka_unit_test(test_resp_refusals),
        cmocka_unit_test(test_resp_templated),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
