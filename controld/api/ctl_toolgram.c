/*
 * ctl_toolgram: the grammar and matcher of one request, and the vocab trie
 * cache: one entry per tokenizer digest (a controller serves one model, so
 * one entry in practice), reference-counted so that a request still running
 * keeps the trie it started with.
 */
#include "ctl_toolgram.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_grammar.h"

typedef struct ctl_tg_vocab {
    char digest[65];            /* the tokenizer's digest */
    wk_gvocab *v;               /* its trie */
    unsigned refs;              /* the cache's own + one per ctl_toolgram */
    struct ctl_tg_vocab *next;  /* cache list */
} ctl_tg_vocab;

struct ctl_toolgram {
    wk_grammar *g;
    wk_gmatch *m;
    ctl_tg_vocab *vocab;
};

static pthread_mutex_t ctl_tg_mu = PTHREAD_MUTEX_INITIALIZER;
static ctl_tg_vocab *ctl_tg_cache; /* the current entry (older ones live while referenced) */

static void
ctl_tg_unref_locked(ctl_tg_vocab *e)
{
    if (--e->refs == 0) {
        wk_gvocab_free(e->v);
        free(e);
    }
}

/* The trie of tok, from the cache or built (outside the lock). */
static wk_err
ctl_tg_vocab_get(const wk_tok *tok, ctl_tg_vocab **out)
{
    const char *dg = wk_tok_digest(tok);
    pthread_mutex_lock(&ctl_tg_mu);
    ctl_tg_vocab *e = ctl_tg_cache;
    if (e != NULL && strcmp(e->digest, dg != NULL ? dg : "") == 0) {
        e->refs++;
        pthread_mutex_unlock(&ctl_tg_mu);
        *out = e;
        return WK_OK;
    }
    pthread_mutex_unlock(&ctl_tg_mu);
    uint32_t n = wk_tok_vocab_size(tok);
    const uint8_t **p = calloc(n ? n : 1, sizeof(*p));
    size_t *len = calloc(n ? n : 1, sizeof(*len));
    uint8_t *lit = calloc(n ? n : 1, 1);
    ctl_tg_vocab *ne = calloc(1, sizeof(*ne));
    wk_err err = WK_ENOMEM;
    if (p != NULL && len != NULL && lit != NULL && ne != NULL) {
        /* (added tokens are control tokens: only where the grammar has their text fixed) */
        for (uint32_t i = 0; i < n; i++) {
            p[i] = wk_tok_piece(tok, (int32_t)i, &len[i]);
            lit[i] = wk_tok_is_added(tok, (int32_t)i);
        }
        err = wk_gvocab_new(p, len, n, wk_tok_eos(tok), lit, &ne->v);
    }
    free(p);
    free(len);
    free(lit);
    if (err != WK_OK) {
        free(ne);
        return err;
    }
    snprintf(ne->digest, sizeof(ne->digest), "%s", dg != NULL ? dg : "");
    ne->refs = 2; /* the cache's and the caller's */
    pthread_mutex_lock(&ctl_tg_mu);
    if (ctl_tg_cache != NULL && strcmp(ctl_tg_cache->digest, ne->digest) == 0) {
        /* Another request built it meanwhile: use that one. */
        ctl_tg_cache->refs++;
        e = ctl_tg_cache;
        pthread_mutex_unlock(&ctl_tg_mu);
        wk_gvocab_free(ne->v);
        free(ne);
        *out = e;
        return WK_OK;
    }
    if (ctl_tg_cache != NULL)
        ctl_tg_unref_locked(ctl_tg_cache);
    ctl_tg_cache = ne;
    pthread_mutex_unlock(&ctl_tg_mu);
    *out = ne;
    return WK_OK;
}

wk_err
ctl_toolgram_new(const wk_tok *tok, wk_toolcall_fmt fmt, const json_t *tools, const char *name,
                 bool parallel, bool in_reasoning, const char *think_close, ctl_toolgram **out,
                 wk_diag *d)
{
    *out = NULL;
    char *text = json_dumps(tools, JSON_COMPACT);
    if (text == NULL)
        return WK_ENOMEM;
    wk_grammar_spec sp = {
        .format = fmt,
        .tools = text,
        .tools_len = strlen(text),
        .function = name,
        .parallel = parallel,
        .prefix_until = in_reasoning ? think_close : NULL,
    };
    ctl_toolgram *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        free(text);
        return WK_ENOMEM;
    }
    wk_err err = wk_grammar_compile(&sp, &t->g, d);
    free(text);
    if (err == WK_OK) {
        t->m = wk_gmatch_new(t->g);
        err = t->m != NULL ? ctl_tg_vocab_get(tok, &t->vocab) : WK_ENOMEM;
        if (err != WK_OK)
            wk_diag_set(d, err, "out of memory");
    }
    if (err != WK_OK) {
        ctl_toolgram_free(t);
        return err;
    }
    *out = t;
    return WK_OK;
}

void
ctl_toolgram_apply(ctl_toolgram *t, ctl_gen_params *gen)
{
    gen->match = t->m;
    gen->gvocab = t->vocab->v;
}

void
ctl_toolgram_free(ctl_toolgram *t)
{
    if (t == NULL)
        return;
    if (t->vocab != NULL) {
        pthread_mutex_lock(&ctl_tg_mu);
        ctl_tg_unref_locked(t->vocab);
        pthread_mutex_unlock(&ctl_tg_mu);
    }
    wk_gmatch_free(t->m);
    wk_grammar_free(t->g);
    free(t);
}
