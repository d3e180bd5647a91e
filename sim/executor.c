/*
 * executor.c - the discrete-event executor for one (policy, cache, distance) cell
 * (fmoe/sim.h; docs/design.md §7, access model §7.1).
 *
 * Hit/miss decisions follow the access sequence in logical order, exactly as §7.1 states
 * them: each access is resolved (hit, late hit, or miss with a victim chosen now) before
 * the next one, so for policies without prefetch the counts depend only on the sequence and
 * the capacity. Time runs alongside: every slot remembers when its expert's last compute
 * ends (the expert is pinned while it computes), and a load into that slot cannot start
 * earlier. The copy engine is simulated lazily: queued prefetches start, in priority order,
 * whenever the engine would be idle before the next demand load is issued; a transfer once
 * started is never preempted.
 *
 * A miss may instead go to the host lane (config miss_mode, or the policy's
 * compute_on_host): the expert is computed on the CPU from the gate on, one at a time, and
 * not cached; the layer ends when the compute stream and the host lane are both done.
 * With arrival times, requests are served first come first served (queueing, docs/design.md §7).
 * A batched workload (fmoe_sim_workload_batch) runs its iterations as they were composed,
 * up to B requests interleaved, each iteration one batched forward (run_batched).
 *
 * Everything is allocated in run_init; the event loop allocates nothing, so a sweep's cells
 * run at the speed of their arithmetic.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/predictor.h"
#include "fmoe/sim.h"
#include "fmoe/slots.h"
#include "gap_split.h"
#include "monotonic.h"

typedef struct sim_state {
    const fmoe_sim_workload *w;
    const fmoe_sim_costs *costs;
    fmoe_slots *slots;        /* the slot-and-transfer protocol (fmoe/slots.h) */
    const fmoe_cache_view *view;
    fmoe_policy policy;
    fmoe_policy_env *env;     /* the slots' environment, passed with every event */
    int32_t N, L, J, K;
    int32_t chunks;           /* pieces per prefetch transfer */
    double *xfer_s;           /* [L] one expert's transfer in one copy (demand loads), by
                                 layer: a llama-quantize mix's layers differ in bytes */
    double *chunk_s;          /* [L] one piece of a prefetch transfer */
    double expert1_s;         /* one expert's compute for one token (the decode case) */
    double *slot_free_at;     /* [N] end of the occupant's last compute */
    int32_t cur_slot;         /* slot of the prefetch piece on the copy engine, -1 none */
    double cur_end;           /* when that piece lands */
    int32_t *distinct;        /* [J] scratch for gate events */
    int32_t *tokens;          /* [J] the layer's tokens routed to each of its experts */
    double t_gate;            /* the layer's gate time (fmoe_slots_executor callbacks) */
    double ready;             /* when the access being resolved has its bytes */
    double host_end;          /* when the layer's last host-computed expert is done */
    double engine_free;       /* copy engine idle from */
    double link_busy_s;       /* transfer time scheduled on the engine, in all */
    double compute_free;      /* compute stream idle from */
    double head_s;            /* the LM head of an iteration that yields a token */
    double *ttft, *tpot, *e2e, *qdelay; /* [R] per request */
    double *arrival;          /* [R] batched runs: each request's arrival */
    int64_t *decodes;         /* [R] batched runs: decode tokens after the first token, -1
                                 before the first token */
    int64_t n_tpot;
    int have_host;            /* the cost model has host figures */
    double host_free;         /* host lane idle from */
    fmoe_sim_result *r;
    fmoe_slots_executor exec; /* the modelled device's part of each layer (exec_*) */
    void (*decision)(void *ctx, const fmoe_decision *d); /* the decision log, or NULL */
    void *decision_ctx;
    int gap_on;               /* cfg->gap_split: count wrong prefetches' misses */
    sim_gap_split gap;
    int error;
} sim_state;

/* ------------------------------------------------------------------ copy engine */

/* Runs the modelled copy engine up to time t: lands the prefetch piece in flight if it
 * ends by t, then starts the next pieces (the slots' order: a started transfer first, else
 * the best queued one) that the engine would start by t. A piece waits for its slot's
 * previous occupant to finish computing. Demand loads are placed by run_layer directly
 * (they go ahead of every prefetch piece not yet started). */
static void engine_advance(sim_state *S, double t) {
    for (;;) {
        if (S->cur_slot >= 0) {
            if (S->cur_end > t) return;
            fmoe_slots_chunk_done(S->slots, S->cur_slot);
            S->cur_slot = -1;
        }
        double eligible;
        const int32_t s = fmoe_slots_next_prefetch(S->slots, &eligible, NULL);
        if (s < 0) return;
        const double start = fmax(fmax(S->engine_free, eligible), S->slot_free_at[s]);
        if (start > t) return;
        fmoe_slots_chunk_start(S->slots, s);
        const double piece_s = S->chunk_s[fmoe_slots_expert(S->slots, s) / S->J];
        S->cur_slot = s;
        S->cur_end = S->engine_free = start + piece_s;
        S->link_busy_s += piece_s;
    }
}

