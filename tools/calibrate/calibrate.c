/* tandem-calibrate: fits the sim's per (model, GPU) efficiency parameters to
 * published measurements and prints, per point, the measured time, the sim's
 * before (global defaults) and after (fitted), and the errors
 * (docs/engine.md, "### Calibration"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib_fit.h"
#include "flags.h"
#include "sim.h"

static const char *const kind_names[] = {"prefill", "decode", "e2e"};

/* A pair with fewer points gets no row for engine/calibration.c: three
 * parameters fitted to a handful of points only reproduce those points. */
#define CALIB_MIN_POINTS 8

struct pair {
    const struct preset_model *model;
    const struct preset_gpu *gpu;
    struct calib_params fit;
    int constrained[3];
    double before, after;
    int points;
};

/* Distinct (model, GPU) pairs in file order. Returns how many (<= n). */
static size_t find_pairs(const struct calib_point *pts, size_t n, struct pair *pairs)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < k && (pairs[j].model != pts[i].model || pairs[j].gpu != pts[i].gpu)) {
            j++;
        }
        if (j == k) {
            pairs[k++] = (struct pair){.model = pts[i].model, .gpu = pts[i].gpu};
        }
        pairs[j].points++;
    }
    return k;
}

static void fit_pair(const struct calib_point *pts, size_t n, unsigned char *use,
                     const struct calib_params *defaults, struct pair *pr)
{
    for (size_t i = 0; i < n; i++) {
        use[i] = pts[i].model == pr->model && pts[i].gpu == pr->gpu;
    }
    pr->fit = *defaults;
    calib_fit(pts, n, use, &pr->fit, pr->constrained);
    pr->before = calib_mape(pts, n, use, defaults);
    pr->after = calib_mape(pts, n, use, &pr->fit);
}

static double pct(double model, double measured)
{
    return 100.0 * (model - measured) / measured;
}

static void print_points(const struct calib_point *pts, size_t n, const struct pair *pairs,
                         size_t np, const struct calib_params *defaults)
{
    printf("| id | model | GPU | tp | batch | input | output | kind | measured ms | sim before ms "
           "| error before | sim after ms | error after |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < n; i++) {
        const struct calib_point *p = &pts[i];
        size_t j = 0;
        while (j + 1 < np && (pairs[j].model != p->model || pairs[j].gpu != p->gpu)) {
            j++;
        }
        double m = p->measured_s, b = calib_model_seconds(p, defaults);
        double a = calib_model_seconds(p, &pairs[j].fit);
        printf(
            "| %s | %s | %s | %d | %d | %d | %d | %s | %.1f | %.1f | %+.1f%% | %.1f | %+.1f%% |\n",
            p->id, p->model->name, p->gpu->name, p->tp, p->batch, p->input, p->output,
            kind_names[p->kind], m * 1e3, b * 1e3, pct(b, m), a * 1e3, pct(a, m));
    }
}

static void print_pairs(const struct pair *pairs, size_t np)
{
    static const char *const names[3] = {"mfu", "mbu", "overhead"};
    printf("\n| model | GPU | points | mfu | mbu | overhead ms | not constrained (kept) | MAPE "
           "before | MAPE after |\n|---|---|---|---|---|---|---|---|---|\n");
    for (size_t j = 0; j < np; j++) {
        const struct pair *pr = &pairs[j];
        char loose[64] = "";
        for (int a = 0; a < 3; a++) {
            if (!pr->constrained[a]) {
                size_t l = strlen(loose);
                snprintf(loose + l, sizeof(loose) - l, "%s%s", l ? ", " : "", names[a]);
            }
        }
        printf("| %s | %s | %d | %.2f | %.2f | %.2f | %s | %.1f%% | %.1f%% |\n", pr->model->name,
               pr->gpu->name, pr->points, pr->fit.mfu, pr->fit.mbu, pr->fit.overhead_s * 1e3,
               loose[0] ? loose : "-", pr->before, pr->after);
    }
}

/* The rows of engine/calibration.c, to paste. */
static void print_rows(const struct pair *pairs, size_t np)
{
    printf("\nengine/calibration.c rows (pairs with >= %d points):\n", CALIB_MIN_POINTS);
    for (size_t j = 0; j < np; j++) {
        const struct pair *pr = &pairs[j];
        if (pr->points < CALIB_MIN_POINTS) {
            printf("none for %s on %s: %d points\n", pr->model->name, pr->gpu->name, pr->points);
            continue;
        }
        printf("fitted {.model = \"%s\", .gpu = \"%s\", .mfu = %.2f, .mbu = %.2f, "
               ".step_overhead_s = %.5f, .points = %d, .mape_before = %.1f, .mape_after = %.1f},\n",
               pr->model->name, pr->gpu->name, pr->fit.mfu, pr->fit.mbu, pr->fit.overhead_s,
               pr->points, pr->before, pr->after);
    }
}

int main(int argc, char **argv)
{
    char err[512];
    int rest = argc;
    int rc = flags_parse(NULL, 0, argc, argv, 1, &rest, err, sizeof(err));
    if (rc == FLAGS_HELP) {
        flags_usage(stdout,
                    "tandem-calibrate POINTS.csv\n\nFits the sim's mfu, mbu and step overhead per "
                    "(model, GPU) to the measured times in\nPOINTS.csv (format: "
                    "tools/calibrate/calib_fit.h; ours: docs/calibration/points.csv)\nand prints "
                    "every point before (global defaults) and after (fitted). docs/engine.md,\n"
                    "\"### Calibration\", explains the model and the result.",
                    NULL, 0);
        return 0;
    }
    if (rc == FLAGS_VERSION) {
        printf("tandem-calibrate %s\n", TANDEM_VERSION);
        return 0;
    }
    if (rc != 0 || rest != argc - 1) {
        fprintf(stderr, "tandem-calibrate: %s\n", rc != 0 ? err : "expected one POINTS.csv");
        return 2;
    }
    struct calib_point *pts = NULL;
    size_t n = 0;
    if (calib_read(argv[rest], &pts, &n, err, sizeof(err)) != 0) {
        fprintf(stderr, "tandem-calibrate: %s\n", err);
        return 1;
    }
    struct pair *pairs = calloc(n, sizeof(*pairs));
    unsigned char *use = calloc(n, 1);
    if (pairs == NULL || use == NULL) {
        fprintf(stderr, "tandem-calibrate: out of memory\n");
        return 1;
    }
    const struct calib_params defaults = {SIM_DEFAULT_MFU, SIM_DEFAULT_MBU, SIM_DEFAULT_OVERHEAD_S};
    size_t np = find_pairs(pts, n, pairs);
    for (size_t j = 0; j < np; j++) {
        fit_pair(pts, n, use, &defaults, &pairs[j]);
    }
    print_points(pts, n, pairs, np, &defaults);
    print_pairs(pairs, np);
    double before = calib_mape(pts, n, NULL, &defaults), after = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (pairs[j].model != pts[i].model || pairs[j].gpu != pts[i].gpu) {
            j++;
        }
        double a = calib_model_seconds(&pts[i], &pairs[j].fit);
        after += 100.0 * (a > pts[i].measured_s ? a - pts[i].measured_s : pts[i].measured_s - a) /
                 pts[i].measured_s;
    }
    printf("\nall %zu points: MAPE before %.1f%%, after %.1f%%\n", n, before, after / (double)n);
    print_rows(pairs, np);
    printf("\nsources:\n");
    for (size_t i = 0; i < n; i++) {
        printf("%s: %s\n", pts[i].id, pts[i].source);
    }
    free(use);
    free(pairs);
    calib_free(pts, n);
    return 0;
}
