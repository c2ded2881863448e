/* Paged KV cache. Metadata is struct-of-arrays indexed by block id:
 * refcount, hash, flags, LRU links (an intrusive doubly linked list of idle
 * cached blocks, head = least recently used) and a free stack. The prefix map
 * is an open-addressing table (power of two, linear probing, backward-shift
 * deletion, so no tombstones) from block hash to block id, at most half full.
 * Every operation is O(1) except the prefix walks, which are O(blocks). */
#include "kv_cache.h"
#include "block_hash.h"
#include "log.h"
#include "tandem_err.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define KV_F_NAMED 0x01u /* block is named in the prefix map */

struct kv_map_slot {
    uint64_t key;
    int32_t block; /* -1: empty */
};

struct kv_pool {
    struct kv_config cfg;
    size_t block_bytes; /* stored bytes per block, after payload_div */
    size_t arena_bytes; /* mapped bytes (0 when there is no payload) */
    uint8_t *arena;     /* (total, block_bytes) or NULL */
    int total;

    int32_t *refcount;   /* (total) */
    uint64_t *hash;      /* (total) valid when KV_F_NAMED */
    uint8_t *flags;      /* (total) KV_F_* */
    int32_t *lru_prev;   /* (total) -1 at the head */
    int32_t *lru_next;   /* (total) -1 at the tail */
    int32_t lru_head;    /* least recently used idle cached block, or -1 */
    int32_t lru_tail;    /* most recently used, or -1 */
    int32_t *free_stack; /* (total) free block ids; top at n_free - 1 */
    int n_free;
    int n_in_use;
    int n_idle;
    int n_cached;

    struct kv_map_slot *map; /* (map_mask + 1) */
    uint64_t map_mask;
    int map_shift; /* 64 - log2(slots) */

    uint64_t query_blocks;
    uint64_t hit_blocks;
    uint64_t stored;
    uint64_t evicted;

    kv_event_cb cb;
    void *cb_arg;

    uint8_t *scratch; /* (total) marks for kv_check */
};

/* ---- prefix map ---------------------------------------------------------- */

/* Hashes from bh_block are already uniform, but tests and callers may commit
 * small integers: a Fibonacci multiply spreads them over the table. */
static inline uint64_t map_home(const struct kv_pool *p, uint64_t key)
{
    return (key * 0x9E3779B97F4A7C15ull) >> p->map_shift;
}

static inline int32_t map_find(const struct kv_pool *p, uint64_t key)
{
    uint64_t i = map_home(p, key);
    for (;;) {
        const struct kv_map_slot *s = &p->map[i];
        if (s->block < 0) {
            return -1;
        }
        if (s->key == key) {
            return s->block;
        }
        i = (i + 1) & p->map_mask;
    }
}

/* key must not be present; the table is never more than half full. */
static void map_insert(struct kv_pool *p, uint64_t key, int32_t block)
{
    uint64_t i = map_home(p, key);
    while (p->map[i].block >= 0) {
        i = (i + 1) & p->map_mask;
    }
    p->map[i].key = key;
    p->map[i].block = block;
}

static void map_remove(struct kv_pool *p, uint64_t key)
{
    uint64_t i = map_home(p, key);
    for (;;) {
        if (p->map[i].block < 0) {
            return; /* not present */
        }
        if (p->map[i].key == key) {
            break;
        }
        i = (i + 1) & p->map_mask;
    }
    /* Backward shift: pull later entries of the probe run into the hole
     * unless their home lies cyclically in (hole, j]. */
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & p->map_mask;
        if (p->map[j].block < 0) {
            break;
        }
        uint64_t k = map_home(p, p->map[j].key);
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            p->map[i] = p->map[j];
            i = j;
        }
    }
    p->map[i].block = -1;
}

/* ---- block lists --------------------------------------------------------- */

static inline void lru_unlink(struct kv_pool *p, int32_t b)
{
    int32_t pv = p->lru_prev[b], nx = p->lru_next[b];
    if (pv >= 0) {
        p->lru_next[pv] = nx;
    } else {
        p->lru_head = nx;
    }
    if (nx >= 0) {
        p->lru_prev[nx] = pv;
    } else {
        p->lru_tail = pv;
    }
    p->lru_prev[b] = p->lru_next[b] = -1;
}

