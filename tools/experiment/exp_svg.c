/* The experiment report's plots: goodput.svg and the TTFT / TPOT CDFs
 * (hand-written SVG, no dependency). See exp_report.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exp_report.h"
#include "exp_util.h"
#include "plot.h"
#include "tandem_err.h"

/* The legend: one row per configuration that has cells. */
static double svg_legend_w(const struct exp_file *e, const struct exp_cell *cells, size_t n)
{
    size_t longest = 0;
    for (int ci = 0; ci < e->n_configs; ci++) {
        size_t l = strlen(e->configs[ci].label);
        longest = exp_cells_have_config(cells, n, ci) && l > longest ? l : longest;
    }
    return plot_legend_w(longest);
}

static double svg_legend_h(const struct exp_file *e, const struct exp_cell *cells, size_t n)
{
    int rows = 0;
    for (int ci = 0; ci < e->n_configs; ci++) {
        rows += exp_cells_have_config(cells, n, ci);
    }
    return plot_legend_h(rows);
}

static void svg_legend(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                       double x, double y)
{
    fprintf(f, "<g class=\"legend\" font-size=\"12\">\n");
    int row = 0;
    for (int ci = 0; ci < e->n_configs; ci++) {
        if (exp_cells_have_config(cells, n, ci)) {
            plot_legend_row(f, x, y + PLOT_LEGEND_ROW_H * row++, ci, e->configs[ci].label);
        }
    }
    fprintf(f, "</g>\n");
}

#define GP_W  720.0
#define GP_H  440.0
#define GP_X0 70.0
#define GP_X1 540.0
#define GP_Y0 50.0
#define GP_Y1 380.0

/* The group of configuration ci at rate ri: mean and interval of get. */
static struct exp_ci svg_group(const struct exp_cell *cells, size_t n, int ci, int ri,
                               double (*get)(const struct exp_cell *c, const void *arg),
                               const void *arg)
{
    const struct exp_cell *g[EXP_MAX_SEEDS];
    int ng = exp_cells_group(cells, n, ci, ri, g, EXP_MAX_SEEDS);
    return exp_group_ci(g, ng, get, arg);
}

static double get_goodput(const struct exp_cell *c, const void *arg)
{
    (void)arg;
    return exp_goodput_or_throughput(&c->s);
}

static double get_attainment(const struct exp_cell *c, const void *arg)
{
    (void)arg;
    return c->s.slo_attainment;
}

/* A metric against the rate: one polyline of group means per
 * configuration, a dot per rate and, where seeds give one, the interval as
 * a bar with caps. ymax_fixed > 0 fixes the y axis; ideal draws the
 * goodput = rate diagonal, hline >= 0 a dashed level. */
struct rate_plot {
    const char *title, *ylabel;
    double (*get)(const struct exp_cell *c, const void *arg);
    double ymax_fixed;
    int ideal;
    double hline;
};

