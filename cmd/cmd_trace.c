/*
 * cmd_trace.c - `fmoe trace <subcommand>`: work with traces.
 *
 * `fmoe trace import` turns routing logs recorded elsewhere into fmoe traces (docs/design.md
 * §4.1): the JSON Lines interchange format, or the dense per-layer CSV of the FLAME-MoE
 * traces. defaults -> parse -> validate -> geometry -> import (library) -> summary. An
 * import interrupted by SIGINT/SIGTERM/SIGHUP leaves no .partial (it can be run again).
 *
 * `fmoe trace recover PARTIAL [-o OUT]` turns what a killed `fmoe record` or `fmoe serve
 * --trace-out` left (TRACE.h5.partial and its journal) into a valid trace
 * (fmoe_trace_recover, trace/trace_journal.c).
 */
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "fmoe/datasets.h"
#include "fmoe/error.h"
#include "files.h"
#include "fmoe/geometry.h"
#include "fmoe/trace.h"
#include "paths.h"

static const char *const CMD = "trace";
static const char *const CMD_IMPORT = "trace import";

typedef enum import_format { FORMAT_AUTO, FORMAT_JSONL, FORMAT_DENSE_CSV } import_format;

static const char *format_name(import_format f) {
    return f == FORMAT_JSONL ? "jsonl" : f == FORMAT_DENSE_CSV ? "dense-csv" : "auto";
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static import_format format_from_name(const char *path) {
    if (ends_with(path, ".jsonl") || ends_with(path, ".json")) return FORMAT_JSONL;
    if (ends_with(path, ".csv")) return FORMAT_DENSE_CSV;
    return FORMAT_AUTO;
}

/* Reads a whole config.json (lib/files.h: a regular file of at most 64 MiB). @return the
 * NUL-terminated text, or NULL with the fmoe error set. */
static char *read_text(const char *path) {
    char *text = NULL;
    size_t len = 0;
    if (fmoe__read_file_bounded(path, "a config.json", (long long)64 << 20, 0, &text, &len) < 0)
        return NULL;
    return text;
}

/* Default model name: config.json's "_name_or_path", else the config's folder name. */
static void default_model_name(const char *config_path, const char *config_json, char *out,
                               size_t cap) {
    out[0] = '\0';
    cJSON *root = cJSON_Parse(config_json);
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "_name_or_path");
    if (cJSON_IsString(n) && n->valuestring[0]) snprintf(out, cap, "%s", n->valuestring);
    cJSON_Delete(root);
    if (out[0]) return;
    const char *slash = strrchr(config_path, '/');
    if (!slash || slash == config_path) return;
    const char *s = slash;
    while (s > config_path && s[-1] != '/') s--;
    if (slash - s > 0 && !(slash - s == 1 && *s == '.'))
        snprintf(out, cap, "%.*s", (int)(slash - s), s);
}

static int print_json(const char *out_path, import_format fmt, char **inputs, int ninputs,
                      const fmoe_model_geometry *g, const char *model_name,
                      const fmoe_import_report *rep) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return -1;
    cJSON_AddStringToObject(o, "output", out_path);
    cJSON_AddStringToObject(o, "format", format_name(fmt));
    cJSON *in = cJSON_AddArrayToObject(o, "inputs");
    for (int i = 0; i < ninputs; i++) cJSON_AddItemToArray(in, cJSON_CreateString(inputs[i]));
    cJSON_AddStringToObject(o, "model_name", model_name);
    cJSON_AddNumberToObject(o, "num_layers", g->num_moe_layers);
    cJSON_AddNumberToObject(o, "num_experts", g->num_experts);
    cJSON_AddNumberToObject(o, "top_k", g->top_k);
    cJSON_AddNumberToObject(o, "records", (double)rep->lines);
    cJSON_AddNumberToObject(o, "requests", (double)rep->requests);
    cJSON_AddNumberToObject(o, "tokens", (double)rep->tokens);
    cJSON_AddNumberToObject(o, "dropped_tokens", (double)rep->dropped_tokens);
    cJSON_AddStringToObject(o, "probs_kind", fmoe_probs_kind_name(rep->probs_kind));
    return cmd_print_json(o);
}

