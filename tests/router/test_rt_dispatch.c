/* The router's request lifecycle (router/dispatch.h) with fakes for every
 * dependency: a real pipeline and tokenizer, but no sockets, HTTP or libuv.
 * Jobs and Cancels land in a list, answers in a recording sink, the clock
 * and the deferred call are driven by hand, and worker messages are built
 * here and fed to rt_dispatch_on_message. Checks the retry budget (503
 * "failed on N workers", each attempt on another worker), P and D both
 * excluded after a failure before the first token, recovery after a loss
 * (prompt plus the tokens already streamed, then the stream goes on), the
 * bounded pending queue (429 past it, drained in order when an endpoint
 * joins), the deadline, holding requests while no endpoint exists (sent
 * when one joins, 503 when the hold runs out, 429 past the queue's bound),
 * recovery onto a restarted worker (a new endpoint of the same name), and
 * the P/D fallback to a local prefill when no prefill endpoint is left. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "log.h"
#include "pipeline.h"
#include "rt_metrics.h"
#include "tandem_err.h"
#include "tokenizer.h"

#define HDR "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"

/* One decode profile. The queue-scorer makes picks deterministic: add_ep
 * gives each endpoint a longer queue than the one added before, so the first
 * one not excluded wins, and an exclusion that is not honoured shows. */
static const char *const decode_yaml =
    HDR "plugins:\n- type: decode-filter\n- type: queue-scorer\n- type: max-score-picker\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: decode-filter\n"
        "  - pluginRef: queue-scorer\n  - pluginRef: max-score-picker\n";

/* P/D: every request is prefilled remotely. */
static const char *const pd_yaml =
    HDR "plugins:\n- type: decode-filter\n- type: prefill-filter\n- type: queue-scorer\n"
        "- type: max-score-picker\n"
        "- type: always-disagg-pd-decider\n- type: pd-profile-handler\n"
        "schedulingProfiles:\n"
        "- name: prefill\n  plugins:\n  - pluginRef: prefill-filter\n  - pluginRef: queue-scorer\n"
        "  - pluginRef: max-score-picker\n"
        "- name: decode\n  plugins:\n  - pluginRef: decode-filter\n  - pluginRef: queue-scorer\n"
        "  - pluginRef: max-score-picker\n";

#define B(c)     ((uint32_t)(c) + TOK_BYTE_BASE) /* the byte tokenizer's id of c */
#define MAX_JOBS 32
#define MAX_GEN  16

struct job {
    int ep;
    uint64_t id;
    int n_prompt;
    int n_generated;
    uint32_t generated[MAX_GEN];
    int hold_tokens;
    char prefill[RT_ADDR_MAX];
};

/* Everything the fakes saw. */
struct fake {
    struct job jobs[MAX_JOBS];
    int n_jobs;
    int cancels;
    uint64_t last_cancel;
    int send_rc[MAX_JOBS]; /* what send_job returns for job i (0: delivered) */
    double now;
    int kicks;
    int max_context;
};

struct sink {
    int held, released;
    int status; /* 0 until respond, 200 once an SSE stream started */
    char body[8192];
    int retry_after;
    int events, ended;
    int batching;       /* inside batch(1) ... batch(0) */
    int batches;        /* batch(1) calls */
    int batched_events; /* events written inside a batch */
};

static struct fake fk;
static struct rt_pipeline *pl;
static struct tokenizer *tok;
static struct rt_metrics metrics;
static struct rt_dispatch d;

/* ---- Fakes ------------------------------------------------------------------ */

static int send_job(void *arg, int ep, uint64_t id, const struct ctl_job *job)
{
    struct fake *f = arg;
    CU_ASSERT_FATAL(f->n_jobs < MAX_JOBS);
    struct job *j = &f->jobs[f->n_jobs];
    j->ep = ep;
    j->id = id;
    j->n_prompt = job->n_prompt;
    j->n_generated = job->n_generated;
    j->hold_tokens = job->hold_tokens;
    for (int i = 0; i < job->n_generated && i < MAX_GEN; i++) {
        j->generated[i] = job->generated[i];
    }
    snprintf(j->prefill, sizeof(j->prefill), "%s",
             job->prefill_address ? job->prefill_address : "");
    return f->send_rc[f->n_jobs++];
}

static int send_cancel(void *arg, int ep, uint64_t id)
{
    struct fake *f = arg;
    (void)ep;
    f->cancels++;
    f->last_cancel = id;
    return 0;
}

static double now(void *arg)
{
    return ((struct fake *)arg)->now;
}

static void kick(void *arg)
{
    ((struct fake *)arg)->kicks++;
}

static int max_context(void *arg)
{
    return ((struct fake *)arg)->max_context;
}

static void sink_hold(void *sink, struct rt_req *q)
{
    (void)q;
    ((struct sink *)sink)->held++;
}

static void sink_release(void *sink)
{
    ((struct sink *)sink)->released++;
}

