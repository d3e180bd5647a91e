/*
 * fmoe/policy.h - the expert-offloading policy interface (docs/design.md §6).
 *
 * A policy sees events and answers with decisions; the executor (sim/ or runtime/) owns
 * time, memory and transfers. Policies never know which executor runs them.
 *
 *   events in      on_request_start, on_iteration_start, on_gate, on_access, on_layer_done,
 *                  choose_victim, on_iteration_end, on_request_end
 *   decisions out  through the executor's sink: prefetch(l, j, priority), cancel(l, j),
 *                  pin(l, j) / unpin(l, j), compute_on_host(l, j)
 *
 * A policy is a table of function pointers (fmoe_policy_ops) plus an opaque state made by
 * `init`. Every callback but init/free/choose_victim may be NULL (nothing to do). Policies
 * are pure: no I/O, no clock (the executor passes the time in
 * env->now_s), no CUDA, no allocation after init. The same events therefore give the same
 * decisions in both executors. (One exception, asked for by the live executor only:
 * fmoe_policy_config.predict_thread.)
 *
 * The access model is docs/design.md §7.1: at each layer the executor touches each distinct
 * expert chosen by any token of the iteration once, in order of first appearance; each
 * touch is one access, reported by on_access after the executor resolved it (a miss has
 * already been loaded, choosing its victim through choose_victim). `on_access` is an
 * addition to the list of §6: policies with future knowledge (belady) need the position.
 *
 * Call order, the same in every executor (both run the protocol of fmoe/slots.h):
 *     on_request_start
 *       on_iteration_start
 *         per layer l = 0..L-1:
 *           on_gate(l)                      at the gate; completions up to now applied
 *           per distinct expert, in order of first appearance (or of
 *           fmoe_slots_compute_order, FMOE_POLICY_REORDER_COMPUTE):
 *             [choose_victim(DEMAND)]       a miss being loaded on a full cache
 *             on_access                     the access resolved (hit, late hit or miss)
 *           on_layer_done(l)
 *       on_iteration_end
 *     on_request_end
 * Any callback may call the sink; sink->prefetch calls choose_victim(PREFETCH) before it
 * returns when the cache is full. Transfer completion is not an event: a completed
 * prefetch only turns its slot from LOADING to RESIDENT in the cache view, and executors
 * apply completions before each gate and before each prefetch makes room, nowhere else.
 *
 * Usage:
 *     fmoe_policy p;
 *     fmoe_policy_config cfg = {.num_layers = L, .num_experts = J, .top_k = K, .capacity = N};
 *     if (fmoe_policy_init(&p, "lru", &cfg) < 0) ...;   // detail lists the valid names
 *     // a policy's own parameters, by the names its ops->settings declares:
 *     fmoe_policy_settings set = {0};
 *     fmoe_policy_settings_parse(&set, "eamc_capacity=500");
 *     cfg.settings = &set;
 *     if (fmoe_policy_init(&p, "moe-infinity", &cfg) < 0) ...;
 *     ... executor calls p.ops->on_gate(p.state, &env, &gate) etc. ...
 *     fmoe_policy_free(&p);
 */
#ifndef FMOE_POLICY_H
#define FMOE_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "fmoe/cache.h"
#include "fmoe/routing.h"

/* Where the executor receives decisions. ctx is the executor's; each call applies at
 * env->now_s of the event being handled. Layer and expert are (l, j), not expert ids. */
