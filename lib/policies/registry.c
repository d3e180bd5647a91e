/*
 * registry.c - the table of built-in policies and the instance helpers (fmoe/policy.h).
 * A new policy adds its `extern const fmoe_policy_ops` here and in `registry` below; its
 * own parameters are rows of its ops->settings (lib/policy_settings.c), not code here.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/policy.h"
#include "next_use.h"
#include "fmoe/predictor.h"

extern const fmoe_policy_ops fmoe_policy_ondemand;
extern const fmoe_policy_ops fmoe_policy_lru;
extern const fmoe_policy_ops fmoe_policy_lfu;
extern const fmoe_policy_ops fmoe_policy_belady;
extern const fmoe_policy_ops fmoe_policy_oracle;
extern const fmoe_policy_ops fmoe_policy_least_stale;
extern const fmoe_policy_ops fmoe_policy_predicted_reuse;
extern const fmoe_policy_ops fmoe_policy_mixtral_offload;
extern const fmoe_policy_ops fmoe_policy_moe_infinity;
extern const fmoe_policy_ops fmoe_policy_moe_infinity_code;
extern const fmoe_policy_ops fmoe_policy_moe_infinity_fb;
extern const fmoe_policy_ops fmoe_policy_promoe;
extern const fmoe_policy_ops fmoe_policy_duoserve;
/* the fMoE family (lib/policies/fmoe.c) */
extern const fmoe_policy_ops fmoe_policy_fmoe;
extern const fmoe_policy_ops fmoe_policy_fmoe_paper;
extern const fmoe_policy_ops fmoe_policy_fmoe_map_t;
extern const fmoe_policy_ops fmoe_policy_fmoe_map_ts;
extern const fmoe_policy_ops fmoe_policy_fmoe_hitcount;
extern const fmoe_policy_ops fmoe_policy_fmoe_lru;
extern const fmoe_policy_ops fmoe_policy_fmoe_lfu;

static const fmoe_policy_ops *const registry[] = {
    &fmoe_policy_ondemand,
    &fmoe_policy_lru,
    &fmoe_policy_lfu,
    &fmoe_policy_belady,
    &fmoe_policy_oracle,
    &fmoe_policy_least_stale,
    &fmoe_policy_predicted_reuse,
    &fmoe_policy_mixtral_offload,
    &fmoe_policy_moe_infinity,
    &fmoe_policy_moe_infinity_code,
    &fmoe_policy_moe_infinity_fb,
    &fmoe_policy_promoe,
    &fmoe_policy_duoserve,
    &fmoe_policy_fmoe,
    &fmoe_policy_fmoe_paper,
    &fmoe_policy_fmoe_map_t,
    &fmoe_policy_fmoe_map_ts,
    &fmoe_policy_fmoe_hitcount,
    &fmoe_policy_fmoe_lru,
    &fmoe_policy_fmoe_lfu,
};
#define NUM_POLICIES (sizeof registry / sizeof registry[0])

size_t fmoe_policy_registry(const fmoe_policy_ops *const **out) {
    *out = registry;
    return NUM_POLICIES;
}

const fmoe_policy_ops *fmoe_policy_find(const char *name) {
    for (size_t i = 0; name && i < NUM_POLICIES; i++)
        if (strcmp(registry[i]->name, name) == 0) return registry[i];
    return NULL;
}

/* Built once from the table (registry names are short: 32 bytes each is ample). */
static pthread_once_t names_once = PTHREAD_ONCE_INIT;
static char names[NUM_POLICIES * 34];

static void build_names(void) {
    size_t at = 0;
    for (size_t i = 0; i < NUM_POLICIES; i++)
        at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "",
                               registry[i]->name);
}

const char *fmoe_policy_names(void) {
    pthread_once(&names_once, build_names);
    return names;
}

static pthread_once_t predictor_names_once = PTHREAD_ONCE_INIT;
static char predictor_names[NUM_POLICIES * 34];

static void build_predictor_names(void) {
    size_t n = 0, at = 0;
    for (size_t i = 0; i < NUM_POLICIES; i++) n += registry[i]->predictor_kind != NULL;
    for (size_t i = 0, k = 0; i < NUM_POLICIES; i++) {
        if (!registry[i]->predictor_kind) continue;
        const char *sep = k == 0 ? "" : k + 1 == n ? " and " : ", ";
        at += (size_t)snprintf(predictor_names + at, sizeof predictor_names - at, "%s%s", sep,
                               registry[i]->name);
        k++;
    }
}

const char *fmoe_policy_predictor_names(void) {
    pthread_once(&predictor_names_once, build_predictor_names);
    return predictor_names;
}

int fmoe_policy_takes_predictor(const fmoe_policy_ops *ops, const char *kind) {
    return ops->predictor_kind && kind && strcmp(ops->predictor_kind, kind) == 0;
}

/* A policy with a predictor kind runs only with a predictor of that kind. */
static int check_predictor(const fmoe_policy_ops *ops, const fmoe_policy_config *cfg) {
    if (!ops->predictor_kind) return 0;
    FMOE_RETURN_ERROR_IF(!cfg->predictor, FMOE_EINVAL,
                         "policy %s needs a predictor: train one with 'fmoe train-predictor "
                         "--kind %s' and pass it with --predictor P.h5",
                         ops->name, ops->predictor_kind);
    FMOE_RETURN_ERROR_IF(!fmoe_policy_takes_predictor(ops, cfg->predictor->kind), FMOE_EINVAL,
                         "policy %s needs a predictor of kind %s, got '%s' (train one with "
                         "'fmoe train-predictor --kind %s')",
                         ops->name, ops->predictor_kind, cfg->predictor->kind,
                         ops->predictor_kind);
    return 0;
}

