/*
 * model_impl.h - internals shared by runtime/model and runtime/cpu: the model's three
 * kinds of state (config, borrowed views and owned state, kept in separate structs so
 * that ownership is plain) and the backend function table.
 *
 *   fmoe__arch     config: what the forward pass needs beyond fmoe_model_geometry
 *                  (immutable after load)
 *   fmoe__layer    borrowed views of one decoder layer's weights (into the mmap)
 *   fmoe_session   owned run state (forward.c), allocated once at init
 */
#ifndef FMOE_MODEL_IMPL_H
#define FMOE_MODEL_IMPL_H

#include <stdint.h>

#include "fmoe/geometry.h"
#include "fmoe/model.h"
#include "fmoe/quant.h"
#include "fmoe/safetensors.h"

/* ---------------------------------------------------------------------------------- */
/* Config                                                                             */
/* ---------------------------------------------------------------------------------- */

typedef enum fmoe__rope_type {
    FMOE__ROPE_DEFAULT = 0,
    FMOE__ROPE_LINEAR = 1,  /* positions divided by factor */
    FMOE__ROPE_DYNAMIC = 2, /* NTK: base grows once the sequence passes max_position */
    FMOE__ROPE_YARN = 3,
    FMOE__ROPE_LLAMA3 = 4,
    FMOE__ROPE_LONGROPE = 5, /* Phi-3.5-MoE ("su"): per-frequency factors, short or long */
    FMOE__ROPE_FACTORS = 6,  /* a GGUF file's rope_freqs (llama.cpp's llama3 scaling):
                                frequency i divided by short_factor[i] (family_llama4.c) */
} fmoe__rope_type;

/* Most frequencies (head_dim / 2) a longrope config may list factors for. */
#define FMOE__ROPE_MAX_FACTORS 256

typedef enum fmoe__qk_norm {
    FMOE__QK_NORM_NONE = 0,
    FMOE__QK_NORM_HEAD = 1, /* Qwen3-MoE: RMSNorm over each head's D values */
    FMOE__QK_NORM_FULL = 2, /* OLMoE: RMSNorm over the whole q (Hq·D) and k (Hkv·D) */
} fmoe__qk_norm;

typedef struct fmoe__rope {
    fmoe__rope_type type;
    double theta;
    double factor;
    int64_t original_max_position; /* yarn, llama3; dynamic uses max_position_embeddings */
    int64_t max_position;           /* max_position_embeddings */
    double low_freq_factor, high_freq_factor; /* llama3 */
    double beta_fast, beta_slow;              /* yarn */
    double attention_factor;                  /* yarn: cos/sin scale (1 otherwise) */
    int truncate;                             /* yarn */
    /* longrope: frequency i divided by short_factor[i] while the call's sequence length is
     * at most original_max_position, else by long_factor[i]; cos/sin scaled by
     * short_mscale or long_mscale alike */
    double short_factor[FMOE__ROPE_MAX_FACTORS], long_factor[FMOE__ROPE_MAX_FACTORS];
    double short_mscale, long_mscale;
} fmoe__rope;

