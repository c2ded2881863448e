/* Calibration of the `sim` cost model against published measurements: read
 * a points file, price each point with the sim's own step cost
 * (sim_step_cost, engine/sim.h), fit per (model, GPU) mfu, mbu and step
 * overhead minimising the mean absolute percentage error. tandem-calibrate
 * (calibrate.c) prints the result; docs/engine.md ("### Calibration") explains it.
 *
 * Points file (CSV, '#' lines are comments, the first other line is the header
 * "id,model,gpu,tp,batch,input,output,kind,measured_ms,source"; source is the
 * rest of the line and may hold commas). kind says what was measured:
 *   prefill: one step prefilling `batch` prompts of `input` tokens (TTFT);
 *   decode:  one decode step of `batch` sequences at context `input` (ITL/TPOT);
 *   e2e:     a static batch: the prefill step, then output - 1 decode steps
 *            (the prefill emits the first token), total time.
 *
 * Ownership: calib_read allocates the array; calib_free frees it.
 * Threads: no state; any thread. */
#ifndef TANDEM_CALIB_FIT_H
#define TANDEM_CALIB_FIT_H

#include <stddef.h>

#include "presets.h"
#include "sim.h"

enum calib_kind { CALIB_PREFILL, CALIB_DECODE, CALIB_E2E };

struct calib_point {
    char id[32];
    const struct preset_model *model;
    const struct preset_gpu *gpu;
    int tp, batch, input, output;
    enum calib_kind kind;
    double measured_s;
    char source[512];
    struct sim_work *steps; /* the point's steps, built by calib_read (owned) */
    int n_steps;
};

/* The parameters priced or fitted. */
struct calib_params {
    double mfu, mbu, overhead_s;
};

/* Reads path into *out (n points); free with calib_free(*out, *n). Returns 0, or TANDEM_EINVAL /
 * TANDEM_EIO with "path:line: what" in err (unknown preset, bad number, a shape the sim refuses: tp
 * above the KV heads, weights that do not fit). */
int calib_read(const char *path, struct calib_point **out, size_t *n, char *err, size_t errlen);
void calib_free(struct calib_point *pts, size_t n);

/* Modelled seconds of point p under params (all-reduce latency: the sim's
 * default 5 us). */
double calib_model_seconds(const struct calib_point *p, const struct calib_params *params);

/* Mean absolute percentage error (in %) of the points of pts[0..n) for which
 * use[i] is nonzero (use NULL: all). 0 when none. */
double calib_mape(const struct calib_point *pts, size_t n, const unsigned char *use,
                  const struct calib_params *params);

/* Fits params over the used points by coordinate search on fixed grids
 * (mfu and mbu 0.01 .. 1 by 0.01, overhead 0 .. 20 ms by 0.05 ms), starting
 * from *params and moving only on a strict improvement, so a parameter the
 * points do not constrain keeps its starting value. Deterministic.
 * constrained[0..3) (may be NULL) says, for mfu, mbu and overhead, whether
 * moving it one grid step either way changes the error. */
void calib_fit(const struct calib_point *pts, size_t n, const unsigned char *use,
               struct calib_params *params, int constrained[3]);

#endif
