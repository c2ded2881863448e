/* Per (model, GPU) efficiency parameters of the `sim` cost model, fitted to
 * published measurements (docs/calibration/points.csv) by tandem-calibrate
 * (tools/calibrate/). docs/engine.md ("### Calibration") lists the points,
 * the errors before and after, and which presets remain uncalibrated.
 *
 * sim_create takes these values for every efficiency field left at SIM_AUTO
 * (engine/sim.h): an explicit value always wins, and pairs without an entry
 * keep the global defaults. The table is static and read-only, so every
 * function here is pure and thread-safe. */
#ifndef TANDEM_CALIBRATION_H
#define TANDEM_CALIBRATION_H

#include <stddef.h>

struct calibration {
    const char *model;      /* model preset name (presets.h) */
    const char *gpu;        /* GPU preset name */
    double mfu;             /* achieved / peak FLOP/s, (0, 1] */
    double mbu;             /* achieved / peak HBM bandwidth, (0, 1] */
    double step_overhead_s; /* fixed cost of every non-empty step, >= 0 */
    int points;             /* published points it was fitted to */
    double mape_before;     /* mean absolute % error with the global defaults */
    double mape_after;      /* ... with these values */
};

/* The entry for (model, gpu), or NULL when the pair is uncalibrated (or
 * either name is NULL). */
const struct calibration *calibration_find(const char *model, const char *gpu);

/* Iteration: index i in [0, count); NULL past the end. */
size_t calibration_count(void);
const struct calibration *calibration_at(size_t i);

#endif
