/*
 * cmd_record.c - `fmoe record`: real inference over a prompt dataset -> trace (docs/design.md §4).
 *
 * Defaults → parse → validate → choose the backend (--backend cpu|cuda|auto; the
 * trace's recorded_on says it: "cpu" or "cuda:<device>") → load (prompts, arrivals,
 * model, tokenizer) → session → open the trace writer (on TRACE.h5.partial) → per
 * request: encode, prefill, decode token by token with the routing tracer on, append
 * the request (the writer journals and flushes it, so a killed recorder loses no
 * finished request) → close (rename into place) → the backend and the summary on stderr
 * unless --quiet (after the run: a failure stays one line).
 *
 * What one request records, T = prompt + output tokens, one row per token that ran through
 * the model: the prompt tokens (phase prefill, one forward pass), then each generated token
 * fed back (phase decode, one forward pass each). The last generated token is fed too
 * (its lm head is skipped), so every output token has its routing; a stop token (EOS)
 * ends the request and is not fed. Per row and MoE layer: the chosen experts, the full
 * gate distribution (float16 unless --probs-f32), the semantic embedding (the embedding
 * layer's output), the speculative gates of layers l+1..l+S applied to layer l's gate
 * input (--speculative S), the gate inputs themselves (--hidden, float16), and per
 * iteration the measured wall seconds of each decoder layer and of the whole pass
 * (/timing).
 *
 * Prompts that do not fit the context with room for one generated token are skipped and
 * counted (a summary line says how many). Each request's sampler is seeded with
 * seed + dataset index, so a request's tokens do not depend on which others ran.
 *
 * Under mpirun/srun (a build with MPI; docs/scaling-out.md) rank r of R records every R-th
 * request into its own shard OUT.rank-r.h5 (TRACE.h5 -> TRACE.rank-r.h5), each as
 * kill-safe as a whole recording. Every rank tokenizes every prompt, so all agree on which
 * prompts are recorded: the q-th recordable prompt (the q-th request of a single process)
 * goes to rank q mod R, with the arrival time a single process gives it, and
 * `fmoe trace merge` joins the shards into the single process's trace. With a GPU backend
 * rank r uses device r mod count (of its node: CUDA_VISIBLE_DEVICES is narrowed before the
 * backend loads).
 *
 * Stopping early. The writer journals every request before its append returns, so a kill
 * at any instant (SIGKILL too) loses nothing finished: `fmoe trace recover TRACE.h5.partial`
 * rebuilds the trace. SIGINT, SIGTERM and SIGHUP stop the run at the next token, leave
 * the .partial (closed, whole) and its journal for recover, and exit 128 + the signal.
 * A failed trace write (a full disk) removes everything: one line, exit 1, nothing left,
 * an earlier complete TRACE.h5 untouched. Any other error after some requests keeps them
 * as after SIGINT.
 */
#include <stddef.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cli.h"
#include "cmd_common.h"
#include "sweep.h" /* the MPI world */
#include "fmoe/datasets.h"
#include "fmoe/error.h"
#include "fmoe/geometry.h"
#include "fmoe/model.h"
#include "fmoe/sampler.h"
#include "fmoe/tokenizer.h"
#include "fmoe/trace.h"
#include "offload_cli.h"
#include "paths.h"
#include "trace_header.h"

static const char *const CMD = "record";

typedef struct record_args {
    const char *model, *tokenizer, *dataset, *output, *arrivals, *chat_template, *model_name;
    const char *backend;
    fmoe_prompt_format format;
    fmoe_compression compression;
    int64_t max_requests, seed;
    int32_t max_new_tokens, speculative, threads, top_k, max_context;
    int32_t activations; /* fmoe_activations */
    double temperature, top_p;
    int hidden, chat, ignore_eos, quiet, probs_f32, no_timing, log_requests;
    cmd_offload_args off;
} record_args;

static int on_dataset_format(const char *cmd, const cmd_option *opt, void *base,
                             const char *value) {
    (void)opt;
    record_args *a = base;
    if (fmoe_prompt_format_parse(value, &a->format) < 0)
        return cmd_usage_error(cmd, "--dataset-format must be auto, sharegpt, lmsys, jsonl or "
                                    "text, got '%s'",
                               value);
    return 0;
}

/* The token ids of one prompt as the run feeds them: wrapped in the chat template with
 * --chat (*chat_text then holds the wrapped text), else with the tokenizer's BOS. */
static int encode_prompt(const record_args *a, const fmoe_tokenizer *tok, const char *prompt,
                         char **chat_text, int32_t **ids, size_t *n) {
    const char *text = prompt;
    size_t len = strlen(text);
    free(*chat_text);
    *chat_text = NULL;
    if (a->chat) {
        fmoe_chat_message msg = {.role = "user", .content = prompt};
        fmoe_chat_options co = {.template_name = a->chat_template, .add_generation_prompt = 1};
        const int err = fmoe_tokenizer_apply_chat_template(tok, &msg, 1, &co, chat_text, &len);
        if (err < 0) return err;
        text = *chat_text;
    }
    free(*ids);
    *ids = NULL;
    *n = 0;
    return fmoe_tokenizer_encode_alloc(tok, text, len, !a->chat, ids, n);
}

