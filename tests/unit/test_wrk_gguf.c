/*
 * test_wrk_gguf: llama.cpp GGUF files onto the Hugging Face tensor sets
 * (workerd/wrk_gguf.c), on tiny GGUF images built here: RWKV-7 (the fused
 * token shift split into six views, r_k reshaped by the head size, the
 * dummy layer-0 value LoRA dropped, the config from the metadata with the
 * float32 epsilon as its shortest decimal), Mamba2 (conv1d and norm
 * reshaped, A_log computed back from A = -exp(A_log), tie and conv bias
 * from what the file holds), Granite-4.0-H (granitehybrid: the split
 * gate / up halves fused back, q / k rows unpermuted, the multipliers and
 * layer kinds into the config), the refusals with their messages, and the GGUF
 * names appended to a later diag (wrk_gguf_diag_names).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <unistd.h>

#include "wk_gguf.h"
#include "wk_tensor.h"
#include "wrk_gguf.h"

/* ------------------------------------------------------------------------ */
/* a GGUF v3 image builder                                                   */
/* ------------------------------------------------------------------------ */

#define GB_MAX_KV 16
#define GB_MAX_T 48

typedef struct gb_kv {
    const char *key;
    uint32_t type; /* WK_GGUF_TYPE_UINT32, _FLOAT32 or _STRING */
    uint32_t u;    /* UINT32 value */
    float f;       /* FLOAT32 value */
    const char *s; /* STRING value */
} gb_kv;

typedef struct gb_t {
    char name[96];
    int ndim;
    int64_t shape[4]; /* row-major, as wk_tensor has it (GGUF stores the reverse) */
    float fill;       /* every value, or NAN: value i is i * 0.01 */
} gb_t;

typedef struct gb {
    gb_kv kv[GB_MAX_KV];
    size_t n_kv;
    gb_t t[GB_MAX_T];
    size_t n_t;
} gb;

static void
gb_u32(FILE *f, uint32_t v)
{
    fwrite(&v, 4, 1, f); /* little-endian hosts only, as the project */
}

static void
gb_u64(FILE *f, uint64_t v)
{
    fwrite(&v, 8, 1, f);
}

static void
gb_str(FILE *f, const char *s)
{
    gb_u64(f, strlen(s));
    fwrite(s, 1, strlen(s), f);
}

static void
gb_key_u32(gb *b, const char *key, uint32_t v)
{
    b->kv[b->n_kv++] = (gb_kv){key, WK_GGUF_TYPE_UINT32, v, 0, NULL};
}

static void
gb_key_f32(gb *b, const char *key, float v)
{
    b->kv[b->n_kv++] = (gb_kv){key, WK_GGUF_TYPE_FLOAT32, 0, v, NULL};
}

static void
gb_key_str(gb *b, const char *key, const char *v)
{
    b->kv[b->n_kv++] = (gb_kv){key, WK_GGUF_TYPE_STRING, 0, 0, v};
}

static gb_t *
gb_tensor(gb *b, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    assert_true(b->n_t < GB_MAX_T);
    gb_t *t = &b->t[b->n_t++];
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->ndim = ndim;
    int64_t s[4] = {d0, d1, d2, d3};
    memcpy(t->shape, s, sizeof(s));
    t->fill = NAN;
    return t;
}

static uint64_t
gb_numel(const gb_t *t)
{
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (uint64_t)t->shape[i];
    return n;
}

