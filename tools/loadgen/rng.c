/* The load generator's random streams and distributions (rng.h), on
 * common/tandem_rng's xoshiro256**. */
#include "rng.h"

#include <math.h>

void lg_rng_seed(struct lg_rng *r, uint64_t seed)
{
    rng_seed(&r->r, seed);
}

void lg_rng_derive(struct lg_rng *r, uint64_t seed, uint64_t stream, uint64_t index)
{
    /* Mix each part through splitmix64 so nearby (stream, index) pairs give
     * unrelated states. */
    uint64_t x = seed;
    uint64_t a = rng_splitmix64(&x);
    x = a ^ (stream * 0xd1b54a32d192ed03ULL);
    uint64_t b = rng_splitmix64(&x);
    x = b ^ (index * 0x8cb92ba72f3d8dd7ULL);
    lg_rng_seed(r, rng_splitmix64(&x));
}

uint64_t lg_rng_next(struct lg_rng *r)
{
    return rng_next(&r->r);
}

double lg_rng_uniform(struct lg_rng *r)
{
    return rng_uniform(&r->r);
}

int64_t lg_rng_range(struct lg_rng *r, int64_t lo, int64_t hi)
{
    if (hi <= lo) {
        return lo;
    }
    uint64_t span = (uint64_t)hi - (uint64_t)lo + 1;
    if (span == 0) { /* the whole 64-bit range */
        return (int64_t)lg_rng_next(r);
    }
    /* Rejection: drop the top partial copy of [0, span). */
    uint64_t limit = UINT64_MAX - UINT64_MAX % span;
    uint64_t x;
    do {
        x = lg_rng_next(r);
    } while (x >= limit);
    return (int64_t)((uint64_t)lo + x % span);
}

double lg_rng_normal(struct lg_rng *r)
{
    double u, v, s;
    do {
        u = 2.0 * lg_rng_uniform(r) - 1.0;
        v = 2.0 * lg_rng_uniform(r) - 1.0;
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    return u * sqrt(-2.0 * log(s) / s);
}

double lg_rng_exponential(struct lg_rng *r, double mean)
{
    /* 1 - U is in (0, 1], so the log is finite. */
    return -log(1.0 - lg_rng_uniform(r)) * mean;
}

double lg_rng_gamma(struct lg_rng *r, double shape, double scale)
{
    if (shape < 1.0) {
        double u = 1.0 - lg_rng_uniform(r);
        return lg_rng_gamma(r, shape + 1.0, scale) * pow(u, 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0;
    double c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = lg_rng_normal(r);
            v = 1.0 + c * x;
        } while (v <= 0.0);
        v = v * v * v;
        double u = 1.0 - lg_rng_uniform(r);
        if (u < 1.0 - 0.0331 * x * x * x * x) {
            return d * v * scale;
        }
        if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) {
            return d * v * scale;
        }
    }
}

double lg_rng_lognormal(struct lg_rng *r, double mu, double sigma)
{
    return exp(mu + sigma * lg_rng_normal(r));
}
