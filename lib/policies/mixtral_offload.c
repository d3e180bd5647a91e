/*
 * mixtral_offload.c - Mixtral-Offloading (Eliseev & Mazur, "Fast Inference of
 * Mixture-of-Experts Language Models with Offloading", arXiv 2312.17238, 2023, §3.1 "LRU
 * caching" and §3.2 "speculative expert loading"); as fMoE §6.1 and ProMoE §4.2 describe
 * it: "a layer-wise speculative expert prefetching and a LRU-based expert cache".
 *
 * Cache: every MoE layer owns a fixed share of the N slots (N / L, the first N mod L layers
 * one more), managed as LRU within the layer, as the original keeps k experts per layer
 * on the GPU. A layer under its share may take a slot from a layer over its share (that
 * layer's least recently used expert); with N < L some layers own no slot and stream their
 * experts through uncached (the executor computes them without caching).
 *
 * Speculative prefetch: when layer l's gate is known, the trace's /tokens/speculative rows
 * (layer l+s's gate applied to layer l's hidden state, docs/design.md §4) predict layers
 * l+1..l+d, d = the prefetch distance (default 1, the original's; at most the trace's S).
 * For each predicted layer the policy takes every token's top-K experts of the predicted
 * distribution, ranks the union by summed probability and prefetches the best ones up to
 * the layer's share, priority = summed probability / distance. A prefetch only replaces
 * an expert of the same layer (LRU, never one of the experts just predicted or one the
 * current layer still has to access). Decode has one token, so this is the original's
 * "guess the next layer's top-k" exactly; in prefill the union of many tokens is larger
 * than the share and the share caps it.
 *
 * Needs: /tokens/speculative; a trace without it is refused (fmoe_policy_check_inputs).
 * Cost: per gate O(n·J·K) to rank, O(N) per prefetch or miss.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/policy.h"

typedef struct mo_state {
    int32_t L, J, K, N, distance;
    int32_t *quota;        /* [L] slots owned by each layer */
    int32_t *count;        /* [L] scratch: cached experts per layer */
    float *score;          /* [J] scratch: summed probability of the predicted experts */
    int32_t *order;        /* [J] scratch */
    int32_t *picked;       /* [J] scratch: token (+1) that last picked the expert */
    uint8_t *chosen;       /* [J] scratch: in some token's top-K */
    uint8_t *protect;      /* [L*J] experts a prefetch must not evict right now */
    int32_t *protected_ids; /* [L*J] list of set entries in protect[] */
    int32_t num_protected;
} mo_state;

static void mo_free(void *state) {
    mo_state *m = state;
    if (!m) return;
    free(m->quota);
    free(m->count);
    free(m->score);
    free(m->order);
    free(m->picked);
    free(m->chosen);
    free(m->protect);
    free(m->protected_ids);
    free(m);
}

static int mo_init(void **state, const fmoe_policy_config *cfg) {
    *state = NULL;
    FMOE_RETURN_ERROR_IF(cfg->prefetch_distance > cfg->speculative_depth, FMOE_EINVAL,
                         "policy mixtral-offload: prefetch distance %d, but the trace's "
                         "speculative rows reach %d layer%s ahead",
                         cfg->prefetch_distance, cfg->speculative_depth,
                         cfg->speculative_depth == 1 ? "" : "s");
    mo_state *m = calloc(1, sizeof *m);
    if (!m) return fmoe_error_set(FMOE_ENOMEM, "mixtral-offload state");
    m->L = cfg->num_layers;
    m->J = cfg->num_experts;
    m->K = cfg->top_k;
    m->N = cfg->capacity;
    m->distance = cfg->prefetch_distance;
    const size_t ne = (size_t)m->L * (size_t)m->J;
    m->quota = calloc((size_t)m->L, sizeof *m->quota);
    m->count = calloc((size_t)m->L, sizeof *m->count);
    m->score = calloc((size_t)m->J, sizeof *m->score);
    m->order = calloc((size_t)m->J, sizeof *m->order);
    m->picked = calloc((size_t)m->J, sizeof *m->picked);
    m->chosen = calloc((size_t)m->J, 1);
    m->protect = calloc(ne, 1);
    m->protected_ids = calloc(ne, sizeof *m->protected_ids);
    if (!m->quota || !m->count || !m->score || !m->order || !m->picked || !m->chosen ||
        !m->protect || !m->protected_ids) {
        mo_free(m);
        return fmoe_error_set(FMOE_ENOMEM, "mixtral-offload state");
    }
    for (int32_t l = 0; l < m->L; l++) m->quota[l] = m->N / m->L + (l < m->N % m->L ? 1 : 0);
    *state = m;
    return 0;
}

static void protect_clear(mo_state *m) {
    for (int32_t i = 0; i < m->num_protected; i++) m->protect[m->protected_ids[i]] = 0;
    m->num_protected = 0;
}

static void protect_add(mo_state *m, int32_t e) {
    if (m->protect[e]) return;
    m->protect[e] = 1;
    m->protected_ids[m->num_protected++] = e;
}

/* The least recently accessed evictable expert of layer `l` (any layer when l < 0) that is
 * not protected; -1 when none. */
