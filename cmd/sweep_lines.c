/*
 * sweep_lines.c - a sweep cell's result as one JSON line, and the result file of
 * `fmoe simulate --sweep-out` (contract in sweep.h).
 *
 * A line is {"cell": {trace, hardware, policy, cache_experts, prefetch_distance},
 * "result": {every field of fmoe_sim_result}, "wall_s": seconds}; per-layer and per-phase
 * counters are arrays in the order of LAYER_FIELDS. Numbers are written here, not by cJSON:
 * its printer settles for 15 digits when they read back within an epsilon, which can be
 * an ulp off, and prints large integers through a double. Doubles are "%.17g" (strtod
 * reads them back to the same bits), integers "%lld"; an undefined ratio (NAN) is null.
 * cJSON's parser reads doubles with strtod, exact; integers are exact below 2^53.
 *
 * The file: line 1 {"fmoe_sweep": 1, "settings": "..."}, then cell lines in the order cells
 * finished, each written with its newline and flushed at once, so a kill leaves whole lines
 * and at most one torn last line, which resume cuts off.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd_common.h"
#include "sweep.h"

#define SWEEP_FORMAT 1

const char *cmd_sweep_key_string(const cmd_sweep_key *k, char *buf, size_t cap) {
    snprintf(buf, cap, "%s\x1f%s\x1f%s\x1f%s\x1f%d\x1f%d", k->trace,
             k->trace_id ? k->trace_id : "", k->hardware, k->policy, (int)k->cache_experts,
             (int)k->prefetch_distance);
    return buf;
}

/* ------------------------------------------------------------------ result <-> JSON */

#define I64_FIELDS(X)                                                                          \
    X(accesses) X(hits) X(late_hits) X(misses) X(bypassed) X(prefetches) X(prefetch_hits)      \
    X(bytes_loaded) X(wasted_prefetch_bytes) X(host_misses)
#define F64_FIELDS(X)                                                                          \
    X(stall_s) X(total_s) X(prefetch_precision) X(prefetch_recall) X(goodpred) X(host_busy_s)
#define I32_FIELDS(X) X(cache_experts) X(prefetch_distance) X(miss_mode) X(variant) X(batch)
#define SUMMARY_FIELDS(X) X(ttft_s) X(tpot_s) X(e2e_s) X(queue_s)
/* fmoe_sim_layer_stats, in array order */
#define LAYER_FIELDS(X)                                                                        \
    X(accesses) X(hits) X(late_hits) X(misses) X(bytes_loaded) X(stall_s) X(prefetches)       \
    X(prefetch_hits) X(wasted_prefetch_bytes) X(host_misses)

/* A number as exact JSON text: an integer as itself, a double to 17 digits, NAN (or an
 * infinity, which no result holds) as null. */
static cJSON *exact_double(double v) {
    if (!isfinite(v)) return cJSON_CreateNull();
    char b[40];
    snprintf(b, sizeof b, "%.17g", v);
    return cJSON_CreateRaw(b);
}

static cJSON *exact_int(int64_t v) {
    char b[24];
    snprintf(b, sizeof b, "%lld", (long long)v);
    return cJSON_CreateRaw(b);
}

/* An integer field as an integer, a floating one as a double (_Generic picks by type). */
#define EXACT(v) _Generic((v), double: exact_double, default: exact_int)(v)

static cJSON *layer_json(const fmoe_sim_layer_stats *s) {
    cJSON *a = cJSON_CreateArray();
#define X(f) cJSON_AddItemToArray(a, EXACT(s->f));
    LAYER_FIELDS(X)
#undef X
    return a;
}

