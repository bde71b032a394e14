/*
 * ctl_states: the Durable State API (/v1/states) and the admin state list.
 *
 * A state is an immutable version `name@version` of an owner: token ids and
 * the recurrent state bytes after all tokens but the last (the last token is
 * fed first by a generation, so its logits never need storing). Its bytes
 * are a content-addressed blob written before its record (write-through),
 * so every listed state survives a controller restart; a worker slot may
 * hold the blob's bytes as a hot cache entry (ctl_vm). A generation copies
 * the state into a scratch slot, so the source never changes.
 * Users only ever see their own states: lookups are keyed by the owner.
 */
#define WK_LOG_MODULE "states"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl_app.h"
#include "ctl_err.h"
#include "ctl_kv.h"
#include "ctl_openai.h"
#include "ctl_route_parse.h"
#include "ctl_statefile.h"
#include "ctl_store.h"
#include "ctl_vm.h"
#include "wk_json.h"
#include "wk_log.h"
#include "wk_sha256.h"

/* Marks a state whose blob failed verification; logs once. */
static void
ctl_states_mark_damaged(ctl_app *app, const char *owner, const char *id, const wk_diag *why)
{
    ctl_store_update u = {.set = CTL_STORE_SET_DAMAGED, .damaged = true};
    wk_diag d = {{0}};
    if (ctl_store_state_update(app->store, owner, id, &u, &d) != WK_OK)
        wk_log_warn("cannot mark state damaged id=%s: %s", id, d.msg);
    wk_log_error("state damaged id=%s owner=%s: %s", id, owner, why->msg);
}

/* The served model as a ready worker reports it. WK_EUNAVAIL when none. */
static wk_err
ctl_states_model_view(ctl_app *app, ctl_worker_view *out)
{
    return ctl_pool_model_view(app->pool, out);
}

/* The served model's fingerprint (from a ready worker). WK_EUNAVAIL when none. */
static wk_err
ctl_states_model(ctl_app *app, char fp[WK_SHA256_HEX_LEN], uint64_t *state_bytes)
{
    ctl_worker_view v;
    wk_err err = ctl_pool_model_view(app->pool, &v);
    if (err != WK_OK)
        return err;
    snprintf(fp, WK_SHA256_HEX_LEN, "%s", v.fingerprint);
    if (state_bytes != NULL)
        *state_bytes = v.state_bytes;
    return WK_OK;
}

static json_t *
ctl_states_json(ctl_app *app, const ctl_store_state *st)
{
    bool hot = st->blob[0] && ctl_vm_cached(app->vm, st->blob);
    char wbuf[65];
    bool warm = !hot && st->blob[0] && ctl_vm_warm_worker(app->vm, st->blob, wbuf, sizeof(wbuf));
    return json_pack("{s:s, s:s, s:s, s:I, s:I, s:s, s:s, s:I, s:s, s:s, s:b, s:I, s:s}", "id",
                     st->id, "object", "state", "name", st->name, "version",
                     (json_int_t)st->version, "tokens", (json_int_t)st->n_tokens, "model",
                     app->model_id ? app->model_id : "", "tier",
                     hot ? "hot" : warm ? "warm" : "cold",
                     "created", (json_int_t)(st->created_ms / 1000), "parent", st->parent, "op",
                     ctl_store_op_name(st->op), "damaged", st->damaged, "state_bytes",
                     (json_int_t)st->state_bytes, "fingerprint", st->fingerprint);
}

/* Sends err with the store's diag; maps store codes to API statuses. */
static void
ctl_states_fail(ctl_http_req *req, wk_err err, const wk_diag *d)
{
    ctl_http_send_error(req, err, d->msg[0] ? d->msg : wk_strerror(err), NULL);
}

/*
 * The per-user state quota: WK_EQUOTA (429 quota_exceeded) when owner
 * already stores max_states_per_user versions or adding more would pass it.
 * A check, not a reservation: concurrent creations by one user may overshoot
 * by at most the number of them in flight.
 */
static wk_err
ctl_states_quota(ctl_app *app, const char *owner, uint64_t adding, wk_diag *d)
{
    if (app->max_states_per_user == 0)
        return WK_OK;
    uint64_t n = 0;
    wk_err err = ctl_store_state_count(app->store, owner, &n, d);
    if (err != WK_OK)
        return err;
    if (n + adding <= app->max_states_per_user)
        return WK_OK;
    ctl_metrics_add(app->metrics, "wkvm_quota_refusals_total", "limit=\"states\"", 1);
    return wk_diag_set(d, WK_EQUOTA, "state quota exceeded: %llu state versions stored, the "
                       "limit is %llu per user; delete some first", (unsigned long long)n,
                       (unsigned long long)app->max_states_per_user);
}

/* Feeds n tokens into a held slot (fresh: zeroed first); waits until done. */
static wk_err
ctl_states_prefill(ctl_app *app, const ctl_slot_ref *slot, const int32_t *tokens, size_t n,
                   bool fresh, wk_diag *d)
{
    if (n == 0)
        return fresh ? ctl_vm_slot_reset(app->vm, slot, d) : WK_OK;
    ctl_job_spec spec = {.tokens = tokens, .n_tokens = n, .sample = false, .slot = slot,
                         .fresh = fresh};
    ctl_job *job = NULL;
    wk_err err = ctl_sched_submit(app->sched, &spec, &job, d);
    if (err != WK_OK)
        return err;
    for (;;) {
        ctl_job_event ev;
        if (ctl_job_next(job, 1000, &ev) == WK_ETIMEDOUT)
            continue;
        if (ev.type == CTL_JOB_EV_ERROR)
            err = wk_diag_set(d, ev.err, "%s", ev.message);
        if (ev.type != CTL_JOB_EV_TOKEN)
            break;
    }
    ctl_job_free(job);
    return err;
}

