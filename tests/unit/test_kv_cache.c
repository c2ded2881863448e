/* Paged KV cache: pool, prefix map, LRU eviction, events, sequences, and a
 * randomised run of mixed operations (seed printed; KV_SEED=<n> replays). */
#include <CUnit/Basic.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block_hash.h"
#include "kv_cache.h"
#include "tandem_err.h"

/* kv_check after every operation: a failure names the line. */
#define CHECK_POOL(p) CU_ASSERT_EQUAL_FATAL(kv_check(p), 0)

static struct kv_config small_cfg(int n_blocks, int block_size)
{
    struct kv_config c = {.n_layers = 2,
                          .n_kv_heads = 2,
                          .head_dim = 8,
                          .block_size = block_size,
                          .dtype = KV_DTYPE_F16,
                          .n_blocks = n_blocks,
                          .payload_div = 0};
    return c;
}

/* Asserts the four block counts, reporting the caller's line. */
#define expect_stats(p, free_, in_use, idle, cached)                                               \
    expect_stats_at(p, free_, in_use, idle, cached, __LINE__)
static void expect_stats_at(struct kv_pool *p, int free_, int in_use, int idle, int cached,
                            int line)
{
    struct kv_stats s;
    kv_pool_stats(p, &s);
    int ok = s.free == free_ && s.in_use == in_use && s.cached_idle == idle && s.cached == cached &&
             s.free + s.in_use + s.cached_idle == s.total;
    CU_ASSERT(ok);
    if (!ok) {
        printf("\n  line %d: free/in use/idle/cached %d/%d/%d/%d, expected %d/%d/%d/%d\n", line,
               s.free, s.in_use, s.cached_idle, s.cached, free_, in_use, idle, cached);
    }
}

static int stats_equal(const struct kv_stats *a, const struct kv_stats *b)
{
    return a->total == b->total && a->free == b->free && a->in_use == b->in_use &&
           a->cached_idle == b->cached_idle && a->cached == b->cached &&
           a->query_blocks == b->query_blocks && a->hit_blocks == b->hit_blocks &&
           a->stored == b->stored && a->evicted == b->evicted;
}

/* ---- event recorder ------------------------------------------------------- */

struct ev_log {
    int n;
    enum kv_event ev[256];
    uint64_t hash[256];
};

static void record_event(void *arg, enum kv_event ev, uint64_t hash)
{
    struct ev_log *l = arg;
    if (l->n < 256) {
        l->ev[l->n] = ev;
        l->hash[l->n] = hash;
    }
    l->n++;
}

/* ---- configuration ------------------------------------------------------- */

static void test_bad_config(void)
{
    struct kv_pool *p = (struct kv_pool *)1;
    struct kv_config good = small_cfg(4, 16), c;

    CU_ASSERT_EQUAL(kv_pool_create(&p, NULL), TANDEM_EINVAL);
    CU_ASSERT_PTR_NULL(p);
    CU_ASSERT_EQUAL(kv_pool_create(NULL, &good), TANDEM_EINVAL);
#define BAD(field, value)                                                                          \
    do {                                                                                           \
        c = good;                                                                                  \
        c.field = value;                                                                           \
        p = (struct kv_pool *)1;                                                                   \
        CU_ASSERT_EQUAL(kv_pool_create(&p, &c), TANDEM_EINVAL);                                    \
        CU_ASSERT_PTR_NULL(p);                                                                     \
    } while (0)
    BAD(n_layers, 0);
    BAD(n_layers, -3);
    BAD(n_kv_heads, 0);
    BAD(head_dim, 0);
    BAD(block_size, 0);
    BAD(block_size, BH_MAX_BLOCK_SIZE + 1);
    BAD(n_blocks, 0);
    BAD(n_blocks, -1);
    BAD(dtype, KV_DTYPE_COUNT);
    BAD(dtype, (enum kv_dtype) - 1);
    BAD(payload_div, -2);
    /* The arena would not fit in size_t. */
    c = good;
    c.n_layers = 1 << 30;
    c.n_kv_heads = 1 << 30;
    c.head_dim = 1 << 30;
    p = (struct kv_pool *)1;
    CU_ASSERT_EQUAL(kv_pool_create(&p, &c), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(kv_config_block_bytes(&c), 0);
    c = good;
    c.head_dim = 1 << 30;
    c.n_blocks = 1 << 30;
    CU_ASSERT_EQUAL(kv_pool_create(&p, &c), TANDEM_EINVAL);
    /* ... unless there is no payload at all. */
    c.n_blocks = 4;
    c.payload_div = -1;
    CU_ASSERT_EQUAL(kv_pool_create(&p, &c), 0);
    CU_ASSERT_EQUAL(kv_block_bytes(p), 0);
    kv_pool_destroy(p);
    kv_pool_destroy(NULL);
#undef BAD
}

static void test_payload(void)
{
    struct kv_config c = small_cfg(5, 16);
    struct kv_pool *p;
    /* 2 x 2 layers x 2 heads x 8 dims x 2 bytes x 16 tokens */
    CU_ASSERT_EQUAL(kv_config_block_bytes(&c), 2048);
    static const struct {
        int div;
        size_t bytes;
    } cases[] = {{0, 2048}, {1, 2048}, {2, 1024}, {3, 683}, {4096, 1}, {-1, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        c.payload_div = cases[i].div;
        CU_ASSERT_EQUAL_FATAL(kv_pool_create(&p, &c), 0);
        CU_ASSERT_EQUAL(kv_block_bytes(p), cases[i].bytes);
        CU_ASSERT_EQUAL(kv_config_block_bytes(kv_pool_config(p)), 2048);
        CU_ASSERT_EQUAL(kv_pool_config(p)->payload_div, cases[i].div);
        if (cases[i].bytes == 0) {
            CU_ASSERT_PTR_NULL(kv_block_data(p, 0));
        } else {
            uint8_t *b0 = kv_block_data(p, 0);
            CU_ASSERT_PTR_NOT_NULL_FATAL(b0);
            CU_ASSERT_EQUAL((uintptr_t)b0 % 64, 0);
            for (int b = 0; b < 5; b++) {
                uint8_t *d = kv_block_data(p, b);
                CU_ASSERT_EQUAL(d - b0, (ptrdiff_t)(b * cases[i].bytes));
                CU_ASSERT_EQUAL(d[0], 0); /* the arena starts zeroed */
                memset(d, 0xa0 + b, cases[i].bytes);
            }
            for (int b = 0; b < 5; b++) {
                uint8_t *d = kv_block_data(p, b);
                CU_ASSERT_EQUAL(d[0], 0xa0 + b);
                CU_ASSERT_EQUAL(d[cases[i].bytes - 1], 0xa0 + b);
            }
        }
        CU_ASSERT_PTR_NULL(kv_block_data(p, 5));
        CU_ASSERT_PTR_NULL(kv_block_data(p, -1));
        CHECK_POOL(p);
        kv_pool_destroy(p);
    }
    /* Every dtype scales the bytes. */
    c.payload_div = 0;
    c.dtype = KV_DTYPE_F32;
    CU_ASSERT_EQUAL(kv_config_block_bytes(&c), 4096);
    c.dtype = KV_DTYPE_BF16;
    CU_ASSERT_EQUAL(kv_config_block_bytes(&c), 2048);
    c.dtype = KV_DTYPE_FP8;
    CU_ASSERT_EQUAL(kv_config_block_bytes(&c), 1024);
}

static void test_slot_offset(void)
{
    struct kv_config c = {.n_layers = 3,
                          .n_kv_heads = 2,
                          .head_dim = 5,
                          .block_size = 4,
                          .dtype = KV_DTYPE_F32,
                          .n_blocks = 2,
                          .payload_div = 0};
    struct kv_pool *p;
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&p, &c), 0);
    size_t row = 2 * 5 * 4; /* n_kv_heads x head_dim floats */
    CU_ASSERT_EQUAL(kv_block_bytes(p), 3 * 2 * 4 * row);
    CU_ASSERT_EQUAL(kv_slot_offset(p, 0, 0, 0), 0);
    CU_ASSERT_EQUAL(kv_slot_offset(p, 0, 0, 1), row);
    CU_ASSERT_EQUAL(kv_slot_offset(p, 0, 1, 0), 4 * row); /* V after K of layer 0 */
    CU_ASSERT_EQUAL(kv_slot_offset(p, 1, 0, 0), 8 * row);
    CU_ASSERT_EQUAL(kv_slot_offset(p, 2, 1, 3), kv_block_bytes(p) - row);
    /* The slots tile the block exactly, in [layer][kind][tok] order. */
    size_t expect = 0;
    for (int l = 0; l < 3; l++) {
        for (int k = 0; k < 2; k++) {
            for (int t = 0; t < 4; t++) {
                CU_ASSERT_EQUAL(kv_slot_offset(p, l, k, t), expect);
                expect += row;
            }
        }
    }
    CU_ASSERT_EQUAL(expect, kv_block_bytes(p));
    kv_pool_destroy(p);
}

