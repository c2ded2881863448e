/* The `tandem simulate` subcommand (tools/simulate.c; the simulator itself
 * is simulate/simulate.h). argv[0] is "simulate". Returns the exit code: 0;
 * 1 when the run failed or every request failed; 2 for bad usage, a bad
 * cluster or routing file, or a pool without a cost model. */
#ifndef TANDEM_SIMULATE_CMD_H
#define TANDEM_SIMULATE_CMD_H

int simulate_main(int argc, char **argv);

#endif
