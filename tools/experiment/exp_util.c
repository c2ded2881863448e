/* Helpers shared by the experiment modules. See exp_util.h. */
#include "exp_util.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "tandem_err.h"

int exp_sfmt(char *out, size_t cap, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(out, cap, f, ap);
    va_end(ap);
    return n;
}

int exp_mkdir_p(const char *path)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *c = buf + 1; *c; c++) {
        if (*c == '/') {
            *c = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
                return TANDEM_EIO;
            }
            *c = '/';
        }
    }
    return mkdir(buf, 0777) != 0 && errno != EEXIST ? TANDEM_EIO : 0;
}

void exp_rate_word(double r, char *out, size_t cap)
{
    if (isinf(r)) {
        snprintf(out, cap, "inf");
    } else {
        snprintf(out, cap, "%g", r);
    }
}

int exp_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

const char *exp_fmt(char *buf, size_t cap, double v, int prec, const char *none)
{
    if (!isfinite(v)) {
        snprintf(buf, cap, "%s", none);
    } else {
        snprintf(buf, cap, "%.*f", prec, v);
    }
    return buf;
}

double exp_goodput_or_throughput(const struct lg_summary *s)
{
    return s->has_goodput ? s->request_goodput : s->request_throughput;
}

const char *exp_base_name(const char *path)
{
    const char *b = path ? strrchr(path, '/') : NULL;
    return b ? b + 1 : path;
}
