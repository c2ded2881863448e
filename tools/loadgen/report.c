#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "metric.h"
#include "tandem_err.h"

int lg_parse_metrics(const char *s, unsigned *mask)
{
    if (s == NULL || *s == '\0') {
        return TANDEM_EINVAL;
    }
    unsigned m = 0;
    for (const char *p = s;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        size_t i;
        for (i = 0; i < lg_n_metrics; i++) {
            const struct lg_metric *x = &lg_metrics[i];
            if (x->kind == LG_KIND_DIST && strlen(x->key) == len && strncmp(x->key, p, len) == 0) {
                m |= x->mask;
                break;
            }
        }
        if (i == lg_n_metrics) {
            return TANDEM_EINVAL;
        }
        if (comma == NULL) {
            break;
        }
        p = comma + 1;
    }
    *mask = m;
    return 0;
}

void lg_percentile_word(double p, char *out, size_t len)
{
    if (p == floor(p) && fabs(p) < 1e9) {
        snprintf(out, len, "%d", (int)p);
        return;
    }
    /* The shortest form that reads back as p, like Python's str(float). */
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, len, "%.*g", prec, p);
        if (strtod(out, NULL) == p) {
            return;
        }
    }
}

/* ---- the table ---- */

#define WIDTH 50

/* Python's "{s:{c}^{n}}": centred, the odd padding character on the right. */
static void header(FILE *f, const char *title, char fill)
{
    size_t len = strlen(title);
    size_t pad = len < WIDTH ? WIDTH - len : 0;
    size_t left = pad / 2;
    for (size_t i = 0; i < left; i++) {
        fputc(fill, f);
    }
    fputs(title, f);
    for (size_t i = 0; i < pad - left; i++) {
        fputc(fill, f);
    }
    fputc('\n', f);
}

/* "{:<40} {:<10}" and "{:<40} {:<10.2f}" */
static void line_int(FILE *f, const char *label, long long v)
{
    char b[32];
    snprintf(b, sizeof(b), "%lld", v);
    fprintf(f, "%-40s %-10s\n", label, b);
}

static void line_f2(FILE *f, const char *label, double v)
{
    char b[64];
    snprintf(b, sizeof(b), "%.2f", v);
    fprintf(f, "%-40s %-10s\n", label, b);
}

static void line_str(FILE *f, const char *label, const char *v)
{
    fprintf(f, "%-40s %-10s\n", label, v);
}

static void print_dist(FILE *f, const struct lg_summary *s, const struct lg_dist *d,
                       const char *name, const char *title)
{
    char label[64], w[32];
    header(f, title, '-');
    snprintf(label, sizeof(label), "Mean %s (ms):", name);
    line_f2(f, label, d->mean);
    snprintf(label, sizeof(label), "Median %s (ms):", name);
    line_f2(f, label, d->median);
    for (int k = 0; k < s->n_percentiles; k++) {
        lg_percentile_word(s->percentiles[k], w, sizeof(w));
        snprintf(label, sizeof(label), "P%s %s (ms):", w, name);
        line_f2(f, label, d->pct[k]);
    }
}

static void print_slo_line(FILE *f, const char *name, double slo_ms, double attainment)
{
    if (slo_ms < 0) {
        return;
    }
    char label[64];
    snprintf(label, sizeof(label), "%s <= %g ms (%%):", name, slo_ms);
    line_f2(f, label, attainment * 100.0);
}

static void print_run(FILE *f, const struct lg_report_info *info)
{
    if (info->max_concurrency > 0) {
        line_int(f, "Maximum request concurrency:", info->max_concurrency);
    }
    if (isfinite(info->request_rate)) {
        line_f2(f, "Request rate configured (RPS):", info->request_rate);
    }
}

static void print_metric(FILE *f, const struct lg_summary *s, const struct lg_report_info *info,
                         const struct lg_metric *m)
{
    const struct lg_col *c = &m->at[LG_OUT_TEXT];
    if (m->kind == LG_KIND_DIST) {
        if (info->metrics & m->mask) {
            print_dist(f, s, m->dist(s), c->name, m->title);
        }
        return;
    }
    if (m->needs_slo && !s->has_goodput) {
        return;
    }
    double v = m->get(s);
    if (isnan(v) && m->none != NULL) {
        line_str(f, c->name, m->none);
    } else if (c->prec < 0) {
        line_int(f, c->name, (long long)v);
    } else {
        line_f2(f, c->name, m->kind == LG_KIND_RATIO ? v * 100.0 : v);
    }
}