typedef struct fmoe__arch {
    int32_t attn_bias_qkv;   /* q/k/v projections carry biases */
    int32_t attn_bias_o;     /* o projection carries a bias */
    fmoe__qk_norm qk_norm;
    float clip_qkv;          /* OLMoE: clamp q, k, v to [-c, c] (0: off) */
    int32_t *sliding_window; /* [num_hidden_layers] window in tokens, 0 = full attention */
    fmoe__rope rope;
    int32_t shared_gate;     /* Qwen2-MoE: shared expert scaled by sigmoid(x·w) */
    float route_norm_eps;    /* added to the top-k sum when renormalising (DeepSeek 1e-20) */
    char rope_desc[64];
    /* DeepSeek-V2/V3 (mla.c): multi-head latent attention. The rope above is over the
     * qk_rope_head_dim decoupled dims only. */
    int32_t mla;             /* the layers' attention is MLA */
    int32_t rope_interleave; /* q_pe/k_pe dims come as adjacent pairs (transformers
                                permutes them to halves before rotate_half) */
    float mla_scale;         /* softmax scale: 1/sqrt(qk_nope + qk_rope), times yarn's
                                mscale(factor, mscale_all_dim)² when configured */
    int32_t route_norm;      /* renormalise the top k: norm_topk_prob, except DeepSeek-V2
                                (transformers' deepseek_v2 never does) */
    /* Grouped routing (DeepSeek-V2 group_limited_greedy, V3 noaux_tc). */
    int32_t route_group_top2; /* a group's score: the sum of its two best (V3), else its best */
    /* Phi-3.5-MoE */
    int32_t layernorm;       /* LayerNorm with weight and bias (every norm), not RMSNorm */
    int32_t lm_head_bias;    /* lm_head carries a bias */
    int32_t sparsemixer;     /* sparsemixer top-2 routing (fmoe_route_row_grouped) */
    float jitter_eps;        /* its router_jitter_noise */
    /* gpt-oss (family_gptoss.c) */
    int32_t attn_sinks;      /* a learned sink logit per head in the attention softmax */
    float glu_alpha, glu_limit; /* experts' clamped SwiGLU (swiglu_alpha, swiglu_limit) */
    /* GLM-4.5 (glm4_moe): partial rotary embedding. */
    int32_t rope_dim;        /* dims rotated per GQA head, head_dim · partial_rotary_factor:
                                the first rope_dim of each head, as halves (transformers'
                                apply_rotary_pos_emb on q[..., :rotary_dim]); the rest pass
                                through. MLA: qk_rope_head_dim; others: head_dim. */
    /* Llama 4 (family_llama4.c); the arrays are NULL for the other families. */
    int32_t *layer_nope;     /* [num_hidden_layers] 1: no rotary embedding (NoPE), full
                                causal attention, temperature-tuned queries */
    int32_t *attn_chunk;     /* [num_hidden_layers] chunked attention over chunks of this
                                many positions (attention_chunk_size), 0: none */
    float attn_temp_scale;   /* NoPE queries scaled by 1 + attn_scale · log1p(floor((pos +
                                1) / floor_scale)); 0: no tuning */
    float attn_floor_scale;
    int32_t scale_expert_input; /* a routed expert's weight multiplies its input, not its
                                   output (Llama4TextMoe) */
} fmoe__arch;

/*
 * Where a backend keeps its own copy of one model's weights (the CUDA backend: device
 * copies keyed by host address), shared by every context of that model (a server's
 * sessions, the offload executor's), so the weights are copied once per process. It lives
 * in the model (struct fmoe_model) and starts zeroed; a backend creates `cache` on first
 * use under its own lock and sets `cache_free`, which fmoe_model_free calls.
 */
typedef struct fmoe__weight_home {
    void *cache;
    void (*cache_free)(void *cache);
} fmoe__weight_home;

/* ---------------------------------------------------------------------------------- */
/* Weights: borrowed views                                                            */
/* ---------------------------------------------------------------------------------- */

/* A row-major matrix [rows][cols] in the checkpoint's dtype (F32, F16 or BF16), or, from a
 * GGUF file, rows of ggml blocks (quant set; fmoe/quant.h). Its bytes: fmoe__mat_bytes. */
typedef struct fmoe__mat {
    const void *data;
    fmoe_st_dtype dtype; /* FMOE_ST_U8 when quant is set: the bytes are blocks */
    int64_t rows, cols;
    uint32_t quant;      /* 0, or the ggml block type of every row (fmoe_quant_supported) */
    const char *file;    /* the file the bytes come from, and their offset in it (a */
    int64_t file_offset; /* realigned copy keeps its source's): what a file tier reads */
    int32_t on_backend;  /* data is the backend's memory (a GPU expert slot), not host */
} fmoe__mat;

/* A SwiGLU MLP: down(silu(gate(x)) * up(x)); gpt-oss's experts add biases and clamp
 * (fmoe_swiglu_clamped when glu_limit > 0). An executor's copy of an expert replaces the
 * three matrices only: the biases are small and stay the model's. */
typedef struct fmoe__mlp {
    fmoe__mat gate; /* [I][h] */
    fmoe__mat up;   /* [I][h] */
    fmoe__mat down; /* [h][I] */
    const float *gate_b, *up_b, *down_b; /* [I], [I], [h] (gpt-oss), or NULL */
    float glu_alpha, glu_limit;          /* gpt-oss's clamped SwiGLU; limit 0: plain */
} fmoe__mlp;

