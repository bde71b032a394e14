/*
 * The vector kernels of be_cpu_attn, written once and included by
 * be_cpu_attn.c once per ISA path (not a header of its own: it has no
 * include guard, uses the ATT_* macros the includer defines and undefines
 * them at its end):
 *   ATT_NAME(x)   x with the path's suffix        ATT_TGT    the target attribute
 *   ATT_V         a vector of ATT_W floats        ATT_NN     a vector of ATT_W int32
 *   ATT_G         most vectors of a lane group    ATT_ACC    accumulators a kernel holds
 *   ATT_LD(p), ATT_ST(p, v), ATT_SET1(x), ATT_ZERO(), ATT_MUL(a, b), ATT_ADD(a, b)
 *   ATT_LD4K(kp, d)             kp[u][d..d+3] in the u-th quarter, u < ATT_W / 4
 *   ATT_BC4(p)                  p[0..3] in every quarter
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
 * lane] = ((p0 + p1) + (p2 + p3)) * scale, p_l the fma chain over the dims
 * d = l mod 4 (4 accumulators per key and lane vector).
 */
/* One dim d of att_scores: its partial (acc + l, every 4th accumulator) for kg keys x nv vectors. */
static inline ATT_TGT __attribute__((always_inline)) void
ATT_NAME(att_scores_dim)(const float *qt, const float *k, size_t tf, uint32_t d, ATT_V *acc,
                         const int nv, const int kg)
{
    ATT_V a[ATT_G];
    _Pragma("GCC unroll 4") for (int z = 0; z < nv; z++) a[z] =
        ATT_LD(qt + (size_t)d * BE_CPU_ATTN_QMAX + z * ATT_W);
    _Pragma("GCC unroll 16") for (int kk = 0; kk < kg; kk++)
    {
        const ATT_V b = ATT_SET1(k[(size_t)kk * tf + d]);
        _Pragma("GCC unroll 4") for (int z = 0; z < nv; z++) acc[(kk * nv + z) * 4] =
            ATT_FMA(a[z], b, acc[(kk * nv + z) * 4]);
    }
}

