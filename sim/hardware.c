/*
 * hardware.c - hardware profiles: built-in presets and the JSON format (fmoe/hardware.h).
 *
 * Presets give the host-to-device link (alpha, beta) and a roofline (dense 16-bit tensor
 * FLOP/s, device memory bandwidth); no measured compute curves, so compute times come from
 * the roofline (an optimistic bound: real GEMMs at decode sizes reach a fraction of peak).
 * Run `fmoe calibrate` for figures measured on your machine.
 *
 * Link figures: PCIe 4.0 x16 is 32 GB/s nominal; pinned cudaMemcpyAsync measures about
 * 24 GB/s (MoE-Infinity Table 1 "24GB/s" on A5000; ProMoE §2.2 measured 23.9 GB/s on an
 * RTX 4090). PCIe 5.0 x16 is 64 GB/s nominal; we assume ~50 GB/s effective by the same
 * ~78% ratio. alpha = 10 µs per copy is a typical cudaMemcpyAsync issue-to-completion
 * latency for a pinned buffer (an assumption; calibrate measures it).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "files.h"
#include "fmoe/hardware.h"

typedef struct preset {
    const char *name;
    double alpha_s, beta, flops, membw, launch_s;
    const char *source;
} preset;

static const preset presets[] = {
    /* GA102 whitepaper: RTX 3090 71 TFLOPS FP16/BF16 tensor with FP32 accumulate (dense);
     * 936 GB/s GDDR6X. The testbed of "fMoE: Fine-Grained Expert Offloading for Large
     * Mixture-of-Experts Serving" §6.1. */
    {"rtx3090-pcie4", 10e-6, 24e9, 71e12, 936e9, 10e-6,
     "RTX 3090: 71 TFLOPS fp16 tensor (fp32 acc, dense), 936 GB/s (NVIDIA GA102 whitepaper); "
     "PCIe 4.0 x16 at 24 GB/s effective (MoE-Infinity Table 1, ProMoE §2.2)"},
    /* RTX A5000 datasheet: 222.2 TFLOPS tensor with sparsity -> 111.1 dense; 768 GB/s.
     * MoE-Infinity's testbed (§5). */
    {"a5000-pcie4", 10e-6, 24e9, 111.1e12, 768e9, 10e-6,
     "RTX A5000: 111.1 TFLOPS fp16 tensor (dense), 768 GB/s (NVIDIA datasheet); "
     "PCIe 4.0 x16 at 24 GB/s effective (MoE-Infinity Table 1)"},
    /* Ada whitepaper: RTX 4090 165.2 TFLOPS FP16 tensor with FP32 accumulate (dense);
     * 1008 GB/s. ProMoE's testbed (§7.1), link measured there at 23.9 GB/s. */
    {"rtx4090-pcie4", 10e-6, 23.9e9, 165.2e12, 1008e9, 10e-6,
     "RTX 4090: 165.2 TFLOPS fp16 tensor (fp32 acc, dense), 1008 GB/s (NVIDIA Ada whitepaper); "
     "PCIe 4.0 at 23.9 GB/s measured (ProMoE §2.2)"},
    /* A100 80GB PCIe datasheet: 312 TFLOPS BF16 dense, 1935 GB/s HBM2e. */
    {"a100-pcie4", 10e-6, 24e9, 312e12, 1935e9, 10e-6,
     "A100 80GB PCIe: 312 TFLOPS bf16 (dense), 1935 GB/s (NVIDIA datasheet); "
     "PCIe 4.0 x16 at 24 GB/s effective"},
    /* H100 PCIe datasheet: 1513 TFLOPS BF16 with sparsity -> 756 dense; 2.0 TB/s HBM2e. */
    {"h100-pcie5", 10e-6, 50e9, 756e12, 2.0e12, 10e-6,
     "H100 PCIe: 756 TFLOPS bf16 (dense), 2.0 TB/s (NVIDIA datasheet); "
     "PCIe 5.0 x16 at ~50 GB/s effective (64 nominal; assumed ratio)"},
    /* H100 SXM5 datasheet: 1979 TFLOPS BF16 with sparsity -> 989 dense; 3.35 TB/s HBM3.
     * The host link is still PCIe 5.0 x16 (NVLink is GPU to GPU). */
    {"h100-sxm", 10e-6, 50e9, 989e12, 3.35e12, 10e-6,
     "H100 SXM5: 989 TFLOPS bf16 (dense), 3.35 TB/s (NVIDIA datasheet); "
     "host link PCIe 5.0 x16 at ~50 GB/s effective (assumed)"},
    /* Not a machine: the simulated side of a live run with --sync-transfers, where every
     * transfer has completed wherever a completion can be seen, so decisions do not depend
     * on the link (docs/offloading.md, "Live and simulated, decision for decision"). The
     * compute terms are rtx3090-pcie4's; with a free link they order nothing. */
    {"zero-link", 0.0, 1e30, 71e12, 936e9, 10e-6,
     "transfers take no time: replays a live run made with --sync-transfers decision for "
     "decision (fmoe compare-logs --late-is-hit)"},
};
#define NUM_PRESETS (sizeof presets / sizeof presets[0])

