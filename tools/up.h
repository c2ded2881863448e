/* `tandem up`: a local cluster from one cluster file (docs/up.md).
 *
 * Starts the router (tandem-router), waits for its READY line, then starts
 * every worker (tandem-prefill, tandem-decode [--colocated]) with --router
 * set to the router's announce address, waits for their READY lines and until
 * the router's GET /v1/cluster lists every worker healthy. Then prints the
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
#include "sv_backoff.h"

#define UP_URL_MAX  320
#define UP_NAME_MAX 64

enum up_kind { UP_ROUTER = 0, UP_WORKER };

/* One process of the cluster. */
struct up_spec {
    char name[UP_NAME_MAX]; /* "router", "prefill-0", "decode-1", "colocated-0" */
    enum up_kind kind;
    enum cluster_role role; /* workers */
    char **argv;            /* (argc + 1) NULL-terminated; argv[0] is the binary's path */
    int argc;
    char control[UP_URL_MAX]; /* workers: assigned listen addresses */
    char kv[UP_URL_MAX];
    int metrics_port; /* workers: 0 = any */
};

struct up_plan {
    struct up_spec *procs; /* (n): the router first (unless no router), then workers */
    int n;
    char announce[UP_URL_MAX];   /* the router's announce address ("" without router) */
    char ipc_dir[PATH_MAX];      /* "" with tcp */
    char routing_file[PATH_MAX]; /* what --routing gets ("" for the router's default) */
    int router_port;
};

/* What the plan needs besides the cluster. */
struct up_plan_input {
    const char *bin_dir; /* where tandem-router, tandem-prefill, tandem-decode are */
    const char *run_dir; /* the inline routing file goes there */
    const char *ipc_dir; /* ipc transport: the socket directory */
    int no_router;       /* workers only, without --router */
    int router_port;     /* final HTTP port (a port picked for 0 already substituted) */
    int announce_port;   /* tcp: final announce port */
};

/* Computes every command line. Returns 0, TANDEM_ENOMEM, or TANDEM_EINVAL
 * (a path or address too long; message in err). Free with up_plan_free. */
int up_plan_build(struct up_plan *plan, const struct cluster *c, const struct up_plan_input *in,
                  char *err, size_t errlen);

void up_plan_free(struct up_plan *plan);

/* Prints argv as one shell command line (arguments quoted when needed). */
void up_print_command(FILE *f, char *const *argv);

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
 * 1 (a process failed to start, or a runtime error), 2 (bad flag or cluster
 * file), 130 (interrupted before the cluster was up). */
int up_main(int argc, char **argv);

#endif