static int svg_rate_plot(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                         const struct rate_plot *p)
{
    double xmax = 0, ymax = 0;
    for (size_t i = 0; i < n; i++) {
        double r = e->rates[cells[i].rate];
        if (!cells[i].ok || isinf(r)) {
            continue;
        }
        xmax = r > xmax ? r : xmax;
        struct exp_ci v = svg_group(cells, n, cells[i].config, cells[i].rate, p->get, NULL);
        double top = isfinite(v.half) ? v.mean + v.half : v.mean;
        ymax = isfinite(top) && top > ymax ? top : ymax;
    }
    struct plot_axis ax = plot_axis_linear(xmax),
                     ay = plot_axis_linear(p->ymax_fixed > 0 ? p->ymax_fixed : ymax);
    double w = fmax(GP_W, GP_X1 + 20 + svg_legend_w(e, cells, n));
    double h = fmax(GP_H, GP_Y0 + 10 + svg_legend_h(e, cells, n));
    plot_begin(f, w, h, p->title);
    plot_axes(f, &ax, &ay, GP_X0, GP_X1, GP_Y0, GP_Y1, "request rate (req/s)", p->ylabel);
    if (p->ideal) { /* every request good */
        fprintf(f,
                "<line class=\"ideal\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                "stroke=\"#aaa\" stroke-dasharray=\"3 3\"/>\n",
                GP_X0, GP_Y1, plot_pos(&ax, fmin(ax.hi, ay.hi), GP_X0, GP_X1),
                plot_pos(&ay, fmin(ax.hi, ay.hi), GP_Y1, GP_Y0));
    }
    if (p->hline >= 0) {
        double y = plot_pos(&ay, p->hline, GP_Y1, GP_Y0);
        fprintf(f,
                "<line class=\"target\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                "stroke=\"#aaa\" stroke-dasharray=\"3 3\"/>\n",
                GP_X0, y, GP_X1, y);
    }
    for (int ci = 0; ci < e->n_configs; ci++) {
        if (!exp_cells_have_config(cells, n, ci)) {
            continue;
        }
        fprintf(f, "<g class=\"config\">\n<polyline fill=\"none\" ");
        plot_stroke(f, ci);
        fprintf(f, " points=\"");
        int first = 1;
        for (int ri = 0; ri < e->n_rates; ri++) {
            struct exp_ci v = svg_group(cells, n, ci, ri, p->get, NULL);
            const struct exp_cell *g[1];
            if (exp_cells_group(cells, n, ci, ri, g, 1) == 0 || isinf(e->rates[ri])) {
                continue;
            }
            fprintf(f, "%s%.1f,%.1f", first ? "" : " ", plot_pos(&ax, e->rates[ri], GP_X0, GP_X1),
                    plot_pos(&ay, isfinite(v.mean) ? v.mean : 0, GP_Y1, GP_Y0));
            first = 0;
        }
        fprintf(f, "\"/>\n");
        for (int ri = 0; ri < e->n_rates; ri++) {
            const struct exp_cell *g[1];
            if (exp_cells_group(cells, n, ci, ri, g, 1) == 0 || isinf(e->rates[ri])) {
                continue;
            }
            struct exp_ci v = svg_group(cells, n, ci, ri, p->get, NULL);
            double x = plot_pos(&ax, e->rates[ri], GP_X0, GP_X1);
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x,
                    plot_pos(&ay, isfinite(v.mean) ? v.mean : 0, GP_Y1, GP_Y0),
                    plot_palette[ci % 10]);
            if (isfinite(v.half)) {
                /* The Student-t interval of a bounded metric can pass its
                 * bounds (3 seeds of attainment 1, 1, 0.1: 0.70 ± 1.29);
                 * the bar stops at them, as the slo_scale bands do, and
                 * summary.md keeps the interval as computed. */
                double lo = fmax(0, v.mean - v.half), hi = v.mean + v.half;
                hi = p->ymax_fixed > 0 ? fmin(p->ymax_fixed, hi) : hi;
                double y0 = plot_pos(&ay, lo, GP_Y1, GP_Y0);
                double y1 = plot_pos(&ay, hi, GP_Y1, GP_Y0);
                fprintf(f,
                        "<path class=\"ci\" d=\"M%.1f,%.1fV%.1fM%.1f,%.1fH%.1fM%.1f,%.1fH%.1f\" "
                        "stroke=\"%s\" fill=\"none\"/>\n",
                        x, y0, y1, x - 4, y0, x + 4, x - 4, y1, x + 4, plot_palette[ci % 10]);
            }
        }
        fprintf(f, "</g>\n");
    }
    svg_legend(f, e, cells, n, GP_X1 + 20, GP_Y0 + 10);
    fprintf(f, "</svg>\n");
    return ferror(f) ? TANDEM_EIO : 0;
}

int exp_write_svg_goodput(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n)
{
    char slo[160], title[320];
    exp_slo_text(cells, n, slo, sizeof(slo));
    int has_slo = slo[0] != '\0';
    if (has_slo) {
        snprintf(title, sizeof(title), "%s: goodput (%s)", e->name, slo);
    } else {
        snprintf(title, sizeof(title), "%s: request throughput", e->name);
    }
    struct rate_plot p = {
        .title = title,
        .ylabel = has_slo ? "goodput (req/s)" : "throughput (req/s)",
        .get = get_goodput,
        .ideal = 1,
        .hline = -1,
    };
    return svg_rate_plot(f, e, cells, n, &p);
}

int exp_write_svg_attainment(FILE *f, const struct exp_file *e, const struct exp_cell *cells,
                             size_t n)
{
    char slo[160], title[320];
    exp_slo_text(cells, n, slo, sizeof(slo));
    snprintf(title, sizeof(title), "%s: SLO attainment (%s)", e->name, slo[0] ? slo : "no SLO set");
    struct rate_plot p = {
        .title = title,
        .ylabel = "share of requests meeting every SLO",
        .get = get_attainment,
        .ymax_fixed = 1,
        .hline = e->has_goodput_search ? e->goodput_search.attainment : 0.9,
    };
    return svg_rate_plot(f, e, cells, n, &p);
}

#define CDF_PW    300.0 /* panel */
#define CDF_PH    250.0
#define CDF_ML    60.0 /* margins inside a panel */
#define CDF_MR    12.0
#define CDF_MT    28.0
#define CDF_MB    46.0
#define CDF_TOP   36.0 /* title band */
#define CDF_LEG   190.0
#define CDF_STEPS 100

