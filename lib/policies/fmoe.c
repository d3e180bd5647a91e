/*
 * fmoe.c - fMoE, fine-grained expert offloading ("fMoE: Fine-Grained Expert Offloading for
 * Large Mixture-of-Experts Serving" §4; § below are that paper's), and the ablations of its
 * §6.5 as policy variants.
 *
 * Data. An expert-map store (fmoe/expertmap.h): per stored token its gate probabilities at
 * every layer and its semantic embedding. Offline mode matches against a store built by
 * `fmoe build-store` and frozen; offline-update also adds to it; online mode starts empty
 * (capacity: the setting store_capacity, default 1000) and adds every finished token's map,
 * with the store's deduplication once full (§4.4). The mode is the setting store_mode
 * (fm_settings below, shared by every variant).
 *
 * Matching (§4.2). At the start of an iteration, semantic search: each token's embedding
 * against the store's; the best entry's rows 0..d-1 plan the first d layers. Without
 * embeddings (imported traces rarely have them) those layers fall back to the store's most
 * popular experts per layer. After layer l's gate, trajectory search: the rows observed so
 * far in this iteration against the same rows of every stored map (incremental, O(C·J)
 * per layer: fmoe_matcher); the best entry's row l + d plans layer l + d. A prefill
 * iteration tracks up to MAX_QUERIES of its tokens (evenly spaced) as separate queries and
 * plans the union of their selections; a decode iteration is one token, one query.
 *
 * Selection and priority (§4.3, §4.5). For a matched row P and its similarity score,
 * delta = clip(1 - score, 0, 1) and the experts taken, best first, are the fewest whose
 * probability reaches delta (as a share of the row's total; see lib/expertmap/select.c),
 * never fewer than K. Each is prefetched with priority p / (l - l_now). The popularity
 * fallback takes the experts a batch of n tokens is expected to touch,
 * sum_j 1 - (1 - pi_j)^(n K) (at least K), by popularity pi.
 *
 * Cache (§4.5). Evict the resident expert with the lowest p · freq: p its probability in
 * the current maps (the observed row for layers this iteration has passed, the matched
 * map's row for the layers ahead; floor 1e-6; a top-k-only row gives its unknown mass to
 * the other experts equally), freq its cache visits so far plus one (visits counted over
 * the run, not only since the expert was last loaded: §4.5 keeps experts that are visited
 * often, and a count reset at each eviction forgets exactly those; the +1 keeps a
 * just-prefetched expert from being worth zero). No recency term; ties go to the least
 * recently accessed.
 *
 * On a miss (§4.5) fMoE pauses prefetching and loads the missed expert first: when a gate
 * routes to an expert that is neither resident nor on its way, the prefetches planned at
 * that gate are held back until the layer is done (the executor already puts demand loads
 * ahead of queued prefetches), then issued.
 *
 * Where the paper is silent, fmoe decides (documented, not tuned):
 *   - a prefetch never evicts an expert worth more (p · freq) than the incoming one is
 *     (p · 1); it is dropped instead, so a speculative load cannot push out a better
 *     resident; demand loads evict as above;
 *   - the experts the current layer routes to are not evicted until the layer is done,
 *     unless nothing else can be;
 *   - at most max(K, N / (d + 1)) experts are prefetched per target layer, so that the d
 *     layers in flight and the current one fit in N slots.
 *
 * The setting evict=predicted-reuse (fmoe's duel only) adds a third shadow evicting by
 * predicted-reuse's per-expert reuse estimate (reuse_estimate.h), and the duel's recency
 * side evicts by that estimate while its shadow missed less than recency's (off by
 * default; docs/policies.md#fmoe). evict=request-reuse does the same with the
 * request-level estimate, its prior K · p from the eviction's p (map_rate).
 *
 * Variants (§6.5): fmoe (semantic + trajectory + delta, p·freq), fmoe-map-t
 * (trajectory only, the first d layers from popularity; K experts per query), fmoe-map-ts
 * (trajectory + semantic; K per query), fmoe-hitcount (request-level expert hit counts:
 * the current request's counts at layer l + d, MoE-Infinity's coarse EAM signal, with the
 * same cache), fmoe-lru and fmoe-lfu (fmoe's prefetching, LRU / LFU eviction).
 *
 * The matcher runs beside inference (§4.3): its prefetches carry FMOE_POLICY_MATCHER, and
 * the simulator issues them after the modelled match delay. Live (cfg->predict_thread),
 * the searches run on a thread of their own (fmoe_match_worker, publisher/subscriber as in
 * §4.3): a gate publishes its rows and returns at once; each finished search is taken at
 * the first event after it is done (a gate, an access, a layer done), which plans its
 * target layer and refreshes cur_p from there on, exactly what the inline search would
 * have done at its gate, only later. A plan whose target layer has already started is
 * dropped (it would come too late), and its priority counts the layers from the one
 * running when it is issued. No layer waits for the matcher; the decisions then depend
 * on how fast it is, so the decision-log identity runs the matcher inline
 * (--sync-predictions). In the modes
 * that update the store, iteration end waits for the iteration's last search (the store
 * must not change under the thread), after the last layer.
 *
 * Cost per layer: O(C·J) for the trajectory step (fmoe_matcher: one vectorised pass over
 * the layer's block of the store, a prefill's queries together), O(J·m) per query for
 * the selection of m experts, O(N) per victim. Memory: the store (its own copy in the
 * updating modes), and the matcher's 2·MAX_QUERIES·C + C floats of running sums and
 * scores plus MAX_QUERIES·(L·J + h) of observed rows, and MAX_QUERIES·2·L for
 * the searches made ahead. No allocation after init.
 *
 * Speed without changing a decision (tests/policies/test_fmoe_equivalence.c runs every
 * variant against its fmoe__policy_<v>_reference twin, which takes none of these, and
 * compares every prefetch and victim):
 *   - cur_p's rows for the layers ahead are a function of the best entries and the
 *     store's contents: when neither changed since they were last made, they stay
 *     (set_cur_p_from_maps);
 *   - the trajectory search after the last layer plans nothing and sets no cur_p row:
 *     skipped, unless the store is this policy's own (its best entries count as hits);
 *   - the victim choice for p·freq computes every slot's value, then the minima, with no
 *     data-dependent branch, and keeps its smallest value while neither the cache nor
 *     cur_p / protect changed (a prefetch that may evict nothing is then answered at
 *     once; choose_victim_pfreq);
 *   - with a frozen store, the trajectory searches of the decode tokens the simulator
 *     announces (ev->ahead) are made ahead in batches (memo_prepare);
 *   - the request-level expert counts are kept only by fmoe-hitcount, which reads them.
 * The search after each of the layers L-d..L-2 plans nothing either, but it refreshes
 * cur_p for the layers after it, which eviction reads: skipping it would change
 * decisions, so it runs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/expertmap.h"
#include "fmoe/policy.h"
#include "expertmap/matcher_internal.h"
#include "reuse_estimate.h"

#define MAX_QUERIES 64
#define DEFAULT_STORE 1000
#define DEFAULT_DISTANCE 3

/* The settings of every fmoe variant (fmoe/policy.h): --policy-opt store_mode=M and
 * store_capacity=C, or simulate's shorthands --store-mode and --store-capacity. The
 * choices are fmoe_store_mode's, in its order. */
static const char *const store_modes[] = {"offline", "online", "offline-update", NULL};
static const char *const fm_evict_rules[] = {"recency", "predicted-reuse", "request-reuse",
                                             NULL};