static void sink_respond(void *sink, int status, const char *const *headers, const char *body,
                         size_t len)
{
    struct sink *s = sink;
    s->status = status;
    snprintf(s->body, sizeof(s->body), "%.*s", (int)len, body);
    for (int i = 0; headers && headers[i]; i += 2) {
        if (strcmp(headers[i], "Retry-After") == 0) {
            s->retry_after = atoi(headers[i + 1]);
        }
    }
}

static void sink_start_sse(void *sink)
{
    ((struct sink *)sink)->status = 200;
}

static void sink_write_sse(void *sink, const char *data, size_t len)
{
    struct sink *s = sink;
    s->events++;
    s->batched_events += s->batching;
    size_t used = strlen(s->body);
    snprintf(s->body + used, sizeof(s->body) - used, "%.*s\n", (int)len, data);
}

static void sink_end(void *sink)
{
    ((struct sink *)sink)->ended++;
}

static void sink_batch(void *sink, int on)
{
    struct sink *s = sink;
    CU_ASSERT_EQUAL(s->batching, !on); /* paired, never nested */
    s->batching = on;
    s->batches += on;
}

static const struct rt_sink_ops sink_ops = {
    .hold = sink_hold,
    .release = sink_release,
    .respond = sink_respond,
    .start_sse = sink_start_sse,
    .write_sse = sink_write_sse,
    .end = sink_end,
    .batch = sink_batch,
};

/* ---- Set-up ----------------------------------------------------------------- */

static int add_ep(const char *id, enum rt_role role)
{
    char addr[64];
    snprintf(addr, sizeof(addr), "ipc:///data-%s", id);
    struct rt_endpoint_info in = {
        .id = id, .role = role, .block_size = 16, .max_running = 16, .data_addr = addr};
    int ep = rt_pipeline_endpoint_add(pl, &in);
    CU_ASSERT_FATAL(ep >= 0);
    struct rt_load load = {.waiting = (uint32_t)ep + 1, .kv_blocks_total = 100};
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_set_load(pl, ep, &load), 0);
    return ep;
}

