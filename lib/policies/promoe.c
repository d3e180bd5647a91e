/*
 * promoe.c - ProMoE ("ProMoE: Fast MoE-based LLM Serving using Proactive Caching"; our
 * readings in docs/policies.md#promoe; § below are the paper's): a learned predictor per MoE
 * layer reads the gate input of layer i-k and predicts layer i's experts, which are
 * prefetched at low priority k layers ahead; the gate of layer i drops its unneeded
 * predictions (early preemption); the cache is LRU.
 *
 * Prediction (§4.4; the predictor of fmoe train-predictor --kind promoe, fmoe/predictor.h,
 * borrowed through cfg->predictor and refused when absent). At the gate of layer l the policy
 * runs, for every target layer i whose source layer is l (i = l + k; at l = 0 the layers
 * 1..k, "i-k falls back to 0 when i < k"), predictor i on each token's gate input of layer l
 * (fmoe_gate_event.hidden) and takes each token's top-K experts (K = the model's top-k, "N =
 * the number the model activates per token"). The iteration's tokens are combined as we
 * settle it for prefill and batches, where the paper is silent (docs/policies.md#promoe): the
 * union of the per-token top-K, ranked by summed probability; a decode step is its one
 * token's top-K. The paper hooks the gate's input, we the gate event: the same hidden state,
 * known a gate computation earlier than here.
 *
 * Where the predictor runs (§4.4: on the CPU, asynchronously with inference). Inline, the
 * prefetches are issued at the gate (the simulator, and live with --sync-predictions);
 * the simulator delays them by the predictor's calibrated time (the profile's
 * predictor.promoe_s, fmoe_slots_config.prefetch_delay_s). Live by default
 * (cfg->predict_thread) the passes run on a thread of their own (lib/worker.h): the gate
 * posts its tokens' inputs and returns; a finished pass is taken at the next event (an
 * access, a layer done, a gate) and issues what the inline pass issues at the gate, for
 * the target layers that have not started (a prediction for a started layer comes too
 * late and is dropped). A gate of more than PM_BATCH tokens predicts inline.
 *
 * Prefetch (§5; docs/policies.md#promoe). The predicted experts not cached or in flight are
 * prefetched, low priority: every demand load goes first (the executors' rule), and among
 * prefetches the nearer target layer first, then the higher mean probability (priority =
 * L - i + p/2, p in [0, 1]). Chunked prefetch (§5.1, three chunks per expert) is the
 * executor's: fmoe simulate --copy-chunks 3 models it.
 *
 * Early preemption (§5.2). At the gate of layer l its predictions the gate did not choose are
 * cancelled if their transfer has not started (a started one completes: a copy is not
 * preemptible); a chosen one still queued is promoted by the executor to a demand load when
 * its access comes (fmoe/slots.h), ahead of every prefetch: ProMoE's high-priority
 * re-enqueue. Reordered compute (§5.3: cached experts first, then those in flight, then the
 * rest) is the executors', asked for with FMOE_POLICY_REORDER_COMPUTE: both resolve and
 * compute a layer's experts in the order of fmoe_slots_compute_order, so a cached expert
 * computes while a missing one loads.
 *
 * Cache (the paper specifies no replacement policy; its ablation's base is LRU). LRU, with
 * our default where the paper is silent, "pin-until-used" (docs/policies.md#promoe): a
 * predicted expert is not evicted until its layer accessed it or passed, unless only
 * predicted experts are left to evict (then plain LRU for a demand miss); a prefetch also
 * never evicts an expert the current layer has still to access, and is dropped when nothing
 * else is evictable. Without gate inputs the policy predicts nothing: it is lru with
 * reordered compute.
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
#include "reuse_evict.h"
#include "worker.h"

#define PM_BATCH 64 /* predictor rows per forward pass; most tokens a thread job holds */

enum { PM_PREDICTED = 1, PM_PENDING = 2 }; /* flag bits per expert */

/* One predictor pass's workspace (the policy's, and the thread's own). */
typedef struct pm_scratch {
    fmoe_mlp_work work;          /* PM_BATCH rows */
    float *x;                    /* [PM_BATCH][h] gathered gate inputs */
    float *score;                /* [J] summed probability of the experts picked */
    int32_t *top;                /* [K] one token's top-K */
    uint8_t *picked;             /* [J] in some token's top-K */
    int32_t *order;              /* [J] the picked experts, best first */
} pm_scratch;

/* A thread job: one gate's tokens' inputs; its result: every target layer's picks. */
typedef struct pm_job {
    int32_t layer, n;
    float x[];                   /* [n][h] */
} pm_job;

typedef struct pm_result {
    int32_t layer, num_tokens;
    int32_t data[];              /* per target c < num_targets[layer]: count, order[J],
                                    then score[J] as float bits */
} pm_result;