static void hook_decision(void *ctx, const fmoe_decision *d) {
    sim_state *S = ctx;
    if (S->gap_on) fmoe__gap_split_observe(&S->gap, d);
    if (S->decision) S->decision(S->decision_ctx, d);
}

static void hook_sync(void *ctx, double now) {
    sim_state *S = ctx;
    if (S->cur_slot >= 0 || fmoe_slots_pending(S->slots)) engine_advance(S, now);
}

/* When `pieces` of slot s's transfer of an expert of `layer`, loaded as a demand from `t`,
 * land: a whole expert is one copy; the rest of a started prefetch is its remaining
 * pieces. */
static double demand_ready(sim_state *S, int32_t s, int32_t layer, int32_t pieces, double t) {
    const double start = fmax(fmax(t, S->engine_free), s >= 0 ? S->slot_free_at[s] : 0);
    const double busy = pieces >= S->chunks ? S->xfer_s[layer] : pieces * S->chunk_s[layer];
    S->engine_free = start + busy;
    S->link_busy_s += busy;
    return S->engine_free;
}

static double hook_link_busy(void *ctx) { return ((const sim_state *)ctx)->link_busy_s; }

/* ------------------------------------------------------------------ a layer's accesses */

/* The modelled device's part of the per-layer sequence (fmoe_slots_run_layer, whose
 * fmoe_slots_executor these fill): each access is timed from the layer's gate S->t_gate,
 * its bytes' arrival kept in S->ready until its compute is placed. */

/* A prefetch the access claimed continues as a demand load (docs/design.md §7.1, point
 * 13); a hit when its bytes are there when the compute stream reaches the access. */
static fmoe_access_result exec_claimed(void *ctx, const fmoe_slots_resolved *a) {
    sim_state *S = ctx;
    const fmoe_slot_access *f = &a->found;
    if (f->found == FMOE_FIND_STARTED && S->cur_slot == f->slot) {
        /* its piece on the engine lands first; the rest follows as a demand load */
        S->ready = f->chunks_left > 1
                       ? demand_ready(S, -1, a->layer, f->chunks_left - 1, S->t_gate)
                       : S->cur_end;
        S->cur_slot = -1;
    } else {
        S->ready = demand_ready(S, f->slot, a->layer, f->chunks_left, S->t_gate);
    }
    return S->ready <= S->compute_free ? FMOE_ACCESS_HIT : FMOE_ACCESS_LATE_HIT;
}

/* Decides where a miss is computed: 1 on the host lane, given host figures (the policy's
 * request, --miss cpu). AUTO compares the estimated end of a demand load plus GPU compute
 * with the end of a host computation, both from the gate (Fiddler's rule). */
static int exec_miss_on_host(void *ctx, const fmoe_slots_resolved *a, int policy_asked) {
    sim_state *S = ctx;
    if (!S->have_host) return 0;
    if (policy_asked) return 1;
    const double t_gate = S->t_gate;
    const int32_t tokens = a->tokens;
    switch (S->r->miss_mode) {
    case FMOE_SIM_MISS_CPU: return 1;
    case FMOE_SIM_MISS_AUTO: {
        const double gpu_ready = fmax(t_gate, S->engine_free) + S->xfer_s[a->layer];
        const double gpu_end = fmax(gpu_ready, S->compute_free) + fmoe_sim_expert_s(S->costs, tokens);
        const double host_end = fmax(t_gate, S->host_free) + fmoe_sim_host_expert_s(S->costs, tokens);
        return host_end < gpu_end;
    }
    default: return 0;
    }
}

/* A miss on the host lane: from max(t_gate, host free), one expert at a time. */
static void exec_host(void *ctx, const fmoe_slots_resolved *a) {
    sim_state *S = ctx;
    const double hs = fmoe_sim_host_expert_s(S->costs, a->tokens);
    const double start = fmax(S->t_gate, S->host_free);
    S->host_free = start + hs;
    S->r->host_busy_s += hs;
    S->host_end = S->host_free;
    S->r->per_layer[a->layer].host_misses++;
}

/* A demand load (a bypass's too: slot -1), issued at the gate. */
static void exec_demand(void *ctx, const fmoe_slots_resolved *a) {
    sim_state *S = ctx;
    S->ready = demand_ready(S, a->slot, a->layer, S->chunks, S->t_gate);
}

/* Counts the access and places its compute on the modelled device, stalling for its
 * bytes; its slot is free from the compute's end. @return that end (the host lane's for
 * a host-computed miss), the time the decision log records. */