typedef struct fmoe_policy_sink {
    void *ctx;
    /* Start loading expert (l, j) unless cached or in flight; higher priority goes first
     * among queued prefetches (demand loads always go before prefetches). `value` is the
     * policy's own measure of the incoming expert's worth (its currency, e.g. fmoe's gate
     * probability); the executor hands it back in the fmoe_victim_request of the
     * choose_victim call this prefetch makes, so the policy can refuse to evict anything
     * worth more (admission).
     * @return 0 issued or already cached, 1 dropped (no slot could be freed), < 0 error. */
    int (*prefetch)(void *ctx, int32_t layer, int32_t expert, double priority, double value);
    /* Drop a queued prefetch of (l, j) that has not started; a started one completes. */
    void (*cancel)(void *ctx, int32_t layer, int32_t expert);
    /* Keep a cached expert from eviction / release it. Unpinning what is not pinned by the
     * policy is ignored. */
    void (*pin)(void *ctx, int32_t layer, int32_t expert);
    void (*unpin)(void *ctx, int32_t layer, int32_t expert);
    /* For the next miss of (l, j) in this layer: compute it on the host instead of loading
     * it (executors without a host lane load it). */
    void (*compute_on_host)(void *ctx, int32_t layer, int32_t expert);
} fmoe_policy_sink;

/* Passed with every event. */
typedef struct fmoe_policy_env {
    double now_s;                  /* executor time of the event, seconds */
    const fmoe_cache_view *cache;  /* the cache as it is now */
    const fmoe_policy_sink *sink;
} fmoe_policy_env;

enum {
    FMOE_POLICY_NEEDS_FUTURE = 1u << 0,      /* reads cfg->future (simulate only) */
    FMOE_POLICY_NEEDS_PROBS = 1u << 1,       /* needs gate probabilities in on_gate */
    FMOE_POLICY_NEEDS_SPECULATIVE = 1u << 2, /* needs /tokens/speculative */
    FMOE_POLICY_PREFETCHES = 1u << 3,        /* issues prefetches */
    /* its prefetches come from a matcher that runs beside inference (fMoE §4.3): the
     * executor issues them the modelled match delay after the event that made them (sim:
     * fmoe_sim_costs.match_delay_s), so the matcher costs time only when that makes a
     * prefetch late. */
    FMOE_POLICY_MATCHER = 1u << 4,
    FMOE_POLICY_TAKES_STORE = 1u << 5, /* uses an expert-map store (fmoe_sim_config.expert_store) */
    /* uses gate probabilities when the trace has them, and works from the chosen experts
     * alone (each at 1/K) when it has none (probs_kind none: ids-only routing logs) */
    FMOE_POLICY_USES_PROBS = 1u << 6,
    /* prefetches through feedback-directed admission and early preemption by default
     * (fmoe/slots.h fmoe_slots_config.feedback) */
    FMOE_POLICY_FEEDBACK = 1u << 7,
    /* reads each token's gate input in on_gate (fmoe_gate_event.hidden: the trace's
     * /tokens/hidden, recorded with fmoe record --hidden); the simulator keeps those rows
     * only for policies with this flag and refuses a trace without them; the live
     * executor passes the forward pass's rows, rounded to float16 as a trace stores them. */
    FMOE_POLICY_NEEDS_HIDDEN = 1u << 8,
    /* the executors resolve and compute a layer's experts in the order of
     * fmoe_slots_compute_order (resident first, then transfers under way, then the rest:
     * ProMoE §5.3's reordered compute) instead of in order of first appearance; the
     * accesses keep their positions in the replay order (on_access's position, a
     * recording's outcomes) */
    FMOE_POLICY_REORDER_COMPUTE = 1u << 9,
};


/* How the fmoe policies use an expert-map store (fmoe/expertmap.h): the index of their
 * setting store_mode's choices (offline, online, offline-update). */
typedef enum fmoe_store_mode {
    FMOE_STORE_OFFLINE = 0,        /* the given store, frozen (fMoE §6.1-§6.2) */
    FMOE_STORE_ONLINE = 1,         /* start empty, add each finished token's map (§6.3) */
    FMOE_STORE_OFFLINE_UPDATE = 2, /* the given store, updated as in online mode */
} fmoe_store_mode;