static const fmoe_policy_setting fm_settings[] = {
    {.name = "store_mode", .type = FMOE_SETTING_CHOICE, .def = FMOE_STORE_OFFLINE,
     .choices = store_modes,
     .help = "offline: the expert-map store as built, frozen (§6.1-§6.2); online: start "
             "empty and add each finished token's map (§6.3); offline-update: as built, and "
             "add",
     .option = "store-mode"},
    {.name = "store_capacity", .type = FMOE_SETTING_INT, .def = 0, .min = 0, .max = INT32_MAX,
     .help = "entries online mode's store holds, or offline-update grows the given store to, "
             "deduplicating once full (§4.4); 0: online 1000, offline-update the store's own",
     .option = "store-capacity"},
    {.name = "evict", .type = FMOE_SETTING_CHOICE, .def = 0, .choices = fm_evict_rules,
     .help = "fmoe (its eviction duel): the duel's recency side evicts by recency (LRU), or "
             "while a third shadow says it missed less by predicted-reuse's per-expert reuse "
             "estimate (predicted-reuse) or by the matched maps' p, refined by the request's "
             "own uses (request-reuse)"},
    {0},
};

/* EVICT_DUEL: p x freq or recency, whichever a shadow directory of each says would have
 * missed less lately (set dueling: Qureshi et al., ISCA 2007; the cyclic layer-by-layer
 * reuse of decode favours recency when nearly every expert fits, p x freq when few do) */
typedef enum { EVICT_PFREQ, EVICT_LRU, EVICT_LFU, EVICT_DUEL, EVICT_REUSE } evict_rule;

/* the shadows' miss counts are halved when together they reach this many: a horizon
 * counted in misses, as DIP's PSEL counter moves only on misses (counted in accesses,
 * a cache that nearly always hits held a handful of misses per window and flipped on
 * noise: fmoe's hit rate fell below LRU's at 80-90% of fmoe-tiny prompts_100) */
enum { DUEL_WINDOW = 256 };
typedef enum { PREDICT_MAPS, PREDICT_HITCOUNT } predict_rule;

typedef struct variant {
    const char *name;
    int semantic;         /* semantic search for the first d layers */
    int delta;            /* similarity-aware delta; else K experts per query */
    predict_rule predict;
    evict_rule evict;
    int reference;        /* differential tests: no shortcuts, the matcher's scalar path */
} variant;

/* A shadow directory (EVICT_DUEL): which N experts a cache of its rule would hold, with the
 * tick of each one's last access (0: absent) and the members listed, so that finding a
 * victim scans N entries, not L*J. */
typedef struct shadow {
    uint64_t *stamp;          /* [L*J] */
    int32_t *member;          /* [N] expert ids, unordered */
    int32_t n;
} shadow;

typedef struct deferred {
    int32_t layer, expert;
    double priority, p;
} deferred;

typedef struct fm_state {
    variant v;
    int32_t L, J, K, N, d, h; /* h: embedding size matched (0: semantic search off) */
    size_t LJ;
    int32_t mode;
    const fmoe_expertmap *store; /* matched; == own in the updating modes */
    fmoe_expertmap *own;
    fmoe_matcher *m;          /* the inline matcher; NULL when it runs on a thread */
    fmoe_match_worker *worker; /* the matcher on its own thread (cfg->predict_thread) */
    uint64_t iteration;        /* the current iteration's id, posted with its searches */
    int32_t first;             /* layers the semantic search plans: min(d, L) */
    int32_t *wbest;            /* [Q] a taken result */
    float *wscore;             /* [Q] */
    int32_t budget;           /* most experts prefetched per target layer */
    /* the current iteration */
    int active;
    int32_t next_layer;
    int32_t n_tokens, nq, stride; /* tokens, queries tracked, token stride between queries */
    int have_sem;
    float *rows;              /* [Q][L][J] observed gate rows of the queries */
    float *sem;               /* [Q][h] their embeddings */
    int32_t *best;            /* [Q] best entry of the last search */
    float *score;             /* [Q] its similarity */
    float *cur_p;             /* [L][J] p of each expert for eviction */
    /* what rows [cp_from, L) of cur_p were last computed from (set_cur_p_from_maps) */
    int cp_valid;
    int32_t cp_from, cp_nq;
    uint64_t cp_version;      /* the store's version then */
    int32_t *cp_best;         /* [Q] the queries' best entries then */
    float *rowbuf;            /* [J] a stored row, gathered */
    float *mapbuf;            /* [L][J] a stored map's rows, gathered */
    int32_t cur_layer;
    uint8_t *protect;         /* [J] routed at cur_layer, kept until the layer is done */
    /* planning scratch */
    double *pri;              /* [J] priority per expert of the target layer, < 0: not planned */
    double *pp;               /* [J] its probability */
    float *share;             /* [J] */
    int32_t *sel;             /* [J] */
    int32_t *order;           /* [J] */
    /* pause on a miss: plans held back until the layer is done */
    int paused;
    deferred *held;           /* [L*J] */
    int32_t n_held;
    /* a prefetch in progress (for choose_victim) */
    /* request-level hit counts (fmoe-hitcount) */
    uint32_t *req_counts;     /* [L][J] */
    double *victim_keys;      /* [2][N] choose_victim_pfreq's scratch */
    /* EVICT_DUEL: two shadow directories of N experts fed the access stream at the gates,
     * one evicting by recency, one by p x freq; stamps are last-access ticks, 0 absent */
    shadow sh_lru, sh_pf;
    uint64_t sh_tick;
    double sh_miss_lru, sh_miss_pf;
    /* evict=predicted-reuse (EVICT_DUEL only): a third shadow evicting by the reuse estimate
     * (reuse_estimate.h, fed every access; tick: the cache's at the last one) */
    int evict_reuse;
    fmoe__reuse_estimate reuse;
    shadow sh_reuse;
    double sh_miss_reuse;
    uint64_t tick;
    /* what cur_p and protect were made from changes with every event: gen counts them, and
     * choose_victim_pfreq keeps its smallest unprotected value while neither they nor the
     * cache (its version) changed */
    uint64_t gen, vm_gen, vm_cache;
    int vm_valid;
    double vm_min_free;
    /* trajectory searches of one-token iterations made ahead, in a batch (memo_prepare) */
    int32_t memo_n, memo_next;   /* tokens in the batch, the next one to take */
    int32_t memo_cur;            /* the current iteration's token; -1: searches live */
    float *memo_probs;           /* [MAX_QUERIES][L][J] the batch's rows, copied: the memo
                                    is keyed on content, not on where the rows were */
    int32_t *memo_best;          /* [L][MAX_QUERIES] */
    float *memo_score;           /* [L][MAX_QUERIES] */
    float *memo_semrows;         /* [MAX_QUERIES][h] the batch's embeddings, copied */
    int memo_sem;                /* the batch's semantic searches were made */
    int32_t memo_sem_best[MAX_QUERIES];
    float memo_sem_score[MAX_QUERIES];
} fm_state;

/* ------------------------------------------------------------------ init / free */

static void fm_free(void *state) {
    fm_state *S = state;
    if (!S) return;
    fmoe_match_worker_stop(S->worker); /* first: it reads the store */
    free(S->wbest);
    free(S->wscore);
    fmoe_matcher_free(S->m);
    fmoe_expertmap_free(S->own);
    free(S->rows);
    free(S->sem);
    free(S->best);
    free(S->score);
    free(S->cur_p);
    free(S->cp_best);
    free(S->rowbuf);
    free(S->mapbuf);
    free(S->protect);
    free(S->pri);
    free(S->pp);
    free(S->share);
    free(S->sel);
    free(S->order);
    free(S->held);
    free(S->req_counts);
    free(S->memo_best);
    free(S->memo_probs);
    free(S->memo_semrows);
    free(S->memo_score);
    free(S->victim_keys);
    shadow *shadows[3] = {&S->sh_lru, &S->sh_pf, &S->sh_reuse};
    for (int i = 0; i < 3; i++) {
        free(shadows[i]->stamp);
        free(shadows[i]->member);
    }
    fmoe__reuse_estimate_free(&S->reuse);
    free(S);
}

