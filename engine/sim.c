/* The `sim` backend: roofline step times, deterministic tokens and KV payloads.
 * The model is described in sim.h and derived in docs/engine.md ("## sim"). */
#include "sim.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block_hash.h"
#include "calibration.h"
#include "log.h"
#include "presets.h"
#include "tandem_err.h"
#include "tandem_rng.h"

#define SIM_DEFAULT_MODEL "llama-3-8b"

#define SIM_CONTAINER_OF(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

struct sim {
    struct backend base; /* first: the ops table and model_info */
    const struct preset_model *model;
    const struct preset_gpu *gpu;
    const struct preset_link *link;
    struct sim_config cfg; /* preset names point at the static preset tables */
    double weight_bytes;
    uint64_t root; /* bh_root(model name): parent of block 0 */

    /* The step being accumulated. */
    int active;            /* a call has been accounted since the last step_end */
    struct timespec start; /* CLOCK_MONOTONIC at the step's first call */
    struct sim_work work;

    struct sim_step last;
};

static const struct backend_ops sim_ops;

static struct sim *to_sim(struct backend *be)
{
    return SIM_CONTAINER_OF(be, struct sim, base);
}

static const struct sim *to_sim_const(const struct backend *be)
{
    return SIM_CONTAINER_OF(be, const struct sim, base);
}

void sim_default_config(struct sim_config *cfg)
{
    *cfg = (struct sim_config){
        .model = SIM_DEFAULT_MODEL,
        .gpu = "h100-sxm",
        .link = "ib-400g",
        .tp = 1,
        .mfu = SIM_AUTO,
        .mbu = SIM_AUTO,
        .step_overhead_s = SIM_AUTO,
        .allreduce_latency_s = 5e-6,
        .time_scale = 1.0,
        .hbm_utilisation = 0.9,
    };
}

int sim_is(const struct backend *be)
{
    return be != NULL && be->ops == &sim_ops;
}

/* ---- deterministic bytes and tokens ---------------------------------- */

void sim_payload_fill(uint8_t *dst, size_t len, uint64_t key)
{
    size_t nw = len / 8;
    uint64_t ctr = key;
    for (size_t i = 0; i < nw; i++) {
        uint64_t w = rng_splitmix64(&ctr);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(dst + i * 8, &w, 8);
#else
        for (int b = 0; b < 8; b++) { /* little-endian whatever the host */
            dst[i * 8 + (size_t)b] = (uint8_t)(w >> (8 * b));
        }
#endif
    }
    size_t rem = len - nw * 8;
    if (rem > 0) {
        uint64_t w = rng_hash64(ctr);
        for (size_t b = 0; b < rem; b++) {
            dst[nw * 8 + b] = (uint8_t)(w >> (8 * b));
        }
    }
}

static size_t slice_off(size_t len, int j, int block_size)
{
    return len * (size_t)j / (size_t)block_size;
}

/* Writes slots [lo, hi) of one block (hi <= block_size); tokens are the
 * block's first hi tokens. Implements sim_block_payload incrementally: a block
 * that becomes full is rewritten whole from its hash, a partial one gets the
 * new slots' slices (and zeros after them when it starts at slot 0). Returns
 * the block's hash when it is full (for chaining), else 0. */
static uint64_t write_block(uint8_t *dst, size_t len, uint64_t parent, const uint32_t *tokens,
                            int lo, int hi, int block_size)
{
    if (hi == block_size) {
        uint64_t h = bh_block(parent, tokens, block_size);
        sim_payload_fill(dst, len, h);
        return h;
    }
    for (int j = lo; j < hi; j++) {
        size_t a = slice_off(len, j, block_size);
        size_t b = slice_off(len, j + 1, block_size);
        sim_payload_fill(dst + a, b - a, bh_block(parent, tokens, j + 1));
    }
    if (lo == 0) {
        size_t a = slice_off(len, hi, block_size);
        memset(dst + a, 0, len - a);
    }
    return 0;
}

void sim_block_payload(uint8_t *dst, size_t len, uint64_t parent, const uint32_t *tokens,
                       int n_tokens, int block_size)
{
    if (len == 0 || n_tokens < 1 || block_size < 1 || n_tokens > block_size) {
        return;
    }
    write_block(dst, len, parent, tokens, 0, n_tokens, block_size);
}

