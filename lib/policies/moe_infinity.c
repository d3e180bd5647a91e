/*
 * moe_infinity.c - MoE-Infinity, the paper's design (Xue et al., "MoE-Infinity: Efficient
 * MoE Inference on Personal Machines with Sparsity-Aware Expert Cache", arXiv 2401.14361
 * v3): request-level expert activation matrices (§4.3, §4.5), matching by cosine
 * similarity (§4.5), layer-proximity prefetching (§4.5-§4.6), Algorithm 1 eviction (§4.7)
 * and EAMC replacement of the most similar entry (App. B.1). Where the paper leaves room,
 * the reading followed is docs/policies.md#moe-infinity; `moe-infinity-code` is what the
 * public code does instead.
 *
 * Data. An EAM is an L x J matrix of counts: M[l][j] = tokens routed to expert j of layer l
 * (each token adds its K choices). The iEAM covers the current iteration, filled layer by
 * layer as gates are known; the request's rEAM is the sum of its iEAMs, kept separately for
 * prefill and decode ("traced for prefilling and decoding separately", §4.3). The EAMC is
 * two collections of at most C rEAMs (prefill, decode; C = the setting eamc_capacity,
 * default 1000 as in the code), filled online at each request's end: appended while there is room, else
 * replacing the stored entry with the smallest cosine distance to the new one (B.1,
 * Fig. 10). An iteration matches against the collection of its phase, or the other one
 * while its own is empty.
 *
 * Matching (PredictEAM, §4.5). After layer l's gate the iEAM is compared with every entry
 * of the collection by cosine similarity of the flattened L·J vectors (dot products are
 * kept per entry and updated incrementally, O(C) per routed expert). The best entry (top-1,
 * as the code; the paper leaves the number open; ties to the older entry) is the match;
 * with no entry of positive similarity there is no prediction.
 *
 * Prefetch (§4.5-§4.6). pEAM[i][j] = (1 - (i - l)/L) * M[i][j] / sum_j' M[i][j'] for the
 * next layers i = l+1..l+d of the match M (d = prefetch distance; default 1, "the experts
 * that are likely to be activated for the next layer", §4.6; the code enqueues all later
 * layers, i.e. d = L). Every expert with pEAM > 0 is prefetched, best first, priority =
 * pEAM; prefetches still queued from the previous layer's plan and not in the new one are
 * cancelled (the code's replace_cache_candidates).
 *
 * Eviction (Algorithm 1, §4.7). Over all cached, evictable experts (layer e.l, index e.j):
 *     p = (M[e.l][e.j] + eps) * (1 - e.l / L) / sum_j M[e.l][j]
 * and the lowest p goes (eps = 1e-6, the code's expert_priority_score; ties to the least
 * recently accessed). Without a match every expert is equally likely: p = (1 - e.l/L) / J.
 * Where the paper is silent fmoe decides, conservatively: an expert the current layer still
 * has to access is not evicted (unless nothing else can be); a prefetch never evicts an
 * expert of the current plan, and only evicts one whose p (without eps) is not above the
 * incoming expert's, so a low-ranked prediction cannot push out a better-ranked resident.
 * MoE-Infinity's Fig. 6 example comes out as the paper says (tests/policies).
 *
 * moe-infinity-fb (a variant whose prefetching never loses to LRU) is the same matching,
 * plan and Algorithm 1 with three adaptive mechanisms; `moe-infinity` stays as published.
 * Measured on the traces of docs/results.md, each fixes one way the published design loses:
 *   - feedback-directed prefetch admission and early preemption, in the executor
 *     (FMOE_POLICY_FEEDBACK; lib/prefetch_feedback.h): a prediction may evict only while
 *     its layer's measured accuracy pays for the eviction's regret and the link time a
 *     wrong one steals; a gate cancels its layer's queued prefetches it did not choose;
 *   - demand first: a gate that routes to an expert neither resident nor on its way
 *     issues its plan at on_layer_done, once the layer's misses are loaded. Issued at the
 *     gate, the plan's first prefetch starts on an idle link a moment before the misses
 *     are queued, and a transfer is not preemptible: every miss of the layer then waits
 *     for a speculative load (MoE-Infinity's code gives on-demand fetches priority 0 for
 *     the same reason; fMoE pauses prefetching on a miss, §4.5). On fmoe-tiny at 30% of
 *     the experts this was the difference between 1.04 and 1.00 x LRU's TPOT;
 *   - eviction by set dueling (Qureshi et al., ISCA 2007; as fmoe's): two shadow caches
 *     of N experts fed the gates' accesses, one evicting by Algorithm 1 under the current
 *     match, one by recency; the real cache evicts by the rule whose shadow missed less
 *     (ties: Algorithm 1) over a horizon of ~DUEL_WINDOW shadow misses (counts halved
 *     when they reach it). Algorithm 1's location weight wins where each iteration
 *     cycles through more experts than fit (FLAME-MoE's prefill: LRU hits nothing below
 *     90%, the early layers kept by location do); recency wins where the
 *     matched rEAM is a poor guide to which experts recur next (Qwen1.5-MoE, 5 of 24
 *     layers logged: 1.05 x LRU at 90% without the duel). In recency mode a prefetch's
 *     victim must still pass Algorithm 1's value test above. Cost: O(N) per shadow miss,
 *     2·L·J stamps and 2·N members. The setting evict=predicted-reuse adds a third
 *     shadow, evicting by predicted-reuse's per-expert reuse estimate (reuse_estimate.h),
 *     and the real cache's recency side evicts by that estimate while its shadow missed
 *     less than recency's (docs/policies.md#moe-infinity; off by default); evict=
 *     request-reuse the same with the request-level estimate, its prior the matched
 *     rEAM's rate of each expert (matched_rate).
 * No constant was fitted: DUEL_WINDOW is fmoe's, the feedback's constants are the
 * executor's. (Checked, not tuned: 64 keeps every trace of docs/results.md within 1.02 x LRU as 256
 * does; 1024, more misses than Qwen1.5-MoE's replay has at 90% of the experts, lets the
 * cold start decide and gives 1.048 there.)
 *
 * The EAMC is stored cell-major ([L·J][C]) so that the per-expert dot-product update is a
 * contiguous pass over the entries, with each entry's layer sums cached for Algorithm 1.
 *
 * Cost: per gate O(n·K + routed·C + C + plan log plan); per miss O(N); at request end
 * O(nnz·C) to find the entry to replace; memory 2·C·(L·J + L) floats for the EAMC. With
 * the default C = 1000 and Mixtral's 32 x 8 a decode token costs ~100 K flops of matching
 * (MoE-Infinity measured 21 µs per query at 1 K entries, App. B.1).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/policy.h"
#include "reuse_estimate.h"

#define EPS 1e-6

/* The policy's own settings (fmoe/policy.h): --policy-opt eamc_capacity=C, or simulate's
 * --eamc-capacity C. Shared by moe-infinity and moe-infinity-fb. */
