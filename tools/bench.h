/* `tandem bench`: the load generator's command line (docs/bench.md).
 *
 * Flags are named as in `vllm bench serve` where the two overlap
 * (--base-url, --host, --port, --endpoint, --model, --num-prompts,
 * --request-rate, --burstiness, --max-concurrency, --seed, --goodput,
 * --percentile-metrics, --metric-percentiles, --dataset-name, --num-warmups,
 * --save-result, --result-dir, --result-filename, --label), and workload
 * flags as in vLLM (--random-*) and SGLang (--gsp-*) where they exist.
 * --goodput takes several KEY:MS values, space- or comma-separated, as vLLM.
 *
 * The module is loadgen/ (run.h for the run itself); this file is only the
 * flags and the printing.
 *
 * Threads: everything here runs on the CLI's main thread; bench_main runs
 * the load generator's own libuv loop on it until the run ends (SIGINT
 * interrupts it: exit code 130). */
#ifndef TANDEM_BENCH_H
#define TANDEM_BENCH_H

#include <jansson.h>
#include <stddef.h>

#include "loadgen/report.h"
#include "loadgen/run.h"
#include "loadgen/summary.h"

struct bench_options {
    struct lg_run_config run;
    struct lg_summary_opts summary;
    unsigned metrics;            /* LG_METRIC_* */
    const char *json_path;       /* --json, NULL: none */
    const char *save_requests;   /* NULL: none */
    int save_result;             /* vLLM's --save-result */
    const char *result_dir;      /* NULL: current directory */
    const char *result_filename; /* NULL: vLLM's naming */
    const char *label;
    const char *backend; /* "openai" or "openai-chat", for the report */
    int progress;        /* resolved: print the progress line */
    /* Storage the run config points into. */
    char host[256];
    char path[768];
    char models_path[768];
    char base_url[320];
    char goodput[512];
    json_t *extra_body;
};

/* Parses `bench` flags from argv[first..argc) into o (which it initialises).
 * The string fields of o point into argv (which must outlive o) or into o's
 * own storage; o->extra_body is a new reference o owns.
 * Returns FLAGS_OK, FLAGS_HELP (usage printed to help_out when not NULL),
 * FLAGS_VERSION, or TANDEM_EINVAL with a message naming the flag in err.
 * progress_tty says whether stderr is a terminal (the progress line's
 * default). Free with bench_options_fini whatever the result. */
int bench_parse_args(struct bench_options *o, int argc, char **argv, int first, int progress_tty,
                     FILE *help_out, char *err, size_t errlen);
/* Releases what o owns (extra_body); o may be partly filled. */
void bench_options_fini(struct bench_options *o);

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
