/*
 * cmd_build_store.c - `fmoe build-store`: traces -> deduplicated expert-map store
 * (docs/design.md §5; store maintenance as in the fMoE paper, "fMoE: Fine-Grained Expert
 * Offloading for Large Mixture-of-Experts Serving", §4.4).
 *
 * defaults -> parse -> validate -> fmoe_store_build (streams the tokens, deduplicates,
 * progress bar) -> fmoe_store_write (.partial, then rename) -> a short report.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "fmoe/error.h"
#include "fmoe/store.h"
#include "fmoe/trace.h"
#include "paths.h"

int cmd_build_store(int argc, char **argv);

static const char *const CMD = "build-store";

#define DEFAULT_CAPACITY 1000 /* fMoE §6.6 */
#define DEFAULT_DISTANCE 3    /* fMoE §6.1 */
#define STR_(x) #x
#define STR(x) STR_(x)

typedef struct options {
    cmd_opt_strings traces; /* --trace, repeatable */
    const char *output;
    int32_t capacity;
    int32_t distance;
    double split;
    int64_t seed;
    int32_t batch;
    fmoe_trace_write_options write;
    int quiet;
} options;

static const cmd_option build_store_options[] = {
    {.name = "trace", .kind = CMD_OPT_STRINGS, .io = CMD_IO_INPUT, .value_name = "FILE",
     .help = "a trace (fmoe record / fmoe trace import); repeatable",
     .offset = offsetof(options, traces)},
    {.name = "output", .short_name = 'o', .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT,
     .value_name = "FILE",
     .help = "the store to write", .offset = offsetof(options, output)},
    /* 0 parses, so that validation can say what is wrong with it */
    {.name = "capacity", .kind = CMD_OPT_INT32, .value_name = "C",
     .help = "entries the store holds", .default_text = STR(DEFAULT_CAPACITY),
     .offset = offsetof(options, capacity), .min = 0, .max = INT32_MAX},
    {.name = "prefetch-distance", .kind = CMD_OPT_INT32, .value_name = "D",
     .help = "d: layers ahead the policy prefetches; weights RDY (must be below the number "
             "of MoE layers)",
     .default_text = STR(DEFAULT_DISTANCE), .offset = offsetof(options, distance), .min = 0,
     .max = 65535},
    {.name = "split", .kind = CMD_OPT_DOUBLE, .value_name = "S",
     .help = "share of each trace's requests put in the store, in (0, 1]; the rest are held "
             "out and listed in the store, for 'fmoe simulate --store STORE --holdout'",
     .default_text = "1", .offset = offsetof(options, split), .fmin = 0, .fmax = 1},
    {.name = "seed", .kind = CMD_OPT_INT64, .value_name = "N",
     .help = "which requests the split holds out", .default_text = "0",
     .offset = offsetof(options, seed), .min = 0, .max = INT64_MAX},
    {.name = "compression", .kind = CMD_OPT_CALLBACK, .value_name = "C",
     .help = "zstd, deflate or none", .default_text = "zstd", .offset = offsetof(options, write.compression),
     .handler = cmd_on_compression,
     .example = "deflate"},
    {.name = "batch", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "tokens scored per matrix product (speed only, the store is the same)",
     .default_text = "256", .offset = offsetof(options, batch), .min = 1, .max = 65536},
    {.name = "quiet", .kind = CMD_OPT_FLAG, .help = "no progress bar",
     .offset = offsetof(options, quiet)},
    {0},
};

static void init(void *base) {
    options *o = base;
    memset(o, 0, sizeof *o);
    o->capacity = DEFAULT_CAPACITY;
    o->distance = DEFAULT_DISTANCE;
    o->split = 1.0;
    o->write.compression = FMOE_COMPRESSION_ZSTD;
}

