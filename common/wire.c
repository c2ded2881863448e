#include "wire.h"
#include "tandem_err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- Failure detail ----------------------------------------------------- */

static _Thread_local char wire_detail[192];

static int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(wire_detail, sizeof(wire_detail), fmt, ap);
    va_end(ap);
    return code;
}

const char *wire_error_detail(void)
{
    return wire_detail;
}

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        int rv_ = (expr);                                                                          \
        if (rv_ != 0) {                                                                            \
            return rv_;                                                                            \
        }                                                                                          \
    } while (0)

/* ---- Allocators --------------------------------------------------------- */

/* protobuf-c sizes repeated fields from the input and allocates a struct per
 * sub-message, so 2 bytes on the wire can cost ~64 bytes of heap. The unpack
 * allocator therefore charges every allocation to a budget and fails once it
 * is spent; freeing is plain free(), so envelopes it produced are released by
 * wire_free's allocator (malloc/free) like any other. */
struct budget {
    size_t used;
    size_t limit;
    int over;
    int oom;
};

static void *budget_alloc(void *data, size_t size)
{
    struct budget *b = data;
    if (size > b->limit - b->used) {
        b->over = 1;
        return NULL;
    }
    void *p = malloc(size ? size : 1);
    if (p == NULL) {
        b->oom = 1;
        return NULL;
    }
    b->used += size;
    return p;
}

static void *plain_alloc(void *data, size_t size)
{
    (void)data;
    return malloc(size ? size : 1);
}

static void plain_free(void *data, void *p)
{
    (void)data;
    free(p);
}

static ProtobufCAllocator wire_allocator = {
    .alloc = plain_alloc,
    .free = plain_free,
    .allocator_data = NULL,
};

/* ---- Field checks ------------------------------------------------------- */

/* Field number 0 does not exist. protobuf-c 1.4 refuses its one-byte key but
 * accepts a longer encoding of it (0x80 0x00) as an unknown field, which it
 * would then pack as 0x00 and refuse to read back (found by fuzz/fuzz_kvframe).
 * Refused at any depth, so what unpack accepts packs into bytes a peer reads. */
static int v_no_field_zero(const ProtobufCMessage *m)
{
    for (unsigned i = 0; i < m->n_unknown_fields; i++) {
        if (m->unknown_fields[i].tag == 0) {
            return fail(TANDEM_EPROTO, "%s: field number 0", m->descriptor->short_name);
        }
    }
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE) {
            continue;
        }
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *sub = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t k = 0; k < n && sub != NULL; k++) {
                CHECK(v_no_field_zero(sub[k]));
            }
            continue;
        }
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(base + f->quantifier_offset) != f->id) {
            continue; /* another member of the oneof is set */
        }
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + f->offset);
        if (sub != NULL) {
            CHECK(v_no_field_zero(sub));
        }
    }
    return 0;
}

static int v_str(const char *what, const char *s, size_t max, int required)
{
    size_t n = s ? strnlen(s, max + 1) : 0;
    if (n > max) {
        return fail(TANDEM_ETOOBIG, "%s: longer than %zu bytes", what, max);
    }
    if (required && n == 0) {
        return fail(TANDEM_EPROTO, "%s: missing", what);
    }
    return 0;
}

/* A repeated field: n elements at ptr, at most max. */
static int v_rep(const char *what, size_t n, const void *ptr, size_t max)
{
    if (n > max) {
        return fail(TANDEM_ETOOBIG, "%s: %zu > %zu", what, n, max);
    }
    if (n > 0 && ptr == NULL) {
        return fail(TANDEM_EINVAL, "%s: %zu elements but no array", what, n);
    }
    return 0;
}

static int v_max(const char *what, uint64_t v, uint64_t max)
{
    if (v > max) {
        return fail(TANDEM_ETOOBIG, "%s: %llu > %llu", what, (unsigned long long)v,
                    (unsigned long long)max);
    }
    return 0;
}

static int v_nonzero(const char *what, uint64_t v)
{
    if (v == 0) {
        return fail(TANDEM_ERANGE, "%s: must be >= 1", what);
    }
    return 0;
}

static int v_enum(const char *what, int v, int lo, int hi)
{
    if (v < lo || v > hi) {
        return fail(TANDEM_ERANGE, "%s: unknown value %d", what, v);
    }
    return 0;
}

static int v_dtype(const char *what, int v)
{
    return v_enum(what, v, TANDEM__KV_DTYPE__KV_DTYPE_F32, TANDEM__KV_DTYPE__KV_DTYPE_FP8_E4M3);
}

static int v_top(const char *what, const Tandem__TopLogprobs *t)
{
    if (t == NULL) {
        return fail(TANDEM_EPROTO, "%s: missing", what);
    }
    CHECK(v_rep(what, t->n_token_ids, t->token_ids, WIRE_MAX_LOGPROBS));
    CHECK(v_rep(what, t->n_logprobs, t->logprobs, WIRE_MAX_LOGPROBS));
    if (t->n_logprobs != t->n_token_ids) {
        return fail(TANDEM_EPROTO, "%s: %zu token ids but %zu logprobs", what, t->n_token_ids,
                    t->n_logprobs);
    }
    return 0;
}

/* logprobs[] and top[] beside n positions: each empty or one per position. */
static int v_logprob_arrays(const char *what, size_t n, size_t n_logprobs, const float *logprobs,
                            size_t n_top, Tandem__TopLogprobs *const *top)
{
    CHECK(v_rep(what, n_logprobs, logprobs, WIRE_MAX_CHUNK_TOKENS));
    CHECK(v_rep(what, n_top, top, WIRE_MAX_CHUNK_TOKENS));
    if (n_logprobs != 0 && n_logprobs != n) {
        return fail(TANDEM_EPROTO, "%s: %zu logprobs for %zu positions", what, n_logprobs, n);
    }
    if (n_top != 0 && n_top != n) {
        return fail(TANDEM_EPROTO, "%s: %zu top logprobs for %zu positions", what, n_top, n);
    }
    for (size_t i = 0; i < n_top; i++) {
        CHECK(v_top(what, top[i]));
    }
    return 0;
}

