/* Integration: bitwise determinism across deployments. The same prompts,
 * greedy, 64 new tokens each (ignore_eos), must give identical ids in
 *   - the single-process engine (the scheduler run in this process),
 *   - a colocated worker,
 *   - P -> D disaggregated (tcp), with the KV bytes D installed compared
 *     block by block against the bytes P computed (--kv-dump: block hash and
 *     XXH3 of the payload on both sides),
 *   - P -> D where D already holds part of each prompt (ipc; a shorter
 *     request sharing the prefix ran on D first, so P ships only the rest),
 *   - 2 prefill x 2 decode workers (tcp and ipc mixed, all four pairings).
 *
 * The CI matrix is 20 prompts of 1 to 1100 tokens, most of them short (4263
 * tokens in all; the longest is 9 chunks of the default 128-token step).
 * TANDEM_FULL_MATRIX=1 runs 20 prompts of 1 to 3000 tokens weighted to the
 * long end (15291 tokens); docs/architecture.md ("## Workers") records the
 * timings of both. */
#include <CUnit/Basic.h>
#include <inttypes.h>
#include <math.h>
#include <nng/nng.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "harness.h"

#define N_PROMPTS  20
#define NEW_TOKENS 64
#define TIMEOUT_MS 600000
/* The decode workers' transfer timeout, an hour: a request queued on a busy
 * prefill worker gets no frame until its turn, and at the default 30 s a
 * loaded machine (a CI run at load average 14) failed two_by_two with "no
 * progress from prefill worker". These tests are about tokens and KV bytes,
 * not that timeout (test_int_transfer prefill_unreachable_times_out is). */
#define XFER_NO_TIMEOUT "--transfer-timeout-ms", "3600000"

static const int ci_lens[N_PROMPTS] = {1,   2,   15,  16,  17,  31,  32,  33,  64,   100,
                                       127, 128, 129, 200, 255, 256, 257, 500, 1000, 1100};
static const int full_lens[N_PROMPTS] = {1,   2,   15,  16,  17,   31,   32,   33,   100,  255,
                                         256, 257, 500, 777, 1000, 1500, 2000, 2500, 2999, 3000};

static int lens[N_PROMPTS];
static uint32_t *prompts[N_PROMPTS];
static uint32_t want[N_PROMPTS * NEW_TOKENS];
static int total_blocks; /* blocks of all prompts, partial ones included */
static uint64_t next_id = 1;

static void teardown(void)
{
    h_cleanup_all();
}

static int suite_init(void)
{
    h_init();
    const int *src =
        getenv("TANDEM_FULL_MATRIX") && atoi(getenv("TANDEM_FULL_MATRIX")) ? full_lens : ci_lens;
    int sum = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        lens[i] = src[i];
        sum += lens[i];
        total_blocks += (lens[i] + 15) / 16;
        prompts[i] = malloc((size_t)lens[i] * sizeof(uint32_t));
        if (prompts[i] == NULL) {
            return 1;
        }
        /* Byte-level ids, like real text through the tiny tokenizer. */
        h_prompt(prompts[i], lens[i], 1000 + (uint64_t)i, 3, 259);
    }
    double t0 = h_ms();
    int rc = h_reference((const uint32_t *const *)prompts, lens, N_PROMPTS, NEW_TOKENS, want);
    printf("\n  matrix: %d prompts, %d..%d tokens (%d in all, %d blocks), %d new tokens each\n",
           N_PROMPTS, lens[0], lens[N_PROMPTS - 1], sum, total_blocks, NEW_TOKENS);
    printf("  single-process engine: %.1f s\n", (h_ms() - t0) / 1e3);
    return rc != 0;
}

static int suite_fini(void)
{
    for (int i = 0; i < N_PROMPTS; i++) {
        free(prompts[i]);
    }
    h_cleanup_all();
    return 0;
}

static int spawn(struct h_proc *p, const char *bin, const char *const *args)
{
    const char *a[40];
    int n = 0;
    for (int i = 0; args && args[i]; i++) {
        a[n++] = args[i];
    }
    a[n++] = "--log-level";
    a[n++] = "warn";
    a[n] = NULL;
    return h_spawn(p, bin, a, 20000);
}

/* Runs every prompt, prompt i on socks[i % n_socks] with prefill address
 * paddrs[(i / n_socks) % n_p] (NULL entries: local), and compares with the
 * engine. */
