/* Integration: flags and exit codes, the READY line, hello and heartbeats,
 * /health and /metrics, one request colocated and one disaggregated (tcp and
 * ipc) against the single-process engine, KV events, Busy on a full queue,
 * recovery, logprobs and prompt logprobs, the sim backend and its timed
 * steps, and a clean SIGTERM (exit 0, ipc files removed). */
#include <CUnit/Basic.h>
#include <math.h>
#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl.h"
#include "harness.h"
#include "kv_cache.h"
#include "sim.h"
#include "tandem_err.h"
#include "watchdog.h"
#include "wire.h"

#define TIMEOUT_MS 30000

static const char *const quiet[] = {"--log-level", "warn"};

/* args + "--log-level warn" + NULL, into out. */
static const char **with_quiet(const char **out, const char *const *args)
{
    int n = 0;
    for (int i = 0; args && args[i]; i++) {
        out[n++] = args[i];
    }
    out[n++] = quiet[0];
    out[n++] = quiet[1];
    out[n] = NULL;
    return out;
}

static int spawn(struct h_proc *p, const char *bin, const char *const *args)
{
    const char *a[40];
    return h_spawn(p, bin, with_quiet(a, args), 20000);
}

static void teardown(void)
{
    h_cleanup_all();
}

/* ---- Flags -------------------------------------------------------------- */

static void test_flags(void)
{
    const char *help[] = {"--help", NULL};
    const char *version[] = {"--version", NULL};
    const char *unknown[] = {"--bogus", NULL};
    const char *bad_int[] = {"--block-size", "0", NULL};
    const char *bad_choice[] = {"--backend", "gpu", NULL};
    const char *bad_model[] = {"--backend", "sim", "--model", "llama-0", NULL};
    const char *bad_payload[] = {"--payload", "1/0", NULL};
    const char *tiny_payload[] = {"--payload", "none", NULL};
    const char *both[] = {"--kv-blocks", "10", "--kv-memory", "1MiB", NULL};
    const char *colocated_p[] = {"--colocated", NULL};
    CU_ASSERT_EQUAL(h_run("tandem-decode", help, 10000, 0), 0);
    CU_ASSERT_EQUAL(h_run("tandem-prefill", help, 10000, 0), 0);
    CU_ASSERT_EQUAL(h_run("tandem-decode", version, 10000, 0), 0);
    CU_ASSERT_EQUAL(h_run("tandem-prefill", unknown, 10000, 0), 2);
    CU_ASSERT_EQUAL(h_run("tandem-decode", bad_int, 10000, 0), 2);
    CU_ASSERT_EQUAL(h_run("tandem-decode", bad_choice, 10000, 0), 2);
    CU_ASSERT_EQUAL(h_run("tandem-decode", bad_model, 10000, 0), 2);
    CU_ASSERT_EQUAL(h_run("tandem-decode", bad_payload, 10000, 0), 2);
    CU_ASSERT_EQUAL(h_run("tandem-decode", tiny_payload, 10000, 0), 2);
    CU_ASSERT_EQUAL(h_run("tandem-decode", both, 10000, 0), 2);
    /* --colocated is a decode-worker flag only. */
    CU_ASSERT_EQUAL(h_run("tandem-prefill", colocated_p, 10000, 0), 2);
}

/* ---- Hello, heartbeats, HTTP -------------------------------------------- */

struct seen {
    int hellos, heartbeats, events, stored;
    double first_hb, last_hb, max_gap;
    char hello_id[128];
    int hello_role;
    char hello_control[H_URL_MAX];
    uint32_t hello_blocks;
};

static void on_other(void *arg, nng_socket s, const Tandem__Envelope *env)
{
    struct seen *z = arg;
    (void)s;
    double now = h_ms();
    if (env->kind == TANDEM__ENVELOPE__KIND__HELLO) {
        z->hellos++;
        snprintf(z->hello_id, sizeof(z->hello_id), "%s", env->hello->worker_id);
        snprintf(z->hello_control, sizeof(z->hello_control), "%s", env->hello->control_address);
        z->hello_role = env->hello->role;
        z->hello_blocks = env->hello->kv_blocks_total;
    } else if (env->kind == TANDEM__ENVELOPE__KIND__HEARTBEAT) {
        if (z->heartbeats > 0 && now - z->last_hb > z->max_gap) {
            z->max_gap = now - z->last_hb;
        }
        if (z->heartbeats == 0) {
            z->first_hb = now;
        }
        z->last_hb = now;
        z->heartbeats++;
    } else if (env->kind == TANDEM__ENVELOPE__KIND__KV_EVENTS) {
        z->events++;
        for (size_t i = 0; i < env->kv_events->n_events; i++) {
            if (env->kv_events->events[i]->kind == TANDEM__KV_EVENT__KIND__STORED) {
                z->stored += (int)env->kv_events->events[i]->n_block_hashes;
            }
        }
    }
}

/* Receives, handing everything to on_other, until done(z) holds or
 * TIMEOUT_MS (a hang). Returns 1 when done(z) held. */
static int listen_until(nng_socket s, struct seen *z, int (*done)(const struct seen *))
{
    double end = h_ms() + TIMEOUT_MS;
    while (!done(z)) {
        if (h_ms() >= end) {
            return 0;
        }
        Tandem__Envelope *env;
        nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 20);
        if (wire_recv(s, 0, &env) == 0) {
            on_other(z, s, env);
            wire_free(env);
        }
    }
    return 1;
}

static int four_heartbeats(const struct seen *z)
{
    return z->heartbeats >= 4;
}

