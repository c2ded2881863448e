/* tandem bench: the workloads (loadgen/workload.c, dataset_*.c). Lengths are
 * exact, shared prefixes are really shared (and only within a group),
 * multi-turn history grows turn by turn, traces replay their lengths, times
 * and hash blocks, and everything is a function of the seed. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loadgen/openai.h"
#include "loadgen/workload.h"
#include "tandem_err.h"

#define EXPECT_EQ(a, b)                                                                            \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_)                                                                              \
            fprintf(stderr, "\n%s:%d: %s == %lld, want %lld\n", __FILE__, __LINE__, #a, a_, b_);   \
        CU_ASSERT(a_ == b_);                                                                       \
    } while (0)

static char err[512];

static int init(struct lg_workload *w, const struct lg_workload_config *c)
{
    err[0] = '\0';
    int rc = lg_workload_init(w, c, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "\nworkload init: %s\n", err);
    }
    return rc;
}

/* Printable ASCII words: no control bytes, no leading/trailing space. */
static int plain_text(const char *s, size_t n)
{
    if (n > 0 && (s[0] == ' ' || s[n - 1] == ' ')) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (!((s[i] >= 'a' && s[i] <= 'z') || s[i] == ' ')) {
            return 0;
        }
    }
    return 1;
}

static void test_text_fill(void)
{
    struct lg_rng r;
    lg_rng_seed(&r, 3);
    for (size_t n = 0; n < 200; n++) {
        char buf[256];
        memset(buf, '#', sizeof(buf));
        lg_text_fill(&r, buf, n);
        CU_ASSERT(plain_text(buf, n));
        CU_ASSERT_EQUAL(buf[n], '#'); /* exactly n bytes */
    }
}

