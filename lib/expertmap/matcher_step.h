/*
 * matcher_step.h - the trajectory step of matcher.c, written once and included once per
 * vector width (a template by #include): matcher.c defines
 *
 *     STEP_NAME   the function's name
 *     STEP_ATTR   its attributes (a target("...") for the wider x86-64 levels, or nothing)
 *     STEP_VL     lanes per GNU C vector: 16 (AVX-512), 8 (AVX2), 4 (SSE2, NEON, ...)
 *
 * A tile of W = 16 entries is W / VL native vectors: GCC lowers comparisons of vectors
 * wider than the target's element by element, so each instance uses its target's own
 * width. Every operation is a lane-wise IEEE single-precision operation, never contracted
 * to FMA (see matcher.c), so all instances give the same bits.
 *
 * One layer of the trajectory search for n queries over tiles [0, tiles) of the layer's
 * block blk ([T][J][W]): dots[q * ldd + y] += rows_q · map_y[l] (rows_q = rows + q *
 * stride), n2[y] += |map_y[l]|^2 (added to 0 instead of the old value when `first`; n2
 * NULL: not computed, and then lanes must be NULL too). With
 * lanes non-NULL, also each query's argmax of the keys d·|d| / n (0 where n is 0) over
 * entries [0, size) into best[q]: kept lane by lane (in lanes[q], scratch, when n > 1)
 * and reduced at the end.
 *
 * Tiles go STEP_GROUP (= LANE_GROUPS) at a time: each lane's sum over the J experts is
 * one dependency chain (the order of the additions is the definition), so the group's
 * chains are interleaved to keep the adders busy when J is large; and tile g of a group
 * keeps its own running argmax (lane_best group g), so that those chains are independent
 * too. A decode step (n = 1) keeps its argmax in registers for the whole layer.
 */
/* the loops over a group's tiles and a tile's vectors have a handful of iterations: fully
 * unrolled (as -O3 does by itself), their accumulators stay in registers at -O2 too */
#if defined(__clang__)
#define STEP_UNROLL _Pragma("unroll")
#else
#define STEP_UNROLL _Pragma("GCC unroll 16")
#endif
#define STEP_CAT2(a, b) a##b
#define STEP_CAT(a, b) STEP_CAT2(a, b)
#define STEP_GROUP LANE_GROUPS
#define STEP_TILES STEP_CAT(STEP_NAME, _tiles)
#define STEP_WIN STEP_CAT(STEP_NAME, _win)
#define NV (W / STEP_VL)
#define FV STEP_CAT(STEP_NAME, _fv)
#define IV STEP_CAT(STEP_NAME, _iv)
#define FVU STEP_CAT(STEP_NAME, _fvu)
#define IVU STEP_CAT(STEP_NAME, _ivu)
typedef float FV __attribute__((vector_size(STEP_VL * 4)));
typedef int32_t IV __attribute__((vector_size(STEP_VL * 4)));
typedef float FVU __attribute__((vector_size(STEP_VL * 4), aligned(4), may_alias));
typedef int32_t IVU __attribute__((vector_size(STEP_VL * 4), aligned(4), may_alias));
#define LD(p) ((FV)(*(const FVU *)(const void *)(p)))
#define ST(p, v) (*(FVU *)(void *)(p) = (FVU)(v))
#define LDI(p) ((IV)(*(const IVU *)(const void *)(p)))
#define STI(p, v) (*(IVU *)(void *)(p) = (IVU)(v))

/* Tiles [t0, t0 + G) of the step. G, ONE (n == 1 and an argmax: the decode step) and
 * WANT (an argmax) are constants at each call. bk/ba: the running argmax of the query
 * when ONE ([group][NV] vectors, kept in registers by the caller). */
