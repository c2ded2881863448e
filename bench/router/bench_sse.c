/* The streamed-token path, old against new, in one process and one run
 * (docs/performance.md, "Streamed-token path"):
 *   - render: one generated token into a request's output and its SSE chunk
 *     JSON, as the router's dispatch does per token: the jansson DOM it used
 *     (tests/router/oa_ref.c) against the direct appends (oa_output_chunk_ref),
 *     for completions, chat, and completions with logprobs 5;
 *   - parse: the load generator reading such a chunk: jansson
 *     (lg_openai_parse_chunk_json) against the fast path
 *     (lg_openai_parse_chunk).
 * Figures are ns per chunk, the median over the runs (old and new alternate
 * within a run); the push of the token alone is shown so render = row - push.
 * The bench fails if the two renderers ever differ.
 *
 * usage: bench_sse [runs (default 9)] [chunks per run (default 100000)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "loadgen/openai.h"
#include "oa_ref.h"
#include "openai.h"
#include "tokenizer.h"

#define MAX_RUNS 64

struct shape {
    const char *name;
    enum oa_kind kind;
    const char *body;
};

static const struct shape shapes[] = {
    {"completions", OA_KIND_COMPLETION,
     "{\"model\":\"m\",\"prompt\":\"hi\",\"stream\":true,\"stream_options\":{\"include_usage\":"
     "true}}"},
    {"chat", OA_KIND_CHAT,
     "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true}"},
    {"completions+logprobs5", OA_KIND_COMPLETION,
     "{\"model\":\"m\",\"prompt\":\"hi\",\"stream\":true,\"logprobs\":5}"},
};

static struct tokenizer *g_tok;

struct req {
    struct oa_request r;
    struct oa_prompt p;
    struct oa_output o;
};

static int req_init(struct req *q, const struct shape *s)
{
    struct oa_error e;
    memset(q, 0, sizeof(*q));
    if (oa_parse(s->kind, s->body, strlen(s->body), &q->r, &e) != 0 ||
        oa_prompt_build(&q->r, g_tok, 1, &q->p, &e) != 0)
        return -1;
    return oa_output_init(&q->o, &q->r, &q->p, g_tok, "cmpl-0123456789abcdef", "llama-3-8b",
                          1700000000);
}

static void req_fini(struct req *q)
{
    oa_output_fini(&q->o);
    oa_prompt_fini(&q->p);
    oa_request_fini(&q->r);
}

static const struct sampler_top g_top[5] = {
    {.token = TOK_BYTE_BASE + 'a', .logprob = -0.25f},
    {.token = TOK_BYTE_BASE + 'b', .logprob = -1.5f},
    {.token = TOK_BYTE_BASE + 'c', .logprob = -2.125f},
    {.token = TOK_BYTE_BASE + '"', .logprob = -3.75f},
    {.token = TOK_BYTE_BASE + ' ', .logprob = -4.0625f},
};

/* One token (a word-ish byte) into o. */
static void push(struct oa_output *o, long i)
{
    oa_output_token(o, TOK_BYTE_BASE + 'a' + (uint32_t)(i % 26), -0.0123456f, g_top, 5);
}

/* ns per chunk: mode 0 push only, 1 old renderer, 2 new. */
static double render_ns(const struct shape *s, int mode, long n, char *last, size_t cap)
{
    struct req q;
    if (req_init(&q, s) != 0)
        return -1;
    char *first = NULL;
    oa_output_begin(&q.o, &first);
    free(first);
    double t0 = bench_now_s();
    for (long i = 0; i < n; i++) {
        push(&q.o, i);
        if (mode == 1) {
            char *c = NULL;
            oa_ref_chunk(&q.o, &c);
            if (i == n - 1)
                snprintf(last, cap, "%s", c ? c : "");
            free(c);
        } else if (mode == 2) {
            const char *c;
            size_t len;
            oa_output_chunk_ref(&q.o, &c, &len);
            if (i == n - 1)
                snprintf(last, cap, "%s", c ? c : "");
        } else {
            q.o.text_len = 0; /* what a render forgets */
            q.o.n_lp = 0;
        }
    }
    double ns = (bench_now_s() - t0) * 1e9 / (double)n;
    req_fini(&q);
    return ns;
}

static double parse_ns(enum lg_api api, const char *chunk, int fast, long n)
{
    size_t len = strlen(chunk);
    double t0 = bench_now_s();
    long tokens = 0;
    for (long i = 0; i < n; i++) {
        struct lg_chunk c;
        if ((fast ? lg_openai_parse_chunk : lg_openai_parse_chunk_json)(api, chunk, len, &c) == 0) {
            tokens += c.is_token;
            lg_chunk_clear(&c);
        }
    }
    double ns = (bench_now_s() - t0) * 1e9 / (double)n;
    return tokens == n ? ns : -1;
}

int main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 9;
    long n = argc > 2 ? atol(argv[2]) : 100000;
    if (runs < 1 || runs > MAX_RUNS || n < 1) {
        fprintf(stderr, "usage: bench_sse [runs 1..%d] [chunks per run]\n", MAX_RUNS);
        return 2;
    }
    if (tok_create_bytes(&g_tok) != 0)
        return 1;
    char load[128];
    bench_loadavg(load, sizeof(load));
    printf("bench_sse: %d runs x %ld chunks, %s\n", runs, n, load);
    printf("%-24s %10s %10s %10s %10s %8s\n", "render (ns/chunk)", "push", "old", "new", "old-push",
           "ratio");
    int fail = 0;
    for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        double v[3][MAX_RUNS];
        char a[8192], b[8192];
        for (int r = 0; r < runs; r++) {
            v[0][r] = render_ns(&shapes[k], 0, n, a, sizeof(a));
            v[1][r] = render_ns(&shapes[k], 1, n, a, sizeof(a));
            v[2][r] = render_ns(&shapes[k], 2, n, b, sizeof(b));
            fail |= strcmp(a, b) != 0;
        }
        double push_ns = bench_median(v[0], runs), o = bench_median(v[1], runs),
               w = bench_median(v[2], runs);
        printf("%-24s %10.0f %10.0f %10.0f %10.0f %7.1fx   (new-push %.0f)\n", shapes[k].name,
               push_ns, o, w, o - push_ns, (o - push_ns) / (w - push_ns), w - push_ns);
        if (k == 0 || k == 1) {
            /* The chunk just rendered, read back as the load generator does. */
            enum lg_api api = shapes[k].kind == OA_KIND_CHAT ? LG_API_CHAT : LG_API_COMPLETIONS;
            double p[2][MAX_RUNS];
            for (int r = 0; r < runs; r++) {
                p[0][r] = parse_ns(api, b, 0, n);
                p[1][r] = parse_ns(api, b, 1, n);
            }
            double po = bench_median(p[0], runs), pn = bench_median(p[1], runs);
            fail |= po < 0 || pn < 0;
            printf("%-24s %10s %10.0f %10.0f %10s %7.1fx\n", "  parse (ns/chunk)", "", po, pn, "",
                   po / pn);
        }
    }
    tok_destroy(g_tok);
    if (fail) {
        fprintf(stderr, "bench_sse: the renderers differ or a chunk did not parse as a token\n");
        return 1;
    }
    return 0;
}
