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

/* One run's state, owned here and freed by generation_close: each step below fills its
 * part and returns 0, or the exit code (a failure already printed in one line). */
typedef struct generation {
    const generate_args *a;
    fmoe_backend_kind backend;
    const char *dir;
    fmoe_model *m;
    fmoe_session *s;
    fmoe_tokenizer *tok;
    fmoe_sampler *smp;
    cmd_generation_config gc;
    fmoe_session_options so;
    fmoe_sampler_params sp;
    int32_t V, max_new;
    int32_t *prompt, *gen;
    size_t n_prompt;
    const char *ptext; /* the prompt as encoded: a.prompt, or chat_text */
    size_t plen;
    float *logits;
    fmoe_json_schema *schema;
    fmoe_json_vocab *jvocab;
    fmoe_json_matcher *jm;
    uint8_t *allowed;
    char *schema_text, *chat_text, *text;
    size_t text_len;
    FILE *npy; /* on npy_partial, renamed to a.dump_logits when complete */
    char npy_partial[PATH_MAX + 16];
    cmd_offload off;
    char offload_line[512];
    /* the run's outcome */
    const char *finish;
    int32_t n_gen;
    int stop_token; /* the last generated id is a stop token, not text */
    double t_prefill, t_decode;
} generation;

/* The schema first: a refused keyword costs no model load. */
static int load_schema(generation *r) {
    int err = 0;
    if (r->a->json_schema) {
        size_t schema_len;
        if ((err = fmoe__read_file_bounded(r->a->json_schema, "a JSON schema", 16ll << 20, 0,
                                           &r->schema_text, &schema_len)) < 0)
            return cmd_fail(CMD, err);
        if ((err = fmoe_json_schema_compile(r->schema_text, schema_len, &r->schema)) < 0) {
            fmoe_error_prefix("%s", r->a->json_schema);
            return cmd_fail(CMD, err);
        }
    } else if (r->a->json_object && (err = fmoe_json_schema_any_object(&r->schema)) < 0) {
        return cmd_fail(CMD, err);
    }
    return 0;
}

/* Model, tokenizer and generation_config.json (whose stop ids gain the tokenizer's EOS). */
static int load_model(generation *r, const char *tok_dir) {
    int err;
    if ((err = fmoe_model_load(r->dir, NULL, &r->m)) < 0) return cmd_fail(CMD, err);
    if ((err = fmoe_tokenizer_load(tok_dir, &r->tok)) < 0) return cmd_fail(CMD, err);
    if ((err = cmd_generation_config_load(tok_dir, &r->gc)) < 0) return cmd_fail(CMD, err);
    cmd_generation_config_add_stop(&r->gc, fmoe_tokenizer_eos_id(r->tok));
    r->V = fmoe_model_get_geometry(r->m)->vocab_size;
    return 0;
}

/* The prompt's ids (through the chat template with --chat), and how many tokens the
 * context leaves to generate. */
static int encode_prompt(generation *r) {
    const generate_args *a = r->a;
    const fmoe_model_geometry *g = fmoe_model_get_geometry(r->m);
    int err;
    r->ptext = a->prompt;
    r->plen = strlen(a->prompt);
    if (a->chat) {
        fmoe_chat_message msgs[2];
        size_t nm = 0;
        if (a->system) msgs[nm++] = (fmoe_chat_message){.role = "system", .content = a->system};
        msgs[nm++] = (fmoe_chat_message){.role = "user", .content = a->prompt};
        fmoe_chat_options co = {.template_name = a->chat_template, .add_generation_prompt = 1};
        if ((err = fmoe_tokenizer_apply_chat_template(r->tok, msgs, nm, &co, &r->chat_text,
                                                      &r->plen)) < 0)
            return cmd_fail(CMD, err);
        r->ptext = r->chat_text;
    }
    if ((err = fmoe_tokenizer_encode_alloc(r->tok, r->ptext, r->plen, !a->chat, &r->prompt,
                                           &r->n_prompt)) < 0)
        return cmd_fail(CMD, err);
    if (r->n_prompt == 0) return cmd_failf(CMD, "the prompt encodes to no tokens");
    const int64_t ctx = g->max_position_embeddings > 0 ? g->max_position_embeddings : 4096;
    if ((int64_t)r->n_prompt > ctx)
        return cmd_failf(CMD, "prompt of %zu tokens exceeds the context of %lld tokens of %s",
                         r->n_prompt, (long long)ctx, r->dir);
    /* The last generated token is never fed back, so a full context still yields one. */
    int64_t room = ctx - (int64_t)r->n_prompt + 1;
    r->max_new = a->max_new_tokens;
    if (r->max_new > room) r->max_new = (int32_t)room;
    return 0;
}