/* The KV positions the run needs: the longest of the requests it will record (prompt +
 * --max-new-tokens), at most `cap`, the model's. Sizing the cache to the model's maximum
 * instead asked a GPU for 8 GiB of f32 KV on Mixtral-8x7B (32k positions) whatever the
 * prompts. The same walk as the recording loop: empty prompts and prompts with no room
 * for one token under `cap` are not counted. */
static int longest_request(const record_args *a, const fmoe_tokenizer *tok,
                           const fmoe_prompt_set *prompts, int64_t wanted, int64_t cap,
                           int64_t *longest) {
    char *chat_text = NULL;
    int32_t *ids = NULL;
    int err = 0;
    *longest = 1;
    for (int64_t p = 0, q = 0; p < prompts->count && q < wanted; p++) {
        size_t n = 0;
        if ((err = encode_prompt(a, tok, prompts->prompts[p], &chat_text, &ids, &n)) < 0) break;
        if (n == 0 || (int64_t)n + 1 > cap) continue;
        q++;
        const int64_t need = (int64_t)n + (a->max_new_tokens > 0 ? a->max_new_tokens : 1);
        if (need > *longest) *longest = need < cap ? need : cap;
    }
    free(chat_text);
    free(ids);
    return err;
}

static const cmd_option record_options[] = {
    {.name = "model", .kind = CMD_OPT_STRING, .io = CMD_IO_MODEL, .value_name = "PATH",
     .help = "model directory (HuggingFace checkpoint) or GGUF file",
     .default_text = "the bundled fmoe-tiny", .offset = offsetof(record_args, model)},
    {.name = "tokenizer", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "DIR",
     .help = "folder with tokenizer.json and generation_config.json (needed with a GGUF "
             "--model)",
     .default_text = "the model directory", .offset = offsetof(record_args, tokenizer)},
    {.name = "dataset", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "FILE",
     .help = "prompts (required)", .offset = offsetof(record_args, dataset)},
    {.name = "dataset-format", .kind = CMD_OPT_CALLBACK, .value_name = "F",
     .help = "auto, sharegpt, lmsys, jsonl or text", .default_text = "auto",
     .handler = on_dataset_format, .example = "jsonl"},
    {.name = "output", .short_name = 'o', .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT,
     .value_name = "TRACE.h5",
     .help = "the trace to write (required)", .offset = offsetof(record_args, output)},
    {.name = "max-requests", .kind = CMD_OPT_INT64, .value_name = "N",
     .help = "record at most N requests", .default_text = "all prompts",
     .offset = offsetof(record_args, max_requests), .min = 1, .max = INT64_MAX},
    {.name = "max-new-tokens", .kind = CMD_OPT_INT32, .value_name = "M",
     .help = "tokens generated per request at most", .default_text = "64",
     .offset = offsetof(record_args, max_new_tokens), .min = 0, .max = 1 << 24},
    {.name = "max-context", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "KV cache positions: a prompt that leaves no room for one token is skipped, "
             "generation stops when the cache is full",
     .default_text = "the longest request: its prompt + --max-new-tokens, at most the model's",
     .offset = offsetof(record_args, max_context), .min = 2, .max = 1 << 20},
    {.name = "arrivals", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "FILE",
     .help = "Azure LLM inference CSV: request r arrives at row r's time",
     .default_text = "all arrive at 0", .offset = offsetof(record_args, arrivals)},
    {.name = "speculative", .kind = CMD_OPT_INT32, .value_name = "S",
     .help = "also record the gates of layers l+1..l+S applied to layer l's gate input",
     .default_text = "0", .offset = offsetof(record_args, speculative), .min = 0, .max = 1024},
    {.name = "hidden", .kind = CMD_OPT_FLAG,
     .help = "also record the gate inputs, float16 [T][L][h]",
     .offset = offsetof(record_args, hidden)},
    {.name = "chat", .kind = CMD_OPT_FLAG, .help = "wrap each prompt in the model's chat template",
     .offset = offsetof(record_args, chat)},
    {.name = "chat-template", .kind = CMD_OPT_STRING, .io = CMD_IO_TEXT, .value_name = "NAME",
     .help = "with --chat: a fixed renderer (mixtral, chatml, qwen3, olmoe) instead of the "
             "model's template as written, or jinja: that template, never a fallback",
     .offset = offsetof(record_args, chat_template)},
    {.name = "temperature", .kind = CMD_OPT_DOUBLE, .value_name = "T", .help = "0 = greedy",
     .default_text = "0", .offset = offsetof(record_args, temperature), .fmin = 0.0,
     .fmax = 100.0},
    {.name = "top-p", .kind = CMD_OPT_DOUBLE, .value_name = "P",
     .help = "nucleus sampling filter", .default_text = "1 = off",
     .offset = offsetof(record_args, top_p), .fmin = 1e-6, .fmax = 1.0},
    {.name = "top-k", .kind = CMD_OPT_INT32, .value_name = "K",
     .help = "keep the K most likely tokens", .default_text = "0 = off",
     .offset = offsetof(record_args, top_k), .min = 0, .max = INT32_MAX},
    {.name = "seed", .kind = CMD_OPT_INT64, .value_name = "S",
     .help = "request r samples with seed S + r", .default_text = "0",
     .offset = offsetof(record_args, seed), .min = 0, .max = INT64_MAX / 2},
    {.name = "ignore-eos", .kind = CMD_OPT_FLAG,
     .help = "generate M tokens whatever the model says",
     .offset = offsetof(record_args, ignore_eos)},
    CMD_BACKEND_OPTION(record_args, backend),
    CMD_ACTIVATIONS_OPTION(record_args, activations),
    {.name = "threads", .kind = CMD_OPT_INT32, .value_name = "N", .help = "CPU threads",
     .default_text = "all cores", .offset = offsetof(record_args, threads), .min = 0,
     .max = 4096},
    {.name = "compression", .kind = CMD_OPT_CALLBACK, .value_name = "C",
     .help = "zstd, deflate or none", .default_text = "zstd",
     .offset = offsetof(record_args, compression), .handler = cmd_on_compression,
     .example = "deflate"},
    {.name = "probs-f32", .kind = CMD_OPT_FLAG,
     .help = "store gate probabilities as float32 (default float16)",
     .offset = offsetof(record_args, probs_f32)},
    {.name = "no-timing", .kind = CMD_OPT_FLAG, .help = "leave out /timing",
     .offset = offsetof(record_args, no_timing)},
    {.name = "model-name", .kind = CMD_OPT_STRING, .io = CMD_IO_TEXT, .value_name = "NAME",
     .help = "the trace's model_name", .default_text = "the directory name",
     .offset = offsetof(record_args, model_name)},
    {.name = "quiet", .short_name = 'q', .kind = CMD_OPT_FLAG,
     .help = "no progress bar or summary", .offset = offsetof(record_args, quiet)},
    {.name = "log-requests", .kind = CMD_OPT_FLAG,
     .help = "one line on stderr per request once it is safely in the trace (for logs; "
             "a kill after it loses nothing)",
     .offset = offsetof(record_args, log_requests)},
    CMD_OFFLOAD_OPTIONS(record_args, off),
    {0},
};

