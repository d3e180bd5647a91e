/*
 * oracle.c - perfect prefetch at distance d, simulate only (docs/design.md §6: "the bound
 * any predictor can reach").
 *
 * A predictor that looks d layers ahead can at best know exactly which experts the next d
 * layers will use. The oracle has that knowledge (and, for eviction, the whole future) and
 * turns it into a transfer schedule. No single rule is best on every machine, so it has
 * two schedules and the simulator reports the better one (ops->variants, by stall):
 *
 *   0 "MIN-timed": exactly the transfers of Belady's offline optimum (MIN, the fewest loads
 *     any policy can make; `belady`), each started as early as possible instead of on
 *     demand: once its layer is within d layers (from the current layer's gate, or the
 *     iteration's start for its first layers; windows cross iterations and requests),
 *     once MIN's victim for it has been accessed for the last time before it, and in
 *     MIN's order (a load that cannot start yet holds back the later ones). The cache then
 *     holds exactly MIN's contents at every access and every transfer starts no later than
 *     belady's demand load, so its stall is never above belady's. Best when the link is
 *     the bottleneck.
 *   1 "greedy": when layer l's gate is known, prefetch every expert of the next d layers,
 *     nearest first, evicting the expert used furthest in the future; a prefetch waits
 *     (retried at the next access, layer end or gate) when that victim is needed before
 *     the incoming expert, or when it would take a slot a miss of the current layer still
 *     needs; it never evicts an expert the current layer has yet to access. Best when the
 *     pipeline matters (few slots): MIN's victim is often the expert still computing,
 *     whose slot frees last.
 *
 * Both may compute a missed expert without caching it (the executor's bypass) when it is
 * needed again later than anything cached: with that option plain MIN is no longer
 * optimal (mixtral-offload, whose slotless layers stream uncached, beat it with one slot).
 *
 * Either alone lost to a baseline somewhere in the property test (greedy to belady on a
 * slow link at d = 2: it moves more bytes; MIN-timed to ondemand with N = K slots: it
 * serialises loads behind computes); the better of the two was not beaten there.
 * Knowledge of the future: cfg->future (expert ids) and cfg->future_layer_accesses (its
 * layer groups). d = 0 makes both variants belady.
 *
 * Cost: init O(A log N) (an indexed heap replays MIN) plus 4·A bytes (next uses) and
 * 12 bytes per MIN miss; per event O(1) amortised plus the prefetches issued; per miss
 * O(1) (MIN-timed) or O(N) (greedy). The simulator runs the trace twice.
 */
#include <stdlib.h>

#include "fmoe/error.h"
#include "fmoe/policy.h"
#include "next_use.h"

#define NEVER UINT32_MAX

#define BYPASS (UINT32_MAX - 1)

typedef struct min_load {
    uint32_t pos;       /* access position that MIN misses */
    uint32_t victim;    /* expert MIN evicts for it; NEVER when a free slot takes it;
                           BYPASS when it is computed without being cached */
    uint32_t ready;     /* first position after the victim's last access (0 if none) */
} min_load;

typedef struct oracle_state {
    const uint32_t *future;    /* [A] borrowed */
    const uint16_t *groups;    /* [G] borrowed: accesses per layer group */
    int64_t len, num_groups;
    int32_t num_experts, distance, variant;
    /* greedy: */
    uint32_t *next;            /* [A] next access to the same expert after p, NEVER */
    uint32_t *next_use;        /* [L*J] next access of each expert (exact) */
    int64_t covered_group;     /* groups < this have been prefetched */
    int64_t covered_pos;       /* next access to prefetch (inside covered_group) */
    int64_t group_end;         /* end of covered_group's accesses */
    int64_t target_group;      /* cover up to this group */
    int64_t cur_end;           /* end of the current layer's accesses */
    /* MIN-timed: */
    min_load *loads;           /* [M] MIN's misses, in order */
    int64_t num_loads;
    int64_t next_load;         /* first load not yet issued */
    int64_t cursor_group;      /* group containing loads[next_load].pos ... */
    int64_t cursor_end;        /* ... and where that group ends */
    int64_t window_group;      /* loads of groups <= this may start */
    int64_t cur_next;          /* next access position to be made */
} oracle_state;