/* ---------------------------------------------------------------- settings
 *
 * A policy's own parameters (moe-infinity's EAMC size, the fmoe policies' store mode) are
 * not fields of fmoe_policy_config: the policy declares them in a table of its own
 * (ops->settings), the user gives them as KEY=VALUE strings (fmoe_policy_settings; the
 * commands' --policy-opt), fmoe_policy_init_ops checks every given key and value against
 * the table before the policy's init runs, and the policy reads its values with
 * fmoe_policy_setting_int / _double / _choice (the default where none was given).
 * fmoe_policy_config keeps what any policy may read: geometry, cache, the trace's inputs,
 * borrowed resources. A new parameter of one policy is therefore one row in its file. */

typedef enum fmoe_policy_setting_type {
    FMOE_SETTING_INT = 1,    /* an integer in [min, max] */
    FMOE_SETTING_DOUBLE = 2, /* a finite number in [min, max] */
    FMOE_SETTING_CHOICE = 3, /* one of choices[]; its value is the index */
} fmoe_policy_setting_type;

/* One row of a policy's table; the table ends with a row whose name is NULL ({0}). */
typedef struct fmoe_policy_setting {
    const char *name;           /* the KEY: [a-z0-9_], at most FMOE_POLICY_SETTING_KEY - 1 */
    fmoe_policy_setting_type type;
    double def;                 /* INT, DOUBLE: the default; CHOICE: the default's index */
    double min, max;            /* INT, DOUBLE: the range, both ends allowed */
    const char *const *choices; /* CHOICE: the names, NULL-terminated */
    const char *help;           /* one line; cites the paper section it comes from */
    /* The commands' option that is a shorthand for this setting (its name without the
     * dashes: "store-mode" makes --store-mode M the same as --policy-opt store_mode=M), or
     * NULL. Every table declaring the key gives the same option; the commands find the
     * key from the option (fmoe_policy_setting_of_option), never by naming it. */
    const char *option;
} fmoe_policy_setting;

#define FMOE_POLICY_MAX_SETTINGS 16
#define FMOE_POLICY_SETTING_KEY 32
#define FMOE_POLICY_SETTING_VALUE 48

/* Settings as given: KEY=VALUE pairs, unparsed, a key at most once (setting it again
 * replaces its value). A plain value type: zero-initialised it is empty, and it copies with
 * `=` (a simulation sweep gives each cell its own). */
typedef struct fmoe_policy_settings {
    int32_t n;
    struct {
        char key[FMOE_POLICY_SETTING_KEY];
        char value[FMOE_POLICY_SETTING_VALUE];
    } item[FMOE_POLICY_MAX_SETTINGS];
} fmoe_policy_settings;

struct fmoe_expertmap;
struct fmoe_predictor;

typedef struct fmoe_policy_config {
    int32_t num_layers;        /* L */
    int32_t num_experts;       /* J */
    int32_t top_k;             /* K */
    int32_t capacity;          /* N expert slots */
    int32_t prefetch_distance; /* d (policies that prefetch), >= 0 */
    /* The whole access sequence, in replay order, as expert ids l*J+j: for policies with
     * FMOE_POLICY_NEEDS_FUTURE. Borrowed for the policy's lifetime. Position p of
     * on_access indexes it. */
    const uint32_t *future;
    int64_t future_len;
    /* The sequence's layer groups, for policies with FMOE_POLICY_NEEDS_FUTURE: group g is
     * one (iteration, layer) of the replay, holding future_layer_accesses[g] consecutive
     * accesses of `future` (g in [0, future_groups)). Borrowed like `future`. */
    const uint16_t *future_layer_accesses;
    int64_t future_groups;
    int32_t probs_kind;        /* what on_gate's probs hold: FMOE_PROBS_* of fmoe/routing.h */
    int32_t speculative_depth; /* S of on_gate's speculative rows; 0: none */
    /* The policy's own settings as the user gave them (its ops->settings declares which):
     * borrowed for init only; NULL: every setting at its default. fmoe_policy_init_ops
     * refuses a key the policy does not declare and a value outside its row. */
    const fmoe_policy_settings *settings;
    /* The fmoe policies' expert-map store: borrowed, read-only (a mode that updates it
     * works on the policy's own copy); NULL in online mode. */
    const struct fmoe_expertmap *expert_store;
    int32_t semantic_dim;      /* h of the iteration events' semantic rows; 0: none */
    int32_t variant;           /* which of ops->variants to run, 0-based */
    /* h of on_gate's hidden rows (FMOE_POLICY_NEEDS_HIDDEN); 0: the executor gives none */
    int32_t hidden_dim;
    /* A learned expert predictor (fmoe/predictor.h) of the kind ops->predictor_kind names,
     * for the policies that predict with one: borrowed, read-only, for the policy's
     * lifetime (a sweep's threads share it). NULL: none. */
    const struct fmoe_predictor *predictor;
    /* Policies that predict beside inference (FMOE_POLICY_MATCHER: fMoE's matcher, §4.3;
     * promoe's predictor, ProMoE §4.4): run the predictions on a thread of their own
     * (lib/worker.h), as the live executor does by default. They then finish at real
     * times, so the decisions depend on timing: the simulator leaves it off and models the
     * predictions' time as a delay instead (fmoe_slots_config.prefetch_delay_s). The only
     * exception to "no threads, no clock" above. predict_delay_s (tests): each prediction
     * on the thread takes at least this long. */
    int32_t predict_thread;
    double predict_delay_s;
} fmoe_policy_config;

