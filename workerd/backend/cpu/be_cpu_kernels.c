/*
 * be_cpu_kernels: packed-panel GEMM and the WKV head update, with AVX-512,
 * AVX2+FMA and portable scalar paths chosen at run time.
 *
 * The GEMM invariant (see the header): each output element is one chain of
 * fused multiply-adds over k in order, so the result does not depend on
 * the blocking, the number of rows, the ISA path (AVX-512 and AVX2 give the
 * same bits) or the thread split. Do not add k-unrolling with several
 * partial sums, or a fast path that reorders k, without keeping that.
 *
 * Functions with a target attribute are only ever called after
 * be_cpu_isa_detect() said the CPU has the features. Never allocates on the
 * hot path, never logs.
 */
#include "be_cpu_kernels.h"
#include "be_cpu_bf16.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BE_CPU_X86 1
#else
#define BE_CPU_X86 0
#endif

/* ------------------------------------------------------------------------ */
/* ISA detection                                                             */
/* ------------------------------------------------------------------------ */

be_cpu_isa
be_cpu_isa_detect(void)
{
    be_cpu_isa best = BE_CPU_ISA_SCALAR;
#if BE_CPU_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        best = BE_CPU_ISA_AVX2;
    if (best == BE_CPU_ISA_AVX2 && __builtin_cpu_supports("avx512f"))
        best = BE_CPU_ISA_AVX512;
#endif
    const char *env = getenv("WKVM_CPU_ISA");
    if (env != NULL) {
        be_cpu_isa want = best;
        if (strcmp(env, "scalar") == 0)
            want = BE_CPU_ISA_SCALAR;
        else if (strcmp(env, "avx2") == 0)
            want = BE_CPU_ISA_AVX2;
        else if (strcmp(env, "avx512") == 0)
            want = BE_CPU_ISA_AVX512;
        if (want < best)
            best = want;
    }
    return best;
}

const char *
be_cpu_isa_name(be_cpu_isa isa)
{
    switch (isa) {
    case BE_CPU_ISA_SCALAR:
        return "scalar";
    case BE_CPU_ISA_AVX2:
        return "avx2";
    case BE_CPU_ISA_AVX512:
        return "avx512";
    }
    return "?";
}

/* ------------------------------------------------------------------------ */
/* packing                                                                   */
/* ------------------------------------------------------------------------ */

size_t
be_cpu_mat_bytes(const wrk_mat *src)
{
    return be_cpu_mat_bytes_as(src, BE_CPU_MATMUL_FP32);
}

/* Whether src is packed in k pairs (for AMX tiles or the dot products) under mode. */
static bool
be_cpu_mat_kpair(const wrk_mat *src, be_cpu_matmul mode)
{
    return mode != BE_CPU_MATMUL_FP32 && src->t->dtype == WK_DTYPE_BF16;
}

size_t
be_cpu_mat_bytes_as(const wrk_mat *src, be_cpu_matmul mode)
{
    if (src == NULL || src->t == NULL || src->n_in == 0 || src->n_out == 0)
        return 0;
    wk_dtype dt = src->t->dtype;
    size_t np = (src->n_out + BE_CPU_NR - 1) / BE_CPU_NR;
    if (dt == WK_DTYPE_Q8_0) {
        /* blocks must run along k: stored [n_out][n_in], n_in whole blocks */
        if (src->in_major || src->n_in % BE_CPU_Q8_K != 0 ||
            src->t->nbytes != (size_t)src->n_out * (src->n_in / BE_CPU_Q8_K) * WK_Q8_0_BYTES)
            return 0;
        return np * (src->n_in / BE_CPU_Q8_K) * BE_CPU_Q8_BLOCK_BYTES;
    }
    if (dt != WK_DTYPE_F32 && dt != WK_DTYPE_F16 && dt != WK_DTYPE_BF16)
        return 0;
    if (be_cpu_mat_kpair(src, mode))
        return np * be_cpu_kpair_kp(src->n_in) * BE_CPU_NR * 2; /* a multiple of 2048 */
    size_t bytes = np * src->n_in * BE_CPU_NR * wk_dtype_size(dt);
    return (bytes + 63) & ~(size_t)63;
}

wk_err
be_cpu_mat_init(be_cpu_mat *dst, const wrk_mat *src, void *mem)
{
    return be_cpu_mat_init_as(dst, src, mem, BE_CPU_MATMUL_FP32);
}

wk_err
be_cpu_mat_init_as(be_cpu_mat *dst, const wrk_mat *src, void *mem, be_cpu_matmul mode)
{
    memset(dst, 0, sizeof(*dst));
    size_t bytes = be_cpu_mat_bytes_as(src, mode);
    if (bytes == 0 || mem == NULL || ((uintptr_t)mem & 63) != 0)
        return WK_EINVAL;
    dst->dtype = src->t->dtype;
    dst->k = src->n_in;
    dst->n = src->n_out;
    dst->n_panels = (src->n_out + BE_CPU_NR - 1) / BE_CPU_NR;
    dst->data = mem;
    dst->bytes = bytes;
    dst->kpair = be_cpu_mat_kpair(src, mode);
    dst->dp = dst->kpair && mode == BE_CPU_MATMUL_BF16_DP;
    return WK_OK;
}

wk_err
be_cpu_mat_alloc(be_cpu_mat *dst, const wrk_mat *src)
{
    return be_cpu_mat_alloc_as(dst, src, BE_CPU_MATMUL_FP32);
}

wk_err
be_cpu_mat_alloc_as(be_cpu_mat *dst, const wrk_mat *src, be_cpu_matmul mode)
{
    memset(dst, 0, sizeof(*dst));
    size_t bytes = be_cpu_mat_bytes_as(src, mode);
    if (bytes == 0)
        return WK_EINVAL;
    void *p = aligned_alloc(64, bytes);
    if (p == NULL)
        return WK_ENOMEM;
    wk_err e = be_cpu_mat_init_as(dst, src, p, mode);
    if (e != WK_OK) {
        free(p);
        return e;
    }
    dst->owned = true;
    return WK_OK;
}

void *
be_cpu_big_alloc(size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    size_t len = (bytes + huge - 1) / huge * huge;
    void *p = NULL;
    if (len == 0 || posix_memalign(&p, huge, len) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, len, MADV_HUGEPAGE); /* advice only: 4 KiB pages work too */
#endif
    return p;
}

/* Q8_0 panels: per block of 32 k, 32 fp16 scales then [32 k][32 n] int8 (see the header). */
static void
be_cpu_mat_pack_q8(be_cpu_mat *dst, const wrk_mat *src, uint32_t p0, uint32_t p1)
{
    const size_t K = dst->k, N = dst->n, nblk = K / BE_CPU_Q8_K;
    const size_t row_bytes = nblk * WK_Q8_0_BYTES;
    const uint8_t *s = src->t->data;
    uint8_t *d = dst->data;

    for (uint32_t p = p0; p < p1; p++) {
        uint8_t *pd = d + (size_t)p * nblk * BE_CPU_Q8_BLOCK_BYTES;
        size_t c0 = (size_t)p * BE_CPU_NR;
        size_t nc = N - c0 < BE_CPU_NR ? N - c0 : BE_CPU_NR;
        if (nc < BE_CPU_NR)
            memset(pd, 0, nblk * BE_CPU_Q8_BLOCK_BYTES); /* padding: scale 0, q 0 */
        for (size_t c = 0; c < nc; c++) {
            const uint8_t *row = s + (c0 + c) * row_bytes;
            for (size_t b = 0; b < nblk; b++) {
                const uint8_t *blk = row + b * WK_Q8_0_BYTES;
                uint8_t *bd = pd + b * BE_CPU_Q8_BLOCK_BYTES;
                memcpy(bd + c * 2, blk, 2);
                for (size_t j = 0; j < BE_CPU_Q8_K; j++)
                    bd[BE_CPU_Q8_SCALE_BYTES + j * BE_CPU_NR + c] = blk[2 + j];
            }
        }
    }
}