int fmoe_policy_check_inputs(const fmoe_policy_ops *ops, const fmoe_policy_config *cfg) {
    FMOE_RETURN_ERROR_IF((ops->flags & FMOE_POLICY_NEEDS_PROBS) &&
                             cfg->probs_kind == FMOE_PROBS_NONE,
                         FMOE_EUNSUPPORTED,
                         "policy %s needs gate probabilities; the trace has none (probs_kind "
                         "none: record or import it with probabilities)",
                         ops->name);
    FMOE_RETURN_ERROR_IF((ops->flags & FMOE_POLICY_NEEDS_SPECULATIVE) &&
                             cfg->speculative_depth < 1,
                         FMOE_EUNSUPPORTED,
                         "policy %s needs speculative gate rows (/tokens/speculative: the gate "
                         "of layer l+1 applied to layer l's hidden state); the trace lacks them",
                         ops->name);
    return 0;
}

int fmoe__policy_next_use(const fmoe_policy_config *cfg, uint32_t *next, uint32_t *first) {
    FMOE_RETURN_ERROR_IF(cfg->future_len >= (int64_t)UINT32_MAX, FMOE_ERANGE,
                         "%lld accesses is more than the offline policies support (2^32 - 2)",
                         (long long)cfg->future_len);
    const size_t ne = (size_t)cfg->num_layers * (size_t)cfg->num_experts;
    for (size_t e = 0; e < ne; e++) first[e] = UINT32_MAX;
    /* Backward pass: first[] holds "the first position at or after p" as p decreases. */
    for (size_t p = (size_t)cfg->future_len; p-- > 0;) {
        const uint32_t e = cfg->future[p];
        FMOE_RETURN_ERROR_IF(e >= ne, FMOE_EINVAL, "access %zu names expert id %u >= %zu", p, e,
                             ne);
        next[p] = first[e];
        first[e] = (uint32_t)p;
    }
    return 0;
}

int fmoe_policy_init_ops(fmoe_policy *p, const fmoe_policy_ops *ops,
                         const fmoe_policy_config *cfg) {
    p->ops = ops;
    p->state = NULL;
    FMOE_RETURN_ERROR_IF(!ops || !ops->init || !ops->choose_victim, FMOE_EINVAL,
                         "policy table incomplete");
    FMOE_RETURN_ERROR_IF(cfg->num_layers < 1 || cfg->num_experts < 1 || cfg->top_k < 1 ||
                             cfg->top_k > cfg->num_experts,
                         FMOE_EINVAL, "policy %s: bad geometry L=%d J=%d K=%d", ops->name,
                         cfg->num_layers, cfg->num_experts, cfg->top_k);
    FMOE_RETURN_ERROR_IF(cfg->capacity < 1, FMOE_EINVAL,
                         "policy %s: cache capacity must be at least 1 expert, got %d",
                         ops->name, cfg->capacity);
    FMOE_RETURN_ERROR_IF(cfg->prefetch_distance < 0, FMOE_EINVAL,
                         "policy %s: prefetch distance must be >= 0, got %d", ops->name,
                         cfg->prefetch_distance);
    FMOE_RETURN_ERROR_IF((ops->flags & FMOE_POLICY_NEEDS_FUTURE) && !cfg->future,
                         FMOE_EINVAL,
                         "policy %s needs the future access sequence (simulate only)",
                         ops->name);
    FMOE_RETURN_ERROR_IF(cfg->variant < 0 || cfg->variant >= (ops->variants > 1 ? ops->variants : 1),
                         FMOE_EINVAL, "policy %s has no variant %d", ops->name, cfg->variant);
    FMOE_FORWARD_IF_ERROR(fmoe_policy_check_inputs(ops, cfg));
    FMOE_FORWARD_IF_ERROR(check_predictor(ops, cfg));
    /* the policy's own settings: its init reads them unchecked */
    FMOE_FORWARD_IF_ERROR(fmoe_policy_settings_check(ops, cfg->settings));
    return ops->init(&p->state, cfg);
}

int fmoe_policy_init(fmoe_policy *p, const char *name, const fmoe_policy_config *cfg) {
    const fmoe_policy_ops *ops = fmoe_policy_find(name);
    if (!ops) {
        p->ops = NULL;
        p->state = NULL;
        return fmoe_error_set(FMOE_ENOTFOUND, "unknown policy '%s' (valid: %s)",
                              name ? name : "", fmoe_policy_names());
    }
    return fmoe_policy_init_ops(p, ops, cfg);
}

void fmoe_policy_free(fmoe_policy *p) {
    if (!p || !p->state) return;
    if (p->ops && p->ops->free) p->ops->free(p->state);
    p->state = NULL;
}

int32_t fmoe_policy_victim_lru(const fmoe_cache_view *v) {
    int32_t best = -1;
    uint64_t best_tick = UINT64_MAX;
    for (int32_t s = 0; s < v->capacity; s++) {
        if (!fmoe_cache_evictable(v, s)) continue;
        if (v->slot_last_access[s] < best_tick) {
            best_tick = v->slot_last_access[s];
            best = s;
        }
    }
    return best;
}