/* Sampling: explicit options win, else generation_config.json. */
static void choose_sampling(generation *r) {
    const generate_args *a = r->a;
    r->sp = (fmoe_sampler_params){0.0f, 0, 1.0f, (uint64_t)a->seed};
    if (r->gc.do_sample) {
        r->sp.temperature = r->gc.temperature;
        r->sp.top_p = r->gc.top_p;
        r->sp.top_k = r->gc.top_k;
    }
    if (a->set_temperature) r->sp.temperature = (float)a->temperature;
    if (a->set_top_p) r->sp.top_p = (float)a->top_p;
    if (a->set_top_k) r->sp.top_k = a->top_k;
}

/* The offload executor (with --cache-*), the session sized for prompt and continuation,
 * the sampler, the buffers and, with a schema, the JSON matcher and its mask. */
static int open_session(generation *r, cmd_offload_args *off_args) {
    const generate_args *a = r->a;
    int err, rc;
    r->so = fmoe_session_defaults();
    r->so.backend = r->backend;
    int64_t need = (int64_t)r->n_prompt + (r->max_new > 0 ? r->max_new - 1 : 0);
    r->so.max_context = (int32_t)(need > 0 ? need : 1);
    r->so.threads = a->threads;
    r->so.activations = (fmoe_activations)a->activations;
    if ((rc = cmd_offload_open(CMD, off_args, r->m, r->so.max_batch, a->json, &r->off)) != 0)
        return rc;
    if (r->off.x) fmoe_offload_attach(r->off.x, &r->so);
    if ((err = fmoe_session_init(r->m, &r->so, &r->s)) < 0) return cmd_fail(CMD, err);
    if (r->off.x &&
        (err = fmoe_offload_request_begin(r->off.x, 0, r->prompt, (int32_t)r->n_prompt)) < 0)
        return cmd_fail(CMD, err);
    if ((err = fmoe_sampler_init(&r->sp, r->V, &r->smp)) < 0) return cmd_fail(CMD, err);
    r->logits = malloc((size_t)r->V * sizeof *r->logits);
    r->gen = malloc((size_t)(r->max_new > 0 ? r->max_new : 1) * sizeof *r->gen);
    if (!r->logits || !r->gen)
        return cmd_fail(CMD, fmoe_error_set(FMOE_ENOMEM, "out of memory for %d logits", r->V));
    if (r->schema) {
        if ((err = fmoe_json_vocab_init(r->tok, r->gc.stop, r->gc.num_stop, &r->jvocab)) < 0 ||
            (err = fmoe_json_matcher_init(r->schema, r->jvocab, &r->jm)) < 0)
            return cmd_fail(CMD, err);
        const int32_t vt = fmoe_json_vocab_size(r->jvocab);
        r->allowed = calloc((size_t)(vt > r->V ? vt : r->V), 1);
        if (!r->allowed)
            return cmd_fail(CMD, fmoe_error_set(FMOE_ENOMEM, "out of memory for the JSON mask"));
    }
    return 0;
}

/* --dump-logits: the .partial file with a header for 0 rows. */
static int open_logits_dump(generation *r) {
    const char *path = r->a->dump_logits;
    int err;
    if (!path) return 0;
    snprintf(r->npy_partial, sizeof r->npy_partial, "%s.partial", path);
    if ((err = fmoe__partial_fopen(path, r->npy_partial, "wb+", &r->npy)) < 0)
        return cmd_fail(CMD, err);
    /* interrupted: no .partial left (logits of half a generation are worth nothing) */
    const char *cleanup[] = {r->npy_partial};
    cmd_remove_on_signal(cleanup, 1);
    if (npy_write_header(r->npy, 0, r->V) < 0)
        return cmd_failf(CMD, "%s: cannot write: %s", r->npy_partial, strerror(errno));
    return 0;
}

/* Prefill, then sample and decode until a stop token, a whole JSON document or max_new
 * tokens, streaming the text (without --json) and writing each step's logits. */
