/*
 * backend_bench.c - a backend's own operations at a model's shapes, for `fmoe calibrate`
 * (fmoe/model.h fmoe_backend_bench).
 *
 * Why: the simulator predicts a live run from the profile's curves, so the curves must
 * time what the live pass does. A live run computes through the backend table
 * (model_impl.h, fmoe__backend_ops): on the CPU the backend's own kernels on weights of the
 * checkpoint's dtype (AVX-512 tiles reading bf16 in place, or GGUF blocks through the
 * block kernels, runtime/cpu/quant_matvec.c; with `--activations q8` their 8-bit inputs);
 * on the GPU the CUDA backend's ops (runtime/cuda/cuda_forward.cu: x rounded to bf16 before
 * each cuBLAS product, its own attention kernel, index uploads before each gather and
 * scatter). Timing stand-ins instead (OpenBLAS f32, bare cuBLAS chains, attention as two
 * GEMMs) left out what the pass pays besides the products: on the one device run the
 * simulator was off by more than 15% at every point (docs/gpu.md). So everything here goes
 * through the same table the pass uses, for either backend:
 *
 *   chain      matrix products as the pass issues them (the layer's projections, the LM
 *              head), on host weights the backend maps by address as it maps a model's;
 *   expert     one routed expert computed from backend memory (a GPU slot) for t tokens:
 *              fmoe__expert_run, the very function forward.c runs (gather, gate and up,
 *              SwiGLU, down, scatter_add, and the slot's fence recorded after them: an
 *              event the executor's copies wait for on the device, not a host wait);
 *   attention  the backend's attention op for t tokens against a context of c;
 *   overhead   the rest of a MoE layer of t tokens: the two norms, RoPE, the KV writes,
 *              the residual adds, the router's top-k, the routing read back to the host
 *              (fmoe__routing_to_host, as forward.c reads it with a routing hook: probs,
 *              gate inputs, weights, experts, in the one download that waits for the
 *              device) and the zeroed accumulator, ended by a sync.
 *
 * Each point is issued once untimed (a device backend copies the weights and picks its
 * kernels on first use), then timed with the host clock from an idle backend to the end of
 * a sync, the median of at least `reps` runs, more while the point has taken under 20 ms,
 * at most 1000. A run issues the point once on a host-memory backend (the CPU: each op has
 * finished when it returns, and a sync costs nothing) and FMOE__BENCH_DEVICE_BURST times
 * back to back on a device, timed as the run over the count: the live pass queues a
 * step's ops and waits for the device at each MoE layer's routing download and once at
 * the end, not after every expert (slot fences, model_impl.h), so a sync per issue would
 * charge each expert, attention or product the host's round trip to the device, which
 * the pass does not pay. What does wait in the pass is inside the point (the overhead
 * series' routing download), so it is timed as often as it is paid. Weights are small pseudo-random values; the product's speed does not depend
 * on them. Memory is allocated at init and in the chain call, never while timing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/error.h"
#include "half.h"
#include "fmoe/quant.h"
#include "model_impl.h"
#include "monotonic.h"

#define MIN_POINT_S 0.02
#define MAX_REPS 1000

/* The block type a weight of `dtype` with rows of `cols` values is computed in, or 0 for a
 * float dtype: where the rows are not whole blocks of it, the type `fmoe quantize` (and
 * llama-quantize) falls back to (fmoe_quant_fallback_type), else 0 (bf16). */
static uint32_t block_type(fmoe_dtype dtype, int32_t cols) {
    const uint32_t t = fmoe_dtype_ggml_type(dtype);
    return t ? fmoe_quant_fallback_type(t, cols) : 0;
}

