/*
 * inspect_gguf.c - `fmoe inspect FILE.gguf`: what a GGUF file holds and what fmoe can do
 * with it: format, architecture and geometry (fmoe_gguf_config_json), tensor types with
 * their counts and bytes, the routed experts' types, the tensors of types fmoe does not
 * compute with, and a split model's shards with the tensors each holds.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd_common.h"
#include "fmoe/error.h"
#include "files.h"
#include "fmoe/geometry.h"
#include "fmoe/gguf.h"
#include "fmoe/quant.h"

static const char *const CMD = "inspect";

int cmd_inspect_gguf(const char *path, int json) {
    fmoe_gguf *g;
    int rc = fmoe_gguf_open(path, &g);
    if (rc < 0) return cmd_fail(CMD, rc);
    int64_t count[FMOE_GGML_TYPE_END] = {0}, bytes[FMOE_GGML_TYPE_END] = {0};
    int64_t unsupported = 0, total = 0;
    const char *first_unsupported = NULL;
    const int32_t n_shards = fmoe_gguf_shard_count(g);
    int64_t *per_shard = calloc((size_t)n_shards, sizeof *per_shard);
    if (!per_shard) {
        fmoe_gguf_close(g);
        return cmd_fail(CMD, fmoe_error_set(FMOE_ENOMEM, "out of memory"));
    }
    for (int64_t i = 0; i < fmoe_gguf_tensor_count(g); i++) {
        const fmoe_gguf_tensor *t = fmoe_gguf_tensor_at(g, i);
        per_shard[t->shard]++;
        count[t->type]++;
        bytes[t->type] += t->nbytes;
        total += t->nbytes;
        if (!fmoe_quant_supported(t->type)) {
            unsupported++;
            if (!first_unsupported) first_unsupported = t->name;
        }
    }
    fmoe_gguf_str arch = {"?", 1};
    (void)fmoe_gguf_get_str(g, "general.architecture", &arch);
    /* Geometry: optional (a GGUF of another architecture is still listed). */
    char *config = NULL, fp[65] = "";
    int exact = 0, have_geo = 0;
    fmoe_model_geometry *geo = calloc(1, sizeof *geo);
    char geo_error[256] = "";
    if (geo && fmoe_gguf_config_json(g, &config, &exact) == 0 &&
        fmoe_geometry_parse(config, strlen(config), geo) == 0 &&
        fmoe_config_fingerprint(config, strlen(config), fp) == 0)
        have_geo = 1;
    else
        snprintf(geo_error, sizeof geo_error, "%s", fmoe_error_detail());
    /* The routed experts' types: those of layer 0's (or the first MoE layer's) tensors. */
    const char *const exps[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    const char *exp_type[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3 && have_geo && geo->num_moe_layers > 0; k++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.%s.weight", geo->moe_layer_index[0], exps[k]);
        const fmoe_gguf_tensor *t = fmoe_gguf_find_tensor(g, name);
        exp_type[k] = t ? fmoe_ggml_type_name(t->type) : NULL;
    }

    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "format", "gguf");
        cJSON_AddNumberToObject(d, "version", fmoe_gguf_version(g));
        char a[64];
        snprintf(a, sizeof a, "%.*s", (int)(arch.len < 63 ? arch.len : 63), arch.ptr);
        cJSON_AddStringToObject(d, "architecture", a);
        cJSON_AddNumberToObject(d, "keys", (double)fmoe_gguf_kv_count(g));
        cJSON_AddNumberToObject(d, "tensors", (double)fmoe_gguf_tensor_count(g));
        cJSON_AddNumberToObject(d, "alignment", fmoe_gguf_alignment(g));
        cJSON_AddNumberToObject(d, "data_offset", (double)fmoe_gguf_data_offset(g));
        cJSON_AddNumberToObject(d, "tensor_bytes", (double)total);
        if (n_shards > 1) {
            cJSON *sh = cJSON_AddArrayToObject(d, "shards");
            for (int32_t i = 0; i < n_shards; i++) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "path", fmoe_gguf_shard_name(g, i));
                cJSON_AddNumberToObject(o, "tensors", (double)per_shard[i]);
                cJSON_AddItemToArray(sh, o);
            }
        }
        cJSON *types = cJSON_AddObjectToObject(d, "types");
        for (int t = 0; t < FMOE_GGML_TYPE_END; t++) {
            if (!count[t]) continue;
            cJSON *o = cJSON_AddObjectToObject(types, fmoe_ggml_type_name((uint32_t)t));
            cJSON_AddNumberToObject(o, "tensors", (double)count[t]);
            cJSON_AddNumberToObject(o, "bytes", (double)bytes[t]);
            cJSON_AddBoolToObject(o, "supported", fmoe_quant_supported((uint32_t)t));
        }
        if (have_geo) {
            cJSON *m = cJSON_AddObjectToObject(d, "model");
            cJSON_AddStringToObject(m, "model_type", geo->model_type);
            cJSON_AddStringToObject(m, "config", exact ? "fmoe.hf_config" : "built from GGUF metadata");
            cJSON_AddStringToObject(m, "fingerprint", fp);
            cJSON_AddNumberToObject(m, "layers", geo->num_hidden_layers);
            cJSON_AddNumberToObject(m, "moe_layers", geo->num_moe_layers);
            cJSON_AddNumberToObject(m, "experts", geo->num_experts);
            cJSON_AddNumberToObject(m, "top_k", geo->top_k);
            cJSON_AddNumberToObject(m, "shared_experts", geo->num_shared_experts);
            cJSON_AddNumberToObject(m, "hidden_size", geo->hidden_size);
            cJSON_AddNumberToObject(m, "moe_intermediate_size", geo->moe_intermediate_size);
            cJSON *et = cJSON_AddObjectToObject(m, "expert_types");
            for (int k = 0; k < 3; k++)
                if (exp_type[k]) cJSON_AddStringToObject(et, exps[k], exp_type[k]);
        } else {
            cJSON_AddStringToObject(d, "model_error", geo_error);
        }
        cmd_print_json(d);
    } else {
        char b[32];
        printf("%s: GGUF v%u, architecture %.*s, %lld tensors (%s), %lld keys\n", path,
               fmoe_gguf_version(g), (int)(arch.len < 64 ? arch.len : 64), arch.ptr,
               (long long)fmoe_gguf_tensor_count(g), cmd_format_bytes((double)total, b, sizeof b),
               (long long)fmoe_gguf_kv_count(g));
        if (n_shards > 1) {
            printf("  shards       %d:", n_shards);
            for (int32_t i = 0; i < n_shards; i++)
                printf("%s %s (%lld tensors)", i ? "," : "", fmoe_gguf_shard_name(g, i),
                       (long long)per_shard[i]);
            printf("\n");
        }
        if (have_geo) {
            printf("  model        %s, %d layers (%d MoE) x %d experts, top-%d, %d shared, hidden "
                   "%d, expert width %d\n",
                   geo->model_type, geo->num_hidden_layers, geo->num_moe_layers, geo->num_experts,
                   geo->top_k, geo->num_shared_experts, geo->hidden_size,
                   geo->moe_intermediate_size);
            printf("  fingerprint  %.12s (%s)\n", fp,
                   exact ? "the checkpoint's: config.json kept in fmoe.hf_config"
                         : "of a config built from GGUF metadata, not the checkpoint's");
            if (exp_type[0] || exp_type[1] || exp_type[2])
                printf("  experts      gate %s, up %s, down %s\n", exp_type[0] ? exp_type[0] : "-",
                       exp_type[1] ? exp_type[1] : "-", exp_type[2] ? exp_type[2] : "-");
        } else {
            printf("  model        none: %s\n", geo_error);
        }
        printf("  types       ");
        for (int t = 0; t < FMOE_GGML_TYPE_END; t++)
            if (count[t])
                printf(" %s %lld (%s)", fmoe_ggml_type_name((uint32_t)t), (long long)count[t],
                       cmd_format_bytes((double)bytes[t], b, sizeof b));
        printf("\n");
        if (unsupported)
            printf("  unsupported  %lld tensors of types fmoe does not compute with (first: %s)\n",
                   (long long)unsupported, first_unsupported);
    }
    free(per_shard);
    free(config);
    free(geo);
    fmoe_gguf_close(g);
    return CMD_EXIT_OK;
}