typedef struct pm_state {
    int32_t L, J, K, h;
    const fmoe_predictor *pred;  /* borrowed */
    int32_t *targets;            /* [L][L] layers predicted at layer l's gate, nearest first */
    int32_t *num_targets;        /* [L] */
    pm_scratch mine;             /* the policy's (inline passes) */
    pm_scratch thread;           /* the thread's */
    fmoe_worker *worker;         /* the predictor on its own thread (cfg->predict_thread) */
    uint64_t epoch;              /* the iteration, for the thread's jobs */
    int32_t cur_layer;           /* the last gate's layer this iteration, -1 before */
    pm_result *taken;            /* a result being taken */
    float *taken_score;          /* [J] one target's scores of it */
    uint8_t *flag;               /* [L*J] PM_* bits */
    int32_t *issued;             /* [L][J] experts predicted (and cached or in flight) for
                                    layer i in this iteration */
    int32_t *num_issued;         /* [L] */
    fmoe__reuse_evict evict;     /* the order among the experts it may evict (setting evict) */
} pm_state;

static const fmoe_policy_setting pm_settings[] = {
    {.name = "evict", .type = FMOE_SETTING_CHOICE, .def = FMOE__EVICT_RECENCY,
     .choices = fmoe__evict_rule_names,
     .help = "among the experts it may evict: the least recently used (ProMoE's base), or "
             "the one predicted-reuse predicts is needed last, by its per-expert gaps "
             "(predicted-reuse) or the request's use rates (request-reuse), LRU-guarded"},
    {0},
};

static void scratch_free(pm_scratch *s) {
    fmoe_mlp_work_free(&s->work);
    free(s->x);
    free(s->score);
    free(s->top);
    free(s->picked);
    free(s->order);
}

static int scratch_init(pm_scratch *s, const pm_state *m, const fmoe_mlp *widest) {
    s->x = calloc((size_t)PM_BATCH * (size_t)m->h, sizeof *s->x);
    s->score = calloc((size_t)m->J, sizeof *s->score);
    s->top = calloc((size_t)m->K, sizeof *s->top);
    s->picked = calloc((size_t)m->J, 1);
    s->order = calloc((size_t)m->J, sizeof *s->order);
    if (!s->x || !s->score || !s->top || !s->picked || !s->order)
        return fmoe_error_set(FMOE_ENOMEM, "promoe state");
    return widest ? fmoe_mlp_work_init(&s->work, widest, PM_BATCH) : 0;
}

static void pm_free(void *state) {
    pm_state *m = state;
    if (!m) return;
    fmoe_worker_stop(m->worker); /* first: the thread uses its scratch and the predictor */
    scratch_free(&m->thread);
    scratch_free(&m->mine);
    free(m->taken);
    free(m->taken_score);
    free(m->targets);
    free(m->num_targets);
    free(m->flag);
    free(m->issued);
    free(m->num_issued);
    fmoe__reuse_evict_free(&m->evict);
    free(m);
}

static int run_job(void *ctx, const void *jobp, void *resultp);