/* evict=request-reuse's prediction (reuse_estimate.h): expert e's rate in the current
 * request as fmoe's eviction sees it, K · p (p: the observed gate row for the layers this
 * iteration reached, the matched maps' row for those ahead; each token picks K experts). */
static double map_rate(const void *ctx, int32_t e) {
    const fm_state *S = ctx;
    return fmin(1.0, (double)S->K * (double)S->cur_p[e]);
}

static int fm_init_variant(void **state, const fmoe_policy_config *cfg, const variant *v) {
    *state = NULL;
    const fmoe_expertmap *given = cfg->expert_store;
    const int32_t mode = fmoe_policy_setting_choice(cfg, fm_settings, "store_mode");
    const int32_t capacity = (int32_t)fmoe_policy_setting_int(cfg, fm_settings, "store_capacity");
    FMOE_RETURN_ERROR_IF(mode != FMOE_STORE_ONLINE && !given, FMOE_EINVAL,
                         "policy %s needs an expert-map store: give one (fmoe build-store; "
                         "simulate --store STORE.h5) or use store mode online",
                         v->name);
    FMOE_RETURN_ERROR_IF(cfg->prefetch_distance < 1 || cfg->prefetch_distance >= cfg->num_layers,
                         FMOE_EINVAL,
                         "policy %s: prefetch distance %d, expected 1..%d (less than the %d "
                         "MoE layers)",
                         v->name, cfg->prefetch_distance, cfg->num_layers - 1, cfg->num_layers);
    if (given && mode != FMOE_STORE_ONLINE) {
        const fmoe_expertmap_config *sc = fmoe_expertmap_config_of(given);
        FMOE_RETURN_ERROR_IF(sc->num_layers != cfg->num_layers ||
                                 sc->num_experts != cfg->num_experts || sc->top_k != cfg->top_k,
                             FMOE_EMISMATCH,
                             "policy %s: the store holds maps of %d layers x %d experts, top-%d; "
                             "the trace has %d x %d, top-%d",
                             v->name, sc->num_layers, sc->num_experts, sc->top_k,
                             cfg->num_layers, cfg->num_experts, cfg->top_k);
    }
    fm_state *S = calloc(1, sizeof *S);
    if (!S) return fmoe_error_set(FMOE_ENOMEM, "policy %s", v->name);
    S->v = *v;
    S->L = cfg->num_layers;
    S->J = cfg->num_experts;
    S->K = cfg->top_k;
    S->N = cfg->capacity;
    S->d = cfg->prefetch_distance;
    S->LJ = (size_t)S->L * (size_t)S->J;
    S->mode = mode;
    S->cur_layer = -1;
    const int32_t per_layer = S->N / (S->d + 1);
    S->budget = per_layer > S->K ? per_layer : S->K;
    int rc = 0;
    if (mode == FMOE_STORE_ONLINE) {
        const fmoe_expertmap_config sc = {
            .capacity = capacity > 0 ? capacity : DEFAULT_STORE,
            .num_layers = S->L, .num_experts = S->J, .top_k = S->K,
            .semantic_dim = cfg->semantic_dim > 0 ? cfg->semantic_dim : 0,
            .prefetch_distance = S->d};
        rc = fmoe_expertmap_init(&S->own, &sc);
    } else if (mode == FMOE_STORE_OFFLINE_UPDATE) {
        rc = fmoe_expertmap_clone(&S->own, given, capacity);
    }
    if (rc < 0) {
        fm_free(S);
        fmoe_error_prefix("policy %s", v->name);
        return rc;
    }
    S->store = S->own ? S->own : given;
    const int32_t sh = fmoe_expertmap_config_of(S->store)->semantic_dim;
    S->h = sh > 0 && sh == cfg->semantic_dim ? sh : 0;
    const size_t Q = MAX_QUERIES, J = (size_t)S->J;
    S->rows = calloc(Q * S->LJ, sizeof *S->rows);
    S->sem = S->h ? calloc(Q * (size_t)S->h, sizeof *S->sem) : NULL;
    S->best = calloc(Q, sizeof *S->best);
    S->score = calloc(Q, sizeof *S->score);
    S->cur_p = calloc(S->LJ, sizeof *S->cur_p);
    S->cp_best = calloc(Q, sizeof *S->cp_best);
    S->rowbuf = calloc(J, sizeof *S->rowbuf);
    S->mapbuf = calloc(S->LJ, sizeof *S->mapbuf);
    S->protect = calloc(J, 1);
    S->pri = calloc(J, sizeof *S->pri);
    S->pp = calloc(J, sizeof *S->pp);
    S->share = calloc(J, sizeof *S->share);
    S->sel = calloc(J, sizeof *S->sel);
    S->order = calloc(J, sizeof *S->order);
    S->held = calloc(S->LJ, sizeof *S->held);
    S->req_counts = calloc(S->LJ, sizeof *S->req_counts);
    S->memo_best = calloc((size_t)S->L * Q, sizeof *S->memo_best);
    S->memo_score = calloc((size_t)S->L * Q, sizeof *S->memo_score);
    S->memo_probs = calloc((size_t)Q * S->LJ, sizeof *S->memo_probs);
    S->memo_semrows = S->h ? calloc((size_t)Q * (size_t)S->h, sizeof *S->memo_semrows) : NULL;
    S->victim_keys = calloc(2 * (size_t)(S->N > 0 ? S->N : 1), sizeof *S->victim_keys);
    if (v->evict == EVICT_DUEL) {
        /* predicted-reuse's defaults (reuse_half_life 4, reuse_prior 2, reuse_overdue 2,
         * request_weight 4) */
        const int32_t evict = fmoe_policy_setting_choice(cfg, fm_settings, "evict");
        S->evict_reuse = evict >= 1;
        shadow *shadows[3] = {&S->sh_lru, &S->sh_pf, &S->sh_reuse};
        int bad = S->evict_reuse && fmoe__reuse_estimate_init(&S->reuse, S->L, S->J, 4, 2, 2) < 0;
        if (!bad && evict == 2) {
            bad = fmoe__reuse_estimate_use_request(&S->reuse, S->L, 4, 0) < 0;
            S->reuse.predict = map_rate;
            S->reuse.predict_ctx = S;
        }
        for (int i = 0; i < 2 + S->evict_reuse; i++) {
            shadows[i]->stamp = calloc(S->LJ, sizeof *shadows[i]->stamp);
            shadows[i]->member = calloc((size_t)(S->N > 0 ? S->N : 1), sizeof(int32_t));
            bad |= !shadows[i]->stamp || !shadows[i]->member;
        }
        if (bad) {
            fm_free(S);
            return fmoe_error_set(FMOE_ENOMEM, "policy %s state", v->name);
        }
    }
    S->memo_cur = -1;
    if (!S->rows || (S->h && !S->sem) || !S->best || !S->score || !S->cur_p || !S->cp_best ||
        !S->rowbuf || !S->mapbuf || !S->protect || !S->pri || !S->pp || !S->share || !S->sel ||
        !S->order || !S->held || !S->req_counts || !S->memo_best || !S->memo_score ||
        !S->memo_probs || (S->h && !S->memo_semrows) || !S->victim_keys) {
        fm_free(S);
        return fmoe_error_set(FMOE_ENOMEM, "policy %s state", v->name);
    }
    S->first = S->d < S->L ? S->d : S->L;
    if (cfg->predict_thread && v->predict == PREDICT_MAPS && !v->reference) {
        S->wbest = calloc(Q, sizeof *S->wbest);
        S->wscore = calloc(Q, sizeof *S->wscore);
        if (!S->wbest || !S->wscore) {
            fm_free(S);
            return fmoe_error_set(FMOE_ENOMEM, "policy %s state", v->name);
        }
        rc = fmoe_match_worker_start(&S->worker, S->store, MAX_QUERIES, cfg->predict_delay_s);
    } else {
        rc = fmoe_matcher_init(&S->m, S->store, MAX_QUERIES);
    }
    if (rc < 0) {
        fm_free(S);
        return rc;
    }
    if (S->m) fmoe__matcher_set_reference(S->m, v->reference);
    *state = S;
    return 0;
}

