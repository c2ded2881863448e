/* Control-link client: see ctl.h. */
#include "ctl.h"

#include <math.h>
#include <stdarg.h>
#include <nng/protocol/pair0/pair.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "auth.h"
#include "tandem_err.h"

void ctl_job_init(struct ctl_job *job)
{
    memset(job, 0, sizeof(*job));
    job->max_tokens = 16;
    job->top_p = 1.0f;
}

double ctl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int ctl_job_env(struct ctl_job_env *e, uint64_t id, const struct ctl_job *job)
{
    if (job == NULL || job->n_prompt < 0 || job->n_generated < 0 || job->n_stop < 0) {
        return TANDEM_EINVAL;
    }
    Tandem__SamplingParams *sp = &e->sp;
    tandem__sampling_params__init(sp);
    sp->temperature = job->temperature;
    sp->top_p = job->top_p;
    sp->top_k = job->top_k;
    if (job->has_seed) {
        sp->optional_seed_case = TANDEM__SAMPLING_PARAMS__OPTIONAL_SEED_SEED;
        sp->seed = job->seed;
    }
    /* protobuf-c's structs are not const-correct; packing only reads. */
    sp->n_stop_token_ids = (size_t)job->n_stop;
    sp->stop_token_ids = (uint32_t *)job->stop_ids;
    sp->logprobs = job->logprobs;
    sp->prompt_logprobs = job->prompt_logprobs != 0;
    sp->ignore_eos = job->ignore_eos != 0;

    Tandem__DecodeJob *dj = &e->dj;
    tandem__decode_job__init(dj);
    dj->n_prompt_token_ids = (size_t)job->n_prompt;
    dj->prompt_token_ids = (uint32_t *)job->prompt;
    dj->max_tokens = job->max_tokens;
    dj->sampling = sp;
    dj->prefill_address = (char *)(job->prefill_address ? job->prefill_address : "");
    dj->n_generated_token_ids = (size_t)job->n_generated;
    dj->generated_token_ids = (uint32_t *)job->generated;
    dj->hold_tokens = job->hold_tokens != 0;
    dj->control_batches = job->control_batches != 0;
    return wire_env_init(&e->env, TANDEM__ENVELOPE__KIND__DECODE_JOB, id, dj);
}

int ctl_job_msg(uint64_t id, const struct ctl_job *job, nng_msg **out)
{
    struct ctl_job_env e;
    if (out == NULL) {
        return TANDEM_EINVAL;
    }
    int rc = ctl_job_env(&e, id, job);
    if (rc != 0) {
        return rc;
    }
    return wire_pack_msg(&e.env, out);
}

int ctl_cancel_msg(uint64_t id, nng_msg **out)
{
    Tandem__Cancel c = TANDEM__CANCEL__INIT;
    Tandem__Envelope env;
    int rc = wire_env_init(&env, TANDEM__ENVELOPE__KIND__CANCEL, id, &c);
    if (rc != 0) {
        return rc;
    }
    return wire_pack_msg(&env, out);
}

int ctl_send_job(nng_socket s, uint64_t id, const struct ctl_job *job, int flags)
{
    nng_msg *msg;
    int rc = ctl_job_msg(id, job, &msg);
    if (rc != 0) {
        return rc;
    }
    return wire_sendmsg(s, msg, flags);
}

int ctl_send_cancel(nng_socket s, uint64_t id, int flags)
{
    nng_msg *msg;
    int rc = ctl_cancel_msg(id, &msg);
    if (rc != 0) {
        return rc;
    }
    return wire_sendmsg(s, msg, flags);
}

