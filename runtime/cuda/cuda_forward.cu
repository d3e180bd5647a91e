// cuda_forward.cu - the CUDA backend of the forward pass: every operation of
// fmoe__backend_ops (runtime/backend/backend_impl.h) on device 0, through cuBLAS for the matrix
// products and our own kernels for the rest. The per-row arithmetic is lib/rowwise.h and
// fmoe/elementwise.h, the same C the CPU backend runs (the CPU op is the reference each
// GPU op must match).
//
// Design
//
// Context. One per fmoe__backend_ops.init: a compute stream every op is queued on, in the
// order issued (the contract's "operations run in the order issued"); a copy stream for
// write_slot (and the fence waits before it) and the weight cache's uploads; a cuBLAS
// handle bound to the compute stream, default math (no TF32 for f32 GEMMs) and a workspace
// of our own, so no GEMM allocates; scratch sized from fmoe__backend_limits at init; a
// sticky error (the first failure of a queued op and its detail) that download and sync
// return. Once an error is recorded the void ops return at once: the pass's results are
// garbage anyway, and a faulted device would fail them all.
//
// Buffer lifetimes. alloc is cudaMalloc plus a memset on the compute stream that is
// waited for, so a zero-filled buffer is ready for any stream (the I/O context's copy
// stream included). release waits for the whole device before cudaFree, because a buffer
// of one context may be in use by another context's stream (expert slots). Scratch:
//   xh      [max_batch][max_cols] x converted to the weight's 16-bit type for a GEMM
//   rows    [max_batch]   token ids of get_rows
//   idx     [max_experts] row indices of gather_rows / scatter_add
//   scale   [max_experts] scales of scatter_add
//   scores  [attn_blocks][max_context] attention scores, only when a row of max_context
//           scores does not fit in shared memory (see attention below)
//   qtile   QUANT_TILE_BYTES of f32: rows of a quantized W dequantised for one SGEMM
//   ws      cuBLAS workspace
// Consecutive ops reuse the same scratch without waiting: every write into scratch and
// every read of it is queued on the one compute stream, so op i+1's upload into `idx`
// starts only after op i's kernel that read `idx` has finished. Nothing else touches it.
//
// Host arrays (*_host, upload's source). cudaMemcpyAsync from pageable memory returns once
// the bytes are staged, so the caller may reuse the array; from page-locked memory the
// copy would read the array later, so h2d() waits for the stream in that case (checked
// with cudaPointerGetAttributes). The contract's "read during the call only" holds either
// way.
//
// Weight cache. Weights come as host pointers into the mmapped checkpoint (fmoe__mat with
// on_backend 0) and host f32 vectors (norm weights, biases), alive as long as the model.
// The first op that uses one uploads it into an open-addressing hash map keyed by the host
// address; later uses find the device copy. A mat with on_backend 1 is already device
// memory (an expert slot) and is used as is. The map is the model's, not the context's
// (limits->weights, backend_impl.h): every context of one model (a server's sessions, an
// executor's) shares it, so each weight is copied once per process. It is created by the
// first init under `home_lock`, guarded by its own mutex, and freed by fmoe_model_free
// through cache_free; a context given no home (unit tests) owns a private one. Because
// another context's stream may use an entry as soon as it is in the map, an upload is
// complete before the entry is published: cudaMemcpyAsync on the uploading context's copy
// stream, then cudaStreamSynchronize of that stream, under the map's mutex (uploads happen
// once per weight, in the first passes; from pageable mmapped memory they are synchronous
// in effect anyway). Device memory running out here is the common failure on a big model;
// its detail says what to do.
//
// Expert slots, write_slot and fences. The executor's I/O thread calls write_slot with
// its own context, so each context owns its streams and write_slot touches no other
// context's state; cudaMemcpyAsync on the context's own copy stream and
// cudaStreamSynchronize of that stream return once the bytes have landed, so a slot the
// executor hands to the compute thread afterwards is complete. The other direction is the
// hazard: compute is queued, so when the pass tells the executor that expert (l, j) has
// run (on_expert_done), its GEMMs may still be pending, and a write_slot that reuses the
// slot could overwrite weights a queued GEMM has yet to read. A slot fence (backend_impl.h)
// is a cudaEvent without timing: the pass records the slot's after the expert's ops on
// the compute stream (fence_record), and the I/O thread makes its copy stream wait for it
// (fence_wait, cudaStreamWaitEvent) before the slot's write_slot, so the copy waits on the
// device for that slot's reads and nothing else, and no host thread waits for compute.
// cudaStreamWaitEvent waits for the event's latest cudaEventRecord in host order; the
// executor orders the two calls under its lock (offload.c, "Device slots"). An event
// never recorded is complete, so a wait on a slot never read waits for nothing. Nothing
// else needs such an order: weight cache entries are written once, before they are
// published, and replaced only after a device synchronize (weight_locked).
//
// Attention. One block of ATTN_THREADS threads per (query token t, head hq), as the CPU's
// attn_task: keys lo..pos (pos = pos0 + t, lo from the sliding window), scores q·k·scale
// by one warp per key, the softmax of fmoe_softmax_row (max subtracted, exp, sum, times
// 1/sum) with block reductions, then out[d] = Σ_p score[p]·v[p][d] in key order with one
// fused multiply-add per term, as the CPU's AVX2 axpy. The query head sits in shared
// memory; the scores too when (head_dim + 32 + keys) floats fit the device's opt-in shared
// memory per block (227 KiB on H100: about 57k keys); past that, a row per block of the
// `scores` scratch, with a grid of at most attn_blocks blocks looping over the tasks.
// head_dim is limited only by shared memory (the scratch is sized for head_dim <= 1024).
// A block keeps 128 threads whatever head_dim is: a correct kernel first; a tiled
// flash-style kernel (several queries of a KV head per block) is the fast one to come.
//
// Quantized weights (GGUF's block types with a formula in lib/quant_block.h: Q8_0 .. IQ4_XS,
// MXFP4 and the i-quants; cuda_quant.cu). A mat with quant set
// is cached, or sits in an expert slot, as the file's bytes: rows of ggml blocks, never
// repacked. matmul with at most FMOE_CUDA_QMV_MAX_N rows of x (decode) runs a kernel that
// dequantises each weight on the fly and sums in f32 in a fixed order, one warp per
// output row; with more rows (prefill), tiles of W's rows are dequantised to f32 into
// qtile and multiplied with SGEMM, as the CPU backend dequantises blocks of rows for
// sgemm. get_rows dequantises the requested rows. Every weight value is lib/quant_block.h's
// C, the CPU's dequantisation, so it is the CPU's bit for bit; products differ from the
// CPU's by summation order only. Other ggml types have no kernel and are refused in one
// line (mat_data).
//
// The ops of the families added later (docs/gpu.md, "New model families"): route runs
// fmoe_route_row_grouped (DeepSeek-V2/V3 and GLM-4.5's groups and score correction bias,
// Phi-3.5-MoE's sparsemixer) as the CPU does, one thread per token, the bias mapped like
// any model vector; rope_partial is the rope kernel over the first rot_dim of each head;
// layernorm is rmsnorm's block per row with fmoe_layernorm_row's sums; attention takes
// gpt-oss's sinks (one more logit in the max and the denominator); swiglu_clamped is
// element-wise; mla_attention checks its arguments here and queues cuda_mla.cu's kernels.
// Written to be checked first, like the rest; none of them has run on a GPU yet.
//
// Rounding. The module is compiled with --fmad=false (runtime/meson.build), so a*b+c in
// the shared row functions rounds twice, as on the CPU (gcc does not contract into FMA
// without -mfma); where the CPU's SIMD code fuses (attention's dot and axpy) the kernels
// call fmaf. What still differs from the CPU: expf and summation orders of parallel
// reductions, and the GEMMs (cuBLAS order; bf16/f16 weights multiply x rounded to the
// weight's type, accumulating in f32).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "quant_block.h"
#include "../backend/backend_impl.h"
#include "cuda_module.h"
#include "fmoe/error.h"
#include "rowwise.h"
}
#include "cuda_mla.h"
#include "cuda_quant.h"