struct fmoe_backend_bench {
    const fmoe__backend_ops *be;
    void *ctx;
    fmoe_backend_bench_shape sh;
    int64_t max_cols;
    uint32_t seed;
    void **owned;           /* [num_owned] host weights of the chains (mapped by address:
                               they live as long as ctx) */
    int32_t num_owned, cap_owned;
    /* backend buffers, B = max_batch rows */
    float *x, *xn, *acc;    /* [B][h] */
    void *route;            /* a MoE layer's routing (fmoe__routing_layout, no speculative
                               rows) laid out for each point's n rows; the overhead's gate
                               input is its first part (xn keeps the experts' inputs) */
    float *q, *att;         /* [B][Hq·D] */
    float *k, *v;           /* [B][Hkv·D] */
    float *kc, *vc;         /* [max_context][Hkv·D] */
    float *cos, *sin;       /* [B][D/2] */
    float *rlogits;         /* [B][J] */
    float *xg, *yg;         /* [B][h] */
    float *g, *u;           /* [B][ffn] */
    fmoe__mlp expert;       /* in backend memory (a slot), the experts' dtype */
    void *fence;            /* its slot fence (fence_new), as an executor's slot has */
    /* host */
    float *norm_w;          /* [max(h, Hq·D)] the norms' weights (ones) */
    int32_t *rows_h;        /* [B] 0..B-1: the expert's tokens */
    float *scale_h;         /* [B] their combine weights */
    void *route_h;          /* route's host mirror (route itself on a host-memory backend) */
    double *t;              /* [MAX_REPS] */
};

static float next_value(uint32_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return ((float)(*x & 0xffff) / 65536.0f - 0.5f) * 0.04f;
}

/* A [rows][cols] matrix of small values stored as `dtype` (f32, f16, bf16, or a block type:
 * block_type; other formats as bf16), its bytes in *data (64-byte aligned, malloc'd; the
 * caller frees). @return 0 or FMOE_ENOMEM. */
static int make_matrix(int32_t rows, int32_t cols, fmoe_dtype dtype, uint32_t *seed,
                       fmoe__mat *out, void **data) {
    const fmoe_st_dtype st = dtype == FMOE_DTYPE_F32   ? FMOE_ST_F32
                             : dtype == FMOE_DTYPE_F16 ? FMOE_ST_F16
                                                       : FMOE_ST_BF16;
    const uint32_t quant = block_type(dtype, cols);
    const size_t n = (size_t)rows * (size_t)cols;
    const size_t row_bytes = quant ? (size_t)fmoe_quant_row_bytes(quant, cols) : 0;
    const size_t bytes = quant ? row_bytes * (size_t)rows : n * (st == FMOE_ST_F32 ? 4 : 2);
    *data = aligned_alloc(64, (bytes + 63) / 64 * 64); /* as a checkpoint's realigned rows */
    float *row = quant ? malloc((size_t)cols * sizeof *row) : NULL;
    if (!*data || (quant && !row)) {
        free(*data);
        free(row);
        *data = NULL;
        return fmoe_error_set(FMOE_ENOMEM, "backend timing: a %d x %d matrix", rows, cols);
    }
    for (size_t k = 0; k < n; k++) {
        const float v = next_value(seed);
        if (quant) {
            const size_t c = k % (size_t)cols;
            row[c] = v;
            if (c + 1 == (size_t)cols)
                fmoe_quant_quantize_row(quant, row,
                                        (uint8_t *)*data + (k / (size_t)cols) * row_bytes, cols);
        } else if (st == FMOE_ST_BF16) ((uint16_t *)*data)[k] = fmoe_float_to_bf16(v);
        else if (st == FMOE_ST_F16) ((uint16_t *)*data)[k] = fmoe_float_to_half(v);
        else ((float *)*data)[k] = v;
    }
    free(row);
    *out = quant ? (fmoe__mat){.data = *data, .dtype = FMOE_ST_U8, .quant = quant, .rows = rows,
                               .cols = cols}
                 : (fmoe__mat){.data = *data, .dtype = st, .rows = rows, .cols = cols};
    return 0;
}

