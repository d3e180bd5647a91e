/*
 * store.c - the in-memory expert-map store and its deduplication (fmoe/expertmap.h;
 * "fMoE: Fine-Grained Expert Offloading for Large Mixture-of-Experts Serving" §4.1,
 * §4.4).
 *
 * Layout: three allocations, all made at init: the maps, the embeddings, and one block
 * for everything else. Maps are stored layer-major in tiles of 16 entries,
 * [L][C/16][J][16] (expertmap_impl.h), so that the matcher's step at layer l reads one
 * contiguous block and computes 16 entries' dot products lane by lane. Besides the data
 * (maps, sem, hits) the store keeps, per entry, only what the deduplication and the
 * semantic search need and would otherwise recompute per query:
 *   sem_norm[C], map_norm[C]   Euclidean norms of each entry's embedding and whole map
 *   pop[L][J]                  how many live entries have (l, j) among row l's top K
 * Each is updated in O(L·J + h) when an entry changes. The prefix norms the trajectory
 * search needs (rows 0..l of every map, for every l) are not kept: [L][C] floats would be
 * 1/J of the maps (12.5% for Mixtral's J = 8); the matcher accumulates them in the same
 * pass that reads the rows (see matcher.c). The whole store is C·(h + L·J) floats of data
 * (the maps padded to whole tiles) plus 3·C + max_batch·C·(1 or 2) + max_batch² + L·J
 * of norms, counters and scratch; the default max_batch keeps the scratch near 2% of
 * the data.
 *
 * Deduplication of a batch of n new entries against a full store: the n × C dot products
 * of embeddings (one sgemm) and of whole maps (the matcher's kernel); norms turn them into cosines and
 * the fixed weights d/L and (L-d)/L into RDY. Entries are then placed in order; an entry
 * placed earlier in the batch changed a column, and for the later entries that column's
 * RDY is their RDY with the batch entry now in it, which two more small sgemms (the batch
 * against itself) give. The outcome is therefore the same as adding the entries one at a
 * time, which is the rule as the paper states it (to float rounding: the products with
 * the store are summed layer by layer by the matcher's kernel, fmoe__expertmap_map_dots,
 * those within the batch by one sgemm over whole maps). Cost per new entry:
 * O((C + n)·(h + L·J)) flops plus O(C) for the argmax.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "expertmap_impl.h"
#include "fmoe/error.h"
#include "fmoe/expertmap.h"

#define DEFAULT_MAX_BATCH 256
#define W FMOE__EXPERTMAP_TILE

void fmoe__expertmap_gather(const fmoe_expertmap *s, int32_t l, int32_t y0, int32_t n,
                            float *out) {
    const int32_t J = s->cfg.num_experts;
    for (int32_t i = 0; i < n; i++) {
        const float *src = s->maps + fmoe__expertmap_at(s, y0 + i, l, 0);
        for (int32_t j = 0; j < J; j++) out[(size_t)i * J + j] = src[(size_t)j * W];
    }
}

/* Row l of entry y <- row[0..J). */
static void scatter_row(fmoe_expertmap *s, int32_t y, int32_t l, const float *row) {
    float *dst = s->maps + fmoe__expertmap_at(s, y, l, 0);
    for (int32_t j = 0; j < s->cfg.num_experts; j++) dst[(size_t)j * W] = row[j];
}

void fmoe_expertmap_get_row(const fmoe_expertmap *s, int32_t y, int32_t l, float *out) {
    fmoe__expertmap_gather(s, l, y, 1, out);
}

void fmoe_expertmap_get_rows(const fmoe_expertmap *s, int32_t y, int32_t l0, int32_t l1,
                             float *out) {
    const int32_t J = s->cfg.num_experts;
    const size_t layer = (size_t)s->tiles * J * W; /* floats from one layer to the next */
    const float *src = s->maps + fmoe__expertmap_at(s, y, l0, 0);
    for (int32_t l = l0; l < l1; l++, src += layer, out += J)
        for (int32_t j = 0; j < J; j++) out[j] = src[(size_t)j * W];
}

