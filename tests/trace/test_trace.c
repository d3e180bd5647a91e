/*
 * test_trace.c - the trace format: round trips (every compression, float16 and float32
 * gates, every optional dataset), the iteration list, crash safety of the writer, and
 * hostile files forged directly with the HDF5 API, each of which must give a specific
 * code and a detail naming the file and the dataset.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <hdf5.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "fmoe/trace.h"
#include "fmoe_config.h"
#include "harness.h"
#include "hdf5_util.h"
#include "sample_trace.h"

/* ---------------------------------------------------------------------------------------
 * Scratch files
 * ------------------------------------------------------------------------------------- */

static char scratch_dir[512];

/* Returns "<scratch dir>/<name>" in a static buffer that the 8th next call reuses. */
static const char *tmp_path(const char *name) {
    static char bufs[8][1024];
    static int next;
    if (!scratch_dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(scratch_dir, sizeof scratch_dir, "%s/fmoe-test-trace-XXXXXX",
                 base && base[0] ? base : "/tmp");
        if (!mkdtemp(scratch_dir)) {
            perror("mkdtemp");
            abort();
        }
    }
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", scratch_dir, name);
    return b;
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw; /* nftw's callback type */
    return remove(p);
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* Writes a fresh sample to `name` and returns its path. */
static const char *fresh_sample(const char *name, int half) {
    const char *path = tmp_path(name);
    if (sample_write(path, FMOE_COMPRESSION_ZSTD, half, 0) < 0) {
        fprintf(stderr, "sample_write: %s\n", fmoe_error_detail());
        abort();
    }
    return path;
}

static const char *partial_of(const char *path) {
    static char b[1100];
    snprintf(b, sizeof b, "%s.partial", path);
    return b;
}

static int copy_file(const char *from, const char *to, long keep_bytes) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    int ok = in && out;
    long n = 0;
    int c;
    while (ok && (keep_bytes < 0 || n < keep_bytes) && (c = fgetc(in)) != EOF) {
        fputc(c, out);
        n++;
    }
    if (in) fclose(in);
    if (out) fclose(out);
    return ok ? 0 : -1;
}

static long file_size(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? (long)st.st_size : -1;
}

/* FMOE_TEST_VERBOSE=1 shows each expected error's detail, to review the messages. */
static void show_detail(int rc) {
    if (getenv("FMOE_TEST_VERBOSE"))
        fprintf(stderr, "    [%d] %s\n", rc, rc < 0 ? fmoe_error_detail() : "(no error)");
}

/* ---------------------------------------------------------------------------------------
 * Checking a sample trace
 * ------------------------------------------------------------------------------------- */

/* Checks that `r` holds the first `nreq` requests of the sample with probs_half `half`,
 * then reads it again iteration by iteration, as the simulator does. */
static void check_sample_reader(int *harness_failed, fmoe_trace_reader *r, int nreq, int half) {
    char why[256];
    const char *diff = sample_verify(r, nreq, half, why, sizeof why);
    if (diff) HARNESS_FAIL("%s (%s)", diff, fmoe_error_detail());
    ASSERT_STR_EQ(fmoe_trace_reader_header(r)->fmoe_version, FMOE_VERSION);

    int64_t nit = -1;
    const fmoe_trace_iteration *it = fmoe_trace_reader_iterations(r, &nit);
    for (int64_t i = 0; i < nit; i++) {
        uint8_t ph[SAMPLE_T];
        uint16_t ex[SAMPLE_T * SAMPLE_L * SAMPLE_K];
        float pr[SAMPLE_T * SAMPLE_L * SAMPLE_J];
        fmoe_trace_token_buffers b = {.phase = ph, .experts = ex, .probs = pr};
        ASSERT_OK(fmoe_trace_reader_read_tokens(r, it[i].token_begin, it[i].num_tokens, &b));
        for (int t = 0; t < it[i].num_tokens; t++) {
            const int64_t g = it[i].token_begin + t;
            ASSERT_EQ(ph[t], it[i].phase);
            for (int l = 0; l < SAMPLE_L; l++) {
                ASSERT_EQ(ex[(t * SAMPLE_L + l) * SAMPLE_K + 1], sample_expert(g, l, 1));
                ASSERT_NEAR(pr[(t * SAMPLE_L + l) * SAMPLE_J + 5], sample_prob(g, l, 5), 0);
            }
        }
    }
}

static void check_sample_file(int *harness_failed, const char *path, int nreq, int half) {
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, path));
    check_sample_reader(harness_failed, r, nreq, half);
    fmoe_trace_reader_close(r);
}

/* ---------------------------------------------------------------------------------------
 * Round trips
 * ------------------------------------------------------------------------------------- */

static void round_trip(int *harness_failed, fmoe_compression c, int half, int64_t chunk) {
    char name[64];
    snprintf(name, sizeof name, "rt-%d-%d-%lld.h5", (int)c, half, (long long)chunk);
    const char *path = tmp_path(name);
    ASSERT_OK(sample_write(path, c, half, chunk));
    ASSERT_TRUE(file_exists(path));
    ASSERT_TRUE(!file_exists(partial_of(path)));
    check_sample_file(harness_failed, path, SAMPLE_R, half);
    if (*harness_failed) return;
    char fmt[32];
    ASSERT_OK(fmoe_hdf5_read_format(path, fmt, sizeof fmt));
    ASSERT_STR_EQ(fmt, "fmoe-trace");
}

TEST(round_trip_zstd_f16) { round_trip(harness_failed, FMOE_COMPRESSION_ZSTD, 1, 0); }
TEST(round_trip_zstd_f32) { round_trip(harness_failed, FMOE_COMPRESSION_ZSTD, 0, 0); }
TEST(round_trip_deflate_f16) { round_trip(harness_failed, FMOE_COMPRESSION_DEFLATE, 1, 0); }
TEST(round_trip_deflate_f32) { round_trip(harness_failed, FMOE_COMPRESSION_DEFLATE, 0, 0); }
TEST(round_trip_none_f16) { round_trip(harness_failed, FMOE_COMPRESSION_NONE, 1, 0); }
TEST(round_trip_none_f32) { round_trip(harness_failed, FMOE_COMPRESSION_NONE, 0, 0); }
/* Chunks of 4 tokens: requests and reads straddle chunk boundaries. */
TEST(round_trip_small_chunks) { round_trip(harness_failed, FMOE_COMPRESSION_ZSTD, 1, 4); }

TEST(half_precision_rounding) {
    /* Values that are not exact in binary16 come back within half precision. */
    const char *path = tmp_path("halfround.h5");
    fmoe_trace_header h = sample_header(1);
    h.semantic_dim = 0;
    h.speculative_depth = 0;
    fmoe_trace_writer *w = NULL;
    ASSERT_OK(fmoe_trace_writer_open(&w, path, &h, NULL));
    int32_t tok[1] = {5};
    uint8_t ph[1] = {0};
    uint16_t ex[SAMPLE_L * SAMPLE_K];
    float pr[SAMPLE_L * SAMPLE_J];
    for (int l = 0; l < SAMPLE_L; l++) {
        ex[l * SAMPLE_K] = 0, ex[l * SAMPLE_K + 1] = 1;
        for (int j = 0; j < SAMPLE_J; j++)
            pr[l * SAMPLE_J + j] = 1.0f / (3.0f + (float)j + (float)l);
    }
    fmoe_trace_request q = {.id = 1, .prompt_tokens = 1, .token_id = tok, .phase = ph,
                            .experts = ex, .probs = pr};
    ASSERT_OK(fmoe_trace_writer_append_request(w, &q));
    ASSERT_OK(fmoe_trace_writer_close(w));
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, path));
    float back[SAMPLE_L * SAMPLE_J];
    fmoe_trace_token_buffers b = {.probs = back};
    int rc = fmoe_trace_reader_read_tokens(r, 0, 1, &b);
    fmoe_trace_reader_close(r);
    ASSERT_OK(rc);
    for (int i = 0; i < SAMPLE_L * SAMPLE_J; i++)
        ASSERT_NEAR(back[i], pr[i], pr[i] * (1.0 / 2048)); /* 11-bit significand */
}