typedef struct fmoe_request_event {
    int64_t index;          /* position in replay order */
    int64_t id;             /* the trace's request id */
    int32_t prompt_tokens;
    int32_t output_tokens;
    const float *semantic;  /* [prompt_tokens][semantic_dim] or NULL */
    int32_t semantic_dim;
} fmoe_request_event;

typedef struct fmoe_iteration_event {
    int64_t request;        /* replay index of the request */
    int32_t phase;          /* 0 prefill, 1 decode */
    int32_t num_tokens;     /* n */
    int64_t context;        /* tokens of the request seen up to and including this one */
    const float *semantic;  /* [n][semantic_dim] or NULL */
    int32_t semantic_dim;
    int64_t group;          /* layer group of its layer 0 (cfg->future_layer_accesses); -1 live */
    int64_t position;       /* its first access in cfg->future; -1 live */
    /* Simulate only (live: 0 and NULL). For a one-token iteration, the gate rows the replay
     * holds for it and for the request's next one-token iterations: `ahead` tokens (this
     * one first; at most FMOE_POLICY_MAX_AHEAD), token a's rows at ahead_probs[a · L·J +
     * l·J] (NULL when on_gate's probs are), its chosen experts at ahead_chosen[a · L·K +
     * l·K] and its embedding at ahead_semantic[a · semantic_dim] (NULL when `semantic` is),
     * the very arrays the events will point into. Only for computing now, in a batch,
     * what the policy would compute at those events anyway: its decisions must not depend
     * on them (fmoe batches the semantic and trajectory searches of a frozen store). */
    int32_t ahead;
    const float *ahead_probs;
    const uint16_t *ahead_chosen;
    const float *ahead_semantic;
} fmoe_iteration_event;

/* The most tokens an iteration event's `ahead` covers. */
#define FMOE_POLICY_MAX_AHEAD 64

