/* Scheduler: continuous batching over the tiny transformer (a small random
 * config), the sim backend (time scale 0) and a checking fake backend.
 *
 * Every generation is compared token for token (and logprob for logprob,
 * bitwise) with a plain single-sequence loop over the backend: prefill the
 * prompt, then decode one token at a time. Randomised tests print their seed;
 * SCHED_SEED=<n> replays one. */
#include <CUnit/Basic.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "block_hash.h"
#include "kv_cache.h"
#include "sampler.h"
#include "scheduler.h"
#include "sim.h"
#include "tandem_err.h"
#include "tiny.h"

#define BS     4    /* block size: small, so chunks and blocks cross often */
#define MAXR   1024 /* request ids 0..MAXR-1 */
#define MAXT   320  /* tokens per request */
#define MAXBLK 96   /* blocks per request */

/* ---- recording callbacks ------------------------------------------------ */

struct rec {
    int submitted;
    int base; /* index of the first token expected (resume) */
    uint32_t tok[MAXT];
    float lp[MAXT];
    struct sampler_top top[MAXT][3];
    int n_top[MAXT];
    int n;
    int finished;
    enum sched_finish reason;
    int err;
    struct sched_usage usage;
    /* on_blocks_ready */
    int blocks_next;
    int block_calls;
    int last_n_valid;
    uint8_t *payload[MAXBLK]; /* shipped copies, when ship is on */
    int n_valid_at[MAXBLK];   /* n_valid when each block was reported */
    /* on_prompt_logprobs */
    int plp_next;
    float plp[MAXT];
    struct sampler_top plp_top[MAXT][2];
};

static struct rec R[MAXR];
static struct kv_pool *ship_pool; /* pool whose payloads on_blocks_ready copies */

static void rec_reset(void)
{
    for (int i = 0; i < MAXR; i++) {
        for (int b = 0; b < MAXBLK; b++) {
            free(R[i].payload[b]);
        }
    }
    memset(R, 0, sizeof(R));
    ship_pool = NULL;
}

static void cb_token(void *arg, uint64_t id, void *user, int index, uint32_t token, float logprob,
                     const struct sampler_top *top, int n_top)
{
    CU_ASSERT_FATAL(id < MAXR);
    struct rec *r = &R[id];
    CU_ASSERT_PTR_EQUAL(user, r);
    CU_ASSERT_FALSE(r->finished);
    CU_ASSERT_EQUAL(index, r->base + r->n); /* no gaps, no duplicates */
    CU_ASSERT_FATAL(r->n < MAXT);
    r->tok[r->n] = token;
    r->lp[r->n] = logprob;
    r->n_top[r->n] = n_top;
    for (int i = 0; i < n_top && i < 3; i++) {
        r->top[r->n][i] = top[i];
    }
    r->n++;
}

static void cb_finish(void *arg, uint64_t id, void *user, enum sched_finish reason, int err,
                      const struct sched_usage *u)
{
    CU_ASSERT_FATAL(id < MAXR);
    struct rec *r = &R[id];
    CU_ASSERT_FALSE(r->finished);
    r->finished = 1;
    r->reason = reason;
    r->err = err;
    r->usage = *u;
    CU_ASSERT_EQUAL(u->completion_tokens, r->base + r->n);
}

static void cb_blocks(void *arg, uint64_t id, void *user, const struct kv_seq *seq, int first,
                      int count, int n_valid)
{
    struct rec *r = &R[id];
    CU_ASSERT_EQUAL(first, r->blocks_next); /* in order, each once */
    CU_ASSERT(count >= 1);
    CU_ASSERT_EQUAL(r->n, 0); /* before the first token */
    CU_ASSERT(n_valid >= r->last_n_valid);
    CU_ASSERT((first + count - 1) * BS < n_valid);
    CU_ASSERT(n_valid <= seq->n_tokens);
    for (int b = first; b < first + count; b++) {
        CU_ASSERT_FATAL(b < MAXBLK);
        /* Full blocks only, except the very end of the prompt. */
        if ((b + 1) * BS > n_valid) {
            CU_ASSERT_EQUAL(b, first + count - 1);
        }
        r->n_valid_at[b] = n_valid;
        if (ship_pool) {
            size_t len = kv_block_bytes(ship_pool);
            r->payload[b] = malloc(len);
            memcpy(r->payload[b], kv_block_data(ship_pool, seq->blocks[b]), len);
        }
    }
    r->blocks_next = first + count;
    r->block_calls++;
    r->last_n_valid = n_valid;
}

static void cb_plp(void *arg, uint64_t id, void *user, int first, int n, const float *lp,
                   const struct sampler_top *top, int n_top)
{
    struct rec *r = &R[id];
    if (r->plp_next == 0) {
        r->plp_next = 1;
    }
    CU_ASSERT_EQUAL(first, r->plp_next);
    CU_ASSERT(n >= 1);
    for (int j = 0; j < n; j++) {
        CU_ASSERT_FATAL(first + j < MAXT);
        r->plp[first + j] = lp[j];
        for (int k = 0; k < n_top && k < 2; k++) {
            r->plp_top[first + j][k] = top[j * n_top + k];
        }
    }
    r->plp_next = first + n;
}

static const struct sched_callbacks CB = {
    .on_token = cb_token,
    .on_finish = cb_finish,
    .on_blocks_ready = cb_blocks,
    .on_prompt_logprobs = cb_plp,
};

/* ---- fixtures ------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int rng_int(uint64_t *x, int lo, int hi) /* [lo, hi] */
{
    return lo + (int)(rng_next(x) % (uint64_t)(hi - lo + 1));
}

static uint64_t test_seed(void)
{
    const char *e = getenv("SCHED_SEED");
    uint64_t seed = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL);
    return seed;
}

static struct backend *make_tiny(void)
{
    struct tiny_config c;
    tiny_default_config(&c);
    c.dim = 32;
    c.hidden_dim = 64;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.vocab_size = 64;
    c.max_context = 256;
    c.seed = 0x5eed;
    struct backend *be = NULL;
    CU_ASSERT_EQUAL_FATAL(tiny_create(&be, &c), 0);
    return be;
}

static struct kv_pool *make_pool(const struct backend *be, int n_blocks)
{
    struct kv_config kc = {
        .n_layers = be->info.n_layers,
        .n_kv_heads = be->info.n_kv_heads,
        .head_dim = be->info.head_dim,
        .block_size = BS,
        .dtype = KV_DTYPE_F32,
        .n_blocks = n_blocks,
        .payload_div = 0,
    };
    struct kv_pool *p = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&p, &kc), 0);
    return p;
}

static struct sched *make_sched(struct backend *be, struct kv_pool *pool, int max_running,
                                int budget, int chunk)
{
    struct sched_config c = {
        .max_running = max_running,
        .token_budget = budget,
        .max_prefill_chunk = chunk,
        .block_size = BS,
    };
    struct sched *s = NULL;
    CU_ASSERT_EQUAL_FATAL(sched_create(&s, &c, be, pool, &CB), 0);
    return s;
}

static void gen_prompt(uint64_t *x, uint32_t *p, int n, int vocab)
{
    for (int i = 0; i < n; i++) {
        p[i] = (uint32_t)rng_int(x, 3, vocab - 1);
    }
}

static struct sched_request greedy_req(uint64_t id, const uint32_t *prompt, int n, int max_tokens)
{
    struct sched_request r = {
        .id = id,
        .user = &R[id],
        .prompt = prompt,
        .n_prompt = n,
        .max_tokens = max_tokens,
        .sampling = sampler_params_greedy(),
        .mode = SCHED_MODE_FULL,
    };
    return r;
}

static void submit(struct sched *s, const struct sched_request *r)
{
    CU_ASSERT_EQUAL_FATAL(sched_submit(s, r), 0);
    R[r->id].submitted = 1;
    R[r->id].base = r->n_generated;
}

/* Steps until idle, checking the budget, max_running and the KV invariant
 * after every step. Returns the number of steps. */
static int drain(struct sched *s, struct kv_pool *pool, int budget, int max_running)
{
    int steps = 0;
    while (sched_busy(s)) {
        int r = sched_step(s);
        struct sched_stats st;
        sched_stats(s, &st);
        CU_ASSERT(st.last_step_tokens <= budget);
        CU_ASSERT(st.running <= max_running);
        CU_ASSERT_EQUAL(kv_check(pool), 0);
        CU_ASSERT_FATAL(r > 0); /* never stuck with work pending */
        CU_ASSERT_FATAL(++steps < 200000);
    }
    return steps;
}

static void assert_no_blocks_in_use(struct kv_pool *pool)
{
    struct kv_stats ks;
    kv_pool_stats(pool, &ks);
    CU_ASSERT_EQUAL(ks.in_use, 0);
    CU_ASSERT_EQUAL(ks.free + ks.cached_idle, ks.total);
    CU_ASSERT_EQUAL(kv_check(pool), 0);
}

/* ---- the reference: one sequence, plain loop ----------------------------- */

struct ref {
    uint32_t tok[MAXT];
    float lp[MAXT];
    int n;
    enum sched_finish reason;
};

/* Prefills the whole prompt at once, then decodes one token at a time with
 * the same stop rules as the scheduler (max_tokens, EOS, stop ids, context
 * limit max_ctx). */
static void ref_run(struct backend *be, const uint32_t *prompt, int n, int max_tokens,
                    const struct sampler_params *sp, int ignore_eos, const uint32_t *stop,
                    int n_stop, int max_ctx, struct ref *out)
{
    int vocab = be->info.vocab_size;
    struct kv_pool *pool = make_pool(be, (n + max_tokens) / BS + 2);
    struct sampler *smp = NULL;
    CU_ASSERT_EQUAL_FATAL(sampler_create(&smp, vocab), 0);
    uint32_t *hist = malloc((size_t)(n + max_tokens + 1) * sizeof(*hist));
    float *logits = malloc((size_t)vocab * sizeof(float));
    memcpy(hist, prompt, (size_t)n * sizeof(*hist));
    struct kv_seq seq;
    kv_seq_init(&seq, bh_root(be->info.name));
    CU_ASSERT_EQUAL_FATAL(kv_seq_grow(pool, &seq, n), 0);
    struct be_seq bq = {.blocks = seq.blocks, .pos = 0, .history = hist, .seed = sp->seed};
    struct be_out o = {.logits = logits};
    CU_ASSERT_EQUAL_FATAL(be->ops->prefill(be, pool, &bq, hist, n, &o, NULL), 0);
    out->n = 0;
    for (;;) {
        uint32_t t;
        float lp;
        if (be->info.emits_tokens) {
            t = o.token;
            lp = o.logprob;
        } else {
            t = sampler_sample(smp, sp, logits, (uint64_t)out->n);
            lp = sampler_logprobs(logits, vocab, t, NULL, 0);
        }
        out->tok[out->n] = t;
        out->lp[out->n] = lp;
        out->n++;
        hist[n + out->n - 1] = t;
        int stopped = !ignore_eos && be->info.eos_id >= 0 && t == (uint32_t)be->info.eos_id;
        for (int i = 0; i < n_stop; i++) {
            stopped |= t == stop[i];
        }
        if (stopped) {
            out->reason = SCHED_FINISH_STOP;
            break;
        }
        if (out->n >= max_tokens || n + out->n >= max_ctx) {
            out->reason = SCHED_FINISH_LENGTH;
            break;
        }
        int pos = n + out->n - 1;
        CU_ASSERT_EQUAL_FATAL(kv_seq_grow(pool, &seq, pos + 1), 0);
        struct be_seq dq = {.blocks = seq.blocks, .pos = pos, .history = hist, .seed = sp->seed};
        o.logits = logits;
        CU_ASSERT_EQUAL_FATAL(be->ops->decode(be, pool, 1, &dq, &o), 0);
    }
    kv_seq_release(pool, &seq);
    kv_seq_fini(&seq);
    free(logits);
    free(hist);
    sampler_destroy(smp);
    kv_pool_destroy(pool);
}

