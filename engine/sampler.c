#include "sampler.h"

#include <math.h>
#include <stdlib.h>

#include "tandem_err.h"
#include "tandem_rng.h"

/* Candidates selected by top-k with a bounded insertion sort when k is at
 * most this; a full sort of the vocabulary otherwise. */
#define SAMPLER_INSERT_K 64

struct cand {
    uint32_t id;
    float logit;
};

struct sampler {
    int vocab;
    struct cand *cand; /* (vocab) candidates, sorted when a filter is on */
    double *prob;      /* (vocab) unnormalised probabilities of cand[] */
};

static float clean(float x)
{
    return isnan(x) ? -INFINITY : x;
}

/* Strict total order: larger logit first, then lower id. */
static int cand_before(float la, uint32_t ia, float lb, uint32_t ib)
{
    return la > lb || (la == lb && ia < ib);
}

static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a;
    const struct cand *y = b;
    if (cand_before(x->logit, x->id, y->logit, y->id)) {
        return -1;
    }
    return cand_before(y->logit, y->id, x->logit, x->id) ? 1 : 0;
}

/* Keeps the k best of logits[0..n) in top[0..k), best first. Scans ids in
 * increasing order and inserts only strictly better entries, so among equal
 * logits the lower id stays ahead. Returns min(k, n). */
static int select_top(const float *logits, int n, int k, struct cand *top)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        float l = clean(logits[i]);
        if (m == k && !cand_before(l, (uint32_t)i, top[m - 1].logit, top[m - 1].id)) {
            continue;
        }
        int j = m < k ? m++ : k - 1;
        while (j > 0 && cand_before(l, (uint32_t)i, top[j - 1].logit, top[j - 1].id)) {
            top[j] = top[j - 1];
            j--;
        }
        top[j].id = (uint32_t)i;
        top[j].logit = l;
    }
    return m;
}

struct sampler_params sampler_params_greedy(void)
{
    struct sampler_params p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    return p;
}

int sampler_params_check(const struct sampler_params *p)
{
    if (!p || !isfinite(p->temperature) || p->temperature < 0.0f) {
        return TANDEM_EINVAL;
    }
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) {
        return TANDEM_EINVAL;
    }
    return 0;
}

double sampler_uniform(uint64_t seed, uint64_t index)
{
    /* splitmix64 finaliser over (mixed seed, index): nearby seeds and
     * nearby indices give unrelated streams. */
    uint64_t x = rng_mix64(rng_mix64(seed ^ 0x5851f42d4c957f2dULL) + RNG_GOLDEN * (index + 1));
    return (double)(x >> 11) * 0x1.0p-53;
}

uint32_t sampler_argmax(const float *logits, int n)
{
    uint32_t best = 0;
    float bl = clean(logits[0]);
    for (int i = 1; i < n; i++) {
        float l = clean(logits[i]);
        if (l > bl) {
            bl = l;
            best = (uint32_t)i;
        }
    }
    return best;
}

float sampler_logprobs(const float *logits, int n, uint32_t token, struct sampler_top *top,
                       int n_top)
{
    float mx = clean(logits[0]);
    for (int i = 1; i < n; i++) {
        float l = clean(logits[i]);
        mx = l > mx ? l : mx;
    }
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        sum += exp((double)clean(logits[i]) - (double)mx);
    }
    double lse = (double)mx + log(sum);
    if (n_top > SAMPLER_MAX_TOP) {
        n_top = SAMPLER_MAX_TOP;
    }
    if (n_top > n) {
        n_top = n;
    }
    if (n_top > 0) {
        struct cand best[SAMPLER_MAX_TOP];
        int m = select_top(logits, n, n_top, best);
        for (int j = 0; j < m; j++) {
            top[j].token = best[j].id;
            top[j].logprob = (float)((double)best[j].logit - lse);
        }
    }
    if (token >= (uint32_t)n) {
        return -INFINITY;
    }
    return (float)((double)clean(logits[token]) - lse);
}

int sampler_create(struct sampler **out, int vocab_size)
{
    if (!out || vocab_size < 1) {
        return TANDEM_EINVAL;
    }
    struct sampler *s = calloc(1, sizeof(*s));
    if (!s) {
        goto fail_s;
    }
    s->vocab = vocab_size;
    s->cand = malloc((size_t)vocab_size * sizeof(*s->cand));
    if (!s->cand) {
        goto fail_cand;
    }
    s->prob = malloc((size_t)vocab_size * sizeof(*s->prob));
    if (!s->prob) {
        goto fail_prob;
    }
    *out = s;
    return 0;

fail_prob:
    free(s->cand);
fail_cand:
    free(s);
fail_s:
    return TANDEM_ENOMEM;
}

void sampler_destroy(struct sampler *s)
{
    if (!s) {
        return;
    }
    free(s->prob);
    free(s->cand);
    free(s);
}

uint32_t sampler_sample(struct sampler *s, const struct sampler_params *p, const float *logits,
                        uint64_t index)
{
    int n = s->vocab;
    int k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    if (p->temperature == 0.0f || k == 1) {
        return sampler_argmax(logits, n);
    }
    int sorted = k < n || p->top_p < 1.0f;
    int m;
    if (k < n && k <= SAMPLER_INSERT_K) {
        m = select_top(logits, n, k, s->cand);
    } else {
        for (int i = 0; i < n; i++) {
            s->cand[i].id = (uint32_t)i;
            s->cand[i].logit = clean(logits[i]);
        }
        if (sorted) {
            qsort(s->cand, (size_t)n, sizeof(*s->cand), cand_cmp);
        }
        m = k;
    }
    float mx = s->cand[0].logit;
    for (int i = 1; i < m; i++) {
        mx = s->cand[i].logit > mx ? s->cand[i].logit : mx;
    }
    if (mx == -INFINITY) {
        return s->cand[0].id;
    }
    double inv_t = 1.0 / (double)p->temperature;
    double total = 0.0;
    for (int i = 0; i < m; i++) {
        s->prob[i] = exp(((double)s->cand[i].logit - (double)mx) * inv_t);
        total += s->prob[i];
    }
    if (p->top_p < 1.0f) {
        /* Smallest prefix (most likely first) whose mass reaches top_p. */
        double want = (double)p->top_p * total;
        double acc = 0.0;
        int keep = 0;
        while (keep < m && acc < want) {
            acc += s->prob[keep++];
        }
        m = keep > 0 ? keep : 1;
        total = 0.0;
        for (int i = 0; i < m; i++) {
            total += s->prob[i];
        }
    }
    double r = sampler_uniform(p->seed, index) * total;
    double acc = 0.0;
    for (int i = 0; i < m; i++) {
        acc += s->prob[i];
        if (acc > r) {
            return s->cand[i].id;
        }
    }
    /* Rounding left r at the very top: the last candidate with mass. */
    for (int i = m - 1; i > 0; i--) {
        if (s->prob[i] > 0.0) {
            return s->cand[i].id;
        }
    }
    return s->cand[0].id;
}
