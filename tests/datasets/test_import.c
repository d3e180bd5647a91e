/*
 * test_import.c - routing-trace importers: JSON Lines (docs/design.md §4.1) and dense CSV,
 * read back with the trace reader and compared record by record; every bad input returns
 * its code, names the line, and leaves no output file (nor "<out>.partial") behind.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fmoe/datasets.h"
#include "fmoe/error.h"
#include "fmoe/geometry.h"
#include "fmoe/trace.h"
#include "harness.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    static char buf[8][512];
    static int i;
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/fmoe-test-import-XXXXXX");
        if (!mkdtemp(tmpdir)) abort();
    }
    char *b = buf[i++ & 7];
    snprintf(b, sizeof buf[0], "%s/%s", tmpdir, name);
    return b;
}

static const char *write_tmp(const char *name, const char *text) {
    const char *p = tmp_path(name);
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    fputs(text, f);
    fclose(f);
    return p;
}

static const char *fixture(const char *name) {
    static char buf[4][1024];
    static int i;
    char *b = buf[i++ & 3];
    snprintf(b, sizeof buf[0], "%s/datasets/%s", harness_fixtures(), name);
    return b;
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

static int partial_exists(const char *out) {
    char p[700];
    snprintf(p, sizeof p, "%.600s.partial", out);
    return exists(p);
}

static fmoe_model_geometry geo;

static fmoe_import_options options(int32_t L, int32_t J, int32_t K) {
    fmoe_geometry_generic(L, J, K, 0, &geo);
    fmoe_import_options o;
    memset(&o, 0, sizeof o);
    o.geometry = &geo;
    o.write.compression = FMOE_COMPRESSION_NONE;
    return o;
}

/* ------------------------------------------------------------ JSON Lines */

/* The expected content of tests/fixtures/datasets/routing_small.jsonl, in trace order:
 * requests by first appearance (12, 7, 3), tokens by position, layers 0..1. */
typedef struct expect_token {
    int32_t token_id;
    uint8_t phase;
    uint16_t experts[2][2]; /* [layer][k] */
    double probs[2][2];     /* [layer][k], the JSON decimals */
} expect_token;

static const expect_token SMALL[8] = {
    /* request 12 */
    {101, FMOE_PHASE_PREFILL, {{3, 1}, {0, 6}}, {{0.625, 0.25}, {0.5, 0.375}}},
    {102, FMOE_PHASE_PREFILL, {{7, 2}, {4, 5}}, {{0.75, 0.125}, {0.5, 0.5}}},
    /* request 7 */
    {200, FMOE_PHASE_PREFILL, {{5, 1}, {2, 0}}, {{0.71, 0.29}, {0.6, 0.3}}},
    {-1, FMOE_PHASE_PREFILL, {{1, 5}, {6, 7}}, {{0.55, 0.45}, {0.8, 0.1}}},
    {-1, FMOE_PHASE_DECODE, {{4, 3}, {3, 4}}, {{0.9, 0.05}, {0.52, 0.48}}},
    /* request 3: token 1 has no "phase" key (decode by default) */
    {300, FMOE_PHASE_PREFILL, {{0, 1}, {1, 2}}, {{0.4, 0.35}, {0.45, 0.3}}},
    {-1, FMOE_PHASE_DECODE, {{2, 3}, {7, 6}}, {{0.6, 0.2}, {0.7, 0.2}}},
    {302, FMOE_PHASE_DECODE, {{5, 6}, {0, 5}}, {{0.33, 0.32}, {0.51, 0.27}}},
};