/*
 * Stores the bytes of slot as a new version of (owner, name) with tokens;
 * the slot becomes the hot cache entry of the blob (consumed on success).
 */
static wk_err
ctl_states_save(ctl_app *app, const char *owner, const char *name, const int32_t *tokens,
                size_t n, ctl_store_op op, const char *parent, const ctl_slot_ref *slot,
                ctl_store_state *out, wk_diag *d)
{
    char fp[WK_SHA256_HEX_LEN];
    wk_err err = ctl_states_model(app, fp, NULL);
    if (err != WK_OK)
        return wk_diag_set(d, err, "no worker has the model loaded");
    void *bytes = NULL;
    size_t len = 0;
    err = ctl_vm_slot_read(app->vm, slot, &bytes, &len, d);
    if (err != WK_OK)
        return err;
    ctl_store_state st;
    memset(&st, 0, sizeof(st));
    snprintf(st.owner, sizeof(st.owner), "%s", owner);
    snprintf(st.name, sizeof(st.name), "%s", name);
    snprintf(st.fingerprint, sizeof(st.fingerprint), "%s", fp);
    {
        ctl_worker_view v;
        if (ctl_states_model_view(app, &v) == WK_OK && v.family[0] != '\0')
            snprintf(st.family, sizeof(st.family), "%s", v.family);
        else
            snprintf(st.family, sizeof(st.family), "rwkv7");
    }
    snprintf(st.parent, sizeof(st.parent), "%s", parent ? parent : "");
    st.tokens = (int32_t *)tokens;
    st.n_tokens = n;
    st.op = op;
    st.tier = CTL_STORE_TIER_COLD;
    st.state_bytes = len;
    err = ctl_store_blob_put(app->store, bytes, len, st.blob, d);
    if (err == WK_OK) {
        st.blob_bytes = len;
        uint64_t version = 0;
        err = ctl_store_state_put(app->store, &st, NULL, 0, &version, d);
        if (err == WK_OK) {
            char ref[CTL_STORE_ID_MAX + 1];
            snprintf(ref, sizeof(ref), "%s@%llu", name, (unsigned long long)version);
            err = ctl_store_state_get(app->store, owner, ref, out, d);
        }
    }
    if (err == WK_OK && ctl_vm_put(app->vm, out->blob, slot, false, NULL) != WK_OK)
        (void)ctl_resid_slot_free(app->resid, slot);
    free(bytes);
    return err;
}

static void
ctl_states_create(ctl_http_req *req, ctl_app *app)
{
    json_t *body = ctl_openai_body(req);
    if (body == NULL)
        return;
    wk_diag d = {{0}};
    ctl_slot_ref slot;
    memset(&slot, 0, sizeof(slot));
    bool have_slot = false;
    ctl_store_state st;
    memset(&st, 0, sizeof(st));
    ctl_states_create_body cb;
    ctl_openai_perr pe;
    if (!ctl_states_parse_create(app, body, &cb, &pe)) {
        ctl_openai_send_perr(req, &pe);
        goto out;
    }
    const char *name = cb.name;
    const int32_t *ids = cb.ids;
    size_t n = cb.n_ids;
    wk_err err = ctl_states_quota(app, ctl_http_req_user(req), 1, &d);
    if (err == WK_OK)
        err = ctl_vm_slot_get(app->vm, NULL, &slot, &d);
    if (err == WK_OK) {
        have_slot = true;
        err = ctl_states_prefill(app, &slot, ids, n - 1, true, &d);
    }
    if (err == WK_OK)
        err = ctl_states_save(app, ctl_http_req_user(req), name, ids, n, CTL_STORE_OP_CREATE,
                              NULL, &slot, &st, &d);
    if (err != WK_OK) {
        if (have_slot)
            (void)ctl_resid_slot_free(app->resid, &slot);
        ctl_states_fail(req, err, &d);
        goto out;
    }
    wk_log_info("state created id=%s owner=%s tokens=%zu", st.id, st.owner, n);
    ctl_http_send_json(req, 201, ctl_states_json(app, &st));
out:
    ctl_store_state_fini(&st);
    ctl_states_create_body_fini(&cb);
    json_decref(body);
}

/* Context of a state generation. */
typedef struct ctl_states_gen {
    ctl_app *app;             /* app */
    const char *owner;        /* user */
    ctl_store_state *src;     /* source state */
    const char *save_as;      /* name to save under, NULL = none */
    const int32_t *q;         /* new prompt tokens */
    size_t n_q;               /* entries */
    ctl_slot_ref slot;        /* scratch slot */
    bool consumed;            /* the slot became a cache entry */
} ctl_states_gen;