/* The context hash: a chain over the tokens, h(0) = seed, h(i + 1) =
 * mix(h(i) + token i), so that it extends by one token in O(1) from a
 * cached h(k) (struct be_ctx) and still depends on every token. */
static uint64_t chain(uint64_t h, const uint32_t *ctx, int from, int to)
{
    for (int i = from; i < to; i++) {
        h = rng_mix64(h + ((uint64_t)ctx[i] + 1) * RNG_GOLDEN);
    }
    return h;
}

static uint64_t context_hash(uint64_t seed, const uint32_t *ctx, int n, struct be_ctx *cache)
{
    if (cache == NULL) {
        return chain(seed, ctx, 0, n);
    }
    if (cache->n == 0 || cache->n > n) {
        cache->hash = seed;
        cache->n = 0;
    }
    cache->hash = chain(cache->hash, ctx, cache->n, n);
    cache->n = n;
    return cache->hash;
}

static uint32_t next_token(const struct sim *s, uint64_t seed, const uint32_t *context, int n,
                           struct be_ctx *cache, float *logprob)
{
    uint64_t h = context_hash(seed ^ s->root, context, n, cache);
    const struct preset_model *m = s->model;
    uint64_t span = (uint64_t)(m->special_start - m->special_below);
    uint32_t tok = (uint32_t)m->special_below + (uint32_t)(rng_mix64(h) % span);
    if (logprob != NULL) {
        double u = (double)(rng_mix64(h ^ RNG_GOLDEN) >> 11) * 0x1.0p-53; /* [0, 1) */
        *logprob = (float)(-4.0 * u);
    }
    return tok;
}

uint32_t sim_next_token(const struct backend *be, uint64_t seed, const uint32_t *context, int n,
                        float *logprob)
{
    return next_token(to_sim_const(be), seed, context, n, NULL, logprob);
}

/* ---- per-call work ----------------------------------------------------- */

/* Validates one sequence's call over positions [pos, pos + n). */
static int check_seq(const struct sim *s, const struct kv_pool *kv, const struct be_seq *seq, int n)
{
    if (seq == NULL || seq->history == NULL || seq->pos < 0 || n < 1) {
        return TANDEM_EINVAL;
    }
    if ((int64_t)seq->pos + n > s->base.info.max_context) {
        return TANDEM_ERANGE;
    }
    for (int i = 0; i < n; i++) {
        if (seq->history[seq->pos + i] >= (uint32_t)s->base.info.vocab_size) {
            return TANDEM_EINVAL;
        }
    }
    if (kv != NULL && kv_block_bytes(kv) > 0) {
        const struct kv_config *kc = kv_pool_config(kv);
        if (seq->blocks == NULL) {
            return TANDEM_EINVAL;
        }
        for (int b = seq->pos / kc->block_size; b <= (seq->pos + n - 1) / kc->block_size; b++) {
            if (seq->blocks[b] < 0 || seq->blocks[b] >= kc->n_blocks) {
                return TANDEM_EINVAL;
            }
        }
    }
    return 0;
}

static void write_payloads(const struct sim *s, struct kv_pool *kv, const struct be_seq *seq, int n)
{
    size_t len = kv != NULL ? kv_block_bytes(kv) : 0;
    if (len == 0) {
        return;
    }
    int bs = kv_pool_config(kv)->block_size;
    int pos = seq->pos;
    int end = pos + n;
    const uint32_t *hist = seq->history;
    uint64_t parent = s->root;
    for (int b = 0; b < pos / bs; b++) {
        parent = bh_block(parent, hist + (size_t)b * bs, bs);
    }
    for (int b = pos / bs; b <= (end - 1) / bs; b++) {
        int first = b * bs;
        int lo = (pos > first ? pos : first) - first;
        int hi = (end < first + bs ? end : first + bs) - first;
        parent =
            write_block(kv_block_data(kv, seq->blocks[b]), len, parent, hist + first, lo, hi, bs);
    }
}

/* Adds a call over positions [pos, pos + n) to the current step. */
static void account(struct sim *s, const struct kv_pool *kv, int pos, int n)
{
    if (!s->active) {
        clock_gettime(CLOCK_MONOTONIC, &s->start);
        s->active = 1;
    }
    enum kv_dtype dt = kv != NULL ? kv_pool_config(kv)->dtype : KV_DTYPE_BF16;
    sim_work_add(&s->work, (double)backend_kv_bytes_per_token(&s->base.info, dt), pos, n);
}

