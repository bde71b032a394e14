/*
 * be_cpu_attn: causal softmax attention over the paged KV pool (see
 * be_cpu_attn.h for what each query computes).
 *
 * Shape of the work. Blocks of more than ATT_FEW queries (prefill): lanes
 * are queries. The block's queries are transposed once (qt: Da rows of
 * BE_CPU_ATTN_QMAX lanes), so a key's 4 partial score chains for a vector
 * of queries advance by one fma per dim (the key's value broadcast, a row
 * of qt loaded), keys x lane vectors x the 4 partials held in registers;
 * each K row is read once per lane group. The scores go to a key-major
 * scratch (a row of QMAX lanes per position), where the max, the exps and
 * the sums in double are vectors across queries too, and the weighted sum
 * of V is again lanes = queries: a V value broadcast, the row of exps
 * loaded, dims x lane vectors in registers, over the positions in order.
 * The max is taken page by page as the scores are written (their rows still
 * in L1); the exps and the V sums go span by span (ATT_PV_SPAN positions):
 * a span's exps are made, then read by its V sums once per group of dims
 * while they are still in L2, each chain carried from span to span as the
 * value it holds. K rows a page ahead and V rows two pages ahead are
 * prefetched: token rows are 2 KiB and more apart in pages scattered over
 * the pool, where the hardware's own prefetch (within a 4 KiB page) does not
 * follow. (Before, at 24,000 positions of context a block ran at under half
 * its rate at 3,000; now at two thirds.)
 * Blocks of up to ATT_FEW queries (decode) would leave most lanes empty:
 * their scores put ATT_W / 4 keys x the 4 partial chains in a vector (4
 * consecutive dims of each key, the query's 4 dims broadcast to each
 * quarter), and their V sums have the lanes over the dims. Each shape
 * computes the same chains, and a query's value only ever meets its own, so
 * the block's shape and the lane width (16 on AVX-512, 8 on AVX2, 4
 * portable) change no bit. Positions past a query's own (the block's later
 * tokens) are masked: their scores become -INFINITY before the max, their
 * exps 0, and the V sum skips them in those lanes (masked fma), so a
 * non-finite V of a later token never reaches an earlier one.
 *
 * Before this module the hybrids' attention (be_cpu_gdn.c) summed each
 * score in 8 partial lanes over d with separate multiplies and adds and
 * used the same form for V: about half the arithmetic rate of fma, plus a
 * horizontal reduction per score.
 */
#include "be_cpu_attn.h"

#include "be_cpu_common.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

typedef float att_v16 __attribute__((vector_size(64)));
typedef float att_v8 __attribute__((vector_size(32)));
typedef int32_t att_i16 __attribute__((vector_size(64)));
typedef double att_d8 __attribute__((vector_size(64)));

/*
 * The lane selections of the max and the exp, per ISA path (vector
 * comparisons in C's vector extensions compile to a scalar loop on
 * AVX-512F): each gives every lane the same value on every path.
 *   max16(m, s):   m = s > m ? s : m (a NaN s keeps m)
 *   clamp16(l, x): l = x when -87 <= x <= 0, -87 below or for a NaN, 0 above
 *   fix16(y, x):   y = +0 where x < -87 (-INFINITY too), x where x is a NaN
 */
typedef void (*att_sel_fn)(att_v16 *out, const att_v16 *in);

/*
 * e[i] = exp(e[i] - sub[i]) for 16 values, each <= 0 after the subtraction
 * where sub is their max: be_cpu_exp_core8 (be_cpu_common.h) on the values
 * clamped to [-87, 0] (within 0.98 ulp of the exact exp there, 4 million
 * points against float64). Below -87 (where expf turns subnormal, under
 * 1.2e-38) the result is +0, as for -INFINITY; a NaN stays NaN; a lane over
 * 0 (a padding lane) computes exp(0).
 */