#define ATTN_THREADS 128
#define ATTN_WARPS (ATTN_THREADS / 32)
#define ATTN_MAX_SCRATCH_D 1024             /* head_dim the global-scores path is sized for */
#define ATTN_SCRATCH_BYTES (256ll << 20)   /* at most this much for global score rows */
#define NORM_THREADS 256
#define EW_THREADS 256
#define ROWS_THREADS 256
#define ROW_FN_THREADS 64                  /* kernels running one row function per thread */
#define CUBLAS_WORKSPACE (32ll << 20)      /* cuBLAS's recommendation for Hopper */
#define QUANT_TILE_BYTES (32ll << 20)      /* f32 rows of a quantized W per cuBLAS call */
#define WEIGHT_MAP_INIT 1024

typedef struct weight_entry {
    const void *host; /* key: the model's host address; NULL marks an empty bucket */
    void *dev;        /* the device copy (NULL while a failed replacement left none) */
    int64_t bytes;
} weight_entry;

/* Device copies of one model's weights, shared by its contexts (fmoe__weight_home). */
typedef struct weight_cache {
    pthread_mutex_t lock; /* guards everything below */
    weight_entry *map;    /* [cap] open addressing, linear probing, load <= 1/2 */
    int64_t cap, count;
} weight_cache;

typedef struct cuda_ctx {
    cudaStream_t stream;       /* compute: every op but write_slot */
    cudaStream_t copy;         /* write_slot, behind the fence waits queued on it */
    cublasHandle_t blas;       /* bound to `stream` */
    cudaEvent_t *marks;        /* [max_marks] timer marks: timing events on `stream` */
    uint8_t *marked;           /* [max_marks] the mark has been recorded */
    int32_t max_marks;
    int64_t max_cols;
    int32_t max_batch, max_context, max_experts;
    int32_t attn_blocks;       /* rows of `scores` (0: no global scores) */
    int32_t smem_optin;        /* dynamic shared memory a block may use, bytes */
    void *xh;                  /* [max_batch][max_cols] bf16 or f16 */
    int32_t *rows;             /* [max_batch] */
    int32_t *idx;              /* [max_experts] */
    float *scale;              /* [max_experts] */
    float *scores;             /* [attn_blocks][max_context] */
    float *qtile;              /* [QUANT_TILE_BYTES / 4] f32: dequantised rows of W */
    void *ws;                  /* [CUBLAS_WORKSPACE] bytes */
    weight_cache *wc;          /* the model's (limits->weights), or owned_wc */
    weight_cache *owned_wc;    /* a private cache when init got no weight home */
    int err;                   /* the first failure (sticky), 0 while none */
    char detail[512];
} cuda_ctx;

/* Serialises the creation of a model's weight cache (fmoe__weight_home.cache). */
static pthread_mutex_t home_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---------------------------------------------------------------------------------- */
/* Errors                                                                             */
/* ---------------------------------------------------------------------------------- */

/* Records a failure: always in the calling thread's detail (what error_detail() hands
 * the loader), and as the context's sticky error when it is the first (c may be NULL). */
__attribute__((format(printf, 3, 4))) static int set_error(cuda_ctx *c, int code,
                                                           const char *fmt, ...) {
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (c && !c->err) {
        c->err = code;
        memcpy(c->detail, text, sizeof c->detail);
    }
    return fmoe_error_set(code, "%s", text);
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* The CHECK of every CUDA call: true on success; else records "file:line: call: why",
 * clears the runtime's last error (a handled failure must not resurface at the next
 * launch check) and returns false. */
static bool cuda_ok(cuda_ctx *c, cudaError_t e, const char *call, const char *file, int line) {
    if (e == cudaSuccess) return true;
    (void)cudaGetLastError();
    set_error(c, e == cudaErrorMemoryAllocation ? FMOE_ENOMEM : FMOE_EINTERNAL, "%s:%d: %s: %s",
              base_name(file), line, call, cudaGetErrorString(e));
    return false;
}

static bool blas_ok(cuda_ctx *c, cublasStatus_t s, const char *call, const char *file,
                    int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    set_error(c, s == CUBLAS_STATUS_ALLOC_FAILED ? FMOE_ENOMEM : FMOE_EINTERNAL,
              "%s:%d: %s: %s", base_name(file), line, call, cublasGetStatusString(s));
    return false;
}

#define CHECK_CUDA(c, call) cuda_ok((c), (call), #call, __FILE__, __LINE__)
#define CHECK_BLAS(c, call) blas_ok((c), (call), #call, __FILE__, __LINE__)
/* After every launch: a bad configuration shows here, a fault at the next sync. */
#define CHECK_LAUNCH(c, kernel)                                                           \
    cuda_ok((c), cudaGetLastError(), "launch " #kernel, __FILE__, __LINE__)

static double mib(int64_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* cudaMalloc with the out-of-memory detail the user can act on. */
static void *dev_malloc(cuda_ctx *c, int64_t bytes, const char *what) {
    void *p = NULL;
    const size_t size = bytes > 0 ? (size_t)bytes : 1;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaSuccess) return p;
    (void)cudaGetLastError();
    if (e == cudaErrorMemoryAllocation) {
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
        set_error(c, FMOE_ENOMEM,
                  "out of device memory: asked %.1f MiB (%s), %.1f MiB free of %.1f MiB; lower "
                  "--max-context (serve, record) or --max-new-tokens, offload experts "
                  "(--cache-experts) or use --backend cpu",
                  mib((int64_t)size), what, mib((int64_t)free_b), mib((int64_t)total_b));
    } else {
        set_error(c, FMOE_EINTERNAL, "cudaMalloc(%lld bytes, %s): %s", (long long)size, what,
                  cudaGetErrorString(e));
    }
    return NULL;
}

/* Host-to-device copy on the compute stream of a host array the caller may reuse as
 * soon as the op returns (see the design comment). */
static bool h2d(cuda_ctx *c, void *dst, const void *src, int64_t bytes) {
    if (!CHECK_CUDA(c, cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyHostToDevice,
                                       c->stream)))
        return false;
    cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, src) != cudaSuccess) {
        (void)cudaGetLastError();
        return true; /* not known to CUDA: pageable, staged before the call returned */
    }
    if (at.type == cudaMemoryTypeHost) /* page-locked: the DMA reads it later */
        return CHECK_CUDA(c, cudaStreamSynchronize(c->stream));
    return true;
}

/* ---------------------------------------------------------------------------------- */
/* Weight cache                                                                       */
/* ---------------------------------------------------------------------------------- */

