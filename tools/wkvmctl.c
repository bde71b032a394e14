/*
 * wkvmctl: the operator's command-line client of a wkvm controller. It is a
 * thin client of the HTTP API (the admin routes and the Durable State API),
 * built as a command table in the manner of libvirt's virsh: every command
 * has a name, an option table (which drives parsing, usage and --help), a
 * one-line summary, the route it calls, and a handler that returns the exit
 * status.
 *
 * People get aligned tables; --json prints the server's JSON unchanged (a
 * paged list is merged into one document). Errors are one line on stderr:
 * the server's OpenAI-style message and the HTTP status.
 *
 * Exit status: 0 success; 1 the server refused or failed, or a local file
 * could not be read or written; 2 usage error; 3 the server could not be
 * reached (or gave no valid HTTP response in time).
 *
 * It must never talk to workers or the store directly, never trust the
 * shape of a response (every field goes through a type-checking helper), and
 * never leave a half-written export under the requested name.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "wctl_http.h"
#include "wctl_table.h"
#include "wk_json.h"

#define WCTL_DEFAULT_URL "http://127.0.0.1:8000" /* the controller's default bind */
#define WCTL_DEFAULT_TIMEOUT_S 600u              /* response wait; generations can be long */
#define WCTL_TIMEOUT_MAX_S 604800u               /* --timeout upper bound (a week) */
#define WCTL_OPTS_MAX 16                         /* most options of one command */
#define WCTL_PATH_MAX 4096                       /* longest request path with query */
#define WCTL_CURSOR_MAX 1024                     /* longest list cursor accepted */
#define WCTL_PAGES_MAX 100000u                   /* list pages followed at most */
#define WCTL_PROGRESS_MIN (1u << 20)             /* bodies this large report progress */
#define WCTL_TOKEN_IDS_SHOWN 32                  /* token ids `state` prints before "..." */

enum {
    WCTL_EXIT_OK = 0,      /* success */
    WCTL_EXIT_SERVER = 1,  /* the server refused or failed; a local file error */
    WCTL_EXIT_USAGE = 2,   /* bad command line */
    WCTL_EXIT_CONNECT = 3, /* the server could not be reached */
};

typedef enum wctl_opt_type {
    WCTL_OPT_ARG = 0, /* a positional argument, matched in table order */
    WCTL_OPT_STR,     /* --name VALUE */
    WCTL_OPT_U64,     /* --name N: decimal, 0..INT64_MAX */
    WCTL_OPT_NUM,     /* --name X: a finite number */
    WCTL_OPT_BOOL,    /* --name, no value */
} wctl_opt_type;

typedef struct wctl_opt {
    const char *name;    /* flag name without "--", or a positional's placeholder ("ID") */
    char short_name;     /* one-letter alias ('o' for -o), 0 for none */
    wctl_opt_type type;  /* kind of value */
    bool required;       /* must be given */
    const char *metavar; /* value placeholder in usage ("TEXT"); NULL for BOOL and ARG */
    const char *help;    /* one line for --help */
} wctl_opt;

typedef struct wctl_ctx wctl_ctx;
typedef struct wctl_args wctl_args;

/* A command handler: returns the exit status, having printed what it has to say. */
typedef int (*wctl_cmd_fn)(wctl_ctx *c, const wctl_args *a);

typedef struct wctl_cmd {
    const char *name;     /* command word ("states") */
    wctl_cmd_fn fn;       /* handler */
    const wctl_opt *opts; /* options and positionals, ended by an entry with a NULL name */
    const char *summary;  /* one line for the command list */
    const char *route;    /* the HTTP route(s) it calls, for --help; NULL: none */
    const char *action;   /* wctl_cmd_state_action: the path after /v1/states/ID */
    const char *verb;     /* wctl_cmd_state_action: the word before each state printed */
} wctl_cmd;

struct wctl_args {
    const wctl_cmd *cmd;            /* the command, NULL when none was given */
    const wctl_opt *opts;           /* the table val[] follows (cmd->opts or the globals) */
    const char *val[WCTL_OPTS_MAX]; /* per option: value borrowed from argv, "1" for a BOOL */
    uint64_t u64[WCTL_OPTS_MAX];    /* per WCTL_OPT_U64 option: the parsed value */
    double num[WCTL_OPTS_MAX];      /* per WCTL_OPT_NUM option: the parsed value */
};

struct wctl_ctx {
    const char *url_text; /* the URL as given, for messages */
    wctl_url url;         /* the URL parsed */
    const char *key;      /* API key, NULL for none */
    unsigned timeout_s;   /* response wait, 0 = forever */
    bool json;            /* print the server's JSON */
    wctl_http_opts http;  /* what wctl_http_do needs */
};

/* A response whose status was acceptable. */
typedef struct wctl_reply {
    int status;   /* HTTP status */
    char *raw;    /* body, NUL-terminated, owned */
    size_t len;   /* bytes in raw */
    json_t *json; /* raw parsed, owned; NULL when the body is not JSON (or was streamed) */
} wctl_reply;

static void
wctl_reply_fini(wctl_reply *r)
{
    free(r->raw);
    json_decref(r->json);
    memset(r, 0, sizeof(*r));
}

/* ------------------------------------------------------------------------ */
/* Option tables                                                            */
/* ------------------------------------------------------------------------ */

static const wctl_opt wctl_global_opts[] = {
    {"url", 0, WCTL_OPT_STR, false, "URL",
     "controller URL (env WKVM_URL; default " WCTL_DEFAULT_URL ")"},
    {"key", 0, WCTL_OPT_STR, false, "KEY",
     "API key, sent as 'Authorization: Bearer KEY' (env WKVM_API_KEY)"},
    {"json", 0, WCTL_OPT_BOOL, false, NULL, "print the server's JSON instead of tables"},
    {"timeout", 0, WCTL_OPT_U64, false, "SECONDS",
     "wait this long for a response, 0 = forever (default 600)"},
    {"help", 'h', WCTL_OPT_BOOL, false, NULL, "print help (of a command: wkvmctl CMD --help)"},
    {"version", 0, WCTL_OPT_BOOL, false, NULL, "print the version and exit"},
    {NULL, 0, 0, false, NULL, NULL},
};

static const wctl_opt wctl_opts_none[] = {{NULL, 0, 0, false, NULL, NULL}};

static const wctl_opt wctl_opts_id[] = {
    {"ID", 0, WCTL_OPT_ARG, true, NULL, "state id (name@version)"},
    {NULL, 0, 0, false, NULL, NULL},
};

static const wctl_opt wctl_opts_states[] = {
    {"all", 0, WCTL_OPT_BOOL, false, NULL,
     "every user's states (GET /admin/states, an admin key), with an OWNER column"},
    {"page-size", 0, WCTL_OPT_U64, false, "N",
     "states per request while following the list cursor (server default 100)"},
    {NULL, 0, 0, false, NULL, NULL},
};

static const wctl_opt wctl_opts_create[] = {
    {"NAME", 0, WCTL_OPT_ARG, true, NULL, "name of the new state (its first version is NAME@1)"},
    {"prompt", 0, WCTL_OPT_STR, false, "TEXT", "the text to read into the state"},
    {"prompt-ids", 0, WCTL_OPT_STR, false, "IDS", "or token ids, comma separated: 1,2,3"},
    {NULL, 0, 0, false, NULL, NULL},
};

static const wctl_opt wctl_opts_generate[] = {
    {"ID", 0, WCTL_OPT_ARG, true, NULL, "state to continue from (it is not changed)"},
    {"prompt", 0, WCTL_OPT_STR, false, "TEXT", "text to feed after the state's tokens"},
    {"prompt-ids", 0, WCTL_OPT_STR, false, "IDS", "or token ids to feed, comma separated"},
    {"max-tokens", 0, WCTL_OPT_U64, false, "N", "tokens to generate (server default 16)"},
    {"save-as", 0, WCTL_OPT_STR, false, "NAME", "store the state after the generation as NAME"},
    {"temperature", 0, WCTL_OPT_NUM, false, "X", "sampling temperature, 0 = greedy"},
    {"top-p", 0, WCTL_OPT_NUM, false, "X", "nucleus sampling mass"},
    {"seed", 0, WCTL_OPT_U64, false, "N", "sampling seed (same seed, same tokens)"},
    {"ignore-eos", 0, WCTL_OPT_BOOL, false, NULL, "do not stop at the end-of-text token"},
    {"ids", 0, WCTL_OPT_BOOL, false, NULL, "print the generated token ids instead of the text"},
    {NULL, 0, 0, false, NULL, NULL},
};

static const wctl_opt wctl_opts_fork[] = {
    {"ID", 0, WCTL_OPT_ARG, true, NULL, "state to fork"},
    {"name", 0, WCTL_OPT_STR, true, "NAME", "name of the children"},
    {"count", 0, WCTL_OPT_U64, false, "N", "number of children (default 1)"},
    {NULL, 0, 0, false, NULL, NULL},
};

static const wctl_opt wctl_opts_export[] = {
    {"ID", 0, WCTL_OPT_ARG, true, NULL, "state to export"},
    {"output", 'o', WCTL_OPT_STR, true, "FILE", "file to write (replaced only when complete)"},
    {"progress", 0, WCTL_OPT_BOOL, false, NULL, "report progress even for small files"},
    {NULL, 0, 0, false, NULL, NULL},
};

static const wctl_opt wctl_opts_import[] = {
    {"FILE", 0, WCTL_OPT_ARG, true, NULL, "state file written by export"},
    {"name", 0, WCTL_OPT_STR, false, "NAME", "name of the imported state (default imported)"},
    {"progress", 0, WCTL_OPT_BOOL, false, NULL, "report progress even for small files"},
    {NULL, 0, 0, false, NULL, NULL},
};

