/*
 * fmoe/expertmap.h - the expert-map store and the matcher of fMoE (POLICIES.md A.1-A.5,
 * papers/fmoe.txt §4.1-§4.5). Implemented in lib/expertmap/ with OpenBLAS; no HDF5 (the
 * file format is fmoe/store.h).
 *
 * An expert map is one token's gate probabilities at every MoE layer, P[0..L-1][0..J-1];
 * the store keeps up to C of them with the token's semantic embedding (length h, the
 * output of the model's embedding layer) and a hit counter.
 *
 *   store    fmoe_expertmap: maps [C][L][J], sem [C][h], hits [C]. While it holds fewer
 *            than C entries, new ones are appended; once full, a new entry x replaces the
 *            stored entry y with the highest redundancy
 *                RDY(x, y) = (d/L)·cos(sem_x, sem_y) + ((L-d)/L)·cos(map_x, map_y)
 *            (fMoE §4.4; cos over the whole flattened L·J map). A batch of new entries is
 *            scored with two sgemm calls; within a batch the result equals adding the
 *            entries one by one (columns replaced earlier in the batch are rescored).
 *   matcher  fmoe_matcher: semantic search (argmax cos(sem_new, sem_y), for the first d
 *            layers) and trajectory search (argmax cos of the observed prefix of this
 *            iteration's map against the same rows of every stored map, for the later
 *            layers). The trajectory search is incremental: per query it keeps one running
 *            dot product per stored map and the running norm of the query, and each layer
 *            adds one row: O(C·J) per layer (one sgemv, or one sgemm for a batch of queries
 *            at the same layer), not O(C·l·J).
 *   selection  fmoe_expertmap_select: delta = clip(1 - score, 0, 1); the smallest set of
 *            experts, by decreasing probability, whose summed probability reaches delta
 *            (as a share of the row's total), never fewer than K (fMoE Eq. 6-8).
 *
 * Cosine similarity of a zero vector with anything is 0. Ties in an argmax go to the
 * lowest entry index.
 *
 * Thread safety: a store may be read by any number of matchers and threads at once while
 * nobody modifies it; fmoe_expertmap_add / _set / _clear need exclusive access. A matcher
 * belongs to one thread. No call allocates after init (STYLE.md rule 8), so a policy may
 * add to a store while it runs.
 */
#ifndef FMOE_EXPERTMAP_H
#define FMOE_EXPERTMAP_H

#include <stddef.h>
#include <stdint.h>

/* Geometry and limits of a store. */
typedef struct fmoe_expertmap_config {
    int32_t capacity;          /* C >= 1 entries */
    int32_t num_layers;        /* L >= 1 */
    int32_t num_experts;       /* J >= 1 */
    int32_t top_k;             /* K in [1, J] */
    int32_t semantic_dim;      /* h >= 0; 0: no semantic embeddings (semantic search off) */
    int32_t prefetch_distance; /* d in [0, L): weights the two halves of RDY */
    int32_t max_batch;         /* largest batch one add call scores at once; 0: sized so
                                  that its scratch is about 2% of the data (1..256) */
} fmoe_expertmap_config;

typedef struct fmoe_expertmap fmoe_expertmap;

/* Creates an empty store; allocates everything it will ever need: C·(h + L·J) floats of
 * data, C·(L + 3) of norms and counters, L·J popularity counts, and max_batch·C floats of
 * scratch (twice when h > 0).
 * @return 0, FMOE_EINVAL (detail names the bad field: capacity 0, d >= L, ...), FMOE_ENOMEM. */
int fmoe_expertmap_init(fmoe_expertmap **out, const fmoe_expertmap_config *cfg);

/* A new store with the same configuration and contents. @return 0 or FMOE_ENOMEM. */
int fmoe_expertmap_clone(fmoe_expertmap **out, const fmoe_expertmap *src);

/* Frees the store. NULL is a no-op. */
void fmoe_expertmap_free(fmoe_expertmap *s);

/* The configuration (max_batch resolved). */
const fmoe_expertmap_config *fmoe_expertmap_config_of(const fmoe_expertmap *s);