static uint64_t hash_ptr(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* The bucket of `host`, or the empty bucket where it would go. */
static weight_entry *wmap_find(weight_entry *map, int64_t cap, const void *host) {
    int64_t i = (int64_t)(hash_ptr(host) & (uint64_t)(cap - 1));
    while (map[i].host && map[i].host != host) i = (i + 1) & (cap - 1);
    return &map[i];
}

static bool wmap_grow(cuda_ctx *c, weight_cache *wc) {
    const int64_t cap = wc->cap ? wc->cap * 2 : WEIGHT_MAP_INIT;
    weight_entry *map = (weight_entry *)calloc((size_t)cap, sizeof *map);
    if (!map) {
        set_error(c, FMOE_ENOMEM, "out of host memory for the CUDA weight map (%lld entries)",
                  (long long)cap);
        return false;
    }
    for (int64_t i = 0; i < wc->cap; i++)
        if (wc->map[i].host) *wmap_find(map, cap, wc->map[i].host) = wc->map[i];
    free(wc->map);
    wc->map = map;
    wc->cap = cap;
    return true;
}

static weight_cache *weight_cache_new(void) {
    weight_cache *wc = (weight_cache *)calloc(1, sizeof *wc);
    if (!wc) return NULL;
    if (pthread_mutex_init(&wc->lock, NULL) != 0) {
        free(wc);
        return NULL;
    }
    return wc;
}

/* fmoe__weight_home.cache_free: after every context of the model has been freed. */
static void weight_cache_free(void *p) {
    weight_cache *wc = (weight_cache *)p;
    if (!wc) return;
    for (int64_t i = 0; i < wc->cap; i++)
        if (wc->map[i].host) cudaFree(wc->map[i].dev);
    (void)cudaGetLastError();
    free(wc->map);
    pthread_mutex_destroy(&wc->lock);
    free(wc);
}

/* weight() with the cache's lock held. */
static const void *weight_locked(cuda_ctx *c, weight_cache *wc, const void *host,
                                 int64_t bytes, const char *what) {
    if ((wc->count + 1) * 2 > wc->cap && !wmap_grow(c, wc)) return NULL;
    weight_entry *e = wmap_find(wc->map, wc->cap, host);
    if (e->dev && e->bytes >= bytes) return e->dev;
    if (e->dev) {
        /* The same address seen before with fewer bytes (a view that starts where a
         * shorter one did): replace the copy once no queued op of any context reads the
         * old one. The entry keeps its key (with dev NULL until refilled): emptying a
         * bucket would break the probe chains that pass through it. */
        if (!CHECK_CUDA(c, cudaDeviceSynchronize())) return NULL;
        cudaFree(e->dev);
        e->dev = NULL;
        e->bytes = 0;
    }
    void *dev = dev_malloc(c, bytes, what);
    if (!dev) return NULL;
    /* Landed before it is published (design comment). */
    if (!CHECK_CUDA(c, cudaMemcpyAsync(dev, host, (size_t)bytes, cudaMemcpyHostToDevice,
                                       c->copy)) ||
        !CHECK_CUDA(c, cudaStreamSynchronize(c->copy))) {
        cudaFree(dev);
        return NULL;
    }
    if (!e->host) {
        e->host = host;
        wc->count++;
    }
    e->dev = dev;
    e->bytes = bytes;
    return dev;
}

/* The device copy of `bytes` of model memory at `host`, uploaded on first use by any
 * context of the model; NULL with the sticky error set on failure. */
static const void *weight(cuda_ctx *c, const void *host, int64_t bytes, const char *what) {
    if (!host) {
        set_error(c, FMOE_EINVAL, "%s: weight pointer is NULL", what);
        return NULL;
    }
    pthread_mutex_lock(&c->wc->lock);
    const void *dev = weight_locked(c, c->wc, host, bytes, what);
    pthread_mutex_unlock(&c->wc->lock);
    return dev;
}

static int64_t dtype_size(fmoe_st_dtype dt) {
    switch (dt) {
    case FMOE_ST_F32: return 4;
    case FMOE_ST_F16:
    case FMOE_ST_BF16: return 2;
    default: return 0;
    }
}

/* A mat's data on the device: as is when on_backend, else its cached copy. Quantized
 * mats keep their ggml blocks as the file stores them (rows of row_bytes). */
static const void *mat_data(cuda_ctx *c, const fmoe__mat *w, const char *what) {
    if (w->quant) {
        if (!fmoe__cuda_quant_has(w->quant)) {
            /* the number, not fmoe_ggml_type_name: this module links lib/error.c only */
            set_error(c, FMOE_EUNSUPPORTED, "%s: weights of ggml type %u: the CUDA backend "
                      "has no kernels for it; run this model with --backend cpu", what,
                      (unsigned)w->quant);
            return NULL;
        }
        const int64_t bv = fmoe__qblock_values(w->quant);
        if (w->cols % bv != 0) {
            set_error(c, FMOE_EINVAL, "%s: %lld columns of ggml type %u: not whole blocks of %lld",
                      what, (long long)w->cols, (unsigned)w->quant, (long long)bv);
            return NULL;
        }
        if (w->on_backend) return w->data;
        return weight(c, w->data, w->rows * (w->cols / bv) * fmoe__qblock_bytes(w->quant), what);
    }
    const int64_t es = dtype_size(w->dtype);
    if (!es) {
        set_error(c, FMOE_EUNSUPPORTED, "%s: weight dtype %d is not f32, f16 or bf16", what,
                  (int)w->dtype);
        return NULL;
    }
    if (w->on_backend) return w->data;
    return weight(c, w->data, w->rows * w->cols * es, what);
}

/* ---------------------------------------------------------------------------------- */
/* Device helpers                                                                     */
/* ---------------------------------------------------------------------------------- */

#include "cuda_reduce.cuh"

/* Blocks for a grid-stride loop over `count` items. */
static unsigned int blocks_for(int64_t count, int threads) {
    int64_t b = (count + threads - 1) / threads;
    if (b > (1 << 20)) b = 1 << 20;
    return (unsigned int)(b < 1 ? 1 : b);
}

/* Threads for a block that walks one row of `dim` values. */
static int row_threads(int64_t dim) {
    return dim < ROWS_THREADS ? 32 * (int)((dim + 31) / 32) : ROWS_THREADS;
}

/* ---------------------------------------------------------------------------------- */
/* Kernels                                                                            */
/* ---------------------------------------------------------------------------------- */

/* y[i][c] = w[rows[i]][c] as f32: one block per row. */
__global__ static void get_rows_kernel(float *y, const void *w, int32_t dtype,
                                       const int32_t *rows, int64_t cols) {
    const int64_t i = blockIdx.x, r = rows[i];
    float *yr = y + i * cols;
    if (dtype == FMOE_ST_F32) {
        const float *wr = (const float *)w + r * cols;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = wr[c];
    } else if (dtype == FMOE_ST_BF16) {
        const uint16_t *wr = (const uint16_t *)w + r * cols;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
            yr[c] = __uint_as_float((uint32_t)wr[c] << 16); /* fmoe_bf16_to_float */
    } else {
        const __half *wr = (const __half *)w + r * cols;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = __half2float(wr[c]);
    }
}

/* fmoe_rmsnorm_row with a block per row: the sum of squares in double (its order does
 * not change the float result, as rowwise.h notes), then the same two roundings. */
__global__ static void rmsnorm_kernel(float *y, const float *x, const float *w, int64_t rows,
                                      int32_t dim, float eps) {
    __shared__ double red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim; /* may be xr: each value is read before it is written */
        double ss = 0.0;
        for (int32_t i = threadIdx.x; i < dim; i += blockDim.x)
            ss += (double)xr[i] * (double)xr[i];
        ss = block_sum(ss, red);
        const float inv = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
        for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w[i] * (xr[i] * inv);
    }
}

__global__ static void to_bf16_kernel(__nv_bfloat16 *y, const float *x, int64_t count) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

__global__ static void to_f16_kernel(__half *y, const float *x, int64_t count) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2half_rn(x[i]);
}

/* y[t][i] += b[i] over count = n·d values. */
__global__ static void add_bias_kernel(float *y, const float *b, int64_t d, int64_t count) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < count;
         e += (int64_t)gridDim.x * blockDim.x)
        y[e] += b[e % d];
}

__global__ static void clamp_kernel(float *y, int64_t count, float c) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = y[i] < -c ? -c : y[i] > c ? c : y[i];
}

/* fmoe_rope_head over the first rot_dim of each head_dim-wide head, per (t, head): one
 * thread each (rot_dim = head_dim: the whole head; less: GLM-4.5's partial rotary). */
__global__ static void rope_kernel(float *x, int32_t n, int32_t heads, int32_t head_dim,
                                   int32_t rot_dim, const float *cos, const float *sin) {
    const int64_t task = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (task >= (int64_t)n * heads) return;
    const int64_t t = task / heads, half = rot_dim / 2;
    fmoe_rope_head(x + task * head_dim, cos + t * half, sin + t * half, rot_dim);
}

/* fmoe_layernorm_row with a block per row: mean and squared deviations summed in double,
 * as the row function (whose comment says why the order then does not change the float
 * result), then its roundings. */
__global__ static void layernorm_kernel(float *y, const float *x, const float *w,
                                        const float *b, int64_t rows, int32_t dim, float eps) {
    __shared__ double red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim; /* may be xr: every value is read before any is written */
        double sum = 0.0;
        for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) sum += (double)xr[i];
        const double mean = block_sum(sum, red) / (double)dim;
        double ss = 0.0;
        for (int32_t i = threadIdx.x; i < dim; i += blockDim.x)
            ss += ((double)xr[i] - mean) * ((double)xr[i] - mean);
        ss = block_sum(ss, red);
        const float inv = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
        const float mu = (float)mean;
        for (int32_t i = threadIdx.x; i < dim; i += blockDim.x)
            yr[i] = w[i] * ((xr[i] - mu) * inv) + b[i];
    }
}

/* fmoe_route_row_grouped per row, as the CPU's cpu_route calls it: one thread each;
 * probs, topk, topw written in place, a.choice the biased, masked scores (a.bias: the
 * device copy of the model's vector). */