TEST(jsonl_shuffled_roundtrip) {
    fmoe_import_options o = options(2, 8, 2);
    o.model_name = "hand-made";
    const char *out = tmp_path("small.h5");
    fmoe_import_report rep;
    ASSERT_OK(fmoe_import_jsonl(fixture("routing_small.jsonl"), &o, out, &rep));
    ASSERT_EQ(rep.lines, 16);
    ASSERT_EQ(rep.requests, 3);
    ASSERT_EQ(rep.tokens, 8);
    ASSERT_EQ(rep.dropped_tokens, 0);
    ASSERT_EQ(rep.probs_kind, FMOE_PROBS_TOPK);
    ASSERT_TRUE(!partial_exists(out));

    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, out));
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    ASSERT_EQ(h->num_layers, 2);
    ASSERT_EQ(h->num_experts, 8);
    ASSERT_EQ(h->top_k, 2);
    ASSERT_EQ(h->probs_kind, FMOE_PROBS_TOPK);
    ASSERT_STR_EQ(h->recorded_on, "import:jsonl");
    ASSERT_STR_EQ(h->dataset, "routing_small.jsonl");
    ASSERT_STR_EQ(h->model_name, "hand-made");
    ASSERT_STR_EQ(h->model_fingerprint, "");

    ASSERT_EQ(fmoe_trace_reader_num_requests(r), 3);
    ASSERT_EQ(fmoe_trace_reader_num_tokens(r), 8);
    const fmoe_trace_request_info *q = fmoe_trace_reader_requests(r);
    static const int64_t ids[3] = {12, 7, 3};
    static const int32_t prompt[3] = {2, 2, 1}, output[3] = {0, 1, 2};
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(q[i].id, ids[i]);
        ASSERT_EQ(q[i].prompt_tokens, prompt[i]);
        ASSERT_EQ(q[i].output_tokens, output[i]);
        ASSERT_EQ(q[i].token_count, prompt[i] + output[i]);
    }
    int64_t nit = 0;
    const fmoe_trace_iteration *it = fmoe_trace_reader_iterations(r, &nit);
    ASSERT_EQ(nit, 6); /* 12: prefill; 7: prefill, decode; 3: prefill, decode, decode */
    ASSERT_EQ(it[0].num_tokens, 2);
    ASSERT_EQ(it[1].phase, FMOE_PHASE_PREFILL);
    ASSERT_EQ(it[2].phase, FMOE_PHASE_DECODE);
    ASSERT_EQ(it[2].request, 1);

    int32_t token_id[8];
    uint8_t phase[8];
    uint16_t experts[8 * 2 * 2];
    float probs[8 * 2 * 8];
    fmoe_trace_token_buffers buf = {.token_id = token_id, .phase = phase, .experts = experts,
                                    .probs = probs};
    ASSERT_OK(fmoe_trace_reader_read_tokens(r, 0, 8, &buf));
    for (int t = 0; t < 8; t++) {
        const expect_token *e = &SMALL[t];
        ASSERT_EQ(token_id[t], e->token_id);
        ASSERT_EQ(phase[t], e->phase);
        for (int l = 0; l < 2; l++) {
            const float *row = probs + (t * 2 + l) * 8;
            int nonzero = 0;
            for (int j = 0; j < 8; j++) nonzero += row[j] != 0.0f;
            ASSERT_EQ(nonzero, 2);
            for (int k = 0; k < 2; k++) {
                ASSERT_EQ(experts[(t * 2 + l) * 2 + k], e->experts[l][k]);
                ASSERT_TRUE(row[e->experts[l][k]] == (float)e->probs[l][k]);
            }
        }
    }
    /* Spelled out: request 7's decode token (trace token 4), layer 1 = experts [3, 4]
     * with 0.52 and 0.48; layer 0 = [4, 3] with 0.9 and 0.05. */
    ASSERT_EQ(experts[(4 * 2 + 1) * 2 + 0], 3);
    ASSERT_EQ(experts[(4 * 2 + 1) * 2 + 1], 4);
    ASSERT_TRUE(probs[(4 * 2 + 1) * 8 + 3] == (float)0.52);
    ASSERT_TRUE(probs[(4 * 2 + 0) * 8 + 3] == (float)0.05);
    ASSERT_TRUE(probs[(4 * 2 + 0) * 8 + 0] == 0.0f);
    fmoe_trace_reader_close(r);
}

/* Two complete lines every bad case starts from (L = 2, J = 8, K = 2). */
#define GOOD2                                                                                 \
    "{\"request\": 1, \"token\": 0, \"phase\": \"prefill\", \"layer\": 0, \"experts\": [1, 2], " \
    "\"probs\": [0.5, 0.25]}\n"                                                               \
    "{\"request\": 1, \"token\": 0, \"phase\": \"prefill\", \"layer\": 1, \"experts\": [3, 4], " \
    "\"probs\": [0.5, 0.25]}\n"

typedef struct bad_import {
    const char *name;
    const char *text;
    int code;
    const char *where;
} bad_import;

