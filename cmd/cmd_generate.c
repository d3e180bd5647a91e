/*
 * cmd_generate.c - `fmoe generate`: one prompt through a model, no server.
 *
 * Defaults → parse → validate → choose the backend (--backend cpu|cuda|auto) → load
 * (model, tokenizer, generation_config.json) → encode (optionally through the chat
 * template) → session on the backend → prefill → decode, streaming text as it is
 * produced → the backend ("fmoe generate: backend cpu"; with --json the object's
 * "backend" field instead) and tokens/s on stderr, after the run so that a failure
 * stays one line. The text is streamed by decoding the whole generated sequence after
 * each token and printing what is new (as transformers' TextStreamer does), holding
 * back a trailing incomplete UTF-8 sequence, so the printed text is exactly
 * decode(generated ids).
 *
 * Structured output: --json-schema FILE (or --json-object: any JSON object) samples each
 * token among those that keep the text a prefix of a document of the schema, and stops
 * with the end-of-sequence token once the document is whole (fmoe/json_constraint.h);
 * --ignore-eos does not apply then. The text is the document, or its start when
 * --max-new-tokens ends it first (stop: length).
 *
 * Sampling: temperature 0 is greedy. Without --temperature/--top-p/--top-k the model's
 * generation_config.json decides (do_sample false, or absent: greedy; else its
 * temperature/top_p/top_k), as transformers' generate() does.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_cli.h"
#include "cmd_common.h"
#include "offload_cli.h"
#include "fmoe/cuda.h"
#include "fmoe/error.h"
#include "files.h"
#include "fmoe/model.h"
#include "fmoe/json_constraint.h"
#include "fmoe/sampler.h"
#include "fmoe/tokenizer.h"
#include "paths.h"

static const char *const CMD = "generate";

/* ---------------------------------------------------------------------------------------
 * .npy output: a v1.0 header of fixed length (rewritten with the final row count at the
 * end), then the rows as they are produced.
 * ------------------------------------------------------------------------------------- */

#define NPY_HEADER_BYTES 128

static int npy_write_header(FILE *f, int64_t rows, int64_t cols) {
    char dict[NPY_HEADER_BYTES];
    int n = snprintf(dict, sizeof dict,
                     "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                     (long long)rows, (long long)cols);
    const int body = NPY_HEADER_BYTES - 10; /* magic 6, version 2, header length 2 */
    if (n < 0 || n >= body) return -1;
    memset(dict + n, ' ', (size_t)(body - n - 1));
    dict[body - 1] = '\n';
    const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                   (unsigned char)(body & 0xff), (unsigned char)(body >> 8)};
    if (fseek(f, 0, SEEK_SET) != 0) return -1;
    if (fwrite(pre, 1, sizeof pre, f) != sizeof pre) return -1;
    if (fwrite(dict, 1, (size_t)body, f) != (size_t)body) return -1;
    return fseek(f, 0, SEEK_END);
}

/* ---------------------------------------------------------------------------------------
 * Streaming
 * ------------------------------------------------------------------------------------- */

typedef struct streamer {
    const fmoe_tokenizer *tok;
    FILE *out;      /* NULL: decode only at the end */
    size_t printed; /* bytes of the decoded text already written */
} streamer;

static int streamer_push(streamer *st, const int32_t *ids, size_t n, int final) {
    if (!st->out) return 0;
    char *text = NULL;
    size_t len = 0;
    FMOE_FORWARD_IF_ERROR(fmoe_tokenizer_decode(st->tok, ids, n, 1, &text, &len));
    size_t upto = final ? len : fmoe_text_stable_prefix(text, len);
    if (upto > st->printed) {
        fwrite(text + st->printed, 1, upto - st->printed, st->out);
        fflush(st->out);
        st->printed = upto;
    }
    free(text);
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * JSON output
 * ------------------------------------------------------------------------------------- */

static void json_string(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (c < 0x20) fprintf(f, "\\u%04x", c);
            else fputc(c, f);
        }
    }
    fputc('"', f);
}

static void json_ids(FILE *f, const int32_t *ids, size_t n) {
    fputc('[', f);
    for (size_t i = 0; i < n; i++) fprintf(f, i ? ",%d" : "%d", ids[i]);
    fputc(']', f);
}

/* ---------------------------------------------------------------------------------------
 * The command
 * ------------------------------------------------------------------------------------- */

