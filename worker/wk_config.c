#include "wk_config.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "block_hash.h"
#include "flags.h"
#include "log.h"
#include "tandem_err.h"
#include "tls.h"

static const char *const dtype_choices[] = {"auto", "f32", "f16", "bf16", "fp8", NULL};
static const char *const level_choices[] = {"debug", "info", "warn", "error", NULL};

void wk_config_defaults(struct worker_config *cfg)
{
    *cfg = (struct worker_config){
        .control_url = "tcp://127.0.0.1:0",
        .metrics_host = "127.0.0.1",
        .kv_url = "tcp://127.0.0.1:0",
        .gpu = "h100-sxm",
        .tp = 1,
        .link = "ib-400g",
        .payload = "auto",
        .time_scale = 1.0,
        .block_size = BH_DEFAULT_BLOCK_SIZE,
        .max_running = 64,
        .max_waiting = 256,
        .heartbeat_ms = 250,
        .transfer_timeout_ms = 30000,
        .seed = 0,
        .log_level = LOG_LEVEL_INFO,
    };
}

/* Fills flags[] and returns how many. */
static size_t build_flags(struct worker_config *c, struct flag *f, int has_colocated)
{
    size_t n = 0;
#define F(...) f[n++] = (struct flag){__VA_ARGS__}
    F("id", FLAG_STR, &c->id, "worker id, unique in the cluster (default <role>-<pid>)", 0, 0,
      NULL);
    F("control", FLAG_STR, &c->control_url,
      "control listen address (PAIR0; the router dials it): tcp://host:port or ipc:///path", 0, 0,
      NULL);
    F("kv", FLAG_STR, &c->kv_url, "data (KV) listen address (PULL0)", 0, 0, NULL);
    F("metrics-port", FLAG_INT, &c->metrics_port, "HTTP port of /metrics and /health (0: any)", 0,
      65535, NULL);
    F("metrics-host", FLAG_STR, &c->metrics_host,
      "HTTP listen address of /metrics and /health (0.0.0.0: every interface)", 0, 0, NULL);
    F("advertise", FLAG_STR, &c->advertise,
      "host or IP that others reach this worker at, put in place of the listen host in the "
      "addresses it announces (needed when listening on 0.0.0.0)",
      0, 0, NULL);
    F(TLS_FLAG_CA, FLAG_STR, &c->tls_ca,
      "cluster CA certificate (PEM) for tls+tcp:// addresses (docs/multi-host.md)", 0, 0, NULL);
    F(TLS_FLAG_CERT, FLAG_STR, &c->tls_cert, "this worker's certificate (PEM), signed by the CA", 0,
      0, NULL);
    F(TLS_FLAG_KEY, FLAG_STR, &c->tls_key, "this worker's private key (PEM)", 0, 0, NULL);
    F(AUTH_SECRET_FLAG, FLAG_STR, &c->cluster_secret_file,
      "file holding the cluster secret (16 to 4096 bytes): prove it to the router, and take jobs, "
      "PrefillJobs and KV frames only from peers holding it (docs/reliability.md; default: "
      "$" AUTH_SECRET_ENV ", else none)",
      0, 0, NULL);
    F("router", FLAG_STR, &c->router,
      "router announce address: push WorkerHello there every second", 0, 0, NULL);
    F("backend", FLAG_CHOICE, &c->backend, "model backend", 0, 0, backend_names);
    F("model", FLAG_STR, &c->model,
      "tiny: 'tiny' (embedded weights); sim: a model preset (default llama-3-8b)", 0, 0, NULL);
    F("checkpoint", FLAG_STR, &c->checkpoint, "tiny: llama2.c checkpoint file", 0, 0, NULL);
    F("tokenizer", FLAG_STR, &c->tokenizer,
      "tiny: llama2.c tokenizer.bin, checked against the model's vocabulary", 0, 0, NULL);
    F("gpu", FLAG_STR, &c->gpu, "sim: GPU preset", 0, 0, NULL);
    F("tp", FLAG_INT, &c->tp, "sim: tensor-parallel degree", 1, 1024, NULL);
    F("link", FLAG_STR, &c->link, "sim: KV transfer link preset", 0, 0, NULL);
    F("payload", FLAG_STR, &c->payload,
      "KV bytes stored and shipped: full, 1/N, none (auto: full for tiny, none for sim)", 0, 0,
      NULL);
    F("time-scale", FLAG_DOUBLE, &c->time_scale,
      "sim: wall seconds slept per modelled second (0: never sleep)", 0, 1e6, NULL);
    F("kv-blocks", FLAG_INT, &c->kv_blocks,
      "KV blocks in the pool (0: from --kv-memory, else 2048 for tiny, GPU HBM for sim)", 0,
      INT_MAX, NULL);
    F("kv-memory", FLAG_BYTES, &c->kv_memory, "KV budget in bytes (full-precision blocks)", 0, 0,
      NULL);
    F("block-size", FLAG_INT, &c->block_size, "tokens per KV block", 1, BH_MAX_BLOCK_SIZE, NULL);
    F("kv-dtype", FLAG_CHOICE, &c->kv_dtype, "KV storage type (auto: f32 for tiny, bf16 for sim)",
      0, 0, dtype_choices);
    F("max-running", FLAG_INT, &c->max_running, "sequences holding KV at once", 1, 65536, NULL);
    F("token-budget", FLAG_INT, &c->token_budget,
      "tokens per scheduler step (0: 128 for tiny, 2048 for sim)", 0, 1 << 24, NULL);
    F("max-prefill-chunk", FLAG_INT, &c->max_prefill_chunk,
      "prompt tokens of one sequence per step (0: the token budget)", 0, 1 << 24, NULL);
    F("max-waiting", FLAG_INT, &c->max_waiting,
      "requests queued beyond the running ones; more are answered Busy", 0, 1 << 20, NULL);
    F("heartbeat-ms", FLAG_INT, &c->heartbeat_ms, "heartbeat period", 10, 500, NULL);
    F("transfer-timeout-ms", FLAG_INT, &c->transfer_timeout_ms,
      "fail a KV transfer after this long without progress from its prefill worker", 100, 3600000,
      NULL);
    F("seed", FLAG_INT, &c->seed, "seeds requests that come without a seed", 0, INT_MAX, NULL);
    F("log-level", FLAG_CHOICE, &c->log_level, "log level", 0, 0, level_choices);
    F("kv-dump", FLAG_STR, &c->kv_dump,
      "debug: append one line per KV block shipped or installed (request, index, hash, XXH3)", 0, 0,
      NULL);
    if (has_colocated) {
        F("colocated", FLAG_BOOL, &c->colocated,
          "take whole requests and prefill them here (no prefill worker)", 0, 0, NULL);
    }
#undef F
    return n;
}

