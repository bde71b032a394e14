/*
 * wk_cfg_tool: the option handling of a run-once program (wkvm-infer,
 * wkvm-mkmodel, the benchmarks) over wk_cfg, so that the tools read their
 * command line as the daemons do: one option table bound to the program's
 * options struct (wk_cfg_bind), --help printed from the table, --version,
 * --sample-config and --config FILE as everywhere. No environment: a tool's
 * options are its command line. Usage errors are one line on stderr,
 * "PROG: message (see --help)", and exit status 2 (or the tool's own).
 */
#ifndef WK_CFG_TOOL_H
#define WK_CFG_TOOL_H

#include <stddef.h>

#include "wk_cfg.h"

typedef struct wk_cfg_tool {
    const char *prog;         /* "wkvm-infer": the --version line, --help, error prefix */
    const char *about;        /* --help text between the usage line and the options */
    const wk_cfg_opt *opts;   /* the option table */
    size_t n_opts;            /* entries in opts */
    const wk_cfg_bind *binds; /* every option -> a field of the options struct */
    size_t n_binds;           /* entries in binds */
    const char *args;         /* positional arguments for the usage line ("TEMPLATE [CONTEXT]"),
                                 NULL: none */
    size_t max_pos;           /* positional arguments accepted (wk_cfg_npos/wk_cfg_pos) */
    int usage_status;         /* exit status of a usage error; 0 means 2 */
} wk_cfg_tool;

/* wk_cfg_tool_parse(): go on and run (conf is filled). */
#define WK_CFG_TOOL_RUN (-1)

/*
 * Parses argv against t and fills conf (wk_cfg_fill). Returns WK_CFG_TOOL_RUN
 * with *cfg set (free it with wk_cfg_free() once conf's strings, borrowed from
 * it, are no longer used), or the status main() exits with, *cfg NULL: 0
 * after --help, --version or --sample-config was printed on stdout, 2 (or
 * usage_status) after a usage error (unknown option, bad or out-of-range
 * value, more than max_pos positional arguments) was printed on stderr.
 * Aborts when t's bindings do not match its table (a programming error,
 * wk_cfg_binds_valid()).
 */
int wk_cfg_tool_parse(const wk_cfg_tool *t, int argc, char *argv[], void *conf, wk_cfg **cfg);

#endif /* WK_CFG_TOOL_H */
