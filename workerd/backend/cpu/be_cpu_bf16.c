/*
 * be_cpu_bf16: the `--cpu-matmul bf16` GEMMs, on AMX tiles or on
 * AVX512-BF16 dot products (see be_cpu_bf16.h for the numeric modes and
 * the packed layout both share).
 *
 * AMX: tiles 0-3 accumulate a 16-row x 64-column block of outputs (two
 * panels), 4 holds 16 rows x 32 k of activations, 5-7 take turns holding
 * 32 k x 16 columns of weights. Each call loads the tile configuration
 * (again when the row count changes) and releases the tiles at the end, so
 * that a thread switched out between calls has no tile data to save.
 *
 * Dot products: a block of up to 6 rows x 64 columns (two panels) in 24
 * zmm accumulators; per k pair, four 16-column weight rows of the packed
 * tiles (one load each) against each row's pair broadcast (one dword).
 * Per k pair that is 24 VDPBF16PS for 4 loads, twice the multiply-adds
 * of the fp32 kernels' FMAs per instruction and no widening of the
 * weights.
 *
 * Both engines round the activations to bf16 once per call into a
 * per-thread buffer (grown on first need, freed when the thread ends); if
 * that allocation fails the call converts slabs of k on the stack instead
 * (same bits, slower). Both walk the columns in chunks whose weights stay
 * in L2 while every row block passes over them.
 *
 * One row (decode) is bandwidth-bound. On AMX it streams the weights
 * through tile loads at ~85% of the rate the fp32 kernels reach (1 x 1024
 * x 248320, 2 threads, best of 12: 16.3-16.8 ms against 14.0-14.9 ms).
 * Tried and dropped for it, no gain: software prefetch (L1 or L2 hints, 4
 * to 32 chunks ahead: equal or slower), one panel at a time with two A and
 * four B tiles taking turns, two A tiles alternating over two panels.
 */
#include "be_cpu_bf16.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__linux__) && defined(WKVM_HAVE_AMX_INTRIN)
#define BE_AMX_BUILD 1
#else
#define BE_AMX_BUILD 0
#endif
#if defined(__x86_64__) && defined(WKVM_HAVE_BF16DP_INTRIN)
#define BE_DP_BUILD 1
#else
#define BE_DP_BUILD 0
#endif
#define BE_BF16_X86 (BE_AMX_BUILD || BE_DP_BUILD)
#if BE_BF16_X86
#include <cpuid.h>
#include <immintrin.h>
#endif
#if BE_AMX_BUILD
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define BE_AMX_SLAB 512u              /* k per stack slab (fallback path) */
#define BE_AMX_L2_PANEL_BYTES (512u << 10) /* weights per column chunk, kept in L2 across rows */

/* ------------------------------------------------------------------------ */
/* availability                                                              */
/* ------------------------------------------------------------------------ */

static pthread_once_t be_amx_once = PTHREAD_ONCE_INIT;
static bool be_amx_ok;
static _Atomic bool be_amx_slab_only; /* tests: no per-thread buffer */

void
be_cpu_bf16_set_slab_only(bool on)
{
    be_amx_slab_only = on;
}

static void
be_amx_probe(void)
{
#if BE_AMX_BUILD
    const char *env = getenv("WKVM_CPU_AMX");
    if (env != NULL && strcmp(env, "off") == 0)
        return;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return;
    if (!(d & (1u << 22)) || !(d & (1u << 24))) /* AMX-BF16, AMX-TILE */
        return;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f"))
        return;
    /* Linux: ask once per process for the tile data state (ARCH_REQ_XCOMP_PERM, XTILEDATA) */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0)
        return;
    be_amx_ok = true;
#endif
}

bool
be_cpu_amx_enable(void)
{
    (void)pthread_once(&be_amx_once, be_amx_probe);
    return be_amx_ok;
}

static pthread_once_t be_dp_once = PTHREAD_ONCE_INIT;
static bool be_dp_ok;

