/*
 * options.h - one option table per command drives parsing, usage errors and `--help`
 * (git's parse-options is the model). A command describes itself once:
 *
 *     typedef struct demo_opts { const char *output_dir; int json; } demo_opts;
 *     static const cmd_option demo_options[] = {
 *         {.name = "output-dir", .kind = CMD_OPT_STRING, .value_name = "DIR",
 *          .help = "where to write demo files", .offset = offsetof(demo_opts, output_dir)},
 *         {.name = "json", .kind = CMD_OPT_FLAG, .help = "print the summary as JSON",
 *          .offset = offsetof(demo_opts, json)},
 *         {0},
 *     };
 *     const cmd_spec cmd_demo_spec = {.name = "demo", .options = demo_options, ...};
 *
 * and parses with cmd_options_parse(&cmd_demo_spec, &opts, argc, argv, &npos). Targets are
 * offsets into the command's options struct, so tables are static, shared with the tests
 * (tests/cmd), and the same table yields the help text: an option cannot be parsed without
 * being documented, or documented without being parsed.
 *
 * Accepted forms: --name VALUE, --name=VALUE, an unambiguous prefix of a long name, -x VALUE,
 * -xVALUE, and '--' to end options. -h and --help are built in. Options and positional
 * arguments may interleave. Usage errors have one phrasing each and exit status 2:
 *
 *     fmoe CMD: unknown option '--x' (see 'fmoe CMD --help')
 *     fmoe CMD: option '--x' needs a value (see ...)
 *     fmoe CMD: option '--x' takes no value (see ...)
 *     fmoe CMD: value 'abc' of --x is not an integer (see ...)      (or "not a number")
 *     fmoe CMD: --x must be in [MIN, MAX], got V (see ...)
 *     fmoe CMD: --x must be a, b or c, got 'v' (see ...)
 *     fmoe CMD: unexpected argument 'y' (see ...)
 */
#ifndef FMOE_CMD_OPTIONS_H
#define FMOE_CMD_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* What a row parses into (the field at .offset of the options struct). */
typedef enum cmd_opt_kind {
    CMD_OPT_FLAG,     /* no value: int = 1 */
    CMD_OPT_STRING,   /* const char *: the argv string itself (not copied) */
    CMD_OPT_STRINGS,  /* cmd_opt_strings: repeatable, each use appends */
    CMD_OPT_INT32,    /* int32_t in [.min, .max] */
    CMD_OPT_INT64,    /* int64_t in [.min, .max] */
    CMD_OPT_DOUBLE,   /* double in [.fmin, .fmax] */
    CMD_OPT_ENUM,     /* int32_t: .choice_values[i] (or i) for the value .choices[i] */
    CMD_OPT_CALLBACK, /* .handler(cmd, opt, base, value); a value when .value_name is set */
} cmd_opt_kind;

/* The target of CMD_OPT_STRINGS: the values in the order given (more is a usage error). */
#define CMD_OPT_STRINGS_MAX 256
typedef struct cmd_opt_strings {
    const char *items[CMD_OPT_STRINGS_MAX];
    int32_t n;
} cmd_opt_strings;

/* What a row's value names on disk. Every CMD_OPT_STRING and CMD_OPT_STRINGS row says
 * (tests/cmd/test_outputs.c refuses a row that does not), because the parse checks, in one
 * place (cmd/outputs.h), every output against every input before any work: an output that
 * is an input (the same file, or a file in an input directory) is a usage error. */
typedef enum cmd_opt_io {
    CMD_IO_UNSET = 0,  /* only for rows whose value is not a string */
    CMD_IO_TEXT,       /* not a path: a name, a prompt, an address */
    CMD_IO_INPUT,      /* a file or directory read (a directory: every file directly in it) */
    CMD_IO_MODEL,      /* an input; absent, the bundled model (cmd_bundled_model_dir) */
    CMD_IO_OUTPUT,     /* a file written ("-": standard output) */
    CMD_IO_OUTPUT_OF_PARTIAL, /* an output made from the input OUTPUT.partial (trace
                                 recover): checked as CMD_IO_OUTPUT, but that input is
                                 its source, not a partial it would replace */
    CMD_IO_OUTPUT_DIR, /* a directory the command creates files of its own names in */
} cmd_opt_io;

struct cmd_option;

/* A handler parses `value` (NULL for an option without a value) into the options struct at
 * `base`. It reports its own usage errors with cmd_options_error() or cmd_usage_error() and
 * returns their exit status (2), or 0. */
typedef int (*cmd_opt_handler)(const char *cmd, const struct cmd_option *opt, void *base,
                               const char *value);

typedef struct cmd_option {
    const char *name;         /* long name without "--"; NULL ends the table */
    char short_name;          /* -x, or 0 */
    cmd_opt_kind kind;
    const char *value_name;   /* "N", "FILE": the value shown in help; NULL: no value */
    const char *help;         /* one sentence, wrapped by the help printer */
    const char *default_text; /* shown as "(default X)"; NULL: none shown */
    size_t offset;            /* of the target field in the options struct */
    int64_t min, max;         /* CMD_OPT_INT32, CMD_OPT_INT64 */
    double fmin, fmax;        /* CMD_OPT_DOUBLE */
    const char *const *choices;  /* CMD_OPT_ENUM: NULL-terminated names */
    const int32_t *choice_values; /* CMD_OPT_ENUM: the value of each name; NULL: its index */
    cmd_opt_handler handler;  /* CMD_OPT_CALLBACK */
    ptrdiff_t seen_offset;    /* > 0: an int field set to 1 when the option is given */
    const char *example;      /* a valid value for tests (callbacks need one) */
    cmd_opt_io io;            /* CMD_OPT_STRING(S): what the value names on disk */
} cmd_option;

/* One command: what --help prints, in order, and the table. */
typedef struct cmd_spec {
    const char *name;        /* "simulate", "trace import" */
    const char *usage;       /* after "usage: fmoe "; '\n' separates alternative lines */
    const char *description; /* printed verbatim after the usage lines, then a blank line */
    const cmd_option *options;
    void (*help_extra)(FILE *out); /* printed after the options (dynamic lists) */
    const char *epilog;      /* printed last, verbatim */
    int max_positional;      /* positional arguments allowed: 0, a count, or -1: any */
    size_t size;             /* sizeof the options struct (tests allocate it) */
    void (*init)(void *base); /* the defaults; NULL: all zero */
} cmd_spec;

enum { CMD_OPTIONS_HELP = -1 };

/* Parses argv[1..argc) (argv[0] is the command name) into the options struct at `base`,
 * which the caller initialised with the defaults. Positional arguments are moved, in order,
 * to argv[1..*npos] (npos may be NULL when spec->max_positional is 0). Then every output
 * is checked against every input (cmd_check_outputs in cmd/outputs.h: the rows' .io, the
 * positional arguments being inputs), so that no command writes over a file it reads.
 * @return 0; CMD_OPTIONS_HELP after printing --help on stdout; or CMD_EXIT_USAGE (2) after
 *         printing one usage error line on stderr (or 1 from cmd_check_outputs: an
 *         output's folder is missing or not writable). */
int cmd_options_parse(const cmd_spec *spec, void *base, int argc, char **argv, int *npos);

/* Prints the --help text generated from the table. */
void cmd_options_help(const cmd_spec *spec, FILE *out);

/* Pointer to a row's target field. */
static inline void *cmd_opt_target(const cmd_option *opt, void *base) {
    return (char *)base + opt->offset;
}

#endif
