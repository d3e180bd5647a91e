/*
 * fmoe/expertmap.h - the expert-map store and the matcher of fMoE ("fMoE: Fine-Grained Expert
 * Offloading for Large Mixture-of-Experts Serving" §4.1-§4.5). Implemented in lib/expertmap/
 * with OpenBLAS and hand-vectorised kernels; no HDF5 (the file format is fmoe/store.h).
 *
 * An expert map is one token's gate probabilities at every MoE layer, P[0..L-1][0..J-1];
 * the store keeps up to C of them with the token's semantic embedding (length h, the
 * output of the model's embedding layer) and a hit counter.
 *
 *   store    fmoe_expertmap: maps [C][L][J] (held in an internal tiled layout: read them
 *            with fmoe_expertmap_get_row / _get_rows / _copy_map), sem [C][h], hits [C].
 *            While it holds fewer than C entries, new ones are appended; once full, a new
 *            entry x replaces the stored entry y with the highest redundancy
 *                RDY(x, y) = (d/L)·cos(sem_x, sem_y) + ((L-d)/L)·cos(map_x, map_y)
 *            (fMoE §4.4; cos over the whole flattened L·J map). A batch of new entries is
 *            scored at once (the matcher's kernel for the maps, sgemm for embeddings);
 *            within a batch the result equals adding the entries one by one (columns
 *            replaced earlier in the batch are rescored), to float rounding.
 *   matcher  fmoe_matcher: semantic search (argmax cos(sem_new, sem_y), for the first d
 *            layers) and trajectory search (argmax cos of the observed prefix of this
 *            iteration's map against the same rows of every stored map, for the later
 *            layers). The trajectory search is incremental: per query it keeps one running
 *            dot product per stored map (and, shared by the queries, the running norm of
 *            each stored prefix), and each layer adds one row: O(C·J) per layer and query
 *            in one vectorised pass over the layer's block of the store, not O(C·l·J).
 *            Its arithmetic is pinned down bit for bit (fmoe_matcher_trajectory_reference),
 *            so that results do not depend on the CPU or the BLAS.
 *   selection  fmoe_expertmap_select: delta = clip(1 - score, 0, 1); the smallest set of
 *            experts, by decreasing probability, whose summed probability reaches delta
 *            (as a share of the row's total), never fewer than K (fMoE Eq. 6-8).
 *
 * Cosine similarity of a zero vector with anything is 0. Ties in an argmax go to the
 * lowest entry index (for the trajectory search: of the key it ranks by, see
 * fmoe_matcher_trajectory_add).
 *
 * Thread safety: a store may be read by any number of matchers and threads at once while
 * nobody modifies it; fmoe_expertmap_add / _set / _clear need exclusive access. A matcher
 * belongs to one thread. No call allocates after init, so a policy may
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
 * data (C rounded up to a multiple of 16 for the maps), 3·C of norms and counters, L·J
 * popularity counts, and max_batch·(C + max_batch) floats of scratch (C twice when
 * h > 0).
 * @return 0, FMOE_EINVAL (detail names the bad field: capacity 0, d >= L, ...), FMOE_ENOMEM. */
int fmoe_expertmap_init(fmoe_expertmap **out, const fmoe_expertmap_config *cfg);

/* A new store with the same configuration and contents; with capacity above src's, room
 * for that many entries (offline updates growing a store built to its tokens).
 * @return 0, FMOE_EINVAL (too large) or FMOE_ENOMEM. */
int fmoe_expertmap_clone(fmoe_expertmap **out, const fmoe_expertmap *src, int32_t capacity);

/* Frees the store. NULL is a no-op. */
void fmoe_expertmap_free(fmoe_expertmap *s);

/* The configuration (max_batch resolved). */
const fmoe_expertmap_config *fmoe_expertmap_config_of(const fmoe_expertmap *s);

/* Entries held now (<= capacity). */
int32_t fmoe_expertmap_size(const fmoe_expertmap *s);

/* Entry y's row l copied to out[J], its rows [l0, l1) to out[l1 - l0][J], and its whole
 * map to out[L][J]. (The maps are stored in an internal tiled layout, so there is no
 * borrowed view of them.) */
void fmoe_expertmap_get_row(const fmoe_expertmap *s, int32_t y, int32_t l, float *out);
void fmoe_expertmap_get_rows(const fmoe_expertmap *s, int32_t y, int32_t l0, int32_t l1,
                             float *out);
void fmoe_expertmap_copy_map(const fmoe_expertmap *s, int32_t y, float *out);
/* Borrowed views of the data, valid until the store is freed; entries [0, size) are live.
 *   semantic  [C][h] float32 embeddings; NULL when h == 0
 *   hits      [C] how often each entry was the best match (fmoe_expertmap_hit) */
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
 * 2 · max_queries · C floats (running dot products, scores), C of running norms, and
 * max_queries · L · J of observed rows.
 * @return 0, FMOE_EINVAL, FMOE_ENOMEM. */
int fmoe_matcher_init(fmoe_matcher **out, const fmoe_expertmap *store, int32_t max_queries);
void fmoe_matcher_free(fmoe_matcher *m); /* NULL: no-op */

