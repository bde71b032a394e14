/*
 * test_ctl_session: the parent-token-v1 contract (controld/session/ctl_session.c)
 * with the real tokenizer on tests/fixtures/vocab_small.txt and the real
 * chat template: header rules, session keys, multi-turn hits with their
 * exact deltas, every rejection reason provoked on purpose, the strip rule,
 * exact-prefix reuse, the binding's byte format against hostile input, and
 * the history digest against tests/reference/session_digest.py; then the
 * text mode (the glue's rule) with a Llama-style hf-spm tokenizer.json
 * written here: hits that feed only the new text, misses that stay misses.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "ctl_session.h"
#include "ctl_session_priv.h"
#include "wk_chat.h"
#include "wk_sha256.h"
#include "wk_tok.h"

static wk_tok *g_tok; /* the fixture vocabulary, loaded once */

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static int
group_setup(void **state)
{
    (void)state;
    char path[4096];
    const char *src = getenv("WKVM_SOURCE_DIR");
    wk_diag d = {""};

    snprintf(path, sizeof(path), "%s/tests/fixtures/vocab_small.txt", src ? src : ".");
    if (wk_tok_load(path, &g_tok, &d) != WK_OK) {
        fprintf(stderr, "test_ctl_session: %s: %s (set WKVM_SOURCE_DIR)\n", path, d.msg);
        return -1;
    }
    return 0;
}

static int
group_teardown(void **state)
{
    (void)state;
    wk_tok_free(g_tok);
    return 0;
}

/* ------------------------------------------------------- helpers ---- */

/* Contract headers for user "u-1", chat "c-1". */
static ctl_session_hdrs
hdrs_pt(const char *asst, const char *umsg, const char *parent)
{
    ctl_session_hdrs h;
    memset(&h, 0, sizeof(h));
    h.contract = true;
    snprintf(h.user_id, sizeof(h.user_id), "u-1");
    snprintf(h.chat_id, sizeof(h.chat_id), "c-1");
    snprintf(h.assistant_msg_id, sizeof(h.assistant_msg_id), "%s", asst);
    snprintf(h.user_msg_id, sizeof(h.user_msg_id), "%s", umsg);
    snprintf(h.parent_msg_id, sizeof(h.parent_msg_id), "%s", parent);
    return h;
}

/* Headers with a chat id and no contract. */
static ctl_session_hdrs
hdrs_prefix(void)
{
    ctl_session_hdrs h;
    memset(&h, 0, sizeof(h));
    snprintf(h.user_id, sizeof(h.user_id), "u-1");
    snprintf(h.chat_id, sizeof(h.chat_id), "c-1");
    return h;
}

static wk_chat_msg
msg(const char *role, const char *content)
{
    return (wk_chat_msg){role, content, 0};
}

/* Tokens of text (caller frees). */
static int32_t *
enc(const char *text, size_t len, size_t *n)
{
    int32_t *ids = NULL;
    assert_int_equal(wk_tok_encode(g_tok, text, len, &ids, n, NULL), WK_OK);
    return ids;
}

/* Decodes n ids into a malloc'd string (caller frees). */
static char *
dec(const int32_t *ids, size_t n)
{
    char *s = NULL;
    size_t len = 0;
    assert_int_equal(wk_tok_decode(g_tok, ids, n, &s, &len, NULL), WK_OK);
    return s;
}

/* One turn's request and decision. */
typedef struct turn_req {
    ctl_session_request req; /* the request */
    int32_t *prompt;         /* its rendered prompt ids, owned */
    ctl_session_result res;  /* the decision */
} turn_req;

/* Renders msgs and validates them against prev. */
static void
turn_validate(turn_req *t, const ctl_session_hdrs *h, const wk_chat_msg *msgs, size_t n,
              const ctl_session_binding *prev)
{
    wk_diag d = {""};
    size_t np = 0;

    memset(t, 0, sizeof(*t));
    assert_int_equal(ctl_session_prompt_encode(g_tok, msgs, n, &t->prompt, &np, &d), WK_OK);
    t->req = (ctl_session_request){h, msgs, n, t->prompt, np, NULL, NULL, 0, NULL, NULL};
    if (ctl_session_validate(&t->req, prev, &t->res, &d) != WK_OK)
        fail_msg("validate: %s", d.msg);
}

/*
 * Commits t with generated ids = tokens of gen (then end-of-text when eot),
 * and visible text visible (NULL: turn cut short). Returns the new binding.
 */
static ctl_session_binding *
turn_commit(const turn_req *t, const ctl_session_binding *prev, const char *gen, bool eot,
            const char *visible)
{
    size_t ng = 0;
    int32_t *g = enc(gen, strlen(gen), &ng);
    int32_t *g2 = realloc(g, (ng + 1) * sizeof(*g));
    assert_non_null(g2);
    g = g2;
    if (eot)
        g[ng++] = WK_TOK_EOT;
    ctl_session_turn ct = {&t->req, &t->res, prev, g, ng, visible,
                           visible ? strlen(visible) : 0};
    ctl_session_binding *b = NULL;
    wk_diag d = {""};
    if (ctl_session_commit(&ct, &b, &d) != WK_OK)
        fail_msg("commit: %s", d.msg);
    free(g);
    return b;
}

static void
turn_fini(turn_req *t)
{
    free(t->prompt);
    t->prompt = NULL;
}

/* The standard turn 1: "hi" -> " Hello" (stopped by "\n\n", or by end-of-text when eot). */
static ctl_session_binding *
park1(bool eot)
{
    ctl_session_hdrs h = hdrs_pt("a1", "m1", "");
    wk_chat_msg m[] = {msg("user", "hi")};
    turn_req t;
    turn_validate(&t, &h, m, N_OF(m), NULL);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_FIRST);
    ctl_session_binding *b = turn_commit(&t, NULL, eot ? " Hello" : " Hello\n\n", eot, " Hello");
    turn_fini(&t);
    return b;
}

/* Validates a turn-2 request against b and checks it is rejected with reason. */
static void
expect_reject(const ctl_session_binding *b, const ctl_session_hdrs *h, const wk_chat_msg *m,
              size_t n, const char *reason)
{
    turn_req t;
    turn_validate(&t, h, m, n, b);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_REJECTED);
    assert_string_equal(ctl_session_reason_str(t.res.reason), reason);
    assert_true(t.res.retire);
    assert_int_equal(t.res.reused_tokens, 0);
    turn_fini(&t);
}

/* ------------------------------------------------------- headers ---- */

static wk_err
parse(const ctl_session_hdr *p, size_t n, ctl_session_hdrs *h, wk_diag *d)
{
    d->msg[0] = '\0';
    return ctl_session_headers_parse_pairs(p, n, h, d);
}

static void
test_headers_ok(void **state)
{
    (void)state;
    ctl_session_hdrs h;
    wk_diag d = {""};

    /* any case, outer whitespace (ASCII and Unicode) stripped, parent absent on turn 1 */
    ctl_session_hdr p1[] = {
        {"x-openwebui-user-id", "  user 1\t"},
        {"X-OPENWEBUI-CHAT-ID", "\xc2\xa0" "chat-9\xe3\x80\x80"},
        {"x-wkvm-stateful-chat", " parent-token-v1 "},
        {"X-Wkvm-Assistant-Message-Id", "a1"},
        {"x-wkvm-user-message-id", "m1"},
        {"Content-Type", "application/json"},
    };
    assert_int_equal(parse(p1, N_OF(p1), &h, &d), WK_OK);
    assert_true(h.contract);
    assert_string_equal(h.user_id, "user 1");
    assert_string_equal(h.chat_id, "chat-9");
    assert_string_equal(h.assistant_msg_id, "a1");
    assert_string_equal(h.user_msg_id, "m1");
    assert_string_equal(h.parent_msg_id, "");
    assert_int_equal(ctl_session_hdrs_mode(&h), CTL_SESSION_MODE_PARENT_TOKEN);

    /* an empty parent header is turn 1 too; the first of duplicate headers wins */
    ctl_session_hdr p2[] = {
        {"X-OpenWebUI-User-Id", "u"},       {"X-OpenWebUI-Chat-Id", "c"},
        {"X-WKVM-Stateful-Chat", "parent-token-v1"}, {"X-WKVM-Assistant-Message-ID", "a"},
        {"X-WKVM-User-Message-ID", "m"},    {"X-WKVM-Parent-Message-ID", "   "},
        {"x-openwebui-chat-id", "second"},
    };
    assert_int_equal(parse(p2, N_OF(p2), &h, &d), WK_OK);
    assert_string_equal(h.parent_msg_id, "");
    assert_string_equal(h.chat_id, "c");

    /* no contract: chat id -> exact prefix; nothing -> none; empty contract value = absent */
    ctl_session_hdr p3[] = {{"X-OpenWebUI-Chat-Id", "c"}, {"X-WKVM-Stateful-Chat", " "}};
    assert_int_equal(parse(p3, N_OF(p3), &h, &d), WK_OK);
    assert_false(h.contract);
    assert_int_equal(ctl_session_hdrs_mode(&h), CTL_SESSION_MODE_EXACT_PREFIX);
    assert_int_equal(parse(NULL, 0, &h, &d), WK_OK);
    assert_int_equal(ctl_session_hdrs_mode(&h), CTL_SESSION_MODE_NONE);

    /* 512 bytes after stripping is fine, even with padding around it */
    char v512[520];
    memset(v512, 'x', sizeof(v512));
    v512[0] = ' ';
    v512[513] = ' ';
    v512[514] = '\0';
    ctl_session_hdr p4[] = {{"X-OpenWebUI-Chat-Id", v512}};
    assert_int_equal(parse(p4, N_OF(p4), &h, &d), WK_OK);
    assert_int_equal(strlen(h.chat_id), 512);
}

/* The getter used by test_headers_getter: a fixed table, case-insensitive. */
static const char *
getter(void *ctx, const char *name)
{
    const ctl_session_hdr *p = ctx;
    for (size_t i = 0; p[i].name != NULL; i++) {
        if (strcasecmp(p[i].name, name) == 0)
            return p[i].value;
    }
    return NULL;
}

