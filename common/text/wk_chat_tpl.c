/*
 * wk_chat_tpl: a checkpoint's chat template (wk_chat_tpl.h): found in the
 * model directory as transformers finds it, parsed once with wk_jinja, and
 * rendered with the variables apply_chat_template passes. File reading is
 * bounded (wk_file_read); a refused template is an error naming the file,
 * never a silent fallback to another format.
 */
#include "wk_chat_tpl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_file.h"
#include "wk_gguf.h"
#include "wk_tok.h"

struct wk_chat_tpl {
    wk_jinja *def;          /* the template, or the "default" named one; may be NULL */
    wk_jinja *tool_use;     /* the "tool_use" named one, or NULL */
    const char *source;     /* file it came from */
    json_t *special;        /* {"bos_token": "...", ...}: the special tokens found */
    bool think;             /* a template source names the think markers ("</think>") */
    bool effort;            /* a template source names the variable reasoning_effort */
    bool enable;            /* a template source names the variable enable_thinking */
    wk_toolcall_fmt tc_fmt; /* the tool-call format its sources render (the first known) */
    bool tc_object_args;    /* a source iterates a call's arguments as a mapping */
};

static const char *const SPECIAL[] = {"bos_token", "eos_token", "unk_token", "pad_token", NULL};

/* True when src (len bytes) contains the NUL-terminated m. */
static bool
tpl_names(const char *src, size_t len, const char *m)
{
    size_t ml = strlen(m);
    for (size_t i = 0; i + ml <= len; i++)
        if (memcmp(src + i, m, ml) == 0)
            return true;
    return false;
}

/*
 * What a template source tells about its model: think markers, the
 * reasoning variables it reads, tool-call format.
 */
static void
tpl_scan(wk_chat_tpl *t, const char *src, size_t len)
{
    t->think |= tpl_names(src, len, WK_CHAT_TPL_THINK_CLOSE);
    t->effort |= tpl_names(src, len, "reasoning_effort");
    t->enable |= tpl_names(src, len, "enable_thinking");
    char *z = malloc(len + 1); /* (NUL-terminated for the format detection) */
    if (z == NULL)
        return; /* (then no tool-call format: replies stay content) */
    memcpy(z, src, len);
    z[len] = '\0';
    if (t->tc_fmt == WK_TOOLCALL_FMT_NONE)
        t->tc_fmt = wk_toolcall_fmt_detect(z);
    t->tc_object_args |= wk_toolcall_tpl_object_args(z);
    free(z);
}

static wk_err
tpl_parse(wk_chat_tpl *t, const char *src, size_t len, const char *what, wk_jinja **out, wk_diag *d)
{
    tpl_scan(t, src, len);
    wk_err e = wk_jinja_parse(src, len, out, d);
    if (e != WK_OK)
        wk_diag_prefix(d, "%s", what);
    return e;
}