/* Whether the reader's iterations are exactly `want`. */
static int iterations_equal(const fmoe_trace_iteration *it, int64_t n,
                            const fmoe_trace_iteration *want, int64_t nw) {
    int ok = n == nw;
    for (int64_t i = 0; ok && i < n; i++)
        ok = it[i].request == want[i].request && it[i].phase == want[i].phase &&
             it[i].num_tokens == want[i].num_tokens && it[i].token_begin == want[i].token_begin;
    return ok;
}

TEST(iterations_follow_phases) {
    const char *path = tmp_path("iters.h5");
    ASSERT_OK(sample_write(path, FMOE_COMPRESSION_ZSTD, 1, 0));
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, path));
    int64_t n = 0;
    const fmoe_trace_iteration *it = fmoe_trace_reader_iterations(r, &n);
    /* Request 0: prompt 3, output 2; request 1: 1 + 3; request 2: 4 + 0. */
    const fmoe_trace_iteration want[] = {
        {0, FMOE_PHASE_PREFILL, 3, 0}, {0, FMOE_PHASE_DECODE, 1, 3},  {0, FMOE_PHASE_DECODE, 1, 4},
        {1, FMOE_PHASE_PREFILL, 1, 5}, {1, FMOE_PHASE_DECODE, 1, 6},  {1, FMOE_PHASE_DECODE, 1, 7},
        {1, FMOE_PHASE_DECODE, 1, 8},  {2, FMOE_PHASE_PREFILL, 4, 9},
    };
    const int64_t nw = (int64_t)(sizeof want / sizeof want[0]);
    const int ok = iterations_equal(it, n, want, nw);
    fmoe_trace_reader_close(r);
    ASSERT_EQ(n, nw);
    ASSERT_TRUE(ok);
}

/* prefill_chunk: a prompt runs in chunks, each its own iteration; an offloaded recording's
 * attributes and per-access outcomes come back; bad outcome values are refused. */
TEST(prefill_chunks_and_access_outcomes) {
    const char *path = tmp_path("chunks.h5");
    fmoe_trace_header h = sample_header(1);
    h.prefill_chunk = 2;
    h.offload_cache_experts = 5;
    snprintf(h.offload_policy, sizeof h.offload_policy, "lru");
    fmoe_trace_writer *w = NULL;
    ASSERT_OK(fmoe_trace_writer_open(&w, path, &h, NULL));
    const uint8_t outcomes[4] = {0, 1, 2, 3};
    for (int r = 0; r < SAMPLE_R; r++) {
        sample_request s;
        ASSERT_OK(sample_request_make(&s, r));
        s.req.access_outcome = outcomes;
        s.req.num_access_outcomes = 1 + r;
        ASSERT_OK(fmoe_trace_writer_append_request(w, &s.req));
        sample_request_free(&s);
    }
    sample_request bad;
    ASSERT_OK(sample_request_make(&bad, 0));
    const uint8_t four = 4;
    bad.req.access_outcome = &four;
    bad.req.num_access_outcomes = 1;
    ASSERT_EQ(fmoe_trace_writer_append_request(w, &bad.req), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "access_outcome[0] = 4");
    sample_request_free(&bad);
    ASSERT_OK(fmoe_trace_writer_close(w));

    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, path));
    const fmoe_trace_header *got = fmoe_trace_reader_header(r);
    ASSERT_EQ(got->prefill_chunk, 2);
    ASSERT_EQ(got->offload_cache_experts, 5);
    ASSERT_TRUE(strcmp(got->offload_policy, "lru") == 0);
    int64_t n = 0;
    const fmoe_trace_iteration *it = fmoe_trace_reader_iterations(r, &n);
    /* Request 0: prompt 3 (chunks 2 + 1), output 2; request 1: 1 + 3; request 2: 4 (2 + 2). */
    const fmoe_trace_iteration want[] = {
        {0, FMOE_PHASE_PREFILL, 2, 0}, {0, FMOE_PHASE_PREFILL, 1, 2}, {0, FMOE_PHASE_DECODE, 1, 3},
        {0, FMOE_PHASE_DECODE, 1, 4},  {1, FMOE_PHASE_PREFILL, 1, 5}, {1, FMOE_PHASE_DECODE, 1, 6},
        {1, FMOE_PHASE_DECODE, 1, 7},  {1, FMOE_PHASE_DECODE, 1, 8},  {2, FMOE_PHASE_PREFILL, 2, 9},
        {2, FMOE_PHASE_PREFILL, 2, 11},
    };
    const int64_t nw = (int64_t)(sizeof want / sizeof want[0]);
    const int ok = iterations_equal(it, n, want, nw);
    fmoe_trace_reader_close(r);
    ASSERT_EQ(n, nw);
    ASSERT_TRUE(ok);
    ASSERT_EQ(fmoe_trace_request_iterations(65, 3, 64), 5);
    ASSERT_EQ(fmoe_trace_request_iterations(65, 3, 0), 4);
    ASSERT_EQ(fmoe_trace_request_iterations(0, 3, 64), 3);
}

/* served (fmoe serve --trace-out): each token's pass and its seconds are required with the
 * header flag, refused without it, and validated; the flag comes back. */
TEST(served_iterations) {
    const char *path = tmp_path("served.h5");
    fmoe_trace_header h = sample_header(1);
    h.served = 1;
    fmoe_trace_writer *w = NULL;
    ASSERT_OK(fmoe_trace_writer_open(&w, path, &h, NULL));
    int64_t iters[64];
    float secs[64];
    for (int i = 0; i < 64; i++) {
        iters[i] = 10 + i;
        secs[i] = 0.25f;
    }
    sample_request s;
    ASSERT_OK(sample_request_make(&s, 0));
    ASSERT_EQ(fmoe_trace_writer_append_request(w, &s.req), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "served_iteration and served_s are required");
    s.req.served_iteration = iters;
    s.req.served_s = secs;
    iters[1] = -1;
    ASSERT_EQ(fmoe_trace_writer_append_request(w, &s.req), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "token 1: served iteration -1");
    iters[1] = 11;
    ASSERT_OK(fmoe_trace_writer_append_request(w, &s.req));
    ASSERT_OK(fmoe_trace_writer_close(w));
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, path));
    ASSERT_EQ(fmoe_trace_reader_header(r)->served, 1);
    fmoe_trace_reader_close(r);

    h.served = 0;
    ASSERT_OK(fmoe_trace_writer_open(&w, tmp_path("not-served.h5"), &h, NULL));
    ASSERT_EQ(fmoe_trace_writer_append_request(w, &s.req), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "header.served is 0");
    fmoe_trace_writer_abort(w);
    sample_request_free(&s);
    h.served = 2;
    ASSERT_EQ(fmoe_trace_writer_open(&w, path, &h, NULL), FMOE_EINVAL);
}

/* The reader's served_iteration buffer: each token's pass, by range, from a served trace;
 * from another trace, one error that says so. */
