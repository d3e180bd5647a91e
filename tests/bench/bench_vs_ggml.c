/*
 * bench_vs_ggml.c - fmoe's 8-bit-activation products against llama.cpp's CPU kernels, type
 * by type, in one process on the same weights (not a test; the "per type against ggml"
 * and "per multiply-add" tables of docs/quantization.md "Speed" come from it).
 *
 * For each type: a ROWS x COLS matrix of valid blocks (fmoe's quantiser on pseudo-random
 * values where fmoe writes the type, else hashed bytes with a small finite scale: every bit
 * pattern of those types is a valid block), one f32 input and eight. fmoe's side is
 * fmoe_quant_act_matvec over the whole matrix, its inputs quantised by
 * fmoe_quant_act_quantize. ggml's side, when the path of libggml-cpu.so is given, is
 * ggml_get_type_traits_cpu(type)->vec_dot called row by row (and input by input: for these
 * types ggml has no several-input vec_dot, nrows 1), its inputs quantised by the from_float
 * of the type's vec_dot_type (Q8_K, Q8_0 or Q8_1), as ggml's mul_mat does; and, for the
 * types llama.cpp repacks on an AVX2 CPU when it loads a model (Q4_0, IQ4_NL, MXFP4, Q4_K:
 * eight rows interleaved, ggml-cpu/repack.cpp), its repacked one-input kernel
 * ggml_gemv_<type>_8x8_q8_0 (Q4_K: ggml_gemv_q4_K_8x8_q8_K, Q8_K inputs) on the same blocks
 * repacked here in that layout (repack_8x8, repack_q4_k_8x8), which is what its decode
 * runs; with --kernels also Q2_K's, which llama.cpp repacks on an AVX-512 CPU
 * (q2_k_repacked: ggml_gemv_q2_K_8x8_q8_K on Q8_K inputs, its own layout).
 * The library is dlopen'ed, so this builds without
 * llama.cpp; ggml's type numbers are the GGUF ones fmoe uses (fmoe/quant.h).
 *
 * Two modes. The default times one input and eight, each sample several products (about
 * 2 ms). --kernels times one input, each sample one pass over the matrix (the L2-resident
 * 128 x 4096 by default: the kernels' arithmetic, not memory), best of SAMPLES (default
 * 100); --stream adds a matrix streamed from memory (16384 x COLS, more rows where that
 * is under 64 MiB).
 *
 * Timing: thread CPU time, the sides alternating sample by sample, the fastest sample of
 * each kept: on a shared machine other processes only ever add time. Reported in
 * picoseconds per multiply-add. The sides' results are compared too (largest difference
 * over the rows, relative to the largest |y|): different input quantisers (Q8_1 for ggml's
 * Q4_1/Q5_1) and summation orders make them differ by rounding, never by more, so a wrong
 * type mapping or repack shows at once.
 *
 *     build/tests/lib/bench_vs_ggml [--ggml PATH/libggml-cpu.so] [--kernels [--stream]]
 *                                   [ROWS COLS SAMPLES] [TYPE...]
 *
 * (defaults 128 4096, SAMPLES 15 or with --kernels 100; TYPE: ggml names such as IQ2_XXS,
 * default every type fmoe reads with 8-bit inputs, with --kernels the 32-value types and
 * Q4_K, Q5_K and Q6_K). FMOE_NO_AVX512=1 times fmoe's AVX2 level on an AVX-512 CPU, FMOE_NO_VNNI=1 its
 * AVX2 kernels without vpdpbusd.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/quant.h"
#include "fmoe/quant_act.h"
#include "quant_impl.h"

/* ggml-cpu.h's struct ggml_type_traits_cpu and ggml_vec_dot_t, restated (the header is not
 * at hand when llama.cpp is not). */
typedef void (*ggml_from_float_fn)(const float *x, void *y, int64_t k);
typedef void (*ggml_vec_dot_fn)(int n, float *s, size_t bs, const void *x, size_t bx,
                                const void *y, size_t by, int nrc);
