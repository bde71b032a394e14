/*
 * ctl_responses: the Responses API on durable states (see the header and
 * docs/RESPONSES.md).
 *
 * A stored response is a record in the store's key-value table, under
 * "resp:<owner digest>:<id>", holding everything the API shows (items,
 * usage, parameters) plus the exact token ids of its end state; the state
 * itself is the end-of-reply checkpoint ctl_ckpt leaves for those ids,
 * marked durable (written through to disk). With --responses-ttl a second
 * key "respx:<expiry>:<owner digest>:<id>" orders records by expiry so that
 * the sweep reads only what expired. Ids are 48 random hex digits, and a
 * lookup with another owner's digest misses exactly as an unknown id does:
 * another owner's response is a plain 404.
 *
 * Must never: hand another owner's record out, resume a state whose tokens
 * are not a prefix of the request's (the checkpoint index checks ids), or
 * log item text.
 */
#define WK_LOG_MODULE "responses"
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "ctl_app.h"
#include "ctl_ckpt.h"
#include "ctl_gen.h"
#include "ctl_openai.h"
#include "ctl_resp_req.h"
#include "ctl_responses.h"
#include "ctl_session.h"
#include "wk_chat.h"
#include "wk_json.h"
#include "wk_log.h"
#include "wk_sha256.h"
#include "wk_time.h"

#define RESP_KEY_PREFIX "resp:"    /* record keys */
#define RESP_EXP_PREFIX "respx:"   /* expiry index keys */
#define RESP_OWNER_HEX 32          /* hex digits of the owner digest in keys */
#define RESP_KEY_MAX 160           /* bytes of a key, with the NUL */
#define RESP_RECORD_VERSION 1      /* "v" of records this build writes */
#define RESP_SWEEP_EVERY_MS 10000u /* a POST sweeps expired records at most this often */
#define RESP_ITEMS_LIMIT_MAX 100   /* input_items page size limit */

static _Atomic uint64_t resp_last_sweep_ms;
/* Serializes the parent's read-modify-write of "children" (fork counting). */
static pthread_mutex_t resp_children_mu = PTHREAD_MUTEX_INITIALIZER;

/* ------------------------------------------------------------ keys ---- */

static void
resp_owner_hex(const char *owner, char out[RESP_OWNER_HEX + 1])
{
    char hex[WK_SHA256_HEX_LEN];
    wk_sha256_hex(owner, strlen(owner), hex);
    memcpy(out, hex, RESP_OWNER_HEX);
    out[RESP_OWNER_HEX] = '\0';
}

static void
resp_key(const char *owner, const char *id, char out[RESP_KEY_MAX])
{
    char oh[RESP_OWNER_HEX + 1];
    resp_owner_hex(owner, oh);
    snprintf(out, RESP_KEY_MAX, RESP_KEY_PREFIX "%s:%s", oh, id);
}

static void
resp_exp_key(const char *owner, const char *id, int64_t expires_at, char out[RESP_KEY_MAX])
{
    char oh[RESP_OWNER_HEX + 1];
    resp_owner_hex(owner, oh);
    snprintf(out, RESP_KEY_MAX, RESP_EXP_PREFIX "%016llx:%s:%s", (unsigned long long)expires_at, oh,
             id);
}

/* prefix followed by 2 * n random hex digits into out (cap bytes). */
static void
resp_new_id(const char *prefix, size_t n, char *out, size_t cap)
{
    uint8_t rnd[32];
    if (n > sizeof(rnd))
        n = sizeof(rnd);
    size_t got = 0;
    while (got < n) {
        ssize_t k = getrandom(rnd + got, n - got, 0);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    if (got < n) { /* (no entropy source: time and address, still unique per process) */
        uint64_t s = wk_mono_ms() ^ ((uint64_t)time(NULL) << 20) ^ (uint64_t)(uintptr_t)out;
        for (size_t i = got; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            rnd[i] = (uint8_t)(s >> 56);
        }
    }
    size_t off = (size_t)snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < n && off + 2 < cap; i++, off += 2)
        snprintf(out + off, cap - off, "%02x", rnd[i]);
}

static int64_t
resp_now_s(void)
{
    return (int64_t)time(NULL);
}

/* ------------------------------------------------------------ metrics ---- */

wk_err
ctl_responses_metrics_declare(ctl_metrics *m)
{
    static const struct {
        const char *name;
        const char *help;
    } fams[] = {
        {"wkvm_responses_stored_total", "Responses stored (store: true)."},
        {"wkvm_responses_resumes_total",
         "Requests naming a previous_response_id that resolved, by result: exact (the previous "
         "state's tokens were all reused) or fallback (re-rendered history, longest prefix)."},
        {"wkvm_responses_forks_total",
         "Responses continuing a previous response that already had a continuation (a fork)."},
        {"wkvm_responses_misses_total",
         "previous_response_id lookups that found nothing, by reason (not_found, expired)."},
        {"wkvm_responses_evictions_total", "Stored responses removed by --responses-ttl."},
        {"wkvm_responses_deleted_total", "Stored responses deleted by a client or an operator."},
    };
    for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++) {
        wk_err err =
            ctl_metrics_declare(m, fams[i].name, CTL_METRIC_COUNTER, fams[i].help, NULL, 0);
        if (err != WK_OK)
            return err;
    }
    return WK_OK;
}

/* ------------------------------------------------------------ records ---- */

/* A best-effort removal's result: logged at debug level, never fatal. */
static void
resp_cleanup(wk_err err, const char *what)
{
    if (err != WK_OK && err != WK_ENOENT)
        wk_log_debug("response cleanup %s: %s", what, wk_strerror(err));
}

/* Deletes a record and its expiry key (rec: the record, for its expiry). */
static void
resp_drop(ctl_app *app, const char *key, const json_t *rec)
{
    resp_cleanup(ctl_store_session_delete(app->store, key, NULL), "record");
    json_int_t exp = json_integer_value(json_object_get(rec, "expires_at"));
    const char *owner = json_string_value(json_object_get(rec, "owner"));
    const char *id = json_string_value(json_object_get(rec, "id"));
    if (exp > 0 && owner != NULL && id != NULL) {
        char xk[RESP_KEY_MAX];
        resp_exp_key(owner, id, exp, xk);
        resp_cleanup(ctl_store_session_delete(app->store, xk, NULL), "expiry key");
    }
}

/* Decodes a stored value into a record object; NULL when it does not decode. */
static json_t *
resp_decode(const void *val, size_t len)
{
    json_t *rec = NULL;
    if (wk_json_parse(val, len, &rec, NULL) != WK_OK)
        return NULL;
    if (!json_is_object(rec) ||
        json_integer_value(json_object_get(rec, "v")) != RESP_RECORD_VERSION ||
        !json_is_string(json_object_get(rec, "id"))) {
        json_decref(rec);
        return NULL;
    }
    return rec;
}

/*
 * True when rec outlived --responses-ttl as it is now (a changed TTL applies
 * to records stored before; 0 keeps them).
 */
static bool
resp_expired(const ctl_app *app, const json_t *rec, int64_t now)
{
    json_int_t created = json_integer_value(json_object_get(rec, "created_at"));
    return app->responses_ttl_s > 0 && now >= created + (json_int_t)app->responses_ttl_s;
}

