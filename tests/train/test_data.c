/* SPDX-License-Identifier: MIT */
/* data.h: the IDX reader on the real Fashion-MNIST files (skipped when the
 * dataset-fashion-mnist package is absent) and on crafted bad files, each
 * written to a temporary directory of the test's own that .fini removes. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "bounded.h"
#include "shmrpc/data.h"
#include "tensor_util.h"
#include "common.h"

LEAK_CHECKED_SUITE(fashion);
LEAK_CHECKED_SUITE(idx_errors);

/* ---- the real files ---- */

static sr_dataset *load_real(bool train)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/t10k-labels-idx1-ubyte.gz", SR_FASHION_MNIST_DIR);
    if (access(path, R_OK))
        cr_skip_test("dataset-fashion-mnist is not installed (%s)", path);
    sr_dataset *ds = NULL;
    cr_assert_eq(sr_fashion_mnist_load(NULL, train, &ds), 0, "%s", sr_last_error());
    return ds;
}

static long pixel_sum(const sr_dataset *ds, int64_t i)
{
    const uint8_t *p = sr_dataset_pixels(ds, i);
    long s = 0;
    for (int j = 0; j < 784; j++)
        s += p[j];
    return s;
}

/* Reference values from Python's gzip module reading the same files. */
Test(fashion, train_split_matches_the_files)
{
    sr_dataset *ds = load_real(true);
    cr_assert_eq(sr_dataset_size(ds), 60000);
    cr_assert_eq(sr_dataset_features(ds), 784);
    int first[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5}, counts[10] = {0};
    for (int i = 0; i < 10; i++)
        cr_assert_eq(sr_dataset_label(ds, i), first[i], "label %d", i);
    cr_assert_eq(sr_dataset_label(ds, 59999), 5);
    cr_assert_eq(pixel_sum(ds, 0), 76247);
    cr_assert_eq(pixel_sum(ds, 59999), 16684);
    const uint8_t *p0 = sr_dataset_pixels(ds, 0);
    uint8_t want[6] = {210, 211, 213, 223, 220, 243};
    cr_assert_arr_eq(p0 + 300, want, 6);
    for (int64_t i = 0; i < 60000; i++)
        counts[sr_dataset_label(ds, i)]++;
    for (int c = 0; c < 10; c++)
        cr_assert_eq(counts[c], 6000, "class %d", c);
    cr_assert_null(sr_dataset_pixels(ds, 60000));
    cr_assert_eq(sr_dataset_label(ds, -1), -1);
    sr_dataset_destroy(ds);
}

Test(fashion, test_split_and_batches)
{
    sr_dataset *ds = load_real(false);
    cr_assert_eq(sr_dataset_size(ds), 10000);
    int first[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
    for (int i = 0; i < 10; i++)
        cr_assert_eq(sr_dataset_label(ds, i), first[i], "label %d", i);
    cr_assert_eq(pixel_sum(ds, 0), 33456);
    cr_assert_eq(pixel_sum(ds, 9999), 24390);

    sr_tensor *x, *y;
    int64_t idx[3] = {9999, 0, 0};
    cr_assert_eq(sr_dataset_batch(ds, idx, 3, &x, &y), 0, "%s", sr_last_error());
    tu_expect_shape(x, 2, SHAPE(3, 784), "x");
    tu_expect_shape(y, 1, SHAPE(3), "y");
    cr_assert_eq(sr_tensor_dtype(x), SR_F32);
    cr_assert_eq(sr_tensor_dtype(y), SR_I64);
    cr_assert(!sr_tensor_requires_grad(x));
    tu_expect(y, VALS(5, 9, 9), 3, 0, 0, "labels in index order");
    const float *xv = sr_tensor_data(x);
    const uint8_t *p0 = sr_dataset_pixels(ds, 0), *pl = sr_dataset_pixels(ds, 9999);
    for (int j = 0; j < 784; j++)
        if (xv[j] != (float)pl[j] / 255.0f || xv[784 + j] != (float)p0[j] / 255.0f || xv[1568 + j] != xv[784 + j])
            cr_assert_fail("pixel %d: %g is not the byte / 255", j, xv[784 + j]);
    cr_assert_eq(xv[784 + 300], 157.0f / 255.0f);
    sr_tensor_unref(x);
    sr_tensor_unref(y);

    idx[1] = 10000;
    x = y = NULL;
    cr_assert_eq(sr_dataset_batch(ds, idx, 3, &x, &y), -EINVAL);
    tu_expect_error("index", "sr_dataset_batch", "index 10000 (batch position 1)");
    cr_assert(!x && !y);
    sr_dataset_destroy(ds);
}

/* ---- crafted files ---- */

static char tmp[64];

static void make_tmp(void)
{
    snprintf(tmp, sizeof(tmp), "/tmp/sr-data-XXXXXX");
    cr_assert(mkdtemp(tmp), "mkdtemp: %s", strerror(errno));
}

static void remove_tmp(void)
{
    DIR *d = opendir(tmp);
    struct dirent *e;
    char path[512];
    while (d && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof(path), "%s/%s", tmp, e->d_name);
            unlink(path);
        }
    }
    if (d)
        closedir(d);
    rmdir(tmp);
}

