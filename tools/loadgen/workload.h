/* Workloads (--dataset-name): what each request asks for.
 *
 * A workload turns a request index into a prompt and an output length. The
 * contents of request i are derived from (seed, i) alone (rng.h), so they are
 * the same whatever the dispatch order, the concurrency or the warm-ups, and
 * requests can be made lazily (a --duration run has no known count). Warm-up
 * requests use a different seed, so they never warm the prefix cache for the
 * measured requests.
 *
 * Lengths are in tokens. Text prompts are ASCII words with exactly
 * prompt_len bytes: one token per byte on Tandem's byte-level tokenizer, and
 * roughly one token per word (~5 bytes) on BPE tokenizers, whose servers
 * report the real count in usage.prompt_tokens (which the summary uses).
 * With token_ids set, completions prompts are arrays of token ids drawn from
 * [id_lo, id_hi), exact on any server.
 *
 * Datasets are a table of struct lg_dataset_ops (one file each, dataset_*.c).
 * Adding one is its file, a value of enum lg_dataset and its extern below,
 * and its entry in datasets[] in workload.c; `tandem bench` lists the names
 * from that table (lg_dataset_names).
 *
 * Single-threaded: the run's loop thread. */
#ifndef TANDEM_LG_WORKLOAD_H
#define TANDEM_LG_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "rng.h"

enum lg_api { LG_API_COMPLETIONS = 0, LG_API_CHAT };

enum lg_dataset {
    LG_DATASET_RANDOM = 0,
    LG_DATASET_SHARED_PREFIX,
    LG_DATASET_MULTI_TURN,
    LG_DATASET_LONG_SHORT,
    LG_DATASET_SHAREGPT_SYNTH,
    LG_DATASET_TRACE,
    LG_DATASET_COUNT
};

enum lg_history { LG_HISTORY_RESPONSE = 0, LG_HISTORY_SYNTHETIC };

struct lg_workload_config {
    enum lg_dataset dataset;
    enum lg_api api;
    uint64_t seed;
    int token_ids;        /* completions: send prompt as an array of ids */
    int32_t id_lo, id_hi; /* token ids drawn from [id_lo, id_hi) */
    /* random (as vLLM): lengths uniform in [floor(L(1-r)), ceil(L(1+r))],
     * output at least 1; a prefix shared by every request is prepended. */
    int random_input_len, random_output_len, random_prefix_len;
    double random_range_ratio; /* [0, 1) */
    /* shared-prefix (SGLang's generated-shared-prefix): groups x prompts per
     * group, each prompt = its group's system prompt + its own question. */
    int gsp_num_groups, gsp_prompts_per_group, gsp_system_prompt_len, gsp_question_len,
        gsp_output_len;
    /* long-short: each request is long with probability long_fraction. */
    double long_fraction;
    int long_input_len, short_input_len, long_output_len, short_output_len;
    /* sharegpt-synth: lognormal lengths (see dataset_sharegpt.c). Each
     * length has a target mean and median (0: the built-in spread); draws
     * outside [4, max_input] or with input + output > max_total are drawn
     * again. */
    int sharegpt_output_len; /* > 0: fixed output length */
    double sharegpt_input_mean, sharegpt_input_median;
    double sharegpt_output_mean, sharegpt_output_median;
    int sharegpt_max_input, sharegpt_max_total;
    /* multi-turn chat sessions. */
    int mt_turns, mt_system_len, mt_input_len, mt_output_len;
    enum lg_history mt_history;
    /* trace replay (JSONL). */
    const char *trace_path;
    double trace_time_scale; /* arrival times are multiplied by this */
    int trace_block_size;    /* tokens per hash_ids entry */
};

/* Fills cfg with the defaults (those of `vllm bench serve` and SGLang's
 * bench_serving where they exist). */
void lg_workload_config_default(struct lg_workload_config *cfg);

struct lg_message {
    const char *role; /* static: "system", "user", "assistant" */
    char *content;    /* owned */
    size_t len;
};

/* One request's input. Owned by the caller of lg_workload_make; release
 * with lg_prompt_free. Exactly one of text, ids or msgs is set. */
struct lg_prompt {
    int64_t index;
    int32_t session; /* multi-turn session, else -1 */
    int32_t turn;
    char *text; /* completions, text prompt */
    size_t text_len;
    int32_t *ids; /* completions with token_ids */
    size_t n_ids;
    struct lg_message *msgs; /* chat */
    int n_msgs;
    int32_t prompt_len; /* target prompt tokens (all messages together for chat) */
    int32_t output_len; /* max_tokens */
    double arrival_s;   /* trace: its arrival time (scaled); negative: none */
};