/* ------------------------------------------------------------------ planning */

static void plan_clear(fm_state *S) {
    for (int32_t j = 0; j < S->J; j++) S->pri[j] = -1;
}

/* Adds the experts selected from row tl of entry y (similarity `score`) for target layer
 * tl. */
static void plan_row(fm_state *S, int32_t y, double score, int32_t tl, int32_t l_now) {
    const float *p = S->rowbuf;
    fmoe_expertmap_get_row(S->store, y, tl, S->rowbuf);
    const int32_t m = fmoe_expertmap_select(p, S->J, S->v.delta ? score : 1.0, S->K, S->sel);
    for (int32_t i = 0; i < m; i++) {
        const int32_t j = S->sel[i];
        const double pr = fmoe_expertmap_prefetch_priority(p[j], tl, l_now);
        if (pr > S->pri[j]) {
            S->pri[j] = pr;
            S->pp[j] = p[j];
        }
    }
}

/* Plans target layer tl from counts c[J] (popularity of the store, or the request's hit
 * counts) for an iteration of n tokens: the experts n tokens are expected to touch. */
static void plan_counts(fm_state *S, const uint32_t *c, int32_t tl, int32_t l_now, int32_t n) {
    double total = 0;
    for (int32_t j = 0; j < S->J; j++) total += c[j];
    if (total <= 0) return;
    double expect = 0;
    const double picks = (double)n * S->K;
    for (int32_t j = 0; j < S->J; j++) expect += 1.0 - pow(1.0 - c[j] / total, picks);
    int32_t m = (int32_t)llround(expect);
    if (m < S->K) m = S->K;
    if (m > S->J) m = S->J;
    /* the m largest counts, ties to the lower index */
    float *share = S->share;
    for (int32_t j = 0; j < S->J; j++) share[j] = (float)(c[j] / total);
    const int32_t got = fmoe_expertmap_select(share, S->J, 1.0, m, S->sel);
    for (int32_t i = 0; i < got; i++) {
        const int32_t j = S->sel[i];
        const double p = c[j] / total;
        const double pr = fmoe_expertmap_prefetch_priority(p, tl, l_now);
        if (pr > S->pri[j]) {
            S->pri[j] = pr;
            S->pp[j] = p;
        }
    }
}

static double keep_value(const fm_state *S, const fmoe_cache_view *v, int32_t s) {
    const int32_t e = v->slot_expert[s];
    return fmoe_expertmap_keep_value(S->cur_p[e], (double)v->expert_accesses[e] + 1.0);
}

static void issue(fm_state *S, const fmoe_policy_env *env, int32_t l, int32_t j, double pri,
                  double p) {
    if (S->paused) {
        if (S->n_held < (int32_t)S->LJ) S->held[S->n_held++] = (deferred){l, j, pri, p};
        return;
    }
    env->sink->prefetch(env->sink->ctx, l, j, pri, p);
}

/* Issues the planned experts of target layer tl, best first, at most budget of them. */
static void plan_issue(fm_state *S, const fmoe_policy_env *env, int32_t tl) {
    int32_t n = 0;
    for (int32_t j = 0; j < S->J; j++)
        if (S->pri[j] >= 0) S->order[n++] = j;
    /* insertion sort by priority, descending (n is small: a plan of a few experts) */
    for (int32_t a = 1; a < n; a++) {
        const int32_t x = S->order[a];
        int32_t b = a;
        while (b > 0 && S->pri[S->order[b - 1]] < S->pri[x]) {
            S->order[b] = S->order[b - 1];
            b--;
        }
        S->order[b] = x;
    }
    if (n > S->budget) n = S->budget;
    for (int32_t i = 0; i < n; i++) {
        const int32_t j = S->order[i];
        issue(S, env, tl, j, S->pri[j], S->pp[j]);
    }
}

/* A row that holds only the top-k weights (a trace without full distributions) says
 * nothing of the other experts; for eviction they share the unknown mass 1 - sum equally
 * (the maximum-entropy completion) instead of counting as impossible. A full row (sum 1)
 * is unchanged. */
static void complete_row(float *row, int32_t J) {
    double sum = 0;
    int32_t zeros = 0;
    for (int32_t j = 0; j < J; j++) {
        sum += row[j];
        zeros += row[j] <= 0;
    }
    if (zeros == 0 || sum >= 1.0 - 1e-3) return;
    const float fill = (float)((1.0 - sum) / zeros);
    for (int32_t j = 0; j < J; j++)
        if (row[j] <= 0) row[j] = fill;
}

/* Row l of cur_p is about to be overwritten by something else than the maps. */
static void cur_p_overwrite(fm_state *S, int32_t l) {
    if (S->cp_from <= l) S->cp_from = l + 1;
}

/* cur_p rows [from, to): the highest probability over the queries' best maps. The rows
 * are a function of (the best entries, the store's contents) only, so when rows
 * [from, L) were last made from the same entries of the same store version and nothing
 * else wrote them since, they are left as they are (the trajectory's best entries often
 * stay the same from one layer to the next). */
static void set_cur_p_from_maps(fm_state *S, int32_t from, int32_t to) {
    int any = 0;
    for (int32_t q = 0; q < S->nq; q++) any |= S->best[q] >= 0;
    if (!any) return;
    const uint64_t version = fmoe_expertmap_version(S->store);
    if (!S->v.reference && to == S->L && S->cp_valid && S->cp_from <= from &&
        S->cp_nq == S->nq && S->cp_version == version &&
        memcmp(S->cp_best, S->best, (size_t)S->nq * sizeof *S->best) == 0)
        return;
    S->gen++;
    const size_t J = (size_t)S->J;
    float *rows = S->cur_p + (size_t)from * J;
    const size_t n = (size_t)(to - from) * J;
    if (S->v.reference) {
        for (int32_t l = from; l < to; l++) {
            float *row = S->cur_p + (size_t)l * J;
            memset(row, 0, J * sizeof *row);
            for (int32_t q = 0; q < S->nq; q++) {
                if (S->best[q] < 0) continue;
                fmoe_expertmap_get_row(S->store, S->best[q], l, S->rowbuf);
                for (size_t j = 0; j < J; j++)
                    if (S->rowbuf[j] > row[j]) row[j] = S->rowbuf[j];
            }
        }
    } else { /* the same maxima (the maps hold no NaN), query by query */
        memset(rows, 0, n * sizeof *rows);
        for (int32_t q = 0; q < S->nq; q++) {
            if (S->best[q] < 0) continue;
            fmoe_expertmap_get_rows(S->store, S->best[q], from, to, S->mapbuf);
            for (size_t i = 0; i < n; i++)
                if (S->mapbuf[i] > rows[i]) rows[i] = S->mapbuf[i];
        }
    }
    for (int32_t l = from; l < to; l++) complete_row(S->cur_p + (size_t)l * J, S->J);
    if (to == S->L) {
        S->cp_valid = 1;
        S->cp_from = from;
        S->cp_nq = S->nq;
        S->cp_version = version;
        memcpy(S->cp_best, S->best, (size_t)S->nq * sizeof *S->best);
    } else {
        for (int32_t l = from; l < to; l++) cur_p_overwrite(S, l);
    }
}

/* ------------------------------------------------------------------ events */