static void
test_headers_getter(void **state)
{
    (void)state;
    ctl_session_hdrs h;
    wk_diag d = {""};
    ctl_session_hdr tab[] = {
        {"x-openwebui-user-id", "u"},     {"x-openwebui-chat-id", "c"},
        {"x-wkvm-stateful-chat", "parent-token-v1"},
        {"x-wkvm-assistant-message-id", "a2"}, {"x-wkvm-user-message-id", "m2"},
        {"x-wkvm-parent-message-id", " a1 "}, {NULL, NULL},
    };
    assert_int_equal(ctl_session_headers_parse(getter, tab, &h, &d), WK_OK);
    assert_string_equal(h.parent_msg_id, "a1");
    tab[4].value = "";
    assert_int_equal(ctl_session_headers_parse(getter, tab, &h, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "X-WKVM-User-Message-ID"));
}

/* Expects pairs to fail with WK_EINVAL and a message containing want. */
static void
expect_bad(const ctl_session_hdr *p, size_t n, const char *want)
{
    ctl_session_hdrs h;
    memset(&h, 0x5a, sizeof(h));
    wk_diag d = {""};
    assert_int_equal(parse(p, n, &h, &d), WK_EINVAL);
    if (strstr(d.msg, want) == NULL)
        fail_msg("diag '%s' does not name '%s'", d.msg, want);
    assert_int_equal(((unsigned char *)&h)[1], 0x5a); /* output untouched on failure */
}

static void
test_headers_errors(void **state)
{
    (void)state;
    ctl_session_hdr base[] = {
        {"X-OpenWebUI-User-Id", "u"},
        {"X-OpenWebUI-Chat-Id", "c"},
        {"X-WKVM-Stateful-Chat", "parent-token-v1"},
        {"X-WKVM-Assistant-Message-ID", "a"},
        {"X-WKVM-User-Message-ID", "m"},
    };
    ctl_session_hdr p[5];

    /* each required header missing (absent, then empty) names itself */
    for (size_t skip = 0; skip < 5; skip++) {
        if (skip == 2)
            continue;
        size_t n = 0;
        for (size_t i = 0; i < 5; i++) {
            if (i != skip)
                p[n++] = base[i];
        }
        expect_bad(p, n, base[skip].name);
        memcpy(p, base, sizeof(base));
        p[skip].value = " \t ";
        expect_bad(p, 5, base[skip].name);
    }
    /* the contract header's value must be parent-token-v1, case and all */
    memcpy(p, base, sizeof(base));
    p[2].value = "parent-token-v2";
    expect_bad(p, 5, "X-WKVM-Stateful-Chat");
    p[2].value = "Parent-Token-V1";
    expect_bad(p, 5, "X-WKVM-Stateful-Chat");
    /* message-id headers without the contract */
    ctl_session_hdr q1[] = {{"X-OpenWebUI-Chat-Id", "c"}, {"X-WKVM-Assistant-Message-ID", "a"}};
    expect_bad(q1, 2, "X-WKVM-Assistant-Message-ID");
    ctl_session_hdr q2[] = {{"X-WKVM-User-Message-ID", "m"}};
    expect_bad(q2, 1, "X-WKVM-User-Message-ID");
    ctl_session_hdr q3[] = {{"x-wkvm-parent-message-id", "p"}};
    expect_bad(q3, 1, "X-WKVM-Parent-Message-ID");
    /* over 512 bytes after stripping, in any of the six headers */
    char v513[514];
    memset(v513, 'y', 513);
    v513[513] = '\0';
    const char *names[] = {"X-OpenWebUI-User-Id",         "X-OpenWebUI-Chat-Id",
                           "X-WKVM-Stateful-Chat",        "X-WKVM-Assistant-Message-ID",
                           "X-WKVM-User-Message-ID",      "X-WKVM-Parent-Message-ID"};
    for (size_t i = 0; i < N_OF(names); i++) {
        ctl_session_hdr r[] = {{names[i], v513}};
        expect_bad(r, 1, names[i]);
        expect_bad(r, 1, "512");
    }
    /* the length check runs before the contract checks */
    memcpy(p, base, sizeof(base));
    p[2].value = "nope";
    p[4].value = v513;
    expect_bad(p, 5, "X-WKVM-User-Message-ID");
}

static void
test_key(void **state)
{
    (void)state;
    char k1[CTL_SESSION_KEY_SIZE], k2[CTL_SESSION_KEY_SIZE];
    ctl_session_hdrs h = hdrs_pt("a", "m", ""), h2;
    wk_diag d = {""};

    assert_int_equal(ctl_session_key("rwkv7", "alice", &h, k1, &d), WK_OK);
    assert_int_equal(strlen(k1), 64);
    assert_int_equal(ctl_session_key("rwkv7", "alice", &h, k2, &d), WK_OK);
    assert_string_equal(k1, k2);
    /* two API users, same Open WebUI user and chat ids: different sessions */
    assert_int_equal(ctl_session_key("rwkv7", "bob", &h, k2, &d), WK_OK);
    assert_string_not_equal(k1, k2);
    assert_int_equal(ctl_session_key("rwkv7-b", "alice", &h, k2, &d), WK_OK);
    assert_string_not_equal(k1, k2);
    /* message ids are not part of the key; the exact-prefix mode shares the key space */
    h2 = hdrs_prefix();
    assert_int_equal(ctl_session_key("rwkv7", "alice", &h2, k2, &d), WK_OK);
    assert_string_equal(k1, k2);
    /* length-prefixed: ("ab", "c") and ("a", "bc") differ */
    snprintf(h.user_id, sizeof(h.user_id), "ab");
    snprintf(h.chat_id, sizeof(h.chat_id), "c");
    snprintf(h2.user_id, sizeof(h2.user_id), "a");
    snprintf(h2.chat_id, sizeof(h2.chat_id), "bc");
    assert_int_equal(ctl_session_key("m", "", &h, k1, &d), WK_OK);
    assert_int_equal(ctl_session_key("m", "", &h2, k2, &d), WK_OK);
    assert_string_not_equal(k1, k2);
    /* no chat, no session */
    memset(&h2, 0, sizeof(h2));
    assert_int_equal(ctl_session_key("m", "", &h2, k2, &d), WK_EINVAL);
}

/* ------------------------------------------------- continuation ---- */

/* Checks the delta of a hit decodes to want and the reuse counts the retained prompt part. */
static void
check_delta(const turn_req *t, const char *want)
{
    char *s = dec(t->prompt + t->res.reused_tokens, t->req.n_prompt - t->res.reused_tokens);
    assert_string_equal(s, want);
    free(s);
}

static void
test_three_turns(void **state)
{
    (void)state;
    turn_req t;
    size_t n;

    /* turn 1 */
    ctl_session_binding *b1 = park1(false);
    const int32_t *r1 = ctl_session_binding_retained(b1, &n);
    char *s = dec(r1, n);
    assert_string_equal(s, "User: hi\n\nAssistant: Hello\n\n");
    free(s);
    char hex[WK_SHA256_HEX_LEN];
    assert_int_equal(wk_sha256_token_ids_hex(r1, n, hex), WK_OK);
    assert_string_equal(ctl_session_binding_retained_digest(b1), hex);

    /* turn 2: continues, only "User: more\n\nAssistant:" is prefilled */
    ctl_session_hdrs h2 = hdrs_pt("a2", "m2", "a1");
    wk_chat_msg m2[] = {msg("user", "hi"), msg("assistant", "Hello"), msg("user", "more")};
    turn_validate(&t, &h2, m2, N_OF(m2), b1);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
    assert_int_equal(t.res.reason, CTL_SESSION_REASON_NONE);
    assert_false(t.res.retire);
    assert_int_equal(t.res.reused_tokens, n);
    assert_memory_equal(t.prompt, r1, n * sizeof(*r1)); /* the retained ids are the prefix */
    check_delta(&t, "User: more\n\nAssistant:");
    ctl_session_binding *b2 = turn_commit(&t, b1, " The city\n\n", false, " The city");
    size_t n2;
    const int32_t *r2 = ctl_session_binding_retained(b2, &n2);
    s = dec(r2, n2);
    assert_string_equal(s,
                        "User: hi\n\nAssistant: Hello\n\nUser: more\n\nAssistant: The city\n\n");
    free(s);
    turn_fini(&t);

    /* turn 3 */
    ctl_session_hdrs h3 = hdrs_pt("a3", "m3", "a2");
    wk_chat_msg m3[] = {msg("user", "hi"),
                        msg("assistant", "Hello"),
                        msg("user", "more"),
                        msg("assistant", "The city"),
                        msg("user", "the world")};
    turn_validate(&t, &h3, m3, N_OF(m3), b2);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
    assert_int_equal(t.res.reused_tokens, n2);
    check_delta(&t, "User: the world\n\nAssistant:");
    ctl_session_binding *b3 = turn_commit(&t, b2, " Of\n\n", false, " Of");
    turn_fini(&t);

    /* turn 4 still continues; message ids of every turn are remembered */
    ctl_session_hdrs h4 = hdrs_pt("a4", "m1", "a3");
    wk_chat_msg m4[] = {msg("user", "hi"),        msg("assistant", "Hello"),
                        msg("user", "more"),      msg("assistant", "The city"),
                        msg("user", "the world"), msg("assistant", "Of"),
                        msg("user", "x")};
    expect_reject(b3, &h4, m4, N_OF(m4), "user_message_reused");
    h4 = hdrs_pt("a4", "m4", "a3");
    turn_validate(&t, &h4, m4, N_OF(m4), b3);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
    check_delta(&t, "User: x\n\nAssistant:");
    turn_fini(&t);

    ctl_session_binding_free(b1);
    ctl_session_binding_free(b2);
    ctl_session_binding_free(b3);
}

