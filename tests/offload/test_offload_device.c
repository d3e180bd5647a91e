/*
 * test_offload_device - the live executor's device slots (runtime/offload/offload.c's
 * "Device slots") without a device: fmoe__offload_init_backend is handed a fake device
 * table, fmoe__cpu_backend with host_memory 0 and its own alloc, release, write_slot,
 * host_register and host_unregister over ordinary memory, which count their calls, check
 * every pointer against the buffers they handed out or pinned, and make a copy look like
 * a DMA in flight (the destination poisoned with 0xFF, a pause, then the bytes), so that
 * compute reading a slot while it is written sees NaNs. The model is the bundled tiny
 * Qwen3-MoE (datasets/fmoe-tiny: 6 MoE layers of 8 experts, top-2, bf16).
 *
 * The session computing from the slots runs on the CPU's compute (this machine may have
 * no device): experts the executor hands with on_device = 1 are then computed by the CPU
 * backend straight from the fake "device" memory, which is host memory. That exercises
 * everything of the executor's device path (context, one slot allocation, pinned host
 * block or staging slot, write_slot of exactly the bytes read, the views' on_device,
 * host-lane views for host misses, teardown order) but not a real copy stream: that is
 * the GPU tests' (tests/gpu/). In some runs the session itself is on a counting device
 * (fmoe__session_init_backend): the CPU table with host_memory 0, so that the forward
 * pass takes a device's path, host mirrors, downloads, slot fences recorded before
 * on_expert_done and timer marks, and each download, sync, fence record and mark is
 * counted.
 *
 * Slot fences (model_impl.h; offload.c's "Device slots"): the fake device's fences log
 * each record (the session's context) and wait (the executor's) with a global sequence
 * number, and each fence learns the device addresses read through the views that carry
 * it. Checked, by address and order rather than by the executor's slot numbers: every
 * device view carries a live fence and no two fences cover the same bytes (one per slot);
 * each compute from a device slot is followed by a record of its fence before
 * on_expert_done; every write_slot into bytes read before comes after a wait that covers
 * the record following their last read; fences are created with the slots (N + 1) and
 * freed before the context.
 *
 * Checked: logits bit-identical to a plain CPU session's; the decision log and the access
 * outcomes identical to host slots' with sync transfers (lru, and mixtral-offload's
 * prefetches); write_slot moved exactly bytes_loaded (lru) and the engine's io_bytes
 * (asynchronous transfers); slot views point into the fake device's slots, host-miss
 * views into host memory; a failing write_slot is the next forward's error; every
 * context, buffer, pin and fence is given back. On the counting device: one download per
 * MoE layer brings its routing (with the gate inputs, probabilities and speculative rows a
 * hook or trace reads, all bit-identical to the CPU's), one sync per pass and none per
 * slot expert (one fence record each instead), and none per layer while layer times are
 * recorded.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/error.h"
#include "fmoe/offload.h"
#include "fmoe/trace.h"
#include "harness.h"
#include "offload_impl.h"

/* ---------------------------------------------------------------------------------- */
/* The fake device                                                                    */
/* ---------------------------------------------------------------------------------- */

enum { MAXBUF = 16, MAXFENCE = 64 };

typedef struct fake_buf {
    uint8_t *p;
    int64_t bytes;
} fake_buf;

/* A slot fence of the fake device: its records and waits by sequence number, and the
 * device bytes read through views carrying it. Under fake.mu. */
typedef struct fake_fence {
    int64_t recorded;      /* sequence number of the latest record, 0: never */
    int64_t covered;       /* `recorded` as the latest wait found it: the wait covers it */
    int64_t last_read;     /* the record that followed the latest read (0: never read) */
    const uint8_t *lo, *hi; /* the bytes read through it, [lo, hi) (lo NULL: none) */
} fake_fence;

static struct fake {
    pthread_mutex_t mu;
    fake_buf dev[MAXBUF];    /* live allocations */
    int ndev;
    fake_buf pinned[MAXBUF]; /* live registrations */
    int npinned;
    int64_t inits, frees, allocs, releases, registers, unregisters;
    int64_t writes, write_bytes, pinned_writes;
    fake_fence *fences[MAXFENCE]; /* live fences */
    int nfences;
    int64_t fence_news, fence_frees, records, fence_waits;
    int64_t covering_waits;  /* waits that covered a record (a slot read, then rewritten) */
    int64_t seq;             /* the records' and waits' sequence */
    int64_t fail_after;      /* write_slot calls after this many fail (-1: none) */
    int poison_src;          /* poison the source after a copy (file tier: the staging) */
    int bad;                 /* contract violations seen; `why` says the first */
    char why[256];
} fake = {.mu = PTHREAD_MUTEX_INITIALIZER, .fail_after = -1};

static int fake_ctx_tag;

static void fake_reset(void) {
    pthread_mutex_lock(&fake.mu);
    fake.inits = fake.frees = fake.allocs = fake.releases = 0;
    fake.registers = fake.unregisters = 0;
    fake.writes = fake.write_bytes = fake.pinned_writes = 0;
    fake.fence_news = fake.fence_frees = fake.records = fake.fence_waits = 0;
    fake.covering_waits = fake.seq = 0;
    fake.fail_after = -1;
    fake.poison_src = 0;
    fake.bad = 0;
    fake.why[0] = '\0';
    pthread_mutex_unlock(&fake.mu);
}

/* Under fake.mu. */
static void fake_violation(const char *what) {
    if (!fake.bad++) snprintf(fake.why, sizeof fake.why, "%s", what);
}

/* The index of the buffer of `bufs` holding [p, p + bytes), or -1. Under fake.mu. */
static int find_buf(const fake_buf *bufs, int n, const void *p, int64_t bytes) {
    const uint8_t *q = p;
    for (int i = 0; i < n; i++)
        if (q >= bufs[i].p && bytes >= 0 && q + bytes <= bufs[i].p + bufs[i].bytes) return i;
    return -1;
}

static int fake_in_device(const void *p, int64_t bytes) {
    pthread_mutex_lock(&fake.mu);
    const int i = find_buf(fake.dev, fake.ndev, p, bytes);
    pthread_mutex_unlock(&fake.mu);
    return i >= 0;
}

static int fake_init(const fmoe__backend_limits *lim, void **ctx) {
    pthread_mutex_lock(&fake.mu);
    if (!lim->weights) fake_violation("init: limits.weights is NULL");
    if (lim->max_cols < 1 || lim->max_batch < 1) fake_violation("init: empty limits");
    fake.inits++;
    pthread_mutex_unlock(&fake.mu);
    *ctx = &fake_ctx_tag;
    return 0;
}

