/*
 * cmd_simulate.c - `fmoe simulate`: replay a trace through expert-cache policies on a
 * hardware model and report hits, bytes moved, stall time and latency (docs/design.md §7).
 *
 * defaults -> parse -> validate -> per trace and hardware profile (a unit): read the trace
 * (with the gate data the chosen policies need) and list its cells -> sweep (policies x
 * cache sizes x prefetch distances of every unit, in parallel threads; over MPI ranks when
 * launched by mpirun/srun, rank 0 handing out cells; every finished cell to --sweep-out as
 * it finishes, which --resume reads back) -> print a table per unit (best first), JSON or
 * CSV, in grid order whichever rank ran which cell (docs/scaling-out.md).
 */
#include <cjson/cJSON.h>
#include <glob.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "cmd_common.h"
#include "plot_svg.h"
#include "paths.h"
#include "simulate_store.h" /* the fmoe policies' expert-map store */
#include "policy_opts.h"    /* --policy-opt and its shorthands */
#include "sweep.h"          /* --sweep-out, --resume, MPI ranks */
#include "fmoe/datasets.h"
#include "fmoe/decision_log.h"
#include "fmoe/error.h"
#include "files.h"
#include "sha256.h"
#include "fmoe/geometry.h"
#include "fmoe/gguf.h"
#include "fmoe/hardware.h"
#include "fmoe/policy.h"
#include "fmoe/predictor.h"
#include "fmoe/sim.h"
#include "fmoe/trace.h"

int cmd_simulate(int argc, char **argv);

static const char *const CMD = "simulate";
#define MAX_EXPERT_BYTES ((int64_t)1 << 40) /* 1 TiB, as trace import --expert-bytes */

#define MAX_LIST 64
#define DEFAULT_HARDWARE "rtx3090-pcie4"

/* Set on MPI ranks other than 0: they prepare the same units as rank 0, whose notes are
 * enough. */
static int notes_off;

/* ------------------------------------------------------------------ options */

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
    int32_t batch;             /* --batch: sequences run together (1: one at a time) */
    int batch_trace;           /* --batch trace: the served trace's own passes */
    int32_t batch_tokens;      /* --batch-tokens (0: the trace's prefill_chunk, else
                                  FMOE_BATCH_TOKENS) */
    cmd_opt_strings predictors; /* --predictor, repeatable: learned predictors (promoe,
                                   duoserve), each for the policy of its kind */
} options;

/* Splits `text` at commas into at most MAX_LIST non-empty items (in place). */
static int split(char *text, const char *option, char **items, int *n) {
    *n = 0;
    for (char *tok = strtok(text, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == MAX_LIST)
            return cmd_usage_error(CMD, "%s: at most %d values", option, MAX_LIST);
        items[(*n)++] = tok;
    }
    if (*n == 0) return cmd_usage_error(CMD, "option '%s' needs a value", option);
    return 0;
}

/* Splits a copy of `text`, made in buf (cap bytes). */
static int split_copy(const char *text, const char *option, char *buf, size_t cap,
                      char **items, int *n) {
    if (strlen(text) >= cap)
        return cmd_usage_error(CMD, "%s: the list is longer than %zu characters", option, cap - 1);
    strcpy(buf, text);
    return split(buf, option, items, n);
}

static int on_policy(const char *cmd, const cmd_option *opt, void *base, const char *value) {
    (void)cmd, (void)opt;
    options *o = base;
    return split_copy(value, "--policy", o->policy_buf, sizeof o->policy_buf, o->policies,
                      &o->n_policies);
}

static int parse_i32_list(const char *text, const char *option, int32_t min, int32_t *out,
                          int *n) {
    char buf[4096], *items[MAX_LIST];
    int rc = split_copy(text, option, buf, sizeof buf, items, n);
    for (int i = 0; rc == 0 && i < *n; i++)
        rc = cmd_parse_i32(CMD, option, items[i], min, INT32_MAX, &out[i]);
    return rc;
}

static int on_cache_experts(const char *cmd, const cmd_option *opt, void *base,
                            const char *value) {
    (void)cmd, (void)opt;
    options *o = base;
    return parse_i32_list(value, "--cache-experts", 1, o->caches, &o->n_caches);
}

/* --batch B, or --batch trace: the passes a trace of fmoe serve recorded. */
static int on_batch(const char *cmd, const cmd_option *opt, void *base, const char *value) {
    (void)cmd, (void)opt;
    options *o = base;
    o->batch_trace = value && strcmp(value, "trace") == 0;
    if (o->batch_trace) {
        o->batch = 1;
        return 0;
    }
    return cmd_parse_i32(CMD, "--batch", value, 1, 65536, &o->batch);
}

static int on_distance(const char *cmd, const cmd_option *opt, void *base, const char *value) {
    (void)cmd, (void)opt;
    options *o = base;
    return parse_i32_list(value, "--prefetch-distance", 0, o->distances, &o->n_distances);
}

static int on_cache_gb(const char *cmd, const cmd_option *opt, void *base, const char *value) {
    (void)cmd, (void)opt;
    options *o = base;
    char buf[4096], *items[MAX_LIST];
    int rc = split_copy(value, "--cache-gb", buf, sizeof buf, items, &o->n_cache_gb);
    for (int i = 0; rc == 0 && i < o->n_cache_gb; i++)
        rc = cmd_parse_f64(CMD, "--cache-gb", items[i], 0, 1e9, &o->cache_gb[i]);
    return rc;
}

static int on_hardware(const char *cmd, const cmd_option *opt, void *base, const char *value) {
    (void)cmd, (void)opt;
    options *o = base;
    return split_copy(value, "--hardware", o->hardware_buf, sizeof o->hardware_buf,
                      o->hardware_list, &o->n_hardware);
}

static const char *const miss_names[] = {"load", "cpu", "auto", NULL};
static const int32_t miss_values[] = {FMOE_SIM_MISS_LOAD, FMOE_SIM_MISS_CPU, FMOE_SIM_MISS_AUTO};
static const char *const store_mode_names[] = {"offline", "online", "offline-update", NULL};
static const int32_t store_mode_values[] = {FMOE_STORE_OFFLINE, FMOE_STORE_ONLINE,
                                            FMOE_STORE_OFFLINE_UPDATE};

static const cmd_option simulate_options[] = {
    {.name = "trace", .kind = CMD_OPT_STRINGS, .io = CMD_IO_INPUT, .value_name = "FILE",
     .help = "trace to replay (fmoe record / fmoe trace import); repeatable, and a quoted "
             "glob ('runs/*.h5') names every match: the sweep spans them all",
     .offset = offsetof(options, trace_args)},
    {.name = "policy", .kind = CMD_OPT_CALLBACK, .value_name = "P[,P...]",
     .help = "policies", .default_text = "lru", .handler = on_policy, .example = "lfu,belady"},
    {.name = "cache-experts", .kind = CMD_OPT_CALLBACK, .value_name = "N[,...]",
     .help = "fast-tier slots, in routed experts (>= 1)", .handler = on_cache_experts,
     .example = "4,8"},
    {.name = "cache-gb", .kind = CMD_OPT_CALLBACK, .value_name = "X[,...]",
     .help = "fast-tier size in GiB instead (slots = X GiB / expert)", .handler = on_cache_gb,
     .example = "0.5"},
    {.name = "prefetch-distance", .kind = CMD_OPT_CALLBACK, .value_name = "D[,...]",
     .help = "layers ahead for prefetching policies (0: each policy's own default, shown in "
             "the d column)",
     .handler = on_distance, .default_text = "0", .example = "1,2"},
    {.name = "miss", .kind = CMD_OPT_ENUM, .value_name = "load|cpu|auto",
     .help = "on a miss: load the expert (default), compute it on the host CPU uncached "
             "(llama.cpp style), or whichever ends first (Fiddler); cpu/auto need host "
             "figures (calibrate)",
     .offset = offsetof(options, miss_mode), .choices = miss_names, .choice_values = miss_values},
    {.name = "arrivals", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "FILE|trace",
     .help = "replay requests at arrival times, FCFS: an Azure LLM inference CSV, or 'trace' "
             "for the trace's own times",
     .offset = offsetof(options, arrivals)},
    {.name = "arrivals-start", .kind = CMD_OPT_INT64, .value_name = "N",
     .help = "first CSV row to use", .default_text = "0",
     .offset = offsetof(options, arrivals_start), .min = 0, .max = INT64_MAX},
    {.name = "arrivals-speedup", .kind = CMD_OPT_DOUBLE, .value_name = "X",
     .help = "divide inter-arrival times by X", .default_text = "1",
     .offset = offsetof(options, arrivals_speedup), .fmin = 1e-9, .fmax = 1e9},
    {.name = "batch", .kind = CMD_OPT_CALLBACK, .value_name = "B|trace",
     .help = "run up to B requests together with continuous batching, as fmoe serve "
             "--parallel B does: each iteration holds every running request's next decode "
             "token, then prompt chunks, each oldest admitted first, up to --batch-tokens, each "
             "expert loaded once per layer for the whole batch; without --arrivals every "
             "request waits from t = 0, so latencies include the wait for a slot. 'trace': "
             "replay the batched passes a trace of fmoe serve --trace-out recorded, item for "
             "item (back to back; with --arrivals trace the clock idles until arrivals)",
     .handler = on_batch, .default_text = "1", .example = "4"},
    {.name = "batch-tokens", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "--batch B's budget of one iteration, in tokens (fmoe serve --batch-tokens), at "
             "least B",
     .default_text = "the trace's prefill_chunk (what fmoe serve ran with), else 64",
     .offset = offsetof(options, batch_tokens), .min = 1, .max = FMOE_BATCH_TOKENS_MAX},
    {.name = "policy-opt", .kind = CMD_OPT_STRINGS, .io = CMD_IO_TEXT, .value_name = "KEY=VALUE",
     .help = "a setting of the policies that declare KEY (--list-policies lists each "
             "policy's); repeatable; a KEY no --policy declares is refused",
     .offset = offsetof(options, policy_opts)},
    {.name = "list-policies", .kind = CMD_OPT_FLAG,
     .help = "list the policies with their settings (type, default, range) and exit",
     .offset = offsetof(options, list_policies)},
    {.name = "eamc-capacity", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "moe-infinity's EAM collection size (--policy-opt eamc_capacity=N)",
     .default_text = "1000", .offset = offsetof(options, eamc_capacity), .min = 1,
     .max = 10000000},
    /* the fmoe policies' expert-map store (simulate_store.c) */
    {.name = "store", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "FILE",
     .help = "expert-map store for the fmoe policies (build-store)",
     .offset = offsetof(options, store.path)},
    {.name = "store-mode", .kind = CMD_OPT_ENUM, .value_name = "M",
     .help = "offline: use the store as built (default with --store); offline-update: and add "
             "each token's map as it runs; online: start empty and learn (default without "
             "--store) (--policy-opt store_mode=M)",
     .offset = offsetof(options, store.mode), .choices = store_mode_names,
     .choice_values = store_mode_values, .seen_offset = offsetof(options, store.mode_given)},
    {.name = "holdout", .kind = CMD_OPT_FLAG,
     .help = "replay only the requests the store's --split held out",
     .offset = offsetof(options, store.holdout)},
    {.name = "store-capacity", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "entries of the online store; offline-update grows the --store to it "
             "(--policy-opt store_capacity=N)",
     .default_text = "the --store's capacity, else 1000",
     .offset = offsetof(options, store.capacity), .min = 1, .max = 100000000},
    {.name = "match-delay", .kind = CMD_OPT_DOUBLE, .value_name = "S",
     .help = "the fmoe matcher's time per match, seconds",
     .default_text = "the profile's matcher.match_s, else 0",
     .offset = offsetof(options, store.match_delay_s), .fmin = 0, .fmax = 1e3},
    {.name = "predictor", .kind = CMD_OPT_STRINGS, .io = CMD_IO_INPUT, .value_name = "P.h5",
     .help = "learned predictor (fmoe train-predictor) for the policy of its kind, "
             FMOE_PREDICTOR_KIND_PROMOE " or " FMOE_PREDICTOR_KIND_DUOSERVE
             "; repeatable, one per kind. promoe's "
             "stride is the prefetch distance; needs a trace recorded with --hidden",
     .offset = offsetof(options, predictors)},
    {.name = "model-config", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "FILE",
     .help = "config.json", .default_text = "the one stored in the trace",
     .offset = offsetof(options, model_config)},
    {.name = "profile", .kind = CMD_OPT_STRINGS, .io = CMD_IO_INPUT, .value_name = "FILE",
     .help = "hardware profile JSON (fmoe calibrate); repeatable: the sweep spans them all",
     .offset = offsetof(options, profiles)},
    {.name = "hardware", .kind = CMD_OPT_CALLBACK, .value_name = "NAME[,NAME...]",
     .help = "built-in profiles: the sweep spans them all", .default_text = DEFAULT_HARDWARE,
     .handler = on_hardware, .example = "rtx3090-pcie4"},
    {.name = "copy-chunks", .kind = CMD_OPT_INT32, .value_name = "C",
     .help = "pieces per prefetch transfer: a demand load waits only for the piece on the "
             "copy engine, not the whole prefetch (live runs move experts the same way)",
     .default_text = "1", .offset = offsetof(options, copy_chunks), .min = 1, .max = 1024},
    {.name = "feedback", .kind = CMD_OPT_ENUM, .value_name = "auto|on|off",
     .help = "feedback-directed prefetching: a prefetch that must evict is admitted only "
             "while its layer's measured accuracy beats the measured regret of evictions, "
             "and a gate cancels its layer's unchosen queued prefetches (auto: the policy's "
             "default)",
     .default_text = "auto", .offset = offsetof(options, feedback),
     .choices = cmd_feedback_names},
    {.name = "decision-log", .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT, .value_name = "F.jsonl",
     .help = "write every decision of the run, one JSON line each, in the format live runs "
             "write (fmoe compare-logs); one policy, cache size and distance only",
     .offset = offsetof(options, decision_log)},
    {.name = "plot", .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT, .value_name = "FILE.svg",
     .help = "also draw hit rate and TPOT (TTFT for prefill-only traces) against cache size, "
             "one line per policy (and distance), as an SVG file",
     .offset = offsetof(options, plot)},
    {.name = "json", .kind = CMD_OPT_FLAG, .help = "print one JSON document",
     .offset = offsetof(options, json)},
    {.name = "csv", .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT, .value_name = "FILE",
     .help = "also write one CSV row per configuration ('-': stdout)",
     .offset = offsetof(options, csv)},
    {.name = "threads", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "sweep threads (of each MPI rank)",
     .default_text = "one per core", .offset = offsetof(options, threads), .min = 1,
     .max = 4096},
    {.name = "sweep-out", .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT, .value_name = "F.jsonl",
     .help = "write every cell's result to F as it finishes, one JSON line each, flushed, so "
             "that an interrupted sweep can --resume; F must not exist without --resume",
     .offset = offsetof(options, sweep_out)},
    {.name = "resume", .kind = CMD_OPT_FLAG,
     .help = "with --sweep-out F: skip the cells F already holds (a sweep with the same "
             "settings wrote it), run the rest, and print the whole result",
     .offset = offsetof(options, resume)},
    {.name = "rank-timeout", .kind = CMD_OPT_DOUBLE, .value_name = "S",
     .help = "MPI runs: a rank silent this long is dead, its cells reported missing (--resume "
             "runs them)",
     .default_text = "60", .offset = offsetof(options, rank_timeout_s), .fmin = 0.1,
     .fmax = 1e6},
    {.name = "quiet", .kind = CMD_OPT_FLAG, .help = "no progress bar",
     .offset = offsetof(options, quiet)},
    {0},
};

