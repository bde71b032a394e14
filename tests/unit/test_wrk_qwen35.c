/*
 * test_wrk_qwen35: the Qwen3.5 family mapping (family/wrk_qwen35.c) onto the
 * Gated DeltaNet view, on tiny synthetic checkpoints (tset_synth.h) with
 * transformers' names: the fused projections become row views, the norms
 * take the (1 + weight) convention, the attention layer carries its output
 * gate and partial rotary; the multimodal layout (text_config,
 * model.language_model.*) skips the vision tower and the MTP layer; and the
 * refusals with their messages.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "qwen35_synth.h"
#include "tset_synth.h"
#include "wrk_gdn.h"
#include "wrk_model.h"

enum { C = Q35_C, L = Q35_L, F = Q35_F, V = Q35_V, HK = Q35_HK, HV = Q35_HV, DK = Q35_DK };
enum { KD = Q35_KD, VD = Q35_VD, W = Q35_W, HQ = Q35_HQ, HKV = Q35_HKV, DA = Q35_DA };
enum { QD = Q35_QD, KVD = Q35_KVD };
#define TEXT_CFG Q35_TEXT_CFG
#define KINDS Q35_KINDS
static const char *const cfg_ok = TEXT_CFG(KINDS);

/*
 * C 16, L 2 (linear, full), F 32, V 40; linear: 2 key heads and 4 value heads
 * of 4 (KD 8, VD 16), conv 4; attention: 2 query heads, 1 KV head of 8,
 * partial_rotary_factor 0.5 (4 rotary dims).
 */
/* cfg_ok with key set to the JSON text value (caller frees). */
static char *
cfg_with(const char *key, const char *value)
{
    json_t *c = json_loads(cfg_ok, 0, NULL);
    json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
    assert_non_null(c);
    assert_non_null(v);
    json_object_set_new(c, key, v);
    char *s = json_dumps(c, JSON_COMPACT);
    json_decref(c);
    return s;
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

static void
check_view(const wrk_model *m)
{
    const wrk_model_info *in = wrk_model_info_get(m);
    assert_string_equal(in->family, "qwen3_5");
    assert_string_equal(wrk_model_view_kind(m), "gdn");
    const wrk_gdn *g = wrk_model_view(m, "gdn");
    assert_non_null(g);
    assert_int_equal(g->n_layer, L);
    assert_int_equal(g->n_embd, C);
    assert_int_equal(g->n_head, HK);
    assert_int_equal(g->head_k, DK);
    assert_int_equal(g->n_v_head, HV);
    assert_int_equal(g->head_v, DK);
    assert_int_equal(g->conv, W);
    assert_int_equal(g->ffn_dim, F);
    assert_int_equal(g->vocab_size, V);
    assert_true(g->use_gate);
    assert_false(g->tied);
    assert_int_equal(g->n_attn, 1);
    assert_int_equal(g->attn_heads, HQ);
    assert_int_equal(g->attn_kv_heads, HKV);
    assert_int_equal(g->attn_head_dim, DA);
    assert_true(g->attn_gate);
    assert_true(g->qk_norm);
    assert_int_equal(g->rope_dim, DA / 2);
    assert_true(g->rope_theta == 1000000.0);
    assert_true(g->norm_offset == 1.0f);
    assert_int_equal(g->layers[0].mixer, WRK_MIXER_GDN);
    assert_int_equal(g->layers[1].mixer, WRK_MIXER_ATTN);
    /* in_proj_qkv split into row views of q, k and v */
    assert_non_null(g->layers[0].q_proj.t);
    assert_non_null(g->layers[0].v_proj.t);
    assert_int_equal(g->layers[0].q_proj.t->shape[0], KD);
    assert_int_equal(g->layers[0].k_proj.t->shape[0], KD);
    assert_int_equal(g->layers[0].v_proj.t->shape[0], VD);
    assert_int_equal(in->n_attn_layer, 1);
    assert_int_equal(in->kv_token_bytes, 1 * 2 * HKV * DA * 4);
    assert_int_equal(in->state_bytes, (uint64_t)((W - 1) * (2 * KD + VD) + HV * DK * DK) * 4);
    wrk_state_tensor lay[8];
    size_t n = wrk_model_state_layout(m, lay, 8);
    assert_int_equal(n, 4);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        assert_non_null(strstr(lay[i].name, "layers.0."));
        uint64_t e = 1;
        for (uint32_t k = 0; k < lay[i].ndim; k++)
            e *= (uint64_t)lay[i].shape[k];
        total += e * 4;
    }
    assert_int_equal(total, in->state_bytes);
}