char *cmd_sweep_line(const cmd_sweep_key *k, const fmoe_sim_result *r, double wall_s) {
    cJSON *root = cJSON_CreateObject();
    cJSON *cell = cJSON_AddObjectToObject(root, "cell");
    cJSON_AddStringToObject(cell, "trace", k->trace);
    cJSON_AddStringToObject(cell, "trace_id", k->trace_id ? k->trace_id : "");
    cJSON_AddStringToObject(cell, "hardware", k->hardware);
    cJSON_AddStringToObject(cell, "policy", k->policy);
    cJSON_AddItemToObject(cell, "cache_experts", exact_int(k->cache_experts));
    cJSON_AddItemToObject(cell, "prefetch_distance", exact_int(k->prefetch_distance));
    cJSON *x = cJSON_AddObjectToObject(root, "result");
    cJSON_AddStringToObject(x, "policy", r->policy);
#define X(f) cJSON_AddItemToObject(x, #f, exact_int(r->f));
    I64_FIELDS(X)
    I32_FIELDS(X)
#undef X
#define X(f) cJSON_AddItemToObject(x, #f, exact_double(r->f));
    F64_FIELDS(X)
#undef X
#define X(f)                                                                                   \
    {                                                                                          \
        cJSON *s = cJSON_AddArrayToObject(x, #f);                                              \
        cJSON_AddItemToArray(s, exact_double(r->f.mean));                                      \
        cJSON_AddItemToArray(s, exact_double(r->f.p50));                                       \
        cJSON_AddItemToArray(s, exact_double(r->f.p90));                                       \
        cJSON_AddItemToArray(s, exact_double(r->f.p99));                                       \
    }
    SUMMARY_FIELDS(X)
#undef X
    cJSON *phases = cJSON_AddArrayToObject(x, "per_phase");
    for (int p = 0; p < 2; p++) cJSON_AddItemToArray(phases, layer_json(&r->per_phase[p]));
    cJSON *layers = cJSON_AddArrayToObject(x, "per_layer");
    for (int32_t l = 0; l < r->num_layers; l++)
        cJSON_AddItemToArray(layers, layer_json(&r->per_layer[l]));
    cJSON_AddItemToObject(root, "wall_s", exact_double(wall_s));
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

static int get_number(const cJSON *o, const char *key, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNull(v)) {
        *out = NAN;
        return 0;
    }
    if (!cJSON_IsNumber(v)) return -1;
    *out = v->valuedouble;
    return 0;
}

static int get_array(const cJSON *a, int n, double *out) {
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n) return -1;
    int i = 0;
    for (const cJSON *v = a->child; v; v = v->next, i++) {
        if (cJSON_IsNull(v)) out[i] = NAN;
        else if (cJSON_IsNumber(v)) out[i] = v->valuedouble;
        else return -1;
    }
    return 0;
}

static int layer_from(const cJSON *a, fmoe_sim_layer_stats *s) {
    double v[10];
    if (get_array(a, 10, v) < 0) return -1;
    int i = 0;
#define X(f) s->f = (__typeof__(s->f))v[i++];
    LAYER_FIELDS(X)
#undef X
    return 0;
}