static void help_extra(FILE *out) {
    const fmoe_policy_ops *const *all = NULL;
    size_t n = fmoe_policy_registry(&all);
    fprintf(out, "\npolicies:\n");
    for (size_t i = 0; i < n; i++) fprintf(out, "  %-18s %s\n", all[i]->name, all[i]->summary);
    fprintf(out, "\nhardware presets: %s\n", fmoe_hardware_preset_names());
    fprintf(out, "\npolicy settings (--policy-opt KEY=VALUE): fmoe simulate --list-policies\n");
}

/* --list-policies: each policy, and each of its settings with type, default, range and the
 * line of help its table gives. */
static void list_policies(FILE *out) {
    const fmoe_policy_ops *const *all = NULL;
    size_t n = fmoe_policy_registry(&all);
    fprintf(out, "policies, and their settings (--policy-opt KEY=VALUE):\n");
    for (size_t i = 0; i < n; i++) {
        fprintf(out, "\n%s: %s\n", all[i]->name, all[i]->summary);
        const fmoe_policy_setting *r = all[i]->settings;
        if (!r || !r->name) fprintf(out, "    (no settings)\n");
        for (; r && r->name; r++) {
            char what[256];
            fmoe_policy_setting_describe(r, what, sizeof what);
            fprintf(out, "    %s: %s\n        %s\n", r->name, what, r->help);
        }
    }
}

static void init(void *base) {
    options *o = base;
    memset(o, 0, sizeof *o);
    o->copy_chunks = 1;
    o->batch = 1;
    cmd_sim_store_init(&o->store);
}

const cmd_spec cmd_simulate_spec = {
    .name = "simulate",
    .usage = "simulate --trace T.h5 [--trace T2.h5...] --cache-experts N[,N...] [options]\n"
             "simulate --trace T.h5 --cache-gb X[,X...] [options]\n"
             "mpirun -n R fmoe simulate ... [--sweep-out F.jsonl [--resume]]",
    .description =
        "Replay a trace through expert-cache policies on a model of the hardware and\n"
        "report hit rate, bytes moved, stall time, TTFT, TPOT and end-to-end latency.\n"
        "Lists (comma-separated) sweep every combination, in parallel threads; several\n"
        "traces and hardware profiles multiply the grid. Launched by mpirun or srun, the\n"
        "ranks share the cells (rank 0 hands them out and prints the one result).\n",
    .options = simulate_options,
    .help_extra = help_extra,
    .epilog =
        "The table lists one configuration per row, best (lowest mean end-to-end latency)\n"
        "first. hit%: accesses whose expert was resident when its compute started (an\n"
        "access is one distinct expert of one layer of one iteration); late: prefetches\n"
        "still in flight then; stall: time the compute stream waited for weights (or for\n"
        "the host lane); goodpred: accesses served by a prefetch that was right and in\n"
        "time, over those not already cached; latencies are per request.\n",
    .size = sizeof(options),
    .init = init,
};

/* --policy-opt and its shorthands into o->settings, one list for every policy of the run
 * (each cell takes the keys its policy declares). A shorthand is the same setting:
 * --eamc-capacity N is eamc_capacity=N, --store-mode M store_mode=M, --store-capacity N
 * store_capacity=N. The store's mode and capacity, and the EAMC's size, are then read back
 * from the settings, whichever way they came, into the fields that the store's checks
 * (simulate_store.c) and the sizing to the trace (prepare_unit) use. @return 0 or 2. */
static int policy_settings(options *o) {
    int rc = cmd_policy_opts_parse(CMD, &o->policy_opts, o->policies, o->n_policies,
                                   &o->settings);
    char v[24];
    if (rc == 0 && o->eamc_capacity > 0) {
        snprintf(v, sizeof v, "%d", (int)o->eamc_capacity);
        rc = cmd_policy_opt_shorthand(CMD, &o->settings, "--eamc-capacity", "eamc_capacity", v);
    }
    for (int32_t i = 0; rc == 0 && o->store.mode_given && store_mode_names[i]; i++)
        if (store_mode_values[i] == o->store.mode)
            rc = cmd_policy_opt_shorthand(CMD, &o->settings, "--store-mode", "store_mode",
                                          store_mode_names[i]);
    if (rc == 0 && o->store.capacity > 0) {
        snprintf(v, sizeof v, "%d", (int)o->store.capacity);
        rc = cmd_policy_opt_shorthand(CMD, &o->settings, "--store-capacity", "store_capacity",
                                      v);
    }
    if (rc) return rc;
    /* the values were checked against the policies' tables: plain conversions suffice */
    const char *e = fmoe_policy_settings_get(&o->settings, "eamc_capacity");
    const char *m = fmoe_policy_settings_get(&o->settings, "store_mode");
    const char *c = fmoe_policy_settings_get(&o->settings, "store_capacity");
    if (e) o->eamc_capacity = (int32_t)strtol(e, NULL, 10);
    if (c) o->store.capacity = (int32_t)strtol(c, NULL, 10);
    for (int32_t i = 0; m && store_mode_names[i]; i++)
        if (strcmp(store_mode_names[i], m) == 0) {
            o->store.mode = store_mode_values[i];
            o->store.mode_given = 1;
        }
    return 0;
}

static int parse_options(int argc, char **argv, options *o) {
    int rc = cmd_options_parse(&cmd_simulate_spec, o, argc, argv, NULL);
    if (rc) return rc;
    if (o->list_policies) {
        list_policies(stdout);
        return CMD_OPTIONS_HELP; /* exit 0, nothing run */
    }
    if (o->trace_args.n == 0) return cmd_usage_error(CMD, "--trace is required");
    if (o->resume && !o->sweep_out)
        return cmd_usage_error(CMD, "--resume needs --sweep-out F.jsonl (the file to resume)");
    if (!o->n_caches && !o->n_cache_gb)
        return cmd_usage_error(CMD, "give the cache size: --cache-experts N or --cache-gb X");
    if (o->n_caches && o->n_cache_gb)
        return cmd_usage_error(CMD, "--cache-experts and --cache-gb are alternatives; give one");
    if (o->profiles.n && o->n_hardware)
        return cmd_usage_error(CMD, "--profile and --hardware are alternatives; give one");
    for (int i = 0; i < o->n_hardware; i++) { /* an unknown name is a usage error, found
                                                 before any file is read */
        fmoe_hardware_profile hw;
        if (fmoe_hardware_preset(o->hardware_list[i], &hw) < 0) {
            fmoe_error_clear();
            return cmd_usage_error(CMD, "unknown hardware '%s' (presets: %s)",
                                   o->hardware_list[i], fmoe_hardware_preset_names());
        }
    }
    if (!o->n_policies) {
        o->policies[0] = "lru";
        o->n_policies = 1;
    }
    for (int i = 0; i < o->n_policies; i++)
        if (!fmoe_policy_find(o->policies[i]))
            return cmd_usage_error(CMD, "unknown policy '%s' (valid: %s)", o->policies[i],
                                   fmoe_policy_names());
    /* the policies that predict with a learned predictor (ops->predictor_kind): each needs
     * one of its kind; which file is of which kind is known once they are read
     * (load_predictors) */
    int takes_predictor = 0;
    for (int i = 0; i < o->n_policies; i++) {
        const char *kind = fmoe_policy_find(o->policies[i])->predictor_kind;
        if (!kind) continue;
        takes_predictor = 1;
        if (o->predictors.n == 0)
            return cmd_usage_error(CMD,
                                   "policy %s needs --predictor P.h5 (fmoe train-predictor "
                                   "--kind %s)",
                                   o->policies[i], kind);
    }
    if (o->predictors.n > 0 && !takes_predictor)
        return cmd_usage_error(CMD, "--predictor is for policies %s; no --policy takes it",
                               fmoe_policy_predictor_names());
    if (!o->n_distances) {
        o->distances[0] = 0;
        o->n_distances = 1;
    }
    if (o->batch_tokens && (o->batch < 2 || o->batch_trace))
        return cmd_usage_error(CMD, "--batch-tokens is for --batch B with B > 1");
    if (o->batch_tokens && o->batch > o->batch_tokens)
        return cmd_usage_error(CMD, "--batch %d exceeds --batch-tokens %d", (int)o->batch,
                               (int)o->batch_tokens);
    if ((o->arrivals_start || o->arrivals_speedup > 0) && !o->arrivals)
        return cmd_usage_error(CMD, "--arrivals-start and --arrivals-speedup need --arrivals");
    if (o->arrivals_speedup <= 0) o->arrivals_speedup = 1;
    if ((rc = policy_settings(o)) != 0) return rc;
    return cmd_sim_store_validate(CMD, &o->store, o->policies, o->n_policies);
}

