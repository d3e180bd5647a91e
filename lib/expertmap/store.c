/*
 * store.c - the in-memory expert-map store and its deduplication (fmoe/expertmap.h;
 * POLICIES.md A.1, A.5; fMoE §4.4).
 *
 * Layout: one allocation per array, all made at init. Maps are stored layer-major,
 * [L][C][J], so that the matcher's step at layer l reads one contiguous C x J block.
 * Besides the data (maps, sem, hits)
 * the store keeps what every search needs and would otherwise recompute per query:
 *   sem_norm[C], map_norm[C]   Euclidean norms of each entry's embedding and whole map
 *   prefix_rnorm[L][C]         1 / norm of rows 0..l of each map (0 for a zero prefix),
 *                              layer-major so that the matcher's argmax scans one
 *                              contiguous row per layer
 *   pop[L][J]                  how many live entries have (l, j) among row l's top K
 * Each is updated in O(L·J + h) when an entry changes.
 *
 * Deduplication of a batch of n new entries against a full store: two sgemm calls give the
 * n × C dot products of embeddings and of whole maps; norms turn them into cosines and
 * the fixed weights d/L and (L-d)/L into RDY. Entries are then placed in order; an entry
 * placed earlier in the batch changed a column, and for the later entries that column's
 * RDY is their RDY with the batch entry now in it, which two more small sgemms (the batch
 * against itself) give. The outcome is therefore the same as adding the entries one at a
 * time, which is the rule as the paper states it. Cost per new entry: O((C + n)·(h + L·J))
 * flops in sgemm plus O(C) for the argmax.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "expertmap_impl.h"
#include "fmoe/error.h"
#include "fmoe/expertmap.h"

#define DEFAULT_MAX_BATCH 256

static float rnorm_of(double n2) { return n2 > 0 ? (float)(1.0 / sqrt(n2)) : 0.0f; }

/* Row l of entry y: maps are layer-major, [L][C][J]. */
static inline float *row_of(const fmoe_expertmap *s, int32_t y, int32_t l) {
    return s->maps + ((size_t)l * (size_t)s->cfg.capacity + (size_t)y) * (size_t)s->cfg.num_experts;
}

const float *fmoe_expertmap_row(const fmoe_expertmap *s, int32_t y, int32_t l) {
    return row_of(s, y, l);
}

void fmoe_expertmap_copy_map(const fmoe_expertmap *s, int32_t y, float *out) {
    const int32_t L = s->cfg.num_layers, J = s->cfg.num_experts;
    for (int32_t l = 0; l < L; l++) memcpy(out + (size_t)l * J, row_of(s, y, l), (size_t)J * sizeof *out);
}

/* The K largest of row[0..J) (ties to the lower index) into top[K]; K <= J. */
void fmoe__expertmap_topk(const float *row, int32_t J, int32_t K, int32_t *top) {
    int32_t n = 0;
    for (int32_t j = 0; j < J; j++) {
        /* insertion into a sorted list of at most K; strict > keeps lower indexes first */
        if (n == K && !(row[j] > row[top[K - 1]])) continue;
        int32_t i = n < K ? n++ : K - 1;
        while (i > 0 && row[j] > row[top[i - 1]]) {
            top[i] = top[i - 1];
            i--;
        }
        top[i] = j;
    }
}

static void pop_update(fmoe_expertmap *s, int32_t y, int sign) {
    const int32_t L = s->cfg.num_layers, J = s->cfg.num_experts, K = s->cfg.top_k;
    for (int32_t l = 0; l < L; l++) {
        fmoe__expertmap_topk(row_of(s, y, l), J, K, s->topk);
        for (int32_t k = 0; k < K; k++) {
            uint32_t *c = &s->pop[(size_t)l * J + s->topk[k]];
            *c = sign > 0 ? *c + 1 : *c - 1;
        }
    }
}

/* Recomputes the derived data of entry y from its sem and map. */
static void refresh_entry(fmoe_expertmap *s, int32_t y) {
    const int32_t L = s->cfg.num_layers, J = s->cfg.num_experts, h = s->cfg.semantic_dim;
    const size_t C = (size_t)s->cfg.capacity;
    double acc = 0;
    for (int32_t l = 0; l < L; l++) {
        const float *row = row_of(s, y, l);
        for (int32_t j = 0; j < J; j++) acc += (double)row[j] * row[j];
        s->prefix_rnorm[(size_t)l * C + y] = rnorm_of(acc);
    }
    s->map_norm[y] = (float)sqrt(acc);
    double sn = 0;
    if (h > 0) {
        const float *e = s->sem + (size_t)y * h;
        for (int32_t i = 0; i < h; i++) sn += (double)e[i] * e[i];
    }
    s->sem_norm[y] = (float)sqrt(sn);
}