static int sim_prefill(struct backend *be, struct kv_pool *kv, const struct be_seq *seq,
                       const uint32_t *tokens, int n, struct be_out *out, float *logits_all)
{
    struct sim *s = to_sim(be);
    int rc = check_seq(s, kv, seq, n);
    if (rc != 0) {
        return rc;
    }
    if (tokens != NULL && tokens != seq->history + seq->pos &&
        memcmp(tokens, seq->history + seq->pos, (size_t)n * sizeof(*tokens)) != 0) {
        return TANDEM_EINVAL; /* the chunk must be the history at pos */
    }
    write_payloads(s, kv, seq, n);
    account(s, kv, seq->pos, n);
    if (out != NULL) {
        out->token = next_token(s, seq->seed, seq->history, seq->pos + n, seq->ctx, &out->logprob);
    }
    return 0;
}

static int sim_decode(struct backend *be, struct kv_pool *kv, int n_seqs, const struct be_seq *seqs,
                      struct be_out *out)
{
    struct sim *s = to_sim(be);
    if (n_seqs < 0 || (n_seqs > 0 && (seqs == NULL || out == NULL))) {
        return TANDEM_EINVAL;
    }
    for (int i = 0; i < n_seqs && i < 4; i++) { /* the first ones too (the loop fetches 4 ahead) */
        if (seqs[i].history != NULL && seqs[i].pos >= 0) {
            __builtin_prefetch(seqs[i].history + seqs[i].pos);
        }
    }
    for (int i = 0; i < n_seqs; i++) { /* all or nothing */
        if (i + 4 < n_seqs && seqs[i + 4].history != NULL && seqs[i + 4].pos >= 0) {
            /* each history is cold: overlap the misses */
            __builtin_prefetch(seqs[i + 4].history + seqs[i + 4].pos);
        }
        int rc = check_seq(s, kv, &seqs[i], 1);
        if (rc != 0) {
            return rc;
        }
    }
    for (int i = 0; i < n_seqs; i++) {
        write_payloads(s, kv, &seqs[i], 1);
        account(s, kv, seqs[i].pos, 1);
        out[i].token = next_token(s, seqs[i].seed, seqs[i].history, seqs[i].pos + 1, seqs[i].ctx,
                                  &out[i].logprob);
    }
    return 0;
}

/* ---- step time ----------------------------------------------------------- */

void sim_work_add(struct sim_work *w, double kv_bytes_per_token, int pos, int n)
{
    w->tokens += n;
    w->calls += 1;
    w->attn_keys += (int64_t)n * pos + (int64_t)n * (n + 1) / 2;
    w->kv_bytes += kv_bytes_per_token * (double)(pos + n);
}

void sim_step_cost(const struct preset_model *m, const struct preset_gpu *g,
                   const struct sim_config *cfg, const struct sim_work *w, struct sim_step *st)
{
    double tp = (double)cfg->tp;
    memset(st, 0, sizeof(*st));
    if (w->tokens == 0) {
        return;
    }
    double attn_per_key = 4.0 * m->n_layers * m->n_heads * m->head_dim;
    st->tokens = w->tokens;
    st->calls = w->calls;
    st->flops = 2.0 * (double)preset_model_params(m) * (double)w->tokens +
                attn_per_key * (double)w->attn_keys;
    st->bytes = (double)preset_model_weight_bytes(m) + w->kv_bytes;
    st->compute_s = st->flops / (g->flops * tp * cfg->mfu);
    st->memory_s = st->bytes / (g->hbm_bw * tp * cfg->mbu);
    if (cfg->tp > 1) {
        /* Megatron TP: two all-reduces per layer of tokens x dim BF16 values;
         * a ring moves 2 (tp - 1) / tp of the buffer through each GPU's link. */
        double buf = (double)w->tokens * m->dim * 2.0;
        double one = cfg->allreduce_latency_s + 2.0 * (tp - 1.0) / tp * buf / g->nvlink_bw;
        st->allreduce_s = 2.0 * m->n_layers * one;
    }
    st->seconds = (st->compute_s > st->memory_s ? st->compute_s : st->memory_s) + st->allreduce_s +
                  cfg->step_overhead_s;
}

static void sleep_until(const struct timespec *deadline)
{
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, deadline, NULL) == EINTR) {
    }
}