#define BAD_FILE_TEST(name) Test(idx_errors, name, .init = make_tmp, .fini = remove_tmp)

static const char *tmp_path(const char *name)
{
    static char path[8][256];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 256, "%s/%s", tmp, name);
    return p;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* An IDX file: magic, dims, then body_len bytes (sample i's bytes are i % 10),
 * through gzopen's mode ("wb": gzip, "wbT": plain, "wb0": stored blocks,
 * "ab": one more gzip member; with split, the bytes go in two members). */
static void write_idx_mode(const char *name, uint32_t magic, int ndim, const uint32_t *dims, size_t body_len,
                           const char *mode, bool split)
{
    uint8_t *buf = malloc(16 + body_len);
    put_be32(buf, magic);
    for (int i = 0; i < ndim; i++)
        put_be32(buf + 4 + 4 * i, dims[i]);
    size_t h = 4 + 4 * (size_t)ndim, per = ndim == 3 ? (size_t)dims[1] * dims[2] : 1;
    for (size_t i = 0; i < body_len; i++)
        buf[h + i] = (uint8_t)((i / per) % 10);
    size_t first = split ? (h + body_len) / 2 : h + body_len;
    gzFile f = gzopen(tmp_path(name), mode);
    cr_assert(f, "gzopen %s", name);
    cr_assert_eq(gzwrite(f, buf, (unsigned)first), (int)first);
    cr_assert_eq(gzclose(f), Z_OK);
    if (split) {
        cr_assert(f = gzopen(tmp_path(name), "ab"), "gzopen %s for a second member", name);
        cr_assert_eq(gzwrite(f, buf + first, (unsigned)(h + body_len - first)), (int)(h + body_len - first));
        cr_assert_eq(gzclose(f), Z_OK);
    }
    free(buf);
}

static void write_idx(const char *name, uint32_t magic, int ndim, const uint32_t *dims, size_t body_len, bool plain)
{
    write_idx_mode(name, magic, ndim, dims, body_len, plain ? "wbT" : "wb", false);
}

static void write_images(const char *name, uint32_t n, uint32_t rows, uint32_t cols)
{
    write_idx(name, 0x803, 3, (uint32_t[]){n, rows, cols}, (size_t)n * rows * cols, false);
}

static void write_labels(const char *name, uint32_t n)
{
    write_idx(name, 0x801, 1, &n, n, false);
}

/* The standard names of the train split, n samples each. */
static void write_good_pair(uint32_t n)
{
    write_images("train-images-idx3-ubyte.gz", n, 28, 28);
    write_labels("train-labels-idx1-ubyte.gz", n);
}

/* Loading tmp fails with err, naming file and saying what. */
static void expect_load_error(int err, const char *file, const char *what)
{
    sr_dataset *ds = NULL;
    int rc = sr_fashion_mnist_load(tmp, true, &ds);
    cr_assert_eq(rc, err, "got %d (%s), expected %d: %s", rc, sr_strerror(rc), err, sr_last_error());
    cr_assert_null(ds);
    tu_expect_error(what, tmp_path(file), what);
}

BAD_FILE_TEST(a_crafted_good_pair_loads)
{
    write_good_pair(12);
    sr_dataset *ds;
    cr_assert_eq(sr_fashion_mnist_load(tmp, true, &ds), 0, "%s", sr_last_error());
    cr_assert_eq(sr_dataset_size(ds), 12);
    cr_assert_eq(sr_dataset_label(ds, 11), 1);
    cr_assert_eq(sr_dataset_pixels(ds, 3)[783], 3);
    sr_dataset_destroy(ds);
    /* zlib reads uncompressed files too */
    write_idx("plain-images", 0x803, 3, (uint32_t[]){2, 28, 28}, 2 * 784, true);
    write_idx("plain-labels", 0x801, 1, (uint32_t[]){2}, 2, true);
    cr_assert_eq(sr_mnist_load_files(tmp_path("plain-images"), tmp_path("plain-labels"), &ds), 0, "%s",
                 sr_last_error());
    cr_assert_eq(sr_dataset_size(ds), 2);
    sr_dataset_destroy(ds);
}