int exp_write_svg_cdf(FILE *f, const struct exp_file *e, const struct exp_cell *cells, size_t n,
                      int metric)
{
    const char *name = metric == 0 ? "TTFT" : "TPOT";
    double lo = INFINITY, hi = 0;
    int panels = 0;
    for (int ri = 0; ri < e->n_rates; ri++) {
        panels += exp_cells_have_rate(cells, n, ri);
    }
    for (size_t i = 0; i < n; i++) {
        const double *v = metric == 0 ? cells[i].ttft_ms : cells[i].tpot_ms;
        size_t m = metric == 0 ? cells[i].n_ttft : cells[i].n_tpot;
        if (!cells[i].ok || m == 0) {
            continue;
        }
        for (size_t k = 0; k < m; k++) {
            if (v[k] > 0) {
                lo = v[k] < lo ? v[k] : lo;
                break; /* sorted: the first positive is the smallest */
            }
        }
        hi = v[m - 1] > hi ? v[m - 1] : hi;
    }
    struct plot_axis ax;
    if (hi > 0 && isfinite(lo) && hi / lo > 20) {
        ax.log = 1;
        ax.lo = pow(10.0, floor(log10(lo)));
        ax.hi = pow(10.0, ceil(log10(hi)));
    } else {
        ax = plot_axis_linear(hi);
    }
    struct plot_axis ay = {0, 1, 0};
    int cols = panels < 3 ? (panels ? panels : 1) : 3;
    int rows = panels ? (panels + cols - 1) / cols : 1;
    double w = cols * CDF_PW + fmax(CDF_LEG, 10 + svg_legend_w(e, cells, n));
    double h = fmax(CDF_TOP + rows * CDF_PH, CDF_TOP + CDF_MT + 10 + svg_legend_h(e, cells, n));
    char title[256], xlabel[64];
    snprintf(title, sizeof(title), "%s: %s CDF per rate%s", e->name, name,
             ax.log ? " (log x)" : "");
    snprintf(xlabel, sizeof(xlabel), "%s (ms)", name);
    plot_begin(f, w, h, title);
    int p = 0;
    for (int ri = 0; ri < e->n_rates; ri++) {
        if (!exp_cells_have_rate(cells, n, ri)) {
            continue;
        }
        double px = (p % cols) * CDF_PW, py = CDF_TOP + (p / cols) * CDF_PH;
        double x0 = px + CDF_ML, x1 = px + CDF_PW - CDF_MR, y0 = py + CDF_MT,
               y1 = py + CDF_PH - CDF_MB;
        p++;
        char rw[32];
        exp_rate_word(e->rates[ri], rw, sizeof(rw));
        fprintf(f,
                "<g class=\"panel\">\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
                "font-size=\"12\">rate %s req/s</text>\n",
                (x0 + x1) / 2, y0 - 8, rw);
        plot_axes(f, &ax, &ay, x0, x1, y0, y1, xlabel, "fraction of requests");
        for (int ci = 0; ci < e->n_configs; ci++) {
            const struct exp_cell *c = exp_cell_find(cells, n, ci, ri);
            const double *v = c ? (metric == 0 ? c->ttft_ms : c->tpot_ms) : NULL;
            size_t m = c ? (metric == 0 ? c->n_ttft : c->n_tpot) : 0;
            if (!c || !c->ok || m == 0) {
                continue;
            }
            fprintf(f, "<polyline fill=\"none\" ");
            plot_stroke(f, ci);
            fprintf(f, " points=\"");
            for (int q = 0; q <= CDF_STEPS; q++) {
                double val = lg_percentile(v, m, 100.0 * q / CDF_STEPS);
                fprintf(f, "%s%.1f,%.1f", q ? " " : "", plot_pos(&ax, val, x0, x1),
                        plot_pos(&ay, (double)q / CDF_STEPS, y1, y0));
            }
            fprintf(f, "\"/>\n");
        }
        fprintf(f, "</g>\n");
    }
    svg_legend(f, e, cells, n, cols * CDF_PW + 10, CDF_TOP + CDF_MT + 10);
    fprintf(f, "</svg>\n");
    return ferror(f) ? TANDEM_EIO : 0;
}

/* Attainment against SLO scale: the scales drawn. */
#define SC_LO    0.4
#define SC_STEP  0.1
#define SC_STEPS 16 /* 0.4 .. 2.0 */

static double get_scaled(const struct exp_cell *c, const void *arg)
{
    return exp_attainment(c->reqs, c->n_reqs, &c->s.slo, *(const double *)arg);
}