static inline __attribute__((always_inline)) void
att_exp16(float *e, const float *sub, att_sel_fn clamp16, att_sel_fn fix16)
{
    att_v16 x, s, lo, y;
    memcpy(&x, e, sizeof(x));
    memcpy(&s, sub, sizeof(s));
    x = x - s;
    clamp16(&lo, &x);
    for (int h = 0; h < 2; h++) {
        be_cpu_v8 l8, y8;
        memcpy(&l8, (const float *)&lo + 8 * h, sizeof(l8));
        be_cpu_exp_core8(&y8, &l8);
        memcpy((float *)&y + 8 * h, &y8, sizeof(y8));
    }
    fix16(&y, &x);
    memcpy(e, &y, sizeof(y));
}

static inline __attribute__((always_inline)) void
att_max16_any(att_v16 *m, const att_v16 *s)
{
    for (int l = 0; l < 16; l++)
        (*m)[l] = (*s)[l] > (*m)[l] ? (*s)[l] : (*m)[l];
}

static inline __attribute__((always_inline)) void
att_clamp16_any(att_v16 *lo, const att_v16 *x)
{
    for (int l = 0; l < 16; l++) {
        const float v = (*x)[l];
        (*lo)[l] = v != v || v < -87.0f ? -87.0f : (v > 0.0f ? 0.0f : v);
    }
}

static inline __attribute__((always_inline)) void
att_fix16_any(att_v16 *y, const att_v16 *x)
{
    for (int l = 0; l < 16; l++) {
        const float v = (*x)[l];
        (*y)[l] = v != v ? v : (v < -87.0f ? 0.0f : (*y)[l]);
    }
}

#if defined(__x86_64__) || defined(__i386__)
static inline __attribute__((target("avx512f"), always_inline)) void
att_max16_512(att_v16 *m, const att_v16 *s)
{
    __m512 a, b;
    memcpy(&a, s, sizeof(a));
    memcpy(&b, m, sizeof(b));
    a = _mm512_max_ps(a, b); /* vmaxps: the second operand when either is a NaN or both are 0 */
    memcpy(m, &a, sizeof(a));
}

static inline __attribute__((target("avx512f"), always_inline)) void
att_clamp16_512(att_v16 *lo, const att_v16 *x)
{
    __m512 v;
    memcpy(&v, x, sizeof(v));
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-87.0f)), _mm512_setzero_ps());
    memcpy(lo, &v, sizeof(v));
}

static inline __attribute__((target("avx512f"), always_inline)) void
att_fix16_512(att_v16 *y, const att_v16 *x)
{
    __m512 v, w;
    memcpy(&v, x, sizeof(v));
    memcpy(&w, y, sizeof(w));
    w = _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(v, _mm512_set1_ps(-87.0f), _CMP_LT_OQ), w);
    w = _mm512_mask_mov_ps(w, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
    memcpy(y, &w, sizeof(w));
}

static inline __attribute__((target("avx2,fma"), always_inline)) void
att_max16_256(att_v16 *m, const att_v16 *s)
{
    for (int h = 0; h < 2; h++) {
        __m256 a, b;
        memcpy(&a, (const float *)s + 8 * h, sizeof(a));
        memcpy(&b, (float *)m + 8 * h, sizeof(b));
        a = _mm256_max_ps(a, b);
        memcpy((float *)m + 8 * h, &a, sizeof(a));
    }
}

static inline __attribute__((target("avx2,fma"), always_inline)) void
att_clamp16_256(att_v16 *lo, const att_v16 *x)
{
    for (int h = 0; h < 2; h++) {
        __m256 v;
        memcpy(&v, (const float *)x + 8 * h, sizeof(v));
        v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-87.0f)), _mm256_setzero_ps());
        memcpy((float *)lo + 8 * h, &v, sizeof(v));
    }
}