static void start_hold(const char *yaml, int retries, int max_pending, int hold_ms)
{
    memset(&fk, 0, sizeof(fk));
    fk.now = 100.0;
    fk.max_context = 4096;
    struct rt_pipeline_opts po = {.seed = 7};
    char err[RT_ERR_MAX];
    CU_ASSERT_EQUAL_FATAL(rt_pipeline_parse(&pl, yaml, "test.yaml", &po, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL_FATAL(tok_create_bytes(&tok), 0);
    CU_ASSERT_EQUAL_FATAL(rt_metrics_init(&metrics, "tiny"), 0);
    struct rt_dispatch_deps deps = {
        .pl = pl,
        .tok = tok,
        .m = &metrics,
        .model = {.id = "tiny", .vocab_size = tok_vocab_size(tok), .max_context = 0},
        .block_size = 16,
        .max_pending = max_pending,
        .retries = retries,
        .deadline_ms = 5000,
        .hold_ms = hold_ms,
        .seed = 42,
        .sink = &sink_ops,
        .arg = &fk,
        .send_job = send_job,
        .send_cancel = send_cancel,
        .now = now,
        .kick = kick,
        .max_context = max_context,
    };
    CU_ASSERT_EQUAL_FATAL(rt_dispatch_init(&d, &deps), 0);
}

static void start(const char *yaml, int retries, int max_pending)
{
    start_hold(yaml, retries, max_pending, 0);
}

static void stop(void)
{
    rt_dispatch_close(&d);
    CU_ASSERT_EQUAL(d.n_live, 0);
    rt_pipeline_destroy(pl);
    tok_destroy(tok);
    rt_metrics_fini(&metrics);
}

static void submit(struct sink *s, const char *prompt, int max_tokens, int stream)
{
    char body[512];
    snprintf(body, sizeof(body),
             "{\"model\":\"tiny\",\"prompt\":\"%s\",\"max_tokens\":%d,\"stream\":%s}", prompt,
             max_tokens, stream ? "true" : "false");
    rt_dispatch_submit(&d, s, OA_KIND_COMPLETION, body, strlen(body), NULL);
}

/* body holds one event per character of want, in order, each with that
 * character alone as its "text". */
static int texts_in_order(const char *body, const char *want)
{
    const char *p = body;
    for (const char *w = want; *w; w++) {
        char key[32];
        snprintf(key, sizeof(key), "\"text\":\"%c\"", *w);
        p = strstr(p, key);
        if (p == NULL) {
            return 0;
        }
        p += strlen(key);
    }
    return 1;
}

/* Each line of body from its "choices" on (past the response id and the
 * creation time, which differ between two requests), into out. */
static void event_tails(const char *body, char *out, size_t cap)
{
    size_t o = 0;
    out[0] = '\0';
    for (const char *line = body; *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        const char *c = strstr(line, "\"choices\"");
        const char *from = c != NULL && c < line + n ? c : line;
        size_t k = (size_t)(line + n - from);
        if (o + k + 2 > cap) {
            break;
        }
        memcpy(out + o, from, k);
        o += k;
        out[o++] = '\n';
        out[o] = '\0';
        line += n + (end ? 1 : 0);
    }
}

/* ---- Worker messages ------------------------------------------------------- */

static void feed(int ep, Tandem__Envelope *env)
{
    rt_dispatch_on_message(&d, ep, env);
}

static void tokens(const struct job *j, uint32_t first, const uint32_t *ids, size_t n)
{
    Tandem__TokenChunk c = TANDEM__TOKEN_CHUNK__INIT;
    c.first_index = first;
    c.token_ids = (uint32_t *)ids;
    c.n_token_ids = n;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.kind = TANDEM__ENVELOPE__KIND__TOKEN_CHUNK;
    env.request_id = j->id;
    env.token_chunk = &c;
    feed(j->ep, &env);
}

static void finish(const struct job *j, Tandem__Finish__Reason reason, uint32_t completion)
{
    Tandem__Usage u = TANDEM__USAGE__INIT;
    u.prompt_tokens = (uint32_t)j->n_prompt;
    u.completion_tokens = completion;
    Tandem__Finish f = TANDEM__FINISH__INIT;
    f.reason = reason;
    f.usage = &u;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.kind = TANDEM__ENVELOPE__KIND__FINISH;
    env.request_id = j->id;
    env.finish = &f;
    feed(j->ep, &env);
}

/* A worker-side failure: Error (not the request's fault), then Finish(ERROR). */
static void worker_error(const struct job *j)
{
    Tandem__Error e = TANDEM__ERROR__INIT;
    e.code = TANDEM_EIO;
    e.message = "disk on fire";
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.kind = TANDEM__ENVELOPE__KIND__ERROR;
    env.request_id = j->id;
    env.error = &e;
    feed(j->ep, &env);
    finish(j, TANDEM__FINISH__REASON__ERROR, 0);
}

static void busy_because(const struct job *j, Tandem__Busy__Reason reason)
{
    Tandem__Busy b = TANDEM__BUSY__INIT;
    b.reason = reason;
    b.detail = "full";
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.kind = TANDEM__ENVELOPE__KIND__BUSY;
    env.request_id = j->id;
    env.busy = &b;
    feed(j->ep, &env);
}

static void busy(const struct job *j)
{
    busy_because(j, TANDEM__BUSY__REASON__TOO_MANY_SEQS);
}

/* ---- Tests -------------------------------------------------------------------- */

/* Retries 2: three attempts, each lost a different way (worker error, link
 * lost, send failed), each on a worker not tried before, then 503. */
static void test_retry_then_503(void)
{
    start(decode_yaml, 2, 8);
    for (int i = 0; i < 4; i++) {
        char id[8];
        snprintf(id, sizeof(id), "d%d", i);
        add_ep(id, RT_ROLE_DECODE);
    }
    fk.send_rc[2] = TANDEM_ENOENT; /* the third attempt's link is down */
    struct sink s = {0};
    submit(&s, "hello", 4, 0);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 1);
    CU_ASSERT_EQUAL(s.held, 1);
    worker_error(&fk.jobs[0]);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 2);
    CU_ASSERT_EQUAL(s.status, 0); /* retried, not answered */
    rt_dispatch_on_down(&d, fk.jobs[1].ep);
    CU_ASSERT_EQUAL(fk.cancels, 1); /* the lost attempt is cancelled */
    CU_ASSERT_EQUAL(fk.last_cancel, fk.jobs[1].id);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 3);
    /* The third send failed: budget spent, answered. */
    CU_ASSERT_EQUAL(s.status, 503);
    CU_ASSERT_PTR_NOT_NULL(strstr(s.body, "failed on 3 workers"));
    CU_ASSERT_PTR_NOT_NULL(strstr(s.body, "link down on d"));
    CU_ASSERT_EQUAL(s.released, 1);
    /* The least queued first, then each next one: none tried twice. */
    CU_ASSERT_EQUAL(fk.jobs[0].ep, 0);
    CU_ASSERT_EQUAL(fk.jobs[1].ep, 1);
    CU_ASSERT_EQUAL(fk.jobs[2].ep, 2);
    CU_ASSERT(fk.jobs[0].id != fk.jobs[1].id && fk.jobs[1].id != fk.jobs[2].id);
    CU_ASSERT_EQUAL(d.stats.failures, 2);
    CU_ASSERT_EQUAL(d.stats.rejected, 1);
    CU_ASSERT_EQUAL(d.n_live, 0);
    CU_ASSERT_EQUAL(d.n_running, 0);
    stop();
}

/* A job reported unsent after the dispatcher moved on (the router's batched
 * send, refused by NNG): retried elsewhere as a failed send; a report for an
 * attempt that already ended changes nothing. */
