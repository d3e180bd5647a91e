/*
 * predicted_reuse.c - eviction by predicted next use, guarded by recency; no prefetch
 * (docs/policies.md#predicted-reuse).
 *
 * Belady's rule (belady.c) evicts the resident expert whose next use is furthest away and
 * closes most of the gap between LRU and the optimum on real routing; prefetching closes
 * little of it. This policy applies Belady's rule to a *prediction* of each expert's next
 * use, made when the expert is accessed and kept per expert:
 *
 *   estimate=perfect  the true next use, read from the trace's future as belady.c does
 *                     (simulate only): the rule is then Belady's, hit for hit (a test).
 *   estimate=random   a uniformly random time in (now, now + 2 g], g the layer's mean
 *                     inter-access gap: a prediction that knows nothing (the test that
 *                     bounds what a useless predictor costs against LRU).
 *   estimate=reuse    an online estimate from per-expert reuse statistics: next use =
 *                     last access + an exponentially weighted mean of the expert's own
 *                     inter-access gaps (in cache ticks), shrunk towards the layer's mean
 *                     gap by its confidence c = n / (n + reuse_prior), n the gaps seen
 *                     (an expert reused often is predicted back soon: MoE-Infinity §4.2's
 *                     observation that experts are reused with a skewed frequency, here
 *                     per expert rather than per request). An expert with no history
 *                     gets the layer's mean gap, so among such experts the order is LRU's.
 *                     An expert idle for longer than its predicted gap is overdue: its
 *                     next use is then put no sooner than reuse_overdue (default 2) times
 *                     its idle time after its last use, so a stale prediction decays into
 *                     recency (when every candidate is overdue, the order is LRU's). Without
 *                     it (reuse_overdue=0) an expert hot long ago keeps its slot for good:
 *                     unguarded, that lost 31% of LRU's hits on synthetic A (a tuning trace
 *                     of docs/results.md).
 *   estimate=request  the request-level signal of MoE-Infinity §4.2 (a request reuses a few
 *                     experts far more than the model does overall): next use = last access
 *                     + (mean accesses per iteration) / r, r the expert's share of this
 *                     request's iterations, shrunk towards its share of all iterations by
 *                     request_weight iterations; the same overdue rule (reuse_estimate.h,
 *                     where a policy can also plug in its own predicted rate).
 *   estimate=rate     the same rate read as memoryless (the independent reference model:
 *                     each iteration uses the expert with probability r, whatever came
 *                     before): next use = now + (mean accesses per iteration) / r, so the
 *                     lowest rate goes first, ties to the least recently used. Belady's rule
 *                     on it is the A0 policy (Aho, Denning and Ullman, JACM 1971), optimal
 *                     under that model; no overdue rule. One thing is known, not
 *                     predicted: the experts the current layer's gate chose and the layer
 *                     has not reached yet are needed within the layer, so they go last,
 *                     the one latest in the layer's order first (Belady's rule, exact on
 *                     them). It has no parameter of its own
 *                     (request_weight as above). On the one-layer OLMoE trace it closes
 *                     more of the gap than estimate=request, whose recency term
 *                     (overdue) costs it there (docs/results.md, "Where the rest of the gap
 *                     is").
 *
 * Ties in predicted next use go to the least recently accessed, then the lowest slot, as in
 * belady.c.
 *
 * The guard bounds what a wrong prediction costs. guard=lru (the default) keeps an LRU cache
 * of the same capacity in the shadow, fed the same accesses, and evicts the prediction's
 * victim only while this cache has missed at most (1 + guard_margin) times as often as the
 * shadow LRU; otherwise LRU's victim. So the predictions may cost at most guard_margin of
 * LRU's misses (default 1%) plus what following LRU from other contents costs (at most
 * about N misses; a test holds random predictions to that). Belady's rule never misses
 * more than LRU over any prefix of the accesses (MIN is optimal on every prefix), so a
 * perfect prediction is never overridden and estimate=perfect stays Belady with the guard
 * on. This is in the spirit of learning-augmented caching ("follow the predictor, fall back
 * to a robust rule when it falls behind": Lykouris and Vassilvitskii, "Competitive Caching
 * with Machine Learned Advice", ICML 2018), here simply with LRU as the robust rule and
 * cumulative miss counts; once behind it returns to the predictions only when LRU's own
 * misses make room again.
 *
 * guard=pairs judges the two rules by their disagreements instead: whenever the
 * prediction's victim p and LRU's victim q differ, the pair is remembered; the first of the
 * two to be accessed again settles it: p first means the prediction was wrong (it chose to
 * drop the expert needed sooner), q first that LRU would have been. The outcomes are kept
 * as two exponentially decayed counts (half-life guard_half_life outcomes), and the victim
 * is the prediction's while its wrong count is at most guard_tolerance times LRU's: the
 * regret-weighted choice between two experts of LeCaR (Vietri et al., "Driving Cache
 * Replacement with ML-based LeCaR", HotStorage 2018), deterministic and judged by pairs
 * instead of ghost lists. A perfect prediction is never wrong in a pair (p's next use is
 * the furthest), so it is never overridden either. Measured, it follows LRU more than the
 * hit counts warrant on the Qwen trace (docs/policies.md#predicted-reuse).
 *
 * guard=pairs' bookkeeping, without lists: LRU's victim is often the same expert q over many
 * misses while the predictions are followed, so q may be in many pending pairs and each p
 * in one.
 * p keeps its partner and the tick of pairing; q keeps a count of its pending pairs. An
 * access to q settles all of them at once (LRU wrong); an access to p settles its pair
 * (prediction wrong) only if q has not been accessed since the pairing, else it was
 * counted then.
 *
 * Pure and deterministic: predictions depend on cache ticks and the trace's positions only,
 * the random estimate is a hash of (seed, tick, expert), so the simulated and live runs
 * decide the same. Cost: O(1) per access (the shadow LRU is a linked list over expert ids),
 * one O(N) scan per miss; O(L·J) memory, and for estimate=perfect 4 bytes per access of the
 * trace (belady.c's next-use table). 2.6-3.5 M accesses/s per core in bench_simulate
 * (docs/results.md, "Eviction by predicted reuse").
 */
