/* --dataset-name sharegpt-synth: ShareGPT-like lengths without the dataset.
 *
 * Input and output lengths are independent lognormals whose means are the
 * ShareGPT averages the vLLM paper reports (Kwon et al., SOSP 2023, sec. 6.1
 * and Fig. 11: 161.31 input and 337.99 output tokens per request). The paper
 * gives no spread; we take sigma = 1.0 for inputs and 0.8 for outputs, which
 * puts the medians at 98 and 245 tokens with long right tails, the shape of
 * the paper's histograms. Draws are then held to vLLM's ShareGPT filter
 * (benchmarks' is_valid_sequence: prompt and output >= 4 tokens, prompt <=
 * 1024, prompt + output <= 2048) by drawing again, which trims the tails (the
 * truncated means are in docs/bench.md). With --sharegpt-output-len the
 * output length is fixed and only the prompt is filtered. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tandem_err.h"
#include "workload.h"

#define SHAREGPT_INPUT_MEAN   161.31
#define SHAREGPT_INPUT_SIGMA  1.0
#define SHAREGPT_OUTPUT_MEAN  337.99
#define SHAREGPT_OUTPUT_SIGMA 0.8
#define SHAREGPT_MIN_LEN      4
#define SHAREGPT_MAX_PROMPT   1024
#define SHAREGPT_MAX_TOTAL    2048

static int sharegpt_init(struct lg_workload *w, char *err, size_t errlen)
{
    if (w->cfg.sharegpt_output_len < 0) {
        snprintf(err, errlen, "--sharegpt-output-len must be >= 0 (0: sampled)");
        return TANDEM_EINVAL;
    }
    return 0;
}

/* Lognormal with the given mean: mu = ln(mean) - sigma^2 / 2. */
static int64_t draw(struct lg_rng *r, double mean, double sigma)
{
    double v = lg_rng_lognormal(r, log(mean) - sigma * sigma / 2, sigma);
    return v > 1e9 ? 1000000000 : (int64_t)llround(v);
}

static int sharegpt_make(struct lg_workload *w, int64_t index, int warmup, struct lg_prompt *out)
{
    struct lg_rng rng;
    lg_rng_derive(&rng, lg_workload_seed(w, warmup), LG_STREAM_REQUEST, (uint64_t)index);
    int fixed = w->cfg.sharegpt_output_len;
    int64_t in, outl;
    for (;;) {
        in = draw(&rng, SHAREGPT_INPUT_MEAN, SHAREGPT_INPUT_SIGMA);
        outl = fixed > 0 ? fixed : draw(&rng, SHAREGPT_OUTPUT_MEAN, SHAREGPT_OUTPUT_SIGMA);
        if (in < SHAREGPT_MIN_LEN || in > SHAREGPT_MAX_PROMPT) {
            continue;
        }
        if (fixed > 0 || (outl >= SHAREGPT_MIN_LEN && in + outl <= SHAREGPT_MAX_TOTAL)) {
            break;
        }
    }
    out->output_len = (int32_t)outl;
    return lg_prompt_build(&w->cfg, NULL, NULL, 0, &rng, (size_t)in, out);
}

const struct lg_dataset_ops lg_dataset_sharegpt = {
    .name = "sharegpt-synth",
    .init = sharegpt_init,
    .make = sharegpt_make,
};