const char *fmoe_hardware_preset_names(void) {
    return "rtx3090-pcie4, a5000-pcie4, rtx4090-pcie4, a100-pcie4, h100-pcie5, h100-sxm, "
           "zero-link";
}

int fmoe_hardware_preset(const char *name, fmoe_hardware_profile *out) {
    for (size_t i = 0; name && i < NUM_PRESETS; i++) {
        const preset *p = &presets[i];
        if (strcmp(p->name, name) != 0) continue;
        memset(out, 0, sizeof *out);
        snprintf(out->name, sizeof out->name, "%s", p->name);
        snprintf(out->source, sizeof out->source, "%s", p->source);
        out->alpha_s = p->alpha_s;
        out->beta_bytes_per_s = p->beta;
        out->peak_flops = p->flops;
        out->memory_bandwidth_bytes_per_s = p->membw;
        out->launch_s = p->launch_s;
        return 0;
    }
    return fmoe_error_set(FMOE_ENOTFOUND, "unknown hardware '%s' (presets: %s)",
                          name ? name : "", fmoe_hardware_preset_names());
}

/* Reads obj.key as a number into *out. required: missing is an error; else *out stays. */
static int get_number(const cJSON *obj, const char *path, const char *key, const char *origin,
                      int required, int positive, double *out) {
    const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (!v) {
        if (required)
            return fmoe_error_set(FMOE_EFORMAT, "%s: missing field %s.%s", origin, path, key);
        return 0;
    }
    FMOE_RETURN_ERROR_IF(!cJSON_IsNumber(v) || !isfinite(v->valuedouble), FMOE_EFORMAT,
                         "%s: %s.%s must be a number", origin, path, key);
    FMOE_RETURN_ERROR_IF(positive ? v->valuedouble <= 0 : v->valuedouble < 0, FMOE_ERANGE,
                         "%s: %s.%s must be %s, got %g", origin, path, key,
                         positive ? "> 0" : ">= 0", v->valuedouble);
    *out = v->valuedouble;
    return 1;
}

static int get_linear(const cJSON *compute, const char *section, const char *key,
                      const char *origin, fmoe_linear_cost *out) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(compute, key);
    if (!o) return 0;
    FMOE_RETURN_ERROR_IF(!cJSON_IsObject(o), FMOE_EFORMAT, "%s: %s.%s must be an object",
                         origin, section, key);
    char path[64];
    snprintf(path, sizeof path, "%s.%s", section, key);
    FMOE_FORWARD_IF_ERROR(get_number(o, path, "base", origin, 1, 0, &out->base_s));
    FMOE_FORWARD_IF_ERROR(get_number(o, path, "per_token", origin, 1, 0, &out->per_token_s));
    FMOE_FORWARD_IF_ERROR(get_number(o, path, "per_token_context", origin, 0, 0,
                                     &out->per_token_context_s));
    out->present = 1;
    return 0;
}