TEST(served_iterations_read_back) {
    const char *path = tmp_path("served-read.h5");
    fmoe_trace_header h = sample_header(1);
    h.served = 1;
    fmoe_trace_writer *w = NULL;
    ASSERT_OK(fmoe_trace_writer_open(&w, path, &h, NULL));
    int64_t iters[64];
    float secs[64];
    for (int i = 0; i < 64; i++) iters[i] = 3 * i + 1, secs[i] = 0.5f;
    sample_request s;
    ASSERT_OK(sample_request_make(&s, 0));
    s.req.served_iteration = iters;
    s.req.served_s = secs;
    ASSERT_OK(fmoe_trace_writer_append_request(w, &s.req));
    for (int i = 0; i < 64; i++) iters[i] = 1000 + i;
    ASSERT_OK(fmoe_trace_writer_append_request(w, &s.req));
    ASSERT_OK(fmoe_trace_writer_close(w));
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, path));
    const fmoe_trace_request_info *req = fmoe_trace_reader_requests(r);
    const int64_t n = req[0].token_count;
    ASSERT_TRUE(n >= 2 && n <= 64);
    int64_t got[128];
    uint8_t phase[128];
    const fmoe_trace_token_buffers buf = {.phase = phase, .served_iteration = got};
    ASSERT_OK(fmoe_trace_reader_read_tokens(r, 0, 2 * n, &buf));
    for (int64_t i = 0; i < n; i++) {
        ASSERT_EQ(got[i], 3 * i + 1);
        ASSERT_EQ(got[n + i], 1000 + i);
    }
    ASSERT_OK(fmoe_trace_reader_read_tokens(r, n - 1, 2, &buf)); /* a range across both */
    ASSERT_EQ(got[0], 3 * (n - 1) + 1);
    ASSERT_EQ(got[1], 1000);
    fmoe_trace_reader_close(r);

    /* not served: the buffer is refused, the others still read */
    const char *plain = tmp_path("plain-read.h5");
    h.served = 0;
    s.req.served_iteration = NULL;
    s.req.served_s = NULL;
    ASSERT_OK(fmoe_trace_writer_open(&w, plain, &h, NULL));
    ASSERT_OK(fmoe_trace_writer_append_request(w, &s.req));
    ASSERT_OK(fmoe_trace_writer_close(w));
    ASSERT_OK(fmoe_trace_reader_open(&r, plain));
    ASSERT_EQ(fmoe_trace_reader_read_tokens(r, 0, 1, &buf), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "no /tokens/served_iteration: not a trace of fmoe serve");
    ASSERT_CONTAINS(fmoe_error_detail(), "plain-read.h5");
    const fmoe_trace_token_buffers phase_only = {.phase = phase};
    ASSERT_OK(fmoe_trace_reader_read_tokens(r, 0, 1, &phase_only));
    fmoe_trace_reader_close(r);
    sample_request_free(&s);
}

TEST(minimal_trace_and_empty_requests) {
    /* No probs, no semantic, no speculative; a request with no tokens; L = J = K = 1. */
    const char *path = tmp_path("minimal.h5");
    fmoe_trace_header h;
    memset(&h, 0, sizeof h);
    h.num_layers = 1, h.num_experts = 1, h.top_k = 1;
    h.probs_kind = FMOE_PROBS_NONE;
    fmoe_trace_writer *w = NULL;
    ASSERT_OK(fmoe_trace_writer_open(&w, path, &h,
                                     &(fmoe_trace_write_options){.compression = FMOE_COMPRESSION_DEFLATE, .level = 9, .chunk_tokens = 0}));
    fmoe_trace_request empty = {.id = -5, .arrival_s = 2.0};
    ASSERT_OK(fmoe_trace_writer_append_request(w, &empty));
    int32_t tok[2] = {-1, 7};
    uint8_t ph[2] = {1, 1};
    uint16_t ex[2] = {0, 0};
    fmoe_trace_request dec = {
        .id = 9, .output_tokens = 2, .token_id = tok, .phase = ph, .experts = ex};
    ASSERT_OK(fmoe_trace_writer_append_request(w, &dec));
    ASSERT_OK(fmoe_trace_writer_close(w));

    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, path));
    const fmoe_trace_header *rh = fmoe_trace_reader_header(r);
    int64_t n = 0;
    const fmoe_trace_iteration *it = fmoe_trace_reader_iterations(r, &n);
    const fmoe_trace_request_info *q = fmoe_trace_reader_requests(r);
    float probs[2];
    int rc_probs =
        fmoe_trace_reader_read_tokens(r, 0, 1, &(fmoe_trace_token_buffers){.probs = probs});
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", fmoe_error_detail());
    int32_t back[2];
    int rc_tok =
        fmoe_trace_reader_read_tokens(r, 0, 2, &(fmoe_trace_token_buffers){.token_id = back});
    int rc_range =
        fmoe_trace_reader_read_tokens(r, 1, 2, &(fmoe_trace_token_buffers){.token_id = back});
    int64_t R = fmoe_trace_reader_num_requests(r), T = fmoe_trace_reader_num_tokens(r);
    int kind = rh->probs_kind, sd = rh->semantic_dim, cj_null = rh->config_json == NULL;
    const int no_activations = rh->activations[0] == '\0'; /* no attribute: not known */
    int64_t q0_count = q[0].token_count, q0_id = q[0].id, q1_begin = q[1].token_begin;
    int it_ok = n == 2 && it[0].request == 1 && it[1].token_begin == 1;
    fmoe_trace_reader_close(r);
    ASSERT_EQ(R, 2);
    ASSERT_EQ(T, 2);
    ASSERT_EQ(kind, FMOE_PROBS_NONE);
    ASSERT_EQ(sd, 0);
    ASSERT_TRUE(cj_null);
    ASSERT_TRUE(no_activations);
    ASSERT_EQ(q0_count, 0);
    ASSERT_EQ(q0_id, -5);
    ASSERT_EQ(q1_begin, 0);
    ASSERT_TRUE(it_ok);
    ASSERT_EQ(rc_probs, FMOE_EINVAL);
    ASSERT_CONTAINS(detail, "/tokens/probs");
    ASSERT_OK(rc_tok);
    ASSERT_EQ(back[0], -1);
    ASSERT_EQ(back[1], 7);
    ASSERT_EQ(rc_range, FMOE_ERANGE);
}

TEST(empty_trace) {
    const char *path = tmp_path("empty.h5");
    fmoe_trace_header h = sample_header(0);
    fmoe_trace_writer *w = NULL;
    ASSERT_OK(fmoe_trace_writer_open(&w, path, &h, NULL));
    ASSERT_OK(fmoe_trace_writer_close(w));
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, path));
    int64_t n = -1;
    fmoe_trace_reader_iterations(r, &n);
    int64_t R = fmoe_trace_reader_num_requests(r), T = fmoe_trace_reader_num_tokens(r);
    int rc = fmoe_trace_reader_read_tokens(r, 0, 0, &(fmoe_trace_token_buffers){0});
    fmoe_trace_reader_close(r);
    ASSERT_EQ(R, 0);
    ASSERT_EQ(T, 0);
    ASSERT_EQ(n, 0);
    ASSERT_OK(rc);
}

