/*
 * forward.c - the decoder forward pass over a session's run state.
 *
 * Read top to bottom, one forward call of n tokens at positions pos0.. is:
 *
 *   x = embed(tokens)                                     semantic embedding (traced)
 *   for each decoder layer:
 *     xn = rmsnorm(x)
 *     q, k, v = xn·Wqᵀ (+b), xn·Wkᵀ (+b), xn·Wvᵀ (+b)
 *     q, k = qk-norm (Qwen3: per head; OLMoE: whole projection), clamp (OLMoE clip_qkv)
 *     q, k = rope(q, k); k, v -> KV cache
 *     x += attention(q, cache)·Woᵀ (+b)
 *     xn = rmsnorm(x)                                     gate input (traced)
 *     dense layer: x += mlp(xn)
 *     MoE layer:   probs = softmax(xn·Wrᵀ); top-k; renormalise per family   (traced)
 *                  x += Σ_k w_k · expert_k(xn)  [+ shared(xn), Qwen2: · sigmoid(xn·w)]
 *   logits = rmsnorm(x)·W_lmᵀ
 *
 * Prefill groups the chunk's tokens by expert, so each chosen expert runs once as a
 * matrix product over its tokens; a decode step is the same code with n = 1.
 *
 * Several sequences run as one pass the same way (fmoe_session_forward_batch, continuous
 * batching): their tokens are the rows of one session's buffers (the runner's), every
 * product runs over all rows, and only attention is per sequence, against that sequence's
 * KV cache at its positions. A single-sequence call is the pass with one segment.
 * Every buffer is allocated in fmoe_session_init; fmoe_session_forward allocates nothing.
 * Compute goes through the backend table (model_impl.h); only the CPU backend exists.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/error.h"
#include "fmoe/rowwise.h"
#include "model_impl.h"

/*
 * One sequence's rows in a forward pass. A pass runs in one session's buffers (the
 * runner's) over one or more segments: fmoe_session_forward is one segment, the runner's
 * own sequence; fmoe_session_forward_batch one per item. Rows are the runner's activation
 * rows; everything but attention works on all rows at once.
 */
typedef struct segment {
    fmoe_session *s;               /* the sequence: KV cache, position, RoPE state */
    const int32_t *tokens;         /* [n] */
    int32_t row, n;                /* its rows [row, row + n) of the runner's buffers */
    int32_t pos0;                  /* the position of its first token */
    const fmoe_forward_trace *tr;  /* or NULL */
    int32_t t0;                    /* the trace row (and all_logits row) of its first token */
    float *logits;                 /* all_logits: [..][V] indexed by t0; else [V] for its
                                      last row; NULL: no lm head for it */
} segment;

struct fmoe_session {
    const fmoe_model *m;
    fmoe_session_options opt;
    const fmoe__backend_ops *be;
    void *bctx;
    int32_t pos;            /* tokens in the cache */
    int32_t imax;           /* widest MLP (routed, shared or dense) */
    /* activations, [B] = max_batch rows */
    float *x;               /* [B][h] residual stream */
    float *xn;              /* [B][h] normalised */
    float *q;               /* [B][Hq·D] */
    float *k;               /* [B][Hkv·D] */
    float *v;               /* [B][Hkv·D] */
    float *att;             /* [B][Hq·D] attention output */
    float *acc;             /* [B][h] block output */
    float *rlogits;         /* [B][J] router logits */
    float *probs;           /* [B][J] gate probabilities */
    int32_t *topk;          /* [B][K] chosen experts */
    float *topw;            /* [B][K] their weights */
    float *spec;            /* [B][J] speculative router logits */
    float *specrows;        /* [B][S][J] speculative gate rows (S = speculative_depth) */
    uint16_t *chosen;       /* [B][K] chosen experts, as the routing hook passes them */
    int32_t *distinct;      /* [J] the layer's experts in order of first appearance */
    int32_t *corder;        /* [J] the order they run in: indices into distinct (the
                               routing hook may permute it; fmoe_route_event) */
    int32_t *count;         /* [J] tokens routed to each expert in this chunk */
    int32_t *slots;         /* [J][B·K] (token·K + k) routed to each expert */
    float *xg;              /* [B][h] one expert's gathered inputs (a token picks an
                               expert at most once, so at most B rows) */
    float *g;               /* [B][imax] gate projections */
    float *u;               /* [B][imax] up projections */
    float *yg;              /* [B][h] expert (or shared expert) outputs */
    float *sg;              /* [B] shared-expert gate logits */
    float *inv_freq;        /* [D/2] */
    float *cos;             /* [B][D/2] */
    float *sin;             /* [B][D/2] */
    float rope_scale;
    int64_t rope_seq_len;   /* the sequence length inv_freq was computed for */
    int64_t call_seq_len;   /* position + n of the current forward call */
    float *lbuf;            /* [max_sequences][V] the lm head's rows when several sequences
                               want logits */
    segment *segs;          /* [B] the segments of a call this session runs */
    int32_t batch_mark;     /* set while fmoe_session_forward_batch checks its items */
    /* KV cache */
    float *k_cache;         /* [layers][max_context][Hkv·D] */
    float *v_cache;         /* [layers][max_context][Hkv·D] */
};

