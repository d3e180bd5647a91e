/*
 * expertmap_impl.h - internals shared by the store and the matcher in lib/expertmap/.
 *
 * Map layout. The maps are stored in tiles of FMOE__EXPERTMAP_TILE entries, layer-major:
 *
 *     maps[l][t][j][i]   = P_l[j] of entry y = t·W + i    (W = FMOE__EXPERTMAP_TILE)
 *
 * so that layer l of all entries is one contiguous block ([T][J][W], T = ceil(C / W)), and
 * within a tile the W entries' values of expert j sit side by side: the matcher's step
 * at layer l is then W independent dot products per tile, computed lane by lane with
 * plain vectorisable loops (one vector register per expert for W = 16 floats), instead of
 * a horizontal sum of J products per entry. Lanes past the last entry are zero.
 */
#ifndef FMOE_EXPERTMAP_IMPL_H
#define FMOE_EXPERTMAP_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "fmoe/expertmap.h"

#define FMOE__EXPERTMAP_TILE 16

struct fmoe_expertmap {
    fmoe_expertmap_config cfg; /* max_batch resolved */
    int32_t size;              /* live entries, rows [0, size) */
    int32_t tiles;             /* T = ceil(C / W) */
    uint64_t version;          /* bumped by every modification but hits */
    float *maps;               /* [L][T][J][W] gate probabilities (see above) */
    float *sem;                /* [C][h] embeddings; NULL when h == 0 */
    void *work;                /* one block holding every array below */
    uint32_t *hits;            /* [C] best-match counts */
    float *sem_norm;           /* [C] ||sem_y|| */
    float *map_norm;           /* [C] ||map_y|| over all L·J values */
    uint32_t *pop;             /* [L][J] entries with (l, j) in row l's top K */
    int32_t *topk;             /* [K] scratch */
    float *row;                /* [J] scratch: one row, gathered */
    float *rdy;                /* [max_batch][T·W] scratch: RDY, then map dot products */
    float *tmp;                /* [max_batch][C] scratch: embedding dot products */
    float *xnorm_sem;          /* [max_batch] norms of a batch's new entries */
    float *xnorm_map;          /* [max_batch] */
    int32_t *placed;           /* [max_batch] entries replaced within the current batch */
    int32_t *occupant;         /* [max_batch] the batch entry now in placed[i] */
    float *pair;               /* [2][max_batch][max_batch] RDY among a batch's entries */
};

/* Value (l, j) of entry y. */
static inline size_t fmoe__expertmap_at(const fmoe_expertmap *s, int32_t y, int32_t l,
                                        int32_t j) {
    const size_t W = FMOE__EXPERTMAP_TILE, J = (size_t)s->cfg.num_experts;
    return (((size_t)l * (size_t)s->tiles + (size_t)y / W) * J + (size_t)j) * W + (size_t)y % W;
}

/* The K largest of row[0..J) into top[K], largest first, ties to the lower index. */
void fmoe__expertmap_topk(const float *row, int32_t J, int32_t K, int32_t *top);

/* Rows l of entries [y0, y0 + n) into out[n][J], row-major. */
void fmoe__expertmap_gather(const fmoe_expertmap *s, int32_t l, int32_t y0, int32_t n,
                            float *out);

/*
 * Dot products of n full maps X (row x at X + x·ldx, L·J floats, layer-major like a
 * trace's [L][J]) with the whole maps of entries [0, size): out[x·ldo + y], ldo >= the
 * size rounded up to a multiple of W (whole tiles are written). The matcher's step
 * (matcher.c) without norms: per layer, in float, s = 0; s = s + x_j·m_j (j in order);
 * d = d + s (layers in order), the same bits on every CPU.
 */
void fmoe__expertmap_map_dots(const fmoe_expertmap *s, const float *X, int32_t n, int64_t ldx,
                              float *out, int64_t ldo);

#endif