static void fake_free(void *ctx) {
    pthread_mutex_lock(&fake.mu);
    if (ctx != &fake_ctx_tag) fake_violation("free: not our context");
    if (fake.ndev || fake.npinned) fake_violation("free: buffers or pins outlive the context");
    if (fake.nfences) fake_violation("free: fences outlive the context");
    fake.frees++;
    pthread_mutex_unlock(&fake.mu);
}

static void *fake_alloc(void *ctx, int64_t bytes) {
    uint8_t *p = aligned_alloc(4096, (size_t)((bytes + 4095) / 4096 * 4096));
    if (p) memset(p, 0, (size_t)bytes); /* the contract: zero-filled */
    pthread_mutex_lock(&fake.mu);
    if (ctx != &fake_ctx_tag) fake_violation("alloc: not our context");
    if (p && fake.ndev < MAXBUF) fake.dev[fake.ndev++] = (fake_buf){p, bytes};
    fake.allocs++;
    pthread_mutex_unlock(&fake.mu);
    if (!p) fmoe_error_set(FMOE_ENOMEM, "fake device: %lld bytes", (long long)bytes);
    return p;
}

static void fake_release(void *ctx, void *p) {
    pthread_mutex_lock(&fake.mu);
    if (ctx != &fake_ctx_tag) fake_violation("release: not our context");
    const int i = find_buf(fake.dev, fake.ndev, p, 0);
    if (i < 0 || fake.dev[i].p != p) {
        fake_violation("release: not a buffer of ours");
    } else {
        memset(p, 0xFF, (size_t)fake.dev[i].bytes); /* a read after release sees NaNs */
        free(p);
        fake.dev[i] = fake.dev[--fake.ndev];
    }
    fake.releases++;
    pthread_mutex_unlock(&fake.mu);
}

/* The live fence `f`'s index in fake.fences, or -1. Under fake.mu. */
static int find_fence(const void *f) {
    for (int i = 0; i < fake.nfences; i++)
        if (fake.fences[i] == f) return i;
    return -1;
}

/* Whether [lo, hi) and fence f's read bytes overlap. Under fake.mu. */
static int fence_overlaps(const fake_fence *f, const uint8_t *lo, const uint8_t *hi) {
    return f->lo && lo < f->hi && f->lo < hi;
}

static void *fake_fence_new(void *ctx) {
    fake_fence *f = calloc(1, sizeof *f);
    pthread_mutex_lock(&fake.mu);
    if (ctx != &fake_ctx_tag) fake_violation("fence_new: not our context");
    if (f && fake.nfences < MAXFENCE) fake.fences[fake.nfences++] = f;
    fake.fence_news++;
    pthread_mutex_unlock(&fake.mu);
    if (!f) fmoe_error_set(FMOE_ENOMEM, "fake device: a fence");
    return f;
}

static void fake_fence_free(void *ctx, void *fence) {
    if (!fence) return;
    pthread_mutex_lock(&fake.mu);
    if (ctx != &fake_ctx_tag) fake_violation("fence_free: not our context");
    const int i = find_fence(fence);
    if (i < 0) fake_violation("fence_free: not a live fence of ours");
    else fake.fences[i] = fake.fences[--fake.nfences];
    fake.fence_frees++;
    pthread_mutex_unlock(&fake.mu);
    if (i >= 0) free(fence);
}

/* The session's compute records a fence: on its own context, never the executor's. */
static int fake_fence_record(void *ctx, void *fence) {
    pthread_mutex_lock(&fake.mu);
    if (ctx == &fake_ctx_tag) fake_violation("fence_record: on the executor's context");
    if (find_fence(fence) < 0) fake_violation("fence_record: not a live fence");
    else ((fake_fence *)fence)->recorded = ++fake.seq;
    fake.records++;
    pthread_mutex_unlock(&fake.mu);
    return 0;
}

/* The executor's copies wait: the wait covers the fence's latest record so far. */
static int fake_fence_wait(void *ctx, void *fence) {
    pthread_mutex_lock(&fake.mu);
    if (ctx != &fake_ctx_tag) fake_violation("fence_wait: not our context");
    if (find_fence(fence) < 0) {
        fake_violation("fence_wait: not a live fence");
    } else {
        fake_fence *f = fence;
        f->covered = f->recorded;
        fake.covering_waits += f->recorded > 0;
        ++fake.seq;
    }
    fake.fence_waits++;
    pthread_mutex_unlock(&fake.mu);
    return 0;
}

static int fake_write_slot(void *ctx, void *dst, const void *src, int64_t bytes) {
    pthread_mutex_lock(&fake.mu);
    if (ctx != &fake_ctx_tag) fake_violation("write_slot: not our context");
    if (bytes <= 0) fake_violation("write_slot: no bytes");
    /* bytes read before may be rewritten only behind a wait that covers the record after
     * their last read: the device would otherwise still be reading them */
    for (int i = 0; i < fake.nfences; i++) {
        const fake_fence *f = fake.fences[i];
        if (fence_overlaps(f, dst, (const uint8_t *)dst + bytes) && f->covered < f->last_read)
            fake_violation("write_slot: into bytes read since the last wait for their fence");
    }
    if (find_buf(fake.dev, fake.ndev, dst, bytes) < 0)
        fake_violation("write_slot: destination outside the device buffers");
    if (find_buf(fake.dev, fake.ndev, src, 1) >= 0)
        fake_violation("write_slot: source in device memory");
    const int pinned = find_buf(fake.pinned, fake.npinned, src, bytes) >= 0;
    const int64_t n = ++fake.writes;
    const int fail = fake.fail_after >= 0 && n > fake.fail_after;
    if (!fail) {
        fake.write_bytes += bytes;
        fake.pinned_writes += pinned;
    }
    const int poison_src = fake.poison_src;
    pthread_mutex_unlock(&fake.mu);
    if (fail) return fmoe_error_set(FMOE_EINTERNAL, "fake write_slot: injected failure");
    /* a DMA in flight: the slot holds garbage until the copy has landed */
    memset(dst, 0xFF, (size_t)bytes);
    nanosleep(&(struct timespec){.tv_nsec = 20000}, NULL);
    memcpy(dst, src, (size_t)bytes);
    /* the staging slot is the executor's to reuse once write_slot returned: nothing may
     * read the expert from it */
    if (poison_src) memset((void *)src, 0xFF, (size_t)bytes);
    return 0;
}

