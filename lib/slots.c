/*
 * slots.c - expert slots and their transfers (fmoe/slots.h): the protocol both executors
 * share, so that the simulator, the live executor and the test drivers make their
 * decisions with one copy of this logic, down to the per-layer sequence of events
 * (fmoe_slots_run_layer), into which each executor plugs only its time and its bytes.
 *
 * Per slot the module keeps what the cache does not: whether its expert came by a
 * prefetch and is unused (wasted-byte accounting), whether its transfer is queued or under
 * way (a LOADING slot), the policy's pin, and the queued transfer's priority, issue order,
 * eligibility time and pieces done. The prefetch queue is the set of QUEUED slots (at most
 * N), scanned for the best one; at most one prefetch transfer is under way at a time.
 *
 * Everything is allocated in fmoe_slots_init: nothing allocates on the executors' hot path.
 */
#include "fmoe/slots.h"

#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "prefetch_feedback.h"

enum {
    FLAG_PREFETCHED = 1, /* brought by a prefetch, not accessed since */
    FLAG_QUEUED = 2,     /* LOADING, its transfer not started */
    FLAG_STARTED = 4,    /* LOADING, its transfer under way */
    FLAG_POLICY_PIN = 8, /* pinned by the policy */
    FLAG_LANDED = 16,    /* LOADING, its transfer done, not yet applied */
};

struct fmoe_slots {
    fmoe_cache *cache;
    const fmoe_cache_view *view;
    fmoe_policy *policy;
    fmoe_policy_sink sink;
    fmoe_policy_env env;
    fmoe_slots_hooks hooks;
    int32_t L, J, N, chunks;
    int64_t expert_bytes;
    int64_t *layer_bytes;     /* [L] one expert of each layer (the accounting's bytes) */
    double delay_s;
    int64_t iteration;
    uint8_t *flags;           /* [N] FLAG_* */
    double *priority;         /* [N] queued transfer's priority */
    uint64_t *seq;            /* [N] its issue order */
    double *eligible;         /* [N] when it may start */
    int32_t *chunks_done;     /* [N] pieces landed */
    int32_t *queue;           /* [N] QUEUED slots, unordered */
    int32_t queue_len;
    int32_t started;          /* the prefetch transfer under way, -1 none */
    int32_t landed;           /* slots with FLAG_LANDED */
    uint64_t next_seq;
    uint8_t *host_next;       /* [L*J] compute the next miss on the host */
    int32_t *order;           /* [J] a layer's compute order when its executor keeps none */
    fmoe_slots_layer_stats *stats; /* [L] */
    int feedback;             /* admission and early preemption (prefetch_feedback.h) */
    prefetch_feedback fb;
    int error;
};

static void log_decision(fmoe_slots *q, fmoe_decision_kind kind, int32_t e, int32_t slot,
                         int32_t victim, int32_t result, double priority, double t) {
    if (!q->hooks.decision) return;
    const fmoe_decision d = {.kind = kind, .iteration = q->iteration, .layer = e / q->J,
                             .expert = e % q->J, .slot = slot, .victim = victim,
                             .result = result, .priority = priority, .time_s = t};
    q->hooks.decision(q->hooks.ctx, &d);
}

static void count_bytes(fmoe_slots *q, int32_t e) {
    q->stats[e / q->J].bytes_loaded += q->layer_bytes[e / q->J];
}

static void count_prefetch(fmoe_slots *q, int32_t e) {
    q->stats[e / q->J].prefetches++;
    count_bytes(q, e);
}

static void count_wasted(fmoe_slots *q, int32_t e) {
    q->stats[e / q->J].wasted_prefetch_bytes += q->layer_bytes[e / q->J];
}

static void queue_remove_slot(fmoe_slots *q, int32_t s) {
    for (int32_t i = 0; i < q->queue_len; i++)
        if (q->queue[i] == s) {
            q->queue[i] = q->queue[--q->queue_len];
            return;
        }
}