TEST(jsonl_bad_inputs) {
    static const bad_import cases[] = {
        {"expert_range.jsonl",
         GOOD2 "{\"request\": 1, \"token\": 1, \"layer\": 0, \"experts\": [9, 1], \"probs\": [0.5, 0.25]}\n",
         FMOE_ERANGE, "expert_range.jsonl:3: expert 9 out of range (J = 8)"},
        {"expert_negative.jsonl",
         GOOD2 "{\"request\": 1, \"token\": 1, \"layer\": 0, \"experts\": [-1, 1], \"probs\": [0.5, 0.25]}\n",
         FMOE_ERANGE, "expert_negative.jsonl:3: expert -1 out of range (J = 8)"},
        {"expert_twice.jsonl",
         GOOD2 "{\"request\": 1, \"token\": 1, \"layer\": 0, \"experts\": [2, 2], \"probs\": [0.5, 0.25]}\n",
         FMOE_EFORMAT, "expert_twice.jsonl:3: expert 2 chosen twice"},
        {"expert_float.jsonl",
         GOOD2 "{\"request\": 1, \"token\": 1, \"layer\": 0, \"experts\": [2, 1.5], \"probs\": [0.5, 0.25]}\n",
         FMOE_EFORMAT, "expert_float.jsonl:3: experts[1] is not an integer"},
        {"experts_len.jsonl",
         GOOD2 "{\"request\": 1, \"token\": 1, \"layer\": 0, \"experts\": [1], \"probs\": [0.5]}\n",
         FMOE_EFORMAT, "experts_len.jsonl:3: \"experts\" has 1 values, expected K = 2"},
        {"probs_len.jsonl",
         GOOD2 "{\"request\": 1, \"token\": 1, \"layer\": 0, \"experts\": [1, 2], \"probs\": [0.5, 0.2, 0.1]}\n",
         FMOE_EFORMAT, "probs_len.jsonl:3: \"probs\" has 3 values, expected K = 2 or J = 8"},
        {"probs_negative.jsonl",
         GOOD2 "{\"request\": 1, \"token\": 1, \"layer\": 0, \"experts\": [1, 2], \"probs\": [0.5, -0.25]}\n",
         FMOE_ERANGE, "probs_negative.jsonl:3: probs[1] = -0.25"},
        {"mixed_kinds.jsonl",
         GOOD2 "{\"request\": 1, \"token\": 1, \"layer\": 0, \"experts\": [1, 2]}\n",
         FMOE_EMISMATCH, "mixed_kinds.jsonl:3: no probs, but line 1 has K = 2 probs"},
        {"mixed_full.jsonl",
         GOOD2 "\n{\"request\": 1, \"token\": 1, \"layer\": 0, \"experts\": [1, 2], "
               "\"probs\": [0, 0.5, 0.25, 0, 0, 0, 0, 0.25]}\n",
         FMOE_EMISMATCH, "mixed_full.jsonl:4: J = 8 probs, but line 1 has K = 2 probs"},
        {"malformed.jsonl", GOOD2 "{\"request\": 1, \"token\": 1,\n", FMOE_EFORMAT,
         "malformed.jsonl:3: malformed JSON"},
        {"not_object.jsonl", GOOD2 "[1, 2]\n", FMOE_EFORMAT,
         "not_object.jsonl:3: expected a JSON object"},
        {"duplicate.jsonl",
         GOOD2 "{\"request\": 1, \"token\": 0, \"phase\": \"prefill\", \"layer\": 0, "
               "\"experts\": [5, 6], \"probs\": [0.5, 0.25]}\n",
         FMOE_EFORMAT, "duplicate.jsonl:3: request 1 token 0 layer 0 repeats line 1"},
        {"missing_layer.jsonl",
         GOOD2 "{\"request\": \"r-9\", \"token\": 4, \"layer\": 1, \"experts\": [1, 2], \"probs\": [0.5, 0.25]}\n",
         FMOE_EINCOMPLETE, "request \"r-9\" token 4 (first at line 3) lacks 1 of 2 layers (0)"},
        {"layer_range.jsonl",
         GOOD2 "{\"request\": 1, \"token\": 1, \"layer\": 2, \"experts\": [1, 2], \"probs\": [0.5, 0.25]}\n",
         FMOE_ERANGE, "layer_range.jsonl:3: layer 2 out of range (L = 2)"},
        {"prefill_after_decode.jsonl",
         GOOD2
         "{\"request\": 1, \"token\": 1, \"layer\": 0, \"experts\": [1, 2], \"probs\": [0.5, 0.25]}\n"
         "{\"request\": 1, \"token\": 1, \"layer\": 1, \"experts\": [1, 2], \"probs\": [0.5, 0.25]}\n"
         "{\"request\": 1, \"token\": 2, \"phase\": \"prefill\", \"layer\": 1, \"experts\": [1, 2], \"probs\": [0.5, 0.25]}\n"
         "{\"request\": 1, \"token\": 2, \"phase\": \"prefill\", \"layer\": 0, \"experts\": [1, 2], \"probs\": [0.5, 0.25]}\n",
         FMOE_EFORMAT,
         "prefill_after_decode.jsonl:5: request 1 prefill token 2 comes after decode token 1"},
        {"phase_mismatch.jsonl",
         GOOD2
         "{\"request\": 1, \"token\": 1, \"phase\": \"prefill\", \"layer\": 0, \"experts\": [1, 2], \"probs\": [0.5, 0.25]}\n"
         "{\"request\": 1, \"token\": 1, \"phase\": \"decode\", \"layer\": 1, \"experts\": [1, 2], \"probs\": [0.5, 0.25]}\n",
         FMOE_EMISMATCH,
         "phase_mismatch.jsonl:4: request 1 token 1 is \"decode\" here but \"prefill\" at line 3"},
        {"token_id_mismatch.jsonl",
         GOOD2
         "{\"request\": 1, \"token\": 1, \"token_id\": 5, \"layer\": 0, \"experts\": [1, 2], \"probs\": [0.5, 0.25]}\n"
         "{\"request\": 1, \"token\": 1, \"token_id\": 6, \"layer\": 1, \"experts\": [1, 2], \"probs\": [0.5, 0.25]}\n",
         FMOE_EMISMATCH, "token_id_mismatch.jsonl:4: request 1 token 1 has token_id 6 here but 5"},
        {"no_request.jsonl", GOOD2 "{\"token\": 1, \"layer\": 0, \"experts\": [1, 2]}\n",
         FMOE_EFORMAT, "no_request.jsonl:3: no \"request\""},
        {"request_type.jsonl",
         GOOD2 "{\"request\": [1], \"token\": 1, \"layer\": 0, \"experts\": [1, 2]}\n",
         FMOE_EFORMAT, "request_type.jsonl:3: \"request\" must be an integer or a string"},
        {"no_token.jsonl", GOOD2 "{\"request\": 1, \"layer\": 0, \"experts\": [1, 2]}\n",
         FMOE_EFORMAT, "no_token.jsonl:3: no \"token\""},
        {"negative_token.jsonl",
         GOOD2 "{\"request\": 1, \"token\": -3, \"layer\": 0, \"experts\": [1, 2]}\n",
         FMOE_ERANGE, "negative_token.jsonl:3: \"token\" out of range"},
        {"float_token.jsonl",
         GOOD2 "{\"request\": 1, \"token\": 0.5, \"layer\": 0, \"experts\": [1, 2]}\n",
         FMOE_EFORMAT, "float_token.jsonl:3: \"token\" must be a non-negative integer"},
        {"bad_phase.jsonl",
         GOOD2 "{\"request\": 1, \"token\": 1, \"phase\": \"generate\", \"layer\": 0, \"experts\": [1, 2]}\n",
         FMOE_EFORMAT, "bad_phase.jsonl:3: \"phase\" must be \"prefill\" or \"decode\""},
        {"no_experts.jsonl", GOOD2 "{\"request\": 1, \"token\": 1, \"layer\": 0}\n", FMOE_EFORMAT,
         "no_experts.jsonl:3: no \"experts\""},
        {"empty.jsonl", "\n\n  \n", FMOE_EFORMAT, "empty.jsonl: no routing records"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const bad_import *c = &cases[i];
        const char *in = write_tmp(c->name, c->text);
        char out[600];
        snprintf(out, sizeof out, "%s.h5", in);
        fmoe_import_options o = options(2, 8, 2);
        fmoe_import_report rep;
        fmoe_error_clear();
        int rc = fmoe_import_jsonl(in, &o, out, &rep);
        if (rc != c->code || !strstr(fmoe_error_detail(), c->where))
            fprintf(stderr, "  case %s: rc %d: %s\n", c->name, rc, fmoe_error_detail());
        ASSERT_EQ(rc, c->code);
        ASSERT_CONTAINS(fmoe_error_detail(), c->where);
        ASSERT_TRUE(strchr(fmoe_error_detail(), '\n') == NULL);
        ASSERT_TRUE(!exists(out));
        ASSERT_TRUE(!partial_exists(out));
    }
}

TEST(jsonl_drop_incomplete) {
    const char *in = write_tmp(
        "incomplete.jsonl",
        GOOD2
        /* token 1 lacks layer 1 */
        "{\"request\": 1, \"token\": 1, \"layer\": 0, \"experts\": [1, 2], \"probs\": [0.5, 0.25]}\n"
        "{\"request\": 1, \"token\": 2, \"layer\": 1, \"experts\": [6, 7], \"probs\": [0.5, 0.25]}\n"
        "{\"request\": 1, \"token\": 2, \"layer\": 0, \"experts\": [5, 4], \"probs\": [0.5, 0.25]}\n"
        /* request 2's only token lacks layer 0: the request disappears */
        "{\"request\": 2, \"token\": 0, \"layer\": 1, \"experts\": [1, 2], \"probs\": [0.5, 0.25]}\n"
        "{\"request\": 3, \"token\": 0, \"layer\": 0, \"experts\": [1, 2], \"probs\": [0.5, 0.25]}\n"
        "{\"request\": 3, \"token\": 0, \"layer\": 1, \"experts\": [1, 2], \"probs\": [0.5, 0.25]}\n");
    const char *out = tmp_path("incomplete.h5");
    fmoe_import_options o = options(2, 8, 2);
    fmoe_import_report rep;
    ASSERT_EQ(fmoe_import_jsonl(in, &o, out, &rep), FMOE_EINCOMPLETE);
    ASSERT_CONTAINS(fmoe_error_detail(), "request 1 token 1 (first at line 3) lacks 1 of 2");
    ASSERT_TRUE(!exists(out));

    o.drop_incomplete = 1;
    ASSERT_OK(fmoe_import_jsonl(in, &o, out, &rep));
    ASSERT_EQ(rep.lines, 8);
    ASSERT_EQ(rep.dropped_tokens, 2);
    ASSERT_EQ(rep.tokens, 3);
    ASSERT_EQ(rep.requests, 2);
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, out));
    ASSERT_EQ(fmoe_trace_reader_num_requests(r), 2);
    const fmoe_trace_request_info *q = fmoe_trace_reader_requests(r);
    ASSERT_EQ(q[0].id, 1);
    ASSERT_EQ(q[0].token_count, 2);
    ASSERT_EQ(q[0].prompt_tokens, 1);
    ASSERT_EQ(q[0].output_tokens, 1);
    ASSERT_EQ(q[1].id, 3);
    uint16_t experts[3 * 2 * 2];
    fmoe_trace_token_buffers buf = {.experts = experts};
    ASSERT_OK(fmoe_trace_reader_read_tokens(r, 0, 3, &buf));
    ASSERT_EQ(experts[4], 5); /* token 2, layer 0 */
    ASSERT_EQ(experts[6], 6); /* token 2, layer 1 */
    fmoe_trace_reader_close(r);
}

