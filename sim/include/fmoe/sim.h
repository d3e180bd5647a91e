/*
 * fmoe/sim.h - the discrete-event simulator (docs/design.md §7). Implemented in sim/.
 *
 *   workload  a trace compiled into the §7.1 access sequence (read once, shared read-only
 *             by every cell of a sweep)
 *   costs     the cost model: transfer = alpha + bytes/beta; per-layer and per-expert
 *             compute from a hardware profile and the model geometry
 *   run       one (policy, cache size, prefetch distance) cell -> fmoe_sim_result
 *   sweep     many cells over threads, results in the order given
 *
 * Timing model (one request at a time, batch 1; docs/design.md §7):
 *   - One compute stream. Each MoE layer of an iteration first spends layer(n, c) (attention,
 *     gate, shared experts), then computes each accessed expert in §7.1 order, each taking
 *     expert(tokens routed to it). The next layer starts when the last expert finished.
 *   - One copy engine, non-preemptive, demand loads ahead of queued prefetches (prefetches
 *     by priority, then FIFO). The demand loads of a layer are issued when its gate is known
 *     (end of layer(n, c)), in access order; a load into a slot whose previous expert is
 *     still computing waits until that compute ends (the expert is pinned while it computes).
 *   - An access computes when the stream reaches it and its weights are there; the wait is
 *     stall time. A miss alone on an idle engine therefore stalls alpha + bytes/beta.
 *   - Requests run back to back from t = 0; TTFT = end of the prefill iteration - request
 *     start; TPOT = (e2e - TTFT) / decode iterations; e2e = last iteration end - start.
 *     With arrival times (fmoe_sim_config.arrival_s) requests are served first come first
 *     served, one at a time: a request starts at max(arrival, end of the previous one);
 *     queue = start - arrival; TTFT and e2e are then measured from the arrival.
 *   - Host-compute lane (fmoe_sim_config.miss_mode, Fiddler / llama.cpp style): a miss may
 *     be computed on the CPU instead of loaded. The host lane runs one expert at a time
 *     from the gate on; the layer ends when both the compute stream and the host lane are
 *     done, and waiting for the host counts as stall. Host-computed experts are not cached.
 *   - Continuous batching (fmoe simulate --batch B, fmoe_sim_workload_batch): up to B
 *     requests run together, scheduled as fmoe serve schedules them (decode tokens first,
 *     then prompt chunks, oldest admitted first, within a budget of tokens per iteration:
 *     fmoe serve --batch-tokens, which its traces record as prefill_chunk). One batched iteration costs, per layer, layer_batch(N, sum n_i*c_i,
 *     sum c_i) over its N tokens and items i of n_i tokens at context c_i, then each
 *     distinct expert once for the tokens of the whole batch routed to it, then the LM head
 *     for the items that yield a token. TTFT = end of the iteration holding the request's
 *     last prompt chunk - arrival; TPOT = (e2e - TTFT) / its decode tokens after the first
 *     (the mean gap between its tokens); e2e = end of its last iteration - arrival; queue
 *     = start of the iteration of its first rows - arrival.
 *   - Served passes (fmoe simulate --batch trace, fmoe_sim_workload_served): the batched
 *     iterations a trace of fmoe serve recorded, costed as above.
 */
#ifndef FMOE_SIM_H
#define FMOE_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "fmoe/geometry.h"
#include "fmoe/hardware.h"
#include "fmoe/policy.h"
#include "fmoe/progress.h"
#include "fmoe/slots.h"
#include "fmoe/trace.h"

/* ---------------------------------------------------------------- workload */

