/*
 * fmoe/offload.h - live expert offloading on the CPU backend (docs/design.md §8): the routed
 * experts of a loaded model live in a slow tier, a bounded set of N expert slots is the
 * fast tier, and a policy of lib/policies/ decides what is prefetched and evicted, driven
 * through the same slot protocol as the simulator (fmoe/slots.h), with the same events in
 * the same order. Implemented in runtime/offload/.
 *
 *     fmoe_offload_options o = fmoe_offload_defaults();
 *     o.policy = "lru"; o.cache_experts = 12;
 *     fmoe_offload *x;
 *     fmoe_offload_init(&x, model, &o);
 *     fmoe_session_options so = fmoe_session_defaults();
 *     fmoe_offload_attach(x, &so);                 // installs the model's routing hooks
 *     fmoe_session_init(model, &so, &s);
 *     fmoe_offload_request_begin(x, id, prompt, n);
 *     fmoe_offload_forward(x, s, prompt, n, FMOE_PHASE_PREFILL, NULL, logits);
 *     fmoe_offload_forward(x, s, &next, 1, FMOE_PHASE_DECODE, NULL, logits); ...
 *     fmoe_offload_request_end(x);
 *     fmoe_offload_free(x);
 *
 * Tiers. Slow: `host` copies every routed expert once into RAM; `file` reads each
 * transfer from the safetensors files with pread (O_DIRECT into aligned buffers with
 * direct_io, so a model larger than RAM runs and timings are the device's). Fast: N slots
 * of one routed expert each (its three matrices in the checkpoint's dtype) plus one
 * scratch slot for a miss the policy computes without caching. Everything else of the
 * model (attention, routers, shared experts, norms, embeddings) stays where it is.
 *
 * Copy engine: one I/O thread. Demand loads first, in the order accesses were resolved;
 * then prefetch pieces in the slots' order (a started transfer first, then priority). A
 * transfer into a slot waits until every expert computed from that slot before it has
 * finished (the simulator's slot_free_at). Transfers move in `copy_chunks` pieces, so a
 * demand load waits at most for the piece on the engine.
 *
 * Executor (the thread calling forward): at each MoE layer's gate it applies landed
 * transfers, sends on_gate, resolves every distinct expert in first-appearance order
 * (hit, pending prefetch, or miss: demand load, bypass or host compute) with on_access
 * after each, then the forward pass computes the experts in that order, each waiting for
 * its slot's data (stall time); on_layer_done follows the last. env.now_s is monotonic
 * seconds since init. Policies that need the future (belady, oracle) are refused.
 */
#ifndef FMOE_OFFLOAD_H
#define FMOE_OFFLOAD_H

#include <stdint.h>

#include "fmoe/model.h"
#include "fmoe/policy.h"
#include "fmoe/slots.h"

typedef struct fmoe_offload fmoe_offload;
struct fmoe_expertmap;
struct fmoe_predictor;

typedef enum fmoe_tier_kind {
    FMOE_TIER_AUTO = 0, /* host when the routed experts fit in half the free RAM, else file */
    FMOE_TIER_HOST = 1,
    FMOE_TIER_FILE = 2,
} fmoe_tier_kind;

typedef enum fmoe_offload_miss {
    FMOE_OFFLOAD_MISS_LOAD = 0, /* demand-load a miss into a slot */
    FMOE_OFFLOAD_MISS_CPU = 1,  /* compute a miss from the slow tier, uncached */
    FMOE_OFFLOAD_MISS_AUTO = 2, /* per miss, whichever the cost figures below say ends
                                   first (Fiddler's rule, as simulate --miss auto; the
                                   estimate is in runtime/offload/offload.c's design
                                   comment): a host choice takes MISS_CPU's path */
} fmoe_offload_miss;

/* A compute time for n tokens of one routed expert:
 *     time(n) = base_s + max(floor_s, per_token_s * n)
 * which holds both forms of a hardware profile (fmoe/hardware.h): a measured linear model
 * (floor_s 0) and a roofline (base_s the launch cost, floor_s the weights read once at the
 * memory bandwidth, per_token_s 2 * params / peak FLOP/s). Seconds. */
typedef struct fmoe_offload_cost {
    double base_s;
    double per_token_s;
    double floor_s;
} fmoe_offload_cost;

