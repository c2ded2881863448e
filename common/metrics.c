/* Prometheus text-format metrics registry. See metrics.h. */
#include "metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"
#include "tandem_err.h"

#define METRICS_MAX_HOOKS 8

enum metrics_type { METRICS_COUNTER, METRICS_GAUGE, METRICS_HISTOGRAM };

struct metrics_series {
    struct metrics_family *fam;
    size_t index;  /* in fam->series */
    char **values; /* (fam->n_labels) label values */
    double value;  /* counter or gauge */
    metrics_gauge_fn fn;
    void *fn_arg;
    double sum;
    uint64_t count;
    uint64_t *buckets; /* (fam->n_bounds + 1) per-bucket counts, not cumulative; last is +Inf */
};

struct metrics_family {
    struct metrics_registry *reg;
    enum metrics_type type;
    char *name;
    char *help;
    char *labels[METRICS_MAX_LABELS];
    size_t n_labels;
    double *bounds; /* (n_bounds) */
    size_t n_bounds;
    struct metrics_series **series; /* (cap_series) */
    size_t n_series, cap_series;
};

struct metrics_registry {
    struct metrics_family **fams; /* (cap) in registration order */
    size_t n, cap;
    struct {
        metrics_collect_fn fn;
        void *arg;
    } hooks[METRICS_MAX_HOOKS];
    size_t n_hooks;
};

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

static int valid_metric_name(const char *s)
{
    if (!s || !*s)
        return 0;
    for (size_t i = 0; s[i]; i++) {
        char ch = s[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' || ch == ':' ||
                 (i > 0 && ch >= '0' && ch <= '9');
        if (!ok)
            return 0;
    }
    return 1;
}

static int valid_label_name(const char *s)
{
    if (!s || !*s || strchr(s, ':') || (s[0] == '_' && s[1] == '_'))
        return 0;
    return valid_metric_name(s);
}

int metrics_registry_create(struct metrics_registry **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : TANDEM_ENOMEM;
}

static void series_free(struct metrics_series *s)
{
    if (!s)
        return;
    if (s->values)
        for (size_t i = 0; i < s->fam->n_labels; i++)
            free(s->values[i]);
    free(s->values);
    free(s->buckets);
    free(s);
}

static void family_free(struct metrics_family *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n_series; i++)
        series_free(f->series[i]);
    free(f->series);
    for (size_t i = 0; i < f->n_labels; i++)
        free(f->labels[i]);
    free(f->bounds);
    free(f->help);
    free(f->name);
    free(f);
}

void metrics_registry_destroy(struct metrics_registry *reg)
{
    if (!reg)
        return;
    for (size_t i = 0; i < reg->n; i++)
        family_free(reg->fams[i]);
    free(reg->fams);
    free(reg);
}

static struct metrics_series *series_new(struct metrics_family *f, const char *const *values)
{
    struct metrics_series *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->fam = f;
    if (f->n_labels) {
        s->values = calloc(f->n_labels, sizeof *s->values);
        if (!s->values)
            goto fail;
        for (size_t i = 0; i < f->n_labels; i++)
            if (!(s->values[i] = dup_str(values[i])))
                goto fail;
    }
    if (f->type == METRICS_HISTOGRAM) {
        s->buckets = calloc(f->n_bounds + 1, sizeof *s->buckets);
        if (!s->buckets)
            goto fail;
    }
    return s;
fail:
    series_free(s);
    return NULL;
}

static int series_add(struct metrics_family *f, struct metrics_series *s)
{
    if (f->n_series == f->cap_series) {
        size_t cap = f->cap_series ? f->cap_series * 2 : 4;
        struct metrics_series **p = realloc(f->series, cap * sizeof *p);
        if (!p)
            return TANDEM_ENOMEM;
        f->series = p;
        f->cap_series = cap;
    }
    s->index = f->n_series;
    f->series[f->n_series++] = s;
    return 0;
}

