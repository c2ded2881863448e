/* Prefix index: a pool of (hash, endpoint) nodes, a linear-probing table from
 * hash to its holder list, and one LRU list per endpoint. See prefix_index.h. */
#include "prefix_index.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "tandem_err.h"

#define NIL UINT32_MAX

struct pnode {
    uint64_t hash;
    uint32_t ep;
    uint32_t hnext, hprev; /* holder list of this hash */
    uint32_t lnext, lprev; /* ep's LRU list (lnext also chains the free list) */
};

struct eplist {
    uint32_t head; /* most recent */
    uint32_t tail; /* least recent */
    uint32_t count;
};

/* The table is split in SHARDS independent linear-probing tables chosen by
 * the top bits of the mixed hash, and the pool in fixed chunks: growing
 * either touches 1/SHARDS of the entries or allocates one chunk, never the
 * whole index (one table doubling in one go stalled a decision: docs/performance.md,
 * "router decisions"). */
#define SHARD_BITS  8
#define SHARDS      (1u << SHARD_BITS)
#define CHUNK_BITS  14
#define CHUNK_NODES (1u << CHUNK_BITS)
#define NODE(ix, x) (&(ix)->chunks[(x) >> CHUNK_BITS][(x) & (CHUNK_NODES - 1)])

struct shard {
    uint64_t *keys;  /* (cap) block hash of the slot */
    uint32_t *heads; /* (cap) first holder node, NIL = empty slot */
    uint32_t cap;
    uint32_t bits;
    uint32_t used;
};

struct rt_prefix_index {
    int max_endpoints;
    uint32_t capacity;
    struct eplist *eps; /* (max_endpoints) */

    struct pnode **chunks; /* (n_chunks) of CHUNK_NODES nodes */
    uint32_t n_chunks;
    uint32_t n_nodes; /* n_chunks x CHUNK_NODES */
    uint32_t free_head;
    uint64_t live;

    struct shard shards[SHARDS];
    uint64_t table_used;

    uint64_t evictions;
    uint64_t removed_unknown;
};

/* Block hashes are XXH3 output, but tests and replays use small values: a
 * Fibonacci multiply spreads them anyway. Top bits pick the shard, the next
 * ones the slot. */
static uint64_t mix(uint64_t h)
{
    return h * 0x9E3779B97F4A7C15ull;
}

static struct shard *shard_of(struct rt_prefix_index *ix, uint64_t h)
{
    return &ix->shards[mix(h) >> (64 - SHARD_BITS)];
}

static const struct shard *shard_of_c(const struct rt_prefix_index *ix, uint64_t h)
{
    return &ix->shards[mix(h) >> (64 - SHARD_BITS)];
}

static uint32_t slot_of(const struct shard *sh, uint64_t h)
{
    return (uint32_t)((mix(h) << SHARD_BITS) >> (64 - sh->bits));
}

static int64_t table_find(const struct shard *sh, uint64_t h)
{
    uint32_t mask = sh->cap - 1;
    for (uint32_t i = slot_of(sh, h);; i = (i + 1) & mask) {
        if (sh->heads[i] == NIL)
            return -1;
        if (sh->keys[i] == h)
            return i;
    }
}

static int table_alloc(struct shard *sh, uint32_t bits)
{
    uint32_t cap = 1u << bits;
    uint64_t *keys = malloc(sizeof(*keys) * cap);
    uint32_t *heads = malloc(sizeof(*heads) * cap);
    if (!keys || !heads) {
        free(keys);
        free(heads);
        return TANDEM_ENOMEM;
    }
    memset(heads, 0xff, sizeof(*heads) * cap);
    uint64_t *old_keys = sh->keys;
    uint32_t *old_heads = sh->heads;
    uint32_t old_cap = sh->cap;
    sh->keys = keys;
    sh->heads = heads;
    sh->cap = cap;
    sh->bits = bits;
    uint32_t mask = cap - 1;
    for (uint32_t j = 0; j < old_cap; j++) {
        if (old_heads[j] == NIL)
            continue;
        uint32_t i = slot_of(sh, old_keys[j]);
        while (heads[i] != NIL)
            i = (i + 1) & mask;
        keys[i] = old_keys[j];
        heads[i] = old_heads[j];
    }
    free(old_keys);
    free(old_heads);
    return 0;
}