int ctl_open(nng_socket *out)
{
    nng_socket s;
    int rv = nng_pair0_open(&s);
    if (rv != 0) {
        return wire_nng_err(rv);
    }
    int rc = wire_socket_setup(s, WIRE_LINK_CONTROL);
    if (rc == 0) {
        rc = wire_nng_err(nng_socket_set_int(s, NNG_OPT_SENDBUF, CTL_SEND_BUF));
    }
    if (rc == 0) {
        rc = wire_nng_err(nng_socket_set_int(s, NNG_OPT_RECVBUF, CTL_SEND_BUF));
    }
    if (rc == 0) {
        rc = wire_nng_err(nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, CTL_SEND_TIMEO));
    }
    if (rc != 0) {
        nng_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* A worker with a cluster secret (docs/protocol.md, "Cluster secret") says
 * nothing but its Auth challenge until it is challenged: answer it, with
 * the secret from TANDEM_CLUSTER_SECRET_FILE, and challenge it back so it
 * sends its Hello. */
static void answer_challenge(nng_socket s, const Tandem__Auth *a)
{
    static struct auth_key key;
    static int loaded;
    char err[256];
    if (a->nonce.len == 0) {
        return;
    }
    if (!loaded) {
        const char *path = auth_secret_path(NULL);
        loaded = path != NULL && auth_secret_load(path, &key, NULL, err, sizeof(err)) == 0 ? 1 : -1;
    }
    if (loaded != 1) {
        return;
    }
    uint8_t nonce[AUTH_NONCE_BYTES], proof[AUTH_TAG_BYTES];
    if (auth_random(nonce, sizeof(nonce)) != 0) {
        return;
    }
    auth_router_proof(&key, a->nonce.data, a->nonce.len, proof);
    Tandem__Auth r = TANDEM__AUTH__INIT;
    r.nonce.data = nonce;
    r.nonce.len = sizeof(nonce);
    r.proof.data = proof;
    r.proof.len = sizeof(proof);
    Tandem__Envelope env;
    wire_env_init(&env, TANDEM__ENVELOPE__KIND__AUTH, 0, &r);
    wire_send(s, &env, 0);
}

static int dial(nng_socket *out, const char *url, int flags, Tandem__Envelope **hello)
{
    nng_socket s;
    int rc = ctl_open(&s);
    if (rc != 0) {
        return rc;
    }
    rc = wire_nng_err(nng_dial(s, url, NULL, flags & NNG_FLAG_NONBLOCK));
    if (rc == 0 && !(flags & NNG_FLAG_NONBLOCK)) {
        double end = ctl_now() + CTL_HELLO_MS / 1e3;
        nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 50);
        rc = TANDEM_ETIMEOUT;
        while (ctl_now() < end) {
            Tandem__Envelope *env;
            if (wire_recv(s, 0, &env) != 0) {
                continue;
            }
            if (env->kind == TANDEM__ENVELOPE__KIND__AUTH) {
                answer_challenge(s, env->auth);
            }
            if (env->kind == TANDEM__ENVELOPE__KIND__HELLO) {
                if (hello != NULL) {
                    *hello = env;
                } else {
                    wire_free(env);
                }
                rc = 0;
                break;
            }
            wire_free(env);
        }
        nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, NNG_DURATION_INFINITE);
    }
    if (rc != 0) {
        nng_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

int ctl_dial(nng_socket *out, const char *url, int flags)
{
    return dial(out, url, flags, NULL);
}

int ctl_dial_hello(nng_socket *out, const char *url, Tandem__Envelope **hello)
{
    *hello = NULL;
    return dial(out, url, 0, hello);
}

/* ---- Streams ------------------------------------------------------------ */

void ctl_stream_init(struct ctl_stream *s, uint64_t id)
{
    memset(s, 0, sizeof(*s));
    s->id = id;
    s->first_index = -1;
}

void ctl_stream_fini(struct ctl_stream *s)
{
    free(s->tokens);
    free(s->logprobs);
    free(s->top);
    free(s->n_top);
    free(s->prompt_logprobs);
    free(s->prompt_top);
    free(s->n_prompt_top);
    uint64_t id = s->id;
    ctl_stream_init(s, id);
}

static int violation(struct ctl_stream *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int violation(struct ctl_stream *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->bad_detail, sizeof(s->bad_detail), fmt, ap);
    va_end(ap);
    s->bad++;
    return TANDEM_EPROTO;
}

static int grow_tokens(struct ctl_stream *s, int need)
{
    if (need <= s->cap) {
        return 0;
    }
    int cap = s->cap ? s->cap : 64;
    while (cap < need) {
        cap *= 2;
    }
    uint32_t *t = realloc(s->tokens, (size_t)cap * sizeof(*t));
    if (t != NULL) {
        s->tokens = t;
    }
    float *l = realloc(s->logprobs, (size_t)cap * sizeof(*l));
    if (l != NULL) {
        s->logprobs = l;
    }
    /* Alternatives are kept only once a chunk brings some (feed_chunk):
     * CTL_MAX_TOP of them per token is 40x the token itself. */
    struct ctl_top *top = s->top;
    if (top != NULL && (top = realloc(s->top, (size_t)cap * CTL_MAX_TOP * sizeof(*top))) != NULL) {
        s->top = top;
    }
    uint8_t *nt = realloc(s->n_top, (size_t)cap * sizeof(*nt));
    if (nt != NULL) {
        s->n_top = nt;
    }
    if (t == NULL || l == NULL || (s->top != NULL && top == NULL) || nt == NULL) {
        return TANDEM_ENOMEM;
    }
    s->cap = cap;
    return 0;
}

static void copy_top(struct ctl_top *dst, uint8_t *n, const Tandem__TopLogprobs *t)
{
    size_t k = t ? t->n_token_ids : 0;
    if (k > CTL_MAX_TOP) {
        k = CTL_MAX_TOP;
    }
    for (size_t i = 0; i < k; i++) {
        dst[i].token = t->token_ids[i];
        dst[i].logprob = t->logprobs[i];
    }
    *n = (uint8_t)k;
}

static int feed_chunk(struct ctl_stream *s, const Tandem__TokenChunk *c)
{
    if (s->first_index < 0) {
        s->first_index = (int)c->first_index;
    }
    uint32_t expect = (uint32_t)(s->first_index + s->n_tokens);
    if (c->first_index != expect) {
        return violation(s, "request %llu: token chunk at index %u, expected %u (%s)",
                         (unsigned long long)s->id, c->first_index, expect,
                         c->first_index < expect ? "duplicate" : "gap");
    }
    if (s->count_only) {
        if (s->n_tokens == 0) {
            s->t_first = ctl_now();
        }
        s->n_tokens += (int)c->n_token_ids;
        return 0;
    }
    int rc = grow_tokens(s, s->n_tokens + (int)c->n_token_ids);
    if (rc != 0) {
        return rc;
    }
    if (c->n_top_logprobs > 0 && s->top == NULL &&
        (s->top = malloc((size_t)s->cap * CTL_MAX_TOP * sizeof(*s->top))) == NULL) {
        return TANDEM_ENOMEM;
    }
    for (size_t i = 0; i < c->n_token_ids; i++) {
        int k = s->n_tokens + (int)i;
        s->tokens[k] = c->token_ids[i];
        s->logprobs[k] = c->n_logprobs ? c->logprobs[i] : NAN;
        if (c->n_top_logprobs > 0) {
            copy_top(s->top + (size_t)k * CTL_MAX_TOP, &s->n_top[k], c->top_logprobs[i]);
        } else {
            s->n_top[k] = 0;
        }
    }
    if (s->n_tokens == 0) {
        s->t_first = ctl_now();
    }
    s->n_tokens += (int)c->n_token_ids;
    return 0;
}

static int feed_prompt_logprobs(struct ctl_stream *s, const Tandem__PromptLogprobs *p)
{
    /* Position i + 1 goes to slot i: positions must continue where the last
     * message stopped. */
    if (p->first_index != (uint32_t)s->n_prompt_logprobs + 1) {
        return violation(s, "request %llu: prompt logprobs at position %u, expected %d",
                         (unsigned long long)s->id, p->first_index, s->n_prompt_logprobs + 1);
    }
    int need = s->n_prompt_logprobs + (int)p->n_logprobs;
    if (need > s->cap_prompt_logprobs) {
        int cap = s->cap_prompt_logprobs ? s->cap_prompt_logprobs : 64;
        while (cap < need) {
            cap *= 2;
        }
        float *l = realloc(s->prompt_logprobs, (size_t)cap * sizeof(*l));
        if (l != NULL) {
            s->prompt_logprobs = l;
        }
        struct ctl_top *top = realloc(s->prompt_top, (size_t)cap * CTL_MAX_TOP * sizeof(*top));
        if (top != NULL) {
            s->prompt_top = top;
        }
        uint8_t *nt = realloc(s->n_prompt_top, (size_t)cap * sizeof(*nt));
        if (nt != NULL) {
            s->n_prompt_top = nt;
        }
        if (l == NULL || top == NULL || nt == NULL) {
            return TANDEM_ENOMEM;
        }
        s->cap_prompt_logprobs = cap;
    }
    memcpy(s->prompt_logprobs + s->n_prompt_logprobs, p->logprobs,
           p->n_logprobs * sizeof(*p->logprobs));
    for (size_t i = 0; i < p->n_logprobs; i++) {
        int k = s->n_prompt_logprobs + (int)i;
        copy_top(s->prompt_top + (size_t)k * CTL_MAX_TOP, &s->n_prompt_top[k],
                 p->n_top_logprobs ? p->top_logprobs[i] : NULL);
    }
    s->n_prompt_logprobs = need;
    return 0;
}

int ctl_stream_feed(struct ctl_stream *s, const Tandem__Envelope *env)
{
    if (env == NULL || env->request_id != s->id) {
        return TANDEM_ENOENT;
    }
    if (s->done) {
        return violation(s, "request %llu: %s after the end", (unsigned long long)s->id,
                         wire_kind_name(env->kind));
    }
    switch (env->kind) {
    case TANDEM__ENVELOPE__KIND__TOKEN_CHUNK:
        return feed_chunk(s, env->token_chunk);
    case TANDEM__ENVELOPE__KIND__PROMPT_LOGPROBS:
        return feed_prompt_logprobs(s, env->prompt_logprobs);
    case TANDEM__ENVELOPE__KIND__ERROR:
        s->error_code = env->error->code;
        snprintf(s->error, sizeof(s->error), "%s", env->error->message ? env->error->message : "");
        return 0;
    case TANDEM__ENVELOPE__KIND__FINISH:
        if (env->finish->last_tokens != NULL) {
            int rc = feed_chunk(s, env->finish->last_tokens);
            if (rc != 0) {
                return rc;
            }
        }
        s->finish_reason = (int)env->finish->reason;
        s->prompt_tokens = env->finish->usage->prompt_tokens;
        s->completion_tokens = env->finish->usage->completion_tokens;
        s->cached_tokens = env->finish->usage->cached_tokens;
        s->done = 1;
        s->t_done = ctl_now();
        return 1;
    case TANDEM__ENVELOPE__KIND__BUSY:
        s->busy = 1;
        s->busy_reason = (int)env->busy->reason;
        snprintf(s->error, sizeof(s->error), "%s", env->busy->detail ? env->busy->detail : "");
        s->done = 1;
        s->t_done = ctl_now();
        return 1;
    default:
        return violation(s, "request %llu: unexpected %s from a worker", (unsigned long long)s->id,
                         wire_kind_name(env->kind));
    }
}

/* ---- Synchronous runs --------------------------------------------------- */

static struct ctl_item *find_item(struct ctl_item *items, int n, uint64_t id)
{
    for (int i = 0; i < n; i++) {
        if (items[i].id == id) {
            return &items[i];
        }
    }
    return NULL;
}

/* Receives everything waiting on s without blocking. Returns the number of
 * streams that became done. */
static int drain(nng_socket s, struct ctl_item *items, int n, ctl_other_fn other, void *arg)
{
    int finished = 0;
    for (;;) {
        Tandem__Envelope *env;
        int rc = wire_recv(s, NNG_FLAG_NONBLOCK, &env);
        if (rc == TANDEM_ETIMEOUT || rc == TANDEM_ECLOSED) {
            return finished;
        }
        if (rc != 0) {
            continue; /* undecodable: dropped by wire_recv */
        }
        struct ctl_item *it = env->request_id ? find_item(items, n, env->request_id) : NULL;
        if (it != NULL && nng_socket_id(it->sock) == nng_socket_id(s)) {
            if (ctl_stream_feed(&it->stream, env) == 1) {
                finished++;
            }
        } else if (other != NULL) {
            other(arg, s, env);
        }
        wire_free(env);
    }
}

int ctl_run_many(struct ctl_item *items, int n, int timeout_ms, ctl_other_fn other, void *arg)
{
    if (n < 0 || (n > 0 && items == NULL)) {
        return TANDEM_EINVAL;
    }
    /* Distinct sockets and their receive fds. */
    struct pollfd *pfd = calloc((size_t)(n > 0 ? n : 1), sizeof(*pfd));
    nng_socket *socks = calloc((size_t)(n > 0 ? n : 1), sizeof(*socks));
    if (pfd == NULL || socks == NULL) {
        free(pfd);
        free(socks);
        return TANDEM_ENOMEM;
    }
    int n_socks = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        ctl_stream_init(&items[i].stream, items[i].id);
    }
    for (int i = 0; i < n && rc == 0; i++) {
        int seen = 0;
        for (int k = 0; k < n_socks; k++) {
            seen |= nng_socket_id(socks[k]) == nng_socket_id(items[i].sock);
        }
        if (!seen) {
            int fd;
            rc = wire_nng_err(nng_socket_get_int(items[i].sock, NNG_OPT_RECVFD, &fd));
            socks[n_socks] = items[i].sock;
            pfd[n_socks].fd = fd;
            pfd[n_socks].events = POLLIN;
            n_socks++;
        }
    }
    for (int i = 0; i < n && rc == 0; i++) {
        rc = ctl_send_job(items[i].sock, items[i].id, items[i].job, 0);
    }
    int left = n;
    double deadline = ctl_now() + timeout_ms / 1e3;
    while (rc == 0 && left > 0) {
        for (int k = 0; k < n_socks; k++) {
            left -= drain(socks[k], items, n, other, arg);
        }
        if (left <= 0) {
            break;
        }
        double wait = deadline - ctl_now();
        if (wait <= 0) {
            rc = TANDEM_ETIMEOUT;
            break;
        }
        int ms = (int)(wait * 1e3) + 1;
        if (poll(pfd, (nfds_t)n_socks, ms > 100 ? 100 : ms) < 0) {
            continue; /* EINTR: look again */
        }
    }
    free(pfd);
    free(socks);
    return rc;
}

int ctl_run(nng_socket s, uint64_t id, const struct ctl_job *job, int timeout_ms,
            struct ctl_stream *out)
{
    struct ctl_item it = {.sock = s, .id = id, .job = job};
    int rc = ctl_run_many(&it, 1, timeout_ms, NULL, NULL);
    *out = it.stream;
    return rc;
}