#include <math.h>
#include <stdlib.h>

#include "fmoe/error.h"
#include "fmoe/policy.h"
#include "lru_guard.h"
#include "next_use.h"
#include "reuse_estimate.h"

enum { EST_PERFECT = 0, EST_RANDOM = 1, EST_REUSE = 2, EST_REQUEST = 3, EST_RATE = 4 };
enum { GUARD_NONE = 0, GUARD_LRU = 1, GUARD_PAIRS = 2 };

static const char *const estimates[] = {"perfect", "random", "reuse", "request", "rate", NULL};
static const char *const guards[] = {"none", "lru", "pairs", NULL};
static const fmoe_policy_setting pr_settings[] = {
    {.name = "estimate", .type = FMOE_SETTING_CHOICE, .def = EST_REUSE, .choices = estimates,
     .help = "next-use estimate: perfect (the trace's future, simulate only), random, "
             "reuse (per-expert decayed inter-access gap), or request (the expert's use rate "
             "in the current request, MoE-Infinity 4.2's request-level activations), or rate "
             "(that rate alone, memoryless: the A0 policy, lowest rate first)"},
    {.name = "guard", .type = FMOE_SETTING_CHOICE, .def = GUARD_LRU, .choices = guards,
     .help = "lru: evict LRU's choice while this cache has missed more than (1 + guard_margin) "
             "times an LRU cache would have; pairs: while the predictions lose more victim "
             "pairs than LRU (LeCaR-style regret); none: always the prediction's"},
    {.name = "guard_margin", .type = FMOE_SETTING_DOUBLE, .def = 0.01, .min = 0, .max = 1e9,
     .help = "guard=lru: the share of LRU's misses the predictions may cost beyond them"},
    {.name = "guard_half_life", .type = FMOE_SETTING_DOUBLE, .def = 64, .min = 1, .max = 1e9,
     .help = "guard=pairs: half-life of the pair outcomes, in outcomes"},
    {.name = "guard_tolerance", .type = FMOE_SETTING_DOUBLE, .def = 1, .min = 1, .max = 1e9,
     .help = "guard=pairs: follow the predictions while they lose at most this many times as "
             "many pairs as LRU"},
    {.name = "reuse_half_life", .type = FMOE_SETTING_DOUBLE, .def = 4, .min = 0.5, .max = 1e9,
     .help = "estimate=reuse: half-life of an expert's mean inter-access gap, in gaps"},
    {.name = "reuse_prior", .type = FMOE_SETTING_DOUBLE, .def = 2, .min = 0, .max = 1e9,
     .help = "estimate=reuse: gaps an expert needs for half confidence in its own mean gap "
             "(the rest is the layer's mean)"},
    {.name = "reuse_overdue", .type = FMOE_SETTING_DOUBLE, .def = 2, .min = 0, .max = 1e9,
     .help = "estimate=reuse: an expert unused for t ticks is predicted back no sooner than "
             "this times t after its last use (0: never re-estimated)"},
    {.name = "request_weight", .type = FMOE_SETTING_DOUBLE, .def = 4, .min = 0, .max = 1e9,
     .help = "estimate=request, rate: iterations of the all-requests rate an expert's rate in the "
             "request starts from"},
    {.name = "seed", .type = FMOE_SETTING_INT, .def = 1, .min = 0, .max = 2147483647.0,
     .help = "estimate=random: the seed of the predictions"},
    {0},
};

