/* --dataset-name random: vLLM's random dataset. Input and output lengths are
 * uniform integers in [floor(L(1 - r)), ceil(L(1 + r))] (output at least 1),
 * after a prefix of --random-prefix-len tokens shared by every request. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"
#include "workload.h"

struct random_state {
    char *prefix[2]; /* text prefix: [0] measured run, [1] warm-ups */
    int32_t *prefix_ids[2];
    int64_t in_lo, in_hi, out_lo, out_hi;
};

static int random_init(struct lg_workload *w, char *err, size_t errlen)
{
    const struct lg_workload_config *c = &w->cfg;
    if (!(c->random_range_ratio >= 0 && c->random_range_ratio < 1)) {
        snprintf(err, errlen, "--random-range-ratio must be in [0, 1)");
        return TANDEM_EINVAL;
    }
    if (c->random_input_len < 0 || c->random_output_len < 1 || c->random_prefix_len < 0) {
        snprintf(err, errlen,
                 "--random-input-len >= 0, --random-output-len >= 1 and "
                 "--random-prefix-len >= 0 are required");
        return TANDEM_EINVAL;
    }
    struct random_state *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return TANDEM_ENOMEM;
    }
    double r = c->random_range_ratio;
    s->in_lo = (int64_t)floor(c->random_input_len * (1 - r));
    s->in_hi = (int64_t)ceil(c->random_input_len * (1 + r));
    s->out_lo = (int64_t)floor(c->random_output_len * (1 - r));
    s->out_hi = (int64_t)ceil(c->random_output_len * (1 + r));
    if (s->out_lo < 1) {
        s->out_lo = 1;
    }
    w->state = s;
    if (c->random_prefix_len + s->in_lo < 1) {
        snprintf(err, errlen, "--random-input-len is too small: prompts could be empty");
        return TANDEM_EINVAL;
    }
    size_t n = (size_t)c->random_prefix_len;
    for (int k = 0; k < 2 && n > 0; k++) {
        struct lg_rng rng;
        lg_rng_derive(&rng, lg_workload_seed(w, k), LG_STREAM_GROUP, 0);
        if (c->token_ids) {
            s->prefix_ids[k] = malloc(n * sizeof(int32_t));
            if (s->prefix_ids[k] == NULL) {
                return TANDEM_ENOMEM;
            }
            lg_ids_fill(&rng, s->prefix_ids[k], n, c->id_lo, c->id_hi);
        } else {
            s->prefix[k] = malloc(n);
            if (s->prefix[k] == NULL) {
                return TANDEM_ENOMEM;
            }
            lg_text_fill(&rng, s->prefix[k], n);
        }
    }
    return 0;
}

static int random_make(struct lg_workload *w, int64_t index, int warmup, struct lg_prompt *out)
{
    struct random_state *s = w->state;
    struct lg_rng rng;
    lg_rng_derive(&rng, lg_workload_seed(w, warmup), LG_STREAM_REQUEST, (uint64_t)index);
    int64_t in = lg_rng_range(&rng, s->in_lo, s->in_hi);
    out->output_len = (int32_t)lg_rng_range(&rng, s->out_lo, s->out_hi);
    int k = warmup ? 1 : 0;
    return lg_prompt_build(&w->cfg, s->prefix[k], s->prefix_ids[k],
                           (size_t)w->cfg.random_prefix_len, &rng, (size_t)in, out);
}

static void random_fini(struct lg_workload *w)
{
    struct random_state *s = w->state;
    if (s != NULL) {
        for (int k = 0; k < 2; k++) {
            free(s->prefix[k]);
            free(s->prefix_ids[k]);
        }
        free(s);
    }
}

const struct lg_dataset_ops lg_dataset_random = {
    .name = "random",
    .init = random_init,
    .make = random_make,
    .fini = random_fini,
};
