/* The tiny backend's llama2.c checkpoint loader (engine/tiny.h tiny_load) on
 * any file: the input is written to a memfd and loaded by its /proc path.
 * A model that loads then runs a 3-token prefill and one decode step through
 * a small KV pool, so every shape the loader admits is one the kernels
 * handle.
 *
 * Properties: no crash, leak or over-read; a loaded model reports the shape
 * its header gave; a refusal is one of the documented codes. */
#define _GNU_SOURCE
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"
#include "kv_cache.h"
#include "tandem_err.h"
#include "tiny.h"

static int g_fd = -1;
static char g_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_init_logs();
    g_fd = memfd_create("fuzz-checkpoint", MFD_CLOEXEC);
    FUZZ_CHECK(g_fd >= 0);
    snprintf(g_path, sizeof g_path, "/proc/self/fd/%d", g_fd);
    return 0;
}

static void run(struct backend *be)
{
    const struct model_info *mi = &be->info;
    struct kv_config kc = {.n_layers = mi->n_layers,
                           .n_kv_heads = mi->n_kv_heads,
                           .head_dim = mi->head_dim,
                           .block_size = 2,
                           .dtype = KV_DTYPE_F32,
                           .n_blocks = 2};
    struct kv_pool *kv = NULL;
    FUZZ_CHECK(kv_pool_create(&kv, &kc) == 0);
    int32_t blocks[2];
    FUZZ_CHECK(kv_block_alloc(kv, &blocks[0]) == 0 && kv_block_alloc(kv, &blocks[1]) == 0);
    uint32_t hist[4];
    for (int i = 0; i < 4; i++)
        hist[i] = (uint32_t)(i + 1) % (uint32_t)mi->vocab_size;
    float *logits = malloc((size_t)mi->vocab_size * sizeof(float));
    FUZZ_CHECK(logits != NULL);
    int n = mi->max_context < 3 ? mi->max_context : 3;
    struct be_seq seq = {.blocks = blocks, .pos = 0, .history = hist, .seed = 1};
    struct be_out out = {.logits = logits};
    FUZZ_CHECK(be->ops->prefill(be, kv, &seq, hist, n, &out, NULL) == 0);
    if (n < mi->max_context) {
        seq.pos = n;
        FUZZ_CHECK(be->ops->decode(be, kv, 1, &seq, &out) == 0);
    }
    free(logits);
    kv_block_unref(kv, blocks[1]);
    kv_block_unref(kv, blocks[0]);
    kv_pool_destroy(kv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FUZZ_CHECK(ftruncate(g_fd, 0) == 0);
    FUZZ_CHECK(pwrite(g_fd, data, size, 0) == (ssize_t)size);
    struct backend *be = NULL;
    int rc = tiny_load(&be, g_path);
    if (rc != 0) {
        FUZZ_CHECK(be == NULL);
        FUZZ_CHECK(rc == TANDEM_EFORMAT || rc == TANDEM_ETRUNCATED || rc == TANDEM_EIO ||
                   rc == TANDEM_ENOMEM);
        return 0;
    }
    FUZZ_CHECK(be != NULL);
    int32_t h[7];
    memcpy(h, data, sizeof h);
    struct tiny_config c;
    FUZZ_CHECK(tiny_get_config(be, &c) == 0);
    FUZZ_CHECK(c.dim == h[0] && c.hidden_dim == h[1] && c.n_layers == h[2] && c.n_heads == h[3] &&
               c.n_kv_heads == h[4] && c.max_context == h[6]);
    FUZZ_CHECK(c.vocab_size == (h[5] < 0 ? -h[5] : h[5]) && c.separate_classifier == (h[5] < 0));
    FUZZ_CHECK(be->info.vocab_size == c.vocab_size && be->info.head_dim * c.n_heads == c.dim);
    run(be);
    be->ops->destroy(be);
    return 0;
}