struct ggml_traits_cpu {
    ggml_from_float_fn from_float;
    ggml_vec_dot_fn vec_dot;
    int vec_dot_type;
    int64_t nrows;
};
typedef const struct ggml_traits_cpu *(*ggml_traits_fn)(int type);
/* ggml_gemv_<type>_8x8_q8_0 (ggml-cpu/repack.h): nc rows (a multiple of 8), repacked, times
 * nr Q8_0 inputs of n values (Q4_K's: Q8_K inputs); bs is not read by the one-input form. */
typedef void (*ggml_gemv_fn)(int n, float *s, size_t bs, const void *vx, const void *vy, int nr,
                             int nc);

enum { NX = 8 };

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The repacked kernel llama.cpp's CPU backend takes for type t on an AVX2 CPU
 * (ggml_repack_get_optimal_repack_type in repack.cpp, 0c1e570), or NULL. */
static ggml_gemv_fn repacked_gemv(void *lib, uint32_t t) {
    if (!lib) return NULL;
    const char *name = t == FMOE_GGML_Q4_0     ? "ggml_gemv_q4_0_8x8_q8_0"
                       : t == FMOE_GGML_IQ4_NL ? "ggml_gemv_iq4_nl_8x8_q8_0"
                       : t == FMOE_GGML_MXFP4  ? "ggml_gemv_mxfp4_8x8_q8_0"
                       : t == FMOE_GGML_Q4_K   ? "ggml_gemv_q4_K_8x8_q8_K"
                                               : NULL;
    return name ? (ggml_gemv_fn)dlsym(lib, name) : NULL;
}

/* Rows in ggml's 8x8 layout (repack.cpp's make_block_q4_0x8 / _iq4_nlx8 / _mxfp4x8 with
 * an interleave of 8): for each group of eight rows and each block column, the eight
 * blocks' scales (f16, or MXFP4's E8M0 byte) side by side, then their 16 bytes of nibbles
 * as 8-byte pieces in the order row 0 piece 0, row 1 piece 0, ..., row 7 piece 1. Q4_0's
 * nibbles are XORed with 0x88 (the code minus 8, as a signed nibble, for ggml's lookup). */
static void repack_8x8(uint32_t t, const uint8_t *W, int64_t rb, int64_t rows, int64_t cols,
                       uint8_t *dst) {
    const int64_t nb = cols / 32, bs = fmoe_ggml_type_size(t);
    const int dbytes = t == FMOE_GGML_MXFP4 ? 1 : 2;
    for (int64_t g = 0; g < rows; g += 8)
        for (int64_t b = 0; b < nb; b++) {
            for (int i = 0; i < 8; i++) memcpy(dst + i * dbytes, W + (g + i) * rb + b * bs, (size_t)dbytes);
            dst += 8 * dbytes;
            for (int i = 0; i < 16; i++) {
                const uint8_t *src = W + (g + i % 8) * rb + b * bs + dbytes + (i / 8) * 8;
                for (int k = 0; k < 8; k++) dst[8 * i + k] = (uint8_t)(src[k] ^ (t == FMOE_GGML_Q4_0 ? 0x88 : 0));
            }
            dst += 128;
        }
}

/* Q4_K rows in ggml's block_q4_Kx8 layout (repack.cpp's make_block_q4_Kx8, interleave 8):
 * for each group of eight rows and each block column, the eight d (f16), the eight dmin,
 * then per sub-block s (0..7) twelve bytes holding the eight rows' scale and min of
 * sub-block s packed as one Q4_K block packs its eight sub-blocks' (row j in the place of
 * sub-block j), then the 128 bytes of nibbles as 8-byte pieces, row 0 piece 0, row 1
 * piece 0, ..., row 7 piece 15. */
