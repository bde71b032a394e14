/*
 * wk_cfg_tool: a tool's command line through wk_cfg (see wk_cfg_tool.h).
 */
#include "wk_cfg_tool.h"

#include <stdio.h>
#include <stdlib.h>

int
wk_cfg_tool_parse(const wk_cfg_tool *t, int argc, char *argv[], void *conf, wk_cfg **cfg)
{
    *cfg = NULL;
    if (!wk_cfg_binds_valid(t->opts, t->n_opts, t->binds, t->n_binds)) {
        fprintf(stderr, "%s: the option table and its bindings disagree\n", t->prog);
        abort();
    }
    const int usage = t->usage_status != 0 ? t->usage_status : 2;
    wk_diag d = {{0}};
    wk_cfg *c = NULL;
    wk_err e = wk_cfg_parse(t->opts, t->n_opts, NULL, argc, argv, &c, &d);
    if (e != WK_OK) {
        fprintf(stderr, "%s: %s\n", t->prog, d.msg[0] ? d.msg : wk_strerror(e));
        return usage;
    }
    int rc = WK_CFG_TOOL_RUN;
    if (wk_cfg_version_requested(c)) {
        printf("%s %s\n", t->prog, WK_VERSION);
        rc = 0;
    } else if (wk_cfg_help_requested(c)) {
        if (t->args != NULL) {
            char prog[256];
            snprintf(prog, sizeof(prog), "%s %s", t->prog, t->args);
            wk_cfg_print_help(t->opts, t->n_opts, prog, t->about, NULL, stdout);
        } else {
            wk_cfg_print_help(t->opts, t->n_opts, t->prog, t->about, NULL, stdout);
        }
        rc = 0;
    } else if (wk_cfg_sample_requested(c)) {
        wk_cfg_print_sample(t->opts, t->n_opts, stdout);
        rc = 0;
    } else if (wk_cfg_npos(c) > t->max_pos) {
        fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", t->prog,
                wk_cfg_pos(c, t->max_pos));
        rc = usage;
    }
    if (rc != WK_CFG_TOOL_RUN) {
        wk_cfg_free(c);
        return rc;
    }
    wk_cfg_fill(c, t->binds, t->n_binds, conf);
    *cfg = c;
    return WK_CFG_TOOL_RUN;
}
