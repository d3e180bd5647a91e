/*
 * fmoe/slots.h - expert slots and their transfers: the one slot-and-transfer protocol that
 * both executors (sim/ and runtime/) and the test drivers run (docs/design.md §7, §7.1,
 * §8).
 *
 * An executor owns time and bytes; this module owns every decision about slots:
 *
 *   - the cache (fmoe/cache.h) and the policy's sink (fmoe/policy.h): a prefetch makes
 *     room through the policy's choose_victim with an explicit fmoe_victim_request, puts
 *     the expert in a LOADING slot and queues its transfer; cancel drops a queued one;
 *     pin / unpin; compute_on_host marks the next miss of an expert for the host lane;
 *   - the per-layer sequence (fmoe_slots_run_layer, written once here): the sync, the
 *     gate, on_gate, the compute order, and each access resolved in the §7.1 order: hit,
 *     pending prefetch (queued: promoted to a demand load; started: waited for), or miss
 *     (a demand load with its victim, a bypass when the policy wants nothing evicted, or
 *     the host lane), then on_access; the executor plugs in what differs
 *     (fmoe_slots_executor) and sends on_layer_done when it wants
 *     (fmoe_slots_layer_done);
 *   - the prefetch queue: highest priority first, then first issued; a prefetch is
 *     eligible `prefetch_delay_s` after it was issued (the fMoE matcher's delay, §4.3).
 *     Transfers move in `chunks` equal pieces; a started prefetch is finished before
 *     another prefetch starts, and a demand load goes ahead of it at the next chunk
 *     boundary (the executor runs demand loads itself, ahead of everything);
 *   - accounting: prefetch transfers, bytes over the link, wasted prefetch bytes (a
 *     prefetched expert evicted or left unused);
 *   - the decision log: one fmoe_decision per decision, to a callback.
 *
 * What stays the executor's: when a transfer runs and ends (the simulator models it, the
 * live executor does it), hit versus late hit, and demand transfers themselves.
 *
 * Event order (the contract policies see, in both executors): on_request_start; per
 * iteration on_iteration_start; per layer the sequence of fmoe_slots_run_layer (on_gate
 * at the gate, then for each distinct expert in order of first appearance, or ProMoE's
 * compute order, the access is resolved, a miss's choose_victim first, and on_access
 * follows; its prose is below, "the per-layer sequence"), then on_layer_done; then
 * on_iteration_end; on_request_end. The request and iteration events are the executor's
 * to send. choose_victim is also called synchronously from inside sink->prefetch, with a
 * request of kind FMOE_LOAD_PREFETCH. Transfer completion is NOT an event a policy sees:
 * it changes only the cache view (a LOADING slot becomes RESIDENT, hence evictable), and
 * executors apply completions at two points only: before a layer's gate and before making
 * room for a prefetch (fmoe_slots_hooks.sync). A live executor therefore makes the
 * simulator's choices whenever the same transfers have completed at those points.
 *
 * Not thread safe: one executor thread calls everything (a live executor serialises its
 * threads' calls with a lock); its I/O threads report completions to it, and it applies
 * them through fmoe_slots_chunk_landed and fmoe_slots_apply_landed.
 */
#ifndef FMOE_SLOTS_H
#define FMOE_SLOTS_H

#include <stdint.h>

#include "fmoe/cache.h"
#include "fmoe/policy.h"

/* Tokens of one batched iteration (decode tokens plus prompt chunks, the longest prompt
 * chunk too): the default of fmoe serve --batch-tokens, and what fmoe simulate --batch
 * schedules with when neither the trace (its prefill_chunk) nor --batch-tokens says: here,
 * below both executors, so that neither includes the other for it. A plain literal: cmd/
 * prints it as the option's default. */
#define FMOE_BATCH_TOKENS 64
/* The largest budget either command accepts. */
#define FMOE_BATCH_TOKENS_MAX 8192

typedef struct fmoe_slots fmoe_slots;

/* One decision, as the decision log records it (docs/formats/decision-log.md; `fmoe
 * compare-logs`). */