static void test_unsent(void)
{
    start(decode_yaml, 2, 8);
    add_ep("d0", RT_ROLE_DECODE);
    add_ep("d1", RT_ROLE_DECODE);
    struct sink s = {0};
    submit(&s, "hello", 2, 0);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 1);
    rt_dispatch_on_unsent(&d, fk.jobs[0].ep, fk.jobs[0].id, TANDEM_ETIMEOUT);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 2);
    CU_ASSERT(fk.jobs[1].ep != fk.jobs[0].ep);
    CU_ASSERT(fk.jobs[1].id != fk.jobs[0].id);
    CU_ASSERT_EQUAL(fk.cancels, 0); /* the worker never had it */
    CU_ASSERT_EQUAL(d.stats.failures, 1);
    /* Late or stray reports: the old attempt, a wrong endpoint. */
    rt_dispatch_on_unsent(&d, fk.jobs[0].ep, fk.jobs[0].id, TANDEM_ETIMEOUT);
    rt_dispatch_on_unsent(&d, fk.jobs[0].ep, fk.jobs[1].id, TANDEM_ENOENT);
    CU_ASSERT_EQUAL(fk.n_jobs, 2);
    uint32_t t[2] = {B('o'), B('k')};
    tokens(&fk.jobs[1], 0, t, 2);
    finish(&fk.jobs[1], TANDEM__FINISH__REASON__LENGTH, 2);
    CU_ASSERT_EQUAL(s.status, 200);
    CU_ASSERT_PTR_NOT_NULL(strstr(s.body, "ok"));
    CU_ASSERT_EQUAL(d.stats.completed, 1);
    CU_ASSERT_EQUAL(d.n_live, 0);
    stop();
}

/* A remote-prefill attempt lost before its first token: the retry avoids
 * both the decode and the prefill worker. */
static void test_pd_both_excluded(void)
{
    start(pd_yaml, 3, 8);
    add_ep("p0", RT_ROLE_PREFILL);
    add_ep("p1", RT_ROLE_PREFILL);
    add_ep("d2", RT_ROLE_DECODE);
    add_ep("d3", RT_ROLE_DECODE);
    struct sink s = {0};
    submit(&s, "a prompt", 4, 0);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 1);
    CU_ASSERT_EQUAL(fk.jobs[0].ep, 2);
    CU_ASSERT_STRING_EQUAL(fk.jobs[0].prefill, "ipc:///data-p0");
    worker_error(&fk.jobs[0]); /* D reports it, before any token */
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 2);
    /* Both left out, though each is still the least queued of its kind. */
    CU_ASSERT_EQUAL(fk.jobs[1].ep, 3);
    CU_ASSERT_STRING_EQUAL(fk.jobs[1].prefill, "ipc:///data-p1");
    uint32_t t = B('x');
    tokens(&fk.jobs[1], 0, &t, 1);
    finish(&fk.jobs[1], TANDEM__FINISH__REASON__STOP, 1);
    CU_ASSERT_EQUAL(s.status, 200);
    CU_ASSERT_EQUAL(d.stats.completed, 1);
    stop();
}

/* Lost after 3 tokens: the recovery job carries the prompt and those tokens,
 * goes to another worker, and its stream continues at index 3. */
static void test_recovery(void)
{
    start(decode_yaml, 3, 8);
    add_ep("d0", RT_ROLE_DECODE);
    add_ep("d1", RT_ROLE_DECODE);
    struct sink s = {0};
    submit(&s, "hello", 5, 1);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 1);
    CU_ASSERT_EQUAL(fk.jobs[0].n_generated, 0);
    const uint32_t first[] = {B('a'), B('b'), B('c')};
    tokens(&fk.jobs[0], 0, first, 3);
    CU_ASSERT_EQUAL(s.status, 200); /* the stream started */
    rt_dispatch_on_down(&d, fk.jobs[0].ep);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 2);
    const struct job *j = &fk.jobs[1];
    CU_ASSERT_EQUAL(fk.jobs[0].ep, 0);
    CU_ASSERT_EQUAL(j->ep, 1);
    CU_ASSERT_EQUAL(j->n_prompt, fk.jobs[0].n_prompt);
    CU_ASSERT_EQUAL_FATAL(j->n_generated, 3);
    CU_ASSERT_EQUAL(j->generated[0], B('a'));
    CU_ASSERT_EQUAL(j->generated[1], B('b'));
    CU_ASSERT_EQUAL(j->generated[2], B('c'));
    CU_ASSERT_EQUAL(d.stats.recoveries, 1);
    CU_ASSERT_EQUAL(d.stats.failures, 0);
    const uint32_t rest[] = {B('d'), B('e')};
    tokens(j, 3, rest, 2);
    finish(j, TANDEM__FINISH__REASON__LENGTH, 5);
    CU_ASSERT_EQUAL(s.ended, 1);
    CU_ASSERT_EQUAL(s.released, 1);
    /* Each token once, in order, one event each: "abc" before the loss, "de"
     * after. */
    CU_ASSERT(texts_in_order(s.body, "abcde"));
    CU_ASSERT_PTR_NOT_NULL(strstr(s.body, "\"finish_reason\":\"length\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(s.body, "[DONE]"));
    CU_ASSERT_EQUAL(d.stats.completed, 1);
    stop();
}

/* A worker that sends several tokens in one chunk (--stream-interval): one
 * event per token, in one batch, the same events as when the tokens come one
 * by one. */
static void test_chunk_per_token(void)
{
    start(decode_yaml, 3, 8);
    add_ep("d0", RT_ROLE_DECODE);
    struct sink one = {0}, many = {0};
    submit(&one, "hello", 4, 1);
    submit(&many, "hello", 4, 1);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 2);
    const uint32_t ids[] = {B('w'), B('x'), B('y'), B('z')};
    for (uint32_t i = 0; i < 4; i++) {
        tokens(&fk.jobs[0], i, &ids[i], 1);
    }
    tokens(&fk.jobs[1], 0, ids, 1); /* the first at once, then three together */
    CU_ASSERT_EQUAL(many.batches, 0);
    tokens(&fk.jobs[1], 1, ids + 1, 3);
    finish(&fk.jobs[0], TANDEM__FINISH__REASON__LENGTH, 4);
    finish(&fk.jobs[1], TANDEM__FINISH__REASON__LENGTH, 4);
    CU_ASSERT_EQUAL(one.batches, 0);
    CU_ASSERT_EQUAL(many.batches, 1);
    CU_ASSERT_EQUAL(many.batched_events, 3);
    CU_ASSERT_EQUAL(many.batching, 0);
    CU_ASSERT_EQUAL(one.events, many.events);
    CU_ASSERT(texts_in_order(many.body, "wxyz"));
    static char a[8192], b[8192];
    event_tails(one.body, a, sizeof(a));
    event_tails(many.body, b, sizeof(b));
    CU_ASSERT_STRING_EQUAL(a, b);
    CU_ASSERT_PTR_NOT_NULL(strstr(a, "\"finish_reason\":\"length\""));
    stop();
}

