/* Hand-written SVG plots, no dependency: the pieces every plot of the tandem
 * CLI draws with (the experiment report's, experiment/exp_svg.c, and the
 * run timeline's, timeline.h): a palette, linear and log axes with ticks and
 * grid, line styles, a legend that is as wide as its longest name, the
 * document's head, and a PNG beside an SVG when rsvg-convert is installed.
 * Writers print to the caller's FILE and leave error checking to ferror.
 * Any thread. */
#ifndef TANDEM_PLOT_H
#define TANDEM_PLOT_H

#include <stddef.h>
#include <stdio.h>

/* Tableau 10; series past the tenth are dashed (plot_stroke). */
extern const char *const plot_palette[10];

struct plot_axis {
    double lo, hi;
    int log;
};

/* The smallest of 1, 2, 5 x 10^k that is >= x (x > 0). */
double plot_nice_step(double x);
/* A linear axis from 0 to the first multiple of a nice step >= max. */
struct plot_axis plot_axis_linear(double max);
/* Where v falls between pixels p0 (at lo) and p1 (at hi). */
double plot_pos(const struct plot_axis *a, double v, double p0, double p1);

/* s with <, >, & and " escaped. */
void plot_text(FILE *f, const char *s);
/* <svg> of w x h with a white background and title centred at the top. */
void plot_begin(FILE *f, double w, double h, const char *title);
/* Axes with ticks and grid lines for the plot area [x0, x1] x [y0, y1] (y0
 * at the top), and their labels. */
void plot_axes(FILE *f, const struct plot_axis *ax, const struct plot_axis *ay, double x0,
               double x1, double y0, double y1, const char *xlabel, const char *ylabel);
/* The stroke attributes of series ci. */
void plot_stroke(FILE *f, int ci);

/* The legend's size, so that a plot grows to hold it rather than cut its
 * names off: a 24 px line, a gap, the longest name at PLOT_LEGEND_CHAR_W px a
 * character (12 px sans-serif: wider than its average glyph, so a name of
 * capitals and digits still fits), a margin; PLOT_LEGEND_ROW_H px a row. */
#define PLOT_LEGEND_CHAR_W 7.6
#define PLOT_LEGEND_ROW_H  18.0
double plot_legend_w(size_t longest);
double plot_legend_h(int rows);
/* One legend row at (x, y): series ci's line and its name. Inside a
 * <g class="legend" font-size="12"> the caller opens and closes. */
void plot_legend_row(FILE *f, double x, double y, int ci, const char *name);

/* X.png beside X.svg (svg ends in ".svg") through rsvg-convert (Debian's
 * librsvg2-bin) when it is installed: 1 written, 0 not installed, -1 it
 * failed (no PNG left behind). Blocks until it is done. */
int plot_png(const char *svg);

#endif
