/*
 * fuzz_predictor.c - fuzz target for the learned-predictor reader (trace/predictor_file.c,
 * kinds promoe and duoserve): the input is the bytes of a predictor file,
 * opened through HDF5's in-memory (core) driver by fmoe__predictor_read_image. A failure
 * must carry a detail; a success must hold a complete model of its kind whose shapes agree
 * with its geometry, and the duoserve one must run (its state and one inference).
 * Seeds: small predictor files written by fmoe train-predictor (tests/fuzz/README.md).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/predictor.h"
#include "predictor_impl.h"

static void fail(const char *what) {
    fprintf(stderr, "fuzz_predictor: %s (%s)\n", what, fmoe_error_detail());
    abort();
}

static void check_duoserve(const fmoe_predictor *p) {
    const fmoe_expert_mlp *m = p->expert_mlp;
    if (!m || !m->params || !p->popularity || !p->affinity) fail("duoserve: missing parts");
    if (m->width[0] != fmoe_duoserve_input_dim(p->num_layers, p->num_experts) ||
        m->width[m->num_fc] != p->num_experts)
        fail("duoserve: widths disagree with the geometry");
    fmoe_expert_mlp_work w;
    if (fmoe_expert_mlp_work_init(&w, m, 1) < 0) fail("workspace");
    const size_t D = (size_t)m->width[0];
    float *s = malloc(D * sizeof *s), *logits = malloc((size_t)p->num_experts * sizeof *logits);
    uint16_t *chosen = calloc((size_t)p->num_layers * (size_t)p->top_k, sizeof *chosen);
    if (!s || !logits || !chosen) abort();
    for (int32_t l = 0; l < p->num_layers; l++)
        for (int32_t k = 0; k < p->top_k; k++)
            chosen[(size_t)l * p->top_k + k] = (uint16_t)(k % p->num_experts);
    fmoe_duoserve_state(p, p->num_layers - 1, chosen, p->top_k, s);
    fmoe_expert_mlp_infer(m, &w, s, 1, logits);
    free(chosen);
    free(logits);
    free(s);
    fmoe_expert_mlp_work_free(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fmoe_predictor *p = NULL;
    fmoe_error_clear();
    int rc = fmoe__predictor_read_image(data, size, "fuzz.h5", &p);
    if (rc < 0) {
        if (!fmoe_error_detail()[0]) fail("error without a detail");
        if (p) fail("an error left a predictor");
        return 0;
    }
    if (p->num_layers < 2 || p->num_experts < 1 || p->top_k < 1 || p->top_k > p->num_experts)
        fail("accepted a bad geometry");
    if (strcmp(p->kind, FMOE_PREDICTOR_KIND_DUOSERVE) == 0) {
        check_duoserve(p);
    } else if (strcmp(p->kind, FMOE_PREDICTOR_KIND_PROMOE) == 0) {
        for (int32_t i = 1; i < p->num_layers; i++)
            if (!p->layers[i].w1 || p->layers[i].in != p->hidden_size ||
                p->layers[i].out != p->num_experts)
                fail("promoe: a layer's shape disagrees with the geometry");
    } else {
        fail("accepted an unknown kind");
    }
    fmoe_predictor_free(p);
    return 0;
}