typedef enum fmoe_decision_kind {
    FMOE_DECISION_ACCESS = 0,   /* an access resolved: result, slot */
    FMOE_DECISION_PREFETCH = 1, /* a prefetch issued into slot (victim evicted or -1) */
    FMOE_DECISION_DROPPED = 2,  /* a prefetch refused: no slot could be freed */
    FMOE_DECISION_CANCEL = 3,   /* a queued prefetch cancelled */
    FMOE_DECISION_EVICT = 4,    /* victim evicted for a demand load of expert */
    FMOE_DECISION_HOST = 5,     /* a miss computed on the host lane, uncached */
    FMOE_DECISION_PROMOTE = 6,  /* a queued prefetch turned into a demand load */
    FMOE_DECISION_LANDED = 7, /* a prefetch transfer completed (timing: not compared) */
} fmoe_decision_kind;

typedef struct fmoe_decision {
    fmoe_decision_kind kind;
    int64_t iteration;      /* iteration index in the run, -1 outside one */
    int32_t layer, expert;  /* (l, j) of the expert concerned */
    int32_t slot;           /* its slot, -1 none */
    int32_t victim;         /* expert id l*J+j evicted for it, -1 none */
    int32_t result;         /* ACCESS: fmoe_access_result; else 0 */
    double priority;        /* PREFETCH: the policy's priority */
    double time_s;          /* the executor's time (simulated or measured) */
} fmoe_decision;

/* What an executor does for the module. */
typedef struct fmoe_slots_hooks {
    void *ctx;
    /* Apply every transfer completion the executor knows of at time `now` (sim: advance
     * the modelled copy engine to `now`; live: take the I/O threads' completions). May be
     * NULL. */
    void (*sync)(void *ctx, double now);
    /* A prefetch was queued (live: wake the I/O thread). May be NULL. */
    void (*queued)(void *ctx);
    /* A decision was made (the decision log). May be NULL. */
    void (*decision)(void *ctx, const fmoe_decision *d);
    /* Seconds the copy engine has been busy in all, for feedback-directed prefetching's
     * link use (0 or NULL: an idle link, e.g. transfers that take no time). */
    double (*link_busy_s)(void *ctx);
} fmoe_slots_hooks;

typedef struct fmoe_slots_config {
    int32_t num_layers, num_experts; /* L, J */
    int32_t capacity;                /* N >= 1 */
    int32_t chunks;                  /* pieces per transfer (>= 1; 0 means 1) */
    int64_t expert_bytes;            /* bytes of one routed expert (the largest layer's) */
    /* [L] bytes of one expert of each layer, where layers differ (a llama-quantize mix);
     * borrowed for the module's life. NULL: every layer's are expert_bytes. */
    const int64_t *layer_expert_bytes;
    double prefetch_delay_s;         /* a prefetch is eligible this long after issue */
    fmoe_policy *policy;             /* borrowed; its choose_victim picks victims */
    /* 1: feedback-directed prefetching (lib/prefetch_feedback.h): a prefetch that must
     * evict is admitted only while the measured accuracy of its layer's predictions beats
     * the measured regret of evictions, and a gate cancels its layer's queued prefetches
     * of experts it did not choose (early preemption). 0: every prefetch as issued. */
    int32_t feedback;
    fmoe_slots_hooks hooks;
} fmoe_slots_config;

/* Per-layer transfer accounting (added to the executor's own counts). */
typedef struct fmoe_slots_layer_stats {
    int64_t prefetches;             /* prefetch transfers started (or promoted) */
    int64_t bytes_loaded;           /* every byte over the link */
    int64_t wasted_prefetch_bytes;  /* prefetched, then evicted or never used */
    int64_t bypassed;               /* misses computed without caching (no victim) */
} fmoe_slots_layer_stats;

/* @return 0, FMOE_EINVAL (bad geometry, capacity < 1, no policy), FMOE_ENOMEM. */
int fmoe_slots_init(fmoe_slots **out, const fmoe_slots_config *cfg);
/* NULL is a no-op. The policy is not freed. */
void fmoe_slots_free(fmoe_slots *q);

/* The environment to pass with every policy event: the executor sets now_s (and the
 * iteration index, for the log) before each event. Valid until free. */
