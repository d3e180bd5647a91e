/*
 * offload.c - the live executor (fmoe/offload.h): a policy of lib/policies/ driven through
 * lib/slots.c while the model runs, with real slots and a real copy engine.
 *
 * Threads. The executor thread is the one running the forward pass: its routing hook
 * runs the per-layer sequence of lib/slots.c (fmoe_slots_run_layer: the policy events and
 * the layer's accesses, with this executor's demand jobs plugged in); its expert hooks
 * wait for a slot's data and release the slot after the compute, and the last one sends
 * on_layer_done. The I/O thread moves bytes from the
 * slow tier (expert_tier.c) into slots. Both share `mu`: the slot protocol, the demand
 * queue and the per-slot data state are touched only under it; bytes are copied outside.
 *
 * Per slot (N slots + one scratch slot for bypassed misses, index N):
 *   data_expert[s]   the expert whose bytes are complete in the slot, -1 while a transfer
 *                    writes into it; compute waits for data_expert[s] == e
 *   holds_taken[s], holds_released[s]
 *                    one hold per access resolved to the slot, released when that
 *                    expert's compute ends (in resolution order). A transfer into the slot
 *                    may start once every hold taken before it was queued is released:
 *                    the bytes of an expert still to be computed are never overwritten
 *                    (the simulator's slot_free_at).
 *
 * A demand job is (slot, expert, first piece, holds needed); the I/O thread serves the
 * demand queue in order (head-of-line, as the simulator's engine waits for a slot), then
 * prefetch pieces in the order fmoe_slots_next_prefetch gives. A prefetch claimed by an
 * access while a piece is in flight is finished by a demand job from its first piece not
 * landed (the piece in flight may be copied twice; fmoe_slots_chunk_landed ignores it).
 *
 * --miss auto (Fiddler, Kamahori et al. 2024, §4; docs/design.md §7's host lane): at the
 * gate, a miss is computed on the host when that is estimated to end before a demand load plus
 * the compute from the slot, from a hardware profile's figures (fmoe_offload_options):
 *     load_end = max(engine_free + alpha + expert_bytes / rate, lane) + fast(tokens)
 *     host_end = lane + host(tokens)
 * engine_free is when the I/O thread will have finished what is ahead of a new demand job:
 * the rest of the copy on the engine now (its estimated length less the time it has run)
 * and every queued demand job (alpha + its remaining bytes / rate each). Prefetches that
 * have not started do not count: demand jobs go first. A demand job whose slot still
 * holds an expert to compute waits longer than this says (head-of-line); not modelled.
 * `lane` is where the simulator has two resources and we have one: the simulator's host
 * lane (host_free) is a CPU beside the GPU's compute stream (compute_free), but here the
 * host compute runs inline on the executor thread, the same thread that computes every
 * expert from its slot, in resolution order. So both estimates start from one lane: the
 * estimated end of the layer's experts resolved before this one (each at max(lane, its
 * data's estimated arrival) + its compute, host or fast). A host choice is then never
 * free: it delays every later expert of the layer, which the simulator's separate lane
 * would not charge. The figures are estimates from a profile, not measurements of this
 * run; only the choice depends on them, never the output.
 *
 * Device slots (fmoe_offload_options.backend = FMOE_BACKEND_CUDA: a backend table whose
 * host_memory is 0; fmoe__offload_init_backend takes any table, for tests). With the CPU
 * table none of this applies: the slots are host memory, the tier reads into them and the
 * forward pass reads them in place, exactly as before device slots existed.
 *   Buffers. At init, before the I/O thread starts, the executor creates a context of
 *   its own (bctx: its own copy stream; compute limits of one row, which it never uses),
 *   and from it one allocation of (N+1)·slot_stride device bytes: the N slots and the
 *   scratch slot, laid out as host slots would be, so fmoe__expert_tier_view describes a
 *   device slot from its address (pointer arithmetic only; on_expert sets on_device);
 *   then one fence per slot (fences[s], model_impl.h's slot fences; below).
 *   The host tier's block is pinned (host_register; its size in pinned RAM, once) and
 *   write_slot copies each piece's runs straight from it: one copy per piece, a DMA. The
 *   file tier reads a piece into `staging`, one pinned host slot (4096-aligned for
 *   O_DIRECT, the I/O thread's alone) at the offsets it has in a slot, then write_slot
 *   copies exactly those runs (fmoe__expert_tier_ranges) to the device slot: two copies
 *   (disk or page cache to staging, then a DMA). A pin that fails is logged and the copies
 *   run from pageable memory (correct, slower). fmoe_offload_free joins the I/O thread
 *   first, then releases in reverse order: the fences, the slots, the staging pin and
 *   buffer, the block's pin, the context; the tier that owns the block closes after.
 *   No compute reads a slot before its bytes landed: write_slot returns only once the
 *   copy has landed, the I/O thread sets data_expert[s] = e after the last piece's
 *   write_slot returned (under mu), and on_expert waits for data_expert[s] == e: the same
 *   protocol as host slots, unchanged.
 *   No slot is overwritten while the device reads it, and the executor thread never waits
 *   for those reads: the compute is queued on the session's stream when on_expert_done comes, so
 *   the order is kept on the device, by slot s's fence. on_expert hands fences[s] in the
 *   view; the forward pass queues the expert's ops from slot s, records the fence after
 *   them on the session's context (fence_record: everything queued so far that reads the
 *   slot) and only then calls on_expert_done, which releases the hold under mu. The I/O
 *   thread starts a transfer into s only once every hold taken before it was queued is
 *   released (holds, above), which it reads under mu, and each of its copies into s
 *   begins with fence_wait(bctx, fences[s]) (copy_to_device), so bctx's copy stream
 *   waits on the device for the fence's latest record before write_slot's bytes go.
 *   That record is the one after the last read of the old expert, in host order:
 *   record, then release under mu, then the I/O thread sees the release under mu, then
 *   the wait. A later record belongs to the slot's new expert, whose compute starts
 *   only at data_expert[s] == e, after the transfer's last write_slot returned, so it
 *   never comes between. A slot never read has a fence never recorded, which waits for
 *   nothing. (A view without a fence, from another executor, makes the pass sync.)
 *   Misses computed on the host (--miss cpu, auto's host choice) are handed the model's
 *   own weights as a host view (on_device 0), which the pass runs on its host lane (the
 *   CPU backend); "run the model's weights" (on_expert's 1, the CPU slots' answer) would
 *   make a device backend copy the expert into its weight cache for good.
 *   Cost: per expert computed from a slot, one fence record on the compute stream; per
 *   copy, one stream wait on bctx's copy stream. No host round trip, and the compute
 *   stream never drains for a slot. Copies overlap compute (the I/O thread issues them on
 *   bctx's copy stream); only a copy into a slot whose old expert's compute is still
 *   queued waits, on the device, for exactly that compute (and the I/O thread, in
 *   write_slot until the bytes land, with it).
 *   Decisions, sync_transfers and the stats do not depend on where slots are; a
 *   write_slot or fence_wait failure is a failed transfer, as a failed read (io_fail: the next forward
 *   returns it). The session must compute on the slots' backend (a CPU session would
 *   read device addresses); nothing gives the executor a session's backend to check.
 */
#include "fmoe/offload.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/error.h"
#include "half.h"
#include "fmoe/log.h"
#include "fmoe/policy.h"
#include "fmoe/predictor.h"
#include "fmoe/trace.h"
#include "monotonic.h"
#include "expert_tier.h"
#include "offload_impl.h"

typedef struct demand_job {
    int32_t slot;      /* 0..N (N: scratch) */
    int32_t expert;    /* id l*J+j */
    int32_t first;     /* first piece to copy */
    uint64_t need;     /* holds_released[slot] must reach this */
} demand_job;

