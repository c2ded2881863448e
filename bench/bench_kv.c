/* KV cache and block hashing micro-benchmarks, one core:
 *   - chained block hashing throughput (GB/s of token ids) per block size;
 *   - longest-prefix lookup of a 131,072-token prompt with every block cached:
 *     hashing, kv_match_prefix, kv_count_prefix, and kv_seq_match (fused);
 *   - block alloc/release throughput, from the free list and by eviction;
 *   - KV dtype conversion throughput.
 * Figures are medians over repeated runs. Inputs come from a fixed seed.
 *
 * usage: bench_kv [runs (default 101)] */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "block_hash.h"
#include "kv_cache.h"
#include "kv_dtype.h"
#include "log.h"
#include "tandem_err.h"

#define PROMPT_TOKENS 131072

static uint64_t rng_state = 0x7a6e64656d5f6b76ull;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Keeps results alive so the compiler cannot drop the timed work. */
static volatile uint64_t sink;

static void bench_hash(uint32_t *tokens, uint64_t *hashes, int runs)
{
    static const int sizes[] = {16, 64, 256};
    double *t = malloc((size_t)runs * sizeof *t);
    uint64_t root = bh_root("bench");
    printf("\n%-44s %12s %12s\n", "block hashing (bh_hash_prompt, 131072 tok)", "median", "GB/s");
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        for (int r = 0; r < runs; r++) {
            double t0 = bench_now_s();
            int nb = bh_hash_prompt(root, tokens, PROMPT_TOKENS, sizes[s], hashes);
            t[r] = bench_now_s() - t0;
            sink += hashes[nb - 1];
        }
        double m = bench_median_upper(t, runs);
        char name[64];
        snprintf(name, sizeof name, "  block size %d (%d-byte XXH3 inputs)", sizes[s],
                 sizes[s] * 4);
        printf("%-44s %9.1f us %12.2f\n", name, m * 1e6, (double)PROMPT_TOKENS * 4 / m / 1e9);
    }
    free(t);
}