TEST(jsonl_full_probs_string_ids_meta) {
    const char *in = write_tmp(
        "full.jsonl",
        "{\"type\": \"meta\", \"source\": \"hand-made\", \"layers\": [4, 9]}\n"
        "{\"request\": \"b\", \"token\": 0, \"phase\": \"prefill\", \"layer\": 0, \"experts\": [2, 0], "
        "\"probs\": [0.25, 0.125, 0.5, 0.125]}\n"
        "\n"
        "{\"request\": 5, \"token\": 0, \"layer\": 0, \"experts\": [3, 1], \"probs\": [0, 0.25, 0, 0.75], "
        "\"token_id\": null}\n"
        "{\"request\": \"b\", \"token\": 0, \"phase\": \"prefill\", \"layer\": 1, \"experts\": [1, 3], "
        "\"probs\": [0.0625, 0.5, 0.0625, 0.375], \"extra\": {\"ignored\": true}}\n"
        "{\"request\": 5, \"token\": 0, \"layer\": 1, \"experts\": [0, 2], \"probs\": [1, 0, 0, 0]}\n"
        "{\"request\": \"5\", \"token\": 7, \"layer\": 1, \"experts\": [0, 2], \"probs\": [1, 0, 0, 0]}\n"
        "{\"request\": \"5\", \"token\": 7, \"layer\": 0, \"experts\": [0, 2], \"probs\": [1, 0, 0, 0]}\n");
    const char *out = tmp_path("full.h5");
    fmoe_import_options o = options(2, 4, 2);
    fmoe_import_report rep;
    ASSERT_OK(fmoe_import_jsonl(in, &o, out, &rep));
    ASSERT_EQ(rep.lines, 6); /* the meta line is not a record */
    ASSERT_EQ(rep.requests, 3);
    ASSERT_EQ(rep.probs_kind, FMOE_PROBS_FULL);
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, out));
    ASSERT_EQ(fmoe_trace_reader_header(r)->probs_kind, FMOE_PROBS_FULL);
    const fmoe_trace_request_info *q = fmoe_trace_reader_requests(r);
    /* string ids present: ids are the order of first appearance ("5" != 5) */
    ASSERT_EQ(q[0].id, 0);
    ASSERT_EQ(q[1].id, 1);
    ASSERT_EQ(q[2].id, 2);
    float probs[3 * 2 * 4];
    uint16_t experts[3 * 2 * 2];
    int32_t tid[3];
    fmoe_trace_token_buffers buf = {.token_id = tid, .experts = experts, .probs = probs};
    ASSERT_OK(fmoe_trace_reader_read_tokens(r, 0, 3, &buf));
    static const float want[8] = {0.25f, 0.125f, 0.5f, 0.125f, 0.0625f, 0.5f, 0.0625f, 0.375f};
    for (int i = 0; i < 8; i++) ASSERT_TRUE(probs[i] == want[i]);
    ASSERT_EQ(experts[0], 2);
    ASSERT_EQ(experts[1], 0);
    ASSERT_EQ(experts[4], 3);
    ASSERT_TRUE(probs[8 + 3] == 0.75f);
    ASSERT_EQ(tid[1], -1);
    fmoe_trace_reader_close(r);
}

