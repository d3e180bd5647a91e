/*
 * matcher.c - semantic and trajectory search over an expert-map store (fmoe/expertmap.h;
 * "fMoE: Fine-Grained Expert Offloading for Large Mixture-of-Experts Serving" §4.2,
 * Eq. 4 and 5).
 *
 * Semantic search: the dot products of the queries with every stored embedding, scaled by
 * the query norms and the store's precomputed entry norms; argmax per query. The dot
 * products are a hand-written pass too (semantic_step.h), not BLAS, so that their bits
 * are the same on every CPU and for any number of queries at once (a BLAS's sgemv and
 * sgemm, and its kernels for different CPUs, sum in different orders):
 *     in float: s_i = 0 for i < 16; s_i = s_i + x_k·e_k for k = i, i + 16, i + 32, ...
 *     (k < h) in turn; then s_i = s_i + s_{i+w} for w = 8, 4, 2, 1 (i < w); dot = s_0.
 * One query reads the whole store (C·h floats) per search and is bound by that read;
 * several at once (the simulator's searches made ahead, a prefill's tokens) read each
 * embedding once for four of them.
 *
 * Trajectory search, incremental. The cosine of an observed prefix q (rows 0..l of this
 * iteration's map) with the same rows of stored map y is d_l[y] / sqrt(n_l[y] · |q|^2),
 * where d_l[y] is the dot product of the two prefixes and n_l[y] the squared norm of y's.
 * Both grow by one row per layer, and one pass over layer l's block of the store updates
 * both: d_l = d_{l-1} + q_l · map_y[l], n_l = n_{l-1} + |map_y[l]|^2. So each layer costs
 * O(C·J) (for n queries O(n·C·J) + O(C·J) for the norms, which they share), never
 * O(C·l·J), and the store keeps no per-layer norms (they would add 1/J to its size).
 *
 * The step is a hand-written loop, not sgemv: with the store's tiles (expertmap_impl.h:
 * 16 entries side by side per expert) every entry's sums are plain lane-wise
 * multiply-adds in GNU C vectors, where sgemv on [C][J] rows of J = 8 spends its time in
 * call overhead and horizontal sums (12 GFLOP/s against 41 for the same flops in long
 * rows, measured: docs/results.md, "Matcher and store benchmarks"). The step is built three times,
 * for AVX-512, AVX2 and the baseline (matcher_step.h, chosen once per matcher from the
 * CPU), never contracted to FMA, so every build on every CPU gives the same bits, and
 * those bits are the definition (fmoe_matcher_trajectory_reference):
 *     per layer, in float: s = 0; s = s + m_j·r_j for j = 0..J-1;  d = d + s
 *                          t = 0; t = t + m_j·m_j for j = 0..J-1;  n = n + t
 *     key[y] = n > 0 ? (d·|d|) / n : 0   (float: the square of the cosine, signed, times
 *                                         the query's squared norm, which all share)
 *     best   = the first y of the largest key; score = d / sqrt(n·|q|^2) in double.
 * The key is one division per entry, no square root, and a total order, so the argmax is
 * kept lane by lane (each lane sees its entries in increasing order, ties to the first)
 * and the lanes' winner, the largest key then the lowest entry, is the sequential
 * argmax. (Against the cosine in exact arithmetic, two entries can swap only when their
 * cosines agree to about 1e-7: the previous sgemv-based search had the same, BLAS-kernel
 * dependent, ambiguity.)
 *
 * A prefill's queries share the norms and each tile of the store is read once for all
 * of them (it stays in L1 while they pass over it).
 *
 * The observed rows are kept, so that a store modified between two layers of a
 * trajectory (by the same thread: the store is not locked) is caught up by replaying the
 * prefix through the same step (same bits as if the store had been so from the start).
 */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__STRICT_ANSI__)
/* GNU C mode contracts a*b + c to FMA where the target has it (-ffp-contract=fast):
 * that would make the AVX2 clone differ from the baseline in the last bit. */
#pragma GCC optimize("fp-contract=off")
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "expertmap_impl.h"
#include "fmoe/error.h"
#include "fmoe/expertmap.h"
#include "matcher_internal.h"

#define W FMOE__EXPERTMAP_TILE
#define SEM_LANES 16 /* the semantic dot product's running sums (see the top) */

