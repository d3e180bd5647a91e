/*
 * cmd_demo.c - `fmoe demo`: the pipeline on the bundled sample data, so a new user sees
 * fmoe work with no download. It grows with the project; today it imports the bundled
 * FLAME-MoE-290M routing sample (datasets/samples/flame-moe-290m, Apache-2.0) into a
 * trace and prints `fmoe inspect` of it.
 */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmd_common.h"
#include "paths.h"
#include "fmoe/datasets.h"
#include "fmoe/error.h"
#include "fmoe/geometry.h"
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

typedef struct demo_opts {
    const char *output_dir;
    int json, quiet;
} demo_opts;

static const cmd_option demo_options[] = {
    {.name = "output-dir", .short_name = 'o', .kind = CMD_OPT_STRING, .value_name = "DIR",
     .help = "where to write demo files",
     .default_text = "a new folder under $TMPDIR or /tmp, printed at the end",
     .offset = offsetof(demo_opts, output_dir)},
    {.name = "json", .kind = CMD_OPT_FLAG, .help = "print the summary as JSON",
     .offset = offsetof(demo_opts, json)},
    {.name = "quiet", .short_name = 'q', .kind = CMD_OPT_FLAG, .help = "no progress bar",
     .offset = offsetof(demo_opts, quiet)},
    {0},
};

const cmd_spec cmd_demo_spec = {
    .name = "demo",
    .usage = "demo [--output-dir DIR] [--json] [--quiet]",
    .description =
        "Runs fmoe on the bundled sample data: imports the FLAME-MoE-290M routing\n"
        "sample (8 MoE layers, 64 experts, top-6, 512 tokens) into an fmoe trace,\n"
        "prints its summary (fmoe inspect), and replays it through the simulator\n"
        "with on-demand loading, LRU, LFU and Belady's optimum at 10%, 25% and 50%\n"
        "of the experts in the fast tier (fmoe simulate). Then runs the whole\n"
        "pipeline on the bundled model fmoe-tiny: fmoe record (real CPU inference\n"
        "over 48 bundled prompts), fmoe build-store (from 70% of the requests) and\n"
        "fmoe simulate of the fmoe policy against the baselines on the other 30%.\n",
    .options = demo_options,
    .size = sizeof(demo_opts),
};

/* Prints the command line, then runs it in-process. */
static int run_step(int (*fn)(int, char **), int argc, char **argv) {
    printf("\n$ fmoe");
    for (int i = 0; i < argc; i++) printf(" %s", argv[i]);
    printf("\n");
    fflush(stdout);
    int rc = fn(argc, argv);
    fflush(stdout);
    return rc;
}

/* Part 2: record -> build-store -> simulate on the bundled model (no download). 48
 * prompts, 24 new tokens each, with one layer of speculative gates so that
 * mixtral-offload can run; 12 of the 48 layers' experts (25%) fit the fast tier. */
static int demo_fmoe_tiny(const char *dir, const char *samples) {
    const char *model = cmd_bundled_model_dir();
    if (!model)
        return cmd_failf(CMD, "the bundled model fmoe-tiny was not found (set "
                              "FMOE_BUNDLED_MODEL to the datasets/fmoe-tiny folder)");
    char prompts[PATH_MAX], trace[PATH_MAX + 32], store[PATH_MAX + 32];
    snprintf(prompts, sizeof prompts, "%.4000s/prompts_100.txt", samples);
    snprintf(trace, sizeof trace, "%s/fmoe-tiny.h5", dir);
    snprintf(store, sizeof store, "%s/fmoe-tiny-store.h5", dir);
    printf("\n--- the whole pipeline on the bundled model fmoe-tiny (%s) ---\n", model);

    char *record_argv[] = {"record", "--model", (char *)model, "--dataset", prompts,
                           "--max-requests", "48", "--max-new-tokens", "24", "--ignore-eos",
                           "--speculative", "1", "-o", trace, "--quiet", NULL};
    int rc = run_step(cmd_record, 15, record_argv);
    if (rc != 0) return rc;
    char *build_argv[] = {"build-store", "--trace", trace, "--capacity", "1000",
                          "--prefetch-distance", "1", "--split", "0.7", "--seed", "0",
                          "-o", store, "--quiet", NULL};
    rc = run_step(cmd_build_store, 14, build_argv);
    if (rc != 0) return rc;
    char *simulate_argv[] = {"simulate", "--trace", trace, "--store", store, "--holdout",
                             "--policy",
                             "fmoe,lru,lfu,moe-infinity,mixtral-offload,oracle,belady",
                             "--cache-experts", "12", "--prefetch-distance", "1",
                             "--hardware", "rtx3090-pcie4", "--quiet", NULL};
    return run_step(cmd_simulate, 15, simulate_argv);
}

