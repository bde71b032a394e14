/*
 * ctl_migrate: live migration and the slot-level admin API.
 *
 *   GET  /admin/slots                      every allocated slot: running, parked or held
 *   POST /admin/slots/{worker}:{slot}/migrate {"to": "w1"}
 *   POST /admin/slots/{worker}:{slot}/evict  (parked only: spilled, slot freed)
 *   POST /admin/workers/{id}/drain         {"undrain": false}
 *   GET  /admin/workers/{id}/drain         progress of a drain: {state, total, done, ...}
 *
 * A migration is prepare (reserve a slot on the destination), transfer
 * (chunked SlotRead from the source, SlotWrite to the destination, relayed
 * by the controller over NNG), verify (the destination hashes what it holds,
 * MIGRATE_RECV, compared with the source bytes), commit (the request's or
 * the cache entry's placement switches), release (the source slot is
 * freed). The source is untouched until commit, so any failure before it
 * leaves the request running on the source. A running request is left out
 * of the steps while its bytes move and rejoins on the destination.
 * The bytes move by ctl_transport_move(): NCCL point-to-point between two
 * CUDA workers with NCCL on different devices (the workers' arenas talk
 * directly; the controller only relays the ncclUniqueId and drives the
 * phases), else NNG relayed by the controller; a failed NCCL attempt is
 * aborted on both sides and the same migration retried once over NNG. The
 * response (transport, transport_reason, nccl_fallback), the log and the
 * metrics' transport label say which moved the bytes.
 *
 * A drain records its progress in a small table (one entry per worker,
 * guarded by its own mutex) that GET /admin/workers/{id}/drain reads while
 * the POST is still working.
 */
#define WK_LOG_MODULE "migrate"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl_app.h"
#include "ctl_err.h"
#include "ctl_openai.h"
#include "ctl_route_parse.h"
#include "wk_json.h"
#include "wk_log.h"

#define CTL_MIGRATE_SLOTS_MAX 4096

static double
ctl_migrate_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct ctl_migrate_ctx {
    ctl_app *app;              /* app */
    uint64_t bytes;            /* bytes moved */
    double transfer_s;         /* seconds in transfer + verify */
    bool moved;                /* the mover ran (rep is filled) */
    ctl_transport_report rep;  /* transport used, why, NCCL fallback */
} ctl_migrate_ctx;

static wk_err
ctl_migrate_mover(void *arg, const ctl_slot_ref *src, const ctl_slot_ref *dst, wk_diag *d)
{
    ctl_migrate_ctx *m = arg;
    double t0 = ctl_migrate_now();
    wk_err err = ctl_transport_move(m->app->pool, m->app->vm, src, dst, &m->app->migrate, &m->rep,
                                    d);
    m->moved = true;
    m->bytes = err == WK_OK ? m->rep.bytes : 0;
    m->transfer_s = ctl_migrate_now() - t0;
    return err;
}

/* Current allocation of worker:slot, from the scheduler. */
static bool
ctl_migrate_lookup(ctl_app *app, const char *worker, uint32_t slot, ctl_slot_info *out)
{
    ctl_slot_info *all = calloc(CTL_MIGRATE_SLOTS_MAX, sizeof(*all));
    if (all == NULL)
        return false;
    size_t n = ctl_sched_slots(app->sched, all, CTL_MIGRATE_SLOTS_MAX);
    bool found = false;
    for (size_t i = 0; i < n && i < CTL_MIGRATE_SLOTS_MAX; i++) {
        if (strcmp(all[i].ref.worker, worker) == 0 && all[i].ref.slot == slot) {
            *out = all[i];
            found = true;
            break;
        }
    }
    free(all);
    return found;
}