typedef void (*sem_fn)(const float *E, int64_t lde, int32_t size, int32_t h, const float *X,
                       int64_t ldx, int32_t n, float *out, int64_t ldo, float *tails);

/* Per query, the argmax over the entries so far, lane by lane: lane (g, i) holds the best
 * key (and its entry) among the entries y = i (mod W) of the tiles the step gave to group
 * g, seen in increasing order, ties to the first; -1: none beat -inf yet. */
#define LANE_GROUPS 4
typedef struct lane_best {
    _Alignas(64) float key[LANE_GROUPS][W];
    _Alignas(64) int32_t arg[LANE_GROUPS][W];
} lane_best;

typedef void (*step_fn)(const float *blk, int32_t tiles, int32_t J, int32_t size, int first,
                        int32_t n, const float *rows, int64_t stride, float *dots,
                        int64_t ldd, float *n2, lane_best *lanes, int32_t *best);
static step_fn pick_step(void);
static sem_fn pick_sem(void);

enum { SCORES_NONE, SCORES_READY, SCORES_TRAJECTORY }; /* READY: scores[] hold them */

struct fmoe_matcher {
    const fmoe_expertmap *store;
    int32_t max_queries;
    int32_t nq;          /* trajectories started */
    int32_t layers;      /* rows observed per trajectory */
    int32_t cpad;        /* the store's tiles · W */
    uint64_t version;    /* store version the running sums belong to */
    int reference;       /* fmoe__matcher_set_reference: the scalar definition instead */
    int scores_kind;     /* what fmoe_matcher_scores returns */
    float *dots;         /* [max_queries][cpad] running dot products d[y] */
    float *n2;           /* [cpad] running squared norms n[y] of the entries' prefixes */
    lane_best *lanes;    /* [max_queries] argmax state of the current step */
    int32_t *win;        /* [max_queries] its result */
    step_fn step;        /* the step for this CPU */
    sem_fn sem;          /* the semantic dot products for this CPU */
    float *tails;        /* [max_queries + 8][SEM_LANES] their scratch */
    float *scores;       /* [max_queries][C] scores of the last call (made on demand) */
    double *qnorm2;      /* [max_queries] squared norm of each observed prefix */
    float *prefix;       /* [max_queries][L][J] observed rows */
};

int fmoe_matcher_init(fmoe_matcher **out, const fmoe_expertmap *store, int32_t max_queries) {
    FMOE_RETURN_ERROR_IF(!out || !store, FMOE_EINVAL, "fmoe_matcher_init: NULL argument");
    FMOE_RETURN_ERROR_IF(max_queries < 1, FMOE_EINVAL,
                         "matcher: max_queries %d, expected >= 1", max_queries);
    *out = NULL;
    const size_t C = (size_t)store->cfg.capacity, Q = (size_t)max_queries;
    const size_t P = (size_t)store->tiles * W;
    const size_t LJ = (size_t)store->cfg.num_layers * store->cfg.num_experts;
    fmoe_matcher *m = calloc(1, sizeof *m);
    if (!m) return fmoe_error_set(FMOE_ENOMEM, "matcher");
    m->store = store;
    m->max_queries = max_queries;
    m->cpad = (int32_t)P;
    m->step = pick_step();
    m->sem = pick_sem();
    m->tails = calloc((Q + 8) * SEM_LANES, sizeof *m->tails);
    m->dots = calloc(Q * P, sizeof *m->dots);
    m->n2 = calloc(P, sizeof *m->n2);
    m->lanes = aligned_alloc(64, Q * sizeof *m->lanes); /* 64-byte aligned members */
    m->win = calloc(Q, sizeof *m->win);
    m->scores = calloc(Q * C, sizeof *m->scores);
    m->qnorm2 = calloc(Q, sizeof *m->qnorm2);
    m->prefix = calloc(Q * LJ, sizeof *m->prefix);
    if (!m->dots || !m->n2 || !m->lanes || !m->win || !m->scores || !m->qnorm2 || !m->prefix ||
        !m->tails) {
        fmoe_matcher_free(m);
        return fmoe_error_set(FMOE_ENOMEM, "matcher for %d queries over %zu entries",
                              max_queries, C);
    }
    *out = m;
    return 0;
}

