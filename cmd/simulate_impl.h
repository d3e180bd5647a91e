/*
 * simulate_impl.h - internal: what the files of `fmoe simulate` share. The command is cut
 * by job: simulate_options.c (the option table, parsing, policy settings),
 * simulate_inputs.c (the gate data, predictors, arrivals and cost model a trace needs),
 * simulate_units.c (a trace on a hardware profile: its workload and cells),
 * simulate_output.c (table, JSON, CSV, plot) and cmd_simulate.c (the sweep as a job, and
 * the command). Only these include it.
 */
#ifndef FMOE_CMD_SIMULATE_IMPL_H
#define FMOE_CMD_SIMULATE_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "cmd_common.h"
#include "simulate_store.h"
#include "fmoe/hardware.h"
#include "fmoe/policy.h"
#include "fmoe/predictor.h"
#include "fmoe/sim.h"
#include "fmoe/trace.h"

#define SIM_CMD "simulate"
#define MAX_EXPERT_BYTES ((int64_t)1 << 40) /* 1 TiB, as trace import --expert-bytes */
#define MAX_LIST 64
#define DEFAULT_HARDWARE "rtx3090-pcie4"
#define MAX_PREDICTORS FMOE_PREDICTOR_NUM_KINDS

/* Set on MPI ranks other than 0: they prepare the same units as rank 0, whose notes are
 * enough. */
extern int sim_notes_off;

typedef struct options {
    const char *trace;         /* the unit being prepared or printed (one of traces) */
    cmd_opt_strings trace_args; /* --trace, repeatable, each a path or a glob */
    char *policies[MAX_LIST];
    int n_policies;
    int32_t caches[MAX_LIST];
    int n_caches;
    double cache_gb[MAX_LIST];
    int n_cache_gb;
    int32_t distances[MAX_LIST];
    int n_distances;
    const char *model_config;
    const char *profile;       /* the unit's --profile, or NULL */
    const char *hardware;      /* the unit's --hardware name, or NULL */
    cmd_opt_strings profiles;  /* --profile, repeatable */
    char *hardware_list[MAX_LIST]; /* --hardware A,B: split in hardware_buf */
    int n_hardware;
    char hardware_buf[1024];
    const char *sweep_out;     /* --sweep-out results.jsonl */
    int resume;
    double rank_timeout_s;
    const char *csv;
    int json;
    int32_t threads;
    int quiet;
    char policy_buf[4096]; /* --policy's list, split in place */
    int32_t miss_mode;
    const char *arrivals;
    int64_t arrivals_start;
    double arrivals_speedup;
    int32_t eamc_capacity;     /* --eamc-capacity, or eamc_capacity of --policy-opt; 0: none */
    cmd_opt_strings policy_opts; /* --policy-opt KEY=VALUE, repeatable */
    fmoe_policy_settings settings; /* them and the shorthands' (each cell takes its policy's) */
    int list_policies;
    cmd_sim_store store; /* --store, --store-mode, --holdout, ... (simulate_store.c) */
    int32_t copy_chunks;
    int32_t feedback;          /* index into feedback_names: auto, on, off */
    const char *plot;
    const char *decision_log;
    int gap_split;             /* --gap-split: each policy's gap to belady in parts */
    int32_t batch;             /* --batch: sequences run together (1: one at a time) */
    int batch_trace;           /* --batch trace: the served trace's own passes */
    int32_t batch_tokens;      /* --batch-tokens (0: the trace's prefill_chunk, else
                                  FMOE_BATCH_TOKENS) */
    cmd_opt_strings predictors; /* --predictor, repeatable: learned predictors (promoe,
                                   duoserve), each for the policy of its kind */
} options;

/* Whose size of one expert a unit uses, as the output says it: --model-config's (a "what if
 * the experts were Q4_K" run answers for the file given, not for the trace's recording),
 * else the trace's, else the size the trace's stored config.json gives. */
typedef struct expert_size {
    const char *from;    /* "model-config", "trace" or "trace config.json" */
    int64_t trace_bytes; /* the trace's expert_bytes attribute, 0 when it has none */
    int64_t *layers;     /* [L] bytes of one expert of each layer, from a --model-config GGUF
                            whose layers differ (a llama-quantize mix); NULL: uniform */
} expert_size;

/* One trace on one hardware profile: its workload, cost model and cells. Units are
 * allocated once: cells point at their costs, arrivals, store and predictors. */
