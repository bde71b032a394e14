/*
 * ctl_route_parse: the bodies of the state, slot-migrate and drain routes
 * parsed into plain values; every refusal is a ctl_openai_perr the route
 * sends (ctl_route_parse.h). The token fields go through the OpenAI routes'
 * own parsers (ctl_openai_parse.c), so a state's prompt is read exactly as
 * a completion's or a chat's.
 */
#define WK_LOG_MODULE "states"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_app.h"
#include "ctl_route_parse.h"
#include "ctl_store.h"
#include "wk_json.h"

/* A field refusal with the diag's message (the wk_json_get_* / name check's). */
static bool
ctl_route_refuse(ctl_openai_perr *pe, wk_err err, const char *param, const char *msg)
{
    ctl_openai_perr_setf(pe, 0, err, param, NULL, "%s", msg);
    return false;
}

/* pe before any refusal: an out-of-memory one (what a failed allocation leaves). */
static void
ctl_route_pe_init(ctl_openai_perr *pe)
{
    ctl_openai_perr_setf(pe, 0, WK_ENOMEM, NULL, NULL, "out of memory");
}

bool
ctl_states_parse_tokens(ctl_app *app, json_t *body, bool required, int32_t **ids, size_t *n,
                        ctl_openai_perr *pe)
{
    ctl_route_pe_init(pe);
    *ids = NULL;
    *n = 0;
    json_t *p = json_object_get(body, "prompt");
    json_t *pi = json_object_get(body, "prompt_ids");
    json_t *m = json_object_get(body, "messages");
    int given = (p != NULL && !json_is_null(p)) + (pi != NULL && !json_is_null(pi)) +
                (m != NULL && !json_is_null(m));
    if (given > 1)
        return ctl_route_refuse(pe, WK_EINVAL, "prompt",
                                "give one of prompt, prompt_ids, messages");
    if (given == 0)
        return !required || ctl_route_refuse(pe, WK_EINVAL, "prompt",
                                             "one of prompt, prompt_ids, messages is required");
    ctl_openai_req r = {.wire.chat = true};
    bool ok;
    if (m != NULL && !json_is_null(m)) {
        ok = ctl_openai_parse_messages_value(app, body, &r, pe);
    } else {
        json_t *tmp = json_pack("{s:O}", "prompt", p != NULL && !json_is_null(p) ? p : pi);
        ok = tmp != NULL && ctl_openai_parse_prompt_value(app, tmp, &r, pe);
        json_decref(tmp);
    }
    if (ok) {
        *ids = r.plan.prompt;
        *n = r.plan.n_prompt;
        r.plan.prompt = NULL; /* given to the caller; the messages and rendered text are not */
    }
    ctl_openai_req_fini(&r);
    return ok;
}

bool
ctl_states_parse_create(ctl_app *app, json_t *body, ctl_states_create_body *out,
                        ctl_openai_perr *pe)
{
    ctl_route_pe_init(pe);
    memset(out, 0, sizeof(*out));
    wk_diag d = {{0}};
    const char *model = NULL;
    if (wk_json_get_str(body, "name", true, NULL, CTL_STORE_NAME_MAX, &out->name, &d) != WK_OK ||
        ctl_store_name_check(out->name, &d) != WK_OK)
        return ctl_route_refuse(pe, WK_EINVAL, "name", d.msg);
    if (wk_json_get_str(body, "model", false, app->model_id, 256, &model, &d) != WK_OK ||
        model == NULL || app->model_id == NULL || strcmp(model, app->model_id) != 0)
        return ctl_route_refuse(pe, WK_ENOENT, "model", "unknown model");
    return ctl_states_parse_tokens(app, body, true, &out->ids, &out->n_ids, pe);
}

bool
ctl_states_parse_generate_save_as(const json_t *body, ctl_states_gen_body *out,
                                  ctl_openai_perr *pe)
{
    ctl_route_pe_init(pe);
    memset(out, 0, sizeof(*out));
    wk_diag d = {{0}};
    if (wk_json_get_str(body, "save_as", false, NULL, CTL_STORE_NAME_MAX, &out->save_as, &d) !=
            WK_OK ||
        (out->save_as != NULL && ctl_store_name_check(out->save_as, &d) != WK_OK))
        return ctl_route_refuse(pe, WK_EINVAL, "save_as", d.msg);
    return true;
}

bool
ctl_states_parse_generate_rest(ctl_app *app, json_t *body, ctl_states_gen_body *out,
                               ctl_openai_req *r, ctl_openai_perr *pe)
{
    ctl_route_pe_init(pe);
    if (!ctl_states_parse_tokens(app, body, false, &out->q, &out->n_q, pe))
        return false;
    /* (a text prompt was the tokens above; the common fields would refuse it) */
    json_object_del(body, "prompt");
    return ctl_openai_parse_common_value(app, body, r, pe);
}

bool
ctl_states_parse_generate(ctl_app *app, json_t *body, ctl_states_gen_body *out, ctl_openai_req *r,
                          ctl_openai_perr *pe)
{
    return ctl_states_parse_generate_save_as(body, out, pe) &&
           ctl_states_parse_generate_rest(app, body, out, r, pe);
}

bool
ctl_states_parse_fork(const json_t *body, ctl_states_fork_body *out, ctl_openai_perr *pe)
{
    ctl_route_pe_init(pe);
    memset(out, 0, sizeof(*out));
    out->count = 1;
    wk_diag d = {{0}};
    if (body == NULL)
        return ctl_route_refuse(pe, WK_EINVAL, "name", "'name' is required");
    if (wk_json_get_str(body, "name", true, NULL, CTL_STORE_NAME_MAX, &out->name, &d) != WK_OK ||
        ctl_store_name_check(out->name, &d) != WK_OK)
        return ctl_route_refuse(pe, WK_EINVAL, "name", d.msg);
    if (wk_json_get_i64(body, "count", false, 1, 1, CTL_STATES_FORK_MAX, &out->count, &d) != WK_OK)
        return ctl_route_refuse(pe, WK_EINVAL, "count", d.msg);
    return true;
}

void
ctl_states_create_body_fini(ctl_states_create_body *b)
{
    free(b->ids);
    memset(b, 0, sizeof(*b));
}

void
ctl_states_gen_body_fini(ctl_states_gen_body *b)
{
    free(b->q);
    memset(b, 0, sizeof(*b));
}

bool
ctl_migrate_parse_to(const json_t *body, const char **to, ctl_openai_perr *pe)
{
    ctl_route_pe_init(pe);
    wk_diag d = {{0}};
    *to = NULL;
    if (wk_json_get_str(body, "to", true, NULL, 64, to, &d) != WK_OK)
        return ctl_route_refuse(pe, WK_EINVAL, "to", d.msg);
    return true;
}

bool
ctl_migrate_parse_drain(const json_t *body, bool *undrain, ctl_openai_perr *pe)
{
    ctl_route_pe_init(pe);
    wk_diag d = {{0}};
    *undrain = false;
    if (body != NULL && wk_json_get_bool(body, "undrain", false, undrain, &d) != WK_OK)
        return ctl_route_refuse(pe, WK_EINVAL, "undrain", d.msg);
    return true;
}