/*
 * The record of owner's response id: *rec (caller decrefs) on WK_OK. An
 * expired record is removed (counted) and answers WK_ENOENT with *expired.
 */
static wk_err
resp_load(ctl_app *app, const char *owner, const char *id, json_t **rec, bool *expired)
{
    *expired = false;
    if (!ctl_resp_id_valid(id))
        return WK_ENOENT;
    char key[RESP_KEY_MAX];
    resp_key(owner, id, key);
    void *val = NULL;
    size_t len = 0;
    wk_err err = ctl_store_session_get(app->store, key, &val, &len, NULL);
    if (err != WK_OK)
        return err == WK_EINVAL ? WK_ENOENT : err;
    json_t *r = resp_decode(val, len);
    free(val);
    if (r == NULL) {
        wk_log_warn("response record undecodable id=%s", id);
        return WK_ENOENT;
    }
    if (resp_expired(app, r, resp_now_s())) {
        resp_drop(app, key, r);
        json_decref(r);
        ctl_metrics_add(app->metrics, "wkvm_responses_evictions_total", NULL, 1);
        *expired = true;
        return WK_ENOENT;
    }
    *rec = r;
    return WK_OK;
}

/* Writes rec (with its expiry key). */
static wk_err
resp_save(ctl_app *app, const json_t *rec, wk_diag *d)
{
    const char *owner = json_string_value(json_object_get(rec, "owner"));
    const char *id = json_string_value(json_object_get(rec, "id"));
    char key[RESP_KEY_MAX];
    resp_key(owner, id, key);
    char *s = wk_json_dump_compact(rec);
    if (s == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    json_int_t exp = json_integer_value(json_object_get(rec, "expires_at"));
    wk_err err = WK_OK;
    if (exp > 0) { /* the index first: a record without one would never expire */
        char xk[RESP_KEY_MAX];
        resp_exp_key(owner, id, exp, xk);
        err = ctl_store_session_put(app->store, xk, "", 0, d);
    }
    if (err == WK_OK)
        err = ctl_store_session_put(app->store, key, s, strlen(s), d);
    free(s);
    return err;
}

/*
 * The per-user quota of stored responses: WK_EQUOTA (429 quota_exceeded)
 * when owner keeps --max-responses-per-user already. A check, not a
 * reservation: concurrent requests of one user may overshoot by their number.
 */
static wk_err
resp_quota(ctl_app *app, const char *owner, wk_diag *d)
{
    uint64_t max = app->max_responses_per_user;
    if (max == 0)
        return WK_OK;
    char prefix[RESP_KEY_MAX], after[CTL_STORE_SESSION_KEY_MAX + 1] = "";
    resp_key(owner, "", prefix);
    uint64_t n = 0;
    ctl_store_kv_page page = {0};
    while (n < max) {
        wk_err err = ctl_store_session_list(app->store, prefix, after, 0, false, &page, d);
        if (err != WK_OK)
            return err;
        n += page.n;
        snprintf(after, sizeof(after), "%s", page.next);
        ctl_store_kv_page_fini(&page);
        if (after[0] == '\0')
            break;
    }
    if (n < max)
        return WK_OK;
    if (app->responses_ttl_s > 0) {
        /* At the limit: drop this owner's expired ones first (a TTL shortened since). */
        int64_t now = resp_now_s();
        after[0] = '\0';
        n = 0;
        for (;;) {
            wk_err err = ctl_store_session_list(app->store, prefix, after, 0, true, &page, d);
            if (err != WK_OK)
                return err;
            for (size_t i = 0; i < page.n; i++) {
                json_t *rec = resp_decode(page.items[i].val, page.items[i].len);
                if (rec != NULL && resp_expired(app, rec, now)) {
                    resp_drop(app, page.items[i].key, rec);
                    ctl_metrics_add(app->metrics, "wkvm_responses_evictions_total", NULL, 1);
                } else {
                    n++;
                }
                json_decref(rec);
            }
            snprintf(after, sizeof(after), "%s", page.next);
            ctl_store_kv_page_fini(&page);
            if (after[0] == '\0')
                break;
        }
        if (n < max)
            return WK_OK;
    }
    ctl_metrics_add(app->metrics, "wkvm_quota_refusals_total", "limit=\"responses\"", 1);
    return wk_diag_set(d, WK_EQUOTA,
                       "response quota exceeded: %llu responses stored, the limit is %llu per "
                       "user; delete some (DELETE /v1/responses/{id}) or send store: false",
                       (unsigned long long)n, (unsigned long long)max);
}

/* Removes expired records (oldest first, stops at the first one alive). */
static void
resp_sweep(ctl_app *app)
{
    int64_t now = resp_now_s();
    ctl_store_kv_page page = {0};
    char after[CTL_STORE_SESSION_KEY_MAX + 1] = "";
    size_t removed = 0;
    for (;;) {
        if (ctl_store_session_list(app->store, RESP_EXP_PREFIX, after, 0, false, &page, NULL) !=
            WK_OK)
            break;
        bool stop = page.n == 0;
        for (size_t i = 0; i < page.n && !stop; i++) {
            const char *k = page.items[i].key + strlen(RESP_EXP_PREFIX);
            unsigned long long exp = strtoull(k, NULL, 16);
            if ((int64_t)exp > now) {
                stop = true;
                break;
            }
            const char *rest = strlen(k) > 17 ? k + 17 : "";
            char key[RESP_KEY_MAX];
            snprintf(key, sizeof(key), RESP_KEY_PREFIX "%s", rest);
            void *val = NULL;
            size_t len = 0;
            json_t *rec = NULL;
            if (ctl_store_session_get(app->store, key, &val, &len, NULL) == WK_OK)
                rec = resp_decode(val, len);
            free(val);
            resp_cleanup(ctl_store_session_delete(app->store, page.items[i].key, NULL),
                         "expiry key");
            if (rec != NULL && resp_expired(app, rec, now)) {
                resp_drop(app, key, rec);
                removed++;
                ctl_metrics_add(app->metrics, "wkvm_responses_evictions_total", NULL, 1);
            } else if (rec != NULL) {
                /* the TTL grew (or is off) since: a new expiry, or none */
                json_int_t created = json_integer_value(json_object_get(rec, "created_at"));
                json_object_set_new(rec, "expires_at",
                                    json_integer(app->responses_ttl_s > 0
                                                     ? created + (json_int_t)app->responses_ttl_s
                                                     : 0));
                resp_cleanup(resp_save(app, rec, NULL), "re-expiry");
            }
            json_decref(rec);
        }
        snprintf(after, sizeof(after), "%s", page.next);
        ctl_store_kv_page_fini(&page);
        if (stop || after[0] == '\0')
            break;
    }
    if (removed > 0)
        wk_log_info("responses expired removed=%zu", removed);
}

/* ------------------------------------------------------------ shapes ---- */

/* An item of the API from a record message {id, role, text}. */
static json_t *
resp_item_json(const json_t *m)
{
    const char *role = json_string_value(json_object_get(m, "role"));
    bool out = role != NULL && strcmp(role, "assistant") == 0;
    const json_t *t = json_object_get(m, "text");
    json_t *part = json_pack("{s:s, s:O}", "type", out ? "output_text" : "input_text", "text", t);
    if (out && part != NULL) {
        json_object_set_new(part, "annotations", json_array());
        json_object_set_new(part, "logprobs", json_array());
    }
    return json_pack("{s:O, s:s, s:s, s:O, s:[o]}", "id", json_object_get(m, "id"), "type",
                     "message", "status", "completed", "role", json_object_get(m, "role"),
                     "content", part);
}

/* The output message item: text "" and status in_progress while generating. */
static json_t *
resp_output_item(const char *msg_id, const json_t *text, const char *status, bool with_part)
{
    json_t *content = json_array();
    if (with_part)
        json_array_append_new(content, json_pack("{s:s, s:O, s:[], s:[]}", "type", "output_text",
                                                 "text", text, "annotations", "logprobs"));
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", msg_id, "type", "message", "status", status,
                     "role", "assistant", "content", content);
}