TEST(jsonl_without_probs) {
    const char *in = write_tmp(
        "none.jsonl",
        "{\"request\": 0, \"token\": 0, \"layer\": 0, \"experts\": [1, 0], \"token_id\": 42}\n"
        "{\"request\": 0, \"token\": 0, \"layer\": 1, \"experts\": [3, 2], \"token_id\": 42}\n");
    const char *out = tmp_path("none.h5");
    fmoe_import_options o = options(2, 4, 2);
    fmoe_import_report rep;
    ASSERT_OK(fmoe_import_jsonl(in, &o, out, &rep));
    ASSERT_EQ(rep.probs_kind, FMOE_PROBS_NONE);
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, out));
    ASSERT_EQ(fmoe_trace_reader_header(r)->probs_kind, FMOE_PROBS_NONE);
    int32_t tid[1];
    uint8_t ph[1];
    uint16_t ex[4];
    fmoe_trace_token_buffers buf = {.token_id = tid, .phase = ph, .experts = ex};
    ASSERT_OK(fmoe_trace_reader_read_tokens(r, 0, 1, &buf));
    ASSERT_EQ(tid[0], 42);
    ASSERT_EQ(ph[0], FMOE_PHASE_DECODE);
    ASSERT_EQ(ex[2], 3);
    fmoe_trace_reader_close(r);
}