/* Reads the special tokens and, when has_tpl is false, the template of tokenizer_config.json. */
static wk_err
tpl_from_config(wk_chat_tpl *t, const char *path, bool want_tpl, wk_diag *d)
{
    char *buf = NULL;
    size_t len = 0;
    wk_err e = wk_file_read(path, WK_CHAT_TPL_CONFIG_MAX, &buf, &len, d);
    if (e != WK_OK)
        return e;
    json_error_t je;
    json_t *cfg = json_loadb(buf, len, 0, &je);
    free(buf);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return wk_diag_set(d, WK_EINVAL, "%s: line %d: %s", path, je.line,
                           cfg == NULL ? je.text : "not a JSON object");
    }
    for (const char *const *k = SPECIAL; *k != NULL; k++) {
        json_t *v = json_object_get(cfg, *k);
        if (json_is_object(v))
            v = json_object_get(v, "content"); /* an AddedToken */
        if (json_is_string(v) && json_object_set(t->special, *k, v) != 0) {
            json_decref(cfg);
            return wk_diag_set(d, WK_ENOMEM, "out of memory");
        }
    }
    json_t *ct = want_tpl ? json_object_get(cfg, "chat_template") : NULL;
    e = WK_OK;
    if (json_is_string(ct)) {
        e = tpl_parse(t, json_string_value(ct), json_string_length(ct), path, &t->def, d);
    } else if (json_is_array(ct)) {
        size_t i;
        json_t *item;
        json_array_foreach(ct, i, item)
        {
            const char *name = json_string_value(json_object_get(item, "name"));
            json_t *src = json_object_get(item, "template");
            if (name == NULL || !json_is_string(src)) {
                e = wk_diag_set(d, WK_EINVAL,
                                "%s: chat_template[%zu] is not {\"name\", "
                                "\"template\"}",
                                path, i);
                break;
            }
            wk_jinja **slot = strcmp(name, "default") == 0    ? &t->def
                              : strcmp(name, "tool_use") == 0 ? &t->tool_use
                                                              : NULL;
            if (slot == NULL || *slot != NULL)
                continue; /* other named templates (rag, ...) are not used by chat requests */
            tpl_scan(t, json_string_value(src), json_string_length(src));
            e = wk_jinja_parse(json_string_value(src), json_string_length(src), slot, d);
            if (e != WK_OK) {
                wk_diag_prefix(d, "%s: chat_template \"%s\"", path, name);
                break;
            }
        }
        if (e == WK_OK && t->def == NULL && t->tool_use == NULL)
            e = wk_diag_set(d, WK_ENOENT, "%s: no \"default\" or \"tool_use\" chat template", path);
    } else if (want_tpl && ct != NULL && !json_is_null(ct)) {
        e = wk_diag_set(d, WK_EINVAL, "%s: chat_template is neither a string nor a list", path);
    } else if (want_tpl) {
        e = wk_diag_set(d, WK_ENOENT, "%s: no chat_template", path);
    }
    json_decref(cfg);
    return e;
}

/* The token string of the GGUF metadata key <name>_id, as tokenizer.ggml.tokens holds it. */
static void
gguf_special(wk_chat_tpl *t, const wk_gguf *g, const char *name)
{
    char key[64];
    uint64_t id;
    const char *s;
    size_t len;
    if (json_object_get(t->special, name) != NULL)
        return;
    /* GGUF names: bos_token_id, eos_token_id, unknown_token_id, padding_token_id */
    const char *gname = strcmp(name, "unk_token") == 0   ? "unknown_token"
                        : strcmp(name, "pad_token") == 0 ? "padding_token"
                                                         : name;
    snprintf(key, sizeof key, "tokenizer.ggml.%s_id", gname);
    if (wk_gguf_get_u64(g, key, &id, NULL) != WK_OK ||
        wk_gguf_arr_str(g, "tokenizer.ggml.tokens", id, &s, &len, NULL) != WK_OK)
        return;
    json_t *v = json_stringn(s, len);
    if (v != NULL)
        json_object_set_new(t->special, name, v);
}

/* Source 3: the one *.gguf of dir. WK_ENOENT when there is none or it has no template. */
static wk_err
tpl_from_gguf(wk_chat_tpl *t, const char *dir, bool want_tpl, wk_diag *d)
{
    char *path = NULL;
    wk_gguf *g = NULL;
    wk_err e = wk_tok_find_gguf(dir, &path, d);
    if (e != WK_OK)
        return e;
    e = wk_gguf_open(path, &g, d);
    if (e == WK_OK) {
        gguf_special(t, g, "bos_token");
        gguf_special(t, g, "eos_token");
        gguf_special(t, g, "unk_token");
        gguf_special(t, g, "pad_token");
        const char *s;
        size_t len;
        if (want_tpl) {
            e = wk_gguf_get_str(g, "tokenizer.chat_template", &s, &len, d);
            if (e == WK_OK)
                e = tpl_parse(t, s, len, path, &t->def, d);
            else if (e == WK_ENOENT)
                wk_diag_set(d, WK_ENOENT, "%s: no tokenizer.chat_template", path);
        }
    }
    wk_gguf_free(g);
    free(path);
    return e;
}