static void
be_dp_probe(void)
{
#if BE_DP_BUILD
    const char *env = getenv("WKVM_CPU_BF16DP");
    if (env != NULL && strcmp(env, "off") == 0)
        return;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) /* AVX512_BF16 */
        return;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) /* with the OS's zmm state */
        return;
    be_dp_ok = true;
#endif
}

bool
be_cpu_dp_enable(void)
{
    (void)pthread_once(&be_dp_once, be_dp_probe);
    return be_dp_ok;
}

const char *
be_cpu_matmul_name(be_cpu_matmul mode)
{
    return mode == BE_CPU_MATMUL_BF16      ? "bf16-amx"
           : mode == BE_CPU_MATMUL_BF16_DP ? "bf16-dp"
                                           : "fp32";
}

be_cpu_matmul
be_cpu_bf16_engine(void)
{
    if (be_cpu_amx_enable())
        return BE_CPU_MATMUL_BF16;
    if (be_cpu_dp_enable())
        return BE_CPU_MATMUL_BF16_DP;
    return BE_CPU_MATMUL_FP32;
}

/* ------------------------------------------------------------------------ */
/* the numbers, in portable C                                                */
/* ------------------------------------------------------------------------ */

uint16_t
be_cpu_bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* NaN stays a (quiet) NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float
be_dp_f32(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Denormal to zero of its sign (DAZ). */
static float
be_dp_flush(float f)
{
    return fpclassify(f) == FP_SUBNORMAL ? copysignf(0.0f, f) : f;
}

/*
 * a * b + c with one rounding to 24 bits as if the exponent were unbounded,
 * then a result under 2^-126 in magnitude to zero of its sign (the FTZ of
 * the SDM: tiny after rounding). fmaf alone rounds onto the denormal grid,
 * which turns an exact sum in [2^-126 - 2^-150, 2^-126) into 2^-126 where
 * the instruction gives 0. a and b are bf16 values, c fp32, none denormal.
 */
static float
be_dp_fma(float a, float b, float c)
{
    const float r = fmaf(a, b, c);
    if (!(fabsf(r) <= 0x1p-126f))
        return r; /* normal, Inf or NaN: the same rounding */
    if (fabsf(b) >= 0x1p90f || fabsf(c) >= 0x1p90f)
        return r; /* huge terms meet only in an exact cancellation: r is 0 */
    /* the same sum scaled by 2^32 (exact: no term overflows), rounded in the normal range */
    const float s = fmaf(a, b * 0x1p32f, c * 0x1p32f);
    return fabsf(s) < 0x1p-94f ? copysignf(0.0f, s) : s * 0x1p-32f;
}

float
be_cpu_dp_ref(float acc, uint16_t a0, uint16_t a1, uint16_t b0, uint16_t b1)
{
    /* each product exact and unrounded, added with one rounding: a product past fp32's range
     * does not overflow before its addition */
    acc = be_dp_fma(be_dp_flush(be_dp_f32(a1)), be_dp_flush(be_dp_f32(b1)), be_dp_flush(acc));
    return be_dp_fma(be_dp_flush(be_dp_f32(a0)), be_dp_flush(be_dp_f32(b0)), acc);
}

/* ------------------------------------------------------------------------ */
/* packing                                                                   */
/* ------------------------------------------------------------------------ */

void
be_cpu_kpair_pack_panels(be_cpu_mat *dst, const wrk_mat *src, uint32_t p0, uint32_t p1)
{
    const size_t K = dst->k, N = dst->n, Kp = be_cpu_kpair_kp(dst->k);
    const uint16_t *s = src->t->data;
    uint16_t *d = dst->data;

    for (uint32_t p = p0; p < p1; p++) {
        uint16_t *pd = d + (size_t)p * Kp * BE_CPU_NR;
        const size_t c0 = (size_t)p * BE_CPU_NR;
        const size_t nc = N - c0 < BE_CPU_NR ? N - c0 : BE_CPU_NR;
        if (nc < BE_CPU_NR || Kp != K)
            memset(pd, 0, Kp * BE_CPU_NR * 2);
        for (size_t c = 0; c < nc; c++) {
            uint16_t *col = pd + (c / 16) * 512 + (c % 16) * 2;
            for (size_t k = 0; k < K; k++) {
                const uint16_t v = src->in_major ? s[k * N + c0 + c] : s[(c0 + c) * K + k];
                col[(k / 32) * 1024 + (k % 32 / 2) * 32 + k % 2] = v;
            }
        }
    }
}

#if BE_BF16_X86

/* ------------------------------------------------------------------------ */
/* activations to bf16                                                       */
/* ------------------------------------------------------------------------ */

/* out[0..nk) = bf16(x[0..nv)) then zeros; nk a multiple of 32, nv <= nk. */
static __attribute__((target("avx512f"))) void
be_amx_cvt(const float *x, uint32_t nv, uint32_t nk, uint16_t *out)
{
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i quiet = _mm512_set1_epi32(0x40);
    uint32_t k = 0;
    for (; k + 16 <= nv; k += 16) {
        const __m512 v = _mm512_loadu_ps(x + k);
        const __m512i u = _mm512_castps_si512(v);
        const __m512i hi = _mm512_srli_epi32(u, 16);
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one)));
        r = _mm512_srli_epi32(r, 16);
        const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        r = _mm512_mask_or_epi32(r, nan, hi, quiet);
        _mm256_storeu_si256((__m256i *)(out + k), _mm512_cvtepi32_epi16(r));
    }
    for (; k < nv; k++)
        out[k] = be_cpu_bf16_round(x[k]);
    if (nk > nv)
        memset(out + nv, 0, (size_t)(nk - nv) * 2);
}

