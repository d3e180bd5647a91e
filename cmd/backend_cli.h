/*
 * backend_cli.h - `--backend cpu|cuda|auto` and `--activations auto|f32|q8`, shared by
 * generate, record, serve and calibrate: the option rows, their resolution (once, before
 * anything is loaded: fmoe_backend_choose, then fmoe_activations_resolve, q8 refused off the
 * CPU) and the words the commands print and record for the backend chosen.
 *
 *     typedef struct my_opts { ...; const char *backend; int32_t activations; } my_opts;
 *     static const cmd_option rows[] = { ..., CMD_BACKEND_OPTION(my_opts, backend),
 *                                        CMD_ACTIVATIONS_OPTION(my_opts, activations), {0} };
 *     fmoe_backend_kind kind;
 *     if ((rc = cmd_backend_resolve(CMD, o.backend, &kind))) return rc;
 *     if ((rc = cmd_activations_resolve(CMD, kind, &o.activations))) return rc;
 *     if (!quiet) cmd_backend_say(CMD, kind, o.activations);
 *                                    // "fmoe CMD: backend cuda (NVIDIA H100)"
 */
#ifndef FMOE_CMD_BACKEND_CLI_H
#define FMOE_CMD_BACKEND_CLI_H

#include <stddef.h>

#include "options.h"
#include "fmoe/model.h"

#define CMD_BACKEND_OPTION(type, f)                                                           \
    {.name = "backend", .kind = CMD_OPT_STRING, .value_name = "cpu|cuda|auto",                \
     .io = CMD_IO_TEXT,                                                                       \
     .help = "where the model computes: the CPU, the CUDA device 0, or auto (cuda when the "  \
             "CUDA module loads and sees a device, else cpu); cuda where it cannot run is an " \
             "error, never a fall back",                                                      \
     .default_text = "auto", .offset = offsetof(type, f)}

/* The names of --activations and their fmoe_activations values (an int32_t field holds
 * it; a command's defaults set it to FMOE_ACTIVATIONS_AUTO). */
extern const char *const cmd_activations_names[];
extern const int32_t cmd_activations_values[];

/* The figures are docs/quantization.md's ("8-bit activations"): one thread of its 1B
 * benchmark model, and fmoe-tiny's Q8_0 logits against its bf16 checkpoint. */
#define CMD_ACTIVATIONS_OPTION(type, f)                                                       \
    {.name = "activations", .kind = CMD_OPT_ENUM, .value_name = "auto|f32|q8",                \
     .help = "what the CPU multiplies quantized weights (a GGUF file's Q8_0, Q4_K, Q5_K, "    \
             "Q6_K) by: q8: the inputs quantised to 8 bits and integer dots, as llama.cpp "   \
             "does, faster in decode (measured 1.2-1.3x on Q8_0, 1.4-2x on Q4_K_M) but the "   \
             "logits move more (fmoe-tiny's Q8_0 against bf16: 1.55% RMS of their spread "     \
             "and 20% at the worst logit, against 0.45% and 4.3% with f32); f32: the inputs "  \
             "themselves, the exact path; auto: q8 on the cpu backend, f32 on cuda (whose "    \
             "kernels take f32 inputs; q8 there is an error); bf16, f16 and f32 weights "      \
             "compute the same either way",                                                   \
     .default_text = "auto", .offset = offsetof(type, f), .choices = cmd_activations_names,      \
     .choice_values = cmd_activations_values}

/* Resolves a --backend value (NULL: auto) with fmoe_backend_choose. An unknown name is a
 * usage error (exit 2); cuda where the module or a device is missing a failure (exit 1)
 * whose line says why. Either is one line on stderr.
 * @return 0 and *out, CMD_EXIT_FAILURE or CMD_EXIT_USAGE (printed). */
int cmd_backend_resolve(const char *cmd, const char *name, fmoe_backend_kind *out);

/* Resolves a command's --activations in place with fmoe_activations_resolve (auto: q8 on
 * the CPU, f32 on CUDA), so that everything after it passes, prints and records f32 or q8.
 * An explicit q8 where `kind` is not the CPU (--backend cuda, or auto finding a device) is a
 * usage error (exit 2) saying that the CUDA backend's quantized kernels take f32 inputs,
 * before anything is loaded. @return 0 or CMD_EXIT_USAGE (printed). */
int cmd_activations_resolve(const char *cmd, fmoe_backend_kind kind, int32_t *activations);

/* The device's name in fmoe_cuda_describe()'s text: what its trailing parentheses hold
 * ("CUDA runtime 13.0, 1 device (NVIDIA H100 80GB HBM3)" -> "NVIDIA H100 80GB HBM3"),
 * into buf; "" when the text ends in none. @return buf. */
const char *cmd_cuda_device_name(const char *describe, char *buf, size_t cap);

/* The backend in words, into buf: "cpu", or "cuda (NVIDIA H100 80GB HBM3)" ("cuda" when the
 * device has no name). @return buf. */
const char *cmd_backend_describe(fmoe_backend_kind kind, char *buf, size_t cap);

/* A trace's recorded_on for a run on `kind`: "cpu", or "cuda:<device name>" ("cuda" when
 * the device has no name). @return buf. */
const char *cmd_backend_recorded_on(fmoe_backend_kind kind, char *buf, size_t cap);

/* Prints "fmoe <cmd>: backend <cmd_backend_describe>" on stderr, followed by
 * ", activations q8" when the run quantises its inputs: the one line a command says about
 * where and how it computes. */
void cmd_backend_say(const char *cmd, fmoe_backend_kind kind, int32_t activations);

#endif
