/* --dataset-name long-short: the interference workload. Each request is,
 * independently with probability --long-fraction, a long prompt
 * (--long-input-len, --long-output-len) or else a short one
 * (--short-input-len, --short-output-len). Long prefills landing in a batch
 * stall the decodes of the short requests on a colocated server; a
 * disaggregated one keeps them apart. */
#include <stdio.h>
#include <stdlib.h>

#include "tandem_err.h"
#include "workload.h"

static int ls_init(struct lg_workload *w, char *err, size_t errlen)
{
    const struct lg_workload_config *c = &w->cfg;
    if (!(c->long_fraction >= 0 && c->long_fraction <= 1) || c->long_input_len < 1 ||
        c->short_input_len < 1 || c->long_output_len < 1 || c->short_output_len < 1) {
        snprintf(err, errlen, "--long-fraction must be in [0, 1] and the long/short lengths >= 1");
        return TANDEM_EINVAL;
    }
    return 0;
}

static int ls_make(struct lg_workload *w, int64_t index, int warmup, struct lg_prompt *out)
{
    const struct lg_workload_config *c = &w->cfg;
    struct lg_rng rng;
    lg_rng_derive(&rng, lg_workload_seed(w, warmup), LG_STREAM_REQUEST, (uint64_t)index);
    int is_long = lg_rng_uniform(&rng) < c->long_fraction;
    out->output_len = is_long ? c->long_output_len : c->short_output_len;
    return lg_prompt_build(c, NULL, NULL, 0, &rng,
                           (size_t)(is_long ? c->long_input_len : c->short_input_len), out);
}

const struct lg_dataset_ops lg_dataset_long_short = {
    .name = "long-short",
    .init = ls_init,
    .make = ls_make,
};
