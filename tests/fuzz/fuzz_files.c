/* SPDX-License-Identifier: MIT */
/* Fuzzer of the files the library reads: checkpoints (sr_checkpoint_load)
 * and MNIST-format IDX files (sr_mnist_load_files). Built with -Dfuzz=true
 * (clang, libFuzzer, ASan, UBSan); README.md says how to run it.
 *
 * An input's first byte picks the file kind (low bit):
 *   0  the rest is a checkpoint. Its header and table-of-contents CRCs are
 *      recomputed before it is written (sr__ckpt_reseal), so mutations get
 *      past the checksums to the checks behind them; each tensor's own CRC
 *      is left as it is (a data byte's mutation is a checksum error, which
 *      the unit tests cover).
 *   1  the next two bytes (little-endian) are the length of the images
 *      file, whose bytes follow; the rest is the labels file.
 * The oracles: no crash, no sanitizer report, no leak; an error is
 * -EBADMSG or -ENOMEM (a checkpoint) or -EBADMSG, -EINVAL or -ENOMEM (IDX
 * files), with a message; what loads is read whole (every tensor's values,
 * every sample's pixels and label, one batch). The files live in a private
 * directory under $TMPDIR, removed at exit. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/format.h"
#include "fuzz_env.h"
#include "shmrpc/checkpoint.h"
#include "shmrpc/data.h"
#include "shmrpc/error.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *report; /* where the oracles report (fz_report_open) */
static bool trace;   /* FUZZ_TRACE=1: print what each load answered */
static char dir[256], ckpt_path[300], images_path[300], labels_path[300];

static void remove_files(void)
{
    unlink(ckpt_path);
    unlink(images_path);
    unlink(labels_path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    trace = getenv("FUZZ_TRACE") != NULL;
    report = fz_report_open();
    fz_env_init(); /* a heap: a checkpoint's tensors are loaded into shared blocks */
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof(dir), "%s/shmrpc-fuzz-files-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(report, "fuzz_files: cannot make a directory %s: %s\n", dir, strerror(errno));
        exit(1);
    }
    snprintf(ckpt_path, sizeof(ckpt_path), "%s/ckpt", dir);
    snprintf(images_path, sizeof(images_path), "%s/images", dir);
    snprintf(labels_path, sizeof(labels_path), "%s/labels", dir);
    atexit(remove_files);
    return 0;
}

static void write_file(const char *path, const uint8_t *p, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    size_t done = 0;
    while (fd >= 0 && done < len) {
        ssize_t w = write(fd, p + done, len - done);
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    if (fd < 0 || done != len) {
        fprintf(report, "fuzz_files: cannot write %s: %s\n", path, strerror(errno));
        abort();
    }
    close(fd);
}

static void expect_error(const char *what, int rc, int also)
{
    if (rc == -EBADMSG || rc == -ENOMEM || rc == also)
        return;
    fprintf(report, "fuzz_files: %s returned %d (%s)\n", what, rc, sr_last_error());
    abort();
}

/* Every tensor's values (a sum reads each element) and every entry. */
static void read_checkpoint(const sr_checkpoint *c)
{
    for (size_t i = 0; i < sr_checkpoint_count(c); i++) {
        const char *name = sr_checkpoint_name(c, i);
        sr_tensor *t = name ? sr_checkpoint_tensor(c, name) : NULL;
        if (!t) {
            fprintf(report, "fuzz_files: loaded tensor %zu ('%s') cannot be found by its name\n", i,
                    name ? name : "(null)");
            abort();
        }
        sr_tensor *s = sr_tensor_dtype(t) == SR_I64 ? NULL : sr_sum(t);
        sr_tensor_unref(s);
    }
    for (size_t i = 0; i < sr_checkpoint_meta_count(c); i++) {
        int64_t v;
        const char *name = sr_checkpoint_meta_name(c, i);
        if (!name || sr_checkpoint_meta(c, name, &v)) {
            fprintf(report, "fuzz_files: loaded metadata entry %zu cannot be read by its name\n", i);
            abort();
        }
    }
}

static void checkpoint(const uint8_t *p, size_t len)
{
    uint8_t *img = malloc(len ? len : 1);
    if (!img)
        return;
    memcpy(img, p, len);
    sr__ckpt_reseal(img, len);
    write_file(ckpt_path, img, len);
    free(img);
    sr_checkpoint *c = NULL;
    int rc = sr_checkpoint_load(ckpt_path, &c);
    if (trace)
        fprintf(report, "fuzz_files: checkpoint of %zu bytes: %d %s\n", len, rc,
                rc ? sr_last_error() : "loaded");
    if (rc) {
        expect_error("sr_checkpoint_load", rc, -EBADMSG);
        return;
    }
    read_checkpoint(c);
    sr_checkpoint_destroy(c);
}

/* Every sample, and one batch of the first and last. */
static void read_dataset(const sr_dataset *ds)
{
    int64_t n = sr_dataset_size(ds), f = sr_dataset_features(ds);
    unsigned sum = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *px = sr_dataset_pixels(ds, i);
        int label = sr_dataset_label(ds, i);
        if (!px || label < 0 || label > 9) {
            fprintf(report, "fuzz_files: sample %lld of %lld: pixels %p, label %d\n", (long long)i, (long long)n,
                    (const void *)px, label);
            abort();
        }
        for (int64_t k = 0; k < f; k++)
            sum += px[k];
    }
    (void)sum;
    if (n > 0) {
        int64_t idx[2] = {0, n - 1};
        sr_tensor *x = NULL, *y = NULL;
        if (sr_dataset_batch(ds, idx, 2, &x, &y)) {
            fprintf(report, "fuzz_files: a batch of samples 0 and %lld failed: %s\n", (long long)(n - 1),
                    sr_last_error());
            abort();
        }
        sr_tensor_unref(x);
        sr_tensor_unref(y);
    }
}

static void idx_files(const uint8_t *p, size_t len)
{
    if (len < 2)
        return;
    size_t split = (size_t)p[0] | (size_t)p[1] << 8;
    p += 2;
    len -= 2;
    if (split > len)
        split = len;
    write_file(images_path, p, split);
    write_file(labels_path, p + split, len - split);
    sr_dataset *ds = NULL;
    int rc = sr_mnist_load_files(images_path, labels_path, &ds);
    if (trace)
        fprintf(report, "fuzz_files: IDX files of %zu and %zu bytes: %d %s\n", split, len - split, rc,
                rc ? sr_last_error() : "loaded");
    if (rc) {
        expect_error("sr_mnist_load_files", rc, -EINVAL);
        return;
    }
    read_dataset(ds);
    sr_dataset_destroy(ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1)
        idx_files(data + 1, size - 1);
    else
        checkpoint(data + 1, size - 1);
    return 0;
}