static int pm_init(void **state, const fmoe_policy_config *cfg) {
    *state = NULL;
    /* a predictor of kind promoe: fmoe_policy_init_ops checked (ops.predictor_kind) */
    const fmoe_predictor *p = cfg->predictor;
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
    m->cur_layer = -1;
    m->targets = calloc(L * L, sizeof *m->targets);
    m->num_targets = calloc(L, sizeof *m->num_targets);
    m->flag = calloc(L * J, 1);
    m->issued = calloc(L * J, sizeof *m->issued);
    m->num_issued = calloc(L, sizeof *m->num_issued);
    int rc = fmoe__reuse_evict_init(
        &m->evict, (fmoe__evict_rule)fmoe_policy_setting_choice(cfg, pm_settings, "evict"), cfg);
    if (rc < 0) goto fail;
    if (!m->targets || !m->num_targets || !m->flag || !m->issued || !m->num_issued) {
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
    if ((rc = scratch_init(&m->mine, m, widest)) < 0) goto fail;
    if (cfg->predict_thread && widest) {
        int32_t most = 0; /* targets of one gate at most */
        for (int32_t l = 0; l < m->L; l++) most = m->num_targets[l] > most ? m->num_targets[l] : most;
        const size_t result_bytes =
            sizeof(pm_result) + (size_t)most * (1 + 2 * (size_t)m->J) * sizeof(int32_t);
        m->taken = malloc(result_bytes);
        m->taken_score = malloc(J * sizeof *m->taken_score);
        if (!m->taken || !m->taken_score) {
            rc = fmoe_error_set(FMOE_ENOMEM, "promoe state");
            goto fail;
        }
        if ((rc = scratch_init(&m->thread, m, widest)) < 0) goto fail;
        const fmoe_worker_config wc = {
            .capacity = m->L + 1, /* one job a gate */
            .job_bytes = sizeof(pm_job) + (size_t)PM_BATCH * (size_t)m->h * sizeof(float),
            .result_bytes = result_bytes, .run = run_job, .ctx = m,
            .delay_s = cfg->predict_delay_s};
        if ((rc = fmoe_worker_start(&m->worker, &wc)) < 0) goto fail;
    }
    *state = m;
    return 0;
fail:
    pm_free(m);
    return rc;
}

/* Predictor i over the gate inputs of n tokens, hidden[t * stride + 0..h): the union of
 * the per-token top-K in s->order[0..count), best summed probability (s->score) first
 * (ties: lower index). @return count. */
static int32_t predict(const pm_state *m, pm_scratch *s, int32_t i, const float *hidden,
                       int64_t stride, int32_t num_tokens) {
    const fmoe_mlp *mlp = &m->pred->layers[i];
    const int32_t J = m->J, K = m->K, h = m->h;
    memset(s->score, 0, (size_t)J * sizeof *s->score);
    memset(s->picked, 0, (size_t)J);
    for (int32_t t0 = 0; t0 < num_tokens; t0 += PM_BATCH) {
        const int32_t n = num_tokens - t0 < PM_BATCH ? num_tokens - t0 : PM_BATCH;
        for (int32_t r = 0; r < n; r++)
            memcpy(s->x + (size_t)r * h, hidden + (size_t)(t0 + r) * (size_t)stride,
                   (size_t)h * sizeof *s->x);
        fmoe_mlp_infer(mlp, &s->work, s->x, n); /* the same bits in every executor */
        for (int32_t r = 0; r < n; r++) {
            const float *pr = s->work.p + (size_t)r * J;
            fmoe_topk_indices(pr, J, K, s->top);
            for (int32_t k = 0; k < K; k++) {
                s->score[s->top[k]] += pr[s->top[k]];
                s->picked[s->top[k]] = 1;
            }
        }
    }
    int32_t count = 0;
    for (int32_t j = 0; j < J; j++)
        if (s->picked[j]) {
            int32_t q = count++; /* insertion by score, stable: ties keep the lower index */
            while (q > 0 && s->score[s->order[q - 1]] < s->score[j]) {
                s->order[q] = s->order[q - 1];
                q--;
            }
            s->order[q] = j;
        }
    return count;
}

/* Prefetches target layer i's picks, order[0..count) with summed probabilities score[J]
 * over num_tokens tokens, low priority, and marks them predicted. */
static void issue_predictions(pm_state *m, const fmoe_policy_env *env, int32_t i,
                              const int32_t *order, int32_t count, const float *score,
                              int32_t num_tokens) {
    const int32_t J = m->J;
    int32_t *out = m->issued + (size_t)i * J;
    for (int32_t q = 0; q < count; q++) {
        const int32_t j = order[q];
        const double p = (double)score[j] / (double)num_tokens;
        /* 0: issued or already cached or in flight; 1: dropped (nothing evictable) */
        if (env->sink->prefetch(env->sink->ctx, i, j, (double)(m->L - i) + 0.5 * p, p) != 0)
            continue;
        if (!(m->flag[(size_t)i * J + j] & PM_PREDICTED)) out[m->num_issued[i]++] = j;
        m->flag[(size_t)i * J + j] |= PM_PREDICTED;
    }
}

/* The thread's job: every target of the gate's layer over its tokens. */
static int run_job(void *ctx, const void *jobp, void *resultp) {
    pm_state *m = ctx; /* read-only here, but for m->thread, the thread's own */
    const pm_job *j = jobp;
    pm_result *r = resultp;
    r->layer = j->layer;
    r->num_tokens = j->n;
    int32_t *d = r->data;
    const size_t J = (size_t)m->J;
    for (int32_t c = 0; c < m->num_targets[j->layer]; c++) {
        const int32_t i = m->targets[(size_t)j->layer * (size_t)m->L + (size_t)c];
        const int32_t count = predict(m, &m->thread, i, j->x, m->h, j->n);
        d[0] = count;
        memcpy(d + 1, m->thread.order, (size_t)count * sizeof *d);
        memcpy(d + 1 + J, m->thread.score, J * sizeof(float));
        d += 1 + 2 * J;
    }
    return 1;
}

/* The thread's finished passes of this iteration, for the layers that have not started. */
static void take_predictions(pm_state *m, const fmoe_policy_env *env) {
    uint64_t epoch;
    const size_t J = (size_t)m->J;
    while (fmoe_worker_poll(m->worker, &epoch, m->taken)) {
        if (epoch != m->epoch) continue;
        const pm_result *r = m->taken;
        const int32_t *d = r->data;
        for (int32_t c = 0; c < m->num_targets[r->layer]; c++, d += 1 + 2 * J) {
            const int32_t i = m->targets[(size_t)r->layer * (size_t)m->L + (size_t)c];
            if (i <= m->cur_layer) continue; /* too late */
            memcpy(m->taken_score, d + 1 + J, J * sizeof *m->taken_score);
            issue_predictions(m, env, i, d + 1, d[0], m->taken_score, r->num_tokens);
        }
    }
}

static void pm_on_request_start(void *state, const fmoe_policy_env *env,
                                const fmoe_request_event *ev) {
    (void)env;
    (void)ev;
    fmoe__reuse_evict_request_start(&((pm_state *)state)->evict);
}

static void pm_on_iteration_start(void *state, const fmoe_policy_env *env,
                                  const fmoe_iteration_event *ev) {
    (void)ev;
    pm_state *m = state;
    fmoe__reuse_evict_iteration_start(&m->evict, env);
    m->cur_layer = -1;
    if (m->worker) fmoe_worker_epoch(m->worker, ++m->epoch);
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
    m->cur_layer = l;
    if (!ev->hidden || ev->hidden_dim != m->h || ev->num_tokens < 1) return; /* LRU alone */
    if (m->worker && ev->num_tokens <= PM_BATCH) {
        pm_job *j = m->num_targets[l] > 0 ? fmoe_worker_job(m->worker, m->epoch) : NULL;
        if (j) {
            j->layer = l;
            j->n = ev->num_tokens;
            for (int32_t t = 0; t < ev->num_tokens; t++)
                memcpy(j->x + (size_t)t * (size_t)m->h,
                       ev->hidden + (size_t)t * (size_t)ev->hidden_stride,
                       (size_t)m->h * sizeof *j->x);
            fmoe_worker_post(m->worker);
        }
        take_predictions(m, env);
        return;
    }
    for (int32_t c = 0; c < m->num_targets[l]; c++) {
        const int32_t i = m->targets[(size_t)l * m->L + c];
        const int32_t n = predict(m, &m->mine, i, ev->hidden, ev->hidden_stride, ev->num_tokens);
        issue_predictions(m, env, i, m->mine.order, n, m->mine.score, ev->num_tokens);
    }
}

/* Accessed: no longer pending, no longer waiting to be used. */
static void pm_on_access(void *state, const fmoe_policy_env *env, const fmoe_access_event *ev) {
    pm_state *m = state;
    m->flag[(size_t)ev->layer * m->J + ev->expert] = 0;
    fmoe__reuse_evict_access(&m->evict, env, ev);
    if (m->worker) take_predictions(m, env);
}

static void pm_on_layer_done(void *state, const fmoe_policy_env *env, int32_t layer) {
    pm_state *m = state;
    memset(m->flag + (size_t)layer * m->J, 0, (size_t)m->J);
    m->num_issued[layer] = 0;
    if (m->worker) take_predictions(m, env);
}

/* LRU (or evict's order); a demand miss spares predicted experts while it can, a prefetch
 * always and also the current layer's experts still to be accessed (then it takes
 * nothing). */
static int32_t pm_choose_victim(void *state, const fmoe_policy_env *env,
                                const fmoe_victim_request *req) {
    const pm_state *m = state;
    const fmoe_cache_view *v = env->cache;
    const uint8_t spare = req->kind == FMOE_LOAD_PREFETCH ? PM_PREDICTED | PM_PENDING
                                                          : PM_PREDICTED;
    int32_t best = -1;
    for (int32_t s = 0; s < v->capacity; s++) {
        if (!fmoe_cache_evictable(v, s) || (m->flag[v->slot_expert[s]] & spare)) continue;
        if (fmoe__reuse_evict_before(&m->evict, v, s, best)) best = s;
    }
    if (best >= 0 || req->kind == FMOE_LOAD_PREFETCH) return best;
    for (int32_t s = 0; s < v->capacity; s++)
        if (fmoe_cache_evictable(v, s) && fmoe__reuse_evict_before(&m->evict, v, s, best)) best = s;
    return best;
}

const fmoe_policy_ops fmoe_policy_promoe = {
    .name = "promoe",
    .summary = "ProMoE: learned stride-k prediction from gate inputs, low-priority "
               "prefetch, early preemption, LRU (--predictor)",
    .flags = FMOE_POLICY_NEEDS_HIDDEN | FMOE_POLICY_PREFETCHES |
                           FMOE_POLICY_REORDER_COMPUTE,
    .init = pm_init,
    .free = pm_free,
    .on_request_start = pm_on_request_start,
    .on_iteration_start = pm_on_iteration_start,
    .on_gate = pm_on_gate,
    .on_access = pm_on_access,
    .on_layer_done = pm_on_layer_done,
    .choose_victim = pm_choose_victim,
    .predictor_kind = FMOE_PREDICTOR_KIND_PROMOE,
    .settings = pm_settings,
};