typedef struct fmoe_gate_event {
    int32_t layer;          /* l */
    int32_t num_tokens;     /* n */
    const uint16_t *chosen; /* token t's K experts at chosen[t * chosen_stride + k] */
    int64_t chosen_stride;
    const float *probs;     /* token t's J probabilities at probs[t * probs_stride]; NULL
                               when the trace has none */
    int64_t probs_stride;
    const int32_t *distinct; /* [num_distinct] expert indexes j, the layer's access order */
    int32_t num_distinct;
    int32_t phase;          /* 0 prefill, 1 decode */
    int32_t probs_kind;     /* FMOE_PROBS_*: full, topk (only chosen experts non-zero), none */
    /* Speculative gate rows: token t's prediction of layer l+1+s (s in [0, depth)) is the J
     * values at speculative[t * speculative_stride + s * J] (the gate of layer l+1+s applied
     * to layer l's hidden state, docs/design.md §4). NULL when the trace has none. */
    const float *speculative;
    int64_t speculative_stride;
    int32_t speculative_depth;
    int64_t group;          /* this (iteration, layer) group (cfg->future_layer_accesses); -1 live */
    int64_t position;       /* the layer's first access in cfg->future; -1 live */
    /* Gate inputs (FMOE_POLICY_NEEDS_HIDDEN): token t's hidden_dim floats at hidden[t *
     * hidden_stride], the normalised hidden state this layer's router reads (the trace's
     * /tokens/hidden; live, the forward pass's rows rounded to float16 and back, the
     * trace's bits). NULL when no policy of the run asked for them. */
    const float *hidden;
    int64_t hidden_stride;
    int32_t hidden_dim;
} fmoe_gate_event;

typedef enum fmoe_access_result {
    FMOE_ACCESS_MISS = 0,
    FMOE_ACCESS_HIT = 1,       /* resident when its compute started */
    FMOE_ACCESS_LATE_HIT = 2,  /* a prefetch in flight when its compute started */
} fmoe_access_result;

/* Why a slot is wanted when choose_victim is called. */
typedef enum fmoe_load_kind {
    FMOE_LOAD_DEMAND = 0,   /* a miss of the access being resolved */
    FMOE_LOAD_PREFETCH = 1, /* a prefetch the policy is issuing through sink->prefetch */
} fmoe_load_kind;

typedef struct fmoe_victim_request {
    int32_t incoming;       /* expert id l*J+j to be loaded */
    fmoe_load_kind kind;
    double value;           /* PREFETCH: the `value` given to sink->prefetch; DEMAND: 0 */
} fmoe_victim_request;

typedef struct fmoe_access_event {
    int32_t layer;
    int32_t expert;         /* j */
    int32_t tokens;         /* tokens of the iteration routed to it */
    int32_t slot;           /* where it is now, -1 when computed without caching */
    int64_t position;       /* index in the access sequence (cfg->future) */
    fmoe_access_result result;
} fmoe_access_event;

typedef struct fmoe_policy_ops {
    const char *name;       /* the --policy name */
    const char *summary;    /* one line for help texts */
    uint32_t flags;         /* FMOE_POLICY_* */
    /* Allocates all state. @return 0 or a negative code with a detail. */
    int (*init)(void **state, const fmoe_policy_config *cfg);
    void (*free)(void *state);
    void (*on_request_start)(void *state, const fmoe_policy_env *env,
                             const fmoe_request_event *ev);
    void (*on_iteration_start)(void *state, const fmoe_policy_env *env,
                               const fmoe_iteration_event *ev);
    void (*on_gate)(void *state, const fmoe_policy_env *env, const fmoe_gate_event *ev);
    void (*on_access)(void *state, const fmoe_policy_env *env, const fmoe_access_event *ev);
    void (*on_layer_done)(void *state, const fmoe_policy_env *env, int32_t layer);
    /* Which slot to empty so that req->incoming can be loaded. Called only when the cache
     * is full: for a demand miss while its access is resolved, and for a prefetch from
     * inside sink->prefetch (req->kind says which; the policy needs no flag of its own).
     * Must return an evictable slot (fmoe_cache_evictable), or -1 when it wants none
     * evicted (a demand miss is then computed without caching it; a prefetch is dropped). */
    int32_t (*choose_victim)(void *state, const fmoe_policy_env *env,
                             const fmoe_victim_request *req);
    void (*on_iteration_end)(void *state, const fmoe_policy_env *env,
                             const fmoe_iteration_event *ev);
    void (*on_request_end)(void *state, const fmoe_policy_env *env,
                           const fmoe_request_event *ev);
    /* The prefetch distance a run uses when it asks for 0: 0 (the policy does not
     * prefetch by distance), d > 0, or -1 for "every later layer of the iteration" (L). */
    int32_t default_distance;
    /* Bounds only (oracle): the number of alternative schedules the policy can run
     * (cfg->variant); the simulator runs each and reports the one with the least stall.
     * 0 or 1: one. */
    int32_t variants;
    /* The expert-map store the policy matches against, as it stands now (updated during
     * the run in the updating store modes), for writing it back out; NULL (or a NULL
     * member) for policies without one. */
    const struct fmoe_expertmap *(*expert_store)(const void *state);
    /* The kind of learned predictor the policy predicts with (FMOE_PREDICTOR_KIND_* of
     * fmoe/predictor.h; given with --predictor, passed in cfg->predictor), or NULL for a
     * policy that takes none. fmoe_policy_init_ops refuses a run of such a policy without a
     * predictor of this kind, and the commands and executors read it here, never from the
     * policy's name. */
    const char *predictor_kind;
    /* The policy's own settings (see "settings" above), a table ending in {0}; NULL: none.
     * Its rows are what --policy-opt accepts for it and what `fmoe simulate
     * --list-policies` prints. */
    const fmoe_policy_setting *settings;
} fmoe_policy_ops;

