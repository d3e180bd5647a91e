/*
 * cmd_demo.c - `fmoe demo`: the pipeline on the bundled sample data, so a new user sees
 * fmoe work with no download. Part 1 imports the bundled FLAME-MoE-290M routing sample
 * (datasets/samples/flame-moe-290m, Apache-2.0) into a trace, prints `fmoe inspect` of it
 * and replays it through a few policies. Part 2 runs the whole pipeline on the bundled
 * model fmoe-tiny and the bundled prompts: record the first 80 prompts, build a store
 * from them, record the 20 held out, simulate those with five policies, pick the best by
 * simulated decode TPOT, and serve the held-out prompts live (in-process, through the
 * serve engine) with it and with plain LRU, live hit rates beside the simulated ones.
 *
 * Each step is the command's own entry point called with a built argv, so the demo runs
 * exactly what the printed command line would. In --json mode a step's text goes to
 * stderr (its figures come back through files it writes: simulate --json into the output
 * folder, parsed here) and stdout holds one JSON object.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd_common.h"
#include "demo_live.h"
#include "paths.h"
#include "fmoe/datasets.h"
#include "fmoe/error.h"
#include "files.h"
#include "fmoe/geometry.h"
#include "fmoe/policy.h"
#include "fmoe/trace.h"

static const char *const CMD = "demo";

/* FLAME-MoE-290M as sampled: MoE layers 2..9 (8 files), 64 routed experts, top-6,
 * 64-token sequences (datasets/samples/flame-moe-290m/SOURCE.txt). */
enum { FLAME_LAYERS = 8, FLAME_EXPERTS = 64, FLAME_TOP_K = 6, FLAME_SEQ_TOKENS = 64 };

/* FLAME-MoE publishes no per-expert shape, so the expert size is estimated from the model
 * card (CMU-FLAME/FLAME-MoE-290M-1.3B: 1.3B total, 290M active parameters, 64 routed
 * experts of which 8 are active per token): the 56 inactive experts of each MoE layer
 * hold the difference, (1.3e9 - 2.9e8) / (8 layers x 56) = 2.25M parameters, 4.5 MB in
 * bf16. Only the simulated times depend on it; hit counts do not. */
#define FLAME_EXPERT_BYTES 4508000LL

/* Part 2's policies: the ones a live run can use (belady and oracle need the future). */
/* The live part runs the best simulated policy beside the baseline everybody knows, the
 * first policy listed; simulate reports its rows in the order asked. */
#define DEMO_BASELINE "lru"
#define TINY_POLICIES DEMO_BASELINE ",lfu,mixtral-offload,moe-infinity,fmoe"
/* fmoe-tiny has 6 MoE layers: prefetch one layer ahead (the store is built for it too). */
#define TINY_PREFETCH_DISTANCE "1"

typedef struct demo_opts {
    const char *output_dir;
    int json, quiet, quick;
} demo_opts;

static const cmd_option demo_options[] = {
    {.name = "output-dir", .short_name = 'o', .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT_DIR,
     .value_name = "DIR",
     .help = "where to write demo files",
     .default_text = "a new folder under $TMPDIR or /tmp, printed at the end",
     .offset = offsetof(demo_opts, output_dir)},
    {.name = "json", .kind = CMD_OPT_FLAG, .help = "print every figure as one JSON object",
     .offset = offsetof(demo_opts, json)},
    {.name = "quick", .kind = CMD_OPT_FLAG,
     .help = "fewer prompts and tokens (24 + 8 prompts, 16 new tokens; for tests)",
     .offset = offsetof(demo_opts, quick)},
    {.name = "quiet", .short_name = 'q', .kind = CMD_OPT_FLAG,
     .help = "no progress bar or progress lines",
     .offset = offsetof(demo_opts, quiet)},
    {0},
};