static int v_sampling(const char *what, const Tandem__SamplingParams *s)
{
    if (s == NULL) {
        return fail(TANDEM_EPROTO, "%s.sampling: missing", what);
    }
    /* Written so that NaN fails every comparison. */
    if (!(s->temperature >= 0.0f) || isinf(s->temperature)) {
        return fail(TANDEM_ERANGE, "%s.sampling.temperature: %g not finite and >= 0", what,
                    (double)s->temperature);
    }
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f)) {
        return fail(TANDEM_ERANGE, "%s.sampling.top_p: %g not in (0, 1]", what, (double)s->top_p);
    }
    CHECK(v_rep("sampling.stop_token_ids", s->n_stop_token_ids, s->stop_token_ids,
                WIRE_MAX_STOP_IDS));
    CHECK(v_max("sampling.logprobs", s->logprobs, WIRE_MAX_LOGPROBS));
    if (s->optional_seed_case != TANDEM__SAMPLING_PARAMS__OPTIONAL_SEED__NOT_SET &&
        s->optional_seed_case != TANDEM__SAMPLING_PARAMS__OPTIONAL_SEED_SEED) {
        return fail(TANDEM_EPROTO, "%s.sampling.seed: bad presence case", what);
    }
    return 0;
}

/* ---- Per-kind validators ------------------------------------------------ */

/* Cluster secret fields (common/auth.h): empty, or min..max bytes. */
static int v_auth_bytes(const char *what, const ProtobufCBinaryData *b, size_t min, size_t max)
{
    if (b->len != 0 && (b->len < min || b->len > max)) {
        return fail(b->len > max ? TANDEM_ETOOBIG : TANDEM_EPROTO, "%s: %zu bytes (0 or %zu..%zu)",
                    what, b->len, min, max);
    }
    return 0;
}

static int v_auth(const Tandem__Auth *a)
{
    CHECK(v_auth_bytes("auth.nonce", &a->nonce, WIRE_AUTH_NONCE_MIN, WIRE_AUTH_NONCE_MAX));
    CHECK(v_auth_bytes("auth.proof", &a->proof, WIRE_AUTH_TAG_BYTES, WIRE_AUTH_TAG_BYTES));
    if (a->nonce.len == 0 && a->proof.len == 0) {
        return fail(TANDEM_EPROTO, "auth: neither nonce nor proof");
    }
    return 0;
}

static int v_hello(const Tandem__WorkerHello *h)
{
    CHECK(v_str("hello.worker_id", h->worker_id, WIRE_MAX_NAME_BYTES, 1));
    CHECK(v_enum("hello.role", h->role, TANDEM__WORKER_HELLO__ROLE__PREFILL,
                 TANDEM__WORKER_HELLO__ROLE__COLOCATED));
    CHECK(v_str("hello.control_address", h->control_address, WIRE_MAX_ADDR_BYTES, 1));
    CHECK(v_str("hello.kv_address", h->kv_address, WIRE_MAX_ADDR_BYTES,
                h->role != TANDEM__WORKER_HELLO__ROLE__COLOCATED));
    CHECK(v_str("hello.metrics_address", h->metrics_address, WIRE_MAX_ADDR_BYTES, 0));
    CHECK(v_str("hello.model", h->model, WIRE_MAX_NAME_BYTES, 1));
    CHECK(v_nonzero("hello.block_size", h->block_size));
    CHECK(v_max("hello.block_size", h->block_size, WIRE_MAX_BLOCK_TOKENS));
    CHECK(v_dtype("hello.kv_dtype", h->kv_dtype));
    CHECK(v_nonzero("hello.kv_blocks_total", h->kv_blocks_total));
    CHECK(v_nonzero("hello.max_running_seqs", h->max_running_seqs));
    CHECK(v_nonzero("hello.max_context", h->max_context));
    CHECK(v_max("hello.max_context", h->max_context, WIRE_MAX_TOKENS));
    CHECK(
        v_auth_bytes("hello.auth_proof", &h->auth_proof, WIRE_AUTH_TAG_BYTES, WIRE_AUTH_TAG_BYTES));
    return 0;
}

static int v_heartbeat(const Tandem__Heartbeat *h)
{
    return v_str("heartbeat.worker_id", h->worker_id, WIRE_MAX_NAME_BYTES, 1);
}

static int v_decode_job(const Tandem__DecodeJob *j)
{
    CHECK(v_rep("decode_job.prompt_token_ids", j->n_prompt_token_ids, j->prompt_token_ids,
                WIRE_MAX_TOKENS));
    if (j->n_prompt_token_ids == 0) {
        return fail(TANDEM_EPROTO, "decode_job.prompt_token_ids: empty");
    }
    CHECK(v_rep("decode_job.generated_token_ids", j->n_generated_token_ids, j->generated_token_ids,
                WIRE_MAX_TOKENS - j->n_prompt_token_ids));
    CHECK(v_nonzero("decode_job.max_tokens", j->max_tokens));
    CHECK(v_max("decode_job.max_tokens", j->max_tokens, WIRE_MAX_TOKENS));
    if (j->n_generated_token_ids >= j->max_tokens) {
        return fail(TANDEM_ERANGE, "decode_job: %zu generated tokens, max_tokens %u",
                    j->n_generated_token_ids, j->max_tokens);
    }
    CHECK(v_sampling("decode_job", j->sampling));
    CHECK(v_str("decode_job.prefill_address", j->prefill_address, WIRE_MAX_ADDR_BYTES, 0));
    return 0;
}

