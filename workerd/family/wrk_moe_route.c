/*
 * wrk_moe_route: expert routing of one token (wrk_moe_route.h). The
 * arithmetic (order of the sums, expf, ties) is the CPU backend's reference
 * and must not change: logits are compared byte for byte across versions.
 */
#include "wrk_moe_route.h"

#include <math.h>
#include <stdlib.h>

#include "wk_tensor.h"

wk_err
wrk_moe_route_open(wrk_moe_route_cfg *r, const wrk_moe *wm, const char *who, uint32_t layer,
                   wk_diag *d)
{
    *r = (wrk_moe_route_cfg){0};
    if (wm->n_experts == 0 || wm->top_k == 0 || wm->top_k > wm->n_experts)
        return wk_diag_set(d, WK_EINVAL, "%s: layer %u: bad experts (%u, top %u)", who, layer,
                           wm->n_experts, wm->top_k);
    r->E = wm->n_experts;
    r->k = wm->top_k;
    r->route = wm->route;
    r->norm_topk = wm->norm_topk;
    r->n_group = wm->n_group ? wm->n_group : 1;
    r->topk_group = wm->topk_group ? wm->topk_group : 1;
    r->scale = wm->scale;
    if (r->route != WRK_MOE_SIGMOID)
        return WK_OK;
    if (r->n_group > WRK_MOE_ROUTE_GROUPS_MAX || r->E % r->n_group != 0 ||
        r->topk_group > r->n_group || (uint64_t)r->topk_group * (r->E / r->n_group) < r->k)
        return wk_diag_set(d, WK_EINVAL,
                           "%s: layer %u: bad expert groups (%u experts, %u groups, %u kept, "
                           "top %u)",
                           who, layer, r->E, r->n_group, r->topk_group, r->k);
    r->score_bias = calloc(r->E, sizeof(float));
    if (r->score_bias == NULL)
        return wk_diag_set(d, WK_ENOMEM, "%s: out of memory", who);
    if (wm->score_bias != NULL && wk_tensor_read_f32(wm->score_bias, 0, r->E, r->score_bias) != WK_OK)
        return wk_diag_set(d, WK_EINVAL, "%s: cannot read %s", who, wm->score_bias->name);
    return WK_OK;
}

void
wrk_moe_route_close(wrk_moe_route_cfg *r)
{
    free(r->score_bias);
    r->score_bias = NULL;
}

/* The k largest of v[0..E) into sel, larger first; a later equal one never passes. */
static void
route_topk(const float *v, uint32_t E, uint32_t k, uint32_t *sel)
{
    uint32_t have = 0;
    for (uint32_t e = 0; e < E; e++) {
        if (have == k && !(v[e] > v[sel[k - 1]]))
            continue;
        uint32_t i = have < k ? have++ : k - 1;
        while (i > 0 && v[e] > v[sel[i - 1]]) {
            sel[i] = sel[i - 1];
            i--;
        }
        sel[i] = e;
    }
}

static void
route_sigmoid(const wrk_moe_route_cfg *r, float *p, float *cs, uint32_t *sel, float *w)
{
    const uint32_t E = r->E, k = r->k, G = r->n_group, per = E / G;
    for (uint32_t e = 0; e < E; e++) {
        p[e] = 1.0f / (1.0f + expf(-p[e]));
        cs[e] = p[e] + r->score_bias[e];
    }
    if (G > 1) {
        float gs[WRK_MOE_ROUTE_GROUPS_MAX]; /* group scores (checked at open) */
        bool keep[WRK_MOE_ROUTE_GROUPS_MAX];
        for (uint32_t g = 0; g < G; g++) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (uint32_t e = g * per; e < (g + 1) * per; e++) {
                if (cs[e] > b1) {
                    b2 = b1;
                    b1 = cs[e];
                } else if (cs[e] > b2) {
                    b2 = cs[e];
                }
            }
            gs[g] = per > 1 ? b1 + b2 : b1;
            keep[g] = false;
        }
        for (uint32_t t = 0; t < r->topk_group; t++) {
            uint32_t best = G;
            for (uint32_t g = 0; g < G; g++)
                if (!keep[g] && (best == G || gs[g] > gs[best]))
                    best = g;
            keep[best] = true;
        }
        for (uint32_t e = 0; e < E; e++)
            if (!keep[e / per])
                cs[e] = -INFINITY;
    }
    route_topk(cs, E, k, sel);
    float tot = 0.0f;
    for (uint32_t j = 0; j < k; j++) {
        w[j] = p[sel[j]];
        tot += w[j];
    }
    if (r->norm_topk)
        for (uint32_t j = 0; j < k; j++)
            w[j] /= tot + 1e-20f;
    for (uint32_t j = 0; j < k; j++)
        w[j] *= r->scale;
}

static void
route_topk_softmax(const wrk_moe_route_cfg *r, const float *p, uint32_t *sel, float *w)
{
    const uint32_t k = r->k;
    route_topk(p, r->E, k, sel);
    const float mx = p[sel[0]];
    double sum = 0.0;
    for (uint32_t j = 0; j < k; j++) {
        w[j] = expf(p[sel[j]] - mx);
        sum += w[j];
    }
    const float inv = (float)(1.0 / sum);
    for (uint32_t j = 0; j < k; j++)
        w[j] *= inv;
}

static void
route_softmax(const wrk_moe_route_cfg *r, float *p, uint32_t *sel, float *w)
{
    const uint32_t E = r->E, k = r->k;
    float mx = -INFINITY;
    for (uint32_t e = 0; e < E; e++)
        mx = p[e] > mx ? p[e] : mx;
    double sum = 0.0;
    for (uint32_t e = 0; e < E; e++) {
        p[e] = expf(p[e] - mx);
        sum += p[e];
    }
    const float inv = (float)(1.0 / sum);
    for (uint32_t e = 0; e < E; e++)
        p[e] *= inv;
    route_topk(p, E, k, sel);
    float tot = 0.0f;
    for (uint32_t j = 0; j < k; j++) {
        w[j] = p[sel[j]];
        tot += w[j];
    }
    if (r->norm_topk)
        for (uint32_t j = 0; j < k; j++)
            w[j] /= tot;
}

void
wrk_moe_route(const wrk_moe_route_cfg *r, float *p, float *cs, uint32_t *sel, float *w)
{
    if (r->route == WRK_MOE_SIGMOID)
        route_sigmoid(r, p, cs, sel, w);
    else if (r->route == WRK_MOE_TOPK_SOFTMAX)
        route_topk_softmax(r, p, sel, w);
    else
        route_softmax(r, p, sel, w);
    for (uint32_t j = 1; j < r->k; j++) /* ascending expert order (insertion sort) */
        for (uint32_t i = j; i > 0 && sel[i - 1] > sel[i]; i--) {
            uint32_t ts = sel[i];
            float tw = w[i];
            sel[i] = sel[i - 1], w[i] = w[i - 1];
            sel[i - 1] = ts, w[i - 1] = tw;
        }
}