static void ref_greedy(struct backend *be, const uint32_t *prompt, int n, int max_tokens,
                       struct ref *out)
{
    struct sampler_params g = sampler_params_greedy();
    ref_run(be, prompt, n, max_tokens, &g, 0, NULL, 0, 1 << 30, out);
}

/* The recorded completion of id equals ref, tokens and logprobs bitwise. */
static void assert_matches(uint64_t id, const struct ref *ref, int from)
{
    const struct rec *r = &R[id];
    CU_ASSERT_TRUE(r->finished);
    CU_ASSERT_EQUAL(r->reason, ref->reason);
    CU_ASSERT_EQUAL(r->base + r->n, ref->n);
    int bad = 0;
    for (int i = 0; i < r->n && r->base + i < ref->n; i++) {
        bad += r->tok[i] != ref->tok[r->base + i];
        bad += memcmp(&r->lp[i], &ref->lp[r->base + i], sizeof(float)) != 0;
    }
    if (bad) {
        printf("\nrequest %" PRIu64 " (from %d): %d mismatches\n", id, from, bad);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- tests ---------------------------------------------------------------- */

static void test_submit_validation(void)
{
    rec_reset();
    struct backend *be = make_tiny();
    struct kv_pool *pool = make_pool(be, 32);
    struct sched *s = make_sched(be, pool, 4, 16, 8);
    uint32_t p[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    struct sched_request r = greedy_req(1, p, 8, 4);
    CU_ASSERT_EQUAL(sched_submit(s, &r), 0);
    CU_ASSERT_EQUAL(sched_submit(s, &r), TANDEM_EEXIST);
    CU_ASSERT_TRUE(sched_has(s, 1));
    CU_ASSERT_FALSE(sched_has(s, 2));
    r.id = 2;
    r.n_prompt = 0;
    CU_ASSERT_EQUAL(sched_submit(s, &r), TANDEM_EINVAL);
    r.n_prompt = 8;
    r.max_tokens = 0;
    CU_ASSERT_EQUAL(sched_submit(s, &r), TANDEM_EINVAL);
    r.max_tokens = 4;
    r.sampling.top_p = 0.0f;
    CU_ASSERT_EQUAL(sched_submit(s, &r), TANDEM_EINVAL);
    r.sampling = sampler_params_greedy();
    r.logprobs = SAMPLER_MAX_TOP + 1;
    CU_ASSERT_EQUAL(sched_submit(s, &r), TANDEM_EINVAL);
    r.logprobs = 0;
    r.n_stop = SCHED_MAX_STOP + 1;
    CU_ASSERT_EQUAL(sched_submit(s, &r), TANDEM_EINVAL);
    r.n_stop = 0;
    r.n_generated = 8; /* resumed tokens must leave a prompt */
    CU_ASSERT_EQUAL(sched_submit(s, &r), TANDEM_EINVAL);
    r.n_generated = 4; /* and something to generate */
    CU_ASSERT_EQUAL(sched_submit(s, &r), TANDEM_EINVAL);
    r.n_generated = 0;
    uint32_t bad[2] = {5, 64};
    r.prompt = bad;
    r.n_prompt = 2;
    CU_ASSERT_EQUAL(sched_submit(s, &r), TANDEM_EINVAL);
    r.prompt = p;
    r.n_prompt = 8;
    r.mode = SCHED_MODE_PREFILLED; /* without kv */
    CU_ASSERT_EQUAL(sched_submit(s, &r), TANDEM_EINVAL);
    r.mode = (enum sched_mode)7;
    CU_ASSERT_EQUAL(sched_submit(s, &r), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(sched_cancel(s, 99), TANDEM_ENOENT);
    CU_ASSERT_FALSE(R[2].finished);

    struct sched_config c = {
        .max_running = 1, .token_budget = 1, .max_prefill_chunk = 1, .block_size = BS + 1};
    struct sched *s2 = NULL;
    CU_ASSERT_EQUAL(sched_create(&s2, &c, be, pool, NULL), TANDEM_EINVAL);
    c.block_size = BS;
    c.token_budget = 0;
    CU_ASSERT_EQUAL(sched_create(&s2, &c, be, pool, NULL), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(sched_finish_name(SCHED_FINISH_STOP), "stop");
    CU_ASSERT_STRING_EQUAL(sched_finish_name(SCHED_FINISH_PREFILLED), "prefilled");

    /* Destroy with a live request releases its blocks. */
    sched_step(s);
    sched_destroy(s);
    assert_no_blocks_in_use(pool);
    CU_ASSERT_FALSE(R[1].finished);
    kv_pool_destroy(pool);
    be->ops->destroy(be);
}

/* Prompts used by the equivalence tests: lengths around block and chunk
 * edges, two sharing a prefix. */
#define NP 9
static const int PLEN[NP] = {1, 3, 4, 5, 16, 17, 31, 40, 36};
static uint32_t PROMPT[NP][64];

static void make_prompts(struct backend *be)
{
    uint64_t x = 1234;
    for (int i = 0; i < NP; i++) {
        gen_prompt(&x, PROMPT[i], PLEN[i], be->info.vocab_size);
    }
    memcpy(PROMPT[8], PROMPT[7], 24 * sizeof(uint32_t)); /* shares 6 blocks with 7 */
}

static void test_greedy_matches_reference(void)
{
    rec_reset();
    struct backend *be = make_tiny();
    make_prompts(be);
    const int maxt = 12;
    struct ref ref[NP];
    for (int i = 0; i < NP; i++) {
        ref_greedy(be, PROMPT[i], PLEN[i], maxt, &ref[i]);
    }
    /* (max_running, budget, chunk) */
    const int cfgs[][3] = {{1, 7, 7}, {8, 10, 5}, {3, 64, 64}, {9, 9, 1}, {9, 200, 200}};
    uint64_t id = 0;
    for (size_t c = 0; c < sizeof(cfgs) / sizeof(cfgs[0]); c++) {
        /* Alone: a fresh scheduler and pool per prompt. */
        for (int i = 0; i < NP; i++) {
            struct kv_pool *pool = make_pool(be, 64);
            struct sched *s = make_sched(be, pool, cfgs[c][0], cfgs[c][1], cfgs[c][2]);
            struct sched_request r = greedy_req(id, PROMPT[i], PLEN[i], maxt);
            submit(s, &r);
            drain(s, pool, cfgs[c][1], cfgs[c][0]);
            assert_matches(id, &ref[i], (int)c);
            CU_ASSERT_EQUAL(R[id].usage.prompt_tokens, PLEN[i]);
            CU_ASSERT_EQUAL(R[id].usage.cached_tokens, 0);
            id++;
            assert_no_blocks_in_use(pool);
            sched_destroy(s);
            kv_pool_destroy(pool);
        }
        /* Together, twice in one scheduler: the second round hits the prefix
         * cache (and the first round already shares 7's prefix with 8). */
        struct kv_pool *pool = make_pool(be, 128);
        struct sched *s = make_sched(be, pool, cfgs[c][0], cfgs[c][1], cfgs[c][2]);
        for (int round = 0; round < 2; round++) {
            uint64_t first = id;
            for (int i = 0; i < NP; i++) {
                struct sched_request r = greedy_req(id++, PROMPT[i], PLEN[i], maxt);
                submit(s, &r);
            }
            drain(s, pool, cfgs[c][1], cfgs[c][0]);
            int cached = 0;
            for (int i = 0; i < NP; i++) {
                assert_matches(first + (uint64_t)i, &ref[i], (int)c);
                cached += R[first + (uint64_t)i].usage.cached_tokens;
                /* At most every full block but the one holding the last token. */
                CU_ASSERT(R[first + (uint64_t)i].usage.cached_tokens <= (PLEN[i] - 1) / BS * BS);
            }
            if (round == 1) {
                CU_ASSERT(cached > 0);
            }
        }
        struct sched_stats st;
        sched_stats(s, &st);
        CU_ASSERT(st.prefix_cache_hits > 0);
        CU_ASSERT(st.prefix_cache_queries >= st.prefix_cache_hits);
        uint64_t gen = 0;
        for (int i = 0; i < NP; i++) {
            gen += 2 * (uint64_t)ref[i].n;
        }
        CU_ASSERT_EQUAL(st.generation_tokens, gen);
        CU_ASSERT_EQUAL(st.waiting, 0);
        CU_ASSERT_EQUAL(st.running, 0);
        assert_no_blocks_in_use(pool);
        sched_destroy(s);
        kv_pool_destroy(pool);
    }
    be->ops->destroy(be);
}

/* A pool too small for everyone at once forces preemption by recompute. */
static void test_preemption_same_tokens(void)
{
    rec_reset();
    struct backend *be = make_tiny();
    uint64_t x = 777;
    enum { N = 8, MAXTOK = 24 };
    uint32_t prompts[N][40];
    int len[N];
    struct ref greedy[N], sampled[N];
    struct sampler_params sp[N];
    for (int i = 0; i < N; i++) {
        len[i] = rng_int(&x, 10, 30);
        gen_prompt(&x, prompts[i], len[i], be->info.vocab_size);
        ref_greedy(be, prompts[i], len[i], MAXTOK, &greedy[i]);
        sp[i] = (struct sampler_params){.temperature = 0.9f,
                                        .top_k = i % 2 ? 20 : 0,
                                        .top_p = i % 3 ? 0.95f : 1.0f,
                                        .seed = 1000 + (uint64_t)i};
        ref_run(be, prompts[i], len[i], MAXTOK, &sp[i], 0, NULL, 0, 1 << 30, &sampled[i]);
    }
    /* Each sequence needs up to 54 tokens = 14 blocks; 8 of them share 24. */
    const int pools[] = {16, 24, 40};
    uint64_t id = 0;
    uint64_t total_preempt = 0;
    for (int pi = 0; pi < 3; pi++) {
        struct kv_pool *pool = make_pool(be, pools[pi]);
        struct sched *s = make_sched(be, pool, N, 24, 8);
        uint64_t first = id;
        for (int i = 0; i < N; i++) {
            struct sched_request r = greedy_req(id++, prompts[i], len[i], MAXTOK);
            submit(s, &r);
            r = greedy_req(id++, prompts[i], len[i], MAXTOK);
            r.sampling = sp[i];
            submit(s, &r);
        }
        drain(s, pool, 24, N);
        for (int i = 0; i < N; i++) {
            assert_matches(first + 2 * (uint64_t)i, &greedy[i], pools[pi]);
            assert_matches(first + 2 * (uint64_t)i + 1, &sampled[i], pools[pi]);
        }
        struct sched_stats st;
        sched_stats(s, &st);
        printf("\n  pool %d blocks: %" PRIu64 " preemptions, %" PRIu64 " steps ", pools[pi],
               st.preemptions, st.steps);
        total_preempt += st.preemptions;
        if (pi == 0) {
            CU_ASSERT(st.preemptions > 0);
        }
        assert_no_blocks_in_use(pool);
        sched_destroy(s);
        kv_pool_destroy(pool);
    }
    CU_ASSERT(total_preempt > 0);
    be->ops->destroy(be);
}

/* Random arrivals and cancels; the KV invariant after every step and every
 * cancel; nothing leaks; greedy survivors equal the reference. */
static void test_random_arrivals_cancels(void)
{
    rec_reset();
    uint64_t seed = test_seed();
    printf("\n  SCHED_SEED=%" PRIu64 " ", seed);
    uint64_t x = seed;
    struct backend *be = make_tiny();
    struct kv_pool *pool = make_pool(be, 40); /* C = 160 tokens */
    const int max_running = 6;
    struct sched_config c = {.max_running = max_running,
                             .token_budget = rng_int(&x, 4, 32),
                             .max_prefill_chunk = rng_int(&x, 1, 24),
                             .block_size = BS};
    struct sched *s = NULL;
    CU_ASSERT_EQUAL_FATAL(sched_create(&s, &c, be, pool, &CB), 0);
    CU_ASSERT_EQUAL(sched_max_context(s), 160);
    static uint32_t prompts[MAXR][200];
    static int len[MAXR], maxt[MAXR], cancelled[MAXR], samp[MAXR];
    uint32_t bases[3][64];
    for (int b = 0; b < 3; b++) {
        gen_prompt(&x, bases[b], 64, be->info.vocab_size);
    }
    int n_req = 0;
    for (int step = 0; step < 400 || sched_busy(s); step++) {
        CU_ASSERT_FATAL(step < 100000);
        if (step < 400 && rng_int(&x, 0, 9) < 3 && n_req < 300) {
            int id = n_req++;
            int kind = rng_int(&x, 0, 19);
            len[id] = kind == 0 ? rng_int(&x, 160, 199) : rng_int(&x, 1, 60);
            gen_prompt(&x, prompts[id], len[id], be->info.vocab_size);
            if (kind < 8 && len[id] <= 64) { /* shared prefixes */
                int pre = rng_int(&x, 0, len[id]);
                memcpy(prompts[id], bases[kind % 3], (size_t)pre * sizeof(uint32_t));
            }
            maxt[id] = rng_int(&x, 1, 30);
            struct sched_request r = greedy_req((uint64_t)id, prompts[id], len[id], maxt[id]);
            samp[id] = kind % 4 == 3;
            if (samp[id]) {
                r.sampling.temperature = 1.0f;
                r.sampling.seed = (uint64_t)id;
            }
            submit(s, &r);
        }
        if (n_req > 0 && rng_int(&x, 0, 9) == 0) {
            int id = rng_int(&x, 0, n_req - 1);
            int live = sched_has(s, (uint64_t)id);
            CU_ASSERT_EQUAL(sched_cancel(s, (uint64_t)id), live ? 0 : TANDEM_ENOENT);
            if (live) {
                cancelled[id] = 1;
                CU_ASSERT_TRUE(R[id].finished);
                CU_ASSERT_EQUAL(R[id].reason, SCHED_FINISH_CANCELLED);
            }
            CU_ASSERT_EQUAL_FATAL(kv_check(pool), 0);
        }
        sched_step(s);
        struct sched_stats st;
        sched_stats(s, &st);
        CU_ASSERT_FATAL(st.last_step_tokens <= c.token_budget);
        CU_ASSERT_FATAL(st.running <= max_running);
        CU_ASSERT_FATAL(kv_check(pool) == 0);
    }
    assert_no_blocks_in_use(pool);
    int checked = 0;
    for (int id = 0; id < n_req; id++) {
        CU_ASSERT_TRUE(R[id].finished);
        if (len[id] >= 160) {
            CU_ASSERT(cancelled[id] || (R[id].reason == SCHED_FINISH_ERROR &&
                                        R[id].err == TANDEM_ETOOBIG && R[id].n == 0));
            continue;
        }
        if (cancelled[id] || R[id].reason == SCHED_FINISH_CANCELLED) {
            continue;
        }
        struct ref ref;
        struct sampler_params sp = sampler_params_greedy();
        if (samp[id]) {
            sp.temperature = 1.0f;
            sp.seed = (uint64_t)id;
        }
        ref_run(be, prompts[id], len[id], maxt[id], &sp, 0, NULL, 0, 160, &ref);
        assert_matches((uint64_t)id, &ref, -1);
        checked++;
    }
    struct sched_stats st;
    sched_stats(s, &st);
    printf("%d requests, %d checked, %" PRIu64 " preemptions ", n_req, checked, st.preemptions);
    sched_destroy(s);
    kv_pool_destroy(pool);
    be->ops->destroy(be);
}

/* The prefill worker reports blocks as chunks complete; a second instance
 * (the decode worker) installs the copied payloads and continues exactly
 * like a colocated run. */
static void test_prefill_only_and_prefilled(void)
{
    rec_reset();
    struct backend *pbe = make_tiny();
    struct backend *dbe = make_tiny();
    struct kv_pool *ppool = make_pool(pbe, 64);
    struct kv_pool *dpool = make_pool(dbe, 64);
    const int chunk = 6;
    struct sched *ps = make_sched(pbe, ppool, 4, 16, chunk);
    struct sched *ds = make_sched(dbe, dpool, 4, 16, chunk);
    ship_pool = ppool;
    uint64_t x = 4242;
    enum { N = 6, MAXTOK = 16 };
    const int lens[N] = {37, 8, 1, 21, 40, 45};
    uint32_t prompts[N][48];
    for (int i = 0; i < N; i++) {
        gen_prompt(&x, prompts[i], lens[i], pbe->info.vocab_size);
    }
    memcpy(prompts[5], prompts[0], 36 * sizeof(uint32_t)); /* D already holds 9 blocks */
    struct sampler_params sp = {.temperature = 0.8f, .top_k = 0, .top_p = 0.9f, .seed = 31};
    for (int i = 0; i < N; i++) {
        int sampled = i % 2;
        struct ref ref;
        struct sampler_params g = sampler_params_greedy();
        ref_run(pbe, prompts[i], lens[i], MAXTOK, sampled ? &sp : &g, 0, NULL, 0, 1 << 30, &ref);

        uint64_t pid = 100 + (uint64_t)i, did = 200 + (uint64_t)i;
        struct sched_request r = greedy_req(pid, prompts[i], lens[i], MAXTOK);
        r.mode = SCHED_MODE_PREFILL_ONLY;
        r.logprobs = 2;
        if (sampled) {
            r.sampling = sp;
        }
        submit(ps, &r);
        /* Step by step: after each step exactly the full blocks of the
         * tokens computed so far are reported (all of them at the end).
         * P's own cache holds prompt 0's first 9 blocks for prompt 5. */
        int p_cached = i == 5 ? 36 : 0;
        int steps = 0;
        while (sched_busy(ps)) {
            sched_step(ps);
            steps++;
            int done_tok = p_cached + steps * chunk;
            done_tok = done_tok < lens[i] ? done_tok : lens[i];
            int expect = done_tok < lens[i] ? done_tok / BS : (lens[i] + BS - 1) / BS;
            CU_ASSERT_EQUAL(R[pid].blocks_next, expect);
            CU_ASSERT_FATAL(steps < 100);
        }
        CU_ASSERT_EQUAL(R[pid].reason, SCHED_FINISH_PREFILLED);
        CU_ASSERT_EQUAL(R[pid].n, 1);
        CU_ASSERT_EQUAL(R[pid].tok[0], ref.tok[0]);
        CU_ASSERT_EQUAL(memcmp(&R[pid].lp[0], &ref.lp[0], sizeof(float)), 0);
        CU_ASSERT_EQUAL(R[pid].block_calls, (lens[i] - p_cached + chunk - 1) / chunk);
        CU_ASSERT_EQUAL(R[pid].usage.cached_tokens, p_cached);
        CU_ASSERT_EQUAL(R[pid].last_n_valid, lens[i]);
        CU_ASSERT_EQUAL(R[pid].usage.completion_tokens, 1);
        assert_no_blocks_in_use(ppool);

        /* D: count its own leading blocks, reserve the rest, install the
         * missing ones from P's frames, admit. */
        struct kv_seq kv;
        kv_seq_init(&kv, bh_root(dbe->info.name));
        int have = kv_seq_match(dpool, &kv, prompts[i], lens[i]);
        CU_ASSERT_FATAL(have >= 0);
        if (i == 5) {
            CU_ASSERT_EQUAL(have, 36);
        }
        CU_ASSERT_EQUAL_FATAL(kv_seq_grow(dpool, &kv, lens[i]), 0);
        size_t len = kv_block_bytes(dpool);
        CU_ASSERT_EQUAL_FATAL(len, kv_block_bytes(ppool));
        int nb = (lens[i] + BS - 1) / BS;
        for (int b = 0; b < nb; b++) {
            if (b < have / BS) {
                /* Already held: P's bytes are the same anyway. */
                CU_ASSERT_EQUAL(memcmp(kv_block_data(dpool, kv.blocks[b]), R[pid].payload[b], len),
                                0);
                continue;
            }
            memcpy(kv_block_data(dpool, kv.blocks[b]), R[pid].payload[b], len);
        }
        r = greedy_req(did, prompts[i], lens[i], MAXTOK);
        r.mode = SCHED_MODE_PREFILLED;
        r.kv = &kv;
        r.first_token = R[pid].tok[0];
        r.first_logprob = R[pid].lp[0];
        r.first_top = R[pid].top[0];
        r.n_first_top = R[pid].n_top[0];
        CU_ASSERT_EQUAL(r.n_first_top, 2);
        if (sampled) {
            r.sampling = sp;
        }
        submit(ds, &r);
        CU_ASSERT_EQUAL(kv.n_blocks, 0); /* taken over */
        kv_seq_fini(&kv);
        drain(ds, dpool, 16, 4);
        assert_matches(did, &ref, i);
        CU_ASSERT_EQUAL(R[did].n_top[0], 2); /* P's alternatives passed through */
        CU_ASSERT_EQUAL(R[did].top[0][1].token, R[pid].top[0][1].token);
        CU_ASSERT_EQUAL(R[did].top[0][1].logprob, R[pid].top[0][1].logprob);
        CU_ASSERT_EQUAL(R[did].n_top[1], 0);
        CU_ASSERT_EQUAL(R[did].usage.cached_tokens, have);
        CU_ASSERT_EQUAL(R[did].usage.prompt_tokens, lens[i]);
        assert_no_blocks_in_use(dpool);
    }
    /* The installed blocks entered D's prefix cache: a colocated request for
     * prompt 0 now reuses them. */
    struct sched_request r = greedy_req(300, prompts[0], lens[0], 4);
    submit(ds, &r);
    drain(ds, dpool, 16, 4);
    CU_ASSERT_EQUAL(R[300].usage.cached_tokens, 36);
    sched_destroy(ps);
    sched_destroy(ds);
    kv_pool_destroy(ppool);
    kv_pool_destroy(dpool);
    pbe->ops->destroy(pbe);
    dbe->ops->destroy(dbe);
}

/* PREFILLED sequences wait for a running slot while holding their KV, and
 * one preempted by recompute still continues identically. */
static void test_prefilled_under_pressure(void)
{
    rec_reset();
    struct backend *be = make_tiny();
    struct kv_pool *pool = make_pool(be, 24);
    struct sched *s = make_sched(be, pool, 2, 8, 8);
    enum { N = 4, MAXTOK = 30 };
    uint32_t prompts[N][16];
    uint64_t x = 99;
    struct ref ref[N];
    for (int i = 0; i < N; i++) {
        gen_prompt(&x, prompts[i], 12, be->info.vocab_size);
        ref_greedy(be, prompts[i], 12, MAXTOK, &ref[i]);
    }
    /* Build each sequence's KV by prefilling on the same pool directly, as a
     * decode worker's installation would leave it. */
    float *logits = malloc((size_t)be->info.vocab_size * sizeof(float));
    for (int i = 0; i < N; i++) {
        struct kv_seq kv;
        kv_seq_init(&kv, bh_root(be->info.name));
        CU_ASSERT_EQUAL_FATAL(kv_seq_grow(pool, &kv, 12), 0);
        struct be_seq bq = {.blocks = kv.blocks, .pos = 0, .history = prompts[i], .seed = 0};
        struct be_out o = {.logits = logits};
        CU_ASSERT_EQUAL_FATAL(be->ops->prefill(be, pool, &bq, prompts[i], 12, &o, NULL), 0);
        struct sched_request r = greedy_req((uint64_t)i, prompts[i], 12, MAXTOK);
        r.mode = SCHED_MODE_PREFILLED;
        r.kv = &kv;
        r.first_token = ref[i].tok[0];
        r.first_logprob = ref[i].lp[0];
        submit(s, &r);
        kv_seq_fini(&kv);
    }
    free(logits);
    struct sched_stats st;
    sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.waiting, N);
    /* sched_admit alone: two take the free slots and emit their first token,
     * nothing is computed; the others wait for a slot. */
    CU_ASSERT_EQUAL(sched_admit(s), 2);
    sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.running, 2);
    CU_ASSERT_EQUAL(st.waiting, 2);
    CU_ASSERT_EQUAL(st.steps, 0);
    for (int i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(R[i].n, i < 2 ? 1 : 0);
    }
    CU_ASSERT_EQUAL(R[0].tok[0], ref[0].tok[0]);
    CU_ASSERT_EQUAL(sched_admit(s), 0); /* no free slot */
    sched_step(s);
    sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.running, 2);
    CU_ASSERT_EQUAL(st.waiting, 2);
    drain(s, pool, 8, 2);
    for (int i = 0; i < N; i++) {
        assert_matches((uint64_t)i, &ref[i], 0);
    }
    sched_stats(s, &st);
    printf("\n  %" PRIu64 " preemptions ", st.preemptions);
    CU_ASSERT(st.preemptions > 0);
    assert_no_blocks_in_use(pool);
    sched_destroy(s);
    kv_pool_destroy(pool);
    be->ops->destroy(be);
}

/* Recovery: prompt + tokens so far, resumed on another scheduler, continues
 * with the same tokens and indices. */
static void test_resume(void)
{
    rec_reset();
    struct backend *be = make_tiny();
    uint64_t x = 5;
    uint32_t prompt[64];
    gen_prompt(&x, prompt, 20, be->info.vocab_size);
    struct sampler_params sp = {.temperature = 1.1f, .top_k = 30, .top_p = 0.95f, .seed = 77};
    struct ref ref;
    /* EOS ignored: a sampled EOS would end the reference early. */
    ref_run(be, prompt, 20, 25, &sp, 1, NULL, 0, 1 << 30, &ref);
    CU_ASSERT_EQUAL_FATAL(ref.n, 25);
    const int cut[] = {1, 7, 24};
    for (int k = 0; k < 3; k++) {
        struct kv_pool *pool = make_pool(be, 32);
        struct sched *s = make_sched(be, pool, 4, 16, 5);
        uint32_t full[64];
        memcpy(full, prompt, 20 * sizeof(uint32_t));
        memcpy(full + 20, ref.tok, (size_t)cut[k] * sizeof(uint32_t));
        struct sched_request r = greedy_req((uint64_t)k, full, 20 + cut[k], 25);
        r.n_generated = cut[k];
        r.sampling = sp;
        r.ignore_eos = 1;
        submit(s, &r);
        drain(s, pool, 16, 4);
        assert_matches((uint64_t)k, &ref, cut[k]);
        CU_ASSERT_EQUAL(R[k].n, 25 - cut[k]);
        CU_ASSERT_EQUAL(R[k].usage.prompt_tokens, 20);
        CU_ASSERT_EQUAL(R[k].usage.completion_tokens, 25);
        sched_destroy(s);
        kv_pool_destroy(pool);
    }
    be->ops->destroy(be);
}

/* Generated and prompt logprobs against log-softmax of the reference
 * logits. */
static void test_logprobs(void)
{
    rec_reset();
    struct backend *be = make_tiny();
    int vocab = be->info.vocab_size;
    uint64_t x = 8;
    uint32_t prompt[150];
    const int n = 150; /* several prompt-logprob chunks */
    gen_prompt(&x, prompt, n, vocab);
    /* Reference: all positions in one prefill. */
    struct kv_pool *rp = make_pool(be, 64);
    struct kv_seq kv;
    kv_seq_init(&kv, bh_root(be->info.name));
    CU_ASSERT_EQUAL_FATAL(kv_seq_grow(rp, &kv, n), 0);
    float *all = malloc((size_t)n * (size_t)vocab * sizeof(float));
    float *last = malloc((size_t)vocab * sizeof(float));
    struct be_seq bq = {.blocks = kv.blocks, .pos = 0, .history = prompt, .seed = 0};
    struct be_out o = {.logits = last};
    CU_ASSERT_EQUAL_FATAL(be->ops->prefill(be, rp, &bq, prompt, n, &o, all), 0);
    kv_seq_release(rp, &kv);
    kv_seq_fini(&kv);
    CU_ASSERT_EQUAL(memcmp(last, all + (size_t)(n - 1) * vocab, (size_t)vocab * sizeof(float)), 0);
    struct ref ref;
    ref_greedy(be, prompt, n, 3, &ref);

    struct kv_pool *pool = make_pool(be, 64);
    struct sched *s = make_sched(be, pool, 4, 100, 100);
    /* Warm the cache with the same prompt: prompt logprobs must not use it. */
    struct sched_request r = greedy_req(0, prompt, n, 1);
    submit(s, &r);
    drain(s, pool, 100, 4);
    r = greedy_req(1, prompt, n, 3);
    r.logprobs = 3;
    r.prompt_logprobs = 1;
    r.prompt_top = 2;
    submit(s, &r);
    drain(s, pool, 100, 4);
    assert_matches(1, &ref, 0);
    CU_ASSERT_EQUAL(R[1].usage.cached_tokens, 0);
    CU_ASSERT_EQUAL(R[1].plp_next, n);
    int bad = 0;
    for (int t = 1; t < n; t++) {
        struct sampler_top top[2];
        float lp = sampler_logprobs(all + (size_t)(t - 1) * vocab, vocab, prompt[t], top, 2);
        bad += memcmp(&lp, &R[1].plp[t], sizeof(float)) != 0;
        bad += top[0].token != R[1].plp_top[t][0].token || top[1].token != R[1].plp_top[t][1].token;
        bad += top[0].logprob != R[1].plp_top[t][0].logprob;
    }
    CU_ASSERT_EQUAL(bad, 0);
    /* Generated tokens: 3 alternatives, the first being the greedy choice. */
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(R[1].n_top[i], 3);
        CU_ASSERT_EQUAL(R[1].top[i][0].token, R[1].tok[i]);
        CU_ASSERT_EQUAL(R[1].top[i][0].logprob, R[1].lp[i]);
        CU_ASSERT(R[1].top[i][1].logprob <= R[1].top[i][0].logprob);
        CU_ASSERT(R[1].top[i][2].logprob <= R[1].top[i][1].logprob);
    }
    struct sampler_top top[3];
    sampler_logprobs(last, vocab, 0, top, 3);
    CU_ASSERT_EQUAL(R[1].top[0][1].token, top[1].token);
    CU_ASSERT_EQUAL(R[1].top[0][2].logprob, top[2].logprob);
    free(all);
    free(last);
    sched_destroy(s);
    kv_pool_destroy(pool);
    kv_pool_destroy(rp);
    be->ops->destroy(be);
}

/* ---- a checking fake backend ---------------------------------------------- */

/* Next token = last token + 1 (mod vocab), EOS = 2. Writes token + 1 into
 * the K slot of every position it computes and checks, on every call, that
 * every earlier position of the block table holds its history: wrong block
 * tables, lost prefix blocks or stale recomputes are caught. */
struct fake {
    struct backend base;
    int bad;             /* KV mismatches seen */
    uint32_t fail_token; /* a call containing it fails (0: never) */
    int calls;
};

static int fake_check_write(struct fake *f, struct kv_pool *kv, const struct be_seq *q, int n)
{
    int bs = kv_pool_config(kv)->block_size;
    for (int p = 0; p < q->pos + n; p++) {
        float *slot =
            (float *)(kv_block_data(kv, q->blocks[p / bs]) + kv_slot_offset(kv, 0, 0, p % bs));
        if (p < q->pos) {
            if (*slot != (float)q->history[p] + 1.0f) {
                f->bad++;
            }
        } else {
            if (q->history[p] == f->fail_token && f->fail_token != 0) {
                return TANDEM_EINTERNAL;
            }
            *slot = (float)q->history[p] + 1.0f;
        }
    }
    return 0;
}

static void fake_logits(const struct fake *f, const struct be_seq *q, int n, float *logits)
{
    uint32_t next = (q->history[q->pos + n - 1] + 1) % (uint32_t)f->base.info.vocab_size;
    for (int i = 0; i < f->base.info.vocab_size; i++) {
        logits[i] = (uint32_t)i == next ? 5.0f : 0.0f;
    }
}

static int fake_prefill(struct backend *be, struct kv_pool *kv, const struct be_seq *q,
                        const uint32_t *tokens, int n, struct be_out *out, float *logits_all)
{
    struct fake *f = (struct fake *)be;
    f->calls++;
    int rc = fake_check_write(f, kv, q, n);
    if (rc == 0) {
        fake_logits(f, q, n, out->logits);
    }
    return rc;
}

static int fake_decode(struct backend *be, struct kv_pool *kv, int n, const struct be_seq *q,
                       struct be_out *out)
{
    struct fake *f = (struct fake *)be;
    f->calls++;
    for (int i = 0; i < n; i++) {
        int rc = fake_check_write(f, kv, &q[i], 1);
        if (rc != 0) {
            return rc;
        }
        fake_logits(f, &q[i], 1, out[i].logits);
    }
    return 0;
}

static void fake_destroy(struct backend *be)
{
}

static const struct backend_ops fake_ops = {
    .name = "fake",
    .destroy = fake_destroy,
    .prefill = fake_prefill,
    .decode = fake_decode,
};

static void fake_init(struct fake *f, int max_context)
{
    memset(f, 0, sizeof(*f));
    f->base.ops = &fake_ops;
    snprintf(f->base.info.name, sizeof(f->base.info.name), "fake");
    f->base.info.n_layers = 1;
    f->base.info.n_heads = 1;
    f->base.info.n_kv_heads = 1;
    f->base.info.head_dim = 1;
    f->base.info.dim = 1;
    f->base.info.vocab_size = 16;
    f->base.info.max_context = max_context;
    f->base.info.bos_id = 1;
    f->base.info.eos_id = 2;
}

static void test_stops(void)
{
    rec_reset();
    struct fake f;
    fake_init(&f, 64);
    struct kv_pool *pool = make_pool(&f.base, 40);
    struct sched *s = make_sched(&f.base, pool, 8, 16, 4);
    uint32_t p0[] = {3, 4, 5, 15, 0}; /* -> 1, 2 (EOS) */
    uint32_t p1[] = {7, 8};           /* -> 9, 10, 11, ... */
    struct sched_request r = greedy_req(0, p0, 5, 10);
    submit(s, &r);
    r = greedy_req(1, p0, 5, 10);
    r.ignore_eos = 1;
    submit(s, &r);
    uint32_t stops[] = {12, 11};
    r = greedy_req(2, p1, 2, 10);
    r.stop_ids = stops;
    r.n_stop = 2;
    submit(s, &r);
    r = greedy_req(3, p1, 2, 3);
    submit(s, &r);
    r = greedy_req(4, p1, 2, 1);
    submit(s, &r);
    drain(s, pool, 16, 8);
    CU_ASSERT_EQUAL(f.bad, 0);
    CU_ASSERT_EQUAL(R[0].reason, SCHED_FINISH_STOP);
    CU_ASSERT_EQUAL(R[0].n, 2);
    CU_ASSERT_EQUAL(R[0].tok[1], 2);
    CU_ASSERT_EQUAL(R[1].reason, SCHED_FINISH_LENGTH);
    CU_ASSERT_EQUAL(R[1].n, 10);
    for (int i = 0; i < 10; i++) {
        CU_ASSERT_EQUAL(R[1].tok[i], (uint32_t)(1 + i) % 16);
    }
    CU_ASSERT_EQUAL(R[2].reason, SCHED_FINISH_STOP);
    CU_ASSERT_EQUAL(R[2].n, 3); /* 9, 10, 11 */
    CU_ASSERT_EQUAL(R[2].tok[2], 11);
    CU_ASSERT_EQUAL(R[3].reason, SCHED_FINISH_LENGTH);
    CU_ASSERT_EQUAL(R[3].n, 3);
    CU_ASSERT_EQUAL(R[4].reason, SCHED_FINISH_LENGTH);
    CU_ASSERT_EQUAL(R[4].n, 1);
    CU_ASSERT_EQUAL(R[4].usage.prompt_tokens, 2);
    CU_ASSERT_EQUAL(R[4].usage.completion_tokens, 1);
    /* Logprob of a one-hot 5.0 among 16: 5 - log(e^5 + 15). */
    CU_ASSERT_DOUBLE_EQUAL(R[4].lp[0], 5.0 - log(exp(5.0) + 15.0), 1e-6);
    assert_no_blocks_in_use(pool);
    struct sched_stats st;
    sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.finished[SCHED_FINISH_STOP], 2);
    CU_ASSERT_EQUAL(st.finished[SCHED_FINISH_LENGTH], 3);
    CU_ASSERT_EQUAL(st.generation_tokens, 2 + 10 + 3 + 3 + 1);
    CU_ASSERT_EQUAL(st.prompt_tokens, 5 + 5 + 2 + 2 + 2);
    sched_destroy(s);
    kv_pool_destroy(pool);
}

