/* `tandem plan`: KV-cache arithmetic for capacity planning.
 *
 *   KV bytes/token     = 2 x layers x kv_heads x head_dim x dtype bytes
 *   bytes/sequence     = context x KV bytes/token
 *   sequences that fit = floor(KV budget / bytes per sequence)
 *   bytes read/token   = weights / batch + context x KV bytes/token   (one decode step)
 *   with a GPU: step >= batch x bytes read/token / (HBM bw x tp); tokens/s <= batch / step
 *
 * Units: 1 KiB = 1024 B, 1 GB = 10^9 B. Everything here is pure except the
 * print functions (which write to the given stream) and plan_main.
 *
 * Ownership: nothing allocates for the caller. plan_input's model and gpu
 * point into presets.h's static tables; inputs and results are caller-owned
 * structs of fixed size (PLAN_MAX_ITEMS rows). Threads: no state, any thread.
 * Errors: TANDEM_EINVAL with a message in the caller's err buffer (errlen
 * bytes, truncated to fit). */
#ifndef TANDEM_PLAN_H
#define TANDEM_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "kv_dtype.h"
#include "presets.h"

#define PLAN_MAX_ITEMS   64
#define PLAN_MAX_CONTEXT 100000000LL /* 10^8 tokens: keeps byte counts inside uint64 */
#define PLAN_MAX_BATCH   1000000LL

struct plan_read {
    int64_t batch;
    int64_t context;
};

struct plan_input {
    const struct preset_model *model; /* NULL: custom shape from the three fields below */
    int n_layers;
    int n_kv_heads;
    int head_dim;
    enum kv_dtype kv_dtype;
    uint64_t weights_bytes;       /* 0: unknown */
    uint64_t kv_budget;           /* 0: none given */
    const struct preset_gpu *gpu; /* NULL: no time bounds */
    int tp;                       /* GPUs in the tensor-parallel group, >= 1 */
    double hbm_utilisation;       /* for the budget derived from the GPU */
    int json;
    int n_contexts;
    int64_t contexts[PLAN_MAX_ITEMS];
    int n_reads;
    struct plan_read reads[PLAN_MAX_ITEMS];
};

struct plan_context_row {
    int64_t tokens;
    uint64_t bytes_per_sequence;
    int64_t sequences_fit; /* -1 when there is no budget */
};

struct plan_read_row {
    int64_t batch;
    int64_t context;
    double bytes_per_token; /* weights / batch + context x KV bytes/token */
    double bytes_per_step;  /* batch x bytes_per_token */
    double step_seconds;    /* lower bound; -1 without a GPU */
    double tokens_per_s;    /* upper bound; -1 without a GPU */
};

enum plan_budget_source { PLAN_BUDGET_NONE = 0, PLAN_BUDGET_FLAG, PLAN_BUDGET_GPU };

struct plan_result {
    uint64_t kv_bytes_per_token;
    uint64_t kv_budget; /* 0 when none */
    enum plan_budget_source budget_source;
    int weights_fit; /* with a GPU: weights <= tp x HBM x utilisation; else -1 */
    int n_contexts;
    struct plan_context_row contexts[PLAN_MAX_ITEMS];
    int n_reads;
    struct plan_read_row reads[PLAN_MAX_ITEMS];
};

/* Fills in with the defaults: no model, bf16 KV, tp 1, HBM utilisation 0.9. */
void plan_input_init(struct plan_input *in);

/* Parses `plan` flags from argv[first..argc) into in (initialised by the
 * caller). Returns FLAGS_OK, FLAGS_HELP, FLAGS_VERSION (flags.h), or
 * TANDEM_EINVAL with a message naming the flag in err. */
int plan_parse_args(struct plan_input *in, int argc, char **argv, int first, char *err,
                    size_t errlen);

/* Parses "8192,131072" (an item may end in k or K: x 1024) into out[0..*n).
 * Items must be in [1, PLAN_MAX_CONTEXT]. 0 or TANDEM_EINVAL. */
int plan_parse_contexts(const char *s, int64_t *out, int max, int *n);
/* Parses "1:8192,64:8k" (batch:context). Batch in [1, PLAN_MAX_BATCH]. */
int plan_parse_reads(const char *s, struct plan_read *out, int max, int *n);

/* 2 x layers x kv_heads x head_dim x dtype size. */
uint64_t plan_kv_bytes_per_token(int n_layers, int n_kv_heads, int head_dim, enum kv_dtype dt);

/* Computes every row. TANDEM_EINVAL with a message in err when the input is
 * incomplete (no shape, --reads without weights). */
int plan_compute(const struct plan_input *in, struct plan_result *out, char *err, size_t errlen);

void plan_print_text(FILE *f, const struct plan_input *in, const struct plan_result *r);
/* Prints one JSON object (keys kv_bytes_per_token, contexts[{tokens,
 * bytes_per_sequence, sequences_fit}], reads[{batch, context, bytes_per_token}]
 * and more). Returns 0 or TANDEM_ENOMEM / TANDEM_EIO. */
int plan_print_json(FILE *f, const struct plan_input *in, const struct plan_result *r);

/* The `tandem plan` command; argv[0] is "plan". Returns the process exit
 * code: 0, or 2 for bad usage (message on stderr). */
int plan_main(int argc, char **argv);

#endif