static void oracle_free(void *state) {
    oracle_state *o = state;
    if (!o) return;
    free(o->loads);
    free(o->next);
    free(o->next_use);
    free(o);
}

/* ------------------------------------------------------------------ MIN at init */

/* Max-heap of cached experts by (next use desc, last use asc): the top is MIN's victim,
 * with belady's tie-break (least recently accessed among the never-again ones). */
typedef struct heap {
    uint32_t *e;       /* [N] experts */
    int32_t *at;       /* [L*J] heap index, -1 absent */
    const uint32_t *nx, *last; /* [L*J] keys */
    int32_t n;
} heap;

static int above(const heap *h, uint32_t a, uint32_t b) {
    if (h->nx[a] != h->nx[b]) return h->nx[a] > h->nx[b];
    return h->last[a] < h->last[b];
}
static void swap_at(heap *h, int32_t i, int32_t j) {
    uint32_t t = h->e[i];
    h->e[i] = h->e[j];
    h->e[j] = t;
    h->at[h->e[i]] = i;
    h->at[h->e[j]] = j;
}
static void sift(heap *h, int32_t i) {
    while (i > 0 && above(h, h->e[i], h->e[(i - 1) / 2])) {
        swap_at(h, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, b = i;
        if (l < h->n && above(h, h->e[l], h->e[b])) b = l;
        if (r < h->n && above(h, h->e[r], h->e[b])) b = r;
        if (b == i) return;
        swap_at(h, i, b);
        i = b;
    }
}

static int replay_min(oracle_state *o, const fmoe_policy_config *cfg) {
    const size_t ne = (size_t)cfg->num_layers * (size_t)cfg->num_experts;
    const size_t a = (size_t)(cfg->future_len > 0 ? cfg->future_len : 0);
    uint32_t *next = malloc((a ? a : 1) * sizeof *next);
    uint32_t *nx = malloc(ne * sizeof *nx), *last = malloc(ne * sizeof *last);
    heap h = {.e = malloc((size_t)cfg->capacity * sizeof(uint32_t)),
              .at = malloc(ne * sizeof(int32_t))};
    int64_t cap_loads = 1024;
    o->loads = malloc((size_t)cap_loads * sizeof *o->loads);
    int rc = 0;
    if (!next || !nx || !last || !h.e || !h.at || !o->loads) {
        rc = fmoe_error_set(FMOE_ENOMEM, "oracle: MIN replay of %zu accesses", a);
        goto done;
    }
    rc = fmoe__policy_next_use(cfg, next, nx);
    if (rc < 0) goto done;
    h.nx = nx;
    h.last = last;
    for (size_t e = 0; e < ne; e++) {
        h.at[e] = -1;
        last[e] = 0;
    }
    uint32_t *last_pos = last; /* last access position + 1 (0 = never), doubles as key */
    for (size_t p = 0; p < a; p++) {
        const uint32_t e = cfg->future[p];
        if (h.at[e] < 0) { /* MIN misses */
            min_load ld = {.pos = (uint32_t)p, .victim = NEVER, .ready = 0};
            if (h.n == cfg->capacity && next[p] > nx[h.e[0]]) {
                /* Needed later than anything cached: computing it uncached is cheaper. */
                ld.victim = BYPASS;
                if (o->num_loads == cap_loads) {
                    cap_loads *= 2;
                    min_load *q = realloc(o->loads, (size_t)cap_loads * sizeof *q);
                    if (!q) {
                        rc = fmoe_error_set(FMOE_ENOMEM, "oracle: MIN loads");
                        goto done;
                    }
                    o->loads = q;
                }
                o->loads[o->num_loads++] = ld;
                continue;
            }
            if (h.n == cfg->capacity) {
                const uint32_t v = h.e[0];
                ld.victim = v;
                ld.ready = last_pos[v];
                swap_at(&h, 0, h.n - 1);
                h.at[v] = -1;
                h.n--;
                if (h.n) sift(&h, 0);
            }
            if (o->num_loads == cap_loads) {
                cap_loads *= 2;
                min_load *q = realloc(o->loads, (size_t)cap_loads * sizeof *q);
                if (!q) {
                    rc = fmoe_error_set(FMOE_ENOMEM, "oracle: MIN loads");
                    goto done;
                }
                o->loads = q;
            }
            o->loads[o->num_loads++] = ld;
            h.e[h.n] = e;
            h.at[e] = h.n++;
        }
        nx[e] = next[p];
        last_pos[e] = (uint32_t)p + 1;
        sift(&h, h.at[e]);
    }
done:
    free(next);
    free(nx);
    free(last);
    free(h.e);
    free(h.at);
    return rc;
}

static int oracle_init(void **state, const fmoe_policy_config *cfg) {
    *state = NULL;
    FMOE_RETURN_ERROR_IF(!cfg->future_layer_accesses && cfg->future_len > 0, FMOE_EINVAL,
                         "oracle needs the layer groups of the access sequence");
    oracle_state *o = calloc(1, sizeof *o);
    if (!o) return fmoe_error_set(FMOE_ENOMEM, "oracle state");
    o->future = cfg->future;
    o->groups = cfg->future_layer_accesses;
    o->len = cfg->future_len;
    o->num_groups = cfg->future_groups;
    o->num_experts = cfg->num_experts;
    o->distance = cfg->prefetch_distance;
    o->variant = cfg->variant;
    o->window_group = -1;
    o->cursor_end = o->num_groups > 0 ? o->groups[0] : 0;
    o->target_group = -1;
    o->group_end = o->cursor_end;
    int rc;
    if (o->variant == 1) {
        const size_t ne = (size_t)cfg->num_layers * (size_t)cfg->num_experts;
        const size_t a = (size_t)(cfg->future_len > 0 ? cfg->future_len : 0);
        o->next = malloc((a ? a : 1) * sizeof *o->next);
        o->next_use = malloc(ne * sizeof *o->next_use);
        rc = !o->next || !o->next_use
                 ? fmoe_error_set(FMOE_ENOMEM, "oracle: next-use table for %zu accesses", a)
                 : fmoe__policy_next_use(cfg, o->next, o->next_use);
    } else {
        rc = replay_min(o, cfg);
    }
    if (rc < 0) {
        oracle_free(o);
        fmoe_error_prefix("oracle");
        return rc;
    }
    *state = o;
    return 0;
}

/* ------------------------------------------------------------------ events */

/* Issues MIN's loads, in order, while their layer is in the window and their victim is
 * done with; a load already made on demand (its position passed) is skipped. */
static void issue(oracle_state *o, const fmoe_policy_env *env) {
    const int32_t J = o->num_experts;
    while (o->next_load < o->num_loads) {
        const min_load *ld = &o->loads[o->next_load];
        if ((int64_t)ld->pos < o->cur_next) { /* demand-loaded already */
            o->next_load++;
            continue;
        }
        while ((int64_t)ld->pos >= o->cursor_end && o->cursor_group + 1 < o->num_groups)
            o->cursor_end += o->groups[++o->cursor_group];
        if (o->cursor_group > o->window_group) return;
        if (ld->victim == BYPASS) return; /* loaded on demand, uncached: a barrier */
        if ((int64_t)ld->ready > o->cur_next) return; /* victim still to be accessed */
        const uint32_t e = o->future[ld->pos];
        /* value: the index of MIN's load it is, handed back to min_choose_victim */
        const int rc = env->sink->prefetch(env->sink->ctx, (int32_t)(e / (uint32_t)J),
                                           (int32_t)(e % (uint32_t)J), -(double)ld->pos,
                                           (double)o->next_load);
        if (rc != 0) return;
        o->next_load++;
    }
}

/* ------------------------------------------------------------------ MIN-timed (variant 0) */

static void min_on_iteration_start(void *state, const fmoe_policy_env *env,
                                      const fmoe_iteration_event *ev) {
    oracle_state *o = state;
    if (ev->group < 0) return;
    o->cur_next = ev->position;
    if (o->distance < 1) return;
    o->window_group = ev->group + o->distance - 1;
    issue(o, env);
}

static void min_on_gate(void *state, const fmoe_policy_env *env, const fmoe_gate_event *ev) {
    oracle_state *o = state;
    if (ev->group < 0) return;
    o->cur_next = ev->position;
    if (o->distance < 1) return;
    o->window_group = ev->group + o->distance;
    issue(o, env);
}

static void min_on_access(void *state, const fmoe_policy_env *env,
                             const fmoe_access_event *ev) {
    oracle_state *o = state;
    if (ev->position < 0) return;
    o->cur_next = ev->position + 1;
    if (o->distance >= 1) issue(o, env);
}

/* MIN's victim for the load being made: a prefetch being issued, or the demand miss at
 * the current access. */
static int32_t min_choose_victim(void *state, const fmoe_policy_env *env,
                                 const fmoe_victim_request *req) {
    oracle_state *o = state;
    const fmoe_cache_view *v = env->cache;
    int64_t i = req->kind == FMOE_LOAD_PREFETCH ? (int64_t)req->value : -1;
    if (i < 0) { /* demand: the load of position cur_next */
        while (o->next_load < o->num_loads && (int64_t)o->loads[o->next_load].pos < o->cur_next)
            o->next_load++;
        i = o->next_load;
        if (i < o->num_loads && (int64_t)o->loads[i].pos == o->cur_next) o->next_load++;
        else i = -1;
    }
    if (i >= 0 && o->loads[i].victim == BYPASS) return -1;
    if (i >= 0 && o->loads[i].victim != NEVER) {
        const int32_t s = fmoe_cache_lookup(v, (int32_t)o->loads[i].victim);
        if (s >= 0 && fmoe_cache_evictable(v, s)) return s;
    }
    /* Not MIN's state (cannot happen when the oracle alone drives the cache): LRU. */
    return fmoe_policy_victim_lru(v);
}

/* ------------------------------------------------------------------ greedy (variant 1) */

/* Prefetches the accesses of groups [covered, target_group], nearest first; stops at the
 * first one the sink drops (retried at the next event). */
static void cover(oracle_state *o, const fmoe_policy_env *env) {
    const int32_t J = o->num_experts;
    const int64_t last = o->target_group < o->num_groups ? o->target_group : o->num_groups - 1;
    while (o->covered_group <= last) {
        while (o->covered_pos < o->group_end) {
            const uint32_t e = o->future[o->covered_pos];
            /* value: the position of its use, handed back to greedy_choose_victim */
            const int rc = env->sink->prefetch(env->sink->ctx, (int32_t)(e / (uint32_t)J),
                                               (int32_t)(e % (uint32_t)J),
                                               -(double)o->covered_pos, (double)o->covered_pos);
            if (rc != 0) return;
            o->covered_pos++;
        }
        o->covered_group++;
        if (o->covered_group < o->num_groups) o->group_end += o->groups[o->covered_group];
    }
}

/* Skips coverage to group g (first access at position p) when it is behind. */
static void skip_to(oracle_state *o, int64_t g, int64_t p) {
    if (o->covered_group >= g) return;
    o->covered_group = g;
    o->covered_pos = p;
    o->group_end = g < o->num_groups ? p + o->groups[g] : p;
}

static void greedy_on_iteration_start(void *state, const fmoe_policy_env *env,
                                      const fmoe_iteration_event *ev) {
    oracle_state *o = state;
    if (ev->group < 0) return;
    o->cur_next = o->cur_end = ev->position;
    if (o->distance < 1) return;
    skip_to(o, ev->group, ev->position);
    o->target_group = ev->group + o->distance - 1;
    cover(o, env);
}

static void greedy_on_gate(void *state, const fmoe_policy_env *env, const fmoe_gate_event *ev) {
    oracle_state *o = state;
    if (ev->group < 0) return;
    o->cur_next = ev->position;
    o->cur_end = ev->position + ev->num_distinct;
    if (o->distance < 1) return;
    skip_to(o, ev->group + 1, o->cur_end); /* this layer is demand-loaded from now on */
    o->target_group = ev->group + o->distance;
    cover(o, env);
}

static void greedy_on_access(void *state, const fmoe_policy_env *env,
                             const fmoe_access_event *ev) {
    oracle_state *o = state;
    if (ev->position < 0 || ev->position >= o->len) return;
    o->next_use[ev->layer * env->cache->num_experts + ev->expert] = o->next[ev->position];
    o->cur_next = ev->position + 1;
    if (o->distance >= 1) cover(o, env);
}

static void greedy_on_layer_done(void *state, const fmoe_policy_env *env, int32_t layer) {
    (void)layer;
    oracle_state *o = state;
    o->cur_next = o->cur_end;
    if (o->distance >= 1) cover(o, env);
}

/* An expert the current layer has yet to access. */
static int pending(const oracle_state *o, uint32_t nx) {
    return nx != NEVER && (int64_t)nx >= o->cur_next && (int64_t)nx < o->cur_end;
}

/* Belady's victim, skipping experts the current layer has yet to access; for a prefetch,
 * none when it is needed before the incoming expert or when the current layer's misses
 * need the remaining slots. */
static int32_t greedy_choose_victim(void *state, const fmoe_policy_env *env,
                                    const fmoe_victim_request *req) {
    const oracle_state *o = state;
    /* the next use of the expert being prefetched; NEVER on demand */
    const uint32_t incoming_use =
        req->kind == FMOE_LOAD_PREFETCH ? (uint32_t)req->value : NEVER;
    const fmoe_cache_view *v = env->cache;
    int32_t best = -1;
    uint32_t best_next = 0;
    uint64_t best_tick = UINT64_MAX;
    for (int pass = 0; pass < 2 && best < 0; pass++) {
        if (pass == 1 && incoming_use != NEVER) break; /* a demand miss must evict */
        for (int32_t s = 0; s < v->capacity; s++) {
            if (!fmoe_cache_evictable(v, s)) continue;
            const uint32_t nx = o->next_use[v->slot_expert[s]];
            if (pass == 0 && pending(o, nx)) continue;
            const uint64_t t = v->slot_last_access[s];
            if (best < 0 || nx > best_next || (nx == best_next && t < best_tick)) {
                best_next = nx;
                best_tick = t;
                best = s;
            }
        }
    }
    if (best < 0) return best;
    if (incoming_use == NEVER) /* demand: bypass when needed later than the victim */
        return o->cur_next < o->len && o->next[o->cur_next] > best_next ? -1 : best;
    if (best_next <= incoming_use) return -1;
    int32_t misses = 0, candidates = 0;
    for (int64_t p = o->cur_next; p < o->cur_end; p++)
        misses += fmoe_cache_lookup(v, (int32_t)o->future[p]) < 0;
    if (misses == 0) return best;
    for (int32_t s = 0; s < v->capacity && candidates <= misses; s++)
        candidates += fmoe_cache_evictable(v, s) && !pending(o, o->next_use[v->slot_expert[s]]);
    return candidates > misses ? best : -1;
}

/* ------------------------------------------------------------------ dispatch */

static void oracle_on_iteration_start(void *state, const fmoe_policy_env *env,
                                      const fmoe_iteration_event *ev) {
    if (((oracle_state *)state)->variant == 1) greedy_on_iteration_start(state, env, ev);
    else min_on_iteration_start(state, env, ev);
}
static void oracle_on_gate(void *state, const fmoe_policy_env *env, const fmoe_gate_event *ev) {
    if (((oracle_state *)state)->variant == 1) greedy_on_gate(state, env, ev);
    else min_on_gate(state, env, ev);
}
static void oracle_on_access(void *state, const fmoe_policy_env *env,
                             const fmoe_access_event *ev) {
    if (((oracle_state *)state)->variant == 1) greedy_on_access(state, env, ev);
    else min_on_access(state, env, ev);
}
static void oracle_on_layer_done(void *state, const fmoe_policy_env *env, int32_t layer) {
    if (((oracle_state *)state)->variant == 1) greedy_on_layer_done(state, env, layer);
}
static int32_t oracle_choose_victim(void *state, const fmoe_policy_env *env,
                                    const fmoe_victim_request *req) {
    if (((oracle_state *)state)->variant == 1) return greedy_choose_victim(state, env, req);
    return min_choose_victim(state, env, req);
}

const fmoe_policy_ops fmoe_policy_oracle = {
    .name = "oracle",
    .summary = "perfect knowledge of the next d layers: the bound (best of two "
               "schedules)",
    .flags = FMOE_POLICY_NEEDS_FUTURE | FMOE_POLICY_PREFETCHES,
    .init = oracle_init,
    .free = oracle_free,
    .on_iteration_start = oracle_on_iteration_start,
    .on_gate = oracle_on_gate,
    .on_access = oracle_on_access,
    .on_layer_done = oracle_on_layer_done,
    .choose_victim = oracle_choose_victim,
    .default_distance = 1,
    .variants = 2,
};