static const char *const mi_evict_rules[] = {"recency", "predicted-reuse", "request-reuse",
                                             NULL};
static const fmoe_policy_setting mi_settings[] = {
    {.name = "eamc_capacity", .type = FMOE_SETTING_INT, .def = 1000, .min = 1, .max = 10000000,
     .help = "rEAMs in each Expert Activation Matrix Collection, prefill and decode (§4.3; "
             "full: the most similar entry is replaced, App. B.1)",
     .option = "eamc-capacity"},
    {.name = "evict", .type = FMOE_SETTING_CHOICE, .def = 0, .choices = mi_evict_rules,
     .help = "moe-infinity-fb: what the recency side of its eviction duel evicts by: recency "
             "(LRU), or the expert predicted to be needed last: by predicted-reuse's "
             "per-expert reuse estimate (predicted-reuse), or by the expert's rate in the "
             "matched rEAM, refined by the request's own uses (request-reuse)"},
    {0},
};

/* moe-infinity-fb: the shadows' miss counts are halved when together they reach this many
 * (a horizon counted in misses, as DIP's PSEL counter moves only on misses; 256 as fmoe's) */
enum { DUEL_WINDOW = 256 };

/* moe-infinity-fb: a shadow directory of N experts, the cache one eviction rule would
 * hold under the same accesses: each member's last-access tick (0: absent) and the
 * members listed, so that a shadow eviction scans N entries, not L*J. */
