/*
 * offload_cli.h - the options of an offloaded live run (fmoe/offload.h), shared by
 * `generate` and `record` (and later `serve`): rows for a command's option table and the
 * open/close of everything they name (the store, the decision log, the executor).
 *
 *     typedef struct my_opts { ...; cmd_offload_args off; } my_opts;
 *     static const cmd_option rows[] = { ..., CMD_OFFLOAD_OPTIONS(my_opts, off), {0} };
 *     cmd_offload_args_init(&o.off);               // in the command's init
 *     o.off.backend = so.backend;                  // the session's (backend_cli.h)
 *     cmd_offload run;
 *     if ((rc = cmd_offload_open(CMD, &o.off, model, quiet, &run))) return rc;
 *     if (run.x) fmoe_offload_attach(run.x, &so);   // NULL: all experts resident
 *     ...
 *     cmd_offload_close(&run, ok);
 *
 * Offloading is on when --cache-experts or --cache-gb is given; without them nothing
 * changes. The meaning of each option is simulate's.
 */
#ifndef FMOE_CMD_OFFLOAD_CLI_H
#define FMOE_CMD_OFFLOAD_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "options.h"
#include "fmoe/decision_log.h"
#include "fmoe/model.h"
#include "fmoe/offload.h"
#include "fmoe/store.h"

typedef struct cmd_offload_args {
    const char *policy;
    int32_t cache_experts;     /* 0: not given */
    double cache_gb;           /* 0: not given */
    double memory_gb;          /* 0: not given; else the weights' budget: resident non-expert
                                  weights plus the expert slots (cmd_offload_open sizes N) */
    int32_t prefetch_distance; /* 0: the policy's */
    int32_t copy_chunks;
    int32_t tier;              /* fmoe_tier_kind */
    int32_t direct_io;
    int32_t read_depth;        /* 0: not given (the tier's default) */
    int32_t miss;              /* fmoe_offload_miss */
    const char *store;
    int32_t store_mode;        /* --store-mode: fmoe_store_mode (store_mode=M) */
    int store_mode_given;
    cmd_opt_strings policy_opts; /* --policy-opt KEY=VALUE, repeatable */
    const char *store_out;
    const char *predictor;     /* --predictor: a learned predictor (promoe, duoserve) */
    int32_t feedback;          /* cmd_feedback_names index */
    const char *decision_log;
    int32_t sync_transfers;
    int32_t sync_predictions;
    const char *profile;       /* hardware profile JSON for --miss auto */
    fmoe_backend_kind backend; /* where the expert slots live: the session's backend (not an
                                  option: the command sets it from its --backend) */
    int32_t probs_f32;         /* the policy sees float32 gate probabilities, as a trace
                                  recorded with --probs-f32 stores them; else float16 (not an
                                  option: record and serve set it from their --probs-f32) */
} cmd_offload_args;

extern const char *const cmd_offload_tiers[];
extern const char *const cmd_offload_misses[];
extern const char *const cmd_offload_store_modes[];

