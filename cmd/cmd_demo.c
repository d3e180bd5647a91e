/*
 * cmd_demo.c - `fmoe demo`: the pipeline on the bundled sample data, so a new user sees
 * fmoe work with no download. It grows with the project; today it imports the bundled
 * FLAME-MoE-290M routing sample (datasets/samples/flame-moe-290m, Apache-2.0) into a
 * trace and prints `fmoe inspect` of it.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmd_common.h"
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

static void usage(FILE *out) {
    fprintf(out,
            "usage: fmoe demo [--output-dir DIR] [--json] [--quiet]\n"
            "\n"
            "Runs fmoe on the bundled sample data: imports the FLAME-MoE-290M routing\n"
            "sample (8 MoE layers, 64 experts, top-6, 512 tokens) into an fmoe trace,\n"
            "prints its summary (fmoe inspect), and replays it through the simulator\n"
            "with on-demand loading, LRU, LFU and Belady's optimum at 10%%, 25%% and 50%%\n"
            "of the experts in the fast tier (fmoe simulate).\n"
            "\n"
            "options:\n"
            "  --output-dir DIR  where to write demo files (default: a new folder under\n"
            "                    $TMPDIR or /tmp, printed at the end)\n"
            "  --json            print the summary as JSON\n"
            "  --quiet           no progress bar\n"
            "  -h, --help        show this help\n");
}

int cmd_demo(int argc, char **argv) {
    const char *output_dir = NULL;
    int json = 0, quiet = 0;
    static const struct option options[] = {
        {"output-dir", required_argument, NULL, 'o'},
        {"json", no_argument, NULL, 'j'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "ho:q", options, NULL)) != -1) {
        switch (c) {
        case 'o': output_dir = optarg; break;
        case 'j': json = 1; break;
        case 'q': quiet = 1; break;
        case 'h': usage(stdout); return CMD_EXIT_OK;
        default: return cmd_usage_error(CMD, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc) return cmd_usage_error(CMD, "unexpected argument '%s'", argv[optind]);

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
    int rc = fmoe_geometry_generic(FLAME_LAYERS, FLAME_EXPERTS, FLAME_TOP_K, 0, &geometry);
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
    if (rc == 0)
        printf("\nnext: fmoe inspect %s --json, fmoe simulate --help\n", trace_path);
    return rc;
}
