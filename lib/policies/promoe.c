/*
 * promoe.c - ProMoE (papers/promoe.txt; POLICIES.md §2): a learned predictor per MoE layer
 * reads the gate input of layer i-k and predicts layer i's experts, which are prefetched at
 * low priority k layers ahead; the gate of layer i drops its unneeded predictions (early
 * preemption); the cache is LRU.
 *
 * Prediction (§2.4; the predictor of fmoe train-predictor --kind promoe, fmoe/predictor.h,
 * borrowed through cfg->predictor and refused when absent). At the gate of layer l the
 * policy runs, for every target layer i whose source layer is l (i = l + k; at l = 0 the
 * layers 1..k, "i-k falls back to 0 when i < k"), predictor i on each token's gate input
 * of layer l (fmoe_gate_event.hidden) and takes each token's top-K experts (K = the
 * model's top-k, "N = the number the model activates per token"). The iteration's tokens
 * are combined as POLICIES.md §2.4 settles for prefill and batches: the union of the
 * per-token top-K, ranked by summed probability; a decode step is its one token's top-K.
 * The paper hooks the gate's input, we the gate event: the same hidden state, known a gate
 * computation earlier than here. The predictor's CPU time (~200 µs, §2.4, §2.7) is not
 * modelled yet: the prefetches are issued at the gate with no delay.
 *
 * Prefetch (§2.5, §2.7 step 1). The predicted experts not cached or in flight are
 * prefetched, low priority: every demand load goes first (the executors' rule), and among
 * prefetches the nearer target layer first, then the higher mean probability (priority =
 * L - i + p/2, p in [0, 1]). Chunked prefetch (§5.1, three chunks per expert) is the
 * executor's: fmoe simulate --copy-chunks 3 models it.
 *
 * Early preemption (§2.5 "5.2", §2.7 step 2). At the gate of layer l its predictions the
 * gate did not choose are cancelled if their transfer has not started (a started one
 * completes: a copy is not preemptible); a chosen one still queued is promoted by the
 * executor to a demand load when its access comes (fmoe/slots.h), ahead of every
 * prefetch: ProMoE's high-priority re-enqueue. Reordered compute (§5.3: cached experts
 * first, then those in flight, then the rest) is an executor matter and not done: the
 * executors compute in the §7.1 order of first appearance.
 *
 * Cache (§2.5: "replacement policy not specified"; the ablation's base is LRU). LRU, with
 * the default POLICIES.md §2.5 proposes for the ambiguity "pin-until-used": a predicted
 * expert is not evicted until its layer accessed it or passed, unless only predicted
 * experts are left to evict (then plain LRU for a demand miss); a prefetch also never
 * evicts an expert the current layer has still to access, and is dropped when nothing
 * else is evictable. Without gate inputs (live executors for now pass none) the policy
 * predicts nothing and is exactly lru.
 *
 * Cost: per gate, for each predicted layer, one predictor pass over the iteration's
 * tokens in batches of PM_BATCH rows (2·n·(h·H + H·J) flops) and O(n·K·J) to rank; per
 * miss O(N). Memory: PM_BATCH·(h + 4H + 2J) floats of scratch, 2·L·J bytes of flags.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/policy.h"
#include "fmoe/predictor.h"

#define PM_BATCH 64 /* predictor rows per forward pass */

enum { PM_PREDICTED = 1, PM_PENDING = 2 }; /* flag bits per expert */

typedef struct pm_state {
    int32_t L, J, K, h;
    const fmoe_predictor *pred;  /* borrowed */
    int32_t *targets;            /* [L][L] layers predicted at layer l's gate, nearest first */
    int32_t *num_targets;        /* [L] */
    fmoe_mlp_work work;          /* PM_BATCH rows */
    float *x;                    /* [PM_BATCH][h] gathered gate inputs */
    float *score;                /* [J] summed probability of the experts picked */
    int32_t *top;                /* [K] one token's top-K */
    uint8_t *picked;             /* [J] in some token's top-K */
    int32_t *order;              /* [J] the picked experts, best first */
    uint8_t *flag;               /* [L*J] PM_* bits */
    int32_t *issued;             /* [L][J] experts predicted (and cached or in flight) for
                                    layer i in this iteration */
    int32_t *num_issued;         /* [L] */
} pm_state;

static void pm_free(void *state) {
    pm_state *m = state;
    if (!m) return;
    free(m->targets);
    free(m->num_targets);
    fmoe_mlp_work_free(&m->work);
    free(m->x);
    free(m->score);
    free(m->top);
    free(m->picked);
    free(m->order);
    free(m->flag);
    free(m->issued);
    free(m->num_issued);
    free(m);
}