typedef struct fmoe_sim_request {
    int64_t id;
    double arrival_s;
    int32_t prompt_tokens;
    int32_t output_tokens;
    int64_t first_iteration;  /* into iterations[]; batched: that of its first rows */
    int64_t num_iterations;   /* batched: iterations from its first rows to its last */
    /* Batched workloads (fmoe_sim_workload_batch, _served): starts (on_request_start)
     * before iteration admit_iteration, the one of its first rows, and ends
     * (on_request_end) after iteration leave_iteration, the one of its last rows. A request
     * without rows starts and ends at once before admit_iteration (its admission;
     * num_iterations of the workload: after the last) with leave_iteration -1. */
    int64_t admit_iteration;
    int64_t leave_iteration;
} fmoe_sim_request;

typedef struct fmoe_sim_iteration {
    int64_t request;          /* index into requests[] */
    int32_t phase;            /* 0 prefill, 1 decode */
    int32_t num_tokens;       /* n */
    int64_t context;          /* the request's tokens up to and including this iteration */
    int64_t token_begin;      /* into experts[] rows */
    int64_t access_begin;     /* into access_*[]; the iteration's layers follow in order */
    /* Batched workloads only (else 0): the items item_begin.. of items[], their rows
     * gathered at token_begin in item order; `context` is then the largest item context
     * (what live batched iterations report). */
    int64_t item_begin;
    int32_t num_items;
    int32_t yields;           /* items that yield a token: decode, or a prompt's last chunk */
    int64_t kv_context;       /* sum of the items' contexts: KV rows read */
    int64_t token_context;    /* sum of n_i * context_i: attention score work */
} fmoe_sim_iteration;

/* One request's share of a batched iteration. */
typedef struct fmoe_sim_item {
    int64_t request;          /* index into requests[] */
    int32_t phase;            /* 0 prefill chunk, 1 decode token */
    int32_t num_tokens;       /* n_i */
    int64_t context;          /* the request's tokens up to and including this item */
    int32_t last_prompt;      /* 1: the chunk ends the request's prompt (it yields a token) */
} fmoe_sim_item;


typedef struct fmoe_sim_workload {
    int32_t num_layers;       /* L */
    int32_t num_experts;      /* J */
    int32_t top_k;            /* K */
    int64_t expert_bytes;     /* bytes of one routed expert (the largest layer's) */
    int64_t *layer_expert_bytes; /* [L] one expert of each layer, what its transfer moves:
                                    expert_bytes in every layer (init) unless the trace
                                    says otherwise (fmoe_trace_header) */
    int32_t prefill_chunk;    /* a run of prefill tokens is split into iterations of this
                                 many tokens (the trace's prefill_chunk); 0: one iteration.
                                 Set before the first request. */
    int64_t num_requests;
    fmoe_sim_request *requests;     /* [R] */
    int64_t num_iterations;
    fmoe_sim_iteration *iterations; /* [I] */
    int64_t num_tokens;
    uint16_t *experts;        /* [T][L][K] chosen experts, gate order */
    int64_t num_accesses;     /* A */
    uint32_t *access_expert;  /* [A] expert ids l*J+j in §7.1 order */
    uint32_t *access_tokens;  /* [A] tokens of the iteration routed to that expert */
    uint16_t *layer_accesses; /* [I][L] accesses of iteration i at layer l */
    /* build-time capacities and scratch */
    int64_t cap_requests, cap_iterations, cap_tokens, cap_accesses;
    uint64_t *stamp;          /* [J] */
    uint32_t *count;          /* [J] */
    int32_t *order;           /* [J] */
    uint64_t stamp_now;
    /* Gate data, kept only when asked for (fmoe_sim_workload_keep_gates): */
    int32_t probs_kind;       /* FMOE_PROBS_* of probs[]; NONE: not kept */
    float *probs;             /* [T][L][J] gate probabilities, or NULL */
    int32_t speculative_depth; /* S; 0: not kept */
    float *speculative;       /* [T][L][S][J] speculative gate rows, or NULL */
    /* the semantic embeddings the fmoe policies match on, kept with FMOE_SIM_WANT_SEMANTIC */
    int32_t semantic_dim;     /* h; 0: not kept */
    float *semantic;          /* [T][h] or NULL */
    /* the gate inputs a learned predictor reads (promoe), kept by
     * fmoe_sim_workload_read_hidden for policies with FMOE_POLICY_NEEDS_HIDDEN: float32,
     * T·L·h·4 bytes (the trace holds them as float16) */
    int32_t hidden_dim;       /* h; 0: not kept */
    float *hidden;            /* [T][L][h] or NULL */
    /* Continuous batching (fmoe_sim_workload_batch); batch 0: one request per iteration. */
    int32_t batch;            /* B: requests running together at most */
    int32_t batch_tokens;     /* fmoe_sim_workload_batch's budget of an iteration; 0 else */
    int64_t num_items;
    fmoe_sim_item *items;     /* [num_items], iteration by iteration */
    int64_t *admit_order;     /* [R] request indexes in the order they start: by
                                 admit_iteration, then admission order */
    int64_t *leave_order;     /* [R] request indexes in the order they end: by
                                 leave_iteration, then admission order */
    int64_t cap_items;
    /* Kept with FMOE_SIM_WANT_SERVED (unbatched workloads of a trace of fmoe serve): */
    int64_t *served_iteration; /* [T] the server's batched pass each row ran in, or NULL */
} fmoe_sim_workload;

