/*
 * test_offload_batch - the live offloading executor running batched iterations
 * (fmoe_offload_forward_batch) on the bundled tiny Qwen3-MoE (datasets/fmoe-tiny: 6 MoE
 * layers of 8 experts, top-2, bf16) with a small LRU cache: three sequences join at
 * different steps and decode together, their requests overlapping.
 *
 * Checked: the offloaded batch's logits are bit-identical to the same batches run with
 * every expert resident (the slots hold the checkpoint's own bytes); the accesses each
 * call returns are the route events' distinct experts, in order; the per-layer stats sum
 * to the executor's totals; a thread reading the layer stats while forward calls run.
 */
#include "fmoe/offload.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/policy.h"
#include "harness.h"

enum { NSEQ = 3, STEPS = 12, MAXL = 16, MAXJ = 64, MAXD = 4096 };

/* Hooks in front of the executor's: the route events' distinct experts, in order. */
typedef struct spy {
    fmoe_session_options inner; /* the executor's hooks and context */
    int32_t layer[MAXD], expert[MAXD];
    int64_t n;
} spy;

static int spy_route(void *ctx, const fmoe_route_event *ev) {
    spy *p = ctx;
    for (int32_t q = 0; q < ev->num_distinct && p->n < MAXD; q++, p->n++) {
        p->layer[p->n] = ev->layer;
        p->expert[p->n] = ev->distinct[q];
    }
    return p->inner.on_route(p->inner.route_ctx, ev);
}
static int spy_expert(void *ctx, int32_t l, int32_t j, fmoe_expert_view *w) {
    spy *p = ctx;
    return p->inner.on_expert(p->inner.route_ctx, l, j, w);
}
static void spy_done(void *ctx, int32_t l, int32_t j) {
    spy *p = ctx;
    p->inner.on_expert_done(p->inner.route_ctx, l, j);
}

/* A thread reading the layer stats as a metrics endpoint would. */
typedef struct reader {
    fmoe_offload *x;
    int32_t L, N;
    atomic_int stop;
    int reads, bad;
} reader;

static void *read_stats(void *arg) {
    reader *r = arg;
    fmoe_offload_layer_stats ls[MAXL];
    while (!atomic_load(&r->stop)) {
        fmoe_offload_get_layer_stats(r->x, ls);
        int64_t resident = 0;
        for (int32_t l = 0; l < r->L; l++) {
            resident += ls[l].resident;
            if (ls[l].host_misses > ls[l].misses || ls[l].stall_s < 0) r->bad++;
        }
        if (resident > r->N) r->bad++;
        r->reads++;
    }
    return NULL;
}