static void
ctl_states_gen_done(ctl_openai_req *r, const ctl_gen_result *res, json_t *final_obj)
{
    ctl_states_gen *g = r->user;
    if (g->save_as == NULL)
        return;
    /* New tokens: source + prompt + every sampled id (the last one is pending). */
    size_t n = g->src->n_tokens + g->n_q + res->n_tokens;
    int32_t *ids = malloc(n * sizeof(*ids));
    wk_diag d = {{0}};
    ctl_store_state st;
    memset(&st, 0, sizeof(st));
    wk_err err = ids ? WK_OK : WK_ENOMEM;
    if (err == WK_OK) {
        memcpy(ids, g->src->tokens, g->src->n_tokens * sizeof(*ids));
        memcpy(ids + g->src->n_tokens, g->q, g->n_q * sizeof(*ids));
        for (size_t i = 0; i < res->n_tokens; i++)
            ids[g->src->n_tokens + g->n_q + i] = res->tokens[i].id;
        err = ctl_states_save(g->app, g->owner, g->save_as, ids, n, CTL_STORE_OP_GENERATE,
                              g->src->id, &g->slot, &st, &d);
    }
    if (err == WK_OK) {
        g->consumed = true;
        wk_log_info("state saved id=%s owner=%s from=%s tokens=%zu", st.id, st.owner, g->src->id,
                    n);
        json_object_set_new(final_obj, "state", ctl_states_json(g->app, &st));
    } else {
        char *e = ctl_err_body(err, d.msg, "save_as");
        json_object_set_new(final_obj, "state_error", e ? json_loads(e, 0, NULL) : json_null());
        free(e);
    }
    ctl_store_state_fini(&st);
    free(ids);
}

static void
ctl_states_generate(ctl_http_req *req, ctl_app *app, const char *ref)
{
    json_t *body = ctl_openai_body(req);
    if (body == NULL)
        return;
    wk_diag d = {{0}};
    ctl_store_state src;
    memset(&src, 0, sizeof(src));
    ctl_openai_req r = {.wire.chat = false, .wire.model_optional = true,
                        .route = "/v1/states/{id}/generate"};
    ctl_states_gen g = {.app = app, .owner = ctl_http_req_user(req), .src = &src};
    ctl_states_gen_body gb = {0};
    bool have_slot = false;
    wk_err err = ctl_store_state_get(app->store, g.owner, ref, &src, &d);
    if (err != WK_OK) {
        ctl_states_fail(req, err, &d);
        goto out;
    }
    char fp[WK_SHA256_HEX_LEN];
    if (ctl_states_model(app, fp, NULL) == WK_OK && strcmp(fp, src.fingerprint) != 0) {
        ctl_http_send_error(req, WK_ESTATE, "the state was made by another model", NULL);
        goto out;
    }
    ctl_openai_perr pe;
    ctl_openai_owner(req, r.plan.owner);
    /* (refusals in this order: save_as, the owner's quota, the rest of the body) */
    if (!ctl_states_parse_generate_save_as(body, &gb, &pe)) {
        ctl_openai_send_perr(req, &pe);
        goto out;
    }
    g.save_as = gb.save_as;
    if (gb.save_as != NULL && (err = ctl_states_quota(app, g.owner, 1, &d)) != WK_OK) {
        ctl_states_fail(req, err, &d);
        goto out;
    }
    if (!ctl_states_parse_generate_rest(app, body, &gb, &r, &pe)) {
        ctl_openai_send_perr(req, &pe);
        goto out;
    }
    const int32_t *q = gb.q;
    size_t nq = gb.n_q;
    g.q = q;
    g.n_q = nq;
    r.plan.n_prompt = 1 + nq;
    r.plan.prompt = malloc(r.plan.n_prompt * sizeof(*r.plan.prompt));
    if (r.plan.prompt == NULL || src.n_tokens == 0) {
        ctl_http_send_error(req, WK_ENOMEM, "out of memory", NULL);
        goto out;
    }
    r.plan.prompt[0] = src.tokens[src.n_tokens - 1];
    if (nq)
        memcpy(r.plan.prompt + 1, q, nq * sizeof(*q));
    r.plan.n_prompt_report = src.n_tokens + nq;
    char wbuf[65];
    const char *near = ctl_vm_cached(app->vm, src.blob)
                           ? NULL
                           : ctl_vm_warm_worker(app->vm, src.blob, wbuf, sizeof(wbuf));
    /*
     * A worker that dies between the slot's allocation and the load fails the
     * load with WK_EUNAVAIL: take a slot elsewhere (the scheduler has dropped
     * the dead worker by then) and load from the blob; a few times at most.
     */
    for (int attempt = 0; attempt < 3; attempt++) {
        if (attempt > 0) {
            (void)ctl_resid_slot_free(app->resid, &g.slot);
            have_slot = false;
            near = NULL;
            struct timespec nap = {0, 50 * 1000000L};
            nanosleep(&nap, NULL);
        }
        err = ctl_vm_slot_get(app->vm, near, &g.slot, &d);
        if (err != WK_OK)
            break;
        have_slot = true;
        err = ctl_vm_load_into(app->vm, src.blob, src.blob, &g.slot, &d);
        if (err != WK_EUNAVAIL)
            break;
    }
    if (err == WK_OK) /* a state holds all its tokens but the last, fed first below */
        ctl_resid_slot_note_ctx(app->resid, &g.slot, src.n_tokens ? src.n_tokens - 1 : 0);
    if (err == WK_ECORRUPT)
        ctl_states_mark_damaged(app, g.owner, src.id, &d);
    if (err != WK_OK) {
        ctl_states_fail(req, err, &d);
        goto out;
    }
    r.plan.gen.slot = &g.slot;
    r.plan.gen.fresh = false;
    r.plan.gen.sample_index = 0;
    r.user = &g;
    r.on_done = ctl_states_gen_done;
    ctl_openai_generate(req, app, &r);
out:
    if (have_slot && !g.consumed)
        (void)ctl_resid_slot_free(app->resid, &g.slot);
    ctl_openai_req_fini(&r);
    ctl_states_gen_body_fini(&gb);
    ctl_store_state_fini(&src);
    json_decref(body);
}