typedef struct fmoe_offload_options {
    const char *policy;            /* a policy of fmoe_policy_registry without NEEDS_FUTURE */
    int32_t cache_experts;         /* N >= 1; more than L·J is clamped to L·J */
    int32_t prefetch_distance;     /* 0: the policy's default */
    int32_t copy_chunks;           /* pieces per transfer; 0: 4 */
    fmoe_tier_kind tier;
    int32_t direct_io;             /* file tier: O_DIRECT */
    int32_t read_depth;            /* file tier: requests in flight per read, each read
                                      split into segments of at least 256 KiB (0: 4; 1:
                                      one request at a time) */
    /* Where the fast tier's slots live: FMOE_BACKEND_CPU host RAM; FMOE_BACKEND_CUDA
     * device memory, filled over the copy engine's own stream (the session computing
     * from them must use the same backend). */
    fmoe_backend_kind backend;
    int32_t miss;                  /* fmoe_offload_miss */
    int32_t prefill_chunk;         /* tokens per prefill iteration: the session's max_batch
                                      (0: 64) */
    int32_t feedback;              /* feedback-directed prefetching: 0 the policy's default,
                                      1 on, -1 off (fmoe/slots.h) */
    /* fmoe policies: the store (borrowed); how they use it is their settings' word */
    const struct fmoe_expertmap *expert_store;
    /* The policy's own settings (fmoe/policy.h: the fmoe policies' store_mode and
     * store_capacity, ...), only keys the policy declares; empty: its defaults. */
    fmoe_policy_settings policy_settings;
    /* A learned expert predictor (fmoe/predictor.h) for the policies that read gate inputs
     * (FMOE_POLICY_NEEDS_HIDDEN: promoe), borrowed for the executor's lifetime; NULL: none.
     * Such a policy is handed each gate's input rows rounded to float16 and back, the
     * values a trace recorded with --hidden holds (the simulator's, and the predictor's
     * training data), so live and simulated runs decide alike bit for bit. */
    const struct fmoe_predictor *predictor;
    /* The gate probabilities and speculative gates the policy is handed: 0 (the default)
     * rounded to float16 and back, the values a trace recorded without --probs-f32 stores;
     * 1 float32 as computed, as a --probs-f32 trace stores them. Either way the policy sees
     * what the run's trace holds, so `fmoe simulate` of it decides alike bit for bit. The
     * forward pass's own routing always uses the float32 values. */
    int32_t probs_f32;
    /* Every transfer completion is waited for at the sync points (before each gate and
     * before each prefetch makes room), so the decisions do not depend on the link's
     * speed: the live counterpart of a simulation with zero-time transfers, for the
     * decision-log identity test. Slower; off by default. */
    int32_t sync_transfers;
    /* The policies that predict beside inference (fmoe's matcher, promoe's predictor):
     * 0 on a thread of their own (fMoE §4.3, ProMoE §4.4; no layer waits for them, their
     * prefetches come when the predictions are done), 1 inline at each gate, as the
     * simulator runs them, so decisions do not depend on their speed (the decision-log
     * identity). Tests may slow the thread with FMOE_FAULT_PREDICT_DELAY_MS=ms per
     * prediction. */
    int32_t sync_predictions;
    /* FMOE_OFFLOAD_MISS_AUTO's figures, for this model's routed expert, from a hardware
     * profile (the CLI reads `fmoe calibrate`'s with the simulator's cost model and passes
     * the numbers; runtime/ does not link sim/). Unused by the other modes. */
    double link_alpha_s;           /* seconds per copy from the slow tier (>= 0) */
    double link_bytes_per_s;       /* the slow tier's copy rate (> 0) */
    fmoe_offload_cost fast_expert; /* computing an expert from its slot (the profile's
                                      compute.expert_s, or its device roofline) */
    fmoe_offload_cost host_expert; /* computing it from the slow tier, uncached (the
                                      profile's host.expert_s, or its host roofline) */
    /* the decision log (fmoe/decision_log.h), or NULL */
    void (*decision)(void *ctx, const fmoe_decision *d);
    void *decision_ctx;
    /* Writes out what `decision` buffered and says whether it could (0, or a negative
     * code with the detail set): fmoe_decision_log_flush. NULL: nothing to flush. Called by
     * fmoe_offload_flush_decisions, serialised with `decision`. */
    int (*decision_flush)(void *ctx);
} fmoe_offload_options;

