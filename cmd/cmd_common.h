/*
 * cmd_common.h - what every `fmoe` subcommand shares: error and usage reporting with the
 * exit-code contract (0 success, 1 runtime failure, 2 usage error), number parsing for
 * options, the progress bar, and the log sink. cmd/ is the only place that prints or exits.
 */
#ifndef FMOE_CMD_COMMON_H
#define FMOE_CMD_COMMON_H

#include <stdint.h>
#include <stdio.h>

#include "fmoe/progress.h"
#include "options.h"

enum { CMD_EXIT_OK = 0, CMD_EXIT_FAILURE = 1, CMD_EXIT_USAGE = 2 };

/* Prints "fmoe <cmd>: <detail of the last fmoe error>" (or the code's message) and
 * returns CMD_EXIT_FAILURE. */
int cmd_fail(const char *cmd, int code);

/* Prints "fmoe <cmd>: <message>" and returns CMD_EXIT_FAILURE. */
int cmd_failf(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints "fmoe <cmd>: <message> (see 'fmoe <cmd> --help')" and returns CMD_EXIT_USAGE. */
int cmd_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* --chat-template NAME: one of fmoe_chat_template_names(), else a usage error (one line,
 * listing them). NULL is fine. @return 0 or CMD_EXIT_USAGE. */
int cmd_check_chat_template(const char *cmd, const char *name);

/* A usage error (exit 2) without the "see --help" hint: the arguments parse, but they name
 * the wrong file. */
int cmd_refuse(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parse an option value; on failure print a usage error naming `option` in the phrasings of
 * options.h ("value 'x' of --n is not an integer", "--n must be in [1, 8], got 9").
 * @return 0 or CMD_EXIT_USAGE. */
int cmd_parse_i64(const char *cmd, const char *option, const char *text, int64_t min,
                  int64_t max, int64_t *out);
int cmd_parse_i32(const char *cmd, const char *option, const char *text, int32_t min,
                  int32_t max, int32_t *out);
int cmd_parse_f64(const char *cmd, const char *option, const char *text, double min,
                  double max, double *out);

/* An option handler: zstd, deflate or none into the fmoe_compression at the row's offset. */
int cmd_on_compression(const char *cmd, const cmd_option *opt, void *base, const char *value);

/* A progress bar on stderr, drawn only when stderr is a terminal and not quiet. */
typedef struct cmd_progress_bar {
    const char *label;
    int enabled;
    double started;      /* monotonic seconds */
    double last_draw;
    int drawn;
} cmd_progress_bar;

void cmd_progress_bar_init(cmd_progress_bar *bar, const char *label, int quiet);
/* The fmoe_progress to hand to libraries. */
fmoe_progress cmd_progress_bar_callback(cmd_progress_bar *bar);
/* Clears the bar line (call before printing results). */
void cmd_progress_bar_done(cmd_progress_bar *bar);

/* Installs a log sink printing "fmoe: warning: ..." lines on stderr (info when verbose). */
void cmd_install_log_sink(int verbose);

/* Monotonic clock in seconds. */
double cmd_now(void);

/* The process's peak resident memory so far, bytes (VmHWM of /proc/self/status: this
 * process's own, from its exec on); 0 when it cannot be read. */
int64_t cmd_peak_rss_bytes(void);

/* Directory holding libh5zstd.so for HDF5_PLUGIN_PATH: the build tree's trace/ when fmoe
 * runs from its build directory, else the installed plugin directory. */
const char *cmd_plugin_dir(void);

/* Directory of the bundled sample data (datasets/samples): next to the source tree when run
 * from a build directory, else the installed data directory. NULL when not found. */
const char *cmd_samples_dir(void);

/* Formats n bytes as "1.23 GiB" into buf. */
const char *cmd_format_bytes(double n, char *buf, size_t cap);

/* Subcommand entry points (argv[0] is the command name), and their option tables. */
int cmd_inspect(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_simulate(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_build_store(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_record(int argc, char **argv);
int cmd_compare_logs(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_train_predictor(int argc, char **argv);
int cmd_quantize(int argc, char **argv); /* cmd/cmd_quantize.c */
extern const cmd_spec cmd_quantize_spec;
/* `fmoe inspect` of a GGUF file (cmd/inspect_gguf.c; cmd_inspect.c tells it by its magic
 * or its name). */
int cmd_inspect_gguf(const char *path, int json);
extern const cmd_spec cmd_train_predictor_spec;
extern const cmd_spec cmd_inspect_spec, cmd_trace_spec, cmd_trace_import_spec, cmd_demo_spec,
    cmd_simulate_spec, cmd_calibrate_spec, cmd_build_store_spec, cmd_tokenize_spec,
    cmd_generate_spec, cmd_record_spec, cmd_compare_logs_spec, cmd_serve_spec,
    cmd_trace_recover_spec, cmd_trace_merge_spec;
int cmd_trace_merge(int argc, char **argv); /* `fmoe trace merge` (cmd/trace_merge.c) */
/* `fmoe inspect` of an expert-map store (cmd/inspect_store.c). */
int cmd_inspect_store(const char *path, int json);

/* The "meta" object of a decision log's header (fmoe/decision_log.h): what the run was, so
 * two logs compared can be told apart. The policy name is one of the registry's. */
void cmd_decision_log_meta(char *buf, size_t cap, const char *policy, int32_t cache_experts,
                           int32_t prefetch_distance, int32_t copy_chunks);

/* --feedback auto|on|off, shared by simulate and the live commands: the choices and the
 * request they make of fmoe_policy_feedback (0, 1, -1). */
extern const char *const cmd_feedback_names[];
static inline int32_t cmd_feedback_request(int32_t choice) {
    return choice == 1 ? 1 : choice == 2 ? -1 : 0;
}

/* Prints a cJSON document (struct cJSON *) on stdout, one newline after it, and frees it.
 * @return 0, or -1 when it could not be printed (out of memory). */
int cmd_print_json(void *doc);

/* SIGINT, SIGTERM and SIGHUP: remove each of `paths` (the .partial of an output being
 * written), then die of the signal as the default action would. For commands whose output
 * is worth nothing unfinished (trace import, build-store): an interrupted run leaves no
 * .partial behind, so it can simply be run again. The strings are copied; at most 4
 * paths. Only unlink(2) runs in the handler. @return 0, or -1 when a handler cannot be installed. */
int cmd_remove_on_signal(const char *const *paths, int n);

#endif