TEST(large_rows_split_chunks) {
    /* One token's speculative gates are 2 MiB here: chunks must split the inner
     * dimensions and stay near the 1 MiB cap, and the data must still round-trip. */
    enum { L = 64, S = 63, J = 128, K = 4 };
    const char *path = tmp_path("bigrows.h5");
    fmoe_trace_header h;
    memset(&h, 0, sizeof h);
    h.num_layers = L, h.num_experts = J, h.top_k = K, h.speculative_depth = S;
    h.probs_kind = FMOE_PROBS_TOPK;
    size_t nspec = (size_t)2 * L * S * J;
    float *spec = malloc(nspec * sizeof *spec), *back = malloc(nspec * sizeof *back);
    float *probs = calloc((size_t)2 * L * J, sizeof *probs);
    uint16_t *ex = malloc((size_t)2 * L * K * sizeof *ex);
    ASSERT_TRUE(spec && back && probs && ex);
    for (size_t i = 0; i < nspec; i++) spec[i] = (float)(i % 1000) / 1000.0f;
    for (int t = 0; t < 2; t++)
        for (int l = 0; l < L; l++)
            for (int k = 0; k < K; k++) {
                ex[(t * L + l) * K + k] = (uint16_t)((l + 7 * k + t) % J);
                probs[(t * L + l) * J + ex[(t * L + l) * K + k]] = 0.25f;
            }
    int32_t tok[2] = {1, 2};
    uint8_t ph[2] = {0, 1};
    fmoe_trace_request q = {.id = 1, .prompt_tokens = 1, .output_tokens = 1, .token_id = tok,
                            .phase = ph, .experts = ex, .probs = probs, .speculative = spec};
    fmoe_trace_writer *w = NULL;
    int rc = fmoe_trace_writer_open(&w, path, &h, NULL);
    if (rc == 0) rc = fmoe_trace_writer_append_request(w, &q);
    if (rc == 0)
        rc = fmoe_trace_writer_close(w);
    else
        fmoe_trace_writer_abort(w);
    fmoe_trace_reader *r = NULL;
    if (rc == 0) rc = fmoe_trace_reader_open(&r, path);
    if (rc == 0)
        rc = fmoe_trace_reader_read_tokens(r, 0, 2,
                                           &(fmoe_trace_token_buffers){.speculative = back});
    fmoe_trace_reader_close(r);
    int same = rc == 0 && memcmp(spec, back, nspec * sizeof *spec) == 0;
    free(spec), free(back), free(probs), free(ex);
    ASSERT_OK(rc);
    ASSERT_TRUE(same);

    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "/tokens/speculative", H5P_DEFAULT);
    hid_t dcpl = H5Dget_create_plist(d);
    hsize_t chunk[4] = {0};
    int rank = H5Pget_chunk(dcpl, 4, chunk);
    H5Pclose(dcpl), H5Dclose(d), H5Fclose(f);
    ASSERT_EQ(rank, 4);
    uint64_t bytes = 4 * chunk[0] * chunk[1] * chunk[2] * chunk[3];
    ASSERT_EQ(chunk[0], 1);
    ASSERT_TRUE(bytes <= (1u << 20) && bytes >= (128u << 10));
}

TEST(chunks_are_sized_for_io) {
    /* Automatic chunks of the sample's token datasets hold 256 KiB to 1 MiB. */
    const char *path = tmp_path("chunks.h5");
    ASSERT_OK(sample_write(path, FMOE_COMPRESSION_ZSTD, 1, 0));
    const char *names[] = {"/tokens/token_id", "/tokens/experts", "/tokens/probs",
                           "/tokens/semantic", "/tokens/speculative"};
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_TRUE(f >= 0);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        hid_t d = H5Dopen2(f, names[i], H5P_DEFAULT);
        hid_t dcpl = H5Dget_create_plist(d), type = H5Dget_type(d);
        hsize_t chunk[4] = {1, 1, 1, 1};
        int rank = H5Pget_chunk(dcpl, 4, chunk);
        uint64_t bytes = H5Tget_size(type);
        for (int k = 0; k < rank; k++) bytes *= chunk[k];
        int nfilters = H5Pget_nfilters(dcpl);
        int has_zstd = 0;
        for (int k = 0; k < nfilters; k++) {
            unsigned flags, cd[4];
            size_t ncd = 4;
            if (H5Pget_filter2(dcpl, (unsigned)k, &flags, &ncd, cd, 0, NULL, NULL) == 32015)
                has_zstd = ncd >= 1 && cd[0] == 3;
        }
        H5Tclose(type), H5Pclose(dcpl), H5Dclose(d);
        if (!(bytes >= (256u << 10) && bytes <= (1u << 20)) || !has_zstd) {
            H5Fclose(f);
            HARNESS_FAIL("%s: chunk of %llu bytes, zstd level 3 filter %d", names[i],
                         (unsigned long long)bytes, has_zstd);
        }
    }
    H5Fclose(f);
}

/* ---------------------------------------------------------------------------------------
 * Writer lifecycle and crash safety
 * ------------------------------------------------------------------------------------- */

TEST(abort_leaves_no_file) {
    const char *path = tmp_path("aborted.h5");
    fmoe_trace_header h = sample_header(1);
    fmoe_trace_writer *w = NULL;
    ASSERT_OK(fmoe_trace_writer_open(&w, path, &h, NULL));
    ASSERT_TRUE(file_exists(partial_of(path)));
    ASSERT_OK(sample_append(w, 2));
    fmoe_trace_writer_abort(w);
    ASSERT_TRUE(!file_exists(path));
    ASSERT_TRUE(!file_exists(partial_of(path)));
    fmoe_trace_writer_abort(NULL);
}

TEST(killed_writer_leaves_readable_partial) {
    const char *path = tmp_path("killed.h5");
    fflush(NULL);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        /* The child appends two requests and dies without closing: no rename, no
         * H5Fclose, no atexit handlers, as if killed right after the second append. */
        fmoe_trace_header h = sample_header(1);
        fmoe_trace_writer *w = NULL;
        if (fmoe_trace_writer_open(&w, path, &h, NULL) < 0) _exit(3);
        if (sample_append(w, 2) < 0) _exit(4);
        _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0);
    ASSERT_TRUE(!file_exists(path));
    ASSERT_TRUE(file_exists(partial_of(path)));
    check_sample_file(harness_failed, partial_of(path), 2, 1);
}

TEST(writer_open_errors) {
    fmoe_trace_header h = sample_header(1);
    fmoe_trace_writer *w = NULL;
    ASSERT_EQ(fmoe_trace_writer_open(&w, "/nonexistent-dir/x/t.h5", &h, NULL), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "/nonexistent-dir/x/t.h5.partial");
    ASSERT_TRUE(w == NULL);
    const char *path = tmp_path("badopts.h5");
    ASSERT_EQ(fmoe_trace_writer_open(&w, path, &h,
                                     &(fmoe_trace_write_options){.compression = FMOE_COMPRESSION_ZSTD, .level = 25, .chunk_tokens = 0}),
              FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "zstd level");
    ASSERT_EQ(fmoe_trace_writer_open(&w, path, &h,
                                     &(fmoe_trace_write_options){.compression = FMOE_COMPRESSION_DEFLATE, .level = 10, .chunk_tokens = 0}),
              FMOE_EINVAL);
    ASSERT_EQ(fmoe_trace_writer_open(&w, path, &h,
                                     &(fmoe_trace_write_options){.compression = (fmoe_compression)7, .level = 0, .chunk_tokens = 0}),
              FMOE_EINVAL);
    ASSERT_EQ(fmoe_trace_writer_open(&w, path, &h,
                                     &(fmoe_trace_write_options){.compression = FMOE_COMPRESSION_NONE, .level = 0, .chunk_tokens = -1}),
              FMOE_EINVAL);
    ASSERT_TRUE(!file_exists(partial_of(path)));
}

/* Opens a writer on a header changed by `edit`; expects EINVAL naming `field`. */
#define EXPECT_BAD_HEADER(edit, field)                                                             \
    do {                                                                                           \
        fmoe_trace_header h = sample_header(1);                                                    \
        edit;                                                                                      \
        fmoe_trace_writer *w = NULL;                                                               \
        int rc = fmoe_trace_writer_open(&w, tmp_path("badheader.h5"), &h, NULL);                   \
        if (rc == 0) fmoe_trace_writer_abort(w);                                                   \
        show_detail(rc);                                                                           \
        ASSERT_EQ(rc, FMOE_EINVAL);                                                                \
        ASSERT_CONTAINS(fmoe_error_detail(), field);                                               \
        ASSERT_TRUE(!file_exists(partial_of(tmp_path("badheader.h5"))));                           \
    } while (0)