static inline void lru_push_mru(struct kv_pool *p, int32_t b)
{
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) {
        p->lru_next[p->lru_tail] = b;
    } else {
        p->lru_head = b;
    }
    p->lru_tail = b;
}

static inline void emit(struct kv_pool *p, enum kv_event ev, uint64_t hash)
{
    if (p->cb != NULL) {
        p->cb(p->cb_arg, ev, hash);
    }
}

/* Drops an idle cached block's name; the caller decides where it goes. */
static uint64_t evict_idle(struct kv_pool *p, int32_t b)
{
    uint64_t h = p->hash[b];
    lru_unlink(p, b);
    p->n_idle--;
    map_remove(p, h);
    p->flags[b] &= (uint8_t)~KV_F_NAMED;
    p->hash[b] = 0;
    p->n_cached--;
    p->evicted++;
    return h;
}

static inline int block_valid(const struct kv_pool *p, int32_t b)
{
    return b >= 0 && b < p->total;
}

/* ---- pool ---------------------------------------------------------------- */

/* a * b into *out unless it overflows. */
static int mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a) {
        return -1;
    }
    *out = a * b;
    return 0;
}

static int full_block_bytes(const struct kv_config *cfg, size_t *out)
{
    size_t v = 2;
    if (mul_size(v, (size_t)cfg->n_layers, &v) || mul_size(v, (size_t)cfg->n_kv_heads, &v) ||
        mul_size(v, (size_t)cfg->head_dim, &v) || mul_size(v, kv_dtype_size(cfg->dtype), &v) ||
        mul_size(v, (size_t)cfg->block_size, &v)) {
        return -1;
    }
    *out = v;
    return 0;
}

size_t kv_config_block_bytes(const struct kv_config *cfg)
{
    size_t v;
    if (cfg == NULL || cfg->n_layers < 1 || cfg->n_kv_heads < 1 || cfg->head_dim < 1 ||
        cfg->block_size < 1 || (unsigned)cfg->dtype >= KV_DTYPE_COUNT ||
        full_block_bytes(cfg, &v) != 0) {
        return 0;
    }
    return v;
}

int kv_pool_create(struct kv_pool **out, const struct kv_config *cfg)
{
    size_t full, stored, arena;
    if (out == NULL) {
        return TANDEM_EINVAL;
    }
    *out = NULL;
    if (cfg == NULL) {
        return TANDEM_EINVAL;
    }
    if (cfg->n_layers < 1 || cfg->n_kv_heads < 1 || cfg->head_dim < 1 || cfg->block_size < 1 ||
        cfg->block_size > BH_MAX_BLOCK_SIZE || cfg->n_blocks < 1 ||
        (unsigned)cfg->dtype >= KV_DTYPE_COUNT || cfg->payload_div < -1 ||
        full_block_bytes(cfg, &full) != 0) {
        return TANDEM_EINVAL;
    }
    if (cfg->payload_div == -1) {
        stored = 0;
    } else if (cfg->payload_div <= 1) {
        stored = full;
    } else {
        stored = full / (size_t)cfg->payload_div + (full % (size_t)cfg->payload_div != 0);
    }
    if (mul_size(stored, (size_t)cfg->n_blocks, &arena) != 0 || arena > SIZE_MAX / 2) {
        return TANDEM_EINVAL;
    }

    int rc = TANDEM_ENOMEM;
    struct kv_pool *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return TANDEM_ENOMEM;
    }
    p->cfg = *cfg;
    p->total = cfg->n_blocks;
    p->block_bytes = stored;
    size_t n = (size_t)p->total;

    /* Map slots: the smallest power of two >= 2 * total (load <= 0.5). */
    int log2 = 1;
    while (((size_t)1 << log2) < 2 * n) {
        log2++;
    }
    p->map_mask = ((uint64_t)1 << log2) - 1;
    p->map_shift = 64 - log2;

    p->refcount = calloc(n, sizeof *p->refcount);
    p->hash = calloc(n, sizeof *p->hash);
    p->flags = calloc(n, sizeof *p->flags);
    p->lru_prev = malloc(n * sizeof *p->lru_prev);
    p->lru_next = malloc(n * sizeof *p->lru_next);
    p->free_stack = malloc(n * sizeof *p->free_stack);
    p->scratch = calloc(n, sizeof *p->scratch);
    p->map = malloc(((size_t)p->map_mask + 1) * sizeof *p->map);
    if (p->refcount == NULL || p->hash == NULL || p->flags == NULL || p->lru_prev == NULL ||
        p->lru_next == NULL || p->free_stack == NULL || p->scratch == NULL || p->map == NULL) {
        goto fail;
    }
    if (arena > 0) {
        /* Anonymous pages: zeroed, 64-byte (page) aligned, committed lazily,
         * so a large pool costs nothing until blocks are written. */
        void *a = mmap(NULL, arena, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (a == MAP_FAILED) {
            LOG_ERROR("kv", "cannot map a %zu-byte KV arena", arena);
            goto fail;
        }
        p->arena = a;
        p->arena_bytes = arena;
    }

    for (size_t i = 0; i <= p->map_mask; i++) {
        p->map[i].key = 0;
        p->map[i].block = -1;
    }
    for (int i = 0; i < p->total; i++) {
        p->lru_prev[i] = p->lru_next[i] = -1;
        /* Block 0 on top: allocation order 0, 1, 2, ... on a fresh pool. */
        p->free_stack[i] = p->total - 1 - i;
    }
    p->lru_head = p->lru_tail = -1;
    p->n_free = p->total;
    *out = p;
    return 0;

fail:
    kv_pool_destroy(p);
    return rc;
}

