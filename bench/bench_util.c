#include "bench_util.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_sort(double *v, int n)
{
    if (n > 0) {
        qsort(v, (size_t)n, sizeof(*v), cmp_double);
    }
}

double bench_median(double *v, int n)
{
    if (n <= 0) {
        return NAN;
    }
    bench_sort(v, n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double bench_median_upper(double *v, int n)
{
    if (n <= 0) {
        return NAN;
    }
    bench_sort(v, n);
    return v[n / 2];
}

double bench_min(const double *v, int n)
{
    double m = NAN;
    for (int i = 0; i < n; i++) {
        if (isnan(m) || v[i] < m) {
            m = v[i];
        }
    }
    return m;
}

void bench_loadavg(char *out, size_t cap)
{
    double a = 0, b = 0, c = 0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f == NULL || fscanf(f, "%lf %lf %lf", &a, &b, &c) != 3) {
        snprintf(out, cap, "load average: ?");
    } else {
        snprintf(out, cap, "load average: %.2f, %.2f, %.2f", a, b, c);
    }
    if (f != NULL) {
        fclose(f);
    }
}

void bench_set_bin_dir(void)
{
    if (getenv("TANDEM_BIN_DIR") != NULL) {
        return;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        return;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash != NULL) {
        *slash = '\0';
        setenv("TANDEM_BIN_DIR", self, 0);
    }
}

double bench_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
