/* `tandem simulate`: a cluster file, a routing file and a workload run
 * offline (simulate/simulate.h), reported as `tandem bench` reports a live
 * run. Flags: its own (below), then every `tandem bench` flag for the
 * workload and the output (target flags are accepted and ignored). */
#include "simulate_cmd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cluster.h"
#include "flags.h"
#include "simulate.h"
#include "tandem_err.h"

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
        "  --help                 this help, then tandem bench's flags\n",
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

/* Takes simulate's own flags out of argv; what is left goes to bench. */
static int own_flags(int *argc, char **argv, const char **cluster, struct sm_options *so,
                     int *stats, int *help)
{
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        char *v = i + 1 < *argc ? argv[i + 1] : NULL;
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

int simulate_main(int argc, char **argv)
{
    const char *cluster_path = NULL;
    struct sm_options so;
    sm_options_default(&so);
    int stats = 0, help = 0;
    int rc = own_flags(&argc, argv, &cluster_path, &so, &stats, &help);
    if (rc != 0) {
        return rc;
    }
    if (help) {
        usage(stdout);
        printf("\n");
    }
    struct bench_options o;
    char err[SM_ERR_MAX] = "";
    rc = bench_parse_args(&o, argc, argv, 1, 0, help ? stdout : NULL, err, sizeof(err));
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
    bench_print_traffic(&o);
    struct lg_run_result res;
    struct sm_stats st;
    rc = sm_run(c, &o.run, &so, &res, &st, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "tandem simulate: %s\n", err);
        cluster_free(c);
        bench_options_fini(&o);
        return rc == TANDEM_ECONFIG || rc == TANDEM_EINVAL ? 2 : 1;
    }
    int exit_code = bench_report(&o, &res);
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
