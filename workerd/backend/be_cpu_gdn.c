/* be_cpu_gdn: PLACEHOLDER being written. */
#include "be_cpu_common.h"

static wk_err
op_open(const be_config *cfg, const wrk_model *m, be_ctx **out, wk_diag *d)
{
    (void)cfg, (void)m, (void)out;
    return wk_diag_set(d, WK_ENOTSUP, "cpu backend: gdn not built yet");
}

const be_ops be_cpu_gdn_ops = {
    .name = "cpu",
    .open = op_open,
};