/* The gate data the chosen policies need; fails (one line) when the trace lacks it, notes
 * top-k-only probabilities. */
static int gate_needs(const options *o, const fmoe_trace_header *h, uint32_t *want) {
    *want = 0;
    const fmoe_policy_config have = {.probs_kind = h->probs_kind,
                                     .speculative_depth = h->speculative_depth};
    int noted_ids_only = 0;
    for (int i = 0; i < o->n_policies; i++) {
        const fmoe_policy_ops *ops = fmoe_policy_find(o->policies[i]);
        if (fmoe_policy_check_inputs(ops, &have) < 0) {
            fmoe_error_prefix("%s", o->trace);
            return cmd_fail(CMD, FMOE_EUNSUPPORTED);
        }
        if (ops->flags & (FMOE_POLICY_NEEDS_PROBS | FMOE_POLICY_USES_PROBS)) {
            *want |= FMOE_SIM_WANT_PROBS;
            if (h->probs_kind == FMOE_PROBS_TOPK && !o->quiet)
                fprintf(stderr,
                        "fmoe %s: note: %s holds top-k probabilities only; policy %s sees 0 "
                        "for the experts not chosen\n",
                        CMD, o->trace, ops->name);
            if (h->probs_kind == FMOE_PROBS_NONE && !o->quiet && !noted_ids_only++)
                fprintf(stderr,
                        "fmoe %s: note: %s holds expert ids only (no probabilities); the fmoe "
                        "policies take each chosen expert at 1/K\n",
                        CMD, o->trace);
        }
        if (ops->flags & FMOE_POLICY_NEEDS_SPECULATIVE) *want |= FMOE_SIM_WANT_SPECULATIVE;
        if ((ops->flags & FMOE_POLICY_NEEDS_HIDDEN) && h->hidden_dim < 1)
            return cmd_failf(CMD,
                             "%s has no hidden states (/tokens/hidden), which policy %s reads: "
                             "record the trace with 'fmoe record --hidden'",
                             o->trace, ops->name);
    }
    return 0;
}

/* --prefetch-distance counts layers ahead: one the trace's L layers cannot hold is a usage
 * error, like any other value out of range (checked for every policy: the same list applies
 * to all of them). */
static int check_distances(const options *o, int32_t L) {
    for (int i = 0; i < o->n_distances; i++)
        if (o->distances[i] >= L)
            return cmd_usage_error(CMD,
                                   "--prefetch-distance %d is not below the %d MoE layers of "
                                   "%s (at most %d)",
                                   (int)o->distances[i], (int)L, o->trace, (int)L - 1);
    return 0;
}

/* The distance a cell runs at when --prefetch-distance leaves it to the policy (0): the
 * policy's default, clamped to L - 1 when the trace has fewer layers than that default needs
 * (fmoe's 3 on a 2-layer model), with one note per policy, so the rest of a sweep runs.
 * @return the distance to run at, 0 (the executor's default), or -1: the trace has a single
 *         layer, so the policy cannot prefetch at all: skip its cells. */
static int32_t default_distance(const char *policy, int32_t L, int *noted) {
    const fmoe_policy_ops *ops = fmoe_policy_find(policy);
    if (!(ops->flags & FMOE_POLICY_PREFETCHES) || ops->default_distance < L) return 0;
    if (L < 2) {
        if (!(*noted)++ && !notes_off)
            fprintf(stderr, "fmoe simulate: note: policy %s prefetches layers ahead and the "
                            "trace has %d MoE layer; skipped\n", ops->name, (int)L);
        return -1;
    }
    if (!(*noted)++ && !notes_off)
        fprintf(stderr, "fmoe simulate: note: policy %s's default prefetch distance %d is not "
                        "below the trace's %d MoE layers; running it at %d\n",
                ops->name, (int)ops->default_distance, (int)L, (int)L - 1);
    return L - 1;
}

/* Whether a policy of the run reads the gate inputs. */
static int needs_hidden(const options *o) {
    for (int i = 0; i < o->n_policies; i++)
        if (fmoe_policy_find(o->policies[i])->flags & FMOE_POLICY_NEEDS_HIDDEN) return 1;
    return 0;
}

/* Reads one --predictor and checks it is for the trace's model (a fingerprint mismatch is
 * refused naming both; a trace or predictor without one is checked by geometry, in the
 * policy's init). */
static int load_predictor(const options *o, const char *path, const fmoe_trace_header *h,
                          fmoe_predictor **out) {
    *out = NULL;
    int rc = fmoe_predictor_read(path, out);
    if (rc < 0) return cmd_fail(CMD, rc);
    const fmoe_predictor *p = *out;
    if (p->model_fingerprint[0] && h->model_fingerprint[0] &&
        strcmp(p->model_fingerprint, h->model_fingerprint) != 0)
        return cmd_failf(CMD,
                         "%s is a predictor for model %s (fingerprint %s) but %s is model %s "
                         "(fingerprint %s); train one on traces of this model",
                         path, p->model_name[0] ? p->model_name : "(unnamed)",
                         p->model_fingerprint, o->trace,
                         h->model_name[0] ? h->model_name : "(unnamed)", h->model_fingerprint);
    if (fmoe_predictor_kind_id_of(p->kind) == FMOE_PREDICTOR_PROMOE &&
        p->hidden_size != h->hidden_dim)
        return cmd_failf(CMD, "%s reads gate inputs of width %d; %s holds %d-wide ones",
                         path, p->hidden_size, o->trace, h->hidden_dim);
    return 0;
}

/* The first built-in policy that predicts with a predictor of `kind` (the kind itself when
 * none does, which a file the reader accepted cannot be). */
static const char *policy_taking(const char *kind) {
    const fmoe_policy_ops *const *all = NULL;
    const size_t n = fmoe_policy_registry(&all);
    for (size_t i = 0; i < n; i++)
        if (fmoe_policy_takes_predictor(all[i], kind)) return all[i]->name;
    return kind;
}

/* Reads every --predictor into out[MAX_PREDICTORS] (one per kind) and checks that each
 * policy that takes one finds one of its kind, and each is taken. @return 0 or 1/2
 * (printed). */
#define MAX_PREDICTORS FMOE_PREDICTOR_NUM_KINDS
static int load_predictors(const options *o, const fmoe_trace_header *h,
                           fmoe_predictor **out) {
    if (o->predictors.n > MAX_PREDICTORS)
        return cmd_usage_error(CMD, "--predictor given %d times: at most one per kind (%s, %s)",
                               (int)o->predictors.n, FMOE_PREDICTOR_KIND_PROMOE,
                               FMOE_PREDICTOR_KIND_DUOSERVE);
    for (int i = 0; i < o->predictors.n; i++) {
        int rc = load_predictor(o, o->predictors.items[i], h, &out[i]);
        if (rc) return rc;
        for (int k = 0; k < i; k++)
            if (strcmp(out[k]->kind, out[i]->kind) == 0)
                return cmd_usage_error(CMD, "%s and %s are both %s predictors: give one per kind",
                                       o->predictors.items[k], o->predictors.items[i],
                                       out[i]->kind);
    }
    for (int p = 0; p < o->n_policies; p++) {
        const fmoe_policy_ops *ops = fmoe_policy_find(o->policies[p]);
        const char *kind = ops->predictor_kind;
        int found = 0;
        for (int i = 0; i < o->predictors.n; i++)
            found |= fmoe_policy_takes_predictor(ops, out[i]->kind);
        if (kind && !found)
            return cmd_failf(CMD, "policy %s needs a predictor of kind %s; %s is a %s predictor "
                                  "(train one with 'fmoe train-predictor --kind %s')",
                             o->policies[p], kind, o->predictors.items[0], out[0]->kind, kind);
    }
    for (int i = 0; i < o->predictors.n; i++) {
        int taken = 0;
        for (int p = 0; p < o->n_policies; p++)
            taken |= fmoe_policy_takes_predictor(fmoe_policy_find(o->policies[p]), out[i]->kind);
        if (!taken)
            return cmd_usage_error(CMD, "%s is a %s predictor, for policy %s, which --policy "
                                        "does not run",
                                   o->predictors.items[i], out[i]->kind,
                                   policy_taking(out[i]->kind));
    }
    return 0;
}

/* The predictor of the kind `policy` takes, or NULL. */
static const fmoe_predictor *predictor_for(const char *policy, fmoe_predictor *const *loaded) {
    const fmoe_policy_ops *ops = fmoe_policy_find(policy);
    for (int i = 0; i < MAX_PREDICTORS; i++)
        if (loaded[i] && fmoe_policy_takes_predictor(ops, loaded[i]->kind)) return loaded[i];
    return NULL;
}

/* Arrival times per request of the workload (malloc'd into *out). */
static int load_arrivals(const options *o, const fmoe_sim_workload *w, double **out) {
    *out = NULL;
    const int64_t R = w->num_requests;
    double *t = malloc((size_t)(R ? R : 1) * sizeof *t);
    if (!t) return cmd_failf(CMD, "out of memory");
    if (strcmp(o->arrivals, "trace") == 0) {
        for (int64_t i = 0; i < R; i++) t[i] = w->requests[i].arrival_s / o->arrivals_speedup;
        *out = t;
        return 0;
    }
    fmoe_arrivals *a = NULL;
    int rc = fmoe_arrivals_load_azure(o->arrivals, &a);
    if (rc < 0) {
        free(t);
        return cmd_fail(CMD, rc);
    }
    if (o->arrivals_start > a->count || a->count - o->arrivals_start < R) {
        int ex = cmd_failf(CMD,
                           "%s: %lld arrivals from row %lld, but the trace has %lld requests "
                           "(use --arrivals-start)",
                           o->arrivals, (long long)(o->arrivals_start < a->count
                                                        ? a->count - o->arrivals_start
                                                        : 0),
                           (long long)o->arrivals_start, (long long)R);
        fmoe_arrivals_free(a);
        free(t);
        return ex;
    }
    const double t0 = R ? a->arrival_s[o->arrivals_start] : 0;
    for (int64_t i = 0; i < R; i++)
        t[i] = (a->arrival_s[o->arrivals_start + i] - t0) / o->arrivals_speedup;
    fmoe_arrivals_free(a);
    *out = t;
    return 0;
}

