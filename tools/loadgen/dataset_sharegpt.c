/* --dataset-name sharegpt-synth: ShareGPT-like lengths without the dataset.
 *
 * Input and output lengths are independent lognormals. By default their means
 * are the ShareGPT averages the vLLM paper reports (Kwon et al., SOSP 2023,
 * sec. 6.1 and Fig. 11: 161.31 input and 337.99 output tokens per request).
 * The paper gives no spread; we take sigma = 1.0 for inputs and 0.8 for
 * outputs, which puts the medians at 98 and 245 tokens with long right
 * tails, the shape of the paper's histograms. Draws are then held to vLLM's
 * ShareGPT filter (benchmarks' is_valid_sequence: prompt and output >= 4
 * tokens, prompt <= 1024, prompt + output <= 2048) by drawing again, which
 * trims the tails (the truncated means are in docs/bench.md). With
 * --sharegpt-output-len the output length is fixed and only the prompt is
 * filtered.
 *
 * --sharegpt-{input,output}-{mean,median} set another length distribution
 * from the two statistics a paper publishes: a lognormal's median is e^mu
 * and its mean e^(mu + sigma^2 / 2), so mu = ln(median) and
 * sigma = sqrt(2 ln(mean / median)) (mean >= median). A median of 0 keeps
 * the built-in sigma. --sharegpt-max-input and --sharegpt-max-total move the
 * filter (DistServe's keeps prompt + output < 2048 and caps no prompt). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tandem_err.h"
#include "workload.h"

#define SHAREGPT_INPUT_SIGMA  1.0
#define SHAREGPT_OUTPUT_SIGMA 0.8
#define SHAREGPT_MIN_LEN      4

struct sharegpt_dist {
    double mu, sigma;
};

struct sharegpt_state {
    struct sharegpt_dist in, out;
};

/* mean and median (0: default_sigma) -> (mu, sigma); 0 or TANDEM_EINVAL. */
static int dist_from_stats(const char *which, double mean, double median, double default_sigma,
                           struct sharegpt_dist *d, char *err, size_t errlen)
{
    if (!(mean > 0)) {
        snprintf(err, errlen, "--sharegpt-%s-mean must be > 0 tokens (got %g)", which, mean);
        return TANDEM_EINVAL;
    }
    if (median == 0) {
        d->sigma = default_sigma;
        d->mu = log(mean) - default_sigma * default_sigma / 2;
        return 0;
    }
    if (!(median > 0) || median > mean) {
        snprintf(err, errlen,
                 "--sharegpt-%s-median %g: a lognormal needs 0 < median <= mean (%g); give "
                 "the mean and median the source publishes, or 0 for the built-in spread",
                 which, median, mean);
        return TANDEM_EINVAL;
    }
    d->mu = log(median);
    d->sigma = sqrt(2 * log(mean / median));
    return 0;
}

static int sharegpt_init(struct lg_workload *w, char *err, size_t errlen)
{
    const struct lg_workload_config *c = &w->cfg;
    if (c->sharegpt_output_len < 0) {
        snprintf(err, errlen, "--sharegpt-output-len must be >= 0 (0: sampled)");
        return TANDEM_EINVAL;
    }
    if (c->sharegpt_max_input < SHAREGPT_MIN_LEN || c->sharegpt_max_total < 2 * SHAREGPT_MIN_LEN) {
        snprintf(err, errlen,
                 "--sharegpt-max-input %d / --sharegpt-max-total %d: need max-input >= %d and "
                 "max-total >= %d (a prompt and an output of at least %d tokens each)",
                 c->sharegpt_max_input, c->sharegpt_max_total, SHAREGPT_MIN_LEN,
                 2 * SHAREGPT_MIN_LEN, SHAREGPT_MIN_LEN);
        return TANDEM_EINVAL;
    }
    struct sharegpt_state *s = calloc(1, sizeof(*s));
    if (!s) {
        return TANDEM_ENOMEM;
    }
    int rc = dist_from_stats("input", c->sharegpt_input_mean, c->sharegpt_input_median,
                             SHAREGPT_INPUT_SIGMA, &s->in, err, errlen);
    if (rc == 0) {
        rc = dist_from_stats("output", c->sharegpt_output_mean, c->sharegpt_output_median,
                             SHAREGPT_OUTPUT_SIGMA, &s->out, err, errlen);
    }
    if (rc != 0) {
        free(s);
        return rc;
    }
    w->state = s;
    return 0;
}

static int64_t draw(struct lg_rng *r, const struct sharegpt_dist *d)
{
    double v = lg_rng_lognormal(r, d->mu, d->sigma);
    return v > 1e9 ? 1000000000 : (int64_t)llround(v);
}

static int sharegpt_make(struct lg_workload *w, int64_t index, int warmup, struct lg_prompt *out)
{
    const struct sharegpt_state *s = w->state;
    const struct lg_workload_config *c = &w->cfg;
    struct lg_rng rng;
    lg_rng_derive(&rng, lg_workload_seed(w, warmup), LG_STREAM_REQUEST, (uint64_t)index);
    int fixed = c->sharegpt_output_len;
    int64_t in, outl;
    for (;;) {
        in = draw(&rng, &s->in);
        outl = fixed > 0 ? fixed : draw(&rng, &s->out);
        if (in < SHAREGPT_MIN_LEN || in > c->sharegpt_max_input) {
            continue;
        }
        if (fixed > 0 || (outl >= SHAREGPT_MIN_LEN && in + outl <= c->sharegpt_max_total)) {
            break;
        }
    }
    out->output_len = (int32_t)outl;
    return lg_prompt_build(c, NULL, NULL, 0, &rng, (size_t)in, out);
}

static void sharegpt_fini(struct lg_workload *w)
{
    free(w->state);
    w->state = NULL;
}

const struct lg_dataset_ops lg_dataset_sharegpt = {
    .name = "sharegpt-synth",
    .init = sharegpt_init,
    .make = sharegpt_make,
    .fini = sharegpt_fini,
};
