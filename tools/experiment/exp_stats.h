/* Statistics over an experiment's seeds: the mean of a headline metric with
 * its 95% confidence interval (Student t, n - 1 degrees of freedom), whether
 * two intervals overlap (the report marks such differences as ties), and
 * SLO attainment computed from per-request outcomes, also with both SLOs
 * scaled (attainment against SLO scale, no rerun).
 *
 * Pure, any thread. */
#ifndef TANDEM_EXP_STATS_H
#define TANDEM_EXP_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "loadgen/run.h"
#include "loadgen/summary.h"

#define EXP_MAX_SEEDS 100

/* Seed k (0-based) of a cell whose first seed is base: base + 1000 k, so
 * seed 0 is the file's and the rate offsets of restart per-config (rate i:
 * seed + i, i < 64) never collide with another seed's. */
uint64_t exp_seed_of(uint64_t base, int k);

/* A mean with the half-width of its 95% confidence interval. */
struct exp_ci {
    double mean; /* NaN when n == 0 */
    double half; /* t(0.975, n - 1) x s / sqrt(n); NaN when n < 2 */
    int n;       /* finite samples */
};

/* The 0.975 quantile of Student's t with dof degrees of freedom (dof >= 1):
 * the table to 30, a Cornish-Fisher expansion beyond (within 0.001).
 * NaN for dof < 1. */
double exp_t975(int dof);

/* Mean and 95% half-width of the finite values among v[0..n) (the sample
 * standard deviation, n - 1 in the denominator). */
struct exp_ci exp_ci_of(const double *v, size_t n);

/* 1 when both intervals are defined (n >= 2) and overlap:
 * |a.mean - b.mean| <= a.half + b.half. */
int exp_ci_overlap(const struct exp_ci *a, const struct exp_ci *b);

/* One request's outcome, as SLO attainment needs it: times in seconds;
 * tpot_s is lg_tpot_s (0 with one output token); ok 0 for a failed one. */
struct exp_req {
    double ttft_s, tpot_s, e2el_s;
    int ok;
};

/* Fills out[i] from recs[i] (i < n). */
void exp_reqs_from_records(const struct lg_record *recs, size_t n, struct exp_req *out);

/* The share of reqs[0..n) that completed and met every SLO of slo set,
 * each bound multiplied by scale (> 0), with lg_summary's comparison (a
 * request with TTFT exactly at the bound meets it): at scale 1 it is
 * lg_summary's slo_attainment. NaN when n == 0 or no SLO is set. */
double exp_attainment(const struct exp_req *reqs, size_t n, const struct lg_slo *slo, double scale);
/* Same straight from records. */
double exp_attainment_records(const struct lg_record *recs, size_t n, const struct lg_slo *slo,
                              double scale);

#endif
