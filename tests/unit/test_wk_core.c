/* The worker core (worker/wk_core.h) with a fake host: no sockets, no loop,
 * the sim backend at time scale 0. A colocated core runs a job to Finish;
 * then a decode core and a prefill core run the same job disaggregated, the
 * fake host carrying PrefillJob, KV frames and PrefillDone between them, and
 * the tokens must be the colocated run's. Also the heartbeat, the
 * prefix-cache snapshot a new router gets, the transfer timeout in the
 * host's clock and a link that goes down; and the colocated and
 * disaggregated runs again under --scheduler prefill-first, with its budget
 * default. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "decode.h"
#include "prefill.h"
#include "tandem_err.h"
#include "wire.h"
#include "wk_core.h"

enum {
    MAX_CTL = 256,
    MAX_LINKS = 4,
    MAX_FRAMES = 1024,
    N_PROMPT = 40, /* two full blocks of 16 and a partial one */
    MAX_TOKENS = 8,
    JOB_ID = 7,
};

/* A host: the core, what it sent the router (copies) and its links. */
struct fake {
    struct wk_core core;
    Tandem__Envelope *ctl[MAX_CTL];
    int n_ctl;
    struct wk_link links[MAX_LINKS];
    char addrs[MAX_LINKS][64];
    int refs[MAX_LINKS];
    int n_links;
    int kicks;
};

/* The data links of every fake: frames in flight, FIFO, to a data address. */
struct frame {
    char to[64];
    uint8_t *buf;
    size_t len;
};
static struct frame net[MAX_FRAMES];
static int net_head, net_n;
static struct fake *hosts[4];
static int n_hosts;
static double clock_s; /* the fakes' clock: 1 ms per step */
static int kv_frames_carried;

static int fake_send_control(void *host, const Tandem__Envelope *env)
{
    struct fake *f = host;
    size_t cap = 1 << 20, len = 0;
    uint8_t *buf = malloc(cap);
    CU_ASSERT_FATAL(buf != NULL);
    CU_ASSERT_EQUAL_FATAL(wire_pack(env, buf, cap, &len), 0);
    CU_ASSERT_FATAL(f->n_ctl < MAX_CTL);
    CU_ASSERT_EQUAL_FATAL(wire_unpack(buf, len, &f->ctl[f->n_ctl]), 0);
    f->n_ctl++;
    free(buf);
    return 0;
}

static int fake_link_get(void *host, const char *addr, struct wk_link **out)
{
    struct fake *f = host;
    for (int i = 0; i < f->n_links; i++) {
        if (strcmp(f->addrs[i], addr) == 0) {
            *out = &f->links[i];
            return 0;
        }
    }
    if (f->n_links == MAX_LINKS) {
        return TANDEM_ETOOBIG;
    }
    int i = f->n_links++;
    snprintf(f->addrs[i], sizeof(f->addrs[i]), "%s", addr);
    /* Connected at once: nothing here goes down. */
    f->links[i] = (struct wk_link){.addr = f->addrs[i], .up = 1, .ever_up = 1};
    *out = &f->links[i];
    return 0;
}

static void fake_link_ref(void *host, struct wk_link *l)
{
    struct fake *f = host;
    f->refs[l - f->links]++;
}

static void fake_link_unref(void *host, struct wk_link *l)
{
    struct fake *f = host;
    f->refs[l - f->links]--;
}

static int fake_link_send(void *host, struct wk_link *l, const Tandem__Envelope *env,
                          const void *payload, size_t len, uint64_t model_bytes)
{
    (void)host;
    (void)model_bytes;
    size_t size = 0;
    CU_ASSERT_EQUAL_FATAL(wire_frame_size(env, len, &size), 0);
    uint8_t *buf = malloc(size);
    CU_ASSERT_FATAL(buf != NULL);
    size_t n = 0;
    CU_ASSERT_EQUAL_FATAL(wire_frame_pack(env, payload, len, buf, size, &n), 0);
    CU_ASSERT_FATAL(net_n < MAX_FRAMES);
    struct frame *fr = &net[(net_head + net_n) % MAX_FRAMES];
    snprintf(fr->to, sizeof(fr->to), "%s", l->addr);
    fr->buf = buf;
    fr->len = n;
    net_n++;
    if (env->kind == TANDEM__ENVELOPE__KIND__KV_FRAME) {
        kv_frames_carried++;
    }
    return 0;
}

