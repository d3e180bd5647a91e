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

/* Part 2's files, in the output folder (the prompts file is the bundled sample). */
typedef struct tiny_paths {
    char prompts[PATH_MAX], train_prompts[PATH_MAX + 48], heldout_prompts[PATH_MAX + 48];
    char trace[PATH_MAX + 48], store[PATH_MAX + 48], heldout[PATH_MAX + 48];
    char sim_json[PATH_MAX + 48];
} tiny_paths;

static void tiny_paths_init(tiny_paths *p, const char *dir, const char *samples) {
    snprintf(p->prompts, sizeof p->prompts, "%.4000s/prompts_100.txt", samples);
    snprintf(p->train_prompts, sizeof p->train_prompts, "%s/prompts-train.jsonl", dir);
    snprintf(p->heldout_prompts, sizeof p->heldout_prompts, "%s/prompts-heldout.jsonl", dir);
    snprintf(p->trace, sizeof p->trace, "%s/fmoe-tiny.h5", dir);
    snprintf(p->store, sizeof p->store, "%s/fmoe-tiny-store.h5", dir);
    snprintf(p->heldout, sizeof p->heldout, "%s/fmoe-tiny-heldout.h5", dir);
    snprintf(p->sim_json, sizeof p->sim_json, "%s/simulate-heldout.json", dir);
}

/* The split: the first `train` prompts build the store, the last `heldout` are served. */
static int split_prompts(const tiny_paths *p, const demo_sizes *z) {
    fmoe_prompt_set *set = NULL;
    int err = fmoe_prompts_load(p->prompts, FMOE_PROMPTS_TEXT, &set);
    if (err < 0) return cmd_fail(CMD, err);
    int rc = 0;
    if (set->count < z->train + z->heldout)
        rc = cmd_failf(CMD, "%s: %lld prompts, the demo needs %d", p->prompts,
                       (long long)set->count, z->train + z->heldout);
    if (!rc) rc = write_prompts(set, 0, z->train, p->train_prompts);
    if (!rc) rc = write_prompts(set, set->count - z->heldout, z->heldout, p->heldout_prompts);
    fmoe_prompt_set_free(set);
    return rc;
}

/* record the training prompts -> build-store -> record the held-out prompts. */
static int record_and_build(const char *model, const tiny_paths *p, const demo_sizes *z,
                            int json, int quiet) {
    int rc;
    char new_tokens[16];
    snprintf(new_tokens, sizeof new_tokens, "%d", z->new_tokens);
    PROGRESS("recording %d prompts through fmoe-tiny (%d new tokens each)", z->train,
             z->new_tokens);
    char *record_argv[] = {"record", "--model", (char *)model, "--dataset",
                           (char *)p->train_prompts, "--max-new-tokens", new_tokens,
                           "--ignore-eos", "--speculative", "1", "-o", (char *)p->trace,
                           "--quiet", NULL};
    if ((rc = run_step(cmd_record, 13, record_argv, json, quiet))) return rc;
    PROGRESS("building the expert-map store");
    char *build_argv[] = {"build-store", "--trace", (char *)p->trace, "--prefetch-distance",
                          TINY_PREFETCH_DISTANCE, "-o", (char *)p->store, "--quiet", NULL};
    if ((rc = run_step(cmd_build_store, 8, build_argv, json, quiet))) return rc;
    PROGRESS("recording the %d held-out prompts", z->heldout);
    char *heldout_argv[] = {"record", "--model", (char *)model, "--dataset",
                            (char *)p->heldout_prompts, "--max-new-tokens", new_tokens,
                            "--ignore-eos", "--speculative", "1", "-o", (char *)p->heldout,
                            "--quiet", NULL};
    return run_step(cmd_record, 13, heldout_argv, json, quiet);
}

/* A fast tier of 25% of the routed experts, L x J from the held-out trace. */
static int tiny_cache_size(const char *heldout, int32_t *cache, int32_t *total) {
    fmoe_trace_reader *r = NULL;
    int err;
    if ((err = fmoe_trace_reader_open(&r, heldout)) < 0) return cmd_fail(CMD, err);
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    *total = h->num_layers * h->num_experts;
    fmoe_trace_reader_close(r);
    *cache = (int32_t)lround(0.25 * *total);
    if (*cache < 1) *cache = 1;
    return 0;
}

/* simulate the held-out trace with TINY_POLICIES into sim_json (the command line shown
 * first without --json); *sim: its document. */
static int simulate_heldout(const tiny_paths *p, int32_t cache, int32_t total, int json,
                            int quiet, cJSON **sim) {
    int rc;
    char cache_text[16];
    snprintf(cache_text, sizeof cache_text, "%d", (int)cache);
    PROGRESS("simulating the held-out requests with " TINY_POLICIES " at %d of %d experts",
             (int)cache, (int)total);
    char *simulate_argv[] = {"simulate", "--trace", (char *)p->heldout, "--store",
                             (char *)p->store, "--policy", TINY_POLICIES, "--cache-experts",
                             cache_text, "--prefetch-distance", TINY_PREFETCH_DISTANCE,
                             "--json", "--quiet", NULL};
    if (!json) {
        printf("\n$ fmoe");
        for (int i = 0; i < 13; i++) printf(" %s", simulate_argv[i]);
        printf(" > %s\n", p->sim_json);
    }
    if ((rc = run_into_file(cmd_simulate, 13, simulate_argv, p->sim_json))) return rc;
    if (!(*sim = read_json(p->sim_json))) return CMD_EXIT_FAILURE;
    return 0;
}

