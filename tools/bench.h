/* `tandem bench`: the load generator's command line (docs/bench.md).
 *
 * The flags are bench_options.h; the module is loadgen/ (run.h for the run
 * itself); this file is the command and its printing. `tandem bench
 * --experiment FILE` goes to the experiment runner (experiment/exp_main.h).
 *
 * Threads: everything here runs on the CLI's main thread; bench_main runs
 * the load generator's own libuv loop on it until the run ends (SIGINT
 * interrupts it: exit code 130). */
#ifndef TANDEM_BENCH_H
#define TANDEM_BENCH_H

#include <stddef.h>

#include "bench_options.h"

/* The result file name vLLM's --save-result would use:
 * "{label}-{rate}qps[-concurrency{N}]-{model basename}-{date}.json", written
 * to out (len bytes, truncated to fit, always terminated). */
void bench_result_filename(const struct bench_options *o, const char *model, char *out, size_t len);

/* Prints the traffic lines vLLM prints before a run (rate, burstiness,
 * concurrency, dataset). */
void bench_print_traffic(const struct bench_options *o);

/* What `tandem bench` does with a finished run: the summary, the table on
 * stdout, --json, --save-result, --save-requests (errors on stderr).
 * Returns the exit code: 0; 1 when a file could not be written or every
 * request failed; 130 when the run was interrupted. `tandem simulate`
 * reports its offline runs with it, so both print the same. */
int bench_report(const struct bench_options *o, const struct lg_run_result *res);

/* The `tandem bench` command; argv[0] is "bench". Returns the process exit
 * code: 0; 1 when the run could not start or every request failed; 2 for bad
 * usage (message on stderr); 130 when interrupted. */
int bench_main(int argc, char **argv);

#endif
