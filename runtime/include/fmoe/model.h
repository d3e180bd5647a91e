/*
 * fmoe/model.h - a HuggingFace MoE checkpoint loaded for inference, and the run state of
 * one sequence (a session) that the forward pass works in.
 *
 *     fmoe_model *m;
 *     fmoe_model_load("Qwen3-30B-A3B", NULL, &m);           // config.json + safetensors
 *     fmoe_session_options so = fmoe_session_defaults();
 *     so.max_context = 4096;
 *     fmoe_session *s;
 *     fmoe_session_init(m, &so, &s);                         // every buffer allocated here
 *     fmoe_session_forward(s, prompt, n, NULL, logits);      // prefill: logits of the last
 *     fmoe_session_forward(s, &next, 1, &trace, logits);     // decode, with routing trace
 *     fmoe_session_free(s); fmoe_model_free(m);
 *
 * Families: Mixtral, Qwen2-MoE (Qwen1.5-MoE), Qwen3-MoE, OLMoE, DeepSeek-MoE V1, and on the
 * CPU backend DeepSeek-V2/V3 (MLA), Phi-3.5-MoE, GLM-4.5 and gpt-oss (its experts
 * transposed, or repacked from MXFP4, at load: runtime/model/family_gptoss.c), each
 * following its transformers (or, for DeepSeek V1, its authors') modeling code. Llama-4 is
 * refused as not yet supported.
 *
 * Weights: the safetensors files stay memory-mapped; matrices are used in place in their
 * stored dtype (F32, BF16 or F16: the CPU backend converts BF16/F16 rows as it multiplies),
 * never copied. A GGUF file of the same families loads too (docs/quantization.md): its
 * matrices stay in the mapping in their ggml type, Q8_0/Q4_K/Q5_K/Q6_K included, which both
 * backends compute with (the CUDA backend's quantized kernels: written, not yet run on a
 * device). Only small vectors (norm weights, biases) are converted to f32 at load, and a
 * matrix whose bytes are misaligned for its dtype is copied once.
 *
 * Threads: a model is immutable after load and may be shared by sessions on any threads;
 * a session is used by one thread at a time.
 */
#ifndef FMOE_MODEL_H
#define FMOE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "fmoe/geometry.h"
#include "fmoe/safetensors.h"

typedef struct fmoe_model fmoe_model;
typedef struct fmoe_session fmoe_session;

/* A matrix [rows][cols], row-major, in a safetensors dtype (F32, F16, BF16), or rows of
 * ggml blocks from a GGUF file (quant set, dtype FMOE_ST_U8; fmoe/quant.h). */
typedef struct fmoe_matrix_view {
    const void *data;
    fmoe_st_dtype dtype;
    int64_t rows, cols;
    int32_t on_device; /* data lies in the session backend's memory (a GPU expert slot);
                          0: host memory */
    uint32_t quant;    /* 0, or the ggml block type of the rows (Q8_0, K-quants, Q4_0 .. IQ4_NL) */
} fmoe_matrix_view;

/* Bytes of the matrix's data: rows · cols · dtype size, or rows of blocks. */
int64_t fmoe_matrix_view_bytes(const fmoe_matrix_view *v);

/* One routed expert's three matrices: down(silu(gate·x) * up·x). */
typedef struct fmoe_expert_view {
    fmoe_matrix_view gate; /* [I][h] */
    fmoe_matrix_view up;   /* [I][h] */
    fmoe_matrix_view down; /* [h][I] */
    void *fence;           /* with on_device: the slot's fence (an opaque backend handle
                              from the offload executor), which the pass records after the
                              expert's reads, so that the slot's next copy waits for them
                              on the device; NULL: the pass waits for the device before
                              fmoe_expert_done_fn instead */
} fmoe_expert_view;

/* ---------------------------------------------------------------------------------- */
/* Loading                                                                            */
/* ---------------------------------------------------------------------------------- */

/*
 * Loads the model in directory `dir`: config.json (geometry and architecture), then
 * model.safetensors or model.safetensors.index.json + shards. `dir` may instead be a GGUF
 * file (it starts with "GGUF"): its config (fmoe_gguf_config_json) and its tensors under
 * llama.cpp's names (fmoe_gguf_tensor_for). Every tensor the family needs must be present
 * with the expected shape and a supported dtype.
 * `options` is reserved and may be NULL.
 * @return 0 and *out, or FMOE_EIO, FMOE_EFORMAT (bad config.json or safetensors),
 *         FMOE_ENOTFOUND ("<file>: missing tensor model.layers.3.mlp.gate.weight"),
 *         FMOE_EMISMATCH (a tensor of the wrong shape), FMOE_EUNSUPPORTED (a family,
 *         activation, rope type or dtype that the forward pass does not implement, named),
 *         FMOE_ENOMEM. The detail is one line naming the file and the tensor.
 */
