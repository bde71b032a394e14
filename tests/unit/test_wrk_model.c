/*
 * test_wrk_model: loading RWKV-7 model directories. Both naming conventions
 * must load to the same model at head size 64 (same digest, bit-identical
 * logits; at other head sizes their GroupNorm epsilons differ); an HF head
 * tied to the embedding loads, and the epsilons follow the convention; every
 * malformed checkpoint must be refused with a diag naming the tensor; the
 * checkpoint-finding rules and the fingerprint inputs are checked; the
 * nemotron_h family's config refusals.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "be.h"
#include "be_cpu_kernels.h"
#include "rwkv7_synth.h"
#include "wrk_gdn.h"
#include "wrk_model.h"
#include "wrk_rwkv7.h"

static const int32_t test_tokens[] = {5, 17, 0, 96, 42, 42, 7, 1, 88, 3, 60, 11, 2};
#define N_TEST_TOKENS (sizeof(test_tokens) / sizeof(test_tokens[0]))

/* Loads dir and returns the logits of every position of test_tokens. */
static float *
logits_of(const char *dir, const wrk_model_opts *opts, wrk_model_info *info_out)
{
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    wk_err e = wrk_model_load(dir, opts, &m, &d);
    if (e != WK_OK)
        fail_msg("load %s: %s", dir, d.msg);
    const wrk_model_info *in = wrk_model_info_get(m);
    if (info_out != NULL)
        *info_out = *in;
    be_config bc = {.n_slots = 2, .n_threads = 1};
    be_ctx *ctx = NULL;
    assert_int_equal(be_cpu_ops.open(&bc, m, &ctx, &d), WK_OK);
    float *out = malloc(sizeof(float) * in->vocab_size * N_TEST_TOKENS);
    be_row row = {.slot = 1, .tokens = test_tokens, .n_tokens = N_TEST_TOKENS,
                  .logits_mode = BE_LOGITS_ALL, .logits = out};
    assert_int_equal(be_cpu_ops.step(ctx, &row, 1, &d), WK_OK);
    be_cpu_ops.close(ctx);
    wrk_model_free(m);
    return out;
}

/* Expects loading cfg to fail with err and a diag containing each of the strings. */
static void
expect_refused(const synth_cfg *cfg, wk_err err, const char *s1, const char *s2)
{
    char dir[256];
    synth_tmpdir(dir, sizeof(dir), "model");
    assert_int_equal(synth_write(dir, cfg), 0);
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    wk_err e = wrk_model_load(dir, NULL, &m, &d);
    if (e != err || (s1 && !strstr(d.msg, s1)) || (s2 && !strstr(d.msg, s2)))
        fail_msg("expected %s with '%s' '%s', got %s: %s", wk_err_name(err), s1 ? s1 : "",
                 s2 ? s2 : "", wk_err_name(e), d.msg);
    assert_null(m);
    synth_rmdir(dir);
}