static int v_prefill_job(const Tandem__PrefillJob *j)
{
    CHECK(v_rep("prefill_job.prompt_token_ids", j->n_prompt_token_ids, j->prompt_token_ids,
                WIRE_MAX_TOKENS));
    if (j->n_prompt_token_ids == 0) {
        return fail(TANDEM_EPROTO, "prefill_job.prompt_token_ids: empty");
    }
    if (j->skip_blocks > j->n_prompt_token_ids) {
        return fail(TANDEM_ERANGE, "prefill_job.skip_blocks: %u blocks of a %zu-token prompt",
                    j->skip_blocks, j->n_prompt_token_ids);
    }
    CHECK(v_str("prefill_job.decode_kv_address", j->decode_kv_address, WIRE_MAX_ADDR_BYTES, 1));
    CHECK(v_sampling("prefill_job", j->sampling));
    return 0;
}

static int v_kv_frame(const Tandem__KvFrameHeader *h)
{
    CHECK(v_max("kv_frame.block_index", h->block_index, WIRE_MAX_TOKENS - 1));
    CHECK(v_nonzero("kv_frame.layer_count", h->layer_count));
    CHECK(v_max("kv_frame.first_layer + layer_count", (uint64_t)h->first_layer + h->layer_count,
                WIRE_MAX_LAYERS));
    CHECK(v_nonzero("kv_frame.token_count", h->token_count));
    CHECK(v_max("kv_frame.token_count", h->token_count, WIRE_MAX_BLOCK_TOKENS));
    CHECK(v_dtype("kv_frame.dtype", h->dtype));
    CHECK(v_max("kv_frame.payload_length", h->payload_length, WIRE_MAX_KV_PAYLOAD_BYTES));
    return 0;
}

static int v_prefill_done(const Tandem__PrefillDone *d)
{
    if (d->first_top_logprobs != NULL) {
        CHECK(v_top("prefill_done.first_top_logprobs", d->first_top_logprobs));
    }
    CHECK(v_max("prefill_done.blocks_sent", d->blocks_sent, WIRE_MAX_TOKENS));
    CHECK(v_max("prefill_done.cached_tokens", d->cached_tokens, WIRE_MAX_TOKENS));
    return 0;
}

static int v_token_chunk(const Tandem__TokenChunk *c)
{
    CHECK(v_rep("token_chunk.token_ids", c->n_token_ids, c->token_ids, WIRE_MAX_CHUNK_TOKENS));
    if (c->n_token_ids == 0) {
        return fail(TANDEM_EPROTO, "token_chunk.token_ids: empty");
    }
    CHECK(v_max("token_chunk.first_index + tokens", (uint64_t)c->first_index + c->n_token_ids,
                WIRE_MAX_TOKENS));
    return v_logprob_arrays("token_chunk", c->n_token_ids, c->n_logprobs, c->logprobs,
                            c->n_top_logprobs, c->top_logprobs);
}

static int v_prompt_logprobs(const Tandem__PromptLogprobs *p)
{
    CHECK(v_rep("prompt_logprobs.logprobs", p->n_logprobs, p->logprobs, WIRE_MAX_CHUNK_TOKENS));
    if (p->n_logprobs == 0) {
        return fail(TANDEM_EPROTO, "prompt_logprobs.logprobs: empty");
    }
    CHECK(v_nonzero("prompt_logprobs.first_index", p->first_index));
    CHECK(v_max("prompt_logprobs.first_index + positions", (uint64_t)p->first_index + p->n_logprobs,
                WIRE_MAX_TOKENS));
    return v_logprob_arrays("prompt_logprobs", p->n_logprobs, p->n_logprobs, p->logprobs,
                            p->n_top_logprobs, p->top_logprobs);
}

static int v_finish(const Tandem__Finish *f)
{
    CHECK(v_enum("finish.reason", f->reason, TANDEM__FINISH__REASON__LENGTH,
                 TANDEM__FINISH__REASON__ABORT));
    if (f->usage == NULL) {
        return fail(TANDEM_EPROTO, "finish.usage: missing");
    }
    CHECK(v_max("finish.usage.prompt_tokens", f->usage->prompt_tokens, WIRE_MAX_TOKENS));
    CHECK(v_max("finish.usage.completion_tokens", f->usage->completion_tokens, WIRE_MAX_TOKENS));
    CHECK(v_max("finish.usage.cached_tokens", f->usage->cached_tokens, WIRE_MAX_TOKENS));
    if (f->last_tokens != NULL) {
        CHECK(v_token_chunk(f->last_tokens));
    }
    return 0;
}

static int v_cancel(const Tandem__Cancel *c)
{
    (void)c;
    return 0;
}

static int v_error(const Tandem__Error *e)
{
    if (e->code >= 0) {
        return fail(TANDEM_ERANGE, "error.code: %d is not a TANDEM_E* code", (int)e->code);
    }
    return v_str("error.message", e->message, WIRE_MAX_TEXT_BYTES, 0);
}

static int v_kv_events(const Tandem__KvEvents *k)
{
    CHECK(v_str("kv_events.worker_id", k->worker_id, WIRE_MAX_NAME_BYTES, 1));
    CHECK(v_rep("kv_events.events", k->n_events, k->events, WIRE_MAX_EVENTS));
    if (k->n_events == 0) {
        return fail(TANDEM_EPROTO, "kv_events.events: empty");
    }
    size_t hashes = 0;
    for (size_t i = 0; i < k->n_events; i++) {
        const Tandem__KvEvent *e = k->events[i];
        if (e == NULL) {
            return fail(TANDEM_EPROTO, "kv_events.events[%zu]: missing", i);
        }
        CHECK(v_enum("kv_events.events.kind", e->kind, TANDEM__KV_EVENT__KIND__STORED,
                     TANDEM__KV_EVENT__KIND__ALL_CLEARED));
        CHECK(v_rep("kv_events.events.block_hashes", e->n_block_hashes, e->block_hashes,
                    WIRE_MAX_EVENT_HASHES));
        hashes += e->n_block_hashes;
        CHECK(v_max("kv_events block hashes", hashes, WIRE_MAX_EVENT_HASHES));
        int has_parent = e->optional_parent_case != TANDEM__KV_EVENT__OPTIONAL_PARENT__NOT_SET;
        if (e->kind == TANDEM__KV_EVENT__KIND__ALL_CLEARED) {
            if (e->n_block_hashes != 0 || has_parent) {
                return fail(TANDEM_EPROTO, "kv_events.events[%zu]: ALL_CLEARED with hashes", i);
            }
        } else if (e->n_block_hashes == 0) {
            return fail(TANDEM_EPROTO, "kv_events.events[%zu]: no block hashes", i);
        } else if (has_parent && e->kind != TANDEM__KV_EVENT__KIND__STORED) {
            return fail(TANDEM_EPROTO, "kv_events.events[%zu]: parent hash on REMOVED", i);
        }
    }
    return 0;
}

