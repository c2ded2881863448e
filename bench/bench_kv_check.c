/* What a TANDEM_KV_CHECK worker adds to every engine step (worker.c
 * check_kv): zero the reference counts, count every live sequence's blocks,
 * kv_check and kv_check_refs. On pools of the integration tests' sizes (300,
 * 2048, 4096 blocks) and a large one (32768), with a quarter of the blocks
 * free, half held by sequences (sharing cached prefixes) and a quarter idle
 * in the prefix cache. Figures are medians over repeated runs, one core.
 *
 * usage: bench_kv_check [runs (default 201)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "block_hash.h"
#include "kv_cache.h"
#include "log.h"

#define SEQ_BLOCKS 8 /* blocks per sequence; the first 4 are a prefix shared by pairs */

/* Fills the pool as described above; returns the live sequences (*n). */
static struct kv_seq *fill(struct kv_pool *pool, int total, int *n)
{
    const int bs = kv_pool_config(pool)->block_size;
    const int tokens = SEQ_BLOCKS * bs;
    uint32_t *t = malloc((size_t)tokens * sizeof *t);
    int cap = total / SEQ_BLOCKS + 1;
    struct kv_seq *seqs = calloc((size_t)cap, sizeof *seqs);
    struct kv_seq idle;
    int live = 0, held = 0, cached_idle = 0;
    uint64_t root = bh_root("bench");
    for (int k = 0; t != NULL && seqs != NULL; k++) {
        /* Pairs share their first half: k and k ^ 1 have the same prefix. */
        for (int i = 0; i < tokens; i++) {
            t[i] = (uint32_t)((i < tokens / 2 ? k / 2 : k) * 100003 + i);
        }
        int to_idle = cached_idle + SEQ_BLOCKS <= total / 4;
        if (!to_idle && held + SEQ_BLOCKS > total / 2) {
            break;
        }
        struct kv_seq *s = to_idle ? &idle : &seqs[live];
        kv_seq_init(s, root);
        if (kv_seq_match(pool, s, t, tokens - 1) < 0 || kv_seq_grow(pool, s, tokens) != 0 ||
            kv_seq_commit(pool, s, t, tokens) < 0) {
            fprintf(stderr, "bench_kv_check: cannot fill the pool\n");
            exit(1);
        }
        if (to_idle) {
            kv_seq_release(pool, s); /* its blocks stay cached, idle */
            kv_seq_fini(s);
            struct kv_stats st;
            kv_pool_stats(pool, &st);
            cached_idle = st.cached_idle;
        } else {
            live++;
            struct kv_stats st;
            kv_pool_stats(pool, &st);
            held = st.in_use;
        }
    }
    free(t);
    *n = live;
    return seqs;
}

static void bench(int total, int runs)
{
    struct kv_config cfg = {.n_layers = 1,
                            .n_kv_heads = 1,
                            .head_dim = 1,
                            .block_size = 16,
                            .dtype = KV_DTYPE_F32,
                            .n_blocks = total,
                            .payload_div = -1};
    struct kv_pool *pool;
    if (kv_pool_create(&pool, &cfg) != 0) {
        fprintf(stderr, "bench_kv_check: no pool of %d blocks\n", total);
        exit(1);
    }
    int n;
    struct kv_seq *seqs = fill(pool, total, &n);
    int32_t *refs = malloc((size_t)total * sizeof *refs);
    double *t = malloc((size_t)runs * sizeof *t);
    if (seqs == NULL || refs == NULL || t == NULL) {
        fprintf(stderr, "bench_kv_check: out of memory\n");
        exit(1);
    }
    for (int r = 0; r < runs; r++) {
        double t0 = bench_now_s();
        memset(refs, 0, (size_t)total * sizeof *refs);
        for (int i = 0; i < n; i++) {
            kv_seq_count_refs(&seqs[i], refs);
        }
        if (kv_check(pool) != 0 || kv_check_refs(pool, refs, 1) != 0) {
            fprintf(stderr, "bench_kv_check: the check failed\n");
            exit(1);
        }
        t[r] = bench_now_s() - t0;
    }
    struct kv_stats st;
    kv_pool_stats(pool, &st);
    printf("%6d blocks (%5d free, %5d in use by %4d sequences, %5d cached idle): %8.1f us\n", total,
           st.free, st.in_use, n, st.cached_idle, bench_median_upper(t, runs) * 1e6);
    for (int i = 0; i < n; i++) {
        kv_seq_release(pool, &seqs[i]);
        kv_seq_fini(&seqs[i]);
    }
    free(t);
    free(refs);
    free(seqs);
    kv_pool_destroy(pool);
}

int main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 201;
    if (runs < 1) {
        fprintf(stderr, "usage: bench_kv_check [runs]\n");
        return 2;
    }
    log_set_level(LOG_LEVEL_WARN);
    static const int sizes[] = {300, 2048, 4096, 32768};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        bench(sizes[i], runs);
    }
    return 0;
}