void fmoe_matcher_free(fmoe_matcher *m) {
    if (!m) return;
    free(m->dots);
    free(m->n2);
    free(m->lanes);
    free(m->win);
    free(m->scores);
    free(m->qnorm2);
    free(m->prefix);
    free(m->tails);
    free(m);
}

void fmoe__matcher_set_reference(fmoe_matcher *m, int on) { m->reference = on != 0; }

/* argmax of v[0..n), ties to the lowest index; -1 when n == 0. */
static int32_t argmax(const float *v, int32_t n) {
    int32_t b = n > 0 ? 0 : -1;
    for (int32_t y = 1; y < n; y++)
        if (v[y] > v[b]) b = y;
    return b;
}

int fmoe_matcher_semantic(fmoe_matcher *m, int32_t n, const float *sem, int64_t stride,
                          int32_t *best, float *score) {
    const fmoe_expertmap *s = m->store;
    const int32_t h = s->cfg.semantic_dim, C = s->cfg.capacity, size = s->size;
    FMOE_RETURN_ERROR_IF(n < 0 || n > m->max_queries, FMOE_EINVAL,
                         "matcher: %d semantic queries, expected 0..%d", n, m->max_queries);
    m->scores_kind = SCORES_READY;
    if (h == 0 || size == 0 || !sem) {
        for (int32_t q = 0; q < n; q++) {
            if (best) best[q] = -1;
            if (score) score[q] = 0;
            memset(m->scores + (size_t)q * C, 0, (size_t)size * sizeof *m->scores);
        }
        return 0;
    }
    FMOE_RETURN_ERROR_IF(stride < h, FMOE_EINVAL, "matcher: semantic stride %lld < h = %d",
                         (long long)stride, h);
    m->sem(s->sem, h, size, h, sem, stride, n, m->scores, C, m->tails);
    for (int32_t q = 0; q < n; q++) {
        const float *x = sem + (size_t)q * stride;
        double n2 = 0;
        for (int32_t i = 0; i < h; i++) n2 += (double)x[i] * x[i];
        const float rq = n2 > 0 ? (float)(1.0 / sqrt(n2)) : 0.0f;
        float *row = m->scores + (size_t)q * C;
        for (int32_t y = 0; y < size; y++) {
            const float ny = s->sem_norm[y];
            row[y] = ny > 0 ? row[y] * rq / ny : 0.0f;
        }
        const int32_t b = argmax(row, size);
        if (best) best[q] = b;
        if (score) score[q] = row[b];
    }
    return 0;
}

int fmoe_matcher_trajectory_begin(fmoe_matcher *m, int32_t n) {
    FMOE_RETURN_ERROR_IF(n < 0 || n > m->max_queries, FMOE_EINVAL,
                         "matcher: %d trajectories, expected 0..%d", n, m->max_queries);
    m->nq = n;
    m->layers = 0;
    m->version = m->store->version;
    m->scores_kind = SCORES_NONE;
    memset(m->qnorm2, 0, (size_t)n * sizeof *m->qnorm2);
    return 0;
}

int32_t fmoe_matcher_trajectory_layers(const fmoe_matcher *m) { return m->layers; }

/* ------------------------------------------------------------------ the step */

/* The cosine of a prefix pair from its running sums (0 for a zero vector). */
static float score_of(float d, float n, double qn2) {
    return n > 0 && qn2 > 0 ? (float)((double)d / sqrt((double)n * qn2)) : 0.0f;
}

/* The key the argmax ranks entries by (see the top of the file). */
static inline float key_of(float d, float n) {
    const float t = d * fabsf(d);
    return n > 0 ? t / n : 0.0f;
}

/* The last stage of a semantic dot product: the 16 sums folded 8, 4, 2, 1 apart. */
static inline float sem_fold(const float *t) {
    float a[SEM_LANES];
    memcpy(a, t, sizeof a);
    for (int w = SEM_LANES / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) a[i] = a[i] + a[i + w];
    return a[0];
}

float fmoe__matcher_semantic_dot(const float *x, const float *e, int32_t h) {
    float t[SEM_LANES] = {0};
    for (int32_t k = 0; k < h; k++) {
        const float p = x[k] * e[k];
        t[k % SEM_LANES] = t[k % SEM_LANES] + p;
    }
    return sem_fold(t);
}