/* ------------------------------------------------------------------ model and hardware */

/* Whose size of one expert a unit uses, as the output says it: --model-config's (a "what if
 * the experts were Q4_K" run answers for the file given, not for the trace's recording),
 * else the trace's, else the size the trace's stored config.json gives. */
typedef struct expert_size {
    const char *from;    /* "model-config", "trace" or "trace config.json" */
    int64_t trace_bytes; /* the trace's expert_bytes attribute, 0 when it has none */
    int64_t *layers;     /* [L] bytes of one expert of each layer, from a --model-config GGUF
                            whose layers differ (a llama-quantize mix); NULL: uniform */
} expert_size;

/* Bytes of one routed expert of each MoE layer of a GGUF file, counted from its stacked
 * expert tensors as the forward pass stores them (runtime/model/parts.c counts the same):
 * a llama-quantize mix such as Q4_K_M gives some layers' down projections more bits.
 * *out NULL (and 0 returned) when a layer's gate, up or down tensor is not found, so the
 * geometry's uniform size applies. @return 0 or the GGUF reader's error. */
static int gguf_layer_expert_bytes(const char *path, const fmoe_model_geometry *g,
                                   int64_t **out) {
    *out = NULL;
    fmoe_gguf *f = NULL;
    int rc = fmoe_gguf_open(path, &f);
    if (rc < 0) return rc;
    int64_t *b = calloc((size_t)g->num_moe_layers, sizeof *b);
    if (!b) {
        fmoe_gguf_close(f);
        return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    }
    static const char *const parts[] = {"gate", "up", "down"};
    for (int32_t l = 0; l < g->num_moe_layers && b; l++)
        for (int p = 0; p < 3 && b; p++)
            for (int bias = 0; bias < 2; bias++) {
                char name[96];
                snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.%s", g->moe_layer_index[l],
                         parts[p], bias ? "bias" : "weight");
                const fmoe_gguf_tensor *t = fmoe_gguf_find_tensor(f, name);
                if (t) b[l] += t->nbytes / g->num_experts;
                else if (!bias) { /* not a layout counted here */
                    free(b);
                    b = NULL;
                    break;
                }
            }
    fmoe_gguf_close(f);
    *out = b;
    return 0;
}

static int load_costs(const options *o, fmoe_trace_reader *r, fmoe_sim_costs *costs,
                      int64_t *expert_bytes, expert_size *es, fmoe_hardware_profile *hw) {
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    fmoe_model_geometry g;
    int have_g = 0, rc;
    if (o->model_config) {
        rc = fmoe_geometry_load(o->model_config, &g);
        if (rc < 0) return rc;
        have_g = 1;
    } else if (h->config_json && h->config_json[0]) {
        /* A stored config that does not parse (e.g. an unsupported family) is not fatal:
         * the header's sizes still give a rough roofline. */
        have_g = fmoe_geometry_parse(h->config_json, strlen(h->config_json), &g) == 0;
        fmoe_error_clear();
    }
    if (have_g && (g.num_moe_layers != h->num_layers || g.num_experts != h->num_experts ||
                   g.top_k != h->top_k))
        return fmoe_error_set(FMOE_EMISMATCH,
                              "%s: model has %d MoE layers, %d experts, top-%d; the trace has "
                              "%d, %d, top-%d",
                              o->model_config ? o->model_config : "the trace's config.json",
                              g.num_moe_layers, g.num_experts, g.top_k, h->num_layers,
                              h->num_experts, h->top_k);
    *expert_bytes = h->expert_bytes;
    es->trace_bytes = h->expert_bytes > 0 ? h->expert_bytes : 0;
    es->from = "trace";
    if (o->model_config) { /* the file given: its experts' stored type and layers */
        *expert_bytes = fmoe_geometry_expert_bytes(&g, g.expert_dtype);
        es->from = "model-config";
        free(es->layers);
        es->layers = NULL;
        if (fmoe_gguf_is_file(o->model_config) &&
            (rc = gguf_layer_expert_bytes(o->model_config, &g, &es->layers)) < 0)
            return rc;
        if (es->layers) {
            int64_t most = 0, least = INT64_MAX;
            for (int32_t l = 0; l < g.num_moe_layers; l++) {
                most = es->layers[l] > most ? es->layers[l] : most;
                least = es->layers[l] < least ? es->layers[l] : least;
            }
            *expert_bytes = most;
            if (least == most) { /* uniform: one size says it */
                free(es->layers);
                es->layers = NULL;
            }
        }
    } else if (*expert_bytes <= 0 && have_g) {
        *expert_bytes = fmoe_geometry_expert_bytes(&g, g.expert_dtype);
        es->from = "trace config.json";
    }
    if (*expert_bytes <= 0)
        return fmoe_error_set(FMOE_EINVAL,
                              "%s: the trace does not say how large an expert is; pass "
                              "--model-config config.json",
                              o->trace);
    if (o->profile) {
        rc = fmoe_hardware_load(o->profile, hw);
    } else {
        rc = fmoe_hardware_preset(o->hardware ? o->hardware : DEFAULT_HARDWARE, hw);
    }
    if (rc < 0) return rc;
    fmoe_dtype dt;
    double bits = fmoe_dtype_parse(h->dtype, &dt) == 0 ? fmoe_dtype_bits(dt) : 16;
    if (o->model_config) bits = fmoe_dtype_bits(g.expert_dtype);
    fmoe_error_clear();
    rc = fmoe_sim_costs_init(costs, hw, have_g ? &g : NULL, *expert_bytes, h->hidden_size, bits);
    if (rc < 0 && o->profile) fmoe_error_prefix("%s", o->profile);
    return rc;
}

/* ------------------------------------------------------------------ output */

static double hit_rate(const fmoe_sim_result *r) {
    return r->accesses ? (double)r->hits / (double)r->accesses : 0.0;
}

static const char *miss_name(int32_t m) {
    return m == FMOE_SIM_MISS_CPU ? "cpu" : m == FMOE_SIM_MISS_AUTO ? "auto" : "load";
}

/* A ratio that may be undefined (NAN): null in JSON. */
static void add_ratio(cJSON *o, const char *key, double v) {
    if (isnan(v)) cJSON_AddNullToObject(o, key);
    else cJSON_AddNumberToObject(o, key, v);
}

static double layer_ratio(int64_t num, int64_t den) {
    return den > 0 ? (double)num / (double)den : NAN;
}

static cJSON *summary_json(const fmoe_sim_summary *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "mean", s->mean);
    cJSON_AddNumberToObject(o, "p50", s->p50);
    cJSON_AddNumberToObject(o, "p90", s->p90);
    cJSON_AddNumberToObject(o, "p99", s->p99);
    return o;
}

/* One unit's JSON document (what a sweep of one trace on one hardware prints). */
static cJSON *unit_json(const options *o, const fmoe_hardware_profile *hw, int64_t expert_bytes,
                        const expert_size *es, const fmoe_sim_workload *w,
                        const fmoe_sim_result *res, size_t n) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "trace", o->trace);
    cJSON_AddStringToObject(root, "hardware", hw->name);
    cJSON_AddNumberToObject(root, "expert_bytes", (double)expert_bytes);
    /* whose size: the trace's, or --model-config's (then with the trace's, 0: none) */
    cJSON_AddStringToObject(root, "expert_bytes_from", es->from);
    if (o->model_config) {
        cJSON_AddStringToObject(root, "model_config", o->model_config);
        cJSON_AddNumberToObject(root, "trace_expert_bytes", (double)es->trace_bytes);
    }
    if (es->layers) {
        cJSON *a = cJSON_AddArrayToObject(root, "layer_expert_bytes");
        for (int32_t l = 0; l < w->num_layers; l++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber((double)es->layers[l]));
    }
    cJSON_AddNumberToObject(root, "requests", (double)w->num_requests);
    cJSON_AddNumberToObject(root, "iterations", (double)w->num_iterations);
    cJSON_AddNumberToObject(root, "accesses", (double)w->num_accesses);
    if (o->arrivals) cJSON_AddStringToObject(root, "arrivals", o->arrivals);
    /* "batch" only when batching, so that --batch 1 prints what earlier versions did */
    if (o->batch > 1) {
        cJSON_AddNumberToObject(root, "batch", o->batch);
        cJSON_AddNumberToObject(root, "batch_tokens", w->batch_tokens);
    }
    if (o->batch_trace) { /* the passes of the served trace; "batch" their widest */
        cJSON_AddNumberToObject(root, "batch", w->batch);
        cJSON_AddStringToObject(root, "batch_source", "trace");
    }
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    for (size_t i = 0; i < n; i++) {
        const fmoe_sim_result *r = &res[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "policy", r->policy);
        cJSON_AddNumberToObject(x, "cache_experts", r->cache_experts);
        cJSON_AddNumberToObject(x, "cache_bytes", (double)r->cache_experts * (double)expert_bytes);
        cJSON_AddNumberToObject(x, "prefetch_distance", r->prefetch_distance);
        if (r->batch > 1) cJSON_AddNumberToObject(x, "batch", r->batch);
        cJSON_AddNumberToObject(x, "accesses", (double)r->accesses);
        cJSON_AddNumberToObject(x, "hits", (double)r->hits);
        cJSON_AddNumberToObject(x, "late_hits", (double)r->late_hits);
        cJSON_AddNumberToObject(x, "misses", (double)r->misses);
        cJSON_AddNumberToObject(x, "hit_rate", hit_rate(r));
        cJSON_AddNumberToObject(x, "prefetches", (double)r->prefetches);
        cJSON_AddNumberToObject(x, "prefetch_hits", (double)r->prefetch_hits);
        cJSON_AddNumberToObject(x, "bypassed", (double)r->bypassed);
        cJSON_AddNumberToObject(x, "bytes_loaded", (double)r->bytes_loaded);
        cJSON_AddNumberToObject(x, "wasted_prefetch_bytes", (double)r->wasted_prefetch_bytes);
        add_ratio(x, "prefetch_precision", r->prefetch_precision);
        add_ratio(x, "prefetch_recall", r->prefetch_recall);
        add_ratio(x, "goodpred", r->goodpred);
        cJSON_AddStringToObject(x, "miss", miss_name(r->miss_mode));
        cJSON_AddNumberToObject(x, "host_misses", (double)r->host_misses);
        cJSON_AddNumberToObject(x, "host_busy_s", r->host_busy_s);
        cJSON_AddNumberToObject(x, "stall_s", r->stall_s);
        cJSON_AddNumberToObject(x, "total_s", r->total_s);
        cJSON_AddItemToObject(x, "ttft_s", summary_json(&r->ttft_s));
        cJSON_AddItemToObject(x, "tpot_s", summary_json(&r->tpot_s));
        cJSON_AddItemToObject(x, "e2e_s", summary_json(&r->e2e_s));
        cJSON_AddItemToObject(x, "queue_s", summary_json(&r->queue_s));
        cJSON *pp = cJSON_AddObjectToObject(x, "per_phase");
        for (int ph = 0; ph < 2; ph++) {
            const fmoe_sim_layer_stats *s = &r->per_phase[ph];
            cJSON *y = cJSON_AddObjectToObject(pp, ph ? "decode" : "prefill");
            cJSON_AddNumberToObject(y, "accesses", (double)s->accesses);
            cJSON_AddNumberToObject(y, "hits", (double)s->hits);
            cJSON_AddNumberToObject(y, "late_hits", (double)s->late_hits);
            cJSON_AddNumberToObject(y, "misses", (double)s->misses);
            cJSON_AddNumberToObject(y, "hit_rate",
                                    s->accesses ? (double)s->hits / (double)s->accesses : 0.0);
            cJSON_AddNumberToObject(y, "bytes_loaded", (double)s->bytes_loaded);
            cJSON_AddNumberToObject(y, "prefetches", (double)s->prefetches);
            cJSON_AddNumberToObject(y, "prefetch_hits", (double)s->prefetch_hits);
            cJSON_AddNumberToObject(y, "host_misses", (double)s->host_misses);
            cJSON_AddNumberToObject(y, "stall_s", s->stall_s);
        }
        cJSON *pl = cJSON_AddArrayToObject(x, "per_layer");
        for (int32_t l = 0; l < r->num_layers; l++) {
            const fmoe_sim_layer_stats *s = &r->per_layer[l];
            cJSON *y = cJSON_CreateObject();
            cJSON_AddNumberToObject(y, "layer", l);
            cJSON_AddNumberToObject(y, "accesses", (double)s->accesses);
            cJSON_AddNumberToObject(y, "hits", (double)s->hits);
            cJSON_AddNumberToObject(y, "late_hits", (double)s->late_hits);
            cJSON_AddNumberToObject(y, "misses", (double)s->misses);
            cJSON_AddNumberToObject(y, "hit_rate",
                                    s->accesses ? (double)s->hits / (double)s->accesses : 0.0);
            cJSON_AddNumberToObject(y, "bytes_loaded", (double)s->bytes_loaded);
            cJSON_AddNumberToObject(y, "prefetches", (double)s->prefetches);
            cJSON_AddNumberToObject(y, "prefetch_hits", (double)s->prefetch_hits);
            cJSON_AddNumberToObject(y, "wasted_prefetch_bytes", (double)s->wasted_prefetch_bytes);
            const int64_t used = s->prefetch_hits + s->late_hits;
            add_ratio(y, "prefetch_precision", layer_ratio(used, s->prefetches));
            add_ratio(y, "prefetch_recall", layer_ratio(used, used + s->misses));
            add_ratio(y, "goodpred", layer_ratio(s->prefetch_hits, used + s->misses));
            cJSON_AddNumberToObject(y, "host_misses", (double)s->host_misses);
            cJSON_AddNumberToObject(y, "stall_s", s->stall_s);
            cJSON_AddItemToArray(pl, y);
        }
        cJSON_AddItemToArray(arr, x);
    }
    return root;
}