const cmd_spec cmd_demo_spec = {
    .name = "demo",
    .usage = "demo [--output-dir DIR] [--json] [--quick] [--quiet]",
    .description =
        "Runs fmoe on the bundled sample data. First imports the FLAME-MoE-290M\n"
        "routing sample (8 MoE layers, 64 experts, top-6, 512 tokens) into an fmoe\n"
        "trace, prints its summary (fmoe inspect) and replays it through on-demand\n"
        "loading, LRU, LFU and Belady's optimum at 10%, 25% and 50% of the experts in\n"
        "the fast tier (fmoe simulate). Then the whole pipeline on the bundled model\n"
        "fmoe-tiny and the bundled prompts: fmoe record of the first 80 prompts (real\n"
        "CPU inference, greedy, 32 new tokens), fmoe build-store from that trace,\n"
        "fmoe record of the 20 held-out prompts, fmoe simulate of those with lru, lfu,\n"
        "mixtral-offload, moe-infinity and fmoe at 25% of the routed experts, and the\n"
        "best policy by simulated decode TPOT served live: the held-out prompts run\n"
        "again through the serve engine with the routed experts offloaded, with that\n"
        "policy and with lru, live hit rates beside the simulated ones. Ends with the\n"
        "commands that do the same by hand. Progress on stderr, results on stdout.\n",
    .options = demo_options,
    .size = sizeof(demo_opts),
};

/* How much of the bundled prompts part 2 uses. */
typedef struct demo_sizes {
    int train, heldout, new_tokens;
} demo_sizes;

/* ------------------------------------------------------------------ running steps */

/* Runs a command in-process with its stdout sent to fd `to` (-1: left alone). */
static int run_redirected(int (*fn)(int, char **), int argc, char **argv, int to) {
    fflush(stdout);
    int saved = -1;
    if (to >= 0) {
        saved = dup(STDOUT_FILENO);
        if (saved < 0 || dup2(to, STDOUT_FILENO) < 0) {
            if (saved >= 0) close(saved);
            return cmd_failf(CMD, "cannot redirect the output of fmoe %s", argv[0]);
        }
    }
    const int rc = fn(argc, argv);
    fflush(stdout);
    if (saved >= 0) {
        dup2(saved, STDOUT_FILENO);
        close(saved);
    }
    return rc;
}

/* A step of the pipeline. Text mode: prints the command line, then runs it, its output on
 * stdout. JSON mode: its output goes to stderr (nowhere when quiet); stdout stays the
 * JSON object's. */
static int run_step(int (*fn)(int, char **), int argc, char **argv, int json, int quiet) {
    if (!json) {
        printf("\n$ fmoe");
        for (int i = 0; i < argc; i++) printf(" %s", argv[i]);
        printf("\n");
        return run_redirected(fn, argc, argv, -1);
    }
    int to = STDERR_FILENO, null_fd = -1;
    if (quiet) {
        if ((null_fd = open("/dev/null", O_WRONLY)) < 0)
            return cmd_failf(CMD, "/dev/null: cannot open");
        to = null_fd;
    }
    const int rc = run_redirected(fn, argc, argv, to);
    if (null_fd >= 0) close(null_fd);
    return rc;
}

/* Runs a command with its stdout written to `path` (a --json document): written as
 * path.partial, renamed when the command succeeds, removed when it fails. */