typedef struct shadow {
    uint64_t *stamp;  /* [L*J] */
    int32_t *member;  /* [N] expert ids, unordered */
    int32_t n;
} shadow;

/* Stored transposed, cell-major: the dot products with the iEAM are updated one routed
 * expert at a time, i.e. one cell across all entries, which is then a contiguous axpy. */
typedef struct eamc {
    float *cells;   /* [L*J][C] stored rEAMs (counts): cell e of entry i at e * C + i */
    float *rowsum;  /* [C][L] sum over j of each entry's layer row (Algorithm 1's ntoken) */
    double *norm;   /* [C] Euclidean norms */
    double *dot;    /* [C] dot product with the current iEAM */
    int32_t size;
    uint64_t gen;   /* bumped by every insert */
} eamc;

typedef struct plan_item {
    double value;
    int32_t e;      /* expert id l*J+j */
} plan_item;

typedef struct mi_state {
    int32_t L, J, K, C, distance;
    size_t LJ;
    eamc coll[2];           /* [0] prefill, [1] decode */
    float *ieam;            /* [L*J] current iteration */
    double ieam_sq;         /* its squared norm */
    float *ream[2];         /* [2][L*J] this request's prefill / decode sums */
    int ream_used[2];
    int32_t use;            /* collection matched this iteration, -1 none */
    int32_t match;          /* entry of coll[use] matched at the last gate, -1 none */
    float *mrow;            /* [L*J] the matched entry, gathered row-major */
    int32_t mrow_use, mrow_match; /* what mrow holds (-1: nothing) */
    uint64_t mrow_gen;
    double *mscale;         /* [L] (1 - l/L) / ntoken(l) of the matched entry; 0: no data */
    int32_t *count;         /* [J] scratch: tokens per expert at this gate */
    uint8_t *pending;       /* [L*J] routed at the current layer, not yet accessed */
    uint8_t *in_plan;       /* [L*J] in the current prefetch plan */
    plan_item *plan;        /* [L*J] the current plan, best first */
    int32_t plan_len;
    int32_t *prev;          /* [L*J] the previous plan's experts */
    int32_t prev_len;
    int32_t cur_layer;
    /* moe-infinity-fb (improved = 1) */
    int improved;
    int32_t N;
    int held;               /* this gate's plan waits for the layer's misses (on_layer_done) */
    shadow sh_alg1, sh_lru; /* Algorithm 1's and recency's shadow caches */
    shadow sh_reuse;        /* evict=predicted-reuse: a third, by predicted reuse */
    uint64_t sh_tick, sh_gate_tick; /* ticks: the last access, the last one before the gate */
    double sh_miss_alg1, sh_miss_lru, sh_miss_reuse;
    int evict_reuse;        /* evict=predicted-reuse or request-reuse: a third side of the
                               duel ranks by `reuse` */
    uint64_t tick;          /* the cache's tick at the last access (the shadow's "now") */
    fmoe__reuse_estimate reuse;
} mi_state;

static void mi_free(void *state) {
    mi_state *m = state;
    if (!m) return;
    for (int c = 0; c < 2; c++) {
        free(m->coll[c].cells);
        free(m->coll[c].rowsum);
        free(m->coll[c].norm);
        free(m->coll[c].dot);
        free(m->ream[c]);
    }
    free(m->ieam);
    free(m->mrow);
    free(m->mscale);
    free(m->count);
    free(m->pending);
    free(m->in_plan);
    free(m->plan);
    free(m->prev);
    free(m->sh_alg1.stamp);
    free(m->sh_alg1.member);
    free(m->sh_lru.stamp);
    free(m->sh_lru.member);
    free(m->sh_reuse.stamp);
    free(m->sh_reuse.member);
    fmoe__reuse_estimate_free(&m->reuse);
    free(m);
}

/* evict=request-reuse's prediction (reuse_estimate.h): expert e's rate in the current
 * request as the matched rEAM has it, its tokens per token of the request: K · M[l][j] /
 * ntoken(l), ntoken(l) = sum_j M[l][j] (each token adds K); -1 without a match. */
