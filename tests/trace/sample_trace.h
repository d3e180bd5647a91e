/*
 * sample_trace.h - a small deterministic trace for the trace tests and write_sample.
 *
 * Every value is a closed-form function of (request, global token g, layer l, ...), chosen
 * to be exact in binary16 as well as float32, so tests and tests/python/test_trace_h5py.py
 * can recompute them independently and compare exactly:
 *
 *   L = 3, J = 8, K = 2, semantic_dim = 4, speculative_depth = 2
 *   requests r = 0..2: id = 100 + 7r, arrival_s = 0.5r, prompt = {3,1,4}, output = {2,3,0}
 *   token_id[g]          = g % 5 == 4 ? -1 : 1000 + 3g
 *   phase[g]             = prefill for a request's first `prompt` tokens, then decode
 *   experts[g][l][k]     = (g + 3l + 5k) % 8
 *   probs[g][l][j]       = ((g + 2l + 3j) % 8) / 16
 *   semantic[g][c]       = (g - 2c) / 4
 *   speculative[g][l][s][j] = ((g + l + 2s + j) % 4) / 8
 */
#ifndef FMOE_TESTS_SAMPLE_TRACE_H
#define FMOE_TESTS_SAMPLE_TRACE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/trace.h"

enum { SAMPLE_L = 3, SAMPLE_J = 8, SAMPLE_K = 2, SAMPLE_H = 4, SAMPLE_S = 2, SAMPLE_R = 3 };
static const int32_t sample_prompt[SAMPLE_R] = {3, 1, 4};
static const int32_t sample_output[SAMPLE_R] = {2, 3, 0};
#define SAMPLE_T 13
#define SAMPLE_CONFIG_JSON "{\"model_type\": \"sample\", \"note\": \"na\xc3\xafve \xe2\x9c\x93\"}"
#define SAMPLE_EXPERT_BYTES 5000000000LL /* past 2^32: exercises the int64 attribute */

static inline int32_t sample_token_id(int64_t g) {
    return g % 5 == 4 ? -1 : (int32_t)(1000 + 3 * g);
}
static inline uint16_t sample_expert(int64_t g, int l, int k) {
    return (uint16_t)((g + 3 * l + 5 * k) % SAMPLE_J);
}
static inline float sample_prob(int64_t g, int l, int j) {
    return (float)((g + 2 * l + 3 * j) % 8) / 16.0f;
}
static inline float sample_semantic(int64_t g, int c) { return (float)(g - 2 * c) / 4.0f; }
static inline float sample_spec(int64_t g, int l, int s, int j) {
    return (float)((g + l + 2 * s + j) % 4) / 8.0f;
}

