/*
 * bench_tokenizer.c - encoding and decoding throughput of a tokenizer on a text file.
 *
 *     bench_tokenizer TOKENIZER(.json|DIR) FILE [REPEAT]
 *
 * Prints the load time, then MB/s of encode (whole file, add_special) and decode, the best
 * of REPEAT runs (default 5). Not a test: numbers depend on the machine.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/error.h"
#include "fmoe/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenizer TOKENIZER FILE [REPEAT]\n");
        return 2;
    }
    int repeat = argc > 3 ? atoi(argv[3]) : 5;
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "%s: read error\n", argv[2]);
        return 1;
    }
    fclose(f);
    double t0 = now();
    fmoe_tokenizer *tok;
    if (fmoe_tokenizer_load(argv[1], &tok) < 0) {
        fprintf(stderr, "%s\n", fmoe_error_detail());
        return 1;
    }
    printf("load          %.3f s\n", now() - t0);
    double best_enc = 1e30, best_dec = 1e30;
    size_t n = 0;
    for (int r = 0; r < repeat; r++) {
        int32_t *ids;
        t0 = now();
        if (fmoe_tokenizer_encode_alloc(tok, text, (size_t)size, 1, &ids, &n) < 0) {
            fprintf(stderr, "%s\n", fmoe_error_detail());
            return 1;
        }
        double t1 = now();
        char *back;
        size_t blen;
        if (fmoe_tokenizer_decode(tok, ids, n, 0, &back, &blen) < 0) return 1;
        double t2 = now();
        if (t1 - t0 < best_enc) best_enc = t1 - t0;
        if (t2 - t1 < best_dec) best_dec = t2 - t1;
        free(back);
        free(ids);
    }
    double mb = (double)size / 1e6;
    printf("text          %.2f MB, %zu tokens (%.2f bytes/token)\n", mb, n, (double)size / (double)n);
    printf("encode        %.3f s  %.1f MB/s  %.2f M tokens/s\n", best_enc, mb / best_enc,
           (double)n / best_enc / 1e6);
    printf("decode        %.3f s  %.1f MB/s\n", best_dec, mb / best_dec);
    fmoe_tokenizer_free(tok);
    free(text);
    return 0;
}
