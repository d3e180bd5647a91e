/*
 * quant_act_avx2_vnni.c - lib/quant_act_avx2.c's 8-bit dots compiled again with AVX512-VNNI
 * (and BW and VL, for the 256-bit forms and byte masks): each maddubs-then-madd pair of the
 * 32-value and Q8_0 kernels becomes one vpdpbusd, each madd-then-add of the K-quant kernels
 * one vpdpwssd (Q4_K's and Q5_K's high nibbles one GFNI transform), Q5_0's and Q5_1's
 * fifth bits are set by a masked byte op, a block's nibbles split by one GFNI affine byte
 * transform and
 * the eight-row reduction's blends in their EVEX form (which reaches ymm16-31): the same
 * integer sums on 256-bit registers (Zen 4 splits 512-bit ones, lib/quant.c), so the same
 * bits as the AVX2 build. lib/quant_act.c calls
 * fmoe__quant_act_rows_avx2_vnni instead of fmoe__quant_act_rows_avx2 where the CPU has
 * these and GFNI (fmoe__quant_vnni, lib/quant.c: Zen 4, Intel from Ice Lake; not Cascade
 * Lake, which has VNNI without GFNI) and FMOE_NO_VNNI is not set; the quantisers are
 * compiled once, in the other file.
 */
#define FMOE_QUANT_ACT_VNNI 1
#include "quant_act_avx2.c"