static const wctl_opt wctl_opts_migrate[] = {
    {"SLOT", 0, WCTL_OPT_ARG, true, NULL, "slot id WORKER:INDEX (see wkvmctl slots)"},
    {"to", 0, WCTL_OPT_STR, true, "WORKER", "destination worker id"},
    {NULL, 0, 0, false, NULL, NULL},
};

static const wctl_opt wctl_opts_slot[] = {
    {"SLOT", 0, WCTL_OPT_ARG, true, NULL, "slot id WORKER:INDEX (see wkvmctl slots)"},
    {NULL, 0, 0, false, NULL, NULL},
};

static const wctl_opt wctl_opts_drain[] = {
    {"WORKER", 0, WCTL_OPT_ARG, true, NULL, "worker id"},
    {"undrain", 0, WCTL_OPT_BOOL, false, NULL, "let the worker take new work again"},
    {NULL, 0, 0, false, NULL, NULL},
};

static const wctl_opt wctl_opts_cache[] = {
    {"ACTION", 0, WCTL_OPT_ARG, false, NULL, "nothing to show the cache, or clear"},
    {"owner", 0, WCTL_OPT_STR, false, "OWNER", "only this owner's checkpoints"},
    {NULL, 0, 0, false, NULL, NULL},
};

static const wctl_opt wctl_opts_responses[] = {
    {"ACTION", 0, WCTL_OPT_ARG, false, NULL, "nothing to list stored responses, or delete"},
    {"ID", 0, WCTL_OPT_ARG, false, NULL, "response id (resp_...) to delete"},
    {"owner", 0, WCTL_OPT_STR, false, "OWNER", "only this user's responses"},
    {NULL, 0, 0, false, NULL, NULL},
};

static const wctl_opt wctl_opts_help[] = {
    {"COMMAND", 0, WCTL_OPT_ARG, false, NULL, "command to describe"},
    {NULL, 0, 0, false, NULL, NULL},
};

static const wctl_cmd wctl_cmds[];

/* ------------------------------------------------------------------------ */
/* Arguments                                                                */
/* ------------------------------------------------------------------------ */

static size_t
wctl_opt_index(const wctl_opt *opts, const char *name)
{
    for (size_t i = 0; opts[i].name != NULL; i++) {
        if (strcmp(opts[i].name, name) == 0)
            return i;
    }
    return SIZE_MAX;
}

/* Value of option name (which must be in the table), NULL when absent. */
static const char *
wctl_arg_str(const wctl_args *a, const char *name)
{
    size_t i = wctl_opt_index(a->opts, name);
    return i == SIZE_MAX ? NULL : a->val[i];
}

static bool
wctl_arg_bool(const wctl_args *a, const char *name)
{
    return wctl_arg_str(a, name) != NULL;
}

/* Parsed WCTL_OPT_U64 value; def when absent. */
static uint64_t
wctl_arg_u64(const wctl_args *a, const char *name, uint64_t def)
{
    size_t i = wctl_opt_index(a->opts, name);
    return i == SIZE_MAX || a->val[i] == NULL ? def : a->u64[i];
}

/* Parsed WCTL_OPT_NUM value; def when absent. */
static double
wctl_arg_num(const wctl_args *a, const char *name, double def)
{
    size_t i = wctl_opt_index(a->opts, name);
    return i == SIZE_MAX || a->val[i] == NULL ? def : a->num[i];
}

static const wctl_cmd *
wctl_cmd_find(const char *name)
{
    for (size_t i = 0; wctl_cmds[i].name != NULL; i++) {
        if (strcmp(wctl_cmds[i].name, name) == 0)
            return &wctl_cmds[i];
    }
    return NULL;
}

/* Writes the usage line of cmd (or of wkvmctl itself) to f. */
static void
wctl_usage_line(const wctl_cmd *cmd, FILE *f)
{
    if (cmd == NULL) {
        fprintf(f, "Usage: wkvmctl [--url URL] [--key KEY] [--json] [--timeout SECONDS] "
                   "COMMAND [ARGS]\n");
        return;
    }
    fprintf(f, "Usage: wkvmctl [GLOBAL OPTIONS] %s", cmd->name);
    for (const wctl_opt *o = cmd->opts; o->name != NULL; o++) {
        if (o->type == WCTL_OPT_ARG)
            fprintf(f, o->required ? " %s" : " [%s]", o->name);
        else if (o->type == WCTL_OPT_BOOL)
            fprintf(f, " [--%s]", o->name);
        else
            fprintf(f, o->required ? " --%s %s" : " [--%s %s]", o->name, o->metavar);
    }
    fputc('\n', f);
}

static void
wctl_opts_print(const wctl_opt *opts, FILE *f)
{
    for (const wctl_opt *o = opts; o->name != NULL; o++) {
        char flag[64];
        if (o->type == WCTL_OPT_ARG)
            snprintf(flag, sizeof(flag), "%s", o->name);
        else if (o->short_name != 0)
            snprintf(flag, sizeof(flag), "-%c, --%s%s%s", o->short_name, o->name,
                     o->metavar ? " " : "", o->metavar ? o->metavar : "");
        else
            snprintf(flag, sizeof(flag), "--%s%s%s", o->name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
        fprintf(f, "  %-22s %s%s\n", flag, o->help, o->required ? " (required)" : "");
    }
}

static void
wctl_help_print(const wctl_cmd *cmd, FILE *f)
{
    wctl_usage_line(cmd, f);
    if (cmd != NULL) {
        fprintf(f, "%s.\n", cmd->summary);
        if (cmd->route != NULL)
            fprintf(f, "Calls %s.\n", cmd->route);
        if (cmd->opts[0].name != NULL) {
            fprintf(f, "\nArguments and options:\n");
            wctl_opts_print(cmd->opts, f);
        }
        fprintf(f, "\nGlobal options (anywhere on the line):\n");
        wctl_opts_print(wctl_global_opts, f);
        return;
    }
    fprintf(f, "The operator's client of a wkvm controller's HTTP API.\n\nCommands:\n");
    for (const wctl_cmd *c = wctl_cmds; c->name != NULL; c++)
        fprintf(f, "  %-12s %s\n", c->name, c->summary);
    fprintf(f, "\nGlobal options:\n");
    wctl_opts_print(wctl_global_opts, f);
    fprintf(f, "\nRun 'wkvmctl COMMAND --help' for a command's arguments.\n"
               "Exit status: 0 ok, 1 the server refused or failed (or a local file error),\n"
               "2 usage error, 3 the server could not be reached.\n");
}

/* Reports a usage error about cmd (may be NULL) and returns WCTL_EXIT_USAGE. */
static int wctl_usage_fail(const wctl_cmd *cmd, const char *fmt, ...) WK_PRINTF(2, 3);

static int
wctl_usage_fail(const wctl_cmd *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("wkvmctl: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    wctl_usage_line(cmd, stderr);
    if (cmd != NULL)
        fprintf(stderr, "Run 'wkvmctl %s --help' for details.\n", cmd->name);
    else
        fprintf(stderr, "Run 'wkvmctl --help' for the commands.\n");
    return WCTL_EXIT_USAGE;
}

/* Checks and stores one option value. Returns 0 or WCTL_EXIT_USAGE (reported). */
static int
wctl_arg_set(const wctl_cmd *cmd, wctl_args *a, size_t i, const char *value)
{
    const wctl_opt *o = &a->opts[i];
    if (o->type == WCTL_OPT_U64) {
        char *end = NULL;
        errno = 0;
        unsigned long long v = value[0] >= '0' && value[0] <= '9' ? strtoull(value, &end, 10) : 0;
        if (end == NULL || *end != '\0' || errno != 0 || v > (unsigned long long)INT64_MAX)
            return wctl_usage_fail(cmd, "option --%s: '%s' is not a whole number", o->name, value);
        a->u64[i] = v;
    } else if (o->type == WCTL_OPT_NUM) {
        char *end = NULL;
        errno = 0;
        double x = strtod(value, &end);
        if (end == value || *end != '\0' || errno != 0 || !isfinite(x))
            return wctl_usage_fail(cmd, "option --%s: '%s' is not a number", o->name, value);
        a->num[i] = x;
    }
    a->val[i] = value;
    return 0;
}

/*
 * Parses argv: global options anywhere, the command word, then the
 * command's options and positionals. Returns -1 to go on, or an exit status
 * (help printed: 0; usage error reported: 2).
 */
static int
wctl_args_parse(int argc, char **argv, wctl_args *g, wctl_args *a)
{
    memset(g, 0, sizeof(*g));
    memset(a, 0, sizeof(*a));
    g->opts = wctl_global_opts;
    a->opts = wctl_opts_none;
    size_t npos = 0;
    bool only_pos = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!only_pos && strcmp(arg, "--") == 0) {
            only_pos = true;
            continue;
        }
        if (only_pos || arg[0] != '-' || arg[1] == '\0') {
            if (a->cmd == NULL) {
                a->cmd = wctl_cmd_find(arg);
                if (a->cmd == NULL)
                    return wctl_usage_fail(NULL, "unknown command '%s'", arg);
                a->opts = a->cmd->opts;
                continue;
            }
            size_t k = SIZE_MAX, seen = 0;
            for (size_t j = 0; a->opts[j].name != NULL; j++) {
                if (a->opts[j].type == WCTL_OPT_ARG && seen++ == npos) {
                    k = j;
                    break;
                }
            }
            if (k == SIZE_MAX)
                return wctl_usage_fail(a->cmd, "unexpected argument '%s'", arg);
            a->val[k] = arg;
            npos++;
            continue;
        }
        /* An option: --name, --name=value, --name value, -x, -x value. */
        char name[64];
        const char *inline_val = NULL;
        char short_name = 0;
        if (arg[1] == '-') {
            const char *eq = strchr(arg + 2, '=');
            size_t nl = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
            if (nl == 0 || nl >= sizeof(name))
                return wctl_usage_fail(a->cmd, "unknown option '%s'", arg);
            memcpy(name, arg + 2, nl);
            name[nl] = '\0';
            inline_val = eq ? eq + 1 : NULL;
        } else {
            if (arg[2] != '\0')
                return wctl_usage_fail(a->cmd, "unknown option '%s'", arg);
            short_name = arg[1];
            name[0] = '\0';
        }
        wctl_args *dst = NULL;
        size_t k = SIZE_MAX;
        wctl_args *both[2] = {a, g};
        for (int t = 0; t < 2 && dst == NULL; t++) {
            for (size_t j = 0; both[t]->opts[j].name != NULL; j++) {
                const wctl_opt *o = &both[t]->opts[j];
                if (o->type == WCTL_OPT_ARG)
                    continue;
                if (short_name ? o->short_name == short_name : strcmp(o->name, name) == 0) {
                    dst = both[t];
                    k = j;
                    break;
                }
            }
        }
        if (dst == NULL) {
            if (a->cmd != NULL)
                return wctl_usage_fail(a->cmd, "unknown option '%s' for '%s'", arg, a->cmd->name);
            return wctl_usage_fail(NULL, "unknown option '%s'", arg);
        }
        const wctl_opt *o = &dst->opts[k];
        if (o->type == WCTL_OPT_BOOL) {
            if (inline_val != NULL)
                return wctl_usage_fail(a->cmd, "option --%s takes no value", o->name);
            dst->val[k] = "1";
            continue;
        }
        const char *value = inline_val;
        if (value == NULL) {
            if (i + 1 >= argc)
                return wctl_usage_fail(a->cmd, "option --%s needs a value (%s)", o->name,
                                       o->metavar);
            value = argv[++i];
        }
        int rc = wctl_arg_set(dst == a ? a->cmd : NULL, dst, k, value);
        if (rc != 0)
            return rc;
    }
    if (g->val[wctl_opt_index(wctl_global_opts, "version")] != NULL) {
        printf("wkvmctl %s\n", WK_VERSION);
        return WCTL_EXIT_OK;
    }
    if (g->val[wctl_opt_index(wctl_global_opts, "help")] != NULL ||
        (a->cmd != NULL && strcmp(a->cmd->name, "help") == 0)) {
        const wctl_cmd *about = a->cmd;
        if (about != NULL && strcmp(about->name, "help") == 0) {
            const char *what = a->val[0];
            about = what != NULL ? wctl_cmd_find(what) : NULL;
            if (what != NULL && about == NULL)
                return wctl_usage_fail(NULL, "unknown command '%s'", what);
        }
        wctl_help_print(about, stdout);
        return WCTL_EXIT_OK;
    }
    if (a->cmd == NULL)
        return wctl_usage_fail(NULL, "no command given");
    for (size_t j = 0; a->opts[j].name != NULL; j++) {
        const wctl_opt *o = &a->opts[j];
        if (o->required && a->val[j] == NULL)
            return wctl_usage_fail(a->cmd, "missing %s%s", o->type == WCTL_OPT_ARG ? "" : "--",
                                   o->name);
        if (o->type != WCTL_OPT_BOOL && a->val[j] != NULL && a->val[j][0] == '\0')
            return wctl_usage_fail(a->cmd, "%s%s must not be empty",
                                   o->type == WCTL_OPT_ARG ? "" : "--", o->name);
    }
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Talking to the server                                                    */
/* ------------------------------------------------------------------------ */

/* Copies s into out as one printable line (control characters -> ' '). */
static void
wctl_one_line(const char *s, size_t len, char *out, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < len && n + 1 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        out[n++] = ch < 0x20 || ch == 0x7f ? ' ' : (char)ch;
    }
    while (n > 0 && out[n - 1] == ' ')
        n--;
    out[n] = '\0';
}