/* The rows of one section in the text's order. */
static void print_section(FILE *f, const struct lg_summary *s, const struct lg_report_info *info,
                          enum lg_section sec)
{
    int last = lg_metric_last(LG_OUT_TEXT);
    for (int rank = 1; rank <= last; rank++) {
        const struct lg_metric *m = lg_metric_at(LG_OUT_TEXT, rank);
        if (sec == LG_SEC_RESULT && rank == LG_TEXT_RANK_RUN) {
            print_run(f, info);
        }
        if (m != NULL && m->section == sec) {
            print_metric(f, s, info, m);
        }
    }
}

void lg_report_print(FILE *f, const struct lg_summary *s, const struct lg_report_info *info)
{
    header(f, " Serving Benchmark Result ", '=');
    print_section(f, s, info, LG_SEC_RESULT);
    print_section(f, s, info, LG_SEC_DIST);
    /* Ours. */
    if (s->has_goodput) {
        header(f, "SLO Attainment", '-');
        print_section(f, s, info, LG_SEC_SLO);
        print_slo_line(f, "TTFT", s->slo.ttft_ms, s->ttft_attainment);
        print_slo_line(f, "TPOT", s->slo.tpot_ms, s->tpot_attainment);
        print_slo_line(f, "E2EL", s->slo.e2el_ms, s->e2el_attainment);
    }
    header(f, "Prefix Cache", '-');
    print_section(f, s, info, LG_SEC_CACHE);
    if (s->failed > 0) {
        header(f, "Failures", '-');
        for (int i = 0; i < s->n_failure_kinds; i++) {
            char label[64];
            snprintf(label, sizeof(label), "Failed (%s):", s->failures[i].key);
            line_int(f, label, s->failures[i].count);
        }
    }
    const struct lg_run_result *run = info->run;
    if (run != NULL && (run->warmups_failed > 0 || run->not_sent > 0 || run->interrupted)) {
        header(f, "Run", '-');
        if (run->warmups_ok + run->warmups_failed > 0) {
            line_int(f, "Warm-up requests failed:", run->warmups_failed);
        }
        if (run->not_sent > 0) {
            line_int(f, "Requests not sent (run ended):", run->not_sent);
        }
        if (run->interrupted) {
            line_str(f, "Interrupted:", "yes");
        }
    }
    for (int i = 0; i < WIDTH; i++) {
        fputc('=', f);
    }
    fputc('\n', f);
    for (int i = 0; i < s->n_failure_kinds; i++) {
        if (s->failures[i].example[0] != '\0') {
            fprintf(f, "failure %s, e.g.: %s\n", s->failures[i].key, s->failures[i].example);
        }
    }
}

/* ---- JSON ---- */

static void put(json_t *o, const char *k, json_t *v, int *bad)
{
    if (v == NULL || json_object_set_new(o, k, v) != 0) {
        *bad = 1;
    }
}

static json_t *real_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static void put_dist(json_t *o, const struct lg_summary *s, const struct lg_dist *d,
                     const char *name, int *bad)
{
    char key[64], w[32];
    snprintf(key, sizeof(key), "mean_%s_ms", name);
    put(o, key, real_or_null(d->mean), bad);
    snprintf(key, sizeof(key), "median_%s_ms", name);
    put(o, key, real_or_null(d->median), bad);
    snprintf(key, sizeof(key), "std_%s_ms", name);
    put(o, key, real_or_null(d->std), bad);
    for (int k = 0; k < s->n_percentiles; k++) {
        lg_percentile_word(s->percentiles[k], w, sizeof(w));
        snprintf(key, sizeof(key), "p%s_%s_ms", w, name);
        put(o, key, real_or_null(d->pct[k]), bad);
    }
}

static json_t *metric_json(const struct lg_summary *s, const struct lg_metric *m)
{
    if (m->needs_slo && !s->has_goodput) {
        return json_null();
    }
    double v = m->get(s);
    if (m->kind == LG_KIND_COUNT) {
        return json_integer((json_int_t)v);
    }
    return real_or_null(v);
}