/* A policy instance: its table and its state. Plain struct, caller-allocated. */
typedef struct fmoe_policy {
    const fmoe_policy_ops *ops;
    void *state;
} fmoe_policy;

/* Whether a run of the policy uses feedback-directed prefetching: `request` 1 forces it
 * on, -1 off, 0 takes the policy's default (FMOE_POLICY_FEEDBACK). Only policies that
 * prefetch are affected. */
static inline int fmoe_policy_feedback(const fmoe_policy_ops *ops, int32_t request) {
    if (!(ops->flags & FMOE_POLICY_PREFETCHES)) return 0;
    return request > 0 || (request == 0 && (ops->flags & FMOE_POLICY_FEEDBACK));
}

/* The built-in policies, in a stable order. @return the count; *out the table. */
size_t fmoe_policy_registry(const fmoe_policy_ops *const **out);

/* @return the policy named `name`, or NULL. */
const fmoe_policy_ops *fmoe_policy_find(const char *name);

/* Comma-separated names of the built-in policies ("ondemand, lru, lfu, belady, ..."). */
const char *fmoe_policy_names(void);

/* The names of the built-in policies that take a predictor (ops->predictor_kind), in
 * table order, as in a sentence: "promoe and duoserve" ("a, b and c"; "" for none). */
const char *fmoe_policy_predictor_names(void);

/* Whether `ops` predicts with a predictor of `kind` (a predictor file's kind). NULL: no. */
int fmoe_policy_takes_predictor(const fmoe_policy_ops *ops, const char *kind);

/* Makes an instance of the built-in policy `name` (or of `ops` when given via
 * fmoe_policy_init_ops). @return 0, FMOE_ENOTFOUND (unknown name; the detail lists the
 * valid ones), FMOE_EINVAL (bad config, e.g. NEEDS_FUTURE without cfg->future, or a
 * setting in cfg->settings the policy does not declare or a value outside its row:
 * fmoe_policy_settings_check), or what the policy's init returns. */
int fmoe_policy_init(fmoe_policy *p, const char *name, const fmoe_policy_config *cfg);
int fmoe_policy_init_ops(fmoe_policy *p, const fmoe_policy_ops *ops,
                         const fmoe_policy_config *cfg);

/* Adds KEY=VALUE to s, or replaces the value of a key already there. Nothing is checked
 * against a policy here (fmoe_policy_settings_check does). @return 0, or FMOE_EINVAL (an
 * empty or too long key or value, a key not of [a-z0-9_], more than
 * FMOE_POLICY_MAX_SETTINGS keys) with a detail naming the key. */
int fmoe_policy_settings_set(fmoe_policy_settings *s, const char *key, const char *value);

/* fmoe_policy_settings_set from one "KEY=VALUE" string (--policy-opt's form).
 * @return 0 or FMOE_EINVAL ("'x' is not KEY=VALUE", or as set). */
