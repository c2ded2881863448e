/* The sim backend and its presets: hand-computed step times, deterministic
 * tokens and KV payloads, KV capacity, sleeping, bad configurations. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "block_hash.h"
#include "kv_cache.h"
#include "log.h"
#include "presets.h"
#include "sim.h"
#include "tandem_err.h"

/* Published constants, written out by hand (not read from the presets). */
#define P8B        8030261248.0  /* llama-3-8b parameters */
#define P70B       70553706496.0 /* llama-3-70b parameters */
#define P13B_OPT   12853473280.0 /* opt-13b, from its config.json (see test_opt_presets) */
#define H100_FLOPS 989.5e12
#define H100_BW    3.35e12
#define H100_HBM   80e9
#define H100_NVL   450e9

#define ASSERT_REL(got, want)                                                                      \
    do {                                                                                           \
        double g_ = (got), w_ = (want);                                                            \
        if (!(fabs(g_ - w_) <= 1e-9 * fabs(w_))) {                                                 \
            fprintf(stderr, "\n%s:%d: got %.17g want %.17g\n", __FILE__, __LINE__, g_, w_);        \
        }                                                                                          \
        CU_ASSERT(fabs(g_ - w_) <= 1e-9 * fabs(w_));                                               \
    } while (0)

static struct backend *make(const char *model, const char *gpu, int tp, double scale)
{
    struct sim_config cfg;
    sim_default_config(&cfg);
    cfg.model = model;
    cfg.gpu = gpu;
    cfg.tp = tp;
    cfg.time_scale = scale;
    struct backend *be = NULL;
    int rc = sim_create(&be, &cfg);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    return be;
}

static struct kv_pool *make_pool(const struct backend *be, enum kv_dtype dt, int n_blocks, int div)
{
    struct kv_config kc = {.n_layers = be->info.n_layers,
                           .n_kv_heads = be->info.n_kv_heads,
                           .head_dim = be->info.head_dim,
                           .block_size = 16,
                           .dtype = dt,
                           .n_blocks = n_blocks,
                           .payload_div = div};
    struct kv_pool *pool = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&pool, &kc), 0);
    return pool;
}

/* A deterministic prompt: tokens below 128000. */
static void fill_tokens(uint32_t *t, int n, uint32_t salt)
{
    for (int i = 0; i < n; i++) {
        t[i] = (uint32_t)((i * 2654435761u + salt * 40503u) % 128000u);
    }
}

static void test_presets(void)
{
    CU_ASSERT_EQUAL(preset_model_params(preset_model_find("llama-3-8b")), 8030261248ull);
    CU_ASSERT_EQUAL(preset_model_params(preset_model_find("llama-3-70b")), 70553706496ull);
    CU_ASSERT_EQUAL(preset_model_params(preset_model_find("llama-3.1-405b")), 405853388800ull);
    CU_ASSERT_EQUAL(preset_model_params(preset_model_find("qwen2.5-7b")), 7615616512ull);
    CU_ASSERT_EQUAL(preset_model_params(preset_model_find("qwen2.5-72b")), 72706203648ull);
    CU_ASSERT_EQUAL(preset_model_weight_bytes(preset_model_find("llama-3-70b")), 141107412992ull);
    const struct preset_model *m = preset_model_find("llama-3-70b");
    CU_ASSERT_EQUAL(m->n_layers, 80);
    CU_ASSERT_EQUAL(m->dim, 8192);
    CU_ASSERT_EQUAL(m->n_heads, 64);
    CU_ASSERT_EQUAL(m->n_kv_heads, 8);
    CU_ASSERT_EQUAL(m->head_dim, 128);
    CU_ASSERT_EQUAL(m->ffn_dim, 28672);
    CU_ASSERT_EQUAL(m->vocab_size, 128256);
    CU_ASSERT_PTR_NULL(preset_model_find("llama-1-7b"));
    /* Llama 2 (the calibrated models): the published totals. */
    CU_ASSERT_EQUAL(preset_model_params(preset_model_find("llama-2-7b")), 6738415616ull);
    CU_ASSERT_EQUAL(preset_model_params(preset_model_find("llama-2-13b")), 13015864320ull);
    CU_ASSERT_EQUAL(preset_model_params(preset_model_find("llama-2-70b")), 68976648192ull);
    CU_ASSERT_PTR_NULL(preset_gpu_find("h100"));
    CU_ASSERT_PTR_NULL(preset_link_find(NULL));
    const struct preset_gpu *g = preset_gpu_find("a100-80g");
    CU_ASSERT_EQUAL(g->flops, 312e12);
    CU_ASSERT_EQUAL(g->hbm_bw, 2.039e12);
    CU_ASSERT_EQUAL(g->hbm_bytes, 80e9);
    CU_ASSERT_EQUAL(preset_gpu_find("h200")->hbm_bw, 4.8e12);
    CU_ASSERT_EQUAL(preset_gpu_find("b200")->flops, 2.25e15);
    CU_ASSERT_EQUAL(preset_link_find("ib-400g")->bw, 50e9);
    CU_ASSERT(preset_model_count() >= 2 && preset_gpu_count() >= 4 && preset_link_count() >= 4);
    CU_ASSERT_PTR_NULL(preset_model_at(preset_model_count()));
    char names[512];
    preset_gpu_names(names, sizeof(names));
    CU_ASSERT_STRING_EQUAL(names, "a100-80g, h100-sxm, h200, b200");
    preset_model_names(names, 12);
    CU_ASSERT_STRING_EQUAL(names, "llama-3-8b,"); /* truncated, terminated */
}

