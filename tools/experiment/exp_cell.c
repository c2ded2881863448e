/* Cells: their memory, distributions and lookups. See exp_cell.h. */
#include "exp_cell.h"

#include <stdlib.h>

#include "exp_util.h"
#include "tandem_err.h"

/* ------------------------------------------------------------------ */
/* Cells                                                               */
/* ------------------------------------------------------------------ */

void exp_cell_fini(struct exp_cell *c)
{
    free(c->ttft_ms);
    free(c->tpot_ms);
    free(c->reqs);
    json_decref(c->json);
    c->reqs = NULL;
    c->n_reqs = 0;
    c->ttft_ms = c->tpot_ms = NULL;
    c->n_ttft = c->n_tpot = 0;
    c->json = NULL;
}

int exp_cell_distributions(struct exp_cell *c, const struct lg_record *recs, size_t n)
{
    free(c->ttft_ms);
    free(c->tpot_ms);
    free(c->reqs);
    c->n_ttft = c->n_tpot = c->n_reqs = 0;
    c->ttft_ms = malloc((n ? n : 1) * sizeof(double));
    c->tpot_ms = malloc((n ? n : 1) * sizeof(double));
    c->reqs = malloc((n ? n : 1) * sizeof(*c->reqs));
    if (!c->ttft_ms || !c->tpot_ms || !c->reqs) {
        free(c->ttft_ms);
        free(c->tpot_ms);
        free(c->reqs);
        c->ttft_ms = c->tpot_ms = NULL;
        c->reqs = NULL;
        return TANDEM_ENOMEM;
    }
    exp_reqs_from_records(recs, n, c->reqs);
    c->n_reqs = n;
    for (size_t i = 0; i < n; i++) {
        const struct lg_record *r = &recs[i];
        if (!r->ok) {
            continue;
        }
        c->ttft_ms[c->n_ttft++] = r->ttft_s * 1000.0;
        if (lg_has_tpot(r)) {
            c->tpot_ms[c->n_tpot++] = lg_tpot_s(r) * 1000.0;
        }
    }
    qsort(c->ttft_ms, c->n_ttft, sizeof(double), exp_cmp_double);
    qsort(c->tpot_ms, c->n_tpot, sizeof(double), exp_cmp_double);
    return 0;
}

const struct exp_cell *exp_cell_find(const struct exp_cell *cells, size_t n, int ci, int ri)
{
    for (size_t i = 0; i < n; i++) {
        if (cells[i].config == ci && cells[i].rate == ri) {
            return &cells[i];
        }
    }
    return NULL;
}

int exp_cells_group(const struct exp_cell *cells, size_t n, int ci, int ri,
                    const struct exp_cell **out, int cap)
{
    int m = 0;
    for (size_t i = 0; i < n && m < cap; i++) {
        if (cells[i].config == ci && cells[i].rate == ri && cells[i].ok) {
            out[m++] = &cells[i];
        }
    }
    return m;
}

struct exp_ci exp_group_ci(const struct exp_cell *const *group, int n,
                           double (*get)(const struct exp_cell *c, const void *arg),
                           const void *arg)
{
    double v[EXP_MAX_SEEDS];
    int m = n < EXP_MAX_SEEDS ? n : EXP_MAX_SEEDS;
    for (int i = 0; i < m; i++) {
        v[i] = get(group[i], arg);
    }
    return exp_ci_of(v, (size_t)m);
}

int exp_cells_have_config(const struct exp_cell *cells, size_t n, int ci)
{
    for (size_t i = 0; i < n; i++) {
        if (cells[i].config == ci) {
            return 1;
        }
    }
    return 0;
}

int exp_cells_have_rate(const struct exp_cell *cells, size_t n, int ri)
{
    for (size_t i = 0; i < n; i++) {
        if (cells[i].rate == ri) {
            return 1;
        }
    }
    return 0;
}

size_t exp_cells_done(const struct exp_cell *cells, size_t n, struct exp_cell *view)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (cells[i].done) {
            view[m++] = cells[i];
        }
    }
    return m;
}
