#include "scheduler.h"

#include <stdlib.h>
#include <string.h>

#include "block_hash.h"
#include "log.h"
#include "tandem_err.h"

/* Prefill chunk cap while a request's prompt logprobs are still due: the
 * backend then writes chunk x vocab logits. Batch invariance makes the
 * smaller chunks give the same bits. */
#define SCHED_PLP_CHUNK 64

enum seq_phase {
    PH_WAITING = 0, /* needs (re)prefill, holds no KV */
    PH_READY,       /* PREFILLED: holds its prompt's KV, awaits a running slot */
    PH_PREFILL,     /* running, part of its tokens computed */
    PH_DECODE,      /* running, every token but the last computed */
    PH_DOOMED,      /* accepted but impossible: finishes with an error next step */
};

struct seq {
    /* Hot: read or written for every sequence in every step (the first three
     * cache lines); a step walks hundreds of sequences, each a cache miss. */
    struct seq *prev, *next; /* in the list of its phase */
    uint64_t id;
    void *user;
    enum sched_mode mode;
    enum seq_phase phase;
    uint32_t *tokens; /* (cap) prompt, resumed tokens, then the completion */
    int n_tokens;
    int cap;
    int n_prompt;    /* original prompt (without resumed tokens) */
    int n_generated; /* completion tokens so far, resumed ones included */
    int n_computed;  /* positions whose KV is written */
    int max_tokens;
    int chunk;      /* tokens scheduled in the current step */
    int counted;    /* prompt tokens added to the stats */
    uint64_t stamp; /* step number in which it was last scheduled */
    int n_stop;
    int ignore_eos;
    int logprobs;
    struct be_ctx ctx; /* the backend's cache for this sequence (tokens only grow) */
    struct sampler_params sp;
    struct kv_seq kv;
    /* Cold: admission, prompt logprobs, the first token of a prefill. */
    uint32_t stop[SCHED_MAX_STOP];
    int plp;              /* prompt logprobs wanted */
    int plp_top;          /* alternatives per prompt token */
    int plp_next;         /* next prompt token index to report (starts at 1) */
    uint32_t first_token; /* PREFILLED */
    float first_lp;
    struct sampler_top first_top[SAMPLER_MAX_TOP];
    int n_first_top;
    int admitted; /* ever got KV: cached_tokens is final */
    int cached_tokens;
    int blocks_reported; /* PREFILL_ONLY: leading blocks handed to on_blocks_ready */
    int err;             /* PH_DOOMED: why */
    uint64_t order;      /* submission number: FCFS between ready and waiting */
};

/* A step walks hundreds of sequences that nothing else touched since the last
 * step: fetch one a few places ahead so their cache misses overlap. */
#define SEQ_AHEAD 4

static inline void prefetch_seq(const struct seq *q)
{
    __builtin_prefetch(q);
    __builtin_prefetch((const char *)q + 64);
    __builtin_prefetch((const char *)q + 128);
}

struct seq_list {
    struct seq *head, *tail;
    int n;
    /* The running list only (which is appended to and removed from, never
     * pushed at the front): its members in order, (max_running). A step
     * snapshots it twice; walking the list for that cost one cache miss per
     * sequence, one after the other. */
    struct seq **arr;
};

struct sched {
    struct sched_config cfg;
    struct sched_callbacks cb;
    struct backend *be;
    struct kv_pool *pool;
    struct sampler *sampler;
    uint64_t root;
    int vocab;
    int max_ctx;
    int emits; /* backend picks tokens itself */
    struct seq_list waiting, ready, running, doomed;
    uint64_t step_no;
    uint64_t submitted; /* sched_submit calls so far: the next seq's order */
    struct sched_stats st;
    /* The head of the waiting queue when it last failed to get blocks, and
     * the free + idle blocks before that attempt: it is not retried (which
     * would count its prefix lookup again) until more blocks are free. */
    const struct seq *blocked;
    int blocked_avail;
    /* Per-step scratch. */
    struct seq **snap;           /* (max_running) copy of the running list */
    struct seq **dec;            /* (max_running) decode batch */
    struct seq **pf;             /* (max_running) prefill chunks */
    struct be_seq *bseq;         /* (max_running) */
    struct be_out *bout;         /* (max_running) */
    float *logits;               /* (max_running, vocab) decode logits */
    float *logits_all;           /* (SCHED_PLP_CHUNK, vocab) prefill logits for prompt logprobs */
    float *plp_lp;               /* (SCHED_PLP_CHUNK) */
    struct sampler_top *plp_top; /* (SCHED_PLP_CHUNK, SAMPLER_MAX_TOP) */
};

static void list_push_back(struct seq_list *l, struct seq *q)
{
    if (l->arr) {
        l->arr[l->n] = q;
    }
    q->next = NULL;
    q->prev = l->tail;
    if (l->tail) {
        l->tail->next = q;
    } else {
        l->head = q;
    }
    l->tail = q;
    l->n++;
}

