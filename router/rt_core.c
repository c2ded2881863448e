/* The router without its loop: see rt_core.h. */
#include "rt_core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block_hash.h"
#include "default_routing.h"
#include "http.h"
#include "log.h"
#include "auth.h"
#include "tls.h"
#include "presets.h"
#include "rt_apikey.h"
#include "tandem_err.h"

enum { HAVE_METRICS = 1 << 0, HAVE_DECLOG = 1 << 1, HAVE_DISPATCH = 1 << 2 };

void rt_opts_default(struct rt_opts *o)
{
    *o = (struct rt_opts){
        .host = HTTP_DEFAULT_HOST,
        .port = HTTP_DEFAULT_PORT,
        .announce = RT_DEFAULT_ANNOUNCE,
        .model = RT_DEFAULT_MODEL,
        .block_size = BH_DEFAULT_BLOCK_SIZE,
        .max_body = 4u << 20,
        .max_connections = 1024,
        .max_pending = RT_DEFAULT_MAX_PENDING,
        .retries = RT_DEFAULT_RETRIES,
        .log_level = LOG_LEVEL_INFO,
        .heartbeat_timeout_ms = RT_DEFAULT_HB_TIMEOUT,
        .request_timeout_ms = 30000,
        .idle_timeout_ms = 60000,
        .shutdown_drain_ms = RT_DEFAULT_SHUTDOWN_DRAIN_MS,
        .deadline_ms = RT_DEFAULT_DEADLINE_MS,
        .hold_timeout_ms = RT_DEFAULT_HOLD_MS,
        .forget_ms = RT_DEFAULT_FORGET_MS,
        .decisions = RT_DEFAULT_DECISIONS,
    };
}

size_t rt_opts_flags(struct rt_opts *o, struct rt_tls_files *tls, struct flag *f)
{
    size_t n = 0;
#define F(...) f[n++] = (struct flag){__VA_ARGS__}
    F("host", FLAG_STR, &o->host, "HTTP listen address (IPv4 or IPv6 literal)", 0, 0, NULL);
    F("port", FLAG_INT, &o->port, "HTTP port (0: any free port, printed on the READY line)", 0,
      65535, NULL);
    F("announce", FLAG_STR, &o->announce,
      "NNG address of the PULL0 socket workers started with --router announce themselves to "
      "(tcp://host:0: any free port; 'none': off)",
      0, 0, NULL);
    F("routing", FLAG_STR, &o->routing,
      "EndpointPickerConfig YAML (docs/routing.md; default: embedded P/D with precise "
      "prefix-cache, queue and active-request scorers, = deploy/routing/pd-prefix-based.yaml "
      "with mode: precise)",
      0, 0, NULL);
    F("workers", FLAG_STR, &o->workers,
      "comma-separated worker control addresses to dial (besides announced ones)", 0, 0, NULL);
    F("model", FLAG_STR, &o->model,
      "served model name; workers must serve it (also the block-hash root; a sim preset name "
      "sets the vocabulary and context)",
      0, 0, NULL);
    F("tokenizer", FLAG_STR, &o->tokenizer,
      "llama2.c tokenizer.bin (default: the byte-level tokenizer of the tiny model)", 0, 0, NULL);
    F("block-size", FLAG_INT, &o->block_size, "tokens per KV block (the workers' --block-size)", 1,
      1024, NULL);
    F("max-context", FLAG_INT, &o->max_context,
      "context limit in tokens (0: the smallest one the decode workers announce; 4096, or the "
      "sim preset's, before any)",
      0, 131072, NULL);
    F("max-body", FLAG_BYTES, &o->max_body, "largest request body (413 beyond)", 0, 0, NULL);
    F("max-connections", FLAG_INT, &o->max_connections, "open HTTP connections (503 beyond)", 1,
      1000000, NULL);
    F("max-pending", FLAG_INT, &o->max_pending,
      "requests queued in the router while every worker is busy (429 with Retry-After beyond)", 0,
      1000000, NULL);
    F("retries", FLAG_INT, &o->retries,
      "times a request lost on a worker is sent again (before or after its first token)", 0, 100,
      NULL);
    F("heartbeat-timeout-ms", FLAG_INT, &o->heartbeat_timeout_ms,
      "an endpoint is unhealthy after this long without a heartbeat", 50, 3600000, NULL);
    F("request-timeout-ms", FLAG_INT, &o->request_timeout_ms,
      "HTTP: a request must arrive whole within this long of its first byte (408)", 10, 3600000,
      NULL);
    F("idle-timeout-ms", FLAG_INT, &o->idle_timeout_ms,
      "HTTP: an idle keep-alive connection is closed after this long", 10, 86400000, NULL);
    F("shutdown-drain-ms", FLAG_INT, &o->shutdown_drain_ms,
      "on SIGTERM/SIGINT: no new connections; requests in flight may finish (and their bytes be "
      "sent) this long, then the rest end with 503 or their stream's end",
      0, 3600000, NULL);
    F("deadline-ms", FLAG_INT, &o->deadline_ms,
      "a generation still running after this long ends (504, or finish_reason abort)", 100,
      86400000, NULL);
    F("hold-timeout-ms", FLAG_INT, &o->hold_timeout_ms,
      "a request that finds no healthy endpoint of a role waits this long for one to join "
      "(queued with --max-pending, never past --deadline-ms), then 503 (0: 503 at once)",
      0, 86400000, NULL);
    F("forget-ms", FLAG_INT, &o->forget_ms, "an announced worker unreachable this long is removed",
      100, 86400000, NULL);
    F("decisions", FLAG_INT, &o->decisions, "decision records kept for GET /v1/decisions", 0,
      100000, NULL);
    F("seed", FLAG_INT, &o->seed, "seed of the pipeline's random choices (0: from the clock)", 0,
      2147483647, NULL);
    F("log-level", FLAG_CHOICE, &o->log_level, "log level (debug logs every decision as JSON)", 0,
      0, log_level_names);
    F(TLS_FLAG_CA, FLAG_STR, &tls->ca,
      "cluster CA certificate (PEM) for tls+tcp:// addresses (docs/multi-host.md)", 0, 0, NULL);
    F(TLS_FLAG_CERT, FLAG_STR, &tls->cert, "the router's certificate (PEM), signed by the CA", 0, 0,
      NULL);
    F(TLS_FLAG_KEY, FLAG_STR, &tls->key, "the router's private key (PEM)", 0, 0, NULL);
    F(AUTH_SECRET_FLAG, FLAG_STR, &o->cluster_secret_file,
      "file holding the cluster secret (16 to 4096 bytes): workers must prove it to register "
      "and to announce themselves (docs/reliability.md; default: $" AUTH_SECRET_ENV ", else none)",
      0, 0, NULL);
    F(RT_APIKEY_FLAG, FLAG_STR, &o->api_key,
      "API key every /v1 request must send as 'Authorization: Bearer KEY' (401 without; /health "
      "and /metrics stay open; docs/api.md). Seen by ps until read: prefer --" RT_APIKEY_FILE_FLAG
      " or $" RT_APIKEY_ENV,
      0, 0, NULL);
    F(RT_APIKEY_FILE_FLAG, FLAG_STR, &o->api_key_file,
      "file holding the API key (one line; default: $" RT_APIKEY_ENV
      " holds the key itself, else no key)",
      0, 0, NULL);
#undef F
    return n;
}

