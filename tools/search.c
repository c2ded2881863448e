/* The rate search (per-GPU goodput) and the P:D search. See search.h. */
#define _GNU_SOURCE
#include "search.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"

void search_rate_opts_default(struct search_rate_opts *o)
{
    *o = (struct search_rate_opts){
        .attainment = 0.9,
        .min_rate = 0.25,
        .max_rate = 64,
        .resolution = 0.25,
        .seeds = 5,
    };
}

int search_rate_opts_check(const struct search_rate_opts *o, char *err, size_t errlen)
{
    if (!(o->attainment > 0 && o->attainment <= 1)) {
        snprintf(err, errlen, "attainment %g is not in (0, 1] (a share: 0.9 is 90%%)",
                 o->attainment);
    } else if (!(o->min_rate > 0) || !isfinite(o->min_rate)) {
        snprintf(err, errlen, "min_rate %g is not a positive number of requests per second",
                 o->min_rate);
    } else if (!(o->max_rate > o->min_rate) || !isfinite(o->max_rate)) {
        snprintf(err, errlen, "max_rate %g must be above min_rate %g", o->max_rate, o->min_rate);
    } else if (!(o->resolution > 0 && o->resolution <= o->max_rate - o->min_rate)) {
        snprintf(err, errlen, "resolution %g must be in (0, max_rate - min_rate = %g]",
                 o->resolution, o->max_rate - o->min_rate);
    } else if (o->seeds < 1 || o->seeds > EXP_MAX_SEEDS) {
        snprintf(err, errlen, "seeds %d is not in [1, %d]", o->seeds, EXP_MAX_SEEDS);
    } else {
        return 0;
    }
    return TANDEM_EINVAL;
}

/* ------------------------------------------------------------------ */
/* The rate search                                                     */
/* ------------------------------------------------------------------ */

struct probe_ctx {
    const struct cluster *c;
    const struct sm_options *so;
    const struct lg_run_config *run;
    const struct lg_slo *slo;
    uint64_t seed;
    int gpus;
    int probes;
};

/* Attainment at rate r (0..1 into *att). 0 or sm_run's error. */
static int probe(struct probe_ctx *p, double r, double *att, char *err, size_t errlen)
{
    struct lg_run_config cfg = *p->run;
    cfg.request_rate = r;
    cfg.workload.seed = p->seed;
    cfg.progress = 0;
    struct lg_run_result res;
    struct sm_stats st;
    int rc = sm_run(p->c, &cfg, p->so, &res, &st, err, errlen);
    if (rc != 0) {
        return rc;
    }
    p->probes++;
    p->gpus = st.gpus;
    *att = exp_attainment_records(res.records, res.n, p->slo, 1.0);
    *att = isfinite(*att) ? *att : 0;
    lg_run_result_free(&res);
    return 0;
}

/* One seed: the highest rate passing, bracketed by min_rate and max_rate
 * and bisected to the resolution. */