TEST(writer_validates_header) {
    EXPECT_BAD_HEADER(h.num_layers = 0, "num_layers");
    EXPECT_BAD_HEADER(h.num_experts = 0, "num_experts");
    EXPECT_BAD_HEADER(h.num_experts = 65536, "num_experts");
    EXPECT_BAD_HEADER(h.top_k = 0, "top_k");
    EXPECT_BAD_HEADER(h.top_k = SAMPLE_J + 1, "top_k");
    EXPECT_BAD_HEADER(h.hidden_size = -1, "hidden_size");
    EXPECT_BAD_HEADER(h.expert_bytes = -1, "expert_bytes");
    EXPECT_BAD_HEADER(h.probs_kind = (fmoe_probs_kind)3, "probs_kind");
    EXPECT_BAD_HEADER(h.probs_half = 2, "probs_half");
    EXPECT_BAD_HEADER(h.semantic_dim = -1, "semantic_dim");
    EXPECT_BAD_HEADER(h.speculative_depth = SAMPLE_L, "speculative_depth");
    EXPECT_BAD_HEADER(memset(h.dtype, 'x', sizeof h.dtype), "dtype");
    EXPECT_BAD_HEADER(snprintf(h.model_name, sizeof h.model_name, "bad \xff utf8"), "model_name");
    EXPECT_BAD_HEADER(snprintf(h.semantic_kind, sizeof h.semantic_kind, "pooled"), "semantic_kind");
    EXPECT_BAD_HEADER(h.config_json = "{\"x\": \"\xc3\"}", "config_json");
    EXPECT_BAD_HEADER(snprintf(h.activations, sizeof h.activations, "q4"), "activations");
    int64_t over[SAMPLE_L], zero[SAMPLE_L];
    for (int l = 0; l < SAMPLE_L; l++) over[l] = zero[l] = SAMPLE_EXPERT_BYTES;
    over[1] = SAMPLE_EXPERT_BYTES + 1; /* expert_bytes is the largest layer's */
    zero[SAMPLE_L - 1] = 0;
    EXPECT_BAD_HEADER(h.layer_expert_bytes = over, "layer_expert_bytes");
    EXPECT_BAD_HEADER(h.layer_expert_bytes = zero, "layer_expert_bytes");
}

/* Experts whose bytes differ by layer (a llama-quantize mix): the per-layer figures are
 * stored and read back; figures equal to expert_bytes everywhere store nothing. */
TEST(layer_expert_bytes_round_trip) {
    int64_t mixed[SAMPLE_L], uniform[SAMPLE_L];
    for (int l = 0; l < SAMPLE_L; l++) {
        mixed[l] = SAMPLE_EXPERT_BYTES - 1000 * (l % 2);
        uniform[l] = SAMPLE_EXPERT_BYTES;
    }
    const int64_t *cases[2] = {mixed, uniform};
    for (int c = 0; c < 2; c++) {
        const char *path = tmp_path(c ? "uniform.h5" : "mixed.h5");
        fmoe_trace_header h = sample_header(1);
        h.layer_expert_bytes = cases[c];
        fmoe_trace_writer *w = NULL;
        ASSERT_OK(fmoe_trace_writer_open(&w, path, &h, NULL));
        ASSERT_OK(sample_append(w, 1));
        ASSERT_OK(fmoe_trace_writer_close(w));
        fmoe_trace_reader *r = NULL;
        ASSERT_OK(fmoe_trace_reader_open(&r, path));
        const fmoe_trace_header *got = fmoe_trace_reader_header(r);
        ASSERT_EQ(got->expert_bytes, SAMPLE_EXPERT_BYTES);
        if (c == 1) {
            ASSERT_TRUE(got->layer_expert_bytes == NULL);
        } else {
            ASSERT_TRUE(got->layer_expert_bytes != NULL);
            for (int l = 0; l < SAMPLE_L; l++) ASSERT_EQ(got->layer_expert_bytes[l], mixed[l]);
        }
        fmoe_trace_reader_close(r);
    }
}

/* Appends sample request 0 changed by `edit`; expects EINVAL whose detail contains
 * `needle`. The writer stays usable: the caller's good requests still close into a file. */
#define EXPECT_BAD_REQUEST(w, edit, needle)                                                        \
    do {                                                                                           \
        sample_request s;                                                                          \
        ASSERT_TRUE(sample_request_make(&s, 0) == 0);                                              \
        edit;                                                                                      \
        int rc = fmoe_trace_writer_append_request((w), &s.req);                                    \
        sample_request_free(&s);                                                                   \
        show_detail(rc);                                                                           \
        ASSERT_EQ(rc, FMOE_EINVAL);                                                                \
        ASSERT_CONTAINS(fmoe_error_detail(), needle);                                              \
    } while (0)

static void bad_requests(int *harness_failed, fmoe_trace_writer *w) {
    EXPECT_BAD_REQUEST(w, s.experts[7] = SAMPLE_J, "experts[1][0][1] = 8");
    EXPECT_BAD_REQUEST(w, s.experts[7] = 65535, "expected < num_experts (8)");
    EXPECT_BAD_REQUEST(w, s.experts[1] = s.experts[0], "repeats an expert");
    EXPECT_BAD_REQUEST(w, s.phase[3] = FMOE_PHASE_PREFILL, "phase[3]");
    EXPECT_BAD_REQUEST(w, s.phase[0] = 7, "phase[0]");
    EXPECT_BAD_REQUEST(w, s.token_id[2] = -2, "token_id[2]");
    EXPECT_BAD_REQUEST(w, s.probs[5] = 1.5f, "probs[0][0][5]");
    EXPECT_BAD_REQUEST(w, s.probs[9] = NAN, "probs[0][1][1]");
    EXPECT_BAD_REQUEST(w, s.speculative[0] = -0.5f, "speculative[0][0][0][0]");
    EXPECT_BAD_REQUEST(w, s.semantic[3] = INFINITY, "semantic[0][3]");
    EXPECT_BAD_REQUEST(w, s.req.probs = NULL, "probs is NULL");
    EXPECT_BAD_REQUEST(w, s.req.semantic = NULL, "semantic is NULL");
    EXPECT_BAD_REQUEST(w, s.req.experts = NULL, "experts is NULL");
    EXPECT_BAD_REQUEST(w, s.req.prompt_tokens = -1, "prompt_tokens");
    EXPECT_BAD_REQUEST(w, s.req.arrival_s = -1, "arrival_s");
}

TEST(writer_validates_requests) {
    const char *path = tmp_path("badreq.h5");
    fmoe_trace_header h = sample_header(1);
    fmoe_trace_writer *w = NULL;
    ASSERT_OK(fmoe_trace_writer_open(&w, path, &h, NULL));
    ASSERT_OK(sample_append(w, 1));
    bad_requests(harness_failed, w);
    if (*harness_failed) {
        fmoe_trace_writer_abort(w);
        return;
    }
    ASSERT_CONTAINS(fmoe_error_detail(), path);
    /* Refused requests changed nothing: appending request 1 gives the 2-request sample. */
    sample_request s;
    ASSERT_TRUE(sample_request_make(&s, 1) == 0);
    int rc = fmoe_trace_writer_append_request(w, &s.req);
    sample_request_free(&s);
    if (rc < 0) fmoe_trace_writer_abort(w);
    ASSERT_OK(rc);
    ASSERT_OK(fmoe_trace_writer_close(w));
    check_sample_file(harness_failed, path, 2, 1);
}

TEST(writer_refuses_probs_when_kind_none) {
    fmoe_trace_header h = sample_header(1);
    h.probs_kind = FMOE_PROBS_NONE;
    fmoe_trace_writer *w = NULL;
    ASSERT_OK(fmoe_trace_writer_open(&w, tmp_path("kindnone.h5"), &h, NULL));
    sample_request s;
    ASSERT_TRUE(sample_request_make(&s, 0) == 0);
    int rc = fmoe_trace_writer_append_request(w, &s.req);
    sample_request_free(&s);
    fmoe_trace_writer_abort(w);
    ASSERT_EQ(rc, FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "probs_kind is none");
}

typedef struct thread_job {
    const char *path;
    int write; /* 1: write the sample to path; 0: read and verify it, 20 times */
    int rc;
    char why[256];
} thread_job;

static void *thread_main(void *arg) {
    thread_job *j = arg;
    if (j->write) {
        j->rc = sample_write(j->path, FMOE_COMPRESSION_ZSTD, 1, 4);
        return NULL;
    }
    for (int i = 0; i < 20 && j->rc == 0; i++) {
        fmoe_trace_reader *r = NULL;
        j->rc = fmoe_trace_reader_open(&r, j->path);
        if (j->rc == 0 && sample_verify(r, SAMPLE_R, 1, j->why, sizeof j->why)) j->rc = -100;
        fmoe_trace_reader_close(r);
    }
    return NULL;
}