/* The simulated rows, one per policy in the order asked (DEMO_BASELINE's first), and the
 * best by simulated decode TPOT. */
typedef struct tiny_table {
    sim_row rows[16];
    int num_rows, best, lru;
    int32_t cache, total;
    const char *hardware;
} tiny_table;

static void print_simulated(const tiny_table *t, const cJSON *sim, const char *heldout) {
    printf("%s: %d requests, %.0f expert accesses; cache %d of %d experts; simulated "
           "hardware %s\n\n",
           heldout, (int)json_number(sim, "requests"), json_number(sim, "accesses"),
           (int)t->cache, (int)t->total, t->hardware);
    printf("%-16s %8s %8s %8s %9s %10s %10s\n", "policy", "hit%", "late", "misses",
           "stall s", "TTFT mean", "TPOT mean");
    for (int i = 0; i < t->num_rows; i++) {
        const sim_row *r = &t->rows[i];
        printf("%-16s %7.2f%% %8lld %8lld %9.3f %8.2fms %8.3fms%s\n", r->policy,
               100 * r->hit_rate, (long long)r->late_hits, (long long)r->misses, r->stall_s,
               1e3 * r->ttft_s, 1e3 * r->tpot_s, i == t->best ? "  <- best" : "");
    }
    printf("\nbest by simulated decode TPOT: %s\n", t->rows[t->best].policy);
}

/* The live rows: the held-out requests served in-process with the best policy and lru
 * (once when they are the same). */
typedef struct tiny_live {
    int policies[2], num_live;
    demo_live_result res[2];
} tiny_live;

static int serve_live(demo_live *live, const tiny_table *t, const char *store, int quiet,
                      tiny_live *out) {
    int rc;
    out->policies[0] = t->best;
    out->policies[1] = t->lru;
    out->num_live = t->best == t->lru ? 1 : 2;
    for (int k = 0; k < out->num_live; k++) {
        const char *policy = t->rows[out->policies[k]].policy;
        PROGRESS("serving the %d held-out prompts live with %s (%d of %d experts cached)",
                 live->num_requests, policy, (int)t->cache, (int)t->total);
        if ((rc = demo_live_serve(CMD, live, policy, store, t->cache,
                                  atoi(TINY_PREFETCH_DISTANCE), quiet, &out->res[k])))
            return rc;
    }
    return 0;
}

static void print_live(const tiny_table *t, const tiny_live *lv, int num_requests) {
    printf("\nlive: the %d held-out prompts served again in-process by the serve engine "
           "(parallel 1, greedy, %d of %d experts cached, the rest loaded on demand)\n\n",
           num_requests, (int)t->cache, (int)t->total);
    printf("%-16s %9s %9s %10s %15s %22s\n", "policy", "accesses", "(sim)", "live hit%",
           "simulated hit%", "live decode ms/token");
    for (int k = 0; k < lv->num_live; k++) {
        const sim_row *s = &t->rows[lv->policies[k]];
        const demo_live_result *r = &lv->res[k];
        printf("%-16s %9lld %9lld %9.2f%% %14.2f%% %22.3f\n", s->policy,
               (long long)r->accesses, (long long)s->accesses, 100 * r->hit_rate,
               100 * s->hit_rate, r->decode_tokens ? r->decode_ms / (double)r->decode_tokens : 0);
    }
    printf("\nhit rates compare; the simulated TPOT is for the %s profile, not this "
           "machine: compare TPOT after 'fmoe calibrate -o profile.json' and 'fmoe "
           "simulate --profile profile.json'.\n",
           t->hardware);
}

