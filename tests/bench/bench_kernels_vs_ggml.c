/*
 * bench_kernels_vs_ggml.c - fmoe's 8-bit-activation dot kernels against llama.cpp's, per
 * multiply-add, in one process on the same blocks: for each type, a ROWS x COLS matrix
 * (quantised by fmoe, whose blocks are ggml's) times one input vector, through
 * fmoe_quant_act_matvec (the rows loop inside the kernel, as the CPU backend calls it) and
 * through ggml's `vec_dot` row by row (ggml_get_type_traits_cpu(type), from the
 * libggml-cpu.so given, dlopen'ed; the input quantised by its own from_float), best of REPS
 * timed passes each, alternating, on one thread. Prints picoseconds per multiply-add and
 * the two results' largest relative difference (they sum in different orders; a large
 * value means the two read the blocks differently, not a speed). Two sizes per type: the
 * matrix small enough to stay in L2 (the kernels' arithmetic) and large enough to stream
 * from memory.
 *
 * Not a test and not built against llama.cpp: ggml's few entry points are looked up at run
 * time, so this builds everywhere and runs where a libggml-cpu.so is at hand. ggml's
 * repacked layouts (on AVX2, Q4_0, Q4_K, IQ4_NL and MXFP4 rows interleaved eight at a time
 * when llama.cpp loads a model) are not what vec_dot times; docs/quantization.md ("Speed").
 *
 *     build/tests/lib/bench_kernels_vs_ggml LIBGGML_CPU.so [TYPES [REPS]]
 *       TYPES: comma-separated ggml type ids or names of mxfp4,q5_0,q8_0,q4_k,q6_k,q4_0,
 *              q4_1,q5_1,iq4_nl,q5_k (default mxfp4,q5_0,q8_0,q4_k,q6_k); REPS default 15
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/quant.h"
#include "fmoe/quant_act.h"

/* ggml's public CPU type traits (ggml-cpu.h), the fields used here in their order. */
typedef void (*ggml_from_float_t)(const float *x, void *y, int64_t k);
typedef void (*ggml_vec_dot_t)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y,
                               size_t by, int nrc);
struct ggml_type_traits_cpu {
    ggml_from_float_t from_float;
    ggml_vec_dot_t vec_dot;
    int vec_dot_type;
    int64_t nrows;
};