/* A non-streamed request without stop strings is a hold_tokens job, and its
 * last tokens may come inside the Finish (Finish.last_tokens): the answer
 * has every token once, in order. A streamed one is not held. */
static void test_finish_last_tokens(void)
{
    start(decode_yaml, 3, 8);
    add_ep("d0", RT_ROLE_DECODE);
    struct sink s = {0};
    submit(&s, "hello", 4, 0);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 1);
    const struct job *j = &fk.jobs[0];
    CU_ASSERT_EQUAL(j->hold_tokens, 1);
    const uint32_t first[] = {B('a')};
    tokens(j, 0, first, 1);
    CU_ASSERT_EQUAL(s.status, 0);
    const uint32_t rest[] = {B('b'), B('c'), B('d')};
    Tandem__TokenChunk c = TANDEM__TOKEN_CHUNK__INIT;
    c.first_index = 1;
    c.token_ids = (uint32_t *)rest;
    c.n_token_ids = 3;
    Tandem__Usage u = TANDEM__USAGE__INIT;
    u.prompt_tokens = (uint32_t)j->n_prompt;
    u.completion_tokens = 4;
    Tandem__Finish f = TANDEM__FINISH__INIT;
    f.reason = TANDEM__FINISH__REASON__LENGTH;
    f.usage = &u;
    f.last_tokens = &c;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.kind = TANDEM__ENVELOPE__KIND__FINISH;
    env.request_id = j->id;
    env.finish = &f;
    feed(j->ep, &env);
    CU_ASSERT_EQUAL(s.status, 200);
    CU_ASSERT_PTR_NOT_NULL(strstr(s.body, "\"text\":\"abcd\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(s.body, "\"completion_tokens\":4"));
    CU_ASSERT_EQUAL(d.stats.completed, 1);

    struct sink s2 = {0};
    submit(&s2, "hello", 4, 1);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 2);
    CU_ASSERT_EQUAL(fk.jobs[1].hold_tokens, 0);
    finish(&fk.jobs[1], TANDEM__FINISH__REASON__LENGTH, 0);
    stop();
}

/* rt_dispatch_prefetch changes nothing: it hands back the sink of a live
 * request at stage 0 only, NULL for an id not live, and the stream that
 * follows is the same as without it. */
static void test_prefetch(void)
{
    start(decode_yaml, 3, 8);
    add_ep("d0", RT_ROLE_DECODE);
    struct sink s = {0};
    submit(&s, "hello", 5, 1);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 1);
    uint64_t id = fk.jobs[0].id;
    for (int stage = 3; stage >= 1; stage--) {
        CU_ASSERT_PTR_NULL(rt_dispatch_prefetch(&d, id, stage));
    }
    CU_ASSERT_PTR_EQUAL(rt_dispatch_prefetch(&d, id, 0), &s);
    CU_ASSERT_PTR_NULL(rt_dispatch_prefetch(&d, id + 1000, 0));
    CU_ASSERT_PTR_NULL(rt_dispatch_prefetch(&d, 0, 0));
    const uint32_t ids[] = {B('o'), B('k')};
    tokens(&fk.jobs[0], 0, ids, 2);
    finish(&fk.jobs[0], TANDEM__FINISH__REASON__LENGTH, 2);
    CU_ASSERT(texts_in_order(s.body, "ok"));
    CU_ASSERT_PTR_NULL(rt_dispatch_prefetch(&d, id, 0)); /* finished: not live */
    stop();
}

/* One worker, busy: requests wait (max_pending 2), the third gets 429 with
 * Retry-After; a new endpoint drains the queue in arrival order. */
