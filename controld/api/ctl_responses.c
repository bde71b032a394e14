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
#include "ctl_stream.h"
#include "ctl_openai.h"
#include "ctl_resp_plan.h"
#include "ctl_resp_req.h"
#include "ctl_responses.h"
#include "wk_json.h"
#include "wk_log.h"
#include "wk_sha256.h"
#include "wk_time.h"
#include "wk_toolcall.h"

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

/*
 * The wall clock in ms (created_at is its second): expiry is exact to the
 * ms (a TTL of 2 s lives 2 s, not 1 to 2).
 */
static int64_t
resp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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
 * When rec was stored, in ms of the wall clock ("created_ms"; a record
 * without one: the start of its created_at second).
 */
static int64_t
resp_created_ms(const json_t *rec)
{
    const json_t *ms = json_object_get(rec, "created_ms");
    if (json_is_integer(ms))
        return (int64_t)json_integer_value(ms);
    return (int64_t)json_integer_value(json_object_get(rec, "created_at")) * 1000;
}

/*
 * True when rec outlived --responses-ttl as it is now (now_ms: resp_now_ms;
 * a changed TTL applies to records stored before; 0 keeps them).
 */
static bool
resp_expired(const ctl_app *app, const json_t *rec, int64_t now_ms)
{
    return app->responses_ttl_s > 0 &&
           now_ms >= resp_created_ms(rec) + (int64_t)app->responses_ttl_s * 1000;
}

/* rec's expires_at under the TTL as it is now: the second it expires in (rounded up); 0 none. */
static json_int_t
resp_expires_at(const ctl_app *app, const json_t *rec)
{
    if (app->responses_ttl_s == 0)
        return 0;
    return (json_int_t)((resp_created_ms(rec) + (int64_t)app->responses_ttl_s * 1000 + 999) / 1000);
}

static bool resp_bg_orphan(ctl_app *app, json_t *rec);
static bool resp_running_status(const json_t *rec);

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
    if (resp_expired(app, r, resp_now_ms())) {
        resp_drop(app, key, r);
        json_decref(r);
        ctl_metrics_add(app->metrics, "wkvm_responses_evictions_total", NULL, 1);
        *expired = true;
        return WK_ENOENT;
    }
    (void)resp_bg_orphan(app, r);
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
        int64_t now = resp_now_ms();
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
    int64_t now_ms = resp_now_ms(), now = now_ms / 1000;
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
            if (rec != NULL && resp_expired(app, rec, now_ms)) {
                resp_drop(app, key, rec);
                removed++;
                ctl_metrics_add(app->metrics, "wkvm_responses_evictions_total", NULL, 1);
            } else if (rec != NULL) {
                /* the TTL grew (or is off) since: a new expiry, or none */
                json_object_set_new(rec, "expires_at", json_integer(resp_expires_at(app, rec)));
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

/* A function_call item of the API from a record entry {id, call_id, name, arguments}. */
static json_t *
resp_call_item(const json_t *m, const char *status)
{
    return json_pack("{s:O, s:s, s:O, s:O, s:O, s:s}", "id", json_object_get(m, "id"), "type",
                     "function_call", "call_id", json_object_get(m, "call_id"), "name",
                     json_object_get(m, "name"), "arguments", json_object_get(m, "arguments"),
                     "status", status);
}

/* True when an output record shows its message item: text, or no calls instead. */
static bool
resp_out_has_message(const json_t *out)
{
    return json_string_length(json_object_get(out, "text")) > 0 ||
           json_array_size(json_object_get(out, "calls")) == 0;
}

/* A reasoning item of the API: its text as one reasoning_text part (no summary). */
static json_t *
resp_reasoning_item(const json_t *id, const json_t *text, const char *status, bool with_part)
{
    json_t *content = json_array();
    if (with_part)
        json_array_append_new(content,
                              json_pack("{s:s, s:O}", "type", "reasoning_text", "text", text));
    return json_pack("{s:O, s:s, s:[], s:o, s:s}", "id", id, "type", "reasoning", "summary",
                     "content", content, "status", status);
}

/*
 * An item of the API from a record entry: a message {id, role, text} or a
 * reasoning item {id, type: "reasoning", text}.
 */
static json_t *
resp_item_json(const json_t *m)
{
    const char *type = json_string_value(json_object_get(m, "type"));
    if (type != NULL && strcmp(type, "reasoning") == 0)
        return resp_reasoning_item(json_object_get(m, "id"), json_object_get(m, "text"),
                                   "completed", true);
    if (type != NULL && strcmp(type, "function_call") == 0)
        return resp_call_item(m, "completed");
    if (type != NULL && strcmp(type, "function_call_output") == 0)
        return json_pack("{s:O, s:s, s:O, s:O, s:s}", "id", json_object_get(m, "id"), "type",
                         "function_call_output", "call_id", json_object_get(m, "call_id"), "output",
                         json_object_get(m, "output"), "status", "completed");
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
    const char *ist =
        strcmp(status != NULL ? status : "", "completed") == 0 ? "completed" : "incomplete";
    /* (a reasoning item the reply left is complete even when the message was cut) */
    if (json_is_object(out) && json_is_string(json_object_get(out, "reasoning")))
        json_array_append_new(
            output,
            resp_reasoning_item(
                json_object_get(out, "reasoning_id"), json_object_get(out, "reasoning"),
                json_is_true(json_object_get(out, "reasoning_closed")) ? "completed" : ist, true));
    if (json_is_object(out) && resp_out_has_message(out))
        json_array_append_new(output,
                              resp_output_item(json_string_value(json_object_get(out, "id")),
                                               json_object_get(out, "text"), ist, true));
    size_t ci;
    json_t *call;
    json_array_foreach(json_object_get(out, "calls"), ci, call)
        json_array_append_new(output, resp_call_item(call, "completed"));
    json_object_set_new(o, "output", output);
    json_object_set_new(o, "parallel_tool_calls",
                        json_boolean(!json_is_true(json_object_get(rec, "serial_tool_calls"))));
    json_object_set_new(o, "previous_response_id", resp_or_null(rec, "previous_response_id"));
    json_object_set_new(o, "reasoning",
                        json_pack("{s:o, s:o}", "effort", resp_or_null(rec, "reasoning_effort"),
                                  "summary", resp_or_null(rec, "reasoning_summary")));
    json_object_set_new(o, "store", json_boolean(json_is_true(json_object_get(rec, "store"))));
    json_object_set_new(o, "temperature", resp_or_null(rec, "temperature"));
    json_object_set_new(o, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
    json_t *choice = json_object_get(rec, "tool_choice");
    json_object_set_new(o, "tool_choice",
                        choice != NULL
                            ? json_deep_copy(choice)
                            : json_string(json_is_true(json_object_get(rec, "tool_choice_none"))
                                              ? "none"
                                              : "auto"));
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
                                      "reasoning_tokens",
                                      json_integer_value(json_object_get(out, "reasoning_tokens")),
                                      "total_tokens", in + outn));
    } else {
        json_object_set_new(o, "usage", json_null());
    }
    json_object_set_new(o, "user", resp_or_null(rec, "user"));
    json_t *md = json_object_get(rec, "metadata");
    json_object_set_new(o, "metadata", json_is_object(md) ? json_deep_copy(md) : json_object());
    json_object_set_new(o, "background",
                        json_boolean(json_is_true(json_object_get(rec, "background"))));
    json_object_set_new(o, "service_tier", json_string("default"));
    return o;
}

/* ------------------------------------------------------------ reasoning ---- */

/*
 * The reasoning split of a response's reply, on a template with think
 * markers: the reply is reasoning while it is inside the markers (from its
 * start when the prompt left it there, or from an open marker at its very
 * start), the markers dropped; everything after the close marker is the
 * message's text, later markers included. So a reply has at most one
 * reasoning item and it comes first, the same for any cut of the text into
 * pieces: bytes that may begin the awaited marker are held.
 */
typedef enum { RESP_SPLIT_START, RESP_SPLIT_THINK, RESP_SPLIT_TEXT } resp_split_mode;