static void
ctl_migrate_count(ctl_app *app, const char *result, const char *transport, double secs,
                  uint64_t bytes)
{
    char lb[96];
    snprintf(lb, sizeof(lb), "result=\"%s\",transport=\"%s\"", result, transport);
    ctl_metrics_add(app->metrics, "wkvm_migrations_total", lb, 1);
    if (strcmp(result, "committed") == 0) {
        ctl_metrics_observe(app->metrics, "wkvm_migration_seconds", NULL, secs);
        ctl_metrics_add(app->metrics, "wkvm_migration_bytes_total", NULL, (double)bytes);
    }
}

/* Migrates one slot; fills *out (a JSON report) on success or failure. */
static wk_err
ctl_migrate_one(ctl_app *app, const ctl_slot_info *info, const char *to, json_t **out, wk_diag *d)
{
    ctl_migrate_ctx m = {.app = app};
    ctl_slot_ref dst;
    memset(&dst, 0, sizeof(dst));
    double t0 = ctl_migrate_now();
    wk_err err;
    const char *kind;
    if (info->running) {
        kind = "running";
        err = ctl_sched_migrate_job(app->sched, &info->ref, to, ctl_migrate_mover, &m, &dst, d);
    } else {
        kind = "parked";
        err = ctl_vm_move_with(app->vm, &info->ref, to, ctl_migrate_mover, &m, &dst, d);
    }
    double total = ctl_migrate_now() - t0;
    /* Refused before any byte moved (bad target, no room): no transport was chosen. */
    const char *transport = ctl_transport_kind_name(m.rep.kind);
    const char *reason = m.moved ? m.rep.reason : "not started";
    ctl_migrate_count(app, err == WK_OK ? "committed" : "aborted", transport, total, m.bytes);
    char from[96], dest[96];
    snprintf(from, sizeof(from), "%s:%u", info->ref.worker, info->ref.slot);
    snprintf(dest, sizeof(dest), "%s:%u", dst.worker, dst.slot);
    *out = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:{s:f, s:f}}", "result",
                     err == WK_OK ? "committed" : "aborted", "kind", kind, "from", from, "to",
                     err == WK_OK ? dest : to, "transport", transport, "transport_reason",
                     reason, "bytes", (json_int_t)m.bytes, "seconds", "transfer", m.transfer_s,
                     "total", total);
    if (*out != NULL && m.rep.fallback[0] != '\0') {
        json_object_set_new(*out, "nccl_fallback", json_string(m.rep.fallback));
        json_object_set_new(*out, "nccl_failed_phase",
                            json_string(ctl_nccl_phase_name(m.rep.failed_phase)));
    }
    if (err != WK_OK && *out != NULL)
        json_object_set_new(*out, "error", json_string(d->msg));
    wk_log_info("migration %s kind=%s from=%s to=%s transport=%s reason=\"%s\"%s%s%s bytes=%llu "
                "ms=%.2f%s%s",
                err == WK_OK ? "committed" : "aborted", kind, from, to, transport, reason,
                m.rep.fallback[0] ? " nccl_fallback=\"" : "", m.rep.fallback,
                m.rep.fallback[0] ? "\"" : "", (unsigned long long)m.bytes, total * 1000.0,
                err == WK_OK ? "" : " error=", err == WK_OK ? "" : d->msg);
    return err;
}

static void
ctl_migrate_slots(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    ctl_slot_info *all = calloc(CTL_MIGRATE_SLOTS_MAX, sizeof(*all));
    if (all == NULL) {
        ctl_http_send_error(req, WK_ENOMEM, "out of memory", NULL);
        return;
    }
    size_t n = ctl_sched_slots(app->sched, all, CTL_MIGRATE_SLOTS_MAX);
    json_t *arr = json_array();
    for (size_t i = 0; i < n && i < CTL_MIGRATE_SLOTS_MAX; i++) {
        bool dirty = false;
        uint64_t age = 0;
        bool cached = ctl_vm_describe(app->vm, &all[i].ref, &dirty, &age);
        const char *state = all[i].running ? "running" : cached ? "parked" : "idle";
        const char *what = all[i].running ? (all[i].held ? "state-op" : "request")
                           : cached      ? (dirty ? "session" : "state")
                                         : "reserved";
        char id[96];
        snprintf(id, sizeof(id), "%s:%u", all[i].ref.worker, all[i].ref.slot);
        json_array_append_new(arr, json_pack("{s:s, s:s, s:i, s:s, s:s, s:I, s:s, s:b}", "id",
                                             id, "worker", all[i].ref.worker, "slot",
                                             (int)all[i].ref.slot, "state", state, "holds",
                                             what, "tokens", (json_int_t)all[i].tokens, "tier",
                                             "hot", "draining",
                                             ctl_sched_draining(app->sched, all[i].ref.worker)));
    }
    free(all);
    ctl_http_send_json(req, 200, json_pack("{s:o}", "slots", arr));
}