/* Reports a failure that is not an HTTP response. */
static int
wctl_transport_fail(const wctl_ctx *c, wk_err err, const wk_diag *d)
{
    const char *why = d->msg[0] ? d->msg : wk_strerror(err);
    switch (err) {
    case WK_EUNAVAIL:
        fprintf(stderr, "wkvmctl: cannot connect to %s: %s\n", c->url_text, why);
        return WCTL_EXIT_CONNECT;
    case WK_ETIMEDOUT:
        fprintf(stderr, "wkvmctl: no response from %s within %u s (see --timeout)\n", c->url_text,
                c->timeout_s);
        return WCTL_EXIT_CONNECT;
    case WK_EPROTO:
        fprintf(stderr, "wkvmctl: no valid response from %s: %s\n", c->url_text, why);
        return WCTL_EXIT_CONNECT;
    default:
        fprintf(stderr, "wkvmctl: %s\n", why);
        return WCTL_EXIT_SERVER;
    }
}

/* Reports an HTTP error response: the server's message and the status. */
static int
wctl_server_fail(int status, const char *raw, size_t len, const json_t *body)
{
    char line[600];
    json_t *e = json_object_get(body, "error");
    json_t *m = json_is_object(e) ? json_object_get(e, "message") : e;
    if (json_is_string(m) && json_string_length(m) > 0) {
        wctl_one_line(json_string_value(m), json_string_length(m), line, sizeof(line));
    } else if (len > 0 && raw != NULL) {
        size_t first = strcspn(raw, "\r\n");
        wctl_one_line(raw, first < len ? first : len, line,
                      sizeof(line) < 200 ? sizeof(line) : 200);
    } else {
        snprintf(line, sizeof(line), "the server gave no reason");
    }
    fprintf(stderr, "wkvmctl: %s (HTTP %d)\n", line[0] ? line : "error", status);
    return WCTL_EXIT_SERVER;
}

/*
 * Sends req and checks the answer: a 2xx (or also_ok) status, and when
 * want_json a JSON body. On success *out holds the reply (fini it) and 0 is
 * returned; otherwise the failure is reported and the exit status returned.
 */
static int
wctl_send(wctl_ctx *c, const wctl_http_req *req, int also_ok, bool want_json, wctl_reply *out)
{
    memset(out, 0, sizeof(*out));
    wctl_http_resp resp;
    wk_diag d = {{0}};
    wk_err err = wctl_http_do(&c->http, req, &resp, &d);
    if (err != WK_OK) {
        wctl_http_resp_fini(&resp);
        return wctl_transport_fail(c, err, &d);
    }
    out->status = resp.status;
    out->raw = resp.body;
    out->len = resp.len;
    if (out->len > 0 && wk_json_parse(out->raw, out->len, &out->json, NULL) != WK_OK)
        out->json = NULL;
    bool ok = (out->status >= 200 && out->status < 300) || out->status == also_ok;
    int rc = WCTL_EXIT_OK;
    if (!ok) {
        rc = wctl_server_fail(out->status, out->raw, out->len, out->json);
    } else if (want_json && !json_is_object(out->json)) {
        fprintf(stderr, "wkvmctl: the server's answer is not a JSON object (HTTP %d)\n",
                out->status);
        rc = WCTL_EXIT_SERVER;
    }
    if (rc != WCTL_EXIT_OK)
        wctl_reply_fini(out);
    return rc;
}

/* A JSON request (body may be NULL) expecting a JSON object back. */
static int
wctl_call(wctl_ctx *c, const char *method, const char *path, const json_t *body, int also_ok,
          wctl_reply *out)
{
    char *text = NULL;
    if (body != NULL && (text = wk_json_dump_compact(body)) == NULL) {
        fprintf(stderr, "wkvmctl: out of memory\n");
        return WCTL_EXIT_SERVER;
    }
    wctl_http_req req = {
        .method = method,
        .path = path,
        .content_type = text ? "application/json" : NULL,
        .body = text,
        .body_len = text ? strlen(text) : 0,
    };
    int rc = wctl_send(c, &req, also_ok, true, out);
    free(text);
    return rc;
}

/* Builds prefix + escaped(id) + suffix into out. Returns 0 or a usage exit status. */
static int
wctl_path(const wctl_args *a, char *out, size_t cap, const char *prefix, const char *id,
          const char *suffix)
{
    snprintf(out, cap, "%s", prefix);
    if (wctl_http_escape(id, out, cap) != WK_OK || strlen(out) + strlen(suffix) >= cap)
        return wctl_usage_fail(a->cmd, "'%.40s...' is too long", id);
    strcat(out, suffix);
    return 0;
}

/* Prints the reply as the server sent it (--json). */
static int
wctl_print_raw(const wctl_reply *r)
{
    fwrite(r->raw, 1, r->len, stdout);
    if (r->len == 0 || r->raw[r->len - 1] != '\n')
        fputc('\n', stdout);
    return WCTL_EXIT_OK;
}

/* ------------------------------------------------------------------------ */
/* Reading JSON defensively                                                 */
/* ------------------------------------------------------------------------ */

/* o[key] as a string; def when o is not an object or the value is not a string. */
static const char *
wctl_jstr(const json_t *o, const char *key, const char *def)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s != NULL ? s : def;
}

/* o[key] rendered as text into buf: strings, numbers, booleans; def otherwise. */
static const char *
wctl_jtext(const json_t *o, const char *key, const char *def, char *buf, size_t cap)
{
    json_t *v = json_object_get(o, key);
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_integer(v))
        snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, cap, "%g", json_real_value(v));
    else if (json_is_boolean(v))
        snprintf(buf, cap, "%s", json_is_true(v) ? "yes" : "no");
    else
        return def;
    return buf;
}

/* o[key] as an integer; def when absent or not a number. */
static long long
wctl_jint(const json_t *o, const char *key, long long def)
{
    json_t *v = json_object_get(o, key);
    if (json_is_integer(v))
        return (long long)json_integer_value(v);
    if (json_is_real(v) && isfinite(json_real_value(v)))
        return (long long)json_real_value(v);
    return def;
}

/* o[key] as a number; def when absent or not a number. */
static double
wctl_jnum(const json_t *o, const char *key, double def)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : def;
}

