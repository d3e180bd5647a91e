/*
 * quant_tool.c - a test driver that exposes lib/quant.c and lib/gguf.c to
 * tests/python/test_gguf_quants.py, which compares them with the gguf Python package.
 *
 *   quant_tool dequant TYPE IN OUT   raw blocks of TYPE -> f32 (little-endian) values
 *   quant_tool quant TYPE IN OUT [IMPORTANCE]
 *                                    f32 values -> raw blocks of TYPE (IMPORTANCE: f32
 *                                    importance-matrix entries, one per value)
 *   quant_tool dot TYPE ROWS X OUT   for each row of ROWS (rows of len(X) values):
 *                                    fmoe_quant_dot and fmoe_quant_dot_ref, two f32 each
 *   quant_tool map ARCH NHEAD NKV NAME...
 *                                    per HF tensor NAME one line: GGUF-NAME EXPERT HEADS
 *                                    (fmoe_gguf_tensor_for), "-" when there is none
 *   quant_tool dump FILE.gguf DIR    DIR/meta.json (version, alignment, data offset, every
 *                                    key with its type and values, every tensor's type,
 *                                    extents and offset) and DIR/<tensor>.f32 (its values
 *                                    dequantised) for every tensor of a supported type
 * Errors: the library's one-line detail on stderr, exit 1; usage errors exit 2.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/gguf.h"
#include "fmoe/quant.h"

static void *slurp(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc((size_t)*len + 1);
    if (buf && fread(buf, 1, (size_t)*len, f) != (size_t)*len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

static int spill(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    const int ok = fwrite(buf, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int parse_type(const char *name, fmoe_ggml_type *t) {
    if (fmoe_ggml_type_parse(name, t) != 0 || !fmoe_quant_supported(*t)) {
        fprintf(stderr, "quant_tool: unknown or unsupported type %s\n", name);
        return -1;
    }
    return 0;
}

static cJSON *kv_json(const fmoe_gguf_kv *kv) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "key", kv->key);
    cJSON_AddStringToObject(o, "type", fmoe_gguf_value_type_name(kv->type));
    cJSON_AddStringToObject(o, "elem", fmoe_gguf_value_type_name(kv->elem));
    cJSON *vals = cJSON_AddArrayToObject(o, "values");
    for (uint64_t i = 0; i < kv->count; i++) {
        if (kv->elem == FMOE_GGUF_STRING) {
            char *s = malloc(kv->strs[i].len + 1);
            memcpy(s, kv->strs[i].ptr, kv->strs[i].len);
            s[kv->strs[i].len] = '\0';
            cJSON_AddItemToArray(vals, cJSON_CreateString(s));
            free(s);
        } else {
            cJSON_AddItemToArray(vals, cJSON_CreateNumber(fmoe_gguf_kv_number(kv, i)));
        }
    }
    return o;
}

static int dump(const char *path, const char *dir) {
    fmoe_gguf *g;
    if (fmoe_gguf_open(path, &g) < 0) {
        fprintf(stderr, "%s\n", fmoe_error_detail());
        return 1;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "version", fmoe_gguf_version(g));
    cJSON_AddNumberToObject(root, "alignment", fmoe_gguf_alignment(g));
    cJSON_AddNumberToObject(root, "data_offset", (double)fmoe_gguf_data_offset(g));
    cJSON *kvs = cJSON_AddArrayToObject(root, "kv");
    for (int64_t i = 0; i < fmoe_gguf_kv_count(g); i++)
        cJSON_AddItemToArray(kvs, kv_json(fmoe_gguf_kv_at(g, i)));
    cJSON *ts = cJSON_AddArrayToObject(root, "tensors");
    int rc = 0;
    for (int64_t i = 0; i < fmoe_gguf_tensor_count(g) && rc == 0; i++) {
        const fmoe_gguf_tensor *t = fmoe_gguf_tensor_at(g, i);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", t->name);
        cJSON_AddStringToObject(o, "type", fmoe_ggml_type_name(t->type));
        cJSON *ne = cJSON_AddArrayToObject(o, "ne");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(ne, cJSON_CreateNumber((double)t->ne[d]));
        cJSON_AddNumberToObject(o, "offset", (double)t->offset);
        cJSON_AddNumberToObject(o, "nbytes", (double)t->nbytes);
        cJSON_AddItemToArray(ts, o);
        if (!fmoe_quant_supported(t->type)) continue;
        float *y = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *y);
        const int64_t rows = t->ne[0] ? t->numel / t->ne[0] : 0;
        for (int64_t r = 0; r < rows; r++)
            fmoe_quant_dequantize_row(t->type, (const uint8_t *)t->data + r * t->row_bytes,
                                      y + r * t->ne[0], t->ne[0]);
        char out[4096];
        snprintf(out, sizeof out, "%s/%s.f32", dir, t->name);
        if (spill(out, y, (size_t)t->numel * sizeof *y) != 0) {
            fprintf(stderr, "quant_tool: cannot write %s\n", out);
            rc = 1;
        }
        free(y);
    }
    char *text = cJSON_PrintUnformatted(root);
    char out[4096];
    snprintf(out, sizeof out, "%s/meta.json", dir);
    if (rc == 0 && spill(out, text, strlen(text)) != 0) {
        fprintf(stderr, "quant_tool: cannot write %s\n", out);
        rc = 1;
    }
    free(text);
    cJSON_Delete(root);
    fmoe_gguf_close(g);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "dump") == 0) return dump(argv[2], argv[3]);
    if (argc >= 5 && strcmp(argv[1], "map") == 0) {
        for (int i = 5; i < argc; i++) {
            fmoe_gguf_tensor_ref ref;
            if (fmoe_gguf_tensor_for(argv[2], atoi(argv[3]), atoi(argv[4]), argv[i], &ref) == 0)
                printf("%s %d %d\n", ref.name, ref.expert, ref.permute_heads);
            else
                printf("- -1 0\n");
        }
        return 0;
    }
    if (argc < 5) {
        fprintf(stderr, "usage: quant_tool dequant|quant TYPE IN OUT | dot TYPE ROWS X OUT | "
                        "dump FILE DIR\n");
        return 2;
    }
    fmoe_ggml_type t;
    if (parse_type(argv[2], &t) != 0) return 2;
    long len;
    uint8_t *in = slurp(argv[3], &len);
    if (!in) {
        fprintf(stderr, "quant_tool: cannot read %s\n", argv[3]);
        return 1;
    }
    const int32_t bs = fmoe_ggml_block_size(t), ts = fmoe_ggml_type_size(t);
    int rc = 0;
    if (strcmp(argv[1], "dequant") == 0) {
        const int64_t n = len / ts * bs;
        float *y = malloc((size_t)(n ? n : 1) * sizeof *y);
        fmoe_quant_dequantize_row(t, in, y, n);
        rc = spill(argv[4], y, (size_t)n * sizeof *y) != 0;
        free(y);
    } else if (strcmp(argv[1], "quant") == 0) {
        if (!fmoe_quant_can_quantize(t) && !(fmoe_quant_needs_importance(t) && argc > 5)) {
            fprintf(stderr, "quant_tool: cannot quantize to %s\n", argv[2]);
            free(in);
            return 2;
        }
        const int64_t n = len / 4;
        const int64_t nb = fmoe_quant_row_bytes(t, n);
        if (nb < 0) {
            fprintf(stderr, "quant_tool: %lld values are not whole blocks of %d\n", (long long)n, bs);
            free(in);
            return 2;
        }
        long wlen = 0;
        float *w = argc > 5 ? slurp(argv[5], &wlen) : NULL;
        if (argc > 5 && (!w || wlen != len)) {
            fprintf(stderr, "quant_tool: %s is not one importance value per input value\n", argv[5]);
            free(in);
            free(w);
            return 2;
        }
        uint8_t *q = malloc((size_t)(nb ? nb : 1));
        fmoe_quant_quantize_row_weighted(t, (const float *)in, w, q, n);
        free(w);
        rc = spill(argv[4], q, (size_t)nb) != 0;
        free(q);
    } else if (strcmp(argv[1], "dot") == 0 && argc == 6) {
        long xlen;
        float *x = slurp(argv[4], &xlen);
        const int64_t n = xlen / 4;
        const int64_t rb = fmoe_quant_row_bytes(t, n);
        if (!x || rb <= 0 || len % rb != 0) {
            fprintf(stderr, "quant_tool: rows do not match x\n");
            free(in);
            free(x);
            return 2;
        }
        const int64_t rows = len / rb;
        float *y = malloc((size_t)(2 * rows + 1) * sizeof *y);
        for (int64_t r = 0; r < rows; r++) {
            y[2 * r] = fmoe_quant_dot(t, in + r * rb, x, n);
            y[2 * r + 1] = fmoe_quant_dot_ref(t, in + r * rb, x, n);
        }
        rc = spill(argv[5], y, (size_t)(2 * rows) * sizeof *y) != 0;
        free(y);
        free(x);
    } else {
        fprintf(stderr, "quant_tool: unknown mode %s\n", argv[1]);
        rc = 2;
    }
    free(in);
    return rc;
}