fmoe_session_options fmoe_session_defaults(void) {
    fmoe_session_options o;
    memset(&o, 0, sizeof o);
    o.max_context = 0;
    o.max_batch = 64;
    return o;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------- */
/* Init                                                                               */
/* ---------------------------------------------------------------------------------- */

void fmoe_session_free(fmoe_session *s) {
    if (!s) return;
    if (s->be && s->bctx) {
        float **bufs[] = {&s->x,    &s->xn,   &s->q,       &s->k,       &s->v,   &s->att,
                          &s->acc,  &s->rlogits, &s->probs, &s->topw,  &s->spec, &s->xg,
                          &s->g,    &s->u,    &s->yg,      &s->sg,      &s->inv_freq,
                          &s->cos,  &s->sin,  &s->k_cache, &s->v_cache};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            s->be->release(s->bctx, *bufs[i]);
        s->be->release(s->bctx, s->specrows);
        s->be->release(s->bctx, s->chosen);
        s->be->release(s->bctx, s->distinct);
        s->be->release(s->bctx, s->corder);
        s->be->release(s->bctx, s->topk);
        s->be->release(s->bctx, s->count);
        s->be->release(s->bctx, s->slots);
        s->be->release(s->bctx, s->lbuf);
        s->be->free(s->bctx);
    }
    free(s->segs);
    free(s);
}

int fmoe_session_init(const fmoe_model *m, const fmoe_session_options *options,
                      fmoe_session **out) {
    if (!m || !out) return fmoe_error_set(FMOE_EINVAL, "model or output is NULL");
    *out = NULL;
    const fmoe_model_geometry *g = &m->geo;
    fmoe_session_options o = options ? *options : fmoe_session_defaults();
    if (o.max_context <= 0)
        o.max_context = g->max_position_embeddings < 4096 ? (int32_t)g->max_position_embeddings
                                                          : 4096;
    if (o.max_batch <= 0) o.max_batch = 64;
    FMOE_RETURN_ERROR_IF(o.max_context > (1 << 24), FMOE_EINVAL,
                         "max_context %d is too large", o.max_context);
    FMOE_RETURN_ERROR_IF(o.max_batch > (1 << 16), FMOE_EINVAL, "max_batch %d is too large",
                         o.max_batch);
    FMOE_RETURN_ERROR_IF(o.speculative_depth < 0 || o.speculative_depth > g->num_moe_layers,
                         FMOE_EINVAL, "speculative depth %d is outside [0, %d]",
                         o.speculative_depth, g->num_moe_layers);
    if (o.max_batch > o.max_context) o.max_batch = o.max_context;
    if (o.max_sequences <= 0) o.max_sequences = 1;
    if (o.max_sequences > o.max_batch) o.max_sequences = o.max_batch;

    fmoe_session *s = calloc(1, sizeof *s);
    if (!s) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    s->m = m;
    s->opt = o;
    s->be = &fmoe__cpu_backend;

    const int64_t B = o.max_batch, h = g->hidden_size, J = g->num_experts, K = g->top_k;
    const int64_t D = g->head_dim, qd = (int64_t)g->num_attention_heads * D;
    const int64_t kd = (int64_t)g->num_key_value_heads * D;
    int64_t imax = g->moe_intermediate_size;
    if (g->shared_intermediate_size > imax) imax = g->shared_intermediate_size;
    if (g->intermediate_size > imax) imax = g->intermediate_size;
    s->imax = (int32_t)imax;
    int64_t max_cols = h > qd ? h : qd;
    if (imax > max_cols) max_cols = imax;

    fmoe__backend_limits lim = {o.threads, max_cols, o.max_batch, o.max_context};
    int rc = s->be->init(&lim, &s->bctx);
    if (rc < 0) {
        free(s);
        return rc;
    }
    const int64_t kv = (int64_t)g->num_hidden_layers * o.max_context * kd;
    struct {
        void **p;
        int64_t bytes;
    } plan[] = {
        {(void **)&s->x, B * h * 4},          {(void **)&s->xn, B * h * 4},
        {(void **)&s->q, B * qd * 4},         {(void **)&s->k, B * kd * 4},
        {(void **)&s->v, B * kd * 4},         {(void **)&s->att, B * qd * 4},
        {(void **)&s->acc, B * h * 4},        {(void **)&s->rlogits, B * J * 4},
        {(void **)&s->probs, B * J * 4},      {(void **)&s->topk, B * K * 4},
        {(void **)&s->topw, B * K * 4},       {(void **)&s->spec, B * J * 4},
        {(void **)&s->count, J * 4},          {(void **)&s->slots, J * B * K * 4},
        {(void **)&s->specrows, B * (o.speculative_depth > 0 ? o.speculative_depth : 1) * J * 4},
        {(void **)&s->chosen, B * K * 2},     {(void **)&s->distinct, J * 4},
        {(void **)&s->corder, J * 4},
        {(void **)&s->xg, B * h * 4},         {(void **)&s->g, B * imax * 4},
        {(void **)&s->u, B * imax * 4},       {(void **)&s->yg, B * h * 4},
        {(void **)&s->sg, B * 4},             {(void **)&s->inv_freq, D / 2 * 4},
        {(void **)&s->cos, B * (D / 2) * 4},  {(void **)&s->sin, B * (D / 2) * 4},
        {(void **)&s->k_cache, kv * 4},       {(void **)&s->v_cache, kv * 4},
        {(void **)&s->lbuf, (int64_t)o.max_sequences * g->vocab_size * 4},
    };
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++) {
        *plan[i].p = s->be->alloc(s->bctx, plan[i].bytes);
        if (!*plan[i].p) {
            fmoe_session_free(s);
            return fmoe_error_set(FMOE_ENOMEM,
                                  "out of memory for the run state (KV cache of %d positions: "
                                  "%.1f MiB)",
                                  o.max_context, (double)kv * 8 / (1 << 20));
        }
    }
    s->segs = calloc((size_t)B, sizeof *s->segs);
    if (!s->segs) {
        fmoe_session_free(s);
        return fmoe_error_set(FMOE_ENOMEM, "out of memory for the run state");
    }
    fmoe__rope_inv_freq(&m->arch.rope, g->head_dim, 0, s->inv_freq, &s->rope_scale);
    s->rope_seq_len = 0;
    *out = s;
    return 0;
}