typedef struct resp_split {
    resp_split_mode mode; /* where the reply is */
    bool thought;         /* it was inside the markers at some point: a reasoning item */
    char held[32];        /* bytes that may begin the awaited marker */
    size_t n_held;        /* bytes in held */
} resp_split;

/* Receives the split's pieces, in order (reasoning: inside the markers). */
typedef void (*resp_split_emit)(void *arg, bool reasoning, const char *s, size_t n);

static void
resp_split_init(resp_split *sp, bool think, bool open_at_start)
{
    memset(sp, 0, sizeof(*sp));
    sp->mode = !think ? RESP_SPLIT_TEXT : open_at_start ? RESP_SPLIT_THINK : RESP_SPLIT_START;
    sp->thought = sp->mode == RESP_SPLIT_THINK;
}

/* Feeds n bytes of reply (final: no more follow, held bytes are settled). */
static void
resp_split_feed(resp_split *sp, const char *s, size_t n, bool final, resp_split_emit emit,
                void *arg)
{
    const char *open = WK_CHAT_TPL_THINK_OPEN, *close = WK_CHAT_TPL_THINK_CLOSE;
    size_t ol = strlen(open), cl = strlen(close);
    char *buf = NULL;
    const char *p = s;
    size_t len = n;
    if (sp->n_held > 0) {
        buf = malloc(sp->n_held + n + 1);
        if (buf == NULL) { /* (no memory: settle the held bytes as they are) */
            emit(arg, sp->mode == RESP_SPLIT_THINK, sp->held, sp->n_held);
        } else {
            memcpy(buf, sp->held, sp->n_held);
            if (n > 0)
                memcpy(buf + sp->n_held, s, n);
            p = buf;
            len = sp->n_held + n;
        }
        sp->n_held = 0;
    }
    while (len > 0) {
        if (sp->mode == RESP_SPLIT_START) {
            size_t k = len < ol ? len : ol;
            if (memcmp(p, open, k) != 0) {
                sp->mode = RESP_SPLIT_TEXT;
            } else if (k == ol) {
                sp->mode = RESP_SPLIT_THINK;
                sp->thought = true;
                p += ol;
                len -= ol;
            } else if (!final) { /* a prefix of the marker: wait for more */
                memcpy(sp->held, p, len);
                sp->n_held = len;
                len = 0;
            } else {
                sp->mode = RESP_SPLIT_TEXT;
            }
            continue;
        }
        if (sp->mode == RESP_SPLIT_TEXT) {
            emit(arg, false, p, len);
            break;
        }
        const char *hit = memmem(p, len, close, cl);
        if (hit != NULL) {
            if (hit > p)
                emit(arg, true, p, (size_t)(hit - p));
            sp->mode = RESP_SPLIT_TEXT;
            len -= (size_t)(hit - p) + cl;
            p = hit + cl;
            continue;
        }
        size_t keep = 0;
        for (size_t k = cl - 1; !final && k > 0 && keep == 0; k--)
            if (k <= len && memcmp(p + len - k, close, k) == 0)
                keep = k;
        if (len > keep)
            emit(arg, true, p, len - keep);
        memcpy(sp->held, p + len - keep, keep);
        sp->n_held = keep;
        break;
    }
    free(buf);
}

/* A growing byte string. */
typedef struct resp_buf {
    char *p;    /* bytes, NUL-terminated when non-NULL */
    size_t n;   /* bytes used */
    size_t cap; /* bytes allocated */
    bool oom;   /* an append failed */
} resp_buf;

static void
resp_buf_put(resp_buf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (q == NULL) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    if (n > 0)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* A whole reply split into two buffers. */
typedef struct resp_split_out {
    resp_buf reason;  /* inside the markers */
    resp_buf content; /* the message's text */
} resp_split_out;

static void
resp_split_collect(void *arg, bool reasoning, const char *s, size_t n)
{
    resp_split_out *o = arg;
    resp_buf_put(reasoning ? &o->reason : &o->content, s, n);
}

/* Counts nothing: resp_reasoning_tokens() only watches the mode. */
static void
resp_split_ignore(void *arg, bool reasoning, const char *s, size_t n)
{
    (void)arg;
    (void)reasoning;
    (void)s;
    (void)n;
}

/*
 * The reasoning tokens of a reply: the sampled tokens up to the one that
 * completes the close marker (all of them when the reply never closes), fed
 * piece by piece through a splitter started as the reply's was.
 */
static size_t
resp_reasoning_tokens(const wk_tok *tok, const ctl_gen_token *toks, size_t n, bool think,
                      bool open_at_start)
{
    resp_split sp;
    resp_split_init(&sp, think, open_at_start);
    for (size_t i = 0; i < n; i++) {
        if (sp.mode == RESP_SPLIT_TEXT)
            return sp.thought ? i : 0;
        size_t pl = 0;
        const uint8_t *piece = wk_tok_piece(tok, toks[i].id, &pl);
        if (piece != NULL)
            resp_split_feed(&sp, (const char *)piece, pl, false, resp_split_ignore, NULL);
    }
    return sp.thought ? n : 0;
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
    char rs_id[CTL_RESP_ID_MAX];  /* the reasoning item's id (when the reply reasons) */
    uint64_t seq;                 /* next SSE sequence_number */
    bool broken;                  /* the client went away (stream) */
    /* Stream: the items as they open (the reasoning item first, then the message). */
    resp_split split;       /* the reasoning split of the text streamed so far */
    resp_buf reason;        /* reasoning streamed so far */
    bool rs_open, rs_done;  /* the reasoning item was added / done */
    bool msg_open;          /* the message item was added */
    wk_toolcall_parser *tc; /* the tool-call parse of the content streamed so far, or NULL */
    /* Background (resp_bg_*): */
    json_t *body;                       /* the request body q borrows from (owned) */
    json_t *history, *input;            /* the record's lists (owned) */
    struct resp_bg *bg;                 /* its registry entry, NULL when not background */
    char user[CTL_STORE_OWNER_MAX + 1]; /* the API user holding the concurrency unit */
} resp_call;

static void resp_send_error(ctl_http_req *req, int status, wk_err err, const char *param,
                            const char *code, const char *fmt, ...) WK_PRINTF(6, 7);
static void resp_stream_text(resp_call *c, const char *s, size_t n, bool final);

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
 * The history a follow-up of c->prev sees (the API's: the previous history,
 * its input, its output: the reasoning item, then the message) into
 * history, and the request's items into input.
 */
static void
resp_history(resp_call *c, json_t *history, json_t *input)
{
    if (c->prev != NULL) {
        json_t *h = json_object_get(c->prev, "history"), *in = json_object_get(c->prev, "input");
        json_t *out = json_object_get(c->prev, "output");
        size_t i;
        json_t *m;
        json_array_foreach(h, i, m) json_array_append(history, m);
        json_array_foreach(in, i, m) json_array_append(history, m);
        if (json_is_object(out) && json_is_string(json_object_get(out, "reasoning")))
            json_array_append_new(
                history, json_pack("{s:O, s:s, s:O}", "id", json_object_get(out, "reasoning_id"),
                                   "type", "reasoning", "text", json_object_get(out, "reasoning")));
        if (json_is_object(out) && resp_out_has_message(out))
            json_array_append_new(
                history, json_pack("{s:O, s:s, s:O}", "id", json_object_get(out, "id"), "role",
                                   "assistant", "text", json_object_get(out, "text")));
        json_t *call;
        json_array_foreach(json_object_get(out, "calls"), i, call) json_array_append_new(
            history, json_pack("{s:O, s:s, s:O, s:O, s:O}", "id", json_object_get(call, "id"),
                               "type", "function_call", "call_id", json_object_get(call, "call_id"),
                               "name", json_object_get(call, "name"), "arguments",
                               json_object_get(call, "arguments")));
    }
    for (size_t i = 0; i < c->q.n_items; i++) {
        const ctl_resp_msg *it = &c->q.items[i];
        char id[CTL_RESP_ID_MAX];
        switch (it->kind) {
        case CTL_RESP_REASONING:
            resp_new_id("rs_", 24, id, sizeof(id));
            json_array_append_new(input, json_pack("{s:s, s:s, s:s%}", "id", id, "type",
                                                   "reasoning", "text", it->text, it->len));
            break;
        case CTL_RESP_FUNCTION_CALL:
            resp_new_id("fc_", 24, id, sizeof(id));
            json_array_append_new(input, json_pack("{s:s, s:s, s:s, s:s, s:s%}", "id", id, "type",
                                                   "function_call", "call_id", it->call_id, "name",
                                                   it->name, "arguments", it->text, it->len));
            break;
        case CTL_RESP_FUNCTION_CALL_OUTPUT:
            resp_new_id("fco_", 24, id, sizeof(id));
            json_array_append_new(input, json_pack("{s:s, s:s, s:s, s:s%}", "id", id, "type",
                                                   "function_call_output", "call_id", it->call_id,
                                                   "output", it->text, it->len));
            break;
        default:
            resp_msg_append(input, it->role, it->text, it->len);
        }
    }
}

static bool resp_bg_log(struct resp_bg *b, const char *type, char *data);
static bool resp_bg_cancelled(const resp_call *c);

/*
 * Sends one typed event with the next sequence_number; consumes ev. A
 * streamed background response appends it to its event log instead (the
 * readers send it).
 */
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
    if (c->bg != NULL) {
        if (!resp_bg_log(c->bg, type, s))
            c->broken = true; /* (out of memory: the log ends here) */
        return;
    }
    if (ctl_http_sse_event(c->req, type, s) != WK_OK)
        c->broken = true;
    free(s);
}

