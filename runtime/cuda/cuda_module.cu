// cuda_module.cu - the one exported symbol of libfmoe-cuda.so: the table of the CUDA
// backend's entry points (cuda_module.h). Everything else in the module is hidden.
extern "C" {
#include "fmoe/cuda.h"
#include "fmoe/error.h"
#include "../backend/backend_impl.h"
#include "cuda_module.h"
}

static const char *module_error_detail(void) { return fmoe_error_detail(); }

static const fmoe_cuda_module_api module_api = {
    /* .abi = */ FMOE_CUDA_MODULE_ABI,
    /* .backend_layout = */ FMOE_CUDA_BACKEND_LAYOUT,
    /* .device_count = */ fmoe_cuda_device_count,
    /* .describe = */ fmoe_cuda_describe,
    /* .selftest = */ fmoe_cuda_selftest,
    /* .calibrate_h2d = */ fmoe_cuda_calibrate_h2d,
    /* .calibrate_d2d = */ fmoe_cuda_calibrate_d2d,
    /* .error_detail = */ module_error_detail,
    /* .backend_ops = */ fmoe__cuda_module_backend_ops,
    /* .backend_probe = */ fmoe__cuda_module_probe,
};

extern "C" __attribute__((visibility("default"))) const fmoe_cuda_module_api *
fmoe_cuda_module_get_api(void) {
    return &module_api;
}