static void test_random(void)
{
    struct lg_workload_config c;
    lg_workload_config_default(&c);
    c.seed = 11;
    c.random_input_len = 100;
    c.random_output_len = 20;
    c.random_range_ratio = 0.5;
    struct lg_workload w;
    CU_ASSERT_EQUAL_FATAL(init(&w, &c), 0);
    int in_seen_lo = 0, in_seen_hi = 0;
    for (int i = 0; i < 2000; i++) {
        struct lg_prompt p;
        CU_ASSERT_EQUAL_FATAL(lg_workload_make(&w, i, 0, &p), 0);
        /* [floor(100 x 0.5), ceil(100 x 1.5)] and [10, 30] */
        CU_ASSERT(p.prompt_len >= 50 && p.prompt_len <= 150);
        CU_ASSERT(p.output_len >= 10 && p.output_len <= 30);
        in_seen_lo |= p.prompt_len == 50;
        in_seen_hi |= p.prompt_len == 150;
        EXPECT_EQ(p.text_len, p.prompt_len); /* one byte per token */
        CU_ASSERT(plain_text(p.text, p.text_len));
        lg_prompt_free(&p);
    }
    CU_ASSERT(in_seen_lo && in_seen_hi); /* both ends are reachable */
    /* Same index, same request; another index or warm-up, another one. */
    struct lg_prompt a, b, x, wu;
    lg_workload_make(&w, 5, 0, &a);
    lg_workload_make(&w, 5, 0, &b);
    lg_workload_make(&w, 6, 0, &x);
    lg_workload_make(&w, 5, 1, &wu);
    CU_ASSERT(a.text_len == b.text_len && memcmp(a.text, b.text, a.text_len) == 0);
    CU_ASSERT(a.output_len == b.output_len);
    CU_ASSERT(x.text_len != a.text_len || memcmp(a.text, x.text, a.text_len) != 0);
    CU_ASSERT(wu.text_len != a.text_len || memcmp(a.text, wu.text, a.text_len) != 0);
    lg_prompt_free(&a);
    lg_prompt_free(&b);
    lg_prompt_free(&x);
    lg_prompt_free(&wu);
    lg_workload_fini(&w);

    /* Ratio 0: exact lengths; a shared prefix in front of each prompt. */
    c.random_range_ratio = 0;
    c.random_prefix_len = 40;
    CU_ASSERT_EQUAL_FATAL(init(&w, &c), 0);
    lg_workload_make(&w, 0, 0, &a);
    lg_workload_make(&w, 1, 0, &b);
    lg_workload_make(&w, 0, 1, &wu);
    EXPECT_EQ(a.prompt_len, 140);
    EXPECT_EQ(a.output_len, 20);
    EXPECT_EQ(b.prompt_len, 140);
    CU_ASSERT_EQUAL(memcmp(a.text, b.text, 40), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(a.text + 40, b.text + 40, 100), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(a.text, wu.text, 40), 0); /* warm-ups use another prefix */
    lg_prompt_free(&a);
    lg_prompt_free(&b);
    lg_prompt_free(&wu);
    lg_workload_fini(&w);

    /* Token ids: exact count, in range, prefix shared. */
    c.token_ids = 1;
    c.id_lo = 1000;
    c.id_hi = 1010;
    CU_ASSERT_EQUAL_FATAL(init(&w, &c), 0);
    lg_workload_make(&w, 0, 0, &a);
    lg_workload_make(&w, 1, 0, &b);
    CU_ASSERT_PTR_NULL(a.text);
    EXPECT_EQ(a.n_ids, 140);
    for (size_t i = 0; i < a.n_ids; i++) {
        CU_ASSERT(a.ids[i] >= 1000 && a.ids[i] < 1010);
    }
    CU_ASSERT_EQUAL(memcmp(a.ids, b.ids, 40 * sizeof(int32_t)), 0);
    lg_prompt_free(&a);
    lg_prompt_free(&b);
    lg_workload_fini(&w);

    /* Bad configs name the flag. */
    c.token_ids = 0;
    c.random_range_ratio = 1.0;
    CU_ASSERT_EQUAL(lg_workload_init(&w, &c, err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--random-range-ratio"));
    c.random_range_ratio = 0;
    c.token_ids = 1;
    c.api = LG_API_CHAT;
    CU_ASSERT_EQUAL(lg_workload_init(&w, &c, err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--prompt-token-ids"));
}

static void test_shared_prefix(void)
{
    struct lg_workload_config c;
    lg_workload_config_default(&c);
    c.dataset = LG_DATASET_SHARED_PREFIX;
    c.seed = 5;
    c.gsp_num_groups = 4;
    c.gsp_prompts_per_group = 3;
    c.gsp_system_prompt_len = 64;
    c.gsp_question_len = 16;
    c.gsp_output_len = 8;
    struct lg_workload w;
    CU_ASSERT_EQUAL_FATAL(init(&w, &c), 0);
    struct lg_prompt p[24];
    int per_group[4] = {0};
    for (int i = 0; i < 24; i++) {
        CU_ASSERT_EQUAL_FATAL(lg_workload_make(&w, i, 0, &p[i]), 0);
        EXPECT_EQ(p[i].prompt_len, 80);
        EXPECT_EQ(p[i].text_len, 80);
        EXPECT_EQ(p[i].output_len, 8);
        CU_ASSERT_FATAL(p[i].session >= 0 && p[i].session < 4); /* the group */
        if (i < 12) {
            per_group[p[i].session]++;
        }
    }
    /* One round visits every slot once: 3 prompts of each group. */
    for (int g = 0; g < 4; g++) {
        EXPECT_EQ(per_group[g], 3);
    }
    /* The round is shuffled: not simply group-major. */
    int in_order = 1;
    for (int i = 1; i < 12; i++) {
        in_order &= p[i].session >= p[i - 1].session;
    }
    CU_ASSERT_FALSE(in_order);
    for (int i = 0; i < 24; i++) {
        for (int j = i + 1; j < 24; j++) {
            int same_prefix = memcmp(p[i].text, p[j].text, 64) == 0;
            /* Shared exactly within a group; questions always differ. */
            CU_ASSERT_EQUAL(same_prefix, p[i].session == p[j].session);
            CU_ASSERT_NOT_EQUAL(memcmp(p[i].text + 64, p[j].text + 64, 16), 0);
        }
    }
    for (int i = 0; i < 24; i++) {
        lg_prompt_free(&p[i]);
    }
    /* Warm-ups never share a prefix with the measured requests. */
    struct lg_prompt a, wu;
    lg_workload_make(&w, 0, 0, &a);
    for (int i = 0; i < 12; i++) {
        lg_workload_make(&w, i, 1, &wu);
        CU_ASSERT_NOT_EQUAL(memcmp(a.text, wu.text, 64), 0);
        lg_prompt_free(&wu);
    }
    lg_prompt_free(&a);
    lg_workload_fini(&w);

    /* Chat: a system message (the group's prompt) and a user message. */
    c.api = LG_API_CHAT;
    CU_ASSERT_EQUAL_FATAL(init(&w, &c), 0);
    struct lg_prompt x;
    CU_ASSERT_EQUAL_FATAL(lg_workload_make(&w, 3, 0, &x), 0);
    EXPECT_EQ(x.n_msgs, 2);
    CU_ASSERT_STRING_EQUAL(x.msgs[0].role, "system");
    EXPECT_EQ(x.msgs[0].len, 64);
    CU_ASSERT_STRING_EQUAL(x.msgs[1].role, "user");
    EXPECT_EQ(x.msgs[1].len, 16);
    EXPECT_EQ(x.prompt_len, 80);
    lg_prompt_free(&x);
    lg_workload_fini(&w);
}

static void test_multi_turn(void)
{
    struct lg_workload_config c;
    lg_workload_config_default(&c);
    c.dataset = LG_DATASET_MULTI_TURN;
    c.api = LG_API_CHAT;
    c.seed = 9;
    c.mt_turns = 3;
    c.mt_system_len = 20;
    c.mt_input_len = 10;
    c.mt_output_len = 7;
    struct lg_workload w;
    CU_ASSERT_EQUAL_FATAL(init(&w, &c), 0);
    EXPECT_EQ(w.turns, 3);
    /* Session 1 is requests 3, 4, 5. */
    struct lg_prompt t0, t1, t2, bad;
    CU_ASSERT_EQUAL_FATAL(lg_workload_make(&w, 3, 0, &t0), 0);
    EXPECT_EQ(t0.session, 1);
    EXPECT_EQ(t0.turn, 0);
    EXPECT_EQ(t0.n_msgs, 2);
    CU_ASSERT_STRING_EQUAL(t0.msgs[0].role, "system");
    CU_ASSERT_STRING_EQUAL(t0.msgs[1].role, "user");
    EXPECT_EQ(t0.prompt_len, 30);
    EXPECT_EQ(t0.output_len, 7);
    /* Turn 1 before turn 0's reply: refused. */
    CU_ASSERT_EQUAL(lg_workload_make(&w, 4, 0, &bad), TANDEM_EINVAL);
    lg_workload_turn_done(&w, &t0, "hello there", 11);
    CU_ASSERT_EQUAL_FATAL(lg_workload_make(&w, 4, 0, &t1), 0);
    EXPECT_EQ(t1.turn, 1);
    EXPECT_EQ(t1.n_msgs, 4);      /* system, user, assistant, user */
    for (int i = 0; i < 2; i++) { /* the history is the previous prompt */
        CU_ASSERT_STRING_EQUAL(t1.msgs[i].role, t0.msgs[i].role);
        CU_ASSERT_STRING_EQUAL(t1.msgs[i].content, t0.msgs[i].content);
    }
    CU_ASSERT_STRING_EQUAL(t1.msgs[2].role, "assistant");
    CU_ASSERT_STRING_EQUAL(t1.msgs[2].content, "hello there");
    CU_ASSERT_STRING_EQUAL(t1.msgs[3].role, "user");
    EXPECT_EQ(t1.prompt_len, 30 + 11 + 10);
    lg_workload_turn_done(&w, &t1, NULL, 0); /* failed: a synthetic reply */
    CU_ASSERT_EQUAL_FATAL(lg_workload_make(&w, 5, 0, &t2), 0);
    EXPECT_EQ(t2.n_msgs, 6);
    CU_ASSERT_STRING_EQUAL(t2.msgs[4].role, "assistant");
    EXPECT_EQ(t2.msgs[4].len, 7);
    EXPECT_EQ(t2.prompt_len, 51 + 7 + 10);
    CU_ASSERT(t2.prompt_len > t1.prompt_len && t1.prompt_len > t0.prompt_len);
    lg_workload_turn_done(&w, &t2, "x", 1); /* the last turn frees the session */
    /* Another session is independent and its turn 0 has a different user text. */
    struct lg_prompt s0;
    CU_ASSERT_EQUAL_FATAL(lg_workload_make(&w, 0, 0, &s0), 0);
    EXPECT_EQ(s0.session, 0);
    CU_ASSERT_STRING_NOT_EQUAL(s0.msgs[1].content, t0.msgs[1].content);
    lg_prompt_free(&s0);
    lg_prompt_free(&t0);
    lg_prompt_free(&t1);
    lg_prompt_free(&t2);
    lg_workload_fini(&w);

    /* Completions: the history is one text, and it grows by extension. */
    c.api = LG_API_COMPLETIONS;
    c.mt_history = LG_HISTORY_SYNTHETIC;
    CU_ASSERT_EQUAL_FATAL(init(&w, &c), 0);
    CU_ASSERT_EQUAL_FATAL(lg_workload_make(&w, 0, 0, &t0), 0);
    lg_workload_turn_done(&w, &t0, "ignored in synthetic mode", 25);
    CU_ASSERT_EQUAL_FATAL(lg_workload_make(&w, 1, 0, &t1), 0);
    EXPECT_EQ(t0.text_len, 20 + 1 + 10);
    EXPECT_EQ(t1.text_len, t0.text_len + 1 + 7 + 1 + 10);
    CU_ASSERT_EQUAL(memcmp(t1.text, t0.text, t0.text_len), 0);
    CU_ASSERT_PTR_NULL(strstr(t1.text, "ignored"));
    lg_prompt_free(&t0);
    lg_prompt_free(&t1);
    /* Warm-ups: lone first turns, never remembered. */
    CU_ASSERT_EQUAL(lg_workload_make(&w, 6, 1, &t0), 0);
    CU_ASSERT_EQUAL(lg_workload_make(&w, 6, 1, &t1), 0);
    EXPECT_EQ(t0.turn, 0);
    lg_prompt_free(&t0);
    lg_prompt_free(&t1);
    lg_workload_fini(&w);
}

static void test_long_short(void)
{
    struct lg_workload_config c;
    lg_workload_config_default(&c);
    c.dataset = LG_DATASET_LONG_SHORT;
    c.seed = 2;
    c.long_fraction = 0.1;
    c.long_input_len = 500;
    c.short_input_len = 50;
    c.long_output_len = 4;
    c.short_output_len = 40;
    struct lg_workload w;
    CU_ASSERT_EQUAL_FATAL(init(&w, &c), 0);
    int n_long = 0;
    const int n = 10000;
    for (int i = 0; i < n; i++) {
        struct lg_prompt p;
        CU_ASSERT_EQUAL_FATAL(lg_workload_make(&w, i, 0, &p), 0);
        if (p.prompt_len == 500) {
            n_long++;
            EXPECT_EQ(p.output_len, 4);
        } else {
            EXPECT_EQ(p.prompt_len, 50);
            EXPECT_EQ(p.output_len, 40);
        }
        EXPECT_EQ(p.text_len, p.prompt_len);
        lg_prompt_free(&p);
    }
    /* Binomial(10000, 0.1): sd 30; +-200 is over 6 sd. */
    CU_ASSERT(n_long > 800 && n_long < 1200);
    lg_workload_fini(&w);
}

static void test_sharegpt(void)
{
    struct lg_workload_config c;
    lg_workload_config_default(&c);
    c.dataset = LG_DATASET_SHAREGPT_SYNTH;
    c.seed = 4;
    struct lg_workload w;
    CU_ASSERT_EQUAL_FATAL(init(&w, &c), 0);
    const int n = 20000;
    double in_sum = 0, out_sum = 0;
    for (int i = 0; i < n; i++) {
        struct lg_prompt p;
        CU_ASSERT_EQUAL_FATAL(lg_workload_make(&w, i, 0, &p), 0);
        /* vLLM's ShareGPT filter */
        CU_ASSERT(p.prompt_len >= 4 && p.prompt_len <= 1024);
        CU_ASSERT(p.output_len >= 4 && p.prompt_len + p.output_len <= 2048);
        EXPECT_EQ(p.text_len, p.prompt_len);
        in_sum += p.prompt_len;
        out_sum += p.output_len;
        lg_prompt_free(&p);
    }
    printf("\n  sharegpt-synth: mean input %.1f, mean output %.1f tokens (%d requests)\n",
           in_sum / n, out_sum / n, n);
    /* Lognormal means 161.3 and 338.0 before the filter trims the tails. */
    CU_ASSERT(in_sum / n > 140 && in_sum / n < 165);
    CU_ASSERT(out_sum / n > 300 && out_sum / n < 345);
    lg_workload_fini(&w);
    c.sharegpt_output_len = 64;
    CU_ASSERT_EQUAL_FATAL(init(&w, &c), 0);
    struct lg_prompt p;
    CU_ASSERT_EQUAL(lg_workload_make(&w, 0, 0, &p), 0);
    EXPECT_EQ(p.output_len, 64);
    lg_prompt_free(&p);
    lg_workload_fini(&w);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Mean and median of n draws' input (which 0) or output (1) lengths. */
static void sharegpt_stats(struct lg_workload *w, int n, int which, double *mean, double *median)
{
    int32_t *v = calloc((size_t)n, sizeof(*v));
    CU_ASSERT_PTR_NOT_NULL_FATAL(v);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        struct lg_prompt p;
        CU_ASSERT_EQUAL_FATAL(lg_workload_make(w, i, 0, &p), 0);
        v[i] = which == 0 ? p.prompt_len : p.output_len;
        sum += v[i];
        lg_prompt_free(&p);
    }
    qsort(v, (size_t)n, sizeof(*v), cmp_i32);
    *mean = sum / n;
    *median = (v[n / 2 - 1] + v[n / 2]) / 2.0;
    free(v);
}

/* --sharegpt-{input,output}-{mean,median}: with the filter out of the way, a
 * large sample's mean and median land within 2% of the targets. */
static void test_sharegpt_stats(void)
{
    struct lg_workload_config c;
    lg_workload_config_default(&c);
    c.dataset = LG_DATASET_SHAREGPT_SYNTH;
    c.seed = 11;
    c.sharegpt_input_mean = 700;
    c.sharegpt_input_median = 420;
    c.sharegpt_output_mean = 180;
    c.sharegpt_output_median = 120;
    c.sharegpt_max_input = 100000000;
    c.sharegpt_max_total = 100000000;
    struct lg_workload w;
    CU_ASSERT_EQUAL_FATAL(init(&w, &c), 0);
    const int n = 200000;
    double mean, median;
    sharegpt_stats(&w, n, 0, &mean, &median);
    printf("\n  sharegpt-synth input: mean %.1f (700), median %.1f (420)", mean, median);
    CU_ASSERT(fabs(mean / 700 - 1) < 0.02);
    CU_ASSERT(fabs(median / 420 - 1) < 0.02);
    sharegpt_stats(&w, n, 1, &mean, &median);
    printf("; output: mean %.1f (180), median %.1f (120)\n", mean, median);
    CU_ASSERT(fabs(mean / 180 - 1) < 0.02);
    CU_ASSERT(fabs(median / 120 - 1) < 0.02);
    lg_workload_fini(&w);

    /* The filter holds with the new limits (DistServe's: total < 2048). */
    c.sharegpt_max_input = 2047;
    c.sharegpt_max_total = 2047;
    CU_ASSERT_EQUAL_FATAL(init(&w, &c), 0);
    for (int i = 0; i < 5000; i++) {
        struct lg_prompt p;
        CU_ASSERT_EQUAL_FATAL(lg_workload_make(&w, i, 0, &p), 0);
        CU_ASSERT(p.prompt_len >= 4 && p.output_len >= 4);
        CU_ASSERT(p.prompt_len + p.output_len <= 2047);
        lg_prompt_free(&p);
    }
    lg_workload_fini(&w);

    /* A median above the mean has no lognormal: refused, naming the flag. */
    char msg[256] = "";
    c.sharegpt_output_median = 200;
    CU_ASSERT_EQUAL(lg_workload_init(&w, &c, msg, sizeof(msg)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "--sharegpt-output-median 200"));
    c.sharegpt_output_median = 120;
    c.sharegpt_max_total = 6;
    CU_ASSERT_EQUAL(lg_workload_init(&w, &c, msg, sizeof(msg)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "--sharegpt-max-total 6"));
}

static char *write_trace(const char *text)
{
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/test_bench_trace_XXXXXX");
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_EQUAL_FATAL(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void test_trace(void)
{
    const char *trace = "{\"timestamp\": 2000, \"input_length\": 20, \"output_length\": 3, "
                        "\"hash_ids\": [1, 3]}\n"
                        "\n"
                        "{\"timestamp\": 1000, \"input_length\": 25, \"output_length\": 5, "
                        "\"hash_ids\": [1, 2]}\n"
                        "{\"timestamp\": 2000, \"prompt\": \"hello world\", \"max_tokens\": 2}\r\n"
                        "{\"timestamp\": 2500, \"prompt_len\": 7, \"output_len\": 1}\n";
    char *path = write_trace(trace);
    struct lg_workload_config c;
    lg_workload_config_default(&c);
    c.dataset = LG_DATASET_TRACE;
    c.trace_path = path;
    c.trace_time_scale = 0.001; /* milliseconds */
    c.trace_block_size = 10;
    struct lg_workload w;
    CU_ASSERT_EQUAL_FATAL(init(&w, &c), 0);
    EXPECT_EQ(w.count, 4);
    /* Sorted by time, file order kept for equal times. */
    CU_ASSERT_DOUBLE_EQUAL(lg_workload_arrival(&w, 0), 1.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(lg_workload_arrival(&w, 1), 2.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(lg_workload_arrival(&w, 2), 2.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(lg_workload_arrival(&w, 3), 2.5, 1e-12);
    struct lg_prompt p[4];
    for (int i = 0; i < 4; i++) {
        CU_ASSERT_EQUAL_FATAL(lg_workload_make(&w, i, 0, &p[i]), 0);
    }
    EXPECT_EQ(p[0].prompt_len, 25); /* blocks 1, 2 then 5 own tokens */
    EXPECT_EQ(p[0].output_len, 5);
    EXPECT_EQ(p[1].prompt_len, 20); /* blocks 1, 3 */
    EXPECT_EQ(p[1].output_len, 3);
    CU_ASSERT_DOUBLE_EQUAL(p[1].arrival_s, 2.0, 1e-12);
    CU_ASSERT_STRING_EQUAL(p[2].text, "hello world");
    EXPECT_EQ(p[2].output_len, 2);
    EXPECT_EQ(p[3].prompt_len, 7);
    /* Block 1 is the same text in both; blocks 2 and 3 differ. */
    CU_ASSERT_EQUAL(memcmp(p[0].text, p[1].text, 10), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(p[0].text + 10, p[1].text + 10, 10), 0);
    for (int i = 0; i < 4; i++) {
        lg_prompt_free(&p[i]);
    }
    /* Warm-ups: other contents, even for a literal prompt. */
    struct lg_prompt wu;
    CU_ASSERT_EQUAL(lg_workload_make(&w, 2, 1, &wu), 0);
    EXPECT_EQ(wu.text_len, 11);
    CU_ASSERT_STRING_NOT_EQUAL(wu.text, "hello world");
    lg_prompt_free(&wu);
    lg_workload_fini(&w);
    unlink(path);

    /* Errors name the file and line. */
    path = write_trace("{\"input_length\": 5, \"output_length\": 1}\n{\"input_length\": 5}\n");
    c.trace_path = path;
    CU_ASSERT_EQUAL(lg_workload_init(&w, &c, err, sizeof(err)), TANDEM_EFORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, ":2: output_length"));
    unlink(path);
    path = write_trace("{\"input_length\": 5, \"output_length\": 1}\nnot json\n");
    c.trace_path = path;
    CU_ASSERT_EQUAL(lg_workload_init(&w, &c, err, sizeof(err)), TANDEM_EFORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, ":2: bad JSON"));
    unlink(path);
    path = write_trace("{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1}\n"
                       "{\"input_length\": 5, \"output_length\": 1}\n");
    c.trace_path = path;
    CU_ASSERT_EQUAL(lg_workload_init(&w, &c, err, sizeof(err)), TANDEM_EFORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "all or none"));
    unlink(path);
    /* No timestamps: arrivals come from the arrival process. */
    path = write_trace("{\"input_length\": 5, \"output_length\": 1}\n");
    c.trace_path = path;
    CU_ASSERT_EQUAL_FATAL(init(&w, &c), 0);
    CU_ASSERT(lg_workload_arrival(&w, 0) < 0);
    lg_workload_fini(&w);
    unlink(path);
    c.trace_path = "/nonexistent/trace.jsonl";
    CU_ASSERT_EQUAL(lg_workload_init(&w, &c, err, sizeof(err)), TANDEM_EIO);
}

static void test_dataset_names(void)
{
    enum lg_dataset d;
    const char *names[] = {"random",     "shared-prefix",  "multi-turn",
                           "long-short", "sharegpt-synth", "trace"};
    for (int i = 0; i < LG_DATASET_COUNT; i++) {
        CU_ASSERT_EQUAL(lg_dataset_parse(names[i], &d), 0);
        CU_ASSERT_EQUAL((int)d, i);
        CU_ASSERT_STRING_EQUAL(lg_dataset_name(d), names[i]);
    }
    CU_ASSERT_EQUAL(lg_dataset_parse("generated-shared-prefix", &d), 0);
    CU_ASSERT_EQUAL(d, LG_DATASET_SHARED_PREFIX);
    CU_ASSERT_EQUAL(lg_dataset_parse("sonnet", &d), TANDEM_EINVAL);
    /* `tandem bench` shows this list in its help and its unknown-name error. */
    char buf[128];
    CU_ASSERT_STRING_EQUAL(lg_dataset_names(buf, sizeof(buf)),
                           "random, shared-prefix, multi-turn, long-short, sharegpt-synth, trace");
    CU_ASSERT_STRING_EQUAL(lg_dataset_names(buf, 10), "random, s"); /* truncated, terminated */
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("bench_workload", NULL, NULL);
    CU_add_test(s, "text_fill", test_text_fill);
    CU_add_test(s, "random", test_random);
    CU_add_test(s, "shared_prefix", test_shared_prefix);
    CU_add_test(s, "multi_turn", test_multi_turn);
    CU_add_test(s, "long_short", test_long_short);
    CU_add_test(s, "sharegpt", test_sharegpt);
    CU_add_test(s, "sharegpt-stats", test_sharegpt_stats);
    CU_add_test(s, "trace", test_trace);
    CU_add_test(s, "dataset_names", test_dataset_names);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