/* ---- blocks -------------------------------------------------------------- */

static void test_alloc_until_full(void)
{
    struct kv_config c = small_cfg(8, 16);
    struct kv_pool *p;
    int32_t b[8], extra = 77;
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&p, &c), 0);
    CHECK_POOL(p);
    expect_stats(p, 8, 0, 0, 0);
    for (int i = 0; i < 8; i++) {
        CU_ASSERT_EQUAL(kv_block_alloc(p, &b[i]), 0);
        CU_ASSERT_EQUAL(b[i], i); /* fresh pools hand out 0, 1, 2, ... */
        CU_ASSERT_EQUAL(kv_block_refcount(p, b[i]), 1);
        CHECK_POOL(p);
    }
    expect_stats(p, 0, 8, 0, 0);
    CU_ASSERT_EQUAL(kv_block_alloc(p, &extra), TANDEM_ENOSPACE);
    CU_ASSERT_EQUAL(extra, 77);
    CHECK_POOL(p);
    kv_block_unref(p, b[3]);
    CHECK_POOL(p);
    expect_stats(p, 1, 7, 0, 0);
    CU_ASSERT_EQUAL(kv_block_alloc(p, &extra), 0);
    CU_ASSERT_EQUAL(extra, 3);
    CHECK_POOL(p);
    for (int i = 0; i < 8; i++) {
        kv_block_unref(p, b[i]);
        CHECK_POOL(p);
    }
    expect_stats(p, 8, 0, 0, 0);
    kv_pool_destroy(p);
}

static void test_refcounts(void)
{
    struct kv_config c = small_cfg(4, 16);
    struct kv_pool *p;
    int32_t b;
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&p, &c), 0);
    CU_ASSERT_EQUAL(kv_block_alloc(p, &b), 0);
    kv_block_ref(p, b);
    kv_block_ref(p, b);
    CU_ASSERT_EQUAL(kv_block_refcount(p, b), 3);
    CHECK_POOL(p);
    expect_stats(p, 3, 1, 0, 0);
    kv_block_unref(p, b);
    kv_block_unref(p, b);
    CU_ASSERT_EQUAL(kv_block_refcount(p, b), 1);
    expect_stats(p, 3, 1, 0, 0);
    kv_block_unref(p, b);
    CU_ASSERT_EQUAL(kv_block_refcount(p, b), 0);
    CHECK_POOL(p);
    expect_stats(p, 4, 0, 0, 0);
    /* Misuse is logged and ignored, never corrupts the pool. */
    fprintf(stderr, "(three misuse errors expected below)\n");
    kv_block_unref(p, b);
    kv_block_ref(p, 2); /* free, uncached */
    kv_block_ref(p, 9); /* out of range */
    CU_ASSERT_EQUAL(kv_block_refcount(p, 2), 0);
    CU_ASSERT_EQUAL(kv_block_refcount(p, 9), 0);
    CHECK_POOL(p);
    expect_stats(p, 4, 0, 0, 0);
    kv_pool_destroy(p);
}