int fmoe_model_load(const char *dir, const void *options, fmoe_model **out);

/* Unmaps and frees; NULL is a no-op. Sessions of the model must be freed first. */
void fmoe_model_free(fmoe_model *m);

/* The parsed geometry (L, J, K, sizes, router semantics). Valid until free. */
const fmoe_model_geometry *fmoe_model_get_geometry(const fmoe_model *m);

/* config.json verbatim, NUL-terminated (for trace headers and fingerprints). */
const char *fmoe_model_config_json(const fmoe_model *m);

/* Bytes of tensor data in the checkpoint's files. */
int64_t fmoe_model_weight_bytes(const fmoe_model *m);

/* One line describing the model: family, layers, experts, dtype, rope. Static per model. */
const char *fmoe_model_describe(const fmoe_model *m);

/* Where a routed expert's matrix lives: its view (in the mapping) and its bytes' file and
 * offset, for a slow tier that reads experts itself (pread, O_DIRECT). */
typedef struct fmoe_expert_tensor {
    fmoe_matrix_view view;
    const char *file;        /* the safetensors file holding it (valid until free) */
    int64_t offset;          /* byte offset of view.data's first byte in that file */
} fmoe_expert_tensor;

typedef struct fmoe_expert_tensors {
    fmoe_expert_tensor gate, up, down;
} fmoe_expert_tensors;

/* Bytes of one routed expert as the model stores it, the figure traces record and cache
 * sizes convert with: a GGUF file's three matrices as they are (blocks, and the float
 * type a row too short for blocks kept); a checkpoint's at its expert dtype
 * (fmoe_geometry_expert_bytes). Where experts differ by layer (a llama-quantize mix such
 * as Q4_K_M gives some layers' down projections more bits), the largest layer's: one
 * expert slot's contents (docs/offloading.md, "Experts of different sizes"). */
int64_t fmoe_model_expert_bytes(const fmoe_model *m);

/* Copies every weight a forward pass reads other than the routed experts (attention,
 * routers, shared experts, dense MLPs, norms, embeddings, the LM head) out of the
 * checkpoint's file mapping into memory the process owns, then drops the mapping's pages.
 * For a model whose routed experts are read from its file (the offload file tier) under a
 * memory budget: mapped pages are the ones the kernel evicts first when memory runs short
 * (with no swap, owned memory cannot be evicted at all), and every token would fault the
 * evicted weights back in from the disk. Call after load, before any session; idempotent.
 * @return 0 or FMOE_ENOMEM (the weights not yet copied stay mapped). */
int fmoe_model_own_weights(fmoe_model *m);

/* Maps every page of the model's files into the process now (fmoe_gguf_populate_pages),
 * when they fit in the memory the kernel reports available (/proc/meminfo MemAvailable,
 * which counts the page cache). For a run that reads every weight in place from the
 * mapping (no offloading, the CPU backend): otherwise its first prompt and first decode
 * steps take a page fault per 4-64 KiB of weights they touch first (routed experts first
 * chosen in decode too), counted in their time; llama.cpp populates its mapping at load
 * the same way (MAP_POPULATE). A model larger than that is left alone: populating it would
 * read the whole file only to evict it again. Call after load. @return 1 populated, 0
 * left alone. */
int fmoe_model_populate(fmoe_model *m);

/* [L] the bytes of one routed expert of each MoE layer as stored, each at most
 * fmoe_model_expert_bytes; what a transfer of that layer's expert moves. NULL for a
 * model without MoE layers. Valid until the model is freed. */
const int64_t *fmoe_model_layer_expert_bytes(const fmoe_model *m);

/* Bytes of every routed expert of every layer as stored: what an offloaded run leaves in
 * its slow tier. 0 for a model without MoE layers. */
int64_t fmoe_model_routed_expert_bytes(const fmoe_model *m);

/* Routed expert j of MoE layer l. @return 0, FMOE_EINVAL (l or j out of range). */
int fmoe_model_expert_tensors(const fmoe_model *m, int32_t l, int32_t j, fmoe_expert_tensors *out);