/* What fmoe_sim_workload_read_ex loads beyond routing. */
enum {
    FMOE_SIM_WANT_PROBS = 1u << 0,       /* /tokens/probs, when the trace has them */
    FMOE_SIM_WANT_SPECULATIVE = 1u << 1, /* /tokens/speculative, when the trace has them */
    FMOE_SIM_WANT_SEMANTIC = 1u << 2,    /* /tokens/semantic, when the trace has them */
    FMOE_SIM_WANT_SERVED = 1u << 3,      /* /tokens/served_iteration; an error without */
};

/* Starts an empty workload. @return 0, FMOE_EINVAL (bad geometry), FMOE_ENOMEM. */
int fmoe_sim_workload_init(fmoe_sim_workload *w, int32_t num_layers, int32_t num_experts,
                           int32_t top_k, int64_t expert_bytes);

/* Appends one request of n tokens: phase[n] (FMOE_PHASE_*; each maximal run of prefill
 * tokens is one iteration, or chunks of w->prefill_chunk tokens, each decode token one), experts[n][L][K]. Arrays borrowed for
 * the call. @return 0, FMOE_EFORMAT (expert id >= J; detail names request and token),
 * FMOE_ENOMEM. */
int fmoe_sim_workload_add_request(fmoe_sim_workload *w, int64_t id, double arrival_s,
                                  int32_t prompt_tokens, int32_t output_tokens, int64_t n,
                                  const uint8_t *phase, const uint16_t *experts);

/* Makes the workload keep gate data for the requests added after it: probabilities of
 * kind `probs_kind` (FMOE_PROBS_NONE: none) and `speculative_depth` speculative rows per
 * token and layer (0: none). Call before the first request.
 * @return 0 or FMOE_EINVAL (requests already added, bad kind or depth). */
int fmoe_sim_workload_keep_gates(fmoe_sim_workload *w, int32_t probs_kind,
                                 int32_t speculative_depth);

/* fmoe_sim_workload_add_request with gate data: probs[n][L][J] (required iff the workload
 * keeps probabilities), speculative[n][L][S][J] (required iff it keeps S > 0 rows). */
int fmoe_sim_workload_add_request_gates(fmoe_sim_workload *w, int64_t id, double arrival_s,
                                        int32_t prompt_tokens, int32_t output_tokens, int64_t n,
                                        const uint8_t *phase, const uint16_t *experts,
                                        const float *probs, const float *speculative);

/* Reads every request of an open trace (fmoe/trace.h) into `w` (initialised here from the
 * trace's header). Progress counts requests. @return 0 or the reader's error (detail names
 * the file). */
int fmoe_sim_workload_read(fmoe_sim_workload *w, fmoe_trace_reader *r,
                           const fmoe_progress *progress);

