/*
 * cmd_serve.c - `fmoe serve`: an OpenAI-compatible HTTP server over the (optionally
 * offloaded) model, with continuous batching of up to --parallel sequences.
 *
 * Order: parse -> listen (so /health answers 503 "loading" at once) -> load the model,
 * tokenizer and generation_config.json -> start the offloading executor (the options of
 * generate/record) -> start the engine, its sessions and executor on --backend (cpu, cuda
 * or auto, chosen before listening; one line on stderr says which) -> /health 200 -> wait
 * for SIGINT/SIGTERM -> stop accepting -> let running requests finish for --grace seconds,
 * cut the rest -> close the HTTP side -> write the updated store (--store-out) -> exit 0.
 *
 * SIGINT and SIGTERM: their handler only writes the signal number to a pipe that the main
 * thread reads (the self-pipe trick). Blocking them and calling sigwait would not do:
 * threads started before main (OpenBLAS's pool) do not block them, and the default action
 * would kill the process in one of those.
 */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_cli.h"
#include "cmd_common.h"
#include "offload_cli.h"
#include "paths.h"
#include "trace_header.h"
#include "fmoe/error.h"
#include "files.h"
#include "fmoe/model.h"
#include "fmoe/policy.h"
#include "fmoe/sim.h"
#include "fmoe/tokenizer.h"
#include "http_server.h"
#include "serve_engine.h"
#include "serve_metrics.h"

static const char *const CMD = "serve";

#define STR_(x) #x
#define STR(x) STR_(x) /* a numeric macro's digits, for an option's default_text */

typedef struct serve_args {
    const char *model, *tokenizer, *host, *api_key, *port_file, *model_name, *trace_out, *backend;
    int32_t port, parallel, batch_tokens, max_queue, max_context, threads, timeout;
    int32_t client_connections, max_connections, header_timeout;
    int32_t activations; /* fmoe_activations */
    int64_t max_body;
    double grace;
    int quiet;
    int probs_f32;
    int no_prefix_cache;
    double prefix_cache_gb;
    cmd_offload_args off;
} serve_args;