/* ---- Tokenizer ---------------------------------------------------------- */

/* Entries in a llama2.c tokenizer.bin: the file does not say, so count
 * (score, len, bytes) records to the end. Returns the count or an error. */
static int count_entries(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return errno == ENOENT ? TANDEM_ENOENT : TANDEM_EIO;
    }
    int32_t max_len;
    int n = 0, rc = 0;
    if (fread(&max_len, 4, 1, f) != 1) {
        rc = TANDEM_ETRUNCATED;
    }
    while (rc == 0) {
        float score;
        int32_t len;
        if (fread(&score, 4, 1, f) != 1) {
            break; /* the end */
        }
        if (fread(&len, 4, 1, f) != 1 || len < 0 || len > TOK_MAX_PIECE ||
            fseek(f, len, SEEK_CUR) != 0) {
            rc = TANDEM_EFORMAT;
            break;
        }
        if (++n > TOK_MAX_VOCAB) {
            rc = TANDEM_ETOOBIG;
        }
    }
    fclose(f);
    return rc != 0 ? rc : n;
}

static int open_tokenizer(struct rt_core *c, char *err, size_t errlen)
{
    const struct preset_model *pm = preset_model_find(c->opts.model); /* NULL: not a preset */
    if (pm != NULL) {
        c->preset_context = pm->max_context;
    }
    int rc;
    if (c->opts.tokenizer != NULL) {
        int n = count_entries(c->opts.tokenizer);
        rc = n < 0 ? n : tok_load(&c->tok, c->opts.tokenizer, n);
        if (rc != 0) {
            snprintf(err, errlen, "--tokenizer %s: %s", c->opts.tokenizer, tandem_strerror(rc));
            return rc == TANDEM_ENOMEM ? rc : TANDEM_EINVAL;
        }
    } else if (pm != NULL) {
        /* A sim model: byte-level text, ids up to its vocabulary. */
        rc = tok_create_bytes_n(&c->tok, pm->vocab_size);
    } else {
        rc = tok_create_bytes(&c->tok);
    }
    if (rc != 0) {
        snprintf(err, errlen, "tokenizer: %s", tandem_strerror(rc));
    }
    return rc;
}

/* ---- The dispatcher, wired to the parts and the host -------------------- */

static int core_send_job(void *arg, int ep, uint64_t id, const struct ctl_job *job)
{
    struct rt_core *c = arg;
    return c->host.send_job(c->host.arg, ep, id, job);
}

static int core_send_cancel(void *arg, int ep, uint64_t id)
{
    struct rt_core *c = arg;
    return c->host.send_cancel(c->host.arg, ep, id);
}

static double core_now(void *arg)
{
    struct rt_core *c = arg;
    return c->host.now(c->host.arg);
}

static void core_kick(void *arg)
{
    struct rt_core *c = arg;
    c->host.kick(c->host.arg);
}

