/* The single-process reference engine of the integration tests (see
 * harness.h, h_reference). Kept apart from harness.c so the process harness
 * does not depend on the engine. */
#include "harness.h"

#include "scheduler.h"
#include "tandem_err.h"
#include "tiny.h"

struct ref_ctx {
    uint32_t *out;
    int max_tokens;
    int done;
};

static void ref_token(void *arg, uint64_t id, void *user, int index, uint32_t token, float lp,
                      const struct sampler_top *top, int n_top)
{
    struct ref_ctx *c = arg;
    (void)user;
    (void)lp;
    (void)top;
    (void)n_top;
    if (index < c->max_tokens) {
        c->out[(id - 1) * (uint64_t)c->max_tokens + (uint64_t)index] = token;
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

int h_reference(const uint32_t *const *prompts, const int *lens, int n, int max_tokens,
                uint32_t *out)
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
    struct kv_config kc = {
        .n_layers = be->info.n_layers,
        .n_kv_heads = be->info.n_kv_heads,
        .head_dim = be->info.head_dim,
        .block_size = 16,
        .dtype = KV_DTYPE_F32,
        .n_blocks = 2048,
        .payload_div = 1,
    };
    struct ref_ctx c = {.out = out, .max_tokens = max_tokens};
    struct sched_callbacks cb = {.arg = &c, .on_token = ref_token, .on_finish = ref_finish};
    struct sched_config sc = {
        .max_running = 8, .token_budget = 512, .max_prefill_chunk = 512, .block_size = 16};
    rc = kv_pool_create(&pool, &kc);
    if (rc == 0) {
        rc = sched_create(&s, &sc, be, pool, &cb);
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        struct sched_request r = {
            .id = (uint64_t)i + 1,
            .prompt = prompts[i],
            .n_prompt = lens[i],
            .max_tokens = max_tokens,
            .ignore_eos = 1,
            .sampling = sampler_params_greedy(),
            .mode = SCHED_MODE_FULL,
        };
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