struct fmoe_offload {
    const fmoe_model *m;
    fmoe_offload_options opt;
    int32_t L, J, K, N, chunks;
    int64_t expert_bytes;      /* the largest layer's expert (a slot's contents) */
    const int64_t *layer_bytes; /* [L] one expert of each layer: what its transfer moves */
    int64_t slot_stride;       /* bytes of one slot (the tier's layout) */
    fmoe_expert_tier *tier;
    fmoe_policy policy;
    fmoe_slots *slots;
    fmoe_policy_env *env;
    uint8_t *slot_mem;         /* [N+1][slot_stride], 4096-byte aligned (O_DIRECT); host
                                  slots only */
    /* device slots (the design comment's "Device slots") */
    const fmoe__backend_ops *be; /* the slots' backend: fmoe__cpu_backend or a device's */
    int device;                /* !be->host_memory: the slots are backend memory */
    void *bctx;                /* the executor's context (its copy stream) */
    uint8_t *dev_slots;        /* [N+1][slot_stride] backend memory (never read here) */
    void **fences;             /* [N+1] slot s's fence: recorded by the pass after each
                                  compute from s, waited for by copies into s */
    uint8_t *host_block;       /* the host tier's block, copied from directly, or NULL */
    int block_pinned;
    uint8_t *staging;          /* file tier: [slot_stride] a piece at its slot offsets */
    int staging_pinned;
    double t0;                 /* monotonic seconds at init */

    pthread_mutex_t mu;
    pthread_cond_t io_cv;      /* the I/O thread waits for work */
    pthread_cond_t exec_cv;    /* the executor waits for data or an idle engine */
    pthread_t io;
    int io_started;
    int stop;
    int io_idle;               /* the I/O thread found nothing it could do */
    int io_error;              /* a transfer failed (detail in io_detail) */
    double io_busy_s;          /* seconds the I/O thread spent copying, in all */
    int64_t io_bytes;          /* bytes it copied */
    double io_busy_s_decode;   /* the same for the copies started in decode iterations */
    int64_t io_bytes_decode;
    char io_detail[256];
    int32_t *data_expert;      /* [N+1] */
    uint64_t *holds_taken;     /* [N+1] */
    uint64_t *holds_released;  /* [N+1] */
    demand_job *dq;            /* ring of capacity dq_cap */
    int32_t dq_cap, dq_head, dq_len;
    int64_t io_copy_bytes;     /* bytes of the copy on the engine now (0: none) */
    double io_copy_t0;         /* its start, clock_of seconds */

    /* the layer being computed */
    int32_t cur_layer;
    int32_t *cur_slot;         /* [J] slot of expert j's access in this layer; -1 host; -2 none */
    int32_t cur_pending;       /* accesses of the layer not computed yet */
    int64_t *cur_access;       /* [J] index in accesses of expert j's access in this layer */
    double lane_s;             /* --miss auto: estimated end (clock_of seconds) of the
                                  layer's computes resolved so far, on the executor thread */
    int64_t cur_first_record;  /* index in accesses of the layer's first access */
    int cur_queued;            /* a demand job was pushed for the access being resolved */
    fmoe_slots_executor exec;  /* this executor's part of each layer (exec_*) */
    int32_t phase;
    int64_t iteration;
    int64_t requests_begun;    /* request_begin calls: the next request's index */
    int64_t requests_ended;
    int32_t in_request;        /* requests begun and not ended (they may overlap) */

    /* events */
    float *semantic;           /* [cap_semantic_tokens][h] embeddings for events */
    int64_t cap_semantic_tokens;
    int32_t semantic_dim;      /* h when the policy wants embeddings, else 0 */
    float *hidden;             /* [cap_hidden_tokens][h] a gate's input rows as float16
                                  would hold them (policies with NEEDS_HIDDEN) */
    int64_t cap_hidden_tokens;
    int32_t hidden_dim;        /* h when the policy reads gate inputs, else 0 */
    float *probs;              /* [cap_probs_tokens][J] a gate's probabilities as float16
                                  would hold them (unless opt.probs_f32) */
    int64_t cap_probs_tokens;
    float *speculative;        /* [cap_spec_tokens][depth·J] its speculative gates, the same */
    int64_t cap_spec_tokens;

    fmoe_offload_stats st;
    fmoe_offload_layer_stats *lst; /* [L] the executor's per-layer counts (the slots' own
                                      and residency are added when read); under mu */
    fmoe_offload_access *accesses; /* [cap_accesses] since the forward call began */
    uint8_t *outcomes;         /* [cap_accesses] their outcomes, for take_outcomes */
    int64_t n_accesses, cap_accesses;
    int error;                 /* first executor-side error */
};

static double clock_of(const fmoe_offload *x) { return fmoe__now_s() - x->t0; }

/* Fault injection for the prediction-thread tests: FMOE_FAULT_PREDICT_DELAY_MS=ms makes
 * each prediction on a policy's thread (fmoe's searches, promoe's predictor passes) take
 * at least that long (a slow predictor must never slow a layer). */
static double fault_predict_delay_s(void) {
    const char *v = getenv("FMOE_FAULT_PREDICT_DELAY_MS");
    const double ms = v ? strtod(v, NULL) : 0;
    return ms > 0 && ms < 1e6 ? ms / 1e3 : 0;
}

int fmoe_offload_flush_decisions(fmoe_offload *x) {
    if (!x || !x->opt.decision_flush) return 0;
    pthread_mutex_lock(&x->mu);
    const int rc = x->opt.decision_flush(x->opt.decision_ctx);
    pthread_mutex_unlock(&x->mu);
    return rc;
}

fmoe_offload_options fmoe_offload_defaults(void) {
    fmoe_offload_options o;
    memset(&o, 0, sizeof o);
    o.policy = "lru";
    o.copy_chunks = 4;
    o.prefill_chunk = 64;
    return o;
}

/* ------------------------------------------------------------------ the I/O thread */

/* Slot s's bytes: host memory, or a device slot's address (only handed on, never read). */
static uint8_t *slot_bytes(const fmoe_offload *x, int32_t s) {
    return (x->device ? x->dev_slots : x->slot_mem) + (size_t)s * (size_t)x->slot_stride;
}


/* Bytes of expert e (an id l*J+j): its layer's. */
static int64_t expert_bytes_of(const fmoe_offload *x, int32_t e) {
    return x->layer_bytes[e / x->J];
}

/* Bytes of pieces [first, last) of expert e. */
static int64_t job_bytes(const fmoe_offload *x, int32_t e, int32_t first, int32_t last) {
    int64_t lo, hi, lo2, hi2;
    fmoe__piece_range(expert_bytes_of(x, e), x->chunks, first, &lo, &hi);
    fmoe__piece_range(expert_bytes_of(x, e), x->chunks, last - 1, &lo2, &hi2);
    return hi2 - lo;
}

/* Bytes [offset, offset + bytes) of expert (l, j) into device slot s: from the host
 * block, or read into staging first; then write_slot of exactly their runs, each
 * returning once landed, behind the wait for the slot's fence (the device's reads of the
 * expert before: the design comment's "Device slots"). I/O thread, outside the lock. */
static int copy_to_device(fmoe_offload *x, int32_t s, int32_t l, int32_t j, int64_t offset,
                          int64_t bytes) {
    int rc = x->be->fence_wait(x->bctx, x->fences[s]);
    if (rc < 0) {
        fmoe_error_prefix("expert (%d, %d) into device slot %d: waiting for its reads", l, j, s);
        return rc;
    }
    const uint8_t *expert = NULL;
    if (x->host_block)
        expert = x->host_block + fmoe__expert_tier_host_offset(x->tier, l, j);
    else
        FMOE_FORWARD_IF_ERROR(fmoe__expert_tier_read(x->tier, l, j, offset, bytes, x->staging));
    fmoe__tier_range r[3];
    const int32_t n = fmoe__expert_tier_ranges(x->tier, l, j, offset, bytes, r);
    for (int32_t i = 0; i < n; i++) {
        const uint8_t *src = expert ? expert + r[i].offset : x->staging + r[i].slot_offset;
        rc = x->be->write_slot(x->bctx, slot_bytes(x, s) + r[i].slot_offset, src, r[i].bytes);
        if (rc < 0) {
            fmoe_error_prefix("expert (%d, %d) into device slot %d", l, j, s);
            return rc;
        }
    }
    return 0;
}

/* Copies pieces [first, last) of expert e into slot s, outside the lock. */
static int copy_pieces(fmoe_offload *x, int32_t s, int32_t e, int32_t first, int32_t last) {
    int64_t lo, hi, lo2, hi2;
    fmoe__piece_range(expert_bytes_of(x, e), x->chunks, first, &lo, &hi);
    fmoe__piece_range(expert_bytes_of(x, e), x->chunks, last - 1, &lo2, &hi2);
    if (x->device) return copy_to_device(x, s, e / x->J, e % x->J, lo, hi2 - lo);
    return fmoe__expert_tier_read(x->tier, e / x->J, e % x->J, lo, hi2 - lo, slot_bytes(x, s));
}

