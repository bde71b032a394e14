/*
 * test_wrk_mamba2: the Mamba2 family mapping (family/wrk_mamba2.c) on tiny
 * synthetic checkpoints (tset_synth.h): both naming conventions map onto the
 * view with every dimension read from the shapes (n_groups from
 * config.json), the slot layout tiles state_bytes, and every refusal names
 * the tensor or the config key.
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
#include "wrk_mamba2.h"
#include "wrk_model.h"
#include "wrk_rwkv7.h"

/* C 16, expand 2 (d_inner 32), head_dim 8 (H 4), G 2, N 8, K 4, V 40, L 2 */
enum { C = 16, DI = 32, H = 4, P = 8, G = 2, N = 8, K = 4, V = 40, L = 2 };
#define CONV_DIM (DI + 2 * G * N)          /* 64 */
#define D_IN_PROJ (2 * DI + 2 * G * N + H) /* 100 */

static const char *const cfg_ok =
    "{\"model_type\":\"mamba2\",\"hidden_size\":16,\"num_hidden_layers\":2,\"state_size\":8,"
    "\"head_dim\":8,\"num_heads\":4,\"conv_kernel\":4,\"n_groups\":2,\"expand\":2,"
    "\"vocab_size\":40,\"layer_norm_epsilon\":1e-5,\"tie_word_embeddings\":false}";

static void
build(tset *s, bool ssm_names, bool head)
{
    memset(s, 0, sizeof(*s));
    tset_add(s, ssm_names ? "backbone.embedding.weight" : "backbone.embeddings.weight", V, C, 0);
    for (int l = 0; l < L; l++) {
        char n[128];
#define ADD(suf, a, b, c)                                                                          \
    do {                                                                                           \
        snprintf(n, sizeof(n), "backbone.layers.%d.%s", l, suf);                                   \
        tset_add(s, n, a, b, c);                                                                   \
    } while (0)
        ADD("norm.weight", C, 0, 0);
        ADD("mixer.in_proj.weight", D_IN_PROJ, C, 0);
        ADD("mixer.conv1d.weight", CONV_DIM, 1, K);
        ADD("mixer.conv1d.bias", CONV_DIM, 0, 0);
        ADD("mixer.dt_bias", H, 0, 0);
        ADD("mixer.A_log", H, 0, 0);
        ADD("mixer.D", H, 0, 0);
        ADD("mixer.norm.weight", DI, 0, 0);
        ADD("mixer.out_proj.weight", C, DI, 0);
#undef ADD
    }
    tset_add(s, "backbone.norm_f.weight", C, 0, 0);
    if (head)
        tset_add(s, "lm_head.weight", V, C, 0);
}

/* Expects s + config to be refused with err and a diag holding want. */
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
test_hf_maps(void **state)
{
    (void)state;
    static tset s;
    build(&s, false, true);
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    if (tset_load(&s, cfg_ok, &m, &d) != WK_OK)
        fail_msg("load: %s", d.msg);
    const wrk_model_info *in = wrk_model_info_get(m);
    assert_string_equal(in->family, "mamba2");
    assert_string_equal(wrk_model_view_kind(m), "mamba2");
    assert_null(wrk_model_rwkv7(m));
    const wrk_mamba2 *v = wrk_model_view(m, "mamba2");
    assert_non_null(v);
    assert_int_equal(v->convention, WRK_MAMBA2_HF);
    assert_int_equal(v->n_layer, L);
    assert_int_equal(v->d_model, C);
    assert_int_equal(v->d_inner, DI);
    assert_int_equal(v->n_head, H);
    assert_int_equal(v->head_dim, P);
    assert_int_equal(v->n_groups, G);
    assert_int_equal(v->d_state, N);
    assert_int_equal(v->d_conv, K);
    assert_int_equal(v->conv_dim, CONV_DIM);
    assert_int_equal(v->d_in_proj, D_IN_PROJ);
    assert_int_equal(v->vocab_size, V);
    assert_true(v->eps > 0.99e-5 && v->eps < 1.01e-5);
    assert_non_null(v->lm_head.t);
    assert_ptr_not_equal(v->lm_head.t, v->emb);
    assert_non_null(v->layers[1].conv_b);
    assert_int_equal(in->n_layer, L);
    assert_int_equal(in->n_embd, C);
    assert_int_equal(in->n_head, H);
    assert_int_equal(in->head_size, P);
    assert_int_equal(in->ffn_dim, 0);
    assert_int_equal(in->vocab_size, V);
    assert_int_equal(in->state_bytes, (uint64_t)L * (CONV_DIM * (K - 1) + H * P * N) * 4);
    assert_int_equal(in->n_attn_layer, 0);
    assert_int_equal(in->kv_token_bytes, 0);
    /* the slot layout: conv then ssm per layer, tiling state_bytes */
    wrk_state_tensor lay[8];
    size_t n = wrk_model_state_layout(m, lay, 8);
    assert_int_equal(n, 2 * L);
    assert_string_equal(lay[0].name, "layers.0.conv");
    assert_int_equal(lay[0].shape[0], CONV_DIM);
    assert_int_equal(lay[0].shape[1], K - 1);
    assert_string_equal(lay[3].name, "layers.1.ssm");
    assert_int_equal(lay[3].ndim, 3);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t e = 1;
        for (uint32_t k = 0; k < lay[i].ndim; k++)
            e *= (uint64_t)lay[i].shape[k];
        total += e * 4;
    }
    assert_int_equal(total, in->state_bytes);
    /* the layer list the backends run: a MAMBA2 mixer per layer, the same slot bytes */
    wrk_gdn *g = NULL;
    assert_int_equal(wrk_mamba2_layer_list(v, &g, &d), WK_OK);
    assert_int_equal(g->n_layer, L);
    assert_int_equal(g->n_m2, L);
    assert_int_equal(g->m2_heads * g->m2_head_dim, DI);
    assert_int_equal(g->m2_groups, G);
    assert_int_equal(g->m2_state, N);
    assert_int_equal(g->m2_conv, K);
    assert_false(g->tied);
    assert_ptr_equal(g->head.t, v->lm_head.t);
    assert_ptr_equal(g->norm, v->norm_f);
    assert_true(g->norm_eps == v->eps);
    for (uint32_t l = 0; l < L; l++) {
        assert_int_equal(g->layers[l].mixer, WRK_MIXER_MAMBA2);
        assert_int_equal(g->layers[l].mlp, WRK_MLP_NONE);
        assert_ptr_equal(g->layers[l].attn_norm, v->layers[l].norm);
        assert_ptr_equal(g->layers[l].m2.in_proj.t, v->layers[l].in_proj.t);
        assert_int_equal(wrk_gdn_layer_floats(g, l) * 4, in->state_bytes / L);
    }
    assert_int_equal(wrk_gdn_state_bytes(g), in->state_bytes);
    assert_int_equal(wrk_gdn_kv_token_bytes(g), 0);
    free(g);
    wrk_model_free(m);
}