/* Slot for a new key h (not present). Grows the shard to keep load <= 1/2. */
static int64_t table_insert(struct rt_prefix_index *ix, struct shard *sh, uint64_t h, uint32_t head)
{
    if ((uint64_t)(sh->used + 1) * 2 > sh->cap) {
        if (sh->bits >= 31)
            return TANDEM_ENOMEM;
        int rc = table_alloc(sh, sh->bits + 1);
        if (rc < 0)
            return rc;
    }
    uint32_t mask = sh->cap - 1;
    uint32_t i = slot_of(sh, h);
    while (sh->heads[i] != NIL)
        i = (i + 1) & mask;
    sh->keys[i] = h;
    sh->heads[i] = head;
    sh->used++;
    ix->table_used++;
    return i;
}

/* Backward-shift deletion keeps every probe chain unbroken without tombstones. */
static void table_delete(struct rt_prefix_index *ix, struct shard *sh, uint32_t i)
{
    uint32_t mask = sh->cap - 1;
    uint32_t j = i;
    sh->heads[i] = NIL;
    sh->used--;
    ix->table_used--;
    for (;;) {
        j = (j + 1) & mask;
        if (sh->heads[j] == NIL)
            return;
        uint32_t k = slot_of(sh, sh->keys[j]);
        /* The entry at j may move to i only if its home k is not cyclically in (i, j]. */
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays)
            continue;
        sh->keys[i] = sh->keys[j];
        sh->heads[i] = sh->heads[j];
        sh->heads[j] = NIL;
        i = j;
    }
}

static int pool_grow(struct rt_prefix_index *ix)
{
    if ((uint64_t)ix->n_nodes + CHUNK_NODES >= NIL)
        return TANDEM_ENOMEM;
    struct pnode **chunks = realloc(ix->chunks, sizeof(*chunks) * (ix->n_chunks + 1));
    if (!chunks)
        return TANDEM_ENOMEM;
    ix->chunks = chunks;
    struct pnode *c = malloc(sizeof(*c) * CHUNK_NODES);
    if (!c)
        return TANDEM_ENOMEM;
    chunks[ix->n_chunks++] = c;
    /* New nodes join the free list in index order. */
    for (uint32_t i = CHUNK_NODES; i-- > 0;) {
        c[i].lnext = ix->free_head;
        ix->free_head = ix->n_nodes + i;
    }
    ix->n_nodes += CHUNK_NODES;
    return 0;
}

static void lru_unlink(struct rt_prefix_index *ix, uint32_t x)
{
    struct pnode *n = NODE(ix, x);
    struct eplist *l = &ix->eps[n->ep];
    if (n->lprev != NIL)
        NODE(ix, n->lprev)->lnext = n->lnext;
    else
        l->head = n->lnext;
    if (n->lnext != NIL)
        NODE(ix, n->lnext)->lprev = n->lprev;
    else
        l->tail = n->lprev;
    l->count--;
}

static void lru_push_front(struct rt_prefix_index *ix, uint32_t x)
{
    struct pnode *n = NODE(ix, x);
    struct eplist *l = &ix->eps[n->ep];
    n->lprev = NIL;
    n->lnext = l->head;
    if (l->head != NIL)
        NODE(ix, l->head)->lprev = x;
    else
        l->tail = x;
    l->head = x;
    l->count++;
}

/* Unlinks x from its hash's holder list; deletes the table slot if empty. */
static void holder_unlink(struct rt_prefix_index *ix, uint32_t x)
{
    struct pnode *n = NODE(ix, x);
    if (n->hnext != NIL)
        NODE(ix, n->hnext)->hprev = n->hprev;
    if (n->hprev != NIL) {
        NODE(ix, n->hprev)->hnext = n->hnext;
        return;
    }
    struct shard *sh = shard_of(ix, n->hash);
    int64_t s = table_find(sh, n->hash);
    if (n->hnext != NIL)
        sh->heads[s] = n->hnext;
    else
        table_delete(ix, sh, (uint32_t)s);
}