typedef struct fmoe__layer {
    const float *attn_norm;   /* [h] f32 (converted at load) */
    const float *ffn_norm;    /* [h] */
    const float *attn_norm_b, *ffn_norm_b; /* [h] LayerNorm biases (arch.layernorm), or NULL */
    fmoe__mat wq;             /* [Hq·D][h] */
    fmoe__mat wk;             /* [Hkv·D][h] */
    fmoe__mat wv;             /* [Hkv·D][h] */
    fmoe__mat wo;             /* [h][Hq·D] */
    const float *bq, *bk, *bv, *bo; /* [Hq·D], [Hkv·D], [Hkv·D], [h] or NULL */
    const float *q_norm;      /* [D] (head) or [Hq·D] (full), or NULL */
    const float *k_norm;      /* [D] or [Hkv·D], or NULL */
    int32_t moe_index;        /* l of this layer, or -1 for a dense layer */
    fmoe__mat router;         /* [J][h] (MoE layers) */
    fmoe__mlp *experts;       /* [J] routed experts (MoE layers) */
    fmoe__mlp shared;         /* shared expert(s) of MoE layers; the MLP of dense layers */
    int32_t has_shared;       /* MoE layer with a shared expert */
    fmoe__mat shared_gate;    /* [1][h] (Qwen2-MoE) */
    const float *route_bias;  /* [J] DeepSeek-V3's e_score_correction_bias, or NULL */
    const float *router_b;    /* [J] gpt-oss: bias added to the router logits, or NULL */
    const float *sinks;       /* [Hq] gpt-oss: each head's attention sink logit, or NULL */
    /* Multi-head latent attention (DeepSeek-V2/V3; mla.c), H heads, ranks r_q and r_kv,
     * per head dn (nope) + dr (rope) query/key dims and dv value dims. wq above is the
     * full-rank q_proj [H(dn+dr)][h] when q_lora_rank is 0 (V2-Lite). */
    fmoe__mat wq_a;           /* [r_q][h] q_a_proj */
    const float *q_a_norm;    /* [r_q] */
    fmoe__mat wq_b;           /* [H(dn+dr)][r_q] q_b_proj */
    fmoe__mat wkv_a;          /* [r_kv + dr][h] kv_a_proj_with_mqa */
    const float *kv_a_norm;   /* [r_kv] */
    fmoe__mat wkv_b;          /* [H(dn+dv)][r_kv] kv_b_proj: per head dn key rows, dv value
                                 rows */
} fmoe__layer;

/* Bytes of one row of a matrix stored as (dtype, quant), and of `rows` rows. */
static inline int64_t fmoe__row_bytes(fmoe_st_dtype dtype, uint32_t quant, int64_t cols) {
    return quant ? fmoe_quant_row_bytes(quant, cols) : cols * fmoe_st_dtype_size(dtype);
}
static inline int64_t fmoe__mat_bytes(const fmoe__mat *w) {
    return w->rows * fmoe__row_bytes(w->dtype, w->quant, w->cols);
}

struct fmoe_gguf;

struct fmoe_model {
    fmoe_model_geometry geo;
    fmoe__arch arch;
    fmoe_safetensors *st;     /* a HuggingFace directory's checkpoint, or NULL */
    struct fmoe_gguf *gguf;   /* a GGUF file, or NULL (exactly one of the two is open) */
    char gguf_arch[32];       /* the GGUF file's general.architecture */
    uint32_t quant;           /* a ggml block type some matrix uses (the routed experts'
                                 first), or 0: what a device backend must refuse */
    char *dir;
    char *config_json;
    char describe[256];
    fmoe__mat embed;          /* [V][h] */
    const float *final_norm;  /* [h] */
    const float *final_norm_b; /* [h] LayerNorm bias (arch.layernorm), or NULL */
    fmoe__mat lm_head;        /* [V][h] (the embedding when tied) */
    const float *lm_head_b;   /* [V] (arch.lm_head_bias), or NULL */
    fmoe__layer *layers;      /* [num_hidden_layers] */
    fmoe__mlp *expert_pool;   /* [L·J] storage for the layers' expert arrays */
    int64_t *layer_expert_bytes; /* [L] one routed expert of each MoE layer, as stored
                                    (fmoe_model_layer_expert_bytes) */
    void **owned;             /* converted vectors and realigned matrices */
    int32_t num_owned, cap_owned;
    fmoe__weight_home backend_weights; /* a device backend's copies (mutable cache) */
};

/* Adds p (malloc'ed) to the allocations the model frees. @return 0 or FMOE_ENOMEM (p is
 * then not kept: the caller frees it). */
int fmoe__model_keep_owned(fmoe_model *m, void *p);
/* Every resident (non-expert) weight finite (resident.c), as fmoe_model_load requires.
 * @return 0 or FMOE_EFORMAT naming the weight, row and column. */
int fmoe__model_check_finite(fmoe_model *m);

/* FMOE_EUNSUPPORTED, in one line naming the first tensor and its type, where `backend` has
 * no kernels for a block type the GGUF model holds, or naming the family where it has no
 * kernels for its attention (MLA on CUDA); else 0 (backend_types.c). */
int fmoe__model_check_backend_types(const fmoe_model *m, fmoe_backend_kind backend);

/* Fills m->layer_expert_bytes once the experts are bound (parts.c). @return 0 or
 * FMOE_ENOMEM. */
int fmoe__model_count_expert_bytes(fmoe_model *m);