static const cmd_option serve_options[] = {
    {.name = "model", .kind = CMD_OPT_STRING, .io = CMD_IO_MODEL, .value_name = "PATH",
     .help = "model directory (HuggingFace checkpoint) or GGUF file",
     .default_text = "the bundled fmoe-tiny", .offset = offsetof(serve_args, model)},
    {.name = "tokenizer", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "DIR",
     .help = "folder with tokenizer.json and generation_config.json (needed with a GGUF "
             "--model)",
     .default_text = "the model directory", .offset = offsetof(serve_args, tokenizer)},
    {.name = "host", .kind = CMD_OPT_STRING, .io = CMD_IO_TEXT, .value_name = "ADDR",
     .help = "address to listen on", .default_text = "127.0.0.1",
     .offset = offsetof(serve_args, host)},
    {.name = "port", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "TCP port (0: any free port; see --port-file)", .default_text = "8000",
     .offset = offsetof(serve_args, port), .min = 0, .max = 65535},
    {.name = "port-file", .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT, .value_name = "F",
     .help = "write the port listened on to F once listening (for scripts and tests)",
     .offset = offsetof(serve_args, port_file)},
    {.name = "parallel", .kind = CMD_OPT_INT32, .value_name = "P",
     .help = "sequences decoded together (continuous batching)", .default_text = "4",
     .offset = offsetof(serve_args, parallel), .min = 1, .max = FMOE_BATCH_TOKENS_MAX},
    {.name = "batch-tokens", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "tokens of one batched iteration (decode tokens plus prompt chunks; also the "
             "longest prompt chunk): more lets a burst of prompts prefill sooner, at the cost "
             "of the running sequences' next tokens; at least --parallel",
     .default_text = STR(FMOE_BATCH_TOKENS),
     .offset = offsetof(serve_args, batch_tokens), .min = 1, .max = FMOE_BATCH_TOKENS_MAX},
    {.name = "max-queue", .kind = CMD_OPT_INT32, .value_name = "Q",
     .help = "requests waiting for a free sequence beyond which new ones get 503",
     .default_text = "64", .offset = offsetof(serve_args, max_queue), .min = 0,
     .max = 1 << 20},
    {.name = "max-context", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "KV positions per sequence: prompt + max_tokens must fit",
     .default_text = "the model's, at most 4096", .offset = offsetof(serve_args, max_context),
     .min = 1, .max = 1 << 24},
    CMD_BACKEND_OPTION(serve_args, backend),
    CMD_ACTIVATIONS_OPTION(serve_args, activations),
    {.name = "threads", .kind = CMD_OPT_INT32, .value_name = "N", .help = "CPU threads",
     .default_text = "all cores", .offset = offsetof(serve_args, threads), .min = 0,
     .max = 4096},
    {.name = "api-key", .kind = CMD_OPT_STRING, .io = CMD_IO_TEXT, .value_name = "KEY",
     .help = "require 'Authorization: Bearer KEY' on /v1 endpoints (401 otherwise)",
     .offset = offsetof(serve_args, api_key)},
    {.name = "model-name", .kind = CMD_OPT_STRING, .io = CMD_IO_TEXT, .value_name = "NAME",
     .help = "the model id /v1/models lists and responses carry",
     .default_text = "the model directory's name", .offset = offsetof(serve_args, model_name)},
    {.name = "max-body", .kind = CMD_OPT_INT64, .value_name = "BYTES",
     .help = "largest request body (larger: 413)", .default_text = "1048576",
     .offset = offsetof(serve_args, max_body), .min = 1024, .max = INT64_C(1) << 32},
    {.name = "timeout", .kind = CMD_OPT_INT32, .value_name = "S",
     .help = "seconds a connection may stay idle, and in which it must send a whole "
             "request (head and body), however slowly it trickles",
     .default_text = "30", .offset = offsetof(serve_args, timeout), .min = 1, .max = 86400},
    {.name = "header-timeout", .kind = CMD_OPT_INT32, .value_name = "S",
     .help = "seconds in which a connection must send a whole request head, after it opened "
             "or after its previous request ended (an idle kept-alive connection is closed "
             "then too); at most --timeout",
     .default_text = "10", .offset = offsetof(serve_args, header_timeout), .min = 1,
     .max = 86400},
    {.name = "max-connections", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "connections held at once; one more takes the place of the connection that has "
             "waited longest for its request, or is closed when all are being answered",
     .default_text = "512", .offset = offsetof(serve_args, max_connections), .min = 1,
     .max = 1 << 20},
    {.name = "client-connections", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "connections one client address may hold at once (more are closed at once); "
             "0: no limit",
     .default_text = "64", .offset = offsetof(serve_args, client_connections), .min = 0,
     .max = 1 << 20},
    {.name = "grace", .kind = CMD_OPT_DOUBLE, .value_name = "S",
     .help = "on SIGINT/SIGTERM: seconds running requests may take to finish before they "
             "are cut",
     .default_text = "10", .offset = offsetof(serve_args, grace), .fmin = 0, .fmax = 86400},
    {.name = "trace-out", .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT, .value_name = "T.h5",
     .help = "record every served request (tokens, routing, gate probabilities, semantic "
             "rows, arrival times) as a trace for build-store and simulate; written as "
             "T.h5.partial while serving, renamed at shutdown",
     .offset = offsetof(serve_args, trace_out)},
    {.name = "probs-f32", .kind = CMD_OPT_FLAG,
     .help = "store --trace-out's gate probabilities as float32, not float16 (what fmoe "
             "simulate --batch trace needs to replay a policy that reads them, such as fmoe, "
             "decision for decision)",
     .offset = offsetof(serve_args, probs_f32)},
    {.name = "no-prefix-cache", .kind = CMD_OPT_FLAG,
     .help = "run every prompt whole: by default a request goes to the free sequence whose "
             "kept cache shares the longest prefix with its prompt (the previous turn of a "
             "chat, a shared system prompt) and prefills only the rest; off with --trace-out "
             "anyway",
     .offset = offsetof(serve_args, no_prefix_cache)},
    {.name = "prefix-cache-gb", .kind = CMD_OPT_DOUBLE, .value_name = "X",
     .help = "also keep finished requests' KV caches in X GiB beyond the sequences' own, so "
             "that more conversations than --parallel keep their prefixes between turns "
             "(CPU backend; allocated at start)",
     .default_text = "0", .offset = offsetof(serve_args, prefix_cache_gb), .fmin = 0,
     .fmax = 1 << 20},
    {.name = "quiet", .kind = CMD_OPT_FLAG, .help = "no startup and shutdown lines",
     .offset = offsetof(serve_args, quiet)},
    CMD_OFFLOAD_OPTIONS(serve_args, off),
    {0},
};

