/*
 * bench_json_mask.c - the cost of one structured-output mask (fmoe_json_matcher_mask) on a
 * real vocabulary, in the states a document passes through. Not a test.
 *
 *     bench_json_mask TOKENIZER_DIR [ITERATIONS]
 *
 * Prints one JSON object: the vocabulary size, the trie build time, and per state the mean
 * microseconds per mask and the tokens it allowed. The states are reached by feeding a
 * fixed prefix of a document of a fixed schema; "in_string" is the worst case (nearly
 * every token is allowed, so the walk visits most of the trie).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmoe/error.h"
#include "fmoe/json_constraint.h"
#include "fmoe/tokenizer.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_json_mask TOKENIZER_DIR [ITERATIONS]\n");
        return 2;
    }
    const int iters = argc > 2 ? atoi(argv[2]) : 200;
    static const char schema_text[] =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
        "\"age\":{\"type\":\"integer\"},\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},"
        "\"xs\":{\"type\":\"array\",\"items\":{\"type\":\"number\"}},"
        "\"code\":{\"type\":\"string\",\"maxLength\":40},"
        "\"lvl\":{\"type\":\"integer\",\"minimum\":-50,\"maximum\":5000},"
        "\"id\":{\"type\":\"string\",\"pattern\":\"^[a-z][a-z0-9_]*(-[0-9]{2,4})?$\"}},"
        "\"required\":[\"name\",\"age\",\"color\",\"xs\",\"code\",\"lvl\",\"id\"],"
        "\"additionalProperties\":false}";
    static const struct {
        const char *name, *prefix;
    } states[] = {
        {"start", ""},
        {"key", "{"},
        {"in_string", "{\"name\":\"Al"},
        {"after_string", "{\"name\":\"Al\""},
        {"in_integer", "{\"name\":\"Al\",\"age\":4"},
        {"enum", "{\"name\":\"Al\",\"age\":4,\"color\":"},
        {"in_array", "{\"name\":\"Al\",\"age\":4,\"color\":\"red\",\"xs\":[1.5,"},
        /* maxLength: every byte counts, so no in-string shortcut */
        {"in_bounded_string", "{\"name\":\"Al\",\"age\":4,\"color\":\"red\",\"xs\":[],"
                              "\"code\":\"ab"},
        {"in_bounded_integer", "{\"name\":\"Al\",\"age\":4,\"color\":\"red\",\"xs\":[],"
                               "\"code\":\"\",\"lvl\":12"},
        /* pattern: the position automaton steps on every byte, no shortcut */
        {"in_pattern_string", "{\"name\":\"Al\",\"age\":4,\"color\":\"red\",\"xs\":[],"
                              "\"code\":\"\",\"lvl\":12,\"id\":\"ab"},
    };
    fmoe_tokenizer *tok;
    fmoe_json_schema *schema;
    fmoe_json_vocab *vocab;
    if (fmoe_tokenizer_load(argv[1], &tok) < 0 ||
        fmoe_json_schema_compile(schema_text, strlen(schema_text), &schema) < 0) {
        fprintf(stderr, "bench_json_mask: %s\n", fmoe_error_detail());
        return 1;
    }
    const int32_t eos = fmoe_tokenizer_eos_id(tok);
    double t0 = now_s();
    if (fmoe_json_vocab_init(tok, &eos, eos >= 0, &vocab) < 0) {
        fprintf(stderr, "bench_json_mask: %s\n", fmoe_error_detail());
        return 1;
    }
    const double build_s = now_s() - t0;
    const int32_t V = fmoe_json_vocab_size(vocab);
    uint8_t *allowed = malloc((size_t)V);
    printf("{\"vocab\": %d, \"trie_build_ms\": %.2f", V, 1e3 * build_s);
    for (size_t s = 0; s < sizeof states / sizeof *states; s++) {
        fmoe_json_matcher *m;
        if (fmoe_json_matcher_init(schema, vocab, &m) < 0 ||
            fmoe_json_matcher_feed(m, states[s].prefix, strlen(states[s].prefix)) < 0) {
            fprintf(stderr, "bench_json_mask: %s: %s\n", states[s].name, fmoe_error_detail());
            return 1;
        }
        int32_t n = 0;
        t0 = now_s();
        for (int i = 0; i < iters; i++) n = fmoe_json_matcher_mask(m, allowed);
        const double us = 1e6 * (now_s() - t0) / iters;
        printf(", \"%s\": {\"us\": %.1f, \"allowed\": %d}", states[s].name, us, n);
        fmoe_json_matcher_free(m);
    }
    printf("}\n");
    free(allowed);
    fmoe_json_vocab_free(vocab);
    fmoe_json_schema_free(schema);
    fmoe_tokenizer_free(tok);
    return 0;
}
