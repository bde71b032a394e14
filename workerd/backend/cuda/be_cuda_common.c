/*
 * be_cuda_common: the shared core of the CUDA family steps (stream, cuBLAS,
 * weight block, split-halves GEMM, row checks, pass segmentation, logits
 * copy-back); see be_cuda_common.h. The row checks and the segmentation
 * are be_rows.c's, shared with the CPU backend, so a step is refused with
 * the same error and message on both backends and cut into the same passes.
 *
 * Must never: log, abort on bad input, or make a device call (a reset
 * row's memset included) before every row of a step has been checked.
 */
#include "be_cuda_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be_rows.h"
#include "k.h"

#define CU_PASS_TOKENS 512u      /* tokens per pass by default */
#define CU_PASS_TOKENS_MAX 4096u /* WKVM_CUDA_PASS_TOKENS upper bound */
#define CU_LOGIT_ROWS 64u        /* logits rows per head GEMM (bounds the staging) */
#define CU_WORKSPACE (32u << 20) /* cuBLAS workspace bytes (fixed: deterministic) */
#define CU_ALIGN 256u            /* device offset alignment of each matrix */

int
be_cuda_dtype(wk_dtype dt)
{
    return dt == WK_DTYPE_BF16 ? K_DT_BF16 : dt == WK_DTYPE_F16 ? K_DT_F16 : K_DT_F32;
}

static cudaDataType_t
cu_blas_type(int dt)
{
    return dt == K_DT_BF16 ? CUDA_R_16BF : dt == K_DT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

wk_err
be_cuda_dalloc(void **p, size_t n, const char *what, wk_diag *d)
{
    cudaError_t ce = cudaMalloc(p, n ? n : 1);
    if (ce != cudaSuccess) {
        *p = NULL;
        return wk_diag_set(d, WK_EDEVICE, "cuda backend: cannot allocate %zu bytes for %s: %s", n,
                           what, be_cuda_handled(ce));
    }
    return WK_OK;
}

wk_err
be_cuda_upload_f32(const float *h, size_t n, float **out, const char *what, wk_diag *d)
{
    float *p = NULL;
    BE_CUDA_TRY(be_cuda_dalloc((void **)&p, n * sizeof(float), what, d));
    cudaError_t ce = n ? cudaMemcpy(p, h, n * sizeof(float), cudaMemcpyHostToDevice) : cudaSuccess;
    if (ce != cudaSuccess) {
        (void)cudaFree(p);
        return wk_diag_set(d, WK_EDEVICE, "cuda backend: %s upload: %s", what,
                           be_cuda_handled(ce));
    }
    *out = p;
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* init / fini                                                               */
/* ------------------------------------------------------------------------ */

wk_err
be_cuda_core_init(be_cuda_core *c, const be_config *cfg, uint32_t V, void *arena, uint32_t n_slots,
                  uint64_t slot_bytes, wk_diag *d)
{
    memset(c, 0, sizeof(*c));
    c->device = cfg->device;
    c->V = V;
    c->arena = arena;
    c->n_slots = n_slots;
    c->slot_bytes = slot_bytes;
    c->max_rows = cfg->max_step_rows ? cfg->max_step_rows : BE_ROWS_DEF_ROWS;
    c->max_tokens = cfg->max_step_tokens ? cfg->max_step_tokens : BE_ROWS_DEF_TOKENS;
    c->cap = CU_PASS_TOKENS;
    const char *pt = getenv("WKVM_CUDA_PASS_TOKENS"); /* tuning and tests: 1..4096 */
    if (pt != NULL && atoi(pt) >= 1 && atoi(pt) <= (int)CU_PASS_TOKENS_MAX)
        c->cap = (uint32_t)atoi(pt);
    if (c->cap > c->max_tokens)
        c->cap = c->max_tokens;
    c->lcap = c->cap < CU_LOGIT_ROWS ? c->cap : CU_LOGIT_ROWS;

    cudaError_t ce = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        c->stream = NULL;
        return wk_diag_set(d, WK_EDEVICE, "cuda backend: stream: %s", be_cuda_handled(ce));
    }
    cublasStatus_t bs = cublasCreate(&c->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        return wk_diag_set(d, WK_EDEVICE, "cuda backend: cublasCreate: %s",
                           cublasGetStatusString(bs));
    }
    BE_CUDA_TRY(be_cuda_dalloc(&c->blas_ws, CU_WORKSPACE, "the cuBLAS workspace", d));
    bs = cublasSetStream(c->blas, c->stream);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetWorkspace(c->blas, c->blas_ws, CU_WORKSPACE);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH); /* no TF32 */
    if (bs != CUBLAS_STATUS_SUCCESS)
        return wk_diag_set(d, WK_EDEVICE, "cuda backend: cuBLAS setup: %s",
                           cublasGetStatusString(bs));

    const size_t cap = c->cap, lcap = c->lcap;
    BE_CUDA_TRY(be_cuda_dalloc((void **)&c->dmeta, BE_CUDA_M_N * cap * 4, "pass metadata", d));
    BE_CUDA_TRY(be_cuda_dalloc((void **)&c->dlog, lcap * V * 4, "logits", d));
    BE_CUDA_TRY(be_cuda_dalloc((void **)&c->rscale, cap * 4, "row scales", d));
    void *hm = NULL, *hl = NULL; /* assigned only on success: fini must see NULL otherwise */
    WK_CUDA_CHECK(cudaHostAlloc(&hm, BE_CUDA_M_N * cap * 4, cudaHostAllocDefault), d);
    c->hmeta = hm;
    WK_CUDA_CHECK(cudaHostAlloc(&hl, lcap * V * 4, cudaHostAllocDefault), d);
    c->hlog = hl;
    memset(c->hmeta, 0, BE_CUDA_M_N * cap * 4);
    c->lrows = calloc(cap, sizeof(float *));
    c->slot_mark = calloc(n_slots ? n_slots : 1, sizeof(uint32_t));
    if (c->lrows == NULL || c->slot_mark == NULL)
        return wk_diag_set(d, WK_ENOMEM, "out of memory");
    return WK_OK;
}