/* ------------------------------------------------------------------------ */
/* per-thread state                                                          */
/* ------------------------------------------------------------------------ */

static pthread_key_t be_amx_key;
static pthread_once_t be_amx_key_once = PTHREAD_ONCE_INIT;
static bool be_amx_key_ok;

static void
be_amx_key_make(void)
{
    be_amx_key_ok = pthread_key_create(&be_amx_key, free) == 0;
}

/* The thread's activation buffer of at least n elements (64-byte header holds the size); NULL
 * when it cannot grow. */
static uint16_t *
be_amx_buf(size_t n)
{
    (void)pthread_once(&be_amx_key_once, be_amx_key_make);
    if (!be_amx_key_ok)
        return NULL;
    size_t *blk = pthread_getspecific(be_amx_key);
    if (blk != NULL && blk[0] >= n)
        return (uint16_t *)((char *)blk + 64);
    size_t cap = n + n / 4 + 4096;
    size_t *nb = aligned_alloc(64, (64 + cap * 2 + 63) & ~(size_t)63);
    if (nb == NULL || pthread_setspecific(be_amx_key, nb) != 0) {
        free(nb);
        return NULL;
    }
    free(blk);
    nb[0] = cap;
    return (uint16_t *)((char *)nb + 64);
}

/* ------------------------------------------------------------------------ */
/* what both engines' drivers share                                          */
/* ------------------------------------------------------------------------ */

/* The m rows of x in bf16, Kp apart, in the thread's buffer; NULL: convert slabs instead. */
static uint16_t *
be_bf16_acts(const float *x, size_t ldx, uint32_t m, uint32_t K, uint32_t Kp)
{
    uint16_t *abuf = be_amx_slab_only ? NULL : be_amx_buf((size_t)m * Kp);
    if (abuf != NULL)
        for (uint32_t i = 0; i < m; i++)
            be_amx_cvt(x + (size_t)i * ldx, K, Kp, abuf + (size_t)i * Kp);
    return abuf;
}

/* Panels per column chunk (even, at least 2) whose weights stay in L2 while every row block
 * passes over them; ps: the panel stride in elements. */
static uint32_t
be_bf16_chunk(size_t ps)
{
    uint32_t ch = (uint32_t)(BE_AMX_L2_PANEL_BYTES / (ps * 2));
    return ch < 2 ? 2 : ch & ~1u;
}

/* Rows [row, row + mr) of x, k from k0, in bf16 into slab (BE_AMX_SLAB apart, zeros past K);
 * returns the slab's k count (a multiple of 32). */