/* The semantic dot products, instantiated per vector width (semantic_step.h). */
#if defined(__GNUC__)
#if defined(__clang__)
#define SEM_UNROLL _Pragma("unroll")
#else
#define SEM_UNROLL _Pragma("GCC unroll 16")
#endif
#define SEM_NAME sem_v1
#define SEM_ATTR
#define SEM_VL 4
#define SEM_QB 1
#define SEM_EB 4
#include "semantic_step.h"
#if defined(__x86_64__)
#define SEM_NAME sem_avx2
#define SEM_ATTR __attribute__((target("avx2")))
#define SEM_VL 8
#define SEM_QB 2
#define SEM_EB 2
#include "semantic_step.h"
#define SEM_NAME sem_avx512
#define SEM_ATTR __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq")))
#define SEM_VL 16
#define SEM_QB 4
#define SEM_EB 4
#include "semantic_step.h"
#endif
#else
/* The same, one product at a time (compilers without GNU C vectors). */
static void sem_v1(const float *E, int64_t lde, int32_t size, int32_t h, const float *X,
                   int64_t ldx, int32_t n, float *out, int64_t ldo, float *tails) {
    (void)tails;
    for (int32_t q = 0; q < n; q++)
        for (int32_t y = 0; y < size; y++)
            out[(size_t)q * ldo + y] =
                fmoe__matcher_semantic_dot(X + (size_t)q * ldx, E + (size_t)y * lde, h);
}
#endif

/* The step, instantiated per vector width (matcher_step.h). */
#if defined(__GNUC__)
#define STEP_NAME step_v1
#define STEP_ATTR
#define STEP_VL 4
#include "matcher_step.h"
#undef STEP_NAME
#undef STEP_ATTR
#undef STEP_VL
#if defined(__x86_64__)
#define FMOE_STEP_X86 1
/* AVX2 without FMA, and AVX-512 (F, VL, BW, DQ) without FMA: nothing to contract into. */
#define STEP_NAME step_avx2
#define STEP_ATTR __attribute__((target("avx2")))
#define STEP_VL 8
#include "matcher_step.h"
#undef STEP_NAME
#undef STEP_ATTR
#undef STEP_VL
#define STEP_NAME step_avx512
#define STEP_ATTR __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq")))
#define STEP_VL 16
#include "matcher_step.h"
#undef STEP_NAME
#undef STEP_ATTR
#undef STEP_VL
#endif
#else
/* The same, one entry at a time (compilers without GNU C vectors): a sequential argmax. */
static void step_v1(const float *blk, int32_t tiles, int32_t J, int32_t size, int first,
                    int32_t n, const float *rows, int64_t stride, float *dots, int64_t ldd,
                    float *n2, lane_best *lanes, int32_t *best) {
    for (int32_t q = 0; lanes && q < n; q++) {
        lanes[q].key[0][0] = -INFINITY;
        lanes[q].arg[0][0] = -1;
    }
    for (int32_t t = 0; t < tiles; t++) {
        const float *b = blk + (size_t)t * J * W;
        float *nt = n2 + (size_t)t * W;
        for (int i = 0; i < W; i++) {
            float sq = 0.0f;
            for (int32_t j = 0; j < J; j++) {
                const float v = b[(size_t)j * W + i], p = v * v;
                sq = sq + p;
            }
            nt[i] = (first ? 0.0f : nt[i]) + sq;
        }
        for (int32_t q = 0; q < n; q++) {
            const float *r = rows + (size_t)q * stride;
            float *d = dots + (size_t)q * ldd + (size_t)t * W;
            for (int i = 0; i < W; i++) {
                float acc = 0.0f;
                for (int32_t j = 0; j < J; j++) {
                    const float p = b[(size_t)j * W + i] * r[j];
                    acc = acc + p;
                }
                d[i] = (first ? 0.0f : d[i]) + acc;
                const int32_t y = t * W + i;
                if (!lanes || y >= size) continue;
                const float k = key_of(d[i], nt[i]);
                if (k > lanes[q].key[0][0]) {
                    lanes[q].key[0][0] = k;
                    lanes[q].arg[0][0] = y;
                }
            }
        }
    }
    for (int32_t q = 0; lanes && q < n; q++)
        best[q] = lanes[q].arg[0][0] >= 0 ? lanes[q].arg[0][0] : size > 0 ? 0 : -1;
}
#endif

/* The step of a level (0 baseline, 1 AVX2, 2 AVX-512), NULL when this CPU or build has
 * none; the widest one when level < 0. */
