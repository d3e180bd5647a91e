/*
 * simulate_options.c - `fmoe simulate`'s options: the table, their parsing and checks, and the
 * policy settings they give (simulate_impl.h).
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
#include "simulate_impl.h"

static const char *const CMD = SIM_CMD;

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
    {.name = "gap-split", .kind = CMD_OPT_FLAG,
     .help = "split each policy's hits short of belady's (run beside it at each size) into "
             "misses a better eviction would avoid, wrong prefetches' misses and late "
             "prefetches",
     .offset = offsetof(options, gap_split)},
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

void simulate_init(void *base) {
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
    .init = simulate_init,
};

/* --policy-opt and its shorthands into o->settings, one list for every policy of the run
 * (each cell takes the keys its policy declares). A shorthand is the same setting, its key
 * the one whose row in the policies' tables names the option (--store-mode M is
 * store_mode=M: fmoe_policy_setting.option). The store's mode and capacity, and the EAMC's size, are then read back
 * from the settings, whichever way they came, into the fields that the store's checks
 * (simulate_store.c) and the sizing to the trace (prepare_unit) use. @return 0 or 2. */
static int policy_settings(options *o) {
    int rc = cmd_policy_opts_parse(CMD, &o->policy_opts, o->policies, o->n_policies,
                                   &o->settings);
    char v[24];
    if (rc == 0 && o->eamc_capacity > 0) {
        snprintf(v, sizeof v, "%d", (int)o->eamc_capacity);
        rc = cmd_policy_opt_shorthand(CMD, &o->settings, "--eamc-capacity", v);
    }
    for (int32_t i = 0; rc == 0 && o->store.mode_given && store_mode_names[i]; i++)
        if (store_mode_values[i] == o->store.mode)
            rc = cmd_policy_opt_shorthand(CMD, &o->settings, "--store-mode",
                                          store_mode_names[i]);
    if (rc == 0 && o->store.capacity > 0) {
        snprintf(v, sizeof v, "%d", (int)o->store.capacity);
        rc = cmd_policy_opt_shorthand(CMD, &o->settings, "--store-capacity", v);
    }
    if (rc) return rc;
    /* the values were checked against the policies' tables: plain conversions suffice */
    const char *e = fmoe_policy_settings_get(&o->settings, cmd_policy_opt_key("--eamc-capacity"));
    const char *m = fmoe_policy_settings_get(&o->settings, cmd_policy_opt_key("--store-mode"));
    const char *c = fmoe_policy_settings_get(&o->settings, cmd_policy_opt_key("--store-capacity"));
    if (e) o->eamc_capacity = (int32_t)strtol(e, NULL, 10);
    if (c) o->store.capacity = (int32_t)strtol(c, NULL, 10);
    for (int32_t i = 0; m && store_mode_names[i]; i++)
        if (strcmp(store_mode_names[i], m) == 0) {
            o->store.mode = store_mode_values[i];
            o->store.mode_given = 1;
        }
    return 0;
}

int simulate_parse_options(int argc, char **argv, options *o) {
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
    if (o->gap_split) { /* the split is measured against belady at the same size */
        if (o->decision_log)
            return cmd_usage_error(CMD, "--gap-split runs belady beside each policy; "
                                        "--decision-log runs one policy: give one of them");
        int have = 0;
        for (int i = 0; i < o->n_policies; i++) have |= strcmp(o->policies[i], "belady") == 0;
        if (!have && o->n_policies == MAX_LIST)
            return cmd_usage_error(CMD, "--gap-split adds belady: give at most %d policies",
                                   MAX_LIST - 1);
        if (!have) o->policies[o->n_policies++] = "belady";
    }
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