/* Empties slot s for a new expert, accounting for a prefetch that was never used. */
static void evict_slot(fmoe_slots *q, int32_t s) {
    if (q->flags[s] & FLAG_PREFETCHED) count_wasted(q, q->view->slot_expert[s]);
    q->flags[s] = 0;
    fmoe_cache_evict(q->cache, s);
}

/* A free slot, or the policy's victim (evicted; its expert in *victim), or -1 (nothing
 * evictable / the policy wants none evicted). Sets q->error when the policy breaks the
 * contract. */
static int32_t make_room(fmoe_slots *q, const fmoe_victim_request *req, int32_t *victim) {
    *victim = -1;
    int32_t s = fmoe_cache_free_slot(q->cache);
    if (s >= 0) return s;
    s = q->policy->ops->choose_victim(q->policy->state, &q->env, req);
    if (s < 0) return -1;
    if (s >= q->N || !fmoe_cache_evictable(q->view, s)) {
        q->error = fmoe_error_set(FMOE_EINTERNAL,
                                  "policy %s chose slot %d, which is not an evictable slot",
                                  q->policy->ops->name, s);
        return -1;
    }
    *victim = q->view->slot_expert[s];
    if (q->feedback) fmoe__prefetch_feedback_evicted(&q->fb, *victim);
    evict_slot(q, s);
    return s;
}

/* ------------------------------------------------------------------ the policy's sink */

static int32_t expert_id(const fmoe_slots *q, int32_t l, int32_t j) {
    if (l < 0 || l >= q->L || j < 0 || j >= q->J) return -1;
    return l * q->J + j;
}

static int sink_prefetch(void *ctx, int32_t l, int32_t j, double priority, double value) {
    fmoe_slots *q = ctx;
    const int32_t e = expert_id(q, l, j);
    if (e < 0)
        return q->error = fmoe_error_set(FMOE_EINTERNAL, "policy %s prefetched (%d, %d)",
                                         q->policy->ops->name, l, j);
    /* A prediction of a resident expert costs and saves nothing: only the others are
     * ranked and scored, so the accuracy is that of the predictions that would become
     * transfers (where LRU already hits most accesses, the resident ones are the easy,
     * right ones, and counting them made wrong prefetches look worth their link time). */
    if (fmoe_cache_lookup(q->view, e) >= 0) return 0;
    const int32_t rank = q->feedback ? fmoe__prefetch_feedback_predict(&q->fb, l, j) : 0;
    if (q->hooks.sync) q->hooks.sync(q->hooks.ctx, q->env.now_s);
    if (q->feedback && fmoe_cache_free_slot(q->cache) < 0 &&
        !fmoe__prefetch_feedback_admit(&q->fb, l, rank)) {
        /* its expected hits do not pay for the misses its eviction is expected to cause */
        log_decision(q, FMOE_DECISION_DROPPED, e, -1, -1, 0, priority, q->env.now_s);
        return 1;
    }
    const fmoe_victim_request req = {.incoming = e, .kind = FMOE_LOAD_PREFETCH, .value = value};
    int32_t victim;
    const int32_t s = make_room(q, &req, &victim);
    if (s < 0) {
        if (q->error) return q->error;
        log_decision(q, FMOE_DECISION_DROPPED, e, -1, -1, 0, priority, q->env.now_s);
        return 1;
    }
    fmoe_cache_insert(q->cache, s, e, FMOE_SLOT_LOADING);
    q->flags[s] = FLAG_PREFETCHED | FLAG_QUEUED;
    q->priority[s] = priority;
    q->seq[s] = q->next_seq++;
    q->eligible[s] = q->env.now_s + q->delay_s;
    q->chunks_done[s] = 0;
    q->queue[q->queue_len++] = s;
    log_decision(q, FMOE_DECISION_PREFETCH, e, s, victim, 0, priority, q->env.now_s);
    if (q->hooks.queued) q->hooks.queued(q->hooks.ctx);
    return 0;
}

