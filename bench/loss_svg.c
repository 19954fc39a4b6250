/* SPDX-License-Identifier: MIT */
/* The loss curve of demo_train as an SVG: see loss_svg.h. */
#include "loss_svg.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { W = 800, H = 480, LEFT = 70, RIGHT = 20, TOP = 40, BOTTOM = 60 };

struct frame {
    double xmax, ymax; /* data range: x in [1, xmax], y in [0, ymax] */
};

static double px(const struct frame *f, double step)
{
    return LEFT + (step - 1) / (f->xmax > 1 ? f->xmax - 1 : 1) * (W - LEFT - RIGHT);
}

static double py(const struct frame *f, double v)
{
    double y = v > f->ymax ? f->ymax : v;
    return H - BOTTOM - y / f->ymax * (H - TOP - BOTTOM);
}

/* A "nice" tick spacing (1, 2 or 5 times a power of ten) for about 5 ticks. */
static double tick_step(double range)
{
    double raw = range / 5, p = pow(10, floor(log10(raw)));
    return raw / p < 1.5 ? p : raw / p < 3.5 ? 2 * p : raw / p < 7.5 ? 5 * p : 10 * p;
}

static void axes(FILE *f, const struct frame *fr, const char *title)
{
    fprintf(f, "<rect width='%d' height='%d' fill='white'/>\n", W, H);
    fprintf(f, "<text x='%d' y='24' font-size='16' text-anchor='middle'>%s</text>\n", W / 2, title);
    fprintf(f, "<g stroke='black' stroke-width='1'><line x1='%d' y1='%d' x2='%d' y2='%d'/>", LEFT, H - BOTTOM,
            W - RIGHT, H - BOTTOM);
    fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d'/></g>\n", LEFT, TOP, LEFT, H - BOTTOM);
    double ys = tick_step(fr->ymax), xs = tick_step(fr->xmax);
    for (double v = 0; v <= fr->ymax + 1e-9; v += ys)
        fprintf(f, "<line x1='%d' y1='%.1f' x2='%d' y2='%.1f' stroke='#ddd'/>"
                   "<text x='%d' y='%.1f' font-size='12' text-anchor='end'>%g</text>\n",
                LEFT, py(fr, v), W - RIGHT, py(fr, v), LEFT - 6, py(fr, v) + 4, v);
    for (double s = xs; s <= fr->xmax + 1e-9; s += xs)
        fprintf(f, "<line x1='%.1f' y1='%d' x2='%.1f' y2='%d' stroke='black'/>"
                   "<text x='%.1f' y='%d' font-size='12' text-anchor='middle'>%g</text>\n",
                px(fr, s), H - BOTTOM, px(fr, s), H - BOTTOM + 5, px(fr, s), H - BOTTOM + 20, s);
    fprintf(f, "<text x='%d' y='%d' font-size='14' text-anchor='middle'>step</text>\n", (LEFT + W - RIGHT) / 2,
            H - 18);
    fprintf(f, "<text x='18' y='%d' font-size='14' text-anchor='middle' transform='rotate(-90 18 %d)'>"
               "training loss (cross-entropy)</text>\n", (TOP + H - BOTTOM) / 2, (TOP + H - BOTTOM) / 2);
}

/* The polyline of v[0..n), every point or a mean of w neighbours. */
static void curve(FILE *f, const struct frame *fr, const double *v, size_t n, size_t w, const char *style)
{
    fprintf(f, "<polyline fill='none' %s points='", style);
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        sum += v[i] - (i >= w ? v[i - w] : 0);
        size_t k = i + 1 < w ? i + 1 : w;
        fprintf(f, "%.1f,%.1f ", px(fr, (double)i + 1), py(fr, sum / (double)k));
    }
    fprintf(f, "'/>\n");
}

static void legend(FILE *f, size_t w)
{
    fprintf(f, "<g font-size='12'><line x1='%d' y1='%d' x2='%d' y2='%d' stroke='#bbb'/>"
               "<text x='%d' y='%d'>loss of each step</text>",
            W - 250, TOP + 10, W - 225, TOP + 10, W - 220, TOP + 14);
    fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='#1f5fbf' stroke-width='2'/>"
               "<text x='%d' y='%d'>mean of the last %zu steps</text></g>\n",
            W - 250, TOP + 28, W - 225, TOP + 28, W - 220, TOP + 32, w);
}

int loss_svg_write(const char *path, const char *title, const double *loss, size_t n)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        int e = errno;
        fprintf(stderr, "loss curve: cannot write %s: %s\n", path, strerror(e));
        return -e;
    }
    struct frame fr = {.xmax = n > 1 ? (double)n : 2, .ymax = 0};
    for (size_t i = 0; i < n; i++)
        fr.ymax = isfinite(loss[i]) && loss[i] > fr.ymax ? loss[i] : fr.ymax;
    fr.ymax = fr.ymax > 0 ? fr.ymax * 1.05 : 1;
    size_t w = n / 50 > 1 ? n / 50 : 1;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='sans-serif'>\n", W, H);
    axes(f, &fr, title);
    curve(f, &fr, loss, n, 1, "stroke='#bbb' stroke-width='1'");
    curve(f, &fr, loss, n, w, "stroke='#1f5fbf' stroke-width='2'");
    legend(f, w);
    fprintf(f, "</svg>\n");
    if (fclose(f)) {
        int e = errno;
        fprintf(stderr, "loss curve: writing %s failed: %s\n", path, strerror(e));
        return -e;
    }
    return 0;
}
