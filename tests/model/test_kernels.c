/*
 * test_kernels - the forward pass's row math (lib/rowwise.h), rope frequencies and the
 * CPU backend's matrix products and attention, each against a straightforward reference
 * computed in double.
 */
#include <cblas.h>
#include <dirent.h>
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../../runtime/backend/threadpool.h"
#include "fmoe/error.h"
#include "half.h"
#include "rowwise.h"
#include "harness.h"
#include "model_impl.h"

static uint64_t lcg = 12345;
static float frand(void) { /* uniform in [-1, 1) */
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((lcg >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
}

TEST(rmsnorm_matches_reference) {
    for (int n = 1; n <= 300; n += 37) {
        float x[300], w[300], y[300];
        for (int i = 0; i < n; i++) x[i] = 3 * frand(), w[i] = 1 + frand() / 2;
        fmoe_rmsnorm_row(y, x, w, n, 1e-6f);
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
        const double inv = 1 / sqrt(ss / n + 1e-6);
        for (int i = 0; i < n; i++) ASSERT_NEAR(y[i], w[i] * x[i] * inv, 1e-5);
        fmoe_rmsnorm_row(x, x, w, n, 1e-6f); /* in place */
        for (int i = 0; i < n; i++) ASSERT_NEAR(x[i], y[i], 0);
    }
}

TEST(rope_rotates_halves) {
    const int D = 16, half = D / 2;
    float x[16], ref[16], c[8], s[8];
    const double pos = 7;
    for (int i = 0; i < D; i++) x[i] = ref[i] = frand();
    for (int i = 0; i < half; i++) {
        const double inv = 1 / pow(10000.0, 2.0 * i / D);
        c[i] = (float)cos(pos * inv);
        s[i] = (float)sin(pos * inv);
    }
    fmoe_rope_head(x, c, s, D);
    /* q·cos + rotate_half(q)·sin, rotate_half(q) = [-q2, q1] */
    for (int i = 0; i < D; i++) {
        const double rot = i < half ? -ref[i + half] : ref[i - half];
        ASSERT_NEAR(x[i], ref[i] * c[i % half] + rot * s[i % half], 1e-6);
    }
    /* A rotation keeps the norm. */
    double n0 = 0, n1 = 0;
    for (int i = 0; i < D; i++) n0 += ref[i] * ref[i], n1 += x[i] * x[i];
    ASSERT_NEAR(n0, n1, 1e-5);
}

TEST(softmax_matches_reference) {
    float x[10] = {1, 2, 3, -1, 0.5f, 80, 79, -INFINITY, 4, 2}, y[10];
    fmoe_softmax_row(y, x, 10);
    double mx = 80, sum = 0;
    for (int i = 0; i < 10; i++) sum += isinf(x[i]) ? 0 : exp(x[i] - mx);
    for (int i = 0; i < 10; i++)
        ASSERT_NEAR(y[i], isinf(x[i]) ? 0 : exp(x[i] - mx) / sum, 1e-7);
    float z[3] = {-INFINITY, -INFINITY, -INFINITY};
    fmoe_softmax_row(z, z, 3);
    ASSERT_TRUE(z[0] == 0 && z[1] == 0 && z[2] == 0);
}

TEST(topk_descending_lowest_index_on_ties) {
    const float p[8] = {0.1f, 0.3f, 0.05f, 0.3f, 0.2f, NAN, 0.0f, 0.05f};
    int32_t idx[5];
    float val[5];
    fmoe_topk_row(p, 8, 5, idx, val);
    const int32_t want[5] = {1, 3, 4, 0, 2};
    for (int k = 0; k < 5; k++) ASSERT_EQ(idx[k], want[k]);
    /* Against a sort on random rows. */
    for (int trial = 0; trial < 200; trial++) {
        float q[64];
        int32_t id[8], order[64];
        float v[8];
        const int n = 8 + trial % 57, k = 1 + trial % 8;
        for (int i = 0; i < n; i++) q[i] = frand(), order[i] = i;
        fmoe_topk_row(q, n, k, id, v);
        for (int i = 0; i < n; i++) /* selection sort, descending */
            for (int j = i + 1; j < n; j++)
                if (q[order[j]] > q[order[i]]) {
                    int32_t t = order[i];
                    order[i] = order[j];
                    order[j] = t;
                }
        for (int j = 0; j < k; j++) ASSERT_EQ(id[j], order[j]);
    }
}

TEST(route_renormalises_per_family) {
    const float logits[4] = {2.0f, 0.5f, 1.0f, -1.0f};
    float probs[4], w[2];
    int32_t idx[2];
    fmoe_route_row(logits, 4, 2, 0, 0, 0.0f, 1.0f, probs, idx, w);
    double s = 0;
    for (int j = 0; j < 4; j++) s += exp(logits[j]);
    ASSERT_EQ(idx[0], 0);
    ASSERT_EQ(idx[1], 2);
    ASSERT_NEAR(w[0], exp(2.0) / s, 1e-6); /* not renormalised (qwen/olmoe default) */
    ASSERT_NEAR(probs[3], exp(-1.0) / s, 1e-6);
    fmoe_route_row(logits, 4, 2, 0, 1, 0.0f, 1.0f, probs, idx, w);
    ASSERT_NEAR(w[0], exp(2.0) / (exp(2.0) + exp(1.0)), 1e-6); /* mixtral: softmax of top-k */
    ASSERT_NEAR(w[0] + w[1], 1.0, 1e-6);
    fmoe_route_row(logits, 4, 2, 1, 0, 0.0f, 2.5f, probs, idx, w);
    ASSERT_NEAR(probs[1], 1 / (1 + exp(-0.5)), 1e-6); /* sigmoid scores */
    ASSERT_NEAR(w[0], 2.5 / (1 + exp(-2.0)), 1e-5);
}

/* Phi-3.5-MoE's sparsemixer (transformers' modeling_phimoe.py, eval branch), worked by
 * hand: each choice's weight is a softmax over the logits within 2·eps (relative to
 * max(|logit|, the choice's logit)) of it, the first choice masked from the second. */
TEST(route_sparsemixer) {
    const float logits[4] = {2.0f, 1.9f, 0.5f, -1.0f};
    float probs[4], choice[4], w[2];
    int32_t idx[2];
    /* eps 0.1: the first softmax keeps 2.0 and 1.9 ((2 - 0.5)/2 > 0.2), the second only
     * 1.9 ((1.9 - 0.5)/1.9 > 0.2) */
    fmoe_route_row_grouped(logits, 4, 2, 0, 1, 0.0f, 3.0f, 1, 1, 0, NULL, 1, 0.1f, probs,
                           choice, idx, w);
    ASSERT_EQ(idx[0], 0);
    ASSERT_EQ(idx[1], 1);
    ASSERT_NEAR(w[0], 1.0 / (1.0 + exp(-0.1)), 1e-6); /* neither renormalised nor scaled */
    ASSERT_NEAR(w[1], 1.0, 1e-6);
    double s = 0;
    for (int j = 0; j < 4; j++) s += exp(logits[j]);
    ASSERT_NEAR(probs[2], exp(0.5) / s, 1e-6); /* probs: the plain softmax */
    /* eps 0.5: the first keeps logits >= 0; the second keeps 0.5 (1.4/1.9 <= 1), drops
     * -1 (2.9/1.9 > 1), and the first choice stays out though within reach */
    fmoe_route_row_grouped(logits, 4, 2, 0, 0, 0.0f, 1.0f, 1, 1, 0, NULL, 1, 0.5f, probs,
                           choice, idx, w);
    ASSERT_EQ(idx[0], 0);
    ASSERT_EQ(idx[1], 1);
    ASSERT_NEAR(w[0], 1.0 / (1.0 + exp(-0.1) + exp(-1.5)), 1e-6);
    ASSERT_NEAR(w[1], 1.0 / (1.0 + exp(-1.4)), 1e-6);
    ASSERT_NEAR(probs[0] + probs[1] + probs[2] + probs[3], 1.0, 1e-6);
}

/* torch's LayerNorm: biased variance, weight then bias. */
TEST(layernorm_row) {
    const float x[4] = {1.0f, 2.0f, 3.0f, 6.0f}, w[4] = {1.0f, 2.0f, 0.5f, 1.0f},
                b[4] = {0.1f, -0.2f, 0.0f, 1.0f};
    float y[4];
    fmoe_layernorm_row(y, x, w, b, 4, 1e-5f);
    const double mean = 3.0, var = (4.0 + 1.0 + 0.0 + 9.0) / 4.0;
    for (int i = 0; i < 4; i++)
        ASSERT_NEAR(y[i], w[i] * (x[i] - mean) / sqrt(var + 1e-5) + b[i], 1e-6);
}

/* longrope (Phi-3.5-MoE): short factors and mscale up to original_max_position, long
 * ones past it (Microsoft's code, transformers' _compute_longrope_parameters). */
TEST(rope_longrope_switch) {
    fmoe__rope r = {.type = FMOE__ROPE_LONGROPE, .theta = 10000, .factor = 1,
                    .original_max_position = 16, .short_mscale = 1.1, .long_mscale = 1.4};
    for (int i = 0; i < 4; i++) r.short_factor[i] = 1.0 + i, r.long_factor[i] = 10.0 * (i + 1);
    float inv[4], scale;
    fmoe__rope_inv_freq(&r, 8, 16, inv, &scale);
    ASSERT_NEAR(scale, 1.1, 1e-6);
    for (int i = 0; i < 4; i++) ASSERT_NEAR(inv[i] * (1.0 + i) * pow(10000, i / 4.0), 1.0, 1e-6);
    fmoe__rope_inv_freq(&r, 8, 17, inv, &scale);
    ASSERT_NEAR(scale, 1.4, 1e-6);
    for (int i = 0; i < 4; i++)
        ASSERT_NEAR(inv[i] * 10.0 * (i + 1) * pow(10000, i / 4.0), 1.0, 1e-6);
}

TEST(rope_frequencies_per_scaling_type) {
    fmoe__rope r = {.type = FMOE__ROPE_DEFAULT, .theta = 10000, .factor = 1,
                    .max_position = 100, .original_max_position = 100, .attention_factor = 1,
                    .truncate = 1};
    float inv[64], scale;
    fmoe__rope_inv_freq(&r, 8, 0, inv, &scale);
    ASSERT_NEAR(inv[0], 1.0, 1e-7);
    ASSERT_NEAR(inv[1], 0.1, 1e-7);
    ASSERT_NEAR(inv[3], 0.001, 1e-9);
    ASSERT_NEAR(scale, 1.0, 0);

    r.type = FMOE__ROPE_LINEAR;
    r.factor = 4;
    fmoe__rope_inv_freq(&r, 8, 0, inv, &scale);
    ASSERT_NEAR(inv[1], 0.025, 1e-8);

    r.type = FMOE__ROPE_DYNAMIC;
    r.factor = 2;
    fmoe__rope_inv_freq(&r, 8, 100, inv, &scale); /* within max_position: unchanged */
    ASSERT_NEAR(inv[1], 0.1, 1e-7);
    fmoe__rope_inv_freq(&r, 8, 150, inv, &scale);
    const double base = 10000 * pow(2.0 * 150 / 100 - 1, 8.0 / 6.0);
    ASSERT_NEAR(inv[1], 1 / pow(base, 2.0 / 8), 1e-7);

    /* yarn, as transformers computes it for D = 8, theta 1e4, factor 4, original 16:
     * correction range [0, 2] after truncation; dims below 0 extrapolate, above 2
     * interpolate. */
    r.type = FMOE__ROPE_YARN;
    r.factor = 4;
    r.original_max_position = 16;
    r.beta_fast = 32;
    r.beta_slow = 1;
    r.attention_factor = 0.1 * log(4.0) + 1;
    fmoe__rope_inv_freq(&r, 8, 0, inv, &scale);
    const double two_pi = 2 * M_PI;
    double lo = floor(8 * log(16 / (32 * two_pi)) / (2 * log(1e4)));
    double hi = ceil(8 * log(16 / (1 * two_pi)) / (2 * log(1e4)));
    lo = lo < 0 ? 0 : lo;
    hi = hi > 7 ? 7 : hi;
    for (int i = 0; i < 4; i++) {
        double ramp = (i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        const double pf = pow(1e4, 2.0 * i / 8);
        ASSERT_NEAR(inv[i], (1 / (4 * pf)) * ramp + (1 / pf) * (1 - ramp), 1e-7);
    }
    ASSERT_NEAR(scale, 0.1 * log(4.0) + 1, 1e-6);

    /* llama3: long wavelengths divided by factor, short ones kept. */
    r.type = FMOE__ROPE_LLAMA3;
    r.theta = 500000;
    r.factor = 8;
    r.low_freq_factor = 1;
    r.high_freq_factor = 4;
    r.original_max_position = 8192;
    fmoe__rope_inv_freq(&r, 128, 0, inv, &scale); /* only the first 4 checked */
    ASSERT_NEAR(inv[0], 1.0, 1e-7);               /* wavelength 2π: high frequency */
}

/* ------------------------------------------------------------------------------------- */
/* CPU backend                                                                           */
/* ------------------------------------------------------------------------------------- */

static void fill_mat(fmoe__mat *w, fmoe_st_dtype dt, int64_t rows, int64_t cols, void *buf,
                     double *ref) {
    memset(w, 0, sizeof *w);
    w->dtype = dt;
    w->rows = rows;
    w->cols = cols;
    w->data = buf;
    for (int64_t i = 0; i < rows * cols; i++) {
        const float v = frand();
        if (dt == FMOE_ST_F32) {
            ((float *)buf)[i] = v;
            ref[i] = v;
        } else if (dt == FMOE_ST_BF16) {
            ((uint16_t *)buf)[i] = fmoe_float_to_bf16(v);
            ref[i] = fmoe_bf16_to_float(((uint16_t *)buf)[i]);
        } else {
            ((uint16_t *)buf)[i] = fmoe_float_to_half(v);
            ref[i] = fmoe_half_to_float(((uint16_t *)buf)[i]);
        }
    }
}

TEST(cpu_matmul_all_dtypes_and_paths) {
    const fmoe__backend_ops *be = &fmoe__cpu_backend;
    const fmoe_st_dtype dts[3] = {FMOE_ST_F32, FMOE_ST_BF16, FMOE_ST_F16};
    const int32_t ns[5] = {1, 2, 4, 5, 70};
    /* cols >= 32 takes the AVX-512 bf16 GEMM where the CPU has it (rows and tokens with
     * tails of 1-3 past its 4x4 tiles, columns past a multiple of 32); FMOE_NO_AVX512
     * forces the AVX2/sgemm path. */
    const int64_t shapes[5][2] = {{7, 5}, {300, 129}, {1030, 64}, {37, 256}, {6, 176}};
    for (int pass = 0; pass < 4; pass++) {
        const int threads = 1 + pass % 2;
        if (pass >= 2) setenv("FMOE_NO_AVX512", "1", 1);
        fmoe__backend_limits lim = {.threads = threads, .max_cols = 256, .max_batch = 70, .max_context = 16};
        void *ctx;
        ASSERT_OK(be->init(&lim, &ctx));
        for (int d = 0; d < 3; d++)
            for (int s = 0; s < 5; s++)
                for (int ni = 0; ni < 5; ni++) {
                    const int64_t R = shapes[s][0], C = shapes[s][1];
                    const int32_t n = ns[ni];
                    void *buf = malloc((size_t)(R * C * 4));
                    double *ref = malloc((size_t)(R * C) * sizeof *ref);
                    float *x = malloc((size_t)(n * C) * sizeof *x);
                    float *y = malloc((size_t)(n * R) * sizeof *y);
                    fmoe__mat w;
                    fill_mat(&w, dts[d], R, C, buf, ref);
                    for (int64_t i = 0; i < n * C; i++) x[i] = frand();
                    be->matmul(ctx, &w, x, n, y);
                    double worst = 0;
                    for (int32_t t = 0; t < n; t++)
                        for (int64_t r = 0; r < R; r++) {
                            double acc = 0;
                            for (int64_t c = 0; c < C; c++) acc += ref[r * C + c] * x[t * C + c];
                            worst = fmax(worst, fabs(acc - y[t * R + r]));
                        }
                    free(buf);
                    free(ref);
                    free(x);
                    free(y);
                    if (worst > 1e-4)
                        HARNESS_FAIL("dtype %d, %lldx%lld, n %d, threads %d: error %g", d,
                                     (long long)R, (long long)C, n, threads, worst);
                }
        float row[64];
        uint16_t b[64];
        for (int i = 0; i < 64; i++) b[i] = fmoe_float_to_bf16((float)i - 7.5f);
        fmoe__mat e = {.data = b, .dtype = FMOE_ST_BF16, .rows = 1, .cols = 64};
        const int32_t zero = 0;
        be->get_rows(ctx, &e, &zero, 1, row);
        for (int i = 0; i < 64; i++) ASSERT_NEAR(row[i], i - 7.5, 0);
        be->free(ctx);
    }
    unsetenv("FMOE_NO_AVX512");
}

/* gpt-oss's clamped SwiGLU, worked by hand from transformers' GptOssExperts._apply_gate:
 * the gate clamped above only, up to [-limit, limit], (up + 1) · g · sigmoid(alpha · g). */
/* The threads of this process (its /proc/self/task entries). */
static int process_threads(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* OpenBLAS starts a worker per core when it loads, and again whenever its thread count is
 * set, and each spins for a while before it sleeps, taking a core from the pool
 * (runtime/cpu/cpu_backend.c, blas_one_thread): a one-thread CPU backend leaves the
 * process one thread, also after a caller asked OpenBLAS for two (as fmoe calibrate does),
 * and f32 products, which go through OpenBLAS, still come out right. (Where OpenBLAS
 * starts no workers, one core, the count is 1 either way.) */
TEST(cpu_backend_leaves_no_openblas_workers) {
    const fmoe__backend_ops *be = &fmoe__cpu_backend;
    fmoe__backend_limits lim = {.threads = 1, .max_cols = 64, .max_batch = 4, .max_context = 16};
    void *ctx;
    ASSERT_OK(be->init(&lim, &ctx));
    ASSERT_EQ(process_threads(), 1);
    be->free(ctx);
    openblas_set_num_threads(2);
    ASSERT_OK(be->init(&lim, &ctx));
    ASSERT_EQ(process_threads(), 1);
    float buf[8 * 64], x[2 * 64], y[2 * 8];
    double ref[8 * 64];
    fmoe__mat w;
    fill_mat(&w, FMOE_ST_F32, 8, 64, buf, ref);
    for (int i = 0; i < 2 * 64; i++) x[i] = frand();
    be->matmul(ctx, &w, x, 2, y);
    for (int t = 0; t < 2; t++)
        for (int r = 0; r < 8; r++) {
            double acc = 0;
            for (int c = 0; c < 64; c++) acc += ref[r * 64 + c] * x[t * 64 + c];
            ASSERT_NEAR(y[t * 8 + r], acc, 1e-4);
        }
    be->free(ctx);
}

TEST(swiglu_clamped_by_hand) {
    const float alpha = 1.702f, limit = 7.0f;
    const float cases[][2] = {{1.0f, 2.0f}, {9.0f, 0.5f}, {-9.0f, 0.5f}, {0.3f, 12.0f},
                              {0.3f, -12.0f}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const double g = fmin(cases[k][0], limit);
        const double u = fmax(fmin(cases[k][1], limit), -limit);
        const double want = (u + 1) * g / (1 + exp(-alpha * g));
        ASSERT_NEAR(fmoe_swiglu_clamped(cases[k][0], cases[k][1], alpha, limit), want, 1e-5);
    }
    /* the CPU backend's op is the same function over a buffer */
    float g[2] = {9.0f, -0.5f}, u[2] = {-12.0f, 3.0f};
    fmoe__cpu_backend.swiglu_clamped(NULL, g, u, 2, alpha, limit);
    ASSERT_NEAR(g[0], (-7.0 + 1) * 7.0 / (1 + exp(-alpha * 7.0)), 1e-4);
    ASSERT_NEAR(g[1], 4.0 * -0.5 / (1 + exp(alpha * 0.5)), 1e-6);
}

/* With sinks (gpt-oss): each head's sink logit joins the softmax's max and denominator
 * and brings no value, so the weights of the real keys sum to less than one. */
/* The byte offset of the first NULL entry of table t, or -1 when every entry is set. The
 * fields after host_memory are all function pointers (backend_impl.h). */
static long first_null_op(const fmoe__backend_ops *t) {
    typedef void (*any_fn)(void);
    const unsigned char *p = (const unsigned char *)t;
    for (size_t off = offsetof(fmoe__backend_ops, init); off + sizeof(any_fn) <= sizeof *t;
         off += sizeof(any_fn)) {
        any_fn fn;
        memcpy(&fn, p + off, sizeof fn);
        if (!fn) return (long)off;
    }
    return -1;
}

/* The CPU backend is the reference every op must have (docs/design.md 8.2), and C leaves
 * a field missing from designated initializers NULL without a word: so every entry of its
 * table is checked here, and the check is shown to find a planted gap. */
TEST(cpu_backend_table_has_every_op) {
    ASSERT_EQ(first_null_op(&fmoe__cpu_backend), -1);
    fmoe__backend_ops planted = fmoe__cpu_backend;
    planted.add_gated = NULL;
    ASSERT_EQ(first_null_op(&planted), (long)offsetof(fmoe__backend_ops, add_gated));
    planted = fmoe__cpu_backend;
    planted.rope_partial = NULL; /* one of the entries added later */
    ASSERT_EQ(first_null_op(&planted), (long)offsetof(fmoe__backend_ops, rope_partial));
}

/* The fused MoE experts (moe_experts, runtime/cpu/cpu_fused.c) against the formula in
 * double: acc[row] += scale · (down · swiglu(gate·x + b_g, up·x + b_u) + b_d) per routed
 * expert over its rows, then + shared(x) on every row; bf16 weights, one expert with
 * gpt-oss's biases and clamped SwiGLU. Bit for bit the same at 1 and 2 threads, and the
 * op declines f32 weights and passes of more than 4 rows. */
#define MOE_H 64
#define MOE_I 48
typedef struct moe_ref {
    uint16_t w[3][MOE_I * MOE_H];
    double r[3][MOE_I * MOE_H];
    float gb[MOE_I], ub[MOE_I], db[MOE_H];
    fmoe__mlp mlp;
} moe_ref;

static void moe_make(moe_ref *m, int biased) {
    fmoe__mat *mats[3] = {&m->mlp.gate, &m->mlp.up, &m->mlp.down};
    memset(&m->mlp, 0, sizeof m->mlp);
    for (int k = 0; k < 3; k++)
        fill_mat(mats[k], FMOE_ST_BF16, k < 2 ? MOE_I : MOE_H, k < 2 ? MOE_H : MOE_I, m->w[k],
                 m->r[k]);
    for (int i = 0; i < MOE_I; i++) m->gb[i] = frand(), m->ub[i] = frand();
    for (int i = 0; i < MOE_H; i++) m->db[i] = frand();
    if (biased) {
        m->mlp.gate_b = m->gb, m->mlp.up_b = m->ub, m->mlp.down_b = m->db;
        m->mlp.glu_alpha = 1.702f, m->mlp.glu_limit = 0.5f;
    }
}

/* y[h] = mlp(x) in double */
static void moe_mlp_ref(const moe_ref *m, const float *x, double *y) {
    double a[MOE_I];
    for (int i = 0; i < MOE_I; i++) {
        double g = 0, u = 0;
        for (int c = 0; c < MOE_H; c++) g += m->r[0][i * MOE_H + c] * x[c], u += m->r[1][i * MOE_H + c] * x[c];
        if (m->mlp.glu_limit > 0) {
            g = fmin(g + m->gb[i], m->mlp.glu_limit);
            u = fmax(fmin(u + m->ub[i], m->mlp.glu_limit), -m->mlp.glu_limit);
            a[i] = (u + 1) * g / (1 + exp(-m->mlp.glu_alpha * g));
        } else {
            a[i] = g / (1 + exp(-g)) * u;
        }
    }
    for (int r = 0; r < MOE_H; r++) {
        double s = m->mlp.down_b ? m->db[r] : 0;
        for (int i = 0; i < MOE_I; i++) s += m->r[2][r * MOE_I + i] * a[i];
        y[r] = s;
    }
}

TEST(cpu_moe_experts_by_hand) {
    static moe_ref e[4]; /* three routed, one shared */
    for (int k = 0; k < 4; k++) moe_make(&e[k], k == 1);
    const fmoe__mlp experts[3] = {e[0].mlp, e[1].mlp, e[2].mlp};
    float xn[2 * MOE_H], acc[2][2 * MOE_H];
    for (int i = 0; i < 2 * MOE_H; i++) xn[i] = frand();
    /* expert 0: tokens 0 and 1; expert 1: token 1; expert 2: token 0 */
    const int32_t off[4] = {0, 2, 3, 4}, rows[4] = {0, 1, 1, 0};
    const float scale[4] = {0.5f, 0.25f, 0.75f, 0.5f};
    fmoe__moe_args a = {.xn = xn, .n = 2, .h = MOE_H, .count = 3, .experts = experts,
                        .offset_host = off, .rows_host = rows, .scale_host = scale,
                        .shared = &e[3].mlp};
    setenv("FMOE_CPU_MIN_WORK", "0", 1); /* split even these small products */
    for (int threads = 1; threads <= 2; threads++) {
        fmoe__backend_limits lim = {.threads = threads, .max_cols = 256, .max_batch = 4,
                                    .max_context = 16, .max_experts = 8};
        void *ctx;
        ASSERT_OK(fmoe__cpu_backend.init(&lim, &ctx));
        a.acc = acc[threads - 1];
        memset(a.acc, 0, sizeof acc[0]);
        ASSERT_EQ(fmoe__cpu_backend.moe_experts(ctx, &a), 0);
        fmoe__moe_args big = a;
        big.n = 5;
        ASSERT_EQ(fmoe__cpu_backend.moe_experts(ctx, &big), 1);
        float w32[MOE_I * MOE_H] = {0};
        fmoe__mlp f32 = e[0].mlp;
        f32.up = (fmoe__mat){.data = w32, .dtype = FMOE_ST_F32, .rows = MOE_I, .cols = MOE_H};
        const fmoe__mlp with_f32[3] = {e[0].mlp, f32, e[2].mlp};
        fmoe__moe_args f = a;
        f.experts = with_f32;
        ASSERT_EQ(fmoe__cpu_backend.moe_experts(ctx, &f), 1);
        fmoe__cpu_backend.free(ctx);
    }
    unsetenv("FMOE_CPU_MIN_WORK");
    ASSERT_EQ(memcmp(acc[0], acc[1], sizeof acc[0]), 0);
    double want[2][MOE_H] = {{0}}, y[MOE_H];
    for (int k = 0; k < 3; k++)
        for (int j = off[k]; j < off[k + 1]; j++) {
            moe_mlp_ref(&e[k], xn + rows[j] * MOE_H, y);
            for (int r = 0; r < MOE_H; r++) want[rows[j]][r] += scale[j] * y[r];
        }
    for (int t = 0; t < 2; t++) {
        moe_mlp_ref(&e[3], xn + t * MOE_H, y);
        for (int r = 0; r < MOE_H; r++) {
            want[t][r] += y[r];
            ASSERT_NEAR(acc[0][t * MOE_H + r], want[t][r], 1e-4 * (1 + fabs(want[t][r])));
        }
    }
}

/* Attention against a double reference, for head widths off and on the SIMD path (8;
 * 16, 80, 128: multiples of 16), query heads per key/value head of 1, 2, 4 and 6 (a task
 * takes up to four of a group: 4, 2 or 3 at once, fewer with more threads), causal, with a
 * window, with sinks; and bit for bit the same at 1, 2 and 3 threads, whose tasks group the
 * heads differently. */
TEST(cpu_attention_gqa_causal_and_window) {
    const fmoe__backend_ops *be = &fmoe__cpu_backend;
    const int32_t shapes[][3] = {{4, 2, 8}, {4, 2, 16}, {8, 2, 128}, {12, 2, 80}, {3, 3, 16},
                                 {6, 1, 16}};
    const int32_t ctxlen = 40, n = 6, pos0 = 30, maxf = 12 * 128;
    float *kc = malloc(sizeof(float) * ctxlen * maxf), *vc = malloc(sizeof(float) * ctxlen * maxf);
    float *q = malloc(sizeof(float) * n * maxf), *out[3];
    for (int i = 0; i < 3; i++) out[i] = malloc(sizeof(float) * n * maxf);
    for (int i = 0; i < ctxlen * maxf; i++) kc[i] = frand(), vc[i] = frand();
    for (int i = 0; i < n * maxf; i++) q[i] = frand();
    const float sinks[12] = {-1.0f, 0.5f, 3.0f, 20.0f, 0, 1, 2, -3, 4, 0.25f, -0.5f, 1.5f};
    setenv("FMOE_CPU_MIN_WORK", "0", 1); /* every call through the pool's tasks */
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
    for (int sink = 0; sink <= 1; sink++)
    for (int window = 0; window <= 5; window += 5) {
        const int32_t Hq = shapes[sh][0], Hk = shapes[sh][1], D = shapes[sh][2];
        for (int th = 1; th <= 3; th++) {
            fmoe__backend_limits lim = {.threads = th, .max_cols = 64, .max_batch = 8,
                                        .max_context = ctxlen};
            void *ctx;
            ASSERT_OK(be->init(&lim, &ctx));
            fmoe__attn_args a = {.q = q, .k_cache = kc, .v_cache = vc, .out = out[th - 1],
                                 .n = n, .pos0 = pos0, .n_heads = Hq, .n_kv_heads = Hk,
                                 .head_dim = D, .window = window, .scale = 1.0f / sqrtf((float)D),
                                 .sinks = sink ? sinks : NULL};
            be->attention(ctx, &a);
            be->free(ctx);
            if (th > 1)
                ASSERT_EQ(memcmp(out[0], out[th - 1], sizeof(float) * n * Hq * D), 0);
        }
        for (int t = 0; t < n; t++)
            for (int h = 0; h < Hq; h++) {
                const int hk = h / (Hq / Hk), pos = pos0 + t;
                const int lo = window && pos - window + 1 > 0 ? pos - window + 1 : 0;
                double sc[64], mx = -1e30, sum = 0;
                for (int p = lo; p <= pos; p++) {
                    double d = 0;
                    for (int i = 0; i < D; i++)
                        d += q[(t * Hq + h) * D + i] * kc[(p * Hk + hk) * D + i];
                    sc[p] = d / sqrt(D);
                    mx = fmax(mx, sc[p]);
                }
                if (sink) mx = fmax(mx, sinks[h]);
                for (int p = lo; p <= pos; p++) sum += exp(sc[p] - mx);
                if (sink) sum += exp(sinks[h] - mx);
                for (int i = 0; i < D; i++) {
                    double o = 0;
                    for (int p = lo; p <= pos; p++)
                        o += exp(sc[p] - mx) / sum * vc[(p * Hk + hk) * D + i];
                    ASSERT_NEAR(out[0][(t * Hq + h) * D + i], o, 2e-5);
                }
            }
    }
    unsetenv("FMOE_CPU_MIN_WORK");
    free(kc);
    free(vc);
    free(q);
    for (int i = 0; i < 3; i++) free(out[i]);
}

static void count_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    atomic_int *hits = ctx;
    atomic_fetch_add(&hits[task], 1);
}

TEST(threadpool_runs_every_task_once) {
    for (int threads = 1; threads <= 4; threads++) {
        fmoe__pool *p;
        ASSERT_OK(fmoe__pool_init(threads, &p));
        ASSERT_EQ(fmoe__pool_threads(p), threads);
        static atomic_int hits[1000];
        for (int round = 0; round < 200; round++) {
            const int n = 1 + (round * 37) % 1000;
            for (int i = 0; i < n; i++) atomic_store(&hits[i], 0);
            fmoe__pool_run(p, count_task, hits, n);
            for (int i = 0; i < n; i++)
                if (atomic_load(&hits[i]) != 1)
                    HARNESS_FAIL("threads %d round %d: task %d ran %d times", threads, round,
                                 i, atomic_load(&hits[i]));
        }
        fmoe__pool_free(p);
    }
    fmoe__pool_free(NULL);
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }

/* The fused MoE experts over a prefill pass (more than 4 rows) with 8-bit activations,
 * against the per-expert loop the forward pass runs where they decline (gather, gate and
 * up, SwiGLU, down, weighted scatter; the shared expert added last), built here from the
 * backend's own ops: bit for bit at 1 and 2 threads, for Q4_K (Q8_K inputs, 256-value
 * blocks: each of down's input blocks quantised by whichever job-1 task finishes it) and
 * Q8_0 (32-value blocks). The loop's own products are checked against transformers by
 * tests/python/test_forward.py; this proves the fused path computes the same. */
#define PF_H 256
#define PF_I 512
#define PF_N 8
#define PF_E 3
TEST(cpu_moe_experts_prefill_8bit_matches_the_loop) {
    const uint32_t types[2] = {FMOE_GGML_Q4_K, FMOE_GGML_Q8_0};
    static float wf[PF_I * PF_H];
    static float xn[PF_N * PF_H], fused[PF_N * PF_H], loop[PF_N * PF_H];
    static float xg[PF_N * PF_H], g[PF_N * PF_I], u[PF_N * PF_I], y[PF_N * PF_H];
    /* expert 0: tokens 0-5, expert 1: 1, 3, 7, expert 2: 0, 2, 4, 6, 7 */
    const int32_t off[PF_E + 1] = {0, 6, 9, 14};
    const int32_t rows[14] = {0, 1, 2, 3, 4, 5, 1, 3, 7, 0, 2, 4, 6, 7};
    float scale[14];
    for (int i = 0; i < 14; i++) scale[i] = 0.5f + frand() / 4;
    for (int i = 0; i < PF_N * PF_H; i++) xn[i] = frand();
    setenv("FMOE_CPU_MIN_WORK", "0", 1); /* split even these small products */
    for (int ti = 0; ti < 2; ti++) {
        const uint32_t type = types[ti];
        fmoe__mlp mlp[PF_E + 1];
        void *blobs[PF_E + 1][3];
        for (int k = 0; k <= PF_E; k++) {
            fmoe__mat *m[3] = {&mlp[k].gate, &mlp[k].up, &mlp[k].down};
            memset(&mlp[k], 0, sizeof mlp[k]);
            for (int j = 0; j < 3; j++) {
                const int64_t r = j < 2 ? PF_I : PF_H, c = j < 2 ? PF_H : PF_I;
                const int64_t rb = fmoe_quant_row_bytes(type, c);
                blobs[k][j] = malloc((size_t)(r * rb));
                for (int64_t i = 0; i < r * c; i++) wf[i] = frand() / 8;
                for (int64_t i = 0; i < r; i++)
                    fmoe_quant_quantize_row(type, wf + i * c, (uint8_t *)blobs[k][j] + i * rb, c);
                *m[j] = (fmoe__mat){.data = blobs[k][j], .dtype = FMOE_ST_U8, .rows = r,
                                    .cols = c, .quant = type};
            }
        }
        fmoe__moe_args a = {.xn = xn, .n = PF_N, .h = PF_H, .count = PF_E, .experts = mlp,
                            .offset_host = off, .rows_host = rows, .scale_host = scale,
                            .shared = &mlp[PF_E]};
        float first[PF_N * PF_H];
        for (int threads = 1; threads <= 2; threads++) {
            fmoe__backend_limits lim = {.threads = threads, .max_cols = PF_I, .max_batch = PF_N,
                                        .max_context = 16, .max_experts = 2 * PF_N,
                                        .activations = FMOE_ACTIVATIONS_Q8};
            const fmoe__backend_ops *be = &fmoe__cpu_backend;
            void *ctx;
            ASSERT_OK(be->init(&lim, &ctx));
            memset(fused, 0, sizeof fused);
            a.acc = fused;
            ASSERT_EQ(be->moe_experts(ctx, &a), 0); /* taken, not declined */
            memset(loop, 0, sizeof loop);
            for (int k = 0; k <= PF_E; k++) {
                const int shared = k == PF_E;
                const int32_t c = shared ? PF_N : off[k + 1] - off[k];
                const float *in = xn;
                if (!shared) {
                    be->gather_rows(ctx, xg, xn, rows + off[k], c, PF_H);
                    in = xg;
                }
                be->matmul(ctx, &mlp[k].gate, in, c, g);
                be->matmul(ctx, &mlp[k].up, in, c, u);
                be->swiglu(ctx, g, u, (int64_t)c * PF_I);
                be->matmul(ctx, &mlp[k].down, g, c, y);
                if (shared)
                    be->add(ctx, loop, y, (int64_t)PF_N * PF_H);
                else
                    be->scatter_add(ctx, loop, y, rows + off[k], scale + off[k], c, PF_H);
            }
            if (memcmp(fused, loop, sizeof loop) != 0) {
                int i = 0;
                while (fused[i] == loop[i]) i++;
                HARNESS_FAIL("type %u, %d threads: row %d col %d fused %.9g, loop %.9g", type,
                             threads, i / PF_H, i % PF_H, fused[i], loop[i]);
            }
            if (threads == 1) memcpy(first, fused, sizeof first);
            ASSERT_EQ(memcmp(first, fused, sizeof first), 0);
            float finite = 0;
            for (int i = 0; i < PF_N * PF_H; i++) finite += fabsf(fused[i]);
            ASSERT_TRUE(isfinite(finite) && finite > 0);
            be->free(ctx);
        }
        for (int k = 0; k <= PF_E; k++)
            for (int j = 0; j < 3; j++) free(blobs[k][j]);
    }
    unsetenv("FMOE_CPU_MIN_WORK");
}
