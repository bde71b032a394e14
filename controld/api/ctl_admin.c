/*
 * ctl_admin: operational routes: /health (liveness), /ready (readiness with
 * the reason when not ready), /metrics (Prometheus), and the admin API's
 * worker listing. Reads the pool; never talks NNG itself.
 */
#define WK_LOG_MODULE "admin"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl_app.h"
#include "ctl_ckpt.h"
#include "ctl_cpustat.h"
#include "wk_json.h"
#include "wk_log.h"

static void
ctl_admin_health(ctl_http_req *req, void *arg)
{
    (void)arg;
    ctl_http_send_json(req, 200, json_pack("{s:s}", "status", "ok"));
}

static void
ctl_admin_ready(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    size_t ready = ctl_pool_ready_count(app->pool);
    ctl_worker_view *views = calloc(64, sizeof(*views));
    if (views == NULL) {
        ctl_http_send_error(req, WK_ENOMEM, "out of memory", NULL);
        return;
    }
    /* With a model, a worker counts once the scheduler steps on it too. */
    if (app->sched != NULL && app->model_dir != NULL) {
        size_t sched_n = ctl_sched_worker_count(app->sched);
        if (sched_n < ready)
            ready = sched_n;
    }
    size_t n = ctl_pool_list(app->pool, views, 64);
    /* Draining workers take no new request: listed, and not ready when all of them drain. */
    json_t *draining = json_array();
    size_t n_ready_views = 0;
    char dnames[200] = "";
    for (size_t i = 0; i < n && i < 64; i++) {
        if (views[i].state != CTL_WORKER_STATE_READY)
            continue;
        n_ready_views++;
        if (app->sched != NULL && ctl_sched_draining(app->sched, views[i].id)) {
            size_t dl = strlen(dnames);
            snprintf(dnames + dl, sizeof(dnames) - dl, "%s%.64s", dl ? ", " : "", views[i].id);
            json_array_append_new(draining, json_string(views[i].id));
        }
    }
    bool all_drain = n_ready_views > 0 && json_array_size(draining) == n_ready_views;
    if (ready >= app->expected_workers && !all_drain) {
        free(views);
        json_t *o = json_pack("{s:s, s:I, s:I}", "status", "ready", "workers_ready",
                              (json_int_t)ready, "workers_expected",
                              (json_int_t)app->expected_workers);
        if (o != NULL && json_array_size(draining) > 0)
            json_object_set(o, "draining", draining);
        json_decref(draining);
        ctl_http_send_json(req, 200, o);
        return;
    }
    if (ready >= app->expected_workers) {
        char why[400];
        snprintf(why, sizeof(why),
                 "every ready worker is draining (%s): new requests wait, then get 503; "
                 "undrain with POST /admin/workers/{id}/drain {\"undrain\": true} or add a worker",
                 dnames);
        free(views);
        ctl_http_send_json(req, 503,
                           json_pack("{s:s, s:s, s:I, s:I, s:o}", "status", "not_ready", "reason",
                                     why, "workers_ready", (json_int_t)ready, "workers_expected",
                                     (json_int_t)app->expected_workers, "draining", draining));
        return;
    }
    json_decref(draining);
    char reason[512];
    if (n == 0) {
        snprintf(reason, sizeof(reason), "no worker registered (expecting %u)",
                 app->expected_workers);
    } else {
        const char *why = "";
        char loading[200] = "";
        for (size_t i = 0; i < n && i < 64; i++) {
            if (views[i].state == CTL_WORKER_STATE_FAILED) {
                why = views[i].detail;
                break;
            }
            if (views[i].state == CTL_WORKER_STATE_LOADING && loading[0] == '\0')
                snprintf(loading, sizeof(loading), "; %.64s loading the model: %.31s %u%%",
                         views[i].id, views[i].load_phase[0] ? views[i].load_phase : "starting",
                         views[i].load_permille / 10);
        }
        snprintf(reason, sizeof(reason), "%zu of %u workers ready%s%.300s%s", ready,
                 app->expected_workers, why[0] ? "; model load failed: " : "", why, loading);
    }
    free(views);
    ctl_http_send_json(req, 503,
                       json_pack("{s:s, s:s, s:I, s:I}", "status", "not_ready", "reason", reason,
                                 "workers_ready", (json_int_t)ready, "workers_expected",
                                 (json_int_t)app->expected_workers));
}