/* Context limit and impossible prompts. */
static void test_limits_and_errors(void)
{
    rec_reset();
    struct fake f;
    fake_init(&f, 20);
    struct kv_pool *pool = make_pool(&f.base, 40);
    struct sched *s = make_sched(&f.base, pool, 8, 64, 64);
    CU_ASSERT_EQUAL(sched_max_context(s), 20);
    uint32_t p[64];
    for (int i = 0; i < 64; i++) {
        p[i] = 3 + (uint32_t)i % 10;
    }
    struct sched_request r = greedy_req(0, p, 19, 100); /* one token, then the limit */
    submit(s, &r);
    r = greedy_req(1, p, 20, 100); /* never fits */
    submit(s, &r);
    r = greedy_req(2, p, 10, 100); /* 13, 14, 15, 0, 1, 2 (EOS), ... */
    r.ignore_eos = 1;
    submit(s, &r);
    drain(s, pool, 64, 8);
    CU_ASSERT_EQUAL(R[0].reason, SCHED_FINISH_LENGTH);
    CU_ASSERT_EQUAL(R[0].n, 1);
    CU_ASSERT_EQUAL(R[1].reason, SCHED_FINISH_ERROR);
    CU_ASSERT_EQUAL(R[1].err, TANDEM_ETOOBIG);
    CU_ASSERT_EQUAL(R[1].n, 0);
    CU_ASSERT_EQUAL(R[2].reason, SCHED_FINISH_LENGTH);
    CU_ASSERT_EQUAL(R[2].n, 10);
    sched_destroy(s);
    kv_pool_destroy(pool);

    /* A prompt larger than the whole pool fails instead of looping. */
    fake_init(&f, 1000);
    pool = make_pool(&f.base, 5); /* 20 tokens */
    s = make_sched(&f.base, pool, 8, 64, 8);
    CU_ASSERT_EQUAL(sched_max_context(s), 20);
    r = greedy_req(3, p, 30, 5);
    submit(s, &r);
    r = greedy_req(4, p, 12, 100); /* fits, then runs out of pool */
    submit(s, &r);
    drain(s, pool, 64, 8);
    CU_ASSERT_EQUAL(R[3].reason, SCHED_FINISH_ERROR);
    CU_ASSERT_EQUAL(R[3].err, TANDEM_ETOOBIG);
    CU_ASSERT_EQUAL(R[4].reason, SCHED_FINISH_LENGTH);
    CU_ASSERT_EQUAL(R[4].n, 8);
    assert_no_blocks_in_use(pool);

    /* Backend failures finish the request with an error and free its KV. */
    f.fail_token = 14;
    uint32_t q1[] = {3, 4, 14, 5};
    uint32_t q2[] = {9, 10};   /* decodes 11, 12, 13, 14: fails at 14 */
    uint32_t q3[] = {3, 3, 3}; /* unaffected */
    r = greedy_req(5, q1, 4, 5);
    submit(s, &r);
    r = greedy_req(6, q2, 2, 10);
    submit(s, &r);
    r = greedy_req(7, q3, 3, 2);
    submit(s, &r);
    drain(s, pool, 64, 8);
    CU_ASSERT_EQUAL(R[5].reason, SCHED_FINISH_ERROR);
    CU_ASSERT_EQUAL(R[5].err, TANDEM_EINTERNAL);
    CU_ASSERT_EQUAL(R[6].reason, SCHED_FINISH_ERROR);
    CU_ASSERT_EQUAL(R[6].n, 4);
    CU_ASSERT_EQUAL(R[7].reason, SCHED_FINISH_LENGTH);
    CU_ASSERT_EQUAL(f.bad, 0);
    assert_no_blocks_in_use(pool);
    sched_destroy(s);
    kv_pool_destroy(pool);
}

