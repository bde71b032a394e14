/*
 * wkvm-template: renders a chat template (wk_jinja) with a JSON context and
 * prints the result exactly, for operators checking a checkpoint's template
 * and for the corpus test (tests/reference/jinja_corpus.py).
 *
 *   wkvm-template TEMPLATE [CONTEXT.json|-]
 *       prints the rendering of TEMPLATE (a .jinja file) with CONTEXT (a JSON
 *       object: messages, tools, add_generation_prompt, bos_token, ...; "-"
 *       or absent: stdin); exit 0, or 1 with the error on stderr
 *       (2: TEMPLATE refused by the parser, 3: usage or I/O).
 *   wkvm-template --model DIR [--chat-template FILE] [REQUEST.json|-]
 *       renders the chat template of the model directory DIR (wk_chat_tpl:
 *       chat_template.jinja, tokenizer_config.json or the GGUF file; FILE
 *       instead when given) for a chat request body
 *       (messages, tools, chat_template_kwargs; add_generation_prompt, true
 *       when absent), as the server renders it (wk_chat_tpl_prepare: role
 *       developer as system, tool call arguments strings as objects for a
 *       template that iterates them); exit 4 when DIR has none.
 *   wkvm-template --batch
 *       reads JSON lines {"template": PATH, "context": {...}} from stdin and
 *       writes one JSON line per input: {"ok": true, "text": "..."} or
 *       {"ok": false, "stage": "parse"|"render", "code": "EINVAL", "error":
 *       "..."}. Each template file is parsed once (so many renders share one
 *       process start).
 * Reads no other file, never writes one.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_cfg_tool.h"
#include "wk_chat_tpl.h"
#include "wk_err.h"
#include "wk_jinja.h"

#define TEMPLATE_FILE_MAX (1u << 20)

static const char *
code_name(wk_err e)
{
    switch (e) {
    case WK_EINVAL:
        return "EINVAL";
    case WK_ENOTSUP:
        return "ENOTSUP";
    case WK_ETOOBIG:
        return "ETOOBIG";
    case WK_ENOMEM:
        return "ENOMEM";
    case WK_EIO:
        return "EIO";
    default:
        return wk_strerror(e);
    }
}

static char *
read_all(FILE *f, size_t max, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf != NULL) {
        if (n == cap) {
            if (cap >= max) {
                free(buf);
                return NULL;
            }
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    *len = n;
    return buf;
}

static wk_err
load_template(const char *path, wk_jinja **t, wk_diag *d)
{
    FILE *f = fopen(path, "rb");
    size_t len;
    if (f == NULL)
        return wk_diag_set(d, WK_EIO, "%s: cannot open", path);
    char *src = read_all(f, TEMPLATE_FILE_MAX + 1, &len);
    fclose(f);
    if (src == NULL)
        return wk_diag_set(d, WK_ETOOBIG, "%s: unreadable or over %u bytes", path,
                           TEMPLATE_FILE_MAX);
    wk_err e = wk_jinja_parse(src, len, t, d);
    free(src);
    if (e != WK_OK)
        wk_diag_prefix(d, "%s", path);
    return e;
}

/* One parsed template per path, kept for the whole batch. */
typedef struct cached {
    char *path;
    wk_jinja *t;  /* NULL when parsing failed */
    wk_err err;   /* the parse error */
    wk_diag diag; /* its message */
} cached;

