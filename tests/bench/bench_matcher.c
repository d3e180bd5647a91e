/*
 * bench_matcher.c - throughput of the expert-map matcher and store (lib/expertmap/), for
 * tests/bench/bench_matcher.py, which runs the same searches in NumPy in the same run and
 * prints the ratios (the targets: docs/design.md §9). Not a test.
 *
 *     bench_matcher traj   L J C [B]     trajectory search: token-iterations/s (all L layers,
 *                                        one incremental step per layer; B queries at once)
 *     bench_matcher sem    h C [B]       semantic search: queries/s
 *     bench_matcher build  L J h C N     build-store: N tokens deduplicated into a full store
 *                                        of C entries (batches of 256): tokens/s
 *     bench_matcher memory L J h C       resident size of a filled store vs C·(h + L·J)·4
 *     bench_matcher sgemv M N            OpenBLAS sgemv [M][N] x [N]: GFLOP/s of this core
 *
 * Each prints one JSON object. Data are random softmax rows (sharpened) and Gaussian-ish
 * embeddings from a fixed seed; times are CLOCK_MONOTONIC and, for the per-core figure,
 * this process's CPU time. Run with OPENBLAS_NUM_THREADS=1 for per-core numbers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <cblas.h>

#include "fmoe/error.h"
#include "fmoe/expertmap.h"

static double now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rs = 0x2545F4914F6CDD1Dull;
static float frand(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 11) * (1.0 / 9007199254740992.0));
}

static void rows(float *p, int64_t n, int32_t J) {
    for (int64_t r = 0; r < n; r++) {
        double s = 0;
        for (int32_t j = 0; j < J; j++) {
            float v = frand();
            v = v * v * v * v;
            p[r * J + j] = v;
            s += v;
        }
        for (int32_t j = 0; j < J; j++) p[r * J + j] = (float)(p[r * J + j] / s);
    }
}

static void vecs(float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) v[i] = frand() + frand() + frand() - 1.5f;
}

static int die(const char *what) {
    fprintf(stderr, "bench_matcher: %s: %s\n", what, fmoe_error_detail());
    return 1;
}

/* A full store of C random entries. */
static int filled(fmoe_expertmap **s, int32_t L, int32_t J, int32_t h, int32_t C) {
    const fmoe_expertmap_config cfg = {.capacity = C, .num_layers = L, .num_experts = J,
                                       .top_k = 2, .semantic_dim = h,
                                       .prefetch_distance = L > 3 ? 3 : 0, .max_batch = 0};
    if (fmoe_expertmap_init(s, &cfg) < 0) return -1;
    const int32_t chunk = 1024;
    float *m = malloc((size_t)chunk * L * J * sizeof *m), *e = h ? malloc((size_t)chunk * h * sizeof *e) : NULL;
    for (int32_t y = 0; y < C; y += chunk) {
        const int32_t n = C - y < chunk ? C - y : chunk;
        rows(m, (int64_t)n * L, J);
        if (h) vecs(e, (int64_t)n * h);
        for (int32_t i = 0; i < n; i++)
            if (fmoe_expertmap_set(*s, y + i, h ? e + (size_t)i * h : NULL, m + (size_t)i * L * J, 0) < 0)
                return -1;
    }
    free(m);
    free(e);
    return 0;
}

/* Anonymous resident memory (RssAnon of /proc/self/status), KiB: the heap and anonymous
 * mappings, where the store lives. (The whole resident size also counts pages of the
 * program's code the kernel maps in 64 KiB at a time on first use: noise at 1 MB.) */
static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %ld", &kib) == 1) break;
    if (f) fclose(f);
    return kib;
}