static void io_fail(fmoe_offload *x, int rc) {
    if (x->io_error) return;
    x->io_error = rc;
    snprintf(x->io_detail, sizeof x->io_detail, "%s", fmoe_error_detail());
}

/* Counts the copy that just ended (x->io_copy_bytes, `took` seconds, started in an
 * iteration of `phase`) in the engine's measure of the link, under the lock. Decode's
 * copies are counted apart too: on the CPU a prefill's products keep every core busy and
 * the reader threads wait for one, so the link a decode step sees can be twice the
 * run's average. */
static void io_account(fmoe_offload *x, double took, int32_t phase) {
    x->io_busy_s += took;
    x->io_bytes += x->io_copy_bytes;
    if (phase == FMOE_PHASE_DECODE) {
        x->io_busy_s_decode += took;
        x->io_bytes_decode += x->io_copy_bytes;
    }
    x->io_copy_bytes = 0;
}

/* One unit of work under the lock; @return 0 when there is none the engine may start. */
static int io_step(fmoe_offload *x) {
    if (x->dq_len > 0) {
        const demand_job j = x->dq[x->dq_head];
        if (x->holds_released[j.slot] < j.need) return 0; /* its slot's expert computes */
        x->dq_head = (x->dq_head + 1) % x->dq_cap;
        x->dq_len--;
        x->data_expert[j.slot] = -1;
        x->io_copy_bytes = job_bytes(x, j.expert, j.first, x->chunks);
        x->io_copy_t0 = clock_of(x);
        const int32_t phase = x->phase;
        pthread_mutex_unlock(&x->mu);
        const double t = fmoe__now_s();
        const int rc = copy_pieces(x, j.slot, j.expert, j.first, x->chunks);
        const double took = fmoe__now_s() - t;
        pthread_mutex_lock(&x->mu);
        io_account(x, took, phase);
        if (rc < 0) io_fail(x, rc);
        else x->data_expert[j.slot] = j.expert;
        pthread_cond_broadcast(&x->exec_cv);
        return 1;
    }
    double eligible;
    int32_t piece;
    const int32_t s = fmoe_slots_next_prefetch(x->slots, &eligible, &piece);
    if (s < 0 || x->holds_released[s] != x->holds_taken[s] || clock_of(x) < eligible) return 0;
    const int32_t e = fmoe_slots_expert(x->slots, s);
    if (piece == 0) x->data_expert[s] = -1;
    fmoe_slots_chunk_start(x->slots, s);
    x->io_copy_bytes = job_bytes(x, e, piece, piece + 1);
    x->io_copy_t0 = clock_of(x);
    const int32_t phase = x->phase;
    pthread_mutex_unlock(&x->mu);
    const double t = fmoe__now_s();
    const int rc = copy_pieces(x, s, e, piece, piece + 1);
    const double took = fmoe__now_s() - t;
    pthread_mutex_lock(&x->mu);
    io_account(x, took, phase);
    if (rc < 0) io_fail(x, rc);
    else if (fmoe_slots_chunk_landed(x->slots, s)) x->data_expert[s] = e;
    pthread_cond_broadcast(&x->exec_cv);
    return 1;
}