/* Turns that end on end-of-text: the hidden terminal is kept in the state, not prefilled twice. */
static void
test_hidden_terminal(void **state)
{
    (void)state;
    turn_req t;
    size_t n1, n2;

    ctl_session_binding *b1 = park1(true);
    const int32_t *r1 = ctl_session_binding_retained(b1, &n1);
    assert_int_equal(r1[n1 - 1], WK_TOK_EOT);

    ctl_session_hdrs h2 = hdrs_pt("a2", "m2", "a1");
    wk_chat_msg m2[] = {msg("user", "hi"), msg("assistant", "Hello"), msg("user", "more")};
    turn_validate(&t, &h2, m2, N_OF(m2), b1);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
    assert_int_equal(t.res.reused_tokens, n1 - 1); /* the terminal covers no prompt token */
    check_delta(&t, "\n\nUser: more\n\nAssistant:");
    ctl_session_binding *b2 = turn_commit(&t, b1, " The city", true, " The city");
    turn_fini(&t);
    /* the state holds the first terminal in the middle now */
    const int32_t *r2 = ctl_session_binding_retained(b2, &n2);
    assert_int_equal(r2[n1 - 1], WK_TOK_EOT);
    assert_int_equal(r2[n2 - 1], WK_TOK_EOT);

    /* turn 3 continues past both terminals */
    ctl_session_hdrs h3 = hdrs_pt("a3", "m3", "a2");
    wk_chat_msg m3[] = {msg("user", "hi"), msg("assistant", "Hello"), msg("user", "more"),
                        msg("assistant", "The city"), msg("user", "the world")};
    turn_validate(&t, &h3, m3, N_OF(m3), b2);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
    assert_int_equal(t.res.reused_tokens, n2 - 2);
    check_delta(&t, "\n\nUser: the world\n\nAssistant:");
    turn_fini(&t);

    /* a terminal the scheduler did not feed: gen without it, the delta starts at "\n\n" */
    ctl_session_binding_free(b2);
    b2 = NULL;
    ctl_session_hdrs h1 = hdrs_pt("a1", "m1", "");
    wk_chat_msg m1[] = {msg("user", "hi")};
    turn_validate(&t, &h1, m1, 1, NULL);
    ctl_session_binding *b1b = turn_commit(&t, NULL, " Hello", false, " Hello");
    turn_fini(&t);
    turn_validate(&t, &h2, m2, N_OF(m2), b1b);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
    check_delta(&t, "\n\nUser: more\n\nAssistant:");
    turn_fini(&t);

    ctl_session_binding_free(b1);
    ctl_session_binding_free(b1b);
}

static void
test_prefix_match_rule(void **state)
{
    (void)state;
    size_t off = 99;
    const int32_t p[] = {1, 2, 3, 4};

    assert_true(ctl_session_prefix_match((int32_t[]){1, 2, 3}, 3, p, 4, &off));
    assert_int_equal(off, 3);
    assert_true(ctl_session_prefix_match((int32_t[]){1, 2, 0}, 3, p, 4, &off));
    assert_int_equal(off, 2);
    assert_true(ctl_session_prefix_match((int32_t[]){1, 0, 2, 0}, 4, p, 4, &off));
    assert_int_equal(off, 2);
    assert_true(ctl_session_prefix_match(NULL, 0, p, 4, &off));
    assert_int_equal(off, 0);
    assert_true(ctl_session_prefix_match(p, 4, p, 4, &off));
    assert_int_equal(off, 4);
    off = 99;
    assert_false(ctl_session_prefix_match((int32_t[]){1, 2, 3, 4, 5}, 5, p, 4, &off));
    assert_false(ctl_session_prefix_match((int32_t[]){1, 9}, 2, p, 4, &off));
    assert_false(ctl_session_prefix_match((int32_t[]){0, 2}, 2, p, 4, &off));
    assert_int_equal(off, 99); /* untouched on failure */
}

/* ------------------------------------------------------ rejections ---- */

static void
test_first_and_miss(void **state)
{
    (void)state;
    turn_req t;
    ctl_session_hdrs h1 = hdrs_pt("a1", "m1", "");
    ctl_session_hdrs h2 = hdrs_pt("a2", "m2", "a1");
    wk_chat_msg m1[] = {msg("user", "hi")};
    wk_chat_msg m2[] = {msg("user", "hi"), msg("assistant", "Hello"), msg("user", "more")};

    /* turn 1: neither hit nor miss */
    turn_validate(&t, &h1, m1, 1, NULL);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_FIRST);
    assert_false(t.res.retire);
    assert_string_equal(ctl_session_outcome_str(t.res.outcome), "first");
    turn_fini(&t);
    /* turn 1 again over an existing binding (first message edited): retire the old one */
    ctl_session_binding *b = park1(false);
    turn_validate(&t, &h1, m1, 1, b);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_FIRST);
    assert_true(t.res.retire);
    turn_fini(&t);
    /* turn 2 without a binding: a miss */
    turn_validate(&t, &h2, m2, N_OF(m2), NULL);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_MISS);
    assert_false(t.res.retire);
    assert_string_equal(ctl_session_outcome_str(t.res.outcome), "miss");
    /* a stored binding that fails to decode: validate with NULL, then unavailable */
    ctl_session_result_unavailable(&t.res);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_REJECTED);
    assert_string_equal(ctl_session_reason_str(t.res.reason), "session_unavailable");
    assert_true(t.res.retire);
    turn_fini(&t);
    ctl_session_binding_free(b);
}

static void
test_reject_each_reason(void **state)
{
    (void)state;
    turn_req t;
    ctl_session_hdrs h = hdrs_pt("a2", "m2", "a1");
    wk_chat_msg m[] = {msg("user", "hi"), msg("assistant", "Hello"), msg("user", "more")};
    ctl_session_binding *b = park1(false), *x;

    /* contract_mismatch: the binding was made without the contract */
    {
        ctl_session_hdrs hp = hdrs_prefix();
        wk_chat_msg m1[] = {msg("user", "hi")};
        turn_validate(&t, &hp, m1, 1, NULL);
        assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_PREFIX_MISS);
        x = turn_commit(&t, NULL, " Hello\n\n", false, " Hello");
        turn_fini(&t);
        expect_reject(x, &h, m, N_OF(m), "contract_mismatch");
        ctl_session_binding_free(x);
    }
    /* request_metadata_unavailable: a binding without message ids */
    x = park1(false);
    x->has_meta = false;
    expect_reject(x, &h, m, N_OF(m), "request_metadata_unavailable");
    ctl_session_binding_free(x);
    /* session_history_unavailable: turn 1 was cut short, no visible text recorded */
    {
        ctl_session_hdrs h1 = hdrs_pt("a1", "m1", "");
        wk_chat_msg m1[] = {msg("user", "hi")};
        turn_validate(&t, &h1, m1, 1, NULL);
        x = turn_commit(&t, NULL, " Hel", false, NULL);
        turn_fini(&t);
        expect_reject(x, &h, m, N_OF(m), "session_history_unavailable");
        ctl_session_binding_free(x);
    }
    /* parent_message_mismatch: a regenerate of turn 1's reply, or an unknown parent */
    ctl_session_hdrs hx = hdrs_pt("a2", "m2", "a0");
    expect_reject(b, &hx, m, N_OF(m), "parent_message_mismatch");
    hx = hdrs_pt("a2", "m2", "m1");
    expect_reject(b, &hx, m, N_OF(m), "parent_message_mismatch");
    /* assistant_message_reused (as an assistant or a user id), user_message_reused */
    hx = hdrs_pt("a1", "m2", "a1");
    expect_reject(b, &hx, m, N_OF(m), "assistant_message_reused");
    hx = hdrs_pt("m1", "m2", "a1");
    expect_reject(b, &hx, m, N_OF(m), "assistant_message_reused");
    hx = hdrs_pt("a2", "m1", "a1");
    expect_reject(b, &hx, m, N_OF(m), "user_message_reused");
    hx = hdrs_pt("a2", "a1", "a1");
    expect_reject(b, &hx, m, N_OF(m), "user_message_reused");
    /* retained_history_mismatch: the stored ids no longer match their digest */
    x = park1(false);
    x->retained[3] += 1;
    expect_reject(x, &h, m, N_OF(m), "retained_history_mismatch");
    ctl_session_binding_free(x);
    /* prior_history_mismatch: an edited earlier message, a changed role, a shorter history */
    {
        wk_chat_msg e1[] = {msg("user", "hi!"), msg("assistant", "Hello"), msg("user", "more")};
        expect_reject(b, &h, e1, N_OF(e1), "prior_history_mismatch");
        wk_chat_msg e2[] = {msg("system", "hi"), msg("assistant", "Hello"), msg("user", "more")};
        expect_reject(b, &h, e2, N_OF(e2), "prior_history_mismatch");
        expect_reject(b, &h, e1, 0, "prior_history_mismatch");
        wk_chat_msg e4[] = {msg("user", "ho"), msg("assistant", "Hello"), msg("user", "more")};
        expect_reject(b, &h, e4, N_OF(e4), "prior_history_mismatch");
        /* cleaning is as rendered: CRLF, blank-line runs and outer space don't matter */
        wk_chat_msg e3[] = {msg("user", " hi \r\n"), msg("assistant", "Hello"),
                            msg("user", "more")};
        turn_validate(&t, &h, e3, N_OF(e3), b);
        assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
        turn_fini(&t);
    }
    /* prior_assistant_missing: no message after the prefix, or not an assistant one */
    {
        wk_chat_msg e1[] = {msg("user", "hi"), msg("user", "more")};
        expect_reject(b, &h, e1, N_OF(e1), "prior_assistant_missing");
        expect_reject(b, &h, e1, 1, "prior_assistant_missing");
    }
    /* prior_assistant_mismatch: the reply as the client holds it differs */
    {
        wk_chat_msg e1[] = {msg("user", "hi"), msg("assistant", "Hello!"), msg("user", "more")};
        expect_reject(b, &h, e1, N_OF(e1), "prior_assistant_mismatch");
        wk_chat_msg e2[] = {msg("user", "hi"), msg("assistant", "Hel lo"), msg("user", "more")};
        expect_reject(b, &h, e2, N_OF(e2), "prior_assistant_mismatch");
    }
    /* parent_history_digest_mismatch: the stored digest is not that of the history */
    x = park1(false);
    x->history_digest[0] = x->history_digest[0] == '0' ? '1' : '0';
    expect_reject(x, &h, m, N_OF(m), "parent_history_digest_mismatch");
    ctl_session_binding_free(x);
    /* new_messages_missing */
    expect_reject(b, &h, m, 2, "new_messages_missing");
    /* template_prefix_mismatch: the model produced " Hello" as " ","H","e",... */
    {
        ctl_session_hdrs h1 = hdrs_pt("a1", "m1", "");
        wk_chat_msg m1[] = {msg("user", "hi")};
        turn_validate(&t, &h1, m1, 1, NULL);
        const char *raw = " Hello";
        int32_t g[8];
        for (size_t i = 0; i < 6; i++)
            g[i] = (int32_t)(unsigned char)raw[i] + 1; /* single-byte tokens are byte + 1 */
        size_t nn;
        int32_t *nl = enc("\n\n", 2, &nn);
        assert_int_equal(nn, 1);
        g[6] = nl[0];
        free(nl);
        ctl_session_turn ct = {&t.req, &t.res, NULL, g, 7, " Hello", 6};
        assert_int_equal(ctl_session_commit(&ct, &x, NULL), WK_OK);
        turn_fini(&t);
        expect_reject(x, &h, m, N_OF(m), "template_prefix_mismatch");
        ctl_session_binding_free(x);
    }
    /* continuation_empty: a prompt that is exactly the retained tokens */
    {
        size_t n;
        const int32_t *r = ctl_session_binding_retained(b, &n);
        ctl_session_request rq = {&h, m, N_OF(m), r, n, NULL, NULL, 0, NULL, NULL};
        ctl_session_result res;
        assert_int_equal(ctl_session_validate(&rq, b, &res, NULL), WK_OK);
        assert_int_equal(res.outcome, CTL_SESSION_OUTCOME_REJECTED);
        assert_string_equal(ctl_session_reason_str(res.reason), "continuation_empty");
    }
    /* session_unavailable: a hit whose parked state turns out to be gone */
    {
        turn_validate(&t, &h, m, N_OF(m), b);
        assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
        ctl_session_result_unavailable(&t.res);
        assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_REJECTED);
        assert_string_equal(ctl_session_reason_str(t.res.reason), "session_unavailable");
        assert_int_equal(t.res.reused_tokens, 0);
        assert_true(t.res.retire);
        /* the turn then commits as a fresh start from the full prompt */
        x = turn_commit(&t, NULL, " Of\n\n", false, " Of");
        size_t n;
        const int32_t *r = ctl_session_binding_retained(x, &n);
        assert_memory_equal(r, t.prompt, t.req.n_prompt * sizeof(*r));
        assert_int_equal(n, t.req.n_prompt + 2);
        assert_int_equal(x->n_used, 2); /* the retired session's ids are forgotten */
        turn_fini(&t);
        ctl_session_binding_free(x);
    }
    ctl_session_binding_free(b);
}

