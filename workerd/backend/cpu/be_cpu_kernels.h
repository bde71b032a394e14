/*
 * be_cpu_kernels: the CPU backend's numeric kernels and its thread pool.
 *
 * Weights are packed once into column panels of BE_CPU_NR outputs:
 * data[panel][k][BE_CPU_NR] in the stored element type (F32, F16 or BF16),
 * zero-padded past n. A GEMM computes y[m][n] = sum_k x[m][k] * W[k][n] for
 * a range of panels, and every output element is one sequential fused
 * multiply-add chain over k = 0..K-1 starting from 0, whatever the ISA path
 * (AVX-512 or AVX2+FMA: identical bits), the blocking or the number of rows
 * m. That is what makes a row's result independent of the batch it is in
 * (batch invariance) and of the thread split. The scalar fallback (no FMA
 * unit) keeps the per-element order but rounds the product separately.
 *
 * Q8_0 weights (GGML blocks of 32 int8 along k with one fp16 scale per
 * output) keep 1.0625 bytes per weight in their panel: per panel, per block
 * of 32 k, the 32 outputs' fp16 scales (64 bytes) then the int8 values
 * [32 k][32 n] (1024 bytes). Activations stay fp32: each int8 is widened
 * exactly to fp32 and each output element is, per block, one FMA chain over
 * the block's 32 k in order from +0 (the block partial), then
 * acc = fma(d, partial, acc) over the blocks in order from +0. The scalar
 * path does the same with fmaf, so for Q8_0 all three paths give the same
 * bits (and, as for the other dtypes, independent of m and the threads).
 *
 * The `--cpu-matmul bf16` modes (BE_CPU_MATMUL_BF16 on AMX tiles,
 * BE_CPU_MATMUL_BF16_DP on AVX512-BF16 dot products) pack BF16 matrices in
 * k pairs instead and round the activations to bf16 for their products:
 * results no longer match the FMA chain's bits, but stay independent of m
 * and the threads (be_cpu_bf16.h says exactly what each computes). F32,
 * F16 and Q8_0 matrices keep the fp32 kernels in every mode.
 *
 * Kernels are selected at run time from the CPU's features; the baseline
 * build runs anywhere. WKVM_CPU_ISA=scalar|avx2|avx512 in the environment
 * forces a lower path (for tests and comparisons).
 *
 * Nothing here allocates on the hot path, logs or aborts.
 */
#ifndef BE_CPU_KERNELS_H
#define BE_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"
#include "wk_tensor.h"
#include "wrk_model.h"

#define BE_CPU_NR 32 /* output columns per packed panel */
#define BE_CPU_Q8_K 32 /* k per Q8_0 block */
#define BE_CPU_Q8_SCALE_BYTES (BE_CPU_NR * 2) /* fp16 scales at the head of a panel block */
#define BE_CPU_Q8_BLOCK_BYTES (BE_CPU_Q8_SCALE_BYTES + BE_CPU_Q8_K * BE_CPU_NR) /* 1088 */

typedef enum be_cpu_isa {
    BE_CPU_ISA_SCALAR = 0, /* portable C, no FMA */
    BE_CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    BE_CPU_ISA_AVX512 = 2, /* AVX-512F (+ FMA) */
} be_cpu_isa;

/* The best ISA this CPU supports, lowered by WKVM_CPU_ISA when set. */
be_cpu_isa be_cpu_isa_detect(void);

/* "scalar", "avx2", "avx512". */
const char *be_cpu_isa_name(be_cpu_isa isa);

/* How BF16-weight products are computed (--cpu-matmul). */
typedef enum be_cpu_matmul {
    BE_CPU_MATMUL_FP32 = 0, /* fp32 activations, one FMA chain per output (the default) */
    BE_CPU_MATMUL_BF16 = 1, /* bf16 activations on AMX tiles (be_cpu_bf16.h) */
    BE_CPU_MATMUL_BF16_DP = 2, /* bf16 activations on AVX512-BF16 dot products (be_cpu_bf16.h) */
} be_cpu_matmul;