static uint32_t
be_bf16_slab(const float *x, size_t ldx, uint32_t row, uint32_t mr, uint32_t K, uint32_t Kp,
             uint32_t k0, uint16_t *slab)
{
    const uint32_t nk = Kp - k0 < BE_AMX_SLAB ? Kp - k0 : BE_AMX_SLAB;
    const uint32_t nv = K <= k0 ? 0 : K - k0 < nk ? K - k0 : nk;
    for (uint32_t i = 0; i < mr; i++)
        be_amx_cvt(x + (size_t)(row + i) * ldx + k0, nv, nk, slab + (size_t)i * BE_AMX_SLAB);
    return nk;
}

/* The output columns of panels p (and p + 1 when *np is 2) below pe: first column and how many
 * are real. False past the matrix's last column. */
static bool
be_bf16_cols(const be_cpu_mat *w, uint32_t p, uint32_t pe, uint32_t *np, uint32_t *col0,
             uint32_t *nvalid)
{
    *np = pe - p < 2 ? 1 : 2;
    *col0 = p * BE_CPU_NR;
    if (*col0 >= w->n)
        return false;
    const uint32_t ncol = *np * BE_CPU_NR;
    *nvalid = w->n - *col0 < ncol ? w->n - *col0 : ncol;
    return true;
}

#endif /* BE_BF16_X86 */

#if BE_AMX_BUILD

/* ------------------------------------------------------------------------ */
/* tiles                                                                     */
/* ------------------------------------------------------------------------ */

static _Thread_local uint32_t be_amx_cfg_rows; /* rows of the loaded config, 0: none */

#define BE_AMX_T __attribute__((target("amx-tile,amx-bf16"), noinline))

typedef struct be_amx_tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} be_amx_tilecfg;

static BE_AMX_T void
be_amx_config(uint32_t mr)
{
    be_amx_tilecfg c;
    memset(&c, 0, sizeof(c));
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = (uint8_t)(t <= 4 ? mr : 16);
    }
    /* gcc 12 does not see that ldtilecfg reads c and drops the stores: a barrier keeps them */
    __asm__ volatile("" : : "r"(&c) : "memory");
    _tile_loadconfig(&c);
    be_amx_cfg_rows = mr;
}

/* C tiles 0..3 += A (lda bytes apart) x the two panels at b0, b1 over nkc chunks. */
static BE_AMX_T void
be_amx_run2(const uint16_t *a, size_t lda, const uint16_t *b0, const uint16_t *b1, uint32_t nkc)
{
    for (uint32_t kc = 0; kc < nkc; kc++) {
        _tile_loadd(4, a + (size_t)kc * 32, lda);
        _tile_loadd(5, b0 + (size_t)kc * 1024, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, b0 + (size_t)kc * 1024 + 512, 64);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(7, b1 + (size_t)kc * 1024, 64);
        _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, b1 + (size_t)kc * 1024 + 512, 64);
        _tile_dpbf16ps(3, 4, 5);
    }
}

/* C tiles 0..1 += A x the panel at b0. */
static BE_AMX_T void
be_amx_run1(const uint16_t *a, size_t lda, const uint16_t *b0, uint32_t nkc)
{
    for (uint32_t kc = 0; kc < nkc; kc++) {
        _tile_loadd(4, a + (size_t)kc * 32, lda);
        _tile_loadd(5, b0 + (size_t)kc * 1024, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, b0 + (size_t)kc * 1024 + 512, 64);
        _tile_dpbf16ps(1, 4, 6);
    }
}

/* Drops the tile state: a thread switched out then saves no tile data. */
static BE_AMX_T void
be_amx_release(void)
{
    _tile_release();
    be_amx_cfg_rows = 0;
}

static BE_AMX_T void
be_amx_zero(void)
{
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}

/* Stores C tiles (np panels) into ct, rows 64 floats apart. */
static BE_AMX_T void
be_amx_store(uint32_t np, float *ct)
{
    _tile_stored(0, ct, 256);
    _tile_stored(1, ct + 16, 256);
    if (np == 2) {
        _tile_stored(2, ct + 32, 256);
        _tile_stored(3, ct + 48, 256);
    }
}

