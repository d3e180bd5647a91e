// cuda_backend.cu - the CUDA backend's first translation unit: device discovery and a
// self-test that checks a kernel built from fmoe/elementwise.h (the same C the CPU runs)
// and a cuBLAS sgemm against the plain-C reference. Built whenever meson finds nvcc and
// cuBLAS, so the CUDA path compiles in CI even without a GPU.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "fmoe/cuda.h"
#include "fmoe/elementwise.h"
#include "fmoe/error.h"
}

#define FMOE_CUDA_CHECK(call, label)                                                      \
    do {                                                                                  \
        cudaError_t fmoe__e = (call);                                                     \
        if (fmoe__e != cudaSuccess) {                                                     \
            rc = fmoe_error_set(FMOE_EINTERNAL, "%s:%d: %s: %s", __FILE__, __LINE__,      \
                                #call, cudaGetErrorString(fmoe__e));                      \
            goto label;                                                                   \
        }                                                                                 \
    } while (0)

__global__ static void swiglu_kernel(const float *gate, const float *up, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmoe_swiglu(gate[i], up[i]);
}

extern "C" int fmoe_cuda_compiled(void) { return 1; }

extern "C" int fmoe_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

extern "C" const char *fmoe_cuda_describe(void) {
    static char text[256];
    int runtime = 0, devices = fmoe_cuda_device_count();
    cudaRuntimeGetVersion(&runtime);
    int n = snprintf(text, sizeof text, "CUDA runtime %d.%d, %d device%s", runtime / 1000,
                     (runtime % 1000) / 10, devices, devices == 1 ? "" : "s");
    if (devices > 0) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
            snprintf(text + n, sizeof text - (size_t)n, " (%.100s)", prop.name);
    }
    return text;
}

extern "C" int fmoe_cuda_selftest(int n) {
    if (fmoe_cuda_device_count() == 0)
        return fmoe_error_set(FMOE_EUNSUPPORTED, "no CUDA device");
    int rc = 0;
    size_t bytes = (size_t)n * sizeof(float);
    float *host = (float *)malloc(3 * bytes);
    float *dev = NULL, *c = NULL;
    cublasHandle_t blas = NULL;
    if (!host) return fmoe_error_set(FMOE_ENOMEM, "selftest buffers");
    for (int i = 0; i < n; i++) {
        host[i] = (float)(i % 17) * 0.25f - 2.0f;
        host[n + i] = (float)(i % 5) * 0.5f - 1.0f;
    }
    FMOE_CUDA_CHECK(cudaMalloc(&dev, 3 * bytes), done);
    FMOE_CUDA_CHECK(cudaMemcpy(dev, host, 2 * bytes, cudaMemcpyHostToDevice), done);
    swiglu_kernel<<<(n + 255) / 256, 256>>>(dev, dev + n, dev + 2 * n, n);
    FMOE_CUDA_CHECK(cudaGetLastError(), done);
    FMOE_CUDA_CHECK(cudaMemcpy(host + 2 * n, dev + 2 * n, bytes, cudaMemcpyDeviceToHost), done);
    for (int i = 0; i < n; i++) {
        float want = fmoe_swiglu(host[i], host[n + i]);
        if (fabsf(host[2 * n + i] - want) > 1e-5f * (1.0f + fabsf(want))) {
            rc = fmoe_error_set(FMOE_EMISMATCH, "swiglu[%d]: device %g, host %g", i,
                                host[2 * n + i], want);
            goto done;
        }
    }
    {   // 1x1 sgemm through cuBLAS: sum of gate[i]*up[i] as a dot product (1 x n by n x 1)
        const float one = 1.0f, zero = 0.0f;
        float got = 0.0f, want = 0.0f;
        FMOE_CUDA_CHECK(cudaMalloc(&c, sizeof(float)), done);
        if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
            rc = fmoe_error_set(FMOE_EINTERNAL, "cublasCreate failed");
            goto done;
        }
        if (cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, n, &one, dev, 1, dev + n, n,
                        &zero, c, 1) != CUBLAS_STATUS_SUCCESS) {
            rc = fmoe_error_set(FMOE_EINTERNAL, "cublasSgemm failed");
            goto done;
        }
        FMOE_CUDA_CHECK(cudaMemcpy(&got, c, sizeof(float), cudaMemcpyDeviceToHost), done);
        for (int i = 0; i < n; i++) want += host[i] * host[n + i];
        if (fabsf(got - want) > 1e-3f * (1.0f + fabsf(want)))
            rc = fmoe_error_set(FMOE_EMISMATCH, "sgemm: device %g, host %g", got, want);
    }
done:
    if (blas) cublasDestroy(blas);
    cudaFree(c);
    cudaFree(dev);
    free(host);
    return rc;
}