static int own(fmoe_backend_bench *b, void *p) {
    if (b->num_owned == b->cap_owned) {
        const int32_t cap = b->cap_owned ? 2 * b->cap_owned : 16;
        void **grown = realloc(b->owned, (size_t)cap * sizeof *grown);
        if (!grown) {
            free(p);
            return fmoe_error_set(FMOE_ENOMEM, "backend timing");
        }
        b->owned = grown;
        b->cap_owned = cap;
    }
    b->owned[b->num_owned++] = p;
    return 0;
}

/* The backend buffers, in one list for alloc and release. */
#define BENCH_BUFFERS(b)                                                                    \
    {(void **)&(b)->x,    (void **)&(b)->xn,      (void **)&(b)->acc,   (void **)&(b)->q,   \
     (void **)&(b)->att,  (void **)&(b)->k,       (void **)&(b)->v,     (void **)&(b)->kc,  \
     (void **)&(b)->vc,   (void **)&(b)->cos,     (void **)&(b)->sin,   (void **)&(b)->rlogits, \
     (void **)&(b)->route, (void **)&(b)->xg,     (void **)&(b)->yg,    (void **)&(b)->g,   \
     (void **)&(b)->u}

void fmoe_backend_bench_free(fmoe_backend_bench *b) {
    if (!b) return;
    if (b->ctx) {
        void **bufs[] = BENCH_BUFFERS(b);
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) b->be->release(b->ctx, *bufs[i]);
        fmoe__mat *ew[3] = {&b->expert.gate, &b->expert.up, &b->expert.down};
        for (int i = 0; i < 3; i++) b->be->release(b->ctx, (void *)ew[i]->data);
        b->be->fence_free(b->ctx, b->fence);
        if (!b->be->host_memory) free(b->route_h);
        b->be->free(b->ctx);
    }
    for (int32_t i = 0; i < b->num_owned; i++) free(b->owned[i]);
    free(b->owned);
    free(b->norm_w);
    free(b->rows_h);
    free(b->scale_h);
    free(b->t);
    free(b);
}

/* A backend buffer of `count` floats filled with small values (through the backend's
 * upload, so a device buffer is filled too). */
static void fill(fmoe_backend_bench *b, float *dst, int64_t count, float *host) {
    for (int64_t i = 0; i < count; i++) host[i] = next_value(&b->seed);
    b->be->upload(b->ctx, dst, host, count * (int64_t)sizeof(float));
}

int fmoe_backend_bench_init(fmoe_backend_bench **out, fmoe_backend_kind backend,
                            const fmoe_backend_bench_shape *shape, int32_t threads,
                            fmoe_activations activations) {
    *out = NULL;
    const fmoe__backend_ops *be = NULL;
    switch (backend) {
    case FMOE_BACKEND_CPU: be = &fmoe__cpu_backend; break;
    case FMOE_BACKEND_CUDA:
        be = fmoe__cuda_backend();
        if (!be) return FMOE_EUNSUPPORTED; /* the loader's detail says why */
        break;
    default: return fmoe_error_set(FMOE_EINVAL, "backend timing: backend %d", (int)backend);
    }
    return fmoe__backend_bench_init_ops(out, be, shape, threads,
                                        fmoe_activations_resolve(activations, backend));
}

