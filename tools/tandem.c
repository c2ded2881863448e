/* The `tandem` CLI: one binary, one subcommand per entry of the table below
 * (plan now; up and bench join as one entry each). */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "log.h"
#include "plan.h"
#include "simulate_cmd.h"
#include "up.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "0.0.0"
#endif

struct subcommand {
    const char *name;
    const char *summary;
    /* argv[0] is the subcommand's name; returns the process exit code. */
    int (*main)(int argc, char **argv);
};

static const struct subcommand subcommands[] = {
    {.name = "up",
     .summary = "start and supervise a local cluster (router and workers) from a cluster file",
     .main = up_main},
    {.name = "plan",
     .summary = "KV-cache capacity arithmetic for a model and GPU",
     .main = plan_main},
    {.name = "bench",
     .summary = "load generator for Tandem or any OpenAI-compatible server",
     .main = bench_main},
    {.name = "simulate",
     .summary = "run a cluster file and a workload offline, in modelled time (sim backend)",
     .main = simulate_main},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem COMMAND [flags]   (tandem COMMAND --help for its flags)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++) {
        fprintf(f, "  %-10s %s\n", subcommands[i].name, subcommands[i].summary);
    }
    fprintf(f, "\nflags:\n  %-10s %s\n  %-10s %s\n", "--help", "print this help and exit",
            "--version", "print the version and exit");
}

int main(int argc, char **argv)
{
    log_init("tandem", LOG_LEVEL_WARN);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("tandem %s\n", TANDEM_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++) {
        if (strcmp(cmd, subcommands[i].name) == 0) {
            return subcommands[i].main(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "tandem: unknown command '%s' (see tandem --help)\n", cmd);
    return 2;
}