static void init(void *base) {
    *(record_args *)base =
        (record_args){.max_new_tokens = 64, .top_p = 1.0, .compression = FMOE_COMPRESSION_ZSTD,
                      .activations = FMOE_ACTIVATIONS_AUTO};
    cmd_offload_args_init(&((record_args *)base)->off);
}

const cmd_spec cmd_record_spec = {
    .name = "record",
    .usage = "record [--model DIR|FILE.gguf [--tokenizer DIR]] --dataset FILE -o TRACE.h5 [options]",
    .description =
        "Run real inference over the prompts of a dataset and write the routing trace\n"
        "(docs/formats/trace.md): per token and MoE layer the chosen experts and the full\n"
        "gate distribution, the semantic embedding, optional speculative gates and gate\n"
        "inputs, and the measured per-layer compute times. The file is written as\n"
        "TRACE.h5.partial and flushed after every request; it is renamed when complete.\n"
        "Every finished request is also journalled (TRACE.h5.partial.journal), so after a\n"
        "kill or SIGINT 'fmoe trace recover TRACE.h5.partial' makes the trace of them.\n",
    .options = record_options,
    .size = sizeof(record_args),
    .init = init,
};

static int parse_args(int argc, char **argv, record_args *a) {
    int rc = cmd_options_parse(&cmd_record_spec, a, argc, argv, NULL);
    if (rc) return rc;
    if (!a->dataset) return cmd_usage_error(CMD, "--dataset FILE is required");
    if (!a->output) return cmd_usage_error(CMD, "-o TRACE.h5 is required");
    if (a->chat_template && !a->chat) return cmd_usage_error(CMD, "--chat-template needs --chat");
    return cmd_check_chat_template(CMD, a->chat_template);
}

/* ---------------------------------------------------------------------------------------
 * Per-request buffers, grown to the largest request (T rows) seen so far.
 * ------------------------------------------------------------------------------------- */

typedef struct request_buffers {
    int64_t cap;         /* rows */
    int32_t *token_id;   /* [T] */
    uint8_t *phase;      /* [T] */
    uint16_t *experts;   /* [T][L][K] */
    float *probs;        /* [T][L][J] */
    float *semantic;     /* [T][h] */
    float *speculative;  /* [T][L][S][J] or NULL */
    float *hidden;       /* [T][L][h] or NULL */
    float *layer_s;      /* [I][Lh] (I <= T + 1) or NULL */
    float *iteration_s;  /* [I] or NULL */
    double *layer_acc;   /* [Lh] the forward pass adds to it */
    uint8_t *outcomes;   /* [A] measured access outcomes of an offloaded run (A <= T·L·K) */
    int64_t n_outcomes;
} request_buffers;

