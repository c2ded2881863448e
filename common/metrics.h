/* Prometheus metrics registry: counters, gauges and histograms with labels,
 * rendered to the Prometheus text exposition format (version 0.0.4).
 *
 * A family is one metric name with its help text, type and a small fixed set
 * of label names (at most METRICS_MAX_LABELS); a series is one combination of
 * label values within a family, and is what gets updated. Names are used as
 * given, including the vLLM convention of colons ("vllm:num_requests_running")
 * and counter names ending in "_total". Families render in registration
 * order, series in creation order; a family without labels has its single
 * series from the start (so it renders 0 before its first update), labelled
 * series appear once created.
 *
 * Threads: a registry is not locked. Use it from one thread (the loop thread
 * of the router or worker that owns it), which is also where render runs. */
#ifndef TANDEM_METRICS_H
#define TANDEM_METRICS_H

#include <stddef.h>

#define METRICS_MAX_LABELS  8
#define METRICS_MAX_BUCKETS 64
#define METRICS_MAX_SERIES  10000 /* per family: bounds label cardinality */

struct metrics_registry;
struct metrics_family;
struct metrics_series;
struct http_req;

/* Output buffer for rendering; zero-initialise, free with metrics_buf_free. */
struct metrics_buf {
    char *data; /* (cap) NUL-terminated text, len bytes */
    size_t len;
    size_t cap;
};

/* Gauge value computed at render time. */
typedef double (*metrics_gauge_fn)(void *arg);
/* Called at the start of every render, e.g. to refresh gauges from state. */
typedef void (*metrics_collect_fn)(struct metrics_registry *reg, void *arg);

/* Creates an empty registry. Returns 0 or TANDEM_ENOMEM. The caller destroys it. */
int metrics_registry_create(struct metrics_registry **out);
/* Frees the registry with every family and series. NULL is a no-op. */
void metrics_registry_destroy(struct metrics_registry *reg);

/* Registers a family. label_names is a NULL-terminated array (NULL for no
 * labels) of names matching [a-zA-Z_][a-zA-Z0-9_]* and not starting with
 * "__"; name must match [a-zA-Z_:][a-zA-Z0-9_:]*. help is copied (may be
 * NULL). *out belongs to the registry. Returns 0, TANDEM_EINVAL (bad name or
 * labels, too many labels), TANDEM_EEXIST (name taken) or TANDEM_ENOMEM. */
int metrics_counter_new(struct metrics_registry *reg, const char *name, const char *help,
                        const char *const *label_names, struct metrics_family **out);
int metrics_gauge_new(struct metrics_registry *reg, const char *name, const char *help,
                      const char *const *label_names, struct metrics_family **out);
/* bounds: n_bounds (1..METRICS_MAX_BUCKETS) finite upper bounds, strictly
 * increasing; the +Inf bucket is implicit. "le" is not allowed as a label. */
int metrics_histogram_new(struct metrics_registry *reg, const char *name, const char *help,
                          const char *const *label_names, const double *bounds, size_t n_bounds,
                          struct metrics_family **out);

/* Finds or creates the series with these label values (one per label name,
 * in order; NULL for a family without labels). Values are copied and may be
 * any UTF-8. *out belongs to the family and stays valid until removed.
 * Linear in the number of series: hold on to the pointer for hot paths.
 * Returns 0, TANDEM_EINVAL (wrong count), TANDEM_ETOOBIG (METRICS_MAX_SERIES)
 * or TANDEM_ENOMEM. */
int metrics_series_get(struct metrics_family *fam, const char *const *label_values,
                       struct metrics_series **out);
/* Removes a labelled series (e.g. an endpoint that left); s is freed. A
 * family's only unlabelled series cannot be removed (ignored). */
void metrics_series_remove(struct metrics_series *s);

/* Counter: adds v (ignored unless v >= 0). */
void metrics_counter_add(struct metrics_series *s, double v);
void metrics_counter_inc(struct metrics_series *s);
/* Gauge: sets, adds to (v may be negative), or computes at render time with
 * fn(arg) (fn NULL goes back to the stored value). */
void metrics_gauge_set(struct metrics_series *s, double v);
void metrics_gauge_add(struct metrics_series *s, double v);
void metrics_gauge_set_fn(struct metrics_series *s, metrics_gauge_fn fn, void *arg);
/* Histogram: counts v in the first bucket whose bound is >= v, adds it to _sum. */
void metrics_histogram_observe(struct metrics_series *s, double v);
/* Current value of a counter or gauge (the callback's value if one is set),
 * or a histogram's _count. For tests and reports. */
double metrics_series_value(const struct metrics_series *s);

/* Registers fn(reg, arg) to run at the start of each render (up to 8 hooks).
 * Returns 0 or TANDEM_ETOOBIG. */
int metrics_on_collect(struct metrics_registry *reg, metrics_collect_fn fn, void *arg);

/* Appends the exposition text of every family to out: "# HELP", "# TYPE",
 * then samples; histograms as name_bucket{...,le="b"} (cumulative, ending
 * with le="+Inf"), name_sum and name_count. Numbers use the shortest form
 * that reads back exactly ("3", "0.25", "1e-06", "+Inf", "NaN"). Returns 0 or
 * TANDEM_ENOMEM (out keeps what was appended). */
int metrics_render(struct metrics_registry *reg, struct metrics_buf *out);
void metrics_buf_free(struct metrics_buf *b);

/* Renders reg and answers req with 200 and Content-Type
 * "text/plain; version=0.0.4; charset=utf-8" (500 if rendering failed).
 * Returns what http_req_respond returns. Loop thread. */
int metrics_respond(struct http_req *req, struct metrics_registry *reg);

/* ---- Shorthands for a function that registers many families -------------
 * For a run of registrations with one error check at the end: each does
 * nothing once rc != 0. They expect in scope `int rc`, `struct
 * metrics_registry *r` and `struct metrics_family *f` (set to the family
 * just made), and put into out the series of values (NULL: the unlabelled
 * one). bounds is an array (its length is taken with sizeof). */
#define METRICS_SERIES(out, values)                                                                \
    do {                                                                                           \
        if (rc == 0) {                                                                             \
            rc = metrics_series_get(f, (values), &(out));                                          \
        }                                                                                          \
    } while (0)
#define METRICS_GAUGE(out, name, help, labels, values)                                             \
    do {                                                                                           \
        if (rc == 0) {                                                                             \
            rc = metrics_gauge_new(r, name, help, labels, &f);                                     \
        }                                                                                          \
        METRICS_SERIES(out, values);                                                               \
    } while (0)
#define METRICS_COUNTER(out, name, help, labels, values)                                           \
    do {                                                                                           \
        if (rc == 0) {                                                                             \
            rc = metrics_counter_new(r, name, help, labels, &f);                                   \
        }                                                                                          \
        METRICS_SERIES(out, values);                                                               \
    } while (0)
#define METRICS_HISTOGRAM(out, name, help, labels, values, bounds)                                 \
    do {                                                                                           \
        if (rc == 0) {                                                                             \
            rc = metrics_histogram_new(r, name, help, labels, bounds,                              \
                                       sizeof(bounds) / sizeof((bounds)[0]), &f);                  \
        }                                                                                          \
        METRICS_SERIES(out, values);                                                               \
    } while (0)

#endif