static double fake_now(void *host)
{
    (void)host;
    return clock_s;
}

static uint64_t fake_unix_ms(void *host)
{
    (void)host;
    return 1700000000000u + (uint64_t)(clock_s * 1000.0);
}

static void fake_kick(void *host)
{
    struct fake *f = host;
    f->kicks++;
}

static const struct wk_host_ops fake_ops = {
    .send_control = fake_send_control,
    .link_get = fake_link_get,
    .link_ref = fake_link_ref,
    .link_unref = fake_link_unref,
    .link_send = fake_link_send,
    .now = fake_now,
    .unix_ms = fake_unix_ms,
    .kick = fake_kick,
};

/* Settings the next fake_init applies (test_prefill_first). */
static struct {
    int scheduler;    /* enum sched_policy */
    int kv_blocks;    /* 0: 64 */
    int token_budget; /* 0: the backend's default */
    int hold;         /* submit: DecodeJob.hold_tokens */
} tweak;

static void fake_init(struct fake *f, const struct worker_role *role, const char *id,
                      const char *kv_addr)
{
    memset(f, 0, sizeof(*f));
    struct worker_config cfg;
    wk_config_defaults(&cfg);
    const struct backend_desc *sim = backend_find("sim");
    CU_ASSERT_PTR_NOT_NULL_FATAL(sim);
    for (size_t i = 0; backend_at(i) != NULL; i++) {
        if (backend_at(i) == sim) {
            cfg.backend = (int)i;
        }
    }
    cfg.time_scale = 0; /* no sleeping */
    cfg.kv_blocks = tweak.kv_blocks > 0 ? tweak.kv_blocks : 64;
    cfg.scheduler = tweak.scheduler;
    cfg.token_budget = tweak.token_budget;
    cfg.seed = 1234;
    char err[512] = "";
    int rc = wk_core_init(&f->core, &cfg, role, &fake_ops, f, id, kv_addr, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "wk_core_init: %s\n", err);
    }
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_STRING_EQUAL(f->core.kv_addr, kv_addr);
    wk_core_set_router(&f->core, WK_ROUTER_READY);
    hosts[n_hosts++] = f;
}

static void fake_fini(struct fake *f)
{
    wk_core_fini(&f->core);
    for (int i = 0; i < f->n_ctl; i++) {
        wire_free(f->ctl[i]);
    }
    f->n_ctl = 0;
}

static void reset_net(void)
{
    CU_ASSERT_EQUAL(net_n, 0);
    net_head = net_n = 0;
    n_hosts = 0;
    kv_frames_carried = 0;
}

/* Delivers every frame in flight (and those it causes), in order. */
static void deliver(void)
{
    while (net_n > 0) {
        struct frame fr = net[net_head];
        net_head = (net_head + 1) % MAX_FRAMES;
        net_n--;
        struct fake *dst = NULL;
        for (int i = 0; i < n_hosts; i++) {
            if (strcmp(hosts[i]->core.kv_addr, fr.to) == 0) {
                dst = hosts[i];
            }
        }
        CU_ASSERT_PTR_NOT_NULL_FATAL(dst);
        struct wire_frame wf;
        CU_ASSERT_EQUAL_FATAL(wire_frame_unpack(fr.buf, fr.len, &wf), 0);
        wk_core_on_data(&dst->core, &wf);
        wire_frame_fini(&wf);
        free(fr.buf);
    }
}

