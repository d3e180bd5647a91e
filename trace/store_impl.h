/*
 * store_impl.h - internals of the store writer and reader (trace/store_*.c).
 */
#ifndef FMOE_STORE_IMPL_H
#define FMOE_STORE_IMPL_H

#include <hdf5.h>

/* Writes a 1-D dataset `name` of n variable-length UTF-8 strings (n may be 0); the caller
 * holds the HDF5 lock. @return 0 or FMOE_EIO naming file and dataset. */
int fmoe__h5_write_str_array(hid_t file, const char *path, const char *name,
                             const char *const *values, hsize_t n);

#endif