/*
 * A worker's JSON. draining: the scheduler admits nothing new on it (a ready
 * worker then shows state "draining").
 */
static json_t *
ctl_admin_worker_json(const ctl_worker_view *v, bool draining)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:s, s:s, s:s, s:I, s:I, s:I, s:I}", "id",
                          v->id, "backend", v->backend, "device", v->device, "slots_total",
                          (json_int_t)v->slots_total, "slots_used", (json_int_t)v->slots_used,
                          "state",
                          draining && v->state == CTL_WORKER_STATE_READY
                              ? "draining"
                              : ctl_worker_state_name(v->state),
                          "hostname", v->hostname,
                          "detail", v->detail, "pid", (json_int_t)v->pid, "device_mem_bytes",
                          (json_int_t)v->device_mem, "steps", (json_int_t)v->steps, "tokens",
                          (json_int_t)v->tokens);
    if (o == NULL)
        return NULL;
    json_object_set_new(o, "draining", json_boolean(draining));
    /* what the migration transport choice reads (docs/OPERATIONS.md) */
    json_object_set_new(o, "nccl", json_boolean(v->nccl));
    json_object_set_new(o, "device_index", json_integer(v->device_index));
    json_object_set_new(o, "device_uuid", json_string(v->device_uuid));
    if (v->model_loaded)
        json_object_set_new(o, "model",
                            json_pack("{s:s, s:s, s:s, s:I}", "name", v->model_name, "family",
                                      v->family, "fingerprint", v->fingerprint, "state_bytes",
                                      (json_int_t)v->state_bytes));
    else
        json_object_set_new(o, "model", json_null());
    /*
     * Hybrid models: the KV pool. pages_free is what the worker reported
     * (pages no slot holds); pages_reserved what the scheduler handed out
     * (held plus reserved for running requests' final context). Absent for
     * recurrent-only models (their shape is unchanged).
     */
    if (v->model_loaded && v->kv_token_bytes > 0)
        json_object_set_new(o, "kv",
                            json_pack("{s:I, s:i, s:i, s:i, s:i}", "bytes_per_token",
                                      (json_int_t)v->kv_token_bytes, "page_tokens",
                                      (int)v->kv_page_tokens, "pages_total", (int)v->kv_pages,
                                      "pages_free", (int)v->kv_pages_free, "pages_reserved",
                                      (int)v->kv_pages_reserved));
    if (v->model_loaded && v->kv_token_bytes > 0)
        json_object_set_new(o, "kv_bytes_per_token", json_integer((json_int_t)v->kv_token_bytes));
    return o;
}

/* Lists workers with slot usage from the scheduler. Returns the count (<= cap). */
static size_t
ctl_admin_views(ctl_app *app, ctl_worker_view *views, size_t cap)
{
    size_t n = ctl_pool_list(app->pool, views, cap);
    if (n > cap)
        n = cap;
    for (size_t i = 0; app->sched != NULL && i < n; i++) {
        uint32_t used = 0, total = 0;
        ctl_resid_counts(app->resid, views[i].id, &used, &total);
        views[i].slots_used = used;
        ctl_resid_kv_counts(app->resid, views[i].id, &used, &total);
        views[i].kv_pages_reserved = used;
    }
    return n;
}

/* GET /admin: an index of every route (method, path, who may call it). */
static void
ctl_admin_index(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    static const char *const access[] = {"public", "user", "admin"};
    json_t *arr = json_array();
    for (size_t i = 0; i < app->n_routes; i++) {
        const ctl_http_route *r = &app->routes[i];
        unsigned a = (unsigned)r->access;
        json_array_append_new(arr, json_pack("{s:s, s:s, s:s}", "method",
                                             r->method ? r->method : "*", "path",
                                             r->label ? r->label : r->path, "access",
                                             a < 3 ? access[a] : "?"));
    }
    ctl_http_send_json(req, 200,
                       json_pack("{s:o, s:s}", "routes", arr, "docs",
                                 "docs/WKVMCTL.md (admin), docs/OPENAI_COMPAT.md (OpenAI)"));
}