static void test_pending_queue(void)
{
    start(decode_yaml, 3, 2);
    int d0 = add_ep("d0", RT_ROLE_DECODE);
    struct sink s1 = {0}, s2 = {0}, s3 = {0};
    submit(&s1, "a", 4, 0);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 1);
    busy(&fk.jobs[0]);
    CU_ASSERT_EQUAL(fk.n_jobs, 1); /* nobody else: queued */
    CU_ASSERT_EQUAL(d.n_pending, 1);
    CU_ASSERT_EQUAL(d.stats.busy, 1);
    submit(&s2, "bb", 4, 0); /* behind the queued one, not tried */
    CU_ASSERT_EQUAL(fk.n_jobs, 1);
    CU_ASSERT_EQUAL(d.n_pending, 2);
    submit(&s3, "ccc", 4, 0);
    CU_ASSERT_EQUAL(s3.status, 429);
    CU_ASSERT_EQUAL(s3.retry_after, RT_RETRY_AFTER_S);
    CU_ASSERT_EQUAL(s3.released, s3.held);
    CU_ASSERT_EQUAL(d.n_pending, 2);
    CU_ASSERT_EQUAL(s1.status + s2.status, 0);

    int d1 = add_ep("d1", RT_ROLE_DECODE);
    CU_ASSERT_EQUAL(fk.kicks, 0);
    rt_dispatch_on_up(&d, d1);
    CU_ASSERT_EQUAL(fk.kicks, 1);
    CU_ASSERT_EQUAL(fk.n_jobs, 1); /* deferred, not from inside the callback */
    rt_dispatch_run_pending(&d);
    CU_ASSERT_EQUAL(d.n_pending, 0);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 3);
    CU_ASSERT(fk.jobs[1].n_prompt < fk.jobs[2].n_prompt); /* "a" before "bb" */
    CU_ASSERT(fk.jobs[1].ep == d0 || fk.jobs[1].ep == d1);
    for (int i = 1; i < 3; i++) {
        finish(&fk.jobs[i], TANDEM__FINISH__REASON__STOP, 0);
    }
    CU_ASSERT_EQUAL(s1.status, 200);
    CU_ASSERT_EQUAL(s2.status, 200);
    CU_ASSERT_EQUAL(d.stats.completed, 2);
    stop();
}

/* The deadline, on the deps' clock. */
static void test_deadline(void)
{
    start(decode_yaml, 3, 8);
    add_ep("d0", RT_ROLE_DECODE);
    struct sink s = {0};
    submit(&s, "hello", 4, 0);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 1);
    fk.now += 4.9;
    rt_dispatch_tick(&d);
    CU_ASSERT_EQUAL(s.status, 0);
    fk.now += 0.2;
    rt_dispatch_tick(&d);
    CU_ASSERT_EQUAL(s.status, 504);
    CU_ASSERT_EQUAL(fk.cancels, 1);
    CU_ASSERT_EQUAL(d.stats.deadlines, 1);
    stop();
}

/* No endpoint: with hold 0, 503 at once (as before holding existed). */
static void test_no_endpoint_no_hold(void)
{
    start(decode_yaml, 3, 8);
    struct sink s = {0};
    submit(&s, "hello", 4, 0);
    CU_ASSERT_EQUAL(s.status, 503);
    CU_ASSERT_PTR_NOT_NULL(strstr(s.body, "No healthy decode endpoint is available; try again"));
    CU_ASSERT_EQUAL(d.n_pending, 0);
    CU_ASSERT_EQUAL(d.stats.held, 0);
    stop();
}

/* No endpoint, hold 2 s, queue bound 2: two requests are held in order, a
 * third gets 429; an endpoint joining 0.5 s later takes both, in arrival
 * order, and their waits are observed as "sent". */
static void test_hold_until_join(void)
{
    start_hold(decode_yaml, 3, 2, 2000);
    struct sink s1 = {0}, s2 = {0}, s3 = {0};
    submit(&s1, "a", 4, 0);
    fk.now += 0.1;
    submit(&s2, "bb", 4, 0);
    submit(&s3, "ccc", 4, 0);
    CU_ASSERT_EQUAL(fk.n_jobs, 0);
    CU_ASSERT_EQUAL(s1.status + s2.status, 0); /* held, not answered */
    CU_ASSERT_EQUAL(s3.status, 429);
    CU_ASSERT_EQUAL(s3.retry_after, RT_RETRY_AFTER_S);
    CU_ASSERT_EQUAL(d.n_pending, 2);
    CU_ASSERT_EQUAL(d.n_held, 2);
    CU_ASSERT_EQUAL(d.stats.held, 2);
    /* Ticks within the hold neither answer nor retry held requests. */
    fk.now += 0.4;
    rt_dispatch_tick(&d);
    CU_ASSERT_EQUAL(fk.kicks, 0);
    CU_ASSERT_EQUAL(s1.status + s2.status, 0);
    int d0 = add_ep("d0", RT_ROLE_DECODE);
    rt_dispatch_on_up(&d, d0);
    CU_ASSERT_EQUAL(fk.kicks, 1);
    rt_dispatch_run_pending(&d);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 2);
    CU_ASSERT_EQUAL(fk.jobs[0].n_prompt + 1, fk.jobs[1].n_prompt); /* "a" before "bb" */
    CU_ASSERT_EQUAL(d.n_pending, 0);
    CU_ASSERT_EQUAL(d.n_held, 0);
    CU_ASSERT_EQUAL(metrics_series_value(metrics.hold_sent), 2);
    CU_ASSERT_EQUAL(metrics_series_value(metrics.hold_expired), 0);
    for (int i = 0; i < 2; i++) {
        finish(&fk.jobs[i], TANDEM__FINISH__REASON__STOP, 0);
    }
    CU_ASSERT_EQUAL(s1.status, 200);
    CU_ASSERT_EQUAL(s2.status, 200);
    stop();
}