/* Where two reasons apply, the earlier one in the list wins. */
static void
test_reason_order(void **state)
{
    (void)state;
    ctl_session_binding *b = park1(false);
    wk_chat_msg bad[] = {msg("user", "edited"), msg("assistant", "Nope")};

    /* parent mismatch + reused ids + bad history -> parent_message_mismatch */
    ctl_session_hdrs h = hdrs_pt("a1", "m1", "zz");
    expect_reject(b, &h, bad, N_OF(bad), "parent_message_mismatch");
    /* both ids reused + bad history -> assistant_message_reused */
    h = hdrs_pt("a1", "m1", "a1");
    expect_reject(b, &h, bad, N_OF(bad), "assistant_message_reused");
    /* history missing beats everything after it */
    b->has_history = false;
    h = hdrs_pt("a1", "m1", "zz");
    expect_reject(b, &h, bad, N_OF(bad), "session_history_unavailable");
    b->has_history = true;
    /* damaged retained ids + bad history -> retained_history_mismatch */
    b->retained[0] += 1;
    h = hdrs_pt("a2", "m2", "a1");
    expect_reject(b, &h, bad, N_OF(bad), "retained_history_mismatch");
    b->retained[0] -= 1;
    /* bad prior history + no new messages -> prior_history_mismatch */
    expect_reject(b, &h, bad, N_OF(bad), "prior_history_mismatch");
    /* wrong reply and no new messages -> prior_assistant_mismatch */
    wk_chat_msg m2[] = {msg("user", "hi"), msg("assistant", "Nope")};
    expect_reject(b, &h, m2, N_OF(m2), "prior_assistant_mismatch");
    /* contract mismatch beats missing metadata */
    b->contract = CTL_SESSION_CONTRACT_EXACT_PREFIX;
    b->has_meta = false;
    expect_reject(b, &h, m2, N_OF(m2), "contract_mismatch");
    ctl_session_binding_free(b);
}

/* ------------------------------------------------------ strip rule ---- */

static void
test_strip_rule(void **state)
{
    (void)state;
    turn_req t;
    size_t off, n;

    /* Python str.strip(): ASCII and Unicode whitespace, never inner, never invalid UTF-8 */
    const char *s1 = " \t\xe3\x80\x80\xc2\xa0" "A B\xe2\x80\xa8\n\x1f\xc2\x85";
    wk_chat_strip(s1, strlen(s1), &off, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(s1 + off, "A B", 3);
    wk_chat_strip("\xa0x\xa0", 3, &off, &n); /* a lone 0xa0 byte is not U+00A0 */
    assert_int_equal(off, 0);
    assert_int_equal(n, 3);
    wk_chat_strip("\xe2\x80\x8b" "x", 4, &off, &n); /* U+200B is not whitespace */
    assert_int_equal(n, 4);
    wk_chat_strip(" \xe2\x80\x83 ", 5, &off, &n);
    assert_int_equal(n, 0);

    /* reply " A \n" (stopped by end-of-text), the client persists "A": the assistant
     * check passes; the state saw " A \n" where the template renders " A\n\n", so the
     * turn restarts on the template check, not on prior_assistant_mismatch */
    ctl_session_hdrs h1 = hdrs_pt("a1", "m1", "");
    wk_chat_msg m1[] = {msg("user", "hi")};
    turn_validate(&t, &h1, m1, 1, NULL);
    ctl_session_binding *b = turn_commit(&t, NULL, " A \n", true, " A \n");
    turn_fini(&t);
    ctl_session_hdrs h2 = hdrs_pt("a2", "m2", "a1");
    wk_chat_msg m2[] = {msg("user", "hi"), msg("assistant", "A"), msg("user", "more")};
    expect_reject(b, &h2, m2, N_OF(m2), "template_prefix_mismatch");
    wk_chat_msg m3[] = {msg("user", "hi"), msg("assistant", " A\xe3\x80\x80"),
                        msg("user", "more")};
    expect_reject(b, &h2, m3, N_OF(m3), "template_prefix_mismatch");
    wk_chat_msg m4[] = {msg("user", "hi"), msg("assistant", "a"), msg("user", "more")};
    expect_reject(b, &h2, m4, N_OF(m4), "prior_assistant_mismatch");
    ctl_session_binding_free(b);

    /* Unicode whitespace around the reply: U+3000 and U+00A0 are stripped on both sides */
    turn_validate(&t, &h1, m1, 1, NULL);
    b = turn_commit(&t, NULL, "\xe3\x80\x80Hello\xc2\xa0", true, "\xe3\x80\x80Hello\xc2\xa0");
    turn_fini(&t);
    wk_chat_msg m5[] = {msg("user", "hi"), msg("assistant", "Hello"), msg("user", "more")};
    expect_reject(b, &h2, m5, N_OF(m5), "template_prefix_mismatch");
    char dg[WK_SHA256_HEX_LEN];
    assert_int_equal(ctl_session_history_digest(m1, 1, "Hello", 5, dg, NULL), WK_OK);
    assert_string_equal(b->history_digest, dg);
    ctl_session_binding_free(b);

    /* " Hello" with the client's "Hello" is a plain hit (covered by test_three_turns);
     * a reply the client kept with its inner newline intact hits too */
    turn_validate(&t, &h1, m1, 1, NULL);
    b = turn_commit(&t, NULL, " Hello\nthe world\n\n", false, " Hello\nthe world");
    turn_fini(&t);
    wk_chat_msg m6[] = {msg("user", "hi"), msg("assistant", "Hello\nthe world\n"),
                        msg("user", "more")};
    turn_validate(&t, &h2, m6, N_OF(m6), b);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
    check_delta(&t, "User: more\n\nAssistant:");
    turn_fini(&t);
    ctl_session_binding_free(b);
}

/* --------------------------------------------------- exact prefix ---- */

static void
test_exact_prefix(void **state)
{
    (void)state;
    turn_req t;
    ctl_session_hdrs hp = hdrs_prefix();
    wk_chat_msg m1[] = {msg("user", "hi")};
    wk_chat_msg m2[] = {msg("user", "hi"), msg("assistant", "Hello"), msg("user", "more")};

    turn_validate(&t, &hp, m1, 1, NULL);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_PREFIX_MISS);
    assert_int_equal(t.res.reason, CTL_SESSION_REASON_NONE);
    assert_false(t.res.retire);
    ctl_session_binding *b = turn_commit(&t, NULL, " Hello\n\n", false, " Hello");
    turn_fini(&t);
    assert_false(b->has_meta);
    assert_int_equal(b->n_used, 0);

    turn_validate(&t, &hp, m2, N_OF(m2), b);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_PREFIX_HIT);
    assert_string_equal(ctl_session_outcome_str(t.res.outcome), "prefix_hit");
    check_delta(&t, "User: more\n\nAssistant:");
    ctl_session_binding *b2 = turn_commit(&t, b, " Of\n\n", false, " Of");
    turn_fini(&t);
    size_t n;
    const int32_t *r = ctl_session_binding_retained(b2, &n);
    char *s = dec(r, n);
    assert_string_equal(s, "User: hi\n\nAssistant: Hello\n\nUser: more\n\nAssistant: Of\n\n");
    free(s);

    /* an edited history no longer extends the retained tokens */
    wk_chat_msg m3[] = {msg("user", "hello"), msg("assistant", "Hello"), msg("user", "more")};
    turn_validate(&t, &hp, m3, N_OF(m3), b);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_PREFIX_MISS);
    assert_int_equal(t.res.reason, CTL_SESSION_REASON_TEMPLATE_PREFIX_MISMATCH);
    assert_true(t.res.retire);
    turn_fini(&t);
    /* a contract binding is not reused without the contract */
    ctl_session_binding *bc = park1(false);
    turn_validate(&t, &hp, m2, N_OF(m2), bc);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_PREFIX_MISS);
    assert_int_equal(t.res.reason, CTL_SESSION_REASON_CONTRACT_MISMATCH);
    assert_true(t.res.retire);
    turn_fini(&t);
    /* a hit whose state is gone */
    turn_validate(&t, &hp, m2, N_OF(m2), b);
    ctl_session_result_unavailable(&t.res);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_PREFIX_MISS);
    assert_int_equal(t.res.reason, CTL_SESSION_REASON_SESSION_UNAVAILABLE);
    turn_fini(&t);

    /* no chat id: stateless */
    ctl_session_hdrs hn;
    memset(&hn, 0, sizeof(hn));
    turn_validate(&t, &hn, m2, N_OF(m2), NULL);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_NONE);
    ctl_session_turn ct = {&t.req, &t.res, NULL, NULL, 0, "x", 1};
    ctl_session_binding *bn = NULL;
    assert_int_equal(ctl_session_commit(&ct, &bn, NULL), WK_EINVAL);
    assert_null(bn);
    turn_fini(&t);

    ctl_session_binding_free(b);
    ctl_session_binding_free(b2);
    ctl_session_binding_free(bc);
}

