/*
 * ctl_chat: sessions for the chat API. Glues the pure parent-token-v1 module
 * (ctl_session) to the store (bindings), the state cache (parked slots) and
 * the generation path. A parked chat is a dirty ctl_vm entry keyed by the
 * session key: it stays hot until evicted, then its bytes are spilled to a
 * blob and the binding's ref points at the blob, so slot pressure, idle time
 * and a graceful controller restart never lose it. One turn per session at
 * a time (409 session_busy). Every decision is counted in the metrics.
 */
#define WK_LOG_MODULE "chat"
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_chat.h"
#include "ctl_ckpt.h"
#include "ctl_openai.h"
#include "ctl_session.h"
#include "ctl_store.h"
#include "ctl_vm.h"
#include "wk_log.h"

#define CTL_CHAT_ACTIVE_MAX 4096
#define CTL_CHAT_REF_HOT "hot"
#define CTL_CHAT_REF_SPILLED "spilled"
/* Spilled sessions are state records of this owner, named by the session key. */
#define CTL_CHAT_OWNER "__sessions"
/* Key prefix of a session's pre-reply snapshot (regenerate / edit the last turn). */
#define CTL_CHAT_SNAP_PREFIX "p:"
#define CTL_CHAT_SNAPKEY_SIZE (CTL_SESSION_KEY_SIZE + 2)

/* Keys of sessions with a turn in progress (one per app: ctl_app.chat_active). */
struct ctl_chat_active {
    pthread_mutex_t mu;                                  /* guards the rest */
    char keys[CTL_CHAT_ACTIVE_MAX][CTL_SESSION_KEY_SIZE]; /* the keys, unordered */
    size_t n;                                            /* entries in keys */
};

wk_err
ctl_chat_active_new(ctl_chat_active **out)
{
    ctl_chat_active *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return WK_ENOMEM;
    if (pthread_mutex_init(&a->mu, NULL) != 0) {
        free(a);
        return WK_ENOMEM;
    }
    *out = a;
    return WK_OK;
}

void
ctl_chat_active_free(ctl_chat_active *a)
{
    if (a == NULL)
        return;
    pthread_mutex_destroy(&a->mu);
    free(a);
}

struct ctl_chat_turn {
    ctl_app *app;                 /* app */
    ctl_openai_req *r;            /* the request */
    ctl_session_hdrs hdrs;        /* parsed headers */
    char key[CTL_SESSION_KEY_SIZE]; /* session key */
    ctl_session_request sreq;     /* for validate */
    ctl_session_request creq;     /* for commit: the delta as the prompt */
    ctl_session_result cres;      /* for commit: reuse already applied */
    int32_t *delta;               /* tokens fed this turn, owned */
    size_t n_delta;               /* entries */
    int32_t *full_prompt;         /* the full rendered prompt, owned */
    size_t n_full;                /* entries */
    ctl_session_result res;       /* decision */
    ctl_session_binding *prev;    /* the binding continued (HIT), owned */
    ctl_slot_ref slot;            /* the parked slot taken for a HIT */
    bool have_slot;               /* slot is held by this turn */
    bool committed;               /* on_done parked the new binding */
    bool count_pending;           /* decided by the generation: see ctl_chat_decide() */
    bool fallback;                /* a hit whose parked slot was gone: resumed by the index */
    bool unlocked;                /* the session key was released */
};

static bool
ctl_chat_lock(ctl_chat_active *a, const char *key)
{
    bool ok = true;
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->n; i++) {
        if (strcmp(a->keys[i], key) == 0)
            ok = false;
    }
    if (ok && a->n < CTL_CHAT_ACTIVE_MAX)
        snprintf(a->keys[a->n++], CTL_SESSION_KEY_SIZE, "%s", key);
    else
        ok = false;
    pthread_mutex_unlock(&a->mu);
    return ok;
}

static void
ctl_chat_unlock(ctl_chat_active *a, const char *key)
{
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->n; i++) {
        if (strcmp(a->keys[i], key) == 0) {
            memmove(a->keys[i], a->keys[a->n - 1], CTL_SESSION_KEY_SIZE);
            a->n--;
            break;
        }
    }
    pthread_mutex_unlock(&a->mu);
}

static const char *
ctl_chat_hdr_get(void *ctx, const char *name)
{
    return ctl_http_req_header(ctx, name);
}

