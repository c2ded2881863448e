/* The `tiny` backend: a llama-architecture transformer (llama2.c's model) in
 * fp32 on the CPU, reading and writing K/V through block tables.
 *
 * Model: token embedding; per layer RMSNorm (eps 1e-5) -> q, k, v
 * projections -> rotary embedding on adjacent pairs (theta 10000, as in
 * llama2.c run.c) -> grouped-query attention (query head h reads KV head
 * h / (n_heads / n_kv_heads)) -> output projection, residual; RMSNorm ->
 * SwiGLU feed-forward w2(silu(w1 x) * w3 x), residual; final RMSNorm;
 * classifier (the token embedding unless the checkpoint has its own).
 * Every reduction goes through engine/kernels.h, so a sequence's logits are
 * bitwise the same alone or at any place in any batch, whatever the prefill
 * chunking, and on every SIMD path.
 *
 * Threading: a tiny backend is driven by one thread at a time (it owns
 * scratch buffers); separate backends may run in parallel. */
#ifndef TANDEM_TINY_H
#define TANDEM_TINY_H

#include <stdint.h>

#include "backend.h"

struct tiny_config {
    int dim;        /* model width = n_heads x head_dim */
    int hidden_dim; /* feed-forward width */
    int n_layers;
    int n_heads;
    int n_kv_heads; /* divides n_heads */
    int vocab_size;
    int max_context;         /* positions 0..max_context-1 (llama2.c seq_len) */
    uint64_t seed;           /* seeds the weight generator of tiny_create */
    int separate_classifier; /* 0: classifier = token embedding (llama2.c default) */
};

/* The table entry (backend.h): tiny reads BACKEND_READS_FILES (a checkpoint
 * via tiny_load, a tokenizer the worker loads); defaults model "tiny" (the
 * preset below), f32 KV with the full payload (required: it computes with
 * the bytes), 128 tokens per step; KV capacity 2048 blocks; no link model. */
#define TINY_BACKEND_NAME "tiny" /* --backend tiny */
extern const struct backend_desc tiny_backend;

/* The embedded preset "tiny": dim 512, hidden 1376, 8 layers, 8 heads, 2 KV
 * heads (head_dim 64), vocab 512 (byte tokenizer: 0..2 <unk> <s> </s>, byte b
 * is b + 3), max context 4096, seed 0x7a6e646d, shared classifier. */
void tiny_default_config(struct tiny_config *c);

/* Builds a model with weights from a seeded generator (splitmix64, one
 * stream in llama2.c's tensor order: uniform in [-1, 1) scaled by
 * 1/sqrt(fan_in) for the matrices, by 0.1 for the token embedding, which
 * keeps the logits O(1); norm weights 1 + U[-1, 1)/8), the same
 * bits on every machine. Model name "tiny" for the preset, otherwise
 * "tiny-<shape>-<seed>"; bos 1, eos 2 (when the vocabulary has them).
 * Returns 0, TANDEM_EINVAL for an impossible shape (dim not a multiple of
 * n_heads, odd head_dim, n_heads not a multiple of n_kv_heads, a count < 1 or
 * too large), or TANDEM_ENOMEM. On success *out is the caller's: free with
 * out->ops->destroy. */
int tiny_create(struct backend **out, const struct tiny_config *c);

/* Loads a llama2.c legacy checkpoint: seven int32 (dim, hidden_dim,
 * n_layers, n_heads, n_kv_heads, vocab_size, seq_len; vocab_size < 0 means a
 * separate classifier), then fp32 tensors token_embedding, rms_att, wq, wk,
 * wv, wo, rms_ffn, w1, w2, w3, rms_final, the RoPE tables (skipped), and wcls
 * when separate. The model is named after the file's basename without its
 * extension; bos 1, eos 2. Returns 0; TANDEM_ENOENT / TANDEM_EIO when the
 * file cannot be opened or read; TANDEM_EFORMAT for a bad header or a file
 * longer than its header says; TANDEM_ETRUNCATED for a short file;
 * TANDEM_ENOMEM. Every error is logged naming what is wrong. */
int tiny_load(struct backend **out, const char *checkpoint_path);

/* Writes be (a tiny backend) as a llama2.c legacy checkpoint, RoPE tables
 * included. Returns 0, TANDEM_EINVAL (not a tiny backend), TANDEM_EIO. */
int tiny_save(const struct backend *be, const char *path);

/* The configuration be was built or loaded with (seed 0 for loaded files).
 * Returns 0 or TANDEM_EINVAL when be is not a tiny backend. */
int tiny_get_config(const struct backend *be, struct tiny_config *out);

/* Model FLOPs of one token at position pos (0-based): 2 x parameters of the
 * matrices it multiplies (the classifier included) plus 4 x (pos + 1) x dim
 * per layer for attention. */
double tiny_flops_per_token(const struct model_info *mi, int pos);

#endif
