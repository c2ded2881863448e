/* Named models, GPUs and links for the `sim` backend and `tandem plan`.
 *
 * Numbers come from published sources (the models' config.json on Hugging
 * Face, NVIDIA datasheets); docs/engine.md ("## sim") lists every source and
 * the reasoning behind each choice. All tables are static and read-only, so
 * every function here is pure and thread-safe. */
#ifndef TANDEM_PRESETS_H
#define TANDEM_PRESETS_H

#include <stddef.h>
#include <stdint.h>

/* A decoder-only transformer of the llama family (RMSNorm, GQA, SwiGLU). */
struct preset_model {
    const char *name;    /* "llama-3-8b" */
    int n_layers;        /* num_hidden_layers */
    int dim;             /* hidden_size */
    int n_heads;         /* num_attention_heads */
    int n_kv_heads;      /* num_key_value_heads */
    int head_dim;        /* dim / n_heads for every preset here */
    int ffn_dim;         /* intermediate_size */
    int vocab_size;      /* vocab_size (rows of the embedding table) */
    int max_context;     /* max_position_embeddings, native (no RoPE scaling) */
    int qkv_bias;        /* 1: q, k and v projections carry a bias (Qwen2) */
    int tied_embeddings; /* 1: the LM head shares the embedding table */
    int bos_id;          /* -1 when none */
    int eos_id;          /* -1 when none */
    int special_start;   /* ids >= this are special tokens; sim emits ids below it */
    int special_below;   /* ids < this are special too (Llama 2: 0-2); sim emits none; 0: none */
};

/* One GPU. Rates are per GPU; FLOP/s are dense (no 2:4 sparsity) BF16 tensor-core. */
struct preset_gpu {
    const char *name; /* "h100-sxm" */
    double flops;     /* dense BF16 FLOP/s */
    double hbm_bw;    /* HBM bytes/s */
    double hbm_bytes; /* HBM capacity in bytes (datasheet GB = 10^9 B) */
    double nvlink_bw; /* NVLink bytes/s per direction (half the datasheet's bidirectional) */
};

/* A link used to move KV between a prefill and a decode worker. */
struct preset_link {
    const char *name; /* "ib-400g" */
    double bw;        /* bytes/s per direction, per GPU (nominal line rate) */
    double latency_s; /* one-way latency of a transfer */
};

/* Lookups by exact name; NULL when unknown. */
const struct preset_model *preset_model_find(const char *name);
const struct preset_gpu *preset_gpu_find(const char *name);
const struct preset_link *preset_link_find(const char *name);

/* Iteration: index i in [0, count); NULL past the end. */
size_t preset_model_count(void);
const struct preset_model *preset_model_at(size_t i);
size_t preset_gpu_count(void);
const struct preset_gpu *preset_gpu_at(size_t i);
size_t preset_link_count(void);
const struct preset_link *preset_link_at(size_t i);

/* Writes the valid names of a table, comma separated ("llama-3-8b, llama-3-70b, ..."),
 * into buf (always NUL-terminated, truncated to len). For error messages. */
void preset_model_names(char *buf, size_t len);
void preset_gpu_names(char *buf, size_t len);
void preset_link_names(char *buf, size_t len);

/* Parameter count derived from the architecture: embeddings, LM head (unless
 * tied), per layer q/k/v/o projections (+ biases), gate/up/down projections
 * and two RMSNorm weights, plus the final norm. Matches the published totals
 * exactly (8,030,261,248 for llama-3-8b). */
uint64_t preset_model_params(const struct preset_model *m);

/* Bytes of the weights stored in BF16: 2 x preset_model_params. */
uint64_t preset_model_weight_bytes(const struct preset_model *m);

#endif