/* The message item's output_index: after the reasoning item when there is one. */
static int
resp_msg_index(const resp_call *c)
{
    return c->rs_open ? 1 : 0;
}

/* Stream: adds the reasoning item (output_index 0) and its one text part. */
static void
resp_stream_rs_open(resp_call *c)
{
    if (c->rs_open)
        return;
    c->rs_open = true;
    json_t *id = json_string(c->rs_id), *empty = json_string("");
    resp_event(c, "response.output_item.added",
               json_pack("{s:i, s:o}", "output_index", 0, "item",
                         resp_reasoning_item(id, empty, "in_progress", false)));
    resp_event(c, "response.content_part.added",
               json_pack("{s:s, s:i, s:i, s:{s:s, s:s}}", "item_id", c->rs_id, "output_index", 0,
                         "content_index", 0, "part", "type", "reasoning_text", "text", ""));
    json_decref(id);
    json_decref(empty);
}

/* Stream: the reasoning item's done events (its whole text), the item's status. */
static void
resp_stream_rs_close(resp_call *c, const char *status)
{
    if (!c->rs_open || c->rs_done)
        return;
    c->rs_done = true;
    json_t *id = json_string(c->rs_id);
    json_t *text = c->reason.p != NULL ? json_stringn(c->reason.p, c->reason.n) : json_string("");
    resp_event(c, "response.reasoning_text.done",
               json_pack("{s:s, s:i, s:i, s:O}", "item_id", c->rs_id, "output_index", 0,
                         "content_index", 0, "text", text));
    resp_event(c, "response.content_part.done",
               json_pack("{s:s, s:i, s:i, s:{s:s, s:O}}", "item_id", c->rs_id, "output_index", 0,
                         "content_index", 0, "part", "type", "reasoning_text", "text", text));
    resp_event(c, "response.output_item.done",
               json_pack("{s:i, s:o}", "output_index", 0, "item",
                         resp_reasoning_item(id, text, status, true)));
    json_decref(id);
    json_decref(text);
}

/* Stream: adds the message item (after closing the reasoning item) and its text part. */
static void
resp_stream_msg_open(resp_call *c)
{
    if (c->msg_open)
        return;
    resp_stream_rs_close(c, "completed");
    c->msg_open = true;
    json_t *empty = json_string("");
    resp_event(c, "response.output_item.added",
               json_pack("{s:i, s:o}", "output_index", resp_msg_index(c), "item",
                         resp_output_item(c->msg_id, empty, "in_progress", false)));
    resp_event(c, "response.content_part.added",
               json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[], s:[]}}", "item_id", c->msg_id,
                         "output_index", resp_msg_index(c), "content_index", 0, "part", "type",
                         "output_text", "text", "", "annotations", "logprobs"));
    json_decref(empty);
}

/* Stream: a text delta (n > 0) into the message item, opened on the first. */
static void
resp_stream_delta(resp_call *c, const char *s, size_t n)
{
    if (n == 0)
        return;
    resp_stream_msg_open(c);
    resp_event(c, "response.output_text.delta",
               json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", c->msg_id, "output_index",
                         resp_msg_index(c), "content_index", 0, "delta", s, n, "logprobs"));
}

/*
 * Stream: message text after the reasoning split; with tools, through the
 * tool-call parse first (its content streams, its calls are the record's at
 * the end). final settles what the parse holds.
 */
static void
resp_stream_text(resp_call *c, const char *s, size_t n, bool final)
{
    if (c->tc == NULL) {
        resp_stream_delta(c, s, n);
        return;
    }
    wk_toolcall_out o;
    if (wk_toolcall_feed(c->tc, s, n, final, &o) != WK_OK) {
        wk_toolcall_parser_free(c->tc); /* (out of memory: the rest streams as text) */
        c->tc = NULL;
        resp_stream_delta(c, s, n);
        return;
    }
    resp_stream_delta(c, o.content, o.content_len);
    wk_toolcall_out_fini(&o);
}

/* Stream: one piece of the split, as a reasoning or a text delta. */
static void
resp_stream_piece(void *arg, bool reasoning, const char *s, size_t n)
{
    resp_call *c = arg;
    if (c->split.thought && !c->rs_open && !c->msg_open)
        resp_stream_rs_open(c); /* (the reply opened its reasoning: an item, maybe empty) */
    if (n == 0)
        return;
    if (reasoning && !c->msg_open) {
        resp_stream_rs_open(c);
        resp_buf_put(&c->reason, s, n);
        resp_event(c, "response.reasoning_text.delta",
                   json_pack("{s:s, s:i, s:i, s:s%}", "item_id", c->rs_id, "output_index", 0,
                             "content_index", 0, "delta", s, n));
        return;
    }
    resp_stream_text(c, s, n, false);
}

static wk_err
resp_stream_sink(void *arg, const char *text, size_t len, const ctl_gen_token *toks, size_t n_toks)
{
    (void)toks;
    (void)n_toks;
    resp_call *c = arg;
    if (len == 0)
        return WK_OK;
    resp_split_feed(&c->split, text, len, false, resp_stream_piece, c);
    return c->broken || (c->bg != NULL && resp_bg_cancelled(c)) ? WK_EIO : WK_OK;
}

/* ctl_gen's flush: writes the events of one wake-up. */
static wk_err
resp_stream_flush(void *arg)
{
    resp_call *c = arg;
    if (c->bg != NULL)
        return c->broken || resp_bg_cancelled(c) ? WK_EIO : WK_OK; /* (readers send) */
    if (ctl_http_flush(c->req) != WK_OK)
        c->broken = true;
    return c->broken ? WK_EIO : WK_OK;
}

/*
 * Completes the record after a generation: output (the reasoning item's
 * text split off the message's), usage, the end state's tokens, status;
 * stores it when asked and counts.
 */