/* Writes b to a fresh temporary file; its path into path. */
static void
gb_write(const gb *b, char *path, size_t len)
{
    const char *base = getenv("TMPDIR");
    snprintf(path, len, "%s/wkvm-gguf-XXXXXX", base && base[0] ? base : "/tmp");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "wb");
    assert_non_null(f);
    fwrite("GGUF", 1, 4, f);
    gb_u32(f, 3);
    gb_u64(f, b->n_t);
    gb_u64(f, b->n_kv);
    for (size_t i = 0; i < b->n_kv; i++) {
        gb_str(f, b->kv[i].key);
        gb_u32(f, b->kv[i].type);
        if (b->kv[i].type == WK_GGUF_TYPE_UINT32)
            gb_u32(f, b->kv[i].u);
        else if (b->kv[i].type == WK_GGUF_TYPE_FLOAT32)
            fwrite(&b->kv[i].f, 4, 1, f);
        else
            gb_str(f, b->kv[i].s);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < b->n_t; i++) {
        const gb_t *t = &b->t[i];
        gb_str(f, t->name);
        gb_u32(f, (uint32_t)t->ndim);
        for (int k = t->ndim - 1; k >= 0; k--)
            gb_u64(f, (uint64_t)t->shape[k]);
        gb_u32(f, 0); /* F32 */
        gb_u64(f, off);
        off += (gb_numel(t) * 4 + 31) / 32 * 32;
    }
    long pos = ftell(f);
    while (pos % 32 != 0) {
        fputc(0, f);
        pos++;
    }
    for (size_t i = 0; i < b->n_t; i++) {
        const gb_t *t = &b->t[i];
        uint64_t n = gb_numel(t);
        for (uint64_t j = 0; j < n; j++) {
            float v = isnan(t->fill) ? (float)j * 0.01f : t->fill;
            fwrite(&v, 4, 1, f);
        }
        for (uint64_t j = n * 4; j % 32 != 0; j++)
            fputc(0, f);
    }
    assert_int_equal(fclose(f), 0);
}

/* Opens b through wrk_gguf_open(); the file is removed at once. */
static wk_err
gb_open(const gb *b, wk_tensor_set **set, json_t **config, wk_diag *d)
{
    char path[512];
    gb_write(b, path, sizeof(path));
    wk_err e = wrk_gguf_open(path, set, config, d);
    unlink(path);
    return e;
}

static void
expect_refused(const gb *b, wk_err err, const char *want)
{
    wk_tensor_set *set = NULL;
    json_t *cfg = NULL;
    wk_diag d = {{0}};
    wk_err e = gb_open(b, &set, &cfg, &d);
    if (e != err || strstr(d.msg, want) == NULL)
        fail_msg("expected %s with '%s', got %s: %s", wk_err_name(err), want, wk_err_name(e),
                 d.msg);
    assert_null(set);
    assert_null(cfg);
}

/* ------------------------------------------------------------------------ */
/* RWKV-7                                                                    */
/* ------------------------------------------------------------------------ */

enum { RC = 8, RN = 4, RV = 16 }; /* C, head size, vocab */

static void
rwkv7_file(gb *b)
{
    memset(b, 0, sizeof(*b));
    gb_key_str(b, "general.architecture", "rwkv7");
    gb_key_u32(b, "rwkv7.block_count", 1);
    gb_key_u32(b, "rwkv7.wkv.head_size", RN);
    gb_key_f32(b, "rwkv7.attention.layer_norm_epsilon", 1e-5f);
    gb_tensor(b, "token_embd.weight", 2, RV, RC, 0, 0);
    gb_tensor(b, "blk.0.time_mix_lerp_fused.weight", 4, 6, 1, 1, RC);
    gb_tensor(b, "blk.0.time_mix_r_k.weight", 1, RC, 0, 0, 0);
    gb_tensor(b, "blk.0.time_mix_v1.weight", 2, 4, RC, 0, 0); /* layer 0's dummy: dropped */
    gb_tensor(b, "blk.0.channel_mix_key.weight", 2, 2 * RC, RC, 0, 0);
    gb_tensor(b, "output.weight", 2, RV, RC, 0, 0);
}

