/*
 * backend_cli.h - `--backend cpu|cuda|auto`, shared by generate, record, serve and calibrate:
 * the option row, its resolution (fmoe_backend_choose, once, before anything is loaded) and
 * the words the commands print and record for the backend chosen.
 *
 *     typedef struct my_opts { ...; const char *backend; } my_opts;
 *     static const cmd_option rows[] = { ..., CMD_BACKEND_OPTION(my_opts, backend), {0} };
 *     fmoe_backend_kind kind;
 *     if ((rc = cmd_backend_resolve(CMD, o.backend, &kind))) return rc;
 *     if (!quiet) cmd_backend_say(CMD, kind);   // "fmoe CMD: backend cuda (NVIDIA H100)"
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

/* Resolves a --backend value (NULL: auto) with fmoe_backend_choose. An unknown name is a
 * usage error (exit 2); cuda where the module or a device is missing a failure (exit 1)
 * whose line says why. Either is one line on stderr.
 * @return 0 and *out, CMD_EXIT_FAILURE or CMD_EXIT_USAGE (printed). */
int cmd_backend_resolve(const char *cmd, const char *name, fmoe_backend_kind *out);

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

/* Prints "fmoe <cmd>: backend <cmd_backend_describe>" on stderr: the one line a command
 * says about where it computes. */
void cmd_backend_say(const char *cmd, fmoe_backend_kind kind);

#endif