/* A FIFO where a data file should be: refused at once, naming it (zlib's
 * own open would block for ever waiting for a writer). */
static int load_tmp(void)
{
    sr_dataset *ds = NULL;
    int rc = sr_fashion_mnist_load(tmp, true, &ds);
    sr_dataset_destroy(ds);
    return rc;
}

BAD_FILE_TEST(fifo_instead_of_a_file_is_refused_at_once)
{
    write_labels("train-labels-idx1-ubyte.gz", 4);
    const char *images = tmp_path("train-images-idx3-ubyte.gz");
    cr_assert_eq(mkfifo(images, 0600), 0, "mkfifo: %s", strerror(errno));
    struct bounded b = run_bounded(load_tmp, "loading a data set whose images file is a FIFO");
    cr_assert_eq(b.rc, -EINVAL, "got %d: %s", b.rc, b.err);
    cr_assert(strstr(b.err, images) && strstr(b.err, "is a FIFO, not a regular file"), "error: %s", b.err);
}

BAD_FILE_TEST(missing_file)
{
    expect_load_error(-ENOENT, "train-images-idx3-ubyte.gz", "cannot open");
    write_images("train-images-idx3-ubyte.gz", 3, 28, 28);
    expect_load_error(-ENOENT, "train-labels-idx1-ubyte.gz", "No such file");
}

BAD_FILE_TEST(bad_magic)
{
    write_good_pair(3);
    write_labels("train-images-idx3-ubyte.gz", 3); /* a label file where images belong */
    expect_load_error(-EBADMSG, "train-images-idx3-ubyte.gz", "bad magic number 0x00000801, expected 0x00000803");
    write_good_pair(3);
    write_idx("train-labels-idx1-ubyte.gz", 0x08010000, 1, (uint32_t[]){3}, 3, false); /* byte-swapped */
    expect_load_error(-EBADMSG, "train-labels-idx1-ubyte.gz", "bad magic number");
}

BAD_FILE_TEST(wrong_dims)
{
    write_good_pair(3);
    write_images("train-images-idx3-ubyte.gz", 3, 28, 27);
    expect_load_error(-EBADMSG, "train-images-idx3-ubyte.gz", "images are 28x27, expected 28x28");
}

BAD_FILE_TEST(truncated_body_header_and_stream)
{
    write_good_pair(3);
    write_idx("train-images-idx3-ubyte.gz", 0x803, 3, (uint32_t[]){3, 28, 28}, 2 * 784 + 5, false);
    expect_load_error(-EBADMSG, "train-images-idx3-ubyte.gz", "truncated: 1573 of the 2352 data bytes");
    write_good_pair(3);
    write_idx("train-labels-idx1-ubyte.gz", 0x801, 0, NULL, 2, false); /* magic, then 2 of 4 count bytes */
    expect_load_error(-EBADMSG, "train-labels-idx1-ubyte.gz", "truncated: the header");

    /* A gzip file cut in the middle of its deflate stream. */
    write_good_pair(40);
    FILE *f = fopen(tmp_path("train-images-idx3-ubyte.gz"), "r+");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    cr_assert_eq(ftruncate(fileno(f), len / 2), 0);
    fclose(f);
    expect_load_error(-EBADMSG, "train-images-idx3-ubyte.gz", "truncated");
}

/* The file name's size, less cut bytes. */
static void cut_tail(const char *name, long cut)
{
    struct stat st;
    cr_assert_eq(stat(tmp_path(name), &st), 0);
    cr_assert_eq(truncate(tmp_path(name), st.st_size - cut), 0);
}

/* A gzip stream must end with its trailer (CRC-32 and length): without it
 * nothing checks the data, and a flipped byte would load silently. */
BAD_FILE_TEST(gzip_trailer_cut_anywhere_is_refused)
{
    for (long cut = 1; cut <= 8; cut++) {
        write_good_pair(3);
        cut_tail("train-images-idx3-ubyte.gz", cut);
        expect_load_error(-EBADMSG, "train-images-idx3-ubyte.gz", "truncated: the gzip stream ends early");
        write_good_pair(3);
        cut_tail("train-labels-idx1-ubyte.gz", cut);
        expect_load_error(-EBADMSG, "train-labels-idx1-ubyte.gz", "truncated: the gzip stream ends early");
    }
    write_good_pair(3);
    sr_dataset *ds;
    cr_assert_eq(sr_fashion_mnist_load(tmp, true, &ds), 0, "the uncut pair: %s", sr_last_error());
    sr_dataset_destroy(ds);
}