static void
test_rwkv7(void **state)
{
    (void)state;
    static gb b;
    rwkv7_file(&b);
    wk_tensor_set *set = NULL;
    json_t *cfg = NULL;
    wk_diag d = {{0}};
    if (gb_open(&b, &set, &cfg, &d) != WK_OK)
        fail_msg("open: %s", d.msg);
    /* 6 lerp views + r_k + key + embedding + head; the dummy LoRA dropped */
    assert_int_equal(wk_tensor_set_count(set), 10);
    assert_non_null(wk_tensor_set_find(set, "model.embeddings.weight"));
    assert_non_null(wk_tensor_set_find(set, "lm_head.weight"));
    assert_non_null(wk_tensor_set_find(set, "model.layers.0.ffn.key.weight"));
    assert_null(wk_tensor_set_find(set, "model.layers.0.attn.v_lora.lora.0.weight"));
    static const char *const lerp[6] = {"x_r", "x_w", "x_k", "x_v", "x_a", "x_g"};
    for (int k = 0; k < 6; k++) {
        char n[64];
        snprintf(n, sizeof(n), "model.layers.0.attn.%s", lerp[k]);
        const wk_tensor *t = wk_tensor_set_find(set, n);
        assert_non_null(t);
        assert_int_equal(t->ndim, 1);
        assert_int_equal(t->shape[0], RC);
        float v;
        assert_int_equal(wk_tensor_read_f32(t, 0, 1, &v), WK_OK);
        assert_true(v == (float)(k * RC) * 0.01f); /* the k-th slice of the fused tensor */
    }
    const wk_tensor *rk = wk_tensor_set_find(set, "model.layers.0.attn.r_k");
    assert_non_null(rk);
    assert_int_equal(rk->ndim, 2);
    assert_int_equal(rk->shape[0], RC / RN);
    assert_int_equal(rk->shape[1], RN);
    assert_string_equal(json_string_value(json_object_get(cfg, "model_type")), "rwkv7");
    assert_true(json_real_value(json_object_get(cfg, "norm_eps")) == 1e-05);
    assert_true(json_is_false(json_object_get(cfg, "tie_word_embeddings")));
    json_decref(cfg);
    wk_tensor_set_free(set);
}

static void
test_rwkv7_refusals(void **state)
{
    (void)state;
    static gb b;
    rwkv7_file(&b);
    gb_tensor(&b, "blk.0.time_mix_bogus.weight", 1, RC, 0, 0, 0);
    expect_refused(&b, WK_EINVAL,
                   "blk.0.time_mix_bogus.weight: unexpected tensor for an RWKV-7 GGUF file");
    rwkv7_file(&b);
    gb_tensor(&b, "blk.1.channel_mix_value.weight", 2, RC, 2 * RC, 0, 0);
    expect_refused(&b, WK_EINVAL, "blk.1.channel_mix_value.weight: layer past rwkv7.block_count 1");
    rwkv7_file(&b);
    b.t[1].shape[0] = 5;
    expect_refused(&b, WK_EINVAL,
                   "blk.0.time_mix_lerp_fused.weight: expected shape [6,1,1,C] (x_r, x_w, x_k, "
                   "x_v, x_a, x_g)");
    rwkv7_file(&b);
    b.t[2].shape[0] = RC + 1;
    expect_refused(&b, WK_EINVAL,
                   "blk.0.time_mix_r_k.weight: expected [C] with C a multiple of "
                   "rwkv7.wkv.head_size 4");
    rwkv7_file(&b);
    b.kv[1].u = 0;
    expect_refused(&b, WK_EINVAL, "rwkv7.block_count 0 or rwkv7.wkv.head_size 4 out of range");
    rwkv7_file(&b);
    b.kv[3].f = 2.0f;
    expect_refused(&b, WK_EINVAL, "rwkv7.attention.layer_norm_epsilon 2 outside (0, 1)");
    rwkv7_file(&b);
    b.kv[0].s = "llama";
    expect_refused(&b, WK_ENOTSUP,
                   "general.architecture \"llama\": only rwkv7, mamba2, qwen35, qwen35moe, "
                   "qwen3next, nemotron_h, nemotron_h_moe and granitehybrid GGUF files are "
                   "supported");
    rwkv7_file(&b);
    b.kv[2].key = "rwkv7.head_size"; /* the required key absent */
    expect_refused(&b, WK_ENOENT, "rwkv7.wkv.head_size");
}

/* ------------------------------------------------------------------------ */
/* Mamba2                                                                    */
/* ------------------------------------------------------------------------ */

/* C 8, d_inner 16, N 4, K 4, H 4, G 2, V 16 */
enum { MC = 8, MDI = 16, MN = 4, MK = 4, MH = 4, MG = 2, MV = 16 };
#define MCD (MDI + 2 * MG * MN)

