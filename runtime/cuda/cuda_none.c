/* cuda_none.c - the CUDA entry points of a build without CUDA: they say so. */
#include "fmoe/cuda.h"
#include "fmoe/error.h"

int fmoe_cuda_compiled(void) { return 0; }
int fmoe_cuda_device_count(void) { return 0; }
const char *fmoe_cuda_describe(void) { return "not compiled (built without CUDA)"; }
int fmoe_cuda_selftest(int n) {
    (void)n;
    return fmoe_error_set(FMOE_EUNSUPPORTED, "fmoe was built without CUDA");
}