/* Parses the architecture details of config.json text for a geometry already parsed
 * from it (config.c). @return 0, FMOE_EFORMAT, FMOE_EUNSUPPORTED. */
int fmoe__arch_parse(const char *json, size_t len, const fmoe_model_geometry *g,
                     fmoe__arch *out);
void fmoe__arch_free(fmoe__arch *a);

/*
 * The inverse frequencies [D/2] of the rope for a sequence of `seq_len` positions (only
 * dynamic NTK depends on it) and the cos/sin scale (yarn's attention factor, else 1).
 * Computed in double, stored as float (transformers computes them in float32).
 */
void fmoe__rope_inv_freq(const fmoe__rope *r, int32_t head_dim, int64_t seq_len,
                         float *inv_freq, float *scale);

/* ---------------------------------------------------------------------------------- */
/* Backends                                                                           */
/* ---------------------------------------------------------------------------------- */

/* One attention call: n query tokens at positions pos0.., against the cache of a layer.
 * Every pointer is a backend buffer. */
typedef struct fmoe__attn_args {
    const float *q;        /* [n][Hq·D] after RoPE */
    const float *k_cache;  /* [max_context][Hkv·D] of this layer */
    const float *v_cache;  /* [max_context][Hkv·D] */
    float *out;            /* [n][Hq·D] */
    int32_t n, pos0;
    int32_t n_heads, n_kv_heads, head_dim;
    int32_t window;        /* 0: full causal attention; else keys j > pos - window */
    float scale;           /* 1/sqrt(D) */
    const float *sinks;    /* [n_heads] sink logits (gpt-oss; a model vector), or NULL */
} fmoe__attn_args;

/* One router call over n rows of logits [n][J] (fmoe_route_row's arguments). */
typedef struct fmoe__route_args {
    int32_t n, num_experts, top_k;
    int32_t sigmoid;       /* sigmoid scoring (DeepSeek-V3 style), else softmax */
    int32_t norm;          /* renormalise the top k to sum 1 */
    float norm_eps, scale; /* route_norm_eps, routed_scaling_factor */
    /* DeepSeek-V2/V3 selection (fmoe_route_row_grouped); n_group <= 1 and no bias: plain
     * top-k. The CUDA backend has none of it (the family is refused there). */
    int32_t n_group, topk_group;
    int32_t group_top2;    /* group score: sum of its two best (V3), else its best (V2) */
    const float *bias;     /* [J] model vector added to the scores for selection only, or
                              NULL */
    float *choice;         /* [n][J] backend scratch for the biased, masked scores */
    /* Phi-3.5-MoE's sparsemixer top-k (fmoe_route_row_grouped); the CUDA backend has none
     * of it (the family is refused there). */
    int32_t sparsemixer;
    float jitter_eps;      /* router_jitter_noise */
} fmoe__route_args;

/* One multi-head latent attention call (mla.c has the maths): n query tokens of one
 * sequence at positions pos0.., against its layer's latent cache. Every pointer but wkv_b
 * (the model's) is a backend buffer. */
typedef struct fmoe__mla_args {
    float *q;              /* [n][H][dn + dr]: the rope part is rotated in place */
    float *kv;             /* [n][r_kv + dr]: normalised latent, then k_pe (rotated in
                              place) */
    const float *cos, *sin; /* [n][dr/2] */
    float *cache;          /* [max_context][r_kv + dr]: the rows of kv land at pos0.. */
    const fmoe__mat *wkv_b; /* [H(dn+dv)][r_kv] */
    float *out;            /* [n][H·dv] */
    float *scratch;        /* scratch_slots slots of fmoe__mla_scratch_floats(.., max_context,
                              max_batch) floats each: one per thread that runs heads */
    int32_t scratch_slots, max_context, max_batch;
    int32_t n, pos0, n_heads, nope, rope, v_dim, rank;
    int32_t interleave;    /* the rope dims come as adjacent pairs */
    float scale;
} fmoe__mla_args;

/* Floats of scratch one thread of an MLA call needs for a context of max_context positions
 * and max_batch query rows. */
static inline int64_t fmoe__mla_scratch_floats(int64_t nope, int64_t v_dim, int64_t rank,
                                               int64_t max_context, int64_t max_batch) {
    return (nope + v_dim) * rank + 2 * max_batch * rank + max_context + 64;
}

typedef struct fmoe__backend_limits {
    fmoe__weight_home *weights; /* the model's (never NULL from a session) */
    int32_t threads;     /* 0: all cores (host threads of the CPU backend) */
    int64_t max_cols;    /* widest matrix (columns) the model multiplies by */
    int32_t max_batch;   /* most rows of x in one call */
    int32_t max_context; /* KV positions */
    int32_t max_experts; /* most rows an index list (gather/scatter) holds: max_batch·top_k */
    fmoe_activations activations; /* the CPU backend's inputs for block-format weights
                                     (fmoe_session_options.activations); the CUDA backend
                                     is never given Q8: fmoe_session_init refuses it */
    int32_t max_marks;   /* timer slots of mark/elapsed (a session: decoder layers + 1) */
} fmoe__backend_limits;