/* Unix seconds o[key] as "YYYY-MM-DDTHH:MM:SSZ"; "-" when absent. */
static const char *
wctl_jtime(const json_t *o, const char *key, char *buf, size_t cap)
{
    long long t = wctl_jint(o, key, -1);
    struct tm tm;
    time_t tt = (time_t)t;
    if (t < 0 || gmtime_r(&tt, &tm) == NULL || strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        return "-";
    return buf;
}

static const char *
wctl_human_bytes(double b, char *buf, size_t cap)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024.0 && u < 4) {
        b /= 1024.0;
        u++;
    }
    snprintf(buf, cap, u == 0 ? "%.0f %s" : "%.1f %s", b, unit[u]);
    return buf;
}

/* Prints a table, reporting ENOMEM while it was built. */
static int
wctl_table_done(wctl_table *t, bool oom, bool header)
{
    int rc = WCTL_EXIT_OK;
    if (t == NULL || oom) {
        fprintf(stderr, "wkvmctl: out of memory\n");
        rc = WCTL_EXIT_SERVER;
    } else {
        wctl_table_print(t, stdout, header);
    }
    wctl_table_free(t);
    return rc;
}

/* One line about a state object: "<verb> <id> (<tokens> tokens, <tier>)". */
static void
wctl_state_line(const char *verb, const json_t *st)
{
    char tk[32], line[400];
    const char *id = wctl_jstr(st, "id", "?");
    snprintf(line, sizeof(line), "%s %s (%s tokens, %s%s)", verb, id,
             wctl_jtext(st, "tokens", "?", tk, sizeof(tk)), wctl_jstr(st, "tier", "?"),
             json_is_true(json_object_get(st, "damaged")) ? ", damaged" : "");
    char clean[400];
    wctl_one_line(line, strlen(line), clean, sizeof(clean));
    puts(clean);
}

/* ------------------------------------------------------------------------ */
/* Commands: workers and slots                                              */
/* ------------------------------------------------------------------------ */

/* Text a row function may point cells at; lives until the row is added. */
typedef struct wctl_row_buf {
    char b[4][72]; /* scratch strings */
} wctl_row_buf;

/* Fills ncols cells for one array item (strings borrowed from item or buf). */
typedef void (*wctl_row_fn)(const json_t *item, const char **cells, wctl_row_buf *buf);

/*
 * GET path; with --json prints the body, else a table of the array under
 * key: the header hdr (ncols columns), one row per item made by row.
 */
static int
wctl_list(wctl_ctx *c, const char *path, const char *key, size_t ncols, const char *const *hdr,
          wctl_row_fn row)
{
    wctl_reply r;
    int rc = wctl_call(c, "GET", path, NULL, 0, &r);
    if (rc != WCTL_EXIT_OK)
        return rc;
    if (c->json) {
        rc = wctl_print_raw(&r);
        wctl_reply_fini(&r);
        return rc;
    }
    wctl_table *t = wctl_table_new(ncols, hdr);
    bool oom = false;
    size_t i;
    json_t *item;
    json_array_foreach(json_object_get(r.json, key), i, item)
    {
        const char *cells[WCTL_TABLE_COLS_MAX];
        wctl_row_buf buf;
        row(item, cells, &buf);
        oom = oom || t == NULL || wctl_table_add(t, cells) != WK_OK;
    }
    wctl_reply_fini(&r);
    return wctl_table_done(t, oom, true);
}

static void
wctl_worker_row(const json_t *w, const char **cells, wctl_row_buf *buf)
{
    snprintf(buf->b[2], sizeof(buf->b[2]), "%s/%s", wctl_jtext(w, "slots_used", "?", buf->b[0], 32),
             wctl_jtext(w, "slots_total", "?", buf->b[1], 32));
    cells[0] = wctl_jstr(w, "id", "-");
    cells[1] = wctl_jstr(w, "backend", "-");
    cells[2] = wctl_jstr(w, "device", "-");
    cells[3] = buf->b[2];
    cells[4] = wctl_jstr(w, "state", "-");
    cells[5] = wctl_jstr(json_object_get(w, "model"), "name", "-");
}

static int
wctl_cmd_workers(wctl_ctx *c, const wctl_args *a)
{
    (void)a;
    static const char *const hdr[] = {"ID", "BACKEND", "DEVICE", "SLOTS", "STATE", "MODEL"};
    return wctl_list(c, "/admin/workers", "workers", 6, hdr, wctl_worker_row);
}

static void
wctl_slot_row(const json_t *s, const char **cells, wctl_row_buf *buf)
{
    cells[0] = wctl_jstr(s, "id", "-");
    cells[1] = wctl_jstr(s, "worker", "-");
    cells[2] = wctl_jstr(s, "state", "-");
    cells[3] = wctl_jstr(s, "holds", "-");
    cells[4] = wctl_jtext(s, "tokens", "-", buf->b[0], 32);
    cells[5] = wctl_jstr(s, "tier", "-");
}

static int
wctl_cmd_slots(wctl_ctx *c, const wctl_args *a)
{
    (void)a;
    static const char *const hdr[] = {"ID", "WORKER", "STATE", "HOLDS", "TOKENS", "TIER"};
    return wctl_list(c, "/admin/slots", "slots", 6, hdr, wctl_slot_row);
}

/* ------------------------------------------------------------------------ */
/* Commands: states                                                         */
/* ------------------------------------------------------------------------ */

static int
wctl_cmd_states(wctl_ctx *c, const wctl_args *a)
{
    bool all = wctl_arg_bool(a, "all");
    const char *page_size = wctl_arg_str(a, "page-size");
    json_t *items = json_array();
    char cursor[WCTL_CURSOR_MAX] = "";
    int rc = items != NULL ? WCTL_EXIT_OK : WCTL_EXIT_SERVER;
    for (unsigned page = 0; rc == WCTL_EXIT_OK && page < WCTL_PAGES_MAX; page++) {
        char path[WCTL_PATH_MAX];
        snprintf(path, sizeof(path), "%s%s%s%s%s", all ? "/admin/states" : "/v1/states",
                 page_size || cursor[0] ? "?" : "", page_size ? "limit=" : "",
                 page_size ? page_size : "", page_size && cursor[0] ? "&" : "");
        if (cursor[0]) {
            strcat(path, "after=");
            if (wctl_http_escape(cursor, path, sizeof(path)) != WK_OK) {
                fprintf(stderr, "wkvmctl: the server's list cursor is too long\n");
                rc = WCTL_EXIT_SERVER;
                break;
            }
        }
        wctl_reply r;
        rc = wctl_call(c, "GET", path, NULL, 0, &r);
        if (rc != WCTL_EXIT_OK)
            break;
        json_t *data = json_object_get(r.json, "data");
        if (json_is_array(data))
            json_array_extend(items, data);
        const char *next = wctl_jstr(r.json, "next", "");
        bool more = next[0] != '\0' && strcmp(next, cursor) != 0;
        if (more && strlen(next) >= sizeof(cursor)) {
            fprintf(stderr, "wkvmctl: the server's list cursor is too long\n");
            rc = WCTL_EXIT_SERVER;
        }
        if (more)
            snprintf(cursor, sizeof(cursor), "%s", next);
        wctl_reply_fini(&r);
        if (!more)
            break;
    }
    if (rc != WCTL_EXIT_OK) {
        json_decref(items);
        return rc;
    }
    if (c->json) {
        json_t *doc = json_pack("{s:s, s:O}", "object", "list", "data", items);
        char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
        json_decref(doc);
        json_decref(items);
        if (text == NULL) {
            fprintf(stderr, "wkvmctl: out of memory\n");
            return WCTL_EXIT_SERVER;
        }
        puts(text);
        free(text);
        return WCTL_EXIT_OK;
    }
    static const char *const hdr_all[] = {"OWNER", "ID",     "TOKENS", "TIER",
                                          "OP",    "PARENT", "CREATED"};
    const char *const *hdr = all ? hdr_all : hdr_all + 1;
    size_t ncols = all ? 7 : 6;
    wctl_table *t = wctl_table_new(ncols, hdr);
    bool oom = false;
    size_t i;
    json_t *s;
    json_array_foreach(items, i, s)
    {
        char tk[32], when[32];
        const char *parent = wctl_jstr(s, "parent", "");
        const char *tier =
            json_is_true(json_object_get(s, "damaged")) ? "damaged" : wctl_jstr(s, "tier", "-");
        const char *cells[] = {wctl_jstr(s, "owner", "-"),
                               wctl_jstr(s, "id", "-"),
                               wctl_jtext(s, "tokens", "-", tk, sizeof(tk)),
                               tier,
                               wctl_jstr(s, "op", "-"),
                               parent[0] ? parent : "-",
                               wctl_jtime(s, "created", when, sizeof(when))};
        oom = oom || t == NULL || wctl_table_add(t, all ? cells : cells + 1) != WK_OK;
    }
    json_decref(items);
    return wctl_table_done(t, oom, true);
}