/* A hold runs out: 503 saying how long it waited and what to do; a hold
 * longer than the deadline ends at the deadline, with the same 503. */
static void test_hold_expires(void)
{
    start_hold(decode_yaml, 3, 8, 1000);
    struct sink s = {0};
    submit(&s, "hello", 4, 0);
    fk.now += 0.9;
    rt_dispatch_tick(&d);
    CU_ASSERT_EQUAL(s.status, 0);
    fk.now += 0.1;
    rt_dispatch_tick(&d);
    CU_ASSERT_EQUAL(s.status, 503);
    CU_ASSERT_PTR_NOT_NULL(strstr(s.body, "held the request for 1.0 s"));
    CU_ASSERT_PTR_NOT_NULL(strstr(s.body, "GET /v1/cluster"));
    CU_ASSERT_PTR_NOT_NULL(strstr(s.body, "--hold-timeout-ms"));
    CU_ASSERT_PTR_NOT_NULL(strstr(s.body, "\"code\":\"service_unavailable\""));
    CU_ASSERT_EQUAL(s.released, 1);
    CU_ASSERT_EQUAL(d.stats.hold_expired, 1);
    CU_ASSERT_EQUAL(d.n_pending, 0);
    CU_ASSERT_EQUAL(d.n_held, 0);
    CU_ASSERT_EQUAL(metrics_series_value(metrics.hold_expired), 1);
    stop();

    start_hold(decode_yaml, 3, 8, 60000); /* deadline 5 s */
    struct sink t = {0};
    submit(&t, "hello", 4, 0);
    fk.now += 4.9;
    rt_dispatch_tick(&d);
    CU_ASSERT_EQUAL(t.status, 0);
    fk.now += 0.1;
    rt_dispatch_tick(&d);
    CU_ASSERT_EQUAL(t.status, 503);
    CU_ASSERT_PTR_NOT_NULL(strstr(t.body, "held the request for 5.0 s"));
    CU_ASSERT_EQUAL(d.stats.deadlines, 0);
    stop();
}

/* The only decode worker dies after 3 tokens and restarts (a new endpoint
 * under the same name, as the registry re-registers a new incarnation): the
 * request is held meanwhile, then recovered on it with the prompt and the 3
 * tokens; the stream goes on at index 3, each token once. */
static void test_recover_on_restarted(void)
{
    start_hold(decode_yaml, 3, 8, 10000);
    int d0 = add_ep("d0", RT_ROLE_DECODE);
    struct sink s = {0};
    submit(&s, "hello", 5, 1);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 1);
    const uint32_t first[] = {B('a'), B('b'), B('c')};
    tokens(&fk.jobs[0], 0, first, 3);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_set_healthy(pl, d0, 0), 0);
    rt_dispatch_on_down(&d, d0);
    CU_ASSERT_EQUAL(fk.n_jobs, 1); /* nowhere to go: held */
    CU_ASSERT_EQUAL(d.n_held, 1);
    CU_ASSERT_EQUAL(d.stats.recoveries, 1);
    /* The restart: the old endpoint removed, the new one registered. */
    rt_dispatch_on_down(&d, d0);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_remove(pl, d0), 0);
    fk.now += 1.1;
    int d0b = add_ep("d0", RT_ROLE_DECODE);
    rt_dispatch_on_up(&d, d0b);
    rt_dispatch_run_pending(&d);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 2);
    const struct job *j = &fk.jobs[1];
    CU_ASSERT_EQUAL(j->ep, d0b);
    CU_ASSERT_EQUAL(j->n_prompt, fk.jobs[0].n_prompt);
    CU_ASSERT_EQUAL_FATAL(j->n_generated, 3);
    CU_ASSERT_EQUAL(j->generated[2], B('c'));
    const uint32_t rest[] = {B('d'), B('e')};
    tokens(j, 3, rest, 2);
    finish(j, TANDEM__FINISH__REASON__LENGTH, 5);
    CU_ASSERT(texts_in_order(s.body, "abcde"));
    CU_ASSERT_PTR_NOT_NULL(strstr(s.body, "\"finish_reason\":\"length\""));
    CU_ASSERT_EQUAL(s.ended, 1);
    CU_ASSERT_EQUAL(d.stats.completed, 1);
    CU_ASSERT_EQUAL(metrics_series_value(metrics.hold_sent), 1);
    stop();
}