static void test_commit_lookup(void)
{
    struct kv_config c = small_cfg(4, 16);
    struct kv_pool *p;
    struct ev_log log = {0};
    struct kv_stats s;
    int32_t a, b;
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&p, &c), 0);
    kv_set_event_cb(p, record_event, &log);
    CU_ASSERT_EQUAL(kv_block_alloc(p, &a), 0);
    CU_ASSERT_EQUAL(kv_block_alloc(p, &b), 0);
    CU_ASSERT_EQUAL(kv_lookup(p, 100), -1);
    CU_ASSERT_EQUAL(kv_block_commit(p, a, 100), 0);
    CHECK_POOL(p);
    CU_ASSERT_EQUAL(kv_lookup(p, 100), a);
    CU_ASSERT_EQUAL(log.n, 1);
    CU_ASSERT_EQUAL(log.ev[0], KV_EVENT_STORED);
    CU_ASSERT_EQUAL(log.hash[0], 100);
    CU_ASSERT_EQUAL(kv_block_commit(p, b, 100), TANDEM_EEXIST); /* b stays uncached */
    CU_ASSERT_EQUAL(kv_block_commit(p, a, 200), TANDEM_EINVAL); /* a already named */
    CU_ASSERT_EQUAL(kv_block_commit(p, 3, 300), TANDEM_EINVAL); /* free block */
    CU_ASSERT_EQUAL(kv_block_commit(p, 4, 300), TANDEM_EINVAL); /* out of range */
    CU_ASSERT_EQUAL(kv_block_commit(p, -1, 300), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(kv_lookup(p, 200), -1);
    CU_ASSERT_EQUAL(kv_lookup(p, 300), -1);
    CU_ASSERT_EQUAL(log.n, 1);
    CHECK_POOL(p);
    expect_stats(p, 2, 2, 0, 1);
    /* Hash 0 is an ordinary name. */
    CU_ASSERT_EQUAL(kv_block_commit(p, b, 0), 0);
    CU_ASSERT_EQUAL(kv_lookup(p, 0), b);
    CHECK_POOL(p);
    /* Last reference gone: a stays cached, idle, still found. */
    kv_block_unref(p, a);
    CHECK_POOL(p);
    expect_stats(p, 2, 1, 1, 2);
    CU_ASSERT_EQUAL(kv_lookup(p, 100), a);
    CU_ASSERT_EQUAL(kv_block_refcount(p, a), 0);
    CU_ASSERT_EQUAL(kv_block_commit(p, a, 500), TANDEM_EINVAL); /* idle: not in use */
    /* kv_block_ref revives an idle cached block. */
    kv_block_ref(p, a);
    CHECK_POOL(p);
    expect_stats(p, 2, 2, 0, 2);
    kv_block_unref(p, a);
    kv_block_unref(p, b);
    CHECK_POOL(p);
    expect_stats(p, 2, 0, 2, 2);
    kv_pool_stats(p, &s);
    CU_ASSERT_EQUAL(s.stored, 2);
    CU_ASSERT_EQUAL(s.evicted, 0);
    kv_pool_destroy(p);
}

/* Commits a chain of n blocks named hashes[0..n) and returns them in b. */
static void make_chain(struct kv_pool *p, const uint64_t *hashes, int n, int32_t *b)
{
    for (int i = 0; i < n; i++) {
        CU_ASSERT_EQUAL_FATAL(kv_block_alloc(p, &b[i]), 0);
        CU_ASSERT_EQUAL(kv_block_commit(p, b[i], hashes[i]), 0);
        CHECK_POOL(p);
    }
}

static void release_tail_first(struct kv_pool *p, const int32_t *b, int n)
{
    for (int i = n - 1; i >= 0; i--) {
        kv_block_unref(p, b[i]);
        CHECK_POOL(p);
    }
}

static void test_match_reuses_idle(void)
{
    struct kv_config c = small_cfg(8, 16);
    struct kv_pool *p;
    struct kv_stats s;
    int32_t b[4], m[6];
    uint64_t h[6] = {11, 12, 13, 14, 99, 98};
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&p, &c), 0);
    make_chain(p, h, 4, b);
    release_tail_first(p, b, 4);
    expect_stats(p, 4, 0, 4, 4);
    CU_ASSERT_EQUAL(kv_count_prefix(p, h, 6), 4);
    CU_ASSERT_EQUAL(kv_count_prefix(p, h, 2), 2);
    CU_ASSERT_EQUAL(kv_count_prefix(p, h + 1, 5), 3);
    CU_ASSERT_EQUAL(kv_count_prefix(p, h + 4, 2), 0);
    kv_pool_stats(p, &s);
    CU_ASSERT_EQUAL(s.query_blocks, 0); /* count_prefix counts nothing */
    CU_ASSERT_EQUAL(kv_match_prefix(p, h, 6, m), 4);
    CHECK_POOL(p);
    for (int i = 0; i < 4; i++) {
        CU_ASSERT_EQUAL(m[i], b[i]);
        CU_ASSERT_EQUAL(kv_block_refcount(p, b[i]), 1);
    }
    expect_stats(p, 4, 4, 0, 4);
    kv_pool_stats(p, &s);
    CU_ASSERT_EQUAL(s.query_blocks, 6);
    CU_ASSERT_EQUAL(s.hit_blocks, 4);
    /* A second match shares the same blocks. */
    CU_ASSERT_EQUAL(kv_match_prefix(p, h, 3, m), 3);
    CU_ASSERT_EQUAL(kv_block_refcount(p, b[0]), 2);
    CU_ASSERT_EQUAL(kv_block_refcount(p, b[3]), 1);
    CU_ASSERT_EQUAL(kv_match_prefix(p, h + 4, 2, m), 0);
    CU_ASSERT_EQUAL(kv_match_prefix(p, h, 0, m), 0);
    kv_pool_stats(p, &s);
    CU_ASSERT_EQUAL(s.query_blocks, 11);
    CU_ASSERT_EQUAL(s.hit_blocks, 7);
    CHECK_POOL(p);
    release_tail_first(p, b, 3);
    release_tail_first(p, b, 4);
    expect_stats(p, 4, 0, 4, 4);
    kv_pool_destroy(p);
}