/* As fmoe_sim_workload_read, also loading the gate data in `want` (FMOE_SIM_WANT_*) that
 * the trace has; what it lacks is not kept (the policy that needs it then refuses). */
int fmoe_sim_workload_read_ex(fmoe_sim_workload *w, fmoe_trace_reader *r, uint32_t want,
                              const fmoe_progress *progress);

/* As fmoe_sim_workload_read_ex, reading only the requests r (trace order) with
 * keep[r] != 0; keep NULL reads all (fmoe simulate --holdout). */
int fmoe_sim_workload_read_filtered(fmoe_sim_workload *w, fmoe_trace_reader *r, uint32_t want,
                                    const uint8_t *keep, const fmoe_progress *progress);

/* Adds the gate inputs (/tokens/hidden) of the requests just read from `r` into `w` by
 * fmoe_sim_workload_read_filtered with the same `keep` (NULL: all), as w->hidden [T][L][h]
 * float32. Call before batching. @return 0, FMOE_ENOTFOUND (the trace has no /tokens/hidden; the
 * detail says to record with fmoe record --hidden), FMOE_EINVAL (already batched, or `w`
 * does not hold those requests), FMOE_ENOMEM, or the reader's error. */
int fmoe_sim_workload_read_hidden(fmoe_sim_workload *w, fmoe_trace_reader *r,
                                  const uint8_t *keep);

/* Opens `path`, reads it as above, closes it. */
int fmoe_sim_workload_load_trace(fmoe_sim_workload *w, const char *path,
                                 const fmoe_progress *progress);

void fmoe_sim_workload_free(fmoe_sim_workload *w); /* zeroed struct or NULL: no-op */

struct fmoe_sim_costs;

/* Compiles `in` (a workload of one request per iteration, read-only here) into `out`
 * (initialised here): the iterations fmoe serve runs with up to `batch` sequences
 * (runtime/serve/serve_engine.c). Requests wait in a FIFO queue in replay order, each
 * from its arrival (arrival_s[R], or all at 0 when NULL); before each iteration the
 * queue's head is admitted while fewer than `batch` run. An iteration holds every running
 * request's next decode row (oldest admitted first), then prompt chunks of the
 * prefilling requests, oldest admitted first, each at most one chunk, until
 * `batch_tokens` tokens; a request leaves after the iteration of its last row. It
 * starts for the policy before the iteration of its first rows (which may come after its
 * admission when older prompts fill the budget), as fmoe serve starts it. Rows are copied in item order (routing, gate data, semantic rows), so the
 * iteration's tokens are contiguous as for unbatched workloads, and the §7.1 accesses of
 * each layer are taken over the concatenated rows: every policy, belady and the oracle
 * included, replays this one access sequence.
 *
 * With arrival times the admissions depend on time. The schedule is then fixed here with
 * the compute-only clock of `costs` (every expert resident, no stall): the iterations of
 * an unstalled server. The executor replays it with stalls, which only delay it (a request
 * is never admitted before it arrives), so a stalling run admits late arrivals at the
 * same iteration as the unstalled server rather than earlier ones - the price of one
 * access sequence for all policies. `costs` may be NULL without arrivals.
 * @return 0, FMOE_EINVAL (batch < 1, batch_tokens < batch: each running request's
 * decode token must fit an iteration, as fmoe serve requires; `in` already batched,
 * arrivals without costs), FMOE_ENOMEM. */
int fmoe_sim_workload_batch(fmoe_sim_workload *out, const fmoe_sim_workload *in,
                            int32_t batch, int32_t batch_tokens, const double *arrival_s,
                            const struct fmoe_sim_costs *costs);

