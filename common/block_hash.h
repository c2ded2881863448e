/* Chained prefix hashing of KV blocks, shared by the router and the workers.
 *
 * A full block of block_size tokens is named by
 *   h(i) = XXH3_64bits_withSeed(le_u32(tokens[i*bs .. (i+1)*bs)), seed = h(i-1))
 * with h(-1) = the root hash of the model (XXH3-64 of the model identifier).
 * The parent hash enters as the XXH3 seed, so two prompts share a hash for
 * block i exactly when they share every token of blocks 0..i. Only full blocks
 * are hashed; a partial trailing block has no name. Token ids are hashed as
 * little-endian uint32 whatever the host order. */
#ifndef TANDEM_BLOCK_HASH_H
#define TANDEM_BLOCK_HASH_H

#include <stddef.h>
#include <stdint.h>

#define BH_DEFAULT_BLOCK_SIZE 16
#define BH_MAX_BLOCK_SIZE     1024

/* Root hash for a model identifier (e.g. "tiny"). Thread-safe, pure. */
uint64_t bh_root(const char *model_id);

/* Hash of one full block given its parent's hash. Pure. */
uint64_t bh_block(uint64_t parent, const uint32_t *tokens, int block_size);

/* Hashes every full block of tokens[0..n) into out[0..n/block_size).
 * Returns the number of hashes written (n / block_size), or TANDEM_EINVAL
 * when block_size is outside [1, BH_MAX_BLOCK_SIZE] or n < 0.
 * The caller owns out and sizes it for at least n / block_size entries. */
int bh_hash_prompt(uint64_t root, const uint32_t *tokens, int n, int block_size, uint64_t *out);

#endif