static int bench_lookup(uint32_t *tokens, uint64_t *hashes, int runs)
{
    enum { BS = 16, NB = PROMPT_TOKENS / BS };
    struct kv_config cfg = {.n_layers = 32,
                            .n_kv_heads = 8,
                            .head_dim = 128,
                            .block_size = BS,
                            .dtype = KV_DTYPE_F16,
                            .n_blocks = NB + 1024,
                            .payload_div = -1}; /* metadata only: no arena */
    struct kv_pool *pool;
    struct kv_seq seq;
    int32_t *blocks = malloc(NB * sizeof *blocks);
    double *t_hash = malloc((size_t)runs * sizeof(double));
    double *t_match = malloc((size_t)runs * sizeof(double));
    double *t_release = malloc((size_t)runs * sizeof(double));
    double *t_count = malloc((size_t)runs * sizeof(double));
    double *t_seq = malloc((size_t)runs * sizeof(double));
    uint64_t root = bh_root("bench");
    int rc = kv_pool_create(&pool, &cfg);
    if (rc != 0) {
        fprintf(stderr, "kv_pool_create: %s\n", tandem_strerror(rc));
        return 1;
    }
    /* Fill the cache with the whole prompt, then let it go idle: the lookup
     * then also has to take every block off the LRU. */
    kv_seq_init(&seq, root);
    if (kv_seq_grow(pool, &seq, PROMPT_TOKENS) != 0 ||
        kv_seq_commit(pool, &seq, tokens, PROMPT_TOKENS) != NB) {
        fprintf(stderr, "cannot fill the cache\n");
        return 1;
    }
    kv_seq_release(pool, &seq);

    for (int r = 0; r < runs; r++) {
        double t0 = bench_now_s();
        int nb = bh_hash_prompt(root, tokens, PROMPT_TOKENS, BS, hashes);
        double t1 = bench_now_s();
        int m = kv_match_prefix(pool, hashes, nb, blocks);
        double t2 = bench_now_s();
        for (int i = m - 1; i >= 0; i--) {
            kv_block_unref(pool, blocks[i]);
        }
        double t3 = bench_now_s();
        int c = kv_count_prefix(pool, hashes, nb);
        double t4 = bench_now_s();
        int s = kv_seq_match(pool, &seq, tokens, PROMPT_TOKENS);
        double t5 = bench_now_s();
        kv_seq_release(pool, &seq);
        if (m != NB || c != NB || s != PROMPT_TOKENS) {
            fprintf(stderr, "lookup found %d/%d/%d blocks, expected %d\n", m, c, s / BS, NB);
            return 1;
        }
        t_hash[r] = t1 - t0;
        t_match[r] = t2 - t1;
        t_release[r] = t3 - t2;
        t_count[r] = t4 - t3;
        t_seq[r] = t5 - t4;
    }
    if (kv_check(pool) != 0) {
        return 1;
    }
    double h = bench_median_upper(t_hash, runs), m = bench_median_upper(t_match, runs);
    printf("\n%-44s %12s\n", "prefix lookup, 131072 tokens = 8192 blocks", "median");
    printf("%-44s %9.1f us\n", "  bh_hash_prompt (bs 16)", h * 1e6);
    printf("%-44s %9.1f us\n", "  kv_match_prefix (idle -> referenced)", m * 1e6);
    printf("%-44s %9.1f us\n", "  hash + match", (h + m) * 1e6);
    printf("%-44s %9.1f us\n", "  kv_count_prefix alone", bench_median_upper(t_count, runs) * 1e6);
    printf("%-44s %9.1f us\n", "  kv_seq_match (hash + match fused)",
           bench_median_upper(t_seq, runs) * 1e6);
    printf("%-44s %9.1f us\n", "  release of the 8192 matched blocks",
           bench_median_upper(t_release, runs) * 1e6);

    kv_seq_fini(&seq);
    kv_pool_destroy(pool);
    free(t_seq);
    free(t_count);
    free(t_release);
    free(t_match);
    free(t_hash);
    free(blocks);
    return 0;
}

static int bench_alloc(int runs)
{
    enum { N = 65536, BATCH = 64 };
    struct kv_config cfg = {.n_layers = 32,
                            .n_kv_heads = 8,
                            .head_dim = 128,
                            .block_size = 16,
                            .dtype = KV_DTYPE_F16,
                            .n_blocks = N,
                            .payload_div = -1};
    struct kv_pool *pool;
    int32_t b[BATCH];
    double *t_free = malloc((size_t)runs * sizeof(double));
    double *t_evict = malloc((size_t)runs * sizeof(double));
    if (kv_pool_create(&pool, &cfg) != 0) {
        return 1;
    }
    /* (a) free list: alloc BATCH blocks, release them, N / BATCH times. */
    for (int r = 0; r < runs; r++) {
        double t0 = bench_now_s();
        for (int k = 0; k < N / BATCH; k++) {
            for (int i = 0; i < BATCH; i++) {
                kv_block_alloc(pool, &b[i]);
            }
            for (int i = BATCH - 1; i >= 0; i--) {
                kv_block_unref(pool, b[i]);
            }
        }
        t_free[r] = bench_now_s() - t0;
    }
    /* (b) eviction: every block idle and cached, so each alloc evicts the
     * LRU head (map delete + event); the new block is named and released,
     * which is a prefill's life cycle with a full cache. */
    uint64_t name = 1;
    for (int i = 0; i < N; i++) {
        int32_t x;
        kv_block_alloc(pool, &x);
        kv_block_commit(pool, x, rnd());
    }
    for (int i = 0; i < N; i++) {
        kv_block_unref(pool, i);
    }
    for (int r = 0; r < runs; r++) {
        double t0 = bench_now_s();
        for (int k = 0; k < N / BATCH; k++) {
            for (int i = 0; i < BATCH; i++) {
                kv_block_alloc(pool, &b[i]);
                kv_block_commit(pool, b[i], (name++) * 0x9E3779B97F4A7C15ull);
            }
            for (int i = BATCH - 1; i >= 0; i--) {
                kv_block_unref(pool, b[i]);
            }
        }
        t_evict[r] = bench_now_s() - t0;
    }
    struct kv_stats st;
    kv_pool_stats(pool, &st);
    if (kv_check(pool) != 0 || st.cached_idle != N) {
        return 1;
    }
    double f = bench_median_upper(t_free, runs), e = bench_median_upper(t_evict, runs);
    printf("\n%-44s %12s %12s\n", "block alloc/release (65536-block pool)", "ns/pair", "Mpairs/s");
    printf("%-44s %12.1f %12.1f\n", "  alloc + unref, free list", f / N * 1e9, N / f / 1e6);
    printf("%-44s %12.1f %12.1f\n", "  alloc (evict LRU) + commit + unref", e / N * 1e9,
           N / e / 1e6);
    kv_pool_destroy(pool);
    free(t_evict);
    free(t_free);
    return 0;
}

