/* Plots over time of one run: see timeline.h. */
#include "timeline.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pipeline.h"
#include "plot.h"
#include "tandem_err.h"

void tl_init(struct timeline *t)
{
    memset(t, 0, sizeof(*t));
}

void tl_fini(struct timeline *t)
{
    free(t->s);
    memset(t, 0, sizeof(*t));
}

/* A new sample at `at`, every worker unseen; NULL when out of memory. */
static struct tl_sample *sample_new(struct timeline *t, double at)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        struct tl_sample *s = realloc(t->s, cap * sizeof(*s));
        if (s == NULL) {
            return NULL;
        }
        t->s = s;
        t->cap = cap;
    }
    struct tl_sample *s = &t->s[t->n++];
    memset(s, 0, sizeof(*s));
    s->t = at;
    return s;
}

/* Worker id's index, added (with role) when new; -1 past TL_MAX_WORKERS. */
static int worker_index(struct timeline *t, const char *id, const char *role)
{
    for (int w = 0; w < t->n_workers; w++) {
        if (strcmp(t->id[w], id) == 0) {
            return w;
        }
    }
    if (t->n_workers == TL_MAX_WORKERS) {
        t->dropped++;
        return -1;
    }
    int w = t->n_workers++;
    snprintf(t->id[w], sizeof(t->id[w]), "%s", id);
    snprintf(t->role[w], sizeof(t->role[w]), "%s", role);
    return w;
}

static void put(struct timeline *t, struct tl_sample *s, const char *id, const char *role,
                struct tl_val v)
{
    int w = worker_index(t, id, role);
    if (w >= 0) {
        v.seen = 1;
        s->v[w] = v;
    }
}

int tl_sample_pipeline(struct timeline *t, double at, const struct rt_pipeline *pl)
{
    struct tl_sample *s = sample_new(t, at);
    if (s == NULL) {
        return TANDEM_ENOMEM;
    }
    int max = rt_pipeline_max_endpoints(pl);
    for (int ep = 0; ep < max; ep++) {
        const struct rt_endpoint *e = rt_pipeline_endpoint(pl, ep);
        if (e == NULL) {
            continue;
        }
        struct tl_val v = {
            .waiting = e->load.waiting,
            .running = e->load.running,
            .kv_usage = rt_endpoint_kv_usage(e),
            .picks = (double)e->picks,
        };
        put(t, s, e->id, rt_role_name(e->role), v);
    }
    return 0;
}

int tl_sample_cluster_json(struct timeline *t, double at, const char *json)
{
    json_t *root = json_loads(json, 0, NULL);
    json_t *eps = json_object_get(root, "endpoints");
    if (!json_is_array(eps)) {
        json_decref(root);
        return TANDEM_EPROTO;
    }
    struct tl_sample *s = sample_new(t, at);
    if (s == NULL) {
        json_decref(root);
        return TANDEM_ENOMEM;
    }
    size_t i;
    json_t *e;
    json_array_foreach(eps, i, e)
    {
        const char *id = json_string_value(json_object_get(e, "id"));
        const char *role = json_string_value(json_object_get(e, "role"));
        json_t *load = json_object_get(e, "load");
        if (id == NULL || role == NULL) {
            continue;
        }
        struct tl_val v = {
            .waiting = json_number_value(json_object_get(load, "waiting")),
            .running = json_number_value(json_object_get(load, "running")),
            .kv_usage = json_number_value(json_object_get(json_object_get(e, "kv"), "usage")),
            .picks = json_number_value(json_object_get(e, "picks")),
        };
        put(t, s, id, role, v);
    }
    json_decref(root);
    return 0;
}

double tl_picks_rate(const struct timeline *t, size_t i, int w)
{
    const struct tl_sample *now = &t->s[i];
    size_t j = i;
    while (j > 0 && t->s[j - 1].v[w].seen && (j == i || now->t - t->s[j - 1].t <= TL_RATE_S)) {
        j--;
    }
    double dt = now->t - t->s[j].t;
    double d = now->v[w].picks - t->s[j].v[w].picks;
    return j < i && dt > 0 && d >= 0 ? d / dt : 0;
}

/* ---- Files ---- */

static int write_csv(const struct timeline *t, FILE *f)
{
    fprintf(f, "t_s,worker,role,waiting,running,kv_usage,picks,picks_per_s\n");
    for (size_t i = 0; i < t->n; i++) {
        for (int w = 0; w < t->n_workers; w++) {
            const struct tl_val *v = &t->s[i].v[w];
            if (v->seen) {
                fprintf(f, "%.3f,%s,%s,%g,%g,%.4f,%.0f,%.3f\n", t->s[i].t, t->id[w], t->role[w],
                        v->waiting, v->running, v->kv_usage, v->picks, tl_picks_rate(t, i, w));
            }
        }
    }
    return ferror(f) ? TANDEM_EIO : 0;
}

#define TL_PANELS 4
#define TL_POINTS 1200 /* points drawn per line at most: samples are thinned */
#define TL_X0     80.0
#define TL_X1     780.0
#define TL_TOP    40.0
#define TL_PH     190.0 /* a panel */
#define TL_MT     26.0  /* inside a panel: above and below the plot area */
#define TL_MB     44.0

static const char *const panel_title[TL_PANELS] = {
    "queue: sequences waiting", "running sequences", "KV cache usage (share of blocks)",
    "picks/s: decisions choosing it (decode or remote prefill)"};