/* The request's two blocks were reported, and two heartbeats came after its
 * Finish: the second left in a later loop iteration than the request's last
 * step, so every KV event of that step was flushed before it. */
static int stored_and_flushed(const struct seen *z)
{
    return z->stored >= 2 && z->heartbeats >= 2;
}

/* The snapshot a new connection gets is one KvEvents message. */
static int got_events(const struct seen *z)
{
    return z->events >= 1;
}

static void test_hello_heartbeat_http(void)
{
    struct h_proc d;
    char ctl[H_URL_MAX], kv[H_URL_MAX];
    h_ipc_url(ctl, sizeof(ctl), "basics-ctl");
    h_ipc_url(kv, sizeof(kv), "basics-kv");
    const char *args[] = {"--colocated", "--id", "colo-1",      "--control", ctl,
                          "--kv",        kv,     "--kv-blocks", "300",       NULL};
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", args) == 0);
    CU_ASSERT_STRING_EQUAL(d.id, "colo-1");
    CU_ASSERT_STRING_EQUAL(d.role, "colocated");
    CU_ASSERT_STRING_EQUAL(d.control, ctl);
    CU_ASSERT_STRING_EQUAL(d.kv, kv);
    CU_ASSERT(d.metrics_port > 0);
    CU_ASSERT_EQUAL(access(ctl + 6, F_OK), 0);

    nng_socket s;
    Tandem__Envelope *hello;
    CU_ASSERT_FATAL(ctl_dial_hello(&s, d.control, &hello) == 0);
    struct seen z = {0};
    on_other(&z, s, hello);
    wire_free(hello);
    double t0 = h_ms();
    CU_ASSERT(listen_until(s, &z, four_heartbeats));
    CU_ASSERT_EQUAL(z.hellos, 1);
    CU_ASSERT_STRING_EQUAL(z.hello_id, "colo-1");
    CU_ASSERT_STRING_EQUAL(z.hello_control, ctl);
    CU_ASSERT_EQUAL(z.hello_role, TANDEM__WORKER_HELLO__ROLE__COLOCATED);
    CU_ASSERT_EQUAL(z.hello_blocks, 300);
    CU_ASSERT_EQUAL(z.heartbeats, 4); /* every 250 ms by default */
    printf("\n  heartbeats: 4 in %.0f ms, largest gap %.0f ms\n", h_ms() - t0, z.max_gap);

    char *body = NULL;
    CU_ASSERT_EQUAL(h_http_get(d.metrics_port, "/health", &body), 200);
    CU_ASSERT_STRING_EQUAL(body, "ok\n");
    free(body);
    CU_ASSERT_EQUAL(h_http_get(d.metrics_port, "/nope", &body), 404);
    free(body);
    CU_ASSERT_EQUAL(h_http_get(d.metrics_port, "/metrics", &body), 200);
    CU_ASSERT(h_metric(body, "tandem:kv_capacity_blocks") == 300);
    CU_ASSERT(h_metric(body, "tandem:kv_blocks{state=\"free\"}") == 300);
    CU_ASSERT(h_metric(body, "vllm:num_requests_running{model_name=\"tiny\"}") == 0);
    CU_ASSERT(strstr(body, "tandem:worker_info{id=\"colo-1\",role=\"colocated\"") != NULL);
    free(body);

    /* A request stores blocks: KV events arrive, with the hashes. */
    uint32_t prompt[40];
    h_prompt(prompt, 40, 7, 3, 259);
    struct ctl_job job;
    ctl_job_init(&job);
    job.prompt = prompt;
    job.n_prompt = 40;
    job.max_tokens = 8;
    job.ignore_eos = 1;
    struct ctl_item it = {.sock = s, .id = 11, .job = &job};
    z.events = z.stored = 0;
    CU_ASSERT_EQUAL(ctl_run_many(&it, 1, TIMEOUT_MS, on_other, &z), 0);
    z.heartbeats = 0;
    CU_ASSERT(listen_until(s, &z, stored_and_flushed));
    CU_ASSERT_EQUAL(it.stream.n_tokens, 8);
    CU_ASSERT_EQUAL(it.stream.finish_reason, TANDEM__FINISH__REASON__LENGTH);
    CU_ASSERT(z.events >= 1);
    CU_ASSERT_EQUAL(z.stored, 2); /* KV of 40 + 8 - 1 positions: 2 full blocks */
    ctl_stream_fini(&it.stream);

    /* A new router connection gets a snapshot of the cache. */
    h_nng_close(s);
    CU_ASSERT_FATAL(ctl_dial_hello(&s, d.control, &hello) == 0);
    memset(&z, 0, sizeof(z));
    on_other(&z, s, hello);
    wire_free(hello);
    CU_ASSERT(listen_until(s, &z, got_events));
    CU_ASSERT_EQUAL(z.hellos, 1);
    CU_ASSERT_EQUAL(z.stored, 2);
    h_nng_close(s);

    CU_ASSERT_EQUAL(h_kv_invariant(&d, NULL), 0);
    CU_ASSERT_EQUAL(h_stop(&d, SIGTERM, 10000), 0);
    /* The worker removed its ipc files. */
    CU_ASSERT_NOT_EQUAL(access(ctl + 6, F_OK), 0);
    CU_ASSERT_NOT_EQUAL(access(kv + 6, F_OK), 0);
}

/* ---- One request each way, against the engine --------------------------- */

