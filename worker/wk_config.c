#include "wk_config.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "auth.h"
#include "block_hash.h"
#include "flags.h"
#include "log.h"
#include "scheduler.h"
#include "tandem_err.h"
#include "tls.h"
#include "wk_core.h"

static const char *const dtype_choices[] = {"auto", "f32", "f16", "bf16", "fp8", NULL};

int wk_payload_parse(const char *s, int *div)
{
    int d;
    if (strcmp(s, "auto") == 0) {
        d = 0;
    } else if (strcmp(s, "full") == 0) {
        d = 1;
    } else if (strcmp(s, "none") == 0) {
        d = -1;
    } else {
        char *end = NULL;
        long v = strncmp(s, "1/", 2) == 0 ? strtol(s + 2, &end, 10) : 0;
        if (v < 1 || v > (1 << 20) || end == s + 2 || *end != '\0') {
            return TANDEM_EINVAL;
        }
        d = (int)v;
    }
    if (div != NULL) {
        *div = d;
    }
    return 0;
}

static int check_payload(const char *s)
{
    return wk_payload_parse(s, NULL);
}

/* "auto", or a number in [lo, hi] (lo excluded when open_lo). */
static int check_auto_number(const char *s, double lo, int open_lo, double hi)
{
    if (strcmp(s, "auto") == 0) {
        return 0;
    }
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !(v >= lo && v <= hi) || (open_lo && v == lo)) {
        return TANDEM_EINVAL;
    }
    return 0;
}

static int check_fraction(const char *s)
{
    return check_auto_number(s, 0.0, 1, 1.0);
}

static int check_overhead(const char *s)
{
    return check_auto_number(s, 0.0, 0, 1e6);
}

/* The rule of the three efficiency settings (engine/calibration.h). */
#define WK_AUTO(def)                                                                               \
    " (auto: the fitted value if docs/engine.md calibrates this model on this GPU, else " def      \
    "; a number overrides)"
#define WK_AUTO_HELP_MFU      WK_AUTO("0.5")
#define WK_AUTO_HELP_MBU      WK_AUTO("0.7")
#define WK_AUTO_HELP_OVERHEAD WK_AUTO("1")

/* Only tandem-decode has the flag. */
#define WK_DECODE_ONLY SETTING_TAG(0)

#define AT(field) .off = offsetof(struct worker_config, field)
#define POOL      SETTING_POOL
#define OVERRIDE  (SETTING_POOL | SETTING_OVERRIDE)
#define MANAGED   SETTING_MANAGED

/* Every worker setting, in --help order. A pool key's position here is also
 * its position in a cluster file's list of valid keys and in the argv of
 * `tandem up`. */