static step_fn step_of_level(int level) {
#if defined(FMOE_STEP_X86)
    __builtin_cpu_init();
    const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
    const int avx2 = __builtin_cpu_supports("avx2");
    if (level < 0) level = avx512 ? 2 : avx2 ? 1 : 0;
    if (level == 2) return avx512 ? step_avx512 : NULL;
    if (level == 1) return avx2 ? step_avx2 : NULL;
#else
    if (level < 0) level = 0;
#endif
    return level == 0 ? step_v1 : NULL;
}

static step_fn pick_step(void) { return step_of_level(-1); }

/* The semantic pass of the same level. */
static sem_fn sem_of_level(int level) {
    const step_fn f = step_of_level(level);
    if (!f) return NULL;
#if defined(FMOE_STEP_X86)
    if (f == step_avx512) return sem_avx512;
    if (f == step_avx2) return sem_avx2;
#endif
    return sem_v1;
}

static sem_fn pick_sem(void) { return sem_of_level(-1); }

int fmoe__matcher_force_level(fmoe_matcher *m, int level) {
    const step_fn f = step_of_level(level);
    if (!f) return -1;
    m->step = f;
    m->sem = sem_of_level(level);
    return 0;
}

void fmoe__expertmap_map_dots(const fmoe_expertmap *s, const float *X, int32_t n, int64_t ldx,
                              float *out, int64_t ldo) {
    const int32_t J = s->cfg.num_experts, L = s->cfg.num_layers;
    if (n <= 0 || s->size <= 0) return;
    const step_fn step = pick_step();
    const int32_t tiles = (s->size + W - 1) / W;
    for (int32_t l = 0; l < L; l++)
        step(s->maps + (size_t)l * s->tiles * J * W, tiles, J, s->size, l == 0, n,
             X + (size_t)l * J, ldx, out, ldo, NULL, NULL, NULL);
}

/* Recomputes the running sums from the kept prefixes (the store changed). */
static void rebuild(fmoe_matcher *m) {
    const fmoe_expertmap *s = m->store;
    const int32_t J = s->cfg.num_experts, LJ = s->cfg.num_layers * J;
    const int32_t tiles = (s->size + W - 1) / W;
    for (int32_t l = 0; l < m->layers; l++)
        m->step(s->maps + (size_t)l * s->tiles * J * W, tiles, J, s->size, l == 0, m->nq,
                m->prefix + (size_t)l * J, LJ, m->dots, m->cpad, m->n2, NULL, NULL);
    m->version = s->version;
}

int fmoe_matcher_trajectory_add(fmoe_matcher *m, int32_t layer, const float *rows,
                                int64_t stride, int32_t *best, float *score) {
    const fmoe_expertmap *s = m->store;
    const int32_t L = s->cfg.num_layers, J = s->cfg.num_experts;
    const int32_t size = s->size, n = m->nq;
    FMOE_RETURN_ERROR_IF(layer != m->layers || layer >= L, FMOE_EINVAL,
                         "matcher: layer %d added, expected layer %d", layer, m->layers);
    FMOE_RETURN_ERROR_IF(n > 0 && (!rows || stride < J), FMOE_EINVAL,
                         "matcher: rows %p, stride %lld (J = %d)", (const void *)rows,
                         (long long)stride, J);
    if (!m->reference && m->version != s->version) rebuild(m);
    for (int32_t q = 0; q < n; q++) {
        const float *r = rows + (size_t)q * stride;
        memcpy(m->prefix + ((size_t)q * L + layer) * J, r, (size_t)J * sizeof *r);
        double n2 = 0;
        for (int32_t j = 0; j < J; j++) n2 += (double)r[j] * r[j];
        m->qnorm2[q] += n2;
    }
    m->layers++;
    m->scores_kind = SCORES_TRAJECTORY;
    if (m->reference) {
        for (int32_t q = 0; q < n; q++) {
            float sc = 0;
            const int32_t b = fmoe_matcher_trajectory_reference(
                s, m->prefix + (size_t)q * L * J, m->layers, &sc,
                m->scores + (size_t)q * s->cfg.capacity);
            if (best) best[q] = b;
            if (score) score[q] = sc;
        }
        m->scores_kind = SCORES_READY;
        m->version = s->version;
        return 0;
    }
    if (size > 0 && n > 0)
        m->step(s->maps + (size_t)layer * s->tiles * J * W, (size + W - 1) / W, J, size,
                layer == 0, n, rows, stride, m->dots, m->cpad, m->n2, m->lanes, m->win);
    for (int32_t q = 0; q < n; q++) {
        const int32_t b = size > 0 ? m->win[q] : -1;
        if (best) best[q] = b;
        if (score)
            score[q] = b >= 0 ? score_of(m->dots[(size_t)q * m->cpad + b], m->n2[b], m->qnorm2[q])
                              : 0.0f;
    }
    return 0;
}