/* Writes entry y (already counted in size) and keeps popularity in step. `had_old`: y held
 * a live entry being replaced. */
static void write_entry(fmoe_expertmap *s, int32_t y, int had_old, const float *sem,
                        const float *map, uint32_t hits) {
    const int32_t L = s->cfg.num_layers, J = s->cfg.num_experts;
    const int32_t h = s->cfg.semantic_dim;
    if (had_old) pop_update(s, y, -1);
    for (int32_t l = 0; l < L; l++)
        memcpy(row_of(s, y, l), map + (size_t)l * J, (size_t)J * sizeof *map);
    if (h > 0) {
        if (sem)
            memcpy(s->sem + (size_t)y * h, sem, (size_t)h * sizeof *s->sem);
        else
            memset(s->sem + (size_t)y * h, 0, (size_t)h * sizeof *s->sem);
    }
    s->hits[y] = hits;
    pop_update(s, y, +1);
    refresh_entry(s, y);
    s->version++;
}

int fmoe_expertmap_init(fmoe_expertmap **out, const fmoe_expertmap_config *cfg) {
    FMOE_RETURN_ERROR_IF(!out || !cfg, FMOE_EINVAL, "fmoe_expertmap_init: NULL argument");
    *out = NULL;
    FMOE_RETURN_ERROR_IF(cfg->capacity < 1, FMOE_EINVAL,
                         "expert-map store: capacity must be at least 1 entry, got %d",
                         cfg->capacity);
    FMOE_RETURN_ERROR_IF(cfg->num_layers < 1 || cfg->num_experts < 1, FMOE_EINVAL,
                         "expert-map store: bad geometry L=%d J=%d", cfg->num_layers,
                         cfg->num_experts);
    FMOE_RETURN_ERROR_IF(cfg->top_k < 1 || cfg->top_k > cfg->num_experts, FMOE_EINVAL,
                         "expert-map store: top_k %d, expected 1..%d", cfg->top_k,
                         cfg->num_experts);
    FMOE_RETURN_ERROR_IF(cfg->semantic_dim < 0, FMOE_EINVAL,
                         "expert-map store: semantic_dim %d, expected >= 0", cfg->semantic_dim);
    FMOE_RETURN_ERROR_IF(cfg->prefetch_distance < 0 || cfg->prefetch_distance >= cfg->num_layers,
                         FMOE_EINVAL,
                         "expert-map store: prefetch distance %d, expected 0..%d (less than "
                         "the %d MoE layers)",
                         cfg->prefetch_distance, cfg->num_layers - 1, cfg->num_layers);
    FMOE_RETURN_ERROR_IF(cfg->max_batch < 0, FMOE_EINVAL,
                         "expert-map store: max_batch %d, expected >= 0", cfg->max_batch);
    const size_t C = (size_t)cfg->capacity, L = (size_t)cfg->num_layers,
                 J = (size_t)cfg->num_experts, h = (size_t)cfg->semantic_dim;
    const size_t LJ = L * J;
    FMOE_RETURN_ERROR_IF(LJ > (size_t)INT32_MAX || C * (LJ + h) > ((size_t)1 << 40),
                         FMOE_EINVAL,
                         "expert-map store: %zu entries of %zu floats is too large", C, LJ + h);
    fmoe_expertmap *s = calloc(1, sizeof *s);
    if (!s) return fmoe_error_set(FMOE_ENOMEM, "expert-map store");
    s->cfg = *cfg;
    if (s->cfg.max_batch == 0) {
        /* Scratch is max_batch · C floats (twice with embeddings): keep it near 2% of the
         * data, C · (h + L·J) floats, so the store's size is what its entries need. */
        size_t b = (LJ + h) / (h ? 100 : 50);
        s->cfg.max_batch = b < 1 ? 1 : b > DEFAULT_MAX_BATCH ? DEFAULT_MAX_BATCH : (int32_t)b;
    }
    const size_t B = (size_t)s->cfg.max_batch;
    s->maps = malloc(C * LJ * sizeof *s->maps);
    s->sem = h ? malloc(C * h * sizeof *s->sem) : NULL;
    s->hits = calloc(C, sizeof *s->hits);
    s->sem_norm = calloc(C, sizeof *s->sem_norm);
    s->map_norm = calloc(C, sizeof *s->map_norm);
    s->prefix_rnorm = calloc(L * C, sizeof *s->prefix_rnorm);
    s->pop = calloc(LJ, sizeof *s->pop);
    s->topk = malloc((size_t)cfg->top_k * sizeof *s->topk);
    s->rdy = malloc(B * C * sizeof *s->rdy);
    s->tmp = h ? malloc(B * C * sizeof *s->tmp) : NULL;
    s->xnorm_sem = malloc(B * sizeof *s->xnorm_sem);
    s->xnorm_map = malloc(B * sizeof *s->xnorm_map);
    s->placed = malloc(B * sizeof *s->placed);
    s->occupant = malloc(B * sizeof *s->occupant);
    s->pair = malloc(2 * B * B * sizeof *s->pair);
    if (!s->maps || (h && !s->sem) || !s->hits || !s->sem_norm || !s->map_norm ||
        !s->prefix_rnorm || !s->pop || !s->topk || !s->rdy || (h && !s->tmp) || !s->xnorm_sem ||
        !s->xnorm_map || !s->placed || !s->occupant || !s->pair) {
        fmoe_expertmap_free(s);
        return fmoe_error_set(FMOE_ENOMEM, "expert-map store of %zu entries (%zu MiB)", C,
                              (C * (LJ + h) * 4) >> 20);
    }
    *out = s;
    return 0;
}