/* Cancel while waiting, mid-prefill, decoding, and PREFILLED-ready. */
static void test_cancel_each_phase(void)
{
    rec_reset();
    struct fake f;
    fake_init(&f, 1000);
    struct kv_pool *pool = make_pool(&f.base, 64);
    struct sched *s = make_sched(&f.base, pool, 2, 8, 4);
    uint32_t p[40];
    for (int i = 0; i < 40; i++) {
        p[i] = 3 + (uint32_t)i % 12;
    }
    struct sched_request r = greedy_req(0, p, 3, 100); /* decodes at once */
    submit(s, &r);
    r = greedy_req(1, p + 5, 30, 100); /* long prefill */
    submit(s, &r);
    sched_step(s);
    r = greedy_req(2, p + 1, 10, 100); /* waits: max_running 2 */
    submit(s, &r);
    /* A PREFILLED one holding KV, waiting for a slot. */
    struct kv_seq kv;
    kv_seq_init(&kv, bh_root("fake"));
    CU_ASSERT_EQUAL_FATAL(kv_seq_grow(pool, &kv, 6), 0);
    for (int i = 0; i < 6; i++) {
        float *slot =
            (float *)(kv_block_data(pool, kv.blocks[i / BS]) + kv_slot_offset(pool, 0, 0, i % BS));
        *slot = (float)p[i] + 1.0f;
    }
    r = greedy_req(3, p, 6, 100);
    r.mode = SCHED_MODE_PREFILLED;
    r.kv = &kv;
    r.first_token = (p[5] + 1) % 16;
    submit(s, &r);
    kv_seq_fini(&kv);

    sched_step(s);
    struct sched_stats st;
    sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.running, 2);
    CU_ASSERT_EQUAL(st.waiting, 2);
    CU_ASSERT(st.prefill_tokens_queued > 0);
    CU_ASSERT(R[0].n >= 1);     /* decoding */
    CU_ASSERT_EQUAL(R[1].n, 0); /* mid-prefill */
    CU_ASSERT_EQUAL(R[3].n, 0); /* ready, not admitted */
    struct kv_stats ks;
    kv_pool_stats(pool, &ks);
    CU_ASSERT(ks.in_use > 0);
    const uint64_t order[] = {1, 2, 3, 0};
    for (int i = 0; i < 4; i++) {
        CU_ASSERT_EQUAL(sched_cancel(s, order[i]), 0);
        CU_ASSERT_TRUE(R[order[i]].finished);
        CU_ASSERT_EQUAL(R[order[i]].reason, SCHED_FINISH_CANCELLED);
        CU_ASSERT_EQUAL(kv_check(pool), 0);
        CU_ASSERT_EQUAL(sched_cancel(s, order[i]), TANDEM_ENOENT);
    }
    assert_no_blocks_in_use(pool);
    CU_ASSERT_FALSE(sched_busy(s));
    CU_ASSERT_EQUAL(sched_step(s), 0);
    sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.finished[SCHED_FINISH_CANCELLED], 4);
    CU_ASSERT_EQUAL(st.last_step_tokens, 0);
    CU_ASSERT_EQUAL(f.bad, 0);

    /* PREFILL_ONLY cancelled between chunks. */
    r = greedy_req(4, p + 7, 30, 5); /* shares no block with the above */
    r.mode = SCHED_MODE_PREFILL_ONLY;
    submit(s, &r);
    sched_step(s);
    CU_ASSERT_EQUAL(R[4].blocks_next, 1); /* 4 tokens: one block */
    CU_ASSERT_EQUAL(sched_cancel(s, 4), 0);
    assert_no_blocks_in_use(pool);
    sched_destroy(s);
    kv_pool_destroy(pool);
}

