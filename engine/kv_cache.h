/* Paged KV cache: a pool of fixed-size blocks in one arena, reference counts,
 * a free list, and a prefix cache (block hash -> block) with LRU eviction of
 * idle cached blocks. Sequences hold a block table (struct kv_seq).
 *
 * Every block is in exactly one state:
 *   free         on the free list, refcount 0, no hash;
 *   in use       refcount > 0 (cached or not);
 *   cached idle  refcount 0, named by a hash, on the LRU list.
 * Invariant: free + in_use + cached_idle == total (kv_check verifies it).
 * An idle cached block is evicted (LRU first) only when the free list is
 * empty. Sequences release their blocks tail first, so the tail of a chain is
 * less recently used than its parents and is evicted before them.
 *
 * Block layout (kv_slot_offset): [layer][K=0,V=1][token in block][kv_head][head_dim],
 * values of the pool's dtype. A block is contiguous, so it ships as one payload.
 *
 * Threading: a pool and its sequences are used by one thread at a time (the
 * worker's engine thread); there is no internal locking. */
#ifndef TANDEM_KV_CACHE_H
#define TANDEM_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kv_dtype.h"

struct kv_pool;

struct kv_config {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_size;      /* tokens per block; 16 by default */
    enum kv_dtype dtype; /* storage type of every K and V value */
    int n_blocks;        /* total blocks in the pool, >= 1 */
    int payload_div;     /* 0 or 1: full bytes; N > 1: 1/N of them (rounded up);
                            -1: no payload at all (sim backend at payload "none") */
};

struct kv_stats {
    int total;
    int free;
    int in_use;
    int cached_idle;
    int cached;            /* blocks named in the prefix cache, idle or in use */
    uint64_t query_blocks; /* blocks asked for by kv_match_prefix, ever */
    uint64_t hit_blocks;   /* of which found */
    uint64_t stored;       /* blocks ever named in the prefix cache */
    uint64_t evicted;      /* idle cached blocks ever evicted */
};

enum kv_event { KV_EVENT_STORED = 0, KV_EVENT_REMOVED, KV_EVENT_ALL_CLEARED };

/* Called synchronously, on the pool's thread, each time a hash enters
 * (STORED) or leaves (REMOVED, by eviction or clear) the prefix cache, and
 * once with hash 0 on kv_clear_cache (ALL_CLEARED). */
typedef void (*kv_event_cb)(void *arg, enum kv_event ev, uint64_t hash);

/* Bytes of one full-precision block: 2 x layers x kv_heads x head_dim x
 * dtype size x block_size, before payload_div. */
size_t kv_config_block_bytes(const struct kv_config *cfg);

/* Creates a pool. Validates cfg (every count >= 1, block_size <= 1024,
 * arena size fits size_t): TANDEM_EINVAL naming nothing, TANDEM_ENOMEM.
 * On success *out is owned by the caller: free with kv_pool_destroy; on
 * failure *out is NULL. The arena starts zeroed. */
int kv_pool_create(struct kv_pool **out, const struct kv_config *cfg);
void kv_pool_destroy(struct kv_pool *pool);

const struct kv_config *kv_pool_config(const struct kv_pool *pool);
/* Stored bytes per block (after payload_div; 0 at payload "none"). */
size_t kv_block_bytes(const struct kv_pool *pool);
/* Start of a block's payload in the arena (NULL when there is none).
 * block must be in [0, total). */
uint8_t *kv_block_data(struct kv_pool *pool, int32_t block);
/* Byte offset inside a block of the (n_kv_heads x head_dim) vector of
 * (layer, kind 0=K 1=V, token index in block). Full-payload pools only. */
size_t kv_slot_offset(const struct kv_pool *pool, int layer, int kind, int tok);

/* Takes a block with refcount 1 and no hash. When the free list is empty the
 * least recently used idle cached block is evicted (KV_EVENT_REMOVED).
 * Returns 0, or TANDEM_ENOSPACE when every block is in use. */
int kv_block_alloc(struct kv_pool *pool, int32_t *out);
/* Takes one more reference on an in-use block, or revives an idle cached one
 * (e.g. found by kv_lookup; it leaves the LRU). A free block cannot be
 * referenced: logged and ignored, like an unref of a block with no reference. */
void kv_block_ref(struct kv_pool *pool, int32_t block);
/* Drops one reference. At zero a cached block becomes idle (most recently
 * used end of the LRU); an uncached one returns to the free list. */
void kv_block_unref(struct kv_pool *pool, int32_t block);
int kv_block_refcount(const struct kv_pool *pool, int32_t block);