void kv_pool_destroy(struct kv_pool *pool)
{
    if (pool == NULL) {
        return;
    }
    if (pool->arena != NULL) {
        munmap(pool->arena, pool->arena_bytes);
    }
    free(pool->map);
    free(pool->scratch);
    free(pool->free_stack);
    free(pool->lru_next);
    free(pool->lru_prev);
    free(pool->flags);
    free(pool->hash);
    free(pool->refcount);
    free(pool);
}

const struct kv_config *kv_pool_config(const struct kv_pool *pool)
{
    return &pool->cfg;
}

size_t kv_block_bytes(const struct kv_pool *pool)
{
    return pool->block_bytes;
}

uint8_t *kv_block_data(struct kv_pool *pool, int32_t block)
{
    if (pool->arena == NULL || !block_valid(pool, block)) {
        return NULL;
    }
    return pool->arena + (size_t)block * pool->block_bytes;
}

size_t kv_slot_offset(const struct kv_pool *pool, int layer, int kind, int tok)
{
    const struct kv_config *c = &pool->cfg;
    size_t row = (size_t)c->n_kv_heads * (size_t)c->head_dim * kv_dtype_size(c->dtype);
    return (((size_t)layer * 2 + (size_t)kind) * (size_t)c->block_size + (size_t)tok) * row;
}

/* ---- blocks -------------------------------------------------------------- */

int kv_block_alloc(struct kv_pool *pool, int32_t *out)
{
    int32_t b;
    uint64_t removed = 0;
    int was_cached = 0;
    if (pool->n_free > 0) {
        b = pool->free_stack[--pool->n_free];
    } else if (pool->lru_head >= 0) {
        b = pool->lru_head;
        removed = evict_idle(pool, b);
        was_cached = 1;
    } else {
        return TANDEM_ENOSPACE;
    }
    pool->refcount[b] = 1;
    pool->n_in_use++;
    *out = b;
    if (was_cached) {
        emit(pool, KV_EVENT_REMOVED, removed);
    }
    return 0;
}

void kv_block_ref(struct kv_pool *pool, int32_t block)
{
    if (!block_valid(pool, block)) {
        LOG_ERROR("kv", "ref of block %d out of range", (int)block);
        return;
    }
    if (pool->refcount[block] == 0) {
        if (!(pool->flags[block] & KV_F_NAMED)) {
            LOG_ERROR("kv", "ref of free block %d ignored", (int)block);
            return;
        }
        lru_unlink(pool, block);
        pool->n_idle--;
        pool->n_in_use++;
    }
    pool->refcount[block]++;
}