static void list_push_front(struct seq_list *l, struct seq *q)
{
    q->prev = NULL;
    q->next = l->head;
    if (l->head) {
        l->head->prev = q;
    } else {
        l->tail = q;
    }
    l->head = q;
    l->n++;
}

static void list_remove(struct seq_list *l, struct seq *q)
{
    if (l->arr) {
        int i = l->n - 1;
        while (i > 0 && l->arr[i] != q) {
            i--;
        }
        memmove(l->arr + i, l->arr + i + 1, (size_t)(l->n - 1 - i) * sizeof(*l->arr));
    }
    if (q->prev) {
        q->prev->next = q->next;
    } else {
        l->head = q->next;
    }
    if (q->next) {
        q->next->prev = q->prev;
    } else {
        l->tail = q->prev;
    }
    q->prev = q->next = NULL;
    l->n--;
}

static struct seq_list *list_of(struct sched *s, enum seq_phase ph)
{
    switch (ph) {
    case PH_WAITING:
        return &s->waiting;
    case PH_READY:
        return &s->ready;
    case PH_DOOMED:
        return &s->doomed;
    case PH_PREFILL:
    case PH_DECODE:
        break;
    }
    return &s->running;
}

static struct seq *find(const struct sched *s, uint64_t id)
{
    const struct seq_list *lists[] = {&s->running, &s->ready, &s->waiting, &s->doomed};
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        for (struct seq *q = lists[i]->head; q; q = q->next) {
            if (q->id == id) {
                return q;
            }
        }
    }
    return NULL;
}

static int min_int(int a, int b)
{
    return a < b ? a : b;
}

const char *sched_finish_name(enum sched_finish reason)
{
    switch (reason) {
    case SCHED_FINISH_LENGTH:
        return "length";
    case SCHED_FINISH_STOP:
        return "stop";
    case SCHED_FINISH_CANCELLED:
        return "cancelled";
    case SCHED_FINISH_ERROR:
        return "error";
    case SCHED_FINISH_PREFILLED:
        return "prefilled";
    case SCHED_FINISH_COUNT:
        break;
    }
    return "unknown";
}

const char *const sched_policy_names[] = {"chunked", "prefill-first", NULL};

const char *sched_policy_name(enum sched_policy policy)
{
    return (int)policy >= 0 && policy < SCHED_POLICY_COUNT ? sched_policy_names[policy] : NULL;
}

int sched_budget_for(enum sched_policy policy, int given, int backend_default, int ctx,
                     int *short_by)
{
    int budget = given > 0 ? given : backend_default;
    *short_by = 0;
    if (policy != SCHED_POLICY_PREFILL_FIRST || budget >= ctx) {
        return budget;
    }
    if (given <= 0) {
        return ctx;
    }
    *short_by = ctx - budget;
    return budget;
}

int sched_create(struct sched **out, const struct sched_config *cfg, struct backend *be,
                 struct kv_pool *pool, const struct sched_callbacks *cb)
{
    if (!out || !cfg || !be || !pool || cfg->max_running < 1 || cfg->token_budget < 1 ||
        cfg->max_prefill_chunk < 1 || cfg->max_context < 0 || (int)cfg->policy < 0 ||
        cfg->policy >= SCHED_POLICY_COUNT) {
        return TANDEM_EINVAL;
    }
    const struct kv_config *kc = kv_pool_config(pool);
    if (cfg->block_size != kc->block_size || be->info.vocab_size < 1 || be->info.max_context < 2) {
        return TANDEM_EINVAL;
    }
    struct sched *s = calloc(1, sizeof(*s));
    if (!s) {
        return TANDEM_ENOMEM;
    }
    s->cfg = *cfg;
    if (cb) {
        s->cb = *cb;
    }
    s->be = be;
    s->pool = pool;
    s->root = bh_root(be->info.name);
    s->vocab = be->info.vocab_size;
    s->emits = be->info.emits_tokens;
    int64_t pool_tokens = (int64_t)kc->n_blocks * kc->block_size;
    int64_t ctx = be->info.max_context;
    if (cfg->max_context > 0 && cfg->max_context < ctx) {
        ctx = cfg->max_context;
    }
    s->max_ctx = (int)(pool_tokens < ctx ? pool_tokens : ctx);

    size_t mr = (size_t)cfg->max_running;
    s->snap = calloc(mr, sizeof(*s->snap));
    s->running.arr = calloc(mr, sizeof(*s->running.arr));
    s->dec = calloc(mr, sizeof(*s->dec));
    s->pf = calloc(mr, sizeof(*s->pf));
    s->bseq = calloc(mr, sizeof(*s->bseq));
    s->bout = calloc(mr, sizeof(*s->bout));
    s->plp_lp = calloc(SCHED_PLP_CHUNK, sizeof(*s->plp_lp));
    s->plp_top = calloc((size_t)SCHED_PLP_CHUNK * SAMPLER_MAX_TOP, sizeof(*s->plp_top));
    if (!s->snap || !s->running.arr || !s->dec || !s->pf || !s->bseq || !s->bout || !s->plp_lp ||
        !s->plp_top) {
        goto fail;
    }
    if (!s->emits) {
        s->logits = malloc(mr * (size_t)s->vocab * sizeof(float));
        s->logits_all = malloc((size_t)SCHED_PLP_CHUNK * (size_t)s->vocab * sizeof(float));
        if (!s->logits || !s->logits_all || sampler_create(&s->sampler, s->vocab) != 0) {
            goto fail;
        }
    }
    *out = s;
    return 0;

fail:
    sched_destroy(s);
    return TANDEM_ENOMEM;
}