static void
ctl_states_fork(ctl_http_req *req, ctl_app *app, const char *ref, bool snapshot)
{
    json_t *body = NULL;
    const char *owner = ctl_http_req_user(req);
    wk_diag d = {{0}};
    ctl_store_state src;
    memset(&src, 0, sizeof(src));
    const char *name = NULL;
    ctl_states_fork_body fb = {.count = 1};
    const char *buf;
    size_t len;
    if (ctl_http_req_body(req, &buf, &len) == WK_OK && len > 0) {
        body = ctl_openai_body(req);
        if (body == NULL)
            return;
    }
    wk_err err = ctl_store_state_get(app->store, owner, ref, &src, &d);
    if (err != WK_OK) {
        ctl_states_fail(req, err, &d);
        goto out;
    }
    if (!snapshot) {
        ctl_openai_perr pe;
        if (!ctl_states_parse_fork(body, &fb, &pe)) {
            ctl_openai_send_perr(req, &pe);
            goto out;
        }
        name = fb.name;
    } else {
        name = src.name;
    }
    int64_t count = fb.count;
    if (src.blob[0] == '\0' || src.damaged) {
        ctl_http_send_error(req, WK_ESTATE, "the source state's bytes are damaged", NULL);
        goto out;
    }
    if ((err = ctl_states_quota(app, owner, (uint64_t)count, &d)) != WK_OK) {
        ctl_states_fail(req, err, &d);
        goto out;
    }
    json_t *arr = json_array();
    for (int64_t i = 0; i < count; i++) {
        ctl_store_state st = src;
        st.tokens = src.tokens;
        snprintf(st.name, sizeof(st.name), "%s", name);
        snprintf(st.parent, sizeof(st.parent), "%s", src.id);
        st.op = snapshot ? CTL_STORE_OP_SNAPSHOT : CTL_STORE_OP_FORK;
        st.tier = CTL_STORE_TIER_COLD;
        st.token_digest[0] = '\0';
        st.created_ms = 0;
        st.used_ms = 0;
        uint64_t version = 0;
        err = ctl_store_state_put(app->store, &st, NULL, 0, &version, &d);
        if (err != WK_OK)
            break;
        ctl_store_state child;
        char cref[CTL_STORE_ID_MAX + 1];
        snprintf(cref, sizeof(cref), "%s@%llu", name, (unsigned long long)version);
        err = ctl_store_state_get(app->store, owner, cref, &child, &d);
        if (err != WK_OK)
            break;
        json_array_append_new(arr, ctl_states_json(app, &child));
        ctl_store_state_fini(&child);
    }
    if (err != WK_OK) {
        json_decref(arr);
        ctl_states_fail(req, err, &d);
        goto out;
    }
    wk_log_info("state %s id=%s owner=%s count=%lld name=%s", snapshot ? "snapshot" : "fork",
                src.id, owner, (long long)count, name);
    if (count == 1) {
        json_t *one = json_incref(json_array_get(arr, 0));
        json_decref(arr);
        ctl_http_send_json(req, 201, one);
    } else {
        ctl_http_send_json(req, 201, json_pack("{s:s, s:o}", "object", "list", "data", arr));
    }
out:
    ctl_store_state_fini(&src);
    json_decref(body);
}

static void
ctl_states_tier(ctl_http_req *req, ctl_app *app, const char *ref, bool resume)
{
    const char *owner = ctl_http_req_user(req);
    wk_diag d = {{0}};
    ctl_store_state st;
    wk_err err = ctl_store_state_get(app->store, owner, ref, &st, &d);
    if (err != WK_OK) {
        ctl_states_fail(req, err, &d);
        return;
    }
    if (!resume) {
        ctl_vm_hibernate(app->vm, st.blob);
    } else if (!ctl_vm_cached(app->vm, st.blob)) {
        ctl_slot_ref slot;
        char wbuf[65];
        const char *near = ctl_vm_warm_worker(app->vm, st.blob, wbuf, sizeof(wbuf));
        err = ctl_vm_slot_get(app->vm, near, &slot, &d);
        if (err == WK_OK) {
            err = ctl_vm_load_into(app->vm, st.blob, st.blob, &slot, &d);
            if (err == WK_OK) {
                ctl_resid_slot_note_ctx(app->resid, &slot, st.n_tokens ? st.n_tokens - 1 : 0);
                err = ctl_vm_put(app->vm, st.blob, &slot, false, &d);
            }
            if (err != WK_OK)
                (void)ctl_resid_slot_free(app->resid, &slot);
        }
        if (err == WK_ECORRUPT)
            ctl_states_mark_damaged(app, owner, st.id, &d);
    }
    if (err != WK_OK) {
        ctl_states_fail(req, err, &d);
    } else {
        wk_log_info("state %s id=%s owner=%s", resume ? "resumed" : "hibernated", st.id, owner);
        ctl_http_send_json(req, 200, ctl_states_json(app, &st));
    }
    ctl_store_state_fini(&st);
}