static void run_and_compare(nng_socket s, const char *prefill, const uint32_t *prompt, int n,
                            const uint32_t *want, int max_tokens, uint64_t id)
{
    struct ctl_job job;
    ctl_job_init(&job);
    job.prompt = prompt;
    job.n_prompt = n;
    job.max_tokens = (uint32_t)max_tokens;
    job.ignore_eos = 1;
    job.logprobs = 2;
    job.prefill_address = prefill;
    struct ctl_stream st;
    CU_ASSERT_EQUAL(ctl_run(s, id, &job, TIMEOUT_MS, &st), 0);
    CU_ASSERT_EQUAL(st.bad, 0);
    CU_ASSERT_EQUAL(st.error_code, 0);
    CU_ASSERT_EQUAL(st.first_index, 0);
    CU_ASSERT_EQUAL_FATAL(st.n_tokens, max_tokens);
    CU_ASSERT_EQUAL(memcmp(st.tokens, want, (size_t)max_tokens * sizeof(*want)), 0);
    CU_ASSERT_EQUAL(st.finish_reason, TANDEM__FINISH__REASON__LENGTH);
    CU_ASSERT_EQUAL(st.prompt_tokens, (uint32_t)n);
    CU_ASSERT_EQUAL(st.completion_tokens, (uint32_t)max_tokens);
    for (int i = 0; i < st.n_tokens; i++) {
        CU_ASSERT_EQUAL(st.n_top[i], 2);
        CU_ASSERT(st.logprobs[i] <= 0.0f);
        /* Greedy: the chosen token is the most likely alternative, with
         * the same logprob, bit for bit; the next is no more likely. */
        CU_ASSERT_EQUAL(st.top[i * CTL_MAX_TOP].token, st.tokens[i]);
        CU_ASSERT_EQUAL(st.top[i * CTL_MAX_TOP].logprob, st.logprobs[i]);
        CU_ASSERT(st.top[i * CTL_MAX_TOP + 1].logprob <= st.top[i * CTL_MAX_TOP].logprob);
        CU_ASSERT(st.top[i * CTL_MAX_TOP + 1].token != st.tokens[i]);
    }
    ctl_stream_fini(&st);
}

static void test_one_request_each_way(void)
{
    const int n = 100, max_tokens = 12;
    uint32_t prompt[100], want[12];
    h_prompt(prompt, n, 42, 3, 259);
    const uint32_t *pp[] = {prompt};
    CU_ASSERT_FATAL(h_reference(pp, &n, 1, max_tokens, want) == 0);

    struct h_proc colo, p, d, p2, d2;
    const char *colo_args[] = {"--colocated", NULL};
    CU_ASSERT_FATAL(spawn(&colo, "tandem-decode", colo_args) == 0);
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", NULL) == 0);
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", NULL) == 0);
    CU_ASSERT_STRING_EQUAL(p.role, "prefill");
    CU_ASSERT_STRING_EQUAL(d.role, "decode");
    CU_ASSERT(strncmp(d.control, "tcp://127.0.0.1:", 16) == 0);
    char c1[H_URL_MAX], k1[H_URL_MAX], c2[H_URL_MAX], k2[H_URL_MAX];
    h_ipc_url(c1, sizeof(c1), "p2-ctl");
    h_ipc_url(k1, sizeof(k1), "p2-kv");
    h_ipc_url(c2, sizeof(c2), "d2-ctl");
    h_ipc_url(k2, sizeof(k2), "d2-kv");
    const char *p2_args[] = {"--control", c1, "--kv", k1, NULL};
    const char *d2_args[] = {"--control", c2, "--kv", k2, NULL};
    CU_ASSERT_FATAL(spawn(&p2, "tandem-prefill", p2_args) == 0);
    CU_ASSERT_FATAL(spawn(&d2, "tandem-decode", d2_args) == 0);

    nng_socket sc, sd, sd2;
    CU_ASSERT_FATAL(ctl_dial(&sc, colo.control, 0) == 0);
    CU_ASSERT_FATAL(ctl_dial(&sd, d.control, 0) == 0);
    CU_ASSERT_FATAL(ctl_dial(&sd2, d2.control, 0) == 0);
    run_and_compare(sc, NULL, prompt, n, want, max_tokens, 1);
    run_and_compare(sd, p.kv, prompt, n, want, max_tokens, 2);   /* tcp */
    run_and_compare(sd2, p2.kv, prompt, n, want, max_tokens, 3); /* ipc */
    run_and_compare(sd, NULL, prompt, n, want, max_tokens, 4);   /* selective: local */

    /* KV moved: P sent 7 blocks (6 full + 1 partial), D installed them. */
    CU_ASSERT_EQUAL(h_proc_metric(&p, "tandem:kv_frames_sent_total"), 7);
    CU_ASSERT_EQUAL(h_proc_metric(&d, "tandem:kv_frames_installed_total"), 7);
    CU_ASSERT_EQUAL(h_proc_metric(&d, "tandem:kv_bytes_received_total"), 7 * 131072);
    CU_ASSERT_EQUAL(h_proc_metric(&d, "tandem:kv_transfer_seconds_count"), 1);
    struct h_proc *all[] = {&colo, &p, &d, &p2, &d2};
    for (int i = 0; i < 5; i++) {
        double used = -1;
        CU_ASSERT_EQUAL(h_kv_invariant(all[i], &used), 0);
        CU_ASSERT_EQUAL(used, 0);
    }
    h_nng_close(sc);
    h_nng_close(sd);
    h_nng_close(sd2);
    for (int i = 0; i < 5; i++) {
        CU_ASSERT_EQUAL(h_stop(all[i], SIGTERM, 10000), 0);
    }
}

/* ---- Busy, recovery, logprobs, errors ----------------------------------- */

