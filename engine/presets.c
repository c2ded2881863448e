/* Preset tables. Sources and reasoning: docs/engine.md, "## sim". */
#include "presets.h"

#include <stdio.h>
#include <string.h>

/* Architectures from each model's config.json on Hugging Face
 * (meta-llama/Meta-Llama-3-8B, Meta-Llama-3-70B, Llama-3.1-8B, Llama-3.1-70B,
 * Llama-3.1-405B; Qwen/Qwen2.5-7B, Qwen2.5-72B). The Llama 3.1 models share
 * the Llama 3 architecture and differ in native context (RoPE scaling).
 * OPT (facebook/opt-13b, opt-66b; opt-175b from Zhang et al. 2022, Table 1):
 * LayerNorm, multi-head attention, a ReLU fc1/fc2 MLP, biases on every
 * projection, a tied LM head, and learned positions: OPT's position table has
 * max_position_embeddings + 2 rows (OPTLearnedPositionalEmbedding's offset). */
#define OPT_POSITIONS (2048 + 2)

static const struct preset_model models[] = {
    {.name = "llama-3-8b",
     .n_layers = 32,
     .dim = 4096,
     .n_heads = 32,
     .n_kv_heads = 8,
     .head_dim = 128,
     .ffn_dim = 14336,
     .vocab_size = 128256,
     .max_context = 8192,
     .bos_id = 128000,
     .eos_id = 128001,
     .special_start = 128000},
    {.name = "llama-3-70b",
     .n_layers = 80,
     .dim = 8192,
     .n_heads = 64,
     .n_kv_heads = 8,
     .head_dim = 128,
     .ffn_dim = 28672,
     .vocab_size = 128256,
     .max_context = 8192,
     .bos_id = 128000,
     .eos_id = 128001,
     .special_start = 128000},
    {.name = "llama-3.1-8b",
     .n_layers = 32,
     .dim = 4096,
     .n_heads = 32,
     .n_kv_heads = 8,
     .head_dim = 128,
     .ffn_dim = 14336,
     .vocab_size = 128256,
     .max_context = 131072,
     .bos_id = 128000,
     .eos_id = 128001,
     .special_start = 128000},
    {.name = "llama-3.1-70b",
     .n_layers = 80,
     .dim = 8192,
     .n_heads = 64,
     .n_kv_heads = 8,
     .head_dim = 128,
     .ffn_dim = 28672,
     .vocab_size = 128256,
     .max_context = 131072,
     .bos_id = 128000,
     .eos_id = 128001,
     .special_start = 128000},
    {.name = "llama-3.1-405b",
     .n_layers = 126,
     .dim = 16384,
     .n_heads = 128,
     .n_kv_heads = 8,
     .head_dim = 128,
     .ffn_dim = 53248,
     .vocab_size = 128256,
     .max_context = 131072,
     .bos_id = 128000,
     .eos_id = 128001,
     .special_start = 128000},
    {.name = "qwen2.5-7b",
     .n_layers = 28,
     .dim = 3584,
     .n_heads = 28,
     .n_kv_heads = 4,
     .head_dim = 128,
     .ffn_dim = 18944,
     .vocab_size = 152064,
     .max_context = 32768,
     .qkv_bias = 1,
     .bos_id = -1,
     .eos_id = 151643,
     .special_start = 151643},
    {.name = "qwen2.5-72b",
     .n_layers = 80,
     .dim = 8192,
     .n_heads = 64,
     .n_kv_heads = 8,
     .head_dim = 128,
     .ffn_dim = 29568,
     .vocab_size = 152064,
     .max_context = 32768,
     .qkv_bias = 1,
     .bos_id = -1,
     .eos_id = 151643,
     .special_start = 151643},
    /* Llama 2 (meta-llama/Llama-2-{7b,13b,70b}-hf config.json): the models of
     * the published measurements the sim is calibrated against (docs/engine.md,
     * "### Calibration"). Ids 0-2 are <unk>, <s>, </s>. */
    {.name = "llama-2-7b",
     .n_layers = 32,
     .dim = 4096,
     .n_heads = 32,
     .n_kv_heads = 32,
     .head_dim = 128,
     .ffn_dim = 11008,
     .vocab_size = 32000,
     .max_context = 4096,
     .bos_id = 1,
     .eos_id = 2,
     .special_start = 32000,
     .special_below = 3},
    {.name = "llama-2-13b",
     .n_layers = 40,
     .dim = 5120,
     .n_heads = 40,
     .n_kv_heads = 40,
     .head_dim = 128,
     .ffn_dim = 13824,
     .vocab_size = 32000,
     .max_context = 4096,
     .bos_id = 1,
     .eos_id = 2,
     .special_start = 32000,
     .special_below = 3},
    {.name = "llama-2-70b",
     .n_layers = 80,
     .dim = 8192,
     .n_heads = 64,
     .n_kv_heads = 8,
     .head_dim = 128,
     .ffn_dim = 28672,
     .vocab_size = 32000,
     .max_context = 4096,
     .bos_id = 1,
     .eos_id = 2,
     .special_start = 32000,
     .special_below = 3},
    /* facebook/opt-13b */
    {.name = "opt-13b",
     .n_layers = 40,
     .dim = 5120,
     .n_heads = 40,
     .n_kv_heads = 40,
     .head_dim = 128,
     .ffn_dim = 20480,
     .vocab_size = 50272,
     .max_context = 2048,
     .qkv_bias = 1,
     .o_bias = 1,
     .mlp = PRESET_MLP_FC,
     .norm = PRESET_NORM_LAYER,
     .learned_positions = OPT_POSITIONS,
     .tied_embeddings = 1,
     .bos_id = 2,
     .eos_id = 2,
     .special_below = 4,
     .special_start = 50265},
    /* facebook/opt-66b */
    {.name = "opt-66b",
     .n_layers = 64,
     .dim = 9216,
     .n_heads = 72,
     .n_kv_heads = 72,
     .head_dim = 128,
     .ffn_dim = 36864,
     .vocab_size = 50272,
     .max_context = 2048,
     .qkv_bias = 1,
     .o_bias = 1,
     .mlp = PRESET_MLP_FC,
     .norm = PRESET_NORM_LAYER,
     .learned_positions = OPT_POSITIONS,
     .tied_embeddings = 1,
     .bos_id = 2,
     .eos_id = 2,
     .special_below = 4,
     .special_start = 50265},
    /* OPT paper, Table 1 (not on Hugging Face); FFN 4 x dim as in every OPT config */
    {.name = "opt-175b",
     .n_layers = 96,
     .dim = 12288,
     .n_heads = 96,
     .n_kv_heads = 96,
     .head_dim = 128,
     .ffn_dim = 49152,
     .vocab_size = 50272,
     .max_context = 2048,
     .qkv_bias = 1,
     .o_bias = 1,
     .mlp = PRESET_MLP_FC,
     .norm = PRESET_NORM_LAYER,
     .learned_positions = OPT_POSITIONS,
     .tied_embeddings = 1,
     .bos_id = 2,
     .eos_id = 2,
     .special_below = 4,
     .special_start = 50265},
};