__global__ static void route_kernel(fmoe__route_args a, const float *logits, float *probs,
                                    int32_t *topk, float *topw) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= a.n) return;
    const int64_t J = a.num_experts, K = a.top_k;
    const int plain = a.n_group <= 1 && !a.bias && !a.sparsemixer;
    fmoe_route_row_grouped(logits + t * J, a.num_experts, a.top_k, a.sigmoid, a.norm,
                           a.norm_eps, a.scale, a.n_group, a.topk_group, a.group_top2, a.bias,
                           a.sparsemixer, a.jitter_eps, probs + t * J,
                           plain ? probs + t * J : a.choice + t * J, topk + t * K, topw + t * K);
}

/* Gate probabilities per row: one thread each. */
__global__ static void probs_kernel(float *y, int64_t y_stride, const float *x, int32_t n,
                                    int32_t J, int32_t sigmoid) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    float *yr = y + t * y_stride;
    const float *xr = x + t * J;
    if (sigmoid)
        for (int32_t j = 0; j < J; j++) yr[j] = fmoe_sigmoid(xr[j]);
    else
        fmoe_softmax_row(yr, xr, J);
}

__global__ static void swiglu_kernel(float *g, const float *u, int64_t count) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        g[i] = fmoe_swiglu(g[i], u[i]);
}

__global__ static void swiglu_clamped_kernel(float *g, const float *u, int64_t count,
                                             float alpha, float limit) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        g[i] = fmoe_swiglu_clamped(g[i], u[i], alpha, limit);
}

/* dst[i] = src[idx[i]]: one block per row. */
__global__ static void gather_kernel(float *dst, const float *src, const int32_t *idx,
                                     int32_t dim) {
    const int64_t i = blockIdx.x;
    const float *s = src + (int64_t)idx[i] * dim;
    float *d = dst + i * dim;
    for (int32_t c = threadIdx.x; c < dim; c += blockDim.x) d[c] = s[c];
}

/* acc[idx[i]] += scale[i]·src[i]: one block per row; the rows are distinct, so no two
 * blocks write the same value. */
__global__ static void scatter_add_kernel(float *acc, const float *src, const int32_t *idx,
                                          const float *scale, int32_t dim) {
    const int64_t i = blockIdx.x;
    float *a = acc + (int64_t)idx[i] * dim;
    const float *s = src + i * dim;
    const float w = scale[i];
    for (int32_t c = threadIdx.x; c < dim; c += blockDim.x) a[c] += w * s[c];
}

__global__ static void add_kernel(float *y, const float *x, int64_t count) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

/* y[t][i] += sigmoid(gate[t])·x[t][i] over count = n·dim values. */
__global__ static void add_gated_kernel(float *y, const float *x, const float *gate,
                                        int32_t dim, int64_t count) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < count;
         e += (int64_t)gridDim.x * blockDim.x)
        y[e] += fmoe_sigmoid(gate[e / dim]) * x[e];
}

/*
 * Attention (design comment): blocks of ATTN_THREADS loop over tasks = n·n_heads, task =
 * t·n_heads + hq as the CPU's attn_task. Dynamic shared memory: qs[D], red[32], and
 * sc[keys] when `scores` is NULL; else sc is row blockIdx.x of scores[gridDim.x][ld].
 * Every branch on m or mx is uniform across the block, so the barriers inside are met by
 * all threads.
 */
__global__ static void __launch_bounds__(ATTN_THREADS)
    attention_kernel(fmoe__attn_args a, float *scores, int64_t scores_ld, int32_t tasks) {
    extern __shared__ float smem[];
    const int32_t D = a.head_dim;
    float *qs = smem;
    float *red = smem + D;
    float *sc = scores ? scores + (int64_t)blockIdx.x * scores_ld : smem + D + 32;
    const int32_t group = a.n_heads / a.n_kv_heads;
    const int64_t kv_stride = (int64_t)a.n_kv_heads * D;
    const int32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int32_t task = blockIdx.x; task < tasks; task += gridDim.x) {
        const int32_t t = task / a.n_heads, hq = task % a.n_heads, hk = hq / group;
        const int32_t pos = a.pos0 + t;
        int32_t lo = 0;
        if (a.window > 0 && pos - a.window + 1 > 0) lo = pos - a.window + 1;
        const int32_t m = pos - lo + 1; /* keys lo..pos */
        const int64_t qoff = (int64_t)t * a.n_heads * D + (int64_t)hq * D;
        for (int32_t d = threadIdx.x; d < D; d += blockDim.x) qs[d] = a.q[qoff + d];
        __syncthreads();

        const float *kb = a.k_cache + (int64_t)lo * kv_stride + (int64_t)hk * D;
        for (int32_t p = warp; p < m; p += ATTN_WARPS) {
            const float *k = kb + (int64_t)p * kv_stride;
            float s = 0.0f;
            for (int32_t d = lane; d < D; d += 32) s = fmaf(qs[d], k[d], s);
            s = warp_sum(s);
            if (lane == 0) sc[p] = s * a.scale;
        }
        __syncthreads();

        float mx = -INFINITY;
        for (int32_t p = threadIdx.x; p < m; p += blockDim.x) mx = sc[p] > mx ? sc[p] : mx;
        mx = block_max(mx, red);
        /* gpt-oss's sink (fmoe_softmax_row_sink): one more logit in the max and the sum,
         * no value; with it a row is never fully masked */
        const float sink = a.sinks ? a.sinks[hq] : -INFINITY;
        if (a.sinks) mx = mx > sink ? mx : sink;
        float *out = a.out + qoff;
        if (mx == -INFINITY) { /* a fully masked row: fmoe_softmax_row gives zeros */
            for (int32_t d = threadIdx.x; d < D; d += blockDim.x) out[d] = 0.0f;
        } else {
            float sum = 0.0f;
            for (int32_t p = threadIdx.x; p < m; p += blockDim.x) {
                const float e = expf(sc[p] - mx);
                sc[p] = e;
                sum += e;
            }
            sum = block_sum(sum, red);
            if (a.sinks) sum += expf(sink - mx);
            const float inv = 1.0f / sum;
            for (int32_t p = threadIdx.x; p < m; p += blockDim.x) sc[p] *= inv;
            __syncthreads();
            const float *vb = a.v_cache + (int64_t)lo * kv_stride + (int64_t)hk * D;
            for (int32_t d = threadIdx.x; d < D; d += blockDim.x) {
                float acc = 0.0f;
                for (int32_t p = 0; p < m; p++)
                    acc = fmaf(sc[p], vb[(int64_t)p * kv_stride + d], acc);
                out[d] = acc;
            }
        }
        __syncthreads(); /* qs, sc and red are rewritten by the next task */
    }
}

/* ---------------------------------------------------------------------------------- */
/* Lifetime                                                                           */
/* ---------------------------------------------------------------------------------- */

static int driver_too_old(int drv, int rt) {
    return fmoe_error_set(FMOE_EUNSUPPORTED,
                          "CUDA driver %d.%d is older than the runtime %d.%d this fmoe was "
                          "built with; update the driver",
                          drv / 1000, (drv % 1000) / 10, rt / 1000, (rt % 1000) / 10);
}

/*
 * Whether device 0 can run the backend: 0, or FMOE_EUNSUPPORTED with why ("no CUDA
 * device", or a driver older than the runtime). A driver of the runtime's major version
 * but an older minor one runs it (CUDA minor version compatibility: we ship SASS for
 * sm_80 and sm_90, which needs no JIT), so only a refusal or an older major fails.
 */
extern "C" int fmoe__cuda_module_probe(void) {
    int drv = 0, rt = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = 0;
    (void)cudaGetLastError();
    if (drv == 0) return fmoe_error_set(FMOE_EUNSUPPORTED, "no CUDA device (no NVIDIA driver)");
    if (drv / 1000 < rt / 1000) return driver_too_old(drv, rt);
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();
    if (e == cudaErrorInsufficientDriver) return driver_too_old(drv, rt);
    if (e != cudaSuccess)
        return fmoe_error_set(FMOE_EUNSUPPORTED, "no CUDA device (%s)", cudaGetErrorString(e));
    if (n == 0) return fmoe_error_set(FMOE_EUNSUPPORTED, "no CUDA device");
    return 0;
}