TEST(threads_share_the_library) {
    /* The serial HDF5 must never be entered twice at once; trace/ serialises its entry
     * points, so readers and writers on different threads just work. */
    char src[1024];
    snprintf(src, sizeof src, "%s", fresh_sample("threads-src.h5", 1));
    enum { N = 6 };
    thread_job jobs[N];
    char outs[N][1024];
    pthread_t tids[N];
    for (int i = 0; i < N; i++) {
        snprintf(outs[i], sizeof outs[i], "%s",
                 tmp_path(i % 2 ? "threads-w1.h5" : "threads-w0.h5"));
        jobs[i] = (thread_job){.path = i < 2 ? outs[i] : src, .write = i < 2};
        ASSERT_EQ(pthread_create(&tids[i], NULL, thread_main, &jobs[i]), 0);
    }
    for (int i = 0; i < N; i++) pthread_join(tids[i], NULL);
    for (int i = 0; i < N; i++)
        if (jobs[i].rc != 0)
            HARNESS_FAIL("thread %d: rc %d: %s %s", i, jobs[i].rc, jobs[i].why,
                         fmoe_error_detail());
    check_sample_file(harness_failed, outs[0], SAMPLE_R, 1);
    check_sample_file(harness_failed, outs[1], SAMPLE_R, 1);
}

/* ---------------------------------------------------------------------------------------
 * Hostile and damaged files
 * ------------------------------------------------------------------------------------- */

/* Opens `path`; expects `code` and a detail containing path and each needle. */
static void expect_open_fails(int *harness_failed, const char *path, int code, const char *needle1,
                              const char *needle2) {
    fmoe_trace_reader *r = NULL;
    int rc = fmoe_trace_reader_open(&r, path);
    fmoe_trace_reader_close(r);
    show_detail(rc);
    ASSERT_EQ(rc, code);
    ASSERT_CONTAINS(fmoe_error_detail(), path);
    if (needle1) ASSERT_CONTAINS(fmoe_error_detail(), needle1);
    if (needle2) ASSERT_CONTAINS(fmoe_error_detail(), needle2);
}

/* Opens `path` (which must open) and reads all tokens into buffers big enough for the
 * sample; expects `code` and a detail containing the path and the needles. */
static void expect_read_fails(int *harness_failed, const char *path, int code, const char *needle1,
                              const char *needle2) {
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, path));
    int32_t tok[SAMPLE_T];
    uint8_t phase[SAMPLE_T];
    uint16_t experts[SAMPLE_T * SAMPLE_L * SAMPLE_K];
    float probs[SAMPLE_T * SAMPLE_L * SAMPLE_J], sem[SAMPLE_T * SAMPLE_H];
    float spec[SAMPLE_T * SAMPLE_L * SAMPLE_S * SAMPLE_J];
    fmoe_trace_token_buffers all = {.token_id = tok, .phase = phase, .experts = experts,
                                    .probs = probs, .semantic = sem, .speculative = spec};
    int rc = fmoe_trace_reader_read_tokens(r, 0, SAMPLE_T, &all);
    fmoe_trace_reader_close(r);
    show_detail(rc);
    ASSERT_EQ(rc, code);
    ASSERT_CONTAINS(fmoe_error_detail(), path);
    if (needle1) ASSERT_CONTAINS(fmoe_error_detail(), needle1);
    if (needle2) ASSERT_CONTAINS(fmoe_error_detail(), needle2);
}

static hid_t forge_open(const char *path) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) abort();
    return f;
}

static void forge_str_attr(const char *path, const char *name, const char *value) {
    hid_t f = forge_open(path);
    H5Adelete(f, name);
    if (fmoe__h5_attr_write_str(f, path, name, value) < 0) abort();
    H5Fclose(f);
}

static void forge_int_attr(const char *path, const char *name, hid_t type, int64_t value) {
    hid_t f = forge_open(path);
    H5Adelete(f, name);
    if (fmoe__h5_attr_write_int(f, path, name, type, value) < 0) abort();
    H5Fclose(f);
}

/* Replaces dataset `name` by a contiguous one of `type` and shape dims[rank], zero-filled
 * (allocated = stored) unless `unwritten`. */
static void forge_dataset2(const char *path, const char *name, hid_t type, int rank,
                           const hsize_t *dims, int unwritten) {
    hid_t f = forge_open(path);
    H5Ldelete(f, name, H5P_DEFAULT);
    hid_t space = H5Screate_simple(rank, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_alloc_time(dcpl, unwritten ? H5D_ALLOC_TIME_LATE : H5D_ALLOC_TIME_EARLY);
    hid_t d = H5Dcreate2(f, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (d < 0) abort();
    H5Dclose(d), H5Pclose(dcpl), H5Sclose(space), H5Fclose(f);
}

static void forge_dataset(const char *path, const char *name, hid_t type, int rank,
                          const hsize_t *dims) {
    forge_dataset2(path, name, type, rank, dims, 0);
}

/* Sets dimension 0 of dataset `name` to `rows` without writing anything. */
static void forge_extent(const char *path, const char *name, hsize_t rows) {
    hid_t f = forge_open(path);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    hid_t fs = H5Dget_space(d);
    hsize_t dims[4];
    int rank = H5Sget_simple_extent_dims(fs, dims, NULL);
    dims[0] = rows;
    if (rank < 1 || H5Dset_extent(d, dims) < 0) abort();
    H5Sclose(fs), H5Dclose(d), H5Fclose(f);
}

/* Writes one element at coords[rank] of dataset `name`, converting from mem_type. */
static void forge_element(const char *path, const char *name, int rank, const hsize_t *coords,
                          hid_t mem_type, const void *value) {
    hid_t f = forge_open(path);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    hid_t fs = H5Dget_space(d);
    hsize_t one[4] = {1, 1, 1, 1};
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, coords, NULL, one, NULL);
    hid_t ms = H5Screate_simple(rank, one, NULL);
    if (H5Dwrite(d, mem_type, ms, fs, H5P_DEFAULT, value) < 0) abort();
    H5Sclose(ms), H5Sclose(fs), H5Dclose(d), H5Fclose(f);
}

TEST(missing_file) {
    expect_open_fails(harness_failed, tmp_path("does-not-exist.h5"), FMOE_EIO, "cannot open", NULL);
}

TEST(garbage_bytes) {
    const char *path = tmp_path("garbage.h5");
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    for (int i = 0; i < 5000; i++) fputc((i * 131 + 17) & 0xff, f);
    fclose(f);
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "not an HDF5 file", NULL);
    char fmt[32];
    ASSERT_EQ(fmoe_hdf5_read_format(path, fmt, sizeof fmt), FMOE_EFORMAT);
    ASSERT_CONTAINS(fmoe_error_detail(), path);
    ASSERT_CONTAINS(fmoe_error_detail(), "not an HDF5 file");
}

TEST(truncated_file) {
    char good[1024]; /* tmp_path's buffers rotate; keep our own copy across the loop */
    snprintf(good, sizeof good, "%s", fresh_sample("trunc-src.h5", 1));
    const long size = file_size(good);
    ASSERT_TRUE(size > 4096);
    const long cuts[] = {size / 2, size - 1, 600, 8};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        const char *cut = tmp_path("trunc.h5");
        ASSERT_OK(copy_file(good, cut, cuts[i]));
        ASSERT_EQ(file_size(cut), cuts[i]);
        fmoe_trace_reader *r = NULL;
        int rc = fmoe_trace_reader_open(&r, cut);
        fmoe_trace_reader_close(r);
        show_detail(rc);
        if (rc != FMOE_EFORMAT && rc != FMOE_EIO)
            HARNESS_FAIL("cut at %ld of %ld: rc %d (%s)", cuts[i], size, rc, fmoe_error_detail());
        ASSERT_CONTAINS(fmoe_error_detail(), cut);
    }
    /* Cut at half: HDF5 sees the end-of-file mismatch and says so. */
    const char *cut = tmp_path("trunc.h5");
    ASSERT_OK(copy_file(good, cut, size / 2));
    expect_open_fails(harness_failed, cut, FMOE_EFORMAT, "truncated", NULL);
}