static int parse_object(const cJSON *root, const char *origin, fmoe_hardware_profile *p) {
    FMOE_RETURN_ERROR_IF(!cJSON_IsObject(root), FMOE_EFORMAT,
                         "%s: a hardware profile must be a JSON object", origin);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    FMOE_RETURN_ERROR_IF(fmt && (!cJSON_IsString(fmt) ||
                                 strcmp(fmt->valuestring, FMOE_HARDWARE_FORMAT) != 0),
                         FMOE_EFORMAT, "%s: format must be \"%s\"", origin,
                         FMOE_HARDWARE_FORMAT);
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    FMOE_RETURN_ERROR_IF(ver && (!cJSON_IsNumber(ver) || ver->valueint != FMOE_HARDWARE_VERSION),
                         FMOE_EFORMAT, "%s: unsupported profile version (expected %d)", origin,
                         FMOE_HARDWARE_VERSION);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    if (cJSON_IsString(name)) snprintf(p->name, sizeof p->name, "%s", name->valuestring);
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(root, "source");
    if (cJSON_IsString(src)) snprintf(p->source, sizeof p->source, "%s", src->valuestring);

    const cJSON *link = cJSON_GetObjectItemCaseSensitive(root, "link");
    FMOE_RETURN_ERROR_IF(!link, FMOE_EFORMAT, "%s: missing field link", origin);
    FMOE_RETURN_ERROR_IF(!cJSON_IsObject(link), FMOE_EFORMAT, "%s: link must be an object",
                         origin);
    FMOE_FORWARD_IF_ERROR(get_number(link, "link", "alpha_s", origin, 1, 0, &p->alpha_s));
    FMOE_FORWARD_IF_ERROR(
        get_number(link, "link", "beta_bytes_per_s", origin, 1, 1, &p->beta_bytes_per_s));

    const cJSON *compute = cJSON_GetObjectItemCaseSensitive(root, "compute");
    if (compute) {
        FMOE_RETURN_ERROR_IF(!cJSON_IsObject(compute), FMOE_EFORMAT,
                             "%s: compute must be an object", origin);
        FMOE_FORWARD_IF_ERROR(get_linear(compute, "compute", "attention_s", origin, &p->attention));
        FMOE_FORWARD_IF_ERROR(get_linear(compute, "compute", "expert_s", origin, &p->expert));
        FMOE_FORWARD_IF_ERROR(get_linear(compute, "compute", "head_s", origin, &p->head));
        FMOE_FORWARD_IF_ERROR(get_linear(compute, "compute", "layer_overhead_s", origin,
                                         &p->layer_overhead));
    }
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(root, "host");
    if (host) {
        FMOE_RETURN_ERROR_IF(!cJSON_IsObject(host), FMOE_EFORMAT, "%s: host must be an object",
                             origin);
        FMOE_FORWARD_IF_ERROR(get_linear(host, "host", "expert_s", origin, &p->host_expert));
        FMOE_FORWARD_IF_ERROR(get_number(host, "host", "peak_flops", origin, 0, 1,
                                         &p->host_peak_flops));
        FMOE_FORWARD_IF_ERROR(get_number(host, "host", "memory_bandwidth_bytes_per_s", origin, 0,
                                         1, &p->host_memory_bandwidth_bytes_per_s));
        FMOE_RETURN_ERROR_IF(!p->host_expert.present &&
                                 !(p->host_peak_flops > 0 && p->host_memory_bandwidth_bytes_per_s > 0),
                             FMOE_EFORMAT,
                             "%s: missing field host.expert_s (or host.peak_flops and "
                             "host.memory_bandwidth_bytes_per_s)",
                             origin);
    }
    /* Optional: the fMoE matcher's time per match (fmoe_hardware_profile.match_s). */
    const cJSON *matcher = cJSON_GetObjectItemCaseSensitive(root, "matcher");
    if (matcher) {
        FMOE_RETURN_ERROR_IF(!cJSON_IsObject(matcher), FMOE_EFORMAT,
                             "%s: matcher must be an object", origin);
        FMOE_FORWARD_IF_ERROR(get_number(matcher, "matcher", "match_s", origin, 1, 0, &p->match_s));
    }
    /* Optional: the learned predictors' time per pass (fmoe_hardware_profile.promoe_s,
     * duoserve_s). */
    const cJSON *predictor = cJSON_GetObjectItemCaseSensitive(root, "predictor");
    if (predictor) {
        FMOE_RETURN_ERROR_IF(!cJSON_IsObject(predictor), FMOE_EFORMAT,
                             "%s: predictor must be an object", origin);
        FMOE_FORWARD_IF_ERROR(
            get_number(predictor, "predictor", "promoe_s", origin, 0, 0, &p->promoe_s));
        FMOE_FORWARD_IF_ERROR(
            get_number(predictor, "predictor", "duoserve_s", origin, 0, 0, &p->duoserve_s));
    }
    const cJSON *device = cJSON_GetObjectItemCaseSensitive(root, "device");
    const int need_device = !p->attention.present || !p->expert.present;
    if (device || need_device) {
        FMOE_RETURN_ERROR_IF(!device, FMOE_EFORMAT,
                             "%s: missing field device (peak_flops, "
                             "memory_bandwidth_bytes_per_s), needed unless compute.attention_s "
                             "and compute.expert_s are both given",
                             origin);
        FMOE_RETURN_ERROR_IF(!cJSON_IsObject(device), FMOE_EFORMAT,
                             "%s: device must be an object", origin);
        FMOE_FORWARD_IF_ERROR(
            get_number(device, "device", "peak_flops", origin, need_device, 1, &p->peak_flops));
        FMOE_FORWARD_IF_ERROR(get_number(device, "device", "memory_bandwidth_bytes_per_s", origin,
                                         need_device, 1, &p->memory_bandwidth_bytes_per_s));
        FMOE_FORWARD_IF_ERROR(get_number(device, "device", "launch_s", origin, 0, 0, &p->launch_s));
    }
    return 0;
}