/* --plot: hit rate and latency (TPOT p50, or TTFT p50 for a trace without decode) against
 * cache size, one series per (policy, prefetch distance), points sorted by cache size. */
static int write_plot(const char *path, const char *trace, const fmoe_sim_result *res,
                      size_t n) {
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    double *x = malloc((n ? n : 1) * sizeof *x), *hit = malloc((n ? n : 1) * sizeof *hit);
    double *lat = malloc((n ? n : 1) * sizeof *lat);
    plot_series *sh = calloc(n ? n : 1, sizeof *sh), *sl = calloc(n ? n : 1, sizeof *sl);
    char (*labels)[64] = calloc(n ? n : 1, sizeof *labels);
    int rc = 0;
    if (!order || !x || !hit || !lat || !sh || !sl || !labels) {
        rc = fmoe_error_set(FMOE_ENOMEM, "plot of %zu results", n);
        goto done;
    }
    int decode = 0;
    for (size_t i = 0; i < n; i++) decode |= res[i].tpot_s.p50 > 0;
    /* group (policy, distance) in order of first appearance, each by cache size */
    size_t m = 0;
    int32_t ns = 0;
    uint8_t *taken = calloc(n ? n : 1, 1);
    if (!taken) {
        rc = fmoe_error_set(FMOE_ENOMEM, "plot");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if (taken[i]) continue;
        const size_t first = m;
        for (size_t k = i; k < n; k++)
            if (!taken[k] && strcmp(res[k].policy, res[i].policy) == 0 &&
                res[k].prefetch_distance == res[i].prefetch_distance) {
                size_t at = m++; /* insertion by cache size */
                while (at > first && res[order[at - 1]].cache_experts > res[k].cache_experts) {
                    order[at] = order[at - 1];
                    at--;
                }
                order[at] = k;
                taken[k] = 1;
            }
        for (size_t q = first; q < m; q++) {
            x[q] = res[order[q]].cache_experts;
            hit[q] = 100.0 * hit_rate(&res[order[q]]);
            lat[q] = 1e3 * (decode ? res[order[q]].tpot_s.p50 : res[order[q]].ttft_s.p50);
        }
        int distances = 0; /* the distance is named only for a policy run at several */
        for (size_t k = 0; k < n; k++)
            distances |= strcmp(res[k].policy, res[i].policy) == 0 &&
                         res[k].prefetch_distance != res[i].prefetch_distance;
        if (distances)
            snprintf(labels[ns], sizeof labels[ns], "%s d=%d", res[i].policy,
                     res[i].prefetch_distance);
        else
            snprintf(labels[ns], sizeof labels[ns], "%s", res[i].policy);
        sh[ns] = (plot_series){labels[ns], (int32_t)(m - first), x + first, hit + first};
        sl[ns] = (plot_series){labels[ns], (int32_t)(m - first), x + first, lat + first};
        ns++;
    }
    free(taken);
    const plot_panel panels[2] = {
        {"hit rate", "cache (experts)", "hit rate (%)", ns, sh},
        {decode ? "TPOT p50" : "TTFT p50", "cache (experts)", decode ? "TPOT p50 (ms)" :
                                                                      "TTFT p50 (ms)", ns, sl}};
    rc = plot_svg_write(path, trace, panels, 2);
done:
    free(order);
    free(x);
    free(hit);
    free(lat);
    free(sh);
    free(sl);
    free(labels);
    return rc;
}