static void test_busy_recovery_errors(void)
{
    struct h_proc d, p;
    /* One running + one waiting at most; 40 blocks of 16 tokens. */
    const char *args[] = {"--max-running", "1", "--max-waiting", "1", "--kv-blocks", "40", NULL};
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", args) == 0);
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", NULL) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);

    uint32_t prompt[64];
    h_prompt(prompt, 64, 5, 3, 259);
    struct ctl_job job;
    ctl_job_init(&job);
    job.prompt = prompt;
    job.n_prompt = 64;
    job.max_tokens = 200;
    job.ignore_eos = 1;
    struct ctl_item items[3];
    for (int i = 0; i < 3; i++) {
        items[i] = (struct ctl_item){.sock = s, .id = 100 + (uint64_t)i, .job = &job};
    }
    CU_ASSERT_EQUAL(ctl_run_many(items, 3, TIMEOUT_MS, NULL, NULL), 0);
    int busy = 0, done = 0;
    for (int i = 0; i < 3; i++) {
        if (items[i].stream.busy) {
            busy++;
            CU_ASSERT_EQUAL(items[i].stream.busy_reason, TANDEM__BUSY__REASON__TOO_MANY_SEQS);
            CU_ASSERT_EQUAL(items[i].stream.n_tokens, 0);
        } else {
            done += items[i].stream.n_tokens == 200;
        }
        ctl_stream_fini(&items[i].stream);
    }
    CU_ASSERT_EQUAL(busy, 1);
    CU_ASSERT_EQUAL(done, 2);

    /* No blocks for the disaggregated reservation: Busy NO_KV_BLOCKS. A
     * runs and holds blocks; B needs 38 of the 40 for its prompt. */
    job.max_tokens = 400;
    CU_ASSERT_FATAL(ctl_send_job(s, 150, &job, 0) == 0);
    for (double end = h_ms() + TIMEOUT_MS; h_ms() < end;) {
        Tandem__Envelope *env;
        if (wire_recv(s, 0, &env) == 0) {
            int first = env->request_id == 150 && env->kind == TANDEM__ENVELOPE__KIND__TOKEN_CHUNK;
            wire_free(env);
            if (first) {
                break;
            }
        }
    }
    uint32_t big[600];
    h_prompt(big, 600, 9, 3, 259);
    job.prompt = big;
    job.n_prompt = 600;
    job.max_tokens = 4;
    job.prefill_address = p.kv;
    struct ctl_stream st;
    CU_ASSERT_EQUAL(ctl_run(s, 200, &job, TIMEOUT_MS, &st), 0);
    CU_ASSERT_EQUAL(st.busy, 1);
    CU_ASSERT_EQUAL(st.busy_reason, TANDEM__BUSY__REASON__NO_KV_BLOCKS);
    ctl_stream_fini(&st);
    CU_ASSERT_EQUAL(ctl_send_cancel(s, 150, 0), 0);
    for (double end = h_ms() + TIMEOUT_MS; h_ms() < end;) {
        Tandem__Envelope *env;
        if (wire_recv(s, 0, &env) == 0) {
            int fin = env->request_id == 150 && env->kind == TANDEM__ENVELOPE__KIND__FINISH;
            if (fin) {
                CU_ASSERT_EQUAL(env->finish->reason, TANDEM__FINISH__REASON__CANCELLED);
            }
            wire_free(env);
            if (fin) {
                break;
            }
        }
    }

    /* Recovery: given the first 5 tokens, the worker continues at index 5
     * with what an undisturbed run gives (prefilled locally, even with a P). */
    const int n = 64, total = 12;
    uint32_t want[12];
    const uint32_t *pp[] = {prompt};
    CU_ASSERT_FATAL(h_reference(pp, &n, 1, total, want) == 0);
    job.prompt = prompt;
    job.n_prompt = n;
    job.max_tokens = total;
    job.generated = want;
    job.n_generated = 5;
    CU_ASSERT_EQUAL(ctl_run(s, 201, &job, TIMEOUT_MS, &st), 0);
    CU_ASSERT_EQUAL(st.first_index, 5);
    CU_ASSERT_EQUAL_FATAL(st.n_tokens, total - 5);
    CU_ASSERT_EQUAL(memcmp(st.tokens, want + 5, (size_t)(total - 5) * sizeof(*want)), 0);
    CU_ASSERT_EQUAL(st.completion_tokens, (uint32_t)total);
    ctl_stream_fini(&st);
    job.generated = NULL;
    job.n_generated = 0;

    /* Bad requests: Error then Finish(ERROR). */
    uint32_t bad[3] = {1, 9999, 2};
    job.prompt = bad;
    job.n_prompt = 3;
    CU_ASSERT_EQUAL(ctl_run(s, 202, &job, TIMEOUT_MS, &st), 0);
    CU_ASSERT_EQUAL(st.error_code, TANDEM_EINVAL);
    CU_ASSERT_EQUAL(st.finish_reason, TANDEM__FINISH__REASON__ERROR);
    ctl_stream_fini(&st);
    job.prompt = prompt;
    job.n_prompt = 64;
    job.prefill_address = "bogus://nowhere";
    CU_ASSERT_EQUAL(ctl_run(s, 203, &job, TIMEOUT_MS, &st), 0);
    CU_ASSERT_EQUAL(st.error_code, TANDEM_EINVAL);
    CU_ASSERT_EQUAL(st.finish_reason, TANDEM__FINISH__REASON__ERROR);
    ctl_stream_fini(&st);

    /* Prompt logprobs and their 3 alternatives, colocated and through P:
     * the engine's, bit for bit. */
    job.prefill_address = NULL;
    job.prompt_logprobs = 1;
    job.logprobs = 3;
    job.max_tokens = 3;
    float ref_plp[63];
    struct ctl_top ref_top[63 * CTL_MAX_TOP];
    uint32_t ref_ids[3];
    struct h_ref_req rr = {.prompt = prompt,
                           .n_prompt = 64,
                           .max_tokens = 3,
                           .ids = ref_ids,
                           .prompt_top = 3,
                           .plp = ref_plp,
                           .plp_top = ref_top};
    CU_ASSERT_FATAL(h_reference_run(&rr, 1) == 0);
    struct ctl_stream a, b;
    CU_ASSERT_EQUAL(ctl_run(s, 204, &job, TIMEOUT_MS, &a), 0);
    job.prefill_address = p.kv;
    CU_ASSERT_EQUAL(ctl_run(s, 205, &job, TIMEOUT_MS, &b), 0);
    CU_ASSERT_EQUAL(a.n_prompt_logprobs, 63);
    CU_ASSERT_EQUAL(b.n_prompt_logprobs, 63);
    CU_ASSERT_EQUAL(a.bad + b.bad, 0);
    const struct ctl_stream *ab[] = {&a, &b};
    for (int k = 0; k < 2; k++) {
        const struct ctl_stream *x = ab[k];
        if (x->n_prompt_logprobs != 63) {
            continue;
        }
        CU_ASSERT_EQUAL(memcmp(x->prompt_logprobs, ref_plp, sizeof(ref_plp)), 0);
        int tops_equal = 1;
        for (int i = 0; i < 63; i++) {
            tops_equal &= x->n_prompt_top[i] == 3;
            for (int j = 0; j < 3 && tops_equal; j++) {
                const struct ctl_top *g = &x->prompt_top[i * CTL_MAX_TOP + j];
                const struct ctl_top *w = &ref_top[i * CTL_MAX_TOP + j];
                tops_equal &= g->token == w->token && g->logprob == w->logprob;
            }
        }
        CU_ASSERT(tops_equal);
    }
    job.logprobs = 0;
    CU_ASSERT_EQUAL(a.n_tokens, 3);
    CU_ASSERT_EQUAL(b.n_tokens, 3);
    ctl_stream_fini(&a);
    ctl_stream_fini(&b);

    /* A prefill worker refuses decode jobs. */
    nng_socket sp;
    CU_ASSERT_FATAL(ctl_dial(&sp, p.control, 0) == 0);
    job.prompt_logprobs = 0;
    CU_ASSERT_EQUAL(ctl_run(sp, 206, &job, TIMEOUT_MS, &st), 0);
    CU_ASSERT_EQUAL(st.error_code, TANDEM_EUNSUPPORTED);
    CU_ASSERT_EQUAL(st.finish_reason, TANDEM__FINISH__REASON__ERROR);
    ctl_stream_fini(&st);

    double used;
    CU_ASSERT_EQUAL(h_kv_invariant(&d, &used), 0);
    CU_ASSERT_EQUAL(used, 0);
    CU_ASSERT_EQUAL(h_kv_invariant(&p, &used), 0);
    CU_ASSERT_EQUAL(used, 0);
    h_nng_close(s);
    h_nng_close(sp);
    CU_ASSERT_EQUAL(h_stop(&d, SIGTERM, 10000), 0);
    CU_ASSERT_EQUAL(h_stop(&p, SIGTERM, 10000), 0);
}