static void fm_on_request_start(void *state, const fmoe_policy_env *env,
                                const fmoe_request_event *ev) {
    (void)env;
    (void)ev;
    fm_state *S = state;
    S->gen++;
    memset(S->req_counts, 0, S->LJ * sizeof *S->req_counts);
    if (S->reuse.req_used) fmoe__reuse_estimate_request_start(&S->reuse);
}

static void begin_iteration(fm_state *S, int32_t n, const float *sem, int32_t sem_dim) {
    S->active = 1;
    S->next_layer = 0;
    S->n_tokens = n > 0 ? n : 1;
    S->stride = (S->n_tokens + MAX_QUERIES - 1) / MAX_QUERIES;
    S->nq = (S->n_tokens + S->stride - 1) / S->stride;
    S->have_sem = S->h > 0 && sem && sem_dim == S->h;
    if (S->have_sem)
        for (int32_t q = 0; q < S->nq; q++)
            memcpy(S->sem + (size_t)q * S->h, sem + (size_t)q * S->stride * S->h,
                   (size_t)S->h * sizeof *S->sem);
    for (int32_t q = 0; q < S->nq; q++) S->best[q] = -1;
    S->iteration++;
    if (S->worker)
        fmoe_match_worker_begin(S->worker, S->iteration, S->nq);
    else
        fmoe_matcher_trajectory_begin(S->m, S->nq);
}

/* The observed row of a token at one layer when the trace has no probabilities: its K
 * chosen experts at 1/K each. */
static void row_from_chosen(float *row, int32_t J, int32_t K, const uint16_t *chosen) {
    memset(row, 0, (size_t)J * sizeof *row);
    for (int32_t k = 0; k < K; k++) row[chosen[k]] = 1.0f / (float)K;
}

/* Searches made ahead. With a frozen store (offline mode) the trajectory search of a
 * one-token iteration at layer l is a function of the store and of that token's rows
 * 0..l only, so in the simulator, which knows the rows to come (ev->ahead), the searches
 * of up to MAX_QUERIES consecutive decode tokens run in one batch: each layer's block of
 * the store is then read once for all of them, where one token at a time the step is
 * bound by that read (docs/results.md, "Matcher and store benchmarks": 78 K against 118 K
 * token-iterations/s for 16 at once). The step does the same arithmetic for each query
 * whatever their number, so the results are the very values the live searches would
 * give (tests/policies/test_fmoe_equivalence.c compares every decision with the
 * reference twin, which searches live); on_gate checks that each gate shows the rows the
 * batch used and searches live otherwise. */
static void memo_prepare(fm_state *S, const fmoe_iteration_event *ev) {
    S->memo_cur = -1;
    if (S->worker || S->own || S->v.reference || S->v.predict != PREDICT_MAPS || ev->num_tokens != 1 ||
        ev->ahead < 1 || !ev->ahead_probs || S->L < 2 || fmoe_expertmap_size(S->store) == 0)
        return;
    const size_t LJ = S->LJ;
    if (S->memo_next < S->memo_n &&
        memcmp(ev->ahead_probs, S->memo_probs + S->memo_next * LJ, LJ * sizeof(float)) == 0) {
        S->memo_cur = S->memo_next++;
        return;
    }
    const int32_t n = ev->ahead < MAX_QUERIES ? ev->ahead : MAX_QUERIES;
    const float *rows = ev->ahead_probs;
    /* the semantic searches too (the same bits for n queries as for one: matcher.c) */
    S->memo_sem = 0;
    if (S->v.semantic && S->h > 0 && ev->ahead_semantic && ev->semantic_dim == S->h) {
        fmoe_matcher_semantic(S->m, n, ev->ahead_semantic, S->h, S->memo_sem_best,
                              S->memo_sem_score);
        memcpy(S->memo_semrows, ev->ahead_semantic, (size_t)n * (size_t)S->h * sizeof(float));
        S->memo_sem = 1;
    }
    /* the search after the last layer is not made with a frozen store (fm_on_gate) */
    fmoe_matcher_trajectory_begin(S->m, n);
    for (int32_t l = 0; l < S->L - 1; l++)
        fmoe_matcher_trajectory_add(S->m, l, rows + (size_t)l * S->J, (int64_t)LJ,
                                    S->memo_best + (size_t)l * MAX_QUERIES,
                                    S->memo_score + (size_t)l * MAX_QUERIES);
    S->memo_n = n;
    S->memo_next = 1;
    S->memo_cur = 0;
    memcpy(S->memo_probs, rows, (size_t)n * LJ * sizeof(float));
}

/* Whether gate ev shows the rows memo_prepare used for the current token; if not, the
 * batch is dropped and the searches of the layers before l are made live. */
static void memo_check(fm_state *S, const fmoe_gate_event *ev) {
    const int32_t l = ev->layer;
    const size_t a = (size_t)S->memo_cur, J = (size_t)S->J, L = (size_t)S->L;
    if (ev->num_tokens == 1 && ev->probs &&
        memcmp(ev->probs, S->memo_probs + (a * L + (size_t)l) * J, J * sizeof(float)) == 0)
        return;
    S->memo_cur = -1;
    S->memo_n = 0;
    fmoe_matcher_trajectory_begin(S->m, S->nq);
    for (int32_t p = 0; p < l; p++)
        fmoe_matcher_trajectory_add(S->m, p, S->rows + (size_t)p * J, (int64_t)S->LJ, S->best,
                                    S->score);
}

/* The matcher thread's finished searches of this iteration, in order: each plans what its
 * inline twin planned at its gate (the semantic search: layers 0..first-1; the trajectory
 * search after layer l: layer l + d) and sets cur_p from the best maps, for the layers
 * that have not started yet. */
static void take_matches(fm_state *S, const fmoe_policy_env *env) {
    fmoe_match_result r;
    while (fmoe_match_worker_poll(S->worker, &r, S->wbest, S->wscore)) {
        if (!S->active || r.iteration != S->iteration || r.n != S->nq) continue; /* stale */
        memcpy(S->best, S->wbest, (size_t)r.n * sizeof *S->best);
        memcpy(S->score, S->wscore, (size_t)r.n * sizeof *S->score);
        const int semantic = r.kind == FMOE_MATCH_SEMANTIC;
        const int32_t now = S->next_layer - 1; /* the layer running (-1: before the first) */
        const int32_t plan_to = semantic ? S->first : r.layer + S->d + 1;
        int32_t tl = semantic ? 0 : r.layer + S->d;
        if (tl <= now) tl = now + 1; /* a plan for a started layer comes too late */
        for (; tl < plan_to && tl < S->L; tl++) {
            plan_clear(S);
            int any = 0;
            for (int32_t q = 0; q < S->nq; q++) {
                if (S->best[q] < 0) continue;
                any = 1;
                plan_row(S, S->best[q], S->score[q], tl, now);
            }
            if (!any && !semantic)
                plan_counts(S, fmoe_expertmap_popularity(S->store) + (size_t)tl * S->J, tl, now,
                            S->n_tokens);
            plan_issue(S, env, tl);
        }
        const int32_t from = semantic ? 0 : r.layer + 1, to = semantic ? S->first : S->L;
        S->gen++;
        if ((from > now ? from : now + 1) < to) set_cur_p_from_maps(S, from > now ? from : now + 1, to);
    }
}

