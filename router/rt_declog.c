/* Decision records, copied now and formatted when read: see rt_declog.h. */
#include "rt_declog.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "tandem_err.h"

#define FORMAT_MAX (64u << 20) /* largest record text tried */

int rt_declog_init(struct rt_declog *l, int cap)
{
    memset(l, 0, sizeof(*l));
    l->cap = cap;
    l->buf_cap = 4096;
    l->buf = malloc(l->buf_cap);
    l->e = calloc((size_t)(cap > 0 ? cap : 1), sizeof(*l->e));
    l->seq = calloc((size_t)(cap > 0 ? cap : 1), sizeof(*l->seq));
    if (l->buf == NULL || l->e == NULL || l->seq == NULL) {
        free(l->buf);
        free(l->e);
        free(l->seq);
        memset(l, 0, sizeof(*l));
        return TANDEM_ENOMEM;
    }
    return 0;
}

void rt_declog_fini(struct rt_declog *l)
{
    for (int i = 0; i < l->cap && l->e != NULL; i++) {
        free(l->e[i].json);
        free(l->e[i].cand);
        free(l->e[i].num);
    }
    free(l->e);
    free(l->seq);
    free(l->names);
    free(l->buf);
    memset(l, 0, sizeof(*l));
}

/* Grows *p to hold n elements of size sz (capacity *cap, doubled). */
static int reserve(void **p, size_t *cap, size_t n, size_t sz)
{
    if (n <= *cap) {
        return 0;
    }
    size_t c = *cap ? *cap : 16;
    while (c < n) {
        c *= 2;
    }
    void *q = realloc(*p, c * sz);
    if (q == NULL) {
        return TANDEM_ENOMEM;
    }
    *p = q;
    *cap = c;
    return 0;
}

/* Names of the kept records: the id of the generation they name. */
static const char *kept_name(const void *arg, int ep)
{
    const struct rt_declog *l = arg;
    if (ep < 0 || ep >= l->n_names || l->names[ep].gen == 0) {
        return NULL;
    }
    return l->names[ep].id;
}

/* Names of a decision just made: the pipeline's slots. */
static const char *live_name(const void *arg, int ep)
{
    return rt_pipeline_slot_id(arg, ep, NULL);
}

/* Formats d into l->buf (grown as needed). Returns the length or an error. */
static int format(struct rt_declog *l, const struct rt_decision *d, rt_ep_name_fn name,
                  const void *arg)
{
    int n = rt_decision_format_with(d, name, arg, l->buf, l->buf_cap);
    while (n == TANDEM_ETOOBIG && l->buf_cap < FORMAT_MAX) {
        char *b = realloc(l->buf, l->buf_cap * 2);
        if (b == NULL) {
            break;
        }
        l->buf = b;
        l->buf_cap *= 2;
        n = rt_decision_format_with(d, name, arg, l->buf, l->buf_cap);
    }
    return n;
}

static int names_ep(const struct rt_decision *d, int ep)
{
    if (d->decode == ep || d->prefill == ep) {
        return 1;
    }
    for (int r = 0; r < d->n_runs; r++) {
        if (d->runs[r].picked == ep || rt_run_find(&d->runs[r], ep) >= 0) {
            return 1;
        }
    }
    return 0;
}

/* Writes every lazy record naming slot ep as text now, while l->names[ep]
 * still holds the id they name; one that cannot be written is dropped
 * rather than served with another endpoint's name. */
static void settle_slot(struct rt_declog *l, int ep)
{
    for (int i = 0; i < l->cap; i++) {
        struct rt_declog_entry *e = &l->e[i];
        if (l->seq[i] == 0 || e->text || !names_ep(&e->dec, ep)) {
            continue;
        }
        int n = format(l, &e->dec, kept_name, l);
        size_t cap = e->json_cap;
        if (n < 0 || reserve((void **)&e->json, &cap, (size_t)n + 1, 1) != 0) {
            l->seq[i] = 0;
            continue;
        }
        e->json_cap = cap;
        memcpy(e->json, l->buf, (size_t)n + 1);
        e->text = 1;
    }
}

/* Makes l->names[ep] the id of ep's current generation. */
static int note_name(struct rt_declog *l, const struct rt_pipeline *pl, int ep)
{
    uint32_t gen;
    const char *id = rt_pipeline_slot_id(pl, ep, &gen);
    if (id == NULL) {
        return 0; /* out of range: written null, as rt_decision_format does */
    }
    if (ep >= l->n_names) {
        size_t cap = (size_t)l->n_names;
        if (reserve((void **)&l->names, &cap, (size_t)ep + 1, sizeof(*l->names)) != 0) {
            return TANDEM_ENOMEM;
        }
        memset(l->names + l->n_names, 0, (cap - (size_t)l->n_names) * sizeof(*l->names));
        l->n_names = (int)cap;
    }
    struct rt_declog_name *nm = &l->names[ep];
    if (nm->gen == gen) {
        return 0;
    }
    if (nm->gen != 0) {
        settle_slot(l, ep);
    }
    nm->gen = gen;
    memcpy(nm->id, id, sizeof(nm->id));
    nm->id[sizeof(nm->id) - 1] = '\0';
    return 0;
}