int fmoe_policy_settings_parse(fmoe_policy_settings *s, const char *key_value);

/* The value given for `key`, or NULL (also for s NULL). Borrowed from s. */
const char *fmoe_policy_settings_get(const fmoe_policy_settings *s, const char *key);

/* The row of ops->settings named `key`, or NULL. */
const fmoe_policy_setting *fmoe_policy_setting_find(const fmoe_policy_ops *ops,
                                                    const char *key);

/* The first row, in the built-in policies' tables in registry order, whose `option` is
 * `option` (without the dashes), or NULL when no policy declares it. */
const fmoe_policy_setting *fmoe_policy_setting_of_option(const char *option);

/* Parses `text` as a value of `row`: INT and DOUBLE as numbers in [min, max], CHOICE as one
 * of the names (*out its index). @return 0, or FMOE_EINVAL with a detail naming the key,
 * the value and what it must be ("eamc_capacity=0: expected an integer in [1, 10000000]"). */
int fmoe_policy_setting_parse_value(const fmoe_policy_setting *row, const char *text,
                                    double *out);

/* Checks s (NULL: nothing given) against the policy's table: every key declared, every
 * value valid. fmoe_policy_init_ops calls it before the policy's init. @return 0, or
 * FMOE_EINVAL with a one-line detail naming the policy and the key ("policy lru has no
 * setting 'foo' (it has none)"; "... (its settings: eamc_capacity)"), or the value and
 * its range. */
int fmoe_policy_settings_check(const fmoe_policy_ops *ops, const fmoe_policy_settings *s);

/* Copies into *out the settings of `all` that ops declares, in order (the commands: one
 * list of --policy-opt for several policies, each taking its own keys). */
void fmoe_policy_settings_select(fmoe_policy_settings *out, const fmoe_policy_ops *ops,
                                 const fmoe_policy_settings *all);

/* Checks that a table is well-formed: names of [a-z0-9_], unique, a type, min <= def <= max
 * (an INT's bounds integers), a CHOICE's default one of at least one choice, a help line,
 * an option (when given) of [a-z0-9-] that no other row of the table has.
 * @return 0 or FMOE_EINVAL naming the policy and the row. (Tests run it on the registry.) */
int fmoe_policy_settings_table_check(const fmoe_policy_ops *ops);

/* The value of the policy's setting `key` for this run: cfg->settings' (checked by
 * fmoe_policy_init_ops), else the row's default. For the policy's init; `table` is the
 * policy's own ops->settings and must declare `key` (FMOE_ASSERT). _choice returns the
 * index of the choice. */
int64_t fmoe_policy_setting_int(const fmoe_policy_config *cfg, const fmoe_policy_setting *table,
                                const char *key);
double fmoe_policy_setting_double(const fmoe_policy_config *cfg,
                                  const fmoe_policy_setting *table, const char *key);
int32_t fmoe_policy_setting_choice(const fmoe_policy_config *cfg,
                                   const fmoe_policy_setting *table, const char *key);

/* "int, default 1000, in [1, 10000000]" / "offline|online|offline-update, default offline":
 * a row's type, default and range in one phrase, for listings. */
void fmoe_policy_setting_describe(const fmoe_policy_setting *row, char *buf, size_t cap);

/* Frees the state; p->ops stays. NULL state is a no-op. */
void fmoe_policy_free(fmoe_policy *p);

/* The evictable slot with the smallest last-access tick (ties: lowest slot), or -1. */
int32_t fmoe_policy_victim_lru(const fmoe_cache_view *v);

/* Checks that the trace described by cfg (probs_kind, speculative_depth) gives `ops` what
 * its flags say it needs. @return 0, or FMOE_EUNSUPPORTED with a one-line detail ("policy
 * mixtral-offload needs speculative gate rows (/tokens/speculative); the trace has none").
 * fmoe_policy_init_ops calls it. */
int fmoe_policy_check_inputs(const fmoe_policy_ops *ops, const fmoe_policy_config *cfg);

#endif