static int run_into_file(int (*fn)(int, char **), int argc, char **argv, const char *path) {
    char partial[PATH_MAX + 48];
    snprintf(partial, sizeof partial, "%s.partial", path);
    const int fd = open(partial, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return cmd_failf(CMD, "%s: cannot create (%s)", partial, strerror(errno));
    int rc = run_redirected(fn, argc, argv, fd);
    if (close(fd) != 0 && rc == 0) rc = cmd_failf(CMD, "%s: write failed", partial);
    if (rc == 0 && rename(partial, path) != 0)
        rc = cmd_failf(CMD, "%s: cannot rename to %s (%s)", partial, path, strerror(errno));
    if (rc != 0) unlink(partial);
    return rc;
}

/* Reads a JSON file the demo wrote itself (lib/files.h: a regular file; 256 MiB is far above
 * any simulate or inspect report). @return the document, or NULL after printing why. */
static cJSON *read_json(const char *path) {
    char *text = NULL;
    size_t len = 0;
    const int rc = fmoe__read_file_bounded(path, "a report", (long long)256 << 20, 0, &text, &len);
    if (rc < 0) {
        cmd_fail(CMD, rc);
        return NULL;
    }
    cJSON *doc = cJSON_Parse(text);
    free(text);
    if (!doc) cmd_failf(CMD, "%s: not valid JSON", path);
    return doc;
}

static double json_number(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *json_string(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* ------------------------------------------------------------------ part 2: fmoe-tiny */

/* Writes prompts [from, from + n) of the set as JSON Lines ({"id", "prompt"}), atomically. */
static int write_prompts(const fmoe_prompt_set *set, int64_t from, int64_t n, const char *path) {
    char partial[PATH_MAX + 48];
    snprintf(partial, sizeof partial, "%s.partial", path);
    FILE *f = fopen(partial, "w");
    if (!f) return cmd_failf(CMD, "%s: cannot create (%s)", partial, strerror(errno));
    int ok = 1;
    for (int64_t i = from; i < from + n && ok; i++) {
        cJSON *o = cJSON_CreateObject();
        char id[32];
        snprintf(id, sizeof id, "%lld", (long long)i);
        char *line = NULL;
        if (o && cJSON_AddStringToObject(o, "id", set->ids[i][0] ? set->ids[i] : id) &&
            cJSON_AddStringToObject(o, "prompt", set->prompts[i]))
            line = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        ok = line && fprintf(f, "%s\n", line) > 0;
        free(line);
    }
    if (fclose(f) != 0) ok = 0;
    if (ok && rename(partial, path) == 0) return 0;
    unlink(partial);
    return cmd_failf(CMD, "%s: cannot write", path);
}

/* One row of the held-out simulation, from simulate's --json. */
typedef struct sim_row {
    const char *policy;
    double hit_rate, tpot_s, ttft_s, stall_s;
    int64_t accesses, hits, late_hits, misses;
} sim_row;

static sim_row sim_row_of(const cJSON *r) {
    sim_row s = {.policy = json_string(r, "policy")};
    s.hit_rate = json_number(r, "hit_rate");
    s.tpot_s = json_number(cJSON_GetObjectItemCaseSensitive(r, "tpot_s"), "mean");
    s.ttft_s = json_number(cJSON_GetObjectItemCaseSensitive(r, "ttft_s"), "mean");
    s.stall_s = json_number(r, "stall_s");
    s.accesses = (int64_t)json_number(r, "accesses");
    s.hits = (int64_t)json_number(r, "hits");
    s.late_hits = (int64_t)json_number(r, "late_hits");
    s.misses = (int64_t)json_number(r, "misses");
    return s;
}

/* The best row: the lowest simulated decode TPOT; a tie goes to the higher hit rate. */
static int pick_best(const sim_row *rows, int n) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (!isfinite(rows[i].tpot_s)) continue;
        if (best < 0) {
            best = i;
            continue;
        }
        const double a = rows[i].tpot_s, b = rows[best].tpot_s;
        const int tie = fabs(a - b) <= 1e-12 * fmax(fabs(a), fabs(b));
        if ((!tie && a < b) || (tie && rows[i].hit_rate > rows[best].hit_rate)) best = i;
    }
    return best;
}

static cJSON *live_json(const char *policy, const demo_live_result *r, const sim_row *sim) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "policy", policy);
    cJSON_AddNumberToObject(o, "requests", (double)r->requests);
    cJSON_AddNumberToObject(o, "accesses", (double)r->accesses);
    cJSON_AddNumberToObject(o, "hits", (double)r->hits);
    cJSON_AddNumberToObject(o, "late_hits", (double)r->late_hits);
    cJSON_AddNumberToObject(o, "misses", (double)r->misses);
    cJSON_AddNumberToObject(o, "hit_rate", r->hit_rate);
    cJSON_AddNumberToObject(o, "bytes_loaded", (double)r->bytes_loaded);
    cJSON_AddNumberToObject(o, "stall_s", r->stall_s);
    cJSON_AddNumberToObject(o, "decode_tokens", (double)r->decode_tokens);
    cJSON_AddNumberToObject(o, "decode_ms_per_token",
                            r->decode_tokens > 0 ? r->decode_ms / (double)r->decode_tokens : 0);
    cJSON_AddNumberToObject(o, "wall_s", r->wall_s);
    cJSON_AddNumberToObject(o, "simulated_accesses", (double)sim->accesses);
    cJSON_AddNumberToObject(o, "simulated_hit_rate", sim->hit_rate);
    cJSON_AddNumberToObject(o, "simulated_tpot_s", sim->tpot_s);
    return o;
}

