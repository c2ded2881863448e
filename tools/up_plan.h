/* The plan of a cluster file: every process `tandem up` would start, with
 * its name, role, listen addresses and full command line, computed up front
 * (so --dry-run prints exactly what would run). `tandem up` starts these
 * command lines; the offline simulator (simulate/) reads them with each
 * binary's own flag table, so both run a cluster file the same way.
 * Pure: no process is started, no file written. */
#ifndef TANDEM_UP_PLAN_H
#define TANDEM_UP_PLAN_H

#include <limits.h>
#include <stdio.h>

#include "cluster.h"

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

#endif