static void
test_text_maps(void **state)
{
    (void)state;
    static tset s;
    qwen35_synth_build(&s, "model.", true, false);
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    if (tset_load(&s, cfg_ok, &m, &d) != WK_OK)
        fail_msg("load: %s", d.msg);
    check_view(m);
    assert_int_equal(wrk_model_info_get(m)->n_skipped, 0);
    wrk_model_free(m);
    /* full_attention_interval instead of layer_types: every 2nd layer is attention */
    if (tset_load(&s, TEXT_CFG(",\"full_attention_interval\":2"), &m, &d) != WK_OK)
        fail_msg("load (interval): %s", d.msg);
    check_view(m);
    wrk_model_free(m);
}

static void
test_multimodal_skips(void **state)
{
    (void)state;
    static tset s;
    qwen35_synth_build(&s, "model.language_model.", true, true);
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    static const char cfg[] = "{\"model_type\":\"qwen3_5\",\"text_config\":" TEXT_CFG(
        KINDS) ",\"vision_config\":{\"model_type\":\"qwen3_5_vision\",\"depth\":1},"
               "\"tie_word_embeddings\":false}";
    if (tset_load(&s, cfg, &m, &d) != WK_OK)
        fail_msg("load: %s", d.msg);
    check_view(m);
    assert_int_equal(wrk_model_info_get(m)->n_skipped, 4);
    wrk_model_free(m);
}

static void
test_refusals(void **state)
{
    (void)state;
    static tset s;
    qwen35_synth_build(&s, "model.", true, false);
    expect_refused(&s, NULL, WK_EINVAL, "config.json: missing (a Qwen3.5 model needs it)");
    static const struct {
        const char *key, *value;
        wk_err err;
        const char *want;
    } cases[] = {
        {"hidden_act", "\"gelu\"", WK_ENOTSUP, "hidden_act \"gelu\" is not supported (silu only)"},
        {"attention_bias", "true", WK_ENOTSUP, "attention_bias true is not supported"},
        {"layer_types", "[\"linear_attention\",\"sliding_attention\"]", WK_ENOTSUP,
         "layer_types[1] \"sliding_attention\" is not supported"},
        {"layer_types", "[\"full_attention\",\"full_attention\"]", WK_ENOTSUP,
         "no linear_attention layer"},
        {"layer_types", "[\"linear_attention\"]", WK_EINVAL,
         "layer_types must be an array of num_hidden_layers (2) strings"},
        {"rms_norm_eps", "0", WK_EINVAL, "rms_norm_eps 0 not in (0, 1]"},
        {"linear_num_value_heads", "3", WK_EINVAL,
         "linear_num_value_heads 3 is not a multiple of linear_num_key_heads 2"},
        {"num_key_value_heads", "3", WK_EINVAL,
         "num_attention_heads 2 is not a multiple of num_key_value_heads 3"},
        {"rope_parameters", "{\"rope_type\":\"default\",\"partial_rotary_factor\":0.1}", WK_ENOTSUP,
         "head_dim 8 x partial_rotary_factor 0.1 gives 0 rotary dims"},
        {"rope_parameters", "{\"rope_type\":\"yarn\"}", WK_ENOTSUP, "yarn"},
        {"hidden_size", "17", WK_EINVAL,
         "config.json: hidden_size is 17 but model.embed_tokens.weight has 16 columns"},
        {"tie_word_embeddings", "true", WK_OK, NULL}, /* a stored lm_head is skipped when tied */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *c = cfg_with(cases[i].key, cases[i].value);
        if (cases[i].err != WK_OK) {
            expect_refused(&s, c, cases[i].err, cases[i].want);
        } else {
            wk_diag d = {{0}};
            wrk_model *m = NULL;
            if (tset_load(&s, c, &m, &d) != WK_OK)
                fail_msg("%s %s: %s", cases[i].key, cases[i].value, d.msg);
            const wrk_gdn *g = wrk_model_view(m, "gdn");
            assert_true(g->tied);
            assert_ptr_equal(g->head.t, g->emb);
            assert_int_equal(wrk_model_info_get(m)->n_skipped, 1);
            wrk_model_free(m);
        }
        free(c);
    }

    qwen35_synth_build(&s, "model.", true, false);
    tset_drop(&s, "model.layers.0.linear_attn.in_proj_z.weight");
    expect_refused(&s, cfg_ok, WK_EINVAL, "model.layers.0.linear_attn.in_proj_z.weight: missing");
    qwen35_synth_build(&s, "model.", true, false);
    tset_drop(&s, "model.layers.1.self_attn.k_norm.weight");
    expect_refused(&s, cfg_ok, WK_EINVAL, "model.layers.1.self_attn.k_norm.weight");
    qwen35_synth_build(&s, "model.", true, false);
    tset_reshape(&s, "model.layers.0.linear_attn.in_proj_qkv.weight", 2 * KD + VD + 1, C, 0);
    expect_refused(&s, cfg_ok, WK_EINVAL, "model.layers.0.linear_attn.in_proj_qkv.weight");
    qwen35_synth_build(&s, "model.", false, false);
    expect_refused(&s, cfg_ok, WK_EINVAL, "lm_head.weight");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_maps),
        cmocka_unit_test(test_multimodal_skips),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
