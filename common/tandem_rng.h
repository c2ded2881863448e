/* Deterministic random numbers: xoshiro256** (Blackman and Vigna) seeded
 * through splitmix64, and splitmix64 itself. The router's plugins and the load
 * generator draw from xoshiro256**; the engine, the workers and the router
 * hash seeds and counters with rng_mix64 / rng_splitmix64. The same seed gives
 * the same numbers on every machine.
 *
 * Pure functions on caller-owned state; any thread (one state per thread). */
#ifndef TANDEM_RNG_H
#define TANDEM_RNG_H

#include <stdint.h>

struct rng {
    uint64_t s[4];
};

/* The splitmix64 increment, 2^64 / golden ratio (odd). */
#define RNG_GOLDEN 0x9e3779b97f4a7c15ULL

/* splitmix64's output function (Stafford's variant 13 finaliser): a bijection
 * on 64 bits that spreads every input bit over the output. Used alone to
 * hash a counter, a seed or a key. */
static inline uint64_t rng_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* splitmix64 (Vigna): advances *x by RNG_GOLDEN and returns the next output
 * (seeding, hashing). The only copy in the tree: the engine's synthetic
 * weights and payloads, the sampler, the router and the workers all draw from
 * it, so its outputs must never change (determinism tests pin them). */
static inline uint64_t rng_splitmix64(uint64_t *x)
{
    *x += RNG_GOLDEN;
    return rng_mix64(*x);
}

/* The first splitmix64 output from state x, without keeping the state. */
static inline uint64_t rng_hash64(uint64_t x)
{
    return rng_splitmix64(&x);
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