static void cuda_free(void *ctx) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!c) return;
    /* Nothing queued may still read what is freed below. Errors are moot here. */
    if (c->stream) cudaStreamSynchronize(c->stream);
    if (c->copy) cudaStreamSynchronize(c->copy);
    weight_cache_free(c->owned_wc); /* the model's cache outlives its contexts */
    cudaFree(c->scores);
    cudaFree(c->qtile);
    cudaFree(c->scale);
    cudaFree(c->idx);
    cudaFree(c->rows);
    cudaFree(c->xh);
    if (c->blas) cublasDestroy(c->blas);
    cudaFree(c->ws);
    for (int32_t i = 0; c->marks && i < c->max_marks; i++)
        if (c->marks[i]) cudaEventDestroy(c->marks[i]);
    free(c->marks);
    free(c->marked);
    if (c->copy) cudaStreamDestroy(c->copy);
    if (c->stream) cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    free(c);
}

static int cuda_init(const fmoe__backend_limits *lim, void **out) {
    *out = NULL;
    // Refused, never ignored: the quantized kernels (cuda_quant.cu) take f32 inputs, and a
    // run that asked for 8-bit ones must not compute f32 ones without a word
    // (fmoe_session_init says so first; this guards callers of the table itself).
    if (lim->activations != FMOE_ACTIVATIONS_F32)
        return fmoe_error_set(FMOE_EUNSUPPORTED, "CUDA backend: activations other than f32 "
                              "(%d): its quantized kernels take f32 inputs",
                              (int)lim->activations);
    int rc = fmoe__cuda_module_probe();
    if (rc < 0) return rc;
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!c) return fmoe_error_set(FMOE_ENOMEM, "out of memory");
    c->max_cols = lim->max_cols > 0 ? lim->max_cols : 1;
    c->max_batch = lim->max_batch > 0 ? lim->max_batch : 1;
    c->max_context = lim->max_context > 0 ? lim->max_context : 1;
    c->max_experts = lim->max_experts > 0 ? lim->max_experts : 1;

    int sms = 0, optin = 0;
    if (lim->weights) {
        fmoe__weight_home *home = lim->weights;
        pthread_mutex_lock(&home_lock);
        if (!home->cache) {
            home->cache = weight_cache_new();
            if (home->cache) home->cache_free = weight_cache_free;
        }
        const bool ours = home->cache && home->cache_free == weight_cache_free;
        c->wc = ours ? (weight_cache *)home->cache : NULL;
        pthread_mutex_unlock(&home_lock);
        if (!c->wc) {
            if (home->cache)
                set_error(c, FMOE_EINTERNAL, "the model's weight cache belongs to another backend");
            else
                set_error(c, FMOE_ENOMEM, "out of memory for the CUDA weight cache");
            goto fail;
        }
    } else {
        if (!(c->wc = c->owned_wc = weight_cache_new())) {
            set_error(c, FMOE_ENOMEM, "out of memory for the CUDA weight cache");
            goto fail;
        }
    }
    if (!CHECK_CUDA(c, cudaSetDevice(0))) goto fail;
    if (!CHECK_CUDA(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking))) goto fail;
    if (!CHECK_CUDA(c, cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking))) goto fail;
    if (lim->max_marks > 0) {
        c->marks = (cudaEvent_t *)calloc((size_t)lim->max_marks, sizeof *c->marks);
        c->marked = (uint8_t *)calloc((size_t)lim->max_marks, 1);
        if (!c->marks || !c->marked) {
            set_error(c, FMOE_ENOMEM, "out of memory for %d timer marks", lim->max_marks);
            goto fail;
        }
        c->max_marks = lim->max_marks; /* from here cuda_free destroys the events made */
        for (int32_t i = 0; i < c->max_marks; i++)
            if (!CHECK_CUDA(c, cudaEventCreateWithFlags(&c->marks[i], cudaEventDefault)))
                goto fail;
    }
    if (!(c->ws = dev_malloc(c, CUBLAS_WORKSPACE, "cuBLAS workspace"))) goto fail;
    if (!CHECK_BLAS(c, cublasCreate(&c->blas))) goto fail;
    /* cublasSetStream resets the workspace to cuBLAS's own pool: set ours after it. */
    if (!CHECK_BLAS(c, cublasSetStream(c->blas, c->stream))) goto fail;
    if (!CHECK_BLAS(c, cublasSetWorkspace(c->blas, c->ws, (size_t)CUBLAS_WORKSPACE))) goto fail;
    if (!CHECK_BLAS(c, cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH))) goto fail;

    if (!(c->xh = dev_malloc(c, (int64_t)c->max_batch * c->max_cols * 2, "GEMM input scratch")))
        goto fail;
    if (!(c->rows = (int32_t *)dev_malloc(c, (int64_t)c->max_batch * 4, "row index scratch")))
        goto fail;
    if (!(c->idx = (int32_t *)dev_malloc(c, (int64_t)c->max_experts * 4, "index scratch")))
        goto fail;
    if (!(c->scale = (float *)dev_malloc(c, (int64_t)c->max_experts * 4, "scale scratch")))
        goto fail;
    if (!(c->qtile = (float *)dev_malloc(c, QUANT_TILE_BYTES, "dequantisation tile")))
        goto fail;

    if (!CHECK_CUDA(c, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0)))
        goto fail;
    if (!CHECK_CUDA(c, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0)))
        goto fail;
    if (optin > 48 * 1024 &&
        !CHECK_CUDA(c, cudaFuncSetAttribute(attention_kernel,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, optin)))
        goto fail;
    c->smem_optin = optin > 48 * 1024 ? optin : 48 * 1024;
    /* Global score rows only where a full row of scores might not fit in shared memory. */
    if (((int64_t)c->max_context + 32 + ATTN_MAX_SCRATCH_D) * 4 > c->smem_optin) {
        int64_t blocks = ATTN_SCRATCH_BYTES / ((int64_t)c->max_context * 4);
        if (blocks > 2ll * sms) blocks = 2ll * sms;
        if (blocks < 1) blocks = 1;
        c->attn_blocks = (int32_t)blocks;
        if (!(c->scores = (float *)dev_malloc(c, blocks * c->max_context * 4,
                                              "attention score scratch")))
            goto fail;
    }

    *out = c;
    return 0;
fail:
    rc = c->err ? c->err : FMOE_EINTERNAL;
    {
        char detail[sizeof c->detail];
        memcpy(detail, c->detail, sizeof detail);
        cuda_free(c);
        return fmoe_error_set(rc, "%s", detail);
    }
}

static void *cuda_alloc(void *ctx, int64_t bytes) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    void *p = dev_malloc(NULL, bytes, "a backend buffer");
    if (!p) return NULL;
    /* Zero-filled for every stream: wait for the memset (alloc is not a hot path). */
    const size_t size = bytes > 0 ? (size_t)bytes : 1;
    if (!CHECK_CUDA(NULL, cudaMemsetAsync(p, 0, size, c->stream)) ||
        !CHECK_CUDA(NULL, cudaStreamSynchronize(c->stream))) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_release(void *ctx, void *p) {
    (void)ctx;
    if (!p) return;
    /* Any context's stream may still use the buffer (slots are shared). */
    cudaDeviceSynchronize();
    cudaFree(p);
    (void)cudaGetLastError();
}

/* ---------------------------------------------------------------------------------- */
/* Transfers                                                                          */
/* ---------------------------------------------------------------------------------- */

static void cuda_upload(void *ctx, void *dst, const void *src_host, int64_t bytes) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || bytes <= 0) return;
    h2d(c, dst, src_host, bytes);
}

static int cuda_download(void *ctx, void *dst_host, const void *src, int64_t bytes) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!c->err && bytes > 0)
        CHECK_CUDA(c, cudaMemcpyAsync(dst_host, src, (size_t)bytes, cudaMemcpyDeviceToHost,
                                      c->stream));
    if (!c->err) CHECK_CUDA(c, cudaStreamSynchronize(c->stream));
    if (c->err) return fmoe_error_set(c->err, "%s", c->detail);
    return 0;
}

static void cuda_copy(void *ctx, void *dst, const void *src, int64_t bytes) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || bytes <= 0) return;
    CHECK_CUDA(c, cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, c->stream));
}

static void cuda_zero(void *ctx, void *dst, int64_t bytes) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || bytes <= 0) return;
    CHECK_CUDA(c, cudaMemsetAsync(dst, 0, (size_t)bytes, c->stream));
}

static int cuda_sync(void *ctx) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!c->err) CHECK_CUDA(c, cudaStreamSynchronize(c->stream));
    if (c->err) return fmoe_error_set(c->err, "%s", c->detail);
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* Timers                                                                             */
/* ---------------------------------------------------------------------------------- */