static void repack_q4_k_8x8(const uint8_t *W, int64_t rb, int64_t rows, int64_t cols, uint8_t *dst) {
    const int64_t nb = cols / FMOE_QK_K;
    for (int64_t g = 0; g < rows; g += 8)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *in[8];
            for (int j = 0; j < 8; j++) in[j] = W + (g + j) * rb + b * FMOE_Q4_K_BYTES;
            for (int j = 0; j < 8; j++) memcpy(dst + 2 * j, in[j], 2);
            for (int j = 0; j < 8; j++) memcpy(dst + 16 + 2 * j, in[j] + 2, 2);
            for (int s = 0; s < 8; s++) {
                uint8_t sc[8], m[8], *o = dst + 32 + 12 * s;
                for (int j = 0; j < 8; j++) fmoe__scale_min_k4(s, in[j] + 4, &sc[j], &m[j]);
                for (int j = 0; j < 4; j++) {
                    o[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
                    o[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
                    o[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
                }
            }
            for (int i = 0; i < 128; i++) memcpy(dst + 128 + 8 * i, in[i % 8] + 16 + 8 * (i / 8), 8);
            dst += 128 + 1024;
        }
}

/* Row r of a type fmoe does not write without an importance matrix: hashed bytes, each
 * block's f16 d 1/64 (IQ1_M: in the top nibbles of its four scale words). */
static void hashed_row(uint32_t t, int64_t r, int64_t rb, uint8_t *dst) {
    for (int64_t b = 0; b < rb; b++)
        dst[b] = (uint8_t)(((uint64_t)(r * rb + b) * 2654435761u) >> 13);
    const int64_t bs = fmoe_ggml_type_size(t);
    for (int64_t b = 0; b < rb; b += bs) {
        if (t == FMOE_GGML_IQ1_M) { /* 0x2400 = 1/64 in f16: nibbles 0, 0, 4, 2 */
            for (int k = 0; k < 4; k++)
                dst[b + 49 + 2 * k] = (uint8_t)((dst[b + 49 + 2 * k] & 0x0F) |
                                                (((0x2400 >> (4 * k)) & 0xF) << 4));
        } else {
            dst[b] = 0x00;
            dst[b + 1] = 0x24;
        }
    }
}

static uint32_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

/* Gaussian-ish values (sum of four uniforms), a few columns larger, as real weights. */
static void fill(float *x, int64_t n, uint64_t seed) {
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        float v = 0;
        for (int k = 0; k < 4; k++) v += (float)lcg(&s) / 2147483648.f - 1.f;
        x[i] = v * (i % 61 == 0 ? 4.f : 1.f);
    }
}

typedef struct {
    double fmoe1, fmoe8, ggml1, ggml8, rep1; /* seconds, fastest sample, per product */
    double diff, rdiff; /* max |y_fmoe - y_ggml| / max |y|, and the same for the repacked */
} result;

static double max_rel_diff(const float *a, const float *b, int64_t n) {
    double ymax = 0, dmax = 0;
    for (int64_t i = 0; i < n; i++) {
        ymax = fmax(ymax, fmax(fabs(a[i]), fabs(b[i])));
        dmax = fmax(dmax, fabs((double)a[i] - b[i]));
    }
    return ymax > 0 ? dmax / ymax : dmax;
}

/* g: the type's vec_dot traits and gq its input type's (or NULL), gemv the repacked kernel
 * (or NULL), q8: the traits of its input type (Q8_0, Q4_K's Q8_K). kernels: one input, one
 * pass a sample. */
static void run_type(uint32_t t, int64_t rows, int64_t cols, int samples, int kernels,
                     const struct ggml_traits_cpu *g, const struct ggml_traits_cpu *gq,
                     ggml_gemv_fn gemv, const struct ggml_traits_cpu *q8, result *res) {
    const int64_t rb = fmoe_quant_row_bytes(t, cols), ab = fmoe_quant_act_bytes(t, cols);
    uint8_t *W = malloc((size_t)(rows * rb)), *Wr = gemv ? malloc((size_t)(rows * rb)) : NULL;
    float *wf = malloc((size_t)cols * sizeof *wf), *x = malloc((size_t)(cols * NX) * sizeof *x);
    uint8_t *qx = malloc((size_t)(ab * NX));
    /* ggml's input blocks: Q8_1's 36 bytes per 32 values, Q8_K's 292 per 256 (below 37
     * per 32) */
    const int64_t gab = cols / 32 * 37 + 64;
    uint8_t *gx = malloc((size_t)(gab * NX)), *rx = malloc((size_t)gab);
    float *yf = malloc((size_t)(rows * NX) * sizeof *yf), *yg = malloc((size_t)(rows * NX) * sizeof *yg);
    float *yr = malloc((size_t)rows * sizeof *yr);
    if (!W || (gemv && !Wr) || !wf || !x || !qx || !gx || !rx || !yf || !yg || !yr) {
        fprintf(stderr, "bench_vs_ggml: out of memory\n");
        exit(1);
    }
    for (int64_t r = 0; r < rows; r++) {
        if (fmoe_quant_can_quantize(t)) {
            fill(wf, cols, 1000 + (uint64_t)r);
            fmoe_quant_quantize_row(t, wf, W + r * rb, cols);
        } else {
            hashed_row(t, r, rb, W + r * rb);
        }
    }
    if (gemv) {
        if (t == FMOE_GGML_Q4_K) repack_q4_k_8x8(W, rb, rows, cols, Wr);
        else repack_8x8(t, W, rb, rows, cols, Wr);
    }
    fill(x, cols * NX, 7);
    for (int k = 0; k < NX; k++) {
        fmoe_quant_act_quantize(t, x + k * cols, qx + k * ab, cols);
        if (g) gq->from_float(x + k * cols, gx + k * gab, cols);
    }
    if (gemv) q8->from_float(x, rx, cols);
    /* enough products per sample to read a thread CPU clock (about 2 ms), or one pass */
    const int per = kernels ? 1 : (int)(1 + 4e6 / (double)(rows * cols));
    res->fmoe1 = res->fmoe8 = res->ggml1 = res->ggml8 = res->rep1 = 1e30;
    for (int s = 0; s < samples; s++) {
        double t0 = cpu_now();
        for (int p = 0; p < per; p++) fmoe_quant_act_matvec(t, W, rb, rows, qx, ab, 1, cols, yf, rows);
        double dt = (cpu_now() - t0) / per;
        if (dt < res->fmoe1) res->fmoe1 = dt;
        if (g) {
            t0 = cpu_now();
            for (int p = 0; p < per; p++)
                for (int64_t r = 0; r < rows; r++)
                    g->vec_dot((int)cols, yg + r, 0, W + r * rb, 0, gx, 0, 1);
            dt = (cpu_now() - t0) / per;
            if (dt < res->ggml1) res->ggml1 = dt;
        }
        if (gemv) {
            t0 = cpu_now();
            for (int p = 0; p < per; p++) gemv((int)cols, yr, (size_t)rows, Wr, rx, 1, (int)rows);
            dt = (cpu_now() - t0) / per;
            if (dt < res->rep1) res->rep1 = dt;
        }
        if (kernels) continue;
        t0 = cpu_now();
        fmoe_quant_act_matvec(t, W, rb, rows, qx, ab, NX, cols, yf, rows);
        dt = cpu_now() - t0;
        if (dt < res->fmoe8) res->fmoe8 = dt;
        if (g) {
            /* ggml's mul_mat order for a few columns: each row against every input */
            t0 = cpu_now();
            for (int64_t r = 0; r < rows; r++)
                for (int k = 0; k < NX; k++)
                    g->vec_dot((int)cols, yg + k * rows + r, 0, W + r * rb, 0, gx + k * gab, 0, 1);
            dt = cpu_now() - t0;
            if (dt < res->ggml8) res->ggml8 = dt;
        }
    }
    res->diff = g ? max_rel_diff(yf, yg, kernels ? rows : rows * NX) : 0;
    res->rdiff = gemv ? max_rel_diff(yf, yr, rows) : 0;
    free(W);
    free(Wr);
    free(wf);
    free(x);
    free(qx);
    free(gx);
    free(rx);
    free(yf);
    free(yg);
    free(yr);
}

/* Q2_K as llama.cpp's CPU backend runs it on an AVX-512 CPU: repacked at load into eight-row
 * groups (repack.cpp's block_q2_Kx8, chosen by ggml_repack_get_optimal_repack_type when the
 * CPU has AVX-512) and multiplied by ggml_gemv_q2_K_8x8_q8_K against a Q8_K input. Rebuilt
 * here on run_type's weights and first input (the same fills), timed on its own (best of
 * SAMPLES), and compared with fmoe's rows: res->rep1, res->rdiff. The layout, written from
 * repack.h's struct: per eight rows and block column, the eight f16 d, the eight f16 dmin,
 * 128 scale bytes (byte i: row (i % 16) / 2's scales[2(i / 16) + i % 2]), then 512 bytes
 * of qs as 8-byte pieces, piece i row i % 8's bytes 8(i / 8) ... */
static void q2_k_repacked(void *lib, ggml_traits_fn traits, int64_t rows, int64_t cols,
                          int samples, result *res) {
    const ggml_gemv_fn gemv = (ggml_gemv_fn)dlsym(lib, "ggml_gemv_q2_K_8x8_q8_K");
    const struct ggml_traits_cpu *q8k = traits(FMOE_GGML_Q8_K);
    if (!gemv || !q8k || !q8k->from_float) return;
    const uint32_t t = FMOE_GGML_Q2_K;
    const int64_t rb = fmoe_quant_row_bytes(t, cols), ab = fmoe_quant_act_bytes(t, cols);
    const int64_t nb = cols / 256, bs = FMOE_Q2_K_BYTES;
    uint8_t *W = malloc((size_t)(rows * rb)), *Wr = malloc((size_t)(rows * rb));
    float *wf = malloc((size_t)cols * sizeof *wf), *x = malloc((size_t)(cols * NX) * sizeof *x);
    uint8_t *qx = malloc((size_t)ab), *gx = malloc((size_t)(nb * 292 + 64));
    float *yf = malloc((size_t)rows * sizeof *yf), *yr = malloc((size_t)rows * sizeof *yr);
    if (!W || !Wr || !wf || !x || !qx || !gx || !yf || !yr) {
        fprintf(stderr, "bench_vs_ggml: out of memory\n");
        exit(1);
    }
    for (int64_t r = 0; r < rows; r++) {
        fill(wf, cols, 1000 + (uint64_t)r);
        fmoe_quant_quantize_row(t, wf, W + r * rb, cols);
    }
    uint8_t *dst = Wr;
    for (int64_t g = 0; g < rows; g += 8)
        for (int64_t b = 0; b < nb; b++, dst += 8 * bs) {
            const uint8_t *src[8];
            for (int i = 0; i < 8; i++) src[i] = W + (g + i) * rb + b * bs;
            for (int i = 0; i < 8; i++) {
                memcpy(dst + 2 * i, src[i] + 80, 2);      /* d */
                memcpy(dst + 16 + 2 * i, src[i] + 82, 2); /* dmin */
            }
            for (int i = 0; i < 128; i++) dst[32 + i] = src[(i % 16) / 2][2 * (i / 16) + i % 2];
            for (int i = 0; i < 64; i++) memcpy(dst + 160 + 8 * i, src[i % 8] + 16 + 8 * (i / 8), 8);
        }
    fill(x, cols * NX, 7);
    fmoe_quant_act_quantize(t, x, qx, cols);
    q8k->from_float(x, gx, cols);
    fmoe_quant_act_matvec(t, W, rb, rows, qx, ab, 1, cols, yf, rows);
    res->rep1 = 1e30;
    for (int s = 0; s < samples; s++) {
        const double t0 = cpu_now();
        gemv((int)cols, yr, (size_t)rows, Wr, gx, 1, (int)rows);
        const double dt = cpu_now() - t0;
        if (dt < res->rep1) res->rep1 = dt;
    }
    res->rdiff = max_rel_diff(yf, yr, rows);
    free(W);
    free(Wr);
    free(wf);
    free(x);
    free(qx);
    free(gx);
    free(yf);
    free(yr);
}

static void print_ps(double seconds, double macs) {
    if (seconds < 1e29) printf(" %.1f |", seconds / macs * 1e12);
    else printf(" - |");
}

int main(int argc, char **argv) {
    const char *lib = NULL;
    int kernels = 0, stream = 0, argi = 1;
    for (;;) {
        if (argi + 1 < argc && strcmp(argv[argi], "--ggml") == 0) {
            lib = argv[argi + 1];
            argi += 2;
        } else if (argi < argc && strcmp(argv[argi], "--kernels") == 0) {
            kernels = 1;
            argi++;
        } else if (argi < argc && strcmp(argv[argi], "--stream") == 0) {
            stream = 1;
            argi++;
        } else {
            break;
        }
    }
    int64_t rows = 128, cols = 4096;
    int samples = kernels ? 100 : 15;
    if (argi < argc && argv[argi][0] >= '0' && argv[argi][0] <= '9') rows = atoll(argv[argi++]);
    if (argi < argc && argv[argi][0] >= '0' && argv[argi][0] <= '9') cols = atoll(argv[argi++]);
    if (argi < argc && argv[argi][0] >= '0' && argv[argi][0] <= '9') samples = atoi(argv[argi++]);
    if (rows < 8 || rows % 8 != 0 || cols < 256 || cols % 256 != 0 || samples < 1 || (stream && !kernels)) {
        fprintf(stderr, "usage: bench_vs_ggml [--ggml PATH/libggml-cpu.so] [--kernels [--stream]] "
                        "[ROWS COLS SAMPLES] [TYPE...] (ROWS a multiple of 8, COLS of 256)\n");
        return 2;
    }
    uint32_t types[FMOE_GGML_TYPE_END];
    int ntypes = 0;
    for (; argi < argc; argi++) {
        fmoe_ggml_type t;
        if (fmoe_ggml_type_parse(argv[argi], &t) != 0 || !fmoe_quant_act_supported(t)) {
            fprintf(stderr, "bench_vs_ggml: %s: not a type with 8-bit-input products\n", argv[argi]);
            return 2;
        }
        types[ntypes++] = t;
    }
    if (ntypes == 0 && kernels) {
        static const uint32_t q32[] = {FMOE_GGML_Q4_0, FMOE_GGML_Q4_1, FMOE_GGML_Q5_0,
                                       FMOE_GGML_Q5_1, FMOE_GGML_Q8_0, FMOE_GGML_IQ4_NL,
                                       FMOE_GGML_MXFP4, FMOE_GGML_Q4_K, FMOE_GGML_Q5_K, FMOE_GGML_Q6_K};
        for (size_t k = 0; k < sizeof q32 / sizeof q32[0]; k++) types[ntypes++] = q32[k];
    } else if (ntypes == 0) {
        static const uint32_t all[] = {
            FMOE_GGML_IQ4_NL, FMOE_GGML_IQ4_XS, FMOE_GGML_IQ3_XXS, FMOE_GGML_IQ3_S,
            FMOE_GGML_IQ2_XXS, FMOE_GGML_IQ2_XS, FMOE_GGML_IQ2_S, FMOE_GGML_IQ1_S,
            FMOE_GGML_IQ1_M, FMOE_GGML_Q2_K, FMOE_GGML_Q3_K, FMOE_GGML_Q4_0,
            FMOE_GGML_Q4_1, FMOE_GGML_Q5_0, FMOE_GGML_Q5_1, FMOE_GGML_Q8_0,
            FMOE_GGML_Q4_K, FMOE_GGML_Q5_K, FMOE_GGML_Q6_K, FMOE_GGML_MXFP4};
        for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) types[ntypes++] = all[k];
    }
    ggml_traits_fn traits = NULL;
    void *h = NULL;
    if (lib) {
        h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "bench_vs_ggml: %s\n", dlerror());
            return 1;
        }
        void (*init)(void) = (void (*)(void))dlsym(h, "ggml_cpu_init");
        traits = (ggml_traits_fn)dlsym(h, "ggml_get_type_traits_cpu");
        if (!init || !traits) {
            fprintf(stderr, "bench_vs_ggml: %s: no ggml_cpu_init or ggml_get_type_traits_cpu\n", lib);
            return 1;
        }
        init();
    }
    const struct ggml_traits_cpu *q8 = traits ? traits(FMOE_GGML_Q8_0) : NULL;
    const struct ggml_traits_cpu *q8k = traits ? traits(FMOE_GGML_Q8_K) : NULL;
    printf("%s, best of %d samples (thread CPU time, %s), fmoe level %s%s%s%s\n\n",
           kernels ? "one input" : "one input and eight", samples,
           kernels ? "one pass each" : "about 2 ms each", fmoe__quant_level_name(fmoe__quant_level()),
           getenv("FMOE_NO_VNNI") ? " (FMOE_NO_VNNI)" : "", lib ? ", ggml " : "", lib ? lib : "");
    printf("ps per multiply-add, 8-bit inputs; ggml repacked: ggml_gemv_<type>_8x8_q8_0 (Q4_K: "
           "_q8_K) where llama.cpp repacks the type on AVX2\n\n");
    if (kernels)
        printf("| type | rows x cols | fmoe | ggml vec_dot | ggml repacked | best ggml/fmoe "
               "| max diff (vec_dot, repacked) |\n|---|---|---|---|---|---|---|\n");
    else
        printf("| type | fmoe 1 input | ggml 1 input | ggml repacked 1 input | ggml/fmoe | fmoe %d inputs "
               "| ggml %d inputs | ggml/fmoe | max diff |\n|---|---|---|---|---|---|---|---|---|\n",
               NX, NX);
    for (int k = 0; k < ntypes; k++) {
        const uint32_t t = types[k];
        const struct ggml_traits_cpu *g = traits ? traits((int)t) : NULL, *gq = NULL;
        if (g && (!g->vec_dot || g->nrows != 1)) g = NULL;
        if (g) {
            gq = traits(g->vec_dot_type);
            if (!gq || !gq->from_float) g = NULL;
        }
        const struct ggml_traits_cpu *rq = t == FMOE_GGML_Q4_K ? q8k : q8;
        const ggml_gemv_fn gemv = rq && rq->from_float ? repacked_gemv(h, t) : NULL;
        for (int size = 0; size < (kernels && stream ? 2 : 1); size++) {
            /* the streamed matrix: 16384 rows, more where that is under 64 MiB (twice
             * the 32 MiB L3 of the development VM's EPYC: 16384 rows of 1024 Q4_K values
             * are 9 MiB, which a pass reads from L3, not memory) */
            const int64_t srows = (((int64_t)64 << 20) / fmoe_quant_row_bytes(t, cols) + 7) / 8 * 8;
            const int64_t r = size ? (srows > 16384 ? srows : 16384) : rows;
            result res;
            run_type(t, r, cols, size ? (samples + 19) / 20 : samples, kernels, g, gq, gemv, rq, &res);
            if (kernels && h && t == FMOE_GGML_Q2_K)
                q2_k_repacked(h, traits, r, cols, size ? (samples + 19) / 20 : samples, &res);
            const double macs = (double)(r * cols);
            const double best_g = fmin(res.ggml1, res.rep1);
            printf("| %s |", fmoe_ggml_type_name(t));
            if (kernels) printf(" %lld x %lld |", (long long)r, (long long)cols);
            print_ps(res.fmoe1, macs);
            print_ps(res.ggml1, macs);
            print_ps(res.rep1, macs);
            if (best_g < 1e29) printf(" %.2f |", best_g / res.fmoe1);
            else printf(" - |");
            if (kernels) {
                if (g) printf(" %.1e,", res.diff);
                else printf(" -,");
                if (res.rep1 < 1e29) printf(" %.1e |\n", res.rdiff);
                else printf(" - |\n");
                fflush(stdout);
                continue;
            }
            print_ps(res.fmoe8 / NX, macs);
            print_ps(res.ggml8 / NX, macs);
            if (g) printf(" %.2f | %.1e |\n", res.ggml8 / res.fmoe8, res.diff);
            else printf(" - | - |\n");
            fflush(stdout);
        }
    }
    return 0;
}