void
be_cpu_mat_pack_panels(be_cpu_mat *dst, const wrk_mat *src, uint32_t p0, uint32_t p1)
{
    if (dst->kpair) {
        be_cpu_kpair_pack_panels(dst, src, p0, p1);
        return;
    }
    if (dst->dtype == WK_DTYPE_Q8_0) {
        be_cpu_mat_pack_q8(dst, src, p0, p1);
        return;
    }
    const size_t es = wk_dtype_size(dst->dtype);
    const size_t K = dst->k, N = dst->n;
    const uint8_t *s = src->t->data;
    uint8_t *d = dst->data;

    for (uint32_t p = p0; p < p1; p++) {
        uint8_t *pd = d + (size_t)p * K * BE_CPU_NR * es;
        size_t c0 = (size_t)p * BE_CPU_NR;
        size_t nc = N - c0 < BE_CPU_NR ? N - c0 : BE_CPU_NR;
        if (nc < BE_CPU_NR)
            memset(pd, 0, K * BE_CPU_NR * es);
        if (src->in_major) {
            /* stored [K][N]: a row slice per k */
            for (size_t k = 0; k < K; k++)
                memcpy(pd + k * BE_CPU_NR * es, s + (k * N + c0) * es, nc * es);
        } else {
            /* stored [N][K]: transpose in blocks of k for locality */
            for (size_t kb = 0; kb < K; kb += 64) {
                size_t ke = kb + 64 < K ? kb + 64 : K;
                for (size_t c = 0; c < nc; c++) {
                    const uint8_t *row = s + (c0 + c) * K * es;
                    if (es == 2) {
                        for (size_t k = kb; k < ke; k++)
                            memcpy(pd + (k * BE_CPU_NR + c) * 2, row + k * 2, 2);
                    } else {
                        for (size_t k = kb; k < ke; k++)
                            memcpy(pd + (k * BE_CPU_NR + c) * 4, row + k * 4, 4);
                    }
                }
            }
        }
    }
}

void
be_cpu_mat_free(be_cpu_mat *dst)
{
    if (dst == NULL)
        return;
    if (dst->owned)
        free(dst->data);
    memset(dst, 0, sizeof(*dst));
}

/* ------------------------------------------------------------------------ */
/* GEMM: shared pieces                                                       */
/* ------------------------------------------------------------------------ */

/* Applies epi to one finished element. */
static inline float
be_cpu_epi_apply(be_cpu_epi epi, float acc, float old)
{
    switch (epi) {
    case BE_CPU_EPI_STORE:
        return acc;
    case BE_CPU_EPI_ADD:
        return old + acc;
    case BE_CPU_EPI_RELU2: {
        float r = acc > 0.0f ? acc : 0.0f;
        return r * r;
    }
    case BE_CPU_EPI_TANH:
        return tanhf(acc);
    case BE_CPU_EPI_SIGMOID:
        return 1.0f / (1.0f + expf(-acc));
    }
    return acc;
}

/*
 * Writes a finished tile: mr rows of tile (row stride tw floats) into
 * columns [col0, col0 + nvalid) of rows m0.. of y.
 */
void
be_cpu_tile_out(const float *tile, uint32_t mr, uint32_t tw, uint32_t col0, uint32_t nvalid,
                float *y, size_t ldy, float *const *yrows, uint32_t m0, be_cpu_epi epi)
{
    for (uint32_t i = 0; i < mr; i++) {
        float *yr = (yrows != NULL ? yrows[m0 + i] : y + (size_t)(m0 + i) * ldy) + col0;
        const float *t = tile + (size_t)i * tw;
        switch (epi) {
        case BE_CPU_EPI_STORE:
            memcpy(yr, t, nvalid * sizeof(float));
            break;
        case BE_CPU_EPI_ADD:
            for (uint32_t c = 0; c < nvalid; c++)
                yr[c] = yr[c] + t[c];
            break;
        case BE_CPU_EPI_RELU2:
            for (uint32_t c = 0; c < nvalid; c++) {
                float r = t[c] > 0.0f ? t[c] : 0.0f;
                yr[c] = r * r;
            }
            break;
        default:
            for (uint32_t c = 0; c < nvalid; c++)
                yr[c] = be_cpu_epi_apply(epi, t[c], 0.0f);
            break;
        }
    }
}

/* How a microkernel writes its accumulators. */
enum {
    BE_CPU_OUT_STORE = 0, /* out = acc */
    BE_CPU_OUT_ADD = 1,   /* out = out + acc (the same sum as the tile path's ADD) */
    BE_CPU_OUT_RELU2 = 2, /* out = max(acc, 0)^2 (the same bits as the tile path) */
};

/* Balanced row blocks: nb blocks of size mr or mr - 1, mr <= mr_max. */
static void
be_cpu_row_blocks(uint32_t m, uint32_t mr_max, uint32_t *nb, uint32_t *base, uint32_t *extra)
{
    *nb = (m + mr_max - 1) / mr_max;
    *base = m / *nb;
    *extra = m % *nb;
}

/* ------------------------------------------------------------------------ */
/* GEMM: scalar                                                              */
/* ------------------------------------------------------------------------ */

static float
be_cpu_load1(wk_dtype dt, const void *p, size_t i)
{
    switch (dt) {
    case WK_DTYPE_F32:
        return ((const float *)p)[i];
    case WK_DTYPE_BF16:
        return wk_bf16_to_f32(((const uint16_t *)p)[i]);
    case WK_DTYPE_F16:
        return wk_f16_to_f32(((const uint16_t *)p)[i]);
    case WK_DTYPE_Q8_0:
        break; /* be_cpu_gemm_scalar_q8 */
    }
    return 0.0f;
}

/*
 * Q8_0, portable: the same chains as the vector paths, with fmaf, so the
 * scalar path gives the same bits as AVX2 and AVX-512 for Q8_0 weights:
 * per block part = fma(x_k, q_k, part) over its 32 k in order from +0,
 * then acc = fma(d, part, acc) over the blocks in order from +0.
 */
static void
be_cpu_gemm_scalar_q8(const be_cpu_mat *w, const float *x, size_t ldx, uint32_t m, float *y,
                      size_t ldy, float *const *yrows, uint32_t p0, uint32_t p1, be_cpu_epi epi)
{
    const size_t nblk = w->k / BE_CPU_Q8_K;
    float acc[BE_CPU_NR], part[BE_CPU_NR], dv[BE_CPU_NR];
    for (uint32_t p = p0; p < p1; p++) {
        const uint8_t *pw = (const uint8_t *)w->data + (size_t)p * nblk * BE_CPU_Q8_BLOCK_BYTES;
        uint32_t col0 = p * BE_CPU_NR;
        uint32_t nvalid = w->n - col0 < BE_CPU_NR ? w->n - col0 : BE_CPU_NR;
        for (uint32_t i = 0; i < m; i++) {
            const float *xr = x + (size_t)i * ldx;
            for (int c = 0; c < BE_CPU_NR; c++)
                acc[c] = 0.0f;
            for (size_t b = 0; b < nblk; b++) {
                const uint8_t *bp = pw + b * BE_CPU_Q8_BLOCK_BYTES;
                const int8_t *qp = (const int8_t *)(bp + BE_CPU_Q8_SCALE_BYTES);
                for (int c = 0; c < BE_CPU_NR; c++)
                    part[c] = 0.0f;
                for (size_t j = 0; j < BE_CPU_Q8_K; j++) {
                    const float xv = xr[b * BE_CPU_Q8_K + j];
                    for (int c = 0; c < BE_CPU_NR; c++)
                        part[c] = fmaf(xv, (float)qp[j * BE_CPU_NR + (size_t)c], part[c]);
                }
                for (int c = 0; c < BE_CPU_NR; c++)
                    dv[c] = wk_f16_to_f32((uint16_t)(bp[2 * c] | bp[2 * c + 1] << 8));
                for (int c = 0; c < BE_CPU_NR; c++)
                    acc[c] = fmaf(dv[c], part[c], acc[c]);
            }
            be_cpu_tile_out(acc, 1, BE_CPU_NR, col0, nvalid, y, ldy, yrows, i, epi);
        }
    }
}

