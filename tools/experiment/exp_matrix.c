/* The matrix loop and what every runner shares: seeds, the cells' results
 * from a runner's requests, their files, the report after every cell. See
 * exp_matrix.h. */
#define _GNU_SOURCE
#include "exp_matrix.h"

#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exp_report.h"
#include "exp_util.h"
#include "loadgen/report.h"
#include "tandem_err.h"

/* ------------------------------------------------------------------ */
/* Stop signals                                                        */
/* ------------------------------------------------------------------ */

static volatile sig_atomic_t g_stop;

static void on_stop_signal(int sig)
{
    g_stop = 1;
    if (sig == SIGTERM) {
        /* A run in progress listens for SIGINT (loadgen/run.c). */
        kill(getpid(), SIGINT);
    }
}

void exp_catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int exp_stop_requested(void)
{
    return g_stop != 0;
}

/* ------------------------------------------------------------------ */
/* One cell's results                                                  */
/* ------------------------------------------------------------------ */

static json_t *num_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *host_json(const struct exp_host *h)
{
    json_t *host = json_object();
    if (!host) {
        return NULL;
    }
    json_object_set_new(host, "ncpu", json_integer(h->ncpu));
    json_object_set_new(host, "busy", num_or_null(h->host_busy));
    json_object_set_new(host, "wall_s", num_or_null(h->wall_s));
    json_object_set_new(host, "cluster_cpu_s", num_or_null(h->cluster_cpu_s));
    json_object_set_new(host, "cluster_cpu_cores",
                        num_or_null(h->wall_s > 0 ? h->cluster_cpu_s / h->wall_s : NAN));
    json_object_set_new(host, "runner_cpu_s", num_or_null(h->loadgen_cpu_s));
    json_object_set_new(host, "runner_cpu_cores",
                        num_or_null(h->wall_s > 0 ? h->loadgen_cpu_s / h->wall_s : NAN));
    json_object_set_new(host, "load1_start", num_or_null(h->load1_start));
    json_object_set_new(host, "load1_end", num_or_null(h->load1_end));
    return host;
}

/* The cell JSON's "experiment" object: where the cell sits in the matrix,
 * its SLO sets and host measurements, and the runner's own keys (runner,
 * not NULL, is merged in). */