/* The keys of one section in the JSON's order. */
static void put_section(json_t *o, const struct lg_summary *s, const struct lg_report_info *info,
                        enum lg_section sec, int *bad)
{
    int last = lg_metric_last(LG_OUT_JSON);
    for (int rank = 1; rank <= last; rank++) {
        const struct lg_metric *m = lg_metric_at(LG_OUT_JSON, rank);
        if (m == NULL || m->section != sec) {
            continue;
        }
        if (m->kind != LG_KIND_DIST) {
            put(o, m->key, metric_json(s, m), bad);
        } else if (info->metrics & m->mask) {
            put_dist(o, s, m->dist(s), m->key, bad);
        }
    }
}

json_t *lg_report_json(const struct lg_summary *s, const struct lg_report_info *info)
{
    json_t *o = json_object();
    if (o == NULL) {
        return NULL;
    }
    int bad = 0;
    char date[32];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(date, sizeof(date), "%Y%m%d-%H%M%S", &tm);
    put(o, "date", json_string(date), &bad);
    put(o, "endpoint_type", json_string(info->backend), &bad);
    put(o, "backend", json_string(info->backend), &bad);
    put(o, "label", info->label ? json_string(info->label) : json_null(), &bad);
    put(o, "model_id", json_string(info->model ? info->model : ""), &bad);
    put(o, "tokenizer_id", json_null(), &bad);
    put(o, "num_prompts", info->num_prompts >= 0 ? json_integer(info->num_prompts) : json_null(),
        &bad);
    put(o, "request_rate",
        isfinite(info->request_rate) ? json_real(info->request_rate) : json_string("inf"), &bad);
    put(o, "burstiness",
        isfinite(info->burstiness) ? json_real(info->burstiness) : json_string("inf"), &bad);
    put(o, "max_concurrency",
        info->max_concurrency > 0 ? json_integer(info->max_concurrency) : json_null(), &bad);
    put_section(o, s, info, LG_SEC_RESULT, &bad);
    put_section(o, s, info, LG_SEC_DIST, &bad);
    /* Ours. */
    put(o, "dataset_name", json_string(info->dataset ? info->dataset : ""), &bad);
    put(o, "base_url", json_string(info->base_url ? info->base_url : ""), &bad);
    put(o, "endpoint", json_string(info->endpoint ? info->endpoint : ""), &bad);
    put(o, "seed", json_integer((json_int_t)info->seed), &bad);
    put(o, "num_warmups", json_integer(info->num_warmups), &bad);
    put(o, "duration_target",
        info->duration_target_s > 0 ? json_real(info->duration_target_s) : json_null(), &bad);
    json_t *pcts = json_array();
    put(o, "metric_percentiles", pcts, &bad);
    for (int k = 0; pcts != NULL && k < s->n_percentiles; k++) {
        if (json_array_append_new(pcts, json_real(s->percentiles[k])) != 0) {
            bad = 1;
        }
    }
    put_section(o, s, info, LG_SEC_CACHE, &bad);
    json_t *slo = json_object();
    put(o, "slo", slo, &bad);
    if (slo != NULL) {
        put(slo, "ttft_ms", s->slo.ttft_ms >= 0 ? json_real(s->slo.ttft_ms) : json_null(), &bad);
        put(slo, "tpot_ms", s->slo.tpot_ms >= 0 ? json_real(s->slo.tpot_ms) : json_null(), &bad);
        put(slo, "e2el_ms", s->slo.e2el_ms >= 0 ? json_real(s->slo.e2el_ms) : json_null(), &bad);
    }
    put_section(o, s, info, LG_SEC_SLO, &bad);
    json_t *by = json_object();
    put(o, "slo_attainment_by_metric", by, &bad);
    if (by != NULL) {
        put(by, "ttft", real_or_null(s->ttft_attainment), &bad);
        put(by, "tpot", real_or_null(s->tpot_attainment), &bad);
        put(by, "e2el", real_or_null(s->e2el_attainment), &bad);
    }
    json_t *fails = json_object(), *examples = json_object();
    put(o, "failures", fails, &bad);
    put(o, "failure_examples", examples, &bad);
    for (int i = 0; fails != NULL && examples != NULL && i < s->n_failure_kinds; i++) {
        put(fails, s->failures[i].key, json_integer(s->failures[i].count), &bad);
        put(examples, s->failures[i].key, json_string(s->failures[i].example), &bad);
    }
    const struct lg_run_result *run = info->run;
    if (run != NULL) {
        put(o, "warmups_failed", json_integer(run->warmups_failed), &bad);
        put(o, "not_sent", json_integer(run->not_sent), &bad);
        put(o, "interrupted", json_boolean(run->interrupted), &bad);
        put(o, "connections_opened", json_integer((json_int_t)run->http.connections_opened), &bad);
        put(o, "connections_peak", json_integer(run->http.peak_open), &bad);
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int lg_report_write_json(const char *path, const struct lg_summary *s,
                         const struct lg_report_info *info, char *err, size_t errlen)
{
    json_t *o = lg_report_json(s, info);
    if (o == NULL) {
        snprintf(err, errlen, "out of memory");
        return TANDEM_ENOMEM;
    }
    int to_stdout = strcmp(path, "-") == 0;
    FILE *f = to_stdout ? stdout : fopen(path, "w");
    int rc = 0;
    if (f == NULL) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        rc = TANDEM_EIO;
    } else {
        if (json_dumpf(o, f, JSON_INDENT(2) | JSON_REAL_PRECISION(12)) != 0 ||
            fputc('\n', f) == EOF) {
            rc = TANDEM_EIO;
        }
        if (to_stdout ? fflush(f) != 0 : fclose(f) != 0) {
            rc = TANDEM_EIO;
        }
        if (rc != 0) {
            snprintf(err, errlen, "cannot write %s", path);
        }
    }
    json_decref(o);
    return rc;
}

/* ---- per-request records ---- */

int lg_requests_format(const char *path, enum lg_requests_format *out)
{
    const char *dot = path ? strrchr(path, '.') : NULL;
    if (dot == NULL) {
        return TANDEM_EINVAL;
    }
    if (strcasecmp(dot, ".csv") == 0) {
        *out = LG_REQUESTS_CSV;
        return 0;
    }
    if (strcasecmp(dot, ".jsonl") == 0 || strcasecmp(dot, ".ndjson") == 0) {
        *out = LG_REQUESTS_JSONL;
        return 0;
    }
    return TANDEM_EINVAL;
}

static double tpot_ms(const struct lg_record *r)
{
    return lg_has_tpot(r) ? lg_tpot_s(r) * 1000.0 : NAN;
}

static void csv_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s != NULL && *s; s++) {
        if (*s == '"') {
            fputc('"', f);
        }
        fputc(*s == '\n' || *s == '\r' ? ' ' : *s, f);
    }
    fputc('"', f);
}