// A mark is a timing event recorded on the compute stream: the device stamps it when the
// ops before it have finished, and the host does not wait. The forward pass marks each
// layer's end and reads the intervals after its last sync, so timing a record costs no
// host round trip per layer (backend_impl.h). Misuse (a slot out of range, an elapsed read
// before its marks were reached) is the caller's error, not the device's: not sticky.

static void cuda_mark(void *ctx, int32_t slot) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || slot < 0 || slot >= c->max_marks) return;
    if (CHECK_CUDA(c, cudaEventRecord(c->marks[slot], c->stream))) c->marked[slot] = 1;
}

static int cuda_elapsed(void *ctx, int32_t a, int32_t b, double *seconds) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err) return fmoe_error_set(c->err, "%s", c->detail);
    if (a < 0 || a >= c->max_marks || b < 0 || b >= c->max_marks)
        return set_error(NULL, FMOE_EINVAL, "elapsed: marks %d and %d, slots are [0, %d)", a,
                         b, c->max_marks);
    if (!c->marked[a] || !c->marked[b])
        return set_error(NULL, FMOE_EINVAL, "elapsed: mark %d was never recorded",
                         c->marked[a] ? b : a);
    float ms = 0;
    const cudaError_t e = cudaEventElapsedTime(&ms, c->marks[a], c->marks[b]);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return set_error(NULL, FMOE_EINVAL,
                         "elapsed: marks %d and %d not reached yet (read before a sync)", a, b);
    }
    if (!cuda_ok(NULL, e, "cudaEventElapsedTime", __FILE__, __LINE__)) return FMOE_EINTERNAL;
    *seconds = (double)ms * 1e-3;
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* Compute                                                                            */
/* ---------------------------------------------------------------------------------- */

static void cuda_get_rows(void *ctx, const fmoe__mat *w, const int32_t *rows_host, int32_t n,
                          float *y) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || n <= 0 || w->cols <= 0) return;
    if (n > c->max_batch) {
        set_error(c, FMOE_EINVAL, "get_rows: %d rows, more than max_batch %d", n, c->max_batch);
        return;
    }
    for (int32_t i = 0; i < n; i++)
        if (rows_host[i] < 0 || rows_host[i] >= w->rows) {
            set_error(c, FMOE_EINVAL, "get_rows: row %d outside [0, %lld)", rows_host[i],
                      (long long)w->rows);
            return;
        }
    const void *W = mat_data(c, w, "embedding");
    if (!W || !h2d(c, c->rows, rows_host, (int64_t)n * 4)) return;
    if (w->quant) {
        if (!CHECK_CUDA(c, fmoe__cuda_quant_get_rows(c->stream, w->quant, W, c->rows, n, w->cols,
                                                     y)))
            return;
    } else {
        get_rows_kernel<<<(unsigned)n, row_threads(w->cols), 0, c->stream>>>(
            y, W, (int32_t)w->dtype, c->rows, w->cols);
        if (!CHECK_LAUNCH(c, get_rows_kernel)) return;
    }
}

static void cuda_rmsnorm(void *ctx, float *y, const float *x, const float *w, int64_t rows,
                         int32_t dim, float eps) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || rows <= 0 || dim <= 0) return;
    const float *W = (const float *)weight(c, w, (int64_t)dim * 4, "rmsnorm weight");
    if (!W) return;
    const unsigned grid = (unsigned)(rows < 65535 ? rows : 65535);
    rmsnorm_kernel<<<grid, NORM_THREADS, 0, c->stream>>>(y, x, W, rows, dim, eps);
    CHECK_LAUNCH(c, rmsnorm_kernel);
}

/*
 * The quantized product (design comment, "Quantized weights"): up to FMOE_CUDA_QMV_MAX_N
 * rows of x in one on-the-fly pass over the blocks; more, tiles of W's rows dequantised
 * into qtile and multiplied with SGEMM as cuda_matmul's f32 case (tile rows r0.. write
 * the R×n column-major y at y + r0, ld R). Stream order makes reusing qtile safe: the
 * next tile's dequantiser runs after the previous SGEMM has read it.
 */
static bool quant_matmul(cuda_ctx *c, const fmoe__mat *w, const void *W, const float *x,
                         int32_t n, float *y) {
    const int64_t R = w->rows, C = w->cols;
    if (n <= FMOE_CUDA_QMV_MAX_N)
        return CHECK_CUDA(c, fmoe__cuda_quant_matvec(c->stream, w->quant, W, R, C, x, n, y));
    const int64_t row_bytes = C / fmoe__qblock_values(w->quant) * fmoe__qblock_bytes(w->quant);
    int64_t tile = QUANT_TILE_BYTES / 4 / C;
    if (tile > R) tile = R;
    if (tile < 1) {
        set_error(c, FMOE_EUNSUPPORTED, "matmul: a row of %lld quantized values does not fit "
                  "the %lld MiB dequantisation tile", (long long)C, QUANT_TILE_BYTES >> 20);
        return false;
    }
    const float one = 1.0f, zero = 0.0f;
    for (int64_t r0 = 0; r0 < R; r0 += tile) {
        const int64_t nb = r0 + tile < R ? tile : R - r0;
        if (!CHECK_CUDA(c, fmoe__cuda_quant_dequant_rows(c->stream, w->quant,
                                                         (const uint8_t *)W + r0 * row_bytes, nb,
                                                         C, c->qtile)) ||
            !CHECK_BLAS(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nb, n, (int)C,
                                       &one, c->qtile, (int)C, x, (int)C, &zero, y + r0,
                                       (int)R)))
            return false;
    }
    return true;
}

/*
 * y[n][R] = x[n][C]·Wᵀ, W row-major [R][C]. cuBLAS is column-major: the bytes of W are
 * the C×R matrix Wᵀ (ld C), those of x the C×n matrix xᵀ (ld C), those of y the R×n
 * matrix yᵀ (ld R); yᵀ = W·xᵀ = op_T(Wᵀ)·xᵀ, so transa = T, transb = N, m = R, n = n,
 * k = C.
 */
static void cuda_matmul(void *ctx, const fmoe__mat *w, const float *x, int32_t n, float *y) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || n <= 0 || w->rows <= 0 || w->cols <= 0) return;
    const int64_t R = w->rows, C = w->cols;
    if (R > INT_MAX || C > INT_MAX) {
        set_error(c, FMOE_EUNSUPPORTED, "matmul: a %lld x %lld matrix is too large for cuBLAS",
                  (long long)R, (long long)C);
        return;
    }
    const void *W = mat_data(c, w, "matrix");
    if (!W) return;
    const float one = 1.0f, zero = 0.0f;
    if (w->quant) {
        if (!quant_matmul(c, w, W, x, n, y)) return;
    } else if (w->dtype == FMOE_ST_F32) {
        if (!CHECK_BLAS(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)R, n, (int)C,
                                       &one, (const float *)W, (int)C, x, (int)C, &zero, y,
                                       (int)R)))
            return;
    } else {
        if (n > c->max_batch || C > c->max_cols) {
            set_error(c, FMOE_EINVAL, "matmul: x is %d x %lld, the limits are %d x %lld", n,
                      (long long)C, c->max_batch, (long long)c->max_cols);
            return;
        }
        const int64_t count = (int64_t)n * C;
        const bool bf = w->dtype == FMOE_ST_BF16;
        if (bf)
            to_bf16_kernel<<<blocks_for(count, EW_THREADS), EW_THREADS, 0, c->stream>>>(
                (__nv_bfloat16 *)c->xh, x, count);
        else
            to_f16_kernel<<<blocks_for(count, EW_THREADS), EW_THREADS, 0, c->stream>>>(
                (__half *)c->xh, x, count);
        if (!CHECK_LAUNCH(c, to_16bit_kernel)) return;
        const cudaDataType dt = bf ? CUDA_R_16BF : CUDA_R_16F;
        if (!CHECK_BLAS(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)R, n, (int)C,
                                        &one, W, dt, (int)C, c->xh, dt, (int)C, &zero, y,
                                        CUDA_R_32F, (int)R, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT)))
            return;
    }
}