/* The state file's tensor table for a slot layout (heap array in *out). */
static wk_err
ctl_states_layout(const ctl_state_tensor *lay, uint32_t n, ctl_statefile_tensor **out,
                  uint32_t *n_out, uint64_t *state_bytes, wk_diag *d)
{
    if (n == 0 || n > CTL_STATEFILE_MAX_TENSORS)
        return wk_diag_set(d, WK_ETOOBIG, "slot layout has %u tensors (1..%u)", n,
                           CTL_STATEFILE_MAX_TENSORS);
    ctl_statefile_tensor *t = calloc(n, sizeof(*t));
    if (t == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory for %u tensors", n);
    uint64_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t elems = 1;
        snprintf(t[i].name, sizeof(t[i].name), "%s", lay[i].name);
        t[i].dtype = CTL_STATEFILE_DTYPE_F32;
        t[i].ndim = lay[i].ndim;
        for (uint32_t k = 0; k < lay[i].ndim && k < CTL_STATEFILE_MAX_DIMS; k++) {
            t[i].shape[k] = lay[i].shape[k];
            if (lay[i].shape[k] > CTL_STATEFILE_MAX_STATE_BYTES / 4 / elems) {
                free(t);
                return wk_diag_set(d, WK_ETOOBIG, "slot layout: %s is over the state limit",
                                   lay[i].name);
            }
            elems *= lay[i].shape[k];
        }
        t[i].offset = off;
        t[i].nbytes = elems * 4;
        off += t[i].nbytes;
        if (off > CTL_STATEFILE_MAX_STATE_BYTES) {
            free(t);
            return wk_diag_set(d, WK_ETOOBIG, "slot layout is over the state limit");
        }
    }
    *out = t;
    *n_out = n;
    *state_bytes = off;
    return WK_OK;
}

/* Fills a state file header for st (len state bytes); tensors owned by h (free). */
static wk_err
ctl_states_fill_hdr(ctl_app *app, const ctl_store_state *st, size_t len, ctl_statefile_hdr *h,
                    wk_diag *d)
{
    ctl_worker_view v;
    wk_err err = ctl_states_model_view(app, &v);
    if (err != WK_OK)
        return wk_diag_set(d, err, "no worker has the model loaded");
    uint64_t bytes = 0;
    ctl_state_tensor *lay = NULL;
    uint32_t n_lay = 0;
    err = ctl_pool_model_layout(app->pool, &lay, &n_lay);
    if (err == WK_OK) {
        err = ctl_states_layout(lay, n_lay, &h->tensors, &h->n_tensors, &bytes, d);
        free(lay);
    } else if (err == WK_ENOENT) { /* a worker that predates ModelInfo.state_tensors */
        err = ctl_statefile_layout_rwkv7(v.n_layer, v.n_embd, v.n_head, v.head_size, &h->tensors,
                                         &h->n_tensors, &bytes, d);
    } else {
        err = wk_diag_set(d, err, "no slot layout for the model");
    }
    if (err != WK_OK)
        return err;
    /*
     * Hybrid models: the recurrent layout is followed by the attention
     * layers' KV, token-major (workerd/backend/be.h), written as one tensor
     * "kv" [n_ctx, kv_token_bytes / 4] (docs/STATE_FORMAT.md).
     */
    ctl_kv_geom g = {.state_bytes = bytes, .kv_token_bytes = v.kv_token_bytes};
    uint64_t n_ctx = 0;
    if (ctl_kv_image_ctx(&g, len, &n_ctx) != WK_OK)
        return wk_diag_set(d, WK_ECORRUPT, "state has %zu bytes, the model's layout %llu%s", len,
                           (unsigned long long)bytes,
                           v.kv_token_bytes ? " + a multiple of its KV bytes per token" : "");
    if (n_ctx > 0) {
        if (h->n_tensors + 1 > CTL_STATEFILE_MAX_TENSORS || v.kv_token_bytes % 4 != 0)
            return wk_diag_set(d, WK_ETOOBIG, "no room for the kv tensor in the state file");
        ctl_statefile_tensor *t = realloc(h->tensors, (h->n_tensors + 1) * sizeof(*t));
        if (t == NULL)
            return wk_diag_set(d, WK_ENOMEM, "out of memory");
        h->tensors = t;
        ctl_statefile_tensor *kv = &t[h->n_tensors++];
        memset(kv, 0, sizeof(*kv));
        snprintf(kv->name, sizeof(kv->name), "kv");
        kv->dtype = CTL_STATEFILE_DTYPE_F32;
        kv->ndim = 2;
        kv->shape[0] = n_ctx;
        kv->shape[1] = v.kv_token_bytes / 4;
        kv->offset = bytes;
        kv->nbytes = n_ctx * v.kv_token_bytes;
    }
    snprintf(h->family, sizeof(h->family), "%.15s", st->family);
    snprintf(h->fingerprint, sizeof(h->fingerprint), "%s", st->fingerprint);
    snprintf(h->tokenizer_digest, sizeof(h->tokenizer_digest), "%s", wk_tok_digest(app->tok));
    snprintf(h->token_digest, sizeof(h->token_digest), "%s", st->token_digest);
    h->tokens = st->tokens;
    h->n_tokens = st->n_tokens;
    h->state_bytes = len;
    return WK_OK;
}