fmoe_offload_options fmoe_offload_defaults(void);

/* Writes the decision log's buffered lines out now (options.decision_flush), under the
 * executor's lock, between forward calls: a live run calls it after each iteration or
 * request so that a log that cannot be written (a full disk) stops it there, rather than
 * every request succeeding and the loss showing only at close.
 * @return 0 (also without a log), or the log's first error with its detail. */
int fmoe_offload_flush_decisions(fmoe_offload *x);

/* The tier an executor of `m` given `kind` reads from: kind itself, or for AUTO host when
 * the routed experts fit in half the free RAM, else file (what fmoe_offload_init will
 * open, decided now: a caller that reads from the file tier makes the model's other
 * weights its own first, fmoe_model_own_weights). */
fmoe_tier_kind fmoe_offload_resolve_tier(const fmoe_model *m, fmoe_tier_kind kind);

/* Times reads of m's routed experts from its files exactly as the file tier of a live run
 * reads them (fmoe_offload_options tier FILE, direct_io, read_depth): the link a profile
 * for live offloading from disk should hold (fmoe calibrate --link-file MODEL). Point i
 * is a piece of an expert in pieces[i] pieces (1: whole experts; the pieces --copy-chunks
 * makes), each read at a random layer, expert and piece; a repetition reads each point
 * once, so the drift of a shared disk slows every point alike; at least min_reps
 * repetitions, more until min_seconds have passed (at most 1000). Out: bytes[i] the mean
 * bytes of point i's reads, seconds[i] their mean time with the slowest and fastest tenth
 * left out (a mean: a run's transfers add up; trimmed: one stall of a shared disk is not
 * the link), *reps the repetitions made. @return 0, FMOE_EINVAL (no routed experts, a
 * piece count < 1, n outside [1, 16]), FMOE_EIO (a read failed, named), FMOE_ENOMEM. */
int fmoe_offload_time_file_reads(const fmoe_model *m, int direct_io, int32_t read_depth,
                                 const int32_t *pieces, int32_t n, int32_t min_reps,
                                 double min_seconds, double *bytes, double *seconds,
                                 int32_t *reps);

/* Loads the slow tier and starts the I/O thread. @return 0, FMOE_EINVAL (capacity < 1, an
 * unknown policy: the detail lists the valid ones; MISS_AUTO with a rate <= 0, a negative
 * or non-finite figure), FMOE_EUNSUPPORTED (a policy that needs
 * the future: "belady needs the whole future access sequence: simulate only"), FMOE_EIO
 * (a model file cannot be read; the detail names it), FMOE_ENOMEM. */
int fmoe_offload_init(fmoe_offload **out, const fmoe_model *m, const fmoe_offload_options *o);

/* Stops the I/O thread and frees. NULL is a no-op. */
void fmoe_offload_free(fmoe_offload *x);

/* The capacity in use (after clamping) and a one-line note when it was clamped. */
int32_t fmoe_offload_capacity(const fmoe_offload *x);

/* Installs the routing and expert hooks in session options (one session at a time). */
void fmoe_offload_attach(fmoe_offload *x, fmoe_session_options *so);

/* Request events around a sequence's forward calls. Requests may overlap (a server's
 * sequences batched together): each begin gets the next request index, an end closes the
 * oldest open index, and iterations report the latest begun request while any is open. */
int fmoe_offload_request_begin(fmoe_offload *x, int64_t id, const int32_t *prompt,
                               int32_t prompt_tokens);
int fmoe_offload_request_end(fmoe_offload *x);

/* fmoe_session_forward in iterations: prefill in chunks of prefill_chunk tokens, each its
 * own iteration (docs/design.md §7.1), a decode token one iteration; trace and logits as
 * fmoe_session_forward. @return its error, or the first error of a transfer (the file
 * named) or of the policy. */
int fmoe_offload_forward(fmoe_offload *x, fmoe_session *s, const int32_t *tokens, int32_t n,
                         int32_t phase, const fmoe_forward_trace *trace, float *logits);

/* The expert-map store the policy matches against, with what this run added to it in
 * --store-mode offline-update; NULL for policies without a store. Valid until free. */