/* Stored (uncompressed) deflate blocks put each pixel in the file as is. */
BAD_FILE_TEST(flipped_pixel_is_caught_with_or_without_the_trailer)
{
    for (int cut = 0; cut <= 8; cut += 8) {
        write_good_pair(3);
        write_idx_mode("train-images-idx3-ubyte.gz", 0x803, 3, (uint32_t[]){3, 28, 28}, 3 * 784, "wb0", false);
        size_t len;
        FILE *f = fopen(tmp_path("train-images-idx3-ubyte.gz"), "r+b");
        cr_assert(f);
        uint8_t img[4096];
        len = fread(img, 1, sizeof(img), f);
        uint8_t *magic = memmem(img, len, (const uint8_t[]){0, 0, 8, 3, 0, 0, 0, 3}, 8);
        cr_assert(magic, "the IDX header is not stored as is");
        size_t at = (size_t)(magic - img) + 16 + 784 + 100; /* image 1, pixel 100 */
        cr_assert_eq(img[at], 1);
        img[at] ^= 0x80;
        cr_assert_eq(fseek(f, 0, SEEK_SET), 0);
        cr_assert_eq(fwrite(img, 1, len, f), len);
        fclose(f);
        cut_tail("train-images-idx3-ubyte.gz", cut);
        expect_load_error(-EBADMSG, "train-images-idx3-ubyte.gz", cut ? "truncated" : "corrupt gzip data");
    }
}

/* Several gzip members (as gzip itself concatenates them) make one file;
 * the last one's trailer is checked like any other. */
BAD_FILE_TEST(multi_member_gzip_loads_and_its_last_trailer_counts)
{
    write_good_pair(5);
    write_idx_mode("train-images-idx3-ubyte.gz", 0x803, 3, (uint32_t[]){5, 28, 28}, 5 * 784, "wb", true);
    sr_dataset *ds;
    cr_assert_eq(sr_fashion_mnist_load(tmp, true, &ds), 0, "two members: %s", sr_last_error());
    cr_assert_eq(sr_dataset_pixels(ds, 4)[783], 4);
    sr_dataset_destroy(ds);
    cut_tail("train-images-idx3-ubyte.gz", 4);
    expect_load_error(-EBADMSG, "train-images-idx3-ubyte.gz", "truncated: the gzip stream ends early");
}

BAD_FILE_TEST(corrupt_gzip)
{
    write_good_pair(3);
    /* Valid gzip header, then bytes that are no deflate stream. */
    FILE *f = fopen(tmp_path("train-labels-idx1-ubyte.gz"), "w");
    const uint8_t junk[] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    fwrite(junk, 1, sizeof(junk), f);
    fclose(f);
    expect_load_error(-EBADMSG, "train-labels-idx1-ubyte.gz", "corrupt gzip data");
}

BAD_FILE_TEST(more_data_than_declared)
{
    write_good_pair(3);
    write_idx("train-labels-idx1-ubyte.gz", 0x801, 1, (uint32_t[]){3}, 4, false);
    expect_load_error(-EBADMSG, "train-labels-idx1-ubyte.gz", "more data than the 3 bytes");
}

BAD_FILE_TEST(label_out_of_range)
{
    write_good_pair(3);
    uint8_t body[8 + 3] = {0, 0, 8, 1, 0, 0, 0, 3, 4, 10, 2};
    gzFile f = gzopen(tmp_path("train-labels-idx1-ubyte.gz"), "wb");
    gzwrite(f, body, sizeof(body));
    gzclose(f);
    expect_load_error(-EBADMSG, "train-labels-idx1-ubyte.gz", "label 10 at index 1 is outside 0..9");
}

BAD_FILE_TEST(count_mismatch_names_both_files)
{
    write_images("train-images-idx3-ubyte.gz", 5, 28, 28);
    write_labels("train-labels-idx1-ubyte.gz", 4);
    expect_load_error(-EBADMSG, "train-images-idx3-ubyte.gz", "holds 5 images but");
    tu_expect_error("both", tmp_path("train-labels-idx1-ubyte.gz"), "holds 4 labels");
}

Test(idx_errors, bad_arguments)
{
    sr_dataset *ds;
    cr_assert_eq(sr_mnist_load_files(NULL, "x", &ds), -EINVAL);
    cr_assert_eq(sr_fashion_mnist_load("/nonexistent-dir", false, NULL), -EINVAL);
    cr_assert_eq(sr_fashion_mnist_load("/nonexistent-dir", false, &ds), -ENOENT);
    tu_expect_error("missing dir", "/nonexistent-dir/t10k-images-idx3-ubyte.gz", "cannot open");
}
