/*
 * costs.c - the simulator's cost model (fmoe/sim.h, docs/design.md §7).
 *
 * Transfer: alpha + bytes / beta per copy.
 * Compute, per MoE layer (everything but the routed experts: attention projections, the
 * attention itself over the context, router, shared experts) and per routed expert: a
 * measured linear model from the profile when present, else a roofline,
 *     time = max(FLOPs / peak_flops, bytes / memory_bandwidth) + launch_s,
 * with FLOPs = 2 · params · tokens (+ 4 · heads · head_dim · tokens · context for attention)
 * and bytes = the weights read once (+ the KV cache read for attention). The weights and
 * cache follow the attention's kind (MLA: its low-rank projections and latent cache). The
 * roofline ignores causal masking (full n × context scores) and MLA's absorbed products;
 * it is a bound, not a prediction — calibrate for predictions.
 *
 * A profile's layer overhead (compute.layer_overhead_s, calibrate's measure of what a live
 * pass pays per MoE layer besides its products, attention and experts: small ops, the
 * routing read back to the host and the waits for the device that takes) is added to
 * every MoE layer's time, base + per_token · n for the layer's n tokens, measured or
 * roofline. Absent, nothing is added, so a profile without it gives the times it always
 * gave, to the bit.
 */
#include <math.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/sim.h"

int fmoe_sim_costs_init(fmoe_sim_costs *c, const fmoe_hardware_profile *hw,
                        const fmoe_model_geometry *g, int64_t expert_bytes, int32_t hidden_size,
                        double dtype_bits) {
    memset(c, 0, sizeof *c);
    FMOE_RETURN_ERROR_IF(expert_bytes <= 0, FMOE_EINVAL,
                         "expert size unknown (the trace has no expert_bytes; pass "
                         "--model-config)");
    FMOE_RETURN_ERROR_IF(!(hw->beta_bytes_per_s > 0) || hw->alpha_s < 0, FMOE_EINVAL,
                         "hardware %s: link needs alpha_s >= 0 and beta_bytes_per_s > 0",
                         hw->name);
    c->alpha_s = hw->alpha_s;
    c->beta_bytes_per_s = hw->beta_bytes_per_s;
    c->expert_bytes = expert_bytes;
    c->layer = hw->attention;
    c->expert = hw->expert;
    c->head = hw->head;
    c->layer_overhead = hw->layer_overhead;
    c->peak_flops = hw->peak_flops;
    c->mem_bw = hw->memory_bandwidth_bytes_per_s;
    c->launch_s = hw->launch_s;
    c->host_expert = hw->host_expert;
    c->host_peak_flops = hw->host_peak_flops;
    c->host_mem_bw = hw->host_memory_bandwidth_bytes_per_s;
    c->match_delay_s = hw->match_s;
    c->promoe_delay_s = hw->promoe_s;
    c->duoserve_delay_s = hw->duoserve_s;
    FMOE_RETURN_ERROR_IF((!c->layer.present || !c->expert.present) &&
                             !(c->peak_flops > 0 && c->mem_bw > 0),
                         FMOE_EINVAL,
                         "hardware %s: no compute timings and no roofline (device.peak_flops, "
                         "device.memory_bandwidth_bytes_per_s)",
                         hw->name);
    if (g) {
        const double h = g->hidden_size, H = g->num_attention_heads > 0 ? g->num_attention_heads : 1;
        const double hd = g->head_dim > 0 ? g->head_dim : h / H;
        /* MLA's low-rank projections and its latent cache per token included
         * (fmoe_geometry_attention_params, fmoe_geometry_kv_values_per_token). */
        const double attn = (double)fmoe_geometry_attention_params(g);
        const double router = h * g->num_experts;
        const double shared = 3.0 * h * g->shared_intermediate_size;
        const double bits = fmoe_dtype_bits(g->dtype);
        c->bytes_per_param = (bits > 0 ? bits : 16) / 8;
        c->layer_weight_params = attn + router + shared;
        c->attn_flops_per_token_ctx = 4 * H * hd;
        c->kv_bytes_per_ctx = (double)fmoe_geometry_kv_values_per_token(g) * c->bytes_per_param;
        const int64_t ep = fmoe_geometry_expert_params(g);
        c->expert_params = ep > 0 ? (double)ep : 0;
    } else {
        const double h = hidden_size > 0 ? hidden_size : 0;
        c->bytes_per_param = (dtype_bits > 0 ? dtype_bits : 16) / 8;
        c->layer_weight_params = 4 * h * h;
        c->attn_flops_per_token_ctx = 4 * h;
        c->kv_bytes_per_ctx = 2 * h * c->bytes_per_param;
    }
    if (c->expert_params <= 0) c->expert_params = (double)expert_bytes / c->bytes_per_param;
    c->layer_flops_per_token = 2 * c->layer_weight_params;
    return 0;
}

