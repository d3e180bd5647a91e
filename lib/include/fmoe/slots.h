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
 *   - access resolution in the §7.1 order: hit, pending prefetch (queued: promoted to a
 *     demand load; started: waited for), or miss (a demand load with its victim, or a
 *     bypass when the policy wants nothing evicted);
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
 * iteration on_iteration_start; per layer: on_gate at the gate, then for each distinct
 * expert in order of first appearance the access is resolved (a miss's choose_victim
 * first) and on_access follows; on_layer_done; then on_iteration_end; on_request_end.
 * choose_victim is also called synchronously from inside sink->prefetch, with a request of
 * kind FMOE_LOAD_PREFETCH. Transfer completion is NOT an event a policy sees: it changes
 * only the cache view (a LOADING slot becomes RESIDENT, hence evictable), and executors
 * apply completions at two points only: before a layer's gate and before making room for
 * a prefetch (fmoe_slots_hooks.sync). A live executor therefore makes the simulator's
 * choices whenever the same transfers have completed at those points.
 *
 * Not thread safe: one executor thread calls everything; a live executor's I/O threads
 * report completions to it, and it applies them through fmoe_slots_chunk_done.
 */
#ifndef FMOE_SLOTS_H
#define FMOE_SLOTS_H

#include <stdint.h>

#include "fmoe/cache.h"
#include "fmoe/policy.h"

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
    int64_t expert_bytes;            /* bytes of one routed expert */
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

/* The gate of MoE layer l chose distinct[0..n) (first-appearance order). Executors call
 * it at every gate, after the sync and before the policy's on_gate; with feedback it
 * scores the predictions and evictions that concern layer l and cancels layer l's queued
 * prefetches of experts not chosen. */
void fmoe_slots_gate(fmoe_slots *q, int32_t l, const int32_t *distinct, int32_t n);

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

/* Looks expert e up for an access and claims it: a QUEUED prefetch leaves the prefetch
 * queue (the executor loads it as a demand load, counted as a prefetch transfer), a QUEUED
 * or STARTED one becomes RESIDENT in the cache view (the access owns it; its compute waits
 * for the transfer). Counts prefetch hits on RESIDENT prefetched experts. */
fmoe_slot_access fmoe_slots_access(fmoe_slots *q, int32_t e);

/* ProMoE's reordered compute ("ProMoE: Fast MoE-based LLM Serving using Proactive
 * Caching" §5.3): the order to resolve and compute
 * layer l's distinct experts in, after its gate: the resident ones first, then those whose
 * transfer is under way (or has landed), then the rest (queued prefetches, misses), each
 * group in order of first appearance. order[q] receives an index into distinct[0..n).
 * Reads the slots only. */
void fmoe_slots_compute_order(const fmoe_slots *q, int32_t l, const int32_t *distinct,
                              int32_t n, int32_t *order);

/* A miss loaded on demand: makes room (choose_victim with FMOE_LOAD_DEMAND) and puts e in
 * the freed slot as RESIDENT, counting its bytes. @return the slot, or -1 when the policy
 * wants nothing evicted or nothing is evictable (a bypass: the executor loads the expert
 * into scratch and computes it uncached), or -1 with fmoe_slots_error set. */
int32_t fmoe_slots_demand(fmoe_slots *q, int32_t e);

/* Whether the policy asked for the next miss of e to be computed on the host; clears the
 * request. */
int fmoe_slots_take_host(fmoe_slots *q, int32_t e);

/* Records an access in the cache's bookkeeping (its slot, or uncached: slot -1) and logs
 * it. Call once per access, after its compute is placed, before on_access. */
void fmoe_slots_touch(fmoe_slots *q, int32_t e, int32_t slot, fmoe_access_result result,
                      int on_host, double now);

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
 * meanwhile (fmoe_slots_access: the executor finishes it as a demand load), so an executor
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