static void csv_num(FILE *f, double v)
{
    if (isfinite(v)) {
        fprintf(f, ",%.6f", v);
    } else {
        fputc(',', f);
    }
}

static void write_csv(FILE *f, const struct lg_record *recs, size_t n)
{
    fprintf(f, "index,session,turn,arrival_s,start_s,queue_ms,ttft_ms,e2el_ms,tpot_ms,"
               "prompt_tokens,output_tokens,cached_tokens,target_prompt_len,target_output_len,"
               "token_chunks,itl_count,itl_mean_ms,itl_max_ms,http_status,ok,reason,error\n");
    for (size_t i = 0; i < n; i++) {
        const struct lg_record *r = &recs[i];
        double sum = 0, max = 0;
        for (uint32_t k = 0; k < r->n_itl; k++) {
            sum += r->itl_s[k];
            max = fmax(max, r->itl_s[k]);
        }
        fprintf(f, "%lld,%d,%d", (long long)r->index, (int)r->session, (int)r->turn);
        csv_num(f, r->arrival_s);
        csv_num(f, r->start_s);
        csv_num(f, (r->start_s - r->arrival_s) * 1000.0);
        csv_num(f, r->ok ? r->ttft_s * 1000.0 : NAN);
        csv_num(f, r->ok ? r->e2el_s * 1000.0 : NAN);
        csv_num(f, tpot_ms(r));
        fprintf(f, ",%lld,%lld,", (long long)r->prompt_tokens, (long long)r->output_tokens);
        if (r->cached_tokens >= 0) {
            fprintf(f, "%lld", (long long)r->cached_tokens);
        }
        fprintf(f, ",%d,%d,%u,%u", (int)r->target_prompt_len, (int)r->target_output_len,
                r->n_chunks, r->n_itl);
        csv_num(f, r->n_itl ? sum / r->n_itl * 1000.0 : NAN);
        csv_num(f, r->n_itl ? max * 1000.0 : NAN);
        fprintf(f, ",%d,%d,%s,", (int)r->http_status, (int)r->ok,
                r->ok ? "" : lg_fail_name(r->reason));
        if (!r->ok) {
            csv_string(f, r->error);
        }
        fputc('\n', f);
    }
}