static bool
ctl_migrate_parse_slot(const char *s, char *worker, size_t cap, uint32_t *slot)
{
    const char *colon = strrchr(s, ':');
    if (colon == NULL || colon == s || (size_t)(colon - s) >= cap)
        return false;
    char *end = NULL;
    unsigned long v = strtoul(colon + 1, &end, 10);
    if (end == colon + 1 || *end != '\0' || v == 0 || v > 1000000)
        return false;
    snprintf(worker, cap, "%.*s", (int)(colon - s), s);
    *slot = (uint32_t)v;
    return true;
}

static void
ctl_migrate_slot_action(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    const char *path = ctl_http_req_path(req) + strlen("/admin/slots/");
    const char *slash = strchr(path, '/');
    char id[160], worker[96];
    uint32_t slot = 0;
    if (slash == NULL || (size_t)(slash - path) >= sizeof(id)) {
        ctl_http_send_error(req, WK_ENOENT, "no such slot route", NULL);
        return;
    }
    snprintf(id, sizeof(id), "%.*s", (int)(slash - path), path);
    const char *action = slash + 1;
    if (!ctl_migrate_parse_slot(id, worker, sizeof(worker), &slot)) {
        ctl_http_send_error(req, WK_EINVAL, "slot ids look like WORKER:SLOT (e.g. w0:3)", NULL);
        return;
    }
    ctl_slot_info info;
    if (!ctl_migrate_lookup(app, worker, slot, &info)) {
        ctl_http_send_error(req, WK_ENOENT, "that slot is not allocated", NULL);
        return;
    }
    wk_diag d = {{0}};
    if (strcmp(action, "evict") == 0) {
        bool dirty = false;
        uint64_t age = 0;
        if (info.running || !ctl_vm_describe(app->vm, &info.ref, &dirty, &age)) {
            ctl_http_send_error(req, WK_ESTATE, "only parked slots can be evicted", NULL);
            return;
        }
        wk_err err = ctl_vm_evict_slot(app->vm, &info.ref);
        if (err != WK_OK)
            ctl_http_send_error(req, err, "the slot could not be evicted", NULL);
        else
            wk_log_info("slot evicted slot=%s", id);
        if (err == WK_OK)
            ctl_http_send_json(req, 200, json_pack("{s:s, s:s}", "id", id, "result", "evicted"));
        return;
    }
    if (strcmp(action, "migrate") != 0) {
        ctl_http_send_error(req, WK_ENOENT, "no such slot action (migrate, evict)", NULL);
        return;
    }
    json_t *body = ctl_openai_body(req);
    if (body == NULL)
        return;
    const char *to = NULL;
    ctl_openai_perr pe;
    if (!ctl_migrate_parse_to(body, &to, &pe)) {
        ctl_openai_send_perr(req, &pe);
        json_decref(body);
        return;
    }
    if (!ctl_sched_known(app->sched, to)) {
        /* No such destination: like a missing slot, a 404, and no migration was attempted. */
        char msg[160];
        snprintf(msg, sizeof(msg), "no such worker '%.64s' to migrate to", to);
        ctl_http_send_error(req, WK_ENOENT, msg, "to");
        json_decref(body);
        return;
    }
    json_t *report = NULL;
    wk_err err = ctl_migrate_one(app, &info, to, &report, &d);
    if (err != WK_OK) {
        /* An OpenAI-style error, with the aborted migration's report beside it. */
        char *eb = ctl_err_body(err, d.msg, err == WK_EINVAL || err == WK_EBUSY ? "to"
                                                                                     : NULL);
        json_t *ebody = eb ? json_loads(eb, 0, NULL) : NULL;
        free(eb);
        if (ebody != NULL && report != NULL)
            json_object_set_new(ebody, "migration", report);
        else
            json_decref(report);
        ctl_http_send_json(req, ctl_err_http_status(err), ebody);
    } else {
        ctl_http_send_json(req, 200, report);
    }
    json_decref(body);
}

