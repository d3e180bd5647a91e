/*
 * family_gptoss.h - gpt-oss's tensors (family_gptoss.c): what load.c binds for the family
 * beyond the attention every GQA family shares.
 */
#ifndef FMOE_FAMILY_GPTOSS_H
#define FMOE_FAMILY_GPTOSS_H

#include "model_impl.h"

/* Layer i's attention sinks [Hq] as an owned f32 vector. @return 0, FMOE_ENOTFOUND,
 * FMOE_EFORMAT (the detail names the tensor), FMOE_ENOMEM. */
int fmoe__gptoss_bind_sinks(fmoe_model *m, int32_t i, fmoe__layer *L);

/* Layer i's router (weight and bias) and routed experts (L->experts, J of them: matrices,
 * biases and the clamped SwiGLU's parameters). @return as fmoe__gptoss_bind_sinks. */
int fmoe__gptoss_bind_moe(fmoe_model *m, int32_t i, fmoe__layer *L);

#endif
