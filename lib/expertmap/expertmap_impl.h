/*
 * expertmap_impl.h - internals shared by the store and the matcher in lib/expertmap/.
 */
#ifndef FMOE_EXPERTMAP_IMPL_H
#define FMOE_EXPERTMAP_IMPL_H

#include <stdint.h>

#include "fmoe/expertmap.h"

struct fmoe_expertmap {
    fmoe_expertmap_config cfg; /* max_batch resolved */
    int32_t size;              /* live entries, rows [0, size) */
    uint64_t version;          /* bumped by every modification but hits */
    float *maps;               /* [L][C][J] gate probabilities, layer-major */
    float *sem;                /* [C][h] embeddings; NULL when h == 0 */
    uint32_t *hits;            /* [C] best-match counts */
    float *sem_norm;           /* [C] ||sem_y|| */
    float *map_norm;           /* [C] ||map_y|| over all L·J values */
    float *prefix_rnorm;       /* [L][C] 1 / ||map_y rows 0..l||, 0 for a zero prefix */
    uint32_t *pop;             /* [L][J] entries with (l, j) in row l's top K */
    int32_t *topk;             /* [K] scratch */
    float *rdy;                /* [max_batch][C] scratch: RDY, then map dot products */
    float *tmp;                /* [max_batch][C] scratch: embedding dot products */
    float *xnorm_sem;          /* [max_batch] norms of a batch's new entries */
    float *xnorm_map;          /* [max_batch] */
    int32_t *placed;           /* [max_batch] entries replaced within the current batch */
    int32_t *occupant;         /* [max_batch] the batch entry now in placed[i] */
    float *pair;               /* [2][max_batch][max_batch] RDY among a batch's entries */
};

/* The K largest of row[0..J) into top[K], largest first, ties to the lower index. */
void fmoe__expertmap_topk(const float *row, int32_t J, int32_t K, int32_t *top);

#endif