static int v_busy(const Tandem__Busy *b)
{
    CHECK(v_enum("busy.reason", b->reason, TANDEM__BUSY__REASON__NO_KV_BLOCKS,
                 TANDEM__BUSY__REASON__PREFILL_UNAVAILABLE));
    return v_str("busy.detail", b->detail, WIRE_MAX_TEXT_BYTES, 0);
}

static int v_batch(const Tandem__Batch *b)
{
    if (b->n_envelopes == 0) {
        return fail(TANDEM_EPROTO, "batch: no envelopes");
    }
    if (b->n_envelopes > WIRE_MAX_BATCH) {
        return fail(TANDEM_ETOOBIG, "batch: %zu envelopes > %u", b->n_envelopes, WIRE_MAX_BATCH);
    }
    for (size_t i = 0; i < b->n_envelopes; i++) {
        if (b->envelopes[i].len == 0) {
            return fail(TANDEM_EPROTO, "batch.envelopes[%zu]: empty", i);
        }
    }
    return 0;
}

/* ---- Kind table --------------------------------------------------------- */

enum scope { SCOPE_WORKER, SCOPE_REQUEST, SCOPE_ANY };

/* X(KIND, oneof member, request id scope, validator). The oneof case of
 * member m is TANDEM__ENVELOPE__BODY_<KIND> because members are named after
 * the kinds. */
#define WIRE_KINDS(X)                                                                              \
    X(HELLO, hello, SCOPE_WORKER, v_hello)                                                         \
    X(HEARTBEAT, heartbeat, SCOPE_WORKER, v_heartbeat)                                             \
    X(DECODE_JOB, decode_job, SCOPE_REQUEST, v_decode_job)                                         \
    X(PREFILL_JOB, prefill_job, SCOPE_REQUEST, v_prefill_job)                                      \
    X(KV_FRAME, kv_frame, SCOPE_REQUEST, v_kv_frame)                                               \
    X(PREFILL_DONE, prefill_done, SCOPE_REQUEST, v_prefill_done)                                   \
    X(TOKEN_CHUNK, token_chunk, SCOPE_REQUEST, v_token_chunk)                                      \
    X(FINISH, finish, SCOPE_REQUEST, v_finish)                                                     \
    X(CANCEL, cancel, SCOPE_REQUEST, v_cancel)                                                     \
    X(ERROR, error, SCOPE_ANY, v_error)                                                            \
    X(KV_EVENTS, kv_events, SCOPE_WORKER, v_kv_events)                                             \
    X(BUSY, busy, SCOPE_REQUEST, v_busy)                                                           \
    X(PROMPT_LOGPROBS, prompt_logprobs, SCOPE_REQUEST, v_prompt_logprobs)                          \
    X(AUTH, auth, SCOPE_WORKER, v_auth)                                                            \
    X(BATCH, batch, SCOPE_WORKER, v_batch)

const char *wire_kind_name(int kind)
{
    switch (kind) {
#define X(K, m, sc, v)                                                                             \
    case TANDEM__ENVELOPE__KIND__##K:                                                              \
        return #m;
        WIRE_KINDS(X)
#undef X
    default:
        return "unknown";
    }
}

int wire_env_init(Tandem__Envelope *env, Tandem__Envelope__Kind kind, uint64_t request_id,
                  void *body)
{
    if (env == NULL || body == NULL) {
        return fail(TANDEM_EINVAL, "wire_env_init: NULL argument");
    }
    tandem__envelope__init(env);
    env->version = WIRE_VERSION;
    env->kind = kind;
    env->request_id = request_id;
    switch (kind) {
#define X(K, m, sc, v)                                                                             \
    case TANDEM__ENVELOPE__KIND__##K:                                                              \
        env->body_case = TANDEM__ENVELOPE__BODY_##K;                                               \
        env->m = body;                                                                             \
        return 0;
        WIRE_KINDS(X)
#undef X
    default:
        return fail(TANDEM_EPROTO, "wire_env_init: unknown kind %d", (int)kind);
    }
}

/* The links an envelope may be on (validate's links): KV_FRAME is only for
 * a data link, BATCH only for a control link. */
#define ON_CONTROL 1u
#define ON_DATA    2u
#define ON_ANY     (ON_CONTROL | ON_DATA)