static double matched_rate(const void *ctx, int32_t e) {
    const mi_state *m = ctx;
    const int32_t l = e / m->J;
    if (m->match < 0 || m->mscale[l] <= 0) return -1.0;
    const double ntoken = (1.0 - (double)l / (double)m->L) / m->mscale[l];
    return fmin(1.0, (double)m->K * (double)m->mrow[e] / ntoken);
}

static int mi_init_variant(void **state, const fmoe_policy_config *cfg, int improved) {
    *state = NULL;
    const int32_t capacity = (int32_t)fmoe_policy_setting_int(cfg, mi_settings, "eamc_capacity");
    mi_state *m = calloc(1, sizeof *m);
    if (!m) return fmoe_error_set(FMOE_ENOMEM, "moe-infinity state");
    m->L = cfg->num_layers;
    m->J = cfg->num_experts;
    m->K = cfg->top_k;
    m->C = capacity;
    m->distance = cfg->prefetch_distance;
    m->LJ = (size_t)m->L * (size_t)m->J;
    m->use = m->match = -1;
    m->mrow_use = m->mrow_match = -1;
    int ok = 1;
    for (int c = 0; c < 2; c++) {
        m->coll[c].cells = calloc((size_t)m->C * m->LJ, sizeof(float));
        m->coll[c].rowsum = calloc((size_t)m->C * (size_t)m->L, sizeof(float));
        m->coll[c].norm = calloc((size_t)m->C, sizeof(double));
        m->coll[c].dot = calloc((size_t)m->C, sizeof(double));
        m->ream[c] = calloc(m->LJ, sizeof(float));
        ok &= m->coll[c].cells && m->coll[c].rowsum && m->coll[c].norm && m->coll[c].dot &&
              m->ream[c];
    }
    m->ieam = calloc(m->LJ, sizeof(float));
    m->mrow = calloc(m->LJ, sizeof(float));
    m->mscale = calloc((size_t)m->L, sizeof(double));
    m->count = calloc((size_t)m->J, sizeof *m->count);
    m->pending = calloc(m->LJ, 1);
    m->in_plan = calloc(m->LJ, 1);
    m->plan = calloc(m->LJ, sizeof *m->plan);
    m->prev = calloc(m->LJ, sizeof *m->prev);
    m->improved = improved;
    m->N = cfg->capacity;
    if (improved) {
        shadow *sh[2] = {&m->sh_alg1, &m->sh_lru};
        for (int i = 0; i < 2; i++) {
            sh[i]->stamp = calloc(m->LJ, sizeof *sh[i]->stamp);
            sh[i]->member = calloc((size_t)(m->N > 0 ? m->N : 1), sizeof *sh[i]->member);
            ok &= sh[i]->stamp && sh[i]->member;
        }
    }
    /* predicted-reuse's defaults (reuse_half_life 4, reuse_prior 2, reuse_overdue 2,
     * request_weight 4) */
    const int32_t evict = improved ? fmoe_policy_setting_choice(cfg, mi_settings, "evict") : 0;
    m->evict_reuse = evict >= 1;
    if (m->evict_reuse) {
        if (fmoe__reuse_estimate_init(&m->reuse, m->L, m->J, 4, 2, 2) < 0 ||
            (evict == 2 && fmoe__reuse_estimate_use_request(&m->reuse, m->L, 4, 0) < 0))
            ok = 0;
        if (evict == 2) {
            m->reuse.predict = matched_rate;
            m->reuse.predict_ctx = m;
        }
        m->sh_reuse.stamp = calloc(m->LJ, sizeof *m->sh_reuse.stamp);
        m->sh_reuse.member = calloc((size_t)(m->N > 0 ? m->N : 1), sizeof *m->sh_reuse.member);
        ok &= m->sh_reuse.stamp && m->sh_reuse.member;
    }
    if (!ok || !m->ieam || !m->mrow || !m->mscale || !m->count || !m->pending || !m->in_plan ||
        !m->plan || !m->prev) {
        mi_free(m);
        return fmoe_error_set(FMOE_ENOMEM, "moe-infinity: EAMC of %d entries of %d x %d",
                              capacity, cfg->num_layers, cfg->num_experts);
    }
    *state = m;
    return 0;
}