static void *io_main(void *arg) {
    fmoe_offload *x = arg;
    pthread_mutex_lock(&x->mu);
    while (!x->stop) {
        if (!x->io_error && io_step(x)) continue;
        x->io_idle = 1;
        pthread_cond_broadcast(&x->exec_cv);
        /* a prefetch waiting for its matcher delay: look again soon */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&x->io_cv, &x->mu, &ts);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

static void wake_io(fmoe_offload *x) {
    x->io_idle = 0;
    pthread_cond_signal(&x->io_cv);
}

/* ------------------------------------------------------------------ slot hooks (under mu) */

/* Applies the landed transfers; with sync_transfers first waits until the engine has
 * nothing it may start. */
static void hook_sync(void *ctx, double now) {
    (void)now;
    fmoe_offload *x = ctx;
    if (x->opt.sync_transfers) {
        wake_io(x);
        while (!x->io_idle && !x->io_error) pthread_cond_wait(&x->exec_cv, &x->mu);
    }
    fmoe_slots_apply_landed(x->slots);
}

static void hook_queued(void *ctx) { wake_io(ctx); }

/* The link's busy seconds for feedback-directed prefetching; with sync_transfers the run
 * stands for one whose transfers take no time (the identity test's simulation), so 0. */
static double hook_link_busy(void *ctx) {
    const fmoe_offload *x = ctx;
    return x->opt.sync_transfers ? 0 : x->io_busy_s;
}

static void hook_decision(void *ctx, const fmoe_decision *d) {
    fmoe_offload *x = ctx;
    x->opt.decision(x->opt.decision_ctx, d);
}

static void push_demand(fmoe_offload *x, int32_t s, int32_t e, int32_t first) {
    /* the ring holds at most one job per distinct expert of a layer plus the slots */
    x->dq[(x->dq_head + x->dq_len) % x->dq_cap] =
        (demand_job){s, e, first, x->holds_taken[s]};
    x->dq_len++;
}

static int fail(fmoe_offload *x, int rc) {
    if (!x->error) x->error = rc;
    return rc;
}

/* ------------------------------------------------------------------ model hooks */

/* Records access (l, j) at index `at` of the records (its place in replay order: the
 * layer's first record + its order of first appearance) and counts it in the layer's
 * stats; its stall is added when its compute waits (on_expert). The capacity was reserved
 * for the call (reserve_accesses). */
static void add_access(fmoe_offload *x, int32_t l, int32_t j, int64_t at, uint8_t outcome,
                       int from_prefetch) {
    fmoe_offload_layer_stats *ls = &x->lst[l];
    ls->hits += outcome == FMOE_ACCESS_HIT;
    ls->late_hits += outcome == FMOE_ACCESS_LATE_HIT;
    ls->misses += outcome == FMOE_ACCESS_MISS || outcome == 3; /* a host miss is a miss */
    ls->host_misses += outcome == 3;
    ls->prefetch_hits += from_prefetch;
    x->cur_access[j] = -1;
    if (at >= x->cap_accesses) return;
    x->cur_access[j] = at;
    x->accesses[at] =
        (fmoe_offload_access){.layer = l, .expert = j, .outcome = outcome,
                              .prefetched = (uint8_t)(from_prefetch != 0), .stall_s = 0};
    if (at >= x->n_accesses) x->n_accesses = at + 1;
}

/* Bytes the forward pass will wait for (docs/design.md §9's bound): a miss's whole expert,
 * the rest of a prefetch still in flight. */
static void await_bytes(fmoe_offload *x, int64_t bytes) {
    x->st.awaited_bytes += bytes;
    if (x->phase == FMOE_PHASE_DECODE) x->st.awaited_bytes_decode += bytes;
}

/* A miss or a claimed queued prefetch that waits for the engine while no demand job is
 * queued ahead of it also waits for the rest of the chunk the engine is copying now: a
 * demand load goes ahead of queued prefetches, not of the chunk in progress, which is
 * another transfer's (a claimed started prefetch counts its own chunks above), often a
 * speculative prefetch - the policy's own traffic. Its untransferred part, at the rate the
 * engine has measured so far (the whole chunk before any measure), counts in the awaited
 * bytes too. Stats only: no decision reads them. */
static void await_engine(fmoe_offload *x) {
    if (x->io_copy_bytes <= 0 || x->dq_len > 0) return;
    const double rate = x->io_busy_s > 0 ? (double)x->io_bytes / x->io_busy_s : 0;
    const double done = rate > 0 ? (clock_of(x) - x->io_copy_t0) * rate : 0;
    const double left = (double)x->io_copy_bytes - done;
    if (left > 0) await_bytes(x, (int64_t)left);
}

/* --miss auto's estimates (the design comment at the top), clock_of seconds, under mu. */

static double cost_s(const fmoe_offload_cost *c, int32_t tokens) {
    return c->base_s + fmax(c->floor_s, c->per_token_s * tokens);
}

static double copy_s(const fmoe_offload *x, int64_t bytes) {
    return x->opt.link_alpha_s + (double)bytes / x->opt.link_bytes_per_s;
}

/* When the I/O thread will have done the copy on it now and every queued demand job. */
static double engine_free_at(const fmoe_offload *x, double now) {
    double t = now;
    if (x->io_copy_bytes > 0)
        t += fmax(0, copy_s(x, x->io_copy_bytes) - (now - x->io_copy_t0));
    for (int32_t i = 0; i < x->dq_len; i++) {
        const demand_job *j = &x->dq[(x->dq_head + i) % x->dq_cap];
        t += copy_s(x, job_bytes(x, j->expert, j->first, x->chunks));
    }
    return t;
}

/* Whether a miss routed `tokens` tokens ends sooner computed on the host (Fiddler). */
static int auto_on_host(const fmoe_offload *x, int32_t layer, int32_t tokens, double now) {
    const double ready = engine_free_at(x, now) + copy_s(x, x->layer_bytes[layer]);
    const double load_end = fmax(ready, x->lane_s) + cost_s(&x->opt.fast_expert, tokens);
    const double host_end = x->lane_s + cost_s(&x->opt.host_expert, tokens);
    return host_end < load_end;
}

/* Rows [n][width] of src (row stride `stride`) rounded to float16 and back into *buf (row
 * stride width), grown to n rows as needed. @return *buf, or NULL when memory ran out. */
static const float *round_rows(float **buf, int64_t *cap, const float *src, int64_t stride,
                               int32_t n, int64_t width) {
    if (n > *cap) {
        float *p = realloc(*buf, (size_t)n * (size_t)width * sizeof *p);
        if (!p) return NULL;
        *buf = p;
        *cap = n;
    }
    for (int32_t t = 0; t < n; t++) {
        const float *s = src + (size_t)t * (size_t)stride;
        float *d = *buf + (size_t)t * (size_t)width;
        for (int64_t i = 0; i < width; i++) d[i] = fmoe_half_to_float(fmoe_float_to_half(s[i]));
    }
    return *buf;
}

/* The gate's input rows for a policy that reads them, rounded to float16 and back: the
 * bits a trace recorded with --hidden stores (trace_writer.c's fmoe_float_to_half), which
 * the simulator hands the same policy and the predictor was trained on. Handing the raw
 * float32 rows instead would let a near-tie in the predictor's top-K fall the other way
 * live than in replay, and the decision-log identity would no longer hold. Cost: n·h
 * conversions per gate, only for such policies. @return the rows (stride h), or NULL when
 * the policy reads none or memory ran out (the caller tells them apart). */
static const float *rounded_hidden(fmoe_offload *x, const fmoe_route_event *ev) {
    const int32_t h = x->hidden_dim, n = ev->num_tokens;
    if (h <= 0 || !ev->hidden || n < 1) return NULL;
    return round_rows(&x->hidden, &x->cap_hidden_tokens, ev->hidden, ev->hidden_stride, n, h);
}

/* The gate probabilities and speculative gates the policy sees: what the trace of this run
 * stores. A trace stores them as float16 unless --probs-f32 (opt.probs_f32), and the
 * simulator hands the policy what the trace holds; so, as for the gate inputs above, the
 * live policy is handed the same values rounded to float16 and back, or a near-tie among
 * gate probabilities (fmoe's map matching, a score's ordering) falls one way live and the
 * other in replay (fmoe at 12 slots diverged at decision 251 of 8 requests). The forward
 * pass's own routing is untouched. Cost: n·J (and n·depth·J) conversions per gate. Sets
 * *probs and *spec (NULL where the event has none). @return 0, or FMOE_ENOMEM. */
static int rounded_gates(fmoe_offload *x, const fmoe_route_event *ev, const float **probs,
                         const float **spec, int64_t *probs_stride, int64_t *spec_stride) {
    const int32_t n = ev->num_tokens, J = x->J;
    *probs = ev->probs;
    *spec = ev->speculative;
    *probs_stride = ev->probs_stride;
    *spec_stride = ev->speculative_stride;
    if (x->opt.probs_f32 || n < 1) return 0;
    if (ev->probs) {
        *probs = round_rows(&x->probs, &x->cap_probs_tokens, ev->probs, ev->probs_stride, n, J);
        if (!*probs) return FMOE_ENOMEM;
        *probs_stride = J;
    }
    if (ev->speculative && ev->speculative_depth > 0) {
        const int64_t w = (int64_t)ev->speculative_depth * J;
        *spec = round_rows(&x->speculative, &x->cap_spec_tokens, ev->speculative,
                           ev->speculative_stride, n, w);
        if (!*spec) return FMOE_ENOMEM;
        *spec_stride = w;
    }
    return 0;
}

/* ------------------------------------------------------------------ a layer's accesses */

/* The live executor's part of the per-layer sequence (fmoe_slots_run_layer, whose
 * fmoe_slots_executor these fill), under mu: a demand job for every byte an access still
 * needs, the host path for a miss computed on the host, and the slot each expert's compute
 * will read (cur_slot, on_expert). `now` is the gate's time, env->now_s. */

/* A claimed prefetch: a queued one is loaded whole by a demand job; a started one from
 * its first piece not landed (none left: it has landed, a hit once its bytes are
 * marked complete). */
static fmoe_access_result exec_claimed(void *ctx, const fmoe_slots_resolved *a) {
    fmoe_offload *x = ctx;
    const fmoe_slot_access *f = &a->found;
    const int32_t e = a->layer * x->J + a->expert;
    if (f->found == FMOE_FIND_QUEUED) {
        await_engine(x);
        push_demand(x, f->slot, e, 0);
        x->cur_queued = 1;
        await_bytes(x, expert_bytes_of(x, e));
        return FMOE_ACCESS_LATE_HIT;
    }
    if (f->chunks_left > 0) {
        push_demand(x, f->slot, e, x->chunks - f->chunks_left);
        x->cur_queued = 1;
    }
    await_bytes(x, expert_bytes_of(x, e) * f->chunks_left / x->chunks);
    return x->data_expert[f->slot] == e && f->chunks_left == 0 ? FMOE_ACCESS_HIT
                                                                : FMOE_ACCESS_LATE_HIT;
}

/* The policy's request, --miss cpu, or --miss auto's estimate: one host path. */
static int exec_miss_on_host(void *ctx, const fmoe_slots_resolved *a, int policy_asked) {
    fmoe_offload *x = ctx;
    return policy_asked || x->opt.miss == FMOE_OFFLOAD_MISS_CPU ||
           (x->opt.miss == FMOE_OFFLOAD_MISS_AUTO && auto_on_host(x, a->layer, a->tokens, x->env->now_s));
}

/* A host miss runs inline on the executor thread from the model's own weights
 * (on_expert); nothing to move. */
static void exec_host(void *ctx, const fmoe_slots_resolved *a) {
    (void)a;
    fmoe_offload *x = ctx;
    x->st.host_misses++;
}

/* A demand load into its slot, or into the scratch slot for a bypass. */
static void exec_demand(void *ctx, const fmoe_slots_resolved *a) {
    fmoe_offload *x = ctx;
    int32_t s = a->slot;
    if (s < 0) {
        s = x->N; /* the scratch slot */
        x->st.bypassed++;
    }
    await_engine(x);
    push_demand(x, s, a->layer * x->J + a->expert, 0);
    x->cur_queued = 1;
    await_bytes(x, x->layer_bytes[a->layer]);
}

/* The access's slot for on_expert (a hold on it until its compute ends), its place on
 * --miss auto's lane, its counts and its record. @return the gate's time. */
static double exec_placed(void *ctx, const fmoe_slots_resolved *a) {
    fmoe_offload *x = ctx;
    const double now = x->env->now_s;
    const int32_t s = a->on_host ? -1 : a->slot >= 0 ? a->slot : x->N;
    if (x->opt.miss == FMOE_OFFLOAD_MISS_AUTO) { /* this access's compute on the lane */
        if (a->on_host) x->lane_s += cost_s(&x->opt.host_expert, a->tokens);
        else
            x->lane_s = fmax(x->lane_s, x->cur_queued ? engine_free_at(x, now) : now) +
                        cost_s(&x->opt.fast_expert, a->tokens);
    }
    x->cur_queued = 0;
    if (s >= 0) x->holds_taken[s]++;
    x->cur_slot[a->expert] = s;
    switch (a->result) {
    case FMOE_ACCESS_HIT: x->st.hits++; break;
    case FMOE_ACCESS_LATE_HIT: x->st.late_hits++; break;
    default: x->st.misses++; break;
    }
    x->st.accesses++;
    x->st.prefetch_hits += a->prefetch_hit;
    /* served by a prefetch: a first use of a prefetched expert, or a claimed transfer */
    const int from_prefetch = (a->found.found == FMOE_FIND_RESIDENT && a->found.prefetched) ||
                              a->found.found == FMOE_FIND_QUEUED ||
                              a->found.found == FMOE_FIND_STARTED;
    add_access(x, a->layer, a->expert, x->cur_first_record + a->index,
               a->on_host ? 3 : (uint8_t)a->result, from_prefetch);
    return now;
}

/* The gate of MoE layer ev->layer: the per-layer sequence (fmoe_slots_run_layer;
 * docs/design.md §7.1) with this executor's part (exec_*); on_layer_done follows the
 * layer's last compute (on_expert_done). */
static int on_route(void *ctx, const fmoe_route_event *ev) {
    fmoe_offload *x = ctx;
    const fmoe_policy_ops *ops = x->policy.ops;
    const int32_t l = ev->layer, J = x->J;
    pthread_mutex_lock(&x->mu);
    if (x->io_error) {
        pthread_mutex_unlock(&x->mu);
        return fail(x, fmoe_error_set(x->io_error, "%s", x->io_detail));
    }
    const float *hidden = ops->on_gate ? rounded_hidden(x, ev) : NULL;
    if (ops->on_gate && !hidden && x->hidden_dim > 0 && ev->hidden && ev->num_tokens > 0) {
        pthread_mutex_unlock(&x->mu);
        return fail(x, fmoe_error_set(FMOE_ENOMEM, "gate inputs of %d tokens", ev->num_tokens));
    }
    const float *probs, *spec;
    int64_t probs_stride, spec_stride;
    if (rounded_gates(x, ev, &probs, &spec, &probs_stride, &spec_stride) < 0) {
        pthread_mutex_unlock(&x->mu);
        return fail(x, fmoe_error_set(FMOE_ENOMEM, "gate probabilities of %d tokens",
                                      ev->num_tokens));
    }
    const fmoe_gate_event gev = {
        .layer = l, .num_tokens = ev->num_tokens, .chosen = ev->chosen,
        .chosen_stride = ev->chosen_stride, .probs = probs,
        .probs_stride = probs_stride, .distinct = ev->distinct,
        .num_distinct = ev->num_distinct, .phase = x->phase,
        .probs_kind = ev->probs ? FMOE_PROBS_FULL : FMOE_PROBS_NONE,
        .speculative = spec, .speculative_stride = spec_stride,
        .speculative_depth = ev->speculative ? ev->speculative_depth : 0,
        .group = -1, .position = -1, .hidden = hidden, .hidden_stride = x->hidden_dim,
        .hidden_dim = hidden ? x->hidden_dim : 0};
    for (int32_t j = 0; j < J; j++) x->cur_slot[j] = -2;
    x->cur_layer = l;
    x->cur_pending = ev->num_distinct;
    x->cur_queued = 0;
    /* the layer's records go in replay order (first appearance), whatever the compute
     * order: the gate's first record + the expert's index in distinct */
    x->cur_first_record = x->n_accesses;
    /* the gate's time, taken before the sync (which with sync_transfers waits for the I/O
     * thread): the sequence's events carry it and --miss auto's lane starts there */
    const double now = clock_of(x);
    x->lane_s = now;
    /* ProMoE's reordered compute: resolved and computed in the slots' order (the forward
     * pass follows ev->compute_order) */
    const fmoe_slots_layer layer = {.now = now, .gate = &gev, .tokens = ev->tokens,
                                    .order = ev->compute_order};
    const int rc = fmoe_slots_run_layer(x->slots, &layer, &x->exec);
    if (rc < 0) x->n_accesses = x->cur_first_record; /* no half-recorded layer */
    wake_io(x);
    pthread_mutex_unlock(&x->mu);
    return rc < 0 ? fail(x, rc) : 0;
}

/* The weights of expert (l, j) for its compute: its slot's bytes once they are there; the
 * model's own (the slow tier in place) for a miss computed on the host. */
static int on_expert(void *ctx, int32_t l, int32_t j, fmoe_expert_view *out) {
    fmoe_offload *x = ctx;
    const int32_t s = x->cur_slot[j];
    if (s < 0 && !x->device) return 1; /* host compute: the model's weights, uncached */
    if (s < 0) { /* the same, as a host view: the pass's host lane, never the device */
        fmoe_expert_tensors t;
        const int rc = fmoe_model_expert_tensors(x->m, l, j, &t);
        if (rc < 0) return fail(x, rc);
        *out = (fmoe_expert_view){.gate = t.gate.view, .up = t.up.view, .down = t.down.view};
        out->gate.on_device = out->up.on_device = out->down.on_device = 0;
        return 0;
    }
    const int32_t e = l * x->J + j;
    pthread_mutex_lock(&x->mu);
    if (x->data_expert[s] != e) {
        const double t = fmoe__now_s();
        while (x->data_expert[s] != e && !x->io_error) pthread_cond_wait(&x->exec_cv, &x->mu);
        const double stall = fmoe__now_s() - t;
        x->st.stall_s += stall;
        x->lst[l].stall_s += stall;
        if (x->cur_access[j] >= 0) x->accesses[x->cur_access[j]].stall_s += stall;
    }
    const int bad = x->io_error;
    pthread_mutex_unlock(&x->mu);
    if (bad) return fail(x, fmoe_error_set(x->io_error, "%s", x->io_detail));
    fmoe__expert_tier_view(x->tier, l, j, slot_bytes(x, s), out);
    out->fence = NULL;
    if (x->device) {
        out->gate.on_device = out->up.on_device = out->down.on_device = 1;
        out->fence = x->fences[s];
    }
    return 0;
}

/* Expert (l, j) has been computed: its hold on the slot ends; after the layer's last one,
 * on_layer_done. */
static void on_expert_done(void *ctx, int32_t l, int32_t j) {
    fmoe_offload *x = ctx;
    pthread_mutex_lock(&x->mu);
    const int32_t s = x->cur_slot[j];
    if (s >= 0) x->holds_released[s]++;
    wake_io(x);
    /* the layer is done when its last expert's compute is: a policy error from
     * on_layer_done stops the iteration (run_iteration reads fmoe_slots_error) */
    if (--x->cur_pending == 0) fmoe_slots_layer_done(x->slots, l, clock_of(x));
    pthread_mutex_unlock(&x->mu);
}

/* ------------------------------------------------------------------ init / free */

/* Room for the accesses of `iterations` iterations (at most L·J each), grown before a
 * forward call so that the hooks never allocate. */
static int reserve_accesses(fmoe_offload *x, int64_t iterations) {
    const int64_t need = iterations * x->L * x->J;
    if (need <= x->cap_accesses) return 0;
    fmoe_offload_access *a = realloc(x->accesses, (size_t)need * sizeof *a);
    if (a) x->accesses = a;
    uint8_t *o = a ? realloc(x->outcomes, (size_t)need) : NULL;
    if (o) x->outcomes = o;
    if (!a || !o) return fmoe_error_set(FMOE_ENOMEM, "records of %lld accesses", (long long)need);
    x->cap_accesses = need;
    return 0;
}

/* Device slots: the executor's context, the slots, the host block's pin and the staging
 * slot (the design comment's "Device slots"). Executor thread, before the I/O thread
 * starts. @return 0, the table's error (no device, out of device memory), FMOE_ENOMEM. */
static int device_init(fmoe_offload *x) {
    fmoe_expert_tensors t;
    FMOE_FORWARD_IF_ERROR(fmoe_model_expert_tensors(x->m, 0, 0, &t));
    int64_t cols = t.gate.view.cols > t.up.view.cols ? t.gate.view.cols : t.up.view.cols;
    if (t.down.view.cols > cols) cols = t.down.view.cols;
    /* the model's weight home, as a session's: a backend keeps one per model (the cast as
     * forward.c's: the cache is the model's mutable part) */
    const fmoe__backend_limits lim = {
        .weights = (fmoe__weight_home *)&x->m->backend_weights, .threads = 1,
        .max_cols = cols, .max_batch = 1, .max_context = 1, .max_experts = 1};
    int rc = x->be->init(&lim, &x->bctx);
    if (rc < 0) {
        x->bctx = NULL;
        fmoe_error_prefix("offload: %s context for the expert slots", x->be->name);
        return rc;
    }
    const int64_t n1 = (int64_t)x->N + 1;
    x->dev_slots = x->be->alloc(x->bctx, n1 * x->slot_stride);
    if (!x->dev_slots) {
        fmoe_error_prefix("offload: %lld %s expert slots of %lld bytes", (long long)n1,
                          x->be->name, (long long)x->slot_stride);
        return FMOE_ENOMEM;
    }
    x->fences = calloc((size_t)n1, sizeof *x->fences);
    if (!x->fences) return fmoe_error_set(FMOE_ENOMEM, "offload: %lld slot fences", (long long)n1);
    for (int64_t s = 0; s < n1; s++)
        if (!(x->fences[s] = x->be->fence_new(x->bctx))) {
            fmoe_error_prefix("offload: the fence of %s slot %lld", x->be->name, (long long)s);
            return FMOE_ENOMEM;
        }
    int64_t block_bytes;
    if (fmoe__expert_tier_host_block(x->tier, &x->host_block, &block_bytes)) {
        if (x->be->host_register(x->bctx, x->host_block, block_bytes) == 0) {
            x->block_pinned = 1;
        } else {
            fmoe_log(FMOE_LOG_WARN, "offload: the host tier (%.1f GiB) could not be pinned (%s): "
                     "copies to the %s slots run from pageable memory, slower",
                     (double)block_bytes / (1 << 30), fmoe_error_detail(), x->be->name);
            fmoe_error_clear();
        }
        return 0;
    }
    x->staging = aligned_alloc(4096, (size_t)x->slot_stride); /* a multiple of 4096 */
    if (!x->staging)
        return fmoe_error_set(FMOE_ENOMEM, "offload: staging slot of %lld bytes",
                              (long long)x->slot_stride);
    if (x->be->host_register(x->bctx, x->staging, x->slot_stride) == 0) {
        x->staging_pinned = 1;
    } else {
        fmoe_log(FMOE_LOG_WARN, "offload: the staging slot could not be pinned (%s): copies to "
                 "the %s slots run from pageable memory, slower", fmoe_error_detail(),
                 x->be->name);
        fmoe_error_clear();
    }
    return 0;
}

/* device_init's undoing, in reverse order; after the I/O thread was joined, before the
 * tier (which owns the host block) closes. */
static void device_free(fmoe_offload *x) {
    if (x->bctx) {
        for (int64_t s = 0; x->fences && s <= x->N; s++) x->be->fence_free(x->bctx, x->fences[s]);
        if (x->dev_slots) x->be->release(x->bctx, x->dev_slots);
        if (x->staging_pinned) x->be->host_unregister(x->bctx, x->staging);
        if (x->block_pinned) x->be->host_unregister(x->bctx, x->host_block);
        x->be->free(x->bctx);
    }
    free(x->staging);
    free(x->fences);
    x->bctx = NULL, x->dev_slots = NULL, x->staging = NULL, x->host_block = NULL;
    x->fences = NULL;
}

void fmoe_offload_free(fmoe_offload *x) {
    if (!x) return;
    if (x->io_started) {
        pthread_mutex_lock(&x->mu);
        x->stop = 1;
        pthread_cond_signal(&x->io_cv);
        pthread_mutex_unlock(&x->mu);
        pthread_join(x->io, NULL);
        pthread_mutex_destroy(&x->mu);
        pthread_cond_destroy(&x->io_cv);
        pthread_cond_destroy(&x->exec_cv);
    }
    device_free(x); /* the I/O thread, its only other user, is gone */
    fmoe_slots_free(x->slots);
    fmoe_policy_free(&x->policy);
    fmoe__expert_tier_close(x->tier);
    free(x->slot_mem);
    free(x->data_expert);
    free(x->holds_taken);
    free(x->holds_released);
    free(x->dq);
    free(x->cur_slot);
    free(x->cur_access);
    free(x->semantic);
    free(x->hidden);
    free(x->probs);
    free(x->speculative);
    free(x->lst);
    free(x->accesses);
    free(x->outcomes);
    free(x);
}

int fmoe_offload_init(fmoe_offload **out, const fmoe_model *m, const fmoe_offload_options *o) {
    *out = NULL;
    switch (o->backend) {
    case FMOE_BACKEND_CPU: return fmoe__offload_init_backend(out, m, o, &fmoe__cpu_backend);
    case FMOE_BACKEND_CUDA: {
        const fmoe__backend_ops *be = fmoe__cuda_backend();
        if (!be) return FMOE_EUNSUPPORTED; /* the detail says why */
        return fmoe__offload_init_backend(out, m, o, be);
    }
    }
    return fmoe_error_set(FMOE_EINVAL, "unknown offload backend %d", (int)o->backend);
}

int fmoe__offload_init_backend(fmoe_offload **out, const fmoe_model *m,
                               const fmoe_offload_options *o, const fmoe__backend_ops *be) {
    *out = NULL;
    const fmoe_model_geometry *g = fmoe_model_get_geometry(m);
    FMOE_RETURN_ERROR_IF(o->cache_experts < 1, FMOE_EINVAL,
                         "--cache-experts must be at least 1, got %d", o->cache_experts);
    FMOE_RETURN_ERROR_IF(o->copy_chunks < 0 || o->copy_chunks > 1024, FMOE_EINVAL,
                         "--copy-chunks must be in [1, 1024], got %d", o->copy_chunks);
    FMOE_RETURN_ERROR_IF(o->read_depth < 0 || o->read_depth > 64, FMOE_EINVAL,
                         "--read-depth must be in [1, 64], got %d", o->read_depth);
    const fmoe_policy_ops *ops = fmoe_policy_find(o->policy ? o->policy : "");
    if (!ops)
        return fmoe_error_set(FMOE_EINVAL, "unknown policy '%s' (valid: %s)",
                              o->policy ? o->policy : "", fmoe_policy_names());
    FMOE_RETURN_ERROR_IF(ops->flags & FMOE_POLICY_NEEDS_FUTURE, FMOE_EUNSUPPORTED,
                         "policy %s needs the whole future access sequence, which a live run "
                         "does not have: use it with 'fmoe simulate'", ops->name);
    FMOE_RETURN_ERROR_IF(o->miss < FMOE_OFFLOAD_MISS_LOAD || o->miss > FMOE_OFFLOAD_MISS_AUTO,
                         FMOE_EINVAL, "unknown miss mode %d", o->miss);
    if (o->miss == FMOE_OFFLOAD_MISS_AUTO) {
        const fmoe_offload_cost *c[2] = {&o->fast_expert, &o->host_expert};
        int ok = isfinite(o->link_alpha_s) && o->link_alpha_s >= 0 &&
                 o->link_bytes_per_s > 0 && !isnan(o->link_bytes_per_s);
        for (int i = 0; i < 2; i++)
            ok &= isfinite(c[i]->base_s) && isfinite(c[i]->per_token_s) &&
                  isfinite(c[i]->floor_s) && c[i]->base_s >= 0 && c[i]->per_token_s >= 0 &&
                  c[i]->floor_s >= 0;
        FMOE_RETURN_ERROR_IF(!ok, FMOE_EINVAL,
                             "--miss auto needs a link (alpha %g s >= 0, %g bytes/s > 0) and "
                             "finite non-negative expert compute times", o->link_alpha_s,
                             o->link_bytes_per_s);
    }
    fmoe_offload *x = calloc(1, sizeof *x);
    if (!x) return fmoe_error_set(FMOE_ENOMEM, "offload state");
    x->m = m;
    x->opt = *o;
    x->be = be;
    x->device = !be->host_memory;
    if (x->opt.prefill_chunk <= 0) x->opt.prefill_chunk = 64;
    x->L = g->num_moe_layers;
    x->J = g->num_experts;
    x->K = g->top_k;
    x->N = o->cache_experts < x->L * x->J ? o->cache_experts : x->L * x->J;
    x->chunks = o->copy_chunks > 0 ? o->copy_chunks : 4;
    x->cur_layer = -1;
    x->iteration = -1;
    x->t0 = fmoe__now_s();
    int rc = fmoe__expert_tier_open(&x->tier, m, o->tier, o->direct_io, o->read_depth);
    if (rc < 0) goto fail;
    x->expert_bytes = fmoe__expert_tier_expert_bytes(x->tier);
    x->layer_bytes = fmoe_model_layer_expert_bytes(m);
    x->slot_stride = fmoe__expert_tier_slot_bytes(x->tier);
    int32_t d = o->prefetch_distance;
    /* a learned predictor's stride is its policy's distance (promoe), as in sim/executor.c */
    if (d == 0 && o->predictor && (ops->flags & FMOE_POLICY_NEEDS_HIDDEN))
        d = o->predictor->stride;
    if (d == 0) d = ops->default_distance < 0 ? x->L : ops->default_distance;
    if (d >= x->L && (ops->flags & FMOE_POLICY_PREFETCHES) && ops->default_distance >= 0)
        d = x->L - 1;
    x->semantic_dim = o->expert_store ? g->hidden_size : 0;
    x->hidden_dim = (ops->flags & FMOE_POLICY_NEEDS_HIDDEN) ? g->hidden_size : 0;
    const fmoe_policy_config pc = {
        .num_layers = x->L, .num_experts = x->J, .top_k = x->K, .capacity = x->N,
        .prefetch_distance = d, .probs_kind = FMOE_PROBS_FULL,
        .speculative_depth = (ops->flags & FMOE_POLICY_NEEDS_SPECULATIVE) ? 1 : 0,
        .expert_store = o->expert_store, .settings = &o->policy_settings,
        .semantic_dim = x->semantic_dim, .hidden_dim = x->hidden_dim,
        .predictor = o->predictor,
        .predict_thread = !o->sync_predictions,
        .predict_delay_s = fault_predict_delay_s()};
    if ((rc = fmoe_policy_init_ops(&x->policy, ops, &pc)) < 0) goto fail;
    const fmoe_slots_config sc = {
        .num_layers = x->L, .num_experts = x->J, .capacity = x->N, .chunks = x->chunks,
        .expert_bytes = x->expert_bytes, .layer_expert_bytes = x->layer_bytes,
        .prefetch_delay_s = 0, .policy = &x->policy,
        .hooks = {.ctx = x, .sync = hook_sync, .queued = hook_queued,
                  .decision = o->decision ? hook_decision : NULL,
                  .link_busy_s = hook_link_busy},
        .feedback = fmoe_policy_feedback(ops, o->feedback)};
    if ((rc = fmoe_slots_init(&x->slots, &sc)) < 0) goto fail;
    x->env = fmoe_slots_env(x->slots);
    x->exec = (fmoe_slots_executor){.ctx = x, .claimed = exec_claimed,
                                    .miss_on_host = exec_miss_on_host, .host = exec_host,
                                    .demand = exec_demand, .placed = exec_placed};
    const size_t n1 = (size_t)x->N + 1;
    if (x->device) {
        if ((rc = device_init(x)) < 0) goto fail;
    } else {
        x->slot_mem = aligned_alloc(4096, n1 * (size_t)x->slot_stride);
    }
    x->data_expert = malloc(n1 * sizeof *x->data_expert);
    x->holds_taken = calloc(n1, sizeof *x->holds_taken);
    x->holds_released = calloc(n1, sizeof *x->holds_released);
    x->dq_cap = x->J + x->N + 1;
    x->dq = calloc((size_t)x->dq_cap, sizeof *x->dq);
    x->cur_slot = calloc((size_t)x->J, sizeof *x->cur_slot);
    x->cur_access = calloc((size_t)x->J, sizeof *x->cur_access);
    x->lst = calloc((size_t)x->L, sizeof *x->lst);
    if ((rc = reserve_accesses(x, 1)) < 0) goto fail;
    if ((!x->device && !x->slot_mem) || !x->data_expert || !x->holds_taken ||
        !x->holds_released || !x->dq ||
        !x->cur_slot || !x->cur_access || !x->lst) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%d expert slots of %lld bytes", x->N,
                            (long long)x->expert_bytes);
        goto fail;
    }
    for (size_t s = 0; s < n1; s++) x->data_expert[s] = -1;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->io_cv, NULL);
    pthread_cond_init(&x->exec_cv, NULL);
    if (pthread_create(&x->io, NULL, io_main, x) != 0) {
        pthread_mutex_destroy(&x->mu);
        pthread_cond_destroy(&x->io_cv);
        pthread_cond_destroy(&x->exec_cv);
        rc = fmoe_error_set(FMOE_ENOMEM, "cannot start the I/O thread");
        goto fail;
    }
    x->io_started = 1;
    *out = x;
    return 0;