/* ------------------------------------------------- hf-spm text mode ---- */

#define MS "\xe2\x96\x81" /* U+2581 in UTF-8 */

/*
 * A Llama-2 style tokenizer.json (normalizer Prepend("▁") + Replace(" ",
 * "▁"), byte fallback, decoder with Strip): <unk> <s> </s>, the 256
 * "<0xXX>" tokens, "▁" and the characters of the test texts, and merges
 * making "▁U", "▁A", "▁H", "▁h", "▁m" and "▁hi". Caller frees with wk_tok_free().
 */
static wk_tok *
spm_tok(void)
{
    static const char *const chars[] = {MS,      "U",     "s",      "e",      "r",  ":", "h",
                                         "i",     "A",     "t",      "n",      "H",  "l", "o",
                                         "m",     "a",     "b",      MS "U",   MS "A", MS "H",
                                         MS "h",  MS "m",  MS "hi"};
    static const char *const merges[] = {MS " U", MS " A", MS " H", MS " h", MS " m", MS "h i"};
    char *j = malloc(64 * 1024);
    size_t o = 0;
    wk_tok *t = NULL;
    wk_diag d = {""};

    assert_non_null(j);
    o += (size_t)snprintf(
        j + o, 64 * 1024 - o,
        "{\"version\": \"1.0\", \"added_tokens\": ["
        "{\"id\": 0, \"content\": \"<unk>\", \"normalized\": false, \"special\": true},"
        "{\"id\": 1, \"content\": \"<s>\", \"normalized\": false, \"special\": true},"
        "{\"id\": 2, \"content\": \"</s>\", \"normalized\": false, \"special\": true}],"
        "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
        "{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"}, {\"type\": \"Replace\", "
        "\"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},"
        "\"pre_tokenizer\": null, \"post_processor\": null,"
        "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", "
        "\"pattern\": {\"String\": \"\\u2581\"}, \"content\": \" \"}, {\"type\": "
        "\"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", "
        "\"start\": 1, \"stop\": 0}]},"
        "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, "
        "\"byte_fallback\": true, \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2");
    for (int c = 0; c < 256; c++)
        o += (size_t)snprintf(j + o, 64 * 1024 - o, ", \"<0x%02X>\": %d", c, 3 + c);
    for (size_t i = 0; i < N_OF(chars); i++)
        o += (size_t)snprintf(j + o, 64 * 1024 - o, ", \"%s\": %zu", chars[i], 259 + i);
    o += (size_t)snprintf(j + o, 64 * 1024 - o, "}, \"merges\": [");
    for (size_t i = 0; i < N_OF(merges); i++)
        o += (size_t)snprintf(j + o, 64 * 1024 - o, "%s\"%s\"", i ? ", " : "", merges[i]);
    o += (size_t)snprintf(j + o, 64 * 1024 - o, "]}}");
    assert_true(o < 64 * 1024 - 1);
    if (wk_tok_load_hf_mem(j, o, "{\"eos_token\": \"</s>\"}", 21, &t, &d) != WK_OK)
        fail_msg("spm tokenizer: %s", d.msg);
    assert_string_equal(wk_tok_kind(t), "hf-spm");
    assert_int_equal(wk_tok_eos(t), 2);
    free(j);
    return t;
}

/* One text-mode turn as ctl_chat runs it. */
typedef struct spm_turn {
    char *text;             /* rendered prompt, owned */
    size_t len;             /* bytes */
    int32_t *prompt;        /* full prompt ids, owned */
    int32_t *delta;         /* ids fed this turn, owned */
    size_t n_delta;         /* entries */
    ctl_session_request req; /* validate's request */
    ctl_session_result res; /* its decision */
} spm_turn;

/* The align hook spm_turn_validate() puts in its request (NULL: the World rule). */
static bool (*g_align)(void *ctx, const int32_t *retained, size_t n, size_t k, size_t *off);

/* Renders and encodes msgs, validates against prev, and encodes what a HIT feeds. */
static void
spm_turn_validate(spm_turn *t, wk_tok *tok, const ctl_session_hdrs *h, const wk_chat_msg *msgs,
                  size_t n, const ctl_session_binding *prev)
{
    wk_diag d = {""};
    size_t np = 0;

    memset(t, 0, sizeof(*t));
    assert_int_equal(wk_chat_render(msgs, n, true, &t->text, &t->len, NULL), WK_OK);
    assert_int_equal(ctl_session_prompt_encode(tok, msgs, n, &t->prompt, &np, &d), WK_OK);
    t->req = (ctl_session_request){h, msgs, n, t->prompt, np, tok, t->text, t->len, g_align, t};
    if (ctl_session_validate(&t->req, prev, &t->res, &d) != WK_OK)
        fail_msg("validate: %s", d.msg);
    if (t->res.outcome == CTL_SESSION_OUTCOME_HIT ||
        t->res.outcome == CTL_SESSION_OUTCOME_PREFIX_HIT) {
        assert_int_equal(wk_tok_encode_continue(tok, t->text, t->len, t->res.reused_bytes,
                                                &t->delta, &t->n_delta, &d),
                         WK_OK);
    } else {
        t->delta = malloc((np ? np : 1) * sizeof(*t->delta));
        assert_non_null(t->delta);
        memcpy(t->delta, t->prompt, np * sizeof(*t->delta));
        t->n_delta = np;
    }
}

/* Commits t (the delta as the prompt, as ctl_chat does) with gen and visible; new binding. */
static ctl_session_binding *
spm_turn_commit(const spm_turn *t, const ctl_session_binding *prev, const int32_t *gen,
                size_t n_gen, const char *visible)
{
    ctl_session_request creq = t->req;
    ctl_session_result cres = t->res;
    creq.prompt_ids = t->delta;
    creq.n_prompt = t->n_delta;
    cres.reused_tokens = 0;
    bool hit = t->res.outcome == CTL_SESSION_OUTCOME_HIT ||
               t->res.outcome == CTL_SESSION_OUTCOME_PREFIX_HIT;
    ctl_session_turn ct = {&creq, &cres, hit ? prev : NULL, gen, n_gen, visible, strlen(visible)};
    ctl_session_binding *b = NULL;
    wk_diag d = {""};
    if (ctl_session_commit(&ct, &b, &d) != WK_OK)
        fail_msg("commit: %s", d.msg);
    return b;
}

static void
spm_turn_fini(spm_turn *t)
{
    free(t->text);
    free(t->prompt);
    free(t->delta);
}

/* The bytes of n ids, pieces concatenated (no strip), into a malloc'd string. */
static char *
spm_pieces(const wk_tok *tok, const int32_t *ids, size_t n)
{
    char *s = malloc(4096);
    size_t o = 0;
    assert_non_null(s);
    for (size_t i = 0; i < n; i++) {
        size_t pl = 0;
        const uint8_t *p = wk_tok_piece(tok, ids[i], &pl);
        assert_non_null(p);
        assert_true(o + pl < 4096);
        memcpy(s + o, p, pl);
        o += pl;
    }
    s[o] = '\0';
    return s;
}

/* Generated ids of text, as a model continuing mid-text would emit them. */
static int32_t *
spm_gen(const wk_tok *tok, const char *text, bool eos, size_t *n)
{
    int32_t *ids = NULL;
    char buf[256];
    snprintf(buf, sizeof(buf), "x%s", text);
    assert_int_equal(wk_tok_encode_continue(tok, buf, strlen(buf), 1, &ids, n, NULL), WK_OK);
    int32_t *g = realloc(ids, (*n + 1) * sizeof(*g));
    assert_non_null(g);
    if (eos)
        g[(*n)++] = wk_tok_eos(tok);
    return g;
}

/* A template's alignment, as ctl_openai_tpl_align answers: at g_align_off, or none. */
static size_t g_align_off;
static size_t g_align_k;
static size_t g_align_n;

static bool
align_at(void *ctx, const int32_t *retained, size_t n, size_t k, size_t *off)
{
    (void)ctx;
    (void)retained;
    g_align_k = k;
    g_align_n = n;
    *off = g_align_off;
    return true;
}

static bool
align_none(void *ctx, const int32_t *retained, size_t n, size_t k, size_t *off)
{
    (void)ctx;
    (void)retained;
    (void)n;
    (void)k;
    (void)off;
    return false;
}

/*
 * A model's own template aligns the parked reply (ctl_session_request.align):
 * the delta starts where it says, the retained ids all count as reused (a
 * template's eos is text the state consumed), and a template whose rendering
 * does not line up is template_prefix_mismatch.
 */
static void
test_align_hook(void **state)
{
    (void)state;
    wk_tok *tok = spm_tok();
    spm_turn t;
    size_t ng = 0, nr = 0;
    ctl_session_hdrs h1 = hdrs_pt("a1", "m1", "");
    wk_chat_msg m1[] = {msg("user", "hi")};
    spm_turn_validate(&t, tok, &h1, m1, 1, NULL);
    int32_t *g1 = spm_gen(tok, " Hello", true, &ng);
    ctl_session_binding *b1 = spm_turn_commit(&t, NULL, g1, ng, " Hello");
    free(g1);
    spm_turn_fini(&t);
    (void)ctl_session_binding_retained(b1, &nr);

    ctl_session_hdrs h2 = hdrs_pt("a2", "m2", "a1");
    wk_chat_msg m2[] = {msg("user", "hi"), msg("assistant", "Hello"), msg("user", "more")};
    g_align = align_at;
    g_align_off = strlen("User: hi\n\nAssistant: Hello\n\n");
    spm_turn_validate(&t, tok, &h2, m2, N_OF(m2), b1);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
    assert_int_equal(g_align_k, 1);  /* the parked reply's message */
    assert_int_equal(g_align_n, nr); /* with every retained id */
    assert_int_equal(t.res.reused_bytes, g_align_off);
    assert_int_equal(t.res.reused_tokens, nr); /* the eos included */
    char *p = spm_pieces(tok, t.delta, t.n_delta);
    assert_string_equal(p, "User: more\n\nAssistant:");
    free(p);
    spm_turn_fini(&t);
    /* an offset past the prompt, or no alignment: template_prefix_mismatch */
    g_align_off = 100000;
    spm_turn_validate(&t, tok, &h2, m2, N_OF(m2), b1);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_REJECTED);
    assert_string_equal(ctl_session_reason_str(t.res.reason), "template_prefix_mismatch");
    spm_turn_fini(&t);
    g_align = align_none;
    spm_turn_validate(&t, tok, &h2, m2, N_OF(m2), b1);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_REJECTED);
    assert_string_equal(ctl_session_reason_str(t.res.reason), "template_prefix_mismatch");
    assert_true(t.res.retire);
    spm_turn_fini(&t);
    g_align = NULL;
    ctl_session_binding_free(b1);
    wk_tok_free(tok);
}