TEST(wrong_format_attribute) {
    const char *path = fresh_sample("wrongformat.h5", 1);
    forge_str_attr(path, "format", "fmoe-store");
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "format = 'fmoe-store'",
                      "expected 'fmoe-trace'");
    char fmt[32];
    ASSERT_OK(fmoe_hdf5_read_format(path, fmt, sizeof fmt));
    ASSERT_STR_EQ(fmt, "fmoe-store");

    hid_t f = forge_open(path);
    H5Adelete(f, "format");
    H5Fclose(f);
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "no 'format' attribute", NULL);
    ASSERT_EQ(fmoe_hdf5_read_format(path, fmt, sizeof fmt), FMOE_ENOTFOUND);

    /* A non-string format attribute. */
    forge_int_attr(path, "format", H5T_STD_I32LE, 1);
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "'format'", "expected a string");
}

TEST(wrong_version) {
    const char *path = fresh_sample("wrongversion.h5", 1);
    forge_int_attr(path, "version", H5T_STD_I64LE, 2);
    expect_open_fails(harness_failed, path, FMOE_EUNSUPPORTED, "version = 2", "expected 1");
    forge_str_attr(path, "version", "1");
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "version", "expected an integer");
}

TEST(bad_attributes) {
    const char *path = fresh_sample("badattr.h5", 1);
    hid_t f = forge_open(path);
    H5Adelete(f, "top_k");
    H5Fclose(f);
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "attribute 'top_k' is missing", NULL);

    path = fresh_sample("badattr2.h5", 1);
    forge_int_attr(path, "top_k", H5T_STD_I32LE, SAMPLE_J + 1);
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "top_k = 9", "num_experts");

    path = fresh_sample("badattr3.h5", 1);
    forge_str_attr(path, "num_layers", "three");
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "num_layers", "expected an integer");

    path = fresh_sample("badattr4.h5", 1);
    forge_int_attr(path, "num_experts", H5T_STD_I64LE, 1LL << 40);
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "num_experts", NULL);

    path = fresh_sample("badattr5.h5", 1);
    forge_str_attr(path, "probs_kind", "some");
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "probs_kind = 'some'", NULL);

    /* The header says no probs but the file holds them. */
    path = fresh_sample("badattr6.h5", 1);
    forge_str_attr(path, "probs_kind", "none");
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/probs exists", NULL);
}

TEST(wrong_shapes) {
    const char *path = fresh_sample("shape-probs.h5", 1);
    forge_dataset(path, "/tokens/probs", H5T_IEEE_F32LE, 3,
                  (hsize_t[]){SAMPLE_T, SAMPLE_L, SAMPLE_J - 1});
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/probs has shape [13,3,7]",
                      "expected [13,3,8]");

    path = fresh_sample("shape-experts.h5", 1);
    forge_dataset(path, "/tokens/experts", H5T_STD_U16LE, 2, (hsize_t[]){SAMPLE_T, SAMPLE_L});
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/experts has shape [13,3]",
                      "expected [13,3,2]");

    path = fresh_sample("type-experts.h5", 1);
    forge_dataset(path, "/tokens/experts", H5T_STD_I32LE, 3,
                  (hsize_t[]){SAMPLE_T, SAMPLE_L, SAMPLE_K});
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/experts has type int32",
                      "expected uint16");

    path = fresh_sample("shape-phase.h5", 1);
    forge_dataset(path, "/tokens/phase", H5T_STD_U8LE, 1, (hsize_t[]){SAMPLE_T + 1});
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/phase has shape [14]",
                      "expected [13]");

    path = fresh_sample("shape-semantic.h5", 0);
    forge_dataset(path, "/tokens/semantic", H5T_IEEE_F32LE, 2, (hsize_t[]){SAMPLE_T, SAMPLE_H + 1});
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/semantic", "expected [13,4]");

    path = fresh_sample("shape-spec.h5", 0);
    forge_dataset(path, "/tokens/speculative", H5T_IEEE_F64LE, 4,
                  (hsize_t[]){SAMPLE_T, SAMPLE_L, SAMPLE_S, SAMPLE_J});
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/speculative",
                      "expected float16 or float32");

    path = fresh_sample("shape-arrival.h5", 1);
    forge_dataset(path, "/requests/arrival_s", H5T_IEEE_F64LE, 1, (hsize_t[]){SAMPLE_R - 1});
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/requests/arrival_s has shape [2]",
                      "expected [3]");

    path = fresh_sample("missing-experts.h5", 1);
    hid_t f = forge_open(path);
    H5Ldelete(f, "/tokens/experts", H5P_DEFAULT);
    H5Fclose(f);
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/experts is missing", NULL);
}

TEST(inconsistent_tables) {
    const char *path = fresh_sample("offsets.h5", 1);
    int64_t v = 12;
    forge_element(path, "/requests/token_offset", 1, (hsize_t[]){3}, H5T_NATIVE_INT64, &v);
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/requests/token_offset",
                      "request 2 owns 3 tokens");

    path = fresh_sample("offsets2.h5", 1);
    v = 1;
    forge_element(path, "/requests/token_offset", 1, (hsize_t[]){0}, H5T_NATIVE_INT64, &v);
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/requests/token_offset[0] = 1",
                      "expected 0");

    path = fresh_sample("offsets3.h5", 1);
    v = 2;
    forge_element(path, "/requests/token_offset", 1, (hsize_t[]){2}, H5T_NATIVE_INT64, &v);
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/requests/token_offset[2] = 2",
                      "must not decrease");

    path = fresh_sample("prompt.h5", 1);
    int32_t p = 2;
    forge_element(path, "/requests/prompt_tokens", 1, (hsize_t[]){0}, H5T_NATIVE_INT32, &p);
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/requests/token_offset",
                      "prompt_tokens + output_tokens = 4");

    path = fresh_sample("phase.h5", 1);
    uint8_t ph = FMOE_PHASE_PREFILL;
    forge_element(path, "/tokens/phase", 1, (hsize_t[]){3}, H5T_NATIVE_UINT8, &ph);
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/phase[3] = 0", "expected 1");
}

TEST(extent_without_data) {
    /* A consistent-looking header that declares 2^31 tokens nobody wrote: refused from the
     * chunk index before anything is sized from it (no 2 GiB phase buffer, no 48 GiB
     * iteration list). */
    const char *path = fresh_sample("extent.h5", 1);
    const int32_t out = INT32_MAX - 4;
    const int64_t T2 = 9 + 4 + (int64_t)out;
    const char *names[] = {"/tokens/token_id", "/tokens/phase",    "/tokens/experts",
                           "/tokens/probs",    "/tokens/semantic", "/tokens/speculative"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        forge_extent(path, names[i], (hsize_t)T2);
    forge_element(path, "/requests/output_tokens", 1, (hsize_t[]){2}, H5T_NATIVE_INT32, &out);
    forge_element(path, "/requests/token_offset", 1, (hsize_t[]){3}, H5T_NATIVE_INT64, &T2);
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/token_id: 1 of the",
                      "chunks covering its extent are stored");

    path = fresh_sample("unwritten.h5", 1);
    forge_dataset2(path, "/requests/arrival_s", H5T_IEEE_F64LE, 1, (hsize_t[]){SAMPLE_R}, 1);
    expect_open_fails(harness_failed, path, FMOE_EFORMAT, "/requests/arrival_s: stores 0 bytes",
                      "expected 24");
}