/* Loads and decodes the binding of key; NULL when none or undecodable (*bad set). */
static ctl_session_binding *
ctl_chat_load(ctl_app *app, const char *key, bool *bad)
{
    void *val = NULL;
    size_t len = 0;
    *bad = false;
    wk_err err = ctl_store_session_get(app->store, key, &val, &len, NULL);
    if (err != WK_OK) {
        *bad = err != WK_ENOENT;
        return NULL;
    }
    ctl_session_binding *b = NULL;
    wk_diag d = {{0}};
    if (ctl_session_binding_decode(val, len, &b, &d) != WK_OK) {
        wk_log_warn("session binding undecodable key=%.16s: %s", key, d.msg);
        *bad = true;
        b = NULL;
    }
    free(val);
    return b;
}

/*
 * The state-record name of a parked entry: the session key itself (64 hex),
 * or for a pre-reply snapshot ("p:" + key) "p" + the key's first 63 digits.
 */
static void
ctl_chat_record_name(const char *key, char out[CTL_STORE_NAME_MAX + 1])
{
    if (strncmp(key, CTL_CHAT_SNAP_PREFIX, 2) == 0)
        snprintf(out, CTL_STORE_NAME_MAX + 1, "p%.63s", key + 2);
    else
        snprintf(out, CTL_STORE_NAME_MAX + 1, "%.64s", key);
}

/* Deletes the spilled copy of a session, if any. */
static void
ctl_chat_forget_spill(ctl_app *app, const char *key)
{
    char name[CTL_STORE_NAME_MAX + 1];
    ctl_chat_record_name(key, name);
    wk_err err = ctl_store_state_delete(app->store, CTL_CHAT_OWNER, name, NULL, NULL);
    if (err != WK_OK && err != WK_ENOENT)
        wk_log_warn("cannot delete spilled session key=%.16s: %s", key, wk_strerror(err));
}

/* Deletes a retired session: binding and parked bytes. */
static void
ctl_chat_retire(ctl_app *app, const char *key)
{
    ctl_vm_drop(app->vm, key, false);
    ctl_chat_forget_spill(app, key);
    wk_err err = ctl_store_session_delete(app->store, key, NULL);
    if (err != WK_OK && err != WK_ENOENT)
        wk_log_warn("cannot delete session key=%.16s: %s", key, wk_strerror(err));
}

/* Stores binding b under key with ref; WK_OK on success. */
static wk_err
ctl_chat_store(ctl_app *app, const char *key, ctl_session_binding *b, const char *ref, wk_diag *d)
{
    wk_err err = ctl_session_binding_set_ref(b, ref, strlen(ref));
    uint8_t *buf = NULL;
    size_t len = 0;
    if (err == WK_OK)
        err = ctl_session_binding_encode(b, &buf, &len, d);
    if (err == WK_OK)
        err = ctl_store_session_put(app->store, key, buf, len, d);
    free(buf);
    return err;
}

/* The served model's fingerprint from a ready worker. */
static wk_err
ctl_chat_fingerprint(ctl_app *app, char fp[WK_SHA256_HEX_LEN])
{
    ctl_worker_view v;
    wk_err err = ctl_pool_model_view(app->pool, &v);
    if (err == WK_OK)
        snprintf(fp, WK_SHA256_HEX_LEN, "%s", v.fingerprint);
    return err;
}

wk_err
ctl_chat_spill(void *arg, const char *key, const void *bytes, size_t len, wk_diag *d)
{
    ctl_app *app = arg;
    bool bad = false;
    ctl_session_binding *b = ctl_chat_load(app, key, &bad);
    if (b == NULL)
        return wk_diag_set(d, WK_ENOENT, "session binding gone");
    /*
     * The bytes become a state record (owner __sessions, name = key), so the
     * store's blob collection keeps them; the previous spill is replaced.
     */
    size_t n = 0;
    const int32_t *ids = ctl_session_binding_retained(b, &n);
    ctl_store_state st;
    memset(&st, 0, sizeof(st));
    snprintf(st.owner, sizeof(st.owner), "%s", CTL_CHAT_OWNER);
    ctl_chat_record_name(key, st.name);
    {
        ctl_worker_view v;
        if (ctl_pool_model_view(app->pool, &v) == WK_OK && v.family[0] != '\0')
            snprintf(st.family, sizeof(st.family), "%s", v.family);
        else
            snprintf(st.family, sizeof(st.family), "rwkv7");
    }
    st.tokens = (int32_t *)ids;
    st.n_tokens = n;
    st.op = CTL_STORE_OP_SESSION;
    st.tier = CTL_STORE_TIER_COLD;
    st.state_bytes = len;
    wk_err err = ctl_chat_fingerprint(app, st.fingerprint);
    if (err == WK_OK) {
        ctl_chat_forget_spill(app, key);
        err = ctl_store_state_put(app->store, &st, bytes, len, NULL, d);
    }
    if (err == WK_OK)
        err = ctl_chat_store(app, key, b, CTL_CHAT_REF_SPILLED, d);
    ctl_session_binding_free(b);
    return err;
}