static int fake_host_register(void *ctx, void *p, int64_t bytes) {
    pthread_mutex_lock(&fake.mu);
    if (ctx != &fake_ctx_tag) fake_violation("host_register: not our context");
    if (!p || bytes <= 0) fake_violation("host_register: empty range");
    if (fake.npinned < MAXBUF) fake.pinned[fake.npinned++] = (fake_buf){p, bytes};
    fake.registers++;
    pthread_mutex_unlock(&fake.mu);
    return 0;
}

static void fake_host_unregister(void *ctx, void *p) {
    pthread_mutex_lock(&fake.mu);
    if (ctx != &fake_ctx_tag) fake_violation("host_unregister: not our context");
    int i = 0;
    while (i < fake.npinned && fake.pinned[i].p != p) i++;
    if (i == fake.npinned) fake_violation("host_unregister: not pinned");
    else fake.pinned[i] = fake.pinned[--fake.npinned];
    fake.unregisters++;
    pthread_mutex_unlock(&fake.mu);
}

static fmoe__backend_ops fake_ops;

static const fmoe__backend_ops *fake_device(void) {
    fake_ops = fmoe__cpu_backend; /* compute entries: never called by the executor */
    fake_ops.name = "fake-device";
    fake_ops.host_memory = 0;
    fake_ops.init = fake_init;
    fake_ops.free = fake_free;
    fake_ops.alloc = fake_alloc;
    fake_ops.release = fake_release;
    fake_ops.write_slot = fake_write_slot;
    fake_ops.host_register = fake_host_register;
    fake_ops.host_unregister = fake_host_unregister;
    fake_ops.fence_new = fake_fence_new;
    fake_ops.fence_free = fake_fence_free;
    fake_ops.fence_record = fake_fence_record;
    fake_ops.fence_wait = fake_fence_wait;
    return &fake_ops;
}

/*
 * The session's own device: fmoe__cpu_backend with host_memory 0, so that the forward pass
 * takes a device backend's path (host mirrors filled by downloads, waits before slots are
 * reused), with its download, sync, mark and elapsed counted. Compute is the CPU's, so the
 * numbers must equal a plain CPU session's bit for bit, and a part of the routing the pass
 * reads without having downloaded it shows as a difference.
 */
static struct waits {
    int64_t downloads, download_bytes, syncs, marks, elapsed, fence_records;
    const void *lo, *hi;      /* downloads into [lo, hi) (the logits) are counted apart */
    int64_t downloads_in;
} waits;

static void waits_reset(const void *lo, const void *hi) {
    memset(&waits, 0, sizeof waits);
    waits.lo = lo, waits.hi = hi;
}

static int count_download(void *ctx, void *dst, const void *src, int64_t bytes) {
    waits.downloads++;
    waits.download_bytes += bytes;
    if ((const char *)dst >= (const char *)waits.lo && (const char *)dst < (const char *)waits.hi)
        waits.downloads_in++;
    return fmoe__cpu_backend.download(ctx, dst, src, bytes);
}

static int count_sync(void *ctx) {
    waits.syncs++;
    return fmoe__cpu_backend.sync(ctx);
}

static void count_mark(void *ctx, int32_t slot) {
    waits.marks++;
    fmoe__cpu_backend.mark(ctx, slot);
}

static int count_elapsed(void *ctx, int32_t a, int32_t b, double *seconds) {
    waits.elapsed++;
    return fmoe__cpu_backend.elapsed(ctx, a, b, seconds);
}

/* The fences it records are the fake device's (the executor's slots'). */
static int count_fence_record(void *ctx, void *fence) {
    waits.fence_records++;
    return fake_fence_record(ctx, fence);
}

static fmoe__backend_ops counting_ops;

static const fmoe__backend_ops *counting_device(void) {
    counting_ops = fmoe__cpu_backend;
    counting_ops.name = "counting-device";
    counting_ops.host_memory = 0;
    counting_ops.download = count_download;
    counting_ops.sync = count_sync;
    counting_ops.mark = count_mark;
    counting_ops.elapsed = count_elapsed;
    counting_ops.fence_record = count_fence_record;
    return &counting_ops;
}

/* Every context, buffer and pin given back, no contract violated. */
#define ASSERT_FAKE_CLEAN()                                                       \
    do {                                                                          \
        if (fake.bad) HARNESS_FAIL("fake device: %s", fake.why);                  \
        ASSERT_EQ(fake.inits, fake.frees);                                        \
        ASSERT_EQ(fake.allocs, fake.releases);                                    \
        ASSERT_EQ(fake.registers, fake.unregisters);                              \
        ASSERT_EQ(fake.ndev, 0);                                                  \
        ASSERT_EQ(fake.npinned, 0);                                               \
        ASSERT_EQ(fake.fence_news, fake.fence_frees);                             \
        ASSERT_EQ(fake.nfences, 0);                                               \
    } while (0)

/* ---------------------------------------------------------------------------------- */
/* Runs                                                                               */
/* ---------------------------------------------------------------------------------- */

enum { PLEN = 24, STEPS = 12, MAXDEC = 1 << 16, MAXOUT = 1 << 14 };

/* The executor's expert hooks behind ours: where each view points. */
typedef struct spy {
    fmoe_session_options inner;
    int device;                    /* the executor's slots are the fake device's */
    int counting;                  /* the session is the counting device (it records fences) */
    void *fence;                   /* the view's fence, between on_expert and on_expert_done */
    int64_t recorded;              /* that fence's latest record at on_expert */
    int64_t device_views, host_views, model_weights;
    int64_t routes;                /* routing events: one per MoE layer of each pass */
    int bad;
    char why[160];
} spy;

static int spy_route(void *ctx, const fmoe_route_event *ev) {
    spy *p = ctx;
    p->routes++;
    return p->inner.on_route(p->inner.route_ctx, ev);
}

/* A device view's fence: a live one of the fake device's, which learns the bytes read
 * through it; bytes one fence covers no other may (one fence per slot). */