void fmoe_session_reset(fmoe_session *s) {
    if (s) s->pos = 0;
}

int32_t fmoe_session_position(const fmoe_session *s) { return s ? s->pos : 0; }

/* ---------------------------------------------------------------------------------- */
/* Blocks                                                                             */
/* ---------------------------------------------------------------------------------- */

/* y[n][h] = mlp(x[n][h]) through the session's g/u scratch. */
static void run_mlp(fmoe_session *s, const fmoe__mlp *w, const float *x, int32_t n, float *y) {
    const int64_t I = w->gate.rows;
    s->be->matmul(s->bctx, &w->gate, x, n, s->g);
    s->be->matmul(s->bctx, &w->up, x, n, s->u);
    for (int64_t i = 0; i < (int64_t)n * I; i++) s->g[i] = fmoe_swiglu(s->g[i], s->u[i]);
    s->be->matmul(s->bctx, &w->down, s->g, n, y);
}

static void add_bias(float *y, const float *b, int32_t n, int64_t d) {
    if (!b) return;
    for (int32_t t = 0; t < n; t++)
        for (int64_t i = 0; i < d; i++) y[t * d + i] += b[i];
}

static void clamp_all(float *y, int64_t count, float c) {
    for (int64_t i = 0; i < count; i++) y[i] = y[i] < -c ? -c : y[i] > c ? c : y[i];
}

/* Attention block of decoder layer li over the n rows of all segments; adds its output to
 * s->x. Projections, norms and RoPE (s->cos/s->sin hold each row's position) run over all
 * rows; each segment writes its keys and values to its own session's cache and attends
 * there at its own positions. */
