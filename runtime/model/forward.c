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
 *     x += attention(q, cache)·Woᵀ (+b)                    gpt-oss: a sink logit per head
 *     xn = rmsnorm(x)                                     gate input (traced)
 *     dense layer: x += mlp(xn)
 *     MoE layer:   probs = softmax(xn·Wrᵀ (+b)); top-k; renormalise per family (traced)
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
 *
 * Compute goes through the backend table (model_impl.h) and nothing else: activations,
 * the KV cache and the router's outputs live in the backend's buffers for the whole pass
 * (on the GPU with the CUDA backend), and the host sees only what it needs: the chosen
 * experts and their weights once per MoE layer (to group tokens by expert and to drive
 * the routing hooks), with the rows a hook or trace asks for in the same download (the
 * layer's routing is one buffer: fmoe__routing_layout), and the logits. On the CPU backend
 * (host_memory) those are read in place, so the CPU pass is the same arithmetic in the
 * same order as before the table grew.
 *
 * Expert weights. The model's own are the backend's to map (the CUDA backend copies them
 * once). An executor's (on_expert) may be backend memory (a GPU slot: on_device), after
 * whose compute the pass records the slot's fence (the view's) before on_expert_done lets
 * the slot be overwritten, so the executor's copy into it waits on the device for the
 * reads, not the host (a view without a fence: the pass waits); or host memory on a
 * device backend (--miss cpu: a miss computed from the slow tier): then the expert runs
 * on the host's CPU backend and only its output rows are copied back.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "rowwise.h"
#include "family_llama4.h"
#include "mla.h"
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
    /* backend buffers: activations, [B] = max_batch rows */
    float *x;               /* [B][h] residual stream */
    void *route;            /* a MoE layer's routing, laid out for the pass's n rows by
                               rlay (fmoe__routing_layout): xn, topk, topw, probs, specrows
                               below point into it, so one download brings them all */
    fmoe__routing_layout rlay; /* route's layout for the current pass */
    float *xn;              /* [n][h] normalised: route's first part, at its offset 0 */
    float *q;               /* [B][Hq·D] */
    float *k;               /* [B][Hkv·D] */
    float *v;               /* [B][Hkv·D] */
    float *att;             /* [B][Hq·D] attention output */
    float *acc;             /* [B][h] block output */
    float *rlogits;         /* [B][J] router logits */
    float *probs;           /* [n][J] gate probabilities (in route) */
    int32_t *topk;          /* [n][K] chosen experts (in route) */
    float *topw;            /* [n][K] their weights (in route) */
    float *spec;            /* [B][J] speculative router logits */
    float *specrows;        /* [n][S][J] speculative gate rows, S = speculative_depth (in
                               route) */
    float *xg;              /* [B][h] one expert's gathered inputs (a token picks an
                               expert at most once, so at most B rows) */
    float *g;               /* [B][imax] gate projections */
    float *u;               /* [B][imax] up projections */
    float *yg;              /* [B][h] expert (or shared expert) outputs */
    float *sg;              /* [B] shared-expert gate logits */
    float *cos;             /* [B][R/2], R = rope_dim */
    float *sin;             /* [B][R/2] */
    float *lbuf;            /* [max(max_sequences, all_logits ? B : 0)][V] lm head rows */
    float *k_cache;         /* [layers][max_context][Hkv·D]; MLA: [..][r_kv + dr] latents
                               and rotary keys (mla.c) */
    float *v_cache;         /* [layers][max_context][Hkv·D]; MLA: unused */
    int64_t cache_w, vcache_w; /* floats of a position's row in k_cache and v_cache (MLA: 0) */
    float *mla_scratch;     /* MLA: mla_slots × fmoe__mla_scratch_floats */
    int32_t mla_slots;      /* MLA: scratch slots, one per CPU thread that runs heads */
    /* host memory: what the host reads of a pass, and the index lists it builds */
    void *route_h;          /* route's host mirror, the same layout (on a host_memory
                               backend: route itself) */
    int32_t *topk_h;        /* [n][K] mirrors of topk, topw, probs, specrows and xn: */
    float *topw_h;          /* [n][K] the same parts of route_h */
    float *probs_h;         /* [n][J] */
    float *specrows_h;      /* [n][S][J] */
    float *xn_h;            /* [n][h] */
    uint16_t *chosen;       /* [B][K] chosen experts, as the routing hook passes them */
    int32_t *distinct;      /* [J] the layer's experts in order of first appearance */
    int32_t *corder;        /* [J] the order they run in: indices into distinct (the
                               routing hook may permute it; fmoe_route_event) */
    int32_t *count;         /* [J] tokens routed to each expert in this chunk */
    int32_t *slots;         /* [J][B·K] (token·K + k) routed to each expert */
    int32_t *rows_h;        /* [B] one expert's token rows */
    float *scale_h;         /* [B] their combine weights */
    int32_t *ident_h;       /* [B] 0, 1, 2, ... and */
    float *ones_h;          /* [B] 1, 1, 1, ...: the row lists of an expert whose input is
                               scaled (fmoe__arch.scale_expert_input) */
    fmoe__mlp *moe_w;       /* [J] a layer's chosen experts in compute order, */
    int32_t *moe_off;       /* [J + 1] where each one's rows start in */
    int32_t *moe_rows;      /* [B·K] their token rows and */
    float *moe_scale;       /* [B·K] combine weights: the backend's moe_experts call */
    float *inv_freq;        /* [R/2] */
    int32_t rope_dim;       /* R: the rotated dims per head (D; MLA: qk_rope_head_dim;
                               GLM-4.5: D · partial_rotary_factor) */
    fmoe__mla_seq *mla_seqs; /* [B] MLA: the segments of a pass */
    float *cos_h;           /* [B][D/2] tables computed here, uploaded to cos/sin */
    float *sin_h;           /* [B][D/2] */
    /* a device backend's host lane: experts given in host memory run on the CPU */
    void *hctx;             /* the CPU backend's context, or NULL */
    float *hx, *hg, *hu, *hy; /* [B][h], [B][imax], [B][imax], [B][h] */
    int64_t rope_seq_len;   /* the sequence length inv_freq was computed for */
    int64_t call_seq_len;   /* position + n of the current forward call */
    float rope_scale;
    segment *segs;          /* [B] the segments of a call this session runs */
    int32_t batch_mark;     /* set while fmoe_session_forward_batch checks its items */
};

fmoe_session_options fmoe_session_defaults(void) {
    fmoe_session_options o;
    memset(&o, 0, sizeof o);
    o.backend = FMOE_BACKEND_CPU;
    o.max_context = 0;
    o.max_batch = 64;
    return o;
}

/* ---------------------------------------------------------------------------------- */
/* Init                                                                               */
/* ---------------------------------------------------------------------------------- */

/* The session's buffers: backend ones (released through the backend) and host ones. */
#define BACKEND_BUFFERS(s)                                                                 \
    {(void **)&(s)->x, (void **)&(s)->route, (void **)&(s)->q, (void **)&(s)->k,           \
     (void **)&(s)->v, (void **)&(s)->att, (void **)&(s)->acc, (void **)&(s)->rlogits,     \
     (void **)&(s)->spec, (void **)&(s)->xg, (void **)&(s)->g, (void **)&(s)->u,           \
     (void **)&(s)->yg, (void **)&(s)->sg, (void **)&(s)->cos, (void **)&(s)->sin,         \
     (void **)&(s)->lbuf, (void **)&(s)->k_cache, (void **)&(s)->v_cache,                 \
     (void **)&(s)->mla_scratch}