fmoe_policy_env *fmoe_slots_env(fmoe_slots *q);
const fmoe_cache_view *fmoe_slots_view(const fmoe_slots *q);
/* The iteration index written to decision records (-1 between iterations). */
void fmoe_slots_set_iteration(fmoe_slots *q, int64_t iteration);

/* The first error a policy caused (a victim that is not evictable, a prefetch of an
 * unknown expert): 0 or a negative code with a detail. Executors stop on it. */
int fmoe_slots_error(const fmoe_slots *q);

/* Empties every slot (queued prefetches dropped, pins released, nothing counted) and
 * loads experts[0..n) in order as resident, each touched once, so the first is the least
 * recently used: a warm start, or a test's starting state. @return 0 or FMOE_EINVAL (n >
 * capacity, a bad or repeated id). */
int fmoe_slots_preload(fmoe_slots *q, const int32_t *experts, int32_t n);

/* ---------------------------------------------------------------- accesses */

/* The gate of MoE layer l chose distinct[0..n) (first-appearance order): step 3 of
 * fmoe_slots_run_layer. With feedback it scores the predictions and evictions that concern
 * layer l and cancels layer l's queued prefetches of experts not chosen. */
void fmoe_slots_gate(fmoe_slots *q, int32_t l, const int32_t *distinct, int32_t n);

/* What an access found (step a of fmoe_slots_resolve). */
typedef enum fmoe_slot_find {
    FMOE_FIND_ABSENT = 0,   /* neither cached nor in flight: a miss */
    FMOE_FIND_RESIDENT = 1, /* resident: a hit */
    FMOE_FIND_QUEUED = 2,   /* a prefetch whose transfer has not started: now promoted */
    FMOE_FIND_STARTED = 3,  /* a prefetch whose transfer is under way: wait for it */
} fmoe_slot_find;

typedef struct fmoe_slot_access {
    fmoe_slot_find found;
    int32_t slot;           /* -1 when ABSENT */
    int32_t chunks_left;    /* QUEUED / STARTED: pieces of the transfer not yet done */
    int prefetched;         /* the expert came by a prefetch and is used for the first time */
} fmoe_slot_access;

/* ProMoE's reordered compute ("ProMoE: Fast MoE-based LLM Serving using Proactive
 * Caching" §5.3): the order to resolve and compute
 * layer l's distinct experts in, after its gate: the resident ones first, then those whose
 * transfer is under way (or has landed), then the rest (queued prefetches, misses), each
 * group in order of first appearance. order[q] receives an index into distinct[0..n).
 * Reads the slots only (step 5 of fmoe_slots_run_layer). */
void fmoe_slots_compute_order(const fmoe_slots *q, int32_t l, const int32_t *distinct,
                              int32_t n, int32_t *order);

/* ---------------------------------------------------------------- the per-layer sequence */

/*
 * fmoe_slots_run_layer is the one place the sequence of a MoE layer is written; the
 * simulator, the live executor and the test drivers all run it, and supply only what
 * differs between them through an fmoe_slots_executor. For layer l, given the executor's
 * time `now` at the gate and the gate event:
 *
 *   1. sync       hooks.sync(now): the executor applies the transfer completions it knows
 *                 of (one of the two sync points; the other is inside sink->prefetch)
 *   2. time       env.now_s = now; every event up to the layer's last on_access carries it
 *   3. gate       fmoe_slots_gate (feedback-directed prefetching: scoring, early
 *                 preemption of the layer's queued prefetches the gate did not choose)
 *   4. on_gate    the policy's, with the executor's gate event
 *   5. order      the gate's distinct experts in order of first appearance, or in
 *                 fmoe_slots_compute_order's order for FMOE_POLICY_REORDER_COMPUTE
 *   6. per expert fmoe_slots_resolve (below), in that order
 *
 * and it stops at the first error (a policy breaking the contract), returning it. It does
 * not send on_layer_done: the executor calls fmoe_slots_layer_done when the layer's
 * computes are done, at a time of its own (the simulator right after the sequence, at the
 * end of the layer's modelled compute; the live executor when the last expert's compute
 * finishes, which the forward pass reports later).
 *
 * One access (fmoe_slots_resolve, expert j of layer l) in docs/design.md §7.1's order:
 *
 *   a. look-up and claim: RESIDENT (a hit; a prefetched expert used for the first time is
 *      a prefetch hit), QUEUED or STARTED (a prefetch not finished: the access claims it;
 *      a queued one leaves the prefetch queue and counts as a prefetch transfer), or
 *      ABSENT (a miss)
 *   b. a claimed prefetch: exec->claimed finishes its transfer and says HIT or LATE_HIT
 *   c. a miss: the policy's compute_on_host request for e is taken; exec->miss_on_host
 *      decides whether the host lane computes it (exec->host), else a demand load takes a
 *      free slot or makes room (choose_victim with FMOE_LOAD_DEMAND; -1 or nothing
 *      evictable: a bypass, computed uncached) and exec->demand loads it
 *   d. exec->placed: the executor places the access's compute and counts it
 *   e. the access is recorded in the cache's bookkeeping and the decision log (HOST, then
 *      ACCESS, at the time placed returned)
 *   f. the policy's on_access (position: the gate's position + the expert's index in
 *      distinct, or -1 when the gate's is -1)
 *
 * Every callback runs on the executor's thread, inside the sequence, and must not call
 * back into this module or the policy.
 */