/* A PREFILLED request for prompt p[0..n) on the fake backend, its KV as
 * a decode worker's installation leaves it. */
static struct sched_request fake_prefilled(struct kv_pool *pool, struct kv_seq *kv, uint64_t id,
                                           const uint32_t *p, int n, int max_tokens)
{
    kv_seq_init(kv, bh_root("fake"));
    CU_ASSERT_EQUAL_FATAL(kv_seq_grow(pool, kv, n), 0);
    for (int i = 0; i < n; i++) {
        float *slot =
            (float *)(kv_block_data(pool, kv->blocks[i / BS]) + kv_slot_offset(pool, 0, 0, i % BS));
        *slot = (float)p[i] + 1.0f;
    }
    struct sched_request r = greedy_req(id, p, n, max_tokens);
    r.mode = SCHED_MODE_PREFILLED;
    r.kv = kv;
    r.first_token = (p[n - 1] + 1) % 16;
    return r;
}

/* Free slots go in submission order across the waiting and ready queues: a
 * request whose KV arrives after a prompt began waiting for a local prefill
 * does not take the slot before it (experiment 1b's load-aware TTFT tail).
 * A waiting head with no blocks to start does not hold the ready one up. */
static void test_ready_fcfs(void)
{
    rec_reset();
    struct fake f;
    fake_init(&f, 1000);
    uint32_t p[64];
    for (int i = 0; i < 64; i++) {
        p[i] = 3 + (uint32_t)i % 12;
    }

    /* One slot: A runs; W (local prefill) and then R (KV in hand) wait. */
    struct kv_pool *pool = make_pool(&f.base, 64);
    struct sched *s = make_sched(&f.base, pool, 1, 8, 8);
    struct sched_request r = greedy_req(0, p, 3, 4);
    submit(s, &r);
    sched_step(s);
    r = greedy_req(1, p + 20, 5, 3);
    r.ignore_eos = 1;
    submit(s, &r);
    struct kv_seq kv;
    r = fake_prefilled(pool, &kv, 2, p + 40, 6, 3);
    r.ignore_eos = 1;
    submit(s, &r);
    kv_seq_fini(&kv);
    CU_ASSERT_EQUAL(sched_admit(s), 0); /* no slot */
    int steps = 0, w_first = -1, r_first = -1, w_done = -1;
    while (sched_busy(s) && steps < 100) {
        sched_step(s);
        steps++;
        if (w_first < 0 && R[1].n > 0) {
            w_first = steps;
        }
        if (r_first < 0 && R[2].n > 0) {
            r_first = steps;
        }
        if (w_done < 0 && R[1].finished) {
            w_done = steps;
        }
    }
    printf("\n  one slot: W first token at step %d (done %d), R at step %d ", w_first, w_done,
           r_first);
    CU_ASSERT(w_first > 0 && r_first > 0);
    CU_ASSERT(w_done > 0 && w_done <= r_first); /* W had the slot first */
    CU_ASSERT_EQUAL(R[1].n, 3);
    CU_ASSERT_EQUAL(R[2].n, 3);
    assert_no_blocks_in_use(pool);
    sched_destroy(s);
    kv_pool_destroy(pool);

    /* Five blocks, two slots: A holds three, R two of its own; W, submitted
     * before R, finds none free. R starts at once instead of waiting for A. */
    rec_reset();
    pool = make_pool(&f.base, 5);
    s = make_sched(&f.base, pool, 2, 8, 8);
    r = greedy_req(0, p, 11, 2); /* 12 positions: 3 blocks, never more */
    r.ignore_eos = 1;
    submit(s, &r);
    while (R[0].n == 0) {
        CU_ASSERT_FATAL(sched_step(s) > 0);
    }
    r = greedy_req(1, p + 20, 8, 2);
    r.ignore_eos = 1;
    submit(s, &r);
    r = fake_prefilled(pool, &kv, 2, p + 40, 6, 3);
    r.ignore_eos = 1;
    submit(s, &r);
    kv_seq_fini(&kv);
    struct kv_stats ks;
    kv_pool_stats(pool, &ks);
    CU_ASSERT_EQUAL(ks.free + ks.cached_idle, 0);
    sched_step(s); /* A's last decode; W finds no block; R takes the slot */
    CU_ASSERT_EQUAL(R[0].n, 2);
    CU_ASSERT_EQUAL(R[1].n, 0);
    CU_ASSERT_EQUAL(R[2].n, 1);
    drain(s, pool, 8, 2);
    CU_ASSERT_EQUAL(R[1].n, 2);
    CU_ASSERT_EQUAL(R[2].n, 3);
    assert_no_blocks_in_use(pool);
    sched_destroy(s);
    kv_pool_destroy(pool);
}