static void
ctl_states_export(ctl_http_req *req, ctl_app *app, const char *ref)
{
    const char *owner = ctl_http_req_user(req);
    wk_diag d = {{0}};
    ctl_store_state st;
    wk_err err = ctl_store_state_get(app->store, owner, ref, &st, &d);
    if (err != WK_OK) {
        ctl_states_fail(req, err, &d);
        return;
    }
    void *bytes = NULL, *file = NULL;
    size_t len = 0, flen = 0;
    ctl_statefile_hdr h;
    memset(&h, 0, sizeof(h));
    err = ctl_store_blob_get(app->store, st.blob, &bytes, &len, &d);
    if (err == WK_ECORRUPT)
        ctl_states_mark_damaged(app, owner, st.id, &d);
    if (err == WK_OK)
        err = ctl_states_fill_hdr(app, &st, len, &h, &d);
    if (err == WK_OK)
        err = ctl_statefile_write(&h, bytes, len, &file, &flen, &d);
    if (err != WK_OK) {
        ctl_states_fail(req, err, &d);
    } else {
        ctl_http_send(req, 200, "application/octet-stream", file, flen);
    }
    free(h.tensors); /* tokens are borrowed from st */
    free(file);
    free(bytes);
    ctl_store_state_fini(&st);
}

/*
 * Hybrid models: true (with d's message) when a state image of slen bytes
 * holds more context than the KV pool of the model's worker v can ever
 * hold; such a state could never be loaded into a slot.
 */
static bool
ctl_states_import_too_big(const ctl_worker_view *v, size_t slen, wk_diag *d)
{
    ctl_kv_geom g = {.state_bytes = v->state_bytes, .kv_token_bytes = v->kv_token_bytes,
                     .page_tokens = v->kv_page_tokens, .pages_total = v->kv_pages};
    uint64_t n_ctx = 0;
    if (!ctl_kv_hybrid(&g) || ctl_kv_image_ctx(&g, slen, &n_ctx) != WK_OK ||
        ctl_kv_pages(&g, n_ctx) <= g.pages_total)
        return false;
    wk_diag_set(d, WK_EINVAL, "the state holds %llu tokens of context, more than the KV pool "
                "of worker %s holds (%u pages of %u tokens: %llu tokens)",
                (unsigned long long)n_ctx, v->id, g.pages_total, g.page_tokens,
                (unsigned long long)g.pages_total * g.page_tokens);
    return true;
}

static void
ctl_states_import(ctl_http_req *req, ctl_app *app)
{
    const char *buf = NULL;
    size_t len = 0;
    wk_diag d = {{0}};
    wk_err err = ctl_http_req_body(req, &buf, &len);
    if (err != WK_OK) {
        ctl_http_send_error(req, err, err == WK_ETOOBIG ? "state file too large"
                                                        : "cannot read the body", NULL);
        return;
    }
    char name[CTL_STORE_NAME_MAX + 2] = "imported";
    if (ctl_http_req_query_get(req, "name", name, sizeof(name)) &&
        ctl_store_name_check(name, &d) != WK_OK) {
        ctl_http_send_error(req, WK_EINVAL, d.msg, "name");
        return;
    }
    ctl_statefile_hdr h;
    const void *state = NULL;
    size_t slen = 0;
    err = ctl_statefile_read(buf, len, &h, &state, &slen, &d);
    if (err != WK_OK) {
        char msg[600];
        snprintf(msg, sizeof(msg), "not a valid state file: %s", d.msg);
        ctl_http_send_error(req, WK_EINVAL, msg, NULL);
        return;
    }
    ctl_worker_view v;
    ctl_store_state st;
    memset(&st, 0, sizeof(st));
    if (ctl_states_model_view(app, &v) != WK_OK) {
        ctl_http_send_error(req, WK_EUNAVAIL, "no worker has the model loaded", NULL);
    } else if (strcmp(h.fingerprint, v.fingerprint) != 0) {
        char msg[300];
        snprintf(msg, sizeof(msg), "the state file is for model %.16s..., this server runs %.16s...",
                 h.fingerprint, v.fingerprint);
        ctl_http_send_error(req, WK_EINVAL, msg, NULL);
    } else if (strcmp(h.tokenizer_digest, wk_tok_digest(app->tok)) != 0) {
        ctl_http_send_error(req, WK_EINVAL, "the state file was made with another tokenizer",
                            NULL);
    } else if (ctl_kv_image_ctx(&(ctl_kv_geom){.state_bytes = v.state_bytes,
                                               .kv_token_bytes = v.kv_token_bytes},
                                slen, &(uint64_t){0}) != WK_OK ||
               h.n_tokens == 0) {
        ctl_http_send_error(req, WK_EINVAL, "the state file's size does not fit this model",
                            NULL);
    } else if (ctl_states_import_too_big(&v, slen, &d)) {
        ctl_http_send_error(req, WK_EINVAL, d.msg, NULL);
    } else if ((err = ctl_states_quota(app, ctl_http_req_user(req), 1, &d)) != WK_OK) {
        ctl_states_fail(req, err, &d);
    } else {
        snprintf(st.owner, sizeof(st.owner), "%s", ctl_http_req_user(req));
        snprintf(st.name, sizeof(st.name), "%s", name);
        snprintf(st.fingerprint, sizeof(st.fingerprint), "%s", h.fingerprint);
        snprintf(st.family, sizeof(st.family), "%s", h.family);
        st.tokens = h.tokens;
        st.n_tokens = h.n_tokens;
        st.op = CTL_STORE_OP_IMPORT;
        st.tier = CTL_STORE_TIER_COLD;
        st.state_bytes = slen;
        uint64_t version = 0;
        err = ctl_store_state_put(app->store, &st, state, slen, &version, &d);
        memset(&st, 0, sizeof(st));
        if (err == WK_OK) {
            char ref[CTL_STORE_ID_MAX + 1];
            snprintf(ref, sizeof(ref), "%s@%llu", name, (unsigned long long)version);
            err = ctl_store_state_get(app->store, ctl_http_req_user(req), ref, &st, &d);
        }
        if (err != WK_OK) {
            ctl_states_fail(req, err, &d);
        } else {
            wk_log_info("state imported id=%s owner=%s tokens=%zu bytes=%zu", st.id, st.owner,
                        st.n_tokens, (size_t)slen);
            ctl_http_send_json(req, 201, ctl_states_json(app, &st));
        }
    }
    ctl_store_state_fini(&st);
    ctl_statefile_hdr_fini(&h);
}

