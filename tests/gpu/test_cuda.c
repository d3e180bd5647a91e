/*
 * test_cuda.c - the CUDA backend's self-test (suite "gpu"): a SwiGLU kernel built from
 * fmoe/elementwise.h and a cuBLAS sgemm, each compared with the plain-C reference on
 * device 0. Exits 77 (skipped) where there is no CUDA build, module or device.
 */
#include <stdio.h>

#include "fmoe/cuda.h"
#include "fmoe/error.h"

int main(void) {
    printf("cuda: %s\n", fmoe_cuda_describe());
    if (!fmoe_cuda_compiled() || fmoe_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    int rc = fmoe_cuda_selftest(1 << 16);
    if (rc != 0) {
        printf("selftest failed: %s\n", fmoe_error_detail());
        return 1;
    }
    printf("selftest passed\n");
    return 0;
}