static int bench_traj(int32_t L, int32_t J, int32_t C, int32_t B) {
    fmoe_expertmap *s = NULL;
    fmoe_matcher *m = NULL;
    if (filled(&s, L, J, 0, C) < 0) return die("store");
    if (fmoe_matcher_init(&m, s, B) < 0) return die("matcher");
    const int32_t Q = 64; /* distinct query maps, cycled */
    float *q = malloc((size_t)Q * B * L * J * sizeof *q);
    rows(q, (int64_t)Q * B * L, J);
    int32_t *best = malloc((size_t)B * sizeof *best);
    float *score = malloc((size_t)B * sizeof *score);
    double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID), t = 0;
    int64_t tokens = 0;
    int64_t checksum = 0;
    while (t < 1.0 || tokens < 4 * B) {
        const float *qq = q + (size_t)(tokens / B % Q) * B * L * J;
        fmoe_matcher_trajectory_begin(m, B);
        for (int32_t l = 0; l < L; l++) {
            fmoe_matcher_trajectory_add(m, l, qq + (size_t)l * J, (int64_t)L * J, best, score);
            checksum += best[0];
        }
        tokens += B;
        t = now(CLOCK_MONOTONIC) - t0;
    }
    const double cpu = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
    printf("{\"bench\": \"traj\", \"L\": %d, \"J\": %d, \"C\": %d, \"B\": %d, \"tokens\": %lld, "
           "\"wall_s\": %.4f, \"cpu_s\": %.4f, \"tokens_per_s\": %.1f, \"tokens_per_cpu_s\": %.1f, "
           "\"checksum\": %lld}\n",
           L, J, C, B, (long long)tokens, t, cpu, tokens / t, tokens / cpu, (long long)checksum);
    fmoe_matcher_free(m);
    fmoe_expertmap_free(s);
    free(q);
    free(best);
    free(score);
    return 0;
}

static int bench_sem(int32_t h, int32_t C, int32_t B) {
    fmoe_expertmap *s = NULL;
    fmoe_matcher *m = NULL;
    if (filled(&s, 1, 2, h, C) < 0) return die("store");
    if (fmoe_matcher_init(&m, s, B) < 0) return die("matcher");
    float *q = malloc((size_t)B * h * sizeof *q);
    vecs(q, (int64_t)B * h);
    int32_t *best = malloc((size_t)B * sizeof *best);
    float *score = malloc((size_t)B * sizeof *score);
    double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID), t = 0;
    int64_t n = 0;
    while (t < 1.0 || n < 4 * B) {
        fmoe_matcher_semantic(m, B, q, h, best, score);
        n += B;
        t = now(CLOCK_MONOTONIC) - t0;
    }
    const double cpu = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
    printf("{\"bench\": \"sem\", \"h\": %d, \"C\": %d, \"B\": %d, \"queries\": %lld, "
           "\"wall_s\": %.4f, \"cpu_s\": %.4f, \"queries_per_s\": %.1f, \"queries_per_cpu_s\": %.1f}\n",
           h, C, B, (long long)n, t, cpu, n / t, n / cpu);
    fmoe_matcher_free(m);
    fmoe_expertmap_free(s);
    free(q);
    free(best);
    free(score);
    return 0;
}

static int bench_build(int32_t L, int32_t J, int32_t h, int32_t C, int32_t N) {
    fmoe_expertmap *s = NULL;
    const fmoe_expertmap_config cfg = {.capacity = C, .num_layers = L, .num_experts = J,
                                       .top_k = 2, .semantic_dim = h,
                                       .prefetch_distance = L > 3 ? 3 : 0, .max_batch = 256};
    if (fmoe_expertmap_init(&s, &cfg) < 0) return die("store");
    float *m = malloc((size_t)C * L * J * sizeof *m), *e = h ? malloc((size_t)C * h * sizeof *e) : NULL;
    rows(m, (int64_t)C * L, J);
    if (h) vecs(e, (int64_t)C * h);
    fmoe_expertmap_add(s, C, e, h, m, (int64_t)L * J, NULL, NULL); /* fill (appends) */
    const int32_t B = 256;
    float *xm = malloc((size_t)B * L * J * sizeof *xm), *xe = h ? malloc((size_t)B * h * sizeof *xe) : NULL;
    double busy = 0, cpu = 0;
    for (int32_t done = 0; done < N; done += B) {
        const int32_t n = N - done < B ? N - done : B;
        rows(xm, (int64_t)n * L, J);
        if (h) vecs(xe, (int64_t)n * h);
        const double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
        if (fmoe_expertmap_add(s, n, xe, h, xm, (int64_t)L * J, NULL, NULL) < 0) return die("add");
        busy += now(CLOCK_MONOTONIC) - t0;
        cpu += now(CLOCK_PROCESS_CPUTIME_ID) - c0;
    }
    printf("{\"bench\": \"build\", \"L\": %d, \"J\": %d, \"h\": %d, \"C\": %d, \"tokens\": %d, "
           "\"wall_s\": %.4f, \"cpu_s\": %.4f, \"tokens_per_s\": %.1f, \"tokens_per_cpu_s\": %.1f}\n",
           L, J, h, C, N, busy, cpu, N / busy, N / cpu);
    fmoe_expertmap_free(s);
    free(m);
    free(e);
    free(xm);
    free(xe);
    return 0;
}