static void spy_fence_read(spy *p, int32_t l, int32_t j, const fmoe_matrix_view *const *v) {
    const uint8_t *lo = v[0]->data, *hi = lo;
    for (int i = 0; i < 3; i++) {
        const uint8_t *a = v[i]->data, *b = a + v[i]->rows * v[i]->cols * 2; /* bf16 */
        if (a < lo) lo = a;
        if (b > hi) hi = b;
    }
    pthread_mutex_lock(&fake.mu);
    fake_fence *f = p->fence;
    const char *bad = NULL;
    if (find_fence(f) < 0) {
        bad = "not a live fence of the fake device";
    } else {
        for (int i = 0; i < fake.nfences; i++)
            if (fake.fences[i] != f && fence_overlaps(fake.fences[i], lo, hi))
                bad = "its bytes were read through another fence before";
        if (!f->lo || lo < f->lo) f->lo = lo;
        if (!f->hi || hi > f->hi) f->hi = hi;
        p->recorded = f->recorded;
    }
    pthread_mutex_unlock(&fake.mu);
    if (bad && !p->bad++) snprintf(p->why, sizeof p->why, "(%d, %d)'s fence: %s", l, j, bad);
}

static int spy_expert(void *ctx, int32_t l, int32_t j, fmoe_expert_view *w) {
    spy *p = ctx;
    const int rc = p->inner.on_expert(p->inner.route_ctx, l, j, w);
    if (rc != 0) {
        p->model_weights += rc == 1;
        if (rc == 1 && p->device && !p->bad++)
            snprintf(p->why, sizeof p->why, "(%d, %d): the model's weights with device slots",
                     l, j);
        return rc;
    }
    const fmoe_matrix_view *v[3] = {&w->gate, &w->up, &w->down};
    for (int i = 0; i < 3; i++) {
        const int64_t bytes = v[i]->rows * v[i]->cols * 2; /* bf16 */
        const int in_dev = fake_in_device(v[i]->data, bytes);
        const int ok = v[i]->on_device == v[0]->on_device &&
                       (v[i]->on_device ? p->device && in_dev : !in_dev);
        if (!ok && !p->bad++)
            snprintf(p->why, sizeof p->why, "(%d, %d) matrix %d: on_device %d, in the fake "
                     "device's memory %d", l, j, i, v[i]->on_device, in_dev);
    }
    if (w->gate.on_device) p->device_views++;
    else p->host_views++;
    p->fence = w->gate.on_device ? w->fence : NULL;
    if (!w->gate.on_device && w->fence && !p->bad++)
        snprintf(p->why, sizeof p->why, "(%d, %d): a host view with a fence", l, j);
    if (p->fence) spy_fence_read(p, l, j, v);
    else if (w->gate.on_device && !p->bad++)
        snprintf(p->why, sizeof p->why, "(%d, %d): a device view without a fence", l, j);
    return 0;
}

/* The compute from a device slot has been issued: its fence must have been recorded since
 * on_expert (the counting session records; a CPU session needs none), and that record is
 * the one a rewrite of the bytes must wait for. Before the hold is released, so that no
 * write_slot into the slot can come between. */
static void spy_done(void *ctx, int32_t l, int32_t j) {
    spy *p = ctx;
    if (p->fence && p->counting) {
        pthread_mutex_lock(&fake.mu);
        fake_fence *f = p->fence;
        if (f->recorded <= p->recorded && !p->bad++)
            snprintf(p->why, sizeof p->why, "(%d, %d): no fence record after the compute "
                     "from its slot", l, j);
        f->last_read = f->recorded;
        pthread_mutex_unlock(&fake.mu);
    }
    p->fence = NULL;
    p->inner.on_expert_done(p->inner.route_ctx, l, j);
}

typedef struct run_cfg {
    const char *policy;
    int32_t cache;
    fmoe_tier_kind tier;
    int direct_io;
    int32_t miss;
    int sync;        /* sync_transfers */
    int fake;        /* device slots from the fake table, else host slots */
    int counting;    /* the session on the counting device, else the CPU backend */
} run_cfg;

typedef struct run_out {
    float *logits;          /* [STEPS][V] */
    fmoe_decision *dec;     /* [MAXDEC] */
    int64_t ndec;
    uint8_t *outcomes;      /* [MAXOUT] */
    int64_t nout;
    fmoe_offload_stats st;
    spy sp;
} run_out;

static void log_decision(void *ctx, const fmoe_decision *d) {
    run_out *o = ctx;
    if (o->ndec < MAXDEC) o->dec[o->ndec] = *d;
    o->ndec++;
}

static void run_out_init(run_out *o, int32_t V) {
    memset(o, 0, sizeof *o);
    o->logits = calloc((size_t)STEPS * V, sizeof *o->logits);
    o->dec = calloc(MAXDEC, sizeof *o->dec);
    o->outcomes = calloc(MAXOUT, 1);
}

static void run_out_free(run_out *o) {
    free(o->logits);
    free(o->dec);
    free(o->outcomes);
}

static void take_outcomes(fmoe_offload *x, run_out *o) {
    int64_t n;
    const uint8_t *oc = fmoe_offload_take_outcomes(x, &n);
    for (int64_t i = 0; i < n && o->nout < MAXOUT; i++) o->outcomes[o->nout++] = oc[i];
}

static fmoe_model *load_tiny(int *harness_failed) {
    char dir[1024];
    const char *root = getenv("FMOE_SOURCE_ROOT");
    snprintf(dir, sizeof dir, "%s/datasets/fmoe-tiny", root ? root : ".");
    fmoe_model *m = NULL;
    const int rc = fmoe_model_load(dir, NULL, &m);
    if (rc != 0) HARNESS_FAIL("loading %s: %s", dir, fmoe_error_detail());
    return m;
}

static fmoe_session_options session_options(void) {
    fmoe_session_options so = fmoe_session_defaults();
    so.max_context = 128;
    so.threads = 2;
    return so;
}

/* The prompt, then STEPS - 1 decode tokens `next` (chosen by the plain run), through a
 * plain session: the reference logits [STEPS][V]. */
static void run_plain(int *harness_failed, fmoe_model *m, const int32_t *prompt,
                      int32_t *next, float *logits) {
    const int32_t V = fmoe_model_get_geometry(m)->vocab_size;
    fmoe_session_options so = session_options();
    so.max_batch = fmoe_offload_defaults().prefill_chunk;
    fmoe_session *s;
    ASSERT_OK(fmoe_session_init(m, &so, &s));
    ASSERT_OK(fmoe_session_forward(s, prompt, PLEN, NULL, logits));
    for (int t = 1; t < STEPS; t++) {
        const float *prev = logits + (int64_t)(t - 1) * V;
        int32_t b = 0;
        for (int32_t i = 1; i < V; i++)
            if (prev[i] > prev[b]) b = i;
        next[t - 1] = b;
        ASSERT_OK(fmoe_session_forward(s, &next[t - 1], 1, NULL, logits + (int64_t)t * V));
    }
    fmoe_session_free(s);
}