const struct setting wk_settings[] = {
    {"id", NULL, FLAG_STR, AT(id), .flags = MANAGED,
     .help = "worker id, unique in the cluster (default <role>-<pid>)"},
    {"control", NULL, FLAG_STR, AT(control_url), .def_str = "tcp://127.0.0.1:0", .flags = MANAGED,
     .help = "control listen address (PAIR0; the router dials it): tcp://host:port or "
             "ipc:///path"},
    {"kv", NULL, FLAG_STR, AT(kv_url), .def_str = "tcp://127.0.0.1:0", .flags = MANAGED,
     .help = "data (KV) listen address (PULL0)"},
    {"metrics-port", NULL, FLAG_INT, AT(metrics_port), .min = 0, .max = 65535, .flags = MANAGED,
     .help = "HTTP port of /metrics and /health (0: any)"},
    {"metrics-host", NULL, FLAG_STR, AT(metrics_host), .def_str = "127.0.0.1",
     .help = "HTTP listen address of /metrics and /health (0.0.0.0: every interface)"},
    {"advertise", NULL, FLAG_STR, AT(advertise),
     .help = "host or IP that others reach this worker at, put in place of the listen host in "
             "the addresses it announces (needed when listening on 0.0.0.0)"},
    {TLS_FLAG_CA, NULL, FLAG_STR, AT(tls_ca), .flags = MANAGED,
     .help = "cluster CA certificate (PEM) for tls+tcp:// addresses (docs/multi-host.md)"},
    {TLS_FLAG_CERT, NULL, FLAG_STR, AT(tls_cert), .flags = MANAGED,
     .help = "this worker's certificate (PEM), signed by the CA"},
    {TLS_FLAG_KEY, NULL, FLAG_STR, AT(tls_key), .flags = MANAGED,
     .help = "this worker's private key (PEM)"},
    {AUTH_SECRET_FLAG, NULL, FLAG_STR, AT(cluster_secret_file),
     .help = "file holding the cluster secret (16 to 4096 bytes): prove it to the router, and "
             "take jobs, PrefillJobs and KV frames only from peers holding it "
             "(docs/reliability.md; default: $" AUTH_SECRET_ENV ", else none)"},
    {"router", NULL, FLAG_STR, AT(router), .flags = MANAGED,
     .help = "router announce address: push WorkerHello there every second"},
    {"backend", "backend", FLAG_CHOICE, AT(backend), .choices = backend_names, .flags = POOL,
     .help = "model backend"},
    {"model", "model", FLAG_STR, AT(model), .flags = POOL,
     .help = "tiny: 'tiny' (embedded weights); sim: a model preset (default llama-3-8b)"},
    {"checkpoint", "checkpoint", FLAG_STR, AT(checkpoint), .reads = BACKEND_READS_FILES,
     .flags = POOL | SETTING_PATH, .help = "tiny: llama2.c checkpoint file"},
    {"tokenizer", "tokenizer", FLAG_STR, AT(tokenizer), .reads = BACKEND_READS_FILES,
     .flags = SETTING_PATH,
     .help = "tiny: llama2.c tokenizer.bin, checked against the model's vocabulary"},
    {"gpu", "gpu", FLAG_STR, AT(gpu), .def_str = "h100-sxm", .reads = BACKEND_READS_HARDWARE,
     .flags = POOL, .help = "sim: GPU preset"},
    {"tp", "tp", FLAG_INT, AT(tp), .def = 1, .min = 1, .max = 1024, .reads = BACKEND_READS_HARDWARE,
     .flags = POOL, .help = "sim: tensor-parallel degree"},
    {"link", "link", FLAG_STR, AT(link), .def_str = "ib-400g", .reads = BACKEND_READS_HARDWARE,
     .flags = POOL, .help = "sim: KV transfer link preset"},
    {"payload", "payload", FLAG_STR, AT(payload), .def_str = "auto", .check = check_payload,
     .check_what = "auto, full, none or 1/N", .override_reads = BACKEND_READS_PAYLOAD,
     .flags = OVERRIDE,
     .help = "KV bytes stored and shipped: full, 1/N, none (auto: full for tiny, none for sim)"},
    {"time-scale", "time_scale", FLAG_DOUBLE, AT(time_scale), .def = 1.0, .min = 0, .max = 1e6,
     .reads = BACKEND_READS_HARDWARE, .flags = OVERRIDE,
     .help = "sim: wall seconds a step lasts per modelled second (0: no wait)"},
    {"mfu", "mfu", FLAG_STR, AT(mfu), .def_str = "auto", .check = check_fraction,
     .check_what = "auto or a number in (0, 1]", .reads = BACKEND_READS_HARDWARE, .flags = OVERRIDE,
     .help = "sim: achieved / peak FLOP/s" WK_AUTO_HELP_MFU},
    {"mbu", "mbu", FLAG_STR, AT(mbu), .def_str = "auto", .check = check_fraction,
     .check_what = "auto or a number in (0, 1]", .reads = BACKEND_READS_HARDWARE, .flags = OVERRIDE,
     .help = "sim: achieved / peak HBM bandwidth" WK_AUTO_HELP_MBU},
    {"step-overhead-ms", "step_overhead_ms", FLAG_STR, AT(step_overhead_ms), .def_str = "auto",
     .check = check_overhead, .check_what = "auto or a number of ms in [0, 1e6]",
     .reads = BACKEND_READS_HARDWARE, .flags = OVERRIDE,
     .help = "sim: fixed cost of every non-empty step, ms" WK_AUTO_HELP_OVERHEAD},
    {"kv-blocks", "kv_blocks", FLAG_INT, AT(kv_blocks), .min = 0, .max = INT_MAX, .flags = OVERRIDE,
     .help = "KV blocks in the pool (0: from --kv-memory, else 2048 for tiny, GPU HBM for sim)"},
    {"kv-memory", "kv_memory", FLAG_BYTES, AT(kv_memory), .conflicts = "kv-blocks", .flags = POOL,
     .help = "KV budget in bytes (full-precision blocks)"},
    {"block-size", "block_size", FLAG_INT, AT(block_size), .def = BH_DEFAULT_BLOCK_SIZE, .min = 1,
     .max = BH_MAX_BLOCK_SIZE, .help = "tokens per KV block"},
    {"kv-dtype", "kv_dtype", FLAG_CHOICE, AT(kv_dtype), .choices = dtype_choices, .flags = POOL,
     .help = "KV storage type (auto: f32 for tiny, bf16 for sim)"},
    {"max-running", "max_running", FLAG_INT, AT(max_running), .def = 64, .min = 1, .max = 65536,
     .flags = OVERRIDE, .help = "sequences holding KV at once"},
    {"token-budget", "token_budget", FLAG_INT, AT(token_budget), .min = 0, .max = 1 << 24,
     .flags = OVERRIDE, .help = "tokens per scheduler step (0: 128 for tiny, 2048 for sim)"},
    {"max-prefill-chunk", "max_prefill_chunk", FLAG_INT, AT(max_prefill_chunk), .min = 0,
     .max = 1 << 24, .flags = OVERRIDE,
     .help = "prompt tokens of one sequence per step (0: the token budget)"},
    {"scheduler", "scheduler", FLAG_CHOICE, AT(scheduler), .choices = sched_policy_names,
     .flags = OVERRIDE,
     .help = "step policy: chunked (decodes, then prefill chunks in the rest of the budget) or "
             "prefill-first (vLLM v0 without chunked prefill: whole prompts, else decodes; "
             "--token-budget 0 is then at least the context limit)"},
    {"max-waiting", "max_waiting", FLAG_INT, AT(max_waiting), .def = 256, .min = 0, .max = 1 << 20,
     .help = "requests queued beyond the running ones; more are answered Busy"},
    {"stream-interval", "stream_interval", FLAG_INT, AT(stream_interval), .def = 1, .min = 1,
     .max = 1024, .flags = WK_DECODE_ONLY,
     .help = "send a request's tokens to the router N at a time (the first at once, the rest "
             "no later than its finish): fewer messages and writes, the same bytes to the client"},
    {"heartbeat-ms", "heartbeat_ms", FLAG_INT, AT(heartbeat_ms), .def = 250, .min = 10, .max = 500,
     .help = "heartbeat period"},
    {"transfer-timeout-ms", "transfer_timeout_ms", FLAG_INT, AT(transfer_timeout_ms), .def = 30000,
     .min = 100, .max = 3600000,
     .help = "fail a KV transfer after this long without progress from its prefill worker"},
    {"seed", "seed", FLAG_INT, AT(seed), .min = 0, .max = INT_MAX,
     .help = "seeds requests that come without a seed"},
    {"log-level", "log_level", FLAG_CHOICE, AT(log_level), .def = LOG_LEVEL_INFO,
     .choices = log_level_names, .help = "log level"},
    {"kv-dump", NULL, FLAG_STR, AT(kv_dump),
     .help = "debug: append one line per KV block shipped or installed (request, index, hash, "
             "XXH3)"},
    {"colocated", NULL, FLAG_BOOL, AT(colocated), .flags = MANAGED | WK_DECODE_ONLY,
     .help = "take whole requests and prefill them here (no prefill worker)"},
};

