/*
 * cuda_module.h - the table that libfmoe-cuda.so exports to the loader (cuda_loader.c).
 *
 * The CUDA backend is a shared module loaded with dlopen on first use, not linked into
 * the fmoe binary: loading cuBLAS costs ~220 MB of resident memory at process start,
 * which every command (and every machine without a GPU) would pay. The module is built
 * with hidden visibility and carries its own copy of lib/error.c, so its error details
 * live in the module; error_detail() hands them to the loader, which re-raises them in
 * the caller's thread. Bump FMOE_CUDA_MODULE_ABI when the table changes.
 *
 * ABI 2 adds the forward pass's backend (cuda_forward.cu): backend_ops is its
 * fmoe__backend_ops table (model_impl.h), whose failing entries leave their detail in
 * error_detail() of the calling thread; backend_probe says whether device 0 can run it.
 */
#ifndef FMOE_CUDA_MODULE_H
#define FMOE_CUDA_MODULE_H

#include <stdint.h>

#define FMOE_CUDA_MODULE_ABI 2
#define FMOE_CUDA_MODULE_SYMBOL "fmoe_cuda_module_get_api"

struct fmoe__backend_ops; /* runtime/model/model_impl.h */

typedef struct fmoe_cuda_module_api {
    int abi; /* FMOE_CUDA_MODULE_ABI */
    int (*device_count)(void);
    const char *(*describe)(void);
    int (*selftest)(int n);
    int (*calibrate_h2d)(const int64_t *sizes, int32_t n, int32_t reps, double *seconds);
    int (*calibrate_d2d)(int64_t bytes, int32_t reps, double *bytes_per_s);
    int (*calibrate_gemms)(const int32_t *rows, const int32_t *cols, int32_t mats,
                           const int32_t *tokens, int32_t n, int32_t reps, double *seconds);
    int (*calibrate_attention)(int32_t heads, int32_t kv_heads, int32_t head_dim,
                               const int32_t *tokens, const int32_t *contexts, int32_t n,
                               int32_t reps, double *seconds);
    const char *(*error_detail)(void); /* the module thread's last detail string */
    /* The forward pass's backend table (runtime/model/model_impl.h), name "cuda". */
    const struct fmoe__backend_ops *(*backend_ops)(void);
    /* 0 when device 0 can run that backend, else FMOE_EUNSUPPORTED with why ("no CUDA
     * device", a driver older than the runtime). */
    int (*backend_probe)(void);
} fmoe_cuda_module_api;

/* Inside the module (cuda_forward.cu), behind the two entries above. */
const struct fmoe__backend_ops *fmoe__cuda_module_backend_ops(void);
int fmoe__cuda_module_probe(void);

typedef const fmoe_cuda_module_api *(*fmoe_cuda_module_api_fn)(void);

#endif
