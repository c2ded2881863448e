#include "summary.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"

static const char *const fail_names[] = {
#define LG_X(name, str) str,
    LG_FAIL_MAP(LG_X)
#undef LG_X
};

const char *lg_fail_name(enum lg_fail f)
{
    if ((int)f < 0 || f >= LG_FAIL_COUNT) {
        return "unknown";
    }
    return fail_names[f];
}

void lg_fail_key(const struct lg_record *r, char *out, size_t len)
{
    if (r->reason == LG_FAIL_HTTP) {
        snprintf(out, len, "http_%d", (int)r->http_status);
    } else {
        snprintf(out, len, "%s", lg_fail_name(r->reason));
    }
}

void lg_record_clear(struct lg_record *r)
{
    free(r->itl_s);
    free(r->error);
    r->itl_s = NULL;
    r->error = NULL;
    r->n_itl = 0;
}

void lg_slo_clear(struct lg_slo *slo)
{
    slo->ttft_ms = slo->tpot_ms = slo->e2el_ms = -1;
}

/* numpy's _lerp: a + (b - a) t, computed from b when t >= 0.5 so that t = 1
 * gives b exactly. */
static double lerp(double a, double b, double t)
{
    double d = b - a;
    return t >= 0.5 ? b - d * (1.0 - t) : a + d * t;
}

double lg_percentile(const double *sorted, size_t n, double p)
{
    if (n == 0) {
        return 0;
    }
    double q = p / 100.0;
    double vi = (double)(n - 1) * q;
    double lo = floor(vi);
    size_t i = (size_t)lo;
    if (i >= n - 1) {
        return sorted[n - 1];
    }
    return lerp(sorted[i], sorted[i + 1], vi - lo);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The IEEE bits of x as an unsigned key in the order of x (-0 before +0). */
static uint64_t sort_key(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof(u));
    return u >> 63 ? ~u : u | (UINT64_C(1) << 63);
}

/* Sorts v ascending: qsort for small n, else an LSD radix sort on the keys,
 * 16 bits a pass (a 100k-request simulation has 27M inter-token gaps, which
 * qsort took seconds over). Falls back to qsort when out of memory. */
static void sort_doubles(double *v, size_t n)
{
    enum { BITS = 16, BUCKETS = 1 << BITS };
    uint64_t *a = n >= 65536 ? malloc(n * sizeof(*a)) : NULL;
    uint64_t *b = a != NULL ? malloc(n * sizeof(*b)) : NULL;
    size_t *count = b != NULL ? malloc(BUCKETS * sizeof(*count)) : NULL;
    if (count == NULL) {
        free(a);
        free(b);
        qsort(v, n, sizeof(double), cmp_double);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        a[i] = sort_key(v[i]);
    }
    for (int shift = 0; shift < 64; shift += BITS) {
        memset(count, 0, BUCKETS * sizeof(*count));
        for (size_t i = 0; i < n; i++) {
            count[(a[i] >> shift) & (BUCKETS - 1)]++;
        }
        size_t at = 0;
        for (size_t k = 0; k < BUCKETS; k++) {
            size_t c = count[k];
            count[k] = at;
            at += c;
        }
        for (size_t i = 0; i < n; i++) {
            b[count[(a[i] >> shift) & (BUCKETS - 1)]++] = a[i];
        }
        uint64_t *t = a;
        a = b;
        b = t;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t u = a[i] >> 63 ? a[i] & ~(UINT64_C(1) << 63) : ~a[i];
        memcpy(&v[i], &u, sizeof(u));
    }
    free(a);
    free(b);
    free(count);
}

void lg_dist_compute(double *values, size_t n, const double *percentiles, int n_percentiles,
                     double scale, struct lg_dist *out)
{
    memset(out, 0, sizeof(*out));
    out->n = n;
    if (n == 0) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        values[i] *= scale;
    }
    sort_doubles(values, n);
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        sum += values[i];
    }
    double mean = sum / (double)n;
    double ss = 0;
    for (size_t i = 0; i < n; i++) {
        ss += (values[i] - mean) * (values[i] - mean);
    }
    out->mean = mean;
    out->std = sqrt(ss / (double)n);
    /* numpy.median averages the two middle values. */
    out->median = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2.0;
    for (int k = 0; k < n_percentiles && k < LG_MAX_PERCENTILES; k++) {
        out->pct[k] = lg_percentile(values, n, percentiles[k]);
    }
}

double lg_tpot_s(const struct lg_record *r)
{
    if (r->output_tokens <= 1) {
        return 0;
    }
    return (r->e2el_s - r->ttft_s) / (double)(r->output_tokens - 1);
}

int lg_has_tpot(const struct lg_record *r)
{
    return r->ok && r->output_tokens > 1;
}