static void fm_on_iteration_start(void *state, const fmoe_policy_env *env,
                                  const fmoe_iteration_event *ev) {
    fm_state *S = state;
    S->gen++;
    if (S->reuse.req_used) fmoe__reuse_estimate_iteration_start(&S->reuse, env->cache->tick);
    memo_prepare(S, ev);
    begin_iteration(S, ev->num_tokens, ev->semantic, ev->semantic_dim);
    const uint32_t *pop = fmoe_expertmap_popularity(S->store);
    const int32_t first = S->first;
    if (S->v.predict == PREDICT_MAPS && S->v.semantic && S->have_sem &&
        fmoe_expertmap_size(S->store) > 0) {
        if (S->worker) { /* planned when the search is done (take_matches) */
            fmoe_match_worker_semantic(S->worker, S->iteration, S->nq, S->sem, S->h);
            return;
        }
        if (S->memo_cur >= 0 && S->memo_sem && ev->semantic &&
            memcmp(ev->semantic, S->memo_semrows + (size_t)S->memo_cur * (size_t)S->h,
                   (size_t)S->h * sizeof(float)) == 0) {
            S->best[0] = S->memo_sem_best[S->memo_cur]; /* made ahead (memo_prepare) */
            S->score[0] = S->memo_sem_score[S->memo_cur];
        } else {
            fmoe_matcher_semantic(S->m, S->nq, S->sem, S->h, S->best, S->score);
        }
        for (int32_t tl = 0; tl < first; tl++) {
            plan_clear(S);
            for (int32_t q = 0; q < S->nq; q++)
                if (S->best[q] >= 0)
                    plan_row(S, S->best[q], S->score[q], tl, -1);
            plan_issue(S, env, tl);
        }
        set_cur_p_from_maps(S, 0, first);
        return;
    }
    /* no embeddings (or a variant without semantic search): the first d layers from the
     * request's own counts (hitcount, once it has some) or the store's popularity */
    for (int32_t tl = 0; tl < first; tl++) {
        plan_clear(S);
        const uint32_t *rc = S->req_counts + (size_t)tl * S->J;
        int have = 0;
        for (int32_t j = 0; S->v.predict == PREDICT_HITCOUNT && j < S->J; j++) have |= rc[j] > 0;
        plan_counts(S, have ? rc : pop + (size_t)tl * S->J, tl, -1, S->n_tokens);
        plan_issue(S, env, tl);
    }
}

/* One access of expert e to a shadow directory: a miss inserts it, evicting the member with
 * the smallest key (rule 1: p x freq; 0: its stamp, recency; 2: minus its predicted next
 * use; ties: the older stamp, and stamps are unique). @return 1 on a miss. */
static int shadow_access(fm_state *S, const fmoe_cache_view *v, shadow *d, int rule,
                         int32_t e) {
    const int miss = d->stamp[e] == 0;
    if (miss && d->n == S->N) {
        int32_t vi = -1;
        double vk = 0;
        for (int32_t i = 0; i < d->n; i++) {
            const int32_t x = d->member[i];
            const double k =
                rule == 1   ? fmoe_expertmap_keep_value(S->cur_p[x],
                                                        (double)v->expert_accesses[x] + 1.0)
                : rule == 2 ? -fmoe__reuse_estimate_next(&S->reuse, x, S->tick)
                            : (double)d->stamp[x];
            if (vi < 0 || k < vk || (k == vk && d->stamp[x] < d->stamp[d->member[vi]])) {
                vi = i;
                vk = k;
            }
        }
        const int32_t victim = d->member[vi];
        d->stamp[victim] = 0;
        d->member[vi] = d->member[--d->n];
    }
    if (miss) d->member[d->n++] = e;
    d->stamp[e] = S->sh_tick;
    return miss;
}

/* EVICT_DUEL: the layer's accesses (its distinct experts, in order) into both shadows. */
static void duel_observe(fm_state *S, const fmoe_cache_view *v, const fmoe_gate_event *ev) {
    for (int32_t q = 0; q < ev->num_distinct; q++) {
        const int32_t e = ev->layer * S->J + ev->distinct[q];
        S->sh_tick++;
        S->sh_miss_lru += shadow_access(S, v, &S->sh_lru, 0, e);
        S->sh_miss_pf += shadow_access(S, v, &S->sh_pf, 1, e);
        if (S->evict_reuse) S->sh_miss_reuse += shadow_access(S, v, &S->sh_reuse, 2, e);
        if (S->sh_miss_lru + S->sh_miss_pf + S->sh_miss_reuse >= DUEL_WINDOW) {
            S->sh_miss_lru /= 2;
            S->sh_miss_pf /= 2;
            S->sh_miss_reuse /= 2;
        }
    }
}

static void fm_on_gate(void *state, const fmoe_policy_env *env, const fmoe_gate_event *ev) {
    fm_state *S = state;
    if (S->v.evict == EVICT_DUEL) duel_observe(S, env->cache, ev);
    const int32_t l = ev->layer, J = S->J;
    S->gen++;
    if (!S->active || l != S->next_layer) {
        if (l != 0) return; /* out of step: wait for the next iteration */
        S->memo_cur = -1;
        begin_iteration(S, ev->num_tokens, NULL, 0);
    }
    S->next_layer = l + 1;
    S->cur_layer = l;
    /* protect this layer's experts; pause prefetching when one of them is a miss */
    memset(S->protect, 0, (size_t)J);
    for (int32_t i = 0; i < ev->num_distinct; i++) {
        const int32_t j = ev->distinct[i];
        S->protect[j] = 1;
        if (fmoe_cache_lookup(env->cache, l * J + j) < 0) S->paused = 1;
    }
    /* the observed row of each query (its gate probabilities; the chosen experts at 1/K
     * when the trace has none), and p of this layer for eviction */
    float *cp = S->cur_p + (size_t)l * J;
    cur_p_overwrite(S, l);
    memset(cp, 0, (size_t)J * sizeof *cp);
    for (int32_t q = 0; q < S->nq; q++) {
        const int64_t t = (int64_t)q * S->stride < ev->num_tokens ? (int64_t)q * S->stride : 0;
        float *row = S->rows + (size_t)q * S->LJ + (size_t)l * J;
        if (ev->probs)
            memcpy(row, ev->probs + t * ev->probs_stride, (size_t)J * sizeof *row);
        else
            row_from_chosen(row, J, S->K, ev->chosen + t * ev->chosen_stride);
        for (int32_t j = 0; j < J; j++)
            if (row[j] > cp[j]) cp[j] = row[j];
    }
    complete_row(cp, J);
    /* request-level counts: only fmoe-hitcount reads them */
    for (int32_t t = 0; (S->v.predict == PREDICT_HITCOUNT || S->v.reference) && t < ev->num_tokens;
         t++)
        for (int32_t k = 0; k < S->K; k++) {
            uint32_t *c = &S->req_counts[(size_t)l * J + ev->chosen[t * ev->chosen_stride + k]];
            if (*c != UINT32_MAX) (*c)++;
        }
    const int32_t tl = l + S->d;
    if (S->v.predict == PREDICT_HITCOUNT) {
        if (tl < S->L) {
            plan_clear(S);
            const uint32_t *rc = S->req_counts + (size_t)tl * J;
            int have = 0;
            for (int32_t j = 0; j < J; j++) have |= rc[j] > 0;
            plan_counts(S, have ? rc : fmoe_expertmap_popularity(S->store) + (size_t)tl * J, tl, l,
                        S->n_tokens);
            plan_issue(S, env, tl);
        }
        return;
    }
    /* The search after the last layer plans nothing and updates no cur_p row; its best
     * entries only count as hits of a store this policy updates. */
    if (S->worker) {
        if (l < S->L - 1 || S->own)
            fmoe_match_worker_trajectory(S->worker, S->iteration, l, S->nq,
                                         S->rows + (size_t)l * J, (int64_t)S->LJ);
        take_matches(S, env);
        return;
    }
    if (S->memo_cur >= 0) memo_check(S, ev);
    if (S->memo_cur >= 0 && l < S->L - 1) { /* made ahead (memo_prepare) */
        S->best[0] = S->memo_best[(size_t)l * MAX_QUERIES + (size_t)S->memo_cur];
        S->score[0] = S->memo_score[(size_t)l * MAX_QUERIES + (size_t)S->memo_cur];
    } else if (l < S->L - 1 || S->own || S->v.reference) {
        fmoe_matcher_trajectory_add(S->m, l, S->rows + (size_t)l * J, (int64_t)S->LJ, S->best,
                                    S->score);
    }
    if (tl < S->L) {
        plan_clear(S);
        int any = 0;
        for (int32_t q = 0; q < S->nq; q++) {
            if (S->best[q] < 0) continue;
            any = 1;
            plan_row(S, S->best[q], S->score[q], tl, l);
        }
        if (!any)
            plan_counts(S, fmoe_expertmap_popularity(S->store) + (size_t)tl * J, tl, l,
                        S->n_tokens);
        plan_issue(S, env, tl);
    }
    set_cur_p_from_maps(S, l + 1, S->L);
}

