/*
 * fingerprint.c - the model fingerprint of docs/design.md §4: sha256 of the canonical
 * config.json (fmoe/geometry.h gives the canonical form exactly).
 *
 * Canonical means parsed, every object's members stably sorted by key, and printed
 * without whitespace, so that formatting and key order do not change the digest. The
 * sort is a merge sort over an array of the members, relinked into cJSON's list
 * afterwards: stable, so duplicate keys keep their input order.
 */
#include "fmoe/geometry.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "sha256.h"

#include "geometry_impl.h"

static int key_cmp(const cJSON *a, const cJSON *b) {
    return strcmp(a->string ? a->string : "", b->string ? b->string : "");
}

/* Stable merge sort of n items through scratch `tmp`. */
static void merge_sort(cJSON **v, cJSON **tmp, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(v, tmp, h);
    merge_sort(v + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = key_cmp(v[j], v[i]) < 0 ? v[j++] : v[i++];
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

/* Sorts every object's members by key, recursively. Depth is bounded by cJSON's nesting
 * limit (CJSON_NESTING_LIMIT, 1000). */
static int sort_keys(cJSON *node) {
    if (!cJSON_IsObject(node) && !cJSON_IsArray(node)) return 0;
    size_t n = 0;
    for (cJSON *c = node->child; c; c = c->next) {
        FMOE_FORWARD_IF_ERROR(sort_keys(c));
        n++;
    }
    if (!cJSON_IsObject(node) || n < 2) return 0;
    cJSON **v = malloc(2 * n * sizeof *v);
    if (!v) return fmoe_error_set(FMOE_ENOMEM, "out of memory sorting %zu keys", n);
    size_t i = 0;
    for (cJSON *c = node->child; c; c = c->next) v[i++] = c;
    merge_sort(v, v + n, n);
    /* Relink in the cJSON convention: child->prev is the last element, last->next NULL. */
    for (i = 0; i < n; i++) {
        v[i]->next = i + 1 < n ? v[i + 1] : NULL;
        v[i]->prev = i > 0 ? v[i - 1] : v[n - 1];
    }
    node->child = v[0];
    free(v);
    return 0;
}

int fmoe_config_fingerprint(const char *json, size_t len, char hex[65]) {
    if (!hex) return fmoe_error_set(FMOE_EINVAL, "hex output is NULL");
    cJSON *root = NULL;
    FMOE_FORWARD_IF_ERROR(fmoe__config_json_parse(json, len, &root));
    int rc = sort_keys(root);
    if (rc == 0) {
        char *canon = cJSON_PrintUnformatted(root);
        if (!canon) {
            rc = fmoe_error_set(FMOE_ENOMEM, "out of memory printing canonical JSON");
        } else {
            fmoe_sha256_hex(canon, strlen(canon), hex);
            cJSON_free(canon);
        }
    }
    cJSON_Delete(root);
    return rc;
}