static void attention_block(fmoe_session *s, int32_t li, const segment *sg, int32_t count,
                            int32_t n) {
    const fmoe_model *m = s->m;
    const fmoe_model_geometry *g = &m->geo;
    const fmoe__layer *L = &m->layers[li];
    const int32_t h = g->hidden_size, D = g->head_dim, Hq = g->num_attention_heads;
    const int32_t Hk = g->num_key_value_heads, half = D / 2;
    const int64_t qd = (int64_t)Hq * D, kd = (int64_t)Hk * D;
    const float eps = (float)g->rms_norm_eps;

    for (int32_t t = 0; t < n; t++)
        fmoe_rmsnorm_row(s->xn + (int64_t)t * h, s->x + (int64_t)t * h, L->attn_norm, h, eps);
    s->be->matmul(s->bctx, &L->wq, s->xn, n, s->q);
    s->be->matmul(s->bctx, &L->wk, s->xn, n, s->k);
    s->be->matmul(s->bctx, &L->wv, s->xn, n, s->v);
    add_bias(s->q, L->bq, n, qd);
    add_bias(s->k, L->bk, n, kd);
    add_bias(s->v, L->bv, n, kd);
    if (m->arch.qk_norm == FMOE__QK_NORM_HEAD) {
        for (int64_t r = 0; r < (int64_t)n * Hq; r++)
            fmoe_rmsnorm_row(s->q + r * D, s->q + r * D, L->q_norm, D, eps);
        for (int64_t r = 0; r < (int64_t)n * Hk; r++)
            fmoe_rmsnorm_row(s->k + r * D, s->k + r * D, L->k_norm, D, eps);
    } else if (m->arch.qk_norm == FMOE__QK_NORM_FULL) {
        for (int32_t t = 0; t < n; t++) {
            fmoe_rmsnorm_row(s->q + t * qd, s->q + t * qd, L->q_norm, (int32_t)qd, eps);
            fmoe_rmsnorm_row(s->k + t * kd, s->k + t * kd, L->k_norm, (int32_t)kd, eps);
        }
    }
    if (m->arch.clip_qkv > 0) {
        clamp_all(s->q, n * qd, m->arch.clip_qkv);
        clamp_all(s->k, n * kd, m->arch.clip_qkv);
        clamp_all(s->v, n * kd, m->arch.clip_qkv);
    }
    for (int32_t t = 0; t < n; t++) {
        const float *c = s->cos + (int64_t)t * half, *sn = s->sin + (int64_t)t * half;
        for (int32_t hh = 0; hh < Hq; hh++) fmoe_rope_head(s->q + t * qd + hh * D, c, sn, D);
        for (int32_t hh = 0; hh < Hk; hh++) fmoe_rope_head(s->k + t * kd + hh * D, c, sn, D);
    }
    for (int32_t i = 0; i < count; i++) {
        const segment *e = &sg[i];
        const int64_t ctx = e->s->opt.max_context;
        float *kc = e->s->k_cache + (int64_t)li * ctx * kd;
        float *vc = e->s->v_cache + (int64_t)li * ctx * kd;
        memcpy(kc + (int64_t)e->pos0 * kd, s->k + e->row * kd, (size_t)(e->n * kd) * sizeof(float));
        memcpy(vc + (int64_t)e->pos0 * kd, s->v + e->row * kd, (size_t)(e->n * kd) * sizeof(float));
        fmoe__attn_args a = {
            .q = s->q + e->row * qd, .k_cache = kc, .v_cache = vc, .out = s->att + e->row * qd,
            .n = e->n, .pos0 = e->pos0, .n_heads = Hq, .n_kv_heads = Hk, .head_dim = D,
            .window = m->arch.sliding_window[li], .scale = 1.0f / sqrtf((float)D),
        };
        s->be->attention(s->bctx, &a);
    }
    s->be->matmul(s->bctx, &L->wo, s->att, n, s->acc);
    add_bias(s->acc, L->bo, n, h);
    for (int64_t i = 0; i < (int64_t)n * h; i++) s->x[i] += s->acc[i];
}

/* The speculative gate rows of the pass (fmoe_route_event.speculative): for s = 1..S the
 * router of MoE layer l+s applied to layer l's gate input, as probabilities, into
 * s->specrows [n][S][J] (0 past the last layer). */
static void speculative_rows(fmoe_session *s, int32_t l, int32_t n) {
    const fmoe_model *m = s->m;
    const fmoe_model_geometry *g = &m->geo;
    const int32_t J = g->num_experts, Lm = g->num_moe_layers, S = s->opt.speculative_depth;
    for (int32_t sd = 1; sd <= S; sd++) {
        const int have = l + sd < Lm;
        if (have)
            s->be->matmul(s->bctx, &m->layers[g->moe_layer_index[l + sd]].router, s->xn, n,
                          s->spec);
        for (int32_t t = 0; t < n; t++) {
            float *dst = s->specrows + ((int64_t)t * S + (sd - 1)) * J;
            if (!have) {
                memset(dst, 0, (size_t)J * sizeof(float));
            } else if (g->scoring == FMOE_ROUTER_SIGMOID) {
                for (int32_t j = 0; j < J; j++) dst[j] = fmoe_sigmoid(s->spec[(int64_t)t * J + j]);
            } else {
                fmoe_softmax_row(dst, s->spec + (int64_t)t * J, J);
            }
        }
    }
}

