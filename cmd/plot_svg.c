/*
 * plot_svg.c - line charts as standalone SVG (plot_svg.h).
 *
 * Layout, in SVG user units: each panel is PANEL_W x PANEL_H with the plot area inset by
 * the margins (room for tick labels and axis titles); panels sit side by side; the legend
 * runs below them, wrapping into rows. Colours are the Okabe-Ito palette (distinguishable
 * with the common colour-vision deficiencies), markers cycle through circle, square,
 * triangle and diamond so series stay apart in grey print too.
 */
#include "plot_svg.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fmoe/error.h"
#include "files.h"

enum { PANEL_W = 480, PANEL_H = 360, M_LEFT = 64, M_RIGHT = 16, M_TOP = 36, M_BOTTOM = 48 };
enum { LEGEND_ROW = 20, LEGEND_COL = 190, MAX_TICKS = 8 };

static const char *const palette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                      "#E69F00", "#56B4E9", "#F0E442", "#000000"};
enum { PALETTE = sizeof palette / sizeof palette[0] };

/* k steps of mult x 10^e, computed so that decimal ticks come out as the nearest double to
 * their decimal value (3 x 2 / 10 = 0.6, where 3 x 0.2 = 0.6000000000000001). */
static double tick_at(double k, double mult, int e) {
    return e >= 0 ? k * mult * pow(10, e) : k * mult / pow(10, -e);
}

int32_t plot_nice_ticks(double lo, double hi, int32_t max_ticks, double *ticks, int32_t cap) {
    if (!(hi > lo)) { /* one value: a unit range around it */
        const double c = lo;
        lo = c - (c != 0 ? fabs(c) * 0.5 : 1);
        hi = c + (c != 0 ? fabs(c) * 0.5 : 1);
    }
    if (max_ticks < 2) max_ticks = 2;
    const double raw = (hi - lo) / (max_ticks - 1);
    int e = (int)floor(log10(raw));
    static const double mults[] = {1, 2, 5, 10};
    double mult = 10;
    for (size_t i = 0; i < sizeof mults / sizeof mults[0]; i++) {
        const double step = tick_at(1, mults[i], e);
        if (floor(lo / step) * step + step * (max_ticks - 1) >= hi - 1e-12 * fabs(hi)) {
            mult = mults[i];
            break;
        }
    }
    if (mult == 10) mult = 1, e++;
    const double step = tick_at(1, mult, e);
    const double k0 = floor(lo / step + 1e-9);
    int32_t n = 0;
    while (n < cap) {
        const double t = tick_at(k0 + n, mult, e);
        ticks[n++] = t;
        if (t >= hi - 1e-9 * step) break;
    }
    return n;
}

/* Text with &, <, >, " escaped for XML. */
static void put_text(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f); break;
        }
    }
}

/* A tick label: integers without decimals, others with up to 3 significant digits. */
static void tick_label(char *buf, size_t cap, double v) {
    if (fabs(v - round(v)) < 1e-9 * (fabs(v) + 1)) snprintf(buf, cap, "%.0f", v);
    else snprintf(buf, cap, "%.3g", v);
}

static void marker(FILE *f, int kind, double x, double y, const char *colour) {
    switch (kind % 4) {
    case 0: fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", x, y, colour); break;
    case 1:
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"7\" height=\"7\" fill=\"%s\"/>\n", x - 3.5,
                y - 3.5, colour);
        break;
    case 2:
        fprintf(f, "<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"%s\"/>\n", x,
                y - 4.5, x - 4, y + 3.5, x + 4, y + 3.5, colour);
        break;
    default:
        fprintf(f, "<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"%s\"/>\n",
                x, y - 4.5, x + 4.5, y, x, y + 4.5, x - 4.5, y, colour);
        break;
    }
}

/* The data range of a panel, over every series. */
static void data_range(const plot_panel *p, double *x0, double *x1, double *y0, double *y1) {
    *x0 = *y0 = INFINITY;
    *x1 = *y1 = -INFINITY;
    for (int32_t s = 0; s < p->n_series; s++)
        for (int32_t i = 0; i < p->series[s].n; i++) {
            const double x = p->series[s].x[i], y = p->series[s].y[i];
            if (!isfinite(x) || !isfinite(y)) continue;
            *x0 = fmin(*x0, x), *x1 = fmax(*x1, x), *y0 = fmin(*y0, y), *y1 = fmax(*y1, y);
        }
    if (!isfinite(*x0)) *x0 = 0, *x1 = 1, *y0 = 0, *y1 = 1;
    if (*y0 > 0) *y0 = 0; /* rates and times read best from zero */
}

