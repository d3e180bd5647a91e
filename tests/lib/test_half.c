/*
 * test_half.c - binary16 and bfloat16 conversions: exhaustive round trips, spot values,
 * and round-to-nearest-even checked against an independent reference (double arithmetic
 * with nearbyint) at every halfway point and its neighbours.
 */
#include <float.h>
#include <math.h>

#include "half.h"
#include "harness.h"

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Reference float -> half, round to nearest even, computed in double where the scaled
 * value and nearbyint are exact. */
static uint16_t ref_float_to_half(float f) {
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (isnan(f)) return sign | 0x7e00;
    if (isinf(f) || a >= 65520.0) return sign | 0x7c00;
    if (a < ldexp(1.0, -14)) /* subnormal range: count of 2^-24 units (1024 = min normal) */
        return sign | (uint16_t)nearbyint(ldexp(a, 24));
    int e;
    frexp(a, &e); /* a in [2^(e-1), 2^e) */
    int E = e - 1;
    double m = nearbyint(ldexp(a, 10 - E)); /* in [1024, 2048] */
    if (m == 2048.0) {
        m = 1024.0;
        E++;
    }
    if (E + 15 >= 31) return sign | 0x7c00;
    return sign | (uint16_t)((E + 15) << 10) | (uint16_t)(m - 1024.0);
}

/* Reference float -> bf16, round to nearest even, through double. */
static uint16_t ref_float_to_bf16(float f) {
    if (isnan(f)) return (uint16_t)((bits_of(f) >> 16) | 0x40);
    if (isinf(f)) return (uint16_t)(bits_of(f) >> 16);
    double a = fabs((double)f);
    int e;
    frexp(a, &e);
    int E = a == 0.0 ? -126 : e - 1;
    if (E < -126) E = -126; /* float subnormals share the smallest exponent */
    double ulp = ldexp(1.0, E - 7);
    double r = nearbyint(a / ulp) * ulp;
    float rf = r >= ldexp(1.0, 128) ? INFINITY : (float)r; /* exact: r has <= 8 bits */
    if (signbit(f)) rf = -rf;
    return (uint16_t)(bits_of(rf) >> 16);
}

TEST(half_round_trip_all_65536) {
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = fmoe_half_to_float((uint16_t)h);
        uint16_t back = fmoe_float_to_half(f);
        int is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (is_nan) {
            if (!isnan(f)) HARNESS_FAIL("half 0x%04x is NaN but converts to %g", h, f);
            if ((back & 0x7c00) != 0x7c00 || !(back & 0x3ff) || (back & 0x8000) != (h & 0x8000))
                HARNESS_FAIL("half NaN 0x%04x came back as 0x%04x", h, back);
        } else if (back != h) {
            HARNESS_FAIL("half 0x%04x -> %.9g -> 0x%04x", h, f, back);
        }
    }
}

TEST(half_values_are_exact) {
    /* Every finite half decodes to sign * m * 2^(e-25) computed independently. */
    for (uint32_t h = 0; h <= 0xffff; h++) {
        uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
        if (e == 0x1f) continue;
        double v = e == 0 ? ldexp((double)m, -24) : ldexp((double)(m | 0x400), (int)e - 25);
        if (h & 0x8000) v = -v;
        float f = fmoe_half_to_float((uint16_t)h);
        if ((double)f != v || !signbit(f) != !signbit(v))
            HARNESS_FAIL("half 0x%04x decodes to %.9g, expected %.9g", h, f, v);
    }
}