static void
ctl_admin_workers(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    ctl_worker_view *views = calloc(256, sizeof(*views));
    if (views == NULL) {
        ctl_http_send_error(req, WK_ENOMEM, "out of memory", NULL);
        return;
    }
    size_t n = ctl_admin_views(app, views, 256);
    json_t *arr = json_array();
    for (size_t i = 0; i < n && i < 256; i++)
        json_array_append_new(arr, ctl_admin_worker_json(
                                       &views[i], app->sched != NULL &&
                                                      ctl_sched_draining(app->sched, views[i].id)));
    free(views);
    ctl_http_send_json(req, 200, json_pack("{s:o}", "workers", arr));
}

static void
ctl_admin_metrics_snapshot(ctl_app *app)
{
    ctl_metrics *m = app->metrics;
    ctl_worker_view *views = calloc(256, sizeof(*views));
    if (views == NULL)
        return;
    size_t n = ctl_admin_views(app, views, 256);
    ctl_metrics_clear(m, "wkvm_workers");
    ctl_metrics_clear(m, "wkvm_worker_up");
    ctl_metrics_clear(m, "wkvm_worker_slots_total");
    ctl_metrics_clear(m, "wkvm_worker_slots_used");
    ctl_metrics_clear(m, "wkvm_worker_draining");
    size_t by_state[4] = {0};
    uint32_t waiting = 0, running = 0;
    if (app->sched != NULL)
        ctl_sched_depths(app->sched, &waiting, &running);
    ctl_metrics_set(m, "wkvm_queue_depth", NULL, waiting);
    ctl_metrics_set(m, "wkvm_running_requests", NULL, running);
    ctl_metrics_clear(m, "wkvm_worker_slots_free");
    ctl_metrics_clear(m, "wkvm_kv_pages_free");
    ctl_metrics_clear(m, "wkvm_kv_pages_total");
    for (size_t i = 0; i < n && i < 256; i++) {
        char id[160], lb[200];
        ctl_metrics_escape(views[i].id, id, sizeof(id));
        snprintf(lb, sizeof(lb), "worker=\"%s\"", id);
        ctl_metrics_set(m, "wkvm_worker_up", lb,
                        views[i].state == CTL_WORKER_STATE_READY ? 1.0 : 0.0);
        ctl_metrics_set(m, "wkvm_worker_draining", lb,
                        app->sched != NULL && ctl_sched_draining(app->sched, views[i].id) ? 1.0
                                                                                          : 0.0);
        ctl_metrics_set(m, "wkvm_worker_slots_total", lb, views[i].slots_total);
        ctl_metrics_set(m, "wkvm_worker_slots_used", lb, views[i].slots_used);
        ctl_metrics_set(m, "wkvm_worker_slots_free", lb,
                        (double)(views[i].slots_total - views[i].slots_used));
        if (views[i].model_loaded && views[i].kv_token_bytes > 0) {
            /* free for admission: the pool minus what the scheduler holds or reserved */
            uint32_t tot = views[i].kv_pages, res = views[i].kv_pages_reserved;
            ctl_metrics_set(m, "wkvm_kv_pages_total", lb, tot);
            ctl_metrics_set(m, "wkvm_kv_pages_free", lb, res < tot ? (double)(tot - res) : 0.0);
        }
        if ((unsigned)views[i].state < 4)
            by_state[views[i].state]++;
    }
    for (int s = 0; s < 4; s++) {
        char lb[64];
        snprintf(lb, sizeof(lb), "state=\"%s\"", ctl_worker_state_name((ctl_worker_state)s));
        ctl_metrics_set(m, "wkvm_workers", lb, (double)by_state[s]);
    }
    free(views);
    if (app->vm != NULL && app->store != NULL) {
        uint32_t clean = 0, dirty = 0;
        ctl_vm_counts(app->vm, &clean, &dirty);
        uint64_t total = 0;
        char after[CTL_STORE_SESSION_KEY_MAX + 1] = "";
        for (int pages = 0; pages < 1000; pages++) {
            ctl_store_kv_page pg;
            memset(&pg, 0, sizeof(pg));
            if (ctl_store_session_list(app->store, "", after, CTL_STORE_PAGE_MAX, false, &pg,
                                       NULL) != WK_OK)
                break;
            for (size_t k = 0; k < pg.n; k++)
                total += strncmp(pg.items[k].key, "p:", 2) != 0; /* not pre-reply snapshots */
            snprintf(after, sizeof(after), "%s", pg.next);
            ctl_store_kv_page_fini(&pg);
            if (after[0] == '\0')
                break;
        }
        ctl_metrics_set(m, "wkvm_sessions", "tier=\"hot\"", dirty);
        ctl_metrics_set(m, "wkvm_sessions", "tier=\"warm\"", 0);
        ctl_metrics_set(m, "wkvm_sessions", "tier=\"cold\"",
                        total > dirty ? (double)(total - dirty) : 0.0);
        ctl_metrics_set(m, "wkvm_states_hot", NULL, clean);
    }
    ctl_pool_stats st;
    ctl_pool_stats_get(app->pool, &st);
    ctl_metrics_set(m, "wkvm_worker_registrations_total", NULL, (double)st.registrations);
    ctl_metrics_set(m, "wkvm_worker_departures_total", NULL, (double)st.departures);
    ctl_metrics_set(m, "wkvm_worker_rpc_calls_total", NULL, (double)st.rpc_calls);
    ctl_metrics_set(m, "wkvm_worker_rpc_errors_total", NULL, (double)st.rpc_errors);
    ctl_metrics_set(m, "wkvm_worker_bad_messages_total", NULL, (double)st.bad_messages);
    ctl_metrics_set(m, "wkvm_start_time_seconds", NULL, (double)app->start_ms / 1000.0);
    uint64_t by_loop = 0, by_thread = 0;
    if (app->http != NULL)
        ctl_http_stream_counts(app->http, &by_loop, &by_thread);
    ctl_metrics_set(m, "wkvm_http_streams_total", "writer=\"loop\"", (double)by_loop);
    ctl_metrics_set(m, "wkvm_http_streams_total", "writer=\"thread\"", (double)by_thread);
    double cpu[CTL_CPU_COMPONENT_COUNT];
    if (ctl_cpustat_sample(cpu) == WK_OK) {
        for (int c = 0; c < CTL_CPU_COMPONENT_COUNT; c++) {
            char lb[64];
            snprintf(lb, sizeof(lb), "component=\"%s\"",
                     ctl_cpu_component_name((ctl_cpu_component)c));
            ctl_metrics_set(m, "wkvm_controller_cpu_seconds_total", lb, cpu[c]);
        }
    }
}