int fmoe_hardware_parse(const char *json, size_t len, const char *origin,
                        fmoe_hardware_profile *out) {
    if (!origin) origin = "<string>";
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return fmoe_error_set(FMOE_EFORMAT, "%s: not valid JSON", origin);
    fmoe_hardware_profile p;
    memset(&p, 0, sizeof p);
    int rc = parse_object(root, origin, &p);
    cJSON_Delete(root);
    if (rc < 0) return rc;
    if (!p.name[0]) snprintf(p.name, sizeof p.name, "custom");
    *out = p;
    return 0;
}

int fmoe_hardware_load(const char *path, fmoe_hardware_profile *out) {
    /* a profile is a few KiB; 16 MiB is no profile (lib/files.h: no FIFO, no /dev/zero) */
    char *buf = NULL;
    size_t len = 0;
    int rc = fmoe__read_file_bounded(path, "a hardware profile", (long long)16 << 20, 0, &buf,
                                     &len);
    if (rc < 0) return rc;
    rc = fmoe_hardware_parse(buf, len, path, out);
    free(buf);
    return rc;
}

/* obj.key = v written with 17 significant digits, so that it parses back to the same
 * double: cJSON's own printer keeps 15 when they compare "equal" within DBL_EPSILON, and
 * a profile written back then no longer held the same link (tests/fuzz/crashes/hardware).
 * v is finite (the parser and the measurements give nothing else). */
static void add_exact(cJSON *obj, const char *key, double v) {
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g", v);
    cJSON_AddItemToObject(obj, key, cJSON_CreateRaw(buf));
}