static void
resp_finish(resp_call *c, const ctl_gen_result *res)
{
    ctl_app *app = c->app;
    json_t *rec = c->rec;
    ctl_openai_req *r = &c->r;
    resp_split sp;
    resp_split_out so;
    memset(&so, 0, sizeof(so));
    resp_split_init(&sp, r->wire.think, r->wire.think_open);
    resp_split_feed(&sp, res->text, res->text_len, true, resp_split_collect, &so);
    /* The content parsed for calls (as the stream parses it: the same for any cut). */
    json_t *calls = json_array();
    wk_toolcall_parser *tp = NULL;
    wk_toolcall_out to;
    memset(&to, 0, sizeof(to));
    if (r->wire.tool_fmt != WK_TOOLCALL_FMT_NONE &&
        wk_toolcall_parser_new(r->wire.tool_fmt,
                               r->wire.call_tools != NULL ? r->wire.call_tools : r->wire.tools,
                               &tp) == WK_OK &&
        wk_toolcall_feed(tp, so.content.p != NULL ? so.content.p : "", so.content.n, true, &to) ==
            WK_OK) {
        for (size_t i = 0; i < to.n_calls && calls != NULL; i++) {
            if (r->wire.tool_serial && i > 0)
                break;
            char fid[CTL_RESP_ID_MAX], cid[CTL_RESP_ID_MAX];
            resp_new_id("fc_", 24, fid, sizeof(fid));
            resp_new_id("call_", 12, cid, sizeof(cid));
            json_array_append_new(calls, json_pack("{s:s, s:s, s:s, s:s}", "id", fid, "call_id",
                                                   cid, "name", to.calls[i].name, "arguments",
                                                   to.calls[i].arguments));
        }
        so.content.n = 0; /* (the content is what the parse left) */
        resp_buf_put(&so.content, to.content, to.content_len);
    }
    wk_toolcall_out_fini(&to);
    wk_toolcall_parser_free(tp);
    json_t *out = json_pack("{s:s, s:s%}", "id", c->msg_id, "text",
                            so.content.p != NULL ? so.content.p : "", so.content.n);
    if (out != NULL && json_array_size(calls) > 0)
        json_object_set(out, "calls", calls);
    json_decref(calls);
    if (sp.thought && out != NULL) {
        json_object_set_new(out, "reasoning_id", json_string(c->rs_id));
        json_object_set_new(out, "reasoning",
                            json_stringn(so.reason.p != NULL ? so.reason.p : "", so.reason.n));
        json_object_set_new(out, "reasoning_closed", json_boolean(sp.mode == RESP_SPLIT_TEXT));
        json_object_set_new(
            out, "reasoning_tokens",
            json_integer((json_int_t)resp_reasoning_tokens(app->tok, res->tokens, res->n_tokens,
                                                           r->wire.think, r->wire.think_open)));
    }
    free(so.content.p);
    free(so.reason.p);
    json_object_set_new(rec, "output", out);
    bool length = res->finish_reason != NULL && strcmp(res->finish_reason, "length") == 0;
    json_object_set_new(rec, "status", json_string(length ? "incomplete" : "completed"));
    json_object_set_new(rec, "incomplete_reason",
                        length ? json_string("max_output_tokens") : json_null());
    size_t cached = r->plan.n_prompt > res->computed ? r->plan.n_prompt - res->computed : 0;
    json_object_set_new(rec, "usage",
                        json_pack("{s:I, s:I, s:I}", "input_tokens", (json_int_t)r->plan.n_prompt,
                                  "cached_tokens", (json_int_t)cached, "output_tokens",
                                  (json_int_t)res->n_tokens));
    /* The end state: the prompt and the sampled tokens the state consumed. */
    size_t n_gen = res->fed > r->plan.n_prompt ? res->fed - r->plan.n_prompt : 0;
    if (n_gen > res->n_tokens)
        n_gen = res->n_tokens;
    json_t *ids = json_array();
    for (size_t i = 0; ids != NULL && i < r->plan.n_prompt; i++)
        json_array_append_new(ids, json_integer(r->plan.prompt[i]));
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
        if (resp_load(app, c->r.plan.owner, pid, &p, &expired) == WK_OK) {
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
        json_object_set_new(o, "prompt_token_count", json_integer((json_int_t)c->r.plan.n_prompt));
    }
}