static int mi_init(void **state, const fmoe_policy_config *cfg) {
    return mi_init_variant(state, cfg, 0);
}

static int mi_fb_init(void **state, const fmoe_policy_config *cfg) {
    return mi_init_variant(state, cfg, 1);
}

static double dot_sq(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

/* Appends an rEAM to a collection, or replaces the most similar entry (App. B.1). The
 * similarities use c->dot as scratch (recomputed at every iteration start anyway). */
static void eamc_insert(mi_state *m, eamc *c, const float *ream) {
    const size_t C = (size_t)m->C;
    const double n = sqrt(dot_sq(ream, ream, m->LJ));
    if (n <= 0) return;
    size_t at = (size_t)c->size;
    if (c->size == m->C) {
        for (size_t i = 0; i < C; i++) c->dot[i] = 0;
        for (size_t e = 0; e < m->LJ; e++) {
            if (ream[e] == 0) continue;
            const float *cell = c->cells + e * C;
            for (size_t i = 0; i < C; i++) c->dot[i] += (double)ream[e] * cell[i];
        }
        double best = -1;
        at = 0;
        for (size_t i = 0; i < C; i++) {
            const double cs = c->dot[i] / (n * c->norm[i]);
            if (cs > best) {
                best = cs;
                at = i;
            }
        }
    } else {
        c->size++;
    }
    for (size_t e = 0; e < m->LJ; e++) c->cells[e * C + at] = ream[e];
    for (int32_t l = 0; l < m->L; l++) {
        double sum = 0;
        for (int32_t j = 0; j < m->J; j++) sum += ream[(size_t)l * m->J + j];
        c->rowsum[at * (size_t)m->L + l] = (float)sum;
    }
    c->norm[at] = n;
    c->gen++;
}

static void mi_on_request_start(void *state, const fmoe_policy_env *env,
                                const fmoe_request_event *ev) {
    (void)env;
    (void)ev;
    mi_state *m = state;
    for (int c = 0; c < 2; c++) {
        memset(m->ream[c], 0, m->LJ * sizeof(float));
        m->ream_used[c] = 0;
    }
    if (m->reuse.req_used) fmoe__reuse_estimate_request_start(&m->reuse);
}

static void mi_on_request_end(void *state, const fmoe_policy_env *env,
                              const fmoe_request_event *ev) {
    (void)env;
    (void)ev;
    mi_state *m = state;
    for (int c = 0; c < 2; c++)
        if (m->ream_used[c]) eamc_insert(m, &m->coll[c], m->ream[c]);
}

static void mi_on_iteration_start(void *state, const fmoe_policy_env *env,
                                  const fmoe_iteration_event *ev) {
    mi_state *m = state;
    const int ph = ev->phase ? 1 : 0;
    if (m->reuse.req_used) fmoe__reuse_estimate_iteration_start(&m->reuse, env->cache->tick);
    memset(m->ieam, 0, m->LJ * sizeof(float));
    m->ieam_sq = 0;
    m->use = m->coll[ph].size > 0 ? ph : (m->coll[1 - ph].size > 0 ? 1 - ph : -1);
    if (m->use >= 0) memset(m->coll[m->use].dot, 0, (size_t)m->coll[m->use].size * sizeof(double));
    m->match = -1;
    m->held = 0;
    m->ream_used[ph] = 1;
}

/* p of Algorithm 1 for expert id e under the current match; eps = 0 gives the ranking
 * value used to compare a prefetch with its victim. */
static double priority(const mi_state *m, int32_t e, double eps) {
    const int32_t l = e / m->J;
    const double loc = 1.0 - (double)l / (double)m->L;
    if (m->match < 0 || m->mscale[l] <= 0) return loc / (double)m->J;
    return ((double)m->mrow[e] + eps) * m->mscale[l];
}

static int cmp_plan(const void *a, const void *b) {
    const plan_item *x = a, *y = b;
    if (x->value != y->value) return x->value > y->value ? -1 : 1;
    return (x->e > y->e) - (x->e < y->e); /* nearer layer, then lower index */
}

/* Issues the current plan, best first. Within a layer the plan is in decreasing p and a
 * refused prefetch leaves the cache as it was (an accepted one only raises the lowest p
 * left), so after one refusal the layer's later items would be refused too: skip them. */
static void issue_plan(mi_state *m, const fmoe_policy_env *env) {
    const int32_t J = m->J;
    int32_t refused_layer = -1;
    for (int32_t i = 0; i < m->plan_len; i++) {
        const int32_t e = m->plan[i].e;
        if (e / J == refused_layer && m->distance == 1) break;
        if (e / J == refused_layer) continue;
        if (env->sink->prefetch(env->sink->ctx, e / J, e % J, m->plan[i].value,
                                priority(m, e, 0)) == 1)
            refused_layer = e / J;
    }
}

/* moe-infinity-fb: one access of expert e to a shadow cache; a miss inserts it, evicting
 * by Algorithm 1 (lowest p under the current match; experts this gate already touched
 * kept while others remain, as the real cache keeps the layer's pending experts) or by
 * recency. Ties go to the older stamp (stamps are unique). @return 1 on a miss. */
/* rule: 0 recency, 1 Algorithm 1, 2 predicted reuse (evict=predicted-reuse) */
static int shadow_access(mi_state *m, shadow *d, int rule, int32_t e) {
    const int miss = d->stamp[e] == 0;
    if (miss && d->n == m->N) {
        int32_t vi = -1;
        int vi_old = 0;
        double vk = 0;
        for (int32_t i = 0; i < d->n; i++) {
            const int32_t x = d->member[i];
            const int old = d->stamp[x] <= m->sh_gate_tick; /* not touched at this gate */
            const double k = rule == 1 ? priority(m, x, EPS)
                             : rule == 2 ? -fmoe__reuse_estimate_next(&m->reuse, x, m->tick)
                                         : (double)d->stamp[x];
            if (vi < 0 || old > vi_old ||
                (old == vi_old && (k < vk || (k == vk && d->stamp[x] < d->stamp[d->member[vi]])))) {
                vi = i;
                vi_old = old;
                vk = k;
            }
        }
        d->stamp[d->member[vi]] = 0;
        d->member[vi] = d->member[--d->n];
    }
    if (miss) d->member[d->n++] = e;
    d->stamp[e] = m->sh_tick;
    return miss;
}

/* moe-infinity-fb: the gate's accesses (its distinct experts, in order) into both shadows
 * (set dueling, Qureshi et al., ISCA 2007). */
static void duel_observe(mi_state *m, const fmoe_gate_event *ev) {
    m->sh_gate_tick = m->sh_tick;
    for (int32_t q = 0; q < ev->num_distinct; q++) {
        const int32_t e = ev->layer * m->J + ev->distinct[q];
        m->sh_tick++;
        m->sh_miss_alg1 += shadow_access(m, &m->sh_alg1, 1, e);
        m->sh_miss_lru += shadow_access(m, &m->sh_lru, 0, e);
        if (m->evict_reuse) m->sh_miss_reuse += shadow_access(m, &m->sh_reuse, 2, e);
        if (m->sh_miss_alg1 + m->sh_miss_lru + m->sh_miss_reuse >= DUEL_WINDOW) {
            m->sh_miss_alg1 /= 2;
            m->sh_miss_lru /= 2;
            m->sh_miss_reuse /= 2;
        }
    }
}

static void mi_on_gate(void *state, const fmoe_policy_env *env, const fmoe_gate_event *ev) {
    mi_state *m = state;
    const int32_t l = ev->layer, J = m->J, ph = ev->phase ? 1 : 0;
    m->cur_layer = l;
    /* iEAM and rEAM: each token adds its K choices. */
    for (int32_t j = 0; j < J; j++) m->count[j] = 0;
    for (int32_t t = 0; t < ev->num_tokens; t++)
        for (int32_t k = 0; k < m->K; k++)
            m->count[ev->chosen[(size_t)t * (size_t)ev->chosen_stride + (size_t)k]]++;
    float *row = m->ieam + (size_t)l * J;
    float *rrow = m->ream[ph] + (size_t)l * J;
    for (int32_t q = 0; q < ev->num_distinct; q++) {
        const int32_t j = ev->distinct[q];
        const double c = m->count[j];
        m->ieam_sq += (row[j] + c) * (row[j] + c) - (double)row[j] * row[j];
        row[j] += (float)c;
        rrow[j] += (float)c;
        m->pending[(size_t)l * J + j] = 1;
        if (m->use >= 0) {
            eamc *co = &m->coll[m->use];
            const float *cell = co->cells + ((size_t)l * J + j) * m->C;
            for (int32_t i = 0; i < co->size; i++) co->dot[i] += c * (double)cell[i];
        }
    }
    /* Match: argmax of cosine similarity; |iEAM| is common to all entries. */
    m->match = -1;
    if (m->use >= 0) {
        const eamc *co = &m->coll[m->use];
        double best = 0;
        for (int32_t i = 0; i < co->size; i++) {
            const double cs = co->dot[i] / co->norm[i];
            if (cs > best) {
                best = cs;
                m->match = i;
            }
        }
    }
    /* Gather the match once: Algorithm 1 and the plan read it many times per gate. */
    if (m->match >= 0 && (m->match != m->mrow_match || m->use != m->mrow_use ||
                          m->coll[m->use].gen != m->mrow_gen)) {
        const eamc *co = &m->coll[m->use];
        m->mrow_match = m->match;
        m->mrow_use = m->use;
        m->mrow_gen = co->gen;
        for (size_t e = 0; e < m->LJ; e++) m->mrow[e] = co->cells[e * m->C + m->match];
        for (int32_t i = 0; i < m->L; i++) {
            const double nt = co->rowsum[(size_t)m->match * m->L + i];
            m->mscale[i] = nt > 0 ? (1.0 - (double)i / (double)m->L) / nt : 0;
        }
    }
    /* Plan: pEAM of the next d layers, best first. */
    for (int32_t i = 0; i < m->plan_len; i++) {
        m->in_plan[m->plan[i].e] = 0;
        m->prev[i] = m->plan[i].e;
    }
    m->prev_len = m->plan_len;
    m->plan_len = 0;
    if (m->match >= 0) {
        const eamc *co = &m->coll[m->use];
        for (int32_t i = l + 1; i <= l + m->distance && i < m->L; i++) {
            const double sum = co->rowsum[(size_t)m->match * m->L + i];
            if (sum <= 0) continue;
            const double w = 1.0 - (double)(i - l) / (double)m->L;
            for (int32_t j = 0; j < J; j++) {
                const float v = m->mrow[(size_t)i * J + j];
                if (v > 0) {
                    m->plan[m->plan_len++] = (plan_item){w * (double)v / sum, i * J + j};
                    m->in_plan[i * J + j] = 1;
                }
            }
        }
        qsort(m->plan, (size_t)m->plan_len, sizeof *m->plan, cmp_plan);
    }
    for (int32_t i = 0; i < m->prev_len; i++)
        if (!m->in_plan[m->prev[i]])
            env->sink->cancel(env->sink->ctx, m->prev[i] / J, m->prev[i] % J);
    if (m->improved) {
        duel_observe(m, ev);
        /* demand first: a routed expert neither resident nor on its way is loaded before
         * this gate's plan takes the link (issued at on_layer_done) */
        m->held = 0;
        for (int32_t q = 0; q < ev->num_distinct && !m->held; q++)
            m->held = fmoe_cache_lookup(env->cache, l * J + ev->distinct[q]) < 0;
        if (m->held) return;
    }
    issue_plan(m, env);
}

static void mi_on_access(void *state, const fmoe_policy_env *env, const fmoe_access_event *ev) {
    mi_state *m = state;
    m->pending[(size_t)ev->layer * m->J + ev->expert] = 0;
    if (m->evict_reuse) {
        m->tick = env->cache->tick;
        fmoe__reuse_estimate_observe(&m->reuse, ev->layer, ev->layer * m->J + ev->expert,
                                     m->tick);
    }
}

static void mi_on_layer_done(void *state, const fmoe_policy_env *env, int32_t layer) {
    mi_state *m = state;
    memset(m->pending + (size_t)layer * m->J, 0, (size_t)m->J);
    if (m->held) { /* the layer's misses are loaded: the gate's plan now */
        m->held = 0;
        issue_plan(m, env);
    }
}

/* A prefetch's value is its own Algorithm 1 priority (the sink hands it back).
 * moe-infinity-fb evicts by recency instead while recency's shadow cache has missed less
 * than Algorithm 1's lately; a prefetch's victim must then still pass Algorithm 1's value
 * test (recency alone would let a low-ranked prediction push out a likely expert). */
static int32_t mi_choose_victim(void *state, const fmoe_policy_env *env,
                                const fmoe_victim_request *req) {
    mi_state *m = state;
    const int prefetching = req->kind == FMOE_LOAD_PREFETCH;
    const fmoe_cache_view *v = env->cache;
    const int by_recency = m->improved && (m->sh_miss_lru < m->sh_miss_alg1 ||
                                           (m->evict_reuse && m->sh_miss_reuse < m->sh_miss_alg1));
    /* evict=predicted-reuse: the recency side by predicted reuse while its shadow missed
     * less than recency's (ties: recency) */
    const int by_reuse = by_recency && m->evict_reuse && m->sh_miss_reuse < m->sh_miss_lru;
    for (int pass = 0; pass < 2; pass++) {
        int32_t best = -1;
        double best_p = 0;
        uint64_t best_tick = UINT64_MAX;
        for (int32_t s = 0; s < v->capacity; s++) {
            if (!fmoe_cache_evictable(v, s)) continue;
            const int32_t e = v->slot_expert[s];
            if (pass == 0 && (m->pending[e] || (prefetching && m->in_plan[e]))) continue;
            /* recency: all equal, the least recently accessed goes; predicted-reuse: the
             * latest predicted next use goes (its ties too to the least recent) */
            const double p = !by_recency ? priority(m, e, EPS)
                             : by_reuse  ? -fmoe__reuse_estimate_next(&m->reuse, e, v->tick)
                                         : 0;
            const uint64_t t = v->slot_last_access[s];
            if (best < 0 || p < best_p || (p == best_p && t < best_tick)) {
                best = s;
                best_p = p;
                best_tick = t;
            }
        }
        if (prefetching) {
            if (best < 0) return -1;
            const double pv = priority(m, v->slot_expert[best], 0);
            return pv <= req->value * (1 + 1e-9) ? best : -1;
        }
        if (best >= 0) return best;
    }
    return -1;
}

const fmoe_policy_ops fmoe_policy_moe_infinity = {
    .name = "moe-infinity",
    .summary = "MoE-Infinity (paper): EAM matching, proximity prefetch, Algorithm 1",
    .flags = FMOE_POLICY_PREFETCHES,
    .init = mi_init,
    .free = mi_free,
    .on_request_start = mi_on_request_start,
    .on_iteration_start = mi_on_iteration_start,
    .on_gate = mi_on_gate,
    .on_access = mi_on_access,
    .on_layer_done = mi_on_layer_done,
    .choose_victim = mi_choose_victim,
    .on_request_end = mi_on_request_end,
    .default_distance = 1,
    .settings = mi_settings,
};

/* MoE-Infinity with fmoe's adaptive mechanisms, so that its prefetching never loses to LRU:
 * the same EAM matching, plan and Algorithm 1, plus (1) feedback-directed prefetch admission
 * and early preemption in the executor (FMOE_POLICY_FEEDBACK: lib/prefetch_feedback.h), (2)
 * demand first: a gate with a miss issues its plan after the layer's misses are loaded, and
 * (3) Algorithm 1 or recency for eviction, whichever a shadow cache of each missed less
 * lately. */
const fmoe_policy_ops fmoe_policy_moe_infinity_fb = {
    .name = "moe-infinity-fb",
    .summary = "MoE-Infinity + feedback-directed prefetch, demand first, "
               "Algorithm 1 / recency dueling",
    .flags = FMOE_POLICY_PREFETCHES | FMOE_POLICY_FEEDBACK,
    .init = mi_fb_init,
    .free = mi_free,
    .on_request_start = mi_on_request_start,
    .on_iteration_start = mi_on_iteration_start,
    .on_gate = mi_on_gate,
    .on_access = mi_on_access,
    .on_layer_done = mi_on_layer_done,
    .choose_victim = mi_choose_victim,
    .on_request_end = mi_on_request_end,
    .default_distance = 1,
    .settings = mi_settings,
};