static void sim_step_end(struct backend *be)
{
    struct sim *s = to_sim(be);
    sim_step_cost(s->model, s->gpu, &s->cfg, &s->work, &s->last);
    double wall = s->last.seconds * s->cfg.time_scale;
    if (s->active && wall > 0) {
        /* Sleep until start + wall, not for wall: the CPU time of the sim's own
         * hashing and the scheduler's work inside the step are absorbed, so a
         * step lasts what the model says. */
        double whole = floor(wall);
        struct timespec d = s->start;
        d.tv_sec += (time_t)whole;
        d.tv_nsec += (long)((wall - whole) * 1e9);
        if (d.tv_nsec >= 1000000000L) {
            d.tv_sec += 1;
            d.tv_nsec -= 1000000000L;
        }
        sleep_until(&d);
    }
    s->active = 0;
    memset(&s->work, 0, sizeof(s->work));
}

static void sim_destroy(struct backend *be)
{
    if (be != NULL) {
        free(to_sim(be));
    }
}

static const struct backend_ops sim_ops = {
    .name = SIM_BACKEND_NAME,
    .destroy = sim_destroy,
    .prefill = sim_prefill,
    .decode = sim_decode,
    .step_end = sim_step_end,
};

/* ---- creation and queries ------------------------------------------------ */

static int in_unit(double v)
{
    return v > 0.0 && v <= 1.0;
}

static int nonneg(double v)
{
    return isfinite(v) && v >= 0.0;
}

/* SIM_AUTO fields: the calibration table's value for the pair, else the
 * global default. */
static void resolve_auto(struct sim_config *c, const struct preset_model *m,
                         const struct preset_gpu *g)
{
    const struct calibration *cal = calibration_find(m->name, g->name);
    if (c->mfu < 0) {
        c->mfu = cal != NULL ? cal->mfu : SIM_DEFAULT_MFU;
    }
    if (c->mbu < 0) {
        c->mbu = cal != NULL ? cal->mbu : SIM_DEFAULT_MBU;
    }
    if (c->step_overhead_s < 0) {
        c->step_overhead_s = cal != NULL ? cal->step_overhead_s : SIM_DEFAULT_OVERHEAD_S;
    }
}

int sim_create(struct backend **out, const struct sim_config *given)
{
    char names[512];
    if (out == NULL || given == NULL) {
        return TANDEM_EINVAL;
    }
    struct sim_config resolved = *given;
    const struct sim_config *cfg = &resolved;
    const struct preset_model *m = preset_model_find(cfg->model);
    if (m == NULL) {
        preset_model_names(names, sizeof(names));
        LOG_ERROR("sim", "unknown model '%s'; valid models: %s", cfg->model ? cfg->model : "(null)",
                  names);
        return TANDEM_EINVAL;
    }
    const struct preset_gpu *g = preset_gpu_find(cfg->gpu);
    if (g == NULL) {
        preset_gpu_names(names, sizeof(names));
        LOG_ERROR("sim", "unknown GPU '%s'; valid GPUs: %s", cfg->gpu ? cfg->gpu : "(null)", names);
        return TANDEM_EINVAL;
    }
    const struct preset_link *l = preset_link_find(cfg->link);
    if (l == NULL) {
        preset_link_names(names, sizeof(names));
        LOG_ERROR("sim", "unknown link '%s'; valid links: %s", cfg->link ? cfg->link : "(null)",
                  names);
        return TANDEM_EINVAL;
    }
    resolve_auto(&resolved, m, g);
    if (cfg->tp < 1 || cfg->tp > m->n_kv_heads) {
        LOG_ERROR("sim", "tp %d out of range [1, %d] (%s has %d KV heads to split)", cfg->tp,
                  m->n_kv_heads, m->name, m->n_kv_heads);
        return TANDEM_EINVAL;
    }
    if (!in_unit(cfg->mfu) || !in_unit(cfg->mbu) || !in_unit(cfg->hbm_utilisation)) {
        LOG_ERROR("sim", "mfu %g, mbu %g and hbm_utilisation %g must be in (0, 1]", cfg->mfu,
                  cfg->mbu, cfg->hbm_utilisation);
        return TANDEM_EINVAL;
    }
    if (!nonneg(cfg->step_overhead_s) || !nonneg(cfg->allreduce_latency_s) ||
        !nonneg(cfg->time_scale)) {
        LOG_ERROR("sim",
                  "step_overhead_s %g, allreduce_latency_s %g and time_scale %g must be "
                  ">= 0",
                  cfg->step_overhead_s, cfg->allreduce_latency_s, cfg->time_scale);
        return TANDEM_EINVAL;
    }
    double weights = (double)preset_model_weight_bytes(m);
    double hbm = g->hbm_bytes * cfg->tp * cfg->hbm_utilisation;
    if (weights >= hbm) {
        LOG_ERROR("sim",
                  "%s weights (%.1f GB) do not fit in %d x %s at %.0f%% HBM (%.1f GB); "
                  "raise tp",
                  m->name, weights / 1e9, cfg->tp, g->name, cfg->hbm_utilisation * 100.0,
                  hbm / 1e9);
        return TANDEM_ECONFIG;
    }
    struct sim *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return TANDEM_ENOMEM;
    }
    s->base.ops = &sim_ops;
    struct model_info *mi = &s->base.info;
    snprintf(mi->name, sizeof(mi->name), "%s", m->name);
    mi->dim = m->dim;
    mi->hidden_dim = m->ffn_dim;
    mi->n_layers = m->n_layers;
    mi->n_heads = m->n_heads;
    mi->n_kv_heads = m->n_kv_heads;
    mi->head_dim = m->head_dim;
    mi->vocab_size = m->vocab_size;
    mi->max_context = m->max_context;
    mi->bos_id = m->bos_id;
    mi->eos_id = m->eos_id;
    mi->emits_tokens = 1;
    s->model = m;
    s->gpu = g;
    s->link = l;
    s->cfg = *cfg;
    s->cfg.model = m->name;
    s->cfg.gpu = g->name;
    s->cfg.link = l->name;
    s->weight_bytes = weights;
    s->root = bh_root(m->name);
    *out = &s->base;
    return 0;
}