/* A copy of rec[key], or JSON null. */
static json_t *
resp_or_null(const json_t *rec, const char *key)
{
    json_t *v = json_object_get(rec, key);
    return v != NULL ? json_deep_copy(v) : json_null();
}

/* The response object of a record (status from the record). */
static json_t *
resp_object(const json_t *rec)
{
    const char *status = json_string_value(json_object_get(rec, "status"));
    json_t *o = json_pack("{s:O, s:s, s:O, s:s}", "id", json_object_get(rec, "id"), "object",
                          "response", "created_at", json_object_get(rec, "created_at"), "status",
                          status != NULL ? status : "completed");
    if (o == NULL)
        return NULL;
    json_t *err = json_object_get(rec, "error");
    json_object_set_new(o, "error", err != NULL ? json_deep_copy(err) : json_null());
    const char *ir = json_string_value(json_object_get(rec, "incomplete_reason"));
    json_object_set_new(o, "incomplete_details",
                        ir != NULL ? json_pack("{s:s}", "reason", ir) : json_null());
    json_object_set_new(o, "instructions", resp_or_null(rec, "instructions"));
    json_object_set_new(o, "max_output_tokens", resp_or_null(rec, "max_output_tokens"));
    json_object_set_new(o, "model", resp_or_null(rec, "model"));
    json_t *output = json_array();
    json_t *out = json_object_get(rec, "output");
    if (json_is_object(out))
        json_array_append_new(
            output, resp_output_item(
                        json_string_value(json_object_get(out, "id")), json_object_get(out, "text"),
                        strcmp(status != NULL ? status : "", "incomplete") == 0 ? "incomplete"
                                                                                : "completed",
                        true));
    json_object_set_new(o, "output", output);
    json_object_set_new(o, "parallel_tool_calls", json_true());
    json_object_set_new(o, "previous_response_id", resp_or_null(rec, "previous_response_id"));
    json_object_set_new(o, "reasoning", json_pack("{s:n, s:n}", "effort", "summary"));
    json_object_set_new(o, "store", json_boolean(json_is_true(json_object_get(rec, "store"))));
    json_object_set_new(o, "temperature", resp_or_null(rec, "temperature"));
    json_object_set_new(o, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
    json_object_set_new(o, "tool_choice", json_string("auto"));
    json_t *tools = json_object_get(rec, "tools");
    json_object_set_new(o, "tools", json_is_array(tools) ? json_deep_copy(tools) : json_array());
    json_object_set_new(o, "top_p", resp_or_null(rec, "top_p"));
    json_object_set_new(o, "truncation", json_string("disabled"));
    json_t *u = json_object_get(rec, "usage");
    if (json_is_object(u)) {
        json_int_t in = json_integer_value(json_object_get(u, "input_tokens"));
        json_int_t outn = json_integer_value(json_object_get(u, "output_tokens"));
        json_object_set_new(o, "usage",
                            json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", in,
                                      "input_tokens_details", "cached_tokens",
                                      json_integer_value(json_object_get(u, "cached_tokens")),
                                      "output_tokens", outn, "output_tokens_details",
                                      "reasoning_tokens", (json_int_t)0, "total_tokens",
                                      in + outn));
    } else {
        json_object_set_new(o, "usage", json_null());
    }
    json_object_set_new(o, "user", resp_or_null(rec, "user"));
    json_t *md = json_object_get(rec, "metadata");
    json_object_set_new(o, "metadata", json_is_object(md) ? json_deep_copy(md) : json_object());
    json_object_set_new(o, "background", json_false());
    json_object_set_new(o, "service_tier", json_string("default"));
    return o;
}

/* ------------------------------------------------------------ create ---- */

/* One POST /v1/responses in flight. */
typedef struct resp_call {
    ctl_http_req *req;            /* the request */
    ctl_app *app;                 /* app */
    ctl_openai_req r;             /* the generation (prompt, messages, reuse) */
    ctl_resp_req q;               /* the parsed body */
    json_t *rec;                  /* the record being built (owned) */
    json_t *prev;                 /* the previous response's record, NULL none (owned) */
    size_t n_prev;                /* tokens of the previous state the prompt starts with */
    bool aligned;                 /* the prompt starts with the previous state's exact tokens */
    char msg_id[CTL_RESP_ID_MAX]; /* the output message's id */
    uint64_t seq;                 /* next SSE sequence_number */
    bool broken;                  /* the client went away (stream) */
} resp_call;

static void resp_send_error(ctl_http_req *req, int status, wk_err err, const char *param,
                            const char *code, const char *fmt, ...) WK_PRINTF(6, 7);

static void
resp_send_error(ctl_http_req *req, int status, wk_err err, const char *param, const char *code,
                const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ctl_http_send_error_code(req, status, err, msg, param != NULL && param[0] ? param : NULL,
                             code != NULL && code[0] ? code : NULL);
}

static void
resp_count(ctl_app *app, const char *status)
{
    char lb[96];
    snprintf(lb, sizeof(lb), "route=\"responses\",status=\"%s\"", status);
    ctl_metrics_add(app->metrics, "wkvm_requests_total", lb, 1);
}

/* Appends a message {id, role, text} to arr. */
static void
resp_msg_append(json_t *arr, const char *role, const char *text, size_t len)
{
    char id[CTL_RESP_ID_MAX];
    resp_new_id("msg_", 24, id, sizeof(id));
    json_array_append_new(arr,
                          json_pack("{s:s, s:s, s:s%}", "id", id, "role", role, "text", text, len));
}

/*
 * The previous response's state tokens (the record's "tokens") as a malloc'd
 * array the caller frees. False when absent, malformed or out of the vocab.
 */
static bool
resp_prev_tokens(resp_call *c, int32_t **out, size_t *n)
{
    const json_t *t = json_object_get(c->prev, "tokens");
    if (!json_is_array(t) || json_array_size(t) == 0)
        return false;
    size_t m = json_array_size(t);
    int32_t *ids = malloc(m * sizeof(*ids));
    if (ids == NULL)
        return false;
    uint32_t vocab = wk_tok_vocab_size(c->app->tok);
    for (size_t i = 0; i < m; i++) {
        json_t *e = json_array_get(t, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) >= (json_int_t)vocab) {
            free(ids);
            return false;
        }
        ids[i] = (int32_t)json_integer_value(e);
    }
    *out = ids;
    *n = m;
    return true;
}

