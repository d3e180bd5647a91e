/*
 * iq_search.h - the search tables the i-quant quantisers use (internal; lib/iq_search.c,
 * built from lib/iq_grids.h's codebooks the first time a type is quantised).
 *
 * The quantisers (lib/quant_iq_quantize.c) round each group of 8 (IQ2) or 4 (IQ3) values
 * to integer levels l (value 2l + 1 in units of the group's scale), which gives a point of
 * the full lattice: key = Σ l_i << (bits·i). Most lattice points are not in the codebook;
 * for those the tables list the codebook points nearest to them, and the quantiser picks
 * the best of these by its weighted error. This is ggml's iq2xs_init_impl /
 * iq3xs_init_impl (ggml-quants.c), built again: the same lists in the same order, which
 * matters, since among equally good candidates the first one listed wins.
 */
#ifndef FMOE_IQ_SEARCH_H
#define FMOE_IQ_SEARCH_H

#include <stdint.h>

typedef struct fmoe__iq_search {
    int32_t group;              /* values per codebook point: 8 (IQ2) or 4 (IQ3) */
    int32_t bits;               /* bits per level in a key: 2 (IQ2) or 3 (IQ3) */
    int32_t grid_size;          /* codebook points */
    const uint8_t *levels;      /* [grid_size][group] the level l (0 .. 2^bits - 1) of each value */
    /* [1 << (bits·group)] codebook index of the lattice point with that key, or -1 - o
     * where neighbours[o] is the count n and neighbours[o + 1 .. o + n] the codebook
     * indices nearest to it: all points at the `nwant` smallest squared distances (in
     * units of levels 2l + 1), by distance, then by index. nwant: ggml's, per type. */
    const int32_t *map;
    const uint16_t *neighbours;
} fmoe__iq_search;

/* The tables of an i-quant type fmoe quantises (IQ3_XXS, IQ3_S, IQ2_S, IQ2_XXS, IQ2_XS,
 * IQ1_S, and IQ1_M, which shares IQ1_S's),
 * built on the first call (thread-safe; up to about 40 ms) and kept for the life of the
 * process. @return the tables, or NULL where memory ran out (fmoe_error_detail says so)
 * or the type has none. */
const fmoe__iq_search *fmoe__iq_search_get(uint32_t type);

#endif
