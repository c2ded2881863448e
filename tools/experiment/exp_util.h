/* Small helpers the experiment modules share (tools/experiment/ only, not a
 * public API): formatting, rates as words, directories. Pure, any thread. */
#ifndef TANDEM_EXP_UTIL_H
#define TANDEM_EXP_UTIL_H

#include <stddef.h>

#include "loadgen/summary.h"

/* snprintf without truncation warnings: messages and paths are cut to fit
 * (paths are checked where a cut one would matter). Returns what snprintf
 * returns. */
__attribute__((format(printf, 3, 4))) int exp_sfmt(char *out, size_t cap, const char *f, ...);

/* mkdir -p path (mode 0777 before the umask); an existing directory is
 * fine. 0 or TANDEM_EIO (errno says why). */
int exp_mkdir_p(const char *path);

/* "2", "0.5", "inf": rates in file names and tables. */
void exp_rate_word(double r, char *out, size_t cap);

/* qsort comparator of doubles, ascending. */
int exp_cmp_double(const void *a, const void *b);

/* Formats v with prec decimals into buf, or none when v is not finite;
 * returns buf. */
const char *exp_fmt(char *buf, size_t cap, double v, int prec, const char *none);

/* The goodput when an SLO is set, else the request throughput (req/s). */
double exp_goodput_or_throughput(const struct lg_summary *s);

/* The part of path after its last '/' (path itself when none; NULL for
 * NULL). */
const char *exp_base_name(const char *path);

#endif
