#include <stdio.h>
#include "fmoe/cuda.h"
int main(void) { printf("%s\n", fmoe_cuda_describe()); return 0; }