/* ---- sim ---------------------------------------------------------------- */

static void test_sim_backend(void)
{
    struct h_proc p, d, colo;
    const char *sim[] = {"--backend",    "sim",  "--model",   "llama-3-8b",
                         "--time-scale", "0",    "--payload", "1/64",
                         "--kv-blocks",  "4096", NULL};
    const char *sim_colo[] = {"--backend",    "sim",  "--model",     "llama-3-8b",
                              "--time-scale", "0",    "--payload",   "1/64",
                              "--kv-blocks",  "4096", "--colocated", NULL};
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", sim) == 0);
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", sim) == 0);
    CU_ASSERT_FATAL(spawn(&colo, "tandem-decode", sim_colo) == 0);
    nng_socket s, sc;
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);
    CU_ASSERT_FATAL(ctl_dial(&sc, colo.control, 0) == 0);
    uint32_t prompt[1000];
    h_prompt(prompt, 1000, 3, 1000, 100000);
    struct ctl_job job;
    ctl_job_init(&job);
    job.prompt = prompt;
    job.n_prompt = 1000;
    job.max_tokens = 20;
    job.has_seed = 1;
    job.seed = 77;
    job.prefill_address = p.kv;
    struct ctl_stream a, b;
    CU_ASSERT_EQUAL(ctl_run(s, 1, &job, TIMEOUT_MS, &a), 0);
    job.prefill_address = NULL;
    CU_ASSERT_EQUAL(ctl_run(sc, 2, &job, TIMEOUT_MS, &b), 0);
    CU_ASSERT_EQUAL_FATAL(a.n_tokens, 20);
    CU_ASSERT_EQUAL_FATAL(b.n_tokens, 20);
    CU_ASSERT_EQUAL(memcmp(a.tokens, b.tokens, 20 * sizeof(uint32_t)), 0);
    ctl_stream_fini(&a);
    ctl_stream_fini(&b);
    /* 63 blocks of llama-3-8b bf16 at 1/64: 2 MiB / 64 = 32 KiB each. */
    CU_ASSERT_EQUAL(h_proc_metric(&d, "tandem:kv_frames_installed_total"), 63);
    CU_ASSERT_EQUAL(h_proc_metric(&d, "tandem:kv_bytes_received_total"), 63 * 32768);
    /* Prompt logprobs are refused by the sim backend. */
    job.prompt_logprobs = 1;
    CU_ASSERT_EQUAL(ctl_run(sc, 3, &job, TIMEOUT_MS, &a), 0);
    CU_ASSERT_EQUAL(a.error_code, TANDEM_EUNSUPPORTED);
    CU_ASSERT_EQUAL(a.finish_reason, TANDEM__FINISH__REASON__ERROR);
    ctl_stream_fini(&a);
    struct h_proc *all[] = {&p, &d, &colo};
    for (int i = 0; i < 3; i++) {
        double used = -1;
        CU_ASSERT_EQUAL(h_kv_invariant(all[i], &used), 0);
        CU_ASSERT_EQUAL(used, 0);
    }
    h_nng_close(s);
    h_nng_close(sc);
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(h_stop(all[i], SIGTERM, 10000), 0);
    }
}