const size_t wk_n_settings = sizeof(wk_settings) / sizeof(wk_settings[0]);

_Static_assert(sizeof(wk_settings) / sizeof(wk_settings[0]) <= SETTINGS_MAX,
               "a pool marks the settings it gives in a uint64_t");

#undef AT
#undef POOL
#undef OVERRIDE
#undef MANAGED

int wk_setting(const char *name)
{
    return settings_find(wk_settings, wk_n_settings, name);
}

void wk_config_defaults(struct worker_config *cfg)
{
    *cfg = (struct worker_config){0};
    settings_defaults(wk_settings, wk_n_settings, cfg);
}

int wk_config_parse(struct worker_config *cfg, int argc, char **argv, const char *binary,
                    int has_colocated, FILE *help_out, char *err, size_t errlen)
{
    struct flag flags[SETTINGS_MAX];
    wk_config_defaults(cfg);
    size_t n = settings_flags(wk_settings, wk_n_settings, has_colocated ? 0 : WK_DECODE_ONLY, cfg,
                              flags, SETTINGS_MAX);
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

static int make_backend(struct wk_core *core, const struct backend_desc *bd, char *err,
                        size_t errlen)
{
    const struct worker_config *c = &core->cfg;
    struct backend_params bp = {
        .model = c->model,
        .checkpoint = c->checkpoint,
        .tokenizer = c->tokenizer,
        .gpu = c->gpu,
        .tp = c->tp,
        .link = c->link,
        .time_scale = c->time_scale,
        .mfu = c->mfu,
        .mbu = c->mbu,
        .step_overhead_ms = c->step_overhead_ms,
    };
    return bd->create(&core->be, &bp, err, errlen);
}

static int pool_blocks(struct wk_core *core, const struct backend_desc *bd,
                       const struct kv_config *kc, int *out, char *err, size_t errlen)
{
    const struct worker_config *c = &core->cfg;
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
    int rc = bd->kv_capacity(core->be, kc->dtype, kc->block_size, &n, err, errlen);
    if (rc != 0) {
        return rc;
    }
    *out = n;
    return 0;
}

/* Tokens per step (sched_budget_for), with the context limit of the pool. */
static int sched_budget(const struct worker_config *c, const struct backend_desc *bd,
                        const struct model_info *mi, const struct kv_config *kc)
{
    int64_t pool = (int64_t)kc->n_blocks * kc->block_size;
    int ctx = pool < mi->max_context ? (int)pool : mi->max_context;
    int short_by;
    int budget = sched_budget_for((enum sched_policy)c->scheduler, c->token_budget,
                                  bd->default_token_budget, ctx, &short_by);
    if (short_by > 0) {
        LOG_WARN("worker",
                 "--token-budget %d < context limit %d with --scheduler %s: longer prompts are "
                 "refused",
                 budget, ctx, sched_policy_name((enum sched_policy)c->scheduler));
    }
    return budget;
}

int wk_engine_create(struct wk_core *core, char *err, size_t errlen)
{
    const struct worker_config *c = &core->cfg;
    const struct backend_desc *bd = backend_at((size_t)c->backend);
    int div;
    if (bd == NULL) {
        snprintf(err, errlen, "--backend: no backend %d", c->backend);
        return TANDEM_EINVAL;
    }
    if (wk_payload_parse(c->payload, &div) != 0) {
        snprintf(err, errlen, "--payload: '%s' is not full, none, auto or 1/N", c->payload);
        return TANDEM_EINVAL;
    }
    if (!(bd->reads & BACKEND_READS_PAYLOAD) && div != 0 && div != 1) {
        snprintf(err, errlen, "--payload %s: the %s backend needs the full KV bytes", c->payload,
                 bd->name);
        return TANDEM_EINVAL;
    }
    if (div == 0) {
        div = bd->default_payload_div;
    }
    int rc = make_backend(core, bd, err, errlen);
    if (rc != 0) {
        return rc;
    }
    const struct model_info *mi = &core->be->info;
    if (c->tokenizer != NULL) {
        rc = tok_load(&core->tok, c->tokenizer, mi->vocab_size);
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
    rc = pool_blocks(core, bd, &kc, &kc.n_blocks, err, errlen);
    if (rc != 0) {
        goto fail;
    }
    rc = kv_pool_create(&core->pool, &kc);
    if (rc != 0) {
        snprintf(err, errlen,
                 "KV pool of %d blocks x %zu bytes: %s (lower --kv-blocks or use --payload 1/N)",
                 kc.n_blocks, kv_config_block_bytes(&kc), tandem_strerror(rc));
        goto fail;
    }
#ifdef TANDEM_KV_CHECK
    core->kv_refs = calloc((size_t)kc.n_blocks, sizeof(*core->kv_refs));
    if (core->kv_refs == NULL) {
        snprintf(err, errlen, "KV check scratch of %d blocks: %s", kc.n_blocks,
                 tandem_strerror(TANDEM_ENOMEM));
        rc = TANDEM_ENOMEM;
        goto fail;
    }
    LOG_INFO("worker", "built with TANDEM_KV_CHECK: the KV cache is checked after every step "
                       "(a debug build; do not take timings from it)");
#endif
    int budget = sched_budget(c, bd, mi, &kc);
    struct sched_config sc = {
        .max_running = c->max_running,
        .token_budget = budget,
        .max_prefill_chunk = c->max_prefill_chunk > 0 ? c->max_prefill_chunk : budget,
        .block_size = c->block_size,
        .max_context = 0,
        .policy = (enum sched_policy)c->scheduler,
    };
    if (budget < c->max_running) {
        LOG_WARN("worker", "--token-budget %d < --max-running %d: not every decode runs every step",
                 budget, c->max_running);
    }
    struct sched_callbacks cb = core->role->sched;
    cb.arg = core;
    rc = sched_create(&core->sched, &sc, core->be, core->pool, &cb);
    if (rc != 0) {
        snprintf(err, errlen, "scheduler: %s", tandem_strerror(rc));
        goto fail;
    }
    core->root = bh_root(mi->name);
    core->block_size = c->block_size;
    core->dtype = kc.dtype;
    core->block_bytes = kv_block_bytes(core->pool);
    core->max_context = sched_max_context(core->sched);
    LOG_INFO("worker",
             "engine: %s backend, model %s, %d KV blocks of %d tokens (%s, %zu bytes each), "
             "context %d, max running %d, token budget %d, prefill chunk %d, scheduler %s",
             core->be->ops->name, mi->name, kc.n_blocks, kc.block_size, kv_dtype_name(kc.dtype),
             core->block_bytes, core->max_context, sc.max_running, sc.token_budget,
             sc.max_prefill_chunk, sched_policy_name(sc.policy));
    return 0;

fail:
    wk_engine_destroy(core);
    return rc;
}

void wk_engine_destroy(struct wk_core *core)
{
    sched_destroy(core->sched);
    core->sched = NULL;
    kv_pool_destroy(core->pool);
    core->pool = NULL;
    free(core->kv_refs);
    core->kv_refs = NULL;
    tok_destroy(core->tok);
    core->tok = NULL;
    if (core->be != NULL) {
        core->be->ops->destroy(core->be);
        core->be = NULL;
    }
}
