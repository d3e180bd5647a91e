/*
 * cpu_fused.h - internal: the CPU backend's fused MoE experts (cpu_fused.c), the
 * moe_experts entry of fmoe__cpu_backend, and the parts of cpu_backend.c it uses.
 */
#ifndef FMOE_CPU_FUSED_H
#define FMOE_CPU_FUSED_H

#include <stdint.h>

#include "../backend/backend_impl.h"

/* The scratch of the fused paths, sized once per CPU context: passes of up to `max_n`
 * tokens, up to `max_rows` expert rows (routed and shared together) of up to `max_cols`
 * values, and a row to widen into per each of `threads` pool threads.
 * @return 0 or FMOE_ENOMEM. */
typedef struct fmoe__cpu_fused fmoe__cpu_fused;
int fmoe__cpu_fused_init(int32_t threads, int64_t max_cols, int32_t max_n, int32_t max_rows,
                           fmoe__cpu_fused **out);
void fmoe__cpu_fused_free(fmoe__cpu_fused *x);

/* fmoe__backend_ops.moe_experts on a CPU backend context. Declines (returns 1) when the
 * pass has more than FMOE__CPU_FUSED_MAX_N rows and some expert matrix would not take
 * 8-bit inputs in one pass of cpu_matmul (prefill's other kernels), more rows than the
 * scratch's max_n (at most FMOE__CPU_FUSED_PREFILL_N), a matrix is f32, or the rows or
 * widths exceed the scratch; the results are bit for bit the per-expert loop's otherwise. */
#define FMOE__CPU_FUSED_MAX_N 4
#define FMOE__CPU_FUSED_PREFILL_N 64
int fmoe__cpu_moe_experts(void *ctx, const fmoe__moe_args *a);

/* fmoe__backend_ops.matmul_same_input on a CPU backend context: one pool job for all the
 * products (the input quantised once per 8-bit type) when no matrix is f32 and either
 * n <= FMOE__CPU_FUSED_MAX_N or every product takes 8-bit inputs in one pass with n up to
 * the scratch's max_n (prefill's q, k and v); else cpu_matmul's one by one. Either way the
 * bits of cpu_matmul's. */
void fmoe__cpu_matmul_same_input(void *ctx, const fmoe__mat *const *ws, int32_t count,
                                 const float *x, int32_t n, float *const *ys);

/* From cpu_backend.c: the context's fused-path scratch (NULL: the path is off,
 * FMOE_CPU_UNFUSED set), whether block-format products take 8-bit inputs (the context's
 * act8), the work (multiply-adds) below which a product stays on the calling thread, and
 * its bf16/f16 dots y[t·ystride] = Σ w·x[t·ld..] for t < nx, as matmul's small-n path. */
fmoe__cpu_fused *fmoe__cpu_fused_of(void *ctx);
int fmoe__cpu_act8(const void *ctx);
/* Inputs that cpu_matmul's 8-bit path quantises and multiplies in one pass for W (its
 * scratch's capacity), 0 when W takes no 8-bit inputs. */
int64_t fmoe__cpu_act8_pass(const void *ctx, const fmoe__mat *W);
double fmoe__cpu_min_work(const void *ctx);
void fmoe__cpu_matmul(void *ctx, const fmoe__mat *w, const float *x, int32_t n, float *y);
void fmoe__cpu_dots_u16(const void *ctx, const uint16_t *w, fmoe_st_dtype dt, const float *x,
                        int64_t ld, int32_t nx, int64_t n, float *y, int64_t ystride);

#endif