static void seq_free(struct sched *s, struct seq *q)
{
    kv_seq_release(s->pool, &q->kv);
    kv_seq_fini(&q->kv);
    free(q->tokens);
    free(q);
}

void sched_destroy(struct sched *s)
{
    if (!s) {
        return;
    }
    struct seq_list *lists[] = {&s->running, &s->ready, &s->waiting, &s->doomed};
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        /* Newest first, so shared parents are released after their tails. */
        while (lists[i]->tail) {
            struct seq *q = lists[i]->tail;
            list_remove(lists[i], q);
            seq_free(s, q);
        }
    }
    sampler_destroy(s->sampler);
    free(s->plp_top);
    free(s->plp_lp);
    free(s->logits_all);
    free(s->logits);
    free(s->bout);
    free(s->bseq);
    free(s->pf);
    free(s->dec);
    free(s->snap);
    free(s->running.arr);
    free(s);
}

static int check_request(const struct sched *s, const struct sched_request *r)
{
    if (!r->prompt || r->n_prompt < 1 || r->n_generated < 0 || r->n_generated >= r->n_prompt ||
        r->max_tokens < 1 || r->n_generated >= r->max_tokens || r->n_stop < 0 ||
        r->n_stop > SCHED_MAX_STOP || (r->n_stop > 0 && !r->stop_ids) || r->logprobs < 0 ||
        r->logprobs > SAMPLER_MAX_TOP || r->prompt_top < 0 || r->prompt_top > SAMPLER_MAX_TOP ||
        sampler_params_check(&r->sampling) != 0) {
        return TANDEM_EINVAL;
    }
    if (r->mode != SCHED_MODE_FULL && r->mode != SCHED_MODE_PREFILL_ONLY &&
        r->mode != SCHED_MODE_PREFILLED) {
        return TANDEM_EINVAL;
    }
    for (int i = 0; i < r->n_prompt; i++) {
        if (r->prompt[i] >= (uint32_t)s->vocab) {
            return TANDEM_EINVAL;
        }
    }
    if (r->prompt_logprobs && s->emits) {
        return TANDEM_EUNSUPPORTED; /* the backend has no logits */
    }
    if (r->mode == SCHED_MODE_PREFILLED) {
        if (!r->kv || r->kv->n_tokens < r->n_prompt || r->kv->root != s->root ||
            r->first_token >= (uint32_t)s->vocab || r->n_first_top < 0 ||
            r->n_first_top > SAMPLER_MAX_TOP || (r->n_first_top > 0 && !r->first_top)) {
            return TANDEM_EINVAL;
        }
    }
    return 0;
}

/* Prefill-first: whether q's tokens can ever be prefilled in one step. */
static int fits_whole(const struct sched *s, const struct seq *q)
{
    return s->cfg.policy != SCHED_POLICY_PREFILL_FIRST || q->n_tokens <= s->cfg.token_budget;
}

int sched_submit(struct sched *s, const struct sched_request *r)
{
    if (!s || !r) {
        return TANDEM_EINVAL;
    }
    int rc = check_request(s, r);
    if (rc != 0) {
        return rc;
    }
    if (find(s, r->id)) {
        return TANDEM_EEXIST;
    }
    struct seq *q = calloc(1, sizeof(*q));
    if (!q) {
        return TANDEM_ENOMEM;
    }
    /* Room for prompt + completion, never past the context limit. */
    int64_t cap = (int64_t)r->n_prompt + (r->max_tokens - r->n_generated);
    if (cap > s->max_ctx) {
        cap = s->max_ctx;
    }
    if (cap < r->n_prompt + 1) {
        cap = r->n_prompt + 1;
    }
    q->cap = (int)cap;
    q->tokens = malloc((size_t)q->cap * sizeof(*q->tokens));
    if (!q->tokens) {
        free(q);
        return TANDEM_ENOMEM;
    }
    memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof(*q->tokens));
    q->id = r->id;
    q->order = s->submitted++;
    q->user = r->user;
    q->mode = r->mode;
    q->n_tokens = r->n_prompt;
    q->n_prompt = r->n_prompt - r->n_generated;
    q->n_generated = r->n_generated;
    q->max_tokens = r->max_tokens;
    if (r->n_stop > 0) {
        memcpy(q->stop, r->stop_ids, (size_t)r->n_stop * sizeof(*q->stop));
    }
    q->n_stop = r->n_stop;
    q->ignore_eos = r->ignore_eos;
    q->sp = r->sampling;
    q->logprobs = r->logprobs;
    q->plp = r->prompt_logprobs ? 1 : 0;
    q->plp_top = r->prompt_top;
    q->plp_next = 1;
    kv_seq_init(&q->kv, s->root);

    if (r->mode == SCHED_MODE_PREFILLED) {
        q->phase = PH_READY;
        q->kv = *r->kv;
        kv_seq_init(r->kv, s->root);
        q->n_computed = r->n_prompt;
        q->cached_tokens = q->kv.n_cached_tokens;
        q->admitted = 1;
        q->first_token = r->first_token;
        q->first_lp = r->first_logprob;
        q->n_first_top = r->n_first_top;
        if (r->n_first_top > 0) {
            memcpy(q->first_top, r->first_top, (size_t)r->n_first_top * sizeof(*q->first_top));
        }
    } else {
        q->phase = PH_WAITING;
    }
    if (r->n_prompt >= s->max_ctx) {
        q->phase = PH_DOOMED;
        q->err = TANDEM_ETOOBIG;
        LOG_WARN("sched", "request %llu: %d prompt tokens, context limit %d",
                 (unsigned long long)r->id, r->n_prompt, s->max_ctx);
    } else if (q->phase == PH_WAITING && r->n_generated == 0 && !fits_whole(s, q)) {
        q->phase = PH_DOOMED;
        q->err = TANDEM_ETOOBIG;
        LOG_WARN("sched",
                 "request %llu: %d prompt tokens, more than the token budget %d of a "
                 "prefill-first step",
                 (unsigned long long)r->id, r->n_prompt, s->cfg.token_budget);
    }
    list_push_back(list_of(s, q->phase), q);
    return 0;
}

