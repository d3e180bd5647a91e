/* geometry.c - placeholder; implemented by the geometry work. */
#include "fmoe/geometry.h"