static void run_matrix(const char *what, nng_socket *socks, int n_socks, const char *const *paddrs,
                       int n_p)
{
    struct ctl_job jobs[N_PROMPTS];
    struct ctl_item items[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++) {
        ctl_job_init(&jobs[i]);
        jobs[i].prompt = prompts[i];
        jobs[i].n_prompt = lens[i];
        jobs[i].max_tokens = NEW_TOKENS;
        jobs[i].ignore_eos = 1;
        jobs[i].prefill_address = n_p > 0 ? paddrs[(i / n_socks) % n_p] : NULL;
        items[i] = (struct ctl_item){.sock = socks[i % n_socks], .id = next_id++, .job = &jobs[i]};
    }
    double t0 = h_ms();
    CU_ASSERT_EQUAL(ctl_run_many(items, N_PROMPTS, TIMEOUT_MS, NULL, NULL), 0);
    printf("  %s: %.1f s\n", what, (h_ms() - t0) / 1e3);
    int same = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        const struct ctl_stream *st = &items[i].stream;
        CU_ASSERT_EQUAL(st->bad, 0);
        CU_ASSERT_EQUAL(st->error_code, 0);
        CU_ASSERT_EQUAL(st->finish_reason, TANDEM__FINISH__REASON__LENGTH);
        CU_ASSERT_EQUAL(st->n_tokens, NEW_TOKENS);
        int ok = st->n_tokens == NEW_TOKENS &&
                 memcmp(st->tokens, want + i * NEW_TOKENS, NEW_TOKENS * sizeof(uint32_t)) == 0;
        if (!ok) {
            int k = 0;
            while (k < st->n_tokens && k < NEW_TOKENS &&
                   st->tokens[k] == want[i * NEW_TOKENS + k]) {
                k++;
            }
            printf("  %s: prompt %d (%d tokens): %d tokens, first difference at %d%s%s\n", what, i,
                   lens[i], st->n_tokens, k, st->busy ? " (busy)" : "",
                   st->error[0] ? st->error : "");
        }
        same += ok;
    }
    CU_ASSERT_EQUAL(same, N_PROMPTS);
    for (int i = 0; i < N_PROMPTS; i++) {
        ctl_stream_fini(&items[i].stream);
    }
}

static void check_idle(const struct h_proc *p)
{
    double used = -1;
    CU_ASSERT_EQUAL(h_kv_invariant(p, &used), 0);
    CU_ASSERT_EQUAL(h_wait_used(p, 0, 2000), 0);
}

/* ---- Dumps: what D installed == what P computed ------------------------- */

struct dump_line {
    uint64_t id;
    unsigned idx;
    uint64_t hash, xxh;
    size_t len;
};

static int read_dump(const char *path, const char *what, struct dump_line **out)
{
    FILE *f = fopen(path, "r");
    int n = 0, cap = 0;
    *out = NULL;
    if (f == NULL) {
        return 0;
    }
    char kind[32];
    struct dump_line l;
    while (fscanf(f, "%31s %" SCNu64 " %u %" SCNx64 " %" SCNx64 " %zu", kind, &l.id, &l.idx,
                  &l.hash, &l.xxh, &l.len) == 6) {
        if (strcmp(kind, what) != 0) {
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            *out = realloc(*out, (size_t)cap * sizeof(**out));
        }
        (*out)[n++] = l;
    }
    fclose(f);
    return n;
}

static int cmp_line(const void *a, const void *b)
{
    const struct dump_line *x = a, *y = b;
    if (x->id != y->id) {
        return x->id < y->id ? -1 : 1;
    }
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Every block a P sent was installed by a D with the same hash and bytes. */
static void compare_dumps(const char *const *sent_paths, int n_sent,
                          const char *const *installed_paths, int n_inst, int expect_blocks)
{
    struct dump_line *sent = NULL, *inst = NULL;
    int ns = 0, ni = 0;
    for (int i = 0; i < n_sent; i++) {
        struct dump_line *l;
        int n = read_dump(sent_paths[i], "sent", &l);
        sent = realloc(sent, (size_t)(ns + n + 1) * sizeof(*sent));
        memcpy(sent + ns, l, (size_t)n * sizeof(*l));
        ns += n;
        free(l);
    }
    for (int i = 0; i < n_inst; i++) {
        struct dump_line *l;
        int n = read_dump(installed_paths[i], "installed", &l);
        inst = realloc(inst, (size_t)(ni + n + 1) * sizeof(*inst));
        memcpy(inst + ni, l, (size_t)n * sizeof(*l));
        ni += n;
        free(l);
    }
    qsort(sent, (size_t)ns, sizeof(*sent), cmp_line);
    qsort(inst, (size_t)ni, sizeof(*inst), cmp_line);
    CU_ASSERT_EQUAL(ns, expect_blocks);
    CU_ASSERT_EQUAL(ni, ns);
    int same = 0;
    for (int i = 0; i < ns && i < ni; i++) {
        same += sent[i].id == inst[i].id && sent[i].idx == inst[i].idx &&
                sent[i].hash == inst[i].hash && sent[i].xxh == inst[i].xxh &&
                sent[i].len == inst[i].len && sent[i].len == 131072;
    }
    CU_ASSERT_EQUAL(same, ns);
    printf("  KV dump: %d blocks sent, %d installed, %d identical (hash and XXH3 of 128 KiB)\n", ns,
           ni, same);
    free(sent);
    free(inst);
}

/* ---- Configurations ----------------------------------------------------- */

static void test_colocated(void)
{
    struct h_proc c;
    const char *args[] = {"--colocated", "--kv-blocks", "4096", NULL};
    CU_ASSERT_FATAL(spawn(&c, "tandem-decode", args) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, c.control, 0) == 0);
    run_matrix("colocated worker", &s, 1, NULL, 0);
    check_idle(&c);
    h_nng_close(s);
    CU_ASSERT_EQUAL(h_stop(&c, SIGTERM, 5000), 0);
}

