/* The compute interface shared by prefill and decode workers, and the table
 * of backends.
 *
 * A backend is a model that reads and writes K/V through block tables in a
 * struct kv_pool. Two implementations: `tiny` (a real llama-architecture
 * transformer on the CPU, engine/tiny.c) and `sim` (a roofline cost model of
 * a real model on a real GPU, engine/sim.c). Each fills a const struct
 * backend_ops (what an instance does) and a const struct backend_desc (how
 * one is built, its defaults, its KV capacity, its optional KV-link model)
 * with designated initialisers. Adding a backend is one file, engine/<name>.c
 * defining `const struct backend_desc <name>_backend` with .name "<name>",
 * and one line X(<name>) in BACKEND_TABLE (backend.c), which declares the
 * descriptor; a header is needed only for an API of its own (as tiny.h,
 * sim.h). Code outside engine/ never names a backend: it looks one up
 * (backend_find, backend_at) and reads its descriptor.
 *
 * Threading: one backend is driven by one thread at a time (the engine
 * thread); calls never block on I/O (sim sleeps in step_end only). The
 * table and its lookups are read-only and may be called from any thread. */
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

/* What a backend may remember about one sequence between calls, kept by
 * the caller (the scheduler, one per sequence, zeroed when the sequence
 * starts; its history only grows). sim keeps its context hash here so that
 * a decode step costs O(1), not O(context). A backend must give the same
 * results with a zeroed or absent cache. */
struct be_ctx {
    uint64_t hash; /* backend-defined, over history[0..n) */
    int n;         /* 0: nothing cached */
};

/* One sequence as the backend sees it. */
struct be_seq {
    const int32_t *blocks;   /* block table: position p lives in blocks[p / block_size] */
    int pos;                 /* position of the first token processed by this call */
    const uint32_t *history; /* every token of the sequence, positions 0..pos+n-1 */
    uint64_t seed;           /* per-request seed (sim tokens are a function of it) */
    struct be_ctx *ctx;      /* the sequence's cache, or NULL */
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
     * with the work it contained; sim sleeps for the modelled step time
     * (unless its time_scale is 0: see backend_desc.step_seconds). */
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

/* ---- the table of backends ---------------------------------------------- */

/* What a worker builds a backend from: its settings, backend-neutral. The
 * strings are borrowed for the duration of create. Each backend reads only
 * the fields its .reads flags name and ignores the others (as the worker
 * always has), except that one without BACKEND_READS_FILES refuses a
 * checkpoint or tokenizer. */
struct backend_params {
    const char *model;      /* NULL: the descriptor's default_model */
    const char *checkpoint; /* BACKEND_READS_FILES: a model file (names its model); or NULL */
    const char *tokenizer;  /* BACKEND_READS_FILES: loaded by the worker, not here; or NULL */
    const char *gpu;        /* BACKEND_READS_HARDWARE: GPU preset name (presets.h) */
    int tp;                 /* BACKEND_READS_HARDWARE: tensor-parallel degree */
    const char *link;       /* BACKEND_READS_HARDWARE: KV-link preset name */
    double time_scale;      /* BACKEND_READS_HARDWARE: wall seconds per modelled second */
    /* BACKEND_READS_HARDWARE: efficiency of the cost model, as text: a number,
     * or NULL / "auto" for the calibrated value of the (model, GPU) pair, else
     * the global default (engine/calibration.h). */
    const char *mfu;              /* (0, 1] */
    const char *mbu;              /* (0, 1] */
    const char *step_overhead_ms; /* [0, 1e6] */
};

/* Groups of settings a backend reads (struct backend_desc .reads). */
#define BACKEND_READS_FILES    0x1u /* checkpoint, tokenizer: a model from files */
#define BACKEND_READS_HARDWARE 0x2u /* gpu, tp, link, time_scale: a modelled GPU */
#define BACKEND_READS_PAYLOAD                                                                      \
    0x4u /* payload 1/N or none: it stores a fraction of the KV bytes;                             \
            one without it computes with them and refuses both */

struct backend_desc {
    const char *name;               /* "tiny": the --backend / cluster `backend` value */
    const struct backend_ops *ops;  /* the ops of every backend create makes */
    unsigned reads;                 /* BACKEND_READS_* */
    const char *default_model;      /* model when none is given ("tiny", "llama-3-8b") */
    enum kv_dtype default_kv_dtype; /* KV storage type for --kv-dtype auto */
    int default_payload_div;        /* --payload auto: 1 (full bytes) or -1 (none) */
    int default_token_budget;       /* --token-budget 0: tokens per scheduler step */
    /* Nonzero when model names a model create builds without a file. Pure. */
    int (*model_known)(const char *model);
    /* The names model_known accepts, comma separated, into buf (always
     * NUL-terminated, truncated to len). For error messages. Pure. */
    void (*model_names)(char *buf, size_t len);
    /* Builds a backend from p into *out (the caller's: free with
     * (*out)->ops->destroy). Returns 0, or TANDEM_EINVAL / TANDEM_ECONFIG for
     * a bad setting or the backend's error, with a message in err naming the
     * worker flag (--model, --checkpoint, ...); *out is untouched on error. */
    int (*create)(struct backend **out, const struct backend_params *p, char *err, size_t errlen);
    /* KV blocks of block_size tokens at dt the backend holds when the worker
     * is given neither --kv-blocks nor --kv-memory (be is one create made).
     * Returns 0, or an error with a message in err. */
    int (*kv_capacity)(const struct backend *be, enum kv_dtype dt, int block_size, int32_t *out,
                       char *err, size_t errlen);
    /* Optional KV-link model (NULL: KV frames leave as soon as they are
     * made). Modelled seconds to move bytes (KV bytes of the modelled GPU) to
     * a peer: latency + bytes / bandwidth; transfer_seconds(be, 0) is the
     * latency. Pure. */
    double (*transfer_seconds)(const struct backend *be, uint64_t bytes);
    /* Optional (NULL: 0): wall seconds per modelled second; 0: the backend
     * never sleeps and the link is not paced. */
    double (*time_scale)(const struct backend *be);
    /* Optional (NULL: the backend's steps take the time they take): the
     * modelled seconds (before time_scale) of the last step_end. A host with
     * a loop of its own times steps with it: it creates the backend with
     * time_scale 0 (step_end never sleeps) and ends each step step_seconds x
     * its time scale after the step began (worker/worker.c). */
    double (*step_seconds)(const struct backend *be);
};

/* The backends, in table order; the first is the default. Index i in
 * [0, backend_count()); NULL past the end. The worker's --backend flag stores
 * this index. */
size_t backend_count(void);
const struct backend_desc *backend_at(size_t i);
const struct backend_desc *backend_default(void);

/* The backend called name (exact match); NULL when unknown or name is NULL. */
const struct backend_desc *backend_find(const char *name);

/* The descriptor be was made by (by its ops); NULL for a backend not in the
 * table (a test's fake). */
const struct backend_desc *backend_of(const struct backend *be);

/* The names in table order, NULL-terminated ({"tiny", "sim", NULL}): the
 * choices of a flag or a cluster key (a constant, so static tables may point
 * at it). backend_names[i] is backend_at(i)->name. */
extern const char *const backend_names[];

/* The first backend that reads the settings in flag (a BACKEND_READS_* bit),
 * for "only for the X backend" messages; NULL when none does. */
const struct backend_desc *backend_reading(unsigned flag);

#endif
