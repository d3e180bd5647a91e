/*
 * bench_tier_read.c - the file tier's read depth (lib/preader.h, --read-depth) on this
 * machine's disk. Not a test.
 *
 *     bench_tier_read FILE [MiB_PER_RUN] [ROUNDS]
 *
 * FILE: a large file (GBs, written with real data: unwritten extents read back without
 * touching the disk), read with O_DIRECT. For each expert size S (0.7 MiB: a Qwen3-30B-A3B
 * expert's --copy-chunks 4 piece; 2.5 MiB; 20 MiB) and each depth D (1, 2, 4, 8), it reads
 * N = MiB_PER_RUN / S experts (default 512 MiB, at least 16) at random 4096-aligned
 * offsets, one after another, each read split and kept D requests deep exactly as the tier
 * reads a piece (one extent: a piece inside one matrix). ROUNDS (default 3) passes over
 * all sizes and depths, interleaved so that a shared virtual disk's drift slows every
 * depth alike, each at offsets of its own (no read repeats one the host may have cached);
 * the median of the rounds. The page cache is dropped once first (sync; echo 3 >
 * /proc/sys/vm/drop_caches, when root; O_DIRECT bypasses it anyway). Prints a table:
 * size, depth, GiB/s, ratio to depth 1.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "monotonic.h"
#include "preader.h"

enum { ALIGN = 4096, NSIZE = 3, NDEPTH = 4, MAXROUND = 15 };

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* GiB/s of n reads of `size` bytes at random offsets of a file of `file` bytes. */
static double run(fmoe__preader *p, int fd, int64_t file, int64_t size, int32_t n, void *buf) {
    const int64_t len = (size + ALIGN - 1) / ALIGN * ALIGN;
    const double t0 = fmoe__now_s();
    for (int32_t i = 0; i < n; i++) {
        const int64_t at = (int64_t)(next_rand() % (uint64_t)((file - len) / ALIGN)) * ALIGN;
        fmoe__pread_extent x = {.fd = fd, .offset = at, .bytes = len, .dst = buf};
        if (fmoe__preader_read(p, &x, 1, ALIGN) != 0) {
            fprintf(stderr, "bench_tier_read: read of %lld at %lld: %s\n", (long long)len,
                    (long long)at, x.err ? strerror(x.err) : "end of file");
            exit(1);
        }
    }
    return (double)len * n / (fmoe__now_s() - t0) / (double)(1 << 30);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_tier_read FILE [MiB_PER_RUN] [ROUNDS]\n");
        return 2;
    }
    const double per_run = argc > 2 ? atof(argv[2]) : 512;
    int rounds = argc > 3 ? atoi(argv[3]) : 3;
    rounds = rounds < 1 ? 1 : rounds > MAXROUND ? MAXROUND : rounds;
    const int64_t sizes[NSIZE] = {(int64_t)(0.7 * (1 << 20)), (int64_t)(2.5 * (1 << 20)),
                                  20 << 20};
    const int32_t depths[NDEPTH] = {1, 2, 4, 8};
    const int fd = open(argv[1], O_RDONLY | O_DIRECT | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror(argv[1]);
        return 1;
    }
    if (st.st_size < (int64_t)64 << 20) {
        fprintf(stderr, "bench_tier_read: %s: %lld bytes, want GBs\n", argv[1],
                (long long)st.st_size);
        return 1;
    }
    sync();
    FILE *dc = fopen("/proc/sys/vm/drop_caches", "w");
    const int dropped = dc && fputs("3\n", dc) >= 0 && fclose(dc) == 0;
    if (dc && !dropped) dc = NULL;
    fmoe__preader *p[NDEPTH];
    for (int d = 0; d < NDEPTH; d++)
        if (fmoe__preader_open(&p[d], depths[d]) < 0) {
            fprintf(stderr, "bench_tier_read: %s\n", fmoe_error_detail());
            return 1;
        }
    void *buf = aligned_alloc(ALIGN, (size_t)(sizes[NSIZE - 1] + ALIGN));
    double g[NSIZE][NDEPTH][MAXROUND];
    for (int r = 0; r < rounds; r++)
        for (int s = 0; s < NSIZE; s++) {
            int32_t n = (int32_t)(per_run * (1 << 20) / (double)sizes[s]);
            n = n < 16 ? 16 : n;
            for (int d = 0; d < NDEPTH; d++)
                g[s][d][r] = run(p[d], fd, (int64_t)st.st_size, sizes[s], n, buf);
        }
    printf("# %s: %.1f GiB, O_DIRECT, page cache %s, %d rounds (median), %.0f MiB per run\n",
           argv[1], (double)st.st_size / (1 << 30), dropped ? "dropped" : "not dropped (not root)",
           rounds, per_run);
    printf("%-9s %5s %8s %7s\n", "size_MiB", "depth", "GiB/s", "ratio");
    for (int s = 0; s < NSIZE; s++) {
        double med[NDEPTH];
        for (int d = 0; d < NDEPTH; d++) {
            qsort(g[s][d], (size_t)rounds, sizeof(double), cmp_double);
            med[d] = g[s][d][rounds / 2];
        }
        for (int d = 0; d < NDEPTH; d++)
            printf("%-9.1f %5d %8.3f %7.2f\n", (double)sizes[s] / (1 << 20), depths[d], med[d],
                   med[d] / med[0]);
    }
    for (int d = 0; d < NDEPTH; d++) fmoe__preader_close(p[d]);
    free(buf);
    close(fd);
    return 0;
}