/* Unlinks q, releases its blocks, reports the finish and frees it. */
static void finish(struct sched *s, struct seq *q, enum sched_finish reason, int err)
{
    if (s->blocked == q) {
        s->blocked = NULL;
    }
    list_remove(list_of(s, q->phase), q);
    kv_seq_release(s->pool, &q->kv);
    s->st.finished[reason]++;
    struct sched_usage u = {
        .prompt_tokens = q->n_prompt,
        .completion_tokens = q->n_generated,
        .cached_tokens = q->cached_tokens,
    };
    if (s->cb.on_finish) {
        s->cb.on_finish(s->cb.arg, q->id, q->user, reason, err, &u);
    }
    seq_free(s, q);
}

int sched_cancel(struct sched *s, uint64_t id)
{
    struct seq *q = find(s, id);
    if (!q) {
        return TANDEM_ENOENT;
    }
    finish(s, q, SCHED_FINISH_CANCELLED, 0);
    return 0;
}

/* Back to the front of the waiting queue with every token it has; it will
 * re-prefill them all and continue. */
static void preempt(struct sched *s, struct seq *q)
{
    list_remove(&s->running, q);
    kv_seq_release(s->pool, &q->kv);
    q->n_computed = 0;
    q->phase = PH_WAITING;
    list_push_front(&s->waiting, q);
    s->st.preemptions++;
    LOG_DEBUG("sched", "preempted request %llu (%d tokens)", (unsigned long long)q->id,
              q->n_tokens);
}

/* The newest running sequence not scheduled in this step. */
static struct seq *newest_unscheduled(struct sched *s)
{
    for (struct seq *q = s->running.tail; q; q = q->prev) {
        if (q->stamp != s->step_no) {
            return q;
        }
    }
    return NULL;
}

/* Grows q's KV towards target slots as far as free (or evictable) blocks
 * allow. Returns the slots now reserved, or a negative error other than
 * TANDEM_ENOSPACE. */
static int grow_upto(struct sched *s, struct seq *q, int target)
{
    int rc = kv_seq_grow(s->pool, &q->kv, target);
    if (rc == 0) {
        return target;
    }
    if (rc != TANDEM_ENOSPACE) {
        return rc;
    }
    int bs = s->cfg.block_size;
    int have = q->kv.n_tokens;
    int in_blocks = min_int(target, q->kv.n_blocks * bs);
    if (in_blocks > have) {
        rc = kv_seq_grow(s->pool, &q->kv, in_blocks);
        if (rc != 0) {
            return rc;
        }
        have = in_blocks;
    }
    /* The full grow failed, so this loop stops short of target after
     * allocating every block it can, one at a time. */
    for (;;) {
        int next = min_int(target, (have / bs + 1) * bs);
        rc = kv_seq_grow(s->pool, &q->kv, next);
        if (rc == TANDEM_ENOSPACE) {
            return have;
        }
        if (rc != 0) {
            return rc;
        }
        have = next;
    }
}

static int is_stop(const struct sched *s, const struct seq *q, uint32_t tok)
{
    if (!q->ignore_eos && s->be->info.eos_id >= 0 && tok == (uint32_t)s->be->info.eos_id) {
        return 1;
    }
    for (int i = 0; i < q->n_stop; i++) {
        if (q->stop[i] == tok) {
            return 1;
        }
    }
    return 0;
}

/* Appends a generated token, reports it, and finishes q when it is done.
 * Returns 1 when q was finished (and freed). */
