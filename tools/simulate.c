/* `tandem simulate`: a cluster file, a routing file and a workload run
 * offline (simulate/simulate.h), reported as `tandem bench` reports a live
 * run. Flags: its own (below), then every `tandem bench` flag for the
 * workload and the output (target flags are accepted and ignored). */
#include "simulate_cmd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cluster.h"
#include "flags.h"
#include "search.h"
#include "simulate.h"
#include "tandem_err.h"
#include "timeline.h"

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: tandem simulate [-c CLUSTER.yaml] [--routing FILE] [--ctl-latency-us N]\n"
        "                       [--fail W@T[+R]] [--sim-stats] [tandem bench flags]\n\n"
        "Runs the cluster (default: tandem up's) and the workload offline, in modelled\n"
        "time, on the production router, workers and load generator (docs/simulate.md):\n"
        "no processes, sockets or sleeping. Prints what tandem bench prints; every pool\n"
        "must use the sim backend.\n\n"
        "flags:\n"
        "  -c, --cluster FILE     cluster file (tandem up's; default: its default cluster)\n"
        "  --routing FILE         routing file instead of the cluster's\n"
        "  --ctl-latency-us N     one-way router <-> worker message latency (default %g)\n"
        "  --fail W@T[+R]         kill worker W (decode-0, prefill-1, ...) at modelled second T,\n"
        "                         restart it R s later (repeatable)\n"
        "  --sim-stats            print the simulation's cost (events, wall time) on stderr\n"
        "  --help                 this help, then tandem bench's flags\n\n"
        "P:D search (--search pd): every split of --gpus N into prefill and decode instances\n"
        "of the cluster's pools (P x tp_p + D x tp_d = N), each given DistServe's goodput\n"
        "search (the highest rate with at least --attainment of the requests inside the\n"
        "--goodput SLOs, per GPU); prints a table, the best marked with its margin.\n"
        "  --search pd            run the P:D search instead of one workload\n"
        "  --gpus N               the GPU budget (required with --search)\n"
        "  --tp LIST              TP degrees to try per phase, e.g. 1,2,4,8 (default: the\n"
        "                         pools' own)\n"
        "  --colocated FILE       a cluster with a colocated pool: the baseline, N GPUs of it\n"
        "  --attainment X         share of requests inside the SLOs (default 0.9)\n"
        "  --min-rate R           lowest rate searched, req/s (default 0.25)\n"
        "  --max-rate R           highest rate searched, req/s (default 64)\n"
        "  --resolution R         the search stops at this bracket width, req/s (default 0.25)\n"
        "  --seeds N              seeds per configuration (default 5): mean and 95%% interval\n",
        SM_DEFAULT_CTL_LATENCY * 1e6);
}

/* WORKER@T[+R]: worker killed at modelled second T, restarted R s later. */
static int parse_fail(char *v, struct sm_options *so)
{
    char *at = strchr(v, '@');
    if (at == NULL || at == v || so->n_fails == SM_MAX_FAILS) {
        return TANDEM_EINVAL;
    }
    struct sm_fail *f = &so->fails[so->n_fails];
    char *end;
    f->at_s = strtod(at + 1, &end);
    f->restart_s = -1;
    if (end == at + 1 || !(f->at_s >= 0)) {
        return TANDEM_EINVAL;
    }
    if (*end == '+') {
        char *e2;
        f->restart_s = strtod(end + 1, &e2);
        if (e2 == end + 1 || !(f->restart_s >= 0)) {
            return TANDEM_EINVAL;
        }
        end = e2;
    }
    if (*end != '\0') {
        return TANDEM_EINVAL;
    }
    *at = '\0'; /* argv outlives the run */
    f->worker = v;
    so->n_fails++;
    return 0;
}

/* The P:D search's flags. */
struct search_cli {
    int on;           /* --search pd */
    int given;        /* some search flag was given */
    const char *colo; /* --colocated FILE */
    struct search_pd_opts o;
};