static void
ctl_states_send_page(ctl_http_req *req, ctl_app *app, ctl_store_page *page, bool with_owner)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < page->n; i++) {
        json_t *o = ctl_states_json(app, &page->items[i]);
        if (with_owner) { /* the admin listing: owner and blob, for audits */
            json_object_set_new(o, "owner", json_string(page->items[i].owner));
            json_object_set_new(o, "blob", json_string(page->items[i].blob));
        }
        json_array_append_new(arr, o);
    }
    json_t *body = json_pack("{s:s, s:o}", "object", "list", "data", arr);
    if (page->next[0])
        json_object_set_new(body, "next", json_string(page->next));
    ctl_http_send_json(req, 200, body);
}

/* Reads ?after=CURSOR&limit=N from the query. */
static void
ctl_states_query(ctl_http_req *req, char *cursor, size_t cap, size_t *limit)
{
    char lim[32];
    if (!ctl_http_req_query_get(req, "after", cursor, cap))
        cursor[0] = '\0';
    *limit = ctl_http_req_query_get(req, "limit", lim, sizeof(lim))
                 ? (size_t)strtoul(lim, NULL, 10)
                 : 0;
}

static void
ctl_states_list(ctl_http_req *req, ctl_app *app, const char *owner, const char *name)
{
    char cursor[CTL_STORE_CURSOR_MAX];
    size_t limit = 0;
    ctl_states_query(req, cursor, sizeof(cursor), &limit);
    ctl_store_page page;
    memset(&page, 0, sizeof(page));
    wk_diag d = {{0}};
    wk_err err = name ? ctl_store_state_versions(app->store, owner, name, cursor, limit, &page, &d)
                      : ctl_store_state_list(app->store, owner, cursor, limit, &page, &d);
    if (err != WK_OK)
        ctl_states_fail(req, err, &d);
    else
        ctl_states_send_page(req, app, &page, owner == NULL);
    ctl_store_page_fini(&page);
}

static void
ctl_states_get_one(ctl_http_req *req, ctl_app *app, const char *ref)
{
    wk_diag d = {{0}};
    ctl_store_state st;
    wk_err err = ctl_store_state_get(app->store, ctl_http_req_user(req), ref, &st, &d);
    if (err != WK_OK) {
        ctl_states_fail(req, err, &d);
        return;
    }
    json_t *o = ctl_states_json(app, &st);
    json_t *ids = json_array();
    for (size_t i = 0; i < st.n_tokens; i++)
        json_array_append_new(ids, json_integer(st.tokens[i]));
    json_object_set_new(o, "token_ids", ids);
    json_object_set_new(o, "token_digest", json_string(st.token_digest));
    ctl_http_send_json(req, 200, o);
    ctl_store_state_fini(&st);
}

static void
ctl_states_delete(ctl_http_req *req, ctl_app *app, const char *ref)
{
    wk_diag d = {{0}};
    uint64_t n = 0;
    wk_err err = ctl_store_state_delete(app->store, ctl_http_req_user(req), ref, &n, &d);
    if (err != WK_OK)
        ctl_states_fail(req, err, &d);
    else
        wk_log_info("state deleted id=%s owner=%s versions=%llu", ref, ctl_http_req_user(req),
                    (unsigned long long)n);
    if (err == WK_OK)
        ctl_http_send_json(req, 200, json_pack("{s:s, s:s, s:b, s:I}", "id", ref, "object",
                                               "state.deleted", "deleted", 1, "versions",
                                               (json_int_t)n));
}