static void
test_conventions_identical(void **state)
{
    (void)state;
    char dh[256], db[256];
    wrk_model_info ih, ib;
    synth_tmpdir(dh, sizeof(dh), "hf");
    synth_tmpdir(db, sizeof(db), "blink");
    synth_cfg c = synth_default();
    c.L = 3;
    c.N = 64; /* GroupNorm eps: BlinkDL 64e-5, HF N * 1e-5: the same only at N = 64 */
    c.hf = true;
    assert_int_equal(synth_write(dh, &c), 0);
    c.hf = false;
    c.layer0_v = true; /* BlinkDL checkpoints carry an unused value LoRA on layer 0 */
    assert_int_equal(synth_write(db, &c), 0);

    float *lh = logits_of(dh, NULL, &ih);
    float *lb = logits_of(db, NULL, &ib);
    assert_memory_equal(lh, lb, sizeof(float) * ih.vocab_size * N_TEST_TOKENS);
    assert_string_equal(ih.family, "rwkv7");
    assert_int_equal(ih.n_layer, 3);
    assert_int_equal(ih.n_embd, 64);
    assert_int_equal(ih.n_head, 1);
    assert_int_equal(ih.head_size, 64);
    assert_int_equal(ih.ffn_dim, 128);
    assert_int_equal(ih.vocab_size, 300);
    assert_int_equal(ih.dtype, WK_DTYPE_BF16);
    assert_int_equal(ih.state_bytes, 3ull * (2 * 64 + 1 * 64 * 64) * 4);
    assert_int_equal(ih.n_params, ib.n_params);
    assert_int_equal(ih.weight_bytes, ih.n_params * 2);
    /* canonical digest: independent of the naming convention */
    assert_string_equal(ih.weights_digest, ib.weights_digest);
    assert_string_equal(ih.fingerprint, ib.fingerprint);
    assert_int_equal(strlen(ih.vocab_digest), 64);
    for (size_t i = 0; i < ih.vocab_size * N_TEST_TOKENS; i++)
        assert_true(lh[i] == lh[i]); /* no NaN */

    /* n_params by hand: emb + head + 4 LN vectors + per layer */
    uint64_t C = 64, F = 128, V = 300, H = 1, N = 64;
    uint64_t per = 4 * C /* ln1, ln2 */ + 6 * C /* mixes */ + 2 * C /* w0, a0 */ +
                   2 * C /* k_k, k_a */ + H * N /* r_k */ + 4 * C * C /* r k v o */ +
                   2 * C /* ln_x */ + C /* ffn x_k */ + 2 * C * F + 2 * C * (8 + 12 + 16);
    uint64_t expect = 2 * V * C + 4 * C + 3 * per + 2 * (2 * C * 6 + C) /* v LoRA, layers 1, 2 */;
    assert_int_equal(ih.n_params, expect);

    /* fp32: same digest, other dtype, other fingerprint, same math up to rounding */
    wrk_model_opts o32 = {.fp32 = true};
    wrk_model_info i32;
    float *l32 = logits_of(dh, &o32, &i32);
    assert_int_equal(i32.dtype, WK_DTYPE_F32);
    assert_int_equal(i32.weight_bytes, ih.n_params * 4);
    assert_string_equal(i32.weights_digest, ih.weights_digest);
    assert_string_not_equal(i32.fingerprint, ih.fingerprint);
    for (size_t i = 0; i < ih.vocab_size * N_TEST_TOKENS; i++)
        assert_float_equal(l32[i], lh[i], 1e-4);

    /*
     * --quantize q8_0: same digest (of the stored weights), dtype Q8_0, a
     * fingerprint of its own (a state made under Q8_0 never loads into the
     * BF16 or F32 model, nor the reverse), fewer bytes; both conventions
     * quantize the same canonical values along k, so the same logits.
     */
    wrk_model_opts oq = {.quantize_q8_0 = true};
    wrk_model_info iqh, iqb;
    float *lqh = logits_of(dh, &oq, &iqh);
    float *lqb = logits_of(db, &oq, &iqb);
    assert_int_equal(iqh.dtype, WK_DTYPE_Q8_0);
    assert_string_equal(iqh.weights_digest, ih.weights_digest);
    assert_string_not_equal(iqh.fingerprint, ih.fingerprint);
    assert_string_not_equal(iqh.fingerprint, i32.fingerprint);
    assert_string_equal(iqh.fingerprint, iqb.fingerprint);
    assert_true(iqh.weight_bytes < ih.weight_bytes);
    assert_memory_equal(lqh, lqb, sizeof(float) * ih.vocab_size * N_TEST_TOKENS);
    bool differs = false;
    for (size_t i = 0; i < ih.vocab_size * N_TEST_TOKENS; i++) {
        assert_float_equal(lqh[i], lh[i], 0.1);
        differs |= lqh[i] != lh[i];
    }
    assert_true(differs);
    wrk_model_opts both = {.fp32 = true, .quantize_q8_0 = true};
    wrk_model *mb = NULL;
    wk_diag dg = {{0}};
    assert_int_equal(wrk_model_load(dh, &both, &mb, &dg), WK_EINVAL);
    assert_non_null(strstr(dg.msg, "--quantize q8_0"));

    /*
     * --cpu-matmul bf16: same digest and dtype, a fingerprint of its own per
     * engine (a state made in one numeric mode never loads into another);
     * only for weights kept in BF16. With an engine here (AMX tiles, else
     * AVX512-BF16 dot products): logits close to the fp32 mode's but not
     * equal; an engine the CPU lacks: the CPU backend refuses to open.
     */
    const be_cpu_matmul eng = be_cpu_bf16_engine();
    wrk_model_opts om = {.matmul_bf16 = true, .matmul_dp = eng == BE_CPU_MATMUL_BF16_DP};
    wrk_model *mm = NULL;
    assert_int_equal(wrk_model_load(dh, &om, &mm, &dg), WK_OK);
    const wrk_model_info *im = wrk_model_info_get(mm);
    assert_int_equal(im->dtype, WK_DTYPE_BF16);
    assert_true(im->matmul_bf16);
    assert_true(im->matmul_dp == om.matmul_dp);
    assert_string_equal(im->weights_digest, ih.weights_digest);
    assert_string_not_equal(im->fingerprint, ih.fingerprint);
    assert_string_not_equal(im->fingerprint, i32.fingerprint);
    assert_string_not_equal(im->fingerprint, iqh.fingerprint);
    for (int dp = 0; dp < 2; dp++) {
        wrk_model_opts oe = {.matmul_bf16 = true, .matmul_dp = dp == 1};
        wrk_model *me = NULL;
        assert_int_equal(wrk_model_load(dh, &oe, &me, &dg), WK_OK);
        const wrk_model_info *ie = wrk_model_info_get(me);
        if (oe.matmul_dp != om.matmul_dp) /* the other engine */
            assert_string_not_equal(ie->fingerprint, im->fingerprint);
        assert_string_not_equal(ie->fingerprint, ih.fingerprint);
        if (dp ? !be_cpu_dp_enable() : !be_cpu_amx_enable()) {
            be_config bc = {.n_slots = 2, .n_threads = 1};
            be_ctx *ctx = NULL;
            assert_int_equal(be_cpu_ops.open(&bc, me, &ctx, &dg), WK_ENOTSUP);
            assert_non_null(strstr(dg.msg, dp ? "AVX512-BF16" : "AMX"));
        }
        wrk_model_free(me);
    }
    if (eng != BE_CPU_MATMUL_FP32) {
        char fp[sizeof(im->fingerprint)];
        memcpy(fp, im->fingerprint, sizeof(fp));
        wrk_model_free(mm);
        wrk_model_info imb;
        float *lm = logits_of(db, &om, &imb); /* the other naming convention: same fingerprint */
        assert_string_equal(imb.fingerprint, fp);
        differs = false;
        for (size_t i = 0; i < ih.vocab_size * N_TEST_TOKENS; i++) {
            assert_float_equal(lm[i], lh[i], 0.05);
            differs |= lm[i] != lh[i];
        }
        assert_true(differs);
        free(lm);
    } else {
        wrk_model_free(mm);
    }
    for (int i = 0; i < 2; i++) {
        wrk_model_opts bad = {.matmul_bf16 = true, .fp32 = i == 0, .quantize_q8_0 = i == 1};
        assert_int_equal(wrk_model_load(dh, &bad, &mb, &dg), WK_EINVAL);
        assert_non_null(strstr(dg.msg, "--cpu-matmul bf16"));
    }
    free(lqh);
    free(lqb);
    free(l32);
    free(lh);
    free(lb);
    synth_rmdir(dh);
    synth_rmdir(db);
}