/* Drops the queued prefetch in slot s (its transfer not started): the slot is free. */
static void cancel_queued(fmoe_slots *q, int32_t s) {
    const int32_t e = q->view->slot_expert[s];
    queue_remove_slot(q, s);
    if (q->flags[s] & FLAG_POLICY_PIN) fmoe_cache_unpin(q->cache, s);
    q->flags[s] = 0;
    fmoe_cache_evict(q->cache, s);
    log_decision(q, FMOE_DECISION_CANCEL, e, s, -1, 0, 0, q->env.now_s);
}

static void sink_cancel(void *ctx, int32_t l, int32_t j) {
    fmoe_slots *q = ctx;
    const int32_t e = expert_id(q, l, j);
    const int32_t s = e < 0 ? -1 : fmoe_cache_lookup(q->view, e);
    if (s < 0 || !(q->flags[s] & FLAG_QUEUED)) return;
    cancel_queued(q, s);
}

static void sink_pin(void *ctx, int32_t l, int32_t j) {
    fmoe_slots *q = ctx;
    const int32_t e = expert_id(q, l, j);
    const int32_t s = e < 0 ? -1 : fmoe_cache_lookup(q->view, e);
    if (s < 0 || (q->flags[s] & FLAG_POLICY_PIN)) return;
    fmoe_cache_pin(q->cache, s);
    q->flags[s] |= FLAG_POLICY_PIN;
}

static void sink_unpin(void *ctx, int32_t l, int32_t j) {
    fmoe_slots *q = ctx;
    const int32_t e = expert_id(q, l, j);
    const int32_t s = e < 0 ? -1 : fmoe_cache_lookup(q->view, e);
    if (s < 0 || !(q->flags[s] & FLAG_POLICY_PIN)) return;
    fmoe_cache_unpin(q->cache, s);
    q->flags[s] &= (uint8_t)~FLAG_POLICY_PIN;
}

static void sink_compute_on_host(void *ctx, int32_t l, int32_t j) {
    fmoe_slots *q = ctx;
    const int32_t e = expert_id(q, l, j);
    if (e >= 0) q->host_next[e] = 1;
}

/* ------------------------------------------------------------------ init / free */

void fmoe_slots_free(fmoe_slots *q) {
    if (!q) return;
    fmoe_cache_free(q->cache);
    free(q->flags);
    free(q->priority);
    free(q->seq);
    free(q->eligible);
    free(q->chunks_done);
    free(q->queue);
    free(q->host_next);
    free(q->order);
    free(q->stats);
    free(q->layer_bytes);
    fmoe__prefetch_feedback_free(&q->fb);
    free(q);
}