int fmoe__backend_bench_init_ops(fmoe_backend_bench **out, const fmoe__backend_ops *be,
                                 const fmoe_backend_bench_shape *shape, int32_t threads,
                                 fmoe_activations activations) {
    *out = NULL;
    const fmoe_backend_bench_shape s = *shape;
    FMOE_RETURN_ERROR_IF(s.hidden < 1 || s.ffn < 1 || s.heads < 1 || s.kv_heads < 1 ||
                             s.heads % s.kv_heads != 0 || s.head_dim < 2 || s.experts < 1 ||
                             s.top_k < 1 || s.top_k > s.experts || s.shared_ffn < 0 ||
                             s.max_batch < 1 || s.max_context < s.max_batch,
                         FMOE_EINVAL,
                         "backend timing: hidden %d, expert %d, %d heads (%d KV) of %d, top %d "
                         "of %d experts, batch %d, context %d",
                         s.hidden, s.ffn, s.heads, s.kv_heads, s.head_dim, s.top_k, s.experts,
                         s.max_batch, s.max_context);
    fmoe_backend_bench *b = calloc(1, sizeof *b);
    if (!b) return fmoe_error_set(FMOE_ENOMEM, "backend timing");
    b->be = be;
    b->sh = s;
    b->seed = 2463534242u;
    const int64_t B = s.max_batch, h = s.hidden, J = s.experts, K = s.top_k, F = s.ffn;
    const int64_t qd = (int64_t)s.heads * s.head_dim, kd = (int64_t)s.kv_heads * s.head_dim;
    b->max_cols = h > qd ? h : qd;
    if (F > b->max_cols) b->max_cols = F;
    if (s.shared_ffn > b->max_cols) b->max_cols = s.shared_ffn;
    const fmoe__backend_limits lim = {.threads = threads, .max_cols = b->max_cols,
                                      .max_batch = s.max_batch, .max_context = s.max_context,
                                      .max_experts = (int32_t)(B * K),
                                      .activations = activations};
    int rc = be->init(&lim, &b->ctx);
    if (rc < 0) {
        b->ctx = NULL;
        fmoe_backend_bench_free(b);
        return rc;
    }
    const int64_t route_bytes = fmoe__routing_layout_of(B, h, J, K, 0).off[FMOE__ROUTE_PARTS];
    const int64_t sizes[] = {B * h * 4,  B * h * 4,   B * h * 4,  B * qd * 4, B * qd * 4,
                             B * kd * 4, B * kd * 4,  (int64_t)s.max_context * kd * 4,
                             (int64_t)s.max_context * kd * 4, B * (s.head_dim / 2) * 4,
                             B * (s.head_dim / 2) * 4, B * J * 4, route_bytes, B * h * 4,
                             B * h * 4, B * F * 4, B * F * 4};
    void **bufs[] = BENCH_BUFFERS(b);
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i] = be->alloc(b->ctx, sizes[i]))) {
            rc = be->host_memory ? fmoe_error_set(FMOE_ENOMEM, "backend timing: buffers")
                                 : FMOE_ENOMEM; /* the device's detail: asked and free */
            goto fail;
        }
    const int64_t nw = h > qd ? h : qd;
    b->norm_w = malloc((size_t)nw * sizeof *b->norm_w);
    b->rows_h = malloc((size_t)B * sizeof *b->rows_h);
    b->scale_h = malloc((size_t)B * sizeof *b->scale_h);
    b->t = malloc(MAX_REPS * sizeof *b->t);
    b->route_h = be->host_memory ? b->route : malloc((size_t)route_bytes);
    int64_t most = (int64_t)s.max_context * kd; /* the largest buffer filled below */
    const int64_t others[] = {B * h, B * qd, B * J, B * (s.head_dim / 2)};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        if (others[i] > most) most = others[i];
    float *host = malloc((size_t)most * sizeof *host);
    if (!b->norm_w || !b->rows_h || !b->scale_h || !b->t || !b->route_h || !host) {
        free(host);
        rc = fmoe_error_set(FMOE_ENOMEM, "backend timing");
        goto fail;
    }
    for (int64_t i = 0; i < nw; i++) b->norm_w[i] = 1.0f;
    for (int64_t i = 0; i < B; i++) b->rows_h[i] = (int32_t)i, b->scale_h[i] = 1.0f / (float)K;
    fill(b, b->x, B * h, host);
    fill(b, b->xn, B * h, host);
    fill(b, b->q, B * qd, host);
    fill(b, b->k, B * kd, host);
    fill(b, b->v, B * kd, host);
    fill(b, b->kc, s.max_context * kd, host);
    fill(b, b->vc, s.max_context * kd, host);
    fill(b, b->cos, B * (s.head_dim / 2), host);
    fill(b, b->sin, B * (s.head_dim / 2), host);
    fill(b, b->rlogits, B * J, host);
    rc = be->sync(b->ctx); /* the uploads have read `host` */
    free(host);
    if (rc < 0) goto fail;

    /* The expert in backend memory, as an executor's slot holds it (on a host-memory
     * backend that is host memory, as the CPU executor's experts are). */
    const int32_t er[3] = {(int32_t)F, (int32_t)F, (int32_t)h};
    const int32_t ec[3] = {(int32_t)h, (int32_t)h, (int32_t)F};
    fmoe__mat *ew[3] = {&b->expert.gate, &b->expert.up, &b->expert.down};
    for (int i = 0; i < 3; i++) {
        void *data = NULL;
        fmoe__mat w;
        if ((rc = make_matrix(er[i], ec[i], s.expert_dtype, &b->seed, &w, &data)) < 0) goto fail;
        const int64_t bytes = fmoe__mat_bytes(&w);
        void *slot = be->alloc(b->ctx, bytes);
        if (slot) be->upload(b->ctx, slot, data, bytes);
        rc = slot ? be->sync(b->ctx) : be->host_memory ? fmoe_error_set(FMOE_ENOMEM,
                                                                        "backend timing: expert")
                                                       : FMOE_ENOMEM;
        free(data);
        if (rc < 0) {
            if (slot) be->release(b->ctx, slot);
            goto fail;
        }
        w.data = slot;
        w.on_backend = !be->host_memory;
        *ew[i] = w;
    }
    /* its fence, recorded after each timed expert as the pass records a slot's; the timed
     * point's sync then waits for everything (time_point) */
    if (!(b->fence = be->fence_new(b->ctx))) {
        rc = FMOE_ENOMEM; /* the backend's detail */
        goto fail;
    }
    *out = b;
    return 0;