/* The figures, for --json, added to `root` under "fmoe_tiny". */
static int add_tiny_json(cJSON *root, const char *model, const tiny_paths *p,
                         const demo_sizes *z, const cJSON *sim, const tiny_table *t,
                         const tiny_live *lv, char *const cmds[NUM_COMMANDS]) {
    cJSON *out = cJSON_CreateObject();
    cJSON *files = cJSON_AddObjectToObject(out, "files");
    cJSON *table = cJSON_AddArrayToObject(out, "simulated");
    cJSON *live = cJSON_AddArrayToObject(out, "live");
    cJSON *cmd_list = cJSON_AddArrayToObject(out, "commands");
    if (!files || !table || !live || !cmd_list) {
        cJSON_Delete(out);
        return cmd_failf(CMD, "out of memory");
    }
    const sim_row *rows = t->rows;
    cJSON_AddStringToObject(out, "model", model);
    cJSON_AddNumberToObject(out, "train_prompts", z->train);
    cJSON_AddNumberToObject(out, "heldout_prompts", z->heldout);
    cJSON_AddNumberToObject(out, "max_new_tokens", z->new_tokens);
    cJSON_AddNumberToObject(out, "total_experts", t->total);
    cJSON_AddNumberToObject(out, "cache_experts", t->cache);
    cJSON_AddNumberToObject(out, "prefetch_distance", atoi(TINY_PREFETCH_DISTANCE));
    cJSON_AddStringToObject(out, "hardware", t->hardware);
    cJSON_AddNumberToObject(out, "simulated_accesses", json_number(sim, "accesses"));
    cJSON_AddStringToObject(out, "best_policy", rows[t->best].policy);
    cJSON_AddStringToObject(files, "train_prompts", p->train_prompts);
    cJSON_AddStringToObject(files, "heldout_prompts", p->heldout_prompts);
    cJSON_AddStringToObject(files, "trace", p->trace);
    cJSON_AddStringToObject(files, "store", p->store);
    cJSON_AddStringToObject(files, "heldout_trace", p->heldout);
    cJSON_AddStringToObject(files, "simulate_json", p->sim_json);
    for (int i = 0; i < t->num_rows; i++) {
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
    for (int k = 0; k < lv->num_live; k++)
        cJSON_AddItemToArray(live, live_json(rows[lv->policies[k]].policy, &lv->res[k],
                                             &rows[lv->policies[k]]));
    if (t->best == t->lru) /* the same run is lru's */
        cJSON_AddItemToArray(live, live_json(DEMO_BASELINE, &lv->res[0], &rows[t->lru]));
    for (int i = 0; i < NUM_COMMANDS; i++)
        cJSON_AddItemToArray(cmd_list, cJSON_CreateString(cmds[i]));
    if (!cJSON_AddItemToObject(root, "fmoe_tiny", out)) {
        cJSON_Delete(out);
        return cmd_failf(CMD, "out of memory");
    }
    return 0;
}

/* Part 2: record -> build-store -> record held out -> simulate -> serve live, on the
 * bundled model (no download). Adds the figures to `root` under "fmoe_tiny". */
static int demo_fmoe_tiny(const char *dir, const char *samples, const demo_sizes *z, int json,
                          int quiet, cJSON *root) {
    const char *model = cmd_model_dir_or_default(CMD, NULL);
    if (!model) return CMD_EXIT_FAILURE;
    tiny_paths p;
    tiny_paths_init(&p, dir, samples);
    if (!json)
        printf("\n--- the whole pipeline on the bundled model fmoe-tiny (%s) ---\n", model);
    int rc;
    if ((rc = split_prompts(&p, z))) return rc;
    if ((rc = record_and_build(model, &p, z, json, quiet))) return rc;
    tiny_table t = {0};
    if ((rc = tiny_cache_size(p.heldout, &t.cache, &t.total))) return rc;
    cJSON *sim = NULL;
    if ((rc = simulate_heldout(&p, t.cache, t.total, json, quiet, &sim))) return rc;

    demo_live live = {0};
    tiny_live lv = {0};
    char *cmds[NUM_COMMANDS] = {0};
    const cJSON *results = cJSON_GetObjectItemCaseSensitive(sim, "results");
    const int n = cJSON_GetArraySize(results);
    for (int i = 0; i < n && t.num_rows < 16; i++)
        t.rows[t.num_rows++] = sim_row_of(cJSON_GetArrayItem(results, i));
    t.best = pick_best(t.rows, t.num_rows);
    t.lru = t.num_rows > 0 ? 0 : -1; /* DEMO_BASELINE's row */
    if (t.best < 0 || t.lru < 0) {
        rc = cmd_failf(CMD, "%s: no decode TPOT for the policies, or no " DEMO_BASELINE " row",
                       p.sim_json);
        goto done;
    }
    t.hardware = json_string(sim, "hardware");
    if (!json) print_simulated(&t, sim, p.heldout);

    /* Live: the held-out requests again, through the serve engine, best policy and lru. */
    if ((rc = demo_live_open(CMD, model, p.heldout, &live))) goto done;
    if ((rc = serve_live(&live, &t, p.store, quiet, &lv))) goto done;
    if (!json) print_live(&t, &lv, live.num_requests);

    const fmoe_policy_ops *ops = fmoe_policy_find(t.rows[t.best].policy);
    const int takes_store = ops && (ops->flags & FMOE_POLICY_TAKES_STORE);
    if ((rc = by_hand_commands(cmds, dir, z, t.cache, t.rows[t.best].policy, takes_store)))
        goto done;
    if (!json) {
        printf("\nthe same by hand:\n");
        for (int i = 0; i < NUM_COMMANDS; i++) printf("  %s\n", cmds[i]);
    }
    rc = add_tiny_json(root, model, &p, z, sim, &t, &lv, cmds);

done:
    for (int i = 0; i < NUM_COMMANDS; i++) free(cmds[i]);
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
