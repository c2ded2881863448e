/* `tandem simulate`: a whole cluster as a discrete-event simulation, in
 * modelled time, in one process, running the production code
 * (docs/simulate.md).
 *
 * What runs is what runs live, built from the same inputs the same way: the
 * cluster file goes through `tandem up`'s plan (tools/up.h), and each
 * process's command line through that process's own flag table (the
 * router's rt_opts_flags, the workers' wk_settings), so the router core
 * (router/rt_core.h: pipeline with every plugin, prefix index, dispatcher
 * with its retries and pending queue), each worker's core
 * (worker/wk_core.h: the prefill and decode roles' P/D hand-off, the
 * scheduler, the KV cache, the sim cost model at time_scale 0) and the load
 * generator's driver (tools/loadgen/driver.h: datasets, arrivals, open and
 * closed loop, records) are the live modules. Only the hosts differ: the
 * simulator carries their messages as packed protobuf bytes (wire_pack and
 * wire_unpack, validation included) with modelled delays, and advances a
 * modelled clock from event to event instead of sleeping. Token chunks, one
 * per generated token and most of all messages, are validated as wire_pack
 * does (wire_validate) and carried as their fields instead of their bytes
 * (pack_all carries them packed too: the same run, byte for byte, slower).
 *
 * What is modelled, with its period or cost:
 *   - arrivals: the driver's (Poisson/gamma/trace, closed loop, think time);
 *   - control messages router <-> worker: ctl_latency_s one way, FIFO;
 *   - a worker's step: the sim backend's modelled step time
 *     (sim_last_step_seconds); messages that reach a worker during its step
 *     wait for the step's end, as they do live (the loop is busy);
 *     what a step sends leaves at its end;
 *   - KV blocks: each frame crosses the sender's and the receiver's NIC
 *     (one transfer at a time on each: contention on both sides) at the
 *     backend's link model (transfer_seconds: latency + bytes / bandwidth),
 *     in the order sent, block by block while P computes;
 *   - heartbeats every heartbeat_ms (worker i starts at i/n of a period),
 *     KV events after every step and message, so routing sees load exactly
 *     as stale as live;
 *   - the dispatcher's tick (deadlines, stalled queue) every
 *     RT_DISPATCH_TICK_MS; request timeouts;
 *   - optionally, worker failures at given times (struct sm_fail): retry
 *     and recovery run as live.
 * Not modelled: HTTP and token text costs (the router and client CPU), OS
 * scheduling, NNG buffering limits.
 *
 * Deterministic: the same inputs give the same events in the same order
 * (ties broken by the order events were queued) and the same records.
 *
 * Threading: sm_run blocks its thread; no other thread is used. */
#ifndef TANDEM_SIMULATE_H
#define TANDEM_SIMULATE_H

#include <stddef.h>
#include <stdint.h>

#include "cluster.h"
#include "dispatch.h"
#include "loadgen/run.h"

#define SM_ERR_MAX             1024
#define SM_DEFAULT_CTL_LATENCY 50e-6 /* s: one-way router <-> worker message */

#define SM_MAX_FAILS 16

/* A worker failure: at modelled second at_s the worker named worker (the
 * plan's name: "decode-0", "prefill-1", "colocated-3") dies as a killed
 * process does: what it held is gone, the router sees its control link
 * close (endpoint unhealthy, its requests retried or recovered elsewhere),
 * its peers see their data links close. With restart_s >= 0 it starts again
 * restart_s later, empty, and rejoins the router as a restarted worker does. */
struct sm_fail {
    const char *worker;
    double at_s;
    double restart_s; /* < 0: stays down */
};

struct sm_options {
    double ctl_latency_s;     /* >= 0 */
    const char *routing_path; /* NULL: the cluster's routing (file, inline or the router's
                                 default) */
    struct sm_fail fails[SM_MAX_FAILS];
    int n_fails;
    int pack_all; /* 1: token chunks too travel packed (the fast path's reference) */
    /* Every sample_s modelled seconds from 0 until the workload ends,
     * on_sample(sample_arg, now, the router's pipeline) (tandem simulate
     * --timeline). NULL: none. It must not change what it reads. */
    double sample_s;
    void (*on_sample)(void *arg, double now, const struct rt_pipeline *pl);
    void *sample_arg;
};

void sm_options_default(struct sm_options *o);

/* What the run cost, for benchmarks and the report. */
struct sm_stats {
    uint64_t events;    /* events handled */
    uint64_t messages;  /* control and data messages carried */
    uint64_t steps;     /* worker steps */
    double modelled_s;  /* modelled time at the end */
    double wall_s;      /* wall time of the run (not of the setup) */
    double busy_s;      /* sum over workers of modelled step time */
    int workers;        /* worker instances */
    int gpus;           /* their GPUs (TP degree each) */
    uint64_t kv_frames; /* KV frames carried between workers */
    double kv_bytes;    /* modelled KV bytes they stand for */
    /* Wall seconds in the router's code: taking requests (parse, tokenize,
     * hash, the pipeline's decision, the job out, the pending queue) and
     * taking the workers' messages (tokens to SSE chunks, KV events,
     * heartbeats). Requests are the measured ones plus warm-ups. */
    double router_submit_s;
    double router_deliver_s;
    uint64_t requests;
    struct rt_dispatch_stats dispatch; /* the router's counters (retries, recoveries, ...) */
};

/* Runs the workload of run (its target fields are ignored) against the
 * cluster c offline. On 0, out holds the records in modelled seconds (as
 * lg_run's, free with lg_run_result_free) and st (may be NULL) the costs.
 * Errors, with a message in err: TANDEM_ECONFIG / TANDEM_EINVAL (a process's
 * settings refused by its own checks, a pool whose backend has no cost
 * model, a bad routing file, a failure naming no worker of the cluster),
 * TANDEM_ENOMEM, or the setup's error. */
int sm_run(const struct cluster *c, const struct lg_run_config *run, const struct sm_options *o,
           struct lg_run_result *out, struct sm_stats *st, char *err, size_t errlen);

#endif