static void test_eviction_order(void)
{
    struct kv_config c = small_cfg(5, 16);
    struct kv_pool *p;
    struct ev_log log = {0};
    struct kv_stats s;
    int32_t a[3], b[2], x, y;
    uint64_t ha[3] = {0xa1, 0xa2, 0xa3}, hb[2] = {0xb1, 0xb2};
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&p, &c), 0);
    kv_set_event_cb(p, record_event, &log);
    make_chain(p, ha, 3, a); /* blocks 0, 1, 2 */
    make_chain(p, hb, 2, b); /* blocks 3, 4 */
    CU_ASSERT_EQUAL(log.n, 5);
    /* Chain a released first (tail first), then chain b. LRU order:
     * a2 a1 a0 b1 b0 (least recent first). */
    release_tail_first(p, a, 3);
    release_tail_first(p, b, 2);
    expect_stats(p, 0, 0, 5, 5);
    static const int order[5] = {2, 1, 0, 4, 3};
    static const uint64_t names[5] = {0xa3, 0xa2, 0xa1, 0xb2, 0xb1};
    int32_t got[5];
    for (int i = 0; i < 5; i++) {
        CU_ASSERT_EQUAL(kv_block_alloc(p, &got[i]), 0);
        CHECK_POOL(p);
        CU_ASSERT_EQUAL(got[i], order[i]);
        CU_ASSERT_EQUAL(kv_block_refcount(p, got[i]), 1);
        /* Each round logs REMOVED here and STORED for the new name below. */
        CU_ASSERT_EQUAL(log.n, 6 + 2 * i);
        CU_ASSERT_EQUAL(log.ev[5 + 2 * i], KV_EVENT_REMOVED);
        CU_ASSERT_EQUAL(log.hash[5 + 2 * i], names[i]);
        CU_ASSERT_EQUAL(kv_lookup(p, names[i]), -1);
        /* Parents outlive their tails. */
        if (i < 2) {
            CU_ASSERT_EQUAL(kv_lookup(p, ha[0]), a[0]);
        }
        /* Evicted blocks come back unnamed: commit works again. */
        CU_ASSERT_EQUAL(kv_block_commit(p, got[i], 0x100 + (uint64_t)i), 0);
        kv_block_unref(p, got[i]);
        CHECK_POOL(p);
        /* ... and, now most recently used, are last in line. */
        kv_block_ref(p, got[i]);
        CHECK_POOL(p);
    }
    CU_ASSERT_EQUAL(kv_block_alloc(p, &x), TANDEM_ENOSPACE);
    kv_pool_stats(p, &s);
    CU_ASSERT_EQUAL(s.evicted, 5);
    CU_ASSERT_EQUAL(s.stored, 10);
    /* A touched idle block moves to the MRU end. */
    for (int i = 0; i < 5; i++) {
        kv_block_unref(p, got[i]); /* LRU: 2 1 0 4 3 */
    }
    kv_block_ref(p, 2);
    kv_block_unref(p, 2); /* LRU: 1 0 4 3 2 */
    CU_ASSERT_EQUAL(kv_block_alloc(p, &x), 0);
    CU_ASSERT_EQUAL(x, 1);
    CU_ASSERT_EQUAL(kv_block_alloc(p, &y), 0);
    CU_ASSERT_EQUAL(y, 0);
    CHECK_POOL(p);
    /* Freed uncached blocks are preferred over evicting cached ones. */
    kv_block_unref(p, x);
    CU_ASSERT_EQUAL(kv_block_alloc(p, &x), 0);
    CU_ASSERT_EQUAL(x, 1);
    kv_pool_stats(p, &s);
    CU_ASSERT_EQUAL(s.evicted, 7);
    kv_block_unref(p, x);
    kv_block_unref(p, y);
    CHECK_POOL(p);
    kv_pool_destroy(p);
}

static void test_clear_cache(void)
{
    struct kv_config c = small_cfg(6, 16);
    struct kv_pool *p;
    struct ev_log log = {0};
    struct kv_stats s;
    int32_t a[4];
    uint64_t h[4] = {1, 2, 3, 4};
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&p, &c), 0);
    make_chain(p, h, 4, a);
    kv_set_event_cb(p, record_event, &log);
    kv_block_unref(p, a[3]);
    kv_block_unref(p, a[2]);
    CHECK_POOL(p);
    expect_stats(p, 2, 2, 2, 4);
    kv_clear_cache(p);
    CHECK_POOL(p);
    expect_stats(p, 4, 2, 0, 2);
    CU_ASSERT_EQUAL(log.n, 3);
    CU_ASSERT_EQUAL(log.ev[0], KV_EVENT_REMOVED);
    CU_ASSERT_EQUAL(log.hash[0], 4);
    CU_ASSERT_EQUAL(log.ev[1], KV_EVENT_REMOVED);
    CU_ASSERT_EQUAL(log.hash[1], 3);
    CU_ASSERT_EQUAL(log.ev[2], KV_EVENT_ALL_CLEARED);
    CU_ASSERT_EQUAL(log.hash[2], 0);
    /* In-use blocks keep their names. */
    CU_ASSERT_EQUAL(kv_lookup(p, 1), a[0]);
    CU_ASSERT_EQUAL(kv_lookup(p, 2), a[1]);
    CU_ASSERT_EQUAL(kv_lookup(p, 3), -1);
    kv_pool_stats(p, &s);
    CU_ASSERT_EQUAL(s.evicted, 2);
    kv_clear_cache(p); /* nothing idle: only the ALL_CLEARED event */
    CU_ASSERT_EQUAL(log.n, 4);
    CU_ASSERT_EQUAL(log.ev[3], KV_EVENT_ALL_CLEARED);
    kv_set_event_cb(p, NULL, NULL);
    kv_block_unref(p, a[1]);
    kv_block_unref(p, a[0]);
    kv_clear_cache(p);
    CU_ASSERT_EQUAL(log.n, 4);
    CHECK_POOL(p);
    expect_stats(p, 6, 0, 0, 0);
    kv_pool_destroy(p);
}

/* Fills the map completely (n entries at load 0.5), then evicts in a
 * scrambled order, checking every remaining name after each removal: this
 * exercises backward-shift deletion across wrapped probe runs. */