static int emit(struct sched *s, struct seq *q, uint32_t tok, float lp,
                const struct sampler_top *top, int n_top)
{
    int index = q->n_generated++;
    q->tokens[q->n_tokens++] = tok;
    s->st.generation_tokens++;
    if (!q->counted) {
        q->counted = 1;
        s->st.prompt_tokens += (uint64_t)q->n_prompt;
    }
    if (s->cb.on_token) {
        s->cb.on_token(s->cb.arg, q->id, q->user, index, tok, lp, top, n_top);
    }
    if (q->mode == SCHED_MODE_PREFILL_ONLY) {
        finish(s, q, SCHED_FINISH_PREFILLED, 0);
        return 1;
    }
    if (is_stop(s, q, tok)) {
        finish(s, q, SCHED_FINISH_STOP, 0);
        return 1;
    }
    if (q->n_generated >= q->max_tokens || q->n_tokens >= s->max_ctx || q->n_tokens >= q->cap) {
        finish(s, q, SCHED_FINISH_LENGTH, 0);
        return 1;
    }
    return 0;
}

/* Samples the next token of q from its logits (or takes the backend's) and
 * emits it. */
static int sample_emit(struct sched *s, struct seq *q, const struct be_out *o)
{
    struct sampler_top top[SAMPLER_MAX_TOP];
    if (s->emits) {
        return emit(s, q, o->token, o->logprob, NULL, 0);
    }
    uint32_t tok = sampler_sample(s->sampler, &q->sp, o->logits, (uint64_t)q->n_generated);
    float lp = sampler_logprobs(o->logits, s->vocab, tok, top, q->logprobs);
    return emit(s, q, tok, lp, top, min_int(q->logprobs, s->vocab));
}

/* Commits the full blocks whose KV is now written. */
static void commit(struct sched *s, struct seq *q)
{
    int rc = kv_seq_commit(s->pool, &q->kv, q->tokens, q->n_computed);
    if (rc < 0) {
        LOG_WARN("sched", "request %llu: block commit failed: %s", (unsigned long long)q->id,
                 tandem_strerror(rc));
    }
}

static void report_blocks(struct sched *s, struct seq *q, int final)
{
    int bs = s->cfg.block_size;
    int upto = final ? (q->n_computed + bs - 1) / bs : q->n_computed / bs;
    if (upto > q->blocks_reported) {
        if (s->cb.on_blocks_ready) {
            s->cb.on_blocks_ready(s->cb.arg, q->id, q->user, &q->kv, q->blocks_reported,
                                  upto - q->blocks_reported, q->n_computed);
        }
        q->blocks_reported = upto;
    }
}

static int plp_pending(const struct seq *q)
{
    return q->plp && q->plp_next < q->n_prompt;
}

/* Prompt logprobs from the logits of the chunk at positions [pos, pos + n):
 * row i predicts token pos + i + 1. */
static void report_plp(struct sched *s, struct seq *q, int pos, int n)
{
    int first = q->plp_next > pos + 1 ? q->plp_next : pos + 1;
    int end = min_int(pos + n + 1, q->n_prompt);
    if (end <= first) {
        return;
    }
    int m = end - first;
    int ntop = min_int(q->plp_top, s->vocab);
    for (int j = 0; j < m; j++) {
        int t = first + j;
        const float *row = s->logits_all + (size_t)(t - 1 - pos) * (size_t)s->vocab;
        s->plp_lp[j] =
            sampler_logprobs(row, s->vocab, q->tokens[t], s->plp_top + (size_t)j * ntop, ntop);
    }
    q->plp_next = end;
    if (s->cb.on_prompt_logprobs) {
        s->cb.on_prompt_logprobs(s->cb.arg, q->id, q->user, first, m, s->plp_lp, s->plp_top, ntop);
    }
}

/* Size of the next prefill chunk of q given the step's remaining budget. */
static int want_chunk(const struct sched *s, const struct seq *q, int budget)
{
    int c = min_int(q->n_tokens - q->n_computed, budget);
    c = min_int(c, s->cfg.max_prefill_chunk);
    if (plp_pending(q)) {
        c = min_int(c, SCHED_PLP_CHUNK);
    }
    return c;
}

/* Whether a free running slot goes to the head of the ready queue (a
 * PREFILLED sequence, KV in hand) rather than the head of the waiting queue:
 * FCFS by submission, except that a waiting head which found no blocks last
 * time does not hold up sequences that need none to start. Without this, on
 * a worker that takes both, every remotely prefilled arrival would pass the
 * prompts waiting for a local prefill as long as the slots stay full. */
static int ready_first(const struct sched *s)
{
    const struct seq *r = s->ready.head, *w = s->waiting.head;
    return r != NULL && (w == NULL || r->order < w->order || w == s->blocked);
}

/* The head of the ready queue takes a running slot and emits the first
 * token it was given. */
static void admit_ready_head(struct sched *s)
{
    struct seq *q = s->ready.head;
    list_remove(&s->ready, q);
    q->phase = PH_DECODE;
    list_push_back(&s->running, q);
    commit(s, q);
    emit(s, q, q->first_token, q->first_lp, q->first_top, q->n_first_top);
}