/* The waits of an offloaded run on the counting device (docs/gpu.md's budget): one
 * download per MoE layer of each pass (the routing, hidden rows and speculative rows the
 * hook reads included), one per expert computed on the host lane, the logits; one sync per
 * pass (its end) and none per expert computed from a device slot: a record of the slot's
 * fence each instead (before on_expert_done), and no other record. */
static void check_waits(int *harness_failed, fmoe_model *m, const spy *p) {
    const int32_t Lm = fmoe_model_get_geometry(m)->num_moe_layers;
    ASSERT_TRUE(p->routes > 0);
    ASSERT_EQ(p->routes % Lm, 0);
    const int64_t passes = p->routes / Lm;
    ASSERT_TRUE(waits.downloads_in >= STEPS && waits.downloads_in <= passes);
    ASSERT_EQ(waits.downloads - waits.downloads_in, p->routes + p->host_views);
    ASSERT_EQ(waits.syncs, passes);
    ASSERT_EQ(waits.fence_records, p->device ? p->device_views : 0);
    ASSERT_EQ(fake.records, waits.fence_records);
    ASSERT_EQ(waits.marks, 0);
}

/* The same tokens through an offloaded session. @return through *skipped 1 when the
 * tier cannot be opened here (O_DIRECT on a file system without it). */
static void run_offload(int *harness_failed, fmoe_model *m, const run_cfg *c,
                        const int32_t *prompt, const int32_t *next, run_out *o, int *skipped) {
    const int32_t V = fmoe_model_get_geometry(m)->vocab_size;
    fmoe_offload_options oo = fmoe_offload_defaults();
    oo.policy = c->policy;
    oo.cache_experts = c->cache;
    oo.tier = c->tier;
    oo.direct_io = c->direct_io;
    oo.miss = c->miss;
    oo.sync_transfers = c->sync;
    oo.sync_predictions = 1;
    oo.decision = log_decision;
    oo.decision_ctx = o;
    fake_reset();
    fake.poison_src = c->fake && c->tier == FMOE_TIER_FILE;
    fmoe_offload *x;
    const int rc = c->fake ? fmoe__offload_init_backend(&x, m, &oo, fake_device())
                           : fmoe_offload_init(&x, m, &oo);
    if (rc == FMOE_EIO && c->direct_io) {
        fprintf(stderr, "  skipped O_DIRECT here: %s\n", fmoe_error_detail());
        *skipped = 1;
        return;
    }
    ASSERT_OK(rc);
    if (c->fake) {
        ASSERT_EQ(fake.inits, 1);
        ASSERT_EQ(fake.allocs, 1); /* the N slots and the scratch slot, one buffer */
        ASSERT_EQ(fake.registers, 1); /* the host block, or the staging slot */
        ASSERT_EQ(fake.fence_news, c->cache + 1); /* one per slot, the scratch one's too */
    }
    fmoe_session_options so = session_options();
    fmoe_offload_attach(x, &so);
    o->sp.inner = so;
    o->sp.device = c->fake;
    o->sp.counting = c->counting;
    so.on_route = spy_route;
    so.on_expert = spy_expert;
    so.on_expert_done = spy_done;
    so.route_ctx = &o->sp;
    fmoe_session *s;
    if (c->counting) ASSERT_OK(fmoe__session_init_backend(m, &so, counting_device(), &s));
    else ASSERT_OK(fmoe_session_init(m, &so, &s));
    waits_reset(o->logits, o->logits + (int64_t)STEPS * V);
    ASSERT_OK(fmoe_offload_request_begin(x, 0, prompt, PLEN));
    ASSERT_OK(fmoe_offload_forward(x, s, prompt, PLEN, FMOE_PHASE_PREFILL, NULL, o->logits));
    take_outcomes(x, o);
    for (int t = 1; t < STEPS; t++) {
        ASSERT_OK(fmoe_offload_forward(x, s, &next[t - 1], 1, FMOE_PHASE_DECODE, NULL,
                                       o->logits + (int64_t)t * V));
        take_outcomes(x, o);
    }
    ASSERT_OK(fmoe_offload_request_end(x));
    fmoe_offload_get_stats(x, &o->st);
    fmoe_session_free(s);
    fmoe_offload_free(x);
    if (o->sp.bad) HARNESS_FAIL("views: %s", o->sp.why);
    if (c->fake) ASSERT_FAKE_CLEAN();
    if (c->counting) check_waits(harness_failed, m, &o->sp);
}

static int same_logits(const float *a, const float *b, int32_t V) {
    return memcmp(a, b, sizeof(float) * (size_t)STEPS * V) == 0;
}