#define MAX_FLAGS 40

int wk_config_parse(struct worker_config *cfg, int argc, char **argv, const char *binary,
                    int has_colocated, FILE *help_out, char *err, size_t errlen)
{
    struct flag flags[MAX_FLAGS];
    wk_config_defaults(cfg);
    size_t n = build_flags(cfg, flags, has_colocated);
    int rc = flags_parse(flags, n, argc, argv, 1, NULL, err, errlen);
    if (rc == FLAGS_HELP && help_out != NULL) {
        char usage[512];
        snprintf(usage, sizeof(usage),
                 "%s [flags]\n\nTandem %s worker: listens for the router on --control, for other "
                 "workers on --kv,\nserves /metrics and /health on --metrics-port, and prints\n"
                 "  READY id=<id> role=<role> control=<url> kv=<url> metrics=127.0.0.1:<port>\n"
                 "once everything is bound.",
                 binary, has_colocated ? "decode (or colocated)" : "prefill");
        flags_usage(help_out, usage, flags, n);
    }
    return rc;
}

/* "full" -> 1, "none" -> -1, "1/N" -> N, "auto" -> 0. */
static int parse_payload(const char *s, int *div)
{
    if (strcmp(s, "auto") == 0) {
        *div = 0;
        return 0;
    }
    if (strcmp(s, "full") == 0) {
        *div = 1;
        return 0;
    }
    if (strcmp(s, "none") == 0) {
        *div = -1;
        return 0;
    }
    if (strncmp(s, "1/", 2) == 0) {
        char *end;
        long v = strtol(s + 2, &end, 10);
        if (end != s + 2 && *end == '\0' && v >= 1 && v <= (1 << 20)) {
            *div = (int)v;
            return 0;
        }
    }
    return TANDEM_EINVAL;
}

static int make_backend(struct worker *w, const struct backend_desc *bd, char *err, size_t errlen)
{
    const struct worker_config *c = &w->cfg;
    struct backend_params bp = {
        .model = c->model,
        .checkpoint = c->checkpoint,
        .tokenizer = c->tokenizer,
        .gpu = c->gpu,
        .tp = c->tp,
        .link = c->link,
        .time_scale = c->time_scale,
    };
    return bd->create(&w->be, &bp, err, errlen);
}

static int pool_blocks(struct worker *w, const struct backend_desc *bd, const struct kv_config *kc,
                       int *out, char *err, size_t errlen)
{
    const struct worker_config *c = &w->cfg;
    if (c->kv_blocks > 0 && c->kv_memory > 0) {
        snprintf(err, errlen, "--kv-blocks conflicts with --kv-memory (give one)");
        return TANDEM_EINVAL;
    }
    if (c->kv_blocks > 0) {
        *out = c->kv_blocks;
        return 0;
    }
    if (c->kv_memory > 0) {
        size_t bb = kv_config_block_bytes(kc);
        uint64_t n = c->kv_memory / bb;
        if (n < 1) {
            snprintf(err, errlen, "--kv-memory: %llu bytes hold no %zu-byte block",
                     (unsigned long long)c->kv_memory, bb);
            return TANDEM_EINVAL;
        }
        *out = n > INT32_MAX ? INT32_MAX : (int)n;
        return 0;
    }
    int32_t n;
    int rc = bd->kv_capacity(w->be, kc->dtype, kc->block_size, &n, err, errlen);
    if (rc != 0) {
        return rc;
    }
    *out = n;
    return 0;
}