/* The least the sim model lets a hand-off of an n-token prompt take, in
 * modelled seconds: P's prefill of the prompt in one step (the sim's
 * default token budget holds it; chunking would only add) and the transfer
 * of its full blocks at full precision (2 MiB each for llama-3-8b bf16) over
 * link. Same presets and defaults as the workers (sim_default_config). */
static double modelled_handoff(const char *model, const char *link, const uint32_t *prompt, int n,
                               double *step_s)
{
    struct sim_config cfg;
    sim_default_config(&cfg);
    cfg.model = model;
    cfg.link = link;
    cfg.time_scale = 0; /* model only */
    struct backend *be = NULL;
    CU_ASSERT_FATAL(sim_create(&be, &cfg) == 0);
    struct be_seq seq = {.blocks = NULL, .pos = 0, .history = prompt, .seed = 1};
    struct be_out out;
    CU_ASSERT_EQUAL(be->ops->prefill(be, NULL, &seq, prompt, n, &out, NULL), 0);
    be->ops->step_end(be);
    *step_s = sim_last_step_seconds(be);
    struct kv_config kc = {.n_layers = be->info.n_layers,
                           .n_kv_heads = be->info.n_kv_heads,
                           .head_dim = be->info.head_dim,
                           .block_size = 16,
                           .dtype = KV_DTYPE_BF16,
                           .n_blocks = 1};
    double link_s = sim_transfer_seconds(be, (uint64_t)(n / 16) * kv_config_block_bytes(&kc));
    be->ops->destroy(be);
    return *step_s + link_s;
}

/* The sim link model: P releases each chunk's frames when the chunk's
 * modelled compute is over, paced by the link's bandwidth and latency. */
static void test_sim_link_model(void)
{
    struct h_proc slow, fast, d;
    const char *slow_args[] = {"--backend", "sim",    "--model", "llama-3-8b", "--payload",
                               "none",      "--link", "tcp-25g", NULL};
    const char *fast_args[] = {"--backend", "sim",    "--model", "llama-3-8b", "--payload",
                               "none",      "--link", "nvlink",  NULL};
    const char *d_args[] = {"--backend", "sim",         "--model", "llama-3-8b", "--payload",
                            "none",      "--kv-blocks", "2048",    NULL};
    CU_ASSERT_FATAL(spawn(&slow, "tandem-prefill", slow_args) == 0);
    CU_ASSERT_FATAL(spawn(&fast, "tandem-prefill", fast_args) == 0);
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", d_args) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);
    /* 2048 tokens: one 2048-token chunk (about 66 ms modelled on an H100),
     * then 128 blocks of 2 MiB: 86 ms on tcp-25g, 0.6 ms on NVLink. */
    static uint32_t prompt[2048];
    const char *names[] = {"tcp-25g", "nvlink"};
    const struct h_proc *ps[] = {&slow, &fast};
    double took[2], least[2];
    for (int i = 0; i < 2; i++) {
        h_prompt(prompt, 2048, 50 + (uint64_t)i, 1000, 100000);
        double step_s;
        least[i] = modelled_handoff("llama-3-8b", names[i], prompt, 2048, &step_s);
        struct ctl_job job;
        ctl_job_init(&job);
        job.prompt = prompt;
        job.n_prompt = 2048;
        job.max_tokens = 2;
        job.prefill_address = ps[i]->kv;
        double before = h_proc_metric(&d, "tandem:kv_transfer_seconds_sum");
        struct ctl_stream st;
        CU_ASSERT_EQUAL(ctl_run(s, 300 + (uint64_t)i, &job, TIMEOUT_MS, &st), 0);
        CU_ASSERT_EQUAL(st.n_tokens, 2);
        ctl_stream_fini(&st);
        took[i] = h_proc_metric(&d, "tandem:kv_transfer_seconds_sum") - before;
        printf("\n  sim llama-3-8b, 2048-token prompt over %s: KV transfer %.1f ms (modelled: "
               "%.1f ms step + %.1f ms link)",
               names[i], took[i] * 1e3, step_s * 1e3, (least[i] - step_s) * 1e3);
    }
    printf("\n");
    /* D measures from sending the job; P sleeps until its step's modelled end
     * (an absolute deadline), then holds each frame until the modelled link
     * has carried it (released on uv_hrtime, never early). So the measured
     * time cannot be below the model; 1 us covers the nanosecond roundings. */
    CU_ASSERT(least[0] > 0.150);                     /* 66 ms of compute, 86 ms of tcp-25g */
    CU_ASSERT(least[1] > 0.065 && least[1] < 0.075); /* NVLink: 0.6 ms */
    for (int i = 0; i < 2; i++) {
        if (took[i] < least[i] - 1e-6) {
            printf("  %s: %.6f s measured, below the modelled %.6f s\n", names[i], took[i],
                   least[i]);
        }
        CU_ASSERT(took[i] >= least[i] - 1e-6);
    }
    h_nng_close(s);
    CU_ASSERT_EQUAL(h_stop(&slow, SIGTERM, 10000), 0);
    CU_ASSERT_EQUAL(h_stop(&fast, SIGTERM, 10000), 0);
    CU_ASSERT_EQUAL(h_stop(&d, SIGTERM, 10000), 0);
}