/* One access as the sequence has resolved it so far, handed to the executor's callbacks. */
typedef struct fmoe_slots_resolved {
    int32_t layer, expert;      /* (l, j) */
    int32_t index;              /* j's index in the gate's distinct[] (first appearance) */
    int32_t tokens;             /* tokens of the iteration routed to it */
    fmoe_slot_access found;     /* the look-up (step a) */
    int32_t slot;               /* the slot its compute reads: found.slot, a demand load's
                                   slot (step c), or -1: computed uncached (host lane,
                                   bypass) */
    int32_t victim;             /* expert id l*J+j evicted for its demand load, -1 none */
    fmoe_access_result result;  /* MISS for a miss; a claimed prefetch: claimed's answer */
    int on_host;                /* a miss computed on the host lane */
    int prefetch_hit;           /* a prefetched expert whose bytes were there in time: a
                                   first use of a RESIDENT one, or a claimed transfer that
                                   claimed judged a HIT */
} fmoe_slots_resolved;

/* What differs between executors, per access. ctx is passed back; every callback may be
 * NULL (the default in parentheses: an executor whose transfers take no time). The order
 * of calls is the sequence's: at most one of claimed, host or demand, then placed. */
typedef struct fmoe_slots_executor {
    void *ctx;
    /* A claimed prefetch (found QUEUED: promoted, none of it moved; STARTED: its transfer
     * under way or landed, found.chunks_left pieces still to move): have the rest of its
     * transfer done as a demand load, ahead of every prefetch (the simulator models it;
     * the live executor queues a demand job from its first piece not landed). @return
     * FMOE_ACCESS_HIT when its bytes are there when its compute starts, else
     * FMOE_ACCESS_LATE_HIT. (HIT) */
    fmoe_access_result (*claimed)(void *ctx, const fmoe_slots_resolved *a);
    /* A miss: nonzero to compute it on the host lane, uncached, instead of loading it.
     * policy_asked: the policy's compute_on_host request for this expert (already taken;
     * an executor without a host lane may ignore it). (0) */
    int (*miss_on_host)(void *ctx, const fmoe_slots_resolved *a, int policy_asked);
    /* A miss the host lane computes: the executor runs or schedules it. (nothing) */
    void (*host)(void *ctx, const fmoe_slots_resolved *a);
    /* A miss loaded on demand into a->slot (-1: a bypass: into scratch, computed
     * uncached); a->victim was evicted for it. The executor issues the transfer, ahead of
     * every prefetch not yet started. (nothing) */
    void (*demand)(void *ctx, const fmoe_slots_resolved *a);
    /* The access is resolved: the executor places its compute (after its bytes, on the
     * device or the host lane), charges the time and counts the result. @return the time
     * the decision log records for the access. (env.now_s) */
    double (*placed)(void *ctx, const fmoe_slots_resolved *a);
} fmoe_slots_executor;

