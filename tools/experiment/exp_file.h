/* The experiment file (docs/experiments.md): a matrix of configurations
 * (cluster file x routing config, or an explicit list, optionally sweeping
 * one routing parameter) x request rates, with one workload (the `bench:`
 * mapping, as `tandem bench` flags) and seed, settings applied to every
 * cluster (cluster_overrides:) and more SLO sets (extra_slos:).
 *
 * Every time in the file is in modelled seconds (exp_main.h says how the
 * live runner converts).
 *
 * Loading is pure apart from reading the files it names (any thread); the
 * loaded struct exp_file is read-only afterwards and may be shared by any
 * number of readers. */
#ifndef TANDEM_EXP_FILE_H
#define TANDEM_EXP_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "bench_options.h"
#include "loadgen/summary.h"
#include "search.h"
#include "wk_config.h"

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
    double settle_s;
    int offline;
    /* not a key: set by --offline (the report then has no host columns) */ /* pause after the
                                                                               cluster is up and
                                                                               between rates */
    /* The `bench:` mapping as `tandem bench` flags ("--name", "value", ...). */
    char **bench_argv; /* (bench_argc) owned */
    int bench_argc;
    int *bench_lines; /* (bench_argc) line of the key each argument came from */
    int bench_line;   /* line of the `bench:` key (0: absent) */
    /* More SLO sets (extra_slos:): goodput under each is reported beside
     * the one of bench.goodput, from the same requests. */
    struct lg_slo extra_slos[EXP_MAX_SLOS];
    int n_extra_slos;
    /* seeds: runs per cell (1..EXP_MAX_SEEDS); 0 when not given: exp_seeds
     * gives the default. Seed k of a cell is exp_seed_of(its seed, k). */
    int seeds;
    /* goodput_search: DistServe's per-GPU goodput per configuration, searched
     * over rates offline (search.h); its seeds field is unused (exp_seeds). */
    int has_goodput_search;
    int goodput_search_line;
    struct search_rate_opts goodput_search;
    /* pd_search: the P:D search (search.h) offline, from two of the
     * configurations' derived clusters, with goodput_search's settings. */
    int has_pd_search;
    int pd_search_line;
    struct search_pd_opts pd_search; /* gpus, tps (rate: from goodput_search) */
    int pd_search_config;            /* index into configs: the prefill/decode base */
    int pd_search_colocated;         /* index into configs, or -1: no colocated baseline */
};

/* The seeds per cell: the file's seeds:, else 5 offline, 3 live. */
int exp_seeds(const struct exp_file *e);

/* Reads and validates an experiment file: its keys, the configurations'
 * cluster and routing files (readable), labels, rates, and the bench flags
 * (through bench_parse_args). Derived cluster files are validated later, by
 * exp_prepare (exp_derive.h). Errors: TANDEM_ECONFIG ("<file>:<line>: <key>:
 * <problem>" in err), TANDEM_ENOENT / TANDEM_EIO (cannot read),
 * TANDEM_ETOOBIG, TANDEM_ENOMEM. On 0 *out is the caller's (exp_free). */
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

/* A rate as the file's rates: and --rates take it: a positive finite
 * number, or inf (also .inf, Infinity) for INFINITY. 0 or TANDEM_EINVAL. */
int exp_rate_parse(const char *s, double *out);

#endif