/*
 * hf-spm (Llama-2 normalizer): the encoder's "▁" in front of the prompt
 * is not text, so a follow-up that extends the previous turn's text is a
 * HIT and feeds exactly the tokens of the new text, without a "▁" at its
 * start; a follow-up that does not extend it is still a miss.
 */
static void
test_spm_text_mode(void **state)
{
    (void)state;
    wk_tok *tok = spm_tok();
    spm_turn t;
    size_t ng = 0, nr = 0, cover = 0;

    /* turn 1: fresh; the first token's piece starts with the Prepend's space */
    ctl_session_hdrs h1 = hdrs_pt("a1", "m1", "");
    wk_chat_msg m1[] = {msg("user", "hi")};
    spm_turn_validate(&t, tok, &h1, m1, 1, NULL);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_FIRST);
    char *p = spm_pieces(tok, t.prompt, t.req.n_prompt);
    assert_string_equal(p, " User: hi\n\nAssistant:");
    free(p);
    /* the plain byte rule misses it from byte 0; the encoder-aware one covers it */
    size_t plain = 0, k = 0;
    for (; k < t.req.n_prompt; k++) {
        size_t pl = 0;
        const uint8_t *pc = wk_tok_piece(tok, t.prompt[k], &pl);
        if (pl > t.len - plain || memcmp(t.text + plain, pc, pl) != 0)
            break;
        plain += pl;
    }
    assert_int_equal(k, 0);
    assert_true(ctl_session_text_prefix(tok, t.prompt, t.req.n_prompt, t.text, t.len, &cover));
    assert_int_equal(cover, t.len);
    int32_t *g1 = spm_gen(tok, " Hello\n\n", false, &ng);
    ctl_session_binding *b1 = spm_turn_commit(&t, NULL, g1, ng, " Hello");
    free(g1);
    spm_turn_fini(&t);

    /* turn 2: a HIT; only "User: more\n\nAssistant:" is fed, with no "▁" in front */
    ctl_session_hdrs h2 = hdrs_pt("a2", "m2", "a1");
    wk_chat_msg m2[] = {msg("user", "hi"), msg("assistant", "Hello"), msg("user", "more")};
    spm_turn_validate(&t, tok, &h2, m2, N_OF(m2), b1);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
    assert_int_equal(t.res.reason, CTL_SESSION_REASON_NONE);
    assert_false(t.res.retire);
    assert_int_equal(t.res.reused_bytes, strlen("User: hi\n\nAssistant: Hello\n\n"));
    const int32_t *r1 = ctl_session_binding_retained(b1, &nr);
    assert_int_equal(t.res.reused_tokens, nr);
    p = spm_pieces(tok, t.delta, t.n_delta);
    assert_string_equal(p, "User: more\n\nAssistant:");
    free(p);
    /* the whole text splits there too: retained + delta == encode(whole text) */
    assert_int_equal(t.req.n_prompt, nr + t.n_delta);
    assert_memory_equal(t.prompt, r1, nr * sizeof(*r1));
    assert_memory_equal(t.prompt + nr, t.delta, t.n_delta * sizeof(*t.delta));
    int32_t *g2 = spm_gen(tok, " The", true, &ng); /* ends on a hidden </s> */
    ctl_session_binding *b2 = spm_turn_commit(&t, b1, g2, ng, " The");
    free(g2);
    spm_turn_fini(&t);

    /* turn 3: continues past the hidden </s>, which starts no new run */
    ctl_session_hdrs h3 = hdrs_pt("a3", "m3", "a2");
    wk_chat_msg m3[] = {msg("user", "hi"), msg("assistant", "Hello"), msg("user", "more"),
                        msg("assistant", "The"), msg("user", "a<s>b")};
    spm_turn_validate(&t, tok, &h3, m3, N_OF(m3), b2);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
    p = spm_pieces(tok, t.delta, t.n_delta);
    assert_string_equal(p, "\n\nUser: a<s> b\n\nAssistant:"); /* the run after <s> is marked */
    free(p);
    int32_t *g3 = spm_gen(tok, " Hi\n\n", false, &ng);
    ctl_session_binding *b3 = spm_turn_commit(&t, b2, g3, ng, " Hi");
    free(g3);
    spm_turn_fini(&t);

    /* turn 4: the "▁b" after the user's <s> is matched as "b" */
    ctl_session_hdrs h4 = hdrs_pt("a4", "m4", "a3");
    wk_chat_msg m4[] = {msg("user", "hi"),    msg("assistant", "Hello"), msg("user", "more"),
                        msg("assistant", "The"), msg("user", "a<s>b"),    msg("assistant", "Hi"),
                        msg("user", "ah")};
    spm_turn_validate(&t, tok, &h4, m4, N_OF(m4), b3);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
    p = spm_pieces(tok, t.delta, t.n_delta);
    assert_string_equal(p, "User: ah\n\nAssistant:");
    free(p);
    spm_turn_fini(&t);

    /*
     * The state consumed " Hello!" (a stop string "!", fed) while the client
     * saw " Hello": the visible history matches, so the follow-up continues
     * the exact retained tokens; they did not end the turn, so the template's
     * "\n\n" after the reply is fed.
     */
    int32_t *gx = NULL;
    spm_turn_validate(&t, tok, &h1, m1, 1, NULL);
    gx = spm_gen(tok, " Hello!", false, &ng);
    ctl_session_binding *bx = spm_turn_commit(&t, NULL, gx, ng, " Hello");
    free(gx);
    spm_turn_fini(&t);
    spm_turn_validate(&t, tok, &h2, m2, N_OF(m2), bx);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
    assert_int_equal(t.res.reused_bytes, strlen("User: hi\n\nAssistant: Hello"));
    p = spm_pieces(tok, t.delta, t.n_delta);
    assert_string_equal(p, "\n\nUser: more\n\nAssistant:");
    free(p);
    spm_turn_fini(&t);
    /* the Prepend is undone once, at the start: "▁" + "▁U" reads " U", never "U" */
    const int32_t lead[] = {259, 259 + 17}; /* "▁", "▁U": " " + " U" */
    assert_true(ctl_session_text_prefix(tok, lead, 2, " User", 5, &cover));
    assert_int_equal(cover, 2);
    assert_false(ctl_session_text_prefix(tok, lead, 2, "User", 4, &cover));

    /* exact-prefix reuse (no contract) hits the same way */
    ctl_session_hdrs hp = hdrs_prefix();
    spm_turn_validate(&t, tok, &hp, m1, 1, NULL);
    g1 = spm_gen(tok, " Hello\n\n", false, &ng);
    ctl_session_binding *bp = spm_turn_commit(&t, NULL, g1, ng, " Hello");
    free(g1);
    spm_turn_fini(&t);
    spm_turn_validate(&t, tok, &hp, m2, N_OF(m2), bp);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_PREFIX_HIT);
    p = spm_pieces(tok, t.delta, t.n_delta);
    assert_string_equal(p, "User: more\n\nAssistant:");
    free(p);
    spm_turn_fini(&t);

    ctl_session_binding_free(b1);
    ctl_session_binding_free(b2);
    ctl_session_binding_free(b3);
    ctl_session_binding_free(bx);
    ctl_session_binding_free(bp);
    wk_tok_free(tok);
}