typedef struct generate_args {
    const char *model, *tokenizer, *prompt, *system, *chat_template, *dump_logits, *backend;
    const char *json_schema;
    int json_object;
    int32_t max_new_tokens, top_k, threads;
    int32_t activations; /* fmoe_activations */
    double temperature, top_p;
    int64_t seed;
    int chat, json, ignore_eos;
    int set_temperature, set_top_p, set_top_k;
    cmd_offload_args off;
} generate_args;

static const cmd_option generate_options[] = {
    {.name = "model", .kind = CMD_OPT_STRING, .io = CMD_IO_MODEL, .value_name = "PATH",
     .help = "model directory (HuggingFace checkpoint) or GGUF file",
     .default_text = "the bundled fmoe-tiny", .offset = offsetof(generate_args, model)},
    {.name = "tokenizer", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "DIR",
     .help = "folder with tokenizer.json and generation_config.json (needed with a GGUF "
             "--model)",
     .default_text = "the model directory", .offset = offsetof(generate_args, tokenizer)},
    {.name = "prompt", .kind = CMD_OPT_STRING, .io = CMD_IO_TEXT, .value_name = "TEXT",
     .help = "the prompt (required)", .offset = offsetof(generate_args, prompt)},
    {.name = "max-new-tokens", .kind = CMD_OPT_INT32, .value_name = "N",
     .help = "tokens to generate at most", .default_text = "128",
     .offset = offsetof(generate_args, max_new_tokens), .min = 0, .max = 1 << 24},
    {.name = "temperature", .kind = CMD_OPT_DOUBLE, .value_name = "T", .help = "0 = greedy",
     .default_text = "the model's generation_config.json, greedy when it does not sample",
     .offset = offsetof(generate_args, temperature), .fmin = 0.0, .fmax = 100.0,
     .seen_offset = offsetof(generate_args, set_temperature)},
    {.name = "top-p", .kind = CMD_OPT_DOUBLE, .value_name = "P", .help = "nucleus sampling",
     .default_text = "1 = off", .offset = offsetof(generate_args, top_p), .fmin = 1e-6,
     .fmax = 1.0, .seen_offset = offsetof(generate_args, set_top_p)},
    {.name = "top-k", .kind = CMD_OPT_INT32, .value_name = "K",
     .help = "keep the K most likely tokens", .default_text = "0 = off",
     .offset = offsetof(generate_args, top_k), .min = 0, .max = INT32_MAX,
     .seen_offset = offsetof(generate_args, set_top_k)},
    {.name = "seed", .kind = CMD_OPT_INT64, .value_name = "S",
     .help = "random seed for sampling", .default_text = "0",
     .offset = offsetof(generate_args, seed), .min = 0, .max = INT64_MAX},
    {.name = "chat", .kind = CMD_OPT_FLAG,
     .help = "wrap the prompt in the model's chat template as a user message, with the "
             "assistant's turn opened",
     .offset = offsetof(generate_args, chat)},
    {.name = "system", .kind = CMD_OPT_STRING, .io = CMD_IO_TEXT, .value_name = "TEXT",
     .help = "with --chat: a system message first", .offset = offsetof(generate_args, system)},
    {.name = "chat-template", .kind = CMD_OPT_STRING, .io = CMD_IO_TEXT, .value_name = "NAME",
     .help = "with --chat: a fixed renderer (mixtral, chatml, qwen3, olmoe) instead of the "
             "model's template as written, or jinja: that template, never a fallback",
     .offset = offsetof(generate_args, chat_template)},
    {.name = "ignore-eos", .kind = CMD_OPT_FLAG, .help = "do not stop at end-of-sequence tokens",
     .offset = offsetof(generate_args, ignore_eos)},
    CMD_BACKEND_OPTION(generate_args, backend),
    CMD_ACTIVATIONS_OPTION(generate_args, activations),
    {.name = "threads", .kind = CMD_OPT_INT32, .value_name = "N", .help = "CPU threads",
     .default_text = "all cores", .offset = offsetof(generate_args, threads), .min = 0,
     .max = 4096},
    {.name = "dump-logits", .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT, .value_name = "F.npy",
     .help = "write the logits of every generated token, float32 [generated, vocab], as a "
             "NumPy .npy file",
     .offset = offsetof(generate_args, dump_logits)},
    {.name = "json-schema", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "FILE",
     .help = "structured output: generate a JSON document of the JSON schema in FILE "
             "(docs/serving.md lists the keywords supported)",
     .offset = offsetof(generate_args, json_schema)},
    {.name = "json-object", .kind = CMD_OPT_FLAG,
     .help = "structured output: generate any JSON object (OpenAI's json_object)",
     .offset = offsetof(generate_args, json_object)},
    {.name = "json", .kind = CMD_OPT_FLAG,
     .help = "print one JSON object (ids, text, timings) instead of streaming",
     .offset = offsetof(generate_args, json)},
    CMD_OFFLOAD_OPTIONS(generate_args, off),
    {0},
};