typedef struct sim_unit {
    const char *trace;
    const char *profile;  /* --profile FILE, or NULL */
    const char *hardware; /* --hardware NAME, or NULL (the default) */
    const char *hw_key;   /* the hardware in --sweep-out: the profile's path or the name */
    fmoe_sim_workload w;
    fmoe_sim_costs costs;
    fmoe_hardware_profile hw;
    int64_t expert_bytes;
    expert_size es;       /* whose it is, for the output */
    char trace_id[65];    /* the trace's identity in --sweep-out (trace_identity) */
    double *arrivals;
    cmd_sim_store store;
    fmoe_predictor *predictors[MAX_PREDICTORS];
    size_t cell0, ncells; /* its cells in the sweep's list */
} sim_unit;

/* ---- simulate_options.c */

void simulate_init(void *base);

int simulate_parse_options(int argc, char **argv, options *o);

/* ---- simulate_inputs.c */

/* The gate data the chosen policies need; fails (one line) when the trace lacks it, notes
 * top-k-only probabilities. */
int simulate_gate_needs(const options *o, const fmoe_trace_header *h, uint32_t *want);

/* --prefetch-distance counts layers ahead: one the trace's L layers cannot hold is a usage
 * error, like any other value out of range (checked for every policy: the same list applies
 * to all of them). */
int simulate_check_distances(const options *o, int32_t L);

/* The distance a cell runs at when --prefetch-distance leaves it to the policy (0): the
 * policy's default, clamped to L - 1 when the trace has fewer layers than that default needs
 * (fmoe's 3 on a 2-layer model), with one note per policy, so the rest of a sweep runs.
 * @return the distance to run at, 0 (the executor's default), or -1: the trace has a single
 *         layer, so the policy cannot prefetch at all: skip its cells. */
int32_t simulate_default_distance(const char *policy, int32_t L, int *noted);

/* Whether a policy of the run reads the gate inputs. */
int simulate_needs_hidden(const options *o);

/* Reads every --predictor into out[MAX_PREDICTORS] (one per kind) and checks that each
 * policy that takes one finds one of its kind, and each is taken. @return 0 or 1/2
 * (printed). */
int simulate_load_predictors(const options *o, const fmoe_trace_header *h,
                           fmoe_predictor **out);

/* The predictor of the kind `policy` takes, or NULL. */
const fmoe_predictor *simulate_predictor_for(const char *policy, fmoe_predictor *const *loaded);

/* Arrival times per request of the workload (malloc'd into *out). */
int simulate_load_arrivals(const options *o, const fmoe_sim_workload *w, double **out);

int simulate_load_costs(const options *o, fmoe_trace_reader *r, fmoe_sim_costs *costs,
                      int64_t *expert_bytes, expert_size *es, fmoe_hardware_profile *hw);

/* ---- simulate_units.c */

void simulate_unit_free(sim_unit *u);

/* The options as they apply to unit u (the helpers above read o->trace, o->profile, ...). */
options simulate_unit_options(const options *o, const sim_unit *u);

/* Reads the unit's trace (with what its policies need) and appends its cells to
 * cells[*n]. @return 0, 1 or 2 (printed). */
int simulate_prepare_unit(const options *base, sim_unit *u, fmoe_sim_config **cells, size_t *n,
                        size_t *cap);

/* Every --trace, its globs expanded (in glob's sorted order), each path once, into a
 * malloc'd list of malloc'd paths. @return 0, 1 or 2 (printed). */
int simulate_expand_traces(const options *o, char ***out, int *n);

/* The settings of a sweep besides its grid, for --sweep-out's first line: a file resumes
 * only a sweep that computes the same cells. */
void simulate_sweep_settings(const options *o, char *buf, size_t cap);

/* ---- simulate_output.c */

const char *simulate_miss_name(int32_t m);

/* One unit's JSON document (what a sweep of one trace on one hardware prints). */
cJSON *simulate_unit_json(const options *o, const fmoe_hardware_profile *hw, int64_t expert_bytes,
                        const expert_size *es, const fmoe_sim_workload *w,
                        const fmoe_sim_result *res, size_t n);

/* --plot: hit rate and latency (TPOT p50, or TTFT p50 for a trace without decode) against
 * cache size, one series per (policy, prefetch distance), points sorted by cache size. */
int simulate_write_plot(const char *path, const char *trace, const fmoe_sim_result *res,
                      size_t n);

/* Rows res[0..n); with several units (prefix != NULL) each row opens with its unit's
 * trace and hardware. */
int simulate_write_csv(const char *path, const fmoe_sim_result *res, size_t n,
                     const char *const *prefix);

/* --gap-split: the table of each policy's gap to belady at the same cache size, in
 * parts (docs/simulating.md#the-gap-to-belady-in-parts). */
void simulate_print_gap_split(const fmoe_sim_result *res, size_t n, const size_t *order);

void simulate_print_table(const options *o, const fmoe_hardware_profile *hw, int64_t expert_bytes,
                        const expert_size *es, const fmoe_sim_workload *w,
                        const fmoe_sim_result *res, size_t n, size_t *order);

#endif