static double exec_placed(void *ctx, const fmoe_slots_resolved *a) {
    sim_state *S = ctx;
    fmoe_sim_layer_stats *ls = &S->r->per_layer[a->layer];
    if (a->prefetch_hit) {
        S->r->prefetch_hits++;
        ls->prefetch_hits++;
    }
    switch (a->result) {
    case FMOE_ACCESS_HIT: ls->hits++; break;
    case FMOE_ACCESS_LATE_HIT: ls->late_hits++; break;
    default: ls->misses++; break;
    }
    if (!a->on_host) {
        if (S->ready > S->compute_free) {
            ls->stall_s += S->ready - S->compute_free;
            S->compute_free = S->ready;
        }
        S->compute_free += a->tokens == 1 ? S->expert1_s : fmoe_sim_expert_s(S->costs, a->tokens);
    }
    if (a->slot >= 0) S->slot_free_at[a->slot] = S->compute_free;
    S->ready = 0;
    return a->on_host ? S->host_free : S->compute_free;
}

/* ------------------------------------------------------------------ init / free */

static void run_free(sim_state *S) {
    fmoe_slots_free(S->slots);
    fmoe_policy_free(&S->policy);
    fmoe__gap_split_free(&S->gap);
    free(S->slot_free_at);
    free(S->xfer_s);
    free(S->chunk_s);
    free(S->distinct);
    free(S->tokens);
    free(S->ttft);
    free(S->tpot);
    free(S->e2e);
    free(S->qdelay);
    free(S->arrival);
    free(S->decodes);
}

/* How long after the event that made them a policy's prefetches may start: the matcher's
 * time (FMOE_POLICY_MATCHER), or one pass of the learned predictor the policy declares it
 * predicts with (ops->predictor_kind; the hardware profile times each kind). */
static double prediction_delay_s(const fmoe_sim_costs *c, const fmoe_policy_ops *ops,
                                 const fmoe_predictor *p) {
    if (ops->flags & FMOE_POLICY_MATCHER) return c->match_delay_s;
    if (!p) return 0;
    switch (fmoe_predictor_kind_id_of(ops->predictor_kind)) {
    case FMOE_PREDICTOR_PROMOE: return c->promoe_delay_s;
    case FMOE_PREDICTOR_DUOSERVE: return c->duoserve_delay_s;
    default: return 0;
    }
}