/* Compiles `in` (unbatched, read with FMOE_SIM_WANT_SERVED from a trace of fmoe serve
 * --trace-out; read-only here) into `out` (initialised here): the batched passes the
 * server ran, as its trace records them (fmoe simulate --batch trace). The contract of
 * runtime/serve/serve_engine.c, relied on here:
 *   - the iterations are the distinct served_iteration values in increasing order
 *     (renumbered from 0; passes of requests not in `in` are skipped);
 *   - a pass's items are each running request's decode token, then prompt chunks, each
 *     group in admission order, admission order being the requests' ids (the engine
 *     writes id = admission index; the file holds requests in the order they finished);
 *     an item is a request's rows of one pass;
 *   - a request starts before the pass of its first rows and ends after the pass of its
 *     last, those of one pass in admission order.
 * Rows are gathered and compiled as fmoe_sim_workload_batch does (§7.1 over the
 * concatenated rows); w->batch is the most items a pass held. The arrival times stay the
 * trace's (fmoe simulate --arrivals trace idles the clock until each request's arrival
 * before its first pass; without arrivals the passes run back to back).
 * @return 0, FMOE_EINVAL (no served rows, `in` batched), FMOE_EFORMAT (a request whose
 * rows go back in time or share a pass across a phase change; detail names it),
 * FMOE_ENOMEM. */
int fmoe_sim_workload_served(fmoe_sim_workload *out, const fmoe_sim_workload *in);

/* ---------------------------------------------------------------- cost model */

typedef struct fmoe_sim_costs {
    double alpha_s;
    double beta_bytes_per_s;
    int64_t expert_bytes;
    fmoe_linear_cost layer;   /* measured; else roofline below */
    fmoe_linear_cost expert;
    fmoe_linear_cost head;    /* measured, per token-yielding iteration; absent: 0 */
    fmoe_linear_cost layer_overhead; /* measured, per MoE layer besides its compute (the
                                        backend's small ops and host waits); absent: 0 */
    /* roofline */
    double peak_flops, mem_bw, launch_s;
    double layer_weight_params;   /* attention + router + shared experts, per layer */
    double layer_flops_per_token; /* 2 * layer_weight_params */
    double attn_flops_per_token_ctx; /* 4 * heads * head_dim */
    double kv_bytes_per_ctx;      /* KV cache read per context token */
    double bytes_per_param;
    double expert_params;
    /* host lane (--miss cpu): measured, else a roofline from the host figures */
    fmoe_linear_cost host_expert;
    double host_peak_flops, host_mem_bw;
    /* the matcher's time per match (FMOE_POLICY_MATCHER policies): their prefetches are
     * issued this long after the event that made them. 0: free. */
    double match_delay_s;
    /* a learned predictor's time per pass, by the predictor's kind: promoe's (on the CPU
     * beside inference, ProMoE §4.4) and duoserve's (the ExpertMLP, device work in
     * DuoServe-MoE §4): the policy's prefetches are issued this long after the gate that
     * made them. One token's pass: a prefill gate's longer pass is not modelled. 0: free. */
    double promoe_delay_s, duoserve_delay_s;
} fmoe_sim_costs;

/* Builds the cost model from a profile and the model. `g` may be NULL: then hidden_size
 * (may be 0) and expert_bytes at `dtype_bits` bits per parameter give a rough roofline.
 * @return 0, FMOE_EINVAL (no expert bytes; a profile without compute figures and without a
 * roofline). */
int fmoe_sim_costs_init(fmoe_sim_costs *c, const fmoe_hardware_profile *hw,
                        const fmoe_model_geometry *g, int64_t expert_bytes, int32_t hidden_size,
                        double dtype_bits);

double fmoe_sim_transfer_s(const fmoe_sim_costs *c, int64_t bytes);
/* One MoE layer of `tokens` tokens at context `context`: everything but the routed experts,
 * plus the profile's layer overhead when it has one (docs/design.md §7.1, point 12). */