void fmoe_session_free(fmoe_session *s) {
    if (!s) return;
    if (s->be && s->bctx) {
        void **bufs[] = BACKEND_BUFFERS(s);
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) s->be->release(s->bctx, *bufs[i]);
        s->be->free(s->bctx);
    }
    if (!s->be || !s->be->host_memory) free(s->route_h);
    if (s->hctx) {
        float *host_lane[] = {s->hx, s->hg, s->hu, s->hy};
        for (size_t i = 0; i < 4; i++) fmoe__cpu_backend.release(s->hctx, host_lane[i]);
        fmoe__cpu_backend.free(s->hctx);
    }
    void *host[] = {s->chosen, s->distinct, s->corder, s->count, s->slots, s->rows_h,
                    s->scale_h, s->inv_freq, s->cos_h, s->sin_h, s->segs, s->mla_seqs,
                    s->ident_h, s->ones_h, s->moe_w, s->moe_off, s->moe_rows,
                    s->moe_scale};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    free(s);
}

/* The backend a session asked for. @return 0, FMOE_EINVAL, FMOE_EUNSUPPORTED (CUDA
 * missing here: the detail says why). */
static int backend_for(fmoe_backend_kind kind, const fmoe__backend_ops **out) {
    switch (kind) {
    case FMOE_BACKEND_CPU: *out = &fmoe__cpu_backend; return 0;
    case FMOE_BACKEND_CUDA:
        *out = fmoe__cuda_backend();
        return *out ? 0 : FMOE_EUNSUPPORTED;
    }
    return fmoe_error_set(FMOE_EINVAL, "unknown backend %d", (int)kind);
}

/* fmoe_session_init on backend `be`, or on the one the options name when be is NULL. */
static int session_init(const fmoe_model *m, const fmoe_session_options *options,
                        const fmoe__backend_ops *be, fmoe_session **out) {
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
    o.activations = fmoe_activations_resolve(o.activations, o.backend);
    FMOE_RETURN_ERROR_IF(o.activations != FMOE_ACTIVATIONS_F32 &&
                             o.activations != FMOE_ACTIVATIONS_Q8,
                         FMOE_EINVAL, "activations %d: expected f32 (0), q8 (1) or auto (2)",
                         (int)o.activations);
    /* Refused rather than ignored: a run asked for 8-bit inputs would otherwise compute,
     * and a trace record, f32 ones without a word. Checked before the backend is looked
     * up, so that the refusal reads the same on a machine without CUDA. */
    FMOE_RETURN_ERROR_IF(o.activations == FMOE_ACTIVATIONS_Q8 && o.backend != FMOE_BACKEND_CPU,
                         FMOE_EUNSUPPORTED,
                         "activations q8 is the CPU backend's: the %s backend's quantized "
                         "kernels take f32 inputs",
                         fmoe_backend_name(o.backend));
    /* The loader takes every type the CPU backend computes (fmoe_quant_supported); the
     * CUDA backend lacks some, refused here in one line naming a tensor (backend_types.c). */
    FMOE_FORWARD_IF_ERROR(fmoe__model_check_backend_types(m, o.backend));
    if (!be) FMOE_FORWARD_IF_ERROR(backend_for(o.backend, &be));
    FMOE_RETURN_ERROR_IF(m->arch.mla && !be->mla_attention, FMOE_EUNSUPPORTED,
                         "model_type %s: the %s backend has no multi-head latent attention "
                         "(nor DeepSeek's grouped routing) yet; run it with --backend cpu",
                         g->model_type, be->name);
    FMOE_RETURN_ERROR_IF(!m->arch.mla && m->arch.rope_dim < g->head_dim && !be->rope_partial,
                         FMOE_EUNSUPPORTED,
                         "model_type %s: the %s backend has no partial rotary embedding yet; "
                         "run it with --backend cpu",
                         g->model_type, be->name);
    FMOE_RETURN_ERROR_IF(m->arch.layernorm && !be->layernorm, FMOE_EUNSUPPORTED,
                         "model_type %s: the %s backend has no LayerNorm with bias (nor "
                         "sparsemixer routing) yet; run it with --backend cpu",
                         g->model_type, be->name);
    FMOE_RETURN_ERROR_IF(m->arch.attn_sinks && !be->swiglu_clamped, FMOE_EUNSUPPORTED,
                         "model_type %s: the %s backend has no attention sinks nor clamped "
                         "SwiGLU experts yet; run it with --backend cpu",
                         g->model_type, be->name);

    fmoe_session *s = calloc(1, sizeof *s);
    if (!s) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    s->m = m;
    s->opt = o;
    s->be = be;

    const int64_t B = o.max_batch, h = g->hidden_size, J = g->num_experts, K = g->top_k;
    const int64_t D = g->head_dim;
    int64_t qd = (int64_t)g->num_attention_heads * D;
    int64_t kd = (int64_t)g->num_key_value_heads * D, vd = kd, cache_w = kd, vcache_w = kd;
    const int64_t S = o.speculative_depth;
    const int mla = m->arch.mla;
    /* rotated dims per head: MLA's decoupled rope dims, GLM-4.5's partial share, else D */
    const int64_t R = m->arch.rope_dim > 0 ? m->arch.rope_dim : mla ? g->qk_rope_head_dim : D;
    int64_t mla_scratch = 1;
    if (mla) {
        /* q: H(dn + dr) = qd; k holds kv_a's rows (r_kv + dr), v q_a's (r_q), att the
         * heads' dv outputs; the cache one latent and rotary key per token. */
        const int64_t ks = (int64_t)g->kv_lora_rank + g->qk_rope_head_dim;
        const int64_t hv = (int64_t)g->num_attention_heads * g->v_head_dim;
        kd = ks > kd ? ks : kd;
        vd = g->q_lora_rank > vd ? g->q_lora_rank : vd;
        qd = hv > qd ? hv : qd;
        cache_w = ks;
        vcache_w = 0;
        /* a slot per thread of the CPU backend's pool (its rule for threads 0: all cores),
         * so heads run in parallel there */
        long cores = o.threads > 0 ? o.threads : sysconf(_SC_NPROCESSORS_ONLN);
        cores = cores < 1 ? 1 : cores > 256 ? 256 : cores;
        s->mla_slots = (int32_t)cores;
        mla_scratch = cores * fmoe__mla_scratch_floats(g->qk_nope_head_dim, g->v_head_dim,
                                                       g->kv_lora_rank, o.max_context, B);
    }
    int64_t imax = g->moe_intermediate_size;
    if (g->shared_intermediate_size > imax) imax = g->shared_intermediate_size;
    if (g->intermediate_size > imax) imax = g->intermediate_size;
    s->imax = (int32_t)imax;
    int64_t max_cols = h > qd ? h : qd;
    if (imax > max_cols) max_cols = imax;
    if (vd > max_cols) max_cols = vd; /* MLA: q_b_proj's input (r_q) */
    if (mla && g->kv_lora_rank > max_cols) max_cols = g->kv_lora_rank;

    fmoe__backend_limits lim = {.weights = (fmoe__weight_home *)&m->backend_weights,
                                .threads = o.threads, .max_cols = max_cols,
                                .max_batch = o.max_batch, .max_context = o.max_context,
                                .max_experts = (int32_t)(B * K),
                                .activations = o.activations,
                                .max_marks = g->num_hidden_layers + 1};
    int rc = s->be->init(&lim, &s->bctx);
    if (rc < 0) {
        free(s);
        return rc;
    }
    s->cache_w = cache_w;
    s->vcache_w = vcache_w;
    const int64_t kv = (int64_t)g->num_hidden_layers * o.max_context * cache_w;
    const int64_t vkv = (int64_t)g->num_hidden_layers * o.max_context * vcache_w;
    const int64_t lm_rows = o.all_logits && B > o.max_sequences ? B : o.max_sequences;
    const int64_t route_bytes = fmoe__routing_layout_of(B, h, J, K, S).off[FMOE__ROUTE_PARTS];
    const int64_t sizes[] = {B * h * 4,     route_bytes,     B * qd * 4,      B * kd * 4,
                             B * vd * 4,    B * qd * 4,      B * h * 4,       B * J * 4,
                             B * J * 4,     B * h * 4,       B * imax * 4,    B * imax * 4,
                             B * h * 4,     B * 4,           B * (R / 2) * 4, B * (R / 2) * 4,
                             lm_rows * g->vocab_size * 4,    kv * 4,          vkv * 4,
                             mla_scratch * 4};
    void **bufs[] = BACKEND_BUFFERS(s);
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i] = s->be->alloc(s->bctx, sizes[i]);
        if (!*bufs[i]) {
            rc = !s->be->host_memory
                     ? FMOE_ENOMEM /* the device backend's detail says asked and free */
                     : fmoe_error_set(FMOE_ENOMEM,
                                      "out of memory for the run state (KV cache of %d "
                                      "positions: %.1f MiB)",
                                      o.max_context, (double)(kv + vkv) * 4 / (1 << 20));
            goto fail;
        }
    }
    s->xn = s->route; /* at offset 0 whatever the pass's n */
    if (s->be->host_memory) {
        s->route_h = s->route;
    } else {
        s->route_h = malloc((size_t)route_bytes);
        if (!s->route_h) goto oom;
        if (o.on_expert) { /* the host lane for experts an executor gives in host memory */
            fmoe__backend_limits hl = lim;
            hl.max_cols = max_cols;
            hl.max_marks = 0; /* the pass marks on its own context */
            rc = fmoe__cpu_backend.init(&hl, &s->hctx);
            if (rc < 0) goto fail;
            s->hx = fmoe__cpu_backend.alloc(s->hctx, B * h * 4);
            s->hg = fmoe__cpu_backend.alloc(s->hctx, B * imax * 4);
            s->hu = fmoe__cpu_backend.alloc(s->hctx, B * imax * 4);
            s->hy = fmoe__cpu_backend.alloc(s->hctx, B * h * 4);
            if (!s->hx || !s->hg || !s->hu || !s->hy) goto oom;
        }
    }
    s->chosen = malloc((size_t)(B * K) * sizeof *s->chosen);
    s->distinct = malloc((size_t)J * sizeof *s->distinct);
    s->corder = malloc((size_t)J * sizeof *s->corder);
    s->count = malloc((size_t)J * sizeof *s->count);
    s->slots = malloc((size_t)(J * B * K) * sizeof *s->slots);
    s->rows_h = malloc((size_t)B * sizeof *s->rows_h);
    s->scale_h = malloc((size_t)B * sizeof *s->scale_h);
    s->inv_freq = malloc((size_t)(R / 2 > 0 ? R / 2 : 1) * sizeof *s->inv_freq);
    s->cos_h = malloc((size_t)(B * (R / 2) + 1) * sizeof *s->cos_h);
    s->sin_h = malloc((size_t)(B * (R / 2) + 1) * sizeof *s->sin_h);
    s->segs = calloc((size_t)B, sizeof *s->segs);
    s->mla_seqs = calloc((size_t)B, sizeof *s->mla_seqs);
    s->ident_h = malloc((size_t)B * sizeof *s->ident_h);
    s->ones_h = malloc((size_t)B * sizeof *s->ones_h);
    s->moe_w = malloc((size_t)J * sizeof *s->moe_w);
    s->moe_off = malloc((size_t)(J + 1) * sizeof *s->moe_off);
    s->moe_rows = malloc((size_t)(B * K) * sizeof *s->moe_rows);
    s->moe_scale = malloc((size_t)(B * K) * sizeof *s->moe_scale);
    if (!s->chosen || !s->distinct || !s->corder || !s->count || !s->slots || !s->rows_h ||
        !s->scale_h || !s->inv_freq || !s->cos_h || !s->sin_h || !s->segs || !s->mla_seqs ||
        !s->ident_h || !s->ones_h || !s->moe_w || !s->moe_off || !s->moe_rows || !s->moe_scale)
        goto oom;
    for (int64_t r = 0; r < B; r++) {
        s->ident_h[r] = (int32_t)r;
        s->ones_h[r] = 1.0f;
    }
    s->rope_dim = (int32_t)R;
    fmoe__rope_inv_freq(&m->arch.rope, s->rope_dim, 0, s->inv_freq, &s->rope_scale);
    s->rope_seq_len = 0;
    *out = s;
    return 0;