/* The decisions but their times (measured, so never equal). */
static int same_decisions(const run_out *a, const run_out *b) {
    if (a->ndec != b->ndec || a->ndec > MAXDEC) return 0;
    for (int64_t i = 0; i < a->ndec; i++) {
        const fmoe_decision *p = &a->dec[i], *q = &b->dec[i];
        if (p->kind != q->kind || p->iteration != q->iteration || p->layer != q->layer ||
            p->expert != q->expert || p->slot != q->slot || p->victim != q->victim ||
            p->result != q->result || p->priority != q->priority)
            return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------------------------- */
/* Tests                                                                              */
/* ---------------------------------------------------------------------------------- */

/* The runs of check_tier and what it checks. */
typedef struct tier_runs {
    float *ref;                  /* [STEPS][V] the plain session's logits */
    run_out host, dev, dev_async;
    int64_t writes, write_bytes, pinned_writes; /* the fake device's, synchronous run */
    int64_t async_write_bytes, async_pinned_writes, async_writes;
    int64_t fence_waits[2], covering_waits[2]; /* the synchronous run's, the asynchronous */
} tier_runs;

static void tier_runs_check(int *harness_failed, fmoe_model *m, const char *policy,
                            fmoe_tier_kind tier, int direct_io, tier_runs *r) {
    const int32_t V = fmoe_model_get_geometry(m)->vocab_size;
    int32_t prompt[PLEN], next[STEPS];
    for (int t = 0; t < PLEN; t++) prompt[t] = (t * 37 + 11) % V;
    const int lru = strcmp(policy, "lru") == 0;
    int skipped = 0;
    run_plain(harness_failed, m, prompt, next, r->ref);
    if (*harness_failed) return;
    run_cfg c = {.policy = policy, .cache = 12, .tier = tier, .direct_io = direct_io,
                 .miss = FMOE_OFFLOAD_MISS_LOAD, .sync = 1, .fake = 0};
    run_offload(harness_failed, m, &c, prompt, next, &r->host, &skipped);
    if (*harness_failed || skipped) return;
    c.fake = 1;
    c.counting = 1; /* and the session's waits counted */
    run_offload(harness_failed, m, &c, prompt, next, &r->dev, &skipped);
    if (*harness_failed) return;
    r->writes = fake.writes, r->write_bytes = fake.write_bytes;
    r->pinned_writes = fake.pinned_writes;
    r->fence_waits[0] = fake.fence_waits, r->covering_waits[0] = fake.covering_waits;
    c.sync = 0; /* the fences' order with the I/O thread running free */
    run_offload(harness_failed, m, &c, prompt, next, &r->dev_async, &skipped);
    if (*harness_failed) return;
    r->async_writes = fake.writes, r->async_write_bytes = fake.write_bytes;
    r->async_pinned_writes = fake.pinned_writes;
    r->fence_waits[1] = fake.fence_waits, r->covering_waits[1] = fake.covering_waits;
    fmoe_expert_tensors t;
    ASSERT_OK(fmoe_model_expert_tensors(m, 0, 0, &t));
    const int64_t expert = (t.gate.view.rows * t.gate.view.cols + t.up.view.rows * t.up.view.cols +
                            t.down.view.rows * t.down.view.cols) * 2; /* bf16 */

    /* host slots: the checkpoint's bytes, computed as the plain session does */
    if (!same_logits(r->host.logits, r->ref, V)) HARNESS_FAIL("host slots: logits differ");
    ASSERT_EQ(r->host.sp.device_views, 0);
    /* device slots: the same numbers, from the device's slots */
    if (!same_logits(r->dev.logits, r->ref, V)) HARNESS_FAIL("device slots: logits differ");
    if (!same_logits(r->dev_async.logits, r->ref, V))
        HARNESS_FAIL("device slots, asynchronous transfers: logits differ");
    ASSERT_TRUE(r->dev.sp.device_views > 0);
    ASSERT_EQ(r->dev.sp.model_weights, 0);
    ASSERT_EQ(r->dev.sp.device_views + r->dev.sp.host_views, r->dev.st.accesses);

    /* the decision-log identity: where slots live decides nothing */
    ASSERT_TRUE(r->host.ndec > 0 && r->host.ndec <= MAXDEC);
    if (!same_decisions(&r->host, &r->dev)) HARNESS_FAIL("decision logs differ");
    ASSERT_EQ(r->host.nout, r->dev.nout);
    if (memcmp(r->host.outcomes, r->dev.outcomes, (size_t)r->host.nout) != 0)
        HARNESS_FAIL("outcomes differ");
    ASSERT_EQ(r->host.st.bytes_loaded, r->dev.st.bytes_loaded);
    ASSERT_EQ(r->host.st.misses, r->dev.st.misses);
    ASSERT_EQ(r->host.st.hits, r->dev.st.hits);

    /* write_slot moved the bytes of every transfer, from pinned memory */
    ASSERT_TRUE(r->writes > 0 && r->dev.st.bytes_loaded > 0);
    ASSERT_EQ(r->pinned_writes, r->writes);
    if (lru) ASSERT_EQ(r->write_bytes, r->dev.st.bytes_loaded);
    else ASSERT_TRUE(r->write_bytes <= r->dev.st.bytes_loaded);
    ASSERT_EQ(r->async_pinned_writes, r->async_writes);
    /* the engine's own count: with lru every copy is a demand load, done before the last
     * forward returned; a prefetching policy's last prefetches may still be copying when
     * the stats are read (the fake's count is read after free joined the engine) */
    if (lru) {
        ASSERT_EQ(r->async_write_bytes, r->dev_async.st.io_bytes);
        ASSERT_EQ(r->async_write_bytes, r->dev_async.st.bytes_loaded);
    } else {
        /* and a prefetch claimed while a piece is on the engine has that piece copied
         * again by its demand job (offload.c), at most one piece per late hit */
        const int64_t piece = (expert + 3) / 4; /* copy_chunks 4 */
        ASSERT_TRUE(r->dev_async.st.io_bytes <= r->async_write_bytes);
        ASSERT_TRUE(r->async_write_bytes <=
                    r->dev_async.st.bytes_loaded + r->dev_async.st.late_hits * piece);
    }
    /* slot fences (the fake's own checks of their order ran during the runs): each
     * transfer's copies waited for their slot's fence (a lru transfer: one whole expert in
     * one copy), and slots read were rewritten, so some waits covered a record */
    if (lru) {
        ASSERT_EQ(r->fence_waits[0] * expert, r->dev.st.bytes_loaded);
        ASSERT_EQ(r->fence_waits[1] * expert, r->dev_async.st.bytes_loaded);
        /* lru loads only what an access computes, never bypasses: every transfer but the
         * first into each slot rewrites bytes read before */
        ASSERT_EQ(r->covering_waits[0], r->fence_waits[0] - c.cache);
        ASSERT_EQ(r->covering_waits[1], r->fence_waits[1] - c.cache);
    }
    ASSERT_TRUE(r->covering_waits[0] > 0 && r->covering_waits[1] > 0);
    fprintf(stderr, "  %s, %s tier%s: %lld accesses, %lld misses, %lld write_slot calls of "
                    "%lld bytes, %lld fence waits (%lld after a record) (sync transfers); "
                    "async: %lld calls, %lld bytes, %lld fence waits (%lld)\n",
            policy, tier == FMOE_TIER_HOST ? "host" : "file", direct_io ? " (O_DIRECT)" : "",
            (long long)r->dev.st.accesses, (long long)r->dev.st.misses, (long long)r->writes,
            (long long)r->write_bytes, (long long)r->fence_waits[0],
            (long long)r->covering_waits[0], (long long)r->async_writes,
            (long long)r->async_write_bytes, (long long)r->fence_waits[1],
            (long long)r->covering_waits[1]);
}

/* One tier: device slots against host slots (sync transfers: the same decisions) and
 * against a plain session (the same logits), then device slots with asynchronous
 * transfers. */
static void check_tier(int *harness_failed, fmoe_model *m, const char *policy,
                       fmoe_tier_kind tier, int direct_io) {
    const int32_t V = fmoe_model_get_geometry(m)->vocab_size;
    tier_runs r;
    memset(&r, 0, sizeof r);
    r.ref = calloc((size_t)STEPS * V, sizeof *r.ref);
    run_out_init(&r.host, V);
    run_out_init(&r.dev, V);
    run_out_init(&r.dev_async, V);
    tier_runs_check(harness_failed, m, policy, tier, direct_io, &r);
    run_out_free(&r.host);
    run_out_free(&r.dev);
    run_out_free(&r.dev_async);
    free(r.ref);
}

TEST(device_slots_host_tier) {
    fmoe_model *m = load_tiny(harness_failed);
    if (!m) return;
    check_tier(harness_failed, m, "lru", FMOE_TIER_HOST, 0);
    if (!*harness_failed) check_tier(harness_failed, m, "mixtral-offload", FMOE_TIER_HOST, 0);
    fmoe_model_free(m);
}

TEST(device_slots_file_tier) {
    fmoe_model *m = load_tiny(harness_failed);
    if (!m) return;
    check_tier(harness_failed, m, "lru", FMOE_TIER_FILE, 0);
    if (!*harness_failed) check_tier(harness_failed, m, "mixtral-offload", FMOE_TIER_FILE, 0);
    /* O_DIRECT reads in place: matrices at their file alignment within a slot */
    if (!*harness_failed) check_tier(harness_failed, m, "lru", FMOE_TIER_FILE, 1);
    fmoe_model_free(m);
}

/* --miss cpu with device slots: misses computed on the host lane from host memory. */
static void host_misses_check(int *harness_failed, fmoe_model *m, float *ref, run_out *dev) {
    const int32_t V = fmoe_model_get_geometry(m)->vocab_size;
    int32_t prompt[PLEN], next[STEPS];
    for (int t = 0; t < PLEN; t++) prompt[t] = (t * 53 + 3) % V;
    int skipped = 0;
    run_plain(harness_failed, m, prompt, next, ref);
    if (*harness_failed) return;
    const run_cfg c = {.policy = "lru", .cache = 12, .tier = FMOE_TIER_HOST,
                       .miss = FMOE_OFFLOAD_MISS_CPU, .sync = 1, .fake = 1, .counting = 1};
    run_offload(harness_failed, m, &c, prompt, next, dev, &skipped);
    if (*harness_failed) return;
    if (!same_logits(dev->logits, ref, V)) HARNESS_FAIL("host misses: logits differ");
    ASSERT_TRUE(dev->st.host_misses > 0);
    ASSERT_EQ(dev->st.host_misses, dev->st.misses);
    ASSERT_EQ(dev->sp.host_views, dev->st.host_misses);
    ASSERT_EQ(dev->sp.model_weights, 0);
}

TEST(device_slots_host_misses) {
    fmoe_model *m = load_tiny(harness_failed);
    if (!m) return;
    const int32_t V = fmoe_model_get_geometry(m)->vocab_size;
    float *ref = calloc((size_t)STEPS * V, sizeof *ref);
    run_out dev;
    run_out_init(&dev, V);
    host_misses_check(harness_failed, m, ref, &dev);
    run_out_free(&dev);
    free(ref);
    fmoe_model_free(m);
}

/* A write_slot that fails is the next forward's error, as a failed read. */
static void write_failure_check(int *harness_failed, fmoe_model *m, float *logits) {
    const int32_t V = fmoe_model_get_geometry(m)->vocab_size;
    fmoe_offload_options oo = fmoe_offload_defaults();
    oo.cache_experts = 4;
    oo.tier = FMOE_TIER_FILE;
    fake_reset();
    fake.fail_after = 3;
    fmoe_offload *x;
    ASSERT_OK(fmoe__offload_init_backend(&x, m, &oo, fake_device()));
    fmoe_session_options so = session_options();
    fmoe_offload_attach(x, &so);
    fmoe_session *s;
    ASSERT_OK(fmoe_session_init(m, &so, &s));
    int32_t prompt[PLEN];
    for (int t = 0; t < PLEN; t++) prompt[t] = (t * 29 + 7) % V;
    int rc = 0;
    for (int step = 0; step < STEPS && rc == 0; step++)
        rc = step == 0
                 ? fmoe_offload_forward(x, s, prompt, PLEN, FMOE_PHASE_PREFILL, NULL, logits)
                 : fmoe_offload_forward(x, s, prompt, 1, FMOE_PHASE_DECODE, NULL, logits);
    char detail[512];
    snprintf(detail, sizeof detail, "%s", fmoe_error_detail());
    const int again = fmoe_offload_forward(x, s, prompt, 1, FMOE_PHASE_DECODE, NULL, logits);
    fmoe_session_free(s);
    fmoe_offload_free(x);
    ASSERT_EQ(rc, FMOE_EINTERNAL);
    ASSERT_CONTAINS(detail, "injected failure");
    ASSERT_CONTAINS(detail, "into device slot");
    ASSERT_EQ(again, FMOE_EINTERNAL); /* the engine stays failed */
    ASSERT_FAKE_CLEAN();
}

TEST(device_slots_write_failure) {
    fmoe_model *m = load_tiny(harness_failed);
    if (!m) return;
    float *logits = calloc((size_t)fmoe_model_get_geometry(m)->vocab_size, sizeof *logits);
    write_failure_check(harness_failed, m, logits);
    free(logits);
    fmoe_model_free(m);
}

/* One pass's trace arrays, and a second set to compare. */
typedef struct trace_bufs {
    uint16_t *experts;
    float *weights, *probs, *semantic, *spec, *hidden;
    double *layer_s;
    fmoe_forward_trace tr;
} trace_bufs;

static void trace_bufs_init(trace_bufs *t, const fmoe_model_geometry *g, int32_t n, int32_t S) {
    const int64_t Lm = g->num_moe_layers, K = g->top_k, J = g->num_experts, h = g->hidden_size;
    t->experts = calloc((size_t)(n * Lm * K), 2);
    t->weights = calloc((size_t)(n * Lm * K), 4);
    t->probs = calloc((size_t)(n * Lm * J), 4);
    t->semantic = calloc((size_t)(n * h), 4);
    t->spec = calloc((size_t)(n * Lm * S * J), 4);
    t->hidden = calloc((size_t)(n * Lm * h), 4);
    t->layer_s = calloc((size_t)g->num_hidden_layers, sizeof(double));
    t->tr = (fmoe_forward_trace){.experts = t->experts, .weights = t->weights,
                                 .probs = t->probs, .semantic = t->semantic,
                                 .speculative = t->spec, .hidden = t->hidden,
                                 .layer_seconds = t->layer_s};
}

static void trace_bufs_free(trace_bufs *t) {
    free(t->experts), free(t->weights), free(t->probs), free(t->semantic), free(t->spec);
    free(t->hidden), free(t->layer_s);
}

/* The traced rows of n tokens equal, byte for byte. */
static int same_trace(const trace_bufs *a, const trace_bufs *b, const fmoe_model_geometry *g,
                      int32_t n, int32_t S) {
    const int64_t Lm = g->num_moe_layers, K = g->top_k, J = g->num_experts, h = g->hidden_size;
    return memcmp(a->experts, b->experts, (size_t)(n * Lm * K) * 2) == 0 &&
           memcmp(a->weights, b->weights, (size_t)(n * Lm * K) * 4) == 0 &&
           memcmp(a->probs, b->probs, (size_t)(n * Lm * J) * 4) == 0 &&
           memcmp(a->semantic, b->semantic, (size_t)(n * h) * 4) == 0 &&
           memcmp(a->spec, b->spec, (size_t)(n * Lm * S * J) * 4) == 0 &&
           memcmp(a->hidden, b->hidden, (size_t)(n * Lm * h) * 4) == 0;
}

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/*
 * The forward pass's waits on a device (model_impl.h, "Host waits"): a pass of n tokens
 * on the counting device, traced in full (experts, weights, probabilities, gate inputs,
 * speculative rows, the semantic rows, layer times), downloads each MoE layer's routing
 * once, the whole layout up to the speculative rows, plus the semantic rows and the
 * logits; untraced, only the experts and weights. It syncs once, at the end, timed or
 * not: the layer times come from marks. Everything it returns equals the CPU's bit for bit.
 */
static void waits_check(int *harness_failed, fmoe_model *m, trace_bufs *want, trace_bufs *got,
                        float *lw, float *lg) {
    const fmoe_model_geometry *g = fmoe_model_get_geometry(m);
    const int32_t V = g->vocab_size, Lm = g->num_moe_layers, L = g->num_hidden_layers;
    const int32_t h = g->hidden_size, J = g->num_experts, K = g->top_k, S = 2;
    fmoe_session_options so = session_options();
    so.speculative_depth = S;
    fmoe_session *ref = NULL, *dev = NULL;
    ASSERT_OK(fmoe_session_init(m, &so, &ref));
    ASSERT_OK(fmoe__session_init_backend(m, &so, counting_device(), &dev));
    int32_t tok[PLEN];
    for (int t = 0; t < PLEN; t++) tok[t] = (t * 41 + 5) % V;
    for (int step = 0; step < 4 && !*harness_failed; step++) {
        const int32_t n = step == 0 ? PLEN : 1;
        const int traced = step != 2;
        const int32_t *in = step == 0 ? tok : &tok[step];
        memset(want->layer_s, 0, (size_t)L * sizeof(double));
        memset(got->layer_s, 0, (size_t)L * sizeof(double));
        ASSERT_OK(fmoe_session_forward(ref, in, n, traced ? &want->tr : NULL, lw));
        waits_reset(lg, lg + V);
        const double t0 = wall_s();
        ASSERT_OK(fmoe_session_forward(dev, in, n, traced ? &got->tr : NULL, lg));
        const double wall = wall_s() - t0;
        if (memcmp(lw, lg, (size_t)V * 4) != 0) HARNESS_FAIL("step %d: logits differ", step);
        if (traced && !same_trace(want, got, g, n, S)) HARNESS_FAIL("step %d: trace differs", step);

        const fmoe__routing_layout lay = fmoe__routing_layout_of(n, h, J, K, S);
        const int64_t route_bytes =
            traced ? lay.off[FMOE__ROUTE_SPEC + 1] /* xn to the speculative rows */
                   : lay.off[FMOE__ROUTE_TOPW + 1] - lay.off[FMOE__ROUTE_TOPK];
        ASSERT_EQ(waits.downloads_in, 1);                     /* the logits */
        ASSERT_EQ(waits.downloads, Lm + 1 + traced);          /* + the semantic rows */
        ASSERT_EQ(waits.download_bytes,
                  Lm * route_bytes + (int64_t)V * 4 + traced * (int64_t)n * h * 4);
        ASSERT_EQ(waits.syncs, 1);
        ASSERT_EQ(waits.marks, traced ? L + 1 : 0);
        ASSERT_EQ(waits.elapsed, traced ? L : 0);
        if (traced) {
            double sum = 0;
            for (int32_t l = 0; l < L; l++) {
                ASSERT_TRUE(got->layer_s[l] > 0);
                sum += got->layer_s[l];
            }
            ASSERT_TRUE(sum <= wall);
        }
    }
    fmoe_session_free(ref);
    fmoe_session_free(dev);
}

TEST(session_waits_on_a_device) {
    fmoe_model *m = load_tiny(harness_failed);
    if (!m) return;
    const fmoe_model_geometry *g = fmoe_model_get_geometry(m);
    trace_bufs want, got;
    trace_bufs_init(&want, g, PLEN, 2);
    trace_bufs_init(&got, g, PLEN, 2);
    float *lw = calloc((size_t)g->vocab_size, sizeof *lw);
    float *lg = calloc((size_t)g->vocab_size, sizeof *lg);
    waits_check(harness_failed, m, &want, &got, lw, lg);
    free(lw), free(lg);
    trace_bufs_free(&want), trace_bufs_free(&got);
    fmoe_model_free(m);
}

/* The backend option: an unknown kind is invalid; CUDA where there is no device is refused
 * with the loader's reason (where there is one, the GPU tests run it). */
static void backend_option_check(int *harness_failed, fmoe_model *m) {
    fmoe_offload_options oo = fmoe_offload_defaults();
    oo.cache_experts = 4;
    oo.backend = (fmoe_backend_kind)7;
    fmoe_offload *x = NULL;
    ASSERT_EQ(fmoe_offload_init(&x, m, &oo), FMOE_EINVAL);
    ASSERT_TRUE(x == NULL);
    if (fmoe__cuda_backend()) return;
    oo.backend = FMOE_BACKEND_CUDA;
    ASSERT_EQ(fmoe_offload_init(&x, m, &oo), FMOE_EUNSUPPORTED);
    ASSERT_TRUE(x == NULL);
    ASSERT_TRUE(fmoe_error_detail()[0] != '\0');
}

TEST(offload_backend_option) {
    fmoe_model *m = load_tiny(harness_failed);
    if (!m) return;
    backend_option_check(harness_failed, m);
    fmoe_model_free(m);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