static int result_from(const cJSON *x, fmoe_sim_result *r) {
    memset(r, 0, sizeof *r);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(x, "policy");
    if (!cJSON_IsString(p) || strlen(p->valuestring) >= sizeof r->policy) return -1;
    strcpy(r->policy, p->valuestring);
    double v;
#define X(f)                                                                                   \
    if (get_number(x, #f, &v) < 0) return -1;                                                  \
    r->f = (__typeof__(r->f))v;
    I64_FIELDS(X)
    I32_FIELDS(X)
    F64_FIELDS(X)
#undef X
    double s[4];
#define X(f)                                                                                   \
    if (get_array(cJSON_GetObjectItemCaseSensitive(x, #f), 4, s) < 0) return -1;              \
    r->f = (fmoe_sim_summary){s[0], s[1], s[2], s[3]};
    SUMMARY_FIELDS(X)
#undef X
    const cJSON *phases = cJSON_GetObjectItemCaseSensitive(x, "per_phase");
    if (!cJSON_IsArray(phases) || cJSON_GetArraySize(phases) != 2) return -1;
    if (layer_from(phases->child, &r->per_phase[0]) < 0 ||
        layer_from(phases->child->next, &r->per_phase[1]) < 0)
        return -1;
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(x, "per_layer");
    if (!cJSON_IsArray(layers)) return -1;
    const int L = cJSON_GetArraySize(layers);
    if (L > 0) {
        r->per_layer = calloc((size_t)L, sizeof *r->per_layer);
        if (!r->per_layer) return -1;
        r->num_layers = L;
        int l = 0;
        for (const cJSON *a = layers->child; a; a = a->next, l++)
            if (layer_from(a, &r->per_layer[l]) < 0) return -1;
    }
    return 0;
}

int cmd_sweep_line_parse(const char *line, char *key, size_t cap, fmoe_sim_result *r) {
    memset(r, 0, sizeof *r);
    cJSON *root = cJSON_Parse(line);
    const cJSON *cell = cJSON_GetObjectItemCaseSensitive(root, "cell");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cell, "trace");
    /* absent in files written before traces were identified: "", which no trace is */
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(cell, "trace_id");
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(cell, "hardware");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(cell, "policy");
    double c, d;
    int rc = -1;
    if (cJSON_IsString(t) && cJSON_IsString(h) && cJSON_IsString(p) &&
        get_number(cell, "cache_experts", &c) == 0 && get_number(cell, "prefetch_distance", &d) == 0 &&
        result_from(cJSON_GetObjectItemCaseSensitive(root, "result"), r) == 0) {
        const cmd_sweep_key k = {t->valuestring, h->valuestring, p->valuestring, (int32_t)c,
                                 (int32_t)d, cJSON_IsString(id) ? id->valuestring : ""};
        cmd_sweep_key_string(&k, key, cap);
        rc = 0;
    }
    if (rc < 0) fmoe_sim_result_free(r);
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------------ the file */

struct cmd_sweep_file {
    FILE *f;
    int bad;
};

typedef struct keyed {
    const char *key;
    size_t cell;
} keyed;

static int cmp_keyed(const void *a, const void *b) {
    return strcmp(((const keyed *)a)->key, ((const keyed *)b)->key);
}

/* Reads the whole file (malloc'd, NUL-terminated) into *text, *len. */
static int slurp(FILE *f, char **text, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *g = realloc(buf, cap *= 2);
        if (!g) free(buf);
        buf = g;
    }
    if (!buf || ferror(f)) {
        free(buf);
        return -1;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return 0;
}

static char *settings_line(const char *settings) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "fmoe_sweep", SWEEP_FORMAT);
    cJSON_AddStringToObject(o, "settings", settings);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* A line of a cell not in the sweep is kept, unless its trace is a path of the sweep with
 * another identity: the trace was replaced after those cells ran, and its rows would be
 * printed under the new trace's header. @return 0 or 1 (printed). */
static int other_identity(const char *cmd, const char *path, int64_t lineno, const char *key,
                          size_t n, char *const *keys) {
    const char *sep = strchr(key, '\x1f');
    if (!sep) return 0;
    const size_t tlen = (size_t)(sep - key);
    const char *id = sep + 1;
    const size_t idlen = strcspn(id, "\x1f");
    for (size_t i = 0; i < n; i++) {
        if (strncmp(keys[i], key, tlen + 1) != 0) continue; /* another trace path */
        const char *mine = keys[i] + tlen + 1;
        const size_t mlen = strcspn(mine, "\x1f");
        if (mlen == idlen && strncmp(mine, id, idlen) == 0) continue; /* the same trace */
        return cmd_failf(cmd,
                         "%s: line %lld is a cell of %.*s as it was when the sweep ran "
                         "(identity %.*s), but %.*s is now another trace (identity %.*s): "
                         "it was replaced; resume with the trace the file was written for, or "
                         "use another file",
                         path, (long long)lineno, (int)tlen, key,
                         idlen ? (int)idlen : 4, idlen ? id : "none", (int)tlen, key,
                         (int)mlen, mine);
    }
    return 0;
}

/* Resumes from the lines of an existing file; sets *keep_bytes to the length of its whole
 * lines. @return 0 or 1 (printed). */
static int load(const char *cmd, const char *path, const char *settings, FILE *f, size_t n,
                char *const *keys, fmoe_sim_result *results, uint8_t *done, size_t *n_done,
                long *keep_bytes) {
    char *text = NULL;
    size_t len = 0;
    if (slurp(f, &text, &len) < 0) return cmd_failf(cmd, "%s: cannot read: %s", path, strerror(errno));
    int rc = 0;
    /* keys sorted with their cell index, for lookup */
    keyed *sorted = malloc((n ? n : 1) * sizeof *sorted);
    char *key = malloc(8192);
    if (!sorted || !key) {
        rc = cmd_failf(cmd, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) sorted[i] = (keyed){keys[i], i};
    qsort(sorted, n, sizeof *sorted, cmp_keyed);
    char *line = text;
    int64_t lineno = 0;
    *keep_bytes = 0;
    while (*line) {
        char *nl = strchr(line, '\n');
        if (!nl) break; /* a torn last line: cut off */
        *nl = '\0';
        lineno++;
        if (lineno == 1) {
            char *want = settings_line(settings);
            if (!want || strcmp(line, want) != 0) {
                cJSON *o = cJSON_Parse(line);
                const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "settings");
                if (cJSON_IsString(s))
                    rc = cmd_failf(cmd, "%s was written by a sweep with other settings (%s; this "
                                        "one: %s): resume it with those, or use another file",
                                   path, s->valuestring, settings);
                else
                    rc = cmd_failf(cmd, "%s: line 1 is not a sweep's settings line: not a "
                                        "--sweep-out file", path);
                cJSON_Delete(o);
                free(want);
                goto out;
            }
            free(want);
        } else {
            fmoe_sim_result r;
            if (cmd_sweep_line_parse(line, key, 8192, &r) < 0) {
                rc = cmd_failf(cmd, "%s: line %lld is not a cell's result line", path,
                               (long long)lineno);
                goto out;
            }
            const keyed want = {key, 0};
            const keyed *hit = bsearch(&want, sorted, n, sizeof *sorted, cmp_keyed);
            if (!hit && (rc = other_identity(cmd, path, lineno, key, n, keys)) != 0) {
                fmoe_sim_result_free(&r);
                goto out;
            }
            if (hit) { /* a line of a cell not in this sweep is kept, not used */
                const size_t i = hit->cell;
                if (!done[i]) {
                    results[i] = r;
                    done[i] = 1;
                    (*n_done)++;
                    r.per_layer = NULL;
                }
            }
            fmoe_sim_result_free(&r);
        }
        *keep_bytes = (long)(nl + 1 - text);
        line = nl + 1;
    }
out:
    free(key);
    free(sorted);
    free(text);
    return rc;
}

int cmd_sweep_file_open(const char *cmd, const char *path, const char *settings, int resume,
                        size_t n, char *const *keys, fmoe_sim_result *results, uint8_t *done,
                        size_t *n_done, cmd_sweep_file **out) {
    *out = NULL;
    *n_done = 0;
    struct stat st;
    const int exists = stat(path, &st) == 0;
    if (exists && !S_ISREG(st.st_mode)) return cmd_failf(cmd, "%s: not a regular file", path);
    if (exists && !resume)
        return cmd_usage_error(cmd, "%s exists: --resume completes the sweep it holds (or "
                                    "remove it)",
                               path);
    FILE *f = fopen(path, exists ? "r+" : "w");
    if (!f) return cmd_failf(cmd, "%s: cannot open: %s", path, strerror(errno));
    int rc = 0;
    if (exists) {
        long keep = 0;
        rc = load(cmd, path, settings, f, n, keys, results, done, n_done, &keep);
        if (rc == 0 && keep == 0) { /* empty, or only a torn settings line: start afresh */
            char *s = settings_line(settings);
            rc = s && ftruncate(fileno(f), 0) == 0 && fseek(f, 0, SEEK_SET) == 0 &&
                         fprintf(f, "%s\n", s) > 0
                     ? 0
                     : cmd_failf(cmd, "%s: cannot write: %s", path, strerror(errno));
            free(s);
        } else if (rc == 0 && (ftruncate(fileno(f), keep) != 0 || fseek(f, keep, SEEK_SET) != 0)) {
            rc = cmd_failf(cmd, "%s: cannot cut its torn last line: %s", path, strerror(errno));
        }
    } else {
        char *s = settings_line(settings);
        if (!s || fprintf(f, "%s\n", s) < 0)
            rc = cmd_failf(cmd, "%s: cannot write: %s", path, strerror(errno));
        free(s);
    }
    if (rc == 0 && fflush(f) != 0) rc = cmd_failf(cmd, "%s: cannot write: %s", path, strerror(errno));
    if (rc) {
        fclose(f);
        return rc;
    }
    cmd_sweep_file *sf = calloc(1, sizeof *sf);
    if (!sf) {
        fclose(f);
        return cmd_failf(cmd, "out of memory");
    }
    sf->f = f;
    *out = sf;
    return 0;
}

int cmd_sweep_file_append(cmd_sweep_file *f, const char *line) {
    if (fputs(line, f->f) < 0 || fputc('\n', f->f) < 0 || fflush(f->f) != 0) {
        f->bad = 1;
        return -1;
    }
    return 0;
}

int cmd_sweep_file_close(cmd_sweep_file *f) {
    if (!f) return 0;
    int bad = f->bad | (fclose(f->f) != 0);
    free(f);
    return bad ? -1 : 0;
}