static void fm_on_layer_done(void *state, const fmoe_policy_env *env, int32_t layer) {
    fm_state *S = state;
    (void)layer;
    S->gen++;
    memset(S->protect, 0, (size_t)S->J);
    S->cur_layer = -1;
    if (S->paused) {
        S->paused = 0; /* the misses are loaded: resume */
        for (int32_t i = 0; i < S->n_held; i++)
            issue(S, env, S->held[i].layer, S->held[i].expert, S->held[i].priority,
                  S->held[i].p);
        S->n_held = 0;
    }
    if (S->worker) take_matches(S, env);
}

static void fm_on_access(void *state, const fmoe_policy_env *env, const fmoe_access_event *ev) {
    fm_state *S = state;
    if (S->worker) take_matches(S, env);
    if (S->evict_reuse) {
        S->tick = env->cache->tick;
        fmoe__reuse_estimate_observe(&S->reuse, ev->layer, ev->layer * S->J + ev->expert,
                                     S->tick);
    }
}

static void fm_on_iteration_end(void *state, const fmoe_policy_env *env,
                                const fmoe_iteration_event *ev) {
    (void)env;
    (void)ev;
    fm_state *S = state;
    S->gen++;
    if (S->worker && S->own) { /* the store changes next: the thread must be done with it */
        while (fmoe_match_worker_wait(S->worker) > 0) take_matches(S, env);
        take_matches(S, env);
    }
    if (S->active && S->own && S->next_layer == S->L) {
        if (S->v.predict == PREDICT_MAPS)
            for (int32_t q = 0; q < S->nq; q++) fmoe_expertmap_hit(S->own, S->best[q]);
        fmoe_expertmap_add(S->own, S->nq, S->have_sem ? S->sem : NULL, S->h, S->rows,
                           (int64_t)S->LJ, NULL, NULL);
    }
    S->active = 0;
}

/* The straightforward scan (every rule; the reference variants use it). */
static int32_t choose_victim_plain(fm_state *S, const fmoe_cache_view *v, int prefetching,
                                   double incoming_keep, evict_rule rule) {
    int32_t best = -1, fallback = -1;
    double bk = 0, fk = 0;
    uint64_t bt = 0, ft = 0;
    for (int32_t s = 0; s < v->capacity; s++) {
        if (!fmoe_cache_evictable(v, s)) continue;
        const int32_t e = v->slot_expert[s];
        double k;
        switch (rule) {
        case EVICT_LRU: k = (double)v->slot_last_access[s]; break;
        case EVICT_LFU: k = (double)v->slot_accesses[s]; break;
        case EVICT_REUSE: k = -fmoe__reuse_estimate_next(&S->reuse, e, v->tick); break;
        default: k = keep_value(S, v, s); break;
        }
        const uint64_t t = v->slot_last_access[s];
        const int prot = e / S->J == S->cur_layer && S->protect[e % S->J];
        int32_t *b = prot ? &fallback : &best;
        double *bv = prot ? &fk : &bk;
        uint64_t *btk = prot ? &ft : &bt;
        if (*b < 0 || k < *bv || (k == *bv && t < *btk)) {
            *b = s;
            *bv = k;
            *btk = t;
        }
    }
    if (best < 0) {
        best = fallback;
        bk = fk;
    }
    /* a prefetch does not evict an expert worth more than it is */
    if (prefetching && best >= 0 && rule == EVICT_PFREQ && bk > incoming_keep) return -1;
    if (prefetching && best >= 0 && best == fallback) return -1;
    return best;
}

/* Slot s's keep value into free_keys[s] (an evictable unprotected expert) or
 * prot_keys[s] (an evictable protected one), +inf in the other and for a slot that may not
 * be evicted. */
static inline void slot_keys(const fm_state *S, const fmoe_cache_view *v, int32_t s,
                             int32_t lo, const float *cur_p, const uint8_t *protect,
                             double *free_keys, double *prot_keys) {
    const int32_t e = v->slot_expert[s];
    const int ok = v->slot_state[s] == FMOE_SLOT_RESIDENT && v->slot_pins[s] == 0;
    const int32_t x = ok ? e : 0; /* a free slot holds -1 */
    const int in_layer = (uint32_t)(x - lo) < (uint32_t)S->J;
    const int prot = in_layer && protect[in_layer ? x - lo : 0];
    /* (counts stay far below 2^63: the signed conversion is the same value, and one
     * instruction where the unsigned one is a branchy sequence on x86-64) */
    const double k =
        fmoe_expertmap_keep_value(cur_p[x], (double)(int64_t)v->expert_accesses[x] + 1.0);
    free_keys[s] = ok && !prot ? k : INFINITY;
    prot_keys[s] = ok && prot ? k : INFINITY;
}

/* The first slot of the smallest (key, last access) among keys[0..n) equal to min. */
static int32_t first_of_min(const double *keys, double min, const uint64_t *last, int32_t n) {
    int32_t best = -1;
    for (int32_t s = 0; s < n; s++)
        if (keys[s] == min && (best < 0 || last[s] < last[best])) best = s;
    return best;
}

/* The same choice for p·freq eviction, the hot one, without the scan's branches (their
 * outcomes are data, so the predictor misses them): every slot's keep value first, +inf
 * for a slot that may not be evicted (and separately for the protected ones), then the
 * minima, then the first slot holding the smallest (value, last access): the scan's
 * argmin, ties to the earliest slot, exactly. */