/* Blocks held outside the scheduler (a decode worker's transfer
 * reservations) stall the queue without spinning or recounting the head's
 * prefix lookup; freeing them resumes it. */
static void test_outside_holder(void)
{
    rec_reset();
    struct fake f;
    fake_init(&f, 1000);
    struct kv_pool *pool = make_pool(&f.base, 10);
    struct sched *s = make_sched(&f.base, pool, 4, 16, 16);
    struct kv_seq hold;
    kv_seq_init(&hold, bh_root("fake"));
    CU_ASSERT_EQUAL_FATAL(kv_seq_grow(pool, &hold, 10 * BS), 0);
    uint32_t p[9] = {3, 4, 5, 6, 7, 8, 9, 10, 11};
    struct sched_request r = greedy_req(0, p, 9, 4);
    submit(s, &r);
    for (int i = 0; i < 5; i++) {
        CU_ASSERT_EQUAL(sched_step(s), 0);
    }
    struct sched_stats st;
    sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.waiting, 1);
    CU_ASSERT_EQUAL(st.running, 0);
    CU_ASSERT_EQUAL(st.prefill_tokens_queued, 9);
    CU_ASSERT_EQUAL(st.prefix_cache_queries, 2 * BS); /* one lookup of (9 - 1) / 4 blocks */
    CU_ASSERT_TRUE(sched_busy(s));
    kv_seq_release(pool, &hold);
    kv_seq_fini(&hold);
    CU_ASSERT(sched_step(s) > 0);
    drain(s, pool, 16, 4);
    CU_ASSERT_EQUAL(R[0].reason, SCHED_FINISH_LENGTH);
    CU_ASSERT_EQUAL(R[0].n, 4);
    CU_ASSERT_EQUAL(R[0].tok[3], 15);
    sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.prefix_cache_queries, 4 * BS);
    CU_ASSERT_EQUAL(f.bad, 0);
    assert_no_blocks_in_use(pool);
    sched_destroy(s);
    kv_pool_destroy(pool);
}

/* Scale: the sim backend at time scale 0 (no sleeping, no payload), many
 * requests, a pool under pressure. */
