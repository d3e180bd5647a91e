/*
 * cmd_build_store.c - `fmoe build-store`: traces -> deduplicated expert-map store
 * (DESIGN.md §5; POLICIES.md A.5).
 *
 * defaults -> parse -> validate -> fmoe_store_build (streams the tokens, deduplicates,
 * progress bar) -> fmoe_store_write (.partial, then rename) -> a short report.
 */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "fmoe/error.h"
#include "fmoe/store.h"
#include "fmoe/trace.h"

int cmd_build_store(int argc, char **argv);

static const char *const CMD = "build-store";

#define MAX_TRACES 256
#define DEFAULT_CAPACITY 1000 /* fMoE §6.6 */
#define DEFAULT_DISTANCE 3    /* fMoE §6.1 */

static void usage(FILE *out) {
    fprintf(out,
            "usage: fmoe build-store --trace T.h5 [--trace T2.h5 ...] -o STORE.h5 [options]\n"
            "\n"
            "Stream the tokens of traces into a deduplicated expert-map store (fMoE §4.4):\n"
            "each token's expert map (its gate probabilities at every MoE layer) and semantic\n"
            "embedding is one entry. While the store has room entries are appended; once it\n"
            "is full, a new entry replaces the stored entry most redundant with it,\n"
            "RDY = (d/L)·cos(semantic) + ((L-d)/L)·cos(map).\n"
            "\n"
            "options:\n"
            "  --trace FILE             a trace (fmoe record / fmoe trace import); repeatable\n"
            "  -o, --output FILE        the store to write\n"
            "  --capacity C             entries the store holds (default %d)\n"
            "  --prefetch-distance D    d: layers ahead the policy prefetches; weights RDY\n"
            "                           (default %d, must be below the number of MoE layers)\n"
            "  --split S                share of each trace's requests put in the store, in\n"
            "                           (0, 1] (default 1); the rest are held out and listed in\n"
            "                           the store, for 'fmoe simulate --store STORE --holdout'\n"
            "  --seed N                 which requests the split holds out (default 0)\n"
            "  --compression C          zstd (default), deflate or none\n"
            "  --batch N                tokens scored per matrix product (default 256; speed\n"
            "                           only, the store is the same)\n"
            "  --quiet                  no progress bar\n"
            "  -h, --help               show this help\n"
            "\n"
            "Traces without semantic embeddings give a store without them: the first d\n"
            "layers of the fmoe policy then fall back to the store's most frequent experts.\n"
            "Traces with top-k probabilities only give maps of the known weights (the rest\n"
            "0). Both are reported.\n",
            DEFAULT_CAPACITY, DEFAULT_DISTANCE);
}

typedef struct options {
    const char *traces[MAX_TRACES];
    int32_t n_traces;
    const char *output;
    int32_t capacity;
    int32_t distance;
    double split;
    int64_t seed;
    int32_t batch;
    fmoe_trace_write_options write;
    int quiet;
} options;

