/* Open-loop arrival processes, as `vllm bench serve` draws them.
 *
 * Gaps between arrivals are independent Gamma(shape = burstiness,
 * scale = 1 / (rate x burstiness)) draws: mean 1/rate whatever the
 * burstiness, coefficient of variation 1/sqrt(burstiness). Burstiness 1 is a
 * Poisson process (exponential gaps); below 1 arrivals come in bursts, above 1
 * they are more even; infinite burstiness gives constant gaps of 1/rate. An
 * infinite rate sends everything at time 0.
 *
 * Like vLLM, the first request waits one gap (its arrival is not 0), and with
 * a fixed request count the cumulative times may be rescaled so the last
 * arrival is exactly count/rate (vLLM does this to cut the 1-2% run-to-run
 * spread of the achieved rate; lg_arrivals_fill's normalize).
 *
 * Pure functions on caller-owned state; any thread. */
#ifndef TANDEM_LG_ARRIVALS_H
#define TANDEM_LG_ARRIVALS_H

#include <stddef.h>
#include <stdint.h>

#include "rng.h"

struct lg_arrivals {
    struct lg_rng rng;
    double rate;       /* requests per second; INFINITY: all at time 0 */
    double burstiness; /* gamma shape; INFINITY: constant gaps */
    double t;          /* last arrival time returned, seconds */
};

/* rate > 0 (may be INFINITY), burstiness > 0 (may be INFINITY). The stream
 * is derived from seed alone. Returns 0 or TANDEM_EINVAL. */
int lg_arrivals_init(struct lg_arrivals *a, double rate, double burstiness, uint64_t seed);

/* The next gap in seconds (>= 0), without advancing t. */
double lg_arrivals_gap(struct lg_arrivals *a);

/* Advances to and returns the next arrival time in seconds. */
double lg_arrivals_next(struct lg_arrivals *a);

/* Fills out[0..n) with the first n cumulative arrival times. With normalize
 * (and a finite rate, n > 0 and a positive last time) every time is scaled by
 * (n / rate) / out[n-1], exactly as vLLM does. Returns 0 or TANDEM_EINVAL. */
int lg_arrivals_fill(double rate, double burstiness, uint64_t seed, int normalize, size_t n,
                     double *out);

#endif