/* The by-hand commands of part 2 into cmds[0..n) (each malloc'd). */
enum { NUM_COMMANDS = 5 };
static int by_hand_commands(char *cmds[NUM_COMMANDS], const char *d, const demo_sizes *z,
                            int32_t cache, const char *best, int best_takes_store) {
    const size_t cap = 3 * PATH_MAX + 512;
    for (int i = 0; i < NUM_COMMANDS; i++)
        if (!(cmds[i] = malloc(cap))) {
            while (i-- > 0) free(cmds[i]);
            return cmd_failf(CMD, "out of memory");
        }
    snprintf(cmds[0], cap, "fmoe record --dataset %s/prompts-train.jsonl --max-new-tokens %d "
             "--ignore-eos --speculative 1 -o %s/fmoe-tiny.h5", d, z->new_tokens, d);
    snprintf(cmds[1], cap, "fmoe build-store --trace %s/fmoe-tiny.h5 --prefetch-distance "
             TINY_PREFETCH_DISTANCE " -o %s/fmoe-tiny-store.h5", d, d);
    snprintf(cmds[2], cap, "fmoe record --dataset %s/prompts-heldout.jsonl --max-new-tokens %d "
             "--ignore-eos --speculative 1 -o %s/fmoe-tiny-heldout.h5", d, z->new_tokens, d);
    snprintf(cmds[3], cap, "fmoe simulate --trace %s/fmoe-tiny-heldout.h5 --store "
             "%s/fmoe-tiny-store.h5 --policy " TINY_POLICIES " --cache-experts %d "
             "--prefetch-distance " TINY_PREFETCH_DISTANCE, d, d, (int)cache);
    char store[PATH_MAX + 48] = "";
    if (best_takes_store) snprintf(store, sizeof store, " --store %s/fmoe-tiny-store.h5", d);
    snprintf(cmds[4], cap, "fmoe serve --parallel 1 --policy %s%s --cache-experts %d "
             "--prefetch-distance " TINY_PREFETCH_DISTANCE " --copy-chunks 1   "
             "# then POST the held-out prompts to /v1/completions", best, store, (int)cache);
    return 0;
}

#define PROGRESS(...)                                                                          \
    do {                                                                                       \
        if (!quiet) {                                                                          \
            fprintf(stderr, "fmoe demo: " __VA_ARGS__);                                        \
            fputc('\n', stderr);                                                               \
        }                                                                                      \
    } while (0)

/* Part 2: record -> build-store -> record held out -> simulate -> serve live, on the
 * bundled model (no download). Adds the figures to `root` under "fmoe_tiny". */