/*
 * Whether this process can use AMX-BF16 tiles: the CPU has AMX-TILE,
 * AMX-BF16 and AVX-512F, and Linux granted the tile state (asked once, on
 * the first call). WKVM_CPU_AMX=off in the environment says no (tests).
 */
bool be_cpu_amx_enable(void);

/*
 * Whether this process can run AVX512-BF16 dot products (VDPBF16PS): the
 * build has the intrinsics and the CPU AVX-512F and AVX512_BF16 (asked once).
 * WKVM_CPU_BF16DP=off in the environment says no (tests).
 */
bool be_cpu_dp_enable(void);

/* The engine `--cpu-matmul bf16` takes here: AMX tiles when be_cpu_amx_enable(), else the dot
 * products when be_cpu_dp_enable(), else BE_CPU_MATMUL_FP32 (not available). */
be_cpu_matmul be_cpu_bf16_engine(void);

/* "fp32", "bf16-amx", "bf16-dp" (describe, logs). */
const char *be_cpu_matmul_name(be_cpu_matmul mode);

/* A packed weight matrix (K inputs -> N outputs). */
typedef struct be_cpu_mat {
    wk_dtype dtype;    /* element type of data */
    uint32_t k;        /* inputs */
    uint32_t n;        /* outputs */
    uint32_t n_panels; /* ceil(n / BE_CPU_NR) */
    void *data;        /* [n_panels][k][BE_CPU_NR], 64-byte aligned (Q8_0: [n_panels][k / 32]
                          blocks of BE_CPU_Q8_BLOCK_BYTES) */
    size_t bytes;      /* bytes at data */
    bool owned;        /* data is freed by be_cpu_mat_free */
    bool kpair;        /* BF16 packed in k pairs (BE_CPU_MATMUL_BF16 or _BF16_DP; be_cpu_bf16.h) */
    bool dp;           /* with kpair: products on AVX512-BF16 dot products, not AMX tiles */
} be_cpu_mat;

/* Bytes (a multiple of 64) the packed form of src takes; 0 when src is unusable. */
size_t be_cpu_mat_bytes(const wrk_mat *src);

/*
 * Sets dst up for src over mem (64-byte aligned, be_cpu_mat_bytes(src)
 * bytes, borrowed for dst's life). Returns WK_EINVAL for a bad src (no
 * tensor, empty, dtype not F32/F16/BF16/Q8_0, or Q8_0 whose blocks do not
 * run along k: in_major, or n_in not a multiple of 32).
 */
WK_MUST_CHECK wk_err be_cpu_mat_init(be_cpu_mat *dst, const wrk_mat *src, void *mem);

/*
 * Like be_cpu_mat_init over its own allocation (freed by be_cpu_mat_free).
 * Returns WK_ENOMEM or WK_EINVAL.
 */
WK_MUST_CHECK wk_err be_cpu_mat_alloc(be_cpu_mat *dst, const wrk_mat *src);

/*
 * A large buffer for weights or state: 2 MiB aligned, with transparent huge
 * pages requested (fewer TLB misses when streaming). Free with free().
 * NULL when out of memory.
 */
void *be_cpu_big_alloc(size_t bytes);

/* Fills panels [p0, p1) of dst from src. Thread-safe for disjoint ranges. */
void be_cpu_mat_pack_panels(be_cpu_mat *dst, const wrk_mat *src, uint32_t p0, uint32_t p1);

/*
 * The same three for a numeric mode: under BE_CPU_MATMUL_BF16 (_BF16_DP) a
 * BF16 src is packed for AMX tiles (dot products; the caller checked
 * be_cpu_amx_enable() or be_cpu_dp_enable()); other dtypes and
 * BE_CPU_MATMUL_FP32 give what the functions above give.
 */
