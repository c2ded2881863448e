/* Routing decision latency: what the router spends per request between
 * having the prompt and knowing where to send it: block hashing
 * (bh_hash_prompt) + rt_pipeline_decide (filters, scorers, picker, P/D
 * decider, in-flight accounting, approximate prefix learning), and for text
 * prompts the byte-level tokenizer too (tok_encode).
 *
 * Workload: prompts share prefixes (a few "system prompts" or documents, each
 * followed by a unique tail), so the prefix index is populated and matches
 * are non-trivial. Endpoint loads change every 64 decisions (heartbeats, not
 * timed); requests stay in flight for a while and are released oldest first
 * (not timed), so the active-request scorer sees real counts.
 *
 *   bench_decision [decisions]     (default 20000 per 1K-token case)
 *
 * Prints p50 / p99 / max per (config, endpoints, prompt size). */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block_hash.h"
#include "pipeline.h"
#include "tokenizer.h"

#define HDR "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"

static const char *const colocated_yaml =
    HDR "plugins:\n- type: decode-filter\n- type: prefix-cache-scorer\n"
        "- type: queue-scorer\n- type: kv-cache-utilization-scorer\n"
        "- type: active-request-scorer\n- type: session-affinity-scorer\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: decode-filter\n"
        "  - pluginRef: prefix-cache-scorer\n    weight: 3\n  - pluginRef: queue-scorer\n"
        "  - pluginRef: kv-cache-utilization-scorer\n  - pluginRef: active-request-scorer\n"
        "  - pluginRef: session-affinity-scorer\n";

static const char *const pd_yaml =
    HDR "plugins:\n- type: prefill-filter\n- type: decode-filter\n- type: prefix-cache-scorer\n"
        "- type: queue-scorer\n- type: active-request-scorer\n"
        "- type: load-aware-pd-decider\n- type: pd-profile-handler\n"
        "schedulingProfiles:\n"
        "- name: prefill\n  plugins:\n  - pluginRef: prefill-filter\n"
        "  - pluginRef: prefix-cache-scorer\n    weight: 2\n  - pluginRef: queue-scorer\n"
        "  - pluginRef: active-request-scorer\n"
        "- name: decode\n  plugins:\n  - pluginRef: decode-filter\n"
        "  - pluginRef: prefix-cache-scorer\n    weight: 2\n  - pluginRef: queue-scorer\n"
        "  - pluginRef: active-request-scorer\n";

static uint64_t rng = 0x5eed;

static uint64_t rnd(void)
{
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* On-CPU time of this thread: what the decision costs without the time the
 * scheduler gave the core to someone else (the bench shares 2 cores). */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

struct result {
    double p50, p99, max, mean;
};

static struct result summarize(uint64_t *ns, int n)
{
    qsort(ns, (size_t)n, sizeof(*ns), cmp_u64);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += (double)ns[i];
    struct result r = {
        .p50 = ns[n / 2] / 1e3,
        .p99 = ns[(int)((double)n * 0.99)] / 1e3,
        .max = ns[n - 1] / 1e3,
        .mean = sum / n / 1e3,
    };
    return r;
}

/* A cluster of n endpoints (P/D: a third prefill). */
static struct rt_pipeline *cluster(const char *yaml, int n, int pd)
{
    struct rt_pipeline *pl;
    char err[RT_ERR_MAX];
    struct rt_pipeline_opts o = {.max_endpoints = n, .seed = 42};
    if (rt_pipeline_parse(&pl, yaml, "bench", &o, err, sizeof(err)) != 0) {
        fprintf(stderr, "config: %s\n", err);
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof(id), "worker-%d", i);
        enum rt_role role =
            !pd ? RT_ROLE_COLOCATED : (i % 3 == 0 ? RT_ROLE_PREFILL : RT_ROLE_DECODE);
        struct rt_endpoint_info in = {.id = id, .role = role, .block_size = 16, .max_running = 64};
        if (rt_pipeline_endpoint_add(pl, &in) < 0)
            exit(1);
    }
    return pl;
}

static void heartbeat(struct rt_pipeline *pl, int n)
{
    for (int i = 0; i < n; i++) {
        struct rt_load l = {.waiting = (uint32_t)(rnd() % 8),
                            .running = (uint32_t)(rnd() % 64),
                            .prefill_tokens_queued = rnd() % 8192,
                            .kv_blocks_used = (uint32_t)(rnd() % 4000),
                            .kv_blocks_total = 4096};
        rt_pipeline_endpoint_set_load(pl, i, &l);
    }
}

/* Token prompts: n_groups shared prefixes of half the prompt, unique tails. */
struct token_workload {
    int n_prompts, n_tokens;
    uint32_t *tokens; /* (n_prompts, n_tokens) */
};