#define CMD_OFFLOAD_OPTIONS(type, f)                                                          \
    {.name = "policy", .kind = CMD_OPT_STRING, .value_name = "P",                             \
     .io = CMD_IO_TEXT,                                                                       \
     .help = "expert-cache policy of an offloaded run (fmoe simulate --help lists them; "     \
             "belady and oracle need the future: simulate only)",                           \
     .default_text = "lru", .offset = offsetof(type, f.policy)},                              \
    {.name = "cache-experts", .kind = CMD_OPT_INT32, .value_name = "N",                       \
     .help = "offload: N routed experts in the fast tier, the rest loaded on demand "          \
             "(more than the model has is clamped)",                                          \
     .default_text = "all resident", .offset = offsetof(type, f.cache_experts), .min = 1,     \
     .max = INT32_MAX},                                                                       \
    {.name = "cache-gb", .kind = CMD_OPT_DOUBLE, .value_name = "X",                           \
     .help = "offload: a fast tier of X GiB instead (slots = X GiB / expert)",                \
     .offset = offsetof(type, f.cache_gb), .fmin = 1e-9, .fmax = 1e9},                        \
    {.name = "memory-gb", .kind = CMD_OPT_DOUBLE, .value_name = "X",                          \
     .help = "offload: the weights get X GiB in all: the non-expert weights resident, the "   \
             "rest expert slots (KV cache and buffers come on top)",                          \
     .offset = offsetof(type, f.memory_gb), .fmin = 1e-9, .fmax = 1e9},                       \
    {.name = "prefetch-distance", .kind = CMD_OPT_INT32, .value_name = "D",                   \
     .help = "layers ahead the policy prefetches", .default_text = "the policy's",            \
     .offset = offsetof(type, f.prefetch_distance), .min = 0, .max = 4096},                   \
    {.name = "copy-chunks", .kind = CMD_OPT_INT32, .value_name = "C",                         \
     .help = "pieces per expert transfer: a demand load waits only for the piece in flight",  \
     .default_text = "4", .offset = offsetof(type, f.copy_chunks), .min = 1, .max = 1024},    \
    {.name = "tier", .kind = CMD_OPT_ENUM, .value_name = "auto|host|file",                    \
     .help = "where the experts live: copied into RAM, or read from the model files "         \
             "(auto: host when they fit in half the free RAM)",                              \
     .default_text = "auto", .offset = offsetof(type, f.tier), .choices = cmd_offload_tiers}, \
    {.name = "direct-io", .kind = CMD_OPT_FLAG,                                               \
     .help = "file tier: read with O_DIRECT (no page cache: a model larger than RAM, and "    \
             "the device's own timings)",                                                     \
     .offset = offsetof(type, f.direct_io)},                                                  \
    {.name = "read-depth", .kind = CMD_OPT_INT32, .value_name = "N",                          \
     .help = "file tier: requests in flight per read, each read split into segments of at "   \
             "least 256 KiB (1: one at a time)",                                             \
     .default_text = "4", .offset = offsetof(type, f.read_depth), .min = 1, .max = 64},       \
    {.name = "miss", .kind = CMD_OPT_ENUM, .value_name = "load|cpu|auto",                     \
     .help = "a miss is loaded into the cache, or computed from the slow tier uncached "      \
             "(llama.cpp --n-cpu-moe style), or per miss whichever --profile estimates "      \
             "ends first (Fiddler)",                                                          \
     .default_text = "load", .offset = offsetof(type, f.miss), .choices = cmd_offload_misses},\
    {.name = "profile", .kind = CMD_OPT_STRING, .value_name = "P.json",                       \
     .io = CMD_IO_INPUT,                                                                      \
     .help = "--miss auto: the hardware profile (fmoe calibrate) whose link and expert "      \
             "compute figures estimate each miss's two ends",                                 \
     .offset = offsetof(type, f.profile)},                                                    \
    {.name = "store", .kind = CMD_OPT_STRING, .value_name = "S.h5",                           \
     .io = CMD_IO_INPUT,                                                                      \
     .help = "expert-map store for the fmoe policies (fmoe build-store)",                     \
     .offset = offsetof(type, f.store)},                                                      \
    {.name = "store-mode", .kind = CMD_OPT_ENUM, .value_name = "M",                           \
     .help = "offline (frozen store) or offline-update (--policy-opt store_mode=M)",          \
     .default_text = "offline", .offset = offsetof(type, f.store_mode),                       \
     .choices = cmd_offload_store_modes, .seen_offset = offsetof(type, f.store_mode_given)},  \
    {.name = "policy-opt", .kind = CMD_OPT_STRINGS, .value_name = "KEY=VALUE",                \
     .io = CMD_IO_TEXT,                                                                       \
     .help = "a setting of the policy (fmoe simulate --list-policies lists each policy's); "  \
             "repeatable; a KEY the policy does not declare is refused",                     \
     .offset = offsetof(type, f.policy_opts)},                                                \
    {.name = "predictor", .kind = CMD_OPT_STRING, .value_name = "P.h5",                       \
     .io = CMD_IO_INPUT,                                                                      \
     .help = "learned predictor for policy promoe or duoserve (fmoe train-predictor --kind " \
             "promoe|duoserve), trained on traces of this model",                             \
     .offset = offsetof(type, f.predictor)},                                                  \
    {.name = "feedback", .kind = CMD_OPT_ENUM, .value_name = "auto|on|off",                   \
     .help = "feedback-directed prefetching, as simulate's --feedback",                      \
     .default_text = "auto", .offset = offsetof(type, f.feedback),                            \
     .choices = cmd_feedback_names},                                                          \
    {.name = "store-out", .kind = CMD_OPT_STRING, .value_name = "S.h5",                       \
     .io = CMD_IO_OUTPUT,                                                                     \
     .help = "with --store-mode offline-update: write the store as the run updated it, "     \
             "atomically, at the end",                                                        \
     .offset = offsetof(type, f.store_out)},                                                  \
    {.name = "decision-log", .kind = CMD_OPT_STRING, .value_name = "F.jsonl",                 \
     .io = CMD_IO_OUTPUT,                                                                     \
     .help = "write every decision of the offloaded run, one JSON line each (fmoe "           \
             "compare-logs checks it against fmoe simulate --decision-log)",                 \
     .offset = offsetof(type, f.decision_log)},                                               \
    {.name = "sync-transfers", .kind = CMD_OPT_FLAG,                                          \
     .help = "wait for every transfer where completions become visible, so decisions do "     \
             "not depend on the link's speed (for decision-log comparisons; slower)",         \
     .offset = offsetof(type, f.sync_transfers)},                                             \
    {.name = "sync-predictions", .kind = CMD_OPT_FLAG,                                        \
     .help = "run fmoe's matcher and promoe's predictor inline at each gate, as simulate "    \
             "does, instead of on their thread beside inference, so decisions do not "        \
             "depend on their speed (for decision-log comparisons)",                          \
     .offset = offsetof(type, f.sync_predictions)}