int fmoe_slots_init(fmoe_slots **out, const fmoe_slots_config *cfg) {
    *out = NULL;
    FMOE_RETURN_ERROR_IF(!cfg->policy || !cfg->policy->ops || !cfg->policy->ops->choose_victim,
                         FMOE_EINVAL, "slots: no policy");
    FMOE_RETURN_ERROR_IF(cfg->chunks < 0 || cfg->chunks > 1024, FMOE_EINVAL,
                         "copy chunks must be in [1, 1024], got %d", cfg->chunks);
    FMOE_RETURN_ERROR_IF(cfg->expert_bytes < 0 || !(cfg->prefetch_delay_s >= 0), FMOE_EINVAL,
                         "slots: bad expert bytes or prefetch delay");
    fmoe_slots *q = calloc(1, sizeof *q);
    if (!q) return fmoe_error_set(FMOE_ENOMEM, "slots");
    int rc = fmoe_cache_init(&q->cache, cfg->num_layers, cfg->num_experts, cfg->capacity);
    if (rc < 0) {
        free(q);
        return rc;
    }
    q->view = fmoe_cache_view_of(q->cache);
    q->policy = cfg->policy;
    q->hooks = cfg->hooks;
    q->L = cfg->num_layers;
    q->J = cfg->num_experts;
    q->N = cfg->capacity;
    q->chunks = cfg->chunks > 0 ? cfg->chunks : 1;
    q->expert_bytes = cfg->expert_bytes;
    q->delay_s = cfg->prefetch_delay_s;
    q->iteration = -1;
    q->started = -1;
    const size_t n = (size_t)q->N;
    q->flags = calloc(n, 1);
    q->priority = calloc(n, sizeof *q->priority);
    q->seq = calloc(n, sizeof *q->seq);
    q->eligible = calloc(n, sizeof *q->eligible);
    q->chunks_done = calloc(n, sizeof *q->chunks_done);
    q->queue = calloc(n, sizeof *q->queue);
    q->host_next = calloc((size_t)q->L * (size_t)q->J, 1);
    q->order = calloc((size_t)q->J, sizeof *q->order);
    q->stats = calloc((size_t)q->L, sizeof *q->stats);
    q->layer_bytes = malloc((size_t)(q->L > 0 ? q->L : 1) * sizeof *q->layer_bytes);
    if (!q->flags || !q->priority || !q->seq || !q->eligible || !q->chunks_done || !q->queue ||
        !q->host_next || !q->order || !q->stats || !q->layer_bytes) {
        fmoe_slots_free(q);
        return fmoe_error_set(FMOE_ENOMEM, "slot state for %d slots", cfg->capacity);
    }
    for (int32_t l = 0; l < q->L; l++)
        q->layer_bytes[l] = cfg->layer_expert_bytes ? cfg->layer_expert_bytes[l] : q->expert_bytes;
    q->sink = (fmoe_policy_sink){
        .ctx = q,
        .prefetch = sink_prefetch,
        .cancel = sink_cancel,
        .pin = sink_pin,
        .unpin = sink_unpin,
        .compute_on_host = sink_compute_on_host,
    };
    q->env = (fmoe_policy_env){.now_s = 0, .cache = q->view, .sink = &q->sink};
    q->feedback = cfg->feedback;
    if (q->feedback && (rc = fmoe__prefetch_feedback_init(&q->fb, q->L, q->J)) < 0) {
        fmoe_slots_free(q);
        return rc;
    }
    *out = q;
    return 0;
}

fmoe_policy_env *fmoe_slots_env(fmoe_slots *q) { return &q->env; }
const fmoe_cache_view *fmoe_slots_view(const fmoe_slots *q) { return q->view; }
void fmoe_slots_set_iteration(fmoe_slots *q, int64_t iteration) { q->iteration = iteration; }
int fmoe_slots_error(const fmoe_slots *q) { return q->error; }

int fmoe_slots_preload(fmoe_slots *q, const int32_t *experts, int32_t n) {
    FMOE_RETURN_ERROR_IF(n < 0 || n > q->N, FMOE_EINVAL, "preload of %d experts into %d slots",
                         n, q->N);
    for (int32_t s = 0; s < q->N; s++) {
        if (q->view->slot_expert[s] < 0) continue;
        while (q->view->slot_pins[s]) fmoe_cache_unpin(q->cache, s);
        q->flags[s] = 0;
        fmoe_cache_evict(q->cache, s);
    }
    q->queue_len = 0;
    q->started = -1;
    q->landed = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = fmoe_cache_free_slot(q->cache);
        FMOE_FORWARD_IF_ERROR(fmoe_cache_insert(q->cache, s, experts[i], FMOE_SLOT_RESIDENT));
        fmoe_cache_touch(q->cache, s);
    }
    return 0;
}

/* ------------------------------------------------------------------ accesses */

void fmoe_slots_gate(fmoe_slots *q, int32_t l, const int32_t *distinct, int32_t n) {
    if (!q->feedback) return;
    /* early preemption (ProMoE paper §5, "Early Preemption"): the gate has spoken for layer l, so its queued
     * prefetches of experts it did not choose can only waste the link now */
    for (int32_t i = q->queue_len - 1; i >= 0; i--) {
        const int32_t s = q->queue[i], e = q->view->slot_expert[s];
        if (e / q->J != l) continue;
        int chosen = 0;
        for (int32_t k = 0; k < n && !chosen; k++) chosen = distinct[k] == e % q->J;
        if (!chosen) cancel_queued(q, s);
    }
    if (q->hooks.link_busy_s)
        fmoe__prefetch_feedback_link(&q->fb, q->hooks.link_busy_s(q->hooks.ctx), q->env.now_s);
    fmoe__prefetch_feedback_gate(&q->fb, l, distinct, n);
}