/* A number flag of the search in [lo, hi]: 0, or 2 with a message. */
static int search_number(const char *a, const char *v, double lo, double hi, double *out)
{
    char *end = NULL;
    double x = v != NULL ? strtod(v, &end) : NAN;
    if (v == NULL || end == v || *end != '\0' || !(x >= lo && x <= hi)) {
        fprintf(stderr, "tandem simulate: %s: expected a number in [%g, %g], got '%s'\n", a, lo, hi,
                v ? v : "");
        return 2;
    }
    *out = x;
    return 0;
}

/* One search flag at argv[i] (value v): 1 when it was one (*i moved past
 * its value), 0 when not, 2 on a bad value (message printed). */
static int search_flag(const char *a, const char *v, int *i, struct search_cli *sc)
{
    static const char *const names[] = {"--search",    "--gpus",       "--tp",
                                        "--colocated", "--attainment", "--min-rate",
                                        "--max-rate",  "--resolution", "--seeds"};
    int k = -1;
    for (int j = 0; j < (int)(sizeof(names) / sizeof(names[0])); j++) {
        k = strcmp(a, names[j]) == 0 ? j : k;
    }
    if (k < 0) {
        return 0;
    }
    sc->given = 1;
    (*i)++;
    double x = 0;
    char err[256];
    switch (k) {
    case 0:
        if (v == NULL || strcmp(v, "pd") != 0) {
            fprintf(stderr, "tandem simulate: --search: '%s' is not a search (have: pd)\n",
                    v ? v : "");
            return 2;
        }
        sc->on = 1;
        return 1;
    case 1:
        if (search_number(a, v, 2, 65536, &x) != 0) {
            return 2;
        }
        if (x != (int)x) {
            fprintf(stderr, "tandem simulate: --gpus: expected a whole number of GPUs, got '%s'\n",
                    v);
            return 2;
        }
        sc->o.gpus = (int)x;
        return 1;
    case 2:
        if (v == NULL || search_parse_tps(v, &sc->o, err, sizeof(err)) != 0) {
            fprintf(stderr, "tandem simulate: %s\n", v ? err : "--tp needs a list (e.g. 1,2,4)");
            return 2;
        }
        return 1;
    case 3:
        if (v == NULL) {
            fprintf(stderr, "tandem simulate: --colocated needs a cluster file\n");
            return 2;
        }
        sc->colo = v;
        return 1;
    case 8:
        if (search_number(a, v, 1, EXP_MAX_SEEDS, &x) != 0 || x != (int)x) {
            return 2;
        }
        sc->o.rate.seeds = (int)x;
        return 1;
    default: {
        double *dst[] = {&sc->o.rate.attainment, &sc->o.rate.min_rate, &sc->o.rate.max_rate,
                         &sc->o.rate.resolution};
        return search_number(a, v, k == 4 ? 0.01 : 1e-6, k == 4 ? 1 : 1e9, dst[k - 4]) == 0 ? 1 : 2;
    }
    }
}

/* Takes simulate's own flags out of argv; what is left goes to bench. */
static int own_flags(int *argc, char **argv, const char **cluster, struct sm_options *so,
                     int *stats, int *help, struct search_cli *sc)
{
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        char *v = i + 1 < *argc ? argv[i + 1] : NULL;
        int sf = search_flag(a, v, &i, sc);
        if (sf == 2) {
            return 2;
        }
        if (sf == 1) {
            continue;
        }
        if (strcmp(a, "-c") == 0 || strcmp(a, "--cluster") == 0) {
            if (v == NULL) {
                fprintf(stderr, "tandem simulate: %s needs a file\n", a);
                return 2;
            }
            *cluster = v;
            i++;
        } else if (strcmp(a, "--routing") == 0) {
            if (v == NULL) {
                fprintf(stderr, "tandem simulate: --routing needs a file\n");
                return 2;
            }
            so->routing_path = v;
            i++;
        } else if (strcmp(a, "--ctl-latency-us") == 0) {
            char *end;
            double us = v != NULL ? strtod(v, &end) : -1;
            if (v == NULL || *end != '\0' || !(us >= 0 && us <= 1e6)) {
                fprintf(stderr, "tandem simulate: --ctl-latency-us: expected microseconds in "
                                "[0, 1e6]\n");
                return 2;
            }
            so->ctl_latency_s = us / 1e6;
            i++;
        } else if (strcmp(a, "--fail") == 0) {
            if (v == NULL || parse_fail(v, so) != 0) {
                fprintf(stderr,
                        "tandem simulate: --fail: expected WORKER@SECONDS[+RESTART_SECONDS] "
                        "(e.g. decode-0@10+1), at most %d\n",
                        SM_MAX_FAILS);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--sim-stats") == 0) {
            *stats = 1;
        } else {
            if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
                *help = 1;
            }
            argv[out++] = argv[i];
        }
    }
    *argc = out;
    return 0;
}

