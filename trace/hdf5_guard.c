/*
 * hdf5_guard.c - checks our side makes before libhdf5 reads a variable-length string from
 * a file it has not validated (contract in hdf5_guard.h).
 *
 * Why: libhdf5 1.10.8 trusts a variable-length string's heap id. Reading one (H5Aread or
 * H5Dread, through H5T__conv_vlen and H5HG_read) loads the global heap collection the id
 * names and copies the object out of it with nothing but assertions (compiled out) between
 * the bytes and the copy: an index past the collection's table reads a wild pointer
 * (SEGV), an object whose stored size exceeds the id's length overruns the buffer sized by
 * that length, and an object of size 0 in the collection makes its decoder loop forever.
 * Bit-flipped traces and stores did all three (tests/fuzz/crashes/{trace,store}/).
 *
 * How: before such a read we take each element's raw heap id out of the file without
 * dereferencing it - a no-op conversion path from variable-length strings to an opaque
 * type of the id's size (H5Tregister, registered once; libhdf5 hands a conversion the
 * stored bytes) - and check it against the file's own bytes, read through the file's
 * driver handle (sec2: pread on its descriptor; core: its memory image): the collection
 * must start with "GCOL" version 1 and lie inside the file, every object in it must fit
 * inside it (walked the way libhdf5's decoder walks it), and the id's object must exist,
 * not be the free-space object, and have exactly the id's length. Everything is bounded
 * by the file's size, so a forged length can neither allocate past it nor loop.
 *
 * Limits: only the sec2 and core drivers are checked (fmoe opens files with nothing
 * else); under another driver the check passes without looking. The last collection
 * checked is kept, so a dataset of many strings in one collection is read once.
 */
#include "hdf5_guard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmoe/error.h"
#include "files.h"
#include "hdf5_util.h"

#define RAW_TAG "fmoe:vlen-heap-id" /* opaque tag of the raw heap id type */
#define GCOL_VERSION 1
#define MAX_IDX 65535u /* libhdf5 stores a heap object's index in 16 bits */
#define ALIGN8(x) (((x) + 7u) & ~(uint64_t)7u)

/* ---------------------------------------------------------------------------------------
 * The raw conversion path
 * ------------------------------------------------------------------------------------- */

/* Variable-length string -> opaque RAW_TAG of the same (stored) size: the bytes stay as
 * they are, so the caller receives the stored heap ids. Declines every other pair, so it
 * never takes part in anyone else's conversions. */
static herr_t conv_vlen_raw(hid_t src, hid_t dst, H5T_cdata_t *cdata, size_t nelmts,
                            size_t buf_stride, size_t bkg_stride, void *buf, void *bkg,
                            hid_t dxpl) {
    (void)nelmts, (void)buf_stride, (void)bkg_stride, (void)buf, (void)bkg, (void)dxpl;
    switch (cdata->command) {
    case H5T_CONV_INIT: {
        if (H5Tget_class(src) != H5T_STRING || H5Tis_variable_str(src) <= 0 ||
            H5Tget_class(dst) != H5T_OPAQUE)
            return -1;
        char *tag = H5Tget_tag(dst);
        const int ours = tag && strcmp(tag, RAW_TAG) == 0;
        if (tag) H5free_memory(tag);
        /* the source is the stored type here: its size is the heap id's */
        if (!ours || H5Tget_size(src) != H5Tget_size(dst)) return -1;
        cdata->need_bkg = H5T_BKG_NO;
        return 0;
    }
    case H5T_CONV_CONV: return 0; /* same size, same place: nothing moves */
    case H5T_CONV_FREE: return 0;
    default: return -1;
    }
}

/* Registered once per process, under the HDF5 lock. An application that shuts HDF5 down
 * (H5close) drops the registration; the raw read then fails with "no conversion path",
 * which refuses the string rather than reading it unchecked. */
static int conv_registered;

static int ensure_registered(void) {
    if (conv_registered) return 0;
    hid_t s = H5Tcopy(H5T_C_S1);
    hid_t o = H5Tcreate(H5T_OPAQUE, 16);
    int ok = s >= 0 && o >= 0 && H5Tset_size(s, H5T_VARIABLE) >= 0 && H5Tset_tag(o, RAW_TAG) >= 0 &&
             H5Tregister(H5T_PERS_SOFT, "fmoe_vlen_raw", s, o, conv_vlen_raw) >= 0;
    if (o >= 0) H5Tclose(o);
    if (s >= 0) H5Tclose(s);
    if (!ok) return -1;
    conv_registered = 1;
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * The file's bytes
 * ------------------------------------------------------------------------------------- */

typedef struct rawfile {
    int fd;                   /* sec2: the driver's descriptor; else -1 */
    const uint8_t *mem;       /* core: the driver's image; else NULL */
    uint64_t eof;             /* bytes in the file */
    uint64_t base;            /* absolute offset of address 0 (the user block) */
    size_t sizeof_addr, sizeof_size;
} rawfile;

/* 1: checkable, 0: a driver we do not look into, < 0: HDF5 failed. */
static int rawfile_open(hid_t obj, rawfile *rf) {
    memset(rf, 0, sizeof *rf);
    rf->fd = -1;
    int rc = -1;
    hid_t file = H5Iget_file_id(obj);
    hid_t fapl = file >= 0 ? H5Fget_access_plist(file) : -1;
    hid_t fcpl = file >= 0 ? H5Fget_create_plist(file) : -1;
    hsize_t eof = 0, ub = 0;
    void *handle = NULL;
    if (fapl < 0 || fcpl < 0 || H5Fget_filesize(file, &eof) < 0 ||
        H5Pget_userblock(fcpl, &ub) < 0 ||
        H5Pget_sizes(fcpl, &rf->sizeof_addr, &rf->sizeof_size) < 0)
        goto done;
    rf->eof = eof;
    rf->base = ub;
    const hid_t driver = H5Pget_driver(fapl);
    if (driver != H5FD_SEC2 && driver != H5FD_CORE) {
        rc = 0;
        goto done;
    }
    if (H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) < 0 || !handle) goto done;
    if (driver == H5FD_SEC2)
        rf->fd = *(int *)handle;
    else
        rf->mem = *(const uint8_t **)handle;
    rc = rf->fd >= 0 || rf->mem ? 1 : -1;
done:
    if (fcpl >= 0) H5Pclose(fcpl);
    if (fapl >= 0) H5Pclose(fapl);
    if (file >= 0) H5Fclose(file);
    return rc;
}