static void init(void *base) {
    *(serve_args *)base = (serve_args){.host = "127.0.0.1", .port = 8000, .parallel = 4,
                                       .batch_tokens = FMOE_BATCH_TOKENS,
                                       .max_queue = 64, .max_body = 1 << 20, .timeout = 30,
                                       .client_connections = 64, .max_connections = 512,
                                       .header_timeout = 10,
                                       .grace = 10, .activations = FMOE_ACTIVATIONS_AUTO};
    cmd_offload_args_init(&((serve_args *)base)->off);
}

const cmd_spec cmd_serve_spec = {
    .name = "serve",
    .usage = "serve [--model DIR|FILE.gguf [--tokenizer DIR]] [--port N] [--parallel P] [--policy P --cache-experts N] "
             "[options]",
    .description =
        "Serve a HuggingFace MoE checkpoint behind an OpenAI-compatible API:\n"
        "POST /v1/chat/completions and /v1/completions (streaming with SSE), GET /v1/models,\n"
        "/health and /metrics (Prometheus). Up to P sequences are decoded together, so a\n"
        "layer's experts are loaded once for the whole batch. With --cache-experts or\n"
        "--cache-gb the routed experts are offloaded and the policy decides what stays.\n",
    .options = serve_options,
    .size = sizeof(serve_args),
    .init = init,
};

static int stop_pipe[2] = {-1, -1};

static void on_stop_signal(int sig) {
    const int saved = errno;
    const unsigned char b = (unsigned char)sig;
    if (write(stop_pipe[1], &b, 1) < 0) { /* the pipe is full: a stop is pending anyway */
    }
    errno = saved;
}

/* Installs the handler for SIGINT and SIGTERM. @return 0 or -1 (errno). */
static int catch_stop_signals(void) {
    if (pipe(stop_pipe) != 0) return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0) return -1;
    return 0;
}

/* Blocks until SIGINT or SIGTERM arrives. @return the signal. */
static int wait_stop_signal(void) {
    unsigned char b = 0;
    while (read(stop_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    return b;
}

/* The port, written through a partial (lib/files.h) and renamed: a script polling for the
 * file never reads half of it. */
static int write_port_file(const char *path, int port) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.partial", path);
    FILE *f = NULL;
    if (fmoe__partial_fopen(path, tmp, "w", &f) < 0) return -1;
    const int ok = fprintf(f, "%d\n", port) > 0;
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        remove(tmp);
        return -1;
    }
    return 0;
}

/* One server's state, owned here and freed by server_close: each step below fills its
 * part and returns 0, or the exit code (a failure already printed in one line). */
typedef struct server {
    serve_args *a;
    fmoe_backend_kind backend;
    const char *dir, *tok_dir;
    fmoe_model *m;
    fmoe_tokenizer *tok;
    cmd_generation_config gc;
    serve_metrics *metrics;
    serve_http *http;
    serve_engine *engine;
    cmd_offload off;
    int off_open;
    fmoe_trace_writer *trace;
    int32_t trace_speculative;
    int keep_outputs; /* a failed run whose other outputs are whole */
    char name[256];
} server;

/* Listen first: /health says "loading" while the model loads. */
static int start_listening(server *v) {
    const serve_args *a = v->a;
    int err;
    if (!(v->metrics = fmoe_serve_metrics_new()))
        return cmd_fail(CMD, fmoe_error_set(FMOE_ENOMEM, "out of memory"));
    if ((err = fmoe_tokenizer_load(v->tok_dir, &v->tok)) < 0) return cmd_fail(CMD, err);
    serve_http_options ho = {.host = a->host, .port = a->port, .api_key = a->api_key,
                             .max_body_bytes = (size_t)a->max_body,
                             .connection_timeout_s = (unsigned)a->timeout,
                             .header_timeout_s = (unsigned)a->header_timeout,
                             .max_connections = (unsigned)a->max_connections,
                             .max_client_connections = (unsigned)a->client_connections,
                             .tokenizer = v->tok, .metrics = v->metrics};
    if ((err = fmoe_serve_http_start(&ho, &v->http)) < 0) return cmd_fail(CMD, err);
    const int port = fmoe_serve_http_port(v->http);
    if (a->port_file && write_port_file(a->port_file, port) < 0)
        return cmd_failf(CMD, "%s: cannot write the port file", a->port_file);
    if (!a->quiet) fprintf(stderr, "fmoe serve: listening on http://%s:%d (loading %s)\n",
                           a->host, port, v->dir);
    return 0;
}