/* ------------------------------------------------------------------ options */

typedef struct import_opts {
    int32_t format; /* import_format */
    const char *config_path, *out_path, *model_name;
    int32_t layers, experts, top_k, hidden;
    int have_layers, have_experts, have_top_k, have_hidden, have_tpr;
    int drop_incomplete, json, quiet;
    int64_t tokens_per_request, expert_bytes;
    fmoe_compression compression;
} import_opts;

static const char *const format_names[] = {"jsonl", "dense-csv", NULL};
static const int32_t format_values[] = {FORMAT_JSONL, FORMAT_DENSE_CSV};

#define OPT(field) offsetof(import_opts, field)
static const cmd_option import_options[] = {
    {.name = "format", .kind = CMD_OPT_ENUM, .value_name = "F",
     .help = "jsonl or dense-csv", .default_text = "from the IN extensions, .jsonl/.json -> "
                                                   "jsonl, .csv -> dense-csv",
     .offset = OPT(format), .choices = format_names, .choice_values = format_values},
    {.name = "model-config", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "FILE",
     .help = "the model's HF config.json: geometry (L, J, K, h, shared experts, expert "
             "bytes), stored in the trace and fingerprinted",
     .offset = OPT(config_path)},
    {.name = "layers", .kind = CMD_OPT_INT32, .value_name = "L",
     .help = "MoE layers, instead of --model-config (with --experts and --top-k; all three "
             "are needed)",
     .offset = OPT(layers), .min = 1, .max = FMOE_MAX_LAYERS, .seen_offset = OPT(have_layers)},
    {.name = "experts", .kind = CMD_OPT_INT32, .value_name = "J",
     .help = "routed experts per MoE layer", .offset = OPT(experts), .min = 1, .max = 65536,
     .seen_offset = OPT(have_experts)},
    {.name = "top-k", .kind = CMD_OPT_INT32, .value_name = "K",
     .help = "experts chosen per token", .offset = OPT(top_k), .min = 1, .max = 65536,
     .seen_offset = OPT(have_top_k)},
    {.name = "expert-bytes", .kind = CMD_OPT_INT64, .value_name = "N",
     .help = "bytes of one routed expert, with --layers/--experts/--top-k (0: unknown; the "
             "simulator then needs --model-config); a config.json gives its own",
     .default_text = "0", .offset = OPT(expert_bytes), .min = 0,
     .max = (int64_t)1 << 40 /* 1 TiB: beyond any expert, and the simulator's byte counters
                                cannot overflow (cmd_simulate.c) */},
    {.name = "hidden-size", .kind = CMD_OPT_INT32, .value_name = "H",
     .help = "hidden size recorded with --layers/--experts/--top-k (0: unknown)",
     .default_text = "0", .offset = OPT(hidden), .min = 0, .max = INT32_MAX,
     .seen_offset = OPT(have_hidden)},
    {.name = "drop-incomplete", .kind = CMD_OPT_FLAG,
     .help = "jsonl: drop tokens that lack some layers and report how many (default: such a "
             "token is an error)",
     .offset = OPT(drop_incomplete)},
    {.name = "tokens-per-request", .kind = CMD_OPT_INT64, .value_name = "N",
     .help = "dense-csv: split the token rows into requests of N prefill tokens (0: one "
             "request)",
     .default_text = "0", .offset = OPT(tokens_per_request), .min = 0, .max = INT32_MAX,
     .seen_offset = OPT(have_tpr)},
    {.name = "compression", .kind = CMD_OPT_CALLBACK, .value_name = "C",
     .help = "zstd, deflate or none", .default_text = "zstd", .offset = OPT(compression),
     .handler = cmd_on_compression, .example = "none"},
    {.name = "model-name", .kind = CMD_OPT_STRING, .io = CMD_IO_TEXT, .value_name = "S",
     .help = "model name stored in the trace",
     .default_text = "the config's _name_or_path, else its folder name; none without a config",
     .offset = OPT(model_name)},
    {.name = "output", .short_name = 'o', .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT,
     .value_name = "FILE",
     .help = "the trace to write (required); written as FILE.partial and renamed when "
             "complete, so a failure leaves nothing",
     .offset = OPT(out_path)},
    {.name = "json", .kind = CMD_OPT_FLAG, .help = "print the summary as JSON",
     .offset = OPT(json)},
    {.name = "quiet", .kind = CMD_OPT_FLAG, .help = "no progress bar", .offset = OPT(quiet)},
    {0},
};
#undef OPT