static void test_map_churn(void)
{
    enum { N = 512 };
    struct kv_config c = small_cfg(N, 16);
    struct kv_pool *p;
    static int32_t b[N], perm[N];
    static uint64_t h[N];
    c.payload_div = -1;
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&p, &c), 0);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) {
        CU_ASSERT_EQUAL_FATAL(kv_block_alloc(p, &b[i]), 0);
        /* Small, clustered names (i * 2^k) as well as random ones. */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        h[i] = (i % 2) ? x : (uint64_t)i << 40;
        CU_ASSERT_EQUAL(kv_block_commit(p, b[i], h[i]), 0);
        perm[i] = i;
    }
    CHECK_POOL(p);
    for (int i = N - 1; i > 0; i--) {
        int j = (int)((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33) % (i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < N; i++) {
        kv_block_unref(p, b[perm[i]]); /* LRU order = perm order */
    }
    CHECK_POOL(p);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        int32_t got;
        CU_ASSERT_EQUAL(kv_block_alloc(p, &got), 0);
        CU_ASSERT_EQUAL(got, b[perm[i]]);
        for (int k = 0; k < N; k++) {
            int32_t expect = k > i ? b[perm[k]] : -1;
            bad += kv_lookup(p, h[perm[k]]) != expect;
        }
        if (kv_check(p) != 0) {
            bad++;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    expect_stats(p, 0, N, 0, 0);
    kv_pool_destroy(p);
}

/* ---- sequences ----------------------------------------------------------- */

static void test_seq_basic(void)
{
    enum { BS = 4 };
    struct kv_config c = small_cfg(10, BS);
    struct kv_pool *p;
    struct ev_log log = {0};
    struct kv_seq a, b;
    uint32_t t[24];
    uint64_t ref[6];
    uint64_t root = bh_root("tiny");
    for (int i = 0; i < 24; i++) {
        t[i] = (uint32_t)(1000 + i);
    }
    CU_ASSERT_EQUAL(bh_hash_prompt(root, t, 24, BS, ref), 6);
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&p, &c), 0);
    kv_set_event_cb(p, record_event, &log);
    kv_seq_init(&a, root);
    kv_seq_init(&b, root);
    CU_ASSERT_EQUAL(a.root, root);

    /* a: nothing cached yet. */
    CU_ASSERT_EQUAL(kv_seq_match(p, &a, t, 18), 0);
    CHECK_POOL(p);
    CU_ASSERT_EQUAL(a.n_blocks, 0);
    CU_ASSERT_EQUAL(kv_seq_grow(p, &a, 1), 0);
    CU_ASSERT_EQUAL(a.n_blocks, 1);
    CU_ASSERT_EQUAL(kv_seq_grow(p, &a, 4), 0);
    CU_ASSERT_EQUAL(a.n_blocks, 1);
    CU_ASSERT_EQUAL(kv_seq_grow(p, &a, 18), 0); /* 5 blocks, the last partial */
    CHECK_POOL(p);
    CU_ASSERT_EQUAL(a.n_blocks, 5);
    CU_ASSERT_EQUAL(a.n_tokens, 18);
    CU_ASSERT_EQUAL(kv_seq_grow(p, &a, 10), 0); /* never shrinks */
    CU_ASSERT_EQUAL(a.n_tokens, 18);
    CU_ASSERT_EQUAL(kv_seq_grow(p, &a, -1), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(kv_seq_commit(p, &a, t, 19), TANDEM_EINVAL); /* beyond n_tokens */
    CU_ASSERT_EQUAL(kv_seq_commit(p, &a, t, 7), 1);              /* KV of 7 tokens written */
    CU_ASSERT_EQUAL(kv_seq_commit(p, &a, t, 7), 0);
    CU_ASSERT_EQUAL(kv_seq_commit(p, &a, t, 18), 3);
    CHECK_POOL(p);
    CU_ASSERT_EQUAL(a.n_hashed, 4);
    for (int i = 0; i < 4; i++) {
        CU_ASSERT_EQUAL(a.hashes[i], ref[i]);
        CU_ASSERT_EQUAL(kv_lookup(p, ref[i]), a.blocks[i]);
        CU_ASSERT_EQUAL(log.ev[i], KV_EVENT_STORED);
        CU_ASSERT_EQUAL(log.hash[i], ref[i]);
    }
    CU_ASSERT_EQUAL(log.n, 4);
    expect_stats(p, 5, 5, 0, 4);

    /* b shares a's four full blocks; one token is always left to compute. */
    CU_ASSERT_EQUAL(kv_seq_match(p, &b, t, 15), 12);
    CU_ASSERT_EQUAL(kv_seq_match(p, &b, t, 16), TANDEM_EINVAL); /* not empty */
    kv_seq_release(p, &b);
    CU_ASSERT_EQUAL(kv_seq_match(p, &b, t, 17), 16);
    CHECK_POOL(p);
    CU_ASSERT_EQUAL(b.n_blocks, 4);
    CU_ASSERT_EQUAL(b.n_tokens, 16);
    CU_ASSERT_EQUAL(b.n_cached_tokens, 16);
    CU_ASSERT_EQUAL(b.n_hashed, 4);
    for (int i = 0; i < 4; i++) {
        CU_ASSERT_EQUAL(b.blocks[i], a.blocks[i]);
        CU_ASSERT_EQUAL(b.hashes[i], ref[i]);
        CU_ASSERT_EQUAL(kv_block_refcount(p, a.blocks[i]), 2);
    }
    /* b goes on past a: its fifth block is new and gets named. */
    CU_ASSERT_EQUAL(kv_seq_grow(p, &b, 24), 0);
    CU_ASSERT_EQUAL(b.n_blocks, 6);
    CU_ASSERT_EQUAL(kv_seq_commit(p, &b, t, 24), 2);
    CU_ASSERT_EQUAL(kv_lookup(p, ref[4]), b.blocks[4]);
    CU_ASSERT_EQUAL(kv_lookup(p, ref[5]), b.blocks[5]);
    CHECK_POOL(p);
    expect_stats(p, 3, 7, 0, 6);
    /* a fills its fifth block too: the name is taken, so a's block stays
     * private, but the hash is recorded and the chain continues. */
    CU_ASSERT_EQUAL(kv_seq_grow(p, &a, 24), 0);
    CU_ASSERT_EQUAL(kv_seq_commit(p, &a, t, 24), 2);
    CU_ASSERT_EQUAL(a.n_hashed, 6);
    CU_ASSERT_EQUAL(a.hashes[4], ref[4]);
    CU_ASSERT_EQUAL(a.hashes[5], ref[5]);
    CU_ASSERT_NOT_EQUAL(a.blocks[4], b.blocks[4]);
    CU_ASSERT_EQUAL(kv_lookup(p, ref[4]), b.blocks[4]);
    CU_ASSERT_EQUAL(log.n, 6);
    CHECK_POOL(p);
    expect_stats(p, 2, 8, 0, 6);

    /* Releasing a: its private blocks go back to the free list, the shared
     * ones just lose a reference. */
    int32_t a4 = a.blocks[4], a5 = a.blocks[5];
    kv_seq_release(p, &a);
    CHECK_POOL(p);
    CU_ASSERT_EQUAL(a.n_blocks, 0);
    CU_ASSERT_EQUAL(a.n_tokens, 0);
    CU_ASSERT_EQUAL(a.n_hashed, 0);
    CU_ASSERT_EQUAL(a.root, root);
    CU_ASSERT_EQUAL(kv_block_refcount(p, a4), 0);
    CU_ASSERT_EQUAL(kv_block_refcount(p, a5), 0);
    expect_stats(p, 4, 6, 0, 6);
    kv_seq_release(p, &b);
    CHECK_POOL(p);
    expect_stats(p, 4, 0, 6, 6);
    /* Idle prefix reused in full by a new sequence. */
    CU_ASSERT_EQUAL(kv_seq_match(p, &a, t, 24), 24);
    CU_ASSERT_EQUAL(a.n_tokens, 24);
    CU_ASSERT_EQUAL(kv_seq_commit(p, &a, t, 24), 0);
    expect_stats(p, 4, 6, 0, 6);
    kv_seq_release(p, &a);
    kv_seq_release(p, &a); /* idempotent */
    CHECK_POOL(p);
    kv_seq_fini(&a);
    kv_seq_fini(&b);
    kv_pool_destroy(p);
}

static void test_seq_rollback(void)
{
    enum { BS = 4 };
    struct kv_config c = small_cfg(6, BS);
    struct kv_pool *p;
    struct ev_log log = {0};
    struct kv_seq a, b;
    struct kv_stats before, after;
    uint32_t t[16];
    uint64_t root = bh_root("tiny");
    for (int i = 0; i < 16; i++) {
        t[i] = (uint32_t)i;
    }
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&p, &c), 0);
    kv_set_event_cb(p, record_event, &log);
    kv_seq_init(&a, root);
    kv_seq_init(&b, root);
    CU_ASSERT_EQUAL(kv_seq_grow(p, &a, 12), 0);
    CU_ASSERT_EQUAL(kv_seq_commit(p, &a, t, 12), 3);
    kv_seq_release(p, &a); /* 3 idle cached, 3 free */
    CHECK_POOL(p);
    CU_ASSERT_EQUAL(kv_seq_grow(p, &b, 5), 0); /* b holds 2 uncached blocks */
    CHECK_POOL(p);
    expect_stats(p, 1, 2, 3, 3);
    int events = log.n;
    kv_pool_stats(p, &before);
    int32_t b0 = b.blocks[0], b1 = b.blocks[1];
    /* 1 free + 3 idle = 4 blocks available. 32 tokens need 6 more:
     * refused without evicting or allocating anything. */
    CU_ASSERT_EQUAL(kv_seq_grow(p, &b, 32), TANDEM_ENOSPACE);
    CHECK_POOL(p);
    kv_pool_stats(p, &after);
    CU_ASSERT(stats_equal(&before, &after));
    CU_ASSERT_EQUAL(log.n, events); /* nothing evicted */
    CU_ASSERT_EQUAL(b.n_blocks, 2);
    CU_ASSERT_EQUAL(b.n_tokens, 5);
    CU_ASSERT_EQUAL(b.blocks[0], b0);
    CU_ASSERT_EQUAL(b.blocks[1], b1);
    /* Exactly the available blocks: succeeds, evicting the idle ones. */
    CU_ASSERT_EQUAL(kv_seq_grow(p, &b, 24), 0);
    CHECK_POOL(p);
    CU_ASSERT_EQUAL(b.n_blocks, 6);
    expect_stats(p, 0, 6, 0, 0);
    CU_ASSERT_EQUAL(log.n, events + 3);
    CU_ASSERT_EQUAL(kv_seq_grow(p, &b, 25), TANDEM_ENOSPACE);
    CU_ASSERT_EQUAL(b.n_tokens, 24);
    kv_seq_release(p, &b);
    CHECK_POOL(p);
    expect_stats(p, 6, 0, 0, 0);
    kv_seq_fini(&a);
    kv_seq_fini(&b);
    kv_pool_destroy(p);
}