/* True when two optional strings (NULL = none) are equal. */
static bool
resp_same_text(const json_t *a, const char *b, size_t bl)
{
    if (!json_is_string(a))
        return b == NULL;
    return b != NULL && json_string_length(a) == bl && memcmp(json_string_value(a), b, bl) == 0;
}

/*
 * Renders the conversation (instructions, the previous history, the new
 * items) and tokenizes it into c->r: the previous state's exact tokens plus
 * the rest as their continuation when the history renders as the previous
 * state saw it, else the whole text (the checkpoint index then finds the
 * longest prefix). Fills the record's "history" and "input". Sends the
 * error and returns false on failure.
 */
static bool
resp_build_prompt(resp_call *c, json_t *history, json_t *input)
{
    ctl_app *app = c->app;
    ctl_resp_req *q = &c->q;
    ctl_openai_req *r = &c->r;
    if (c->prev != NULL) {
        json_t *h = json_object_get(c->prev, "history"), *in = json_object_get(c->prev, "input");
        json_t *out = json_object_get(c->prev, "output");
        size_t i;
        json_t *m;
        json_array_foreach(h, i, m) json_array_append(history, m);
        json_array_foreach(in, i, m) json_array_append(history, m);
        if (json_is_object(out))
            json_array_append_new(
                history, json_pack("{s:O, s:s, s:O}", "id", json_object_get(out, "id"), "role",
                                   "assistant", "text", json_object_get(out, "text")));
    }
    for (size_t i = 0; i < q->n_items; i++)
        resp_msg_append(input, q->items[i].role, q->items[i].text, q->items[i].len);
    size_t n_sys = q->instructions != NULL ? 1 : 0;
    size_t n = n_sys + json_array_size(history) + json_array_size(input);
    uint32_t max_msgs = app->max_messages ? app->max_messages : 4096;
    if (n > max_msgs) {
        resp_send_error(c->req, 400, WK_ETOOBIG, "input", "context_length_exceeded",
                        "the conversation has %zu messages, more than the limit of %u", n,
                        max_msgs);
        return false;
    }
    wk_chat_msg *cm = calloc(n, sizeof(*cm));
    wk_chat_span *sp = calloc(n, sizeof(*sp));
    if (cm == NULL || sp == NULL) {
        free(cm);
        free(sp);
        resp_send_error(c->req, 500, WK_ENOMEM, NULL, NULL, "out of memory");
        return false;
    }
    size_t k = 0;
    if (n_sys) {
        cm[k].role = "system";
        cm[k].content = q->instructions;
        cm[k++].content_len = q->instructions_len;
    }
    json_t *lists[2] = {history, input};
    for (size_t l = 0; l < 2; l++) {
        size_t i;
        json_t *m;
        json_array_foreach(lists[l], i, m)
        {
            const char *role = json_string_value(json_object_get(m, "role"));
            json_t *t = json_object_get(m, "text");
            if (role == NULL)
                role = "user";
            cm[k].role = strcmp(role, "assistant") == 0 ? "assistant"
                         : strcmp(role, "system") == 0  ? "system"
                                                        : "user";
            cm[k].content = json_is_string(t) ? json_string_value(t) : "";
            cm[k++].content_len = json_is_string(t) ? json_string_length(t) : 0;
        }
    }
    /* (content_len 0 means NUL-terminated: an empty text is "" either way) */
    r->msgs = cm;
    r->n_msgs = n;
    wk_diag d = {{0}};
    if (wk_chat_render_spans(cm, n, true, &r->prompt_text, &r->prompt_len, sp, &d) != WK_OK) {
        free(sp);
        resp_send_error(c->req, 400, WK_EINVAL, "input", NULL, "%s", d.msg);
        return false;
    }
    int32_t *prev_ids = NULL, *rest = NULL;
    size_t n_prev = 0, n_rest = 0, off = 0;
    ctl_worker_view v;
    /*
     * The exact path: the same model, the same instructions (so the history
     * renders as the previous request saw it), and the previous state's
     * tokens. The previous reply is message k - 1 before the new items.
     */
    if (c->prev != NULL && ctl_pool_model_view(app->pool, &v) == WK_OK &&
        json_is_string(json_object_get(c->prev, "fp")) &&
        strcmp(json_string_value(json_object_get(c->prev, "fp")), v.fingerprint) == 0 &&
        resp_same_text(json_object_get(c->prev, "instructions"), q->instructions,
                       q->instructions_len) &&
        json_array_size(history) > 0 && resp_prev_tokens(c, &prev_ids, &n_prev)) {
        size_t kr = n_sys + json_array_size(history) - 1;
        off = ctl_session_align_at(app->tok, prev_ids, n_prev, &sp[kr]);
        if (off > r->prompt_len) {
            free(prev_ids);
            prev_ids = NULL;
            n_prev = 0;
            off = 0;
        }
    }
    wk_err err = prev_ids != NULL
                     ? wk_tok_encode_continue(app->tok, r->prompt_text, r->prompt_len, off, &rest,
                                              &n_rest, &d)
                     : wk_tok_encode(app->tok, r->prompt_text, r->prompt_len, &rest, &n_rest, &d);
    if (err == WK_OK && (r->prompt = malloc((n_prev + n_rest + 1) * sizeof(int32_t))) == NULL)
        err = WK_ENOMEM;
    if (err == WK_OK && (r->msg_ends = malloc(n * sizeof(size_t))) == NULL)
        err = WK_ENOMEM;
    if (err != WK_OK) {
        free(prev_ids);
        free(rest);
        free(sp);
        resp_send_error(c->req, 400, err, "input", NULL, "%s", d.msg[0] ? d.msg : "out of memory");
        return false;
    }
    if (n_prev)
        memcpy(r->prompt, prev_ids, n_prev * sizeof(int32_t));
    if (n_rest)
        memcpy(r->prompt + n_prev, rest, n_rest * sizeof(int32_t));
    r->n_prompt = n_prev + n_rest;
    r->aligned_tokens = n_prev;
    c->aligned = prev_ids != NULL;
    c->n_prev = n_prev;
    for (size_t i = 0; i < n; i++)
        r->msg_ends[i] = sp[i].end;
    r->n_bounds = 0;
    ctl_openai_chat_bounds(app->tok, r, off, rest, n_rest, n_prev);
    free(prev_ids);
    free(rest);
    free(sp);
    if (r->n_prompt == 0 || r->n_prompt > app->max_prompt_tokens) {
        resp_send_error(c->req, 400, WK_ETOOBIG, "input", "context_length_exceeded",
                        "the conversation has %zu tokens, more than the limit of %u", r->n_prompt,
                        app->max_prompt_tokens);
        return false;
    }
    return true;
}

/* Sends one typed event with the next sequence_number; consumes ev. */
static void
resp_event(resp_call *c, const char *type, json_t *ev)
{
    if (ev == NULL)
        return;
    json_object_set_new(ev, "type", json_string(type));
    json_object_set_new(ev, "sequence_number", json_integer((json_int_t)c->seq++));
    char *s = c->broken ? NULL : wk_json_dump_compact(ev);
    json_decref(ev);
    if (s == NULL)
        return;
    if (ctl_http_sse_event(c->req, type, s) != WK_OK)
        c->broken = true;
    free(s);
}

