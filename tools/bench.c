/* `tandem bench`: flags (bench_options.c), then loadgen/run.c, then the
 * report. See bench.h. */
#include "bench.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "experiment/exp_main.h"
#include "experiment/exp_scrape.h"
#include "flags.h"
#include "loadgen/report.h"
#include "tandem_err.h"
#include "timeline.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "0.0.0"
#endif

/* Python's str() of a float: "inf", "10.0", "2.5". */
static void py_float(double v, char *out, size_t len)
{
    if (isinf(v)) {
        snprintf(out, len, "inf");
    } else if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(out, len, "%.1f", v);
    } else {
        lg_percentile_word(v, out, len);
    }
}

void bench_result_filename(const struct bench_options *o, const char *model, char *out, size_t len)
{
    char rate[32], conc[48] = "", date[32];
    py_float(o->run.request_rate, rate, sizeof(rate));
    if (o->run.max_concurrency > 0) {
        snprintf(conc, sizeof(conc), "-concurrency%d", o->run.max_concurrency);
    }
    const char *base = strrchr(model, '/');
    base = base ? base + 1 : model;
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(date, sizeof(date), "%Y%m%d-%H%M%S", &tm);
    snprintf(out, len, "%s-%sqps%s-%s-%s.json", o->label ? o->label : o->backend, rate, conc, base,
             date);
}