/* Picks a destination other than from with a free slot; "" when none. */
static void
ctl_migrate_pick(ctl_app *app, const char *from, char *out, size_t cap)
{
    out[0] = '\0';
    ctl_worker_view *v = calloc(64, sizeof(*v));
    if (v == NULL)
        return;
    size_t n = ctl_pool_list(app->pool, v, 64);
    uint32_t best_free = 0;
    for (size_t i = 0; i < n && i < 64; i++) {
        if (strcmp(v[i].id, from) == 0 || !ctl_sched_known(app->sched, v[i].id) ||
            ctl_sched_draining(app->sched, v[i].id))
            continue;
        uint32_t used = 0, total = 0;
        ctl_resid_counts(app->resid, v[i].id, &used, &total);
        if (total > used && total - used > best_free) {
            best_free = total - used;
            snprintf(out, cap, "%s", v[i].id);
        }
    }
    free(v);
}

/* Progress of one worker's drain, readable while the POST works. */
typedef struct ctl_migrate_drain_rec {
    char worker[65];    /* worker id, "" = unused entry */
    bool running;       /* the POST is still migrating */
    uint32_t total;     /* slots on the worker when the drain began (grows if more appear) */
    uint32_t done;      /* migrations committed */
    uint32_t failed;    /* migrations aborted */
    uint32_t remaining; /* slots still on the worker after the last round */
    bool undrained;     /* the worker was undrained after this drain: nothing remains to do */
    char current[200];  /* "w0:3 -> w1" while one moves, "" between */
    double started;     /* monotonic seconds */
    double finished;    /* monotonic seconds, 0 while running */
} ctl_migrate_drain_rec;

#define CTL_MIGRATE_DRAINS_MAX 64
struct ctl_migrate_drains {
    pthread_mutex_t mu;                        /* guards rec */
    ctl_migrate_drain_rec rec[CTL_MIGRATE_DRAINS_MAX]; /* "" worker = unused */
};

wk_err
ctl_migrate_drains_new(ctl_migrate_drains **out)
{
    ctl_migrate_drains *dr = calloc(1, sizeof(*dr));
    if (dr == NULL)
        return WK_ENOMEM;
    if (pthread_mutex_init(&dr->mu, NULL) != 0) {
        free(dr);
        return WK_ENOMEM;
    }
    *out = dr;
    return WK_OK;
}

void
ctl_migrate_drains_free(ctl_migrate_drains *dr)
{
    if (dr == NULL)
        return;
    pthread_mutex_destroy(&dr->mu);
    free(dr);
}

/* The entry of worker, NULL when none. Called with dr->mu held. */
static ctl_migrate_drain_rec *
ctl_migrate_drain_find_locked(ctl_migrate_drains *dr, const char *worker)
{
    for (size_t i = 0; i < CTL_MIGRATE_DRAINS_MAX; i++)
        if (strcmp(dr->rec[i].worker, worker) == 0)
            return &dr->rec[i];
    return NULL;
}

/*
 * Starts the record of worker's drain: reuses its entry, a free one or the
 * longest finished. WK_EBUSY when a drain of worker is running already,
 * WK_ENOSPC when every entry belongs to a running drain.
 */