/* A CSV field: as is, or quoted when it holds a comma, quote or line break. */
static void csv_field(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

/* Rows res[0..n); with several units (prefix != NULL) each row opens with its unit's
 * trace and hardware. */
static int write_csv(const char *path, const fmoe_sim_result *res, size_t n,
                     const char *const *prefix) {
    /* Through PATH.partial, renamed when complete: an existing PATH is never truncated first. */
    char partial[PATH_MAX + 16];
    snprintf(partial, sizeof partial, "%s.partial", path);
    FILE *f = stdout;
    if (strcmp(path, "-") != 0) {
        int e = fmoe__partial_fopen(path, partial, "w", &f);
        if (e < 0) return cmd_fail(CMD, e);
    }
    if (prefix) fputs("trace,hardware,", f);
    fprintf(f, "policy,cache_experts,prefetch_distance,accesses,hits,late_hits,misses,hit_rate,"
               "bytes_loaded,wasted_prefetch_bytes,stall_s,total_s,ttft_mean_s,ttft_p50_s,"
               "ttft_p90_s,ttft_p99_s,tpot_mean_s,tpot_p50_s,tpot_p90_s,tpot_p99_s,e2e_mean_s,"
               "e2e_p50_s,e2e_p90_s,e2e_p99_s,prefetches,prefetch_hits,prefetch_precision,"
               "prefetch_recall,goodpred,miss,host_misses,host_busy_s,queue_mean_s,queue_p50_s,"
               "queue_p90_s,queue_p99_s\n");
    for (size_t i = 0; i < n; i++) {
        const fmoe_sim_result *r = &res[i];
        if (prefix) {
            csv_field(f, prefix[2 * i]);
            fputc(',', f);
            csv_field(f, prefix[2 * i + 1]);
            fputc(',', f);
        }
        fprintf(f, "%s,%d,%d,%lld,%lld,%lld,%lld,%.6f,%lld,%lld,%.9g,%.9g", r->policy,
                r->cache_experts, r->prefetch_distance, (long long)r->accesses,
                (long long)r->hits, (long long)r->late_hits, (long long)r->misses, hit_rate(r),
                (long long)r->bytes_loaded, (long long)r->wasted_prefetch_bytes, r->stall_s,
                r->total_s);
        const fmoe_sim_summary *s[3] = {&r->ttft_s, &r->tpot_s, &r->e2e_s};
        for (int k = 0; k < 3; k++)
            fprintf(f, ",%.9g,%.9g,%.9g,%.9g", s[k]->mean, s[k]->p50, s[k]->p90, s[k]->p99);
        fprintf(f, ",%lld,%lld", (long long)r->prefetches, (long long)r->prefetch_hits);
        const double q[3] = {r->prefetch_precision, r->prefetch_recall, r->goodpred};
        for (int k = 0; k < 3; k++) {
            if (isnan(q[k])) fputs(",", f);
            else fprintf(f, ",%.6f", q[k]);
        }
        fprintf(f, ",%s,%lld,%.9g,%.9g,%.9g,%.9g,%.9g\n", miss_name(r->miss_mode),
                (long long)r->host_misses, r->host_busy_s, r->queue_s.mean, r->queue_s.p50,
                r->queue_s.p90, r->queue_s.p99);
    }
    int bad = ferror(f);
    if (f == stdout) return bad ? cmd_failf(CMD, "standard output: write error") : 0;
    bad |= fclose(f) != 0;
    if (bad || rename(partial, path) != 0) {
        const int e = errno;
        unlink(partial);
        return cmd_failf(CMD, "%s: cannot write: %s", path, strerror(e));
    }
    return 0;
}

static const fmoe_sim_result *sort_base;
static int cmp_best(const void *a, const void *b) {
    const fmoe_sim_result *x = &sort_base[*(const size_t *)a], *y = &sort_base[*(const size_t *)b];
    if (x->e2e_s.mean != y->e2e_s.mean) return x->e2e_s.mean < y->e2e_s.mean ? -1 : 1;
    if (x->hits != y->hits) return x->hits > y->hits ? -1 : 1;
    return (*(const size_t *)a > *(const size_t *)b) - (*(const size_t *)a < *(const size_t *)b);
}

/* "  12.3%" or "      -" for an undefined ratio. */
static const char *pct(double v, char *buf, size_t cap) {
    if (isnan(v)) snprintf(buf, cap, "%7s", "-");
    else snprintf(buf, cap, "%6.1f%%", 100.0 * v);
    return buf;
}

static void print_table(const options *o, const fmoe_hardware_profile *hw, int64_t expert_bytes,
                        const expert_size *es, const fmoe_sim_workload *w,
                        const fmoe_sim_result *res, size_t n, size_t *order) {
    char eb[32], cb[32], lb[32], wb[32], gp[16];
    printf("%s: %lld request%s, %lld iterations, %lld expert accesses; expert %s",
           o->trace, (long long)w->num_requests, w->num_requests == 1 ? "" : "s",
           (long long)w->num_iterations,
           (long long)w->num_accesses, cmd_format_bytes((double)expert_bytes, eb, sizeof eb));
    if (o->model_config) { /* whose size, when it is not the trace's own */
        printf(" (%sfrom --model-config %s; the trace's: %s)",
               es->layers ? "the largest layer's, " : "", o->model_config,
               es->trace_bytes ? cmd_format_bytes((double)es->trace_bytes, cb, sizeof cb)
                               : "none");
    }
    printf("; hardware %s", hw->name);
    if (o->miss_mode != FMOE_SIM_MISS_LOAD) printf("; misses: %s", miss_name(o->miss_mode));
    if (o->arrivals) printf("; arrivals: %s (FCFS)", o->arrivals);
    if (o->batch > 1) printf("; batch %d (continuous batching, %d tokens an iteration)", o->batch,
                             (int)w->batch_tokens);
    if (o->batch_trace)
        printf("; batch: the trace's served passes (up to %d requests a pass)", (int)w->batch);
    printf("\n\n");
    for (size_t i = 0; i < n; i++) order[i] = i;
    sort_base = res;
    qsort(order, n, sizeof *order, cmp_best);
    printf("%-17s %6s %10s %2s %7s %9s %9s %10s %10s %8s %9s %9s %9s %9s", "policy", "cache",
           "(bytes)", "d", "hit%", "late", "misses", "loaded", "wasted", "goodpred", "stall s",
           "TTFT p50", "TPOT p50", "e2e p99");
    if (o->arrivals) printf(" %9s", "queue p99");
    if (o->miss_mode != FMOE_SIM_MISS_LOAD) printf(" %9s", "on host");
    printf("\n");
    for (size_t k = 0; k < n; k++) {
        const fmoe_sim_result *r = &res[order[k]];
        printf("%-17s %6d %10s %2d %6.2f%% %9lld %9lld %10s %10s %8s %9.3f %7.2fms %7.2fms "
               "%8.3fs",
               r->policy, r->cache_experts,
               cmd_format_bytes((double)r->cache_experts * (double)expert_bytes, cb, sizeof cb),
               r->prefetch_distance, 100.0 * hit_rate(r), (long long)r->late_hits,
               (long long)r->misses, cmd_format_bytes((double)r->bytes_loaded, lb, sizeof lb),
               cmd_format_bytes((double)r->wasted_prefetch_bytes, wb, sizeof wb),
               pct(r->prefetches ? r->goodpred : NAN, gp, sizeof gp), r->stall_s, 1e3 * r->ttft_s.p50,
               1e3 * r->tpot_s.p50, r->e2e_s.p99);
        if (o->arrivals) printf(" %8.3fs", r->queue_s.p99);
        if (o->miss_mode != FMOE_SIM_MISS_LOAD) printf(" %9lld", (long long)r->host_misses);
        printf("\n");
    }
}

/* ------------------------------------------------------------------ units */

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

static void unit_free(sim_unit *u) {
    free(u->arrivals);
    free(u->es.layers);
    fmoe_sim_workload_free(&u->w);
    cmd_sim_store_free(&u->store);
    for (int i = 0; i < MAX_PREDICTORS; i++) fmoe_predictor_free(u->predictors[i]);
}

/* The options as they apply to unit u (the helpers above read o->trace, o->profile, ...). */
static options unit_options(const options *o, const sim_unit *u) {
    options uo = *o;
    uo.trace = u->trace;
    uo.profile = u->profile;
    uo.hardware = u->hardware;
    return uo;
}

/* Grows the cell list to hold `more` cells. @return 0 or 1 (printed). */
static int reserve_cells(fmoe_sim_config **cells, size_t n, size_t *cap, size_t more) {
    if (n + more <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < n + more) c *= 2;
    fmoe_sim_config *g = realloc(*cells, c * sizeof *g);
    if (!g) return cmd_failf(CMD, "out of memory");
    *cells = g;
    *cap = c;
    return 0;
}

/* What --sweep-out keys a trace's cells by besides its path, so that a trace replaced
 * under the same path is not taken for the one the file's cells ran on: sha256 of the
 * header's `created` time, model fingerprint and dataset, and of the routing replayed
 * (every token's chosen experts, and the requests' token counts), as read. Hashing the
 * file would cost a pass over gigabytes on every resume; the routing is in memory already
 * and is what the cells computed from, and `created` (a new one for every recording and
 * import) covers the gate probabilities and embeddings, which are not hashed. */
static void trace_identity(const fmoe_trace_header *h, const fmoe_sim_workload *w,
                           char hex[65]) {
    fmoe_sha256 s;
    fmoe_sha256_init(&s);
    fmoe_sha256_update(&s, h->created, strlen(h->created) + 1);
    fmoe_sha256_update(&s, h->model_fingerprint, strlen(h->model_fingerprint) + 1);
    fmoe_sha256_update(&s, h->dataset, strlen(h->dataset) + 1);
    const int64_t shape[4] = {w->num_requests, w->num_tokens, w->num_layers, w->top_k};
    fmoe_sha256_update(&s, shape, sizeof shape);
    for (int64_t r = 0; r < w->num_requests; r++) {
        const int64_t n[2] = {w->requests[r].prompt_tokens, w->requests[r].output_tokens};
        fmoe_sha256_update(&s, n, sizeof n);
    }
    fmoe_sha256_update(&s, w->experts,
                       (size_t)w->num_tokens * (size_t)w->num_layers * (size_t)w->top_k *
                           sizeof *w->experts);
    uint8_t d[32];
    fmoe_sha256_final(&s, d);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

/* Reads the unit's trace (with what its policies need) and appends its cells to
 * cells[*n]. @return 0, 1 or 2 (printed). */
static int prepare_unit(const options *base, sim_unit *u, fmoe_sim_config **cells, size_t *n,
                        size_t *cap) {
    options o = unit_options(base, u);
    fmoe_trace_reader *reader = NULL;
    int exit_code = 0, rc = 0;
    uint32_t want = 0;
    u->cell0 = *n;
    rc = fmoe_trace_reader_open(&reader, o.trace);
    if (rc < 0) goto fail;
    exit_code = gate_needs(&o, fmoe_trace_reader_header(reader), &want);
    if (exit_code) goto done;
    exit_code = check_distances(&o, fmoe_trace_reader_header(reader)->num_layers);
    if (exit_code) goto done;
    exit_code = load_predictors(&o, fmoe_trace_reader_header(reader), u->predictors);
    if (exit_code) goto done;
    if (o.batch_trace) { /* the served passes: only a trace of fmoe serve has them */
        if (!fmoe_trace_reader_header(reader)->served) {
            exit_code = cmd_failf(CMD,
                                  "%s: --batch trace needs a trace of fmoe serve --trace-out "
                                  "(no /tokens/served_iteration)",
                                  o.trace);
            goto done;
        }
        want |= FMOE_SIM_WANT_SERVED;
    }
    exit_code = cmd_sim_store_prepare(CMD, &u->store, o.policies, o.n_policies, o.trace, reader,
                                      &want, o.quiet); /* may add the semantic rows */
    if (exit_code) goto done;
    rc = load_costs(&o, reader, &u->costs, &u->expert_bytes, &u->es, &u->hw);
    if (rc < 0) goto fail;
    cmd_sim_store_costs(&u->store, &u->costs); /* --match-delay */
    if (o.miss_mode != FMOE_SIM_MISS_LOAD && !fmoe_sim_costs_have_host(&u->costs)) {
        exit_code = cmd_failf(CMD,
                              "%s: --miss %s needs host compute figures (host.expert_s, or "
                              "host.peak_flops and host.memory_bandwidth_bytes_per_s); measure "
                              "them with 'fmoe calibrate' and pass --profile",
                              o.profile ? o.profile : u->hw.name, miss_name(o.miss_mode));
        goto done;
    }
    const int64_t expert_bytes = u->expert_bytes;
    /* Cache sizes in slots. */
    int32_t caches[MAX_LIST];
    int n_caches = o.n_caches;
    memcpy(caches, o.caches, sizeof caches);
    for (int i = 0; i < o.n_cache_gb; i++) {
        const double slots = floor(o.cache_gb[i] * 1073741824.0 / (double)expert_bytes);
        if (slots < 1) {
            char b[32];
            exit_code = cmd_usage_error(CMD, "--cache-gb %g holds no expert (one is %s)",
                                        o.cache_gb[i],
                                        cmd_format_bytes((double)expert_bytes, b, sizeof b));
            goto done;
        }
        caches[n_caches++] = slots > INT32_MAX ? INT32_MAX : (int32_t)slots;
    }
    {
        cmd_progress_bar bar;
        cmd_progress_bar_init(&bar, "reading trace", o.quiet);
        fmoe_progress p = cmd_progress_bar_callback(&bar);
        rc = fmoe_sim_workload_read_filtered(&u->w, reader, want, u->store.keep, &p); /* --holdout */
        if (rc == 0 && needs_hidden(&o)) /* the gate inputs, for promoe's predictor */
            rc = fmoe_sim_workload_read_hidden(&u->w, reader, u->store.keep);
        cmd_progress_bar_done(&bar);
        if (rc < 0) {
            if (!strstr(fmoe_error_detail(), o.trace)) fmoe_error_prefix("%s", o.trace);
            goto fail;
        }
    }
    if (o.sweep_out) trace_identity(fmoe_trace_reader_header(reader), &u->w, u->trace_id);
    if (o.model_config) { /* its size, not the trace's, per layer as it stores them */
        u->w.expert_bytes = expert_bytes;
        for (int32_t l = 0; l < u->w.num_layers; l++)
            u->w.layer_expert_bytes[l] = u->es.layers ? u->es.layers[l] : expert_bytes;
    }
    fmoe_trace_reader_close(reader);
    reader = NULL;
    {
        /* The byte counters are int64: each access loads at most one expert, and each
         * iteration's layer prefetches at most J, so loads <= A + I*L*J. Refuse a size that
         * could overflow them (a trace imported elsewhere with an absurd expert size)
         * instead of printing negative bytes; 2^60 keeps an 8x margin. */
        const double loads = (double)u->w.num_accesses +
                             (double)u->w.num_iterations * u->w.num_layers * (double)u->w.num_experts;
        if (expert_bytes > MAX_EXPERT_BYTES || (double)expert_bytes * loads > 0x1p60) {
            char b[32];
            exit_code = cmd_failf(CMD,
                                  "%s: an expert of %lld bytes (%s) is too large to count its "
                                  "loads over %.0f accesses; at most %s",
                                  o.trace, (long long)expert_bytes,
                                  cmd_format_bytes((double)expert_bytes, b, sizeof b),
                                  (double)u->w.num_accesses, "1 TiB and 2^60 bytes in all");
            goto done;
        }
    }
    /* More slots than the model has experts change nothing but the memory they take. */
    for (int i = 0; i < n_caches; i++) {
        const int32_t all = u->w.num_layers * u->w.num_experts;
        if (caches[i] > all) {
            if (!notes_off)
                fprintf(stderr, "fmoe simulate: note: a cache of %d experts holds all %d (L x J); "
                                "simulating %d\n", (int)caches[i], (int)all, (int)all);
            caches[i] = all;
        }
    }
    if (o.arrivals) {
        exit_code = load_arrivals(&o, &u->w, &u->arrivals);
        if (exit_code) goto done;
    }
    if (o.batch > 1 || o.batch_trace) { /* the iterations fmoe serve --parallel B would
                                           run, or those it ran */
        fmoe_sim_workload batched;
        /* the budget: the option, else what the server ran with (its trace's chunk) */
        const int32_t budget = o.batch_tokens         ? o.batch_tokens
                               : u->w.prefill_chunk > 0 ? u->w.prefill_chunk
                                                        : FMOE_BATCH_TOKENS;
        if (!o.batch_trace && o.batch > budget) {
            exit_code = cmd_usage_error(CMD,
                                        "%s: --batch %d exceeds the trace's %d tokens a pass "
                                        "(its prefill_chunk); give --batch-tokens",
                                        o.trace, (int)o.batch, (int)budget);
            goto done;
        }
        rc = o.batch_trace ? fmoe_sim_workload_served(&batched, &u->w)
                           : fmoe_sim_workload_batch(&batched, &u->w, o.batch, budget,
                                                     u->arrivals, &u->costs);
        if (rc < 0) {
            if (!strstr(fmoe_error_detail(), o.trace)) fmoe_error_prefix("%s", o.trace);
            goto fail;
        }
        fmoe_sim_workload_free(&u->w);
        u->w = batched;
    }

    const size_t most = (size_t)o.n_policies * (size_t)n_caches * (size_t)o.n_distances;
    if ((exit_code = reserve_cells(cells, *n, cap, most)) != 0) goto done;
    /* MoE-Infinity's collections take one EAM per request, and are allocated whole up
     * front: beyond the trace's requests the rows stay empty and nothing is evicted, so the
     * capacity is sized to them (--eamc-capacity 10000000 asked for gigabytes). */
    const int32_t eamc_capacity =
        u->w.num_requests > 0 && u->w.num_requests < o.eamc_capacity ? (int32_t)u->w.num_requests
                                                                      : o.eamc_capacity;
    /* A policy that does not prefetch runs once per cache size, whatever the distances.
     * A policy that takes the store runs, when --prefetch-distance leaves it to the policy,
     * at the distance the store was built for (its redundancy scores weight the layers for
     * it), not at its own default; cmd_sim_store_distance_note says when a given one
     * differs. */
    const int32_t store_d = cmd_sim_store_distance(&u->store);
    size_t k = *n;
    for (int p = 0; p < o.n_policies; p++) {
        const fmoe_policy_ops *ops = fmoe_policy_find(o.policies[p]);
        const int by_store = store_d > 0 && (ops->flags & FMOE_POLICY_TAKES_STORE) &&
                             (ops->flags & FMOE_POLICY_PREFETCHES);
        int noted = 0;
        for (int c = 0; c < n_caches; c++)
            for (int d = 0; d < o.n_distances; d++) {
                int32_t dist = o.distances[d];
                if (dist == 0 && by_store) dist = store_d;
                if (dist == 0 && (dist = default_distance(o.policies[p], u->w.num_layers,
                                                          &noted)) < 0)
                    continue;
                if (d == 0 || (ops->flags & FMOE_POLICY_PREFETCHES)) {
                    fmoe_sim_config *cell = &(*cells)[k++];
                    *cell = (fmoe_sim_config){
                        .policy = o.policies[p], .cache_experts = caches[c],
                        .prefetch_distance = dist, .costs = &u->costs,
                        .miss_mode = o.miss_mode, .arrival_s = u->arrivals,
                        .copy_chunks = o.copy_chunks,
                        .feedback = cmd_feedback_request(o.feedback),
                        /* each policy the predictor of its kind */
                        .predictor = predictor_for(o.policies[p], u->predictors)};
                    /* each policy the settings it declares */
                    fmoe_policy_settings_select(&cell->policy_settings, ops, &o.settings);
                    if (fmoe_policy_settings_get(&cell->policy_settings, "eamc_capacity")) {
                        char v[24];
                        snprintf(v, sizeof v, "%d", (int)eamc_capacity);
                        fmoe_policy_settings_set(&cell->policy_settings, "eamc_capacity", v);
                    }
                }
            }
    }
    if (k == *n) {
        exit_code = cmd_failf(CMD, "%s: none of the policies can run on a 1-layer trace",
                              o.trace);
        goto done;
    }
    for (size_t i = *n; i < k; i++) cmd_sim_store_apply(&u->store, &(*cells)[i]);
    if (!notes_off) cmd_sim_store_distance_note(CMD, &u->store, *cells + *n, k - *n);
    u->ncells = k - *n;
    *n = k;
    goto done;
fail:
    exit_code = cmd_fail(CMD, rc);
done:
    fmoe_trace_reader_close(reader);
    return exit_code;
}

/* Every --trace, its globs expanded (in glob's sorted order), each path once, into a
 * malloc'd list of malloc'd paths. @return 0, 1 or 2 (printed). */
static int expand_traces(const options *o, char ***out, int *n) {
    *out = NULL;
    *n = 0;
    size_t cap = 0;
    char **list = NULL;
    for (int i = 0; i < o->trace_args.n; i++) {
        const char *arg = o->trace_args.items[i];
        glob_t g = {0};
        const int pattern = strpbrk(arg, "*?[") != NULL;
        if (pattern) {
            const int grc = glob(arg, 0, NULL, &g);
            if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0)) {
                globfree(&g);
                for (int k = 0; k < *n; k++) free(list[k]);
                free(list);
                return cmd_failf(CMD, "--trace %s: no file matches", arg);
            }
            if (grc != 0) {
                globfree(&g);
                for (int k = 0; k < *n; k++) free(list[k]);
                free(list);
                return cmd_failf(CMD, "--trace %s: cannot expand the pattern", arg);
            }
        }
        const size_t m = pattern ? g.gl_pathc : 1;
        if ((size_t)*n + m > cap) {
            cap = ((size_t)*n + m) * 2;
            char **grown = realloc(list, cap * sizeof *grown);
            if (!grown) {
                globfree(&g);
                for (int k = 0; k < *n; k++) free(list[k]);
                free(list);
                return cmd_failf(CMD, "out of memory");
            }
            list = grown;
        }
        for (size_t k = 0; k < m; k++) {
            const char *path = pattern ? g.gl_pathv[k] : arg;
            int seen = 0; /* a trace named twice (a glob and its match) is one trace */
            for (int j = 0; j < *n && !seen; j++) seen = strcmp(list[j], path) == 0;
            if (seen) continue;
            list[*n] = strdup(path);
            if (!list[*n]) {
                globfree(&g);
                for (int j = 0; j < *n; j++) free(list[j]);
                free(list);
                return cmd_failf(CMD, "out of memory");
            }
            (*n)++;
        }
        if (pattern) globfree(&g);
    }
    *out = list;
    return 0;
}

