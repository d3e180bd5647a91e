/*
 * fmoe/sampler.h - next-token sampling: greedy, temperature, top-k, top-p, with a seeded
 * random generator of our own (xoshiro256**, seeded through splitmix64), so that the same
 * seed gives the same tokens on every machine and build.
 *
 * Order, as transformers' generate applies its logits processors: temperature, then
 * top-k, then top-p (the smallest set of most likely tokens whose probability reaches p),
 * then a draw from the renormalised distribution. temperature 0 is greedy (argmax; the
 * lowest id wins a tie), whatever top_k and top_p say.
 */
#ifndef FMOE_SAMPLER_H
#define FMOE_SAMPLER_H

#include <stdint.h>

typedef struct fmoe_sampler_params {
    float temperature; /* 0: greedy */
    int32_t top_k;     /* 0: off */
    float top_p;       /* 1 (or >= 1): off */
    uint64_t seed;
} fmoe_sampler_params;

typedef struct fmoe_sampler fmoe_sampler;

/* Allocates the sampler's scratch for a vocabulary of `vocab` tokens.
 * @return 0 and *out, FMOE_EINVAL (temperature < 0, top_p <= 0, vocab < 1), FMOE_ENOMEM. */
int fmoe_sampler_init(const fmoe_sampler_params *params, int32_t vocab, fmoe_sampler **out);

/* NULL is a no-op. */
void fmoe_sampler_free(fmoe_sampler *s);

/* The next token from `logits` [vocab] (not modified). Allocates nothing. NaN logits
 * count as -infinity. @return a token id in [0, vocab). */
int32_t fmoe_sampler_sample(fmoe_sampler *s, const float *logits);

/* The argmax of `logits` [n]; the lowest index wins ties. */
int32_t fmoe_argmax(const float *logits, int32_t n);

/* The k largest of (x[i] - shift) · scale over i < n (scale > 0; a NaN x counts as
 * -infinity), best first and the lower index first among equals, into val[k] and idx[k],
 * by a bounded heap: O(n log k), nothing allocated. The sampler's top-k and the server's
 * top logprobs. @return min(k, n) (0 when k <= 0). */
int32_t fmoe_top_k(const float *x, int32_t n, int32_t k, float shift, float scale, float *val,
                   int32_t *idx);

/* The random generator, for tests and for other seeded parts. */
typedef struct fmoe_rng {
    uint64_t s[4];
} fmoe_rng;
void fmoe_rng_seed(fmoe_rng *r, uint64_t seed);
uint64_t fmoe_rng_next(fmoe_rng *r);
/* Uniform in [0, 1) with 24 random bits. */
float fmoe_rng_float(fmoe_rng *r);

#endif