int fmoe_expertmap_clone(fmoe_expertmap **out, const fmoe_expertmap *src) {
    FMOE_FORWARD_IF_ERROR(fmoe_expertmap_init(out, &src->cfg));
    fmoe_expertmap *s = *out;
    const size_t C = (size_t)src->cfg.capacity, L = (size_t)src->cfg.num_layers,
                 LJ = L * (size_t)src->cfg.num_experts, h = (size_t)src->cfg.semantic_dim;
    const size_t n = (size_t)src->size;
    memcpy(s->maps, src->maps, C * LJ * sizeof *s->maps); /* layer-major: copy all rows */
    if (h) memcpy(s->sem, src->sem, n * h * sizeof *s->sem);
    memcpy(s->hits, src->hits, C * sizeof *s->hits);
    memcpy(s->sem_norm, src->sem_norm, C * sizeof *s->sem_norm);
    memcpy(s->map_norm, src->map_norm, C * sizeof *s->map_norm);
    memcpy(s->prefix_rnorm, src->prefix_rnorm, L * C * sizeof *s->prefix_rnorm);
    memcpy(s->pop, src->pop, LJ * sizeof *s->pop);
    s->size = src->size;
    s->version = src->version;
    return 0;
}

void fmoe_expertmap_free(fmoe_expertmap *s) {
    if (!s) return;
    free(s->maps);
    free(s->sem);
    free(s->hits);
    free(s->sem_norm);
    free(s->map_norm);
    free(s->prefix_rnorm);
    free(s->pop);
    free(s->topk);
    free(s->rdy);
    free(s->tmp);
    free(s->xnorm_sem);
    free(s->xnorm_map);
    free(s->placed);
    free(s->occupant);
    free(s->pair);
    free(s);
}

const fmoe_expertmap_config *fmoe_expertmap_config_of(const fmoe_expertmap *s) { return &s->cfg; }
int32_t fmoe_expertmap_size(const fmoe_expertmap *s) { return s->size; }
const float *fmoe_expertmap_maps(const fmoe_expertmap *s) { return s->maps; }
const float *fmoe_expertmap_semantic(const fmoe_expertmap *s) { return s->sem; }
const uint32_t *fmoe_expertmap_hits(const fmoe_expertmap *s) { return s->hits; }
const uint32_t *fmoe_expertmap_popularity(const fmoe_expertmap *s) { return s->pop; }
uint64_t fmoe_expertmap_version(const fmoe_expertmap *s) { return s->version; }

void fmoe_expertmap_hit(fmoe_expertmap *s, int32_t y) {
    if (y >= 0 && y < s->size && s->hits[y] != UINT32_MAX) s->hits[y]++;
}

void fmoe_expertmap_clear(fmoe_expertmap *s) {
    s->size = 0;
    memset(s->pop, 0, (size_t)s->cfg.num_layers * s->cfg.num_experts * sizeof *s->pop);
    memset(s->hits, 0, (size_t)s->cfg.capacity * sizeof *s->hits);
    s->version++;
}