static void test_disaggregated(void)
{
    char pdump[H_URL_MAX], ddump[H_URL_MAX];
    snprintf(pdump, sizeof(pdump), "%s/pd-p.dump", h_tmpdir());
    snprintf(ddump, sizeof(ddump), "%s/pd-d.dump", h_tmpdir());
    remove(pdump);
    remove(ddump);
    struct h_proc p, d;
    const char *pargs[] = {"--kv-dump", pdump, NULL};
    const char *dargs[] = {"--kv-blocks", "4096", "--kv-dump", ddump, XFER_NO_TIMEOUT, NULL};
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", pargs) == 0);
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", dargs) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);
    const char *paddr[] = {p.kv};
    run_matrix("P -> D (tcp)", &s, 1, paddr, 1);
    CU_ASSERT_EQUAL(h_proc_metric(&p, "tandem:kv_frames_sent_total"), total_blocks);
    CU_ASSERT_EQUAL(h_proc_metric(&d, "tandem:kv_frames_installed_total"), total_blocks);
    CU_ASSERT_EQUAL(h_proc_metric(&d, "tandem:kv_bytes_received_total"),
                    (double)total_blocks * 131072);
    const char *sent[] = {pdump}, *inst[] = {ddump};
    compare_dumps(sent, 1, inst, 1, total_blocks);
    check_idle(&p);
    check_idle(&d);
    h_nng_close(s);
    CU_ASSERT_EQUAL(h_stop(&p, SIGTERM, 5000), 0);
    CU_ASSERT_EQUAL(h_stop(&d, SIGTERM, 5000), 0);
    remove(pdump);
    remove(ddump);
}

static void test_disaggregated_prefix(void)
{
    char pc[H_URL_MAX], pk[H_URL_MAX], dc[H_URL_MAX], dk[H_URL_MAX];
    h_ipc_url(pc, sizeof(pc), "pfx-p-ctl");
    h_ipc_url(pk, sizeof(pk), "pfx-p-kv");
    h_ipc_url(dc, sizeof(dc), "pfx-d-ctl");
    h_ipc_url(dk, sizeof(dk), "pfx-d-kv");
    struct h_proc p, d;
    const char *pargs[] = {"--control", pc, "--kv", pk, NULL};
    const char *dargs[] = {"--control",   dc,     "--kv",          dk,
                           "--kv-blocks", "4096", XFER_NO_TIMEOUT, NULL};
    CU_ASSERT_FATAL(spawn(&p, "tandem-prefill", pargs) == 0);
    CU_ASSERT_FATAL(spawn(&d, "tandem-decode", dargs) == 0);
    nng_socket s;
    CU_ASSERT_FATAL(ctl_dial(&s, d.control, 0) == 0);

    /* Warm D: the first ~60% of every prompt, prefilled locally on D. */
    struct ctl_job jobs[N_PROMPTS];
    struct ctl_item items[N_PROMPTS];
    int held = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        int n = lens[i] * 3 / 5 > 0 ? lens[i] * 3 / 5 : 1;
        held += n / 16;
        ctl_job_init(&jobs[i]);
        jobs[i].prompt = prompts[i];
        jobs[i].n_prompt = n;
        jobs[i].max_tokens = 1;
        items[i] = (struct ctl_item){.sock = s, .id = next_id++, .job = &jobs[i]};
    }
    CU_ASSERT_EQUAL(ctl_run_many(items, N_PROMPTS, TIMEOUT_MS, NULL, NULL), 0);
    for (int i = 0; i < N_PROMPTS; i++) {
        CU_ASSERT_EQUAL(items[i].stream.n_tokens, 1);
        ctl_stream_fini(&items[i].stream);
    }
    double hits0 = h_proc_metric(&d, "vllm:prefix_cache_hits_total{model_name=\"tiny\"}");

    const char *paddr[] = {p.kv};
    run_matrix("P -> D, D holding part of each prompt (ipc)", &s, 1, paddr, 1);
    double hits = h_proc_metric(&d, "vllm:prefix_cache_hits_total{model_name=\"tiny\"}") - hits0;
    double frames = h_proc_metric(&p, "tandem:kv_frames_sent_total");
    printf("  D found %.0f prompt tokens in its cache; P shipped %.0f of %d blocks\n", hits, frames,
           total_blocks);
    /* Every block the warm-up wrote is reused: P ships exactly the rest. */
    CU_ASSERT_EQUAL(hits, held * 16.0);
    CU_ASSERT_EQUAL(frames, total_blocks - held);
    CU_ASSERT_EQUAL(h_proc_metric(&d, "tandem:kv_frames_installed_total"), total_blocks - held);
    check_idle(&p);
    check_idle(&d);
    h_nng_close(s);
    CU_ASSERT_EQUAL(h_stop(&p, SIGTERM, 5000), 0);
    CU_ASSERT_EQUAL(h_stop(&d, SIGTERM, 5000), 0);
}