static int validate(const Tandem__Envelope *env, unsigned links)
{
    if (env == NULL) {
        return fail(TANDEM_EINVAL, "NULL envelope");
    }
    if (env->version != WIRE_VERSION) {
        return fail(TANDEM_EVERSION, "version %u, this build speaks %d", env->version,
                    WIRE_VERSION);
    }
    CHECK(v_no_field_zero(&env->base));
    enum scope scope;
    int rv;
    switch (env->kind) {
#define X(K, m, sc, v)                                                                             \
    case TANDEM__ENVELOPE__KIND__##K:                                                              \
        if (env->body_case != TANDEM__ENVELOPE__BODY_##K || env->m == NULL) {                      \
            return fail(TANDEM_EPROTO, "kind %s but body case %d", #m, (int)env->body_case);       \
        }                                                                                          \
        scope = sc;                                                                                \
        rv = v(env->m);                                                                            \
        break;
        WIRE_KINDS(X)
#undef X
    default:
        return fail(TANDEM_EPROTO, "unknown kind %d", (int)env->kind);
    }
    if (rv != 0) {
        return rv;
    }
    if (scope == SCOPE_REQUEST && env->request_id == 0) {
        return fail(TANDEM_EPROTO, "%s: request id 0", wire_kind_name(env->kind));
    }
    if (scope == SCOPE_WORKER && env->request_id != 0) {
        return fail(TANDEM_EPROTO, "%s: request id %llu on a worker-scoped message",
                    wire_kind_name(env->kind), (unsigned long long)env->request_id);
    }
    if (!(links & ON_DATA) && env->kind == TANDEM__ENVELOPE__KIND__KV_FRAME) {
        return fail(TANDEM_EPROTO, "kv_frame outside a data-link frame");
    }
    if (!(links & ON_CONTROL) && env->kind == TANDEM__ENVELOPE__KIND__BATCH) {
        return fail(TANDEM_EPROTO, "batch outside a control link");
    }
    CHECK(v_auth_bytes("auth_tag", &env->auth_tag, WIRE_AUTH_TAG_BYTES, WIRE_AUTH_TAG_BYTES));
    return 0;
}

int wire_validate(const Tandem__Envelope *env)
{
    return validate(env, ON_ANY);
}

/* ---- Envelope pack / unpack --------------------------------------------- */

/* Validates and sizes env for sending; *n is its packed size. */
static int prepare(const Tandem__Envelope *env, unsigned links, size_t *n)
{
    CHECK(validate(env, links));
    *n = tandem__envelope__get_packed_size(env);
    if (*n > WIRE_MAX_MSG_BYTES) {
        return fail(TANDEM_ETOOBIG, "envelope of %zu bytes > %u", *n, WIRE_MAX_MSG_BYTES);
    }
    return 0;
}

int wire_pack(const Tandem__Envelope *env, void *buf, size_t cap, size_t *len)
{
    if (len == NULL || (buf == NULL && cap > 0)) {
        return fail(TANDEM_EINVAL, "wire_pack: NULL argument");
    }
    size_t n;
    CHECK(prepare(env, ON_CONTROL, &n));
    if (n > cap) {
        return fail(TANDEM_ETOOBIG, "envelope of %zu bytes, buffer of %zu", n, cap);
    }
    tandem__envelope__pack(env, buf);
    *len = n;
    return 0;
}

int wire_pack_msg(const Tandem__Envelope *env, nng_msg **out)
{
    if (out == NULL) {
        return fail(TANDEM_EINVAL, "wire_pack_msg: NULL argument");
    }
    *out = NULL;
    size_t n;
    CHECK(prepare(env, ON_CONTROL, &n));
    nng_msg *msg;
    int rv = nng_msg_alloc(&msg, n);
    if (rv != 0) {
        return wire_nng_err(rv);
    }
    tandem__envelope__pack(env, nng_msg_body(msg));
    *out = msg;
    return 0;
}

static int read_varint(const uint8_t *p, size_t len, size_t *pos, uint64_t *v)
{
    uint64_t r = 0;
    for (unsigned i = 0; i < 10; i++) {
        if (*pos >= len) {
            return TANDEM_ETRUNCATED;
        }
        uint8_t b = p[(*pos)++];
        r |= (uint64_t)(b & 0x7f) << (7 * i);
        if ((b & 0x80) == 0) {
            *v = r;
            return 0;
        }
    }
    return TANDEM_EPROTO;
}

/* Walks the top-level fields of a packed Envelope (skipping bodies whole) to
 * find field 1, the version, before protobuf-c decodes anything: whatever a
 * future version does to the rest of the layout, its peers get EVERSION, not
 * a decode error. */
static int scan_version(const uint8_t *p, size_t len)
{
    size_t pos = 0;
    uint64_t version = 0;
    int seen = 0;
    int rv = 0;
    while (pos < len && rv == 0) {
        uint64_t key;
        uint64_t v;
        rv = read_varint(p, len, &pos, &key);
        if (rv != 0) {
            break;
        }
        uint64_t field = key >> 3;
        unsigned type = (unsigned)(key & 7);
        if (field == 0 || field > 0x1fffffff || (field == 1 && type != 0)) {
            rv = TANDEM_EPROTO;
            break;
        }
        switch (type) {
        case 0: /* varint */
            rv = read_varint(p, len, &pos, &v);
            if (rv == 0 && field == 1) {
                version = v;
                seen = 1;
            }
            break;
        case 1: /* 64-bit */
            rv = len - pos < 8 ? TANDEM_ETRUNCATED : 0;
            pos += rv == 0 ? 8 : 0;
            break;
        case 2: /* length-delimited */
            rv = read_varint(p, len, &pos, &v);
            if (rv == 0) {
                rv = v > len - pos ? TANDEM_ETRUNCATED : 0;
                pos += rv == 0 ? (size_t)v : 0;
            }
            break;
        case 5: /* 32-bit */
            rv = len - pos < 4 ? TANDEM_ETRUNCATED : 0;
            pos += rv == 0 ? 4 : 0;
            break;
        default: /* groups (3, 4) are not used by proto3; 6, 7 do not exist */
            rv = TANDEM_EPROTO;
            break;
        }
    }
    if (seen && version != WIRE_VERSION) {
        return fail(TANDEM_EVERSION, "version %llu, this build speaks %d",
                    (unsigned long long)version, WIRE_VERSION);
    }
    if (rv != 0) {
        return fail(rv, "envelope: %s at byte %zu", rv == TANDEM_ETRUNCATED ? "cut" : "bad field",
                    pos);
    }
    if (!seen) {
        return fail(TANDEM_EVERSION, "envelope without a version");
    }
    return 0;
}

static int unpack_env(const uint8_t *p, size_t len, unsigned links, Tandem__Envelope **out)
{
    *out = NULL;
    if (len == 0) {
        return fail(TANDEM_ETRUNCATED, "empty envelope");
    }
    if (len > WIRE_MAX_MSG_BYTES) {
        return fail(TANDEM_ETOOBIG, "envelope of %zu bytes > %u", len, WIRE_MAX_MSG_BYTES);
    }
    CHECK(scan_version(p, len));
    struct budget b = {.used = 0, .limit = WIRE_MAX_DECODED_BYTES};
    ProtobufCAllocator a = {.alloc = budget_alloc, .free = plain_free, .allocator_data = &b};
    Tandem__Envelope *env = tandem__envelope__unpack(&a, len, p);
    if (env == NULL) {
        if (b.oom) {
            return fail(TANDEM_ENOMEM, "out of memory decoding %zu bytes", len);
        }
        if (b.over) {
            return fail(TANDEM_ETOOBIG, "decoding %zu bytes needs more than %u bytes of heap", len,
                        WIRE_MAX_DECODED_BYTES);
        }
        return fail(TANDEM_EPROTO, "malformed protobuf (%zu bytes)", len);
    }
    int rv = validate(env, links);
    if (rv != 0) {
        wire_free(env);
        return rv;
    }
    *out = env;
    return 0;
}

int wire_unpack(const void *buf, size_t len, Tandem__Envelope **out)
{
    if (out == NULL || (buf == NULL && len > 0)) {
        return fail(TANDEM_EINVAL, "wire_unpack: NULL argument");
    }
    return unpack_env(buf, len, ON_CONTROL, out);
}

int wire_unpack_item(const Tandem__Envelope *batch, size_t i, Tandem__Envelope **out)
{
    if (out == NULL || batch == NULL || batch->kind != TANDEM__ENVELOPE__KIND__BATCH ||
        batch->batch == NULL || i >= batch->batch->n_envelopes) {
        return fail(TANDEM_EINVAL, "wire_unpack_item: not item %zu of a batch", i);
    }
    const ProtobufCBinaryData *b = &batch->batch->envelopes[i];
    CHECK(unpack_env(b->data, b->len, ON_CONTROL, out));
    if ((*out)->kind == TANDEM__ENVELOPE__KIND__BATCH) {
        wire_free(*out);
        *out = NULL;
        return fail(TANDEM_EPROTO, "batch.envelopes[%zu]: a batch inside a batch", i);
    }
    return 0;
}

int wire_batch_pack_msg(nng_msg *const *msgs, size_t n, nng_msg **out)
{
    if (out == NULL || (msgs == NULL && n > 0)) {
        return fail(TANDEM_EINVAL, "wire_batch_pack_msg: NULL argument");
    }
    *out = NULL;
    if (n > WIRE_MAX_BATCH) {
        return fail(TANDEM_ETOOBIG, "batch: %zu envelopes > %u", n, WIRE_MAX_BATCH);
    }
    ProtobufCBinaryData items[WIRE_MAX_BATCH];
    for (size_t i = 0; i < n; i++) {
        items[i].len = nng_msg_len(msgs[i]);
        items[i].data = nng_msg_body(msgs[i]);
    }
    Tandem__Batch b = TANDEM__BATCH__INIT;
    b.n_envelopes = n;
    b.envelopes = items;
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__BATCH, 0, &b);
    return wire_pack_msg(&env, out);
}