static void
ctl_chat_count(ctl_app *app, const ctl_session_result *res)
{
    char lb[128];
    switch (res->outcome) {
    case CTL_SESSION_OUTCOME_HIT:
        ctl_metrics_add(app->metrics, "wkvm_parent_bound_continuation_hits_total", NULL, 1);
        ctl_ckpt_count_hit(app->ckpt, CTL_CKPT_HIT_PARENT_BOUND, res->reused_tokens);
        break;
    case CTL_SESSION_OUTCOME_MISS:
        ctl_metrics_add(app->metrics, "wkvm_parent_bound_continuation_misses_total", NULL, 1);
        break;
    case CTL_SESSION_OUTCOME_REJECTED:
        snprintf(lb, sizeof(lb), "reason=\"%s\"", ctl_session_reason_str(res->reason));
        ctl_metrics_add(app->metrics, "wkvm_parent_bound_continuation_rejections_total", lb, 1);
        break;
    case CTL_SESSION_OUTCOME_PREFIX_HIT:
        ctl_metrics_add(app->metrics, "wkvm_chat_exact_prefix_reuse_hits_total", NULL, 1);
        ctl_ckpt_count_hit(app->ckpt, CTL_CKPT_HIT_PREFIX, res->reused_tokens);
        break;
    default:
        break;
    }
}

/*
 * Counts a decision the generation settled: a parent mismatch whose prompt
 * the index resumed but for its last token is a regenerate hit; a hit whose
 * parked slot was gone is a hit when the index resumed at least the retained
 * tokens (the same state), else session_unavailable (ctl_chat_on_done()).
 */
static void
ctl_chat_decide(ctl_chat_turn *t, const ctl_openai_req *r)
{
    ctl_app *app = t->app;
    if (!t->count_pending)
        return;
    size_t n_ret = 0;
    if (t->prev != NULL)
        (void)ctl_session_binding_retained(t->prev, &n_ret);
    if (t->fallback && r->out.reused && r->out.reused_tokens >= n_ret) {
        ctl_metrics_add(app->metrics,
                        t->res.outcome == CTL_SESSION_OUTCOME_HIT
                            ? "wkvm_parent_bound_continuation_hits_total"
                            : "wkvm_chat_exact_prefix_reuse_hits_total",
                        NULL, 1);
        t->count_pending = false;
    } else if (!t->fallback && r->out.reused && r->out.reuse_kind == CTL_CKPT_HIT_REGENERATE) {
        ctl_metrics_add(app->metrics, "wkvm_parent_bound_regenerate_hits_total", NULL, 1);
        t->count_pending = false;
    }
}