static inline fmoe_trace_header sample_header(int probs_half) {
    fmoe_trace_header h;
    memset(&h, 0, sizeof h);
    snprintf(h.model_name, sizeof h.model_name, "sample-moe \xce\xbc"); /* "sample-moe μ" */
    snprintf(h.model_fingerprint, sizeof h.model_fingerprint, "%s",
             "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    h.num_layers = SAMPLE_L;
    h.num_experts = SAMPLE_J;
    h.top_k = SAMPLE_K;
    h.hidden_size = 16;
    h.shared_experts = 1;
    h.expert_bytes = SAMPLE_EXPERT_BYTES;
    snprintf(h.dtype, sizeof h.dtype, "bf16");
    snprintf(h.dataset, sizeof h.dataset, "sample");
    snprintf(h.created, sizeof h.created, "2024-01-02T03:04:05Z");
    snprintf(h.recorded_on, sizeof h.recorded_on, "test:sample");
    h.probs_kind = FMOE_PROBS_FULL;
    h.probs_half = probs_half;
    h.semantic_dim = SAMPLE_H;
    snprintf(h.semantic_kind, sizeof h.semantic_kind, "projection");
    h.speculative_depth = SAMPLE_S;
    h.config_json = SAMPLE_CONFIG_JSON;
    snprintf(h.activations, sizeof h.activations, "q8");
    return h;
}

/* Owned arrays of one sample request; sample_request_free releases them. */
typedef struct sample_request {
    fmoe_trace_request req;
    int32_t *token_id;
    uint8_t *phase;
    uint16_t *experts;
    float *probs, *semantic, *speculative;
} sample_request;

static inline int64_t sample_first_token(int r) {
    int64_t g = 0;
    for (int i = 0; i < r; i++) g += sample_prompt[i] + sample_output[i];
    return g;
}

static inline int sample_request_make(sample_request *s, int r) {
    memset(s, 0, sizeof *s);
    const int64_t g0 = sample_first_token(r);
    const int T = sample_prompt[r] + sample_output[r];
    const size_t n = T > 0 ? (size_t)T : 1;
    s->token_id = calloc(n, sizeof *s->token_id);
    s->phase = calloc(n, 1);
    s->experts = calloc(n * SAMPLE_L * SAMPLE_K, sizeof *s->experts);
    s->probs = calloc(n * SAMPLE_L * SAMPLE_J, sizeof *s->probs);
    s->semantic = calloc(n * SAMPLE_H, sizeof *s->semantic);
    s->speculative = calloc(n * SAMPLE_L * SAMPLE_S * SAMPLE_J, sizeof *s->speculative);
    if (!s->token_id || !s->phase || !s->experts || !s->probs || !s->semantic || !s->speculative)
        return -1;
    for (int t = 0; t < T; t++) {
        const int64_t g = g0 + t;
        s->token_id[t] = sample_token_id(g);
        s->phase[t] = t < sample_prompt[r] ? FMOE_PHASE_PREFILL : FMOE_PHASE_DECODE;
        for (int l = 0; l < SAMPLE_L; l++) {
            for (int k = 0; k < SAMPLE_K; k++)
                s->experts[(t * SAMPLE_L + l) * SAMPLE_K + k] = sample_expert(g, l, k);
            for (int j = 0; j < SAMPLE_J; j++)
                s->probs[(t * SAMPLE_L + l) * SAMPLE_J + j] = sample_prob(g, l, j);
            for (int sd = 0; sd < SAMPLE_S; sd++)
                for (int j = 0; j < SAMPLE_J; j++)
                    s->speculative[((t * SAMPLE_L + l) * SAMPLE_S + sd) * SAMPLE_J + j] =
                        sample_spec(g, l, sd, j);
        }
        for (int c = 0; c < SAMPLE_H; c++) s->semantic[t * SAMPLE_H + c] = sample_semantic(g, c);
    }
    s->req = (fmoe_trace_request){
        .id = 100 + 7 * r,
        .arrival_s = 0.5 * r,
        .prompt_tokens = sample_prompt[r],
        .output_tokens = sample_output[r],
        .token_id = s->token_id,
        .phase = s->phase,
        .experts = s->experts,
        .probs = s->probs,
        .semantic = s->semantic,
        .speculative = s->speculative,
    };
    return 0;
}

static inline void sample_request_free(sample_request *s) {
    free(s->token_id);
    free(s->phase);
    free(s->experts);
    free(s->probs);
    free(s->semantic);
    free(s->speculative);
    memset(s, 0, sizeof *s);
}

/* Appends requests [0, count) of the sample. @return 0 or the writer's error. */
static inline int sample_append(fmoe_trace_writer *w, int count) {
    for (int r = 0; r < count; r++) {
        sample_request s;
        if (sample_request_make(&s, r) < 0) {
            sample_request_free(&s);
            return -2;
        }
        int rc = fmoe_trace_writer_append_request(w, &s.req);
        sample_request_free(&s);
        if (rc < 0) return rc;
    }
    return 0;
}

/* Writes the whole sample to `path`. */
static inline int sample_write(const char *path, fmoe_compression c, int probs_half,
                               int64_t chunk_tokens) {
    fmoe_trace_header h = sample_header(probs_half);
    fmoe_trace_write_options o = {.compression = c, .chunk_tokens = chunk_tokens};
    fmoe_trace_writer *w = NULL;
    int rc = fmoe_trace_writer_open(&w, path, &h, &o);
    if (rc < 0) return rc;
    rc = sample_append(w, SAMPLE_R);
    if (rc < 0) {
        fmoe_trace_writer_abort(w);
        return rc;
    }
    return fmoe_trace_writer_close(w);
}

/* Checks that reader `r` holds the first `nreq` requests of the sample with float16 gates
 * iff `half` (fmoe_version is not compared: files rewritten by other tools keep whatever
 * they copied). @return NULL when everything matches, else a description of the first
 * difference in buf[cap]. */
static inline const char *sample_verify(fmoe_trace_reader *r, int nreq, int half, char *buf,
                                        size_t cap) {
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    const fmoe_trace_header w = sample_header(half);
#define SV_FAIL(...) return (snprintf(buf, cap, __VA_ARGS__), buf)
#define SV_STR(f)                                                                                  \
    if (strcmp(h->f, w.f) != 0) SV_FAIL("header." #f " = '%.80s', expected '%.80s'", h->f, w.f)
#define SV_INT(f)                                                                                  \
    if ((long long)h->f != (long long)w.f)                                                         \
    SV_FAIL("header." #f " = %lld, expected %lld", (long long)h->f, (long long)w.f)
    SV_STR(model_name);
    SV_STR(model_fingerprint);
    SV_STR(dtype);
    SV_STR(dataset);
    SV_STR(created);
    SV_STR(recorded_on);
    SV_STR(semantic_kind);
    SV_STR(activations);
    SV_INT(num_layers);
    SV_INT(num_experts);
    SV_INT(top_k);
    SV_INT(hidden_size);
    SV_INT(shared_experts);
    SV_INT(expert_bytes);
    SV_INT(probs_kind);
    SV_INT(probs_half);
    SV_INT(semantic_dim);
    SV_INT(speculative_depth);
    if (!h->config_json || strcmp(h->config_json, SAMPLE_CONFIG_JSON) != 0)
        SV_FAIL("config_json = '%s'", h->config_json ? h->config_json : "(null)");

    const int64_t T = sample_first_token(nreq);
    if (fmoe_trace_reader_num_requests(r) != nreq)
        SV_FAIL("%lld requests, expected %d", (long long)fmoe_trace_reader_num_requests(r), nreq);
    if (fmoe_trace_reader_num_tokens(r) != T)
        SV_FAIL("%lld tokens, expected %lld", (long long)fmoe_trace_reader_num_tokens(r),
                (long long)T);
    const fmoe_trace_request_info *q = fmoe_trace_reader_requests(r);
    for (int i = 0; i < nreq; i++) {
        if (q[i].id != 100 + 7 * i || q[i].arrival_s != 0.5 * i ||
            q[i].prompt_tokens != sample_prompt[i] || q[i].output_tokens != sample_output[i] ||
            q[i].token_begin != sample_first_token(i) ||
            q[i].token_count != sample_prompt[i] + sample_output[i])
            SV_FAIL("request %d differs", i);
    }
    int32_t tok[SAMPLE_T];
    uint8_t phase[SAMPLE_T];
    uint16_t experts[SAMPLE_T * SAMPLE_L * SAMPLE_K];
    float probs[SAMPLE_T * SAMPLE_L * SAMPLE_J], sem[SAMPLE_T * SAMPLE_H];
    float spec[SAMPLE_T * SAMPLE_L * SAMPLE_S * SAMPLE_J];
    fmoe_trace_token_buffers all = {.token_id = tok, .phase = phase, .experts = experts,
                                    .probs = probs, .semantic = sem, .speculative = spec};
    if (fmoe_trace_reader_read_tokens(r, 0, T, &all) < 0) SV_FAIL("read_tokens failed");
    for (int64_t g = 0; g < T; g++) {
        if (tok[g] != sample_token_id(g)) SV_FAIL("token_id[%lld] = %d", (long long)g, tok[g]);
        for (int l = 0; l < SAMPLE_L; l++) {
            for (int k = 0; k < SAMPLE_K; k++)
                if (experts[(g * SAMPLE_L + l) * SAMPLE_K + k] != sample_expert(g, l, k))
                    SV_FAIL("experts[%lld][%d][%d] differs", (long long)g, l, k);
            /* Every sample value is exact in float16: compare exactly. */
            for (int j = 0; j < SAMPLE_J; j++)
                if (probs[(g * SAMPLE_L + l) * SAMPLE_J + j] != sample_prob(g, l, j))
                    SV_FAIL("probs[%lld][%d][%d] differs", (long long)g, l, j);
            for (int sd = 0; sd < SAMPLE_S; sd++)
                for (int j = 0; j < SAMPLE_J; j++)
                    if (spec[((g * SAMPLE_L + l) * SAMPLE_S + sd) * SAMPLE_J + j] !=
                        sample_spec(g, l, sd, j))
                        SV_FAIL("speculative[%lld][%d][%d][%d] differs", (long long)g, l, sd, j);
        }
        for (int c = 0; c < SAMPLE_H; c++)
            if (sem[g * SAMPLE_H + c] != sample_semantic(g, c))
                SV_FAIL("semantic[%lld][%d] differs", (long long)g, c);
    }

    /* Iterations tile the tokens in order, and each one's tokens share its phase. */
    int64_t nit = -1, covered = 0, want_it = 0;
    const fmoe_trace_iteration *it = fmoe_trace_reader_iterations(r, &nit);
    for (int i = 0; i < nreq; i++) want_it += (sample_prompt[i] > 0) + sample_output[i];
    if (nit != want_it)
        SV_FAIL("%lld iterations, expected %lld", (long long)nit, (long long)want_it);
    for (int64_t i = 0; i < nit; i++) {
        if (it[i].token_begin != covered)
            SV_FAIL("iteration %lld starts at %lld", (long long)i, (long long)it[i].token_begin);
        for (int t = 0; t < it[i].num_tokens; t++)
            if (phase[covered + t] != it[i].phase) SV_FAIL("iteration %lld phase", (long long)i);
        covered += it[i].num_tokens;
    }
    if (covered != T) SV_FAIL("iterations cover %lld tokens", (long long)covered);
#undef SV_INT
#undef SV_STR
#undef SV_FAIL
    return NULL;
}

#endif