oom:
    rc = fmoe_error_set(FMOE_ENOMEM, "out of memory for the run state");
fail:
    fmoe_session_free(s);
    return rc;
}

int fmoe_session_init(const fmoe_model *m, const fmoe_session_options *options,
                      fmoe_session **out) {
    return session_init(m, options, NULL, out);
}

int fmoe__session_init_backend(const fmoe_model *m, const fmoe_session_options *options,
                               const fmoe__backend_ops *be, fmoe_session **out) {
    if (!be) return fmoe_error_set(FMOE_EINVAL, "backend table is NULL");
    return session_init(m, options, be, out);
}

void fmoe_session_reset(fmoe_session *s) {
    if (s) s->pos = 0;
}

int32_t fmoe_session_position(const fmoe_session *s) { return s ? s->pos : 0; }

int fmoe_model_prefix_reusable(const fmoe_model *m) {
    /* the keys of a dynamic-NTK or longrope model are rotated with frequencies of the
     * call's whole length: kept ones would differ from a fresh run's */
    const fmoe__rope_type t = m->arch.rope.type;
    return t != FMOE__ROPE_DYNAMIC && t != FMOE__ROPE_LONGROPE;
}

int fmoe_session_keep_prefix(fmoe_session *s, int32_t n) {
    FMOE_RETURN_ERROR_IF(n < 0 || n > s->pos, FMOE_EINVAL,
                         "keep_prefix: %d positions asked, the cache holds %d", n, s->pos);
    FMOE_RETURN_ERROR_IF(!fmoe_model_prefix_reusable(s->m), FMOE_EUNSUPPORTED,
                         "keep_prefix: the rotary embedding (%s) depends on the whole call's "
                         "length, so a kept prefix would differ from a fresh run",
                         s->m->arch.rope_desc);
    s->pos = n;
    return 0;
}

int64_t fmoe_session_kv_bytes(const fmoe_session *s) {
    return (int64_t)s->m->geo.num_hidden_layers * s->opt.max_context *
           (s->cache_w + s->vcache_w) * (int64_t)sizeof(float);
}

