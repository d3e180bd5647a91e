/*
 * semantic_step.h - the dot products of the semantic search (matcher.c), written once and
 * included once per vector width like matcher_step.h: matcher.c defines
 *
 *     SEM_NAME   the function's name
 *     SEM_ATTR   its attributes (a target("...") for the wider x86-64 levels, or nothing)
 *     SEM_VL     lanes per GNU C vector: 16, 8 or 4
 *     SEM_QB, SEM_EB  queries x entries computed together (registers: see below)
 * (this file undefines them at its end).
 *
 * out[q · ldo + y] = x_q · e_y for the n queries x_q (at X + q · ldx) and the entries
 * e_y (at E + y · lde), y < size, each computed in the one order matcher.c defines
 * (SEM_LANES running sums, sum i takes the products of elements i, i + 16, i + 32, ... in
 * turn, a missing tail element adds nothing; then the sums folded 8, 4, 2 and 1 apart),
 * with lane-wise IEEE single-precision operations, never contracted: the same bits for
 * every vector width, every CPU and every number of queries. SEM_QB queries x SEM_EB
 * entries go together, their sums in registers: each chunk of an embedding loaded is
 * used SEM_QB (or SEM_EB) times, and the chains of additions are independent.
 */
#define SEM_CAT2(a, b) a##b
#define SEM_CAT(a, b) SEM_CAT2(a, b)
#define SFV SEM_CAT(SEM_NAME, _fv)
#define SFVU SEM_CAT(SEM_NAME, _fvu)
#define SEM_BLOCK SEM_CAT(SEM_NAME, _block)
#define SNV (SEM_LANES / SEM_VL)
typedef float SFV __attribute__((vector_size(SEM_VL * 4)));
typedef float SFVU __attribute__((vector_size(SEM_VL * 4), aligned(4), may_alias));
#define SLD(p) ((SFV)(*(const SFVU *)(const void *)(p)))
#define SST(p, v) (*(SFVU *)(void *)(p) = (SFVU)(v))

/* Row src's last partial chunk (rest floats after full chunks) into dst, zero-padded. */
static inline void SEM_CAT(SEM_NAME, _pad)(float *dst, const float *src, int32_t full,
                                           int32_t rest) {
    memset(dst, 0, SEM_LANES * sizeof *dst);
    memcpy(dst, src + (size_t)full * SEM_LANES, (size_t)rest * sizeof *dst);
}

/* QB queries x EB entries, all their sums in registers. ex/xq: the entries' / queries'
 * rows; et/xt: their zero-padded last partial chunks; dst[q][e]: where each result goes. */
SEM_ATTR __attribute__((always_inline))
static inline void SEM_BLOCK(const int QB, const int EB, const float *const *ex,
                             const float *const *et, const float *const *xq,
                             const float *const *xt, int32_t full, int32_t rest,
                             float *out, int64_t ldo, int32_t q0, int32_t y0) {
    SFV acc[SEM_QB][SEM_EB][SNV];
    SEM_UNROLL
    for (int a = 0; a < QB; a++)
        SEM_UNROLL
        for (int b = 0; b < EB; b++)
            SEM_UNROLL
            for (int v = 0; v < SNV; v++) acc[a][b][v] = (SFV){0};
    const int32_t chunks = full + (rest ? 1 : 0);
    for (int32_t k = 0; k < chunks; k++) {
        SEM_UNROLL
        for (int v = 0; v < SNV; v++) {
            SFV e[SEM_EB], x[SEM_QB];
            SEM_UNROLL
            for (int b = 0; b < EB; b++)
                e[b] = k < full ? SLD(ex[b] + (size_t)k * SEM_LANES + v * SEM_VL)
                                : SLD(et[b] + v * SEM_VL);
            SEM_UNROLL
            for (int a = 0; a < QB; a++)
                x[a] = k < full ? SLD(xq[a] + (size_t)k * SEM_LANES + v * SEM_VL)
                                : SLD(xt[a] + v * SEM_VL);
            SEM_UNROLL
            for (int a = 0; a < QB; a++)
                SEM_UNROLL
                for (int b = 0; b < EB; b++) {
                    const SFV p = x[a] * e[b];
                    acc[a][b][v] = acc[a][b][v] + p;
                }
        }
    }
    SEM_UNROLL
    for (int a = 0; a < QB; a++)
        SEM_UNROLL
        for (int b = 0; b < EB; b++) {
            float t[SEM_LANES];
            SEM_UNROLL
            for (int v = 0; v < SNV; v++) SST(t + v * SEM_VL, acc[a][b][v]);
            out[(size_t)(q0 + a) * ldo + y0 + b] = sem_fold(t);
        }
}

SEM_ATTR
static void SEM_NAME(const float *E, int64_t lde, int32_t size, int32_t h, const float *X,
                     int64_t ldx, int32_t n, float *out, int64_t ldo, float *tails) {
    const int32_t full = h / SEM_LANES, rest = h % SEM_LANES;
    /* tails: [n + SEM_EB][SEM_LANES] zero-padded last chunks, the queries' first */
    float *qt = tails, *etl = tails + (size_t)n * SEM_LANES;
    for (int32_t q = 0; q < n && rest; q++)
        SEM_CAT(SEM_NAME, _pad)(qt + (size_t)q * SEM_LANES, X + (size_t)q * ldx, full, rest);
    /* entries outer (each block of SEM_EB is read once), queries inner */
    for (int32_t y0 = 0; y0 < size;) {
        const int eb = size - y0 >= SEM_EB ? SEM_EB : 1;
        const float *ex[SEM_EB], *et[SEM_EB];
        for (int b = 0; b < eb; b++) {
            ex[b] = E + (size_t)(y0 + b) * lde;
            et[b] = etl + (size_t)b * SEM_LANES;
            if (rest) SEM_CAT(SEM_NAME, _pad)(etl + (size_t)b * SEM_LANES, ex[b], full, rest);
        }
        for (int32_t q0 = 0; q0 < n;) {
            const int qb = n - q0 >= SEM_QB ? SEM_QB : 1;
            const float *xq[SEM_QB], *xt[SEM_QB];
            for (int a = 0; a < qb; a++) {
                xq[a] = X + (size_t)(q0 + a) * ldx;
                xt[a] = qt + (size_t)(q0 + a) * SEM_LANES;
            }
            if (qb == SEM_QB && eb == SEM_EB)
                SEM_BLOCK(SEM_QB, SEM_EB, ex, et, xq, xt, full, rest, out, ldo, q0, y0);
            else if (qb == SEM_QB)
                SEM_BLOCK(SEM_QB, 1, ex, et, xq, xt, full, rest, out, ldo, q0, y0);
            else if (eb == SEM_EB)
                SEM_BLOCK(1, SEM_EB, ex, et, xq, xt, full, rest, out, ldo, q0, y0);
            else
                SEM_BLOCK(1, 1, ex, et, xq, xt, full, rest, out, ldo, q0, y0);
            q0 += qb;
        }
        y0 += eb;
    }
}

#undef SLD
#undef SST
#undef SNV
#undef SFV
#undef SFVU
#undef SEM_BLOCK
#undef SEM_CAT
#undef SEM_CAT2
/* the parameters too: the next instance defines its own */
#undef SEM_NAME
#undef SEM_ATTR
#undef SEM_VL
#undef SEM_QB
#undef SEM_EB
