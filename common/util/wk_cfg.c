/*
 * wk_cfg: table-driven configuration. Values are kept as validated text plus
 * a parsed integer/bool; each source overwrites the previous one in order
 * defaults < file < env < flags. Never logs.
 */
#include "wk_cfg.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define WK_CFG_LINE_MAX 8192
#define WK_CFG_POS_MAX 64

typedef struct wk_cfg_val {
    char *text;   /* owned; NULL = unset */
    uint64_t u64; /* parsed WK_CFG_U64 */
    bool b;       /* parsed WK_CFG_BOOL */
    bool set;     /* set by a source other than the default */
} wk_cfg_val;

struct wk_cfg {
    const wk_cfg_opt *table;      /* borrowed */
    size_t n;                     /* entries in table */
    wk_cfg_val *vals;             /* one per table entry */
    bool help;                    /* --help seen */
    bool version;                 /* --version seen */
    bool sample;                  /* --sample-config seen */
    char *pos[WK_CFG_POS_MAX];    /* positionals, owned */
    size_t npos;                  /* count of pos */
};

static ssize_t
wk_cfg_index(const wk_cfg_opt *table, size_t n, const char *name, size_t name_len)
{
    for (size_t i = 0; i < n; i++) {
        if (strlen(table[i].name) != name_len || strncmp(table[i].name, name, name_len) != 0)
            continue;
        if (table[i].type != WK_CFG_ALIAS)
            return (ssize_t)i;
        for (size_t k = 0; table[i].def != NULL && k < n; k++) /* an alias: its option */
            if (table[k].type != WK_CFG_ALIAS && strcmp(table[k].name, table[i].def) == 0)
                return (ssize_t)k;
        return -1;
    }
    return -1;
}

static wk_err
wk_cfg_set(wk_cfg *cfg, size_t i, const char *value, bool is_default, const char *source,
           wk_diag *d)
{
    const wk_cfg_opt *o = &cfg->table[i];
    wk_cfg_val *v = &cfg->vals[i];
    size_t lim = o->type == WK_CFG_STR && o->max > 0 ? (size_t)o->max : WK_CFG_STR_MAX;
    if (strlen(value) > lim)
        return wk_diag_set(d, WK_EINVAL, "%s: option %s: value longer than %zu bytes", source,
                           o->name, lim);
    uint64_t u = 0;
    bool b = false;
    if (o->type == WK_CFG_U64) {
        char *end = NULL;
        errno = 0;
        if (value[0] == '-' || !isdigit((unsigned char)value[0]))
            return wk_diag_set(d, WK_EINVAL, "%s: option %s: '%s' is not a number", source,
                               o->name, value);
        u = strtoull(value, &end, 10);
        if (errno != 0 || *end != '\0')
            return wk_diag_set(d, WK_EINVAL, "%s: option %s: '%s' is not a number", source,
                               o->name, value);
        if (u < o->min || u > o->max)
            return wk_diag_set(d, WK_EINVAL,
                               "%s: option %s: %llu is out of range [%llu, %llu]", source,
                               o->name, (unsigned long long)u, (unsigned long long)o->min,
                               (unsigned long long)o->max);
    } else if (o->type == WK_CFG_BOOL) {
        if (!strcasecmp(value, "true") || !strcasecmp(value, "yes") || !strcmp(value, "1") ||
            !strcasecmp(value, "on"))
            b = true;
        else if (!strcasecmp(value, "false") || !strcasecmp(value, "no") ||
                 !strcmp(value, "0") || !strcasecmp(value, "off"))
            b = false;
        else
            return wk_diag_set(d, WK_EINVAL, "%s: option %s: '%s' is not a boolean", source,
                               o->name, value);
    }
    char *copy = strdup(value);
    if (copy == NULL)
        return WK_ENOMEM;
    free(v->text);
    v->text = copy;
    v->u64 = u;
    v->b = b;
    if (!is_default)
        v->set = true;
    return WK_OK;
}

static char *
wk_cfg_trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t len = strlen(s);
    while (len > 0 && isspace((unsigned char)s[len - 1]))
        s[--len] = '\0';
    return s;
}