static void
ctl_states_rollback(ctl_http_req *req, ctl_app *app, const char *ref)
{
    wk_diag d = {{0}};
    uint64_t version = 0;
    const char *owner = ctl_http_req_user(req);
    wk_err err = ctl_states_quota(app, owner, 1, &d);
    if (err == WK_OK)
        err = ctl_store_state_rollback(app->store, owner, ref, 0, &version, &d);
    ctl_store_state st;
    memset(&st, 0, sizeof(st));
    if (err == WK_OK) {
        char name[CTL_STORE_NAME_MAX + 1];
        uint64_t v = 0;
        err = ctl_store_id_parse(ref, name, &v, &d);
        if (err == WK_OK) {
            char nref[CTL_STORE_ID_MAX + 1];
            snprintf(nref, sizeof(nref), "%s@%llu", name, (unsigned long long)version);
            err = ctl_store_state_get(app->store, owner, nref, &st, &d);
        }
    }
    if (err != WK_OK) {
        ctl_states_fail(req, err, &d);
    } else {
        wk_log_info("state rollback id=%s owner=%s new=%s", ref, owner, st.id);
        ctl_http_send_json(req, 201, ctl_states_json(app, &st));
    }
    ctl_store_state_fini(&st);
}

/* Routes /v1/states, /v1/states/import, /v1/states/{id}[/{action}]. */
static void
ctl_states_route(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    const char *path = ctl_http_req_path(req) + strlen("/v1/states");
    const char *m = ctl_http_req_method(req);
    bool get = strcmp(m, "GET") == 0, post = strcmp(m, "POST") == 0;
    if (*path == '\0' || strcmp(path, "/") == 0) {
        if (get) {
            ctl_states_list(req, app, ctl_http_req_user(req), NULL);
        } else if (post) {
            if (!ctl_app_user_enter(req, app))
                return;
            ctl_states_create(req, app);
            ctl_app_user_leave(req, app);
        } else {
            ctl_http_send_error_status(req, 405, WK_EINVAL, "use GET or POST", NULL);
        }
        return;
    }
    if (*path != '/') {
        ctl_http_send_error(req, WK_ENOENT, "no such route", NULL);
        return;
    }
    path++;
    if (strcmp(path, "import") == 0) {
        if (post)
            ctl_states_import(req, app);
        else
            ctl_http_send_error_status(req, 405, WK_EINVAL, "use POST", NULL);
        return;
    }
    char ref[CTL_STORE_ID_MAX + 1];
    size_t rl = strcspn(path, "/");
    if (rl == 0 || rl > CTL_STORE_ID_MAX) {
        ctl_http_send_error(req, WK_ENOENT, "no such state", NULL);
        return;
    }
    snprintf(ref, sizeof(ref), "%.*s", (int)rl, path);
    const char *action = path[rl] == '/' ? path + rl + 1 : "";
    static const struct {
        const char *action;
        const char *method;
    } allowed[] = {{"", "GET"},          {"", "DELETE"},           {"generate", "POST"},
                   {"fork", "POST"},     {"snapshot", "POST"},     {"hibernate", "POST"},
                   {"resume", "POST"},   {"export", "GET"},        {"versions", "GET"},
                   {"rollback", "POST"}};
    bool known = false, ok = false;
    for (size_t i = 0; i < sizeof(allowed) / sizeof(allowed[0]); i++) {
        if (strcmp(allowed[i].action, action) == 0) {
            known = true;
            ok = ok || strcmp(allowed[i].method, m) == 0;
        }
    }
    if (!known) {
        ctl_http_send_error(req, WK_ENOENT, "no such state route", NULL);
        return;
    }
    if (!ok) {
        ctl_http_send_error_status(req, 405, WK_EINVAL, "method not allowed here", NULL);
        return;
    }
    if (strcmp(action, "") == 0 && get)
        ctl_states_get_one(req, app, ref);
    else if (strcmp(action, "") == 0)
        ctl_states_delete(req, app, ref);
    else if (strcmp(action, "generate") == 0 && ctl_app_user_enter(req, app)) {
        ctl_states_generate(req, app, ref);
        ctl_app_user_leave(req, app);
    } else if (strcmp(action, "generate") == 0)
        return; /* refused by the per-user limit (answered) */
    else if (strcmp(action, "fork") == 0)
        ctl_states_fork(req, app, ref, false);
    else if (strcmp(action, "snapshot") == 0)
        ctl_states_fork(req, app, ref, true);
    else if (strcmp(action, "hibernate") == 0)
        ctl_states_tier(req, app, ref, false);
    else if (strcmp(action, "resume") == 0)
        ctl_states_tier(req, app, ref, true);
    else if (strcmp(action, "export") == 0)
        ctl_states_export(req, app, ref);
    else if (strcmp(action, "versions") == 0)
        ctl_states_list(req, app, ctl_http_req_user(req), ref);
    else
        ctl_states_rollback(req, app, ref);
}

static void
ctl_states_admin_list(ctl_http_req *req, void *arg)
{
    ctl_states_list(req, arg, NULL, NULL);
}

size_t
ctl_states_routes(ctl_app *app, ctl_http_route *out, size_t cap)
{
    const ctl_http_route routes[] = {
        {NULL, "/v1/states", false, ctl_states_route, app, "/v1/states", CTL_HTTP_ACCESS_USER},
        {NULL, "/v1/states/", true, ctl_states_route, app, "/v1/states/{id}",
         CTL_HTTP_ACCESS_USER},
        {"GET", "/admin/states", false, ctl_states_admin_list, app, "/admin/states",
         CTL_HTTP_ACCESS_ADMIN},
    };
    size_t n = sizeof(routes) / sizeof(routes[0]);
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = routes[i];
    return n;
}
