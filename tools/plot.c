/* Hand-written SVG plots: see plot.h. */
#include "plot.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

const char *const plot_palette[10] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                      "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

/* The smallest of 1, 2, 5 x 10^k that is >= x (x > 0). */
double plot_nice_step(double x)
{
    double p = pow(10.0, floor(log10(x)));
    static const double m[] = {1, 2, 5, 10};
    for (int i = 0; i < 4; i++) {
        if (m[i] * p >= x * (1 - 1e-12)) {
            return m[i] * p;
        }
    }
    return 10 * p;
}

/* A linear axis from 0 to the first multiple of a nice step >= max. */
struct plot_axis plot_axis_linear(double max)
{
    struct plot_axis a = {0, 1, 0};
    if (max > 0 && isfinite(max)) {
        double step = plot_nice_step(max / 5);
        a.hi = ceil(max / step - 1e-9) * step;
    }
    return a;
}

double plot_pos(const struct plot_axis *a, double v, double p0, double p1)
{
    double t;
    if (a->log) {
        v = v < a->lo ? a->lo : v;
        t = (log10(v) - log10(a->lo)) / (log10(a->hi) - log10(a->lo));
    } else {
        t = (v - a->lo) / (a->hi - a->lo);
    }
    return p0 + t * (p1 - p0);
}

void plot_text(FILE *f, const char *s)
{
    for (const char *c = s; *c; c++) {
        switch (*c) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*c, f);
        }
    }
}

static void tick_label(double v, double step, char *out, size_t cap)
{
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    snprintf(out, cap, "%.*f", dec, v);
}

/* A vertical grid line at x and the label of v under the plot area. */
static void x_tick(FILE *f, double v, double step, double x, double y0, double y1)
{
    char t[32];
    tick_label(v, step, t, sizeof(t));
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
            x, y0, x, y1, x, y1 + 14, t);
}

/* Axes with ticks and grid lines for the plot area [x0, x1] x [y0, y1]
 * (y0 at the top). */
void plot_axes(FILE *f, const struct plot_axis *ax, const struct plot_axis *ay, double x0,
               double x1, double y0, double y1, const char *xlabel, const char *ylabel)
{
    fprintf(f, "<g class=\"axes\" font-size=\"11\" fill=\"#333\">\n");
    /* y ticks */
    double ystep = plot_nice_step((ay->hi - ay->lo) / 5);
    for (double v = ay->lo; v <= ay->hi + ystep * 1e-6; v += ystep) {
        double y = plot_pos(ay, v, y1, y0);
        char t[32];
        tick_label(v, ystep, t, sizeof(t));
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                x0, y, x1, y, x0 - 4, y + 4, t);
    }
    /* x ticks */
    if (ax->log) {
        for (double v = ax->lo; v <= ax->hi * (1 + 1e-9); v *= 10) {
            x_tick(f, v, v, plot_pos(ax, v, x0, x1), y0, y1);
        }
    } else {
        double xstep = plot_nice_step((ax->hi - ax->lo) / 5);
        for (double v = ax->lo; v <= ax->hi + xstep * 1e-6; v += xstep) {
            x_tick(f, v, xstep, plot_pos(ax, v, x0, x1), y0, y1);
        }
    }
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#333\"/>\n",
            x0, y0, x1 - x0, y1 - y0);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (x0 + x1) / 2, y1 + 32);
    plot_text(f, xlabel);
    fprintf(f,
            "</text>\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 %.1f %.1f)\">",
            x0 - 42, (y0 + y1) / 2, x0 - 42, (y0 + y1) / 2);
    plot_text(f, ylabel);
    fprintf(f, "</text>\n</g>\n");
}

void plot_stroke(FILE *f, int ci)
{
    fprintf(f, "stroke=\"%s\" stroke-width=\"2\"%s", plot_palette[ci % 10],
            ci >= 10 ? " stroke-dasharray=\"6 3\"" : "");
}
void plot_begin(FILE *f, double w, double h, const char *title)
{
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"%.1f\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">",
            w, h, w, h, w / 2);
    plot_text(f, title);
    fprintf(f, "</text>\n");
}

double plot_legend_w(size_t longest)
{
    return 30.0 + PLOT_LEGEND_CHAR_W * (double)longest + 12.0;
}

double plot_legend_h(int rows)
{
    return PLOT_LEGEND_ROW_H * rows + 10.0;
}

void plot_legend_row(FILE *f, double x, double y, int ci, const char *name)
{
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" ", x, y, x + 24, y);
    plot_stroke(f, ci);
    fprintf(f, "/><text x=\"%.1f\" y=\"%.1f\">", x + 30, y + 4);
    plot_text(f, name);
    fprintf(f, "</text>\n");
}

int plot_png(const char *svg)
{
    char png[PATH_MAX + 32];
    size_t l = strlen(svg);
    snprintf(png, sizeof(png), "%.*s.png", (int)(l > 4 ? l - 4 : l), svg);
    char *argv[] = {"rsvg-convert", "-o", png, (char *)svg, NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, "rsvg-convert", NULL, NULL, argv, environ);
    if (rc == ENOENT) {
        return 0;
    }
    int status = 0;
    if (rc != 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        unlink(png);
        return -1;
    }
    return 1;
}
