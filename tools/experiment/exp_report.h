/* The experiment report: a directory with summary.md, results.csv and SVG
 * plots (goodput against rate, TTFT and TPOT CDFs), written from the cells
 * alone, so any runner's cells give the same report. Deterministic: the same
 * cells and meta lines give the same bytes (tests pin them). Every time is
 * in modelled seconds.
 *
 * Writers take n cells of experiment e, in the order given (the matrix's
 * configuration-major order), and return 0 or TANDEM_EIO (f in error).
 * Any thread; f is the caller's. */
#ifndef TANDEM_EXP_REPORT_H
#define TANDEM_EXP_REPORT_H

#include <stddef.h>
#include <stdio.h>

#include "exp_cell.h"
#include "exp_file.h"

/* results.csv: one header line, one line per cell in the order given. */
int exp_write_csv(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n);
/* summary.md: title, run facts (meta lines, each written as given), the
 * SLOs, the results table, goodput by rate (one column per configuration,
 * the best marked), and the machine table. */
int exp_write_markdown(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                       const char *const *meta, int n_meta);
/* goodput.svg: goodput (request throughput when no SLO is set) against the
 * rate, one polyline per configuration (exp_svg.c). */
int exp_write_svg_goodput(FILE *f, const struct exp_file *e, const struct exp_cell *cells,
                          size_t n);
/* A CDF per rate (one panel each), one line per configuration, of TTFT
 * (metric 0) or TPOT (metric 1), log x axis when the values span more than
 * a factor of 20 (exp_svg.c). */
int exp_write_svg_cdf(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                      int metric);

/* Writes summary.md, results.csv, goodput.svg, ttft_cdf.svg, tpot_cdf.svg
 * into dir (which exists), each through a temporary file renamed into
 * place. 0 or TANDEM_EIO (message in err). */
int exp_write_report(const char *dir, const struct exp_file *e, const struct exp_cell *cells,
                     size_t n, const char *const *meta, int n_meta, char *err, size_t errlen);

/* The SLOs of the first cell that ran, as words ("TTFT <= 500 ms, TPOT <=
 * 50 ms"), into out; "" when none is set. */
void exp_slo_text(const struct exp_cell *cells, size_t n, char *out, size_t cap);

/* The progress line of a cell that is done ("[exp]   <label> @ <rate> ...":
 * counts, goodput, TTFT and TPOT p90, host busy and load; or why it did not
 * run) to f. */
void exp_print_cell(FILE *f, const struct exp_file *e, const struct exp_cell *c);

#endif