/*
 * The compute a forward pass asks of a backend (a function table, so that core code never
 * includes CUDA headers), in the shape of ggml-backend: the backend owns its buffers
 * (alloc/release), activations, the KV cache and the run state stay in them for the whole
 * pass, and forward.c performs every operation through this table, so model code has no
 * #ifdef and no per-device branch.
 *
 * Pointers. "buffer" arguments (float *y, const float *x, ...) point into memory from
 * `alloc` (offsets into it allowed). Weights are the model's: fmoe__mat views (in the
 * checkpoint's dtype; `on_backend` says the data is already backend memory, e.g. a GPU
 * expert slot) and f32 vectors such as norm weights and biases (`const float *w`, host
 * memory owned by the model, alive as long as it is): the backend maps them to its own
 * copy on first use, keyed by address (the CPU backend uses them in place). Arguments
 * named *_host are host arrays read during the call only (the caller may reuse them as
 * soon as it returns).
 *
 * Ordering. Operations run in the order issued, each seeing the results of those before
 * it; a backend may queue them (CUDA: one compute stream) and return early. `download`
 * and `sync` wait for everything issued before them. A failure inside a queued op (a
 * device fault) is sticky: the next download or sync returns it, with a detail.
 *
 * host_memory: 1 when buffers are ordinary host memory (the CPU backend), so the pass may
 * read a buffer in place instead of downloading it; the results are the same either way.
 *
 * Host waits. On a device backend every download and sync stops the host until the device
 * has caught up, and the device then idles while the host issues the next ops: on a small
 * model a decode step is bound by these round trips, not by compute. So the pass waits
 * only where the host must read a result, and asks each wait to bring all it needs. Per
 * forward pass (docs/gpu.md "Known gaps" counts them for a decode step):
 *   - one download per MoE layer: the layer's routing, laid out in one buffer
 *     (fmoe__routing_layout) so that the chosen experts, their weights and whatever a hook
 *     or trace reads (probabilities, gate inputs, speculative rows) come in one copy. The
 *     host needs the experts to group tokens and to drive the executor;
 *   - one download per expert computed on the host lane. An expert computed from a
 *     device slot is not waited for: its slot's fence is recorded after it (fence_record),
 *     and the executor's copy into the slot waits for that on the device (fence_wait);
 *   - the trace's semantic rows (one download per segment that records them), the logits
 *     (one per segment that wants them, or one per segment with all_logits), and one sync
 *     at the end, before positions move.
 * Nothing else waits: per-layer timing reads stream-ordered marks (mark/elapsed) after the
 * pass's last sync instead of syncing each layer. Uploads of host arrays (index lists,
 * RoPE tables, token ids) are queued copies, not waits the pass asks for; from pageable
 * memory the CUDA driver stages them and may wait to do so.
 */