static wk_err
resp_stream_sink(void *arg, const char *text, size_t len, const ctl_gen_token *toks, size_t n_toks)
{
    (void)toks;
    (void)n_toks;
    resp_call *c = arg;
    if (len == 0)
        return WK_OK;
    resp_event(c, "response.output_text.delta",
               json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", c->msg_id, "output_index", 0,
                         "content_index", 0, "delta", text, len, "logprobs"));
    return c->broken ? WK_EIO : WK_OK;
}

/* ctl_gen's flush: writes the events of one wake-up. */
static wk_err
resp_stream_flush(void *arg)
{
    resp_call *c = arg;
    if (ctl_http_flush(c->req) != WK_OK)
        c->broken = true;
    return c->broken ? WK_EIO : WK_OK;
}

/*
 * Completes the record after a generation: output, usage, the end state's
 * tokens, status; stores it when asked and counts.
 */
static void
resp_finish(resp_call *c, const ctl_gen_result *res)
{
    ctl_app *app = c->app;
    json_t *rec = c->rec;
    ctl_openai_req *r = &c->r;
    json_object_set_new(
        rec, "output", json_pack("{s:s, s:s%}", "id", c->msg_id, "text", res->text, res->text_len));
    bool length = res->finish_reason != NULL && strcmp(res->finish_reason, "length") == 0;
    json_object_set_new(rec, "status", json_string(length ? "incomplete" : "completed"));
    json_object_set_new(rec, "incomplete_reason",
                        length ? json_string("max_output_tokens") : json_null());
    size_t cached = r->n_prompt > res->computed ? r->n_prompt - res->computed : 0;
    json_object_set_new(rec, "usage",
                        json_pack("{s:I, s:I, s:I}", "input_tokens", (json_int_t)r->n_prompt,
                                  "cached_tokens", (json_int_t)cached, "output_tokens",
                                  (json_int_t)res->n_tokens));
    /* The end state: the prompt and the sampled tokens the state consumed. */
    size_t n_gen = res->fed > r->n_prompt ? res->fed - r->n_prompt : 0;
    if (n_gen > res->n_tokens)
        n_gen = res->n_tokens;
    json_t *ids = json_array();
    for (size_t i = 0; ids != NULL && i < r->n_prompt; i++)
        json_array_append_new(ids, json_integer(r->prompt[i]));
    for (size_t i = 0; ids != NULL && i < n_gen; i++)
        json_array_append_new(ids, json_integer(res->tokens[i].id));
    json_object_set_new(rec, "tokens", ids);
    ctl_metrics_add(app->metrics, "wkvm_generation_tokens_total", NULL, (double)res->n_tokens);
    if (c->prev != NULL) {
        ctl_metrics_add(
            app->metrics, "wkvm_responses_resumes_total",
            c->aligned && cached >= c->n_prev ? "result=\"exact\"" : "result=\"fallback\"", 1);
    }
    if (!c->q.store)
        return;
    wk_diag d = {{0}};
    if (resp_save(app, rec, &d) != WK_OK) {
        wk_log_warn("response not stored id=%s: %s", json_string_value(json_object_get(rec, "id")),
                    d.msg);
        json_object_set_new(rec, "store", json_false());
        return;
    }
    ctl_metrics_add(app->metrics, "wkvm_responses_stored_total", NULL, 1);
    if (c->prev != NULL) {
        /* A second continuation of one response is a fork: count it on the parent. */
        json_t *p = NULL;
        bool expired = false;
        const char *pid = json_string_value(json_object_get(c->prev, "id"));
        pthread_mutex_lock(&resp_children_mu);
        if (resp_load(app, c->r.owner, pid, &p, &expired) == WK_OK) {
            json_int_t kids = json_integer_value(json_object_get(p, "children"));
            if (kids >= 1)
                ctl_metrics_add(app->metrics, "wkvm_responses_forks_total", NULL, 1);
            json_object_set_new(p, "children", json_integer(kids + 1));
            resp_cleanup(resp_save(app, p, NULL), "children");
            json_decref(p);
        }
        pthread_mutex_unlock(&resp_children_mu);
    }
}

/* Adds the extension fields to a response object (return_token_ids). */
static void
resp_extend(resp_call *c, json_t *o)
{
    if (c->q.return_token_ids && o != NULL) {
        json_t *t = json_object_get(c->rec, "tokens");
        json_object_set_new(o, "state_token_ids", t != NULL ? json_deep_copy(t) : json_array());
        json_object_set_new(o, "prompt_token_count", json_integer((json_int_t)c->r.n_prompt));
    }
}

static void
resp_answer_whole(resp_call *c, bool free_slot)
{
    ctl_app *app = c->app;
    ctl_gen_result res;
    wk_diag d = {{0}};
    wk_err err = ctl_gen_run(app->sched, app->tok, c->r.prompt, c->r.n_prompt, &c->r.gen, NULL,
                             NULL, &res, &d);
    if (err != WK_OK) {
        resp_count(app, "error");
        if (err == WK_ETOOBIG)
            resp_send_error(c->req, 400, err, "max_output_tokens", "context_length_exceeded", "%s",
                            d.msg);
        else
            ctl_http_send_error(c->req, err, d.msg, NULL);
        return;
    }
    ctl_openai_reuse_done(app, &c->r, &res, free_slot);
    resp_finish(c, &res);
    json_t *o = resp_object(c->rec);
    resp_extend(c, o);
    resp_count(app, "ok");
    ctl_http_send_json(c->req, 200, o);
    ctl_gen_result_fini(&res);
}