static int32_t choose_victim_pfreq(fm_state *S, const fmoe_cache_view *v, int prefetching,
                                   double incoming_keep) {
    const int32_t J = S->J, lo = S->cur_layer * J, n = v->capacity; /* cur_layer -1: none */
    const float *cur_p = S->cur_p;
    const uint8_t *protect = S->protect;
    /* a prefetch finds no victim far more often than not (680 of 367 K tries in the
     * throughput benchmark), and tries come in runs with nothing changed in between */
    const int same = S->vm_valid && S->vm_gen == S->gen && S->vm_cache == v->version;
    if (prefetching && same && !(S->vm_min_free <= incoming_keep)) return -1;
    double *free_keys = S->victim_keys, *prot_keys = S->victim_keys + n;
    /* four slots a step, each with its own running minimum (exact in any order), so that
     * the minima are four independent chains */
    double min_free[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
    int32_t s = 0;
    for (; s + 4 <= n; s += 4)
        for (int i = 0; i < 4; i++) {
            slot_keys(S, v, s + i, lo, cur_p, protect, free_keys, prot_keys);
            min_free[i] = free_keys[s + i] < min_free[i] ? free_keys[s + i] : min_free[i];
        }
    for (; s < n; s++) {
        slot_keys(S, v, s, lo, cur_p, protect, free_keys, prot_keys);
        min_free[0] = free_keys[s] < min_free[0] ? free_keys[s] : min_free[0];
    }
    const double mf01 = min_free[0] < min_free[1] ? min_free[0] : min_free[1];
    const double mf23 = min_free[2] < min_free[3] ? min_free[2] : min_free[3];
    const double min_free_all = mf01 < mf23 ? mf01 : mf23;
    S->vm_valid = 1;
    S->vm_gen = S->gen;
    S->vm_cache = v->version;
    S->vm_min_free = min_free_all;
    /* a prefetch evicts only an unprotected expert worth at most what it brings */
    if (prefetching)
        return min_free_all <= incoming_keep
                   ? first_of_min(free_keys, min_free_all, v->slot_last_access, n)
                   : -1;
    if (min_free_all < INFINITY)
        return first_of_min(free_keys, min_free_all, v->slot_last_access, n);
    double min_prot = INFINITY; /* only the protected experts are left */
    for (int32_t i = 0; i < n; i++) min_prot = prot_keys[i] < min_prot ? prot_keys[i] : min_prot;
    if (min_prot < INFINITY) return first_of_min(prot_keys, min_prot, v->slot_last_access, n);
    return -1;
}

/* A prefetch's value is its gate probability p: it may evict only an expert worth at most
 * what it brings, p·1 (a first access), in the keep-value currency of §4.5. */
static int32_t fm_choose_victim(void *state, const fmoe_policy_env *env,
                                const fmoe_victim_request *req) {
    fm_state *S = state;
    const int prefetching = req->kind == FMOE_LOAD_PREFETCH;
    const double keep = prefetching ? fmoe_expertmap_keep_value(req->value, 1.0) : 0;
    evict_rule rule = S->v.evict;
    if (rule == EVICT_DUEL) {
        const int reuse_leads = S->evict_reuse && S->sh_miss_reuse < S->sh_miss_pf;
        if (!(S->sh_miss_lru < S->sh_miss_pf) && !reuse_leads) {
            rule = EVICT_PFREQ;
        } else {
            /* by recency (evict=predicted-reuse: by the reuse estimate while its shadow
             * missed less than recency's); a prefetch still passes p x freq's value test on
             * its victim (by recency alone, prefetches evict freely and thrash a small
             * cache) */
            const evict_rule side =
                reuse_leads && S->sh_miss_reuse < S->sh_miss_lru ? EVICT_REUSE : EVICT_LRU;
            const int32_t s = choose_victim_plain(S, env->cache, prefetching, keep, side);
            if (prefetching && s >= 0 && keep_value(S, env->cache, s) > keep) return -1;
            return s;
        }
    }
    if (rule == EVICT_PFREQ && !S->v.reference)
        return choose_victim_pfreq(S, env->cache, prefetching, keep);
    return choose_victim_plain(S, env->cache, prefetching, keep, rule);
}

/* ------------------------------------------------------------------ the variants */

/* Each variant comes twice: the policy, and fmoe__policy_<ident>_reference for the
 * differential tests (tests/policies/test_fmoe_equivalence.c): the same decisions made
 * the slow way, with the matcher's scalar reference path and without this file's
 * shortcuts (cached cur_p rows, no search after the last layer). Not in the registry. */
#define FMOE_VARIANT(ident, vname, sem, dlt, pred, ev)                                            \
    static const variant variant_##ident = {vname, sem, dlt, pred, ev, 0};                        \
    static const variant variant_##ident##_reference = {vname, sem, dlt, pred, ev, 1};            \
    static int init_##ident(void **state, const fmoe_policy_config *cfg) {                        \
        return fm_init_variant(state, cfg, &variant_##ident);                                     \
    }                                                                                             \
    static int init_##ident##_reference(void **state, const fmoe_policy_config *cfg) {            \
        return fm_init_variant(state, cfg, &variant_##ident##_reference);                         \
    }

FMOE_VARIANT(fmoe, "fmoe", 1, 1, PREDICT_MAPS, EVICT_DUEL)
FMOE_VARIANT(fmoe_paper, "fmoe-paper", 1, 1, PREDICT_MAPS, EVICT_PFREQ)
FMOE_VARIANT(fmoe_map_t, "fmoe-map-t", 0, 0, PREDICT_MAPS, EVICT_PFREQ)
FMOE_VARIANT(fmoe_map_ts, "fmoe-map-ts", 1, 0, PREDICT_MAPS, EVICT_PFREQ)
FMOE_VARIANT(fmoe_hitcount, "fmoe-hitcount", 0, 0, PREDICT_HITCOUNT, EVICT_PFREQ)
FMOE_VARIANT(fmoe_lru, "fmoe-lru", 1, 1, PREDICT_MAPS, EVICT_LRU)
FMOE_VARIANT(fmoe_lfu, "fmoe-lfu", 1, 1, PREDICT_MAPS, EVICT_LFU)

static const fmoe_expertmap *fm_expert_store(const void *state) {
    return ((const fm_state *)state)->store;
}

#define FMOE_OPS_TABLE(symbol, init_fn, vname, summary_text, flag_bits)                           \
    const fmoe_policy_ops symbol = {                                                              \
        .name = vname,                                                                             \
        .summary = summary_text,                                                                   \
        .flags = (flag_bits) | FMOE_POLICY_TAKES_STORE,                                            \
        .init = init_fn,                                                                           \
        .free = fm_free,                                                                           \
        .on_request_start = fm_on_request_start,                                                   \
        .on_iteration_start = fm_on_iteration_start,                                               \
        .on_gate = fm_on_gate,                                                                     \
        .on_access = fm_on_access,                                                                 \
        .on_layer_done = fm_on_layer_done,                                                         \
        .choose_victim = fm_choose_victim,                                                         \
        .on_iteration_end = fm_on_iteration_end,                                                   \
        .default_distance = DEFAULT_DISTANCE,                                                      \
        .expert_store = fm_expert_store,                                                           \
        .settings = fm_settings,                                                                   \
    };

#define FMOE_OPS(ident, vname, summary_text, flag_bits)                                           \
    FMOE_OPS_TABLE(fmoe_policy_##ident, init_##ident, vname, summary_text, flag_bits)             \
    extern const fmoe_policy_ops fmoe__policy_##ident##_reference;                                \
    FMOE_OPS_TABLE(fmoe__policy_##ident##_reference, init_##ident##_reference, vname,             \
                   summary_text, flag_bits)

/* probabilities when the trace has them; ids only (1/K on the chosen experts) otherwise */
#define MAPS_FLAGS (FMOE_POLICY_PREFETCHES | FMOE_POLICY_USES_PROBS | FMOE_POLICY_MATCHER)

/* fmoe: the paper's design with feedback-directed prefetch admission and early preemption
 * in the executor (lib/prefetch_feedback.h); fmoe-paper: as published, every prefetch the
 * matcher asks for is issued. */
FMOE_OPS(fmoe, "fmoe", "fMoE maps (semantic + trajectory, delta prefetch, p*freq eviction) "
         "with feedback-directed prefetch admission", MAPS_FLAGS | FMOE_POLICY_FEEDBACK)
FMOE_OPS(fmoe_paper, "fmoe-paper", "fMoE as published: semantic + trajectory map matching, "
         "delta prefetch, p*freq eviction", MAPS_FLAGS)
FMOE_OPS(fmoe_map_t, "fmoe-map-t", "fMoE ablation: trajectory search only, K experts per map",
         MAPS_FLAGS)
FMOE_OPS(fmoe_map_ts, "fmoe-map-ts", "fMoE ablation: trajectory + semantic search, K experts per map",
         MAPS_FLAGS)
FMOE_OPS(fmoe_hitcount, "fmoe-hitcount", "fMoE ablation: request-level expert hit counts",
         FMOE_POLICY_PREFETCHES)
FMOE_OPS(fmoe_lru, "fmoe-lru", "fMoE prefetching with LRU eviction", MAPS_FLAGS)
FMOE_OPS(fmoe_lfu, "fmoe-lfu", "fMoE prefetching with LFU eviction", MAPS_FLAGS)
