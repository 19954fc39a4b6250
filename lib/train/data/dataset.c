/* SPDX-License-Identifier: MIT */
/* Data sets of MNIST-format samples (data.h): loading and batches. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "idx.h"
#include "error.h"
#include "shmrpc/data.h"

#define SIDE 28    /* MNIST and Fashion-MNIST images are 28x28 */
#define CLASSES 10

struct sr_dataset {
    int64_t n, features;
    uint8_t *pixels; /* n x features */
    uint8_t *labels; /* n */
};

SR_API int sr_mnist_load_files(const char *images_path, const char *labels_path, sr_dataset **out)
{
    if (!images_path || !labels_path || !out)
        return sr__fail(-EINVAL, "sr_mnist_load", "needs two paths and an out pointer");
    struct sr__idx img = {0}, lab = {0};
    int rc = sr__idx_read_images(images_path, SIDE, SIDE, &img);
    if (!rc && !(rc = sr__idx_read_labels(labels_path, CLASSES, &lab)) && img.count != lab.count)
        rc = sr__fail(-EBADMSG, "sr_mnist_load", "%s holds %lld images but %s holds %lld labels", images_path,
                      (long long)img.count, labels_path, (long long)lab.count);
    sr_dataset *ds = rc ? NULL : malloc(sizeof(*ds));
    if (!rc && !ds)
        rc = sr__fail(-ENOMEM, "sr_mnist_load", "out of memory");
    if (rc) {
        free(img.data);
        free(lab.data);
        return rc;
    }
    *ds = (sr_dataset){.n = img.count, .features = SIDE * SIDE, .pixels = img.data, .labels = lab.data};
    *out = ds;
    return 0;
}

SR_API int sr_fashion_mnist_load(const char *dir, bool train, sr_dataset **out)
{
    char images[4096], labels[4096];
    const char *d = dir ? dir : SR_FASHION_MNIST_DIR, *split = train ? "train" : "t10k";
    int a = snprintf(images, sizeof(images), "%s/%s-images-idx3-ubyte.gz", d, split);
    int b = snprintf(labels, sizeof(labels), "%s/%s-labels-idx1-ubyte.gz", d, split);
    if (a < 0 || b < 0 || (size_t)a >= sizeof(images) || (size_t)b >= sizeof(labels))
        return sr__fail(-ENAMETOOLONG, "sr_fashion_mnist_load", "directory name too long: %s", d);
    int rc = sr_mnist_load_files(images, labels, out);
    if (rc != -ENOENT || dir)
        return rc;
    char why[4400]; /* sr__fail rewrites the buffer sr_last_error() points to */
    snprintf(why, sizeof(why), "%s", sr_last_error());
    return sr__fail(rc, "sr_fashion_mnist_load", "%s (install the Debian package dataset-fashion-mnist)", why);
}

SR_API void sr_dataset_destroy(sr_dataset *ds)
{
    if (!ds)
        return;
    free(ds->pixels);
    free(ds->labels);
    free(ds);
}

SR_API int64_t sr_dataset_size(const sr_dataset *ds)
{
    return ds ? ds->n : sr__fail(-EINVAL, "sr_dataset_size", "data set is NULL");
}

SR_API int64_t sr_dataset_features(const sr_dataset *ds)
{
    return ds ? ds->features : sr__fail(-EINVAL, "sr_dataset_features", "data set is NULL");
}

SR_API const uint8_t *sr_dataset_pixels(const sr_dataset *ds, int64_t i)
{
    if (!ds)
        sr__fail(-EINVAL, "sr_dataset_pixels", "data set is NULL (sample %lld)", (long long)i);
    return ds && i >= 0 && i < ds->n ? ds->pixels + i * ds->features : NULL;
}

SR_API int sr_dataset_label(const sr_dataset *ds, int64_t i)
{
    if (!ds)
        sr__fail(-EINVAL, "sr_dataset_label", "data set is NULL (sample %lld)", (long long)i);
    return ds && i >= 0 && i < ds->n ? ds->labels[i] : -1;
}

static int check_indices(const sr_dataset *ds, const int64_t *idx, int64_t n)
{
    if (n < 0 || (n > 0 && !idx))
        return sr__fail(-EINVAL, "sr_dataset_batch", "bad batch of %lld indices", (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= ds->n)
            return sr__fail(-EINVAL, "sr_dataset_batch", "index %lld (batch position %lld) is out of [0, %lld)",
                            (long long)idx[i], (long long)i, (long long)ds->n);
    return 0;
}

/* x[i, :] = pixels of sample idx[i] / 255 in f32, as torchvision's
 * ToTensor computes it; y[i] = its label. The samples are random rows of
 * the data set, mostly not in cache, and the conversion waited on their
 * loads: the next row is prefetched while this one converts, which halves
 * a batch of 64 (44-54 to 23-27 us, release build). A table of the 256
 * quotients instead of the division was slower (a scalar gather). */
static void fill_batch(const sr_dataset *ds, const int64_t *idx, int64_t n, float *x, int64_t *y)
{
    const int64_t f = ds->features;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *p = ds->pixels + idx[i] * f;
        if (i + 1 < n) {
            const uint8_t *next = ds->pixels + idx[i + 1] * f;
            for (int64_t k = 0; k < f; k += 64)
                __builtin_prefetch(next + k);
            __builtin_prefetch(next + f - 1); /* a row's last line, when it straddles one more */
        }
        for (int64_t j = 0; j < f; j++)
            x[i * f + j] = (float)p[j] / 255.0f;
        y[i] = ds->labels[idx[i]];
    }
}

SR_API int sr_dataset_batch(const sr_dataset *ds, const int64_t *indices, int64_t n, sr_tensor **x,
                            sr_tensor **y)
{
    if (!ds || !x || !y)
        return sr__fail(-EINVAL, "sr_dataset_batch", "needs a data set and two out pointers");
    int rc = check_indices(ds, indices, n);
    if (rc)
        return rc;
    sr_tensor *xt = sr_empty(SR_F32, 2, (const int64_t[]){n, ds->features}, 0);
    sr_tensor *yt = xt ? sr_empty(SR_I64, 1, &n, 0) : NULL;
    float *xp = yt ? sr_tensor_mutable_data(xt) : NULL;
    int64_t *yp = xp ? sr_tensor_mutable_data(yt) : NULL;
    if (!yp) {
        sr_tensor_unref(xt);
        sr_tensor_unref(yt);
        return -ENOMEM;
    }
    fill_batch(ds, indices, n, xp, yp);
    *x = xt;
    *y = yt;
    return 0;
}