TEST(half_spot_values) {
    ASSERT_EQ(fmoe_float_to_half(1.0f), 0x3c00);
    ASSERT_EQ(fmoe_float_to_half(-2.0f), 0xc000);
    ASSERT_EQ(fmoe_float_to_half(0.5f), 0x3800);
    ASSERT_EQ(fmoe_float_to_half(65504.0f), 0x7bff);             /* largest finite */
    ASSERT_EQ(fmoe_float_to_half(ldexpf(1.0f, -14)), 0x0400);    /* smallest normal */
    ASSERT_EQ(fmoe_float_to_half(ldexpf(1.0f, -24)), 0x0001);    /* smallest subnormal */
    ASSERT_EQ(fmoe_float_to_half(-ldexpf(1.0f, -24)), 0x8001);
    ASSERT_EQ(fmoe_float_to_half(0.0f), 0x0000);
    ASSERT_EQ(fmoe_float_to_half(-0.0f), 0x8000);
    ASSERT_EQ(fmoe_float_to_half(INFINITY), 0x7c00);
    ASSERT_EQ(fmoe_float_to_half(-INFINITY), 0xfc00);
    ASSERT_EQ(fmoe_half_to_float(0x3c00), 1.0f);
    ASSERT_EQ(fmoe_half_to_float(0x7bff), 65504.0f);
    ASSERT_TRUE(fmoe_half_to_float(0x0001) == ldexpf(1.0f, -24));
    ASSERT_TRUE(isnan(fmoe_half_to_float(0x7e00)));
    ASSERT_TRUE(isnan(fmoe_half_to_float(0xfc01)));
    uint16_t n = fmoe_float_to_half(NAN);
    ASSERT_TRUE((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
}

TEST(half_rounds_to_nearest_even) {
    /* 1 + 2^-11 lies halfway between 0x3c00 and 0x3c01: even mantissa wins. */
    ASSERT_EQ(fmoe_float_to_half(1.0f + ldexpf(1.0f, -11)), 0x3c00);
    ASSERT_EQ(fmoe_float_to_half(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02);
    ASSERT_EQ(fmoe_float_to_half(nextafterf(1.0f + ldexpf(1.0f, -11), 2.0f)), 0x3c01);
    /* Subnormals: 2^-25 is halfway between 0 and 2^-24. */
    ASSERT_EQ(fmoe_float_to_half(ldexpf(1.0f, -25)), 0x0000);
    ASSERT_EQ(fmoe_float_to_half(nextafterf(ldexpf(1.0f, -25), 1.0f)), 0x0001);
    ASSERT_EQ(fmoe_float_to_half(3 * ldexpf(1.0f, -25)), 0x0002);
    /* Largest subnormal + half an ulp rounds up into the smallest normal. */
    ASSERT_EQ(fmoe_float_to_half(ldexpf(1.0f, -14) - ldexpf(1.0f, -25)), 0x0400);
    /* 65520 is halfway between 65504 and 65536: it overflows to infinity. */
    ASSERT_EQ(fmoe_float_to_half(65520.0f), 0x7c00);
    ASSERT_EQ(fmoe_float_to_half(nextafterf(65520.0f, 0.0f)), 0x7bff);
    ASSERT_EQ(fmoe_float_to_half(1e30f), 0x7c00);
    ASSERT_EQ(fmoe_float_to_half(1e-30f), 0x0000);
}

/* Every halfway point between adjacent halves, and the floats just either side of it,
 * against the reference. */
TEST(half_halfway_points_match_reference) {
    for (uint32_t h = 0; h < 0x7c00; h++) {
        double lo = fmoe_half_to_float((uint16_t)h);
        double hi = h + 1 < 0x7c00 ? fmoe_half_to_float((uint16_t)(h + 1)) : 65536.0;
        float mid = (float)((lo + hi) / 2); /* exact: 12 significant bits */
        float probes[3] = {nextafterf(mid, 0.0f), mid, nextafterf(mid, INFINITY)};
        for (int s = 0; s < 2; s++) {
            for (int i = 0; i < 3; i++) {
                float f = s ? -probes[i] : probes[i];
                uint16_t got = fmoe_float_to_half(f), want = ref_float_to_half(f);
                if (got != want)
                    HARNESS_FAIL("float %a (0x%08x): half 0x%04x, reference 0x%04x", f,
                                 bits_of(f), got, want);
            }
        }
    }
}

/* A spread of float bit patterns (every exponent, many mantissas) against the reference. */
TEST(half_sampled_floats_match_reference) {
    for (uint64_t u = 0; u <= 0xffffffffu; u += 40009) {
        float f = float_of((uint32_t)u);
        uint16_t got = fmoe_float_to_half(f), want = ref_float_to_half(f);
        if (isnan(f)) {
            if ((got & 0x7c00) != 0x7c00 || !(got & 0x3ff))
                HARNESS_FAIL("float NaN 0x%08x became half 0x%04x", (uint32_t)u, got);
        } else if (got != want) {
            HARNESS_FAIL("float %a (0x%08x): half 0x%04x, reference 0x%04x", f, (uint32_t)u,
                         got, want);
        }
    }
}

TEST(bf16_round_trip_all_65536) {
    for (uint32_t b = 0; b <= 0xffff; b++) {
        float f = fmoe_bf16_to_float((uint16_t)b);
        ASSERT_EQ(bits_of(f), b << 16);
        uint16_t back = fmoe_float_to_bf16(f);
        int is_nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f);
        if (is_nan) {
            if (!isnan(fmoe_bf16_to_float(back)) || (back & 0x8000) != (b & 0x8000))
                HARNESS_FAIL("bf16 NaN 0x%04x came back as 0x%04x", b, back);
        } else if (back != b) {
            HARNESS_FAIL("bf16 0x%04x -> %.9g -> 0x%04x", b, f, back);
        }
    }
}

TEST(bf16_spot_values_and_rounding) {
    ASSERT_EQ(fmoe_float_to_bf16(1.0f), 0x3f80);
    ASSERT_EQ(fmoe_float_to_bf16(-2.0f), 0xc000);
    ASSERT_EQ(fmoe_float_to_bf16(INFINITY), 0x7f80);
    /* 1 + 2^-8 is halfway between 0x3f80 and 0x3f81: even wins; above it rounds up. */
    ASSERT_EQ(fmoe_float_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80);
    ASSERT_EQ(fmoe_float_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)), 0x3f82);
    ASSERT_EQ(fmoe_float_to_bf16(float_of(0x3f808001u)), 0x3f81);
    ASSERT_EQ(fmoe_float_to_bf16(float_of(0x3f807fffu)), 0x3f80);
    /* FLT_MAX is above the halfway point to 2^128: it rounds to infinity. */
    ASSERT_EQ(fmoe_float_to_bf16(FLT_MAX), 0x7f80);
    ASSERT_EQ(fmoe_float_to_bf16(float_of(0x7f7f7fffu)), 0x7f7f);
    /* Signalling NaN (would round to infinity by plain addition) stays NaN. */
    uint16_t n = fmoe_float_to_bf16(float_of(0x7f800001u));
    ASSERT_TRUE(isnan(fmoe_bf16_to_float(n)));
    n = fmoe_float_to_bf16(float_of(0xff800001u));
    ASSERT_TRUE(isnan(fmoe_bf16_to_float(n)) && (n & 0x8000));
}