const struct fmoe_expertmap *fmoe_offload_expert_store(const fmoe_offload *x);

/* One iteration over a batch (fmoe_session_forward_batch through runner, whose hooks
 * fmoe_offload_attach installed): the policy sees one iteration of all items' tokens
 * (phase decode when every item has n == 1, else prefill; context the largest of the
 * items' positions after it), the semantic rows of all tokens in item order. The caller
 * keeps the total within the prefill chunk (runner's max_batch). Request events are the
 * caller's: fmoe_offload_request_begin/end may bracket overlapping sequences.
 * @return as fmoe_offload_forward (FMOE_EINVAL for items fmoe_session_forward_batch
 *         refuses, nothing computed). */
int fmoe_offload_forward_batch(fmoe_offload *x, fmoe_session *runner,
                               const fmoe_batch_item *items, int32_t count);

/* Totals since init. */
typedef struct fmoe_offload_stats {
    int64_t accesses, hits, late_hits, misses, host_misses, bypassed;
    int64_t prefetches, prefetch_hits, bytes_loaded, wasted_prefetch_bytes;
    double stall_s;            /* the forward pass waiting for expert weights */
    int64_t iterations, decode_iterations;
    /* bytes accesses had to wait for: a miss's expert, the untransferred rest of a
     * prefetch an access claimed (all, and in decode iterations) */
    int64_t awaited_bytes, awaited_bytes_decode;
    /* the copy engine's own measure of the link: bytes its I/O thread copied and the
     * seconds it spent copying them (0 with sync transfers); _decode: of the copies it
     * started during decode iterations */
    int64_t io_bytes;
    double io_busy_s;
    int64_t io_bytes_decode;
    double io_busy_s_decode;
} fmoe_offload_stats;

void fmoe_offload_get_stats(const fmoe_offload *x, fmoe_offload_stats *out);

/* The outcome of each access since the last forward call began, in access order
 * (FMOE_ACCESS_* and 3 for a host-computed miss), for a recorder writing measured
 * outcomes; *n receives the count. Valid until the next forward. */
const uint8_t *fmoe_offload_take_outcomes(fmoe_offload *x, int64_t *n);

/* One expert access of the forward pass. */
typedef struct fmoe_offload_access {
    int32_t layer, expert;   /* (l, j) */
    uint8_t outcome;         /* FMOE_ACCESS_MISS/HIT/LATE_HIT, or 3 for a host-computed miss */
    uint8_t prefetched;      /* 1: served by a prefetch (a hit on prefetched data, or late) */
    double stall_s;          /* the forward pass waited this long for its weights */
} fmoe_offload_access;

/* The accesses since the last forward call (fmoe_offload_forward or _forward_batch) began,
 * in access order: per iteration and MoE layer, the layer's distinct experts in order of
 * first appearance. *n receives the count. Valid until the next forward; executor thread. */
const fmoe_offload_access *fmoe_offload_take_accesses(fmoe_offload *x, int64_t *n);

/* Per MoE layer, since init. Sums over layers equal fmoe_offload_stats' hits, late_hits,
 * misses, host_misses, prefetches, bytes_loaded and stall_s; prefetch_hits counts late
 * hits too, so its sum is the stats' prefetch_hits + late_hits. */
typedef struct fmoe_offload_layer_stats {
    int64_t hits, late_hits, misses, host_misses; /* misses include host_misses */
    int64_t prefetches;      /* prefetch transfers started (or promoted by an access) */
    int64_t prefetch_hits;   /* accesses served by a prefetch: a prefetched expert's first
                                use (hit), or a prefetch still in flight (late hit) */
    int64_t bytes_loaded;    /* every byte moved into the layer's slots */
    int64_t resident;        /* experts of the layer resident now (transfers complete) */
    double stall_s;          /* the forward pass waiting for the layer's experts */
} fmoe_offload_layer_stats;

/* out[0..L) (L = MoE layers). Thread safe: takes the executor's lock, so it may be called
 * from any thread (a metrics endpoint) while forward calls run; a call during a forward
 * pass sees a consistent snapshot between two hook events. */
void fmoe_offload_get_layer_stats(const fmoe_offload *x, fmoe_offload_layer_stats *out);

#endif