static json_t *cell_json_extra(const struct exp_matrix *m, const struct exp_cell *c,
                               const json_t *runner)
{
    const struct exp_file *e = m->e;
    const struct exp_config *cfg = &e->configs[c->config];
    json_t *o = json_object();
    json_t *host = host_json(&c->host);
    if (!o || !host) {
        json_decref(o);
        json_decref(host);
        return NULL;
    }
    double rate = e->rates[c->rate];
    json_object_set_new(o, "experiment", json_string(e->name));
    json_object_set_new(o, "config", json_string(cfg->label));
    json_object_set_new(o, "cluster", json_string(cfg->cluster_path));
    json_object_set_new(o, "routing",
                        cfg->routing_path ? json_string(cfg->routing_path) : json_null());
    if (cfg->set_key) {
        json_object_set_new(o, "set", json_pack("{ss}", cfg->set_key, cfg->set_value));
    } else {
        json_object_set_new(o, "set", json_null());
    }
    json_object_set_new(o, "derived_cluster", json_string(m->cluster_files[c->config]));
    json_object_set_new(o, "rate", isinf(rate) ? json_string("inf") : json_real(rate));
    json_object_set_new(o, "rate_index", json_integer(c->rate));
    json_object_set_new(o, "time_scale", json_real(c->time_scale));
    json_object_set_new(o, "times", json_string("modelled seconds (wall / time_scale)"));
    json_object_set_new(o, "seed", json_integer((json_int_t)c->seed));
    json_object_set_new(o, "seed_index", json_integer(c->seed_k));
    json_object_set_new(
        o, "restart", json_string(e->restart == EXP_RESTART_PER_RATE ? "per-rate" : "per-config"));
    json_object_set_new(o, "sent_rate", num_or_null(c->sent_rate));
    json_t *extra = json_array();
    for (int k = 0; extra && k < e->n_extra_slos; k++) {
        const struct lg_slo *slo = &e->extra_slos[k];
        json_array_append_new(
            extra, json_pack("{s:o,s:o,s:o,s:o}", "ttft_ms",
                             slo->ttft_ms >= 0 ? json_real(slo->ttft_ms) : json_null(), "tpot_ms",
                             slo->tpot_ms >= 0 ? json_real(slo->tpot_ms) : json_null(), "e2el_ms",
                             slo->e2el_ms >= 0 ? json_real(slo->e2el_ms) : json_null(),
                             "request_goodput", num_or_null(c->extra_goodput[k])));
    }
    json_object_set_new(o, "extra_slos", extra ? extra : json_null());
    json_object_set_new(o, "host", host);
    if (runner && json_object_update(o, (json_t *)runner) != 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static int write_json_file(const char *path, json_t *j, char *err, size_t errlen)
{
    if (json_dump_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0) {
        exp_sfmt(err, errlen, "cannot write %s", path);
        return TANDEM_EIO;
    }
    return 0;
}

/* The summary of the cell's requests under the main SLOs and every extra
 * SLO set, and its distributions. 0 or a negative code. */
static int cell_summarise(const struct exp_matrix *m, struct exp_cell *c,
                          const struct lg_run_result *res)
{
    const struct exp_file *e = m->e;
    double last_start = 0;
    for (size_t i = 0; i < res->n; i++) {
        double t = res->records[i].start_s;
        last_start = t > last_start ? t : last_start;
    }
    c->sent_rate = last_start > 0 ? (double)res->n / last_start : NAN;
    int r = lg_summary_compute(res->records, res->n, res->duration_s, &m->bo->summary, &c->s);
    for (int k = 0; r == 0 && k < e->n_extra_slos; k++) {
        struct lg_summary_opts opts = m->bo->summary;
        opts.slo = e->extra_slos[k];
        struct lg_summary *tmp = malloc(sizeof(*tmp));
        r = tmp ? lg_summary_compute(res->records, res->n, res->duration_s, &opts, tmp)
                : TANDEM_ENOMEM;
        c->extra_goodput[k] = r == 0 ? tmp->request_goodput : NAN;
        free(tmp);
    }
    if (r == 0) {
        r = exp_cell_distributions(c, res->records, res->n);
    }
    return r;
}

/* Fills cell c from a runner's requests (cfg: what it ran) and writes its
 * files: cells/<label>-r<rate>.json and requests/<label>-r<rate>.csv.
 * 0 (c->ok set), or a negative code with c->error set. */
static int cell_finish(const struct exp_matrix *m, const struct lg_run_config *cfg,
                       struct exp_cell *c, const struct exp_run_out *out)
{
    const struct exp_file *e = m->e;
    const struct exp_config *ec = &e->configs[c->config];
    const struct lg_run_result *res = &out->res;
    int r = cell_summarise(m, c, res);
    if (r != 0) {
        exp_sfmt(c->error, sizeof(c->error), "cannot compute the summary: %s", tandem_strerror(r));
        return r;
    }
    struct lg_report_info info = {
        .backend = m->bo->backend,
        .label = ec->label,
        .model = res->model,
        .dataset = lg_dataset_name(cfg->workload.dataset),
        .base_url = out->base_url,
        .endpoint = cfg->path,
        .num_prompts = cfg->num_prompts >= 0 ? cfg->num_prompts : (int64_t)res->n,
        .duration_target_s = cfg->duration_s,
        .request_rate = cfg->request_rate,
        .burstiness = cfg->burstiness,
        .max_concurrency = cfg->max_concurrency,
        .seed = cfg->workload.seed,
        .num_warmups = cfg->num_warmups,
        .metrics = m->bo->metrics,
        .run = res,
    };
    c->json = lg_report_json(&c->s, &info);
    json_t *extra = c->json ? cell_json_extra(m, c, out->extra) : NULL;
    if (!extra) {
        exp_sfmt(c->error, sizeof(c->error), "out of memory");
        return TANDEM_ENOMEM;
    }
    json_object_set_new(c->json, "experiment", extra);
    char rw[48], path[PATH_MAX + 128], err[768] = "";
    exp_rate_word(e->rates[c->rate], rw, 32);
    if (c->seed_k > 0) {
        size_t l = strlen(rw);
        exp_sfmt(rw + l, sizeof(rw) - l, "-s%d", c->seed_k);
    }
    exp_sfmt(path, sizeof(path), "%s/cells/%s-r%s.json", m->out_dir, ec->label, rw);
    int w = write_json_file(path, c->json, err, sizeof(err));
    exp_sfmt(path, sizeof(path), "%s/requests/%s-r%s.csv", m->out_dir, ec->label, rw);
    if (w == 0) {
        w = lg_report_save_requests(path, res->records, res->n, err, sizeof(err));
    }
    if (w != 0) {
        exp_sfmt(c->error, sizeof(c->error), "%s", err);
        return w;
    }
    c->ok = 1;
    return 0;
}

/* Runs cell c (config, rate, seed and time_scale set) with the runner.
 * Returns 0, or a negative code with c->error set. *interrupted is set when
 * the run was cut short by a signal. */
static int cell_run(const struct exp_matrix *m, const struct exp_runner_ops *ops, void *r,
                    struct exp_cell *c, int *interrupted)
{
    struct lg_run_config cfg = m->bo->run;
    cfg.request_rate = m->e->rates[c->rate];
    cfg.workload.seed = c->seed;
    cfg.progress = m->progress;
    c->ok = 0;
    struct exp_run_out out;
    memset(&out, 0, sizeof(out));
    char err[768] = "";
    int rc = ops->run(r, &cfg, c, &out, err, sizeof(err));
    if (rc != 0) {
        exp_sfmt(c->error, sizeof(c->error), "%s", err);
        *interrupted = rc == TANDEM_ECANCELLED || g_stop; /* Ctrl-C during the warm-ups */
        return rc;
    }
    *interrupted = out.res.interrupted || g_stop;
    rc = cell_finish(m, &cfg, c, &out);
    lg_run_result_free(&out.res);
    json_decref(out.extra);
    return rc;
}

/* ------------------------------------------------------------------ */
/* The matrix                                                          */
/* ------------------------------------------------------------------ */

/* Starts configuration ci for the cell at rate ri. 0, TANDEM_ECANCELLED, or
 * another negative code with note set (what the cells report). */
static int matrix_start(const struct exp_matrix *m, const struct exp_runner_ops *ops, void *r,
                        int ci, int ri, int sk, char *note, size_t notelen)
{
    const struct exp_file *e = m->e;
    const struct exp_config *cfg = &e->configs[ci];
    int per_rate = e->restart == EXP_RESTART_PER_RATE;
    char name[EXP_LABEL_MAX + 40], rw[48], err[EXP_ERR_MAX];
    exp_rate_word(e->rates[ri], rw, 32);
    if (sk > 0) {
        size_t l = strlen(rw);
        exp_sfmt(rw + l, sizeof(rw) - l, "-s%d", sk);
    }
    exp_sfmt(name, sizeof(name), "%s%s%s", cfg->label, per_rate ? "-r" : "", per_rate ? rw : "");
    struct exp_start s = {
        .e = e,
        .config = ci,
        .cluster_file = m->cluster_files[ci],
        .time_scale = m->time_scales[ci],
        .name = name,
    };
    fprintf(stderr, "[exp] %s: starting the cluster\n", cfg->label);
    int rc = ops->start(r, &s, err, sizeof(err), note, notelen);
    if (rc != 0 && rc != TANDEM_ECANCELLED) {
        fprintf(stderr, "[exp] %s: the cluster did not start: %s\n", cfg->label, err);
    }
    return rc;
}

int exp_matrix_run(const struct exp_matrix *m, const struct exp_runner_ops *ops, void *r,
                   int *interrupted)
{
    const struct exp_file *e = m->e;
    int ns = m->n_seeds > 0 ? m->n_seeds : 1;
    size_t n_cols = (size_t)e->n_rates * (size_t)ns; /* (rate, seed) pairs */
    size_t n_sel = (size_t)m->n_configs, n_cells = n_sel * n_cols;
    int per_rate = e->restart == EXP_RESTART_PER_RATE;
    int exit_code = 0, up_ok = 0, running = 0;
    char note[sizeof(m->cells[0].error)] = "";
    exp_catch_signals();
    *interrupted = 0;
    /* Cells live in configuration-major slots (the report's order). Per
     * configuration the clusters run in that order too; per rate the
     * configurations take turns at each rate, so the cells compared side by
     * side also ran side by side in time. */
    for (size_t step = 0; step < n_cells && !*interrupted; step++) {
        int k = per_rate ? (int)(step % n_sel) : (int)(step / n_cols);
        int col = per_rate ? (int)(step / n_sel) : (int)(step % n_cols);
        int ri = col / ns, sk = col % ns;
        int ci = m->configs[k];
        const struct exp_config *cfg = &e->configs[ci];
        struct exp_cell *c = &m->cells[(size_t)k * n_cols + (size_t)col];
        c->config = ci;
        c->rate = ri;
        c->seed_k = sk;
        c->time_scale = m->time_scales[ci];
        c->seed = exp_seed_of(m->bo->run.workload.seed + (per_rate ? 0 : (uint64_t)ri), sk);
        if (col == 0 || per_rate) {
            int rc = matrix_start(m, ops, r, ci, ri, sk, note, sizeof(note));
            up_ok = running = rc == 0;
            if (rc == TANDEM_ECANCELLED) {
                *interrupted = 1;
                break;
            }
            exit_code = up_ok ? exit_code : 1;
        }
        if (up_ok && ops->settle) {
            ops->settle(r, e->settle_s);
        }
        if (g_stop) {
            *interrupted = 1;
            break;
        }
        if (!up_ok) {
            exp_sfmt(c->error, sizeof(c->error), "%s", note);
        } else {
            int cut = 0;
            if (cell_run(m, ops, r, c, &cut) != 0) {
                exit_code = 1;
            }
            *interrupted = cut || g_stop;
        }
        c->done = 1;
        exp_print_cell(stderr, e, c);
        if ((per_rate || col == (int)n_cols - 1 || *interrupted) && running) {
            fprintf(stderr, "[exp] %s: stopping the cluster\n", cfg->label);
            ops->stop(r);
            running = 0;
        }
        char msg[EXP_ERR_MAX];
        size_t nv = exp_cells_done(m->cells, n_cells, m->view);
        if (exp_write_report(m->out_dir, e, m->view, nv, m->meta, m->n_meta, msg, sizeof(msg)) !=
            0) {
            fprintf(stderr, "tandem bench: %s\n", msg);
            exit_code = 1;
        }
    }
    if (running) {
        ops->stop(r);
    }
    return exit_code;
}