void kv_block_unref(struct kv_pool *pool, int32_t block)
{
    if (!block_valid(pool, block) || pool->refcount[block] <= 0) {
        LOG_ERROR("kv", "unref of block %d that holds no reference ignored", (int)block);
        return;
    }
    if (--pool->refcount[block] > 0) {
        return;
    }
    pool->n_in_use--;
    if (pool->flags[block] & KV_F_NAMED) {
        lru_push_mru(pool, block);
        pool->n_idle++;
    } else {
        pool->free_stack[pool->n_free++] = block;
    }
}

int kv_block_refcount(const struct kv_pool *pool, int32_t block)
{
    return block_valid(pool, block) ? pool->refcount[block] : 0;
}

int kv_block_commit(struct kv_pool *pool, int32_t block, uint64_t hash)
{
    if (!block_valid(pool, block) || pool->refcount[block] <= 0 ||
        (pool->flags[block] & KV_F_NAMED)) {
        return TANDEM_EINVAL;
    }
    if (map_find(pool, hash) >= 0) {
        return TANDEM_EEXIST;
    }
    map_insert(pool, hash, block);
    pool->hash[block] = hash;
    pool->flags[block] |= KV_F_NAMED;
    pool->n_cached++;
    pool->stored++;
    emit(pool, KV_EVENT_STORED, hash);
    return 0;
}

int32_t kv_lookup(const struct kv_pool *pool, uint64_t hash)
{
    return map_find(pool, hash);
}

int kv_match_prefix(struct kv_pool *pool, const uint64_t *hashes, int n, int32_t *blocks_out)
{
    int i;
    if (n <= 0) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        int32_t b = map_find(pool, hashes[i]);
        if (b < 0) {
            break;
        }
        kv_block_ref(pool, b);
        blocks_out[i] = b;
    }
    pool->query_blocks += (uint64_t)n;
    pool->hit_blocks += (uint64_t)i;
    return i;
}

int kv_count_prefix(const struct kv_pool *pool, const uint64_t *hashes, int n)
{
    int i;
    for (i = 0; i < n; i++) {
        if (map_find(pool, hashes[i]) < 0) {
            break;
        }
    }
    return i;
}

void kv_clear_cache(struct kv_pool *pool)
{
    while (pool->lru_head >= 0) {
        int32_t b = pool->lru_head;
        uint64_t h = evict_idle(pool, b);
        pool->free_stack[pool->n_free++] = b;
        emit(pool, KV_EVENT_REMOVED, h);
    }
    emit(pool, KV_EVENT_ALL_CLEARED, 0);
}

void kv_pool_stats(const struct kv_pool *pool, struct kv_stats *out)
{
    out->total = pool->total;
    out->free = pool->n_free;
    out->in_use = pool->n_in_use;
    out->cached_idle = pool->n_idle;
    out->cached = pool->n_cached;
    out->query_blocks = pool->query_blocks;
    out->hit_blocks = pool->hit_blocks;
    out->stored = pool->stored;
    out->evicted = pool->evicted;
}

void kv_set_event_cb(struct kv_pool *pool, kv_event_cb cb, void *arg)
{
    pool->cb = cb;
    pool->cb_arg = arg;
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            LOG_ERROR("kv", "kv_check: " __VA_ARGS__);                                             \
            return TANDEM_EINTERNAL;                                                               \
        }                                                                                          \
    } while (0)

