// cuda_calibrate.cu - the GPU copy measurements of `fmoe calibrate` (fmoe/cuda.h): pinned
// host-to-device copies across sizes (the link's alpha and beta) and device-to-device
// copies (memory bandwidth). Timed with CUDA events on one stream; every point is the
// median of its runs. The compute curves are timed through the CUDA backend's own ops
// (runtime/model/backend_bench.c); the plain-C side (cmd/cmd_calibrate.c) fits and writes
// the profile.
#include <cuda_runtime.h>

#include <stdlib.h>
#include <string.h>

extern "C" {
#include "fmoe/cuda.h"
#include "fmoe/error.h"
}

#define MIN_POINT_MS 20.0
#define MAX_REPS 1000

#define CAL_CUDA(call)                                                                    \
    do {                                                                                  \
        cudaError_t cal__e = (call);                                                      \
        if (cal__e != cudaSuccess) {                                                      \
            rc = fmoe_error_set(FMOE_EINTERNAL, "%s:%d: %s: %s", __FILE__, __LINE__,      \
                                #call, cudaGetErrorString(cal__e));                       \
            goto done;                                                                    \
        }                                                                                 \
    } while (0)

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Error helpers for code that returns a status rather than jumping to a label (lambdas).
static int cuda_status(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    return fmoe_error_set(FMOE_EINTERNAL, "%s: %s", what, cudaGetErrorString(e));
}

// Times op() between two events on `stream`, repeating until it has run `reps` times and
// MIN_POINT_MS in all (at most MAX_REPS runs); *seconds = the median run. op returns 0 or
// a negative fmoe code with its detail set. t[MAX_REPS] is scratch.
template <class Op>
static int time_median(cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, int reps,
                       double *t, Op op, double *seconds) {
    int rc = 0, k = 0;
    double total = 0;
    while (k < MAX_REPS && (k < reps || total < MIN_POINT_MS)) {
        float ms = 0;
        CAL_CUDA(cudaEventRecord(e0, stream));
        if ((rc = op()) < 0) goto done;
        CAL_CUDA(cudaEventRecord(e1, stream));
        CAL_CUDA(cudaEventSynchronize(e1));
        CAL_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        t[k++] = ms * 1e-3;
        total += ms;
    }
    *seconds = median(t, k);
done:
    return rc;
}

static int need_device(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
        return fmoe_error_set(FMOE_EUNSUPPORTED, "no CUDA device");
    return 0;
}

extern "C" int fmoe_cuda_calibrate_h2d(const int64_t *sizes, int32_t n, int32_t reps,
                                       double *seconds) {
    int rc = need_device();
    if (rc < 0) return rc;
    int64_t max = 0;
    for (int32_t i = 0; i < n; i++) {
        if (sizes[i] < 1) return fmoe_error_set(FMOE_EINVAL, "copy size %lld", (long long)sizes[i]);
        if (sizes[i] > max) max = sizes[i];
    }
    if (reps < 1) reps = 1;
    void *host = NULL, *dev = NULL;
    cudaStream_t stream = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double *t = (double *)malloc(MAX_REPS * sizeof *t);
    if (!t) return fmoe_error_set(FMOE_ENOMEM, "timing buffer");
    CAL_CUDA(cudaMallocHost(&host, (size_t)max));
    CAL_CUDA(cudaMalloc(&dev, (size_t)max));
    memset(host, 1, (size_t)max);
    CAL_CUDA(cudaStreamCreate(&stream));
    CAL_CUDA(cudaEventCreate(&e0));
    CAL_CUDA(cudaEventCreate(&e1));
    CAL_CUDA(cudaMemcpyAsync(dev, host, (size_t)max, cudaMemcpyHostToDevice, stream)); // warm
    CAL_CUDA(cudaStreamSynchronize(stream));
    for (int32_t i = 0; i < n; i++) {
        const size_t bytes = (size_t)sizes[i];
        auto copy = [&]() {
            return cuda_status(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream),
                               "cudaMemcpyAsync host to device");
        };
        if ((rc = time_median(stream, e0, e1, reps, t, copy, &seconds[i])) < 0) goto done;
    }
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (stream) cudaStreamDestroy(stream);
    cudaFree(dev);
    cudaFreeHost(host);
    free(t);
    return rc;
}

extern "C" int fmoe_cuda_calibrate_d2d(int64_t bytes, int32_t reps, double *bytes_per_s) {
    int rc = need_device();
    if (rc < 0) return rc;
    if (bytes < 1) return fmoe_error_set(FMOE_EINVAL, "copy size %lld", (long long)bytes);
    if (reps < 1) reps = 1;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double *t = (double *)malloc(MAX_REPS * sizeof *t);
    if (!t) return fmoe_error_set(FMOE_ENOMEM, "timing buffer");
    CAL_CUDA(cudaMalloc(&a, (size_t)bytes));
    CAL_CUDA(cudaMalloc(&b, (size_t)bytes));
    CAL_CUDA(cudaMemset(a, 1, (size_t)bytes));
    CAL_CUDA(cudaEventCreate(&e0));
    CAL_CUDA(cudaEventCreate(&e1));
    {
        double sec = 0;
        auto copy = [&]() {
            return cuda_status(cudaMemcpyAsync(b, a, (size_t)bytes, cudaMemcpyDeviceToDevice, 0),
                               "cudaMemcpyAsync device to device");
        };
        if ((rc = time_median(0, e0, e1, reps, t, copy, &sec)) < 0) goto done;
        *bytes_per_s = 2.0 * (double)bytes / sec;
    }
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    free(t);
    return rc;
}
