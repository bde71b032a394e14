/*
 * The vector kernels of be_cpu_attn, written once and included by
 * be_cpu_attn.c once per ISA path (not a header of its own: it has no
 * include guard and uses the ATT_* macros the includer defines):
 *   ATT_NAME(x)   x with the path's suffix        ATT_TGT    the target attribute
 *   ATT_V         a vector of ATT_W floats        ATT_NN     a vector of ATT_W int32
 *   ATT_G         most vectors of a lane group    ATT_ACC    accumulators a kernel holds
 *   ATT_LD(p), ATT_ST(p, v), ATT_SET1(x), ATT_ZERO(), ATT_MUL(a, b)
 *   ATT_FMA(a, b, c)            a * b + c, one rounding (fmaf per lane)
 *   ATT_NN_LD(p)                ATT_W int32 from p
 *   ATT_FMA_IF(a, b, c, nn, j)  ATT_FMA in the lanes whose nn > j, c in the others
 *   ATT_MAX16, ATT_CLAMP16, ATT_FIX16  the path's att_sel_fn of each (be_cpu_attn.c)
 * Lanes are queries: a block's scratch rows hold BE_CPU_ATTN_QMAX lanes,
 * split in lane groups of up to ATT_G vectors.
 */

/*
 * Scores of the nv vectors of lanes at qt (the block's transposed queries,
 * rows of BE_CPU_ATTN_QMAX) with kg keys at k (stride tf): sc[kk * QMAX +
 * lane] = the fma chain over d, times scale.
 */
static inline ATT_TGT __attribute__((always_inline)) void
ATT_NAME(att_scores)(const float *qt, const float *k, size_t tf, uint32_t Da, float scale,
                     float *sc, const int nv, const int kg)
{
    ATT_V acc[ATT_ACC];
    _Pragma("GCC unroll 16") for (int x = 0; x < kg * nv; x++) acc[x] = ATT_ZERO();
    for (uint32_t d = 0; d < Da; d++) {
        ATT_V a[ATT_G];
        _Pragma("GCC unroll 4") for (int z = 0; z < nv; z++) a[z] =
            ATT_LD(qt + (size_t)d * BE_CPU_ATTN_QMAX + z * ATT_W);
        _Pragma("GCC unroll 16") for (int kk = 0; kk < kg; kk++)
        {
            const ATT_V b = ATT_SET1(k[(size_t)kk * tf + d]);
            _Pragma("GCC unroll 4") for (int z = 0; z < nv; z++) acc[kk * nv + z] =
                ATT_FMA(a[z], b, acc[kk * nv + z]);
        }
    }
    const ATT_V s = ATT_SET1(scale);
    _Pragma("GCC unroll 16") for (int kk = 0; kk < kg; kk++)
    {
        _Pragma("GCC unroll 4") for (int z = 0; z < nv; z++)
        {
            ATT_ST(sc + (size_t)kk * BE_CPU_ATTN_QMAX + z * ATT_W, ATT_MUL(acc[kk * nv + z], s));
        }
    }
}

/*
 * The scores of one page's m keys (at k, stride tf) for the nv vectors of
 * lanes at qt, into sc: key groups as wide as the accumulators allow, then
 * one at a time (the grouping shares reads only).
 */
static inline ATT_TGT __attribute__((always_inline)) void
ATT_NAME(att_scores_page)(const float *qt, const float *k, size_t tf, uint32_t m, uint32_t Da,
                          float scale, float *sc, const int nv)
{
    const int kg = ATT_ACC / nv;
    uint32_t r = 0;
    for (; r + (uint32_t)kg <= m; r += (uint32_t)kg)
        ATT_NAME(att_scores)(qt, k + r * tf, tf, Da, scale, sc + (size_t)r * BE_CPU_ATTN_QMAX, nv,
                             kg);
    for (; r < m; r++)
        ATT_NAME(att_scores)(qt, k + r * tf, tf, Da, scale, sc + (size_t)r * BE_CPU_ATTN_QMAX, nv,
                             1);
}

/*
 * o~[dd][lane] for dd < dg dims at v (the page rows' V + the chunk's first
 * dim) and the nv vectors of lanes at e (the exps, rows of QMAX): the fma
 * chain over the positions j < nmax in order, in the lanes whose nn > j
 * (nn: the lanes' positions; every lane has nn >= nmin), into out[dd *
 * QMAX + lane].
 */