static void
mamba2_file(gb *b, bool output, bool conv_bias)
{
    memset(b, 0, sizeof(*b));
    gb_key_str(b, "general.architecture", "mamba2");
    gb_key_u32(b, "mamba2.block_count", 1);
    gb_key_u32(b, "mamba2.embedding_length", MC);
    gb_key_u32(b, "mamba2.ssm.inner_size", MDI);
    gb_key_u32(b, "mamba2.ssm.state_size", MN);
    gb_key_u32(b, "mamba2.ssm.conv_kernel", MK);
    gb_key_u32(b, "mamba2.ssm.time_step_rank", MH);
    gb_key_u32(b, "mamba2.ssm.group_count", MG);
    gb_key_f32(b, "mamba2.attention.layer_norm_rms_epsilon", 1e-6f);
    gb_tensor(b, "token_embd.weight", 2, MV, MC, 0, 0);
    gb_tensor(b, "blk.0.attn_norm.weight", 1, MC, 0, 0, 0);
    gb_tensor(b, "blk.0.ssm_in.weight", 2, 2 * MDI + 2 * MG * MN + MH, MC, 0, 0);
    gb_tensor(b, "blk.0.ssm_conv1d.weight", 2, MCD, MK, 0, 0);
    if (conv_bias)
        gb_tensor(b, "blk.0.ssm_conv1d.bias", 1, MCD, 0, 0, 0);
    gb_tensor(b, "blk.0.ssm_dt.bias", 1, MH, 0, 0, 0);
    gb_tensor(b, "blk.0.ssm_a", 2, MH, 1, 0, 0)->fill = -2.5f;
    gb_tensor(b, "blk.0.ssm_d", 2, MH, 1, 0, 0);
    gb_tensor(b, "blk.0.ssm_norm.weight", 2, MG, MDI / MG, 0, 0);
    gb_tensor(b, "blk.0.ssm_out.weight", 2, MC, MDI, 0, 0);
    gb_tensor(b, "output_norm.weight", 1, MC, 0, 0, 0);
    if (output)
        gb_tensor(b, "output.weight", 2, MV, MC, 0, 0);
}

static json_int_t
cfg_int(const json_t *c, const char *key)
{
    const json_t *v = json_object_get(c, key);
    assert_true(json_is_integer(v));
    return json_integer_value(v);
}

static void
test_mamba2(void **state)
{
    (void)state;
    static gb b;
    mamba2_file(&b, false, true);
    wk_tensor_set *set = NULL;
    json_t *cfg = NULL;
    wk_diag d = {{0}};
    if (gb_open(&b, &set, &cfg, &d) != WK_OK)
        fail_msg("open: %s", d.msg);
    const wk_tensor *t = wk_tensor_set_find(set, "backbone.layers.0.mixer.conv1d.weight");
    assert_non_null(t);
    assert_int_equal(t->ndim, 3);
    assert_int_equal(t->shape[0], MCD);
    assert_int_equal(t->shape[1], 1);
    assert_int_equal(t->shape[2], MK);
    t = wk_tensor_set_find(set, "backbone.layers.0.mixer.norm.weight");
    assert_int_equal(t->ndim, 1);
    assert_int_equal(t->shape[0], MDI);
    t = wk_tensor_set_find(set, "backbone.layers.0.mixer.D");
    assert_int_equal(t->ndim, 1);
    assert_int_equal(t->shape[0], MH);
    /* A_log such that -expf(A_log) gives back the stored A exactly */
    t = wk_tensor_set_find(set, "backbone.layers.0.mixer.A_log");
    assert_non_null(t);
    assert_int_equal(t->ndim, 1);
    assert_int_equal(t->shape[0], MH);
    for (int h = 0; h < MH; h++) {
        float a;
        assert_int_equal(wk_tensor_read_f32(t, (size_t)h, 1, &a), WK_OK);
        assert_true(-expf(a) == -2.5f);
    }
    assert_non_null(wk_tensor_set_find(set, "backbone.embeddings.weight"));
    assert_non_null(wk_tensor_set_find(set, "backbone.norm_f.weight"));
    assert_null(wk_tensor_set_find(set, "lm_head.weight"));
    assert_string_equal(json_string_value(json_object_get(cfg, "model_type")), "mamba2");
    assert_int_equal(cfg_int(cfg, "hidden_size"), MC);
    assert_int_equal(cfg_int(cfg, "num_hidden_layers"), 1);
    assert_int_equal(cfg_int(cfg, "state_size"), MN);
    assert_int_equal(cfg_int(cfg, "conv_kernel"), MK);
    assert_int_equal(cfg_int(cfg, "n_groups"), MG);
    assert_int_equal(cfg_int(cfg, "head_dim"), MDI / MH);
    assert_int_equal(cfg_int(cfg, "num_heads"), MH);
    assert_int_equal(cfg_int(cfg, "expand"), MDI / MC);
    assert_true(json_real_value(json_object_get(cfg, "layer_norm_epsilon")) == 1e-06);
    assert_true(json_is_true(json_object_get(cfg, "tie_word_embeddings")));
    assert_true(json_is_true(json_object_get(cfg, "use_conv_bias")));
    json_decref(cfg);
    wk_tensor_set_free(set);

    mamba2_file(&b, true, false);
    if (gb_open(&b, &set, &cfg, &d) != WK_OK)
        fail_msg("open: %s", d.msg);
    assert_non_null(wk_tensor_set_find(set, "lm_head.weight"));
    assert_true(json_is_false(json_object_get(cfg, "tie_word_embeddings")));
    assert_true(json_is_false(json_object_get(cfg, "use_conv_bias")));
    json_decref(cfg);
    wk_tensor_set_free(set);
}

