/*
 * fuzz_trace.c - fuzz target for the HDF5 trace reader (trace/trace_reader.c):
 * the input is the bytes of a trace file, opened through HDF5's in-memory (core)
 * driver by fmoe__trace_reader_open_image (trace_impl.h), so no file is written. When the
 * trace opens, every token is read (ids, phases, experts, and probabilities, semantic and
 * speculative rows when the header has them) and checked: expert ids below J, phases 0 or
 * 1, requests and iterations inside the token range. A failure must carry a detail.
 * Seeds: small traces written by fmoe record / trace import (tests/fuzz/README.md).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fmoe/error.h"
#include "fmoe/trace.h"
#include "trace_impl.h"

#define MAX_CELLS (1 << 22) /* read at most this many floats per batch of tokens */

static void fail(const char *what) {
    fprintf(stderr, "fuzz_trace: %s (%s)\n", what, fmoe_error_detail());
    abort();
}

static void read_all(fmoe_trace_reader *r) {
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    const int64_t T = fmoe_trace_reader_num_tokens(r), L = h->num_layers, J = h->num_experts,
                  K = h->top_k;
    if (L <= 0 || J <= 0 || K <= 0 || K > J || T < 0) fail("accepted a bad header");
    const int64_t R = fmoe_trace_reader_num_requests(r);
    const fmoe_trace_request_info *req = fmoe_trace_reader_requests(r);
    for (int64_t i = 0; i < R; i++)
        if (req[i].token_begin < 0 || req[i].token_count < 0 ||
            req[i].token_begin + req[i].token_count > T)
            fail("request outside the tokens");
    int64_t I = 0;
    const fmoe_trace_iteration *it = fmoe_trace_reader_iterations(r, &I);
    for (int64_t i = 0; i < I; i++)
        if (it[i].request < 0 || it[i].request >= R || it[i].token_begin < 0 ||
            it[i].num_tokens < 0 || it[i].token_begin + it[i].num_tokens > T)
            fail("iteration outside the tokens");
    const int64_t per_token = L * J * (1 + (h->speculative_depth > 0 ? h->speculative_depth : 0)) +
                              h->semantic_dim + L * K;
    int64_t batch = per_token > 0 ? MAX_CELLS / per_token : 0;
    if (batch <= 0) return; /* rows too wide to read here; the open checked the shapes */
    if (batch > 256) batch = 256;
    int32_t *ids = malloc((size_t)batch * sizeof *ids);
    uint8_t *phase = malloc((size_t)batch);
    uint16_t *experts = malloc((size_t)(batch * L * K) * sizeof *experts);
    float *probs = h->probs_kind != FMOE_PROBS_NONE ? malloc((size_t)(batch * L * J) * sizeof(float)) : NULL;
    float *sem = h->semantic_dim > 0 ? malloc((size_t)(batch * h->semantic_dim) * sizeof(float)) : NULL;
    float *spec = h->speculative_depth > 0
                      ? malloc((size_t)(batch * L * h->speculative_depth * J) * sizeof(float))
                      : NULL;
    for (int64_t t0 = 0; ids && phase && experts && t0 < T; t0 += batch) {
        const int64_t n = T - t0 < batch ? T - t0 : batch;
        fmoe_trace_token_buffers b = {.token_id = ids, .phase = phase, .experts = experts,
                                      .probs = probs, .semantic = sem, .speculative = spec};
        fmoe_error_clear();
        int rc = fmoe_trace_reader_read_tokens(r, t0, n, &b);
        if (rc < 0) {
            if (!fmoe_error_detail()[0]) fail("read error without a detail");
            break;
        }
        for (int64_t i = 0; i < n; i++)
            if (phase[i] > 1) fail("phase out of range");
        for (int64_t i = 0; i < n * L * K; i++)
            if (experts[i] >= J) fail("expert id out of range");
    }
    free(ids);
    free(phase);
    free(experts);
    free(probs);
    free(sem);
    free(spec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fmoe_trace_reader *r = NULL;
    fmoe_error_clear();
    int rc = fmoe__trace_reader_open_image(&r, data, size, "fuzz.h5");
    if (rc < 0) {
        if (!fmoe_error_detail()[0]) fail("open error without a detail");
        return 0;
    }
    read_all(r);
    fmoe_trace_reader_close(r);
    return 0;
}