static const char *const panel_ylabel[TL_PANELS] = {"waiting", "running", "KV usage", "picks/s"};

static double value_of(const struct timeline *t, size_t i, int w, int panel)
{
    const struct tl_val *v = &t->s[i].v[w];
    switch (panel) {
    case 0:
        return v->waiting;
    case 1:
        return v->running;
    case 2:
        return v->kv_usage;
    default:
        return tl_picks_rate(t, i, w);
    }
}

static void draw_panel(const struct timeline *t, FILE *f, int panel, const struct plot_axis *ax,
                       size_t stride)
{
    double y0 = TL_TOP + panel * TL_PH + TL_MT, y1 = TL_TOP + (panel + 1) * TL_PH - TL_MB;
    double ymax = 0;
    for (size_t i = 0; i < t->n; i++) {
        for (int w = 0; w < t->n_workers; w++) {
            double v = t->s[i].v[w].seen ? value_of(t, i, w, panel) : 0;
            ymax = isfinite(v) && v > ymax ? v : ymax;
        }
    }
    struct plot_axis ay = plot_axis_linear(ymax); /* KV usage too: a few % must show */
    fprintf(f,
            "<g class=\"panel\">\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
            "font-size=\"13\">",
            (TL_X0 + TL_X1) / 2, y0 - 8);
    plot_text(f, panel_title[panel]);
    fprintf(f, "</text>\n");
    plot_axes(f, ax, &ay, TL_X0, TL_X1, y0, y1, "time (s)", panel_ylabel[panel]);
    for (int w = 0; w < t->n_workers; w++) {
        int open = 0;
        for (size_t i = 0; i < t->n; i++) {
            int last = i + 1 == t->n;
            if (i % stride != 0 && !last) {
                continue;
            }
            if (!t->s[i].v[w].seen) {
                if (open) {
                    fprintf(f, "\"/>\n");
                    open = 0;
                }
                continue;
            }
            if (!open) {
                fprintf(f, "<polyline fill=\"none\" stroke-linejoin=\"round\" ");
                plot_stroke(f, w);
                fprintf(f, " points=\"");
            }
            fprintf(f, "%s%.1f,%.1f", open ? " " : "", plot_pos(ax, t->s[i].t, TL_X0, TL_X1),
                    plot_pos(&ay, value_of(t, i, w, panel), y1, y0));
            open = 1;
        }
        if (open) {
            fprintf(f, "\"/>\n");
        }
    }
    fprintf(f, "</g>\n");
}

static int write_svg(const struct timeline *t, FILE *f, const char *title)
{
    size_t longest = 0;
    char name[TL_ID_MAX + 24];
    for (int w = 0; w < t->n_workers; w++) {
        size_t l = (size_t)snprintf(name, sizeof(name), "%s (%s)", t->id[w], t->role[w]);
        longest = l > longest ? l : longest;
    }
    double w_px = TL_X1 + 20 + plot_legend_w(longest);
    double h_px = fmax(TL_TOP + TL_PANELS * TL_PH, TL_TOP + TL_MT + plot_legend_h(t->n_workers));
    struct plot_axis ax = plot_axis_linear(t->n ? t->s[t->n - 1].t : 1);
    size_t stride = t->n > TL_POINTS ? (t->n + TL_POINTS - 1) / TL_POINTS : 1;
    plot_begin(f, w_px, h_px, title);
    for (int p = 0; p < TL_PANELS; p++) {
        draw_panel(t, f, p, &ax, stride);
    }
    fprintf(f, "<g class=\"legend\" font-size=\"12\">\n");
    for (int w = 0; w < t->n_workers; w++) {
        snprintf(name, sizeof(name), "%s (%s)", t->id[w], t->role[w]);
        plot_legend_row(f, TL_X1 + 20, TL_TOP + TL_MT + 10 + PLOT_LEGEND_ROW_H * w, w, name);
    }
    fprintf(f, "</g>\n</svg>\n");
    return ferror(f) ? TANDEM_EIO : 0;
}

/* dir/name through a temporary file renamed into place. */
static int write_file(const struct timeline *t, const char *dir, const char *name,
                      const char *title, char *err, size_t errlen)
{
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        snprintf(err, errlen, "--timeline: cannot write %s: %s", tmp, strerror(errno));
        return TANDEM_EIO;
    }
    int rc = title != NULL ? write_svg(t, f, title) : write_csv(t, f);
    if (fclose(f) != 0 || rc != 0 || rename(tmp, path) != 0) {
        snprintf(err, errlen, "--timeline: cannot write %s (disk full?)", path);
        unlink(tmp);
        return TANDEM_EIO;
    }
    if (title != NULL && plot_png(path) < 0) {
        snprintf(err, errlen, "--timeline: rsvg-convert could not turn %s into PNG", path);
        return TANDEM_EIO;
    }
    return 0;
}

int tl_write(const struct timeline *t, const char *dir, const char *title, char *err, size_t errlen)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "--timeline: cannot create the directory %s: %s", dir,
                 strerror(errno));
        return TANDEM_EIO;
    }
    int rc = write_file(t, dir, "timeline.csv", NULL, err, errlen);
    return rc != 0 ? rc : write_file(t, dir, "timeline.svg", title, err, errlen);
}