void wire_free(Tandem__Envelope *env)
{
    if (env != NULL) {
        tandem__envelope__free_unpacked(env, &wire_allocator);
    }
}

/* ---- Frames ------------------------------------------------------------- */

static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t checksum(const void *payload, size_t len)
{
    return XXH3_64bits(len > 0 ? payload : "", len);
}

/* Copies env into *e (and a KV_FRAME header into *h, with payload_length and
 * checksum filled in) and sizes the frame. Validates when asked. */
static int frame_prepare(const Tandem__Envelope *env, const void *payload, size_t payload_len,
                         int check, Tandem__Envelope *e, Tandem__KvFrameHeader *h, size_t *env_len)
{
    if (env == NULL || (payload == NULL && payload_len > 0)) {
        return fail(TANDEM_EINVAL, "frame: NULL argument");
    }
    *e = *env;
    if (env->kind == TANDEM__ENVELOPE__KIND__KV_FRAME &&
        env->body_case == TANDEM__ENVELOPE__BODY_KV_FRAME && env->kv_frame != NULL) {
        if (payload_len > WIRE_MAX_KV_PAYLOAD_BYTES) {
            return fail(TANDEM_ETOOBIG, "kv_frame.payload_length: %zu > %u", payload_len,
                        WIRE_MAX_KV_PAYLOAD_BYTES);
        }
        *h = *env->kv_frame;
        h->payload_length = payload_len;
        /* Sizing only: any non-zero checksum packs to the same 9 bytes. */
        h->checksum = check ? checksum(payload, payload_len) : UINT64_MAX;
        e->kv_frame = h;
    } else if (payload_len > 0) {
        return fail(TANDEM_EINVAL, "frame: payload on a %s", wire_kind_name(env->kind));
    }
    if (check) {
        return prepare(e, ON_DATA, env_len);
    }
    *env_len = tandem__envelope__get_packed_size(e);
    return 0;
}

int wire_frame_size(const Tandem__Envelope *env, size_t payload_len, size_t *size)
{
    Tandem__Envelope e;
    Tandem__KvFrameHeader h;
    size_t n = 0; /* set by frame_prepare; gcc -O3 cannot see through it */
    static const uint8_t none[1];
    if (size == NULL) {
        return fail(TANDEM_EINVAL, "wire_frame_size: NULL argument");
    }
    /* Sizing reads no payload bytes; any non-NULL pointer will do. */
    CHECK(frame_prepare(env, none, payload_len, 0, &e, &h, &n));
    *size = WIRE_FRAME_PREFIX_BYTES + n + payload_len;
    return 0;
}