const cmd_spec cmd_build_store_spec = {
    .name = "build-store",
    .usage = "build-store --trace T.h5 [--trace T2.h5 ...] -o STORE.h5 [options]",
    .description =
        "Stream the tokens of traces into a deduplicated expert-map store (fMoE §4.4):\n"
        "each token's expert map (its gate probabilities at every MoE layer) and semantic\n"
        "embedding is one entry. While the store has room entries are appended; once it\n"
        "is full, a new entry replaces the stored entry most redundant with it,\n"
        "RDY = (d/L)·cos(semantic) + ((L-d)/L)·cos(map).\n",
    .options = build_store_options,
    .epilog =
        "Traces without semantic embeddings give a store without them: the first d\n"
        "layers of the fmoe policy then fall back to the store's most frequent experts.\n"
        "Traces with top-k probabilities only give maps of the known weights (the rest\n"
        "0). Both are reported.\n",
    .size = sizeof(options),
    .init = init,
};

static int parse_options(int argc, char **argv, options *o) {
    int rc = cmd_options_parse(&cmd_build_store_spec, o, argc, argv, NULL);
    if (rc) return rc;
    if (o->traces.n == 0) return cmd_usage_error(CMD, "--trace is required");
    if (!o->output) return cmd_usage_error(CMD, "-o STORE.h5 is required");
    if (o->capacity < 1)
        return cmd_usage_error(CMD, "--capacity must be at least 1 entry, got %d", o->capacity);
    if (!(o->split > 0))
        return cmd_usage_error(CMD, "--split must be in (0, 1]: the share of requests put in "
                                    "the store, got %g",
                               o->split);
    return 0; /* -o against the traces: checked by the parse (cmd/outputs.h) */
}

int cmd_build_store(int argc, char **argv) {
    options o;
    init(&o);
    int rc = parse_options(argc, argv, &o);
    if (rc != 0) return rc < 0 ? CMD_EXIT_OK : rc;

    /* A distance the traces' layers cannot hold is a usage error (exit 2), as in simulate;
     * a trace that does not open is left to the build, which names it. */
    for (int i = 0; i < o.traces.n; i++) {
        fmoe_trace_reader *r = NULL;
        if (fmoe_trace_reader_open(&r, o.traces.items[i]) < 0) {
            fmoe_error_clear();
            break;
        }
        const int32_t L = fmoe_trace_reader_header(r)->num_layers;
        fmoe_trace_reader_close(r);
        if (L > 0 && o.distance >= L)
            return cmd_usage_error(CMD,
                                   "--prefetch-distance %d is not below the %d MoE layers of "
                                   "%s (at most %d)",
                                   (int)o.distance, (int)L, o.traces.items[i], (int)L - 1);
    }

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
    rc = fmoe_store_build(o.traces.items, o.traces.n, &bo, &f, &rep);
    cmd_progress_bar_done(&bar);
    if (rc < 0) return cmd_fail(CMD, rc);
    const double t_build = cmd_now() - t0;
    /* interrupted while writing: no .partial left (a half-built store is worth nothing) */
    char partial[4096];
    snprintf(partial, sizeof partial, "%s.partial", o.output);
    const char *cleanup[] = {partial};
    cmd_remove_on_signal(cleanup, 1);
    rc = fmoe_store_write(o.output, f, &o.write);
    if (rc < 0) {
        fmoe_store_file_free(f);
        return cmd_fail(CMD, rc);
    }
    const fmoe_expertmap_config *c = fmoe_expertmap_config_of(f->store);
    const int32_t E = fmoe_expertmap_size(f->store);
    printf("%s: %d of %d entries from %lld tokens of %lld request%s (%d trace%s)\n", o.output,
           E, c->capacity, (long long)rep.tokens, (long long)f->num_used,
           f->num_used == 1 ? "" : "s", f->num_sources, f->num_sources == 1 ? "" : "s");
    printf("  model        %s, %d MoE layers x %d experts, top-%d; prefetch distance %d\n",
           f->model_name[0] ? f->model_name : "(unnamed)", c->num_layers, c->num_experts,
           c->top_k, c->prefetch_distance);
    printf("  entries      %lld appended, %lld placed by deduplication\n",
           (long long)rep.appended, (long long)rep.replaced);
    if (c->capacity < o.capacity)
        printf("  capacity     %d asked; sized to the %d tokens streamed in (offline updates "
               "grow it up to %d)\n",
               o.capacity, c->capacity, o.capacity);
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
    if (rep.ids_only)
        printf("  probs        none (expert ids only): maps hold 1/K on each chosen expert, as "
               "the fmoe policies read such traces\n");
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