/* World keeps the plain byte rule in text mode. */
static void
test_world_text_mode(void **state)
{
    (void)state;
    size_t n = 0, cover = 0;
    const char *text = "User: hi\n\nAssistant: Hello";
    int32_t *ids = enc("User: hi\n\nAssistant:", 20, &n);
    int32_t *more = realloc(ids, (n + 1) * sizeof(*ids));
    assert_non_null(more);
    more[n] = WK_TOK_EOT;
    assert_true(ctl_session_text_prefix(g_tok, more, n + 1, text, strlen(text), &cover));
    assert_int_equal(cover, 20);
    assert_false(ctl_session_text_prefix(g_tok, more, n, "User: ho", 8, &cover));
    int32_t *d1 = NULL, *d2 = NULL;
    size_t n1 = 0, n2 = 0;
    assert_int_equal(wk_tok_encode_continue(g_tok, text, strlen(text), 20, &d1, &n1, NULL), WK_OK);
    d2 = enc(text + 20, strlen(text) - 20, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(d1, d2, n1 * sizeof(*d1));
    free(d1);
    free(d2);
    free(more);
}

/*
 * Alignment: the retained ids stand for the reply as the client shows it,
 * whatever their bytes; the template's "\n\n" after the reply is theirs only
 * when they ended the turn.
 */
static void
test_align_visible(void **state)
{
    (void)state;
    size_t n = 0, off = 0;
    /* the state consumed " He\x01llo\xff \n\n" (raw bytes), the client shows "He?llo" */
    const char *raw = "User: hi\n\nAssistant: He\x01llo\xff \n\n";
    int32_t *ids = enc(raw, strlen(raw), &n);
    wk_chat_msg m[] = {msg("user", "hi"), msg("assistant", " He\xef\xbf\xbdllo "),
                       msg("user", "more")};
    const char *want = "User: hi\n\nAssistant: He\xef\xbf\xbdllo\n\n";
    assert_true(ctl_session_retained_terminated(g_tok, ids, n));
    assert_int_equal(ctl_session_align(g_tok, ids, n, m, 3, 1, &off, NULL), WK_OK);
    assert_int_equal(off, strlen(want)); /* the delta is "User: more\n\nAssistant:" */
    /* cut by max_tokens (no "\n\n" consumed): the template's "\n\n" is fed */
    size_t n2 = 0;
    int32_t *cut = enc("User: hi\n\nAssistant: He\xc3", 24, &n2);
    assert_false(ctl_session_retained_terminated(g_tok, cut, n2));
    assert_int_equal(ctl_session_align(g_tok, cut, n2, m, 3, 1, &off, NULL), WK_OK);
    assert_int_equal(off, strlen(want) - 2);
    /* ended by end-of-text: the template's "\n\n" is fed too */
    int32_t *eot = realloc(ids, (n + 1) * sizeof(*ids));
    assert_non_null(eot);
    eot[n] = WK_TOK_EOT;
    assert_false(ctl_session_retained_terminated(g_tok, eot, n + 1));
    assert_false(ctl_session_retained_terminated(g_tok, eot, 0));
    assert_int_equal(ctl_session_align(g_tok, eot, n + 1, m, 3, 3, &off, NULL), WK_EINVAL);
    free(eot);
    free(cut);
}

static void
test_commit_limits(void **state)
{
    (void)state;
    turn_req t;
    ctl_session_binding *b = park1(false), *nb = NULL;
    ctl_session_hdrs h = hdrs_pt("a2", "m2", "a1");
    wk_chat_msg m[] = {msg("user", "hi"), msg("assistant", "Hello"), msg("user", "more")};
    wk_diag d = {""};

    /* the used-id list keeps the newest CTL_SESSION_MAX_USED_IDS */
    for (size_t i = 0; i < b->n_used; i++)
        free(b->used[i]);
    for (size_t i = 0; i < CTL_SESSION_MAX_USED_IDS; i++) {
        char id[32];
        snprintf(id, sizeof(id), "old-%zu", i);
        b->used[i] = strdup(id);
    }
    b->n_used = CTL_SESSION_MAX_USED_IDS;
    free(b->last_assistant_id);
    b->last_assistant_id = strdup("a1");
    turn_validate(&t, &h, m, N_OF(m), b);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
    nb = turn_commit(&t, b, " Of\n\n", false, " Of");
    assert_int_equal(nb->n_used, CTL_SESSION_MAX_USED_IDS);
    assert_string_equal(nb->used[0], "old-2");
    assert_string_equal(nb->used[CTL_SESSION_MAX_USED_IDS - 1], "a2");
    ctl_session_binding_free(nb);
    nb = NULL;

    /* bad ids, a hit without its binding, a bad role */
    int32_t bad[] = {5, -1};
    ctl_session_turn ct = {&t.req, &t.res, b, bad, 2, "x", 1};
    assert_int_equal(ctl_session_commit(&ct, &nb, &d), WK_EINVAL);
    bad[1] = WK_TOK_MAX_ID + 1;
    assert_int_equal(ctl_session_commit(&ct, &nb, &d), WK_EINVAL);
    ct.n_gen = 1;
    ct.prev = NULL;
    assert_int_equal(ctl_session_commit(&ct, &nb, &d), WK_EINVAL);
    ct.prev = b;
    /* not valid UTF-8: no JSON form, no digest */
    ct.visible = "\xff";
    assert_int_equal(ctl_session_commit(&ct, &nb, &d), WK_EINVAL);
    assert_null(nb);
    turn_fini(&t);
    wk_chat_msg mr[] = {msg("tool", "x")};
    ctl_session_hdrs h1 = hdrs_pt("a1", "m1", "");
    int32_t one = 5;
    ctl_session_request rq = {&h1, mr, 1, &one, 1, NULL, NULL, 0, NULL, NULL};
    ctl_session_result res = {.outcome = CTL_SESSION_OUTCOME_FIRST};
    ctl_session_turn ct2 = {&rq, &res, NULL, NULL, 0, "x", 1};
    assert_int_equal(ctl_session_commit(&ct2, &nb, &d), WK_EINVAL);
    assert_null(nb);

    /* the opaque ref */
    size_t rl = 99;
    assert_null(ctl_session_binding_ref(b, &rl));
    assert_int_equal(rl, 0);
    assert_int_equal(ctl_session_binding_set_ref(b, "slot:1:7:3", 10), WK_OK);
    const char *ref = ctl_session_binding_ref(b, &rl);
    assert_int_equal(rl, 10);
    assert_memory_equal(ref, "slot:1:7:3", 10);
    static char big[CTL_SESSION_MAX_REF + 1];
    assert_int_equal(ctl_session_binding_set_ref(b, big, sizeof(big)), WK_ETOOBIG);
    ref = ctl_session_binding_ref(b, &rl);
    assert_int_equal(rl, 10);
    ctl_session_binding_free(b);
}

/* ----------------------------------------------------------- bytes ---- */

/* Recomputes the trailing checksum of an encoded binding after an edit. */
static void
reseal(uint8_t *p, size_t len)
{
    wk_sha256_buf(p, len - WK_SHA256_LEN, p + len - WK_SHA256_LEN);
}

static void
put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* Encodes b, decodes it, and checks the copy encodes to the same bytes. */
static ctl_session_binding *
round_trip(const ctl_session_binding *b, uint8_t **blob, size_t *len)
{
    ctl_session_binding *c = NULL;
    uint8_t *p2 = NULL;
    size_t l2 = 0;
    wk_diag d = {""};

    assert_int_equal(ctl_session_binding_encode(b, blob, len, &d), WK_OK);
    if (ctl_session_binding_decode(*blob, *len, &c, &d) != WK_OK)
        fail_msg("decode: %s", d.msg);
    assert_int_equal(ctl_session_binding_encode(c, &p2, &l2, &d), WK_OK);
    assert_int_equal(l2, *len);
    assert_memory_equal(p2, *blob, l2);
    free(p2);
    return c;
}

static void
test_encode_round_trip(void **state)
{
    (void)state;
    turn_req t;
    uint8_t *blob = NULL;
    size_t len = 0;

    ctl_session_binding *b = park1(true);
    assert_int_equal(ctl_session_binding_set_ref(b, "w0/s3/g9", 8), WK_OK);
    ctl_session_binding *c = round_trip(b, &blob, &len);
    free(blob);
    assert_int_equal(c->contract, b->contract);
    assert_int_equal(c->n_msgs, 1);
    assert_string_equal(c->msgs[0].role, "user");
    assert_string_equal(c->msgs[0].content, "hi");
    assert_int_equal(c->n_prompt, b->n_prompt);
    assert_memory_equal(c->prompt, b->prompt, b->n_prompt * sizeof(int32_t));
    assert_int_equal(c->n_retained, b->n_retained);
    assert_memory_equal(c->retained, b->retained, b->n_retained * sizeof(int32_t));
    assert_string_equal(c->retained_digest, b->retained_digest);
    assert_string_equal(c->last_assistant_id, "a1");
    assert_string_equal(c->last_user_id, "m1");
    assert_int_equal(c->n_used, 2);
    assert_int_equal(c->visible_len, 6);
    assert_string_equal(c->visible, " Hello");
    assert_string_equal(c->history_digest, b->history_digest);
    size_t rl;
    assert_memory_equal(ctl_session_binding_ref(c, &rl), "w0/s3/g9", 8);
    /* the decoded binding continues like the original */
    ctl_session_hdrs h = hdrs_pt("a2", "m2", "a1");
    wk_chat_msg m[] = {msg("user", "hi"), msg("assistant", "Hello"), msg("user", "more")};
    turn_validate(&t, &h, m, N_OF(m), c);
    assert_int_equal(t.res.outcome, CTL_SESSION_OUTCOME_HIT);
    turn_fini(&t);
    ctl_session_binding_free(c);
    ctl_session_binding_free(b);

    /* no history, exact prefix, empty visible text with a NUL inside, Unicode content */
    ctl_session_hdrs h1 = hdrs_pt("a1", "m1", "");
    wk_chat_msg m1[] = {msg("system", "\xe4\xbd\xa0\xe5\xa5\xbd"), msg("user", "hi")};
    turn_validate(&t, &h1, m1, 2, NULL);
    b = turn_commit(&t, NULL, "x", false, NULL);
    c = round_trip(b, &blob, &len);
    free(blob);
    assert_false(c->has_history);
    assert_null(c->visible);
    ctl_session_binding_free(c);
    ctl_session_binding_free(b);
    turn_fini(&t);
    ctl_session_hdrs hp = hdrs_prefix();
    turn_validate(&t, &hp, m1, 2, NULL);
    ctl_session_turn ct = {&t.req, &t.res, NULL, NULL, 0, "a\0b", 3};
    assert_int_equal(ctl_session_commit(&ct, &b, NULL), WK_OK);
    c = round_trip(b, &blob, &len);
    free(blob);
    assert_int_equal(c->contract, CTL_SESSION_CONTRACT_EXACT_PREFIX);
    assert_int_equal(c->visible_len, 3);
    assert_memory_equal(c->visible, "a\0b", 3);
    ctl_session_binding_free(c);
    ctl_session_binding_free(b);
    turn_fini(&t);
}

/* Expects decode of (p, len) to fail with want (0: any failure). */
static void
expect_decode_fail(const uint8_t *p, size_t len, wk_err want)
{
    ctl_session_binding *c = NULL;
    wk_diag d = {""};
    wk_err err = ctl_session_binding_decode(p, len, &c, &d);
    if (err == WK_OK)
        fail_msg("decode of %zu bytes succeeded", len);
    if (want != WK_OK && err != want)
        fail_msg("decode: %s (%s), expected %s", wk_err_name(err), d.msg, wk_err_name(want));
    assert_null(c);
    assert_true(d.msg[0] != '\0');
}

static void
test_decode_malformed(void **state)
{
    (void)state;
    uint8_t *blob = NULL, *p;
    size_t len = 0;
    ctl_session_binding *b = park1(false);

    assert_int_equal(ctl_session_binding_encode(b, &blob, &len, NULL), WK_OK);
    p = malloc(len + 8);
    assert_non_null(p);

    /* every truncation, every single-byte change */
    for (size_t i = 0; i < len; i++)
        expect_decode_fail(blob, i, WK_OK);
    for (size_t i = 0; i < len; i++) {
        memcpy(p, blob, len);
        p[i] ^= 0x41;
        expect_decode_fail(p, len, WK_OK);
    }
    expect_decode_fail(NULL, 0, WK_ECORRUPT);

    /* edits with a valid checksum: the reader must still refuse them */
    /* layout of this binding: 0 magic, 8 version, 12 flags, 16 contract, 20 n_msgs,
     * 24 role len, 28 "user", 32 content len, 36 "hi", 38 n_prompt, 42 prompt ids */
    memcpy(p, blob, len);
    put_u32(p + 8, 2);
    reseal(p, len);
    expect_decode_fail(p, len, WK_ENOTSUP);
    memcpy(p, blob, len);
    put_u32(p + 12, 0x13);
    reseal(p, len);
    expect_decode_fail(p, len, WK_ECORRUPT);
    memcpy(p, blob, len);
    put_u32(p + 16, 3);
    reseal(p, len);
    expect_decode_fail(p, len, WK_ECORRUPT);
    memcpy(p, blob, len);
    put_u32(p + 20, 0xffffffffu);
    reseal(p, len);
    expect_decode_fail(p, len, WK_ECORRUPT);
    memcpy(p, blob, len);
    put_u32(p + 24, 0xfffffff0u);
    reseal(p, len);
    expect_decode_fail(p, len, WK_ECORRUPT);
    memcpy(p, blob, len);
    p[28] = (uint8_t)'r'; /* "user" -> "rser" */
    reseal(p, len);
    expect_decode_fail(p, len, WK_ECORRUPT);
    memcpy(p, blob, len);
    p[36] = '\0'; /* NUL in a message */
    reseal(p, len);
    expect_decode_fail(p, len, WK_ECORRUPT);
    memcpy(p, blob, len);
    put_u32(p + 38, 0x7fffffffu);
    reseal(p, len);
    expect_decode_fail(p, len, WK_ECORRUPT);
    memcpy(p, blob, len);
    put_u32(p + 42, 0xffffffffu); /* id -1 */
    reseal(p, len);
    expect_decode_fail(p, len, WK_ECORRUPT);
    memcpy(p, blob, len);
    put_u32(p + 42, WK_TOK_MAX_ID + 1);
    reseal(p, len);
    expect_decode_fail(p, len, WK_ECORRUPT);
    /* the retained digest: after the prompt and retained ids */
    size_t dig = 42 + 4 * b->n_prompt + 4 + 4 * b->n_retained;
    memcpy(p, blob, len);
    p[dig] = 'G';
    reseal(p, len);
    expect_decode_fail(p, len, WK_ECORRUPT);
    memcpy(p, blob, len);
    p[dig] = 'A'; /* upper case is not the form written */
    reseal(p, len);
    expect_decode_fail(p, len, WK_ECORRUPT);
    /* the first message id: empty, then over 512 bytes */
    memcpy(p, blob, len);
    put_u32(p + dig + 64, 0);
    reseal(p, len);
    expect_decode_fail(p, len, WK_ECORRUPT);
    memcpy(p, blob, len);
    put_u32(p + dig + 64, 513);
    reseal(p, len);
    expect_decode_fail(p, len, WK_ECORRUPT);
    /* a trailing byte before the checksum */
    memcpy(p, blob, len - WK_SHA256_LEN);
    p[len - WK_SHA256_LEN] = 0;
    reseal(p, len + 1);
    expect_decode_fail(p, len + 1, WK_ECORRUPT);
    /* and the untouched bytes still decode */
    ctl_session_binding *c = NULL;
    assert_int_equal(ctl_session_binding_decode(blob, len, &c, NULL), WK_OK);
    ctl_session_binding_free(c);

    free(p);
    free(blob);
    ctl_session_binding_free(b);
}

/* --------------------------------------------------------- digest ---- */

/* The conversations of tests/reference/session_digest.py, in the same order. */
static const wk_chat_msg dg_basic[] = {{"user", "hi", 0}};
static const char dg_user2[] = "\xe3\x80\x80" "more\0 <>&\xc2\xa0";
static const wk_chat_msg dg_unicode[] = {
    {"system", "You are\r\n\r\n\nhelpful.  ", 0},
    {"user",
     "\xe4\xbd\xa0\xe5\xa5\xbd \xe2\x80\x9c" "q\xe2\x80\x9d \"x\" \\ a/b\ttab \xc3\xa9 "
     "\xf0\x9f\x98\x80\xe2\x80\xa8" "end\x01",
     0},
    {"assistant", "Prior\xc2\xa0" "reply\n\n\nline", 0},
    {"user", dg_user2, sizeof(dg_user2) - 1},
};
static const char dg_unicode_reply[] = "\xe3\x80\x80 R\xc3\xa9\0ponse <>&/ \xc2\xa0\n";
static const wk_chat_msg dg_empty[] = {{"user", "  ", 0}};

typedef struct dg_case {
    const char *name;         /* the script's case name */
    const wk_chat_msg *msgs;  /* input messages */
    size_t n;                 /* entries */
    const char *reply;        /* visible reply */
    size_t reply_len;         /* bytes */
} dg_case;

static const dg_case dg_cases[] = {
    {"basic", dg_basic, 1, " Hello\n", 7},
    {"unicode", dg_unicode, 4, dg_unicode_reply, sizeof(dg_unicode_reply) - 1},
    {"empty_reply", dg_empty, 1, " \xe2\x80\x83 ", 5},
};

static void
test_digest_form(void **state)
{
    (void)state;
    char want[WK_SHA256_HEX_LEN], got[WK_SHA256_HEX_LEN];
    const char *js = "[{\"content\":\"hi\",\"role\":\"user\"},"
                     "{\"content\":\"Hello\",\"role\":\"assistant\"}]";

    wk_sha256_hex(js, strlen(js), want);
    assert_int_equal(ctl_session_history_digest(dg_basic, 1, " Hello\n", 7, got, NULL), WK_OK);
    assert_string_equal(got, want);
    /* what commit stores is the same digest */
    ctl_session_binding *b = park1(false);
    assert_string_equal(b->history_digest, want);
    ctl_session_binding_free(b);
}

static void
test_digest_python(void **state)
{
    (void)state;
    const char *py = getenv("PYTHON");
    const char *src = getenv("WKVM_SOURCE_DIR");
    char cmd[8192], line[512];
    size_t seen = 0;

    if (py == NULL || *py == '\0')
        py = "/usr/bin/python3";
    snprintf(cmd, sizeof(cmd), "'%s' '%s/tests/reference/session_digest.py'", py,
             src ? src : ".");
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        char name[64], hex[WK_SHA256_HEX_LEN + 1], got[WK_SHA256_HEX_LEN];
        if (sscanf(line, "%63s %64s", name, hex) != 2)
            fail_msg("bad script line: %s", line);
        for (size_t i = 0; i < N_OF(dg_cases); i++) {
            if (strcmp(dg_cases[i].name, name) != 0)
                continue;
            wk_diag d = {""};
            if (ctl_session_history_digest(dg_cases[i].msgs, dg_cases[i].n, dg_cases[i].reply,
                                           dg_cases[i].reply_len, got, &d) != WK_OK)
                fail_msg("digest %s: %s", name, d.msg);
            if (strcmp(got, hex) != 0)
                fail_msg("case %s: C %s, Python %s", name, got, hex);
            seen++;
        }
    }
    int st = pclose(f);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127) {
        print_message("python not found (%s), skipping\n", py);
        skip();
    }
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(seen, N_OF(dg_cases));

    /* and the commit path stores it: turn over the unicode conversation */
    turn_req t;
    ctl_session_hdrs h = hdrs_pt("a1", "m1", "");
    turn_validate(&t, &h, dg_unicode, 4, NULL);
    ctl_session_turn ct = {&t.req, &t.res, NULL, NULL, 0, dg_unicode_reply,
                           sizeof(dg_unicode_reply) - 1};
    ctl_session_binding *b = NULL;
    assert_int_equal(ctl_session_commit(&ct, &b, NULL), WK_OK);
    char got[WK_SHA256_HEX_LEN];
    assert_int_equal(ctl_session_history_digest(dg_unicode, 4, dg_unicode_reply,
                                                sizeof(dg_unicode_reply) - 1, got, NULL),
                     WK_OK);
    assert_string_equal(b->history_digest, got);
    /* the follow-up with the stripped reply and the cleaned history continues */
    ctl_session_hdrs h2 = hdrs_pt("a2", "m2", "a1");
    wk_chat_msg m2[7];
    memcpy(m2, dg_unicode, sizeof(dg_unicode));
    m2[4] = (wk_chat_msg){"assistant", "R\xc3\xa9\0ponse <>&/", 14};
    m2[5] = msg("user", "next");
    turn_req t2;
    turn_validate(&t2, &h2, m2, 6, b);
    /* commit had no generated ids, so the state stops at "Assistant:" and the delta is
     * the whole reply as the template renders it (NUL dropped by cleaning) */
    assert_int_equal(t2.res.outcome, CTL_SESSION_OUTCOME_HIT);
    assert_int_equal(t2.res.reused_tokens, t.req.n_prompt);
    check_delta(&t2, " R\xc3\xa9ponse <>&/\n\nUser: next\n\nAssistant:");
    turn_fini(&t2);
    turn_fini(&t);
    ctl_session_binding_free(b);
}