wk_err
be_cuda_open_sync(wk_diag *d)
{
    /* uploads and memsets ran on the legacy stream; the step's stream does not wait for them */
    cudaError_t ce = cudaDeviceSynchronize();
    if (ce != cudaSuccess)
        return wk_diag_set(d, WK_EDEVICE, "cuda backend: open: %s", be_cuda_handled(ce));
    return WK_OK;
}

void
be_cuda_free_all(void *const *dev, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (dev[i] != NULL)
            (void)cudaFree(dev[i]);
}

wk_err
be_cuda_core_scratch(be_cuda_core *c, uint32_t max_k, uint32_t max_n, uint32_t head_k, wk_diag *d)
{
    size_t y2 = 2 * (size_t)c->cap * max_n, act = 2 * (size_t)c->cap * max_k;
    if (y2 < 2 * (size_t)c->lcap * c->V)
        y2 = 2 * (size_t)c->lcap * c->V;
    if (act < 2 * (size_t)c->lcap * head_k)
        act = 2 * (size_t)c->lcap * head_k;
    BE_CUDA_TRY(be_cuda_dalloc((void **)&c->y2, y2 * 4, "gemm out", d));
    BE_CUDA_TRY(be_cuda_dalloc((void **)&c->act, act * 2, "gemm in", d));
    c->y2_elems = y2;
    c->act_elems = act;
    return WK_OK;
}

void
be_cuda_core_fini(be_cuda_core *c)
{
    if (c == NULL)
        return;
    if (c->stream != NULL)
        (void)cudaStreamSynchronize(c->stream);
    if (c->blas != NULL)
        (void)cublasDestroy(c->blas);
    if (c->stream != NULL)
        (void)cudaStreamDestroy(c->stream);
    void *dev[] = {c->blas_ws, c->weights, c->act, c->rscale, c->y2, c->dlog, c->dmeta};
    be_cuda_free_all(dev, sizeof(dev) / sizeof(dev[0]));
    if (c->hmeta != NULL)
        (void)cudaFreeHost(c->hmeta);
    if (c->hlog != NULL)
        (void)cudaFreeHost(c->hlog);
    free(c->lrows);
    free(c->slot_mark);
    memset(c, 0, sizeof(*c));
}

/* ------------------------------------------------------------------------ */
/* weights                                                                   */
/* ------------------------------------------------------------------------ */

/* Bytes of a stored matrix, 0 when its tensor does not hold exactly k * n usable elements. */
static size_t
cu_mat_bytes(const wrk_mat *m)
{
    if (m->t == NULL)
        return 0;
    const wk_dtype dt = m->t->dtype;
    if (dt != WK_DTYPE_F32 && dt != WK_DTYPE_F16 && dt != WK_DTYPE_BF16)
        return 0;
    const size_t b = (size_t)m->n_in * m->n_out * wk_dtype_size(dt);
    return b == m->t->nbytes ? b : 0;
}

static size_t
cu_align(size_t n)
{
    return (n + CU_ALIGN - 1) / CU_ALIGN * CU_ALIGN;
}