int kv_check(const struct kv_pool *p)
{
    enum { MARK_FREE = 1, MARK_IDLE = 2 };
    uint8_t *mark = p->scratch; /* scratch is ours even through a const pool */
    memset(mark, 0, (size_t)p->total);

    CHECK(p->n_free >= 0 && p->n_in_use >= 0 && p->n_idle >= 0, "negative counter");
    CHECK(p->n_free + p->n_in_use + p->n_idle == p->total,
          "free %d + in use %d + cached idle %d != total %d", p->n_free, p->n_in_use, p->n_idle,
          p->total);

    for (int i = 0; i < p->n_free; i++) {
        int32_t b = p->free_stack[i];
        CHECK(block_valid(p, b), "free list entry %d is %d", i, (int)b);
        CHECK(mark[b] == 0, "block %d twice on the free list", (int)b);
        CHECK(p->refcount[b] == 0, "free block %d has refcount %d", (int)b, (int)p->refcount[b]);
        CHECK(!(p->flags[b] & KV_F_NAMED), "free block %d is named", (int)b);
        mark[b] = MARK_FREE;
    }

    int n_lru = 0;
    int32_t prev = -1;
    for (int32_t b = p->lru_head; b >= 0; b = p->lru_next[b]) {
        CHECK(block_valid(p, b), "LRU link to %d", (int)b);
        CHECK(mark[b] == 0, "block %d on the LRU twice or also free", (int)b);
        CHECK(p->lru_prev[b] == prev, "LRU prev of %d is %d, expected %d", (int)b,
              (int)p->lru_prev[b], (int)prev);
        CHECK(p->refcount[b] == 0, "idle block %d has refcount %d", (int)b, (int)p->refcount[b]);
        CHECK(p->flags[b] & KV_F_NAMED, "idle block %d is not named", (int)b);
        mark[b] = MARK_IDLE;
        prev = b;
        n_lru++;
    }
    CHECK(p->lru_tail == prev, "LRU tail %d, last walked %d", (int)p->lru_tail, (int)prev);
    CHECK(n_lru == p->n_idle, "LRU holds %d blocks, counter says %d", n_lru, p->n_idle);

    int in_use = 0, named = 0;
    for (int32_t b = 0; b < p->total; b++) {
        if (mark[b] == 0) {
            CHECK(p->refcount[b] > 0, "block %d is on no list with refcount %d", (int)b,
                  (int)p->refcount[b]);
            in_use++;
        }
        if (p->flags[b] & KV_F_NAMED) {
            named++;
            CHECK(map_find(p, p->hash[b]) == b, "block %d named %016llx is not found in the map",
                  (int)b, (unsigned long long)p->hash[b]);
        }
    }
    CHECK(in_use == p->n_in_use, "%d blocks in use, counter says %d", in_use, p->n_in_use);
    CHECK(named == p->n_cached, "%d blocks named, counter says %d", named, p->n_cached);

    int entries = 0;
    for (uint64_t i = 0; i <= p->map_mask; i++) {
        int32_t b = p->map[i].block;
        if (b < 0) {
            continue;
        }
        entries++;
        CHECK(block_valid(p, b) && (p->flags[b] & KV_F_NAMED) && p->hash[b] == p->map[i].key,
              "map slot %llu -> block %d does not match its block", (unsigned long long)i, (int)b);
    }
    CHECK(entries == p->n_cached, "map holds %d entries, %d blocks named", entries, p->n_cached);
    return 0;
}

int kv_check_refs(const struct kv_pool *p, const int32_t *refs, int exact)
{
    for (int32_t b = 0; b < p->total; b++) {
        int32_t rc = p->refcount[b];
        CHECK(exact ? rc == refs[b] : rc >= refs[b],
              "block %d has refcount %d, its holders count %d%s", (int)b, (int)rc, (int)refs[b],
              exact ? "" : " (at least)");
    }
    return 0;
}

/* ---- sequences ----------------------------------------------------------- */

void kv_seq_init(struct kv_seq *seq, uint64_t root)
{
    memset(seq, 0, sizeof *seq);
    seq->root = root;
}

static int seq_reserve(struct kv_seq *seq, int n)
{
    if (n <= seq->cap) {
        return 0;
    }
    int cap = seq->cap > 0 ? seq->cap : 8;
    while (cap < n) {
        cap = cap > INT32_MAX / 2 ? n : cap * 2;
    }
    int32_t *b = realloc(seq->blocks, (size_t)cap * sizeof *b);
    if (b == NULL) {
        return TANDEM_ENOMEM;
    }
    seq->blocks = b;
    uint64_t *h = realloc(seq->hashes, (size_t)cap * sizeof *h);
    if (h == NULL) {
        return TANDEM_ENOMEM; /* blocks grew, cap did not: still consistent */
    }
    seq->hashes = h;
    seq->cap = cap;
    return 0;
}