static int
wctl_cmd_state(wctl_ctx *c, const wctl_args *a)
{
    char path[WCTL_PATH_MAX];
    int rc = wctl_path(a, path, sizeof(path), "/v1/states/", wctl_arg_str(a, "ID"), "");
    wctl_reply r;
    if (rc != 0 || (rc = wctl_call(c, "GET", path, NULL, 0, &r)) != WCTL_EXIT_OK)
        return rc;
    if (c->json) {
        rc = wctl_print_raw(&r);
        wctl_reply_fini(&r);
        return rc;
    }
    static const char *const keys[] = {"id",    "name",        "version",     "tokens",
                                       "tier",  "op",          "parent",      "damaged",
                                       "model", "state_bytes", "fingerprint", "token_digest"};
    static const char *const hdr[] = {"KEY", "VALUE"};
    wctl_table *t = wctl_table_new(2, hdr);
    bool oom = false;
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
        char buf[64];
        const char *v = wctl_jtext(r.json, keys[k], "-", buf, sizeof(buf));
        const char *cells[] = {keys[k], v[0] ? v : "-"};
        oom = oom || t == NULL || wctl_table_add(t, cells) != WK_OK;
        if (strcmp(keys[k], "version") == 0) {
            char when[32];
            const char *cw[] = {"created", wctl_jtime(r.json, "created", when, sizeof(when))};
            oom = oom || t == NULL || wctl_table_add(t, cw) != WK_OK;
        }
    }
    json_t *ids = json_object_get(r.json, "token_ids");
    if (json_is_array(ids)) {
        char line[WCTL_TOKEN_IDS_SHOWN * 12 + 64] = "";
        size_t n = json_array_size(ids), used = 0;
        for (size_t i = 0; i < n && i < WCTL_TOKEN_IDS_SHOWN; i++) {
            json_t *v = json_array_get(ids, i);
            used += (size_t)snprintf(line + used, sizeof(line) - used, "%s%lld", i ? " " : "",
                                     json_is_integer(v) ? (long long)json_integer_value(v) : -1LL);
        }
        if (n > WCTL_TOKEN_IDS_SHOWN)
            snprintf(line + used, sizeof(line) - used, " ... (%zu more; --json has all)",
                     n - WCTL_TOKEN_IDS_SHOWN);
        const char *cells[] = {"token_ids", line[0] ? line : "-"};
        oom = oom || t == NULL || wctl_table_add(t, cells) != WK_OK;
    }
    wctl_reply_fini(&r);
    return wctl_table_done(t, oom, false);
}

/*
 * Puts --prompt or --prompt-ids of a into body ("prompt" / "prompt_ids").
 * Returns 0, or WCTL_EXIT_USAGE (reported) for both, a bad list or, when
 * required, neither.
 */
static int
wctl_prompt_put(const wctl_args *a, json_t *body, bool required)
{
    const char *text = wctl_arg_str(a, "prompt");
    const char *ids = wctl_arg_str(a, "prompt-ids");
    if (text != NULL && ids != NULL)
        return wctl_usage_fail(a->cmd, "give --prompt or --prompt-ids, not both");
    if (text == NULL && ids == NULL) {
        if (required)
            return wctl_usage_fail(a->cmd, "give --prompt TEXT or --prompt-ids 1,2,3");
        return 0;
    }
    if (text != NULL)
        return json_object_set_new(body, "prompt", json_string(text)) == 0
                   ? 0
                   : wctl_usage_fail(a->cmd, "--prompt is not valid UTF-8");
    json_t *arr = json_array();
    const char *p = ids;
    while (arr != NULL && *p) {
        while (*p == ',' || *p == ' ')
            p++;
        if (*p == '\0')
            break;
        char *end = NULL;
        errno = 0;
        unsigned long long v = *p >= '0' && *p <= '9' ? strtoull(p, &end, 10) : 0;
        if (end == NULL || errno != 0 || v > INT32_MAX ||
            (*end != '\0' && *end != ',' && *end != ' ')) {
            json_decref(arr);
            return wctl_usage_fail(a->cmd,
                                   "--prompt-ids: '%s' is not a list of token ids "
                                   "like 1,2,3",
                                   ids);
        }
        json_array_append_new(arr, json_integer((json_int_t)v));
        p = end;
    }
    if (arr == NULL || json_array_size(arr) == 0) {
        json_decref(arr);
        return wctl_usage_fail(a->cmd, "--prompt-ids: no token ids given");
    }
    json_object_set_new(body, "prompt_ids", arr);
    return 0;
}

static int
wctl_cmd_create(wctl_ctx *c, const wctl_args *a)
{
    json_t *body = json_pack("{s:s}", "name", wctl_arg_str(a, "NAME"));
    if (body == NULL)
        return wctl_usage_fail(a->cmd, "NAME is not valid UTF-8");
    int rc = wctl_prompt_put(a, body, true);
    wctl_reply r;
    if (rc == 0 && (rc = wctl_call(c, "POST", "/v1/states", body, 0, &r)) == WCTL_EXIT_OK) {
        if (c->json)
            wctl_print_raw(&r);
        else
            wctl_state_line("created", r.json);
        wctl_reply_fini(&r);
    }
    json_decref(body);
    return rc;
}

static int
wctl_cmd_generate(wctl_ctx *c, const wctl_args *a)
{
    char path[WCTL_PATH_MAX];
    int rc = wctl_path(a, path, sizeof(path), "/v1/states/", wctl_arg_str(a, "ID"), "/generate");
    if (rc != 0)
        return rc;
    json_t *body = json_object();
    if (body == NULL)
        return WCTL_EXIT_SERVER;
    if ((rc = wctl_prompt_put(a, body, false)) != 0) {
        json_decref(body);
        return rc;
    }
    if (wctl_arg_str(a, "max-tokens") != NULL)
        json_object_set_new(body, "max_tokens",
                            json_integer((json_int_t)wctl_arg_u64(a, "max-tokens", 0)));
    if (wctl_arg_str(a, "seed") != NULL)
        json_object_set_new(body, "seed", json_integer((json_int_t)wctl_arg_u64(a, "seed", 0)));
    if (wctl_arg_str(a, "temperature") != NULL)
        json_object_set_new(body, "temperature", json_real(wctl_arg_num(a, "temperature", 1)));
    if (wctl_arg_str(a, "top-p") != NULL)
        json_object_set_new(body, "top_p", json_real(wctl_arg_num(a, "top-p", 1)));
    if (wctl_arg_bool(a, "ignore-eos"))
        json_object_set_new(body, "ignore_eos", json_true());
    bool ids = wctl_arg_bool(a, "ids");
    if (ids)
        json_object_set_new(body, "return_token_ids", json_true());
    const char *save_as = wctl_arg_str(a, "save-as");
    if (save_as != NULL && json_object_set_new(body, "save_as", json_string(save_as)) != 0) {
        json_decref(body);
        return wctl_usage_fail(a->cmd, "--save-as is not valid UTF-8");
    }
    wctl_reply r;
    rc = wctl_call(c, "POST", path, body, 0, &r);
    json_decref(body);
    if (rc != WCTL_EXIT_OK)
        return rc;
    json_t *choice = json_array_get(json_object_get(r.json, "choices"), 0);
    json_t *state_error = json_object_get(r.json, "state_error");
    if (c->json) {
        wctl_print_raw(&r);
    } else if (ids) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(choice, "token_ids"), i, v) printf(
            "%s%lld", i ? " " : "", json_is_integer(v) ? (long long)json_integer_value(v) : -1LL);
        putchar('\n');
    } else {
        json_t *text = json_object_get(choice, "text");
        size_t n = json_string_length(text);
        if (n > 0)
            fwrite(json_string_value(text), 1, n, stdout);
        if (n == 0 || json_string_value(text)[n - 1] != '\n')
            putchar('\n');
    }
    if (!c->json && json_is_object(json_object_get(r.json, "state"))) {
        json_t *st = json_object_get(r.json, "state");
        char tk[32];
        char line[400], clean[400];
        snprintf(line, sizeof(line), "saved as %s (%s tokens)", wctl_jstr(st, "id", "?"),
                 wctl_jtext(st, "tokens", "?", tk, sizeof(tk)));
        wctl_one_line(line, strlen(line), clean, sizeof(clean));
        fprintf(stderr, "wkvmctl: %s\n", clean);
    }
    if (state_error != NULL && !json_is_null(state_error)) {
        const char *msg =
            wctl_jstr(json_object_get(state_error, "error"), "message", "unknown error");
        char line[600];
        wctl_one_line(msg, strlen(msg), line, sizeof(line));
        fprintf(stderr, "wkvmctl: generated, but not saved: %s\n", line);
        rc = WCTL_EXIT_SERVER;
    }
    wctl_reply_fini(&r);
    return rc;
}

/* POST /v1/states/ID/<action> (body may be NULL); prints each returned state. */
static int
wctl_state_action(wctl_ctx *c, const wctl_args *a, const char *action, const json_t *body,
                  const char *verb)
{
    char path[WCTL_PATH_MAX];
    int rc = wctl_path(a, path, sizeof(path), "/v1/states/", wctl_arg_str(a, "ID"), action);
    wctl_reply r;
    if (rc != 0 || (rc = wctl_call(c, "POST", path, body, 0, &r)) != WCTL_EXIT_OK)
        return rc;
    if (c->json) {
        wctl_print_raw(&r);
    } else if (json_is_array(json_object_get(r.json, "data"))) {
        size_t i;
        json_t *st;
        json_array_foreach(json_object_get(r.json, "data"), i, st) wctl_state_line(verb, st);
    } else {
        wctl_state_line(verb, r.json);
    }
    wctl_reply_fini(&r);
    return WCTL_EXIT_OK;
}

/* The body-less state actions: the command table names the action and the verb. */
static int
wctl_cmd_state_action(wctl_ctx *c, const wctl_args *a)
{
    return wctl_state_action(c, a, a->cmd->action, NULL, a->cmd->verb);
}

static int
wctl_cmd_fork(wctl_ctx *c, const wctl_args *a)
{
    json_t *body = json_pack("{s:s}", "name", wctl_arg_str(a, "name"));
    if (body == NULL)
        return wctl_usage_fail(a->cmd, "--name is not valid UTF-8");
    if (wctl_arg_str(a, "count") != NULL)
        json_object_set_new(body, "count", json_integer((json_int_t)wctl_arg_u64(a, "count", 1)));
    int rc = wctl_state_action(c, a, "/fork", body, "forked");
    json_decref(body);
    return rc;
}