static void frame_write(uint8_t *dst, const Tandem__Envelope *e, size_t n, const void *payload,
                        size_t payload_len)
{
    put_le32(dst, (uint32_t)n);
    tandem__envelope__pack(e, dst + WIRE_FRAME_PREFIX_BYTES);
    if (payload_len > 0) {
        memcpy(dst + WIRE_FRAME_PREFIX_BYTES + n, payload, payload_len);
    }
}

int wire_frame_pack(const Tandem__Envelope *env, const void *payload, size_t payload_len, void *buf,
                    size_t cap, size_t *len)
{
    Tandem__Envelope e;
    Tandem__KvFrameHeader h;
    size_t n = 0; /* set by frame_prepare; gcc -O3 cannot see through it */
    if (len == NULL || (buf == NULL && cap > 0)) {
        return fail(TANDEM_EINVAL, "wire_frame_pack: NULL argument");
    }
    CHECK(frame_prepare(env, payload, payload_len, 1, &e, &h, &n));
    size_t total = WIRE_FRAME_PREFIX_BYTES + n + payload_len;
    if (total > cap) {
        return fail(TANDEM_ETOOBIG, "frame of %zu bytes, buffer of %zu", total, cap);
    }
    frame_write(buf, &e, n, payload, payload_len);
    *len = total;
    return 0;
}

int wire_frame_pack_msg(const Tandem__Envelope *env, const void *payload, size_t payload_len,
                        nng_msg **out)
{
    Tandem__Envelope e;
    Tandem__KvFrameHeader h;
    size_t n = 0; /* set by frame_prepare; gcc -O3 cannot see through it */
    nng_msg *msg;
    if (out == NULL) {
        return fail(TANDEM_EINVAL, "wire_frame_pack_msg: NULL argument");
    }
    *out = NULL;
    CHECK(frame_prepare(env, payload, payload_len, 1, &e, &h, &n));
    int rv = nng_msg_alloc(&msg, WIRE_FRAME_PREFIX_BYTES + n + payload_len);
    if (rv != 0) {
        return wire_nng_err(rv);
    }
    frame_write(nng_msg_body(msg), &e, n, payload, payload_len);
    *out = msg;
    return 0;
}

int wire_frame_pack_msg_sealed(const Tandem__Envelope *env, const void *payload, size_t payload_len,
                               wire_seal_fn seal, void *arg, nng_msg **out)
{
    Tandem__Envelope e;
    Tandem__KvFrameHeader h;
    size_t n = 0; /* set by frame_prepare; gcc -O3 cannot see through it */
    nng_msg *msg;
    if (out == NULL || seal == NULL) {
        return fail(TANDEM_EINVAL, "wire_frame_pack_msg_sealed: NULL argument");
    }
    *out = NULL;
    CHECK(frame_prepare(env, payload, payload_len, 1, &e, &h, &n));
    /* The tag covers the envelope packed without it; protobuf-c packs fields
     * in number order, so auth_tag (18) follows those very bytes. */
    e.auth_tag.data = NULL;
    e.auth_tag.len = 0;
    n = tandem__envelope__get_packed_size(&e);
    uint8_t small[512], tag[WIRE_AUTH_TAG_BYTES];
    uint8_t *buf = n <= sizeof(small) ? small : malloc(n);
    if (buf == NULL) {
        return fail(TANDEM_ENOMEM, "frame: no memory to seal %zu bytes", n);
    }
    tandem__envelope__pack(&e, buf);
    seal(arg, buf, n, tag);
    if (buf != small) {
        free(buf);
    }
    e.auth_tag.data = tag;
    e.auth_tag.len = sizeof(tag);
    n = tandem__envelope__get_packed_size(&e);
    if (n > WIRE_MAX_MSG_BYTES) {
        return fail(TANDEM_ETOOBIG, "envelope of %zu bytes > %u", n, WIRE_MAX_MSG_BYTES);
    }
    int rv = nng_msg_alloc(&msg, WIRE_FRAME_PREFIX_BYTES + n + payload_len);
    if (rv != 0) {
        return wire_nng_err(rv);
    }
    frame_write(nng_msg_body(msg), &e, n, payload, payload_len);
    *out = msg;
    return 0;
}

int wire_frame_unpack(const void *buf, size_t len, struct wire_frame *out)
{
    const uint8_t *p = buf;
    Tandem__Envelope *env;
    if (out == NULL || (buf == NULL && len > 0)) {
        return fail(TANDEM_EINVAL, "wire_frame_unpack: NULL argument");
    }
    memset(out, 0, sizeof(*out));
    if (len < WIRE_FRAME_PREFIX_BYTES) {
        return fail(TANDEM_ETRUNCATED, "frame of %zu bytes", len);
    }
    if (len > WIRE_MAX_FRAME_BYTES) {
        return fail(TANDEM_ETOOBIG, "frame of %zu bytes > %zu", len, WIRE_MAX_FRAME_BYTES);
    }
    size_t n = get_le32(p);
    if (n > WIRE_MAX_MSG_BYTES) {
        return fail(TANDEM_ETOOBIG, "frame envelope length %zu > %u", n, WIRE_MAX_MSG_BYTES);
    }
    if (n > len - WIRE_FRAME_PREFIX_BYTES) {
        return fail(TANDEM_ETRUNCATED, "frame envelope length %zu, %zu bytes left", n,
                    len - WIRE_FRAME_PREFIX_BYTES);
    }
    CHECK(unpack_env(p + WIRE_FRAME_PREFIX_BYTES, n, ON_DATA, &env));
    const uint8_t *payload = p + WIRE_FRAME_PREFIX_BYTES + n;
    size_t rest = len - WIRE_FRAME_PREFIX_BYTES - n;
    int rv = 0;
    if (env->kind == TANDEM__ENVELOPE__KIND__KV_FRAME) {
        const Tandem__KvFrameHeader *h = env->kv_frame;
        if (h->payload_length > rest) {
            rv = fail(TANDEM_ETRUNCATED, "kv_frame: payload of %zu bytes, header says %llu", rest,
                      (unsigned long long)h->payload_length);
        } else if (h->payload_length < rest) {
            rv = fail(TANDEM_EPROTO, "kv_frame: payload of %zu bytes, header says %llu", rest,
                      (unsigned long long)h->payload_length);
        } else if (checksum(payload, rest) != h->checksum) {
            rv = fail(TANDEM_ECHECKSUM, "kv_frame: checksum mismatch (block %u)", h->block_index);
        }
    } else if (rest > 0) {
        rv = fail(TANDEM_EPROTO, "frame: %zu payload bytes after a %s", rest,
                  wire_kind_name(env->kind));
    }
    if (rv != 0) {
        wire_free(env);
        return rv;
    }
    out->env = env;
    out->payload = rest > 0 ? payload : NULL;
    out->payload_len = rest;
    return 0;
}

