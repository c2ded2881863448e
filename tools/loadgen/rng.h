/* Deterministic random numbers for the load generator: xoshiro256** seeded
 * through splitmix64, plus the distributions the workloads and arrival
 * processes need. Every stream is derived from (run seed, purpose, index) with
 * lg_rng_derive, so request i's contents do not depend on how many random
 * numbers other requests drew, on the dispatch order, or on warm-ups: the same
 * --seed gives the same workload and arrival times on every machine.
 *
 * Pure functions on caller-owned state; any thread (one state per thread). */
#ifndef TANDEM_LG_RNG_H
#define TANDEM_LG_RNG_H

#include <stdint.h>

#include "tandem_rng.h"

struct lg_rng {
    struct rng r;
};

/* Purposes, so streams for different uses never coincide. */
enum lg_rng_stream {
    LG_STREAM_ARRIVALS = 1,
    LG_STREAM_REQUEST = 2, /* per-request contents */
    LG_STREAM_GROUP = 3,   /* per shared-prefix group / per trace block */
    LG_STREAM_SESSION = 4, /* per multi-turn session */
    LG_STREAM_SHUFFLE = 5,
    LG_STREAM_WARMUP = 6,
};

/* Seeds r from one 64-bit value (splitmix64 expansion; never all-zero). */
void lg_rng_seed(struct lg_rng *r, uint64_t seed);
/* Seeds r for (seed, stream, index): independent, reproducible sub-streams. */
void lg_rng_derive(struct lg_rng *r, uint64_t seed, uint64_t stream, uint64_t index);

uint64_t lg_rng_next(struct lg_rng *r);
/* Uniform in [0, 1), 53 bits. */
double lg_rng_uniform(struct lg_rng *r);
/* Uniform integer in [lo, hi] (inclusive; hi >= lo), without modulo bias. */
int64_t lg_rng_range(struct lg_rng *r, int64_t lo, int64_t hi);
/* Standard normal (Marsaglia polar method). */
double lg_rng_normal(struct lg_rng *r);
/* Exponential with the given mean (> 0). */
double lg_rng_exponential(struct lg_rng *r, double mean);
/* Gamma(shape k > 0, scale theta > 0): mean k x theta, variance k x theta^2.
 * Marsaglia-Tsang for k >= 1; k < 1 through Gamma(k + 1) x U^(1/k). */
double lg_rng_gamma(struct lg_rng *r, double shape, double scale);
/* Lognormal with parameters mu, sigma of the underlying normal. */
double lg_rng_lognormal(struct lg_rng *r, double mu, double sigma);

#endif