static int
wctl_cmd_delete(wctl_ctx *c, const wctl_args *a)
{
    char path[WCTL_PATH_MAX];
    int rc = wctl_path(a, path, sizeof(path), "/v1/states/", wctl_arg_str(a, "ID"), "");
    wctl_reply r;
    if (rc != 0 || (rc = wctl_call(c, "DELETE", path, NULL, 0, &r)) != WCTL_EXIT_OK)
        return rc;
    if (c->json) {
        wctl_print_raw(&r);
    } else {
        char n[32];
        char line[300];
        snprintf(line, sizeof(line), "deleted %s (%s version(s))", wctl_jstr(r.json, "id", "?"),
                 wctl_jtext(r.json, "versions", "?", n, sizeof(n)));
        char clean[300];
        wctl_one_line(line, strlen(line), clean, sizeof(clean));
        puts(clean);
    }
    wctl_reply_fini(&r);
    return WCTL_EXIT_OK;
}

/* ------------------------------------------------------------------------ */
/* Commands: export and import                                              */
/* ------------------------------------------------------------------------ */

/* Progress of a body transfer on stderr. */
typedef struct wctl_progress {
    const char *verb; /* "received", "sent" */
    bool force;       /* report even small bodies (--progress) */
    bool tty;         /* stderr is a terminal: one line rewritten in place */
    bool shown;       /* something was printed */
    int last_step;    /* last quarter (non-tty) reported */
    double last_t;    /* monotonic seconds of the last tty update */
} wctl_progress;

static double
wctl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void
wctl_progress_cb(void *arg, uint64_t done, uint64_t total)
{
    wctl_progress *p = arg;
    if (!p->force && done < WCTL_PROGRESS_MIN && total < WCTL_PROGRESS_MIN)
        return;
    char hd[32], ht[32];
    wctl_human_bytes((double)done, hd, sizeof(hd));
    bool end = total > 0 && done >= total;
    if (p->tty) {
        double now = wctl_now();
        if (!end && p->shown && now - p->last_t < 0.1)
            return;
        p->last_t = now;
        if (total > 0)
            fprintf(stderr, "\rwkvmctl: %s %s of %s (%d%%)   ", p->verb, hd,
                    wctl_human_bytes((double)total, ht, sizeof(ht)),
                    (int)(100.0 * (double)done / (double)total));
        else
            fprintf(stderr, "\rwkvmctl: %s %s   ", p->verb, hd);
        p->shown = true;
        return;
    }
    /* Not a terminal: a line at each quarter (or each 64 MiB when the size is unknown). */
    int step = total > 0 ? (int)(4.0 * (double)done / (double)total) : (int)(done >> 26);
    if (step == p->last_step && !(end && !p->shown))
        return;
    p->last_step = step;
    if (total > 0)
        fprintf(stderr, "wkvmctl: %s %llu of %llu bytes (%d%%)\n", p->verb,
                (unsigned long long)done, (unsigned long long)total,
                (int)(100.0 * (double)done / (double)total));
    else
        fprintf(stderr, "wkvmctl: %s %llu bytes\n", p->verb, (unsigned long long)done);
    p->shown = true;
}

static void
wctl_progress_end(wctl_progress *p)
{
    if (p->tty && p->shown)
        fputc('\n', stderr);
}

static int
wctl_cmd_export(wctl_ctx *c, const wctl_args *a)
{
    const char *id = wctl_arg_str(a, "ID");
    const char *file = wctl_arg_str(a, "output");
    char path[WCTL_PATH_MAX];
    int rc = wctl_path(a, path, sizeof(path), "/v1/states/", id, "/export");
    if (rc != 0)
        return rc;
    size_t fl = strlen(file);
    char *tmp = malloc(fl + 16);
    if (tmp == NULL)
        return WCTL_EXIT_SERVER;
    snprintf(tmp, fl + 16, "%s.tmp.XXXXXX", file);
    int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (f == NULL) {
        fprintf(stderr, "wkvmctl: cannot create %s: %s\n", fd >= 0 ? tmp : file, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        free(tmp);
        return WCTL_EXIT_SERVER;
    }
    wctl_progress prog = {.verb = "received",
                          .force = wctl_arg_bool(a, "progress"),
                          .tty = isatty(STDERR_FILENO) == 1,
                          .last_step = -1};
    wctl_http_req req = {.method = "GET",
                         .path = path,
                         .sink = f,
                         .progress = wctl_progress_cb,
                         .progress_arg = &prog};
    wctl_reply r;
    rc = wctl_send(c, &req, 0, false, &r);
    wctl_progress_end(&prog);
    uint64_t bytes = 0;
    if (rc == WCTL_EXIT_OK) {
        struct stat sb;
        if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fstat(fileno(f), &sb) != 0) {
            fprintf(stderr, "wkvmctl: cannot write %s: %s\n", tmp, strerror(errno));
            rc = WCTL_EXIT_SERVER;
        } else {
            bytes = (uint64_t)sb.st_size;
        }
    }
    if (fclose(f) != 0 && rc == WCTL_EXIT_OK) {
        fprintf(stderr, "wkvmctl: cannot write %s: %s\n", tmp, strerror(errno));
        rc = WCTL_EXIT_SERVER;
    }
    if (rc == WCTL_EXIT_OK && rename(tmp, file) != 0) {
        fprintf(stderr, "wkvmctl: cannot rename %s to %s: %s\n", tmp, file, strerror(errno));
        rc = WCTL_EXIT_SERVER;
    }
    if (rc != WCTL_EXIT_OK)
        unlink(tmp);
    free(tmp);
    if (rc == WCTL_EXIT_OK) {
        if (c->json) {
            json_t *o =
                json_pack("{s:s, s:s, s:I}", "id", id, "file", file, "bytes", (json_int_t)bytes);
            char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
            if (text != NULL)
                puts(text);
            free(text);
            json_decref(o);
        } else {
            char hb[32];
            printf("exported %s to %s (%llu bytes, %s)\n", id, file, (unsigned long long)bytes,
                   wctl_human_bytes((double)bytes, hb, sizeof(hb)));
        }
    }
    wctl_reply_fini(&r);
    return rc;
}

static int
wctl_cmd_import(wctl_ctx *c, const wctl_args *a)
{
    const char *file = wctl_arg_str(a, "FILE");
    const char *name = wctl_arg_str(a, "name");
    char path[WCTL_PATH_MAX] = "/v1/states/import";
    int rc = name ? wctl_path(a, path, sizeof(path), "/v1/states/import?name=", name, "") : 0;
    if (rc != 0)
        return rc;
    FILE *f = fopen(file, "rb");
    struct stat sb;
    if (f == NULL || fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int e = f == NULL ? errno : EINVAL;
        fprintf(stderr, "wkvmctl: cannot read %s: %s\n", file,
                f != NULL && e == EINVAL ? "not a regular file" : strerror(e));
        if (f != NULL)
            fclose(f);
        return WCTL_EXIT_SERVER;
    }
    wctl_progress prog = {.verb = "sent",
                          .force = wctl_arg_bool(a, "progress"),
                          .tty = isatty(STDERR_FILENO) == 1,
                          .last_step = -1};
    wctl_http_req req = {.method = "POST",
                         .path = path,
                         .content_type = "application/octet-stream",
                         .body_file = f,
                         .body_file_len = (uint64_t)sb.st_size,
                         .progress = wctl_progress_cb,
                         .progress_arg = &prog};
    wctl_reply r;
    rc = wctl_send(c, &req, 0, true, &r);
    wctl_progress_end(&prog);
    fclose(f);
    if (rc != WCTL_EXIT_OK)
        return rc;
    if (c->json)
        wctl_print_raw(&r);
    else
        wctl_state_line("imported", r.json);
    wctl_reply_fini(&r);
    return WCTL_EXIT_OK;
}

/* ------------------------------------------------------------------------ */
/* Commands: migration                                                      */
/* ------------------------------------------------------------------------ */

/* One line about a migration report of the server. */
static void
wctl_migration_line(const json_t *m, const char *indent)
{
    char hb[32], line[600], clean[600];
    snprintf(line, sizeof(line), "%s%s %s %s -> %s (%s, %s, transfer %.3f ms, total %.3f ms)%s%s",
             indent, wctl_jstr(m, "result", "?"), wctl_jstr(m, "kind", "?"),
             wctl_jstr(m, "from", "?"), wctl_jstr(m, "to", "?"), wctl_jstr(m, "transport", "?"),
             wctl_human_bytes(wctl_jnum(m, "bytes", 0), hb, sizeof(hb)),
             1000.0 * wctl_jnum(json_object_get(m, "seconds"), "transfer", 0),
             1000.0 * wctl_jnum(json_object_get(m, "seconds"), "total", 0),
             json_is_string(json_object_get(m, "error")) ? ": " : "", wctl_jstr(m, "error", ""));
    wctl_one_line(line, strlen(line), clean, sizeof(clean));
    puts(clean);
}