fail:
    fmoe_offload_free(x);
    return rc;
}

int32_t fmoe_offload_capacity(const fmoe_offload *x) { return x->N; }

void fmoe_offload_attach(fmoe_offload *x, fmoe_session_options *so) {
    so->on_route = on_route;
    so->route_ctx = x;
    so->on_expert = on_expert;
    so->on_expert_done = on_expert_done;
    so->max_batch = x->opt.prefill_chunk;
    if (x->policy.ops->flags & FMOE_POLICY_NEEDS_SPECULATIVE) so->speculative_depth = 1;
}

/* ------------------------------------------------------------------ requests, iterations */

/* Room in x->semantic for n embeddings (policies with a store). */
static int reserve_semantic(fmoe_offload *x, int64_t n) {
    if (n <= x->cap_semantic_tokens) return 0;
    float *p = realloc(x->semantic, (size_t)n * (size_t)x->semantic_dim * sizeof *p);
    if (!p) return fmoe_error_set(FMOE_ENOMEM, "embeddings of %lld tokens", (long long)n);
    x->semantic = p;
    x->cap_semantic_tokens = n;
    return 0;
}

/* Embeddings of tokens[0..n) into x->semantic (policies with a store). */
static int embed(fmoe_offload *x, const int32_t *tokens, int32_t n) {
    if (!x->semantic_dim) return 0;
    FMOE_FORWARD_IF_ERROR(reserve_semantic(x, n));
    return fmoe_model_embed(x->m, tokens, n, x->semantic);
}

