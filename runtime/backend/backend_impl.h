/*
 * backend_impl.h - the backend contract: what the forward pass asks of a backend and what
 * runtime/cpu and runtime/cuda implement (internal to runtime/).
 *
 * It is kept apart from runtime/model/model_impl.h (the model's config, layers and run
 * state) as ggml keeps ggml-backend-impl.h apart from its graphs: a backend sees the
 * matrices and vectors it is handed, never the model's structs, so cpu/ and cuda/ include
 * this header only, and model/ and offload/ include it through model_impl.h. The folder
 * holds nothing else but the thread pool that the CPU backend and `fmoe quantize` share
 * (threadpool.h), so no folder of runtime/ includes one that includes it back
 * (docs/design.md §8.1).
 *
 *   fmoe__weight_home   where a backend keeps its copies of one model's weights
 *   fmoe__mat           a weight matrix view, as the ops take it
 *   fmoe__*_args        the arguments of the attention, routing and MLA ops
 *   fmoe__backend_limits, fmoe__backend_ops   the table, its limits and slot fences
 */
#ifndef FMOE_BACKEND_IMPL_H
#define FMOE_BACKEND_IMPL_H

#include <stdint.h>

#include "fmoe/model.h"
#include "fmoe/quant.h"
#include "fmoe/safetensors.h"

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

/* Bytes of one row of a matrix stored as (dtype, quant), and of `rows` rows. */
static inline int64_t fmoe__row_bytes(fmoe_st_dtype dtype, uint32_t quant, int64_t cols) {
    return quant ? fmoe_quant_row_bytes(quant, cols) : cols * fmoe_st_dtype_size(dtype);
}
static inline int64_t fmoe__mat_bytes(const fmoe__mat *w) {
    return w->rows * fmoe__row_bytes(w->dtype, w->quant, w->cols);
}

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

/*
 * One MoE layer's expert sum over n rows of its gate input (the moe_experts op):
 *   acc[row] += scale · mlp_e(xn[row]) for each routed expert e, in the order given, over
 *   the rows routed to it, then acc[t] += shared(xn[t]) for every t < n when shared is set
 * -- what forward.c's loop of gather_rows, matmul, swiglu and scatter_add computes, in the
 * same order. Arrays *_host are host memory read during the call.
 */
typedef struct fmoe__moe_args {
    const float *xn;            /* [n][h] buffer */
    float *acc;                 /* [n][h] buffer: the sums add here */
    int32_t n, h;
    int32_t count;              /* routed experts */
    const fmoe__mlp *experts;   /* [count] host: their weights */
    const int32_t *offset_host; /* [count + 1]: expert e's rows are [offset[e], offset[e+1]) */
    const int32_t *rows_host;   /*   of rows_host (token rows, distinct per expert) */
    const float *scale_host;    /*   and scale_host (their combine weights) */
    const fmoe__mlp *shared;    /* the shared expert (weight 1, every row), or NULL */
} fmoe__moe_args;

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
     * top-k. */
    int32_t n_group, topk_group;
    int32_t group_top2;    /* group score: sum of its two best (V3), else its best (V2) */
    const float *bias;     /* [J] model vector added to the scores for selection only, or
                              NULL */
    float *choice;         /* [n][J] backend scratch for the biased, masked scores */
    /* Phi-3.5-MoE's sparsemixer top-k (fmoe_route_row_grouped). */
    int32_t sparsemixer;
    float jitter_eps;      /* router_jitter_noise */
} fmoe__route_args;

/* One multi-head latent attention call (mla.c has the maths): n query tokens of one
 * sequence at positions pos0.., against its layer's latent cache. Every pointer but wk_b
 * and wv_b (the model's) is a backend buffer. */
typedef struct fmoe__mla_args {
    float *q;              /* [n][H][dn + dr]: the rope part is rotated in place */
    float *kv;             /* [n][r_kv + dr]: normalised latent, then k_pe (rotated in
                              place) */
    const float *cos, *sin; /* [n][dr/2] */
    float *cache;          /* [max_context][r_kv + dr]: the rows of kv land at pos0.. */
    const fmoe__mat *wk_b; /* [H·r_kv][dn] kv_b_proj's key rows, transposed per head */
    const fmoe__mat *wv_b; /* [H·dv][r_kv] its value rows (model_impl.h fmoe__layer) */
    float *out;            /* [n][H·dv] */
    float *scratch;        /* scratch_slots slots of fmoe__mla_scratch_floats(.., max_context,
                              max_batch) floats each: one per thread that runs heads */
    int32_t scratch_slots, max_context, max_batch;
    int32_t n, pos0, n_heads, nope, rope, v_dim, rank;
    int32_t interleave;    /* the rope dims come as adjacent pairs */
    float scale;
} fmoe__mla_args;

/* Heads one thread of the CPU's MLA takes together, so that each cached latent is read
 * once per group of them rather than once per head (runtime/cpu/cpu_mla.c). */
#define FMOE__MLA_HEAD_GROUP 4

/* Floats of scratch one thread of an MLA call needs for a context of max_context positions
 * and max_batch query rows: a first region that holds either a head's up-projections as
 * f32, [dn + dv][r] (the CUDA backend widens them there), or max_batch rows of 8-bit
 * inputs (the CPU's; fmoe/quant_act.h's blocks take at most 292 bytes per 256 values,
 * under half a float a value), then for each head of a group [max_batch][r] twice and the
 * scores (the CUDA backend uses one head's). */
static inline int64_t fmoe__mla_scratch_floats(int64_t nope, int64_t v_dim, int64_t rank,
                                               int64_t max_context, int64_t max_batch) {
    const int64_t widest = nope > rank ? nope : rank;
    const int64_t weights = (nope + v_dim) * rank, inputs = max_batch * (widest / 2 + 16);
    return (weights > inputs ? weights : inputs) +
           FMOE__MLA_HEAD_GROUP * (2 * max_batch * rank + max_context) + 64;
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

    /* ---- added later: NULL in a backend without it (both tables have them; CUDA's are
     * compiled, not yet run on a GPU: docs/gpu.md) ---- */
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
    /* The routed experts (and shared one) of a MoE layer at once (fmoe__moe_args), so a
     * backend can split all of their products over its threads in a few jobs instead of
     * several per expert (the CPU backend: two, cpu_fused.c). It may decline, before
     * doing anything, what it does not fuse (the CPU: more than a few rows, f32 weights):
     * the pass then runs its per-expert loop. NULL: always that loop.
     * @return 0 done, 1 declined. */
    int (*moe_experts)(void *ctx, const fmoe__moe_args *a);
    /* ys[i][n][ws[i]->rows] = x[n][cols] · ws[i]ᵀ for i < count: `matmul` of several
     * matrices of one input (attention's projections), which a backend may run as one
     * job. NULL: the pass calls matmul for each. */
    void (*matmul_same_input)(void *ctx, const fmoe__mat *const *ws, int32_t count,
                              const float *x, int32_t n, float *const *ys);
} fmoe__backend_ops;

extern const fmoe__backend_ops fmoe__cpu_backend;

/* The CUDA backend's table from libfmoe-cuda.so (cuda_loader.c), loaded on first use;
 * NULL with the error detail set when the module or a device is missing. */
const fmoe__backend_ops *fmoe__cuda_backend(void);

#endif