typedef struct cmd_offload {
    fmoe_offload *x;           /* NULL: offloading off */
    const char *store_out;
    fmoe_store_file *store;
    struct fmoe_predictor *predictor; /* --predictor, read for the executor (borrowed by it) */
    fmoe_decision_log *log;
    const char *policy;        /* the policy's name (for the lines the commands print) */
    int sync_transfers;        /* --sync-transfers: the copies are not timed */
} cmd_offload;

void cmd_offload_args_init(cmd_offload_args *a);

/* The checks of the options that need no model (usage errors, printed): @return 0 or 2.
 * cmd_offload_open makes them first; serve makes them before it listens. */
int cmd_offload_check_args(const char *cmd, const cmd_offload_args *a);

/* Validates the options, loads the store and the predictor (for this model), opens the
 * decision log and starts the executor with its slots on a->backend; a clamped capacity is
 * said once on stderr unless quiet. @return 0, 1 (failure, printed) or 2 (usage, printed). */
int cmd_offload_open(const char *cmd, const cmd_offload_args *a, fmoe_model *m,
                     int32_t prefill_chunk, int quiet, cmd_offload *out);

/* Writes the updated store (--store-out) when ok, stops the executor; the decision log is
 * kept only when ok. @return 0 or 1 (printed). */
int cmd_offload_close(const char *cmd, cmd_offload *o, int ok);

/* fmoe_offload_forward when offloading, else fmoe_session_forward. */
int cmd_offload_forward(cmd_offload *o, fmoe_session *s, const int32_t *tokens, int32_t n,
                        int32_t phase, const fmoe_forward_trace *trace, float *logits);

/* One line of offload figures for a summary ("offload 12 slots: 83.1% hits, ...", ending
 * in the link the copy engine measured, or why it measured none). */
void cmd_offload_summary(const cmd_offload *o, char *buf, size_t cap);
/* The offload as configured, for a line printed before anything ran ("offload 12 slots,
 * policy lru"; "every expert resident"). */
void cmd_offload_describe(const cmd_offload *o, char *buf, size_t cap);

#endif