static int core_max_context(void *arg)
{
    return rt_core_max_context(arg);
}

static void core_on_decision(void *arg, const struct rt_decision *dec)
{
    struct rt_core *c = arg;
    rt_declog_add(&c->declog, c->pl, dec);
}

static void core_on_cached(void *arg, uint64_t seq, int actual)
{
    struct rt_core *c = arg;
    rt_declog_actual(&c->declog, seq, actual);
}

static int dispatch_open(struct rt_core *c)
{
    struct rt_dispatch_deps deps = {
        .pl = c->pl,
        .tok = c->tok,
        .m = &c->m,
        .model = c->model,
        .root = c->root,
        .block_size = c->block_size,
        .uses_hashes = c->uses_hashes,
        .max_pending = c->opts.max_pending,
        .retries = c->opts.retries,
        .deadline_ms = c->opts.deadline_ms,
        .hold_ms = c->opts.hold_timeout_ms,
        .seed = c->host.dispatch_seed,
        .sink = c->host.sink,
        .arg = c,
        .send_job = core_send_job,
        .send_cancel = core_send_cancel,
        .now = core_now,
        .kick = core_kick,
        .max_context = core_max_context,
        .on_decision = core_on_decision,
        .on_cached = core_on_cached,
    };
    return rt_dispatch_init(&c->d, &deps);
}

/* ---- Open and close ----------------------------------------------------- */

int rt_core_max_context(const struct rt_core *c)
{
    if (c->opts.max_context > 0) {
        return c->opts.max_context;
    }
    int learned = c->host.learned_context != NULL ? c->host.learned_context(c->host.arg) : 0;
    if (learned > 0) {
        return learned;
    }
    return c->preset_context > 0 ? c->preset_context : RT_DEFAULT_MAX_CONTEXT;
}

int rt_core_open(struct rt_core *c, const struct rt_opts *o, const struct rt_core_host *h,
                 char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    c->opts = *o;
    c->host = *h;
    if (o->model == NULL || o->model[0] == '\0' || strlen(o->model) >= OA_MODEL_MAX) {
        snprintf(err, errlen, "--model: must be 1 to %d bytes", OA_MODEL_MAX - 1);
        return TANDEM_EINVAL;
    }
    int rc = rt_metrics_init(&c->m, o->model);
    if (rc != 0) {
        snprintf(err, errlen, "metrics: %s", tandem_strerror(rc));
        return rc;
    }
    c->have |= HAVE_METRICS;
    rc = open_tokenizer(c, err, errlen);
    if (rc != 0) {
        return rc;
    }
    struct rt_pipeline_opts po = {.seed = (uint64_t)o->seed};
    char perr[RT_ERR_MAX];
    if (o->routing_text != NULL) {
        rc = rt_pipeline_parse(&c->pl, o->routing_text, o->routing ? o->routing : "(routing)", &po,
                               perr, sizeof(perr));
    } else if (o->routing != NULL) {
        rc = rt_pipeline_load(&c->pl, o->routing, &po, perr, sizeof(perr));
    } else {
        rc = rt_pipeline_parse(&c->pl, rt_default_routing(), "(default routing)", &po, perr,
                               sizeof(perr));
    }
    if (rc != 0) {
        snprintf(err, errlen, "--routing: %s", perr);
        return rc == TANDEM_ENOMEM ? rc : TANDEM_ECONFIG;
    }
    c->uses_hashes = rt_pipeline_uses_hashes(c->pl);
    c->block_size = c->uses_hashes ? rt_pipeline_block_size(c->pl) : o->block_size;
    if (c->block_size != o->block_size) {
        snprintf(err, errlen,
                 "--routing: the prefix plugins hash %d-token blocks, --block-size is %d (they "
                 "must be the workers' KV block size)",
                 c->block_size, o->block_size);
        return TANDEM_ECONFIG;
    }
    c->root = bh_root(o->model);
    c->model.id = o->model;
    c->model.vocab_size = tok_vocab_size(c->tok);
    c->model.max_context = RT_DEFAULT_MAX_CONTEXT;
    c->model.created = (int64_t)time(NULL);
    rc = rt_declog_init(&c->declog, o->decisions);
    if (rc != 0) {
        snprintf(err, errlen, "decision log: %s", tandem_strerror(rc));
        return rc;
    }
    c->have |= HAVE_DECLOG;
    rc = dispatch_open(c);
    if (rc != 0) {
        snprintf(err, errlen, "dispatcher: %s", tandem_strerror(rc));
        return rc;
    }
    c->have |= HAVE_DISPATCH;
    return 0;
}

void rt_core_stop(struct rt_core *c)
{
    if (c->have & HAVE_DISPATCH) {
        rt_dispatch_close(&c->d);
    }
}

void rt_core_fini(struct rt_core *c)
{
    rt_pipeline_destroy(c->pl);
    c->pl = NULL;
    tok_destroy(c->tok);
    c->tok = NULL;
    if (c->have & HAVE_DECLOG) {
        rt_declog_fini(&c->declog);
    }
    if (c->have & HAVE_METRICS) {
        rt_metrics_fini(&c->m);
    }
    c->have = 0;
}