/* One configuration's line (and band, with seeds) in a panel. */
static void scale_line(FILE *f, const struct exp_cell *cells, size_t n, int ci, int ri,
                       const struct plot_axis *ax, const struct plot_axis *ay, double x0, double x1,
                       double y0, double y1)
{
    struct exp_ci v[SC_STEPS + 1];
    int band = 0;
    for (int q = 0; q <= SC_STEPS; q++) {
        double sc = SC_LO + SC_STEP * q;
        v[q] = svg_group(cells, n, ci, ri, get_scaled, &sc);
        if (!isfinite(v[q].mean)) {
            return;
        }
        band |= isfinite(v[q].half);
    }
    if (band) {
        fprintf(f,
                "<polygon class=\"ci\" fill=\"%s\" fill-opacity=\"0.15\" stroke=\"none\" "
                "points=\"",
                plot_palette[ci % 10]);
        for (int q = 0; q <= 2 * SC_STEPS + 1; q++) {
            int k = q <= SC_STEPS ? q : 2 * SC_STEPS + 1 - q;
            double h = isfinite(v[k].half) ? v[k].half : 0;
            double y = q <= SC_STEPS ? fmin(1, v[k].mean + h) : fmax(0, v[k].mean - h);
            fprintf(f, "%s%.1f,%.1f", q ? " " : "", plot_pos(ax, SC_LO + SC_STEP * k, x0, x1),
                    plot_pos(ay, y, y1, y0));
        }
        fprintf(f, "\"/>\n");
    }
    fprintf(f, "<polyline fill=\"none\" ");
    plot_stroke(f, ci);
    fprintf(f, " points=\"");
    for (int q = 0; q <= SC_STEPS; q++) {
        fprintf(f, "%s%.1f,%.1f", q ? " " : "", plot_pos(ax, SC_LO + SC_STEP * q, x0, x1),
                plot_pos(ay, v[q].mean, y1, y0));
    }
    fprintf(f, "\"/>\n");
}

int exp_write_svg_slo_scale(FILE *f, const struct exp_file *e, const struct exp_cell *cells,
                            size_t n)
{
    char slo[160], title[320];
    exp_slo_text(cells, n, slo, sizeof(slo));
    int panels = 0;
    for (int ri = 0; ri < e->n_rates; ri++) {
        panels += exp_cells_have_rate(cells, n, ri);
    }
    struct plot_axis ax = plot_axis_linear(SC_LO + SC_STEP * SC_STEPS), ay = {0, 1, 0};
    int cols = panels < 3 ? (panels ? panels : 1) : 3;
    int rows = panels ? (panels + cols - 1) / cols : 1;
    double w = cols * CDF_PW + fmax(CDF_LEG, 10 + svg_legend_w(e, cells, n));
    double h = fmax(CDF_TOP + rows * CDF_PH, CDF_TOP + CDF_MT + 10 + svg_legend_h(e, cells, n));
    snprintf(title, sizeof(title), "%s: SLO attainment against SLO scale (x 1 = %s)", e->name,
             slo[0] ? slo : "no SLO set");
    plot_begin(f, w, h, title);
    int p = 0;
    for (int ri = 0; ri < e->n_rates; ri++) {
        if (!exp_cells_have_rate(cells, n, ri)) {
            continue;
        }
        double px = (p % cols) * CDF_PW, py = CDF_TOP + (p / cols) * CDF_PH;
        double x0 = px + CDF_ML, x1 = px + CDF_PW - CDF_MR, y0 = py + CDF_MT,
               y1 = py + CDF_PH - CDF_MB;
        p++;
        char rw[32];
        exp_rate_word(e->rates[ri], rw, sizeof(rw));
        fprintf(f,
                "<g class=\"panel\">\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
                "font-size=\"12\">rate %s req/s</text>\n",
                (x0 + x1) / 2, y0 - 8, rw);
        plot_axes(f, &ax, &ay, x0, x1, y0, y1, "SLO scale (both SLOs x s)", "SLO attainment");
        double xs = plot_pos(&ax, 1, x0, x1);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#aaa\" "
                "stroke-dasharray=\"3 3\"/>\n",
                xs, y0, xs, y1);
        for (int ci = 0; ci < e->n_configs; ci++) {
            scale_line(f, cells, n, ci, ri, &ax, &ay, x0, x1, y0, y1);
        }
        fprintf(f, "</g>\n");
    }
    svg_legend(f, e, cells, n, cols * CDF_PW + 10, CDF_TOP + CDF_MT + 10);
    fprintf(f, "</svg>\n");
    return ferror(f) ? TANDEM_EIO : 0;
}