static int bench_memory(int32_t L, int32_t J, int32_t h, int32_t C) {
    /* The new entries for one deduplicating add, made first so that they are not counted. */
    const int32_t B = 256;
    float *xm = malloc((size_t)B * L * J * sizeof *xm), *xe = h ? malloc((size_t)B * h * sizeof *xe) : NULL;
    rows(xm, (int64_t)B * L, J);
    if (h) vecs(xe, (int64_t)B * h);
    /* OpenBLAS allocates its packing buffers at the first sgemm (per thread, shared by the
     * whole process, not part of any store): make them resident before measuring. */
    {
        float *wa = malloc((size_t)B * L * J * sizeof *wa), *wc = malloc((size_t)B * B * sizeof *wc);
        rows(wa, (int64_t)B * L, J);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, B, L * J, 1.0f, wa, L * J, wa,
                    L * J, 0.0f, wc, B);
        if (h) {
            float *we = malloc((size_t)B * h * sizeof *we);
            vecs(we, (int64_t)B * h);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, B, h, 1.0f, we, h, we, h, 0.0f,
                        wc, B);
            free(we);
        }
        free(wa);
        free(wc);
    }
    const long before = rss_kib();
    fmoe_expertmap *s = NULL;
    /* fill it (filled() frees its row buffers, which glibc returns to the system: they are
     * mmap-sized), then deduplicate one batch so that the scratch is resident too */
    if (filled(&s, L, J, h, C) < 0) return die("store");
    if (fmoe_expertmap_add(s, B, xe, h, xm, (int64_t)L * J, NULL, NULL) < 0) return die("add");
#ifdef __GLIBC__
    malloc_trim(0); /* the bench's own freed buffers, kept in glibc's heap, are not the store */
#endif
    const long after = rss_kib();
    free(xm);
    free(xe);
    const double formula = (double)C * (h + (double)L * J) * 4.0;
    const double measured = (double)(after - before) * 1024.0;
    printf("{\"bench\": \"memory\", \"L\": %d, \"J\": %d, \"h\": %d, \"C\": %d, "
           "\"formula_bytes\": %.0f, \"resident_bytes\": %.0f, \"ratio\": %.4f}\n",
           L, J, h, C, formula, measured, measured / formula);
    fmoe_expertmap_free(s);
    return 0;
}

/* OpenBLAS sgemv on this core: y = A x for A [M][N] row-major, the shape of the whole-map
 * dot products of one query against M stored maps of N = L·J values (the least work any
 * trajectory search per token can do with BLAS). GFLOP/s = 2·M·N per call. */
static int bench_sgemv(int32_t M, int32_t N) {
    float *a = malloc((size_t)M * N * sizeof *a), *x = malloc((size_t)N * sizeof *x),
          *y = malloc((size_t)M * sizeof *y);
    vecs(a, (int64_t)M * N);
    vecs(x, N);
    double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID), t = 0;
    int64_t calls = 0;
    while (t < 1.0 || calls < 4) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, M, N, 1.0f, a, N, x, 1, 0.0f, y, 1);
        calls++;
        t = now(CLOCK_MONOTONIC) - t0;
    }
    const double cpu = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
    printf("{\"bench\": \"sgemv\", \"M\": %d, \"N\": %d, \"calls\": %lld, \"cpu_s\": %.4f, "
           "\"calls_per_cpu_s\": %.1f, \"gflops_per_cpu_s\": %.2f}\n",
           M, N, (long long)calls, cpu, calls / cpu, 2.0 * M * N * calls / cpu / 1e9);
    free(a);
    free(x);
    free(y);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "sgemv") == 0) return bench_sgemv(atoi(argv[2]), atoi(argv[3]));
    if (argc >= 5 && strcmp(argv[1], "traj") == 0)
        return bench_traj(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), argc > 5 ? atoi(argv[5]) : 1);
    if (argc >= 4 && strcmp(argv[1], "sem") == 0)
        return bench_sem(atoi(argv[2]), atoi(argv[3]), argc > 4 ? atoi(argv[4]) : 1);
    if (argc == 7 && strcmp(argv[1], "build") == 0)
        return bench_build(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
    if (argc == 6 && strcmp(argv[1], "memory") == 0)
        return bench_memory(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    fprintf(stderr, "usage: bench_matcher traj L J C [B] | sem h C [B] | build L J h C N | "
                    "memory L J h C | sgemv M N\n");
    return 2;
}