static void
be_cpu_gemm_scalar(const be_cpu_mat *w, const float *x, size_t ldx, uint32_t m, float *y,
                   size_t ldy, float *const *yrows, uint32_t p0, uint32_t p1, be_cpu_epi epi)
{
    if (w->dtype == WK_DTYPE_Q8_0) {
        be_cpu_gemm_scalar_q8(w, x, ldx, m, y, ldy, yrows, p0, p1, epi);
        return;
    }
    const size_t K = w->k, es = wk_dtype_size(w->dtype);
    float wrow[BE_CPU_NR];
    float acc[BE_CPU_NR];
    for (uint32_t p = p0; p < p1; p++) {
        const uint8_t *pw = (const uint8_t *)w->data + (size_t)p * K * BE_CPU_NR * es;
        uint32_t col0 = p * BE_CPU_NR;
        uint32_t nvalid = w->n - col0 < BE_CPU_NR ? w->n - col0 : BE_CPU_NR;
        for (uint32_t i = 0; i < m; i++) {
            const float *xr = x + (size_t)i * ldx;
            for (int c = 0; c < BE_CPU_NR; c++)
                acc[c] = 0.0f;
            for (size_t k = 0; k < K; k++) {
                const float xv = xr[k];
                for (int c = 0; c < BE_CPU_NR; c++)
                    wrow[c] = be_cpu_load1(w->dtype, pw, k * BE_CPU_NR + (size_t)c);
                for (int c = 0; c < BE_CPU_NR; c++)
                    acc[c] = acc[c] + xv * wrow[c];
            }
            be_cpu_tile_out(acc, 1, BE_CPU_NR, col0, nvalid, y, ldy, yrows, i, epi);
        }
    }
}

#if BE_CPU_X86

/* ------------------------------------------------------------------------ */
/* GEMM: AVX-512 (16 floats per vector, 2 vectors per panel)                 */
/* ------------------------------------------------------------------------ */

#define BE_T512 __attribute__((target("avx512f,fma,f16c"), noinline))

/* Writes one finished vector of 16 outputs as mode says (BE_CPU_OUT_*). */
static inline __attribute__((target("avx512f"), always_inline)) void
k512_store(float *o, __m512 r, int mode)
{
    if (mode == BE_CPU_OUT_ADD)
        r = _mm512_add_ps(_mm512_loadu_ps(o), r);
    else if (mode == BE_CPU_OUT_RELU2) {
        r = _mm512_max_ps(r, _mm512_setzero_ps());
        r = _mm512_mul_ps(r, r);
    }
    _mm512_storeu_ps(o, r);
}

/*
 * Software prefetch distance in weight rows (k), used by the kernels that
 * walk a single panel (7..12 rows here, 4..6 in AVX2): one weight stream
 * leaves the hardware prefetchers short of requests, and each 4 KiB
 * boundary costs a miss the FMAs cannot hide (measured here: 8 rows x 65536
 * columns 69 -> 95 GFLOP/s per core, 256 x 768 x 3072 99 -> 103). Kernels
 * over 2..4 panels have enough streams for compute, but the BF16 1..3-row
 * tiles (K512B_DEF: decode batch 1, bandwidth-bound) prefetch too: CPU time
 * of 64 batch-1 decode steps of a 975 MB BF16 model, 2 threads, 4.27 -> 3.93
 * s (mean of 3 alternating runs each, ~1.4 s of it loading). A prefetch
 * past the end of a panel touches the next panel or the weights block's
 * padding, and a prefetch never faults anyway.
 */
#define BE_CPU_PF_ROWS 32

#define LD512_F32(p) _mm512_load_ps((const float *)(p))
#define LD512_BF16(p)                                                                      \
    _mm512_castsi512_ps(_mm512_slli_epi32(                                                 \
        _mm512_cvtepu16_epi32(_mm256_load_si256((const __m256i *)(const void *)(p))), 16))
#define LD512_F16(p) _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)(p)))

/*
 * Microkernel: MR rows x NV vectors (16 columns each) starting at vector q0
 * of the panel layout; writes the accumulators to tile[MR][NV*16].
 */
#define K512_DEF(DT, ET, MR, NV)                                                           \
    static BE_T512 void k512_##DT##_##MR##_##NV(const float *x, size_t ldx, const ET *w,    \
                                               size_t ps, uint32_t q0, uint32_t K,          \
                                               float *out, size_t ldo, int mode)            \
    {                                                                                      \
        __m512 acc[MR][NV];                                                                \
        const ET *wp[NV];                                                                  \
        _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) wp[v] =                      \
            w + (size_t)((q0 + v) >> 1) * ps + (size_t)((q0 + v) & 1) * 16;                \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                              \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) acc[i][v] =              \
                _mm512_setzero_ps();                                                       \
        for (uint32_t k = 0; k < K; k++) {                                                 \
            __m512 wv[NV];                                                                 \
            if (MR >= 7) /* see BE_CPU_PF_ROWS */                                          \
                _Pragma("GCC unroll 16") for (int v = 0; v < NV;                           \
                                              v += (sizeof(ET) == 2 ? 2 : 1))              \
                    _mm_prefetch((const char *)(wp[v] + ((size_t)k + BE_CPU_PF_ROWS) *     \
                                                            BE_CPU_NR),                    \
                                 _MM_HINT_T0);                                             \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) wv[v] =                  \
                LD512_##DT(wp[v] + (size_t)k * BE_CPU_NR);                                 \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                          \
            {                                                                              \
                const __m512 xb = _mm512_set1_ps(x[(size_t)i * ldx + k]);                  \
                _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) acc[i][v] =          \
                    _mm512_fmadd_ps(wv[v], xb, acc[i][v]);                                 \
            }                                                                              \
        }                                                                                  \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                              \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++)                          \
            k512_store(out + (size_t)i * ldo + (size_t)v * 16, acc[i][v], mode);           \
    }

/*
 * BF16 over whole panels (NV even, q0 even: always so on this path, whose
 * panels are 2 vectors and whose tiles are whole panels): one 64-byte load
 * holds a panel row's 32 values; shifting each 32-bit lane left by 16
 * gives the even columns as fp32, masking off its low half the odd ones
 * (2 integer operations per panel row, where widening each half takes 4).
 * The accumulators then hold even / odd columns and are interleaved back
 * once at the end: every element is still the one FMA chain of
 * K512_DEF(BF16, ...), so the bits are the same.
 */
#define K512B_DEF(MR, NV)                                                                  \
    static BE_T512 void k512_BF16_##MR##_##NV(const float *x, size_t ldx, const uint16_t *w, \
                                             size_t ps, uint32_t q0, uint32_t K,            \
                                             float *out, size_t ldo, int mode)              \
    {                                                                                      \
        enum { NP = NV / 2 };                                                              \
        __m512 ae[MR][NP], ao[MR][NP];                                                     \
        const uint16_t *wp[NP];                                                            \
        const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);                            \
        _Pragma("GCC unroll 16") for (int p = 0; p < NP; p++) wp[p] =                      \
            w + (size_t)(q0 / 2 + (uint32_t)p) * ps;                                       \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                              \
            _Pragma("GCC unroll 16") for (int p = 0; p < NP; p++)                          \
        {                                                                                  \
            ae[i][p] = _mm512_setzero_ps();                                                \
            ao[i][p] = _mm512_setzero_ps();                                                \
        }                                                                                  \
        for (uint32_t k = 0; k < K; k++) {                                                 \
            __m512 we[NP], wo[NP];                                                         \
            if (MR >= 7 || MR <= 3) /* see BE_CPU_PF_ROWS */                                \
                _Pragma("GCC unroll 16") for (int p = 0; p < NP; p++) _mm_prefetch(         \
                    (const char *)(wp[p] + ((size_t)k + BE_CPU_PF_ROWS) * BE_CPU_NR),      \
                    _MM_HINT_T0);                                                          \
            _Pragma("GCC unroll 16") for (int p = 0; p < NP; p++)                          \
            {                                                                              \
                const __m512i r =                                                          \
                    _mm512_load_si512((const void *)(wp[p] + (size_t)k * BE_CPU_NR));      \
                we[p] = _mm512_castsi512_ps(_mm512_slli_epi32(r, 16));                     \
                wo[p] = _mm512_castsi512_ps(_mm512_and_si512(r, hi));                      \
            }                                                                              \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                          \
            {                                                                              \
                const __m512 xb = _mm512_set1_ps(x[(size_t)i * ldx + k]);                  \
                _Pragma("GCC unroll 16") for (int p = 0; p < NP; p++)                      \
                {                                                                          \
                    ae[i][p] = _mm512_fmadd_ps(we[p], xb, ae[i][p]);                       \
                    ao[i][p] = _mm512_fmadd_ps(wo[p], xb, ao[i][p]);                       \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        const __m512i lo_idx =                                                             \
            _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);      \
        const __m512i hi_idx =                                                             \
            _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8); \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                              \
            _Pragma("GCC unroll 16") for (int p = 0; p < NP; p++)                          \
        {                                                                                  \
            float *o = out + (size_t)i * ldo + (size_t)p * 32;                             \
            k512_store(o, _mm512_permutex2var_ps(ae[i][p], lo_idx, ao[i][p]), mode);       \
            k512_store(o + 16, _mm512_permutex2var_ps(ae[i][p], hi_idx, ao[i][p]), mode);  \
        }                                                                                  \
    }