typedef struct predicted_reuse_state {
    int32_t estimate, guard, J;
    double guard_decay;     /* factor on the outcome counts per outcome */
    double guard_tolerance;
    uint64_t seed;
    double *predicted;      /* [L*J] perfect, random: predicted next use, in ticks
                               (perfect: positions) */
    fmoe__reuse_estimate reuse; /* the reuse statistics (every estimate keeps them: random
                                   takes its scale, guard=pairs its ticks from them) */
    int32_t *partner;       /* [L*J] as the prediction's victim: LRU's victim of the pair, -1 */
    uint64_t *paired_at;    /* [L*J] tick at which that pair was made */
    uint32_t *pending_lru;  /* [L*J] pending pairs with the expert as LRU's victim */
    double wrong_predicted, wrong_lru; /* guard=pairs: decayed counts of lost pairs */
    fmoe__lru_guard lru;    /* guard=lru: the shadow LRU cache and both caches' misses */
    uint32_t *next;         /* perfect: [A] next position of the same expert (belady.c) */
    int64_t len;
    /* rate: the current layer's experts still to be accessed, known at its gate */
    uint64_t gate;          /* gates seen, from 1 */
    uint64_t *needed_at;    /* [L*J] the gate that chose e and e not accessed since; 0 none */
    int32_t *needed_order;  /* [L*J] e's place in that layer's access order */
} predicted_reuse_state;

static void pr_free(void *state) {
    predicted_reuse_state *s = state;
    if (!s) return;
    free(s->predicted);
    fmoe__reuse_estimate_free(&s->reuse);
    free(s->partner);
    free(s->paired_at);
    free(s->pending_lru);
    free(s->next);
    free(s->needed_at);
    free(s->needed_order);
    fmoe__lru_guard_free(&s->lru);
    free(s);
}