static int search_one(struct probe_ctx *p, const struct search_rate_opts *o, double *rate,
                      int *below, int *at_max, char *err, size_t errlen)
{
    double a;
    int rc = probe(p, o->min_rate, &a, err, errlen);
    if (rc != 0) {
        return rc;
    }
    if (a < o->attainment) {
        *rate = 0;
        (*below)++;
        return 0;
    }
    if ((rc = probe(p, o->max_rate, &a, err, errlen)) != 0) {
        return rc;
    }
    if (a >= o->attainment) {
        *rate = o->max_rate;
        (*at_max)++;
        return 0;
    }
    double lo = o->min_rate, hi = o->max_rate;
    while (hi - lo > o->resolution) {
        double mid = (lo + hi) / 2;
        if ((rc = probe(p, mid, &a, err, errlen)) != 0) {
            return rc;
        }
        if (a >= o->attainment) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    *rate = lo;
    return 0;
}

int search_rate(const struct cluster *c, const struct sm_options *so,
                const struct lg_run_config *run, const struct lg_slo *slo,
                const struct search_rate_opts *o, FILE *progress, struct search_rate_result *out,
                char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (search_rate_opts_check(o, err, errlen) != 0) {
        return TANDEM_EINVAL;
    }
    if (!(slo->ttft_ms >= 0 || slo->tpot_ms >= 0 || slo->e2el_ms >= 0)) {
        snprintf(err, errlen, "the goodput search needs SLOs (--goodput ttft:MS tpot:MS)");
        return TANDEM_EINVAL;
    }
    struct sm_options def;
    if (so == NULL) {
        sm_options_default(&def);
        so = &def;
    }
    struct probe_ctx p = {.c = c, .so = so, .run = run, .slo = slo};
    for (int k = 0; k < o->seeds; k++) {
        p.seed = exp_seed_of(run->workload.seed, k);
        int rc = search_one(&p, o, &out->rate[k], &out->below_min, &out->at_max, err, errlen);
        if (rc != 0) {
            return rc;
        }
        out->n++;
        if (progress) {
            fprintf(progress, "[search]   seed %llu: %.4g req/s (%d probes so far)\n",
                    (unsigned long long)p.seed, out->rate[k], p.probes);
        }
    }
    out->gpus = p.gpus;
    out->probes = p.probes;
    out->ci = exp_ci_of(out->rate, (size_t)out->n);
    double per[EXP_MAX_SEEDS];
    for (int k = 0; k < out->n; k++) {
        per[k] = p.gpus > 0 ? out->rate[k] / p.gpus : NAN;
    }
    out->per_gpu = exp_ci_of(per, (size_t)out->n);
    return 0;
}

/* ------------------------------------------------------------------ */
/* The P:D search                                                      */
/* ------------------------------------------------------------------ */

int search_parse_tps(const char *s, struct search_pd_opts *o, char *err, size_t errlen)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    o->n_tps = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *end;
        long v = strtol(t, &end, 10);
        if (end == t || *end != '\0' || v < 1 || v > 64) {
            snprintf(err, errlen, "--tp: '%s' is not a TP degree in [1, 64] (e.g. --tp 1,2,4,8)",
                     t);
            return TANDEM_EINVAL;
        }
        for (int i = 0; i < o->n_tps; i++) {
            if (o->tps[i] == v) {
                snprintf(err, errlen, "--tp: %ld is listed twice", v);
                return TANDEM_EINVAL;
            }
        }
        if (o->n_tps == SEARCH_MAX_TP) {
            snprintf(err, errlen, "--tp: more than %d degrees", SEARCH_MAX_TP);
            return TANDEM_EINVAL;
        }
        o->tps[o->n_tps++] = (int)v;
    }
    if (o->n_tps == 0) {
        snprintf(err, errlen, "--tp: no TP degree given (e.g. --tp 1,2,4,8)");
        return TANDEM_EINVAL;
    }
    return 0;
}

/* A copy of base (through its own writer and parser: every setting
 * explicit) with pool r at count instances of TP tp, pool r2 at count2 of
 * TP tp2, and every other pool emptied. */
static int variant(const struct cluster *base, enum cluster_role r, int count, int tp,
                   enum cluster_role r2, int count2, int tp2, struct cluster **out, char *err,
                   size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        snprintf(err, errlen, "out of memory");
        return TANDEM_ENOMEM;
    }
    int rc = cluster_write(base, f);
    if (fclose(f) != 0 || rc != 0) {
        free(text);
        snprintf(err, errlen, "cannot copy the cluster %s", base->source);
        return TANDEM_EIO;
    }
    rc = cluster_parse(out, text, len, base->source, base->base_dir, err, errlen);
    free(text);
    if (rc != 0) {
        return rc;
    }
    int ti = wk_setting("tp");
    for (int i = 0; i < CLUSTER_N_ROLES; i++) {
        struct cluster_pool *p = &(*out)->pools[i];
        int n = i == (int)r ? count : i == (int)r2 ? count2 : 0;
        int t = i == (int)r ? tp : tp2;
        p->count = n;
        if (n > 0) {
            struct worker_config cfg = p->cfg;
            cfg.tp = t;
            if (cluster_pool_set(p, ti, &cfg) != 0) {
                cluster_free(*out);
                *out = NULL;
                snprintf(err, errlen, "out of memory");
                return TANDEM_ENOMEM;
            }
        }
    }
    return 0;
}

static int row_add(struct search_pd_row **rows, int *n, int *cap, const struct search_pd_row *r)
{
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        struct search_pd_row *p = realloc(*rows, (size_t)nc * sizeof(*p));
        if (!p) {
            return TANDEM_ENOMEM;
        }
        *rows = p;
        *cap = nc;
    }
    (*rows)[(*n)++] = *r;
    return 0;
}

/* The TP list of a phase: o's, or the base pool's own degree. */
static int phase_tps(const struct search_pd_opts *o, const struct cluster_pool *p, int *out)
{
    if (o->n_tps > 0) {
        memcpy(out, o->tps, (size_t)o->n_tps * sizeof(int));
        return o->n_tps;
    }
    out[0] = p->cfg.tp;
    return 1;
}