/* Phase 0: impossible requests fail; PREFILLED sequences take free running
 * slots (those submitted before the waiting queue's head) and emit the first
 * token they were given. Returns events. */
static int admit_ready(struct sched *s)
{
    int events = 0;
    while (s->doomed.head) {
        struct seq *q = s->doomed.head;
        finish(s, q, SCHED_FINISH_ERROR, q->err);
        events++;
    }
    while (ready_first(s) && s->running.n < s->cfg.max_running) {
        admit_ready_head(s);
        events++;
    }
    return events;
}

/* Phase 1: one token for every decoding sequence (oldest first), preempting
 * the newest unscheduled ones when blocks run out. */
static int schedule_decodes(struct sched *s, int *budget, int *events)
{
    int n = s->running.n, nd = 0;
    memcpy(s->snap, s->running.arr, (size_t)n * sizeof(*s->snap));
    for (int i = 0; i < n && i < SEQ_AHEAD; i++) {
        prefetch_seq(s->snap[i]); /* the first ones too: a worker runs a dozen or so */
    }
    for (int i = 0; i < n; i++) {
        if (i + SEQ_AHEAD < n) {
            prefetch_seq(s->snap[i + SEQ_AHEAD]);
        }
        struct seq *q = s->snap[i];
        if (*budget <= 0) {
            break;
        }
        if (q->phase != PH_DECODE) {
            continue; /* prefilling, or preempted meanwhile */
        }
        for (;;) {
            int rc = kv_seq_grow(s->pool, &q->kv, q->n_computed + 1);
            if (rc == 0) {
                q->stamp = s->step_no;
                q->chunk = 1;
                s->dec[nd++] = q;
                (*budget)--;
                break;
            }
            if (rc != TANDEM_ENOSPACE) {
                finish(s, q, SCHED_FINISH_ERROR, rc);
                (*events)++;
                break;
            }
            struct seq *v = newest_unscheduled(s);
            preempt(s, v);
            if (v == q) {
                break;
            }
        }
    }
    return nd;
}

/* Phase 2: prefill chunks, FCFS: running prefills first, then admissions. */
static int schedule_prefills(struct sched *s, int *budget, int *events, uint64_t preempted_before)
{
    int n = s->running.n, np = 0;
    memcpy(s->snap, s->running.arr, (size_t)n * sizeof(*s->snap));
    for (int i = 0; i < n; i++) {
        struct seq *q = s->snap[i];
        if (*budget <= 0) {
            break;
        }
        if (q->phase != PH_PREFILL) {
            continue;
        }
        int want = want_chunk(s, q, *budget);
        for (;;) {
            int have = grow_upto(s, q, q->n_computed + want);
            if (have < 0) {
                finish(s, q, SCHED_FINISH_ERROR, have);
                (*events)++;
                break;
            }
            if (have > q->n_computed) {
                q->stamp = s->step_no;
                q->chunk = have - q->n_computed;
                s->pf[np++] = q;
                *budget -= q->chunk;
                break;
            }
            /* No room at all: make some by preempting a newer sequence;
             * when q is itself the newest, it waits, keeping its blocks
             * (decodes preempt it if they need them). */
            struct seq *v = newest_unscheduled(s);
            if (v == q || !v) {
                break;
            }
            preempt(s, v);
        }
    }
    /* After a preemption this step, admitting would only take back the
     * blocks just freed (vLLM does the same). Ready sequences submitted
     * after the waiting head but before the next one take their turn here
     * (they decode from the next step). */
    while (s->running.n < s->cfg.max_running && s->st.preemptions == preempted_before) {
        if (ready_first(s)) {
            admit_ready_head(s);
            (*events)++;
            continue;
        }
        if (*budget <= 0 || !s->waiting.head) {
            break;
        }
        struct seq *q = s->waiting.head;
        struct kv_stats ks;
        kv_pool_stats(s->pool, &ks);
        int avail = ks.free + ks.cached_idle;
        if (q == s->blocked && avail <= s->blocked_avail) {
            break;
        }
        int matched = 0;
        if (!plp_pending(q)) {
            matched = kv_seq_match(s->pool, &q->kv, q->tokens, q->n_tokens - 1);
            if (matched < 0) {
                list_remove(&s->waiting, q);
                q->phase = PH_DOOMED;
                list_push_back(&s->doomed, q);
                q->err = matched;
                continue;
            }
        }
        q->n_computed = matched;
        int want = want_chunk(s, q, *budget);
        int have = grow_upto(s, q, q->n_computed + want);
        if (have <= q->n_computed) {
            /* FCFS: nobody overtakes the head of the queue. */
            kv_seq_release(s->pool, &q->kv);
            q->n_computed = 0;
            if (have < 0) {
                list_remove(&s->waiting, q);
                q->phase = PH_DOOMED;
                list_push_back(&s->doomed, q);
                q->err = have;
                continue;
            }
            s->blocked = q;
            s->blocked_avail = avail;
            continue; /* ready sequences may go now (ready_first) */
        }
        s->blocked = NULL;
        if (!q->admitted) {
            q->admitted = 1;
            q->cached_tokens = matched;
        }
        list_remove(&s->waiting, q);
        q->phase = PH_PREFILL;
        list_push_back(&s->running, q);
        q->stamp = s->step_no;
        q->chunk = have - q->n_computed;
        s->pf[np++] = q;
        *budget -= q->chunk;
    }
    return np;
}

