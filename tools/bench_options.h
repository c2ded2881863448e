/* `tandem bench`'s flags (docs/bench.md) parsed into struct bench_options:
 * the load generator's run configuration (loadgen/run.h), the summary's
 * options and what to write. Shared by `tandem bench` (bench.h) and the
 * experiment runner (experiment/), which parses an experiment file's
 * `bench:` mapping with the same flags; this header includes neither.
 *
 * Flags are named as in `vllm bench serve` where the two overlap
 * (--base-url, --host, --port, --endpoint, --model, --num-prompts,
 * --request-rate, --burstiness, --max-concurrency, --seed, --goodput,
 * --percentile-metrics, --metric-percentiles, --dataset-name, --num-warmups,
 * --save-result, --result-dir, --result-filename, --label), and workload
 * flags as in vLLM (--random-*) and SGLang (--gsp-*) where they exist.
 * --goodput takes several KEY:MS values, space- or comma-separated, as vLLM.
 *
 * Pure: parsing touches no file and no network (any thread). */
#ifndef TANDEM_BENCH_OPTIONS_H
#define TANDEM_BENCH_OPTIONS_H

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

#include "loadgen/report.h"
#include "loadgen/run.h"
#include "loadgen/summary.h"

struct bench_options {
    struct lg_run_config run;
    struct lg_summary_opts summary;
    unsigned metrics;            /* LG_METRIC_* */
    const char *json_path;       /* --json, NULL: none */
    const char *save_requests;   /* NULL: none */
    const char *timeline_dir;    /* --timeline: plots over time into DIR, NULL: none */
    int timeline_ms;             /* --timeline-ms: sample period */
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

#endif
