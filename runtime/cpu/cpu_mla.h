/*
 * cpu_mla.h - internal: the CPU backend's multi-head latent attention (cpu_mla.c), the
 * mla_attention entry of fmoe__cpu_backend.
 */
#ifndef FMOE_CPU_MLA_H
#define FMOE_CPU_MLA_H

#include "../model/model_impl.h"

/* fmoe__backend_ops.mla_attention on a CPU backend context. */
void fmoe__cpu_mla_attention(void *ctx, const fmoe__mla_args *a);

#endif
