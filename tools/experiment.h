/* Experiments for `tandem bench --experiment FILE` (docs/experiments.md): a
 * matrix of configurations (cluster file x routing config, or an explicit
 * list, optionally sweeping one routing parameter) x request rates, with one
 * workload and seed. For each configuration the runner writes a derived
 * cluster file, starts it with `tandem up`, waits for its READY line, runs
 * the load generator (loadgen/run.h) once per rate, stops the cluster, and
 * finally writes a report directory: summary.md, results.csv, one JSON per
 * cell (vLLM's result keys plus an "experiment" object), the per-request
 * CSVs, and SVG plots (goodput against rate, TTFT and TPOT CDFs).
 *
 * Time: every time in the experiment file and in the report is in modelled
 * seconds. For sim clusters with time_scale s (wall seconds per modelled
 * second) the runner sends at rate / s wall requests per second and divides
 * every measured time by s; for tiny clusters (and s = 1) modelled = wall.
 *
 * Cache state: the cluster restarts per configuration (`restart:
 * per-config`, the default), so rate i of every configuration uses seed +
 * i: the same requests in every configuration at a given rate, never a
 * request already served by the same cluster. With `restart: per-rate` each
 * cell gets a fresh cluster and the same seed, and the configurations take
 * turns at each rate (side by side in time). Warm-ups use the load
 * generator's warm-up seed (never the measured prompts).
 *
 * Loading is pure (any thread); exp_main blocks its thread for the whole
 * experiment. */
#ifndef TANDEM_EXPERIMENT_H
#define TANDEM_EXPERIMENT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bench_options.h"
#include "wk_config.h"
#include "loadgen/summary.h"

#define EXP_ERR_MAX     1024 /* suggested size of error buffers */
#define EXP_MAX_CONFIGS 64
#define EXP_MAX_RATES   64
#define EXP_LABEL_MAX   64
#define EXP_MAX_FILE    (1u << 20)
#define EXP_MAX_SLOS    4 /* extra SLO sets */

enum exp_restart { EXP_RESTART_PER_CONFIG = 0, EXP_RESTART_PER_RATE };

/* One configuration: a cluster file, optionally another routing file, and
 * optionally one routing parameter set to a value. */
struct exp_config {
    char label[EXP_LABEL_MAX]; /* [A-Za-z0-9._+-], unique */
    char *cluster_path;        /* absolute */
    char *routing_path;        /* absolute; NULL: the cluster's own routing */
    char *set_key;             /* NULL, or "PLUGIN.PARAM" (plugin name or type) */
    char *set_value;           /* the value as written (a YAML scalar) */
    int line;                  /* where the configuration is defined */
};

/* Settings applied to every pool of every cluster (unset: -1 / NULL). */
/* cluster_overrides: worker settings applied to every pool of every
 * cluster (those of wk_settings marked SETTING_OVERRIDE, their keys, checks
 * and messages from there; a setting for one backend only reaches that
 * backend's pools), the log level and more router flags. */
struct exp_overrides {
    struct worker_config cfg; /* the values; strings owned */
    uint64_t set;             /* bit i: wk_settings[i] is overridden */
    char *log_level;          /* every process (the cluster's log_level) */
    char **router_args;       /* (n_router_args) appended to the cluster's router.args */
    int n_router_args;
};

struct exp_file {
    char *source;   /* the path as given, or the name given to exp_parse */
    char *base_dir; /* absolute; relative paths resolve against it */
    char *name;
    char *description;          /* NULL when not given */
    struct exp_config *configs; /* (n_configs) */
    int n_configs;
    double rates[EXP_MAX_RATES]; /* modelled requests per second; INFINITY allowed */
    int n_rates;
    enum exp_restart restart;
    struct exp_overrides ov;
    double up_timeout_s; /* tandem up --timeout */
    double settle_s;     /* pause after the cluster is up and between rates */
    /* The `bench:` mapping as `tandem bench` flags ("--name", "value", ...). */
    char **bench_argv; /* (bench_argc) owned */
    int bench_argc;
    int *bench_lines; /* (bench_argc) line of the key each argument came from */
    int bench_line;   /* line of the `bench:` key (0: absent) */
    /* More SLO sets (extra_slos:): goodput under each is reported beside
     * the one of bench.goodput, from the same requests. */
    struct lg_slo extra_slos[EXP_MAX_SLOS];
    int n_extra_slos;
};

/* Reads and validates an experiment file: its keys, the configurations'
 * cluster and routing files (readable), labels, rates, and the bench flags
 * (through bench_parse_args). Derived cluster files are validated later, by
 * exp_prepare. Errors: TANDEM_ECONFIG ("<file>:<line>: <key>: <problem>" in
 * err), TANDEM_ENOENT / TANDEM_EIO (cannot read), TANDEM_ETOOBIG,
 * TANDEM_ENOMEM. On 0 *out is the caller's (exp_free). */
int exp_load(struct exp_file **out, const char *path, char *err, size_t errlen);

/* Same from text[0..len); name stands for the file in messages, base_dir
 * (NULL: the current directory) is where relative paths resolve. */
int exp_parse(struct exp_file **out, const char *text, size_t len, const char *name,
              const char *base_dir, char *err, size_t errlen);