/* --timeline: the router's endpoint table every sample_s modelled seconds. */
static void on_sample(void *arg, double now, const struct rt_pipeline *pl)
{
    if (tl_sample_pipeline(arg, now, pl) != 0) {
        fprintf(stderr, "tandem simulate: --timeline: out of memory; the timeline stops here\n");
    }
}

/* --search pd: the search, its table on stdout. Returns the exit code. */
static int run_search(const struct cluster *c, const struct bench_options *o,
                      const struct sm_options *so, struct search_cli *sc)
{
    char err[SM_ERR_MAX] = "", slo[160] = "";
    const struct lg_slo *s = &o->summary.slo;
    if (!(s->ttft_ms >= 0 || s->tpot_ms >= 0 || s->e2el_ms >= 0)) {
        fprintf(stderr, "tandem simulate: --search pd needs SLOs: --goodput ttft:MS tpot:MS\n");
        return 2;
    }
    if (search_rate_opts_check(&sc->o.rate, err, sizeof(err)) != 0) {
        fprintf(stderr, "tandem simulate: --search pd: %s\n", err);
        return 2;
    }
    struct cluster *colo = NULL;
    if (sc->colo && cluster_load(&colo, sc->colo, err, sizeof(err)) != 0) {
        fprintf(stderr, "tandem simulate: %s\n", err);
        return 2;
    }
    struct search_pd_row *rows = NULL;
    int n = 0;
    int rc = search_pd(c, colo, so, &o->run, s, &sc->o, stderr, &rows, &n, err, sizeof(err));
    cluster_free(colo);
    if (rc != 0) {
        fprintf(stderr, "tandem simulate: %s\n", err);
        return rc == TANDEM_EINVAL || rc == TANDEM_ECONFIG ? 2 : 1;
    }
    size_t l = 0;
    const char *names[] = {"TTFT", "TPOT", "E2EL"};
    double v[] = {s->ttft_ms, s->tpot_ms, s->e2el_ms};
    for (int i = 0; i < 3; i++) {
        if (v[i] >= 0 && l < sizeof(slo)) {
            l += (size_t)snprintf(slo + l, sizeof(slo) - l, "%s%s <= %g ms", l ? ", " : "",
                                  names[i], v[i]);
        }
    }
    printf("P:D search: %d GPUs of %s (%s%s%s), SLOs %s, at least %g%% of requests inside; rates "
           "%g..%g req/s to %g, %d seeds per configuration (mean ± 95%% interval)\n\n",
           sc->o.gpus, c->model ? c->model : "?", c->source, colo || sc->colo ? ", baseline " : "",
           sc->colo ? sc->colo : "", slo, sc->o.rate.attainment * 100, sc->o.rate.min_rate,
           sc->o.rate.max_rate, sc->o.rate.resolution, sc->o.rate.seeds);
    search_pd_print(stdout, rows, n, &sc->o);
    free(rows);
    return 0;
}