typedef struct dims {
    int64_t L, J, K, h, S, Lh;
    int hidden, timing;
} dims;

static int grow(void **p, int64_t n, size_t elem) {
    void *q = realloc(*p, (size_t)(n > 0 ? n : 1) * elem);
    if (!q) return -1;
    *p = q;
    return 0;
}

static int buffers_reserve(request_buffers *b, const dims *d, int64_t T) {
    if (T <= b->cap) return 0;
    int bad = 0;
    bad |= grow((void **)&b->token_id, T, sizeof(int32_t));
    bad |= grow((void **)&b->phase, T, 1);
    bad |= grow((void **)&b->experts, T * d->L * d->K, sizeof(uint16_t));
    bad |= grow((void **)&b->probs, T * d->L * d->J, sizeof(float));
    bad |= grow((void **)&b->semantic, T * d->h, sizeof(float));
    if (d->S) bad |= grow((void **)&b->speculative, T * d->L * d->S * d->J, sizeof(float));
    if (d->hidden) bad |= grow((void **)&b->hidden, T * d->L * d->h, sizeof(float));
    bad |= grow((void **)&b->outcomes, T * d->L * d->K, 1);
    if (d->timing) {
        bad |= grow((void **)&b->layer_s, (T + 1) * d->Lh, sizeof(float));
        bad |= grow((void **)&b->iteration_s, T + 1, sizeof(float));
    }
    if (bad) return fmoe_error_set(FMOE_ENOMEM, "out of memory for a request of %lld tokens",
                                   (long long)T);
    b->cap = T;
    return 0;
}

static void buffers_free(request_buffers *b) {
    free(b->token_id);
    free(b->phase);
    free(b->experts);
    free(b->probs);
    free(b->semantic);
    free(b->speculative);
    free(b->hidden);
    free(b->layer_s);
    free(b->iteration_s);
    free(b->layer_acc);
    free(b->outcomes);
}

/* The tracer for rows [t0, t0 + n). */
static fmoe_forward_trace trace_at(const request_buffers *b, const dims *d, int64_t t0) {
    fmoe_forward_trace tr = {
        .experts = b->experts + t0 * d->L * d->K,
        .probs = b->probs + t0 * d->L * d->J,
        .semantic = b->semantic + t0 * d->h,
        .speculative = d->S ? b->speculative + t0 * d->L * d->S * d->J : NULL,
        .hidden = d->hidden ? b->hidden + t0 * d->L * d->h : NULL,
        .layer_seconds = d->timing ? b->layer_acc : NULL,
    };
    return tr;
}

/* Runs tokens [t0, t0+n) of the request as one iteration, recording its timing as
 * iteration `it` and, offloaded, the outcome of each access. */
static int run_iteration(cmd_offload *off, fmoe_session *s, request_buffers *b, const dims *d,
                         int64_t t0, int32_t n, int64_t it, float *logits) {
    if (d->timing) memset(b->layer_acc, 0, (size_t)d->Lh * sizeof *b->layer_acc);
    fmoe_forward_trace tr = trace_at(b, d, t0);
    double t = cmd_now();
    FMOE_FORWARD_IF_ERROR(cmd_offload_forward(off, s, b->token_id + t0, n, b->phase[t0], &tr,
                                              logits));
    if (d->timing) {
        b->iteration_s[it] = (float)(cmd_now() - t);
        for (int64_t l = 0; l < d->Lh; l++) b->layer_s[it * d->Lh + l] = (float)b->layer_acc[l];
    }
    if (off->x) {
        int64_t na;
        const uint8_t *o = fmoe_offload_take_outcomes(off->x, &na);
        memcpy(b->outcomes + b->n_outcomes, o, (size_t)na);
        b->n_outcomes += na;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Stopping on a signal
 * ------------------------------------------------------------------------------------- */

static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) {
    if (!stop_signal) stop_signal = sig;
}

/* SIGINT, SIGTERM, SIGHUP: ask the loop to stop at the next token. */
static int catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0 ||
                   sigaction(SIGHUP, &sa, NULL) != 0
               ? -1
               : 0;
}

/* ---------------------------------------------------------------------------------------
 * Recording in shards (mpirun)
 * ------------------------------------------------------------------------------------- */

/* The shard of rank r: TRACE.h5 -> TRACE.rank-r.h5 (other names get .rank-r.h5 added). */
static void shard_path(const char *output, int rank, char *buf, size_t cap) {
    const size_t n = strlen(output);
    if (n > 3 && strcmp(output + n - 3, ".h5") == 0)
        snprintf(buf, cap, "%.*s.rank-%d.h5", (int)(n - 3), output, rank);
    else
        snprintf(buf, cap, "%s.rank-%d.h5", output, rank);
}

/* ---------------------------------------------------------------------------------------
 * The command
 * ------------------------------------------------------------------------------------- */

/* One recording run: what it opened (freed by recorder_close, whatever step failed) and
 * what it counted. The steps return a command exit status: 0 to go on. */