int kv_seq_match(struct kv_pool *pool, struct kv_seq *seq, const uint32_t *tokens, int max_tokens)
{
    int bs = pool->cfg.block_size;
    if (seq->n_blocks != 0 || seq->n_tokens != 0 || max_tokens < 0) {
        return TANDEM_EINVAL;
    }
    int nb = max_tokens / bs;
    int rc = seq_reserve(seq, nb);
    if (rc != 0) {
        return rc;
    }
    /* Hash block by block and stop at the first miss: the rest of the
     * prompt need not be hashed now (kv_seq_commit does it later). */
    uint64_t parent = seq->root;
    int i;
    for (i = 0; i < nb; i++) {
        uint64_t h = bh_block(parent, tokens + (size_t)i * (size_t)bs, bs);
        int32_t b = map_find(pool, h);
        if (b < 0) {
            break;
        }
        kv_block_ref(pool, b);
        seq->blocks[i] = b;
        seq->hashes[i] = h;
        parent = h;
    }
    pool->query_blocks += (uint64_t)nb;
    pool->hit_blocks += (uint64_t)i;
    seq->n_blocks = i;
    seq->n_hashed = i;
    seq->n_tokens = i * bs;
    seq->n_cached_tokens = i * bs;
    return i * bs;
}

int kv_seq_grow(struct kv_pool *pool, struct kv_seq *seq, int n_tokens)
{
    int bs = pool->cfg.block_size;
    if (n_tokens < 0) {
        return TANDEM_EINVAL;
    }
    if (n_tokens <= seq->n_tokens) {
        return 0;
    }
    int need = n_tokens / bs + (n_tokens % bs != 0);
    int add = need - seq->n_blocks;
    /* Refuse up front rather than allocate and roll back, so that a failed
     * grow does not evict cached blocks for nothing. */
    if (add > pool->n_free + pool->n_idle) {
        return TANDEM_ENOSPACE;
    }
    int rc = seq_reserve(seq, need);
    if (rc != 0) {
        return rc;
    }
    int old = seq->n_blocks;
    for (int i = old; i < need; i++) {
        rc = kv_block_alloc(pool, &seq->blocks[i]);
        if (rc != 0) {
            while (--i >= old) { /* not reached after the check above */
                kv_block_unref(pool, seq->blocks[i]);
            }
            return rc;
        }
    }
    seq->n_blocks = need;
    seq->n_tokens = n_tokens;
    return 0;
}

int kv_seq_commit(struct kv_pool *pool, struct kv_seq *seq, const uint32_t *tokens, int n_valid)
{
    int bs = pool->cfg.block_size;
    if (n_valid < 0 || n_valid > seq->n_tokens) {
        return TANDEM_EINVAL;
    }
    int full = n_valid / bs;
    int added = 0;
    for (int i = seq->n_hashed; i < full; i++) {
        uint64_t parent = i > 0 ? seq->hashes[i - 1] : seq->root;
        uint64_t h = bh_block(parent, tokens + (size_t)i * (size_t)bs, bs);
        int32_t b = seq->blocks[i];
        int rc = kv_block_commit(pool, b, h);
        /* EEXIST: another block holds the name; ours stays private but the
         * chain goes on. EINVAL on a block already named h: nothing to do. */
        if (rc != 0 && rc != TANDEM_EEXIST &&
            !(rc == TANDEM_EINVAL && (pool->flags[b] & KV_F_NAMED) && pool->hash[b] == h)) {
            return rc;
        }
        seq->hashes[i] = h;
        seq->n_hashed = i + 1;
        added++;
    }
    return added;
}

void kv_seq_release(struct kv_pool *pool, struct kv_seq *seq)
{
    for (int i = seq->n_blocks - 1; i >= 0; i--) {
        kv_block_unref(pool, seq->blocks[i]);
    }
    seq->n_blocks = 0;
    seq->n_tokens = 0;
    seq->n_hashed = 0;
    seq->n_cached_tokens = 0;
}

void kv_seq_fini(struct kv_seq *seq)
{
    if (seq->n_blocks != 0) {
        LOG_WARN("kv", "kv_seq_fini on a sequence still holding %d blocks", seq->n_blocks);
    }
    free(seq->blocks);
    free(seq->hashes);
    seq->blocks = NULL;
    seq->hashes = NULL;
    seq->cap = 0;
}

void kv_seq_count_refs(const struct kv_seq *seq, int32_t *refs)
{
    for (int i = 0; i < seq->n_blocks; i++) {
        refs[seq->blocks[i]]++;
    }
}