int sim_kv_capacity_blocks(const struct backend *be, enum kv_dtype dt, int block_size, int32_t *out)
{
    if (!sim_is(be) || block_size < 1 || (int)dt < 0 || dt >= KV_DTYPE_COUNT || out == NULL) {
        return TANDEM_EINVAL;
    }
    const struct sim *s = to_sim_const(be);
    double free_bytes = s->gpu->hbm_bytes * s->cfg.tp * s->cfg.hbm_utilisation - s->weight_bytes;
    double block = (double)backend_kv_bytes_per_token(&be->info, dt) * block_size;
    double blocks = floor(free_bytes / block);
    if (blocks < 1.0) {
        LOG_ERROR("sim", "no room for one KV block of %.0f bytes (%.0f bytes left after weights)",
                  block, free_bytes);
        return TANDEM_ENOSPACE;
    }
    *out = blocks > (double)INT32_MAX ? INT32_MAX : (int32_t)blocks;
    return 0;
}

void sim_config_of(const struct backend *be, struct sim_config *out)
{
    if (sim_is(be)) {
        *out = to_sim_const(be)->cfg;
    } else {
        memset(out, 0, sizeof(*out));
    }
}

double sim_last_step_seconds(const struct backend *be)
{
    return sim_is(be) ? to_sim_const(be)->last.seconds : 0.0;
}

void sim_last_step(const struct backend *be, struct sim_step *out)
{
    if (sim_is(be)) {
        *out = to_sim_const(be)->last;
    } else {
        memset(out, 0, sizeof(*out));
    }
}

double sim_transfer_seconds(const struct backend *be, uint64_t bytes)
{
    if (!sim_is(be)) {
        return 0.0;
    }
    const struct sim *s = to_sim_const(be);
    return s->link->latency_s + (double)bytes / (s->link->bw * s->cfg.tp);
}

double sim_time_scale(const struct backend *be)
{
    return sim_is(be) ? to_sim_const(be)->cfg.time_scale : 0.0;
}

/* ---- the table entry (backend.h) ------------------------------------------- */

/* Tokens per scheduler step: the sim sleeps its modelled step time instead of
 * computing, so it takes vLLM-sized steps. */
#define SIM_DEFAULT_BUDGET 2048

static int desc_model_known(const char *model)
{
    return preset_model_find(model) != NULL;
}