/* ---- randomised ---------------------------------------------------------- */

static uint64_t rnd_state;
static uint64_t rnd(void)
{
    /* splitmix64 */
    uint64_t z = (rnd_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int rnd_below(int n)
{
    return (int)(rnd() % (uint64_t)n);
}

enum { R_BLOCKS = 48, R_BS = 4, R_SEQS = 8, R_MAXTOK = 64, R_RAW = 8, R_OPS = 200000 };

struct shadow {
    uint64_t names[R_BLOCKS]; /* names announced by STORED and not yet REMOVED */
    int n;
    int errors;
    int cleared;
};

static void shadow_event(void *arg, enum kv_event ev, uint64_t hash)
{
    struct shadow *s = arg;
    int at = -1;
    for (int i = 0; i < s->n; i++) {
        if (s->names[i] == hash) {
            at = i;
        }
    }
    switch (ev) {
    case KV_EVENT_STORED:
        if (at >= 0 || s->n == R_BLOCKS) {
            s->errors++;
        } else {
            s->names[s->n++] = hash;
        }
        break;
    case KV_EVENT_REMOVED:
        if (at < 0) {
            s->errors++;
        } else {
            s->names[at] = s->names[--s->n];
        }
        break;
    case KV_EVENT_ALL_CLEARED:
        s->cleared++;
        break;
    }
}

struct rseq {
    int live;
    struct kv_seq seq;
    uint32_t tokens[R_MAXTOK];
    int len;
};

/* Four "documents" fixed per seed. A prompt is a random-length piece of one
 * of them followed by tokens from a 3-letter alphabet, so prefixes of every
 * length repeat, and short random blocks collide by chance too. */
static uint32_t docs[4][R_MAXTOK];

static void random_tokens(uint32_t *t, int n)
{
    int d = rnd_below(5), cut = rnd_below(n + 1);
    for (int i = 0; i < n; i++) {
        t[i] = (d < 4 && i < cut) ? docs[d][i] : (uint32_t)rnd_below(3);
    }
}

/* kv_check_refs against counts from kv_seq_count_refs: every reference
 * counted passes exactly; one uncounted holder fails the exact check but not
 * the at-least one; a leaked or a missing reference fails. */
static void test_check_refs(void)
{
    enum { BS = 4, NB = 8 };
    struct kv_config c = small_cfg(NB, BS);
    struct kv_pool *p;
    struct kv_seq a, b;
    uint32_t t[12];
    uint64_t root = bh_root("tiny");
    for (int i = 0; i < 12; i++) {
        t[i] = (uint32_t)(50 + i);
    }
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&p, &c), 0);
    kv_seq_init(&a, root);
    kv_seq_init(&b, root);
    CU_ASSERT_EQUAL(kv_seq_grow(p, &a, 12), 0);
    CU_ASSERT_EQUAL(kv_seq_commit(p, &a, t, 12), 3);
    CU_ASSERT_EQUAL(kv_seq_match(p, &b, t, 11), 8); /* shares a's first 2 blocks */
    CU_ASSERT_EQUAL(kv_seq_grow(p, &b, 12), 0);
    int32_t raw;
    CU_ASSERT_EQUAL(kv_block_alloc(p, &raw), 0);
    CHECK_POOL(p);

    int32_t refs[NB] = {0};
    kv_seq_count_refs(&a, refs);
    kv_seq_count_refs(&b, refs);
    CU_ASSERT_EQUAL(refs[a.blocks[0]], 2);
    CU_ASSERT_EQUAL(refs[a.blocks[2]], 1);
    CU_ASSERT_EQUAL(refs[b.blocks[2]], 1);
    CU_ASSERT_EQUAL(refs[raw], 0);
    fprintf(stderr, "(kv_check_refs errors expected below)\n");
    /* raw's holder is not counted. */
    CU_ASSERT_EQUAL(kv_check_refs(p, refs, 1), TANDEM_EINTERNAL);
    CU_ASSERT_EQUAL(kv_check_refs(p, refs, 0), 0);
    refs[raw]++;
    CU_ASSERT_EQUAL(kv_check_refs(p, refs, 1), 0);
    /* A leaked reference: only the exact check sees it. */
    kv_block_ref(p, a.blocks[1]);
    CU_ASSERT_EQUAL(kv_check_refs(p, refs, 1), TANDEM_EINTERNAL);
    CU_ASSERT_EQUAL(kv_check_refs(p, refs, 0), 0);
    kv_block_unref(p, a.blocks[1]);
    /* A missing one (b's last block unreferenced behind b's back): both. */
    kv_block_unref(p, b.blocks[2]);
    CU_ASSERT_EQUAL(kv_check_refs(p, refs, 1), TANDEM_EINTERNAL);
    CU_ASSERT_EQUAL(kv_check_refs(p, refs, 0), TANDEM_EINTERNAL);
    CHECK_POOL(p); /* the structure alone cannot see it */
    /* Put b back together: the free list is a stack, so the block comes back. */
    int32_t again = -1;
    CU_ASSERT_EQUAL(kv_block_alloc(p, &again), 0);
    CU_ASSERT_EQUAL_FATAL(again, b.blocks[2]);
    CU_ASSERT_EQUAL(kv_check_refs(p, refs, 1), 0);

    kv_seq_release(p, &b);
    kv_seq_release(p, &a);
    kv_block_unref(p, raw);
    int32_t none[NB] = {0};
    CU_ASSERT_EQUAL(kv_check_refs(p, none, 1), 0);
    CHECK_POOL(p);
    kv_seq_fini(&a);
    kv_seq_fini(&b);
    kv_pool_destroy(p);
}