/* Writes dir/config.json with body json. */
static void
write_config(const char *dir, const char *json)
{
    char p[300];
    snprintf(p, sizeof(p), "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
}

/* Expects loading dir to fail with WK_EINVAL and a diag containing s. */
static void
expect_dir_refused(const char *dir, const char *s)
{
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    wk_err e = wrk_model_load(dir, NULL, &m, &d);
    if (e != WK_EINVAL || strstr(d.msg, s) == NULL)
        fail_msg("expected WK_EINVAL with '%s', got %s: %s", s, wk_err_name(e), d.msg);
    assert_null(m);
}

static void
test_tied_head(void **state)
{
    (void)state;
    char dt[256], du[256];
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    wrk_model_info it, iu;
    synth_cfg c = synth_default(); /* HF names */

    /* tie_word_embeddings: no lm_head.weight, the head is the embedding */
    synth_tmpdir(dt, sizeof(dt), "tied");
    c.drop = "lm_head.weight";
    assert_int_equal(synth_write(dt, &c), 0);
    write_config(dt, "{\"model_type\": \"rwkv7\", \"tie_word_embeddings\": true}");
    if (wrk_model_load(dt, NULL, &m, &d) != WK_OK)
        fail_msg("tied: %s", d.msg);
    const wrk_rwkv7 *r = wrk_model_rwkv7(m);
    assert_true(r->tied);
    assert_ptr_equal(r->head.t, r->emb);
    assert_int_equal(r->head.n_in, 64);
    assert_int_equal(r->head.n_out, 300);
    wrk_model_free(m);
    /* fp32: the head follows the converted embedding */
    wrk_model_opts o32 = {.fp32 = true};
    m = NULL;
    assert_int_equal(wrk_model_load(dt, &o32, &m, &d), WK_OK);
    r = wrk_model_rwkv7(m);
    assert_ptr_equal(r->head.t, r->emb);
    assert_int_equal(r->emb->dtype, WK_DTYPE_F32);
    /* the layer list the backends run: time + channel mix per layer, LayerNorms, same slot */
    wrk_gdn *g = NULL;
    assert_int_equal(wrk_rwkv7_layer_list(r, &g, &d), WK_OK);
    assert_int_equal(g->n_layer, r->n_layer);
    assert_true(g->layer_norm);
    assert_ptr_equal(g->head.t, r->emb);
    assert_ptr_equal(g->emb_norm, r->ln0_w);
    assert_ptr_equal(g->emb_norm_b, r->ln0_b);
    assert_ptr_equal(g->norm, r->lnout_w);
    assert_ptr_equal(g->norm_b, r->lnout_b);
    assert_true(g->norm_eps == r->ln_eps);
    assert_int_equal(g->ffn_dim, r->ffn_dim);
    for (uint32_t l = 0; l < g->n_layer; l++) {
        assert_int_equal(g->layers[l].mixer, WRK_MIXER_RWKV7);
        assert_int_equal(g->layers[l].mlp, WRK_MLP_RWKV7);
        assert_ptr_equal(g->layers[l].attn_norm_b, r->layers[l].ln1_b);
        assert_ptr_equal(g->layers[l].mlp_norm, r->layers[l].ln2_w);
        assert_ptr_equal(g->layers[l].rw, &r->layers[l]);
    }
    assert_int_equal(wrk_gdn_state_bytes(g), wrk_model_info_get(m)->state_bytes);
    free(g);
    wrk_model_free(m);
    float *lt = logits_of(dt, NULL, &it);
    float *lt32 = logits_of(dt, &o32, NULL);
    for (size_t i = 0; i < it.vocab_size * N_TEST_TOKENS; i++)
        assert_float_equal(lt32[i], lt[i], 1e-4);

    /* the untied checkpoint: one [V, C] matrix more, other digest and logits */
    synth_tmpdir(du, sizeof(du), "untied");
    c.drop = NULL;
    assert_int_equal(synth_write(du, &c), 0);
    float *lu = logits_of(du, NULL, &iu);
    assert_int_equal(iu.n_params, it.n_params + 300 * 64);
    assert_string_not_equal(iu.weights_digest, it.weights_digest);
    assert_string_not_equal(iu.fingerprint, it.fingerprint);
    assert_memory_not_equal(lu, lt, sizeof(float) * it.vocab_size * N_TEST_TOKENS);

    /* config.json and the tensors must agree */
    write_config(dt, "{\"model_type\": \"rwkv7\", \"tie_word_embeddings\": false}");
    expect_dir_refused(dt, "lm_head.weight: missing (config.json tie_word_embeddings is false)");
    write_config(du, "{\"model_type\": \"rwkv7\", \"tie_word_embeddings\": true}");
    expect_dir_refused(du, "lm_head.weight: present but config.json tie_word_embeddings is true");
    write_config(du, "{\"model_type\": \"rwkv7\", \"tie_word_embeddings\": 1}");
    expect_dir_refused(du, "tie_word_embeddings must be true or false");
    free(lt);
    free(lt32);
    free(lu);
    synth_rmdir(dt);
    synth_rmdir(du);
}

static void
test_norm_eps(void **state)
{
    (void)state;
    char db[256], dh[256];
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    wrk_model_info ia, ib;

    /* BlinkDL: GroupNorm 64e-5 at any head size (here 16), LayerNorm 1e-5 */
    synth_cfg c = synth_default();
    c.hf = false;
    synth_tmpdir(db, sizeof(db), "blink");
    assert_int_equal(synth_write(db, &c), 0);
    assert_int_equal(wrk_model_load(db, NULL, &m, &d), WK_OK);
    assert_true(wrk_model_rwkv7(m)->gn_eps == 64e-5);
    assert_true(wrk_model_rwkv7(m)->ln_eps == 1e-5);
    wrk_model_free(m);

    /* HF: LayerNorms norm_eps (default 1e-5), g_norm head_dim * norm_eps */
    c = synth_default();
    synth_tmpdir(dh, sizeof(dh), "hf");
    assert_int_equal(synth_write(dh, &c), 0);
    m = NULL;
    assert_int_equal(wrk_model_load(dh, NULL, &m, &d), WK_OK);
    assert_true(wrk_model_rwkv7(m)->ln_eps == 1e-5);
    assert_true(wrk_model_rwkv7(m)->gn_eps == 16 * 1e-5);
    wrk_model_free(m);
    float *la = logits_of(dh, NULL, &ia);
    write_config(dh, "{\"model_type\": \"rwkv7\", \"norm_eps\": 0.001}");
    m = NULL;
    assert_int_equal(wrk_model_load(dh, NULL, &m, &d), WK_OK);
    assert_true(wrk_model_rwkv7(m)->ln_eps == 0.001);
    assert_true(wrk_model_rwkv7(m)->gn_eps == 16 * 0.001);
    wrk_model_free(m);
    /* the backend uses them: other logits, other fingerprint, same weights */
    float *lb = logits_of(dh, NULL, &ib);
    assert_memory_not_equal(la, lb, sizeof(float) * ia.vocab_size * N_TEST_TOKENS);
    assert_string_equal(ia.weights_digest, ib.weights_digest);
    assert_string_not_equal(ia.fingerprint, ib.fingerprint);
    write_config(dh, "{\"model_type\": \"rwkv7\", \"norm_eps\": 0}");
    expect_dir_refused(dh, "norm_eps 0 outside (0, 1)");
    free(la);
    free(lb);
    synth_rmdir(db);
    synth_rmdir(dh);
}

static void
test_dtypes_and_digest_inputs(void **state)
{
    (void)state;
    char d1[256], d2[256];
    wrk_model_info a, b;
    synth_cfg c = synth_default();
    synth_tmpdir(d1, sizeof(d1), "f16");
    c.dtype = WK_DTYPE_F16;
    assert_int_equal(synth_write(d1, &c), 0);
    free(logits_of(d1, NULL, &a));
    assert_int_equal(a.dtype, WK_DTYPE_F16);

    /* other seed: other weights digest and fingerprint */
    synth_tmpdir(d2, sizeof(d2), "f16b");
    c.seed = 2;
    assert_int_equal(synth_write(d2, &c), 0);
    free(logits_of(d2, NULL, &b));
    assert_string_not_equal(a.weights_digest, b.weights_digest);
    assert_string_not_equal(a.fingerprint, b.fingerprint);
    synth_rmdir(d2);

    /* no vocab: allowed, empty vocab digest, fingerprint changes */
    synth_tmpdir(d2, sizeof(d2), "novocab");
    c.seed = 1;
    c.vocab = false;
    assert_int_equal(synth_write(d2, &c), 0);
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    assert_int_equal(wrk_model_load(d2, NULL, &m, &d), WK_OK);
    assert_string_equal(wrk_model_info_get(m)->vocab_digest, "");
    assert_null(wrk_model_tokenizer(m));
    assert_string_equal(wrk_model_info_get(m)->weights_digest, a.weights_digest);
    assert_string_not_equal(wrk_model_info_get(m)->fingerprint, a.fingerprint);
    wrk_model_free(m);

    /* an explicit vocab path that does not exist is an error */
    char vp[300];
    snprintf(vp, sizeof(vp), "%s/nope.txt", d2);
    wrk_model_opts o = {.vocab_path = vp};
    m = NULL;
    assert_int_not_equal(wrk_model_load(d2, &o, &m, &d), WK_OK);
    assert_null(m);
    /* and one that exists is used */
    snprintf(vp, sizeof(vp), "%s/rwkv_vocab_v20230424.txt", d1);
    assert_int_equal(wrk_model_load(d2, &o, &m, &d), WK_OK);
    assert_string_equal(wrk_model_info_get(m)->vocab_digest, a.vocab_digest);
    assert_non_null(wrk_model_tokenizer(m));
    wrk_model_free(m);
    synth_rmdir(d1);
    synth_rmdir(d2);
}

static void
test_missing_tensor(void **state)
{
    (void)state;
    synth_cfg c = synth_default();
    c.drop = "model.layers.1.attn.k_proj.weight";
    expect_refused(&c, WK_EINVAL, "model.layers.1.attn.k_proj.weight", "missing");
    c = synth_default();
    c.hf = false;
    c.drop = "blocks.1.att.v1";
    expect_refused(&c, WK_EINVAL, "blocks.1.att.v1", "missing");
    c.drop = "head.weight";
    expect_refused(&c, WK_EINVAL, "head.weight", "missing");
    c.drop = "blocks.0.ln0.bias";
    expect_refused(&c, WK_EINVAL, "blocks.0.ln0.bias", "missing");
    c.drop = "blocks.0.att.r_k";
    expect_refused(&c, WK_EINVAL, "blocks.0.att.r_k", "missing");
    c.drop = "emb.weight";
    expect_refused(&c, WK_EINVAL, "no embedding", NULL);
}

static void
test_wrong_shape(void **state)
{
    (void)state;
    synth_cfg c = synth_default();
    c.hf = false;
    c.reshape = "blocks.1.att.key.weight";
    c.reshape_dims[0] = 64;
    c.reshape_dims[1] = 32;
    expect_refused(&c, WK_EINVAL, "blocks.1.att.key.weight: shape [64,32], expected [64,64]",
                   NULL);
    c = synth_default();
    c.reshape = "model.layers.1.attn.a_lora.lora.0.weight";
    c.reshape_dims[0] = 64; /* stored the BlinkDL way round in an HF checkpoint */
    c.reshape_dims[1] = 12;
    expect_refused(&c, WK_EINVAL, "model.layers.1.attn.a_lora.lora.0.weight", "expected [12,64]");
    c.reshape = "model.layers.1.ffn.value.weight";
    c.reshape_dims[0] = 64;
    c.reshape_dims[1] = 96;
    expect_refused(&c, WK_EINVAL, "model.layers.1.ffn.value.weight", "expected [64,128]");
    c.reshape = "model.layers.0.attn.k_k";
    c.reshape_dims[0] = 63;
    c.reshape_dims[1] = 0;
    expect_refused(&c, WK_EINVAL, "model.layers.0.attn.k_k", "expected [64]");
    c.reshape = "lm_head.weight";
    c.reshape_dims[0] = 96;
    c.reshape_dims[1] = 64;
    expect_refused(&c, WK_EINVAL, "lm_head.weight", "expected [300,64]");
    /* a value LoRA on layer 0 is optional, but checked when present */
    c = synth_default();
    c.hf = false;
    c.layer0_v = true;
    c.reshape = "blocks.0.att.v2";
    c.reshape_dims[0] = 5;
    c.reshape_dims[1] = 64;
    expect_refused(&c, WK_EINVAL, "blocks.0.att.v2", "expected [6,64]");
}

static void
test_inconsistent_heads(void **state)
{
    (void)state;
    synth_cfg c = synth_default();
    c.reshape = "model.layers.1.attn.r_k";
    c.reshape_dims[0] = 8;
    c.reshape_dims[1] = 8;
    expect_refused(&c, WK_EINVAL, "model.layers.1.attn.r_k: shape [8,8], expected [4,16]", NULL);
    c.reshape = "model.layers.0.attn.r_k";
    c.reshape_dims[0] = 3;
    c.reshape_dims[1] = 16;
    expect_refused(&c, WK_EINVAL, "model.layers.0.attn.r_k", "H*N");
}

static void
test_unexpected_and_mixed(void **state)
{
    (void)state;
    synth_cfg c = synth_default();
    c.extra = "model.layers.1.attn.x_x";
    expect_refused(&c, WK_EINVAL, "model.layers.1.attn.x_x", "unexpected");
    c.extra = "emb.weight";
    expect_refused(&c, WK_EINVAL, "both naming conventions", NULL);
    c.extra = "model.layers.0.pre_norm.weight.x";
    expect_refused(&c, WK_EINVAL, "unexpected", NULL);
    c.extra = "model.layers.01.attn.k_k";
    expect_refused(&c, WK_EINVAL, "unexpected", NULL);
    /* a layer index past the others: layer 2 has only one tensor */
    c.extra = "model.layers.2.attn.k_k";
    expect_refused(&c, WK_EINVAL, "model.layers.2.", "missing");
    /* 4096 layers at most (indices 0..4095), as the other families */
    c.extra = "model.layers.4096.attn.k_k";
    expect_refused(&c, WK_EINVAL, "model.layers.4096.attn.k_k", "layer index over 4095");
}

static void
write_file(const char *dir, const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void
test_find_checkpoint(void **state)
{
    (void)state;
    char dir[256], path[512];
    wk_diag d = {{0}};
    wrk_model *m = NULL;

    /* empty directory */
    synth_tmpdir(dir, sizeof(dir), "empty");
    assert_int_equal(wrk_model_load(dir, NULL, &m, &d), WK_ENOENT);
    assert_non_null(strstr(d.msg, "no checkpoint"));
    assert_null(m);
    /* a directory that does not exist */
    char nodir[300];
    snprintf(nodir, sizeof(nodir), "%s/none", dir);
    assert_int_equal(wrk_model_load(nodir, NULL, &m, &d), WK_ENOENT);

    /* two .pth */
    write_file(dir, "a.pth", "x");
    write_file(dir, "b.pth", "y");
    assert_int_equal(wrk_model_load(dir, NULL, &m, &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "a.pth"));
    assert_non_null(strstr(d.msg, "b.pth"));
    /* a single *.safetensors wins over *.pth */
    synth_cfg c = synth_default();
    c.file = "rwkv-x070.safetensors";
    assert_int_equal(synth_write(dir, &c), 0);
    assert_int_equal(wrk_model_find_checkpoint(dir, path, sizeof(path), &d), WK_OK);
    assert_non_null(strstr(path, "rwkv-x070.safetensors"));
    assert_int_equal(wrk_model_load(dir, NULL, &m, &d), WK_OK);
    wrk_model_free(m);
    m = NULL;
    /* --model FILE: that checkpoint, even beside others; named after the file */
    char file[400];
    snprintf(file, sizeof(file), "%s/rwkv-x070.safetensors", dir);
    assert_int_equal(wrk_model_find_checkpoint(file, path, sizeof(path), &d), WK_OK);
    assert_string_equal(path, file);
    assert_int_equal(wrk_model_load(file, NULL, &m, &d), WK_OK);
    assert_string_equal(wrk_model_info_get(m)->name, "rwkv-x070");
    wrk_model_free(m);
    m = NULL;
    snprintf(file, sizeof(file), "%s/a.pth", dir); /* (not a real one: refused by the reader) */
    assert_int_not_equal(wrk_model_load(file, NULL, &m, &d), WK_OK);
    write_file(dir, "notes.txt", "x");
    snprintf(file, sizeof(file), "%s/notes.txt", dir);
    assert_int_equal(wrk_model_find_checkpoint(file, path, sizeof(path), &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "not a checkpoint"));
    /* two *.safetensors: refused, naming both */
    c.file = "other.safetensors";
    assert_int_equal(synth_write(dir, &c), 0);
    assert_int_equal(wrk_model_find_checkpoint(dir, path, sizeof(path), &d), WK_EINVAL);
    assert_non_null(strstr(d.msg, "other.safetensors"));
    assert_non_null(strstr(d.msg, "rwkv-x070.safetensors"));
    /* model.safetensors wins over the others */
    c.file = "model.safetensors";
    assert_int_equal(synth_write(dir, &c), 0);
    assert_int_equal(wrk_model_find_checkpoint(dir, path, sizeof(path), &d), WK_OK);
    assert_non_null(strstr(path, "/model.safetensors"));
    /* and the index wins over model.safetensors */
    write_file(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"model.embeddings.weight\":\"model.safetensors\"}}");
    assert_int_equal(wrk_model_find_checkpoint(dir, path, sizeof(path), &d), WK_OK);
    assert_non_null(strstr(path, "model.safetensors.index.json"));
    /* an index that maps only one tensor: refused */
    assert_int_not_equal(wrk_model_load(dir, NULL, &m, &d), WK_OK);
    assert_null(m);
    /* a too-small output buffer */
    assert_int_equal(wrk_model_find_checkpoint(dir, path, 8, &d), WK_ETOOBIG);
    synth_rmdir(dir);
}

static void
test_corrupt_file(void **state)
{
    (void)state;
    char dir[256];
    synth_tmpdir(dir, sizeof(dir), "corrupt");
    write_file(dir, "model.safetensors", "not a safetensors file at all");
    wk_diag d = {{0}};
    wrk_model *m = NULL;
    assert_int_not_equal(wrk_model_load(dir, NULL, &m, &d), WK_OK);
    assert_null(m);
    assert_true(d.msg[0] != '\0');
    synth_rmdir(dir);
    wrk_model_free(NULL);
}

/*
 * nemotron_h's config reading (family/wrk_nemotron_h.c) refuses what it cannot
 * run before any tensor is looked at, naming the key; a config it accepts
 * then looks for the checkpoint's tensors (here an RWKV-7 file: none there).
 */
static void
test_nemotron_h_config(void **state)
{
    (void)state;
    char dir[256];
    synth_cfg c = synth_default();
    synth_tmpdir(dir, sizeof(dir), "nemotron_h");
    assert_int_equal(synth_write(dir, &c), 0);
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"model_type\": \"nemotron_h\", \"hybrid_override_pattern\": \"M*\", "
         "\"mlp_hidden_act\": \"silu\"}",
         "mlp_hidden_act \"silu\" is not supported (relu2 only)"},
        {"{\"model_type\": \"nemotron_h\", \"hybrid_override_pattern\": \"M*\", "
         "\"moe_latent_size\": 1024}",
         "moe_latent_size is not supported"},
        {"{\"model_type\": \"nemotron_h\", \"hybrid_override_pattern\": \"M*\", "
         "\"attention_bias\": true}",
         "attention_bias true is not supported"},
        {"{\"model_type\": \"nemotron_h\"}", "layers_block_type or hybrid_override_pattern"},
        {"{\"model_type\": \"nemotron_h\", \"hybrid_override_pattern\": \"M*X\"}",
         "hybrid_override_pattern[2] 'X' is not supported"},
        {"{\"model_type\": \"nemotron_h\", \"hybrid_override_pattern\": \"*-E\"}",
         "no Mamba2 layer"},
        {"{\"model_type\": \"nemotron_h\", \"layers_block_type\": [\"mamba\", "
         "\"sliding_attention\"]}",
         "layers_block_type[1] \"sliding_attention\" is not supported"},
        {"{\"model_type\": \"nemotron_h\", \"layers_block_type\": [\"mamba\", "
         "\"attention\", \"mlp\", \"moe\"]}",
         "backbone.embeddings.weight: missing"},
        {"{\"model_type\": \"nemotron_h\", \"hybrid_override_pattern\": \"M*-E\"}",
         "backbone.embeddings.weight: missing"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_config(dir, cases[i].json);
        wk_diag d = {{0}};
        wrk_model *m = NULL;
        wk_err e = wrk_model_load(dir, NULL, &m, &d);
        if (e == WK_OK || strstr(d.msg, cases[i].want) == NULL)
            fail_msg("case %zu: expected '%s', got %s: %s", i, cases[i].want, wk_err_name(e),
                     d.msg);
        assert_null(m);
    }
    synth_rmdir(dir);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conventions_identical),
        cmocka_unit_test(test_tied_head),
        cmocka_unit_test(test_norm_eps),
        cmocka_unit_test(test_dtypes_and_digest_inputs),
        cmocka_unit_test(test_missing_tensor),
        cmocka_unit_test(test_wrong_shape),
        cmocka_unit_test(test_inconsistent_heads),
        cmocka_unit_test(test_unexpected_and_mixed),
        cmocka_unit_test(test_nemotron_h_config),
        cmocka_unit_test(test_find_checkpoint),
        cmocka_unit_test(test_corrupt_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
