/* `sim`: a roofline cost model of a named model on a named GPU.
 *
 * It does no math on activations. Each prefill()/decode() call adds its work
 * (FLOPs, bytes read) to the current step; step_end() turns the step into a
 * modelled time
 *
 *   t = max(FLOPs / (peak x tp x mfu), bytes / (hbm_bw x tp x mbu))
 *       + all-reduce time (tp > 1) + step_overhead_s
 *
 *   FLOPs = 2 x params x tokens + 4 x layers x heads x head_dim x sum(attended keys)
 *   bytes = weight bytes (once per step) + KV bytes/token x sum(pos + n) over calls
 *
 * and sleeps (clock_nanosleep, never spins) until the step's first call +
 * t x time_scale. A live worker builds it with time_scale 0 and ends the
 * step on its loop instead (sim_backend.step_seconds, worker/worker.h). docs/engine.md ("## sim") derives every term and justifies
 * the defaults.
 *
 * Tokens are deterministic: the token after a context is a function of the
 * request seed and every token of the context (a hash chained token by
 * token, extended in O(1) per decode step from the sequence's struct
 * be_ctx), never a special token
 * (so never EOS). KV payloads are deterministic too (sim_block_payload): a
 * full block's bytes are a function of its chained block hash alone, so a
 * decode worker can verify a transferred block from the hash in its frame.
 *
 * Threading: as for every backend, one thread drives it at a time. */
#ifndef TANDEM_SIM_H
#define TANDEM_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "kv_dtype.h"
#include "presets.h"

/* mfu, mbu or step_overhead_s left to the calibration table (calibration.h):
 * sim_create takes the (model, GPU) pair's fitted value, else the global
 * default (SIM_DEFAULT_MFU, SIM_DEFAULT_MBU, SIM_DEFAULT_OVERHEAD_S). Any
 * negative value means the same. */
#define SIM_AUTO               (-1.0)
#define SIM_DEFAULT_MFU        0.5
#define SIM_DEFAULT_MBU        0.7
#define SIM_DEFAULT_OVERHEAD_S 1e-3

struct sim_config {
    const char *model;          /* model preset name (presets.h); copied by sim_create */
    const char *gpu;            /* GPU preset name */
    const char *link;           /* KV-transfer link preset name */
    int tp;                     /* tensor-parallel degree, 1 .. model KV heads */
    double mfu;                 /* achieved / peak FLOP/s, (0, 1]; or SIM_AUTO */
    double mbu;                 /* achieved / peak HBM bandwidth, (0, 1]; or SIM_AUTO */
    double step_overhead_s;     /* fixed cost of every non-empty step, >= 0; or SIM_AUTO */
    double allreduce_latency_s; /* fixed cost of one all-reduce when tp > 1, >= 0 */
    double time_scale;          /* wall seconds slept per modelled second; 0: never sleep */
    double hbm_utilisation;     /* share of HBM for weights + KV, (0, 1] */
};

/* What the last finished step contained and what it cost (modelled seconds,
 * before time_scale). All zero when the step had no work. */
struct sim_step {
    int64_t tokens;     /* prefill + decode tokens */
    int64_t calls;      /* prefill()/decode() sequences accounted */
    double flops;       /* linear + attention FLOPs, whole TP group */
    double bytes;       /* HBM bytes read, whole TP group */
    double compute_s;   /* flops / (peak x tp x mfu) */
    double memory_s;    /* bytes / (hbm_bw x tp x mbu) */
    double allreduce_s; /* 0 when tp == 1 */
    double seconds;     /* max(compute_s, memory_s) + allreduce_s + overhead */
};

/* The table entry (backend.h): sim reads BACKEND_READS_HARDWARE; defaults
 * llama-3-8b, bf16 KV, no payload bytes (--payload auto: none), 2048 tokens
 * per step; KV capacity sim_kv_capacity_blocks; the KV-link model
 * sim_transfer_seconds paced by sim_time_scale. */
#define SIM_BACKEND_NAME "sim" /* --backend sim */
extern const struct backend_desc sim_backend;

/* Defaults: llama-3-8b on h100-sxm, tp 1, link ib-400g, mfu, mbu and
 * overhead SIM_AUTO, all-reduce latency 5 us, time_scale 1, HBM utilisation
 * 0.9. */
void sim_default_config(struct sim_config *cfg);