static int write_jsonl(FILE *f, const struct lg_record *recs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct lg_record *r = &recs[i];
        json_t *o = json_object();
        if (o == NULL) {
            return TANDEM_ENOMEM;
        }
        int bad = 0;
        put(o, "index", json_integer(r->index), &bad);
        put(o, "session", json_integer(r->session), &bad);
        put(o, "turn", json_integer(r->turn), &bad);
        put(o, "arrival_s", json_real(r->arrival_s), &bad);
        put(o, "start_s", json_real(r->start_s), &bad);
        put(o, "queue_ms", json_real((r->start_s - r->arrival_s) * 1000.0), &bad);
        put(o, "ttft_ms", r->ok ? json_real(r->ttft_s * 1000.0) : json_null(), &bad);
        put(o, "e2el_ms", r->ok ? json_real(r->e2el_s * 1000.0) : json_null(), &bad);
        put(o, "tpot_ms", real_or_null(tpot_ms(r)), &bad);
        json_t *itl = json_array();
        put(o, "itl_ms", itl, &bad);
        for (uint32_t k = 0; itl != NULL && k < r->n_itl; k++) {
            if (json_array_append_new(itl, json_real(r->itl_s[k] * 1000.0)) != 0) {
                bad = 1;
            }
        }
        put(o, "prompt_tokens", json_integer(r->prompt_tokens), &bad);
        put(o, "output_tokens", json_integer(r->output_tokens), &bad);
        put(o, "cached_tokens",
            r->cached_tokens >= 0 ? json_integer(r->cached_tokens) : json_null(), &bad);
        put(o, "prompt_tokens_from_usage", json_boolean(r->usage_prompt), &bad);
        put(o, "output_tokens_from_usage", json_boolean(r->usage_output), &bad);
        put(o, "target_prompt_len", json_integer(r->target_prompt_len), &bad);
        put(o, "target_output_len", json_integer(r->target_output_len), &bad);
        put(o, "token_chunks", json_integer(r->n_chunks), &bad);
        put(o, "done_marker", json_boolean(r->done_marker), &bad);
        put(o, "http_status", json_integer(r->http_status), &bad);
        put(o, "ok", json_boolean(r->ok), &bad);
        put(o, "reason", r->ok ? json_null() : json_string(lg_fail_name(r->reason)), &bad);
        put(o, "error", r->error ? json_string(r->error) : json_null(), &bad);
        int rc = bad ? TANDEM_ENOMEM : 0;
        if (rc == 0 && (json_dumpf(o, f, JSON_COMPACT | JSON_REAL_PRECISION(9)) != 0 ||
                        fputc('\n', f) == EOF)) {
            rc = TANDEM_EIO;
        }
        json_decref(o);
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

int lg_report_save_requests(const char *path, const struct lg_record *recs, size_t n, char *err,
                            size_t errlen)
{
    enum lg_requests_format fmt;
    if (lg_requests_format(path, &fmt) != 0) {
        snprintf(err, errlen, "--save-requests: '%s' must end in .csv or .jsonl", path);
        return TANDEM_EINVAL;
    }
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return TANDEM_EIO;
    }
    int rc = 0;
    if (fmt == LG_REQUESTS_CSV) {
        write_csv(f, recs, n);
    } else {
        rc = write_jsonl(f, recs, n);
    }
    if (ferror(f)) {
        rc = TANDEM_EIO;
    }
    if (fclose(f) != 0 && rc == 0) {
        rc = TANDEM_EIO;
    }
    if (rc != 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, tandem_strerror(rc));
    }
    return rc;
}
