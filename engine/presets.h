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

/* The MLP of a layer. */
enum preset_mlp {
    /* SwiGLU (llama, Qwen2): gate and up dim->ffn, down ffn->dim, no biases. */
    PRESET_MLP_GATED = 0,
    /* fc1 dim->ffn, activation, fc2 ffn->dim, each with a bias (OPT: ReLU). */
    PRESET_MLP_FC,
};

/* The normalisation before attention, before the MLP, and after the last layer. */
enum preset_norm {
    PRESET_NORM_RMS = 0, /* RMSNorm: a weight vector of dim */
    PRESET_NORM_LAYER,   /* LayerNorm: a weight and a bias vector of dim */
};

/* A decoder-only transformer: the llama family (RMSNorm, GQA, SwiGLU, RoPE)
 * or the OPT family (LayerNorm, multi-head attention, a two-matrix MLP,
 * learned absolute positions, biases everywhere, tied LM head; ids 0-3 and
 * the padding rows from 50265 are special). */
struct preset_model {
    const char *name; /* "llama-3-8b" */
    int n_layers;     /* num_hidden_layers */
    int dim;          /* hidden_size */
    int n_heads;      /* num_attention_heads */
    int n_kv_heads;   /* num_key_value_heads (OPT: n_heads) */
    int head_dim;     /* dim / n_heads for every preset here */
    int ffn_dim;      /* intermediate_size (OPT: ffn_dim) */
    int vocab_size;   /* vocab_size (rows of the embedding table) */
    int max_context;  /* max_position_embeddings, native (no RoPE scaling) */
    int qkv_bias;     /* 1: q, k and v projections carry a bias (Qwen2, OPT) */

    /* The OPT family's differences; 0 for the llama family. */
    int o_bias;            /* 1: the attention output projection carries a bias */
    enum preset_mlp mlp;   /* PRESET_MLP_GATED (0) or PRESET_MLP_FC */
    enum preset_norm norm; /* PRESET_NORM_RMS (0) or PRESET_NORM_LAYER */
    int learned_positions; /* rows of a learned absolute position table; 0: RoPE */

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

/* Parameter count derived from the architecture: token embeddings, learned
 * position table (if any), LM head (unless tied), per layer q/k/v/o
 * projections (+ biases), the MLP's matrices (+ biases) and two norms, plus
 * the final norm. Matches the published totals exactly (8,030,261,248 for
 * llama-3-8b; OPT: the Hugging Face checkpoints' tensor sizes). */
uint64_t preset_model_params(const struct preset_model *m);

/* Bytes of the weights stored in BF16: 2 x preset_model_params. */
uint64_t preset_model_weight_bytes(const struct preset_model *m);

#endif