double fmoe_sim_layer_s(const fmoe_sim_costs *c, int32_t tokens, int64_t context);
double fmoe_sim_expert_s(const fmoe_sim_costs *c, int32_t tokens);
/* The LM head of one iteration that yields a token (0 without a measured head_s). */
double fmoe_sim_head_s(const fmoe_sim_costs *c);
/* One batched iteration's layer (attention, gate, shared experts) over `tokens` tokens:
 * the attention's score work is token_context = sum over items of n_i * context_i, the KV
 * cache read kv_context = sum of context_i, the weights are read once. With one item,
 * fmoe_sim_layer_s(n, c) = fmoe_sim_layer_batch_s(n, n * c, c) up to rounding. The layer
 * overhead, when present, is charged once for all the batch's tokens. */
double fmoe_sim_layer_batch_s(const fmoe_sim_costs *c, int32_t tokens, double token_context,
                              double kv_context);
/* The LM head of a batched iteration with `rows` token-yielding items (0: none). */
double fmoe_sim_head_batch_s(const fmoe_sim_costs *c, int32_t rows);

/* @return 1 when the profile gave host compute figures (measured host.expert_s, or
 * host.peak_flops and host.memory_bandwidth_bytes_per_s). */
int fmoe_sim_costs_have_host(const fmoe_sim_costs *c);
/* One routed expert computed on the host for `tokens` tokens (needs have_host). */
double fmoe_sim_host_expert_s(const fmoe_sim_costs *c, int32_t tokens);

/* ---------------------------------------------------------------- runs */

/* What happens on a miss (an access whose expert is neither resident nor in flight). */
typedef enum fmoe_sim_miss_mode {
    FMOE_SIM_MISS_LOAD = 0, /* demand-load it into the cache (the default) */
    FMOE_SIM_MISS_CPU = 1,  /* compute it on the host lane, uncached (llama.cpp style) */
    FMOE_SIM_MISS_AUTO = 2, /* whichever finishes first, estimated at the gate (Fiddler) */
} fmoe_sim_miss_mode;

typedef struct fmoe_sim_config {
    const char *policy;              /* built-in name, or NULL with `ops` */
    const fmoe_policy_ops *ops;      /* overrides `policy` (tests, plug-ins) */
    int32_t cache_experts;           /* N >= 1 */
    int32_t prefetch_distance;       /* d; 0 = the policy's default (ops->default_distance) */
    const fmoe_sim_costs *costs;
    int32_t miss_mode;               /* fmoe_sim_miss_mode; CPU and AUTO need host costs */
    /* [num_requests] arrival times in seconds, replay order, for FCFS queueing; NULL: each
     * request starts when the previous one ends. Borrowed. */
    const double *arrival_s;
    /* The policy's own settings (fmoe/policy.h: moe-infinity's eamc_capacity, the fmoe
     * policies' store_mode and store_capacity), only keys the policy declares; empty:
     * its defaults. */
    fmoe_policy_settings policy_settings;
    /* the fmoe policies' expert-map store (borrowed, read-only; NULL in online mode) */
    const struct fmoe_expertmap *expert_store;
    /* Pieces per prefetch transfer (0 = 1): a demand load waits only for the piece on the
     * copy engine, not the whole prefetch (fmoe/slots.h). */
    int32_t copy_chunks;
    /* Feedback-directed prefetching (fmoe/slots.h): 0 the policy's default, 1 on, -1 off. */
    int32_t feedback;
    /* A learned predictor (fmoe/predictor.h) for the policies that take one (promoe):
     * borrowed, read-only, shared by a sweep's threads. NULL: none. */
    const struct fmoe_predictor *predictor;
    /* The decision log: called with every decision of the run (single runs; a sweep's
     * cells run on several threads). NULL: none. */
    void (*decision)(void *ctx, const struct fmoe_decision *d);
    void *decision_ctx;
    /* 1: count the misses that wrong prefetches caused (fmoe_sim_result.
     * wrong_prefetch_misses), the part of the gap to Belady that `fmoe simulate
     * --gap-split` attributes to them (docs/simulating.md). 0: not counted (-1). */
    int32_t gap_split;
} fmoe_sim_config;