void lg_prompt_free(struct lg_prompt *p);

struct lg_workload;

struct lg_dataset_ops {
    const char *name;
    /* Validates the config and builds shared state (prefixes, the trace).
     * Returns 0 or a TANDEM_E* code with a message naming the flag in err. */
    int (*init)(struct lg_workload *w, char *err, size_t errlen);
    /* Makes request index (0 <= index < count when count >= 0). warmup
     * selects the warm-up seed. For multi-turn, turn t of a session may only
     * be made after turn t-1 was reported with turn_done. 0 or TANDEM_E*. */
    int (*make)(struct lg_workload *w, int64_t index, int warmup, struct lg_prompt *out);
    /* Multi-turn only: the response to a measured turn (text may be NULL
     * when it failed; a synthetic reply of the output length is used). */
    void (*turn_done)(struct lg_workload *w, const struct lg_prompt *p, const char *text,
                      size_t len);
    /* Optional: request index's own arrival time in seconds (traces), or a
     * negative value when it has none. Non-decreasing in index. */
    double (*arrival)(const struct lg_workload *w, int64_t index);
    void (*fini)(struct lg_workload *w);
};

struct lg_workload {
    const struct lg_dataset_ops *ops;
    struct lg_workload_config cfg;
    int64_t count; /* requests the dataset holds (trace lines), -1 if unbounded */
    int turns;     /* > 1: requests come in sessions of this many turns */
    void *state;   /* dataset-private */
};

/* The dataset names in enum order ("random", "shared-prefix", ...), and the
 * lookup (also accepts "generated-shared-prefix" and "sharegpt"). */
const char *lg_dataset_name(enum lg_dataset d);
int lg_dataset_parse(const char *name, enum lg_dataset *out);
/* All the names in enum order, joined by ", ", into out (cap bytes, always
 * terminated, truncated if short). Returns out. */
char *lg_dataset_names(char *out, size_t cap);

/* Initialises w for cfg (copied; trace_path must outlive w). Returns 0 or a
 * TANDEM_E* code with a message in err. */
int lg_workload_init(struct lg_workload *w, const struct lg_workload_config *cfg, char *err,
                     size_t errlen);
void lg_workload_fini(struct lg_workload *w);

/* lg_workload_make: see lg_dataset_ops.make. On error *out is left empty. */
int lg_workload_make(struct lg_workload *w, int64_t index, int warmup, struct lg_prompt *out);
void lg_workload_turn_done(struct lg_workload *w, const struct lg_prompt *p, const char *text,
                           size_t len);
/* The request's own arrival time (traces with timestamps), else -1. */
double lg_workload_arrival(const struct lg_workload *w, int64_t index);

/* ---- Helpers shared by the datasets. ---- */

/* The seed used for warm-ups. */
uint64_t lg_workload_seed(const struct lg_workload *w, int warmup);

/* Writes exactly n bytes of ASCII words separated by single spaces (no NUL). */
void lg_text_fill(struct lg_rng *r, char *dst, size_t n);
/* Fills ids[0..n) uniformly from [lo, hi). */
void lg_ids_fill(struct lg_rng *r, int32_t *ids, size_t n, int32_t lo, int32_t hi);

/* Sets out to a single-part prompt of prefix + body, in the form the config
 * asks for: text, ids, or for chat a system message (when the prefix is not
 * empty) and a user message. prefix/prefix_ids may be NULL when
 * prefix_len is 0; the body is generated from r. 0 or TANDEM_ENOMEM. */
int lg_prompt_build(const struct lg_workload_config *cfg, const char *prefix,
                    const int32_t *prefix_ids, size_t prefix_len, struct lg_rng *r, size_t body_len,
                    struct lg_prompt *out);

extern const struct lg_dataset_ops lg_dataset_random;
extern const struct lg_dataset_ops lg_dataset_shared_prefix;
extern const struct lg_dataset_ops lg_dataset_multi_turn;
extern const struct lg_dataset_ops lg_dataset_long_short;
extern const struct lg_dataset_ops lg_dataset_sharegpt;
extern const struct lg_dataset_ops lg_dataset_trace;

#endif
