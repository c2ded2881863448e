/* The single-process reference engine of the integration tests (see
 * harness.h, h_reference_run). Kept apart from harness.c so the process harness
 * does not depend on the engine. */
#include "harness.h"

#include <stdlib.h>

#include "scheduler.h"
#include "tandem_err.h"
#include "tiny.h"

struct ref_ctx {
    struct h_ref_req *reqs;
    int done;
};

static void ref_token(void *arg, uint64_t id, void *user, int index, uint32_t token, float lp,
                      const struct sampler_top *top, int n_top)
{
    struct ref_ctx *c = arg;
    struct h_ref_req *q = &c->reqs[id - 1];
    (void)user;
    (void)top;
    (void)n_top;
    if (index < q->max_tokens) {
        q->ids[index] = token;
        if (q->lps != NULL) {
            q->lps[index] = lp;
        }
    }
}

static void ref_prompt_logprobs(void *arg, uint64_t id, void *user, int first, int n,
                                const float *logprob, const struct sampler_top *top, int n_top)
{
    struct ref_ctx *c = arg;
    struct h_ref_req *q = &c->reqs[id - 1];
    (void)user;
    for (int j = 0; j < n && first + j - 1 < q->n_prompt - 1; j++) {
        int i = first + j - 1;
        q->plp[i] = logprob[j];
        for (int k = 0; q->plp_top != NULL && k < n_top && k < (int)CTL_MAX_TOP; k++) {
            q->plp_top[(size_t)i * CTL_MAX_TOP + k] = (struct ctl_top){
                .token = top[j * n_top + k].token, .logprob = top[j * n_top + k].logprob};
        }
    }
}

static void ref_finish(void *arg, uint64_t id, void *user, enum sched_finish reason, int err,
                       const struct sched_usage *usage)
{
    struct ref_ctx *c = arg;
    (void)id;
    (void)user;
    (void)reason;
    (void)err;
    (void)usage;
    c->done++;
}

int h_reference_run(struct h_ref_req *reqs, int n)
{
    struct tiny_config tc;
    tiny_default_config(&tc);
    struct backend *be = NULL;
    struct kv_pool *pool = NULL;
    struct sched *s = NULL;
    int rc = tiny_create(&be, &tc);
    if (rc != 0) {
        return rc;
    }
    /* Room for every sequence at once, so none is ever preempted. */
    int n_blocks = 1;
    for (int i = 0; i < n; i++) {
        n_blocks += (reqs[i].n_prompt + reqs[i].max_tokens + 15) / 16;
    }
    struct kv_config kc = {
        .n_layers = be->info.n_layers,
        .n_kv_heads = be->info.n_kv_heads,
        .head_dim = be->info.head_dim,
        .block_size = 16,
        .dtype = KV_DTYPE_F32,
        .n_blocks = n_blocks,
        .payload_div = 1,
    };
    struct ref_ctx c = {.reqs = reqs};
    struct sched_callbacks cb = {.arg = &c,
                                 .on_token = ref_token,
                                 .on_finish = ref_finish,
                                 .on_prompt_logprobs = ref_prompt_logprobs};
    struct sched_config sc = {
        .max_running = 16, .token_budget = 512, .max_prefill_chunk = 512, .block_size = 16};
    rc = kv_pool_create(&pool, &kc);
    if (rc == 0) {
        rc = sched_create(&s, &sc, be, pool, &cb);
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        const struct h_ref_req *q = &reqs[i];
        struct sched_request r = {
            .id = (uint64_t)i + 1,
            .prompt = q->prompt,
            .n_prompt = q->n_prompt,
            .max_tokens = q->max_tokens,
            .ignore_eos = 1,
            .sampling = sampler_params_greedy(),
            .mode = SCHED_MODE_FULL,
        };
        if (q->plp != NULL) {
            r.prompt_logprobs = 1;
            r.prompt_top = q->prompt_top;
        }
        if (q->temperature > 0) {
            r.sampling.temperature = q->temperature;
            r.sampling.top_p = q->top_p;
            r.sampling.seed = q->seed;
        }
        rc = sched_submit(s, &r);
    }
    while (rc == 0 && c.done < n) {
        if (sched_step(s) == 0 && c.done < n) {
            rc = TANDEM_EINTERNAL;
        }
    }
    sched_destroy(s);
    kv_pool_destroy(pool);
    be->ops->destroy(be);
    return rc;
}

int h_reference(const uint32_t *const *prompts, const int *lens, int n, int max_tokens,
                uint32_t *out)
{
    struct h_ref_req *reqs = calloc((size_t)n, sizeof(*reqs));
    if (reqs == NULL) {
        return TANDEM_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        reqs[i] = (struct h_ref_req){.prompt = prompts[i],
                                     .n_prompt = lens[i],
                                     .max_tokens = max_tokens,
                                     .ids = out + (size_t)i * max_tokens};
    }
    int rc = h_reference_run(reqs, n);
    free(reqs);
    return rc;
}
