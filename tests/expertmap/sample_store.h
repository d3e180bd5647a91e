/*
 * sample_store.h - a small deterministic store file, for round-trip tests in C
 * (test_store.c) and for independent readers (tests/python/test_store.py recomputes the
 * same values with numpy).
 *
 *   capacity 6, 5 entries, L = 3, J = 4, K = 2, h = 3, d = 1
 *   maps[e][l][j] = ((e + 2l + 3j) % 4) / 8        sem[e][i] = (e - 2i) / 4
 *   hits[e] = 10 e
 *   sources: a.h5 (4 requests), b.h5 (3 requests); used (0,100) (0,107) (1,5);
 *   held out (0,114) (1,6); split 0.7, seed 2^63 + 5, tokens_used 77
 */
#ifndef FMOE_TEST_SAMPLE_STORE_H
#define FMOE_TEST_SAMPLE_STORE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/expertmap.h"
#include "fmoe/store.h"

enum { SS_C = 6, SS_E = 5, SS_L = 3, SS_J = 4, SS_K = 2, SS_H = 3, SS_D = 1 };
#define SS_SEED (((uint64_t)1 << 63) + 5)

static inline float ss_map(int e, int l, int j) { return (float)((e + 2 * l + 3 * j) % 4) / 8.0f; }
static inline float ss_sem(int e, int i) { return (float)(e - 2 * i) / 4.0f; }

/* Fills f (static storage for the lists) with the sample; the store is new (caller frees
 * f->store). @return 0 or an fmoe error. */
static inline int ss_make(fmoe_store_file *f) {
    static fmoe_store_source sources[2];
    static int32_t used_source[3] = {0, 0, 1}, held_source[2] = {0, 1};
    static int64_t used_id[3] = {100, 107, 5}, held_id[2] = {114, 6};
    memset(f, 0, sizeof *f);
    memset(sources, 0, sizeof sources);
    snprintf(sources[0].path, sizeof sources[0].path, "traces/a.h5");
    snprintf(sources[0].created, sizeof sources[0].created, "2026-01-01T00:00:00Z");
    snprintf(sources[0].dataset, sizeof sources[0].dataset, "lmsys");
    sources[0].num_requests = 4;
    snprintf(sources[1].path, sizeof sources[1].path, "b.h5");
    snprintf(sources[1].created, sizeof sources[1].created, "2026-01-02T00:00:00Z");
    snprintf(sources[1].dataset, sizeof sources[1].dataset, "sharegpt \xe2\x9c\x93");
    sources[1].num_requests = 3;
    snprintf(f->model_name, sizeof f->model_name, "sample-moe");
    snprintf(f->model_fingerprint, sizeof f->model_fingerprint, "%064d", 7);
    f->probs_kind = FMOE_PROBS_FULL;
    snprintf(f->semantic_kind, sizeof f->semantic_kind, "embedding");
    f->split = 0.7;
    f->split_seed = SS_SEED;
    f->tokens_used = 77;
    f->num_sources = 2;
    f->sources = sources;
    f->num_used = 3;
    f->used_source = used_source;
    f->used_id = used_id;
    f->num_held_out = 2;
    f->held_out_source = held_source;
    f->held_out_id = held_id;
    const fmoe_expertmap_config cfg = {.capacity = SS_C, .num_layers = SS_L,
                                       .num_experts = SS_J, .top_k = SS_K,
                                       .semantic_dim = SS_H, .prefetch_distance = SS_D};
    int rc = fmoe_expertmap_init(&f->store, &cfg);
    for (int e = 0; rc == 0 && e < SS_E; e++) {
        float map[SS_L * SS_J], sem[SS_H];
        for (int l = 0; l < SS_L; l++)
            for (int j = 0; j < SS_J; j++) map[l * SS_J + j] = ss_map(e, l, j);
        for (int i = 0; i < SS_H; i++) sem[i] = ss_sem(e, i);
        rc = fmoe_expertmap_set(f->store, e, sem, map, (uint32_t)(10 * e));
    }
    return rc;
}

/* NULL when f holds exactly the sample, else what differs. */
static inline const char *ss_verify(const fmoe_store_file *f) {
    const fmoe_expertmap_config *c = fmoe_expertmap_config_of(f->store);
    if (c->capacity != SS_C || c->num_layers != SS_L || c->num_experts != SS_J ||
        c->top_k != SS_K || c->semantic_dim != SS_H || c->prefetch_distance != SS_D)
        return "geometry";
    if (fmoe_expertmap_size(f->store) != SS_E) return "size";
    const float *sem = fmoe_expertmap_semantic(f->store);
    const uint32_t *hits = fmoe_expertmap_hits(f->store);
    for (int e = 0; e < SS_E; e++) {
        for (int l = 0; l < SS_L; l++) {
            float row[SS_J];
            fmoe_expertmap_get_row(f->store, e, l, row);
            for (int j = 0; j < SS_J; j++)
                if (row[j] != ss_map(e, l, j)) return "maps";
        }
        for (int i = 0; i < SS_H; i++)
            if (sem[e * SS_H + i] != ss_sem(e, i)) return "semantic";
        if (hits[e] != (uint32_t)(10 * e)) return "hits";
    }
    if (strcmp(f->model_name, "sample-moe") != 0) return "model_name";
    if (f->probs_kind != FMOE_PROBS_FULL || strcmp(f->semantic_kind, "embedding") != 0)
        return "kinds";
    if (f->split != 0.7 || f->split_seed != SS_SEED || f->tokens_used != 77) return "split";
    if (f->num_sources != 2 || strcmp(f->sources[0].path, "traces/a.h5") != 0 ||
        strcmp(f->sources[1].dataset, "sharegpt \xe2\x9c\x93") != 0 ||
        strcmp(f->sources[1].created, "2026-01-02T00:00:00Z") != 0 ||
        f->sources[0].num_requests != 4 || f->sources[1].num_requests != 3)
        return "sources";
    if (f->num_used != 3 || f->used_id[1] != 107 || f->used_source[2] != 1) return "used";
    if (f->num_held_out != 2 || f->held_out_id[0] != 114 || f->held_out_source[1] != 1)
        return "held_out";
    return NULL;
}

#endif