static wk_err
wk_cfg_load_file(wk_cfg *cfg, const char *path, wk_diag *d)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return wk_diag_set(d, errno == ENOENT ? WK_ENOENT : WK_EIO, "config %s: %s", path,
                           strerror(errno));
    char line[WK_CFG_LINE_MAX];
    unsigned lineno = 0;
    wk_err err = WK_OK;
    while (fgets(line, sizeof(line), f) != NULL) {
        lineno++;
        size_t len = strlen(line);
        if (len == sizeof(line) - 1 && line[len - 1] != '\n') {
            err = wk_diag_set(d, WK_EINVAL, "config %s line %u: line too long", path, lineno);
            break;
        }
        char *s = wk_cfg_trim(line);
        if (*s == '\0' || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (eq == NULL) {
            err = wk_diag_set(d, WK_EINVAL, "config %s line %u: expected 'key = value'", path,
                              lineno);
            break;
        }
        *eq = '\0';
        char *key = wk_cfg_trim(s);
        char *val = wk_cfg_trim(eq + 1);
        ssize_t i = wk_cfg_index(cfg->table, cfg->n, key, strlen(key));
        if (i < 0) {
            err = wk_diag_set(d, WK_EINVAL, "config %s line %u: unknown option '%s'", path,
                              lineno, key);
            break;
        }
        char src[64];
        snprintf(src, sizeof(src), "config line %u", lineno);
        err = wk_cfg_set(cfg, (size_t)i, val, false, src, d);
        if (err != WK_OK)
            break;
    }
    fclose(f);
    return err;
}

static wk_err
wk_cfg_load_env(wk_cfg *cfg, const char *prefix, wk_diag *d)
{
    /* Aliases first: an option's current name wins when both are set. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < cfg->n; i++) {
            if ((cfg->table[i].type == WK_CFG_ALIAS) != (pass == 0))
                continue;
            ssize_t t = wk_cfg_index(cfg->table, cfg->n, cfg->table[i].name,
                                     strlen(cfg->table[i].name));
            if (t < 0)
                continue;
            char var[256];
            int k = snprintf(var, sizeof(var), "%s_", prefix);
            for (const char *p = cfg->table[i].name; *p && k < (int)sizeof(var) - 1; p++)
                var[k++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
            var[k] = '\0';
            const char *val = getenv(var);
            if (val == NULL)
                continue;
            wk_err err = wk_cfg_set(cfg, (size_t)t, val, false, var, d);
            if (err != WK_OK)
                return err;
        }
    }
    return WK_OK;
}

wk_err
wk_cfg_parse(const wk_cfg_opt *table, size_t n, const char *env_prefix, int argc,
             char *const argv[], wk_cfg **out, wk_diag *d)
{
    wk_err err = WK_ENOMEM;
    wk_cfg *cfg = calloc(1, sizeof(*cfg));
    if (cfg == NULL)
        return WK_ENOMEM;
    cfg->table = table;
    cfg->n = n;
    cfg->vals = calloc(n ? n : 1, sizeof(*cfg->vals));
    if (cfg->vals == NULL)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        if (table[i].def != NULL && table[i].type != WK_CFG_ALIAS) {
            err = wk_cfg_set(cfg, i, table[i].def, true, "default", d);
            if (err != WK_OK)
                goto fail;
        }
    }
    /* First pass over argv: --config, --help, --sample-config. */
    const char *config_path = NULL;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--") == 0)
            break;
        if (strcmp(argv[a], "--config") == 0) {
            if (a + 1 >= argc) {
                err = wk_diag_set(d, WK_EINVAL, "option --config needs a value");
                goto fail;
            }
            config_path = argv[++a];
        } else if (strncmp(argv[a], "--config=", 9) == 0) {
            config_path = argv[a] + 9;
        } else if (strcmp(argv[a], "--help") == 0 || strcmp(argv[a], "-h") == 0) {
            cfg->help = true;
        } else if (strcmp(argv[a], "--sample-config") == 0) {
            cfg->sample = true;
        } else if (strcmp(argv[a], "--version") == 0) {
            cfg->version = true;
        }
    }
    if (config_path != NULL) {
        err = wk_cfg_load_file(cfg, config_path, d);
        if (err != WK_OK)
            goto fail;
    }
    if (env_prefix != NULL) {
        err = wk_cfg_load_env(cfg, env_prefix, d);
        if (err != WK_OK)
            goto fail;
    }
    bool only_pos = false;
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (!only_pos && strcmp(arg, "--") == 0) {
            only_pos = true;
            continue;
        }
        if (only_pos || strncmp(arg, "--", 2) != 0) {
            if (cfg->npos >= WK_CFG_POS_MAX) {
                err = wk_diag_set(d, WK_EINVAL, "too many arguments (max %d)", WK_CFG_POS_MAX);
                goto fail;
            }
            cfg->pos[cfg->npos] = strdup(arg);
            if (cfg->pos[cfg->npos] == NULL) {
                err = WK_ENOMEM;
                goto fail;
            }
            cfg->npos++;
            continue;
        }
        if (strcmp(arg, "--config") == 0) {
            a++;
            continue;
        }
        if (strncmp(arg, "--config=", 9) == 0 || strcmp(arg, "--help") == 0 ||
            strcmp(arg, "--sample-config") == 0 || strcmp(arg, "--version") == 0)
            continue;
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        ssize_t i = wk_cfg_index(table, n, name, name_len);
        if (i < 0) {
            err = wk_diag_set(d, WK_EINVAL, "unknown option --%.*s (see --help)",
                              (int)name_len, name);
            goto fail;
        }
        const char *value = NULL;
        if (eq != NULL) {
            value = eq + 1;
        } else if (table[i].type == WK_CFG_BOOL &&
                   (a + 1 >= argc || strncmp(argv[a + 1], "--", 2) == 0 ||
                    (strcasecmp(argv[a + 1], "true") && strcasecmp(argv[a + 1], "false")))) {
            value = "true";
        } else {
            if (a + 1 >= argc) {
                err = wk_diag_set(d, WK_EINVAL, "option --%s needs a value", table[i].name);
                goto fail;
            }
            value = argv[++a];
        }
        char src[160];
        snprintf(src, sizeof(src), "flag --%s", table[i].name);
        err = wk_cfg_set(cfg, (size_t)i, value, false, src, d);
        if (err != WK_OK)
            goto fail;
    }
    *out = cfg;
    return WK_OK;