static void count_failure(struct lg_summary *s, const struct lg_record *r)
{
    char key[32];
    lg_fail_key(r, key, sizeof(key));
    int i;
    for (i = 0; i < s->n_failure_kinds; i++) {
        if (strcmp(s->failures[i].key, key) == 0) {
            break;
        }
    }
    if (i == s->n_failure_kinds) {
        if (i == LG_MAX_FAIL_KINDS) {
            i = LG_MAX_FAIL_KINDS - 1;
            snprintf(s->failures[i].key, sizeof(s->failures[i].key), "other");
        } else {
            s->n_failure_kinds++;
            snprintf(s->failures[i].key, sizeof(s->failures[i].key), "%s", key);
            snprintf(s->failures[i].example, sizeof(s->failures[i].example), "%s",
                     r->error ? r->error : "");
        }
    }
    s->failures[i].count++;
}

struct event {
    double t;
    int delta;
};

static int cmp_event(const void *a, const void *b)
{
    const struct event *x = a, *y = b;
    if (x->t != y->t) {
        return (x->t > y->t) - (x->t < y->t);
    }
    return x->delta - y->delta; /* departures (-1) before arrivals (+1) */
}

/* vLLM's peak output tokens per second (1 s buckets from the first start)
 * and peak concurrency (sweep over half-open [start, start + e2el)). */
static int peaks(const struct lg_record *recs, size_t n, struct lg_summary *s)
{
    double t0 = INFINITY, t1 = -INFINITY;
    size_t ok = 0;
    for (size_t i = 0; i < n; i++) {
        if (recs[i].ok) {
            ok++;
            t0 = fmin(t0, recs[i].start_s);
            t1 = fmax(t1, recs[i].start_s + recs[i].e2el_s);
        }
    }
    if (ok == 0) {
        return 0;
    }
    size_t nb = (size_t)ceil(t1 - t0) + 1;
    double *buckets = calloc(nb, sizeof(double));
    struct event *ev = malloc(2 * ok * sizeof(*ev));
    if (buckets == NULL || ev == NULL) {
        free(buckets);
        free(ev);
        return TANDEM_ENOMEM;
    }
    size_t ne = 0;
    for (size_t i = 0; i < n; i++) {
        const struct lg_record *r = &recs[i];
        if (!r->ok) {
            continue;
        }
        double t = r->start_s + r->ttft_s;
        for (uint32_t k = 0;; k++) {
            double b = floor(t - t0);
            if (b >= 0 && b < (double)nb) {
                buckets[(size_t)b] += 1;
            }
            if (k >= r->n_itl) {
                break;
            }
            t += r->itl_s[k];
        }
        ev[ne++] = (struct event){r->start_s, +1};
        ev[ne++] = (struct event){r->start_s + r->e2el_s, -1};
    }
    for (size_t b = 0; b < nb; b++) {
        s->max_output_tokens_per_s = fmax(s->max_output_tokens_per_s, buckets[b]);
    }
    qsort(ev, ne, sizeof(*ev), cmp_event);
    int64_t cur = 0;
    for (size_t i = 0; i < ne; i++) {
        cur += ev[i].delta;
        if (cur > s->max_concurrent_requests) {
            s->max_concurrent_requests = cur;
        }
    }
    free(buckets);
    free(ev);
    return 0;
}