typedef struct recorder {
    record_args a;
    const cmd_mpi_world *world;
    char shard[4096];
    fmoe_backend_kind backend;
    const char *dir, *tok_dir;
    int64_t wanted;  /* requests to record: --max-requests, or every prompt */
    int64_t ctx_cap; /* the session's context */
    fmoe_prompt_set *prompts;
    fmoe_arrivals *arrivals;
    fmoe_model *m;
    const fmoe_model_geometry *g;
    dims d;
    fmoe_tokenizer *tok;
    cmd_generation_config gc;
    fmoe_session_options so;
    fmoe_session *s;
    fmoe_sampler *smp;
    fmoe_trace_writer *w;
    int write_failed; /* the trace could not be written: remove it, keep nothing */
    float *logits;
    int32_t *ids;
    char *chat_text;
    request_buffers b;
    cmd_offload off;
    /* counts */
    int64_t q;         /* recordable prompts so far: a single process's request index */
    int64_t mine;      /* of the wanted requests, this rank's */
    int64_t recorded, too_long, total_tokens, prefill_tokens, decode_tokens;
    double prefill_s, decode_s;
} recorder;

/* A library error as the command's exit: one line naming it. */
static int failed(int err) { return cmd_fail(CMD, err); }

/* The shard and GPU of an MPI rank; the backend, activations, model and tokenizer
 * folders. */
static int resolve(recorder *r) {
    record_args *a = &r->a;
    int rc;
    if (r->world->size > 1) { /* rank r: its shard, its GPU */
        shard_path(a->output, r->world->rank, r->shard, sizeof r->shard);
        a->output = r->shard;
        char gpu[64];
        if (cmd_mpi_pin_gpu(r->world, gpu, sizeof gpu) && !a->quiet)
            fprintf(stderr, "%s: rank %d of %d: CUDA_VISIBLE_DEVICES=%s\n", CMD, r->world->rank,
                    r->world->size, gpu);
    }
    if ((rc = cmd_backend_resolve(CMD, a->backend, &r->backend)) != 0) return rc;
    if ((rc = cmd_activations_resolve(CMD, r->backend, &a->activations)) != 0) return rc;
    a->off.backend = r->backend;
    a->off.probs_f32 = a->probs_f32; /* the policy sees the probabilities the trace stores */
    if (!(r->dir = cmd_model_dir_or_default(CMD, a->model))) return CMD_EXIT_FAILURE;
    if (!(r->tok_dir = cmd_tokenizer_dir(CMD, r->dir, a->tokenizer))) return CMD_EXIT_USAGE;
    return 0;
}

/* Prompts, arrivals, the model, its tokenizer and generation config. */
static int load_inputs(recorder *r) {
    const record_args *a = &r->a;
    int err;
    if ((err = fmoe_prompts_load(a->dataset, a->format, &r->prompts)) < 0) return failed(err);
    if (r->prompts->count == 0) return cmd_failf(CMD, "%s: no prompts", a->dataset);
    r->wanted = a->max_requests > 0 && a->max_requests < r->prompts->count ? a->max_requests
                                                                            : r->prompts->count;
    if (a->arrivals) {
        if ((err = fmoe_arrivals_load_azure(a->arrivals, &r->arrivals)) < 0) return failed(err);
        if (r->arrivals->count < r->wanted)
            return cmd_failf(CMD, "%s: %lld arrivals for %lld requests; pass --max-requests "
                             "%lld or a longer arrival trace",
                             a->arrivals, (long long)r->arrivals->count, (long long)r->wanted,
                             (long long)r->arrivals->count);
    }
    if ((err = fmoe_model_load(r->dir, NULL, &r->m)) < 0) return failed(err);
    if ((err = fmoe_tokenizer_load(r->tok_dir, &r->tok)) < 0) return failed(err);
    if ((err = cmd_generation_config_load(r->tok_dir, &r->gc)) < 0) return failed(err);
    cmd_generation_config_add_stop(&r->gc, fmoe_tokenizer_eos_id(r->tok));
    r->g = fmoe_model_get_geometry(r->m);
    return 0;
}

/* What each row records (dims) and the context: --max-context, or the longest request. */
static int size_rows_and_context(recorder *r) {
    const record_args *a = &r->a;
    const fmoe_model_geometry *g = r->g;
    r->d = (dims){.L = g->num_moe_layers, .J = g->num_experts, .K = g->top_k,
                  .h = g->hidden_size, .S = a->speculative, .Lh = g->num_hidden_layers,
                  .hidden = a->hidden, .timing = !a->no_timing};
    if (r->d.S > r->d.L - 1)
        return cmd_usage_error(CMD, "--speculative %d: the model has %lld MoE layers, so at "
                               "most %lld",
                               a->speculative, (long long)r->d.L, (long long)(r->d.L - 1));
    const int64_t ctx = g->max_position_embeddings > 0 ? g->max_position_embeddings : 4096;
    const int64_t model_cap = ctx < (1 << 20) ? ctx : (1 << 20);
    r->ctx_cap = a->max_context;
    if (r->ctx_cap > model_cap)
        return cmd_usage_error(CMD, "--max-context %d: the model has %lld positions at most",
                               a->max_context, (long long)model_cap);
    int err;
    if (r->ctx_cap == 0 &&
        (err = longest_request(a, r->tok, r->prompts, r->wanted, model_cap, &r->ctx_cap)) < 0)
        return failed(err);
    return 0;
}