static void
test_strings(void **state)
{
    (void)state;
    const char *want[] = {"",
                          "contract_mismatch",
                          "request_metadata_unavailable",
                          "session_history_unavailable",
                          "parent_message_mismatch",
                          "assistant_message_reused",
                          "user_message_reused",
                          "retained_history_mismatch",
                          "prior_history_mismatch",
                          "prior_assistant_missing",
                          "prior_assistant_mismatch",
                          "parent_history_digest_mismatch",
                          "new_messages_missing",
                          "template_prefix_mismatch",
                          "continuation_empty",
                          "session_unavailable"};
    assert_int_equal(N_OF(want), CTL_SESSION_REASON__COUNT);
    for (int i = 0; i < CTL_SESSION_REASON__COUNT; i++)
        assert_string_equal(ctl_session_reason_str((ctl_session_reason)i), want[i]);
    assert_string_equal(ctl_session_reason_str(CTL_SESSION_REASON__COUNT), "unknown");
    assert_string_equal(ctl_session_outcome_str(CTL_SESSION_OUTCOME_HIT), "hit");
    assert_string_equal(ctl_session_outcome_str(CTL_SESSION_OUTCOME_REJECTED), "rejected");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_headers_ok),
        cmocka_unit_test(test_headers_getter),
        cmocka_unit_test(test_headers_errors),
        cmocka_unit_test(test_key),
        cmocka_unit_test(test_three_turns),
        cmocka_unit_test(test_hidden_terminal),
        cmocka_unit_test(test_prefix_match_rule),
        cmocka_unit_test(test_first_and_miss),
        cmocka_unit_test(test_reject_each_reason),
        cmocka_unit_test(test_reason_order),
        cmocka_unit_test(test_strip_rule),
        cmocka_unit_test(test_exact_prefix),
        cmocka_unit_test(test_spm_text_mode),
        cmocka_unit_test(test_align_hook),
        cmocka_unit_test(test_world_text_mode),
        cmocka_unit_test(test_align_visible),
        cmocka_unit_test(test_commit_limits),
        cmocka_unit_test(test_encode_round_trip),
        cmocka_unit_test(test_decode_malformed),
        cmocka_unit_test(test_digest_form),
        cmocka_unit_test(test_digest_python),
        cmocka_unit_test(test_strings),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