/* Compares every block's refcount with what the test holds. */
static int refcounts_match(struct kv_pool *p, struct rseq *seqs, int32_t *raw, int n_raw)
{
    int32_t expect[R_BLOCKS] = {0};
    for (int s = 0; s < R_SEQS; s++) {
        if (seqs[s].live) {
            kv_seq_count_refs(&seqs[s].seq, expect);
        }
    }
    for (int i = 0; i < n_raw; i++) {
        expect[raw[i]]++;
    }
    int in_use = 0;
    for (int b = 0; b < R_BLOCKS; b++) {
        if (kv_block_refcount(p, b) != expect[b]) {
            return 0;
        }
        in_use += expect[b] > 0;
    }
    struct kv_stats st;
    kv_pool_stats(p, &st);
    /* The workers' check (kv_check_refs) must agree with this one. */
    return st.in_use == in_use && kv_check_refs(p, expect, 1) == 0;
}

static void test_random(void)
{
    uint64_t seed;
    const char *env = getenv("KV_SEED");
    seed = env != NULL ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    printf("\n  KV_SEED=%" PRIu64 " (set it to replay)\n", seed);
    rnd_state = seed;
    for (int d = 0; d < 4; d++) {
        for (int i = 0; i < R_MAXTOK; i++) {
            docs[d][i] = (uint32_t)rnd_below(50000);
        }
    }

    struct kv_config c = small_cfg(R_BLOCKS, R_BS);
    struct kv_pool *p;
    struct shadow sh = {0};
    static struct rseq seqs[R_SEQS];
    int32_t raw[R_RAW];
    int n_raw = 0;
    uint64_t root = bh_root("tiny");
    uint64_t ref[R_MAXTOK / R_BS];
    int counts[8] = {0};
    int failures = 0;

    c.payload_div = rnd_below(2) ? -1 : 0;
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&p, &c), 0);
    kv_set_event_cb(p, shadow_event, &sh);
    memset(seqs, 0, sizeof seqs);

    int op = 0;
    while (op < R_OPS && failures == 0) {
        int kind = rnd_below(200);
        struct rseq *r = &seqs[rnd_below(R_SEQS)];
        int ok = 1;
        if (kind < 40) { /* start a sequence: match its prompt */
            if (r->live) {
                continue;
            }
            r->len = 1 + rnd_below(R_MAXTOK);
            random_tokens(r->tokens, r->len);
            kv_seq_init(&r->seq, root);
            r->live = 1;
            int nb = (r->len - 1) / R_BS;
            CU_ASSERT_EQUAL(bh_hash_prompt(root, r->tokens, r->len, R_BS, ref), r->len / R_BS);
            int expect = kv_count_prefix(p, ref, nb);
            int m = kv_seq_match(p, &r->seq, r->tokens, r->len - 1);
            ok = m == expect * R_BS && r->seq.n_blocks == expect && r->seq.n_hashed == expect;
            for (int i = 0; ok && i < expect; i++) {
                ok = r->seq.hashes[i] == ref[i] && kv_lookup(p, ref[i]) == r->seq.blocks[i];
            }
            counts[0]++;
        } else if (kind < 90) { /* grow */
            if (!r->live || r->seq.n_tokens >= r->len) {
                continue;
            }
            int to = r->seq.n_tokens + 1 + rnd_below(r->len - r->seq.n_tokens);
            struct kv_stats st, st2;
            kv_pool_stats(p, &st);
            int need = (to + R_BS - 1) / R_BS - r->seq.n_blocks;
            int old_blocks = r->seq.n_blocks, old_tokens = r->seq.n_tokens;
            int rc = kv_seq_grow(p, &r->seq, to);
            kv_pool_stats(p, &st2);
            if (need > st.free + st.cached_idle) {
                ok = rc == TANDEM_ENOSPACE && r->seq.n_blocks == old_blocks &&
                     r->seq.n_tokens == old_tokens && stats_equal(&st, &st2);
            } else {
                ok = rc == 0 && r->seq.n_tokens == to && r->seq.n_blocks == old_blocks + need;
            }
            counts[1]++;
        } else if (kind < 130) { /* commit what has been "computed" */
            if (!r->live) {
                continue;
            }
            int lo = r->seq.n_hashed * R_BS;
            if (lo > r->seq.n_tokens) {
                ok = 0;
            } else {
                int n_valid = lo + rnd_below(r->seq.n_tokens - lo + 1);
                int before = r->seq.n_hashed;
                int rc = kv_seq_commit(p, &r->seq, r->tokens, n_valid);
                int nh = n_valid / R_BS;
                bh_hash_prompt(root, r->tokens, r->len, R_BS, ref);
                ok = rc == (nh > before ? nh - before : 0) &&
                     r->seq.n_hashed == (nh > before ? nh : before);
                for (int i = 0; ok && i < r->seq.n_hashed; i++) {
                    ok = r->seq.hashes[i] == ref[i];
                }
                for (int i = before; ok && i < nh; i++) {
                    ok = kv_lookup(p, ref[i]) >= 0; /* ours or another block's */
                }
            }
            counts[2]++;
        } else if (kind < 164) { /* finish a sequence */
            if (!r->live) {
                continue;
            }
            kv_seq_release(p, &r->seq);
            ok = r->seq.n_blocks == 0 && r->seq.n_tokens == 0;
            kv_seq_fini(&r->seq);
            r->live = 0;
            counts[3]++;
        } else if (kind < 176) { /* raw match + release of a random prompt */
            uint32_t t[R_MAXTOK];
            int32_t got[R_MAXTOK / R_BS];
            int n = 1 + rnd_below(R_MAXTOK);
            random_tokens(t, n);
            int nb = bh_hash_prompt(root, t, n, R_BS, ref);
            int cnt = kv_count_prefix(p, ref, nb);
            int m = kv_match_prefix(p, ref, nb, got);
            ok = m == cnt && kv_check(p) == 0;
            for (int i = 0; ok && i < m; i++) {
                ok = got[i] == kv_lookup(p, ref[i]) && kv_block_refcount(p, got[i]) >= 1;
            }
            for (int i = m - 1; i >= 0; i--) {
                kv_block_unref(p, got[i]);
            }
            counts[4]++;
        } else if (kind < 188) { /* raw block held by "someone else" */
            if (n_raw == R_RAW) {
                continue;
            }
            struct kv_stats st;
            kv_pool_stats(p, &st);
            int rc = kv_block_alloc(p, &raw[n_raw]);
            if (st.free + st.cached_idle == 0) {
                ok = rc == TANDEM_ENOSPACE;
            } else {
                ok = rc == 0 && kv_block_refcount(p, raw[n_raw]) == 1;
                /* Half of them get a name outside any chain. */
                if (ok && rnd_below(2)) {
                    uint64_t h = rnd();
                    ok = kv_block_commit(p, raw[n_raw], h) == 0 && kv_lookup(p, h) == raw[n_raw];
                }
                n_raw += rc == 0;
            }
            counts[5]++;
        } else if (kind < 199) {
            if (n_raw == 0) {
                continue;
            }
            int i = rnd_below(n_raw);
            kv_block_unref(p, raw[i]);
            raw[i] = raw[--n_raw];
            counts[6]++;
        } else {
            kv_clear_cache(p);
            struct kv_stats st;
            kv_pool_stats(p, &st);
            ok = st.cached_idle == 0;
            counts[7]++;
        }
        op++;

        struct kv_stats st;
        kv_pool_stats(p, &st);
        if (!ok || kv_check(p) != 0 || !refcounts_match(p, seqs, raw, n_raw) || sh.errors != 0 ||
            sh.n != st.cached || st.stored - st.evicted != (uint64_t)st.cached) {
            printf("\n  op %d (kind %d) failed: ok %d, shadow errors %d, shadow %d vs cached %d\n",
                   op, kind, ok, sh.errors, sh.n, st.cached);
            failures++;
        }
    }
    CU_ASSERT_EQUAL(failures, 0);

    for (int s = 0; s < R_SEQS; s++) {
        if (seqs[s].live) {
            kv_seq_release(p, &seqs[s].seq);
            kv_seq_fini(&seqs[s].seq);
            seqs[s].live = 0;
        }
    }
    while (n_raw > 0) {
        kv_block_unref(p, raw[--n_raw]);
    }
    struct kv_stats st;
    kv_pool_stats(p, &st);
    CU_ASSERT_EQUAL(kv_check(p), 0);
    CU_ASSERT_EQUAL(st.in_use, 0);
    CU_ASSERT_EQUAL(st.free + st.cached_idle, R_BLOCKS);
    CU_ASSERT_EQUAL(st.cached, st.cached_idle);
    CU_ASSERT(st.hit_blocks > 0 && st.evicted > 0); /* the run really shared and evicted */
    printf("  ops: start %d grow %d commit %d finish %d match %d alloc %d unref %d clear %d;"
           " hits %" PRIu64 "/%" PRIu64 ", stored %" PRIu64 ", evicted %" PRIu64 "\n",
           counts[0], counts[1], counts[2], counts[3], counts[4], counts[5], counts[6], counts[7],
           st.hit_blocks, st.query_blocks, st.stored, st.evicted);
    kv_pool_destroy(p);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite("kv_cache", NULL, NULL);
    CU_add_test(s, "bad_config", test_bad_config);
    CU_add_test(s, "payload", test_payload);
    CU_add_test(s, "slot_offset", test_slot_offset);
    CU_add_test(s, "alloc_until_full", test_alloc_until_full);
    CU_add_test(s, "refcounts", test_refcounts);
    CU_add_test(s, "commit_lookup", test_commit_lookup);
    CU_add_test(s, "match_reuses_idle", test_match_reuses_idle);
    CU_add_test(s, "eviction_order", test_eviction_order);
    CU_add_test(s, "clear_cache", test_clear_cache);
    CU_add_test(s, "map_churn", test_map_churn);
    CU_add_test(s, "seq_basic", test_seq_basic);
    CU_add_test(s, "seq_rollback", test_seq_rollback);
    CU_add_test(s, "check_refs", test_check_refs);
    CU_add_test(s, "random", test_random);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