/* After a successful generation: build, store and park the new binding. */
static void
ctl_chat_on_done(ctl_openai_req *r, const ctl_gen_result *res, json_t *final_obj)
{
    (void)final_obj;
    ctl_chat_turn *t = r->user;
    ctl_app *app = t->app;
    /*
     * A templated reply's visible text is its content: the reasoning goes
     * out as reasoning_content and Open WebUI sends back the content alone.
     * A reply with tool calls is not parked: the next turn's history holds
     * parts the visible-history checks do not cover (ctl_chat_begin()).
     */
    char *vis = NULL;
    size_t vis_len = 0, n_calls = 0;
    if (r->wire.templated &&
        (ctl_openai_tpl_visible(r, res->text, res->text_len, &vis, &vis_len, &n_calls) != WK_OK ||
         n_calls > 0)) {
        free(vis);
        (void)ctl_resid_slot_free(app->resid, &res->slot);
        t->have_slot = false;
        ctl_chat_retire(app, t->key);
        if (t->count_pending) {
            ctl_chat_count(app, &t->res);
            t->count_pending = false;
        }
        ctl_chat_unlock(t->app->chat_active, t->key);
        t->unlocked = true;
        return;
    }
    int32_t *gen = malloc((res->n_tokens ? res->n_tokens : 1) * sizeof(*gen));
    if (gen == NULL) {
        free(vis);
        return;
    }
    for (size_t i = 0; i < res->n_tokens; i++)
        gen[i] = res->tokens[i].id;
    ctl_session_turn st = {
        .req = &t->creq,
        .res = &t->cres,
        .prev = t->prev,
        .gen_ids = gen,
        .n_gen = res->n_tokens, /* every sampled token was fed (feed_stop) */
        .visible = vis != NULL ? vis : res->text,
        .visible_len = vis != NULL ? vis_len : res->text_len,
    };
    ctl_session_binding *nb = NULL;
    wk_diag d = {{0}};
    wk_err err = ctl_session_commit(&st, &nb, &d);
    if (err == WK_OK)
        err = ctl_chat_store(app, t->key, nb, CTL_CHAT_REF_HOT, &d);
    if (err == WK_OK)
        err = ctl_vm_put_backed(app->vm, t->key, &res->slot, true,
                                r->plan.ckpt != NULL ? r->plan.ckpt->reply_ckpt : NULL, &d);
    if (err == WK_OK) {
        t->committed = true;
        t->have_slot = false;
        ctl_chat_decide(t, r);
    } else {
        wk_log_warn("session not parked key=%.16s: %s", t->key, d.msg);
        (void)ctl_resid_slot_free(app->resid, &res->slot);
        t->have_slot = false;
        ctl_chat_retire(app, t->key);
    }
    if (t->count_pending) {
        /* (counted before the reply's last bytes go out, as every other decision) */
        if (t->fallback)
            ctl_session_result_unavailable(&t->res);
        ctl_chat_count(app, &t->res);
        t->count_pending = false;
    }
    ctl_session_binding_free(nb);
    free(gen);
    free(vis);
    /*
     * The turn is parked before the reply's last bytes go out, so release
     * the session now: a client may send its next turn the moment it has
     * read the reply.
     */
    ctl_chat_unlock(t->app->chat_active, t->key);
    t->unlocked = true;
}

/*
 * Puts the parked state of cache key `key` (binding b) into *slot, moved out
 * of the cache, or loaded from the spilled state record. False when the
 * state is gone.
 */
static bool
ctl_chat_acquire(ctl_app *app, const char *key, const ctl_session_binding *b, ctl_slot_ref *slot)
{
    if (ctl_vm_take(app->vm, key, slot) == WK_OK)
        return true;
    /* The entry may have been spilled since b was read: look at the stored ref. */
    bool bad = false;
    ctl_session_binding *now = ctl_chat_load(app, key, &bad);
    size_t rl = 0;
    const char *ref = ctl_session_binding_ref(now != NULL ? now : b, &rl);
    bool spilled = ref != NULL && rl == strlen(CTL_CHAT_REF_SPILLED) &&
                   memcmp(ref, CTL_CHAT_REF_SPILLED, rl) == 0;
    ctl_session_binding_free(now);
    if (!spilled)
        return false;
    char name[CTL_STORE_NAME_MAX + 1], fp[WK_SHA256_HEX_LEN] = "";
    ctl_chat_record_name(key, name);
    ctl_store_state sp;
    memset(&sp, 0, sizeof(sp));
    bool ok = false;
    if (ctl_store_state_get(app->store, CTL_CHAT_OWNER, name, &sp, NULL) == WK_OK &&
        ctl_chat_fingerprint(app, fp) == WK_OK && strcmp(fp, sp.fingerprint) == 0 &&
        ctl_vm_slot_get(app->vm, NULL, slot, NULL) == WK_OK) {
        ok = ctl_vm_load_into(app->vm, NULL, sp.blob, slot, NULL) == WK_OK;
        if (ok) /* a spilled session holds every token it retained */
            ctl_resid_slot_note_ctx(app->resid, slot, sp.n_tokens);
        else
            (void)ctl_resid_slot_free(app->resid, slot);
    }
    ctl_store_state_fini(&sp);
    return ok;
}

/*
 * Settles a validated turn's outcome: on a hit takes the parked state into
 * t->slot (or, when it is gone and the prefix index is on, marks the turn a
 * checkpoint fallback; otherwise the session is unavailable); counts the
 * outcome, or leaves it pending for ctl_chat_on_done(); retires the binding
 * when the outcome says so. Returns true when the turn continues the parked
 * session (its retained tokens are not fed again).
 */