static void cuda_add_bias(void *ctx, float *y, const float *b, int32_t n, int64_t d) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || !b || n <= 0 || d <= 0) return;
    const float *B = (const float *)weight(c, b, d * 4, "bias");
    if (!B) return;
    const int64_t count = (int64_t)n * d;
    add_bias_kernel<<<blocks_for(count, EW_THREADS), EW_THREADS, 0, c->stream>>>(y, B, d, count);
    CHECK_LAUNCH(c, add_bias_kernel);
}

static void cuda_clamp(void *ctx, float *y, int64_t count, float cl) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || count <= 0) return;
    clamp_kernel<<<blocks_for(count, EW_THREADS), EW_THREADS, 0, c->stream>>>(y, count, cl);
    CHECK_LAUNCH(c, clamp_kernel);
}

static void cuda_rope_partial(void *ctx, float *x, int32_t n, int32_t heads, int32_t head_dim,
                              int32_t rot_dim, const float *cos, const float *sin) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || n <= 0 || heads <= 0 || head_dim <= 0) return;
    if (rot_dim <= 0 || rot_dim > head_dim || rot_dim % 2 != 0) {
        set_error(c, FMOE_EINVAL, "rope: %d rotated dims of a head of %d", rot_dim, head_dim);
        return;
    }
    const int64_t tasks = (int64_t)n * heads;
    rope_kernel<<<(unsigned)((tasks + ROW_FN_THREADS - 1) / ROW_FN_THREADS), ROW_FN_THREADS, 0,
                  c->stream>>>(x, n, heads, head_dim, rot_dim, cos, sin);
    CHECK_LAUNCH(c, rope_kernel);
}

static void cuda_rope(void *ctx, float *x, int32_t n, int32_t heads, int32_t head_dim,
                      const float *cos, const float *sin) {
    cuda_rope_partial(ctx, x, n, heads, head_dim, head_dim, cos, sin);
}

static void cuda_layernorm(void *ctx, float *y, const float *x, const float *w, const float *b,
                           int64_t rows, int32_t dim, float eps) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || rows <= 0 || dim <= 0) return;
    const float *W = (const float *)weight(c, w, (int64_t)dim * 4, "layernorm weight");
    const float *B = W ? (const float *)weight(c, b, (int64_t)dim * 4, "layernorm bias") : NULL;
    if (!B) return;
    const unsigned grid = (unsigned)(rows < 65535 ? rows : 65535);
    layernorm_kernel<<<grid, NORM_THREADS, 0, c->stream>>>(y, x, W, B, rows, dim, eps);
    CHECK_LAUNCH(c, layernorm_kernel);
}

static void cuda_attention(void *ctx, const fmoe__attn_args *a) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || a->n <= 0) return;
    if (a->n_heads <= 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0 ||
        a->head_dim <= 0 || a->pos0 < 0) {
        set_error(c, FMOE_EINVAL, "attention: %d heads, %d kv heads, head_dim %d, pos0 %d",
                  a->n_heads, a->n_kv_heads, a->head_dim, a->pos0);
        return;
    }
    /* Keys of the last query, the most any row sees. */
    int64_t keys = (int64_t)a->pos0 + a->n;
    if (a->window > 0 && keys > a->window) keys = a->window;
    const int64_t tasks = (int64_t)a->n * a->n_heads;
    if (tasks > INT_MAX) {
        set_error(c, FMOE_EINVAL, "attention: %lld (token, head) pairs", (long long)tasks);
        return;
    }
    fmoe__attn_args da = *a;
    if (a->sinks && !(da.sinks = (const float *)weight(c, a->sinks, (int64_t)a->n_heads * 4,
                                                       "attention sinks")))
        return;
    const int64_t fixed = ((int64_t)a->head_dim + 32) * 4;
    if (fixed + keys * 4 <= c->smem_optin) {
        attention_kernel<<<(unsigned)tasks, ATTN_THREADS, (size_t)(fixed + keys * 4),
                           c->stream>>>(da, NULL, 0, (int32_t)tasks);
    } else if (c->scores && keys <= c->max_context && fixed <= c->smem_optin) {
        const int64_t grid = tasks < c->attn_blocks ? tasks : c->attn_blocks;
        attention_kernel<<<(unsigned)grid, ATTN_THREADS, (size_t)fixed, c->stream>>>(
            da, c->scores, c->max_context, (int32_t)tasks);
    } else {
        set_error(c, FMOE_EUNSUPPORTED,
                  "attention: %lld keys of head_dim %d exceed the scratch (max_context %d, %d "
                  "bytes of shared memory)",
                  (long long)keys, a->head_dim, c->max_context, c->smem_optin);
        return;
    }
    CHECK_LAUNCH(c, attention_kernel);
}

static void cuda_route(void *ctx, const fmoe__route_args *a, const float *logits, float *probs,
                       int32_t *topk, float *topw) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || a->n <= 0) return;
    if (a->num_experts <= 0 || a->top_k <= 0 || a->top_k > a->num_experts) {
        set_error(c, FMOE_EINVAL, "route: top %d of %d experts", a->top_k, a->num_experts);
        return;
    }
    const int plain = a->n_group <= 1 && !a->bias && !a->sparsemixer;
    if (!plain && !a->choice) {
        set_error(c, FMOE_EINVAL, "route: grouped, biased or sparsemixer routing without a "
                  "choice buffer");
        return;
    }
    if (a->n_group > 1 && (a->n_group > FMOE_ROUTE_MAX_GROUPS ||
                           a->num_experts % a->n_group != 0 || a->topk_group < 1)) {
        set_error(c, FMOE_EINVAL, "route: %d experts in %d groups, %d kept (at most %d groups)",
                  a->num_experts, a->n_group, a->topk_group, FMOE_ROUTE_MAX_GROUPS);
        return;
    }
    fmoe__route_args da = *a;
    if (a->bias && !(da.bias = (const float *)weight(c, a->bias, (int64_t)a->num_experts * 4,
                                                     "router score correction bias")))
        return;
    route_kernel<<<(unsigned)((a->n + ROW_FN_THREADS - 1) / ROW_FN_THREADS), ROW_FN_THREADS, 0,
                   c->stream>>>(da, logits, probs, topk, topw);
    CHECK_LAUNCH(c, route_kernel);
}

static void cuda_probs(void *ctx, float *y, int64_t y_stride, const float *x, int32_t n,
                       int32_t num_experts, int32_t sigmoid) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || n <= 0 || num_experts <= 0) return;
    probs_kernel<<<(unsigned)((n + ROW_FN_THREADS - 1) / ROW_FN_THREADS), ROW_FN_THREADS, 0,
                   c->stream>>>(y, y_stride, x, n, num_experts, sigmoid);
    CHECK_LAUNCH(c, probs_kernel);
}

static void cuda_swiglu(void *ctx, float *g, const float *u, int64_t count) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || count <= 0) return;
    swiglu_kernel<<<blocks_for(count, EW_THREADS), EW_THREADS, 0, c->stream>>>(g, u, count);
    CHECK_LAUNCH(c, swiglu_kernel);
}

static void cuda_swiglu_clamped(void *ctx, float *g, const float *u, int64_t count, float alpha,
                                float limit) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || count <= 0) return;
    swiglu_clamped_kernel<<<blocks_for(count, EW_THREADS), EW_THREADS, 0, c->stream>>>(
        g, u, count, alpha, limit);
    CHECK_LAUNCH(c, swiglu_clamped_kernel);
}

/* Multi-head latent attention (cuda_mla.cu has the kernels): the arguments checked here,
 * where a refusal can say which, and k_b and v_b mapped to their device copies. */