int wk_engine_create(struct worker *w, char *err, size_t errlen)
{
    const struct worker_config *c = &w->cfg;
    const struct backend_desc *bd = backend_at((size_t)c->backend);
    int div;
    if (bd == NULL) {
        snprintf(err, errlen, "--backend: no backend %d", c->backend);
        return TANDEM_EINVAL;
    }
    if (parse_payload(c->payload, &div) != 0) {
        snprintf(err, errlen, "--payload: '%s' is not full, none, auto or 1/N", c->payload);
        return TANDEM_EINVAL;
    }
    if (bd->needs_full_payload && div != 0 && div != 1) {
        snprintf(err, errlen, "--payload %s: the %s backend needs the full KV bytes", c->payload,
                 bd->name);
        return TANDEM_EINVAL;
    }
    if (div == 0) {
        div = bd->default_payload_div;
    }
    int rc = make_backend(w, bd, err, errlen);
    if (rc != 0) {
        return rc;
    }
    const struct model_info *mi = &w->be->info;
    if (c->tokenizer != NULL) {
        rc = tok_load(&w->tok, c->tokenizer, mi->vocab_size);
        if (rc != 0) {
            snprintf(err, errlen, "--tokenizer %s (vocabulary %d): %s", c->tokenizer,
                     mi->vocab_size, tandem_strerror(rc));
            goto fail;
        }
    }
    struct kv_config kc = {
        .n_layers = mi->n_layers,
        .n_kv_heads = mi->n_kv_heads,
        .head_dim = mi->head_dim,
        .block_size = c->block_size,
        .dtype = c->kv_dtype == 0 ? bd->default_kv_dtype : (enum kv_dtype)(c->kv_dtype - 1),
        .payload_div = div,
    };
    rc = pool_blocks(w, bd, &kc, &kc.n_blocks, err, errlen);
    if (rc != 0) {
        goto fail;
    }
    rc = kv_pool_create(&w->pool, &kc);
    if (rc != 0) {
        snprintf(err, errlen,
                 "KV pool of %d blocks x %zu bytes: %s (lower --kv-blocks or use --payload 1/N)",
                 kc.n_blocks, kv_config_block_bytes(&kc), tandem_strerror(rc));
        goto fail;
    }
#ifdef TANDEM_KV_CHECK
    w->kv_refs = calloc((size_t)kc.n_blocks, sizeof(*w->kv_refs));
    if (w->kv_refs == NULL) {
        snprintf(err, errlen, "KV check scratch of %d blocks: %s", kc.n_blocks,
                 tandem_strerror(TANDEM_ENOMEM));
        rc = TANDEM_ENOMEM;
        goto fail;
    }
    LOG_INFO("worker", "built with TANDEM_KV_CHECK: the KV cache is checked after every step "
                       "(a debug build; do not take timings from it)");
#endif
    int budget = c->token_budget > 0 ? c->token_budget : bd->default_token_budget;
    struct sched_config sc = {
        .max_running = c->max_running,
        .token_budget = budget,
        .max_prefill_chunk = c->max_prefill_chunk > 0 ? c->max_prefill_chunk : budget,
        .block_size = c->block_size,
        .max_context = 0,
    };
    if (budget < c->max_running) {
        LOG_WARN("worker", "--token-budget %d < --max-running %d: not every decode runs every step",
                 budget, c->max_running);
    }
    struct sched_callbacks cb = {
        .arg = w,
        .on_token = w->role->on_token,
        .on_finish = w->role->on_finish,
        .on_blocks_ready = w->role->on_blocks_ready,
        .on_prompt_logprobs = w->role->on_prompt_logprobs,
    };
    rc = sched_create(&w->sched, &sc, w->be, w->pool, &cb);
    if (rc != 0) {
        snprintf(err, errlen, "scheduler: %s", tandem_strerror(rc));
        goto fail;
    }
    w->root = bh_root(mi->name);
    w->block_size = c->block_size;
    w->dtype = kc.dtype;
    w->block_bytes = kv_block_bytes(w->pool);
    w->max_context = sched_max_context(w->sched);
    LOG_INFO("worker",
             "engine: %s backend, model %s, %d KV blocks of %d tokens (%s, %zu bytes each), "
             "context %d, max running %d, token budget %d, prefill chunk %d",
             w->be->ops->name, mi->name, kc.n_blocks, kc.block_size, kv_dtype_name(kc.dtype),
             w->block_bytes, w->max_context, sc.max_running, sc.token_budget, sc.max_prefill_chunk);
    return 0;

fail:
    wk_engine_destroy(w);
    return rc;
}

void wk_engine_destroy(struct worker *w)
{
    sched_destroy(w->sched);
    w->sched = NULL;
    kv_pool_destroy(w->pool);
    w->pool = NULL;
    free(w->kv_refs);
    w->kv_refs = NULL;
    tok_destroy(w->tok);
    w->tok = NULL;
    if (w->be != NULL) {
        w->be->ops->destroy(w->be);
        w->be = NULL;
    }
}