static bool
ctl_chat_settle(ctl_app *app, ctl_chat_turn *t)
{
    bool hit = t->res.outcome == CTL_SESSION_OUTCOME_HIT ||
               t->res.outcome == CTL_SESSION_OUTCOME_PREFIX_HIT;
    if (hit) {
        t->have_slot = ctl_chat_acquire(app, t->key, t->prev, &t->slot);
        if (!t->have_slot && app->ckpt != NULL && t->r->wire.cache &&
            ctl_ckpt_get_config(app->ckpt).enabled) {
            /*
             * The parked slot is gone (evicted and not spilled yet, a worker
             * restart): the turn's end-of-reply checkpoint holds the same state.
             * The whole prompt goes to the prefix index; the turn counts as a
             * hit when it resumed at least the retained tokens.
             */
            t->fallback = true;
        } else if (!t->have_slot) {
            ctl_session_result_unavailable(&t->res);
            hit = false;
        }
    }
    /*
     * A contract request rejected for its parent whose prompt repeats the
     * previous one (a regenerate: same user message and parent, a new
     * assistant id) is counted as a regenerate hit when the prefix index
     * resumes that prompt, as before the index existed; any other rejection
     * as the rejection it is.
     */
    if ((t->res.outcome == CTL_SESSION_OUTCOME_REJECTED &&
         t->res.reason == CTL_SESSION_REASON_PARENT_MESSAGE_MISMATCH) ||
        t->fallback)
        t->count_pending = true;
    else
        ctl_chat_count(app, &t->res);
    if (t->res.retire || !hit) {
        ctl_chat_retire(app, t->key);
        if (!hit) {
            ctl_session_binding_free(t->prev);
            t->prev = NULL;
        }
    }
    wk_log_debug("session key=%.16s outcome=%s reason=%s reused=%zu", t->key,
                 ctl_session_outcome_str(t->res.outcome), ctl_session_reason_str(t->res.reason),
                 t->res.reused_tokens);
    return hit;
}

/*
 * What the turn feeds, into t->delta. A hit feeds only what the parked
 * state lacks: the text after the parked reply, encoded as the continuation
 * of the text before it (the retained tokens stay exactly as generated;
 * hf-spm puts no "\u2581" in front of it mid-text). Anything else feeds the
 * prompt as the OpenAI route built it (a reply record's exact tokens where
 * one matches), and the prefix index resumes its longest checkpoint: never
 * a full recompute while one exists. Returns WK_OK, WK_ENOMEM or the
 * tokenizer's error (detail in d).
 */
static wk_err
ctl_chat_delta_make(ctl_app *app, ctl_chat_turn *t, bool hit, wk_diag *d)
{
    wk_err err;
    if (hit) {
        err = wk_tok_encode_continue(app->tok, t->r->wire.prompt_text, t->r->wire.prompt_len,
                                     t->res.reused_bytes, &t->delta, &t->n_delta, d);
    } else {
        t->delta = malloc((t->n_full ? t->n_full : 1) * sizeof(*t->delta));
        err = t->delta ? WK_OK : WK_ENOMEM;
        if (err == WK_OK && t->n_full)
            memcpy(t->delta, t->full_prompt, t->n_full * sizeof(*t->delta));
        t->n_delta = t->n_full;
    }
    return err;
}

/*
 * Points the generation request at the turn: its prompt becomes the delta
 * (after the retained tokens on a checkpoint fallback), the reported prompt
 * length and the checks of the completed turn follow, and on a hit the
 * parked slot is resumed with the retained tokens as the plan's prefix.
 * False when out of memory.
 */