/* NVIDIA datasheets quote BF16 "with sparsity"; dense is half of that.
 * NVLink figures are bidirectional in the datasheets; we keep one direction. */
static const struct preset_gpu gpus[] = {
    /* A100 80GB SXM: 312 TFLOPS BF16 dense, 2,039 GB/s HBM2e, NVLink 600 GB/s. */
    {.name = "a100-80g",
     .flops = 312e12,
     .hbm_bw = 2.039e12,
     .hbm_bytes = 80e9,
     .nvlink_bw = 300e9},
    /* H100 SXM5: 1,979 TFLOPS BF16 with sparsity, 3.35 TB/s HBM3, NVLink 900 GB/s. */
    {.name = "h100-sxm",
     .flops = 989.5e12,
     .hbm_bw = 3.35e12,
     .hbm_bytes = 80e9,
     .nvlink_bw = 450e9},
    /* H200 SXM: same compute as H100, 141 GB HBM3e at 4.8 TB/s. */
    {.name = "h200", .flops = 989.5e12, .hbm_bw = 4.8e12, .hbm_bytes = 141e9, .nvlink_bw = 450e9},
    /* B200 in HGX B200: 4.5 PFLOPS BF16 with sparsity, 8 TB/s, 1,440 GB per
     * 8 GPUs (180 GB usable each; the package carries 192 GB), NVLink 5 1.8 TB/s. */
    {.name = "b200", .flops = 2.25e15, .hbm_bw = 8e12, .hbm_bytes = 180e9, .nvlink_bw = 900e9},
};

/* Nominal line rates per direction; latencies are order-of-magnitude
 * assumptions for one RDMA/DMA transfer, not measurements. */