/* Whether n bytes at file address addr (relative to the base) lie inside the file. */
static int inside(const rawfile *rf, uint64_t addr, uint64_t n) {
    const uint64_t room = rf->eof > rf->base ? rf->eof - rf->base : 0;
    return addr <= room && n <= room - addr;
}

/* Reads n bytes at file address addr (relative to the base). 0, or -1 when the range
 * is not inside the file or the read fails. */
static int raw_read(const rawfile *rf, uint64_t addr, uint64_t n, uint8_t *out) {
    if (addr > rf->eof || rf->base > rf->eof - addr || n > rf->eof - addr - rf->base) return -1;
    const uint64_t at = rf->base + addr;
    if (rf->mem) {
        memcpy(out, rf->mem + at, n);
        return 0;
    }
    return fmoe__pread_all(rf->fd, out, (size_t)n, (long long)at);
}

static uint64_t le(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = v << 8 | p[i];
    return v;
}

/* ---------------------------------------------------------------------------------------
 * Global heap collections
 * ------------------------------------------------------------------------------------- */

/* One collection, decoded: the size of each present object (-1: absent). */
typedef struct collection {
    uint64_t addr; /* 0: none cached */
    int64_t *size; /* [MAX_IDX + 1] */
    char why[160]; /* non-empty: the collection is damaged, and how */
} collection;

/* Decodes the collection at addr into c the way libhdf5 1.10.8's
 * H5HG__cache_heap_deserialize walks it, refusing whatever would make that walk or a
 * later H5HG_read leave the collection. */
static int collection_load(const rawfile *rf, uint64_t addr, collection *c) {
    c->addr = addr;
    c->why[0] = '\0';
    for (size_t i = 0; i <= MAX_IDX; i++) c->size[i] = -1;
    const uint64_t ss = rf->sizeof_size;
    const uint64_t hdr = ALIGN8(8 + ss), objhdr = 8 + ss;
    uint8_t head[32];
    if (ss < 2 || ss > 8 || raw_read(rf, addr, 8 + ss, head) < 0) {
        snprintf(c->why, sizeof c->why, "its collection at address %llu is outside the file",
                 (unsigned long long)addr);
        return 0;
    }
    if (memcmp(head, "GCOL", 4) != 0 || head[4] != GCOL_VERSION) {
        snprintf(c->why, sizeof c->why,
                 "address %llu holds no global heap collection (no GCOL version 1 signature)",
                 (unsigned long long)addr);
        return 0;
    }
    const uint64_t size = le(head + 8, (size_t)ss);
    if (size < hdr || size > rf->eof) {
        snprintf(c->why, sizeof c->why,
                 "its collection at address %llu claims %llu bytes (the file has %llu)",
                 (unsigned long long)addr, (unsigned long long)size,
                 (unsigned long long)rf->eof);
        return 0;
    }
    uint8_t *img = malloc((size_t)size);
    if (!img) return fmoe_error_set(FMOE_ENOMEM, "out of memory for a %llu-byte heap collection",
                                    (unsigned long long)size);
    if (raw_read(rf, addr, size, img) < 0) {
        snprintf(c->why, sizeof c->why,
                 "its collection at address %llu (%llu bytes) runs past the end of the file",
                 (unsigned long long)addr, (unsigned long long)size);
        free(img);
        return 0;
    }
    for (uint64_t p = hdr; p < size;) {
        const uint64_t left = size - p;
        if (left < objhdr) break; /* a tail too small for a header is free space */
        const unsigned idx = (unsigned)le(img + p, 2);
        const uint64_t osize = le(img + p + 8, (size_t)ss);
        uint64_t need;
        if (idx > 0) {
            need = osize > left - objhdr ? UINT64_MAX : objhdr + ALIGN8(osize);
        } else {
            need = osize; /* the free-space object's size includes its header */
        }
        if (need < objhdr || need > left) {
            snprintf(c->why, sizeof c->why,
                     "object %u of the collection at address %llu claims %llu bytes, %llu are "
                     "left in it",
                     idx, (unsigned long long)addr, (unsigned long long)osize,
                     (unsigned long long)left);
            break;
        }
        c->size[idx] = (int64_t)osize;
        p += need;
    }
    free(img);
    return 0;
}