static int family_new(struct metrics_registry *reg, enum metrics_type type, const char *name,
                      const char *help, const char *const *label_names, const double *bounds,
                      size_t n_bounds, struct metrics_family **out)
{
    if (!valid_metric_name(name))
        return TANDEM_EINVAL;
    size_t n_labels = 0;
    while (label_names && label_names[n_labels]) {
        const char *l = label_names[n_labels];
        if (n_labels == METRICS_MAX_LABELS || !valid_label_name(l) ||
            (type == METRICS_HISTOGRAM && !strcmp(l, "le")))
            return TANDEM_EINVAL;
        for (size_t j = 0; j < n_labels; j++)
            if (!strcmp(label_names[j], l))
                return TANDEM_EINVAL;
        n_labels++;
    }
    if (type == METRICS_HISTOGRAM) {
        if (!bounds || n_bounds == 0 || n_bounds > METRICS_MAX_BUCKETS)
            return TANDEM_EINVAL;
        for (size_t i = 0; i < n_bounds; i++)
            if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
                return TANDEM_EINVAL;
    }
    for (size_t i = 0; i < reg->n; i++)
        if (!strcmp(reg->fams[i]->name, name))
            return TANDEM_EEXIST;
    if (reg->n == reg->cap) {
        size_t cap = reg->cap ? reg->cap * 2 : 16;
        struct metrics_family **p = realloc(reg->fams, cap * sizeof *p);
        if (!p)
            return TANDEM_ENOMEM;
        reg->fams = p;
        reg->cap = cap;
    }
    struct metrics_family *f = calloc(1, sizeof *f);
    if (!f)
        return TANDEM_ENOMEM;
    f->reg = reg;
    f->type = type;
    if (!(f->name = dup_str(name)) || !(f->help = dup_str(help ? help : "")))
        goto fail;
    for (; f->n_labels < n_labels; f->n_labels++)
        if (!(f->labels[f->n_labels] = dup_str(label_names[f->n_labels])))
            goto fail;
    if (type == METRICS_HISTOGRAM) {
        if (!(f->bounds = malloc(n_bounds * sizeof *f->bounds)))
            goto fail;
        memcpy(f->bounds, bounds, n_bounds * sizeof *f->bounds);
        f->n_bounds = n_bounds;
    }
    if (n_labels == 0) {
        struct metrics_series *s = series_new(f, NULL);
        if (!s || series_add(f, s)) {
            series_free(s);
            goto fail;
        }
    }
    reg->fams[reg->n++] = f;
    *out = f;
    return 0;
fail:
    family_free(f);
    return TANDEM_ENOMEM;
}

int metrics_counter_new(struct metrics_registry *reg, const char *name, const char *help,
                        const char *const *label_names, struct metrics_family **out)
{
    return family_new(reg, METRICS_COUNTER, name, help, label_names, NULL, 0, out);
}

int metrics_gauge_new(struct metrics_registry *reg, const char *name, const char *help,
                      const char *const *label_names, struct metrics_family **out)
{
    return family_new(reg, METRICS_GAUGE, name, help, label_names, NULL, 0, out);
}

int metrics_histogram_new(struct metrics_registry *reg, const char *name, const char *help,
                          const char *const *label_names, const double *bounds, size_t n_bounds,
                          struct metrics_family **out)
{
    return family_new(reg, METRICS_HISTOGRAM, name, help, label_names, bounds, n_bounds, out);
}

int metrics_series_get(struct metrics_family *fam, const char *const *label_values,
                       struct metrics_series **out)
{
    size_t n = 0;
    while (label_values && label_values[n])
        n++;
    if (n != fam->n_labels)
        return TANDEM_EINVAL;
    if (n == 0) {
        *out = fam->series[0];
        return 0;
    }
    for (size_t i = 0; i < fam->n_series; i++) {
        struct metrics_series *s = fam->series[i];
        size_t j = 0;
        while (j < n && !strcmp(s->values[j], label_values[j]))
            j++;
        if (j == n) {
            *out = s;
            return 0;
        }
    }
    if (fam->n_series >= METRICS_MAX_SERIES)
        return TANDEM_ETOOBIG;
    struct metrics_series *s = series_new(fam, label_values);
    if (!s || series_add(fam, s)) {
        series_free(s);
        return TANDEM_ENOMEM;
    }
    *out = s;
    return 0;
}

