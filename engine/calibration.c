/* The calibration table. Every row is printed by
 *   build/bin/tandem-calibrate docs/calibration/points.csv
 * (its "fitted" lines); docs/engine.md ("### Calibration") has the points. */
#include "calibration.h"

#include <string.h>

static const struct calibration table[] = {
    {.model = "llama-2-7b",
     .gpu = "a100-80g",
     .mfu = 0.72,
     .mbu = 1.00,
     .step_overhead_s = 0.00580,
     .points = 21,
     .mape_before = 34.9,
     .mape_after = 6.9},
    {.model = "llama-2-7b",
     .gpu = "h100-sxm",
     .mfu = 0.41,
     .mbu = 1.00,
     .step_overhead_s = 0.00425,
     .points = 16,
     .mape_before = 40.8,
     .mape_after = 5.1},
    {.model = "opt-13b",
     .gpu = "a100-80g",
     .mfu = 0.58,
     .mbu = 0.65,
     .step_overhead_s = 0.00575,
     .points = 30,
     .mape_before = 24.0,
     .mape_after = 12.3},
    {.model = "opt-66b",
     .gpu = "a100-80g",
     .mfu = 0.65,
     .mbu = 0.68,
     .step_overhead_s = 0.01135,
     .points = 30,
     .mape_before = 23.4,
     .mape_after = 11.2},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

const struct calibration *calibration_find(const char *model, const char *gpu)
{
    for (size_t i = 0; model != NULL && gpu != NULL && i < COUNT(table); i++) {
        if (strcmp(table[i].model, model) == 0 && strcmp(table[i].gpu, gpu) == 0) {
            return &table[i];
        }
    }
    return NULL;
}

size_t calibration_count(void)
{
    return COUNT(table);
}

const struct calibration *calibration_at(size_t i)
{
    return i < COUNT(table) ? &table[i] : NULL;
}