/* The session, offloaded when asked, and the buffers that do not grow per request. */
static int open_session(recorder *r) {
    const record_args *a = &r->a;
    fmoe_session_options *so = &r->so;
    *so = fmoe_session_defaults();
    so->backend = r->backend;
    so->max_context = (int32_t)r->ctx_cap;
    so->threads = a->threads;
    so->activations = (fmoe_activations)a->activations;
    so->speculative_depth = a->speculative;
    int rc = cmd_offload_open(CMD, &a->off, r->m, so->max_batch, a->quiet, &r->off);
    if (rc != 0) return rc;
    if (r->off.x) {
        fmoe_offload_attach(r->off.x, so);
        if (so->speculative_depth < a->speculative) so->speculative_depth = a->speculative;
    }
    int err;
    if ((err = fmoe_session_init(r->m, so, &r->s)) < 0) return failed(err);
    r->logits = malloc((size_t)r->g->vocab_size * sizeof *r->logits);
    r->b.layer_acc = calloc((size_t)r->d.Lh, sizeof *r->b.layer_acc);
    if (!r->logits || !r->b.layer_acc) return failed(fmoe_error_set(FMOE_ENOMEM, "out of memory"));
    return 0;
}

/* The trace's header, the stop signals, and the writer on OUTPUT.partial. */
static int open_trace(recorder *r) {
    const record_args *a = &r->a;
    fmoe_trace_header h;
    int err;
    if ((err = cmd_trace_header_for_model(&h, r->m, r->dir, a->model_name, a->probs_f32,
                                          r->backend, r->so.activations)) < 0)
        return failed(err);
    cmd_base_name(a->dataset, h.dataset, sizeof h.dataset);
    h.speculative_depth = a->speculative;
    h.hidden_dim = a->hidden ? (int32_t)r->d.h : 0;
    h.timing_layers = r->d.timing ? (int32_t)r->d.Lh : 0;
    h.prefill_chunk = r->so.max_batch; /* each chunk of the prompt is its own iteration */
    if (r->off.x) {
        h.offload_cache_experts = fmoe_offload_capacity(r->off.x);
        snprintf(h.offload_policy, sizeof h.offload_policy, "%s", a->off.policy);
    }
    fmoe_trace_write_options wo = {.compression = a->compression};
    stop_signal = 0;
    if (catch_stop_signals() != 0) return cmd_failf(CMD, "cannot install the signal handler");
    if ((err = fmoe_trace_writer_open(&r->w, a->output, &h, &wo)) < 0) return failed(err);
    return 0;
}

/* Prompt p (n tokens in r->ids, the index-th request of a single process): prefill,
 * decode, append. A stop signal during it leaves it unrecorded (*kept 0). */