void metrics_series_remove(struct metrics_series *s)
{
    struct metrics_family *f = s->fam;
    if (f->n_labels == 0)
        return;
    for (size_t i = s->index + 1; i < f->n_series; i++) {
        f->series[i - 1] = f->series[i];
        f->series[i - 1]->index = i - 1;
    }
    f->n_series--;
    series_free(s);
}

void metrics_counter_add(struct metrics_series *s, double v)
{
    if (v >= 0)
        s->value += v;
}

void metrics_counter_inc(struct metrics_series *s)
{
    s->value += 1;
}

void metrics_gauge_set(struct metrics_series *s, double v)
{
    s->value = v;
}

void metrics_gauge_add(struct metrics_series *s, double v)
{
    s->value += v;
}

void metrics_gauge_set_fn(struct metrics_series *s, metrics_gauge_fn fn, void *arg)
{
    s->fn = fn;
    s->fn_arg = arg;
}

void metrics_histogram_observe(struct metrics_series *s, double v)
{
    const struct metrics_family *f = s->fam;
    size_t i = 0;
    while (i < f->n_bounds && !(v <= f->bounds[i]))
        i++;
    s->buckets[i]++;
    s->count++;
    s->sum += v;
}

double metrics_series_value(const struct metrics_series *s)
{
    if (s->fam->type == METRICS_HISTOGRAM)
        return (double)s->count;
    return s->fn ? s->fn(s->fn_arg) : s->value;
}

int metrics_on_collect(struct metrics_registry *reg, metrics_collect_fn fn, void *arg)
{
    if (reg->n_hooks == METRICS_MAX_HOOKS)
        return TANDEM_ETOOBIG;
    reg->hooks[reg->n_hooks].fn = fn;
    reg->hooks[reg->n_hooks].arg = arg;
    reg->n_hooks++;
    return 0;
}

/* ---- rendering ---- */

static int mb_reserve(struct metrics_buf *b, size_t extra)
{
    if (b->cap - b->len > extra)
        return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap - b->len <= extra) {
        if (cap > SIZE_MAX / 2)
            return TANDEM_ENOMEM;
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (!p)
        return TANDEM_ENOMEM;
    b->data = p;
    b->cap = cap;
    return 0;
}