static void
test_mamba2_refusals(void **state)
{
    (void)state;
    static gb b;
    mamba2_file(&b, true, true);
    b.t[6].fill = 0.5f; /* blk.0.ssm_a: A must be negative */
    expect_refused(&b, WK_EINVAL, "blk.0.ssm_a[0] = 0.5: expected A = -exp(A_log) < 0");
    mamba2_file(&b, true, true);
    b.kv[6].u = 3; /* 16 inner channels do not split into 3 heads */
    expect_refused(&b, WK_EINVAL,
                   "ssm.time_step_rank 3, ssm.group_count 2: out of range or "
                   "inconsistent");
    mamba2_file(&b, true, true);
    b.t[3].ndim = 3; /* conv1d not squeezed */
    b.t[3].shape[1] = 1;
    b.t[3].shape[2] = MK;
    expect_refused(&b, WK_EINVAL, "blk.0.ssm_conv1d.weight: expected [conv_dim, 4]");
    mamba2_file(&b, true, true);
    b.t[8].shape[0] = 4; /* ssm_norm [4, 8]: not group_count groups */
    b.t[8].shape[1] = 4;
    expect_refused(&b, WK_EINVAL, "blk.0.ssm_norm.weight: expected [2, d_inner / 2]");
    mamba2_file(&b, true, true);
    gb_tensor(&b, "blk.0.ssm_extra", 1, 4, 0, 0, 0);
    expect_refused(&b, WK_EINVAL, "blk.0.ssm_extra: unexpected tensor for a Mamba2 GGUF file");
}

/* ------------------------------------------------------------------------ */
/* Granite-4.0-H (granitehybrid)                                             */
/* ------------------------------------------------------------------------ */

/* C 8, 2 heads of 4 (1 KV head), d_inner 16, N 4, K 4, H 4, G 1, F 6, V 16, E 3 */
enum { GC = 8, GHQ = 2, GDI = 16, GN = 4, GK = 4, GH = 4, GF = 6, GV = 16, GE = 3 };
#define GCD (GDI + 2 * GN)