/* Names an in-use, uncached block by hash in the prefix cache
 * (KV_EVENT_STORED). Returns 0; TANDEM_EEXIST when another block already
 * holds that hash (the block stays uncached); TANDEM_EINVAL when the block
 * is not in use or already named. */
int kv_block_commit(struct kv_pool *pool, int32_t block, uint64_t hash);
/* The block cached under hash, or -1. Takes no reference. */
int32_t kv_lookup(const struct kv_pool *pool, uint64_t hash);

/* Longest cached prefix of hashes[0..n): writes its blocks to blocks_out,
 * takes a reference on each (idle ones leave the LRU), and returns how many.
 * Counts n query blocks and the returned number of hit blocks in the stats. */
int kv_match_prefix(struct kv_pool *pool, const uint64_t *hashes, int n, int32_t *blocks_out);

/* Same as kv_match_prefix but takes no reference and counts nothing: how many
 * leading blocks are cached now (for load reports and routing probes). */
int kv_count_prefix(const struct kv_pool *pool, const uint64_t *hashes, int n);

/* Evicts every idle cached block and emits KV_EVENT_ALL_CLEARED. In-use
 * blocks keep their names. */
void kv_clear_cache(struct kv_pool *pool);

void kv_pool_stats(const struct kv_pool *pool, struct kv_stats *out);
/* Walks every internal structure: invariant, refcounts, free list, LRU and
 * map agree. Returns 0 or TANDEM_EINTERNAL (and logs what is wrong). O(total). */
int kv_check(const struct kv_pool *pool);
/* Compares every block's refcount with refs[block] (n_blocks entries): the
 * references its holders counted, e.g. with kv_seq_count_refs over every
 * live sequence. exact = 1: each refcount must equal its count (a leaked or
 * a missing reference fails); exact = 0: some holders were not counted, so
 * only refcount >= count (a missing reference fails). Returns 0 or
 * TANDEM_EINTERNAL (and logs the first block that differs). O(total). */
int kv_check_refs(const struct kv_pool *pool, const int32_t *refs, int exact);
void kv_set_event_cb(struct kv_pool *pool, kv_event_cb cb, void *arg);

/* A sequence's block table. Owned by the sequence; blocks are references
 * into the pool released by kv_seq_release. */
struct kv_seq {
    int32_t *blocks;  /* (cap) block ids; n_blocks used */
    uint64_t *hashes; /* (cap) hash of block i for i < n_hashed */
    int n_blocks;
    int cap;
    int n_tokens;        /* token slots reserved (positions 0..n_tokens-1) */
    int n_hashed;        /* leading full blocks hashed (and committed if possible) */
    int n_cached_tokens; /* tokens that came from the prefix cache (kv_seq_match) */
    uint64_t root;       /* model root hash: parent of block 0 */
};

void kv_seq_init(struct kv_seq *seq, uint64_t root);
/* On an empty sequence: shares the longest cached prefix of full blocks of
 * tokens[0..max_tokens) (pass n - 1 to always leave one token to compute).
 * Returns the number of tokens matched (a multiple of block_size), or a
 * negative error (TANDEM_ENOMEM, TANDEM_EINVAL if the sequence is not empty). */
int kv_seq_match(struct kv_pool *pool, struct kv_seq *seq, const uint32_t *tokens, int max_tokens);
/* Grows the sequence to n_tokens slots, allocating blocks at boundaries.
 * A smaller n_tokens is a no-op (sequences never shrink). All or nothing:
 * availability is checked first, so TANDEM_ENOSPACE leaves the sequence and
 * the pool unchanged (nothing evicted). TANDEM_ENOMEM, TANDEM_EINVAL (< 0). */
int kv_seq_grow(struct kv_pool *pool, struct kv_seq *seq, int n_tokens);
/* Hashes and commits every full block among tokens[0..n_valid) not yet
 * hashed (n_valid <= n_tokens: only tokens whose KV is written). A block
 * whose hash is already cached elsewhere stays private (its hash is still
 * recorded in seq->hashes and the chain continues). Returns the number of
 * newly hashed blocks, or a negative error (TANDEM_EINVAL: n_valid out of
 * [0, n_tokens]). */
int kv_seq_commit(struct kv_pool *pool, struct kv_seq *seq, const uint32_t *tokens, int n_valid);
/* Releases every block, tail first, and resets the sequence (keeps root). */
void kv_seq_release(struct kv_pool *pool, struct kv_seq *seq);
/* Frees the arrays; the sequence must have been released. */
void kv_seq_fini(struct kv_seq *seq);
/* Adds one to refs[b] for every block b the sequence holds (refs has the
 * pool's n_blocks entries), for kv_check_refs. */
void kv_seq_count_refs(const struct kv_seq *seq, int32_t *refs);

#endif
