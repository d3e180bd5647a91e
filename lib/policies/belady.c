/*
 * belady.c - Belady's offline optimum (MIN), simulate only (docs/design.md §6, §7.1).
 *
 * On a miss with the cache full, evict the resident, unpinned expert whose next access is
 * furthest in the future; an expert never accessed again is infinitely far. Ties (only
 * possible among the never-again ones) go to the least recently accessed. For a demand-
 * paging cache of fixed capacity this maximises hits (Belady 1966; Mattson et al. 1970),
 * so it bounds every no-prefetch policy here: a property test checks that none beats it.
 *
 * Future knowledge: the executor passes the whole access sequence (cfg->future, expert ids
 * in §7.1 order) at init. init computes next[p], the position of the next access to the
 * same expert after position p, in one backward pass; on_access(position p) sets the
 * accessed expert's next-use to next[p]. A resident expert's next-use is thus always exact.
 *
 * Cost: O(A) time and 4·A bytes at init for A accesses (A < 2^32 - 1), O(1) per access,
 * O(N) per miss.
 */
#include <stdlib.h>

#include "fmoe/error.h"
#include "fmoe/policy.h"
#include "next_use.h"

#define NEVER UINT32_MAX

typedef struct belady_state {
    uint32_t *next;        /* [A] position of the next access to the same expert, NEVER */
    uint32_t *next_use;    /* [L*J] next access position of each expert, NEVER */
    int64_t len;
} belady_state;

static void belady_free(void *state) {
    belady_state *b = state;
    if (!b) return;
    free(b->next);
    free(b->next_use);
    free(b);
}

static int belady_init(void **state, const fmoe_policy_config *cfg) {
    *state = NULL;
    const size_t ne = (size_t)cfg->num_layers * (size_t)cfg->num_experts;
    const size_t a = (size_t)(cfg->future_len > 0 ? cfg->future_len : 0);
    belady_state *b = calloc(1, sizeof *b);
    if (!b) return fmoe_error_set(FMOE_ENOMEM, "belady state");
    b->len = cfg->future_len;
    b->next = malloc((a ? a : 1) * sizeof *b->next);
    b->next_use = malloc(ne * sizeof *b->next_use);
    if (!b->next || !b->next_use) {
        belady_free(b);
        return fmoe_error_set(FMOE_ENOMEM, "belady: next-use table for %zu accesses", a);
    }
    /* Before any access, an expert's next use is its first access. */
    int rc = fmoe__policy_next_use(cfg, b->next, b->next_use);
    if (rc < 0) {
        belady_free(b);
        fmoe_error_prefix("belady");
        return rc;
    }
    *state = b;
    return 0;
}

static void belady_on_access(void *state, const fmoe_policy_env *env,
                             const fmoe_access_event *ev) {
    belady_state *b = state;
    if (ev->position < 0 || ev->position >= b->len) return;
    const int32_t e = ev->layer * env->cache->num_experts + ev->expert;
    b->next_use[e] = b->next[ev->position];
}

static int32_t belady_choose_victim(void *state, const fmoe_policy_env *env, const fmoe_victim_request *req) {
    (void)req;
    const belady_state *b = state;
    const fmoe_cache_view *v = env->cache;
    int32_t best = -1;
    uint32_t best_next = 0;
    uint64_t best_tick = UINT64_MAX;
    for (int32_t s = 0; s < v->capacity; s++) {
        if (!fmoe_cache_evictable(v, s)) continue;
        const uint32_t nx = b->next_use[v->slot_expert[s]];
        const uint64_t t = v->slot_last_access[s];
        if (best < 0 || nx > best_next || (nx == best_next && t < best_tick)) {
            best_next = nx;
            best_tick = t;
            best = s;
        }
    }
    return best;
}

const fmoe_policy_ops fmoe_policy_belady = {
    .name = "belady",
    .summary = "offline optimum: evict the expert used furthest in the future",
    .flags = FMOE_POLICY_NEEDS_FUTURE,
    .init = belady_init,
    .free = belady_free,
    .on_access = belady_on_access,
    .choose_victim = belady_choose_victim,
};