static int pm_init(void **state, const fmoe_policy_config *cfg) {
    *state = NULL;
    const fmoe_predictor *p = cfg->predictor;
    FMOE_RETURN_ERROR_IF(!p, FMOE_EINVAL,
                         "policy promoe needs a predictor: train one with 'fmoe train-predictor "
                         "--kind promoe' and pass it with --predictor P.h5");
    FMOE_RETURN_ERROR_IF(strcmp(p->kind, FMOE_PREDICTOR_KIND_PROMOE) != 0, FMOE_EINVAL,
                         "policy promoe needs a predictor of kind promoe, got '%s'", p->kind);
    FMOE_RETURN_ERROR_IF(p->num_layers != cfg->num_layers || p->num_experts != cfg->num_experts ||
                             p->top_k != cfg->top_k,
                         FMOE_EMISMATCH,
                         "policy promoe: the predictor is for %d MoE layers, %d experts, top-%d; "
                         "the model has %d, %d, top-%d",
                         p->num_layers, p->num_experts, p->top_k, cfg->num_layers,
                         cfg->num_experts, cfg->top_k);
    FMOE_RETURN_ERROR_IF(cfg->hidden_dim > 0 && cfg->hidden_dim != p->hidden_size,
                         FMOE_EMISMATCH,
                         "policy promoe: the predictor reads gate inputs of width %d; the trace's "
                         "are %d wide",
                         p->hidden_size, cfg->hidden_dim);
    FMOE_RETURN_ERROR_IF(cfg->prefetch_distance != 0 && cfg->prefetch_distance != p->stride,
                         FMOE_EINVAL,
                         "policy promoe prefetches the predictor's stride ahead (k = %d); "
                         "prefetch distance %d asks otherwise",
                         p->stride, cfg->prefetch_distance);
    pm_state *m = calloc(1, sizeof *m);
    if (!m) return fmoe_error_set(FMOE_ENOMEM, "promoe state");
    m->L = cfg->num_layers;
    m->J = cfg->num_experts;
    m->K = cfg->top_k;
    m->h = p->hidden_size;
    m->pred = p;
    const size_t L = (size_t)m->L, J = (size_t)m->J;
    m->targets = calloc(L * L, sizeof *m->targets);
    m->num_targets = calloc(L, sizeof *m->num_targets);
    m->x = calloc((size_t)PM_BATCH * (size_t)m->h, sizeof *m->x);
    m->score = calloc(J, sizeof *m->score);
    m->top = calloc((size_t)m->K, sizeof *m->top);
    m->picked = calloc(J, 1);
    m->order = calloc(J, sizeof *m->order);
    m->flag = calloc(L * J, 1);
    m->issued = calloc(L * J, sizeof *m->issued);
    m->num_issued = calloc(L, sizeof *m->num_issued);
    int rc = 0;
    if (!m->targets || !m->num_targets || !m->x || !m->score || !m->top || !m->picked ||
        !m->order || !m->flag || !m->issued || !m->num_issued) {
        rc = fmoe_error_set(FMOE_ENOMEM, "promoe state");
        goto fail;
    }
    /* The layers each gate predicts (increasing, so nearest first), and one workspace for
     * the widest predictor (every layer's has the same shape, fmoe_predictor_read checks). */
    const fmoe_mlp *widest = NULL;
    for (int32_t i = 1; i < m->L; i++) {
        const fmoe_mlp *mlp = &p->layers[i];
        if (!mlp->w1 || p->source_layer[i] < 0 || p->source_layer[i] >= i) continue;
        if (mlp->in != m->h || mlp->out != m->J) {
            rc = fmoe_error_set(FMOE_EINVAL,
                                "policy promoe: predictor %d has shape %d -> %d, expected %d -> %d",
                                i, mlp->in, mlp->out, m->h, m->J);
            goto fail;
        }
        const int32_t s = p->source_layer[i];
        m->targets[(size_t)s * L + (size_t)m->num_targets[s]++] = i;
        if (!widest || mlp->hidden > widest->hidden) widest = mlp;
    }
    if (widest && (rc = fmoe_mlp_work_init(&m->work, widest, PM_BATCH)) < 0) goto fail;
    *state = m;
    return 0;
fail:
    pm_free(m);
    return rc;
}

/* Predictor i over the n tokens' gate inputs of this layer: the union of the per-token
 * top-K in m->order[0..*count), best summed probability first (ties: lower index). */
static int32_t predict(pm_state *m, int32_t i, const fmoe_gate_event *ev) {
    const fmoe_mlp *mlp = &m->pred->layers[i];
    const int32_t J = m->J, K = m->K, h = m->h;
    memset(m->score, 0, (size_t)J * sizeof *m->score);
    memset(m->picked, 0, (size_t)J);
    for (int32_t t0 = 0; t0 < ev->num_tokens; t0 += PM_BATCH) {
        const int32_t n = ev->num_tokens - t0 < PM_BATCH ? ev->num_tokens - t0 : PM_BATCH;
        for (int32_t r = 0; r < n; r++)
            memcpy(m->x + (size_t)r * h, ev->hidden + (size_t)(t0 + r) * (size_t)ev->hidden_stride,
                   (size_t)h * sizeof *m->x);
        fmoe_mlp_infer(mlp, &m->work, m->x, n); /* the same bits in every executor */
        for (int32_t r = 0; r < n; r++) {
            const float *pr = m->work.p + (size_t)r * J;
            fmoe_topk_indices(pr, J, K, m->top);
            for (int32_t k = 0; k < K; k++) {
                m->score[m->top[k]] += pr[m->top[k]];
                m->picked[m->top[k]] = 1;
            }
        }
    }
    int32_t count = 0;
    for (int32_t j = 0; j < J; j++)
        if (m->picked[j]) {
            int32_t q = count++; /* insertion by score, stable: ties keep the lower index */
            while (q > 0 && m->score[m->order[q - 1]] < m->score[j]) {
                m->order[q] = m->order[q - 1];
                q--;
            }
            m->order[q] = j;
        }
    return count;
}

