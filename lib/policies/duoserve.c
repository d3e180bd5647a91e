/*
 * duoserve.c - DuoServe-MoE ("DuoServe-MoE: Dual-Phase Expert Prefetch and Cache Scheduling
 * for Efficient MoE LLM Inference" §5; our timing reading: docs/policies.md#duoserve-moe):
 * a GPU expert cache of k slots run as a ring, streamed expert by expert in prefill, and in
 * decode fed by a learned next-layer predictor whose mistakes are re-fetched after the gate.
 *
 * Slots (§5.1: the GPU cache is set to exactly k slots). The paper's cache holds k experts,
 * the next fetched expert overwriting the slot of the one just computed, so nothing is reused
 * across layers or tokens. Here the ring is the executor's cache: a new expert takes the
 * slot whose expert was computed longest ago (least recently used) among those the current
 * layer no longer needs and the next layer's predictions do not hold. At --cache-experts K
 * that is exactly the paper's ring; a larger cache makes a longer ring, and an expert still
 * in it when used again is a hit, which the paper (k slots) never has.
 *
 * Prefill (§5.2, Fig. 4a; docs/policies.md#duoserve-moe): an iteration of several tokens
 * fetches each chosen expert once, in the executor's compute order (first appearance,
 * docs/design.md §7.1), and computes it for all its tokens; the fetch of the next expert
 * goes into the slot of the one just computed and starts when that compute ends (the
 * simulator's slot_free_at, the live executor's slot holds), so with k slots one expert
 * computes while the next k-1 load: the two-stream double buffer. These are the executors'
 * demand loads with the ring's victims; the policy issues no prefetch. Experts no token
 * chose are skipped (the paper is silent; our choice, docs/policies.md#duoserve-moe). Not
 * modelled: the first expert's fetch under the attention (Fig. 4a): the executors' compute
 * order is known only at the gate, so it is fetched after it.
 *
 * Decode (§5.3, Fig. 4b; docs/policies.md#duoserve-moe): an iteration of one token. At layer
 * 0 nothing is predicted: its experts are fetched on demand. At the gate of layer l the State
 * Constructor keeps the token's choice E_l and the predictor (fmoe train-predictor --kind
 * duoserve, fmoe/predictor.h; borrowed through cfg->predictor, refused when absent or of
 * another kind) predicts layer l+1's top-K experts from s_{l+1} = [E_0..E_l, P_{l+1},
 * A_{l,l+1}[E_l]]. Once layer l's accesses are resolved, the K predictions are prefetched in
 * order, each into the ring's next slot: at --cache-experts K the slot of layer l's q-th
 * expert, whose transfer waits for that expert's compute ("after the first expert ...
 * completes its computation, the communication stream immediately starts prefetching", sync
 * point 2). At the gate of l+1 the chosen experts are compared with the loaded ones (sync
 * point 1): a misprediction whose transfer has not started is cancelled, and the missing
 * experts are loaded on demand (the re-fetch), each evicting a mispredicted expert first;
 * when every slot is still loading (a misprediction under way at K slots), the re-fetch is
 * computed from the executors' scratch buffer uncached (their bypass), and a later prediction
 * that finds no slot free of the current layer's work is dropped. The history is dropped
 * after each token ("the State Constructor clears the stored trace"). An iteration of several
 * decode tokens (a batch, which the paper rules out) is run as a prefill.
 *
 * The predictor's own time (about 0.6 ms on a separate stream, §6.4) delays its prefetches
 * by the hardware profile's predictor.duoserve_s, which fmoe calibrate measures; the live
 * runtime pays it for real. Not modelled: the ordering of the paper's communication stream,
 * where a re-fetch queues behind prefetches already issued; the executors put demand loads
 * first.
 *
 * Cost: per decode gate one ExpertMLP inference (Σ w_i·w_{i+1} multiply-adds, in index
 * order: the same bits in both executors) and O(L·J) to build the state; per victim O(N).
 * Memory: the workspace of one row, (L+1)·J floats of state, L·J flag bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/policy.h"
#include "fmoe/predictor.h"
#include "reuse_evict.h"

enum {
    DS_PENDING = 1,   /* chosen at the current layer's gate, not accessed yet */
    DS_PREDICTED = 2, /* prefetched (or found cached) as a prediction for the next layer */
    DS_MISPREDICTED = 4, /* predicted for the current layer, not chosen: evicted first */
};

typedef struct ds_state {
    int32_t L, J, K;
    const fmoe_predictor *pred;   /* borrowed */
    fmoe_expert_mlp_work work;    /* one row */
    float *s;                     /* [(L+1)·J] the state s_{l+1} */
    float *logits;                /* [J] */
    int32_t *top;                 /* [K] the prediction, best first */
    uint16_t *hist;               /* [L][K] this token's experts per layer (State Constructor) */
    uint8_t *flag;                /* [L*J] DS_* bits */
    int32_t *predicted;           /* [L][K] experts predicted for layer l */
    int32_t *num_predicted;       /* [L] */
    int32_t pending;              /* accesses of the current layer not resolved yet */
    int32_t decoding;             /* the current iteration has one token */
    int32_t ready;                /* a prediction for the next layer waits in `top` */
    fmoe__reuse_evict evict;      /* the order among the experts it may evict (setting evict) */
} ds_state;

