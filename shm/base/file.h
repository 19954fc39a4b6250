/* SPDX-License-Identifier: MIT */
/* Opening a file that must be a regular file (checkpoints, data sets),
 * never with an open that can block.
 *
 * sr__open_regular: openat(dirfd, name, flags) for a regular file only: the
 * open itself is O_NONBLOCK (and O_NOCTTY, O_CLOEXEC), so a FIFO or a
 * device there cannot block it, then fstat refuses anything else with
 * -EINVAL, "<noun> <path> is a FIFO, not a regular file"; O_NONBLOCK is
 * cleared for the reads and writes. A fd (and its fstat in *st unless
 * NULL), or -errno after sr__fail (fn names the API call). The caller owns
 * the fd. */
#ifndef SR_SHM_FILE_H
#define SR_SHM_FILE_H

#if !defined(SR__SEES_BASE)
#error "file.h is the seam of the base layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
struct stat;
int sr__open_regular(int dirfd, const char *name, int flags, const char *fn, const char *noun, const char *path,
                     struct stat *st);

#endif