static int demo_fmoe_tiny(const char *dir, const char *samples, const demo_sizes *z, int json,
                          int quiet, cJSON *root) {
    const char *model = cmd_model_dir_or_default(CMD, NULL);
    if (!model) return CMD_EXIT_FAILURE;
    char prompts[PATH_MAX], train_prompts[PATH_MAX + 48], heldout_prompts[PATH_MAX + 48];
    char trace[PATH_MAX + 48], store[PATH_MAX + 48], heldout[PATH_MAX + 48];
    char sim_json[PATH_MAX + 48];
    snprintf(prompts, sizeof prompts, "%.4000s/prompts_100.txt", samples);
    snprintf(train_prompts, sizeof train_prompts, "%s/prompts-train.jsonl", dir);
    snprintf(heldout_prompts, sizeof heldout_prompts, "%s/prompts-heldout.jsonl", dir);
    snprintf(trace, sizeof trace, "%s/fmoe-tiny.h5", dir);
    snprintf(store, sizeof store, "%s/fmoe-tiny-store.h5", dir);
    snprintf(heldout, sizeof heldout, "%s/fmoe-tiny-heldout.h5", dir);
    snprintf(sim_json, sizeof sim_json, "%s/simulate-heldout.json", dir);
    if (!json)
        printf("\n--- the whole pipeline on the bundled model fmoe-tiny (%s) ---\n", model);

    /* The split: the first `train` prompts build the store, the last `heldout` are served. */
    fmoe_prompt_set *set = NULL;
    int err = fmoe_prompts_load(prompts, FMOE_PROMPTS_TEXT, &set);
    if (err < 0) return cmd_fail(CMD, err);
    int rc = 0;
    if (set->count < z->train + z->heldout)
        rc = cmd_failf(CMD, "%s: %lld prompts, the demo needs %d", prompts,
                       (long long)set->count, z->train + z->heldout);
    if (!rc) rc = write_prompts(set, 0, z->train, train_prompts);
    if (!rc) rc = write_prompts(set, set->count - z->heldout, z->heldout, heldout_prompts);
    fmoe_prompt_set_free(set);
    if (rc) return rc;

    char new_tokens[16];
    snprintf(new_tokens, sizeof new_tokens, "%d", z->new_tokens);
    PROGRESS("recording %d prompts through fmoe-tiny (%d new tokens each)", z->train,
             z->new_tokens);
    char *record_argv[] = {"record", "--model", (char *)model, "--dataset", train_prompts,
                           "--max-new-tokens", new_tokens, "--ignore-eos", "--speculative", "1",
                           "-o", trace, "--quiet", NULL};
    if ((rc = run_step(cmd_record, 13, record_argv, json, quiet))) return rc;
    PROGRESS("building the expert-map store");
    char *build_argv[] = {"build-store", "--trace", trace, "--prefetch-distance",
                          TINY_PREFETCH_DISTANCE, "-o", store, "--quiet", NULL};
    if ((rc = run_step(cmd_build_store, 8, build_argv, json, quiet))) return rc;
    PROGRESS("recording the %d held-out prompts", z->heldout);
    char *heldout_argv[] = {"record", "--model", (char *)model, "--dataset", heldout_prompts,
                            "--max-new-tokens", new_tokens, "--ignore-eos", "--speculative",
                            "1", "-o", heldout, "--quiet", NULL};
    if ((rc = run_step(cmd_record, 13, heldout_argv, json, quiet))) return rc;

    /* A fast tier of 25% of the routed experts, L x J from the held-out trace. */
    fmoe_trace_reader *r = NULL;
    if ((err = fmoe_trace_reader_open(&r, heldout)) < 0) return cmd_fail(CMD, err);
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    const int32_t total = h->num_layers * h->num_experts;
    fmoe_trace_reader_close(r);
    int32_t cache = (int32_t)lround(0.25 * total);
    if (cache < 1) cache = 1;
    char cache_text[16];
    snprintf(cache_text, sizeof cache_text, "%d", (int)cache);

    PROGRESS("simulating the held-out requests with " TINY_POLICIES " at %d of %d experts",
             (int)cache, (int)total);
    char *simulate_argv[] = {"simulate", "--trace", heldout, "--store", store,
                             "--policy", TINY_POLICIES, "--cache-experts", cache_text,
                             "--prefetch-distance", TINY_PREFETCH_DISTANCE, "--json",
                             "--quiet", NULL};
    if (!json) {
        printf("\n$ fmoe");
        for (int i = 0; i < 13; i++) printf(" %s", simulate_argv[i]);
        printf(" > %s\n", sim_json);
    }
    if ((rc = run_into_file(cmd_simulate, 13, simulate_argv, sim_json))) return rc;
    cJSON *sim = read_json(sim_json);
    if (!sim) return CMD_EXIT_FAILURE;

    demo_live live = {0};
    cJSON *out = NULL;
    char *cmds[NUM_COMMANDS] = {0};
    const cJSON *results = cJSON_GetObjectItemCaseSensitive(sim, "results");
    const int n = cJSON_GetArraySize(results);
    sim_row rows[16];
    int num_rows = 0;
    for (int i = 0; i < n && num_rows < 16; i++)
        rows[num_rows++] = sim_row_of(cJSON_GetArrayItem(results, i));
    const int best = pick_best(rows, num_rows);
    const int lru = num_rows > 0 ? 0 : -1; /* DEMO_BASELINE's row */
    if (best < 0 || lru < 0) {
        rc = cmd_failf(CMD, "%s: no decode TPOT for the policies, or no " DEMO_BASELINE " row",
                       sim_json);
        goto done;
    }
    const char *hardware = json_string(sim, "hardware");
    if (!json) {
        printf("%s: %d requests, %.0f expert accesses; cache %d of %d experts; simulated "
               "hardware %s\n\n",
               heldout, (int)json_number(sim, "requests"), json_number(sim, "accesses"),
               (int)cache, (int)total, hardware);
        printf("%-16s %8s %8s %8s %9s %10s %10s\n", "policy", "hit%", "late", "misses",
               "stall s", "TTFT mean", "TPOT mean");
        for (int i = 0; i < num_rows; i++)
            printf("%-16s %7.2f%% %8lld %8lld %9.3f %8.2fms %8.3fms%s\n", rows[i].policy,
                   100 * rows[i].hit_rate, (long long)rows[i].late_hits,
                   (long long)rows[i].misses, rows[i].stall_s, 1e3 * rows[i].ttft_s,
                   1e3 * rows[i].tpot_s, i == best ? "  <- best" : "");
        printf("\nbest by simulated decode TPOT: %s\n", rows[best].policy);
    }

    /* Live: the held-out requests again, through the serve engine, best policy and lru. */
    if ((rc = demo_live_open(CMD, model, heldout, &live))) goto done;
    const int policies[2] = {best, lru};
    const int num_live = best == lru ? 1 : 2;
    demo_live_result res[2];
    for (int k = 0; k < num_live; k++) {
        PROGRESS("serving the %d held-out prompts live with %s (%d of %d experts cached)",
                 live.num_requests, rows[policies[k]].policy, (int)cache, (int)total);
        if ((rc = demo_live_serve(CMD, &live, rows[policies[k]].policy, store, cache,
                                  atoi(TINY_PREFETCH_DISTANCE), quiet, &res[k])))
            goto done;
    }
    if (!json) {
        printf("\nlive: the %d held-out prompts served again in-process by the serve engine "
               "(parallel 1, greedy, %d of %d experts cached, the rest loaded on demand)\n\n",
               live.num_requests, (int)cache, (int)total);
        printf("%-16s %9s %9s %10s %15s %22s\n", "policy", "accesses", "(sim)", "live hit%",
               "simulated hit%", "live decode ms/token");
        for (int k = 0; k < num_live; k++) {
            const sim_row *s = &rows[policies[k]];
            printf("%-16s %9lld %9lld %9.2f%% %14.2f%% %22.3f\n", s->policy,
                   (long long)res[k].accesses, (long long)s->accesses, 100 * res[k].hit_rate,
                   100 * s->hit_rate,
                   res[k].decode_tokens ? res[k].decode_ms / (double)res[k].decode_tokens : 0);
        }
        printf("\nhit rates compare; the simulated TPOT is for the %s profile, not this "
               "machine: compare TPOT after 'fmoe calibrate -o profile.json' and 'fmoe "
               "simulate --profile profile.json'.\n",
               hardware);
    }

    const fmoe_policy_ops *ops = fmoe_policy_find(rows[best].policy);
    const int takes_store = ops && (ops->flags & FMOE_POLICY_TAKES_STORE);
    if ((rc = by_hand_commands(cmds, dir, z, cache, rows[best].policy, takes_store))) goto done;
    if (!json) {
        printf("\nthe same by hand:\n");
        for (int i = 0; i < NUM_COMMANDS; i++) printf("  %s\n", cmds[i]);
    }

    /* The figures, for --json. */
    out = cJSON_CreateObject();
    cJSON *files = cJSON_AddObjectToObject(out, "files");
    cJSON *table = cJSON_AddArrayToObject(out, "simulated");
    cJSON *lv = cJSON_AddArrayToObject(out, "live");
    cJSON *cmd_list = cJSON_AddArrayToObject(out, "commands");
    if (!files || !table || !lv || !cmd_list) {
        rc = cmd_failf(CMD, "out of memory");
        goto done;
    }
    cJSON_AddStringToObject(out, "model", model);
    cJSON_AddNumberToObject(out, "train_prompts", z->train);
    cJSON_AddNumberToObject(out, "heldout_prompts", z->heldout);
    cJSON_AddNumberToObject(out, "max_new_tokens", z->new_tokens);
    cJSON_AddNumberToObject(out, "total_experts", total);
    cJSON_AddNumberToObject(out, "cache_experts", cache);
    cJSON_AddNumberToObject(out, "prefetch_distance", atoi(TINY_PREFETCH_DISTANCE));
    cJSON_AddStringToObject(out, "hardware", hardware);
    cJSON_AddNumberToObject(out, "simulated_accesses", json_number(sim, "accesses"));
    cJSON_AddStringToObject(out, "best_policy", rows[best].policy);
    cJSON_AddStringToObject(files, "train_prompts", train_prompts);
    cJSON_AddStringToObject(files, "heldout_prompts", heldout_prompts);
    cJSON_AddStringToObject(files, "trace", trace);
    cJSON_AddStringToObject(files, "store", store);
    cJSON_AddStringToObject(files, "heldout_trace", heldout);
    cJSON_AddStringToObject(files, "simulate_json", sim_json);
    for (int i = 0; i < num_rows; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(table, o);
        cJSON_AddStringToObject(o, "policy", rows[i].policy);
        cJSON_AddNumberToObject(o, "accesses", (double)rows[i].accesses);
        cJSON_AddNumberToObject(o, "hits", (double)rows[i].hits);
        cJSON_AddNumberToObject(o, "late_hits", (double)rows[i].late_hits);
        cJSON_AddNumberToObject(o, "misses", (double)rows[i].misses);
        cJSON_AddNumberToObject(o, "hit_rate", rows[i].hit_rate);
        cJSON_AddNumberToObject(o, "stall_s", rows[i].stall_s);
        cJSON_AddNumberToObject(o, "ttft_s", rows[i].ttft_s);
        cJSON_AddNumberToObject(o, "tpot_s", rows[i].tpot_s);
    }
    for (int k = 0; k < num_live; k++)
        cJSON_AddItemToArray(lv, live_json(rows[policies[k]].policy, &res[k], &rows[policies[k]]));
    if (best == lru) /* the same run is lru's */
        cJSON_AddItemToArray(lv, live_json(DEMO_BASELINE, &res[0], &rows[lru]));
    for (int i = 0; i < NUM_COMMANDS; i++)
        cJSON_AddItemToArray(cmd_list, cJSON_CreateString(cmds[i]));
    if (!cJSON_AddItemToObject(root, "fmoe_tiny", out)) {
        rc = cmd_failf(CMD, "out of memory");
        goto done;
    }
    out = NULL;

done:
    for (int i = 0; i < NUM_COMMANDS; i++) free(cmds[i]);
    cJSON_Delete(out);
    demo_live_close(&live);
    cJSON_Delete(sim);
    return rc;
}