int fmoe_session_copy_prefix(fmoe_session *dst, const fmoe_session *src, int32_t n) {
    FMOE_RETURN_ERROR_IF(dst->m != src->m, FMOE_EINVAL, "copy_prefix: sessions of two models");
    FMOE_RETURN_ERROR_IF(n < 0 || n > src->pos || n > dst->opt.max_context, FMOE_EINVAL,
                         "copy_prefix: %d positions asked, the source holds %d and the "
                         "destination's context is %d", n, src->pos, dst->opt.max_context);
    FMOE_RETURN_ERROR_IF(!fmoe_model_prefix_reusable(dst->m), FMOE_EUNSUPPORTED,
                         "copy_prefix: the rotary embedding (%s) depends on the whole call's "
                         "length", dst->m->arch.rope_desc);
    /* two contexts' buffers: plain host memory on a host backend; a device's would need
     * the source's stream ordered before the destination's copy */
    FMOE_RETURN_ERROR_IF(!dst->be->host_memory || !src->be->host_memory, FMOE_EUNSUPPORTED,
                         "copy_prefix: only between sessions in host memory (the CPU "
                         "backend)");
    const int64_t L = dst->m->geo.num_hidden_layers;
    for (int64_t l = 0; l < L; l++) {
        dst->be->copy(dst->bctx, dst->k_cache + l * dst->opt.max_context * dst->cache_w,
                      src->k_cache + l * src->opt.max_context * src->cache_w,
                      (int64_t)n * dst->cache_w * 4);
        if (dst->vcache_w)
            dst->be->copy(dst->bctx, dst->v_cache + l * dst->opt.max_context * dst->vcache_w,
                          src->v_cache + l * src->opt.max_context * src->vcache_w,
                          (int64_t)n * dst->vcache_w * 4);
    }
    dst->pos = n;
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* Blocks                                                                             */
/* ---------------------------------------------------------------------------------- */

/* Points the routing parts and their host mirrors into s->route and s->route_h, laid out
 * for a pass of n rows (xn stays at offset 0). */
static void routing_views(fmoe_session *s, int32_t n) {
    const fmoe_model_geometry *g = &s->m->geo;
    s->rlay = fmoe__routing_layout_of(n, g->hidden_size, g->num_experts, g->top_k,
                                      s->opt.speculative_depth);
    const fmoe__routing_layout *l = &s->rlay;
    s->xn = fmoe__routing_part(s->route, l, FMOE__ROUTE_XN);
    s->topk = fmoe__routing_part(s->route, l, FMOE__ROUTE_TOPK);
    s->topw = fmoe__routing_part(s->route, l, FMOE__ROUTE_TOPW);
    s->probs = fmoe__routing_part(s->route, l, FMOE__ROUTE_PROBS);
    s->specrows = fmoe__routing_part(s->route, l, FMOE__ROUTE_SPEC);
    s->xn_h = fmoe__routing_part(s->route_h, l, FMOE__ROUTE_XN);
    s->topk_h = fmoe__routing_part(s->route_h, l, FMOE__ROUTE_TOPK);
    s->topw_h = fmoe__routing_part(s->route_h, l, FMOE__ROUTE_TOPW);
    s->probs_h = fmoe__routing_part(s->route_h, l, FMOE__ROUTE_PROBS);
    s->specrows_h = fmoe__routing_part(s->route_h, l, FMOE__ROUTE_SPEC);
}

/* y[n][h] = mlp(x[n][h]) through the session's g/u scratch, on backend `be`; with
 * gpt-oss's biases and clamped SwiGLU where the MLP has them. */
static void run_mlp_on(const fmoe__backend_ops *be, void *ctx, const fmoe__mlp *w,
                       const float *x, int32_t n, float *g, float *u, float *y) {
    const int64_t I = w->gate.rows;
    be->matmul(ctx, &w->gate, x, n, g);
    be->matmul(ctx, &w->up, x, n, u);
    if (w->gate_b) be->add_bias(ctx, g, w->gate_b, n, I);
    if (w->up_b) be->add_bias(ctx, u, w->up_b, n, I);
    if (w->glu_limit > 0)
        be->swiglu_clamped(ctx, g, u, (int64_t)n * I, w->glu_alpha, w->glu_limit);
    else
        be->swiglu(ctx, g, u, (int64_t)n * I);
    be->matmul(ctx, &w->down, g, n, y);
    if (w->down_b) be->add_bias(ctx, y, w->down_b, n, w->down.rows);
}

static void run_mlp(fmoe_session *s, const fmoe__mlp *w, const float *x, int32_t n, float *y) {
    run_mlp_on(s->be, s->bctx, w, x, n, s->g, s->u, y);
}

int fmoe__expert_run(const fmoe__backend_ops *be, void *ctx, const fmoe__expert_io *io,
                     const fmoe__mlp *w, int32_t c, int32_t h, int slot, void *fence) {
    be->gather_rows(ctx, io->xg, io->xn, io->rows_h, c, h);
    run_mlp_on(be, ctx, w, io->xg, c, io->g, io->u, io->yg);
    be->scatter_add(ctx, io->acc, io->yg, io->rows_h, io->scale_h, c, h);
    /* A slot may be overwritten once on_expert_done says so, and the compute is queued,
     * not finished, when the calls return: the slot's fence marks where its reads end, for
     * the copy into it to wait for on the device. Without one, the device is waited for. */
    if (!slot || be->host_memory) return 0;
    return fence ? be->fence_record(ctx, fence) : be->sync(ctx);
}

int fmoe__routing_to_host(const fmoe__backend_ops *be, void *ctx, const fmoe__routing_io *r,
                          int probs, int hidden, int spec) {
    if (be->host_memory) return 0;
    /* One range: the parts in between come along (model_impl.h: they are small). */
    const int64_t lo = r->lay.off[hidden ? FMOE__ROUTE_XN : FMOE__ROUTE_TOPK];
    const int64_t hi = r->lay.off[spec    ? FMOE__ROUTE_SPEC + 1
                                  : probs ? FMOE__ROUTE_PROBS + 1
                                          : FMOE__ROUTE_TOPW + 1];
    return be->download(ctx, (char *)r->host + lo, (const char *)r->buf + lo, hi - lo);
}

/* The model's norm of `rows` rows of h values: RMSNorm, or LayerNorm with bias `b` when
 * the family has it (Phi-3.5-MoE: every norm, the final one too). */
static void norm_rows(fmoe_session *s, float *y, const float *x, const float *w, const float *b,
                      int64_t rows) {
    const fmoe_model_geometry *g = &s->m->geo;
    if (s->m->arch.layernorm)
        s->be->layernorm(s->bctx, y, x, w, b, rows, g->hidden_size, (float)g->rms_norm_eps);
    else
        s->be->rmsnorm(s->bctx, y, x, w, rows, g->hidden_size, (float)g->rms_norm_eps);
}

/* Attention block of decoder layer li over the n rows of all segments; adds its output to
 * s->x. Projections, norms and RoPE (s->cos/s->sin hold each row's position) run over all
 * rows; each segment writes its keys and values to its own session's cache and attends
 * there at its own positions. */
static void attention_block(fmoe_session *s, int32_t li, const segment *sg, int32_t count,
                            int32_t n) {
    const fmoe__backend_ops *be = s->be;
    void *c = s->bctx;
    const fmoe_model *m = s->m;
    const fmoe_model_geometry *g = &m->geo;
    const fmoe__layer *L = &m->layers[li];
    const int32_t h = g->hidden_size, D = g->head_dim, Hq = g->num_attention_heads;
    const int32_t Hk = g->num_key_value_heads;
    const int64_t qd = (int64_t)Hq * D, kd = (int64_t)Hk * D;
    const float eps = (float)g->rms_norm_eps;

    norm_rows(s, s->xn, s->x, L->attn_norm, L->attn_norm_b, n);
    if (m->arch.mla) {
        const int64_t ks = (int64_t)g->kv_lora_rank + g->qk_rope_head_dim;
        for (int32_t i = 0; i < count; i++)
            s->mla_seqs[i] = (fmoe__mla_seq){
                .row = sg[i].row, .n = sg[i].n, .pos0 = sg[i].pos0,
                .cache = sg[i].s->k_cache + (int64_t)li * sg[i].s->opt.max_context * ks};
        const fmoe__mla_bufs b = {.xn = s->xn, .q = s->q, .kv = s->k, .qa = s->v,
                                  .att = s->att, .cos = s->cos, .sin = s->sin,
                                  .scratch = s->mla_scratch, .slots = s->mla_slots,
                                  .max_context = s->opt.max_context,
                                  .max_batch = s->opt.max_batch};
        fmoe__mla_attention(be, c, m, L, &b, s->mla_seqs, count, n);
        be->matmul(c, &L->wo, s->att, n, s->acc);
        be->add(c, s->x, s->acc, (int64_t)n * h);
        return;
    }
    if (be->matmul_same_input) {
        const fmoe__mat *ws[3] = {&L->wq, &L->wk, &L->wv};
        float *ys[3] = {s->q, s->k, s->v};
        be->matmul_same_input(c, ws, 3, s->xn, n, ys);
    } else {
        be->matmul(c, &L->wq, s->xn, n, s->q);
        be->matmul(c, &L->wk, s->xn, n, s->k);
        be->matmul(c, &L->wv, s->xn, n, s->v);
    }
    if (L->bq) be->add_bias(c, s->q, L->bq, n, qd);
    if (L->bk) be->add_bias(c, s->k, L->bk, n, kd);
    if (L->bv) be->add_bias(c, s->v, L->bv, n, kd);
    if (m->arch.qk_norm == FMOE__QK_NORM_HEAD && L->q_norm) { /* Llama 4: rotary layers */
        be->rmsnorm(c, s->q, s->q, L->q_norm, (int64_t)n * Hq, D, eps);
        be->rmsnorm(c, s->k, s->k, L->k_norm, (int64_t)n * Hk, D, eps);
    } else if (m->arch.qk_norm == FMOE__QK_NORM_FULL) {
        be->rmsnorm(c, s->q, s->q, L->q_norm, n, (int32_t)qd, eps);
        be->rmsnorm(c, s->k, s->k, L->k_norm, n, (int32_t)kd, eps);
    }
    if (m->arch.clip_qkv > 0) {
        be->clamp(c, s->q, n * qd, m->arch.clip_qkv);
        be->clamp(c, s->k, n * kd, m->arch.clip_qkv);
        be->clamp(c, s->v, n * kd, m->arch.clip_qkv);
    }
    const int nope = m->arch.layer_nope && m->arch.layer_nope[li]; /* Llama 4 */
    if (nope) {
        /* no rotary embedding on this layer */
    } else if (s->rope_dim < D) { /* GLM-4.5: the first rope_dim of each head */
        be->rope_partial(c, s->q, n, Hq, D, s->rope_dim, s->cos, s->sin);
        be->rope_partial(c, s->k, n, Hk, D, s->rope_dim, s->cos, s->sin);
    } else {
        be->rope(c, s->q, n, Hq, D, s->cos, s->sin);
        be->rope(c, s->k, n, Hk, D, s->cos, s->sin);
    }
    for (int32_t i = 0; i < count; i++) {
        const segment *e = &sg[i];
        const int64_t ctx = e->s->opt.max_context;
        float *kc = e->s->k_cache + (int64_t)li * ctx * kd;
        float *vc = e->s->v_cache + (int64_t)li * ctx * kd;
        const int64_t bytes = (int64_t)e->n * kd * (int64_t)sizeof(float);
        be->copy(c, kc + (int64_t)e->pos0 * kd, s->k + e->row * kd, bytes);
        be->copy(c, vc + (int64_t)e->pos0 * kd, s->v + e->row * kd, bytes);
        fmoe__attn_args a = {
            .q = s->q + e->row * qd, .k_cache = kc, .v_cache = vc, .out = s->att + e->row * qd,
            .n = e->n, .pos0 = e->pos0, .n_heads = Hq, .n_kv_heads = Hk, .head_dim = D,
            .window = m->arch.sliding_window[li], .scale = 1.0f / sqrtf((float)D),
            .sinks = L->sinks,
        };
        if (m->arch.layer_nope) /* Llama 4: chunks, query temperature */
            fmoe__llama4_attention(be, c, &m->arch, li, &a, kd);
        else
            be->attention(c, &a);
    }
    be->matmul(c, &L->wo, s->att, n, s->acc);
    if (L->bo) be->add_bias(c, s->acc, L->bo, n, h);
    be->add(c, s->x, s->acc, (int64_t)n * h);
}

/* The speculative gate rows of the pass (fmoe_route_event.speculative): for s = 1..S the
 * router of MoE layer l+s applied to layer l's gate input, as probabilities, into
 * s->specrows [n][S][J] (0 past the last layer); the routing's download brings them to
 * the host. */
static void speculative_rows(fmoe_session *s, int32_t l, int32_t n) {
    const fmoe_model *m = s->m;
    const fmoe_model_geometry *g = &m->geo;
    const int32_t J = g->num_experts, Lm = g->num_moe_layers, S = s->opt.speculative_depth;
    for (int32_t sd = 1; sd <= S; sd++) {
        float *dst = s->specrows + (int64_t)(sd - 1) * J;
        if (l + sd >= Lm) {
            for (int32_t t = 0; t < n; t++)
                s->be->zero(s->bctx, dst + (int64_t)t * S * J, (int64_t)J * sizeof(float));
            continue;
        }
        const fmoe__layer *Ls = &m->layers[g->moe_layer_index[l + sd]];
        s->be->matmul(s->bctx, &Ls->router, s->xn, n, s->spec);
        if (Ls->router_b) s->be->add_bias(s->bctx, s->spec, Ls->router_b, n, J);
        s->be->probs(s->bctx, dst, (int64_t)S * J, s->spec, n, J,
                     g->scoring == FMOE_ROUTER_SIGMOID);
    }
}

/* Copies a segment's routing (its rows of the runner's host mirrors) into its trace
 * arrays. */
static void trace_routing(const fmoe_session *s, int32_t l, const segment *e, int have_spec) {
    const fmoe_model_geometry *g = &s->m->geo;
    const int32_t h = g->hidden_size, J = g->num_experts, K = g->top_k;
    const int32_t Lm = g->num_moe_layers, S = s->opt.speculative_depth;
    const fmoe_forward_trace *tr = e->tr;
    for (int32_t i = 0; i < e->n; i++) {
        const int64_t row = (int64_t)(e->t0 + i) * Lm + l, t = e->row + i;
        if (tr->experts) memcpy(tr->experts + row * K, s->chosen + t * K, (size_t)K * 2);
        if (tr->weights)
            memcpy(tr->weights + row * K, s->topw_h + t * K, (size_t)K * sizeof(float));
        if (tr->probs) memcpy(tr->probs + row * J, s->probs_h + t * J, (size_t)J * sizeof(float));
        if (tr->hidden) memcpy(tr->hidden + row * h, s->xn_h + t * h, (size_t)h * sizeof(float));
        if (tr->speculative && have_spec)
            memcpy(tr->speculative + row * S * J, s->specrows_h + t * S * J,
                   (size_t)S * J * sizeof(float));
    }
}

/* Where expert j of the layer runs from. */
typedef enum expert_home {
    EXPERT_MODEL = 0,  /* the model's own weights, mapped by the backend */
    EXPERT_SLOT = 1,   /* an executor's copy in the backend's memory (a GPU slot) */
    EXPERT_HOST = 2,   /* an executor's copy in host memory: on a device backend it runs
                          on the host lane (the CPU backend) */
} expert_home;

/* The weights expert j of the layer runs with: the executor's (on_expert returned 0) or
 * the model's own. @return 0 or the hook's error. */
static int expert_weights(fmoe_session *s, const fmoe__layer *L, int32_t j, fmoe__mlp *out,
                          expert_home *home, void **fence) {
    *out = L->experts[j];
    *home = EXPERT_MODEL;
    *fence = NULL;
    if (!s->opt.on_expert) return 0;
    fmoe_expert_view v;
    memset(&v, 0, sizeof v);
    const int rc = s->opt.on_expert(s->opt.route_ctx, L->moe_index, j, &v);
    if (rc != 0) return rc < 0 ? rc : 0;
    const fmoe_matrix_view *src[3] = {&v.gate, &v.up, &v.down};
    fmoe__mat *dst[3] = {&out->gate, &out->up, &out->down};
    for (int i = 0; i < 3; i++)
        *dst[i] = (fmoe__mat){.data = src[i]->data, .dtype = src[i]->dtype,
                              .rows = src[i]->rows, .cols = src[i]->cols,
                              .quant = src[i]->quant, .on_backend = src[i]->on_device};
    *home = v.gate.on_device ? EXPERT_SLOT : EXPERT_HOST;
    if (v.gate.on_device) *fence = v.fence;
    return 0;
}

/* One routed expert over its c tokens (rows_h: their rows, scale_h: their weights),
 * adding its weighted output to s->acc; `fence`: a slot expert's (expert_weights).
 * @return 0 or the backend's error. */
static int run_expert(fmoe_session *s, const fmoe__mlp *w, expert_home home, void *fence,
                      int32_t c) {
    const int32_t h = s->m->geo.hidden_size;
    const fmoe__backend_ops *be = s->be;
    if (home == EXPERT_HOST && !be->host_memory) {
        /* The host lane: the gathered rows down, the expert on the CPU, its rows back. */
        be->gather_rows(s->bctx, s->xg, s->xn, s->rows_h, c, h);
        FMOE_FORWARD_IF_ERROR(be->download(s->bctx, s->hx, s->xg, (int64_t)c * h * 4));
        run_mlp_on(&fmoe__cpu_backend, s->hctx, w, s->hx, c, s->hg, s->hu, s->hy);
        be->upload(s->bctx, s->yg, s->hy, (int64_t)c * h * 4);
        be->scatter_add(s->bctx, s->acc, s->yg, s->rows_h, s->scale_h, c, h);
        return 0;
    }
    if (s->m->arch.scale_expert_input) {
        /* Llama 4 (Llama4TextMoe): the expert runs on its rows of xn times their weights,
         * and its outputs add unweighted. The rows are gathered into yg and weighted into
         * xg by a scatter onto zeros (row r to row r: the backend has no row-scale op,
         * and this keeps every step one the device backends have too). */
        be->gather_rows(s->bctx, s->yg, s->xn, s->rows_h, c, h);
        be->zero(s->bctx, s->xg, (int64_t)c * h * (int64_t)sizeof(float));
        be->scatter_add(s->bctx, s->xg, s->yg, s->ident_h, s->scale_h, c, h);
        run_mlp(s, w, s->xg, c, s->yg);
        be->scatter_add(s->bctx, s->acc, s->yg, s->rows_h, s->ones_h, c, h);
        if (home != EXPERT_SLOT || be->host_memory) return 0;
        return fence ? be->fence_record(s->bctx, fence) : be->sync(s->bctx);
    }
    const fmoe__expert_io io = {.xn = s->xn, .xg = s->xg, .g = s->g, .u = s->u, .yg = s->yg,
                                .acc = s->acc, .rows_h = s->rows_h, .scale_h = s->scale_h};
    return fmoe__expert_run(be, s->bctx, &io, w, c, h, home == EXPERT_SLOT, fence);
}

/* The shared expert of MoE layer L over the n rows of s->xn, added to s->acc (Qwen2-MoE:
 * gated by sigmoid(xn·w)). */
static void shared_expert(fmoe_session *s, const fmoe__layer *L, int32_t n) {
    const fmoe__backend_ops *be = s->be;
    void *c = s->bctx;
    const int32_t h = s->m->geo.hidden_size;
    run_mlp(s, &L->shared, s->xn, n, s->yg);
    if (s->m->arch.shared_gate) {
        be->matmul(c, &L->shared_gate, s->xn, n, s->sg);
        be->add_gated(c, s->acc, s->yg, s->sg, n, h);
    } else {
        be->add(c, s->acc, s->yg, (int64_t)n * h);
    }
}

/* MoE block: routes the n rows of s->xn (all segments' tokens), runs their experts, adds
 * to s->x. Experts run in order of first appearance over the rows (row by row, k by k:
 * docs/design.md §7.1), the order the routing hook announces and a live executor resolves its
 * accesses in, unless the hook reorders them (compute_order: ProMoE's reordered compute);
 * each chosen expert runs once, over the rows of every segment that chose it.
 * @return 0 or a hook's or the backend's error. */
static int moe_block(fmoe_session *s, const fmoe__layer *L, const segment *sg, int32_t count,
                     int32_t n) {
    const fmoe__backend_ops *be = s->be;
    void *c = s->bctx;
    const fmoe_model *m = s->m;
    const fmoe_model_geometry *g = &m->geo;
    const int32_t h = g->hidden_size, J = g->num_experts, K = g->top_k;
    const int32_t l = L->moe_index, S = s->opt.speculative_depth;

    be->matmul(c, &L->router, s->xn, n, s->rlogits);
    if (L->router_b) be->add_bias(c, s->rlogits, L->router_b, n, J);
    const fmoe__route_args ra = {
        .n = n, .num_experts = J, .top_k = K, .sigmoid = g->scoring == FMOE_ROUTER_SIGMOID,
        .norm = m->arch.route_norm, .norm_eps = m->arch.route_norm_eps,
        .scale = (float)g->routed_scaling_factor, .n_group = g->n_group,
        .topk_group = g->topk_group, .group_top2 = m->arch.route_group_top2,
        .bias = L->route_bias, .choice = s->spec, .sparsemixer = m->arch.sparsemixer,
        .jitter_eps = m->arch.jitter_eps};
    be->route(c, &ra, s->rlogits, s->probs, s->topk, s->topw);

    int want_spec = s->opt.on_route != NULL, want_probs = s->opt.on_route != NULL;
    int want_hidden = s->opt.on_route != NULL;
    for (int32_t i = 0; i < count; i++)
        if (sg[i].tr) {
            want_spec |= sg[i].tr->speculative != NULL;
            want_probs |= sg[i].tr->probs != NULL;
            want_hidden |= sg[i].tr->hidden != NULL;
        }
    const int have_spec = S > 0 && want_spec;
    if (have_spec) speculative_rows(s, l, n);
    /* The layer's routing to the host, in one download: what grouping, hooks and traces
     * read. */
    const fmoe__routing_io rio = {.buf = s->route, .host = s->route_h, .lay = s->rlay};
    FMOE_FORWARD_IF_ERROR(fmoe__routing_to_host(be, c, &rio, want_probs, want_hidden,
                                                have_spec));

    /* Group (token, k) slots by expert, noting the order experts first appear in. */
    int32_t num_distinct = 0;
    memset(s->count, 0, (size_t)J * sizeof *s->count);
    const int64_t cap = (int64_t)s->opt.max_batch * K;
    for (int32_t t = 0; t < n; t++)
        for (int32_t k = 0; k < K; k++) {
            const int32_t e = s->topk_h[t * K + k];
            s->chosen[t * K + k] = (uint16_t)e;
            if (s->count[e] == 0) s->distinct[num_distinct++] = e;
            s->slots[(int64_t)e * cap + s->count[e]++] = t * K + k;
        }

    for (int32_t i = 0; i < count; i++)
        if (sg[i].tr) trace_routing(s, l, &sg[i], have_spec);
    for (int32_t q = 0; q < num_distinct; q++) s->corder[q] = q;
    if (s->opt.on_route) {
        const fmoe_route_event ev = {
            .layer = l, .num_tokens = n, .chosen = s->chosen, .chosen_stride = K,
            .probs = s->probs_h, .probs_stride = J, .distinct = s->distinct,
            .tokens = s->count, .num_distinct = num_distinct,
            .speculative = have_spec ? s->specrows_h : NULL,
            .speculative_stride = (int64_t)S * J, .speculative_depth = have_spec ? S : 0,
            .hidden = s->xn_h, .hidden_stride = h, .compute_order = s->corder};
        FMOE_FORWARD_IF_ERROR(s->opt.on_route(s->opt.route_ctx, &ev));
    }

    be->zero(c, s->acc, (int64_t)n * h * (int64_t)sizeof(float));
    /* Without hooks on expert weights, the backend may take the whole layer at once
     * (moe_experts: on the CPU two thread-pool jobs instead of three per expert); the same
     * sums in the same order as the loop below, which runs where it declines. */
    const int shared_too = L->has_shared && !m->arch.shared_gate;
    if (be->moe_experts && !s->opt.on_expert && !s->opt.on_expert_done &&
        !m->arch.scale_expert_input) {
        int32_t r = 0;
        for (int32_t q = 0; q < num_distinct; q++) {
            const int32_t e = s->distinct[s->corder[q]];
            const int32_t *sl = s->slots + (int64_t)e * cap;
            s->moe_w[q] = L->experts[e];
            s->moe_off[q] = r;
            for (int32_t i = 0; i < s->count[e]; i++, r++) {
                s->moe_rows[r] = sl[i] / K;
                s->moe_scale[r] = s->topw_h[sl[i]];
            }
        }
        s->moe_off[num_distinct] = r;
        const fmoe__moe_args ma = {.xn = s->xn, .acc = s->acc, .n = n, .h = h,
                                   .count = num_distinct, .experts = s->moe_w,
                                   .offset_host = s->moe_off, .rows_host = s->moe_rows,
                                   .scale_host = s->moe_scale,
                                   .shared = shared_too ? &L->shared : NULL};
        if (be->moe_experts(c, &ma) == 0) {
            if (L->has_shared && !shared_too) shared_expert(s, L, n);
            be->add(c, s->x, s->acc, (int64_t)n * h);
            return 0;
        }
    }
    for (int32_t q = 0; q < num_distinct; q++) {
        const int32_t e = s->distinct[s->corder[q]], ce = s->count[e];
        const int32_t *sl = s->slots + (int64_t)e * cap;
        fmoe__mlp w;
        expert_home home;
        void *fence;
        FMOE_FORWARD_IF_ERROR(expert_weights(s, L, e, &w, &home, &fence));
        for (int32_t r = 0; r < ce; r++) {
            s->rows_h[r] = sl[r] / K;
            s->scale_h[r] = s->topw_h[sl[r]];
        }
        FMOE_FORWARD_IF_ERROR(run_expert(s, &w, home, fence, ce));
        if (s->opt.on_expert_done) s->opt.on_expert_done(s->opt.route_ctx, l, e);
    }
    if (L->has_shared) shared_expert(s, L, n);
    be->add(c, s->x, s->acc, (int64_t)n * h);
    return 0;
}

/* Embeddings (traced as the semantic rows) and RoPE tables of every segment's rows.
 * Dynamic NTK and longrope depend on the length of a sequence's whole call, as
 * transformers computes it from the call's largest position: each segment's session keeps
 * its own inv_freq.
 * @return 0 or the backend's error. */
static int embed_and_rope(fmoe_session *s, const segment *sg, int32_t count, int32_t n) {
    const fmoe_model *m = s->m;
    const fmoe_model_geometry *g = &m->geo;
    const int32_t h = g->hidden_size, half = s->rope_dim / 2;
    for (int32_t i = 0; i < count; i++) {
        const segment *e = &sg[i];
        fmoe_session *q = e->s;
        float *x = s->x + (int64_t)e->row * h;
        s->be->get_rows(s->bctx, &m->embed, e->tokens, e->n, x);
        if (e->tr && e->tr->semantic)
            FMOE_FORWARD_IF_ERROR(s->be->download(s->bctx, e->tr->semantic + (int64_t)e->t0 * h,
                                                  x, (int64_t)e->n * h * 4));
        /* longrope switches factors and mscale once the sequence passes
         * original_max_position_embeddings, and transformers then recomputes the whole
         * cache (PhimoeForCausalLM.prepare_inputs_for_generation): a cache filled below
         * the switch would be stale. Not done yet: such a call is refused; one that starts
         * from an empty cache (or past the switch) is exact. */
        const fmoe__rope *rp = &m->arch.rope;
        FMOE_RETURN_ERROR_IF(rp->type == FMOE__ROPE_LONGROPE && e->pos0 > 0 &&
                                 e->pos0 <= rp->original_max_position &&
                                 q->call_seq_len > rp->original_max_position,
                             FMOE_EUNSUPPORTED,
                             "longrope: the sequence passes original_max_position_embeddings "
                             "(%lld) with %d positions cached below it, which would need the "
                             "cache recomputed (not yet supported); run it in one call",
                             (long long)rp->original_max_position, e->pos0);
        if ((rp->type == FMOE__ROPE_DYNAMIC || rp->type == FMOE__ROPE_LONGROPE) &&
            q->call_seq_len != q->rope_seq_len) {
            fmoe__rope_inv_freq(&m->arch.rope, q->rope_dim, q->call_seq_len, q->inv_freq,
                                &q->rope_scale);
            q->rope_seq_len = q->call_seq_len;
        }
        for (int32_t t = 0; t < e->n; t++)
            for (int32_t j = 0; j < half; j++) {
                const float f = (float)(e->pos0 + t) * q->inv_freq[j];
                const int64_t r = (int64_t)(e->row + t) * half + j;
                s->cos_h[r] = cosf(f) * q->rope_scale;
                s->sin_h[r] = sinf(f) * q->rope_scale;
            }
    }
    const int64_t bytes = (int64_t)n * half * (int64_t)sizeof(float);
    s->be->upload(s->bctx, s->cos, s->cos_h, bytes);
    s->be->upload(s->bctx, s->sin, s->sin_h, bytes);
    return 0;
}

/* The lm head: with all_logits every row of a segment into its logits; else the last row
 * of each segment that wants logits, all such rows in one product. @return 0 or the
 * backend's error. */
/* Rows [0, n) of a host array of width w finite, else the request stops: a NaN or
 * infinity there comes from a weight the load does not read (a routed expert's,
 * model_impl.h's fmoe__model_check_finite). Every command's logits are checked here, once
 * on the host (V floats a row, beside the head's V x h product); on a host-memory backend
 * the head's input xn too, since with 8-bit activations the head would quantise a NaN
 * into finite garbage logits, text with exit 0. */
static int rows_finite(const float *v, int32_t n, int64_t w, const char *what) {
    for (int64_t i = 0; i < (int64_t)n * w; i++)
        FMOE_RETURN_ERROR_IF(!isfinite(v[i]), FMOE_EFORMAT,
                             "%s is not finite (%g at element %lld of row %lld): a routed "
                             "expert's weights (not checked at load) hold NaN or infinite "
                             "values",
                             what, (double)v[i], (long long)(i % w), (long long)(i / w));
    return 0;
}

static int head_input_finite(const fmoe_session *s, const float *xn, int32_t n, int32_t h) {
    return s->be->host_memory ? rows_finite(xn, n, h, "the hidden state entering the LM head")
                              : 0;
}

static int lm_head(fmoe_session *s, const segment *sg, int32_t count) {
    const fmoe__backend_ops *be = s->be;
    void *c = s->bctx;
    const fmoe_model *m = s->m;
    const fmoe_model_geometry *g = &m->geo;
    const int32_t h = g->hidden_size;
    const int64_t V = g->vocab_size;
    if (s->opt.all_logits) {
        for (int32_t i = 0; i < count; i++) {
            const segment *e = &sg[i];
            if (!e->logits) continue;
            norm_rows(s, s->xn, s->x + (int64_t)e->row * h, m->final_norm, m->final_norm_b,
                      e->n);
            FMOE_FORWARD_IF_ERROR(head_input_finite(s, s->xn, e->n, h));
            float *dst = e->logits + (int64_t)e->t0 * V;
            if (be->host_memory) {
                be->matmul(c, &m->lm_head, s->xn, e->n, dst);
                if (m->lm_head_b) be->add_bias(c, dst, m->lm_head_b, e->n, V);
            } else {
                be->matmul(c, &m->lm_head, s->xn, e->n, s->lbuf);
                if (m->lm_head_b) be->add_bias(c, s->lbuf, m->lm_head_b, e->n, V);
                FMOE_FORWARD_IF_ERROR(be->download(c, dst, s->lbuf, (int64_t)e->n * V * 4));
            }
            FMOE_FORWARD_IF_ERROR(rows_finite(dst, e->n, V, "the logits"));
        }
        return 0;
    }
    int32_t rows = 0;
    float *only = NULL; /* one row: straight into its logits on a host-memory backend */
    for (int32_t i = 0; i < count; i++) {
        const segment *e = &sg[i];
        if (!e->logits) continue;
        norm_rows(s, s->xn + (int64_t)rows * h, s->x + (int64_t)(e->row + e->n - 1) * h,
                  m->final_norm, m->final_norm_b, 1);
        only = e->logits;
        rows++;
    }
    if (rows == 0) return 0;
    FMOE_FORWARD_IF_ERROR(head_input_finite(s, s->xn, rows, h));
    const int direct = rows == 1 && be->host_memory;
    be->matmul(c, &m->lm_head, s->xn, rows, direct ? only : s->lbuf);
    if (m->lm_head_b) be->add_bias(c, direct ? only : s->lbuf, m->lm_head_b, rows, V);
    if (direct) return rows_finite(only, 1, V, "the logits");
    rows = 0;
    for (int32_t i = 0; i < count; i++)
        if (sg[i].logits) {
            FMOE_FORWARD_IF_ERROR(
                be->download(c, sg[i].logits, s->lbuf + (int64_t)rows++ * V, V * 4));
            FMOE_FORWARD_IF_ERROR(rows_finite(sg[i].logits, 1, V, "the logits"));
        }
    return 0;
}

/* One forward pass over segments sg[0..count) of n rows in all (n <= max_batch), in the
 * buffers of `s` with its hooks. Advances each segment's session by its rows. */
static int forward_pass(fmoe_session *s, const segment *sg, int32_t count, int32_t n) {
    const fmoe_model *m = s->m;
    const fmoe_model_geometry *g = &m->geo;
    const int32_t h = g->hidden_size;
    const fmoe__backend_ops *be = s->be;
    void *c = s->bctx;
    int timed = 0;
    for (int32_t i = 0; i < count; i++) timed |= sg[i].tr && sg[i].tr->layer_seconds;

    routing_views(s, n);
    FMOE_FORWARD_IF_ERROR(embed_and_rope(s, sg, count, n));
    /* Layer times come from timer marks (mark li at layer li's start, li + 1 at its end)
     * read after the pass's last sync: no wait per layer, so a device backend keeps its
     * queue full while timing. On the CPU a mark is the host clock, read where it always
     * was (its ops have run when they return). On a device it is the moment the device
     * reaches that point of its queue, so a layer's time runs from the end of the work
     * before it to the end of its own, waits inside it included (for the routing
     * download, for launches once the device has caught up with the host). */
    if (timed) be->mark(c, 0);
    for (int32_t li = 0; li < g->num_hidden_layers; li++) {
        const fmoe__layer *L = &m->layers[li];
        attention_block(s, li, sg, count, n);
        norm_rows(s, s->xn, s->x, L->ffn_norm, L->ffn_norm_b, n);
        if (L->moe_index >= 0) {
            FMOE_FORWARD_IF_ERROR(moe_block(s, L, sg, count, n));
        } else {
            run_mlp(s, &L->shared, s->xn, n, s->acc);
            s->be->add(s->bctx, s->x, s->acc, (int64_t)n * h);
        }
        if (timed) be->mark(c, li + 1);
    }
    FMOE_FORWARD_IF_ERROR(lm_head(s, sg, count));
    /* Everything queued is done before positions move: an item's cache may next be
     * used by another session's context (a batch's runner, or itself alone). */
    FMOE_FORWARD_IF_ERROR(be->sync(c));
    /* A batch's layer is one computation: each item is charged all of it. */
    for (int32_t li = 0; timed && li < g->num_hidden_layers; li++) {
        double took = 0;
        FMOE_FORWARD_IF_ERROR(be->elapsed(c, li, li + 1, &took));
        for (int32_t i = 0; i < count; i++)
            if (sg[i].tr && sg[i].tr->layer_seconds) sg[i].tr->layer_seconds[li] += took;
    }
    for (int32_t i = 0; i < count; i++) sg[i].s->pos += sg[i].n;
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
    FMOE_RETURN_ERROR_IF(q->be != r->be, FMOE_EINVAL,
                         "item %d: a session on the %s backend, the runner's is %s", i,
                         q->be->name, r->be->name);
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