static void init(void *base) {
    *(generate_args *)base = (generate_args){.max_new_tokens = 128, .top_p = 1.0,
                                             .activations = FMOE_ACTIVATIONS_AUTO};
    cmd_offload_args_init(&((generate_args *)base)->off);
}

const cmd_spec cmd_generate_spec = {
    .name = "generate",
    .usage = "generate [--model DIR|FILE.gguf [--tokenizer DIR]] --prompt TEXT [options]",
    .description =
        "Run one prompt through a HuggingFace MoE checkpoint on the CPU or a CUDA device\n"
        "(--backend) and stream the continuation to stdout; the backend, then prefill and\n"
        "decode tokens/s, go to stderr.\n",
    .options = generate_options,
    .size = sizeof(generate_args),
    .init = init,
};

static int parse_args(int argc, char **argv, generate_args *a) {
    int rc = cmd_options_parse(&cmd_generate_spec, a, argc, argv, NULL);
    if (rc) return rc;
    if (!a->prompt) return cmd_usage_error(CMD, "--prompt TEXT is required");
    if ((a->system || a->chat_template) && !a->chat)
        return cmd_usage_error(CMD, "--system and --chat-template need --chat");
    if (a->json_schema && a->json_object)
        return cmd_usage_error(CMD, "--json-schema and --json-object exclude each other");
    return cmd_check_chat_template(CMD, a->chat_template);
}

