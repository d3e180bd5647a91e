/*
 * zstd_filter.h - internal: the zstd HDF5 filter class shared by libfmoe-trace and the
 * libh5zstd.so plugin (zstd_filter.c explains why it calls no HDF5 function).
 */
#ifndef FMOE_TRACE_ZSTD_FILTER_H
#define FMOE_TRACE_ZSTD_FILTER_H

#include <hdf5.h> /* declarations only: the plugin build links no HDF5 */

#define FMOE_H5Z_FILTER_ZSTD 32015 /* the HDF Group's registered id for zstd */
#define FMOE_ZSTD_DEFAULT_LEVEL 3

/* The filter class: version H5Z_CLASS_T_VERS, id 32015, name "zstd", encoder and decoder.
 * Its .filter member is the H5Z_func_t; tests call it directly on hand-made frames. */
extern const H5Z_class2_t fmoe__h5z_zstd_class;

/* The bytes every chunk the calling thread reads next must decode to (the dataset's chunk
 * dimensions x its element size), or 0 for no check. libhdf5 1.10.8 copies a whole chunk
 * out of whatever buffer the filter returns, so a frame that decodes to fewer bytes than
 * the chunk (a fuzzed store) made it read past the buffer; fmoe's readers set this around
 * each read of a chunked dataset (fmoe__h5_expect_chunks, hdf5_util.c). Not in the plugin:
 * its hosts read without it. */
void fmoe__h5z_zstd_expect(size_t chunk_bytes);

#endif