/* Every configuration of the budget, unsearched. */
static int enumerate(const struct cluster *pd, const struct cluster *colo,
                     const struct search_pd_opts *o, struct search_pd_row **rows, int *n)
{
    int cap = 0, tpp[SEARCH_MAX_TP], tpd[SEARCH_MAX_TP];
    int np = phase_tps(o, &pd->pools[CLUSTER_PREFILL], tpp);
    int nd = phase_tps(o, &pd->pools[CLUSTER_DECODE], tpd);
    for (int a = 0; a < np; a++) {
        for (int b = 0; b < nd; b++) {
            for (int P = 1; P * tpp[a] < o->gpus; P++) {
                int rest = o->gpus - P * tpp[a];
                if (rest % tpd[b] != 0) {
                    continue;
                }
                struct search_pd_row r = {.prefill = P,
                                          .decode = rest / tpd[b],
                                          .tp_prefill = tpp[a],
                                          .tp_decode = tpd[b]};
                snprintf(r.label, sizeof(r.label), "%dP%dD tp%d/tp%d", P, r.decode, tpp[a], tpd[b]);
                if (row_add(rows, n, &cap, &r) != 0) {
                    return TANDEM_ENOMEM;
                }
            }
        }
    }
    if (colo != NULL) {
        int tpc[SEARCH_MAX_TP];
        int nc = phase_tps(o, &colo->pools[CLUSTER_COLOCATED], tpc);
        for (int a = 0; a < nc; a++) {
            if (o->gpus % tpc[a] != 0) {
                continue;
            }
            struct search_pd_row r = {
                .colocated = 1, .prefill = o->gpus / tpc[a], .tp_prefill = tpc[a]};
            snprintf(r.label, sizeof(r.label), "colocated x%d tp%d", r.prefill, tpc[a]);
            if (row_add(rows, n, &cap, &r) != 0) {
                return TANDEM_ENOMEM;
            }
        }
    }
    return 0;
}

static double row_key(const struct search_pd_row *r)
{
    return r->ok && isfinite(r->r.per_gpu.mean) ? r->r.per_gpu.mean : -1;
}

int search_pd(const struct cluster *pd_base, const struct cluster *colo_base,
              const struct sm_options *so, const struct lg_run_config *run,
              const struct lg_slo *slo, const struct search_pd_opts *o, FILE *progress,
              struct search_pd_row **rows_out, int *n_out, char *err, size_t errlen)
{
    *rows_out = NULL;
    *n_out = 0;
    if (pd_base->pools[CLUSTER_PREFILL].count == 0 || pd_base->pools[CLUSTER_DECODE].count == 0) {
        snprintf(err, errlen,
                 "%s: --search pd needs a cluster with a prefill and a decode pool (their "
                 "settings are the splits')",
                 pd_base->source);
        return TANDEM_EINVAL;
    }
    if (colo_base && colo_base->pools[CLUSTER_COLOCATED].count == 0) {
        snprintf(err, errlen, "%s: the colocated baseline needs a colocated pool",
                 colo_base->source);
        return TANDEM_EINVAL;
    }
    for (int i = 0; i < CLUSTER_N_ROLES; i++) {
        if (pd_base->pools[i].addrs || (colo_base && colo_base->pools[i].addrs)) {
            snprintf(err, errlen,
                     "--search pd: the base clusters must not list explicit worker addresses "
                     "(pools.%s.addresses): the search changes the instance counts",
                     cluster_role_name((enum cluster_role)i));
            return TANDEM_EINVAL;
        }
    }
    struct search_pd_row *rows = NULL;
    int n = 0;
    if (enumerate(pd_base, colo_base, o, &rows, &n) != 0) {
        free(rows);
        snprintf(err, errlen, "out of memory");
        return TANDEM_ENOMEM;
    }
    int splits = 0;
    for (int i = 0; i < n; i++) {
        splits += !rows[i].colocated;
    }
    if (splits == 0) {
        free(rows);
        snprintf(err, errlen,
                 "--gpus %d: no split into prefill and decode instances fits the budget with "
                 "these TP degrees (at least one instance of each phase: P x tp_p + D x tp_d = "
                 "%d); give more GPUs or smaller --tp degrees",
                 o->gpus, o->gpus);
        return TANDEM_EINVAL;
    }
    int ran = 0;
    char first_err[256] = "";
    for (int i = 0; i < n; i++) {
        struct search_pd_row *r = &rows[i];
        struct cluster *c = NULL;
        char e2[SM_ERR_MAX] = "";
        int rc = r->colocated
                     ? variant(colo_base, CLUSTER_COLOCATED, r->prefill, r->tp_prefill,
                               CLUSTER_COLOCATED, 0, 0, &c, e2, sizeof(e2))
                     : variant(pd_base, CLUSTER_PREFILL, r->prefill, r->tp_prefill, CLUSTER_DECODE,
                               r->decode, r->tp_decode, &c, e2, sizeof(e2));
        if (progress) {
            fprintf(progress, "[search] %s\n", r->label);
        }
        if (rc == 0) {
            rc = search_rate(c, so, run, slo, &o->rate, progress, &r->r, e2, sizeof(e2));
        }
        cluster_free(c);
        if (rc == TANDEM_ENOMEM) {
            free(rows);
            snprintf(err, errlen, "out of memory");
            return rc;
        }
        if (rc != 0) {
            snprintf(r->error, sizeof(r->error), "%s", e2);
            if (!first_err[0]) {
                snprintf(first_err, sizeof(first_err), "%s: %s", r->label, e2);
            }
            if (progress) {
                fprintf(progress, "[search]   cannot run: %s\n", e2);
            }
            continue;
        }
        r->ok = 1;
        ran++;
    }
    if (ran == 0) {
        free(rows);
        snprintf(err, errlen, "no configuration of %d GPUs could run: %s", o->gpus, first_err);
        return TANDEM_EINVAL;
    }
    /* Best first, rows that could not run last; an insertion sort, so
     * stable: equal ones keep the enumeration order. */
    for (int i = 1; i < n; i++) {
        struct search_pd_row x = rows[i];
        int j = i - 1;
        while (j >= 0 && row_key(&rows[j]) < row_key(&x)) {
            rows[j + 1] = rows[j];
            j--;
        }
        rows[j + 1] = x;
    }
    *rows_out = rows;
    *n_out = n;
    return 0;
}