static int pr_init(void **state, const fmoe_policy_config *cfg) {
    *state = NULL;
    const int32_t estimate = fmoe_policy_setting_choice(cfg, pr_settings, "estimate");
    FMOE_RETURN_ERROR_IF(estimate == EST_PERFECT && !cfg->future, FMOE_EUNSUPPORTED,
                         "policy predicted-reuse: estimate=perfect reads the trace's future "
                         "(fmoe simulate only)");
    const size_t ne = (size_t)cfg->num_layers * (size_t)cfg->num_experts;
    predicted_reuse_state *s = calloc(1, sizeof *s);
    if (!s) return fmoe_error_set(FMOE_ENOMEM, "predicted-reuse state");
    s->estimate = estimate;
    s->guard = fmoe_policy_setting_choice(cfg, pr_settings, "guard");
    s->J = cfg->num_experts;
    s->guard_decay = exp2(-1.0 / fmoe_policy_setting_double(cfg, pr_settings,
                                                             "guard_half_life"));
    s->guard_tolerance = fmoe_policy_setting_double(cfg, pr_settings, "guard_tolerance");
    s->seed = (uint64_t)fmoe_policy_setting_int(cfg, pr_settings, "seed");
    s->predicted = calloc(ne, sizeof *s->predicted);
    s->partner = malloc(ne * sizeof *s->partner);
    s->paired_at = calloc(ne, sizeof *s->paired_at);
    s->pending_lru = calloc(ne, sizeof *s->pending_lru);
    s->needed_at = calloc(ne, sizeof *s->needed_at);
    s->needed_order = calloc(ne, sizeof *s->needed_order);
    int rc = fmoe__lru_guard_init(&s->lru, ne, cfg->capacity,
                                  fmoe_policy_setting_double(cfg, pr_settings, "guard_margin"));
    if (rc == 0)
        rc = fmoe__reuse_estimate_init(
            &s->reuse, cfg->num_layers, cfg->num_experts,
            fmoe_policy_setting_double(cfg, pr_settings, "reuse_half_life"),
            fmoe_policy_setting_double(cfg, pr_settings, "reuse_prior"),
            fmoe_policy_setting_double(cfg, pr_settings, "reuse_overdue"));
    if (rc == 0 && (estimate == EST_REQUEST || estimate == EST_RATE))
        rc = fmoe__reuse_estimate_use_request(
            &s->reuse, cfg->num_layers,
            fmoe_policy_setting_double(cfg, pr_settings, "request_weight"),
            estimate == EST_RATE);
    if (rc < 0) {
        pr_free(s);
        return rc;
    }
    if (!s->predicted || !s->partner || !s->paired_at || !s->pending_lru || !s->needed_at ||
        !s->needed_order) {
        pr_free(s);
        return fmoe_error_set(FMOE_ENOMEM, "predicted-reuse: tables for %zu experts", ne);
    }
    for (size_t e = 0; e < ne; e++) s->partner[e] = -1;
    if (estimate == EST_PERFECT) {
        const size_t a = (size_t)(cfg->future_len > 0 ? cfg->future_len : 0);
        uint32_t *first = malloc(ne * sizeof *first);
        s->next = malloc((a ? a : 1) * sizeof *s->next);
        s->len = cfg->future_len;
        if (!first || !s->next) {
            free(first);
            pr_free(s);
            return fmoe_error_set(FMOE_ENOMEM, "predicted-reuse: next-use table for %zu accesses",
                                  a);
        }
        rc = fmoe__policy_next_use(cfg, s->next, first);
        /* Before its first access an expert's next use is that access (belady.c). */
        for (size_t e = 0; rc == 0 && e < ne; e++)
            s->predicted[e] = first[e] == UINT32_MAX ? INFINITY : (double)first[e];
        free(first);
        if (rc < 0) {
            pr_free(s);
            fmoe_error_prefix("predicted-reuse");
            return rc;
        }
    }
    *state = s;
    return 0;
}

/* splitmix64's finaliser: a well-mixed 64-bit value of its input. */
static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Adds k outcomes, `predicted_wrong` of them against the predictions, to the decayed counts. */
static void guard_count(predicted_reuse_state *s, uint32_t k, int predicted_wrong) {
    const double d = k == 1 ? s->guard_decay : pow(s->guard_decay, (double)k);
    s->wrong_predicted *= d;
    s->wrong_lru *= d;
    if (predicted_wrong) s->wrong_predicted += (double)k;
    else s->wrong_lru += (double)k;
}

/* e is accessed at the current tick (its previous access at prev): the pairs it settles. */
static void pairs_settle(predicted_reuse_state *s, int32_t e) {
    if (s->pending_lru[e]) {
        guard_count(s, s->pending_lru[e], 0);
        s->pending_lru[e] = 0;
    }
    const int32_t q = s->partner[e];
    if (q < 0) return;
    s->partner[e] = -1;
    /* q accessed since the pairing: the pair was settled then */
    if (s->reuse.prev_tick[q] > s->paired_at[e]) return;
    guard_count(s, 1, 1);
    if (s->pending_lru[q]) s->pending_lru[q]--;
}

static void pr_on_access(void *state, const fmoe_policy_env *env, const fmoe_access_event *ev) {
    predicted_reuse_state *s = state;
    const int32_t e = ev->layer * s->J + ev->expert;
    if (s->guard == GUARD_LRU) fmoe__lru_guard_access(&s->lru, e, ev->result == FMOE_ACCESS_MISS);
    if (s->guard == GUARD_PAIRS) pairs_settle(s, e);
    const uint64_t now = env->cache->tick;
    s->needed_at[e] = 0;
    fmoe__reuse_estimate_observe(&s->reuse, ev->layer, e, now);
    const double g = fmoe__reuse_estimate_layer_gap(&s->reuse, ev->layer);
    switch (s->estimate) {
    case EST_PERFECT:
        if (ev->position >= 0 && ev->position < s->len) {
            const uint32_t nx = s->next[ev->position];
            s->predicted[e] = nx == UINT32_MAX ? INFINITY : (double)nx;
        }
        break;
    case EST_RANDOM: {
        const uint64_t h = mix64(s->seed ^ mix64(now ^ ((uint64_t)e << 40)));
        const double u = (double)((h >> 11) + 1) * 0x1.0p-53; /* (0, 1] */
        s->predicted[e] = (double)now + 2.0 * g * u;
        break;
    }
    default: /* read at the victim choice: it depends on the time since */
        break;
    }
}