wk_err
be_cuda_core_upload(be_cuda_core *c, const wrk_mat *const *src, be_cuda_mat *const *dst, size_t n,
                    wk_diag *d)
{
    if (c->weights != NULL)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: weights uploaded twice");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        memset(dst[i], 0, sizeof(*dst[i]));
        if (src[i]->t == NULL)
            continue;
        const size_t b = cu_mat_bytes(src[i]);
        if (b == 0)
            return wk_diag_set(d, WK_EINVAL,
                               "cuda backend: %s: %zu bytes of %s do not make %u x %u",
                               src[i]->t->name, src[i]->t->nbytes, wk_dtype_name(src[i]->t->dtype),
                               src[i]->n_in, src[i]->n_out);
        total += cu_align(b);
    }
    BE_CUDA_TRY(be_cuda_dalloc((void **)&c->weights, total, "weights", d));
    c->weight_bytes = total;
    uint8_t *wp = c->weights;
    for (size_t i = 0; i < n; i++) {
        const wrk_mat *s = src[i];
        if (s->t == NULL)
            continue;
        const size_t b = cu_mat_bytes(s);
        cudaError_t ce = cudaMemcpy(wp, s->t->data, b, cudaMemcpyHostToDevice);
        if (ce != cudaSuccess)
            return wk_diag_set(d, WK_EDEVICE, "cuda backend: weight upload (%s): %s", s->t->name,
                               be_cuda_handled(ce));
        *dst[i] = (be_cuda_mat){.w = wp,
                                .dtype = be_cuda_dtype(s->t->dtype),
                                .k = s->n_in,
                                .n = s->n_out,
                                .in_major = s->in_major};
        wp += cu_align(b);
    }
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* GEMM                                                                      */
/* ------------------------------------------------------------------------ */

/*
 * In cuBLAS's column-major terms: Y (N x cols) = op(A) (N x K) * X (K x cols)
 * where X is the row-major activations seen as K x cols (ld K) and A the
 * stored matrix: [k][n] row-major is N x K column-major (op N, ld N);
 * [n][k] row-major is K x N column-major (op T, ld K).
 */
wk_err
be_cuda_gemm(be_cuda_core *c, const be_cuda_mat *w, const float *x, uint32_t T, float *dst,
             size_t ldd, int epi, wk_diag *d)
{
    if (T == 0)
        return WK_OK;
    if (w->w == NULL || 2 * (size_t)T * w->n > c->y2_elems ||
        (w->dtype != K_DT_F32 && 2 * (size_t)T * w->k > c->act_elems) || T > c->cap)
        return wk_diag_set(d, WK_EINVAL, "cuda backend: GEMM %u x %u over %u rows out of range",
                           w->k, w->n, T);
    const bool split = w->dtype != K_DT_F32;
    const void *B = x;
    int cols = (int)T;
    if (split) {
        WK_CUDA_CHECK(k_split16(x, T, w->k, w->dtype, c->act, c->rscale, c->stream), d);
        B = c->act;
        cols = 2 * (int)T;
    }
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t at = cu_blas_type(w->dtype);
    WK_CUBLAS_CHECK(cublasGemmEx(c->blas, w->in_major ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N,
                                 (int)w->n, cols, (int)w->k, &one, w->w, at,
                                 w->in_major ? (int)w->n : (int)w->k, B, at, (int)w->k, &zero,
                                 c->y2, CUDA_R_32F, (int)w->n, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT),
                    d);
    WK_CUDA_CHECK(
        k_gemm_epi(c->y2, T, w->n, split, split ? c->rscale : NULL, epi, dst, ldd, c->stream), d);
    return WK_OK;
}

/* ------------------------------------------------------------------------ */
/* step                                                                      */
/* ------------------------------------------------------------------------ */

/* Copies the pass's metadata to the device, runs it and waits for it. */
static wk_err
cu_pass_run(be_cuda_core *c, be_cuda_pass_fn pass, void *arg, wk_diag *d)
{
    WK_CUDA_CHECK(cudaMemcpyAsync(c->dmeta, c->hmeta, sizeof(uint32_t) * BE_CUDA_M_N * c->cap,
                                  cudaMemcpyHostToDevice, c->stream),
                  d);
    BE_CUDA_TRY(pass(arg, d));
    /* the pass is complete (and hmeta free for the next one) only after this */
    WK_CUDA_CHECK(cudaStreamSynchronize(c->stream), d);
    return WK_OK;
}

/* What the be_rows_pass_ops of be_cuda_core_step get as arg. */
typedef struct cu_pass_arg {
    be_cuda_core *c;      /* the core */
    be_cuda_pass_fn pass; /* the family's network */
    void *arg;            /* pass's argument */
} cu_pass_arg;

/* be_rows_pass_ops.seg: segment s and its tokens into the pinned pass metadata. */
static void
cu_pass_seg(void *arg, uint32_t s, const be_rows_seg *sg, const int32_t *tokens)
{
    be_cuda_core *c = ((cu_pass_arg *)arg)->c;
    const size_t cap = c->cap;
    uint32_t *tok = c->hmeta + BE_CUDA_M_TOK * cap, *tseg = c->hmeta + BE_CUDA_M_TSEG * cap;
    c->hmeta[BE_CUDA_M_SEG_T0 * cap + s] = sg->t0;
    c->hmeta[BE_CUDA_M_SEG_N * cap + s] = sg->n;
    c->hmeta[BE_CUDA_M_SEG_SLOT * cap + s] = sg->slot;
    for (uint32_t j = 0; j < sg->n; j++) {
        tok[sg->t0 + j] = (uint32_t)tokens[j];
        tseg[sg->t0 + j] = s;
    }
}

