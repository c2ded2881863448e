#include "arrivals.h"

#include <math.h>

#include "tandem_err.h"

int lg_arrivals_init(struct lg_arrivals *a, double rate, double burstiness, uint64_t seed)
{
    if (!(rate > 0) || !(burstiness > 0)) { /* also rejects NaN */
        return TANDEM_EINVAL;
    }
    lg_rng_derive(&a->rng, seed, LG_STREAM_ARRIVALS, 0);
    a->rate = rate;
    a->burstiness = burstiness;
    a->t = 0;
    return 0;
}

double lg_arrivals_gap(struct lg_arrivals *a)
{
    if (isinf(a->rate)) {
        return 0;
    }
    if (isinf(a->burstiness)) {
        return 1.0 / a->rate;
    }
    if (a->burstiness == 1.0) {
        return lg_rng_exponential(&a->rng, 1.0 / a->rate);
    }
    return lg_rng_gamma(&a->rng, a->burstiness, 1.0 / (a->rate * a->burstiness));
}

double lg_arrivals_next(struct lg_arrivals *a)
{
    a->t += lg_arrivals_gap(a);
    return a->t;
}

int lg_arrivals_fill(double rate, double burstiness, uint64_t seed, int normalize, size_t n,
                     double *out)
{
    struct lg_arrivals a;
    int rc = lg_arrivals_init(&a, rate, burstiness, seed);
    if (rc != 0) {
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        out[i] = lg_arrivals_next(&a);
    }
    if (normalize && n > 0 && isfinite(rate) && out[n - 1] > 0) {
        double f = ((double)n / rate) / out[n - 1];
        for (size_t i = 0; i < n; i++) {
            out[i] *= f;
        }
    }
    return 0;
}