/* Layer 0 Mamba2, layer 1 attention; the MLP dense (ffn_*) or MoE (_exps, _shexp). */
static void
granite_file(gb *b, bool moe)
{
    memset(b, 0, sizeof(*b));
    gb_key_str(b, "general.architecture", "granitehybrid");
    gb_key_u32(b, "granitehybrid.block_count", 2);
    gb_key_u32(b, "granitehybrid.embedding_length", GC);
    gb_key_u32(b, "granitehybrid.attention.head_count", GHQ);
    gb_key_u32(b, "granitehybrid.ssm.inner_size", GDI);
    gb_key_u32(b, "granitehybrid.ssm.state_size", GN);
    gb_key_u32(b, "granitehybrid.ssm.conv_kernel", GK);
    gb_key_u32(b, "granitehybrid.ssm.time_step_rank", GH);
    gb_key_u32(b, "granitehybrid.ssm.group_count", 1);
    gb_key_f32(b, "granitehybrid.attention.layer_norm_rms_epsilon", 1e-5f);
    gb_key_f32(b, "granitehybrid.embedding_scale", 12.0f);
    gb_key_f32(b, "granitehybrid.attention.scale", 0.0078125f);
    if (moe) {
        gb_key_u32(b, "granitehybrid.expert_count", GE);
        gb_key_u32(b, "granitehybrid.expert_used_count", 2);
    }
    gb_tensor(b, "token_embd.weight", 2, GV, GC, 0, 0);
    gb_tensor(b, "blk.0.attn_norm.weight", 1, GC, 0, 0, 0);
    gb_tensor(b, "blk.0.ssm_in.weight", 2, 2 * GDI + 2 * GN + GH, GC, 0, 0);
    gb_tensor(b, "blk.0.ssm_conv1d.weight", 2, GCD, GK, 0, 0);
    gb_tensor(b, "blk.0.ssm_conv1d.bias", 1, GCD, 0, 0, 0);
    gb_tensor(b, "blk.0.ssm_dt.bias", 1, GH, 0, 0, 0);
    gb_tensor(b, "blk.0.ssm_a", 2, GH, 1, 0, 0)->fill = -2.5f;
    gb_tensor(b, "blk.0.ssm_d", 2, GH, 1, 0, 0);
    gb_tensor(b, "blk.0.ssm_norm.weight", 2, 1, GDI, 0, 0);
    gb_tensor(b, "blk.0.ssm_out.weight", 2, GC, GDI, 0, 0);
    gb_tensor(b, "blk.1.attn_norm.weight", 1, GC, 0, 0, 0);
    gb_tensor(b, "blk.1.attn_q.weight", 2, GC, GC, 0, 0);
    gb_tensor(b, "blk.1.attn_k.weight", 2, GC / GHQ, GC, 0, 0);
    gb_tensor(b, "blk.1.attn_v.weight", 2, GC / GHQ, GC, 0, 0);
    gb_tensor(b, "blk.1.attn_output.weight", 2, GC, GC, 0, 0);
    for (int l = 0; l < 2; l++) {
        char n[64];
        snprintf(n, sizeof(n), "blk.%d.ffn_norm.weight", l);
        gb_tensor(b, n, 1, GC, 0, 0, 0);
        const char *sfx = moe ? "_shexp" : "";
        snprintf(n, sizeof(n), "blk.%d.ffn_gate%s.weight", l, sfx);
        gb_tensor(b, n, 2, GF, GC, 0, 0)->fill = 1.0f;
        snprintf(n, sizeof(n), "blk.%d.ffn_up%s.weight", l, sfx);
        gb_tensor(b, n, 2, GF, GC, 0, 0)->fill = 2.0f;
        snprintf(n, sizeof(n), "blk.%d.ffn_down%s.weight", l, sfx);
        gb_tensor(b, n, 2, GC, GF, 0, 0);
        if (!moe)
            continue;
        snprintf(n, sizeof(n), "blk.%d.ffn_gate_inp.weight", l);
        gb_tensor(b, n, 2, GE, GC, 0, 0);
        snprintf(n, sizeof(n), "blk.%d.ffn_gate_exps.weight", l);
        gb_tensor(b, n, 3, GE, GF / 2, GC, 0)->fill = 3.0f;
        snprintf(n, sizeof(n), "blk.%d.ffn_up_exps.weight", l);
        gb_tensor(b, n, 3, GE, GF / 2, GC, 0)->fill = 4.0f;
        snprintf(n, sizeof(n), "blk.%d.ffn_down_exps.weight", l);
        gb_tensor(b, n, 3, GE, GC, GF / 2, 0);
    }
    gb_tensor(b, "output_norm.weight", 1, GC, 0, 0, 0);
}

static float
read_at(const wk_tensor *t, size_t i)
{
    float v;
    assert_int_equal(wk_tensor_read_f32(t, i, 1, &v), WK_OK);
    return v;
}