typedef void (*k512_fn)(const float *, size_t, const void *, size_t, uint32_t, uint32_t,
                        float *, size_t, int);

/* rows 1..3: up to 8 vectors; 4..6: up to 4; 7..12: up to 2 (<= 24 accumulators) */
#define K512_ROWS_8(DT, ET, MR)                                                            \
    K512_DEF(DT, ET, MR, 1)                                                                \
    K512_DEF(DT, ET, MR, 2)                                                                \
    K512_DEF(DT, ET, MR, 3)                                                                \
    K512_DEF(DT, ET, MR, 4)                                                                \
    K512_DEF(DT, ET, MR, 5)                                                                \
    K512_DEF(DT, ET, MR, 6)                                                                \
    K512_DEF(DT, ET, MR, 7)                                                                \
    K512_DEF(DT, ET, MR, 8)
#define K512_ROWS_4(DT, ET, MR)                                                            \
    K512_DEF(DT, ET, MR, 1)                                                                \
    K512_DEF(DT, ET, MR, 2)                                                                \
    K512_DEF(DT, ET, MR, 3)                                                                \
    K512_DEF(DT, ET, MR, 4)
#define K512_ROWS_2(DT, ET, MR)                                                            \
    K512_DEF(DT, ET, MR, 1)                                                                \
    K512_DEF(DT, ET, MR, 2)
#define K512_ALL(DT, ET)                                                                   \
    K512_ROWS_8(DT, ET, 1)                                                                 \
    K512_ROWS_8(DT, ET, 2)                                                                 \
    K512_ROWS_8(DT, ET, 3)                                                                 \
    K512_ROWS_4(DT, ET, 4)                                                                 \
    K512_ROWS_4(DT, ET, 5)                                                                 \
    K512_ROWS_4(DT, ET, 6)                                                                 \
    K512_ROWS_2(DT, ET, 7)                                                                 \
    K512_ROWS_2(DT, ET, 8)                                                                 \
    K512_ROWS_2(DT, ET, 9)                                                                 \
    K512_ROWS_2(DT, ET, 10)                                                                \
    K512_ROWS_2(DT, ET, 11)                                                                \
    K512_ROWS_2(DT, ET, 12)

K512_ALL(F32, float)
K512_ALL(F16, uint16_t)

/* BF16: the odd vector counts (unused on this path: see K512B_DEF) as K512_DEF */
#define K512B_ROWS_8(MR)                                                                   \
    K512_DEF(BF16, uint16_t, MR, 1)                                                        \
    K512B_DEF(MR, 2)                                                                       \
    K512_DEF(BF16, uint16_t, MR, 3)                                                        \
    K512B_DEF(MR, 4)                                                                       \
    K512_DEF(BF16, uint16_t, MR, 5)                                                        \
    K512B_DEF(MR, 6)                                                                       \
    K512_DEF(BF16, uint16_t, MR, 7)                                                        \
    K512B_DEF(MR, 8)
#define K512B_ROWS_4(MR)                                                                   \
    K512_DEF(BF16, uint16_t, MR, 1)                                                        \
    K512B_DEF(MR, 2)                                                                       \
    K512_DEF(BF16, uint16_t, MR, 3)                                                        \
    K512B_DEF(MR, 4)
#define K512B_ROWS_2(MR)                                                                   \
    K512_DEF(BF16, uint16_t, MR, 1)                                                        \
    K512B_DEF(MR, 2)
K512B_ROWS_8(1)
K512B_ROWS_8(2)
K512B_ROWS_8(3)
K512B_ROWS_4(4)
K512B_ROWS_4(5)
K512B_ROWS_4(6)
K512B_ROWS_2(7)
K512B_ROWS_2(8)
K512B_ROWS_2(9)
K512B_ROWS_2(10)
K512B_ROWS_2(11)
K512B_ROWS_2(12)

#define K512_T8(DT, MR)                                                                    \
    {(k512_fn)k512_##DT##_##MR##_1, (k512_fn)k512_##DT##_##MR##_2,                         \
     (k512_fn)k512_##DT##_##MR##_3, (k512_fn)k512_##DT##_##MR##_4,                         \
     (k512_fn)k512_##DT##_##MR##_5, (k512_fn)k512_##DT##_##MR##_6,                         \
     (k512_fn)k512_##DT##_##MR##_7, (k512_fn)k512_##DT##_##MR##_8}
#define K512_T4(DT, MR)                                                                    \
    {(k512_fn)k512_##DT##_##MR##_1, (k512_fn)k512_##DT##_##MR##_2,                         \
     (k512_fn)k512_##DT##_##MR##_3, (k512_fn)k512_##DT##_##MR##_4}
#define K512_T2(DT, MR) {(k512_fn)k512_##DT##_##MR##_1, (k512_fn)k512_##DT##_##MR##_2}
#define K512_TAB(DT)                                                                       \
    {{0}, K512_T8(DT, 1), K512_T8(DT, 2), K512_T8(DT, 3), K512_T4(DT, 4), K512_T4(DT, 5),     \
     K512_T4(DT, 6), K512_T2(DT, 7), K512_T2(DT, 8), K512_T2(DT, 9), K512_T2(DT, 10),        \
     K512_T2(DT, 11), K512_T2(DT, 12)}

/* [dtype][rows][vectors - 1] */
static const k512_fn k512_tab[3][13][8] = {
    [WK_DTYPE_F32] = K512_TAB(F32),
    [WK_DTYPE_F16] = K512_TAB(F16),
    [WK_DTYPE_BF16] = K512_TAB(BF16),
};

static uint32_t
k512_nv_max(uint32_t mr)
{
    return mr <= 3 ? 8 : mr <= 6 ? 4 : 2;
}

/*
 * Q8_0 microkernel: MR rows x NV vectors of 16 columns from vector q0. w is
 * the packed block (bytes), ps the panel stride in bytes. Per block of 32 k
 * each element's partial is one FMA chain over the block's k in order from
 * +0 (int8 widened exactly to fp32), then acc = fma(d, partial, acc), blocks
 * in order from +0: the AVX2 and scalar paths do the same operations.
 */
#define K512Q_DEF(MR, NV)                                                                  \
    static BE_T512 void k512_Q8_##MR##_##NV(const float *x, size_t ldx, const uint8_t *w,   \
                                           size_t ps, uint32_t q0, uint32_t K, float *out, \
                                           size_t ldo, int mode)                           \
    {                                                                                      \
        __m512 acc[MR][NV];                                                                \
        const uint8_t *wp[NV];                                                             \
        _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) wp[v] =                      \
            w + (size_t)((q0 + v) >> 1) * ps + (size_t)((q0 + v) & 1) * 16;                \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                              \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) acc[i][v] =              \
                _mm512_setzero_ps();                                                       \
        const uint32_t nblk = K / BE_CPU_Q8_K;                                             \
        for (uint32_t b = 0; b < nblk; b++) {                                              \
            __m512 part[MR][NV];                                                           \
            const size_t bo = (size_t)b * BE_CPU_Q8_BLOCK_BYTES;                           \
            const float *xb = x + (size_t)b * BE_CPU_Q8_K;                                 \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                          \
                _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) part[i][v] =         \
                    _mm512_setzero_ps();                                                   \
            if (MR >= 4)                                                                   \
                _Pragma("GCC unroll 16") for (int v = 0; v < NV; v += 2)                   \
                    for (int l = 0; l < BE_CPU_Q8_BLOCK_BYTES; l += 64)                    \
                        _mm_prefetch((const char *)(wp[v] + bo + 2 * BE_CPU_Q8_BLOCK_BYTES \
                                                    + l), _MM_HINT_T0);                    \
            _Pragma("GCC unroll 4") for (int j = 0; j < BE_CPU_Q8_K; j++)                  \
            {                                                                              \
                __m512 wv[NV];                                                             \
                _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) wv[v] =              \
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(               \
                        (const __m128i *)(const void *)(wp[v] + bo + BE_CPU_Q8_SCALE_BYTES \
                                                        + (size_t)j * BE_CPU_NR))));       \
                _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                      \
                {                                                                          \
                    const __m512 xv = _mm512_set1_ps(xb[(size_t)i * ldx + j]);             \
                    _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) part[i][v] =     \
                        _mm512_fmadd_ps(xv, wv[v], part[i][v]);                            \
                }                                                                          \
            }                                                                              \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++)                          \
            {                                                                              \
                const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(                      \
                    (const __m256i *)(const void *)(wp[v] - (size_t)((q0 + v) & 1) * 16 +  \
                                                    bo + (size_t)((q0 + v) & 1) * 32)));   \
                _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) acc[i][v] =          \
                    _mm512_fmadd_ps(dv, part[i][v], acc[i][v]);                            \
            }                                                                              \
        }                                                                                  \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                              \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++)                          \
            k512_store(out + (size_t)i * ldo + (size_t)v * 16, acc[i][v], mode);           \
    }