/* Steps every busy core and carries the data links until all are idle. */
static void run(void)
{
    for (int round = 0; round < 10000; round++) {
        deliver();
        int busy = 0;
        for (int i = 0; i < n_hosts; i++) {
            if (wk_core_busy(&hosts[i]->core)) {
                busy = 1;
                wk_core_step(&hosts[i]->core);
                wk_core_flush_events(&hosts[i]->core);
            }
        }
        clock_s += 0.001;
        if (!busy && net_n == 0) {
            return;
        }
    }
    CU_FAIL("the cores did not go idle");
}

/* Sends JOB_ID with a prompt of n tokens (n <= 4096). */
static void submit_n(struct fake *f, const char *prefill_address, int n)
{
    static uint32_t prompt[4096];
    for (int i = 0; i < n; i++) {
        prompt[i] = (uint32_t)(1000 + 37 * i);
    }
    Tandem__SamplingParams sp = TANDEM__SAMPLING_PARAMS__INIT;
    sp.temperature = 1.0f;
    sp.top_p = 1.0f;
    sp.ignore_eos = 1;
    Tandem__DecodeJob dj = TANDEM__DECODE_JOB__INIT;
    dj.n_prompt_token_ids = (size_t)n;
    dj.prompt_token_ids = prompt;
    dj.max_tokens = MAX_TOKENS;
    dj.sampling = &sp;
    dj.prefill_address = (char *)prefill_address;
    dj.hold_tokens = tweak.hold;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__DECODE_JOB, JOB_ID, &dj);
    wk_core_on_control(&f->core, &env);
}

static void submit(struct fake *f, const char *prefill_address)
{
    submit_n(f, prefill_address, N_PROMPT);
}

/* The tokens the router got for JOB_ID, in order; the Finish it got. */
static int tokens_of(const struct fake *f, uint32_t *out, const Tandem__Finish **fin)
{
    int n = 0;
    *fin = NULL;
    for (int i = 0; i < f->n_ctl; i++) {
        const Tandem__Envelope *e = f->ctl[i];
        if (e->request_id != JOB_ID) {
            continue;
        }
        if (e->kind == TANDEM__ENVELOPE__KIND__TOKEN_CHUNK) {
            CU_ASSERT_EQUAL(e->token_chunk->first_index, (uint32_t)n);
            for (size_t j = 0; j < e->token_chunk->n_token_ids && n < 64; j++) {
                out[n++] = e->token_chunk->token_ids[j];
            }
        } else if (e->kind == TANDEM__ENVELOPE__KIND__FINISH) {
            CU_ASSERT_PTR_NULL(*fin); /* one Finish */
            *fin = e->finish;
            const Tandem__TokenChunk *c = e->finish->last_tokens;
            if (c != NULL) {
                CU_ASSERT_EQUAL(c->first_index, (uint32_t)n);
                for (size_t j = 0; j < c->n_token_ids && n < 64; j++) {
                    out[n++] = c->token_ids[j];
                }
            }
        } else {
            CU_FAIL("an unexpected message about the job");
        }
    }
    return n;
}

static int count_kind(const struct fake *f, Tandem__Envelope__Kind kind)
{
    int n = 0;
    for (int i = 0; i < f->n_ctl; i++) {
        n += f->ctl[i]->kind == kind;
    }
    return n;
}

static uint32_t colocated_tokens[64];
static int n_colocated = -1;

static void test_colocated(void)
{
    reset_net();
    static struct fake c;
    fake_init(&c, &colocated_role, "c0", "fake://c0");
    submit(&c, "");
    CU_ASSERT(c.kicks > 0);
    run();
    const Tandem__Finish *fin;
    n_colocated = tokens_of(&c, colocated_tokens, &fin);
    CU_ASSERT_EQUAL(n_colocated, MAX_TOKENS);
    CU_ASSERT_PTR_NOT_NULL_FATAL(fin);
    CU_ASSERT_EQUAL(fin->reason, TANDEM__FINISH__REASON__LENGTH);
    CU_ASSERT_EQUAL(fin->usage->prompt_tokens, (uint32_t)N_PROMPT);
    CU_ASSERT_EQUAL(fin->usage->completion_tokens, (uint32_t)MAX_TOKENS);
    CU_ASSERT_EQUAL(kv_frames_carried, 0);
    CU_ASSERT_EQUAL(c.n_links, 0);
    /* Prefilling stored the two full blocks: KV events went to the router. */
    CU_ASSERT(count_kind(&c, TANDEM__ENVELOPE__KIND__KV_EVENTS) > 0);
    fake_fini(&c);
}