typedef struct fmoe__backend_ops {
    const char *name;
    int32_t host_memory;
    /* Creates the backend's context and its scratch for the limits given.
     * @return 0, FMOE_ENOMEM (how much was asked and is free), FMOE_EUNSUPPORTED. */
    int (*init)(const fmoe__backend_limits *limits, void **ctx);
    void (*free)(void *ctx);
    /* A zero-filled buffer of `bytes`, or NULL with the error detail set (asked, free). */
    void *(*alloc)(void *ctx, int64_t bytes);
    void (*release)(void *ctx, void *p);

    /* ---- transfers ---- */
    void (*upload)(void *ctx, void *dst, const void *src_host, int64_t bytes);
    /* Waits for every op issued before it. @return 0 or the sticky error. */
    int (*download)(void *ctx, void *dst_host, const void *src, int64_t bytes);
    void (*copy)(void *ctx, void *dst, const void *src, int64_t bytes);
    void (*zero)(void *ctx, void *dst, int64_t bytes);
    /* Waits for every op issued. @return 0 or the sticky error. */
    int (*sync)(void *ctx);

    /* ---- timers ---- */
    /* Records timer slot `slot` (< limits.max_marks) at this point of the op order: the
     * time the backend reaches it (CUDA: an event on the compute stream; CPU, whose ops
     * have all run when they return: the host's monotonic clock now). No wait. A slot
     * outside [0, max_marks) records nothing. Marking a slot again moves it. */
    void (*mark)(void *ctx, int32_t slot);
    /* *seconds = the time from mark `a` to mark `b`, both recorded, read after a sync or
     * download issued after both. @return 0, FMOE_EINVAL (a slot out of range or never
     * marked, or a mark not yet reached: read before the wait), or the sticky error. */
    int (*elapsed)(void *ctx, int32_t a, int32_t b, double *seconds);

    /* ---- compute ---- */
    /* y[i][w.cols] = row rows_host[i] of w (the embedding) as f32, i < n. */
    void (*get_rows)(void *ctx, const fmoe__mat *w, const int32_t *rows_host, int32_t n,
                     float *y);
    /* y[r] = fmoe_rmsnorm_row(x[r], w) for r < rows, rows of `dim` values (y may be x). */
    void (*rmsnorm)(void *ctx, float *y, const float *x, const float *w, int64_t rows,
                    int32_t dim, float eps);
    /* y[n][w.rows] = x[n][w.cols] · wᵀ (x rows contiguous with stride w.cols). */
    void (*matmul)(void *ctx, const fmoe__mat *w, const float *x, int32_t n, float *y);
    /* y[t][i] += b[i], t < n, i < d (b: a model vector). */
    void (*add_bias)(void *ctx, float *y, const float *b, int32_t n, int64_t d);
    /* y[i] = clamp(y[i], -c, c), i < count. */
    void (*clamp)(void *ctx, float *y, int64_t count, float c);
    /* fmoe_rope_head on each of `heads` heads of x[t] (stride heads·head_dim), with the
     * row's tables cos[t][D/2], sin[t][D/2] (buffers), t < n. */
    void (*rope)(void *ctx, float *x, int32_t n, int32_t heads, int32_t head_dim,
                 const float *cos, const float *sin);
    /* Causal (optionally sliding-window) grouped-query attention. */
    void (*attention)(void *ctx, const fmoe__attn_args *a);
    /* fmoe_route_row over each of a->n rows of logits[n][J]: probs[n][J], topk[n][K],
     * topw[n][K]. */
    void (*route)(void *ctx, const fmoe__route_args *a, const float *logits, float *probs,
                  int32_t *topk, float *topw);
    /* Gate probabilities of n rows: y[t·y_stride + j] = softmax(x[t])[j] (or sigmoid),
     * j < J (the speculative rows of record and the predictors). */
    void (*probs)(void *ctx, float *y, int64_t y_stride, const float *x, int32_t n,
                  int32_t num_experts, int32_t sigmoid);
    /* g[i] = fmoe_swiglu(g[i], u[i]), i < count. */
    void (*swiglu)(void *ctx, float *g, const float *u, int64_t count);
    /* dst[i][dim] = src[rows_host[i]][dim], i < n (the tokens routed to one expert). */
    void (*gather_rows)(void *ctx, float *dst, const float *src, const int32_t *rows_host,
                        int32_t n, int32_t dim);
    /* acc[rows_host[i]][dim] += scale_host[i] · src[i][dim], i < n; rows_host distinct. */
    void (*scatter_add)(void *ctx, float *acc, const float *src, const int32_t *rows_host,
                        const float *scale_host, int32_t n, int32_t dim);
    /* y[i] += x[i], i < count (residual adds). */
    void (*add)(void *ctx, float *y, const float *x, int64_t count);
    /* y[t][i] += fmoe_sigmoid(gate[t]) · x[t][i], t < n, i < dim (Qwen2-MoE's gated
     * shared expert; gate: a buffer of n logits). */
    void (*add_gated)(void *ctx, float *y, const float *x, const float *gate, int32_t n,
                      int32_t dim);

    /* ---- expert slots (live offloading, runtime/offload) ----
     * The executor's I/O thread fills slots from a context of its own (same backend,
     * same device), while the session's context computes from them. */
    /* Copies host bytes into a buffer on the backend's copy stream, from any thread, and
     * returns once they have landed. From memory pinned with host_register the copy runs
     * at the link's full rate. @return 0 or FMOE_EINTERNAL (detail set). */
    int (*write_slot)(void *ctx, void *dst, const void *src_host, int64_t bytes);
    /* Pins host memory for copies (cudaHostRegister); a no-op returning 0 on the CPU.
     * @return 0 or FMOE_ENOMEM/FMOE_EINTERNAL. */
    int (*host_register)(void *ctx, void *p, int64_t bytes);
    void (*host_unregister)(void *ctx, void *p);

    /* ---- slot fences: one per slot, so that a write waits only for its slot's reads ----
     * A fence marks a point in one context's op order, for a copy stream of another
     * context (same backend, same device) to wait for: the session's compute records the
     * slot's fence after the ops that read the slot (fence_record), the executor's I/O
     * thread makes its copy stream wait for the latest record before rewriting the slot
     * (fence_wait, then write_slot). Neither blocks the host. The two calls are ordered by
     * the caller (the executor's lock): a wait covers the records issued before it in host
     * order, and a record issued after it is not waited for. A wait on a fence never
     * recorded waits for nothing. A backend whose ops have all run when they return
     * (host_memory: the CPU) needs no fence: its entries do nothing and fence_new returns
     * a placeholder, so callers may call them on any table. */
    /* A fence of context ctx, usable by every context of the backend; NULL when the
     * backend is out of resources (detail set: the caller's FMOE_ENOMEM). */
    void *(*fence_new)(void *ctx);
    /* Frees a fence (NULL: nothing) before ctx is freed; a record or wait still queued
     * on a stream completes first. */
    void (*fence_free)(void *ctx, void *fence);
    /* Records `fence` on ctx's compute stream: it is reached once every op issued on ctx
     * before it has run. No host wait. @return 0 or ctx's sticky error. */
    int (*fence_record)(void *ctx, void *fence);
    /* Makes ctx's copy stream (write_slot's) wait until the fence's latest record, as
     * issued before this call, is reached. No host wait; any thread, like write_slot.
     * @return 0 or FMOE_EINTERNAL (detail set; not sticky, as write_slot). */
    int (*fence_wait)(void *ctx, void *fence);

    /* ---- added later: NULL in a backend without it (CUDA this round) ---- */
    /* Multi-head latent attention (DeepSeek-V2/V3): rotates the rope dims of q and kv,
     * appends kv's rows to the latent cache and attends in the absorbed form (mla.c). A
     * session refuses an MLA model on a backend where this is NULL. */
    void (*mla_attention)(void *ctx, const fmoe__mla_args *a);
    /* y[r] = fmoe_layernorm_row(x[r], w, b) for r < rows (Phi-3.5-MoE; y may be x). A
     * session refuses a LayerNorm model on a backend where this is NULL. */
    void (*layernorm)(void *ctx, float *y, const float *x, const float *w, const float *b,
                      int64_t rows, int32_t dim, float eps);
    /* g[i] = fmoe_swiglu_clamped(g[i], u[i], alpha, limit), i < count (gpt-oss's experts),
     * with attention sinks (fmoe__attn_args.sinks) honoured by `attention`. A session
     * refuses a gpt-oss model on a backend where this is NULL. */
    void (*swiglu_clamped)(void *ctx, float *g, const float *u, int64_t count, float alpha,
                           float limit);
    /* rope with only the first rot_dim of each head_dim-wide head rotated (fmoe_rope_head
     * over rot_dim, tables cos/sin [n][rot_dim/2]), the rest left as they are (GLM-4.5's
     * partial rotary). A session refuses such a model on a backend where this is NULL. */
    void (*rope_partial)(void *ctx, float *x, int32_t n, int32_t heads, int32_t head_dim,
                         int32_t rot_dim, const float *cos, const float *sin);
} fmoe__backend_ops;

