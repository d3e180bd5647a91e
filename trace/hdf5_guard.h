/*
 * hdf5_guard.h - validation our side does before libhdf5 dereferences what a damaged file
 * says, so that a damaged file is refused instead of crashing libhdf5 (the reasons are in
 * hdf5_guard.c).
 */
#ifndef FMOE_TRACE_HDF5_GUARD_H
#define FMOE_TRACE_HDF5_GUARD_H

#include <hdf5.h>
#include <stdint.h>

/* Checks every element of `obj` - an attribute (is_attr) or a dataset of `count`
 * variable-length strings - before it is read: each stored heap id must name an object
 * that exists, inside a well-formed global heap collection inside the file, with exactly
 * the id's length. Reads only the ids and the collections they name, each bounded by the
 * file's size. Call with the HDF5 lock held; `path` and `what` name the file and the object
 * in messages. @return 0 (also for files under a driver other than sec2 and core, which it
 * does not look into), FMOE_EFORMAT naming the element, FMOE_EIO, FMOE_ENOMEM. */
int fmoe__h5_vlen_check(hid_t obj, int is_attr, int64_t count, const char *path,
                        const char *what);

/* Checks, before H5Fopen, what libhdf5 1.10.8 sizes allocations by while opening: the
 * superblock's root group object header (and superblock extension), version 1 or 2, and
 * every continuation chunk they name must lie inside the file's `size` bytes (a forged
 * continuation length made H5Fopen try to allocate 5 TB). The bytes come from `image`
 * (`size` bytes) when not NULL, else from `fd` (pread; its size from fstat). A file without an HDF5 signature, or a superblock
 * this does not understand, passes: H5Fopen refuses it itself. @return 0, or
 * FMOE_EFORMAT naming `path` ("damaged HDF5 file: ..."), FMOE_ENOMEM. */
int fmoe__h5_precheck(int fd, const void *image, uint64_t size, const char *path);

/* Checks the object header that hard link `name` of `loc` points to (and its
 * continuation chunks and attribute messages), as fmoe__h5_precheck checks the root
 * group's, before libhdf5 loads it to open the object: libhdf5 1.10.8 sizes a header
 * chunk's buffer from the file before comparing it with the file's end, so a forged chunk
 * of a dataset asked for 17 GB. The link must exist (H5Lexists). Call with the HDF5 lock
 * held. @return 0 (also for soft links and unchecked drivers), FMOE_EFORMAT naming `path`
 * and `name`, FMOE_EIO, FMOE_ENOMEM. */
int fmoe__h5_link_check(hid_t loc, const char *name, const char *path);

#endif
