/* SPDX-License-Identifier: MIT */
/* A loss curve as an SVG picture: the raw per-step losses in light grey, a
 * moving mean over them in blue, axes with ticks and labels. No library. */
#ifndef SR_BENCH_LOSS_SVG_H
#define SR_BENCH_LOSS_SVG_H

#include <stddef.h>

/* Write loss[0..n) (loss[i]: the loss of step i + 1) to path; title goes on
 * top. 0, or -errno with a message on stderr. */
int loss_svg_write(const char *path, const char *title, const double *loss, size_t n);

#endif
