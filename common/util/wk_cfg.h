/*
 * wk_cfg: one config table per program drives parsing, validation, --help
 * and the annotated sample config. Sources, lowest precedence first:
 * the table's defaults < a config file (--config FILE, `key = value` lines,
 * '#' comments) < environment (PREFIX_KEY, upper case, '-' -> '_') < flags
 * (--key VALUE or --key=VALUE; a bool flag alone means true).
 * Never logs; errors come back as wk_err with a diag naming the option.
 */
#ifndef WK_CFG_H
#define WK_CFG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "wk_err.h"

typedef enum wk_cfg_type {
    WK_CFG_STR = 0, /* any string (max bytes: the option's max, 0 = WK_CFG_STR_MAX) */
    WK_CFG_U64,     /* unsigned integer in [min, max] */
    WK_CFG_BOOL,    /* true/false/yes/no/1/0/on/off */
    WK_CFG_ALIAS,   /* an older name of the option named by def (flag, env, file key);
                       not listed by --help and the sample config on its own */
} wk_cfg_type;

#define WK_CFG_STR_MAX 4096

typedef struct wk_cfg_opt {
    const char *name;  /* "port": flag --port, env PREFIX_PORT, file key port */
    wk_cfg_type type;  /* value type */
    const char *def;   /* default as text; NULL = unset */
    uint64_t min;      /* WK_CFG_U64: smallest value */
    uint64_t max;      /* WK_CFG_U64: largest value; WK_CFG_STR: longest value in bytes
                          (0 = WK_CFG_STR_MAX) */
    const char *help;  /* one line for --help and the sample config */
} wk_cfg_opt;

typedef struct wk_cfg wk_cfg;

/*
 * Parses the sources above against table (n entries, borrowed for the life of
 * the result). env_prefix: "WKVM" for WKVM_PORT; NULL disables env.
 * Non-option arguments are collected as positionals.
 * On success *out is owned by the caller (wk_cfg_free). "--help" sets
 * wk_cfg_help_requested(). Returns WK_EINVAL (unknown option, bad value, out
 * of range; diag names the option and the source), WK_ENOENT/WK_EIO for the
 * config file, WK_ENOMEM.
 */
WK_MUST_CHECK wk_err wk_cfg_parse(const wk_cfg_opt *table, size_t n, const char *env_prefix,
                                  int argc, char *const argv[], wk_cfg **out, wk_diag *d);

/* Frees cfg. NULL-safe. */
void wk_cfg_free(wk_cfg *cfg);

/* True when --help was given. */
bool wk_cfg_help_requested(const wk_cfg *cfg);

/* True when --version was given (print "PROG " WK_VERSION and exit 0). */
bool wk_cfg_version_requested(const wk_cfg *cfg);

/* True when --sample-config was given. */
bool wk_cfg_sample_requested(const wk_cfg *cfg);

/* Value of a WK_CFG_STR option, borrowed; NULL when unset. name must be in the table. */
const char *wk_cfg_get_str(const wk_cfg *cfg, const char *name);

/* Value of a WK_CFG_U64 option (0 when unset). */
uint64_t wk_cfg_get_u64(const wk_cfg *cfg, const char *name);

/* Value of a WK_CFG_BOOL option (false when unset). */
bool wk_cfg_get_bool(const wk_cfg *cfg, const char *name);

/* True when the option was set by a file, env or flag (not the default). */
bool wk_cfg_is_set(const wk_cfg *cfg, const char *name);

/* Positional arguments, borrowed. */
size_t wk_cfg_npos(const wk_cfg *cfg);
const char *wk_cfg_pos(const wk_cfg *cfg, size_t i);

/* Writes --help text for the table to f. */
void wk_cfg_print_help(const wk_cfg_opt *table, size_t n, const char *prog, const char *summary,
                       const char *env_prefix, FILE *f);

/* Writes an annotated sample config file (every option, commented, with default) to f. */
void wk_cfg_print_sample(const wk_cfg_opt *table, size_t n, FILE *f);

/*
 * Binding the table to a program's own config struct, so main() reads
 * fields instead of looking options up by name: one wk_cfg_bind per
 * option -> field copy (an option may go to several fields), checked
 * against the table once (wk_cfg_binds_valid) and copied after parsing
 * (wk_cfg_fill).
 */
typedef enum wk_cfg_field {
    WK_CFG_FIELD_STR,  /* const char * (borrowed from the wk_cfg), WK_CFG_STR */
    WK_CFG_FIELD_BOOL, /* bool, WK_CFG_BOOL */
    WK_CFG_FIELD_U32,  /* uint32_t, WK_CFG_U64 whose max fits */
    WK_CFG_FIELD_UINT, /* unsigned, WK_CFG_U64 whose max fits */
    WK_CFG_FIELD_SIZE, /* size_t, WK_CFG_U64 whose max fits */
    WK_CFG_FIELD_U64,  /* uint64_t, WK_CFG_U64 */
} wk_cfg_field;

typedef struct wk_cfg_bind {
    const char *opt;   /* name in the option table */
    wk_cfg_field type; /* the field's C type */
    size_t off;        /* offsetof(struct, field) */
} wk_cfg_bind;

/* One binding of option opt to field of struct type conf ({"port", UINT, http.port}). */
#define WK_CFG_BIND(conf, opt, type, field) {opt, WK_CFG_FIELD_##type, offsetof(conf, field)}

/*
 * True when binds (nb entries) agree with table (n entries): every binding
 * names an option of a matching type whose largest value fits its field,
 * and every option but an alias is bound. A mismatch is a programming
 * error (callers abort).
 */
bool wk_cfg_binds_valid(const wk_cfg_opt *table, size_t n, const wk_cfg_bind *binds, size_t nb);

/* Copies every bound option's value from cfg into conf (strings borrowed from cfg). */
void wk_cfg_fill(const wk_cfg *cfg, const wk_cfg_bind *binds, size_t nb, void *conf);

#endif /* WK_CFG_H */