static inline __attribute__((target("avx2,fma"), always_inline)) void
att_fix16_256(att_v16 *y, const att_v16 *x)
{
    for (int h = 0; h < 2; h++) {
        __m256 v, w;
        memcpy(&v, (const float *)x + 8 * h, sizeof(v));
        memcpy(&w, (float *)y + 8 * h, sizeof(w));
        w = _mm256_andnot_ps(_mm256_cmp_ps(v, _mm256_set1_ps(-87.0f), _CMP_LT_OQ), w);
        w = _mm256_blendv_ps(w, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        memcpy((float *)y + 8 * h, &w, sizeof(w));
    }
}
#endif

/* The NaN every path writes for a NaN output (x86's fma passes on one operand's NaN, and
 * which operand depends on the instruction form; a NaN's payload is not part of the result). */
static const float att_nan = NAN;

typedef void (*att_scores_fn)(const float *qt, const float *k, size_t tf, uint32_t m, uint32_t Da,
                              float scale, float *sc, int nv);
typedef void (*att_pv_fn)(const be_kv *kv, const uint32_t *pages, size_t voff, uint32_t Da,
                          const float *e, const int32_t *nn, uint32_t nmin, uint32_t jlo,
                          uint32_t jhi, uint32_t nend, float *out, int nv);
typedef void (*att_scores_few_fn)(const float *const *q, uint32_t nq, const float *k, size_t tf,
                                  uint32_t m, uint32_t Da, float scale, float *sc);
typedef void (*att_pv_one_fn)(const be_kv *kv, const uint32_t *pages, size_t voff, uint32_t Da,
                              const float *e, uint32_t n, float *out);

#define ATT_FEW 4 /* blocks of at most this many queries take the lanes-over-keys / dims kernels */
#define ATT_PV_SPAN 256u /* positions of an exps + V sums span (att_run; whole pages) */
#define ATT_K_AHEAD 1u   /* pages ahead of the page being scored whose K rows are prefetched */
#define ATT_PV_AHEAD 2u  /* pages ahead of its rows whose V rows att_pv prefetches */

/*
 * One block (be_cpu_attn_fn) with a path's scores and V kernels, lane
 * groups of L lanes in vectors of W. scr: qt (Da x QMAX, later the V sums)
 * then the key-major scores / exps (nmax x QMAX).
 */
static inline __attribute__((always_inline)) void
att_run(const be_cpu_attn_blk *b, float *scr, att_scores_fn scores, att_pv_fn pv,
        att_scores_few_fn scores_few, att_pv_one_fn pv_one, uint32_t L, uint32_t W,
        att_sel_fn max16, att_sel_fn clamp16, att_sel_fn fix16)
{
    enum { QM = BE_CPU_ATTN_QMAX };
    const be_kv *kv = b->kv;
    const uint32_t nq = b->nq, Da = b->Da, PT = kv->page_tokens;
    const uint32_t nl = (nq + 15) / 16 * 16; /* lanes computed: whole 16-lane chunks */
    const uint32_t nmax = b->nn[nq - 1], nmin = b->nn[0];
    const size_t tf = kv->tok_floats, page_floats = (size_t)PT * tf;
    const uint32_t *pages = kv->slots[b->slot].pages;
    float *qt = scr, *sc = scr + (size_t)QM * Da;
    int32_t nn[QM] __attribute__((aligned(64)));
    float mx[QM] __attribute__((aligned(64)));
    double sum[QM] __attribute__((aligned(64)));

    for (uint32_t i = 0; i < QM; i++) {
        nn[i] = i < nq ? (int32_t)b->nn[i] : 0;
        mx[i] = -INFINITY;
    }
    const bool few = nq <= ATT_FEW;
    if (few) { /* decode: too few queries to fill vectors */
        for (uint32_t j = 0; j < nmax; j++)
            for (uint32_t i = nq; i < nl; i++)
                sc[(size_t)j * QM + i] = 0.0f;
    } else {
        for (uint32_t d = 0; d < Da; d++) {
            float *row = qt + (size_t)d * QM;
            for (uint32_t i = 0; i < nq; i++)
                row[i] = b->q[i][d];
            for (uint32_t i = nq; i < nl; i++)
                row[i] = 0.0f;
        }
    }
    for (uint32_t j0 = 0; j0 < nmax; j0 += PT) {
        const float *k = kv->pool + (size_t)pages[j0 / PT] * page_floats + b->koff;
        const uint32_t m = nmax - j0 < PT ? nmax - j0 : PT;
        if (j0 + ATT_K_AHEAD * PT < nmax) { /* later keys on their way while these are scored */
            const uint32_t ja = j0 + ATT_K_AHEAD * PT;
            const float *kn = kv->pool + (size_t)pages[ja / PT] * page_floats + b->koff;
            const uint32_t mn = nmax - ja < PT ? nmax - ja : PT;
            for (uint32_t r = 0; r < mn; r++)
                for (uint32_t d = 0; d < Da; d += 16)
                    __builtin_prefetch(kn + (size_t)r * tf + d, 0, 3);
        }
        if (few) {
            scores_few(b->q, nq, k, tf, m, Da, b->scale, sc + (size_t)j0 * QM);
        } else {
            for (uint32_t g0 = 0; g0 < nl; g0 += L) {
                const uint32_t lanes = nl - g0 < L ? nl - g0 : L;
                scores(qt + g0, k, tf, m, Da, b->scale, sc + (size_t)j0 * QM + g0,
                       (int)(lanes / W));
            }
        }
        /* the block's later positions get no weight; the max while the page's rows are hot */
        for (uint32_t j = j0 > nmin ? j0 : nmin; j < j0 + m; j++)
            for (uint32_t i = 0; i < nq; i++)
                if ((int32_t)j >= nn[i])
                    sc[(size_t)j * QM + i] = -INFINITY;
        for (uint32_t c = 0; c < nl; c += 16) { /* the max: m = s > m ? s : m, per lane, in order */
            att_v16 mv, sv;
            memcpy(&mv, mx + c, sizeof(mv));
            for (uint32_t j = j0; j < j0 + m; j++) {
                memcpy(&sv, sc + (size_t)j * QM + c, sizeof(sv));
                max16(&mv, &sv);
            }
            memcpy(mx + c, &mv, sizeof(mv));
        }
    }
    /*
     * Exps, their sums and the V sums span by span (ATT_PV_SPAN positions,
     * in order): a span's exps are still in the core's L2 when its V sums
     * read them once per group of dims. Each lane's sum and V chains run
     * over the positions in order across the spans, from where the last
     * span left them (a double, a float stored and loaded as they are).
     */
    const uint32_t span = ATT_PV_SPAN > PT ? ATT_PV_SPAN / PT * PT : PT;
    for (uint32_t c = 0; c < nl; c += 16)
        for (int l = 0; l < 16; l++)
            sum[c + (uint32_t)l] = 0.0;
    for (uint32_t jlo = 0; jlo < nmax; jlo += span) {
        const uint32_t jhi = nmax - jlo < span ? nmax : jlo + span;
        for (uint32_t c = 0; c < nl; c += 16) { /* the exps and their sums in double, in order */
            att_d8 s0, s1;
            memcpy(&s0, sum + c, sizeof(s0));
            memcpy(&s1, sum + c + 8, sizeof(s1));
            for (uint32_t j = jlo; j < jhi; j++) {
                float *e = sc + (size_t)j * QM + c;
                att_v8 h0, h1;
                att_exp16(e, mx + c, clamp16, fix16);
                memcpy(&h0, e, sizeof(h0));
                memcpy(&h1, e + 8, sizeof(h1));
                s0 = s0 + __builtin_convertvector(h0, att_d8);
                s1 = s1 + __builtin_convertvector(h1, att_d8);
            }
            memcpy(sum + c, &s0, sizeof(s0));
            memcpy(sum + c + 8, &s1, sizeof(s1));
        }
        for (uint32_t g0 = 0; !few && g0 < nq; g0 += L) { /* the V sums into qt, lanes = queries */
            const uint32_t last = (nq - g0 < L ? nq : g0 + L) - 1;
            const uint32_t lanes = (last - g0 + 16) / 16 * 16;
            const uint32_t gmax = (uint32_t)nn[last]; /* the group's positions: 0..gmax-1 */
            if (jlo < gmax)
                pv(kv, pages, b->voff, Da, sc + g0, nn + g0, (uint32_t)nn[g0], jlo,
                   jhi < gmax ? jhi : gmax, gmax, qt + g0, (int)(lanes / W));
        }
    }
    for (uint32_t i = 0; few && i < nq; i++) /* the V sums into qt, lanes = dims */
        pv_one(kv, pages, b->voff, Da, sc + i, (uint32_t)nn[i], qt + i);
    for (uint32_t i = 0; i < nq; i++) {
        const float inv = (float)(1.0 / sum[i]);
        float *o = b->o[i];
        for (uint32_t d = 0; d < Da; d++) {
            const float v = qt[(size_t)d * QM + i] * inv;
            o[d] = v == v ? v : att_nan; /* one NaN: fmaf and vfmadd keep different operands' */
        }
    }
}

/* ---- the paths ------------------------------------------------------------ */

#if defined(__x86_64__) || defined(__i386__)
#define ATT_NAME(x) x##_avx512
#define ATT_TGT __attribute__((target("avx512f")))
#define ATT_V __m512
#define ATT_NN __m512i
#define ATT_W 16
#define ATT_G 2
#define ATT_ACC 16
#define ATT_LD(p) _mm512_loadu_ps(p)
#define ATT_ST(p, v) _mm512_storeu_ps((p), (v))
#define ATT_SET1(x) _mm512_set1_ps(x)
#define ATT_ZERO() _mm512_setzero_ps()
#define ATT_MUL(a, b) _mm512_mul_ps((a), (b))
#define ATT_ADD(a, b) _mm512_add_ps((a), (b))
#define ATT_LD4K(kp, d)                                                                            \
    _mm512_insertf32x4(                                                                            \
        _mm512_insertf32x4(_mm512_insertf32x4(_mm512_castps128_ps512(_mm_loadu_ps((kp)[0] + (d))),  \
                                              _mm_loadu_ps((kp)[1] + (d)), 1),                     \
                           _mm_loadu_ps((kp)[2] + (d)), 2),                                        \
        _mm_loadu_ps((kp)[3] + (d)), 3)
#define ATT_BC4(p) _mm512_broadcast_f32x4(_mm_loadu_ps(p))
#define ATT_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define ATT_NN_LD(p) _mm512_loadu_si512((const void *)(p))
#define ATT_FMA_IF(a, b, c, nn, j)                                                                 \
    _mm512_mask3_fmadd_ps((a), (b), (c), _mm512_cmpgt_epi32_mask((nn), _mm512_set1_epi32((int)(j))))
#define ATT_MAX16 att_max16_512
#define ATT_CLAMP16 att_clamp16_512
#define ATT_FIX16 att_fix16_512
#include "be_cpu_attn_body.h"

#define ATT_NAME(x) x##_avx2
#define ATT_TGT __attribute__((target("avx2,fma")))
#define ATT_V __m256
#define ATT_NN __m256i
#define ATT_W 8
#define ATT_G 2
#define ATT_ACC 8
#define ATT_LD(p) _mm256_loadu_ps(p)
#define ATT_ST(p, v) _mm256_storeu_ps((p), (v))
#define ATT_SET1(x) _mm256_set1_ps(x)
#define ATT_ZERO() _mm256_setzero_ps()
#define ATT_MUL(a, b) _mm256_mul_ps((a), (b))
#define ATT_ADD(a, b) _mm256_add_ps((a), (b))
#define ATT_LD4K(kp, d)                                                                            \
    _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps((kp)[0] + (d))),                      \
                         _mm_loadu_ps((kp)[1] + (d)), 1)
