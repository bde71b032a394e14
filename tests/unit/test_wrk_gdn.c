/*
 * test_wrk_gdn: the Gated DeltaNet family mapping (family/wrk_gdn.c, fla-hub
 * gated_deltanet names) on tiny synthetic checkpoints (tset_synth.h): the
 * dimensions of the view from the shapes and config.json, the slot layout
 * and state bytes, a hybrid with one attention layer (its KV bytes per
 * token, no recurrent state of its own), and the refusals with their
 * messages.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tset_synth.h"
#include "wrk_gdn.h"
#include "wrk_model.h"

/* C 16, H 2 heads of K 8 (KD 16), HV 2 of Vd 8 (VD 16), W 4, F 32, V 40, L 2 */
enum { C = 16, H = 2, K = 8, HV = 2, VH = 8, KD = 16, VD = 16, W = 4, F = 32, V = 40, L = 2 };
/* the hybrid's attention layer: 2 query heads, 1 KV head of Da = C / 2 */
enum { HQ = 2, HKV = 1, DA = 8 };

#define CFG_HEAD                                                                                   \
    "{\"model_type\":\"gated_deltanet\",\"hidden_size\":16,\"num_hidden_layers\":2,"               \
    "\"num_heads\":2,\"head_dim\":8,\"expand_v\":1,\"use_gate\":true,\"conv_size\":4,"             \
    "\"intermediate_size\":32,\"norm_eps\":1e-6,\"vocab_size\":40,"                                \
    "\"tie_word_embeddings\":false"
static const char *const cfg_ok = CFG_HEAD "}";
static const char *const cfg_hybrid =
    CFG_HEAD ",\"attn\":{\"layers\":[1],\"num_heads\":2,\"num_kv_heads\":1,"
             "\"qkv_bias\":false,\"window_size\":null,\"rope_theta\":10000.0}}";

static void
build(tset *s, bool hybrid, bool head)
{
    memset(s, 0, sizeof(*s));
    tset_add(s, "model.embeddings.weight", V, C, 0);
    for (int l = 0; l < L; l++) {
        char n[128];
#define ADD(suf, a, b, c)                                                                          \
    do {                                                                                           \
        snprintf(n, sizeof(n), "model.layers.%d.%s", l, suf);                                      \
        tset_add(s, n, a, b, c);                                                                   \
    } while (0)
        ADD("attn_norm.weight", C, 0, 0);
        if (hybrid && l == 1) {
            ADD("attn.q_proj.weight", HQ * DA, C, 0);
            ADD("attn.k_proj.weight", HKV * DA, C, 0);
            ADD("attn.v_proj.weight", HKV * DA, C, 0);
            ADD("attn.o_proj.weight", C, HQ * DA, 0);
        } else {
            ADD("attn.q_proj.weight", KD, C, 0);
            ADD("attn.k_proj.weight", KD, C, 0);
            ADD("attn.v_proj.weight", VD, C, 0);
            ADD("attn.a_proj.weight", HV, C, 0);
            ADD("attn.b_proj.weight", HV, C, 0);
            ADD("attn.g_proj.weight", VD, C, 0);
            ADD("attn.q_conv1d.weight", KD, 1, W);
            ADD("attn.k_conv1d.weight", KD, 1, W);
            ADD("attn.v_conv1d.weight", VD, 1, W);
            ADD("attn.A_log", HV, 0, 0);
            ADD("attn.dt_bias", HV, 0, 0);
            ADD("attn.o_norm.weight", VH, 0, 0);
            ADD("attn.o_proj.weight", C, VD, 0);
        }
        ADD("mlp_norm.weight", C, 0, 0);
        ADD("mlp.gate_proj.weight", F, C, 0);
        ADD("mlp.up_proj.weight", F, C, 0);
        ADD("mlp.down_proj.weight", C, F, 0);
#undef ADD
    }
    tset_add(s, "model.norm.weight", C, 0, 0);
    if (head)
        tset_add(s, "lm_head.weight", V, C, 0);
}

static void
expect_refused(const tset *s, const char *config, wk_err err, const char *want)
{
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    wk_err e = tset_load(s, config, &m, &d);
    if (e != err || strstr(d.msg, want) == NULL)
        fail_msg("expected %s with '%s', got %s: %s", wk_err_name(err), want, wk_err_name(e),
                 d.msg);
    assert_null(m);
}

