/* Deterministic random numbers: xoshiro256** (Blackman and Vigna) seeded
 * through splitmix64. The router's plugins and the load generator draw
 * from it; the same seed gives the same numbers on every machine.
 *
 * Pure functions on caller-owned state; any thread (one state per thread). */
#ifndef TANDEM_RNG_H
#define TANDEM_RNG_H

#include <stdint.h>

struct rng {
    uint64_t s[4];
};

/* splitmix64: advances *x and returns the next output (seeding, hashing). */
static inline uint64_t rng_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Seeds r from one 64-bit value (splitmix64 expansion; never all-zero). */
void rng_seed(struct rng *r, uint64_t seed);
uint64_t rng_next(struct rng *r);
/* Uniform in [0, 1), 53 bits. */
double rng_uniform(struct rng *r);
/* Uniform in [0, n), n >= 1, by multiply-shift (Lemire): a bias of at most
 * n / 2^32, far below anything measured with it. */
uint32_t rng_below(struct rng *r, uint32_t n);

#endif