static int run_init(sim_state *S, const fmoe_sim_workload *w, const fmoe_sim_config *cfg,
                    int32_t variant, fmoe_sim_result *r) {
    memset(S, 0, sizeof *S);
    S->w = w;
    S->costs = cfg->costs;
    S->r = r;
    S->N = cfg->cache_experts;
    S->L = w->num_layers;
    S->J = w->num_experts;
    S->K = w->top_k;
    S->cur_slot = -1;
    S->chunks = cfg->copy_chunks > 0 ? cfg->copy_chunks : 1;
    FMOE_RETURN_ERROR_IF(!cfg->costs, FMOE_EINVAL, "simulate: no cost model");
    FMOE_RETURN_ERROR_IF(cfg->cache_experts < 1, FMOE_EINVAL,
                         "cache must hold at least 1 expert, got %d", cfg->cache_experts);
    FMOE_RETURN_ERROR_IF(cfg->prefetch_distance < 0, FMOE_EINVAL,
                         "prefetch distance must be >= 0, got %d", cfg->prefetch_distance);
    FMOE_RETURN_ERROR_IF(cfg->miss_mode < FMOE_SIM_MISS_LOAD || cfg->miss_mode > FMOE_SIM_MISS_AUTO,
                         FMOE_EINVAL, "simulate: bad miss mode %d", cfg->miss_mode);
    FMOE_RETURN_ERROR_IF(cfg->copy_chunks < 0 || cfg->copy_chunks > 1024, FMOE_EINVAL,
                         "--copy-chunks must be in [1, 1024], got %d", cfg->copy_chunks);
    S->have_host = fmoe_sim_costs_have_host(cfg->costs);
    FMOE_RETURN_ERROR_IF(cfg->miss_mode != FMOE_SIM_MISS_LOAD && !S->have_host, FMOE_EINVAL,
                         "--miss %s needs host compute figures in the hardware profile "
                         "(host.expert_s, or host.peak_flops and "
                         "host.memory_bandwidth_bytes_per_s; fmoe calibrate measures them)",
                         cfg->miss_mode == FMOE_SIM_MISS_CPU ? "cpu" : "auto");
    const fmoe_policy_ops *ops = cfg->ops ? cfg->ops : fmoe_policy_find(cfg->policy);
    if (!ops)
        return fmoe_error_set(FMOE_ENOTFOUND, "unknown policy '%s' (valid: %s)",
                              cfg->policy ? cfg->policy : "", fmoe_policy_names());
    FMOE_RETURN_ERROR_IF((ops->flags & FMOE_POLICY_NEEDS_HIDDEN) && !w->hidden,
                         FMOE_EUNSUPPORTED,
                         "policy %s needs the gate inputs (/tokens/hidden); the workload has "
                         "none: record the trace with 'fmoe record --hidden'",
                         ops->name);
    int32_t d = cfg->prefetch_distance;
    /* a learned predictor's stride is its policy's distance (promoe) */
    if (d == 0 && cfg->predictor && (ops->flags & FMOE_POLICY_NEEDS_HIDDEN))
        d = cfg->predictor->stride;
    if (d == 0) d = ops->default_distance < 0 ? S->L : ops->default_distance;
    const size_t n = (size_t)S->N, R = (size_t)(w->num_requests ? w->num_requests : 1);
    S->slot_free_at = calloc(n, sizeof *S->slot_free_at);
    S->xfer_s = calloc((size_t)S->L, sizeof *S->xfer_s);
    S->chunk_s = calloc((size_t)S->L, sizeof *S->chunk_s);
    S->distinct = calloc((size_t)S->J, sizeof *S->distinct);
    S->tokens = calloc((size_t)S->J, sizeof *S->tokens);
    S->ttft = calloc(R, sizeof(double));
    S->tpot = calloc(R, sizeof(double));
    S->e2e = calloc(R, sizeof(double));
    S->qdelay = calloc(R, sizeof(double));
    S->arrival = calloc(R, sizeof(double));
    S->decodes = calloc(R, sizeof(int64_t));
    r->per_layer = calloc((size_t)S->L, sizeof *r->per_layer);
    if (!S->slot_free_at || !S->xfer_s || !S->chunk_s || !S->distinct || !S->tokens || !S->ttft || !S->tpot || !S->e2e || !S->qdelay ||
        !S->arrival || !S->decodes || !r->per_layer)
        return fmoe_error_set(FMOE_ENOMEM, "simulator state for %d slots", S->N);
    r->num_layers = S->L;
    r->cache_experts = S->N;
    r->prefetch_distance = (ops->flags & FMOE_POLICY_PREFETCHES) ? d : 0;
    r->miss_mode = cfg->miss_mode;
    r->variant = variant;
    r->batch = w->batch > 0 ? w->batch : 1;

    fmoe_policy_config pc = {
        .num_layers = S->L,
        .num_experts = S->J,
        .top_k = S->K,
        .capacity = S->N,
        .prefetch_distance = d,
        .future = w->access_expert ? w->access_expert : (const uint32_t *)S->distinct,
        .future_len = w->num_accesses,
        .future_layer_accesses = w->layer_accesses ? w->layer_accesses : (const uint16_t *)S->distinct,
        .future_groups = w->num_iterations * S->L,
        .probs_kind = w->probs_kind,
        .speculative_depth = w->speculative_depth,
        .settings = &cfg->policy_settings,
        .variant = variant,
        .expert_store = cfg->expert_store,
        .semantic_dim = w->semantic_dim,
        .hidden_dim = w->hidden ? w->hidden_dim : 0,
        .predictor = cfg->predictor,
    };
    int rc = fmoe_policy_init_ops(&S->policy, ops, &pc);
    if (rc < 0) return rc;
    snprintf(r->policy, sizeof r->policy, "%s", S->policy.ops->name);
    S->decision = cfg->decision;
    S->decision_ctx = cfg->decision_ctx;
    if (cfg->gap_split) {
        FMOE_FORWARD_IF_ERROR(fmoe__gap_split_init(&S->gap, S->L, S->J));
        S->gap_on = 1;
    }
    const fmoe_slots_config sc = {
        .num_layers = S->L,
        .num_experts = S->J,
        .capacity = S->N,
        .chunks = S->chunks,
        .expert_bytes = w->expert_bytes,
        .layer_expert_bytes = w->layer_expert_bytes,
        /* the prefetches of a policy that predicts beside inference come the predictions'
         * time after their event: fMoE's matcher, a learned predictor's pass */
        .prefetch_delay_s = prediction_delay_s(S->costs, ops, cfg->predictor),
        .policy = &S->policy,
        .hooks = {.ctx = S, .sync = hook_sync, .queued = NULL,
                  .decision = cfg->decision || cfg->gap_split ? hook_decision : NULL,
                  .link_busy_s = hook_link_busy},
        .feedback = fmoe_policy_feedback(ops, cfg->feedback),
    };
    FMOE_FORWARD_IF_ERROR(fmoe_slots_init(&S->slots, &sc));
    S->view = fmoe_slots_view(S->slots);
    S->exec = (fmoe_slots_executor){.ctx = S, .claimed = exec_claimed,
                                    .miss_on_host = exec_miss_on_host, .host = exec_host,
                                    .demand = exec_demand, .placed = exec_placed};
    S->env = fmoe_slots_env(S->slots);
    for (int32_t l = 0; l < S->L; l++) {
        const int64_t bytes = w->layer_expert_bytes[l];
        S->xfer_s[l] = fmoe_sim_transfer_s(S->costs, bytes);
        S->chunk_s[l] = S->chunks == 1
                            ? S->xfer_s[l]
                            : fmoe_sim_transfer_s(S->costs, (bytes + S->chunks - 1) / S->chunks);
    }
    S->expert1_s = fmoe_sim_expert_s(S->costs, 1);
    S->head_s = fmoe_sim_head_s(S->costs);
    return 0;
}