static void
ctl_admin_metrics(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    ctl_admin_metrics_snapshot(app);
    char *text = NULL;
    size_t len = 0;
    if (ctl_metrics_render(app->metrics, &text, &len) != WK_OK) {
        ctl_http_send_error(req, WK_ENOMEM, "cannot render metrics", NULL);
        return;
    }
    ctl_http_send(req, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
    free(text);
}

void
ctl_admin_http_observe(const char *route, const char *method, int status, double seconds,
                       void *arg)
{
    ctl_app *app = arg;
    char r[128], lb[256];
    ctl_metrics_escape(route, r, sizeof(r));
    snprintf(lb, sizeof(lb), "route=\"%s\",method=\"%s\",code=\"%d\"", r, method, status);
    ctl_metrics_add(app->metrics, "wkvm_http_requests_total", lb, 1);
    snprintf(lb, sizeof(lb), "route=\"%s\"", r);
    ctl_metrics_observe(app->metrics, "wkvm_http_request_duration_seconds", lb, seconds);
}

wk_err
ctl_admin_metrics_declare(ctl_metrics *m)
{
    static const double lat[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                 0.5,   1,     2.5,  5,     10,   30,  60};
    static const struct {
        const char *name;
        ctl_metric_type type;
        const char *help;
    } fams[] = {
        {"wkvm_start_time_seconds", CTL_METRIC_GAUGE, "Controller start time (unix seconds)."},
        {"wkvm_http_requests_total", CTL_METRIC_COUNTER, "HTTP requests by route and status."},
        {"wkvm_http_request_duration_seconds", CTL_METRIC_HISTOGRAM,
         "HTTP request handling time by route."},
        {"wkvm_workers", CTL_METRIC_GAUGE, "Registered workers by state."},
        {"wkvm_worker_up", CTL_METRIC_GAUGE, "1 when the worker is ready, else 0."},
        {"wkvm_worker_draining", CTL_METRIC_GAUGE,
         "1 while the worker drains (admits no new request), else 0."},
        {"wkvm_worker_slots_total", CTL_METRIC_GAUGE, "Usable state slots on the worker."},
        {"wkvm_worker_slots_used", CTL_METRIC_GAUGE, "State slots bound on the worker."},
        {"wkvm_worker_slots_free", CTL_METRIC_GAUGE, "State slots free on the worker."},
        {"wkvm_kv_pages_total", CTL_METRIC_GAUGE, "Hybrid models: pages in the worker's KV pool."},
        {"wkvm_kv_pages_free", CTL_METRIC_GAUGE,
         "Hybrid models: KV pages neither held by a slot nor reserved for a running request."},
        {"wkvm_worker_registrations_total", CTL_METRIC_COUNTER, "Worker Hello messages accepted."},
        {"wkvm_worker_departures_total", CTL_METRIC_COUNTER, "Worker connections closed."},
        {"wkvm_worker_rpc_calls_total", CTL_METRIC_COUNTER, "Requests sent to workers."},
        {"wkvm_worker_rpc_errors_total", CTL_METRIC_COUNTER,
         "Requests to workers that failed or timed out."},
        {"wkvm_worker_bad_messages_total", CTL_METRIC_COUNTER,
         "Messages from workers refused by validation."},
        {"wkvm_build_info", CTL_METRIC_GAUGE, "1, labelled with the controller's version."},
        {"wkvm_http_streams_total", CTL_METRIC_COUNTER,
         "Streamed replies by who wrote their events: an event loop (loop) or the "
         "connection's own thread (thread: TLS, a name bind, a socket not handed over)."},
        {"wkvm_controller_cpu_seconds_total", CTL_METRIC_COUNTER,
         "Controller CPU seconds (user + system) by component: http, step, sched, pool, vm, "
         "other (threads attributed by name)."},
    };
    for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++) {
        wk_err err = ctl_metrics_declare(m, fams[i].name, fams[i].type, fams[i].help, lat,
                                         sizeof(lat) / sizeof(lat[0]));
        if (err != WK_OK)
            return err;
    }
    ctl_metrics_set(m, "wkvm_build_info", "version=\"" WK_VERSION "\"", 1);
    return WK_OK;
}

