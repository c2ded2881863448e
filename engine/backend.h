/* The compute interface shared by prefill and decode workers.
 *
 * A backend is a model that reads and writes K/V through block tables in a
 * struct kv_pool. Two implementations: `tiny` (a real llama-architecture
 * transformer on the CPU, engine/tiny.c) and `sim` (a roofline cost model of
 * a real model on a real GPU, engine/sim.c). Each fills a const struct
 * backend_ops with designated initialisers; adding a backend is one file and
 * one entry in backend.c.
 *
 * Threading: one backend is driven by one thread at a time (the engine
 * thread); calls never block on I/O (sim sleeps in step_end only). */
#ifndef TANDEM_BACKEND_H
#define TANDEM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kv_cache.h"

struct model_info {
    char name[64];  /* model identifier, also the root of block hashes */
    int dim;        /* hidden size */
    int hidden_dim; /* feed-forward size */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int vocab_size;
    int max_context;  /* positions 0..max_context-1 */
    int bos_id;       /* -1 when none */
    int eos_id;       /* -1 when none */
    int emits_tokens; /* 1: the backend picks tokens itself (sim); logits unused */
};

/* One sequence as the backend sees it. */
struct be_seq {
    const int32_t *blocks;   /* block table: position p lives in blocks[p / block_size] */
    int pos;                 /* position of the first token processed by this call */
    const uint32_t *history; /* every token of the sequence, positions 0..pos+n-1 */
    uint64_t seed;           /* per-request seed (sim tokens are a function of it) */
};

/* Result for one sequence of one call. */
struct be_out {
    float *logits;  /* caller's buffer of vocab_size floats; unused when emits_tokens */
    uint32_t token; /* when emits_tokens: the next token */
    float logprob;  /* when emits_tokens: its log-probability */
};

struct backend;

struct backend_ops {
    const char *name;
    /* Frees the backend and everything it owns. */
    void (*destroy)(struct backend *be);
    /* Computes tokens[0..n) of one sequence at positions seq->pos ..
     * seq->pos+n-1, writing their K and V into the sequence's blocks (which
     * the caller has grown to hold them). Fills out for the last position and,
     * when logits_all is not NULL, writes n x vocab_size logits (row i for
     * position pos+i) for prompt logprobs. Returns 0 or a TANDEM_E* code. */
    int (*prefill)(struct backend *be, struct kv_pool *kv, const struct be_seq *seq,
                   const uint32_t *tokens, int n, struct be_out *out, float *logits_all);
    /* One decode step for n_seqs sequences: seqs[i].history[seqs[i].pos] is
     * the token to feed at position seqs[i].pos. Writes its K/V and fills
     * out[i]. The result for a sequence does not depend on the others in
     * the batch (batch invariance, bit for bit). */
    int (*decode)(struct backend *be, struct kv_pool *kv, int n_seqs, const struct be_seq *seqs,
                  struct be_out *out);
    /* Optional (NULL for tiny): called once after every scheduler iteration
     * with the work it contained; sim sleeps for the modelled step time. */
    void (*step_end)(struct backend *be);
};

/* Every backend starts with this header (embed it first in the private
 * struct; get back with container_of). */
struct backend {
    const struct backend_ops *ops;
    struct model_info info;
};

/* KV bytes per token of a model at a given dtype:
 * 2 x layers x kv_heads x head_dim x dtype size. */
size_t backend_kv_bytes_per_token(const struct model_info *mi, enum kv_dtype dt);

#endif
