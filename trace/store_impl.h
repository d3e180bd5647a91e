/*
 * store_impl.h - internals of the store writer and reader (trace/store_*.c).
 */
#ifndef FMOE_STORE_IMPL_H
#define FMOE_STORE_IMPL_H

#include <hdf5.h>


#endif