/* The request index iterations report: the latest begun while one is open, else the
 * next one's. */
static int64_t current_request(const fmoe_offload *x) {
    return x->in_request > 0 ? x->requests_begun - 1 : x->requests_begun;
}

int fmoe_offload_request_begin(fmoe_offload *x, int64_t id, const int32_t *prompt,
                               int32_t prompt_tokens) {
    FMOE_FORWARD_IF_ERROR(embed(x, prompt, prompt_tokens));
    pthread_mutex_lock(&x->mu);
    x->env->now_s = clock_of(x);
    const fmoe_request_event rev = {.index = x->requests_begun, .id = id,
                                    .prompt_tokens = prompt_tokens,
                                    .semantic = x->semantic_dim ? x->semantic : NULL,
                                    .semantic_dim = x->semantic_dim};
    if (x->policy.ops->on_request_start)
        x->policy.ops->on_request_start(x->policy.state, x->env, &rev);
    x->requests_begun++;
    x->in_request++;
    pthread_mutex_unlock(&x->mu);
    return 0;
}

int fmoe_offload_request_end(fmoe_offload *x) {
    pthread_mutex_lock(&x->mu);
    x->env->now_s = clock_of(x);
    const fmoe_request_event rev = {.index = x->requests_ended, .id = x->requests_ended};
    if (x->in_request > 0) {
        if (x->policy.ops->on_request_end)
            x->policy.ops->on_request_end(x->policy.state, x->env, &rev);
        x->in_request--;
    }
    /* an end without a begin still uses up an index, as a begin would have */
    if (++x->requests_ended > x->requests_begun) x->requests_begun = x->requests_ended;
    pthread_mutex_unlock(&x->mu);
    return x->error;
}