#define ATT_BC4(p) _mm256_broadcast_ps((const __m128 *)(const void *)(p))
#define ATT_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define ATT_NN_LD(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define ATT_FMA_IF(a, b, c, nn, j)                                                                 \
    _mm256_blendv_ps((c), _mm256_fmadd_ps((a), (b), (c)),                                          \
                     _mm256_castsi256_ps(_mm256_cmpgt_epi32((nn), _mm256_set1_epi32((int)(j)))))
#define ATT_MAX16 att_max16_256
#define ATT_CLAMP16 att_clamp16_256
#define ATT_FIX16 att_fix16_256
#include "be_cpu_attn_body.h"
#endif

/* Portable: 4-lane vectors, fmaf per lane (one rounding, as the vector fma). */
typedef float att_v4 __attribute__((vector_size(16)));
typedef int32_t att_i4 __attribute__((vector_size(16)));

static inline __attribute__((always_inline)) att_v4
att_ld4(const float *p)
{
    att_v4 v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline __attribute__((always_inline)) att_i4
att_ld4i(const int32_t *p)
{
    att_i4 v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline __attribute__((always_inline)) att_v4
att_set4(float x)
{
    return (att_v4){x, x, x, x};
}

static inline __attribute__((always_inline)) att_v4
att_fma4(att_v4 a, att_v4 b, att_v4 c)
{
    for (int l = 0; l < 4; l++)
        c[l] = fmaf(a[l], b[l], c[l]);
    return c;
}

static inline __attribute__((always_inline)) att_v4
att_fma4_if(att_v4 a, att_v4 b, att_v4 c, att_i4 nn, uint32_t j)
{
    for (int l = 0; l < 4; l++)
        if (nn[l] > (int32_t)j)
            c[l] = fmaf(a[l], b[l], c[l]);
    return c;
}

#define ATT_NAME(x) x##_generic
#define ATT_TGT
#define ATT_V att_v4
#define ATT_NN att_i4
#define ATT_W 4
#define ATT_G 4
#define ATT_ACC 16
#define ATT_LD(p) att_ld4(p)
#define ATT_ST(p, v)                                                                               \
    do {                                                                                           \
        const att_v4 st_v_ = (v);                                                                  \
        memcpy((p), &st_v_, sizeof(st_v_));                                                        \
    } while (0)
#define ATT_SET1(x) att_set4(x)
#define ATT_ZERO() ((att_v4){0.0f, 0.0f, 0.0f, 0.0f})
#define ATT_MUL(a, b) ((a) * (b))
#define ATT_ADD(a, b) ((a) + (b))
#define ATT_LD4K(kp, d) att_ld4((kp)[0] + (d))
#define ATT_BC4(p) att_ld4(p)
#define ATT_FMA(a, b, c) att_fma4((a), (b), (c))
#define ATT_NN_LD(p) att_ld4i(p)
#define ATT_FMA_IF(a, b, c, nn, j) att_fma4_if((a), (b), (c), (nn), (j))
#define ATT_MAX16 att_max16_any
#define ATT_CLAMP16 att_clamp16_any
#define ATT_FIX16 att_fix16_any
#include "be_cpu_attn_body.h"

be_cpu_attn_fn
be_cpu_attn_pick(be_cpu_isa isa)
{
#if defined(__x86_64__) || defined(__i386__)
    if (isa == BE_CPU_ISA_AVX512)
        return be_cpu_attn_avx512;
    if (isa == BE_CPU_ISA_AVX2)
        return be_cpu_attn_avx2;
#endif
    (void)isa;
    return be_cpu_attn_generic;
}