static bool
ctl_chat_request_set(ctl_app *app, ctl_chat_turn *t, bool hit)
{
    ctl_openai_req *r = t->r;
    size_t n_ret = 0;
    const int32_t *ret = t->fallback ? ctl_session_binding_retained(t->prev, &n_ret) : NULL;
    r->plan.n_prompt = n_ret + t->n_delta;
    r->plan.prompt = malloc(r->plan.n_prompt * sizeof(*r->plan.prompt));
    if (r->plan.prompt == NULL)
        return false;
    if (n_ret)
        memcpy(r->plan.prompt, ret, n_ret * sizeof(*r->plan.prompt));
    memcpy(r->plan.prompt + n_ret, t->delta, t->n_delta * sizeof(*r->plan.prompt));
    if (t->fallback) {
        r->plan.aligned_tokens = n_ret;
        r->plan.n_bounds = 0;
    }
    r->plan.n_prompt_report =
        t->fallback ? r->plan.n_prompt : (hit ? t->res.reused_tokens : 0) + t->n_delta;
    t->creq = t->sreq;
    t->creq.prompt_ids = t->delta;
    t->creq.n_prompt = t->n_delta;
    t->cres = t->res;
    t->cres.reused_tokens = 0;
    r->plan.gen.slot = t->have_slot ? &t->slot : NULL;
    if (hit && t->have_slot) {
        size_t nr = 0;
        r->plan.plan_prefix = ctl_session_binding_retained(t->prev, &nr);
        r->plan.n_plan_prefix = nr;
        r->plan.n_bounds = 0; /* where the new messages end, in the delta */
        ctl_openai_chat_bounds(app->tok, r, t->res.reused_bytes, t->delta, t->n_delta, 0);
        r->plan.aligned_tokens = 0;
    }
    r->plan.gen.fresh = false;
    r->plan.gen.keep_slot = true;
    r->plan.gen.feed_stop = true;
    return true;
}

/* ctl_session_request.align for a templated chat: ctl_openai_tpl_align() on the turn's request. */
static bool
ctl_chat_tpl_align(void *ctx, const int32_t *retained, size_t n, size_t k, size_t *off)
{
    const ctl_chat_turn *t = ctx;
    return ctl_openai_tpl_align(t->app, t->r, retained, n, k, off);
}

bool
ctl_chat_begin(ctl_http_req *req, ctl_app *app, ctl_openai_req *r, ctl_chat_turn **turn)
{
    *turn = NULL;
    ctl_session_hdrs hdrs;
    wk_diag d = {{0}};
    /*
     * Open WebUI's background tasks (title, tags, follow-ups) carry the chat
     * headers too; with `X-WKVM-Task: {{TASK}}` configured they say so, and
     * are served without touching the session.
     */
    const char *task = ctl_http_req_header(req, "X-WKVM-Task");
    if (task != NULL && task[strspn(task, " \t")] != '\0')
        return true;
    if (ctl_session_headers_parse(ctl_chat_hdr_get, req, &hdrs, &d) != WK_OK) {
        ctl_http_send_error(req, WK_EINVAL, d.msg, NULL);
        return false;
    }
    if (ctl_session_hdrs_mode(&hdrs) == CTL_SESSION_MODE_NONE)
        return true;
    /*
     * A model's own template renders history its own way (Qwen3.5 drops old
     * reasoning): parent-token-v1 holds where the visible history is the
     * messages' texts (no tool calls or results, whose parts the digests do
     * not cover), aligned by the template (ctl_openai_tpl_align); other
     * templated chats, and the exact-prefix mode (its token rule assumes the
     * World template), are served by the prefix index alone: the longest
     * checkpoint that is a prefix of the prompt, never a wrong state.
     */
    if (r->wire.templated && (ctl_session_hdrs_mode(&hdrs) != CTL_SESSION_MODE_PARENT_TOKEN ||
                         !ctl_openai_tpl_plain(r)))
        return true;
    ctl_chat_turn *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        ctl_http_send_error(req, WK_ENOMEM, "out of memory", NULL);
        return false;
    }
    t->app = app;
    t->r = r;
    t->hdrs = hdrs;
    if (ctl_session_key(app->model_id, ctl_http_req_user(req), &hdrs, t->key, &d) != WK_OK) {
        ctl_http_send_error(req, WK_EINVAL, d.msg, NULL);
        free(t);
        return false;
    }
    if (!ctl_chat_lock(app->chat_active, t->key)) {
        ctl_http_send_error_status(req, 409, WK_EBUSY,
                                   "another turn of this chat session is still running",
                                   "session_busy");
        free(t);
        return false;
    }
    /* The full prompt is what r carries now; keep it for the session checks. */
    t->full_prompt = r->plan.prompt;
    t->n_full = r->plan.n_prompt;
    r->plan.prompt = NULL;
    r->plan.n_prompt = 0;
    t->sreq = (ctl_session_request){.hdrs = &t->hdrs,
                                    .msgs = r->wire.msgs,
                                    .n_msgs = r->wire.n_msgs,
                                    .prompt_ids = t->full_prompt,
                                    .n_prompt = t->n_full,
                                    .tok = app->tok,
                                    .prompt_text = r->wire.prompt_text,
                                    .prompt_len = r->wire.prompt_len,
                                    .align = r->wire.templated ? ctl_chat_tpl_align : NULL,
                                    .align_ctx = t};
    bool bad = false;
    t->prev = ctl_chat_load(app, t->key, &bad);
    if (ctl_session_validate(&t->sreq, t->prev, &t->res, &d) != WK_OK) {
        ctl_http_send_error(req, WK_EINVAL, d.msg, "messages");
        ctl_chat_end(t);
        return false;
    }
    if (bad)
        ctl_session_result_unavailable(&t->res);
    bool hit = ctl_chat_settle(app, t);
    wk_err err = ctl_chat_delta_make(app, t, hit, &d);
    if (err != WK_OK || t->n_delta == 0) {
        ctl_http_send_error(req, err != WK_OK ? err : WK_EINVAL,
                            err != WK_OK ? d.msg : "nothing new to generate from", "messages");
        ctl_chat_end(t);
        return false;
    }
    if (!ctl_chat_request_set(app, t, hit)) {
        ctl_http_send_error(req, WK_ENOMEM, "out of memory", NULL);
        ctl_chat_end(t);
        return false;
    }
    r->user = t;
    r->on_done = ctl_chat_on_done;
    *turn = t;
    return true;
}

