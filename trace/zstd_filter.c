/*
 * zstd_filter.c - the HDF5 zstd filter, registered id 32015 ("zstd").
 *
 * This one file is compiled twice (trace/meson.build):
 *   - into libfmoe-trace, where fmoe_hdf5_register_zstd() (hdf5_util.c) hands the class
 *     below to H5Zregister, so fmoe reads and writes zstd without any plugin path;
 *   - with FMOE_H5Z_PLUGIN into libh5zstd.so, a dynamically loaded HDF5 plugin for h5py,
 *     h5dump and anything else that honours HDF5_PLUGIN_PATH.
 *
 * The plugin is loaded into processes that carry their own HDF5 (h5py bundles 1.14/2.x,
 * h5dump links the system 1.10), so this file calls no HDF5 function at all: it needs only
 * the H5Z_class2_t layout and constants from the headers, which have been stable since
 * 1.8.  Buffers are swapped with malloc/free, which is what HDF5's pipeline allocator
 * (H5MM_malloc) uses in release builds, and what every other 32015 implementation does.
 *
 * Wire format (the one hdf5plugin and the HDF Group's registered filter use): the chunk is
 * one or more complete zstd frames; cd_values[0], when present, is the compression level.
 * We compress in one shot (ZSTD_compress2), so the frame header carries the content size:
 * the common readers size their output buffer from it. We also turn on zstd's content
 * checksum, which every zstd decoder verifies, so a damaged chunk fails to decode instead
 * of decoding to wrong numbers; nothing else in an HDF5 chunk would notice.
 *
 * On decode we insist on the content size too: a frame without it, or claiming more than
 * an HDF5 chunk can hold, is refused with failure rather than guessed at, so a hostile
 * file costs at most one bounded allocation.
 */
#include <stdint.h>
#include <stdlib.h>
#include <zstd.h>

#include <H5PLextern.h>

#include "zstd_filter.h"

/* HDF5 stores a chunk's size in 32 bits, so no genuine chunk decodes to more than this.
 * Anything larger in a frame header is corruption (or an attack), not data. */
#define ZSTD_FILTER_MAX_CHUNK ((unsigned long long)UINT32_MAX)

static int clamp_level(size_t cd_nelmts, const unsigned int cd_values[]) {
    if (cd_nelmts < 1) return FMOE_ZSTD_DEFAULT_LEVEL;
    /* Levels are stored as unsigned; negative ("fast") levels wrap, so read them back
     * through int as zstd's own tools do. 0 means zstd's default. */
    int level = (int)cd_values[0];
    if (level == 0) return FMOE_ZSTD_DEFAULT_LEVEL;
    if (level > ZSTD_maxCLevel()) level = ZSTD_maxCLevel();
    if (level < ZSTD_minCLevel()) level = ZSTD_minCLevel();
    return level;
}

/* Sum of the content sizes of the frames in src[n], or 0 when any frame lacks its size,
 * is malformed, or the total exceeds ZSTD_FILTER_MAX_CHUNK. A chunk never decodes to 0
 * bytes, so 0 doubles as the failure value. */
static unsigned long long frames_content_size(const unsigned char *src, size_t n) {
    unsigned long long total = 0;
    while (n > 0) {
        size_t fsize = ZSTD_findFrameCompressedSize(src, n);
        if (ZSTD_isError(fsize) || fsize == 0 || fsize > n) return 0;
        unsigned long long c = ZSTD_getFrameContentSize(src, fsize);
        if (c == ZSTD_CONTENTSIZE_UNKNOWN || c == ZSTD_CONTENTSIZE_ERROR) return 0;
        if (c > ZSTD_FILTER_MAX_CHUNK - total) return 0;
        total += c;
        src += fsize;
        n -= fsize;
    }
    return total;
}

#ifndef FMOE_H5Z_PLUGIN
static _Thread_local size_t expected_chunk_bytes;

void fmoe__h5z_zstd_expect(size_t chunk_bytes) { expected_chunk_bytes = chunk_bytes; }
#define EXPECTED_CHUNK_BYTES expected_chunk_bytes
#else
#define EXPECTED_CHUNK_BYTES 0
#endif

/* H5Z_func_t: returns the number of valid bytes in *buf, or 0 on failure (HDF5 then fails
 * the read or write and leaves *buf to the caller). */
static size_t zstd_filter(unsigned int flags, size_t cd_nelmts, const unsigned int cd_values[],
                          size_t nbytes, size_t *buf_size, void **buf) {
    if (flags & H5Z_FLAG_REVERSE) {
        unsigned long long size = frames_content_size(*buf, nbytes);
        if (size == 0) return 0;
        if (EXPECTED_CHUNK_BYTES && size != EXPECTED_CHUNK_BYTES) return 0; /* not this chunk */
        void *out = malloc((size_t)size);
        if (!out) return 0;
        size_t got = ZSTD_decompress(out, (size_t)size, *buf, nbytes);
        if (ZSTD_isError(got) || got != size) {
            free(out);
            return 0;
        }
        free(*buf);
        *buf = out;
        *buf_size = (size_t)size;
        return (size_t)size;
    }

    size_t bound = ZSTD_compressBound(nbytes);
    if (ZSTD_isError(bound) || bound == 0) return 0;
    void *out = malloc(bound);
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    size_t n = 0;
    if (out && cctx &&
        !ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel,
                                             clamp_level(cd_nelmts, cd_values))) &&
        !ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1)))
        n = ZSTD_compress2(cctx, out, bound, *buf, nbytes);
    ZSTD_freeCCtx(cctx);
    if (!out || n == 0 || ZSTD_isError(n)) {
        free(out);
        return 0;
    }
    free(*buf);
    *buf = out;
    *buf_size = bound;
    return n;
}

const H5Z_class2_t fmoe__h5z_zstd_class = {
    .version = H5Z_CLASS_T_VERS,
    .id = (H5Z_filter_t)FMOE_H5Z_FILTER_ZSTD,
    .encoder_present = 1,
    .decoder_present = 1,
    .name = "zstd",
    .filter = zstd_filter,
};

#ifdef FMOE_H5Z_PLUGIN
/* The two entry points HDF5's plugin loader looks up with dlsym. They are the only
 * symbols libh5zstd.so exports (the module is built with hidden visibility). */
H5PLUGIN_DLL H5PL_type_t H5PLget_plugin_type(void) { return H5PL_TYPE_FILTER; }
H5PLUGIN_DLL const void *H5PLget_plugin_info(void) { return &fmoe__h5z_zstd_class; }
#endif