static int
batch(void)
{
    cached *cache = NULL;
    size_t ncache = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int rc = 0;
    while ((got = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *in = json_loadb(line, (size_t)got, JSON_REJECT_DUPLICATES, &je);
        json_t *res = json_object();
        const char *path = in != NULL ? json_string_value(json_object_get(in, "template")) : NULL;
        json_t *ctx = in != NULL ? json_object_get(in, "context") : NULL;
        if (path == NULL || !json_is_object(ctx)) {
            json_object_set_new(res, "ok", json_false());
            json_object_set_new(res, "stage", json_string("input"));
            json_object_set_new(res, "error", json_string("expected {\"template\", \"context\"}"));
        } else {
            cached *c = NULL;
            for (size_t i = 0; i < ncache; i++)
                if (strcmp(cache[i].path, path) == 0)
                    c = &cache[i];
            if (c == NULL) {
                cached *nc = realloc(cache, (ncache + 1) * sizeof *nc);
                if (nc == NULL) {
                    rc = 3;
                    json_decref(in);
                    json_decref(res);
                    break;
                }
                cache = nc;
                c = &cache[ncache++];
                memset(c, 0, sizeof *c);
                c->path = strdup(path);
                c->err = load_template(path, &c->t, &c->diag);
            }
            if (c->t == NULL) {
                json_object_set_new(res, "ok", json_false());
                json_object_set_new(res, "stage", json_string("parse"));
                json_object_set_new(res, "code", json_string(code_name(c->err)));
                json_object_set_new(res, "error", json_string(c->diag.msg));
            } else {
                char *out = NULL;
                size_t len = 0;
                wk_diag d = {{0}};
                wk_err e = wk_jinja_render(c->t, ctx, NULL, &out, &len, &d);
                if (e == WK_OK) {
                    json_object_set_new(res, "ok", json_true());
                    json_object_set_new(res, "text", json_stringn(out, len));
                    free(out);
                } else {
                    json_object_set_new(res, "ok", json_false());
                    json_object_set_new(res, "stage", json_string("render"));
                    json_object_set_new(res, "code", json_string(code_name(e)));
                    json_object_set_new(res, "error", json_string(d.msg));
                }
            }
        }
        char *s = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
        if (s != NULL) {
            fputs(s, stdout);
            fputc('\n', stdout);
            fflush(stdout);
            free(s);
        }
        json_decref(res);
        json_decref(in);
    }
    free(line);
    for (size_t i = 0; i < ncache; i++) {
        free(cache[i].path);
        wk_jinja_free(cache[i].t);
    }
    free(cache);
    return rc;
}

/* Reads a JSON object from path ("-" or NULL: stdin); NULL when unreadable or not an object. */
static json_t *
read_object(const char *path)
{
    FILE *cf = path != NULL && strcmp(path, "-") != 0 ? fopen(path, "rb") : stdin;
    if (cf == NULL)
        return NULL;
    size_t len;
    char *js = read_all(cf, 64u << 20, &len);
    if (cf != stdin)
        fclose(cf);
    json_error_t je;
    json_t *v = js != NULL ? json_loadb(js, len, JSON_REJECT_DUPLICATES, &je) : NULL;
    free(js);
    if (!json_is_object(v)) {
        json_decref(v);
        return NULL;
    }
    return v;
}

static int
render_model(const char *dir, const char *override, const char *req_path)
{
    wk_diag d = {{0}};
    wk_chat_tpl *t = NULL;
    wk_err e = wk_chat_tpl_load(dir, override, &t, &d);
    if (e != WK_OK) {
        fprintf(stderr, "wkvm-template: %s (%s)\n", d.msg, wk_strerror(e));
        return e == WK_ENOENT ? 4 : 2;
    }
    json_t *req = read_object(req_path);
    if (req == NULL) {
        fprintf(stderr, "wkvm-template: the request is not a JSON object\n");
        wk_chat_tpl_free(t);
        return 3;
    }
    json_t *agp = json_object_get(req, "add_generation_prompt");
    char *out = NULL;
    size_t len = 0;
    size_t bad_msg, bad_call;
    json_t *msgs = json_object_get(req, "messages");
    e = json_is_array(msgs) ? wk_chat_tpl_prepare(t, msgs, &bad_msg, &bad_call, &d) : WK_OK;
    if (e != WK_OK) {
        fprintf(stderr, "wkvm-template: %s (%s)\n", d.msg, wk_strerror(e));
        json_decref(req);
        wk_chat_tpl_free(t);
        return 1;
    }
    e = wk_chat_tpl_render_json(t, json_object_get(req, "messages"), json_object_get(req, "tools"),
                                agp == NULL || json_is_true(agp),
                                json_object_get(req, "chat_template_kwargs"), NULL, &out, &len, &d);
    json_decref(req);
    wk_chat_tpl_free(t);
    if (e != WK_OK) {
        fprintf(stderr, "wkvm-template: %s (%s)\n", d.msg, wk_strerror(e));
        return 1;
    }
    fwrite(out, 1, len, stdout);
    free(out);
    return 0;
}

/* The command line as wk_cfg fills it. */
typedef struct tpl_args {
    const char *model, *chat_template;
    bool batch;
} tpl_args;

/* The option table: --help prints it (wk_cfg_tool). */
static const wk_cfg_opt tpl_table[] = {
    {"model", WK_CFG_STR, NULL, 0, 0,
     "DIR: render the model directory's chat template for the chat request in "
     "[REQUEST.json|-] (stdin when absent) as the server does; exit 4 when DIR has none"},
    {"chat-template", WK_CFG_STR, NULL, 0, 0, "with --model: this template FILE instead"},
    {"batch", WK_CFG_BOOL, NULL, 0, 0,
     "read JSON lines {\"template\": PATH, \"context\": {...}} on stdin, write one JSON "
     "line per input"},
};

static const wk_cfg_bind tpl_binds[] = {
    WK_CFG_BIND(tpl_args, "model", STR, model),
    WK_CFG_BIND(tpl_args, "chat-template", STR, chat_template),
    WK_CFG_BIND(tpl_args, "batch", BOOL, batch),
};

static const wk_cfg_tool tpl_tool = {
    .prog = "wkvm-template",
    .args = "[TEMPLATE [CONTEXT.json|-]]",
    .about = "Renders TEMPLATE (a .jinja file) with CONTEXT (a JSON object; \"-\" or absent:\n"
             "stdin) and prints the result exactly; or a model's template (--model), or\n"
             "JSON lines (--batch). Exit 1: render error, 2: template refused by the\n"
             "parser, 3: usage or I/O.",
    .opts = tpl_table,
    .n_opts = sizeof(tpl_table) / sizeof(tpl_table[0]),
    .binds = tpl_binds,
    .n_binds = sizeof(tpl_binds) / sizeof(tpl_binds[0]),
    .max_pos = 2,
    .usage_status = 3,
};

/* The rendering the arguments ask for; the exit status. */
static int
tpl_run(const tpl_args *a, const wk_cfg *cfg)
{
    size_t npos = wk_cfg_npos(cfg);
    if (a->batch && a->model == NULL && a->chat_template == NULL && npos == 0)
        return batch();
    if (!a->batch && a->model != NULL && npos <= 1)
        return render_model(a->model, a->chat_template, npos == 1 ? wk_cfg_pos(cfg, 0) : NULL);
    if (a->batch || a->model != NULL || a->chat_template != NULL || npos == 0) {
        fprintf(stderr, "usage: wkvm-template TEMPLATE [CONTEXT.json|-]\n"
                        "       wkvm-template --model DIR [--chat-template FILE] [REQUEST.json|-]\n"
                        "       wkvm-template --batch   (JSON lines on stdin)\n"
                        "       wkvm-template --help | --version\n");
        return 3;
    }
    const char *tpl_path = wk_cfg_pos(cfg, 0);
    wk_diag d = {{0}};
    wk_jinja *t = NULL;
    wk_err e = load_template(tpl_path, &t, &d);
    if (e != WK_OK) {
        fprintf(stderr, "wkvm-template: %s (%s)\n", d.msg, wk_strerror(e));
        return e == WK_EIO ? 3 : 2;
    }
    json_t *ctx = read_object(npos == 2 ? wk_cfg_pos(cfg, 1) : NULL);
    if (ctx == NULL) {
        fprintf(stderr, "wkvm-template: the context is not a readable JSON object\n");
        wk_jinja_free(t);
        return 3;
    }
    char *out = NULL;
    size_t olen = 0;
    e = wk_jinja_render(t, ctx, NULL, &out, &olen, &d);
    json_decref(ctx);
    wk_jinja_free(t);
    if (e != WK_OK) {
        fprintf(stderr, "wkvm-template: %s (%s)\n", d.msg, wk_strerror(e));
        return 1;
    }
    fwrite(out, 1, olen, stdout);
    free(out);
    return 0;
}

int
main(int argc, char **argv)
{
    tpl_args a = {0};
    wk_cfg *cfg = NULL;
    int prc = wk_cfg_tool_parse(&tpl_tool, argc, argv, &a, &cfg);
    if (prc != WK_CFG_TOOL_RUN)
        return prc;
    int rc = tpl_run(&a, cfg);
    wk_cfg_free(cfg);
    return rc;
}