/* The trace's arrays from token t0 on (rows of the chunk). */
static fmoe_forward_trace trace_from(const fmoe_forward_trace *tr, const fmoe_model_geometry *g,
                                     int32_t t0, int32_t S) {
    fmoe_forward_trace o = *tr;
    const int64_t L = g->num_moe_layers, K = g->top_k, J = g->num_experts, h = g->hidden_size;
    if (o.experts) o.experts += t0 * L * K;
    if (o.weights) o.weights += t0 * L * K;
    if (o.probs) o.probs += t0 * L * J;
    if (o.semantic) o.semantic += t0 * h;
    if (o.speculative) o.speculative += t0 * L * S * J;
    if (o.hidden) o.hidden += t0 * L * h;
    return o;
}

/* What one iteration runs: one sequence's chunk (session) or a batch (items). */
typedef struct iteration_work {
    fmoe_session *session;            /* fmoe_session_forward's, or the batch's runner */
    const int32_t *tokens;            /* the chunk (session) */
    const fmoe_forward_trace *trace;
    float *logits;
    const fmoe_batch_item *items;     /* the batch, or NULL */
    int32_t count;
} iteration_work;

/* One iteration of `num_tokens` tokens whose embeddings are in x->semantic: the policy's
 * iteration events around the forward pass, the iteration counts and the slots' error.
 * `context` is what the iteration event reports (fmoe_iteration_event.context). */