static void fmt_ci(char *out, size_t cap, const struct exp_ci *ci, int prec)
{
    if (!isfinite(ci->mean)) {
        snprintf(out, cap, "-");
    } else if (isfinite(ci->half)) {
        snprintf(out, cap, "%.*f ± %.*f", prec, ci->mean, prec, ci->half);
    } else {
        snprintf(out, cap, "%.*f", prec, ci->mean);
    }
}

void search_pd_print(FILE *f, const struct search_pd_row *rows, int n_rows,
                     const struct search_pd_opts *o)
{
    fprintf(f, "| config | prefill | decode | GPUs | goodput rate (req/s) | per-GPU goodput "
               "(req/s/GPU) | |\n|---|---|---|---:|---:|---:|---|\n");
    for (int i = 0; i < n_rows; i++) {
        const struct search_pd_row *r = &rows[i];
        char pre[32], dec[32], rate[64], per[64], note[160] = "";
        if (r->colocated) {
            snprintf(pre, sizeof(pre), "%d x TP%d colocated", r->prefill, r->tp_prefill);
            snprintf(dec, sizeof(dec), "-");
        } else {
            snprintf(pre, sizeof(pre), "%d x TP%d", r->prefill, r->tp_prefill);
            snprintf(dec, sizeof(dec), "%d x TP%d", r->decode, r->tp_decode);
        }
        if (!r->ok) {
            fprintf(f, "| %s | %s | %s | %d | - | - | cannot run: %s |\n", r->label, pre, dec,
                    o->gpus, r->error);
            continue;
        }
        fmt_ci(rate, sizeof(rate), &r->r.ci, 2);
        fmt_ci(per, sizeof(per), &r->r.per_gpu, 3);
        const struct search_pd_row *next = i + 1 < n_rows && rows[i + 1].ok ? &rows[i + 1] : NULL;
        if (i == 0 && next) {
            double b = r->r.per_gpu.mean, s = next->r.per_gpu.mean;
            if (exp_ci_overlap(&r->r.per_gpu, &next->r.per_gpu) || b == s) {
                snprintf(note, sizeof(note), "best: tie with %s (intervals overlap)", next->label);
            } else if (s > 0) {
                snprintf(note, sizeof(note), "best: +%.1f%% over %s", (b / s - 1) * 100,
                         next->label);
            } else {
                snprintf(note, sizeof(note), "best (runner-up %s: 0)", next->label);
            }
        } else if (i == 0) {
            snprintf(note, sizeof(note), "best");
        } else if (i == 1 && exp_ci_overlap(&r->r.per_gpu, &rows[0].r.per_gpu)) {
            snprintf(note, sizeof(note), "tie with the best");
        }
        if (r->r.below_min) {
            size_t l = strlen(note);
            snprintf(note + l, sizeof(note) - l, "%s%d of %d seeds miss even at min_rate",
                     l ? "; " : "", r->r.below_min, r->r.n);
        }
        if (r->r.at_max) {
            size_t l = strlen(note);
            snprintf(note + l, sizeof(note) - l, "%s%d of %d seeds still pass at max_rate",
                     l ? "; " : "", r->r.at_max, r->r.n);
        }
        fprintf(f, "| %s | %s | %s | %d | %s | %s | %s |\n", r->label, pre, dec, r->r.gpus, rate,
                per, note);
    }
}