static void
resp_answer_stream(resp_call *c, bool free_slot)
{
    ctl_app *app = c->app;
    ctl_gen_result res;
    wk_diag d = {{0}};
    ctl_job *job = NULL;
    /* Admission errors come before the first byte, as plain JSON errors. */
    wk_err err = ctl_gen_submit(app->sched, c->r.prompt, c->r.n_prompt, &c->r.gen, &job, &d);
    if (err != WK_OK) {
        resp_count(app, "error");
        if (err == WK_ETOOBIG)
            resp_send_error(c->req, 400, err, "max_output_tokens", "context_length_exceeded", "%s",
                            d.msg);
        else
            ctl_http_send_error(c->req, err, d.msg, NULL);
        return;
    }
    ctl_http_sse_begin(c->req);
    json_t *o = resp_object(c->rec);
    resp_event(c, "response.created", json_pack("{s:O}", "response", o));
    resp_event(c, "response.in_progress", json_pack("{s:o}", "response", o));
    json_t *empty = json_string("");
    resp_event(c, "response.output_item.added",
               json_pack("{s:i, s:o}", "output_index", 0, "item",
                         resp_output_item(c->msg_id, empty, "in_progress", false)));
    resp_event(c, "response.content_part.added",
               json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[], s:[]}}", "item_id", c->msg_id,
                         "output_index", 0, "content_index", 0, "part", "type", "output_text",
                         "text", "", "annotations", "logprobs"));
    json_decref(empty);
    if (c->broken) {
        ctl_job_free(job);
        err = WK_EIO;
    } else {
        ctl_http_cork(c->req, true); /* one write per wake-up */
        err = ctl_gen_run_job(job, app->tok, &c->r.gen, resp_stream_sink, resp_stream_flush, c,
                              &res, &d);
        ctl_http_cork(c->req, false);
    }
    if (err != WK_OK) {
        resp_count(app, c->broken ? "cancelled" : "error");
        if (!c->broken) {
            json_object_set_new(c->rec, "status", json_string("failed"));
            json_object_set_new(c->rec, "error",
                                json_pack("{s:s, s:s}", "code", "server_error", "message",
                                          d.msg[0] ? d.msg : wk_strerror(err)));
            resp_event(c, "response.failed", json_pack("{s:o}", "response", resp_object(c->rec)));
        } else {
            wk_log_info("client went away id=%s", json_string_value(json_object_get(c->rec, "id")));
        }
        return;
    }
    ctl_openai_reuse_done(app, &c->r, &res, free_slot);
    resp_finish(c, &res);
    const char *st = json_string_value(json_object_get(c->rec, "status"));
    json_t *text = json_object_get(json_object_get(c->rec, "output"), "text");
    resp_event(c, "response.output_text.done",
               json_pack("{s:s, s:i, s:i, s:O, s:[]}", "item_id", c->msg_id, "output_index", 0,
                         "content_index", 0, "text", text, "logprobs"));
    resp_event(c, "response.content_part.done",
               json_pack("{s:s, s:i, s:i, s:{s:s, s:O, s:[], s:[]}}", "item_id", c->msg_id,
                         "output_index", 0, "content_index", 0, "part", "type", "output_text",
                         "text", text, "annotations", "logprobs"));
    resp_event(c, "response.output_item.done",
               json_pack("{s:i, s:o}", "output_index", 0, "item",
                         resp_output_item(
                             c->msg_id, text,
                             strcmp(st, "incomplete") == 0 ? "incomplete" : "completed", true)));
    o = resp_object(c->rec);
    resp_extend(c, o);
    resp_event(c, strcmp(st, "incomplete") == 0 ? "response.incomplete" : "response.completed",
               json_pack("{s:o}", "response", o));
    resp_count(app, c->broken ? "cancelled" : "ok");
    ctl_gen_result_fini(&res);
}

/* Resolves previous_response_id into c->prev; sends the error and returns false. */
static bool
resp_resolve_prev(resp_call *c)
{
    const char *pid = c->q.previous_response_id;
    if (pid == NULL)
        return true;
    bool expired = false;
    wk_err err = resp_load(c->app, c->r.owner, pid, &c->prev, &expired);
    if (err == WK_ENOENT) {
        ctl_metrics_add(c->app->metrics, "wkvm_responses_misses_total",
                        expired ? "reason=\"expired\"" : "reason=\"not_found\"", 1);
        resp_send_error(c->req, 404, WK_ENOENT, "previous_response_id",
                        "previous_response_not_found",
                        "Previous response with id '%.80s' not "
                        "found%s.",
                        pid, expired ? " (it expired)" : "");
        return false;
    }
    if (err != WK_OK) {
        ctl_http_send_error(c->req, err, "cannot read the previous response", NULL);
        return false;
    }
    const char *pm = json_string_value(json_object_get(c->prev, "model"));
    if (pm == NULL || strcmp(pm, c->q.model) != 0) {
        resp_send_error(c->req, 400, WK_EINVAL, "previous_response_id", "invalid_value",
                        "previous response '%.80s' was made by model '%.100s', not '%.100s'", pid,
                        pm != NULL ? pm : "?", c->q.model);
        return false;
    }
    return true;
}

static void
resp_create(ctl_http_req *req, ctl_app *app)
{
    uint64_t now_ms = wk_mono_ms(), last = atomic_load(&resp_last_sweep_ms);
    if (app->responses_ttl_s > 0 && now_ms - last >= RESP_SWEEP_EVERY_MS &&
        atomic_compare_exchange_strong(&resp_last_sweep_ms, &last, now_ms))
        resp_sweep(app);
    json_t *body = ctl_openai_body(req);
    if (body == NULL)
        return;
    resp_call c = {.req = req, .app = app};
    c.r = (ctl_openai_req){.chat = true, .reuse = true, .cache = true};
    ctl_resp_limits lim = {.max_items = app->max_messages,
                           .max_item_bytes = app->max_message_bytes,
                           .max_tokens = app->max_tokens_limit};
    ctl_resp_err e;
    json_t *history = NULL, *input = NULL;
    if (ctl_resp_req_parse(body, &lim, &c.q, &e) != WK_OK) {
        resp_send_error(req, e.err == WK_ENOMEM ? 500 : 400, e.err, e.param, e.code, "%s", e.msg);
        goto out;
    }
    if (app->model_id == NULL || strcmp(c.q.model, app->model_id) != 0) {
        resp_send_error(req, 404, WK_ENOENT, "model", "model_not_found",
                        "The model '%.100s' does not exist", c.q.model);
        goto out;
    }
    ctl_openai_owner(req, c.r.owner);
    if (!resp_resolve_prev(&c))
        goto out;
    if (c.q.store) {
        wk_diag qd = {{0}};
        wk_err qerr = resp_quota(app, c.r.owner, &qd);
        if (qerr != WK_OK) {
            ctl_http_send_error(req, qerr, qd.msg, "store");
            goto out;
        }
    }
    history = json_array();
    input = json_array();
    if (history == NULL || input == NULL || !resp_build_prompt(&c, history, input))
        goto out;
    /* Generation parameters. */
    c.r.model = c.q.model;
    c.r.stream = c.q.stream;
    ctl_gen_params *g = &c.r.gen;
    g->max_tokens = c.q.max_output_tokens ? c.q.max_output_tokens : app->default_max_tokens;
    g->stop_on_eot = true;
    g->stops[g->n_stops++] = WK_CHAT_STOP_DEFAULT; /* the template's turn end */
    g->sample.temperature = (float)c.q.temperature;
    g->sample.top_p = (float)c.q.top_p;
    if (c.q.has_seed) {
        g->sample.seed = (uint64_t)c.q.seed;
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        g->sample.seed = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
    }
    g->deadline_ms = wk_mono_ms() + app->request_timeout_ms;
    /* The record, before the output: what the stream's first events show. */
    char id[CTL_RESP_ID_MAX];
    resp_new_id("resp_", 24, id, sizeof(id));
    resp_new_id("msg_", 24, c.msg_id, sizeof(c.msg_id));
    ctl_worker_view v;
    if (ctl_pool_model_view(app->pool, &v) != WK_OK)
        v.fingerprint[0] = '\0';
    int64_t now = resp_now_s();
    c.rec = json_pack("{s:i, s:s, s:s, s:s, s:s, s:I, s:s, s:O, s:O, s:b}", "v",
                      RESP_RECORD_VERSION, "id", id, "owner", c.r.owner, "model", c.q.model, "fp",
                      v.fingerprint, "created_at", (json_int_t)now, "status", "in_progress",
                      "history", history, "input", input, "store", c.q.store);
    if (c.rec == NULL) {
        resp_send_error(req, 500, WK_ENOMEM, NULL, NULL, "out of memory");
        goto out;
    }
    json_object_set_new(c.rec, "expires_at",
                        json_integer(app->responses_ttl_s > 0
                                         ? (json_int_t)(now + (int64_t)app->responses_ttl_s)
                                         : 0));
    json_object_set_new(c.rec, "instructions",
                        c.q.instructions != NULL
                            ? json_stringn(c.q.instructions, c.q.instructions_len)
                            : json_null());
    json_object_set_new(c.rec, "previous_response_id",
                        c.q.previous_response_id != NULL ? json_string(c.q.previous_response_id)
                                                         : json_null());
    json_object_set_new(c.rec, "metadata",
                        c.q.metadata != NULL ? json_deep_copy(c.q.metadata) : json_object());
    json_object_set_new(c.rec, "user", c.q.user != NULL ? json_string(c.q.user) : json_null());
    if (c.q.tools != NULL)
        json_object_set_new(c.rec, "tools", json_deep_copy(c.q.tools));
    json_object_set_new(c.rec, "temperature", json_real(c.q.temperature));
    json_object_set_new(c.rec, "top_p", json_real(c.q.top_p));
    json_object_set_new(c.rec, "max_output_tokens",
                        c.q.max_output_tokens ? json_integer(c.q.max_output_tokens) : json_null());
    ctl_metrics_add(app->metrics, "wkvm_prompt_tokens_total", NULL, (double)c.r.n_prompt);
    /* Generate, with the checkpoint plan (the end state is the stored response's state). */
    ctl_ckpt_plan *plan = calloc(1, sizeof(*plan));
    bool free_slot = false;
    if (plan != NULL) {
        ctl_openai_reuse_begin(app, &c.r, plan, &free_slot);
        plan->durable = c.q.store;
    }
    if (c.q.stream)
        resp_answer_stream(&c, free_slot);
    else
        resp_answer_whole(&c, free_slot);
    ctl_ckpt_plan_end(plan);
    free(plan);
    c.r.plan = NULL;
out:
    json_decref(history);
    json_decref(input);
    json_decref(c.rec);
    json_decref(c.prev);
    ctl_openai_req_fini(&c.r);
    ctl_resp_req_fini(&c.q);
    json_decref(body);
}