STEP_ATTR __attribute__((always_inline))
static inline void STEP_TILES(const float *blk, int32_t t0, const int G, const int ONE,
                              const int WANT, int32_t J, int32_t size, int first, int32_t n,
                              const float *rows, int64_t stride, float *dots, int64_t ldd,
                              float *n2, lane_best *lanes, FV bk[STEP_GROUP][NV],
                              IV ba[STEP_GROUP][NV]) {
    const IV absmask = (IV){0} + 0x7fffffff;
    const IV sizev = (IV){0} + size;
    const FV zero = (FV){0};
    IV lane;
    STEP_UNROLL
    for (int i = 0; i < STEP_VL; i++) lane[i] = i;
    const float *b = blk + (size_t)t0 * J * W;
    const size_t tstride = (size_t)J * W; /* floats from one tile to the next */
    FV nv[STEP_GROUP][NV], live[STEP_GROUP][NV], acc1[STEP_GROUP][NV];
    STEP_UNROLL
    for (int g = 0; g < G; g++)
        STEP_UNROLL
        for (int k = 0; k < NV; k++) nv[g][k] = acc1[g][k] = live[g][k] = zero;
    if (!n2) {
        /* no norms wanted (whole-map products for the deduplication) */
    } else if (ONE) { /* one query (decode): its sums in the same pass over the block */
        for (int32_t j = 0; j < J; j++) {
            const float rj = rows[j];
            STEP_UNROLL
            for (int g = 0; g < G; g++)
                STEP_UNROLL
                for (int k = 0; k < NV; k++) {
                    const FV v = LD(b + g * tstride + (size_t)j * W + k * STEP_VL);
                    const FV p = v * v, pr = v * rj;
                    nv[g][k] = nv[g][k] + p;
                    acc1[g][k] = acc1[g][k] + pr;
                }
        }
    } else {
        for (int32_t j = 0; j < J; j++)
            STEP_UNROLL
            for (int g = 0; g < G; g++)
                STEP_UNROLL
                for (int k = 0; k < NV; k++) {
                    const FV v = LD(b + g * tstride + (size_t)j * W + k * STEP_VL);
                    const FV p = v * v;
                    nv[g][k] = nv[g][k] + p;
                }
    }
    STEP_UNROLL
    for (int g = 0; n2 && g < G; g++)
        STEP_UNROLL
        for (int k = 0; k < NV; k++) {
            float *nt = n2 + (size_t)(t0 + g) * W + k * STEP_VL;
            nv[g][k] = (first ? zero : LD(nt)) + nv[g][k];
            ST(nt, nv[g][k]);
            const IV y = lane + ((t0 + g) * W + k * STEP_VL);
            live[g][k] = (FV)((y < sizev) & (nv[g][k] > zero));
        }
    for (int32_t q = 0; q < n; q++) {
        const float *r = rows + (size_t)q * stride;
        FV acc[STEP_GROUP][NV];
        if (ONE && n2) {
            STEP_UNROLL
            for (int g = 0; g < G; g++)
                STEP_UNROLL
                for (int k = 0; k < NV; k++) acc[g][k] = acc1[g][k];
        } else {
            STEP_UNROLL
            for (int g = 0; g < G; g++)
                STEP_UNROLL
                for (int k = 0; k < NV; k++) acc[g][k] = zero;
            for (int32_t j = 0; j < J; j++) {
                const float rj = r[j];
                STEP_UNROLL
                for (int g = 0; g < G; g++)
                    STEP_UNROLL
                    for (int k = 0; k < NV; k++) {
                        const FV p = LD(b + g * tstride + (size_t)j * W + k * STEP_VL) * rj;
                        acc[g][k] = acc[g][k] + p;
                    }
            }
        }
        STEP_UNROLL
        for (int g = 0; g < G; g++)
            STEP_UNROLL
            for (int k = 0; k < NV; k++) {
                float *d = dots + (size_t)q * ldd + (size_t)(t0 + g) * W + k * STEP_VL;
                const FV dv = (first ? zero : LD(d)) + acc[g][k];
                ST(d, dv);
                if (!WANT) continue;
                /* key = n > 0 ? d·|d| / n : 0; lanes past the last entry never win */
                const FV tt = dv * (FV)((IV)dv & absmask);
                const FV key = (FV)((IV)(tt / nv[g][k]) & (IV)live[g][k]);
                const IV y = lane + ((t0 + g) * W + k * STEP_VL);
                if (ONE) {
                    const IV gt = (key > bk[g][k]) & (y < sizev);
                    bk[g][k] = (FV)(((IV)key & gt) | ((IV)bk[g][k] & ~gt));
                    ba[g][k] = (y & gt) | (ba[g][k] & ~gt);
                } else {
                    float *pk = lanes[q].key[g] + k * STEP_VL;
                    int32_t *pa = lanes[q].arg[g] + k * STEP_VL;
                    const FV old = LD(pk);
                    const IV gt = (key > old) & (y < sizev);
                    ST(pk, (FV)(((IV)key & gt) | ((IV)old & ~gt)));
                    STI(pa, (y & gt) | (LDI(pa) & ~gt));
                }
            }
    }
}

/* The winner of the lanes bk/ba: the largest key, then the lowest entry holding it; 0
 * when no key beat -inf and size > 0, -1 when size == 0 (matcher.c). */