wk_err
wk_chat_tpl_load(const char *dir, const char *override_path, wk_chat_tpl **out, wk_diag *d)
{
    char path[4096];
    wk_chat_tpl *t;
    wk_err e;
    if (dir == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "wk_chat_tpl_load: NULL argument");
    /* a checkpoint file (--model m.gguf): its directory holds the template */
    char parent[2048]; /* a shorter path than path below, so each name fits */
    bool is_file = false;
    if (wk_file_model_path(dir, parent, sizeof parent, NULL, 0, &is_file) != WK_OK)
        return wk_diag_set(d, WK_ETOOBIG, "chat template: path too long: %s", dir);
    if (is_file)
        dir = parent;
    t = calloc(1, sizeof *t);
    if (t == NULL || (t->special = json_object()) == NULL) {
        free(t);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    /* 0. the override, else 1. chat_template.jinja */
    if (override_path != NULL)
        snprintf(path, sizeof path, "%s", override_path);
    else
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    char *src = NULL;
    size_t len = 0;
    wk_diag fd = {{0}};
    e = wk_file_read(path, WK_JINJA_SOURCE_MAX, &src, &len, &fd);
    if (e == WK_OK) {
        e = tpl_parse(t, src, len, path, &t->def, d);
        free(src);
        t->source = override_path != NULL ? "override" : "chat_template.jinja";
    } else if (e != WK_ENOENT || override_path != NULL) {
        if (d != NULL)
            *d = fd;
        goto fail;
    }
    /* 2. tokenizer_config.json: the special tokens, and the template when 1. had none */
    if (e == WK_OK || e == WK_ENOENT) {
        bool want = t->def == NULL;
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        wk_diag cd = {{0}};
        wk_err ce = tpl_from_config(t, path, want, &cd);
        if (ce == WK_OK && want)
            t->source = "tokenizer_config.json";
        /* 3. the GGUF file: its template when none was found, its special tokens */
        {
            wk_diag gd = {{0}};
            bool want_g = want && ce == WK_ENOENT;
            wk_err ge = tpl_from_gguf(t, dir, want_g, &gd);
            if (want_g) {
                ce = ge;
                cd = gd;
                if (ge == WK_OK)
                    t->source = "gguf";
            }
        }
        if (ce != WK_OK && !(ce == WK_ENOENT && !want)) {
            e = ce;
            if (d != NULL)
                *d = cd;
            if (ce == WK_ENOENT)
                wk_diag_set(d, WK_ENOENT,
                            "%s: no chat template (chat_template.jinja, "
                            "tokenizer_config.json chat_template or a GGUF "
                            "tokenizer.chat_template)",
                            dir);
            goto fail;
        }
        e = WK_OK;
    }
    if (e != WK_OK)
        goto fail;
    *out = t;
    return WK_OK;
fail:
    wk_chat_tpl_free(t);
    return e;
}

wk_err
wk_chat_tpl_render_json(const wk_chat_tpl *t, const json_t *messages, const json_t *tools,
                        bool add_generation_prompt, const json_t *kwargs,
                        const wk_jinja_limits *lim, char **out, size_t *len, wk_diag *d)
{
    static const char *const RESERVED[] = {"messages", "tools", "documents",
                                           "add_generation_prompt", NULL};
    if (t == NULL || out == NULL || !json_is_array(messages) ||
        (tools != NULL && !json_is_array(tools) && !json_is_null(tools)) ||
        (kwargs != NULL && !json_is_object(kwargs)))
        return wk_diag_set(d, WK_EINVAL,
                           "chat template: messages must be an array, tools an "
                           "array, chat_template_kwargs an object");
    bool has_tools = json_is_array(tools);
    const wk_jinja *j = has_tools && t->tool_use != NULL ? t->tool_use : t->def;
    if (j == NULL)
        return wk_diag_set(d, WK_EINVAL,
                           "chat template: the model has only a \"tool_use\" "
                           "template and the request has no tools");
    json_t *ctx = json_object();
    if (ctx == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    int bad = json_object_set(ctx, "messages", (json_t *)messages);
    bad |=
        json_object_set_new(ctx, "tools", has_tools ? json_incref((json_t *)tools) : json_null());
    bad |= json_object_set_new(ctx, "documents", json_null());
    bad |= json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt));
    bad |= json_object_update(ctx, t->special);
    if (kwargs != NULL) {
        for (const char *const *r = RESERVED; *r != NULL; r++) {
            if (json_object_get(kwargs, *r) != NULL) {
                json_decref(ctx);
                return wk_diag_set(d, WK_EINVAL, "chat_template_kwargs may not set \"%s\"", *r);
            }
        }
        bad |= json_object_update(ctx, (json_t *)kwargs);
    }
    if (bad != 0) {
        json_decref(ctx);
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    }
    wk_err e = wk_jinja_render(j, ctx, lim, out, len, d);
    json_decref(ctx);
    return e;
}