static int32_t pr_choose_victim(void *state, const fmoe_policy_env *env,
                                const fmoe_victim_request *req) {
    (void)req;
    predicted_reuse_state *s = state;
    const fmoe_cache_view *v = env->cache;
    int32_t p = -1, q = -1;
    double p_next = 0;
    uint64_t p_tick = UINT64_MAX, q_tick = UINT64_MAX;
    for (int32_t slot = 0; slot < v->capacity; slot++) {
        if (!fmoe_cache_evictable(v, slot)) continue;
        const int32_t e = v->slot_expert[slot];
        const uint64_t t = v->slot_last_access[slot];
        double nx;
        if (s->estimate == EST_RATE) {
            /* memoryless: the next use now + per-iteration / rate orders as -rate, here as
             * minus the rate's numerator (>= -(iterations + w)); needed by the current
             * layer: before any of those, the later in the layer's order the later */
            nx = s->needed_at[e] == s->gate && s->gate
                     ? -1e300 / (2.0 + (double)s->needed_order[e])
                     : -fmoe__reuse_estimate_rate_score(&s->reuse, e);
        } else {
            nx = s->estimate >= EST_REUSE ? fmoe__reuse_estimate_next(&s->reuse, e, v->tick)
                                          : s->predicted[e];
        }
        if (p < 0 || nx > p_next || (nx == p_next && t < p_tick)) {
            p_next = nx;
            p_tick = t;
            p = slot;
        }
        if (t < q_tick) {
            q_tick = t;
            q = slot;
        }
    }
    if (p < 0 || p == q || s->guard == GUARD_NONE) return p;
    if (s->guard == GUARD_LRU)
        return fmoe__lru_guard_trusts(&s->lru) ? p : q;
    const int32_t ep = v->slot_expert[p], eq = v->slot_expert[q];
    if (s->partner[ep] < 0 && s->pending_lru[eq] < UINT32_MAX) {
        s->partner[ep] = eq;
        s->paired_at[ep] = v->tick;
        s->pending_lru[eq]++;
    }
    return s->wrong_predicted <= s->guard_tolerance * s->wrong_lru ? p : q;
}

static void pr_on_gate(void *state, const fmoe_policy_env *env, const fmoe_gate_event *ev) {
    (void)env;
    predicted_reuse_state *s = state;
    if (s->estimate != EST_RATE) return;
    s->gate++;
    for (int32_t i = 0; i < ev->num_distinct; i++) {
        const int32_t e = ev->layer * s->J + ev->distinct[i];
        s->needed_at[e] = s->gate;
        s->needed_order[e] = i;
    }
}

static void pr_on_request_start(void *state, const fmoe_policy_env *env,
                                const fmoe_request_event *ev) {
    (void)env;
    (void)ev;
    predicted_reuse_state *s = state;
    if (s->estimate >= EST_REQUEST) fmoe__reuse_estimate_request_start(&s->reuse);
}

static void pr_on_iteration_start(void *state, const fmoe_policy_env *env,
                                  const fmoe_iteration_event *ev) {
    (void)ev;
    predicted_reuse_state *s = state;
    if (s->estimate >= EST_REQUEST)
        fmoe__reuse_estimate_iteration_start(&s->reuse, env->cache->tick);
}

const fmoe_policy_ops fmoe_policy_predicted_reuse = {
    .name = "predicted-reuse",
    .summary = "evict the expert predicted to be needed last (Belady on predictions), "
               "guarded by LRU; no prefetch",
    .init = pr_init,
    .free = pr_free,
    .on_request_start = pr_on_request_start,
    .on_iteration_start = pr_on_iteration_start,
    .on_gate = pr_on_gate,
    .on_access = pr_on_access,
    .choose_victim = pr_choose_victim,
    .settings = pr_settings,
};
