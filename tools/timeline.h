/* Plots over time of one run (`--timeline DIR` of tandem bench and tandem
 * simulate; docs/bench.md): per worker, what the router sees of it at each
 * sample: queue length (waiting sequences), running sequences, KV usage and
 * its picks per second (decisions that chose it, as decode or remote
 * prefill), to see herding and imbalance.
 *
 * Samples come from the router's endpoint table: live, from the body of
 * GET /v1/cluster (tandem bench polls it every --timeline-ms); offline,
 * from the simulated router's pipeline at the same modelled period (tandem
 * simulate). Either way the load is the heartbeats' (as stale as routing
 * sees it) and picks are the router's own counter.
 *
 * tl_write puts into DIR: timeline.csv (one line per sample and worker) and
 * timeline.svg, four panels over one time axis, one line per worker
 * (plot.h), with timeline.png beside it when rsvg-convert is installed.
 *
 * Threading: one struct timeline is used by one thread at a time. */
#ifndef TANDEM_TIMELINE_H
#define TANDEM_TIMELINE_H

#include <stddef.h>

#define TL_DEFAULT_MS  250 /* sample period: the workers' heartbeat period */
#define TL_MAX_WORKERS 64  /* workers drawn; more are counted in dropped */
#define TL_ID_MAX      64
#define TL_RATE_S      2.0 /* picks/s: over the last two seconds of samples */

struct rt_pipeline;

struct tl_val {
    int seen; /* the worker was listed in this sample */
    double waiting, running, kv_usage;
    double picks; /* cumulative */
};

struct tl_sample {
    double t; /* seconds from the run's start */
    struct tl_val v[TL_MAX_WORKERS];
};

struct timeline {
    char id[TL_MAX_WORKERS][TL_ID_MAX];
    char role[TL_MAX_WORKERS][16];
    int n_workers;
    int dropped;         /* workers beyond TL_MAX_WORKERS, left out */
    struct tl_sample *s; /* (n) by time */
    size_t n, cap;
};

void tl_init(struct timeline *t);
void tl_fini(struct timeline *t);

/* One sample at `at` seconds: every endpoint of pl. 0 or TANDEM_ENOMEM. */
int tl_sample_pipeline(struct timeline *t, double at, const struct rt_pipeline *pl);

/* One sample at `at` seconds from the body of GET /v1/cluster. 0,
 * TANDEM_EPROTO (not that JSON) or TANDEM_ENOMEM. */
int tl_sample_cluster_json(struct timeline *t, double at, const char *json);

/* Picks per second of worker w at sample i: over the samples of the last
 * TL_RATE_S (at least the previous one); 0 at the first sample. */
double tl_picks_rate(const struct timeline *t, size_t i, int w);

/* Writes dir/timeline.csv and dir/timeline.svg (dir is created if missing)
 * and timeline.png when rsvg-convert is installed; title heads the plot.
 * 0, or TANDEM_EIO with a message in err. */
int tl_write(const struct timeline *t, const char *dir, const char *title, char *err,
             size_t errlen);

#endif