static void bench_dtype(int runs)
{
    enum { N = 1 << 20 };
    float *src = malloc(N * sizeof(float)), *dst = malloc(N * sizeof(float));
    uint8_t *q = malloc(N * 4);
    double *tq = malloc((size_t)runs * sizeof(double)), *td = malloc((size_t)runs * sizeof(double));
    for (int i = 0; i < N; i++) {
        src[i] = (float)((int64_t)(rnd() % 2000001) - 1000000) / 65536.0f;
    }
    printf("\n%-44s %12s %12s\n", "dtype conversion (1M values)", "quant Gv/s", "dequant Gv/s");
    for (int d = 0; d < KV_DTYPE_COUNT; d++) {
        enum kv_dtype dt = (enum kv_dtype)d;
        for (int r = 0; r < runs; r++) {
            double t0 = bench_now_s();
            kv_quantize(dt, q, src, N);
            double t1 = bench_now_s();
            kv_dequantize(dt, dst, q, N);
            double t2 = bench_now_s();
            sink += q[r % N] + (uint64_t)dst[r % N];
            tq[r] = t1 - t0;
            td[r] = t2 - t1;
        }
        char name[64];
        snprintf(name, sizeof name, "  %s", kv_dtype_name(dt));
        printf("%-44s %12.2f %12.2f\n", name, N / bench_median_upper(tq, runs) / 1e9,
               N / bench_median_upper(td, runs) / 1e9);
    }
    free(td);
    free(tq);
    free(q);
    free(dst);
    free(src);
}

int main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 101;
    if (runs < 1) {
        fprintf(stderr, "usage: %s [runs (default 101)]\n", argv[0]);
        return 2;
    }
    log_init("bench_kv", LOG_LEVEL_WARN);
    uint32_t *tokens = malloc(PROMPT_TOKENS * sizeof *tokens);
    uint64_t *hashes = malloc(PROMPT_TOKENS * sizeof *hashes);
    if (tokens == NULL || hashes == NULL) {
        return 1;
    }
    for (int i = 0; i < PROMPT_TOKENS; i++) {
        tokens[i] = (uint32_t)(rnd() % 128256); /* a llama-3-sized vocabulary */
    }
    printf("bench_kv: %d runs per figure, medians", runs);
    bench_hash(tokens, hashes, runs);
    if (bench_lookup(tokens, hashes, runs) != 0 || bench_alloc(runs) != 0) {
        fprintf(stderr, "bench_kv: failed\n");
        return 1;
    }
    bench_dtype(runs);
    printf("\n(sink %" PRIu64 ")\n", (uint64_t)sink);
    free(hashes);
    free(tokens);
    return 0;
}