TEST(jsonl_model_config_fingerprint) {
    /* The config is stored verbatim and fingerprinted. */
    const char *cfg = "{\"model_type\": \"mixtral\", \"num_local_experts\": 8}";
    char hex[65];
    ASSERT_OK(fmoe_config_fingerprint(cfg, strlen(cfg), hex));
    fmoe_import_options o = options(2, 8, 2);
    o.config_json = cfg;
    const char *out = tmp_path("cfg.h5");
    ASSERT_OK(fmoe_import_jsonl(fixture("routing_small.jsonl"), &o, out, NULL));
    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, out));
    ASSERT_STR_EQ(fmoe_trace_reader_header(r)->model_fingerprint, hex);
    fmoe_trace_reader_close(r);
}

TEST(jsonl_output_dir_missing) {
    fmoe_import_options o = options(2, 8, 2);
    const char *out = "/nonexistent-dir/out.h5";
    ASSERT_TRUE(fmoe_import_jsonl(fixture("routing_small.jsonl"), &o, out, NULL) < 0);
    ASSERT_TRUE(!exists(out));
    ASSERT_EQ(fmoe_import_jsonl("/nonexistent/in.jsonl", &o, tmp_path("x.h5"), NULL), FMOE_EIO);
    ASSERT_CONTAINS(fmoe_error_detail(), "/nonexistent/in.jsonl");
}