/* The OPT family: parameters counted by hand from each config.json (the
 * Hugging Face checkpoints' tensors), the paper's rounded sizes, MHA shapes. */
static void test_opt_presets(void)
{
    /* opt-13b: d 5120, ffn 20480, 40 layers, vocab 50272, 2048 + 2 position rows.
     * Per layer: q, k, v, out (d x d + d each), fc1 (d x ffn + ffn), fc2
     * (ffn x d + d), two LayerNorms (2 d each); plus token and position
     * tables and the final LayerNorm; the LM head is tied. */
    uint64_t d = 5120, f = 20480;
    uint64_t layer = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d;
    uint64_t want13 = 50272 * d + 2050 * d + 40 * layer + 2 * d;
    CU_ASSERT_EQUAL(want13, 12853473280ull);
    CU_ASSERT_EQUAL(preset_model_params(preset_model_find("opt-13b")), 12853473280ull);
    CU_ASSERT_EQUAL(preset_model_params(preset_model_find("opt-66b")), 65719701504ull);
    CU_ASSERT_EQUAL(preset_model_params(preset_model_find("opt-175b")), 174604468224ull);
    /* Zhang et al. 2022 name them by their rounded size. */
    CU_ASSERT_EQUAL(llround(P13B_OPT / 1e9), 13);
    CU_ASSERT_EQUAL(llround(65719701504.0 / 1e9), 66);
    CU_ASSERT_EQUAL(llround(174604468224.0 / 1e9), 175);

    const struct preset_model *m = preset_model_find("opt-66b");
    CU_ASSERT_EQUAL(m->n_layers, 64);
    CU_ASSERT_EQUAL(m->dim, 9216);
    CU_ASSERT_EQUAL(m->n_heads, 72);
    CU_ASSERT_EQUAL(m->n_kv_heads, 72);
    CU_ASSERT_EQUAL(m->head_dim, 128);
    CU_ASSERT_EQUAL(m->ffn_dim, 36864);
    CU_ASSERT_EQUAL(m->max_context, 2048);
    CU_ASSERT_EQUAL(m->learned_positions, 2050);
    CU_ASSERT_EQUAL(m->mlp, PRESET_MLP_FC);
    CU_ASSERT_EQUAL(m->norm, PRESET_NORM_LAYER);
    CU_ASSERT_EQUAL(preset_model_find("opt-175b")->n_layers, 96);
    CU_ASSERT_EQUAL(preset_model_find("opt-175b")->dim, 12288);
    CU_ASSERT_EQUAL(preset_model_find("opt-175b")->n_heads, 96);
    /* The llama family keeps its defaults. */
    m = preset_model_find("llama-3-8b");
    CU_ASSERT_EQUAL(m->mlp, PRESET_MLP_GATED);
    CU_ASSERT_EQUAL(m->norm, PRESET_NORM_RMS);
    CU_ASSERT_EQUAL(m->learned_positions, 0);
    CU_ASSERT_EQUAL(m->o_bias, 0);
    CU_ASSERT_EQUAL(m->special_below, 0);
}

/* KV bytes per token with n_kv_heads = n_heads (MHA), the KV capacity they
 * give, and tokens that are never OPT's special ids (0..3, and 50265 up). */
static void test_opt_kv_tokens(void)
{
    struct backend *be = make("opt-13b", "h100-sxm", 1, 0.0);
    /* 40 heads x 128 x 40 layers x (K and V) x 2 bytes */
    CU_ASSERT_EQUAL(backend_kv_bytes_per_token(&be->info, KV_DTYPE_BF16), 819200u);
    CU_ASSERT_EQUAL(backend_kv_bytes_per_token(&be->info, KV_DTYPE_FP8), 409600u);
    CU_ASSERT_EQUAL(be->info.n_kv_heads, 40);
    CU_ASSERT_EQUAL(be->info.max_context, 2048);
    CU_ASSERT_EQUAL(be->info.eos_id, 2);
    /* (80 GB x 0.9 - 2 B x 12,853,473,280) / (819,200 B x 16) = 3531.88 */
    int32_t blocks = 0;
    CU_ASSERT_EQUAL(sim_kv_capacity_blocks(be, KV_DTYPE_BF16, 16, &blocks), 0);
    CU_ASSERT_EQUAL(blocks, 3531);
    uint32_t lo = UINT32_MAX, hi = 0;
    for (uint32_t i = 0; i < 200000; i++) {
        uint32_t ctx[2] = {i % 50265u, i / 50265u};
        uint32_t t = sim_next_token(be, 1, ctx, 2, NULL);
        lo = t < lo ? t : lo;
        hi = t > hi ? t : hi;
    }
    CU_ASSERT_EQUAL(lo, 4u); /* 200,000 draws over 50,261 ids reach both ends */
    CU_ASSERT_EQUAL(hi, 50264u);
    be->ops->destroy(be);

    be = make("opt-66b", "h100-sxm", 2, 0.0);
    CU_ASSERT_EQUAL(backend_kv_bytes_per_token(&be->info, KV_DTYPE_BF16), 2u * 64 * 72 * 128 * 2);
    be->ops->destroy(be);
    be = make("opt-175b", "h100-sxm", 8, 0.0);
    CU_ASSERT_EQUAL(backend_kv_bytes_per_token(&be->info, KV_DTYPE_BF16), 2u * 96 * 96 * 128 * 2);
    be->ops->destroy(be);
}

