/*
 * cpu_mla.h - internal: the CPU backend's multi-head latent attention (cpu_mla.c), the
 * mla_attention entry of fmoe__cpu_backend.
 */
#ifndef FMOE_CPU_MLA_H
#define FMOE_CPU_MLA_H

#include "../backend/backend_impl.h"
#include "../backend/threadpool.h"

/* fmoe__backend_ops.mla_attention on a CPU backend context: heads across the context's
 * pool when the args carry a scratch slot per pool thread. */
void fmoe__cpu_mla_attention(void *ctx, const fmoe__mla_args *a);

/* From cpu_backend.c: a CPU context's pool threads (the caller counted), fmoe__pool_run on
 * its pool, and its vector kernels (AVX2 where the CPU has it), as its attention uses them:
 * Σ a[i]·b[i], and y += a·x. */
int32_t fmoe__cpu_threads(const void *ctx);
void fmoe__cpu_run(void *ctx, fmoe__task_fn fn, void *arg, int32_t tasks);
float fmoe__cpu_dot(const void *ctx, const float *a, const float *b, int64_t n);
void fmoe__cpu_axpy(const void *ctx, float *y, float a, const float *x, int64_t n);

#endif