TEST(jsonl_bad_geometry) {
    fmoe_import_options o = options(2, 8, 2);
    geo.top_k = 9;
    ASSERT_EQ(fmoe_import_jsonl(fixture("routing_small.jsonl"), &o, tmp_path("g.h5"), NULL),
              FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "top-k 9");
}

/* ------------------------------------------------------------ dense CSV */

TEST(dense_csv_two_layers) {
    const char *files[2] = {fixture("dense/layer00.csv"), fixture("dense/layer01.csv")};
    fmoe_import_options o = options(2, 4, 2);
    const char *out = tmp_path("dense.h5");
    fmoe_import_report rep;
    ASSERT_OK(fmoe_import_dense_csv(files, 2, 2, &o, out, &rep));
    ASSERT_EQ(rep.lines, 10);
    ASSERT_EQ(rep.requests, 3);
    ASSERT_EQ(rep.tokens, 5);
    ASSERT_EQ(rep.probs_kind, FMOE_PROBS_TOPK);

    fmoe_trace_reader *r = NULL;
    ASSERT_OK(fmoe_trace_reader_open(&r, out));
    const fmoe_trace_header *h = fmoe_trace_reader_header(r);
    ASSERT_STR_EQ(h->recorded_on, "import:dense-csv");
    ASSERT_STR_EQ(h->dataset, "dense/layer00.csv..layer01.csv");
    ASSERT_EQ(h->probs_kind, FMOE_PROBS_TOPK);
    const fmoe_trace_request_info *q = fmoe_trace_reader_requests(r);
    ASSERT_EQ(fmoe_trace_reader_num_requests(r), 3);
    ASSERT_EQ(q[0].prompt_tokens, 2);
    ASSERT_EQ(q[1].prompt_tokens, 2);
    ASSERT_EQ(q[2].prompt_tokens, 1);
    ASSERT_EQ(q[2].output_tokens, 0);
    ASSERT_EQ(q[2].id, 2);

    /* Gate order = decreasing probability; row 3 of layer 0 is a tie (0.3, 0.3). */
    static const uint16_t want_experts[5][2][2] = {
        {{0, 2}, {1, 2}}, {{3, 1}, {0, 3}}, {{1, 0}, {3, 2}}, {{1, 2}, {3, 0}}, {{3, 0}, {2, 1}},
    };
    static const float want_probs[5][2][4] = {
        {{0.5f, 0, 0.25f, 0}, {0, 0.5f, 0.25f, 0}},
        {{0, 0.125f, 0, 0.75f}, {0.625f, 0, 0, 0.25f}},
        {{0.0625f, 0.375f, 0, 0}, {0, 0, 0.15f, 0.35f}},
        {{0, 0.3f, 0.3f, 0}, {0.4f, 0, 0, 0.45f}},
        {{0.1f, 0, 0, 0.2f}, {0, 0.2f, 0.6f, 0}},
    };
    uint16_t experts[5 * 2 * 2];
    float probs[5 * 2 * 4];
    uint8_t phase[5];
    int32_t tid[5];
    fmoe_trace_token_buffers buf = {.token_id = tid, .phase = phase, .experts = experts,
                                    .probs = probs};
    ASSERT_OK(fmoe_trace_reader_read_tokens(r, 0, 5, &buf));
    for (int t = 0; t < 5; t++) {
        ASSERT_EQ(phase[t], FMOE_PHASE_PREFILL);
        ASSERT_EQ(tid[t], -1);
        for (int l = 0; l < 2; l++) {
            for (int k = 0; k < 2; k++)
                ASSERT_EQ(experts[(t * 2 + l) * 2 + k], want_experts[t][l][k]);
            for (int j = 0; j < 4; j++)
                ASSERT_TRUE(probs[(t * 2 + l) * 4 + j] == want_probs[t][l][j]);
        }
    }
    fmoe_trace_reader_close(r);

    /* tokens_per_request 0: one request */
    ASSERT_OK(fmoe_import_dense_csv(files, 2, 0, &o, out, &rep));
    ASSERT_EQ(rep.requests, 1);
    ASSERT_OK(fmoe_trace_reader_open(&r, out));
    ASSERT_EQ(fmoe_trace_reader_requests(r)[0].prompt_tokens, 5);
    fmoe_trace_reader_close(r);
}

