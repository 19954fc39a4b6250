/* SPDX-License-Identifier: MIT */
/* Reading MNIST-format IDX files (http://yann.lecun.com/exdb/mnist/): a
 * big-endian header of a magic number 0x0000TTDD (TT the element type, 08
 * for unsigned bytes; DD the number of dims) and DD 32-bit sizes, then the
 * elements, row-major. The files may be gzip-compressed or plain.
 *
 * Every error names the file and says what is wrong (data.h lists the
 * codes). On success the caller owns *data (free()). */
#ifndef SR_LIB_DATA_IDX_H
#define SR_LIB_DATA_IDX_H

#if !defined(SR__IN_TRAIN)
#error "idx.h is private to the training (train) layer (docs/ARCHITECTURE.md)"
#endif
#include <stdint.h>

#define SR__IDX_IMAGES_MAGIC 0x00000803u /* ubyte, 3 dims: count, rows, cols */
#define SR__IDX_LABELS_MAGIC 0x00000801u /* ubyte, 1 dim: count */

struct sr__idx {
    uint8_t *data;
    int64_t count; /* first dim */
    int64_t rows, cols; /* images only */
};

/* Images of exactly rows x cols pixels. */
int sr__idx_read_images(const char *path, int64_t rows, int64_t cols, struct sr__idx *out);
/* Labels, each below classes. */
int sr__idx_read_labels(const char *path, int classes, struct sr__idx *out);

#endif