/* ---- Timed sim steps ------------------------------------------------------ */

/* Receives on s until stream st has at least want tokens or is done, feeding
 * every envelope to the streams of sts[0..n). Returns 0, or -1 on a timeout. */
static int recv_until(nng_socket s, struct ctl_stream *sts, int n, struct ctl_stream *st, int want)
{
    double deadline = h_ms() + TIMEOUT_MS;
    while (st->n_tokens < want && !st->done) {
        int left = (int)(deadline - h_ms());
        nng_msg *msg;
        nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, left > 0 ? left : 0);
        if (left <= 0 || nng_recvmsg(s, &msg, 0) != 0) {
            return -1;
        }
        Tandem__Envelope *env;
        int rc = wire_unpack(nng_msg_body(msg), nng_msg_len(msg), &env);
        nng_msg_free(msg);
        for (int i = 0; rc == 0 && i < n; i++) {
            ctl_stream_feed(&sts[i], env);
        }
        if (rc == 0) {
            wire_free(env);
        }
    }
    return 0;
}

static double steps_ended(const struct h_proc *p)
{
    return h_proc_metric(p, "tandem:step_modelled_seconds_count");
}

/* A sim worker at time_scale > 0 computes a step at once and ends it on a
 * timer at its modelled end; meanwhile it takes what arrives (and answers
 * /metrics), and what arrived reaches the scheduler at the step's end, for
 * the next step, as in the offline simulator. Counted in steps ended
 * (tandem:step_modelled_seconds_count), not in milliseconds: a decode step
 * of llama-3-8b (about 8 ms modelled) lasts about 0.4 s at time_scale 50. */
static void test_sim_timed_steps(void)
{
    struct h_proc w;
    const char *args[] = {"--backend",    "sim", "--model",     "llama-3-8b", "--payload",   "none",
                          "--time-scale", "50",  "--kv-blocks", "4096",       "--colocated", NULL};
    CU_ASSERT_FATAL(spawn(&w, "tandem-decode", args) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, w.control, 0) == 0);
    uint32_t pa[32], pb[32], pc[32];
    h_prompt(pa, 32, 7, 1000, 100000);
    h_prompt(pb, 32, 8, 1000, 100000);
    h_prompt(pc, 32, 9, 1000, 100000);
    struct ctl_job a, b, c;
    ctl_job_init(&a);
    a.prompt = pa;
    a.n_prompt = 32;
    a.max_tokens = 8;
    b = a;
    b.prompt = pb;
    b.max_tokens = 2;
    c = a;
    c.prompt = pc;
    c.max_tokens = 100;
    struct ctl_stream sts[3];
    for (int i = 0; i < 3; i++) {
        ctl_stream_init(&sts[i], 1 + (uint64_t)i);
    }
    /* A and C run; A's second token ends step 2, and step 3 has begun. */
    CU_ASSERT_FATAL(ctl_send_job(s, 1, &a, 0) == 0);
    CU_ASSERT_FATAL(ctl_send_job(s, 3, &c, 0) == 0);
    CU_ASSERT_FATAL(recv_until(s, sts, 3, &sts[0], 2) == 0);
    h_sleep_ms(50);
    /* Mid-step: /metrics answers, and B and the cancel of C are taken now. */
    double before = steps_ended(&w);
    CU_ASSERT_FATAL(ctl_send_job(s, 2, &b, 0) == 0);
    CU_ASSERT_FATAL(ctl_send_cancel(s, 3, 0) == 0);
    int c_before = sts[2].n_tokens;
    double sent = steps_ended(&w);
    CU_ASSERT_EQUAL(sent, before); /* still the same step (it lasts 0.4 s) */
    CU_ASSERT_FATAL(recv_until(s, sts, 3, &sts[1], 1) == 0);
    double first_b = steps_ended(&w);
    CU_ASSERT_FATAL(recv_until(s, sts, 3, &sts[2], INT32_MAX) == 0);
    /* B's first token ends the step after the one it arrived in. */
    printf("\n  steps ended: %.0f when B was sent, %.0f at its first token\n", sent, first_b);
    CU_ASSERT_EQUAL(first_b, sent + 2);
    /* C: the running step's token, then the cancel at that step's end. */
    CU_ASSERT_EQUAL(sts[2].finish_reason, TANDEM__FINISH__REASON__CANCELLED);
    CU_ASSERT_EQUAL(sts[2].n_tokens, c_before + 1);
    CU_ASSERT_FATAL(recv_until(s, sts, 3, &sts[0], INT32_MAX) == 0);
    CU_ASSERT_FATAL(recv_until(s, sts, 3, &sts[1], INT32_MAX) == 0);
    CU_ASSERT_EQUAL(sts[0].n_tokens, 8);
    CU_ASSERT_EQUAL(sts[1].n_tokens, 2);
    /* Every timed step is counted three times; the overrun is what the wall
     * time adds to the modelled one (never negative: the end never fires
     * early), the idle gap was seen between steps. */
    char *body = NULL;
    CU_ASSERT_EQUAL_FATAL(h_http_get(w.metrics_port, "/metrics", &body), 200);
    double n = h_metric(body, "tandem:step_modelled_seconds_count");
    double modelled = h_metric(body, "tandem:step_modelled_seconds_sum");
    double wall = h_metric(body, "tandem:step_wall_seconds_sum");
    double over = h_metric(body, "tandem:step_overrun_seconds_sum");
    printf("  %.0f steps: modelled %.3f s, wall %.3f s, overrun %.3f s\n", n, modelled, wall, over);
    CU_ASSERT(n >= 8);
    CU_ASSERT_EQUAL(h_metric(body, "tandem:step_wall_seconds_count"), n);
    CU_ASSERT_EQUAL(h_metric(body, "tandem:step_overrun_seconds_count"), n);
    CU_ASSERT(modelled > n * 0.3); /* about 0.4 s each */
    CU_ASSERT(over >= 0);
    CU_ASSERT_DOUBLE_EQUAL(wall - modelled, over, 1e-6);
    CU_ASSERT(h_metric(body, "tandem:step_idle_gap_seconds_count") >= 1);
    free(body);
    for (int i = 0; i < 3; i++) {
        ctl_stream_fini(&sts[i]);
    }
    h_nng_close(s);
    CU_ASSERT_EQUAL(h_stop(&w, SIGTERM, 10000), 0);
}