static void pm_on_gate(void *state, const fmoe_policy_env *env, const fmoe_gate_event *ev) {
    pm_state *m = state;
    const int32_t J = m->J, l = ev->layer;
    uint8_t *fl = m->flag + (size_t)l * J;
    /* Early preemption: the gate has chosen; this layer's predictions it did not choose
     * lose their protection and, if still queued, their transfer. */
    for (int32_t q = 0; q < ev->num_distinct; q++) fl[ev->distinct[q]] |= PM_PENDING;
    const int32_t *issued = m->issued + (size_t)l * J;
    for (int32_t q = 0; q < m->num_issued[l]; q++) {
        const int32_t j = issued[q];
        if (fl[j] & PM_PENDING) continue;
        fl[j] = 0;
        env->sink->cancel(env->sink->ctx, l, j);
    }
    m->num_issued[l] = 0;
    if (!ev->hidden || ev->hidden_dim != m->h || ev->num_tokens < 1) return; /* LRU alone */
    for (int32_t c = 0; c < m->num_targets[l]; c++) {
        const int32_t i = m->targets[(size_t)l * m->L + c];
        const int32_t n = predict(m, i, ev);
        int32_t *out = m->issued + (size_t)i * J;
        for (int32_t q = 0; q < n; q++) {
            const int32_t j = m->order[q];
            const double p = (double)m->score[j] / (double)ev->num_tokens;
            /* 0: issued or already cached or in flight; 1: dropped (nothing evictable) */
            if (env->sink->prefetch(env->sink->ctx, i, j, (double)(m->L - i) + 0.5 * p, p) != 0)
                continue;
            if (!(m->flag[(size_t)i * J + j] & PM_PREDICTED)) out[m->num_issued[i]++] = j;
            m->flag[(size_t)i * J + j] |= PM_PREDICTED;
        }
    }
}

/* Accessed: no longer pending, no longer waiting to be used. */
static void pm_on_access(void *state, const fmoe_policy_env *env, const fmoe_access_event *ev) {
    (void)env;
    pm_state *m = state;
    m->flag[(size_t)ev->layer * m->J + ev->expert] = 0;
}

static void pm_on_layer_done(void *state, const fmoe_policy_env *env, int32_t layer) {
    (void)env;
    pm_state *m = state;
    memset(m->flag + (size_t)layer * m->J, 0, (size_t)m->J);
    m->num_issued[layer] = 0;
}

/* LRU; a demand miss spares predicted experts while it can, a prefetch always and also the
 * current layer's experts still to be accessed (then it takes nothing). */
static int32_t pm_choose_victim(void *state, const fmoe_policy_env *env,
                                const fmoe_victim_request *req) {
    const pm_state *m = state;
    const fmoe_cache_view *v = env->cache;
    const uint8_t spare = req->kind == FMOE_LOAD_PREFETCH ? PM_PREDICTED | PM_PENDING
                                                          : PM_PREDICTED;
    int32_t best = -1;
    uint64_t best_tick = UINT64_MAX;
    for (int32_t s = 0; s < v->capacity; s++) {
        if (!fmoe_cache_evictable(v, s) || (m->flag[v->slot_expert[s]] & spare)) continue;
        if (v->slot_last_access[s] < best_tick) {
            best_tick = v->slot_last_access[s];
            best = s;
        }
    }
    if (best >= 0 || req->kind == FMOE_LOAD_PREFETCH) return best;
    return fmoe_policy_victim_lru(v);
}

const fmoe_policy_ops fmoe_policy_promoe = {
    /* .name          = */ "promoe",
    /* .summary       = */ "ProMoE: learned stride-k prediction from gate inputs, low-priority "
                           "prefetch, early preemption, LRU (--predictor)",
    /* .flags         = */ FMOE_POLICY_NEEDS_HIDDEN | FMOE_POLICY_PREFETCHES,
    /* .init          = */ pm_init,
    /* .free          = */ pm_free,
    /* .on_request_start   = */ NULL,
    /* .on_iteration_start = */ NULL,
    /* .on_gate       = */ pm_on_gate,
    /* .on_access     = */ pm_on_access,
    /* .on_layer_done = */ pm_on_layer_done,
    /* .choose_victim = */ pm_choose_victim,
    /* .on_iteration_end   = */ NULL,
    /* .on_request_end     = */ NULL,
    /* .default_distance   = */ 0,
    /* .variants           = */ 0,
    /* .expert_store       = */ NULL,
};