static void token_workload(struct token_workload *w, int n_prompts, int n_tokens, int n_groups)
{
    w->n_prompts = n_prompts;
    w->n_tokens = n_tokens;
    w->tokens = malloc(sizeof(uint32_t) * (size_t)n_prompts * (size_t)n_tokens);
    for (int p = 0; p < n_prompts; p++) {
        uint32_t *t = &w->tokens[(size_t)p * (size_t)n_tokens];
        uint64_t save = rng;
        rng = 1000 + (uint64_t)(p % n_groups);
        for (int i = 0; i < n_tokens / 2; i++)
            t[i] = (uint32_t)(rnd() % 32000);
        rng = save;
        for (int i = n_tokens / 2; i < n_tokens; i++)
            t[i] = (uint32_t)(rnd() % 32000);
    }
}

/* Text prompts: n_docs shared documents (2/3 of the text) + unique tails. */
static char *text_of(size_t len, uint64_t seed)
{
    static const char *const words[] = {
        "the",           "of",      "and",    "to",    "in",     "a",     "is",    "that",
        "for",           "it",      "as",     "was",   "with",   "be",    "by",    "on",
        "not",           "he",      "this",   "are",   "or",     "his",   "from",  "at",
        "which",         "but",     "have",   "an",    "had",    "they",  "you",   "were",
        "their",         "one",     "all",    "we",    "can",    "her",   "has",   "there",
        "been",          "if",      "more",   "when",  "will",   "would", "who",   "so",
        "disaggregated", "prefill", "decode", "cache", "router", "token", "block", "latency"};
    char *s = malloc(len + 1);
    uint64_t save = rng;
    rng = seed;
    size_t o = 0;
    while (o < len) {
        const char *w = words[rnd() % (sizeof(words) / sizeof(words[0]))];
        for (; *w && o < len; w++)
            s[o++] = *w;
        if (o < len)
            s[o++] = (rnd() % 13 == 0) ? '\n' : ' ';
    }
    s[len] = 0;
    rng = save;
    return s;
}

#define RING 256

struct run_state {
    struct rt_ticket ring[RING];
    int head, used;
};

static void keep(struct rt_pipeline *pl, struct run_state *rs, const struct rt_ticket *t)
{
    if (rs->used == RING) {
        rt_pipeline_release(pl, &rs->ring[rs->head], RT_RELEASE_ALL);
        rs->used--;
        rs->head = (rs->head + 1) % RING;
    }
    rs->ring[(rs->head + rs->used) % RING] = *t;
    rs->used++;
}

static void bench_tokens(const char *name, const char *yaml, int pd, int n_eps, int n_tokens,
                         int decisions)
{
    struct rt_pipeline *pl = cluster(yaml, n_eps, pd);
    struct token_workload w;
    int n_prompts = n_tokens > 4096 ? 64 : 512;
    token_workload(&w, n_prompts, n_tokens, 16);
    int bs = rt_pipeline_block_size(pl);
    uint64_t *hashes = malloc(sizeof(uint64_t) * (size_t)(n_tokens / bs + 1));
    uint64_t *total = malloc(sizeof(uint64_t) * (size_t)decisions);
    uint64_t *only = malloc(sizeof(uint64_t) * (size_t)decisions);
    uint64_t *cpu = malloc(sizeof(uint64_t) * (size_t)decisions);
    uint64_t root = bh_root("tiny");
    struct run_state rs = {0};
    int warm = decisions / 5;
    int remote = 0;
    for (int k = -warm; k < decisions; k++) {
        if ((k & 63) == 0)
            heartbeat(pl, n_eps);
        int p = (int)(rnd() % (uint64_t)n_prompts);
        char session[32];
        int slen = snprintf(session, sizeof(session), "user-%d", p);
        const uint32_t *toks = &w.tokens[(size_t)p * (size_t)n_tokens];
        uint64_t c0 = cpu_ns();
        uint64_t t0 = now_ns();
        int nb = bh_hash_prompt(root, toks, n_tokens, bs, hashes);
        struct rt_request r = {.id = (uint64_t)k,
                               .tokens = toks,
                               .n_tokens = n_tokens,
                               .block_hashes = hashes,
                               .n_blocks = nb,
                               .session = session,
                               .session_len = (size_t)slen,
                               .max_tokens = 256};
        const struct rt_decision *d;
        uint64_t t1 = now_ns();
        if (rt_pipeline_decide(pl, &r, &d) != 0) {
            fprintf(stderr, "decide failed\n");
            exit(1);
        }
        uint64_t t2 = now_ns();
        uint64_t c2 = cpu_ns();
        if (k >= 0) {
            total[k] = t2 - t0;
            only[k] = t2 - t1;
            cpu[k] = c2 - c0;
            remote += d->pd == RT_PD_REMOTE;
        }
        keep(pl, &rs, &d->ticket);
    }
    struct result a = summarize(total, decisions), b = summarize(only, decisions),
                  c = summarize(cpu, decisions);
    printf("| %-9s | %4d | %6d | %7.1f | %7.1f | %7.1f | %7.1f | %7.1f | %7.1f |", name, n_eps,
           n_tokens, a.p50, a.p99, a.max, b.p50, b.p99, c.p99);
    if (pd)
        printf(" %d%% |\n", (int)(100.0 * remote / decisions));
    else
        printf(" - |\n");
    free(hashes);
    free(total);
    free(only);
    free(cpu);
    free(w.tokens);
    rt_pipeline_destroy(pl);
}