fail:
    fmoe_backend_bench_free(b);
    return rc;
}

/* ------------------------------------------------------------------ timing */

typedef int (*issue_fn)(fmoe_backend_bench *b, const void *arg, int32_t n, int32_t c);

/* The median time of issue(b, arg, n, c): per run, from an idle backend, `burst` issues
 * and a sync, over `burst` (the head comment says why a device's runs are bursts). */
static int time_point(fmoe_backend_bench *b, issue_fn issue, const void *arg, int32_t n,
                      int32_t c, int32_t reps, double *seconds) {
    int rc = issue(b, arg, n, c); /* untimed: first-use copies, kernel choices */
    if (rc == 0) rc = b->be->sync(b->ctx);
    if (rc < 0) return rc;
    if (reps < 1) reps = 1;
    const int32_t burst = b->be->host_memory ? 1 : FMOE__BENCH_DEVICE_BURST;
    int32_t k = 0;
    double total = 0;
    while (k < MAX_REPS && (k < reps || total < MIN_POINT_S)) {
        const double t0 = fmoe__now_s();
        for (int32_t i = 0; i < burst && rc == 0; i++) rc = issue(b, arg, n, c);
        if (rc == 0) rc = b->be->sync(b->ctx);
        if (rc < 0) return rc;
        const double run = fmoe__now_s() - t0;
        b->t[k++] = run / burst;
        total += run;
    }
    *seconds = fmoe__median(b->t, k);
    return 0;
}

static int check_tokens(const fmoe_backend_bench *b, const int32_t *tokens, int32_t n,
                        const char *what) {
    FMOE_RETURN_ERROR_IF(n < 1, FMOE_EINVAL, "backend timing: %s: no points", what);
    for (int32_t i = 0; i < n; i++)
        FMOE_RETURN_ERROR_IF(tokens[i] < 1 || tokens[i] > b->sh.max_batch, FMOE_EINVAL,
                             "backend timing: %s: %d tokens, outside [1, %d]", what, tokens[i],
                             b->sh.max_batch);
    return 0;
}

typedef struct chain {
    const fmoe__mat *w;
    int32_t mats;
    const float *x;
    float *y;
} chain;

