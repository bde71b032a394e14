/*
 * ctl_app: what the routes share through the app object beyond its fields:
 * the per-user concurrent-request budget (ctl_limits) taken and given back
 * around a generation, with the 429 answered here. Holds no state of its
 * own; never parses a request body.
 */
#include "ctl_app.h"

#include <stdio.h>

bool
ctl_app_user_enter(ctl_http_req *req, ctl_app *app)
{
    wk_err err = ctl_limits_acquire(app->limits, ctl_http_req_user(req));
    if (err == WK_OK || app->limits == NULL)
        return true;
    if (err == WK_EQUOTA) {
        ctl_metrics_add(app->metrics, "wkvm_quota_refusals_total", "limit=\"concurrent\"", 1);
        char msg[512];
        snprintf(msg, sizeof(msg), "too many concurrent requests: at most %u per user",
                 ctl_limits_max(app->limits));
        ctl_http_send_error(req, WK_EQUOTA, msg, NULL);
    } else {
        ctl_http_send_error(req, err, "cannot account the request", NULL);
    }
    return false;
}

void
ctl_app_user_leave(ctl_http_req *req, ctl_app *app)
{
    if (app->limits != NULL)
        ctl_limits_release(app->limits, ctl_http_req_user(req));
}