void exp_free(struct exp_file *e);

/* The bench options of the experiment (bench_parse_args on its bench
 * flags plus a placeholder target). 0 or TANDEM_EINVAL (message in err).
 * Free with bench_options_fini. */
int exp_bench_options(const struct exp_file *e, struct bench_options *o, char *err, size_t errlen);

/* Writes the routing file `path` (an EndpointPickerConfig) with the
 * parameter key = "PLUGIN.PARAM" set to value (a YAML scalar) to out: the
 * plugin is the entry of `plugins` whose name, or else type, is PLUGIN; its
 * `parameters` mapping is created when absent. src_text/src_len may give the
 * document instead of path (then path only names it in messages). Returns 0,
 * TANDEM_ECONFIG (no such plugin, not a mapping; message in err),
 * TANDEM_EIO, TANDEM_ENOMEM. */
int exp_routing_set(const char *path, const char *src_text, size_t src_len, const char *key,
                    const char *value, FILE *out, char *err, size_t errlen);

/* Writes configs/<label>.cluster.yaml (and configs/<label>.routing.yaml when
 * a parameter is set) under dir for configuration i, with the overrides
 * applied, and validates the result with cluster_load (routing included).
 * cluster_file receives the derived file's path; time_scale receives the
 * configuration's time scale (the sim pools' common time_scale, 1 for tiny).
 * Returns 0, TANDEM_ECONFIG / TANDEM_EIO / TANDEM_ENOMEM with a message. */
int exp_prepare(const struct exp_file *e, int i, const char *dir, char *cluster_file,
                size_t cluster_len, double *time_scale, char *err, size_t errlen);

/* Host measurements over one cell. */
struct exp_host {
    double host_busy;     /* share of all CPUs busy over the cell, [0, 1]; NaN unknown */
    double cluster_cpu_s; /* CPU seconds of tandem up and its processes (wall) */
    double loadgen_cpu_s; /* CPU seconds of the runner itself (wall) */
    double wall_s;        /* wall seconds of the cell's measured run */
    double load1_start;   /* /proc/loadavg 1-minute value at the start, at the end */
    double load1_end;
    int ncpu;
};

/* One cell of the matrix: a configuration at a rate. Everything in
 * modelled time. */
struct exp_cell {
    int config; /* index into exp_file.configs */
    int rate;   /* index into exp_file.rates */
    int done;   /* the runner got to this cell */
    int ok;     /* 0: not run (the cluster failed to start); error says why */
    char error[256];
    uint64_t seed;
    double time_scale;
    struct lg_summary s;
    double sent_rate;                   /* measured requests / last send time (modelled req/s) */
    double extra_goodput[EXP_MAX_SLOS]; /* under exp_file.extra_slos */
    double *ttft_ms;                    /* (n_ttft) completed requests' TTFT, sorted; owned */
    size_t n_ttft;
    double *tpot_ms; /* (n_tpot) completed requests with > 1 output token, sorted; owned */
    size_t n_tpot;
    struct exp_host host;
    json_t *json; /* the cell's JSON (lg_report_json + "experiment"); owned, may be NULL */
};

/* Frees what a cell owns. */
void exp_cell_fini(struct exp_cell *c);

/* Fills the cell's distributions from records (already in modelled time):
 * TTFT of completed requests, TPOT (lg_tpot_s) of completed ones with more
 * than one output token, both sorted, in ms.
 * 0 or TANDEM_ENOMEM. */
int exp_cell_distributions(struct exp_cell *c, const struct lg_record *recs, size_t n);

/* Report writers (deterministic, for tests): n cells of experiment e.
 * results.csv: one header line, one line per cell in the order given. */
int exp_write_csv(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n);
/* summary.md: title, run facts (meta lines, each written as given), the
 * SLOs, the results table, goodput by rate (one column per configuration,
 * the best marked), and the machine table. */
int exp_write_markdown(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                       const char *const *meta, int n_meta);
/* goodput.svg: goodput (request throughput when no SLO is set) against the
 * rate, one polyline per configuration. */
int exp_write_svg_goodput(FILE *f, const struct exp_file *e, const struct exp_cell *cells,
                          size_t n);
/* A CDF per rate (one panel each), one line per configuration, of TTFT
 * (metric 0) or TPOT (metric 1), log x axis when the values span more than
 * a factor of 20. */
int exp_write_svg_cdf(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                      int metric);

/* Writes summary.md, results.csv, goodput.svg, ttft_cdf.svg, tpot_cdf.svg
 * into dir (which exists). 0 or TANDEM_EIO (message in err). */
int exp_write_report(const char *dir, const struct exp_file *e, const struct exp_cell *cells,
                     size_t n, const char *const *meta, int n_meta, char *err, size_t errlen);

/* `tandem bench --experiment FILE [--out DIR] [...]`: argv as bench_main got
 * it (argv[0] "bench"). Returns the exit code: 0 when every cell ran; 1 when
 * a cluster failed to start or a cell could not run (the report is still
 * written); 2 for bad usage or a bad experiment file; 130 when interrupted. */
int exp_main(int argc, char **argv);

#endif