static wk_err
ctl_migrate_drain_begin(ctl_migrate_drains *dr, const char *worker, uint32_t total)
{
    pthread_mutex_lock(&dr->mu);
    ctl_migrate_drain_rec *p = ctl_migrate_drain_find_locked(dr, worker), *r = p;
    wk_err err = WK_OK;
    if (p != NULL && p->running)
        err = WK_EBUSY;
    for (size_t i = 0; err == WK_OK && p == NULL && i < CTL_MIGRATE_DRAINS_MAX; i++) {
        ctl_migrate_drain_rec *c = &dr->rec[i];
        if (c->worker[0] == '\0') {
            r = c;
            break;
        }
        if (!c->running && (r == NULL || c->finished < r->finished))
            r = c;
    }
    if (err == WK_OK && r == NULL)
        err = WK_ENOSPC;
    if (err == WK_OK) {
        memset(r, 0, sizeof(*r));
        snprintf(r->worker, sizeof(r->worker), "%.64s", worker);
        r->running = true;
        r->total = total;
        r->started = ctl_migrate_now();
    }
    pthread_mutex_unlock(&dr->mu);
    return err;
}

/* Marks worker's last drain as ended by an undrain (its remaining slots stay, by choice). */
static void
ctl_migrate_drain_undrained(ctl_migrate_drains *dr, const char *worker)
{
    pthread_mutex_lock(&dr->mu);
    ctl_migrate_drain_rec *r = ctl_migrate_drain_find_locked(dr, worker);
    if (r != NULL)
        r->undrained = true;
    pthread_mutex_unlock(&dr->mu);
}

/* Updates worker's record: what moves now ("" none), counts, the end. */
static void
ctl_migrate_drain_note(ctl_migrate_drains *dr, const char *worker, const char *current,
                       uint32_t done, uint32_t failed, uint32_t remaining, bool finished)
{
    pthread_mutex_lock(&dr->mu);
    ctl_migrate_drain_rec *r = ctl_migrate_drain_find_locked(dr, worker);
    if (r != NULL) {
        snprintf(r->current, sizeof(r->current), "%s", current);
        r->done = done;
        r->failed = failed;
        r->remaining = remaining;
        if (done + remaining > r->total)
            r->total = done + remaining;
        if (finished) {
            r->running = false;
            r->finished = ctl_migrate_now();
        }
    }
    pthread_mutex_unlock(&dr->mu);
}

/* Slots the scheduler has allocated on worker. */
static uint32_t
ctl_migrate_count_on(ctl_app *app, const char *worker, ctl_slot_info *all)
{
    size_t n = ctl_sched_slots(app->sched, all, CTL_MIGRATE_SLOTS_MAX);
    uint32_t c = 0;
    for (size_t i = 0; i < n && i < CTL_MIGRATE_SLOTS_MAX; i++)
        c += strcmp(all[i].ref.worker, worker) == 0;
    return c;
}

/* The worker id of /admin/workers/{id}/drain into worker; false when the path is not that. */
static bool
ctl_migrate_drain_path(ctl_http_req *req, char *worker, size_t cap)
{
    const char *path = ctl_http_req_path(req) + strlen("/admin/workers/");
    const char *slash = strchr(path, '/');
    if (slash == NULL || slash == path || strcmp(slash, "/drain") != 0 ||
        (size_t)(slash - path) >= cap)
        return false;
    snprintf(worker, cap, "%.*s", (int)(slash - path), path);
    return true;
}

/*
 * GET /admin/workers/{id}/drain: {worker, draining, state, total, done,
 * failed, remaining, current, seconds}. state: "running" while the POST
 * works, "done" (nothing left), "incomplete" (slots remained), "undrained"
 * (the worker was undrained since: it takes work again, whatever remained),
 * "none" (no drain since the controller started).
 */
