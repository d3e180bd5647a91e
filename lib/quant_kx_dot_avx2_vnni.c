/*
 * quant_kx_dot_avx2_vnni.c - lib/quant_kx_dot_avx2.c's row kernels (the Q2_K, Q3_K and IQ4_XS rows)
 * compiled again for CPUs with AVX512-VNNI, -BW and -VL (lib/quant_rows1_avx2.h's
 * FMOE__R1_VNNI): eight rows a step, vpdpwssd for each madd-then-add, the same integers
 * and float steps, so the same bits: fmoe__kx_rows1_avx2_vnni and fmoe__kx_rowsx_avx2_vnni,
 * which lib/quant_act.c takes instead of the AVX2 ones where fmoe__quant_vnni().
 */
#define FMOE__R1_VNNI 1
#include "quant_kx_dot_avx2.c"