static void holder_push_front(struct rt_prefix_index *ix, struct shard *sh, uint32_t slot,
                              uint32_t x)
{
    struct pnode *n = NODE(ix, x);
    n->hprev = NIL;
    n->hnext = sh->heads[slot];
    if (n->hnext != NIL)
        NODE(ix, n->hnext)->hprev = x;
    sh->heads[slot] = x;
}

static void node_free(struct rt_prefix_index *ix, uint32_t x)
{
    holder_unlink(ix, x);
    lru_unlink(ix, x);
    NODE(ix, x)->lnext = ix->free_head;
    ix->free_head = x;
    ix->live--;
}

/* The node of (h, ep) whose holder list starts at head, or NIL. */
static uint32_t find_holder(const struct rt_prefix_index *ix, uint32_t head, uint32_t ep)
{
    for (uint32_t x = head; x != NIL; x = NODE(ix, x)->hnext)
        if (NODE(ix, x)->ep == ep)
            return x;
    return NIL;
}

/* Makes (h, ep) held and most recent. */
static int hold(struct rt_prefix_index *ix, uint32_t ep, uint64_t h)
{
    struct shard *sh = shard_of(ix, h);
    int64_t s = table_find(sh, h);
    if (s >= 0) {
        uint32_t x = find_holder(ix, sh->heads[s], ep);
        if (x != NIL) {
            lru_unlink(ix, x);
            lru_push_front(ix, x);
            if (sh->heads[s] != x) { /* move to front: the next touch finds it first */
                holder_unlink(ix, x);
                holder_push_front(ix, sh, (uint32_t)s, x);
            }
            return 0;
        }
    }
    uint32_t x;
    if (ix->eps[ep].count >= ix->capacity) {
        x = ix->eps[ep].tail;
        holder_unlink(ix, x);
        lru_unlink(ix, x);
        ix->live--;
        ix->evictions++;
    } else {
        if (ix->free_head == NIL) {
            int rc = pool_grow(ix);
            if (rc < 0)
                return rc;
        }
        x = ix->free_head;
        ix->free_head = NODE(ix, x)->lnext;
    }
    struct pnode *n = NODE(ix, x);
    n->hash = h;
    n->ep = ep;
    /* The eviction may have moved entries of this shard: look the slot up again. */
    s = table_find(sh, h);
    if (s < 0) {
        s = table_insert(ix, sh, h, NIL);
        if (s < 0) {
            n->lnext = ix->free_head;
            ix->free_head = x;
            return (int)s;
        }
    }
    holder_push_front(ix, sh, (uint32_t)s, x);
    lru_push_front(ix, x);
    ix->live++;
    return 0;
}

int rt_prefix_index_create(struct rt_prefix_index **out, int max_endpoints, uint32_t capacity)
{
    if (!out || max_endpoints < 1 || capacity < 1)
        return TANDEM_EINVAL;
    struct rt_prefix_index *ix = calloc(1, sizeof(*ix));
    if (!ix)
        return TANDEM_ENOMEM;
    ix->max_endpoints = max_endpoints;
    ix->capacity = capacity;
    ix->free_head = NIL;
    ix->eps = malloc(sizeof(*ix->eps) * (size_t)max_endpoints);
    if (!ix->eps)
        goto fail;
    for (int e = 0; e < max_endpoints; e++)
        ix->eps[e] = (struct eplist){NIL, NIL, 0};
    for (uint32_t i = 0; i < SHARDS; i++)
        if (table_alloc(&ix->shards[i], 4) < 0)
            goto fail;
    *out = ix;
    return 0;
fail:
    rt_prefix_index_destroy(ix);
    return TANDEM_ENOMEM;
}

