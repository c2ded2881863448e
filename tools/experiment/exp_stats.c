/* Means, confidence intervals and SLO attainment. See exp_stats.h. */
#include "exp_stats.h"

#include <math.h>

/* t(0.975, dof) for dof 1..30. */
static const double t975[31] = {
    NAN,   12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179,  2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080,
    2.074, 2.069,  2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
};

uint64_t exp_seed_of(uint64_t base, int k)
{
    return base + 1000u * (uint64_t)k;
}

double exp_t975(int dof)
{
    if (dof < 1) {
        return NAN;
    }
    if (dof <= 30) {
        return t975[dof];
    }
    double z = 1.959964, v = dof, z3 = z * z * z, z5 = z3 * z * z;
    return z + (z3 + z) / (4 * v) + (5 * z5 + 16 * z3 + 3 * z) / (96 * v * v);
}

struct exp_ci exp_ci_of(const double *v, size_t n)
{
    struct exp_ci ci = {.mean = NAN, .half = NAN, .n = 0};
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        if (isfinite(v[i])) {
            sum += v[i];
            ci.n++;
        }
    }
    if (ci.n == 0) {
        return ci;
    }
    ci.mean = sum / ci.n;
    if (ci.n < 2) {
        return ci;
    }
    double ss = 0;
    for (size_t i = 0; i < n; i++) {
        if (isfinite(v[i])) {
            ss += (v[i] - ci.mean) * (v[i] - ci.mean);
        }
    }
    ci.half = exp_t975(ci.n - 1) * sqrt(ss / (ci.n - 1)) / sqrt((double)ci.n);
    return ci;
}

int exp_ci_overlap(const struct exp_ci *a, const struct exp_ci *b)
{
    if (a->n < 2 || b->n < 2 || !isfinite(a->half) || !isfinite(b->half)) {
        return 0;
    }
    return fabs(a->mean - b->mean) <= a->half + b->half;
}

void exp_reqs_from_records(const struct lg_record *recs, size_t n, struct exp_req *out)
{
    for (size_t i = 0; i < n; i++) {
        const struct lg_record *r = &recs[i];
        out[i] = (struct exp_req){
            .ttft_s = r->ttft_s,
            .tpot_s = r->ok ? lg_tpot_s(r) : 0,
            .e2el_s = r->e2el_s,
            .ok = r->ok,
        };
    }
}

static int meets(const struct exp_req *r, const struct lg_slo *slo, double scale)
{
    /* lg_summary compares slo_ms / 1000 >= value in seconds. */
    return r->ok && (slo->ttft_ms < 0 || slo->ttft_ms * scale / 1000.0 >= r->ttft_s) &&
           (slo->tpot_ms < 0 || slo->tpot_ms * scale / 1000.0 >= r->tpot_s) &&
           (slo->e2el_ms < 0 || slo->e2el_ms * scale / 1000.0 >= r->e2el_s);
}

static int slo_set(const struct lg_slo *slo)
{
    return slo->ttft_ms >= 0 || slo->tpot_ms >= 0 || slo->e2el_ms >= 0;
}

double exp_attainment(const struct exp_req *reqs, size_t n, const struct lg_slo *slo, double scale)
{
    if (n == 0 || !slo_set(slo)) {
        return NAN;
    }
    size_t good = 0;
    for (size_t i = 0; i < n; i++) {
        good += (size_t)meets(&reqs[i], slo, scale);
    }
    return (double)good / (double)n;
}

double exp_attainment_records(const struct lg_record *recs, size_t n, const struct lg_slo *slo,
                              double scale)
{
    if (n == 0 || !slo_set(slo)) {
        return NAN;
    }
    size_t good = 0;
    for (size_t i = 0; i < n; i++) {
        struct exp_req r;
        exp_reqs_from_records(&recs[i], 1, &r);
        good += (size_t)meets(&r, slo, scale);
    }
    return (double)good / (double)n;
}