static int record_request(recorder *r, int64_t p, int64_t index, size_t n, int *kept) {
    const record_args *a = &r->a;
    request_buffers *b = &r->b;
    const dims *d = &r->d;
    int err;
    *kept = 0;
    int64_t max_new = a->max_new_tokens;
    if ((int64_t)n + max_new > r->ctx_cap) max_new = r->ctx_cap - (int64_t)n;
    if ((err = buffers_reserve(b, d, (int64_t)n + max_new)) < 0) return failed(err);
    memcpy(b->token_id, r->ids, n * sizeof *r->ids);
    memset(b->phase, FMOE_PHASE_PREFILL, n);

    fmoe_sampler_free(r->smp);
    r->smp = NULL;
    fmoe_sampler_params sp = {(float)a->temperature, a->top_k, (float)a->top_p,
                              (uint64_t)(a->seed + p)};
    if ((err = fmoe_sampler_init(&sp, r->g->vocab_size, &r->smp)) < 0) return failed(err);
    fmoe_session_reset(r->s);
    if (r->off.x && (err = fmoe_offload_request_begin(r->off.x, p, r->ids, (int32_t)n)) < 0)
        return failed(err);

    /* Prefill: chunks of max_batch tokens, each its own iteration (docs/design.md §7.1), as
     * the header's prefill_chunk tells the replay. Without generation the last chunk's lm
     * head is skipped. */
    const int32_t chunk = r->so.max_batch;
    double t0 = cmd_now();
    int64_t it = 0;
    b->n_outcomes = 0;
    for (int64_t c0 = 0; c0 < (int64_t)n; c0 += chunk, it++) {
        const int32_t c = (int32_t)((int64_t)n - c0 < chunk ? (int64_t)n - c0 : chunk);
        const int last = c0 + c == (int64_t)n;
        if ((err = run_iteration(&r->off, r->s, b, d, c0, c, it,
                                 last && max_new > 0 ? r->logits : NULL)) < 0)
            return failed(err);
    }
    r->prefill_s += cmd_now() - t0;
    t0 = cmd_now();
    int64_t out = 0;
    while (out < max_new && !stop_signal) {
        int32_t next = fmoe_sampler_sample(r->smp, r->logits);
        if (!a->ignore_eos && cmd_generation_config_is_stop(&r->gc, next)) break;
        const int64_t t = (int64_t)n + out;
        b->token_id[t] = next;
        b->phase[t] = FMOE_PHASE_DECODE;
        out++;
        /* The last token is fed for its routing only: no lm head. */
        if ((err = run_iteration(&r->off, r->s, b, d, t, 1, it++,
                                 out < max_new ? r->logits : NULL)) < 0)
            return failed(err);
    }
    r->decode_s += cmd_now() - t0;
    if (r->off.x && (err = fmoe_offload_request_end(r->off.x)) < 0) return failed(err);
    /* --decision-log: a write that fails (a full disk) stops the run here, as a failed
     * trace append does, not at close after every request */
    if (r->off.x && (err = fmoe_offload_flush_decisions(r->off.x)) < 0) {
        r->write_failed = 1;
        return failed(err);
    }
    if (stop_signal) return 0; /* the request is unfinished: not recorded */

    fmoe_trace_request q = {
        .id = p,
        .arrival_s = r->arrivals ? r->arrivals->arrival_s[index] : 0.0,
        .prompt_tokens = (int32_t)n,
        .output_tokens = (int32_t)out,
        .token_id = b->token_id,
        .phase = b->phase,
        .experts = b->experts,
        .probs = b->probs,
        .semantic = b->semantic,
        .speculative = d->S ? b->speculative : NULL,
        .hidden = d->hidden ? b->hidden : NULL,
        .layer_s = d->timing ? b->layer_s : NULL,
        .iteration_s = d->timing ? b->iteration_s : NULL,
        .access_outcome = r->off.x ? b->outcomes : NULL,
        .num_access_outcomes = r->off.x ? b->n_outcomes : 0,
    };
    if ((err = fmoe_trace_writer_append_request(r->w, &q)) < 0) {
        r->write_failed = 1;
        return failed(err);
    }
    r->recorded++;
    if (a->log_requests)
        fprintf(stderr, "fmoe record: request %lld recorded (%lld of %lld, %lld tokens)\n",
                (long long)p, (long long)r->recorded, (long long)r->mine, (long long)n + out);
    r->prefill_tokens += (int64_t)n;
    r->decode_tokens += out;
    r->total_tokens += (int64_t)n + out;
    *kept = 1;
    return 0;
}

/* Every prompt of this rank's share, until the wanted count or a stop signal. The q-th
 * recordable prompt (the request index a single process gives it) is rank q mod size's (all
 * of them in a single process). */
static int record_requests(recorder *r) {
    const record_args *a = &r->a;
    cmd_progress_bar bar;
    char label[96];
    snprintf(label, sizeof label, "record");
    cmd_progress_bar_init(&bar, label, a->quiet);
    fmoe_progress progress = cmd_progress_bar_callback(&bar);
    const double started = cmd_now();
    const int64_t R = r->world->size, me = r->world->rank;
    r->mine = r->wanted > me ? (r->wanted - me + R - 1) / R : 0;
    int rc = 0;
    for (int64_t p = 0; p < r->prompts->count && r->q < r->wanted && !stop_signal; p++) {
        size_t n = 0;
        int err = encode_prompt(a, r->tok, r->prompts->prompts[p], &r->chat_text, &r->ids, &n);
        if (err < 0) {
            rc = failed(err);
            break;
        }
        if (n == 0) continue;
        if ((int64_t)n + 1 > r->ctx_cap) { /* no room for one generated token */
            r->too_long++;
            continue;
        }
        const int64_t index = r->q++; /* the request's index in a single process's trace */
        if (index % R != me) continue; /* another rank's */
        int kept;
        if ((rc = record_request(r, p, index, n, &kept)) != 0 || !kept) break;
        double el = cmd_now() - started;
        snprintf(label, sizeof label, "record (%.0f tokens/s)",
                 el > 0 ? r->total_tokens / el : 0.0);
        fmoe_progress_report(&progress, r->recorded, r->mine, "requests");
    }
    cmd_progress_bar_done(&bar);
    return rc;
}

/* After the loop: keep the .partial for recover after a stop signal, nothing when no
 * request was this rank's or none fitted, else the trace renamed into place and the
 * summary. */
