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
    int32_t experts_type;
    const char *output;
    const char *imatrix;
    int experts_only;
    int quiet;
} options;

/* --type: a block type (every quantised tensor in it) or a mix llama-quantize names
 * (MIX + fmoe_quant_mix: per-tensor types). q2_k is a mix, as llama-quantize's Q2_K is. */
#define MIX 1000
/* EXPERTS_ONLY + t: IQ2_XXS, IQ2_XS, IQ1_S and IQ1_M as --type, named so that they are
 * refused in one line saying why, not as unknown words: their quantiser needs an
 * importance matrix, which has no entry for the token embeddings; they are written for
 * the routed experts (--experts-type with --imatrix). */
#define EXPERTS_ONLY 3000
static const char *const type_names[] = {
    "q8_0", "q4_k", "q5_k", "q6_k", "q3_k", "iq4_xs", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl",
    "q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "f32", "f16",
    "bf16", "iq3_xxs", "iq3_s", "iq2_s", "iq2_xxs", "iq2_xs", "iq1_s", "iq1_m", NULL};
static const int32_t type_values[] = {
    FMOE_GGML_Q8_0, FMOE_GGML_Q4_K, FMOE_GGML_Q5_K, FMOE_GGML_Q6_K, FMOE_GGML_Q3_K,
    FMOE_GGML_IQ4_XS, FMOE_GGML_Q4_0, FMOE_GGML_Q4_1, FMOE_GGML_Q5_0, FMOE_GGML_Q5_1,
    FMOE_GGML_IQ4_NL, MIX + FMOE_MIX_Q2_K, MIX + FMOE_MIX_Q3_K_S, MIX + FMOE_MIX_Q3_K_M,
    MIX + FMOE_MIX_Q3_K_L, MIX + FMOE_MIX_Q4_K_S, MIX + FMOE_MIX_Q4_K_M, MIX + FMOE_MIX_Q5_K_S,
    MIX + FMOE_MIX_Q5_K_M, FMOE_GGML_F32, FMOE_GGML_F16, FMOE_GGML_BF16, FMOE_GGML_IQ3_XXS,
    FMOE_GGML_IQ3_S, FMOE_GGML_IQ2_S, EXPERTS_ONLY + FMOE_GGML_IQ2_XXS,
    EXPERTS_ONLY + FMOE_GGML_IQ2_XS, EXPERTS_ONLY + FMOE_GGML_IQ1_S,
    EXPERTS_ONLY + FMOE_GGML_IQ1_M};

/* --experts-type: block types only (here q2_k is the Q2_K type itself). */
static const char *const expert_type_names[] = {
    "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs", "q4_0", "q4_1", "q5_0", "q5_1",
    "iq4_nl", "mxfp4", "iq3_xxs", "iq3_s", "iq2_s", "iq2_xxs", "iq2_xs", "iq1_s", "iq1_m",
    NULL};
static const int32_t expert_type_values[] = {
    FMOE_GGML_Q8_0, FMOE_GGML_Q2_K, FMOE_GGML_Q3_K, FMOE_GGML_Q4_K, FMOE_GGML_Q5_K,
    FMOE_GGML_Q6_K, FMOE_GGML_IQ4_XS, FMOE_GGML_Q4_0, FMOE_GGML_Q4_1, FMOE_GGML_Q5_0,
    FMOE_GGML_Q5_1, FMOE_GGML_IQ4_NL, FMOE_GGML_MXFP4, FMOE_GGML_IQ3_XXS, FMOE_GGML_IQ3_S,
    FMOE_GGML_IQ2_S, FMOE_GGML_IQ2_XXS, FMOE_GGML_IQ2_XS, FMOE_GGML_IQ1_S, FMOE_GGML_IQ1_M};

/* The i-quants llama-quantize refuses without an importance matrix although its quantiser
 * runs without one (src/llama-quant.cpp, tensor_requires_imatrix: IQ3_XXS and IQ2_S, but
 * not IQ3_S); fmoe writes them, the blocks llama.cpp's quantiser makes without one, and
 * says so (docs/quantization.md, "The i-quant quantisers"). */
static int llama_quantize_wants_imatrix(int32_t t) {
    return t == FMOE_GGML_IQ3_XXS || t == FMOE_GGML_IQ2_S;
}