static const fmoe_policy_setting ds_settings[] = {
    {.name = "evict", .type = FMOE_SETTING_CHOICE, .def = FMOE__EVICT_RECENCY,
     .choices = fmoe__evict_rule_names,
     .help = "among the experts its ring may evict: the least recently used (our reading of "
             "DuoServe-MoE 5.3), or the one predicted-reuse predicts is needed last, by its "
             "per-expert gaps (predicted-reuse) or the request's use rates (request-reuse), "
             "LRU-guarded"},
    {0},
};

static void ds_free(void *state) {
    ds_state *d = state;
    if (!d) return;
    fmoe_expert_mlp_work_free(&d->work);
    free(d->s);
    free(d->logits);
    free(d->top);
    free(d->hist);
    free(d->flag);
    free(d->predicted);
    free(d->num_predicted);
    fmoe__reuse_evict_free(&d->evict);
    free(d);
}

static int ds_init(void **state, const fmoe_policy_config *cfg) {
    *state = NULL;
    /* a predictor of kind duoserve: fmoe_policy_init_ops checked (ops.predictor_kind) */
    const fmoe_predictor *p = cfg->predictor;
    FMOE_RETURN_ERROR_IF(!p->expert_mlp, FMOE_EINVAL,
                         "policy duoserve: the predictor holds no ExpertMLP (train one with "
                         "'fmoe train-predictor --kind duoserve')");
    FMOE_RETURN_ERROR_IF(p->num_layers != cfg->num_layers || p->num_experts != cfg->num_experts ||
                             p->top_k != cfg->top_k,
                         FMOE_EMISMATCH,
                         "policy duoserve: the predictor is for %d MoE layers, %d experts, "
                         "top-%d; the model has %d, %d, top-%d",
                         p->num_layers, p->num_experts, p->top_k, cfg->num_layers,
                         cfg->num_experts, cfg->top_k);
    FMOE_RETURN_ERROR_IF(cfg->prefetch_distance > 1, FMOE_EINVAL,
                         "policy duoserve predicts the next layer only (distance 1, "
                         "DuoServe-MoE §5.3); prefetch distance %d asks otherwise",
                         cfg->prefetch_distance);
    ds_state *d = calloc(1, sizeof *d);
    if (!d) return fmoe_error_set(FMOE_ENOMEM, "duoserve state");
    d->L = cfg->num_layers;
    d->J = cfg->num_experts;
    d->K = cfg->top_k;
    d->pred = p;
    const size_t L = (size_t)d->L, J = (size_t)d->J, K = (size_t)d->K;
    d->s = calloc((L + 1) * J, sizeof *d->s);
    d->logits = calloc(J, sizeof *d->logits);
    d->top = calloc(K, sizeof *d->top);
    d->hist = calloc(L * K, sizeof *d->hist);
    d->flag = calloc(L * J, 1);
    d->predicted = calloc(L * K, sizeof *d->predicted);
    d->num_predicted = calloc(L, sizeof *d->num_predicted);
    int rc = 0;
    if (!d->s || !d->logits || !d->top || !d->hist || !d->flag || !d->predicted ||
        !d->num_predicted)
        rc = fmoe_error_set(FMOE_ENOMEM, "duoserve state");
    if (rc == 0) rc = fmoe_expert_mlp_work_init(&d->work, p->expert_mlp, 1);
    if (rc == 0)
        rc = fmoe__reuse_evict_init(
            &d->evict, (fmoe__evict_rule)fmoe_policy_setting_choice(cfg, ds_settings, "evict"),
            cfg);
    if (rc < 0) {
        ds_free(d);
        return rc;
    }
    *state = d;
    return 0;
}

/* The prediction stream: layer l+1's top-K from the token's experts of layers 0..l. */
static void predict_next(ds_state *d, int32_t l) {
    fmoe_duoserve_state(d->pred, l + 1, d->hist, d->K, d->s);
    fmoe_expert_mlp_infer(d->pred->expert_mlp, &d->work, d->s, 1, d->logits);
    fmoe_topk_indices(d->logits, d->J, d->K, d->top); /* σ is monotone: top-K of the logits */
    d->ready = 1;
}

static void ds_on_request_start(void *state, const fmoe_policy_env *env,
                                const fmoe_request_event *ev) {
    (void)env;
    (void)ev;
    fmoe__reuse_evict_request_start(&((ds_state *)state)->evict);
}

static void ds_on_iteration_start(void *state, const fmoe_policy_env *env,
                                  const fmoe_iteration_event *ev) {
    ds_state *d = state;
    fmoe__reuse_evict_iteration_start(&d->evict, env);
    d->decoding = ev->num_tokens == 1;
    d->ready = 0;
}