int lg_summary_compute(const struct lg_record *recs, size_t n, double duration_s,
                       const struct lg_summary_opts *opts, struct lg_summary *s)
{
    memset(s, 0, sizeof(*s));
    if (opts->n_percentiles < 0 || opts->n_percentiles > LG_MAX_PERCENTILES || !(duration_s >= 0)) {
        return TANDEM_EINVAL;
    }
    s->n_percentiles = opts->n_percentiles;
    memcpy(s->percentiles, opts->percentiles, sizeof(s->percentiles));
    s->slo = opts->slo;
    s->duration_s = duration_s;

    size_t n_itl = 0;
    for (size_t i = 0; i < n; i++) {
        if (recs[i].ok) {
            n_itl += recs[i].n_itl;
        }
    }
    double *ttft = malloc((n + 1) * sizeof(double));
    double *tpot = malloc((n + 1) * sizeof(double));
    double *e2el = malloc((n + 1) * sizeof(double));
    double *queue = malloc((n + 1) * sizeof(double));
    double *itl = malloc((n_itl + 1) * sizeof(double));
    int rc = 0;
    if (ttft == NULL || tpot == NULL || e2el == NULL || queue == NULL || itl == NULL) {
        rc = TANDEM_ENOMEM;
        goto out;
    }
    const struct lg_slo *slo = &opts->slo;
    s->has_goodput = slo->ttft_ms >= 0 || slo->tpot_ms >= 0 || slo->e2el_ms >= 0;
    size_t nt = 0, np = 0, ni = 0, nq = 0;
    int64_t ttft_ok = 0, tpot_ok = 0, e2el_ok = 0;
    for (size_t i = 0; i < n; i++) {
        const struct lg_record *r = &recs[i];
        if (!r->ok) {
            s->failed++;
            count_failure(s, r);
            continue;
        }
        s->completed++;
        s->total_input += r->prompt_tokens;
        s->total_output += r->output_tokens;
        s->usage_output_requests += r->usage_output;
        ttft[nt++] = r->ttft_s;
        e2el[nq] = r->e2el_s;
        queue[nq++] = r->start_s - r->arrival_s;
        if (lg_has_tpot(r)) {
            tpot[np++] = lg_tpot_s(r);
        }
        for (uint32_t k = 0; k < r->n_itl; k++) {
            itl[ni++] = r->itl_s[k];
        }
        if (r->cached_tokens >= 0) {
            s->requests_with_cached++;
            s->cached_tokens += r->cached_tokens;
            s->cached_prompt_tokens += r->prompt_tokens;
        }
        /* vLLM compares slo_ms / 1000 >= value in seconds. */
        int a = slo->ttft_ms < 0 || slo->ttft_ms / 1000.0 >= r->ttft_s;
        int b = slo->tpot_ms < 0 || slo->tpot_ms / 1000.0 >= lg_tpot_s(r);
        int c = slo->e2el_ms < 0 || slo->e2el_ms / 1000.0 >= r->e2el_s;
        ttft_ok += a;
        tpot_ok += b;
        e2el_ok += c;
        if (s->has_goodput && a && b && c) {
            s->good++;
        }
    }
    double dur = duration_s > 0 ? duration_s : NAN;
    s->request_throughput = (double)s->completed / dur;
    s->output_throughput = (double)s->total_output / dur;
    s->total_token_throughput = (double)(s->total_input + s->total_output) / dur;
    s->request_goodput = s->has_goodput ? (double)s->good / dur : NAN;
    double all = (double)n;
    s->slo_attainment = s->has_goodput && n > 0 ? (double)s->good / all : NAN;
    s->ttft_attainment = slo->ttft_ms >= 0 && n > 0 ? (double)ttft_ok / all : NAN;
    s->tpot_attainment = slo->tpot_ms >= 0 && n > 0 ? (double)tpot_ok / all : NAN;
    s->e2el_attainment = slo->e2el_ms >= 0 && n > 0 ? (double)e2el_ok / all : NAN;
    s->cached_token_ratio = s->requests_with_cached > 0 && s->cached_prompt_tokens > 0
                                ? (double)s->cached_tokens / (double)s->cached_prompt_tokens
                                : (s->requests_with_cached > 0 ? 0.0 : NAN);
    const double *p = opts->percentiles;
    int k = opts->n_percentiles;
    lg_dist_compute(ttft, nt, p, k, 1000.0, &s->ttft);
    lg_dist_compute(tpot, np, p, k, 1000.0, &s->tpot);
    lg_dist_compute(itl, ni, p, k, 1000.0, &s->itl);
    lg_dist_compute(e2el, nq, p, k, 1000.0, &s->e2el);
    lg_dist_compute(queue, nq, p, k, 1000.0, &s->queue);
    rc = peaks(recs, n, s);
out:
    free(ttft);
    free(tpot);
    free(e2el);
    free(queue);
    free(itl);
    return rc;
}

int lg_parse_percentiles(const char *s, struct lg_summary_opts *opts)
{
    int n = 0;
    const char *p = s;
    if (s == NULL || *s == '\0') {
        return TANDEM_EINVAL;
    }
    for (;;) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno != 0 || !(v >= 0 && v <= 100) || n >= LG_MAX_PERCENTILES ||
            (*end != ',' && *end != '\0')) {
            return TANDEM_EINVAL;
        }
        opts->percentiles[n++] = v;
        if (*end == '\0') {
            break;
        }
        p = end + 1;
    }
    opts->n_percentiles = n;
    return 0;
}

int lg_parse_goodput(const char *s, struct lg_slo *slo)
{
    if (s == NULL) {
        return TANDEM_EINVAL;
    }
    const char *p = s;
    int any = 0;
    for (;;) {
        while (*p == ',' || *p == ' ') {
            p++;
        }
        if (*p == '\0') {
            break;
        }
        const char *colon = strchr(p, ':');
        if (colon == NULL) {
            return TANDEM_EINVAL;
        }
        size_t nlen = (size_t)(colon - p);
        char *end;
        errno = 0;
        double v = strtod(colon + 1, &end);
        if (end == colon + 1 || errno != 0 || !(v >= 0) || isinf(v) ||
            (*end != ',' && *end != ' ' && *end != '\0')) {
            return TANDEM_EINVAL;
        }
        if (nlen == 4 && strncmp(p, "ttft", 4) == 0) {
            slo->ttft_ms = v;
        } else if (nlen == 4 && strncmp(p, "tpot", 4) == 0) {
            slo->tpot_ms = v;
        } else if (nlen == 4 && strncmp(p, "e2el", 4) == 0) {
            slo->e2el_ms = v;
        } else {
            return TANDEM_EINVAL;
        }
        any = 1;
        p = end;
    }
    return any ? 0 : TANDEM_EINVAL;
}