static int
wctl_cmd_migrate(wctl_ctx *c, const wctl_args *a)
{
    char path[WCTL_PATH_MAX];
    int rc = wctl_path(a, path, sizeof(path), "/admin/slots/", wctl_arg_str(a, "SLOT"), "/migrate");
    if (rc != 0)
        return rc;
    json_t *body = json_pack("{s:s}", "to", wctl_arg_str(a, "to"));
    if (body == NULL)
        return wctl_usage_fail(a->cmd, "--to is not valid UTF-8");
    wctl_reply r;
    rc = wctl_call(c, "POST", path, body, 0, &r);
    json_decref(body);
    if (rc != WCTL_EXIT_OK)
        return rc;
    const char *result = wctl_jstr(r.json, "result", "?");
    if (c->json) {
        wctl_print_raw(&r);
    } else {
        static const char *const hdr[] = {"KEY", "VALUE"};
        wctl_table *t = wctl_table_new(2, hdr);
        bool oom = false;
        char hb[32], bytes[80], tr[32], tot[32];
        json_t *secs = json_object_get(r.json, "seconds");
        snprintf(bytes, sizeof(bytes), "%lld (%s)", wctl_jint(r.json, "bytes", 0),
                 wctl_human_bytes(wctl_jnum(r.json, "bytes", 0), hb, sizeof(hb)));
        snprintf(tr, sizeof(tr), "%.3f ms", 1000.0 * wctl_jnum(secs, "transfer", 0));
        snprintf(tot, sizeof(tot), "%.3f ms", 1000.0 * wctl_jnum(secs, "total", 0));
        const char *rows[][2] = {
            {"result", result},
            {"kind", wctl_jstr(r.json, "kind", "-")},
            {"from", wctl_jstr(r.json, "from", "-")},
            {"to", wctl_jstr(r.json, "to", "-")},
            {"transport", wctl_jstr(r.json, "transport", "-")},
            {"reason", wctl_jstr(r.json, "transport_reason", "-")},
            {"fallback", wctl_jstr(r.json, "nccl_fallback", "-")},
            {"bytes", bytes},
            {"transfer", tr},
            {"total", tot},
        };
        for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
            oom = oom || t == NULL || wctl_table_add(t, rows[i]) != WK_OK;
        rc = wctl_table_done(t, oom, false);
    }
    if (rc == WCTL_EXIT_OK && strcmp(result, "committed") != 0) {
        const char *why = wctl_jstr(r.json, "error", result);
        char clean[600];
        wctl_one_line(why, strlen(why), clean, sizeof(clean));
        fprintf(stderr, "wkvmctl: the migration was not committed: %s\n", clean);
        rc = WCTL_EXIT_SERVER;
    }
    wctl_reply_fini(&r);
    return rc;
}

static int
wctl_cmd_evict(wctl_ctx *c, const wctl_args *a)
{
    char path[WCTL_PATH_MAX];
    int rc = wctl_path(a, path, sizeof(path), "/admin/slots/", wctl_arg_str(a, "SLOT"), "/evict");
    wctl_reply r;
    if (rc != 0 || (rc = wctl_call(c, "POST", path, NULL, 0, &r)) != WCTL_EXIT_OK)
        return rc;
    if (c->json) {
        wctl_print_raw(&r);
    } else {
        char line[300], clean[300];
        snprintf(line, sizeof(line), "%s %s", wctl_jstr(r.json, "result", "evicted"),
                 wctl_jstr(r.json, "id", wctl_arg_str(a, "SLOT")));
        wctl_one_line(line, strlen(line), clean, sizeof(clean));
        puts(clean);
    }
    wctl_reply_fini(&r);
    return WCTL_EXIT_OK;
}

/* The drain POST, run on a thread while the main thread polls its progress. */
typedef struct wctl_drain_job {
    wctl_ctx *c;       /* borrowed */
    const char *path;  /* borrowed */
    json_t *body;      /* borrowed */
    wctl_reply r;      /* the reply when rc is 0 */
    int rc;            /* wctl_call's result */
    atomic_bool done;  /* the POST returned */
} wctl_drain_job;

static void *
wctl_drain_post(void *arg)
{
    wctl_drain_job *j = arg;
    j->rc = wctl_call(j->c, "POST", j->path, j->body, 409, &j->r);
    atomic_store(&j->done, true);
    return NULL;
}

/*
 * One GET of the drain's progress; prints a line to stderr when done/failed changed
 * (last_done, last_failed). Quiet on any failure (an older controller has
 * no such route): progress is a courtesy, the POST's answer is the result.
 */
static void
wctl_drain_progress(wctl_ctx *c, const char *path, const char *worker, long long *last_done,
                    long long *last_failed, bool final)
{
    wctl_http_req req = {.method = "GET", .path = path};
    wctl_http_resp resp;
    wk_diag d = {{0}};
    wk_err err = wctl_http_do(&c->http, &req, &resp, &d);
    json_t *o = NULL;
    if (err == WK_OK && resp.status == 200 && resp.len > 0 &&
        wk_json_parse(resp.body, resp.len, &o, NULL) != WK_OK)
        o = NULL;
    wctl_http_resp_fini(&resp);
    if (!json_is_object(o)) {
        json_decref(o);
        return;
    }
    const char *state = wctl_jstr(o, "state", "");
    long long done = wctl_jint(o, "done", 0), failed = wctl_jint(o, "failed", 0);
    long long total = wctl_jint(o, "total", 0);
    if ((strcmp(state, "running") == 0 || final) && (done != *last_done || failed != *last_failed)) {
        char line[400], clean[400];
        const char *cur = wctl_jstr(o, "current", "");
        snprintf(line, sizeof(line), "draining %s: %lld/%lld migrated, %lld failed%s%s", worker,
                 done, total, failed, cur[0] ? ", moving " : "", cur);
        wctl_one_line(line, strlen(line), clean, sizeof(clean));
        fprintf(stderr, "%s\n", clean); /* progress on stderr: stdout stays the result */
        *last_done = done;
        *last_failed = failed;
    }
    json_decref(o);
}