/* DecodeJob.hold_tokens: the same tokens, the first in a TokenChunk at once,
 * the rest inside the Finish. */
static void test_colocated_held(void)
{
    CU_ASSERT_EQUAL_FATAL(n_colocated, MAX_TOKENS);
    reset_net();
    static struct fake c;
    fake_init(&c, &colocated_role, "c0", "fake://c0");
    tweak.hold = 1;
    submit(&c, "");
    tweak.hold = 0;
    run();
    const Tandem__Finish *fin;
    uint32_t got[64];
    CU_ASSERT_EQUAL(tokens_of(&c, got, &fin), MAX_TOKENS);
    CU_ASSERT_EQUAL(memcmp(got, colocated_tokens, MAX_TOKENS * sizeof(*got)), 0);
    CU_ASSERT_EQUAL(count_kind(&c, TANDEM__ENVELOPE__KIND__TOKEN_CHUNK), 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(fin);
    CU_ASSERT_EQUAL(fin->reason, TANDEM__FINISH__REASON__LENGTH);
    CU_ASSERT_PTR_NOT_NULL_FATAL(fin->last_tokens);
    CU_ASSERT_EQUAL(fin->last_tokens->first_index, 1);
    CU_ASSERT_EQUAL(fin->last_tokens->n_token_ids, MAX_TOKENS - 1);
    fake_fini(&c);
}

static void test_disaggregated(void)
{
    CU_ASSERT_EQUAL_FATAL(n_colocated, MAX_TOKENS);
    reset_net();
    static struct fake d, p;
    fake_init(&d, &decode_role, "d0", "fake://d0");
    fake_init(&p, &prefill_role, "p0", "fake://p0");
    submit(&d, "fake://p0");
    /* D reserved blocks and asked P: one PrefillJob in flight, D waits. */
    CU_ASSERT_EQUAL(net_n, 1);
    CU_ASSERT_EQUAL(d.n_links, 1);
    CU_ASSERT_EQUAL(d.refs[0], 1);
    CU_ASSERT_EQUAL(d.core.n_outside, 1);
    run();
    uint32_t tokens[64];
    const Tandem__Finish *fin;
    int n = tokens_of(&d, tokens, &fin);
    CU_ASSERT_EQUAL_FATAL(n, n_colocated);
    for (int i = 0; i < n; i++) {
        if (tokens[i] != colocated_tokens[i]) {
            fprintf(stderr, "token %d: P/D %u, colocated %u\n", i, tokens[i], colocated_tokens[i]);
        }
        CU_ASSERT_EQUAL(tokens[i], colocated_tokens[i]);
    }
    CU_ASSERT_PTR_NOT_NULL_FATAL(fin);
    CU_ASSERT_EQUAL(fin->reason, TANDEM__FINISH__REASON__LENGTH);
    CU_ASSERT_EQUAL(fin->usage->completion_tokens, (uint32_t)MAX_TOKENS);
    /* Three blocks shipped (two full, one partial), all installed. */
    CU_ASSERT_EQUAL(kv_frames_carried, 3);
    CU_ASSERT_EQUAL(metrics_series_value(p.core.m.kv_frames_sent), 3.0);
    CU_ASSERT_EQUAL(metrics_series_value(d.core.m.kv_frames_installed), 3.0);
    CU_ASSERT_EQUAL(d.core.n_outside, 0);
    CU_ASSERT_EQUAL(d.refs[0], 0); /* D let go of the link to P */
    CU_ASSERT_EQUAL(p.refs[0], 0); /* and P of the one to D */
    CU_ASSERT_EQUAL(p.n_links, 1);
    CU_ASSERT_STRING_EQUAL(p.addrs[0], "fake://d0");
    /* P never talks to the router about a prefill. */
    CU_ASSERT_EQUAL(count_kind(&p, TANDEM__ENVELOPE__KIND__FINISH), 0);
    CU_ASSERT_EQUAL(count_kind(&p, TANDEM__ENVELOPE__KIND__TOKEN_CHUNK), 0);

    /* A router joins D: ALL_CLEARED, then the two full blocks it holds. */
    int before = d.n_ctl;
    wk_core_snapshot(&d.core);
    CU_ASSERT_EQUAL_FATAL(d.n_ctl, before + 1);
    const Tandem__KvEvents *ke = d.ctl[before]->kv_events;
    CU_ASSERT_STRING_EQUAL(ke->worker_id, "d0");
    CU_ASSERT_EQUAL_FATAL(ke->n_events, 2u);
    CU_ASSERT_EQUAL(ke->events[0]->kind, TANDEM__KV_EVENT__KIND__ALL_CLEARED);
    CU_ASSERT_EQUAL(ke->events[1]->kind, TANDEM__KV_EVENT__KIND__STORED);
    CU_ASSERT_EQUAL(ke->events[1]->n_block_hashes, 2u);
    /* Heartbeat: idle now, the clock's timestamp. */
    wk_core_heartbeat(&d.core);
    const Tandem__Heartbeat *hb = d.ctl[d.n_ctl - 1]->heartbeat;
    CU_ASSERT_STRING_EQUAL(hb->worker_id, "d0");
    CU_ASSERT_EQUAL(hb->running, 0u);
    CU_ASSERT_EQUAL(hb->waiting, 0u);
    CU_ASSERT_EQUAL(hb->kv_blocks_total, 64u);
    CU_ASSERT_EQUAL(hb->timestamp_ms, fake_unix_ms(NULL));
    /* and the counters since the start: the KV bytes installed (this fake
     * backend's blocks are empty; test_int_router_dashboard ships real ones),
     * the prompt looked up in D's prefix cache (none of it cached). */
    CU_ASSERT_EQUAL((double)hb->kv_bytes_received,
                    metrics_series_value(d.core.m.kv_bytes_received));
    CU_ASSERT_EQUAL(hb->kv_bytes_sent, 0u);
    CU_ASSERT(hb->prefix_cache_queries > 0);
    CU_ASSERT_EQUAL(hb->prefix_cache_hits, 0u);
    wk_core_heartbeat(&p.core);
    const Tandem__Heartbeat *phb = p.ctl[p.n_ctl - 1]->heartbeat;
    CU_ASSERT_EQUAL((double)phb->kv_bytes_sent, metrics_series_value(p.core.m.kv_bytes_sent));
    CU_ASSERT_EQUAL(phb->kv_bytes_received, 0u);
    fake_fini(&d);
    fake_fini(&p);
}

/* The Error and Finish the router got for JOB_ID (NULL when none). */
static void job_end(const struct fake *f, const Tandem__Error **err, const Tandem__Finish **fin)
{
    *err = NULL;
    *fin = NULL;
    for (int i = 0; i < f->n_ctl; i++) {
        if (f->ctl[i]->request_id == JOB_ID && f->ctl[i]->kind == TANDEM__ENVELOPE__KIND__ERROR) {
            *err = f->ctl[i]->error;
        }
        if (f->ctl[i]->request_id == JOB_ID && f->ctl[i]->kind == TANDEM__ENVELOPE__KIND__FINISH) {
            *fin = f->ctl[i]->finish;
        }
    }
}

/* Drops the frames in flight, returning how many were of kind. */
static int drop_net(Tandem__Envelope__Kind kind)
{
    int n = 0;
    while (net_n > 0) {
        struct frame fr = net[net_head];
        net_head = (net_head + 1) % MAX_FRAMES;
        net_n--;
        struct wire_frame wf;
        CU_ASSERT_EQUAL_FATAL(wire_frame_unpack(fr.buf, fr.len, &wf), 0);
        n += wf.env->kind == kind;
        wire_frame_fini(&wf);
        free(fr.buf);
    }
    return n;
}

/* A prefill worker that never answers: the transfer times out in the host's
 * clock (modelled time offline) at the next tick past --transfer-timeout-ms;
 * D cancels at P, reports the error, and frees the reserved blocks. */
static void test_transfer_timeout(void)
{
    reset_net();
    static struct fake d;
    fake_init(&d, &decode_role, "d1", "fake://d1");
    double limit = d.core.cfg.transfer_timeout_ms / 1000.0;
    submit(&d, "fake://nobody");
    CU_ASSERT_EQUAL(drop_net(TANDEM__ENVELOPE__KIND__PREFILL_JOB), 1);
    CU_ASSERT_EQUAL(d.core.n_outside, 1);
    clock_s += limit - 0.01;
    wk_core_tick(&d.core);
    const Tandem__Error *err;
    const Tandem__Finish *fin;
    job_end(&d, &err, &fin);
    CU_ASSERT_PTR_NULL(fin); /* not yet */
    CU_ASSERT_EQUAL(d.core.n_outside, 1);
    clock_s += 0.02;
    wk_core_tick(&d.core);
    job_end(&d, &err, &fin);
    CU_ASSERT_PTR_NOT_NULL_FATAL(err);
    CU_ASSERT_EQUAL(err->code, TANDEM_ETIMEOUT);
    CU_ASSERT_PTR_NOT_NULL_FATAL(fin);
    CU_ASSERT_EQUAL(fin->reason, TANDEM__FINISH__REASON__ERROR);
    CU_ASSERT_EQUAL(drop_net(TANDEM__ENVELOPE__KIND__CANCEL), 1);
    CU_ASSERT_EQUAL(d.core.n_outside, 0);
    CU_ASSERT_EQUAL(d.refs[0], 0);
    struct kv_stats ks;
    kv_pool_stats(d.core.pool, &ks);
    CU_ASSERT_EQUAL(ks.in_use, 0);
    fake_fini(&d);
}

/* The link to P goes down mid-transfer: the job fails at once (ECLOSED);
 * a new job naming that P, known down, is answered Busy. */
static void test_link_down(void)
{
    reset_net();
    static struct fake d;
    fake_init(&d, &decode_role, "d2", "fake://d2");
    submit(&d, "fake://p9");
    CU_ASSERT_EQUAL(drop_net(TANDEM__ENVELOPE__KIND__PREFILL_JOB), 1);
    d.links[0].up = 0;
    wk_core_on_link(&d.core, &d.links[0], 0);
    const Tandem__Error *err;
    const Tandem__Finish *fin;
    job_end(&d, &err, &fin);
    CU_ASSERT_PTR_NOT_NULL_FATAL(err);
    CU_ASSERT_EQUAL(err->code, TANDEM_ECLOSED);
    CU_ASSERT_PTR_NOT_NULL_FATAL(fin);
    CU_ASSERT_EQUAL(d.core.n_outside, 0);
    int before = d.n_ctl;
    submit(&d, "fake://p9");
    CU_ASSERT_EQUAL(net_n, 0);
    CU_ASSERT_EQUAL_FATAL(d.n_ctl, before + 1);
    CU_ASSERT_EQUAL(d.ctl[before]->kind, TANDEM__ENVELOPE__KIND__BUSY);
    CU_ASSERT_EQUAL(d.ctl[before]->busy->reason, TANDEM__BUSY__REASON__PREFILL_UNAVAILABLE);
    fake_fini(&d);
}

/* KV events wait while the router is attached but not told about us, and
 * are dropped when it goes away (a later one gets a snapshot). */
static void test_router_states(void)
{
    reset_net();
    static struct fake c;
    fake_init(&c, &colocated_role, "c1", "fake://c1");
    wk_core_set_router(&c.core, WK_ROUTER_ATTACHED);
    submit(&c, "");
    run(); /* flushes while ATTACHED: nothing sent */
    CU_ASSERT_EQUAL(count_kind(&c, TANDEM__ENVELOPE__KIND__KV_EVENTS), 0);
    CU_ASSERT_EQUAL(c.core.n_ev, 0u);
    wk_core_set_router(&c.core, WK_ROUTER_NONE);
    CU_ASSERT_EQUAL(c.core.n_ev, 0u);
    fake_fini(&c);
}

/* --scheduler prefill-first, colocated and disaggregated: the same tokens
 * as the chunked runs; with --token-budget 0 the budget covers the context
 * limit (a 3000-token prompt runs), with --token-budget 2048 it is refused. */
static void test_prefill_first(void)
{
    CU_ASSERT_EQUAL_FATAL(n_colocated, MAX_TOKENS);
    reset_net();
    tweak.scheduler = SCHED_POLICY_PREFILL_FIRST;
    static struct fake c, d, p;
    fake_init(&c, &colocated_role, "c2", "fake://c2");
    submit(&c, "");
    run();
    uint32_t tokens[64];
    const Tandem__Finish *fin;
    CU_ASSERT_EQUAL_FATAL(tokens_of(&c, tokens, &fin), MAX_TOKENS);
    CU_ASSERT_EQUAL(memcmp(tokens, colocated_tokens, sizeof(uint32_t) * MAX_TOKENS), 0);
    fake_fini(&c);

    reset_net();
    fake_init(&d, &decode_role, "d2", "fake://d2");
    fake_init(&p, &prefill_role, "p2", "fake://p2");
    submit(&d, "fake://p2");
    run();
    CU_ASSERT_EQUAL_FATAL(tokens_of(&d, tokens, &fin), MAX_TOKENS);
    CU_ASSERT_EQUAL(memcmp(tokens, colocated_tokens, sizeof(uint32_t) * MAX_TOKENS), 0);
    CU_ASSERT_EQUAL(kv_frames_carried, 3);
    fake_fini(&d);
    fake_fini(&p);

    /* 1000 blocks of 16: context limit 8192 (llama-3-8b), above sim's 2048. */
    reset_net();
    tweak.kv_blocks = 1000;
    fake_init(&c, &colocated_role, "c3", "fake://c3");
    submit_n(&c, "", 3000);
    run();
    const Tandem__Error *err;
    job_end(&c, &err, &fin);
    CU_ASSERT_PTR_NULL(err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(fin);
    CU_ASSERT_EQUAL(fin->reason, TANDEM__FINISH__REASON__LENGTH);
    CU_ASSERT_EQUAL(fin->usage->completion_tokens, (uint32_t)MAX_TOKENS);
    fake_fini(&c);

    reset_net();
    tweak.token_budget = 2048;
    fake_init(&c, &colocated_role, "c4", "fake://c4");
    submit_n(&c, "", 3000);
    run();
    job_end(&c, &err, &fin);
    CU_ASSERT_PTR_NOT_NULL_FATAL(err); /* refused, as a prompt over the context limit is */
    CU_ASSERT_EQUAL(err->code, TANDEM_ETOOBIG);
    CU_ASSERT_PTR_NOT_NULL_FATAL(fin);
    CU_ASSERT_EQUAL(fin->reason, TANDEM__FINISH__REASON__ERROR);
    CU_ASSERT_EQUAL(count_kind(&c, TANDEM__ENVELOPE__KIND__TOKEN_CHUNK), 0);
    fake_fini(&c);
    memset(&tweak, 0, sizeof(tweak));
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("wk_core", NULL, NULL);
    CU_add_test(s, "colocated", test_colocated);
    CU_add_test(s, "colocated_held", test_colocated_held);
    CU_add_test(s, "disaggregated", test_disaggregated);
    CU_add_test(s, "router_states", test_router_states);
    CU_add_test(s, "transfer_timeout", test_transfer_timeout);
    CU_add_test(s, "link_down", test_link_down);
    CU_add_test(s, "prefill_first", test_prefill_first);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
