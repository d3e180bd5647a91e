/*
 * main.c - the one `fmoe` binary: a git-style command table (docs/design.md §1).
 * Each command is `int cmd_<name>(int argc, char **argv)` in its own file; its return
 * value is the exit status (0 success, 1 runtime failure, 2 usage error).
 */
#include <stdio.h>
#include <string.h>

#include "cmd_common.h"
#include "sweep.h" /* cmd_mpi_describe */
#include "fmoe/cuda.h"
#include "fmoe_config.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv); /* NULL: not yet available */
    const char *summary;
} command;

static int cmd_version(int argc, char **argv);
static int cmd_help(int argc, char **argv);

static const command commands[] = {
    {"record", cmd_record, "real inference over prompts -> HDF5 trace"},
    {"build-store", cmd_build_store, "traces -> deduplicated expert-map store"},
    {"train-predictor", cmd_train_predictor, "traces -> learned expert predictors (ProMoE, DuoServe-MoE)"},
    {"simulate", cmd_simulate, "trace + store + hardware profile -> metrics per policy"},
    {"compare-logs", cmd_compare_logs, "two decision logs (simulated, live) -> first divergence, totals"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server, continuous batching, the policies live"},
    {"calibrate", cmd_calibrate, "measure this machine's link and compute into a hardware profile"},
    {"generate", cmd_generate, "one prompt through a model, no server"},
    {"tokenize", cmd_tokenize, "text -> token ids (and back) with a tokenizer.json"},
    {"trace", cmd_trace, "work with traces: import routing logs, recover a killed recording, merge shards"},
    {"quantize", cmd_quantize, "HF checkpoint -> GGUF file with quantized weights (q8_0, q4_k, ...)"},
    {"inspect", cmd_inspect, "summarise a trace, expert-map store, predictor or GGUF file"},
    {"demo", cmd_demo, "run the pipeline on the bundled sample data"},
    {"version", cmd_version, "print version and build information"},
    {"help", cmd_help, "show help for fmoe or for a command"},
};
#define NUM_COMMANDS (sizeof commands / sizeof commands[0])

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: fmoe <command> [options]\n"
            "\n"
            "Fine-grained expert offloading for Mixture-of-Experts LLM serving.\n"
            "\n"
            "commands:\n");
    for (size_t i = 0; i < NUM_COMMANDS; i++) {
        const command *c = &commands[i];
        fprintf(out, "  %-15s %s%s\n", c->name, c->summary,
                c->run ? "" : " (not yet available)");
    }
    fprintf(out,
            "\n"
            "options:\n"
            "  -h, --help     show this help\n"
            "  --version      print version and build information\n"
            "\n"
            "Run 'fmoe <command> --help' for a command's options.\n");
}

static const command *find_command(const char *name) {
    for (size_t i = 0; i < NUM_COMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

static const cmd_option no_options[] = {{0}};

static const cmd_spec version_spec = {
    .name = "version",
    .usage = "version",
    .description = "Print the version, the CUDA build and the HDF5 zstd plugin folder.\n",
    .options = no_options,
};

static int cmd_version(int argc, char **argv) {
    int rc = cmd_options_parse(&version_spec, NULL, argc, argv, NULL);
    if (rc) return rc == CMD_OPTIONS_HELP ? CMD_EXIT_OK : rc;
    printf("fmoe %s\n", FMOE_VERSION);
    printf("cuda: %s\n", fmoe_cuda_describe());
    printf("mpi: %s\n", cmd_mpi_describe());
    printf("hdf5 zstd plugin: %s\n", cmd_plugin_dir());
    return CMD_EXIT_OK;
}

static const cmd_spec help_spec = {
    .name = "help",
    .usage = "help [COMMAND]",
    .description = "Show help for fmoe, or the --help of COMMAND.\n",
    .options = no_options,
    .max_positional = 1,
};

static int cmd_help(int argc, char **argv) {
    int npos = 0;
    int rc = cmd_options_parse(&help_spec, NULL, argc, argv, &npos);
    if (rc) return rc == CMD_OPTIONS_HELP ? CMD_EXIT_OK : rc;
    if (npos == 0) {
        print_usage(stdout);
        return CMD_EXIT_OK;
    }
    const command *c = find_command(argv[1]);
    if (!c) {
        fprintf(stderr, "fmoe help: unknown command '%s' (see 'fmoe --help')\n", argv[1]);
        return CMD_EXIT_USAGE;
    }
    if (!c->run) {
        printf("fmoe %s: %s (not yet available)\n", c->name, c->summary);
        return CMD_EXIT_OK;
    }
    char *help_argv[] = {(char *)c->name, "--help", NULL};
    return c->run(2, help_argv);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_usage(stderr);
        return CMD_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0) name = "help";
    if (strcmp(name, "--version") == 0) name = "version";
    const command *c = find_command(name);
    if (!c) {
        fprintf(stderr, "fmoe: unknown command '%s' (see 'fmoe --help')\n", name);
        return CMD_EXIT_USAGE;
    }
    if (!c->run) {
        fprintf(stderr, "fmoe %s: not yet available in fmoe %s (%s)\n", c->name, FMOE_VERSION,
                c->summary);
        return CMD_EXIT_FAILURE;
    }
    cmd_install_log_sink(0);
    return c->run(argc - 1, argv + 1);
}
