/*
 * next_use.h - internal: the next-use table the offline policies (belady, oracle) share,
 * computed once in registry.c from the future the executor hands them.
 */
#ifndef FMOE_POLICIES_NEXT_USE_H
#define FMOE_POLICIES_NEXT_USE_H

#include <stdint.h>

#include "fmoe/policy.h"

/* Next-use table shared by the offline policies (belady, oracle): next[p] = the position
 * of the next access to the same expert after p, or UINT32_MAX; first[e] = the first
 * access to expert e, or UINT32_MAX. Arrays of future_len and L*J entries, caller-owned.
 * @return 0, FMOE_ERANGE (>= 2^32 - 1 accesses) or FMOE_EINVAL (an id >= L*J). */
int fmoe__policy_next_use(const fmoe_policy_config *cfg, uint32_t *next, uint32_t *first);

#endif
