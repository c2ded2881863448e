/* `tandem up`: a local cluster from one cluster file (docs/up.md).
 *
 * Starts the router (tandem-router), waits for its READY line, then starts
 * every worker (tandem-prefill, tandem-decode [--colocated]) with --router
 * set to the router's announce address, waits for their READY lines and until
 * the router's GET /v1/cluster lists every worker healthy (a worker it lists
 * under "refusals" stops everything with the router's reason). Then prints the
 * endpoints and a curl command, and supervises (tools/supervise.h): a process
 * that exits is restarted with backoff, and workers rejoin the router by
 * announcing themselves again. SIGINT or SIGTERM stops everything within the
 * stop timeout and removes every ipc socket it assigned.
 *
 * The binaries come from the directory of the running `tandem` (or
 * --bin-dir). The plan (every command line) is computed up front from the
 * cluster file, so --dry-run prints exactly what would run.
 *
 * Threads: one (the libuv loop). */
#ifndef TANDEM_UP_H
#define TANDEM_UP_H

#include <limits.h>
#include <stdio.h>

#include "cluster.h"
#include "up_plan.h"
#include "sv_backoff.h"

/* Parses a READY line ("READY id=x role=y ..."): copies the value of key into
 * out. Returns 0, or TANDEM_ENOENT when the line lacks it. */
int up_ready_field(const char *line, const char *key, char *out, size_t cap);

/* The restart policy `tandem up` would run with for argv (argv[0] is "up"):
 * the defaults, then --restart-backoff, --restart-backoff-max and
 * --healthy-reset, in ms. Returns FLAGS_OK (0, *out set) or the other
 * flags_parse results (FLAGS_HELP prints the usage; err has the message of a
 * bad flag). For tests: up_main uses the same conversion. */
int up_restart_policy(int argc, char **argv, struct sv_backoff *out, char *err, size_t errlen);

/* The `tandem up` subcommand: argv[0] is "up". Returns the exit code: 0
 * (stopped by SIGINT/SIGTERM after the cluster was up, --dry-run, --help),
 * 1 (a process failed to start, the router refused a worker, or a runtime
 * error), 2 (bad flag or cluster file), 130 (interrupted before the cluster
 * was up). */
int up_main(int argc, char **argv);

#endif