static const cmd_option quantize_options[] = {
    {.name = "type", .kind = CMD_OPT_ENUM, .value_name = "T",
     .help = "a mix by llama-quantize's name (q2_k, q3_k_s, q3_k_m, q3_k_l, q4_k_s, "
             "q4_k_m, q5_k_s, q5_k_m: more bits where llama.cpp puts them), or one block "
             "format for every quantized tensor (q8_0, q3_k, q4_k, q5_k, q6_k, iq4_xs, "
             "q4_0, q4_1, q5_0, q5_1, iq4_nl, iq3_xxs, iq3_s, iq2_s), or a float type for every "
             "matrix (f32, f16, bf16: a conversion, nothing quantized)",
     .offset = offsetof(options, type), .choices = type_names, .choice_values = type_values,
     .example = "q4_k_m"},
    {.name = "experts-type", .kind = CMD_OPT_ENUM, .value_name = "T",
     .help = "the block format of the routed experts (q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, "
             "iq4_xs, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, iq3_xxs, iq3_s, iq2_s; with "
             "--imatrix also iq2_xs, iq2_xxs, iq1_s, iq1_m); every other tensor as --type says",
     .offset = offsetof(options, experts_type), .choices = expert_type_names,
     .choice_values = expert_type_values, .example = "q3_k"},
    {.name = "output", .short_name = 'o', .kind = CMD_OPT_STRING, .io = CMD_IO_OUTPUT,
     .value_name = "FILE",
     .help = "the GGUF file to write", .offset = offsetof(options, output)},
    {.name = "imatrix", .kind = CMD_OPT_STRING, .io = CMD_IO_INPUT, .value_name = "FILE",
     .help = "llama.cpp's importance matrix (llama-imatrix's GGUF file) for the tensors in "
             "iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs or iq3_s, as llama-quantize uses it; "
             "the other types' quantizers here do not use one (the report counts those "
             "tensors)",
     .offset = offsetof(options, imatrix)},
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
    o->experts_type = -1;
}