static int issue_chain(fmoe_backend_bench *b, const void *arg, int32_t n, int32_t c) {
    (void)c;
    const chain *ch = arg;
    for (int32_t i = 0; i < ch->mats; i++) b->be->matmul(b->ctx, &ch->w[i], ch->x, n, ch->y);
    return 0;
}

int fmoe_backend_bench_chain(fmoe_backend_bench *b, const int32_t *rows, const int32_t *cols,
                             int32_t mats, const fmoe_dtype *dtypes, const int32_t *tokens,
                             int32_t n, int32_t reps, double *seconds) {
    FMOE_RETURN_ERROR_IF(mats < 1 || mats > 16, FMOE_EINVAL, "backend timing: %d matrices",
                         mats);
    FMOE_FORWARD_IF_ERROR(check_tokens(b, tokens, n, "products"));
    int64_t in_max = 1, out_max = 1;
    for (int32_t i = 0; i < mats; i++) {
        FMOE_RETURN_ERROR_IF(rows[i] < 1 || cols[i] < 1 || cols[i] > b->max_cols, FMOE_EINVAL,
                             "backend timing: matrix %d is %d x %d (widest %lld)", i, rows[i],
                             cols[i], (long long)b->max_cols);
        if (cols[i] > in_max) in_max = cols[i];
        if (rows[i] > out_max) out_max = rows[i];
    }
    fmoe__mat w[16];
    for (int32_t i = 0; i < mats; i++) {
        void *data = NULL;
        FMOE_FORWARD_IF_ERROR(make_matrix(rows[i], cols[i], dtypes[i], &b->seed, &w[i], &data));
        FMOE_FORWARD_IF_ERROR(own(b, data));
    }
    const int64_t B = b->sh.max_batch;
    float *x = b->be->alloc(b->ctx, B * in_max * 4);
    float *y = x ? b->be->alloc(b->ctx, B * out_max * 4) : NULL;
    int rc = 0;
    if (!x || !y) {
        rc = b->be->host_memory ? fmoe_error_set(FMOE_ENOMEM, "backend timing: products")
                                : FMOE_ENOMEM;
    } else {
        const chain ch = {.w = w, .mats = mats, .x = x, .y = y};
        for (int32_t p = 0; p < n && rc == 0; p++)
            rc = time_point(b, issue_chain, &ch, tokens[p], 0, reps, &seconds[p]);
    }
    b->be->release(b->ctx, x);
    b->be->release(b->ctx, y);
    return rc;
}

static int issue_expert(fmoe_backend_bench *b, const void *arg, int32_t n, int32_t c) {
    (void)arg, (void)c;
    const fmoe__expert_io io = {.xn = b->xn, .xg = b->xg, .g = b->g, .u = b->u, .yg = b->yg,
                                .acc = b->acc, .rows_h = b->rows_h, .scale_h = b->scale_h};
    return fmoe__expert_run(b->be, b->ctx, &io, &b->expert, n, b->sh.hidden, 1, b->fence);
}

/* seconds[p] = time_point of issue at tokens[p] rows, p < n. */
static int time_series(fmoe_backend_bench *b, issue_fn issue, const int32_t *tokens, int32_t n,
                       int32_t reps, double *seconds, const char *what) {
    FMOE_FORWARD_IF_ERROR(check_tokens(b, tokens, n, what));
    for (int32_t p = 0; p < n; p++)
        FMOE_FORWARD_IF_ERROR(time_point(b, issue, NULL, tokens[p], 0, reps, &seconds[p]));
    return 0;
}

int fmoe_backend_bench_expert(fmoe_backend_bench *b, const int32_t *tokens, int32_t n,
                              int32_t reps, double *seconds) {
    return time_series(b, issue_expert, tokens, n, reps, seconds, "expert");
}

