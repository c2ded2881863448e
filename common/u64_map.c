#include "u64_map.h"

#include <stdlib.h>

#include "tandem_err.h"

/* Keys are request ids (often sequential) and block hashes (random): mix
 * them so sequential ids spread over the table. */
static size_t slot_of(const struct u64_map *m, uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & m->mask;
}

void u64_map_init(struct u64_map *m)
{
    m->slots = NULL;
    m->mask = 0;
    m->n = 0;
}

void u64_map_fini(struct u64_map *m)
{
    free(m->slots);
    u64_map_init(m);
}

void *u64_map_get(const struct u64_map *m, uint64_t key)
{
    if (m->slots == NULL || key == 0) {
        return NULL;
    }
    for (size_t i = slot_of(m, key);; i = (i + 1) & m->mask) {
        if (m->slots[i].key == key) {
            return m->slots[i].val;
        }
        if (m->slots[i].key == 0) {
            return NULL;
        }
    }
}

void u64_map_prefetch(const struct u64_map *m, uint64_t key)
{
    if (m->slots != NULL) {
        __builtin_prefetch(&m->slots[slot_of(m, key)]);
    }
}

static int rehash(struct u64_map *m, size_t cap)
{
    struct u64_map_slot *slots = calloc(cap, sizeof(*slots));
    if (slots == NULL) {
        return TANDEM_ENOMEM;
    }
    struct u64_map old = *m;
    m->slots = slots;
    m->mask = cap - 1;
    for (size_t i = 0; old.slots != NULL && i <= old.mask; i++) {
        if (old.slots[i].key != 0) {
            size_t j = slot_of(m, old.slots[i].key);
            while (m->slots[j].key != 0) {
                j = (j + 1) & m->mask;
            }
            m->slots[j] = old.slots[i];
        }
    }
    free(old.slots);
    return 0;
}

int u64_map_put(struct u64_map *m, uint64_t key, void *val)
{
    if (key == 0) {
        return TANDEM_EINVAL;
    }
    if (m->slots == NULL || 2 * (m->n + 1) > m->mask + 1) {
        size_t cap = m->slots ? 2 * (m->mask + 1) : 16;
        int rc = rehash(m, cap);
        if (rc != 0) {
            return rc;
        }
    }
    size_t i = slot_of(m, key);
    while (m->slots[i].key != 0 && m->slots[i].key != key) {
        i = (i + 1) & m->mask;
    }
    if (m->slots[i].key == 0) {
        m->n++;
    }
    m->slots[i].key = key;
    m->slots[i].val = val;
    return 0;
}

void *u64_map_del(struct u64_map *m, uint64_t key)
{
    if (m->slots == NULL || key == 0) {
        return NULL;
    }
    size_t i = slot_of(m, key);
    while (m->slots[i].key != key) {
        if (m->slots[i].key == 0) {
            return NULL;
        }
        i = (i + 1) & m->mask;
    }
    void *val = m->slots[i].val;
    /* Backward shift: move later members of the probe run into the hole
     * when their home slot is not inside (hole, j]. */
    size_t hole = i;
    for (size_t j = (i + 1) & m->mask; m->slots[j].key != 0; j = (j + 1) & m->mask) {
        size_t home = slot_of(m, m->slots[j].key);
        int between = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!between) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].key = 0;
    m->slots[hole].val = NULL;
    m->n--;
    return val;
}

int u64_map_next(const struct u64_map *m, size_t *iter, uint64_t *key, void **val)
{
    if (m->slots == NULL) {
        return 0;
    }
    for (size_t i = *iter; i <= m->mask; i++) {
        if (m->slots[i].key != 0) {
            *key = m->slots[i].key;
            *val = m->slots[i].val;
            *iter = i + 1;
            return 1;
        }
    }
    *iter = m->mask + 1;
    return 0;
}