/* Modelled step times of opt-13b on one H100, by hand: a decode step of four
 * sequences (memory-bound) and a 1024-token prefill (compute-bound). */
static void test_opt_step(void)
{
    struct backend *be = make("opt-13b", "h100-sxm", 1, 0.0);
    static uint32_t hist[2048];
    fill_tokens(hist, 2048, 8);
    for (int i = 0; i < 2048; i++) {
        hist[i] %= 50265u; /* OPT's vocabulary */
    }
    const int pos[4] = {100, 500, 1000, 2000};
    struct be_seq seqs[4];
    struct be_out out[4];
    for (int i = 0; i < 4; i++) {
        seqs[i] = (struct be_seq){.blocks = NULL, .pos = pos[i], .history = hist, .seed = 1};
    }
    CU_ASSERT_EQUAL(be->ops->decode(be, NULL, 4, seqs, out), 0);
    be->ops->step_end(be);
    /* bytes = 2 x 12,853,473,280 + 819,200 x (101 + 501 + 1001 + 2001)
     *       = 25,706,946,560 + 2,952,396,800 = 28,659,343,360
     * t = 28,659,343,360 / (3.35e12 x 0.7) + 1 ms = 13.2215 ms */
    ASSERT_REL(sim_last_step_seconds(be), 28659343360.0 / (3.35e12 * 0.7) + 1e-3);
    CU_ASSERT_DOUBLE_EQUAL(sim_last_step_seconds(be), 0.0132214684, 1e-10);
    struct sim_step st;
    sim_last_step(be, &st);
    ASSERT_REL(st.bytes, 28659343360.0);
    ASSERT_REL(st.flops, 2.0 * P13B_OPT * 4 + 4.0 * 40 * 40 * 128 * 3604);
    CU_ASSERT(st.memory_s > st.compute_s);

    struct be_seq p = {.blocks = NULL, .pos = 0, .history = hist, .seed = 2};
    struct be_out o;
    CU_ASSERT_EQUAL(be->ops->prefill(be, NULL, &p, hist, 1024, &o, NULL), 0);
    be->ops->step_end(be);
    /* FLOPs = 2 x 12,853,473,280 x 1024 + 4 x 40 x 40 x 128 x (1024 x 1025 / 2)
     *       = 26,323,913,277,440 + 429,916,160,000 = 26,753,829,437,440
     * t = FLOPs / (989.5e12 x 0.5) + 1 ms = 55.0755 ms */
    ASSERT_REL(sim_last_step_seconds(be), 26753829437440.0 / (989.5e12 * 0.5) + 1e-3);
    CU_ASSERT_DOUBLE_EQUAL(sim_last_step_seconds(be), 0.0550754511, 1e-10);
    be->ops->destroy(be);
}

/* A prefill-only step: one chunk of 512 tokens at position 0 of llama-3-8b on
 * one H100 (compute-bound). */
static void test_step_prefill(void)
{
    struct backend *be = make("llama-3-8b", "h100-sxm", 1, 0.0);
    uint32_t hist[512];
    fill_tokens(hist, 512, 1);
    struct be_seq seq = {.blocks = NULL, .pos = 0, .history = hist, .seed = 7};
    struct be_out out;
    CU_ASSERT_EQUAL(be->ops->prefill(be, NULL, &seq, hist, 512, &out, NULL), 0);
    be->ops->step_end(be);

    double kvbpt = 2.0 * 32 * 8 * 128 * 2; /* 131072 */
    double keys = 512.0 * 513.0 / 2.0;
    double flops = 2.0 * P8B * 512 + 4.0 * 32 * 32 * 128 * keys;
    double bytes = 2.0 * P8B + kvbpt * 512;
    double compute = flops / (H100_FLOPS * 0.5);
    double memory = bytes / (H100_BW * 0.7);
    CU_ASSERT(compute > memory);
    ASSERT_REL(sim_last_step_seconds(be), compute + 1e-3);
    struct sim_step st;
    sim_last_step(be, &st);
    CU_ASSERT_EQUAL(st.tokens, 512);
    CU_ASSERT_EQUAL(st.calls, 1);
    ASSERT_REL(st.flops, flops);
    ASSERT_REL(st.bytes, bytes);
    ASSERT_REL(st.memory_s, memory);
    CU_ASSERT_EQUAL(st.allreduce_s, 0.0);

    /* An empty step costs nothing, not even the overhead. */
    be->ops->step_end(be);
    CU_ASSERT_EQUAL(sim_last_step_seconds(be), 0.0);
    be->ops->destroy(be);
}