/* The ?owner= filter of the cache routes; false after answering 400. */
static bool
ctl_admin_cache_owner(ctl_http_req *req, char owner[CTL_STORE_OWNER_MAX + 1], bool *have)
{
    char buf[CTL_STORE_OWNER_MAX + 2] = "";
    *have = ctl_http_req_query_get(req, "owner", buf, sizeof(buf));
    if (!*have)
        return true;
    if (ctl_store_owner_check(buf, NULL) != WK_OK) {
        ctl_http_send_error(req, WK_EINVAL, "owner must be 1..128 printable ASCII bytes",
                            "owner");
        return false;
    }
    snprintf(owner, CTL_STORE_OWNER_MAX + 1, "%s", buf);
    return true;
}

/*
 * The body of GET /admin/cache from st (borrowed): budgets, bytes and entries
 * per tier, per-owner entries, lookups and hit rate. New reference, caller
 * decrefs; NULL on allocation failure.
 */
static json_t *
ctl_admin_cache_json(const ctl_ckpt_stats *st)
{
    json_t *o = json_object();
    json_t *owners = json_object();
    if (o == NULL || owners == NULL) {
        json_decref(o);
        json_decref(owners);
        return NULL;
    }
    for (size_t i = 0; i < st->n_owners; i++) {
        const ctl_ckpt_owner_stats *os = &st->owners[i];
        json_object_set_new(owners, os->owner,
                            json_pack("{s:I, s:I, s:I, s:I, s:I}", "entries",
                                      (json_int_t)os->entries, "warm", (json_int_t)os->warm,
                                      "disk", (json_int_t)os->disk, "bytes",
                                      (json_int_t)os->bytes, "tokens", (json_int_t)os->tokens));
    }
    const ctl_ckpt_config *cfg = &st->config;
    json_object_set_new(o, "enabled", json_boolean(cfg->enabled));
    json_object_set_new(o, "checkpoint_interval", json_integer(cfg->interval));
    json_object_set_new(o, "write_through", json_boolean(cfg->write_through));
    json_object_set_new(o, "entries", json_integer((json_int_t)st->entries));
    json_object_set_new(o, "tiers",
                        json_pack("{s:{s:I, s:I, s:I, s:I}, s:{s:I, s:I, s:I, s:I}}", "warm",
                                  "bytes", (json_int_t)st->warm_bytes, "entries",
                                  (json_int_t)st->warm_entries, "budget_bytes_per_worker",
                                  (json_int_t)cfg->warm_bytes, "evictions",
                                  (json_int_t)st->warm_evictions, "disk", "bytes",
                                  (json_int_t)st->disk_bytes, "entries",
                                  (json_int_t)st->disk_entries, "budget_bytes",
                                  (json_int_t)cfg->disk_bytes, "evictions",
                                  (json_int_t)st->disk_evictions));
    json_object_set_new(o, "lookups", json_integer((json_int_t)st->lookups));
    json_object_set_new(o, "hits", json_integer((json_int_t)st->hits));
    json_object_set_new(o, "hit_rate", json_real(st->lookups ? (double)st->hits /
                                                                   (double)st->lookups
                                                             : 0.0));
    json_object_set_new(o, "owners", owners);
    return o;
}