#define CSV_HEAD "layer_id,token_id,expert_0,expert_1,expert_2,expert_3\n"

TEST(dense_csv_bad_inputs) {
    char good[600]; /* tmp_path's buffers rotate: keep a copy */
    snprintf(good, sizeof good, "%s",
             write_tmp("d_good.csv", CSV_HEAD "0,0,0.5,0,0.25,0\n0,1,0,0.1,0.2,0\n"));
    static const struct {
        const char *name, *text;
        int code;
        const char *where;
    } cases[] = {
        {"d_nonzero.csv", CSV_HEAD "0,0,0.5,0,0.25,0\n0,1,0,0.1,0.2,0.3\n", FMOE_EFORMAT,
         "d_nonzero.csv:3: 3 non-zero probabilities, expected K = 2"},
        {"d_rows.csv", CSV_HEAD "0,0,0.5,0,0.25,0\n", FMOE_EMISMATCH,
         "d_rows.csv: 1 rows, but"},
        {"d_header.csv", "layer_id,token_id,expert_0,expert_1,expert_2\n0,0,0.5,0,0.25\n0,1,0,0.1,0.2\n",
         FMOE_EFORMAT, "d_header.csv:1: 3 expert columns, expected J = 4"},
        {"d_colname.csv", "layer,token_id,expert_0,expert_1,expert_2,expert_3\n", FMOE_EFORMAT,
         "d_colname.csv:1: column 1 is 'layer', expected 'layer_id'"},
        {"d_short.csv", CSV_HEAD "0,0,0.5,0,0.25,0\n0,1,0,0.1,0.2\n", FMOE_EFORMAT,
         "d_short.csv:3: expected 4 expert columns"},
        {"d_number.csv", CSV_HEAD "0,0,0.5,0,0.25,0\n0,1,0,x,0.2,0.1\n", FMOE_EFORMAT,
         "d_number.csv:3: expert_1 = 'x' is not a number"},
        {"d_negative.csv", CSV_HEAD "0,0,0.5,0,0.25,0\n0,1,0,-0.1,0.2,0\n", FMOE_ERANGE,
         "d_negative.csv:3: expert_1 = -0.1"},
        {"d_align.csv", CSV_HEAD "0,0,0.5,0,0.25,0\n0,7,0,0.1,0.2,0\n", FMOE_EMISMATCH,
         "d_align.csv:3: token_id 7, but row 2 of"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *bad = write_tmp(cases[i].name, cases[i].text);
        const char *files[2] = {good, bad};
        char out[600];
        snprintf(out, sizeof out, "%s.h5", bad);
        fmoe_import_options o = options(2, 4, 2);
        int rc = fmoe_import_dense_csv(files, 2, 0, &o, out, NULL);
        if (rc != cases[i].code || !strstr(fmoe_error_detail(), cases[i].where))
            fprintf(stderr, "  case %s: rc %d: %s\n", cases[i].name, rc, fmoe_error_detail());
        ASSERT_EQ(rc, cases[i].code);
        ASSERT_CONTAINS(fmoe_error_detail(), cases[i].where);
        ASSERT_TRUE(!exists(out));
        ASSERT_TRUE(!partial_exists(out));
    }
    /* file count must match L */
    const char *files[1] = {good};
    fmoe_import_options o = options(2, 4, 2);
    ASSERT_EQ(fmoe_import_dense_csv(files, 1, 0, &o, tmp_path("d1.h5"), NULL), FMOE_EINVAL);
    ASSERT_CONTAINS(fmoe_error_detail(), "1 layer files given, but the model has L = 2");
}

static void cleanup(void) {
    if (!tmpdir[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

int main(int argc, char **argv) {
    int rc = RUN_TESTS(argc, argv);
    cleanup();
    return rc;
}