/* A decode-only step: four sequences at different positions (memory-bound). */
static void test_step_decode(void)
{
    struct backend *be = make("llama-3-8b", "h100-sxm", 1, 0.0);
    static uint32_t hist[8192];
    fill_tokens(hist, 8192, 2);
    const int pos[4] = {100, 1000, 4000, 8000};
    struct be_seq seqs[4];
    struct be_out out[4];
    for (int i = 0; i < 4; i++) {
        seqs[i] = (struct be_seq){.blocks = NULL, .pos = pos[i], .history = hist, .seed = 1};
    }
    CU_ASSERT_EQUAL(be->ops->decode(be, NULL, 4, seqs, out), 0);
    be->ops->step_end(be);

    double kvbpt = 131072.0;
    double keys = 101.0 + 1001.0 + 4001.0 + 8001.0;
    double flops = 2.0 * P8B * 4 + 4.0 * 32 * 32 * 128 * keys;
    double bytes = 2.0 * P8B + kvbpt * keys;
    double compute = flops / (H100_FLOPS * 0.5);
    double memory = bytes / (H100_BW * 0.7);
    CU_ASSERT(memory > compute);
    ASSERT_REL(sim_last_step_seconds(be), memory + 1e-3);
    be->ops->destroy(be);
}

/* A mixed step: a prefill chunk (256 tokens at position 256) and two decodes,
 * plus the KV dtype of the pool (fp8: 1 byte per value). */
static void test_step_mixed(void)
{
    struct backend *be = make("llama-3-8b", "h100-sxm", 1, 0.0);
    struct kv_pool *pool = make_pool(be, KV_DTYPE_FP8, 64, -1); /* no payload */
    static uint32_t hist[2048];
    fill_tokens(hist, 2048, 3);
    int32_t blocks[128];
    for (int i = 0; i < 128; i++) {
        blocks[i] = i % 64;
    }
    struct be_seq p = {.blocks = blocks, .pos = 256, .history = hist, .seed = 1};
    struct be_out o;
    CU_ASSERT_EQUAL(be->ops->prefill(be, pool, &p, hist + 256, 256, &o, NULL), 0);
    struct be_seq d[2] = {{.blocks = blocks, .pos = 1500, .history = hist, .seed = 2},
                          {.blocks = blocks, .pos = 2000, .history = hist, .seed = 3}};
    struct be_out od[2];
    CU_ASSERT_EQUAL(be->ops->decode(be, pool, 2, d, od), 0);
    be->ops->step_end(be);

    double kvbpt = 2.0 * 32 * 8 * 128 * 1; /* fp8 */
    double keys = 256.0 * 256.0 + 256.0 * 257.0 / 2.0 + 1501.0 + 2001.0;
    double kvtok = 512.0 + 1501.0 + 2001.0;
    double flops = 2.0 * P8B * (256 + 2) + 4.0 * 32 * 32 * 128 * keys;
    double bytes = 2.0 * P8B + kvbpt * kvtok;
    double compute = flops / (H100_FLOPS * 0.5);
    double memory = bytes / (H100_BW * 0.7);
    ASSERT_REL(sim_last_step_seconds(be), fmax(compute, memory) + 1e-3);
    struct sim_step st;
    sim_last_step(be, &st);
    CU_ASSERT_EQUAL(st.tokens, 258);
    CU_ASSERT_EQUAL(st.calls, 3);
    kv_pool_destroy(pool);
    be->ops->destroy(be);
}