/* GET /admin/cache[?owner=]: checkpoints per tier and owner, budgets, hit rate. */
static void
ctl_admin_cache(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    char owner[CTL_STORE_OWNER_MAX + 1];
    bool have = false;
    if (!ctl_admin_cache_owner(req, owner, &have))
        return;
    ctl_ckpt_stats st;
    if (ctl_ckpt_stats_get(app->ckpt, have ? owner : NULL, &st) != WK_OK) {
        ctl_http_send_error(req, WK_ENOMEM, "out of memory", NULL);
        return;
    }
    json_t *o = ctl_admin_cache_json(&st);
    ctl_ckpt_stats_fini(&st);
    if (o == NULL) {
        ctl_http_send_error(req, WK_ENOMEM, "out of memory", NULL);
        return;
    }
    ctl_http_send_json(req, 200, o);
}

/* POST /admin/cache/clear[?owner=] and DELETE /admin/cache[?owner=]: drop checkpoints. */
static void
ctl_admin_cache_clear(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    char owner[CTL_STORE_OWNER_MAX + 1];
    bool have = false;
    if (!ctl_admin_cache_owner(req, owner, &have))
        return;
    size_t n = 0;
    ctl_ckpt_clear(app->ckpt, have ? owner : NULL, &n);
    wk_log_info("cache cleared owner=%s entries=%zu", have ? owner : "*", n);
    ctl_http_send_json(req, 200, json_pack("{s:I}", "cleared", (json_int_t)n));
}

size_t
ctl_admin_routes(ctl_app *app, ctl_http_route *out, size_t cap)
{
    const ctl_http_route routes[] = {
        {"GET", "/health", false, ctl_admin_health, app, "/health", CTL_HTTP_ACCESS_PUBLIC},
        {"GET", "/ready", false, ctl_admin_ready, app, "/ready", CTL_HTTP_ACCESS_PUBLIC},
        {"GET", "/metrics", false, ctl_admin_metrics, app, "/metrics", CTL_HTTP_ACCESS_ADMIN},
        {"GET", "/admin", false, ctl_admin_index, app, "/admin", CTL_HTTP_ACCESS_ADMIN},
        {"GET", "/admin/workers", false, ctl_admin_workers, app, "/admin/workers",
         CTL_HTTP_ACCESS_ADMIN},
        {"GET", "/admin/cache", false, ctl_admin_cache, app, "/admin/cache",
         CTL_HTTP_ACCESS_ADMIN},
        {"POST", "/admin/cache/clear", false, ctl_admin_cache_clear, app, "/admin/cache/clear",
         CTL_HTTP_ACCESS_ADMIN},
        {"DELETE", "/admin/cache", false, ctl_admin_cache_clear, app, "/admin/cache",
         CTL_HTTP_ACCESS_ADMIN},
    };
    size_t n = sizeof(routes) / sizeof(routes[0]);
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = routes[i];
    return n;
}