static void bench_text(const char *name, const char *yaml, int pd, int n_eps, size_t text_len,
                       int decisions, struct tokenizer *tok)
{
    struct rt_pipeline *pl = cluster(yaml, n_eps, pd);
    enum { N_TEXTS = 16, N_DOCS = 4 };
    char *texts[N_TEXTS];
    size_t doc_len = text_len * 2 / 3;
    for (int i = 0; i < N_TEXTS; i++) {
        char *doc = text_of(doc_len, 77 + (uint64_t)(i % N_DOCS));
        char *tail = text_of(text_len - doc_len, 1000 + (uint64_t)i);
        texts[i] = malloc(text_len + 1);
        memcpy(texts[i], doc, doc_len);
        memcpy(texts[i] + doc_len, tail, text_len - doc_len + 1);
        free(doc);
        free(tail);
    }
    int bs = rt_pipeline_block_size(pl);
    size_t cap = TOK_ENCODE_BOUND(text_len);
    uint32_t *ids = malloc(sizeof(uint32_t) * cap);
    uint64_t *hashes = malloc(sizeof(uint64_t) * (cap / (size_t)bs + 1));
    uint64_t *total = malloc(sizeof(uint64_t) * (size_t)decisions);
    uint64_t *only = malloc(sizeof(uint64_t) * (size_t)decisions);
    uint64_t *enc = malloc(sizeof(uint64_t) * (size_t)decisions);
    uint64_t *cpu = malloc(sizeof(uint64_t) * (size_t)decisions);
    uint64_t root = bh_root("tiny");
    struct run_state rs = {0};
    int n_tokens = 0;
    for (int k = -decisions / 5; k < decisions; k++) {
        if ((k & 63) == 0)
            heartbeat(pl, n_eps);
        int p = (int)(rnd() % N_TEXTS);
        uint64_t c0 = cpu_ns();
        uint64_t t0 = now_ns();
        n_tokens = tok_encode(tok, texts[p], text_len, 1, ids, (int)cap);
        uint64_t t1 = now_ns();
        int nb = bh_hash_prompt(root, ids, n_tokens, bs, hashes);
        struct rt_request r = {.id = (uint64_t)k,
                               .tokens = ids,
                               .n_tokens = n_tokens,
                               .block_hashes = hashes,
                               .n_blocks = nb,
                               .max_tokens = 256};
        const struct rt_decision *d;
        uint64_t t2 = now_ns();
        if (n_tokens < 0 || rt_pipeline_decide(pl, &r, &d) != 0) {
            fprintf(stderr, "decide failed\n");
            exit(1);
        }
        uint64_t t3 = now_ns();
        uint64_t c3 = cpu_ns();
        if (k >= 0) {
            total[k] = t3 - t0;
            only[k] = t3 - t2;
            enc[k] = t1 - t0;
            cpu[k] = c3 - c0;
        }
        keep(pl, &rs, &d->ticket);
    }
    struct result a = summarize(total, decisions), b = summarize(only, decisions),
                  e = summarize(enc, decisions), c = summarize(cpu, decisions);
    printf("| %-9s | %4d | %zu B (%d tok) | %7.1f | %7.1f | %7.1f | %7.1f | %7.1f | %7.1f | "
           "%.1f |\n",
           name, n_eps, text_len, n_tokens, a.p50, a.p99, a.max, b.p50, b.p99, c.p99, e.p50);
    for (int i = 0; i < N_TEXTS; i++)
        free(texts[i]);
    free(ids);
    free(hashes);
    free(total);
    free(only);
    free(enc);
    free(cpu);
    rt_pipeline_destroy(pl);
}

int main(int argc, char **argv)
{
    int decisions = argc > 1 ? atoi(argv[1]) : 20000;
    if (decisions < 100)
        decisions = 100;
    static const int eps[] = {8, 64, 512};
    printf("times in microseconds; total = (encode +) hash + decide, wall clock; on-CPU = the "
           "same on this thread's CPU clock\n\n");
    printf("| config | endpoints | prompt tokens | total p50 | total p99 | total max | decide p50 "
           "| decide p99 | on-CPU p99 | remote |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int c = 0; c < 2; c++) {
        const char *name = c ? "pd" : "colocated";
        const char *yaml = c ? pd_yaml : colocated_yaml;
        for (int i = 0; i < 3; i++) {
            bench_tokens(name, yaml, c, eps[i], 1024, decisions);
            bench_tokens(name, yaml, c, eps[i], 32768, decisions / 4);
        }
    }
    struct tokenizer *tok;
    uint64_t t0 = now_ns();
    if (tok_create_bytes(&tok) != 0)
        return 1;
    uint64_t t1 = now_ns();
    printf("\ntok_create_bytes: %.1f us (once per router)\n\n", (t1 - t0) / 1e3);
    printf("| config | endpoints | prompt | total p50 | total p99 | total max | decide p50 | "
           "decide p99 | on-CPU p99 | encode p50 |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < 3; i++)
            bench_text(c ? "pd" : "colocated", c ? pd_yaml : colocated_yaml, c, eps[i], 220 * 1024,
                       decisions / 10, tok);
    tok_destroy(tok);
    return 0;
}