#define K512Q_ROWS_8(MR)                                                                   \
    K512Q_DEF(MR, 1) K512Q_DEF(MR, 2) K512Q_DEF(MR, 3) K512Q_DEF(MR, 4) K512Q_DEF(MR, 5)     \
        K512Q_DEF(MR, 6) K512Q_DEF(MR, 7) K512Q_DEF(MR, 8)
#define K512Q_ROWS_4(MR) K512Q_DEF(MR, 1) K512Q_DEF(MR, 2) K512Q_DEF(MR, 3) K512Q_DEF(MR, 4)
#define K512Q_ROWS_2(MR) K512Q_DEF(MR, 1) K512Q_DEF(MR, 2)
K512Q_ROWS_8(1)
K512Q_ROWS_8(2)
K512Q_ROWS_8(3)
K512Q_ROWS_4(4)
K512Q_ROWS_4(5)
K512Q_ROWS_4(6)
K512Q_ROWS_2(7)
K512Q_ROWS_2(8)
K512Q_ROWS_2(9)
K512Q_ROWS_2(10)
K512Q_ROWS_2(11)
K512Q_ROWS_2(12)

static const k512_fn k512_q8_tab[13][8] = K512_TAB(Q8);

/*
 * Q8_0, one row (decode batch 1): the panels of [q0, q0 + nv) one after
 * the other, so the weights are read as one sequential stream (the panels
 * are contiguous), with a software prefetch BE_CPU_Q8_ROW_PF blocks ahead.
 * The same operations as k512_Q8_1_*: the partials of BE_CPU_Q8_ROW_BLOCKS
 * consecutive blocks are independent chains (each from +0), computed side
 * by side to hide the FMA latency within one panel, then folded into acc in
 * block order. Measured here (one thread, 768 x 65536 from DRAM): about
 * 2.0 ms with the 4-panel kernel, 1.3 ms with this one (2 blocks side by
 * side, prefetch 12 blocks ahead); without the prefetch, or with 4 blocks
 * side by side, it was slower than the 4-panel kernel. A prefetch past a
 * panel's end touches the next panel (read next) or the weights block's
 * padding; a prefetch never faults.
 */
#define BE_CPU_Q8_ROW_BLOCKS 2
#define BE_CPU_Q8_ROW_PF 12

static inline __attribute__((target("avx512f"), always_inline)) __m512
k512_q8_widen(const uint8_t *p)
{
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)));
}

/*
 * n (1 or BE_CPU_Q8_ROW_BLOCKS) consecutive blocks at bp of one panel pair
 * against x at xb: each block's partials from +0, side by side, then folded
 * into acc0/acc1 in block order.
 */
static inline __attribute__((target("avx512f,fma,f16c"), always_inline)) void
k512_q8_blocks(const uint8_t *bp, const float *xb, int n, __m512 *acc0, __m512 *acc1)
{
    __m512 p0[BE_CPU_Q8_ROW_BLOCKS], p1[BE_CPU_Q8_ROW_BLOCKS];
    _Pragma("GCC unroll 8") for (int u = 0; u < n; u++)
    {
        p0[u] = _mm512_setzero_ps();
        p1[u] = _mm512_setzero_ps();
    }
    _Pragma("GCC unroll 2") for (int j = 0; j < BE_CPU_Q8_K; j++)
    {
        _Pragma("GCC unroll 8") for (int u = 0; u < n; u++)
        {
            const uint8_t *qp = bp + (size_t)u * BE_CPU_Q8_BLOCK_BYTES + BE_CPU_Q8_SCALE_BYTES +
                                (size_t)j * BE_CPU_NR;
            const __m512 xv = _mm512_set1_ps(xb[(size_t)u * BE_CPU_Q8_K + j]);
            p0[u] = _mm512_fmadd_ps(xv, k512_q8_widen(qp), p0[u]);
            p1[u] = _mm512_fmadd_ps(xv, k512_q8_widen(qp + 16), p1[u]);
        }
    }
    _Pragma("GCC unroll 8") for (int u = 0; u < n; u++)
    {
        const uint8_t *sp = bp + (size_t)u * BE_CPU_Q8_BLOCK_BYTES;
        *acc0 = _mm512_fmadd_ps(
            _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)sp)), p0[u], *acc0);
        *acc1 = _mm512_fmadd_ps(
            _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(sp + 32))), p1[u],
            *acc1);
    }
}

static BE_T512 void
k512_q8_row(const float *x, const uint8_t *w, size_t ps, uint32_t q0, uint32_t nv, uint32_t K,
            float *out, int mode)
{
    const uint32_t nblk = K / BE_CPU_Q8_K;
    for (uint32_t v = 0; v < nv; v += 2) {
        const uint8_t *pw = w + (size_t)((q0 + v) >> 1) * ps;
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
        uint32_t b = 0;
        for (; b + BE_CPU_Q8_ROW_BLOCKS <= nblk; b += BE_CPU_Q8_ROW_BLOCKS) {
            const uint8_t *bp = pw + (size_t)b * BE_CPU_Q8_BLOCK_BYTES;
            for (int l = 0; l < BE_CPU_Q8_ROW_BLOCKS * BE_CPU_Q8_BLOCK_BYTES; l += 64)
                _mm_prefetch((const char *)(bp + BE_CPU_Q8_ROW_PF * BE_CPU_Q8_BLOCK_BYTES + l),
                             _MM_HINT_T0);
            k512_q8_blocks(bp, x + (size_t)b * BE_CPU_Q8_K, BE_CPU_Q8_ROW_BLOCKS, &acc0, &acc1);
        }
        for (; b < nblk; b++)
            k512_q8_blocks(pw + (size_t)b * BE_CPU_Q8_BLOCK_BYTES, x + (size_t)b * BE_CPU_Q8_K, 1,
                           &acc0, &acc1);
        k512_store(out + (size_t)v * 16, acc0, mode);
        k512_store(out + (size_t)(v + 1) * 16, acc1, mode);
    }
}