void fmoe_expertmap_copy_map(const fmoe_expertmap *s, int32_t y, float *out) {
    fmoe_expertmap_get_rows(s, y, 0, s->cfg.num_layers, out);
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

/* Adds (sign > 0) or removes entry y's top-K experts to or from the popularity counts. */
static void pop_update(fmoe_expertmap *s, int32_t y, int sign) {
    const int32_t L = s->cfg.num_layers, J = s->cfg.num_experts, K = s->cfg.top_k;
    for (int32_t l = 0; l < L; l++) {
        fmoe__expertmap_gather(s, l, y, 1, s->row);
        fmoe__expertmap_topk(s->row, J, K, s->topk);
        for (int32_t k = 0; k < K; k++) {
            uint32_t *c = &s->pop[(size_t)l * J + s->topk[k]];
            *c = sign > 0 ? *c + 1 : *c - 1;
        }
    }
}

/* Recomputes the derived data of entry y from its sem and map[L][J] (as given). */
static void refresh_entry(fmoe_expertmap *s, int32_t y, const float *map) {
    const int32_t h = s->cfg.semantic_dim;
    const size_t LJ = (size_t)s->cfg.num_layers * (size_t)s->cfg.num_experts;
    double acc = 0;
    for (size_t i = 0; i < LJ; i++) acc += (double)map[i] * map[i];
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
    for (int32_t l = 0; l < L; l++) scatter_row(s, y, l, map + (size_t)l * J);
    if (h > 0) {
        if (sem)
            memcpy(s->sem + (size_t)y * h, sem, (size_t)h * sizeof *s->sem);
        else
            memset(s->sem + (size_t)y * h, 0, (size_t)h * sizeof *s->sem);
    }
    s->hits[y] = hits;
    pop_update(s, y, +1);
    refresh_entry(s, y, map);
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
    s->tiles = (int32_t)((C + W - 1) / W);
    /* zeroed: the lanes past the last entry of a tile are read (and ignored) by the matcher */
    s->maps = calloc((size_t)s->tiles * W * LJ, sizeof *s->maps);
    s->sem = h ? malloc(C * h * sizeof *s->sem) : NULL;
    /* Everything else in one zeroed block (counters, norms, scratch): one allocation
     * instead of fifteen, so the store's size is its arrays, not allocator overhead. */
    const size_t P = (size_t)s->tiles * W;
    size_t off = 0;
#define CARVE(field, count)                                                                       \
    const size_t field##_off = off;                                                               \
    off += ((count) * sizeof *s->field + 63) & ~(size_t)63;
    CARVE(hits, C)
    CARVE(sem_norm, C)
    CARVE(map_norm, C)
    CARVE(pop, LJ)
    CARVE(topk, (size_t)cfg->top_k)
    CARVE(row, J)
    CARVE(rdy, B * P)
    CARVE(tmp, h ? B * C : 0)
    CARVE(xnorm_sem, B)
    CARVE(xnorm_map, B)
    CARVE(placed, B)
    CARVE(occupant, B)
    CARVE(pair, 2 * B * B)
#undef CARVE
    s->work = calloc(1, off);
    if (!s->maps || (h && !s->sem) || !s->work) {
        fmoe_expertmap_free(s);
        return fmoe_error_set(FMOE_ENOMEM, "expert-map store of %zu entries (%zu MiB)", C,
                              (C * (LJ + h) * 4) >> 20);
    }
    char *w = s->work;
    s->hits = (void *)(w + hits_off);
    s->sem_norm = (void *)(w + sem_norm_off);
    s->map_norm = (void *)(w + map_norm_off);
    s->pop = (void *)(w + pop_off);
    s->topk = (void *)(w + topk_off);
    s->row = (void *)(w + row_off);
    s->rdy = (void *)(w + rdy_off);
    s->tmp = h ? (void *)(w + tmp_off) : NULL;
    s->xnorm_sem = (void *)(w + xnorm_sem_off);
    s->xnorm_map = (void *)(w + xnorm_map_off);
    s->placed = (void *)(w + placed_off);
    s->occupant = (void *)(w + occupant_off);
    s->pair = (void *)(w + pair_off);
    *out = s;
    return 0;
}

int fmoe_expertmap_clone(fmoe_expertmap **out, const fmoe_expertmap *src, int32_t capacity) {
    fmoe_expertmap_config cfg = src->cfg;
    if (capacity > cfg.capacity) cfg.capacity = capacity;
    FMOE_FORWARD_IF_ERROR(fmoe_expertmap_init(out, &cfg));
    fmoe_expertmap *s = *out;
    const size_t C = (size_t)src->cfg.capacity, L = (size_t)src->cfg.num_layers,
                 J = (size_t)src->cfg.num_experts, LJ = L * J, h = (size_t)src->cfg.semantic_dim;
    const size_t n = (size_t)src->size;
    /* tiled, layer-major: each layer's tiles in turn (a larger store has more tiles per
     * layer; the unused lanes are zero in both) */
    const size_t from = (size_t)src->tiles * J * W, to = (size_t)s->tiles * J * W;
    for (size_t l = 0; l < L; l++)
        memcpy(s->maps + l * to, src->maps + l * from, from * sizeof *s->maps);
    if (h) memcpy(s->sem, src->sem, n * h * sizeof *s->sem);
    memcpy(s->hits, src->hits, C * sizeof *s->hits);
    memcpy(s->sem_norm, src->sem_norm, C * sizeof *s->sem_norm);
    memcpy(s->map_norm, src->map_norm, C * sizeof *s->map_norm);
    memcpy(s->pop, src->pop, LJ * sizeof *s->pop);
    s->size = src->size;
    s->version = src->version;
    return 0;
}

void fmoe_expertmap_free(fmoe_expertmap *s) {
    if (!s) return;
    free(s->maps);
    free(s->sem);
    free(s->work);
    free(s);
}

const fmoe_expertmap_config *fmoe_expertmap_config_of(const fmoe_expertmap *s) { return &s->cfg; }
int32_t fmoe_expertmap_size(const fmoe_expertmap *s) { return s->size; }
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
        const float *a = map + (size_t)l * J, *b = s->maps + fmoe__expertmap_at(s, y, l, 0);
        for (size_t j = 0; j < J; j++) {
            ab += (double)a[j] * b[j * W];
            bb += (double)b[j * W] * b[j * W];
        }
        aa += dot_d(a, a, J);
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
    const int64_t P = (int64_t)s->tiles * W; /* rdy's row length: whole tiles */
    fmoe__expertmap_map_dots(s, maps, n, map_stride, s->rdy, P);
    if (use_sem)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, C, h, 1.0f, sem, (int)sem_stride,
                    s->sem, h, 0.0f, s->tmp, C);
    for (int32_t x = 0; x < n; x++) {
        float *row = s->rdy + (size_t)x * P;
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
        float *row = s->rdy + (size_t)x * P;
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