static void
ctl_migrate_drain_status(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    char worker[96];
    if (!ctl_migrate_drain_path(req, worker, sizeof(worker))) {
        ctl_http_send_error(req, WK_ENOENT, "no such worker route (drain)", NULL);
        return;
    }
    ctl_migrate_drains *dr = app->drains;
    pthread_mutex_lock(&dr->mu);
    ctl_migrate_drain_rec *p = ctl_migrate_drain_find_locked(dr, worker);
    ctl_migrate_drain_rec r;
    memset(&r, 0, sizeof(r));
    if (p != NULL)
        r = *p;
    pthread_mutex_unlock(&dr->mu);
    if (p == NULL && !ctl_sched_known(app->sched, worker)) {
        ctl_http_send_error(req, WK_ENOENT, "no such worker", NULL);
        return;
    }
    const char *state = p == NULL      ? "none"
                        : r.running    ? "running"
                        : r.undrained  ? "undrained"
                        : r.remaining  ? "incomplete"
                                       : "done";
    double secs = p == NULL ? 0.0 : (r.running ? ctl_migrate_now() : r.finished) - r.started;
    json_t *o = json_pack("{s:s, s:b, s:s, s:I, s:I, s:I, s:I, s:f}", "worker", worker,
                          "draining", ctl_sched_draining(app->sched, worker), "state", state,
                          "total", (json_int_t)r.total, "done", (json_int_t)r.done, "failed",
                          (json_int_t)r.failed, "remaining", (json_int_t)r.remaining, "seconds",
                          secs);
    if (o != NULL)
        json_object_set_new(o, "current", r.current[0] ? json_string(r.current) : json_null());
    ctl_http_send_json(req, 200, o);
}

