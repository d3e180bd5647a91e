/* fake_cuda_module.c - a stand-in for libfmoe-cuda.so that the loader test
 * (test_cuda_loader.c) points FMOE_CUDA_MODULE at: the loader's checks of the module's ABI
 * number and struct layout need no CUDA device. FAKE_LAYOUT_DELTA != 0 builds a module
 * that claims the right ABI from other headers; FAKE_ABI_DELTA a module of another ABI. */
#include "../../runtime/backend/backend_impl.h"
#include "../../runtime/cuda/cuda_module.h"

static int fake_device_count(void) { return 3; }

static const fmoe_cuda_module_api api = {
    .abi = FMOE_CUDA_MODULE_ABI + FAKE_ABI_DELTA,
    .backend_layout = FMOE_CUDA_BACKEND_LAYOUT + FAKE_LAYOUT_DELTA,
    .device_count = fake_device_count,
};

__attribute__((visibility("default"))) const fmoe_cuda_module_api *fmoe_cuda_module_get_api(void) {
    return &api;
}