extern const fmoe__backend_ops fmoe__cpu_backend;

/* ---------------------------------------------------------------------------------- */
/* Pieces of the forward pass, shared with the calibration bench (backend_bench.c)     */
/* ---------------------------------------------------------------------------------- */
/* forward.c runs these, and `fmoe calibrate` times the same functions, so that the
 * profile's curves measure what a live pass does rather than a copy that may drift. */

/* Issues per timed run of a calibration point on a backend that is not host_memory
 * (backend_bench.c's head comment says why they are bursts). */
#define FMOE__BENCH_DEVICE_BURST 8

/* fmoe_backend_bench_init on the table `be` (fmoe/model.h), for tests that hand it a fake
 * device; `activations` resolved (F32 or Q8). */
int fmoe__backend_bench_init_ops(fmoe_backend_bench **out, const fmoe__backend_ops *be,
                                 const fmoe_backend_bench_shape *shape, int32_t threads,
                                 fmoe_activations activations);

/* One routed expert's buffers: backend ones, and the host index lists its gather and
 * scatter read (uploaded by a device backend with each call). */
typedef struct fmoe__expert_io {
    const float *xn;       /* [B][h] the layer's gate input */
    float *xg;             /* [B][h] the expert's rows of it */
    float *g, *u;          /* [B][I] gate and up projections */
    float *yg;             /* [B][h] the expert's output rows */
    float *acc;            /* [B][h] the layer's weighted sum of expert outputs */
    const int32_t *rows_h; /* [c] host: the expert's token rows (distinct) */
    const float *scale_h;  /* [c] host: their combine weights */
} fmoe__expert_io;