static void
ctl_migrate_drain(ctl_http_req *req, void *arg)
{
    ctl_app *app = arg;
    char worker[96];
    if (!ctl_migrate_drain_path(req, worker, sizeof(worker))) {
        ctl_http_send_error(req, WK_ENOENT, "no such worker route (drain)", NULL);
        return;
    }
    bool undrain = false;
    const char *buf;
    size_t len;
    if (ctl_http_req_body(req, &buf, &len) == WK_OK && len > 0) {
        json_t *body = ctl_openai_body(req);
        if (body == NULL)
            return;
        ctl_openai_perr pe;
        bool ok = ctl_migrate_parse_drain(body, &undrain, &pe);
        json_decref(body);
        if (!ok) {
            ctl_openai_send_perr(req, &pe);
            return;
        }
    }
    if (ctl_sched_set_draining(app->sched, worker, !undrain) != WK_OK) {
        ctl_http_send_error(req, WK_ENOENT, "no such worker", NULL);
        return;
    }
    if (undrain) {
        ctl_migrate_drain_undrained(app->drains, worker);
        wk_log_info("undrain worker=%s: it takes new requests again", worker);
        ctl_http_send_json(req, 200, json_pack("{s:s, s:b}", "worker", worker, "draining", 0));
        return;
    }
    ctl_slot_info *all = calloc(CTL_MIGRATE_SLOTS_MAX, sizeof(*all));
    if (all == NULL) {
        ctl_http_send_error(req, WK_ENOMEM, "out of memory", NULL);
        return;
    }
    wk_err berr =
        ctl_migrate_drain_begin(app->drains, worker, ctl_migrate_count_on(app, worker, all));
    if (berr != WK_OK) {
        free(all);
        ctl_http_send_error(req, berr, berr == WK_EBUSY ? "a drain of this worker is in progress "
                                                         "(GET this route for its progress)"
                                                       : "too many drains at once", NULL);
        return;
    }
    wk_log_info("drain worker=%s slots=%u: no new requests on it; moving its slots",
                worker, ctl_migrate_count_on(app, worker, all));
    json_t *moved = json_array();
    size_t failed = 0, remaining = 0, done = 0;
    for (int round = 0; round < 600 && ctl_sched_draining(app->sched, worker); round++) {
        size_t n = ctl_sched_slots(app->sched, all, CTL_MIGRATE_SLOTS_MAX);
        remaining = 0;
        bool progress = false, waiting = false;
        for (size_t i = 0; i < n && i < CTL_MIGRATE_SLOTS_MAX; i++) {
            if (strcmp(all[i].ref.worker, worker) != 0)
                continue;
            bool dirty = false;
            uint64_t age = 0;
            bool parked = !all[i].running && ctl_vm_describe(app->vm, &all[i].ref, &dirty, &age);
            if (all[i].held || (!all[i].running && !parked)) {
                waiting = true; /* a state operation or chat turn: it ends soon */
                remaining++;
                continue;
            }
            char to[96];
            ctl_migrate_pick(app, worker, to, sizeof(to));
            if (to[0] == '\0') {
                remaining++;
                continue;
            }
            json_t *rep = NULL;
            wk_diag d = {{0}};
            char cur[200];
            snprintf(cur, sizeof(cur), "%s:%u -> %s", worker, all[i].ref.slot, to);
            ctl_migrate_drain_note(app->drains, worker, cur, (uint32_t)done, (uint32_t)failed,
                                   (uint32_t)remaining, false);
            if (ctl_migrate_one(app, &all[i], to, &rep, &d) == WK_OK) {
                progress = true;
                done++;
            } else {
                failed++;
            }
            if (rep != NULL)
                json_array_append_new(moved, rep);
            ctl_migrate_drain_note(app->drains, worker, "", (uint32_t)done, (uint32_t)failed,
                                   (uint32_t)remaining, false);
        }
        ctl_migrate_drain_note(app->drains, worker, "", (uint32_t)done, (uint32_t)failed,
                               (uint32_t)remaining, false);
        if (remaining == 0 || (!progress && !waiting))
            break;
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    free(all);
    ctl_migrate_drain_note(app->drains, worker, "", (uint32_t)done, (uint32_t)failed,
                           (uint32_t)remaining, true);
    wk_log_info("drain worker=%s ended: moved=%zu failed=%zu remaining=%zu%s", worker, done,
                failed, remaining, remaining ? " (they stay until they end or move)" : "");
    int status = remaining == 0 ? 200 : 409;
    ctl_http_send_json(req, status,
                       json_pack("{s:s, s:b, s:o, s:I, s:I, s:I}", "worker", worker, "draining",
                                 1, "migrations", moved, "failed", (json_int_t)failed,
                                 "remaining", (json_int_t)remaining, "done", (json_int_t)done));
}

wk_err
ctl_migrate_metrics_declare(ctl_metrics *m)
{
    static const double secs[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                  0.1,    0.25,  0.5,    1,     2.5,  5,     10};
    wk_err err = ctl_metrics_declare(m, "wkvm_migrations_total", CTL_METRIC_COUNTER,
                                     "Slot migrations by result and transport.", NULL, 0);
    if (err == WK_OK)
        err = ctl_metrics_declare(m, "wkvm_migration_seconds", CTL_METRIC_HISTOGRAM,
                                  "Wall time of a committed migration.", secs,
                                  sizeof(secs) / sizeof(secs[0]));
    if (err == WK_OK)
        err = ctl_metrics_declare(m, "wkvm_migration_bytes_total", CTL_METRIC_COUNTER,
                                  "State bytes moved by committed migrations.", NULL, 0);
    return err;
}

size_t
ctl_migrate_routes(ctl_app *app, ctl_http_route *out, size_t cap)
{
    const ctl_http_route routes[] = {
        {"GET", "/admin/slots", false, ctl_migrate_slots, app, "/admin/slots",
         CTL_HTTP_ACCESS_ADMIN},
        {"POST", "/admin/slots/", true, ctl_migrate_slot_action, app, "/admin/slots/{id}/{action}",
         CTL_HTTP_ACCESS_ADMIN},
        {"POST", "/admin/workers/", true, ctl_migrate_drain, app, "/admin/workers/{id}/drain",
         CTL_HTTP_ACCESS_ADMIN},
        {"GET", "/admin/workers/", true, ctl_migrate_drain_status, app, "/admin/workers/{id}/drain",
         CTL_HTTP_ACCESS_ADMIN},
    };
    size_t n = sizeof(routes) / sizeof(routes[0]);
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = routes[i];
    return n;
}
