/* wrk_fam_gdn: PLACEHOLDER being written. */
#include "wrk_family.h"

static const char *const types[] = {"gated_deltanet", NULL};

static bool
detect(const wk_tensor_set *set)
{
    (void)set;
    return false;
}

static wk_err
map(wrk_model *m, const wk_tensor_set *set, const json_t *config, void **view,
    wrk_model_info *info, wk_diag *d)
{
    (void)m, (void)set, (void)config, (void)view, (void)info;
    return wk_diag_set(d, WK_ENOTSUP, "gdn: not built yet");
}

static size_t
layout(const void *view, wrk_state_tensor *out, size_t cap)
{
    (void)view, (void)out, (void)cap;
    return 0;
}

const wrk_family wrk_family_gdn = {
    .name = "gdn",
    .model_types = types,
    .detect = detect,
    .map = map,
    .state_layout = layout,
};