/* The generic driver for a vector ISA: VW floats per vector, VPP per panel. */
static void
be_cpu_gemm_vec(const be_cpu_mat *w, const float *x, size_t ldx, uint32_t m, float *y,
                size_t ldy, float *const *yrows, uint32_t p0, uint32_t p1, be_cpu_epi epi,
                uint32_t vw, uint32_t mr_max, uint32_t (*nv_max)(uint32_t),
                void (*kern)(wk_dtype, uint32_t, uint32_t, const float *, size_t, const void *,
                             size_t, uint32_t, uint32_t, float *, size_t, int))
{
    const uint32_t vpp = BE_CPU_NR / vw;
    /* panel stride: elements, or bytes for Q8_0 */
    const size_t ps = w->dtype == WK_DTYPE_Q8_0
                          ? (size_t)(w->k / BE_CPU_Q8_K) * BE_CPU_Q8_BLOCK_BYTES
                          : (size_t)w->k * BE_CPU_NR;
    float tile[24 * 16] __attribute__((aligned(64)));
    uint32_t nb, base, extra;

    if (m == 0 || p0 >= p1)
        return;
    be_cpu_row_blocks(m, mr_max, &nb, &base, &extra);
    /* column chunks: a few panels whose weights stay in L2 across row blocks */
    const uint32_t chunk = m <= 3 ? 4 : 2;
    for (uint32_t pc = p0; pc < p1; pc += chunk) {
        const uint32_t pe = pc + chunk < p1 ? pc + chunk : p1;
        uint32_t row = 0;
        for (uint32_t b = 0; b < nb; b++) {
            const uint32_t mr = base + (b < extra ? 1 : 0);
            const uint32_t nvm = nv_max(mr);
            uint32_t q = pc * vpp;
            const uint32_t qe = pe * vpp;
            while (q < qe) {
                uint32_t nv = qe - q < nvm ? qe - q : nvm;
                uint32_t col0 = q * vw;
                if (col0 >= w->n)
                    break;
                const uint32_t ncol = nv * vw;
                const uint32_t nvalid = w->n - col0 < ncol ? w->n - col0 : ncol;
                const float *xr = x + (size_t)row * ldx;
                if (nvalid == ncol && yrows == NULL &&
                    (epi == BE_CPU_EPI_STORE || epi == BE_CPU_EPI_ADD ||
                     epi == BE_CPU_EPI_RELU2)) {
                    /* whole tile straight into y */
                    kern(w->dtype, mr, nv, xr, ldx, w->data, ps, q, w->k,
                         y + (size_t)row * ldy + col0, ldy,
                         epi == BE_CPU_EPI_ADD     ? BE_CPU_OUT_ADD
                         : epi == BE_CPU_EPI_RELU2 ? BE_CPU_OUT_RELU2
                                                   : BE_CPU_OUT_STORE);
                } else {
                    kern(w->dtype, mr, nv, xr, ldx, w->data, ps, q, w->k, tile, ncol,
                         BE_CPU_OUT_STORE);
                    be_cpu_tile_out(tile, mr, ncol, col0, nvalid, y, ldy, yrows, row, epi);
                }
                q += nv;
            }
            row += mr;
        }
    }
}

static void
k512_call(wk_dtype dt, uint32_t mr, uint32_t nv, const float *x, size_t ldx, const void *w,
          size_t ps, uint32_t q0, uint32_t K, float *out, size_t ldo, int mode)
{
    if (dt == WK_DTYPE_Q8_0 && mr == 1 && q0 % 2 == 0 && nv % 2 == 0)
        k512_q8_row(x, w, ps, q0, nv, K, out, mode);
    else if (dt == WK_DTYPE_Q8_0)
        k512_q8_tab[mr][nv - 1](x, ldx, w, ps, q0, K, out, ldo, mode);
    else
        k512_tab[dt][mr][nv - 1](x, ldx, w, ps, q0, K, out, ldo, mode);
}

/* ------------------------------------------------------------------------ */
/* GEMM: AVX2 + FMA (8 floats per vector, 4 vectors per panel)               */
/* ------------------------------------------------------------------------ */

#define BE_T256 __attribute__((target("avx2,fma,f16c"), noinline))

/* Writes one finished vector of 8 outputs as mode says (BE_CPU_OUT_*). */
static inline __attribute__((target("avx2"), always_inline)) void
k256_store(float *o, __m256 r, int mode)
{
    if (mode == BE_CPU_OUT_ADD)
        r = _mm256_add_ps(_mm256_loadu_ps(o), r);
    else if (mode == BE_CPU_OUT_RELU2) {
        r = _mm256_max_ps(r, _mm256_setzero_ps());
        r = _mm256_mul_ps(r, r);
    }
    _mm256_storeu_ps(o, r);
}

#define LD256_F32(p) _mm256_load_ps((const float *)(p))
#define LD256_BF16(p)                                                                      \
    _mm256_castsi256_ps(_mm256_slli_epi32(                                                 \
        _mm256_cvtepu16_epi32(_mm_load_si128((const __m128i *)(const void *)(p))), 16))
#define LD256_F16(p) _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)(p)))

#define K256_DEF(DT, ET, MR, NV)                                                           \
    static BE_T256 void k256_##DT##_##MR##_##NV(const float *x, size_t ldx, const ET *w,    \
                                               size_t ps, uint32_t q0, uint32_t K,          \
                                               float *out, size_t ldo, int mode)            \
    {                                                                                      \
        __m256 acc[MR][NV];                                                                \
        const ET *wp[NV];                                                                  \
        _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) wp[v] =                      \
            w + (size_t)((q0 + v) >> 2) * ps + (size_t)((q0 + v) & 3) * 8;                 \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                              \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) acc[i][v] =              \
                _mm256_setzero_ps();                                                       \
        for (uint32_t k = 0; k < K; k++) {                                                 \
            __m256 wv[NV];                                                                 \
            if (MR >= 4) /* see BE_CPU_PF_ROWS */                                          \
                _mm_prefetch((const char *)(wp[0] + ((size_t)k + BE_CPU_PF_ROWS) *         \
                                                        BE_CPU_NR),                        \
                             _MM_HINT_T0);                                                 \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) wv[v] =                  \
                LD256_##DT(wp[v] + (size_t)k * BE_CPU_NR);                                 \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                          \
            {                                                                              \
                const __m256 xb = _mm256_broadcast_ss(x + (size_t)i * ldx + k);            \
                _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) acc[i][v] =          \
                    _mm256_fmadd_ps(wv[v], xb, acc[i][v]);                                 \
            }                                                                              \
        }                                                                                  \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                              \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++)                          \
            k256_store(out + (size_t)i * ldo + (size_t)v * 8, acc[i][v], mode);            \
    }

typedef void (*k256_fn)(const float *, size_t, const void *, size_t, uint32_t, uint32_t,
                        float *, size_t, int);

#define K256_ALL(DT, ET)                                                                   \
    K256_DEF(DT, ET, 1, 1)                                                                 \
    K256_DEF(DT, ET, 1, 2)                                                                 \
    K256_DEF(DT, ET, 1, 3)                                                                 \
    K256_DEF(DT, ET, 1, 4)                                                                 \
    K256_DEF(DT, ET, 1, 5)                                                                 \
    K256_DEF(DT, ET, 1, 6)                                                                 \
    K256_DEF(DT, ET, 1, 7)                                                                 \
    K256_DEF(DT, ET, 1, 8)                                                                 \
    K256_DEF(DT, ET, 2, 1)                                                                 \
    K256_DEF(DT, ET, 2, 2)                                                                 \
    K256_DEF(DT, ET, 2, 3)                                                                 \
    K256_DEF(DT, ET, 2, 4)                                                                 \
    K256_DEF(DT, ET, 3, 1)                                                                 \
    K256_DEF(DT, ET, 3, 2)                                                                 \
    K256_DEF(DT, ET, 3, 3)                                                                 \
    K256_DEF(DT, ET, 4, 1)                                                                 \
    K256_DEF(DT, ET, 4, 2)                                                                 \
    K256_DEF(DT, ET, 5, 1)                                                                 \
    K256_DEF(DT, ET, 5, 2)                                                                 \
    K256_DEF(DT, ET, 6, 1)                                                                 \
    K256_DEF(DT, ET, 6, 2)