int wire_frame_unpack_msg(nng_msg *msg, struct wire_frame *out)
{
    if (msg == NULL || out == NULL) {
        return fail(TANDEM_EINVAL, "wire_frame_unpack_msg: NULL argument");
    }
    CHECK(wire_frame_unpack(nng_msg_body(msg), nng_msg_len(msg), out));
    out->msg = msg;
    return 0;
}

void wire_frame_fini(struct wire_frame *f)
{
    if (f == NULL) {
        return;
    }
    wire_free(f->env);
    if (f->msg != NULL) {
        nng_msg_free(f->msg);
    }
    memset(f, 0, sizeof(*f));
}

/* ---- NNG ---------------------------------------------------------------- */

int wire_nng_err(int nng_rv)
{
    int code;
    switch (nng_rv) {
    case 0:
        return 0;
    case NNG_ETIMEDOUT:
    case NNG_EAGAIN:
        code = TANDEM_ETIMEOUT;
        break;
    case NNG_ECLOSED:
    case NNG_ECONNSHUT:
    case NNG_ECONNRESET:
    case NNG_ECONNABORTED:
        code = TANDEM_ECLOSED;
        break;
    case NNG_ENOMEM:
        code = TANDEM_ENOMEM;
        break;
    case NNG_EMSGSIZE:
        code = TANDEM_ETOOBIG;
        break;
    default:
        code = TANDEM_ENNG;
        break;
    }
    return fail(code, "nng: %s", nng_strerror(nng_rv));
}

int wire_socket_setup(nng_socket s, enum wire_link link)
{
    size_t max = link == WIRE_LINK_DATA ? WIRE_MAX_FRAME_BYTES : WIRE_MAX_MSG_BYTES;
    return wire_nng_err(nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, max));
}

int wire_sendmsg(nng_socket s, nng_msg *msg, int flags)
{
    if (msg == NULL) {
        return fail(TANDEM_EINVAL, "wire_sendmsg: NULL message");
    }
    int rv = nng_sendmsg(s, msg, flags);
    if (rv != 0) {
        nng_msg_free(msg); /* NNG left it with us */
        return wire_nng_err(rv);
    }
    return 0;
}

/* Not inlined: LeakSanitizer must see this frame in the copy's allocation
 * stack (lsan.supp). */
__attribute__((noinline)) int wire_handoff(nng_socket s, nng_msg *msg, int flags)
{
    nng_msg *copy;
    int rv = nng_msg_dup(&copy, msg);
    if (rv != 0) {
        return rv;
    }
    rv = nng_sendmsg(s, copy, flags);
    if (rv != 0) {
        nng_msg_free(copy);
        return rv;
    }
    nng_msg_free(msg);
    return 0;
}

int wire_sendmsg_copy(nng_socket s, nng_msg *msg, int flags)
{
    if (msg == NULL) {
        return fail(TANDEM_EINVAL, "wire_sendmsg_copy: NULL message");
    }
    int rv = wire_handoff(s, msg, flags);
    if (rv != 0) {
        nng_msg_free(msg); /* NNG left it with us */
        return wire_nng_err(rv);
    }
    return 0;
}

int wire_send(nng_socket s, const Tandem__Envelope *env, int flags)
{
    nng_msg *msg;
    CHECK(wire_pack_msg(env, &msg));
    return wire_sendmsg(s, msg, flags);
}

int wire_frame_send(nng_socket s, const Tandem__Envelope *env, const void *payload,
                    size_t payload_len, int flags)
{
    nng_msg *msg;
    CHECK(wire_frame_pack_msg(env, payload, payload_len, &msg));
    return wire_sendmsg(s, msg, flags);
}

int wire_recv(nng_socket s, int flags, Tandem__Envelope **out)
{
    nng_msg *msg;
    if (out == NULL) {
        return fail(TANDEM_EINVAL, "wire_recv: NULL argument");
    }
    *out = NULL;
    int rv = nng_recvmsg(s, &msg, flags);
    if (rv != 0) {
        return wire_nng_err(rv);
    }
    rv = wire_unpack(nng_msg_body(msg), nng_msg_len(msg), out);
    nng_msg_free(msg);
    return rv;
}

int wire_frame_recv(nng_socket s, int flags, struct wire_frame *out)
{
    nng_msg *msg;
    if (out == NULL) {
        return fail(TANDEM_EINVAL, "wire_frame_recv: NULL argument");
    }
    memset(out, 0, sizeof(*out));
    int rv = nng_recvmsg(s, &msg, flags);
    if (rv != 0) {
        return wire_nng_err(rv);
    }
    rv = wire_frame_unpack_msg(msg, out);
    if (rv != 0) {
        nng_msg_free(msg);
    }
    return rv;
}