static void import_init(void *base) {
    *(import_opts *)base = (import_opts){.format = FORMAT_AUTO,
                                         .compression = FMOE_COMPRESSION_ZSTD};
}

const cmd_spec cmd_trace_import_spec = {
    .name = "trace import",
    .usage = "trace import [--format jsonl|dense-csv]\n"
             "                         (--model-config CONFIG.json | --layers L --experts J "
             "--top-k K)\n"
             "                         [options] IN... -o OUT.h5",
    .description =
        "Turns routing logs recorded elsewhere into an fmoe trace (HDF5).\n"
        "\n"
        "Formats:\n"
        "  jsonl      one JSON object per (request, token, layer), lines in any order:\n"
        "               {\"request\": 7, \"token\": 0, \"phase\": \"decode\", \"layer\": 3,\n"
        "                \"experts\": [5, 1], \"probs\": [0.71, 0.29], \"token_id\": 1234}\n"
        "             request: integer or string; token: position in the request (prompt\n"
        "             tokens first); phase: prefill|decode (default decode); layer: 0-based\n"
        "             MoE layer; experts: the K chosen experts in gate order; probs: K values\n"
        "             (the chosen experts' weights), J values (the full distribution) or\n"
        "             absent; token_id optional. Requests keep the order of their first\n"
        "             line, tokens are ordered by position. Lines {\"type\": \"meta\"} are\n"
        "             skipped. Exactly one IN file.\n"
        "  dense-csv  one CSV per MoE layer, in layer order (the FLAME-MoE traces): header\n"
        "             layer_id,token_id,expert_0..expert_{J-1}; row i = token i in every\n"
        "             file, with exactly K non-zero probabilities (the chosen experts,\n"
        "             ordered by decreasing probability). One IN file per MoE layer.\n",
    .options = import_options,
    .epilog =
        "examples:\n"
        "  fmoe trace import --layers 2 --experts 8 --top-k 2 routes.jsonl -o routes.h5\n"
        "  fmoe trace import --format dense-csv --layers 8 --experts 64 --top-k 6 \\\n"
        "      --tokens-per-request 64 layer0{2..9}.csv -o flame.h5\n",
    .max_positional = -1,
    .size = sizeof(import_opts),
    .init = import_init,
};

static const cmd_option trace_options[] = {{0}};

const cmd_spec cmd_trace_spec = {
    .name = "trace",
    .usage = "trace <subcommand> [options]",
    .description =
        "subcommands:\n"
        "  import   routing logs recorded elsewhere (JSON Lines, dense CSV) -> fmoe trace\n"
        "  recover  what a killed record or serve --trace-out left -> a valid trace\n"
        "  merge    traces of one model and options (record's MPI shards) -> one trace\n",
    .options = trace_options,
    .epilog = "Run 'fmoe trace import --help', 'fmoe trace recover --help' or 'fmoe trace "
              "merge --help' for their options.\n",
};

/* ------------------------------------------------------------------ recover */

typedef struct recover_opts {
    const char *out_path;
    int json;
} recover_opts;

static const cmd_option recover_options[] = {
    {.name = "output", .short_name = 'o', .kind = CMD_OPT_STRING,
     .io = CMD_IO_OUTPUT_OF_PARTIAL, .value_name = "OUT.h5",
     .help = "the trace to write; never replaced when it exists",
     .default_text = "PARTIAL without .partial", .offset = offsetof(recover_opts, out_path)},
    {.name = "json", .kind = CMD_OPT_FLAG, .help = "print the summary as JSON",
     .offset = offsetof(recover_opts, json)},
    {0},
};