void
be_cpu_amx_gemm(const be_cpu_mat *w, const float *x, size_t ldx, uint32_t m, float *y, size_t ldy,
                float *const *yrows, uint32_t p0, uint32_t p1, be_cpu_epi epi)
{
    const uint32_t K = w->k, Kp = be_cpu_kpair_kp(w->k), nkc = Kp / BE_CPU_KPAIR_KC;
    const size_t ps = (size_t)Kp * BE_CPU_NR; /* panel stride, elements */
    const uint16_t *W = w->data;
    float ct[16 * 64] __attribute__((aligned(64)));
    uint16_t slab[16 * BE_AMX_SLAB] __attribute__((aligned(64)));

    if (p1 > w->n_panels)
        p1 = w->n_panels;
    if (m == 0 || p0 >= p1)
        return;
    const uint16_t *abuf = be_bf16_acts(x, ldx, m, K, Kp);
    const uint32_t ch = be_bf16_chunk(ps);
    for (uint32_t pc = p0; pc < p1; pc += ch) {
        const uint32_t pe = pc + ch < p1 ? pc + ch : p1;
        for (uint32_t row = 0; row < m; row += 16) {
            const uint32_t mr = m - row < 16 ? m - row : 16;
            if (be_amx_cfg_rows != mr)
                be_amx_config(mr);
            for (uint32_t p = pc; p < pe; p += 2) {
                uint32_t np, col0, nvalid;
                if (!be_bf16_cols(w, p, pe, &np, &col0, &nvalid))
                    break;
                const uint16_t *b0 = W + (size_t)p * ps, *b1 = np == 2 ? b0 + ps : b0;
                be_amx_zero();
                if (abuf != NULL) {
                    const uint16_t *a = abuf + (size_t)row * Kp;
                    if (np == 2)
                        be_amx_run2(a, (size_t)Kp * 2, b0, b1, nkc);
                    else
                        be_amx_run1(a, (size_t)Kp * 2, b0, nkc);
                } else {
                    for (uint32_t k0 = 0; k0 < Kp; k0 += BE_AMX_SLAB) {
                        const uint32_t nk = be_bf16_slab(x, ldx, row, mr, K, Kp, k0, slab);
                        const size_t off = (size_t)k0 * BE_CPU_NR;
                        if (np == 2)
                            be_amx_run2(slab, BE_AMX_SLAB * 2, b0 + off, b1 + off, nk / 32);
                        else
                            be_amx_run1(slab, BE_AMX_SLAB * 2, b0 + off, nk / 32);
                    }
                }
                be_amx_store(np, ct);
                be_cpu_tile_out(ct, mr, 64, col0, nvalid, y, ldy, yrows, row, epi);
            }
        }
    }
    be_amx_release();
}

#else /* !BE_AMX_BUILD */

void
be_cpu_amx_gemm(const be_cpu_mat *w, const float *x, size_t ldx, uint32_t m, float *y, size_t ldy,
                float *const *yrows, uint32_t p0, uint32_t p1, be_cpu_epi epi)
{
    /* unreachable: be_cpu_amx_enable() is false, so nothing is packed for AMX (see above) */
    (void)w, (void)x, (void)ldx, (void)m, (void)y, (void)ldy, (void)yrows, (void)p0, (void)p1,
        (void)epi;
    abort();
}

#endif /* BE_AMX_BUILD */

/* ------------------------------------------------------------------------ */
/* AVX512-BF16 dot products                                                  */
/* ------------------------------------------------------------------------ */

#if BE_DP_BUILD

#define BE_DP_MR 6 /* rows per block: 6 x 4 accumulators + 4 weight rows + a broadcast */

/* The k pair at p (two bf16), in every lane. */
static inline __attribute__((target("avx512f,avx512bf16"), always_inline)) __m512bh
be_dp_pair(const uint16_t *p)
{
    int32_t pair;
    memcpy(&pair, p, 4);
    return (__m512bh)_mm512_set1_epi32(pair);
}