void
ctl_chat_end(ctl_chat_turn *t)
{
    if (t == NULL)
        return;
    ctl_app *app = t->app;
    if (t->count_pending) {
        if (t->fallback)
            ctl_session_result_unavailable(&t->res);
        ctl_chat_count(app, &t->res);
    }
    if (!t->committed) {
        /* No committed turn: the parked state (if any was taken) moved on; retire it. */
        if (t->have_slot)
            (void)ctl_resid_slot_free(app->resid, &t->slot);
        if (t->prev != NULL)
            ctl_chat_retire(app, t->key);
    }
    ctl_session_binding_free(t->prev);
    free(t->full_prompt);
    free(t->delta);
    if (!t->unlocked)
        ctl_chat_unlock(t->app->chat_active, t->key);
    free(t);
}

wk_err
ctl_chat_metrics_declare(ctl_metrics *m)
{
    static const struct {
        const char *name;
        ctl_metric_type type;
        const char *help;
    } fams[] = {
        {"wkvm_parent_bound_continuation_hits_total", CTL_METRIC_COUNTER,
         "Chat turns that continued their parked state (parent-token-v1)."},
        {"wkvm_parent_bound_continuation_misses_total", CTL_METRIC_COUNTER,
         "Follow-up turns with no parked session."},
        {"wkvm_parent_bound_continuation_rejections_total", CTL_METRIC_COUNTER,
         "Follow-up turns whose binding failed a check, by reason."},
        {"wkvm_parent_bound_regenerate_hits_total", CTL_METRIC_COUNTER,
         "parent-token-v1 regenerates that resumed the previous prompt's checkpoint."},
        {"wkvm_chat_exact_prefix_reuse_hits_total", CTL_METRIC_COUNTER,
         "Chat turns without the contract that continued by exact prefix."},
        {"wkvm_prefix_tokens_reused_total", CTL_METRIC_COUNTER,
         "Prompt tokens not recomputed thanks to a parked state."},
        {"wkvm_sessions", CTL_METRIC_GAUGE, "Parked chat sessions by tier."},
        {"wkvm_states_hot", CTL_METRIC_GAUGE, "Durable states cached hot in worker slots."},
    };
    for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++) {
        wk_err err = ctl_metrics_declare(m, fams[i].name, fams[i].type, fams[i].help, NULL, 0);
        if (err != WK_OK)
            return err;
    }
    /* Every rejection reason shows from the start, at 0. */
    for (unsigned r = CTL_SESSION_REASON_NONE + 1; r < CTL_SESSION_REASON__COUNT; r++) {
        char lb[128];
        snprintf(lb, sizeof(lb), "reason=\"%s\"", ctl_session_reason_str((ctl_session_reason)r));
        ctl_metrics_add(m, "wkvm_parent_bound_continuation_rejections_total", lb, 0);
    }
    return WK_OK;
}