static int run_generation(generation *r) {
    const generate_args *a = r->a;
    const int32_t V = r->V;
    int err;
    streamer st = {.tok = r->tok, .out = a->json ? NULL : stdout};
    r->finish = "length";
    double t0 = cmd_now();
    if (r->max_new > 0) {
        if ((err = cmd_offload_forward(&r->off, r->s, r->prompt, (int32_t)r->n_prompt,
                                       FMOE_PHASE_PREFILL, NULL, r->logits)) < 0)
            return cmd_fail(CMD, err);
        r->t_prefill = cmd_now() - t0;
        double t1 = cmd_now();
        for (;;) {
            /* structured output: a whole document with no end id to say so (a tokenizer
             * without EOS) ends here, before this step's logits are written */
            const int32_t admitted = r->jm ? fmoe_json_matcher_mask(r->jm, r->allowed) : 1;
            if (admitted == 0 && fmoe_json_matcher_is_complete(r->jm)) {
                r->finish = "stop";
                break;
            }
            if (admitted == 0)
                return cmd_failf(CMD, "no token of the vocabulary continues the JSON document");
            if (r->npy && fwrite(r->logits, sizeof *r->logits, (size_t)V, r->npy) != (size_t)V)
                return cmd_failf(CMD, "%s: cannot write: %s", r->npy_partial, strerror(errno));
            /* non-finite logits never come here: the forward pass stops on them (a
             * resident weight at load, an expert's where the hidden state enters the head) */
            if (r->jm) /* after --dump-logits took the raw logits */
                for (int32_t i = 0; i < V; i++)
                    if (!r->allowed[i]) r->logits[i] = -INFINITY;
            int32_t next = fmoe_sampler_sample(r->smp, r->logits);
            r->gen[r->n_gen++] = next;
            if (r->jm && !fmoe_json_matcher_is_end(r->jm, next) &&
                (err = fmoe_json_matcher_accept(r->jm, next)) < 0)
                return cmd_fail(CMD, err);
            if ((!a->ignore_eos || r->jm) && cmd_generation_config_is_stop(&r->gc, next)) {
                r->finish = "stop";
                r->stop_token = 1;
                break;
            }
            if ((err = streamer_push(&st, r->gen, (size_t)r->n_gen, 0)) < 0)
                return cmd_fail(CMD, err);
            if (r->n_gen >= r->max_new) break;
            if ((err = cmd_offload_forward(&r->off, r->s, &next, 1, FMOE_PHASE_DECODE, NULL,
                                           r->logits)) < 0)
                return cmd_fail(CMD, err);
        }
        r->t_decode = cmd_now() - t1;
    }
    if ((err = streamer_push(&st, r->gen, (size_t)r->n_gen, 1)) < 0) return cmd_fail(CMD, err);
    if (r->off.x && (err = fmoe_offload_request_end(r->off.x)) < 0) return cmd_fail(CMD, err);
    cmd_offload_summary(&r->off, r->offload_line, sizeof r->offload_line);
    return 0;
}

/* --dump-logits: the header rewritten with the rows written, the file synced and renamed
 * from .partial to its name. */
static int finish_logits_dump(generation *r) {
    int err;
    if (!r->npy) return 0;
    const int bad = npy_write_header(r->npy, r->n_gen, r->V) < 0 || ferror(r->npy);
    const int close_failed = fclose(r->npy) != 0;
    r->npy = NULL;
    if (bad || close_failed) {
        int rc = cmd_failf(CMD, "%s: cannot write: %s", r->npy_partial, strerror(errno));
        unlink(r->npy_partial);
        return rc;
    }
    if ((err = fmoe__partial_commit(r->npy_partial, r->a->dump_logits)) < 0) { /* synced */
        unlink(r->npy_partial);
        return cmd_fail(CMD, err);
    }
    return 0;
}