static inline ATT_TGT __attribute__((always_inline)) void
ATT_NAME(att_scores)(const float *qt, const float *k, size_t tf, uint32_t Da, float scale,
                     float *sc, const int nv, const int kg)
{
    ATT_V acc[ATT_ACC];
    _Pragma("GCC unroll 16") for (int x = 0; x < kg * nv * 4; x++) acc[x] = ATT_ZERO();
    uint32_t d = 0;
    for (; d + 4 <= Da; d += 4) {
        _Pragma("GCC unroll 4") for (int l = 0; l < 4; l++)
            ATT_NAME(att_scores_dim)(qt, k, tf, d + (uint32_t)l, acc + l, nv, kg);
    }
    _Pragma("GCC unroll 4") for (int l = 0; l < 3; l++) /* the last Da mod 4 dims */
    {
        if (d + (uint32_t)l >= Da)
            break;
        ATT_NAME(att_scores_dim)(qt, k, tf, d + (uint32_t)l, acc + l, nv, kg);
    }
    const ATT_V s = ATT_SET1(scale);
    _Pragma("GCC unroll 16") for (int kk = 0; kk < kg; kk++)
    {
        _Pragma("GCC unroll 4") for (int z = 0; z < nv; z++)
        {
            const ATT_V *p = acc + (kk * nv + z) * 4;
            const ATT_V t = ATT_ADD(ATT_ADD(p[0], p[1]), ATT_ADD(p[2], p[3]));
            ATT_ST(sc + (size_t)kk * BE_CPU_ATTN_QMAX + z * ATT_W, ATT_MUL(t, s));
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
    const int kg = ATT_ACC / (4 * nv);
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
 * chain over the positions jlo <= j < nmax in order (jlo a multiple of the
 * page size), in the lanes whose nn > j (nn: the lanes' positions; every
 * lane has nn >= nmin), into out[dd * QMAX + lane], from +0 when jlo is 0,
 * else on from what out holds (the chain's value after position jlo - 1:
 * stored and loaded as the fp32 it is, so a chain cut in spans has the
 * bits of one run).
 */
static inline ATT_TGT __attribute__((always_inline)) void
ATT_NAME(att_pv)(const be_kv *kv, const uint32_t *pages, size_t voff, const float *e,
                 const int32_t *nn, uint32_t nmin, uint32_t jlo, uint32_t nmax, uint32_t nend,
                 float *out, const int nv, const int dg)
{
    const uint32_t PT = kv->page_tokens;
    const size_t tf = kv->tok_floats, page_floats = (size_t)PT * tf;
    ATT_V acc[ATT_ACC];
    ATT_NN nnv[ATT_G];
    if (jlo == 0) {
        _Pragma("GCC unroll 16") for (int x = 0; x < dg * nv; x++) acc[x] = ATT_ZERO();
    } else {
        _Pragma("GCC unroll 16") for (int dd = 0; dd < dg; dd++)
        {
            _Pragma("GCC unroll 4") for (int z = 0; z < nv; z++) acc[dd * nv + z] =
                ATT_LD(out + (size_t)dd * BE_CPU_ATTN_QMAX + z * ATT_W);
        }
    }
    _Pragma("GCC unroll 4") for (int z = 0; z < nv; z++) nnv[z] = ATT_NN_LD(nn + z * ATT_W);
    for (uint32_t j0 = jlo; j0 < nmax; j0 += PT) {
        const float *base = kv->pool + (size_t)pages[j0 / PT] * page_floats + voff;
        const uint32_t m = nmax - j0 < PT ? nmax - j0 : PT;
        const uint32_t all = nmin <= j0 ? 0 : (nmin - j0 < m ? nmin - j0 : m);
        /* these dims of the rows ATT_PV_AHEAD pages on, while they last: a row is 2 KiB and
           more apart, so the hardware's stream prefetch (within 4 KiB) leaves each miss to
           memory exposed */
        const uint32_t ja = j0 + ATT_PV_AHEAD * PT;
        const float *pf = ja < nend ? kv->pool + (size_t)pages[ja / PT] * page_floats + voff
                                    : NULL;
        const uint32_t mpf = pf == NULL ? 0 : (nend - ja < m ? nend - ja : m);
        uint32_t r = 0;
        for (; r < all; r++) {
            const float *er = e + (size_t)(j0 + r) * BE_CPU_ATTN_QMAX, *vr = base + r * tf;
            if (r < mpf)
                __builtin_prefetch(pf + r * tf, 0, 3);
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
            if (r < mpf)
                __builtin_prefetch(pf + r * tf, 0, 3);
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
#if ATT_G >= 3
    case 3:
        ATT_NAME(att_scores_page)(qt, k, tf, m, Da, scale, sc, 3);
        break;
    case 4:
        ATT_NAME(att_scores_page)(qt, k, tf, m, Da, scale, sc, 4);
        break;
#endif
    default:
        break;
    }
}

/*
 * All dims of the lanes' outputs for the positions jlo..jhi-1 (att_pv; nend:
 * the lanes' last position + 1), dg at a time while they last, then 8, 4, 2,
 * then one by one.
 */
static inline ATT_TGT __attribute__((always_inline)) void
ATT_NAME(att_pv_dims)(const be_kv *kv, const uint32_t *pages, size_t voff, uint32_t Da,
                      const float *e, const int32_t *nn, uint32_t nmin, uint32_t jlo,
                      uint32_t jhi, uint32_t nend, float *out, const int nv)
{
    const int dg = ATT_ACC / nv;
    uint32_t d = 0;
    for (; d + (uint32_t)dg <= Da; d += (uint32_t)dg)
        ATT_NAME(att_pv)(kv, pages, voff + d, e, nn, nmin, jlo, jhi, nend,
                         out + (size_t)d * BE_CPU_ATTN_QMAX, nv, dg);
    _Pragma("GCC unroll 4") for (int h = 8; h > 1; h /= 2) /* the rest: 8, 4, 2 dims a pass */
    {
        if (h < dg && d + (uint32_t)h <= Da) {
            ATT_NAME(att_pv)(kv, pages, voff + d, e, nn, nmin, jlo, jhi, nend,
                             out + (size_t)d * BE_CPU_ATTN_QMAX, nv, h);
            d += (uint32_t)h;
        }
    }
    for (; d < Da; d++)
        ATT_NAME(att_pv)(kv, pages, voff + d, e, nn, nmin, jlo, jhi, nend,
                         out + (size_t)d * BE_CPU_ATTN_QMAX, nv, 1);
}

static ATT_TGT void
ATT_NAME(att_pv_nv)(const be_kv *kv, const uint32_t *pages, size_t voff, uint32_t Da,
                    const float *e, const int32_t *nn, uint32_t nmin, uint32_t jlo, uint32_t jhi,
                    uint32_t nend, float *out, int nv)
{
    switch (nv) {
    case 1:
        ATT_NAME(att_pv_dims)(kv, pages, voff, Da, e, nn, nmin, jlo, jhi, nend, out, 1);
        break;
    case 2:
        ATT_NAME(att_pv_dims)(kv, pages, voff, Da, e, nn, nmin, jlo, jhi, nend, out, 2);
        break;
#if ATT_G >= 3
    case 3:
        ATT_NAME(att_pv_dims)(kv, pages, voff, Da, e, nn, nmin, jlo, jhi, nend, out, 3);
        break;
    case 4:
        ATT_NAME(att_pv_dims)(kv, pages, voff, Da, e, nn, nmin, jlo, jhi, nend, out, 4);
        break;
#endif
    default:
        break;
    }
}

/*
 * The scores of nq <= ATT_FEW queries (at q, each Da floats) with the m
 * keys of one page (at k, stride tf), into sc (rows of QMAX): the same
 * values as att_scores, with the lanes over keys times the 4 partial
 * chains (ATT_W / 4 keys a vector: 4 consecutive dims of each, the query's
 * 4 dims broadcast to each key's quarter), for blocks too small to fill
 * vectors with queries (decode).
 */
static ATT_TGT void
ATT_NAME(att_scores_few)(const float *const *q, uint32_t nq, const float *k, size_t tf, uint32_t m,
                         uint32_t Da, float scale, float *sc)
{
    enum { KV = ATT_W / 4 };
    const uint32_t D4 = Da / 4 * 4;
    for (uint32_t r = 0; r < m; r += KV) {
        const float *kp[KV];
        for (int u = 0; u < KV; u++) /* past the page's last key: that key again, unused */
            kp[u] = k + (size_t)(r + (uint32_t)u < m ? r + (uint32_t)u : m - 1) * tf;
        ATT_V acc[ATT_FEW];
        _Pragma("GCC unroll 4") for (int i = 0; i < ATT_FEW; i++) acc[i] = ATT_ZERO();
        for (uint32_t d = 0; d < D4; d += 4) {
            const ATT_V kv4 = ATT_LD4K(kp, d);
            _Pragma("GCC unroll 4") for (int i = 0; i < ATT_FEW; i++) if ((uint32_t)i < nq)
                acc[i] = ATT_FMA(ATT_BC4(q[i] + d), kv4, acc[i]);
        }
        _Pragma("GCC unroll 4") for (uint32_t i = 0; i < ATT_FEW; i++) {
            if (i >= nq)
                break;
            float p[ATT_W];
            ATT_ST(p, acc[i]);
            for (int u = 0; u < KV && r + (uint32_t)u < m; u++) {
                float *pu = p + 4 * u;
                for (uint32_t d = D4; d < Da; d++)
                    pu[d & 3] = fmaf(q[i][d], kp[u][d], pu[d & 3]);
                sc[(size_t)(r + (uint32_t)u) * BE_CPU_ATTN_QMAX + i] =
                    ((pu[0] + pu[1]) + (pu[2] + pu[3])) * scale;
            }
        }
    }
}

/*
 * One query's weighted sum of V over nvc vectors of dims from d0, lanes
 * over the dims: out[d * QMAX] = the fma chain over j < n in order of
 * e[j * QMAX] * v_j[d] (att_pv's values for that lane).
 */
static inline ATT_TGT __attribute__((always_inline)) void
ATT_NAME(att_pv_one_chunk)(const be_kv *kv, const uint32_t *pages, size_t voff, uint32_t d0,
                           const float *e, uint32_t n, float *out, const int nvc)
{
    const uint32_t PT = kv->page_tokens;
    const size_t tf = kv->tok_floats, page_floats = (size_t)PT * tf;
    ATT_V acc[ATT_ACC];
    _Pragma("GCC unroll 16") for (int c = 0; c < nvc; c++) acc[c] = ATT_ZERO();
    for (uint32_t j0 = 0; j0 < n; j0 += PT) {
        const float *base = kv->pool + (size_t)pages[j0 / PT] * page_floats + voff + d0;
        const uint32_t m = n - j0 < PT ? n - j0 : PT;
        for (uint32_t r = 0; r < m; r++) {
            const ATT_V b = ATT_SET1(e[(size_t)(j0 + r) * BE_CPU_ATTN_QMAX]);
            const float *vr = base + r * tf;
            _Pragma("GCC unroll 16") for (int c = 0; c < nvc; c++) acc[c] =
                ATT_FMA(b, ATT_LD(vr + c * ATT_W), acc[c]);
        }
    }
    _Pragma("GCC unroll 16") for (int c = 0; c < nvc; c++)
    {
        float t[ATT_W];
        ATT_ST(t, acc[c]);
        for (int l = 0; l < ATT_W; l++)
            out[(size_t)(d0 + (uint32_t)(c * ATT_W + l)) * BE_CPU_ATTN_QMAX] = t[l];
    }
}

/*
 * att_pv_one_chunk over all of a query's dims: 8 vectors at a time, then
 * 4, 2, 1, then the last dims (under a vector) one by one, each the same
 * chain.
 */
static ATT_TGT void
ATT_NAME(att_pv_one)(const be_kv *kv, const uint32_t *pages, size_t voff, uint32_t Da,
                     const float *e, uint32_t n, float *out)
{
    uint32_t d0 = 0;
    for (; d0 + 8 * ATT_W <= Da; d0 += 8 * ATT_W)
        ATT_NAME(att_pv_one_chunk)(kv, pages, voff, d0, e, n, out, 8);
    if (d0 + 4 * ATT_W <= Da) {
        ATT_NAME(att_pv_one_chunk)(kv, pages, voff, d0, e, n, out, 4);
        d0 += 4 * ATT_W;
    }
    if (d0 + 2 * ATT_W <= Da) {
        ATT_NAME(att_pv_one_chunk)(kv, pages, voff, d0, e, n, out, 2);
        d0 += 2 * ATT_W;
    }
    if (d0 + ATT_W <= Da) {
        ATT_NAME(att_pv_one_chunk)(kv, pages, voff, d0, e, n, out, 1);
        d0 += ATT_W;
    }
    const uint32_t PT = kv->page_tokens;
    const size_t tf = kv->tok_floats, page_floats = (size_t)PT * tf;
    for (uint32_t d = d0; d < Da; d++) {
        float o = 0.0f;
        for (uint32_t j = 0; j < n; j++)
            o = fmaf(e[(size_t)j * BE_CPU_ATTN_QMAX],
                     kv->pool[(size_t)pages[j / PT] * page_floats + (size_t)(j % PT) * tf + voff + d],
                     o);
        out[(size_t)d * BE_CPU_ATTN_QMAX] = o;
    }
}

static ATT_TGT void
ATT_NAME(be_cpu_attn)(const be_cpu_attn_blk *b, float *scr)
{
    att_run(b, scr, ATT_NAME(att_scores_nv), ATT_NAME(att_pv_nv), ATT_NAME(att_scores_few),
            ATT_NAME(att_pv_one), ATT_G * ATT_W, ATT_W, ATT_MAX16, ATT_CLAMP16, ATT_FIX16);
}

/* The template's parameters end with it: the next includer defines its own. */
#undef ATT_NAME
#undef ATT_TGT
#undef ATT_V
#undef ATT_NN
#undef ATT_W
#undef ATT_G
#undef ATT_ACC
#undef ATT_LD
#undef ATT_ST
#undef ATT_SET1
#undef ATT_ZERO
#undef ATT_MUL
#undef ATT_ADD
#undef ATT_LD4K
#undef ATT_BC4
#undef ATT_FMA
#undef ATT_NN_LD
#undef ATT_FMA_IF
#undef ATT_MAX16
#undef ATT_CLAMP16
#undef ATT_FIX16
