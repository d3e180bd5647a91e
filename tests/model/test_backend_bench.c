/*
 * test_backend_bench - how `fmoe calibrate` times the backend (runtime/model/backend_bench.c),
 * counted on fake backends rather than timed: the CPU table with counters on matmul, sync
 * and fence_record, once as itself (host_memory: one issue per sync, as before bursts) and
 * once as a device (host_memory 0: FMOE__BENCH_DEVICE_BURST issues between syncs, because
 * the live pass does not wait for the device after each expert; slot fences).
 *
 * Every point is issued once untimed and then timed in k runs, k chosen by the bench (at
 * least `reps`, more while the point took under 20 ms); so the counts are checked as a
 * relation between issues and syncs that holds for any k: an expert is 3 matmuls and a
 * fence record, issues = 1 + burst * (syncs - 1).
 */
#include <stdatomic.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/model.h"
#include "harness.h"
#include "model_impl.h"

static atomic_long matmuls, syncs, records;

static void count_matmul(void *ctx, const fmoe__mat *w, const float *x, int32_t n, float *y) {
    atomic_fetch_add(&matmuls, 1);
    fmoe__cpu_backend.matmul(ctx, w, x, n, y);
}

static int count_sync(void *ctx) {
    atomic_fetch_add(&syncs, 1);
    return fmoe__cpu_backend.sync(ctx);
}

static int count_fence_record(void *ctx, void *fence) {
    atomic_fetch_add(&records, 1);
    return fmoe__cpu_backend.fence_record(ctx, fence);
}

static fmoe__backend_ops counting_ops;

/* The CPU table, counting; host_memory as given (0: it takes a device's paths). */
static const fmoe__backend_ops *counting_table(int host_memory) {
    counting_ops = fmoe__cpu_backend;
    counting_ops.name = host_memory ? "counting-cpu" : "counting-device";
    counting_ops.host_memory = host_memory;
    counting_ops.matmul = count_matmul;
    counting_ops.sync = count_sync;
    counting_ops.fence_record = count_fence_record;
    return &counting_ops;
}

static const fmoe_backend_bench_shape shape = {
    .hidden = 64, .ffn = 32, .heads = 2, .kv_heads = 1, .head_dim = 32, .experts = 4,
    .top_k = 2, .shared_ffn = 0, .expert_dtype = FMOE_DTYPE_BF16, .max_batch = 4,
    .max_context = 16};

/* One expert point at 2 tokens, reps 3, on the counting table: its issues and syncs. */
static void expert_point(int *harness_failed, int host_memory, long *issues, long *nsync,
                         long *nrecords) {
    fmoe_backend_bench *b = NULL;
    ASSERT_OK(fmoe__backend_bench_init_ops(&b, counting_table(host_memory), &shape, 1,
                                           FMOE_ACTIVATIONS_F32));
    atomic_store(&matmuls, 0), atomic_store(&syncs, 0), atomic_store(&records, 0);
    const int32_t tokens[1] = {2};
    double seconds[1] = {0};
    ASSERT_OK(fmoe_backend_bench_expert(b, tokens, 1, 3, seconds));
    fmoe_backend_bench_free(b);
    ASSERT_TRUE(seconds[0] > 0);
    const long mm = atomic_load(&matmuls);
    ASSERT_EQ(mm % 3, 0); /* gate, up, down per issue */
    *issues = mm / 3;
    *nsync = atomic_load(&syncs);
    *nrecords = atomic_load(&records);
}

TEST(host_memory_backend_syncs_after_every_issue) {
    long issues, nsync, nrec;
    expert_point(harness_failed, 1, &issues, &nsync, &nrec);
    ASSERT_TRUE(nsync >= 1 + 3); /* the untimed issue, then at least reps runs */
    ASSERT_EQ(issues, nsync);
    ASSERT_EQ(nrec, 0); /* a host-memory backend's slot needs no fence */
}

TEST(device_backend_times_bursts_of_issues_per_sync) {
    ASSERT_TRUE(FMOE__BENCH_DEVICE_BURST > 1);
    long issues, nsync, nrec;
    expert_point(harness_failed, 0, &issues, &nsync, &nrec);
    ASSERT_TRUE(nsync >= 1 + 3);
    ASSERT_EQ(issues, 1 + (long)FMOE__BENCH_DEVICE_BURST * (nsync - 1));
    ASSERT_EQ(nrec, issues); /* each issue records the slot's fence, as the pass does */
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