typedef struct fmoe_sim_layer_stats {
    int64_t accesses, hits, late_hits, misses;
    int64_t bytes_loaded;
    double stall_s;
    int64_t prefetches;       /* prefetch transfers started for experts of this layer */
    int64_t prefetch_hits;    /* hits on a prefetched expert (first access after the load) */
    int64_t wasted_prefetch_bytes;
    int64_t host_misses;      /* misses computed on the host lane */
} fmoe_sim_layer_stats;

typedef struct fmoe_sim_summary {
    double mean, p50, p90, p99;
} fmoe_sim_summary;

typedef struct fmoe_sim_result {
    char policy[32];
    int32_t cache_experts;
    int32_t prefetch_distance;
    int64_t accesses;
    int64_t hits;           /* resident when compute started (prefetch hits included) */
    int64_t late_hits;      /* prefetch still in flight when compute started */
    int64_t misses;         /* demand loads */
    int64_t bypassed;       /* misses computed without caching (no evictable slot) */
    int64_t prefetches;     /* prefetch transfers started */
    int64_t prefetch_hits;  /* hits on an expert brought by a prefetch */
    int64_t bytes_loaded;   /* every byte that crossed the link */
    int64_t wasted_prefetch_bytes; /* prefetched, then evicted or left unused */
    double stall_s;         /* compute stream waiting for weights (or host results) */
    double total_s;         /* end of the last request */
    fmoe_sim_summary ttft_s, tpot_s, e2e_s;
    int32_t num_layers;
    fmoe_sim_layer_stats *per_layer; /* [L], owned */
    /* Prefetch quality; NAN where undefined (no prefetch, or nothing to fetch):
     *   precision = used prefetches / prefetch transfers, used = prefetch hits + late hits
     *   recall    = used / (used + misses): the share of needed loads the prefetcher made
     *   goodpred  = prefetch hits / (used + misses): correct AND in time, ProMoE's
     *               GOODPRED = ACCURACY x FETCHRATE ("ProMoE: Fast MoE-based LLM
     *               Serving using Proactive Caching" §4.1) over the run */
    double prefetch_precision, prefetch_recall, goodpred;
    int64_t host_misses;    /* misses computed on the host lane */
    double host_busy_s;     /* host lane busy time */
    fmoe_sim_summary queue_s; /* FCFS queueing delay per request (0 without arrivals) */
    int32_t miss_mode;
    int32_t variant;        /* the policy variant reported (ops->variants > 1: least stall) */
    fmoe_sim_layer_stats per_phase[2]; /* [0] prefill, [1] decode iterations, all layers */
    int32_t batch;          /* requests run together at most (the workload's batch, or 1) */
    /* With fmoe_sim_config.gap_split: misses of an expert whose last eviction made room for
     * a prefetch not used by the time of the miss; -1 when not counted. */
    int64_t wrong_prefetch_misses;
} fmoe_sim_result;

/* Runs one cell (a policy with several variants, the oracle, runs each and reports the
 * one with the least stall). `out` is owned by the caller, free with fmoe_sim_result_free.
 * @return 0, FMOE_ENOTFOUND (unknown policy; detail lists the valid ones), FMOE_EINVAL
 * (capacity < 1, ...), FMOE_EINTERNAL (a policy broke the contract), FMOE_ENOMEM. */
int fmoe_sim_run(const fmoe_sim_workload *w, const fmoe_sim_config *cfg, fmoe_sim_result *out);

void fmoe_sim_result_free(fmoe_sim_result *r);

/* Runs cells[0..n) on `threads` threads (<= 0: one per core), results in the same order.
 * Progress counts finished cells. On error, the first failing cell's code is returned and
 * every result is freed. */
int fmoe_sim_sweep(const fmoe_sim_workload *w, const fmoe_sim_config *cells, size_t n,
                   int threads, fmoe_sim_result *results, const fmoe_progress *progress);

#endif