/* Moves q, blocks in hand, from the waiting queue to a running prefill of
 * its remaining tokens in this step. */
static void start_prefill(struct sched *s, struct seq *q, int matched, int *budget)
{
    s->blocked = NULL;
    if (!q->admitted) {
        q->admitted = 1;
        q->cached_tokens = matched;
    }
    list_remove(&s->waiting, q);
    q->phase = PH_PREFILL;
    list_push_back(&s->running, q);
    q->stamp = s->step_no;
    q->chunk = q->n_tokens - q->n_computed;
    *budget -= q->chunk;
}

static void doom_waiting(struct sched *s, struct seq *q, int err)
{
    list_remove(&s->waiting, q);
    q->phase = PH_DOOMED;
    list_push_back(&s->doomed, q);
    q->err = err;
}

/* Prefill-first admission (vLLM v0's _schedule_prefills without chunking):
 * whole prompts, FCFS, while their lengths fit in room (the budget as vLLM
 * v0 counts it: prefix-cached tokens included), slots and free blocks hold
 * them. PREFILLED sequences take slots in submission order, as in the
 * chunked policy. Returns the prefills scheduled (s->pf). */
static int admit_whole(struct sched *s, int *budget, int *events)
{
    int np = 0;
    int room = *budget;
    while (s->running.n < s->cfg.max_running) {
        if (ready_first(s)) {
            admit_ready_head(s);
            (*events)++;
            continue;
        }
        struct seq *q = s->waiting.head;
        if (!q) {
            break;
        }
        if (!fits_whole(s, q)) { /* a preempted sequence that grew past the budget */
            LOG_WARN("sched",
                     "request %llu: %d tokens to re-prefill, more than the token budget "
                     "%d of a prefill-first step; finished at its length",
                     (unsigned long long)q->id, q->n_tokens, s->cfg.token_budget);
            finish(s, q, SCHED_FINISH_LENGTH, 0);
            (*events)++;
            continue;
        }
        if (q->n_tokens > room) {
            break; /* the budget is spent: the head waits for the next step */
        }
        struct kv_stats ks;
        kv_pool_stats(s->pool, &ks);
        int avail = ks.free + ks.cached_idle;
        if (q == s->blocked && avail <= s->blocked_avail) {
            break;
        }
        int matched =
            plp_pending(q) ? 0 : kv_seq_match(s->pool, &q->kv, q->tokens, q->n_tokens - 1);
        if (matched < 0) {
            doom_waiting(s, q, matched);
            continue;
        }
        q->n_computed = matched;
        int rc = kv_seq_grow(s->pool, &q->kv, q->n_tokens);
        if (rc != 0) {
            /* FCFS: nobody overtakes the head of the queue. */
            kv_seq_release(s->pool, &q->kv);
            q->n_computed = 0;
            if (rc != TANDEM_ENOSPACE) {
                doom_waiting(s, q, rc);
                continue;
            }
            s->blocked = q;
            s->blocked_avail = avail;
            continue; /* ready sequences may go now (ready_first) */
        }
        room -= q->n_tokens;
        start_prefill(s, q, matched, budget);
        s->pf[np++] = q;
    }
    return np;
}

static void run_decodes(struct sched *s, int nd)
{
    if (nd == 0) {
        return;
    }
    for (int i = 0; i < nd; i++) {
        struct seq *q = s->dec[i];
        /* What its emit touches after the decode (the caller's state for the
         * token, cold since the last step): fetched now, over the others. */
        if (q->user != NULL) {
            __builtin_prefetch(q->user);
            __builtin_prefetch((const char *)q->user + 64);
        }
        s->bseq[i] = (struct be_seq){
            .blocks = q->kv.blocks,
            .pos = q->n_computed,
            .history = q->tokens,
            .seed = q->sp.seed,
            .ctx = &q->ctx,
        };
        s->bout[i] = (struct be_out){
            .logits = s->emits ? NULL : s->logits + (size_t)i * (size_t)s->vocab,
        };
    }
    int rc = s->be->ops->decode(s->be, s->pool, nd, s->bseq, s->bout);
    for (int i = 0; i < nd; i++) {
        struct seq *q = s->dec[i];
        if (rc != 0) {
            LOG_WARN("sched", "decode of request %llu failed: %s", (unsigned long long)q->id,
                     tandem_strerror(rc));
            finish(s, q, SCHED_FINISH_ERROR, rc);
            continue;
        }
        q->n_computed++;
        commit(s, q);
        sample_emit(s, q, &s->bout[i]);
    }
}

/* One backend prefill call over the next n tokens of q. Returns 1 when its
 * prefill is over (complete, or failed): q may then be freed, and the caller
 * must not touch it. */