TEST(bad_token_values) {
    const char *path = fresh_sample("expert-range.h5", 1);
    uint16_t e = SAMPLE_J;
    forge_element(path, "/tokens/experts", 3, (hsize_t[]){5, 1, 0}, H5T_NATIVE_UINT16, &e);
    expect_read_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/experts: token 5 layer 1",
                      "expected < num_experts (8)");

    path = fresh_sample("expert-dup.h5", 1);
    e = sample_expert(2, 0, 0);
    forge_element(path, "/tokens/experts", 3, (hsize_t[]){2, 0, 1}, H5T_NATIVE_UINT16, &e);
    expect_read_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/experts: token 2 layer 0",
                      "repeats an expert");

    path = fresh_sample("prob-nan.h5", 1);
    float x = NAN;
    forge_element(path, "/tokens/probs", 3, (hsize_t[]){7, 2, 3}, H5T_NATIVE_FLOAT, &x);
    expect_read_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/probs: token 7", "[0, 1]");

    path = fresh_sample("prob-big.h5", 0);
    x = 1.5f;
    forge_element(path, "/tokens/probs", 3, (hsize_t[]){12, 0, 0}, H5T_NATIVE_FLOAT, &x);
    expect_read_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/probs: token 12", "[0, 1]");

    path = fresh_sample("spec-neg.h5", 1);
    x = -0.25f;
    forge_element(path, "/tokens/speculative", 4, (hsize_t[]){1, 0, 1, 2}, H5T_NATIVE_FLOAT, &x);
    expect_read_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/speculative: token 1", NULL);

    path = fresh_sample("sem-inf.h5", 1);
    x = INFINITY;
    forge_element(path, "/tokens/semantic", 2, (hsize_t[]){4, 2}, H5T_NATIVE_FLOAT, &x);
    expect_read_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/semantic: token 4 column 2",
                      "finite");

    path = fresh_sample("tok-neg.h5", 1);
    int32_t t = -9;
    forge_element(path, "/tokens/token_id", 1, (hsize_t[]){0}, H5T_NATIVE_INT32, &t);
    expect_read_fails(harness_failed, path, FMOE_EFORMAT, "/tokens/token_id: token 0", ">= -1");
}

TEST(corrupt_compressed_chunk) {
    /* Overwrite the middle of the file: whatever HDF5 reports (bad metadata, a zstd frame
     * the filter refuses), the reader fails with a message instead of crashing. */
    char src[1024]; /* tmp_path's buffers rotate; keep our own copy across the loop */
    snprintf(src, sizeof src, "%s", fresh_sample("corrupt-src.h5", 1));
    const long size = file_size(src);
    int failures = 0;
    for (long at = 512; at < size; at += size / 16) {
        const char *path = tmp_path("corrupt.h5");
        ASSERT_OK(copy_file(src, path, -1));
        int fd = open(path, O_WRONLY);
        ASSERT_TRUE(fd >= 0);
        unsigned char junk[64];
        for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(at + 37 * i);
        ASSERT_EQ(pwrite(fd, junk, sizeof junk, at), (long)sizeof junk);
        close(fd);
        fmoe_trace_reader *r = NULL;
        int rc = fmoe_trace_reader_open(&r, path);
        if (rc == 0) {
            int32_t tok[SAMPLE_T];
            uint8_t phase[SAMPLE_T];
            uint16_t experts[SAMPLE_T * SAMPLE_L * SAMPLE_K];
            float probs[SAMPLE_T * SAMPLE_L * SAMPLE_J], sem[SAMPLE_T * SAMPLE_H];
            float spec[SAMPLE_T * SAMPLE_L * SAMPLE_S * SAMPLE_J];
            fmoe_trace_token_buffers all = {.token_id = tok, .phase = phase, .experts = experts,
                                    .probs = probs, .semantic = sem, .speculative = spec};
            rc = fmoe_trace_reader_read_tokens(r, 0, SAMPLE_T, &all);
        }
        fmoe_trace_reader_close(r);
        show_detail(rc);
        if (rc < 0) ASSERT_CONTAINS(fmoe_error_detail(), path);
        failures += rc < 0;
    }
    /* Much of a small file is slack left by rewritten chunks, but not all of it. */
    ASSERT_TRUE(failures >= 2);
}

/* Flips bytes in the middle of the first stored chunk of `name`; reading the tokens must
 * then fail with a detail naming the file and that dataset. */
static void corrupt_chunk(int *harness_failed, fmoe_compression c, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s", tmp_path("chunk.h5"));
    ASSERT_OK(sample_write(path, c, 1, 0));
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    hid_t fs = H5Dget_space(d);
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0, offset[4];
    unsigned mask = 0;
    herr_t e = H5Dget_chunk_info(d, fs, 0, offset, &mask, &addr, &size);
    H5Sclose(fs), H5Dclose(d), H5Fclose(f);
    ASSERT_TRUE(e >= 0 && addr != HADDR_UNDEF && size >= 16);
    int fd = open(path, O_RDWR);
    ASSERT_TRUE(fd >= 0);
    unsigned char b[8];
    off_t at = (off_t)(addr + size / 2);
    ssize_t got = pread(fd, b, sizeof b, at);
    for (size_t i = 0; i < sizeof b; i++) b[i] ^= 0x5a;
    ssize_t put = pwrite(fd, b, sizeof b, at);
    close(fd);
    ASSERT_EQ(got, 8);
    ASSERT_EQ(put, 8);
    expect_read_fails(harness_failed, path, FMOE_EFORMAT, name, "cannot read rows [0, 13)");
}

TEST(corrupt_zstd_chunk_is_detected) {
    /* zstd frames carry a checksum, so damage inside compressed data cannot decode into
     * plausible wrong numbers. */
    corrupt_chunk(harness_failed, FMOE_COMPRESSION_ZSTD, "/tokens/probs");
    if (*harness_failed) return;
    corrupt_chunk(harness_failed, FMOE_COMPRESSION_ZSTD, "/tokens/experts");
    if (*harness_failed) return;
    corrupt_chunk(harness_failed, FMOE_COMPRESSION_DEFLATE, "/tokens/speculative");
}

/* ---------------------------------------------------------------------------------------
 * Names and format sniffing
 * ------------------------------------------------------------------------------------- */

TEST(names) {
    fmoe_compression c = FMOE_COMPRESSION_NONE;
    ASSERT_OK(fmoe_compression_parse("zstd", &c));
    ASSERT_EQ(c, FMOE_COMPRESSION_ZSTD);
    ASSERT_OK(fmoe_compression_parse("deflate", &c));
    ASSERT_EQ(c, FMOE_COMPRESSION_DEFLATE);
    ASSERT_OK(fmoe_compression_parse("none", &c));
    ASSERT_EQ(c, FMOE_COMPRESSION_NONE);
    ASSERT_EQ(fmoe_compression_parse("lz4", &c), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "lz4");
    ASSERT_EQ(fmoe_compression_parse(NULL, &c), FMOE_EINVAL);
    ASSERT_STR_EQ(fmoe_probs_kind_name(FMOE_PROBS_NONE), "none");
    ASSERT_STR_EQ(fmoe_probs_kind_name(FMOE_PROBS_TOPK), "topk");
    ASSERT_STR_EQ(fmoe_probs_kind_name(FMOE_PROBS_FULL), "full");
    ASSERT_STR_EQ(fmoe_probs_kind_name((fmoe_probs_kind)9), "unknown");
}

TEST(read_format_truncates) {
    const char *path = fresh_sample("fmt.h5", 1);
    char small[5];
    ASSERT_OK(fmoe_hdf5_read_format(path, small, sizeof small));
    ASSERT_STR_EQ(small, "fmoe");
    ASSERT_EQ(fmoe_hdf5_read_format(tmp_path("nope.h5"), small, sizeof small), FMOE_EIO);
}

int main(int argc, char **argv) {
    int rc = RUN_TESTS(argc, argv);
    if (scratch_dir[0]) nftw(scratch_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}
