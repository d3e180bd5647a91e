/*
 * cmd_quantize.c - `fmoe quantize`: a HuggingFace MoE checkpoint -> a GGUF file with ggml
 * block formats (docs/quantization.md), so tests and users can make quantized models
 * without a download.
 *
 * defaults -> parse -> validate -> fmoe_quantize_model (OUTPUT.partial, progress bar,
 * renamed at the end; removed when interrupted) -> a short report.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cmd_common.h"
#include "fmoe/error.h"
#include "fmoe/quant.h"
#include "fmoe/quantize.h"
#include "paths.h"

static const char *const CMD = "quantize";

typedef struct options {
    int32_t type;
    const char *output;
    int experts_only;
    int quiet;
} options;

static const char *const type_names[] = {"q8_0", "q4_k", "q5_k", "q6_k", "q4_0",
                                         "q4_1", "q5_0", "q5_1", "iq4_nl", NULL};
static const int32_t type_values[] = {FMOE_GGML_Q8_0, FMOE_GGML_Q4_K, FMOE_GGML_Q5_K,
                                      FMOE_GGML_Q6_K, FMOE_GGML_Q4_0, FMOE_GGML_Q4_1,
                                      FMOE_GGML_Q5_0, FMOE_GGML_Q5_1, FMOE_GGML_IQ4_NL};

static const cmd_option quantize_options[] = {
    {.name = "type", .kind = CMD_OPT_ENUM, .value_name = "T",
     .help = "the block format of the quantized weights: q8_0, q4_k, q5_k, q6_k, q4_0, "
             "q4_1, q5_0, q5_1 or iq4_nl",
     .offset = offsetof(options, type), .choices = type_names, .choice_values = type_values,
     .example = "q4_k"},
    {.name = "output", .short_name = 'o', .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT,
     .value_name = "FILE",
     .help = "the GGUF file to write", .offset = offsetof(options, output)},
    {.name = "experts-only", .kind = CMD_OPT_FLAG,
     .help = "quantize only the routed experts; attention, embeddings, shared experts and "
             "the output head keep the checkpoint's dtype",
     .offset = offsetof(options, experts_only)},
    {.name = "quiet", .kind = CMD_OPT_FLAG, .help = "no progress bar",
     .offset = offsetof(options, quiet)},
    {0},
};

static void init(void *base) {
    options *o = base;
    memset(o, 0, sizeof *o);
    o->type = -1;
}

const cmd_spec cmd_quantize_spec = {
    .name = "quantize",
    .usage = "quantize --type q8_0|q4_k|q5_k|q6_k|q4_0|q4_1|q5_0|q5_1|iq4_nl MODEL_DIR "
             "-o MODEL.gguf [--experts-only]",
    .description =
        "Write a HuggingFace MoE checkpoint (config.json + safetensors of Mixtral,\n"
        "Qwen2-MoE, Qwen3-MoE, OLMoE or DeepSeek-MoE V1) as a GGUF file, named and laid\n"
        "out as llama.cpp's converter does, with its 2-D weights in a ggml block format\n"
        "(norms and routers stay F32).\n",
    .options = quantize_options,
    .epilog = "A tensor whose rows are not whole blocks of the type (256 values for the\n"
              "K-quants) falls back as llama-quantize's does: q4_k to Q5_0, q5_k to Q5_1,\n"
              "q6_k to Q8_0 when its rows are whole blocks of 32, else the checkpoint's\n"
              "dtype; the report counts them. generate, record and serve\n"
              "run the file with --model FILE.gguf on the CPU backend; the folder's\n"
              "tokenizer and generation files are embedded (docs/quantization.md).\n",
    .size = sizeof(options),
    .init = init,
    .max_positional = 1,
};

int cmd_quantize(int argc, char **argv) {
    options o;
    init(&o);
    int npos = 0;
    int rc = cmd_options_parse(&cmd_quantize_spec, &o, argc, argv, &npos);
    if (rc) return rc == CMD_OPTIONS_HELP ? CMD_EXIT_OK : rc;
    if (npos != 1) return cmd_usage_error(CMD, "one MODEL_DIR is required");
    if (o.type < 0) return cmd_usage_error(CMD, "--type is required (q8_0, q4_k, q5_k, q6_k, q4_0, "
                                               "q4_1, q5_0, q5_1 or iq4_nl)");
    if (!o.output) return cmd_usage_error(CMD, "-o MODEL.gguf is required");
    const char *model = argv[1];

    char partial[4200];
    snprintf(partial, sizeof partial, "%s.partial", o.output);
    const char *cleanup[] = {partial};
    cmd_remove_on_signal(cleanup, 1);
    cmd_progress_bar bar;
    cmd_progress_bar_init(&bar, "quantizing", o.quiet);
    const double t0 = cmd_now();
    const fmoe_quantize_params p = {.model_dir = model,
                                    .output = o.output,
                                    .type = (uint32_t)o.type,
                                    .experts_only = o.experts_only,
                                    .progress = cmd_progress_bar_callback(&bar)};
    fmoe_quantize_report r;
    rc = fmoe_quantize_model(&p, &r);
    cmd_progress_bar_done(&bar);
    if (rc < 0) return cmd_fail(CMD, rc);
    char in[32], out[32];
    printf("%s: %s, %lld tensors in %.1f s\n", o.output, r.arch, (long long)r.tensors,
           cmd_now() - t0);
    printf("  %-10s %lld tensors %s\n", fmoe_ggml_type_name((uint32_t)o.type),
           (long long)r.quantized, o.experts_only ? "(routed experts only)" : "(2-D weights)");
    if (r.fallback) {
        /* the type llama-quantize falls back to for rows of 32k values, if any */
        const uint32_t f = fmoe_quant_fallback_type((uint32_t)o.type, FMOE_QK8_0);
        printf("  fallback   %lld tensors whose rows are not whole %s blocks: %s%s\n",
               (long long)r.fallback, fmoe_ggml_type_name((uint32_t)o.type),
               f ? fmoe_ggml_type_name(f) : "kept in the checkpoint's dtype",
               f ? ", or the checkpoint's dtype" : "");
    }
    printf("  size       %s of weights -> %s file\n", cmd_format_bytes((double)r.bytes_in, in, sizeof in),
           cmd_format_bytes((double)r.bytes_out, out, sizeof out));
    return CMD_EXIT_OK;
}