int simulate_main(int argc, char **argv)
{
    const char *cluster_path = NULL;
    struct sm_options so;
    sm_options_default(&so);
    int stats = 0, help = 0;
    struct search_cli sc = {.on = 0};
    search_rate_opts_default(&sc.o.rate);
    int rc = own_flags(&argc, argv, &cluster_path, &so, &stats, &help, &sc);
    if (rc != 0) {
        return rc;
    }
    if (!help && sc.given && !sc.on) {
        fprintf(stderr, "tandem simulate: --gpus, --tp, --colocated, --attainment, --min-rate, "
                        "--max-rate, --resolution and --seeds go with --search pd\n");
        return 2;
    }
    if (!help && sc.on && sc.o.gpus == 0) {
        fprintf(stderr, "tandem simulate: --search pd needs --gpus N (the GPU budget)\n");
        return 2;
    }
    if (help) {
        usage(stdout);
        printf("\n");
    }
    struct bench_options o;
    char err[SM_ERR_MAX] = "";
    /* The search sets every rate itself: a placeholder first (a later
     * --request-rate wins) keeps bench's checks of the workload happy. */
    char rate_flag[] = "--request-rate=1";
    char **args = argv;
    char *with_rate[argc + 1];
    if (sc.on) {
        with_rate[0] = argv[0];
        with_rate[1] = rate_flag;
        memcpy(with_rate + 2, argv + 1, (size_t)(argc - 1) * sizeof(char *));
        args = with_rate;
        argc++;
    }
    rc = bench_parse_args(&o, argc, args, 1, 0, help ? stdout : NULL, err, sizeof(err));
    if (rc == FLAGS_HELP || rc == FLAGS_VERSION) {
        bench_options_fini(&o);
        return 0;
    }
    if (rc != FLAGS_OK) {
        fprintf(stderr, "tandem simulate: %s\n", err);
        bench_options_fini(&o);
        return 2;
    }
    struct cluster *c = NULL;
    rc = cluster_path != NULL ? cluster_load(&c, cluster_path, err, sizeof(err))
                              : cluster_default(&c, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "tandem simulate: %s\n", err);
        bench_options_fini(&o);
        return 2;
    }
    if (sc.on) {
        rc = run_search(c, &o, &so, &sc);
        cluster_free(c);
        bench_options_fini(&o);
        return rc;
    }
    bench_print_traffic(&o);
    struct lg_run_result res;
    struct sm_stats st;
    struct timeline tl;
    tl_init(&tl);
    if (o.timeline_dir != NULL) {
        so.sample_s = o.timeline_ms / 1e3;
        so.on_sample = on_sample;
        so.sample_arg = &tl;
    }
    rc = sm_run(c, &o.run, &so, &res, &st, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "tandem simulate: %s\n", err);
        cluster_free(c);
        tl_fini(&tl);
        bench_options_fini(&o);
        return rc == TANDEM_ECONFIG || rc == TANDEM_EINVAL ? 2 : 1;
    }
    int exit_code = bench_report(&o, &res);
    if (o.timeline_dir != NULL) {
        char title[512];
        snprintf(title, sizeof(title),
                 "tandem simulate: %s at %g req/s, per worker as the router sees it", c->name,
                 o.run.request_rate);
        if (tl_write(&tl, o.timeline_dir, title, err, sizeof(err)) != 0) {
            fprintf(stderr, "tandem simulate: %s\n", err);
            exit_code = exit_code ? exit_code : 1;
        } else {
            fprintf(stderr, "tandem simulate: timeline of %zu samples in %s/timeline.svg\n", tl.n,
                    o.timeline_dir);
        }
    }
    tl_fini(&tl);
    if (stats) {
        fprintf(stderr,
                "simulate: %d workers (%d GPUs), %.3f modelled s in %.3f wall s (%.1fx), %llu "
                "events (%.0f/s), %llu steps, %llu messages, %llu KV frames; router %.1f us per "
                "request taking it, %.1f us per request in worker messages\n",
                st.workers, st.gpus, st.modelled_s, st.wall_s,
                st.wall_s > 0 ? st.modelled_s / st.wall_s : 0.0, (unsigned long long)st.events,
                st.wall_s > 0 ? (double)st.events / st.wall_s : 0.0, (unsigned long long)st.steps,
                (unsigned long long)st.messages, (unsigned long long)st.kv_frames,
                st.requests ? st.router_submit_s / (double)st.requests * 1e6 : 0.0,
                st.requests ? st.router_deliver_s / (double)st.requests * 1e6 : 0.0);
    }
    lg_run_result_free(&res);
    cluster_free(c);
    bench_options_fini(&o);
    return exit_code;
}
