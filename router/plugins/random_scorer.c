/* random-scorer: an independent uniform score in [0, 1) per candidate from
 * the pipeline's seeded random source (a baseline, or a tie-breaker jitter
 * with a small weight). */
#include "pipeline.h"

static void random_score(struct rt_plugin *p, struct rt_cycle *c, const int *cands, int n,
                         double *out)
{
    for (int i = 0; i < n; i++)
        out[i] = rt_pipeline_rand01(c->pl);
}

const struct rt_plugin_ops rt_random_scorer_ops = {
    .type = "random-scorer",
    .kind = RT_KIND_SCORER,
    .score = random_score,
};