static void sim_scale(enum sched_policy policy)
{
    rec_reset();
    uint64_t seed = test_seed();
    printf("\n  SCHED_SEED=%" PRIu64 " ", seed);
    uint64_t x = seed;
    struct sim_config sc;
    sim_default_config(&sc);
    sc.time_scale = 0.0;
    struct backend *be = NULL;
    CU_ASSERT_EQUAL_FATAL(sim_create(&be, &sc), 0);
    struct kv_config kc = {
        .n_layers = be->info.n_layers,
        .n_kv_heads = be->info.n_kv_heads,
        .head_dim = be->info.head_dim,
        .block_size = 16,
        .dtype = KV_DTYPE_BF16,
        .n_blocks = 600,
        .payload_div = -1,
    };
    struct kv_pool *pool = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&pool, &kc), 0);
    struct sched_config c = {.max_running = 64,
                             .token_budget = 2048,
                             .max_prefill_chunk = 512,
                             .block_size = 16,
                             .policy = policy};
    struct sched *s = NULL;
    CU_ASSERT_EQUAL_FATAL(sched_create(&s, &c, be, pool, &CB), 0);
    enum { N = 600 };
    static uint32_t prompts[N][1200];
    static int len[N];
    uint32_t shared[256];
    for (int i = 0; i < 256; i++) {
        shared[i] = (uint32_t)rng_int(&x, 1000, 100000);
    }
    int submitted = 0;
    int steps = 0;
    clock_t t0 = clock();
    while (submitted < N || sched_busy(s)) {
        for (int k = 0; k < 8 && submitted < N; k++) {
            int id = submitted++;
            len[id] = rng_int(&x, 16, 1200);
            for (int i = 0; i < len[id]; i++) {
                prompts[id][i] =
                    i < 256 && id % 2 ? shared[i] : (uint32_t)rng_int(&x, 1000, 100000);
            }
            struct sched_request r =
                greedy_req((uint64_t)id, prompts[id], len[id], rng_int(&x, 1, 64));
            r.sampling.seed = (uint64_t)id * 7;
            submit(s, &r);
            if (id % 50 == 49) {
                sched_cancel(s, (uint64_t)id - 3);
            }
        }
        sched_step(s);
        steps++;
        struct sched_stats st;
        sched_stats(s, &st);
        CU_ASSERT_FATAL(st.last_step_tokens <= c.token_budget);
        CU_ASSERT_FATAL(st.running <= c.max_running);
        if (policy == SCHED_POLICY_PREFILL_FIRST) {
            CU_ASSERT_FATAL(st.last_step_decodes == 0 || st.last_step_prefills == 0);
        }
        if (steps % 16 == 0) {
            CU_ASSERT_FATAL(kv_check(pool) == 0);
        }
        CU_ASSERT_FATAL(steps < 1000000);
    }
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    assert_no_blocks_in_use(pool);
    struct sched_stats st;
    sched_stats(s, &st);
    printf("%d requests, %d steps, %" PRIu64 " tokens generated, %" PRIu64
           " preemptions, hits %" PRIu64 "/%" PRIu64 ", %.2f s ",
           N, steps, st.generation_tokens, st.preemptions, st.prefix_cache_hits,
           st.prefix_cache_queries, secs);
    CU_ASSERT(st.prefix_cache_hits > 0);
    /* Every token is the sim's function of (seed, context). */
    int bad = 0;
    for (int id = 0; id < N; id++) {
        CU_ASSERT_TRUE(R[id].finished);
        if (R[id].reason == SCHED_FINISH_CANCELLED) {
            continue;
        }
        CU_ASSERT_EQUAL(R[id].reason, SCHED_FINISH_LENGTH);
        uint32_t ctx[1300];
        memcpy(ctx, prompts[id], (size_t)len[id] * sizeof(uint32_t));
        for (int i = 0; i < R[id].n; i++) {
            float lp;
            uint32_t t = sim_next_token(be, (uint64_t)id * 7, ctx, len[id] + i, &lp);
            bad += t != R[id].tok[i] || lp != R[id].lp[i];
            ctx[len[id] + i] = t;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    sched_destroy(s);
    kv_pool_destroy(pool);
    be->ops->destroy(be);
}

static void test_sim_scale(void)
{
    sim_scale(SCHED_POLICY_CHUNKED);
}

/* The same load under prefill-first: never a mixed step, the same tokens
 * (each the sim's function of seed and context), preemptions included. */
static void test_prefill_first_sim_scale(void)
{
    sim_scale(SCHED_POLICY_PREFILL_FIRST);
}

/* ---- prefill-first (vLLM v0) -------------------------------------------- */

/* A backend that forwards to another and records what each step held. */
struct spy {
    struct backend base; /* first */
    struct backend *in;
    int step_prefills, step_decodes; /* of the step being accumulated */
    int steps, mixed, prefill_calls, prefill_tokens, prefill_from_zero;
    char kind[256]; /* per step: 'P' prefill only, 'D' decode only, 'M' mixed */
};

static int spy_prefill(struct backend *be, struct kv_pool *kv, const struct be_seq *seq,
                       const uint32_t *tokens, int n, struct be_out *out, float *logits_all)
{
    struct spy *y = (struct spy *)(void *)be;
    y->step_prefills++;
    y->prefill_calls++;
    y->prefill_tokens += n;
    y->prefill_from_zero += seq->pos == 0;
    return y->in->ops->prefill(y->in, kv, seq, tokens, n, out, logits_all);
}

static int spy_decode(struct backend *be, struct kv_pool *kv, int n_seqs, const struct be_seq *seqs,
                      struct be_out *out)
{
    struct spy *y = (struct spy *)(void *)be;
    y->step_decodes += n_seqs;
    return y->in->ops->decode(y->in, kv, n_seqs, seqs, out);
}

static void spy_step_end(struct backend *be)
{
    struct spy *y = (struct spy *)(void *)be;
    char k = y->step_prefills && y->step_decodes ? 'M' : y->step_prefills ? 'P' : 'D';
    y->mixed += k == 'M';
    if (y->steps < (int)sizeof(y->kind) - 1) {
        y->kind[y->steps] = k;
    }
    y->steps++;
    y->step_prefills = y->step_decodes = 0;
    if (y->in->ops->step_end) {
        y->in->ops->step_end(y->in);
    }
}

static void spy_destroy(struct backend *be)
{
    (void)be; /* the spy is the test's; its inner backend too */
}

static const struct backend_ops spy_ops = {
    .name = "spy",
    .destroy = spy_destroy,
    .prefill = spy_prefill,
    .decode = spy_decode,
    .step_end = spy_step_end,
};

static void spy_init(struct spy *y, struct backend *in)
{
    memset(y, 0, sizeof(*y));
    y->base.ops = &spy_ops;
    y->base.info = in->info;
    y->in = in;
}

static struct sched *make_sched_policy(struct backend *be, struct kv_pool *pool, int max_running,
                                       int budget, int chunk, enum sched_policy policy)
{
    struct sched_config c = {
        .max_running = max_running,
        .token_budget = budget,
        .max_prefill_chunk = chunk,
        .block_size = BS,
        .policy = policy,
    };
    struct sched *s = NULL;
    CU_ASSERT_EQUAL_FATAL(sched_create(&s, &c, be, pool, &CB), 0);
    return s;
}

/* Whole prompts, never mixed with decodes, the same tokens as the
 * reference and as the chunked policy; the policy is validated. */
static void test_prefill_first_whole(void)
{
    rec_reset();
    struct backend *be = make_tiny();
    struct spy y;
    spy_init(&y, be);
    uint64_t x = 99;
    enum { N = 10 };
    uint32_t prompts[N][40];
    int len[N], maxt[N], sum = 0;
    struct ref ref[N];
    for (int i = 0; i < N; i++) {
        len[i] = rng_int(&x, 5, 40);
        maxt[i] = 4 + i % 7;
        sum += len[i];
        gen_prompt(&x, prompts[i], len[i], be->info.vocab_size);
        ref_greedy(be, prompts[i], len[i], maxt[i], &ref[i]);
    }
    struct kv_pool *pool = make_pool(&y.base, 128);
    struct sched *s = make_sched_policy(&y.base, pool, 4, 64, 8, SCHED_POLICY_PREFILL_FIRST);
    for (int i = 0; i < N; i++) {
        struct sched_request r = greedy_req((uint64_t)i, prompts[i], len[i], maxt[i]);
        submit(s, &r);
    }
    drain(s, pool, 64, 4);
    CU_ASSERT_EQUAL(y.mixed, 0);
    CU_ASSERT_EQUAL(y.prefill_calls, N); /* one call per prompt, */
    CU_ASSERT_EQUAL(y.prefill_from_zero, N);
    CU_ASSERT_EQUAL(y.prefill_tokens, sum); /* each of it whole */
    for (int i = 0; i < N; i++) {
        assert_matches((uint64_t)i, &ref[i], 0);
        CU_ASSERT_EQUAL(R[i].usage.cached_tokens, 0);
    }
    assert_no_blocks_in_use(pool);
    sched_destroy(s);
    kv_pool_destroy(pool);

    /* The chunked policy mixes, and yields the same tokens. */
    struct spy yc;
    spy_init(&yc, be);
    pool = make_pool(&yc.base, 128);
    s = make_sched_policy(&yc.base, pool, 4, 16, 8, SCHED_POLICY_CHUNKED);
    for (int i = 0; i < N; i++) {
        struct sched_request r = greedy_req((uint64_t)(N + i), prompts[i], len[i], maxt[i]);
        r.user = &R[N + i];
        submit(s, &r);
    }
    drain(s, pool, 16, 4);
    CU_ASSERT(yc.mixed > 0);
    CU_ASSERT(yc.prefill_calls > N);
    for (int i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(R[N + i].n, R[i].n);
        CU_ASSERT_EQUAL(memcmp(R[N + i].tok, R[i].tok, (size_t)R[i].n * sizeof(uint32_t)), 0);
    }
    sched_destroy(s);

    struct sched_config bad = {.max_running = 1,
                               .token_budget = 8,
                               .max_prefill_chunk = 8,
                               .block_size = BS,
                               .policy = SCHED_POLICY_COUNT};
    CU_ASSERT_EQUAL(sched_create(&s, &bad, be, pool, &CB), TANDEM_EINVAL);
    CU_ASSERT_STRING_EQUAL(sched_policy_name(SCHED_POLICY_CHUNKED), "chunked");
    CU_ASSERT_STRING_EQUAL(sched_policy_name(SCHED_POLICY_PREFILL_FIRST), "prefill-first");
    CU_ASSERT_PTR_NULL(sched_policy_name(SCHED_POLICY_COUNT));
    /* Budgets: prefill-first's default covers the context limit. */
    int short_by = -1;
    CU_ASSERT_EQUAL(sched_budget_for(SCHED_POLICY_CHUNKED, 0, 2048, 8192, &short_by), 2048);
    CU_ASSERT_EQUAL(short_by, 0);
    CU_ASSERT_EQUAL(sched_budget_for(SCHED_POLICY_CHUNKED, 100, 2048, 8192, &short_by), 100);
    CU_ASSERT_EQUAL(sched_budget_for(SCHED_POLICY_PREFILL_FIRST, 0, 2048, 8192, &short_by), 8192);
    CU_ASSERT_EQUAL(short_by, 0);
    CU_ASSERT_EQUAL(sched_budget_for(SCHED_POLICY_PREFILL_FIRST, 0, 2048, 1024, &short_by), 2048);
    CU_ASSERT_EQUAL(sched_budget_for(SCHED_POLICY_PREFILL_FIRST, 4096, 2048, 8192, &short_by),
                    4096);
    CU_ASSERT_EQUAL(short_by, 4096);
    kv_pool_destroy(pool);
    be->ops->destroy(be);
}

/* Step by step: prompts are admitted FCFS while they fit the budget and the
 * running slots; a waiting prompt goes before the decodes; a prompt longer
 * than the budget is refused. */
static void test_prefill_first_order(void)
{
    rec_reset();
    struct backend *be = make_tiny();
    struct spy y;
    spy_init(&y, be);
    uint64_t x = 5;
    uint32_t p[5][70];
    const int len[5] = {30, 30, 30, 10, 70};
    for (int i = 0; i < 5; i++) {
        gen_prompt(&x, p[i], len[i], be->info.vocab_size);
    }
    struct kv_pool *pool = make_pool(&y.base, 128);
    struct sched *s = make_sched_policy(&y.base, pool, 3, 64, 8, SCHED_POLICY_PREFILL_FIRST);
    const int maxt[4] = {2, 20, 20, 20};
    for (int i = 0; i < 4; i++) {
        struct sched_request r = greedy_req((uint64_t)i, p[i], len[i], maxt[i]);
        submit(s, &r);
    }
    struct sched_stats st;
    /* 1: A and B (60 tokens); C's 30 do not fit in the 4 left, D may not pass C. */
    CU_ASSERT(sched_step(s) > 0);
    sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.last_step_prefills, 2);
    CU_ASSERT_EQUAL(st.last_step_decodes, 0);
    CU_ASSERT_EQUAL(st.last_step_tokens, 60);
    CU_ASSERT(R[0].n == 1 && R[1].n == 1 && R[2].n == 0);
    /* 2: C before A's and B's decodes; D waits for a slot (3 running). */
    sched_step(s);
    sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.last_step_prefills, 1);
    CU_ASSERT_EQUAL(st.last_step_decodes, 0);
    CU_ASSERT(R[0].n == 1 && R[1].n == 1 && R[2].n == 1 && R[3].n == 0);
    /* 3: nothing can start: every running sequence decodes; A is done. */
    sched_step(s);
    sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.last_step_prefills, 0);
    CU_ASSERT_EQUAL(st.last_step_decodes, 3);
    CU_ASSERT(R[0].finished && R[1].n == 2 && R[2].n == 2);
    /* 4: D takes A's slot in a prefill step; B and C wait. */
    sched_step(s);
    sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.last_step_prefills, 1);
    CU_ASSERT_EQUAL(st.last_step_decodes, 0);
    CU_ASSERT(R[1].n == 2 && R[2].n == 2 && R[3].n == 1);
    /* 5: B, C and D decode together. */
    sched_step(s);
    sched_stats(s, &st);
    CU_ASSERT_EQUAL(st.last_step_decodes, 3);
    CU_ASSERT(R[1].n == 3 && R[2].n == 3 && R[3].n == 2);
    CU_ASSERT_STRING_EQUAL(y.kind, "PPDPD");
    /* E (70 tokens) can never be prefilled in a 64-token step. */
    struct sched_request r = greedy_req(4, p[4], len[4], 4);
    submit(s, &r);
    drain(s, pool, 64, 3);
    CU_ASSERT_EQUAL(R[4].reason, SCHED_FINISH_ERROR);
    CU_ASSERT_EQUAL(R[4].err, TANDEM_ETOOBIG);
    CU_ASSERT_EQUAL(R[4].n, 0);
    CU_ASSERT_EQUAL(y.mixed, 0);
    for (int i = 1; i < 4; i++) {
        CU_ASSERT_EQUAL(R[i].reason, SCHED_FINISH_LENGTH);
        CU_ASSERT_EQUAL(R[i].n, 20);
    }
    assert_no_blocks_in_use(pool);
    sched_destroy(s);
    /* The chunked policy takes E in chunks. */
    s = make_sched_policy(be, pool, 3, 64, 8, SCHED_POLICY_CHUNKED);
    r = greedy_req(5, p[4], len[4], 4);
    submit(s, &r);
    drain(s, pool, 64, 3);
    CU_ASSERT_EQUAL(R[5].reason, SCHED_FINISH_LENGTH);
    CU_ASSERT_EQUAL(R[5].n, 4);
    sched_destroy(s);
    kv_pool_destroy(pool);
    be->ops->destroy(be);
}