/* The embedding rows of tokens[0..n) as f32 into out[n][h]: the forward pass's semantic
 * embedding, for callers that need it before the forward call.
 * @return 0 or FMOE_EINVAL (a token outside the vocabulary). */
int fmoe_model_embed(const fmoe_model *m, const int32_t *tokens, int32_t n, float *out);

/* ---------------------------------------------------------------------------------- */
/* Sessions: run state and the forward pass                                           */
/* ---------------------------------------------------------------------------------- */

/*
 * What the router of one MoE layer chose for the tokens of one forward pass (a chunk of a
 * sequence, or every item's rows of a batch: item order, then token order), before any
 * expert of the layer runs (docs/design.md §7.1), in the types fmoe_gate_event uses: a live
 * executor passes it on to the policy and makes the experts resident. Pointers are valid
 * during the call only.
 */
typedef struct fmoe_route_event {
    int32_t layer;             /* MoE layer index l */
    int32_t num_tokens;        /* n, the pass's tokens */
    const uint16_t *chosen;    /* token t's K experts at chosen[t * chosen_stride + k],
                                  in gate order */
    int64_t chosen_stride;
    const float *probs;        /* token t's J gate probabilities at probs[t * probs_stride] */
    int64_t probs_stride;
    const int32_t *distinct;   /* the layer's experts in order of first appearance (token
                                  by token, k by k): the order they run in, unless the hook
                                  permutes compute_order */
    const int32_t *tokens;     /* [J] tokens routed to each expert (0 for the others) */
    int32_t num_distinct;
    const float *speculative;  /* token t's gate of layer l+1+s applied to this layer's
                                  gate input at speculative[t * speculative_stride + s * J],
                                  s < speculative_depth; rows past the last layer are 0.
                                  NULL when the session's speculative_depth is 0 */
    int64_t speculative_stride;
    int32_t speculative_depth;
    const float *hidden;       /* token t's gate input at hidden[t * hidden_stride]: the
                                  normalised hidden state (h floats) the router read, the
                                  rows fmoe_forward_trace.hidden records. Always set */
    int64_t hidden_stride;
    /* [num_distinct] the order the experts run in, as indices into distinct: 0, 1, 2, ...
     * on entry; the hook may permute it (an executor whose policy reorders compute,
     * FMOE_POLICY_REORDER_COMPUTE). on_expert then comes in this order. */
    int32_t *compute_order;
} fmoe_route_event;

/* Called once per MoE layer and pass (chunk or batch) after routing. Must not call back
 * into the session.
 * @return 0, or a negative fmoe error code: the forward call stops and returns it. */
typedef int (*fmoe_route_fn)(void *ctx, const fmoe_route_event *ev);

/* Called before routed expert (l, j) runs, in the order of fmoe_route_event.compute_order:
 * @return 0 with *weights set (the executor's copy of the expert, e.g. a cache slot),
 * 1 to run the model's own weights, or a negative error code (the forward call stops). */
typedef int (*fmoe_expert_fn)(void *ctx, int32_t layer, int32_t expert,
                              fmoe_expert_view *weights);

/* Called after routed expert (l, j) has run: the weights given for it may be reused. */
typedef void (*fmoe_expert_done_fn)(void *ctx, int32_t layer, int32_t expert);

/* Where a session computes. */
typedef enum fmoe_backend_kind {
    FMOE_BACKEND_CPU = 0,  /* runtime/cpu: the host's cores (the default) */
    FMOE_BACKEND_CUDA = 1, /* runtime/cuda: device 0 through libfmoe-cuda.so */
} fmoe_backend_kind;

/*
 * Chooses a backend from a command line's --backend value: "cpu", "cuda", or "auto" (or
 * NULL): cuda when the CUDA module loads and sees a device, else cpu.
 * @return 0 and *out, FMOE_EINVAL (another word: named), FMOE_EUNSUPPORTED ("cuda" asked
 * where the module or a device is missing: the detail says which).
 */
int fmoe_backend_choose(const char *name, fmoe_backend_kind *out);

/* "cpu" or "cuda". */
const char *fmoe_backend_name(fmoe_backend_kind kind);

/*
 * What the CPU backend multiplies quantized (GGUF block-format: Q8_0, the K-quants, Q4_0 .. IQ4_NL)
 * weights by: the f32 inputs themselves, or the inputs quantised to 8 bits once per product
 * and integer block dots, as llama.cpp's CPU backend does (fmoe/quant_act.h). Q8 is faster
 * in decode and moves the logits several times more than the 8-bit weights themselves do
 * (docs/quantization.md has both measured); F16/BF16/F32 weights take their own paths and
 * are the same bits either way. The CUDA backend's quantized kernels take f32 inputs, and
 * fmoe_session_init refuses Q8 there.
 */