/* Looks expert e up for an access and claims it: a QUEUED prefetch leaves the prefetch
 * queue (the executor loads it as a demand load, counted as a prefetch transfer), a QUEUED
 * or STARTED one becomes RESIDENT in the cache view (the access owns it; its compute waits
 * for the transfer). The expert is no longer "prefetched and unused" after it. */
static fmoe_slot_access look_up(fmoe_slots *q, int32_t e) {
    fmoe_slot_access a = {FMOE_FIND_ABSENT, fmoe_cache_lookup(q->view, e), 0, 0};
    const int32_t s = a.slot;
    if (s < 0) return a;
    a.prefetched = (q->flags[s] & FLAG_PREFETCHED) != 0;
    if (q->view->slot_state[s] == FMOE_SLOT_RESIDENT) {
        a.found = FMOE_FIND_RESIDENT;
    } else { /* a prefetch not finished: the access claims it */
        a.chunks_left = q->chunks - q->chunks_done[s];
        if (q->flags[s] & FLAG_QUEUED) {
            a.found = FMOE_FIND_QUEUED;
            queue_remove_slot(q, s);
            count_prefetch(q, e);
            log_decision(q, FMOE_DECISION_PROMOTE, e, s, -1, 0, q->priority[s], q->env.now_s);
        } else {
            a.found = FMOE_FIND_STARTED;
            if (q->started == s) q->started = -1;
        }
        if (q->flags[s] & FLAG_LANDED) q->landed--;
        q->flags[s] &= (uint8_t)~(FLAG_QUEUED | FLAG_STARTED | FLAG_LANDED);
        fmoe_cache_mark_resident(q->cache, s);
    }
    q->flags[s] &= (uint8_t)~FLAG_PREFETCHED;
    return a;
}

/* 0 resident, 1 a transfer under way or landed, 2 queued or absent (compute_order). */
static int compute_class(const fmoe_slots *q, int32_t e) {
    const int32_t s = fmoe_cache_lookup(q->view, e);
    if (s < 0) return 2;
    if (q->view->slot_state[s] == FMOE_SLOT_RESIDENT) return 0;
    return (q->flags[s] & FLAG_QUEUED) ? 2 : 1;
}

void fmoe_slots_compute_order(const fmoe_slots *q, int32_t l, const int32_t *distinct,
                              int32_t n, int32_t *order) {
    int32_t k = 0;
    for (int c = 0; c < 3; c++)
        for (int32_t i = 0; i < n; i++)
            if (compute_class(q, l * q->J + distinct[i]) == c) order[k++] = i;
}

/* A miss loaded on demand: makes room (choose_victim with FMOE_LOAD_DEMAND) and puts e in
 * the freed slot as RESIDENT, counting its bytes. @return the slot (*victim: the expert
 * evicted for it, -1 none), or -1 when the policy wants nothing evicted or nothing is
 * evictable (a bypass: the executor loads the expert into scratch and computes it
 * uncached), or -1 with q->error set. */
static int32_t demand_load(fmoe_slots *q, int32_t e, int32_t *victim) {
    const fmoe_victim_request req = {.incoming = e, .kind = FMOE_LOAD_DEMAND, .value = 0};
    const int32_t s = make_room(q, &req, victim);
    if (q->error) return -1;
    if (s >= 0) {
        fmoe_cache_insert(q->cache, s, e, FMOE_SLOT_RESIDENT);
        if (*victim >= 0)
            log_decision(q, FMOE_DECISION_EVICT, e, s, *victim, 0, 0, q->env.now_s);
    } else {
        q->stats[e / q->J].bypassed++;
    }
    count_bytes(q, e);
    return s;
}

