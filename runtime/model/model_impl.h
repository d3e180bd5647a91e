/*
 * model_impl.h - the model's internals, shared by runtime/model and runtime/offload: its
 * three kinds of state (config, borrowed views and owned state, kept in separate structs
 * so that ownership is plain) and the pieces of the forward pass. The backend contract
 * these use (fmoe__mat, fmoe__backend_ops) is runtime/backend/backend_impl.h, which the
 * backends include instead of this header.
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

#include "../backend/backend_impl.h"

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

/* ---------------------------------------------------------------------------------- */
/* Weights: borrowed views                                                            */
/* ---------------------------------------------------------------------------------- */

/* fmoe__mlp, a SwiGLU MLP's weights: backend_impl.h (the backends' moe_experts takes them). */

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
    /* kv_b_proj [H(dn+dv)][r_kv] as llama.cpp's deepseek2 files split it, which is the
     * layout the absorbed attention reads as plain row products (runtime/cpu/cpu_mla.c):
     * a GGUF's own tensors in their file type, or built at load from kv_b_proj. */
    fmoe__mat wk_b;           /* [H·r_kv][dn] attn_k_b: head h's key rows transposed, row
                                 h·r_kv + c = column c of W_uk,h */
    fmoe__mat wv_b;           /* [H·dv][r_kv] attn_v_b: head h's value rows W_uv,h */
} fmoe__layer;

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

#endif