/* Copies a segment's routing (its rows of the runner's buffers) into its trace arrays. */
static void trace_routing(const fmoe_session *s, int32_t l, const segment *e, int have_spec) {
    const fmoe_model_geometry *g = &s->m->geo;
    const int32_t h = g->hidden_size, J = g->num_experts, K = g->top_k;
    const int32_t Lm = g->num_moe_layers, S = s->opt.speculative_depth;
    const fmoe_forward_trace *tr = e->tr;
    for (int32_t i = 0; i < e->n; i++) {
        const int64_t row = (int64_t)(e->t0 + i) * Lm + l, t = e->row + i;
        if (tr->experts) memcpy(tr->experts + row * K, s->chosen + t * K, (size_t)K * 2);
        if (tr->weights) memcpy(tr->weights + row * K, s->topw + t * K, (size_t)K * sizeof(float));
        if (tr->probs) memcpy(tr->probs + row * J, s->probs + t * J, (size_t)J * sizeof(float));
        if (tr->hidden) memcpy(tr->hidden + row * h, s->xn + t * h, (size_t)h * sizeof(float));
        if (tr->speculative && have_spec)
            memcpy(tr->speculative + row * S * J, s->specrows + t * S * J,
                   (size_t)S * J * sizeof(float));
    }
}

/* The weights expert j of the layer runs with: the executor's (on_expert returned 0) or
 * the model's own. @return 0 or the hook's error. */
static int expert_weights(fmoe_session *s, const fmoe__layer *L, int32_t j, fmoe__mlp *out) {
    *out = L->experts[j];
    if (!s->opt.on_expert) return 0;
    fmoe_expert_view v;
    const int rc = s->opt.on_expert(s->opt.route_ctx, L->moe_index, j, &v);
    if (rc != 0) return rc < 0 ? rc : 0;
    const fmoe_matrix_view *src[3] = {&v.gate, &v.up, &v.down};
    fmoe__mat *dst[3] = {&out->gate, &out->up, &out->down};
    for (int i = 0; i < 3; i++)
        *dst[i] = (fmoe__mat){.data = src[i]->data, .dtype = src[i]->dtype,
                              .rows = src[i]->rows, .cols = src[i]->cols};
    return 0;
}

/* MoE block: routes the n rows of s->xn (all segments' tokens), runs their experts, adds
 * to s->x. Experts run in order of first appearance over the rows (row by row, k by k:
 * DESIGN.md §7.1), the order the routing hook announces and a live executor resolves its
 * accesses in, unless the hook reorders them (compute_order: ProMoE's reordered compute); each chosen expert runs once, over the rows of every segment that chose
 * it. @return 0 or a hook's error. */
