/*
 * be_cuda_common: what the CUDA backend's family step uses (the layer list
 * in be_cuda_gdn.c: every family, RWKV-7, pure Mamba2, Gated DeltaNet and
 * the hybrids), and the family seam be_cuda.c dispatches through.
 *
 * A family step owns a be_cuda_core: the stream and cuBLAS handle every
 * enqueue of its steps goes to, the weight block on the device (every
 * matrix as stored: BF16, F16 or F32 in its stored orientation, cuBLAS
 * transposes), the split-halves GEMM (be_cuda_gemm: fp32 compute, 16-bit
 * weights multiplied by the hi + lo 16-bit halves of the fp32 activations),
 * the step (row checks and the split into passes of at most `cap` tokens
 * are be_rows.h's, the same code as the CPU backend's) and the logits
 * copy-back through pinned memory.
 *
 * Only the CUDA backend's .c files include this header. Never logs, never
 * aborts; a refused step changes no slot (every check runs before the
 * first device call).
 */
#ifndef BE_CUDA_COMMON_H
#define BE_CUDA_COMMON_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "be.h"
#include "wk_err.h"
#include "wrk_model.h"

/*
 * Funnel for CUDA runtime calls (and kernel launchers, whose int result is a
 * cudaError_t): on failure returns WK_EDEVICE from the calling function with
 * expr, error, function, file and line in the diag d (may be NULL). The
 * failure is handled here, so the runtime's last error is cleared: the next
 * launch must not report it again (kernels/k_launch.cuh).
 */
#define WK_CUDA_CHECK(expr, d)                                                                     \
    do {                                                                                           \
        cudaError_t ce_ = (cudaError_t)(expr);                                                     \
        if (ce_ != cudaSuccess) {                                                                  \
            (void)cudaGetLastError();                                                              \
            return wk_diag_set((d), WK_EDEVICE, "%s failed: %s (%s at %s:%d)", #expr,              \
                               cudaGetErrorString(ce_), __func__, __FILE__, __LINE__);             \
        }                                                                                          \
    } while (0)

/*
 * For a runtime failure the caller handles by hand (outside WK_CUDA_CHECK):
 * clears the runtime's last error, as WK_CUDA_CHECK does, and returns ce's
 * message for the diag.
 */
static inline const char *
be_cuda_handled(cudaError_t ce)
{
    (void)cudaGetLastError();
    return cudaGetErrorString(ce);
}

/* cuBLAS status funnel, as WK_CUDA_CHECK. */
#define WK_CUBLAS_CHECK(expr, d)                                                                   \
    do {                                                                                           \
        cublasStatus_t bs_ = (expr);                                                               \
        if (bs_ != CUBLAS_STATUS_SUCCESS)                                                          \
            return wk_diag_set((d), WK_EDEVICE, "%s failed: %s (%s at %s:%d)", #expr,              \
                               cublasGetStatusString(bs_), __func__, __FILE__, __LINE__);          \
    } while (0)

/* Returns a failing wk_err from the calling function. */
#define BE_CUDA_TRY(expr)                                                                          \
    do {                                                                                           \
        wk_err te_ = (expr);                                                                       \
        if (te_ != WK_OK)                                                                          \
            return te_;                                                                            \
    } while (0)

/* ------------------------------------------------------------------------ */
/* the family seam (be_cuda.c)                                               */
/* ------------------------------------------------------------------------ */

/*
 * One family's step on the device. create() uploads the model's weights to
 * the current device (the caller did cudaSetDevice(cfg->device)) and
 * allocates the step scratch; arena (device memory, n_slots slots of
 * slot_bytes, the family's slot layout) and m are borrowed for the
 * object's life; on success *out is owned by the caller (destroy()).
 * destroy() is NULL-safe. step() follows be.h's step contract (every row
 * checked first, nothing changed on refusal; returns when every state
 * write and logits row is complete). describe() writes a NUL-terminated
 * "key=value ..." line. kv() is optional (NULL: the family serves no
 * hybrid models): the family's paged KV pool (be_kv.h, be_cuda_kv.h), borrowed for
 * impl's life, or NULL when the model has no attention layers; be_cuda.c
 * runs the slot operations on the KV part of a slot image through it.
 */
typedef struct be_cuda_family {
    const char *const *views; /* wrk_model_view_kind()s this step serves, NULL-ended */
    wk_err (*create)(const be_config *cfg, const wrk_model *m, float *arena, uint32_t n_slots,
                     uint64_t slot_bytes, void **out, wk_diag *d);
    void (*destroy)(void *impl);
    wk_err (*step)(void *impl, be_row *rows, size_t n, wk_diag *d);
    void (*describe)(const void *impl, char *buf, size_t len);
    struct be_kv *(*kv)(void *impl);
} be_cuda_family;

