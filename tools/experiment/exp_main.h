/* Experiments: `tandem bench --experiment FILE` (docs/experiments.md). A
 * matrix of configurations (cluster file x routing config, or an explicit
 * list, optionally sweeping one routing parameter) x request rates, with one
 * workload, each cell run over several seeds (exp_seeds: the report gives
 * means with 95% intervals, exp_stats.h). exp_main loads the file (exp_file.h), writes a derived
 * cluster file per configuration (exp_derive.h), runs the matrix
 * (exp_matrix.h) with the live runner (exp_live.h: `tandem up` per
 * configuration, waiting for its READY line, the load generator once per
 * rate), and writes a report directory (exp_report.h): summary.md,
 * results.csv, one JSON per cell (vLLM's result keys plus an "experiment"
 * object), the per-request CSVs, and SVG plots (goodput against rate, TTFT
 * and TPOT CDFs).
 *
 * Offline, after the matrix, the file's goodput_search: and pd_search: run
 * the searches of tools/search.h and become sections of summary.md.
 *
 * The modules, each usable alone: exp_file (the file), exp_derive (derived
 * files), exp_cell (the cells), exp_stats (means, intervals, attainment),
 * exp_matrix (the matrix loop and the runner interface),
 * exp_live (the live runner), exp_report (CSV, markdown, progress line) and
 * its plots (exp_svg.c), exp_main (this command). This header includes none
 * of them, nor bench.h: bench.c calls exp_main, the experiment modules use
 * only bench_options.h.
 *
 * Time: every time in the experiment file and in the report is in modelled
 * seconds. For sim clusters with time_scale s (wall seconds per modelled
 * second) the live runner sends at rate / s wall requests per second and
 * divides every measured time by s; for tiny clusters (and s = 1) modelled
 * = wall. */
#ifndef TANDEM_EXP_MAIN_H
#define TANDEM_EXP_MAIN_H

/* `tandem bench --experiment FILE [--out DIR] [...]`: argv as bench_main got
 * it (argv[0] "bench"). Returns the exit code: 0 when every cell ran; 1 when
 * a cluster failed to start or a cell could not run (the report is still
 * written); 2 for bad usage or a bad experiment file; 130 when interrupted.
 * Blocks the calling thread (the CLI's main thread) for the whole
 * experiment. */
int exp_main(int argc, char **argv);

#endif