fail:
    wk_cfg_free(cfg);
    return err;
}

void
wk_cfg_free(wk_cfg *cfg)
{
    if (cfg == NULL)
        return;
    if (cfg->vals != NULL) {
        for (size_t i = 0; i < cfg->n; i++)
            free(cfg->vals[i].text);
        free(cfg->vals);
    }
    for (size_t i = 0; i < cfg->npos; i++)
        free(cfg->pos[i]);
    free(cfg);
}

bool
wk_cfg_help_requested(const wk_cfg *cfg)
{
    return cfg->help;
}

bool
wk_cfg_version_requested(const wk_cfg *cfg)
{
    return cfg->version;
}

bool
wk_cfg_sample_requested(const wk_cfg *cfg)
{
    return cfg->sample;
}

static const wk_cfg_val *
wk_cfg_val_get(const wk_cfg *cfg, const char *name)
{
    ssize_t i = wk_cfg_index(cfg->table, cfg->n, name, strlen(name));
    return i < 0 ? NULL : &cfg->vals[i];
}

const char *
wk_cfg_get_str(const wk_cfg *cfg, const char *name)
{
    const wk_cfg_val *v = wk_cfg_val_get(cfg, name);
    return v ? v->text : NULL;
}

uint64_t
wk_cfg_get_u64(const wk_cfg *cfg, const char *name)
{
    const wk_cfg_val *v = wk_cfg_val_get(cfg, name);
    return v && v->text ? v->u64 : 0;
}

bool
wk_cfg_get_bool(const wk_cfg *cfg, const char *name)
{
    const wk_cfg_val *v = wk_cfg_val_get(cfg, name);
    return v && v->text ? v->b : false;
}

bool
wk_cfg_is_set(const wk_cfg *cfg, const char *name)
{
    const wk_cfg_val *v = wk_cfg_val_get(cfg, name);
    return v ? v->set : false;
}

size_t
wk_cfg_npos(const wk_cfg *cfg)
{
    return cfg->npos;
}

const char *
wk_cfg_pos(const wk_cfg *cfg, size_t i)
{
    return i < cfg->npos ? cfg->pos[i] : NULL;
}

static const char *
wk_cfg_type_name(wk_cfg_type t)
{
    switch (t) {
    case WK_CFG_U64:
        return "N";
    case WK_CFG_BOOL:
        return "BOOL";
    default:
        return "STR";
    }
}

