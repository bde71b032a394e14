/*
 * wkvm-bench-grammar: the cost of constrained tool calls on a real vocab.
 * Loads a tokenizer (GGUF token list or a model directory), builds the vocab
 * trie once, then times wk_gmatch_allowed() (one decode step's mask) in the
 * states a call passes through: the start, a function name, inside a JSON
 * string, inside a raw XML string, inside a number, between properties.
 *
 *   wkvm-bench-grammar VOCAB.gguf|MODEL_DIR [--iterations N]
 *
 * Prints one line per state: allowed tokens, median and max microseconds.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_clock.h"
#include "wk_cfg_tool.h"
#include "wk_grammar.h"
#include "wk_tok.h"



static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
    "\"days\":{\"type\":\"integer\"},\"unit\":{\"enum\":[\"c\",\"f\"]}},"
    "\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\"}}}}}]";

typedef struct bg_args {
    uint32_t iterations;
} bg_args;

static const wk_cfg_opt bg_table[] = {
    {"iterations", WK_CFG_U64, "20", 1, 1000000, "masks timed per state"},
};

static const wk_cfg_bind bg_binds[] = {
    WK_CFG_BIND(bg_args, "iterations", U32, iterations),
};

static const wk_cfg_tool bg_tool = {
    .prog = "wkvm-bench-grammar",
    .args = "VOCAB.gguf|MODEL_DIR",
    .about = "Times one decode step's token mask of a constrained tool call in the states\n"
             "a call passes through; one line per state: allowed tokens, median and max us.",
    .opts = bg_table,
    .n_opts = 1,
    .binds = bg_binds,
    .n_binds = 1,
    .max_pos = 1,
};

int
main(int argc, char **argv)
{
    bg_args args = {0};
    wk_cfg *cfg = NULL;
    int prc = wk_cfg_tool_parse(&bg_tool, argc, argv, &args, &cfg);
    if (prc != WK_CFG_TOOL_RUN)
        return prc;
    if (wk_cfg_npos(cfg) != 1) {
        fprintf(stderr, "wkvm-bench-grammar: VOCAB.gguf or MODEL_DIR is required (see --help)\n");
        wk_cfg_free(cfg);
        return 2;
    }
    const char *vocab = wk_cfg_pos(cfg, 0);
    int iters = (int)args.iterations;
    wk_tok *tok = NULL;
    wk_diag d = {{0}};
    size_t al = strlen(vocab);
    wk_err err = al > 5 && strcmp(vocab + al - 5, ".gguf") == 0
                     ? wk_tok_load_gguf(vocab, &tok, &d)
                     : wk_tok_load_dir(vocab, NULL, &tok, &d);
    if (err != WK_OK) {
        fprintf(stderr, "tokenizer: %s\n", d.msg);
        return 1;
    }
    uint32_t n = wk_tok_vocab_size(tok);
    const uint8_t **p = calloc(n, sizeof(*p));
    size_t *len = calloc(n, sizeof(*len));
    uint64_t *mask = calloc((n + 63) / 64, sizeof(*mask));
    double *t = calloc((size_t)iters, sizeof(*t));
    if (p == NULL || len == NULL || mask == NULL || t == NULL)
        return 1;
    uint8_t *lit = calloc(n, 1);
    if (lit == NULL)
        return 1;
    for (uint32_t i = 0; i < n; i++) {
        p[i] = wk_tok_piece(tok, (int32_t)i, &len[i]);
        lit[i] = wk_tok_is_added(tok, (int32_t)i); /* (as ctl_toolgram builds it) */
    }
    double t0 = bench_now_us();
    wk_gvocab *v = NULL;
    if (wk_gvocab_new(p, len, n, wk_tok_eos(tok), lit, &v) != WK_OK)
        return 1;
    printf("vocab %u tokens, trie built in %.1f ms\n", n, (bench_now_us() - t0) / 1e3);
    static const struct {
        wk_toolcall_fmt fmt;
        const char *name;
        const char *prefix;
    } states[] = {
        {WK_TOOLCALL_FMT_XML, "xml start", ""},
        {WK_TOOLCALL_FMT_XML, "xml function name", "<tool_call>\n<function="},
        {WK_TOOLCALL_FMT_XML, "xml raw string value", "<tool_call>\n<function=get_weather>\n"
                                                 "<parameter=city>\nPar"},
        {WK_TOOLCALL_FMT_XML, "xml integer value", "<tool_call>\n<function=get_weather>\n"
                                              "<parameter=days>\n1"},
        {WK_TOOLCALL_FMT_HERMES, "json start", ""},
        {WK_TOOLCALL_FMT_HERMES, "json between properties", "<tool_call>\n{\"name\": \"get_weather\", "
                                                     "\"arguments\": {\"days\": 3"},
        {WK_TOOLCALL_FMT_HERMES, "json string value", "<tool_call>\n{\"name\": \"get_weather\", "
                                               "\"arguments\": {\"city\": \"Par"},
        {WK_TOOLCALL_FMT_HERMES, "json key", "<tool_call>\n{\"name\": \"get_weather\", "
                                      "\"arguments\": {\""},
    };
    printf("%-26s %9s %10s %10s\n", "state", "allowed", "median_us", "max_us");
    for (size_t s = 0; s < sizeof(states) / sizeof(states[0]); s++) {
        wk_grammar_spec sp = {.format = states[s].fmt, .tools = TOOLS, .tools_len = strlen(TOOLS)};
        wk_grammar *g = NULL;
        if (wk_grammar_compile(&sp, &g, &d) != WK_OK) {
            fprintf(stderr, "compile: %s\n", d.msg);
            return 1;
        }
        wk_gmatch *m = wk_gmatch_new(g);
        if (!wk_gmatch_advance(m, (const uint8_t *)states[s].prefix, strlen(states[s].prefix))) {
            fprintf(stderr, "%s: prefix refused\n", states[s].name);
            return 1;
        }
        size_t allowed = 0;
        for (int i = 0; i < iters; i++) {
            double a = bench_now_us();
            allowed = wk_gmatch_allowed(m, v, mask);
            t[i] = bench_now_us() - a;
        }
        qsort(t, (size_t)iters, sizeof(*t), bench_cmp_double);
        printf("%-26s %9zu %10.0f %10.0f\n", states[s].name, allowed, t[iters / 2], t[iters - 1]);
        wk_gmatch_free(m);
        wk_grammar_free(g);
    }
    wk_gvocab_free(v);
    wk_tok_free(tok);
    free(p);
    free(len);
    free(mask);
    free(t);
    wk_cfg_free(cfg);
    return 0;
}