int cmd_generate(int argc, char **argv) {
    generate_args a;
    init(&a);
    int prc = parse_args(argc, argv, &a);
    if (prc < 0) return CMD_EXIT_OK; /* --help */
    if (prc > 0) return prc;
    fmoe_backend_kind backend;
    if ((prc = cmd_backend_resolve(CMD, a.backend, &backend)) != 0) return prc;
    if ((prc = cmd_activations_resolve(CMD, backend, &a.activations)) != 0) return prc;
    a.off.backend = backend;
    const char *dir = cmd_model_dir_or_default(CMD, a.model);
    if (!dir) return CMD_EXIT_FAILURE;
    const char *tok_dir = cmd_tokenizer_dir(CMD, dir, a.tokenizer);
    if (!tok_dir) return CMD_EXIT_USAGE;

    int rc = CMD_EXIT_FAILURE, err = 0;
    fmoe_model *m = NULL;
    fmoe_session *s = NULL;
    fmoe_tokenizer *tok = NULL;
    fmoe_sampler *smp = NULL;
    int32_t *prompt = NULL, *gen = NULL;
    float *logits = NULL;
    fmoe_json_schema *schema = NULL;
    fmoe_json_vocab *jvocab = NULL;
    fmoe_json_matcher *jm = NULL;
    uint8_t *allowed = NULL;
    char *schema_text = NULL;
    char *chat_text = NULL, *text = NULL;
    FILE *npy = NULL; /* on npy_partial, renamed to a.dump_logits when complete */
    char npy_partial[PATH_MAX + 16] = "";
    size_t n_prompt = 0, text_len = 0;
    cmd_offload off = {0};
    char offload_line[512];

    /* the schema first: a refused keyword costs no model load */
    if (a.json_schema) {
        size_t schema_len;
        if ((err = fmoe__read_file_bounded(a.json_schema, "a JSON schema", 16ll << 20, 0,
                                           &schema_text, &schema_len)) < 0)
            goto fail;
        if ((err = fmoe_json_schema_compile(schema_text, schema_len, &schema)) < 0) {
            fmoe_error_prefix("%s", a.json_schema);
            goto fail;
        }
    } else if (a.json_object && (err = fmoe_json_schema_any_object(&schema)) < 0) {
        goto fail;
    }
    if ((err = fmoe_model_load(dir, NULL, &m)) < 0) goto fail;
    if ((err = fmoe_tokenizer_load(tok_dir, &tok)) < 0) goto fail;
    cmd_generation_config gc;
    if ((err = cmd_generation_config_load(tok_dir, &gc)) < 0) goto fail;
    cmd_generation_config_add_stop(&gc, fmoe_tokenizer_eos_id(tok));
    const fmoe_model_geometry *g = fmoe_model_get_geometry(m);
    const int32_t V = g->vocab_size;

    /* Encode. */
    const char *ptext = a.prompt;
    size_t plen = strlen(a.prompt);
    if (a.chat) {
        fmoe_chat_message msgs[2];
        size_t nm = 0;
        if (a.system) msgs[nm++] = (fmoe_chat_message){.role = "system", .content = a.system};
        msgs[nm++] = (fmoe_chat_message){.role = "user", .content = a.prompt};
        fmoe_chat_options co = {.template_name = a.chat_template, .add_generation_prompt = 1};
        if ((err = fmoe_tokenizer_apply_chat_template(tok, msgs, nm, &co, &chat_text, &plen)) < 0)
            goto fail;
        ptext = chat_text;
    }
    if ((err = fmoe_tokenizer_encode_alloc(tok, ptext, plen, !a.chat, &prompt, &n_prompt)) < 0)
        goto fail;
    if (n_prompt == 0) {
        rc = cmd_failf(CMD, "the prompt encodes to no tokens");
        goto done;
    }
    const int64_t ctx = g->max_position_embeddings > 0 ? g->max_position_embeddings : 4096;
    if ((int64_t)n_prompt > ctx) {
        rc = cmd_failf(CMD, "prompt of %zu tokens exceeds the context of %lld tokens of %s",
                       n_prompt, (long long)ctx, dir);
        goto done;
    }
    /* The last generated token is never fed back, so a full context still yields one. */
    int64_t room = ctx - (int64_t)n_prompt + 1;
    int32_t max_new = a.max_new_tokens;
    if (max_new > room) max_new = (int32_t)room;

    /* Sampling: explicit options win, else generation_config.json. */
    fmoe_sampler_params sp = {0.0f, 0, 1.0f, (uint64_t)a.seed};
    if (gc.do_sample) {
        sp.temperature = gc.temperature;
        sp.top_p = gc.top_p;
        sp.top_k = gc.top_k;
    }
    if (a.set_temperature) sp.temperature = (float)a.temperature;
    if (a.set_top_p) sp.top_p = (float)a.top_p;
    if (a.set_top_k) sp.top_k = a.top_k;

    fmoe_session_options so = fmoe_session_defaults();
    so.backend = backend;
    int64_t need = (int64_t)n_prompt + (max_new > 0 ? max_new - 1 : 0);
    so.max_context = (int32_t)(need > 0 ? need : 1);
    so.threads = a.threads;
    so.activations = (fmoe_activations)a.activations;
    if ((rc = cmd_offload_open(CMD, &a.off, m, so.max_batch, a.json, &off)) != 0) goto done;
    rc = CMD_EXIT_FAILURE;
    if (off.x) fmoe_offload_attach(off.x, &so);
    if ((err = fmoe_session_init(m, &so, &s)) < 0) goto fail;
    if (off.x && (err = fmoe_offload_request_begin(off.x, 0, prompt, (int32_t)n_prompt)) < 0)
        goto fail;
    if ((err = fmoe_sampler_init(&sp, V, &smp)) < 0) goto fail;
    logits = malloc((size_t)V * sizeof *logits);
    gen = malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof *gen);
    if (!logits || !gen) {
        err = fmoe_error_set(FMOE_ENOMEM, "out of memory for %d logits", V);
        goto fail;
    }
    if (schema) {
        if ((err = fmoe_json_vocab_init(tok, gc.stop, gc.num_stop, &jvocab)) < 0 ||
            (err = fmoe_json_matcher_init(schema, jvocab, &jm)) < 0)
            goto fail;
        const int32_t vt = fmoe_json_vocab_size(jvocab);
        allowed = calloc((size_t)(vt > V ? vt : V), 1);
        if (!allowed) {
            err = fmoe_error_set(FMOE_ENOMEM, "out of memory for the JSON mask");
            goto fail;
        }
    }
    if (a.dump_logits) {
        snprintf(npy_partial, sizeof npy_partial, "%s.partial", a.dump_logits);
        if ((err = fmoe__partial_fopen(a.dump_logits, npy_partial, "wb+", &npy)) < 0) goto fail;
        /* interrupted: no .partial left (logits of half a generation are worth nothing) */
        const char *cleanup[] = {npy_partial};
        cmd_remove_on_signal(cleanup, 1);
        if (npy_write_header(npy, 0, V) < 0) {
            rc = cmd_failf(CMD, "%s: cannot write: %s", npy_partial, strerror(errno));
            goto done;
        }
    }

    streamer st = {.tok = tok, .out = a.json ? NULL : stdout};
    const char *finish = "length";
    int32_t n_gen = 0;
    int stop_token = 0; /* the last generated id is a stop token, not text */
    double t0 = cmd_now(), t_prefill = 0, t_decode = 0;
    if (max_new > 0) {
        if ((err = cmd_offload_forward(&off, s, prompt, (int32_t)n_prompt, FMOE_PHASE_PREFILL,
                                       NULL, logits)) < 0)
            goto fail;
        t_prefill = cmd_now() - t0;
        double t1 = cmd_now();
        for (;;) {
            /* structured output: a whole document with no end id to say so (a tokenizer
             * without EOS) ends here, before this step's logits are written */
            const int32_t admitted = jm ? fmoe_json_matcher_mask(jm, allowed) : 1;
            if (admitted == 0 && fmoe_json_matcher_is_complete(jm)) {
                finish = "stop";
                break;
            }
            if (admitted == 0) {
                rc = cmd_failf(CMD, "no token of the vocabulary continues the JSON document");
                goto done;
            }
            if (npy && fwrite(logits, sizeof *logits, (size_t)V, npy) != (size_t)V) {
                rc = cmd_failf(CMD, "%s: cannot write: %s", npy_partial, strerror(errno));
                goto done;
            }
            /* non-finite logits never come here: the forward pass stops on them (a
             * resident weight at load, an expert's where the hidden state enters the head) */
            if (jm) /* after --dump-logits took the raw logits */
                for (int32_t i = 0; i < V; i++)
                    if (!allowed[i]) logits[i] = -INFINITY;
            int32_t next = fmoe_sampler_sample(smp, logits);
            gen[n_gen++] = next;
            if (jm && !fmoe_json_matcher_is_end(jm, next) &&
                (err = fmoe_json_matcher_accept(jm, next)) < 0)
                goto fail;
            if ((!a.ignore_eos || jm) && cmd_generation_config_is_stop(&gc, next)) {
                finish = "stop";
                stop_token = 1;
                break;
            }
            if ((err = streamer_push(&st, gen, (size_t)n_gen, 0)) < 0) goto fail;
            if (n_gen >= max_new) break;
            if ((err = cmd_offload_forward(&off, s, &next, 1, FMOE_PHASE_DECODE, NULL,
                                           logits)) < 0)
                goto fail;
        }
        t_decode = cmd_now() - t1;
    }
    if ((err = streamer_push(&st, gen, (size_t)n_gen, 1)) < 0) goto fail;
    if (off.x && (err = fmoe_offload_request_end(off.x)) < 0) goto fail;
    cmd_offload_summary(&off, offload_line, sizeof offload_line);
    if (npy) {
        const int bad = npy_write_header(npy, n_gen, V) < 0 || ferror(npy);
        const int close_failed = fclose(npy) != 0;
        npy = NULL;
        if (bad || close_failed) {
            rc = cmd_failf(CMD, "%s: cannot write: %s", npy_partial, strerror(errno));
            unlink(npy_partial);
            goto done;
        }
        if ((err = fmoe__partial_commit(npy_partial, a.dump_logits)) < 0) { /* synced */
            unlink(npy_partial);
            goto fail;
        }
    }
    /* Decode steps: each generated token after the first is one forward of one token. */
    const int32_t steps = n_gen > 1 ? n_gen - 1 : 0;
    const double prefill_tps = t_prefill > 0 ? (double)n_prompt / t_prefill : 0.0;
    const double decode_tps = t_decode > 0 && steps > 0 ? steps / t_decode : 0.0;
    if (a.json) {
        size_t keep = (size_t)n_gen;
        if (stop_token) keep--; /* the stop token is not text */
        if ((err = fmoe_tokenizer_decode(tok, gen, keep, 1, &text, &text_len)) < 0) goto fail;
        printf("{\"model\": ");
        json_string(stdout, dir, strlen(dir));
        printf(", \"backend\": \"%s\", \"activations\": \"%s\"", fmoe_backend_name(backend),
               fmoe_activations_name(so.activations));
        if (backend == FMOE_BACKEND_CUDA) {
            char dev[160];
            cmd_cuda_device_name(fmoe_cuda_describe(), dev, sizeof dev);
            printf(", \"device\": ");
            json_string(stdout, dev, strlen(dev));
        }
        printf(", \"describe\": ");
        json_string(stdout, fmoe_model_describe(m), strlen(fmoe_model_describe(m)));
        printf(", \"prompt\": ");
        json_string(stdout, ptext, plen);
        printf(", \"prompt_ids\": ");
        json_ids(stdout, prompt, n_prompt);
        printf(", \"generated_ids\": ");
        json_ids(stdout, gen, (size_t)n_gen);
        printf(", \"text\": ");
        json_string(stdout, text, text_len);
        printf(", \"finish_reason\": \"%s\", \"temperature\": %g, \"top_p\": %g, \"top_k\": %d, "
               "\"seed\": %lld, \"prefill_tokens\": %zu, \"prefill_s\": %.6f, "
               "\"prefill_tok_s\": %.2f, \"decode_steps\": %d, \"decode_s\": %.6f, "
               "\"decode_tok_s\": %.2f",
               finish, sp.temperature, sp.top_p, sp.top_k, (long long)a.seed, n_prompt,
               t_prefill, prefill_tps, steps, t_decode, decode_tps);
        if (off.x) {
            fmoe_offload_stats os;
            fmoe_offload_get_stats(off.x, &os);
            printf(", \"offload\": {\"policy\": \"%s\", \"cache_experts\": %d, "
                   "\"accesses\": %lld, \"hits\": %lld, \"late_hits\": %lld, "
                   "\"misses\": %lld, \"host_misses\": %lld, \"prefetches\": %lld, "
                   "\"bytes_loaded\": %lld, \"awaited_bytes\": %lld, "
                   "\"awaited_bytes_decode\": %lld, \"wasted_prefetch_bytes\": %lld, "
                   "\"stall_s\": %.6f, \"io_bytes\": %lld, \"io_busy_s\": %.6f, "
                   "\"io_bytes_decode\": %lld, \"io_busy_s_decode\": %.6f}",
                   a.off.policy ? a.off.policy : "lru", fmoe_offload_capacity(off.x),
                   (long long)os.accesses, (long long)os.hits, (long long)os.late_hits,
                   (long long)os.misses, (long long)os.host_misses, (long long)os.prefetches,
                   (long long)os.bytes_loaded, (long long)os.awaited_bytes,
                   (long long)os.awaited_bytes_decode, (long long)os.wasted_prefetch_bytes,
                   os.stall_s, (long long)os.io_bytes, os.io_busy_s,
                   (long long)os.io_bytes_decode, os.io_busy_s_decode);
        }
        printf(", \"peak_rss_bytes\": %lld}\n", (long long)cmd_peak_rss_bytes());
    } else {
        printf("\n");
        fflush(stdout);
        /* with the figures, after the run: a failure before stays one line */
        cmd_backend_say(CMD, backend, a.activations);
        fprintf(stderr,
                "fmoe generate: prefill %zu tokens in %.3f s (%.1f tokens/s), decode %d tokens "
                "in %.3f s (%.1f tokens/s), stop: %s\n",
                n_prompt, t_prefill, prefill_tps, steps, t_decode, decode_tps, finish);
        if (off.x) fprintf(stderr, "fmoe generate: %s\n", offload_line);
    }
    rc = CMD_EXIT_OK;
    goto done;
fail:
    rc = cmd_fail(CMD, err);
done:
    if (npy) {
        fclose(npy);
        unlink(npy_partial); /* ours; a.dump_logits itself was never touched */
    }
    free(text);
    free(chat_text);
    free(prompt);
    free(gen);
    free(logits);
    free(allowed);
    free(schema_text);
    fmoe_json_matcher_free(jm);
    fmoe_json_vocab_free(jvocab);
    fmoe_json_schema_free(schema);
    fmoe_sampler_free(smp);
    fmoe_session_free(s);
    if (cmd_offload_close(CMD, &off, rc == CMD_EXIT_OK) && rc == CMD_EXIT_OK) rc = CMD_EXIT_FAILURE;
    fmoe_tokenizer_free(tok);
    fmoe_model_free(m);
    return rc;
}