/* ------------------------------------------------------------------ the event loop */

static void add_stats(fmoe_sim_layer_stats *to, const fmoe_sim_layer_stats *a,
                      const fmoe_sim_layer_stats *b, const fmoe_slots_layer_stats *ma,
                      const fmoe_slots_layer_stats *mb) {
    to->accesses += a->accesses - b->accesses;
    to->hits += a->hits - b->hits;
    to->late_hits += a->late_hits - b->late_hits;
    to->misses += a->misses - b->misses;
    to->stall_s += a->stall_s - b->stall_s;
    to->prefetch_hits += a->prefetch_hits - b->prefetch_hits;
    to->host_misses += a->host_misses - b->host_misses;
    to->bytes_loaded += ma->bytes_loaded - mb->bytes_loaded;
    to->prefetches += ma->prefetches - mb->prefetches;
}

/* The gate event of layer l with the iteration's rows (docs/design.md §7.1); fills
 * S->distinct and the layer's tokens per expert, S->tokens. */
static fmoe_gate_event gate_event(sim_state *S, const fmoe_sim_iteration *it, int64_t ii,
                                  int32_t l, int64_t a0, int32_t na) {
    const fmoe_sim_workload *w = S->w;
    const int32_t L = S->L, J = S->J, K = S->K;
    for (int32_t q = 0; q < na; q++) {
        S->distinct[q] = (int32_t)(w->access_expert[a0 + q] % J);
        S->tokens[S->distinct[q]] = (int32_t)w->access_tokens[a0 + q];
    }
    const size_t row = (size_t)it->token_begin * L + (size_t)l;
    const int32_t Sd = w->speculative_depth;
    return (fmoe_gate_event){
        .layer = l,
        .num_tokens = it->num_tokens,
        .chosen = w->experts + row * K,
        .chosen_stride = (int64_t)L * K,
        .probs = w->probs ? w->probs + row * J : NULL,
        .probs_stride = w->probs ? (int64_t)L * J : 0,
        .distinct = S->distinct,
        .num_distinct = na,
        .phase = it->phase,
        .probs_kind = w->probs ? w->probs_kind : 0,
        .speculative = w->speculative ? w->speculative + row * (size_t)Sd * J : NULL,
        .speculative_stride = (int64_t)L * Sd * J,
        .speculative_depth = w->speculative ? Sd : 0,
        .group = ii * L + l,
        .position = a0,
        .hidden = w->hidden ? w->hidden + row * (size_t)w->hidden_dim : NULL,
        .hidden_stride = (int64_t)L * w->hidden_dim,
        .hidden_dim = w->hidden ? w->hidden_dim : 0,
    };
}

/* One MoE layer of an iteration: its non-expert compute, then the per-layer sequence
 * (fmoe_slots_run_layer: the sync and the gate at the gate time, each distinct expert
 * resolved and computed on the modelled device), the wait for the host lane,
 * on_layer_done at the layer's end. */
static void run_layer(sim_state *S, const fmoe_sim_iteration *it, int64_t ii, int32_t l,
                      int64_t a0, int32_t na) {
    fmoe_sim_layer_stats *ls = &S->r->per_layer[l];
    const fmoe_sim_layer_stats before = *ls;
    const fmoe_slots_layer_stats m_before = fmoe_slots_stats(S->slots)[l];

    /* a batched iteration: attention over each item's own context (fmoe/sim.h) */
    S->compute_free += it->num_items > 0
                           ? fmoe_sim_layer_batch_s(S->costs, it->num_tokens,
                                                    (double)it->token_context,
                                                    (double)it->kv_context)
                           : fmoe_sim_layer_s(S->costs, it->num_tokens, it->context);
    S->t_gate = S->compute_free;
    S->host_end = 0;
    const fmoe_gate_event gate = gate_event(S, it, ii, l, a0, na);
    const fmoe_slots_layer layer = {.now = S->t_gate, .gate = &gate, .tokens = S->tokens};
    if ((S->error = fmoe_slots_run_layer(S->slots, &layer, &S->exec))) return;
    if (S->host_end > S->compute_free) { /* the layer's output needs the host's experts too */
        ls->stall_s += S->host_end - S->compute_free;
        S->compute_free = S->host_end;
    }
    ls->accesses += na;
    add_stats(&S->r->per_phase[it->phase ? 1 : 0], ls, &before, &fmoe_slots_stats(S->slots)[l],
              &m_before);
    S->error = fmoe_slots_layer_done(S->slots, l, S->compute_free);
}

