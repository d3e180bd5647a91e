/*
 * trace_header.c - a live recording's trace header from the loaded model (trace_header.h).
 */
#include "trace_header.h"

#include <stdio.h>
#include <string.h>

#include "backend_cli.h"
#include "fmoe/geometry.h"

const char *cmd_base_name(const char *path, char *buf, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t s = n;
    while (s > 0 && path[s - 1] != '/') s--;
    snprintf(buf, cap, "%.*s", (int)(n - s), path + s);
    return buf;
}

int cmd_trace_header_for_model(fmoe_trace_header *h, const fmoe_model *m, const char *dir,
                               const char *model_name, int probs_f32,
                               fmoe_backend_kind backend, fmoe_activations activations) {
    memset(h, 0, sizeof *h);
    const fmoe_model_geometry *g = fmoe_model_get_geometry(m);
    const char *config = fmoe_model_config_json(m);
    if (model_name)
        snprintf(h->model_name, sizeof h->model_name, "%s", model_name);
    else
        cmd_base_name(dir, h->model_name, sizeof h->model_name);
    const int rc = fmoe_config_fingerprint(config, strlen(config), h->model_fingerprint);
    if (rc < 0) return rc;
    h->num_layers = g->num_moe_layers;
    h->num_experts = g->num_experts;
    h->top_k = g->top_k;
    h->hidden_size = (int32_t)g->hidden_size;
    h->shared_experts = g->num_shared_experts;
    h->expert_bytes = fmoe_model_expert_bytes(m);
    if (h->expert_bytes < 0) h->expert_bytes = 0;
    h->layer_expert_bytes = fmoe_model_layer_expert_bytes(m); /* written where layers differ */
    snprintf(h->dtype, sizeof h->dtype, "%s", fmoe_dtype_name(g->expert_dtype));
    cmd_backend_recorded_on(backend, h->recorded_on, sizeof h->recorded_on);
    /* written for every model, bf16 ones included (where it changes nothing), so that a
     * trace says it without the reader knowing which weight types it affects; resolved
     * here too (a no-op on a command's resolved value) so that it is never "auto" */
    snprintf(h->activations, sizeof h->activations, "%s",
             fmoe_activations_name(fmoe_activations_resolve(activations, backend)));
    h->probs_kind = FMOE_PROBS_FULL;
    h->probs_half = !probs_f32;
    h->semantic_dim = (int32_t)g->hidden_size;
    snprintf(h->semantic_kind, sizeof h->semantic_kind, "embedding");
    h->config_json = config;
    return 0;
}
