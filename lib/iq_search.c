/*
 * iq_search.c - the nearest-codebook-point tables of the i-quant quantisers
 * (lib/iq_search.h), built once per type on first use.
 *
 * For every lattice point p (levels l_i in 0 .. nlevels-1 for each of the group's values)
 * that is not a codebook point, ggml (iq2xs_init_impl, iq3xs_init_impl) sorts all
 * codebook points g by (|p - g|², index), in units of the levels' values 2l + 1, and keeps
 * those within the `nwant` smallest distinct distances. We keep the same lists without
 * the sort: the distances are small integers, so the nwant smallest distinct ones are
 * found by nwant scans, and listing the points of each distance in index order gives the
 * sorted order. Cost: one pass over the codebook per lattice point (IQ2_S: 6,561 × 1,024
 * points of 8 values), about 10-20 ms once. ggml also fills entries for keys with a level
 * its quantisers never produce (a 2-bit field of 3 in IQ2's keys); we leave those
 * INT32_MIN, as nothing looks them up.
 */
#include "iq_search.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "fmoe/error.h"
#include "fmoe/quant.h"
#include "iq_grids.h"

enum { SLOT_IQ3_XXS, SLOT_IQ3_S, SLOT_IQ2_S, SLOT_IQ2_XXS, SLOT_IQ2_XS, SLOT_IQ1_S, NSLOT };

/* Per type: the codebook (as bytes of grid values) and which value each level is. */
typedef struct type_desc {
    uint32_t type;
    int32_t group, bits, grid_size, nlevels, nwant;
    const void *grid;       /* uint32 (group 4) or uint64 (group 8) entries */
    uint8_t values[8];      /* the grid value of level l, for l < nlevels */
} type_desc;

static const type_desc descs[NSLOT] = {
    [SLOT_IQ3_XXS] = {FMOE_GGML_IQ3_XXS, 4, 3, 256, 8, 2, fmoe__iq3xxs_grid,
                      {4, 12, 20, 28, 36, 44, 52, 62}},
    [SLOT_IQ3_S] = {FMOE_GGML_IQ3_S, 4, 3, 512, 8, 3, fmoe__iq3s_grid,
                    {1, 3, 5, 7, 9, 11, 13, 15}},
    [SLOT_IQ2_S] = {FMOE_GGML_IQ2_S, 8, 2, 1024, 3, 1, fmoe__iq2s_grid, {8, 25, 43}},
    [SLOT_IQ2_XXS] = {FMOE_GGML_IQ2_XXS, 8, 2, 256, 3, 2, fmoe__iq2xxs_grid, {8, 25, 43}},
    [SLOT_IQ2_XS] = {FMOE_GGML_IQ2_XS, 8, 2, 512, 3, 2, fmoe__iq2xs_grid, {8, 25, 43}},
    /* IQ1_S's grid values -1, 0, 1 as bytes */
    [SLOT_IQ1_S] = {FMOE_GGML_IQ1_S, 8, 2, 2048, 3, 3, fmoe__iq1s_grid, {0xFF, 0, 1}},
};

static fmoe__iq_search tables[NSLOT];
static _Atomic int ready[NSLOT];
static pthread_mutex_t build_lock = PTHREAD_MUTEX_INITIALIZER;

static int slot_of(uint32_t type) {
    if (type == FMOE_GGML_IQ1_M) return SLOT_IQ1_S; /* IQ1_M shares IQ1_S's codebook */
    for (int s = 0; s < NSLOT; s++)
        if (descs[s].type == type) return s;
    return -1;
}

static uint8_t grid_value(const type_desc *td, int32_t j, int i) {
    if (td->group == 4) return (uint8_t)(((const uint32_t *)td->grid)[j] >> (8 * i));
    return (uint8_t)(((const uint64_t *)td->grid)[j] >> (8 * i));
}

/* A growing uint16 array (the neighbour lists). */
typedef struct u16vec {
    uint16_t *v;
    int64_t n, cap;
} u16vec;

static int push(u16vec *a, uint16_t x) {
    if (a->n == a->cap) {
        const int64_t cap = a->cap ? 2 * a->cap : 16384;
        uint16_t *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

static int build(const type_desc *td, fmoe__iq_search *out) {
    const int32_t nkeys = 1 << (td->bits * td->group), G = td->grid_size, m = td->group;
    uint8_t *levels = malloc((size_t)G * (size_t)m);
    int32_t *map = malloc((size_t)nkeys * sizeof *map);
    int32_t *dist = malloc((size_t)G * sizeof *dist);
    u16vec nb = {0};
    if (!levels || !map || !dist) goto oom;
    for (int32_t k = 0; k < nkeys; k++) map[k] = INT32_MIN;
    for (int32_t j = 0; j < G; j++) {
        int32_t key = 0;
        for (int i = 0; i < m; i++) {
            const uint8_t v = grid_value(td, j, i);
            int l = 0;
            while (l < td->nlevels && td->values[l] != v) l++;
            FMOE_ASSERT(l < td->nlevels); /* the codebooks hold only these values */
            levels[j * m + i] = (uint8_t)l;
            key |= l << (td->bits * i);
        }
        map[key] = j;
    }
    const int32_t mask = (1 << td->bits) - 1;
    for (int32_t key = 0; key < nkeys; key++) {
        if (map[key] != INT32_MIN) continue; /* a codebook point */
        int lp[8], valid = 1;
        for (int i = 0; i < m; i++) {
            lp[i] = (key >> (td->bits * i)) & mask;
            valid &= lp[i] < td->nlevels;
        }
        if (!valid) continue;
        for (int32_t j = 0; j < G; j++) {
            int32_t d2 = 0;
            for (int i = 0; i < m; i++) {
                const int32_t diff = 2 * (levels[j * m + i] - lp[i]);
                d2 += diff * diff;
            }
            dist[j] = d2;
        }
        const int64_t at = nb.n;
        if (at > INT32_MAX - 1 || push(&nb, 0) != 0) goto oom;
        int32_t below = -1; /* every distance listed so far is <= below */
        for (int w = 0; w < td->nwant; w++) {
            int32_t next = INT32_MAX;
            for (int32_t j = 0; j < G; j++)
                if (dist[j] > below && dist[j] < next) next = dist[j];
            if (next == INT32_MAX) break;
            for (int32_t j = 0; j < G; j++)
                if (dist[j] == next && push(&nb, (uint16_t)j) != 0) goto oom;
            below = next;
        }
        nb.v[at] = (uint16_t)(nb.n - at - 1);
        map[key] = -1 - (int32_t)at;
    }
    free(dist);
    *out = (fmoe__iq_search){.group = m, .bits = td->bits, .grid_size = G, .levels = levels,
                             .map = map, .neighbours = nb.v};
    return 0;
oom:
    free(levels);
    free(map);
    free(dist);
    free(nb.v);
    fmoe_error_set(FMOE_ENOMEM, "out of memory building the %s quantiser's search tables",
                   fmoe_ggml_type_name(td->type));
    return FMOE_ENOMEM;
}

const fmoe__iq_search *fmoe__iq_search_get(uint32_t type) {
    const int s = slot_of(type);
    if (s < 0) return NULL;
    if (atomic_load_explicit(&ready[s], memory_order_acquire)) return &tables[s];
    pthread_mutex_lock(&build_lock);
    int ok = atomic_load_explicit(&ready[s], memory_order_relaxed) ||
             build(&descs[s], &tables[s]) == 0;
    if (ok) atomic_store_explicit(&ready[s], 1, memory_order_release);
    pthread_mutex_unlock(&build_lock);
    return ok ? &tables[s] : NULL;
}