/* be_rows_pass_ops.logits: logits row i of the pass. */
static void
cu_pass_logits(void *arg, uint32_t i, uint32_t pos, float *dst)
{
    be_cuda_core *c = ((cu_pass_arg *)arg)->c;
    c->hmeta[BE_CUDA_M_LPOS * (size_t)c->cap + i] = pos;
    c->lrows[i] = dst;
}

/* be_rows_pass_ops.run: the family's network over the pass, waited for. */
static wk_err
cu_pass_split_run(void *arg, uint32_t T, uint32_t n_segs, uint32_t n_logits, wk_diag *d)
{
    cu_pass_arg *pa = arg;
    be_cuda_core *c = pa->c;
    c->T = T;
    c->n_segs = n_segs;
    c->n_logits = n_logits;
    BE_CUDA_TRY(cu_pass_run(c, pa->pass, pa->arg, d));
    c->T = 0;
    c->n_segs = 0;
    c->n_logits = 0;
    return WK_OK;
}

static const be_rows_pass_ops cu_pass_ops = {
    .seg = cu_pass_seg,
    .logits = cu_pass_logits,
    .run = cu_pass_split_run,
};

wk_err
be_cuda_core_step(be_cuda_core *c, be_row *rows, size_t n, be_cuda_pass_fn pass, void *arg,
                  wk_diag *d)
{
    const be_rows_limits lim = {
        .n_slots = c->n_slots, .vocab = c->V, .max_rows = c->max_rows, .max_tokens = c->max_tokens};
    wk_err e = be_rows_check(rows, n, &lim, c->slot_mark, &c->mark_gen, d);
    if (e != WK_OK)
        return e;
    if (c->pre_step != NULL && (e = c->pre_step(arg, rows, n, d)) != WK_OK)
        return e;
    WK_CUDA_CHECK(cudaSetDevice(c->device), d);
    /* the step is accepted: reset rows start from a zeroed slot, ordered before the passes */
    for (size_t i = 0; i < n && e == WK_OK; i++) {
        if (!rows[i].reset || rows[i].slot == 0)
            continue;
        cudaError_t ce = cudaMemsetAsync(c->arena + (size_t)rows[i].slot * c->slot_bytes, 0,
                                         c->slot_bytes, c->stream);
        if (ce != cudaSuccess)
            e = wk_diag_set(d, WK_EDEVICE, "cuda backend: row %zu: slot %u reset: %s", i,
                            rows[i].slot, be_cuda_handled(ce));
    }
    if (e == WK_OK) {
        cu_pass_arg pa = {c, pass, arg};
        c->T = 0;
        c->n_segs = 0;
        c->n_logits = 0;
        e = be_rows_split(rows, n, c->cap, c->V, &cu_pass_ops, &pa, d);
    }
    if (e != WK_OK)
        (void)cudaStreamSynchronize(c->stream); /* drain what was enqueued; the error stands */
    c->T = 0;
    c->n_segs = 0;
    c->n_logits = 0;
    return e;
}

wk_err
be_cuda_core_logits(be_cuda_core *c, const be_cuda_mat *head, float *xo, be_cuda_norm_fn norm,
                    void *arg, wk_diag *d)
{
    const size_t V = c->V;
    const uint32_t *lpos = be_cuda_meta(c, BE_CUDA_M_LPOS);
    for (uint32_t i0 = 0; i0 < c->n_logits; i0 += c->lcap) {
        const uint32_t nl = c->n_logits - i0 < c->lcap ? c->n_logits - i0 : c->lcap;
        BE_CUDA_TRY(norm(arg, lpos + i0, nl, xo, d));
        BE_CUDA_TRY(be_cuda_gemm(c, head, xo, nl, c->dlog, V, K_EPI_STORE, d));
        if (c->logit_div != 0.0f)
            WK_CUDA_CHECK(k_scale(c->dlog, V * nl, c->logit_div, 1, c->stream), d);
        WK_CUDA_CHECK(cudaMemcpyAsync(c->hlog, c->dlog, sizeof(float) * V * nl,
                                      cudaMemcpyDeviceToHost, c->stream),
                      d);
        WK_CUDA_CHECK(cudaStreamSynchronize(c->stream), d);
        for (uint32_t i = 0; i < nl; i++)
            memcpy(c->lrows[i0 + i], c->hlog + V * i, sizeof(float) * V);
    }
    return WK_OK;
}
