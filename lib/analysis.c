/* analysis.c - placeholder. */
#include "fmoe/error.h"