extern const be_cuda_family be_cuda_gdn_family; /* be_cuda_gdn.c */

/* ------------------------------------------------------------------------ */
/* the shared core of a family step                                          */
/* ------------------------------------------------------------------------ */

/* A weight matrix on the device, as stored. */
typedef struct be_cuda_mat {
    const void *w; /* device bytes (into the core's weight block), NULL: absent */
    int dtype;     /* K_DT_* */
    uint32_t k, n; /* input / output features */
    bool in_major; /* stored [k][n] (x @ W); else [n][k] (nn.Linear) */
} be_cuda_mat;

/* The per-pass metadata arrays, each cap uint32 (be_cuda_meta()). */
enum {
    BE_CUDA_M_TOK = 0,  /* token id of each pass token */
    BE_CUDA_M_TSEG,     /* segment of each pass token */
    BE_CUDA_M_SEG_T0,   /* first pass token of each segment */
    BE_CUDA_M_SEG_N,    /* tokens of each segment */
    BE_CUDA_M_SEG_SLOT, /* arena slot of each segment */
    BE_CUDA_M_LPOS,     /* pass token of each logits row */
    BE_CUDA_M_N
};

typedef struct be_cuda_core {
    int device;                    /* CUDA ordinal */
    uint32_t V;                    /* vocab: token ids and logits width */
    uint32_t n_slots;              /* arena slots incl. 0 */
    uint8_t *arena;                /* device, n_slots * slot_bytes, borrowed (reset rows) */
    uint64_t slot_bytes;           /* bytes of one slot's fixed part in arena */
    uint32_t max_rows, max_tokens; /* step limits */
    uint32_t cap;                  /* tokens per pass */
    uint32_t lcap;                 /* logits rows per head GEMM */

    cudaStream_t stream;   /* every enqueue of a step, NULL until created */
    cublasHandle_t blas;   /* bound to stream, NULL until created */
    void *blas_ws;         /* cuBLAS workspace, device */
    uint8_t *weights;      /* device block: every matrix */
    uint64_t weight_bytes; /* bytes in weights */

    uint16_t *act;              /* 16-bit GEMM input halves, act_elems */
    float *rscale;              /* per-row inverse input scale [cap] */
    float *y2;                  /* raw GEMM output, column-major N x (2T), y2_elems */
    size_t act_elems, y2_elems; /* scratch sizes (elements) */

    float *dlog;                  /* device logits [lcap][V] */
    uint32_t *dmeta;              /* device per-pass metadata [BE_CUDA_M_N][cap] */
    uint32_t *hmeta;              /* pinned per-pass metadata [BE_CUDA_M_N][cap] */
    float *hlog;                  /* pinned logits [lcap][V] */
    float **lrows;                /* destination of each logits row of the pass [cap] */
    uint32_t *slot_mark;          /* duplicate detection [n_slots] */
    uint32_t mark_gen;            /* current mark value */
    uint32_t T, n_segs, n_logits; /* the pass being built / run */

    /*
     * optional, set by the family: runs after the row checks, before any
     * device call (hybrid KV pages, a reset row's given back first); the
     * reset rows' slots are zeroed after it succeeds
     */
    wk_err (*pre_step)(void *arg, const be_row *rows, size_t n, wk_diag *d);
    /* optional, set by the family: not 0: every logits row divided by it on the device (Granite) */
    float logit_div;
} be_cuda_core;

/*
 * Sets c up on the current device for the arena (device memory of n_slots
 * slots of slot_bytes, borrowed for c's life; the step zeroes reset rows'
 * slots in it): limits from cfg (0 = the defaults),
 * cap from WKVM_CUDA_PASS_TOKENS (1..4096, default 512, at most
 * max_tokens), the stream, cuBLAS (workspace fixed, no TF32), the pass
 * metadata, logits staging and duplicate marks. The GEMM scratch comes
 * with be_cuda_core_scratch(). c is ready for be_cuda_core_fini either way.
 * WK_ENOMEM, WK_EDEVICE.
 */
WK_MUST_CHECK wk_err be_cuda_core_init(be_cuda_core *c, const be_config *cfg, uint32_t V,
                                       void *arena, uint32_t n_slots, uint64_t slot_bytes,
                                       wk_diag *d);

/*
 * Allocates the GEMM scratch for layer GEMMs of up to cap rows with at most
 * max_k inputs and max_n outputs, and the head GEMM (lcap rows, head_k
 * inputs, V outputs).
 */