static int32_t argmax(const float *x, int32_t V) {
    int32_t b = 0;
    for (int32_t i = 1; i < V; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The schedule with `policy` and a cache of `cache` experts. */
static void run_policy(int *harness_failed, const char *policy, int32_t cache) {
    char dir[1024];
    const char *root = getenv("FMOE_SOURCE_ROOT");
    snprintf(dir, sizeof dir, "%s/datasets/fmoe-tiny", root ? root : ".");
    fmoe_model *m;
    ASSERT_OK(fmoe_model_load(dir, NULL, &m));
    const fmoe_model_geometry *g = fmoe_model_get_geometry(m);
    const int32_t V = g->vocab_size, L = g->num_moe_layers;
    ASSERT_TRUE(L <= MAXL && g->num_experts <= MAXJ);

    fmoe_offload_options oo = fmoe_offload_defaults();
    oo.policy = policy;
    oo.cache_experts = cache;
    oo.tier = FMOE_TIER_HOST;
    fmoe_offload *x;
    ASSERT_OK(fmoe_offload_init(&x, m, &oo));

    fmoe_session_options so = fmoe_session_defaults();
    so.max_context = 128;
    so.max_sequences = 8;
    so.threads = 2;
    static spy sp;
    memset(&sp, 0, sizeof sp);
    fmoe_offload_attach(x, &so);
    sp.inner = so;
    so.on_route = spy_route;
    so.on_expert = spy_expert;
    so.on_expert_done = spy_done;
    so.route_ctx = &sp;
    fmoe_session *runner, *res_runner, *off[NSEQ], *res[NSEQ];
    ASSERT_OK(fmoe_session_init(m, &so, &runner));
    fmoe_session_options plain = fmoe_session_defaults();
    plain.max_context = 128;
    plain.max_batch = so.max_batch;
    plain.max_sequences = 8;
    plain.threads = 2;
    ASSERT_OK(fmoe_session_init(m, &plain, &res_runner));
    for (int i = 0; i < NSEQ; i++) {
        ASSERT_OK(fmoe_session_init(m, &plain, &off[i]));
        ASSERT_OK(fmoe_session_init(m, &plain, &res[i]));
    }

    static reader rd;
    rd = (reader){.x = x, .L = L, .N = fmoe_offload_capacity(x)};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, read_stats, &rd), 0);

    const int32_t plen[NSEQ] = {20, 7, 12}, join[NSEQ] = {0, 1, 2};
    int32_t prompts[NSEQ][32], next[NSEQ];
    for (int i = 0; i < NSEQ; i++)
        for (int t = 0; t < plen[i]; t++) prompts[i][t] = (i * 131 + t * 17 + 5) % V;
    float *lo = malloc(sizeof(float) * NSEQ * V), *lr = malloc(sizeof(float) * NSEQ * V);
    double stall_sum = 0;
    int64_t accesses_sum = 0;
    int saw_decode_batch = 0;
    for (int step = 0; step < STEPS; step++) {
        fmoe_batch_item io[NSEQ], ir[NSEQ];
        int32_t count = 0;
        int decode = 1;
        for (int i = 0; i < NSEQ; i++) {
            if (step < join[i]) continue;
            const int prefill = step == join[i];
            if (prefill) ASSERT_OK(fmoe_offload_request_begin(x, i, prompts[i], plen[i]));
            const int32_t *tk = prefill ? prompts[i] : &next[i];
            const int32_t n = prefill ? plen[i] : 1;
            decode &= n == 1;
            io[count] = (fmoe_batch_item){.session = off[i], .tokens = tk, .n = n,
                                          .logits = lo + (int64_t)i * V};
            ir[count] = (fmoe_batch_item){.session = res[i], .tokens = tk, .n = n,
                                          .logits = lr + (int64_t)i * V};
            count++;
        }
        saw_decode_batch |= decode && count == NSEQ;
        fmoe_offload_stats before;
        fmoe_offload_get_stats(x, &before);
        sp.n = 0;
        ASSERT_OK(fmoe_offload_forward_batch(x, runner, io, count));
        ASSERT_OK(fmoe_session_forward_batch(res_runner, ir, count));
        fmoe_offload_stats after;
        fmoe_offload_get_stats(x, &after);
        ASSERT_EQ(after.iterations, before.iterations + 1); /* one iteration per batch */
        ASSERT_EQ(after.decode_iterations, before.decode_iterations + decode);

        /* the accesses are the route events' distinct experts, in order */
        int64_t na;
        const fmoe_offload_access *acc = fmoe_offload_take_accesses(x, &na);
        ASSERT_EQ(na, sp.n);
        ASSERT_EQ(na, after.accesses - before.accesses);
        for (int64_t a = 0; a < na; a++) {
            ASSERT_EQ(acc[a].layer, sp.layer[a]);
            ASSERT_EQ(acc[a].expert, sp.expert[a]);
            ASSERT_TRUE(acc[a].outcome <= 3 && acc[a].stall_s >= 0);
            stall_sum += acc[a].stall_s;
        }
        int64_t no;
        const uint8_t *oc = fmoe_offload_take_outcomes(x, &no);
        ASSERT_EQ(no, na);
        for (int64_t a = 0; a < na; a++) ASSERT_EQ(oc[a], acc[a].outcome);
        accesses_sum += na;

        for (int i = 0; i < NSEQ; i++) {
            if (step < join[i]) continue;
            /* the slots hold the checkpoint's own bytes: bit-identical */
            if (memcmp(lo + (int64_t)i * V, lr + (int64_t)i * V, sizeof(float) * V) != 0)
                HARNESS_FAIL("step %d, sequence %d: offloaded logits differ", step, i);
            next[i] = argmax(lr + (int64_t)i * V, V);
            ASSERT_EQ(fmoe_session_position(off[i]), fmoe_session_position(res[i]));
        }
    }
    for (int i = 0; i < NSEQ; i++) ASSERT_OK(fmoe_offload_request_end(x));
    atomic_store(&rd.stop, 1);
    pthread_join(th, NULL);
    ASSERT_TRUE(saw_decode_batch);
    ASSERT_EQ(rd.bad, 0);
    ASSERT_TRUE(rd.reads > 0);
    ASSERT_EQ(fmoe_session_position(runner), 0);

    /* the layers' stats sum to the totals */
    fmoe_offload_stats st;
    fmoe_offload_get_stats(x, &st);
    fmoe_offload_layer_stats ls[MAXL];
    fmoe_offload_get_layer_stats(x, ls);
    fmoe_offload_layer_stats sum = {0};
    for (int32_t l = 0; l < L; l++) {
        sum.hits += ls[l].hits;
        sum.late_hits += ls[l].late_hits;
        sum.misses += ls[l].misses;
        sum.host_misses += ls[l].host_misses;
        sum.prefetches += ls[l].prefetches;
        sum.prefetch_hits += ls[l].prefetch_hits;
        sum.bytes_loaded += ls[l].bytes_loaded;
        sum.resident += ls[l].resident;
        sum.stall_s += ls[l].stall_s;
    }
    ASSERT_EQ(st.accesses, accesses_sum);
    ASSERT_EQ(sum.hits + sum.late_hits + sum.misses, st.accesses);
    ASSERT_EQ(sum.hits, st.hits);
    ASSERT_EQ(sum.late_hits, st.late_hits);
    ASSERT_EQ(sum.misses, st.misses);
    ASSERT_EQ(sum.host_misses, st.host_misses);
    ASSERT_EQ(sum.prefetches, st.prefetches);
    ASSERT_EQ(sum.prefetch_hits, st.prefetch_hits + st.late_hits);
    ASSERT_EQ(sum.bytes_loaded, st.bytes_loaded);
    fprintf(stderr, "  %s: %lld prefetches, %lld accesses: %lld hits, %lld late, %lld misses, "
                    "%lld bytes, %.4f s stalled\n", policy, (long long)st.prefetches,
            (long long)st.accesses, (long long)st.hits, (long long)st.late_hits,
            (long long)st.misses, (long long)st.bytes_loaded, st.stall_s);
    ASSERT_TRUE(st.misses > 0 && st.hits > 0 && st.bytes_loaded > 0);
    /* the engine's own measure of the link: it copied at most what was issued (a
     * cancelled prefetch stops between chunks) plus, for each late hit, the piece in
     * flight when the access claimed it, which the demand job copies again
     * (runtime/offload/offload.c), and took time to */
    fprintf(stderr, "  %s: io %lld bytes in %.6f s\n", policy, (long long)st.io_bytes,
            st.io_busy_s);
    const int64_t expert_bytes = st.bytes_loaded / (st.misses + st.prefetches);
    ASSERT_TRUE(st.io_bytes > 0 && st.io_busy_s > 0);
    ASSERT_TRUE(st.io_bytes <= st.bytes_loaded + st.late_hits * expert_bytes);
    ASSERT_TRUE(sum.resident > 0 && sum.resident <= fmoe_offload_capacity(x));
    ASSERT_NEAR(sum.stall_s, st.stall_s, 1e-9 * (1 + st.stall_s));
    ASSERT_NEAR(stall_sum, st.stall_s, 1e-9 * (1 + st.stall_s));

    /* a refused batch computes nothing and counts no iteration */
    fmoe_batch_item dup[2] = {{.session = off[0], .tokens = next, .n = 1},
                              {.session = off[0], .tokens = next, .n = 1}};
    ASSERT_EQ(fmoe_offload_forward_batch(x, runner, dup, 2), FMOE_EINVAL);
    ASSERT_EQ(fmoe_offload_forward_batch(x, runner, dup, 0), FMOE_EINVAL);
    fmoe_offload_stats st2;
    fmoe_offload_get_stats(x, &st2);
    ASSERT_EQ(st2.accesses, st.accesses);

    free(lo);
    free(lr);
    for (int i = 0; i < NSEQ; i++) {
        fmoe_session_free(off[i]);
        fmoe_session_free(res[i]);
    }
    fmoe_session_free(runner);
    fmoe_session_free(res_runner);
    fmoe_offload_free(x);
    fmoe_model_free(m);
}

TEST(offloaded_batches_equal_resident_batches) {
    int failed = 0;
    run_policy(&failed, "lru", 20); /* of 48 experts: hits and misses */
    if (failed) HARNESS_FAIL("lru");
    run_policy(&failed, "mixtral-offload", 20); /* prefetches: hits, late hits */
    if (failed) HARNESS_FAIL("mixtral-offload");
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
