/*
 * model_impl.h - internals shared by runtime/model and runtime/cpu: the model's three
 * kinds of state (STYLE.md rule 9) and the backend function table.
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
} fmoe__rope_type;

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
} fmoe__arch;

/* ---------------------------------------------------------------------------------- */
/* Weights: borrowed views                                                            */
/* ---------------------------------------------------------------------------------- */

/* A row-major matrix [rows][cols] in the checkpoint's dtype (F32, F16 or BF16). */
typedef struct fmoe__mat {
    const void *data;
    fmoe_st_dtype dtype;
    int64_t rows, cols;
    const char *file;    /* the file the bytes come from, and their offset in it (a */
    int64_t file_offset; /* realigned copy keeps its source's): what a file tier reads */
} fmoe__mat;

/* A SwiGLU MLP: down(silu(gate(x)) * up(x)). */
typedef struct fmoe__mlp {
    fmoe__mat gate; /* [I][h] */
    fmoe__mat up;   /* [I][h] */
    fmoe__mat down; /* [h][I] */
} fmoe__mlp;

typedef struct fmoe__layer {
    const float *attn_norm;   /* [h] f32 (converted at load) */
    const float *ffn_norm;    /* [h] */
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
} fmoe__layer;

struct fmoe_model {
    fmoe_model_geometry geo;
    fmoe__arch arch;
    fmoe_safetensors *st;
    char *dir;
    char *config_json;
    char describe[256];
    fmoe__mat embed;          /* [V][h] */
    const float *final_norm;  /* [h] */
    fmoe__mat lm_head;        /* [V][h] (the embedding when tied) */
    fmoe__layer *layers;      /* [num_hidden_layers] */
    fmoe__mlp *expert_pool;   /* [L·J] storage for the layers' expert arrays */
    void **owned;             /* converted vectors and realigned matrices */
    int32_t num_owned, cap_owned;
};

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

/* One attention call: n query tokens at positions pos0.., against the cache of a layer. */
typedef struct fmoe__attn_args {
    const float *q;        /* [n][Hq·D] after RoPE */
    const float *k_cache;  /* [max_context][Hkv·D] of this layer */
    const float *v_cache;  /* [max_context][Hkv·D] */
    float *out;            /* [n][Hq·D] */
    int32_t n, pos0;
    int32_t n_heads, n_kv_heads, head_dim;
    int32_t window;        /* 0: full causal attention; else keys j > pos - window */
    float scale;           /* 1/sqrt(D) */
} fmoe__attn_args;

typedef struct fmoe__backend_limits {
    int32_t threads;     /* 0: all cores */
    int64_t max_cols;    /* widest matrix (columns) the model multiplies by */
    int32_t max_batch;   /* most rows of x in one call */
    int32_t max_context; /* KV positions */
} fmoe__backend_limits;

/*
 * The compute a forward pass asks of a backend (STYLE.md rule 10). Buffers passed in
 * are the backend's own (allocated through `alloc`); weights are fmoe__mat views.
 * Every op is synchronous.
 */
typedef struct fmoe__backend_ops {
    const char *name;
    /* Creates the backend's context and its scratch for the limits given. */
    int (*init)(const fmoe__backend_limits *limits, void **ctx);
    void (*free)(void *ctx);
    void *(*alloc)(void *ctx, int64_t bytes);
    void (*release)(void *ctx, void *p);
    /* y[n][w.rows] = x[n][w.cols] · wᵀ (x rows contiguous with stride w.cols). */
    void (*matmul)(void *ctx, const fmoe__mat *w, const float *x, int32_t n, float *y);
    /* Causal (optionally sliding-window) grouped-query attention. */
    void (*attention)(void *ctx, const fmoe__attn_args *a);
    /* Row `row` of a matrix (the embedding) converted to f32 into y[w.cols]. */
    void (*get_row)(void *ctx, const fmoe__mat *w, int64_t row, float *y);
} fmoe__backend_ops;

extern const fmoe__backend_ops fmoe__cpu_backend;

#endif
