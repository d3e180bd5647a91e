/*
 * backend.c - choosing where a session computes (fmoe/model.h fmoe_backend_choose): the
 * --backend value of generate, record, serve and calibrate.
 *
 * "auto" prefers the GPU, as vLLM and llama.cpp do when one is there: cuda when the CUDA
 * module loads (runtime/cuda/cuda_loader.c) and sees a device, else cpu. Asking for cuda
 * where it cannot run is an error that says why, never a silent fall back to the CPU.
 */
#include <string.h>

#include "fmoe/cuda.h"
#include "fmoe/error.h"
#include "model_impl.h"

const char *fmoe_backend_name(fmoe_backend_kind kind) {
    return kind == FMOE_BACKEND_CUDA ? "cuda" : "cpu";
}

const char *fmoe_activations_name(fmoe_activations a) {
    return a == FMOE_ACTIVATIONS_F32    ? "f32"
           : a == FMOE_ACTIVATIONS_Q8   ? "q8"
           : a == FMOE_ACTIVATIONS_AUTO ? "auto"
                                        : "?";
}

fmoe_activations fmoe_activations_resolve(fmoe_activations requested, fmoe_backend_kind backend) {
    if (requested != FMOE_ACTIVATIONS_AUTO) return requested;
    return backend == FMOE_BACKEND_CPU ? FMOE_ACTIVATIONS_Q8 : FMOE_ACTIVATIONS_F32;
}

int fmoe_backend_choose(const char *name, fmoe_backend_kind *out) {
    if (!out) return fmoe_error_set(FMOE_EINVAL, "output is NULL");
    if (!name || strcmp(name, "auto") == 0) {
        *out = fmoe_cuda_device_count() > 0 ? FMOE_BACKEND_CUDA : FMOE_BACKEND_CPU;
        return 0;
    }
    if (strcmp(name, "cpu") == 0) {
        *out = FMOE_BACKEND_CPU;
        return 0;
    }
    if (strcmp(name, "cuda") == 0) {
        if (!fmoe__cuda_backend()) return FMOE_EUNSUPPORTED; /* the detail says why */
        *out = FMOE_BACKEND_CUDA;
        return 0;
    }
    return fmoe_error_set(FMOE_EINVAL, "--backend %s: expected cpu, cuda or auto", name);
}