/* Sums the layout's bytes and checks each entry's name. */
static uint64_t
layout_bytes(const wrk_model *m, size_t want_n, const char *const *names)
{
    wrk_state_tensor lay[16];
    size_t n = wrk_model_state_layout(m, lay, 16);
    assert_int_equal(n, want_n);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(lay[i].name, names[i]);
        uint64_t e = 1;
        for (uint32_t k = 0; k < lay[i].ndim; k++)
            e *= (uint64_t)lay[i].shape[k];
        total += e * 4;
    }
    return total;
}

static void
test_maps(void **state)
{
    (void)state;
    static tset s;
    build(&s, false, true);
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    if (tset_load(&s, cfg_ok, &m, &d) != WK_OK)
        fail_msg("load: %s", d.msg);
    const wrk_model_info *in = wrk_model_info_get(m);
    assert_string_equal(in->family, "gdn");
    assert_string_equal(wrk_model_view_kind(m), "gdn");
    const wrk_gdn *g = wrk_model_view(m, "gdn");
    assert_non_null(g);
    assert_int_equal(g->n_layer, L);
    assert_int_equal(g->n_embd, C);
    assert_int_equal(g->n_head, H);
    assert_int_equal(g->head_k, K);
    assert_int_equal(g->n_v_head, HV);
    assert_int_equal(g->head_v, VH);
    assert_int_equal(g->conv, W);
    assert_int_equal(g->ffn_dim, F);
    assert_int_equal(g->vocab_size, V);
    assert_true(g->use_gate);
    assert_false(g->allow_neg_eigval);
    assert_false(g->tied);
    assert_int_equal(g->n_attn, 0);
    assert_true(g->norm_offset == 0.0f);
    assert_ptr_not_equal(g->head.t, g->emb);
    assert_non_null(g->layers[1].g_proj.t);
    assert_null(g->layers[0].moe);
    assert_int_equal(g->layers[1].mixer, WRK_MIXER_GDN);
    assert_int_equal(in->state_bytes, (uint64_t)L * ((W - 1) * (2 * KD + VD) + HV * K * VH) * 4);
    assert_int_equal(in->n_attn_layer, 0);
    assert_int_equal(in->kv_token_bytes, 0);
    static const char *const names[] = {"layers.0.q_conv", "layers.0.k_conv", "layers.0.v_conv",
                                        "layers.0.S",      "layers.1.q_conv", "layers.1.k_conv",
                                        "layers.1.v_conv", "layers.1.S"};
    assert_int_equal(layout_bytes(m, 8, names), in->state_bytes);
    wrk_model_free(m);
}

static void
test_hybrid(void **state)
{
    (void)state;
    static tset s;
    build(&s, true, true);
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    if (tset_load(&s, cfg_hybrid, &m, &d) != WK_OK)
        fail_msg("load: %s", d.msg);
    const wrk_model_info *in = wrk_model_info_get(m);
    const wrk_gdn *g = wrk_model_view(m, "gdn");
    assert_int_equal(g->n_attn, 1);
    assert_int_equal(g->attn_heads, HQ);
    assert_int_equal(g->attn_kv_heads, HKV);
    assert_int_equal(g->attn_head_dim, DA);
    assert_int_equal(g->layers[0].mixer, WRK_MIXER_GDN);
    assert_int_equal(g->layers[1].mixer, WRK_MIXER_ATTN);
    assert_null(g->layers[1].a_proj.t);
    assert_true(g->rope_theta == 10000.0);
    assert_int_equal(in->n_attn_layer, 1);
    assert_int_equal(in->kv_token_bytes, 1 * 2 * HKV * DA * 4);
    /* only the Gated DeltaNet layer holds recurrent state */
    assert_int_equal(in->state_bytes, (uint64_t)((W - 1) * (2 * KD + VD) + HV * K * VH) * 4);
    static const char *const names[] = {"layers.0.q_conv", "layers.0.k_conv", "layers.0.v_conv",
                                        "layers.0.S"};
    assert_int_equal(layout_bytes(m, 4, names), in->state_bytes);
    wrk_model_free(m);
}