WK_MUST_CHECK wk_err be_cuda_core_scratch(be_cuda_core *c, uint32_t max_k, uint32_t max_n,
                                          uint32_t head_k, wk_diag *d);

/*
 * The last step of a family's create(): waits for the device, since the
 * weight uploads and memsets ran on the legacy stream, which the core's
 * stream does not wait for. WK_EDEVICE ("cuda backend: open: ...").
 */
WK_MUST_CHECK wk_err be_cuda_open_sync(wk_diag *d);

/* cudaFree of each non-NULL pointer of dev[0..n-1] (a family's destroy()). */
void be_cuda_free_all(void *const *dev, size_t n);

/* Waits for the stream and frees everything c holds; safe on a half-set-up or zeroed core. */
void be_cuda_core_fini(be_cuda_core *c);

/*
 * Copies n stored matrices (src[i] -> dst[i]) into one device block owned by
 * c (one call per core). A src whose tensor is NULL leaves dst[i] zeroed
 * (absent). WK_EINVAL (a tensor that does not hold n_in * n_out elements,
 * or a dtype other than F32/F16/BF16, named), WK_EDEVICE, WK_ENOMEM.
 */
WK_MUST_CHECK wk_err be_cuda_core_upload(be_cuda_core *c, const wrk_mat *const *src,
                                         be_cuda_mat *const *dst, size_t n, wk_diag *d);

/* Device memory for n bytes (at least 1) in *p; WK_EDEVICE naming `what` when it cannot be had. */
WK_MUST_CHECK wk_err be_cuda_dalloc(void **p, size_t n, const char *what, wk_diag *d);

/* A device copy of n host floats in *out (caller frees with cudaFree). WK_EDEVICE. */
WK_MUST_CHECK wk_err be_cuda_upload_f32(const float *h, size_t n, float **out, const char *what,
                                        wk_diag *d);

/* K_DT_* of a wk_dtype (F32 for anything not 16-bit). */
int be_cuda_dtype(wk_dtype dt);

/*
 * dst[t * ldd + j] (epi, K_EPI_*) = sum_i x[t * w->k + i] W[i][j] for
 * t < T <= max(cap, lcap) rows as sized by be_cuda_core_scratch, j < w->n.
 * 16-bit weights: the activations are split into hi + lo halves of the
 * weights' type (k_split16) and multiplied in one GEMM over 2T columns with
 * fp32 accumulation; F32 weights multiply the fp32 activations directly.
 * Enqueued on c->stream.
 */
WK_MUST_CHECK wk_err be_cuda_gemm(be_cuda_core *c, const be_cuda_mat *w, const float *x, uint32_t T,
                                  float *dst, size_t ldd, int epi, wk_diag *d);

/* Device pointer to the pass metadata array `which` (BE_CUDA_M_*). */
static inline const uint32_t *
be_cuda_meta(const be_cuda_core *c, int which)
{
    return c->dmeta + (size_t)which * c->cap;
}

/* Runs the network over the pass c describes (T tokens, n_segs segments, n_logits rows). */
typedef wk_err (*be_cuda_pass_fn)(void *arg, wk_diag *d);

/*
 * The be.h step over c: checks every row (the CPU backend's errors and
 * messages, nothing changes on refusal), then c->pre_step(arg, rows, n)
 * when set (a refusal there must change nothing either), then zeroes the
 * slot of every reset row (be_row.reset, not padding) with cudaMemsetAsync
 * on c->stream, then cuts the rows into passes, copies each pass's
 * metadata to the device and calls pass(arg); padding rows (slot 0) get
 * zero logits. Returns when every pass is complete.
 */
WK_MUST_CHECK wk_err be_cuda_core_step(be_cuda_core *c, be_row *rows, size_t n,
                                       be_cuda_pass_fn pass, void *arg, wk_diag *d);

/*
 * Writes the final-normalised residual rows lpos[0..n-1] (device indices
 * into the pass) into out [n][head k] (device), enqueued on the core's stream.
 */
typedef wk_err (*be_cuda_norm_fn)(void *arg, const uint32_t *lpos, uint32_t n, float *out,
                                  wk_diag *d);

/*
 * The pass's logits: for each chunk of at most lcap logits rows, norm()
 * into xo ([lcap][head->k] device floats), the head GEMM (divided by
 * c->logit_div when it is set) and the copy into
 * the callers' buffers through pinned memory (synchronises the stream).
 */
WK_MUST_CHECK wk_err be_cuda_core_logits(be_cuda_core *c, const be_cuda_mat *head, float *xo,
                                         be_cuda_norm_fn norm, void *arg, wk_diag *d);

#endif /* BE_CUDA_COMMON_H */
