/* SPDX-License-Identifier: MIT */
/* shmrpc: data sets for training — MNIST-format IDX files (Fashion-MNIST
 * from Debian's dataset-fashion-mnist package, or the original MNIST).
 *
 * A data set holds the images as bytes (N x rows x cols, row-major) and the
 * labels, in private memory of the process that loaded it; batches are new
 * tensors built on request, so workers may each load it and draw their own
 * batches. Loading reads the whole file (gzip-compressed or plain: zlib reads
 * both) and validates it before anything is returned.
 *
 * Lifetime: a loader hands back a data set that the caller releases with
 * sr_dataset_destroy(); pointers from sr_dataset_pixels() are borrowed until
 * then. Tensors from sr_dataset_batch() are the caller's (sr_tensor_unref)
 * and do not depend on the data set; made after the worker joined its job,
 * they are in the shared heap and can be sent to another worker without a
 * copy. A data set is read-only after loading: threads may share it.
 *
 * Errors: 0 or -errno, with sr_last_error() naming the file and the fault:
 *   -ENOENT, -EACCES, ...  the file cannot be opened
 *   -EIO                   reading failed
 *   -EBADMSG               the content is wrong: corrupt gzip data, a bad
 *                          magic number (0x00000803 images, 0x00000801
 *                          labels), images that are not 28x28, a file that
 *                          ends early or runs past its declared count, a
 *                          label outside 0..9, or image and label files
 *                          whose counts differ (both files named)
 *   -EINVAL                a bad argument (NULL out, index out of range)
 *   -ENOMEM
 */
#ifndef SHMRPC_DATA_H
#define SHMRPC_DATA_H

#if defined(SR__BUILDING) && !defined(SR__SEES_TRAIN)
#error "shmrpc/data.h belongs to the training (train) layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stdint.h>

#include "error.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where Debian's dataset-fashion-mnist package installs the files. */
#define SR_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

typedef struct sr_dataset sr_dataset;

/* Fashion-MNIST from dir (NULL: SR_FASHION_MNIST_DIR): train selects
 * train-{images-idx3,labels-idx1}-ubyte.gz (60000 samples), otherwise
 * t10k-... (10000 samples). Any MNIST-format directory with these names
 * works, e.g. the original MNIST. */
SR_API int sr_fashion_mnist_load(const char *dir, bool train, sr_dataset **out);
/* The same from two explicit paths: an IDX3 file of 28x28 ubyte images and
 * an IDX1 file of as many ubyte labels in 0..9. */
SR_API int sr_mnist_load_files(const char *images_path, const char *labels_path, sr_dataset **out);
/* NULL is ignored. */
SR_API void sr_dataset_destroy(sr_dataset *ds);

/* A NULL ds is -EINVAL in sr_last_error(): size and features return
 * -EINVAL, pixels NULL, label -1. */
/* Number of samples. */
SR_API int64_t sr_dataset_size(const sr_dataset *ds);
/* Values per sample: rows * cols (784). */
SR_API int64_t sr_dataset_features(const sr_dataset *ds);
/* Sample i's rows * cols pixel bytes (borrowed), or NULL if i is out of range. */
SR_API const uint8_t *sr_dataset_pixels(const sr_dataset *ds, int64_t i);
/* Sample i's label (0..9), or -1 if i is out of range. */
SR_API int sr_dataset_label(const sr_dataset *ds, int64_t i);

/* A batch of the n samples indices[0..n-1] (in that order, repeats
 * allowed): *x f32 [n, features] with pixel / 255 (torchvision's ToTensor,
 * values in [0, 1]) and *y i64 [n]. Both new references; neither requires
 * grad. -EINVAL naming the first index out of [0, size). */
SR_API int sr_dataset_batch(const sr_dataset *ds, const int64_t *indices, int64_t n, sr_tensor **x,
                            sr_tensor **y);

#ifdef __cplusplus
}
#endif
#endif