/* Whether the policy asked for the next miss of e to be computed on the host; clears the
 * request. */
static int take_host(fmoe_slots *q, int32_t e) {
    const int want = q->host_next[e];
    q->host_next[e] = 0;
    return want;
}

/* Records an access in the cache's bookkeeping (its slot, or uncached: slot -1) and logs
 * it (a host-lane miss first as HOST). */
static void touch(fmoe_slots *q, int32_t e, int32_t slot, fmoe_access_result result,
                  int on_host, double now) {
    if (slot >= 0) fmoe_cache_touch(q->cache, slot);
    else fmoe_cache_touch_uncached(q->cache, e);
    if (on_host) log_decision(q, FMOE_DECISION_HOST, e, -1, -1, 0, 0, now);
    log_decision(q, FMOE_DECISION_ACCESS, e, slot, -1, (int32_t)result, 0, now);
}

/* ------------------------------------------------------------------ the per-layer sequence */

int fmoe_slots_resolve(fmoe_slots *q, const fmoe_slots_executor *x, int32_t l, int32_t j,
                       int32_t tokens, int32_t index, int64_t position) {
    const int32_t e = l * q->J + j;
    fmoe_slots_resolved a = {.layer = l, .expert = j, .index = index, .tokens = tokens,
                             .found = look_up(q, e), .victim = -1,
                             .result = FMOE_ACCESS_HIT};
    a.slot = a.found.slot;
    if (a.found.found == FMOE_FIND_RESIDENT) {
        a.prefetch_hit = a.found.prefetched;
    } else if (a.found.found != FMOE_FIND_ABSENT) { /* a claimed prefetch not finished */
        a.result = x->claimed ? x->claimed(x->ctx, &a) : FMOE_ACCESS_HIT;
        a.prefetch_hit = a.result == FMOE_ACCESS_HIT;
    } else {
        a.result = FMOE_ACCESS_MISS;
        /* the policy's request is taken at every miss, so it covers exactly the next one,
         * whether or not this executor can honour it */
        const int asked = take_host(q, e);
        a.on_host = x->miss_on_host ? x->miss_on_host(x->ctx, &a, asked) != 0 : 0;
        if (a.on_host) {
            if (x->host) x->host(x->ctx, &a);
        } else {
            a.slot = demand_load(q, e, &a.victim);
            if (q->error) return q->error;
            if (x->demand) x->demand(x->ctx, &a);
        }
    }
    const double t = x->placed ? x->placed(x->ctx, &a) : q->env.now_s;
    touch(q, e, a.slot, a.result, a.on_host, t);
    const fmoe_policy_ops *ops = q->policy->ops;
    if (ops->on_access) {
        const fmoe_access_event ev = {.layer = l, .expert = j, .tokens = tokens,
                                      .slot = a.slot, .position = position,
                                      .result = a.result};
        ops->on_access(q->policy->state, &q->env, &ev);
    }
    return q->error;
}

int fmoe_slots_run_layer(fmoe_slots *q, const fmoe_slots_layer *layer,
                         const fmoe_slots_executor *x) {
    const fmoe_gate_event *g = layer->gate;
    const fmoe_policy_ops *ops = q->policy->ops;
    const int32_t l = g->layer, n = g->num_distinct;
    if (q->hooks.sync) q->hooks.sync(q->hooks.ctx, layer->now);
    q->env.now_s = layer->now;
    fmoe_slots_gate(q, l, g->distinct, n);
    if (ops->on_gate) ops->on_gate(q->policy->state, &q->env, g);
    if (q->error) return q->error;
    const int reorder = (ops->flags & FMOE_POLICY_REORDER_COMPUTE) != 0;
    int32_t *order = layer->order ? layer->order : q->order;
    if (reorder) fmoe_slots_compute_order(q, l, g->distinct, n, order);
    for (int32_t k = 0; k < n; k++) {
        const int32_t i = reorder ? order[k] : k, j = g->distinct[i];
        const int rc = fmoe_slots_resolve(q, x, l, j, layer->tokens[j], i,
                                          g->position >= 0 ? g->position + i : -1);
        if (rc < 0) return rc;
    }
    return 0;
}