/* Issues the waiting prediction for layer l+1 (the ring's next slots). */
static void prefetch_next(ds_state *d, const fmoe_policy_env *env, int32_t l) {
    d->ready = 0;
    const int32_t i = l + 1, J = d->J;
    int32_t *out = d->predicted + (size_t)i * d->K;
    d->num_predicted[i] = 0;
    for (int32_t q = 0; q < d->K; q++) {
        const int32_t j = d->top[q];
        const float p = d->logits[j];
        /* 0: issued or already cached or in flight; 1: dropped (no slot could be freed) */
        if (env->sink->prefetch(env->sink->ctx, i, j, (double)(d->K - q), (double)p) != 0)
            continue;
        d->flag[(size_t)i * J + j] |= DS_PREDICTED;
        out[d->num_predicted[i]++] = j;
    }
}

static void ds_on_gate(void *state, const fmoe_policy_env *env, const fmoe_gate_event *ev) {
    ds_state *d = state;
    const int32_t l = ev->layer, J = d->J;
    uint8_t *fl = d->flag + (size_t)l * J;
    for (int32_t q = 0; q < ev->num_distinct; q++) fl[ev->distinct[q]] |= DS_PENDING;
    /* Sync point 1: the predictions the gate did not choose are mispredictions; one whose
     * transfer has not started is dropped, and all are the first victims of the re-fetch. */
    const int32_t *pr = d->predicted + (size_t)l * d->K;
    for (int32_t q = 0; q < d->num_predicted[l]; q++) {
        const int32_t j = pr[q];
        fl[j] &= (uint8_t)~DS_PREDICTED;
        if (fl[j] & DS_PENDING) continue;
        fl[j] |= DS_MISPREDICTED;
        env->sink->cancel(env->sink->ctx, l, j);
    }
    d->num_predicted[l] = 0;
    d->pending = ev->num_distinct;
    d->decoding = ev->num_tokens == 1;
    d->ready = 0;
    if (!d->decoding || l + 1 >= d->L) return;
    memcpy(d->hist + (size_t)l * d->K, ev->chosen, (size_t)d->K * sizeof *d->hist);
    predict_next(d, l); /* "when Layer N begins the expert computation" */
    if (d->pending == 0) prefetch_next(d, env, l);
}

static void ds_on_access(void *state, const fmoe_policy_env *env, const fmoe_access_event *ev) {
    ds_state *d = state;
    d->flag[(size_t)ev->layer * d->J + ev->expert] &= (uint8_t)~DS_PENDING;
    fmoe__reuse_evict_access(&d->evict, env, ev);
    if (--d->pending == 0 && d->ready) prefetch_next(d, env, ev->layer);
}

static void ds_on_layer_done(void *state, const fmoe_policy_env *env, int32_t layer) {
    (void)env;
    ds_state *d = state;
    uint8_t *fl = d->flag + (size_t)layer * d->J;
    for (int32_t j = 0; j < d->J; j++) fl[j] &= (uint8_t)~(DS_PENDING | DS_MISPREDICTED);
}

/* The first in evict's order (recency: the least recently used) of the evictable slots
 * whose expert has none of the `avoid` bits and, when `want` is not 0, has one of them;
 * -1 when none. */
static int32_t lru_where(const ds_state *d, const fmoe_cache_view *v, uint8_t avoid,
                         uint8_t want) {
    int32_t best = -1;
    for (int32_t s = 0; s < v->capacity; s++) {
        if (!fmoe_cache_evictable(v, s)) continue;
        const uint8_t f = d->flag[v->slot_expert[s]];
        if ((f & avoid) || (want && !(f & want))) continue;
        if (fmoe__reuse_evict_before(&d->evict, v, s, best)) best = s;
    }
    return best;
}

static int32_t ds_choose_victim(void *state, const fmoe_policy_env *env,
                                const fmoe_victim_request *req) {
    const ds_state *d = state;
    const fmoe_cache_view *v = env->cache;
    if (req->kind == FMOE_LOAD_PREFETCH) /* the ring's next slot, or nothing */
        return lru_where(d, v, DS_PENDING | DS_PREDICTED, 0);
    int32_t s = lru_where(d, v, DS_PENDING, DS_MISPREDICTED); /* the re-fetch's slot */
    if (s < 0) s = lru_where(d, v, DS_PENDING | DS_PREDICTED, 0);
    if (s < 0) s = lru_where(d, v, DS_PENDING, 0);
    if (s < 0) s = lru_where(d, v, 0, 0); /* fewer slots than the layer's experts */
    return s;
}

const fmoe_policy_ops fmoe_policy_duoserve = {
    .name = "duoserve",
    .summary = "DuoServe-MoE: k-slot ring, expert-by-expert prefill pipeline, "
               "learned next-layer prediction in decode (--predictor)",
    .flags = FMOE_POLICY_PREFETCHES,
    .init = ds_init,
    .free = ds_free,
    .on_request_start = ds_on_request_start,
    .on_iteration_start = ds_on_iteration_start,
    .on_gate = ds_on_gate,
    .on_access = ds_on_access,
    .on_layer_done = ds_on_layer_done,
    .choose_victim = ds_choose_victim,
    .default_distance = 1,
    .predictor_kind = FMOE_PREDICTOR_KIND_DUOSERVE,
    .settings = ds_settings,
};