/* Entries held now (<= capacity). */
int32_t fmoe_expertmap_size(const fmoe_expertmap *s);

/* Borrowed views of the data, valid until the store is freed; entries [0, size) are live.
 *   maps      [L][C][J] float32 gate probabilities, layer-major: row l of entry y is the J
 *             floats at maps[(l * C + y) * J] (fmoe_expertmap_row)
 *   semantic  [C][h] float32 embeddings; NULL when h == 0
 *   hits      [C] how often each entry was the best match (fmoe_expertmap_hit) */
const float *fmoe_expertmap_maps(const fmoe_expertmap *s);
/* Row l of entry y (J floats), and entry y's whole map copied to out[L][J]. */
const float *fmoe_expertmap_row(const fmoe_expertmap *s, int32_t y, int32_t l);
void fmoe_expertmap_copy_map(const fmoe_expertmap *s, int32_t y, float *out);
const float *fmoe_expertmap_semantic(const fmoe_expertmap *s);
const uint32_t *fmoe_expertmap_hits(const fmoe_expertmap *s);

/* Bumps entry y's hit counter (saturating). Counts as a modification only for hits. */
void fmoe_expertmap_hit(fmoe_expertmap *s, int32_t y);

/* Popularity of each expert over the live entries: [L][J] counts of how many entries have
 * (l, j) among the K most probable experts of row l (ties to the lower index). This is the
 * fallback plan for the first d layers when no semantic embedding is available. */
const uint32_t *fmoe_expertmap_popularity(const fmoe_expertmap *s);

/* Incremented by every modification (add, set, clear; not by hits). Matchers compare it to
 * notice a store that changed under a running trajectory. */
uint64_t fmoe_expertmap_version(const fmoe_expertmap *s);

/*
 * Adds n entries (deduplication rule of fMoE §4.4, above): sem[i * sem_stride + 0..h)
 * (NULL when h == 0, or to add entries without an embedding: they count as zero vectors)
 * and maps[i * map_stride + 0..L·J). Larger n is processed max_batch at a time.
 * slots (optional, [n]) receives where each entry went; replaced (optional, [n]) receives
 * the entry it replaced (-1 when appended). Maps are stored as given (no normalisation).
 * @return 0, FMOE_EINVAL (NULL maps, a non-finite value: the detail names entry and index).
 */
int fmoe_expertmap_add(fmoe_expertmap *s, int32_t n, const float *sem, int64_t sem_stride,
                       const float *maps, int64_t map_stride, int32_t *slots, int32_t *replaced);

/* Overwrites entry y (y <= size; y == size appends) without deduplication: for readers
 * that restore a saved store, and for tests. sem may be NULL (zeros).
 * @return 0 or FMOE_EINVAL. */
int fmoe_expertmap_set(fmoe_expertmap *s, int32_t y, const float *sem, const float *map,
                       uint32_t hits);

/* Removes every entry. */
void fmoe_expertmap_clear(fmoe_expertmap *s);

/* RDY(x, y) of one new entry against stored entry y, computed directly (double
 * accumulation): the reference the batched path must match. */
double fmoe_expertmap_redundancy(const fmoe_expertmap *s, const float *sem, const float *map,
                                 int32_t y);

/*
 * Coverage statistics (fmoe inspect): for each of n entries ids[i], the highest similarity
 * to any other live entry: of whole maps (map_nn[i]), of embeddings (sem_nn[i], 0 when
 * h == 0) and of RDY (rdy_nn[i]). Any output may be NULL. Blocked sgemm over the store;
 * allocates its own scratch (not for hot paths). A store of one entry gives 0.
 * @return 0, FMOE_EINVAL (an id out of range), FMOE_ENOMEM.
 */
int fmoe_expertmap_nearest(const fmoe_expertmap *s, const int32_t *ids, int32_t n,
                           float *map_nn, float *sem_nn, float *rdy_nn);

/* ------------------------------------------------------------------ selection */