static int note_names(struct rt_declog *l, const struct rt_pipeline *pl,
                      const struct rt_decision *d)
{
    int rc = note_name(l, pl, d->decode);
    if (rc == 0) {
        rc = note_name(l, pl, d->prefill);
    }
    for (int r = 0; r < d->n_runs && rc == 0; r++) {
        const struct rt_profile_run *run = &d->runs[r];
        rc = note_name(l, pl, run->picked);
        for (int i = 0; i < run->n_candidates && rc == 0; i++) {
            rc = note_name(l, pl, run->candidates[i]);
        }
    }
    return rc;
}

/* Copies d into e, its runs' arrays into e's own buffers. */
static int copy_decision(struct rt_declog_entry *e, const struct rt_decision *d)
{
    size_t nc = 0, nn = 0;
    for (int r = 0; r < d->n_runs; r++) {
        const struct rt_profile_run *run = &d->runs[r];
        nc += (size_t)run->n_candidates;
        nn += (size_t)run->n_candidates * (size_t)(run->n_scorers + 1);
    }
    if (reserve((void **)&e->cand, &e->cand_cap, nc, sizeof(int)) != 0 ||
        reserve((void **)&e->num, &e->num_cap, nn, sizeof(double)) != 0) {
        return TANDEM_ENOMEM;
    }
    e->dec = *d;
    int *cand = e->cand;
    double *num = e->num;
    for (int r = 0; r < d->n_runs; r++) {
        const struct rt_profile_run *run = &d->runs[r];
        struct rt_profile_run *to = &e->dec.runs[r];
        size_t n = (size_t)run->n_candidates;
        size_t nraw = n * (size_t)run->n_scorers;
        if (n > 0) {
            memcpy(cand, run->candidates, n * sizeof(int));
            memcpy(num, run->total, n * sizeof(double));
        }
        if (nraw > 0) {
            memcpy(num + n, run->raw, nraw * sizeof(double));
        }
        /* scorers, weights, picker and profile_name are the pipeline's: kept. */
        to->candidates = cand;
        to->total = num;
        to->raw = num + n;
        cand += n;
        num += n + nraw;
    }
    return 0;
}

void rt_declog_add(struct rt_declog *l, const struct rt_pipeline *pl, const struct rt_decision *d)
{
    int debug = log_get_level() <= LOG_LEVEL_DEBUG;
    if (l->buf == NULL || (l->cap == 0 && !debug)) {
        return;
    }
    if (l->cap == 0) {
        if (format(l, d, live_name, pl) >= 0) {
            LOG_DEBUG("decision", "%s", l->buf);
        }
        return;
    }
    /* The oldest record goes first: its buffers are the new one's. */
    int at = l->head;
    struct rt_declog_entry *e = &l->e[at];
    l->seq[at] = 0;
    l->head = (l->head + 1) % l->cap;
    if (l->n < l->cap) {
        l->n++;
    }
    if (note_names(l, pl, d) != 0 || copy_decision(e, d) != 0) {
        return;
    }
    l->seq[at] = d->seq;
    e->actual = -1;
    e->text = 0;
    if (debug && format(l, &e->dec, kept_name, l) >= 0) {
        LOG_DEBUG("decision", "%s", l->buf);
    }
}

void rt_declog_actual(struct rt_declog *l, uint64_t seq, int actual)
{
    /* Newest first: a finishing request's decision is usually recent. */
    for (int k = 0; k < l->n; k++) {
        int i = (l->head - 1 - k + l->cap) % l->cap;
        if (l->seq[i] == seq) {
            l->e[i].actual = actual;
            return;
        }
    }
}

int rt_declog_count(const struct rt_declog *l)
{
    return l->n;
}

const char *rt_declog_json(struct rt_declog *l, int k, int *actual)
{
    if (k < 0 || k >= l->n) {
        return NULL;
    }
    int i = (l->head - 1 - k + l->cap) % l->cap;
    struct rt_declog_entry *e = &l->e[i];
    if (l->seq[i] == 0) {
        return NULL;
    }
    *actual = e->actual;
    if (e->text) {
        return e->json;
    }
    return format(l, &e->dec, kept_name, l) >= 0 ? l->buf : NULL;
}