static int run_iteration(fmoe_offload *x, int32_t phase, int32_t num_tokens, int64_t context,
                         const iteration_work *w) {
    pthread_mutex_lock(&x->mu);
    x->phase = phase;
    x->iteration++;
    fmoe_slots_set_iteration(x->slots, x->iteration);
    const fmoe_iteration_event iev = {
        .request = current_request(x), .phase = phase, .num_tokens = num_tokens,
        .context = context, .semantic = x->semantic_dim ? x->semantic : NULL,
        .semantic_dim = x->semantic_dim, .group = -1, .position = -1};
    x->env->now_s = clock_of(x);
    if (x->policy.ops->on_iteration_start)
        x->policy.ops->on_iteration_start(x->policy.state, x->env, &iev);
    pthread_mutex_unlock(&x->mu);
    int rc = w->items ? fmoe_session_forward_batch(w->session, w->items, w->count)
                      : fmoe_session_forward(w->session, w->tokens, num_tokens, w->trace,
                                             w->logits);
    if (rc < 0) return x->error ? x->error : rc;
    pthread_mutex_lock(&x->mu);
    x->env->now_s = clock_of(x);
    if (x->policy.ops->on_iteration_end)
        x->policy.ops->on_iteration_end(x->policy.state, x->env, &iev);
    x->st.iterations++;
    x->st.decode_iterations += phase == FMOE_PHASE_DECODE;
    rc = fmoe_slots_error(x->slots);
    pthread_mutex_unlock(&x->mu);
    return rc < 0 ? fail(x, rc) : 0;
}

int fmoe_offload_forward(fmoe_offload *x, fmoe_session *s, const int32_t *tokens, int32_t n,
                         int32_t phase, const fmoe_forward_trace *trace, float *logits) {
    const fmoe_model_geometry *g = fmoe_model_get_geometry(x->m);
    FMOE_RETURN_ERROR_IF(n < 1, FMOE_EINVAL, "no tokens to run (n = %d)", n);
    const int32_t B = x->opt.prefill_chunk;
    x->n_accesses = 0;
    FMOE_FORWARD_IF_ERROR(reserve_accesses(x, (n + B - 1) / B));
    for (int32_t t0 = 0; t0 < n; t0 += B) {
        const int32_t c = n - t0 < B ? n - t0 : B;
        FMOE_FORWARD_IF_ERROR(embed(x, tokens + t0, c));
        fmoe_forward_trace tr;
        if (trace) tr = trace_from(trace, g, t0, 1);
        const iteration_work w = {.session = s, .tokens = tokens + t0,
                                  .trace = trace ? &tr : NULL,
                                  .logits = logits && t0 + c == n ? logits : NULL};
        FMOE_FORWARD_IF_ERROR(
            run_iteration(x, phase, c, (int64_t)fmoe_session_position(s) + c, &w));
    }
    return x->error;
}

int fmoe_offload_forward_batch(fmoe_offload *x, fmoe_session *runner,
                               const fmoe_batch_item *items, int32_t count) {
    FMOE_RETURN_ERROR_IF(!items || count < 1, FMOE_EINVAL, "no items to run (count = %d)",
                         count);
    int64_t total = 0, context = 0;
    int decode = 1;
    for (int32_t i = 0; i < count; i++) {
        FMOE_RETURN_ERROR_IF(!items[i].session || !items[i].tokens || items[i].n < 1,
                             FMOE_EINVAL, "item %d has no session or tokens", i);
        total += items[i].n;
        decode &= items[i].n == 1;
        const int64_t c = (int64_t)fmoe_session_position(items[i].session) + items[i].n;
        if (c > context) context = c;
    }
    x->n_accesses = 0;
    FMOE_FORWARD_IF_ERROR(reserve_accesses(x, 1));
    if (x->semantic_dim) {
        FMOE_FORWARD_IF_ERROR(reserve_semantic(x, total));
        int64_t row = 0;
        for (int32_t i = 0; i < count; i++) {
            FMOE_FORWARD_IF_ERROR(fmoe_model_embed(x->m, items[i].tokens, items[i].n,
                                                   x->semantic + row * x->semantic_dim));
            row += items[i].n;
        }
    }
    const iteration_work w = {.session = runner, .items = items, .count = count};
    FMOE_FORWARD_IF_ERROR(run_iteration(
        x, decode ? FMOE_PHASE_DECODE : FMOE_PHASE_PREFILL, (int32_t)total, context, &w));
    return x->error;
}

const struct fmoe_expertmap *fmoe_offload_expert_store(const fmoe_offload *x) {
    const fmoe_policy_ops *ops = x->policy.ops;
    return ops->expert_store ? ops->expert_store(x->policy.state) : NULL;
}

void fmoe_offload_get_stats(const fmoe_offload *x, fmoe_offload_stats *out) {
    fmoe_offload *mx = (fmoe_offload *)x;
    pthread_mutex_lock(&mx->mu);
    *out = x->st;
    out->io_bytes = x->opt.sync_transfers ? 0 : x->io_bytes;
    out->io_busy_s = x->opt.sync_transfers ? 0 : x->io_busy_s;
    out->io_bytes_decode = x->opt.sync_transfers ? 0 : x->io_bytes_decode;
    out->io_busy_s_decode = x->opt.sync_transfers ? 0 : x->io_busy_s_decode;
    const fmoe_slots_layer_stats *ms = fmoe_slots_stats(x->slots);
    for (int32_t l = 0; l < x->L; l++) {
        out->prefetches += ms[l].prefetches;
        out->bytes_loaded += ms[l].bytes_loaded;
        out->wasted_prefetch_bytes += ms[l].wasted_prefetch_bytes;
    }
    pthread_mutex_unlock(&mx->mu);
}

const uint8_t *fmoe_offload_take_outcomes(fmoe_offload *x, int64_t *n) {
    for (int64_t i = 0; i < x->n_accesses; i++) x->outcomes[i] = x->accesses[i].outcome;
    *n = x->n_accesses;
    return x->outcomes;
}

const fmoe_offload_access *fmoe_offload_take_accesses(fmoe_offload *x, int64_t *n) {
    *n = x->n_accesses;
    return x->accesses;
}

void fmoe_offload_get_layer_stats(const fmoe_offload *x, fmoe_offload_layer_stats *out) {
    fmoe_offload *mx = (fmoe_offload *)x;
    pthread_mutex_lock(&mx->mu);
    const fmoe_slots_layer_stats *ms = fmoe_slots_stats(x->slots);
    const fmoe_cache_view *v = fmoe_slots_view(x->slots);
    for (int32_t l = 0; l < x->L; l++) {
        out[l] = x->lst[l];
        out[l].prefetches = ms[l].prefetches;
        out[l].bytes_loaded = ms[l].bytes_loaded;
        out[l].resident = 0;
    }
    for (int32_t s = 0; s < v->capacity; s++)
        if (v->slot_state[s] == FMOE_SLOT_RESIDENT) out[v->slot_expert[s] / x->J].resident++;
    pthread_mutex_unlock(&mx->mu);
}
