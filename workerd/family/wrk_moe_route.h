/*
 * wrk_moe_route: the routing of one token of a mixture-of-experts MLP, for
 * every backend (the CPU pass and the CUDA step's host-side routing call the
 * same code, so they choose the same experts from the same logits).
 */
#ifndef WRK_MOE_ROUTE_H
#define WRK_MOE_ROUTE_H

#include <stdbool.h>
#include <stdint.h>

#include "wk_err.h"
#include "wrk_gdn.h"

#define WRK_MOE_ROUTE_GROUPS_MAX 64 /* expert groups of SIGMOID routing */

typedef struct wrk_moe_route_cfg {
    uint32_t E, k;                /* experts, chosen per token */
    wrk_moe_router route;         /* SOFTMAX, SIGMOID or TOPK_SOFTMAX */
    bool norm_topk;               /* SOFTMAX, SIGMOID: renormalise the top-k weights */
    uint32_t n_group, topk_group; /* SIGMOID: groups, groups kept (1, 1: none) */
    float scale;                  /* SIGMOID: routed_scaling_factor */
    float *score_bias;            /* SIGMOID: [E] host fp32, owned (zeros when the checkpoint
                                     has none); NULL otherwise */
} wrk_moe_route_cfg;

/*
 * The routing of layer's experts wm: checks the counts and the groups
 * (errors name who, e.g. "cpu backend", and the layer) and reads the score
 * bias. wrk_moe_route_close() frees what it holds.
 */
WK_MUST_CHECK wk_err wrk_moe_route_open(wrk_moe_route_cfg *r, const wrk_moe *wm, const char *who,
                                        uint32_t layer, wk_diag *d);
void wrk_moe_route_close(wrk_moe_route_cfg *r);

/*
 * Routes one token: p holds its E router logits (overwritten: probabilities
 * or sigmoid scores), cs is [E] scratch (SIGMOID). sel gets the k chosen
 * experts in ascending order, w their weights.
 *   SOFTMAX: softmax of the logits (max first, exp sum in double, fp32
 *     probabilities), the k largest (larger first, equal ones by the lower
 *     index), renormalised to sum 1 with norm_topk.
 *   SIGMOID (transformers' NemotronHTopkRouter): s = sigmoid(logits), choice
 *     c = s + score_bias; per group of E / n_group experts the sum of its two
 *     best c; the topk_group best groups (ties to the lower index) stay
 *     eligible; the k best c among them; their s, renormalised with
 *     norm_topk (+1e-20), times scale.
 *   TOPK_SOFTMAX (Granite's GraniteMoeHybridTopKRouter): the k largest
 *     logits, then exp(l - max) with the sum in double.
 */
void wrk_moe_route(const wrk_moe_route_cfg *r, float *p, float *cs, uint32_t *sel, float *w);

#endif