void
wk_cfg_print_help(const wk_cfg_opt *table, size_t n, const char *prog, const char *summary,
                  const char *env_prefix, FILE *f)
{
    fprintf(f, "Usage: %s [OPTIONS]\n%s\n\nOptions:\n", prog, summary ? summary : "");
    for (size_t i = 0; i < n; i++) {
        const wk_cfg_opt *o = &table[i];
        if (o->type == WK_CFG_ALIAS)
            continue;
        char flag[96];
        snprintf(flag, sizeof(flag), "--%s %s", o->name, wk_cfg_type_name(o->type));
        fprintf(f, "  %-30s %s", flag, o->help);
        for (size_t k = 0; k < n; k++)
            if (table[k].type == WK_CFG_ALIAS && table[k].def != NULL &&
                strcmp(table[k].def, o->name) == 0)
                fprintf(f, " (also --%s)", table[k].name);
        if (o->def != NULL && o->def[0] != '\0')
            fprintf(f, " (default: %s)", o->def);
        if (o->type == WK_CFG_U64)
            fprintf(f, " [%llu..%llu]", (unsigned long long)o->min, (unsigned long long)o->max);
        fputc('\n', f);
    }
    fprintf(f, "  %-30s %s\n", "--config FILE", "read 'key = value' lines from FILE");
    fprintf(f, "  %-30s %s\n", "--sample-config", "print an annotated config file and exit");
    fprintf(f, "  %-30s %s\n", "--help", "print this help and exit");
    fprintf(f, "  %-30s %s\n", "--version", "print the version (" WK_VERSION ") and exit");
    if (env_prefix != NULL)
        fprintf(f, "\nEvery option can also be set as %s_<NAME> in the environment.\n"
                   "Precedence: defaults < config file < environment < flags.\n",
                env_prefix);
}

void
wk_cfg_print_sample(const wk_cfg_opt *table, size_t n, FILE *f)
{
    for (size_t i = 0; i < n; i++) {
        const wk_cfg_opt *o = &table[i];
        if (o->type == WK_CFG_ALIAS)
            continue;
        fprintf(f, "# %s", o->help);
        if (o->type == WK_CFG_U64)
            fprintf(f, " [%llu..%llu]", (unsigned long long)o->min, (unsigned long long)o->max);
        fprintf(f, "\n# %s = %s\n\n", o->name, o->def ? o->def : "");
    }
}

/* ------------------------------------------------------------------------ */
/* binding the table to a struct                                             */
/* ------------------------------------------------------------------------ */

bool
wk_cfg_binds_valid(const wk_cfg_opt *table, size_t n, const wk_cfg_bind *binds, size_t nb)
{
    for (size_t i = 0; i < nb; i++) {
        const wk_cfg_bind *b = &binds[i];
        const wk_cfg_opt *o = NULL;
        for (size_t j = 0; j < n && o == NULL; j++)
            if (strcmp(table[j].name, b->opt) == 0)
                o = &table[j];
        if (o == NULL)
            return false;
        switch (b->type) {
        case WK_CFG_FIELD_STR:
            if (o->type != WK_CFG_STR)
                return false;
            break;
        case WK_CFG_FIELD_BOOL:
            if (o->type != WK_CFG_BOOL)
                return false;
            break;
        case WK_CFG_FIELD_U32:
        case WK_CFG_FIELD_UINT:
            if (o->type != WK_CFG_U64 || o->max > UINT32_MAX || o->max > UINT_MAX)
                return false;
            break;
        case WK_CFG_FIELD_SIZE:
            if (o->type != WK_CFG_U64 || o->max > SIZE_MAX)
                return false;
            break;
        case WK_CFG_FIELD_U64:
            if (o->type != WK_CFG_U64)
                return false;
            break;
        default:
            return false;
        }
    }
    for (size_t j = 0; j < n; j++) {
        bool bound = table[j].type == WK_CFG_ALIAS; /* (an older name: its option is) */
        for (size_t i = 0; i < nb && !bound; i++)
            bound = strcmp(binds[i].opt, table[j].name) == 0;
        if (!bound)
            return false;
    }
    return true;
}

void
wk_cfg_fill(const wk_cfg *cfg, const wk_cfg_bind *binds, size_t nb, void *conf)
{
    for (size_t i = 0; i < nb; i++) {
        const wk_cfg_bind *b = &binds[i];
        char *field = (char *)conf + b->off;
        switch (b->type) {
        case WK_CFG_FIELD_STR:
            *(const char **)(void *)field = wk_cfg_get_str(cfg, b->opt);
            break;
        case WK_CFG_FIELD_BOOL:
            *(bool *)(void *)field = wk_cfg_get_bool(cfg, b->opt);
            break;
        case WK_CFG_FIELD_U32:
            *(uint32_t *)(void *)field = (uint32_t)wk_cfg_get_u64(cfg, b->opt);
            break;
        case WK_CFG_FIELD_UINT:
            *(unsigned *)(void *)field = (unsigned)wk_cfg_get_u64(cfg, b->opt);
            break;
        case WK_CFG_FIELD_SIZE:
            *(size_t *)(void *)field = (size_t)wk_cfg_get_u64(cfg, b->opt);
            break;
        case WK_CFG_FIELD_U64:
            *(uint64_t *)(void *)field = wk_cfg_get_u64(cfg, b->opt);
            break;
        }
    }
}