K256_ALL(F32, float)
K256_ALL(BF16, uint16_t)
K256_ALL(F16, uint16_t)

/* Q8_0 for AVX2: the same operations as K512Q_DEF, 8 columns per vector. */
#define K256Q_DEF(MR, NV)                                                                  \
    static BE_T256 void k256_Q8_##MR##_##NV(const float *x, size_t ldx, const uint8_t *w,   \
                                           size_t ps, uint32_t q0, uint32_t K, float *out, \
                                           size_t ldo, int mode)                           \
    {                                                                                      \
        __m256 acc[MR][NV];                                                                \
        const uint8_t *wp[NV];                                                             \
        size_t co[NV];                                                                     \
        _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++)                              \
        {                                                                                  \
            co[v] = (size_t)((q0 + v) & 3) * 8;                                            \
            wp[v] = w + (size_t)((q0 + v) >> 2) * ps;                                      \
        }                                                                                  \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                              \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) acc[i][v] =              \
                _mm256_setzero_ps();                                                       \
        const uint32_t nblk = K / BE_CPU_Q8_K;                                             \
        for (uint32_t b = 0; b < nblk; b++) {                                              \
            __m256 part[MR][NV];                                                           \
            const size_t bo = (size_t)b * BE_CPU_Q8_BLOCK_BYTES;                           \
            const float *xb = x + (size_t)b * BE_CPU_Q8_K;                                 \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                          \
                _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) part[i][v] =         \
                    _mm256_setzero_ps();                                                   \
            _Pragma("GCC unroll 4") for (int j = 0; j < BE_CPU_Q8_K; j++)                  \
            {                                                                              \
                __m256 wv[NV];                                                             \
                _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) wv[v] =              \
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(               \
                        (const __m128i *)(const void *)(wp[v] + bo + BE_CPU_Q8_SCALE_BYTES \
                                                        + (size_t)j * BE_CPU_NR + co[v])))); \
                _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                      \
                {                                                                          \
                    const __m256 xv = _mm256_broadcast_ss(xb + (size_t)i * ldx + j);       \
                    _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++) part[i][v] =     \
                        _mm256_fmadd_ps(xv, wv[v], part[i][v]);                            \
                }                                                                          \
            }                                                                              \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++)                          \
            {                                                                              \
                const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128(                         \
                    (const __m128i *)(const void *)(wp[v] + bo + co[v] * 2)));             \
                _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) acc[i][v] =          \
                    _mm256_fmadd_ps(dv, part[i][v], acc[i][v]);                            \
            }                                                                              \
        }                                                                                  \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                              \
            _Pragma("GCC unroll 16") for (int v = 0; v < NV; v++)                          \
            k256_store(out + (size_t)i * ldo + (size_t)v * 8, acc[i][v], mode);            \
    }

K256Q_DEF(1, 1)
K256Q_DEF(1, 2)
K256Q_DEF(1, 3)
K256Q_DEF(1, 4)
K256Q_DEF(1, 5)
K256Q_DEF(1, 6)
K256Q_DEF(1, 7)
K256Q_DEF(1, 8)
K256Q_DEF(2, 1)
K256Q_DEF(2, 2)
K256Q_DEF(2, 3)
K256Q_DEF(2, 4)
K256Q_DEF(3, 1)
K256Q_DEF(3, 2)
K256Q_DEF(3, 3)
K256Q_DEF(4, 1)
K256Q_DEF(4, 2)
K256Q_DEF(5, 1)
K256Q_DEF(5, 2)
K256Q_DEF(6, 1)
K256Q_DEF(6, 2)

#define K256_TAB(DT)                                                                       \
    {{0},                                                                                  \
     {(k256_fn)k256_##DT##_1_1, (k256_fn)k256_##DT##_1_2, (k256_fn)k256_##DT##_1_3,         \
      (k256_fn)k256_##DT##_1_4, (k256_fn)k256_##DT##_1_5, (k256_fn)k256_##DT##_1_6,         \
      (k256_fn)k256_##DT##_1_7, (k256_fn)k256_##DT##_1_8},                                 \
     {(k256_fn)k256_##DT##_2_1, (k256_fn)k256_##DT##_2_2, (k256_fn)k256_##DT##_2_3,         \
      (k256_fn)k256_##DT##_2_4},                                                           \
     {(k256_fn)k256_##DT##_3_1, (k256_fn)k256_##DT##_3_2, (k256_fn)k256_##DT##_3_3},        \
     {(k256_fn)k256_##DT##_4_1, (k256_fn)k256_##DT##_4_2},                                 \
     {(k256_fn)k256_##DT##_5_1, (k256_fn)k256_##DT##_5_2},                                 \
     {(k256_fn)k256_##DT##_6_1, (k256_fn)k256_##DT##_6_2}}

static const k256_fn k256_tab[3][7][8] = {
    [WK_DTYPE_F32] = K256_TAB(F32),
    [WK_DTYPE_F16] = K256_TAB(F16),
    [WK_DTYPE_BF16] = K256_TAB(BF16),
};
static const k256_fn k256_q8_tab[7][8] = K256_TAB(Q8);

/* Q8_0, one row, AVX2: k512_q8_row's walk and operations, 8 columns per vector. */
static inline __attribute__((target("avx2"), always_inline)) __m256
k256_q8_widen(const uint8_t *p)
{
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p)));
}

/* k512_q8_blocks for AVX2: n (1 or 2) blocks of one group of 4 panels into acc[4]. */
static inline __attribute__((target("avx2,fma,f16c"), always_inline)) void
k256_q8_blocks(const uint8_t *bp, const float *xb, int n, __m256 *acc)
{
    __m256 p[2][4];
    _Pragma("GCC unroll 2") for (int u = 0; u < n; u++)
        _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++) p[u][h] = _mm256_setzero_ps();
    _Pragma("GCC unroll 2") for (int j = 0; j < BE_CPU_Q8_K; j++)
    {
        _Pragma("GCC unroll 2") for (int u = 0; u < n; u++)
        {
            const uint8_t *q = bp + (size_t)u * BE_CPU_Q8_BLOCK_BYTES + BE_CPU_Q8_SCALE_BYTES +
                               (size_t)j * BE_CPU_NR;
            const __m256 xv = _mm256_broadcast_ss(xb + (size_t)u * BE_CPU_Q8_K + j);
            _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++) p[u][h] =
                _mm256_fmadd_ps(xv, k256_q8_widen(q + h * 8), p[u][h]);
        }
    }
    _Pragma("GCC unroll 2") for (int u = 0; u < n; u++)
    {
        const uint8_t *sp = bp + (size_t)u * BE_CPU_Q8_BLOCK_BYTES;
        _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++) acc[h] = _mm256_fmadd_ps(
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(sp + h * 16))),
            p[u][h], acc[h]);
    }
}

static BE_T256 void
k256_q8_row(const float *x, const uint8_t *w, size_t ps, uint32_t q0, uint32_t nv, uint32_t K,
            float *out, int mode)
{
    const uint32_t nblk = K / BE_CPU_Q8_K;
    for (uint32_t v = 0; v < nv; v += 4) {
        const uint8_t *pw = w + (size_t)((q0 + v) >> 2) * ps;
        __m256 acc[4];
        for (int h = 0; h < 4; h++)
            acc[h] = _mm256_setzero_ps();
        uint32_t b = 0;
        for (; b + 2 <= nblk; b += 2) {
            const uint8_t *bp = pw + (size_t)b * BE_CPU_Q8_BLOCK_BYTES;
            for (int l = 0; l < 2 * BE_CPU_Q8_BLOCK_BYTES; l += 64)
                _mm_prefetch((const char *)(bp + BE_CPU_Q8_ROW_PF * BE_CPU_Q8_BLOCK_BYTES + l),
                             _MM_HINT_T0);
            k256_q8_blocks(bp, x + (size_t)b * BE_CPU_Q8_K, 2, acc);
        }
        for (; b < nblk; b++)
            k256_q8_blocks(pw + (size_t)b * BE_CPU_Q8_BLOCK_BYTES, x + (size_t)b * BE_CPU_Q8_K, 1,
                           acc);
        for (int h = 0; h < 4; h++)
            k256_store(out + (size_t)(v + h) * 8, acc[h], mode);
    }
}