const cmd_spec cmd_trace_recover_spec = {
    .name = "trace recover",
    .usage = "trace recover TRACE.h5.partial [-o OUT.h5]",
    .description =
        "Turns what a killed (or interrupted) `fmoe record` or `fmoe serve --trace-out`\n"
        "left behind into a valid trace holding every request it finished.\n"
        "\n"
        "Such a writer appends each finished request to TRACE.h5.partial.journal (one\n"
        "checksummed record) before it goes into the HDF5 file, so whatever instant the\n"
        "process died at, the journal holds every request whose append returned, and at\n"
        "most one torn record at its end (its checksum still 0), which is dropped. The\n"
        "trace is rebuilt from the journal; without one, TRACE.h5.partial is kept when it\n"
        "reads as a whole trace. The journal and the .partial are removed only when the\n"
        "trace holds everything they did.\n"
        "\n"
        "Damage anywhere in the journal, its end included (a flipped bit, a block the disk\n"
        "lost, a length field changed), or a journal cut short beside a .partial listing\n"
        "requests it lacks, is no kill's doing: the records that still check out are\n"
        "recovered, the trace is TRACE.h5.partial's copy instead when that reads and holds\n"
        "all of them and more, the journal and the .partial are both kept as they are, and\n"
        "the exit status is 1 with the journal's byte offset on stderr.\n",
    .options = recover_options,
    .epilog = "example:\n"
              "  fmoe trace recover sharegpt.h5.partial          # -> sharegpt.h5\n",
    .max_positional = 1,
    .size = sizeof(recover_opts),
};

static int cmd_trace_recover(int argc, char **argv) {
    static const char *const CMD_RECOVER = "trace recover";
    recover_opts o = {0};
    int npos = 0;
    int rc = cmd_options_parse(&cmd_trace_recover_spec, &o, argc, argv, &npos);
    if (rc) return rc == CMD_OPTIONS_HELP ? CMD_EXIT_OK : rc;
    if (npos != 1) return cmd_usage_error(CMD_RECOVER, "expected one TRACE.h5.partial");
    const char *partial = argv[1];
    if (!ends_with(partial, ".partial"))
        return cmd_usage_error(CMD_RECOVER, "%s: expected the .partial a writer left "
                                            "(TRACE.h5.partial)",
                               partial);
    fmoe_trace_recover_report rep;
    if ((rc = fmoe_trace_recover(partial, o.out_path, &rep)) < 0) return cmd_fail(CMD_RECOVER, rc);
    /* damage is a failure even though a trace was written: the journal and the .partial
     * are kept, and the one line on stderr says where */
    const int status = rep.damaged ? CMD_EXIT_FAILURE : CMD_EXIT_OK;
    if (o.json) {
        cJSON *j = cJSON_CreateObject();
        if (!j) return cmd_failf(CMD_RECOVER, "out of memory");
        cJSON_AddStringToObject(j, "output", rep.output);
        cJSON_AddStringToObject(j, "source", rep.from_journal ? "journal" : "partial");
        cJSON_AddNumberToObject(j, "requests", (double)rep.requests);
        cJSON_AddNumberToObject(j, "tokens", (double)rep.tokens);
        cJSON_AddNumberToObject(j, "dropped_bytes", (double)rep.dropped_bytes);
        cJSON_AddBoolToObject(j, "damaged", rep.damaged);
        cJSON_AddNumberToObject(j, "damaged_bytes", (double)rep.damaged_bytes);
        cJSON_AddNumberToObject(j, "damaged_at", (double)rep.damaged_at);
        cJSON_AddNumberToObject(j, "journal_requests", (double)rep.journal_requests);
        cJSON_AddNumberToObject(j, "partial_requests", (double)rep.partial_requests);
        cJSON_AddBoolToObject(j, "kept", rep.kept);
        if (cmd_print_json(j) != 0) return cmd_failf(CMD_RECOVER, "out of memory");
        return rep.damaged ? cmd_failf(CMD_RECOVER, "%s", rep.damage) : status;
    }
    printf("Recovered %lld request%s (%lld tokens) from %s%s into %s", (long long)rep.requests,
           rep.requests == 1 ? "" : "s", (long long)rep.tokens, partial,
           rep.from_journal ? ".journal" : "", rep.output);
    if (rep.dropped_bytes > 0)
        printf("; dropped the %lld bytes of a request the kill cut short",
               (long long)rep.dropped_bytes);
    if (rep.kept) printf("; removed nothing");
    printf(".\n");
    fflush(stdout);
    return rep.damaged ? cmd_failf(CMD_RECOVER, "%s", rep.damage) : status;
}