/* The model, generation_config.json and the offloading executor (--cache-*). */
static int load_model(server *v) {
    serve_args *a = v->a;
    int err, rc;
    if ((err = fmoe_model_load(v->dir, NULL, &v->m)) < 0) return cmd_fail(CMD, err);
    if ((err = cmd_generation_config_load(v->tok_dir, &v->gc)) < 0) return cmd_fail(CMD, err);
    if ((rc = cmd_offload_open(CMD, &a->off, v->m, a->batch_tokens, a->quiet, &v->off)) != 0)
        return rc;
    v->off_open = 1;
    if (!a->model_name) a->model_name = cmd_base_name(v->dir, v->name, sizeof v->name);
    return 0;
}

/* --trace-out: the trace writer, its header saying how the server runs. */
static int open_trace(server *v) {
    const serve_args *a = v->a;
    int err;
    if (!a->trace_out) return 0;
    fmoe_trace_header h;
    if ((err = cmd_trace_header_for_model(&h, v->m, v->dir, a->model_name, a->probs_f32,
                                          v->backend, (fmoe_activations)a->activations)) < 0)
        return cmd_fail(CMD, err);
    snprintf(h.dataset, sizeof h.dataset, "serve");
    /* a prompt's chunks, as the engine runs a lone request, and the iteration's token
     * budget, which fmoe simulate --batch P replays with */
    h.prefill_chunk = a->batch_tokens;
    h.served = 1;         /* and each token's batched pass and its time */
    /* a policy that reads speculative gates gets them recorded, for its replay */
    const fmoe_policy_ops *ops = v->off.x ? fmoe_policy_find(a->off.policy ? a->off.policy
                                                                           : "lru")
                                          : NULL;
    v->trace_speculative = ops && (ops->flags & FMOE_POLICY_NEEDS_SPECULATIVE) ? 1 : 0;
    h.speculative_depth = v->trace_speculative;
    if ((err = fmoe_trace_writer_open(&v->trace, a->trace_out, &h, NULL)) < 0)
        return cmd_fail(CMD, err);
    return 0;
}

/* The engine, its sessions and executor, handed to the HTTP side; then the ready line. */
static int start_engine(server *v) {
    const serve_args *a = v->a;
    int err;
    serve_engine_options eo = {
        .model = v->m, .tokenizer = v->tok, .offload = v->off.x, .metrics = v->metrics,
        .backend = v->backend, .model_name = a->model_name, .parallel = a->parallel,
        .batch_tokens = a->batch_tokens, .max_queue = a->max_queue,
        .max_context = a->max_context, .threads = a->threads, .stop_ids = v->gc.stop,
        .num_stop_ids = v->gc.num_stop, .trace_out = v->trace,
        .trace_speculative = v->trace_speculative,
        .activations = (fmoe_activations)a->activations, .prefix_cache = !a->no_prefix_cache,
        .prefix_cache_bytes = (int64_t)(a->prefix_cache_gb * (double)(1 << 30))};
    if ((err = fmoe_serve_engine_start(&eo, &v->engine)) < 0) return cmd_fail(CMD, err);
    fmoe_serve_http_set_engine(v->http, v->engine);
    if (!a->quiet) {
        cmd_backend_say(CMD, v->backend, a->activations); /* once the engine's sessions run on it */
        char line[512];
        cmd_offload_describe(&v->off, line, sizeof line); /* nothing has run: no figures */
        serve_engine_info info;
        fmoe_serve_engine_get_info(v->engine, &info);
        fprintf(stderr,
                "fmoe serve: ready: model %s, %d sequence%s, %d tokens a pass, context %d, "
                "%s\n",
                info.model_name, info.parallel, info.parallel == 1 ? "" : "s", a->batch_tokens,
                info.max_context, line);
    }
    return 0;
}

/* Serves until SIGINT or SIGTERM, then lets running requests finish for --grace seconds,
 * closes the HTTP side and the trace. */