static int prefill_call(struct sched *s, struct seq *q, int n)
{
    struct be_out out = {.logits = s->emits ? NULL : s->logits};
    int pos = q->n_computed;
    int plp = plp_pending(q);
    struct be_seq bq = {
        .blocks = q->kv.blocks,
        .pos = pos,
        .history = q->tokens,
        .seed = q->sp.seed,
        .ctx = &q->ctx,
    };
    int rc = s->be->ops->prefill(s->be, s->pool, &bq, q->tokens + pos, n, &out,
                                 plp ? s->logits_all : NULL);
    if (rc != 0) {
        LOG_WARN("sched", "prefill of request %llu failed: %s", (unsigned long long)q->id,
                 tandem_strerror(rc));
        finish(s, q, SCHED_FINISH_ERROR, rc);
        return 1;
    }
    q->n_computed += n;
    s->st.prefill_tokens_computed += (uint64_t)n;
    commit(s, q);
    if (plp) {
        report_plp(s, q, pos, n);
    }
    int done = q->n_computed == q->n_tokens;
    if (q->mode == SCHED_MODE_PREFILL_ONLY) {
        report_blocks(s, q, done);
    }
    if (done) {
        q->phase = PH_DECODE;
        sample_emit(s, q, &out);
        return 1;
    }
    return 0;
}

/* Runs q's chunk for this step: one call, or, for a whole prompt with
 * prompt logprobs due (prefill-first), calls of at most SCHED_PLP_CHUNK
 * tokens (the logits_all buffer's rows; batch invariance makes them the
 * same bits as one call). */
static void run_prefill(struct sched *s, struct seq *q)
{
    int left = q->chunk;
    while (left > 0) {
        int n = plp_pending(q) ? min_int(left, SCHED_PLP_CHUNK) : left;
        left -= n;
        if (prefill_call(s, q, n)) {
            return;
        }
    }
}

int sched_admit(struct sched *s)
{
    return admit_ready(s);
}

int sched_step(struct sched *s)
{
    s->step_no++;
    int budget = s->cfg.token_budget;
    int events = admit_ready(s);
    uint64_t preempted_before = s->st.preemptions;
    int nd = 0, np = 0;
    if (s->cfg.policy == SCHED_POLICY_PREFILL_FIRST) {
        np = admit_whole(s, &budget, &events);
        if (np == 0) {
            nd = schedule_decodes(s, &budget, &events);
        }
    } else {
        nd = schedule_decodes(s, &budget, &events);
        np = schedule_prefills(s, &budget, &events, preempted_before);
    }
    int tokens = s->cfg.token_budget - budget;
    s->st.last_step_tokens = tokens;
    s->st.last_step_decodes = nd;
    s->st.last_step_prefills = np;
    /* The prefill chunks' sequences are pinned by their stamps: nothing in
     * run_decodes preempts, so the pointers stay valid. */
    run_decodes(s, nd);
    for (int i = 0; i < np; i++) {
        run_prefill(s, s->pf[i]);
    }
    /* A preemption changed the state: report it as progress so the caller
     * steps again rather than waiting for new work. */
    events += (int)(s->st.preemptions - preempted_before);
    if (tokens > 0) {
        s->st.steps++;
        if (s->be->ops->step_end) {
            s->be->ops->step_end(s->be);
        }
    }
    /* Doomed during scheduling (allocation failures): fail them now. */
    while (s->doomed.head) {
        struct seq *q = s->doomed.head;
        finish(s, q, SCHED_FINISH_ERROR, q->err);
        events++;
    }
    return tokens + events;
}

int sched_busy(const struct sched *s)
{
    return s->running.n + s->ready.n + s->waiting.n + s->doomed.n > 0;
}

int sched_has(const struct sched *s, uint64_t id)
{
    return find(s, id) != NULL;
}

void sched_count_refs(const struct sched *s, int32_t *refs)
{
    const struct seq_list *lists[] = {&s->running, &s->ready, &s->waiting, &s->doomed};
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        for (const struct seq *q = lists[i]->head; q; q = q->next) {
            kv_seq_count_refs(&q->kv, refs);
        }
    }
}

int sched_max_context(const struct sched *s)
{
    return s->max_ctx;
}

void sched_stats(const struct sched *s, struct sched_stats *out)
{
    *out = s->st;
    out->waiting = s->waiting.n + s->ready.n + s->doomed.n;
    out->running = s->running.n;
    int64_t q = 0;
    for (const struct seq *x = s->waiting.head; x; x = x->next) {
        q += x->n_tokens;
    }
    for (const struct seq *x = s->running.head; x; x = x->next) {
        if (x->phase == PH_PREFILL) {
            q += x->n_tokens - x->n_computed;
        }
    }
    out->prefill_tokens_queued = q;
    struct kv_stats ks;
    kv_pool_stats(s->pool, &ks);
    int bs = kv_pool_config(s->pool)->block_size;
    out->prefix_cache_queries = ks.query_blocks * (uint64_t)bs;
    out->prefix_cache_hits = ks.hit_blocks * (uint64_t)bs;
}