static void test_two_by_two(void)
{
    char p1c[H_URL_MAX], p1k[H_URL_MAX], d1c[H_URL_MAX], d1k[H_URL_MAX];
    h_ipc_url(p1c, sizeof(p1c), "2x2-p1-ctl");
    h_ipc_url(p1k, sizeof(p1k), "2x2-p1-kv");
    h_ipc_url(d1c, sizeof(d1c), "2x2-d1-ctl");
    h_ipc_url(d1k, sizeof(d1k), "2x2-d1-kv");
    char dumps[4][H_URL_MAX];
    for (int i = 0; i < 4; i++) {
        snprintf(dumps[i], sizeof(dumps[i]), "%s/2x2-%d.dump", h_tmpdir(), i);
        remove(dumps[i]);
    }
    struct h_proc p0, p1, d0, d1;
    const char *p0a[] = {"--kv-dump", dumps[0], NULL};
    const char *p1a[] = {"--control", p1c, "--kv", p1k, "--kv-dump", dumps[1], NULL};
    const char *d0a[] = {"--kv-blocks", "4096", "--kv-dump", dumps[2], XFER_NO_TIMEOUT, NULL};
    const char *d1a[] = {"--control", d1c,      "--kv",          d1k, "--kv-blocks", "4096",
                         "--kv-dump", dumps[3], XFER_NO_TIMEOUT, NULL};
    CU_ASSERT_FATAL(spawn(&p0, "tandem-prefill", p0a) == 0);
    CU_ASSERT_FATAL(spawn(&p1, "tandem-prefill", p1a) == 0);
    CU_ASSERT_FATAL(spawn(&d0, "tandem-decode", d0a) == 0);
    CU_ASSERT_FATAL(spawn(&d1, "tandem-decode", d1a) == 0);
    nng_socket s[2];
    CU_ASSERT_FATAL(ctl_dial(&s[0], d0.control, 0) == 0);
    CU_ASSERT_FATAL(ctl_dial(&s[1], d1.control, 0) == 0);
    const char *paddr[] = {p0.kv, p1.kv};
    run_matrix("2 prefill x 2 decode workers", s, 2, paddr, 2);
    double f0 = h_proc_metric(&p0, "tandem:kv_frames_sent_total");
    double f1 = h_proc_metric(&p1, "tandem:kv_frames_sent_total");
    CU_ASSERT(f0 > 0 && f1 > 0);
    CU_ASSERT_EQUAL(f0 + f1, total_blocks);
    const char *sent[] = {dumps[0], dumps[1]}, *inst[] = {dumps[2], dumps[3]};
    compare_dumps(sent, 2, inst, 2, total_blocks);
    struct h_proc *all[] = {&p0, &p1, &d0, &d1};
    for (int i = 0; i < 4; i++) {
        check_idle(all[i]);
    }
    h_nng_close(s[0]);
    h_nng_close(s[1]);
    for (int i = 0; i < 4; i++) {
        CU_ASSERT_EQUAL(h_stop(all[i], SIGTERM, 5000), 0);
        remove(dumps[i]);
    }
}

int main(void)
{
    h_init();
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s =
        CU_add_suite_with_setup_and_teardown("determinism", suite_init, suite_fini, NULL, teardown);
    CU_add_test(s, "colocated", test_colocated);
    CU_add_test(s, "disaggregated", test_disaggregated);
    CU_add_test(s, "disaggregated_prefix", test_disaggregated_prefix);
    CU_add_test(s, "two_by_two", test_two_by_two);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    h_cleanup_all();
    return failed != 0;
}
