#include "block_hash.h"
#include "tandem_err.h"

#include <string.h>
#include <xxhash.h>

uint64_t bh_root(const char *model_id)
{
    return XXH3_64bits(model_id, strlen(model_id));
}

uint64_t bh_block(uint64_t parent, const uint32_t *tokens, int block_size)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return XXH3_64bits_withSeed(tokens, (size_t)block_size * sizeof(uint32_t), parent);
#else
    uint32_t le[BH_MAX_BLOCK_SIZE];
    for (int i = 0; i < block_size; i++) {
        le[i] = __builtin_bswap32(tokens[i]);
    }
    return XXH3_64bits_withSeed(le, (size_t)block_size * sizeof(uint32_t), parent);
#endif
}

int bh_hash_prompt(uint64_t root, const uint32_t *tokens, int n, int block_size, uint64_t *out)
{
    if (block_size < 1 || block_size > BH_MAX_BLOCK_SIZE || n < 0) {
        return TANDEM_EINVAL;
    }
    int nb = n / block_size;
    uint64_t h = root;
    for (int i = 0; i < nb; i++) {
        h = bh_block(h, tokens + (size_t)i * block_size, block_size);
        out[i] = h;
    }
    return nb;
}