static int check_finite(const float *v, size_t n, const char *what, int32_t entry) {
    for (size_t i = 0; i < n; i++)
        FMOE_RETURN_ERROR_IF(!isfinite(v[i]), FMOE_EINVAL,
                             "expert-map store: entry %d: %s[%zu] = %g, expected a finite value",
                             entry, what, i, (double)v[i]);
    return 0;
}

int fmoe_expertmap_set(fmoe_expertmap *s, int32_t y, const float *sem, const float *map,
                       uint32_t hits) {
    FMOE_RETURN_ERROR_IF(!map, FMOE_EINVAL, "fmoe_expertmap_set: NULL map");
    FMOE_RETURN_ERROR_IF(y < 0 || y > s->size || y >= s->cfg.capacity, FMOE_EINVAL,
                         "expert-map store: entry %d, expected 0..%d", y,
                         s->size < s->cfg.capacity ? s->size : s->cfg.capacity - 1);
    const size_t LJ = (size_t)s->cfg.num_layers * s->cfg.num_experts;
    FMOE_FORWARD_IF_ERROR(check_finite(map, LJ, "map", y));
    if (sem && s->cfg.semantic_dim > 0)
        FMOE_FORWARD_IF_ERROR(check_finite(sem, (size_t)s->cfg.semantic_dim, "semantic", y));
    const int had_old = y < s->size;
    if (y == s->size) s->size++;
    write_entry(s, y, had_old, sem, map, hits);
    return 0;
}

/* ------------------------------------------------------------------ redundancy */

static double dot_d(const float *a, const float *b, size_t n) {
    double acc = 0;
    for (size_t i = 0; i < n; i++) acc += (double)a[i] * b[i];
    return acc;
}

static double cos_d(const float *a, const float *b, size_t n) {
    const double ab = dot_d(a, b, n), aa = dot_d(a, a, n), bb = dot_d(b, b, n);
    return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 0.0;
}

double fmoe_expertmap_redundancy(const fmoe_expertmap *s, const float *sem, const float *map,
                                 int32_t y) {
    const int32_t L = s->cfg.num_layers, d = s->cfg.prefetch_distance, h = s->cfg.semantic_dim;
    const size_t J = (size_t)s->cfg.num_experts;
    const double cs = (h > 0 && sem) ? cos_d(sem, s->sem + (size_t)y * h, (size_t)h) : 0.0;
    double ab = 0, aa = 0, bb = 0;
    for (int32_t l = 0; l < L; l++) {
        const float *a = map + (size_t)l * J, *b = row_of(s, y, l);
        ab += dot_d(a, b, J);
        aa += dot_d(a, a, J);
        bb += dot_d(b, b, J);
    }
    const double cm = aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 0.0;
    return (double)d / L * cs + (double)(L - d) / L * cm;
}