/*
 * The block's accumulators (MR rows x NC * 16 columns; ct, 64 floats per
 * row, holds them between slabs: from +0 when first) += the rows at a (lda
 * elements apart, bf16, k from the slab's start) x chunks [0, nkc) of the
 * panel(s) at b0 (b1: the second panel when NC is 4). stream: the weights
 * come from memory, not from L2 (the first row block of a column chunk,
 * decode's only one). Either order
 * gives the same bits: each output's chain runs over the k pairs in order.
 */
static inline __attribute__((target("avx512f,avx512bf16"), always_inline)) void
be_dp_block(const uint16_t *a, size_t lda, const uint16_t *b0, const uint16_t *b1, uint32_t nkc,
            float *ct, bool first, bool stream, const int MR, const int NC)
{
    __m512 acc[BE_DP_MR][4];
    for (int i = 0; i < MR; i++)
        for (int c = 0; c < NC; c++)
            acc[i][c] = first ? _mm512_setzero_ps() : _mm512_load_ps(ct + i * 64 + c * 16);
    for (uint32_t kc = 0; kc < nkc; kc++) {
        const uint16_t *ak = a + (size_t)kc * 32;
        const uint16_t *w0 = b0 + (size_t)kc * 1024, *w1 = b1 + (size_t)kc * 1024;
        if (stream) {
            /* bandwidth-bound: one 16-column half (a 1 KiB tile) of each panel at a time, so
             * the weights are read in their order in memory (both halves at once, two
             * interleaved streams per panel, reached 55% of the bandwidth for one row) */
            for (int h = 0; h < 2; h++)
                for (uint32_t r = 0; r < 16; r++) {
                    const __m512bh v0 = (__m512bh)_mm512_load_si512(w0 + h * 512 + r * 32);
                    const __m512bh v1 = (__m512bh)_mm512_load_si512(w1 + h * 512 + r * 32);
                    for (int i = 0; i < MR; i++) {
                        const __m512bh av = be_dp_pair(ak + (size_t)i * lda + r * 2);
                        acc[i][h] = _mm512_dpbf16_ps(acc[i][h], av, v0);
                        if (NC == 4)
                            acc[i][2 + h] = _mm512_dpbf16_ps(acc[i][2 + h], av, v1);
                    }
                }
            continue;
        }
        /* compute-bound: every accumulator per k pair (the most independent chains) */
        for (uint32_t r = 0; r < 16; r++) {
            __m512bh v[4];
            v[0] = (__m512bh)_mm512_load_si512(w0 + r * 32);
            v[1] = (__m512bh)_mm512_load_si512(w0 + 512 + r * 32);
            if (NC == 4) {
                v[2] = (__m512bh)_mm512_load_si512(w1 + r * 32);
                v[3] = (__m512bh)_mm512_load_si512(w1 + 512 + r * 32);
            }
            for (int i = 0; i < MR; i++) {
                const __m512bh av = be_dp_pair(ak + (size_t)i * lda + r * 2);
                for (int c = 0; c < NC; c++)
                    acc[i][c] = _mm512_dpbf16_ps(acc[i][c], av, v[c]);
            }
        }
    }
    for (int i = 0; i < MR; i++)
        for (int c = 0; c < NC; c++)
            _mm512_store_ps(ct + i * 64 + c * 16, acc[i][c]);
}

typedef void (*be_dp_fn)(const uint16_t *, size_t, const uint16_t *, const uint16_t *, uint32_t,
                         float *, bool, bool);

#define BE_DP_FN(MR, NC)                                                                         \
    static __attribute__((target("avx512f,avx512bf16"))) void be_dp_##MR##_##NC(                 \
        const uint16_t *a, size_t lda, const uint16_t *b0, const uint16_t *b1, uint32_t nkc,      \
        float *ct, bool first, bool stream)                                                       \
    {                                                                                             \
        be_dp_block(a, lda, b0, b1, nkc, ct, first, stream, MR, NC);                              \
    }
BE_DP_FN(1, 2)
BE_DP_FN(2, 2)
BE_DP_FN(3, 2)
BE_DP_FN(4, 2)
BE_DP_FN(5, 2)
BE_DP_FN(6, 2)
BE_DP_FN(1, 4)
BE_DP_FN(2, 4)
BE_DP_FN(3, 4)
BE_DP_FN(4, 4)
BE_DP_FN(5, 4)
BE_DP_FN(6, 4)