/* P/D with every request prefilled remotely: with the only prefill
 * endpoint unhealthy the decode endpoint prefills (counted, once per
 * decision); when it is back, remote again. */
static void test_pd_fallback(void)
{
    start_hold(pd_yaml, 3, 8, 10000);
    int p0 = add_ep("p0", RT_ROLE_PREFILL);
    add_ep("d1", RT_ROLE_DECODE);
    struct sink s[3] = {{0}};
    submit(&s[0], "one", 2, 0);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 1);
    CU_ASSERT_STRING_EQUAL(fk.jobs[0].prefill, "ipc:///data-p0");
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_set_healthy(pl, p0, 0), 0);
    rt_dispatch_on_down(&d, p0);
    /* The lost remote prefill is retried locally, not failed. */
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 2);
    CU_ASSERT_STRING_EQUAL(fk.jobs[1].prefill, "");
    submit(&s[1], "two", 2, 0);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 3);
    CU_ASSERT_STRING_EQUAL(fk.jobs[2].prefill, "");
    CU_ASSERT_EQUAL(d.stats.pd_fallbacks, 2);
    CU_ASSERT_EQUAL(metrics_series_value(metrics.pd_no_prefill), 2);
    CU_ASSERT_EQUAL(d.pd_fallback, 1);
    CU_ASSERT_EQUAL(d.stats.held, 0);
    CU_ASSERT_EQUAL(rt_pipeline_endpoint_set_healthy(pl, p0, 1), 0);
    rt_dispatch_on_up(&d, p0);
    submit(&s[2], "three", 2, 0);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 4);
    CU_ASSERT_STRING_EQUAL(fk.jobs[3].prefill, "ipc:///data-p0");
    CU_ASSERT_EQUAL(d.pd_fallback, 0);
    CU_ASSERT_EQUAL(metrics_series_value(metrics.pd_no_prefill), 2);
    for (int i = 1; i < 4; i++) {
        uint32_t t = B('x');
        tokens(&fk.jobs[i], 0, &t, 1);
        finish(&fk.jobs[i], TANDEM__FINISH__REASON__LENGTH, 1);
    }
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(s[i].status, 200);
    }
    stop();
}

/* D answers Busy because it cannot reach the prefill worker it was given
 * (its link to a restarted P is not back yet, while the router sees P
 * healthy): the retry leaves P out, not D, and D prefills locally, at
 * once, instead of parking the request. */
static void test_busy_prefill_unavailable(void)
{
    start_hold(pd_yaml, 3, 8, 10000);
    add_ep("p0", RT_ROLE_PREFILL);
    int d1 = add_ep("d1", RT_ROLE_DECODE);
    struct sink s = {0};
    submit(&s, "one", 2, 0);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 1);
    CU_ASSERT_STRING_EQUAL(fk.jobs[0].prefill, "ipc:///data-p0");
    busy_because(&fk.jobs[0], TANDEM__BUSY__REASON__PREFILL_UNAVAILABLE);
    CU_ASSERT_EQUAL_FATAL(fk.n_jobs, 2);
    CU_ASSERT_EQUAL(fk.jobs[1].ep, d1);
    CU_ASSERT_STRING_EQUAL(fk.jobs[1].prefill, "");
    CU_ASSERT_EQUAL(d.n_pending, 0);
    CU_ASSERT_EQUAL(d.stats.busy, 1);
    CU_ASSERT_EQUAL(d.stats.pd_fallbacks, 1);
    uint32_t t = B('x');
    tokens(&fk.jobs[1], 0, &t, 1);
    finish(&fk.jobs[1], TANDEM__FINISH__REASON__LENGTH, 1);
    CU_ASSERT_EQUAL(s.status, 200);
    stop();
}

int main(void)
{
    log_set_level(LOG_LEVEL_ERROR);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("rt_dispatch", NULL, NULL);
    CU_add_test(s, "retry_then_503", test_retry_then_503);
    CU_add_test(s, "unsent", test_unsent);
    CU_add_test(s, "pd_both_excluded", test_pd_both_excluded);
    CU_add_test(s, "recovery", test_recovery);
    CU_add_test(s, "finish_last_tokens", test_finish_last_tokens);
    CU_add_test(s, "prefetch", test_prefetch);
    CU_add_test(s, "chunk_per_token", test_chunk_per_token);
    CU_add_test(s, "pending_queue", test_pending_queue);
    CU_add_test(s, "deadline", test_deadline);
    CU_add_test(s, "no_endpoint_no_hold", test_no_endpoint_no_hold);
    CU_add_test(s, "hold_until_join", test_hold_until_join);
    CU_add_test(s, "hold_expires", test_hold_expires);
    CU_add_test(s, "recover_on_restarted", test_recover_on_restarted);
    CU_add_test(s, "pd_fallback", test_pd_fallback);
    CU_add_test(s, "busy_prefill_unavailable", test_busy_prefill_unavailable);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