/* An iteration's start event and its layers in order, for both replays. */
static void run_iteration_layers(sim_state *S, const fmoe_sim_iteration *it, int64_t ii,
                                 const fmoe_iteration_event *iev) {
    const fmoe_policy_ops *ops = S->policy.ops;
    S->env->now_s = S->compute_free;
    fmoe_slots_set_iteration(S->slots, ii);
    if (ops->on_iteration_start) ops->on_iteration_start(S->policy.state, S->env, iev);
    const uint16_t *la = S->w->layer_accesses + (size_t)ii * S->L;
    int64_t a = it->access_begin;
    for (int32_t l = 0; l < S->L && !S->error; l++) {
        run_layer(S, it, ii, l, a, la[l]);
        a += la[l];
    }
}

/* Mean and percentiles with linear interpolation between order statistics (numpy's
 * default). Sorts v. */
static fmoe_sim_summary summarise(double *v, int64_t n) {
    fmoe_sim_summary s = {0, 0, 0, 0};
    if (n <= 0) return s;
    qsort(v, (size_t)n, sizeof *v, fmoe__cmp_double);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += v[i];
    s.mean = sum / (double)n;
    const double qs[3] = {0.5, 0.9, 0.99};
    double *out[3] = {&s.p50, &s.p90, &s.p99};
    for (int i = 0; i < 3; i++) {
        const double pos = qs[i] * (double)(n - 1);
        const int64_t lo = (int64_t)floor(pos);
        const int64_t hi = lo + 1 < n ? lo + 1 : lo;
        *out[i] = v[lo] + (v[hi] - v[lo]) * (pos - (double)lo);
    }
    return s;
}

static void run_all(sim_state *S, const double *arrival_s) {
    const fmoe_sim_workload *w = S->w;
    const fmoe_policy_ops *ops = S->policy.ops;
    const int32_t L = S->L;
    for (int64_t rq = 0; rq < w->num_requests && !S->error; rq++) {
        const fmoe_sim_request *req = &w->requests[rq];
        /* FCFS: a request waits for the one before it; the stream idles until an arrival. */
        double arrival = S->compute_free;
        if (arrival_s) {
            arrival = arrival_s[rq];
            if (arrival > S->compute_free) S->compute_free = arrival;
        }
        const double start = S->compute_free;
        S->qdelay[rq] = start - arrival;
        const fmoe_request_event rev = {.index = rq, .id = req->id,
                                        .prompt_tokens = req->prompt_tokens,
                                        .output_tokens = req->output_tokens};
        S->env->now_s = start;
        if (ops->on_request_start) ops->on_request_start(S->policy.state, S->env, &rev);
        int64_t run_end = 0; /* the run of one-token iterations [.., run_end) holding i */
        int64_t decode_iterations = 0; /* after the first token */
        for (int64_t i = 0; i < req->num_iterations && !S->error; i++) {
            const int64_t ii = req->first_iteration + i;
            const fmoe_sim_iteration *it = &w->iterations[ii];
            /* the one-token iterations that follow, with their tokens' rows in order (each
             * run found once) */
            if (it->num_tokens == 1 && i >= run_end)
                for (run_end = i + 1; run_end < req->num_iterations &&
                                      it[run_end - i].num_tokens == 1 &&
                                      it[run_end - i].token_begin == it->token_begin + run_end - i;
                     run_end++) {
                }
            const int64_t left = it->num_tokens == 1 ? run_end - i : 0;
            const int32_t ahead = (int32_t)(left < FMOE_POLICY_MAX_AHEAD ? left
                                                                        : FMOE_POLICY_MAX_AHEAD);
            const fmoe_iteration_event iev = {.request = rq, .phase = it->phase,
                                              .num_tokens = it->num_tokens,
                                              .context = it->context, .group = ii * L,
                                              .position = it->access_begin,
                                              /* the semantic rows the fmoe policies match on */
                                              .semantic = w->semantic ? w->semantic +
                                                  (size_t)it->token_begin * w->semantic_dim : NULL,
                                              .semantic_dim = w->semantic ? w->semantic_dim : 0,
                                              .ahead = ahead,
                                              .ahead_probs = ahead && w->probs ? w->probs +
                                                  (size_t)it->token_begin * L * S->J : NULL,
                                              .ahead_chosen = ahead ? w->experts +
                                                  (size_t)it->token_begin * L * S->K : NULL,
                                              .ahead_semantic = ahead && w->semantic ?
                                                  w->semantic + (size_t)it->token_begin *
                                                  w->semantic_dim : NULL};
            run_iteration_layers(S, it, ii, &iev);
            /* the iteration that yields a token ends with the LM head: each decode
             * iteration, and the last chunk of the prefill (the first token) */
            const int last_prefill = it->phase == 0 && (i + 1 == req->num_iterations ||
                                                        it[1].phase != 0);
            if (it->phase != 0 || last_prefill) S->compute_free += S->head_s;
            S->env->now_s = S->compute_free;
            if (ops->on_iteration_end) ops->on_iteration_end(S->policy.state, S->env, &iev);
            if (last_prefill || (i == 0 && it->phase != 0)) S->ttft[rq] = S->compute_free - arrival;
            decode_iterations += it->phase != 0 && !(i == 0);
        }
        S->e2e[rq] = S->compute_free - arrival;
        if (decode_iterations > 0)
            S->tpot[S->n_tpot++] = (S->e2e[rq] - S->ttft[rq]) / (double)decode_iterations;
        S->env->now_s = S->compute_free;
        if (ops->on_request_end) ops->on_request_end(S->policy.state, S->env, &rev);
    }
}

