/* A hash map from non-zero uint64 keys (request ids, block hashes) to
 * pointers: the workers' per-request state and their mirror of the prefix
 * cache, the router's wire request id -> attempt. Open addressing with linear probing and
 * backward-shift deletion (no tombstones), load kept <= 1/2, so lookups stay O(1) whatever the
 * history.
 *
 * Threading: none; one thread uses a map. */
#ifndef TANDEM_U64_MAP_H
#define TANDEM_U64_MAP_H

#include <stddef.h>
#include <stdint.h>

struct u64_map_slot {
    uint64_t key; /* 0: empty */
    void *val;
};

struct u64_map {
    struct u64_map_slot *slots; /* (mask + 1) */
    size_t mask;
    size_t n;
};

/* An empty map; nothing is allocated until the first put. */
void u64_map_init(struct u64_map *m);
/* Frees the table (not the values; the caller owns them). */
void u64_map_fini(struct u64_map *m);

/* The value of key, or NULL when absent (key 0 is never present). */
void *u64_map_get(const struct u64_map *m, uint64_t key);
/* Starts fetching the slot where key would be, so that a u64_map_get of it a
 * little later does not wait for memory. Changes nothing. */
void u64_map_prefetch(const struct u64_map *m, uint64_t key);

/* Inserts or replaces key -> val. Returns 0, TANDEM_EINVAL for key 0, or
 * TANDEM_ENOMEM (the map is unchanged). */
int u64_map_put(struct u64_map *m, uint64_t key, void *val);

/* Removes key; returns its value, or NULL when absent. */
void *u64_map_del(struct u64_map *m, uint64_t key);

/* Iteration: for (size_t i = 0; u64_map_next(m, &i, &k, &v);) ... Must not
 * modify the map while iterating. Returns 1 while there is an entry. */
int u64_map_next(const struct u64_map *m, size_t *iter, uint64_t *key, void **val);

#endif