TEST(bf16_sampled_floats_match_reference) {
    for (uint64_t u = 0; u <= 0xffffffffu; u += 40009) {
        float f = float_of((uint32_t)u);
        uint16_t got = fmoe_float_to_bf16(f), want = ref_float_to_bf16(f);
        if (isnan(f)) {
            if (!isnan(fmoe_bf16_to_float(got)))
                HARNESS_FAIL("float NaN 0x%08x became bf16 0x%04x", (uint32_t)u, got);
        } else if (got != want) {
            HARNESS_FAIL("float %a (0x%08x): bf16 0x%04x, reference 0x%04x", f, (uint32_t)u,
                         got, want);
        }
    }
    /* and every bf16 halfway point and its neighbours */
    for (uint32_t b = 0; b < 0x7f80; b++) {
        uint32_t mid = (b << 16) | 0x8000;
        uint32_t probes[3] = {mid - 1, mid, mid + 1};
        for (int i = 0; i < 3; i++) {
            float f = float_of(probes[i]);
            uint16_t got = fmoe_float_to_bf16(f), want = ref_float_to_bf16(f);
            if (got != want)
                HARNESS_FAIL("float 0x%08x: bf16 0x%04x, reference 0x%04x", probes[i], got,
                             want);
        }
    }
}

int main(int argc, char **argv) { return RUN_TESTS(argc, argv); }