int fmoe_slots_layer_done(fmoe_slots *q, int32_t l, double now) {
    const fmoe_policy_ops *ops = q->policy->ops;
    if (ops->on_layer_done) {
        q->env.now_s = now;
        ops->on_layer_done(q->policy->state, &q->env, l);
    }
    return q->error;
}

/* ------------------------------------------------------------------ the prefetch queue */

int32_t fmoe_slots_next_prefetch(const fmoe_slots *q, double *eligible_at, int32_t *chunk) {
    int32_t b = q->started;
    if (b < 0) {
        for (int32_t i = 0; i < q->queue_len; i++) {
            const int32_t s = q->queue[i];
            if (b < 0 || q->priority[s] > q->priority[b] ||
                (q->priority[s] == q->priority[b] && q->seq[s] < q->seq[b]))
                b = s;
        }
    }
    if (b >= 0) {
        if (eligible_at) *eligible_at = q->eligible[b];
        if (chunk) *chunk = q->chunks_done[b];
    }
    return b;
}

void fmoe_slots_chunk_start(fmoe_slots *q, int32_t s) {
    if (q->flags[s] & FLAG_QUEUED) {
        queue_remove_slot(q, s);
        q->flags[s] = (uint8_t)((q->flags[s] & ~FLAG_QUEUED) | FLAG_STARTED);
        q->started = s;
        count_prefetch(q, q->view->slot_expert[s]);
    }
}

int fmoe_slots_chunk_landed(fmoe_slots *q, int32_t s) {
    if (!(q->flags[s] & FLAG_STARTED)) return 0; /* claimed by an access meanwhile */
    if (++q->chunks_done[s] < q->chunks) return 0;
    q->flags[s] = (uint8_t)((q->flags[s] & ~FLAG_STARTED) | FLAG_LANDED);
    if (q->started == s) q->started = -1;
    q->landed++;
    return 1;
}

void fmoe_slots_apply_landed(fmoe_slots *q) {
    for (int32_t s = 0; s < q->N && q->landed > 0; s++)
        if (q->flags[s] & FLAG_LANDED) {
            q->flags[s] &= (uint8_t)~FLAG_LANDED;
            q->landed--;
            fmoe_cache_mark_resident(q->cache, s);
            log_decision(q, FMOE_DECISION_LANDED, q->view->slot_expert[s], s, -1, 0, 0,
                         q->env.now_s);
        }
}

int fmoe_slots_chunk_done(fmoe_slots *q, int32_t s) {
    if (!fmoe_slots_chunk_landed(q, s)) return 0;
    q->flags[s] &= (uint8_t)~FLAG_LANDED;
    q->landed--;
    fmoe_cache_mark_resident(q->cache, s);
    log_decision(q, FMOE_DECISION_LANDED, q->view->slot_expert[s], s, -1, 0, 0, q->env.now_s);
    return 1;
}

int32_t fmoe_slots_pending(const fmoe_slots *q) {
    return q->queue_len + (q->started >= 0);
}

/* ------------------------------------------------------------------ accounting */

const fmoe_slots_layer_stats *fmoe_slots_finish(fmoe_slots *q) {
    for (int32_t s = 0; s < q->N; s++)
        if ((q->flags[s] & FLAG_PREFETCHED) && !(q->flags[s] & FLAG_QUEUED)) {
            count_wasted(q, q->view->slot_expert[s]);
            q->flags[s] &= (uint8_t)~FLAG_PREFETCHED;
        }
    return q->stats;
}

const fmoe_slots_layer_stats *fmoe_slots_stats(const fmoe_slots *q) { return q->stats; }