static int moe_block(fmoe_session *s, const fmoe__layer *L, const segment *sg, int32_t count,
                     int32_t n) {
    const fmoe_model *m = s->m;
    const fmoe_model_geometry *g = &m->geo;
    const int32_t h = g->hidden_size, J = g->num_experts, K = g->top_k;
    const int32_t l = L->moe_index, S = s->opt.speculative_depth;

    s->be->matmul(s->bctx, &L->router, s->xn, n, s->rlogits);
    for (int32_t t = 0; t < n; t++)
        fmoe_route_row(s->rlogits + (int64_t)t * J, J, K, g->scoring == FMOE_ROUTER_SIGMOID,
                       g->norm_topk_prob, m->arch.route_norm_eps,
                       (float)g->routed_scaling_factor, s->probs + (int64_t)t * J,
                       s->topk + (int64_t)t * K, s->topw + (int64_t)t * K);

    /* Group (token, k) slots by expert, noting the order experts first appear in. */
    int32_t num_distinct = 0;
    memset(s->count, 0, (size_t)J * sizeof *s->count);
    const int64_t cap = (int64_t)s->opt.max_batch * K;
    for (int32_t t = 0; t < n; t++)
        for (int32_t k = 0; k < K; k++) {
            const int32_t e = s->topk[t * K + k];
            s->chosen[t * K + k] = (uint16_t)e;
            if (s->count[e] == 0) s->distinct[num_distinct++] = e;
            s->slots[(int64_t)e * cap + s->count[e]++] = t * K + k;
        }

    int want_spec = s->opt.on_route != NULL;
    for (int32_t i = 0; i < count; i++) want_spec |= sg[i].tr && sg[i].tr->speculative;
    const int have_spec = S > 0 && want_spec;
    if (have_spec) speculative_rows(s, l, n);
    for (int32_t i = 0; i < count; i++)
        if (sg[i].tr) trace_routing(s, l, &sg[i], have_spec);
    for (int32_t q = 0; q < num_distinct; q++) s->corder[q] = q;
    if (s->opt.on_route) {
        const fmoe_route_event ev = {
            .layer = l, .num_tokens = n, .chosen = s->chosen, .chosen_stride = K,
            .probs = s->probs, .probs_stride = J, .distinct = s->distinct,
            .tokens = s->count, .num_distinct = num_distinct,
            .speculative = have_spec ? s->specrows : NULL,
            .speculative_stride = (int64_t)S * J, .speculative_depth = have_spec ? S : 0,
            .hidden = s->xn, .hidden_stride = h, .compute_order = s->corder};
        FMOE_FORWARD_IF_ERROR(s->opt.on_route(s->opt.route_ctx, &ev));
    }

    memset(s->acc, 0, (size_t)n * h * sizeof(float));
    for (int32_t q = 0; q < num_distinct; q++) {
        const int32_t e = s->distinct[s->corder[q]], c = s->count[e];
        const int32_t *sl = s->slots + (int64_t)e * cap;
        fmoe__mlp w;
        FMOE_FORWARD_IF_ERROR(expert_weights(s, L, e, &w));
        for (int32_t r = 0; r < c; r++)
            memcpy(s->xg + (int64_t)r * h, s->xn + (int64_t)(sl[r] / K) * h,
                   (size_t)h * sizeof(float));
        run_mlp(s, &w, s->xg, c, s->yg);
        if (s->opt.on_expert_done) s->opt.on_expert_done(s->opt.route_ctx, l, e);
        for (int32_t r = 0; r < c; r++) {
            const float wt = s->topw[sl[r]];
            float *dst = s->acc + (int64_t)(sl[r] / K) * h;
            const float *src = s->yg + (int64_t)r * h;
            for (int32_t i = 0; i < h; i++) dst[i] += wt * src[i];
        }
    }
    if (L->has_shared) {
        run_mlp(s, &L->shared, s->xn, n, s->yg);
        if (m->arch.shared_gate) {
            s->be->matmul(s->bctx, &L->shared_gate, s->xn, n, s->sg);
            for (int32_t t = 0; t < n; t++) {
                const float gt = fmoe_sigmoid(s->sg[t]);
                for (int32_t i = 0; i < h; i++)
                    s->acc[(int64_t)t * h + i] += gt * s->yg[(int64_t)t * h + i];
            }
        } else {
            for (int64_t i = 0; i < (int64_t)n * h; i++) s->acc[i] += s->yg[i];
        }
    }
    for (int64_t i = 0; i < (int64_t)n * h; i++) s->x[i] += s->acc[i];
    return 0;
}

/* Embeddings (traced as the semantic rows) and RoPE tables of every segment's rows.
 * Dynamic NTK depends on the length of a sequence's whole call, as transformers computes
 * it from the call's largest position: each segment's session keeps its own inv_freq. */
static void embed_and_rope(fmoe_session *s, const segment *sg, int32_t count) {
    const fmoe_model *m = s->m;
    const fmoe_model_geometry *g = &m->geo;
    const int32_t h = g->hidden_size, half = g->head_dim / 2;
    for (int32_t i = 0; i < count; i++) {
        const segment *e = &sg[i];
        fmoe_session *q = e->s;
        float *x = s->x + (int64_t)e->row * h;
        for (int32_t t = 0; t < e->n; t++)
            s->be->get_row(s->bctx, &m->embed, e->tokens[t], x + (int64_t)t * h);
        if (e->tr && e->tr->semantic)
            memcpy(e->tr->semantic + (int64_t)e->t0 * h, x, (size_t)e->n * h * sizeof(float));
        if (m->arch.rope.type == FMOE__ROPE_DYNAMIC && q->call_seq_len != q->rope_seq_len) {
            fmoe__rope_inv_freq(&m->arch.rope, g->head_dim, q->call_seq_len, q->inv_freq,
                                &q->rope_scale);
            q->rope_seq_len = q->call_seq_len;
        }
        for (int32_t t = 0; t < e->n; t++)
            for (int32_t j = 0; j < half; j++) {
                const float f = (float)(e->pos0 + t) * q->inv_freq[j];
                const int64_t r = (int64_t)(e->row + t) * half + j;
                s->cos[r] = cosf(f) * q->rope_scale;
                s->sin[r] = sinf(f) * q->rope_scale;
            }
    }
}