void rt_prefix_index_destroy(struct rt_prefix_index *ix)
{
    if (!ix)
        return;
    for (uint32_t i = 0; i < SHARDS; i++) {
        free(ix->shards[i].keys);
        free(ix->shards[i].heads);
    }
    for (uint32_t i = 0; i < ix->n_chunks; i++)
        free(ix->chunks[i]);
    free(ix->chunks);
    free(ix->eps);
    free(ix);
}

int rt_prefix_index_touch(struct rt_prefix_index *ix, int ep, const uint64_t *hashes, int n)
{
    if (!ix || ep < 0 || ep >= ix->max_endpoints || n < 0 || (n > 0 && !hashes))
        return TANDEM_EINVAL;
    for (int i = n - 1; i >= 0; i--) {
        int rc = hold(ix, (uint32_t)ep, hashes[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int rt_prefix_index_store(struct rt_prefix_index *ix, int ep, const uint64_t *hashes, int n)
{
    if (!ix || ep < 0 || ep >= ix->max_endpoints || n < 0 || (n > 0 && !hashes))
        return TANDEM_EINVAL;
    for (int i = 0; i < n; i++) {
        int rc = hold(ix, (uint32_t)ep, hashes[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Head of the holder list of h, or NIL. */
static uint32_t holders(const struct rt_prefix_index *ix, uint64_t h)
{
    const struct shard *sh = shard_of_c(ix, h);
    int64_t s = table_find(sh, h);
    return s < 0 ? NIL : sh->heads[s];
}

int rt_prefix_index_remove(struct rt_prefix_index *ix, int ep, const uint64_t *hashes, int n)
{
    if (!ix || ep < 0 || ep >= ix->max_endpoints || n < 0 || (n > 0 && !hashes))
        return TANDEM_EINVAL;
    for (int i = 0; i < n; i++) {
        uint32_t x = find_holder(ix, holders(ix, hashes[i]), (uint32_t)ep);
        if (x == NIL) {
            ix->removed_unknown++;
            continue;
        }
        node_free(ix, x);
    }
    return 0;
}

void rt_prefix_index_clear_endpoint(struct rt_prefix_index *ix, int ep)
{
    if (!ix || ep < 0 || ep >= ix->max_endpoints)
        return;
    while (ix->eps[ep].tail != NIL)
        node_free(ix, ix->eps[ep].tail);
}

int rt_prefix_index_match(const struct rt_prefix_index *ix, const uint64_t *hashes, int n,
                          uint32_t *matched)
{
    memset(matched, 0, sizeof(*matched) * (size_t)ix->max_endpoints);
    int best = 0;
    for (int i = 0; i < n; i++) {
        uint32_t head = holders(ix, hashes[i]);
        int advanced = 0;
        for (uint32_t x = head; x != NIL;) {
            const struct pnode *nd = NODE(ix, x);
            if (matched[nd->ep] == (uint32_t)i) {
                matched[nd->ep] = (uint32_t)i + 1;
                advanced = 1;
            }
            x = nd->hnext;
        }
        if (!advanced)
            break;
        best = i + 1;
    }
    return best;
}

int rt_prefix_index_match_one(const struct rt_prefix_index *ix, int ep, const uint64_t *hashes,
                              int n)
{
    if (ep < 0 || ep >= ix->max_endpoints)
        return 0;
    int i = 0;
    while (i < n && find_holder(ix, holders(ix, hashes[i]), (uint32_t)ep) != NIL)
        i++;
    return i;
}

int rt_prefix_index_holds(const struct rt_prefix_index *ix, int ep, uint64_t hash)
{
    if (ep < 0 || ep >= ix->max_endpoints)
        return 0;
    return find_holder(ix, holders(ix, hash), (uint32_t)ep) != NIL;
}

uint32_t rt_prefix_index_count(const struct rt_prefix_index *ix, int ep)
{
    if (ep < 0 || ep >= ix->max_endpoints)
        return 0;
    return ix->eps[ep].count;
}

void rt_prefix_index_stats(const struct rt_prefix_index *ix, struct rt_prefix_index_stats *out)
{
    out->nodes = ix->live;
    out->hashes = ix->table_used;
    out->evictions = ix->evictions;
    out->removed_unknown = ix->removed_unknown;
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            LOG_ERROR("prefix", __VA_ARGS__);                                                      \
            rc = TANDEM_EINTERNAL;                                                                 \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

int rt_prefix_index_check(const struct rt_prefix_index *ix)
{
    int rc = 0;
    uint8_t *seen = calloc(ix->n_nodes ? ix->n_nodes : 1, 1);
    if (!seen)
        return TANDEM_ENOMEM;
    uint64_t via_table = 0, slots = 0;
    for (uint32_t k = 0; k < SHARDS; k++) {
        const struct shard *sh = &ix->shards[k];
        uint64_t used = 0;
        for (uint32_t s = 0; s < sh->cap; s++) {
            if (sh->heads[s] == NIL)
                continue;
            used++;
            CHECK(shard_of_c(ix, sh->keys[s]) == sh, "shard %u holds a key of another shard", k);
            CHECK(table_find(sh, sh->keys[s]) == (int64_t)s,
                  "shard %u slot %u not reachable by probing", k, s);
            uint32_t prev = NIL;
            for (uint32_t x = sh->heads[s]; x != NIL; x = NODE(ix, x)->hnext) {
                CHECK(x < ix->n_nodes && !seen[x], "holder node %u bad or on two lists", x);
                seen[x] = 1;
                const struct pnode *n = NODE(ix, x);
                CHECK(n->hash == sh->keys[s], "node %u hash differs from its slot", x);
                CHECK(n->hprev == prev, "node %u hprev broken", x);
                CHECK((int)n->ep < ix->max_endpoints, "node %u endpoint %u out of range", x, n->ep);
                for (uint32_t y = n->hnext; y != NIL; y = NODE(ix, y)->hnext)
                    CHECK(NODE(ix, y)->ep != n->ep, "endpoint %u holds hash twice", n->ep);
                prev = x;
                via_table++;
            }
        }
        CHECK(used == sh->used, "shard %u used %u but %llu slots", k, sh->used,
              (unsigned long long)used);
        slots += used;
    }
    CHECK(slots == ix->table_used, "table_used %llu but %llu slots",
          (unsigned long long)ix->table_used, (unsigned long long)slots);
    CHECK(via_table == ix->live, "live %llu but %llu nodes on holder lists",
          (unsigned long long)ix->live, (unsigned long long)via_table);
    uint64_t via_lru = 0;
    for (int e = 0; e < ix->max_endpoints; e++) {
        uint32_t c = 0, prev = NIL;
        for (uint32_t x = ix->eps[e].head; x != NIL; x = NODE(ix, x)->lnext) {
            CHECK(x < ix->n_nodes && seen[x] == 1, "lru node %u not live", x);
            seen[x] = 2;
            CHECK(NODE(ix, x)->ep == (uint32_t)e, "node %u on the lru of another endpoint", x);
            CHECK(NODE(ix, x)->lprev == prev, "node %u lprev broken", x);
            prev = x;
            c++;
        }
        CHECK(ix->eps[e].tail == prev, "endpoint %d tail broken", e);
        CHECK(c == ix->eps[e].count, "endpoint %d count %u but %u on its list", e, ix->eps[e].count,
              c);
        CHECK(c <= ix->capacity, "endpoint %d over capacity", e);
        via_lru += c;
    }
    CHECK(via_lru == ix->live, "live %llu but %llu on lru lists", (unsigned long long)ix->live,
          (unsigned long long)via_lru);
    uint64_t n_free = 0;
    for (uint32_t x = ix->free_head; x != NIL; x = NODE(ix, x)->lnext) {
        CHECK(x < ix->n_nodes && seen[x] == 0, "free node %u also live or twice free", x);
        seen[x] = 3;
        n_free++;
    }
    CHECK(n_free + ix->live == ix->n_nodes, "free %llu + live %llu != pool %u",
          (unsigned long long)n_free, (unsigned long long)ix->live, ix->n_nodes);
out:
    free(seen);
    return rc;
}