wk_err
wk_chat_tpl_render(const wk_chat_tpl *t, const wk_chat_msg *msgs, size_t n,
                   bool add_generation_prompt, char **out, size_t *len, wk_diag *d)
{
    json_t *arr = json_array();
    if (arr == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const char *c = msgs[i].content != NULL ? msgs[i].content : "";
        size_t cl = msgs[i].content == NULL    ? 0
                    : msgs[i].content_len != 0 ? msgs[i].content_len
                                               : strlen(c);
        json_t *content = json_stringn(c, cl);
        if (msgs[i].role == NULL || content == NULL) {
            json_decref(content);
            json_decref(arr);
            return wk_diag_set(d, WK_EINVAL, "message %zu: %s", i,
                               msgs[i].role == NULL ? "no role" : "content is not UTF-8");
        }
        json_t *m = json_pack("{s:s, s:o}", "role", msgs[i].role, "content", content);
        if (m == NULL || json_array_append_new(arr, m) != 0) {
            json_decref(arr);
            return wk_diag_set(d, WK_ENOMEM, "out of memory");
        }
    }
    wk_err e =
        wk_chat_tpl_render_json(t, arr, NULL, add_generation_prompt, NULL, NULL, out, len, d);
    json_decref(arr);
    return e;
}

const char *
wk_chat_tpl_source(const wk_chat_tpl *t)
{
    return t != NULL && t->source != NULL ? t->source : "";
}

const char *
wk_chat_tpl_special(const wk_chat_tpl *t, const char *name)
{
    return t != NULL ? json_string_value(json_object_get(t->special, name)) : NULL;
}

bool
wk_chat_tpl_thinks(const wk_chat_tpl *t)
{
    return t != NULL && t->think;
}

bool
wk_chat_tpl_knows(const wk_chat_tpl *t, const char *var)
{
    if (t == NULL || var == NULL)
        return false;
    return strcmp(var, "reasoning_effort") == 0  ? t->effort
           : strcmp(var, "enable_thinking") == 0 ? t->enable
                                                 : false;
}

wk_err
wk_chat_tpl_prepare(const wk_chat_tpl *t, json_t *messages, size_t *bad_msg, size_t *bad_call,
                    wk_diag *d)
{
    size_t i, k;
    json_t *m, *call;
    json_array_foreach(messages, i, m)
    {
        json_t *role = json_object_get(m, "role");
        if (json_is_string(role) && strcmp(json_string_value(role), "developer") == 0 &&
            json_object_set_new(m, "role", json_string("system")) != 0)
            return wk_diag_set(d, WK_ENOMEM, "out of memory");
        if (!wk_chat_tpl_object_args(t))
            continue;
        json_array_foreach(json_object_get(m, "tool_calls"), k, call)
        {
            json_t *fn = json_object_get(call, "function");
            json_t *args = json_object_get(fn, "arguments");
            if (!json_is_string(args))
                continue;
            json_error_t je;
            json_t *o = json_loadb(json_string_value(args), json_string_length(args),
                                   JSON_REJECT_DUPLICATES, &je);
            if (!json_is_object(o)) {
                json_decref(o);
                *bad_msg = i;
                *bad_call = k;
                return wk_diag_set(d, WK_EINVAL,
                                   "messages[%zu].tool_calls[%zu].function.arguments: arguments "
                                   "must be a JSON object (in a string): this model's template "
                                   "reads them as one",
                                   i, k);
            }
            if (json_object_set_new(fn, "arguments", o) != 0)
                return wk_diag_set(d, WK_ENOMEM, "out of memory");
        }
    }
    return WK_OK;
}

wk_toolcall_fmt
wk_chat_tpl_toolcall_fmt(const wk_chat_tpl *t)
{
    return t != NULL ? t->tc_fmt : WK_TOOLCALL_FMT_NONE;
}

bool
wk_chat_tpl_object_args(const wk_chat_tpl *t)
{
    return t != NULL && t->tc_object_args;
}

void
wk_chat_tpl_free(wk_chat_tpl *t)
{
    if (t == NULL)
        return;
    wk_jinja_free(t->def);
    wk_jinja_free(t->tool_use);
    json_decref(t->special);
    free(t);
}