const cmd_spec cmd_quantize_spec = {
    .name = "quantize",
    .usage = "quantize --type MIX|TYPE MODEL_DIR -o MODEL.gguf [--experts-type TYPE] "
             "[--imatrix FILE] [--experts-only]",
    .description =
        "Write a HuggingFace MoE checkpoint (config.json + safetensors of Mixtral,\n"
        "Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-MoE V1/V2/V3, GLM-4.5, gpt-oss (float or\n"
        "MXFP4 experts), Phi-3.5-MoE or Llama 4's text model) as a GGUF file, named and\n"
        "laid out as llama.cpp's converter does, with its 2-D weights in a ggml block\n"
        "format (norms and routers stay F32; gpt-oss's MXFP4 experts are copied as is).\n",
    .options = quantize_options,
    .epilog = "A mix chooses each tensor's type as llama-quantize does for that name: for\n"
              "q4_k_m, Q6_K for the output head and for ffn_down and attn_v of the first\n"
              "and last eighth of the layers and every third between, Q4_K elsewhere;\n"
              "attn_v and attn_k in Q8_0 in models of 8 experts (docs/quantization.md has\n"
              "the table). --experts-type sets the routed experts apart: they are what an\n"
              "offloaded model moves, so their type sets its speed; e.g. --type q4_k_m\n"
              "--experts-type q3_k, or --experts-type iq3_s for the 3.44-bit i-quant.\n"
              "iq3_xxs and iq2_s without --imatrix are the blocks llama.cpp's quantizer\n"
              "makes without an importance matrix; llama-quantize itself refuses them\n"
              "without one (a note on stderr says so). iq2_xxs, iq2_xs, iq1_s and iq1_m\n"
              "are written for the routed experts with --imatrix (--experts-type iq2_xxs\n"
              "--imatrix FILE).\n"
              "A tensor whose rows are not whole blocks of its type (256 values for the\n"
              "K-quants, iq4_xs and the i-quants) falls back as llama-quantize's does: Q4_K\n"
              "to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, Q2_K/Q3_K/IQ4_XS and the i-quants to\n"
              "IQ4_NL when its rows are whole blocks of 32, else the checkpoint's dtype;\n"
              "the report counts them.\n"
              "generate, record and serve\n"
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
    if (o.type < 0) return cmd_usage_error(CMD, "--type is required (a mix such as q4_k_m, or a "
                                               "block type such as q4_k)");
    if (!o.output) return cmd_usage_error(CMD, "-o MODEL.gguf is required");
    const int32_t asked[2] = {o.type, o.experts_type}; /* for the note below */
    if (o.type >= EXPERTS_ONLY) {
        const char *name = fmoe_ggml_type_name((uint32_t)(o.type - EXPERTS_ONLY));
        return cmd_usage_error(CMD,
                               "--type %s: written only for the routed experts (--experts-type "
                               "%s --imatrix FILE), as its quantizer needs an importance matrix",
                               name, name);
    }
    if (o.experts_type > 0 && fmoe_quant_needs_importance((uint32_t)o.experts_type) && !o.imatrix)
        return cmd_usage_error(CMD,
                               "--experts-type %s needs --imatrix FILE (llama.cpp's quantizer "
                               "requires an importance matrix for it)",
                               fmoe_ggml_type_name((uint32_t)o.experts_type));
    for (int i = 0; i < 2 && !o.imatrix; i++)
        if (llama_quantize_wants_imatrix(asked[i]))
            fprintf(stderr,
                    "%s: note: llama-quantize refuses %s without an importance matrix "
                    "(--imatrix); these are the blocks its quantizer makes without one "
                    "(docs/quantization.md)\n",
                    CMD, fmoe_ggml_type_name((uint32_t)asked[i]));
    const char *model = argv[1];
    const fmoe_quant_mix mix = o.type >= MIX ? (fmoe_quant_mix)(o.type - MIX) : FMOE_MIX_NONE;

    char partial[4200];
    snprintf(partial, sizeof partial, "%s.partial", o.output);
    const char *cleanup[] = {partial};
    cmd_remove_on_signal(cleanup, 1);
    cmd_progress_bar bar;
    cmd_progress_bar_init(&bar, "quantizing", o.quiet);
    const double t0 = cmd_now();
    const fmoe_quantize_params p = {.model_dir = model,
                                    .output = o.output,
                                    .type = mix ? 0 : (uint32_t)o.type,
                                    .mix = mix,
                                    .experts_type =
                                        o.experts_type < 0 ? 0 : (uint32_t)o.experts_type,
                                    .experts_only = o.experts_only,
                                    .imatrix = o.imatrix,
                                    .progress = cmd_progress_bar_callback(&bar)};
    fmoe_quantize_report r;
    rc = fmoe_quantize_model(&p, &r);
    cmd_progress_bar_done(&bar);
    if (rc < 0) return cmd_fail(CMD, rc);
    char in[32], out[32];
    printf("%s: %s, %lld tensors in %.1f s (%s%s%s)\n", o.output, r.arch, (long long)r.tensors,
           cmd_now() - t0, mix ? fmoe_quant_mix_name(mix) : fmoe_ggml_type_name((uint32_t)o.type),
           p.experts_type ? ", experts " : "",
           p.experts_type ? fmoe_ggml_type_name(p.experts_type) : "");
    for (uint32_t t = 0; t < FMOE_GGML_TYPE_END; t++)
        if (r.by_type[t])
            printf("  %-10s %lld tensors\n", fmoe_ggml_type_name(t), (long long)r.by_type[t]);
    if (r.fallback)
        printf("  fallback   %lld tensors whose rows are not whole blocks of their type (in a "
               "32-value type or the checkpoint's dtype)\n",
               (long long)r.fallback);
    if (o.imatrix)
        printf("  imatrix    %lld tensors weighed by it, %lld quantized without it in a type "
               "whose quantizer here uses none (llama-quantize would use it), %lld in an "
               "i-quant with no entry in it\n",
               (long long)r.importance_used, (long long)r.importance_ignored,
               (long long)r.importance_missing);
    printf("  size       %s of weights -> %s file\n", cmd_format_bytes((double)r.bytes_in, in, sizeof in),
           cmd_format_bytes((double)r.bytes_out, out, sizeof out));
    return CMD_EXIT_OK;
}