int cmd_demo(int argc, char **argv) {
    demo_opts o = {0};
    int rc = cmd_options_parse(&cmd_demo_spec, &o, argc, argv, NULL);
    if (rc) return rc == CMD_OPTIONS_HELP ? CMD_EXIT_OK : rc;
    const char *output_dir = o.output_dir;
    const int json = o.json, quiet = o.quiet;

    const char *samples = cmd_samples_dir();
    if (!samples)
        return cmd_failf(CMD, "bundled samples not found (set FMOE_SAMPLES_DIR to the "
                              "datasets/samples folder of the fmoe source tree)");
    char dir[PATH_MAX];
    if (output_dir) {
        snprintf(dir, sizeof dir, "%s", output_dir);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return cmd_failf(CMD, "%s: cannot create folder", dir);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/fmoe-demo-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) return cmd_failf(CMD, "%s: cannot create a temporary folder", dir);
    }

    char files[FLAME_LAYERS][PATH_MAX];
    const char *file_ptrs[FLAME_LAYERS];
    for (int l = 0; l < FLAME_LAYERS; l++) {
        snprintf(files[l], sizeof files[l], "%s/flame-moe-290m/layer%02d.csv", samples, l + 2);
        file_ptrs[l] = files[l];
    }
    fmoe_model_geometry geometry;
    rc = fmoe_geometry_generic(FLAME_LAYERS, FLAME_EXPERTS, FLAME_TOP_K, 0, &geometry);
    if (rc < 0) return cmd_fail(CMD, rc);

    char trace_path[PATH_MAX + 32];
    snprintf(trace_path, sizeof trace_path, "%s/flame-moe-290m.h5", dir);
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
    if (!json)
        printf("fmoe demo: imported %lld tokens of %lld requests from the bundled FLAME-MoE-290M "
               "sample into %s\n\n",
               (long long)report.tokens, (long long)report.requests, trace_path);

    char *inspect_argv[] = {"inspect", trace_path, json ? "--json" : "--quiet", "--quiet", NULL};
    rc = cmd_inspect(4, inspect_argv);
    if (rc != 0 || json) return rc;

    /* 10%, 25% and 50% of the 512 routed experts in the fast tier. */
    char *simulate_argv[] = {"simulate", "--trace", trace_path, "--policy",
                             "ondemand,lru,lfu,belady", "--cache-experts", "51,128,256",
                             "--hardware", "rtx3090-pcie4", "--quiet", NULL};
    printf("\n$ fmoe simulate --trace %s --policy ondemand,lru,lfu,belady "
           "--cache-experts 51,128,256 --hardware rtx3090-pcie4\n",
           trace_path);
    fflush(stdout);
    rc = cmd_simulate(10, simulate_argv);
    if (rc != 0) return rc;
    rc = demo_fmoe_tiny(dir, samples);
    if (rc == 0)
        printf("\nnext: fmoe inspect %s --json, fmoe simulate --help, fmoe generate --help\n",
               trace_path);
    return rc;
}
