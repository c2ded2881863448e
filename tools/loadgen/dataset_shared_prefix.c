/* --dataset-name shared-prefix: SGLang's generated-shared-prefix workload.
 * num_groups system prompts of system_prompt_len tokens; each group has
 * prompts_per_group questions of question_len tokens; a prompt is its group's
 * system prompt followed by its question (for chat: a system message and a
 * user message). The groups x prompts_per_group slots are visited in a seeded
 * random order, so groups interleave as they would with real users; request
 * i uses slot perm[i mod slots] and, past the first round, a new question. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"
#include "workload.h"

struct gsp_state {
    char *prefix[2]; /* (num_groups, system_prompt_len) text; [1] for warm-ups */
    int32_t *prefix_ids[2];
    int64_t *perm; /* (num_groups x prompts_per_group) slot order */
    int64_t slots;
};

static int gsp_init(struct lg_workload *w, char *err, size_t errlen)
{
    const struct lg_workload_config *c = &w->cfg;
    if (c->gsp_num_groups < 1 || c->gsp_prompts_per_group < 1 || c->gsp_system_prompt_len < 0 ||
        c->gsp_question_len < 0 || c->gsp_system_prompt_len + c->gsp_question_len < 1 ||
        c->gsp_output_len < 1) {
        snprintf(err, errlen,
                 "--gsp-num-groups, --gsp-prompts-per-group and --gsp-output-len "
                 "must be >= 1 and a prompt must not be empty");
        return TANDEM_EINVAL;
    }
    struct gsp_state *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return TANDEM_ENOMEM;
    }
    w->state = s;
    size_t g = (size_t)c->gsp_num_groups, len = (size_t)c->gsp_system_prompt_len;
    for (int k = 0; k < 2 && len > 0; k++) {
        if (c->token_ids) {
            s->prefix_ids[k] = malloc(g * len * sizeof(int32_t));
        } else {
            s->prefix[k] = malloc(g * len);
        }
        if (s->prefix[k] == NULL && s->prefix_ids[k] == NULL) {
            return TANDEM_ENOMEM;
        }
        for (size_t i = 0; i < g; i++) {
            struct lg_rng rng;
            lg_rng_derive(&rng, lg_workload_seed(w, k), LG_STREAM_GROUP, i);
            if (c->token_ids) {
                lg_ids_fill(&rng, s->prefix_ids[k] + i * len, len, c->id_lo, c->id_hi);
            } else {
                lg_text_fill(&rng, s->prefix[k] + i * len, len);
            }
        }
    }
    s->slots = (int64_t)g * c->gsp_prompts_per_group;
    s->perm = malloc((size_t)s->slots * sizeof(int64_t));
    if (s->perm == NULL) {
        return TANDEM_ENOMEM;
    }
    for (int64_t i = 0; i < s->slots; i++) {
        s->perm[i] = i;
    }
    struct lg_rng rng;
    lg_rng_derive(&rng, c->seed, LG_STREAM_SHUFFLE, 0);
    for (int64_t i = s->slots - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t j = lg_rng_range(&rng, 0, i);
        int64_t t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
    return 0;
}

static int gsp_make(struct lg_workload *w, int64_t index, int warmup, struct lg_prompt *out)
{
    struct gsp_state *s = w->state;
    const struct lg_workload_config *c = &w->cfg;
    int64_t group = s->perm[index % s->slots] / c->gsp_prompts_per_group;
    size_t len = (size_t)c->gsp_system_prompt_len;
    int k = warmup ? 1 : 0;
    struct lg_rng rng;
    lg_rng_derive(&rng, lg_workload_seed(w, warmup), LG_STREAM_REQUEST, (uint64_t)index);
    out->output_len = c->gsp_output_len;
    out->session = (int32_t)group; /* the group, for the records */
    return lg_prompt_build(c, s->prefix[k] ? s->prefix[k] + (size_t)group * len : NULL,
                           s->prefix_ids[k] ? s->prefix_ids[k] + (size_t)group * len : NULL, len,
                           &rng, (size_t)c->gsp_question_len, out);
}

static void gsp_fini(struct lg_workload *w)
{
    struct gsp_state *s = w->state;
    if (s != NULL) {
        for (int k = 0; k < 2; k++) {
            free(s->prefix[k]);
            free(s->prefix_ids[k]);
        }
        free(s->perm);
        free(s);
    }
}

const struct lg_dataset_ops lg_dataset_shared_prefix = {
    .name = "shared-prefix",
    .init = gsp_init,
    .make = gsp_make,
    .fini = gsp_fini,
};
