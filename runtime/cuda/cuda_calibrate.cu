// cuda_calibrate.cu - the GPU measurements of `fmoe calibrate` (fmoe/cuda.h): pinned
// host-to-device copies across sizes (the link's alpha and beta), device-to-device copies
// (memory bandwidth), bf16 cuBLAS GEMM chains at a model's expert and attention shapes,
// and attention over a context. Timed with CUDA events on one stream; every point is the
// median of its runs. The plain-C side (cmd/cmd_calibrate.c) fits and writes the profile.
#include <cublas_v2.h>
#include <cuda_bf16.h>
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

#define CAL_BLAS(call)                                                                    \
    do {                                                                                  \
        cublasStatus_t cal__s = (call);                                                   \
        if (cal__s != CUBLAS_STATUS_SUCCESS) {                                            \
            rc = fmoe_error_set(FMOE_EINTERNAL, "%s:%d: %s: cuBLAS status %d", __FILE__,  \
                                __LINE__, #call, (int)cal__s);                            \
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

static int blas_status(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    return fmoe_error_set(FMOE_EINTERNAL, "%s: cuBLAS status %d", what, (int)st);
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

// Row-major Y[m x r] = X[m x c] * W^T (W row-major r x c) is, column-major,
// Y^T (r x m) = op_T(W as c x r) * X^T (c x m).
static cublasStatus_t gemm_xwt(cublasHandle_t h, int m, int r, int c, const void *x,
                               const void *w, void *y) {
    const float one = 1.0f, zero = 0.0f;
    return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, r, m, c, &one, w, CUDA_R_16BF, c, x,
                        CUDA_R_16BF, c, &zero, y, CUDA_R_16BF, r, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
}

extern "C" int fmoe_cuda_calibrate_gemms(const int32_t *rows, const int32_t *cols, int32_t mats,
                                         const int32_t *tokens, int32_t n, int32_t reps,
                                         double *seconds) {
    int rc = need_device();
    if (rc < 0) return rc;
    if (mats < 1 || n < 1) return fmoe_error_set(FMOE_EINVAL, "gemm timing: %d matrices", mats);
    size_t wsize = 0, in_max = 0, out_max = 0;
    int32_t tmax = 0;
    for (int32_t i = 0; i < mats; i++) {
        if (rows[i] < 1 || cols[i] < 1)
            return fmoe_error_set(FMOE_EINVAL, "gemm timing: matrix %d is %d x %d", i, rows[i],
                                  cols[i]);
        wsize += (size_t)rows[i] * (size_t)cols[i];
        if ((size_t)cols[i] > in_max) in_max = (size_t)cols[i];
        if ((size_t)rows[i] > out_max) out_max = (size_t)rows[i];
    }
    for (int32_t i = 0; i < n; i++) {
        if (tokens[i] < 1) return fmoe_error_set(FMOE_EINVAL, "gemm timing: %d tokens", tokens[i]);
        if (tokens[i] > tmax) tmax = tokens[i];
    }
    if (reps < 1) reps = 1;
    __nv_bfloat16 *w = NULL, *x = NULL, *y = NULL;
    cublasHandle_t h = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double *t = (double *)malloc(MAX_REPS * sizeof *t);
    if (!t) return fmoe_error_set(FMOE_ENOMEM, "timing buffer");
    CAL_CUDA(cudaMalloc((void **)&w, wsize * sizeof *w));
    CAL_CUDA(cudaMalloc((void **)&x, (size_t)tmax * in_max * sizeof *x));
    CAL_CUDA(cudaMalloc((void **)&y, (size_t)tmax * out_max * sizeof *y));
    CAL_CUDA(cudaMemset(w, 0, wsize * sizeof *w));
    CAL_CUDA(cudaMemset(x, 0, (size_t)tmax * in_max * sizeof *x));
    CAL_CUDA(cudaEventCreate(&e0));
    CAL_CUDA(cudaEventCreate(&e1));
    CAL_BLAS(cublasCreate(&h));
    for (int32_t p = 0; p < n; p++) {
        auto chain = [&]() {
            const __nv_bfloat16 *wi = w;
            for (int32_t i = 0; i < mats; i++) {
                int st = blas_status(gemm_xwt(h, tokens[p], rows[i], cols[i], x, wi, y),
                                     "cublasGemmEx");
                if (st < 0) return st;
                wi += (size_t)rows[i] * (size_t)cols[i];
            }
            return 0;
        };
        if ((rc = chain()) < 0) goto done; // warm-up: picks the algorithms
        if ((rc = time_median(0, e0, e1, reps, t, chain, &seconds[p])) < 0) goto done;
    }
done:
    if (h) cublasDestroy(h);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(w);
    cudaFree(x);
    cudaFree(y);
    free(t);
    return rc;
}

// One block per row of `rows` rows of length c: in-place softmax.
__global__ static void softmax_rows(__nv_bfloat16 *s, int c) {
    __nv_bfloat16 *row = s + (size_t)blockIdx.x * c;
    __shared__ float red[256];
    float mx = -1e30f;
    for (int j = threadIdx.x; j < c; j += blockDim.x) mx = fmaxf(mx, __bfloat162float(row[j]));
    red[threadIdx.x] = mx;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k /= 2) {
        if ((int)threadIdx.x < k) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + k]);
        __syncthreads();
    }
    mx = red[0];
    __syncthreads();
    float sum = 0;
    for (int j = threadIdx.x; j < c; j += blockDim.x) sum += __expf(__bfloat162float(row[j]) - mx);
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k /= 2) {
        if ((int)threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    const float inv = 1.0f / red[0];
    for (int j = threadIdx.x; j < c; j += blockDim.x)
        row[j] = __float2bfloat16(__expf(__bfloat162float(row[j]) - mx) * inv);
}

extern "C" int fmoe_cuda_calibrate_attention(int32_t heads, int32_t kv_heads, int32_t head_dim,
                                             const int32_t *tokens, const int32_t *contexts,
                                             int32_t n, int32_t reps, double *seconds) {
    int rc = need_device();
    if (rc < 0) return rc;
    if (heads < 1 || kv_heads < 1 || heads % kv_heads || head_dim < 1 || n < 1)
        return fmoe_error_set(FMOE_EINVAL, "attention timing: %d heads, %d kv heads, dim %d",
                              heads, kv_heads, head_dim);
    int32_t tmax = 0, cmax = 0;
    for (int32_t i = 0; i < n; i++) {
        if (tokens[i] < 1 || contexts[i] < tokens[i])
            return fmoe_error_set(FMOE_EINVAL, "attention timing: %d tokens at context %d",
                                  tokens[i], contexts[i]);
        if (tokens[i] > tmax) tmax = tokens[i];
        if (contexts[i] > cmax) cmax = contexts[i];
    }
    if (reps < 1) reps = 1;
    const int group = heads / kv_heads;
    const size_t hd = (size_t)head_dim, G = (size_t)kv_heads;
    __nv_bfloat16 *q = NULL, *kc = NULL, *vc = NULL, *s = NULL, *o = NULL;
    cublasHandle_t h = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double *t = (double *)malloc(MAX_REPS * sizeof *t);
    if (!t) return fmoe_error_set(FMOE_ENOMEM, "timing buffer");
    CAL_CUDA(cudaMalloc((void **)&q, G * group * tmax * hd * sizeof *q));
    CAL_CUDA(cudaMalloc((void **)&kc, G * cmax * hd * sizeof *kc));
    CAL_CUDA(cudaMalloc((void **)&vc, G * cmax * hd * sizeof *vc));
    CAL_CUDA(cudaMalloc((void **)&s, G * group * tmax * (size_t)cmax * sizeof *s));
    CAL_CUDA(cudaMalloc((void **)&o, G * group * tmax * hd * sizeof *o));
    CAL_CUDA(cudaMemset(q, 0, G * group * tmax * hd * sizeof *q));
    CAL_CUDA(cudaMemset(kc, 0, G * cmax * hd * sizeof *kc));
    CAL_CUDA(cudaMemset(vc, 0, G * cmax * hd * sizeof *vc));
    CAL_CUDA(cudaEventCreate(&e0));
    CAL_CUDA(cudaEventCreate(&e1));
    CAL_BLAS(cublasCreate(&h));
    for (int32_t p = 0; p < n; p++) {
        const int M = group * tokens[p], c = contexts[p];
        const float one = 1.0f, zero = 0.0f, scale = 1.0f;
        auto attention = [&]() {
            // scores (M x c) = Q (M x hd) K^T, per KV head: column-major S^T = op_T(K) Q^T
            int st = blas_status(
                cublasGemmStridedBatchedEx(
                    h, CUBLAS_OP_T, CUBLAS_OP_N, c, M, head_dim, &scale, kc, CUDA_R_16BF,
                    head_dim, (long long)cmax * head_dim, q, CUDA_R_16BF, head_dim,
                    (long long)M * head_dim, &zero, s, CUDA_R_16BF, c, (long long)M * c, kv_heads,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "scores");
            if (st < 0) return st;
            softmax_rows<<<(unsigned)(G * M), 256>>>(s, c);
            if ((st = cuda_status(cudaGetLastError(), "softmax_rows")) < 0) return st;
            // out (M x hd) = P (M x c) V (c x hd): column-major O^T = V^T P^T
            return blas_status(
                cublasGemmStridedBatchedEx(
                    h, CUBLAS_OP_N, CUBLAS_OP_N, head_dim, M, c, &one, vc, CUDA_R_16BF, head_dim,
                    (long long)cmax * head_dim, s, CUDA_R_16BF, c, (long long)M * c, &zero, o,
                    CUDA_R_16BF, head_dim, (long long)M * head_dim, kv_heads, CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT),
                "attention output");
        };
        if ((rc = attention()) < 0) goto done; // warm-up
        CAL_CUDA(cudaDeviceSynchronize());
        if ((rc = time_median(0, e0, e1, reps, t, attention, &seconds[p])) < 0) goto done;
    }
done:
    if (h) cublasDestroy(h);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(q);
    cudaFree(kc);
    cudaFree(vc);
    cudaFree(s);
    cudaFree(o);
    free(t);
    return rc;
}