/* Places entries [0, n) of a batch into a full store. */
static void dedup_batch(fmoe_expertmap *s, int32_t n, const float *sem, int64_t sem_stride,
                        const float *maps, int64_t map_stride, int32_t *slots,
                        int32_t *replaced) {
    const int32_t L = s->cfg.num_layers, d = s->cfg.prefetch_distance, h = s->cfg.semantic_dim;
    const int32_t C = s->cfg.capacity;
    const int32_t LJ = L * s->cfg.num_experts;
    const float ws = (float)d / (float)L, wm = (float)(L - d) / (float)L;
    const int use_sem = h > 0 && sem != NULL;
    for (int32_t x = 0; x < n; x++) {
        const float *xm = maps + (size_t)x * map_stride;
        s->xnorm_map[x] = (float)sqrt(dot_d(xm, xm, (size_t)LJ));
        s->xnorm_sem[x] = 0;
        if (use_sem) {
            const float *xs = sem + (size_t)x * sem_stride;
            s->xnorm_sem[x] = (float)sqrt(dot_d(xs, xs, (size_t)h));
        }
    }
    /* rdy = X_map · M^T (summed layer by layer: the store is layer-major), scaled;
     * tmp = X_sem · S^T, scaled and added. */
    const int32_t J = s->cfg.num_experts;
    for (int32_t l = 0; l < L; l++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, C, J, 1.0f, maps + (size_t)l * J,
                    (int)map_stride, s->maps + (size_t)l * C * J, J, l ? 1.0f : 0.0f, s->rdy, C);
    if (use_sem)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, C, h, 1.0f, sem, (int)sem_stride,
                    s->sem, h, 0.0f, s->tmp, C);
    for (int32_t x = 0; x < n; x++) {
        float *row = s->rdy + (size_t)x * C;
        const float *trow = use_sem ? s->tmp + (size_t)x * C : NULL;
        const float xm = s->xnorm_map[x], xs = s->xnorm_sem[x];
        const float fm = xm > 0 ? wm / xm : 0.0f, fs = xs > 0 ? ws / xs : 0.0f;
        for (int32_t y = 0; y < C; y++) {
            const float ym = s->map_norm[y], ys = s->sem_norm[y];
            float r = ym > 0 ? row[y] * fm / ym : 0.0f;
            if (use_sem && ys > 0) r += trow[y] * fs / ys;
            row[y] = r;
        }
    }
    /* RDY among the batch's own entries (pair[x][x'], one more pair of small sgemms): once
     * x' has replaced entry y, RDY(x, y) for a later x is RDY(x, x'). */
    float *pair = s->pair, *pair_sem = s->pair + (size_t)n * n;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, LJ, 1.0f, maps, (int)map_stride,
                maps, (int)map_stride, 0.0f, pair, n);
    if (use_sem)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, h, 1.0f, sem, (int)sem_stride,
                    sem, (int)sem_stride, 0.0f, pair_sem, n);
    for (int32_t x = 0; x < n; x++)
        for (int32_t x2 = 0; x2 < n; x2++) {
            const float nm = s->xnorm_map[x] * s->xnorm_map[x2];
            float r = nm > 0 ? wm * pair[(size_t)x * n + x2] / nm : 0.0f;
            if (use_sem) {
                const float ns = s->xnorm_sem[x] * s->xnorm_sem[x2];
                if (ns > 0) r += ws * pair_sem[(size_t)x * n + x2] / ns;
            }
            pair[(size_t)x * n + x2] = r;
        }
    int32_t nplaced = 0;
    for (int32_t x = 0; x < n; x++) {
        float *row = s->rdy + (size_t)x * C;
        const float *xs = use_sem ? sem + (size_t)x * sem_stride : NULL;
        const float *xm = maps + (size_t)x * map_stride;
        for (int32_t i = 0; i < nplaced; i++)
            row[s->placed[i]] = pair[(size_t)x * n + s->occupant[i]];
        int32_t best = 0;
        for (int32_t y = 1; y < C; y++)
            if (row[y] > row[best]) best = y;
        write_entry(s, best, 1, xs, xm, 0);
        int32_t i = 0;
        while (i < nplaced && s->placed[i] != best) i++;
        if (i == nplaced) s->placed[nplaced++] = best;
        s->occupant[i] = x;
        if (slots) slots[x] = best;
        if (replaced) replaced[x] = best;
    }
}

int fmoe_expertmap_add(fmoe_expertmap *s, int32_t n, const float *sem, int64_t sem_stride,
                       const float *maps, int64_t map_stride, int32_t *slots, int32_t *replaced) {
    const int32_t h = s->cfg.semantic_dim;
    const int64_t LJ = (int64_t)s->cfg.num_layers * s->cfg.num_experts;
    FMOE_RETURN_ERROR_IF(n < 0 || (n > 0 && !maps), FMOE_EINVAL,
                         "fmoe_expertmap_add: %d entries, maps %p", n, (const void *)maps);
    FMOE_RETURN_ERROR_IF(map_stride < LJ || (sem && h > 0 && sem_stride < h), FMOE_EINVAL,
                         "fmoe_expertmap_add: strides %lld / %lld, expected >= %lld / %d",
                         (long long)map_stride, (long long)sem_stride, (long long)LJ, h);
    if (h == 0) sem = NULL;
    for (int32_t x = 0; x < n; x++) {
        FMOE_FORWARD_IF_ERROR(check_finite(maps + (size_t)x * map_stride, (size_t)LJ, "map", x));
        if (sem)
            FMOE_FORWARD_IF_ERROR(
                check_finite(sem + (size_t)x * sem_stride, (size_t)h, "semantic", x));
    }
    int32_t x = 0;
    for (; x < n && s->size < s->cfg.capacity; x++) {
        const int32_t y = s->size++;
        write_entry(s, y, 0, sem ? sem + (size_t)x * sem_stride : NULL,
                    maps + (size_t)x * map_stride, 0);
        if (slots) slots[x] = y;
        if (replaced) replaced[x] = -1;
    }
    while (x < n) {
        const int32_t b = n - x < s->cfg.max_batch ? n - x : s->cfg.max_batch;
        dedup_batch(s, b, sem ? sem + (size_t)x * sem_stride : NULL, sem_stride,
                    maps + (size_t)x * map_stride, map_stride, slots ? slots + x : NULL,
                    replaced ? replaced + x : NULL);
        x += b;
    }
    return 0;
}