static int mb_append(struct metrics_buf *b, const char *s, size_t n)
{
    if (mb_reserve(b, n))
        return TANDEM_ENOMEM;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

static int mb_puts(struct metrics_buf *b, const char *s)
{
    return mb_append(b, s, strlen(s));
}

/* Integers as integers ("10", not "1e+01"); otherwise the shortest %g form
 * that reads back to the same double. */
static void format_value(char *out, size_t cap, double v)
{
    if (isnan(v)) {
        snprintf(out, cap, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(out, cap, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (v > -1e15 && v < 1e15 && v == (double)(long long)v) {
        snprintf(out, cap, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

static int mb_value(struct metrics_buf *b, double v)
{
    char tmp[40];
    format_value(tmp, sizeof tmp, v);
    return mb_puts(b, tmp);
}

/* Escapes backslash and newline (and, in label values, the double quote). */
static int mb_escaped(struct metrics_buf *b, const char *s, int quote)
{
    int rc = 0;
    for (; *s && !rc; s++) {
        if (*s == '\\')
            rc = mb_append(b, "\\\\", 2);
        else if (*s == '\n')
            rc = mb_append(b, "\\n", 2);
        else if (*s == '"' && quote)
            rc = mb_append(b, "\\\"", 2);
        else
            rc = mb_append(b, s, 1);
    }
    return rc;
}

/* name{l1="v1",...,le="x"} value\n */
static int render_sample(struct metrics_buf *b, const struct metrics_family *f,
                         const struct metrics_series *s, const char *suffix, const char *le,
                         double v)
{
    int rc = mb_puts(b, f->name);
    if (!rc && suffix)
        rc = mb_puts(b, suffix);
    if (!rc && (f->n_labels || le)) {
        rc = mb_puts(b, "{");
        for (size_t i = 0; i < f->n_labels && !rc; i++) {
            if (i)
                rc = mb_puts(b, ",");
            if (!rc)
                rc = mb_puts(b, f->labels[i]);
            if (!rc)
                rc = mb_puts(b, "=\"");
            if (!rc)
                rc = mb_escaped(b, s->values[i], 1);
            if (!rc)
                rc = mb_puts(b, "\"");
        }
        if (!rc && le) {
            rc = mb_puts(b, f->n_labels ? ",le=\"" : "le=\"");
            if (!rc)
                rc = mb_puts(b, le);
            if (!rc)
                rc = mb_puts(b, "\"");
        }
        if (!rc)
            rc = mb_puts(b, "}");
    }
    if (!rc)
        rc = mb_puts(b, " ");
    if (!rc)
        rc = mb_value(b, v);
    if (!rc)
        rc = mb_puts(b, "\n");
    return rc;
}

static int render_family(struct metrics_buf *b, const struct metrics_family *f)
{
    static const char *const type_names[] = {"counter", "gauge", "histogram"};
    int rc = mb_puts(b, "# HELP ");
    if (!rc)
        rc = mb_puts(b, f->name);
    if (!rc)
        rc = mb_puts(b, " ");
    if (!rc)
        rc = mb_escaped(b, f->help, 0);
    if (!rc)
        rc = mb_puts(b, "\n# TYPE ");
    if (!rc)
        rc = mb_puts(b, f->name);
    if (!rc)
        rc = mb_puts(b, " ");
    if (!rc)
        rc = mb_puts(b, type_names[f->type]);
    if (!rc)
        rc = mb_puts(b, "\n");
    for (size_t i = 0; i < f->n_series && !rc; i++) {
        const struct metrics_series *s = f->series[i];
        if (f->type != METRICS_HISTOGRAM) {
            rc = render_sample(b, f, s, NULL, NULL, metrics_series_value(s));
            continue;
        }
        uint64_t cum = 0;
        char le[40];
        for (size_t k = 0; k <= f->n_bounds && !rc; k++) {
            cum += s->buckets[k];
            format_value(le, sizeof le, k < f->n_bounds ? f->bounds[k] : INFINITY);
            rc = render_sample(b, f, s, "_bucket", le, (double)cum);
        }
        if (!rc)
            rc = render_sample(b, f, s, "_sum", NULL, s->sum);
        if (!rc)
            rc = render_sample(b, f, s, "_count", NULL, (double)s->count);
    }
    return rc;
}

int metrics_render(struct metrics_registry *reg, struct metrics_buf *out)
{
    for (size_t i = 0; i < reg->n_hooks; i++)
        reg->hooks[i].fn(reg, reg->hooks[i].arg);
    if (mb_reserve(out, 0))
        return TANDEM_ENOMEM;
    out->data[out->len] = '\0';
    for (size_t i = 0; i < reg->n; i++) {
        int rc = render_family(out, reg->fams[i]);
        if (rc)
            return rc;
    }
    return 0;
}

void metrics_buf_free(struct metrics_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int metrics_respond(struct http_req *req, struct metrics_registry *reg)
{
    static const char *const hdrs[] = {"Content-Type", "text/plain; version=0.0.4; charset=utf-8",
                                       NULL};
    struct metrics_buf b = {0};
    int rc;
    if (metrics_render(reg, &b) == 0)
        rc = http_req_respond(req, 200, hdrs, b.data, b.len);
    else
        rc = http_req_respond(req, 500, NULL, "metrics rendering failed\n", 25);
    metrics_buf_free(&b);
    return rc;
}