static void
test_granite_h(void **state)
{
    (void)state;
    static gb b;
    granite_file(&b, false);
    wk_tensor_set *set = NULL;
    json_t *cfg = NULL;
    wk_diag d = {{0}};
    if (gb_open(&b, &set, &cfg, &d) != WK_OK)
        fail_msg("open: %s", d.msg);
    /* the shared MLP's halves fused again: the gate rows, then the up rows */
    const wk_tensor *t = wk_tensor_set_find(set, "model.layers.1.shared_mlp.input_linear.weight");
    assert_non_null(t);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2 * GF);
    assert_int_equal(t->shape[1], GC);
    assert_true(read_at(t, 0) == 1.0f && read_at(t, GF * GC - 1) == 1.0f);
    assert_true(read_at(t, GF * GC) == 2.0f && read_at(t, 2 * GF * GC - 1) == 2.0f);
    /* q rows back in the checkpoint's order: its row 1 (head 0, i 1) is the file's row 2 */
    t = wk_tensor_set_find(set, "model.layers.1.self_attn.q_proj.weight");
    assert_non_null(t);
    assert_true(read_at(t, 1 * GC) == (float)(2 * GC) * 0.01f);
    assert_true(read_at(t, 2 * GC) == (float)(1 * GC) * 0.01f);
    t = wk_tensor_set_find(set, "model.layers.1.self_attn.k_proj.weight"); /* one KV head */
    assert_true(read_at(t, 1 * GC) == (float)(2 * GC) * 0.01f);
    t = wk_tensor_set_find(set, "model.layers.0.mamba.conv1d.weight");
    assert_int_equal(t->ndim, 3);
    assert_int_equal(t->shape[1], 1);
    t = wk_tensor_set_find(set, "model.layers.0.mamba.A_log");
    assert_true(-expf(read_at(t, 0)) == -2.5f);
    assert_non_null(wk_tensor_set_find(set, "model.layers.1.shared_mlp.output_linear.weight"));
    assert_non_null(wk_tensor_set_find(set, "model.layers.0.post_attention_layernorm.weight"));
    assert_non_null(wk_tensor_set_find(set, "model.embed_tokens.weight"));
    assert_null(wk_tensor_set_find(set, "lm_head.weight"));
    assert_string_equal(json_string_value(json_object_get(cfg, "model_type")), "granitemoehybrid");
    const json_t *lt = json_object_get(cfg, "layer_types");
    assert_string_equal(json_string_value(json_array_get(lt, 0)), "mamba");
    assert_string_equal(json_string_value(json_array_get(lt, 1)), "attention");
    assert_int_equal(cfg_int(cfg, "num_key_value_heads"), 1);
    assert_int_equal(cfg_int(cfg, "mamba_d_head"), GDI / GH);
    assert_int_equal(cfg_int(cfg, "mamba_expand"), GDI / GC);
    assert_int_equal(cfg_int(cfg, "num_local_experts"), 0);
    assert_int_equal(cfg_int(cfg, "shared_intermediate_size"), GF);
    assert_true(json_real_value(json_object_get(cfg, "embedding_multiplier")) == 12.0);
    assert_true(json_real_value(json_object_get(cfg, "attention_multiplier")) == 0.0078125);
    assert_true(json_real_value(json_object_get(cfg, "residual_multiplier")) == 1.0);
    assert_string_equal(json_string_value(json_object_get(cfg, "position_embedding_type")), "nope");
    assert_true(json_is_true(json_object_get(cfg, "tie_word_embeddings")));
    json_decref(cfg);
    wk_tensor_set_free(set);

    granite_file(&b, true);
    if (gb_open(&b, &set, &cfg, &d) != WK_OK)
        fail_msg("open: %s", d.msg);
    /* the experts' input_linear [E, 2F, C]: per expert its gate rows, then its up rows */
    t = wk_tensor_set_find(set, "model.layers.0.block_sparse_moe.input_linear.weight");
    assert_non_null(t);
    assert_int_equal(t->ndim, 3);
    assert_int_equal(t->shape[0], GE);
    assert_int_equal(t->shape[1], GF);
    const size_t half = (GF / 2) * GC;
    for (size_t x = 0; x < GE; x++) {
        assert_true(read_at(t, 2 * x * half) == 3.0f);
        assert_true(read_at(t, (2 * x + 1) * half) == 4.0f);
    }
    t = wk_tensor_set_find(set, "model.layers.0.shared_mlp.input_linear.weight");
    assert_true(read_at(t, 0) == 1.0f && read_at(t, GF * GC) == 2.0f);
    assert_non_null(wk_tensor_set_find(set, "model.layers.0.block_sparse_moe.router.layer.weight"));
    assert_non_null(
        wk_tensor_set_find(set, "model.layers.0.block_sparse_moe.output_linear.weight"));
    assert_int_equal(cfg_int(cfg, "num_local_experts"), GE);
    assert_int_equal(cfg_int(cfg, "num_experts_per_tok"), 2);
    assert_int_equal(cfg_int(cfg, "intermediate_size"), GF / 2);
    json_decref(cfg);
    wk_tensor_set_free(set);
}