size_t be_cpu_mat_bytes_as(const wrk_mat *src, be_cpu_matmul mode);
WK_MUST_CHECK wk_err be_cpu_mat_init_as(be_cpu_mat *dst, const wrk_mat *src, void *mem,
                                        be_cpu_matmul mode);
WK_MUST_CHECK wk_err be_cpu_mat_alloc_as(be_cpu_mat *dst, const wrk_mat *src, be_cpu_matmul mode);

/* Frees dst's data; leaves it zeroed. NULL-safe. */
void be_cpu_mat_free(be_cpu_mat *dst);

/* What a GEMM does with each finished element. */
typedef enum be_cpu_epi {
    BE_CPU_EPI_STORE = 0,   /* y = acc */
    BE_CPU_EPI_ADD = 1,     /* y += acc */
    BE_CPU_EPI_RELU2 = 2,   /* y = max(acc, 0)^2 */
    BE_CPU_EPI_TANH = 3,    /* y = tanh(acc) */
    BE_CPU_EPI_SIGMOID = 4, /* y = 1 / (1 + exp(-acc)) */
} be_cpu_epi;

/*
 * y[i][c] (op)= sum_k x[i][k] * W[k][c] for rows i < m and the columns of
 * panels [p0, p1) (clipped to w->n). x rows are ldx floats apart; output
 * rows are y + i * ldy, or yrows[i] when yrows is not NULL.
 */
void be_cpu_gemm(be_cpu_isa isa, const be_cpu_mat *w, const float *x, size_t ldx, uint32_t m,
                 float *y, size_t ldy, float *const *yrows, uint32_t p0, uint32_t p1,
                 be_cpu_epi epi);

/*
 * Panels per GEMM work unit that keep the microkernel at full width for m
 * rows (task ranges should be multiples of this).
 */
uint32_t be_cpu_gemm_panel_grain(be_cpu_isa isa, uint32_t m);

/*
 * One RWKV-7 WKV step for one head (N = head size), state S[i][j] with
 * i the value index and j the key index (row-major N x N):
 *   sa_i = sum_j S[i][j] a_j
 *   S[i][j] = S[i][j] w_j + sa_i b_j + v_i k_j
 *   y_i = sum_j S[i][j] r_j
 * a = -kk, b = kk * iclr as the caller computed them.
 */
void be_cpu_wkv_head(be_cpu_isa isa, uint32_t n, float *s, const float *r, const float *w,
                     const float *k, const float *v, const float *a, const float *b, float *y);

/* ------------------------------------------------------------------------ */
/* thread pool                                                               */
/* ------------------------------------------------------------------------ */

typedef struct be_cpu_pool be_cpu_pool;

/* A task body: runs task index `task` of the current job. */
typedef void (*be_cpu_pool_fn)(void *arg, uint32_t task);

/*
 * Starts n_threads - 1 workers (the caller is the n-th). n_threads 0 means
 * the number of CPUs this process may run on. Caller frees with
 * be_cpu_pool_free(). WK_ENOMEM / WK_EDEVICE (thread creation failed).
 */
WK_MUST_CHECK wk_err be_cpu_pool_new(uint32_t n_threads, be_cpu_pool **out);

/* Stops and joins the workers. NULL-safe. */
void be_cpu_pool_free(be_cpu_pool *p);

/* Threads including the caller. */
uint32_t be_cpu_pool_size(const be_cpu_pool *p);

/*
 * Runs fn(arg, t) for t in [0, n_tasks) on the pool and the calling thread,
 * returns when all are done. Tasks are taken in order by whichever thread
 * is free; a task must not depend on which thread runs it. One caller at a
 * time.
 */
void be_cpu_pool_run(be_cpu_pool *p, be_cpu_pool_fn fn, void *arg, uint32_t n_tasks);

#endif /* BE_CPU_KERNELS_H */