/* One layer's input to the sequence. */
typedef struct fmoe_slots_layer {
    double now;                   /* the executor's time at the gate: the sync applies the
                                     completions up to it (a live executor reads its
                                     clock before the sync, which may wait) */
    const fmoe_gate_event *gate;  /* what on_gate receives: its layer, distinct[] and
                                     num_distinct are the layer's accesses, its position
                                     the first one's in the access sequence (-1 live) */
    const int32_t *tokens;        /* [J] tokens routed to each expert j of the layer */
    int32_t *order;               /* [num_distinct] receives the compute order (indexes
                                     into distinct) when the policy reorders compute, and
                                     is left alone otherwise; NULL: not wanted */
} fmoe_slots_layer;

/* Runs the sequence above for one layer. @return 0, or the first error (fmoe_slots_error)
 * with the layer's remaining accesses unresolved. */
int fmoe_slots_run_layer(fmoe_slots *q, const fmoe_slots_layer *layer,
                         const fmoe_slots_executor *x);

/* The layer's computes are done: the policy's on_layer_done(l) at time `now` (env.now_s
 * is set only when the policy has one). The executor calls it once per
 * fmoe_slots_run_layer that succeeded, when it wants (a live executor may from another
 * moment than the sequence's, under the same serialisation). @return fmoe_slots_error. */
int fmoe_slots_layer_done(fmoe_slots *q, int32_t l, double now);

/* Step 6 alone: resolves one access of expert j of layer l, index its place in the gate's
 * distinct[], `position` what on_access reports. For drivers that replay a bare access
 * sequence without gates (tests of the reference caches); executors run whole layers.
 * @return 0 or fmoe_slots_error. */
int fmoe_slots_resolve(fmoe_slots *q, const fmoe_slots_executor *x, int32_t l, int32_t j,
                       int32_t tokens, int32_t index, int64_t position);

/* ---------------------------------------------------------------- the prefetch queue */

/* @return the slot whose transfer piece the engine runs next among prefetches: a started
 * transfer first (it finishes before another prefetch starts), else the best queued one;
 * -1 when none. *eligible_at receives when it may start (issue time + delay) and
 * *chunk its piece index. Does not change anything. */
int32_t fmoe_slots_next_prefetch(const fmoe_slots *q, double *eligible_at, int32_t *chunk);

/* The engine starts the next piece of slot s's transfer (the first piece counts the
 * prefetch and its bytes). */
void fmoe_slots_chunk_start(fmoe_slots *q, int32_t s);

/* The piece in flight for slot s has landed. @return 1 when the whole transfer is done
 * (the slot becomes RESIDENT), else 0; also 0 when an access claimed the transfer
 * meanwhile (fmoe_slots_resolve: the executor finishes it as a demand load), so an executor
 * reports a piece only while the slot still holds the transfer it started. */
int fmoe_slots_chunk_done(fmoe_slots *q, int32_t s);

/* The same for an executor whose transfers end at any moment (live I/O threads, under the
 * executor's lock): the piece is counted, and a finished transfer stops being the one under
 * way, but its slot stays LOADING in the cache view until fmoe_slots_apply_landed, which
 * the executor calls at the sync points only (before a gate, before a prefetch makes
 * room), so completions become visible to policies where the simulator makes them
 * visible. An access may claim a landed transfer (FMOE_FIND_STARTED, chunks_left 0). */
int fmoe_slots_chunk_landed(fmoe_slots *q, int32_t s);
void fmoe_slots_apply_landed(fmoe_slots *q);

/* Prefetch transfers queued or started and not done. */
int32_t fmoe_slots_pending(const fmoe_slots *q);

/* The expert in slot s (-1 when free). */
static inline int32_t fmoe_slots_expert(const fmoe_slots *q, int32_t s) {
    return fmoe_slots_view(q)->slot_expert[s];
}

/* ---------------------------------------------------------------- accounting */

/* Counts every prefetched expert still unused as wasted (call once, at the end).
 * @return the per-layer stats, [L], valid until free. */
const fmoe_slots_layer_stats *fmoe_slots_finish(fmoe_slots *q);
const fmoe_slots_layer_stats *fmoe_slots_stats(const fmoe_slots *q);

#endif