/* The lm head: with all_logits every row of a segment into its logits; else the last row
 * of each segment that wants logits, all such rows in one product. */
static void lm_head(fmoe_session *s, const segment *sg, int32_t count) {
    const fmoe_model *m = s->m;
    const fmoe_model_geometry *g = &m->geo;
    const int32_t h = g->hidden_size;
    const int64_t V = g->vocab_size;
    const float eps = (float)g->rms_norm_eps;
    if (s->opt.all_logits) {
        for (int32_t i = 0; i < count; i++) {
            const segment *e = &sg[i];
            if (!e->logits) continue;
            for (int32_t t = 0; t < e->n; t++)
                fmoe_rmsnorm_row(s->xn + (int64_t)t * h, s->x + (int64_t)(e->row + t) * h,
                                 m->final_norm, h, eps);
            s->be->matmul(s->bctx, &m->lm_head, s->xn, e->n, e->logits + (int64_t)e->t0 * V);
        }
        return;
    }
    int32_t rows = 0;
    float *only = NULL; /* one row: straight into its logits */
    for (int32_t i = 0; i < count; i++) {
        const segment *e = &sg[i];
        if (!e->logits) continue;
        fmoe_rmsnorm_row(s->xn + (int64_t)rows * h, s->x + (int64_t)(e->row + e->n - 1) * h,
                         m->final_norm, h, eps);
        only = e->logits;
        rows++;
    }
    if (rows == 0) return;
    s->be->matmul(s->bctx, &m->lm_head, s->xn, rows, rows == 1 ? only : s->lbuf);
    if (rows == 1) return;
    rows = 0;
    for (int32_t i = 0; i < count; i++)
        if (sg[i].logits)
            memcpy(sg[i].logits, s->lbuf + (int64_t)rows++ * V, (size_t)V * sizeof(float));
}

/* One forward pass over segments sg[0..count) of n rows in all (n <= max_batch), in the
 * buffers of `s` with its hooks. Advances each segment's session by its rows. */
static int forward_pass(fmoe_session *s, const segment *sg, int32_t count, int32_t n) {
    const fmoe_model *m = s->m;
    const fmoe_model_geometry *g = &m->geo;
    const int32_t h = g->hidden_size;
    int timed = 0;
    for (int32_t i = 0; i < count; i++) timed |= sg[i].tr && sg[i].tr->layer_seconds;

    embed_and_rope(s, sg, count);
    for (int32_t li = 0; li < g->num_hidden_layers; li++) {
        const double start = timed ? now_seconds() : 0;
        const fmoe__layer *L = &m->layers[li];
        attention_block(s, li, sg, count, n);
        for (int32_t t = 0; t < n; t++)
            fmoe_rmsnorm_row(s->xn + (int64_t)t * h, s->x + (int64_t)t * h, L->ffn_norm, h,
                             (float)g->rms_norm_eps);
        if (L->moe_index >= 0) {
            FMOE_FORWARD_IF_ERROR(moe_block(s, L, sg, count, n));
        } else {
            run_mlp(s, &L->shared, s->xn, n, s->acc);
            for (int64_t i = 0; i < (int64_t)n * h; i++) s->x[i] += s->acc[i];
        }
        /* A batch's layer is one computation: each item is charged all of it. */
        const double took = timed ? now_seconds() - start : 0;
        for (int32_t i = 0; i < count; i++)
            if (sg[i].tr && sg[i].tr->layer_seconds) sg[i].tr->layer_seconds[li] += took;
    }
    for (int32_t i = 0; i < count; i++) sg[i].s->pos += sg[i].n;
    lm_head(s, sg, count);
    return 0;
}

/* @return 0 or FMOE_EINVAL for a token outside the vocabulary; `what` prefixes the
 * detail ("" or "item 2: "). */
static int check_tokens(const fmoe_session *s, const int32_t *tokens, int32_t n,
                        const char *what) {
    const int32_t V = s->m->geo.vocab_size;
    for (int32_t t = 0; t < n; t++)
        FMOE_RETURN_ERROR_IF(tokens[t] < 0 || tokens[t] >= V, FMOE_EINVAL,
                             "%stoken %d at index %d is outside the vocabulary [0, %d)", what,
                             tokens[t], t, V);
    return 0;
}

