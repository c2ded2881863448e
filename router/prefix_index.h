/* Prefix index: which endpoints hold which KV blocks, by chained block hash
 * (common/block_hash.h), to predict how many leading blocks of a prompt each
 * endpoint has cached.
 *
 * One structure serves both modes of prefix-cache-scorer:
 *   - approx: learned from the router's own decisions. rt_prefix_index_touch()
 *     records a request's block hashes as held by the chosen endpoint; each
 *     endpoint keeps at most `capacity` hashes and evicts its least recently
 *     touched one beyond that. Hashes of one request are touched tail first,
 *     so the leading blocks end most recent and a prefix loses its tail
 *     before its head, as the workers' own caches do.
 *   - precise: kept from the workers' KV events. rt_prefix_index_store(),
 *     _remove() and _clear_endpoint() mirror STORED, REMOVED and ALL_CLEARED.
 *     `capacity` is then only a memory bound (an endpoint over it loses its
 *     least recently stored hash and the overflow counter says so).
 *
 * Layout: every (hash, endpoint) pair is one node in a pool. A hash table
 * maps a hash to the head of its list of holder nodes (one per endpoint
 * holding it); each endpoint threads its nodes on an LRU list. Matching a
 * prompt of n blocks costs O(n + holders visited); insertion and removal are
 * O(1) plus a walk of the hash's holders (most recent first). The table is
 * 256 independent linear-probing shards and the pool a list of fixed chunks,
 * so growing rehashes one shard or allocates one chunk, never the whole index;
 * in steady state (endpoints at capacity) touching reuses evicted nodes and
 * allocates nothing.
 *
 * Threading: not locked; one thread (the router's loop). */
#ifndef TANDEM_RT_PREFIX_INDEX_H
#define TANDEM_RT_PREFIX_INDEX_H

#include <stddef.h>
#include <stdint.h>

struct rt_prefix_index;

struct rt_prefix_index_stats {
    uint64_t nodes;           /* (hash, endpoint) pairs held now */
    uint64_t hashes;          /* distinct hashes held now */
    uint64_t evictions;       /* pairs dropped because an endpoint was at capacity */
    uint64_t removed_unknown; /* remove of a pair not held (precise mode resync noise) */
};

/* Creates an index for endpoints 0..max_endpoints-1, each holding at most
 * capacity hashes (>= 1). Returns 0, TANDEM_EINVAL or TANDEM_ENOMEM; on
 * success the caller owns *out (rt_prefix_index_destroy). */
int rt_prefix_index_create(struct rt_prefix_index **out, int max_endpoints, uint32_t capacity);
void rt_prefix_index_destroy(struct rt_prefix_index *ix);

/* Approx learning: marks hashes[0..n) as held by ep, most recent, touching
 * hashes[n-1] first and hashes[0] last; evicts ep's least recent pairs beyond
 * capacity. Returns 0, TANDEM_EINVAL (bad ep or n < 0) or TANDEM_ENOMEM (the
 * pool could not grow: the index keeps what it had). */
int rt_prefix_index_touch(struct rt_prefix_index *ix, int ep, const uint64_t *hashes, int n);

/* Precise events: STORED marks hashes[0..n) held by ep in order (a pair
 * already held is refreshed); REMOVED forgets them (pairs not held are
 * counted in removed_unknown and ignored); ALL_CLEARED forgets all of ep's
 * pairs. Same returns as rt_prefix_index_touch. */
int rt_prefix_index_store(struct rt_prefix_index *ix, int ep, const uint64_t *hashes, int n);
int rt_prefix_index_remove(struct rt_prefix_index *ix, int ep, const uint64_t *hashes, int n);
void rt_prefix_index_clear_endpoint(struct rt_prefix_index *ix, int ep);

/* For every endpoint e, writes to matched[e] the number of leading hashes of
 * hashes[0..n) that e holds (matched has max_endpoints entries; every one is
 * written). Returns the largest value written. Does not change recency. */
int rt_prefix_index_match(const struct rt_prefix_index *ix, const uint64_t *hashes, int n,
                          uint32_t *matched);

/* Leading hashes of hashes[0..n) held by ep alone. */
int rt_prefix_index_match_one(const struct rt_prefix_index *ix, int ep, const uint64_t *hashes,
                              int n);

/* Whether ep holds hash. */
int rt_prefix_index_holds(const struct rt_prefix_index *ix, int ep, uint64_t hash);

/* Pairs held by ep. */
uint32_t rt_prefix_index_count(const struct rt_prefix_index *ix, int ep);

void rt_prefix_index_stats(const struct rt_prefix_index *ix, struct rt_prefix_index_stats *out);

/* Walks every structure (table, holder lists, LRU lists, counts, free list)
 * and checks they agree. Returns 0 or TANDEM_EINTERNAL (logs what is wrong).
 * O(pool size + table size); for tests. */
int rt_prefix_index_check(const struct rt_prefix_index *ix);

#endif