/* --router: the worker pushes its WorkerHello to the announce address every
 * second, and keeps doing so after the router (re)appears. */
static void test_announce(void)
{
    char announce[H_URL_MAX];
    h_ipc_url(announce, sizeof(announce), "announce");
    struct h_proc d;
    const char *args[] = {"--id", "ann-1", "--router", announce, NULL};
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", args) == 0);
    h_sleep_ms(1200); /* nobody listens yet: nothing must pile up or block */
    nng_socket pull;
    CU_ASSERT_FATAL(nng_pull0_open(&pull) == 0);
    CU_ASSERT_FATAL(wire_socket_setup(pull, WIRE_LINK_CONTROL) == 0);
    nng_socket_set_ms(pull, NNG_OPT_RECVTIMEO, 100);
    CU_ASSERT_FATAL(nng_listen(pull, announce, NULL, 0) == 0);
    int hellos = 0;
    double t0 = h_ms();
    while (hellos < 2 && h_ms() - t0 < TIMEOUT_MS) {
        Tandem__Envelope *env;
        if (wire_recv(pull, 0, &env) == 0) {
            CU_ASSERT_EQUAL(env->kind, TANDEM__ENVELOPE__KIND__HELLO);
            if (env->kind == TANDEM__ENVELOPE__KIND__HELLO) {
                CU_ASSERT_STRING_EQUAL(env->hello->worker_id, "ann-1");
                CU_ASSERT_STRING_EQUAL(env->hello->control_address, d.control);
                CU_ASSERT_STRING_EQUAL(env->hello->kv_address, d.kv);
                CU_ASSERT_STRING_EQUAL(env->hello->metrics_address, d.metrics);
                CU_ASSERT_EQUAL(env->hello->role, TANDEM__WORKER_HELLO__ROLE__DECODE);
                hellos++;
            }
            wire_free(env);
        }
    }
    CU_ASSERT_EQUAL(hellos, 2);
    printf("\n  two announced hellos in %.0f ms (one a second)\n", h_ms() - t0);
    /* A router that dials the control address from the hello gets a link. */
    nng_socket s;
    CU_ASSERT_EQUAL(ctl_dial(&s, d.control, 0), 0);
    h_nng_close(s);
    h_nng_close(pull);
    CU_ASSERT_EQUAL(h_stop(&d, SIGTERM, 10000), 0);
}

/* A stop that needs the stop watchdog is no clean stop: the watchdog exits
 * WATCHDOG_EXIT (70) and every clean-stop check, which wants 0, fails.
 * WATCHDOG_ENV=0 makes the watchdog fire at the signal. */
static void test_stop_watchdog_fails(void)
{
    struct h_proc d;
    const char *args[] = {"--id", "wd-1", NULL};
    setenv(WATCHDOG_ENV, "0", 1);
    int rc = spawn(&d, "tandem-decode", args);
    unsetenv(WATCHDOG_ENV);
    CU_ASSERT_FATAL(rc == 0);
    int code = h_stop(&d, SIGTERM, 10000);
    CU_ASSERT_EQUAL(code, WATCHDOG_EXIT);
    CU_ASSERT_NOT_EQUAL(code, 0); /* what every clean-stop check asserts */
    /* Without it, the same worker stops cleanly. */
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", args) == 0);
    CU_ASSERT_EQUAL(h_stop(&d, SIGTERM, 10000), 0);
}

int main(void)
{
    h_init();
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite_with_setup_and_teardown("basics", NULL, NULL, NULL, teardown);
    CU_add_test(s, "flags", test_flags);
    CU_add_test(s, "hello_heartbeat_http", test_hello_heartbeat_http);
    CU_add_test(s, "one_request_each_way", test_one_request_each_way);
    CU_add_test(s, "busy_recovery_errors", test_busy_recovery_errors);
    CU_add_test(s, "sim_backend", test_sim_backend);
    CU_add_test(s, "sim_link_model", test_sim_link_model);
    CU_add_test(s, "sim_timed_steps", test_sim_timed_steps);
    CU_add_test(s, "announce", test_announce);
    CU_add_test(s, "stop_watchdog_fails", test_stop_watchdog_fails);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    h_cleanup_all();
    return failed != 0;
}