/* Chooses the experts to prefetch from one row p[0..J) with similarity `score`:
 * delta = clip(1 - score, 0, 1); experts are taken by decreasing p (ties: lower index)
 * until their sum reaches delta · sum(p), and never fewer than min(k_min, J). Experts of
 * probability 0 are taken only to reach k_min. Writes the chosen indexes, most probable
 * first, to out[J] and @return their count. Allocation-free; O(J log J). */
int32_t fmoe_expertmap_select(const float *p, int32_t J, double score, int32_t k_min,
                              int32_t *out);

/* delta of a score: clip(1 - score, 0, 1). */
static inline double fmoe_expertmap_delta(double score) {
    double d = 1.0 - score;
    return d < 0 ? 0 : d > 1 ? 1 : d;
}

/* fMoE §4.5 prefetch priority p / (l - l_now), for a target layer l > l_now (layers
 * counted in the same base; l_now = -1 before layer 0 of an iteration). */
static inline double fmoe_expertmap_prefetch_priority(double p, int32_t l, int32_t l_now) {
    return l > l_now ? p / (double)(l - l_now) : p;
}

/* The quantity fMoE §4.5 evicts the lowest of: p · freq (its eviction priority is the
 * reciprocal). p is floored at 1e-6 so that p = 0 still ranks by frequency. */
static inline double fmoe_expertmap_keep_value(double p, double freq) {
    return (p > 1e-6 ? p : 1e-6) * freq;
}

/* ------------------------------------------------------------------ matcher */

typedef struct fmoe_matcher fmoe_matcher;

/* A matcher over `store` for up to max_queries queries at once (the tokens of one
 * iteration, or of a batch of requests stepping through layers together). Allocates
 * max_queries · C floats of running dot products plus per-query state.
 * @return 0, FMOE_EINVAL, FMOE_ENOMEM. */
int fmoe_matcher_init(fmoe_matcher **out, const fmoe_expertmap *store, int32_t max_queries);
void fmoe_matcher_free(fmoe_matcher *m); /* NULL: no-op */

/*
 * Semantic search for n <= max_queries queries sem[q * stride + 0..h): best[q] = argmax
 * over stored entries of cos(sem_q, sem_y), score[q] its value. best = -1, score = 0 when
 * the store is empty or has no embeddings (h == 0). One sgemm (sgemv for n == 1).
 * @return 0 or FMOE_EINVAL (n out of range).
 */
int fmoe_matcher_semantic(fmoe_matcher *m, int32_t n, const float *sem, int64_t stride,
                          int32_t *best, float *score);

/* Starts n <= max_queries new trajectories (queries 0..n-1), empty prefixes. */
int fmoe_matcher_trajectory_begin(fmoe_matcher *m, int32_t n);

/*
 * Adds the observed row of layer `layer` for every started query: rows[q * stride + 0..J).
 * Layers must come in order 0, 1, 2, ... (the next after the last added). Then
 * best[q] = argmax_y cos(prefix_q, prefix of map y), score[q] its value (best = -1 when
 * the store is empty). If the store changed since begin (fmoe_expertmap_version), the
 * running sums are rebuilt from the kept prefixes first (O(C·l·J), once).
 * best and score may be NULL (update only). @return 0 or FMOE_EINVAL (layer out of order).
 */
int fmoe_matcher_trajectory_add(fmoe_matcher *m, int32_t layer, const float *rows,
                                int64_t stride, int32_t *best, float *score);

/* Layers observed so far by the current trajectories. */
int32_t fmoe_matcher_trajectory_layers(const fmoe_matcher *m);

/* The scores of query q against every stored entry after the last semantic or trajectory
 * call ([size] floats, borrowed until the next call); NULL when q is out of range. */
const float *fmoe_matcher_scores(const fmoe_matcher *m, int32_t q);

/* Reference implementation (tests, benchmarks): the trajectory scores of one prefix
 * prefix[0..(layers)·J) against every entry, recomputed from scratch with double
 * accumulation into scores[size]. @return the best entry, or -1. */
int32_t fmoe_matcher_trajectory_naive(const fmoe_expertmap *store, const float *prefix,
                                      int32_t layers, float *scores);

#endif
