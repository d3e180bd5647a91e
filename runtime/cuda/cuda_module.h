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
 * fmoe__backend_ops table (backend_impl.h), whose failing entries leave their detail in
 * error_detail() of the calling thread; backend_probe says whether device 0 can run it.
 *
 * ABI 3 adds backend_layout: the sizes and offsets of the structs the binary and the
 * module share (FMOE_CUDA_BACKEND_LAYOUT). A struct changed without the ABI number bumped
 * (a field inserted into fmoe__mat, say) then refuses to load instead of misreading every
 * matrix. Expand the macro where runtime/backend/backend_impl.h is included.
 *
 * ABI 4 drops the GEMM-chain and attention stand-ins: calibrate times the backend's own
 * ops through backend_ops.
 *
 * ABI 5 adds the timer ops mark and elapsed to backend_ops, and max_marks to its limits.
 *
 * ABI 6 adds the slot fences fence_new, fence_free, fence_record and fence_wait to
 * backend_ops (one event per expert slot), and write_slot no longer waits for every
 * context's reads of slots: only the fence_wait queued before it orders a rewrite.
 *
 * ABI 7 adds moe_experts and matmul_same_input (a MoE layer's experts, and products of one
 * input, in one call each; NULL in this module).
 *
 * ABI 8: fmoe__mla_args carries kv_b_proj split, wk_b and wv_b, in place of wkv_b (a
 * struct the layout fingerprint does not cover, hence the number).
 */
#ifndef FMOE_CUDA_MODULE_H
#define FMOE_CUDA_MODULE_H

#include <stddef.h>
#include <stdint.h>

#define FMOE_CUDA_MODULE_ABI 8
#define FMOE_CUDA_MODULE_SYMBOL "fmoe_cuda_module_get_api"

/* A fingerprint of the shared structs: sizes and one late field's offset, 12 bits each
 * (the ops table 16), the last 12 bits mixing two sizes. Equal in the C binary and the C++
 * module when both were built from the same headers. */
#define FMOE_CUDA_BACKEND_LAYOUT                                                           \
    ((uint64_t)sizeof(fmoe__mat) | (uint64_t)offsetof(fmoe__mat, on_backend) << 12 |       \
     (uint64_t)sizeof(fmoe__backend_ops) << 24 | (uint64_t)sizeof(fmoe__attn_args) << 40 | \
     ((uint64_t)sizeof(fmoe__route_args) ^ (uint64_t)sizeof(fmoe__backend_limits) << 6) << 52)

struct fmoe__backend_ops; /* runtime/backend/backend_impl.h */

typedef struct fmoe_cuda_module_api {
    int abi; /* FMOE_CUDA_MODULE_ABI */
    uint64_t backend_layout; /* FMOE_CUDA_BACKEND_LAYOUT as the module was built */
    int (*device_count)(void);
    const char *(*describe)(void);
    int (*selftest)(int n);
    int (*calibrate_h2d)(const int64_t *sizes, int32_t n, int32_t reps, double *seconds);
    int (*calibrate_d2d)(int64_t bytes, int32_t reps, double *bytes_per_s);
    const char *(*error_detail)(void); /* the module thread's last detail string */
    /* The forward pass's backend table (runtime/backend/backend_impl.h), name "cuda". */
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