static int serve_until_stopped(server *v) {
    const serve_args *a = v->a;
    const int sig = wait_stop_signal();
    if (!a->quiet)
        fprintf(stderr, "fmoe serve: %s: finishing requests (up to %.0f s)\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM", a->grace);
    fmoe_serve_http_quiesce(v->http);
    int err = fmoe_serve_engine_stop(v->engine, a->grace);
    v->engine = NULL;
    if (!a->quiet && v->off.x) { /* what the requests served made of the cache */
        char line[512];
        cmd_offload_summary(&v->off, line, sizeof line);
        fprintf(stderr, "fmoe serve: %s\n", line);
    }
    fmoe_serve_http_wait_idle(v->http, 5.0); /* cut streams still send their usage and [DONE] */
    fmoe_serve_http_stop(v->http);
    v->http = NULL;
    if (err < 0) {
        /* The trace failed while serving (the engine logged it then, and failed the
         * requests it could not record). Everything written stays: the journal holds every
         * request journalled before the failure, and a broken writer's close keeps it and
         * the .partial; the decision log and --store-out are closed as in a clean stop. */
        int rc = cmd_fail(CMD, err);
        if (v->trace) {
            err = fmoe_trace_writer_close(v->trace);
            v->trace = NULL;
            if (err < 0) cmd_fail(CMD, err);
            fprintf(stderr, "fmoe serve: the requests answered before the failure are in "
                            "%s.partial.journal: 'fmoe trace recover %s.partial' rebuilds the "
                            "trace\n",
                    a->trace_out, a->trace_out);
        }
        v->keep_outputs = 1;
        return rc;
    }
    if (v->trace) {
        err = fmoe_trace_writer_close(v->trace);
        v->trace = NULL;
        if (err < 0) return cmd_fail(CMD, err);
    }
    return 0;
}

/* Stops and frees what the steps started; rc is the run's exit code so far. Closing the
 * offloading executor writes --store-out and the decision log: kept after a clean run (or
 * a failed one whose outputs are whole), and its failure fails the run. */
static int server_close(server *v, int rc) {
    if (v->http) fmoe_serve_http_quiesce(v->http);
    fmoe_serve_engine_stop(v->engine, 0);
    fmoe_serve_http_stop(v->http);
    fmoe_trace_writer_abort(v->trace); /* failed: nothing half-written is left */
    if (v->off_open && cmd_offload_close(CMD, &v->off, rc == CMD_EXIT_OK || v->keep_outputs) != 0)
        rc = CMD_EXIT_FAILURE;
    if (rc == CMD_EXIT_OK && !v->a->quiet) fprintf(stderr, "fmoe serve: stopped\n");
    fmoe_serve_metrics_free(v->metrics);
    fmoe_tokenizer_free(v->tok);
    fmoe_model_free(v->m);
    return rc;
}

int cmd_serve(int argc, char **argv) {
    serve_args a;
    init(&a);
    int prc = cmd_options_parse(&cmd_serve_spec, &a, argc, argv, NULL);
    if (prc < 0) return CMD_EXIT_OK; /* --help */
    if (prc > 0) return prc;
    if (a.parallel > a.batch_tokens) /* each running sequence's token fits an iteration */
        return cmd_usage_error(CMD, "--parallel %d exceeds --batch-tokens %d", a.parallel,
                               a.batch_tokens);
    fmoe_backend_kind backend; /* before listening, as the other options */
    if ((prc = cmd_backend_resolve(CMD, a.backend, &backend)) != 0) return prc;
    if ((prc = cmd_activations_resolve(CMD, backend, &a.activations)) != 0) return prc;
    a.off.backend = backend;
    a.off.probs_f32 = a.probs_f32; /* the policy sees what --trace-out stores */
    const char *dir = cmd_model_dir_or_default(CMD, a.model);
    if (!dir) return CMD_EXIT_FAILURE;
    const char *tok_dir = cmd_tokenizer_dir(CMD, dir, a.tokenizer);
    if (!tok_dir) return CMD_EXIT_USAGE;

    if ((prc = cmd_offload_check_args(CMD, &a.off)) != 0) return prc; /* before listening */
    if (catch_stop_signals() != 0) return cmd_failf(CMD, "cannot install the signal handler");
    signal(SIGPIPE, SIG_IGN);

    server v = {.a = &a, .backend = backend, .dir = dir, .tok_dir = tok_dir};
    int rc;
    if ((rc = start_listening(&v)) == 0 && (rc = load_model(&v)) == 0 &&
        (rc = open_trace(&v)) == 0 && (rc = start_engine(&v)) == 0)
        rc = serve_until_stopped(&v);
    return server_close(&v, rc);
}