/* ------------------------------------------------------------ read ---- */

/*
 * The caller's stored record id into *rec (caller json_decref()s it), or
 * the answer sent (404 for an unknown, expired or other owner's id, else
 * the store's error) and NULL.
 */
static json_t *
resp_load_or_reply(ctl_http_req *req, ctl_app *app, const char *owner, const char *id)
{
    json_t *rec = NULL;
    bool expired = false;
    wk_err err = resp_load(app, owner, id, &rec, &expired);
    if (err == WK_ENOENT)
        resp_send_error(req, 404, WK_ENOENT, NULL, "not_found",
                        "No response with id '%.80s' found.", id);
    else if (err != WK_OK)
        ctl_http_send_error(req, err, "cannot read the response", NULL);
    return err == WK_OK ? rec : NULL;
}

static void
resp_get(ctl_http_req *req, ctl_app *app, const char *id)
{
    char owner[CTL_STORE_OWNER_MAX + 1];
    ctl_openai_owner(req, owner);
    json_t *rec = resp_load_or_reply(req, app, owner, id);
    if (rec == NULL)
        return;
    ctl_http_send_json(req, 200, resp_object(rec));
    json_decref(rec);
}

static void
resp_delete(ctl_http_req *req, ctl_app *app, const char *id)
{
    char owner[CTL_STORE_OWNER_MAX + 1];
    ctl_openai_owner(req, owner);
    json_t *rec = resp_load_or_reply(req, app, owner, id);
    if (rec == NULL)
        return;
    char key[RESP_KEY_MAX];
    resp_key(owner, id, key);
    resp_drop(app, key, rec);
    json_decref(rec);
    ctl_metrics_add(app->metrics, "wkvm_responses_deleted_total", NULL, 1);
    ctl_http_send_json(
        req, 200,
        json_pack("{s:s, s:s, s:b}", "id", id, "object", "response.deleted", "deleted", 1));
}

/* GET /v1/responses/{id}/input_items?order=&limit=&after= */
static void
resp_input_items(ctl_http_req *req, ctl_app *app, const char *id)
{
    char owner[CTL_STORE_OWNER_MAX + 1], buf[128];
    ctl_openai_owner(req, owner);
    bool asc = false;
    long limit = 20;
    if (ctl_http_req_query_get(req, "order", buf, sizeof(buf))) {
        if (strcmp(buf, "asc") != 0 && strcmp(buf, "desc") != 0) {
            resp_send_error(req, 400, WK_EINVAL, "order", "invalid_value",
                            "'order' must be \"asc\" or \"desc\"");
            return;
        }
        asc = strcmp(buf, "asc") == 0;
    }
    if (ctl_http_req_query_get(req, "limit", buf, sizeof(buf))) {
        char *end = NULL;
        limit = strtol(buf, &end, 10);
        if (end == buf || *end != '\0' || limit < 1 || limit > RESP_ITEMS_LIMIT_MAX) {
            resp_send_error(req, 400, WK_EINVAL, "limit", "invalid_value",
                            "'limit' must be an integer in [1, %d]", RESP_ITEMS_LIMIT_MAX);
            return;
        }
    }
    char after[128] = "";
    if (!ctl_http_req_query_get(req, "after", after, sizeof(after)))
        after[0] = '\0';
    json_t *rec = resp_load_or_reply(req, app, owner, id);
    if (rec == NULL)
        return;
    /* Everything the model was given (instructions aside): the history, then the input. */
    json_t *all = json_array();
    json_t *lists[2] = {json_object_get(rec, "history"), json_object_get(rec, "input")};
    for (size_t l = 0; l < 2; l++) {
        size_t i;
        json_t *m;
        json_array_foreach(lists[l], i, m) json_array_append_new(all, resp_item_json(m));
    }
    size_t n = json_array_size(all), start = 0;
    if (after[0]) {
        for (size_t i = 0; i < n; i++) {
            size_t j = asc ? i : n - 1 - i;
            const char *iid = json_string_value(json_object_get(json_array_get(all, j), "id"));
            if (iid != NULL && strcmp(iid, after) == 0) {
                start = i + 1;
                break;
            }
        }
    }
    json_t *data = json_array();
    size_t i = start;
    for (; i < n && json_array_size(data) < (size_t)limit; i++)
        json_array_append(data, json_array_get(all, asc ? i : n - 1 - i));
    size_t nd = json_array_size(data);
    json_t *first = nd ? json_object_get(json_array_get(data, 0), "id") : NULL;
    json_t *lastid = nd ? json_object_get(json_array_get(data, nd - 1), "id") : NULL;
    json_t *o = json_pack("{s:s, s:o, s:O, s:O, s:b}", "object", "list", "data", data, "first_id",
                          first ? first : json_null(), "last_id", lastid ? lastid : json_null(),
                          "has_more", i < n);
    ctl_http_send_json(req, 200, o);
    json_decref(all);
    json_decref(rec);
}