/* Tensor parallelism: rates x tp plus two ring all-reduces per layer. */
static void test_step_tp(void)
{
    struct backend *be = make("llama-3-70b", "h100-sxm", 2, 0.0);
    static uint32_t hist[1024];
    fill_tokens(hist, 1024, 4);
    struct be_seq seq = {.blocks = NULL, .pos = 0, .history = hist, .seed = 1};
    struct be_out out;
    CU_ASSERT_EQUAL(be->ops->prefill(be, NULL, &seq, hist, 1024, &out, NULL), 0);
    be->ops->step_end(be);
    double kvbpt = 2.0 * 80 * 8 * 128 * 2;
    double keys = 1024.0 * 1025.0 / 2.0;
    double flops = 2.0 * P70B * 1024 + 4.0 * 80 * 64 * 128 * keys;
    double bytes = 2.0 * P70B + kvbpt * 1024;
    double compute = flops / (H100_FLOPS * 2 * 0.5);
    double memory = bytes / (H100_BW * 2 * 0.7);
    double ar = 2.0 * 80 * (5e-6 + 2.0 * (2 - 1) / 2 * (1024.0 * 8192 * 2) / H100_NVL);
    ASSERT_REL(sim_last_step_seconds(be), fmax(compute, memory) + ar + 1e-3);
    struct sim_step st;
    sim_last_step(be, &st);
    ASSERT_REL(st.allreduce_s, ar);
    ASSERT_REL(sim_transfer_seconds(be, 1000000000ull), 5e-6 + 1e9 / (50e9 * 2));
    be->ops->destroy(be);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The sim's one way to sleep is clock_nanosleep (engine/sim.h). This
 * definition takes libc's place in this executable: it records each call,
 * then sleeps for real through the system call, so test_sleep checks the
 * deadline the model asks for instead of bounding wall time. */
static struct {
    int calls;
    clockid_t clock;
    int flags;
    struct timespec deadline;
} slept;

int clock_nanosleep(clockid_t clock, int flags, const struct timespec *req, struct timespec *rem)
{
    slept.calls++;
    slept.clock = clock;
    slept.flags = flags;
    slept.deadline = *req;
    return syscall(SYS_clock_nanosleep, clock, flags, req, rem) == 0 ? 0 : errno;
}

/* time_scale 0 never sleeps; time_scale > 0 sleeps until the step's first
 * call + the scaled modelled time. */
static void test_sleep(void)
{
    static uint32_t hist[8192];
    fill_tokens(hist, 8192, 5);
    struct be_seq seq = {.blocks = NULL, .pos = 0, .history = hist, .seed = 1};
    struct be_out out;

    struct backend *be = make("llama-3-70b", "h100-sxm", 2, 0.0);
    memset(&slept, 0, sizeof(slept));
    CU_ASSERT_EQUAL(be->ops->prefill(be, NULL, &seq, hist, 8192, &out, NULL), 0);
    be->ops->step_end(be);
    CU_ASSERT(sim_last_step_seconds(be) > 1.0); /* a full second of modelled work */
    CU_ASSERT_EQUAL(slept.calls, 0);
    be->ops->destroy(be);

    be = make("llama-3-8b", "h100-sxm", 1, 4.0);
    CU_ASSERT_DOUBLE_EQUAL(sim_time_scale(be), 4.0, 0.0);
    struct be_seq d = {.blocks = NULL, .pos = 100, .history = hist, .seed = 1};
    memset(&slept, 0, sizeof(slept));
    double t0 = now_s();
    CU_ASSERT_EQUAL(be->ops->decode(be, NULL, 1, &d, &out), 0);
    double t1 = now_s(); /* the step's first call was between t0 and t1 */
    be->ops->step_end(be);
    double t2 = now_s();
    double want = sim_last_step_seconds(be) * 4.0; /* about 32 ms */
    CU_ASSERT(want > 0.02);
    CU_ASSERT_EQUAL(slept.calls, 1);
    CU_ASSERT_EQUAL(slept.clock, CLOCK_MONOTONIC);
    CU_ASSERT_EQUAL(slept.flags, TIMER_ABSTIME);
    double deadline = (double)slept.deadline.tv_sec + (double)slept.deadline.tv_nsec * 1e-9;
    /* 1 us covers the nanosecond truncation and the conversions to double. */
    if (!(deadline >= t0 + want - 1e-6 && deadline <= t1 + want + 1e-6)) {
        printf("\n  deadline %.9f, first call in [%.9f, %.9f], want %.9f s after it\n", deadline,
               t0, t1, want);
    }
    CU_ASSERT(deadline >= t0 + want - 1e-6 && deadline <= t1 + want + 1e-6);
    /* An absolute sleep on CLOCK_MONOTONIC never returns before its
     * deadline: a lower bound on the same clock cannot flake. */
    CU_ASSERT(t2 >= deadline);
    be->ops->destroy(be);
}

/* Llama 2's special ids sit at the bottom (0 <unk>, 1 <s>, 2 </s>): the sim
 * never emits them, so a sequence never ends on EOS. 100k draws would hit
 * one of the three with probability 1 - e^-9.4 if they were allowed. */
static void test_tokens_low_specials(void)
{
    struct backend *be = make("llama-2-7b", "a100-80g", 1, 0.0);
    uint32_t lo = UINT32_MAX, hi = 0;
    for (uint32_t i = 0; i < 100000; i++) {
        uint32_t ctx[2] = {1, 3 + i % 31997};
        uint32_t t = sim_next_token(be, i, ctx, 2, NULL);
        lo = t < lo ? t : lo;
        hi = t > hi ? t : hi;
    }
    if (lo < 3 || hi >= 32000) {
        fprintf(stderr, "\nllama-2-7b tokens in [%u, %u], want [3, 32000)\n", lo, hi);
    }
    CU_ASSERT(lo >= 3 && lo < 10);
    CU_ASSERT(hi < 32000 && hi > 31990);
    be->ops->destroy(be);
}

static void test_tokens(void)
{
    struct backend *a = make("llama-3-8b", "h100-sxm", 1, 0.0);
    struct backend *b = make("llama-3-8b", "a100-80g", 1, 0.0);
    static uint32_t hist[300];
    fill_tokens(hist, 300, 6);
    int differ_seed = 0;
    for (int n = 1; n <= 100; n++) {
        float lp1, lp2, lp3;
        uint32_t t1 = sim_next_token(a, 42, hist, n, &lp1);
        uint32_t t2 = sim_next_token(b, 42, hist, n, &lp2); /* another instance agrees */
        uint32_t t3 = sim_next_token(a, 43, hist, n, &lp3);
        CU_ASSERT_EQUAL(t1, t2);
        CU_ASSERT_EQUAL(lp1, lp2);
        CU_ASSERT(t1 < 128000u); /* never a special token, so never EOS */
        CU_ASSERT(lp1 <= 0.0f && lp1 > -4.0f);
        differ_seed += t1 != t3;
    }
    CU_ASSERT_EQUAL(differ_seed, 100);

    /* The token depends on the whole context, not just the last token. */
    uint32_t before = sim_next_token(a, 1, hist, 200, NULL);
    uint32_t saved = hist[3];
    hist[3] = (hist[3] + 1) % 128000u;
    CU_ASSERT_NOT_EQUAL(sim_next_token(a, 1, hist, 200, NULL), before);
    hist[3] = saved;

    /* prefill and decode emit sim_next_token; decode results do not depend
     * on the batch. */
    struct be_seq seq = {.blocks = NULL, .pos = 0, .history = hist, .seed = 9};
    struct be_out out;
    CU_ASSERT_EQUAL(a->ops->prefill(a, NULL, &seq, hist, 150, &out, NULL), 0);
    float lp;
    CU_ASSERT_EQUAL(out.token, sim_next_token(a, 9, hist, 150, &lp));
    CU_ASSERT_EQUAL(out.logprob, lp);
    struct be_seq batch[3] = {{.pos = 40, .history = hist, .seed = 1},
                              {.pos = 150, .history = hist, .seed = 9},
                              {.pos = 299, .history = hist, .seed = 2}};
    struct be_out outs[3], alone;
    CU_ASSERT_EQUAL(a->ops->decode(a, NULL, 3, batch, outs), 0);
    CU_ASSERT_EQUAL(a->ops->decode(a, NULL, 1, &batch[1], &alone), 0);
    CU_ASSERT_EQUAL(outs[1].token, alone.token);
    CU_ASSERT_EQUAL(outs[1].token, sim_next_token(a, 9, hist, 151, NULL));
    CU_ASSERT_EQUAL(outs[2].token, sim_next_token(a, 2, hist, 300, NULL));
    CU_ASSERT_EQUAL(a->info.emits_tokens, 1);
    CU_ASSERT_EQUAL(a->info.vocab_size, 128256);
    CU_ASSERT_EQUAL(a->info.eos_id, 128001);
    CU_ASSERT_STRING_EQUAL(a->info.name, "llama-3-8b");
    a->ops->destroy(a);
    b->ops->destroy(b);
}

/* Checks every block of a sequence of n tokens against sim_block_payload. */
static void check_payloads(struct kv_pool *pool, const int32_t *blocks, const uint32_t *hist, int n,
                           uint64_t root)
{
    size_t len = kv_block_bytes(pool);
    uint8_t *want = malloc(len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(want);
    uint64_t parent = root;
    for (int b = 0; b * 16 < n; b++) {
        int k = n - b * 16 < 16 ? n - b * 16 : 16;
        sim_block_payload(want, len, parent, hist + b * 16, k, 16);
        if (k == 16) {
            uint64_t h = bh_block(parent, hist + b * 16, 16);
            uint8_t *full = malloc(len);
            sim_payload_fill(full, len, h); /* a full block is a function of its hash */
            CU_ASSERT_EQUAL(memcmp(full, want, len), 0);
            free(full);
            parent = h;
        }
        CU_ASSERT_EQUAL(memcmp(kv_block_data(pool, blocks[b]), want, len), 0);
    }
    free(want);
}

static void test_payload(void)
{
    struct backend *be = make("llama-3-8b", "h100-sxm", 1, 0.0);
    uint64_t root = bh_root("llama-3-8b");
    static uint32_t hist[64];
    fill_tokens(hist, 64, 7);

    /* The byte stream itself: fixed values, so a change of generator shows. */
    uint8_t s[11];
    sim_payload_fill(s, sizeof(s), 0);
    uint8_t s2[3];
    sim_payload_fill(s2, sizeof(s2), 0);
    CU_ASSERT_EQUAL(memcmp(s, s2, 3), 0); /* a prefix of a longer fill */
    CU_ASSERT_EQUAL(s[0], 0xAF);          /* mix64(golden) = 0xE220A8397B1DCDAF, LE */
    CU_ASSERT_EQUAL(s[7], 0xE2);

    /* P: all at once, 40 tokens = 2 full blocks + 8 in the third, then 8
     * decodes complete the third block. Blocks are scattered in the pool. */
    struct kv_pool *p = make_pool(be, KV_DTYPE_FP8, 8, 1);
    CU_ASSERT_EQUAL(kv_block_bytes(p), 2u * 32 * 8 * 128 * 16); /* fp8: 1 MiB */
    int32_t pb[4] = {5, 2, 7, 0};
    struct be_seq seq = {.blocks = pb, .pos = 0, .history = hist, .seed = 1};
    struct be_out out;
    CU_ASSERT_EQUAL(be->ops->prefill(be, p, &seq, hist, 40, &out, NULL), 0);
    check_payloads(p, pb, hist, 40, root);
    for (int pos = 40; pos < 50; pos++) {
        seq.pos = pos;
        CU_ASSERT_EQUAL(be->ops->decode(be, p, 1, &seq, &out), 0);
        check_payloads(p, pb, hist, pos + 1, root);
    }

    /* D: another pool, other block ids, chunked prefill of sizes 1, 7, 16, 26
     * ends with the same bytes. */
    struct kv_pool *d = make_pool(be, KV_DTYPE_FP8, 8, 1);
    int32_t db[4] = {1, 3, 4, 6};
    const int chunks[] = {1, 7, 16, 26};
    int pos = 0;
    for (int i = 0; i < 4; i++) {
        struct be_seq c = {.blocks = db, .pos = pos, .history = hist, .seed = 1};
        CU_ASSERT_EQUAL(be->ops->prefill(be, d, &c, hist + pos, chunks[i], &out, NULL), 0);
        pos += chunks[i];
    }
    for (int b = 0; b < 4; b++) {
        CU_ASSERT_EQUAL(memcmp(kv_block_data(p, pb[b]), kv_block_data(d, db[b]), kv_block_bytes(p)),
                        0);
    }

    /* payload_div: 1/N of the bytes, rounded up, same definition. */
    const int divs[] = {3, 4, 1000};
    for (int i = 0; i < 3; i++) {
        struct kv_pool *q = make_pool(be, KV_DTYPE_BF16, 4, divs[i]);
        size_t full = 131072u * 16;
        CU_ASSERT_EQUAL(kv_block_bytes(q), (full + (size_t)divs[i] - 1) / (size_t)divs[i]);
        struct be_seq c = {.blocks = pb, .pos = 0, .history = hist, .seed = 1};
        int32_t qb[3] = {3, 1, 2};
        c.blocks = qb;
        CU_ASSERT_EQUAL(be->ops->prefill(be, q, &c, hist, 37, &out, NULL), 0);
        check_payloads(q, qb, hist, 37, root);
        kv_pool_destroy(q);
    }
    struct kv_pool *none = make_pool(be, KV_DTYPE_BF16, 4, -1);
    CU_ASSERT_EQUAL(kv_block_bytes(none), 0u);
    CU_ASSERT_PTR_NULL(kv_block_data(none, 0));
    struct be_seq c = {.blocks = pb, .pos = 0, .history = hist, .seed = 1};
    CU_ASSERT_EQUAL(be->ops->prefill(be, none, &c, hist, 40, &out, NULL), 0);
    kv_pool_destroy(none);

    kv_pool_destroy(d);
    kv_pool_destroy(p);
    be->ops->step_end(be);
    be->ops->destroy(be);
}

static void test_bad_calls(void)
{
    struct backend *be = make("llama-3-8b", "h100-sxm", 1, 0.0);
    static uint32_t hist[8200];
    fill_tokens(hist, 8200, 8);
    struct be_out out;
    struct be_seq seq = {.blocks = NULL, .pos = 8190, .history = hist, .seed = 1};
    CU_ASSERT_EQUAL(be->ops->prefill(be, NULL, &seq, hist + 8190, 3, &out, NULL), TANDEM_ERANGE);
    seq.pos = 0;
    CU_ASSERT_EQUAL(be->ops->prefill(be, NULL, &seq, hist + 1, 3, &out, NULL), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(be->ops->prefill(be, NULL, &seq, hist, 0, &out, NULL), TANDEM_EINVAL);
    hist[1] = 128256; /* >= vocab */
    CU_ASSERT_EQUAL(be->ops->prefill(be, NULL, &seq, hist, 3, &out, NULL), TANDEM_EINVAL);
    hist[1] = 5;
    seq.history = NULL;
    CU_ASSERT_EQUAL(be->ops->decode(be, NULL, 1, &seq, &out), TANDEM_EINVAL);
    /* Payload pool but no block table; block id outside the pool. */
    struct kv_pool *p = make_pool(be, KV_DTYPE_FP8, 2, 8);
    seq.history = hist;
    CU_ASSERT_EQUAL(be->ops->prefill(be, p, &seq, hist, 3, &out, NULL), TANDEM_EINVAL);
    int32_t blocks[1] = {2};
    seq.blocks = blocks;
    CU_ASSERT_EQUAL(be->ops->decode(be, p, 1, &seq, &out), TANDEM_EINVAL);
    kv_pool_destroy(p);
    /* Nothing was accounted by the failed calls. */
    be->ops->step_end(be);
    CU_ASSERT_EQUAL(sim_last_step_seconds(be), 0.0);
    be->ops->destroy(be);
}

static void test_capacity(void)
{
    struct backend *be = make("llama-3-8b", "h100-sxm", 1, 0.0);
    int32_t n = 0;
    CU_ASSERT_EQUAL(sim_kv_capacity_blocks(be, KV_DTYPE_BF16, 16, &n), 0);
    /* (80e9 x 0.9 - 2 x 8030261248) / (131072 x 16) = 26674.02 */
    CU_ASSERT_EQUAL(n, (int32_t)floor((H100_HBM * 0.9 - 2 * P8B) / (131072.0 * 16)));
    CU_ASSERT_EQUAL(n, 26674);
    CU_ASSERT_EQUAL(sim_kv_capacity_blocks(be, KV_DTYPE_FP8, 16, &n), 0);
    CU_ASSERT_EQUAL(n, 53348);
    CU_ASSERT_EQUAL(sim_kv_capacity_blocks(be, KV_DTYPE_BF16, 0, &n), TANDEM_EINVAL);
    be->ops->destroy(be);

    be = make("llama-3-70b", "h100-sxm", 2, 0.0);
    CU_ASSERT_EQUAL(sim_kv_capacity_blocks(be, KV_DTYPE_BF16, 16, &n), 0);
    CU_ASSERT_EQUAL(n, (int32_t)floor((2 * H100_HBM * 0.9 - 2 * P70B) / (327680.0 * 16)));
    CU_ASSERT_EQUAL(n, 551);
    be->ops->destroy(be);

    /* Weights fit but not one block. */
    struct sim_config cfg;
    sim_default_config(&cfg);
    cfg.model = "llama-3-70b";
    cfg.tp = 2;
    cfg.hbm_utilisation = (2 * P70B + 1e6) / (2 * H100_HBM);
    CU_ASSERT_EQUAL(sim_create(&be, &cfg), 0);
    log_set_level((enum log_level)(LOG_LEVEL_ERROR + 1)); /* the expected errors below are logged */
    CU_ASSERT_EQUAL(sim_kv_capacity_blocks(be, KV_DTYPE_BF16, 16, &n), TANDEM_ENOSPACE);
    log_set_level(LOG_LEVEL_INFO);
    be->ops->destroy(be);
}

/* Runs sim_create(cfg) with stderr captured into buf. */
static int create_captured(const struct sim_config *cfg, char *buf, size_t cap)
{
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    FILE *tmp = tmpfile();
    CU_ASSERT_PTR_NOT_NULL_FATAL(tmp);
    dup2(fileno(tmp), STDERR_FILENO);
    struct backend *be = NULL;
    int rc = sim_create(&be, cfg);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(tmp);
    size_t n = fread(buf, 1, cap - 1, tmp);
    buf[n] = '\0';
    fclose(tmp);
    if (rc == 0) {
        be->ops->destroy(be);
    }
    return rc;
}

/* Unknown names are refused with an error that lists the valid ones. */
static void test_unknown_names(void)
{
    struct sim_config cfg;
    char log[2048];
    sim_default_config(&cfg);
    cfg.model = "llama-9-1b";
    CU_ASSERT_EQUAL(create_captured(&cfg, log, sizeof(log)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "ERROR"));
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "llama-9-1b"));
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "llama-3-8b, llama-3-70b"));
    sim_default_config(&cfg);
    cfg.gpu = "h100";
    CU_ASSERT_EQUAL(create_captured(&cfg, log, sizeof(log)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "a100-80g, h100-sxm, h200, b200"));
    sim_default_config(&cfg);
    cfg.link = "carrier-pigeon";
    CU_ASSERT_EQUAL(create_captured(&cfg, log, sizeof(log)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "ib-400g"));
}

