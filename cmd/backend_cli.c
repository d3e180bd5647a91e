/*
 * backend_cli.c - `--backend` and `--activations` for the commands that compute
 * (backend_cli.h).
 */
#include "backend_cli.h"

#include <stdio.h>
#include <string.h>

#include "cmd_common.h"
#include "fmoe/cuda.h"
#include "fmoe/error.h"

int cmd_backend_resolve(const char *cmd, const char *name, fmoe_backend_kind *out) {
    const int rc = fmoe_backend_choose(name, out);
    if (rc == 0) return 0;
    /* an unknown name in options.h's phrasing for a choice; else the detail says why cuda
     * cannot run ("CUDA backend unavailable: no CUDA device") */
    if (rc == FMOE_EINVAL)
        return cmd_usage_error(cmd, "--backend must be cpu, cuda or auto, got '%s'",
                               name ? name : "");
    const char *detail = fmoe_error_detail();
    return cmd_failf(cmd, "--backend %s: %s", name ? name : "auto",
                     detail[0] ? detail : fmoe_strerror(rc));
}

const char *const cmd_activations_names[] = {"auto", "f32", "q8", NULL};
const int32_t cmd_activations_values[] = {FMOE_ACTIVATIONS_AUTO, FMOE_ACTIVATIONS_F32,
                                          FMOE_ACTIVATIONS_Q8};

int cmd_activations_resolve(const char *cmd, fmoe_backend_kind kind, int32_t *activations) {
    if (*activations == FMOE_ACTIVATIONS_Q8 && kind != FMOE_BACKEND_CPU)
        return cmd_usage_error(cmd,
                               "--activations q8 needs --backend cpu: the %s backend's "
                               "quantized kernels take f32 inputs",
                               fmoe_backend_name(kind));
    *activations = (int32_t)fmoe_activations_resolve((fmoe_activations)*activations, kind);
    return 0;
}

const char *cmd_cuda_device_name(const char *describe, char *buf, size_t cap) {
    if (cap == 0) return buf;
    buf[0] = '\0';
    size_t n = describe ? strlen(describe) : 0;
    while (n > 0 && describe[n - 1] == ' ') n--;
    if (n == 0 || describe[n - 1] != ')') return buf;
    /* back to the '(' that opens the trailing group, nested ones included */
    size_t open = n - 1;
    int depth = 0;
    for (;;) {
        if (describe[open] == ')') depth++;
        else if (describe[open] == '(' && --depth == 0) break;
        if (open == 0) return buf; /* unbalanced: no name */
        open--;
    }
    snprintf(buf, cap, "%.*s", (int)(n - 1 - open - 1), describe + open + 1);
    return buf;
}

/* The backend's name, joined to the CUDA device's name by `sep` ("backend SEP device END")
 * when there is one. */
static const char *backend_with_device(fmoe_backend_kind kind, const char *sep,
                                       const char *end, char *buf, size_t cap) {
    char dev[160];
    if (kind == FMOE_BACKEND_CUDA &&
        cmd_cuda_device_name(fmoe_cuda_describe(), dev, sizeof dev)[0])
        snprintf(buf, cap, "%s%s%s%s", fmoe_backend_name(kind), sep, dev, end);
    else
        snprintf(buf, cap, "%s", fmoe_backend_name(kind));
    return buf;
}

const char *cmd_backend_describe(fmoe_backend_kind kind, char *buf, size_t cap) {
    return backend_with_device(kind, " (", ")", buf, cap);
}

const char *cmd_backend_recorded_on(fmoe_backend_kind kind, char *buf, size_t cap) {
    return backend_with_device(kind, ":", "", buf, cap);
}

void cmd_backend_say(const char *cmd, fmoe_backend_kind kind, int32_t activations) {
    char words[200];
    fprintf(stderr, "fmoe %s: backend %s%s\n", cmd, cmd_backend_describe(kind, words, sizeof words),
            activations == FMOE_ACTIVATIONS_Q8 ? ", activations q8" : "");
}
