/*
 * plot_svg.h - small line charts as standalone SVG 1.1, for `fmoe simulate --plot`: panels
 * side by side, each with axes, ticks at nice numbers (1, 2, 5 x 10^k), gridlines and one
 * polyline with markers per series; one legend below. No dependency: the file is text.
 *
 *     const double x[] = {8, 16, 32}, y[] = {10.2, 25.0, 61.3};
 *     const plot_series s[] = {{"lru", 3, x, y}};
 *     const plot_panel p[] = {{"hit rate", "cache (experts)", "hit rate (%)", 1, s}};
 *     plot_svg_write("out.svg", "trace.h5", p, 1);
 */
#ifndef FMOE_CMD_PLOT_SVG_H
#define FMOE_CMD_PLOT_SVG_H

#include <stddef.h>
#include <stdint.h>

typedef struct plot_series {
    const char *label;
    int32_t n;               /* points; drawn in the order given (sort them by x) */
    const double *x, *y;
} plot_series;

typedef struct plot_panel {
    const char *title, *xlabel, *ylabel;
    int32_t n_series;
    const plot_series *series;
} plot_panel;

/* Tick values covering [lo, hi] at a step of 1, 2 or 5 x 10^k chosen so that there are at
 * most max_ticks of them; the first tick is <= lo and the last >= hi. @return the count
 * written to ticks[0..cap). */
int32_t plot_nice_ticks(double lo, double hi, int32_t max_ticks, double *ticks, int32_t cap);

/* Writes the chart to path through path.partial, renamed when complete. Every panel has
 * the same series in the same order (the legend lists the first panel's).
 * @return 0, or FMOE_EIO (cannot write; the detail names the file and no file is left). */
int plot_svg_write(const char *path, const char *title, const plot_panel *panels,
                   int32_t n_panels);

#endif