/*
 * Semantic search for n <= max_queries queries sem[q * stride + 0..h): best[q] = argmax
 * over stored entries of cos(sem_q, sem_y), score[q] its value. best = -1, score = 0 when
 * the store is empty or has no embeddings (h == 0). The dot products are computed in one
 * fixed order (fmoe__matcher_semantic_dot, expertmap/matcher_internal.h), the same bits for any n and on every CPU.
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
 * the store is empty), exactly as fmoe_matcher_trajectory_reference computes them: the
 * argmax ranks entries by a float key monotone in the cosine, ties to the lower index.
 * If the store changed since begin (fmoe_expertmap_version), the running sums are
 * rebuilt from the kept prefixes first (O(C·l·J), once).
 * best and score may be NULL (update only). @return 0 or FMOE_EINVAL (layer out of order).
 */
int fmoe_matcher_trajectory_add(fmoe_matcher *m, int32_t layer, const float *rows,
                                int64_t stride, int32_t *best, float *score);

/* Layers observed so far by the current trajectories. */
int32_t fmoe_matcher_trajectory_layers(const fmoe_matcher *m);

/* The scores of query q against every stored entry after the last semantic or trajectory
 * call ([size] floats, borrowed until the next call; trajectory scores are made by this
 * call, O(C)); NULL when q is out of range. */
const float *fmoe_matcher_scores(fmoe_matcher *m, int32_t q);

/* The definition the incremental trajectory search must equal bit for bit (tests): one
 * prefix prefix[0..layers·J) against every entry, recomputed from scratch in scalar code
 * with the same float operations in the same order. scores[size] (may be NULL) receives
 * every entry's score, *best_score (may be NULL) the best one's. @return the best entry,
 * or -1. O(C·layers·J). */
int32_t fmoe_matcher_trajectory_reference(const fmoe_expertmap *store, const float *prefix,
                                          int32_t layers, float *best_score, float *scores);

/* Reference implementation of the mathematics (tests, benchmarks): the trajectory scores
 * of one prefix against every entry, recomputed from scratch with double accumulation into
 * scores[size]. Equals the matcher to float rounding (not bit for bit). @return the best
 * entry, or -1. */
int32_t fmoe_matcher_trajectory_naive(const fmoe_expertmap *store, const float *prefix,
                                      int32_t layers, float *scores);

/* ------------------------------------------------------------------ matcher thread */

/*
 * The matcher beside inference (fMoE §4.3, publisher/subscriber): a thread that owns a
 * matcher over `store`, runs the searches posted to it in posting order and posts back
 * their best entries. Posting copies the rows and never waits; results are the very
 * values the same calls on an inline matcher give. Iteration ids are > 0 and grow: a new
 * iteration (begin) drops the searches of older ones that have not started and their
 * results not yet taken. At most one begin, one semantic search and L trajectory rows
 * may be pending per iteration (more are refused, with the rest of that iteration:
 * fmoe_match_worker_dropped). The store must not be modified while searches are pending
 * (fmoe_match_worker_wait first). Every call but start belongs to one thread (the
 * policy's).
 *
 *     fmoe_match_worker_begin(w, it, n);
 *     fmoe_match_worker_trajectory(w, it, 0, n, rows0, stride);   // after layer 0's gate
 *     ... at each later event: while (fmoe_match_worker_poll(w, &r, best, score)) use(r);
 *
 * delay_s (tests): each search takes at least this long. */
typedef struct fmoe_match_worker fmoe_match_worker;

typedef enum { FMOE_MATCH_SEMANTIC = 0, FMOE_MATCH_TRAJECTORY = 1 } fmoe_match_kind;

typedef struct fmoe_match_result {
    uint64_t iteration;
    int32_t kind;  /* fmoe_match_kind */
    int32_t layer; /* the trajectory row added (the search after that layer); semantic: -1 */
    int32_t n;     /* queries: best[0..n), score[0..n) */
} fmoe_match_result;

int fmoe_match_worker_start(fmoe_match_worker **out, const fmoe_expertmap *store,
                            int32_t max_queries, double delay_s);
void fmoe_match_worker_stop(fmoe_match_worker *w); /* joins the thread; NULL: no-op */
/* fmoe_matcher_trajectory_begin(n) for iteration `iteration`. */
void fmoe_match_worker_begin(fmoe_match_worker *w, uint64_t iteration, int32_t n);
/* fmoe_matcher_semantic over sem[q * stride + 0..h) (nothing when the store has no
 * embeddings) and fmoe_matcher_trajectory_add of rows[q * stride + 0..J). */
void fmoe_match_worker_semantic(fmoe_match_worker *w, uint64_t iteration, int32_t n,
                                const float *sem, int64_t stride);
void fmoe_match_worker_trajectory(fmoe_match_worker *w, uint64_t iteration, int32_t layer,
                                  int32_t n, const float *rows, int64_t stride);
/* The oldest result not taken, into *r, best[r->n], score[r->n]: 1, or 0 when none is
 * ready (one atomic load, no lock, when none is). */
int fmoe_match_worker_poll(fmoe_match_worker *w, fmoe_match_result *r, int32_t *best,
                           float *score);
/* Waits until every posted search is done or the result ring is full. @return the
 * searches still pending (0: all done; else poll, then wait again). */
int32_t fmoe_match_worker_wait(fmoe_match_worker *w);
/* Searches refused because an iteration posted more than it may. */
int64_t fmoe_match_worker_dropped(const fmoe_match_worker *w);

#endif
