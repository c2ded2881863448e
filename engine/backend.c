#include "backend.h"

size_t backend_kv_bytes_per_token(const struct model_info *mi, enum kv_dtype dt)
{
    return 2u * (size_t)mi->n_layers * (size_t)mi->n_kv_heads * (size_t)mi->head_dim *
           kv_dtype_size(dt);
}