/* The settings of a sweep besides its grid, for --sweep-out's first line: a file resumes
 * only a sweep that computes the same cells. */
static void sweep_settings(const options *o, char *buf, size_t cap) {
    size_t at = 0;
#define ADD(...)                                                                               \
    do {                                                                                       \
        if (at < cap) at += (size_t)snprintf(buf + at, cap - at, __VA_ARGS__);                 \
    } while (0)
    ADD("miss=%s batch=%s%d eamc-capacity=%d copy-chunks=%d feedback=%d", miss_name(o->miss_mode),
        o->batch_trace ? "trace/" : "", (int)o->batch, (int)o->eamc_capacity,
        (int)o->copy_chunks, (int)o->feedback);
    if (o->batch_tokens) ADD(" batch-tokens=%d", (int)o->batch_tokens);
    if (o->arrivals)
        ADD(" arrivals=%s start=%lld speedup=%.17g", o->arrivals, (long long)o->arrivals_start,
            o->arrivals_speedup);
    if (o->model_config) ADD(" model-config=%s", o->model_config);
    if (o->store.path) ADD(" store=%s", o->store.path);
    ADD(" store-mode=%d holdout=%d store-capacity=%d match-delay=%.17g", (int)o->store.mode,
        o->store.holdout, (int)o->store.capacity, o->store.match_delay_s);
    for (int i = 0; i < o->predictors.n; i++) ADD(" predictor=%s", o->predictors.items[i]);
    /* the settings besides the shorthands' (written above as they always were) */
    for (int32_t i = 0; i < o->settings.n; i++) {
        const char *key = o->settings.item[i].key;
        if (strcmp(key, "eamc_capacity") && strcmp(key, "store_mode") &&
            strcmp(key, "store_capacity"))
            ADD(" policy-opt=%s=%s", key, o->settings.item[i].value);
    }
#undef ADD
}

/* ------------------------------------------------------------------ the sweep as a job */

typedef struct sim_job {
    const sim_unit *units;
    const size_t *cell_unit;      /* [n] */
    const fmoe_sim_config *cells; /* [n] */
    fmoe_sim_result *results;     /* [n] rank 0 */
    cmd_sweep_file *file;         /* --sweep-out, rank 0 */
    const char *file_path;
} sim_job;

static cmd_sweep_key cell_key(const sim_job *j, size_t i) {
    const sim_unit *u = &j->units[j->cell_unit[i]];
    return (cmd_sweep_key){u->trace, u->hw_key, j->cells[i].policy, j->cells[i].cache_experts,
                           j->cells[i].prefetch_distance, u->trace_id};
}

static char *run_cell(void *ctx, size_t i, int *rc) {
    const sim_job *j = ctx;
    fmoe_sim_result r;
    const double t0 = cmd_now();
    *rc = fmoe_sim_run(&j->units[j->cell_unit[i]].w, &j->cells[i], &r);
    if (*rc < 0) return NULL;
    const cmd_sweep_key k = cell_key(j, i);
    char *line = cmd_sweep_line(&k, &r, cmd_now() - t0);
    fmoe_sim_result_free(&r);
    if (!line) *rc = fmoe_error_set(FMOE_ENOMEM, "the result line of a cell");
    return line;
}

/* Rank 0: the line to the result file, then into results[i] as read back (what every rank's
 * cells give, so the output does not depend on where a cell ran). */
static int cell_done(void *ctx, size_t i, const char *line) {
    sim_job *j = ctx;
    if (j->file && cmd_sweep_file_append(j->file, line) < 0)
        return fmoe_error_set(FMOE_EIO, "%s: cannot write: %s", j->file_path, strerror(errno));
    fmoe__fault_point("sweep-cell"); /* tests: a kill after the Nth line */
    char key[8192];
    fmoe_sim_result r;
    if (cmd_sweep_line_parse(line, key, sizeof key, &r) < 0)
        return fmoe_error_set(FMOE_EINTERNAL, "cell %zu: its result line does not read back", i);
    fmoe_sim_result_free(&j->results[i]);
    j->results[i] = r;
    return 0;
}

/* Progress of an MPI sweep whose stderr is not a terminal (mpirun forwards it through a
 * pipe; a cluster job's log): a line at most every 10 s, with the ETA. */
typedef struct line_progress {
    double started, last;
    int64_t first; /* cells done at the start (resumed) */
} line_progress;

static void progress_line(void *ctx, int64_t done, int64_t total, const char *unit) {
    line_progress *lp = ctx;
    const double now = cmd_now();
    if (lp->started == 0) {
        lp->started = lp->last = now;
        lp->first = done;
        return;
    }
    if (done < total && now - lp->last < 10) return;
    lp->last = now;
    const double rate = (double)(done - lp->first) / (now - lp->started > 0 ? now - lp->started : 1);
    fprintf(stderr, "fmoe simulate: %lld/%lld %s (%.0f%%), eta %.0fs\n", (long long)done,
            (long long)total, unit, total ? 100.0 * (double)done / (double)total : 100.0,
            rate > 0 ? (double)(total - done) / rate : 0.0);
}

/* Runs every cell as a job (over MPI ranks, or with --sweep-out): results[] on rank 0.
 * @return 0, 1 or 2 (printed). */
