/*
 * parse_fixture.h: what the controller's parser tests share: an app over a
 * World vocab of the 256 single bytes (ids 1..256) with small limits, and a
 * chat template loaded from a temporary model directory. (Header-only:
 * static functions, one test binary each; cmocka's headers come first.)
 */
#ifndef PARSE_FIXTURE_H
#define PARSE_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl_app.h"
#include "wk_chat_tpl.h"
#include "wk_tok.h"

/* app: the byte vocab, model "m", small limits (4 messages of 16 bytes, 8 prompt tokens). */
static void
pf_app_init(ctl_app *app)
{
    char *v = malloc(256 * 24);
    assert_non_null(v);
    size_t n = 0;
    for (int i = 0; i < 256; i++)
        n += (size_t)snprintf(v + n, 24, "%d b'\\x%02x' 1\n", i + 1, i);
    wk_diag d = {{0}};
    memset(app, 0, sizeof(*app));
    if (wk_tok_load_mem(v, n, &app->tok, &d) != WK_OK)
        fail_msg("vocab: %s", d.msg);
    free(v);
    app->model_id = "m";
    app->default_max_tokens = 64;
    app->max_tokens_limit = 4096;
    app->max_stop_bytes = 8;
    app->max_messages = 4;
    app->max_message_bytes = 16;
    app->max_prompt_tokens = 8;
}

static void
pf_write_file(const char *dir, const char *name, const char *text)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/*
 * A temporary model directory dir (/tmp/<prefix>-XXXXXX, at most 64 bytes)
 * holding template src and a tokenizer_config.json with eos; its template
 * loaded into *out.
 */
static void
pf_tpl_load(char dir[64], const char *prefix, const char *src, const char *eos,
            wk_chat_tpl **out)
{
    snprintf(dir, 64, "/tmp/%s-XXXXXX", prefix);
    if (mkdtemp(dir) == NULL)
        fail_msg("mkdtemp");
    char cfg[128];
    snprintf(cfg, sizeof(cfg), "{\"eos_token\": \"%s\"}", eos);
    pf_write_file(dir, "chat_template.jinja", src);
    pf_write_file(dir, "tokenizer_config.json", cfg);
    wk_diag d = {{0}};
    if (wk_chat_tpl_load(dir, NULL, out, &d) != WK_OK)
        fail_msg("template: %s", d.msg);
}

/* Removes what pf_tpl_load wrote. */
static void
pf_tpl_dir_remove(const char *dir)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    unlink(path);
    rmdir(dir);
}

#endif