double fmoe_sim_transfer_s(const fmoe_sim_costs *c, int64_t bytes) {
    return c->alpha_s + (double)bytes / c->beta_bytes_per_s;
}

/* The layer's time plus the profile's overhead per MoE layer, when it has one. */
static double with_overhead(const fmoe_sim_costs *c, double t, int32_t tokens) {
    if (!c->layer_overhead.present) return t;
    return t + (c->layer_overhead.base_s + c->layer_overhead.per_token_s * tokens);
}

static double layer_compute_s(const fmoe_sim_costs *c, int32_t tokens, int64_t context) {
    const double n = tokens, ctx = (double)context;
    if (c->layer.present)
        return c->layer.base_s + c->layer.per_token_s * n + c->layer.per_token_context_s * n * ctx;
    const double flops = c->layer_flops_per_token * n + c->attn_flops_per_token_ctx * n * ctx;
    const double bytes = c->layer_weight_params * c->bytes_per_param + c->kv_bytes_per_ctx * ctx;
    return fmax(flops / c->peak_flops, bytes / c->mem_bw) + c->launch_s;
}

double fmoe_sim_layer_s(const fmoe_sim_costs *c, int32_t tokens, int64_t context) {
    return with_overhead(c, layer_compute_s(c, tokens, context), tokens);
}

/* A batch: the projections over every token, the scores of each item against its own
 * context (sum n_i * c_i), the KV cache of every item read once (sum c_i), the weights
 * read once. */
static double layer_batch_compute_s(const fmoe_sim_costs *c, int32_t tokens,
                                    double token_context, double kv_context) {
    const double n = tokens;
    if (c->layer.present)
        return c->layer.base_s + c->layer.per_token_s * n +
               c->layer.per_token_context_s * token_context;
    const double flops = c->layer_flops_per_token * n + c->attn_flops_per_token_ctx * token_context;
    const double bytes =
        c->layer_weight_params * c->bytes_per_param + c->kv_bytes_per_ctx * kv_context;
    return fmax(flops / c->peak_flops, bytes / c->mem_bw) + c->launch_s;
}

double fmoe_sim_layer_batch_s(const fmoe_sim_costs *c, int32_t tokens, double token_context,
                              double kv_context) {
    return with_overhead(c, layer_batch_compute_s(c, tokens, token_context, kv_context), tokens);
}

double fmoe_sim_head_batch_s(const fmoe_sim_costs *c, int32_t rows) {
    return c->head.present && rows > 0 ? c->head.base_s + c->head.per_token_s * rows : 0;
}

double fmoe_sim_head_s(const fmoe_sim_costs *c) {
    return c->head.present ? c->head.base_s + c->head.per_token_s : 0;
}

double fmoe_sim_expert_s(const fmoe_sim_costs *c, int32_t tokens) {
    if (c->expert.present) return c->expert.base_s + c->expert.per_token_s * tokens;
    const double flops = 2 * c->expert_params * tokens;
    return fmax(flops / c->peak_flops, (double)c->expert_bytes / c->mem_bw) + c->launch_s;
}

int fmoe_sim_costs_have_host(const fmoe_sim_costs *c) {
    return c->host_expert.present || (c->host_peak_flops > 0 && c->host_mem_bw > 0);
}

double fmoe_sim_host_expert_s(const fmoe_sim_costs *c, int32_t tokens) {
    if (c->host_expert.present) return c->host_expert.base_s + c->host_expert.per_token_s * tokens;
    const double flops = 2 * c->expert_params * tokens;
    return fmax(flops / c->host_peak_flops, (double)c->expert_bytes / c->host_mem_bw);
}