int fmoe_session_forward(fmoe_session *s, const int32_t *tokens, int32_t n,
                         const fmoe_forward_trace *trace, float *logits) {
    if (!s || (!tokens && n > 0)) return fmoe_error_set(FMOE_EINVAL, "session or tokens is NULL");
    FMOE_RETURN_ERROR_IF(n < 1, FMOE_EINVAL, "no tokens to run (n = %d)", n);
    FMOE_FORWARD_IF_ERROR(check_tokens(s, tokens, n, ""));
    FMOE_RETURN_ERROR_IF((int64_t)s->pos + n > s->opt.max_context, FMOE_ERANGE,
                         "%d tokens after %d in the cache exceed the context of %d positions",
                         n, s->pos, s->opt.max_context);
    s->call_seq_len = (int64_t)s->pos + n;
    for (int32_t t0 = 0; t0 < n; t0 += s->opt.max_batch) {
        const int32_t c = n - t0 < s->opt.max_batch ? n - t0 : s->opt.max_batch;
        const int last = t0 + c == n;
        float *lg = !logits ? NULL : s->opt.all_logits ? logits : last ? logits : NULL;
        const segment one = {.s = s, .tokens = tokens + t0, .row = 0, .n = c, .pos0 = s->pos,
                             .tr = trace, .t0 = t0, .logits = lg};
        FMOE_FORWARD_IF_ERROR(forward_pass(s, &one, 1, c));
    }
    return 0;
}

/* Whether item i may run with runner r (every rule of fmoe_session_forward_batch but the
 * total); marks its session so that a second item of the same session is refused. */
static int check_item(const fmoe_session *r, const fmoe_batch_item *it, int32_t i) {
    fmoe_session *q = it->session;
    FMOE_RETURN_ERROR_IF(!q || !it->tokens, FMOE_EINVAL, "item %d has no session or tokens", i);
    FMOE_RETURN_ERROR_IF(it->n < 1, FMOE_EINVAL, "item %d: no tokens to run (n = %d)", i, it->n);
    FMOE_RETURN_ERROR_IF(q->m != r->m, FMOE_EINVAL, "item %d: a session of another model", i);
    FMOE_RETURN_ERROR_IF(q->opt.max_context > r->opt.max_context, FMOE_EINVAL,
                         "item %d: its context of %d positions exceeds the runner's %d", i,
                         q->opt.max_context, r->opt.max_context);
    FMOE_RETURN_ERROR_IF(q->batch_mark, FMOE_EINVAL,
                         "item %d: its session is already an item of the batch", i);
    char what[32];
    snprintf(what, sizeof what, "item %d: ", i);
    FMOE_FORWARD_IF_ERROR(check_tokens(q, it->tokens, it->n, what));
    FMOE_RETURN_ERROR_IF((int64_t)q->pos + it->n > q->opt.max_context, FMOE_ERANGE,
                         "item %d: %d tokens after %d in the cache exceed the context of %d "
                         "positions", i, it->n, q->pos, q->opt.max_context);
    q->batch_mark = 1;
    return 0;
}

int fmoe_session_forward_batch(fmoe_session *runner, const fmoe_batch_item *items,
                               int32_t count) {
    if (!runner || (!items && count > 0))
        return fmoe_error_set(FMOE_EINVAL, "runner or items is NULL");
    FMOE_RETURN_ERROR_IF(count < 1, FMOE_EINVAL, "no items to run (count = %d)", count);
    FMOE_RETURN_ERROR_IF(count > runner->opt.max_sequences, FMOE_EINVAL,
                         "%d items exceed the runner's max_sequences of %d", count,
                         runner->opt.max_sequences);
    int64_t total = 0;
    int rc = 0;
    int32_t checked = 0;
    for (; checked < count && rc == 0; checked++) {
        rc = check_item(runner, &items[checked], checked);
        if (rc == 0) total += items[checked].n;
    }
    for (int32_t i = 0; i < checked - (rc < 0); i++) items[i].session->batch_mark = 0;
    if (rc < 0) return rc;
    FMOE_RETURN_ERROR_IF(total > runner->opt.max_batch, FMOE_EINVAL,
                         "%lld tokens in %d items exceed the runner's batch of %d",
                         (long long)total, count, runner->opt.max_batch);

    int32_t row = 0;
    for (int32_t i = 0; i < count; i++) {
        const fmoe_batch_item *it = &items[i];
        fmoe_session *q = it->session;
        q->call_seq_len = (int64_t)q->pos + it->n;
        runner->segs[i] = (segment){.s = q, .tokens = it->tokens, .row = row, .n = it->n,
                                    .pos0 = q->pos, .tr = it->trace, .t0 = 0,
                                    .logits = it->logits};
        row += it->n;
    }
    return forward_pass(runner, runner->segs, count, row);
}