/* An efficiency flag's text into *v: NULL or "auto" give SIM_AUTO, else a
 * number in [lo, hi] (lo excluded when open_lo). Returns 0 or TANDEM_EINVAL
 * with a message naming the flag. */
static int parse_eff(const char *text, const char *flag, double scale, double lo, int open_lo,
                     double hi, double *v, char *err, size_t errlen)
{
    if (text == NULL || strcmp(text, "auto") == 0) {
        *v = SIM_AUTO;
        return 0;
    }
    char *end = NULL;
    double x = strtod(text, &end);
    if (end == text || *end != '\0' || !isfinite(x) || x < lo || (open_lo && x == lo) || x > hi) {
        snprintf(err, errlen, "--%s: expected auto or a number in %s%.10g, %.10g], got '%s'", flag,
                 open_lo ? "(" : "[", lo, hi, text);
        return TANDEM_EINVAL;
    }
    *v = x * scale;
    return 0;
}

static int desc_create(struct backend **out, const struct backend_params *p, char *err,
                       size_t errlen)
{
    char names[512];
    if (p->checkpoint != NULL || p->tokenizer != NULL) {
        const struct backend_desc *files = backend_reading(BACKEND_READS_FILES);
        snprintf(err, errlen, "--%s is for the %s backend only",
                 p->checkpoint ? "checkpoint" : "tokenizer", files ? files->name : "?");
        return TANDEM_EINVAL;
    }
    struct sim_config sc;
    sim_default_config(&sc);
    if (p->model != NULL) {
        sc.model = p->model;
    }
    sc.gpu = p->gpu;
    sc.link = p->link;
    sc.tp = p->tp;
    sc.time_scale = p->time_scale;
    if (parse_eff(p->mfu, "mfu", 1.0, 0.0, 1, 1.0, &sc.mfu, err, errlen) != 0 ||
        parse_eff(p->mbu, "mbu", 1.0, 0.0, 1, 1.0, &sc.mbu, err, errlen) != 0 ||
        parse_eff(p->step_overhead_ms, "step-overhead-ms", 1e-3, 0.0, 0, 1e6, &sc.step_overhead_s,
                  err, errlen) != 0) {
        return TANDEM_EINVAL;
    }
    if (preset_model_find(sc.model) == NULL) {
        preset_model_names(names, sizeof(names));
        snprintf(err, errlen, "--model: unknown preset '%s' (one of: %s)", sc.model, names);
        return TANDEM_EINVAL;
    }
    if (preset_gpu_find(sc.gpu) == NULL) {
        preset_gpu_names(names, sizeof(names));
        snprintf(err, errlen, "--gpu: unknown preset '%s' (one of: %s)", sc.gpu, names);
        return TANDEM_EINVAL;
    }
    if (preset_link_find(sc.link) == NULL) {
        preset_link_names(names, sizeof(names));
        snprintf(err, errlen, "--link: unknown preset '%s' (one of: %s)", sc.link, names);
        return TANDEM_EINVAL;
    }
    int rc = sim_create(out, &sc);
    if (rc != 0) {
        snprintf(err, errlen, "sim backend (--model %s --gpu %s --tp %d): %s", sc.model, sc.gpu,
                 sc.tp, tandem_strerror(rc));
    }
    return rc;
}

static int desc_kv_capacity(const struct backend *be, enum kv_dtype dt, int block_size,
                            int32_t *out, char *err, size_t errlen)
{
    int rc = sim_kv_capacity_blocks(be, dt, block_size, out);
    if (rc != 0) {
        snprintf(err, errlen, "sim: no KV capacity left on the GPU after the weights: %s",
                 tandem_strerror(rc));
    }
    return rc;
}

const struct backend_desc sim_backend = {
    .name = SIM_BACKEND_NAME,
    .ops = &sim_ops,
    .reads = BACKEND_READS_HARDWARE | BACKEND_READS_PAYLOAD,
    .default_model = SIM_DEFAULT_MODEL,
    .default_kv_dtype = KV_DTYPE_BF16,
    .default_payload_div = -1,
    .default_token_budget = SIM_DEFAULT_BUDGET,
    .model_known = desc_model_known,
    .model_names = preset_model_names,
    .create = desc_create,
    .kv_capacity = desc_kv_capacity,
    .transfer_seconds = sim_transfer_seconds,
    .time_scale = sim_time_scale,
    .step_seconds = sim_last_step_seconds,
};