typedef enum fmoe_activations {
    FMOE_ACTIVATIONS_F32 = 0, /* the library's default: the accuracy the tests pin */
    FMOE_ACTIVATIONS_Q8 = 1,
    FMOE_ACTIVATIONS_AUTO = 2, /* the commands' default: fmoe_activations_resolve's choice */
} fmoe_activations;

/* "f32", "q8" or "auto" (the --activations values; a trace attribute holds a resolved one);
 * "?" for another value. */
const char *fmoe_activations_name(fmoe_activations a);

/* What `requested` computes with on `backend`: AUTO is Q8 on the CPU, llama.cpp's choice
 * and its speed on quantized weights (bf16, f16 and f32 weights are the same bits either
 * way), and F32 on CUDA, whose quantized kernels take f32 inputs only; F32 and Q8 are
 * returned as they are (Q8 off the CPU is fmoe_session_init's error, not this function's).
 * The one place AUTO is decided: what a run reports or records is this function's value.
 * @return FMOE_ACTIVATIONS_F32 or FMOE_ACTIVATIONS_Q8 (any other value unchanged). */
fmoe_activations fmoe_activations_resolve(fmoe_activations requested, fmoe_backend_kind backend);

typedef struct fmoe_session_options {
    fmoe_backend_kind backend; /* default FMOE_BACKEND_CPU */
    int32_t max_context;       /* KV cache positions (default: min(4096, model's maximum)) */
    int32_t max_batch;         /* tokens per internal chunk of a forward call (default 64) */
    int32_t max_sequences;     /* items a fmoe_session_forward_batch through this session as
                                  runner may hold (default 1; at most max_batch): sizes the
                                  LM head's rows, [max_sequences][V] */
    int32_t threads;           /* CPU threads for BLAS and our kernels (0: all cores) */
    int32_t all_logits;        /* 1: forward writes logits of every token, [n][V] */
    int32_t speculative_depth; /* S for fmoe_forward_trace.speculative (0: none) */
    fmoe_route_fn on_route;    /* optional hooks for a live executor (fmoe/offload.h); */
    fmoe_expert_fn on_expert;  /* all take route_ctx */
    fmoe_expert_done_fn on_expert_done;
    void *route_ctx;
    fmoe_activations activations; /* the CPU backend's inputs for quantized weights (default
                                     FMOE_ACTIVATIONS_F32; AUTO: fmoe_activations_resolve;
                                     Q8 with CUDA is refused) */
} fmoe_session_options;

/* Defaults as documented above. */
fmoe_session_options fmoe_session_defaults(void);

/*
 * What a forward call reports about routing, for the tracer. The caller owns every array
 * and sizes it for the call's n tokens; NULL fields are skipped. L = MoE layers, J routed
 * experts, K top-k, h hidden size, S = the session's speculative_depth.
 */
typedef struct fmoe_forward_trace {
    uint16_t *experts;     /* [n][L][K] chosen experts, in gate order (descending weight) */
    float *weights;        /* [n][L][K] their combine weights (after renormalisation) */
    float *probs;          /* [n][L][J] the full gate distribution: softmax of the router
                              logits (sigmoid scores for sigmoid routers) */
    float *semantic;       /* [n][h] the semantic embedding: the embedding layer's output */
    float *speculative;    /* [n][L][S][J] gate of MoE layer l+s applied to layer l's gate
                              input (s = 1..S); rows past the last layer are 0 */
    float *hidden;         /* [n][L][h] gate inputs: the normalised hidden state the router
                              of layer l sees */
    double *layer_seconds; /* [num_hidden_layers] wall seconds per decoder layer, added to */
} fmoe_forward_trace;

/*
 * Allocates all run state of one sequence: KV cache for max_context positions, activation
 * buffers for max_batch tokens (and [max_batch][V] floats for the lm head of a batch),
 * RoPE tables, thread pool. Nothing is allocated after this.
 * @return 0 and *out, FMOE_EINVAL (bad options), FMOE_EUNSUPPORTED (CUDA missing here, or
 *         activations Q8 asked of a backend other than the CPU), FMOE_ENOMEM.
 */
int fmoe_session_init(const fmoe_model *m, const fmoe_session_options *options,
                      fmoe_session **out);