static void
test_ssm_tied_no_config(void **state)
{
    (void)state;
    /* mamba_ssm names, no config.json: detected by names, head tied, n_groups 1 */
    static tset s;
    build(&s, true, false);
    /* with n_groups 1 the same in_proj holds d_inner + 2 N conv channels */
    for (int l = 0; l < L; l++) {
        char n[128];
        snprintf(n, sizeof(n), "backbone.layers.%d.mixer.in_proj.weight", l);
        tset_reshape(&s, n, 2 * DI + 2 * N + H, C, 0);
        snprintf(n, sizeof(n), "backbone.layers.%d.mixer.conv1d.weight", l);
        tset_reshape(&s, n, DI + 2 * N, 1, K);
        snprintf(n, sizeof(n), "backbone.layers.%d.mixer.conv1d.bias", l);
        tset_reshape(&s, n, DI + 2 * N, 0, 0);
    }
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    if (tset_load(&s, NULL, &m, &d) != WK_OK)
        fail_msg("load: %s", d.msg);
    const wrk_mamba2 *v = wrk_model_view(m, "mamba2");
    assert_non_null(v);
    assert_int_equal(v->convention, WRK_MAMBA2_SSM);
    assert_int_equal(v->n_groups, 1);
    assert_int_equal(v->conv_dim, DI + 2 * N);
    assert_null(v->lm_head.t);
    wrk_model_free(m);
}

static void
test_refusals(void **state)
{
    (void)state;
    static tset s;
    build(&s, false, true);
    tset_drop(&s, "backbone.layers.1.mixer.out_proj.weight");
    expect_refused(&s, cfg_ok, WK_EINVAL, "backbone.layers.1.mixer.out_proj.weight: missing");

    build(&s, false, true);
    tset_reshape(&s, "backbone.layers.0.mixer.A_log", H + 1, 0, 0);
    expect_refused(&s, cfg_ok, WK_EINVAL, "backbone.layers.0.mixer.A_log");

    build(&s, false, true);
    tset_add(&s, "backbone.embedding.weight", V, C, 0);
    expect_refused(&s, cfg_ok, WK_EINVAL, "both naming conventions in one checkpoint");

    build(&s, false, false);
    expect_refused(&s, cfg_ok, WK_EINVAL,
                   "lm_head.weight: missing (config.json tie_word_embeddings is false)");

    build(&s, false, true);
    expect_refused(&s, "{\"model_type\":\"mamba2\",\"hidden_size\":17,\"n_groups\":2}", WK_EINVAL,
                   "config.json: hidden_size is 17 but the tensors give d_model = 16");
    expect_refused(&s, "{\"model_type\":\"mamba2\",\"n_groups\":2,\"expand\":3}", WK_EINVAL,
                   "config.json: expand 3 * d_model 16 != d_inner 32");
    expect_refused(&s, "{\"model_type\":\"mamba2\",\"n_groups\":2,\"norm_before_gate\":true}",
                   WK_EINVAL, "norm_before_gate is true");
    expect_refused(&s, "{\"model_type\":\"mamba2\",\"n_groups\":2,\"use_bias\":true}", WK_EINVAL,
                   "use_bias is true; in_proj / out_proj biases are not supported");
    expect_refused(&s, "{\"model_type\":\"mamba2\",\"n_groups\":2,\"hidden_act\":\"gelu\"}",
                   WK_EINVAL, "hidden_act \"gelu\" is not supported (silu)");
    expect_refused(&s, "{\"model_type\":\"mamba2\",\"n_groups\":2,\"time_step_limit\":[0.0,0.1]}",
                   WK_EINVAL, "time_step_limit other than [0, inf] is not supported");
    expect_refused(&s, "{\"model_type\":\"mamba2\",\"n_groups\":2,\"layer_norm_epsilon\":2}",
                   WK_EINVAL, "layer_norm_epsilon 2 out of (0, 1)");
    expect_refused(&s, "{\"model_type\":\"mamba2\",\"n_groups\":2,\"vocab_size\":41}", WK_EINVAL,
                   "vocab_size 41 is more than the 40 rows of backbone.embeddings.weight");
    /* an unknown tensor is refused by wrk_model, by name */
    build(&s, false, true);
    tset_add(&s, "backbone.layers.0.mixer.extra", 4, 0, 0);
    expect_refused(&s, cfg_ok, WK_EINVAL, "backbone.layers.0.mixer.extra");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_maps),
        cmocka_unit_test(test_ssm_tied_no_config),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
