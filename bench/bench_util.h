/* Helpers every benchmark shares: a monotonic clock, sorting and the summary
 * statistics the benches print (medians, minimum), the load average printed
 * beside figures that other work on the machine moves, and where a process
 * bench finds the binaries it starts. Linked as tandem_bench_util
 * (bench/CMakeLists.txt).
 *
 * Threading: any thread, except bench_set_bin_dir (main thread, before any
 * other thread reads the environment). */
#ifndef TANDEM_BENCH_UTIL_H
#define TANDEM_BENCH_UTIL_H

#include <stddef.h>

/* CLOCK_MONOTONIC in seconds. */
double bench_now_s(void);

/* CPU time of the calling thread in seconds (CLOCK_THREAD_CPUTIME_ID): what a
 * single-threaded measurement took when other processes share the cores and
 * preempt it; memory and cache contention still count. */
double bench_cpu_s(void);

/* Sorts v[0..n) ascending in place. */
void bench_sort(double *v, int n);

/* Median of v[0..n) (sorted in place): the mean of the two middle values
 * when n is even; NAN when n <= 0. */
double bench_median(double *v, int n);

/* v[n / 2] of v[0..n) sorted in place: the median for odd n, the upper of the
 * two middle values for even n; NAN when n <= 0. What bench_kv, bench_kv_check,
 * bench_frame_tag and bench_recovery have always printed; the runs recorded
 * in docs/ are odd, where it equals bench_median. */
double bench_median_upper(double *v, int n);

/* Smallest of v[0..n); NAN when n <= 0. */
double bench_min(const double *v, int n);

/* "load average: a, b, c" from /proc/loadavg into out ("load average: ?"
 * when it cannot be read). */
void bench_loadavg(char *out, size_t cap);

/* Sets TANDEM_BIN_DIR (where the integration harness finds tandem-router,
 * tandem-prefill, tandem-decode) to this executable's directory unless it is
 * set already. */
void bench_set_bin_dir(void);

#endif