void bench_print_traffic(const struct bench_options *o)
{
    const struct lg_run_config *c = &o->run;
    char rate[32], b[32];
    py_float(c->request_rate, rate, sizeof(rate));
    py_float(c->burstiness, b, sizeof(b));
    printf("Traffic request rate: %s\n", rate);
    printf("Burstiness factor: %s (%s)\n", b,
           c->burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
    if (c->max_concurrency > 0) {
        printf("Maximum request concurrency: %d\n", c->max_concurrency);
    } else {
        printf("Maximum request concurrency: None\n");
    }
    printf("Dataset: %s, target %s, seed %llu\n", lg_dataset_name(c->workload.dataset), o->path,
           (unsigned long long)c->workload.seed);
    fflush(stdout);
}

int bench_report(const struct bench_options *o, const struct lg_run_result *res)
{
    char err[768] = "";
    struct lg_summary s;
    int exit_code = 0;
    int rc = lg_summary_compute(res->records, res->n, res->duration_s, &o->summary, &s);
    if (rc != 0) {
        fprintf(stderr, "tandem bench: cannot compute the summary: %s\n", tandem_strerror(rc));
        return 1;
    }
    struct lg_report_info info = {
        .backend = o->backend,
        .label = o->label,
        .model = res->model,
        .dataset = lg_dataset_name(o->run.workload.dataset),
        .base_url = o->base_url,
        .endpoint = o->path,
        .num_prompts = o->run.num_prompts >= 0 ? o->run.num_prompts : (int64_t)res->n,
        .duration_target_s = o->run.duration_s,
        .request_rate = o->run.request_rate,
        .burstiness = o->run.burstiness,
        .max_concurrency = o->run.max_concurrency,
        .seed = o->run.workload.seed,
        .num_warmups = o->run.num_warmups,
        .metrics = o->metrics,
        .run = res,
    };
    lg_report_print(stdout, &s, &info);
    fflush(stdout);
    if (o->json_path != NULL &&
        lg_report_write_json(o->json_path, &s, &info, err, sizeof(err)) != 0) {
        fprintf(stderr, "tandem bench: %s\n", err);
        exit_code = 1;
    }
    if (o->save_result) {
        char name[512], path[1024];
        if (o->result_filename != NULL) {
            snprintf(name, sizeof(name), "%s", o->result_filename);
        } else {
            bench_result_filename(o, res->model, name, sizeof(name));
        }
        if (o->result_dir != NULL) {
            mkdir(o->result_dir, 0777); /* an existing directory is fine */
            snprintf(path, sizeof(path), "%s/%s", o->result_dir, name);
        } else {
            snprintf(path, sizeof(path), "%s", name);
        }
        if (lg_report_write_json(path, &s, &info, err, sizeof(err)) != 0) {
            fprintf(stderr, "tandem bench: %s\n", err);
            exit_code = 1;
        }
    }
    if (o->save_requests != NULL &&
        lg_report_save_requests(o->save_requests, res->records, res->n, err, sizeof(err)) != 0) {
        fprintf(stderr, "tandem bench: %s\n", err);
        exit_code = 1;
    }
    if (exit_code == 0 && res->interrupted) {
        exit_code = 130;
    } else if (exit_code == 0 && s.completed == 0 && s.failed > 0) {
        fprintf(stderr, "tandem bench: every request failed\n");
        exit_code = 1;
    }
    return exit_code;
}

/* --timeline, live: a thread that reads the router's GET /v1/cluster every
 * timeline_ms while the run goes on (its own connections; the load
 * generator's loop is not touched). */
struct sampler {
    const struct bench_options *o;
    char path[800];
    struct timeline tl;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    double t0;    /* monotonic seconds at the start */
    int failures; /* reads that failed, in a row */
    char err[512];
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One read of /v1/cluster into the timeline; the first of a series of
 * failures is said. */
static void sample_once(struct sampler *s)
{
    const struct lg_run_config *rc = &s->o->run;
    char *body = NULL, err[512];
    double at = mono_s() - s->t0;
    if (exp_http_get(rc->host, rc->port, s->path, rc->api_key, &body, err, sizeof(err)) == 0 &&
        tl_sample_cluster_json(&s->tl, at, body) == 0) {
        s->failures = 0;
    } else if (s->failures++ == 0) {
        snprintf(s->err, sizeof(s->err), "%s", body != NULL ? "not /v1/cluster's JSON" : err);
        fprintf(stderr, "tandem bench: --timeline: %s (is the target a tandem router?)\n", s->err);
    }
    free(body);
}

static void *sampler_main(void *arg)
{
    struct sampler *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long ns = until.tv_nsec + (long)(s->o->timeline_ms % 1000) * 1000000L;
        until.tv_sec += s->o->timeline_ms / 1000 + ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        while (!s->stop && pthread_cond_timedwait(&s->cv, &s->mu, &until) == 0) {
        }
        if (s->stop) {
            break;
        }
        pthread_mutex_unlock(&s->mu);
        sample_once(s);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Starts the sampler of --timeline (o->timeline_dir set): the first sample is
 * read here, before the run sends anything. 0 or -1 (said). */
static int sampler_start(struct sampler *s, const struct bench_options *o)
{
    memset(s, 0, sizeof(*s));
    s->o = o;
    tl_init(&s->tl);
    /* /v1/cluster beside the target's /v1/models (a --base-url prefix kept). */
    size_t l = strlen(o->models_path), m = strlen("/v1/models");
    snprintf(s->path, sizeof(s->path), "%.*s/v1/cluster", (int)(l >= m ? l - m : 0),
             o->models_path);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->t0 = mono_s();
    sample_once(s); /* the state before the first request: the thread takes the rest */
    if (pthread_create(&s->thread, NULL, sampler_main, s) != 0) {
        fprintf(stderr, "tandem bench: --timeline: cannot start a thread\n");
        return -1;
    }
    return 0;
}

/* Stops the sampler and writes the timeline; 0 or 1 (said). */
static int sampler_finish(struct sampler *s, const char *title)
{
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    sample_once(s); /* the state at the end of the run */
    int rc = 0;
    char err[768];
    if (s->tl.n == 0) {
        fprintf(stderr, "tandem bench: --timeline: no sample of %s was read: %s\n", s->path,
                s->err[0] ? s->err : "the run ended first");
        rc = 1;
    } else if (tl_write(&s->tl, s->o->timeline_dir, title, err, sizeof(err)) != 0) {
        fprintf(stderr, "tandem bench: %s\n", err);
        rc = 1;
    } else {
        fprintf(stderr, "tandem bench: timeline of %zu samples in %s/timeline.svg\n", s->tl.n,
                s->o->timeline_dir);
    }
    tl_fini(&s->tl);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    return rc;
}

int bench_main(int argc, char **argv)
{
    /* `tandem bench --experiment FILE ...`: the matrix runner (experiment/). */
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--experiment") == 0 || strncmp(argv[i], "--experiment=", 13) == 0) {
            return exp_main(argc, argv);
        }
    }
    struct bench_options o;
    char err[768] = "";
    int rc = bench_parse_args(&o, argc, argv, 1, isatty(STDERR_FILENO), stdout, err, sizeof(err));
    if (rc == FLAGS_HELP) {
        bench_options_fini(&o);
        return 0;
    }
    if (rc == FLAGS_VERSION) {
        bench_options_fini(&o);
        printf("tandem %s\n", TANDEM_VERSION);
        return 0;
    }
    if (rc != FLAGS_OK) {
        fprintf(stderr, "tandem bench: %s\n", err);
        bench_options_fini(&o);
        return 2;
    }
    bench_print_traffic(&o);
    struct sampler sampler;
    int sampling = o.timeline_dir != NULL && sampler_start(&sampler, &o) == 0;
    if (o.timeline_dir != NULL && !sampling) {
        bench_options_fini(&o);
        return 1;
    }
    struct lg_run_result res;
    rc = lg_run(&o.run, &res, err, sizeof(err));
    int timeline_rc = 0;
    if (sampling) {
        char title[1024];
        snprintf(title, sizeof(title),
                 "tandem bench: %s at %g req/s, per worker as the router sees it", o.base_url,
                 o.run.request_rate);
        timeline_rc = sampler_finish(&sampler, title);
    }
    if (rc != 0) {
        fprintf(stderr, "tandem bench: %s\n", err);
        bench_options_fini(&o);
        return rc == TANDEM_EINVAL ? 2 : 1;
    }
    int exit_code = bench_report(&o, &res);
    exit_code = exit_code != 0 ? exit_code : timeline_rc;
    lg_run_result_free(&res);
    bench_options_fini(&o);
    return exit_code;
}