/*
 * The expert `w` over its c tokens on backend `be`: gathers their rows of xn, runs the
 * SwiGLU MLP, adds each output row times its weight to acc. `slot`: w's weights are an
 * executor's slot, which may be overwritten once this returns; on a device backend (not
 * host_memory) the slot's `fence` is then recorded after the expert's ops (the executor's
 * copy into the slot waits for it on the device), or, with no fence, the backend is
 * waited for. @return 0 or the backend's sticky error.
 */
int fmoe__expert_run(const fmoe__backend_ops *be, void *ctx, const fmoe__expert_io *io,
                     const fmoe__mlp *w, int32_t c, int32_t h, int slot, void *fence);

/*
 * A MoE layer's routing in one buffer. What the host reads of a MoE layer, the router's
 * outputs, the gate input and the speculative rows, lies in one backend buffer, so that
 * one download brings whatever the layer's readers want: a download waits for the device,
 * and the host must wait once per layer anyway (it groups tokens by their experts). For a
 * pass of n rows the parts follow each other, each from a FMOE__ROUTING_ALIGN boundary:
 *
 *     xn [n][h] | topk [n][K] | topw [n][K] | probs [n][J] | spec [n][S][J]
 *
 * xn (the gate input) comes first, at offset 0 whatever n, so the same buffer is the
 * pass's normalised rows; then the experts and weights every layer reads; then what only
 * hooks and traces read. A download is one range: from xn or from topk, to the end of the
 * last part wanted (a part between two wanted ones comes along; they are small).
 * The offsets grow with n, so the layout for the most rows sizes the buffer.
 */
#define FMOE__ROUTING_ALIGN 256 /* bytes: cudaMalloc's alignment, and a cache line's */

enum {
    FMOE__ROUTE_XN = 0,    /* float [n][h] */
    FMOE__ROUTE_TOPK = 1,  /* int32 [n][K] */
    FMOE__ROUTE_TOPW = 2,  /* float [n][K] */
    FMOE__ROUTE_PROBS = 3, /* float [n][J] */
    FMOE__ROUTE_SPEC = 4,  /* float [n][S][J] */
    FMOE__ROUTE_PARTS = 5
};

typedef struct fmoe__routing_layout {
    int64_t off[FMOE__ROUTE_PARTS + 1]; /* byte offset of each part; [PARTS]: the end */
} fmoe__routing_layout;

/* The layout of n rows (h hidden, J experts, top K, S speculative rows per row, 0: none). */
static inline fmoe__routing_layout fmoe__routing_layout_of(int64_t n, int64_t h, int64_t J,
                                                           int64_t K, int64_t S) {
    const int64_t bytes[FMOE__ROUTE_PARTS] = {n * h * 4, n * K * 4, n * K * 4, n * J * 4,
                                              n * S * J * 4};
    fmoe__routing_layout l;
    l.off[0] = 0;
    for (int i = 0; i < FMOE__ROUTE_PARTS; i++)
        l.off[i + 1] = l.off[i] + (bytes[i] + FMOE__ROUTING_ALIGN - 1) / FMOE__ROUTING_ALIGN *
                                      FMOE__ROUTING_ALIGN;
    return l;
}

/* Part `part` of a buffer (or its host mirror) laid out by `l`. */
static inline void *fmoe__routing_part(void *base, const fmoe__routing_layout *l, int part) {
    return (char *)base + l->off[part];
}

/* A MoE layer's routing buffer and its host mirror, laid out alike (on a host_memory
 * backend the mirror is the buffer itself). */
typedef struct fmoe__routing_io {
    const void *buf;          /* backend buffer */
    void *host;               /* host mirror */
    fmoe__routing_layout lay; /* for this pass's n rows */
} fmoe__routing_io;

/*
 * The layer's routing to the host, as the pass reads it once per MoE layer: the chosen
 * experts and their weights, and the gate probabilities (`probs`), inputs (`hidden`) and
 * speculative rows (`spec`) when a hook or trace wants them, all in one download, which
 * waits for the backend; a host_memory backend's buffer is read in place (nothing is
 * copied). @return 0 or the backend's sticky error.
 */
int fmoe__routing_to_host(const fmoe__backend_ops *be, void *ctx, const fmoe__routing_io *r,
                          int probs, int hidden, int spec);

/* fmoe_session_init on the backend table `be` instead of the one options->backend names:
 * a test's fake device (a table with host_memory 0 that counts its waits). */
int fmoe__session_init_backend(const fmoe_model *m, const fmoe_session_options *options,
                               const fmoe__backend_ops *be, fmoe_session **out);

/* The CUDA backend's table from libfmoe-cuda.so (cuda_loader.c), loaded on first use;
 * NULL with the error detail set when the module or a device is missing. */
const fmoe__backend_ops *fmoe__cuda_backend(void);

#endif