/* ------------------------------------------------------------------ the command */

/* Under part 1's table: what its less obvious columns mean, and why so many of its cells
 * are 0. The bundled sample is fixed (dense-CSV routing, prompt tokens only), so the note
 * is too: every sequence is one prefill pass that touches about 500 of the 512 experts in
 * layer order, more than the largest cache holds, so a recency or frequency cache evicts
 * each expert before it comes round again. */
static void print_flame_legend(void) {
    fputs("\n"
          "columns: d = layers ahead the policy prefetches (0: none); late = accesses whose\n"
          "prefetch was still in flight; wasted = prefetched bytes evicted or never used;\n"
          "goodpred = share of the accesses not already cached that a prefetch served, right\n"
          "and in time (-: the policy does not prefetch).\n"
          "note: this sample is prefill only (8 sequences of 64 prompt tokens, no decode\n"
          "step), so TPOT is 0 and TTFT is the latency to compare. Each pass touches nearly\n"
          "every expert, in layer order, more than any cache size here holds, so ondemand,\n"
          "lru and lfu evict each expert before it is used again (0% hits). Belady is the\n"
          "best a cache that only loads on a miss can do; a prefetching policy can beat it.\n",
          stdout);
}

int cmd_demo(int argc, char **argv) {
    demo_opts o = {0};
    int rc = cmd_options_parse(&cmd_demo_spec, &o, argc, argv, NULL);
    if (rc) return rc == CMD_OPTIONS_HELP ? CMD_EXIT_OK : rc;
    const int json = o.json, quiet = o.quiet;
    const demo_sizes sizes = o.quick ? (demo_sizes){24, 8, 16} : (demo_sizes){80, 20, 32};

    const char *samples = cmd_samples_dir();
    if (!samples)
        return cmd_failf(CMD, "bundled samples not found (set FMOE_SAMPLES_DIR to the "
                              "datasets/samples folder of the fmoe source tree)");
    char dir[PATH_MAX];
    if (o.output_dir) {
        snprintf(dir, sizeof dir, "%s", o.output_dir);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return cmd_failf(CMD, "%s: cannot create folder", dir);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/fmoe-demo-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) return cmd_failf(CMD, "%s: cannot create a temporary folder", dir);
    }

    /* Part 1: the FLAME-MoE-290M sample. */
    char files[FLAME_LAYERS][PATH_MAX];
    const char *file_ptrs[FLAME_LAYERS];
    for (int l = 0; l < FLAME_LAYERS; l++) {
        snprintf(files[l], sizeof files[l], "%s/flame-moe-290m/layer%02d.csv", samples, l + 2);
        file_ptrs[l] = files[l];
    }
    fmoe_model_geometry geometry;
    rc = fmoe_geometry_generic(FLAME_LAYERS, FLAME_EXPERTS, FLAME_TOP_K, 0, &geometry);
    if (rc < 0) return cmd_fail(CMD, rc);

    char trace_path[PATH_MAX + 32], inspect_json[PATH_MAX + 32], flame_json[PATH_MAX + 32];
    snprintf(trace_path, sizeof trace_path, "%s/flame-moe-290m.h5", dir);
    snprintf(inspect_json, sizeof inspect_json, "%s/flame-moe-290m-inspect.json", dir);
    snprintf(flame_json, sizeof flame_json, "%s/flame-moe-290m-simulate.json", dir);
    cmd_progress_bar bar;
    cmd_progress_bar_init(&bar, "import", quiet);
    fmoe_import_options opts = {
        .geometry = &geometry,
        .model_name = "FLAME-MoE-290M",
        .expert_bytes = FLAME_EXPERT_BYTES,
        .write = {.compression = FMOE_COMPRESSION_ZSTD},
        .progress = cmd_progress_bar_callback(&bar),
    };
    fmoe_import_report report;
    rc = fmoe_import_dense_csv(file_ptrs, FLAME_LAYERS, FLAME_SEQ_TOKENS, &opts, trace_path,
                               &report);
    cmd_progress_bar_done(&bar);
    if (rc < 0) return cmd_fail(CMD, rc);

    /* 10%, 25% and 50% of the 512 routed experts in the fast tier. */
    char *simulate_argv[] = {"simulate", "--trace", trace_path, "--policy",
                             "ondemand,lru,lfu,belady", "--cache-experts", "51,128,256",
                             "--hardware", "rtx3090-pcie4", "--quiet",
                             json ? "--json" : NULL, NULL};
    char *inspect_argv[] = {"inspect", trace_path, json ? "--json" : "--quiet", "--quiet", NULL};
    cJSON *root = NULL;
    if (json) {
        /* The existing keys: inspect's document is the top level. */
        if ((rc = run_into_file(cmd_inspect, 4, inspect_argv, inspect_json))) return rc;
        if (!(root = read_json(inspect_json))) return CMD_EXIT_FAILURE;
        cJSON *flame = NULL;
        if ((rc = run_into_file(cmd_simulate, 11, simulate_argv, flame_json)) ||
            !(flame = read_json(flame_json))) {
            cJSON_Delete(root);
            return rc ? rc : CMD_EXIT_FAILURE;
        }
        cJSON_AddItemToObject(root, "flame_simulate", flame);
        cJSON_AddStringToObject(root, "output_dir", dir);
        cJSON_AddStringToObject(root, "flame_trace", trace_path);
    } else {
        printf("fmoe demo: imported %lld tokens of %lld requests from the bundled FLAME-MoE-290M "
               "sample into %s\n\n",
               (long long)report.tokens, (long long)report.requests, trace_path);
        if ((rc = run_redirected(cmd_inspect, 4, inspect_argv, -1))) return rc;
        printf("\n$ fmoe simulate --trace %s --policy ondemand,lru,lfu,belady "
               "--cache-experts 51,128,256 --hardware rtx3090-pcie4\n",
               trace_path);
        if ((rc = run_redirected(cmd_simulate, 10, simulate_argv, -1))) return rc;
        print_flame_legend();
        root = cJSON_CreateObject();
        if (!root) return cmd_failf(CMD, "out of memory");
    }

    /* Part 2: the whole pipeline on fmoe-tiny. */
    rc = demo_fmoe_tiny(dir, samples, &sizes, json, quiet, root);
    if (rc == 0 && json) {
        if (cmd_print_json(root) != 0) rc = cmd_failf(CMD, "out of memory printing the JSON");
        root = NULL;
    } else if (rc == 0) {
        printf("\nfiles in %s; next: fmoe inspect %s --json, fmoe simulate --help, "
               "fmoe serve --help\n",
               dir, trace_path);
    }
    cJSON_Delete(root);
    return rc;
}