static void cuda_mla_attention(void *ctx, const fmoe__mla_args *a) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || a->n <= 0) return;
    const fmoe__mat *kb = a->wk_b, *vb = a->wv_b;
    if (a->n_heads <= 0 || a->rank <= 0 || a->rope <= 0 || a->rope % 2 != 0 ||
        a->rope > FMOE_ROPE_PAIRS_MAX || a->nope < 0 || a->v_dim <= 0 || a->pos0 < 0 ||
        a->n > a->max_batch || (int64_t)a->pos0 + a->n > a->max_context ||
        a->scratch_slots < 1 || !a->scratch || !kb || !vb ||
        kb->rows != (int64_t)a->n_heads * a->rank || kb->cols != a->nope ||
        vb->rows != (int64_t)a->n_heads * a->v_dim || vb->cols != a->rank) {
        set_error(c, FMOE_EINVAL,
                  "mla_attention: n %d pos0 %d (max_batch %d, max_context %d), %d heads of "
                  "nope %d rope %d v %d, rank %d, %d scratch slots, k_b %lld x %lld, "
                  "v_b %lld x %lld",
                  a->n, a->pos0, a->max_batch, a->max_context, a->n_heads, a->nope, a->rope,
                  a->v_dim, a->rank, a->scratch_slots, kb ? (long long)kb->rows : 0,
                  kb ? (long long)kb->cols : 0, vb ? (long long)vb->rows : 0,
                  vb ? (long long)vb->cols : 0);
        return;
    }
    const void *Wk = mat_data(c, kb, "attn_k_b");
    if (!Wk) return;
    const void *Wv = mat_data(c, vb, "attn_v_b");
    if (!Wv) return;
    CHECK_CUDA(c, fmoe__cuda_mla_attention(c->stream, a, Wk, Wv));
}

static void cuda_gather_rows(void *ctx, float *dst, const float *src, const int32_t *rows_host,
                             int32_t n, int32_t dim) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || n <= 0 || dim <= 0) return;
    if (n > c->max_experts) {
        set_error(c, FMOE_EINVAL, "gather_rows: %d rows, more than max_experts %d", n,
                  c->max_experts);
        return;
    }
    /* idx is reused by the next gather/scatter without a wait: both are queued on this
     * stream, so that op's upload runs after this kernel has read idx. */
    if (!h2d(c, c->idx, rows_host, (int64_t)n * 4)) return;
    gather_kernel<<<(unsigned)n, row_threads(dim), 0, c->stream>>>(dst, src, c->idx, dim);
    CHECK_LAUNCH(c, gather_kernel);
}

static void cuda_scatter_add(void *ctx, float *acc, const float *src, const int32_t *rows_host,
                             const float *scale_host, int32_t n, int32_t dim) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || n <= 0 || dim <= 0) return;
    if (n > c->max_experts) {
        set_error(c, FMOE_EINVAL, "scatter_add: %d rows, more than max_experts %d", n,
                  c->max_experts);
        return;
    }
    /* As gather_rows: stream order makes reusing idx and scale safe. */
    if (!h2d(c, c->idx, rows_host, (int64_t)n * 4) || !h2d(c, c->scale, scale_host, (int64_t)n * 4))
        return;
    scatter_add_kernel<<<(unsigned)n, row_threads(dim), 0, c->stream>>>(acc, src, c->idx,
                                                                       c->scale, dim);
    CHECK_LAUNCH(c, scatter_add_kernel);
}

static void cuda_add(void *ctx, float *y, const float *x, int64_t count) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || count <= 0) return;
    add_kernel<<<blocks_for(count, EW_THREADS), EW_THREADS, 0, c->stream>>>(y, x, count);
    CHECK_LAUNCH(c, add_kernel);
}

static void cuda_add_gated(void *ctx, float *y, const float *x, const float *gate, int32_t n,
                           int32_t dim) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->err || n <= 0 || dim <= 0) return;
    const int64_t count = (int64_t)n * dim;
    add_gated_kernel<<<blocks_for(count, EW_THREADS), EW_THREADS, 0, c->stream>>>(y, x, gate,
                                                                                 dim, count);
    CHECK_LAUNCH(c, add_gated_kernel);
}

/* ---------------------------------------------------------------------------------- */
/* Expert slots                                                                       */
/* ---------------------------------------------------------------------------------- */

/* Thread-safe across contexts: touches only this context's copy stream (behind whatever
 * fence_wait queued on it). Not sticky: the I/O thread decides. */
static int cuda_write_slot(void *ctx, void *dst, const void *src_host, int64_t bytes) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (bytes <= 0) return 0;
    if (!CHECK_CUDA(NULL, cudaMemcpyAsync(dst, src_host, (size_t)bytes, cudaMemcpyHostToDevice,
                                          c->copy)) ||
        !CHECK_CUDA(NULL, cudaStreamSynchronize(c->copy))) {
        fmoe_error_prefix("write_slot of %lld bytes", (long long)bytes);
        return FMOE_EINTERNAL;
    }
    return 0;
}

static int cuda_host_register(void *ctx, void *p, int64_t bytes) {
    (void)ctx;
    if (!p || bytes <= 0) return 0;
    cudaError_t e = cudaHostRegister(p, (size_t)bytes, cudaHostRegisterDefault);
    if (e != cudaSuccess) {
        /* A read-only mapping (the mmapped checkpoint) cannot be pinned for writing. */
        (void)cudaGetLastError();
        int ro = 0;
        if (cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, 0) ==
                cudaSuccess &&
            ro)
            e = cudaHostRegister(p, (size_t)bytes, cudaHostRegisterReadOnly);
    }
    if (e == cudaSuccess) return 0;
    (void)cudaGetLastError();
    return fmoe_error_set(e == cudaErrorMemoryAllocation ? FMOE_ENOMEM : FMOE_EINTERNAL,
                          "cudaHostRegister(%lld MiB): %s", (long long)(bytes >> 20),
                          cudaGetErrorString(e));
}

static void cuda_host_unregister(void *ctx, void *p) {
    (void)ctx;
    if (!p) return;
    if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

/* A slot fence: an event without timing (the cheapest to record and wait for). Any
 * context's streams may use it: they are all on device 0. */
static void *cuda_fence_new(void *ctx) {
    (void)ctx;
    cudaEvent_t e = NULL;
    if (!CHECK_CUDA(NULL, cudaEventCreateWithFlags(&e, cudaEventDisableTiming))) return NULL;
    return (void *)e;
}

/* cudaEventDestroy returns at once; a record or wait still queued completes first. */
static void cuda_fence_free(void *ctx, void *fence) {
    (void)ctx;
    if (!fence) return;
    if (cudaEventDestroy((cudaEvent_t)fence) != cudaSuccess) (void)cudaGetLastError();
}

/* On the compute stream, in op order: a failure is sticky, as a queued op's. */
static int cuda_fence_record(void *ctx, void *fence) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!c->err) CHECK_CUDA(c, cudaEventRecord((cudaEvent_t)fence, c->stream));
    if (c->err) return fmoe_error_set(c->err, "%s", c->detail);
    return 0;
}

/* On the copy stream, from the I/O thread: not sticky, as write_slot. */
static int cuda_fence_wait(void *ctx, void *fence) {
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!CHECK_CUDA(NULL, cudaStreamWaitEvent(c->copy, (cudaEvent_t)fence, 0))) {
        fmoe_error_prefix("fence_wait");
        return FMOE_EINTERNAL;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* The table                                                                          */
/* ---------------------------------------------------------------------------------- */

/* C++20 designated initializers: in declaration order (a misordered or unknown field is a
 * compile error; -Wextra's missing-field-initializers names a field left out). */
static const fmoe__backend_ops cuda_ops = {
    .name = "cuda",
    .host_memory = 0,
    .init = cuda_init,
    .free = cuda_free,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .zero = cuda_zero,
    .sync = cuda_sync,
    .mark = cuda_mark,
    .elapsed = cuda_elapsed,
    .get_rows = cuda_get_rows,
    .rmsnorm = cuda_rmsnorm,
    .matmul = cuda_matmul,
    .add_bias = cuda_add_bias,
    .clamp = cuda_clamp,
    .rope = cuda_rope,
    .attention = cuda_attention,
    .route = cuda_route,
    .probs = cuda_probs,
    .swiglu = cuda_swiglu,
    .gather_rows = cuda_gather_rows,
    .scatter_add = cuda_scatter_add,
    .add = cuda_add,
    .add_gated = cuda_add_gated,
    .write_slot = cuda_write_slot,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .fence_new = cuda_fence_new,
    .fence_free = cuda_fence_free,
    .fence_record = cuda_fence_record,
    .fence_wait = cuda_fence_wait,
    .mla_attention = cuda_mla_attention,
    .layernorm = cuda_layernorm,
    .swiglu_clamped = cuda_swiglu_clamped,
    .rope_partial = cuda_rope_partial,
    .moe_experts = NULL, /* the pass's per-expert loop: one stream, no threads to keep busy */
    .matmul_same_input = NULL, /* likewise: matmul, one product at a time */
};

extern "C" const fmoe__backend_ops *fmoe__cuda_module_backend_ops(void) { return &cuda_ops; }