int fmoe_hardware_to_json(const fmoe_hardware_profile *p, char **out) {
    *out = NULL;
    cJSON *root = cJSON_CreateObject();
    if (!root) return fmoe_error_set(FMOE_ENOMEM, "profile JSON");
    cJSON_AddStringToObject(root, "format", FMOE_HARDWARE_FORMAT);
    add_exact(root, "version", FMOE_HARDWARE_VERSION);
    cJSON_AddStringToObject(root, "name", p->name);
    cJSON_AddStringToObject(root, "source", p->source);
    cJSON *link = cJSON_AddObjectToObject(root, "link");
    add_exact(link, "alpha_s", p->alpha_s);
    add_exact(link, "beta_bytes_per_s", p->beta_bytes_per_s);
    if (p->peak_flops > 0 || p->memory_bandwidth_bytes_per_s > 0) {
        /* only the fields the profile has: a 0 written back would not parse again (a
         * profile with measured compute may have one roofline figure, or none) */
        cJSON *d = cJSON_AddObjectToObject(root, "device");
        if (p->peak_flops > 0) add_exact(d, "peak_flops", p->peak_flops);
        if (p->memory_bandwidth_bytes_per_s > 0)
            add_exact(d, "memory_bandwidth_bytes_per_s",
                                    p->memory_bandwidth_bytes_per_s);
        add_exact(d, "launch_s", p->launch_s);
    }
    if (p->attention.present || p->expert.present || p->head.present ||
        p->layer_overhead.present) {
        cJSON *c = cJSON_AddObjectToObject(root, "compute");
        if (p->attention.present) {
            cJSON *a = cJSON_AddObjectToObject(c, "attention_s");
            add_exact(a, "base", p->attention.base_s);
            add_exact(a, "per_token", p->attention.per_token_s);
            add_exact(a, "per_token_context", p->attention.per_token_context_s);
        }
        if (p->expert.present) {
            cJSON *e = cJSON_AddObjectToObject(c, "expert_s");
            add_exact(e, "base", p->expert.base_s);
            add_exact(e, "per_token", p->expert.per_token_s);
        }
        if (p->head.present) {
            cJSON *e = cJSON_AddObjectToObject(c, "head_s");
            add_exact(e, "base", p->head.base_s);
            add_exact(e, "per_token", p->head.per_token_s);
        }
        if (p->layer_overhead.present) {
            cJSON *e = cJSON_AddObjectToObject(c, "layer_overhead_s");
            add_exact(e, "base", p->layer_overhead.base_s);
            add_exact(e, "per_token", p->layer_overhead.per_token_s);
        }
    }
    if (p->host_expert.present || p->host_peak_flops > 0) {
        cJSON *h = cJSON_AddObjectToObject(root, "host");
        if (p->host_expert.present) {
            cJSON *e = cJSON_AddObjectToObject(h, "expert_s");
            add_exact(e, "base", p->host_expert.base_s);
            add_exact(e, "per_token", p->host_expert.per_token_s);
        }
        if (p->host_peak_flops > 0 && p->host_memory_bandwidth_bytes_per_s > 0) {
            add_exact(h, "peak_flops", p->host_peak_flops);
            add_exact(h, "memory_bandwidth_bytes_per_s",
                                    p->host_memory_bandwidth_bytes_per_s);
        }
    }
    if (p->match_s > 0) { /* optional: written only when the matcher was timed */
        cJSON *m = cJSON_AddObjectToObject(root, "matcher");
        add_exact(m, "match_s", p->match_s);
    }
    if (p->promoe_s > 0 || p->duoserve_s > 0) { /* optional: only what was timed */
        cJSON *m = cJSON_AddObjectToObject(root, "predictor");
        if (p->promoe_s > 0) add_exact(m, "promoe_s", p->promoe_s);
        if (p->duoserve_s > 0) add_exact(m, "duoserve_s", p->duoserve_s);
    }
    *out = cJSON_Print(root);
    cJSON_Delete(root);
    return *out ? 0 : fmoe_error_set(FMOE_ENOMEM, "profile JSON");
}