/* Creates a sim backend. SIM_AUTO efficiency fields are resolved first (the
 * calibration table for (model, gpu), else the global defaults). Unknown
 * preset names give TANDEM_EINVAL with a
 * LOG_ERROR listing the valid names; out-of-range numbers TANDEM_EINVAL;
 * weights that do not fit in tp x HBM x utilisation TANDEM_ECONFIG;
 * TANDEM_ENOMEM. On success *out is owned by the caller (out->ops->destroy). */
int sim_create(struct backend **out, const struct sim_config *cfg);

/* Nonzero when be was made by sim_create. */
int sim_is(const struct backend *be);

/* KV blocks that fit in the TP group:
 *   floor((tp x hbm_bytes x hbm_utilisation - weight bytes) / block bytes),
 * block bytes = KV bytes per token at dt x block_size (full precision: the
 * pool's payload_div does not change what the modelled GPU holds). Clamped
 * to INT32_MAX. Returns 0, TANDEM_EINVAL (not a sim, block_size < 1) or
 * TANDEM_ENOSPACE (no room for one block). */
int sim_kv_capacity_blocks(const struct backend *be, enum kv_dtype dt, int block_size,
                           int32_t *out);

/* The configuration in force (SIM_AUTO fields resolved, preset names
 * pointing at the static tables) into out; zeroed when be is not a sim. */
void sim_config_of(const struct backend *be, struct sim_config *out);

/* The work of one step: what prefill()/decode() calls accumulate and what
 * sim_step_cost prices. */
struct sim_work {
    int64_t tokens;    /* prefill + decode tokens */
    int64_t calls;     /* sequences accounted */
    int64_t attn_keys; /* sum over query tokens of the keys each attends to */
    double kv_bytes;   /* KV bytes read (and written) by the step's attention */
};

/* Adds one sequence's call over positions [pos, pos + n) at kv_bytes_per_token
 * (backend_kv_bytes_per_token at the pool's dtype) to w. Pure. */
void sim_work_add(struct sim_work *w, double kv_bytes_per_token, int pos, int n);

/* The modelled time of a step of work w for model m on GPU g with cfg's tp,
 * mfu, mbu, step_overhead_s and allreduce_latency_s (resolved: no SIM_AUTO):
 * the formula in the header comment, the one step_end uses. out is zeroed
 * when w has no tokens. Pure; the calibration tool (tools/calibrate/) calls
 * it too, so there is one copy of the cost model. */
void sim_step_cost(const struct preset_model *m, const struct preset_gpu *g,
                   const struct sim_config *cfg, const struct sim_work *w, struct sim_step *out);

/* Modelled seconds (before time_scale) of the last step_end; 0 before any. */
double sim_last_step_seconds(const struct backend *be);
/* Copies the last step's breakdown into out. */
void sim_last_step(const struct backend *be, struct sim_step *out);

/* Modelled seconds to move bytes of KV over the configured link:
 * latency + bytes / (link bw x tp) (each GPU of the group ships its own KV
 * heads over its own NIC). The caller decides whether to sleep for it, scaled
 * by sim_time_scale. */
double sim_transfer_seconds(const struct backend *be, uint64_t bytes);
double sim_time_scale(const struct backend *be);

/* The deterministic payload of one block, written to dst[0..len):
 *  - full block (n_tokens == block_size): the byte stream of key
 *    h = bh_block(parent, tokens, block_size), i.e. the block's prefix-cache hash;
 *  - partial block (1 <= n_tokens < block_size): slice j (bytes
 *    [j*len/block_size, (j+1)*len/block_size)) for j < n_tokens is the stream of
 *    key bh_block(parent, tokens, j + 1); later slices are zero.
 * parent is the hash of the previous block (bh_root(model name) for block 0).
 * len is kv_block_bytes(pool) (so it honours payload_div). Pure, thread-safe. */
void sim_block_payload(uint8_t *dst, size_t len, uint64_t parent, const uint32_t *tokens,
                       int n_tokens, int block_size);

/* The byte stream of a key: word i (little-endian) is a 64-bit mix of
 * key + (i + 1) x 0x9E3779B97F4A7C15; the last word is cut to len. Pure. */
void sim_payload_fill(uint8_t *dst, size_t len, uint64_t key);

/* The token that follows context[0..n) under seed (n >= 1), and its logprob
 * (in (-4, 0]); what prefill and decode emit. Never a special token. */
uint32_t sim_next_token(const struct backend *be, uint64_t seed, const uint32_t *context, int n,
                        float *logprob);

#endif