/* Checks one stored heap id (len, addr, idx). 0, or FMOE_EFORMAT naming `what`. */
static int check_id(const rawfile *rf, collection *c, const uint8_t *id, const char *path,
                    const char *what, int64_t element, int64_t count) {
    const uint64_t len = le(id, 4);
    const uint64_t addr = le(id + 4, rf->sizeof_addr);
    const uint64_t idx = le(id + 4 + rf->sizeof_addr, 4);
    if (addr == 0) return 0; /* a null string: libhdf5 reads nothing */
    if (c->addr != addr) FMOE_FORWARD_IF_ERROR(collection_load(rf, addr, c));
    char where[48] = "";
    if (count != 1) snprintf(where, sizeof where, "[%lld]", (long long)element);
    if (c->why[0])
        return fmoe_error_set(FMOE_EFORMAT, "%s: %s%s: damaged string: %s", path, what, where,
                              c->why);
    if (idx == 0 || idx > MAX_IDX || c->size[idx] < 0)
        return fmoe_error_set(FMOE_EFORMAT,
                              "%s: %s%s: damaged string: heap object %llu is not in the "
                              "collection at address %llu",
                              path, what, where, (unsigned long long)idx,
                              (unsigned long long)addr);
    if ((uint64_t)c->size[idx] != len)
        return fmoe_error_set(FMOE_EFORMAT,
                              "%s: %s%s: damaged string: %llu bytes long, its heap object "
                              "holds %lld",
                              path, what, where, (unsigned long long)len,
                              (long long)c->size[idx]);
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Entry point
 * ------------------------------------------------------------------------------------- */

int fmoe__h5_vlen_check(hid_t obj, int is_attr, int64_t count, const char *path,
                        const char *what) {
    if (count <= 0) return 0;
    char msg[256];
    rawfile rf;
    int have = rawfile_open(obj, &rf);
    if (have < 0)
        return fmoe_error_set(FMOE_EIO, "%s: %s: cannot inspect the file: %s", path, what,
                              fmoe__h5_errmsg(msg, sizeof msg));
    if (have == 0) return 0;
    FMOE_RETURN_ERROR_IF(rf.sizeof_addr < 2 || rf.sizeof_addr > 8, FMOE_EFORMAT,
                         "%s: %s: addresses of %zu bytes", path, what, rf.sizeof_addr);
    const size_t id_size = 8 + rf.sizeof_addr;
    /* every element holds one id stored inside the file: more than fit is a forged extent */
    FMOE_RETURN_ERROR_IF((uint64_t)count > rf.eof / id_size, FMOE_EFORMAT,
                         "%s: %s: %lld strings cannot fit in a %llu-byte file", path, what,
                         (long long)count, (unsigned long long)rf.eof);
    FMOE_RETURN_ERROR_IF(ensure_registered() < 0, FMOE_EINTERNAL,
                         "%s: %s: cannot register the raw string conversion", path, what);
    int rc = 0;
    hid_t raw = H5Tcreate(H5T_OPAQUE, id_size);
    uint8_t *ids = malloc((size_t)count * id_size);
    collection c = {.addr = 0, .size = malloc((MAX_IDX + 1) * sizeof(int64_t))};
    if (raw < 0 || !ids || !c.size || H5Tset_tag(raw, RAW_TAG) < 0) {
        rc = fmoe_error_set(FMOE_ENOMEM, "%s: %s: out of memory", path, what);
        goto done;
    }
    herr_t e = is_attr ? H5Aread(obj, raw, ids)
                       : fmoe__h5_dread(obj, raw, H5S_ALL, H5S_ALL, ids);
    if (e < 0) {
        rc = fmoe_error_set(FMOE_EFORMAT, "%s: %s: cannot read: %s", path, what,
                            fmoe__h5_errmsg(msg, sizeof msg));
        goto done;
    }
    for (int64_t i = 0; i < count && rc == 0; i++)
        rc = check_id(&rf, &c, ids + (size_t)i * id_size, path, what, i, count);
done:
    free(c.size);
    free(ids);
    if (raw >= 0) H5Tclose(raw);
    return rc;
}

/* ---------------------------------------------------------------------------------------
 * Before H5Fopen: the superblock and the root group's object header
 * ------------------------------------------------------------------------------------- */

#define MAX_HEADER_CHUNKS 256
#define MAX_HEADER_BYTES ((uint64_t)16 << 20) /* fmoe's root headers hold a few KiB */
#define UNDEF_ADDR UINT64_MAX

/* A NUL-terminated name at p with `room` bytes left: its stored length (the NUL
 * included, padded to 8 when `pad`), or 0 when no NUL comes before the end. libhdf5 copies
 * member and tag names with strdup, which reads to the first NUL wherever it is. */
static uint64_t name_len(const uint8_t *p, uint64_t room, int pad) {
    const uint8_t *nul = memchr(p, 0, (size_t)room);
    if (!nul) return 0;
    const uint64_t n = (uint64_t)(nul - p) + 1;
    return pad ? ALIGN8(n) : n;
}

/* The number of bytes libhdf5 uses to encode a compound member's offset in a version-3
 * datatype of `size` bytes (H5VM_limit_enc_size: floor(log2(size)) / 8 + 1). */
static unsigned offset_bytes(uint64_t size) {
    unsigned lg = 0;
    while (size >> (lg + 1)) lg++;
    return lg / 8 + 1;
}

/* A datatype (of a datatype message, type 0x03, of an attribute, or nested in either):
 * NULL when libhdf5 1.10.8 may decode it, else why not; *used receives its encoded length.
 * Layout (HDF5 file format spec, "Datatype Message"): class and version, 24 class bits, the
 * element size (4 bytes), then the class's properties, which for compound, enumerated,
 * variable-length and array types nest other datatypes. libhdf5 decodes the properties
 * trusting every count and name in them: member and tag names are copied with strdup or
 * by their stated length, so a name without its NUL (a fuzzed trace) read past the header
 * chunk. A variable-length element is stored as a heap id (length, collection address,
 * index) and read at that size whatever the datatype says, so a smaller stored size made
 * H5Aread copy past an attribute's value; its base type sizes each element's conversion
 * buffer, length x base size, so a forged 4 GB base made H5T__conv_vlen clear gigabytes
 * for a one-character string: a string's base beyond 16 bytes (it is one character) and
 * a sequence's beyond 64 KiB are refused. */
static const char *dtype_parse(const uint8_t *dt, uint64_t len, size_t so, int depth,
                               uint64_t *used) {
    if (len < 8) return "has a datatype shorter than 8 bytes";
    if (depth > 32) return "has datatypes nested too deeply";
    const unsigned cls = dt[0] & 0x0F, version = dt[0] >> 4;
    const uint64_t bits = le(dt + 1, 3), size = le(dt + 4, 4);
    uint64_t at = 8, n, sub;
    const char *why;
    /* numbers (fixed- and floating-point, time, bitfields) are at most 16 bytes in any
     * file libhdf5 writes; a forged 4 GB float made it allocate and touch 4 GB to convert
     * four of them (a fuzzed predictor) */
    if ((cls <= 2 || cls == 4) && (size < 1 || size > 64))
        return "has a number of a forged size";
    switch (cls) {
    case 0: at += 4; break;  /* fixed-point: offset, precision */
    case 1: at += 12; break; /* floating-point: offset, precision, exponent and mantissa */
    case 2: at += 2; break;  /* time: precision */
    case 3: case 7: break;   /* string, reference: none */
    case 4: at += 4; break;  /* bitfield: offset, precision */
    case 5:                  /* opaque: the tag, its padded length in the class bits */
        at += bits & 0xFF;
        break;
    case 6: /* compound: per member its name, offset (and v1 dimensions), type */
        for (uint64_t i = 0, members = bits & 0xFFFF; i < members; i++) {
            if (at >= len || (n = name_len(dt + at, len - at, version < 3)) == 0)
                return "has a compound member name that runs past the datatype";
            at += n + (version == 1 ? 4 + 28 : version == 2 ? 4 : offset_bytes(size));
            if (at > len) return "has a compound member that runs past the datatype";
            if ((why = dtype_parse(dt + at, len - at, so, depth + 1, &sub)) != NULL) return why;
            at += sub;
        }
        break;
    case 8: { /* enumerated: the base type, the names, then the values */
        if ((why = dtype_parse(dt + at, len - at, so, depth + 1, &sub)) != NULL) return why;
        const uint64_t base = le(dt + at + 4, 4);
        at += sub;
        const uint64_t members = bits & 0xFFFF;
        for (uint64_t i = 0; i < members; i++) {
            if (at >= len || (n = name_len(dt + at, len - at, version < 3)) == 0)
                return "has an enumeration name that runs past the datatype";
            at += n;
        }
        if (base && members > (len - at) / base)
            return "has enumeration values that run past the datatype";
        at += members * base;
        break;
    }
    case 9: /* variable-length: the base type */
        if (size != 8 + so) return "has a variable-length datatype of the wrong size";
        if ((why = dtype_parse(dt + at, len - at, so, depth + 1, &sub)) != NULL) return why;
        /* a string's base is a character (1 byte; 16 allowed); a sequence's any type, up
         * to 64 KiB per element */
        if (le(dt + at + 4, 4) < 1 || le(dt + at + 4, 4) > ((bits & 0x0F) == 1 ? 16u : 65536u))
            return "has a variable-length datatype of a forged base size";
        at += sub;
        break;
    case 10: { /* array: rank, (reserved,) dimensions, (v2: permutation,) the base type */
        if (len < 9) return "has an array datatype without its rank";
        const uint64_t rank = dt[8];
        at += version < 3 ? 4 + rank * 8 : 1 + rank * 4;
        if (at > len) return "has array dimensions that run past the datatype";
        if ((why = dtype_parse(dt + at, len - at, so, depth + 1, &sub)) != NULL) return why;
        at += sub;
        break;
    }
    default: /* a class libhdf5 refuses itself: nothing past its header is read */
        *used = 8;
        return NULL;
    }
    if (at > len) return "has properties that run past the datatype";
    *used = at;
    return NULL;
}

static const char *dtype_check(const uint8_t *dt, uint64_t len, size_t so) {
    uint64_t used;
    return dtype_parse(dt, len, so, 0, &used);
}

/* A dataspace (a dataspace message, type 0x01, or an attribute's): NULL and its number of
 * elements in *nelem (saturated at cap + 1), or why it cannot be read. Layout: version,
 * rank, flags, then (v1) 5 reserved bytes or (v2) the type (2: the null space), then rank
 * dimensions of sizeof_size bytes (their maxima after them, not needed here). A version
 * or rank libhdf5 refuses itself passes with *nelem = 0. */
static const char *dataspace_elements(const uint8_t *ds, uint64_t len, size_t sl, uint64_t cap,
                                      uint64_t *nelem) {
    *nelem = 0;
    if (len < 4) return "has a dataspace shorter than 4 bytes";
    const unsigned version = ds[0], rank = ds[1];
    if (version < 1 || version > 2 || rank > 32) return NULL;
    const uint64_t dims_at = version == 1 ? 8 : 4;
    if (dims_at + (uint64_t)rank * sl > len) return "has a dataspace whose dimensions run past it";
    uint64_t n = version == 2 && ds[3] == 2 ? 0 : 1;
    for (unsigned r = 0; r < rank && n; r++) {
        const uint64_t d = le(ds + dims_at + (uint64_t)r * sl, sl);
        n = d == 0 ? 0 : n > cap / d ? cap + 1 : n * d;
    }
    *nelem = n;
    return NULL;
}

/* A shared message's body (message flag 0x02, or an attribute's shared datatype): the
 * address of the object header that holds the message (a committed datatype), or
 * UNDEF_ADDR when it lives in the shared-message heap, which we do not parse. Version 1:
 * version, 7 reserved bytes, a symbol-table entry (a sizeof_size field, then the
 * address); versions 2-3: version, type (1: the heap, 2: an object header), then the
 * address (H5O_shared_decode). */
static const char *shared_target(const uint8_t *m, uint64_t size, size_t so, size_t sl,
                                 uint64_t *addr) {
    *addr = UNDEF_ADDR;
    if (size < 2) return "has a shared message cut short";
    const unsigned version = m[0];
    if (version == 1) {
        if (size < 8 + sl + so) return "has a shared message cut short";
        *addr = le(m + 8 + sl, so);
    } else if (version == 2 || version == 3) {
        if (version == 3 && m[1] == 1) return NULL; /* in the shared-message heap */
        if (size < 2 + so) return "has a shared message cut short";
        *addr = le(m + 2, so);
    }
    return NULL; /* another version: libhdf5 refuses it itself */
}

/* An attribute message (type 0x0C) of a header we walk. libhdf5 1.10.8 decodes it
 * (H5O__attr_decode) trusting its three stored part sizes and then copies the value,
 * elements x datatype size, from after them: nothing compares either with the message's
 * own size, so a flipped size byte copies past the chunk buffer (a damaged predictor file
 * did: tests/fuzz/crashes/predictor/). Layout (HDF5 file format spec, "Attribute Message"):
 * version, flags (v1: reserved), name/datatype/dataspace sizes (2 bytes each), v3: the
 * name's encoding, then the three parts (v1: each padded to 8 bytes), then the value.
 * Shared datatypes or dataspaces (flags 1, 2) live elsewhere: only the parts' sizes are
 * checked then, and a shared datatype's own header is returned in *shared_dt. */
static int attr_message_check(const uint8_t *m, uint64_t size, size_t so, size_t sl,
                              const char *path, const char *what, uint64_t *shared_dt) {
    const char *why = NULL;
    *shared_dt = UNDEF_ADDR;
    if (size < 8) {
        why = "is shorter than its fixed fields";
        goto bad;
    }
    const unsigned version = m[0], flags = version >= 2 ? m[1] : 0;
    if (version < 1 || version > 3) return 0; /* libhdf5 refuses the version itself */
    const uint64_t name_len = le(m + 2, 2), dt_len = le(m + 4, 2), ds_len = le(m + 6, 2);
    const uint64_t head = version == 3 ? 9 : 8;
    const uint64_t name_at = head;
    const uint64_t dt_at = name_at + (version == 1 ? ALIGN8(name_len) : name_len);
    const uint64_t ds_at = dt_at + (version == 1 ? ALIGN8(dt_len) : dt_len);
    const uint64_t value_at = ds_at + (version == 1 ? ALIGN8(ds_len) : ds_len);
    if (value_at > size) {
        why = "has name, datatype and dataspace sizes past its end";
        goto bad;
    }
    /* libhdf5 copies the name with strdup, then compares lengths */
    if (name_len == 0 || !memchr(m + name_at, 0, (size_t)name_len)) {
        why = "has a name without its terminating NUL";
        goto bad;
    }
    /* a shared datatype: the header that holds it is checked by the caller */
    if ((flags & 1) && (why = shared_target(m + dt_at, dt_len, so, sl, shared_dt)) != NULL)
        goto bad;
    if (flags & 3) return 0; /* shared parts: their sizes live elsewhere */
    if ((why = dtype_check(m + dt_at, dt_len, so)) != NULL) goto bad;
    const uint64_t elem = le(m + dt_at + 4, 4);
    const uint64_t room = size - value_at;
    uint64_t nelem;
    if ((why = dataspace_elements(m + ds_at, ds_len, sl, room, &nelem)) != NULL) goto bad;
    if (nelem && elem > room / nelem) {
        why = "claims a value larger than the message";
        goto bad;
    }
    return 0;
bad:
    return fmoe_error_set(FMOE_EFORMAT,
                          "%s: damaged HDF5 file: an attribute message of the %s object header "
                          "(%llu bytes) %s",
                          path, what, (unsigned long long)size, why);
}

/* A symbol table message (type 0x11: a v1 B-tree address, a local heap address) names the
 * local heap that holds a group's link names. libhdf5 1.10.8 allocates the heap's data
 * segment at the size its header states before reading it, and copies into the buffer
 * without checking the allocation (a fuzzed trace's forged size: SEGV in
 * H5F__accum_read from H5G__stab_lookup): the heap must say "HEAP" version 0 and its data
 * segment lie inside the file. */
static const char *local_heap_check(const rawfile *rf, const uint8_t *msg, uint64_t size) {
    const size_t so = rf->sizeof_addr, sl = rf->sizeof_size;
    if (size < 2 * so) return "has a symbol table message shorter than its two addresses";
    const uint64_t heap = le(msg + so, so);
    uint8_t h[8 + 2 * 8 + 8];
    if (raw_read(rf, heap, 8 + 2 * sl + so, h) < 0) return "names a local heap outside the file";
    if (memcmp(h, "HEAP", 4) != 0 || h[4] != 0) return "names a local heap without its signature";
    const uint64_t data_size = le(h + 8, sl), data_addr = le(h + 8 + 2 * sl, so);
    if (!inside(rf, data_addr, data_size))
        return "names a local heap whose data segment runs past the end of the file";
    return NULL;
}

/* A data layout message (type 0x08) of a chunked dataset: libhdf5 1.10.8 divides by each
 * chunk dimension while opening the dataset (H5D__chunk_set_info), so a dimension of 0 (a
 * fuzzed trace) raised SIGFPE. Versions 1-2 (dimensionality, class, 5 reserved bytes,
 * the address, then 4-byte dimensions), 3 (class 2: dimensionality, the address, 4-byte
 * dimensions) and 4 (class 2: flags, dimensionality, the bytes per dimension, then the
 * dimensions) are checked; a message too short for its dimensions is refused too. A
 * compact layout (versions 3-4: the data in the message) must hold its stated size, which
 * the caller compares with the dataset's elements x element size: libhdf5 copies those
 * from the message without comparing (a fuzzed store's read ran 1.5 KB past it). */
#define MAX_FILTERS 32 /* libhdf5's H5Z_MAX_NFILTERS */

/* A filter pipeline message (type 0x0B): the filters' ids in pipeline order (writing
 * applies them first to last, reading last to first). Version 1: version, count, 6
 * reserved bytes, then per filter its id, name length, flags, value count, the name
 * (padded to 8) and the values (4 bytes each, padded to an even count); version 2: the
 * name length only for ids >= 256, no padding. */
static const char *pipeline_parse(const uint8_t *m, uint64_t size, uint16_t *ids, int *n) {
    *n = 0;
    if (size < 2) return "has a filter pipeline without its filter count";
    const unsigned version = m[0], count = m[1];
    if (count > MAX_FILTERS) return "has more filters than libhdf5 allows";
    uint64_t at = version == 1 ? 8 : 2;
    for (unsigned i = 0; i < count; i++) {
        if (at + 2 > size) return "has a filter that runs past its pipeline";
        const uint64_t id = le(m + at, 2);
        uint64_t name = 0;
        at += 2;
        if (version == 1 || id >= 256) {
            if (at + 2 > size) return "has a filter that runs past its pipeline";
            name = le(m + at, 2);
            at += 2;
        }
        if (at + 4 > size) return "has a filter that runs past its pipeline";
        const uint64_t values = le(m + at + 2, 2);
        at += 4 + (version == 1 ? ALIGN8(name) : name) +
              4 * (version == 1 && (values & 1) ? values + 1 : values);
        if (at > size) return "has a filter that runs past its pipeline";
        ids[(*n)++] = (uint16_t)id;
    }
    return NULL;
}

typedef struct layout_info {
    int64_t compact;      /* a compact layout's data size; -1: not compact */
    uint64_t btree;       /* a version-3 chunked layout's v1 B-tree; 0: none */
    uint64_t chunk_bytes; /* its chunk's bytes (the dimensions' product, the element's last) */
    unsigned dims;        /* its dimensionality (the dataset's rank + 1) */
    int contiguous;       /* a version-3 contiguous layout: its data's address and size */
    uint64_t contig_addr, contig_size;
} layout_info;

static const char *layout_check(const uint8_t *m, uint64_t size, size_t so, size_t sl,
                                layout_info *li) {
    if (size < 2) return NULL;
    const unsigned version = m[0];
    if (version == 3 && m[1] == 1) { /* contiguous: address, size */
        if (size < 2 + so + sl) return "has a contiguous layout cut short";
        li->contiguous = 1;
        li->contig_addr = le(m + 2, so);
        li->contig_size = le(m + 2 + so, sl);
        return NULL;
    }
    if ((version == 3 || version == 4) && m[1] == 0) { /* compact: size (2 bytes), the data */
        if (size < 4 || 4 + le(m + 2, 2) > size) return "has compact data that runs past it";
        li->compact = (int64_t)le(m + 2, 2);
        return NULL;
    }
    uint64_t at, rank, width = 4;
    if (version <= 2) {
        if (size < 8 || m[2] != 2) return NULL; /* not chunked */
        rank = m[1];
        at = 8 + so;
    } else if (version == 3) {
        if (m[1] != 2) return NULL;
        if (size < 3) return "has a chunked layout without its dimensionality";
        rank = m[2];
        at = 3 + so;
    } else if (version == 4) {
        if (m[1] != 2) return NULL;
        if (size < 5) return "has a chunked layout without its dimensionality";
        rank = m[3];
        width = m[4];
        if (width < 1 || width > 8) return "has a chunked layout of a bad dimension width";
        at = 5;
    } else {
        return NULL; /* libhdf5 refuses the version itself */
    }
    if (at + rank * width > size) return "has chunk dimensions that run past the message";
    uint64_t bytes = 1;
    for (uint64_t i = 0; i < rank; i++) {
        const uint64_t d = le(m + at + i * width, (size_t)width);
        if (d == 0) return "has a chunk dimension of 0";
        bytes = bytes > UINT32_MAX / d ? (uint64_t)UINT32_MAX + 1 : bytes * d;
    }
    if (version == 3 && rank >= 2 && rank <= 33) {
        li->btree = le(m + 3, so);
        li->chunk_bytes = bytes;
        li->dims = (unsigned)rank;
    }
    return NULL;
}

/* The v1 B-tree that indexes a version-3 chunked dataset's chunks ("TREE", node type 1, its
 * level, entries used, two siblings, then keys and children in turn; a key is the chunk's
 * stored size, its filter mask and its offsets). libhdf5 1.10.8 reads a chunk at its stored
 * size and, when no filter applies to it (none in the pipeline, or all skipped by its
 * mask), copies a whole chunk out of that buffer: a forged size below the chunk's made it
 * read past (a fuzzed store). Every leaf's chunk must lie inside the file and, unfiltered,
 * hold exactly a chunk. `budget` bounds the nodes visited, so a cycle ends. */
/* The stored size an unfiltered-after-all chunk must have: the chunk's bytes when every
 * filter its mask leaves applied keeps the size (shuffle; fletcher32 adds its 4-byte
 * checksum), or 0 when a filter that changes the size (a compressor) still applies and
 * no size can be expected. Bit i of the mask skips filter i. */
static uint64_t unfiltered_size(const layout_info *li, const uint16_t *ids, int n, uint64_t mask) {
    uint64_t bytes = li->chunk_bytes;
    for (int i = 0; i < n; i++) {
        if (mask & ((uint64_t)1 << i)) continue; /* skipped for this chunk */
        if (ids[i] == 3) bytes += 4;             /* fletcher32 */
        else if (ids[i] != 2) return 0;          /* not shuffle: the size changes */
    }
    return bytes;
}

static const char *chunk_btree_check(const rawfile *rf, uint64_t addr, const layout_info *li,
                                     const uint16_t *ids, int nfilters, int level_want,
                                     int64_t *budget) {
    const size_t so = rf->sizeof_addr;
    uint8_t h[8 + 2 * 8];
    if (raw_read(rf, addr, 8 + 2 * so, h) < 0) return "has a chunk index node outside the file";
    if (memcmp(h, "TREE", 4) != 0 || h[4] != 1) return "has a chunk index node without its signature";
    const int level = h[5];
    if (level_want >= 0 && level != level_want)
        return "has a chunk index node at the wrong level";
    const uint64_t entries = le(h + 6, 2);
    const uint64_t key = 8 + 8 * (uint64_t)li->dims, body = (entries + 1) * key + entries * so;
    /* a well-formed index reads each node once, in all at most the file's bytes: a node
     * shared by many parents (a forged graph) runs out of this budget instead of costing
     * minutes */
    if ((*budget -= (int64_t)(body + 8 + 2 * so)) < 0 || body > rf->eof)
        return "has a chunk index larger than the file";
    uint8_t *b = malloc(body ? (size_t)body : 1);
    if (!b) return "has a chunk index node too large to read";
    const char *why = raw_read(rf, addr + 8 + 2 * so, body, b) < 0
                          ? "has a chunk index node that runs past the end of the file"
                          : NULL;
    for (uint64_t i = 0; i < entries && !why; i++) {
        const uint8_t *k = b + i * (key + so);
        const uint64_t size = le(k, 4), mask = le(k + 4, 4), child = le(k + key, so);
        if (level > 0) {
            why = chunk_btree_check(rf, child, li, ids, nfilters, level - 1, budget);
        } else if (!inside(rf, child, size)) {
            why = "has a chunk that runs past the end of the file";
        } else {
            const uint64_t want = unfiltered_size(li, ids, nfilters, mask);
            if (want && size != want)
                why = "has an unfiltered chunk whose stored size is not the chunk's";
        }
    }
    free(b);
    return why;
}

/* The undefined address of a file with addresses of `so` bytes (all ones). */
static uint64_t undef_addr(size_t so) {
    return so == 8 ? UNDEF_ADDR : ((uint64_t)1 << (8 * so)) - 1;
}

/* What one object header says about its dataset, gathered message by message and
 * compared once the whole header is read. */
typedef struct header_state {
    layout_info layout;
    uint64_t ds_elements, dt_bytes; /* the dataset's extent and element size */
    int ds_shared;                  /* a shared dataspace: its extent elsewhere */
    uint16_t filter_ids[MAX_FILTERS]; /* the filter pipeline (message 0x0B) */
    int nfilters;
} header_state;

/* One message of a header (the attribute messages apart): NULL, or why libhdf5 must not
 * decode it. A shared datatype's header address goes to *committed. */
static const char *message_check(const rawfile *rf, unsigned type, int shared, const uint8_t *m,
                                 uint64_t size, header_state *hs, uint64_t *committed) {
    const size_t so = rf->sizeof_addr, sl = rf->sizeof_size;
    switch (type) {
    case 0x01: /* dataspace */
        if (shared) {
            hs->ds_shared = 1;
            return NULL;
        }
        return dataspace_elements(m, size, sl, rf->eof, &hs->ds_elements);
    case 0x03: /* datatype */
        if (shared) return shared_target(m, size, so, sl, committed);
        if (size >= 8) hs->dt_bytes = le(m + 4, 4);
        return dtype_check(m, size, so);
    case 0x08: return layout_check(m, size, so, sl, &hs->layout);
    case 0x0B: return shared ? NULL : pipeline_parse(m, size, hs->filter_ids, &hs->nfilters);
    case 0x11: return local_heap_check(rf, m, size);
    default: return NULL;
    }
}

/* Walks the object header at addr (version 1 or 2) and every continuation chunk it
 * names, checking that each lies inside the file before libhdf5 allocates it. */
static int header_check(const rawfile *rf, uint64_t addr, const char *path, const char *what,
                        int depth) {
    const size_t so = rf->sizeof_addr, sl = rf->sizeof_size;
    uint8_t pre[64];
    uint64_t chunk_addr[MAX_HEADER_CHUNKS], chunk_len[MAX_HEADER_CHUNKS];
    int nchunks = 0, version;
    uint64_t total = 0;
    FMOE_RETURN_ERROR_IF(raw_read(rf, addr, 16, pre) < 0, FMOE_EFORMAT,
                         "%s: damaged HDF5 file: the %s object header (address %llu) is outside "
                         "the file",
                         path, what, (unsigned long long)addr);
    if (pre[0] == 1) { /* version 1: a 16-byte prefix, then chunk 0 */
        version = 1;
        chunk_addr[0] = addr + 16;
        chunk_len[0] = le(pre + 8, 4);
    } else if (memcmp(pre, "OHDR", 4) == 0 && pre[4] == 2) {
        version = 2;
        const unsigned flags = pre[5];
        uint64_t at = 6 + (flags & 0x20 ? 16 : 0) + (flags & 0x10 ? 4 : 0);
        const size_t w = (size_t)1 << (flags & 3);
        FMOE_RETURN_ERROR_IF(raw_read(rf, addr, at + w, pre) < 0, FMOE_EFORMAT,
                             "%s: damaged HDF5 file: the %s object header is cut off", path, what);
        chunk_len[0] = le(pre + at, w);
        chunk_addr[0] = addr + at + w;
    } else {
        return fmoe_error_set(FMOE_EFORMAT,
                              "%s: damaged HDF5 file: no object header at address %llu (%s)", path,
                              (unsigned long long)addr, what);
    }
    nchunks = 1;
    header_state hs = {.layout = {.compact = -1}};
    for (int c = 0; c < nchunks; c++) {
        const uint64_t a = chunk_addr[c], n = chunk_len[c];
        if (!inside(rf, a, n) || (total += n) > MAX_HEADER_BYTES)
            return fmoe_error_set(FMOE_EFORMAT,
                                  "%s: damaged HDF5 file: the %s object header claims a "
                                  "%llu-byte chunk at address %llu (the file has %llu bytes)",
                                  path, what, (unsigned long long)n, (unsigned long long)a,
                                  (unsigned long long)rf->eof);
        uint8_t *img = malloc(n ? (size_t)n : 1);
        if (!img) return fmoe_error_set(FMOE_ENOMEM, "%s: out of memory", path);
        if (raw_read(rf, a, n, img) < 0) {
            free(img);
            return fmoe_error_set(FMOE_EFORMAT,
                                  "%s: damaged HDF5 file: the %s object header runs past the "
                                  "end of the file",
                                  path, what);
        }
        /* version 2: continuation chunks open with "OCHK" and end with a checksum counted
         * in their length; chunk 0's checksum follows it, outside its length. libhdf5
         * verifies the checksums itself. */
        uint64_t p = version == 2 && c > 0 ? 4 : 0;
        const uint64_t end = version == 2 && c > 0 ? (n >= 4 ? n - 4 : 0) : n;
        /* message header: v1 8 bytes; v2 4, 6 with creation order (a shorter gap at the
         * end of a chunk is padding) */
        const uint64_t mh = version == 1 ? 8 : 4 + ((pre[5] & 0x04) ? 2 : 0);
        while (p + mh <= end) {
            unsigned type;
            uint64_t size;
            if (version == 1) {
                type = (unsigned)le(img + p, 2);
                size = le(img + p + 2, 2);
                p += 8;
            } else {
                type = img[p];
                size = le(img + p + 1, 2);
                p += 4 + ((pre[5] & 0x04) ? 2 : 0);
            }
            if (size > end - (p > end ? end : p)) {
                free(img);
                return fmoe_error_set(FMOE_EFORMAT,
                                      "%s: damaged HDF5 file: a message of the %s object header "
                                      "claims %llu bytes past its chunk",
                                      path, what, (unsigned long long)size);
            }
            /* message flag 0x02: a shared message, whose body is a reference */
            const int shared =
                ((version == 1 ? img[p - 4] : img[p - 1 - ((pre[5] & 0x04) ? 2 : 0)]) & 0x02) != 0;
            uint64_t committed = UNDEF_ADDR; /* a committed datatype the message uses */
            const char *why = message_check(rf, type, shared, img + p, size, &hs, &committed);
            if (why) {
                free(img);
                return fmoe_error_set(FMOE_EFORMAT, "%s: damaged HDF5 file: the %s object header %s",
                                      path, what, why);
            }
            if (type == 0x0C && !shared) {
                const int rc = attr_message_check(img + p, size, so, sl, path, what, &committed);
                if (rc < 0) {
                    free(img);
                    return rc;
                }
            }
            /* a committed datatype is loaded by libhdf5 from its own object header: checked
             * the same way (not the header itself - an attribute may share its own object's
             * type - and a chain 4 deep: a cycle ends there) */
            if (committed != UNDEF_ADDR && committed != undef_addr(so) && committed != addr &&
                depth < 4) {
                const int rc = header_check(rf, committed, path, "committed datatype", depth + 1);
                if (rc < 0) {
                    free(img);
                    return rc;
                }
            }
            if (type == 0x10 && size >= so + sl) { /* continuation: address, length */
                if (nchunks == MAX_HEADER_CHUNKS) {
                    free(img);
                    return fmoe_error_set(FMOE_EFORMAT,
                                          "%s: damaged HDF5 file: the %s object header has more "
                                          "than %d chunks",
                                          path, what, MAX_HEADER_CHUNKS);
                }
                chunk_addr[nchunks] = le(img + p, so);
                chunk_len[nchunks] = le(img + p + so, sl);
                nchunks++;
            }
            p += size;
        }
        free(img);
    }
    /* the bytes of the dataset's elements, when the header says them (0: it does not) */
    const uint64_t data_bytes = hs.dt_bytes == 0 || hs.ds_shared ? 0
                                : hs.ds_elements > UINT64_MAX / hs.dt_bytes
                                    ? UINT64_MAX
                                    : hs.ds_elements * hs.dt_bytes;
    const int64_t compact = hs.layout.compact;
    if (compact >= 0 && hs.dt_bytes > 0 && !hs.ds_shared && data_bytes != (uint64_t)compact)
        return fmoe_error_set(FMOE_EFORMAT,
                              "%s: damaged HDF5 file: the %s object header holds %lld bytes of "
                              "compact data for a dataset of %llu bytes",
                              path, what, (long long)compact, (unsigned long long)data_bytes);
    const uint64_t undef = undef_addr(so);
    /* a contiguous dataset's data inside the file (libhdf5 1.10.8 touched 4 GB for a forged
     * size before it compared the address with the end of the file: a fuzzed predictor's
     * bias vector) and holding the dataset's elements (a shorter store would be read past) */
    if (hs.layout.contiguous && hs.layout.contig_addr != undef) {
        if (!inside(rf, hs.layout.contig_addr, hs.layout.contig_size))
            return fmoe_error_set(FMOE_EFORMAT,
                                  "%s: damaged HDF5 file: the %s object header puts %llu bytes "
                                  "of data at address %llu, past the end of the file",
                                  path, what, (unsigned long long)hs.layout.contig_size,
                                  (unsigned long long)hs.layout.contig_addr);
        if (hs.layout.contig_size < data_bytes)
            return fmoe_error_set(FMOE_EFORMAT,
                                  "%s: damaged HDF5 file: the %s object header stores %llu bytes "
                                  "for a dataset of %llu bytes",
                                  path, what, (unsigned long long)hs.layout.contig_size,
                                  (unsigned long long)data_bytes);
    }
    if (hs.layout.dims && hs.layout.btree != undef) {
        int64_t budget = (int64_t)rf->eof;
        const char *why =
            chunk_btree_check(rf, hs.layout.btree, &hs.layout, hs.filter_ids, hs.nfilters, -1,
                              &budget);
        if (why)
            return fmoe_error_set(FMOE_EFORMAT, "%s: damaged HDF5 file: %s %s", path, what, why);
    }
    return 0;
}

int fmoe__h5_precheck(int fd, const void *image, uint64_t size, const char *path) {
    if (!image) {
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return 0; /* the open says why */
        size = (uint64_t)st.st_size;
    }
    rawfile rf = {.fd = image ? -1 : fd, .mem = image, .eof = size, .base = 0};
    uint8_t sb[128];
    /* libhdf5 looks for the signature at 0, 512, 1024, 2048, ... */
    uint64_t at = 0;
    for (;;) {
        if (at + 8 > size) return 0; /* no signature: H5Fopen says so itself */
        if (raw_read(&rf, at, 8, sb) == 0 && memcmp(sb, "\x89HDF\r\n\x1a\n", 8) == 0) break;
        at = at ? at * 2 : 512;
    }
    if (raw_read(&rf, at, 9, sb) < 0) return 0;
    const unsigned v = sb[8];
    uint64_t root = UNDEF_ADDR, ext = UNDEF_ADDR, base, eof_addr;
    if (v <= 1) {
        const uint64_t fixed = v == 0 ? 24 : 28;
        if (raw_read(&rf, at, fixed, sb) < 0) return 0;
        rf.sizeof_addr = sb[13];
        rf.sizeof_size = sb[14];
        if (rf.sizeof_addr < 2 || rf.sizeof_addr > 8 || rf.sizeof_size < 2 || rf.sizeof_size > 8)
            return 0; /* libhdf5 refuses these itself */
        const size_t so = rf.sizeof_addr;
        if (raw_read(&rf, at + fixed, 6 * so, sb + 32) < 0) return 0;
        base = le(sb + 32, so);
        eof_addr = le(sb + 32 + 2 * so, so);
        root = le(sb + 32 + 5 * so, so);
    } else if (v <= 3) {
        if (raw_read(&rf, at, 12, sb) < 0) return 0;
        rf.sizeof_addr = sb[9];
        rf.sizeof_size = sb[10];
        if (rf.sizeof_addr < 2 || rf.sizeof_addr > 8 || rf.sizeof_size < 2 || rf.sizeof_size > 8)
            return 0;
        const size_t so = rf.sizeof_addr;
        if (raw_read(&rf, at + 12, 4 * so, sb + 32) < 0) return 0;
        base = le(sb + 32, so);
        ext = le(sb + 32 + so, so);
        eof_addr = le(sb + 32 + 2 * so, so);
        root = le(sb + 32 + 3 * so, so);
    } else {
        return 0; /* a superblock version libhdf5 1.10 refuses itself */
    }
    const uint64_t undef = undef_addr(rf.sizeof_addr);
    /* libhdf5 takes the superblock's position as the base address (a user block before
     * it) whatever the stored base says, and moves the stored end of file by their
     * difference: so do we, so that we read the bytes libhdf5 will */
    rf.base = at;
    if (eof_addr != undef && base != undef) eof_addr -= base - at; /* wraps as libhdf5's */
    /* libhdf5 refuses a file shorter than its superblock's end-of-file address itself
     * ("truncated file"), but only after the core driver has grown its image to that
     * address (a fuzzed image asked for 4 GB): refused here, first */
    FMOE_RETURN_ERROR_IF(eof_addr == undef || eof_addr > size, FMOE_EFORMAT,
                         "%s: damaged or truncated HDF5 file: its superblock says it ends at "
                         "byte %llu, it has %llu",
                         path, (unsigned long long)(eof_addr == undef ? UINT64_MAX : eof_addr),
                         (unsigned long long)size);
    if (ext != undef)
        FMOE_FORWARD_IF_ERROR(header_check(&rf, ext, path, "superblock extension", 0));
    if (root != undef) FMOE_FORWARD_IF_ERROR(header_check(&rf, root, path, "root group", 0));
    return 0;
}

int fmoe__h5_link_check(hid_t loc, const char *name, const char *path) {
    rawfile rf;
    const int k = rawfile_open(loc, &rf);
    if (k == 0) return 0; /* a driver we do not look into */
    FMOE_RETURN_ERROR_IF(k < 0, FMOE_EIO, "%s: %s: cannot reach the file's bytes", path, name);
    H5L_info_t li;
    if (H5Lget_info(loc, name, &li, H5P_DEFAULT) < 0) return 0; /* the open that follows says why */
    /* a soft or external link would make libhdf5 load an object we did not check (or open
     * another file); fmoe's files have none */
    FMOE_RETURN_ERROR_IF(li.type != H5L_TYPE_HARD, FMOE_EFORMAT,
                         "%s: %s is a %s link; fmoe files hold hard links only", path, name,
                         li.type == H5L_TYPE_SOFT ? "soft" : "external");
    return header_check(&rf, li.u.address, path, name, 0);
}