static inline ATT_TGT __attribute__((always_inline)) void
ATT_NAME(att_pv)(const be_kv *kv, const uint32_t *pages, size_t voff, const float *e,
                 const int32_t *nn, uint32_t nmin, uint32_t nmax, float *out, const int nv,
                 const int dg)
{
    const uint32_t PT = kv->page_tokens;
    const size_t tf = kv->tok_floats, page_floats = (size_t)PT * tf;
    ATT_V acc[ATT_ACC];
    ATT_NN nnv[ATT_G];
    _Pragma("GCC unroll 16") for (int x = 0; x < dg * nv; x++) acc[x] = ATT_ZERO();
    _Pragma("GCC unroll 4") for (int z = 0; z < nv; z++) nnv[z] = ATT_NN_LD(nn + z * ATT_W);
    for (uint32_t j0 = 0; j0 < nmax; j0 += PT) {
        const float *base = kv->pool + (size_t)pages[j0 / PT] * page_floats + voff;
        const uint32_t m = nmax - j0 < PT ? nmax - j0 : PT;
        const uint32_t all = nmin <= j0 ? 0 : (nmin - j0 < m ? nmin - j0 : m);
        uint32_t r = 0;
        for (; r < all; r++) {
            const float *er = e + (size_t)(j0 + r) * BE_CPU_ATTN_QMAX, *vr = base + r * tf;
            ATT_V a[ATT_G];
            _Pragma("GCC unroll 4") for (int z = 0; z < nv; z++) a[z] = ATT_LD(er + z * ATT_W);
            _Pragma("GCC unroll 16") for (int dd = 0; dd < dg; dd++)
            {
                const ATT_V b = ATT_SET1(vr[dd]);
                _Pragma("GCC unroll 4") for (int z = 0; z < nv; z++) acc[dd * nv + z] =
                    ATT_FMA(a[z], b, acc[dd * nv + z]);
            }
        }
        for (; r < m; r++) {
            const uint32_t j = j0 + r;
            const float *er = e + (size_t)j * BE_CPU_ATTN_QMAX, *vr = base + r * tf;
            ATT_V a[ATT_G];
            _Pragma("GCC unroll 4") for (int z = 0; z < nv; z++) a[z] = ATT_LD(er + z * ATT_W);
            _Pragma("GCC unroll 16") for (int dd = 0; dd < dg; dd++)
            {
                const ATT_V b = ATT_SET1(vr[dd]);
                _Pragma("GCC unroll 4") for (int z = 0; z < nv; z++) acc[dd * nv + z] =
                    ATT_FMA_IF(a[z], b, acc[dd * nv + z], nnv[z], j);
            }
        }
    }
    _Pragma("GCC unroll 16") for (int dd = 0; dd < dg; dd++)
    {
        _Pragma("GCC unroll 4") for (int z = 0; z < nv; z++)
        {
            ATT_ST(out + (size_t)dd * BE_CPU_ATTN_QMAX + z * ATT_W, acc[dd * nv + z]);
        }
    }
}

/* att_scores_page and att_pv for nv = 1..ATT_G vectors (the constant each needs). */
static ATT_TGT void
ATT_NAME(att_scores_nv)(const float *qt, const float *k, size_t tf, uint32_t m, uint32_t Da,
                        float scale, float *sc, int nv)
{
    switch (nv) {
    case 1:
        ATT_NAME(att_scores_page)(qt, k, tf, m, Da, scale, sc, 1);
        break;
    case 2:
        ATT_NAME(att_scores_page)(qt, k, tf, m, Da, scale, sc, 2);
        break;
    case 3:
        ATT_NAME(att_scores_page)(qt, k, tf, m, Da, scale, sc, 3);
        break;
    default:
        ATT_NAME(att_scores_page)(qt, k, tf, m, Da, scale, sc, 4);
        break;
    }
}

/* All dims of the lanes' outputs, dg at a time while they last, then one by one. */
static inline ATT_TGT __attribute__((always_inline)) void
ATT_NAME(att_pv_dims)(const be_kv *kv, const uint32_t *pages, size_t voff, uint32_t Da,
                      const float *e, const int32_t *nn, uint32_t nmin, uint32_t nmax,
                      float *out, const int nv)
{
    const int dg = ATT_ACC / nv;
    uint32_t d = 0;
    for (; d + (uint32_t)dg <= Da; d += (uint32_t)dg)
        ATT_NAME(att_pv)(kv, pages, voff + d, e, nn, nmin, nmax,
                         out + (size_t)d * BE_CPU_ATTN_QMAX, nv, dg);
    for (; d < Da; d++)
        ATT_NAME(att_pv)(kv, pages, voff + d, e, nn, nmin, nmax,
                         out + (size_t)d * BE_CPU_ATTN_QMAX, nv, 1);
}

static ATT_TGT void
ATT_NAME(att_pv_nv)(const be_kv *kv, const uint32_t *pages, size_t voff, uint32_t Da,
                    const float *e, const int32_t *nn, uint32_t nmin, uint32_t nmax, float *out,
                    int nv)
{
    switch (nv) {
    case 1:
        ATT_NAME(att_pv_dims)(kv, pages, voff, Da, e, nn, nmin, nmax, out, 1);
        break;
    case 2:
        ATT_NAME(att_pv_dims)(kv, pages, voff, Da, e, nn, nmin, nmax, out, 2);
        break;
    case 3:
        ATT_NAME(att_pv_dims)(kv, pages, voff, Da, e, nn, nmin, nmax, out, 3);
        break;
    default:
        ATT_NAME(att_pv_dims)(kv, pages, voff, Da, e, nn, nmin, nmax, out, 4);
        break;
    }
}

static ATT_TGT void
ATT_NAME(be_cpu_attn)(const be_cpu_attn_blk *b, float *scr)
{
    att_run(b, scr, ATT_NAME(att_scores_nv), ATT_NAME(att_pv_nv), ATT_G * ATT_W, ATT_W, ATT_MAX16,
            ATT_CLAMP16, ATT_FIX16);
}