/* Batched runs: starts the requests whose first rows run in iteration ii (the workload's
 * admit_iteration; the clock idles until their arrival if it must), each with
 * on_request_start, in the workload's admit_order (oldest admitted first); a request
 * without rows ends at once. */
static void admit_batched(sim_state *S, const double *arrival_s, int64_t ii, int64_t *next) {
    const fmoe_sim_workload *w = S->w;
    const fmoe_policy_ops *ops = S->policy.ops;
    while (*next < w->num_requests &&
           w->requests[w->admit_order[*next]].admit_iteration <= ii) {
        const int64_t q = w->admit_order[(*next)++];
        const fmoe_sim_request *req = &w->requests[q];
        const double arrival = arrival_s ? arrival_s[q] : 0;
        if (arrival > S->compute_free) S->compute_free = arrival;
        S->arrival[q] = arrival;
        S->qdelay[q] = S->compute_free - arrival;
        S->decodes[q] = -1;
        const fmoe_request_event rev = {.index = q, .id = req->id,
                                        .prompt_tokens = req->prompt_tokens,
                                        .output_tokens = req->output_tokens};
        S->env->now_s = S->compute_free;
        if (ops->on_request_start) ops->on_request_start(S->policy.state, S->env, &rev);
        if (req->leave_iteration >= 0) continue;
        S->e2e[q] = S->compute_free - arrival;
        if (ops->on_request_end) ops->on_request_end(S->policy.state, S->env, &rev);
    }
}

/* Continuous batching (fmoe_sim_workload_batch, fmoe_sim_workload_served): the workload's
 * iterations in order, each one batched forward of all its items; a request starts
 * (on_request_start) just before the iteration of its first rows and ends
 * (on_request_end) right after the iteration of its last, those of one iteration oldest
 * admitted first - the order fmoe serve tells its policy (runtime/serve/serve_engine.c). The iteration events report the first item's request, the
 * largest context, decode only when every item is a decode token, the semantic rows of
 * all tokens in item order; no `ahead` rows (the lookahead is for one-token iterations of
 * one request; 0 changes no decision). */
static void run_batched(sim_state *S, const double *arrival_s) {
    const fmoe_sim_workload *w = S->w;
    const fmoe_policy_ops *ops = S->policy.ops;
    const int32_t L = S->L;
    int64_t admitted = 0, left = 0;
    for (int64_t ii = 0; ii < w->num_iterations && !S->error; ii++) {
        admit_batched(S, arrival_s, ii, &admitted);
        const fmoe_sim_iteration *it = &w->iterations[ii];
        const fmoe_iteration_event iev = {
            .request = it->request, .phase = it->phase, .num_tokens = it->num_tokens,
            .context = it->context, .group = ii * L, .position = it->access_begin,
            .semantic = w->semantic ? w->semantic + (size_t)it->token_begin * w->semantic_dim
                                    : NULL,
            .semantic_dim = w->semantic ? w->semantic_dim : 0};
        run_iteration_layers(S, it, ii, &iev);
        if (S->error) break;
        S->compute_free += fmoe_sim_head_batch_s(S->costs, it->yields);
        S->env->now_s = S->compute_free;
        if (ops->on_iteration_end) ops->on_iteration_end(S->policy.state, S->env, &iev);
        for (int32_t c = 0; c < it->num_items; c++) {
            const fmoe_sim_item *item = &w->items[it->item_begin + c];
            const int64_t q = item->request;
            if (S->decodes[q] < 0 && (item->phase != 0 || item->last_prompt)) {
                S->ttft[q] = S->compute_free - S->arrival[q]; /* its first token */
                S->decodes[q] = 0;
            } else if (item->phase != 0) {
                S->decodes[q]++;
            }
        }
        while (left < w->num_requests &&
               w->requests[w->leave_order[left]].leave_iteration <= ii) {
            const int64_t q = w->leave_order[left++];
            const fmoe_sim_request *req = &w->requests[q];
            if (req->leave_iteration < 0) continue; /* ended at admission */
            S->e2e[q] = S->compute_free - S->arrival[q];
            if (S->decodes[q] > 0)
                S->tpot[S->n_tpot++] = (S->e2e[q] - S->ttft[q]) / (double)S->decodes[q];
            const fmoe_request_event rev = {.index = q, .id = req->id,
                                            .prompt_tokens = req->prompt_tokens,
                                            .output_tokens = req->output_tokens};
            if (ops->on_request_end) ops->on_request_end(S->policy.state, S->env, &rev);
        }
    }
    if (!S->error) admit_batched(S, arrival_s, w->num_iterations, &admitted);
}