static void draw_panel(FILE *f, const plot_panel *p, double ox) {
    double x0, x1, y0, y1, xt[MAX_TICKS + 2], yt[MAX_TICKS + 2];
    data_range(p, &x0, &x1, &y0, &y1);
    const int32_t nx = plot_nice_ticks(x0, x1, 6, xt, MAX_TICKS + 2);
    const int32_t ny = plot_nice_ticks(y0, y1, 6, yt, MAX_TICKS + 2);
    const double ax0 = xt[0], ax1 = xt[nx - 1], ay0 = yt[0], ay1 = yt[ny - 1];
    const double L = ox + M_LEFT, R = ox + PANEL_W - M_RIGHT, T = M_TOP, B = PANEL_H - M_BOTTOM;
#define PX(v) (L + ((v) - ax0) / (ax1 - ax0) * (R - L))
#define PY(v) (B - ((v) - ay0) / (ay1 - ay0) * (B - T))
    char lab[32];
    fprintf(f, "<g>\n<text x=\"%.1f\" y=\"20\" text-anchor=\"middle\" font-weight=\"bold\">",
            (L + R) / 2);
    put_text(f, p->title);
    fputs("</text>\n", f);
    for (int32_t i = 0; i < ny; i++) { /* horizontal gridlines and y labels */
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L,
                PY(yt[i]), R, PY(yt[i]));
        tick_label(lab, sizeof lab, yt[i]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", L - 6,
                PY(yt[i]) + 4, lab);
    }
    for (int32_t i = 0; i < nx; i++) { /* vertical gridlines and x labels */
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n",
                PX(xt[i]), T, PX(xt[i]), B);
        tick_label(lab, sizeof lab, xt[i]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", PX(xt[i]),
                B + 16, lab);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
               "stroke=\"#333\"/>\n", L, T, R - L, B - T);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", (L + R) / 2, PANEL_H - 10);
    put_text(f, p->xlabel);
    fprintf(f, "</text>\n<text transform=\"translate(%.1f %.1f) rotate(-90)\" "
               "text-anchor=\"middle\">", ox + 16, (T + B) / 2);
    put_text(f, p->ylabel);
    fputs("</text>\n", f);
    for (int32_t s = 0; s < p->n_series; s++) {
        const plot_series *ser = &p->series[s];
        const char *c = palette[s % PALETTE];
        fprintf(f, "<polyline class=\"series\" data-label=\"");
        put_text(f, ser->label);
        fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", c);
        for (int32_t i = 0; i < ser->n; i++)
            fprintf(f, "%s%.2f,%.2f", i ? " " : "", PX(ser->x[i]), PY(ser->y[i]));
        fputs("\"/>\n", f);
        for (int32_t i = 0; i < ser->n; i++) marker(f, s / PALETTE + s, PX(ser->x[i]), PY(ser->y[i]), c);
    }
    fputs("</g>\n", f);
#undef PX
#undef PY
}

int plot_svg_write(const char *path, const char *title, const plot_panel *panels,
                   int32_t n_panels) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.partial", path);
    FILE *f;
    FMOE_FORWARD_IF_ERROR(fmoe__partial_fopen(path, tmp, "w", &f)); /* lib/files.h */
    const int32_t ns = n_panels > 0 ? panels[0].n_series : 0;
    const int32_t per_row = (PANEL_W * (n_panels > 0 ? n_panels : 1)) / LEGEND_COL;
    const int32_t rows = per_row > 0 ? (ns + per_row - 1) / per_row : ns;
    const int width = PANEL_W * (n_panels > 0 ? n_panels : 1);
    const int height = PANEL_H + 24 + rows * LEGEND_ROW + 12;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" "
               "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<title>", width, height, width, height);
    put_text(f, title);
    fprintf(f, "</title>\n<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", width, height);
    for (int32_t p = 0; p < n_panels; p++) draw_panel(f, &panels[p], (double)p * PANEL_W);
    fputs("<g class=\"legend\">\n", f);
    for (int32_t s = 0; s < ns; s++) {
        const double lx = 24 + (double)(s % per_row) * LEGEND_COL;
        const double ly = PANEL_H + 24 + (double)(s / per_row) * LEGEND_ROW;
        const char *c = palette[s % PALETTE];
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                   "stroke-width=\"2\"/>\n", lx, ly - 4, lx + 24, ly - 4, c);
        marker(f, s / PALETTE + s, lx + 12, ly - 4, c);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", lx + 30, ly);
        put_text(f, panels[0].series[s].label);
        fputs("</text>\n", f);
    }
    fputs("</g>\n</svg>\n", f);
    const int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        const int e = errno;
        remove(tmp);
        return fmoe_error_set(FMOE_EIO, "%s: write error: %s", path, strerror(e));
    }
    return 0;
}