static uint32_t
k256_nv_max(uint32_t mr)
{
    return mr == 1 ? 8 : mr == 2 ? 4 : mr == 3 ? 3 : 2;
}

static void
k256_call(wk_dtype dt, uint32_t mr, uint32_t nv, const float *x, size_t ldx, const void *w,
          size_t ps, uint32_t q0, uint32_t K, float *out, size_t ldo, int mode)
{
    if (dt == WK_DTYPE_Q8_0 && mr == 1 && q0 % 4 == 0 && nv % 4 == 0)
        k256_q8_row(x, w, ps, q0, nv, K, out, mode);
    else if (dt == WK_DTYPE_Q8_0)
        k256_q8_tab[mr][nv - 1](x, ldx, w, ps, q0, K, out, ldo, mode);
    else
        k256_tab[dt][mr][nv - 1](x, ldx, w, ps, q0, K, out, ldo, mode);
}

#endif /* BE_CPU_X86 */

void
be_cpu_gemm(be_cpu_isa isa, const be_cpu_mat *w, const float *x, size_t ldx, uint32_t m, float *y,
            size_t ldy, float *const *yrows, uint32_t p0, uint32_t p1, be_cpu_epi epi)
{
    if (p1 > w->n_panels)
        p1 = w->n_panels;
    if (m == 0 || p0 >= p1)
        return;
    if (w->kpair) {
        if (w->dp)
            be_cpu_dp_gemm(w, x, ldx, m, y, ldy, yrows, p0, p1, epi);
        else
            be_cpu_amx_gemm(w, x, ldx, m, y, ldy, yrows, p0, p1, epi);
        return;
    }
#if BE_CPU_X86
    if (isa == BE_CPU_ISA_AVX512) {
        be_cpu_gemm_vec(w, x, ldx, m, y, ldy, yrows, p0, p1, epi, 16, 12, k512_nv_max,
                        k512_call);
        return;
    }
    if (isa == BE_CPU_ISA_AVX2) {
        be_cpu_gemm_vec(w, x, ldx, m, y, ldy, yrows, p0, p1, epi, 8, 6, k256_nv_max, k256_call);
        return;
    }
#endif
    (void)isa;
    be_cpu_gemm_scalar(w, x, ldx, m, y, ldy, yrows, p0, p1, epi);
}

uint32_t
be_cpu_gemm_panel_grain(be_cpu_isa isa, uint32_t m)
{
    if (isa == BE_CPU_ISA_SCALAR)
        return 1;
    if (isa == BE_CPU_ISA_AVX2)
        return m <= 1 ? 2 : 1;
    return m <= 3 ? 4 : m <= 6 ? 2 : 1;
}

/* ------------------------------------------------------------------------ */
/* WKV                                                                       */
/* ------------------------------------------------------------------------ */

static void
be_cpu_wkv_scalar(uint32_t n, float *s, const float *r, const float *w, const float *k,
                  const float *v, const float *a, const float *b, float *y)
{
    for (uint32_t i = 0; i < n; i++) {
        float *row = s + (size_t)i * n;
        float sa = 0.0f;
        for (uint32_t j = 0; j < n; j++)
            sa += row[j] * a[j];
        float yi = 0.0f;
        const float vi = v[i];
        for (uint32_t j = 0; j < n; j++) {
            float nv = row[j] * w[j] + (sa * b[j] + vi * k[j]);
            row[j] = nv;
            yi += nv * r[j];
        }
        y[i] = yi;
    }
}

#if BE_CPU_X86

static inline __attribute__((target("avx512f"), always_inline)) float
be_cpu_hsum512(__m512 v)
{
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

/* n a multiple of 16, at most 256 */
static __attribute__((target("avx512f,fma"))) void
be_cpu_wkv_512(uint32_t n, float *s, const float *r, const float *w, const float *k,
               const float *v, const float *a, const float *b, float *y)
{
    const uint32_t nv = n / 16;
    __m512 wv[16], kv[16], av[16], bv[16], rv[16];
    for (uint32_t q = 0; q < nv; q++) {
        wv[q] = _mm512_loadu_ps(w + q * 16);
        kv[q] = _mm512_loadu_ps(k + q * 16);
        av[q] = _mm512_loadu_ps(a + q * 16);
        bv[q] = _mm512_loadu_ps(b + q * 16);
        rv[q] = _mm512_loadu_ps(r + q * 16);
    }
    for (uint32_t i = 0; i < n; i++) {
        float *row = s + (size_t)i * n;
        __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(row), av[0]);
        for (uint32_t q = 1; q < nv; q++)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(row + q * 16), av[q], acc);
        const __m512 sa = _mm512_set1_ps(be_cpu_hsum512(acc));
        const __m512 vi = _mm512_set1_ps(v[i]);
        __m512 yacc = _mm512_setzero_ps();
        for (uint32_t q = 0; q < nv; q++) {
            __m512 t = _mm512_fmadd_ps(sa, bv[q], _mm512_mul_ps(vi, kv[q]));
            __m512 nsv = _mm512_fmadd_ps(_mm512_loadu_ps(row + q * 16), wv[q], t);
            _mm512_storeu_ps(row + q * 16, nsv);
            yacc = _mm512_fmadd_ps(nsv, rv[q], yacc);
        }
        y[i] = be_cpu_hsum512(yacc);
    }
}

static inline __attribute__((target("avx2"), always_inline)) float
be_cpu_hsum256(__m256 v)
{
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

/* n a multiple of 8, at most 128 */
static __attribute__((target("avx2,fma"))) void
be_cpu_wkv_256(uint32_t n, float *s, const float *r, const float *w, const float *k,
               const float *v, const float *a, const float *b, float *y)
{
    const uint32_t nv = n / 8;
    for (uint32_t i = 0; i < n; i++) {
        float *row = s + (size_t)i * n;
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(row), _mm256_loadu_ps(a));
        for (uint32_t q = 1; q < nv; q++)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(row + q * 8), _mm256_loadu_ps(a + q * 8), acc);
        const __m256 sa = _mm256_set1_ps(be_cpu_hsum256(acc));
        const __m256 vi = _mm256_set1_ps(v[i]);
        __m256 yacc = _mm256_setzero_ps();
        for (uint32_t q = 0; q < nv; q++) {
            __m256 t = _mm256_fmadd_ps(sa, _mm256_loadu_ps(b + q * 8),
                                       _mm256_mul_ps(vi, _mm256_loadu_ps(k + q * 8)));
            __m256 nsv = _mm256_fmadd_ps(_mm256_loadu_ps(row + q * 8), _mm256_loadu_ps(w + q * 8),
                                         t);
            _mm256_storeu_ps(row + q * 8, nsv);
            yacc = _mm256_fmadd_ps(nsv, _mm256_loadu_ps(r + q * 8), yacc);
        }
        y[i] = be_cpu_hsum256(yacc);
    }
}

#endif /* BE_CPU_X86 */

void
be_cpu_wkv_head(be_cpu_isa isa, uint32_t n, float *s, const float *r, const float *w,
                const float *k, const float *v, const float *a, const float *b, float *y)
{
#if BE_CPU_X86
    if (isa == BE_CPU_ISA_AVX512 && n % 16 == 0 && n <= 256) {
        be_cpu_wkv_512(n, s, r, w, k, v, a, b, y);
        return;
    }
    if (isa >= BE_CPU_ISA_AVX2 && n % 8 == 0) {
        be_cpu_wkv_256(n, s, r, w, k, v, a, b, y);
        return;
    }
#endif
    (void)isa;
    be_cpu_wkv_scalar(n, s, r, w, k, v, a, b, y);
}