static void
resp_answer_whole(resp_call *c, bool free_slot)
{
    ctl_app *app = c->app;
    ctl_gen_result res;
    wk_diag d = {{0}};
    wk_err err = ctl_gen_run(app->sched, app->tok, c->r.plan.prompt, c->r.plan.n_prompt,
                             &c->r.plan.gen, NULL, NULL, &res, &d);
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

/*
 * Generates c as a stream of typed events. A background response (c->bg)
 * writes them to its event log and leaves its failures to the caller
 * (returned with d: nothing is counted or sent then); else they go to the
 * client and WK_OK is returned.
 */
static wk_err
resp_answer_stream(resp_call *c, bool free_slot, wk_diag *bgd)
{
    ctl_app *app = c->app;
    ctl_gen_result res;
    wk_diag d = {{0}};
    ctl_job *job = NULL;
    bool bg = c->bg != NULL;
    /* Admission errors come before the first byte, as plain JSON errors. */
    wk_err err =
        ctl_gen_submit(app->sched, c->r.plan.prompt, c->r.plan.n_prompt, &c->r.plan.gen, &job, &d);
    if (err != WK_OK && bg) {
        *bgd = d;
        return err;
    }
    if (err != WK_OK) {
        resp_count(app, "error");
        if (err == WK_ETOOBIG)
            resp_send_error(c->req, 400, err, "max_output_tokens", "context_length_exceeded", "%s",
                            d.msg);
        else
            ctl_http_send_error(c->req, err, d.msg, NULL);
        return WK_OK;
    }
    json_t *o = resp_object(c->rec);
    if (!bg) { /* (a background stream's log begins with its created and queued events) */
        ctl_http_sse_begin(c->req);
        resp_event(c, "response.created", json_pack("{s:O}", "response", o));
    }
    resp_event(c, "response.in_progress", json_pack("{s:o}", "response", o));
    /*
     * The first item now when it is known: the reasoning item when the prompt
     * leaves the reply thinking, the message when the reply cannot reason;
     * else the first piece of text decides.
     */
    resp_split_init(&c->split, c->r.wire.think, c->r.wire.think_open);
    if (c->r.wire.tool_fmt != WK_TOOLCALL_FMT_NONE &&
        wk_toolcall_parser_new(
            c->r.wire.tool_fmt,
            c->r.wire.call_tools != NULL ? c->r.wire.call_tools : c->r.wire.tools, &c->tc) != WK_OK)
        c->tc = NULL; /* (out of memory: the reply streams as text) */
    if (c->split.mode == RESP_SPLIT_THINK)
        resp_stream_rs_open(c);
    else if (c->split.mode == RESP_SPLIT_TEXT && c->tc == NULL)
        resp_stream_msg_open(c);
    if (c->broken) {
        ctl_job_free(job);
        err = WK_EIO;
    } else {
        if (bg) { /* (no connection to hand over: the events go to the log) */
            err = ctl_gen_run_job(job, app->tok, &c->r.plan.gen, resp_stream_sink,
                                  resp_stream_flush, c, &res, &d);
        } else {
            ctl_http_cork(c->req, true); /* one write per wake-up */
            err = ctl_stream_gen_run(c->req, job, app->tok, &c->r.plan.gen, resp_stream_sink,
                                     resp_stream_flush, c, &res, &d);
            if (ctl_http_req_broken(c->req))
                c->broken = true; /* (an event loop saw the client go away) */
            ctl_http_cork(c->req, false);
        }
    }
    if (err != WK_OK && bg) {
        *bgd = d;
        return err;
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
        return WK_OK;
    }
    resp_split_feed(&c->split, "", 0, true, resp_stream_piece, c);
    resp_stream_piece(c, false, "", 0); /* (a reasoning item that got no text) */
    resp_stream_text(c, "", 0, true);   /* (what the tool-call parse held) */
    ctl_openai_reuse_done(app, &c->r, &res, free_slot);
    resp_finish(c, &res);
    const char *st = json_string_value(json_object_get(c->rec, "status"));
    const char *ist = strcmp(st, "completed") == 0 ? "completed" : "incomplete";
    json_t *out = json_object_get(c->rec, "output");
    resp_stream_rs_close(c, ist); /* (a reply that never left its reasoning) */
    if (resp_out_has_message(out))
        resp_stream_msg_open(c); /* (an empty message) */
    int mi = resp_msg_index(c);
    json_t *text = json_object_get(out, "text");
    if (c->msg_open) {
        resp_event(c, "response.output_text.done",
                   json_pack("{s:s, s:i, s:i, s:O, s:[]}", "item_id", c->msg_id, "output_index", mi,
                             "content_index", 0, "text", text, "logprobs"));
        resp_event(c, "response.content_part.done",
                   json_pack("{s:s, s:i, s:i, s:{s:s, s:O, s:[], s:[]}}", "item_id", c->msg_id,
                             "output_index", mi, "content_index", 0, "part", "type", "output_text",
                             "text", text, "annotations", "logprobs"));
        resp_event(c, "response.output_item.done",
                   json_pack("{s:i, s:o}", "output_index", mi, "item",
                             resp_output_item(c->msg_id, text, ist, true)));
    }
    /* The calls, each complete (the parse reports a call once it is whole). */
    int ci = mi + (c->msg_open ? 1 : 0);
    size_t k;
    json_t *call;
    json_array_foreach(json_object_get(out, "calls"), k, call)
    {
        json_t *added = resp_call_item(call, "in_progress");
        json_object_set_new(added, "arguments", json_string(""));
        const char *fid = json_string_value(json_object_get(call, "id"));
        resp_event(c, "response.output_item.added",
                   json_pack("{s:i, s:o}", "output_index", ci, "item", added));
        resp_event(c, "response.function_call_arguments.delta",
                   json_pack("{s:s, s:i, s:O}", "item_id", fid, "output_index", ci, "delta",
                             json_object_get(call, "arguments")));
        resp_event(c, "response.function_call_arguments.done",
                   json_pack("{s:s, s:i, s:O, s:O}", "item_id", fid, "output_index", ci,
                             "arguments", json_object_get(call, "arguments"), "name",
                             json_object_get(call, "name")));
        resp_event(
            c, "response.output_item.done",
            json_pack("{s:i, s:o}", "output_index", ci, "item", resp_call_item(call, "completed")));
        ci++;
    }
    o = resp_object(c->rec);
    resp_extend(c, o);
    resp_event(c, strcmp(st, "incomplete") == 0 ? "response.incomplete" : "response.completed",
               json_pack("{s:o}", "response", o));
    resp_count(app, c->broken && !bg ? "cancelled" : "ok");
    ctl_gen_result_fini(&res);
    return WK_OK;
}

/* Resolves previous_response_id into c->prev; sends the error and returns false. */
static bool
resp_resolve_prev(resp_call *c)
{
    const char *pid = c->q.previous_response_id;
    if (pid == NULL)
        return true;
    bool expired = false;
    wk_err err = resp_load(c->app, c->r.plan.owner, pid, &c->prev, &expired);
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
    if (resp_running_status(c->prev)) {
        resp_send_error(c->req, 400, WK_EINVAL, "previous_response_id", "invalid_value",
                        "previous response '%.80s' is still %s: continue it once it finished "
                        "(GET /v1/responses/{id})",
                        pid, json_string_value(json_object_get(c->prev, "status")));
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

/* Frees a call and everything it owns (the request is not its). */
static void
resp_call_free(resp_call *c)
{
    if (c == NULL)
        return;
    json_decref(c->history);
    json_decref(c->input);
    json_decref(c->rec);
    json_decref(c->prev);
    ctl_openai_req_fini(&c->r);
    ctl_resp_req_fini(&c->q);
    json_decref(c->body);
    free(c->reason.p);
    wk_toolcall_parser_free(c->tc);
    free(c);
}

/* ------------------------------------------------------------ background ---- */

/*
 * Background responses (background: true): the POST answers at once with
 * the stored record (status "queued"), a thread runs the generation and
 * stores the outcome (completed / incomplete / failed / cancelled), and
 * POST /v1/responses/{id}/cancel stops it at the next step. The registry
 * lists the running ones; ctl_responses_shutdown() cancels them and waits.
 * A record still queued or in progress that this process does not run (its
 * "boot" is another process's: the controller restarted, or was killed)
 * reads as failed, and is stored so.
 */
typedef struct resp_bg {
    char key[RESP_KEY_MAX]; /* the record's key (owner digest and id) */
    atomic_bool cancel;     /* stop at the next step */
    struct resp_bg *next;   /* registry list (running, or recent when ended) */
    /*
     * The event log of one created with stream: true (under resp_bg_mu):
     * every event in order (event i has sequence_number i), read by the
     * POST that created it and by GET ...?stream=true&starting_after=N, each
     * from where it starts, until the log ends.
     */
    bool logged;          /* created with stream: events are kept */
    char **ev_type, **ev; /* each event's type and data (JSON text), owned */
    size_t n_ev, cap_ev;  /* entries, capacity */
    bool ended;           /* no event follows */
    unsigned refs;        /* the thread's, the readers', the recent list's */
} resp_bg;

static pthread_mutex_t resp_bg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t resp_bg_cv = PTHREAD_COND_INITIALIZER; /* an entry left */
static resp_bg *resp_bg_list;                                /* running, under resp_bg_mu */
static size_t resp_bg_n;                                     /* entries */
static bool resp_bg_closing;                                 /* shutdown: no new ones */
static pthread_cond_t resp_bg_ev_cv = PTHREAD_COND_INITIALIZER; /* an event logged, a log ended */
static resp_bg *resp_bg_recent; /* ended logs kept for late readers, newest first */
static size_t resp_bg_n_recent; /* entries */
static char resp_boot[33];                                   /* this process's boot id */
static pthread_once_t resp_boot_once = PTHREAD_ONCE_INIT;

#define RESP_BG_MAX 256u /* background responses running at once, all users */
#define RESP_BG_RECENT 64u /* ended event logs kept for GET ...?stream=true */

/* Drops one reference (resp_bg_mu held); frees b with the last. */
static void
resp_bg_unref_locked(resp_bg *b)
{
    if (--b->refs > 0)
        return;
    for (size_t i = 0; i < b->n_ev; i++) {
        free(b->ev_type[i]);
        free(b->ev[i]);
    }
    free(b->ev_type);
    free(b->ev);
    free(b);
}

/* Appends one event (data consumed) to b's log (none: dropped); false on ENOMEM. */
static bool
resp_bg_log(resp_bg *b, const char *type, char *data)
{
    if (!b->logged) {
        free(data);
        return true;
    }
    char *t = strdup(type);
    pthread_mutex_lock(&resp_bg_mu);
    bool ok = t != NULL;
    if (ok && b->n_ev == b->cap_ev) {
        size_t cap = b->cap_ev ? b->cap_ev * 2 : 32;
        char **nt = realloc(b->ev_type, cap * sizeof(*nt));
        if (nt != NULL)
            b->ev_type = nt;
        char **nd = nt != NULL ? realloc(b->ev, cap * sizeof(*nd)) : NULL;
        if (nd != NULL) {
            b->ev = nd;
            b->cap_ev = cap;
        }
        ok = nd != NULL;
    }
    if (ok) {
        b->ev_type[b->n_ev] = t;
        b->ev[b->n_ev++] = data;
        pthread_cond_broadcast(&resp_bg_ev_cv);
    }
    pthread_mutex_unlock(&resp_bg_mu);
    if (!ok) {
        free(t);
        free(data);
    }
    return ok;
}

/* Ends b's log: its readers finish once they have sent what it holds. */
static void
resp_bg_log_end(resp_bg *b)
{
    pthread_mutex_lock(&resp_bg_mu);
    b->ended = true;
    pthread_cond_broadcast(&resp_bg_ev_cv);
    pthread_mutex_unlock(&resp_bg_mu);
}

/*
 * Sends b's log from event from on as server-sent events, waiting for new
 * ones until it ends (or the client goes away; the generation goes on).
 * Drops the reader's reference to b.
 */
static void
resp_bg_follow(ctl_http_req *req, resp_bg *b, size_t from)
{
    ctl_http_sse_begin(req);
    size_t i = from;
    bool gone = false;
    pthread_mutex_lock(&resp_bg_mu);
    while (!gone) {
        size_t n = b->n_ev;
        while (i < n && !gone) {
            /* (the strings stay while b lives; only the arrays move) */
            const char *t = b->ev_type[i], *data = b->ev[i];
            pthread_mutex_unlock(&resp_bg_mu);
            gone = ctl_http_sse_event(req, t, data) != WK_OK;
            pthread_mutex_lock(&resp_bg_mu);
            i++;
        }
        if (gone || (b->ended && i >= b->n_ev))
            break;
        if (i >= b->n_ev) {
            pthread_mutex_unlock(&resp_bg_mu);
            gone = ctl_http_flush(req) != WK_OK;
            pthread_mutex_lock(&resp_bg_mu);
            while (!gone && i >= b->n_ev && !b->ended)
                pthread_cond_wait(&resp_bg_ev_cv, &resp_bg_mu);
        }
    }
    resp_bg_unref_locked(b);
    pthread_mutex_unlock(&resp_bg_mu);
    if (!gone && ctl_http_flush(req) != WK_OK)
        wk_log_debug("background stream reader went away");
}

/*
 * The logged background response under key (running, or ended and still
 * kept) with a reference for the caller, or NULL.
 */
static resp_bg *
resp_bg_find_log(const char *key)
{
    pthread_mutex_lock(&resp_bg_mu);
    resp_bg *b = NULL;
    for (int l = 0; l < 2 && b == NULL; l++) {
        for (resp_bg *x = l == 0 ? resp_bg_list : resp_bg_recent; x != NULL && b == NULL;
             x = x->next)
            if (x->logged && strcmp(x->key, key) == 0)
                b = x;
    }
    if (b != NULL)
        b->refs++;
    pthread_mutex_unlock(&resp_bg_mu);
    return b;
}

static void
resp_boot_init(void)
{
    resp_new_id("", 16, resp_boot, sizeof(resp_boot));
}

/* True when rec's status is queued or in_progress. */
static bool
resp_running_status(const json_t *rec)
{
    const char *st = json_string_value(json_object_get(rec, "status"));
    return st != NULL && (strcmp(st, "queued") == 0 || strcmp(st, "in_progress") == 0);
}

/*
 * A record left queued or in progress by another process (the one that ran
 * it is gone): rewritten as failed, and stored so. True when rec changed.
 */
static bool
resp_bg_orphan(ctl_app *app, json_t *rec)
{
    pthread_once(&resp_boot_once, resp_boot_init);
    const char *boot = json_string_value(json_object_get(rec, "boot"));
    if (!resp_running_status(rec) || (boot != NULL && strcmp(boot, resp_boot) == 0))
        return false;
    json_object_set_new(rec, "status", json_string("failed"));
    json_object_set_new(rec, "error",
                        json_pack("{s:s, s:s}", "code", "server_error", "message",
                                  "the controller stopped before this background response "
                                  "finished; send it again"));
    resp_cleanup(resp_save(app, rec, NULL), "orphaned background response");
    return true;
}

/* Registers a running background response; false when closing or full. */
static bool
resp_bg_add(resp_bg *b)
{
    pthread_mutex_lock(&resp_bg_mu);
    bool ok = !resp_bg_closing && resp_bg_n < RESP_BG_MAX;
    if (ok) {
        b->next = resp_bg_list;
        resp_bg_list = b;
        resp_bg_n++;
    }
    pthread_mutex_unlock(&resp_bg_mu);
    return ok;
}

/*
 * Takes b off the running list; a logged one goes to the recent list (the
 * oldest there dropped beyond RESP_BG_RECENT). Drops the thread's reference.
 */
static void
resp_bg_remove(resp_bg *b)
{
    pthread_mutex_lock(&resp_bg_mu);
    for (resp_bg **pp = &resp_bg_list; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == b) {
            *pp = b->next;
            resp_bg_n--;
            break;
        }
    }
    if (b->logged) {
        b->next = resp_bg_recent;
        resp_bg_recent = b;
        b->refs++;
        if (++resp_bg_n_recent > RESP_BG_RECENT) {
            resp_bg **pp = &resp_bg_recent;
            while ((*pp)->next != NULL)
                pp = &(*pp)->next;
            resp_bg *old = *pp;
            *pp = NULL;
            resp_bg_n_recent--;
            resp_bg_unref_locked(old);
        }
    }
    pthread_cond_broadcast(&resp_bg_cv);
    resp_bg_unref_locked(b);
    pthread_mutex_unlock(&resp_bg_mu);
}

static bool
resp_bg_cancelled(const resp_call *c)
{
    return atomic_load(&c->bg->cancel);
}

/*
 * Asks the running response under key to stop and waits (at most
 * timeout_ms) until it has stored its outcome. False when none runs.
 */
static bool
resp_bg_cancel(const char *key, uint64_t timeout_ms)
{
    pthread_mutex_lock(&resp_bg_mu);
    resp_bg *b = resp_bg_list;
    while (b != NULL && strcmp(b->key, key) != 0)
        b = b->next;
    if (b == NULL) {
        pthread_mutex_unlock(&resp_bg_mu);
        return false;
    }
    atomic_store(&b->cancel, true);
    struct timespec until;
    wk_deadline_after_ms(&until, timeout_ms);
    for (;;) {
        bool found = false;
        for (resp_bg *x = resp_bg_list; x != NULL && !found; x = x->next)
            found = x == b;
        if (!found || pthread_cond_timedwait(&resp_bg_cv, &resp_bg_mu, &until) != 0)
            break;
    }
    pthread_mutex_unlock(&resp_bg_mu);
    return true;
}

void
ctl_responses_shutdown(ctl_app *app)
{
    (void)app;
    pthread_mutex_lock(&resp_bg_mu);
    resp_bg_closing = true;
    for (resp_bg *b = resp_bg_list; b != NULL; b = b->next)
        atomic_store(&b->cancel, true);
    if (resp_bg_n > 0)
        wk_log_info("background responses stopping n=%zu", resp_bg_n);
    while (resp_bg_n > 0)
        pthread_cond_wait(&resp_bg_cv, &resp_bg_mu);
    pthread_mutex_unlock(&resp_bg_mu);
}

/* The generation's sink: stops it at the next step once cancelled. */
static wk_err
resp_bg_sink(void *arg, const char *text, size_t len, const ctl_gen_token *toks, size_t n_toks)
{
    (void)text;
    (void)len;
    (void)toks;
    (void)n_toks;
    resp_call *c = arg;
    return atomic_load(&c->bg->cancel) ? WK_EIO : WK_OK;
}

/* Stores the record as it is now (a background response's progress). */
static void
resp_bg_store(resp_call *c)
{
    wk_diag d = {{0}};
    if (resp_save(c->app, c->rec, &d) != WK_OK)
        wk_log_warn("background response not stored id=%s: %s",
                    json_string_value(json_object_get(c->rec, "id")), d.msg);
}

/* The background thread: generates, stores the outcome, frees the call. */
static void *
resp_bg_main(void *arg)
{
    resp_call *c = arg;
    ctl_app *app = c->app;
    json_object_set_new(c->rec, "status", json_string("in_progress"));
    resp_bg_store(c);
    ctl_ckpt_plan *plan = calloc(1, sizeof(*plan));
    bool free_slot = false;
    if (plan != NULL) {
        ctl_openai_reuse_begin(app, &c->r, plan, &free_slot);
        plan->durable = true;
    }
    ctl_gen_result res;
    wk_diag d = {{0}};
    wk_err err;
    if (atomic_load(&c->bg->cancel))
        err = WK_EIO;
    else if (c->bg->logged)
        err = resp_answer_stream(c, free_slot, &d); /* (on WK_OK finished, stored, counted) */
    else
        err = ctl_gen_run(app->sched, app->tok, c->r.plan.prompt, c->r.plan.n_prompt,
                          &c->r.plan.gen, resp_bg_sink, c, &res, &d);
    const char *id = json_string_value(json_object_get(c->rec, "id"));
    if (err == WK_OK && !c->bg->logged) {
        ctl_openai_reuse_done(app, &c->r, &res, free_slot);
        resp_finish(c, &res); /* (stores it) */
        resp_count(app, "ok");
        ctl_gen_result_fini(&res);
    } else if (err != WK_OK) {
        bool cancelled = err == WK_EIO && atomic_load(&c->bg->cancel);
        pthread_mutex_lock(&resp_bg_mu);
        bool closing = resp_bg_closing;
        pthread_mutex_unlock(&resp_bg_mu);
        /* No output and no state: a follow-up renders its input alone. */
        if (cancelled && !closing) {
            json_object_set_new(c->rec, "status", json_string("cancelled"));
        } else {
            json_object_set_new(c->rec, "status", json_string("failed"));
            json_object_set_new(c->rec, "error",
                                json_pack("{s:s, s:s}", "code", "server_error", "message",
                                          cancelled
                                              ? "the controller shut down during the generation"
                                          : d.msg[0] ? d.msg
                                                     : wk_strerror(err)));
        }
        resp_bg_store(c);
        if (c->bg->logged && !(cancelled && !closing)) { /* (a cancelled one just ends) */
            c->broken = false;
            resp_event(c, "response.failed", json_pack("{s:o}", "response", resp_object(c->rec)));
        }
        resp_count(app, cancelled && !closing ? "cancelled" : "error");
        wk_log_info("background response %s id=%s", cancelled && !closing ? "cancelled" : "failed",
                    id != NULL ? id : "?");
    }
    ctl_ckpt_plan_end(plan);
    free(plan);
    c->r.plan.ckpt = NULL;
    resp_bg *b = c->bg;
    if (app->limits != NULL && c->user[0])
        ctl_limits_release(app->limits, c->user); /* (the unit resp_route took) */
    resp_call_free(c);
    resp_bg_log_end(b);
    resp_bg_remove(b); /* (drops the thread's reference) */
    return NULL;
}

/*
 * Starts c in the background: stores the record (queued), answers it and
 * hands c (and the request's concurrency unit) to a thread. True when
 * handed over; else the error is sent and c stays the caller's.
 */
static bool
resp_bg_start(resp_call *c)
{
    ctl_app *app = c->app;
    pthread_once(&resp_boot_once, resp_boot_init);
    resp_bg *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        resp_send_error(c->req, 500, WK_ENOMEM, NULL, NULL, "out of memory");
        return false;
    }
    resp_key(c->r.plan.owner, json_string_value(json_object_get(c->rec, "id")), b->key);
    atomic_init(&b->cancel, false);
    b->logged = c->q.stream;
    b->refs = 1; /* (the thread's) */
    if (!resp_bg_add(b)) {
        free(b);
        resp_send_error(c->req, 429, WK_EQUOTA, "background", "rate_limit_exceeded",
                        "too many background responses running (at most %u)", RESP_BG_MAX);
        return false;
    }
    c->bg = b;
    json_object_set_new(c->rec, "status", json_string("queued"));
    json_object_set_new(c->rec, "boot", json_string(resp_boot));
    wk_diag d = {{0}};
    json_t *o = NULL;
    pthread_attr_t attr;
    pthread_t th;
    bool started = false;
    wk_err err = resp_save(app, c->rec, &d);
    if (err == WK_OK && (o = resp_object(c->rec)) != NULL && b->logged) {
        /* A stream's log begins with the queued response (sequence_number 0 and 1). */
        resp_event(c, "response.created", json_pack("{s:O}", "response", o));
        resp_event(c, "response.queued", json_pack("{s:O}", "response", o));
        if (c->broken)
            err = WK_ENOMEM;
        else
            b->refs++; /* (the POST's reader) */
    }
    if (err == WK_OK && o != NULL && pthread_attr_init(&attr) == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const char *u = ctl_http_req_user(c->req);
        snprintf(c->user, sizeof(c->user), "%s", u != NULL ? u : "");
        ctl_http_req *req = c->req;
        c->req = NULL; /* (the thread never answers) */
        started = pthread_create(&th, &attr, resp_bg_main, c) == 0;
        pthread_attr_destroy(&attr);
        if (!started) {
            c->req = req;
        } else if (b->logged) {
            json_decref(o);
            resp_bg_follow(req, b, 0); /* (drops the reader's reference) */
        } else {
            ctl_http_send_json(req, 200, o);
        }
    }
    if (started)
        return true;
    json_decref(o);
    c->bg = NULL;
    b->logged = false; /* (nobody reads it) */
    b->refs = 1;
    resp_bg_remove(b); /* (frees it) */
    char key[RESP_KEY_MAX];
    resp_key(c->r.plan.owner, json_string_value(json_object_get(c->rec, "id")), key);
    resp_cleanup(ctl_store_session_delete(app->store, key, NULL), "unstarted background response");
    ctl_http_send_error(c->req, err != WK_OK ? err : WK_ENOMEM,
                        d.msg[0] ? d.msg : "cannot start the background response", NULL);
    return false;
}

/*
 * POST /v1/responses: answers it, or hands it to a background thread
 * (true: the thread holds the request's concurrency unit from now on).
 */
static bool
resp_create(ctl_http_req *req, ctl_app *app)
{
    uint64_t now_ms = wk_mono_ms(), last = atomic_load(&resp_last_sweep_ms);
    if (app->responses_ttl_s > 0 && now_ms - last >= RESP_SWEEP_EVERY_MS &&
        atomic_compare_exchange_strong(&resp_last_sweep_ms, &last, now_ms))
        resp_sweep(app);
    json_t *body = ctl_openai_body(req);
    if (body == NULL)
        return false;
    resp_call *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        json_decref(body);
        resp_send_error(req, 500, WK_ENOMEM, NULL, NULL, "out of memory");
        return false;
    }
    bool handed = false;
    c->req = req;
    c->app = app;
    c->body = body;
    c->r = (ctl_openai_req){.wire.chat = true, .plan.reuse = true, .wire.cache = true};
    ctl_resp_limits lim = {.max_items = app->max_messages,
                           .max_item_bytes = app->max_message_bytes,
                           .max_tokens = app->max_tokens_limit};
    ctl_resp_err e;
    if (ctl_resp_req_parse(body, &lim, &c->q, &e) != WK_OK) {
        resp_send_error(req, e.err == WK_ENOMEM ? 500 : 400, e.err, e.param, e.code, "%s", e.msg);
        goto out;
    }
    if (app->model_id == NULL || strcmp(c->q.model, app->model_id) != 0) {
        resp_send_error(req, 404, WK_ENOENT, "model", "model_not_found",
                        "The model '%.100s' does not exist", c->q.model);
        goto out;
    }
    ctl_openai_owner(req, c->r.plan.owner);
    if (!resp_resolve_prev(c))
        goto out;
    if (c->q.store) {
        wk_diag qd = {{0}};
        wk_err qerr = resp_quota(app, c->r.plan.owner, &qd);
        if (qerr != WK_OK) {
            ctl_http_send_error(req, qerr, qd.msg, "store");
            goto out;
        }
    }
    c->history = json_array();
    c->input = json_array();
    if (c->history == NULL || c->input == NULL) {
        resp_send_error(req, 500, WK_ENOMEM, NULL, NULL, "out of memory");
        goto out;
    }
    resp_history(c, c->history, c->input);
    /* The conversation and the generation's parameters: one path, ctl_resp_plan. */
    ctl_worker_view fv;
    ctl_resp_conv cv = {.prev = c->prev, .history = c->history, .input = c->input,
                        .fingerprint = ctl_pool_model_view(app->pool, &fv) == WK_OK
                                           ? fv.fingerprint
                                           : NULL};
    ctl_openai_perr pe;
    if (!ctl_resp_plan(app, &c->q, &cv, &c->r, &c->aligned, &pe)) {
        ctl_openai_send_perr(req, &pe);
        goto out;
    }
    c->n_prev = c->r.plan.aligned_tokens;
    ctl_gen_params *g = &c->r.plan.gen;
    if (!c->q.has_seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        g->sample.seed = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
    }
    g->deadline_ms = wk_mono_ms() + app->request_timeout_ms;
    /* The record, before the output: what the stream's first events show. */
    char id[CTL_RESP_ID_MAX];
    resp_new_id("resp_", 24, id, sizeof(id));
    resp_new_id("msg_", 24, c->msg_id, sizeof(c->msg_id));
    resp_new_id("rs_", 24, c->rs_id, sizeof(c->rs_id));
    ctl_worker_view v;
    if (ctl_pool_model_view(app->pool, &v) != WK_OK)
        v.fingerprint[0] = '\0';
    int64_t created_ms = resp_now_ms(), now = created_ms / 1000;
    c->rec = json_pack("{s:i, s:s, s:s, s:s, s:s, s:I, s:s, s:O, s:O, s:b}", "v",
                       RESP_RECORD_VERSION, "id", id, "owner", c->r.plan.owner, "model", c->q.model,
                       "fp", v.fingerprint, "created_at", (json_int_t)now, "status", "in_progress",
                       "history", c->history, "input", c->input, "store", c->q.store);
    if (c->rec == NULL) {
        resp_send_error(req, 500, WK_ENOMEM, NULL, NULL, "out of memory");
        goto out;
    }
    json_t *rec = c->rec;
    json_object_set_new(rec, "created_ms", json_integer((json_int_t)created_ms));
    json_object_set_new(rec, "expires_at", json_integer(resp_expires_at(app, rec)));
    json_object_set_new(rec, "instructions",
                        c->q.instructions != NULL
                            ? json_stringn(c->q.instructions, c->q.instructions_len)
                            : json_null());
    json_object_set_new(rec, "previous_response_id",
                        c->q.previous_response_id != NULL ? json_string(c->q.previous_response_id)
                                                          : json_null());
    json_object_set_new(rec, "metadata",
                        c->q.metadata != NULL ? json_deep_copy(c->q.metadata) : json_object());
    json_object_set_new(rec, "user", c->q.user != NULL ? json_string(c->q.user) : json_null());
    if (c->q.tools != NULL)
        json_object_set_new(rec, "tools", json_deep_copy(c->q.tools));
    json_object_set_new(rec, "temperature", json_real(c->q.temperature));
    json_object_set_new(rec, "top_p", json_real(c->q.top_p));
    json_object_set_new(rec, "max_output_tokens",
                        c->q.max_output_tokens ? json_integer(c->q.max_output_tokens)
                                               : json_null());
    if (c->q.reasoning_effort != NULL)
        json_object_set_new(rec, "reasoning_effort", json_string(c->q.reasoning_effort));
    if (c->q.reasoning_summary != NULL)
        json_object_set_new(rec, "reasoning_summary", json_string(c->q.reasoning_summary));
    if (c->q.background)
        json_object_set_new(rec, "background", json_true());
    if (c->q.tool_choice_none)
        json_object_set_new(rec, "tool_choice_none", json_true());
    if (c->q.allowed_tools != NULL)
        json_object_set_new(rec, "tool_choice", json_deep_copy(c->q.allowed_tools));
    else if (c->q.tool_name != NULL)
        json_object_set_new(rec, "tool_choice",
                            json_pack("{s:s, s:s}", "type", "function", "name", c->q.tool_name));
    else if (c->q.tool_required)
        json_object_set_new(rec, "tool_choice", json_string("required"));
    if (c->q.parallel_tool_calls_off)
        json_object_set_new(rec, "serial_tool_calls", json_true());
    ctl_metrics_add(app->metrics, "wkvm_prompt_tokens_total", NULL, (double)c->r.plan.n_prompt);
    if (c->q.background) {
        handed = resp_bg_start(c);
        if (handed)
            c = NULL; /* (the thread's now) */
        goto out;
    }
    /* Generate, with the checkpoint plan (the end state is the stored response's state). */
    ctl_ckpt_plan *plan = calloc(1, sizeof(*plan));
    bool free_slot = false;
    if (plan != NULL) {
        ctl_openai_reuse_begin(app, &c->r, plan, &free_slot);
        plan->durable = c->q.store;
    }
    if (c->q.stream)
        (void)resp_answer_stream(c, free_slot, NULL);
    else
        resp_answer_whole(c, free_slot);
    ctl_ckpt_plan_end(plan);
    free(plan);
    c->r.plan.ckpt = NULL;
out:
    resp_call_free(c);
    return handed;
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

/*
 * GET /v1/responses/{id}: the stored response; with ?stream=true (and
 * starting_after=N) the events of a background response created with
 * stream: true after sequence_number N, following it until it ends, from
 * its log while it runs and for the last RESP_BG_RECENT such ones after.
 */
static void
resp_get(ctl_http_req *req, ctl_app *app, const char *id)
{
    char owner[CTL_STORE_OWNER_MAX + 1], buf[32];
    ctl_openai_owner(req, owner);
    bool stream = false;
    long long after = -1;
    if (ctl_http_req_query_get(req, "stream", buf, sizeof(buf))) {
        stream = strcmp(buf, "true") == 0;
        if (!stream && strcmp(buf, "false") != 0) {
            resp_send_error(req, 400, WK_EINVAL, "stream", "invalid_value",
                            "'stream' must be true or false");
            return;
        }
    }
    if (ctl_http_req_query_get(req, "starting_after", buf, sizeof(buf))) {
        char *end = NULL;
        after = strtoll(buf, &end, 10);
        if (!stream || end == buf || *end != '\0' || after < 0) {
            resp_send_error(req, 400, WK_EINVAL, "starting_after", "invalid_value",
                            "'starting_after' is a sequence_number (an integer >= 0) and "
                            "needs stream=true");
            return;
        }
    }
    json_t *rec = resp_load_or_reply(req, app, owner, id);
    if (rec == NULL)
        return;
    if (!stream) {
        ctl_http_send_json(req, 200, resp_object(rec));
        json_decref(rec);
        return;
    }
    json_decref(rec);
    char key[RESP_KEY_MAX];
    resp_key(owner, id, key);
    resp_bg *b = resp_bg_find_log(key);
    if (b == NULL) {
        resp_send_error(req, 400, WK_EINVAL, "stream", "invalid_value",
                        "response '%.80s' has no event stream to resume: only a background "
                        "response created with stream: true has one, while it runs and for a "
                        "while after (GET it without stream)",
                        id);
        return;
    }
    resp_bg_follow(req, b, (size_t)(after + 1));
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

/*
 * POST /v1/responses/{id}/cancel: a running background response stops at
 * its next step and is stored as cancelled (no output, no state); the
 * answer is the record then (completed when it finished first). A cancelled
 * one answers itself again; any other finished one, or one not run in the
 * background, is 400.
 */
static void
resp_cancel(ctl_http_req *req, ctl_app *app, const char *id)
{
    char owner[CTL_STORE_OWNER_MAX + 1];
    ctl_openai_owner(req, owner);
    json_t *rec = resp_load_or_reply(req, app, owner, id);
    if (rec == NULL)
        return;
    if (!json_is_true(json_object_get(rec, "background"))) {
        json_decref(rec);
        resp_send_error(req, 400, WK_EINVAL, NULL, "invalid_request",
                        "only background responses can be cancelled");
        return;
    }
    if (resp_running_status(rec)) {
        /* (read it again either way: it may have finished since the first read) */
        char key[RESP_KEY_MAX];
        resp_key(owner, id, key);
        (void)resp_bg_cancel(key, app->request_timeout_ms);
        json_decref(rec);
        rec = resp_load_or_reply(req, app, owner, id);
        if (rec == NULL)
            return;
    }
    const char *st = json_string_value(json_object_get(rec, "status"));
    if (st == NULL || (strcmp(st, "cancelled") != 0 && !resp_running_status(rec))) {
        resp_send_error(req, 400, WK_EINVAL, NULL, "invalid_request",
                        "the response is %s already: only a queued or running one can be "
                        "cancelled",
                        st != NULL ? st : "finished");
        json_decref(rec);
        return;
    }
    ctl_http_send_json(req, 200, resp_object(rec));
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
        if (!resp_create(req, app))
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
        resp_cancel(req, app, id);
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
    int64_t now;       /* the listing's time (resp_now_ms) */
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
            .app = app, .owner = has ? owner : NULL, .data = json_array(), .now = resp_now_ms()};
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