static int
wctl_cmd_drain(wctl_ctx *c, const wctl_args *a)
{
    const char *worker = wctl_arg_str(a, "WORKER");
    bool undrain = wctl_arg_bool(a, "undrain");
    char path[WCTL_PATH_MAX];
    int rc = wctl_path(a, path, sizeof(path), "/admin/workers/", worker, "/drain");
    if (rc != 0)
        return rc;
    json_t *body = json_pack("{s:b}", "undrain", undrain);
    wctl_reply r;
    if (body == NULL) {
        rc = WCTL_EXIT_SERVER;
    } else if (undrain || c->json) {
        rc = wctl_call(c, "POST", path, body, 409, &r);
    } else {
        /* POST on a thread; poll GET .../drain for progress lines meanwhile. */
        wctl_drain_job j = {.c = c, .path = path, .body = body};
        atomic_init(&j.done, false);
        pthread_t thr;
        if (pthread_create(&thr, NULL, wctl_drain_post, &j) != 0) {
            wctl_drain_post(&j);
        } else {
            long long last_done = 0, last_failed = 0;
            int ticks = 0;
            while (!atomic_load(&j.done)) {
                struct timespec ts = {0, 50 * 1000000L};
                nanosleep(&ts, NULL);
                if (++ticks % 5 == 0 && !atomic_load(&j.done))
                    wctl_drain_progress(c, path, worker, &last_done, &last_failed, false);
            }
            pthread_join(thr, NULL);
            if (j.rc == WCTL_EXIT_OK)
                wctl_drain_progress(c, path, worker, &last_done, &last_failed, true);
        }
        rc = j.rc;
        r = j.r;
    }
    json_decref(body);
    if (rc != WCTL_EXIT_OK)
        return rc;
    long long failed = wctl_jint(r.json, "failed", 0);
    long long remaining = wctl_jint(r.json, "remaining", 0);
    json_t *moves = json_object_get(r.json, "migrations");
    if (c->json) {
        wctl_print_raw(&r);
    } else if (undrain) {
        printf("%s takes new work again\n", worker);
    } else {
        size_t i, ok = 0;
        json_t *m;
        json_array_foreach(moves, i, m)
        {
            wctl_migration_line(m, "  ");
            ok += strcmp(wctl_jstr(m, "result", ""), "committed") == 0;
        }
        printf("drained %s: %zu migrated, %lld failed, %lld remaining\n", worker, ok, failed,
               remaining);
    }
    if (r.status == 409 || remaining > 0) {
        fprintf(stderr, "wkvmctl: %s is draining but %lld slot(s) remain on it (HTTP %d)\n", worker,
                remaining, r.status);
        rc = WCTL_EXIT_SERVER;
    }
    wctl_reply_fini(&r);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Commands: the checkpoint cache                                           */
/* ------------------------------------------------------------------------ */

static int
wctl_cmd_cache(wctl_ctx *c, const wctl_args *a)
{
    const char *action = wctl_arg_str(a, "ACTION");
    const char *owner = wctl_arg_str(a, "owner");
    bool clear = action != NULL && strcmp(action, "clear") == 0;
    if (action != NULL && !clear)
        return wctl_usage_fail(a->cmd, "unknown cache action '%s' (clear, or none to show)",
                               action);
    char path[WCTL_PATH_MAX];
    int n = snprintf(path, sizeof(path), "%s", clear ? "/admin/cache/clear" : "/admin/cache");
    if (owner != NULL) {
        n += snprintf(path + n, sizeof(path) - (size_t)n, "?owner=");
        for (const unsigned char *p = (const unsigned char *)owner; *p && n < (int)sizeof(path) - 4;
             p++) {
            bool plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                         (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.';
            n += snprintf(path + n, sizeof(path) - (size_t)n, plain ? "%c" : "%%%02X", *p);
        }
        if (n >= (int)sizeof(path) - 4)
            return wctl_usage_fail(a->cmd, "--owner is too long");
    }
    wctl_reply r;
    int rc = wctl_call(c, clear ? "POST" : "GET", path, NULL, 0, &r);
    if (rc != WCTL_EXIT_OK)
        return rc;
    if (c->json) {
        rc = wctl_print_raw(&r);
        wctl_reply_fini(&r);
        return rc;
    }
    if (clear) {
        printf("cleared %lld checkpoint(s)\n", wctl_jint(r.json, "cleared", 0));
        wctl_reply_fini(&r);
        return WCTL_EXIT_OK;
    }
    json_t *tiers = json_object_get(r.json, "tiers");
    json_t *warm = json_object_get(tiers, "warm"), *disk = json_object_get(tiers, "disk");
    printf("prefix cache %s: %lld lookups, %lld hits (%.0f%%)\n",
           json_is_true(json_object_get(r.json, "enabled")) ? "on" : "off",
           wctl_jint(r.json, "lookups", 0), wctl_jint(r.json, "hits", 0),
           100.0 * json_number_value(json_object_get(r.json, "hit_rate")));
    printf("warm: %lld entries, %lld bytes (budget %lld per worker), %lld evicted\n",
           wctl_jint(warm, "entries", 0), wctl_jint(warm, "bytes", 0),
           wctl_jint(warm, "budget_bytes_per_worker", 0), wctl_jint(warm, "evictions", 0));
    printf("disk: %lld entries, %lld bytes (budget %lld), %lld evicted\n",
           wctl_jint(disk, "entries", 0), wctl_jint(disk, "bytes", 0),
           wctl_jint(disk, "budget_bytes", 0), wctl_jint(disk, "evictions", 0));
    static const char *const hdr[] = {"OWNER", "ENTRIES", "WARM", "DISK", "BYTES"};
    wctl_table *t = wctl_table_new(5, hdr);
    bool oom = false;
    const char *name;
    json_t *o;
    json_object_foreach(json_object_get(r.json, "owners"), name, o)
    {
        char e[32], w[32], k[32], b[32];
        const char *cells[] = {name, wctl_jtext(o, "entries", "0", e, 32),
                               wctl_jtext(o, "warm", "0", w, 32), wctl_jtext(o, "disk", "0", k, 32),
                               wctl_jtext(o, "bytes", "0", b, 32)};
        oom = oom || t == NULL || wctl_table_add(t, cells) != WK_OK;
    }
    wctl_reply_fini(&r);
    return wctl_table_done(t, oom, true);
}

/* wkvmctl responses [--owner U] | wkvmctl responses delete ID */
static int
wctl_cmd_responses(wctl_ctx *c, const wctl_args *a)
{
    const char *action = wctl_arg_str(a, "ACTION");
    const char *id = wctl_arg_str(a, "ID");
    const char *owner = wctl_arg_str(a, "owner");
    bool del = action != NULL && strcmp(action, "delete") == 0;
    if (action != NULL && !del)
        return wctl_usage_fail(a->cmd, "unknown responses action '%s' (delete, or none to list)",
                               action);
    if (del && id == NULL)
        return wctl_usage_fail(a->cmd, "delete needs a response id");
    if (!del && id != NULL)
        return wctl_usage_fail(a->cmd, "an ID only goes with delete");
    char path[WCTL_PATH_MAX];
    int n = snprintf(path, sizeof(path), "/admin/responses");
    const char *arg = del ? id : owner;
    if (arg != NULL) {
        n += snprintf(path + n, sizeof(path) - (size_t)n, del ? "/" : "?owner=");
        for (const unsigned char *p = (const unsigned char *)arg; *p && n < (int)sizeof(path) - 4;
             p++) {
            bool plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                         (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.';
            n += snprintf(path + n, sizeof(path) - (size_t)n, plain ? "%c" : "%%%02X", *p);
        }
        if (n >= (int)sizeof(path) - 4)
            return wctl_usage_fail(a->cmd, "%s is too long", del ? "the id" : "--owner");
    }
    wctl_reply r;
    int rc = wctl_call(c, del ? "DELETE" : "GET", path, NULL, 0, &r);
    if (rc != WCTL_EXIT_OK)
        return rc;
    if (c->json) {
        rc = wctl_print_raw(&r);
        wctl_reply_fini(&r);
        return rc;
    }
    if (del) {
        printf("deleted %s\n", id);
        wctl_reply_fini(&r);
        return WCTL_EXIT_OK;
    }
    static const char *const hdr[] = {"OWNER", "ID", "STATUS", "TOKENS", "PREVIOUS", "CREATED"};
    wctl_table *t = wctl_table_new(6, hdr);
    bool oom = false;
    size_t i;
    json_t *o;
    json_array_foreach(json_object_get(r.json, "data"), i, o)
    {
        char tk[32], when[32];
        const char *prev = wctl_jstr(o, "previous_response_id", "");
        const char *cells[] = {wctl_jstr(o, "owner", "-"),
                               wctl_jstr(o, "id", "-"),
                               wctl_jstr(o, "status", "-"),
                               wctl_jtext(o, "tokens", "-", tk, sizeof(tk)),
                               prev[0] ? prev : "-",
                               wctl_jtime(o, "created_at", when, sizeof(when))};
        oom = oom || t == NULL || wctl_table_add(t, cells) != WK_OK;
    }
    wctl_reply_fini(&r);
    return wctl_table_done(t, oom, true);
}

static int
wctl_cmd_help(wctl_ctx *c, const wctl_args *a)
{
    (void)c;
    (void)a;
    return WCTL_EXIT_OK; /* answered while parsing */
}

/* ------------------------------------------------------------------------ */
/* The command table                                                        */
/* ------------------------------------------------------------------------ */

static const wctl_cmd wctl_cmds[] = {
    {"workers", wctl_cmd_workers, wctl_opts_none, "List workers with slot use and model",
     "GET /admin/workers", NULL, NULL},
    {"slots", wctl_cmd_slots, wctl_opts_none, "List allocated slots: running, parked, idle",
     "GET /admin/slots", NULL, NULL},
    {"states", wctl_cmd_states, wctl_opts_states,
     "List your states (--all: every user's), following the list cursor",
     "GET /v1/states?after=CURSOR, or GET /admin/states with --all", NULL, NULL},
    {"state", wctl_cmd_state, wctl_opts_id, "Show one state", "GET /v1/states/{id}", NULL, NULL},
    {"create", wctl_cmd_create, wctl_opts_create, "Create a state from a prompt", "POST /v1/states",
     NULL, NULL},
    {"generate", wctl_cmd_generate, wctl_opts_generate, "Generate from a state and print the text",
     "POST /v1/states/{id}/generate", NULL, NULL},
    {"snapshot", wctl_cmd_state_action, wctl_opts_id, "Store a new version of a state's name",
     "POST /v1/states/{id}/snapshot", "/snapshot", "snapshot"},
    {"fork", wctl_cmd_fork, wctl_opts_fork, "Copy a state under a new name",
     "POST /v1/states/{id}/fork", NULL, NULL},
    {"hibernate", wctl_cmd_state_action, wctl_opts_id, "Drop a state's hot copy from the workers",
     "POST /v1/states/{id}/hibernate", "/hibernate", "hibernated"},
    {"resume", wctl_cmd_state_action, wctl_opts_id, "Load a state into a worker slot",
     "POST /v1/states/{id}/resume", "/resume", "resumed"},
    {"rollback", wctl_cmd_state_action, wctl_opts_id,
     "Make an older version the newest again (as a new version)", "POST /v1/states/{id}/rollback",
     "/rollback", "rolled back: new version"},
    {"delete", wctl_cmd_delete, wctl_opts_id, "Delete a state version (or every version of a name)",
     "DELETE /v1/states/{id}", NULL, NULL},
    {"export", wctl_cmd_export, wctl_opts_export, "Write a state to a portable state file",
     "GET /v1/states/{id}/export", NULL, NULL},
    {"import", wctl_cmd_import, wctl_opts_import, "Store a state file as a new state",
     "POST /v1/states/import?name=NAME", NULL, NULL},
    {"migrate", wctl_cmd_migrate, wctl_opts_migrate, "Move a slot to another worker",
     "POST /admin/slots/{worker}:{slot}/migrate", NULL, NULL},
    {"evict", wctl_cmd_evict, wctl_opts_slot, "Free a parked slot (its state stays stored)",
     "POST /admin/slots/{worker}:{slot}/evict", NULL, NULL},
    {"drain", wctl_cmd_drain, wctl_opts_drain,
     "Move every slot off a worker and keep new work away (--undrain: undo)",
     "POST /admin/workers/{id}/drain", NULL, NULL},
    {"cache", wctl_cmd_cache, wctl_opts_cache,
     "Show the checkpoint cache (tiers, owners, hit rate), or clear it",
     "GET /admin/cache[?owner=], POST /admin/cache/clear[?owner=]", NULL, NULL},
    {"responses", wctl_cmd_responses, wctl_opts_responses,
     "List stored responses (POST /v1/responses, store: true), or delete one",
     "GET /admin/responses[?owner=], DELETE /admin/responses/{id}", NULL, NULL},
    {"help", wctl_cmd_help, wctl_opts_help, "Describe wkvmctl or one command", NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};

int
main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN); /* a server that hangs up mid-upload is an error, not a kill */
    wctl_args g, a;
    int rc = wctl_args_parse(argc, argv, &g, &a);
    if (rc >= 0)
        return rc;
    wctl_ctx c;
    memset(&c, 0, sizeof(c));
    const char *env_url = getenv("WKVM_URL");
    const char *env_key = getenv("WKVM_API_KEY");
    c.url_text = wctl_arg_str(&g, "url");
    if (c.url_text == NULL)
        c.url_text = env_url != NULL && env_url[0] ? env_url : WCTL_DEFAULT_URL;
    c.key = wctl_arg_str(&g, "key");
    if (c.key == NULL)
        c.key = env_key;
    c.json = wctl_arg_bool(&g, "json");
    uint64_t tmo = wctl_arg_u64(&g, "timeout", WCTL_DEFAULT_TIMEOUT_S);
    if (tmo > WCTL_TIMEOUT_MAX_S)
        return wctl_usage_fail(a.cmd, "--timeout: at most %u seconds", WCTL_TIMEOUT_MAX_S);
    c.timeout_s = (unsigned)tmo;
    wk_diag d = {{0}};
    if (wctl_url_parse(c.url_text, &c.url, &d) != WK_OK)
        return wctl_usage_fail(a.cmd, "bad --url: %s", d.msg);
    for (const char *p = c.key; p != NULL && *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return wctl_usage_fail(a.cmd, "the API key contains control characters");
    }
    c.http.url = &c.url;
    c.http.key = c.key;
    c.http.timeout_ms = c.timeout_s * 1000u;
    wctl_http_init();
    rc = a.cmd->fn(&c, &a);
    wctl_http_fini();
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "wkvmctl: cannot write the output: %s\n", strerror(errno));
        if (rc == WCTL_EXIT_OK)
            rc = WCTL_EXIT_SERVER;
    }
    return rc;
}