static int finish(recorder *r) {
    const record_args *a = &r->a;
    int err;
    if (stop_signal) {
        /* stopped on purpose: keep what is recorded, for recover */
        const int sig = stop_signal;
        const char *name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
        if (r->recorded == 0) {
            fmoe_trace_writer_abort(r->w);
            r->w = NULL;
            fprintf(stderr, "fmoe record: %s: stopped before the first request; nothing kept\n",
                    name);
        } else {
            err = fmoe_trace_writer_close_partial(r->w);
            r->w = NULL;
            if (err < 0) return failed(err);
            fprintf(stderr, "fmoe record: %s: stopped after %lld request%s; 'fmoe trace recover "
                            "%s.partial' makes the trace of them\n",
                    name, (long long)r->recorded, r->recorded == 1 ? "" : "s", a->output);
        }
        return 128 + sig;
    }
    if (r->recorded == 0 && r->q > 0) { /* an MPI rank whose share is empty: more ranks than
                                           requests; no shard, and that is no failure */
        fmoe_trace_writer_abort(r->w);
        r->w = NULL;
        if (!a->quiet)
            fprintf(stderr, "fmoe record: rank %d: none of the %lld requests is this rank's "
                            "(%d ranks); no %s\n",
                    r->world->rank, (long long)r->q, r->world->size, a->output);
        return CMD_EXIT_OK;
    }
    if (r->recorded == 0) {
        fmoe_trace_writer_abort(r->w);
        r->w = NULL;
        return cmd_failf(CMD, "%s: no prompt fits the context of %lld tokens of %s", a->dataset,
                         (long long)r->ctx_cap, r->dir);
    }
    err = fmoe_trace_writer_close(r->w);
    r->w = NULL;
    if (err < 0) {
        r->write_failed = 1;
        return failed(err);
    }
    if (!a->quiet) {
        /* with the summary: a failure stays one line */
        cmd_backend_say(CMD, r->backend, a->activations);
        fprintf(stderr,
                "fmoe record: %s: %lld request%s, %lld tokens (prefill %lld at %.1f tokens/s, "
                "decode %lld at %.1f tokens/s), context %lld positions",
                a->output, (long long)r->recorded, r->recorded == 1 ? "" : "s",
                (long long)r->total_tokens, (long long)r->prefill_tokens,
                r->prefill_s > 0 ? r->prefill_tokens / r->prefill_s : 0.0,
                (long long)r->decode_tokens,
                r->decode_s > 0 ? r->decode_tokens / r->decode_s : 0.0, (long long)r->ctx_cap);
        if (r->too_long)
            fprintf(stderr, "; skipped %lld prompt%s longer than the context (%lld tokens)",
                    (long long)r->too_long, r->too_long == 1 ? "" : "s", (long long)r->ctx_cap);
        fprintf(stderr, "\n");
        if (r->off.x) {
            char line[512];
            cmd_offload_summary(&r->off, line, sizeof line);
            fprintf(stderr, "fmoe record: %s\n", line);
        }
    }
    return CMD_EXIT_OK;
}

/* Frees what the steps opened. A writer still open means a step failed: with a failed
 * write (a full disk) or nothing recorded it is removed; after another error the
 * requests recorded are kept, as a kill or SIGINT would. @return rc, or a failure when
 * closing the offload executor fails a run that had succeeded. */
static int recorder_close(recorder *r, int rc) {
    if (r->w && (r->write_failed || r->recorded == 0)) {
        fmoe_trace_writer_abort(r->w);
    } else if (r->w) {
        if (fmoe_trace_writer_close_partial(r->w) == 0)
            fprintf(stderr, "fmoe record: the %lld requests recorded before the error are in "
                            "%s.partial ('fmoe trace recover %s.partial' makes the trace)\n",
                    (long long)r->recorded, r->a.output, r->a.output);
    }
    buffers_free(&r->b);
    free(r->ids);
    free(r->chat_text);
    free(r->logits);
    fmoe_sampler_free(r->smp);
    fmoe_session_free(r->s);
    if (cmd_offload_close(CMD, &r->off, rc == CMD_EXIT_OK) && rc == CMD_EXIT_OK)
        rc = CMD_EXIT_FAILURE;
    fmoe_tokenizer_free(r->tok);
    fmoe_model_free(r->m);
    fmoe_arrivals_free(r->arrivals);
    fmoe_prompt_set_free(r->prompts);
    return rc;
}

static int record(const record_args *a, const cmd_mpi_world *world) {
    recorder *r = calloc(1, sizeof *r);
    if (!r) return cmd_fail(CMD, fmoe_error_set(FMOE_ENOMEM, "out of memory"));
    r->a = *a;
    r->world = world;
    int rc = resolve(r);
    if (rc == 0) rc = load_inputs(r);
    if (rc == 0) rc = size_rows_and_context(r);
    if (rc == 0) rc = open_session(r);
    if (rc == 0) rc = open_trace(r);
    if (rc == 0) rc = record_requests(r);
    if (rc == 0) rc = finish(r);
    rc = recorder_close(r, rc);
    free(r);
    return rc;
}

int cmd_record(int argc, char **argv) {
    record_args a;
    init(&a);
    int prc = parse_args(argc, argv, &a);
    if (prc < 0) return CMD_EXIT_OK;
    if (prc > 0) return prc;
    cmd_mpi_world world;
    if ((prc = cmd_mpi_start(CMD, &world)) != 0) return prc;
    prc = record(&a, &world);
    cmd_mpi_finish(&world, prc);
    return prc;
}