static int run_job(const options *o, const cmd_mpi_world *world, const sim_unit *units,
                   int nunits, const fmoe_sim_config *cells, size_t n, fmoe_sim_result *results) {
    size_t *cell_unit = malloc((n ? n : 1) * sizeof *cell_unit);
    char **keys = calloc(n ? n : 1, sizeof *keys);
    uint8_t *skip = calloc(n ? n : 1, 1);
    int exit_code = 0;
    sim_job j = {.units = units, .cell_unit = cell_unit, .cells = cells, .results = results,
                 .file_path = o->sweep_out};
    cmd_sweep_outcome out = {0};
    if (!cell_unit || !keys || !skip) {
        exit_code = cmd_failf(CMD, "out of memory");
        goto agree;
    }
    for (int u = 0; u < nunits; u++)
        for (size_t i = units[u].cell0; i < units[u].cell0 + units[u].ncells; i++) cell_unit[i] = (size_t)u;
    size_t resumed = 0;
    if (o->sweep_out && world->rank == 0) {
        char key[8192];
        for (size_t i = 0; i < n; i++) {
            const cmd_sweep_key k = cell_key(&j, i);
            if (!(keys[i] = strdup(cmd_sweep_key_string(&k, key, sizeof key)))) {
                exit_code = cmd_failf(CMD, "out of memory");
                goto agree;
            }
        }
        char settings[8192];
        sweep_settings(o, settings, sizeof settings);
        exit_code = cmd_sweep_file_open(CMD, o->sweep_out, settings, o->resume, n, keys, results,
                                        skip, &resumed, &j.file);
        if (exit_code) goto agree;
        if (o->resume && !o->quiet)
            fprintf(stderr, "fmoe simulate: %s holds %zu of the %zu cells; running %zu\n",
                    o->sweep_out, resumed, n, n - resumed);
    }
agree:
    if (world->size > 1) { /* the result file opened on rank 0, or all stop */
        const int agreed = cmd_mpi_agree(world, exit_code);
        if (!exit_code) exit_code = agreed;
    }
    if (exit_code) goto done;
    cmd_progress_bar bar;
    cmd_progress_bar_init(&bar, "simulating", o->quiet || world->rank != 0);
    line_progress lp = {0};
    fmoe_progress p = cmd_progress_bar_callback(&bar);
    if (!bar.enabled && world->size > 1 && world->rank == 0 && !o->quiet)
        p = (fmoe_progress){.fn = progress_line, .ctx = &lp};
    const cmd_sweep_job job = {.n = n, .skip = skip, .threads = o->threads, .run = run_cell,
                               .done = cell_done, .ctx = &j, .progress = &p,
                               .rank_timeout_s = o->rank_timeout_s};
    int rc = cmd_sweep_run(world, &job, &out);
    cmd_progress_bar_done(&bar);
    if (cmd_sweep_file_close(j.file) < 0 && rc == 0)
        rc = fmoe_error_set(FMOE_EIO, "%s: cannot write: %s", o->sweep_out, strerror(errno));
    j.file = NULL;
    if (rc < 0) {
        exit_code = cmd_fail(CMD, rc);
        goto done;
    }
    if (world->rank == 0 && out.missing > 0) {
        if (o->sweep_out)
            exit_code = cmd_failf(CMD, "%zu of %zu cells missing: rank%s %s stopped answering; "
                                       "the %zu finished are in %s: run the same command with "
                                       "--resume to complete it",
                                  out.missing, n, out.dead_ranks == 1 ? "" : "s", out.dead,
                                  n - out.missing, o->sweep_out);
        else
            exit_code = cmd_failf(CMD, "%zu of %zu cells missing: rank%s %s stopped answering "
                                       "(with --sweep-out F.jsonl the finished cells are kept "
                                       "and --resume completes them)",
                                  out.missing, n, out.dead_ranks == 1 ? "" : "s", out.dead);
    }
done:
    cmd_sweep_file_close(j.file);
    if (keys)
        for (size_t i = 0; i < n; i++) free(keys[i]);
    free(keys);
    free(skip);
    free(cell_unit);
    free(out.missing_cells);
    return exit_code;
}

/* ------------------------------------------------------------------ main */

static int simulate(options *o, const cmd_mpi_world *world) {
    char **traces = NULL;
    int ntraces = 0, nunits = 0;
    sim_unit *units = NULL;
    fmoe_sim_config *cells = NULL;
    fmoe_sim_result *res = NULL;
    size_t *order = NULL, n = 0, cap = 0;
    int exit_code = expand_traces(o, &traces, &ntraces), rc = 0;
    if (exit_code) return exit_code;
    const int nhw = o->profiles.n ? o->profiles.n : o->n_hardware ? o->n_hardware : 1;
    nunits = ntraces * nhw;
    if (nunits > 1 && (o->plot || o->decision_log)) {
        exit_code = cmd_usage_error(CMD, "%s is for one trace on one hardware; this sweep has %d "
                                         "(%d trace%s x %d hardware profile%s)",
                                    o->plot ? "--plot" : "--decision-log", nunits, ntraces,
                                    ntraces == 1 ? "" : "s", nhw, nhw == 1 ? "" : "s");
        goto prepared;
    }
    if (o->decision_log && (o->sweep_out || world->size > 1)) {
        exit_code = cmd_usage_error(CMD, "--decision-log runs one cell in one process: no "
                                         "--sweep-out, no mpirun");
        goto prepared;
    }
    /* every file written was checked against every file read by the parse (cmd/outputs.h) */
    units = calloc((size_t)nunits, sizeof *units);
    if (!units) {
        exit_code = cmd_failf(CMD, "out of memory");
        goto prepared;
    }
    for (int t = 0; t < ntraces; t++)
        for (int h = 0; h < nhw; h++) {
            sim_unit *u = &units[t * nhw + h];
            u->trace = traces[t];
            u->profile = o->profiles.n ? o->profiles.items[h] : NULL;
            u->hardware = !o->profiles.n && o->n_hardware ? o->hardware_list[h] : NULL;
            u->hw_key = u->profile ? u->profile : u->hardware ? u->hardware : DEFAULT_HARDWARE;
            u->store = o->store; /* the settings; prepare loads the store for the trace */
            if ((exit_code = prepare_unit(o, u, &cells, &n, &cap)) != 0) goto prepared;
        }
    res = calloc(n ? n : 1, sizeof *res);
    order = calloc(n ? n : 1, sizeof *order);
    if (!res || !order) {
        exit_code = cmd_failf(CMD, "out of memory");
        goto prepared;
    }
prepared:
    /* Every rank has read the same files: they all go on, or none (a rank left waiting for
     * cells would wait for ever). */
    if (world->size > 1) {
        const int agreed = cmd_mpi_agree(world, exit_code);
        if (agreed && !exit_code && world->rank == 0)
            fprintf(stderr, "fmoe simulate: another rank failed before the sweep (its line "
                            "above)\n");
        if (!exit_code) exit_code = agreed;
    }
    if (exit_code) goto done;
    if (o->decision_log) { /* one cell, its decisions to the log */
        if (n != 1) {
            exit_code = cmd_usage_error(CMD, "--decision-log needs one policy, one cache size "
                                             "and one distance (%zu runs asked)", n);
            goto done;
        }
        fmoe_decision_log *log = NULL;
        char meta[256];
        cmd_decision_log_meta(meta, sizeof meta, cells[0].policy, cells[0].cache_experts,
                              cells[0].prefetch_distance, o->copy_chunks);
        if ((rc = fmoe_decision_log_open(&log, o->decision_log, "simulate", meta)) < 0) goto fail;
        cells[0].decision = fmoe_decision_log_write;
        cells[0].decision_ctx = log;
        rc = fmoe_sim_run(&units[0].w, &cells[0], &res[0]);
        const int rc2 = fmoe_decision_log_close(log, rc == 0);
        if (rc == 0) rc = rc2;
        if (rc < 0) goto fail;
    } else if (o->sweep_out || world->size > 1) {
        if ((exit_code = run_job(o, world, units, nunits, cells, n, res)) != 0) goto done;
    } else {
        for (int u = 0; u < nunits; u++) {
            cmd_progress_bar bar;
            cmd_progress_bar_init(&bar, "simulating", o->quiet);
            fmoe_progress p = cmd_progress_bar_callback(&bar);
            rc = fmoe_sim_sweep(&units[u].w, cells + units[u].cell0, units[u].ncells,
                                o->threads, res + units[u].cell0, &p);
            cmd_progress_bar_done(&bar);
            if (rc < 0) goto fail;
        }
    }
    if (world->rank != 0) goto done; /* rank 0 prints the one result */
    if (o->csv) {
        const char **prefix = NULL;
        if (nunits > 1 && !(prefix = calloc(2 * n, sizeof *prefix))) {
            exit_code = cmd_failf(CMD, "out of memory");
            goto done;
        }
        for (int u = 0; prefix && u < nunits; u++)
            for (size_t i = units[u].cell0; i < units[u].cell0 + units[u].ncells; i++) {
                prefix[2 * i] = units[u].trace;
                prefix[2 * i + 1] = units[u].hw_key;
            }
        exit_code = write_csv(o->csv, res, n, prefix);
        free(prefix);
        if (exit_code) goto done;
    }
    if (o->plot && (rc = write_plot(o->plot, units[0].trace, res, n)) < 0) goto fail;
    if (o->json) {
        /* one unit: its document, as ever; several: {"sweeps": [one per unit]} */
        cJSON *all = nunits > 1 ? cJSON_CreateObject() : NULL;
        cJSON *list = all ? cJSON_AddArrayToObject(all, "sweeps") : NULL;
        cJSON *doc = NULL;
        for (int u = 0; u < nunits; u++) {
            const sim_unit *x = &units[u];
            const options uo = unit_options(o, x);
            doc = unit_json(&uo, &x->hw, x->expert_bytes, &x->es, &x->w, res + x->cell0, x->ncells);
            if (list) cJSON_AddItemToArray(list, doc);
        }
        if (cmd_print_json(all ? all : doc) != 0) exit_code = cmd_failf(CMD, "out of memory");
    } else if (!o->csv || strcmp(o->csv, "-") != 0) {
        for (int u = 0; u < nunits; u++) {
            const sim_unit *x = &units[u];
            const options uo = unit_options(o, x);
            if (u) printf("\n");
            print_table(&uo, &x->hw, x->expert_bytes, &x->es, &x->w, res + x->cell0, x->ncells,
                        order + x->cell0);
        }
    }
    goto done;
fail:
    exit_code = cmd_fail(CMD, rc);
done:
    if (res)
        for (size_t i = 0; i < n; i++) fmoe_sim_result_free(&res[i]);
    free(res);
    free(cells);
    free(order);
    for (int u = 0; units && u < nunits; u++) unit_free(&units[u]);
    free(units);
    for (int i = 0; i < ntraces; i++) free(traces[i]);
    free(traces);
    return exit_code;
}

int cmd_simulate(int argc, char **argv) {
    options o;
    init(&o);
    int rc = parse_options(argc, argv, &o);
    if (rc != 0) return rc == CMD_OPTIONS_HELP ? CMD_EXIT_OK : rc;
    cmd_mpi_world world;
    if ((rc = cmd_mpi_start(CMD, &world)) != 0) return rc;
    if (world.rank > 0) { /* rank 0 says what there is to say */
        o.quiet = 1;
        notes_off = 1;
    }
    rc = simulate(&o, &world);
    fflush(stdout);
    cmd_mpi_finish(&world, rc);
    return rc;
}