/* --json: one object with the ids, the text, the timings and the offload counters. */
static int print_json_result(generation *r, double prefill_tps, int32_t steps,
                             double decode_tps) {
    int err;
    size_t keep = (size_t)r->n_gen;
    if (r->stop_token) keep--; /* the stop token is not text */
    if ((err = fmoe_tokenizer_decode(r->tok, r->gen, keep, 1, &r->text, &r->text_len)) < 0)
        return cmd_fail(CMD, err);
    printf("{\"model\": ");
    json_string(stdout, r->dir, strlen(r->dir));
    printf(", \"backend\": \"%s\", \"activations\": \"%s\"", fmoe_backend_name(r->backend),
           fmoe_activations_name(r->so.activations));
    if (r->backend == FMOE_BACKEND_CUDA) {
        char dev[160];
        cmd_cuda_device_name(fmoe_cuda_describe(), dev, sizeof dev);
        printf(", \"device\": ");
        json_string(stdout, dev, strlen(dev));
    }
    printf(", \"describe\": ");
    json_string(stdout, fmoe_model_describe(r->m), strlen(fmoe_model_describe(r->m)));
    printf(", \"prompt\": ");
    json_string(stdout, r->ptext, r->plen);
    printf(", \"prompt_ids\": ");
    json_ids(stdout, r->prompt, r->n_prompt);
    printf(", \"generated_ids\": ");
    json_ids(stdout, r->gen, (size_t)r->n_gen);
    printf(", \"text\": ");
    json_string(stdout, r->text, r->text_len);
    printf(", \"finish_reason\": \"%s\", \"temperature\": %g, \"top_p\": %g, \"top_k\": %d, "
           "\"seed\": %lld, \"prefill_tokens\": %zu, \"prefill_s\": %.6f, "
           "\"prefill_tok_s\": %.2f, \"decode_steps\": %d, \"decode_s\": %.6f, "
           "\"decode_tok_s\": %.2f",
           r->finish, r->sp.temperature, r->sp.top_p, r->sp.top_k, (long long)r->a->seed,
           r->n_prompt, r->t_prefill, prefill_tps, steps, r->t_decode, decode_tps);
    if (r->off.x) {
        fmoe_offload_stats os;
        fmoe_offload_get_stats(r->off.x, &os);
        printf(", \"offload\": {\"policy\": \"%s\", \"cache_experts\": %d, "
               "\"accesses\": %lld, \"hits\": %lld, \"late_hits\": %lld, "
               "\"misses\": %lld, \"host_misses\": %lld, \"prefetches\": %lld, "
               "\"bytes_loaded\": %lld, \"awaited_bytes\": %lld, "
               "\"awaited_bytes_decode\": %lld, \"wasted_prefetch_bytes\": %lld, "
               "\"stall_s\": %.6f, \"io_bytes\": %lld, \"io_busy_s\": %.6f, "
               "\"io_bytes_decode\": %lld, \"io_busy_s_decode\": %.6f}",
               r->a->off.policy ? r->a->off.policy : "lru", fmoe_offload_capacity(r->off.x),
               (long long)os.accesses, (long long)os.hits, (long long)os.late_hits,
               (long long)os.misses, (long long)os.host_misses, (long long)os.prefetches,
               (long long)os.bytes_loaded, (long long)os.awaited_bytes,
               (long long)os.awaited_bytes_decode, (long long)os.wasted_prefetch_bytes,
               os.stall_s, (long long)os.io_bytes, os.io_busy_s,
               (long long)os.io_bytes_decode, os.io_busy_s_decode);
    }
    printf(", \"peak_rss_bytes\": %lld}\n", (long long)cmd_peak_rss_bytes());
    return 0;
}

/* The result: the JSON object, or the newline after the streamed text and the figures on
 * stderr (after the run, so that a failure before stays one line). */
static int report(generation *r) {
    /* Decode steps: each generated token after the first is one forward of one token. */
    const int32_t steps = r->n_gen > 1 ? r->n_gen - 1 : 0;
    const double prefill_tps = r->t_prefill > 0 ? (double)r->n_prompt / r->t_prefill : 0.0;
    const double decode_tps = r->t_decode > 0 && steps > 0 ? steps / r->t_decode : 0.0;
    if (r->a->json) return print_json_result(r, prefill_tps, steps, decode_tps);
    printf("\n");
    fflush(stdout);
    cmd_backend_say(CMD, r->backend, r->a->activations);
    fprintf(stderr,
            "fmoe generate: prefill %zu tokens in %.3f s (%.1f tokens/s), decode %d tokens "
            "in %.3f s (%.1f tokens/s), stop: %s\n",
            r->n_prompt, r->t_prefill, prefill_tps, steps, r->t_decode, decode_tps, r->finish);
    if (r->off.x) fprintf(stderr, "fmoe generate: %s\n", r->offload_line);
    return 0;
}

/* Frees what the steps made; rc is the run's exit code so far, returned, or a failure
 * when closing the offload executor fails after a successful run. */
static int generation_close(generation *r, int rc) {
    if (r->npy) {
        fclose(r->npy);
        unlink(r->npy_partial); /* ours; a.dump_logits itself was never touched */
    }
    free(r->text);
    free(r->chat_text);
    free(r->prompt);
    free(r->gen);
    free(r->logits);
    free(r->allowed);
    free(r->schema_text);
    fmoe_json_matcher_free(r->jm);
    fmoe_json_vocab_free(r->jvocab);
    fmoe_json_schema_free(r->schema);
    fmoe_sampler_free(r->smp);
    fmoe_session_free(r->s);
    if (cmd_offload_close(CMD, &r->off, rc == CMD_EXIT_OK) && rc == CMD_EXIT_OK)
        rc = CMD_EXIT_FAILURE;
    fmoe_tokenizer_free(r->tok);
    fmoe_model_free(r->m);
    return rc;
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

    generation r = {.a = &a, .backend = backend, .dir = dir};
    int rc;
    if ((rc = load_schema(&r)) == 0 && (rc = load_model(&r, tok_dir)) == 0 &&
        (rc = encode_prompt(&r)) == 0) {
        choose_sampling(&r);
        if ((rc = open_session(&r, &a.off)) == 0 && (rc = open_logits_dump(&r)) == 0 &&
            (rc = run_generation(&r)) == 0 && (rc = finish_logits_dump(&r)) == 0)
            rc = report(&r);
    }
    return generation_close(&r, rc);
}