static const struct preset_link links[] = {
    {.name = "nvlink", .bw = 450e9, .latency_s = 2e-6},  /* NVLink 4 (H100/H200) */
    {.name = "nvlink5", .bw = 900e9, .latency_s = 2e-6}, /* NVLink 5 (B200) */
    {.name = "pcie5", .bw = 63e9, .latency_s = 2e-6},    /* PCIe 5.0 x16 */
    {.name = "ib-400g", .bw = 50e9, .latency_s = 5e-6},  /* InfiniBand NDR, 1 NIC/GPU */
    {.name = "ib-200g", .bw = 25e9, .latency_s = 5e-6},  /* InfiniBand HDR */
    {.name = "roce-100g", .bw = 12.5e9, .latency_s = 10e-6},
    {.name = "tcp-25g", .bw = 3.125e9, .latency_s = 50e-6}, /* kernel TCP over 25GbE */
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

const struct preset_model *preset_model_find(const char *name)
{
    for (size_t i = 0; name != NULL && i < COUNT(models); i++) {
        if (strcmp(models[i].name, name) == 0) {
            return &models[i];
        }
    }
    return NULL;
}

const struct preset_gpu *preset_gpu_find(const char *name)
{
    for (size_t i = 0; name != NULL && i < COUNT(gpus); i++) {
        if (strcmp(gpus[i].name, name) == 0) {
            return &gpus[i];
        }
    }
    return NULL;
}

const struct preset_link *preset_link_find(const char *name)
{
    for (size_t i = 0; name != NULL && i < COUNT(links); i++) {
        if (strcmp(links[i].name, name) == 0) {
            return &links[i];
        }
    }
    return NULL;
}

size_t preset_model_count(void)
{
    return COUNT(models);
}

const struct preset_model *preset_model_at(size_t i)
{
    return i < COUNT(models) ? &models[i] : NULL;
}

size_t preset_gpu_count(void)
{
    return COUNT(gpus);
}

const struct preset_gpu *preset_gpu_at(size_t i)
{
    return i < COUNT(gpus) ? &gpus[i] : NULL;
}

size_t preset_link_count(void)
{
    return COUNT(links);
}

const struct preset_link *preset_link_at(size_t i)
{
    return i < COUNT(links) ? &links[i] : NULL;
}

/* Joins names[i] for i < n with ", " into buf. The names are reached through
 * a stride so one helper serves the three tables. */
static void join_names(char *buf, size_t len, const void *first, size_t stride, size_t n)
{
    if (len == 0) {
        return;
    }
    buf[0] = '\0';
    size_t off = 0;
    for (size_t i = 0; i < n && off < len; i++) {
        const char *name = *(const char *const *)((const char *)first + i * stride);
        int w = snprintf(buf + off, len - off, "%s%s", i ? ", " : "", name);
        if (w < 0) {
            return;
        }
        off += (size_t)w;
    }
}

void preset_model_names(char *buf, size_t len)
{
    join_names(buf, len, &models[0].name, sizeof(models[0]), COUNT(models));
}

void preset_gpu_names(char *buf, size_t len)
{
    join_names(buf, len, &gpus[0].name, sizeof(gpus[0]), COUNT(gpus));
}

void preset_link_names(char *buf, size_t len)
{
    join_names(buf, len, &links[0].name, sizeof(links[0]), COUNT(links));
}

uint64_t preset_model_params(const struct preset_model *m)
{
    uint64_t d = (uint64_t)m->dim;
    uint64_t f = (uint64_t)m->ffn_dim;
    uint64_t q = (uint64_t)m->n_heads * (uint64_t)m->head_dim;
    uint64_t kv = (uint64_t)m->n_kv_heads * (uint64_t)m->head_dim;
    uint64_t attn = d * q + 2 * d * kv + q * d;
    if (m->qkv_bias) {
        attn += q + 2 * kv;
    }
    if (m->o_bias) {
        attn += d;
    }
    uint64_t mlp = m->mlp == PRESET_MLP_FC ? 2 * d * f + f + d : 3 * d * f;
    uint64_t norm = m->norm == PRESET_NORM_LAYER ? 2 * d : d;
    uint64_t layer = attn + mlp + 2 * norm;
    uint64_t embed = (uint64_t)m->vocab_size * d;
    uint64_t head = m->tied_embeddings ? 0 : embed;
    uint64_t pos = (uint64_t)m->learned_positions * d;
    return embed + pos + head + (uint64_t)m->n_layers * layer + norm; /* + final norm */
}

uint64_t preset_model_weight_bytes(const struct preset_model *m)
{
    return 2 * preset_model_params(m);
}
