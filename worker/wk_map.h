/* A hash map from non-zero uint64 keys (request ids, block hashes) to
 * pointers, for the workers' per-request state and their mirror of the prefix
 * cache. Open addressing with linear probing and backward-shift deletion (no
 * tombstones), load kept <= 1/2, so lookups stay O(1) whatever the history.
 *
 * Threading: none; one thread uses a map. */
#ifndef TANDEM_WK_MAP_H
#define TANDEM_WK_MAP_H

#include <stddef.h>
#include <stdint.h>

struct wk_map_slot {
    uint64_t key; /* 0: empty */
    void *val;
};

struct wk_map {
    struct wk_map_slot *slots; /* (mask + 1) */
    size_t mask;
    size_t n;
};

/* An empty map; nothing is allocated until the first put. */
void wk_map_init(struct wk_map *m);
/* Frees the table (not the values). */
void wk_map_fini(struct wk_map *m);

/* The value of key, or NULL when absent (key 0 is never present). */
void *wk_map_get(const struct wk_map *m, uint64_t key);

/* Inserts or replaces key -> val. Returns 0, TANDEM_EINVAL for key 0, or
 * TANDEM_ENOMEM (the map is unchanged). */
int wk_map_put(struct wk_map *m, uint64_t key, void *val);

/* Removes key; returns its value, or NULL when absent. */
void *wk_map_del(struct wk_map *m, uint64_t key);

/* Iteration: for (size_t i = 0; wk_map_next(m, &i, &k, &v);) ... Must not
 * modify the map while iterating. Returns 1 while there is an entry. */
int wk_map_next(const struct wk_map *m, size_t *iter, uint64_t *key, void **val);

#endif