static void
test_tied(void **state)
{
    (void)state;
    static tset s;
    build(&s, false, false);
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    /* no config.json: detected by names, the head tied (no lm_head.weight) */
    if (tset_load(&s, NULL, &m, &d) != WK_OK)
        fail_msg("load: %s", d.msg);
    const wrk_gdn *g = wrk_model_view(m, "gdn");
    assert_non_null(g);
    assert_true(g->tied);
    assert_ptr_equal(g->head.t, g->emb);
    wrk_model_free(m);
}

static void
test_refusals(void **state)
{
    (void)state;
    static tset s;
    build(&s, false, true);
    tset_drop(&s, "model.layers.1.attn.b_proj.weight");
    expect_refused(&s, cfg_ok, WK_EINVAL, "model.layers.1.attn.b_proj.weight: missing");

    build(&s, false, true);
    tset_reshape(&s, "model.layers.0.mlp.up_proj.weight", F + 1, C, 0);
    expect_refused(&s, cfg_ok, WK_EINVAL, "model.layers.0.mlp.up_proj.weight");

    build(&s, false, true);
    tset_drop(&s, "model.embeddings.weight");
    expect_refused(&s, cfg_ok, WK_EINVAL, "model.embeddings.weight: missing");

    build(&s, false, false);
    expect_refused(&s, cfg_ok, WK_EINVAL,
                   "lm_head.weight: missing (config.json tie_word_embeddings is false)");
    build(&s, false, true);
    expect_refused(&s, "{\"model_type\":\"gated_deltanet\",\"tie_word_embeddings\":true}",
                   WK_EINVAL,
                   "lm_head.weight: present but config.json tie_word_embeddings is true");
    expect_refused(&s, "{\"model_type\":\"gated_deltanet\",\"num_heads\":4,\"head_dim\":8}",
                   WK_EINVAL, "config.json: num_heads 4 x head_dim 8 does not match the 16 rows");
    expect_refused(&s, "{\"model_type\":\"gated_deltanet\",\"expand_v\":2}", WK_EINVAL,
                   "config.json: expand_v 2 x head_dim 8 does not match the value head size 8");
    expect_refused(&s, "{\"model_type\":\"gated_deltanet\",\"attn_mode\":\"parallel\"}", WK_ENOTSUP,
                   "attn_mode \"parallel\" is not supported");
    expect_refused(&s, "{\"model_type\":\"gated_deltanet\",\"use_short_conv\":false}", WK_ENOTSUP,
                   "use_short_conv false is not supported");
    expect_refused(&s, "{\"model_type\":\"gated_deltanet\",\"norm_eps\":0}", WK_EINVAL,
                   "norm_eps 0 outside (0, 1)");
    expect_refused(&s, "{\"model_type\":\"gated_deltanet\",\"intermediate_size\":33}", WK_EINVAL,
                   "config.json: intermediate_size is 33");
    expect_refused(&s, "{\"model_type\":\"gated_deltanet\",\"attnres_block_size\":4}", WK_ENOTSUP,
                   "attention residuals are not supported");

    /* hybrid configs */
    build(&s, true, true);
    expect_refused(&s, CFG_HEAD ",\"attn\":{\"layers\":[1],\"num_heads\":2,\"window_size\":64}}",
                   WK_ENOTSUP, "sliding-window attention is not supported");
    expect_refused(&s, CFG_HEAD ",\"attn\":{\"layers\":[0,1],\"num_heads\":2}}", WK_ENOTSUP,
                   "attn.layers lists every layer");
    expect_refused(&s, CFG_HEAD ",\"attn\":{\"layers\":[2],\"num_heads\":2}}", WK_EINVAL,
                   "attn.layers[0] is not a layer index in [0, 2)");
    expect_refused(&s, CFG_HEAD ",\"attn\":{\"layers\":[1]}}", WK_EINVAL,
                   "attn.num_heads is required");
    expect_refused(&s, CFG_HEAD ",\"attn\":{\"layers\":[1],\"num_heads\":2,\"sink\":1}}",
                   WK_ENOTSUP, "attn.sink is not supported");
    expect_refused(&s,
                   CFG_HEAD ",\"attn\":{\"layers\":[1],\"num_heads\":2,\"num_kv_heads\":1,"
                            "\"rope_theta\":0.5}}",
                   WK_EINVAL, "attn.rope_theta must be a number in (1, 1e12)");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_maps),
        cmocka_unit_test(test_hybrid),
        cmocka_unit_test(test_tied),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