/* Prompt logprobs of a whole 150-token prompt: the same bits as the
 * chunked policy's 64-token chunks. */
static void test_prefill_first_plp(void)
{
    rec_reset();
    struct backend *be = make_tiny();
    uint64_t x = 8;
    uint32_t prompt[150];
    const int n = 150;
    gen_prompt(&x, prompt, n, be->info.vocab_size);
    struct kv_pool *pool = make_pool(be, 64);
    const enum sched_policy pol[2] = {SCHED_POLICY_CHUNKED, SCHED_POLICY_PREFILL_FIRST};
    for (int k = 0; k < 2; k++) {
        struct sched *s = make_sched_policy(be, pool, 4, 200, 200, pol[k]);
        struct sched_request r = greedy_req((uint64_t)k, prompt, n, 3);
        r.prompt_logprobs = 1;
        r.prompt_top = 2;
        submit(s, &r);
        drain(s, pool, 200, 4);
        CU_ASSERT_EQUAL(R[k].plp_next, n);
        CU_ASSERT_EQUAL(R[k].n, 3);
        sched_destroy(s);
    }
    CU_ASSERT_EQUAL(memcmp(R[0].plp, R[1].plp, sizeof(R[0].plp)), 0);
    CU_ASSERT_EQUAL(memcmp(R[0].plp_top, R[1].plp_top, sizeof(R[0].plp_top)), 0);
    CU_ASSERT_EQUAL(memcmp(R[0].tok, R[1].tok, 3 * sizeof(uint32_t)), 0);
    assert_no_blocks_in_use(pool);
    kv_pool_destroy(pool);
    be->ops->destroy(be);
}

static struct kv_pool *make_sim_pool(const struct backend *be, int n_blocks)
{
    struct kv_config kc = {
        .n_layers = be->info.n_layers,
        .n_kv_heads = be->info.n_kv_heads,
        .head_dim = be->info.head_dim,
        .block_size = 16,
        .dtype = KV_DTYPE_BF16,
        .n_blocks = n_blocks,
        .payload_div = -1,
    };
    struct kv_pool *pool = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&pool, &kc), 0);
    return pool;
}

/* Prefill and decode roles on sim under prefill-first: a prefill worker
 * prefills whole prompts (every block reported in one step); a decode worker
 * admits PREFILLED sequences (no compute) in any step, beside local prompts
 * it prefills in steps of their own. */
static void test_prefill_first_pd(void)
{
    rec_reset();
    struct sim_config sc;
    sim_default_config(&sc);
    sc.time_scale = 0.0;
    struct backend *be = NULL;
    CU_ASSERT_EQUAL_FATAL(sim_create(&be, &sc), 0);
    struct kv_pool *ppool = make_sim_pool(be, 400), *dpool = make_sim_pool(be, 400);
    struct sched_config c = {.max_running = 8,
                             .token_budget = 2048,
                             .max_prefill_chunk = 256,
                             .block_size = 16,
                             .policy = SCHED_POLICY_PREFILL_FIRST};
    struct sched *ps = NULL, *ds = NULL;
    CU_ASSERT_EQUAL_FATAL(sched_create(&ps, &c, be, ppool, &CB), 0);
    CU_ASSERT_EQUAL_FATAL(sched_create(&ds, &c, be, dpool, &CB), 0);
    uint64_t x = 77;
    enum { N = 8 };
    const int len[N] = {900, 900, 300, 500, 700, 40, 1000, 64};
    static uint32_t prompts[N][1000];
    for (int i = 0; i < N; i++) {
        for (int t = 0; t < len[i]; t++) {
            prompts[i][t] = (uint32_t)rng_int(&x, 1000, 100000);
        }
        struct sched_request r = greedy_req((uint64_t)i, prompts[i], len[i], 1);
        r.mode = SCHED_MODE_PREFILL_ONLY;
        r.sampling.seed = (uint64_t)i;
        submit(ps, &r);
    }
    /* 900 + 900, then 300 + 500 + 700 + 40, then 1000 + 64. */
    const int step_tokens[3] = {1800, 1540, 1064};
    for (int k = 0; k < 3; k++) {
        sched_step(ps);
        struct sched_stats st;
        sched_stats(ps, &st);
        CU_ASSERT_EQUAL(st.last_step_tokens, step_tokens[k]);
        CU_ASSERT_EQUAL(st.last_step_decodes, 0);
    }
    CU_ASSERT_FALSE(sched_busy(ps));
    for (int i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(R[i].reason, SCHED_FINISH_PREFILLED);
        CU_ASSERT_EQUAL(R[i].block_calls, 1);
        CU_ASSERT_EQUAL(R[i].blocks_next, (len[i] + 15) / 16);
        CU_ASSERT_EQUAL(R[i].tok[0], sim_next_token(be, (uint64_t)i, prompts[i], len[i], NULL));
    }
    /* D: the odd ones arrive prefilled, the even ones are prefilled here. */
    for (int i = 0; i < N; i++) {
        uint64_t id = 100 + (uint64_t)i;
        struct sched_request r = greedy_req(id, prompts[i], len[i], 20);
        r.sampling.seed = (uint64_t)i;
        struct kv_seq kv;
        kv_seq_init(&kv, bh_root(be->info.name));
        if (i % 2) {
            CU_ASSERT_EQUAL_FATAL(kv_seq_grow(dpool, &kv, len[i]), 0);
            r.mode = SCHED_MODE_PREFILLED;
            r.kv = &kv;
            r.first_token = R[i].tok[0];
            r.first_logprob = R[i].lp[0];
        }
        submit(ds, &r);
        kv_seq_fini(&kv);
        if (i == 3) {
            sched_step(ds); /* some arrive while others run */
        }
    }
    int steps = 0;
    while (sched_busy(ds)) {
        CU_ASSERT_FATAL(sched_step(ds) > 0);
        struct sched_stats st;
        sched_stats(ds, &st);
        CU_ASSERT(st.last_step_decodes == 0 || st.last_step_prefills == 0);
        CU_ASSERT_FATAL(++steps < 1000);
    }
    for (int i = 0; i < N; i++) {
        uint64_t id = 100 + (uint64_t)i;
        CU_ASSERT_EQUAL(R[id].reason, SCHED_FINISH_LENGTH);
        CU_ASSERT_EQUAL_FATAL(R[id].n, 20);
        uint32_t ctx[1020];
        memcpy(ctx, prompts[i], (size_t)len[i] * sizeof(uint32_t));
        int bad = 0;
        for (int t = 0; t < 20; t++) {
            uint32_t want = sim_next_token(be, (uint64_t)i, ctx, len[i] + t, NULL);
            bad += want != R[id].tok[t];
            ctx[len[i] + t] = want;
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
    assert_no_blocks_in_use(dpool);
    sched_destroy(ps);
    sched_destroy(ds);
    kv_pool_destroy(ppool);
    kv_pool_destroy(dpool);
    be->ops->destroy(be);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite su = CU_add_suite("sched", NULL, NULL);
    CU_add_test(su, "submit_validation", test_submit_validation);
    CU_add_test(su, "greedy_matches_reference", test_greedy_matches_reference);
    CU_add_test(su, "preemption_same_tokens", test_preemption_same_tokens);
    CU_add_test(su, "random_arrivals_cancels", test_random_arrivals_cancels);
    CU_add_test(su, "prefill_only_and_prefilled", test_prefill_only_and_prefilled);
    CU_add_test(su, "prefilled_under_pressure", test_prefilled_under_pressure);
    CU_add_test(su, "resume", test_resume);
    CU_add_test(su, "logprobs", test_logprobs);
    CU_add_test(su, "stops", test_stops);
    CU_add_test(su, "limits_and_errors", test_limits_and_errors);
    CU_add_test(su, "cancel_each_phase", test_cancel_each_phase);
    CU_add_test(su, "ready_fcfs", test_ready_fcfs);
    CU_add_test(su, "outside_holder", test_outside_holder);
    CU_add_test(su, "sim_scale", test_sim_scale);
    CU_add_test(su, "prefill_first_whole", test_prefill_first_whole);
    CU_add_test(su, "prefill_first_order", test_prefill_first_order);
    CU_add_test(su, "prefill_first_plp", test_prefill_first_plp);
    CU_add_test(su, "prefill_first_pd", test_prefill_first_pd);
    CU_add_test(su, "prefill_first_sim_scale", test_prefill_first_sim_scale);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    rec_reset();
    return failed ? 1 : 0;
}
