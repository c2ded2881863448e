/* The table of backends: one entry per backend, the first the default. */
#include "backend.h"

#include <string.h>

/* One line per backend, the first the default: X(name) stands for the
 * descriptor `const struct backend_desc name_backend` that engine/name.c
 * defines with .name "name" (test_backend checks they agree). The table
 * declares the descriptor itself, so a backend needs no header of its own. */
#define BACKEND_TABLE(X)                                                                           \
    X(tiny)                                                                                        \
    X(sim)

#define AS_EXTERN(name) extern const struct backend_desc name##_backend;
BACKEND_TABLE(AS_EXTERN)
#undef AS_EXTERN

#define AS_NAME(name) #name,
#define AS_DESC(name) &name##_backend,
const char *const backend_names[] = {BACKEND_TABLE(AS_NAME) NULL};
static const struct backend_desc *const backends[] = {BACKEND_TABLE(AS_DESC)};
#undef AS_NAME
#undef AS_DESC

#define N_BACKENDS (sizeof(backends) / sizeof(backends[0]))

size_t backend_kv_bytes_per_token(const struct model_info *mi, enum kv_dtype dt)
{
    return 2u * (size_t)mi->n_layers * (size_t)mi->n_kv_heads * (size_t)mi->head_dim *
           kv_dtype_size(dt);
}

size_t backend_count(void)
{
    return N_BACKENDS;
}

const struct backend_desc *backend_at(size_t i)
{
    return i < N_BACKENDS ? backends[i] : NULL;
}

const struct backend_desc *backend_default(void)
{
    return backends[0];
}

const struct backend_desc *backend_find(const char *name)
{
    for (size_t i = 0; name != NULL && i < N_BACKENDS; i++) {
        if (strcmp(backends[i]->name, name) == 0) {
            return backends[i];
        }
    }
    return NULL;
}

const struct backend_desc *backend_of(const struct backend *be)
{
    for (size_t i = 0; be != NULL && i < N_BACKENDS; i++) {
        if (backends[i]->ops == be->ops) {
            return backends[i];
        }
    }
    return NULL;
}

const struct backend_desc *backend_reading(unsigned flag)
{
    for (size_t i = 0; i < N_BACKENDS; i++) {
        if (backends[i]->reads & flag) {
            return backends[i];
        }
    }
    return NULL;
}