static int parse_options(int argc, char **argv, options *o) {
    enum { O_TRACE = 256, O_CAPACITY, O_DIST, O_SPLIT, O_SEED, O_COMPRESSION, O_BATCH, O_QUIET };
    static const struct option longopts[] = {
        {"trace", required_argument, NULL, O_TRACE},
        {"output", required_argument, NULL, 'o'},
        {"capacity", required_argument, NULL, O_CAPACITY},
        {"prefetch-distance", required_argument, NULL, O_DIST},
        {"split", required_argument, NULL, O_SPLIT},
        {"seed", required_argument, NULL, O_SEED},
        {"compression", required_argument, NULL, O_COMPRESSION},
        {"batch", required_argument, NULL, O_BATCH},
        {"quiet", no_argument, NULL, O_QUIET},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    optind = 1;
    opterr = 0;
    int c, rc = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, "ho:", longopts, NULL)) != -1) {
        switch (c) {
        case O_TRACE:
            if (o->n_traces == MAX_TRACES)
                return cmd_usage_error(CMD, "at most %d --trace files", MAX_TRACES);
            o->traces[o->n_traces++] = optarg;
            break;
        case 'o': o->output = optarg; break;
        case O_CAPACITY:
            /* 0 parses, so that validation below can say what is wrong with it */
            rc = cmd_parse_i32(CMD, "--capacity", optarg, 0, INT32_MAX, &o->capacity);
            break;
        case O_DIST:
            rc = cmd_parse_i32(CMD, "--prefetch-distance", optarg, 0, 65535, &o->distance);
            break;
        case O_SPLIT: rc = cmd_parse_f64(CMD, "--split", optarg, 0, 1, &o->split); break;
        case O_SEED: rc = cmd_parse_i64(CMD, "--seed", optarg, 0, INT64_MAX, &o->seed); break;
        case O_COMPRESSION:
            if (fmoe_compression_parse(optarg, &o->write.compression) < 0)
                return cmd_usage_error(CMD, "--compression must be zstd, deflate or none, got '%s'",
                                       optarg);
            break;
        case O_BATCH: rc = cmd_parse_i32(CMD, "--batch", optarg, 1, 65536, &o->batch); break;
        case O_QUIET: o->quiet = 1; break;
        case 'h': usage(stdout); return -1;
        default:
            if (optopt >= O_TRACE || optopt == 'o')
                return cmd_usage_error(CMD, "option '%s' needs a value", argv[optind - 1]);
            return cmd_usage_error(CMD, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (rc) return rc;
    if (optind < argc) return cmd_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (o->n_traces == 0) return cmd_usage_error(CMD, "--trace is required");
    if (!o->output) return cmd_usage_error(CMD, "-o STORE.h5 is required");
    if (o->capacity < 1)
        return cmd_usage_error(CMD, "--capacity must be at least 1 entry, got %d", o->capacity);
    if (!(o->split > 0))
        return cmd_usage_error(CMD, "--split must be in (0, 1]: the share of requests put in "
                                    "the store, got %g",
                               o->split);
    return 0;
}

int cmd_build_store(int argc, char **argv) {
    options o;
    memset(&o, 0, sizeof o);
    o.capacity = DEFAULT_CAPACITY;
    o.distance = DEFAULT_DISTANCE;
    o.split = 1.0;
    o.write.compression = FMOE_COMPRESSION_ZSTD;
    int rc = parse_options(argc, argv, &o);
    if (rc != 0) return rc < 0 ? CMD_EXIT_OK : rc;

    const double t0 = cmd_now();
    cmd_progress_bar bar;
    cmd_progress_bar_init(&bar, "building store", o.quiet);
    fmoe_progress progress = cmd_progress_bar_callback(&bar);
    const fmoe_store_build_options bo = {.capacity = o.capacity,
                                         .prefetch_distance = o.distance,
                                         .split = o.split,
                                         .seed = (uint64_t)o.seed,
                                         .batch = o.batch,
                                         .progress = &progress};
    fmoe_store_file *f = NULL;
    fmoe_store_build_report rep;
    rc = fmoe_store_build(o.traces, o.n_traces, &bo, &f, &rep);
    cmd_progress_bar_done(&bar);
    if (rc < 0) return cmd_fail(CMD, rc);
    const double t_build = cmd_now() - t0;
    rc = fmoe_store_write(o.output, f, &o.write);
    if (rc < 0) {
        fmoe_store_file_free(f);
        return cmd_fail(CMD, rc);
    }
    const fmoe_expertmap_config *c = fmoe_expertmap_config_of(f->store);
    const int32_t E = fmoe_expertmap_size(f->store);
    printf("%s: %d of %d entries from %lld tokens of %lld requests (%d trace%s)\n", o.output, E,
           c->capacity, (long long)rep.tokens, (long long)f->num_used, f->num_sources,
           f->num_sources == 1 ? "" : "s");
    printf("  model        %s, %d MoE layers x %d experts, top-%d; prefetch distance %d\n",
           f->model_name[0] ? f->model_name : "(unnamed)", c->num_layers, c->num_experts,
           c->top_k, c->prefetch_distance);
    printf("  entries      %lld appended, %lld placed by deduplication\n",
           (long long)rep.appended, (long long)rep.replaced);
    if (o.split < 1)
        printf("  split        %.3g of each trace's requests in the store (seed %lld): %lld "
               "used, %lld held out\n",
               o.split, (long long)o.seed, (long long)f->num_used, (long long)f->num_held_out);
    if (rep.semantic_skipped)
        printf("  semantic     none: %s; simulate's fmoe policy falls back to the store's most "
               "frequent experts for the first %d layers\n",
               f->num_sources > 1 ? "some traces carry no semantic embeddings (or their sizes "
                                    "differ)"
                                  : "the trace carries no semantic embeddings",
               c->prefetch_distance);
    else
        printf("  semantic     %d-dim %s\n", c->semantic_dim, f->semantic_kind);
    if (rep.probs_topk)
        printf("  probs        top-k only: maps hold the chosen experts' weights, the rest 0\n");
    char b[32];
    printf("  size         %s in memory (C x (h + L x J) x 4 bytes)\n",
           cmd_format_bytes((double)c->capacity * (c->semantic_dim + (double)c->num_layers *
                                                   c->num_experts) * 4.0,
                            b, sizeof b));
    printf("  took         %.2f s (%.0f tokens/s)\n", t_build,
           t_build > 0 ? (double)rep.tokens / t_build : 0.0);
    fmoe_store_file_free(f);
    return CMD_EXIT_OK;
}