/* Frees; NULL is a no-op. */
void fmoe_session_free(fmoe_session *s);

/* Forgets the sequence (position 0, empty cache). */
void fmoe_session_reset(fmoe_session *s);

/* Tokens in the KV cache: the position the next token gets. */
int32_t fmoe_session_position(const fmoe_session *s);

/*
 * Keeps the first n positions of the KV cache and forgets the rest: the next token gets
 * position n, as if only those n tokens had been run. Prefix reuse (fmoe serve's prefix
 * cache): a sequence whose cache holds the keys and values of tokens t[0..p) continues
 * with any token sequence that begins with t[0..n), n <= p, without running t[0..n) again.
 * The kept entries are what a fresh run computes, up to the rounding of products of
 * another batch shape, except where the rotary embedding depends on the length of the
 * whole call (dynamic NTK, longrope: transformers recomputes those per call); there it is
 * FMOE_EUNSUPPORTED and nothing changes (fmoe_model_prefix_reusable says so in advance).
 * @return 0, FMOE_EINVAL (n outside [0, position]), FMOE_EUNSUPPORTED.
 */
int fmoe_session_keep_prefix(fmoe_session *s, int32_t n);

/* 1 when fmoe_session_keep_prefix can keep a prefix of this model's sequences. */
int fmoe_model_prefix_reusable(const fmoe_model *m);

/* Makes dst's cache the first n positions of src's (sessions of one model; dst's previous
 * contents forgotten; its position n), for a prefix kept in another session than the one
 * that continues it. Exact as fmoe_session_keep_prefix. @return 0, FMOE_EINVAL (another
 * model; n beyond src's position or dst's context), FMOE_EUNSUPPORTED (as keep_prefix;
 * or a session not in host memory: the CPU backend only, for now). */
int fmoe_session_copy_prefix(fmoe_session *dst, const fmoe_session *src, int32_t n);

/* Bytes of the session's KV cache (every layer, max_context positions). */
int64_t fmoe_session_kv_bytes(const fmoe_session *s);

/*
 * Runs tokens[0..n) at positions position..position+n-1 (chunks of max_batch), appending
 * to the KV cache. `logits` (may be NULL: the lm head is skipped) receives [n][V] floats
 * with all_logits, else [V] for the last token. `trace` may be NULL.
 * @return 0, FMOE_EINVAL (n < 1, a token id outside [0, V)), FMOE_ERANGE (the sequence
 *         would exceed max_context: "prompt of 5000 tokens exceeds the context of 4096").
 *         On error nothing was computed and the position is unchanged.
 */
int fmoe_session_forward(fmoe_session *s, const int32_t *tokens, int32_t n,
                         const fmoe_forward_trace *trace, float *logits);

/* One sequence's part of a batched forward call. */
typedef struct fmoe_batch_item {
    fmoe_session *session;            /* the sequence: its KV cache and position */
    const int32_t *tokens;
    int32_t n;                        /* >= 1 */
    const fmoe_forward_trace *trace;  /* rows for this item's n tokens (as
                                         fmoe_session_forward's), or NULL */
    float *logits;                    /* [V]: the logits of its last token, or NULL */
} fmoe_batch_item;

/*
 * Runs several sequences' tokens as one forward pass (continuous batching): attention per
 * sequence against its own KV cache at its own positions; every other product (q/k/v/o
 * projections, router, routed experts, shared experts, lm head) over the rows of all items
 * together, so each chosen expert runs once per layer for the whole batch, and runner's
 * hooks see one fmoe_route_event per MoE layer holding all tokens (item order, then token
 * order; experts in order of first appearance over those rows).
 *
 * `runner` supplies the activation buffers, threads and hooks; its max_batch must hold the
 * items' total tokens; its own KV cache is untouched unless it is also one of the items.
 * Items' sessions lend only their KV cache, position and RoPE state (dynamic NTK scales
 * per sequence, by its position + n). Each item's trace gets its rows as
 * fmoe_session_forward would write them, and layer_seconds the whole batch's layer time;
 * logits are its last token's, or [n][V] of every token when runner has all_logits.
 * Every item's position advances by its n. Results equal each sequence run alone up to
 * float rounding (products over more rows may sum in another order).
 *
 * @return 0, FMOE_EINVAL (count < 1 or > runner's max_sequences, total tokens > runner's
 *         max_batch, a session of
 *         another model or with a larger max_context than runner's, the same session twice,
 *         a token outside the vocabulary), FMOE_ERANGE (an item would exceed its context);
 *         on error nothing was computed and no position changed. A hook's error stops the
 *         call midway and is returned; positions are then unchanged.
 */