static void
resp_route(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    const char *method = ctl_http_req_method(req);
    const char *path = ctl_http_req_path(req);
    if (strcmp(path, "/v1/responses") == 0) {
        if (strcmp(method, "POST") != 0) {
            ctl_http_send_error_status(req, 405, WK_EINVAL, "use POST /v1/responses", NULL);
            return;
        }
        if (!ctl_app_user_enter(req, app))
            return;
        resp_create(req, app);
        ctl_app_user_leave(req, app);
        return;
    }
    const char *rest = path + strlen("/v1/responses/");
    char id[CTL_RESP_ID_MAX + 1];
    const char *slash = strchr(rest, '/');
    size_t idl = slash != NULL ? (size_t)(slash - rest) : strlen(rest);
    if (idl == 0 || idl > CTL_RESP_ID_MAX) {
        resp_send_error(req, 404, WK_ENOENT, NULL, "not_found", "No response with that id.");
        return;
    }
    memcpy(id, rest, idl);
    id[idl] = '\0';
    if (slash == NULL && strcmp(method, "GET") == 0)
        resp_get(req, app, id);
    else if (slash == NULL && strcmp(method, "DELETE") == 0)
        resp_delete(req, app, id);
    else if (slash != NULL && strcmp(slash, "/input_items") == 0 && strcmp(method, "GET") == 0)
        resp_input_items(req, app, id);
    else if (slash != NULL && strcmp(slash, "/cancel") == 0 && strcmp(method, "POST") == 0)
        resp_send_error(req, 400, WK_EINVAL, NULL, "invalid_request",
                        "only background responses can be cancelled (wkvm has none)");
    else
        resp_send_error(req, 404, WK_ENOENT, NULL, "not_found", "no such route: %.16s %.200s",
                        method, path);
}

/* ------------------------------------------------------------ admin ---- */

/* Calls fn on every stored record (owner NULL: all), page by page. */
static void
resp_each(ctl_app *app, void (*fn)(void *arg, const char *key, json_t *rec), void *arg)
{
    ctl_store_kv_page page = {0};
    char after[CTL_STORE_SESSION_KEY_MAX + 1] = "";
    for (;;) {
        if (ctl_store_session_list(app->store, RESP_KEY_PREFIX, after, 0, true, &page, NULL) !=
            WK_OK)
            break;
        for (size_t i = 0; i < page.n; i++) {
            json_t *rec = resp_decode(page.items[i].val, page.items[i].len);
            if (rec != NULL)
                fn(arg, page.items[i].key, rec);
            json_decref(rec);
        }
        snprintf(after, sizeof(after), "%s", page.next);
        ctl_store_kv_page_fini(&page);
        if (after[0] == '\0')
            break;
    }
}

typedef struct resp_list_ctx {
    ctl_app *app;      /* app */
    const char *owner; /* filter, NULL all */
    json_t *data;      /* rows */
    int64_t now;       /* the listing's time */
} resp_list_ctx;

static void
resp_list_one(void *arg, const char *key, json_t *rec)
{
    resp_list_ctx *x = arg;
    const char *owner = json_string_value(json_object_get(rec, "owner"));
    if (owner == NULL)
        return;
    if (resp_expired(x->app, rec, x->now)) { /* (one stored before a shorter TTL) */
        resp_drop(x->app, key, rec);
        ctl_metrics_add(x->app->metrics, "wkvm_responses_evictions_total", NULL, 1);
        return;
    }
    if (x->owner != NULL) {
        size_t ol = strlen(x->owner);
        /* the API user, and the Open WebUI users within it ("user/owui:...") */
        if (strncmp(owner, x->owner, ol) != 0 || (owner[ol] != '\0' && owner[ol] != '/'))
            return;
    }
    json_t *u = json_object_get(rec, "usage");
    json_array_append_new(
        x->data,
        json_pack("{s:O, s:s, s:O, s:O, s:O, s:I, s:I, s:I, s:O, s:O}", "id",
                  json_object_get(rec, "id"), "owner", owner, "model",
                  json_object_get(rec, "model"), "created_at", json_object_get(rec, "created_at"),
                  "status", json_object_get(rec, "status"), "tokens",
                  (json_int_t)json_array_size(json_object_get(rec, "tokens")), "input_tokens",
                  json_integer_value(json_object_get(u, "input_tokens")), "output_tokens",
                  json_integer_value(json_object_get(u, "output_tokens")), "previous_response_id",
                  json_object_get(rec, "previous_response_id"), "expires_at",
                  json_object_get(rec, "expires_at")));
}

typedef struct resp_del_ctx {
    ctl_app *app;   /* app */
    const char *id; /* the id to delete */
    size_t n;       /* deleted */
} resp_del_ctx;

static void
resp_del_one(void *arg, const char *key, json_t *rec)
{
    resp_del_ctx *x = arg;
    const char *id = json_string_value(json_object_get(rec, "id"));
    if (id == NULL || strcmp(id, x->id) != 0)
        return;
    resp_drop(x->app, key, rec);
    x->n++;
}

/* GET /admin/responses[?owner=USER], DELETE /admin/responses/{id}. */
static void
resp_admin(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    const char *method = ctl_http_req_method(req);
    const char *path = ctl_http_req_path(req);
    if (strcmp(path, "/admin/responses") == 0 && strcmp(method, "GET") == 0) {
        resp_sweep(app);
        char owner[CTL_STORE_OWNER_MAX + 1];
        bool has = ctl_http_req_query_get(req, "owner", owner, sizeof(owner)) && owner[0];
        resp_list_ctx x = {
            .app = app, .owner = has ? owner : NULL, .data = json_array(), .now = resp_now_s()};
        resp_each(app, resp_list_one, &x);
        ctl_http_send_json(req, 200, json_pack("{s:s, s:o}", "object", "list", "data", x.data));
        return;
    }
    const char *pfx = "/admin/responses/";
    if (strncmp(path, pfx, strlen(pfx)) == 0 && strcmp(method, "DELETE") == 0) {
        const char *id = path + strlen(pfx);
        resp_del_ctx x = {.app = app, .id = id};
        if (ctl_resp_id_valid(id))
            resp_each(app, resp_del_one, &x);
        if (x.n == 0) {
            resp_send_error(req, 404, WK_ENOENT, NULL, "not_found",
                            "No response with id '%.80s' found.", id);
            return;
        }
        ctl_metrics_add(app->metrics, "wkvm_responses_deleted_total", NULL, (double)x.n);
        ctl_http_send_json(
            req, 200,
            json_pack("{s:s, s:s, s:b}", "id", id, "object", "response.deleted", "deleted", 1));
        return;
    }
    resp_send_error(req, 404, WK_ENOENT, NULL, "not_found", "no such route: %.16s %.200s", method,
                    path);
}

size_t
ctl_responses_routes(ctl_app *app, ctl_http_route *out, size_t cap)
{
    const ctl_http_route routes[] = {
        {NULL, "/v1/responses", false, resp_route, app, "/v1/responses", CTL_HTTP_ACCESS_USER},
        {NULL, "/v1/responses/", true, resp_route, app, "/v1/responses/{id}", CTL_HTTP_ACCESS_USER},
        {NULL, "/admin/responses", false, resp_admin, app, "/admin/responses",
         CTL_HTTP_ACCESS_ADMIN},
        {NULL, "/admin/responses/", true, resp_admin, app, "/admin/responses/{id}",
         CTL_HTTP_ACCESS_ADMIN},
    };
    size_t n = sizeof(routes) / sizeof(routes[0]);
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = routes[i];
    return n;
}