static void test_bad_config(void)
{
    struct sim_config cfg;
    struct backend *be = NULL;
    log_set_level((enum log_level)(LOG_LEVEL_ERROR + 1));
    sim_default_config(&cfg);
    cfg.model = "llama-9-1b";
    CU_ASSERT_EQUAL(sim_create(&be, &cfg), TANDEM_EINVAL);
    sim_default_config(&cfg);
    cfg.gpu = "h100";
    CU_ASSERT_EQUAL(sim_create(&be, &cfg), TANDEM_EINVAL);
    sim_default_config(&cfg);
    cfg.link = "carrier-pigeon";
    CU_ASSERT_EQUAL(sim_create(&be, &cfg), TANDEM_EINVAL);
    sim_default_config(&cfg);
    cfg.model = NULL;
    CU_ASSERT_EQUAL(sim_create(&be, &cfg), TANDEM_EINVAL);
    sim_default_config(&cfg);
    cfg.tp = 9; /* more than llama-3-8b's 8 KV heads */
    CU_ASSERT_EQUAL(sim_create(&be, &cfg), TANDEM_EINVAL);
    sim_default_config(&cfg);
    cfg.mfu = 0;
    CU_ASSERT_EQUAL(sim_create(&be, &cfg), TANDEM_EINVAL);
    sim_default_config(&cfg);
    cfg.time_scale = -1;
    CU_ASSERT_EQUAL(sim_create(&be, &cfg), TANDEM_EINVAL);
    sim_default_config(&cfg);
    cfg.model = "llama-3-70b"; /* 141 GB of weights on one 80 GB GPU */
    CU_ASSERT_EQUAL(sim_create(&be, &cfg), TANDEM_ECONFIG);
    log_set_level(LOG_LEVEL_INFO);
    CU_ASSERT_PTR_NULL(be);
    CU_ASSERT_EQUAL(sim_is(NULL), 0);
}

int main(void)
{
    log_init("test_sim", LOG_LEVEL_INFO);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("sim", NULL, NULL);
    CU_add_test(s, "presets", test_presets);
    CU_add_test(s, "opt_presets", test_opt_presets);
    CU_add_test(s, "opt_kv_tokens", test_opt_kv_tokens);
    CU_add_test(s, "opt_step", test_opt_step);
    CU_add_test(s, "step_prefill", test_step_prefill);
    CU_add_test(s, "step_decode", test_step_decode);
    CU_add_test(s, "step_mixed", test_step_mixed);
    CU_add_test(s, "step_tp", test_step_tp);
    CU_add_test(s, "sleep", test_sleep);
    CU_add_test(s, "tokens", test_tokens);
    CU_add_test(s, "tokens_low_specials", test_tokens_low_specials);
    CU_add_test(s, "payload", test_payload);
    CU_add_test(s, "bad_calls", test_bad_calls);
    CU_add_test(s, "capacity", test_capacity);
    CU_add_test(s, "unknown_names", test_unknown_names);
    CU_add_test(s, "bad_config", test_bad_config);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