int fmoe_session_forward_batch(fmoe_session *runner, const fmoe_batch_item *items, int32_t count);

/*
 * A backend's own operations at a model's shapes, for `fmoe calibrate`
 * (runtime/model/backend_bench.c): each timed through the backend's function table as a
 * live forward pass issues it, on synthetic weights, from an idle backend to the end of
 * a sync (the host clock; the median of at least `reps` runs, more while a point has taken
 * under 20 ms). Seconds go to seconds[i] for point i. Not thread-safe; allocates at init
 * and in fmoe_backend_bench_chain, never while timing.
 */
typedef struct fmoe_backend_bench fmoe_backend_bench;

typedef struct fmoe_backend_bench_shape {
    int32_t hidden;                 /* h */
    int32_t ffn;                    /* a routed expert's intermediate width */
    int32_t heads, kv_heads, head_dim;
    int32_t experts, top_k;         /* the router's J and K */
    int32_t shared_ffn;             /* the widest other MLP a chain multiplies by (0: none) */
    fmoe_dtype expert_dtype;        /* the routed experts' weights (a GGUF's blocks, ...) */
    int32_t max_batch;              /* most tokens of any point */
    int32_t max_context;            /* most context of any attention point (>= max_batch) */
} fmoe_backend_bench_shape;

/* The backend (FMOE_BACKEND_CPU with `threads`, 0: all cores, and `activations`; or
 * FMOE_BACKEND_CUDA, which takes f32 activations only) with buffers for the shape and one
 * routed expert in backend memory, as an offload executor's slot holds it.
 * @return 0, FMOE_EINVAL (a bad shape), FMOE_ENOMEM, FMOE_EUNSUPPORTED (no CUDA here). */
int fmoe_backend_bench_init(fmoe_backend_bench **out, fmoe_backend_kind backend,
                            const fmoe_backend_bench_shape *shape, int32_t threads,
                            fmoe_activations activations);
void fmoe_backend_bench_free(fmoe_backend_bench *b);

/* The products x[t][cols[i]] · W_iᵀ, i < mats (at most 16), one after another, for each
 * t = tokens[p], p < n, on host weights [rows[i]][cols[i]] stored as dtypes[i] (f32, f16,
 * bf16, a block type; other formats as bf16) that the backend maps as it maps a model's
 * (a layer's projections, the LM head): a llama-quantize mix stores a layer's projections
 * in several types. cols[i] may not exceed the shape's widest matrix.
 * @return 0, FMOE_EINVAL, FMOE_ENOMEM, or the backend's error. */
int fmoe_backend_bench_chain(fmoe_backend_bench *b, const int32_t *rows, const int32_t *cols,
                             int32_t mats, const fmoe_dtype *dtypes, const int32_t *tokens,
                             int32_t n, int32_t reps, double *seconds);

/* One routed expert for tokens[p] tokens, exactly as the forward pass computes an expert
 * from a slot (fmoe__expert_run: gather, gate and up, SwiGLU, down, scatter_add, and on a
 * device the sync before the slot may be reused). @return as above. */
int fmoe_backend_bench_expert(fmoe_backend_bench *b, const int32_t *tokens, int32_t n,
                              int32_t reps, double *seconds);

/* The backend's attention op: tokens[p] query rows, the last at context contexts[p]
 * (tokens[p] <= contexts[p] <= max_context), full causal. @return as above. */
int fmoe_backend_bench_attention(fmoe_backend_bench *b, const int32_t *tokens,
                                 const int32_t *contexts, int32_t n, int32_t reps,
                                 double *seconds);

/* The rest of a MoE layer of tokens[p] tokens, what the pass issues besides products,
 * attention and routed experts: two RMSNorms, RoPE of q and k, the KV writes, the residual
 * adds, the router's top-k, the routing read back to the host as a pass with a routing
 * hook reads it (fmoe__routing_to_host: probabilities, gate inputs, weights, experts in
 * one download, which on a device waits for the stream), the zeroed accumulator.
 * @return as above. */
int fmoe_backend_bench_layer_overhead(fmoe_backend_bench *b, const int32_t *tokens, int32_t n,
                                      int32_t reps, double *seconds);

/* The backend's name ("cpu", "cuda"). */
const char *fmoe_backend_bench_backend(const fmoe_backend_bench *b);

#endif