static int issue_attention(fmoe_backend_bench *b, const void *arg, int32_t n, int32_t c) {
    (void)arg;
    const fmoe__attn_args a = {
        .q = b->q, .k_cache = b->kc, .v_cache = b->vc, .out = b->att, .n = n, .pos0 = c - n,
        .n_heads = b->sh.heads, .n_kv_heads = b->sh.kv_heads, .head_dim = b->sh.head_dim,
        .window = 0, .scale = 1.0f / sqrtf((float)b->sh.head_dim)};
    b->be->attention(b->ctx, &a);
    return 0;
}

int fmoe_backend_bench_attention(fmoe_backend_bench *b, const int32_t *tokens,
                                 const int32_t *contexts, int32_t n, int32_t reps,
                                 double *seconds) {
    FMOE_FORWARD_IF_ERROR(check_tokens(b, tokens, n, "attention"));
    for (int32_t p = 0; p < n; p++)
        FMOE_RETURN_ERROR_IF(contexts[p] < tokens[p] || contexts[p] > b->sh.max_context,
                             FMOE_EINVAL,
                             "backend timing: attention: %d tokens at a context of %d (at most "
                             "%d)", tokens[p], contexts[p], b->sh.max_context);
    for (int32_t p = 0; p < n; p++)
        FMOE_FORWARD_IF_ERROR(time_point(b, issue_attention, NULL, tokens[p], contexts[p], reps,
                                         &seconds[p]));
    return 0;
}

/* A MoE layer's ops besides its products, attention and experts, in forward.c's order
 * (attention_block, then moe_block with a routing hook), the tokens at the context's end. */
static int issue_overhead(fmoe_backend_bench *b, const void *arg, int32_t n, int32_t c) {
    (void)arg, (void)c;
    const fmoe__backend_ops *be = b->be;
    void *ctx = b->ctx;
    const fmoe_backend_bench_shape *s = &b->sh;
    const int32_t h = s->hidden, D = s->head_dim;
    const int64_t kd = (int64_t)s->kv_heads * D, pos = s->max_context - n;
    const fmoe__routing_io r = {
        .buf = b->route, .host = b->route_h,
        .lay = fmoe__routing_layout_of(n, h, s->experts, s->top_k, 0)};
    float *xn = fmoe__routing_part(b->route, &r.lay, FMOE__ROUTE_XN);
    be->rmsnorm(ctx, xn, b->x, b->norm_w, n, h, 1e-5f);
    be->rope(ctx, b->q, n, s->heads, D, b->cos, b->sin);
    be->rope(ctx, b->k, n, s->kv_heads, D, b->cos, b->sin);
    be->copy(ctx, b->kc + pos * kd, b->k, (int64_t)n * kd * 4);
    be->copy(ctx, b->vc + pos * kd, b->v, (int64_t)n * kd * 4);
    be->add(ctx, b->x, b->acc, (int64_t)n * h);
    be->rmsnorm(ctx, xn, b->x, b->norm_w, n, h, 1e-5f);
    const fmoe__route_args ra = {.n = n, .num_experts = s->experts, .top_k = s->top_k,
                                 .norm = 1, .norm_eps = 0, .scale = 1};
    be->route(ctx, &ra, b->rlogits, fmoe__routing_part(b->route, &r.lay, FMOE__ROUTE_PROBS),
              fmoe__routing_part(b->route, &r.lay, FMOE__ROUTE_TOPK),
              fmoe__routing_part(b->route, &r.lay, FMOE__ROUTE_TOPW));
    FMOE_FORWARD_IF_ERROR(fmoe__routing_to_host(be, ctx, &r, 1, 1, 0));
    be->zero(ctx, b->acc, (int64_t)n * h * 4);
    be->add(ctx, b->x, b->acc, (int64_t)n * h);
    return 0;
}

int fmoe_backend_bench_layer_overhead(fmoe_backend_bench *b, const int32_t *tokens, int32_t n,
                                      int32_t reps, double *seconds) {
    return time_series(b, issue_overhead, tokens, n, reps, seconds, "layer overhead");
}

const char *fmoe_backend_bench_backend(const fmoe_backend_bench *b) {
    return b ? b->be->name : "";
}
