/*
 * stats.c - coverage statistics of an expert-map store (fmoe/expertmap.h): how close each
 * entry is to its nearest neighbour, by map, by embedding and by the RDY the
 * deduplication uses. A store whose entries all have a near twin is redundant (the
 * paper's sphere-covering view, fMoE §4.4); low nearest-neighbour similarity means the
 * entries are spread out.
 *
 * Blocks of up to BLOCK queries: gather their rows, dot them with the whole store's maps
 * (fmoe__expertmap_map_dots) and embeddings (sgemm), scale by norms, take the maximum off
 * the diagonal.
 */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "expertmap_impl.h"
#include "fmoe/error.h"
#include "fmoe/expertmap.h"

#define BLOCK 128

int fmoe_expertmap_nearest(const fmoe_expertmap *s, const int32_t *ids, int32_t n,
                           float *map_nn, float *sem_nn, float *rdy_nn) {
    const int32_t E = s->size, L = s->cfg.num_layers, h = s->cfg.semantic_dim;
    const int32_t LJ = L * s->cfg.num_experts, d = s->cfg.prefetch_distance;
    for (int32_t i = 0; i < n; i++)
        FMOE_RETURN_ERROR_IF(ids[i] < 0 || ids[i] >= E, FMOE_EINVAL,
                             "store statistics: entry %d of %d", ids[i], E);
    const size_t B = BLOCK;
    float *qm = malloc(B * (size_t)LJ * sizeof *qm);
    float *qs = h ? malloc(B * (size_t)h * sizeof *qs) : NULL;
    const size_t P = (size_t)s->tiles * FMOE__EXPERTMAP_TILE; /* gm's rows: whole tiles */
    float *gm = malloc(B * P * sizeof *gm);
    float *gs = h ? malloc(B * (size_t)(E ? E : 1) * sizeof *gs) : NULL;
    if (!qm || !gm || (h && (!qs || !gs))) {
        free(qm);
        free(qs);
        free(gm);
        free(gs);
        return fmoe_error_set(FMOE_ENOMEM, "store statistics over %d entries", E);
    }
    const float ws = (float)d / (float)L, wm = (float)(L - d) / (float)L;
    for (int32_t i0 = 0; i0 < n; i0 += BLOCK) {
        const int32_t nb = n - i0 < BLOCK ? n - i0 : BLOCK;
        for (int32_t k = 0; k < nb; k++) {
            fmoe_expertmap_copy_map(s, ids[i0 + k], qm + (size_t)k * LJ);
            if (h) memcpy(qs + (size_t)k * h, s->sem + (size_t)ids[i0 + k] * h, (size_t)h * sizeof *qs);
        }
        fmoe__expertmap_map_dots(s, qm, nb, LJ, gm, (int64_t)P);
        if (h)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, E, h, 1.0f, qs, h, s->sem, h,
                        0.0f, gs, E);
        for (int32_t k = 0; k < nb; k++) {
            const int32_t x = ids[i0 + k];
            float bm = 0, bs = 0, br = 0;
            int first = 1;
            for (int32_t y = 0; y < E; y++) {
                if (y == x) continue;
                const float nm = s->map_norm[x] * s->map_norm[y];
                const float cm = nm > 0 ? gm[(size_t)k * P + y] / nm : 0.0f;
                float cs = 0;
                if (h) {
                    const float ns = s->sem_norm[x] * s->sem_norm[y];
                    cs = ns > 0 ? gs[(size_t)k * E + y] / ns : 0.0f;
                }
                const float r = ws * cs + wm * cm;
                if (first || cm > bm) bm = cm;
                if (first || cs > bs) bs = cs;
                if (first || r > br) br = r;
                first = 0;
            }
            if (map_nn) map_nn[i0 + k] = bm;
            if (sem_nn) sem_nn[i0 + k] = bs;
            if (rdy_nn) rdy_nn[i0 + k] = br;
        }
    }
    free(qm);
    free(qs);
    free(gm);
    free(gs);
    return 0;
}