static int32_t lru_in(const mo_state *m, const fmoe_cache_view *v, int32_t l, int over_quota) {
    int32_t best = -1;
    uint64_t best_tick = UINT64_MAX;
    for (int32_t s = 0; s < v->capacity; s++) {
        if (!fmoe_cache_evictable(v, s)) continue;
        const int32_t e = v->slot_expert[s], el = e / m->J;
        if (m->protect[e]) continue;
        if (l >= 0 && el != l) continue;
        if (over_quota && m->count[el] <= m->quota[el]) continue;
        if (v->slot_last_access[s] < best_tick) {
            best_tick = v->slot_last_access[s];
            best = s;
        }
    }
    return best;
}

static int32_t mo_choose_victim(void *state, const fmoe_policy_env *env,
                                const fmoe_victim_request *req) {
    mo_state *m = state;
    const fmoe_cache_view *v = env->cache;
    const int32_t l = req->incoming / m->J;
    for (int32_t i = 0; i < m->L; i++) m->count[i] = 0;
    for (int32_t s = 0; s < v->capacity; s++)
        if (v->slot_expert[s] >= 0) m->count[v->slot_expert[s] / m->J]++;
    /* Under its share: take a slot from a layer over its share. */
    if (m->count[l] < m->quota[l]) {
        const int32_t s = lru_in(m, v, -1, 1);
        if (s >= 0) return s;
    }
    const int32_t s = lru_in(m, v, l, 0);
    if (s >= 0 || req->kind == FMOE_LOAD_PREFETCH) return s;
    return -1; /* a layer without a share of its own streams its experts */
}

static void mo_on_gate(void *state, const fmoe_policy_env *env, const fmoe_gate_event *ev) {
    mo_state *m = state;
    const int32_t J = m->J, K = m->K, l = ev->layer;
    if (!ev->speculative || m->distance < 1) return;
    protect_clear(m);
    for (int32_t q = 0; q < ev->num_distinct; q++) protect_add(m, l * J + ev->distinct[q]);
    for (int32_t s = 0; s < m->distance && l + 1 + s < m->L; s++) {
        const int32_t target = l + 1 + s;
        if (m->quota[target] < 1) continue;
        for (int32_t j = 0; j < J; j++) {
            m->score[j] = 0;
            m->picked[j] = 0;
        }
        for (int32_t t = 0; t < ev->num_tokens; t++) {
            const float *row = ev->speculative + (size_t)t * (size_t)ev->speculative_stride +
                               (size_t)s * (size_t)J;
            /* top-K of this token's predicted distribution (ties: lower index) */
            for (int32_t k = 0; k < K; k++) {
                int32_t best = -1;
                for (int32_t j = 0; j < J; j++)
                    if (m->picked[j] != t + 1 && (best < 0 || row[j] > row[best])) best = j;
                m->picked[best] = t + 1;
                m->score[best] += row[best] > 0 ? row[best] : 0;
                m->chosen[best] = 1;
            }
        }
        int32_t n = 0;
        for (int32_t j = 0; j < J; j++)
            if (m->chosen[j]) {
                m->order[n++] = j;
                m->chosen[j] = 0;
            }
        /* rank by summed probability, ties to the lower index (insertion sort: n <= J) */
        for (int32_t i = 1; i < n; i++) {
            const int32_t x = m->order[i];
            int32_t k = i;
            while (k > 0 && (m->score[m->order[k - 1]] < m->score[x])) {
                m->order[k] = m->order[k - 1];
                k--;
            }
            m->order[k] = x;
        }
        if (n > m->quota[target]) n = m->quota[target];
        for (int32_t i = 0; i < n; i++) protect_add(m, target * J + m->order[i]);
        for (int32_t i = 0; i < n; i++)
            env->sink->prefetch(env->sink->ctx, target, m->order[i],
                                (double)m->score[m->order[i]] / (double)(s + 1),
                                (double)m->score[m->order[i]]);
        }
    /* Demand misses of this layer may not evict the ones it still has to access, but may
     * evict predictions of later layers (the original's cache is per layer anyway). */
    protect_clear(m);
    for (int32_t q = 0; q < ev->num_distinct; q++) protect_add(m, l * J + ev->distinct[q]);
}

/* An expert of the current layer, once accessed, may be evicted for the next one. */
static void mo_on_access(void *state, const fmoe_policy_env *env, const fmoe_access_event *ev) {
    (void)env;
    mo_state *m = state;
    m->protect[ev->layer * m->J + ev->expert] = 0;
}

static void mo_on_layer_done(void *state, const fmoe_policy_env *env, int32_t layer) {
    (void)env;
    (void)layer;
    protect_clear(state);
}

const fmoe_policy_ops fmoe_policy_mixtral_offload = {
    .name = "mixtral-offload",
    .summary = "Mixtral-Offloading: per-layer LRU + speculative prefetch of layer l+1",
    .flags = FMOE_POLICY_NEEDS_SPECULATIVE | FMOE_POLICY_PREFETCHES,
    .init = mo_init,
    .free = mo_free,
    .on_gate = mo_on_gate,
    .on_access = mo_on_access,
    .on_layer_done = mo_on_layer_done,
    .choose_victim = mo_choose_victim,
    .default_distance = 1,
};