/* [panels - 1][rows - 1] */
static const be_dp_fn be_dp_tab[2][BE_DP_MR] = {
    {be_dp_1_2, be_dp_2_2, be_dp_3_2, be_dp_4_2, be_dp_5_2, be_dp_6_2},
    {be_dp_1_4, be_dp_2_4, be_dp_3_4, be_dp_4_4, be_dp_5_4, be_dp_6_4},
};

void
be_cpu_dp_gemm(const be_cpu_mat *w, const float *x, size_t ldx, uint32_t m, float *y, size_t ldy,
               float *const *yrows, uint32_t p0, uint32_t p1, be_cpu_epi epi)
{
    const uint32_t K = w->k, Kp = be_cpu_kpair_kp(w->k), nkc = Kp / BE_CPU_KPAIR_KC;
    const size_t ps = (size_t)Kp * BE_CPU_NR; /* panel stride, elements */
    const uint16_t *W = w->data;
    float ct[BE_DP_MR * 64] __attribute__((aligned(64)));
    uint16_t slab[BE_DP_MR * BE_AMX_SLAB] __attribute__((aligned(64)));

    if (p1 > w->n_panels)
        p1 = w->n_panels;
    if (m == 0 || p0 >= p1)
        return;
    const uint16_t *abuf = be_bf16_acts(x, ldx, m, K, Kp);
    /* balanced row blocks of at most BE_DP_MR rows */
    const uint32_t nb = (m + BE_DP_MR - 1) / BE_DP_MR, base = m / nb, extra = m % nb;
    const uint32_t ch = be_bf16_chunk(ps);
    for (uint32_t pc = p0; pc < p1; pc += ch) {
        const uint32_t pe = pc + ch < p1 ? pc + ch : p1;
        uint32_t row = 0;
        for (uint32_t blk = 0; blk < nb; blk++) {
            const uint32_t mr = base + (blk < extra ? 1 : 0);
            const bool stream = blk == 0; /* the chunk comes from memory, then from L2 */
            for (uint32_t p = pc; p < pe; p += 2) {
                uint32_t np, col0, nvalid;
                if (!be_bf16_cols(w, p, pe, &np, &col0, &nvalid))
                    break;
                const uint16_t *b0 = W + (size_t)p * ps, *b1 = np == 2 ? b0 + ps : b0;
                const be_dp_fn fn = be_dp_tab[np - 1][mr - 1];
                if (abuf != NULL) {
                    fn(abuf + (size_t)row * Kp, Kp, b0, b1, nkc, ct, true, stream);
                } else {
                    for (uint32_t k0 = 0; k0 < Kp; k0 += BE_AMX_SLAB) {
                        const uint32_t nk = be_bf16_slab(x, ldx, row, mr, K, Kp, k0, slab);
                        const size_t off = (size_t)k0 * BE_CPU_NR;
                        fn(slab, BE_AMX_SLAB, b0 + off, b1 + off, nk / BE_CPU_KPAIR_KC, ct, k0 == 0,
                           stream);
                    }
                }
                be_cpu_tile_out(ct, mr, 64, col0, nvalid, y, ldy, yrows, row, epi);
            }
            row += mr;
        }
    }
}

#else /* !BE_DP_BUILD */

void
be_cpu_dp_gemm(const be_cpu_mat *w, const float *x, size_t ldx, uint32_t m, float *y, size_t ldy,
               float *const *yrows, uint32_t p0, uint32_t p1, be_cpu_epi epi)
{
    /* unreachable: be_cpu_dp_enable() is false, so nothing is packed for the dot products
     * (be_cpu_base_open refuses the mode); a caller that packs anyway gets no garbage */
    (void)w, (void)x, (void)ldx, (void)m, (void)y, (void)ldy, (void)yrows, (void)p0, (void)p1,
        (void)epi;
    abort();
}

#endif /* BE_DP_BUILD */