STEP_ATTR __attribute__((always_inline))
static inline int32_t STEP_WIN(FV bk[STEP_GROUP][NV], IV ba[STEP_GROUP][NV], int32_t size) {
    FV m = bk[0][0];
    STEP_UNROLL
    for (int g = 0; g < STEP_GROUP; g++)
        STEP_UNROLL
        for (int k = 0; k < NV; k++) {
            const IV gt = bk[g][k] > m;
            m = (FV)(((IV)bk[g][k] & gt) | ((IV)m & ~gt));
        }
    float mm = -INFINITY;
    STEP_UNROLL
    for (int i = 0; i < STEP_VL; i++) mm = m[i] > mm ? m[i] : mm;
    if (!(mm > -INFINITY)) return size > 0 ? 0 : -1;
    const IV none = (IV){0} + INT32_MAX;
    IV bi = none;
    STEP_UNROLL
    for (int g = 0; g < STEP_GROUP; g++)
        STEP_UNROLL
        for (int k = 0; k < NV; k++) {
            const IV eq = bk[g][k] == ((FV){0} + mm);
            const IV cand = (ba[g][k] & eq) | (none & ~eq);
            const IV lt = cand < bi;
            bi = (cand & lt) | (bi & ~lt);
        }
    int32_t r = INT32_MAX;
    STEP_UNROLL
    for (int i = 0; i < STEP_VL; i++) r = bi[i] < r ? bi[i] : r;
    return r;
}

STEP_ATTR
static void STEP_NAME(const float *blk, int32_t tiles, int32_t J, int32_t size, int first,
                      int32_t n, const float *rows, int64_t stride, float *dots, int64_t ldd,
                      float *n2, lane_best *lanes, int32_t *best) {
    FV bk[STEP_GROUP][NV];
    IV ba[STEP_GROUP][NV];
    STEP_UNROLL
    for (int g = 0; g < STEP_GROUP; g++)
        STEP_UNROLL
        for (int k = 0; k < NV; k++) {
            bk[g][k] = (FV){0} - INFINITY;
            ba[g][k] = (IV){0} - 1;
        }
    if (lanes && n > 1)
        for (int32_t q = 0; q < n; q++)
            STEP_UNROLL
            for (int g = 0; g < STEP_GROUP; g++)
                STEP_UNROLL
                for (int k = 0; k < NV; k++) {
                    ST(lanes[q].key[g] + k * STEP_VL, bk[g][k]);
                    STI(lanes[q].arg[g] + k * STEP_VL, ba[g][k]);
                }
    /* three specialisations: decode (one query, argmax in registers), several queries,
     * catch-up (no argmax) */
#define STEP_LOOP(ONE, WANT)                                                                     \
    do {                                                                                         \
        int32_t t = 0;                                                                           \
        for (; t + STEP_GROUP <= tiles; t += STEP_GROUP)                                         \
            STEP_TILES(blk, t, STEP_GROUP, ONE, WANT, J, size, first, n, rows, stride, dots,     \
                       ldd, n2, lanes, bk, ba);                                                  \
        for (; t < tiles; t++)                                                                   \
            STEP_TILES(blk, t, 1, ONE, WANT, J, size, first, n, rows, stride, dots, ldd, n2,     \
                       lanes, bk, ba);                                                           \
    } while (0)
    if (lanes && n == 1)
        STEP_LOOP(1, 1);
    else if (lanes)
        STEP_LOOP(0, 1);
    else
        STEP_LOOP(0, 0);
#undef STEP_LOOP
    if (!lanes) return;
    if (n == 1) {
        best[0] = STEP_WIN(bk, ba, size);
        return;
    }
    for (int32_t q = 0; q < n; q++) {
        STEP_UNROLL
        for (int g = 0; g < STEP_GROUP; g++)
            STEP_UNROLL
            for (int k = 0; k < NV; k++) {
                bk[g][k] = LD(lanes[q].key[g] + k * STEP_VL);
                ba[g][k] = LDI(lanes[q].arg[g] + k * STEP_VL);
            }
        best[q] = STEP_WIN(bk, ba, size);
    }
}

#undef LD
#undef ST
#undef LDI
#undef STI
#undef FV
#undef IV
#undef FVU
#undef IVU
#undef NV
#undef STEP_TILES
#undef STEP_WIN
#undef STEP_GROUP
#undef STEP_CAT
#undef STEP_CAT2
#undef STEP_UNROLL