static const struct {
    const char *name;
    uint32_t type;
} TYPES[] = {
    {"mxfp4", FMOE_GGML_MXFP4}, {"q5_0", FMOE_GGML_Q5_0}, {"q8_0", FMOE_GGML_Q8_0},
    {"q4_k", FMOE_GGML_Q4_K},   {"q6_k", FMOE_GGML_Q6_K}, {"q4_0", FMOE_GGML_Q4_0},
    {"q4_1", FMOE_GGML_Q4_1},   {"q5_1", FMOE_GGML_Q5_1}, {"iq4_nl", FMOE_GGML_IQ4_NL},
    {"q5_k", FMOE_GGML_Q5_K},
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float gauss(void) { /* Box-Muller on xorshift64 */
    double u[2];
    for (int i = 0; i < 2; i++) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        u[i] = ((rng_state >> 11) + 0.5) / 9007199254740992.0;
    }
    return (float)(sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

/* One type at one size; returns 0, or -1 when a buffer could not be had. */
static int bench_type(const char *name, uint32_t t, const struct ggml_type_traits_cpu *g,
                      int64_t rows, int64_t cols, int reps) {
    const int64_t rb = fmoe_quant_row_bytes(t, cols), qb = fmoe_quant_act_bytes(t, cols);
    uint8_t *W = malloc((size_t)(rows * rb)), *qf = malloc((size_t)qb), *qg = malloc((size_t)qb * 2);
    float *w = malloc(sizeof(float) * (size_t)cols), *x = malloc(sizeof(float) * (size_t)cols);
    float *yf = malloc(sizeof(float) * (size_t)rows), *yg = malloc(sizeof(float) * (size_t)rows);
    if (!W || !qf || !qg || !w || !x || !yf || !yg) {
        free(W), free(qf), free(qg), free(w), free(x), free(yf), free(yg);
        return -1;
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) w[c] = 0.02f * gauss();
        fmoe_quant_quantize_row(t, w, W + r * rb, cols);
    }
    for (int64_t c = 0; c < cols; c++) x[c] = gauss();
    fmoe_quant_act_quantize(t, x, qf, cols);
    g->from_float(x, qg, cols);
    double best_f = 1e30, best_g = 1e30;
    for (int k = 0; k < reps; k++) {
        double t0 = now();
        fmoe_quant_act_matvec(t, W, rb, rows, qf, qb, 1, cols, yf, rows);
        double t1 = now();
        for (int64_t r = 0; r < rows; r++) g->vec_dot((int)cols, yg + r, 0, W + r * rb, 0, qg, 0, 1);
        double t2 = now();
        if (t1 - t0 < best_f) best_f = t1 - t0;
        if (t2 - t1 < best_g) best_g = t2 - t1;
    }
    double maxrel = 0, scale = 0;
    for (int64_t r = 0; r < rows; r++) scale = fmax(scale, fabs(yg[r]));
    for (int64_t r = 0; r < rows; r++) maxrel = fmax(maxrel, fabs(yf[r] - yg[r]) / (scale > 0 ? scale : 1));
    const double macs = (double)rows * (double)cols;
    printf("%-7s %6lld x %-6lld %8.2f MB  fmoe %6.1f ps  ggml %6.1f ps  fmoe/ggml time %.2f  max diff %.1e\n",
           name, (long long)rows, (long long)cols, rows * rb / 1e6, best_f / macs * 1e12,
           best_g / macs * 1e12, best_f / best_g, maxrel);
    free(W), free(qf), free(qg), free(w), free(x), free(yf), free(yg);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_kernels_vs_ggml LIBGGML_CPU.so [TYPES [REPS]]\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "bench_kernels_vs_ggml: %s\n", dlerror());
        return 1;
    }
    void (*cpu_init)(void) = (void (*)(void))dlsym(lib, "ggml_cpu_init");
    const struct ggml_type_traits_cpu *(*traits)(int) =
        (const struct ggml_type_traits_cpu *(*)(int))dlsym(lib, "ggml_get_type_traits_cpu");
    if (!cpu_init || !traits) {
        fprintf(stderr, "bench_kernels_vs_ggml: %s: no ggml_cpu_init / ggml_get_type_traits_cpu\n", argv[1]);
        return 1;
    }
    cpu_init(); /* ggml's f16 tables */
    const char *list = argc > 2 ? argv[2] : "mxfp4,q5_0,q8_0,q4_k,q6_k";
    const int reps = argc > 3 ? atoi(argv[3]) : 15;
    if (reps < 1) {
        fprintf(stderr, "bench_kernels_vs_ggml: REPS must be a positive integer, got '%s'\n", argv[3]);
        return 2;
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    printf("# ps per multiply-add, one thread, one input, best of %d alternating passes\n", reps);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        uint32_t t = 0;
        const char *name = NULL;
        for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
            if (!strcmp(tok, TYPES[i].name)) t = TYPES[i].type, name = TYPES[i].name;
        if (!name) {
            fprintf(stderr, "bench_kernels_vs_ggml: TYPES: unknown type '%s'\n", tok);
            return 2;
        }
        const struct ggml_type_traits_cpu *g = traits((int)t);
        if (!g || !g->vec_dot || !fmoe_quant_act_supported(t)) {
            fprintf(stderr, "bench_kernels_vs_ggml: %s: no vec_dot in ggml or no 8-bit dot in fmoe\n", name);
            return 1;
        }
        const struct ggml_type_traits_cpu *gin = traits(g->vec_dot_type);
        struct ggml_type_traits_cpu gt = *g;
        gt.from_float = gin ? gin->from_float : NULL;
        if (!gt.from_float) {
            fprintf(stderr, "bench_kernels_vs_ggml: %s: no quantiser for ggml's input type %d\n", name, g->vec_dot_type);
            return 1;
        }
        /* L2-resident (~0.25-1 MB) and streamed (~50-150 MB) */
        if (bench_type(name, t, &gt, 128, 4096, reps * 20) || bench_type(name, t, &gt, 16384, 4096, reps)) {
            fprintf(stderr, "bench_kernels_vs_ggml: out of memory\n");
            return 1;
        }
    }
    return 0;
}