static double ratio(int64_t num, int64_t den) {
    return den > 0 ? (double)num / (double)den : NAN;
}

static int run_variant(const fmoe_sim_workload *w, const fmoe_sim_config *cfg, int32_t variant,
                       fmoe_sim_result *out) {
    memset(out, 0, sizeof *out);
    sim_state S;
    int rc = 0;
    if (cfg->arrival_s)
        for (int64_t q = 0; q < w->num_requests && rc == 0; q++)
            if (!(cfg->arrival_s[q] >= 0) || !isfinite(cfg->arrival_s[q]))
                rc = fmoe_error_set(FMOE_EINVAL, "arrival time of request %lld is %g",
                                    (long long)q, cfg->arrival_s[q]);
    if (rc == 0) rc = run_init(&S, w, cfg, variant, out);
    else memset(&S, 0, sizeof S);
    if (rc == 0) {
        if (w->batch > 0) run_batched(&S, cfg->arrival_s);
        else run_all(&S, cfg->arrival_s);
        rc = S.error;
    }
    if (rc == 0) {
        fmoe_sim_result *r = out;
        const fmoe_slots_layer_stats *ms = fmoe_slots_finish(S.slots);
        for (int32_t l = 0; l < S.L; l++) {
            fmoe_sim_layer_stats *ls = &r->per_layer[l];
            ls->prefetches = ms[l].prefetches;
            ls->bytes_loaded = ms[l].bytes_loaded;
            ls->wasted_prefetch_bytes = ms[l].wasted_prefetch_bytes;
            r->prefetches += ms[l].prefetches;
            r->bytes_loaded += ms[l].bytes_loaded;
            r->wasted_prefetch_bytes += ms[l].wasted_prefetch_bytes;
            r->bypassed += ms[l].bypassed;
            r->accesses += ls->accesses;
            r->hits += ls->hits;
            r->late_hits += ls->late_hits;
            r->misses += ls->misses;
            r->stall_s += ls->stall_s;
            r->host_misses += ls->host_misses;
        }
        const int64_t used = r->prefetch_hits + r->late_hits;
        r->prefetch_precision = ratio(used, r->prefetches);
        r->prefetch_recall = ratio(used, used + r->misses);
        r->goodpred = ratio(r->prefetch_hits, used + r->misses);
        r->total_s = S.compute_free;
        r->ttft_s = summarise(S.ttft, w->num_requests);
        r->e2e_s = summarise(S.e2e, w->num_requests);
        r->tpot_s = summarise(S.tpot, S.n_tpot);
        r->queue_s = summarise(S.qdelay, w->num_requests);
        r->wrong_prefetch_misses = S.gap_on ? S.gap.wrong_prefetch_misses : -1;
    }
    run_free(&S);
    if (rc < 0) fmoe_sim_result_free(out);
    return rc;
}

int fmoe_sim_run(const fmoe_sim_workload *w, const fmoe_sim_config *cfg, fmoe_sim_result *out) {
    const fmoe_policy_ops *ops = cfg->ops ? cfg->ops : fmoe_policy_find(cfg->policy);
    const int32_t nv = ops && ops->variants > 1 ? ops->variants : 1;
    int rc = run_variant(w, cfg, 0, out);
    for (int32_t v = 1; v < nv && rc == 0; v++) {
        fmoe_sim_result other;
        rc = run_variant(w, cfg, v, &other);
        if (rc < 0) {
            fmoe_sim_result_free(out);
            break;
        }
        const int better = other.stall_s < out->stall_s ||
                           (other.stall_s == out->stall_s && other.e2e_s.mean < out->e2e_s.mean);
        if (better) {
            fmoe_sim_result_free(out);
            *out = other;
        } else {
            fmoe_sim_result_free(&other);
        }
    }
    return rc;
}

void fmoe_sim_result_free(fmoe_sim_result *r) {
    if (!r) return;
    free(r->per_layer);
    r->per_layer = NULL;
}