static int cmd_trace_import(int argc, char **argv) {
    import_opts o;
    import_init(&o);
    int npos = 0;
    int rc = cmd_options_parse(&cmd_trace_import_spec, &o, argc, argv, &npos);
    if (rc) return rc == CMD_OPTIONS_HELP ? CMD_EXIT_OK : rc;
    import_format fmt = (import_format)o.format;
    const char *config_path = o.config_path, *out_path = o.out_path, *model_name = o.model_name;
    const int32_t layers = o.layers, experts = o.experts, top_k = o.top_k, hidden = o.hidden;
    const int have_layers = o.have_layers, have_experts = o.have_experts,
              have_top_k = o.have_top_k, have_hidden = o.have_hidden, have_tpr = o.have_tpr;
    const int drop_incomplete = o.drop_incomplete, json = o.json, quiet = o.quiet;
    const int64_t tokens_per_request = o.tokens_per_request, expert_bytes = o.expert_bytes;
    const fmoe_compression compression = o.compression;
    char **inputs = argv + 1;
    const int ninputs = npos;

    /* validate */
    if (ninputs < 1) return cmd_usage_error(CMD_IMPORT, "no input file");
    if (!out_path) return cmd_usage_error(CMD_IMPORT, "no output file (-o OUT.h5)");
    if (fmt == FORMAT_AUTO) {
        fmt = format_from_name(inputs[0]);
        for (int i = 1; i < ninputs; i++)
            if (format_from_name(inputs[i]) != fmt) fmt = FORMAT_AUTO;
        if (fmt == FORMAT_AUTO)
            return cmd_usage_error(CMD_IMPORT, "cannot tell the format from the file names: "
                                               "give --format jsonl or --format dense-csv");
    }
    int by_hand = have_layers || have_experts || have_top_k;
    if (config_path && by_hand)
        return cmd_usage_error(CMD_IMPORT,
                               "give either --model-config or --layers/--experts/--top-k, not both");
    if (!config_path && !(have_layers && have_experts && have_top_k))
        return cmd_usage_error(CMD_IMPORT, "the model geometry is needed: --model-config "
                                           "CONFIG.json, or all of --layers, --experts, --top-k");
    if (config_path && expert_bytes > 0)
        return cmd_usage_error(CMD_IMPORT, "--expert-bytes goes with --layers/--experts/--top-k "
                                           "(the config gives its own)");
    if (config_path && have_hidden)
        return cmd_usage_error(CMD_IMPORT, "--hidden-size goes with --layers/--experts/--top-k "
                                           "(the config gives its own)");
    if (by_hand && top_k > experts)
        return cmd_usage_error(CMD_IMPORT, "--top-k %d exceeds --experts %d", (int)top_k,
                               (int)experts);
    if (fmt == FORMAT_JSONL && ninputs != 1)
        return cmd_usage_error(CMD_IMPORT, "--format jsonl takes one input file, got %d", ninputs);
    if (fmt == FORMAT_JSONL && have_tpr)
        return cmd_usage_error(CMD_IMPORT, "--tokens-per-request applies to --format dense-csv");
    if (fmt == FORMAT_DENSE_CSV && drop_incomplete)
        return cmd_usage_error(CMD_IMPORT, "--drop-incomplete applies to --format jsonl");

    /* geometry */
    fmoe_model_geometry geometry;
    char *config_json = NULL;
    char name_buf[256] = "";
    if (config_path) {
        config_json = read_text(config_path);
        if (!config_json) return cmd_fail(CMD_IMPORT, FMOE_EIO);
        rc = fmoe_geometry_parse(config_json, strlen(config_json), &geometry);
        if (rc < 0) {
            fmoe_error_prefix("%s", config_path);
            free(config_json);
            return cmd_fail(CMD_IMPORT, rc);
        }
        if (!model_name) default_model_name(config_path, config_json, name_buf, sizeof name_buf);
    } else {
        rc = fmoe_geometry_generic(layers, experts, top_k, hidden, &geometry);
        if (rc < 0) return cmd_fail(CMD_IMPORT, rc);
    }
    if (model_name) snprintf(name_buf, sizeof name_buf, "%s", model_name);
    if (fmt == FORMAT_DENSE_CSV && ninputs != geometry.num_moe_layers) {
        free(config_json);
        return cmd_usage_error(CMD_IMPORT,
                               "--format dense-csv takes one file per MoE layer: %d given, the "
                               "model has L = %d",
                               ninputs, (int)geometry.num_moe_layers);
    }

    /* run: an interrupted import leaves nothing, so it can simply be run again */
    char partial[4096];
    snprintf(partial, sizeof partial, "%s.partial", out_path);
    const char *cleanup[] = {partial};
    if (cmd_remove_on_signal(cleanup, 1) != 0) {
        free(config_json);
        return cmd_failf(CMD_IMPORT, "cannot install the signal handler");
    }
    cmd_progress_bar bar;
    cmd_progress_bar_init(&bar, "import", quiet);
    fmoe_import_options opts = {
        .geometry = &geometry,
        .config_json = config_json,
        .model_name = name_buf,
        .drop_incomplete = drop_incomplete,
        .expert_bytes = expert_bytes,
        .write = {.compression = compression},
        .progress = cmd_progress_bar_callback(&bar),
    };
    fmoe_import_report rep;
    if (fmt == FORMAT_JSONL)
        rc = fmoe_import_jsonl(inputs[0], &opts, out_path, &rep);
    else
        rc = fmoe_import_dense_csv((const char *const *)inputs, ninputs, tokens_per_request,
                                   &opts, out_path, &rep);
    cmd_progress_bar_done(&bar);
    free(config_json);
    if (rc < 0) return cmd_fail(CMD_IMPORT, rc);

    /* summary */
    if (json) {
        if (print_json(out_path, fmt, inputs, ninputs, &geometry, name_buf, &rep) < 0)
            return cmd_failf(CMD_IMPORT, "out of memory");
        return CMD_EXIT_OK;
    }
    if (fmt == FORMAT_JSONL)
        printf("Imported %lld routing record%s from %s into %lld request%s and %lld token%s "
               "(%lld incomplete token%s dropped)",
               (long long)rep.lines, rep.lines == 1 ? "" : "s", inputs[0],
               (long long)rep.requests, rep.requests == 1 ? "" : "s", (long long)rep.tokens,
               rep.tokens == 1 ? "" : "s", (long long)rep.dropped_tokens,
               rep.dropped_tokens == 1 ? "" : "s");
    else
        printf("Imported %lld rows of %d layer file%s (%s%s%s) into %lld request%s and %lld "
               "prefill token%s",
               (long long)rep.lines, ninputs, ninputs == 1 ? "" : "s", inputs[0],
               ninputs > 1 ? " .. " : "", ninputs > 1 ? inputs[ninputs - 1] : "",
               (long long)rep.requests, rep.requests == 1 ? "" : "s", (long long)rep.tokens,
               rep.tokens == 1 ? "" : "s");
    printf("; L = %d layers, J = %d experts, top-%d; probabilities: %s. Wrote %s.\n",
           (int)geometry.num_moe_layers, (int)geometry.num_experts, (int)geometry.top_k,
           fmoe_probs_kind_name(rep.probs_kind), out_path);
    return CMD_EXIT_OK;
}

int cmd_trace(int argc, char **argv) {
    if (argc < 2) /* a usage error is one line, like every other */
        return cmd_usage_error(CMD, "a subcommand is needed: import, recover or merge");
    const char *sub = argv[1];
    if (strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0) {
        cmd_options_help(&cmd_trace_spec, stdout);
        return CMD_EXIT_OK;
    }
    if (strcmp(sub, "import") == 0) return cmd_trace_import(argc - 1, argv + 1);
    if (strcmp(sub, "recover") == 0) return cmd_trace_recover(argc - 1, argv + 1);
    if (strcmp(sub, "merge") == 0) return cmd_trace_merge(argc - 1, argv + 1); /* trace_merge.c */
    if (sub[0] == '-') return cmd_usage_error(CMD, "unknown option '%s'", sub);
    return cmd_usage_error(CMD, "unknown subcommand '%s' (valid: import, recover, merge)", sub);
}