static void
test_granite_h_refusals(void **state)
{
    (void)state;
    static gb b;
    granite_file(&b, false);
    snprintf(b.t[17].name, sizeof(b.t[17].name), "blk.0.ffn_upx.weight");
    expect_refused(&b, WK_EINVAL, "blk.0.ffn_upx.weight: unexpected tensor for a granitehybrid");
    granite_file(&b, false);
    snprintf(b.t[17].name, sizeof(b.t[17].name), "blk.0.ffn_up_shexp.weight");
    expect_refused(&b, WK_EINVAL, "blk.0.ffn_gate.weight: no blk.0.ffn_up.weight to go with it");
    granite_file(&b, false);
    b.t[17].shape[0] = GF + 1; /* ffn_up not the gate's shape */
    expect_refused(&b, WK_EINVAL, "blk.0.ffn_gate.weight and blk.0.ffn_up.weight differ");
    granite_file(&b, false);
    snprintf(b.t[9].name, sizeof(b.t[9].name), "blk.1.ssm_out.weight"); /* into layer 1 */
    expect_refused(&b, WK_EINVAL, "block 1 holds tensors of two kinds");
    granite_file(&b, false);
    b.kv[3].u = 3; /* 8 channels are not 3 heads */
    expect_refused(&b, WK_EINVAL, "granitehybrid.* dimensions out of range or inconsistent");
}

static void
test_diag_names(void **state)
{
    (void)state;
    wk_diag d = {{0}};
    wk_diag_set(&d, WK_EINVAL, "model.layers.3.attn.r_k: shape [2], expected [2,4]");
    wrk_gguf_diag_names(&d);
    assert_string_equal(d.msg, "model.layers.3.attn.r_k: shape [2], expected [2,4] "
                               "(GGUF blk.3.time_mix_r_k.weight)");
    wk_diag_set(&d, WK_EINVAL, "missing model.layers.0.attn.x_g.");
    wrk_gguf_diag_names(&d);
    assert_string_equal(d.msg,
                        "missing model.layers.0.attn.x_g. (GGUF blk.0.time_mix_lerp_fused.weight)");
    wk_diag_set(&d, WK_EINVAL, "backbone.norm_f.weight: missing");
    wrk_gguf_diag_names(&d);
    assert_string_equal(d.msg, "backbone.norm_f.weight: missing (GGUF output_norm.weight)");
    wk_diag_set(&d, WK_EINVAL, "backbone.layers.1.mixer.A_log: bad");
    wrk_gguf_diag_names(&d);
    assert_string_equal(d.msg, "backbone.layers.1.mixer.A_log: bad (GGUF blk.1.ssm_a)");
    /* no name of this module: unchanged; NULL-safe */
    wk_diag_set(&d, WK_EINVAL, "config.json: hidden_size is 17");
    wrk_gguf_diag_names(&d);
    assert_string_equal(d.msg, "config.json: hidden_size is 17");
    wrk_gguf_diag_names(NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rwkv7),      cmocka_unit_test(test_rwkv7_refusals),
        cmocka_unit_test(test_mamba2),     cmocka_unit_test(test_mamba2_refusals),
        cmocka_unit_test(test_granite_h),  cmocka_unit_test(test_granite_h_refusals),
        cmocka_unit_test(test_diag_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