const float *fmoe_matcher_scores(fmoe_matcher *m, int32_t q) {
    if (q < 0 || q >= m->max_queries) return NULL;
    float *sc = m->scores + (size_t)q * m->store->cfg.capacity;
    if (m->scores_kind == SCORES_TRAJECTORY) {
        const float *d = m->dots + (size_t)q * m->cpad;
        for (int32_t y = 0; y < m->store->size; y++) sc[y] = score_of(d[y], m->n2[y], m->qnorm2[q]);
    }
    return sc;
}

/* ------------------------------------------------------------------ references */

/* The running sums of entry y over the first `layers` rows, the scalar way. */
static void reference_sums(const fmoe_expertmap *s, int32_t y, const float *prefix,
                           int32_t layers, float *d_out, float *n_out) {
    const int32_t J = s->cfg.num_experts;
    float d = 0.0f, n = 0.0f;
    for (int32_t l = 0; l < layers; l++) {
        const float *row = s->maps + fmoe__expertmap_at(s, y, l, 0);
        const float *r = prefix + (size_t)l * J;
        float acc = 0.0f, sq = 0.0f;
        for (int32_t j = 0; j < J; j++) {
            const float v = row[(size_t)j * W];
            const float p = v * r[j], p2 = v * v;
            acc = acc + p;
            sq = sq + p2;
        }
        d = d + acc;
        n = n + sq;
    }
    *d_out = d;
    *n_out = n;
}

int32_t fmoe_matcher_trajectory_reference(const fmoe_expertmap *s, const float *prefix,
                                          int32_t layers, float *best_score, float *scores) {
    const int32_t J = s->cfg.num_experts;
    double qn2 = 0;
    for (int32_t l = 0; l < layers; l++) {
        double n2 = 0;
        for (int32_t j = 0; j < J; j++) n2 += (double)prefix[l * J + j] * prefix[l * J + j];
        qn2 += n2;
    }
    int32_t best = -1;
    float bkey = -INFINITY;
    for (int32_t y = 0; y < s->size; y++) {
        float d, n;
        reference_sums(s, y, prefix, layers, &d, &n);
        const float k = key_of(d, n);
        if (scores) scores[y] = score_of(d, n, qn2);
        if (k > bkey) {
            best = y;
            bkey = k;
        }
    }
    if (best < 0 && s->size > 0) best = 0; /* no key beat -inf */
    if (best_score) {
        float d = 0, n = 0;
        if (best >= 0) reference_sums(s, best, prefix, layers, &d, &n);
        *best_score = best >= 0 ? score_of(d, n, qn2) : 0.0f;
    }
    return best;
}

int32_t fmoe_matcher_trajectory_naive(const fmoe_expertmap *s, const float *prefix,
                                      int32_t layers, float *scores) {
    const size_t J = (size_t)s->cfg.num_experts;
    const size_t k = (size_t)layers * J;
    double qq = 0;
    for (size_t i = 0; i < k; i++) qq += (double)prefix[i] * prefix[i];
    int32_t best = -1;
    for (int32_t y = 0; y < s->size; y++) {
        double ab = 0, bb = 0;
        for (int32_t l = 0; l < layers; l++) {
            const float *row = s->maps + fmoe__expertmap_at(s, y, l, 0);
            const float *q = prefix + (size_t)l * J;
            for (size_t j = 0; j < J; j++) {
                ab += (double)q[j] * row[j * W];
                bb += (double)row[j * W] * row[j * W];
            }
        }
        scores[y] = qq > 0 && bb > 0 ? (float)(ab / sqrt(qq * bb)) : 0.0f;
        if (best < 0 || scores[y] > scores[best]) best = y;
    }
    return best;
}
